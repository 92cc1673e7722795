//! Durable lanes as an application uses them: `open_durable_lanes` gives
//! an `AsyncLanesCell` restored from SQLite and the relay that writes its
//! journal; a transport attached to the cell sends only what is durable.
#![allow(clippy::unwrap_used)]

use std::num::NonZeroUsize;

use egress_codec::Json;
use egress_core::{Generation, LaneKey, LaneKind, LanesPolicy, Ordinal, Policy, Sequence};
use egress_reactive::{AsyncContext, CellOptions, LaneItem, LanesRefused, LanesTransport, SendError};
use egress_store::{DurableLanes, RelayConfig, open_durable_lanes};
use tokio::sync::mpsc;

mod common;
use common::{TempDir, config};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
enum Lane {
    Room(String),
    ToDevice,
    Other,
}

impl LaneKey for Lane {
    fn kind(&self) -> LaneKind {
        match self {
            Lane::Room(_) | Lane::ToDevice => LaneKind::Serial,
            Lane::Other => LaneKind::Unordered(NonZeroUsize::new(4).unwrap()),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Msg(String);

fn room(name: &str) -> Lane {
    Lane::Room(name.to_owned())
}

/// Hands each item to a channel.
struct Wire(mpsc::UnboundedSender<LaneItem<Lane, Msg>>);

impl LanesTransport<Lane, Msg> for Wire {
    fn send(&mut self, item: LaneItem<Lane, Msg>) -> Result<(), SendError> {
        self.0.send(item).map_err(|_| SendError::transient("gone"))
    }
}

async fn open(cx: &AsyncContext, dir: &TempDir, relay: RelayConfig) -> DurableLanes<Lane, Msg> {
    let policy = LanesPolicy::new(Policy::default(), 16).unwrap();
    open_durable_lanes(cx, dir.db(), "client", Json, policy, CellOptions::new(), relay).await.unwrap()
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    egress_testkit::until(|| f().then_some(()), || what.to_owned()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_go_out_once_durable_and_come_back_in_order_after_the_process_is_gone() {
    let dir = TempDir::new();
    let incarnation;
    {
        let cx = AsyncContext::new();
        let durable = open(&cx, &dir, config()).await;
        incarnation = durable.cell.incarnation();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let link = durable.cell.attach(Wire(tx));
        for (lane, text) in [(room("a"), "a0"), (room("b"), "b0"), (room("a"), "a1"), (Lane::ToDevice, "t0")] {
            durable.cell.enqueue(lane, Msg(text.into())).unwrap();
        }
        // Sent only once written: the first three heads.
        let mut sent = Vec::new();
        while sent.len() < 3 {
            let item = rx.recv().await.unwrap();
            sent.push((item.lane, item.ordinal, item.envelope.payload.0));
        }
        assert_eq!(
            sent,
            vec![
                (room("a"), Ordinal(0), "a0".to_owned()),
                (room("b"), Ordinal(1), "b0".to_owned()),
                (Lane::ToDevice, Ordinal(3), "t0".to_owned())
            ]
        );
        assert_eq!(durable.cell.unpersisted_len().get_untracked(), 0);
        // a0 delivered (its acknowledgement written next), the rest lost
        // with the process.
        let _ = link.complete(&room("a"), Sequence(0));
        let cell = durable.cell.clone();
        until("a1 sent", || cell.with_lanes(|l| l.lane(&room("a")).is_some_and(|c| c.inflight_len() == 1))).await;
        let db = rusqlite::Connection::open(dir.db()).unwrap();
        let a = egress_store::lane_stream("client", &room("a")).unwrap();
        until("a0's acknowledgement written", || {
            let acked: Option<i64> = db
                .query_row("SELECT acked_through FROM egress_stream WHERE stream = ?1", [&a], |r| r.get(0))
                .unwrap_or(None);
            acked == Some(0)
        })
        .await;
        durable.cell.enqueue(Lane::Other, Msg("o0".into())).unwrap();
        until("o0 written", || cell.unpersisted_len().get_untracked() == 0).await;
        // No shutdown: the relay is aborted, the store is not closed.
        drop(durable);
    }
    let cx = AsyncContext::new();
    let durable = open(&cx, &dir, config()).await;
    assert_eq!(durable.cell.incarnation(), incarnation, "the lanes' incarnation is kept");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _link = durable.cell.attach(Wire(tx));
    let mut again = Vec::new();
    while again.len() < 4 {
        let item = rx.recv().await.unwrap();
        again.push((item.ordinal, item.envelope.payload.0));
    }
    // a1 (2), b0 (1), t0 (3), o0 (4): every head again, in ordinal order;
    // a0 (0) was acknowledged.
    assert_eq!(
        again,
        vec![
            (Ordinal(1), "b0".into()),
            (Ordinal(2), "a1".into()),
            (Ordinal(3), "t0".into()),
            (Ordinal(4), "o0".into())
        ]
    );
    assert_eq!(durable.cell.generation().get_untracked(), Generation(0));
    let stats = durable.relay.shutdown().await;
    assert!(!stats.fenced);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_commit_is_shown_retried_and_nothing_unwritten_goes_out() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open(&cx, &dir, config()).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _link = durable.cell.attach(Wire(tx));
    let app = rusqlite::Connection::open(dir.db()).unwrap();
    app.execute_batch(
        "CREATE TRIGGER refuse BEFORE UPDATE ON egress_lanes BEGIN SELECT RAISE(ABORT, 'disk says no'); END;",
    )
    .unwrap();
    durable.cell.enqueue(room("a"), Msg("a0".into())).unwrap();
    let cell = durable.cell.clone();
    until("the error shown", || cell.persist_error().get_untracked().is_some()).await;
    let error = durable.cell.persist_error().get_untracked().unwrap();
    assert!(error.reason.contains("disk says no"), "{}", error.reason);
    let relay = &durable.relay;
    until("tried again", || relay.stats().failures >= 2).await;
    assert!(rx.try_recv().is_err(), "nothing unwritten is sent");
    assert_eq!(durable.cell.unpersisted_len().get_untracked(), 1);
    app.execute_batch("DROP TRIGGER refuse").unwrap();
    let item = rx.recv().await.unwrap();
    assert_eq!(item.envelope.payload, Msg("a0".into()));
    until("the error cleared", || cell.persist_error().get_untracked().is_none()).await;
    let stats = durable.relay.shutdown().await;
    assert!(stats.failures >= 2 && stats.commits >= 1, "{stats:?}");
    assert_eq!((stats.appended, stats.fenced), (1, false), "{stats:?}");
}

/// A relay holds its cell while it lives, and lets it go when dropped (its
/// task aborted, its effect disposed); it says what it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_relay_lets_its_cell_go() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open(&cx, &dir, config()).await;
    let shown = format!("{durable:?}");
    assert!(shown.starts_with("DurableLanes { cell: AsyncLanesCell(LanesCell {"), "{shown}");
    assert!(shown.contains("relay: LanesRelay { stats: RelayStats { commits: "), "{shown}");
    durable.cell.enqueue(room("a"), Msg("a0".into())).unwrap();
    let cell = durable.cell.clone();
    until("a0 written", || cell.unpersisted_len().get_untracked() == 0).await;
    let pending = durable.cell.pending_len().clone();
    let DurableLanes { cell: mine, relay } = durable;
    drop((cell, mine));
    assert!(!pending.is_disposed(), "the relay still holds the cell");
    drop(relay);
    until("the cell let go", || pending.is_disposed()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_on_the_same_lanes_fences_the_first() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let first = open(&cx, &dir, config()).await;
    first.cell.enqueue(room("a"), Msg("a0".into())).unwrap();
    let cell = first.cell.clone();
    until("a0 written", || cell.unpersisted_len().get_untracked() == 0).await;
    let second = open(&cx, &dir, config()).await;
    assert_eq!(second.cell.pending_len().get_untracked(), 1, "the second has a0");
    let relay = &first.relay;
    until("the first fenced", || relay.stats().fenced).await;
    first.cell.enqueue(room("a"), Msg("a1".into())).unwrap();
    assert_eq!(first.cell.unpersisted_len().get_untracked(), 1, "the fenced relay writes nothing more");
    drop(second);
}

/// What a program cannot restore refuses the open, with the reason, and
/// leaves the store as it was: a record its codec cannot read, more lanes
/// than its policy allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_that_cannot_restore_says_why_and_changes_nothing() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let policy = LanesPolicy::new(Policy::default(), 16).unwrap();
    let raw: DurableLanes<Lane> =
        egress_store::open_durable_lanes_raw(&cx, dir.db(), "client", policy, CellOptions::new(), config())
            .await
            .unwrap();
    raw.cell.enqueue(room("a"), bytes::Bytes::from_static(b"not JSON")).unwrap();
    raw.cell.enqueue(room("b"), bytes::Bytes::from_static(b"\"b0\"")).unwrap();
    let _ = raw.relay.shutdown().await;
    let policy = LanesPolicy::new(Policy::default(), 16).unwrap();
    let typed =
        open_durable_lanes::<Lane, Msg>(&cx, dir.db(), "client", Json, policy, CellOptions::new(), config()).await;
    match typed {
        Err(egress_store::StoreError::Undecodable { stream, sequence, .. }) => {
            assert_eq!(stream, egress_store::lane_stream("client", &room("a")).unwrap());
            assert_eq!(sequence, Sequence(0));
        }
        other => panic!("expected Undecodable, got {other:?}"),
    }
    let narrow = LanesPolicy::new(Policy::default(), 1).unwrap();
    let opened =
        egress_store::open_durable_lanes_raw::<Lane>(&cx, dir.db(), "client", narrow, CellOptions::new(), config())
            .await;
    match opened {
        Err(egress_store::StoreError::LanesRestore(egress_core::LanesRestoreError::TooManyLanes { stored, limit })) => {
            assert_eq!((stored, limit), (2, 1));
        }
        other => panic!("expected LanesRestore, got {other:?}"),
    }
    let policy = LanesPolicy::new(Policy::default(), 16).unwrap();
    let again =
        egress_store::open_durable_lanes_raw::<Lane>(&cx, dir.db(), "client", policy, CellOptions::new(), config())
            .await
            .unwrap();
    assert_eq!(again.cell.pending_len().get_untracked(), 2, "both records are still there");
}

async fn open_with(
    cx: &AsyncContext,
    dir: &TempDir,
    max_lanes: usize,
) -> Result<DurableLanes<Lane, Msg>, egress_store::StoreError> {
    let policy = LanesPolicy::new(Policy::default(), max_lanes).unwrap();
    open_durable_lanes(cx, dir.db(), "client", Json, policy, CellOptions::new(), config()).await
}

/// An open that cannot restore takes nothing over: the process that holds
/// the lanes goes on writing (found by a hostile review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_open_does_not_fence_the_process_that_holds_the_lanes() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let first = open_with(&cx, &dir, 16).await.unwrap();
    first.cell.enqueue(room("a"), Msg("a0".into())).unwrap();
    first.cell.enqueue(room("b"), Msg("b0".into())).unwrap();
    let cell = first.cell.clone();
    until("written", || cell.unpersisted_len().get_untracked() == 0).await;
    let refused = open_with(&cx, &dir, 1).await;
    assert!(matches!(refused, Err(egress_store::StoreError::LanesRestore(_))), "{refused:?}");
    first.cell.enqueue(room("a"), Msg("a1".into())).unwrap();
    until("a1 written by the first", || cell.unpersisted_len().get_untracked() == 0).await;
    assert!(!first.relay.stats().fenced);
    assert_eq!(first.cell.persist_error().get_untracked(), None);
}

/// A relay fenced while it had nothing to write says so on the cell at
/// its next record, which stays unwritten with the reason (found by a
/// hostile review: it stayed "saving" with no error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_fenced_while_idle_shows_why_on_the_cell() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let first = open_with(&cx, &dir, 16).await.unwrap();
    first.cell.enqueue(room("a"), Msg("a0".into())).unwrap();
    let cell = first.cell.clone();
    until("written", || cell.unpersisted_len().get_untracked() == 0).await;
    let _second = open_with(&cx, &dir, 16).await.unwrap();
    let relay = &first.relay;
    until("fenced", || relay.stats().fenced).await;
    first.cell.enqueue(room("a"), Msg("a1".into())).unwrap();
    until("the fence shown", || cell.persist_error().get_untracked().is_some()).await;
    let error = first.cell.persist_error().get_untracked().unwrap();
    assert!(
        error.reason.contains("taken over") && error.reason.contains("nothing more is written"),
        "{}",
        error.reason
    );
    assert_eq!(first.cell.unpersisted_len().get_untracked(), 1);
}

static PANIC_ONCE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A payload whose `Clone` panics (once, when told to).
#[derive(Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Flaky(String);

impl Clone for Flaky {
    fn clone(&self) -> Self {
        assert!(!PANIC_ONCE.swap(false, std::sync::atomic::Ordering::SeqCst), "the clone panicked, once");
        Flaky(self.0.clone())
    }
}

/// A payload's `Clone` that panics while the relay takes a write fails
/// that write, which goes through on the next try; the relay lives on
/// (found by a hostile review: its task died, and nothing was written
/// again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_clone_that_panics_once_fails_one_write_not_the_relay() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let policy = LanesPolicy::new(Policy::default(), 16).unwrap();
    let durable: DurableLanes<Lane, Flaky> =
        open_durable_lanes(&cx, dir.db(), "client", Json, policy, CellOptions::new(), config()).await.unwrap();
    let cell = durable.cell.clone();
    PANIC_ONCE.store(true, std::sync::atomic::Ordering::SeqCst);
    durable.cell.enqueue(room("b"), Flaky("b0".into())).unwrap();
    until("b0 written on the next try", || cell.with_lanes(|l| l.unpersisted_len()) == 0).await;
    assert!(durable.relay.stats().failures >= 1, "{:?}", durable.relay.stats());
    durable.cell.enqueue(room("c"), Flaky("c0".into())).unwrap();
    until("c0 written", || cell.with_lanes(|l| l.unpersisted_len()) == 0).await;
    assert_eq!(durable.cell.persist_error().get_untracked(), None);
}

/// JSON, except that it refuses to write the message "bad".
struct Picky;

impl egress_codec::Encode<Msg> for Picky {
    fn encode(&self, value: &Msg) -> Result<bytes::Bytes, egress_codec::CodecError> {
        if value.0 == "bad" {
            return Err("no".into());
        }
        egress_codec::Encode::encode(&Json, value)
    }
}

impl egress_codec::Codec<Msg> for Picky {
    fn decode(&self, bytes: &bytes::Bytes) -> Result<Msg, egress_codec::CodecError> {
        egress_codec::Codec::decode(&Json, bytes)
    }
}

/// A value the codec cannot write is refused by `try_enqueue`; through
/// `enqueue`, its record fails its write, every lane's part of it: shown,
/// tried again, and nothing of it written or sent (the table of
/// docs/lanes.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_the_codec_cannot_write_holds_every_lanes_writes_visibly() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let policy = LanesPolicy::new(Policy::default(), 16).unwrap();
    let durable: DurableLanes<Lane, Msg> =
        open_durable_lanes(&cx, dir.db(), "client", Picky, policy, CellOptions::new(), config()).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _link = durable.cell.attach(Wire(tx));
    // The relay's codec checks what try_enqueue takes: refused at once,
    // the payload back, nothing queued.
    match durable.cell.try_enqueue(room("a"), Msg("bad".into())) {
        Err(LanesRefused::Unencodable { payload, reason }) => {
            assert_eq!(payload, Msg("bad".into()));
            assert!(reason.contains("no"), "{reason}");
        }
        other => panic!("expected Unencodable, got {other:?}"),
    }
    assert_eq!(durable.cell.pending_len().get_untracked(), 0);
    // Plain enqueue does not check: the record stops every lane's writes.
    durable.cell.enqueue(room("a"), Msg("bad".into())).unwrap();
    durable.cell.enqueue(room("b"), Msg("fine".into())).unwrap();
    let cell = durable.cell.clone();
    until("the error shown", || cell.persist_error().get_untracked().is_some()).await;
    let relay = &durable.relay;
    until("tried again", || relay.stats().failures >= 2).await;
    assert_eq!(durable.cell.unpersisted_len().get_untracked(), 2, "room b's record waits with room a's");
    assert!(rx.try_recv().is_err(), "nothing unwritten is sent");
    let error = durable.cell.persist_error().get_untracked().unwrap();
    assert!(error.reason.contains("does not encode"), "{}", error.reason);
    let stream = egress_store::lane_stream("client", &room("a")).unwrap();
    assert!(error.reason.contains(&stream), "{} names the lane's stream {stream:?}", error.reason);
    let journal = egress_store::SqliteLanes::new(egress_store::SqliteStore::open(dir.db()).unwrap(), "client");
    assert_eq!(format!("{journal:?}"), r#"SqliteLanes { lanes: "client", .. }"#);
}

/// A shutdown writes what is pending and checkpoints SQLite's WAL (the
/// journal's close): with another connection open, so that closing the
/// relay's store does not checkpoint it anyway, the WAL is empty after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_writes_what_is_pending_and_checkpoints_the_wal() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open(&cx, &dir, config()).await;
    let app = rusqlite::Connection::open(dir.db()).unwrap();
    // Read once: the connection opens the database (SQLite opens lazily).
    let lanes: i64 = app.query_row("SELECT COUNT(*) FROM egress_lanes", [], |r| r.get(0)).unwrap();
    assert_eq!(lanes, 1);
    // Three records in one batch: one write, and each counted.
    cx.batch(|| {
        for text in ["a0", "a1", "a2"] {
            durable.cell.enqueue(room("a"), Msg(text.into())).unwrap();
        }
    });
    let stats = durable.relay.shutdown().await;
    assert_eq!(stats.appended, 3, "{stats:?}");
    let wal = std::fs::metadata(format!("{}-wal", dir.db().display())).map(|m| m.len()).unwrap_or(0);
    assert_eq!(wal, 0, "the WAL was checkpointed");
    let stored: i64 = app.query_row("SELECT COUNT(*) FROM egress_outbox", [], |r| r.get(0)).unwrap();
    assert_eq!(stored, 3);
}

/// Whoever sees a write on the cell sees the relay's count of it: the
/// lanes relay counts a commit before it tells the cell (an effect that
/// runs as the cell shows its records written reads the stats then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lanes_relays_stats_count_a_write_before_the_cell_shows_it() {
    use std::sync::{Arc, Mutex};
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open(&cx, &dir, config()).await;
    let cell = durable.cell.clone();
    let relay = Arc::new(durable.relay);
    let seen: Arc<Mutex<Vec<(usize, egress_store::RelayStats)>>> = Arc::default();
    let _effect = cx.effect({
        let (cell, relay, seen) = (cell.clone(), relay.clone(), seen.clone());
        move || {
            let unpersisted = cell.unpersisted_len().get();
            seen.lock().unwrap().push((unpersisted, relay.stats()));
        }
    });
    cell.enqueue(room("a"), Msg("a0".into())).unwrap();
    until("a0 written", || cell.unpersisted_len().get_untracked() == 0 && relay.stats().commits >= 1).await;
    let seen = seen.lock().unwrap().clone();
    let waiting = seen.iter().position(|s| s.0 == 1).expect("the effect saw a0 wait");
    let written = seen[waiting..].iter().find(|s| s.0 == 0).expect("the effect saw a0 written");
    assert!(written.1.commits >= 1 && written.1.appended >= 1, "{seen:?}");
}

/// An effect that panics as the cell shows its records written (the
/// relay's answer runs it, in the commit's task) does not make the commit
/// a failure too: it was counted, and the cell answered, before the panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_that_panics_at_a_write_is_not_counted_as_a_failed_commit() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open(&cx, &dir, config()).await;
    let cell = durable.cell.clone();
    let (armed, fired) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let _effect = cx.effect({
        let (cell, armed, fired) = (cell.clone(), armed.clone(), fired.clone());
        move || {
            let written = cell.unpersisted_len().get() == 0;
            if written && armed.load(Ordering::Relaxed) && !fired.swap(true, Ordering::Relaxed) {
                panic!("the application's effect fails once");
            }
        }
    });
    armed.store(true, Ordering::Relaxed);
    cell.enqueue(room("a"), Msg("a0".into())).unwrap();
    until("a0 written", || cell.unpersisted_len().get_untracked() == 0 && fired.load(Ordering::Relaxed)).await;
    cell.enqueue(room("a"), Msg("a1".into())).unwrap();
    until("a1 written", || cell.unpersisted_len().get_untracked() == 0 && durable.relay.stats().commits >= 2).await;
    let stats = durable.relay.stats();
    assert_eq!((stats.commits, stats.failures), (2, 0), "{stats:?}");
    assert!(cell.persist_error().get_untracked().is_none());
}

/// SQLite's lanes journal, except that its first write panics.
struct PanicsOnce(egress_store::SqliteLanes, std::sync::atomic::AtomicBool);

impl egress_store::LanesJournal<Lane> for PanicsOnce {
    fn lanes(&self) -> &str {
        egress_store::LanesJournal::<Lane>::lanes(&self.0)
    }
    fn apply(
        &self,
        ready: egress_core::LanesReady<Lane>,
        appends: Vec<Vec<(Sequence, bytes::Bytes)>>,
    ) -> impl Future<Output = Result<(), egress_store::StoreError>> + Send {
        let panics = self.1.swap(false, std::sync::atomic::Ordering::Relaxed);
        let write = self.0.apply(ready, appends);
        async move {
            assert!(!panics, "the store panics once");
            write.await
        }
    }
    fn owns(&self) -> impl Future<Output = Result<(), egress_store::StoreError>> + Send {
        egress_store::LanesJournal::<Lane>::owns(&self.0)
    }
    fn close(&self) -> impl Future<Output = ()> + Send {
        egress_store::LanesJournal::<Lane>::close(&self.0)
    }
}

/// A write that panics under the store (before the cell is told) is a
/// failure: counted, shown by the cell, and tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_panics_under_the_store_is_a_failure_shown_and_tried_again() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let mut store = egress_store::SqliteStore::open(dir.db()).unwrap();
    let policy = LanesPolicy::new(Policy::default(), 16).unwrap();
    let restored = store
        .load_lanes_then::<Lane, _>("client", |loaded| {
            let loaded = loaded.decode("client", &Json)?;
            Ok(egress_core::Lanes::restore(policy, loaded.restored)?)
        })
        .unwrap();
    let cell = egress_reactive::AsyncLanesCell::from_lanes(&cx, restored, CellOptions::new());
    let journal = PanicsOnce(egress_store::SqliteLanes::new(store, "client"), std::sync::atomic::AtomicBool::new(true));
    let relay = egress_store::LanesRelay::spawn_with(&cx, &cell, journal, Json, config());
    let seen: std::sync::Arc<std::sync::Mutex<Vec<bool>>> = std::sync::Arc::default();
    let _effect = cx.effect({
        let (cell, seen) = (cell.clone(), seen.clone());
        move || seen.lock().unwrap().push(cell.persist_error().get().is_some())
    });
    cell.enqueue(room("a"), Msg("a0".into())).unwrap();
    until("written on the second try", || cell.unpersisted_len().get_untracked() == 0).await;
    let stats = relay.stats();
    assert_eq!((stats.commits, stats.failures), (1, 1), "{stats:?}");
    assert!(seen.lock().unwrap().contains(&true), "the cell showed the failure");
    assert!(cell.persist_error().get_untracked().is_none());
}
