//! A durable latest projection as an application uses it:
//! `open_durable_latest` gives an `AsyncLatestCell` restored from SQLite
//! and the relay that writes its journal; a sink attached to the cell is
//! handed a value only once it is stored, and a restart (the process gone
//! without a close) resumes each key at its stored frontier with its
//! stored desire. And the store's refusals: a value the codec cannot
//! write, a refused commit, a takeover, values that do not match a write.
#![allow(clippy::unwrap_used)]

use std::num::NonZeroUsize;

use bytes::Bytes;
use egress_codec::{Codec, CodecError, Encode, Json};
use egress_core::{Epoch, Generation, LatestReady, LatestWrite, Upserted, Version};
use egress_reactive::{AsyncContext, CellOptions, LatestRefused};
use egress_store::{DurableLatest, RelayConfig, SqliteStore, StoreError, open_durable_latest};

mod common;
use common::latest::{Later, Panel, Setting, policy, theme, until};
use common::{TempDir, config};

async fn open_with<C: Codec<u32>>(
    cx: &AsyncContext,
    dir: &TempDir,
    codec: C,
    relay: RelayConfig,
) -> Result<DurableLatest<Setting, u32>, StoreError> {
    let keys = NonZeroUsize::new(8).unwrap();
    open_durable_latest(cx, dir.db(), "panel", codec, policy(), keys, CellOptions::new(), relay).await
}

async fn open(cx: &AsyncContext, dir: &TempDir) -> DurableLatest<Setting, u32> {
    open_with(cx, dir, Json, config()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_reaches_the_sink_once_stored_and_a_restart_resumes_each_key_at_its_frontier() {
    let dir = TempDir::new();
    let generation;
    {
        let cx = AsyncContext::new();
        let durable = open(&cx, &dir).await;
        generation = durable.cell.generation().get_untracked();
        assert_eq!(generation, Generation(1), "a new projection's first open");
        let shown = format!("{durable:?}");
        assert!(
            shown.starts_with("DurableLatest { cell: AsyncLatestCell(LatestCell { generation: Generation(1)"),
            "{shown}"
        );
        assert!(shown.contains("relay: LatestRelay { stats: RelayStats { commits: "), "{shown}");
        let panel = Later::default();
        let link = durable.cell.attach(panel.clone());
        durable.cell.upsert(Setting::Volume, Version(1), 10).unwrap();
        durable.cell.upsert(theme("dark"), Version(1), 1).unwrap();
        let seen = panel.clone();
        until("both handed to the sink", || seen.0.lock().unwrap().len() == 2).await;
        assert_eq!(durable.cell.unpersisted_len().get_untracked(), 0, "handed over only once stored");
        // The volume is applied; newer values come while the theme's write
        // is out: the volume's is handed over, the theme's waits its flight.
        assert!(matches!(link.applied(&Setting::Volume, Version(1)), egress_core::Applied::Advanced { .. }));
        durable.cell.upsert(Setting::Volume, Version(2), 20).unwrap();
        durable.cell.upsert(theme("dark"), Version(2), 2).unwrap();
        until("the volume's second value handed over", || seen.0.lock().unwrap().len() == 3).await;
        let cell = durable.cell.clone();
        until("every row written", || cell.unpersisted_len().get_untracked() == 0).await;
        // No shutdown: the relay is aborted, the store is not closed, as a
        // SIGKILL leaves it.
        drop((link, durable));
    }
    let cx = AsyncContext::new();
    let durable = open(&cx, &dir).await;
    assert!(durable.cell.generation().get_untracked() > generation, "a restart takes a later generation");
    let cell = &durable.cell;
    assert_eq!(cell.with_latest(|l| l.durable_through(&Setting::Volume)), Some(Version(1)));
    // What the sink had not applied comes back as the desire, its newest:
    // volume 2 (handed over, never applied) and theme 2 (never handed).
    assert_eq!(cell.with_latest(|l| l.desired(&Setting::Volume).map(|(v, x)| (v, *x))), Some((Version(2), 20)));
    assert_eq!(cell.with_latest(|l| l.desired(&theme("dark")).map(|(v, x)| (v, *x))), Some((Version(2), 2)));
    assert_eq!(
        cell.upsert(Setting::Volume, Version(1), 10),
        Ok(Upserted::AlreadyDurable { durable_through: Version(1) })
    );
    let panel = Panel::default();
    let _link = cell.attach(panel.clone());
    let mut seen = panel.seen();
    seen.sort();
    assert_eq!(seen, [(Setting::Volume, 2, 20), (theme("dark"), 2, 2)], "each key's newest, once");
    until("settled", || cell.is_settled().get_untracked()).await;
    until("the frontiers written", || cell.unpersisted_len().get_untracked() == 0).await;
    let stats = durable.relay.shutdown().await;
    assert!(stats.commits >= 1 && stats.failures == 0, "{stats:?}");
    assert_eq!(stats.appended, 0, "no desire written by this process: frontiers only");
    // Once more: nothing left to write, the frontiers as applied.
    let cx = AsyncContext::new();
    let durable = open(&cx, &dir).await;
    assert!(durable.cell.is_settled().get_untracked());
    assert_eq!(durable.cell.with_latest(|l| l.durable_through(&theme("dark"))), Some(Version(2)));
    drop(durable);
    // Two desires in one batch: one write, each counted.
    let cx = AsyncContext::new();
    let durable = open(&cx, &dir).await;
    cx.batch(|| {
        durable.cell.upsert(Setting::Volume, Version(3), 30).unwrap();
        durable.cell.upsert(theme("dark"), Version(3), 3).unwrap();
    });
    let stats = durable.relay.shutdown().await;
    assert_eq!(stats.appended, 2, "{stats:?}");
}

/// Refuses to encode 13, and decodes anything as its first byte.
struct Unlucky;

impl Encode<u32> for Unlucky {
    fn encode(&self, value: &u32) -> Result<Bytes, CodecError> {
        if *value == 13 {
            return Err(CodecError::from("unlucky"));
        }
        Ok(Bytes::from(value.to_be_bytes().to_vec()))
    }
}

impl Codec<u32> for Unlucky {
    fn decode(&self, bytes: &Bytes) -> Result<u32, CodecError> {
        let array: [u8; 4] = bytes.as_ref().try_into().map_err(|_| CodecError::from("not four bytes"))?;
        Ok(u32::from_be_bytes(array))
    }
}

/// A key serde cannot write when it is "bad".
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize)]
struct Picky(String);

impl serde::Serialize for Picky {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0 == "bad" {
            return Err(serde::ser::Error::custom("a bad key"));
        }
        s.serialize_str(&self.0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_store_cannot_write_is_refused_at_the_upsert_and_holds_no_key_back() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open_with(&cx, &dir, Unlucky, config()).await.unwrap();
    let panel = Panel::default();
    let _link = durable.cell.attach(panel.clone());
    // A value the codec cannot encode, a version SQLite cannot hold: each
    // was once accepted, and every epoch after it failed, every key's.
    let refused = durable.cell.upsert(Setting::Volume, Version(1), 13).unwrap_err();
    assert!(matches!(&refused, LatestRefused::Unwritable { value: 13, reason } if reason.contains("unlucky")));
    let refused = durable.cell.upsert(theme("x"), Version(1 << 63), 1).unwrap_err();
    assert!(matches!(&refused, LatestRefused::Unwritable { reason, .. } if reason.contains("out of range")));
    durable.cell.upsert(theme("x"), Version((1 << 63) - 1), 1).unwrap();
    durable.cell.upsert(Setting::Volume, Version(1), 12).unwrap();
    let cell = durable.cell.clone();
    until("both written and handed over", || panel.seen().len() == 2).await;
    assert_eq!(cell.persist_error().get_untracked(), None);
    drop(durable);
    // A key serde cannot write.
    let keys = NonZeroUsize::new(8).unwrap();
    let picky: DurableLatest<Picky, u32> =
        open_durable_latest(&cx, dir.db(), "picky", Json, policy(), keys, CellOptions::new(), config()).await.unwrap();
    let refused = picky.cell.upsert(Picky("bad".into()), Version(1), 1).unwrap_err();
    assert!(matches!(&refused, LatestRefused::Unwritable { reason, .. } if reason.contains("a bad key")));
    assert!(
        matches!(&refused, LatestRefused::Unwritable { reason, .. } if reason.starts_with("latest picky: ")),
        "the reason names the projection: {refused:?}"
    );
    picky.cell.upsert(Picky("good".into()), Version(1), 1).unwrap();
    let cell = picky.cell.clone();
    until("the good key written", || cell.unpersisted_len().get_untracked() == 0).await;
    assert_eq!(cell.persist_error().get_untracked(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_whose_key_is_not_spelled_as_serde_writes_it_refuses_the_open() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open(&cx, &dir).await;
    durable.cell.upsert(Setting::Volume, Version(1), 10).unwrap();
    durable.relay.shutdown().await;
    // Another program adds the same key spelled with a space: it would
    // stand beside the key's own row, and a delete would miss it.
    let db = rusqlite::Connection::open(dir.db()).unwrap();
    db.execute(
        "INSERT INTO egress_latest_key (name, key, version, value) VALUES ('panel', ' \"Volume\"', 3, CAST('30' AS BLOB))",
        [],
    )
    .unwrap();
    let refused = open_with(&cx, &dir, Json, config()).await.unwrap_err();
    assert!(
        matches!(&refused, StoreError::LatestKey { reason, .. } if reason.contains("not as serde writes it")),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_value_the_codec_cannot_read_refuses_the_open_and_fences_nobody() {
    let dir = TempDir::new();
    {
        let cx = AsyncContext::new();
        let durable = open(&cx, &dir).await;
        durable.cell.upsert(Setting::Volume, Version(1), 10).unwrap();
        durable.relay.shutdown().await;
    }
    let cx = AsyncContext::new();
    let holder = open(&cx, &dir).await;
    // JSON "10" is two bytes: the other codec cannot read it.
    let refused = open_with(&cx, &dir, Unlucky, config()).await.unwrap_err();
    assert!(matches!(&refused, StoreError::LatestValue { encode: false, .. }), "{refused:?}");
    // The holder was not fenced: it still writes.
    holder.cell.upsert(Setting::Volume, Version(2), 20).unwrap();
    let cell = holder.cell.clone();
    until("written", || cell.unpersisted_len().get_untracked() == 0).await;
    assert_eq!(cell.persist_error().get_untracked(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_commit_is_shown_hands_nothing_over_and_is_tried_again() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let store = SqliteStore::open(dir.db()).unwrap();
    store.connection().busy_timeout(std::time::Duration::from_millis(50)).unwrap();
    drop(store);
    let durable = open(&cx, &dir).await;
    let panel = Panel::default();
    let _link = durable.cell.attach(panel.clone());
    // Another writer holds the database's write lock.
    let blocker = rusqlite::Connection::open(dir.db()).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    durable.cell.upsert(Setting::Volume, Version(1), 10).unwrap();
    let cell = durable.cell.clone();
    until("the error shown", || cell.persist_error().get_untracked().is_some()).await;
    assert!(panel.seen().is_empty(), "nothing handed over before it is stored");
    assert_eq!(cell.unpersisted_len().get_untracked(), 1);
    blocker.execute_batch("ROLLBACK").unwrap();
    drop(blocker);
    until("handed over once stored", || !panel.seen().is_empty()).await;
    assert_eq!(panel.seen(), [(Setting::Volume, 1, 10)]);
    until("the error cleared", || cell.persist_error().get_untracked().is_none()).await;
    assert!(durable.relay.stats().failures >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_open_takes_the_projection_over_and_the_first_writes_no_more() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let first = open(&cx, &dir).await;
    first.cell.upsert(Setting::Volume, Version(1), 10).unwrap();
    let cell = first.cell.clone();
    until("written", || cell.unpersisted_len().get_untracked() == 0).await;
    let second = open(&cx, &dir).await;
    assert_eq!(second.cell.with_latest(|l| l.desired(&Setting::Volume).map(|(v, _)| v)), Some(Version(1)));
    // The first, with nothing to write, notices on its own.
    let relay = &first.relay;
    until("the idle first relay fenced", || relay.stats().fenced).await;
    first.cell.upsert(Setting::Volume, Version(2), 20).unwrap();
    until("the fence shown", || cell.persist_error().get_untracked().is_some_and(|e| e.reason.contains("taken over")))
        .await;
    assert!(first.relay.stats().fenced);
    // The second's rows are as it left them: version 2 never written.
    let db = rusqlite::Connection::open(dir.db()).unwrap();
    let version: i64 =
        db.query_row("SELECT version FROM egress_latest_key WHERE name = 'panel'", [], |r| r.get(0)).unwrap();
    assert_eq!(version, 1);
}

#[test]
fn a_sqlite_journal_shows_its_name() {
    let dir = TempDir::new();
    let journal = egress_store::SqliteLatest::new(SqliteStore::open(dir.db()).unwrap(), "panel");
    let shown = format!("{journal:?}");
    assert!(shown.starts_with("SqliteLatest { name: \"panel\""), "{shown}");
}

#[test]
fn the_store_refuses_values_that_do_not_match_the_writes_and_writes_it_never_loaded() {
    let dir = TempDir::new();
    let mut store = SqliteStore::open(dir.db()).unwrap();
    let ready = LatestReady {
        epoch: Epoch(1),
        writes: vec![
            LatestWrite::Put { key: 1u8, newest: Some(Version(1)), durable_through: None },
            LatestWrite::Delete { key: 2u8 },
        ],
    };
    let value = Some(Bytes::from_static(b"x"));
    assert!(matches!(store.apply_latest("p", &ready, &[value.clone(), None]), Err(StoreError::NotLoaded { .. })));
    let loaded = store.load_latest::<u8>("p").unwrap();
    assert_eq!((loaded.generation, loaded.keys.len()), (Generation(1), 0));
    for values in [vec![value.clone()], vec![None, None], vec![value.clone(), value.clone()]] {
        let refused = store.apply_latest("p", &ready, &values).unwrap_err();
        assert!(matches!(refused, StoreError::LatestWrites { writes: 2, .. }), "{refused:?}");
    }
    // A key written twice in one write (a Put then a Delete): the stores
    // would disagree on which wins; refused, nothing written.
    let twice = LatestReady {
        epoch: Epoch(1),
        writes: vec![
            LatestWrite::Put { key: 3u8, newest: Some(Version(1)), durable_through: None },
            LatestWrite::Delete { key: 3u8 },
        ],
    };
    let refused = store.apply_latest("p", &twice, &[value.clone(), None]).unwrap_err();
    assert!(matches!(&refused, StoreError::LatestKey { reason, .. } if reason.contains("twice")), "{refused:?}");
    let rows: i64 = store.connection().query_row("SELECT COUNT(*) FROM egress_latest_key", [], |r| r.get(0)).unwrap();
    assert_eq!(rows, 0);
    store.apply_latest("p", &ready, &[value, None]).unwrap();
    store.owns_latest("p").unwrap();
    // A stored row that breaks the rules: a version without its value.
    store.connection().execute("UPDATE egress_latest_key SET value = NULL", []).unwrap();
    let mut other = SqliteStore::open(dir.db()).unwrap();
    assert!(matches!(other.load_latest::<u8>("p"), Err(StoreError::OutOfRange { .. })));
    store.owns_latest("p").unwrap();
    // A stored key the key type cannot read.
    store.connection().execute("UPDATE egress_latest_key SET key = '\"text\"', value = x'00'", []).unwrap();
    assert!(matches!(other.load_latest::<u8>("p"), Err(StoreError::LatestKey { .. })));
    assert!(matches!(other.load_latest::<String>("p"), Ok(l) if l.keys.len() == 1 && l.generation == Generation(2)));
    assert!(matches!(store.owns_latest("p"), Err(StoreError::Fenced { .. })), "taken over by the last load");
}

/// A shutdown writes what is pending and checkpoints SQLite's WAL: with
/// another connection open (so that closing the relay's store does not
/// checkpoint it anyway), the WAL is empty after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_writes_what_is_pending_and_checkpoints_the_wal() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open(&cx, &dir).await;
    let app = rusqlite::Connection::open(dir.db()).unwrap();
    let rows: i64 = app.query_row("SELECT COUNT(*) FROM egress_latest", [], |r| r.get(0)).unwrap();
    assert_eq!(rows, 1);
    durable.cell.upsert(Setting::Volume, Version(1), 10).unwrap();
    let stats = durable.relay.shutdown().await;
    assert_eq!(stats.appended, 1, "{stats:?}");
    let wal = std::fs::metadata(format!("{}-wal", dir.db().display())).map(|m| m.len()).unwrap_or(0);
    assert_eq!(wal, 0, "the WAL was checkpointed");
    let stored: i64 = app.query_row("SELECT COUNT(*) FROM egress_latest_key", [], |r| r.get(0)).unwrap();
    assert_eq!(stored, 1);
}
