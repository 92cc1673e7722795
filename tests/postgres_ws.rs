//! egress's crates together, as an application composes them: a durable
//! stream on PostgreSQL (egress-store) sent over WebSocket (egress-ws)
//! while its worker dies and another takes the stream over. (Here, above
//! both, so that the store does not depend on the transport.)
//!
//! The server comes from `EGRESS_PG_URL` (see egress-testkit); without it
//! the test says so and does nothing, unless `EGRESS_PG_REQUIRED` is set.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use egress_core::{Policy, Sequence};
use egress_store::postgres::PgStore;
use egress_testkit::fresh;

fn payload(i: u64) -> Bytes {
    Bytes::from(format!("message {i}"))
}

/// Receives `from..to` from `receiver`, in order, each once.
async fn receive(receiver: &mut egress_ws::Receiver, from: u64, to: u64) {
    for i in from..to {
        let d = tokio::time::timeout(Duration::from_secs(30), receiver.recv()).await.expect("a delivery in time");
        assert_eq!((d.sequence, d.content), (i, egress_ws::Content::Message(payload(i))), "in order, once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_dies_mid_stream_is_taken_over_with_nothing_lost_or_reordered() {
    use egress_reactive::{AsyncContext, CellOptions};
    use egress_store::RelayConfig;
    use egress_store::postgres::open_durable;
    use egress_ws::{Receiver, ReceiverConfig, Sender, SenderConfig};

    let Some(url) = egress_testkit::pg_database("egress_test").await else { return };
    let stream = fresh("relay");
    let lease = Duration::from_millis(300);
    let policy = Policy::builder().inflight_limit(16).build().unwrap();
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let to = format!("ws://{}", receiver.local_addr());

    // Worker A: a durable cell on the stream, its relay keeping the lease,
    // its sender. Everything it enqueues is made durable; half of it gets
    // through.
    let cx_a = AsyncContext::new();
    let store = PgStore::connect(&url, "worker-a").await.unwrap();
    let (_, a) = open_durable(&cx_a, &store, Some(&stream), lease, policy, CellOptions::new(), RelayConfig::default())
        .await
        .unwrap()
        .expect("a free stream");
    let sender_a = Sender::spawn(a.cell.clone(), to.clone(), SenderConfig::new("producer")).unwrap();
    a.cell.enqueue_all((0..200).map(payload));
    receive(&mut receiver, 0, 100).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while a.cell.durable_through().get_untracked() != Some(Sequence(199)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "durable through {:?}",
            a.cell.durable_through().get_untracked()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Held by A: B cannot take it.
    let b_store = PgStore::connect(&url, "worker-b").await.unwrap();
    assert!(b_store.take_stream(&stream, lease).await.unwrap().is_none(), "A's lease runs");
    drop(b_store);

    // A dies without a word: no release, no last write, no close.
    drop(sender_a);
    drop(a);
    drop(cx_a);

    // Worker B takes the stream once A's lease has run out, and goes on.
    let cx_b = AsyncContext::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let b = loop {
        let store = PgStore::connect(&url, "worker-b").await.unwrap();
        // Any free stream: the only one there is.
        if let Some((name, b)) =
            open_durable(&cx_b, &store, None, lease, policy, CellOptions::new(), RelayConfig::default()).await.unwrap()
        {
            assert_eq!(name, stream);
            break b;
        }
        assert!(tokio::time::Instant::now() < deadline, "the lease ran out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(b.cell.next_sequence(), Sequence(200), "every durable record of A is B's");
    let sender_b = Sender::spawn(b.cell.clone(), to, SenderConfig::new("producer")).unwrap();
    b.cell.enqueue_all((200..250).map(payload));
    receive(&mut receiver, 100, 250).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while b.cell.acked_through().get_untracked() != Some(Sequence(249)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "acknowledged through {:?}",
            b.cell.acked_through().get_untracked()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    sender_b.shutdown().await;
    let stats = b.relay.shutdown().await;
    assert!(!stats.fenced && stats.failures == 0, "{stats:?}");
    // Shut down cleanly, B released the stream: it is free at once, and
    // what is stored holds the watermark B reached.
    let c = PgStore::connect(&url, "worker-c").await.unwrap();
    let (_, loaded) = c.take_stream(&stream, lease).await.unwrap().expect("released");
    assert_eq!(loaded.restored.next_sequence, Sequence(250));
    assert_eq!(loaded.restored.acked_through, Some(Sequence(249)), "the shutdown wrote the last watermark");
    assert!(loaded.restored.records.is_empty(), "acknowledged records pruned");
    assert!(receiver.try_recv().is_none(), "nothing delivered twice");
}
