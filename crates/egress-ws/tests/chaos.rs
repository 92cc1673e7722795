#![allow(clippy::unwrap_used)]
//! End to end through chaos, over real sockets on 127.0.0.1: a proxy that
//! kills connections at seeded random moments, acknowledgements dropped,
//! duplicated and delayed, the receiver restarting, the sender restarting
//! on the same cell, several producers at once. In every case the
//! application sees 0..N exactly once and in order, the sender ends with
//! nothing pending, in flight or parked, and the chaos the test relies on
//! happened.

mod common;

use std::time::Duration;

use common::{drained, limit, payload, policy, receive_in_order, sender_config};
use egress_reactive::{AsyncContext, AsyncEgressCell};
use egress_ws::{AckFaults, Chaos, ChaosProxy, Content, Receiver, ReceiverConfig, Sender, SenderConfig};

/// Runs `n` messages through a proxy killing connections on `seed`'s
/// schedule; returns the kills, the sender's reconnects, and the
/// receiver's stats.
async fn run_through_chaos(seed: u64, n: u64, faults: AckFaults) -> (u64, u64, egress_ws::ReceiverStats) {
    let config = ReceiverConfig { ack_faults: faults, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let chaos = Chaos { seed, mean_interval: Duration::from_millis(40) };
    let proxy = ChaosProxy::start(receiver.local_addr(), Some(chaos)).await.unwrap();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", proxy.local_addr()), sender_config(seed)).unwrap();
    for i in 0..n {
        cell.enqueue(payload(i));
        if i % 500 == 0 {
            tokio::task::yield_now().await;
        }
    }
    receive_in_order(&mut receiver, 0, n).await;
    drained(&cell, n).await;
    let stats = sender.shutdown().await;
    let received = receiver.stats();
    assert_eq!(received.delivered, n);
    // Every connection after the first followed a kill (nothing else ends
    // one here), so the kills counted bound the connections seen.
    assert!(
        received.connections.saturating_sub(1) <= proxy.kills(),
        "{} connections after {} kills",
        received.connections,
        proxy.kills()
    );
    (proxy.kills(), stats.reconnects, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_kills_lose_and_duplicate_nothing() {
    let mut kills = 0;
    let mut reconnects = 0;
    for seed in [1, 2, 3] {
        let (k, r, _) = run_through_chaos(seed, 3_000, AckFaults::default()).await;
        kills += k;
        reconnects += r;
    }
    assert!(
        kills > 0 && reconnects > 0,
        "the proxy killed connections ({kills}) and the sender came back ({reconnects})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_dropped_duplicated_and_delayed_change_nothing() {
    let faults =
        AckFaults { drop: 0.3, duplicate: 0.3, delay_probability: 0.3, delay: Duration::from_millis(20), seed: 9 };
    let (_, _, stats) = run_through_chaos(4, 3_000, faults).await;
    assert!(
        stats.acks_dropped > 0 && stats.acks_duplicated > 0 && stats.acks_delayed > 0,
        "the faults happened: {} dropped, {} duplicated, {} delayed",
        stats.acks_dropped,
        stats.acks_duplicated,
        stats.acks_delayed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_restarts_without_memory_does_not_wedge() {
    let mut first = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let addr = first.local_addr();
    let proxy = ChaosProxy::start(addr, None).await.unwrap();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", proxy.local_addr()), sender_config(5)).unwrap();
    for i in 0..1_000 {
        cell.enqueue(payload(i));
    }
    receive_in_order(&mut first, 0, 1_000).await;
    drained(&cell, 1_000).await;
    first.shutdown().await;
    proxy.kill_all();
    // A new receiver on the same address, with no memory of the producer.
    let mut second = Receiver::bind(addr, ReceiverConfig::default()).await.unwrap();
    for i in 1_000..2_000 {
        cell.enqueue(payload(i));
    }
    receive_in_order(&mut second, 1_000, 2_000).await;
    drained(&cell, 2_000).await;
    assert_eq!(second.next_for("producer-1"), Some(2_000));
    assert_eq!(second.stats().connections, 1, "the sender came back to the new receiver");
    sender.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_restarted_on_the_same_cell_continues_the_stream() {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let proxy =
        ChaosProxy::start(receiver.local_addr(), Some(Chaos { seed: 6, mean_interval: Duration::from_millis(50) }))
            .await
            .unwrap();
    let url = format!("ws://{}", proxy.local_addr());
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let first = Sender::spawn(cell.clone(), url.clone(), sender_config(6)).unwrap();
    for i in 0..2_000 {
        cell.enqueue(payload(i));
    }
    receive_in_order(&mut receiver, 0, 500).await;
    first.shutdown().await;
    let second = Sender::spawn(cell.clone(), url, sender_config(7)).unwrap();
    receive_in_order(&mut receiver, 500, 2_000).await;
    drained(&cell, 2_000).await;
    second.shutdown().await;
    assert_eq!(receiver.stats().delivered, 2_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_producers_each_get_their_own_stream() {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let proxy =
        ChaosProxy::start(receiver.local_addr(), Some(Chaos { seed: 11, mean_interval: Duration::from_millis(30) }))
            .await
            .unwrap();
    let cx = AsyncContext::new();
    let mut producers = Vec::new();
    for p in 0..3u64 {
        let cell = AsyncEgressCell::new(&cx, policy());
        let config = SenderConfig { producer: format!("producer-{p}"), ..sender_config(20 + p) };
        let sender = Sender::spawn(cell.clone(), format!("ws://{}", proxy.local_addr()), config).unwrap();
        for i in 0..1_000 {
            cell.enqueue(payload(i));
        }
        producers.push((cell, sender));
    }
    let mut next = std::collections::HashMap::<String, u64>::new();
    for _ in 0..3_000 {
        let d = tokio::time::timeout(limit(), receiver.recv()).await.expect("deliveries keep coming");
        let expected = next.entry(d.producer.to_string()).or_insert(0);
        assert_eq!(d.sequence, *expected, "{}: in order, once", d.producer);
        assert_eq!(d.content, Content::Message(payload(d.sequence)));
        *expected += 1;
    }
    assert!(next.values().all(|&n| n == 1_000), "{next:?}");
    for (cell, sender) in producers {
        drained(&cell, 1_000).await;
        sender.shutdown().await;
    }
    assert!(proxy.kills() > 0, "the proxy killed connections");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_kills_on_demand_and_counts_what_it_killed() {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let proxy = ChaosProxy::start(receiver.local_addr(), None).await.unwrap();
    proxy.kill_all();
    assert_eq!(proxy.kills(), 0, "nothing to kill yet, nothing counted");
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", proxy.local_addr()), sender_config(30)).unwrap();
    cell.enqueue(payload(0));
    receive_in_order(&mut receiver, 0, 1).await;
    drained(&cell, 1).await;
    assert_eq!(receiver.stats().connections, 1);
    proxy.kill_all();
    assert_eq!(proxy.kills(), 1, "one kill, counted once");
    cell.enqueue(payload(1));
    receive_in_order(&mut receiver, 1, 2).await;
    drained(&cell, 2).await;
    assert!(receiver.stats().connections >= 2, "the sender came back after the kill");
    sender.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_next_waits_for_a_connection_and_kills_it() {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let proxy = ChaosProxy::start(receiver.local_addr(), None).await.unwrap();
    // Nothing is open: the kill waits for the first connection.
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let early = tokio::time::timeout(Duration::from_millis(50), proxy.kill_next()).await;
    assert!(early.is_err(), "no connection yet: kill_next is still waiting");
    assert_eq!(proxy.kills(), 0);
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", proxy.local_addr()), sender_config(31)).unwrap();
    for k in 1..=3 {
        // Each call kills exactly one connection: the one open, or the
        // sender's next.
        tokio::time::timeout(Duration::from_secs(20), proxy.kill_next()).await.expect("a connection to kill");
        assert_eq!(proxy.kills(), k);
    }
    cell.enqueue(payload(0));
    receive_in_order(&mut receiver, 0, 1).await;
    drained(&cell, 1).await;
    // Each kill ended one of the sender's connections (or attempts, if it
    // landed before the handshake), and the sender came back each time.
    assert!(sender.shutdown().await.reconnects >= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_proxy_cuts_its_connections_and_takes_no_more() {
    use tokio::io::AsyncReadExt;
    let receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let proxy = ChaosProxy::start(receiver.local_addr(), None).await.unwrap();
    let addr = proxy.local_addr();
    // A first connection, to know the proxy accepts (kill_next waits for it).
    let _first = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::time::timeout(limit(), proxy.kill_next()).await.unwrap();
    let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
    drop(proxy);
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(limit(), client.read(&mut buf)).await.expect("the link is cut, not left open");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    // The listener goes with the proxy (its task is aborted, so it closes
    // when the runtime drops that task: wait for it, within the limit).
    let deadline = tokio::time::Instant::now() + limit();
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(tokio::time::Instant::now() < deadline, "something still listens");
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_schedule_counts_only_kills_that_cut_something() {
    // No connection ever opens: a second of schedule (about 100 ticks, on
    // paused time) kills nothing and counts nothing.
    let receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let chaos = Chaos { seed: 3, mean_interval: Duration::from_millis(10) };
    let proxy = ChaosProxy::start(receiver.local_addr(), Some(chaos)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(proxy.kills(), 0);
}
