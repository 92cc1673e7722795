//! Durable lanes on PostgreSQL against a real server: `egress_core::Lanes`
//! written through `PgStore::apply_lanes` under the lanes' lease and
//! rebuilt from `take_lanes` after the worker is gone; the lease fencing
//! every lane; a refused write writing nothing; lanes kept apart from plain
//! streams; and `postgres::open_durable_lanes` with its relay.
//!
//! The server comes from `EGRESS_PG_URL` (see tests/postgres.rs).
#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use egress_core::{Generation, Lanes, LanesClaim, Ordinal, Policy, Sequence};
use egress_store::postgres::{Lease, PgOutbox, PgStore, open_durable_lanes};
use egress_store::{RelayConfig, StoreError, lane_stream};

mod common;
use common::lanes::{Lane, drain, policy, room, text};

const NAME: &str = "client";
const LONG: Duration = Duration::from_secs(600);

/// A store on a database of its own, or `None` without a server.
async fn database() -> Option<String> {
    egress_testkit::pg_database("egress_lanes").await
}

/// Takes the lanes for `lease` (waiting, bounded, until no other worker's
/// lease holds them) and restores them.
async fn take(store: &PgStore, lease: Duration, max_lanes: usize) -> (Lease, Lanes<Lane, Bytes>) {
    let deadline = tokio::time::Instant::now() + egress_testkit::limit();
    loop {
        if let Some((lease, loaded)) = store.take_lanes::<Lane>(NAME, lease).await.unwrap() {
            return (lease, Lanes::restore(policy(max_lanes), loaded.restored).unwrap());
        }
        assert!(tokio::time::Instant::now() < deadline, "the lanes never came free");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes everything the lanes have to write, one `LanesReady` at a time.
async fn write(store: &PgStore, lease: &Lease, lanes: &mut Lanes<Lane, Bytes>) -> Result<(), StoreError> {
    for _ in 0..16 {
        let Some(ready) = lanes.poll_ready() else { return Ok(()) };
        let appends = common::lanes::appends(lanes, &ready);
        match store.apply_lanes(lease, &ready, &appends).await {
            Ok(()) => {
                let _ = lanes.persisted(ready.epoch);
            }
            Err(e) => {
                let _ = lanes.persist_failed(ready.epoch, e.to_string());
                return Err(e);
            }
        }
    }
    panic!("the journal still has something to write after 16 epochs");
}

async fn count(store: &PgStore, sql: &str, stream: &str) -> i64 {
    store.client().query_one(sql, &[&stream]).await.unwrap().get(0)
}

/// The test on PostgreSQL: interleaved lanes, a part acknowledged,
/// a part in flight, a reconnect; the worker dies (its lease runs out);
/// another worker's take holds every unacknowledged record, nothing in
/// flight, and releases them in the original global order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_across_lanes_survives_a_worker_gone() {
    let Some(url) = database().await else { return };
    let plan = [
        (room("a"), "a0"),
        (room("b"), "b0"),
        (Lane::ToDevice, "t0"),
        (room("a"), "a1"),
        (Lane::AccountData, "d0"),
        (Lane::Other, "o0"),
        (room("b"), "b1"),
        (Lane::AccountData, "d1"),
        (Lane::ToDevice, "t1"),
        (room("a"), "a2"),
    ];
    let (held_again, a2);
    {
        let store = PgStore::connect(&url, "w1").await.unwrap();
        let (lease, mut lanes) = take(&store, Duration::from_millis(300), 16).await;
        for (lane, payload) in plan.iter().take(7) {
            lanes.enqueue(lane.clone(), text(payload)).outcome.unwrap();
        }
        write(&store, &lease, &mut lanes).await.unwrap();
        let g = lanes.generation();
        while let LanesClaim::Claimed(_) = lanes.claim(g).outcome {}
        let _ = lanes.complete(g, &room("a"), Sequence(0));
        let _ = lanes.complete(g, &Lane::ToDevice, Sequence(0));
        for (lane, payload) in plan.iter().skip(7) {
            lanes.enqueue(lane.clone(), text(payload)).outcome.unwrap();
        }
        let _ = lanes.reconnect(Generation(g.0 + 1));
        write(&store, &lease, &mut lanes).await.unwrap();
        a2 = lanes.ordinal(&room("a"), Sequence(2));
        held_again = store.take_lanes::<Lane>(NAME, LONG).await.unwrap().map(|_| ());
        // The worker dies: no release; its lease (300 ms) runs out.
        drop(store);
    }
    assert_eq!(held_again, None, "held lanes are not taken twice");
    let store = PgStore::connect(&url, "w2").await.unwrap();
    let (lease, mut lanes) = take(&store, LONG, 16).await;
    assert_eq!(lanes.generation(), Generation(1));
    assert_eq!((lanes.inflight_len(), lanes.pending_len()), (0, 8));
    assert_eq!(lanes.next_ordinal(), Ordinal(10));
    assert_eq!(lanes.ordinal(&room("a"), Sequence(2)), a2);
    assert!(lanes.lane(&room("a")).unwrap().acked_through().is_some(), "a0's acknowledgement was stored");
    let _ = lanes.reconnect(Generation(2));
    assert!(drain(&mut lanes).is_empty(), "nothing goes out before its generation is stored");
    write(&store, &lease, &mut lanes).await.unwrap();
    assert_eq!(drain(&mut lanes), ["b0", "a1", "d0", "o0", "t1", "b1", "d1", "a2"]);
    // The acknowledgements written, the lanes' records are pruned.
    write(&store, &lease, &mut lanes).await.unwrap();
    let left = count(&store, "SELECT COUNT(*) FROM egress_outbox WHERE stream LIKE $1 || '%'", NAME).await;
    assert_eq!(left, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freed_lane_leaves_the_store_and_its_key_starts_again_with_fresh_ordinals() {
    let Some(url) = database().await else { return };
    let store = PgStore::connect(&url, "w1").await.unwrap();
    let (lease, mut lanes) = take(&store, LONG, 1).await;
    lanes.enqueue(room("a"), text("a0")).outcome.unwrap();
    write(&store, &lease, &mut lanes).await.unwrap();
    assert_eq!(drain(&mut lanes), ["a0"]);
    write(&store, &lease, &mut lanes).await.unwrap();
    lanes.enqueue(room("b"), text("b0")).outcome.unwrap();
    write(&store, &lease, &mut lanes).await.unwrap();
    let a = lane_stream(NAME, &room("a")).unwrap();
    assert_eq!(count(&store, "SELECT COUNT(*) FROM egress_stream WHERE stream = $1", &a).await, 0);
    assert_eq!(drain(&mut lanes), ["b0"]);
    write(&store, &lease, &mut lanes).await.unwrap();
    let again = lanes.enqueue(room("a"), text("a-again")).outcome.unwrap();
    assert_eq!((again.sequence, again.ordinal), (Sequence(0), Ordinal(2)));
    write(&store, &lease, &mut lanes).await.unwrap();
    store.release(&lease).await.unwrap();
    let (_lease, mut lanes) = take(&store, LONG, 1).await;
    assert_eq!(lanes.next_ordinal(), Ordinal(3));
    assert_eq!(lanes.ordinal(&room("a"), Sequence(0)), Some(Ordinal(2)));
    assert_eq!(drain(&mut lanes), ["a-again"]);
}

/// Another worker's take (the first one's lease run out) fences every
/// lane of the first at once; nothing of its write lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_by_another_worker_fences_every_lane() {
    let Some(url) = database().await else { return };
    let first = PgStore::connect(&url, "w1").await.unwrap();
    let (lease, mut lanes) = take(&first, Duration::from_millis(100), 8).await;
    lanes.enqueue(room("a"), text("a0")).outcome.unwrap();
    write(&first, &lease, &mut lanes).await.unwrap();
    let second = PgStore::connect(&url, "w2").await.unwrap();
    let (_taken, restored) = take(&second, LONG, 8).await;
    assert_eq!(restored.pending_len(), 1);
    lanes.enqueue(room("b"), text("b0")).outcome.unwrap();
    match write(&first, &lease, &mut lanes).await {
        Err(StoreError::Fenced { stream }) => assert_eq!(stream, NAME),
        other => panic!("expected Fenced, got {other:?}"),
    }
    let b = lane_stream(NAME, &room("b")).unwrap();
    assert_eq!(count(&first, "SELECT COUNT(*) FROM egress_stream WHERE stream = $1", &b).await, 0);
    assert!(matches!(first.renew(&lease, LONG).await, Err(StoreError::Fenced { .. })));
}

/// A lane's counter moved under the lanes refuses the whole write (no
/// other lane's part lands); an outbox append to a lane's stream is
/// refused; plain takes never take lanes, and lanes never take a plain
/// stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_and_plain_streams_stay_apart_and_a_moved_counter_refuses_the_write_whole() {
    let Some(url) = database().await else { return };
    let store = PgStore::connect(&url, "w1").await.unwrap();
    let (lease, mut lanes) = take(&store, LONG, 8).await;
    lanes.enqueue(room("a"), text("a0")).outcome.unwrap();
    write(&store, &lease, &mut lanes).await.unwrap();
    let a = lane_stream(NAME, &room("a")).unwrap();
    // Plain takes see no lanes, and refuse them by name.
    let other = PgStore::connect(&url, "w2").await.unwrap();
    assert!(other.take(LONG).await.unwrap().is_none(), "a plain take takes neither the lanes nor a lane");
    for name in [NAME, a.as_str()] {
        match other.take_stream(name, LONG).await {
            Err(StoreError::OtherKind { lanes, .. }) => assert_eq!(lanes.as_deref(), Some(NAME)),
            other => panic!("expected OtherKind for {name}, got {other:?}"),
        }
    }
    // A plain stream is not lanes.
    let (plain, _) = other.take_stream("plain", LONG).await.unwrap().unwrap();
    match other.take_lanes::<Lane>("plain", LONG).await {
        Err(StoreError::OtherKind { stream, lanes: None }) => assert_eq!(stream, "plain"),
        other => panic!("expected OtherKind, got {other:?}"),
    }
    other.release(&plain).await.unwrap();
    // The outbox refuses a lane's stream, and takes nothing.
    let (mut app, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let tx = app.transaction().await.unwrap();
    match PgOutbox::new(a.clone()).append(&tx, b"stranger").await {
        Err(StoreError::OtherKind { stream, lanes }) => assert_eq!((stream, lanes.as_deref()), (a.clone(), Some(NAME))),
        other => panic!("expected OtherKind, got {other:?}"),
    }
    tx.commit().await.unwrap();
    assert_eq!(count(&store, "SELECT next_sequence FROM egress_stream WHERE stream = $1", &a).await, 1);
    // A counter moved by hand: the write is refused whole.
    store.client().execute("UPDATE egress_stream SET next_sequence = 2 WHERE stream = $1", &[&a]).await.unwrap();
    lanes.enqueue(room("b"), text("b0")).outcome.unwrap();
    lanes.enqueue(room("a"), text("a1")).outcome.unwrap();
    match write(&store, &lease, &mut lanes).await {
        Err(StoreError::Conflict { stream, stored, expected }) => assert_eq!((stream, stored, expected), (a, 2, 1)),
        other => panic!("expected Conflict, got {other:?}"),
    }
    let b = lane_stream(NAME, &room("b")).unwrap();
    assert_eq!(count(&store, "SELECT COUNT(*) FROM egress_stream WHERE stream = $1", &b).await, 0);
    let next = count(&store, "SELECT next_sequence FROM egress_stream WHERE stream = $1", NAME).await;
    assert_eq!(next, 1, "the lanes' next ordinal did not move");
}

async fn open(
    cx: &egress_reactive::AsyncContext,
    store: &PgStore,
) -> Result<Option<egress_store::DurableLanes<Lane, Bytes>>, StoreError> {
    let options = egress_reactive::CellOptions::new();
    open_durable_lanes(cx, store, NAME, LONG, egress_codec::Raw, policy(8), options, RelayConfig::default()).await
}

/// Lanes as an application uses them on PostgreSQL: records become
/// claimable once durable; another worker's open waits for the lease;
/// after a shutdown (the lease given up) it restores what was not
/// acknowledged, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_durable_lanes_writes_before_sending_and_hands_over_on_shutdown() {
    let Some(url) = database().await else { return };
    let store = PgStore::connect(&url, "w1").await.unwrap();
    let cx = egress_reactive::AsyncContext::new();
    let durable = open(&cx, &store).await.unwrap().unwrap();
    for (lane, payload) in [(room("a"), "a0"), (Lane::ToDevice, "t0"), (room("a"), "a1")] {
        durable.cell.enqueue(lane, text(payload)).unwrap();
    }
    let cell = durable.cell.clone();
    egress_testkit::until(|| (cell.unpersisted_len().get_untracked() == 0).then_some(()), || format!("{cell:?}")).await;
    let a = lane_stream(NAME, &room("a")).unwrap();
    assert_eq!(count(&store, "SELECT COUNT(*) FROM egress_outbox WHERE stream = $1", &a).await, 2);
    let second = PgStore::connect(&url, "w2").await.unwrap();
    assert!(open(&cx, &second).await.unwrap().is_none(), "held by the first worker");
    let stats = durable.relay.shutdown().await;
    assert!(stats.commits >= 1 && !stats.fenced, "{stats:?}");
    let again = open(&cx, &second).await.unwrap().expect("released by the shutdown");
    assert_eq!(again.cell.incarnation(), durable.cell.incarnation(), "the lanes' incarnation is kept");
    let ordinals = again.cell.with_lanes(|l| {
        [(room("a"), 0), (Lane::ToDevice, 0), (room("a"), 1)].map(|(lane, s)| l.ordinal(&lane, Sequence(s)))
    });
    assert_eq!(ordinals, [Some(Ordinal(0)), Some(Ordinal(1)), Some(Ordinal(2))]);
    assert_eq!(again.cell.pending_len().get_untracked(), 3);
    let _ = again.relay.shutdown().await;
}

/// Dead letters of several lanes land in their own lanes' streams (one
/// held by the strict lane, one tombstone of a room) and come back with
/// the lanes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_of_several_lanes_are_written_to_their_own_streams_and_restored() {
    let Some(url) = database().await else { return };
    let store = PgStore::connect(&url, "w1").await.unwrap();
    let (lease, mut lanes) = take(&store, LONG, 8).await;
    for (lane, payload) in [(room("a"), "a0"), (Lane::AccountData, "d0"), (room("a"), "a1")] {
        lanes.enqueue(lane, text(payload)).outcome.unwrap();
    }
    write(&store, &lease, &mut lanes).await.unwrap();
    let g = lanes.generation();
    while let LanesClaim::Claimed(_) = lanes.claim(g).outcome {}
    for lane in [room("a"), Lane::AccountData] {
        let kind = egress_core::FailureKind::Permanent;
        let _ = lanes.fail(g, &lane, Sequence(0), kind, egress_core::Time(0), egress_core::JitterSample::ZERO);
    }
    assert_eq!(lanes.exhausted_len(), 1, "the strict lane holds its dead letter");
    write(&store, &lease, &mut lanes).await.unwrap();
    let dead = |stream: String| {
        let store = store.clone();
        async move {
            store
                .client()
                .query(
                    "SELECT seq, dead_held FROM egress_outbox WHERE stream = $1 AND dead_reason IS NOT NULL",
                    &[&stream],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| (r.get::<_, i64>(0), r.get::<_, Option<bool>>(1)))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(dead(lane_stream(NAME, &Lane::AccountData).unwrap()).await, [(0, Some(true))]);
    assert_eq!(dead(lane_stream(NAME, &room("a")).unwrap()).await, [(0, Some(false))]);
    store.release(&lease).await.unwrap();
    let (_lease, lanes) = take(&store, LONG, 8).await;
    assert_eq!(lanes.exhausted_len(), 1, "the held dead letter is back");
    assert_eq!(lanes.lane(&Lane::AccountData).unwrap().exhausted_len(), 1);
    let a = lanes.lane(&room("a")).unwrap();
    let dead = Some(egress_core::MessageStatus::Dead(egress_core::DeadReason::Permanent));
    assert_eq!((a.status(Sequence(0)), a.pending_len()), (dead, 2), "a0 goes again as its tombstone, a1 after it");
}

/// JSON-free bytes, except that it refuses to encode `bad`.
struct Picky;

impl egress_codec::Encode<Bytes> for Picky {
    fn encode(&self, value: &Bytes) -> Result<Bytes, egress_codec::CodecError> {
        if value.as_ref() == b"bad" {
            return Err("no".into());
        }
        Ok(value.clone())
    }
}

impl egress_codec::Codec<Bytes> for Picky {
    fn decode(&self, bytes: &Bytes) -> Result<Bytes, egress_codec::CodecError> {
        Ok(bytes.clone())
    }
}

async fn open_with(
    cx: &egress_reactive::AsyncContext,
    store: &PgStore,
    lease: Duration,
    codec: impl egress_codec::Codec<Bytes>,
) -> Option<egress_store::DurableLanes<Lane, Bytes>> {
    let options = egress_reactive::CellOptions::new();
    let config = RelayConfig::default();
    open_durable_lanes(cx, store, NAME, lease, codec, policy(8), options, config).await.unwrap()
}

/// A record the codec cannot write (through plain `enqueue`) is shown
/// with its lane's stream; `try_enqueue` refuses it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_the_codec_cannot_write_is_refused_or_shown_with_its_lane() {
    let Some(url) = database().await else { return };
    let store = PgStore::connect(&url, "w1").await.unwrap();
    let cx = egress_reactive::AsyncContext::new();
    let durable = open_with(&cx, &store, LONG, Picky).await.unwrap();
    let refused = durable.cell.try_enqueue(room("a"), text("bad"));
    assert!(matches!(refused, Err(egress_reactive::LanesRefused::Unencodable { .. })), "{refused:?}");
    durable.cell.enqueue(room("a"), text("bad")).unwrap();
    let cell = durable.cell.clone();
    egress_testkit::until(|| cell.persist_error().get_untracked(), || format!("{cell:?}")).await;
    let error = cell.persist_error().get_untracked().unwrap();
    let stream = lane_stream(NAME, &room("a")).unwrap();
    assert!(error.reason.contains(&stream), "{} names {stream:?}", error.reason);
}

/// A relay with nothing to write notices at once that its lease was lost
/// (no round trip: the keeper's renewal found it) and says so on the cell
/// at the next record, which stays unwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_while_idle_stops_the_relay_and_the_cell_says_why() {
    let Some(url) = database().await else { return };
    let store = PgStore::connect(&url, "w1").await.unwrap();
    let cx = egress_reactive::AsyncContext::new();
    let durable = open_with(&cx, &store, Duration::from_secs(1), egress_codec::Raw).await.unwrap();
    // Another worker's take, as the database sees it: a new lease number.
    store.client().execute("UPDATE egress_lease SET lease = lease + 1 WHERE stream = $1", &[&NAME]).await.unwrap();
    let relay = &durable.relay;
    egress_testkit::until(|| relay.stats().fenced.then_some(()), || format!("{:?}", relay.stats())).await;
    durable.cell.enqueue(room("a"), text("a0")).unwrap();
    let cell = durable.cell.clone();
    egress_testkit::until(|| cell.persist_error().get_untracked(), || format!("{cell:?}")).await;
    assert_eq!(durable.cell.unpersisted_len().get_untracked(), 1);
}

/// Lanes whose relay is dropped without a shutdown (the process's task
/// aborted, the store's connection alive) stop being renewed: another
/// worker takes them once the lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_lanes_stop_being_renewed_and_another_worker_takes_them() {
    let Some(url) = database().await else { return };
    let store = PgStore::connect(&url, "w1").await.unwrap();
    let cx = egress_reactive::AsyncContext::new();
    let durable = open_with(&cx, &store, Duration::from_secs(1), egress_codec::Raw).await.unwrap();
    durable.cell.enqueue(room("a"), text("a0")).unwrap();
    let cell = durable.cell.clone();
    egress_testkit::until(|| (cell.unpersisted_len().get_untracked() == 0).then_some(()), || format!("{cell:?}")).await;
    drop(durable);
    let other = PgStore::connect(&url, "w2").await.unwrap();
    let (_lease, lanes) = take(&other, LONG, 8).await;
    assert_eq!(lanes.pending_len(), 1);
    assert!(!store.is_closed(), "the first worker's connection lives on");
}

fn other_kind(result: Result<impl std::fmt::Debug, StoreError>, lanes: Option<&str>) {
    match result {
        Err(StoreError::OtherKind { lanes: l, .. }) => assert_eq!(l.as_deref(), lanes),
        other => panic!("expected OtherKind, got {other:?}"),
    }
}

/// A hostile review's findings, each refused with a typed error: a
/// requeue or discard on a lane's stream (a requeue raised the lane's
/// counter and stored a record without an ordinal: every lane stalled,
/// and the lanes no longer restored), a plain take or append squatting a
/// lane not made yet (every later write of the lanes refused, untyped), a
/// forged plain write on the lanes' row (refused, untyped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_operations_on_a_lane_or_a_future_lane_are_refused_with_a_typed_error() {
    let Some(url) = database().await else { return };
    let store = PgStore::connect(&url, "w1").await.unwrap();
    let (lease, mut lanes) = take(&store, LONG, 8).await;
    lanes.enqueue(room("a"), text("a0")).outcome.unwrap();
    write(&store, &lease, &mut lanes).await.unwrap();
    let (a, z) = (lane_stream(NAME, &room("a")).unwrap(), lane_stream(NAME, &room("z")).unwrap());
    other_kind(store.requeue(&a, Sequence(0)).await, Some(NAME));
    other_kind(store.discard(&a, Sequence(0)).await, Some(NAME));
    let other = PgStore::connect(&url, "w2").await.unwrap();
    other_kind(other.take_stream(&z, LONG).await.map(|t| t.is_some()), Some(NAME));
    let (mut app, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let tx = app.transaction().await.unwrap();
    other_kind(PgOutbox::new(z.clone()).append(&tx, b"squat").await, Some(NAME));
    tx.commit().await.unwrap();
    // Lanes named like a lane's stream are refused too.
    other_kind(store.take_lanes::<Lane>(&z, LONG).await.map(|t| t.is_some()), Some(NAME));
    // A forged plain write on the lanes' own row.
    let stored = egress_core::Restored {
        next_sequence: Sequence(1),
        acked_through: Some(Sequence(0)),
        ..egress_core::Restored::empty()
    };
    let mut core = egress_core::EgressCore::restore(Policy::default(), stored).unwrap();
    let _ = core.enqueue(text("forged"));
    let ready = core.poll_ready().unwrap();
    let appends: Vec<(Sequence, Bytes)> = core.unwritten(ready.appends.clone()).map(|(s, p)| (s, p.clone())).collect();
    other_kind(store.apply(&lease, &ready, &appends).await, Some(NAME));
    // The lanes go on: room z is a lane like any other.
    lanes.enqueue(room("z"), text("z0")).outcome.unwrap();
    write(&store, &lease, &mut lanes).await.unwrap();
    assert_eq!(count(&store, "SELECT COUNT(*) FROM egress_outbox WHERE stream = $1", &z).await, 1);
}

/// The dead letters' view lists a lane's, with its lanes' owner; freeing
/// the lane deletes its tombstones with its stream (as documented).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lanes_dead_letters_are_listed_with_their_owner_until_the_lane_is_freed() {
    let Some(url) = database().await else { return };
    let store = PgStore::connect(&url, "w1").await.unwrap();
    let (lease, mut lanes) = take(&store, LONG, 1).await;
    lanes.enqueue(room("a"), text("a0")).outcome.unwrap();
    write(&store, &lease, &mut lanes).await.unwrap();
    let g = lanes.generation();
    while let LanesClaim::Claimed(_) = lanes.claim(g).outcome {}
    let kind = egress_core::FailureKind::Permanent;
    let _ = lanes.fail(g, &room("a"), Sequence(0), kind, egress_core::Time(0), egress_core::JitterSample::ZERO);
    write(&store, &lease, &mut lanes).await.unwrap();
    let a = lane_stream(NAME, &room("a")).unwrap();
    let listed = store.client().query("SELECT stream, owner FROM egress_dead_letters", &[]).await.unwrap();
    let listed: Vec<(String, Option<String>)> = listed.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(listed, [(a.clone(), Some("w1".to_owned()))]);
    assert_eq!(store.dead_letters(None, 10).await.unwrap().len(), 1, "the same rows as the view");
    // The tombstone goes out and is acknowledged; the idle lane is freed
    // for room b, and its stream goes with its dead letter.
    assert_eq!(drain(&mut lanes), ["a0"]);
    write(&store, &lease, &mut lanes).await.unwrap();
    lanes.enqueue(room("b"), text("b0")).outcome.unwrap();
    write(&store, &lease, &mut lanes).await.unwrap();
    assert!(store.dead_letters(None, 10).await.unwrap().is_empty());
    assert_eq!(count(&store, "SELECT COUNT(*) FROM egress_stream WHERE stream = $1", &a).await, 0);
}

/// A stored ordinal at `i64::MAX` leaves no ordinal to hand out: refused
/// at the take, typed, not at the first write (which every write after
/// would meet too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordinal_at_the_end_of_the_range_is_refused_at_the_take() {
    let Some(url) = database().await else { return };
    let store = PgStore::connect(&url, "w1").await.unwrap();
    let (lease, mut lanes) = take(&store, LONG, 8).await;
    lanes.enqueue(room("a"), text("a0")).outcome.unwrap();
    write(&store, &lease, &mut lanes).await.unwrap();
    store.release(&lease).await.unwrap();
    let a = lane_stream(NAME, &room("a")).unwrap();
    store.client().execute("UPDATE egress_outbox SET ordinal = $2 WHERE stream = $1", &[&a, &i64::MAX]).await.unwrap();
    match store.take_lanes::<Lane>(NAME, LONG).await {
        Err(StoreError::OutOfRange { what, .. }) => assert_eq!(what, "next_ordinal"),
        other => panic!("expected OutOfRange, got {:?}", other.map(|t| t.is_some())),
    }
}
