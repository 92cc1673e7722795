#![allow(clippy::unwrap_used, clippy::too_many_lines)]
//! Replays the test vectors of `conformance/wire/vectors.json` against both
//! halves over 127.0.0.1: the receiver cases play producers against the
//! real `Receiver`, the sender cases play a receiver against the real
//! `Sender`. Every frame's hex is also checked against its decoding, so the
//! vectors and the codec cannot drift apart.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use common::{limit, next_frame};
use egress_core::{DeadReason, Delay, Incarnation, Policy};
use egress_reactive::{AsyncContext, AsyncEgressCell, CellOptions};
use egress_ws::protocol::{CloseCode, Frame, Limits, Terms};
use egress_ws::{Content, Receiver, ReceiverConfig, Sender, SenderConfig};
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conformance/wire/vectors.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn hex(s: &str) -> Bytes {
    assert!(s.len().is_multiple_of(2), "odd hex {s}");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect::<Vec<u8>>().into()
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

fn reason(s: &str) -> DeadReason {
    match s {
        "permanent" => DeadReason::Permanent,
        "retries" => DeadReason::Retries,
        "replays" => DeadReason::Replays,
        other => panic!("unknown reason {other}"),
    }
}

/// The frame a vector describes.
fn frame(v: &Value) -> Frame {
    let (kind, f) = v.as_object().unwrap().iter().next().unwrap();
    match kind.as_str() {
        "handshake" => Frame::Handshake {
            producer: f["producer"].as_str().unwrap().into(),
            incarnation: u128::from(n(f, "incarnation")),
            generation: n(f, "generation"),
            resume_from: n(f, "resume_from"),
        },
        "welcome" => Frame::Welcome {
            generation: n(f, "generation"),
            next: n(f, "next"),
            received: n(f, "received"),
            terms: Terms {
                max_payload: u32::try_from(n(f, "max_payload")).unwrap(),
                keepalive_ms: u32::try_from(n(f, "keepalive_ms")).unwrap(),
            },
        },
        "data" => Frame::Data {
            generation: n(f, "generation"),
            sequence: n(f, "sequence"),
            attempt: u32::try_from(n(f, "attempt")).unwrap(),
            payload: hex(f["payload_hex"].as_str().unwrap()),
        },
        "ack" => Frame::Ack { generation: n(f, "generation"), through: n(f, "through") },
        "close" => Frame::Close {
            code: CloseCode::from_u16(u16::try_from(n(f, "code")).unwrap()),
            detail: n(f, "detail"),
            reason: f["reason"].as_str().unwrap().into(),
        },
        "tombstone" => Frame::Tombstone {
            generation: n(f, "generation"),
            sequence: n(f, "sequence"),
            attempt: u32::try_from(n(f, "attempt")).unwrap(),
            reason: reason(f["reason"].as_str().unwrap()),
        },
        other => panic!("unknown frame {other}"),
    }
}

/// A step's bytes, checked against its decoded frame when it has one.
fn bytes_of(step: &Value) -> Bytes {
    let bytes = hex(step["hex"].as_str().unwrap());
    if let Some(f) = step.get("frame") {
        let f = frame(f);
        assert_eq!(Frame::decode(&bytes, Limits::default()), Ok(f.clone()), "the hex of {step} decodes to its frame");
        assert_eq!(f.encode(), bytes, "and its frame encodes to it");
    }
    bytes
}

async fn expect_close<S>(ws: &mut S, step: &Value, name: &str)
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    match next_frame(ws).await {
        Some(Frame::Close { code, detail, .. }) => {
            assert_eq!(u64::from(code.to_u16()), n(step, "code"), "{name}: close code");
            if let Some(d) = step.get("detail") {
                assert_eq!(Some(detail), d.as_u64(), "{name}: close detail");
            }
            let (lo, hi) = (step.get("detail_min"), step.get("detail_max"));
            assert!(lo.is_none_or(|lo| lo.as_u64().is_some_and(|lo| detail >= lo)), "{name}: detail {detail}");
            assert!(hi.is_none_or(|hi| hi.as_u64().is_some_and(|hi| detail <= hi)), "{name}: detail {detail}");
        }
        other => panic!("{name}: expected a close, got {other:?}"),
    }
}

async fn run_receiver_case(case: &Value) {
    let name = case["name"].as_str().unwrap();
    let config = case.get("config").cloned().unwrap_or(Value::Null);
    let mut rc = ReceiverConfig::default();
    if let Some(every) = config.get("ack_every").and_then(Value::as_u64) {
        rc.ack_every = usize::try_from(every).unwrap();
    }
    if let Some(max) = config.get("max_payload").and_then(Value::as_u64) {
        rc.limits = Limits { max_payload: usize::try_from(max).unwrap() };
    }
    if let Some(max) = config.get("max_producers").and_then(Value::as_u64) {
        rc.max_producers = usize::try_from(max).unwrap();
    }
    if let Some(max) = config.get("max_buffered").and_then(Value::as_u64) {
        rc.max_buffered = usize::try_from(max).unwrap();
    }
    if let Some(max) = config.get("incarnations_per_producer").and_then(Value::as_u64) {
        rc.incarnations_per_producer = usize::try_from(max).unwrap();
    }
    if let Some(ms) = config.get("eviction_floor_ms").and_then(Value::as_u64) {
        rc.eviction_floor = Duration::from_millis(ms);
    }
    let mut receiver = Receiver::bind("127.0.0.1:0", rc).await.unwrap();
    let mut conns = HashMap::new();
    for step in case["steps"].as_array().unwrap() {
        let conn = |k: &str| step.get(k).and_then(Value::as_u64);
        if let Some(c) = conn("connect") {
            conns.insert(c, common::raw_client(&receiver).await);
        } else if let Some(c) = conn("send") {
            let _ = conns.get_mut(&c).unwrap().send(Message::Binary(bytes_of(step))).await;
        } else if let Some(c) = conn("send_text") {
            let _ = conns.get_mut(&c).unwrap().send(Message::text(step["text"].as_str().unwrap())).await;
        } else if let Some(c) = conn("expect") {
            let want = bytes_of(step);
            let got = next_frame(conns.get_mut(&c).unwrap()).await;
            assert_eq!(got.map(|f| f.encode()), Some(want), "{name}: {step}");
        } else if let Some(c) = conn("expect_close") {
            expect_close(conns.get_mut(&c).unwrap(), step, name).await;
        } else if let Some(c) = conn("sync") {
            // The receiver reads a connection's messages in order and
            // answers a ping as it reads it: its pong says everything sent
            // before was read.
            let ws = conns.get_mut(&c).unwrap();
            ws.send(Message::Ping(b"sync".to_vec().into())).await.unwrap();
            let deadline = tokio::time::Instant::now() + limit();
            loop {
                match tokio::time::timeout_at(deadline, ws.next()).await {
                    Ok(Some(Ok(Message::Pong(p)))) if &p[..] == b"sync" => break,
                    Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => {}
                    other => panic!("{name}: no pong on {c}: {other:?}"),
                }
            }
        } else if let Some(c) = conn("disconnect") {
            drop(conns.remove(&c).unwrap());
            let left = conns.len();
            common::until(&receiver, name, |s| s.open_connections <= left).await;
        } else if let Some(c) = conn("expect_nothing") {
            let quiet = Duration::from_millis(n(step, "ms"));
            let got = tokio::time::timeout(quiet, next_frame(conns.get_mut(&c).unwrap())).await;
            assert!(got.is_err(), "{name}: expected nothing, got {got:?}");
        } else if let Some(d) = step.get("deliver") {
            let got = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
            assert_eq!(got.sequence, n(d, "sequence"), "{name}: {step}");
            assert_eq!(got.incarnation, Incarnation(u128::from(n(d, "incarnation"))), "{name}: {step}");
            let content = match d.get("skipped").and_then(Value::as_str) {
                Some(r) => Content::Skipped(reason(r)),
                None => Content::Message(hex(d["payload_hex"].as_str().unwrap())),
            };
            assert_eq!(got.content, content, "{name}: {step}");
        } else {
            panic!("{name}: unknown step {step}");
        }
    }
}

async fn run_sender_case(case: &Value) {
    let name = case["name"].as_str().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cx = AsyncContext::new();
    let policy = Policy::builder().inflight_limit(4).retry_base(Delay(5)).build().unwrap();
    let cell = AsyncEgressCell::with_options(&cx, policy, CellOptions::new().incarnation(Incarnation(1)));
    let own = case.get("config").and_then(|c| c.get("max_payload")).and_then(Value::as_u64);
    let config = SenderConfig {
        backoff_base: Duration::from_millis(1),
        backoff_max: Duration::from_millis(20),
        max_payload: own.map_or(egress_ws::protocol::DEFAULT_MAX_PAYLOAD, |m| usize::try_from(m).unwrap()),
        ..SenderConfig::new("p")
    };
    let mut sender =
        Some(Sender::spawn(cell.clone(), format!("ws://{}", listener.local_addr().unwrap()), config).unwrap());
    let mut conns = HashMap::new();
    for step in case["steps"].as_array().unwrap() {
        let conn = |k: &str| step.get(k).and_then(Value::as_u64);
        if let Some(p) = step.get("enqueue").and_then(Value::as_str) {
            cell.enqueue(Bytes::copy_from_slice(p.as_bytes()));
        } else if step.get("shutdown").is_some() {
            let shutdown = sender.take().unwrap().shutdown();
            tokio::spawn(shutdown);
        } else if let Some(ms) = step.get("expect_no_accept_ms").and_then(Value::as_u64) {
            let early = tokio::time::timeout(Duration::from_millis(ms), listener.accept()).await;
            assert!(early.is_err(), "{name}: the sender connected again within {ms} ms");
        } else if let Some(c) = conn("accept") {
            let (stream, _) = tokio::time::timeout(limit(), listener.accept()).await.unwrap().unwrap();
            conns.insert(c, tokio_tungstenite::accept_async(stream).await.unwrap());
        } else if let Some(c) = conn("send") {
            let _ = conns.get_mut(&c).unwrap().send(Message::Binary(bytes_of(step))).await;
        } else if let Some(c) = conn("expect") {
            let want = bytes_of(step);
            let got = next_frame(conns.get_mut(&c).unwrap()).await;
            assert_eq!(got.map(|f| f.encode()), Some(want), "{name}: {step}");
        } else if let Some(c) = conn("expect_close") {
            expect_close(conns.get_mut(&c).unwrap(), step, name).await;
        } else if let Some(want) = step.get("expect_cell") {
            let deadline = tokio::time::Instant::now() + limit();
            loop {
                let mut ok = true;
                for (k, v) in want.as_object().unwrap() {
                    let got = match k.as_str() {
                        "acked_through" => cell.acked_through().get_untracked().map(|s| s.get()),
                        "received_through" => cell.received_through().get_untracked().map(|s| s.get()),
                        "inflight" => Some(cell.inflight_len().get_untracked() as u64),
                        "pending" => Some(cell.pending_len().get_untracked() as u64),
                        other => panic!("{name}: unknown cell key {other}"),
                    };
                    ok &= got == v.as_u64();
                }
                if ok {
                    break;
                }
                assert!(tokio::time::Instant::now() < deadline, "{name}: cell never reached {want}: {cell:?}");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        } else {
            panic!("{name}: unknown step {step}");
        }
    }
    drop(sender);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receiver_reacts_as_the_vectors_say() {
    let v = vectors();
    assert_eq!(v["version"], 2);
    let cases = v["receiver"].as_array().unwrap();
    assert!(cases.len() >= 15);
    for case in cases {
        run_receiver_case(case).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sender_reacts_as_the_vectors_say() {
    let v = vectors();
    let cases = v["sender"].as_array().unwrap();
    assert!(cases.len() >= 8);
    for case in cases {
        run_sender_case(case).await;
    }
}
