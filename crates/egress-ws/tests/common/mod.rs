//! Shared helpers of the end-to-end tests: a policy and sender settings
//! for fast runs on 127.0.0.1, in-order receiving with a deadline, a raw
//! WebSocket client for playing a hostile or scripted peer, and a raw
//! server for playing a scripted receiver.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use egress_core::{Delay, Policy, Sequence};
use egress_reactive::AsyncEgressCell;
use egress_ws::protocol::{CloseCode, Frame, Limits};
use egress_ws::{Content, Receiver, ReceiverStats, SenderConfig};
use futures_util::StreamExt;
use tokio_tungstenite::tungstenite::Message;

/// Every wait in these tests gives up after this long (see the test kit).
pub use egress_testkit::limit;

pub fn policy() -> Policy {
    Policy::builder()
        .inflight_limit(64)
        .retry_budget(1_000)
        .replay_limit(1_000)
        .retry_base(Delay(5))
        .retry_ceiling(Delay(50))
        .build()
        .unwrap()
}

pub fn sender_config(seed: u64) -> SenderConfig {
    SenderConfig {
        backoff_base: Duration::from_millis(2),
        backoff_max: Duration::from_millis(50),
        stall_timeout: Some(Duration::from_millis(3_000)),
        seed,
        ..SenderConfig::new("producer-1")
    }
}

pub fn payload(i: u64) -> Bytes {
    Bytes::from(format!("message {i}"))
}

/// Receives until sequence `n` (exclusive) of producer-1, checking each is
/// the next in order, with its payload.
pub async fn receive_in_order(receiver: &mut Receiver, from: u64, n: u64) {
    let mut next = from;
    while next < n {
        let d = tokio::time::timeout(limit(), receiver.recv()).await.expect("deliveries keep coming");
        assert_eq!((&*d.producer, d.sequence), ("producer-1", next), "in order, no duplicates");
        assert_eq!(d.content, Content::Message(payload(next)));
        next += 1;
    }
}

/// Waits until the cell has everything through `n - 1` acknowledged, and
/// nothing left.
pub async fn drained(cell: &AsyncEgressCell<Bytes>, n: u64) {
    egress_testkit::until(
        || (cell.acked_through().get_untracked() == Some(Sequence(n - 1))).then_some(()),
        || format!("acknowledged through {:?}", cell.acked_through().get_untracked()),
    )
    .await;
    assert_eq!(cell.pending_len().get() + cell.inflight_len().get() + cell.parked_len().get(), 0);
}

pub type Client = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub async fn raw_client(receiver: &Receiver) -> Client {
    tokio_tungstenite::connect_async(format!("ws://{}", receiver.local_addr())).await.unwrap().0
}

/// The TCP stream under a raw producer's WebSocket.
pub fn raw(ws: &mut Client) -> &mut tokio::net::TcpStream {
    match ws.get_mut() {
        tokio_tungstenite::MaybeTlsStream::Plain(tcp) => tcp,
        _ => unreachable!("plain TCP"),
    }
}

/// One masked WebSocket frame (as a client sends it): `opcode` 0 is a
/// continuation, 2 binary, 9 a ping, 10 a pong.
pub fn ws_frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    const MASK: [u8; 4] = [0x12, 0x34, 0x56, 0x78];
    let mut out = vec![if fin { 0x80 } else { 0 } | opcode];
    match payload.len() {
        len @ 0..126 => out.push(0x80 | len as u8),
        len => {
            out.push(0x80 | 126);
            out.extend_from_slice(&u16::try_from(len).unwrap().to_be_bytes());
        }
    }
    out.extend_from_slice(&MASK);
    out.extend(payload.iter().zip(MASK.iter().cycle()).map(|(b, m)| b ^ m));
    out
}

pub fn handshake(incarnation: u128, generation: u64, resume_from: u64) -> Message {
    Message::Binary(Frame::Handshake { producer: "producer-1".into(), incarnation, generation, resume_from }.encode())
}

pub fn data(generation: u64, sequence: u64) -> Message {
    Message::Binary(Frame::Data { generation, sequence, attempt: 1, payload: payload(sequence) }.encode())
}

/// The next protocol frame from the peer (pings skipped), if one comes within
/// one [`limit`].
pub async fn next_frame<S>(ws: &mut S) -> Option<Frame>
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    let deadline = tokio::time::Instant::now() + limit();
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await.ok()?? {
            Ok(Message::Binary(b)) => return Frame::decode(&b, Limits::default()).ok(),
            Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => {}
            _ => return None,
        }
    }
}

/// The close frame the peer ends with, if any (other frames skipped), within
/// one [`limit`] for all of them: a peer that keeps a connection alive
/// with other frames and never closes it gets `None`, not a hung test.
pub async fn close_of<S>(ws: &mut S) -> Option<(CloseCode, u64)>
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    tokio::time::timeout(limit(), async {
        loop {
            if let Frame::Close { code, detail, .. } = next_frame(ws).await? {
                return Some((code, detail));
            }
        }
    })
    .await
    .ok()?
}

/// Waits until `ok(stats)` holds, polling the receiver's counters; fails
/// with `what` and the last counters after one [`limit`].
pub async fn until(receiver: &Receiver, what: &str, ok: impl Fn(&ReceiverStats) -> bool) -> ReceiverStats {
    egress_testkit::until(
        || {
            let stats = receiver.stats();
            ok(&stats).then_some(stats)
        },
        || format!("{what}: {:?}", receiver.stats()),
    )
    .await
}
