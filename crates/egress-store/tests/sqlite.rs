//! The SQLite store against real databases in temporary directories: its
//! pragmas, recovery, group commit, the transactional outbox, and what a
//! refused commit (a full disk, a locked database) does to a durable cell.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use egress_core::{DeadLetters, DeadReason, EgressCore, FailureKind, Generation, Policy, Sequence};
use egress_reactive::{AsyncContext, CellOptions, SendError};
use egress_store::{Outbox, Relay, RelayConfig, SqliteStore, StoreError, migrate, open_durable};
use tokio::sync::mpsc;

mod common;
use common::{Channel, TempDir, config};

/// Writes everything the core's journal holds into `store`.
fn flush(core: &mut EgressCore<Bytes>, store: &mut SqliteStore, stream: &str) {
    while let Some(ready) = core.poll_ready() {
        let appends: Vec<_> = core.unwritten(ready.appends.clone()).map(|(s, p)| (s, p.clone())).collect();
        store.apply(stream, &ready, &appends).unwrap();
        let _ = core.persisted(ready.epoch);
    }
}

#[test]
fn the_pragmas_it_depends_on_are_checked_after_being_set() {
    let dir = TempDir::new();
    let store = SqliteStore::open(dir.db()).unwrap();
    let mode: String = store.connection().query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
    let sync: i64 = store.connection().query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap();
    assert_eq!((mode.as_str(), sync), ("wal", 2));
    // An in-memory database cannot be in WAL mode: refused, not ignored.
    match SqliteStore::open(":memory:") {
        Err(StoreError::Pragma { name: "journal_mode", found, .. }) => assert_eq!(found, "memory"),
        other => panic!("expected a pragma error, got {other:?}"),
    }
}

#[test]
fn a_schema_from_a_newer_version_is_refused_and_migrations_are_idempotent() {
    let dir = TempDir::new();
    drop(SqliteStore::open(dir.db()).unwrap());
    let conn = rusqlite::Connection::open(dir.db()).unwrap();
    migrate(&conn).unwrap();
    let version: u32 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(version, egress_store::SCHEMA_VERSION);
    conn.pragma_update(None, "user_version", 99).unwrap();
    drop(conn);
    match SqliteStore::open(dir.db()) {
        Err(StoreError::SchemaTooNew { found: 99, supported }) => assert_eq!(supported, egress_store::SCHEMA_VERSION),
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
}

#[test]
fn a_newer_schema_is_refused_before_anything_in_the_file_changes() {
    // A database a newer version wrote, in rollback-journal mode (as a
    // newer version might keep it): refusing it must leave it as it was.
    let dir = TempDir::new();
    let conn = rusqlite::Connection::open(dir.db()).unwrap();
    conn.execute_batch("CREATE TABLE future (x INTEGER); INSERT INTO future VALUES (1);").unwrap();
    conn.pragma_update(None, "user_version", 99).unwrap();
    drop(conn);
    let before = std::fs::read(dir.db()).unwrap();
    assert!(matches!(SqliteStore::open(dir.db()), Err(StoreError::SchemaTooNew { found: 99, .. })));
    assert!(matches!(egress_store::ReceivedLog::open(dir.db()), Err(StoreError::SchemaTooNew { found: 99, .. })));
    assert!(std::fs::read(dir.db()).unwrap() == before, "not a byte of the file changed");
    let mode: String =
        rusqlite::Connection::open(dir.db()).unwrap().query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
    assert_eq!(mode, "delete", "still in its own journal mode, not switched to WAL");
}

#[test]
fn a_restart_continues_the_stream_with_what_is_unacknowledged_and_dead_letters_as_they_were() {
    let dir = TempDir::new();
    let policy = Policy::builder().inflight_limit(8).dead_letters(DeadLetters::Skip).build().unwrap();
    let mut store = SqliteStore::open(dir.db()).unwrap();
    let loaded = store.load("s").unwrap();
    let incarnation = loaded.incarnation;
    let mut core = EgressCore::restore(policy, loaded.restored).unwrap();
    let _ = core.enqueue_all((0..5).map(|i| Bytes::from(format!("m{i}"))));
    let _ = core.reconnect(Generation(3));
    flush(&mut core, &mut store, "s");
    let g = Generation(3);
    for _ in 0..5 {
        let _ = core.claim(g);
    }
    let _ = core.ack(g, Sequence(1));
    let _ = core.fail(g, Sequence(3), FailureKind::Permanent, egress_core::Time(0), egress_core::JitterSample::ZERO);
    flush(&mut core, &mut store, "s");
    // Enqueued, never written: lost with the process, and never sent.
    let _ = core.enqueue(Bytes::from_static(b"unwritten"));
    drop((core, store));

    let mut store = SqliteStore::open(dir.db()).unwrap();
    let loaded = store.load("s").unwrap();
    assert_eq!(loaded.incarnation, incarnation, "the sequence space continues");
    let core = EgressCore::restore(policy, loaded.restored).unwrap();
    assert_eq!((core.generation(), core.next_sequence(), core.acked_through()), (g, Sequence(5), Some(Sequence(1))));
    let pending: Vec<(u64, Bytes, Option<DeadReason>)> =
        core.pending().map(|e| (e.sequence.0, e.payload.clone(), e.dead)).collect();
    assert_eq!(
        pending,
        [
            (2, Bytes::from("m2"), None),
            (3, Bytes::from("m3"), Some(DeadReason::Permanent)),
            (4, Bytes::from("m4"), None)
        ]
    );
    // Acknowledged records were pruned.
    let rows: i64 = store.connection().query_row("SELECT COUNT(*) FROM egress_outbox", [], |r| r.get(0)).unwrap();
    assert_eq!(rows, 3);
}

#[test]
fn every_dead_letter_reason_survives_a_restart_as_a_tombstone_or_held() {
    use egress_core::JitterSample;
    let dir = TempDir::new();
    for (stream, dead_letters) in [("skip", DeadLetters::Skip), ("hold", DeadLetters::Hold)] {
        let policy = Policy::builder()
            .inflight_limit(8)
            .retry_budget(0)
            .replay_limit(0)
            .dead_letters(dead_letters)
            .build()
            .unwrap();
        let mut store = SqliteStore::open(dir.db()).unwrap();
        let mut core = EgressCore::restore(policy, store.load(stream).unwrap().restored).unwrap();
        let _ = core.enqueue_all((0..3).map(|i| Bytes::from(format!("m{i}"))));
        flush(&mut core, &mut store, stream);
        let g = core.generation();
        for _ in 0..3 {
            let _ = core.claim(g);
        }
        let now = egress_core::Time(0);
        let _ = core.fail(g, Sequence(0), FailureKind::Permanent, now, JitterSample::ZERO);
        let _ = core.fail(g, Sequence(1), FailureKind::Transient, now, JitterSample::ZERO);
        let _ = core.reconnect(Generation(g.0 + 1));
        flush(&mut core, &mut store, stream);
        drop((core, store));

        let mut store = SqliteStore::open(dir.db()).unwrap();
        let core = EgressCore::restore(policy, store.load(stream).unwrap().restored).unwrap();
        let found: Vec<(u64, Option<DeadReason>)> = match dead_letters {
            DeadLetters::Skip => core.pending().map(|e| (e.sequence.0, e.dead)).collect(),
            _ => core.exhausted().map(|e| (e.sequence.0, e.dead)).collect(),
        };
        let reasons = [DeadReason::Permanent, DeadReason::Retries, DeadReason::Replays];
        let want: Vec<(u64, Option<DeadReason>)> = (0..3).zip(reasons.map(Some)).collect();
        assert_eq!(found, want, "{stream}: each record dead for its own reason, as it was");
        let recovered = core.recovered().unwrap();
        assert_eq!((recovered.tombstones, recovered.held), if stream == "skip" { (3, 0) } else { (0, 3) });
    }
}

#[test]
fn a_skipped_dead_letter_reads_dead_after_a_restart_and_the_store_keeps_the_newest() {
    use egress_core::{ClaimOutcome, JitterSample, MessageStatus, SKIPPED_MEMORY};
    let dir = TempDir::new();
    let policy = Policy::builder().inflight_limit(SKIPPED_MEMORY + 8).build().unwrap();
    for (stream, n) in [("few", 4u64), ("many", SKIPPED_MEMORY as u64 + 3)] {
        let mut store = SqliteStore::open(dir.db()).unwrap();
        let mut core = EgressCore::restore(policy, store.load(stream).unwrap().restored).unwrap();
        let _ = core.enqueue_all((0..n).map(|i| Bytes::from(format!("m{i}"))));
        flush(&mut core, &mut store, stream);
        let g = core.generation();
        while matches!(core.claim(g).outcome, ClaimOutcome::Claimed(_)) {}
        for s in 0..n - 1 {
            let _ = core.fail(g, Sequence(s), FailureKind::Permanent, egress_core::Time(0), JitterSample::ZERO);
        }
        while matches!(core.claim(g).outcome, ClaimOutcome::Claimed(_)) {}
        flush(&mut core, &mut store, stream);
        let _ = core.ack(g, Sequence(n - 1));
        flush(&mut core, &mut store, stream);
        drop((core, store));

        let mut store = SqliteStore::open(dir.db()).unwrap();
        let core = EgressCore::restore(policy, store.load(stream).unwrap().restored).unwrap();
        let dead = Some(MessageStatus::Dead(DeadReason::Permanent));
        assert_eq!(core.status(Sequence(n - 2)), dead, "{stream}: skipped, after a restart");
        assert_eq!(core.status(Sequence(n - 1)), Some(MessageStatus::Acknowledged), "{stream}: delivered");
        let oldest_kept = n.saturating_sub(1 + SKIPPED_MEMORY as u64);
        assert_eq!(core.status(Sequence(oldest_kept)), dead, "{stream}: the oldest kept");
        let kept: i64 = store
            .connection()
            .query_row("SELECT COUNT(*) FROM egress_outbox WHERE stream = ?1", [stream], |r| r.get(0))
            .unwrap();
        assert_eq!(kept as u64, (n - 1).min(SKIPPED_MEMORY as u64), "{stream}: the newest tombstones kept, no more");
        if let Some(forgotten) = oldest_kept.checked_sub(1) {
            assert_eq!(core.status(Sequence(forgotten)), Some(MessageStatus::Acknowledged), "{stream}: forgotten");
        }
    }
}

#[test]
fn a_commit_syncs_fully_when_it_appends_and_normally_when_it_only_acknowledges() {
    let dir = TempDir::new();
    let mut store = SqliteStore::open(dir.db()).unwrap();
    let sync =
        |store: &SqliteStore| -> i64 { store.connection().query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap() };
    let mut core = EgressCore::restore(Policy::default(), store.load("s").unwrap().restored).unwrap();
    let _ = core.enqueue(Bytes::from_static(b"a"));
    let ready = core.poll_ready().unwrap();
    assert!(ready.must_sync);
    let appends: Vec<_> = core.unwritten(ready.appends.clone()).map(|(s, p)| (s, p.clone())).collect();
    store.apply("s", &ready, &appends).unwrap();
    let _ = core.persisted(ready.epoch);
    assert_eq!(sync(&store), 2, "an append is written with synchronous=FULL");
    let g = core.generation();
    let _ = core.claim(g);
    let _ = core.ack(g, Sequence(0));
    let ready = core.poll_ready().unwrap();
    assert!(!ready.must_sync && ready.appends.is_empty());
    store.apply("s", &ready, &[]).unwrap();
    let _ = core.persisted(ready.epoch);
    assert_eq!(sync(&store), 1, "an acknowledgement alone may lag: synchronous=NORMAL");
    let _ = core.enqueue(Bytes::from_static(b"b"));
    flush(&mut core, &mut store, "s");
    assert_eq!(sync(&store), 2, "and back to FULL for the next append");
}

#[test]
fn changed_sees_other_connections_commits_and_not_its_own() {
    let dir = TempDir::new();
    let mut store = SqliteStore::open(dir.db()).unwrap();
    assert!(store.changed().unwrap(), "true the first time");
    assert!(!store.changed().unwrap(), "nothing since");
    let mut core = EgressCore::restore(Policy::default(), store.load("s").unwrap().restored).unwrap();
    let _ = core.enqueue(Bytes::from_static(b"own"));
    flush(&mut core, &mut store, "s");
    assert!(!store.changed().unwrap(), "its own commits do not count");
    let mut app = rusqlite::Connection::open(dir.db()).unwrap();
    let tx = app.transaction().unwrap();
    Outbox::new("s").append(&tx, b"theirs").unwrap();
    tx.commit().unwrap();
    assert!(store.changed().unwrap(), "another connection committed");
    assert!(!store.changed().unwrap(), "and only once");
}

#[test]
fn a_checkpoint_empties_the_wal_and_an_outbox_names_its_stream() {
    let dir = TempDir::new();
    let mut store = SqliteStore::open(dir.db()).unwrap();
    let mut core = EgressCore::restore(Policy::default(), store.load("s").unwrap().restored).unwrap();
    let _ = core.enqueue_all((0..50).map(|i| Bytes::from(format!("m{i}"))));
    flush(&mut core, &mut store, "s");
    let wal = std::path::PathBuf::from(format!("{}-wal", dir.db().display()));
    assert!(std::fs::metadata(&wal).unwrap().len() > 0, "the commits went to the WAL");
    store.checkpoint().unwrap();
    assert_eq!(std::fs::metadata(&wal).unwrap().len(), 0, "checkpointed into the database and truncated");
    assert_eq!(Outbox::new("orders").stream(), "orders");
}

#[test]
fn incarnations_are_random_in_all_128_bits() {
    // Two halves from independent draws: a stream's incarnation and an
    // owner token must not repeat across processes, so neither half may be
    // constant (the chance that a correct draw gives a zero half is 2^-64).
    let dir = TempDir::new();
    let mut store = SqliteStore::open(dir.db()).unwrap();
    let ids: Vec<[u8; 16]> =
        (0..4).map(|i| store.load(&format!("s{i}")).unwrap().incarnation.0.to_be_bytes()).collect();
    for id in &ids {
        assert_ne!(id[..8], [0; 8], "the high half is drawn");
        assert_ne!(id[8..], [0; 8], "the low half is drawn");
    }
    let highs: std::collections::BTreeSet<&[u8]> = ids.iter().map(|id| &id[..8]).collect();
    assert_eq!(highs.len(), 4, "the high halves differ");
}

#[test]
fn a_moved_counter_is_a_conflict_and_a_stream_taken_over_is_fenced() {
    let dir = TempDir::new();
    let mut store = SqliteStore::open(dir.db()).unwrap();
    let mut core = EgressCore::restore(Policy::default(), store.load("s").unwrap().restored).unwrap();
    let _ = core.enqueue(Bytes::from_static(b"a"));
    flush(&mut core, &mut store, "s");
    // Another writer moved the counter: the next appends are refused whole,
    // even when the payloads are the same bytes.
    let outbox = Outbox::new("s");
    assert_eq!(outbox.append(store.connection(), b"same").unwrap(), Sequence(1));
    let _ = core.enqueue(Bytes::from_static(b"same"));
    let ready = core.poll_ready().unwrap();
    let err = store.apply("s", &ready, &[(Sequence(1), Bytes::from_static(b"same"))]).unwrap_err();
    assert!(matches!(err, StoreError::Conflict { stored: 2, expected: 1, .. }), "{err}");
    // Payloads that do not match the Ready are refused before any write.
    let err = store.apply("s", &ready, &[]).unwrap_err();
    assert!(matches!(err, StoreError::Appends { given: 0, .. }), "{err}");
    // The relay's answer: the other writer's record is taken, the core's
    // moves behind it, and both are stored.
    let _ = core.persist_failed(ready.epoch, "conflict");
    let theirs = store.appended("s", Sequence(1), 10).unwrap();
    assert!(matches!(core.rebase(theirs).outcome, egress_core::RebaseOutcome::Rebased { adopted: 1, moved: 1 }));
    flush(&mut core, &mut store, "s");
    let rows: Vec<(i64, Vec<u8>)> = store
        .connection()
        .prepare("SELECT seq, payload FROM egress_outbox ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(rows, [(0, b"a".to_vec()), (1, b"same".to_vec()), (2, b"same".to_vec())], "nothing lost");
    // Another store takes the stream over: this one is fenced.
    let mut other = SqliteStore::open(dir.db()).unwrap();
    let _ = other.load("s").unwrap();
    let _ = core.enqueue(Bytes::from_static(b"late"));
    let ready = core.poll_ready().unwrap();
    let err = store.apply("s", &ready, &[(Sequence(3), Bytes::from_static(b"late"))]).unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
}

#[test]
fn a_store_that_never_loaded_a_stream_writes_nothing_into_it() {
    let dir = TempDir::new();
    let mut owner = SqliteStore::open(dir.db()).unwrap();
    let mut core = EgressCore::restore(Policy::default(), owner.load("s").unwrap().restored).unwrap();
    let _ = core.enqueue(Bytes::from_static(b"mine"));
    flush(&mut core, &mut owner, "s");
    // A second store (another process) that never called load: its write
    // to the owner's stream, and to a stream no one has loaded, is refused
    // whole.
    let mut stranger = SqliteStore::open(dir.db()).unwrap();
    let mut theirs = EgressCore::restore(Policy::default(), egress_core::Restored::empty()).unwrap();
    let _ = theirs.enqueue(Bytes::from_static(b"intruder"));
    let ready = theirs.poll_ready().unwrap();
    let appends: Vec<_> = theirs.unwritten(ready.appends.clone()).map(|(s, p)| (s, p.clone())).collect();
    for stream in ["s", "fresh"] {
        let err = stranger.apply(stream, &ready, &appends).unwrap_err();
        assert!(matches!(&err, StoreError::NotLoaded { stream: s } if s == stream), "{err}");
    }
    let rows: Vec<Vec<u8>> = owner
        .connection()
        .prepare("SELECT payload FROM egress_outbox ORDER BY stream, seq")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(rows, [b"mine".to_vec()], "only the owner's record");
    let streams: i64 = owner.connection().query_row("SELECT COUNT(*) FROM egress_stream", [], |r| r.get(0)).unwrap();
    assert_eq!(streams, 1, "no stream made by the refused write");
    // The owner goes on.
    let _ = core.enqueue(Bytes::from_static(b"still mine"));
    flush(&mut core, &mut owner, "s");
}

#[test]
fn a_generation_no_handshake_can_go_above_is_refused_at_load() {
    let dir = TempDir::new();
    let mut store = SqliteStore::open(dir.db()).unwrap();
    let _ = store.load("s").unwrap();
    store.connection().execute("UPDATE egress_stream SET generation = ?1", [i64::MAX]).unwrap();
    assert!(matches!(store.load("s"), Err(StoreError::OutOfRange { .. })));
    store.connection().execute("UPDATE egress_stream SET generation = ?1", [i64::MAX - 1]).unwrap();
    assert_eq!(store.load("s").unwrap().restored.generation, Generation(i64::MAX as u64 - 1));
}

#[test]
fn an_append_rolled_back_with_the_callers_transaction_consumes_no_sequence() {
    let dir = TempDir::new();
    drop(SqliteStore::open(dir.db()).unwrap());
    let mut conn = rusqlite::Connection::open(dir.db()).unwrap();
    conn.execute_batch("CREATE TABLE orders (item TEXT)").unwrap();
    let outbox = Outbox::new("orders");
    let tx = conn.transaction().unwrap();
    tx.execute("INSERT INTO orders VALUES ('tea')", []).unwrap();
    assert_eq!(outbox.append_json(&tx, &serde_json::json!({"order": "tea"})).unwrap(), Sequence(0));
    tx.commit().unwrap();
    let tx = conn.transaction().unwrap();
    assert_eq!(outbox.append(&tx, b"rolled back").unwrap(), Sequence(1));
    tx.rollback().unwrap();
    let mut tx = conn.transaction().unwrap();
    {
        // Under a savepoint of the caller's, rolled back alone.
        let sp = tx.savepoint().unwrap();
        assert_eq!(outbox.append(&sp, b"in a savepoint").unwrap(), Sequence(1));
        sp.finish().unwrap(); // rolled back: the default
    }
    assert_eq!(outbox.append(&tx, b"second").unwrap(), Sequence(1));
    tx.commit().unwrap();
    let mut store = SqliteStore::open(dir.db()).unwrap();
    let restored = store.load("orders").unwrap().restored;
    let payloads: Vec<Bytes> = restored.records.into_iter().map(|r| r.payload).collect();
    assert_eq!(payloads, [Bytes::from(r#"{"order":"tea"}"#), Bytes::from("second")]);
    let orders: i64 = conn.query_row("SELECT COUNT(*) FROM orders", [], |r| r.get(0)).unwrap();
    assert_eq!(orders, 1);
}

/// A transport that hands every envelope to the test.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_database_stalls_sending_visibly_and_loses_nothing() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let store = SqliteStore::open(dir.db()).unwrap();
    // The relay gives up on a lock after 50 ms (then retries).
    store.connection().busy_timeout(Duration::from_millis(50)).unwrap();
    let (cell, relay) = start(&cx, store, "s");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _link = cell.attach(Channel(tx));
    cell.enqueue(Bytes::from_static(b"first"));
    assert_eq!(rx.recv().await.unwrap(), (0, Bytes::from_static(b"first")));
    // Another writer holds the database's write lock.
    let blocker = rusqlite::Connection::open(dir.db()).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    cell.enqueue(Bytes::from_static(b"second"));
    let error = wait_for(&cell, |c| c.persist_error().get_untracked()).await;
    assert!(error.reason.contains("locked") || error.reason.contains("busy"), "{}", error.reason);
    assert_eq!(
        (cell.unpersisted_len().get_untracked(), cell.durable_through().get_untracked()),
        (1, Some(Sequence(0)))
    );
    assert!(rx.try_recv().is_err(), "nothing goes out before it is durable");
    blocker.execute_batch("ROLLBACK").unwrap();
    drop(blocker);
    // A retry commits it: the error clears and the record goes out.
    assert_eq!(rx.recv().await.unwrap(), (1, Bytes::from_static(b"second")));
    assert!(cell.persist_error().get_untracked().is_none());
    assert!(relay.stats().failures >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stalls_sending_visibly_and_loses_nothing() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let store = SqliteStore::open(dir.db()).unwrap();
    // The application's data fills the database up to its size limit.
    let app = rusqlite::Connection::open(dir.db()).unwrap();
    app.execute_batch("CREATE TABLE filler (b BLOB)").unwrap();
    app.execute("INSERT INTO filler VALUES (zeroblob(1000000))", []).unwrap();
    let pages: i64 = store.connection().query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
    let _: i64 =
        store.connection().query_row(&format!("PRAGMA max_page_count = {}", pages + 2), [], |r| r.get(0)).unwrap();
    let (cell, relay) = start(&cx, store, "s");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _link = cell.attach(Channel(tx));
    let big = Bytes::from(vec![7u8; 200_000]);
    cell.enqueue(big.clone());
    let error = wait_for(&cell, |c| c.persist_error().get_untracked()).await;
    assert!(error.reason.contains("full"), "{}", error.reason);
    assert_eq!((cell.unpersisted_len().get_untracked(), cell.durable_through().get_untracked()), (1, None));
    assert!(rx.try_recv().is_err(), "nothing goes out before it is durable");
    // Space comes back (the application deletes its data): a retry commits
    // the record, the error clears and the record goes out, whole.
    app.execute_batch("DROP TABLE filler").unwrap();
    assert_eq!(rx.recv().await.unwrap(), (0, big));
    assert!(cell.persist_error().get_untracked().is_none());
    assert!(relay.stats().failures >= 1);
}

/// A cell restored from `store`'s `stream`, and its relay.
fn start(cx: &AsyncContext, mut store: SqliteStore, stream: &str) -> (egress_reactive::AsyncEgressCell<Bytes>, Relay) {
    let loaded = store.load(stream).unwrap();
    let core = EgressCore::restore(Policy::default(), loaded.restored).unwrap();
    let cell =
        egress_reactive::AsyncEgressCell::from_core(cx, core, CellOptions::new().incarnation(loaded.incarnation));
    let relay = Relay::spawn(cx, &cell, store, stream, config());
    (cell, relay)
}

/// Polls `f` on the cell until it gives `Some` (the relay works on its own
/// tasks; each poll yields to them).
async fn wait_for<T>(
    cell: &egress_reactive::AsyncEgressCell<Bytes>,
    f: impl Fn(&egress_reactive::AsyncEgressCell<Bytes>) -> Option<T>,
) -> T {
    egress_testkit::until(|| f(cell), || "the cell's condition".to_owned()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_adopts_what_applications_append_in_their_own_transactions() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open_durable(&cx, dir.db(), "orders", Policy::default(), CellOptions::new(), config()).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _link = durable.cell.attach(Channel(tx));
    let app = Arc::new(parking_lot::Mutex::new(rusqlite::Connection::open(dir.db()).unwrap()));
    let outbox = Outbox::new("orders");
    for i in 0..50u32 {
        let mut conn = app.lock();
        let t = conn.transaction().unwrap();
        let _ = outbox.append_json(&t, &serde_json::json!({ "n": i })).unwrap();
        if i % 5 == 4 {
            t.rollback().unwrap();
        } else {
            t.commit().unwrap();
        }
    }
    let mut got = Vec::new();
    while got.len() < 40 {
        got.push(rx.recv().await.unwrap());
    }
    let expected: Vec<(u64, Bytes)> = (0..50u32)
        .filter(|i| i % 5 != 4)
        .enumerate()
        .map(|(s, i)| (s as u64, Bytes::from(format!(r#"{{"n":{i}}}"#))))
        .collect();
    assert_eq!(got, expected);
    assert_eq!(durable.relay.stats().adopted, 40);
}

#[test]
fn the_received_log_rises_with_the_applications_commits_only() {
    use egress_core::Incarnation;
    use egress_store::ReceivedLog;
    let dir = TempDir::new();
    let log = ReceivedLog::open(dir.db()).unwrap();
    let mut app = rusqlite::Connection::open(dir.db()).unwrap();
    let inc = Incarnation(0xfeed);
    assert_eq!(log.next("p", inc).unwrap(), None);
    let tx = app.transaction().unwrap();
    ReceivedLog::record(&tx, "p", inc, 4).unwrap();
    tx.commit().unwrap();
    assert_eq!(log.next("p", inc).unwrap(), Some(5));
    // Rolled back with the application's transaction: not recorded.
    let tx = app.transaction().unwrap();
    ReceivedLog::record(&tx, "p", inc, 9).unwrap();
    tx.rollback().unwrap();
    assert_eq!(log.next("p", inc).unwrap(), Some(5));
    // Only rises; other streams are apart.
    ReceivedLog::record(&app, "p", inc, 2).unwrap();
    ReceivedLog::record(&app, "p", Incarnation(1), 0).unwrap();
    assert_eq!((log.next("p", inc).unwrap(), log.next("p", Incarnation(1)).unwrap()), (Some(5), Some(1)));
    // A sequence the store cannot hold is a typed error.
    assert!(matches!(ReceivedLog::record(&app, "p", inc, u64::MAX - 1), Err(StoreError::OutOfRange { .. })));
    // Through the seam the reference receiver resumes by: the same answers,
    // and a store error as its words.
    let resume: &dyn egress_core::Resume = &log;
    assert_eq!(resume.resume("p", inc), Ok(Some(5)));
    assert_eq!(resume.resume("p", Incarnation(1)), Ok(Some(1)));
    assert_eq!(resume.resume("q", inc), Ok(None));
    app.execute("DROP TABLE egress_received", []).unwrap();
    let error = resume.resume("p", inc).unwrap_err();
    assert!(error.contains("egress_received"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cell_and_an_outbox_on_one_stream_lose_nothing_and_never_wedge() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open_durable(&cx, dir.db(), "s", Policy::default(), CellOptions::new(), config()).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let link = durable.cell.attach(Channel(tx));
    let app = std::thread::spawn({
        let path = dir.db();
        move || {
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.busy_timeout(Duration::from_secs(5)).unwrap();
            for i in 0..100 {
                Outbox::new("s").append(&conn, format!("outbox {i}").as_bytes()).unwrap();
            }
        }
    });
    for i in 0..100 {
        durable.cell.enqueue(Bytes::from(format!("cell {i}")));
        if i % 10 == 0 {
            tokio::task::yield_now().await;
        }
    }
    app.join().unwrap();
    let mut got = Vec::new();
    while got.len() < 200 {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
            Ok(r) => {
                let (sequence, payload) = r.unwrap();
                let _ = link.ack(Sequence(sequence));
                got.push((sequence, payload));
            }
            Err(_) => panic!(
                "wedged after {} sends: {:?}, {:?}, error {:?}, unpersisted {}, pending {}, next {:?}",
                got.len(),
                durable.relay.stats(),
                durable.cell,
                durable.cell.persist_error().get_untracked(),
                durable.cell.unpersisted_len().get_untracked(),
                durable.cell.pending_len().get_untracked(),
                durable.cell.next_sequence(),
            ),
        }
    }
    // Sequences 0..200 in order, each payload once, each source in its own
    // order.
    assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), (0..200).collect::<Vec<_>>());
    let texts: Vec<String> = got.iter().map(|(_, p)| String::from_utf8(p.to_vec()).unwrap()).collect();
    for source in ["cell", "outbox"] {
        let mine: Vec<&String> = texts.iter().filter(|t| t.starts_with(source)).collect();
        let expected: Vec<String> = (0..100).map(|i| format!("{source} {i}")).collect();
        assert_eq!(mine, expected.iter().collect::<Vec<_>>(), "{source}: every record once, in order");
    }
    assert!(durable.cell.persist_error().get_untracked().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_dropped_mid_commit_leaves_it_reported_and_a_new_relay_goes_on() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let store = SqliteStore::open(dir.db()).unwrap();
    let (cell, relay) = start(&cx, store, "s");
    // A commit held in flight by another writer's lock.
    let blocker = rusqlite::Connection::open(dir.db()).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    cell.enqueue_all((0..20).map(|i| Bytes::from(format!("m{i}"))));
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(relay);
    blocker.execute_batch("ROLLBACK").unwrap();
    // A new relay on the same cell, over a store that loads the stream.
    let mut store = SqliteStore::open(dir.db()).unwrap();
    let _ = store.load("s").unwrap();
    let relay = Relay::spawn(&cx, &cell, store, "s", config());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _link = cell.attach(Channel(tx));
    for i in 0..20u64 {
        let (s, p) = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.expect("no wedge").unwrap();
        assert_eq!((s, p), (i, Bytes::from(format!("m{i}"))));
    }
    assert!(!relay.stats().fenced);
}

#[test]
fn a_synchronous_cell_writes_its_journal_from_its_own_loop() {
    use egress_reactive::{Context, EgressCell};
    let dir = TempDir::new();
    let cx = Context::new();
    let mut store = SqliteStore::open(dir.db()).unwrap();
    let loaded = store.load("ui").unwrap();
    let core = EgressCore::restore(Policy::default(), loaded.restored).unwrap();
    let cell: EgressCell<Bytes> = EgressCell::from_core(&cx.handle(), core, CellOptions::new());
    let sent = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    struct Wire(std::rc::Rc<std::cell::RefCell<Vec<u64>>>);
    impl egress_reactive::Transport<Bytes> for Wire {
        fn send(&mut self, e: egress_core::Envelope<Bytes>) -> Result<(), SendError> {
            self.0.borrow_mut().push(e.sequence.0);
            Ok(())
        }
    }
    let _link = cell.attach(Wire(sent.clone()));
    cell.enqueue_all((0..3).map(|i| Bytes::from(format!("m{i}"))));
    assert!(sent.borrow().is_empty());
    assert_eq!(store.write_journal(&cell, "ui").unwrap(), 3);
    assert_eq!(*sent.borrow(), [0, 1, 2]);
    assert_eq!(store.write_journal(&cell, "ui").unwrap(), 0, "nothing more to write");
    // Another store takes the stream over: the next write fails, shown.
    let mut other = SqliteStore::open(dir.db()).unwrap();
    let restored = other.load("ui").unwrap().restored;
    assert_eq!(restored.records.len(), 3);
    cell.enqueue(Bytes::from_static(b"late"));
    assert!(matches!(store.write_journal(&cell, "ui"), Err(StoreError::Fenced { .. })));
    assert!(cell.persist_error().get().is_some());
}

#[test]
fn a_stored_counter_that_went_backwards_is_an_error_shown_by_the_cell_not_a_rebase() {
    use egress_reactive::{Context, EgressCell};
    let dir = TempDir::new();
    let cx = Context::new();
    let mut store = SqliteStore::open(dir.db()).unwrap();
    let core = EgressCore::restore(Policy::default(), store.load("ui").unwrap().restored).unwrap();
    let cell: EgressCell<Bytes> = EgressCell::from_core(&cx.handle(), core, CellOptions::new());
    cell.enqueue_all((0..2).map(|i| Bytes::from(format!("m{i}"))));
    assert_eq!(store.write_journal(&cell, "ui").unwrap(), 2);
    // The stored counter moves behind what this cell wrote (a database put
    // back from an older copy): no other writer's appends to move behind.
    store.connection().execute("UPDATE egress_stream SET next_sequence = 1 WHERE stream = 'ui'", []).unwrap();
    cell.enqueue(Bytes::from_static(b"m2"));
    match store.write_journal(&cell, "ui") {
        Err(StoreError::Conflict { stored: 1, expected: 2, .. }) => {}
        other => panic!("{other:?}"),
    }
    let shown = cell.persist_error().get();
    assert!(shown.as_ref().is_some_and(|e| e.reason.contains("stored counter is at 1")), "{shown:?}");
    assert_eq!((cell.pending().get().len(), cell.unpersisted_len().get()), (3, 1), "m2 kept, unwritten");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_append_reads_saving_at_once_and_is_adopted_at_its_commit_not_at_a_poll() {
    use egress_core::MessageStatus;
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    // A poll so slow that only the wake at the commit can explain a prompt
    // adoption.
    let slow = RelayConfig { poll_interval: Duration::from_secs(60), ..config() };
    let durable = open_durable(&cx, dir.db(), "chat", Policy::default(), CellOptions::new(), slow).await.unwrap();
    let cell = durable.cell.clone();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _link = cell.attach(Channel(tx));
    let mut app = rusqlite::Connection::open(dir.db()).unwrap();
    let outbox = Outbox::new("chat");
    for round in 0..3u64 {
        let t = app.transaction().unwrap();
        let sequence = outbox.append(&t, format!("m{round}").as_bytes()).unwrap();
        // Appended, not committed: the cell cannot know it, and says so as
        // "saving", not "never enqueued".
        let status = cell.status(sequence);
        assert_eq!(status.get_untracked(), Some(MessageStatus::Saving));
        let delivered = tokio::spawn({
            let cell = cell.clone();
            async move { cell.delivered(sequence).await }
        });
        t.commit().unwrap();
        let sent = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("adopted at the commit");
        assert_eq!(sent, Some((round, Bytes::from(format!("m{round}")))));
        let _ = cell.ack(cell.generation().get_untracked(), Sequence(round));
        let delivered = tokio::time::timeout(Duration::from_secs(10), delivered).await.expect("an outcome");
        assert_eq!(delivered.unwrap(), Ok(()), "the wait saw the append through");
        drop(status);
    }
    durable.relay.shutdown().await;
    // A clean close checkpoints the WAL into the database and truncates it
    // (the application's connection still open, so SQLite's own close
    // would not).
    let wal = std::path::PathBuf::from(format!("{}-wal", dir.db().display()));
    assert_eq!(std::fs::metadata(&wal).unwrap().len(), 0, "the relay's shutdown checkpointed");
    drop(app);
}

#[test]
fn an_outbox_refuses_a_payload_above_its_limit_and_an_append_past_its_capacity_appending_nothing() {
    let dir = TempDir::new();
    let mut store = SqliteStore::open(dir.db()).unwrap();
    let mut core = EgressCore::restore(Policy::default(), store.load("s").unwrap().restored).unwrap();
    let mut app = rusqlite::Connection::open(dir.db()).unwrap();
    let outbox = Outbox::new("s").max_payload(8).capacity(2);
    assert_eq!(outbox.room(&app).unwrap(), Some(2));
    assert_eq!(Outbox::new("s").room(&app).unwrap(), None, "no capacity");
    let t = app.transaction().unwrap();
    match outbox.append(&t, &[0; 9]) {
        Err(StoreError::TooLarge { size: 9, limit: 8 }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(outbox.append(&t, &[1; 8]).unwrap(), Sequence(0), "at the limit");
    assert_eq!(outbox.append(&t, b"b").unwrap(), Sequence(1));
    match outbox.append(&t, b"c") {
        Err(StoreError::Full { stream, capacity: 2 }) if stream == "s" => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(outbox.room(&t).unwrap(), Some(0));
    t.commit().unwrap();
    let stored: Vec<(i64, Vec<u8>)> = app
        .prepare("SELECT seq, payload FROM egress_outbox WHERE stream = 's' ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(stored, [(0, vec![1; 8]), (1, b"b".to_vec())], "the refused appends left nothing");
    // An acknowledgement written by the cell's store makes room.
    let g = core.generation();
    for (s, p) in [(0u64, vec![1u8; 8]), (1, b"b".to_vec())] {
        assert!(matches!(core.adopt(Sequence(s), Bytes::from(p)).outcome, egress_core::AdoptOutcome::Adopted { .. }));
    }
    flush(&mut core, &mut store, "s");
    let _ = core.reconnect(Generation(g.0 + 1));
    flush(&mut core, &mut store, "s");
    let g = core.generation();
    let _ = core.claim(g);
    let _ = core.ack(g, Sequence(0));
    flush(&mut core, &mut store, "s");
    assert_eq!(outbox.room(&app).unwrap(), Some(1));
    assert_eq!(outbox.append(&app, b"c").unwrap(), Sequence(2));
}

#[test]
fn a_dead_letter_whose_held_flag_is_neither_0_nor_1_is_refused_at_load_above_or_below_the_watermark() {
    for (acked, held) in [(None, "5"), (None, "NULL"), (Some(3), "5"), (Some(3), "NULL"), (Some(3), "-1")] {
        let dir = TempDir::new();
        let mut store = SqliteStore::open(dir.db()).unwrap();
        drop(store.load("s").unwrap());
        let conn = store.connection();
        let acked_sql = acked.map_or("NULL".to_owned(), |a: i64| a.to_string());
        conn.execute_batch(&format!(
            "UPDATE egress_stream SET next_sequence = 5, acked_through = {acked_sql} WHERE stream = 's';
             INSERT INTO egress_outbox (stream, seq, payload) VALUES ('s', 4, x'00');
             INSERT INTO egress_outbox (stream, seq, payload, dead_reason, dead_held) VALUES ('s', 2, x'00', 0, {held});"
        ))
        .unwrap();
        if acked.is_none() {
            for s in [0, 1, 3] {
                conn.execute("INSERT INTO egress_outbox (stream, seq, payload) VALUES ('s', ?1, x'00')", [s]).unwrap();
            }
        }
        // The error names the value found; a missing flag (NULL) as -1.
        let found: i128 = held.parse().unwrap_or(-1);
        match store.load("s") {
            Err(StoreError::OutOfRange { what: "dead_held", value }) => assert_eq!(value, found, "held {held}"),
            other => panic!("acked {acked:?}, held {held}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_with_nothing_to_write_learns_of_a_takeover_and_stops() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open_durable(&cx, dir.db(), "s", Policy::default(), CellOptions::new(), config()).await.unwrap();
    durable.cell.enqueue(Bytes::from_static(b"stored"));
    wait_for(&durable.cell, |c| c.durable_through().get_untracked()).await;
    // Everything is written; nothing more will be. Another process loads
    // the stream: this relay must find out without a write to fail.
    let mut other = SqliteStore::open(dir.db()).unwrap();
    let _ = other.load("s").unwrap();
    egress_testkit::until(
        || durable.relay.stats().fenced.then_some(()),
        || format!("the relay still thinks the stream is its own: {:?}", durable.relay.stats()),
    )
    .await;
    // And a store asked directly says so too.
    let mut third = SqliteStore::open(dir.db()).unwrap();
    assert!(matches!(third.owns("s"), Err(StoreError::NotLoaded { .. })));
    let _ = third.load("s").unwrap();
    assert_eq!(third.owns("s").ok(), Some(()));
    assert!(matches!(other.owns("s"), Err(StoreError::Fenced { .. })));
    // Its Debug output shows its stats, the fence among them.
    let debug = format!("{:?}", durable.relay);
    assert!(debug.starts_with("Relay { stats: RelayStats {") && debug.contains("fenced: true"), "{debug}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_journal_asks_whether_its_stream_was_taken_over_at_most_every_100_ms() {
    use egress_store::{JournalStore, SqliteJournal};
    let dir = TempDir::new();
    let mut store = SqliteStore::open(dir.db()).unwrap();
    drop(store.load("s").unwrap());
    let mut journal = SqliteJournal::new(store, "s");
    journal.keep().await.unwrap();
    let mut other = SqliteStore::open(dir.db()).unwrap();
    drop(other.load("s").unwrap());
    // Taken over, but within 100 ms of the last look (virtual time): not
    // asked again.
    tokio::time::advance(Duration::from_millis(99)).await;
    journal.keep().await.unwrap();
    // 100 ms after it: asked, and the takeover found.
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(matches!(journal.keep().await, Err(StoreError::Fenced { .. })));
}

/// An application that drops its context before its relay: the cell's
/// readers are gone, the relay is not. It goes on adopting and writing what
/// the cell holds until it is shut down, and never panics reading a reader
/// the context took with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_outlives_its_context_without_a_panic_and_loses_nothing() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open_durable(&cx, dir.db(), "orders", Policy::default(), CellOptions::new(), config()).await.unwrap();
    let cell = durable.cell.clone();
    let _ = cell.enqueue(Bytes::from_static(b"mine"));
    egress_testkit::until(
        || (cell.durable_through().get_untracked() == Some(Sequence(0))).then_some(()),
        || "written".into(),
    )
    .await;
    drop(cx);
    let app = rusqlite::Connection::open(dir.db()).unwrap();
    let _ = Outbox::new("orders").append(&app, b"theirs").unwrap();
    let relay = &durable.relay;
    egress_testkit::until(|| (relay.stats().adopted == 1).then_some(()), || format!("{:?}", relay.stats())).await;
    let stats = durable.relay.shutdown().await;
    assert_eq!((stats.appended, stats.adopted), (1, 1), "{stats:?}");
    let mut store = egress_store::SqliteStore::open(dir.db()).unwrap();
    let loaded = store.load("orders").unwrap();
    let held: Vec<Bytes> = loaded.restored.records.iter().map(|e| e.payload.clone()).collect();
    assert_eq!(held, vec![Bytes::from_static(b"mine"), Bytes::from_static(b"theirs")]);
}

/// An acknowledgement of a record the stream never held is refused, and
/// nothing of its transaction is written: the stream still restores.
#[test]
fn an_acknowledgement_above_the_streams_counter_is_refused_whole() {
    let dir = TempDir::new();
    let mut store = SqliteStore::open(dir.db()).unwrap();
    let _ = store.load("s").unwrap();
    let append = egress_core::Ready {
        epoch: egress_core::Epoch(0),
        appends: Sequence(0)..Sequence(1),
        acked_through: None,
        generation: None,
        dead: Vec::new(),
        must_sync: true,
    };
    store.apply("s", &append, &[(Sequence(0), Bytes::from_static(b"a"))]).unwrap();
    for (appends, acked) in [(Sequence(1)..Sequence(1), 1), (Sequence(1)..Sequence(2), 2)] {
        let payloads: Vec<(Sequence, Bytes)> =
            (appends.start.0..appends.end.0).map(|s| (Sequence(s), Bytes::from_static(b"b"))).collect();
        let beyond = egress_core::Ready { appends, acked_through: Some(Sequence(acked)), ..append.clone() };
        match store.apply("s", &beyond, &payloads) {
            Err(StoreError::OutOfRange { what, value }) => {
                assert!(what.starts_with("acked_through"), "{what}");
                assert_eq!(value, i128::from(acked));
            }
            other => panic!("expected OutOfRange, got {other:?}"),
        }
    }
    let at_the_last =
        egress_core::Ready { appends: Sequence(1)..Sequence(1), acked_through: Some(Sequence(0)), ..append };
    store.apply("s", &at_the_last, &[]).unwrap();
    let loaded = store.load("s").unwrap();
    assert_eq!((loaded.restored.next_sequence, loaded.restored.acked_through), (Sequence(1), Some(Sequence(0))));
    assert!(loaded.restored.records.is_empty());
}
