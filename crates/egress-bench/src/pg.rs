//! The PostgreSQL relay benchmark: records drained per second from a
//! backlog, by W workers over S streams, through egress (each worker one
//! connection, its share of the streams leased with one statement, a
//! durable cell, a relay writing acknowledgements and a dispatcher bounded
//! by the stored watermark per stream, a handler that does nothing)
//! against a plain `SKIP LOCKED` loop with the same driver
//! (tokio-postgres) and batch size (W tasks, each deleting up to `batch`
//! rows per transaction with `FOR UPDATE SKIP LOCKED`). Each path starts
//! from the same backlog, filled beforehand and not timed, in a database of
//! its own.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use egress_core::{Delay, Policy};
use egress_dispatch::{Dispatcher, Handlers, Info, StoredAck};
use egress_reactive::{AsyncContext, CellOptions};
use egress_store::RelayConfig;
use egress_store::postgres::{PgOutbox, PgStore, migrate, open_durable_many};

async fn connect(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.context("connecting")?;
    tokio::spawn(connection);
    Ok(client)
}

/// A new database on the server of `url`; its URL.
async fn database(url: &str, name: &str) -> anyhow::Result<String> {
    let admin = connect(url).await?;
    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name}")).await?;
    admin.batch_execute(&format!("CREATE DATABASE {name}")).await?;
    let base = url.split('?').next().unwrap_or(url);
    let (server, _) = base.rsplit_once('/').context("EGRESS_PG_URL is a URL with a database")?;
    Ok(format!("{server}/{name}"))
}

/// Each stream's dispatcher runs at most this many batches past the
/// acknowledgement watermark its store holds (what a takeover may run
/// again): 16 × 64 = 1,024 records. Each ack commit is one round trip that
/// also deletes the acknowledged rows; a smaller bound means smaller
/// commits, more of them, and the stream waiting on them (256 measured at
/// about half the rate of 1,024 on one stream).
const RERUN_LIMIT_BATCHES: u64 = 16;

fn stream(i: u64) -> String {
    format!("s{i:03}")
}

fn handlers() -> Handlers {
    Handlers::new().handle("n", |_: u64, _: Info| async { Ok(()) })
}

/// Drains `n` records over `streams` streams with `workers` plain loops.
pub async fn plain(url: &str, n: u64, streams: u64, workers: u64, batch: i64) -> anyhow::Result<Duration> {
    let db = database(url, "egress_bench_plain").await?;
    let client = connect(&db).await?;
    client
        .batch_execute(
            "CREATE TABLE plain_outbox (id bigserial PRIMARY KEY, stream text NOT NULL, seq bigint NOT NULL,
             payload bytea NOT NULL)",
        )
        .await?;
    let record = handlers().encode("n", &0u64)?;
    let insert = client.prepare("INSERT INTO plain_outbox (stream, seq, payload) VALUES ($1, $2, $3)").await?;
    for i in 0..n {
        client.execute(&insert, &[&stream(i % streams), &i64::try_from(i / streams)?, &record.as_ref()]).await?;
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let db = db.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = connect(&db).await?;
            let take = client
                .prepare(
                    "DELETE FROM plain_outbox WHERE id IN (
                         SELECT id FROM plain_outbox ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
                     RETURNING stream, seq, payload",
                )
                .await?;
            let mut done = 0u64;
            loop {
                let tx = client.transaction().await?;
                let rows = tx.query(&take, &[&batch]).await?;
                tx.commit().await?;
                if rows.is_empty() {
                    return Ok::<_, anyhow::Error>(done);
                }
                done += rows.len() as u64;
            }
        }));
    }
    let mut done = 0;
    for t in tasks {
        done += t.await??;
    }
    if done != n {
        bail!("the plain loop drained {done} of {n}");
    }
    Ok(started.elapsed())
}

/// Drains `n` records over `streams` streams with `workers` egress workers.
pub async fn egress(url: &str, n: u64, streams: u64, workers: u64, batch: usize) -> anyhow::Result<Duration> {
    let db = database(url, "egress_bench_egress").await?;
    let mut client = connect(&db).await?;
    migrate(&mut client).await?;
    let record = handlers().encode("n", &0u64)?;
    let per_stream = n / streams;
    for s in 0..streams {
        let outbox = PgOutbox::new(stream(s));
        let mut left = per_stream + u64::from(s < n % streams);
        while left > 0 {
            let tx = client.transaction().await?;
            for _ in 0..left.min(1_000) {
                outbox.append(&tx, &record).await?;
            }
            tx.commit().await?;
            left -= left.min(1_000);
        }
    }
    let policy = Policy::builder().inflight_limit(batch).retry_base(Delay(10)).build()?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let (db, mut stopped) = (db.clone(), stopped.clone());
        tasks.push(tokio::spawn(async move {
            let cx = AsyncContext::new();
            let mut running = Vec::new();
            let store = PgStore::connect(&db, format!("w{w}")).await?;
            let lease = Duration::from_secs(30);
            // Each worker its share of the streams.
            let share = usize::try_from(streams.div_ceil(workers))?;
            let taken =
                open_durable_many(&cx, &store, share, lease, policy, CellOptions::new(), RelayConfig::default())
                    .await?;
            for (name, durable) in taken {
                let durable = durable?;
                let bound = StoredAck::new(durable.relay.stored_ack(), RERUN_LIMIT_BATCHES * batch as u64);
                let dispatcher = Dispatcher::spawn_bounded(&durable.cell, name.as_str(), handlers(), bound);
                running.push((durable, dispatcher));
            }
            let _ = stopped.wait_for(|s| *s).await;
            for (durable, dispatcher) in running {
                let _ = dispatcher.shutdown().await;
                let _ = durable.relay.shutdown().await;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    // Done when the store says every stream is acknowledged to its end.
    let deadline = Instant::now() + Duration::from_secs(600);
    let drained: i64 = loop {
        let row = client
            .query_one(
                "SELECT count(*) FILTER (WHERE acked_through IS DISTINCT FROM next_sequence - 1),
                        COALESCE(sum(next_sequence), 0)::bigint
                 FROM egress_stream",
                &[],
            )
            .await?;
        let (open, total): (i64, i64) = (row.get(0), row.get(1));
        if open == 0 {
            break total;
        }
        if Instant::now() > deadline {
            bail!("{open} streams not drained after ten minutes");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let elapsed = started.elapsed();
    let _ = stop.send(true);
    for t in tasks {
        t.await??;
    }
    if u64::try_from(drained)? != n {
        bail!("egress drained {drained} of {n}");
    }
    Ok(elapsed)
}
