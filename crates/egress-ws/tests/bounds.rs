#![allow(clippy::unwrap_used)]
//! Every resource of the receiver is bounded, every timeout starts when it
//! must, and a hostile peer takes nothing from the others: connections that
//! never upgrade or go silent, a connection cap, out-of-order and queued
//! bytes, the producer table, a resume point above a buffer. Each test
//! asserts the bound through the receiver's own counters, and that a
//! well-behaved producer still delivers exactly once and in order.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{
    Client, drained, limit, next_frame, payload, policy, raw, receive_in_order, sender_config, until, ws_frame,
};
use egress_reactive::{AsyncContext, AsyncEgressCell};
use egress_ws::protocol::{CloseCode, Frame};
use egress_ws::{Content, Receiver, ReceiverConfig, Sender};
use futures_util::SinkExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

fn send(frame: Frame) -> Message {
    Message::Binary(frame.encode())
}

/// Whether the peer closed `stream` (a read sees the end, or an error).
async fn closed(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 512];
    loop {
        match tokio::time::timeout(limit(), stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

/// A raw producer `name`, admitted at `generation`.
async fn producer(receiver: &Receiver, name: &str, generation: u64, resume_from: u64) -> Client {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}", receiver.local_addr())).await.unwrap();
    let hello = Frame::Handshake { producer: name.into(), incarnation: 1, generation, resume_from };
    ws.send(send(hello)).await.unwrap();
    match next_frame(&mut ws).await {
        Some(Frame::Welcome { .. }) => ws,
        other => panic!("{name}: expected a welcome, got {other:?}"),
    }
}

fn data(generation: u64, sequence: u64, payload: Bytes) -> Message {
    send(Frame::Data { generation, sequence, attempt: 1, payload })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_upgrade_are_closed_at_the_handshake_timeout() {
    let config = ReceiverConfig { handshake_timeout: Duration::from_millis(300), ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let addr = receiver.local_addr();
    // 40 that send nothing, 10 half an HTTP request.
    let mut idle = Vec::new();
    for i in 0..50 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        if i % 5 == 0 {
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        }
        idle.push(s);
    }
    // Meanwhile a real producer delivers.
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), sender_config(1)).unwrap();
    cell.enqueue_all((0..20).map(payload));
    receive_in_order(&mut receiver, 0, 20).await;
    drained(&cell, 20).await;
    let stats = until(&receiver, "the idle ones closed", |s| s.handshake_timeouts >= 50).await;
    assert_eq!(stats.open_connections, 1, "only the producer's is left: {stats:?}");
    for s in &mut idle {
        assert!(closed(s).await, "the receiver closed it");
    }
    sender.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cap_answers_503_and_the_timeouts_free_it() {
    let config = ReceiverConfig {
        max_connections: 8,
        handshake_timeout: Duration::from_millis(300),
        ..ReceiverConfig::default()
    };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let addr = receiver.local_addr();
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    until(&receiver, "8 open", |s| s.open_connections == 8).await;
    let mut ninth = TcpStream::connect(addr).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(limit(), ninth.read_to_end(&mut answer)).await.unwrap().unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 503"), "{:?}", String::from_utf8_lossy(&answer));
    assert_eq!(receiver.stats().refused_capacity, 1);
    // The idle ones time out; a real producer gets in.
    until(&receiver, "the idle ones closed", |s| s.open_connections == 0).await;
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), sender_config(2)).unwrap();
    cell.enqueue_all((0..10).map(payload));
    receive_in_order(&mut receiver, 0, 10).await;
    drained(&cell, 10).await;
    sender.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_half_sent_connections_are_closed_at_the_idle_timeout() {
    let config = ReceiverConfig {
        idle_timeout: Duration::from_millis(400),
        keepalive: Duration::from_millis(100),
        ..ReceiverConfig::default()
    };
    let receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    // One admitted and then silent (it never reads, so never answers a
    // ping); one that sends half a frame and stops.
    let silent = producer(&receiver, "silent", 1, 0).await;
    let mut half = producer(&receiver, "half", 1, 0).await;
    let tcp = match half.get_mut() {
        tokio_tungstenite::MaybeTlsStream::Plain(tcp) => tcp,
        _ => unreachable!("plain TCP"),
    };
    // A masked binary frame header announcing 126 bytes, then 3 of them.
    tcp.write_all(&[0x82, 0x80 | 126, 0x00, 126, 1, 2, 3, 4, 9, 9, 9]).await.unwrap();
    // Counted as closed for silence first, then gone from the open count
    // when the connection's task ends: wait for both.
    let stats = until(&receiver, "both closed", |s| s.idle_closed >= 2 && s.open_connections == 0).await;
    assert_eq!(stats.idle_closed, 2, "{stats:?}");
    drop((silent, half));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_slower_than_the_idle_timeout_is_not_a_silent_producer() {
    // The delivery buffer fills and the receiver stops reading: that
    // silence is the receiver's, not the producer's, and does not count.
    let config = ReceiverConfig {
        idle_timeout: Duration::from_millis(300),
        keepalive: Duration::from_millis(100),
        delivery_buffer: 4,
        ..ReceiverConfig::default()
    };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), sender_config(3)).unwrap();
    cell.enqueue_all((0..40).map(payload));
    until(&receiver, "the buffer full", |s| s.queued == 4).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    receive_in_order(&mut receiver, 0, 40).await;
    drained(&cell, 40).await;
    let stats = sender.shutdown().await;
    assert_eq!((receiver.stats().idle_closed, stats.reconnects), (0, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_order_bytes_are_bounded_and_go_with_their_connection() {
    let config = ReceiverConfig {
        max_buffered_bytes: 64 << 10,
        max_buffered_bytes_total: 128 << 10,
        ..ReceiverConfig::default()
    };
    let receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let big = Bytes::from(vec![7u8; 32 << 10]);
    let mut clients = Vec::new();
    for p in 0..4 {
        let mut ws = producer(&receiver, &format!("p{p}"), 1, 0).await;
        // Sequence 0 never comes: everything waits above the gap.
        for sequence in 1..=8 {
            ws.send(data(1, sequence, big.clone())).await.unwrap();
        }
        clients.push(ws);
    }
    let stats =
        until(&receiver, "every frame seen", |s| s.overflow + (s.bytes_buffered / (32 << 10)) as u64 >= 32).await;
    assert!(stats.bytes_buffered <= 128 << 10, "{stats:?}");
    assert!(stats.overflow >= 32 - 4, "{stats:?}");
    drop(clients);
    let stats = until(&receiver, "freed", |s| s.open_connections == 0).await;
    assert_eq!(stats.bytes_buffered, 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_bytes_are_bounded() {
    let config = ReceiverConfig { delivery_buffer_bytes: 100 << 10, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let big = |i: u64| Bytes::from(vec![u8::try_from(i).unwrap(); 32 << 10]);
    let mut ws = producer(&receiver, "p", 1, 0).await;
    tokio::spawn(async move {
        for sequence in 0..20 {
            if ws.send(data(1, sequence, big(sequence))).await.is_err() {
                return;
            }
        }
        // Keep the connection while the application catches up.
        while next_frame(&mut ws).await.is_some() {}
    });
    let stats = until(&receiver, "the buffer full", |s| s.queued >= 3).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stats_later = receiver.stats();
    assert!(stats_later.bytes_queued <= 100 << 10, "{stats:?} {stats_later:?}");
    for i in 0..20 {
        let d = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
        assert_eq!((d.sequence, d.content), (i, Content::Message(big(i))));
        assert!(receiver.stats().bytes_queued <= 100 << 10);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_producer_table_is_bounded_and_idle_ids_are_forgotten() {
    let config = ReceiverConfig {
        max_producers: 5,
        producer_idle: Duration::from_millis(200),
        eviction_floor: Duration::ZERO,
        ..ReceiverConfig::default()
    };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let url = format!("ws://{}", receiver.local_addr());
    let mut held = Vec::new();
    for p in 0..5 {
        held.push(producer(&receiver, &format!("p{p}"), 1, 0).await);
    }
    // A sixth while all five are connected: refused as busy.
    let (mut sixth, _) = tokio_tungstenite::connect_async(url.clone()).await.unwrap();
    sixth
        .send(send(Frame::Handshake { producer: "p5".into(), incarnation: 1, generation: 1, resume_from: 0 }))
        .await
        .unwrap();
    match next_frame(&mut sixth).await {
        Some(Frame::Close { code: CloseCode::Busy, .. }) => {}
        other => panic!("expected a busy refusal, got {other:?}"),
    }
    assert_eq!(receiver.stats().refused_busy, 1);
    // They leave; each is idle (nothing waits for the application), so a
    // new id takes the place of the one idle the longest...
    drop(held);
    until(&receiver, "all gone", |s| s.open_connections == 0).await;
    let _p5 = producer(&receiver, "p5", 1, 0).await;
    let stats = receiver.stats();
    assert_eq!((stats.producers, stats.evictions), (5, 1), "{stats:?}");
    // ...and after the idle time every idle one goes at the next change.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let _p6 = producer(&receiver, "p6", 1, 0).await;
    let stats = receiver.stats();
    assert_eq!((stats.producers, stats.evictions), (2, 5), "{stats:?}");
    // A forgotten id is admitted like a new one, from its resume point.
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender =
        Sender::spawn(cell.clone(), url, egress_ws::SenderConfig { producer: "p0".into(), ..sender_config(4) })
            .unwrap();
    cell.enqueue_all((0..5).map(payload));
    for i in 0..5 {
        let d = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
        assert_eq!((&*d.producer, d.sequence), ("p0", i));
    }
    drained(&cell, 5).await;
    sender.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_point_above_a_gap_does_not_wedge_the_stream() {
    // 0..9 delivered, 20..29 buffered above the gap; the producer
    // reconnects saying it holds nothing below 20. The stream resumes at
    // 20, its resend of 20..29 is delivered, and acknowledged.
    let config = ReceiverConfig { ack_every: 1, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let mut first = producer(&receiver, "p", 1, 0).await;
    for sequence in (0..10).chain(20..30) {
        first.send(data(1, sequence, payload(sequence))).await.unwrap();
    }
    for i in 0..10 {
        let d = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
        assert_eq!(d.sequence, i);
    }
    let mut second = producer(&receiver, "p", 2, 20).await;
    for sequence in 20..30 {
        second.send(data(2, sequence, payload(sequence))).await.unwrap();
    }
    for i in 20..30 {
        let d = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
        assert_eq!((d.sequence, d.content), (i, Content::Message(payload(i))));
    }
    loop {
        match next_frame(&mut second).await {
            Some(Frame::Ack { through: 29, .. }) => break,
            Some(Frame::Ack { .. }) => {}
            other => panic!("expected acks up to 29, got {other:?}"),
        }
    }
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_out_of_generations_stops_its_sender_without_a_panic_or_a_loop() {
    let receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let cx = AsyncContext::new();
    let options = egress_reactive::CellOptions::new().generation(egress_core::Generation(u64::MAX));
    let cell = AsyncEgressCell::with_options(&cx, policy(), options);
    cell.enqueue_all((0..3).map(payload));
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), sender_config(5)).unwrap();
    let deadline = tokio::time::Instant::now() + limit();
    while sender.failure().is_none() {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", sender.stats());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = sender.stats();
    // The one attempt opened a connection (a generation is taken only once
    // one is up), found no generation, and stopped before any handshake.
    assert_eq!((stats.connections, stats.failed_attempts), (0, 1), "it never handshook: {stats:?}");
    assert_eq!(receiver.stats().connections, 0);
    assert_eq!(cell.pending_len().get_untracked(), 3, "nothing lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_with_nothing_to_say_pings_at_the_period_its_welcome_advertises() {
    // The welcome says "silent at most keepalive-ms"; a ping came every
    // other period (the tick that followed a ping found the silence a hair
    // short of the period and skipped). Real time, so the median gap is
    // judged against a 2x difference, not against scheduling noise.
    let keepalive = Duration::from_millis(100);
    let config = ReceiverConfig { keepalive, idle_timeout: Duration::from_secs(60), ..ReceiverConfig::default() };
    let receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}", receiver.local_addr())).await.unwrap();
    let hello = Frame::Handshake { producer: "quiet".into(), incarnation: 1, generation: 1, resume_from: 0 };
    ws.send(send(hello)).await.unwrap();
    let mut pings = Vec::new();
    let read = async {
        while pings.len() < 9 {
            match futures_util::StreamExt::next(&mut ws).await {
                Some(Ok(Message::Binary(bytes))) => {
                    let frame = Frame::decode(&bytes, egress_ws::protocol::Limits::default()).unwrap();
                    let Frame::Welcome { terms, .. } = frame else { panic!("expected a welcome, got {frame:?}") };
                    assert_eq!(u128::from(terms.keepalive_ms), keepalive.as_millis());
                }
                Some(Ok(Message::Ping(_))) => pings.push(tokio::time::Instant::now()),
                other => panic!("expected pings, got {other:?}"),
            }
        }
    };
    tokio::time::timeout(limit(), read).await.expect("pings keep coming");
    let mut gaps: Vec<Duration> = pings.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort();
    let median = gaps[gaps.len() / 2];
    assert!(median < keepalive * 3 / 2, "pings {median:?} apart with keepalive {keepalive:?}: {gaps:?}");
    // And not much more often than that either: a ping when silent, not a
    // flood.
    assert!(median > keepalive / 2, "pings {median:?} apart with keepalive {keepalive:?}: {gaps:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_is_not_started_with_a_payload_limit_below_the_floor() {
    let small =
        ReceiverConfig { limits: egress_ws::protocol::Limits { max_payload: 1_023 }, ..ReceiverConfig::default() };
    let refused = Receiver::bind("127.0.0.1:0", small).await.expect_err("below the floor");
    assert_eq!(refused.kind(), std::io::ErrorKind::InvalidInput);
    let at = ReceiverConfig { limits: egress_ws::protocol::Limits { max_payload: 1_024 }, ..ReceiverConfig::default() };
    assert!(Receiver::bind("127.0.0.1:0", at).await.is_ok());
}

/// Whether `payload` owns an allocation of its own length: nothing else
/// shares it (a payload that is a slice of a larger buffer keeps all of
/// that buffer alive however small it is).
fn owns_exactly(payload: Bytes) -> Result<(), String> {
    let len = payload.len();
    match payload.try_into_mut() {
        Ok(owned) if owned.capacity() == len => Ok(()),
        Ok(owned) => Err(format!("{len} bytes hold an allocation of {}", owned.capacity())),
        Err(_) => Err(format!("{len} bytes share their allocation")),
    }
}

/// A payload the receiver keeps (buffered above a gap, or queued for the
/// application) holds its own bytes and no more, so the byte bounds
/// (`max_buffered_bytes`, `max_buffered_bytes_total`,
/// `delivery_buffer_bytes`) bound memory: one-byte frames read into a
/// buffer that held a 1 MB frame before them do not each keep that buffer
/// alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_payload_holds_only_its_own_bytes_not_the_read_buffer() {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let mut ws = producer(&receiver, "p", 1, 0).await;
    let one = |i: u64| Bytes::from(vec![i as u8]);
    ws.send(data(1, 0, one(0))).await.unwrap();
    let first = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
    assert_eq!(first.content, Content::Message(one(0)));
    let big = Bytes::from(vec![7u8; 1_000_000]);
    let n = 8;
    for i in 0..n {
        // A 1 MB duplicate (sequence 0 again) makes the read buffer that
        // large; the one-byte frame after it is read into that buffer and
        // kept, above the gap at 1.
        ws.send(data(1, 0, big.clone())).await.unwrap();
        until(&receiver, "the duplicate read", |s| s.duplicates > i).await;
        ws.send(data(1, 2 + i, one(2 + i))).await.unwrap();
        until(&receiver, "the frame buffered", |s| s.bytes_buffered as u64 > i).await;
    }
    // Sequence 1 fills the gap: all of them go to the application.
    ws.send(data(1, 1, one(1))).await.unwrap();
    for sequence in 1..2 + n {
        let d = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
        assert_eq!(d.sequence, sequence);
        let Content::Message(payload) = d.content else { panic!("a message") };
        assert_eq!(payload, one(sequence));
        owns_exactly(payload).unwrap_or_else(|e| panic!("sequence {sequence}: {e}"));
    }
}

/// A frame the producer splits into WebSocket fragments, with pings
/// between them (each heard, so the idle timer starts again), is still
/// bounded by the max payload: fragments that add up to more are refused
/// (code 1), and a frame within it is delivered whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_in_fragments_with_pings_between_is_bounded_by_the_max_payload() {
    let limits = egress_ws::protocol::Limits { max_payload: 1_024 };
    let config = ReceiverConfig { limits, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let fragmented = |payload: Bytes| {
        let frame = Frame::Data { generation: 1, sequence: 0, attempt: 1, payload }.encode();
        let pieces: Vec<&[u8]> = frame.chunks(300).collect();
        let mut wire = Vec::new();
        for (i, piece) in pieces.iter().enumerate() {
            let opcode = if i == 0 { 2 } else { 0 };
            wire.extend(ws_frame(i + 1 == pieces.len(), opcode, piece));
            wire.extend(ws_frame(true, 9, b"still here"));
        }
        wire
    };
    // Within the limit: delivered whole.
    let mut ws = producer(&receiver, "within", 1, 0).await;
    let fits = Bytes::from(vec![5u8; 1_024]);
    raw(&mut ws).write_all(&fragmented(fits.clone())).await.unwrap();
    let d = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
    assert_eq!((&*d.producer, d.content), ("within", Content::Message(fits)));
    // Over it, by fragments that each fit: refused.
    let mut ws = producer(&receiver, "over", 1, 0).await;
    raw(&mut ws).write_all(&fragmented(Bytes::from(vec![5u8; 1_200]))).await.unwrap();
    assert_eq!(common::close_of(&mut ws).await.map(|(code, _)| code), Some(CloseCode::Protocol));
}

/// What the idle timer counts as heard: any WebSocket message, pings and
/// pongs from the producer included. A producer that only sends those,
/// and never reads (so never answers the receiver's keepalive), stays open
/// well past the idle timeout; when it stops, it is closed for silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producers_pings_count_as_heard() {
    let idle = Duration::from_millis(300);
    let config = ReceiverConfig { idle_timeout: idle, ..ReceiverConfig::default() };
    let receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let mut ws = producer(&receiver, "pinger", 1, 0).await;
    for i in 0..12 {
        // Pings and unsolicited pongs, in turn.
        let opcode = if i % 2 == 0 { 9 } else { 10 };
        raw(&mut ws).write_all(&ws_frame(true, opcode, b"here")).await.unwrap();
        tokio::time::sleep(idle / 4).await;
    }
    // Three idle timeouts of pings: still open.
    let stats = receiver.stats();
    assert_eq!((stats.idle_closed, stats.open_connections), (0, 1), "{stats:?}");
    let stats = until(&receiver, "closed once silent", |s| s.idle_closed == 1 && s.open_connections == 0).await;
    assert_eq!(stats.idle_closed, 1);
}

/// A frame must arrive whole within the idle timeout even when it comes in
/// WebSocket fragments: fragments alone (no ping or pong between them) do
/// not start the timer again, so a producer that trickles one slowly is
/// closed for silence, and nothing of it is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_trickled_in_fragments_is_closed_at_the_idle_timeout() {
    let idle = Duration::from_millis(300);
    let config = ReceiverConfig { idle_timeout: idle, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let mut ws = producer(&receiver, "trickle", 1, 0).await;
    let frame = Frame::Data { generation: 1, sequence: 0, attempt: 1, payload: Bytes::from(vec![1u8; 500]) }.encode();
    let pieces: Vec<&[u8]> = frame.chunks(50).collect();
    let started = tokio::time::Instant::now();
    for (i, piece) in pieces.iter().enumerate() {
        let wrote = raw(&mut ws).write_all(&ws_frame(i + 1 == pieces.len(), if i == 0 { 2 } else { 0 }, piece)).await;
        if wrote.is_err() || receiver.stats().idle_closed > 0 {
            break;
        }
        tokio::time::sleep(idle / 3).await;
    }
    let stats = until(&receiver, "closed for silence", |s| s.idle_closed == 1 && s.open_connections == 0).await;
    assert_eq!(stats.delivered, 0, "{stats:?}");
    assert!(started.elapsed() < idle * 3, "closed within the first idle timeouts, not after the last fragment");
    assert!(tokio::time::timeout(Duration::from_millis(50), receiver.recv()).await.is_err(), "nothing delivered");
}
