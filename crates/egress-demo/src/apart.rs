//! `send` and `receive`: the two sides as separate processes (or hosts),
//! with TLS and a bearer token if asked; `receive --print` writes each
//! delivery as a line and commits it once the line is out (with `--db`, in
//! the application's own SQLite table and the receiver's resume log).

use super::*;

pub(crate) async fn receive(o: Options) -> anyhow::Result<()> {
    let addr = o.listen.context("receive needs --listen ADDR")?;
    let mut base = ReceiverConfig::default();
    if let Some((cert, key)) = &o.tls {
        let read = |path: &str| std::fs::read(path).with_context(|| format!("reading {path}"));
        base.tls = Some(egress_ws::tls::server_config_from_pem(&read(cert)?, &read(key)?)?);
    }
    if let Some(token) = &o.token {
        base.authorize = Some(egress_ws::Authorize::bearer(token.clone()));
    }
    let scheme = if o.tls.is_some() { "wss" } else { "ws" };
    if o.print {
        let mut config = ReceiverConfig { ack_mode: AckMode::Explicit, ..base };
        let log = match &o.db {
            Some(db) => {
                let log = Arc::new(egress_store::ReceivedLog::open(db).with_context(|| format!("opening {db}"))?);
                config.resume = Some(log.clone());
                let conn = rusqlite::Connection::open(db)?;
                conn.execute_batch(
                    "CREATE TABLE IF NOT EXISTS delivered (producer TEXT, incarnation TEXT, seq INTEGER, payload TEXT)",
                )?;
                Some(conn)
            }
            None => None,
        };
        let receiver = Receiver::bind(addr, config).await?;
        say!("egress-demo receive: listening on {scheme}://{}, printing each delivery", receiver.local_addr());
        return print_deliveries(receiver, log).await;
    }
    let mut receiver = Receiver::bind(addr, base).await?;
    say!("egress-demo receive: listening on {scheme}://{}, waiting for {} messages", receiver.local_addr(), o.messages);
    let bar = ProgressBar::new(o.messages);
    let (mut count, mut out_of_order) = (0u64, 0u64);
    let mut next = std::collections::HashMap::<(Arc<str>, egress_core::Incarnation), u64>::new();
    while count < o.messages {
        let d = receiver.recv().await;
        let expected = next.entry((d.producer.clone(), d.incarnation)).or_insert(d.sequence);
        if d.sequence != *expected {
            out_of_order += 1;
        }
        *expected = d.sequence + 1;
        count += 1;
        bar.set_position(count);
    }
    bar.finish();
    // Keep serving a moment, so the last acknowledgements reach the sender
    // (it stops once everything is acknowledged).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let r = receiver.stats();
    finish(
        json!({
            "delivered": count,
            "in_order": out_of_order == 0,
            "duplicates_dropped": r.duplicates,
            "connections": r.connections,
            "fenced": r.fenced,
            "rejected": r.rejected,
        }),
        o.summary_json.as_deref(),
    )
}

/// `receive --print`: the application writes each delivery as a line
/// (`D producer incarnation sequence payload`, or `S ... reason` for a
/// skipped one) and commits it only once the line is flushed, so that what
/// a killed receiver acknowledged is exactly what reached its reader.
///
/// With `--db`, the application's effect is a row in its `delivered` table,
/// written with the receiver's record (`ReceivedLog::record`) in one
/// transaction per batch of deliveries, before the deliveries are
/// committed: a restarted receiver resumes each stream after the last row.
async fn print_deliveries(mut receiver: Receiver, mut db: Option<rusqlite::Connection>) -> anyhow::Result<()> {
    loop {
        let mut batch = vec![receiver.recv().await];
        while batch.len() < 1_000
            && let Some(d) = receiver.try_recv()
        {
            batch.push(d);
        }
        if let Some(conn) = db.as_mut() {
            let tx = conn.transaction()?;
            for d in &batch {
                let payload = d.payload().map(|p| String::from_utf8_lossy(p).into_owned());
                tx.prepare_cached("INSERT INTO delivered VALUES (?1, ?2, ?3, ?4)")?.execute(rusqlite::params![
                    &*d.producer,
                    format!("{:032x}", d.incarnation.get()),
                    i64::try_from(d.sequence)?,
                    payload
                ])?;
                egress_store::ReceivedLog::record(&tx, &d.producer, d.incarnation, d.sequence)?;
            }
            tx.commit()?;
        }
        for d in batch {
            print_one(&d)?;
            d.commit();
        }
    }
}

fn print_one(d: &egress_ws::Delivery) -> anyhow::Result<()> {
    use std::io::Write as _;
    {
        {
            let mut out = std::io::stdout().lock();
            let (producer, incarnation, sequence) = (&d.producer, d.incarnation.get(), d.sequence);
            match &d.content {
                Content::Message(payload) => {
                    writeln!(out, "D {producer} {incarnation:032x} {sequence} {}", String::from_utf8_lossy(payload))?;
                }
                Content::Skipped(reason) => writeln!(out, "S {producer} {incarnation:032x} {sequence} {reason:?}")?,
            }
            out.flush()?;
        }
    }
    Ok(())
}

pub(crate) async fn send(o: Options) -> anyhow::Result<()> {
    let url = o.url.clone().context("send needs --url ws://ADDR")?;
    let cx = AsyncContext::new();
    let options = egress_reactive::CellOptions::new().jitter_seed(o.seed);
    // With a store, message i is record i of one stream: a restarted sender
    // finds the messages already durable in the store (sent or not) and
    // enqueues the rest.
    let (cell, relay) = match &o.db {
        Some(db) => {
            let d = egress_store::open_durable(&cx, db, "egress-demo", policy()?, options, Default::default())
                .await
                .with_context(|| format!("opening {db}"))?;
            (d.cell, Some(d.relay))
        }
        None => (AsyncEgressCell::with_options(&cx, policy()?, options), None),
    };
    let first = cell.next_sequence().get().min(o.messages);
    let (bar, _effect, retries) = progress(&cx, &cell, o.messages);
    say!(
        "egress-demo send: {} messages to {url}, incarnation {:032x}, {first} stored already",
        o.messages,
        cell.incarnation().get()
    );
    let started = Instant::now();
    let mut config = sender_config(o.seed);
    if let Some(token) = &o.token {
        config = config.bearer(token);
    }
    if let Some(ca) = &o.ca {
        let pem = std::fs::read(ca).with_context(|| format!("reading {ca}"))?;
        config.tls = Some(egress_ws::tls::client_config_from_pem(&pem)?);
    }
    let sender = Sender::spawn(cell.clone(), url, config)?;
    // Enqueued at the pace asked for, while the checks below run.
    let enqueue = enqueue_paced(&cell, first..o.messages, o.rate, None);
    tokio::pin!(enqueue);
    let mut enqueued = false;
    while cell.acked_through().get_untracked().map_or(0, |s| s.get() + 1) < o.messages {
        // Stopped on its own (credentials refused, say): it will not
        // connect again, so the run ends with why.
        if let Some(why) = sender.failure() {
            let detail = why.detail().map(|d| format!(" ({d})")).unwrap_or_default();
            anyhow::bail!("the sender stopped: {why}{detail}");
        }
        // Another process loaded the stream (a second `send --db` on the
        // same file): it owns the stream now, and this one's relay has
        // stopped; nothing more of this run can become durable.
        if relay.as_ref().is_some_and(|r| r.stats().fenced) {
            anyhow::bail!(
                "another process took the stream over (it loaded the same --db); this sender stops, \
                 and that one sends what was stored"
            );
        }
        let tick = tokio::time::sleep(Duration::from_millis(5));
        if enqueued {
            tick.await;
        } else {
            tokio::select! {
                () = &mut enqueue => enqueued = true,
                () = tick => {}
            }
        }
    }
    let elapsed = started.elapsed();
    bar.finish();
    let stats = sender.shutdown().await;
    if let Some(relay) = relay {
        let _ = relay.shutdown().await;
    }
    finish(
        json!({
            "messages": o.messages,
            "acknowledged": o.messages,
            "reconnects": stats.reconnects,
            "retries": retries.load(Ordering::Relaxed),
            "seconds": elapsed.as_secs_f64(),
            "messages_per_second": (o.messages as f64 / elapsed.as_secs_f64()).round(),
        }),
        o.summary_json.as_deref(),
    )
}
