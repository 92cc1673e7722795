//! The WebSocket benchmark: messages per second over loopback, the egress
//! cell path against a plain tokio-tungstenite loop that sends the same
//! frames and reads the same acks without a cell; and the time from a killed
//! connection to the first replayed frame acknowledged.
//!
//! Both sides use the reference receiver on 127.0.0.1 and a window of 256
//! messages of 32 bytes, on one multi-thread runtime (2 workers).

use std::time::{Duration, Instant};

use bytes::Bytes;
use egress_core::{Delay, Policy, Sequence};
use egress_reactive::{AsyncContext, AsyncEgressCell};
use egress_ws::protocol::{Frame, Limits};
use egress_ws::{ChaosProxy, Receiver, ReceiverConfig, Sender, SenderConfig};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

pub const WINDOW: usize = 256;

fn payload(i: u64) -> Bytes {
    Bytes::from(format!("{i:032}"))
}

fn policy() -> Policy {
    Policy::builder()
        .inflight_limit(WINDOW)
        .retry_budget(1_000)
        .retry_base(Delay(10))
        .retry_ceiling(Delay(1_000))
        .build()
        .expect("a valid policy")
}

fn sender_config() -> SenderConfig {
    SenderConfig {
        backoff_base: Duration::from_millis(1),
        backoff_max: Duration::from_millis(100),
        ..SenderConfig::new("bench")
    }
}

/// Drains `n` deliveries in order; panics on a gap or a duplicate.
async fn drain(receiver: &mut Receiver, n: u64) {
    for expected in 0..n {
        let d = receiver.recv().await;
        assert_eq!(d.sequence, expected, "in order, once");
    }
}

/// Seconds for `n` messages through an `AsyncEgressCell` and the `Sender`.
pub async fn egress(n: u64) -> Duration {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.expect("bind");
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<Bytes> = AsyncEgressCell::new(&cx, policy());
    let url = format!("ws://{}", receiver.local_addr());
    let sender = Sender::spawn(cell.clone(), url, sender_config()).expect("a ws:// URL");
    // Connected before the clock starts, as the plain loop is.
    while cell.generation().get_untracked().get() == 0 || sender.stats().connections == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let t = Instant::now();
    let drained = tokio::spawn(async move {
        drain(&mut receiver, n).await;
        receiver
    });
    for chunk in (0..n).collect::<Vec<_>>().chunks(4_096) {
        cell.enqueue_all(chunk.iter().map(|&i| payload(i)));
        tokio::task::yield_now().await;
    }
    let _receiver = drained.await.expect("drained");
    // Awaited, not polled: a loop of `yield_now` would take a core from
    // the tasks it waits for (the plain loops await their acks too).
    cell.delivered(Sequence(n - 1)).await.expect("acknowledged");
    let elapsed = t.elapsed();
    sender.shutdown().await;
    elapsed
}

type Plain = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A plain connection to `receiver`, past the handshake (generation 1), split
/// into its halves.
async fn connect_plain(
    receiver: &Receiver,
) -> (futures_util::stream::SplitSink<Plain, Message>, futures_util::stream::SplitStream<Plain>) {
    let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{}", receiver.local_addr())).await.expect("connect");
    let (mut sink, mut stream) = ws.split();
    let hello = Frame::Handshake { producer: "bench".into(), incarnation: 1, generation: 1, resume_from: 0 };
    sink.send(Message::Binary(hello.encode())).await.expect("handshake");
    let Some(Ok(Message::Binary(_welcome))) = stream.next().await else { panic!("no welcome") };
    (sink, stream)
}

/// Seconds for `n` messages through a plain loop: the same handshake, data
/// frames and acks, a window of 256, no cell.
pub async fn plain(n: u64) -> Duration {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.expect("bind");
    let (mut sink, mut stream) = connect_plain(&receiver).await;
    let t = Instant::now();
    let drained = tokio::spawn(async move {
        drain(&mut receiver, n).await;
        receiver
    });
    let (mut sent, mut acked) = (0u64, 0u64);
    while acked < n {
        let mut fed = false;
        while sent < n && sent - acked < WINDOW as u64 {
            let frame = Frame::Data { generation: 1, sequence: sent, attempt: 1, payload: payload(sent) };
            sink.feed(Message::Binary(frame.encode())).await.expect("send");
            sent += 1;
            fed = true;
        }
        if fed {
            sink.flush().await.expect("flush");
        }
        match stream.next().await {
            Some(Ok(Message::Binary(b))) => {
                if let Ok(Frame::Ack { through, .. }) = Frame::decode(&b, Limits::default()) {
                    acked = acked.max(through + 1);
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let _receiver = drained.await.expect("drained");
    t.elapsed()
}

/// [`plain`], with the writing and the reading in two tasks (a window
/// counter between them): the stronger baseline.
pub async fn plain_split(n: u64) -> Duration {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.expect("bind");
    let (mut sink, mut stream) = connect_plain(&receiver).await;
    let acked = Arc::new(AtomicU64::new(0));
    let room = Arc::new(tokio::sync::Notify::new());
    let t = Instant::now();
    let drained = tokio::spawn(async move {
        drain(&mut receiver, n).await;
        receiver
    });
    let reader = tokio::spawn({
        let (acked, room) = (acked.clone(), room.clone());
        async move {
            while acked.load(Ordering::Acquire) < n {
                match stream.next().await {
                    Some(Ok(Message::Binary(b))) => {
                        if let Ok(Frame::Ack { through, .. }) = Frame::decode(&b, Limits::default()) {
                            acked.fetch_max(through + 1, Ordering::Release);
                            room.notify_one();
                        }
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
    });
    let mut sent = 0u64;
    while sent < n {
        let window_end = acked.load(Ordering::Acquire) + WINDOW as u64;
        if sent >= window_end {
            room.notified().await;
            continue;
        }
        while sent < n && sent < window_end {
            let frame = Frame::Data { generation: 1, sequence: sent, attempt: 1, payload: payload(sent) };
            sink.feed(Message::Binary(frame.encode())).await.expect("send");
            sent += 1;
        }
        sink.flush().await.expect("flush");
    }
    reader.await.expect("the reader");
    let _receiver = drained.await.expect("drained");
    t.elapsed()
}

/// The time from killing the connection (with a window in flight) to the
/// acknowledgement, over the new connection, of the first frame that was in
/// flight when it died: the backoff, TCP and WebSocket connect, handshake,
/// replay, and the receiver's ack coalescing.
pub async fn recovery() -> Duration {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.expect("bind");
    let proxy = ChaosProxy::start(receiver.local_addr(), None).await.expect("proxy");
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<Bytes> = AsyncEgressCell::new(&cx, policy());
    let sender =
        Sender::spawn(cell.clone(), format!("ws://{}", proxy.local_addr()), sender_config()).expect("a ws:// URL");
    let n = 200_000u64;
    tokio::spawn(async move { drain(&mut receiver, n).await });
    for chunk in (0..n).collect::<Vec<_>>().chunks(4_096) {
        cell.enqueue_all(chunk.iter().map(|&i| payload(i)));
        tokio::task::yield_now().await;
    }
    // Wait for a steady stream with frames in flight, then kill it.
    while cell.acked_through().get_untracked().is_none_or(|a| a.get() < 10_000)
        || cell.inflight_len().get_untracked() == 0
    {
        tokio::task::yield_now().await;
    }
    let first_in_flight = cell.inflight().get_untracked()[0].sequence;
    let connections = sender.stats().connections;
    let t = Instant::now();
    proxy.kill_all();
    // Acknowledged on the new connection (an ack already on its way over
    // the old one does not count).
    while sender.stats().connections == connections
        || cell.acked_through().get_untracked().is_none_or(|a| a < first_in_flight)
    {
        tokio::task::yield_now().await;
    }
    let elapsed = t.elapsed();
    sender.shutdown().await;
    elapsed
}
