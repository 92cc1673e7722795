//! The durable benchmark: appends per second through egress's journal and
//! SQLite store against a plain rusqlite loop making the same inserts (the
//! same schema, group size and sync settings), alternating in one run, with
//! the latency of each commit; and durable messages per second end to end
//! over loopback WebSocket.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use egress_core::{EgressCore, Policy, Sequence};
use egress_reactive::{AsyncContext, CellOptions};
use egress_store::{RelayConfig, SqliteStore, open_durable};
use egress_ws::{Receiver, ReceiverConfig, Sender, SenderConfig};

/// One run of one path.
pub struct Run {
    /// Wall time for all appends.
    pub total: Duration,
    /// The time of each commit (one per group).
    pub commits: Vec<Duration>,
}

fn payload(i: u64) -> Bytes {
    Bytes::from(format!("{i:064}"))
}

/// A fresh database path under `dir`.
fn fresh(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    path
}

/// `n` appends in groups of `group` through a journaled core and
/// `SqliteStore::apply` (WAL, synchronous=FULL), one transaction per group.
pub fn egress(dir: &Path, n: u64, group: u64) -> Run {
    let mut store = SqliteStore::open(fresh(dir, "egress.db")).expect("open");
    let loaded = store.load("bench").expect("load");
    let mut core = EgressCore::restore(Policy::default(), loaded.restored).expect("restore");
    let mut commits = Vec::new();
    let started = Instant::now();
    let mut i = 0;
    while i < n {
        let end = (i + group).min(n);
        let _ = core.enqueue_all((i..end).map(payload));
        let t = Instant::now();
        let ready = core.poll_ready().expect("something to write");
        let appends: Vec<(Sequence, Bytes)> =
            core.unwritten(ready.appends.clone()).map(|(s, p)| (s, p.clone())).collect();
        store.apply("bench", &ready, &appends).expect("commit");
        let _ = core.persisted(ready.epoch);
        commits.push(t.elapsed());
        i = end;
    }
    let total = started.elapsed();
    drop(store);
    check_rows(&dir.join("egress.db"), n);
    Run { total, commits }
}

/// Checks that the outbox at `path` holds sequences `0..n`, each once: a
/// run that wrote less is not a faster run.
fn check_rows(path: &Path, n: u64) {
    let conn = rusqlite::Connection::open(path).expect("reopen");
    let (count, lowest, highest): (i64, Option<i64>, Option<i64>) = conn
        .query_row(
            "SELECT COUNT(DISTINCT seq), MIN(seq), MAX(seq) FROM egress_outbox WHERE stream = 'bench'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .expect("count");
    let want = (n as i64, (n > 0).then_some(0), n.checked_sub(1).map(|h| h as i64));
    assert_eq!((count, lowest, highest), want, "{} holds every append once", path.display());
}

/// The same appends by hand: a plain rusqlite loop on the same schema, WAL,
/// synchronous=FULL, `BEGIN IMMEDIATE`, the group's inserts and the counter
/// update, one transaction per group.
pub fn plain(dir: &Path, n: u64, group: u64) -> Run {
    let conn = rusqlite::Connection::open(fresh(dir, "plain.db")).expect("open");
    let _: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)).expect("wal");
    conn.pragma_update(None, "synchronous", 2).expect("full");
    egress_store::migrate(&conn).expect("schema");
    conn.execute(
        "INSERT INTO egress_stream (stream, incarnation, generation, next_sequence) VALUES ('bench', zeroblob(16), 0, 0)",
        [],
    )
    .expect("stream");
    let mut commits = Vec::new();
    let started = Instant::now();
    let mut i = 0;
    while i < n {
        let end = (i + group).min(n);
        let payloads: Vec<Bytes> = (i..end).map(payload).collect();
        let t = Instant::now();
        conn.execute_batch("BEGIN IMMEDIATE").expect("begin");
        {
            let mut insert = conn
                .prepare_cached("INSERT INTO egress_outbox (stream, seq, payload) VALUES ('bench', ?1, ?2)")
                .expect("prepare");
            for (k, p) in payloads.iter().enumerate() {
                insert.execute(rusqlite::params![(i + k as u64) as i64, p.as_ref()]).expect("insert");
            }
        }
        conn.execute("UPDATE egress_stream SET next_sequence = ?1 WHERE stream = 'bench'", [end as i64])
            .expect("counter");
        conn.execute_batch("COMMIT").expect("commit");
        commits.push(t.elapsed());
        i = end;
    }
    let total = started.elapsed();
    drop(conn);
    check_rows(&dir.join("plain.db"), n);
    Run { total, commits }
}

/// Seconds for `n` durable messages end to end: a cell on SQLite (its
/// relay committing in groups as they come), the `Sender` over loopback
/// WebSocket, the reference receiver, until all are acknowledged.
pub async fn end_to_end(dir: &Path, n: u64) -> Duration {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.expect("bind");
    let cx = AsyncContext::new();
    let policy = Policy::builder().inflight_limit(256).build().expect("policy");
    let durable = open_durable(&cx, fresh(dir, "e2e.db"), "bench", policy, CellOptions::new(), RelayConfig::default())
        .await
        .expect("open");
    let cell = durable.cell.clone();
    let url = format!("ws://{}", receiver.local_addr());
    let sender = Sender::spawn(cell.clone(), url, SenderConfig::new("bench")).expect("a ws:// URL");
    while sender.stats().connections == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let drain = tokio::spawn(async move {
        for expected in 0..n {
            let d = receiver.recv().await;
            assert_eq!(d.sequence, expected, "in order, once");
        }
        receiver
    });
    let started = Instant::now();
    let mut i = 0;
    while i < n {
        let end = (i + 1_000).min(n);
        cell.enqueue_all((i..end).map(payload));
        i = end;
        tokio::task::yield_now().await;
    }
    let _receiver = drain.await.expect("drained");
    while cell.acked_through().get_untracked().map_or(0, |s| s.get() + 1) < n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    let _ = sender.shutdown().await;
    let _ = durable.relay.shutdown().await;
    elapsed
}

/// The `q` quantile of `samples` (sorted here).
pub fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort();
    let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
    samples.get(i).copied().unwrap_or_default()
}
