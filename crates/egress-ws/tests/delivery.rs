#![allow(clippy::unwrap_used)]
//! What egress promises about delivery, tried end to end over 127.0.0.1 the
//! way an adversarial peer or a careless application would: acknowledgements
//! beyond what was sent, a producer restarted without a store, an
//! application that takes nothing (or gives deliveries back), a record too
//! large for the receiver, a record that kills every connection it is sent
//! on, an application too slow to read, and clean shutdowns.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::{close_of, drained, limit, next_frame, payload, policy, receive_in_order, sender_config};
use egress_core::{DeadReason, Delay, Generation, Policy, Sequence};
use egress_reactive::{AsyncContext, AsyncEgressCell, CellOptions};
use egress_ws::protocol::{CloseCode, Frame, GENERATION_LIMIT, MAX_GENERATION_JUMP, Terms};
use egress_ws::{AckMode, Content, Receiver, ReceiverConfig, Sender, SenderConfig};
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

const TERMS: Terms = Terms { max_payload: 1 << 20, keepalive_ms: 1_000 };

async fn recv(receiver: &mut Receiver) -> egress_ws::Delivery {
    tokio::time::timeout(limit(), receiver.recv()).await.expect("a delivery in time")
}

fn send(frame: Frame) -> Message {
    Message::Binary(frame.encode())
}

/// Forwards a TCP connection to `to`, both ways, until either side ends.
async fn splice(client: TcpStream, to: std::net::SocketAddr) {
    let Ok(server) = TcpStream::connect(to).await else { return };
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    tokio::select! {
        _ = tokio::io::copy(&mut cr, &mut sw) => {}
        _ = tokio::io::copy(&mut sr, &mut cw) => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_and_welcomes_beyond_what_was_sent_are_refused_and_lose_nothing() {
    // A lying receiver: its first connection acknowledges 50 records after
    // one frame; its second welcomes the producer at 50. Each time the
    // sender must close with code 1 and keep everything. Then it hands
    // over to a real receiver, which must get all 50.
    let mut real = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let real_addr = real.local_addr();
    let liar = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let liar_addr = liar.local_addr().unwrap();
    let closes = Arc::new(AtomicU64::new(0));
    let seen = closes.clone();
    tokio::spawn(async move {
        for lie in 0..2 {
            let (stream, _) = liar.accept().await.unwrap();
            let mut ws = tokio_tungstenite::accept_async(stream).await.unwrap();
            let Some(Frame::Handshake { generation, .. }) = next_frame(&mut ws).await else { return };
            if lie == 0 {
                ws.send(send(Frame::Welcome { generation, next: 0, received: 0, terms: TERMS })).await.unwrap();
                assert!(matches!(next_frame(&mut ws).await, Some(Frame::Data { sequence: 0, .. })));
                ws.send(send(Frame::Ack { generation, through: 49 })).await.unwrap();
            } else {
                ws.send(send(Frame::Welcome { generation, next: 50, received: 50, terms: TERMS })).await.unwrap();
            }
            if close_of(&mut ws).await.map(|(c, _)| c) == Some(CloseCode::Protocol) {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        }
        while let Ok((client, _)) = liar.accept().await {
            tokio::spawn(splice(client, real_addr));
        }
    });
    let cx = AsyncContext::new();
    let one_at_a_time = Policy::builder().inflight_limit(1).retry_base(Delay(5)).build().unwrap();
    let cell = AsyncEgressCell::new(&cx, one_at_a_time);
    for i in 0..50 {
        cell.enqueue(payload(i));
    }
    let sender = Sender::spawn(cell.clone(), format!("ws://{liar_addr}"), sender_config(9)).unwrap();
    receive_in_order(&mut real, 0, 50).await;
    drained(&cell, 50).await;
    let stats = sender.shutdown().await;
    assert_eq!(stats.protocol_errors, 2, "{stats:?}");
    assert_eq!(closes.load(Ordering::SeqCst), 2, "the sender closed with code 1 both times");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_producer_is_a_new_stream_readmitted_in_one_round_trip() {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let url = format!("ws://{}", receiver.local_addr());
    let cx = AsyncContext::new();
    // The first run of the producer, which had got to generation 25.
    let first = AsyncEgressCell::with_options(&cx, policy(), CellOptions::new().generation(Generation(25)));
    let sender = Sender::spawn(first.clone(), url.clone(), sender_config(1)).unwrap();
    first.enqueue_all((0..1_000).map(payload));
    receive_in_order(&mut receiver, 0, 1_000).await;
    drained(&first, 1_000).await;
    sender.shutdown().await;
    // The producer restarts without a store: a new cell, a new incarnation,
    // sequences from 0 again, generation 0.
    let second = AsyncEgressCell::new(&cx, policy());
    assert_ne!(second.incarnation(), first.incarnation());
    let started = tokio::time::Instant::now();
    let sender = Sender::spawn(second.clone(), url, sender_config(2)).unwrap();
    second.enqueue_all((0..1_000).map(payload));
    for i in 0..1_000 {
        let d = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
        assert_eq!((d.incarnation, d.sequence), (second.incarnation(), i), "the new run's own stream, from 0");
        assert_eq!(d.content, Content::Message(payload(i)));
    }
    drained(&second, 1_000).await;
    let stats = sender.shutdown().await;
    // Refused once as stale (the receiver had seen 26), told the latest,
    // and admitted at once above it.
    assert_eq!((stats.stale_refusals, stats.failed_attempts, stats.connections), (1, 1, 1), "{stats:?}");
    assert_eq!(second.generation().get_untracked(), Generation(27));
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_application_did_not_take_is_not_acknowledged_and_survives_shutdown() {
    let first = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let addr = first.local_addr();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), sender_config(3)).unwrap();
    cell.enqueue_all((0..100).map(payload));
    // The receiver holds a window's worth (the application took none)...
    let deadline = tokio::time::Instant::now() + limit();
    while first.next_for("producer-1") != Some(64) {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    // ...and acknowledged none.
    assert_eq!(cell.acked_through().get_untracked(), None);
    assert_eq!(cell.inflight_len().get_untracked(), 64, "the window is full of what the receiver holds");
    first.shutdown().await;
    // A receiver in its place, with no memory: all 100 arrive.
    let mut second = Receiver::bind(addr, ReceiverConfig::default()).await.unwrap();
    receive_in_order(&mut second, 0, 100).await;
    drained(&cell, 100).await;
    let stats = sender.shutdown().await;
    assert_eq!(stats.protocol_errors, 0, "a receiver's shutdown is a normal close: {stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_commits_acknowledge_and_a_delivery_given_back_comes_again() {
    let config = ReceiverConfig { ack_mode: AckMode::Explicit, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), sender_config(4)).unwrap();
    cell.enqueue_all((0..10).map(payload));
    let mut taken = Vec::new();
    for i in 0..5 {
        let d = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
        assert_eq!(d.sequence, i);
        taken.push(d);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(cell.acked_through().get_untracked(), None, "taken is not committed");
    // Committing 2 commits 0..=2.
    let mut rest = taken.split_off(3);
    taken.pop().unwrap().commit();
    drop(taken);
    let deadline = tokio::time::Instant::now() + limit();
    while cell.acked_through().get_untracked() != Some(Sequence(2)) {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", cell.acked_through().get_untracked());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // 3 and 4 are given back (dropped uncommitted): they come again, in
    // order, then the rest.
    drop(rest.remove(0));
    drop(rest);
    for i in 3..10 {
        let d = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
        assert_eq!((d.sequence, d.content.clone()), (i, Content::Message(payload(i))));
        assert_eq!(d.deliveries, if i < 5 { 2 } else { 1 }, "sequence {i}");
        d.commit();
    }
    drained(&cell, 10).await;
    let stats = sender.shutdown().await;
    assert_eq!(receiver.stats().released, 2);
    // The receiver handed them over again itself: nothing asked of the
    // producer, nothing replayed, no replay charged.
    assert_eq!((stats.reconnects, stats.protocol_errors), (0, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_gives_back_everything_it_held() {
    // A handler holds two deliveries and panics: unwinding drops the later
    // one first. Both must come again (the old rewind lost the earlier
    // one and let the later commit acknowledge it), and a handler that
    // keeps failing on one message sees its delivery count grow.
    let config = ReceiverConfig { ack_mode: AckMode::Explicit, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), sender_config(11)).unwrap();
    cell.enqueue_all((0..10).map(payload));
    let first = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
    let second = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
    let handler = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let (_first, _second) = (first, second);
        panic!("the handler fails");
    }));
    assert!(handler.is_err());
    // Sequence 0 fails three times more; then it is set aside (committed).
    for attempt in 2..=5 {
        let d = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
        assert_eq!((d.sequence, d.deliveries), (0, attempt));
        if attempt == 5 {
            d.commit();
        }
    }
    for i in 1..10 {
        let d = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
        assert_eq!((d.sequence, d.content.clone()), (i, Content::Message(payload(i))));
        d.commit();
    }
    drained(&cell, 10).await;
    let stats = sender.shutdown().await;
    assert_eq!(receiver.stats().released, 5);
    assert_eq!((stats.reconnects, stats.protocol_errors), (0, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_given_back_with_the_queue_full_wedges_no_other_producer() {
    // The queue holds 4. A raw producer "other" delivers 0 and 1; the real
    // producer fills the rest and waits for room. The application takes
    // other's 0 and gives it back: the real producer must go on.
    let config = ReceiverConfig { ack_mode: AckMode::Explicit, delivery_buffer: 4, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let url = format!("ws://{}", receiver.local_addr());
    let (mut other, _) = tokio_tungstenite::connect_async(url.clone()).await.unwrap();
    let hello = Frame::Handshake { producer: "other".into(), incarnation: 1, generation: 1, resume_from: 0 };
    other.send(send(hello)).await.unwrap();
    assert!(matches!(next_frame(&mut other).await, Some(Frame::Welcome { .. })));
    for sequence in 0..2 {
        let frame = Frame::Data { generation: 1, sequence, attempt: 1, payload: payload(sequence) };
        other.send(send(frame)).await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + limit();
    while receiver.next_for("other") != Some(2) {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), url, sender_config(12)).unwrap();
    cell.enqueue_all((0..20).map(payload));
    while receiver.next_for("producer-1") != Some(2) {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let given_back = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
    assert_eq!((&*given_back.producer, given_back.sequence), ("other", 0));
    drop(given_back);
    let mut seen = Vec::new();
    while seen.len() < 22 {
        let d = tokio::time::timeout(limit(), receiver.recv()).await.expect("no wedge");
        seen.push((d.producer.to_string(), d.sequence));
        d.commit();
    }
    let ours: Vec<u64> = seen.iter().filter(|(p, _)| p == "producer-1").map(|(_, s)| *s).collect();
    assert_eq!(ours, (0..20).collect::<Vec<_>>());
    assert_eq!(seen.iter().filter(|(p, _)| p == "other").count(), 2);
    drained(&cell, 20).await;
    sender.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_still_on_its_way_when_the_receiver_shuts_down_is_refused() {
    // A producer whose upgrade completed before the shutdown, and whose
    // handshake arrives after it, must not be admitted into a receiver
    // nobody reads (it would be kept alive by pings, and never move on).
    let receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let (mut late, _) = tokio_tungstenite::connect_async(format!("ws://{}", receiver.local_addr())).await.unwrap();
    receiver.shutdown().await;
    let hello = Frame::Handshake { producer: "late".into(), incarnation: 1, generation: 1, resume_from: 0 };
    late.send(send(hello)).await.unwrap();
    match next_frame(&mut late).await {
        Some(Frame::Close { code: CloseCode::Normal, .. }) => {}
        other => panic!("expected a normal close, got {other:?}"),
    }
}

/// A receiver that answers every handshake with `close(generation)`, and
/// counts the connections.
async fn refusing_receiver(close: fn(u64) -> Frame) -> (std::net::SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicU64::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else { continue };
            if let Some(Frame::Handshake { generation, .. }) = next_frame(&mut ws).await {
                let _ = ws.send(send(close(generation))).await;
            }
        }
    });
    (addr, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_answered_at_once_back_off_when_nothing_gets_through() {
    // Codes 4 (naming the generation just offered) and 5, on every
    // handshake: answered at once, the sender would loop thousands of
    // times a second. Only the first is answered at once.
    let stale = |g| Frame::Close { code: CloseCode::StaleGeneration, detail: g, reason: "stale".into() };
    let retry = |_| Frame::Close { code: CloseCode::Retry, detail: 0, reason: "retry".into() };
    for (case, close) in [("stale", stale as fn(u64) -> Frame), ("retry", retry)] {
        let (addr, accepted) = refusing_receiver(close).await;
        let cx = AsyncContext::new();
        let cell = AsyncEgressCell::new(&cx, policy());
        cell.enqueue_all((0..10).map(payload));
        let config = SenderConfig {
            backoff_base: Duration::from_millis(20),
            backoff_max: Duration::from_secs(2),
            ..sender_config(13)
        };
        let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), config).unwrap();
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let stats = sender.shutdown().await;
        let n = accepted.load(Ordering::SeqCst);
        // At once, then waits of at least 10, 20, 40, ... 640 ms.
        assert!((2..=9).contains(&n), "{case}: {n} connections in 1.5 s: {stats:?}");
        assert_eq!(cell.inflight_len().get_untracked() + cell.pending_len().get_untracked(), 10);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_close_out_of_reach_does_not_use_up_the_generations() {
    // One Close 4 naming u64::MAX - 1 would make the cell's next
    // generation u64::MAX, and leave it nothing to reconnect with. The
    // sender refuses the jump (a protocol error, with a backoff), and the
    // cell stays usable.
    let far = |_| Frame::Close { code: CloseCode::StaleGeneration, detail: u64::MAX - 1, reason: "far".into() };
    let (addr, accepted) = refusing_receiver(far).await;
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    cell.enqueue_all((0..10).map(payload));
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), sender_config(14)).unwrap();
    let deadline = tokio::time::Instant::now() + limit();
    while accepted.load(Ordering::SeqCst) < 3 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = sender.shutdown().await;
    assert!(stats.protocol_errors >= 2, "{stats:?}");
    assert!(cell.generation().get_untracked().get() < 100, "{:?}", cell.generation().get_untracked());
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), sender_config(15)).unwrap();
    receive_in_order(&mut receiver, 0, 10).await;
    drained(&cell, 10).await;
    assert_eq!(sender.shutdown().await.protocol_errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_covering_a_held_record_that_was_never_sent_is_refused() {
    // Dead letters held (not skipped); the sender's own limit is 16 bytes,
    // so record 3 (100 bytes) is never sent and is held. An ack through 9
    // is then a lie that would drop it: refused with code 1.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(stream).await.unwrap();
        let Some(Frame::Handshake { generation, .. }) = next_frame(&mut ws).await else { return };
        ws.send(send(Frame::Welcome { generation, next: 0, received: 0, terms: TERMS })).await.unwrap();
        let mut sent = Vec::new();
        while sent.len() < 9 {
            match next_frame(&mut ws).await {
                Some(Frame::Data { sequence, .. }) => sent.push(sequence),
                other => panic!("expected data, got {other:?}"),
            }
        }
        assert!(!sent.contains(&3), "{sent:?}");
        ws.send(send(Frame::Ack { generation, through: 9 })).await.unwrap();
        let _ = tx.send(close_of(&mut ws).await);
    });
    let cx = AsyncContext::new();
    let hold = Policy::builder().dead_letters(egress_core::DeadLetters::Hold).retry_base(Delay(5)).build().unwrap();
    let cell = AsyncEgressCell::new(&cx, hold);
    cell.enqueue_all((0..10).map(|i| if i == 3 { Bytes::from(vec![b'x'; 100]) } else { payload(i) }));
    let config = SenderConfig { max_payload: 16, ..sender_config(16) };
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), config).unwrap();
    let close = tokio::time::timeout(limit(), closed.recv()).await.unwrap().unwrap();
    assert_eq!(close.map(|(code, _)| code), Some(CloseCode::Protocol));
    let stats = sender.shutdown().await;
    assert!(stats.protocol_errors >= 1, "{stats:?}");
    assert_eq!(cell.exhausted_len().get_untracked(), 1, "the held record is kept");
    assert_eq!(cell.acked_through().get_untracked(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_above_the_senders_limit_is_skipped_without_a_wedge() {
    // The sender's own limit is 1 MiB by default: a 2 MiB record is a dead
    // letter whatever a receiver accepts.
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), sender_config(5)).unwrap();
    let big = Bytes::from(vec![b'x'; 2 << 20]);
    cell.enqueue_all((0..10).map(|i| if i == 3 { big.clone() } else { payload(i) }));
    for i in 0..10 {
        let d = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
        let expected = if i == 3 { Content::Skipped(DeadReason::Permanent) } else { Content::Message(payload(i)) };
        let bytes = payload(i);
        assert_eq!(d.payload(), if i == 3 { None } else { Some(&bytes) }, "a skip has no payload");
        let shown = format!("{d:?}");
        for field in [format!("sequence: {i}"), "deliveries: 1".into(), "committed: true".into()] {
            assert!(shown.contains(&field), "{shown} shows {field}");
        }
        assert_eq!((d.sequence, d.content), (i, expected));
    }
    drained(&cell, 10).await;
    // What the application is told: the skipped message is dead, not
    // delivered, even when it asks after the skip was acknowledged.
    let dead = egress_reactive::Undelivered::Dead(DeadReason::Permanent);
    assert_eq!(cell.delivered(Sequence(3)).await, Err(dead), "a skipped message is not delivered");
    assert_eq!(cell.delivered(Sequence(4)).await, Ok(()));
    let status = cell.status(Sequence(3));
    assert_eq!(status.get_untracked(), Some(egress_core::MessageStatus::Dead(DeadReason::Permanent)));
    drop(status);
    let stats = sender.shutdown().await;
    assert_eq!((stats.reconnects, stats.protocol_errors), (0, 0), "never sent, never a dead connection: {stats:?}");
    assert_eq!(receiver.stats().skipped, 1);
    let shown = format!("{receiver:?}");
    for field in [format!("local_addr: {}", receiver.local_addr()), "skipped: 1".into(), "delivered: 10".into()] {
        assert!(shown.contains(&field), "{shown} shows {field}");
    }
}

/// An honest in-order receiver that remembers its stream, except that a
/// connection dies at a data or tombstone frame when `dies(content,
/// deaths so far)` says so (a receiver that crashes on a payload, a
/// network that keeps failing).
async fn fragile_receiver(
    dies: impl Fn(&Content, u64) -> bool + Send + 'static,
) -> (std::net::SocketAddr, tokio::sync::mpsc::UnboundedReceiver<(u64, Content)>, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let deaths = Arc::new(AtomicU64::new(0));
    let died = deaths.clone();
    tokio::spawn(async move {
        let next = Arc::new(AtomicU64::new(0));
        while let Ok((stream, _)) = listener.accept().await {
            let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else { continue };
            let Some(Frame::Handshake { generation, .. }) = next_frame(&mut ws).await else { continue };
            let n = next.load(Ordering::SeqCst);
            let welcome = Frame::Welcome { generation, next: n, received: n, terms: TERMS };
            if ws.send(send(welcome)).await.is_err() {
                continue;
            }
            while let Some(Ok(Message::Binary(b))) = ws.next().await {
                let (sequence, content) = match Frame::decode(&b, egress_ws::protocol::Limits::default()) {
                    Ok(Frame::Data { sequence, payload, .. }) => (sequence, Content::Message(payload)),
                    Ok(Frame::Tombstone { sequence, reason, .. }) => (sequence, Content::Skipped(reason)),
                    _ => break,
                };
                if dies(&content, died.load(Ordering::SeqCst)) {
                    died.fetch_add(1, Ordering::SeqCst);
                    break; // the connection dies with the receiver's process
                }
                if sequence == next.load(Ordering::SeqCst) {
                    next.store(sequence + 1, Ordering::SeqCst);
                    let _ = tx.send((sequence, content));
                    let _ = ws.send(send(Frame::Ack { generation, through: sequence })).await;
                }
            }
        }
    });
    (addr, rx, deaths)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_kills_its_connections_dies_of_replays_alone() {
    let poison = |c: &Content, _| matches!(c, Content::Message(p) if &p[..] == b"POISON");
    let (addr, mut delivered, deaths) = fragile_receiver(poison).await;
    let cx = AsyncContext::new();
    let replays = 3;
    let policy = Policy::builder().inflight_limit(16).replay_limit(replays).retry_base(Delay(5)).build().unwrap();
    let cell = AsyncEgressCell::new(&cx, policy);
    let config = SenderConfig { backoff_max: Duration::from_millis(100), ..sender_config(6) };
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), config).unwrap();
    cell.enqueue_all((0..20).map(|i| if i == 5 { Bytes::from_static(b"POISON") } else { payload(i) }));
    for i in 0..20 {
        let (sequence, content) = tokio::time::timeout(limit(), delivered.recv()).await.unwrap().unwrap();
        let expected = if i == 5 { Content::Skipped(DeadReason::Replays) } else { Content::Message(payload(i)) };
        assert_eq!((sequence, content), (i, expected));
    }
    drained(&cell, 20).await;
    let stats = sender.shutdown().await;
    // The poison killed a bounded number of connections: one before the
    // replays began, then its replay limit's worth plus the one that
    // killed it. Only it died: the records behind it were delivered.
    let killed = deaths.load(Ordering::SeqCst);
    assert!(killed >= 2 && killed <= u64::from(replays) + 2, "{killed} connections killed: {stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tombstone_replayed_past_its_limit_still_reaches_the_receiver() {
    // Replay limit 1: the record dies at its second replay, and its
    // tombstone is replayed past the limit in turn. A held tombstone would
    // leave the receiver waiting on sequence 0 for good, and sequence 1
    // behind it.
    let kills = 5;
    let (addr, mut delivered, deaths) = fragile_receiver(move |_, deaths| deaths < kills).await;
    let cx = AsyncContext::new();
    let policy = Policy::builder().inflight_limit(16).replay_limit(1).retry_base(Delay(5)).build().unwrap();
    let cell = AsyncEgressCell::new(&cx, policy);
    let config = SenderConfig { backoff_max: Duration::from_millis(20), ..sender_config(11) };
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), config).unwrap();
    cell.enqueue_all((0..2).map(payload));
    let first = tokio::time::timeout(limit(), delivered.recv()).await.expect("the tombstone arrives").unwrap();
    assert_eq!(first, (0, Content::Skipped(DeadReason::Replays)));
    let second = tokio::time::timeout(limit(), delivered.recv()).await.unwrap().unwrap();
    assert_eq!(second, (1, Content::Message(payload(1))));
    drained(&cell, 2).await;
    assert_eq!(deaths.load(Ordering::SeqCst), kills);
    assert_eq!(cell.exhausted_len().get_untracked(), 0, "nothing held");
    sender.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_application_is_not_a_dead_receiver() {
    let config =
        ReceiverConfig { delivery_buffer: 8, keepalive: Duration::from_millis(50), ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let config = SenderConfig { stall_timeout: Some(Duration::from_millis(300)), ..sender_config(7) };
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), config).unwrap();
    cell.enqueue_all((0..500).map(payload));
    // The application reads nothing for five stall timeouts: the window
    // fills, nothing is acknowledged, and the connection stays up.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(cell.acked_through().get_untracked(), None);
    assert_eq!(cell.inflight_len().get_untracked(), 64);
    // Then it reads: everything arrives, in order, on the same connection.
    receive_in_order(&mut receiver, 0, 500).await;
    drained(&cell, 500).await;
    let stats = sender.shutdown().await;
    assert_eq!((stats.connections, stats.reconnects), (1, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_timeout_below_the_advertised_keepalive_does_not_drop_a_slow_receiver() {
    // The receiver promises a sign of life every 200 ms; the sender was
    // configured to give up after 60 ms of silence. The stall timeout in
    // force is at least three keepalives, so the pings of a receiver whose
    // application stops reading keep the connection, and no replay is
    // charged for the sender's own impatience.
    let config =
        ReceiverConfig { delivery_buffer: 8, keepalive: Duration::from_millis(200), ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let cx = AsyncContext::new();
    let strict = Policy::builder().inflight_limit(64).replay_limit(1).retry_base(Delay(5)).build().unwrap();
    let cell = AsyncEgressCell::new(&cx, strict);
    let config = SenderConfig { stall_timeout: Some(Duration::from_millis(60)), ..sender_config(22) };
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), config).unwrap();
    cell.enqueue_all((0..200).map(payload));
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    receive_in_order(&mut receiver, 0, 200).await;
    drained(&cell, 200).await;
    let stats = sender.shutdown().await;
    assert_eq!((stats.connections, stats.reconnects), (1, 0), "{stats:?}");
    assert_eq!(cell.exhausted_len().get_untracked(), 0, "no dead letter");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_shutdowns_close_as_normal_and_count_as_nothing() {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let url = format!("ws://{}", receiver.local_addr());
    let sender = Sender::spawn(cell.clone(), url.clone(), sender_config(8)).unwrap();
    cell.enqueue_all((0..10).map(payload));
    receive_in_order(&mut receiver, 0, 10).await;
    drained(&cell, 10).await;
    let stats = sender.shutdown().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!((receiver.stats().rejected, stats.protocol_errors), (0, 0));
    // The receiver shuts down under a connected sender: a normal close.
    let sender = Sender::spawn(cell.clone(), url, sender_config(9)).unwrap();
    cell.enqueue_all((10..20).map(payload));
    receive_in_order(&mut receiver, 10, 20).await;
    drained(&cell, 20).await;
    receiver.shutdown().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stats = sender.shutdown().await;
    assert_eq!(stats.protocol_errors, 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_die_after_their_welcome_do_not_reset_the_backoff() {
    // A receiver that welcomes every connection and drops it at once, with
    // records waiting: without progress, each reconnect waits longer
    // (20 ms doubling to 2 s). A backoff reset by every handshake would
    // make this a tight loop (the old behaviour: about 160 a second).
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicU64::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else { continue };
            if let Some(Frame::Handshake { generation, .. }) = next_frame(&mut ws).await {
                let _ = ws.send(send(Frame::Welcome { generation, next: 0, received: 0, terms: TERMS })).await;
            }
        }
    });
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    cell.enqueue_all((0..10).map(payload));
    let config = SenderConfig {
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_secs(2),
        ..sender_config(10)
    };
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), config).unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let stats = sender.shutdown().await;
    let n = accepted.load(Ordering::SeqCst);
    // Waits of at least 10, 20, 40, ... 640 ms (the upper half of 20 ms
    // doubling): at most 8 connections within 1.5 s, the first immediate.
    assert!((2..=8).contains(&n), "{n} connections in 1.5 s: {stats:?}");
    assert_eq!(cell.acked_through().get_untracked(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_given_back_is_covered_by_no_commit_but_its_own() {
    // Handlers hold 1 and 2. The first gives 1 back; the second commits 2.
    // 1 is handed over again and fails again: it must come back a third
    // time, and the producer must not see it acknowledged meanwhile.
    let config = ReceiverConfig { ack_mode: AckMode::Explicit, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), sender_config(17)).unwrap();
    cell.enqueue_all((0..5).map(payload));
    recv(&mut receiver).await.commit();
    let one = recv(&mut receiver).await;
    let two = recv(&mut receiver).await;
    assert_eq!((one.sequence, two.sequence), (1, 2));
    drop(one);
    two.commit();
    let again = recv(&mut receiver).await;
    assert_eq!((again.sequence, again.deliveries), (1, 2));
    drop(again);
    let third = recv(&mut receiver).await;
    assert_eq!((third.sequence, third.deliveries), (1, 3));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(cell.acked_through().get_untracked(), Some(Sequence(0)), "nothing covers 1 before its own commit");
    third.commit();
    for i in 3..5 {
        let d = recv(&mut receiver).await;
        assert_eq!(d.sequence, i);
        d.commit();
    }
    drained(&cell, 5).await;
    sender.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_squatter_cannot_lock_a_producer_id_out() {
    // Raw clients claim "producer-1" first at 2^63 - 1, then twice more,
    // each as far up as allowed, and leave. The real producer still gets
    // in (climbing at most 2^32 per refusal) and delivers everything.
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let url = format!("ws://{}", receiver.local_addr());
    for generation in [GENERATION_LIMIT - 1, 2 * MAX_GENERATION_JUMP, 3 * MAX_GENERATION_JUMP] {
        let (mut squatter, _) = tokio_tungstenite::connect_async(url.clone()).await.unwrap();
        let hello = Frame::Handshake { producer: "producer-1".into(), incarnation: 99, generation, resume_from: 0 };
        squatter.send(send(hello)).await.unwrap();
        assert!(matches!(next_frame(&mut squatter).await, Some(Frame::Welcome { .. })), "admitted at {generation}");
    }
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), url, sender_config(18)).unwrap();
    cell.enqueue_all((0..10).map(payload));
    receive_in_order(&mut receiver, 0, 10).await;
    drained(&cell, 10).await;
    let stats = sender.shutdown().await;
    assert!(stats.stale_refusals >= 1 && stats.protocol_errors == 0, "{stats:?}");
    assert!(cell.generation().get_untracked().get() <= 4 * MAX_GENERATION_JUMP);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_exactly_at_the_senders_limit_is_sent_and_one_byte_more_is_skipped() {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let config = SenderConfig { max_payload: 1_024, ..sender_config(13) };
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), config).unwrap();
    let (at, over) = (Bytes::from(vec![b'a'; 1_024]), Bytes::from(vec![b'o'; 1_025]));
    cell.enqueue_all([payload(0), at.clone(), over, payload(3)]);
    let expected = [
        Content::Message(payload(0)),
        Content::Message(at),
        Content::Skipped(DeadReason::Permanent),
        Content::Message(payload(3)),
    ];
    for (i, content) in expected.into_iter().enumerate() {
        let d = recv(&mut receiver).await;
        assert_eq!((d.sequence, d.content), (i as u64, content));
    }
    drained(&cell, 4).await;
    sender.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_enqueue_refuses_what_the_sender_or_its_receiver_could_only_dead_letter() {
    use egress_reactive::Refused;
    let big = |n: usize| Bytes::from(vec![b'b'; n]);
    // A listener that never answers the upgrade: no welcome, the own limit.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let config = SenderConfig { max_payload: 4_096, ..sender_config(21) };
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", silent.local_addr().unwrap()), config.clone()).unwrap();
    assert_eq!(sender.payload_limit(), 4_096);
    let refused = cell.try_enqueue(big(4_097));
    assert!(matches!(refused, Err(Refused::TooLarge { size: 4_097, limit: 4_096, .. })), "{refused:?}");
    assert_eq!(refused.unwrap_err().into_payload(), big(4_097), "it comes back");
    assert_eq!(cell.next_sequence(), Sequence(0), "nothing queued");
    // A later sender on the cell installs its own check; the earlier one,
    // going, takes only its own away.
    let url = format!("ws://{}", silent.local_addr().unwrap());
    let later = Sender::spawn(cell.clone(), url, SenderConfig { max_payload: 2_048, ..config.clone() }).unwrap();
    sender.shutdown().await;
    assert_eq!(cell.too_large(&big(2_049)), Some((2_049, 2_048)), "the later sender's check stays");
    later.shutdown().await;
    assert_eq!(cell.too_large(&big(1 << 30)), None, "no sender, no limit");
    drop(silent);

    // A receiver that takes 1,024 bytes: after its welcome the cell refuses
    // what it could not take, and takes what it can.
    let small =
        ReceiverConfig { limits: egress_ws::protocol::Limits { max_payload: 1_024 }, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", small).await.unwrap();
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), config).unwrap();
    assert_eq!(cell.try_enqueue(payload(0)), Ok(Sequence(0)));
    assert_eq!(recv(&mut receiver).await.sequence, 0, "welcomed");
    assert_eq!(sender.payload_limit(), 1_024);
    let refused = cell.try_enqueue(big(1_025));
    assert!(matches!(refused, Err(Refused::TooLarge { size: 1_025, limit: 1_024, .. })), "{refused:?}");
    assert_eq!(cell.try_enqueue(big(1_024)), Ok(Sequence(1)), "at the receiver's limit");
    let d = recv(&mut receiver).await;
    assert_eq!((d.sequence, d.content), (1, Content::Message(big(1_024))));
    drained(&cell, 2).await;
    sender.shutdown().await;
}

/// Plays the receivers of `a_small_receiver_...`: the first welcome
/// advertises max-payload 4 (below the floor), the second 1,024; every
/// later connection goes to `honest`. Reports how the sender ended each of
/// the first two.
async fn small_then_honest(
    honest: std::net::SocketAddr,
) -> (std::net::SocketAddr, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        for max_payload in [4, 1_024] {
            let (stream, _) = listener.accept().await.unwrap();
            let mut ws = tokio_tungstenite::accept_async(stream).await.unwrap();
            let Some(Frame::Handshake { generation, .. }) = next_frame(&mut ws).await else { return };
            let terms = Terms { max_payload, keepalive_ms: 1_000 };
            ws.send(send(Frame::Welcome { generation, next: 0, received: 0, terms })).await.unwrap();
            // The first frame the sender sends after the welcome.
            let first = next_frame(&mut ws).await;
            let _ = tx.send(format!("{max_payload}: {first:?}"));
        }
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(splice(client, honest));
        }
    });
    (addr, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_receiver_holds_records_back_for_the_next_and_destroys_none() {
    // 20 records of 2 KiB and one small one: a welcome advertising 4 bytes
    // is a protocol error (closed with code 1, nothing held); one
    // advertising 1 KiB makes the sender hold the first record back and
    // close in order (code 0), sending nothing; the honest receiver after
    // it gets every record, each once, as its message.
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let (addr, mut seen) = small_then_honest(receiver.local_addr()).await;
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let big = |i: u64| Bytes::from(vec![u8::try_from(i).unwrap(); 2_048]);
    let records: Vec<Bytes> = (0..21).map(|i| if i == 20 { payload(i) } else { big(i) }).collect();
    cell.enqueue_all(records.clone());
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), sender_config(19)).unwrap();
    let floor = tokio::time::timeout(limit(), seen.recv()).await.unwrap().unwrap();
    assert!(floor.contains("code: Protocol"), "the welcome below the floor is closed with code 1: {floor}");
    let small = tokio::time::timeout(limit(), seen.recv()).await.unwrap().unwrap();
    assert!(small.contains("code: Normal"), "held back, the connection closed in order: {small}");
    for (i, record) in records.iter().enumerate() {
        let d = recv(&mut receiver).await;
        assert_eq!((d.sequence, d.content), (i as u64, Content::Message(record.clone())));
    }
    drained(&cell, 21).await;
    assert_eq!(cell.exhausted_len().get_untracked(), 0, "nothing dead");
    let stats = sender.shutdown().await;
    assert_eq!(stats.held_too_large, 1, "{stats:?}");
    assert!(stats.protocol_errors >= 1, "{stats:?}");
    assert_eq!(receiver.stats().skipped, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_exactly_at_the_receivers_limit_is_sent() {
    let config =
        ReceiverConfig { limits: egress_ws::protocol::Limits { max_payload: 1_024 }, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let at = Bytes::from(vec![b'a'; 1_024]);
    cell.enqueue_all([at.clone(), payload(1)]);
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), sender_config(23)).unwrap();
    for (i, content) in [Content::Message(at), Content::Message(payload(1))].into_iter().enumerate() {
        let d = recv(&mut receiver).await;
        assert_eq!((d.sequence, d.content), (i as u64, content));
    }
    drained(&cell, 2).await;
    let stats = sender.shutdown().await;
    assert_eq!((stats.held_too_large, stats.reconnects), (0, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_never_takes_a_record_costs_it_its_budget_not_the_stream() {
    // One honest receiver whose limit stays below record 0: each
    // connection holds it back and ends; once its budget (3) is spent it is
    // a dead letter, its tombstone goes, and the stream flows again.
    let config =
        ReceiverConfig { limits: egress_ws::protocol::Limits { max_payload: 1_024 }, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let cx = AsyncContext::new();
    let policy = Policy::builder().retry_budget(3).retry_base(Delay(5)).build().unwrap();
    let cell = AsyncEgressCell::new(&cx, policy);
    cell.enqueue_all([Bytes::from(vec![b'x'; 2_048]), payload(1), payload(2)]);
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), sender_config(21)).unwrap();
    let expected = [Content::Skipped(DeadReason::Retries), Content::Message(payload(1)), Content::Message(payload(2))];
    for (i, content) in expected.into_iter().enumerate() {
        let d = recv(&mut receiver).await;
        assert_eq!((d.sequence, d.content), (i as u64, content));
    }
    drained(&cell, 3).await;
    let stats = sender.shutdown().await;
    assert_eq!(stats.held_too_large, 4, "held on 4 connections, the 4th spending the budget: {stats:?}");
    assert_eq!(stats.protocol_errors, 0, "{stats:?}");
}

/// A receiver that takes records 0..3 on its first connection without
/// acknowledging them, then one whose limit is 1,024 (below record 0),
/// then the first again, whose welcome says it holds all three; it then
/// acknowledges them. Reports how the sender ended each connection.
async fn holds_then_small_then_holds() -> (std::net::SocketAddr, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        for (round, max_payload, received) in [(0, 1 << 20, 0), (1, 1_024, 0), (2, 1 << 20, 3)] {
            let (stream, _) = listener.accept().await.unwrap();
            let mut ws = tokio_tungstenite::accept_async(stream).await.unwrap();
            let Some(Frame::Handshake { generation, .. }) = next_frame(&mut ws).await else { return };
            let terms = Terms { max_payload, keepalive_ms: 1_000 };
            ws.send(send(Frame::Welcome { generation, next: 0, received, terms })).await.unwrap();
            match round {
                0 => {
                    let mut got = Vec::new();
                    while got.len() < 3 {
                        match next_frame(&mut ws).await {
                            Some(Frame::Data { sequence, .. }) => got.push(sequence),
                            other => panic!("{other:?}"),
                        }
                    }
                    let _ = tx.send(format!("took {got:?}"));
                    // Gone without a word: nothing acknowledged.
                }
                1 => {
                    let _ = tx.send(format!("small: {:?}", next_frame(&mut ws).await));
                }
                _ => {
                    ws.send(send(Frame::Ack { generation, through: 2 })).await.unwrap();
                    let _ = tx.send(format!("holds: {:?}", next_frame(&mut ws).await));
                }
            }
        }
    });
    (addr, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_written_once_then_held_may_be_held_by_a_receiver() {
    // Record 0 reached the first receiver, then a small one held it back:
    // the first one's welcome, back, rightly says it holds it. That is no
    // lie: the sender takes it, and the acknowledgement.
    let (addr, mut seen) = holds_then_small_then_holds().await;
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    cell.enqueue_all([Bytes::from(vec![b'x'; 2_048]), payload(1), payload(2)]);
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), sender_config(22)).unwrap();
    let took = tokio::time::timeout(limit(), seen.recv()).await.unwrap().unwrap();
    assert_eq!(took, "took [0, 1, 2]");
    let small = tokio::time::timeout(limit(), seen.recv()).await.unwrap().unwrap();
    assert!(small.contains("code: Normal"), "{small}");
    drained(&cell, 3).await;
    let stats = sender.shutdown().await;
    assert_eq!(stats.protocol_errors, 0, "{stats:?}");
    assert_eq!(stats.held_too_large, 1, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_is_replaced_and_the_stats_say_so() {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), sender_config(14)).unwrap();
    cell.enqueue_all((0..10).map(payload));
    receive_in_order(&mut receiver, 0, 10).await;
    drained(&cell, 10).await;
    assert_eq!((sender.stats().connections, sender.stats().reconnects), (1, 0));
    sender.kill_connection();
    let deadline = tokio::time::Instant::now() + limit();
    while sender.stats().connections < 2 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", sender.stats());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(sender.stats().reconnects, 1);
    let shown = format!("{sender:?}");
    assert!(shown.contains("connections: 2") && shown.contains("reconnects: 1"), "{shown}");
    cell.enqueue_all((10..20).map(payload));
    receive_in_order(&mut receiver, 10, 20).await;
    drained(&cell, 20).await;
    assert_eq!(receiver.stats().connections, 2);
    sender.shutdown().await;
}

/// The failures the sender counts after its current connection ends: the
/// first `Reconnecting` (or, if that was passed over, the `Connecting`
/// after it, whose attempt is one more) seen on `states`, which must be
/// watched from while the connection is up. The server must then hold the
/// next attempt unanswered, so that the state stays put to be read.
async fn failures_after_the_connection(
    states: &mut (impl futures_util::Stream<Item = egress_ws::ConnectionState> + Unpin),
) -> u32 {
    let deadline = tokio::time::Instant::now() + limit();
    loop {
        match tokio::time::timeout_at(deadline, states.next()).await.expect("a state in time").unwrap() {
            egress_ws::ConnectionState::Reconnecting { failures, .. } => return failures,
            egress_ws::ConnectionState::Connecting { attempt } => return attempt - 1,
            _ => {}
        }
    }
}

/// Holds every connection `listener` accepts from now on, unanswered.
async fn hold_all(listener: TcpListener) {
    let mut held = Vec::new();
    while let Ok((stream, _)) = listener.accept().await {
        held.push(stream);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_outlived_the_backoff_ceiling_idle_resets_the_failures() {
    // Three attempts refused before the upgrade build up failures; the
    // fourth is welcomed and held open, idle (nothing to send), for three
    // times the backoff ceiling, then dropped. A connection that healthy
    // starts the count again: one failure after it, not four.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let backoff_max = Duration::from_millis(100);
    tokio::spawn(async move {
        for _ in 0..3 {
            let Ok((stream, _)) = listener.accept().await else { return };
            drop(stream);
        }
        let Ok((stream, _)) = listener.accept().await else { return };
        let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else { return };
        if let Some(Frame::Handshake { generation, .. }) = next_frame(&mut ws).await {
            let _ = ws.send(send(Frame::Welcome { generation, next: 0, received: 0, terms: TERMS })).await;
        }
        // Read (and so answer pings) until the connection has lasted.
        let until = tokio::time::Instant::now() + 3 * backoff_max;
        while tokio::time::timeout_at(until, ws.next()).await.is_ok_and(|m| m.is_some()) {}
        drop(ws);
        hold_all(listener).await;
    });
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let config = SenderConfig { backoff_base: Duration::from_millis(5), backoff_max, ..sender_config(15) };
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), config).unwrap();
    let deadline = tokio::time::Instant::now() + limit();
    while sender.stats().connections < 1 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", sender.stats());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut states = sender.watch_state();
    assert_eq!(failures_after_the_connection(&mut states).await, 1, "counted from one again");
    assert_eq!(sender.stats().failed_attempts, 3);
    sender.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_welcome_for_another_generation_is_a_protocol_error_and_gets_no_data() {
    // A receiver that answers every handshake with a welcome for the next
    // generation: that welcome is not the sender's, so it must send nothing
    // on the connection and count a protocol error.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let data = Arc::new(AtomicU64::new(0));
    let seen = data.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else { return };
                let Some(Frame::Handshake { generation, .. }) = next_frame(&mut ws).await else { return };
                let welcome = Frame::Welcome { generation: generation + 1, next: 0, received: 0, terms: TERMS };
                let _ = ws.send(send(welcome)).await;
                while let Some(frame) = next_frame(&mut ws).await {
                    if matches!(frame, Frame::Data { .. } | Frame::Tombstone { .. }) {
                        seen.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    });
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    cell.enqueue_all((0..5).map(payload));
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), sender_config(16)).unwrap();
    let deadline = tokio::time::Instant::now() + limit();
    while sender.stats().protocol_errors < 2 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", sender.stats());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = sender.shutdown().await;
    assert_eq!(stats.connections, 0, "no connection was taken as welcomed: {stats:?}");
    assert_eq!(data.load(Ordering::SeqCst), 0, "nothing sent under a welcome that was not the sender's");
    assert_eq!(cell.pending_len().get_untracked(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_welcome_gets_the_close_the_protocol_names() {
    // A receiver that answers the n-th handshake with the n-th bad reply and
    // records the close the sender ends with: code 1 for a protocol error,
    // code 2 (with the version the sender speaks) for another version.
    let mut version_3 = Frame::Welcome { generation: 0, next: 0, received: 0, terms: TERMS }.encode().to_vec();
    version_3[1..3].copy_from_slice(&3u16.to_be_bytes());
    type Reply = Box<dyn Fn(u64) -> Message + Send + Sync>;
    let replies: Vec<(Reply, (CloseCode, u64))> = vec![
        (Box::new(|_| Message::Binary(vec![0x02, 0x00].into())), (CloseCode::Protocol, 0)),
        (Box::new(move |_| Message::Binary(version_3.clone().into())), (CloseCode::Version, 2)),
        (
            Box::new(|g| send(Frame::Welcome { generation: g + 1, next: 0, received: 0, terms: TERMS })),
            (CloseCode::Protocol, 0),
        ),
        (Box::new(|g| send(Frame::Ack { generation: g, through: 0 })), (CloseCode::Protocol, 0)),
        (Box::new(|_| Message::Text("welcome".into())), (CloseCode::Protocol, 0)),
        (
            Box::new(|g| send(Frame::Welcome { generation: g, next: 1, received: 0, terms: TERMS })),
            (CloseCode::Protocol, 0),
        ),
    ];
    let expected: Vec<(CloseCode, u64)> = replies.iter().map(|(_, close)| *close).collect();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let closes = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let seen = closes.clone();
    tokio::spawn(async move {
        for (reply, _) in replies {
            let Ok((stream, _)) = listener.accept().await else { return };
            let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else { return };
            let Some(Frame::Handshake { generation, .. }) = next_frame(&mut ws).await else { return };
            let _ = ws.send(reply(generation)).await;
            let close = close_of(&mut ws).await;
            seen.lock().push(close);
        }
    });
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    cell.enqueue_all((0..3).map(payload));
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), sender_config(21)).unwrap();
    let deadline = tokio::time::Instant::now() + limit();
    while closes.lock().len() < expected.len() {
        assert!(tokio::time::Instant::now() < deadline, "closes so far: {:?}", closes.lock());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = sender.shutdown().await;
    let got: Vec<Option<(CloseCode, u64)>> = closes.lock().clone();
    assert_eq!(got, expected.into_iter().map(Some).collect::<Vec<_>>());
    assert_eq!(stats.protocol_errors, 6, "{stats:?}");
    assert_eq!(cell.pending_len().get_untracked(), 3, "nothing was taken as sent");
}

/// A receiver that welcomes each connection and then neither reads nor
/// writes anything (not even a pong): silent, as a hung peer is. Counts
/// the connections.
async fn silent_receiver() -> (std::net::SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicU64::new(0));
    let count = connections.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else { return };
                if let Some(Frame::Handshake { generation, .. }) = next_frame(&mut ws).await {
                    // A keepalive of 10 ms: the stall timeout in force is the
                    // configured one (at least three keepalives), not 3 s.
                    let terms = Terms { keepalive_ms: 10, ..TERMS };
                    let _ = ws.send(send(Frame::Welcome { generation, next: 0, received: 0, terms })).await;
                }
                std::future::pending::<()>().await;
                drop(ws);
            });
        }
    });
    (addr, connections)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_silent_with_records_in_flight_is_left_after_the_stall_timeout() {
    let (addr, connections) = silent_receiver().await;
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let config = SenderConfig { stall_timeout: Some(Duration::from_millis(200)), ..sender_config(17) };
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), config).unwrap();
    let mut states = sender.watch_state();
    cell.enqueue_all((0..5).map(payload));
    let deadline = tokio::time::Instant::now() + limit();
    let why = loop {
        let state = tokio::time::timeout_at(deadline, states.next()).await.expect("a state in time").unwrap();
        if let egress_ws::ConnectionState::Reconnecting { error, .. } = state {
            break error;
        }
    };
    assert!(matches!(&why, egress_ws::ConnectError::Lost(d) if d.contains("fell silent")), "{why:?}");
    assert!(connections.load(Ordering::SeqCst) >= 1);
    sender.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_silent_with_nothing_in_flight_is_not_a_stall() {
    // Nothing to send, nothing to wait for: silence proves nothing, and the
    // connection stays, however long (here five stall timeouts).
    let (addr, connections) = silent_receiver().await;
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let config = SenderConfig { stall_timeout: Some(Duration::from_millis(100)), ..sender_config(18) };
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), config).unwrap();
    let deadline = tokio::time::Instant::now() + limit();
    while sender.stats().connections < 1 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", sender.stats());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stats = sender.shutdown().await;
    assert_eq!((stats.connections, stats.reconnects), (1, 0), "{stats:?}");
    assert_eq!(connections.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_got_records_through_resets_the_failures() {
    // Three attempts refused before the upgrade; the fourth reaches a real
    // receiver through a splice, gets records through, and is cut. The
    // backoff ceiling is far away, so only the progress can reset the
    // count: one failure after the cut, not four.
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let to = receiver.local_addr();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (cut, cut_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        for _ in 0..3 {
            let Ok((stream, _)) = listener.accept().await else { return };
            drop(stream);
        }
        let Ok((stream, _)) = listener.accept().await else { return };
        tokio::select! {
            () = splice(stream, to) => {}
            _ = cut_rx => {}
        }
        hold_all(listener).await;
    });
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let config = SenderConfig {
        backoff_base: Duration::from_millis(5),
        backoff_max: Duration::from_secs(60),
        ..sender_config(19)
    };
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), config).unwrap();
    cell.enqueue_all((0..10).map(payload));
    receive_in_order(&mut receiver, 0, 10).await;
    drained(&cell, 10).await;
    let mut states = sender.watch_state();
    let _ = cut.send(());
    assert_eq!(failures_after_the_connection(&mut states).await, 1, "counted from one again");
    assert_eq!(sender.stats().failed_attempts, 3);
    sender.shutdown().await;
}

/// A frame from the receiver larger than the sender's read buffer (a
/// close with a 100,000-byte reason) is read whole: the sender acts on its
/// code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_frame_larger_than_the_read_buffer_is_read_whole() {
    fn long(_: u64) -> Frame {
        Frame::Close { code: CloseCode::Retry, detail: 0, reason: "r".repeat(100_000) }
    }
    let (addr, _accepted) = refusing_receiver(long).await;
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), sender_config(13)).unwrap();
    let mut states = sender.watch_state();
    let error = loop {
        match states.next().await.expect("the sender runs") {
            egress_ws::ConnectionState::Reconnecting { error, .. } => break error,
            _ => continue,
        }
    };
    // Read whole and decoded: the close's code, not a broken read or a
    // protocol error.
    assert!(matches!(error, egress_ws::ConnectError::Renew(_)), "{error:?}");
    sender.shutdown().await;
}

/// Payloads several times the receiver's read buffer (and tungstenite's
/// default of 128 KiB) arrive whole and in order, between small ones: the
/// receiver reads a large frame in several reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_larger_than_the_receivers_read_buffer_arrive_whole() {
    fn sized(i: u64) -> Bytes {
        let len = if i.is_multiple_of(2) { 300_000 + i as usize } else { 7 };
        Bytes::from((0..len).map(|b| (b as u64 ^ i) as u8).collect::<Vec<u8>>())
    }
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), sender_config(23)).unwrap();
    cell.enqueue_all((0..8).map(sized));
    for i in 0..8 {
        let d = recv(&mut receiver).await;
        assert_eq!(d.sequence, i);
        assert_eq!(d.content, Content::Message(sized(i)), "payload {i} whole");
    }
    drained(&cell, 8).await;
    sender.shutdown().await;
}
