#![allow(clippy::unwrap_used)]
//! The receiver's tables are bounded, and a bound never costs a producer
//! its exactly-once: a stream whose producer may not have seen the
//! acknowledgements of what the application took is not forgotten for a
//! newcomer (a new producer id, or a new incarnation under its id). The
//! newcomer is refused with code 6 and a retry-after instead. Each test
//! plays the victim whose acks were lost with a raw client (it never reads
//! them) and checks that, back with resume-from 0, it is welcomed at the
//! watermark the application reached, and nothing is handed over twice.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{limit, next_frame, payload, policy, sender_config, until};
use egress_reactive::{AsyncContext, AsyncEgressCell};
use egress_ws::protocol::{CloseCode, Frame};
use egress_ws::{Content, Receiver, ReceiverConfig, Sender};
use futures_util::SinkExt;
use tokio_tungstenite::tungstenite::Message;

type Client = common::Client;

fn hello(producer: &str, incarnation: u128, generation: u64, resume_from: u64) -> Message {
    Message::Binary(Frame::Handshake { producer: producer.into(), incarnation, generation, resume_from }.encode())
}

fn data(generation: u64, sequence: u64) -> Message {
    Message::Binary(Frame::Data { generation, sequence, attempt: 1, payload: payload(sequence) }.encode())
}

/// Connects and handshakes; returns the connection and its reply.
async fn handshake(
    receiver: &Receiver,
    producer: &str,
    incarnation: u128,
    generation: u64,
    resume_from: u64,
) -> (Client, Option<Frame>) {
    let mut ws = common::raw_client(receiver).await;
    ws.send(hello(producer, incarnation, generation, resume_from)).await.unwrap();
    let reply = next_frame(&mut ws).await;
    (ws, reply)
}

/// A producer that sends `n` messages, has the application take them
/// (each is acknowledged), and goes away without reading an ack: it never
/// learns of them.
async fn send_and_vanish(receiver: &mut Receiver, producer: &str, incarnation: u128, generation: u64, n: u64) {
    let (mut ws, reply) = handshake(receiver, producer, incarnation, generation, 0).await;
    assert!(matches!(reply, Some(Frame::Welcome { next: 0, .. })), "{producer}: {reply:?}");
    for i in 0..n {
        ws.send(data(generation, i)).await.unwrap();
    }
    for i in 0..n {
        let d = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
        assert_eq!((&*d.producer, d.incarnation.0, d.sequence), (producer, incarnation, i));
    }
    let open = receiver.stats().open_connections;
    drop(ws);
    until(receiver, "the connection gone", |s| s.open_connections < open).await;
}

/// The victim comes back with resume-from 0: it must be welcomed at `n`,
/// and its replay of `0..n` must not reach the application (the next
/// thing handed over is its sequence `n`).
async fn comes_back_at(receiver: &mut Receiver, producer: &str, incarnation: u128, generation: u64, n: u64) {
    let (mut ws, reply) = handshake(receiver, producer, incarnation, generation, 0).await;
    match reply {
        Some(Frame::Welcome { next, received, .. }) => {
            assert_eq!((next, received), (n, n), "{producer} is welcomed where its application was");
        }
        other => panic!("{producer}: expected a welcome, got {other:?}"),
    }
    for i in 0..=n {
        ws.send(data(generation, i)).await.unwrap();
    }
    let d = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
    assert_eq!((&*d.producer, d.sequence), (producer, n), "nothing handed over twice");
    assert_eq!(d.content, Content::Message(payload(n)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_strangers_never_forgets_a_producer_whose_acks_were_not_seen() {
    // A small table, no floor: strangers that send nothing are forgettable
    // at once, and make room for each other.
    let config = ReceiverConfig { max_producers: 4, eviction_floor: Duration::ZERO, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    send_and_vanish(&mut receiver, "victim", 1, 1, 5).await;
    let mut busy = 0;
    for s in 0..60 {
        let (ws, reply) = handshake(&receiver, &format!("stranger-{s}"), 1, 1, 0).await;
        match reply {
            Some(Frame::Welcome { .. }) => {}
            Some(Frame::Close { code: CloseCode::Busy, .. }) => busy += 1,
            other => panic!("stranger-{s}: {other:?}"),
        }
        drop(ws);
        until(&receiver, "the stranger gone", |st| st.open_connections == 0).await;
    }
    assert_eq!(busy, 0, "strangers that sent nothing make room for each other");
    let stats = receiver.stats();
    assert!(stats.evictions >= 56, "{stats:?}");
    assert_eq!(stats.unconfirmed_forgotten, 0);
    comes_back_at(&mut receiver, "victim", 1, 2, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_full_of_unconfirmed_producers_refuses_a_newcomer_with_a_retry_after() {
    let idle = Duration::from_secs(60);
    let config = ReceiverConfig {
        max_producers: 2,
        producer_idle: idle,
        eviction_floor: Duration::ZERO,
        ..ReceiverConfig::default()
    };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    send_and_vanish(&mut receiver, "a", 1, 1, 3).await;
    send_and_vanish(&mut receiver, "b", 1, 1, 2).await;
    let (_ws, reply) = handshake(&receiver, "newcomer", 1, 1, 0).await;
    match reply {
        Some(Frame::Close { code: CloseCode::Busy, detail, .. }) => {
            // Room is made when the first idle one expires: within the
            // producer-idle time, and not at once.
            let ms = u64::try_from(idle.as_millis()).unwrap();
            assert!(detail > ms / 2 && detail <= ms, "retry after {detail} ms");
        }
        other => panic!("expected a busy refusal, got {other:?}"),
    }
    assert_eq!(receiver.stats().refused_busy, 1);
    // `b` comes back and closes in order, naming what it saw acknowledged
    // (everything): now it may be forgotten, and the newcomer fits.
    let (mut ws, reply) = handshake(&receiver, "b", 1, 2, 0).await;
    assert!(matches!(reply, Some(Frame::Welcome { next: 2, .. })), "{reply:?}");
    let close = Frame::Close { code: CloseCode::Normal, detail: 2, reason: "done".into() };
    ws.send(Message::Binary(close.encode())).await.unwrap();
    until(&receiver, "b gone", |s| s.open_connections == 0).await;
    let (_ws, reply) = handshake(&receiver, "newcomer", 1, 1, 0).await;
    assert!(matches!(reply, Some(Frame::Welcome { .. })), "{reply:?}");
    assert_eq!(receiver.stats().evictions, 1);
    // `a`, which never confirmed, is still held.
    comes_back_at(&mut receiver, "a", 1, 2, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmation_covers_only_what_was_committed() {
    // A producer that claims, in its orderly close, more than the receiver
    // acknowledged confirms only what was: the stream stays unforgettable
    // while anything committed is unconfirmed. Here the claim is about an
    // earlier watermark: it confirms 1 of 3.
    let config = ReceiverConfig { max_producers: 1, eviction_floor: Duration::ZERO, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let (mut ws, _) = handshake(&receiver, "a", 1, 1, 0).await;
    for i in 0..3 {
        ws.send(data(1, i)).await.unwrap();
    }
    for _ in 0..3 {
        tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
    }
    let close = Frame::Close { code: CloseCode::Normal, detail: 1, reason: "done".into() };
    ws.send(Message::Binary(close.encode())).await.unwrap();
    until(&receiver, "a gone", |s| s.open_connections == 0).await;
    let (_ws, reply) = handshake(&receiver, "newcomer", 1, 1, 0).await;
    assert!(matches!(reply, Some(Frame::Close { code: CloseCode::Busy, .. })), "{reply:?}");
    comes_back_at(&mut receiver, "a", 1, 2, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_incarnations_under_an_id_never_forget_one_whose_acks_were_not_seen() {
    let config = ReceiverConfig { incarnations_per_producer: 4, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    send_and_vanish(&mut receiver, "p", 1, 1, 5).await;
    // A squatter under the same id: each new incarnation takes one message.
    let mut generation = 1;
    let mut refused = 0;
    for incarnation in 2..=8 {
        generation += 1;
        let (mut ws, reply) = handshake(&receiver, "p", incarnation, generation, 0).await;
        match reply {
            Some(Frame::Welcome { .. }) => {
                ws.send(data(generation, 0)).await.unwrap();
                let d = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
                assert_eq!((d.incarnation.0, d.sequence), (incarnation, 0));
            }
            Some(Frame::Close { code: CloseCode::Busy, detail, .. }) => {
                assert!(detail > 0, "a retry-after");
                refused += 1;
            }
            other => panic!("incarnation {incarnation}: {other:?}"),
        }
        drop(ws);
        until(&receiver, "the squatter gone", |s| s.open_connections == 0).await;
    }
    assert_eq!(refused, 4, "three more incarnations fit, the rest are refused");
    // Refused while every place holds an unconfirmed stream, whatever the
    // newcomer would send.
    for incarnation in 10..20 {
        generation += 1;
        let (ws, reply) = handshake(&receiver, "p", incarnation, generation, 0).await;
        assert!(matches!(reply, Some(Frame::Close { code: CloseCode::Busy, .. })), "{reply:?}");
        drop(ws);
    }
    until(&receiver, "the squatters gone", |s| s.open_connections == 0).await;
    comes_back_at(&mut receiver, "p", 1, generation + 1, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sender_waits_for_a_busy_receivers_retry_after() {
    // One producer id at most, held by one that never confirmed its acks:
    // a new sender is refused until the holder expires (producer-idle,
    // 1.5 s), and waits that long rather than retrying at its backoff
    // (50 ms at most).
    let idle = Duration::from_millis(1_500);
    let config = ReceiverConfig {
        max_producers: 1,
        producer_idle: idle,
        eviction_floor: Duration::ZERO,
        ..ReceiverConfig::default()
    };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    send_and_vanish(&mut receiver, "holder", 1, 1, 1).await;
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<Bytes> = AsyncEgressCell::new(&cx, policy());
    cell.enqueue_all((0..3).map(payload));
    let url = format!("ws://{}", receiver.local_addr());
    let sender = Sender::spawn(cell.clone(), url, sender_config(3)).unwrap();
    common::receive_in_order(&mut receiver, 0, 3).await;
    let receiver_stats = receiver.stats();
    assert_eq!(receiver_stats.unconfirmed_forgotten, 1, "{receiver_stats:?}");
    let stats = sender.shutdown().await;
    // Refused once or twice (the retry-after is counted from the refusal,
    // the expiry from the holder's end), never at the pace of the backoff.
    assert!((1..=3).contains(&receiver_stats.refused_busy), "{receiver_stats:?}");
    assert!(stats.failed_attempts <= 3, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_receiver_cannot_park_a_sender_for_more_than_a_minute() {
    // A hostile receiver answers every handshake with code 6 and the
    // largest retry-after there is: the sender waits at most 60 s.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else { continue };
            let _ = next_frame(&mut ws).await;
            let busy = Frame::Close { code: CloseCode::Busy, detail: u64::MAX, reason: "busy".into() };
            let _ = ws.send(Message::Binary(busy.encode())).await;
            held.push(ws);
        }
    });
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<Bytes> = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell, format!("ws://{addr}"), sender_config(31)).unwrap();
    let mut states = sender.watch_state();
    let deadline = tokio::time::Instant::now() + limit();
    let retry_at = loop {
        let state = tokio::time::timeout_at(deadline, futures_util::StreamExt::next(&mut states)).await;
        if let Ok(Some(egress_ws::ConnectionState::Reconnecting { retry_at, .. })) = state {
            break retry_at;
        }
        assert!(state.is_ok(), "no reconnect in time");
    };
    let wait = retry_at.saturating_duration_since(std::time::Instant::now());
    assert!(wait > Duration::from_secs(55) && wait <= Duration::from_secs(60), "waits {wait:?}");
    sender.shutdown().await;
}
