#![allow(clippy::unwrap_used)]
//! A receiver facing hostile or confused producers over 127.0.0.1: each bad
//! input closes that connection with the code docs/protocol.md gives it, is
//! counted, delivers nothing, and leaves every other producer unharmed.

mod common;

use bytes::Bytes;
use common::{
    close_of, data, drained, handshake, next_frame, payload, policy, raw_client, receive_in_order, sender_config,
};
use egress_core::DeadReason;
use egress_reactive::{AsyncContext, AsyncEgressCell};
use egress_ws::protocol::{CloseCode, Frame, Limits, VERSION};
use egress_ws::{Receiver, ReceiverConfig, Sender};
use futures_util::SinkExt;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_closes_that_connection_and_nothing_else() {
    let config = ReceiverConfig { limits: Limits { max_payload: 1_024 }, ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let bad: Vec<(&str, Vec<Message>)> = vec![
        ("garbage", vec![Message::Binary(Bytes::from_static(b"\x00\xff garbage"))]),
        (
            "truncated handshake",
            vec![Message::Binary(
                Frame::Handshake { producer: "x".into(), incarnation: 1, generation: 1, resume_from: 0 }
                    .encode()
                    .slice(..7),
            )],
        ),
        ("text", vec![Message::text("hello")]),
        ("data before the handshake", vec![data(1, 0)]),
        (
            "oversized payload",
            vec![
                handshake(1, 1, 0),
                Message::Binary(
                    Frame::Data { generation: 1, sequence: 0, attempt: 1, payload: Bytes::from(vec![7; 2_000]) }
                        .encode(),
                ),
            ],
        ),
        ("a data frame of another generation", vec![handshake(1, 2, 0), data(1, 0)]),
        (
            "an ack from a producer",
            vec![handshake(1, 3, 0), Message::Binary(Frame::Ack { generation: 3, through: 99 }.encode())],
        ),
        ("unknown frame type", vec![handshake(1, 4, 0), Message::Binary(Bytes::from_static(&[0x42, 1, 2]))]),
        ("sequence u64::MAX", vec![handshake(1, 5, 0), data(5, u64::MAX)]),
        (
            "a tombstone of another generation",
            vec![
                handshake(1, 6, 0),
                Message::Binary(
                    Frame::Tombstone { generation: 5, sequence: 0, attempt: 1, reason: DeadReason::Permanent }.encode(),
                ),
            ],
        ),
    ];
    let n = bad.len() as u64;
    for (what, messages) in bad {
        let mut ws = raw_client(&receiver).await;
        for m in messages {
            let _ = ws.send(m).await;
        }
        let code = close_of(&mut ws).await.map(|(c, _)| c);
        assert_eq!(code, Some(CloseCode::Protocol), "{what}");
    }
    assert_eq!(receiver.stats().rejected, n);
    assert_eq!(receiver.stats().delivered, 0, "nothing hostile was delivered");
    // A well-behaved producer still gets everything through.
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), sender_config(8)).unwrap();
    for i in 0..100 {
        cell.enqueue(payload(i));
    }
    receive_in_order(&mut receiver, 0, 100).await;
    drained(&cell, 100).await;
    sender.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_announced_above_the_limit_is_refused_at_its_header() {
    // The receiver's WebSocket layer is held to the payload limit, not to
    // the library's defaults: a frame whose header announces 8 MiB (under
    // tungstenite's own 16 MiB default) is refused as soon as the header is
    // read, not buffered while its body comes (here it never does, and the
    // handshake timeout is far away).
    let config = ReceiverConfig {
        limits: Limits { max_payload: 1_024 },
        handshake_timeout: std::time::Duration::from_secs(3_600),
        ..ReceiverConfig::default()
    };
    let receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let mut ws = raw_client(&receiver).await;
    let announced: u64 = 8 << 20;
    // FIN + binary; masked, 64-bit length; the length; the mask; a start.
    let mut frame = vec![0x82, 0x80 | 127];
    frame.extend_from_slice(&announced.to_be_bytes());
    frame.extend_from_slice(&[1, 2, 3, 4]);
    frame.extend_from_slice(&[0; 64]);
    tokio::io::AsyncWriteExt::write_all(ws.get_mut(), &frame).await.unwrap();
    let code = close_of(&mut ws).await.map(|(c, _)| c);
    assert_eq!(code, Some(CloseCode::Protocol), "refused before its body");
    assert_eq!(receiver.stats().rejected, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_version_is_closed_with_the_version_code_and_ours() {
    let receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let mut ws = raw_client(&receiver).await;
    // A version 1 handshake: magic, version 1, id "p", generation, resume.
    let mut v1 = vec![0x01, b'E', b'G', b'R', b'S', 0, 1, 1, b'p'];
    v1.extend_from_slice(&[0; 16]);
    ws.send(Message::Binary(v1.into())).await.unwrap();
    assert_eq!(close_of(&mut ws).await, Some((CloseCode::Version, u64::from(VERSION))));
    assert_eq!(receiver.stats().rejected, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_generation_is_refused_with_the_latest_and_a_newer_one_fences_the_older() {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let mut old = raw_client(&receiver).await;
    old.send(handshake(1, 26, 0)).await.unwrap();
    assert!(matches!(next_frame(&mut old).await, Some(Frame::Welcome { generation: 26, next: 0, received: 0, .. })));
    old.send(data(26, 0)).await.unwrap();
    assert_eq!(receiver.recv().await.sequence, 0);
    // Generation 3 is below 26: refused, and told 26.
    let mut stale = raw_client(&receiver).await;
    stale.send(handshake(1, 3, 0)).await.unwrap();
    assert_eq!(close_of(&mut stale).await, Some((CloseCode::StaleGeneration, 26)));
    // 27 fences the old connection, which is told so.
    let mut new = raw_client(&receiver).await;
    new.send(handshake(1, 27, 0)).await.unwrap();
    assert_eq!(close_of(&mut old).await.map(|(c, _)| c), Some(CloseCode::Fenced));
    // The new one is welcomed where the stream stands (0 was taken, so
    // acknowledged), and goes on; the replay of 0 is a duplicate.
    assert!(matches!(next_frame(&mut new).await, Some(Frame::Welcome { generation: 27, next: 1, received: 1, .. })));
    new.send(data(27, 0)).await.unwrap();
    new.send(data(27, 1)).await.unwrap();
    assert_eq!(receiver.recv().await.sequence, 1);
    let stats = receiver.stats();
    assert_eq!((stats.duplicates, stats.fenced, stats.rejected), (1, 1, 1));
}

#[tokio::test]
async fn a_url_no_retry_could_reach_is_refused_at_spawn() {
    use egress_ws::SpawnError;
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, egress_core::Policy::default());
    let spawn = |url: &str| Sender::spawn(cell.clone(), url, egress_ws::SenderConfig::new("p")).map(drop);
    for (url, why) in [
        ("127.0.0.1:9000", "no scheme"),
        ("http://127.0.0.1:9000", "another scheme"),
        ("ws://", "no host"),
        ("ws://127.0.0.1:notaport", "a port that is no number"),
        ("ws://127.0.0.1:70000", "a port above 65535"),
        ("ws://[::1]:x/", "an IPv6 host with a port that is no number"),
        ("not a url at all", "unparsable"),
    ] {
        assert!(matches!(spawn(url), Err(SpawnError::InvalidUrl { .. })), "{url:?} ({why}) is refused");
    }
    #[cfg(feature = "tls")]
    assert_eq!(spawn("wss://example.invalid"), Ok(()), "with the tls feature, wss:// is taken");
    #[cfg(not(feature = "tls"))]
    assert_eq!(spawn("wss://example.invalid"), Err(SpawnError::TlsUnsupported { url: "wss://example.invalid".into() }));
    for (name, value) in [("bad header", "x"), ("x-token", "line\nbreak"), ("", "x")] {
        let config =
            egress_ws::SenderConfig { headers: vec![(name.into(), value.into())], ..egress_ws::SenderConfig::new("p") };
        let refused = Sender::spawn(cell.clone(), "ws://127.0.0.1:9", config).map(drop);
        assert!(matches!(refused, Err(SpawnError::InvalidHeader { .. })), "{name:?}: {value:?} is refused");
    }
    for url in ["ws://127.0.0.1:9", "ws://localhost/stream", "ws://[::1]:9000/x?y=1"] {
        assert_eq!(spawn(url), Ok(()), "{url:?} is a ws:// URL");
    }
}
