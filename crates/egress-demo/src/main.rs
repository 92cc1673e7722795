//! `egress-demo`: messages through an `AsyncEgressCell` over WebSocket while
//! connections (or whole processes) are killed at random moments; nothing
//! is lost, and what is delivered twice is said.
//!
//! ```text
//! cargo run --release -p egress-demo                      # receiver + sender in one process, with chaos
//! cargo run --release -p egress-demo -- --messages 1000000 --seed 7 --summary-json out.json
//! cargo run --release -p egress-demo -- restarts          # sender and receiver processes killed and restarted
//! cargo run --release -p egress-demo -- --durable         # the same, both sides on SQLite: exactly once across their crashes
//! cargo run --release -p egress-demo -- receive --listen 127.0.0.1:9000
//! cargo run --release -p egress-demo -- send --url ws://127.0.0.1:9000
//! ```

mod restarts;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use egress_core::{Delay, Policy};
use egress_reactive::{AsyncContext, AsyncEgressCell, Effect, Threaded};
use egress_ws::{AckMode, Chaos, ChaosProxy, Content, Receiver, ReceiverConfig, Sender, SenderConfig};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

/// `println!` that ignores a closed stdout (a pipe whose reader went away).
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

const HELP: &str = "\
egress-demo: an egress cell over WebSocket, through killed connections

USAGE:
  egress-demo [--messages N] [--chaos | --no-chaos] [--chaos-ms MS] [--seed S] [--summary-json PATH]
      receiver and sender in one process (the default: 100000 messages, chaos on)
  egress-demo restarts [--messages N] [--kills K] [--kill-ms MS] [--kill WHO] [--db PATH] [--seed S] [--summary-json PATH]
      a receiver process and a sender process, killed in turn (SIGKILL) and
      restarted at random moments, K kills in all (default 100000 messages,
      6 kills about every 300 ms); says what held
  egress-demo --durable [--db PATH] [restarts options]
      restarts with both sides on SQLite (--db, default a new file in the
      temporary directory; the receiver's is PATH.receiver): every sender
      run continues one stream, every receiver run resumes from its
      application's record, and the application's table is checked to hold
      each message exactly once and in order across every kill
  egress-demo receive --listen ADDR [--messages N] [--print [--db PATH]]
      the receiving half: prints what arrived once N messages are in (and
      keeps acknowledging for a second after the last); with --print, prints
      each delivery as a line and commits it once the line is out, forever;
      with --db, first writes it to its table with the receiver's record
  egress-demo send --url ws://ADDR [--messages N] [--db PATH] [--seed S] [--summary-json PATH]
      the sending half (without --db a new incarnation each run: it starts
      over from 0; with --db it continues the stored stream where it stopped)

  --messages N      how many messages (default 100000)
  --chaos           kill connections at random moments (default in one process)
  --no-chaos        do not
  --chaos-ms MS     the mean time between kills (default 25)
  --seed S          seeds the chaos, the backoff jitter and the cell's jitter (default 1)
  --summary-json P  also write the summary as JSON to P
  --kills K         restarts: how many process kills (default 6)
  --kill-ms MS      restarts: the mean time between kills (default 300)
  --kill WHO        restarts: sender, receiver or both (default both)
  --db PATH         the SQLite database (restarts starts it afresh)
";

pub(crate) struct Options {
    messages: u64,
    chaos: bool,
    chaos_ms: u64,
    seed: u64,
    summary_json: Option<String>,
    listen: Option<String>,
    url: Option<String>,
    print: bool,
    kills: u64,
    kill_ms: u64,
    db: Option<String>,
    durable: bool,
    kill_sender: bool,
    kill_receiver: bool,
}

fn parse(args: &[String]) -> anyhow::Result<Options> {
    let mut o = Options {
        messages: 100_000,
        chaos: true,
        chaos_ms: 25,
        seed: 1,
        summary_json: None,
        listen: None,
        url: None,
        print: false,
        kills: 6,
        kill_ms: 300,
        db: None,
        durable: false,
        kill_sender: true,
        kill_receiver: true,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--messages" => o.messages = value()?.parse().context("--messages takes a number")?,
            "--chaos" => o.chaos = true,
            "--no-chaos" => o.chaos = false,
            "--chaos-ms" => o.chaos_ms = value()?.parse().context("--chaos-ms takes a number")?,
            "--seed" => o.seed = value()?.parse().context("--seed takes a number")?,
            "--summary-json" => o.summary_json = Some(value()?.clone()),
            "--listen" => o.listen = Some(value()?.clone()),
            "--url" => o.url = Some(value()?.clone()),
            "--print" => o.print = true,
            "--kills" => o.kills = value()?.parse().context("--kills takes a number")?,
            "--kill-ms" => o.kill_ms = value()?.parse().context("--kill-ms takes a number")?,
            "--kill" => {
                (o.kill_sender, o.kill_receiver) = match value()?.as_str() {
                    "sender" => (true, false),
                    "receiver" => (false, true),
                    "both" => (true, true),
                    other => bail!("--kill takes sender, receiver or both, not {other:?}"),
                }
            }
            "--db" => o.db = Some(value()?.clone()),
            "--durable" => o.durable = true,
            other => bail!("unknown option {other:?}\n\n{HELP}"),
        }
    }
    if o.messages == 0 {
        bail!("--messages must be at least 1");
    }
    Ok(o)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("-h" | "--help") => {
            {
                use std::io::Write as _;
                let _ = write!(std::io::stdout(), "{HELP}");
            }
            Ok(())
        }
        Some("receive") => receive(parse(&args[1..])?).await,
        Some("restarts") => restarts::run(parse(&args[1..])?).await,
        Some("send") => send(parse(&args[1..])?).await,
        _ => {
            let o = parse(&args)?;
            if o.durable || o.db.is_some() { restarts::run(o).await } else { together(o).await }
        }
    }
}

fn policy() -> anyhow::Result<Policy> {
    Ok(Policy::builder()
        .inflight_limit(256)
        .retry_budget(1_000)
        .replay_limit(1_000)
        .retry_base(Delay(10))
        .retry_ceiling(Delay(1_000))
        .jitter(0.5)
        .build()?)
}

fn sender_config(seed: u64) -> SenderConfig {
    SenderConfig {
        seed,
        backoff_base: Duration::from_millis(5),
        backoff_max: Duration::from_millis(500),
        stall_timeout: Some(Duration::from_secs(3)),
        ..SenderConfig::new("egress-demo")
    }
}

/// The progress bar, driven by an effect over the cell's readers; and the
/// failures the cell recorded (each change of its `retry` reader to a new
/// failure).
fn progress(
    cx: &AsyncContext,
    cell: &AsyncEgressCell<Bytes>,
    total: u64,
) -> (ProgressBar, Effect<Threaded>, Arc<AtomicU64>) {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} acked  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let retries = Arc::new(AtomicU64::new(0));
    let effect = cx.effect({
        let (bar, cell, retries) = (bar.clone(), cell.clone(), retries.clone());
        let mut last_retry = None;
        move || {
            let acked = cell.acked_through().get().map_or(0, |s| s.get() + 1);
            let retry = cell.retry().get();
            if retry.is_some() && retry != last_retry {
                retries.fetch_add(1, Ordering::Relaxed);
            }
            last_retry = retry;
            bar.set_position(acked);
            bar.set_message(format!(
                "in flight {:>3}  pending {:>7}  retrying {:>3}  reconnects {}",
                cell.inflight_len().get(),
                cell.pending_len().get(),
                cell.parked_len().get(),
                cell.generation().get().get().saturating_sub(1),
            ));
        }
    });
    (bar, effect, retries)
}

fn payload(i: u64) -> Bytes {
    Bytes::from(format!("message {i}"))
}

pub(crate) fn finish(summary: serde_json::Value, path: Option<&str>) -> anyhow::Result<()> {
    say!("\nsummary");
    if let Some(map) = summary.as_object() {
        for (k, v) in map {
            say!("  {k:<32} {v}");
        }
    }
    if let Some(path) = path {
        std::fs::write(path, serde_json::to_string_pretty(&summary)? + "\n")
            .with_context(|| format!("writing {path}"))?;
        say!("  (written to {path})");
    }
    Ok(())
}

async fn together(o: Options) -> anyhow::Result<()> {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await?;
    let chaos = o.chaos.then_some(Chaos { seed: o.seed, mean_interval: Duration::from_millis(o.chaos_ms.max(1)) });
    let proxy = ChaosProxy::start(receiver.local_addr(), chaos).await?;
    say!(
        "egress-demo: {} messages, receiver on {}, sender through {} {}",
        o.messages,
        receiver.local_addr(),
        proxy.local_addr(),
        if o.chaos {
            format!("(chaos: a kill every ~{} ms, seed {})", o.chaos_ms, o.seed)
        } else {
            "(no chaos)".into()
        }
    );
    let cx = AsyncContext::new();
    let options = egress_reactive::CellOptions::new().jitter_seed(o.seed);
    let cell: AsyncEgressCell<Bytes> = AsyncEgressCell::with_options(&cx, policy()?, options);
    let (bar, _effect, retries) = progress(&cx, &cell, o.messages);
    let started = Instant::now();
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", proxy.local_addr()), sender_config(o.seed))?;
    // The application side: check every delivery as it comes.
    let n = o.messages;
    let check = tokio::spawn(async move {
        let (mut next, mut out_of_order) = (0u64, 0u64);
        while next < n {
            let d = receiver.recv().await;
            if d.sequence != next || d.payload() != Some(&payload(next)) {
                out_of_order += 1;
            }
            next = d.sequence + 1;
        }
        (next, out_of_order, receiver)
    });
    for chunk in (0..o.messages).collect::<Vec<_>>().chunks(1_000) {
        cell.enqueue_all(chunk.iter().map(|&i| payload(i)));
        tokio::task::yield_now().await;
    }
    let (received, out_of_order, receiver) = check.await?;
    while cell.acked_through().get_untracked().map_or(0, |s| s.get() + 1) < o.messages {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    bar.finish();
    let stats = sender.shutdown().await;
    let r = receiver.stats();
    let exactly_once = received == o.messages && out_of_order == 0 && r.delivered == o.messages;
    finish(
        json!({
            "messages": o.messages,
            "delivered": r.delivered,
            "exactly_once_in_order": exactly_once,
            "duplicates_dropped_by_receiver": r.duplicates,
            "connections_killed": proxy.kills(),
            "reconnects": stats.reconnects,
            "retries": retries.load(Ordering::Relaxed),
            "seconds": elapsed.as_secs_f64(),
            "messages_per_second": (o.messages as f64 / elapsed.as_secs_f64()).round(),
            "left_pending_inflight_parked": cell.pending_len().get() + cell.inflight_len().get() + cell.parked_len().get(),
        }),
        o.summary_json.as_deref(),
    )?;
    if !exactly_once {
        bail!("delivery was not exactly once and in order");
    }
    Ok(())
}

async fn receive(o: Options) -> anyhow::Result<()> {
    let listen = o.listen.as_deref().context("receive needs --listen ADDR")?;
    let addr: SocketAddr = listen.parse().with_context(|| format!("{listen} is not an address"))?;
    if o.print {
        let mut config = ReceiverConfig { ack_mode: AckMode::Explicit, ..ReceiverConfig::default() };
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
        say!("egress-demo receive: listening on ws://{}, printing each delivery", receiver.local_addr());
        return print_deliveries(receiver, log).await;
    }
    let mut receiver = Receiver::bind(addr, ReceiverConfig::default()).await?;
    say!("egress-demo receive: listening on ws://{}, waiting for {} messages", receiver.local_addr(), o.messages);
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

async fn send(o: Options) -> anyhow::Result<()> {
    let url = o.url.clone().context("send needs --url ws://ADDR")?;
    let cx = AsyncContext::new();
    let options = egress_reactive::CellOptions::new().jitter_seed(o.seed);
    // With a store, message i is record i of one stream: a restarted sender
    // finds the messages already durable in the store (sent or not) and
    // enqueues the rest.
    let (cell, relay) = match &o.db {
        Some(db) => {
            let d = egress_store::open_durable(&cx, db, "egress-demo", policy()?, options, Default::default())
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
    let sender = Sender::spawn(cell.clone(), url, sender_config(o.seed))?;
    for chunk in (first..o.messages).collect::<Vec<_>>().chunks(1_000) {
        cell.enqueue_all(chunk.iter().map(|&i| payload(i)));
        tokio::task::yield_now().await;
    }
    while cell.acked_through().get_untracked().map_or(0, |s| s.get() + 1) < o.messages {
        tokio::time::sleep(Duration::from_millis(5)).await;
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
