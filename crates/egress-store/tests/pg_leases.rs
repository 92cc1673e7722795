//! What a worker's lease keeper says, through `tracing`, against a real
//! PostgreSQL: a lease that runs out while its worker lives (its renewals
//! held up by another session's lock on the lease row) is told apart from a
//! lease lost to another worker and from a takeover of a dead worker's
//! stream; and the bound the keeper publishes says the same. Alone in its
//! binary: it installs the global subscriber (`tracing` caches per call
//! site whether anyone listens). Without `EGRESS_PG_URL` it does nothing
//! (see tests/postgres.rs).
#![cfg(all(feature = "postgres", feature = "relay"))]
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use egress_core::Policy;
use egress_reactive::{AsyncContext, CellOptions};
use egress_store::RelayConfig;
use egress_store::postgres::{PgStore, migrate, open_durable};
use egress_testkit::{Metrics, fresh, until};
use tokio::time::Instant;
use tracing_subscriber::layer::SubscriberExt as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapse_a_loss_and_a_takeover_are_each_told_apart() {
    let metrics = Metrics::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(metrics.clone())).unwrap();
    let Some(url) = egress_testkit::pg_database("egress_lease").await else { return };
    let (mut admin, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    migrate(&mut admin).await.unwrap();
    let counted = |name: &str| metrics.sum(&format!("monotonic_counter.egress_lease_{name}")) as u64;
    let cx = AsyncContext::new();
    let stream = fresh("lapse");
    let a = PgStore::connect(&url, "a").await.unwrap();
    let lease = Duration::from_millis(600);
    let (_, d) =
        open_durable(&cx, &a, Some(&stream), lease, Policy::default(), CellOptions::new(), RelayConfig::default())
            .await
            .unwrap()
            .unwrap();
    let bound = d.relay.lease().expect("a PostgreSQL relay holds its stream by a lease");
    let held = || bound.borrow().is_some_and(|b| b > Instant::now() + lease / 2);
    until(|| held().then_some(()), || format!("{:?}", *bound.borrow())).await;

    // Another session locks A's lease row: A's renewals cannot get through
    // and its bound passes. A lapse, said once; nothing lost.
    let tx = admin.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM egress_lease WHERE stream = $1 FOR UPDATE", &[&stream]).await.unwrap();
    until(|| (counted("lapsed") == 1).then_some(()), || format!("{:?}", metrics.names())).await;
    assert!(bound.borrow().is_some_and(|b| b <= Instant::now()), "the bound is in the past");
    tokio::time::sleep(lease).await;
    assert_eq!((counted("lapsed"), counted("lost")), (1, 0), "said once");
    // The lock goes: the next renewal gets through and the bound moves on.
    tx.rollback().await.unwrap();
    until(|| held().then_some(()), || format!("{:?}", *bound.borrow())).await;
    assert!(!d.relay.stats().fenced);

    // Again, and this time the lock's holder takes the stream (as a worker
    // would, once A's lease ran out): A's lease ran out while it lived,
    // then was lost; its relay stops.
    let tx = admin.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM egress_lease WHERE stream = $1 FOR UPDATE", &[&stream]).await.unwrap();
    until(|| (counted("lapsed") == 2).then_some(()), || format!("{:?}", metrics.names())).await;
    tx.execute(
        "UPDATE egress_lease SET lease = lease + 1, owner = 'b', until = now() + interval '1 hour' WHERE stream = $1",
        &[&stream],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    until(|| bound.borrow().is_none().then_some(()), || format!("{:?}", *bound.borrow())).await;
    until(|| d.relay.stats().fenced.then_some(()), || format!("{:?}", d.relay.stats())).await;
    assert_eq!(counted("lost"), 1);
    assert_eq!(counted("takeovers"), 0, "no store took it through a take");
    let stats = a.lease_stats();
    assert_eq!((stats.lapsed, stats.lost_after_lapse, stats.lost_while_valid), (2, 1, 0), "{stats:?}");
    assert!(stats.renewed >= 1 && stats.busy >= 2, "renewed, and skipped while the row was held: {stats:?}");

    // A dead worker: its journal dropped with no release, its lease left
    // to run out; another store takes the stream over and says so.
    let other = fresh("dead");
    let (_, dead) =
        open_durable(&cx, &a, Some(&other), lease, Policy::default(), CellOptions::new(), RelayConfig::default())
            .await
            .unwrap()
            .unwrap();
    drop(dead);
    let b = PgStore::connect(&url, "b").await.unwrap();
    let taken = until_taken(&b, &other, lease).await;
    assert_eq!(taken, 2, "the second take");
    assert_eq!(counted("takeovers"), 1);
    assert_eq!((counted("lapsed"), counted("lost")), (2, 1), "the dead worker's journal said nothing more");
}

/// Takes `stream` with `store` once its lease has run out; the lease number.
async fn until_taken(store: &PgStore, stream: &str, lease: Duration) -> u64 {
    let deadline = Instant::now() + egress_testkit::limit();
    loop {
        if let Some((taken, _)) = store.take_stream(stream, lease).await.unwrap() {
            return taken.number;
        }
        assert!(Instant::now() < deadline, "never free");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
