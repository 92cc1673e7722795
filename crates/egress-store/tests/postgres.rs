//! The PostgreSQL store against a real server: appends in the caller's
//! transaction (committed, rolled back, concurrent), recovery, stream
//! leases taken with `SKIP LOCKED` and fenced by their number, and the
//! outbox's notifications.
//!
//! The server comes from `EGRESS_PG_URL` (`.ci/run` starts a throwaway
//! cluster on a loopback port and sets it, with `EGRESS_PG_REQUIRED=1`).
//! Without the URL each test says so and does nothing, unless
//! `EGRESS_PG_REQUIRED` is set: then a missing server fails it.
#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use egress_core::{DeadLetters, DeadReason, EgressCore, FailureKind, Generation, JitterSample, Policy, Sequence, Time};
use egress_store::StoreError;
use egress_store::postgres::{Lease, PgOutbox, PgStore, migrate};

/// A database of its own on the server, or `None` without one (see
/// egress-testkit).
async fn database() -> Option<String> {
    egress_testkit::pg_database("egress_test").await
}

use egress_testkit::fresh;

/// A client of the application's own, with the schema installed.
async fn app(url: &str) -> tokio_postgres::Client {
    let (mut client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    migrate(&mut client).await.unwrap();
    client
}

async fn outbox_rows(client: &tokio_postgres::Client, stream: &str) -> Vec<(i64, Vec<u8>)> {
    client
        .query("SELECT seq, payload FROM egress_outbox WHERE stream = $1 ORDER BY seq", &[&stream])
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Writes everything the core's journal holds under `lease`.
async fn flush(core: &mut EgressCore<Bytes>, store: &PgStore, lease: &Lease) -> Result<(), StoreError> {
    while let Some(ready) = core.poll_ready() {
        let appends: Vec<_> = core.unwritten(ready.appends.clone()).map(|(s, p)| (s, p.clone())).collect();
        if let Err(e) = store.apply(lease, &ready, &appends).await {
            let _ = core.persist_failed(ready.epoch, e.to_string());
            return Err(e);
        }
        let _ = core.persisted(ready.epoch);
    }
    Ok(())
}

const LONG: Duration = Duration::from_secs(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_commit_and_roll_back_with_the_callers_transaction() {
    let Some(url) = database().await else { return };
    let mut client = app(&url).await;
    let stream = fresh("orders");
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS egress_test_orders (id bigserial PRIMARY KEY, item text)")
        .await
        .unwrap();
    let outbox = PgOutbox::new(stream.clone());

    let tx = client.transaction().await.unwrap();
    tx.execute("INSERT INTO egress_test_orders (item) VALUES ($1)", &[&stream]).await.unwrap();
    let first = outbox.append_json(&tx, &serde_json::json!({"order": "tea"})).await.unwrap();
    tx.commit().await.unwrap();

    let tx = client.transaction().await.unwrap();
    tx.execute("INSERT INTO egress_test_orders (item) VALUES ($1)", &[&stream]).await.unwrap();
    let rolled_back = outbox.append(&tx, b"cake").await.unwrap();
    tx.rollback().await.unwrap();

    let tx = client.transaction().await.unwrap();
    let second = outbox.append(&tx, b"raw bytes").await.unwrap();
    tx.commit().await.unwrap();

    assert_eq!((first, rolled_back, second), (Sequence(0), Sequence(1), Sequence(1)), "a rollback consumes nothing");
    let rows = outbox_rows(&client, &stream).await;
    assert_eq!(rows, [(0, br#"{"order":"tea"}"#.to_vec()), (1, b"raw bytes".to_vec())]);
    let orders: i64 =
        client.query_one("SELECT count(*) FROM egress_test_orders WHERE item = $1", &[&stream]).await.unwrap().get(0);
    assert_eq!(orders, 1, "the business row went with its append");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_append_leaves_the_callers_transaction_usable() {
    let Some(url) = database().await else { return };
    let mut client = app(&url).await;
    let stream = fresh("full");
    let outbox = PgOutbox::new(stream.clone());
    // A counter at the top of its range: the next append cannot be stored.
    let tx = client.transaction().await.unwrap();
    outbox.append(&tx, b"seed").await.unwrap();
    tx.commit().await.unwrap();
    client
        .execute("UPDATE egress_stream SET next_sequence = $2 WHERE stream = $1", &[&stream, &i64::MAX])
        .await
        .unwrap();
    let tx = client.transaction().await.unwrap();
    let refused = outbox.append(&tx, b"over the top").await;
    assert!(matches!(refused, Err(StoreError::Postgres(_))), "{refused:?}");
    // The transaction goes on: the savepoint took the failure away.
    let one: i32 = tx.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
    tx.commit().await.unwrap();
    assert_eq!(outbox_rows(&client, &stream).await.len(), 1, "nothing half appended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_to_one_stream_have_no_gap_and_no_duplicate() {
    let Some(url) = database().await else { return };
    let stream = fresh("busy");
    let mut tasks = Vec::new();
    for writer in 0..6u32 {
        let (url, stream) = (url.clone(), stream.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = app(&url).await;
            let outbox = PgOutbox::new(stream);
            let mut mine = Vec::new();
            for i in 0..20u32 {
                let tx = client.transaction().await.unwrap();
                let payload = format!("{writer}/{i}");
                let sequence = outbox.append(&tx, payload.as_bytes()).await.unwrap();
                // Every third transaction rolls back: its sequence is taken
                // again by the next append, never left as a gap.
                if i % 3 == 2 {
                    tx.rollback().await.unwrap();
                } else {
                    tx.commit().await.unwrap();
                    mine.push((sequence.0, payload));
                }
            }
            mine
        }));
    }
    let mut committed = Vec::new();
    for t in tasks {
        committed.extend(t.await.unwrap());
    }
    committed.sort();
    let client = app(&url).await;
    let rows: Vec<(u64, String)> = outbox_rows(&client, &stream)
        .await
        .into_iter()
        .map(|(s, p)| (u64::try_from(s).unwrap(), String::from_utf8(p).unwrap()))
        .collect();
    assert_eq!(rows.len(), 6 * 14);
    assert_eq!(
        rows.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        (0..rows.len() as u64).collect::<Vec<_>>(),
        "gap-free"
    );
    assert_eq!(rows, committed, "each committed append holds the sequence it was given");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_stream_restores_what_is_unacknowledged_with_its_dead_letters() {
    let Some(url) = database().await else { return };
    let stream = fresh("restore");
    let policy = Policy::builder().inflight_limit(8).dead_letters(DeadLetters::Skip).build().unwrap();
    let store = PgStore::connect(&url, "worker-a").await.unwrap();
    let (lease, loaded) = store.take_stream(&stream, LONG).await.unwrap().unwrap();
    let incarnation = loaded.incarnation;
    let mut core = EgressCore::restore(policy, loaded.restored).unwrap();
    let _ = core.enqueue_all((0..5).map(|i| Bytes::from(format!("m{i}"))));
    let g = Generation(3);
    let _ = core.reconnect(g);
    flush(&mut core, &store, &lease).await.unwrap();
    for _ in 0..5 {
        let _ = core.claim(g);
    }
    let _ = core.ack(g, Sequence(1));
    let _ = core.fail(g, Sequence(3), FailureKind::Permanent, Time(0), JitterSample::ZERO);
    flush(&mut core, &store, &lease).await.unwrap();
    let _ = core.enqueue(Bytes::from_static(b"unwritten"));
    store.release(&lease).await.unwrap();
    drop((core, store));

    let store = PgStore::connect(&url, "worker-b").await.unwrap();
    let (lease_b, loaded) = store.take_stream(&stream, LONG).await.unwrap().unwrap();
    assert_eq!(lease_b.number, lease.number + 1);
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
    assert_eq!(outbox_rows(store.client(), &stream).await.len(), 3, "acknowledged records pruned");

    // The receiver skips the tombstone and delivers the rest: after another
    // restart the skipped one still reads dead, for its reason.
    let mut core = core;
    let _ = core.reconnect(Generation(4));
    flush(&mut core, &store, &lease_b).await.unwrap();
    while matches!(core.claim(Generation(4)).outcome, egress_core::ClaimOutcome::Claimed(_)) {}
    let _ = core.ack(Generation(4), Sequence(4));
    flush(&mut core, &store, &lease_b).await.unwrap();
    store.release(&lease_b).await.unwrap();
    drop((core, store));
    let store = PgStore::connect(&url, "worker-c").await.unwrap();
    let (_, loaded) = store.take_stream(&stream, LONG).await.unwrap().unwrap();
    let core = EgressCore::restore(policy, loaded.restored).unwrap();
    let status = |s| core.status(Sequence(s));
    use egress_core::MessageStatus::{Acknowledged, Dead};
    assert_eq!(
        [status(2), status(3), status(4)],
        [Some(Acknowledged), Some(Dead(DeadReason::Permanent)), Some(Acknowledged)],
        "the skipped dead letter reads dead after a restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_taken_over_fences_every_write_of_its_old_owner() {
    let Some(url) = database().await else { return };
    let stream = fresh("fence");
    let policy = Policy::builder().inflight_limit(8).build().unwrap();
    let a = PgStore::connect(&url, "worker-a").await.unwrap();
    let b = PgStore::connect(&url, "worker-b").await.unwrap();
    let c = PgStore::connect(&url, "worker-c").await.unwrap();
    // A takes it with a lease that has run out by the next statement.
    let (lease_a, loaded) = a.take_stream(&stream, Duration::ZERO).await.unwrap().unwrap();
    let mut core_a = EgressCore::restore(policy, loaded.restored).unwrap();
    let _ = core_a.enqueue(Bytes::from_static(b"a0"));
    flush(&mut core_a, &a, &lease_a).await.unwrap();
    // B takes it over; C finds it held.
    let (lease_b, loaded) = b.take_stream(&stream, LONG).await.unwrap().unwrap();
    assert_eq!(lease_b.number, lease_a.number + 1);
    assert!(c.take_stream(&stream, LONG).await.unwrap().is_none(), "held by B");
    // Every write of A is refused now, and nothing of it lands.
    let _ = core_a.enqueue(Bytes::from_static(b"a1"));
    let _ = core_a.reconnect(Generation(9));
    assert!(matches!(flush(&mut core_a, &a, &lease_a).await, Err(StoreError::Fenced { .. })));
    assert!(matches!(a.renew(&lease_a, LONG).await, Err(StoreError::Fenced { .. })));
    assert!(matches!(a.release(&lease_a).await, Err(StoreError::Fenced { .. })));
    let generation: i64 = b
        .client()
        .query_one("SELECT generation FROM egress_stream WHERE stream = $1", &[&stream])
        .await
        .unwrap()
        .get(0);
    assert_eq!(generation, 0, "A's new generation was never stored, so it can never be handshaken");
    assert_eq!(outbox_rows(b.client(), &stream).await, [(0, b"a0".to_vec())]);
    // B continues where A's durable writes stopped.
    let mut core_b = EgressCore::restore(policy, loaded.restored).unwrap();
    assert_eq!(core_b.next_sequence(), Sequence(1));
    let _ = core_b.enqueue(Bytes::from_static(b"b1"));
    b.renew(&lease_b, LONG).await.unwrap();
    flush(&mut core_b, &b, &lease_b).await.unwrap();
    assert_eq!(outbox_rows(b.client(), &stream).await, [(0, b"a0".to_vec()), (1, b"b1".to_vec())]);
    // Released, it is C's at once.
    b.release(&lease_b).await.unwrap();
    let (lease_c, _) = c.take_stream(&stream, LONG).await.unwrap().unwrap();
    assert_eq!(lease_c.number, lease_b.number + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_taking_streams_together_take_each_once() {
    let Some(url) = database().await else { return };
    let prefix = fresh("spread");
    let streams: BTreeSet<String> = (0..12).map(|i| format!("{prefix}/{i:02}")).collect();
    let setup = PgStore::connect(&url, "setup").await.unwrap();
    for s in &streams {
        let (lease, _) = setup.take_stream(s, LONG).await.unwrap().unwrap();
        setup.release(&lease).await.unwrap();
    }
    let mut tasks = Vec::new();
    for w in 0..4 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let store = PgStore::connect(&url, format!("worker-{w}")).await.unwrap();
            let mut taken = Vec::new();
            while let Some((lease, _)) = store.take(LONG).await.unwrap() {
                taken.push(lease.stream);
            }
            taken
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let distinct: BTreeSet<&String> = all.iter().collect();
    assert_eq!(all.len(), distinct.len(), "no stream taken twice: {all:?}");
    assert_eq!(distinct, streams.iter().collect(), "every free stream taken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_append_under_the_cells_own_is_a_conflict_then_adopted() {
    let Some(url) = database().await else { return };
    let stream = fresh("mixed");
    let policy = Policy::builder().inflight_limit(8).build().unwrap();
    let store = PgStore::connect(&url, "worker").await.unwrap();
    let (lease, loaded) = store.take_stream(&stream, LONG).await.unwrap().unwrap();
    assert!(store.changed(), "a new store reads once");
    assert!(!store.changed());
    let mut core = EgressCore::restore(policy, loaded.restored).unwrap();
    // The application appends in its own transaction meanwhile.
    let mut client = app(&url).await;
    let tx = client.transaction().await.unwrap();
    PgOutbox::new(stream.clone()).append(&tx, b"theirs").await.unwrap();
    tx.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), store.notified()).await.expect("the commit notifies");
    assert!(store.changed());
    // The cell's own append under the same sequence is refused whole.
    let _ = core.enqueue(Bytes::from_static(b"mine"));
    match flush(&mut core, &store, &lease).await {
        Err(StoreError::Conflict { stored: 1, expected: 0, .. }) => {}
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(store.appended(&stream, Sequence(0), 10).await.unwrap(), [(Sequence(0), Bytes::from_static(b"theirs"))]);
    assert_eq!(outbox_rows(store.client(), &stream).await, [(0, b"theirs".to_vec())], "nothing of the refused write");
}

fn payload(i: u64) -> Bytes {
    Bytes::from(format!("message {i}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_stream_was_taken_over_stops_and_writes_nothing_more() {
    use egress_reactive::{AsyncContext, CellOptions};
    use egress_store::RelayConfig;
    use egress_store::postgres::open_durable;

    let Some(url) = database().await else { return };
    let stream = fresh("taken");
    let cx = AsyncContext::new();
    let store = PgStore::connect(&url, "worker-a").await.unwrap();
    let lease = Duration::from_secs(2);
    let (_, a) =
        open_durable(&cx, &store, Some(&stream), lease, Policy::default(), CellOptions::new(), RelayConfig::default())
            .await
            .unwrap()
            .unwrap();
    a.cell.enqueue_all((0..10).map(payload));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while a.cell.durable_through().get_untracked() != Some(Sequence(9)) {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A stalls past its lease (as a paused process would), and B takes it.
    let b = PgStore::connect(&url, "worker-b").await.unwrap();
    b.client()
        .execute("UPDATE egress_lease SET until = now() - interval '1 second' WHERE stream = $1", &[&stream])
        .await
        .unwrap();
    let (lease_b, _) = b.take_stream(&stream, lease).await.unwrap().expect("expired");
    // A's next renewal or write is refused: its relay stops, and what it
    // enqueues now is never stored.
    a.cell.enqueue_all((10..20).map(payload));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !a.relay.stats().fenced {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", a.relay.stats());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (next, lease_now): (i64, i64) = {
        let row = b
            .client()
            .query_one(
                "SELECT next_sequence, lease FROM egress_stream JOIN egress_lease USING (stream) WHERE stream = $1",
                &[&stream],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!((next, u64::try_from(lease_now).unwrap()), (10, lease_b.number), "A wrote nothing after the takeover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_commit_is_shown_retried_and_loses_nothing() {
    use egress_reactive::{AsyncContext, CellOptions};
    use egress_store::RelayConfig;
    use egress_store::postgres::open_durable;

    let Some(url) = database().await else { return };
    let stream = fresh("refused");
    let cx = AsyncContext::new();
    let store = PgStore::connect(&url, "worker").await.unwrap();
    let (_, d) =
        open_durable(&cx, &store, Some(&stream), LONG, Policy::default(), CellOptions::new(), RelayConfig::default())
            .await
            .unwrap()
            .unwrap();
    // The database refuses every write to the outbox (its table gone).
    let admin = app(&url).await;
    admin.batch_execute("ALTER TABLE egress_outbox RENAME TO egress_outbox_away").await.unwrap();
    d.cell.enqueue_all((0..20).map(payload));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while d.cell.persist_error().get_untracked().is_none() {
        assert!(tokio::time::Instant::now() < deadline, "the refusal is shown");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(d.cell.durable_through().get_untracked(), None, "nothing claimed durable");
    // The database comes back: the relay's retry writes everything, once.
    admin.batch_execute("ALTER TABLE egress_outbox_away RENAME TO egress_outbox").await.unwrap();
    while d.cell.durable_through().get_untracked() != Some(Sequence(19)) {
        assert!(tokio::time::Instant::now() < deadline, "retried: {:?}", d.cell.persist_error().get_untracked());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(d.cell.persist_error().get_untracked().is_none());
    let stats = d.relay.shutdown().await;
    assert!(stats.failures >= 1 && !stats.fenced, "{stats:?}");
    let rows = outbox_rows(&admin, &stream).await;
    assert_eq!(rows.iter().map(|(s, _)| *s).collect::<Vec<_>>(), (0..20).collect::<Vec<_>>());
    assert!(rows.iter().enumerate().all(|(i, (_, p))| *p == payload(i as u64).to_vec()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_stay_past_the_watermark_until_requeued_at_the_end_or_discarded_never_past_an_open_append() {
    let Some(url) = database().await else { return };
    let stream = fresh("dead");
    let policy = Policy::builder().inflight_limit(8).dead_letters(DeadLetters::Skip).build().unwrap();
    let store = PgStore::connect(&url, "worker").await.unwrap();
    let (lease, loaded) = store.take_stream(&stream, LONG).await.unwrap().unwrap();
    let mut core = EgressCore::restore(policy, loaded.restored).unwrap();
    let _ = core.enqueue_all((0..6).map(|i| Bytes::from(format!("m{i}"))));
    let g = Generation(1);
    let _ = core.reconnect(g);
    flush(&mut core, &store, &lease).await.unwrap();
    for _ in 0..6 {
        let _ = core.claim(g);
    }
    // 1 and 4 fail for good (tombstones); the stream goes on to 3.
    let _ = core.fail(g, Sequence(1), FailureKind::Permanent, Time(0), JitterSample::ZERO);
    let _ = core.fail(g, Sequence(4), FailureKind::Permanent, Time(0), JitterSample::ZERO);
    let _ = core.ack(g, Sequence(3));
    flush(&mut core, &store, &lease).await.unwrap();
    let rows: Vec<i64> = outbox_rows(store.client(), &stream).await.into_iter().map(|(s, _)| s).collect();
    assert_eq!(rows, [1, 4, 5], "the acknowledged records pruned, the dead letter below the watermark kept");
    let dead = store.dead_letters(Some(&stream), 100).await.unwrap();
    let listed: Vec<(u64, DeadReason, bool, Bytes)> =
        dead.iter().map(|d| (d.sequence.0, d.mark.reason, d.mark.held, d.payload.clone())).collect();
    assert_eq!(
        listed,
        [(1, DeadReason::Permanent, false, Bytes::from("m1")), (4, DeadReason::Permanent, false, Bytes::from("m4"))]
    );
    let view: Vec<(i64, String)> = store
        .client()
        .query("SELECT seq, reason FROM egress_dead_letters WHERE stream = $1 ORDER BY seq", &[&stream])
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(view, [(1, "permanent".to_owned()), (4, "permanent".to_owned())], "the view for people");
    assert_eq!(store.dead_letters(None, 1).await.unwrap().len(), 1, "the limit holds");

    // 4 is above the watermark (the stream has not passed it): not here.
    let refused = store.requeue(&stream, Sequence(4)).await;
    assert!(matches!(refused, Err(StoreError::NotDead { sequence: Sequence(4), .. })), "{refused:?}");
    assert!(matches!(store.requeue(&stream, Sequence(2)).await, Err(StoreError::NotDead { .. })), "not dead");
    assert!(matches!(store.discard(&stream, Sequence(0)).await, Err(StoreError::NotDead { .. })), "no such row");
    assert_eq!(outbox_rows(store.client(), &stream).await.len(), 3, "nothing changed by a refusal");

    // An application's append in progress holds the stream's counter: the
    // requeue is refused as busy, after the lock timeout, with nothing
    // changed (and the application's transaction, rolled back, consumed
    // nothing either).
    let mut app_client = app(&url).await;
    let tx = app_client.transaction().await.unwrap();
    PgOutbox::new(stream.clone()).append(&tx, b"in progress").await.unwrap();
    let busy = store.requeue(&stream, Sequence(1)).await;
    assert!(matches!(busy, Err(StoreError::Busy { .. })), "{busy:?}");
    tx.rollback().await.unwrap();
    assert_eq!(store.dead_letters(Some(&stream), 100).await.unwrap().len(), 2, "still both dead letters");
    assert_eq!(outbox_rows(store.client(), &stream).await.len(), 3, "nothing changed by the busy requeue");

    // 1 goes again, at the end of the stream, and the worker adopts it.
    store.changed();
    // Busy means "try again" (a lock held past the 50 ms lock timeout on a
    // loaded machine): the caller's contract, bounded here.
    let mut again = store.requeue(&stream, Sequence(1)).await;
    for _ in 0..100 {
        if !matches!(again, Err(StoreError::Busy { .. })) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        again = store.requeue(&stream, Sequence(1)).await;
    }
    let again = again.unwrap();
    assert_eq!(again, Sequence(6));
    tokio::time::timeout(Duration::from_secs(30), store.notified()).await.expect("the requeue notifies");
    let appended = store.appended(&stream, core.next_sequence(), 10).await.unwrap();
    assert_eq!(appended, [(Sequence(6), Bytes::from("m1"))]);
    assert!(matches!(core.adopt(Sequence(6), Bytes::from("m1")).outcome, egress_core::AdoptOutcome::Adopted { .. }));
    assert!(matches!(store.requeue(&stream, Sequence(1)).await, Err(StoreError::NotDead { .. })), "once");

    // The stream passes 4 as well; then it can be discarded.
    let _ = core.ack(g, Sequence(5));
    flush(&mut core, &store, &lease).await.unwrap();
    store.discard(&stream, Sequence(4)).await.unwrap();
    assert!(store.dead_letters(Some(&stream), 100).await.unwrap().is_empty());
    let rows: Vec<(i64, Vec<u8>)> = outbox_rows(store.client(), &stream).await;
    assert_eq!(rows, [(6, b"m1".to_vec())], "only the requeued record, alive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_store_takes_many_streams_at_once_a_poisoned_one_aside_and_wakes_each_journal_for_its_own() {
    use egress_store::JournalStore as _;
    use egress_store::postgres::PgJournal;
    let Some(url) = database().await else { return };
    let mut client = app(&url).await;
    let prefix = fresh("many");
    let names: Vec<String> = (0..5).map(|i| format!("{prefix}/{i}")).collect();
    // Stream i holds i records; stream 3 has its first acknowledged.
    for (i, name) in names.iter().enumerate() {
        let tx = client.transaction().await.unwrap();
        let outbox = PgOutbox::new(name.clone());
        for n in 0..i {
            outbox.append(&tx, format!("{i}.{n}").as_bytes()).await.unwrap();
        }
        tx.commit().await.unwrap();
    }
    client.execute("UPDATE egress_stream SET acked_through = 0 WHERE stream = $1", &[&names[3]]).await.unwrap();
    client.execute("DELETE FROM egress_outbox WHERE stream = $1 AND seq = 0", &[&names[3]]).await.unwrap();
    // Stream 4's last record carries a dead-letter code no version wrote.
    client
        .execute("UPDATE egress_outbox SET dead_reason = 9 WHERE stream = $1 AND seq = 3", &[&names[4]])
        .await
        .unwrap();
    let store = PgStore::connect(&url, "worker").await.unwrap();
    // Stream 0 has no row (nothing appended): four streams to take.
    let taken = store.take_many(3, LONG).await.unwrap();
    let more = store.take_many(10, LONG).await.unwrap();
    assert_eq!((taken.len(), more.len()), (3, 1), "at most what was asked, each once");
    assert!(store.take_many(10, LONG).await.unwrap().is_empty(), "all held");
    let mut all: Vec<_> = taken.into_iter().chain(more).collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let (poisoned, read) = all.pop().unwrap();
    assert_eq!(poisoned, names[4]);
    assert!(matches!(read, Err(StoreError::OutOfRange { what: "dead_reason", value: 9 })), "{read:?}");
    let mut all: Vec<_> = all.into_iter().map(|(name, read)| (name, read.unwrap())).collect();
    for (name, (lease, loaded)) in &all {
        assert_eq!(name, &lease.stream);
        let i: usize = name.rsplit('/').next().unwrap().parse().unwrap();
        let from = usize::from(i == 3);
        let records: Vec<(u64, Bytes)> =
            loaded.restored.records.iter().map(|r| (r.sequence.0, r.payload.clone())).collect();
        let expected: Vec<(u64, Bytes)> = (from..i).map(|n| (n as u64, Bytes::from(format!("{i}.{n}")))).collect();
        assert_eq!(records, expected, "stream {i} loaded with its own records, the poisoned one aside");
        assert_eq!(loaded.restored.next_sequence, Sequence(i as u64));
    }
    // Two journals on the one connection: an append to one stream wakes
    // that stream's journal only (the poll fallback set far away).
    let hour = Duration::from_secs(3600);
    let (_, (lease_1, _)) = all.remove(0);
    let (_, (lease_2, _)) = all.remove(0);
    let mut one = PgJournal::new(store.clone(), lease_1, LONG, hour);
    let mut two = PgJournal::new(store.clone(), lease_2, LONG, hour);
    assert!(one.changed().await.unwrap() && two.changed().await.unwrap(), "a new journal reads once");
    assert!(!one.changed().await.unwrap() && !two.changed().await.unwrap());
    let tx = client.transaction().await.unwrap();
    PgOutbox::new(names[2].clone()).append(&tx, b"news").await.unwrap();
    tx.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), two.news()).await.expect("stream 2's journal is woken");
    assert!(two.changed().await.unwrap());
    assert!(!one.changed().await.unwrap(), "stream 1's journal is not");
    assert_eq!(two.appended(Sequence(2), 10).await.unwrap(), [(Sequence(2), Bytes::from_static(b"news"))]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_journal_without_news_reads_the_outbox_at_each_poll_and_not_between() {
    use egress_store::JournalStore as _;
    use egress_store::postgres::PgJournal;
    let Some(url) = database().await else { return };
    let stream = fresh("poll");
    let store = PgStore::connect(&url, "worker").await.unwrap();
    let (lease, _) = store.take_stream(&stream, LONG).await.unwrap().unwrap();
    // Virtual time from here: the poll is the only thing that moves.
    tokio::time::pause();
    let poll = Duration::from_secs(10);
    let mut journal = PgJournal::new(store.clone(), lease, LONG, poll);
    assert_eq!(journal.stream(), stream, "the relay's events name the stream");
    assert_eq!(PgOutbox::new(stream.clone()).stream(), stream);
    assert_eq!(format!("{store:?}"), r#"PgStore { worker: "worker", .. }"#);
    assert!(journal.changed().await.unwrap(), "a new journal reads once");
    assert!(!journal.changed().await.unwrap());
    for round in 0..3 {
        tokio::time::advance(poll - Duration::from_millis(1)).await;
        assert!(!journal.changed().await.unwrap(), "round {round}: before the poll");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(journal.changed().await.unwrap(), "round {round}: at the poll");
        assert!(!journal.changed().await.unwrap(), "round {round}: right after it");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applications_open_transaction_on_one_stream_stalls_no_other_stream_on_the_connection() {
    let Some(url) = database().await else { return };
    let (a, b) = (fresh("held"), fresh("free"));
    let store = PgStore::connect(&url, "worker").await.unwrap();
    let (lease_a, loaded_a) = store.take_stream(&a, LONG).await.unwrap().unwrap();
    let (lease_b, loaded_b) = store.take_stream(&b, LONG).await.unwrap().unwrap();
    let mut core_a = EgressCore::restore(Policy::default(), loaded_a.restored).unwrap();
    let mut core_b = EgressCore::restore(Policy::default(), loaded_b.restored).unwrap();
    // The application appends to A and keeps its transaction open.
    let mut client = app(&url).await;
    let tx = client.transaction().await.unwrap();
    PgOutbox::new(a.clone()).append(&tx, b"theirs").await.unwrap();
    let _ = core_a.enqueue(Bytes::from_static(b"mine"));
    let _ = core_b.enqueue(Bytes::from_static(b"b0"));
    let started = std::time::Instant::now();
    let refused = flush(&mut core_a, &store, &lease_a).await;
    assert!(matches!(refused, Err(StoreError::Busy { ref stream }) if *stream == a), "{refused:?}");
    flush(&mut core_b, &store, &lease_b).await.unwrap();
    store.renew(&lease_b, LONG).await.unwrap();
    store.renew(&lease_a, LONG).await.expect("a lease is renewed while the application holds its stream's row");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "A's held row cost no more than the lock timeout: {:?}",
        started.elapsed()
    );
    assert_eq!(outbox_rows(store.client(), &b).await, [(0, b"b0".to_vec())], "B went on");
    // Once the application commits, A's own append meets the application's.
    tx.commit().await.unwrap();
    match flush(&mut core_a, &store, &lease_a).await {
        Err(StoreError::Conflict { stored: 1, expected: 0, .. }) => {}
        other => panic!("expected a conflict, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_stream_rows_fail_only_themselves_and_any_lease_duration_is_taken() {
    let Some(url) = database().await else { return };
    let client = app(&url).await;
    let prefix = fresh("hostile");
    let store = PgStore::connect(&url, "setup").await.unwrap();
    for name in ["a", "b", "c", "d"] {
        let (lease, _) = store.take_stream(&format!("{prefix}/{name}"), LONG).await.unwrap().unwrap();
        store.release(&lease).await.unwrap();
    }
    // b's lease number can rise no more; c's watermark and counter are at
    // the top of the range.
    client
        .execute("UPDATE egress_lease SET lease = 9223372036854775807 WHERE stream = $1", &[&format!("{prefix}/b")])
        .await
        .unwrap();
    client
        .execute(
            "UPDATE egress_stream SET acked_through = 9223372036854775807, next_sequence = 9223372036854775807
             WHERE stream = $1",
            &[&format!("{prefix}/c")],
        )
        .await
        .unwrap();
    let worker = PgStore::connect(&url, "worker").await.unwrap();
    let taken = worker.take_many(10, Duration::MAX).await.unwrap();
    let names: Vec<&str> = taken.iter().map(|(n, _)| n.rsplit('/').next().unwrap()).collect();
    assert_eq!(names, ["a", "c", "d"], "b is never taken: no lease number above its own");
    assert!(taken[0].1.is_ok() && taken[2].1.is_ok());
    assert!(matches!(taken[1].1, Err(StoreError::OutOfRange { .. })), "{:?}", taken[1].1);
    let until: bool = client
        .query_one(
            "SELECT until > now() + interval '50 years' FROM egress_lease WHERE stream = $1",
            &[&format!("{prefix}/a")],
        )
        .await
        .unwrap()
        .get(0);
    assert!(until, "a lease of Duration::MAX is taken as the longest lease");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_apply_refuses_arguments_that_break_the_stores_rules() {
    let Some(url) = database().await else { return };
    let client = app(&url).await;
    let stream = fresh("direct");
    let store = PgStore::connect(&url, "worker").await.unwrap();
    let (lease, loaded) = store.take_stream(&stream, LONG).await.unwrap().unwrap();
    let mut core = EgressCore::restore(Policy::default(), loaded.restored).unwrap();
    let _ = core.enqueue_all((0..3).map(|i| Bytes::from(format!("m{i}"))));
    flush(&mut core, &store, &lease).await.unwrap();
    let number = i64::try_from(lease.number).unwrap();
    // Each call as an operator would type it.
    let cases = [
        // A gap in the appends.
        "SELECT egress_apply($1, $2, 3, ARRAY[3,10]::bigint[], ARRAY['x','y']::bytea[], NULL, '{}', '{}', '{}', NULL, true)",
        // Payloads that do not match the appends.
        "SELECT egress_apply($1, $2, 3, ARRAY[3]::bigint[], ARRAY['x','y']::bytea[], NULL, '{}', '{}', '{}', NULL, true)",
        // A watermark beyond the counter.
        "SELECT egress_apply($1, $2, 3, '{}', '{}', NULL, '{}', '{}', '{}', 100, true)",
        // Dead-letter arrays of different lengths.
        "SELECT egress_apply($1, $2, 3, '{}', '{}', NULL, ARRAY[1,2]::bigint[], ARRAY[0]::smallint[], ARRAY[true]::boolean[], NULL, true)",
    ];
    for sql in cases {
        let refused = client.query_one(sql, &[&stream, &number]).await;
        assert!(refused.is_err(), "{sql}");
    }
    let rows: Vec<i64> = outbox_rows(&client, &stream).await.into_iter().map(|(s, _)| s).collect();
    assert_eq!(rows, [0, 1, 2], "nothing written by a refused call");
    let row = client
        .query_one("SELECT next_sequence, acked_through FROM egress_stream WHERE stream = $1", &[&stream])
        .await
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, Option<i64>>(1)), (3, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_connection_is_killed_stops_and_its_stream_is_taken_over() {
    use egress_reactive::{AsyncContext, CellOptions};
    use egress_store::RelayConfig;
    use egress_store::postgres::open_durable;
    let Some(url) = database().await else { return };
    let client = app(&url).await;
    let stream = fresh("killed");
    let lease = Duration::from_millis(500);
    let cx = AsyncContext::new();
    let store = PgStore::connect(&url, "worker-a").await.unwrap();
    let pid: i32 = store.client().query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let (_, a) =
        open_durable(&cx, &store, Some(&stream), lease, Policy::default(), CellOptions::new(), RelayConfig::default())
            .await
            .unwrap()
            .unwrap();
    a.cell.enqueue(Bytes::from_static(b"before"));
    for _ in 0..1_000 {
        if a.cell.durable_through().get_untracked() == Some(Sequence(0)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(a.cell.durable_through().get_untracked(), Some(Sequence(0)));
    client.execute("SELECT pg_terminate_backend($1)", &[&pid]).await.unwrap();
    for _ in 0..1_000 {
        if a.relay.stats().fenced {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(store.is_closed());
    assert!(a.relay.stats().fenced, "the relay stopped: {:?}", a.relay.stats());
    // Another worker takes the stream once the lease runs out, with the record.
    let b = PgStore::connect(&url, "worker-b").await.unwrap();
    let mut taken = None;
    for _ in 0..1_000 {
        taken = b.take_stream(&stream, lease).await.unwrap();
        if taken.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, loaded) = taken.expect("taken over after the lease");
    let records: Vec<Bytes> = loaded.restored.records.iter().map(|r| r.payload.clone()).collect();
    assert_eq!(records, [Bytes::from_static(b"before")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_cell_on_postgres_gets_its_own_and_the_outboxs_typed_messages_back_after_a_takeover() {
    use egress_codec::Json;
    use egress_reactive::{AsyncContext, CellOptions};
    use egress_store::RelayConfig;
    use egress_store::postgres::open_durable_with;

    #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Line {
        text: String,
        n: u32,
    }
    let line = |n: u32| Line { text: format!("line {n}"), n };
    let Some(url) = database().await else { return };
    let stream = fresh("typed");
    let cx = AsyncContext::new();
    let store = PgStore::connect(&url, "a").await.unwrap();
    async fn open(cx: &AsyncContext, store: &PgStore, stream: &str) -> egress_store::Durable<Line> {
        let config = RelayConfig::default();
        let opened =
            open_durable_with(cx, store, Some(stream), LONG, Json, Policy::default(), CellOptions::new(), config);
        opened.await.unwrap().unwrap().1
    }
    let d = open(&cx, &store, &stream).await;
    d.cell.enqueue(line(0));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while d.cell.durable_through().get_untracked() != Some(Sequence(0)) {
        assert!(tokio::time::Instant::now() < deadline, "written");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The application appends a typed message in its own transaction.
    let mut client = app(&url).await;
    let tx = client.transaction().await.unwrap();
    let seq = PgOutbox::new(stream.clone()).append_encoded(&tx, &Json, &line(1)).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(seq, Sequence(1));
    while d.cell.pending_len().get_untracked() != 2 {
        assert!(tokio::time::Instant::now() < deadline, "adopted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let typed = |cell: &egress_reactive::AsyncEgressCell<Line>| {
        cell.pending().get_untracked().iter().map(|e| (e.sequence.get(), e.payload.clone())).collect::<Vec<_>>()
    };
    assert_eq!(typed(&d.cell), vec![(0, line(0)), (1, line(1))]);
    // Stored as JSON.
    let rows = outbox_rows(&client, &stream).await;
    assert_eq!(rows[0].1, serde_json::to_vec(&line(0)).unwrap());
    // Released, then taken by another store: the same typed messages.
    let _ = d.relay.shutdown().await;
    let other = PgStore::connect(&url, "b").await.unwrap();
    let again = open(&cx, &other, &stream).await;
    assert_eq!(typed(&again.cell), vec![(0, line(0)), (1, line(1))]);
    let _ = again.relay.shutdown().await;
    // A record that is not the JSON of a line refuses the open, and stays.
    let tx = client.transaction().await.unwrap();
    PgOutbox::new(stream.clone()).append(&tx, b"{oops").await.unwrap();
    tx.commit().await.unwrap();
    let third = PgStore::connect(&url, "c").await.unwrap();
    let refused = open_durable_with::<Line>(
        &cx,
        &third,
        Some(&stream),
        LONG,
        Json,
        Policy::default(),
        CellOptions::new(),
        RelayConfig::default(),
    )
    .await
    .expect_err("refused");
    assert!(matches!(refused, StoreError::Undecodable { sequence: Sequence(2), .. }), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_durable_many_starts_a_cell_per_free_stream_with_its_records() {
    use egress_reactive::{AsyncContext, CellOptions};
    use egress_store::RelayConfig;
    use egress_store::postgres::open_durable_many;
    let Some(url) = database().await else { return };
    let mut client = app(&url).await;
    let prefix = fresh("opened");
    for i in 1..=3u64 {
        let tx = client.transaction().await.unwrap();
        for n in 0..i {
            PgOutbox::new(format!("{prefix}/{i}")).append(&tx, format!("{i}.{n}").as_bytes()).await.unwrap();
        }
        tx.commit().await.unwrap();
    }
    let cx = AsyncContext::new();
    let store = PgStore::connect(&url, "worker").await.unwrap();
    let opened =
        open_durable_many(&cx, &store, 10, LONG, Policy::default(), CellOptions::new(), RelayConfig::default()).await;
    let mut opened = opened.unwrap();
    opened.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(opened.len(), 3, "every free stream, once");
    for (i, (name, durable)) in opened.into_iter().enumerate() {
        let i = i as u64 + 1;
        assert_eq!(name, format!("{prefix}/{i}"));
        let durable = durable.unwrap();
        let pending: Vec<Bytes> = durable.cell.pending().get_untracked().iter().map(|e| e.payload.clone()).collect();
        assert_eq!(pending, (0..i).map(|n| Bytes::from(format!("{i}.{n}"))).collect::<Vec<_>>());
        let _ = durable.relay.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_workers_lease_outlasts_an_application_transaction_holding_its_stream_on_a_busy_machine() {
    use egress_reactive::{AsyncContext, CellOptions};
    use egress_store::RelayConfig;
    use egress_store::postgres::open_durable;

    let Some(url) = database().await else { return };
    let stream = fresh("held-lease");
    let cx = AsyncContext::new();
    let a = PgStore::connect(&url, "worker-a").await.unwrap();
    let lease = Duration::from_millis(400);
    let (_, d) =
        open_durable(&cx, &a, Some(&stream), lease, Policy::default(), CellOptions::new(), RelayConfig::default())
            .await
            .unwrap()
            .unwrap();
    let busy = egress_testkit::Contention::start(2);
    // An application appends to the stream and keeps its transaction (and
    // the stream's row) open for five leases, then commits; A's cell has a
    // record of its own to write meanwhile (every commit of it refused
    // until then).
    let mut client = app(&url).await;
    let tx = client.transaction().await.unwrap();
    PgOutbox::new(stream.clone()).append(&tx, b"theirs").await.unwrap();
    d.cell.enqueue(Bytes::from_static(b"mine"));
    let b = PgStore::connect(&url, "worker-b").await.unwrap();
    let try_take = || async {
        match b.take_stream(&stream, lease).await {
            Ok(None) | Err(StoreError::Busy { .. }) => {}
            other => panic!("worker B took A's stream while A lives: {other:?}"),
        }
    };
    let held = tokio::time::Instant::now() + lease * 5;
    while tokio::time::Instant::now() < held {
        try_take().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tx.commit().await.unwrap();
    // From the commit on, for two more leases: still A's.
    let after = tokio::time::Instant::now() + lease * 2;
    while tokio::time::Instant::now() < after {
        try_take().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A wrote its record behind the application's, never fenced.
    egress_testkit::until(
        || (d.cell.durable_through().get_untracked() == Some(Sequence(1))).then_some(()),
        || format!("{:?}", d.relay.stats()),
    )
    .await;
    assert!(!d.relay.stats().fenced, "{:?}", d.relay.stats());
    assert!(busy.stop().iter().all(|&spins| spins > 0), "the machine was busy");
}

/// One lease row held by another session (a lock taken by hand, or a take
/// in progress) delays no other lease of the store: the renewal skips that
/// row, renews the rest, and tries the held one again until it gets
/// through. No other store takes any of them meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_row_held_by_another_session_keeps_no_other_lease_from_its_renewal() {
    use egress_reactive::{AsyncContext, CellOptions};
    use egress_store::RelayConfig;
    use egress_store::postgres::{MIN_LEASE, open_durable};

    let Some(url) = database().await else { return };
    let cx = AsyncContext::new();
    let a = PgStore::connect(&url, "worker-a").await.unwrap();
    let prefix = fresh("held-row");
    let mut held = Vec::new();
    for i in 0..3 {
        let name = format!("{prefix}/{i}");
        let opened = open_durable(
            &cx,
            &a,
            Some(&name),
            MIN_LEASE,
            Policy::default(),
            CellOptions::new(),
            RelayConfig::default(),
        );
        held.push(opened.await.unwrap().unwrap().1);
    }
    let mut client = app(&url).await;
    let tx = client.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM egress_lease WHERE stream = $1 FOR SHARE", &[&format!("{prefix}/0")]).await.unwrap();
    let b = PgStore::connect(&url, "worker-b").await.unwrap();
    let until = tokio::time::Instant::now() + MIN_LEASE * 3;
    while tokio::time::Instant::now() < until {
        for (i, d) in held.iter().enumerate().skip(1) {
            let bound = (*d.relay.lease().unwrap().borrow()).unwrap();
            assert!(bound > tokio::time::Instant::now(), "stream {i}'s lease held");
        }
        let taken = b.take_many(10, MIN_LEASE).await.unwrap();
        assert!(taken.iter().all(|(name, _)| !name.starts_with(&prefix)), "B took {taken:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The held row's lease ran out meanwhile (no renewal got through); the
    // row let go, it is renewed, and still A's.
    tx.rollback().await.unwrap();
    let first = held[0].relay.lease().unwrap();
    egress_testkit::until(
        || first.borrow().is_some_and(|b| b > tokio::time::Instant::now() + MIN_LEASE / 2).then_some(()),
        || format!("{:?}", *first.borrow()),
    )
    .await;
    assert!(held.iter().all(|d| !d.relay.stats().fenced));
}

/// Hostile lease rows: an end of `-infinity` (sorted before every real
/// one) fails no take, and a stream whose lease row was deleted says so
/// rather than looking held forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_ending_at_minus_infinity_fails_no_take_and_a_deleted_lease_row_is_named() {
    let Some(url) = database().await else { return };
    let client = app(&url).await;
    let prefix = fresh("infinite");
    let store = PgStore::connect(&url, "setup").await.unwrap();
    for name in ["a", "b", "c"] {
        let (lease, _) = store.take_stream(&format!("{prefix}/{name}"), LONG).await.unwrap().unwrap();
        store.release(&lease).await.unwrap();
    }
    client
        .execute(
            "UPDATE egress_lease SET owner = 'x', until = '-infinity' WHERE stream = $1",
            &[&format!("{prefix}/b")],
        )
        .await
        .unwrap();
    let worker = PgStore::connect(&url, "worker").await.unwrap();
    let taken = worker.take_many(10, LONG).await.unwrap();
    let names: Vec<&str> = taken.iter().map(|(n, _)| n.rsplit('/').next().unwrap()).collect();
    assert_eq!(names, ["a", "b", "c"], "every stream taken, the infinitely expired one too");
    assert!(taken.iter().all(|(_, t)| t.is_ok()));
    // Deleted by hand: named, not "held".
    let gone = format!("{prefix}/d");
    let (lease, _) = store.take_stream(&gone, LONG).await.unwrap().unwrap();
    store.release(&lease).await.unwrap();
    client.execute("DELETE FROM egress_lease WHERE stream = $1", &[&gone]).await.unwrap();
    match worker.take_stream(&gone, LONG).await {
        Err(StoreError::NoLease { stream }) => assert_eq!(stream, gone),
        other => panic!("expected NoLease, got {other:?}"),
    }
}

/// A store dropped takes its tasks with it: its connection's and its lease
/// keeper's (which would otherwise wait for leases that never come).
#[tokio::test]
async fn a_dropped_store_leaves_no_task_behind() {
    let Some(url) = database().await else { return };
    let metrics = tokio::runtime::Handle::current().metrics();
    // (The setup's own connection ends first.)
    let idle = || (metrics.num_alive_tasks() == 0).then_some(());
    egress_testkit::until(idle, || format!("{} tasks alive before the store", metrics.num_alive_tasks())).await;
    let store = PgStore::connect(&url, "gone").await.unwrap();
    assert_eq!(metrics.num_alive_tasks(), 2, "its connection and its lease keeper");
    assert_eq!(store.lease_stats(), egress_store::postgres::LeaseStats::default());
    drop(store);
    egress_testkit::until(idle, || format!("{} tasks alive after the store", metrics.num_alive_tasks())).await;
}
