//! Typed durable cells: a cell of the application's own messages over the
//! SQLite store, its records written and read back by a codec (here JSON),
//! the outbox's typed appends adopted as typed messages, and what happens
//! to bytes the codec cannot read or a value it cannot write.

use bytes::Bytes;
use egress_codec::{Codec, CodecError, Encode, Json};
use egress_core::{Policy, Sequence};
use egress_reactive::{AsyncContext, AsyncEgressCell, CellOptions};
use egress_store::{Outbox, StoreError, open_durable, open_durable_with};

mod common;
use common::{Channel, TempDir, config};

/// A chat line: the application's message type.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Line {
    room: String,
    text: String,
}

fn line(text: &str) -> Line {
    Line { room: "tea".into(), text: text.into() }
}

/// The stream "chat" of `dir`'s database, its records written by `codec`.
async fn open_chat<T: Clone + Send + Sync + 'static>(
    cx: &AsyncContext,
    dir: &TempDir,
    codec: impl Codec<T>,
) -> egress_store::Durable<T> {
    open_durable_with(cx, dir.db(), "chat", codec, Policy::default(), CellOptions::new(), config())
        .await
        .expect("opens")
}

/// Waits (on the relay's own tasks) until `f` holds.
async fn until<T: Clone + Send + Sync + 'static>(cell: &AsyncEgressCell<T>, f: impl Fn(&AsyncEgressCell<T>) -> bool) {
    egress_testkit::until(|| f(cell).then_some(()), || "the cell's condition".to_owned()).await;
}

/// Waits (on the relay's own tasks) until the relay's stats say `f`.
async fn until_stats(relay: &egress_store::Relay, f: impl Fn(egress_store::RelayStats) -> bool) {
    egress_testkit::until(|| f(relay.stats()).then_some(()), || format!("{:?}", relay.stats())).await;
}

fn pending<T: Clone + Send + Sync + 'static>(cell: &AsyncEgressCell<T>) -> Vec<(u64, T)> {
    cell.pending().get_untracked().iter().map(|e| (e.sequence.get(), e.payload.clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_cell_and_typed_outbox_appends_come_back_typed_after_a_restart() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open_chat(&cx, &dir, Json).await;
    let cell: AsyncEgressCell<Line> = durable.cell.clone();
    assert_eq!(cell.enqueue(line("hello")), Sequence(0));
    until(&cell, |c| c.durable_through().get_untracked() == Some(Sequence(0))).await;
    // The application appends in its own transaction, typed, with the same
    // codec: the relay adopts it as a `Line`.
    let mut app = rusqlite::Connection::open(dir.db()).expect("the app's connection");
    let outbox = Outbox::new("chat");
    let t = app.transaction().expect("a transaction");
    let appended = outbox.append_encoded(&t, &Json, &line("from the app")).expect("appends");
    t.commit().expect("commits");
    assert_eq!(appended, Sequence(1));
    until(&cell, |c| c.next_sequence() == Sequence(2)).await;
    assert_eq!(cell.enqueue(line("after")), Sequence(2));
    until(&cell, |c| c.pending_len().get_untracked() == 3 && c.unpersisted_len().get_untracked() == 0).await;
    let expected = vec![(0, line("hello")), (1, line("from the app")), (2, line("after"))];
    assert_eq!(pending(&cell), expected);
    // What is stored is the codec's bytes.
    let stored: Vec<u8> = app
        .query_row("SELECT payload FROM egress_outbox WHERE stream = 'chat' AND seq = 0", [], |r| r.get(0))
        .expect("the record");
    assert_eq!(stored, serde_json::to_vec(&line("hello")).expect("json"));
    durable.relay.shutdown().await;
    drop(cell);
    drop(durable.cell);
    // A restart gives the same typed messages back, in order.
    let again = open_durable_with::<Line>(&cx, dir.db(), "chat", Json, Policy::default(), CellOptions::new(), config())
        .await
        .expect("reopens");
    assert_eq!(pending(&again.cell), expected);
    // And a transport of the typed cell gets typed envelopes.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let _link = again.cell.attach(Channel(tx));
    assert_eq!(rx.recv().await, Some((0, line("hello"))));
    again.relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_record_the_codec_cannot_read_refuses_the_open_and_stays_for_a_raw_open() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    {
        let store = egress_store::SqliteStore::open(dir.db()).expect("opens");
        let outbox = Outbox::new("chat");
        outbox.append_encoded(store.connection(), &Json, &line("fine")).expect("appends");
        outbox.append(store.connection(), b"{not json").expect("appends");
    }
    let refused =
        open_durable_with::<Line>(&cx, dir.db(), "chat", Json, Policy::default(), CellOptions::new(), config())
            .await
            .expect_err("refused");
    match refused {
        StoreError::Undecodable { stream, sequence, .. } => {
            assert_eq!((stream.as_str(), sequence), ("chat", Sequence(1)))
        }
        other => panic!("expected Undecodable, got {other:?}"),
    }
    // Nothing was lost: opened as bytes, both records are there.
    let raw =
        open_durable(&cx, dir.db(), "chat", Policy::default(), CellOptions::new(), config()).await.expect("opens");
    let fine = Bytes::from(serde_json::to_vec(&line("fine")).expect("json"));
    assert_eq!(pending(&raw.cell), vec![(0, fine), (1, Bytes::from_static(b"{not json"))]);
    raw.relay.shutdown().await;
}

/// An open that cannot decode what is stored takes nothing over: the
/// process holding the stream goes on writing (before, the failed open had
/// fenced it already).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_open_does_not_fence_the_process_that_holds_the_stream() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let running =
        open_durable(&cx, dir.db(), "chat", Policy::default(), CellOptions::new(), config()).await.expect("opens");
    let _ = running.cell.enqueue(Bytes::from_static(b"{not json"));
    until(&running.cell, |c| c.unpersisted_len().get_untracked() == 0).await;
    let refused =
        open_durable_with::<Line>(&cx, dir.db(), "chat", Json, Policy::default(), CellOptions::new(), config())
            .await
            .expect_err("refused");
    assert!(matches!(refused, StoreError::Undecodable { .. }), "{refused:?}");
    let _ = running.cell.enqueue(Bytes::from_static(b"more"));
    until(&running.cell, |c| c.unpersisted_len().get_untracked() == 0).await;
    assert_eq!(running.cell.persist_error().get_untracked(), None);
    let stats = running.relay.shutdown().await;
    assert!(!stats.fenced, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_stops_at_a_record_the_codec_cannot_read_and_the_records_after_it_wait() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open_chat(&cx, &dir, Json).await;
    let cell: AsyncEgressCell<Line> = durable.cell.clone();
    let mut app = rusqlite::Connection::open(dir.db()).expect("the app's connection");
    let outbox = Outbox::new("chat");
    // One transaction: the relay sees the three together.
    let t = app.transaction().expect("a transaction");
    outbox.append_encoded(&t, &Json, &line("one")).expect("appends");
    outbox.append(&t, b"\xff not a line").expect("appends");
    outbox.append_encoded(&t, &Json, &line("three")).expect("appends");
    t.commit().expect("commits");
    until_stats(&durable.relay, |s| s.undecodable >= 1).await;
    assert_eq!(pending(&cell), vec![(0, line("one"))], "adopted up to the unreadable record");
    // Another append wakes the relay (as does each poll): it stops at the
    // same record again, and still nothing past it is taken.
    let seen = durable.relay.stats().undecodable;
    outbox.append_encoded(&app, &Json, &line("four")).expect("appends");
    until_stats(&durable.relay, |s| s.undecodable > seen).await;
    assert_eq!(pending(&cell), vec![(0, line("one"))]);
    assert_eq!(cell.next_sequence(), Sequence(1));
    durable.relay.shutdown().await;
}

/// JSON, except that it refuses to encode a line whose text is "refused".
struct Picky;

impl Encode<Line> for Picky {
    fn encode(&self, value: &Line) -> Result<Bytes, CodecError> {
        if value.text == "refused" {
            return Err("this line has no encoding".into());
        }
        Json.encode(value)
    }
}

impl Codec<Line> for Picky {
    fn decode(&self, bytes: &Bytes) -> Result<Line, CodecError> {
        Json.decode(bytes)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_the_codec_cannot_write_stops_the_journal_there_visibly_and_nothing_goes_out() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open_chat(&cx, &dir, Picky).await;
    let cell: AsyncEgressCell<Line> = durable.cell.clone();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let _link = cell.attach(Channel(tx));
    cell.enqueue(line("first"));
    assert_eq!(rx.recv().await, Some((0, line("first"))));
    // The relay's codec checks what try_enqueue takes: refused at once.
    match cell.try_enqueue(line("refused")) {
        Err(egress_reactive::Refused::Unencodable { payload, reason }) => {
            assert_eq!((payload, reason.as_str()), (line("refused"), "this line has no encoding"));
        }
        other => panic!("expected Unencodable, got {other:?}"),
    }
    assert_eq!(cell.next_sequence(), Sequence(1), "nothing queued");
    // Plain enqueue does not check: the record stops the journal there.
    cell.enqueue(line("refused"));
    cell.enqueue(line("third"));
    until(&cell, |c| c.persist_error().get_untracked().is_some()).await;
    let error = cell.persist_error().get_untracked().expect("an error");
    assert!(error.reason.contains("record #1 does not encode"), "{}", error.reason);
    assert_eq!(cell.durable_through().get_untracked(), Some(Sequence(0)));
    assert_eq!(cell.unpersisted_len().get_untracked(), 2);
    // The relay tries again (after its backoff) and fails again: nothing of
    // that commit is written, and nothing after the durable record goes out.
    let failures = durable.relay.stats().failures;
    until_stats(&durable.relay, |s| s.failures > failures).await;
    assert!(durable.relay.stats().failures > failures);
    assert!(rx.try_recv().is_err());
    let app = rusqlite::Connection::open(dir.db()).expect("the app's connection");
    let stored: i64 =
        app.query_row("SELECT count(*) FROM egress_outbox WHERE stream = 'chat'", [], |r| r.get(0)).expect("counts");
    assert_eq!(stored, 1, "only the record before the refused one");
    drop(durable.relay);
}

#[test]
fn a_typed_outbox_append_the_codec_refuses_appends_nothing() {
    let dir = TempDir::new();
    let store = egress_store::SqliteStore::open(dir.db()).expect("opens");
    let outbox = Outbox::new("chat");
    match outbox.append_encoded(store.connection(), &Picky, &line("refused")) {
        Err(StoreError::Unencodable { stream, sequence: None, .. }) => assert_eq!(stream, "chat"),
        other => panic!("expected Unencodable, got {other:?}"),
    }
    // The next append takes the first sequence: none was used up.
    assert_eq!(outbox.append_encoded(store.connection(), &Picky, &line("fine")).expect("appends"), Sequence(0));
}

/// JSON, except that it panics encoding a line whose text is "boom" and
/// decoding the bytes `boom`.
struct Panicky;

impl Encode<Line> for Panicky {
    fn encode(&self, value: &Line) -> Result<Bytes, CodecError> {
        assert!(value.text != "boom", "the codec cannot take this");
        Json.encode(value)
    }
}

impl Codec<Line> for Panicky {
    fn decode(&self, bytes: &Bytes) -> Result<Line, CodecError> {
        assert!(&bytes[..] != b"boom", "the codec cannot read this");
        Json.decode(bytes)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codec_that_panics_encoding_is_a_refusal_shown_and_retried_not_a_silent_wedge() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open_chat(&cx, &dir, Panicky).await;
    let cell: AsyncEgressCell<Line> = durable.cell.clone();
    cell.enqueue(line("fine"));
    until(&cell, |c| c.durable_through().get_untracked() == Some(Sequence(0))).await;
    // Through try_enqueue, the codec's panic is a refusal on the caller's
    // side: caught, said, the value back, nothing queued, the cell usable.
    match cell.try_enqueue(line("boom")) {
        Err(egress_reactive::Refused::Unencodable { payload, reason }) => {
            assert_eq!(payload, line("boom"));
            assert!(reason.contains("panicked") && reason.contains("cannot take this"), "{reason}");
        }
        other => panic!("expected Unencodable, got {other:?}"),
    }
    assert_eq!(cell.next_sequence(), Sequence(1), "nothing queued");
    cell.enqueue(line("boom"));
    until(&cell, |c| c.persist_error().get_untracked().is_some()).await;
    let error = cell.persist_error().get_untracked().expect("an error");
    assert!(error.reason.contains("the codec panicked: the codec cannot take this"), "{}", error.reason);
    // Tried again, and again refused: the relay lives on.
    let failures = durable.relay.stats().failures;
    until_stats(&durable.relay, |s| s.failures > failures).await;
    assert!(durable.relay.stats().failures > failures, "retried");
    assert_eq!(cell.unpersisted_len().get_untracked(), 1);
    drop(durable.relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codec_that_panics_decoding_stops_adoption_there_and_the_cell_says_why_at_its_next_write() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open_chat(&cx, &dir, Panicky).await;
    let cell: AsyncEgressCell<Line> = durable.cell.clone();
    let app = rusqlite::Connection::open(dir.db()).expect("the app's connection");
    Outbox::new("chat").append(&app, b"boom").expect("appends");
    until_stats(&durable.relay, |s| s.undecodable >= 1).await;
    // Adoption stopped at it, and the relay lives (a later poll may meet
    // the record again: each meeting is counted).
    assert_eq!(cell.next_sequence(), Sequence(0));
    // The cell's own record meets it under sequence 0: the cell shows the
    // record that cannot be read, not "another writer".
    cell.enqueue(line("mine"));
    until(&cell, |c| c.persist_error().get_untracked().is_some()).await;
    let error = cell.persist_error().get_untracked().expect("an error");
    assert!(error.reason.contains("record #0 does not decode: the codec panicked"), "{}", error.reason);
    assert!(durable.relay.stats().undecodable >= 2);
    drop(durable.relay);
}

#[test]
fn a_synchronous_typed_cell_moves_behind_an_outbox_append_and_says_when_it_cannot_read_one() {
    use egress_core::EgressCore;
    use egress_reactive::{Context, EgressCell};
    let dir = TempDir::new();
    let cx = Context::new();
    let mut store = egress_store::SqliteStore::open(dir.db()).expect("opens");
    let loaded = store.load("ui").expect("loads").decode("ui", &Json).expect("decodes");
    let core = EgressCore::restore(Policy::default(), loaded.restored).expect("restores");
    let cell: EgressCell<Line> = EgressCell::from_core(&cx.handle(), core, CellOptions::new());
    // Unwritten, the cell's record meets the application's, typed, at 0.
    cell.enqueue(line("mine"));
    let app = rusqlite::Connection::open(dir.db()).expect("the app's connection");
    Outbox::new("ui").append_encoded(&app, &Json, &line("theirs")).expect("appends");
    assert_eq!(store.write_journal_with(&cell, "ui", &Json).expect("rebased, then written"), 1);
    let pending: Vec<(u64, Line)> =
        cell.pending().get().iter().map(|e| (e.sequence.get(), e.payload.clone())).collect();
    assert_eq!(pending, vec![(0, line("theirs")), (1, line("mine"))]);
    // Again, with a record the codec cannot read in the way.
    cell.enqueue(line("later"));
    Outbox::new("ui").append(&app, b"{not a line").expect("appends");
    match store.write_journal_with(&cell, "ui", &Json) {
        Err(StoreError::Undecodable { sequence, .. }) => assert_eq!(sequence, Sequence(2)),
        other => panic!("expected Undecodable, got {other:?}"),
    }
    let error = cell.persist_error().get().expect("shown");
    assert!(error.reason.contains("record #2 does not decode"), "{}", error.reason);
}

/// A relay fenced while it had nothing to write says so on the cell at its
/// next record, which stays unwritten with the reason (as the lanes relay
/// does; found there by a hostile review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_fenced_while_idle_shows_why_on_the_cell() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open_chat(&cx, &dir, Json).await;
    let cell: AsyncEgressCell<Line> = durable.cell.clone();
    cell.enqueue(line("first"));
    until(&cell, |c| c.durable_through().get_untracked() == Some(Sequence(0))).await;
    let mut other = egress_store::SqliteStore::open(dir.db()).expect("opens");
    let _ = other.load("chat").expect("takes the stream over");
    until_stats(&durable.relay, |s| s.fenced).await;
    cell.enqueue(line("second"));
    until(&cell, |c| c.persist_error().get_untracked().is_some()).await;
    let error = cell.persist_error().get_untracked().expect("shown");
    assert!(
        error.reason.contains("taken over") && error.reason.contains("nothing more is written"),
        "{}",
        error.reason
    );
    assert_eq!(cell.unpersisted_len().get_untracked(), 1);
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
/// that write, which goes through on the next try: the relay lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_clone_that_panics_once_fails_one_write_not_the_relay() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open_chat(&cx, &dir, Json).await;
    let cell: AsyncEgressCell<Flaky> = durable.cell.clone();
    PANIC_ONCE.store(true, std::sync::atomic::Ordering::SeqCst);
    cell.enqueue(Flaky("a".into()));
    until(&cell, |c| c.with_core(|core| core.durable_through()) == Some(Sequence(0))).await;
    assert!(durable.relay.stats().failures >= 1, "{:?}", durable.relay.stats());
    cell.enqueue(Flaky("b".into()));
    until(&cell, |c| c.with_core(|core| core.durable_through()) == Some(Sequence(1))).await;
}

/// Whoever sees the cell's state sees the relay's count of what made it:
/// the relay counts a commit, and a failure, before it tells the cell. An
/// effect that runs as the cell shows a write or an error (on the relay's
/// thread, in the same write) reads the stats there and then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relays_stats_count_what_the_cell_shows_before_it_shows_it() {
    use std::sync::{Arc, Mutex};
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open_chat(&cx, &dir, Panicky).await;
    let cell: AsyncEgressCell<Line> = durable.cell.clone();
    let relay = Arc::new(durable.relay);
    // (durable through, whether an error shows, the stats as it showed)
    type Seen = (Option<Sequence>, bool, egress_store::RelayStats);
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let _effect = cx.effect({
        let (cell, relay, seen) = (cell.clone(), relay.clone(), seen.clone());
        move || {
            let shown = (cell.durable_through().get(), cell.persist_error().get().is_some());
            seen.lock().expect("not poisoned").push((shown.0, shown.1, relay.stats()));
        }
    });
    cell.enqueue(line("first"));
    until(&cell, |c| c.durable_through().get_untracked() == Some(Sequence(0))).await;
    let app = rusqlite::Connection::open(dir.db()).expect("the app's connection");
    Outbox::new("chat").append(&app, b"boom").expect("appends");
    cell.enqueue(line("second"));
    until(&cell, |c| c.persist_error().get_untracked().is_some()).await;
    let seen = seen.lock().expect("not poisoned").clone();
    let written = seen.iter().find(|s| s.0.is_some()).expect("the effect saw the write");
    assert!(written.2.commits >= 1 && written.2.appended >= 1, "{seen:?}");
    let failed = seen.iter().find(|s| s.1).expect("the effect saw the error");
    assert!(failed.2.failures >= 1 && failed.2.undecodable >= 1, "{seen:?}");
}

/// A rebase is counted before the cell is told too: the cell's record
/// enqueued while an application's transaction holds the database, which
/// then appends under the same sequence, is refused, moved behind the
/// application's, and the effect that runs as the cell shows why reads the
/// count there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebase_is_counted_before_the_cell_shows_it() {
    use std::sync::{Arc, Mutex};
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open_chat(&cx, &dir, Json).await;
    let cell: AsyncEgressCell<Line> = durable.cell.clone();
    let relay = Arc::new(durable.relay);
    // (the reason the cell shows, the stats as it showed)
    type Seen = (Option<String>, egress_store::RelayStats);
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let _effect = cx.effect({
        let (cell, relay, seen) = (cell.clone(), relay.clone(), seen.clone());
        move || {
            let error = cell.persist_error().get().map(|e| e.reason);
            seen.lock().expect("not poisoned").push((error, relay.stats()));
        }
    });
    let mut app = rusqlite::Connection::open(dir.db()).expect("the app's connection");
    let tx = app.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).expect("holds the database");
    // Enqueued while the application holds the database: the relay's
    // commit waits (or fails and is retried), and meets the application's.
    cell.enqueue(line("mine"));
    Outbox::new("chat").append_encoded(&tx, &Json, &line("theirs")).expect("appends");
    tx.commit().expect("commits");
    until(&cell, |c| c.durable_through().get_untracked() == Some(Sequence(1))).await;
    assert_eq!(pending(&cell), vec![(0, line("theirs")), (1, line("mine"))]);
    let seen = seen.lock().expect("not poisoned").clone();
    let moved = seen
        .iter()
        .find(|s| s.0.as_deref().is_some_and(|r| r.contains("another writer")))
        .expect("the effect saw the cell moved behind the application's record");
    assert!(moved.1.rebases >= 1, "{seen:?}");
}

/// An effect that panics as the cell shows a write (the relay's answer
/// runs it, in the commit's task) does not make the commit a failure too:
/// the commit was counted and the cell answered before the panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_that_panics_at_a_write_is_not_counted_as_a_failed_commit() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let durable = open_chat(&cx, &dir, Json).await;
    let cell: AsyncEgressCell<Line> = durable.cell.clone();
    let fired = Arc::new(AtomicBool::new(false));
    let _effect = cx.effect({
        let (cell, fired) = (cell.clone(), fired.clone());
        move || {
            if cell.durable_through().get().is_some() && !fired.swap(true, Ordering::Relaxed) {
                panic!("the application's effect fails once");
            }
        }
    });
    cell.enqueue(line("first"));
    until(&cell, |c| c.durable_through().get_untracked() == Some(Sequence(0))).await;
    cell.enqueue(line("second"));
    until(&cell, |c| c.durable_through().get_untracked() == Some(Sequence(1))).await;
    assert!(fired.load(Ordering::Relaxed));
    let stats = durable.relay.stats();
    assert_eq!((stats.commits, stats.appended, stats.failures), (2, 2, 0), "{stats:?}");
    assert!(cell.persist_error().get_untracked().is_none());
}
