#![allow(clippy::unwrap_used)]
//! End to end over real sockets on 127.0.0.1: a sender and a receiver
//! through a proxy that kills connections at seeded random moments, with
//! acknowledgements dropped, duplicated and delayed, the receiver
//! restarting, the sender restarting on the same cell, and hostile input.
//! In every case the application sees 0..N exactly once and in order, and
//! the sender ends with nothing pending, in flight or parked.

use std::time::Duration;

use bytes::Bytes;
use egress_core::{Delay, Policy, Sequence};
use egress_reactive::{AsyncContext, AsyncEgressCell};
use egress_ws::protocol::{CloseCode, Frame, Limits};
use egress_ws::{AckFaults, Chaos, ChaosProxy, Receiver, ReceiverConfig, Sender, SenderConfig};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

const LIMIT: Duration = Duration::from_secs(60);

fn policy() -> Policy {
    Policy::builder()
        .inflight_limit(64)
        .retry_budget(1_000)
        .retry_base(Delay(5))
        .retry_ceiling(Delay(50))
        .build()
        .unwrap()
}

fn sender_config(seed: u64) -> SenderConfig {
    SenderConfig {
        backoff_base: Duration::from_millis(2),
        backoff_max: Duration::from_millis(50),
        stall_timeout: Some(Duration::from_millis(300)),
        seed,
        ..SenderConfig::new("producer-1")
    }
}

fn payload(i: u64) -> Bytes {
    Bytes::from(format!("message {i}"))
}

/// Receives until `n` deliveries, checking each is the next in order.
async fn receive_in_order(receiver: &mut Receiver, from: u64, n: u64) {
    let mut next = from;
    while next < n {
        let d = tokio::time::timeout(LIMIT, receiver.recv()).await.expect("deliveries keep coming").unwrap();
        assert_eq!((&*d.producer, d.sequence), ("producer-1", next), "in order, no duplicates");
        assert_eq!(d.payload, payload(next));
        next += 1;
    }
}

/// Waits until the sender's cell has nothing left.
async fn drained(cell: &AsyncEgressCell<Bytes>, n: u64) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    while cell.acked_through().get_untracked() != Some(Sequence(n - 1)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "acknowledged through {:?}",
            cell.acked_through().get_untracked()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(cell.pending_len().get() + cell.inflight_len().get() + cell.parked_len().get(), 0);
}

async fn run_through_chaos(seed: u64, n: u64, faults: AckFaults) -> (u64, u64) {
    let config = ReceiverConfig { ack_faults: faults, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let chaos = Chaos { seed, mean_interval: Duration::from_millis(40) };
    let proxy = ChaosProxy::start(receiver.local_addr(), Some(chaos)).await.unwrap();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", proxy.local_addr()), sender_config(seed));
    for i in 0..n {
        cell.enqueue(payload(i));
        if i % 500 == 0 {
            tokio::task::yield_now().await;
        }
    }
    receive_in_order(&mut receiver, 0, n).await;
    drained(&cell, n).await;
    let stats = sender.shutdown().await;
    assert_eq!(receiver.stats().delivered, n);
    (proxy.kills(), stats.reconnects)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_kills_lose_and_duplicate_nothing() {
    let mut kills = 0;
    for seed in [1, 2, 3] {
        let (k, _) = run_through_chaos(seed, 3_000, AckFaults::default()).await;
        kills += k;
    }
    assert!(kills > 0, "the proxy killed connections");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_dropped_duplicated_and_delayed_change_nothing() {
    let faults =
        AckFaults { drop: 0.3, duplicate: 0.3, delay_probability: 0.3, delay: Duration::from_millis(20), seed: 9 };
    run_through_chaos(4, 3_000, faults).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_restarts_without_memory_does_not_wedge() {
    let mut first = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let addr = first.local_addr();
    let proxy = ChaosProxy::start(addr, None).await.unwrap();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", proxy.local_addr()), sender_config(5));
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
    let first = Sender::spawn(cell.clone(), url.clone(), sender_config(6));
    for i in 0..2_000 {
        cell.enqueue(payload(i));
    }
    receive_in_order(&mut receiver, 0, 500).await;
    first.shutdown().await;
    let second = Sender::spawn(cell.clone(), url, sender_config(7));
    receive_in_order(&mut receiver, 500, 2_000).await;
    drained(&cell, 2_000).await;
    second.shutdown().await;
    assert_eq!(receiver.stats().delivered, 2_000);
}

type Client = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn raw_client(receiver: &Receiver) -> Client {
    tokio_tungstenite::connect_async(format!("ws://{}", receiver.local_addr())).await.unwrap().0
}

/// The frame the receiver closes with, if any.
async fn close_code(ws: &mut Client) -> Option<CloseCode> {
    while let Some(Ok(msg)) = ws.next().await {
        if let Message::Binary(b) = msg
            && let Ok(Frame::Close { code, .. }) = Frame::decode(&b, Limits::default())
        {
            return Some(code);
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_closes_that_connection_and_nothing_else() {
    let config = ReceiverConfig { limits: Limits { max_payload: 1_024 }, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let hello = |generation| Frame::Handshake { producer: "producer-1".into(), generation, resume_from: 0 };
    let bad: Vec<(&str, Vec<Message>)> = vec![
        ("garbage", vec![Message::Binary(Bytes::from_static(b"\x00\xff garbage"))]),
        ("truncated handshake", vec![Message::Binary(hello(1).encode().slice(..7))]),
        ("text", vec![Message::text("hello")]),
        (
            "data before the handshake",
            vec![Message::Binary(Frame::Data { generation: 1, sequence: 0, attempt: 1, payload: payload(0) }.encode())],
        ),
        (
            "oversized payload",
            vec![
                Message::Binary(hello(1).encode()),
                Message::Binary(
                    Frame::Data { generation: 1, sequence: 0, attempt: 1, payload: Bytes::from(vec![7; 2_000]) }
                        .encode(),
                ),
            ],
        ),
        (
            "a data frame of another generation",
            vec![
                Message::Binary(hello(2).encode()),
                Message::Binary(Frame::Data { generation: 1, sequence: 0, attempt: 1, payload: payload(0) }.encode()),
            ],
        ),
        (
            "an ack from a producer",
            vec![
                Message::Binary(hello(3).encode()),
                Message::Binary(Frame::Ack { generation: 3, through: 99 }.encode()),
            ],
        ),
        (
            "unknown frame type",
            vec![Message::Binary(hello(4).encode()), Message::Binary(Bytes::from_static(&[0x42, 1, 2]))],
        ),
    ];
    for (what, messages) in bad {
        let mut ws = raw_client(&receiver).await;
        for m in messages {
            let _ = ws.send(m).await;
        }
        let code = close_code(&mut ws).await;
        assert!(matches!(code, Some(CloseCode::Protocol | CloseCode::Version)), "{what}: closed with {code:?}");
    }
    assert!(receiver.stats().rejected >= 8);
    assert_eq!(receiver.stats().delivered, 0, "nothing hostile was delivered");
    // A stale generation is refused as such.
    let mut ws = raw_client(&receiver).await;
    ws.send(Message::Binary(hello(1).encode())).await.unwrap();
    assert_eq!(close_code(&mut ws).await, Some(CloseCode::StaleGeneration));
    // And a well-behaved producer still gets everything through.
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), sender_config(8));
    for i in 0..100 {
        cell.enqueue(payload(i));
    }
    receive_in_order(&mut receiver, 0, 100).await;
    drained(&cell, 100).await;
    sender.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_refuses_an_ack_from_the_future_and_loses_nothing() {
    // A fake receiver that acknowledges through 1,000,000 on its first
    // connection, then behaves (by handing over to a real one).
    let real = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let fake = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake_addr = fake.local_addr().unwrap();
    let real_addr = real.local_addr();
    tokio::spawn(async move {
        let (stream, _) = fake.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(stream).await.unwrap();
        let Some(Ok(Message::Binary(b))) = ws.next().await else { return };
        let Ok(Frame::Handshake { generation, .. }) = Frame::decode(&b, Limits::default()) else { return };
        ws.send(Message::Binary(Frame::Welcome { generation, next: 0 }.encode())).await.unwrap();
        ws.send(Message::Binary(Frame::Ack { generation, through: 1_000_000 }.encode())).await.unwrap();
        // Later connections go to the real receiver.
        while let Ok((client, _)) = fake.accept().await {
            tokio::spawn(async move {
                let server = tokio::net::TcpStream::connect(real_addr).await.unwrap();
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::select! {
                    _ = tokio::io::copy(&mut cr, &mut sw) => {}
                    _ = tokio::io::copy(&mut sr, &mut cw) => {}
                }
            });
        }
    });
    let mut real = real;
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    for i in 0..200 {
        cell.enqueue(payload(i));
    }
    let sender = Sender::spawn(cell.clone(), format!("ws://{fake_addr}"), sender_config(9));
    receive_in_order(&mut real, 0, 200).await;
    drained(&cell, 200).await;
    let stats = sender.shutdown().await;
    assert!(stats.protocol_errors >= 1, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_generation_fences_the_older_connection() {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let hello = |generation| Frame::Handshake { producer: "producer-1".into(), generation, resume_from: 0 };
    let data = |generation, sequence| Frame::Data { generation, sequence, attempt: 1, payload: payload(sequence) };
    let mut old = raw_client(&receiver).await;
    old.send(Message::Binary(hello(1).encode())).await.unwrap();
    old.send(Message::Binary(data(1, 0).encode())).await.unwrap();
    assert_eq!(receiver.recv().await.unwrap().sequence, 0);
    let mut new = raw_client(&receiver).await;
    new.send(Message::Binary(hello(2).encode())).await.unwrap();
    // The old connection is told it was replaced, and closed.
    assert_eq!(close_code(&mut old).await, Some(CloseCode::Fenced));
    // The new one was welcomed where the stream stands, and goes on.
    let Some(Ok(Message::Binary(b))) = new.next().await else { panic!("no welcome") };
    assert_eq!(Frame::decode(&b, Limits::default()), Ok(Frame::Welcome { generation: 2, next: 1 }));
    new.send(Message::Binary(data(2, 0).encode())).await.unwrap();
    new.send(Message::Binary(data(2, 1).encode())).await.unwrap();
    assert_eq!(receiver.recv().await.unwrap().sequence, 1);
    assert_eq!(receiver.stats().duplicates, 1);
    assert_eq!(receiver.stats().fenced, 1);
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
        let sender = Sender::spawn(cell.clone(), format!("ws://{}", proxy.local_addr()), config);
        for i in 0..1_000 {
            cell.enqueue(payload(i));
        }
        producers.push((cell, sender));
    }
    let mut next = std::collections::HashMap::<String, u64>::new();
    for _ in 0..3_000 {
        let d = tokio::time::timeout(LIMIT, receiver.recv()).await.expect("deliveries keep coming").unwrap();
        let expected = next.entry(d.producer.to_string()).or_insert(0);
        assert_eq!(d.sequence, *expected, "{}: in order, once", d.producer);
        assert_eq!(d.payload, payload(d.sequence));
        *expected += 1;
    }
    assert!(next.values().all(|&n| n == 1_000), "{next:?}");
    for (cell, sender) in producers {
        drained(&cell, 1_000).await;
        sender.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_application_holds_the_producer_back_instead_of_buffering() {
    let config = ReceiverConfig { delivery_buffer: 8, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), sender_config(12));
    for i in 0..500 {
        cell.enqueue(payload(i));
    }
    // The application reads nothing for a while: whatever the timing, no
    // more than the queue's 8 are handed over, and the window fills.
    let deadline = tokio::time::Instant::now() + LIMIT;
    while cell.inflight_len().get() < 64 {
        assert!(tokio::time::Instant::now() < deadline, "the window never filled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(receiver.stats().delivered <= 8, "{:?}", receiver.stats());
    assert!(cell.acked_through().get().is_none_or(|a| a.get() < 8));
    // Then it reads: everything arrives, in order.
    receive_in_order(&mut receiver, 0, 500).await;
    drained(&cell, 500).await;
    sender.shutdown().await;
}
