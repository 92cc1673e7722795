//! egress over WebSocket: the wire protocol ([`protocol`], specified in
//! docs/protocol.md), a [`Sender`] that keeps an
//! [`AsyncEgressCell`](egress_reactive::AsyncEgressCell) connected through
//! disconnects, the reference [`Receiver`], and a [`ChaosProxy`] that kills
//! connections at random moments.
//!
//! ```text
//!  AsyncEgressCell ──attachment──▶ WsTransport ──Data──▶ ┌──────────┐ ──▶ application
//!        ▲                                               │ Receiver │     (each sequence once,
//!        └────── Attachment::ack ◀── Sender ◀──Ack──────  └──────────┘      in order)
//!                 (reconnect under a new generation on any failure; the replay fills the gaps)
//! ```
//!
//! ```no_run
//! use bytes::Bytes;
//! use egress_core::Policy;
//! use egress_reactive::{AsyncContext, AsyncEgressCell};
//! use egress_ws::{Receiver, ReceiverConfig, Sender, SenderConfig};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await?;
//! let cx = AsyncContext::new();
//! let cell: AsyncEgressCell<Bytes> = AsyncEgressCell::new(&cx, Policy::default());
//! let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), SenderConfig::new("uplink"))?;
//! cell.enqueue(Bytes::from_static(b"hello"));
//! let delivery = receiver.recv().await;
//! assert_eq!((&*delivery.producer, delivery.sequence), ("uplink", 0));
//! assert_eq!(delivery.payload().map(|b| &b[..]), Some(&b"hello"[..]));
//! sender.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod connect_error;
#[cfg(feature = "json")]
pub mod json;
pub mod protocol;
mod proxy;
mod receiver;
mod rng;
mod sender;
#[cfg(feature = "tls")]
pub mod tls;

pub use connect_error::ConnectError;
pub use proxy::{Chaos, ChaosProxy};

/// Drives the receiver's state machine with arbitrary bytes, checking its
/// invariants after every step (panics if one breaks). For `fuzz/` only.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub fn fuzz_inbox(data: &[u8]) {
    receiver::fuzz_inbox(data);
}
#[cfg(feature = "json")]
pub use egress_codec::Json;
pub use egress_codec::{Codec, CodecError, Encode, Raw};
pub use receiver::{
    AckFaults, AckMode, Authorize, Content, Delivery, Receiver, ReceiverConfig, ReceiverStats, Refusal, Resume, Upgrade,
};
pub use sender::{
    Connect, ConnectionState, Io, ReceiverTooSmall, Sender, SenderConfig, SenderStats, SpawnError, TooLarge,
    UNTIL_RECONNECT, Unencodable, WsTransport,
};
