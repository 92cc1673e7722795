//! How a receiver is configured: its acknowledgement mode, its bounds and
//! timeouts, and the faults it injects into its acknowledgements.

use std::sync::Arc;
use std::time::Duration;

use super::{Authorize, Resume};
#[cfg(doc)]
use super::{Delivery, Receiver, ReceiverStats};
use crate::protocol::Limits;

/// When a [`Receiver`] acknowledges a message to its producer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AckMode {
    /// When the application takes it from [`Receiver::recv`]: what it was
    /// handed is acknowledged, whatever it does next.
    #[default]
    OnTake,
    /// When the application calls [`Delivery::commit`] (after persisting
    /// it, say). A commit acknowledges the delivery and every earlier one of
    /// its stream, except those ever given back and not committed since
    /// (each of those needs a commit of its own). A delivery dropped
    /// without a commit (a handler that fails, or panics) is given back: it
    /// is handed over again by the next `recv`, ahead of the others (and in
    /// sequence order with the others of its stream given back), with
    /// [`Delivery::deliveries`] counting the times. The producer is not
    /// involved, and nothing else is redelivered.
    Explicit,
}

/// How a [`Receiver`] acknowledges, buffers and checks.
#[derive(Clone, Debug)]
pub struct ReceiverConfig {
    /// When a message counts as acknowledged.
    pub ack_mode: AckMode,
    /// Acknowledge once this many commits are unacknowledged...
    pub ack_every: usize,
    /// ...or this long after the first unacknowledged one, whichever comes
    /// first.
    pub ack_interval: Duration,
    /// How many frames per stream may wait out of order for a gap to fill;
    /// beyond that they are dropped (the producer's replay brings them
    /// back). They are dropped too when their connection ends.
    pub max_buffered: usize,
    /// How many payload bytes per stream may wait out of order (beyond,
    /// dropped like frames beyond `max_buffered`).
    pub max_buffered_bytes: usize,
    /// How many payload bytes may wait out of order, all streams together.
    pub max_buffered_bytes_total: usize,
    /// How many deliveries may wait for the application in
    /// [`Receiver::recv`]. When it is full, the receiver stops reading the
    /// producers' connections (and their windows fill): backpressure, not
    /// memory growth. It keeps the connections alive meanwhile.
    pub delivery_buffer: usize,
    /// How many payload bytes may wait for the application (as
    /// `delivery_buffer`; one delivery always fits, and a filled gap may
    /// release up to a stream's buffered bytes past it).
    pub delivery_buffer_bytes: usize,
    /// How many TCP connections may be open at once (upgrading, handshaking
    /// or admitted). Beyond, a new one is answered `503 Service
    /// Unavailable` and closed at once.
    pub max_connections: usize,
    /// How long an admitted connection may go without a message from its
    /// producer (a frame, a ping or a pong) while the receiver reads it,
    /// and how long any write to it may take; then the receiver closes it.
    /// (While the delivery buffer is full the receiver does not read, and
    /// does not count.) A frame must arrive whole within it, unless the
    /// producer sends pings or pongs between its WebSocket fragments: then
    /// it may take longer, and is still held to the max payload.
    pub idle_timeout: Duration,
    /// How many producer ids the receiver remembers at once. A new one
    /// beyond is admitted only if an idle one (no connection, nothing
    /// waiting for the application) that has been idle for at least
    /// `eviction_floor`, and whose producer confirmed every acknowledgement
    /// (see [`ReceiverConfig::resume`] for the exception), can be
    /// forgotten; otherwise it is refused with close code 6 (Busy), its
    /// detail the milliseconds after which room may be made.
    pub max_producers: usize,
    /// How long a producer id may sit idle before it is forgotten, whatever
    /// it holds. A forgotten producer is admitted again like a new one: its
    /// streams resume where its handshake says, so a producer that comes
    /// back later than this gets again what its application took but it
    /// had not seen acknowledged (unless [`ReceiverConfig::resume`] is
    /// set).
    pub producer_idle: Duration,
    /// How long a producer id must have been idle before it may be
    /// forgotten to make room for a newcomer (even one that confirmed every
    /// acknowledgement).
    pub eviction_floor: Duration,
    /// Decoding limits, and the payload limit the welcome announces.
    pub limits: Limits,
    /// How long a new TCP connection has to complete the WebSocket upgrade
    /// and send its handshake, from the moment it is accepted.
    pub handshake_timeout: Duration,
    /// The receiver sends a WebSocket ping on a connection that has sent
    /// nothing for this long, so that its producer can tell a busy receiver
    /// from a dead one; the welcome announces it.
    pub keepalive: Duration,
    /// How many incarnations (sequence spaces) are remembered per producer
    /// id. A new one beyond takes the place of the least recently admitted
    /// one whose producer confirmed every acknowledgement (or, failing
    /// that, of one without a connection for `producer_idle`); if there is
    /// none, it is refused with close code 6 (Busy).
    pub incarnations_per_producer: usize,
    /// Faults injected into the acknowledgements this receiver sends, for
    /// tests and demos (none by default).
    pub ack_faults: AckFaults,
    /// Where the application durably records what it committed, for
    /// exactly once across restarts of the receiver itself (see
    /// [`Resume`]). `None` (the default): the receiver's state lives in
    /// memory only.
    pub resume: Option<Arc<dyn Resume>>,
    /// Who may connect: a check of each WebSocket upgrade request (its
    /// path, headers and peer), refusing with 401 or 403 before any frame
    /// ([`Authorize::bearer`] checks a token). `None` (the default):
    /// anyone. Refusals are counted in [`ReceiverStats::unauthorized`].
    pub authorize: Option<Authorize>,
    /// TLS (feature `tls`): the receiver speaks `wss://` with this server
    /// configuration ([`tls::server_config_from_pem`](crate::tls::server_config_from_pem)
    /// builds one). `None` (the default): plain WebSocket. The TLS
    /// handshake counts against `handshake_timeout`.
    #[cfg(feature = "tls")]
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        ReceiverConfig {
            ack_mode: AckMode::OnTake,
            ack_every: 32,
            ack_interval: Duration::from_millis(5),
            max_buffered: 4_096,
            max_buffered_bytes: 8 << 20,
            max_buffered_bytes_total: 64 << 20,
            delivery_buffer: 65_536,
            delivery_buffer_bytes: 64 << 20,
            max_connections: 1_024,
            idle_timeout: Duration::from_secs(10),
            max_producers: 10_000,
            producer_idle: Duration::from_secs(600),
            eviction_floor: Duration::from_secs(1),
            limits: Limits::default(),
            handshake_timeout: Duration::from_secs(5),
            keepalive: Duration::from_secs(1),
            incarnations_per_producer: 4,
            ack_faults: AckFaults::default(),
            resume: None,
            authorize: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

/// Faults injected into outgoing acknowledgements: each one is dropped,
/// duplicated and delayed with these probabilities, from a seeded generator.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AckFaults {
    /// The probability that an ack is not sent.
    pub drop: f64,
    /// The probability that an ack is sent twice.
    pub duplicate: f64,
    /// The probability that an ack is held back by `delay`.
    pub delay_probability: f64,
    /// How long a delayed ack waits.
    pub delay: Duration,
    /// The seed of the generator.
    pub seed: u64,
}
