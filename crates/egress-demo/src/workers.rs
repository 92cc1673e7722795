//! Scale-out on PostgreSQL: worker processes share the streams of one
//! database through leases, each stream's records dispatched to a typed
//! handler that records what it handled in the application's table; the
//! parent appends in its own transactions, SIGKILLs workers at random and
//! starts them again, then checks the table.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use clap::Args;
use egress_core::{Delay, Policy};
use egress_dispatch::{Dispatcher, HandlerError, Handlers, Info, StoredAck};
use egress_reactive::{AsyncContext, CellOptions};
use egress_store::RelayConfig;
use egress_store::postgres::{PgOutbox, PgStore, migrate, open_durable};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// `workers`: the parent.
#[derive(Debug, Args)]
pub(crate) struct WorkersArgs {
    /// The database (a libpq URL), shared by every worker.
    #[arg(long, env = "EGRESS_PG_URL")]
    url: String,
    /// How many worker processes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    workers: u64,
    /// How many streams (each in order, each leased by one worker at a time).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    streams: u64,
    /// How many messages, spread over the streams.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    messages: u64,
    /// How many worker kills (SIGKILL), each followed by a new worker.
    #[arg(long, default_value_t = 6)]
    kills: u64,
    /// The mean time between kills, in milliseconds.
    #[arg(long, default_value_t = 400)]
    kill_ms: u64,
    /// A worker's lease on a stream, in milliseconds: a killed worker's
    /// streams are taken over after it; a record starts only with more
    /// than a quarter of it left (see `lease_for` in egress-store).
    #[arg(long, default_value_t = LEASE_MS, value_parser = clap::value_parser!(u64).range(4..))]
    lease_ms: u64,
    /// Seeds the kill schedule and the streams messages go to.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write the summary as JSON to this file.
    #[arg(long, value_name = "PATH")]
    summary_json: Option<String>,
}

/// `worker`: one worker process (started by `workers`).
#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    /// The database.
    #[arg(long, env = "EGRESS_PG_URL")]
    url: String,
    /// This worker's name (the owner of the streams it takes).
    #[arg(long)]
    name: String,
    /// The lease on each stream it takes, in milliseconds.
    #[arg(long, default_value_t = LEASE_MS, value_parser = clap::value_parser!(u64).range(4..))]
    lease_ms: u64,
}

/// The demo's lease: `lease_for` runs of up to 500 ms over renewals of up
/// to 150 ms (its handlers write one row: a run of 500 ms is one the
/// machine is far too busy for).
const LEASE_MS: u64 = 1_950;

/// How many records of a stream a worker runs past the acknowledgement
/// watermark its store holds: what a takeover of the stream may run again.
const RERUN_LIMIT: u64 = 1;

/// What the parent appends: one unit of work of a stream.
#[derive(Debug, Serialize, Deserialize)]
struct Work {
    stream: String,
    n: u64,
}

/// The table the handlers write: one row per handler run.
const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS demo_handled (
        id bigserial PRIMARY KEY,
        stream text NOT NULL,
        seq bigint NOT NULL,
        attempt integer NOT NULL,
        worker text NOT NULL
    );
    TRUNCATE demo_handled;
";

fn handlers(client: Option<Arc<tokio_postgres::Client>>, worker: Arc<str>) -> Handlers {
    Handlers::new().handle("work", move |work: Work, info: Info| {
        let (client, worker) = (client.clone(), worker.clone());
        async move {
            let Some(client) = client else { return Err(HandlerError::Permanent("no database".into())) };
            let (stream, seq) = info.key();
            if *stream != *work.stream {
                return Err(HandlerError::Permanent(format!("{} in stream {stream}", work.stream)));
            }
            let seq = i64::try_from(seq).map_err(|e| HandlerError::Permanent(e.to_string()))?;
            let attempt = i32::try_from(info.attempt).unwrap_or(i32::MAX);
            client
                .execute(
                    "INSERT INTO demo_handled (stream, seq, attempt, worker) VALUES ($1, $2, $3, $4)",
                    &[&&*stream, &seq, &attempt, &&*worker],
                )
                .await
                .map(|_| ())
                .map_err(|e| HandlerError::Transient(e.to_string()))
        }
    })
}

/// One stream per lease, one record in flight per stream (so that each
/// stream is handled in order); concurrency comes from the streams.
fn policy() -> anyhow::Result<Policy> {
    Ok(Policy::builder()
        .inflight_limit(1)
        .retry_budget(1_000)
        .retry_base(Delay(10))
        .retry_ceiling(Delay(500))
        .jitter(0.5)
        .build()?)
}

async fn connect(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.context("connecting")?;
    tokio::spawn(connection);
    Ok(client)
}

/// A worker: takes every free stream it can (checking again every 100 ms),
/// runs a durable cell, its relay and a dispatcher per stream, all on one
/// connection, and lets go of a stream whose relay was fenced. Its
/// dispatchers run at most [`RERUN_LIMIT`] records past the stored
/// watermark, each started only with a quarter of the lease left, and cut
/// if the lease runs out under it.
pub(crate) async fn worker(a: WorkerArgs) -> anyhow::Result<()> {
    let client = Arc::new(connect(&a.url).await?);
    let name: Arc<str> = a.name.as_str().into();
    let handlers = handlers(Some(client), name.clone());
    let lease = Duration::from_millis(a.lease_ms);
    let cx = AsyncContext::new();
    let mut running: HashMap<String, (egress_store::Durable, Dispatcher)> = HashMap::new();
    let store = PgStore::connect(&a.url, &*name).await?;
    loop {
        if store.is_closed() {
            bail!("the worker's connection closed");
        }
        running.retain(|stream, (durable, _)| {
            let fenced = durable.relay.stats().fenced;
            if fenced {
                tracing::info!(%stream, "egress demo worker: a stream was taken over");
            }
            !fenced
        });
        let config = RelayConfig { poll_interval: Duration::from_millis(20), ..RelayConfig::default() };
        match open_durable(&cx, &store, None, lease, policy()?, CellOptions::new(), config).await? {
            Some((stream, durable)) => {
                tracing::info!(%stream, "egress demo worker: a stream taken");
                let until = durable.relay.lease().context("a PostgreSQL relay holds its stream by a lease")?;
                let bound = StoredAck::new(durable.relay.stored_ack(), RERUN_LIMIT).with_lease(until, lease / 4);
                let dispatcher = Dispatcher::spawn_bounded(&durable.cell, stream.as_str(), handlers.clone(), bound);
                running.insert(stream, (durable, dispatcher));
            }
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The parent: see the module's docs.
pub(crate) async fn run(a: WorkersArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut client = connect(&a.url).await?;
    migrate(&mut client).await?;
    client.batch_execute(SCHEMA).await?;
    let prefix = format!("demo-{}-{}", a.seed, std::process::id());
    let streams: Vec<String> = (0..a.streams).map(|i| format!("{prefix}/{i:03}")).collect();
    let exe = std::env::current_exe()?;
    let spawn = |i: u64, generation: u64| -> anyhow::Result<tokio::process::Child> {
        Ok(tokio::process::Command::new(&exe)
            .args(["worker", "--url", &a.url, "--name", &format!("w{i}.{generation}"), "--lease-ms"])
            .arg(a.lease_ms.to_string())
            .kill_on_drop(true)
            .spawn()?)
    };
    let mut workers: Vec<tokio::process::Child> = (0..a.workers).map(|i| spawn(i, 0)).collect::<Result<_, _>>()?;
    // The parent appends in its own transactions, ten records each to a
    // stream drawn from the seed, while it kills workers on the seed's
    // schedule and starts new ones.
    let encoder = handlers(None, "parent".into());
    let mut rng = crate::Xorshift::new(a.seed);
    let per_kill = a.messages / (a.kills + 1);
    let mut kills = 0;
    let mut appended = 0;
    let mut next_kill = Instant::now() + Duration::from_millis(rng.below(2 * a.kill_ms + 1));
    while appended < a.messages {
        let tx = client.transaction().await?;
        let stream = &streams[usize::try_from(rng.below(a.streams))?];
        let outbox = PgOutbox::new(stream.as_str());
        for _ in 0..10.min(a.messages - appended) {
            let record: Bytes = encoder.encode("work", &Work { stream: stream.clone(), n: appended })?;
            outbox.append(&tx, &record).await?;
            appended += 1;
        }
        tx.commit().await?;
        if kills < a.kills && (Instant::now() >= next_kill || appended >= per_kill * (kills + 1)) {
            let victim = usize::try_from(rng.below(a.workers))?;
            workers[victim].start_kill()?;
            let _ = workers[victim].wait().await;
            kills += 1;
            workers[victim] = spawn(u64::try_from(victim)?, kills)?;
            next_kill = Instant::now() + Duration::from_millis(rng.below(2 * a.kill_ms + 1));
        }
    }
    let appending = started.elapsed();
    // Done when every stream is acknowledged to its end.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let row = client
            .query_one(
                "SELECT count(*) FROM egress_stream WHERE stream LIKE $1 || '/%'
                 AND (acked_through IS NULL OR acked_through < next_sequence - 1) AND next_sequence > 0",
                &[&prefix],
            )
            .await?;
        let open: i64 = row.get(0);
        if open == 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!("{open} streams not acknowledged to their end after two minutes");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for w in &mut workers {
        let _ = w.start_kill();
        let _ = w.wait().await;
    }
    // The check: every appended record handled; per stream, new sequences
    // in order without a gap (a row below the highest so far is a record
    // run again after a takeover); and at most RERUN_LIMIT records run
    // again per takeover (counted from each change of the stream's worker).
    let rows = client
        .query("SELECT stream, seq, worker FROM demo_handled WHERE stream LIKE $1 || '/%' ORDER BY id", &[&prefix])
        .await?;
    let mut streams_seen: HashMap<String, (i64, String, u64)> = HashMap::new();
    let (mut handled, mut duplicates, mut out_of_order, mut most_rerun) = (0u64, 0u64, 0u64, 0u64);
    for row in &rows {
        let (stream, seq, worker): (String, i64, String) = (row.get(0), row.get(1), row.get(2));
        let (top, owner, rerun) = streams_seen.entry(stream).or_insert((-1, String::new(), 0));
        if *owner != worker {
            (*owner, *rerun) = (worker, 0);
        }
        if seq == *top + 1 {
            *top = seq;
            handled += 1;
        } else if seq <= *top {
            duplicates += 1;
            *rerun += 1;
            most_rerun = most_rerun.max(*rerun);
        } else {
            out_of_order += 1;
        }
    }
    // Every take of a stream but its first: a takeover (a worker killed,
    // or one whose lease ran out while it lived).
    let takeovers: i64 = client
        .query_one(
            "SELECT coalesce(sum(greatest(lease - 1, 0)), 0)::bigint FROM egress_lease WHERE stream LIKE $1 || '/%'",
            &[&prefix],
        )
        .await?
        .get(0);
    let ok = handled == a.messages && out_of_order == 0 && most_rerun <= RERUN_LIMIT;
    let summary = json!({
        "messages": a.messages,
        "workers": a.workers,
        "streams": a.streams,
        "handled": handled,
        "duplicates": duplicates,
        "out_of_order": out_of_order,
        "most_rerun_per_takeover": most_rerun,
        "rerun_limit": RERUN_LIMIT,
        "kills": kills,
        "takeovers": takeovers,
        "seconds": started.elapsed().as_secs_f64(),
        "appending_seconds": appending.as_secs_f64(),
        "ok": ok,
    });
    println!(
        "{} messages over {} streams, {} workers, {kills} killed, {takeovers} streams taken over: {handled} handled \
         in order, {duplicates} run again after a takeover (same key; at most {most_rerun} per takeover, limit \
         {RERUN_LIMIT}), {out_of_order} out of order: {}",
        a.messages,
        a.streams,
        a.workers,
        if ok { "OK" } else { "FAILED" }
    );
    if let Some(path) = a.summary_json {
        std::fs::write(path, summary.to_string())?;
    }
    if !ok {
        bail!("the check failed: {summary}");
    }
    Ok(())
}
