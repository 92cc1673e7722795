//! A NATS JetStream transport for egress cells: the broker as the receiver.
//!
//! ```text
//!  cell ── Publisher (one task) ── publish(subject, headers, payload) ──▶ JetStream stream
//!    ▲        │  Nats-Msg-Id = producer:incarnation:sequence   (dedupe within the window)
//!    │        │  fence: the epoch's first expects the subject's last sequence,
//!    │        │         each later one the message id before it
//!    │        ▼
//!    └── publish acks, in any order ──▶ completion tracker ──▶ cumulative ack
//!
//!  JetStream stream ──▶ Subscriber ──▶ in order, once, per producer ──▶ the application,
//!                          ▲                                          whose ack acks JetStream
//! ```
//!
//! - **[`Publisher`]** publishes an [`AsyncEgressCell`]'s records to one
//!   subject (one egress stream; the JetStream stream holds that subject
//!   only). Each message carries the [`Stamp`] headers and a
//!   `Nats-Msg-Id` of `producer:incarnation:sequence`, so a record sent
//!   again within the server's duplicate window is stored once. Each is
//!   fenced by its predecessor: an epoch's first message expects the
//!   subject's last sequence as read (`Nats-Expected-Last-Subject-Sequence`),
//!   every later one the message id of the message published before it
//!   (`Nats-Expected-Last-Msg-Id`), so publishes are pipelined up to the
//!   cell's window and still none is stored out of the chain: once one is
//!   refused, every later one of the epoch is too, however long ago a
//!   duplicate went out.
//! - **Takeover, resync, fencing.** Each connection epoch starts by
//!   reading the subject's last message: its egress sequence is what the
//!   broker holds (acknowledged through it, as a WebSocket receiver's
//!   `Welcome { next }`), and its stream sequence the first expectation.
//!   The first epoch takes the stream over: its generation's owner part
//!   ([`owner_of`]) is above every generation stored, made the subject's
//!   by a claim published on the condition that nothing was written since
//!   the read ([`Stamp::claim`]). A refused
//!   expectation ends the epoch and reads the last message again: a
//!   message of a higher owner there means another publisher took the
//!   stream over, and this one stops ([`PublisherError::Fenced`]);
//!   otherwise (its own earlier publishes) it resumes under a new
//!   generation of the same owner. An acknowledgement that says
//!   "duplicate" is never taken as delivered (the server checks ids before
//!   expectations): it resyncs too. The fence does not depend on the
//!   duplicate window.
//! - **Reconnects on top of the client's own.** The client reconnects by
//!   itself; a disconnect ends the epoch (its publish acknowledgements may
//!   never come), and the next epoch replays exactly what the broker does
//!   not hold, under a new generation.
//! - **Failures onto the core's kinds.** A record that can never be stored
//!   (its codec refuses it, or it is above the server's `max_payload` or
//!   the stream's own limits) is a permanent failure (a dead letter): the
//!   epoch resyncs, and the next publishes its tombstone in its place. A
//!   wrong-last-sequence refusal is a resync or a fence,
//!   never a retry of one record; a timeout, a broken connection or a
//!   stream the server does not have ends the epoch and reconnects after a
//!   jittered backoff.
//! - **[`Subscriber`]** reads the JetStream stream through a durable pull
//!   consumer and hands the application each producer's records in
//!   sequence order, each once (duplicates beyond the window, and a stale
//!   owner's copies, are dropped; a record above a gap waits for it, until
//!   the gap is given up and the delivery says so).
//!   See docs/nats.md in the repository for the whole design. The
//!   consumer's acknowledgement of a message is sent when the application
//!   acknowledges the delivery, not before. See its docs for restarts. It
//!   evicts a producer stream idle past
//!   [`lane_idle`](SubscriberConfig::lane_idle).
//! - The publisher's connection is a [`ConnectionState`] on the cell's
//!   graph ([`Publisher::state`], [`Publisher::watch_state`]), and
//!   [`Publisher::spawn_typed`] publishes a cell of any type through an
//!   [`Encode`] codec.
//!
//! **Durability.** A publish acknowledgement means the server stored the
//! message, not that it reached the disk: unless the server syncs every
//! write (`sync_interval: always` in its JetStream configuration), a
//! server crash may lose what it acknowledged in the last sync interval.
//! Deduplication by message id holds within the stream's duplicate window
//! (two minutes by default); the expected-sequence fence and the
//! subscriber's per-producer sequence check hold beyond it.

mod publisher;
mod stamp;
mod subscriber;

#[doc(no_inline)]
pub use egress_codec::{Encode, Raw};
pub use publisher::{
    ConnectionState, LinkError, Options, Publisher, PublisherConfig, PublisherError, PublisherStats, SpawnError,
    owner_of,
};
pub use stamp::{Stamp, StampError, headers};
pub use subscriber::{Content, Delivery, Position, SubscribeError, Subscriber, SubscriberConfig, SubscriberStats};

#[doc(no_inline)]
pub use async_nats;
#[doc(no_inline)]
pub use egress_reactive::AsyncEgressCell;
