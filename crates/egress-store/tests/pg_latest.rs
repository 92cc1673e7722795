//! Durable latest projections on PostgreSQL against a real server:
//! `postgres::open_durable_latest` hands a value to the sink only once it
//! is stored, and another worker (the first gone without a shutdown)
//! resumes each key at its stored frontier with its stored desire (also
//! after a worker process SIGKILLed mid-stream); the lease fences a worker taken over; a refused commit is shown and tried
//! again; projections, streams and lanes stay apart by name; stored rows
//! that break the rules refuse the take.
//!
//! The server comes from `EGRESS_PG_URL` (see tests/postgres.rs).
#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used)]

use std::num::NonZeroUsize;
use std::time::Duration;

use bytes::Bytes;
use egress_codec::Json;
use egress_core::{Applied, Epoch, Generation, LatestReady, LatestWrite, Upserted, Version};
use egress_reactive::{AsyncContext, CellOptions};
use egress_store::postgres::{Lease, PgOutbox, PgStore, open_durable_latest};
use egress_store::{DurableLatest, LoadedLatest, StoreError};

mod common;
use common::config;
use common::lanes::Lane;
use common::latest::{Later, Panel, Setting, policy, theme, until};

const NAME: &str = "panel";
const LONG: Duration = Duration::from_secs(600);

/// A database of its own, or `None` without a server.
async fn database() -> Option<String> {
    egress_testkit::pg_database("egress_latest").await
}

async fn open_for(
    cx: &AsyncContext,
    store: &PgStore,
    lease: Duration,
    max_keys: usize,
) -> Result<Option<DurableLatest<Setting, u32>>, StoreError> {
    let keys = NonZeroUsize::new(max_keys).unwrap();
    open_durable_latest(cx, store, NAME, lease, Json, policy(), keys, CellOptions::new(), config()).await
}

/// Opens the projection, waiting (bounded) until no other worker's lease
/// holds it.
async fn open(cx: &AsyncContext, store: &PgStore, lease: Duration) -> DurableLatest<Setting, u32> {
    let deadline = tokio::time::Instant::now() + egress_testkit::limit();
    loop {
        if let Some(durable) = open_for(cx, store, lease, 8).await.unwrap() {
            return durable;
        }
        assert!(tokio::time::Instant::now() < deadline, "the projection never came free");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn count(store: &PgStore, sql: &str) -> i64 {
    store.client().query_one(sql, &[&NAME]).await.unwrap().get(0)
}

fn latest_kind<T: std::fmt::Debug>(result: Result<T, StoreError>, latest: bool) {
    match result {
        Err(StoreError::LatestKind { name, latest: l }) => assert_eq!((name.as_str(), l), (NAME, latest)),
        other => panic!("expected LatestKind {{ latest: {latest} }}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_reaches_the_sink_once_stored_and_another_worker_resumes_each_key_at_its_frontier() {
    let Some(url) = database().await else { return };
    let first = PgStore::connect(&url, "w1").await.unwrap();
    let generation;
    {
        let cx = AsyncContext::new();
        let durable = open(&cx, &first, Duration::from_secs(1)).await;
        generation = durable.cell.generation().get_untracked();
        assert_eq!(generation, Generation(1), "a new projection's first take");
        let stored = count(&first, "SELECT generation FROM egress_stream WHERE stream = $1").await;
        assert_eq!(stored, 1, "the generation is stored before the take returns");
        let panel = Later::default();
        let link = durable.cell.attach(panel.clone());
        durable.cell.upsert(Setting::Volume, Version(1), 10).unwrap();
        durable.cell.upsert(theme("dark"), Version(1), 1).unwrap();
        let seen = panel.clone();
        until("both handed to the sink", || seen.0.lock().unwrap().len() == 2).await;
        assert_eq!(durable.cell.unpersisted_len().get_untracked(), 0, "handed over only once stored");
        assert!(matches!(link.applied(&Setting::Volume, Version(1)), Applied::Advanced { .. }));
        durable.cell.upsert(Setting::Volume, Version(2), 20).unwrap();
        durable.cell.upsert(theme("dark"), Version(2), 2).unwrap();
        until("the volume's second value handed over", || seen.0.lock().unwrap().len() == 3).await;
        let cell = durable.cell.clone();
        until("every row written", || cell.unpersisted_len().get_untracked() == 0).await;
        // No shutdown: the relay is aborted and the lease is not given up,
        // as a worker's crash leaves it.
        drop((link, durable));
    }
    let second = PgStore::connect(&url, "w2").await.unwrap();
    let cx = AsyncContext::new();
    let durable = open(&cx, &second, LONG).await;
    assert!(durable.cell.generation().get_untracked() > generation, "a later take, a later generation");
    let cell = &durable.cell;
    assert_eq!(cell.with_latest(|l| l.durable_through(&Setting::Volume)), Some(Version(1)));
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
    assert!(stats.commits >= 1 && stats.failures == 0 && !stats.fenced, "{stats:?}");
    // The shutdown gave the lease up: the first worker takes it at once.
    let cx = AsyncContext::new();
    let again = open_for(&cx, &first, LONG, 8).await.unwrap().expect("released by the shutdown");
    assert!(again.cell.is_settled().get_untracked());
    assert_eq!(again.cell.with_latest(|l| l.durable_through(&theme("dark"))), Some(Version(2)));
    assert!(open_for(&cx, &second, LONG, 8).await.unwrap().is_none(), "held by the first worker again");
}

/// Another worker's take (a new lease number) fences the first: its relay,
/// idle, notices without a round trip; its next desire is shown as
/// refused and never written; a write under the old lease is refused
/// whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_by_another_worker_fences_the_first_and_nothing_it_writes_lands() {
    let Some(url) = database().await else { return };
    let store = PgStore::connect(&url, "w1").await.unwrap();
    let cx = AsyncContext::new();
    let durable = open(&cx, &store, Duration::from_secs(1)).await;
    durable.cell.upsert(Setting::Volume, Version(1), 10).unwrap();
    let cell = durable.cell.clone();
    until("written", || cell.unpersisted_len().get_untracked() == 0).await;
    store.client().execute("UPDATE egress_lease SET lease = lease + 1 WHERE stream = $1", &[&NAME]).await.unwrap();
    let relay = &durable.relay;
    until("the idle relay fenced", || relay.stats().fenced).await;
    durable.cell.upsert(Setting::Volume, Version(2), 20).unwrap();
    until("the fence shown", || cell.persist_error().get_untracked().is_some_and(|e| e.reason.contains("taken over")))
        .await;
    assert_eq!(count(&store, "SELECT version FROM egress_latest_key WHERE name = $1").await, 1);
    // By hand: a write under a lease that is not the projection's any more.
    let number: i64 =
        store.client().query_one("SELECT lease FROM egress_lease WHERE stream = $1", &[&NAME]).await.unwrap().get(0);
    let stale = Lease {
        stream: NAME.to_owned(),
        number: u64::try_from(number).unwrap() - 1,
        sent: tokio::time::Instant::now(),
    };
    let ready = LatestReady {
        epoch: Epoch(1),
        writes: vec![LatestWrite::Put { key: Setting::Volume, newest: Some(Version(3)), durable_through: None }],
    };
    let value = Some(Bytes::from_static(b"30"));
    match store.apply_latest(&stale, &ready, std::slice::from_ref(&value)).await {
        Err(StoreError::Fenced { stream }) => assert_eq!(stream, NAME),
        other => panic!("expected Fenced, got {other:?}"),
    }
    // Values that do not match the writes are refused before the database.
    let current = Lease { number: stale.number + 1, ..stale };
    for values in [vec![], vec![None], vec![value.clone(), value.clone()]] {
        let refused = store.apply_latest(&current, &ready, &values).await.unwrap_err();
        assert!(matches!(refused, StoreError::LatestWrites { writes: 1, .. }), "{refused:?}");
    }
    assert_eq!(count(&store, "SELECT version FROM egress_latest_key WHERE name = $1").await, 1);
    // A key written twice in one write: refused as on SQLite, nothing
    // written.
    let twice = LatestReady {
        epoch: Epoch(1),
        writes: vec![
            LatestWrite::Put { key: Setting::Volume, newest: Some(Version(4)), durable_through: None },
            LatestWrite::Delete { key: Setting::Volume },
        ],
    };
    let refused = store.apply_latest(&current, &twice, &[value.clone(), None]).await.unwrap_err();
    assert!(matches!(&refused, StoreError::LatestKey { reason, .. } if reason.contains("twice")), "{refused:?}");
    assert_eq!(count(&store, "SELECT version FROM egress_latest_key WHERE name = $1").await, 1);
    // Under the current lease: written, and a delete takes the row.
    store.apply_latest(&current, &ready, &[value]).await.unwrap();
    assert_eq!(count(&store, "SELECT version FROM egress_latest_key WHERE name = $1").await, 3);
    let forget = LatestReady { epoch: Epoch(2), writes: vec![LatestWrite::Delete { key: Setting::Volume }] };
    store.apply_latest(&current, &forget, &[None]).await.unwrap();
    assert_eq!(count(&store, "SELECT COUNT(*) FROM egress_latest_key WHERE name = $1").await, 0);
}

/// An application's transaction holding the projection's lease row makes
/// the write fail at once (busy, not a stall): the error is shown, nothing
/// is handed to the sink, and the write goes through once the row is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_commit_is_shown_hands_nothing_over_and_is_tried_again() {
    let Some(url) = database().await else { return };
    let store = PgStore::connect(&url, "w1").await.unwrap();
    let cx = AsyncContext::new();
    let durable = open(&cx, &store, LONG).await;
    let panel = Panel::default();
    let _link = durable.cell.attach(panel.clone());
    let (mut app, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let blocker = app.transaction().await.unwrap();
    blocker.execute("SELECT 1 FROM egress_lease WHERE stream = $1 FOR UPDATE", &[&NAME]).await.unwrap();
    durable.cell.upsert(Setting::Volume, Version(1), 10).unwrap();
    let cell = durable.cell.clone();
    until("the error shown", || cell.persist_error().get_untracked().is_some()).await;
    assert!(panel.seen().is_empty(), "nothing handed over before it is stored");
    assert_eq!(cell.unpersisted_len().get_untracked(), 1);
    blocker.rollback().await.unwrap();
    until("handed over once stored", || !panel.seen().is_empty()).await;
    assert_eq!(panel.seen(), [(Setting::Volume, 1, 10)]);
    until("the error cleared", || cell.persist_error().get_untracked().is_none()).await;
    assert!(durable.relay.stats().failures >= 1);
    assert!(!durable.relay.stats().fenced);
}

/// Streams, lanes and latest projections share one namespace on
/// PostgreSQL: each operation of the other kinds refuses a projection's
/// name with a typed error (and changes nothing), and a projection's take
/// refuses a stream's or lanes' name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projections_streams_and_lanes_stay_apart_by_name() {
    let Some(url) = database().await else { return };
    let store = PgStore::connect(&url, "w1").await.unwrap();
    let (lease, loaded) = store.take_latest::<Setting>(NAME, LONG).await.unwrap().unwrap();
    assert_eq!(loaded, LoadedLatest { generation: Generation(1), keys: vec![] });
    let other = PgStore::connect(&url, "w2").await.unwrap();
    latest_kind(other.take_stream(NAME, LONG).await.map(|t| t.is_some()), true);
    latest_kind(other.take_lanes::<Lane>(NAME, LONG).await.map(|t| t.is_some()), true);
    assert!(other.take(LONG).await.unwrap().is_none(), "a plain take never takes a projection");
    let (mut app, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let tx = app.transaction().await.unwrap();
    latest_kind(PgOutbox::new(NAME).append(&tx, b"stranger").await, true);
    tx.commit().await.unwrap();
    assert_eq!(count(&store, "SELECT next_sequence FROM egress_stream WHERE stream = $1").await, 0);
    assert_eq!(count(&store, "SELECT COUNT(*) FROM egress_outbox WHERE stream = $1").await, 0);
    // The projection's own lease cannot write it as lanes: no lane is made
    // under it.
    let (held, loaded) = other.take_lanes::<Lane>("client", LONG).await.unwrap().unwrap();
    let mut lanes = egress_core::Lanes::<Lane, Bytes>::restore(common::lanes::policy(8), loaded.restored).unwrap();
    lanes.enqueue(Lane::ToDevice, Bytes::from_static(b"forged")).outcome.unwrap();
    let ready = lanes.poll_ready().unwrap();
    let appends = common::lanes::appends(&lanes, &ready);
    let refused = store.apply_lanes(&lease, &ready, &appends).await.unwrap_err();
    assert!(matches!(&refused, StoreError::Fenced { stream } if stream == NAME), "{refused:?}");
    assert_eq!(count(&store, "SELECT COUNT(*) FROM egress_stream WHERE lanes = $1 AND lane IS NOT NULL").await, 0);
    // Nor an empty lanes write, which would move the projection's counter
    // and generation (a hostile review's finding).
    let empty = egress_core::LanesReady::<Lane> {
        epoch: Epoch(1),
        forget: vec![],
        lanes: vec![],
        next_ordinal: egress_core::Ordinal(77),
        generation: Some(Generation(1_000_000)),
        must_sync: true,
    };
    let refused = store.apply_lanes(&lease, &empty, &[]).await.unwrap_err();
    assert!(matches!(&refused, StoreError::Fenced { .. }), "{refused:?}");
    assert_eq!(count(&store, "SELECT generation FROM egress_stream WHERE stream = $1").await, 1);
    assert_eq!(count(&store, "SELECT next_sequence FROM egress_stream WHERE stream = $1").await, 0);
    // A lane's row under a projection's name is refused by the table's
    // trigger, whoever writes it.
    let squat = store
        .client()
        .execute(
            "INSERT INTO egress_stream (stream, incarnation, lanes, lane) VALUES ($1 || chr(31) || 'x', $2, $1, 'x')",
            &[&NAME, &vec![0u8; 16]],
        )
        .await
        .unwrap_err();
    assert_eq!(squat.code().map(|c| c.code()), Some("EGR01"), "{squat:?}");
    // A stream's or lanes' name is not a projection's.
    let (plain, _) = other.take_stream("plain", LONG).await.unwrap().unwrap();
    for name in ["plain", "client"] {
        match store.take_latest::<Setting>(name, LONG).await {
            Err(StoreError::LatestKind { name: n, latest: false }) => assert_eq!(n, name),
            other => panic!("expected LatestKind for {name}, got {other:?}"),
        }
    }
    let lane = egress_store::lane_stream("client", &Lane::ToDevice).unwrap();
    let refused = store.take_latest::<Setting>(&lane, LONG).await.unwrap_err();
    assert!(matches!(&refused, StoreError::OtherKind { lanes: Some(l), .. } if l == "client"), "{refused:?}");
    other.release(&plain).await.unwrap();
    other.release(&held).await.unwrap();
    // The projection is still its taker's, and writes.
    let ready = LatestReady {
        epoch: Epoch(1),
        writes: vec![LatestWrite::Put { key: Setting::Volume, newest: Some(Version(1)), durable_through: None }],
    };
    store.apply_latest(&lease, &ready, &[Some(Bytes::from_static(b"10"))]).await.unwrap();
    assert!(other.take_latest::<Setting>(NAME, LONG).await.unwrap().is_none(), "held");
}

/// Stored rows that break the rules refuse the take, typed: a key not
/// spelled as serde writes it, a value the codec cannot read, more keys
/// than the policy allows. Each take raises the stored generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_rows_that_break_the_rules_refuse_the_take() {
    let Some(url) = database().await else { return };
    let store = PgStore::connect(&url, "w1").await.unwrap();
    let cx = AsyncContext::new();
    let durable = open(&cx, &store, LONG).await;
    durable.cell.upsert(Setting::Volume, Version(1), 10).unwrap();
    durable.cell.upsert(theme("dark"), Version(1), 1).unwrap();
    durable.relay.shutdown().await;
    // More keys than the policy allows.
    let refused = open_for(&cx, &store, LONG, 1).await.unwrap_err();
    assert!(matches!(refused, StoreError::LatestRestore(_)), "{refused:?}");
    let client = store.client();
    client.execute("UPDATE egress_lease SET owner = NULL WHERE stream = $1", &[&NAME]).await.unwrap();
    // A value JSON cannot read as a u32.
    client
        .execute("UPDATE egress_latest_key SET value = '\\x2d31' WHERE name = $1 AND key = '\"Volume\"'", &[&NAME])
        .await
        .unwrap();
    let refused = open_for(&cx, &store, LONG, 8).await.unwrap_err();
    assert!(matches!(&refused, StoreError::LatestValue { encode: false, .. }), "{refused:?}");
    client.execute("UPDATE egress_lease SET owner = NULL WHERE stream = $1", &[&NAME]).await.unwrap();
    // The same key spelled with a space.
    client
        .execute("UPDATE egress_latest_key SET key = ' \"Volume\"' WHERE name = $1 AND key = '\"Volume\"'", &[&NAME])
        .await
        .unwrap();
    let refused = open_for(&cx, &store, LONG, 8).await.unwrap_err();
    assert!(
        matches!(&refused, StoreError::LatestKey { reason, .. } if reason.contains("not as serde writes it")),
        "{refused:?}"
    );
    // A version without its value is refused by the table itself.
    let broken = client.execute("UPDATE egress_latest_key SET value = NULL WHERE name = $1", &[&NAME]).await;
    assert!(broken.is_err(), "the table's check refuses a version without a value");
    let generation = count(&store, "SELECT generation FROM egress_stream WHERE stream = $1").await;
    assert_eq!(generation, 4, "one per take, the refused ones too");
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

/// What the store could never write is refused at the upsert, as on
/// SQLite, with a reason that names the projection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_the_store_cannot_write_is_refused_at_the_upsert_naming_the_projection() {
    let Some(url) = database().await else { return };
    let store = PgStore::connect(&url, "w1").await.unwrap();
    let cx = AsyncContext::new();
    let keys = NonZeroUsize::new(8).unwrap();
    let picky: DurableLatest<Picky, u32> =
        open_durable_latest(&cx, &store, "picky", LONG, Json, policy(), keys, CellOptions::new(), config())
            .await
            .unwrap()
            .unwrap();
    let refused = picky.cell.upsert(Picky("bad".into()), Version(1), 1).unwrap_err();
    assert!(
        matches!(&refused, egress_reactive::LatestRefused::Unwritable { reason, .. } if reason.starts_with("latest picky: ")),
        "{refused:?}"
    );
    picky.cell.upsert(Picky("good".into()), Version(1), 1).unwrap();
    let cell = picky.cell.clone();
    until("the good key written", || cell.unpersisted_len().get_untracked() == 0).await;
    assert_eq!(cell.persist_error().get_untracked(), None);
}

/// The child of the SIGKILL test: a worker (lease 1 s) that upserts each
/// of three keys at versions 1, 2, 3, ... into the projection on the
/// database in `EGRESS_PG_LATEST_CHILD`. Its sink takes each value and
/// answers only every third round. After each round's desires are stored
/// it prints `desired V` (stored, not applied); every third round, once it
/// applied everything handed and that is stored, `stored V` (every key
/// applied through V, and that written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_latest_child() {
    let Ok(url) = std::env::var("EGRESS_PG_LATEST_CHILD") else { return };
    let store = PgStore::connect(&url, "child").await.unwrap();
    let cx = AsyncContext::new();
    let durable = open(&cx, &store, Duration::from_secs(1)).await;
    let cell = durable.cell.clone();
    let sink = Later::default();
    let link = cell.attach(sink.clone());
    for v in 1..=1_000_000u64 {
        for (i, key) in KILL_KEYS.iter().enumerate() {
            cell.upsert(key(), Version(v), value_of(i, v)).unwrap();
        }
        until("the desires stored", || cell.unpersisted_len().get_untracked() == 0).await;
        println!("desired {v}");
        if v % 3 == 0 {
            until("applied and stored", || {
                let handed: Vec<_> = sink.0.lock().unwrap().drain(..).collect();
                for (key, version, _) in handed {
                    let _ = link.applied(&key, Version(version));
                }
                cell.is_settled().get_untracked() && cell.unpersisted_len().get_untracked() == 0
            })
            .await;
            println!("stored {v}");
        }
    }
}

/// A child process, SIGKILLed when dropped (also when the test fails
/// before it means to kill it).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The keys of the SIGKILL test.
const KILL_KEYS: [fn() -> Setting; 3] = [|| Setting::Volume, || theme("a"), || theme("b")];

/// The value key `i` takes at version `v`.
fn value_of(i: usize, v: u64) -> u32 {
    u32::try_from(v % 1_000_000).unwrap() * 10 + u32::try_from(i).unwrap()
}

/// A worker SIGKILLed while it upserts, at three points: right after its
/// first `stored` line (everything applied), and right after the `desired`
/// line that follows its 4th and its 12th (desires stored, not applied).
/// The next worker waits out its lease, finds each key applied at least
/// through what the killed worker last saw stored, holds a desire at least
/// as new as the last it saw stored (with the value of its version) where
/// the kill cut one short, and hands its sink exactly those desires, once
/// each.
#[test]
fn a_worker_killed_mid_stream_loses_nothing_it_stored_and_the_next_resumes_each_key() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for (lines, in_flight) in [(1usize, false), (4, true), (12, true)] {
        let Some(url) = runtime.block_on(database()) else { return };
        let mut child = Killed(
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "pg_latest_child", "--nocapture", "--test-threads=1"])
                .env("EGRESS_PG_LATEST_CHILD", &url)
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let mut out = BufReader::new(child.0.stdout.take().unwrap()).lines();
        let (mut stored, mut desired) = (0u64, 0u64);
        let mut seen = 0;
        loop {
            let line = out.next().expect("the child printed").unwrap();
            // (The first may follow libtest's "test pg_latest_child ... ".)
            if let Some((_, v)) = line.split_once("stored ") {
                stored = v.parse().unwrap();
                seen += 1;
                if seen == lines && !in_flight {
                    break;
                }
            } else if let Some((_, v)) = line.split_once("desired ") {
                desired = v.parse().unwrap();
                if seen >= lines && in_flight {
                    break;
                }
            }
        }
        drop(child); // SIGKILL
        runtime.block_on(async {
            let store = PgStore::connect(&url, "next").await.unwrap();
            let cx = AsyncContext::new();
            let durable = open(&cx, &store, LONG).await;
            let cell = &durable.cell;
            let mut owed = Vec::new();
            for (i, key) in KILL_KEYS.iter().enumerate() {
                let through = cell.with_latest(|l| l.durable_through(&key())).expect("applied before the kill");
                assert!(through.0 >= stored, "after {lines} lines: {:?} applied through {through:?} < {stored}", key());
                if let Some((v, value)) = cell.with_latest(|l| l.desired(&key()).map(|(v, x)| (v, *x))) {
                    assert!(v > through, "a desire above the frontier");
                    assert_eq!(value, value_of(i, v.0), "the value of its version");
                    owed.push((key(), v.0, value));
                }
            }
            if in_flight {
                // Killed with desires stored above the frontier: each key
                // owes one at least as new as the last seen stored.
                assert_eq!(owed.len(), KILL_KEYS.len(), "after {lines} lines: {owed:?}");
                assert!(owed.iter().all(|o| o.1 >= desired), "after {lines} lines: {owed:?} older than {desired}");
            }
            let panel = Panel::default();
            let _link = cell.attach(panel.clone());
            until("settled", || cell.is_settled().get_untracked()).await;
            let mut handed = panel.seen();
            handed.sort();
            owed.sort();
            assert_eq!(handed, owed, "after {lines} lines: each cut-short desire, once");
            until("the frontiers written", || cell.unpersisted_len().get_untracked() == 0).await;
            let stats = durable.relay.shutdown().await;
            assert!(stats.failures == 0 && !stats.fenced, "{stats:?}");
        });
    }
}
