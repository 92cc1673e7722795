//! The reference receiver: accepts many producers over WebSocket and
//! delivers each producer's stream to the application exactly once and in
//! order, acknowledging only what the application has taken (or committed).
//!
//! The state lives in [`inbox`] (no I/O); this module runs one task per
//! connection around it.

mod inbox;
mod upgrade;

#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_inbox(data: &[u8]) {
    inbox::drive::run(data);
}

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use egress_core::Incarnation;
use futures_util::{SinkExt, StreamExt};
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tracing::Instrument as _;

pub use self::inbox::Content;
use self::inbox::{Admission, ConnId, Inbox, Queued, Rules, Taken};
pub use self::upgrade::{Authorize, Refusal, Upgrade};
use crate::protocol::{CloseCode, DecodeError, Frame, Limits, Terms, VERSION};

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
    /// producer (a frame, or the pong to the receiver's keepalive ping)
    /// while the receiver reads it, and how long any write to it may take;
    /// then the receiver closes it. (While the delivery buffer is full the
    /// receiver does not read, and does not count.) A frame must arrive
    /// whole within it.
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

/// The application's durable record of what it committed (the trait is
/// egress-core's, so that stores implement it without depending on this
/// crate).
pub use egress_core::Resume;

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

/// One message (or the notice of a skipped one), delivered to the
/// application.
///
/// Under [`AckMode::Explicit`], call [`commit`](Self::commit) once it is
/// safe; dropping it uncommitted gives it back (see [`AckMode`]).
pub struct Delivery {
    /// The producer that sent it.
    pub producer: Arc<str>,
    /// Which of the producer's sequence spaces: a producer that restarted
    /// without a store starts a new one, from sequence 0.
    pub incarnation: Incarnation,
    /// Its sequence in that stream.
    pub sequence: u64,
    /// The message, or why it was skipped.
    pub content: Content,
    /// How many times this receiver has handed this sequence to the
    /// application, this one included: above 1 when it was given back
    /// before (the application can set aside a message it keeps failing
    /// on by committing it).
    pub deliveries: u32,
    receipt: Option<Receipt>,
}

/// What an uncommitted delivery needs to commit or give itself back:
/// dropped without a commit, it gives the delivery back. (It is the
/// receipt, not the delivery, that acts on drop, so that a delivery's
/// fields can be moved out.)
struct Receipt {
    shared: Weak<Shared>,
    /// What to queue again if it is given back (the content is a cheap
    /// clone: `Bytes` counts references).
    queued: Option<Queued>,
}

impl Receipt {
    fn commit(mut self) {
        let Some(q) = self.queued.take() else { return };
        if let Some(shared) = self.shared.upgrade() {
            let now = shared.now();
            let wake = shared.inbox.lock().commit(&q, now);
            if let Some(signal) = wake {
                signal.notify.notify_one();
            }
        }
    }
}

impl Drop for Receipt {
    fn drop(&mut self) {
        let Some(q) = self.queued.take() else { return };
        let Some(shared) = self.shared.upgrade() else { return };
        let queued = shared.inbox.lock().release(q);
        if queued {
            shared.ready.notify_one();
        }
    }
}

impl Delivery {
    /// The message's bytes (`None` for a skipped sequence).
    pub fn payload(&self) -> Option<&Bytes> {
        match &self.content {
            Content::Message(bytes) => Some(bytes),
            Content::Skipped(_) => None,
        }
    }

    /// Acknowledges this delivery and every earlier one of its stream
    /// (under [`AckMode::OnTake`] it already is; then this does nothing).
    pub fn commit(mut self) {
        if let Some(receipt) = self.receipt.take() {
            receipt.commit();
        }
    }
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("producer", &self.producer)
            .field("incarnation", &self.incarnation)
            .field("sequence", &self.sequence)
            .field("content", &self.content)
            .field("deliveries", &self.deliveries)
            .field("committed", &self.receipt.is_none())
            .finish()
    }
}

/// Counters of what a receiver has seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    /// Deliveries the application took (messages and skips).
    pub delivered: u64,
    /// Of those, skipped sequences (tombstones).
    pub skipped: u64,
    /// Data frames dropped as duplicates (a replay carries sequences already
    /// delivered or buffered).
    pub duplicates: u64,
    /// Data frames dropped because the out-of-order buffer was full.
    pub overflow: u64,
    /// Connections whose handshake was accepted.
    pub connections: u64,
    /// Connections closed because a newer generation of their producer
    /// arrived.
    pub fenced: u64,
    /// Connections refused or closed for a protocol error or a stale
    /// generation (a close frame says why; logged through `tracing`).
    pub rejected: u64,
    /// Deliveries given back uncommitted (each handed over again).
    pub released: u64,
    /// TCP connections open now.
    pub open_connections: usize,
    /// Connections answered 503 because `max_connections` were open.
    pub refused_capacity: u64,
    /// Upgrade requests the [authorization check](ReceiverConfig::authorize)
    /// refused (401 or 403).
    pub unauthorized: u64,
    /// Handshakes refused as Busy: `max_producers` held (or
    /// `incarnations_per_producer` for its id), none forgettable.
    pub refused_busy: u64,
    /// Connections closed because nothing came in time: no upgrade and
    /// handshake within `handshake_timeout`.
    pub handshake_timeouts: u64,
    /// Admitted connections closed for silence or a write that did not
    /// complete, within `idle_timeout`.
    pub idle_closed: u64,
    /// Producer ids held now.
    pub producers: usize,
    /// Producer ids forgotten so far.
    pub evictions: u64,
    /// Streams forgotten past `producer_idle` before their producer
    /// confirmed every acknowledgement (without [`ReceiverConfig::resume`]:
    /// if such a producer comes back, what its application took since its
    /// last confirmation is delivered again).
    pub unconfirmed_forgotten: u64,
    /// Payload bytes waiting out of order now.
    pub bytes_buffered: usize,
    /// Deliveries, and their payload bytes, waiting for the application now.
    pub queued: usize,
    /// (See `queued`.)
    pub bytes_queued: usize,
    /// Acknowledgements not sent, sent twice, and held back, by
    /// [`ReceiverConfig::ack_faults`] (0 without faults): a test that
    /// injects them can check they happened.
    pub acks_dropped: u64,
    /// (See `acks_dropped`.)
    pub acks_duplicated: u64,
    /// (See `acks_dropped`.)
    pub acks_delayed: u64,
}

/// How the receiver signals one connection's task.
#[derive(Debug, Default)]
struct Signal {
    notify: Notify,
    /// A newer connection of the producer replaced this one.
    fenced: AtomicBool,
    /// The receiver is shutting down.
    stop: AtomicBool,
}

struct Shared {
    config: ReceiverConfig,
    inbox: Mutex<Inbox<Arc<Signal>>>,
    /// A delivery was queued.
    ready: Notify,
    /// Bumped when the queue had been full and an entry left it.
    space: watch::Sender<u64>,
    /// Connections refused before admission (protocol, version, timeout).
    rejected: AtomicU64,
    /// When the receiver started: the inbox's time is milliseconds since.
    started: Instant,
    /// TCP connections open now.
    open: AtomicUsize,
    refused_capacity: AtomicU64,
    /// Upgrades the authorization check refused.
    unauthorized: AtomicU64,
    handshake_timeouts: AtomicU64,
    idle_closed: AtomicU64,
    /// Injected ack faults: dropped, duplicated, delayed.
    ack_faults: [AtomicU64; 3],
}

impl Shared {
    /// The inbox's time: milliseconds since the receiver started.
    fn now(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn stop_all(&self) {
        for signal in self.inbox.lock().stop() {
            signal.stop.store(true, Ordering::Release);
            signal.notify.notify_one();
        }
    }
}

/// A WebSocket server that receives egress streams.
///
/// Per stream (a producer id and an incarnation, named in the handshake), it
/// delivers each sequence once, in order, through [`Receiver::recv`]; drops
/// duplicates; buffers up to `max_buffered` frames out of order; and
/// acknowledges cumulatively what the application took (or committed, see
/// [`AckMode`]), every `ack_every` commits or `ack_interval`. A newer
/// generation of a producer fences its older connection. A receiver that
/// starts with no memory of a stream resumes where the handshake says
/// (`resume_from`). Nothing acknowledged is lost when it shuts down or
/// drops: what the application never took was never acknowledged, and its
/// producer still holds it.
///
/// Dropping the receiver stops accepting and closes its connections.
pub struct Receiver {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.stop_all();
    }
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver").field("local_addr", &self.local_addr).field("stats", &self.stats()).finish()
    }
}

impl Receiver {
    /// Listens on `addr` (use port 0 for any free port; see
    /// [`local_addr`](Self::local_addr)).
    ///
    /// # Errors
    /// The bind's I/O error; `InvalidInput` for a `limits.max_payload`
    /// below [`MIN_MAX_PAYLOAD`](crate::protocol::MIN_MAX_PAYLOAD).
    pub async fn bind(addr: impl ToSocketAddrs, config: ReceiverConfig) -> std::io::Result<Receiver> {
        let floor = usize::try_from(crate::protocol::MIN_MAX_PAYLOAD).unwrap_or(usize::MAX);
        if config.limits.max_payload < floor {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("max_payload {} is below the protocol's floor of {floor}", config.limits.max_payload),
            ));
        }
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let rules = Rules {
            max_buffered: config.max_buffered,
            queue: config.delivery_buffer.max(1),
            incarnations: config.incarnations_per_producer.max(1),
            commit_on_take: config.ack_mode == AckMode::OnTake,
            ack_every: u64::try_from(config.ack_every.max(1)).unwrap_or(u64::MAX),
            max_buffered_bytes: config.max_buffered_bytes,
            max_buffered_bytes_total: config.max_buffered_bytes_total,
            queue_bytes: config.delivery_buffer_bytes,
            max_producers: config.max_producers.max(1),
            producer_idle: u64::try_from(config.producer_idle.as_millis()).unwrap_or(u64::MAX),
            eviction_floor: u64::try_from(config.eviction_floor.as_millis()).unwrap_or(u64::MAX),
            durable: config.resume.is_some(),
        };
        let shared = Arc::new(Shared {
            config,
            inbox: Mutex::new(Inbox::new(rules)),
            ready: Notify::new(),
            space: watch::Sender::new(0),
            rejected: AtomicU64::new(0),
            started: Instant::now(),
            open: AtomicUsize::new(0),
            refused_capacity: AtomicU64::new(0),
            unauthorized: AtomicU64::new(0),
            handshake_timeouts: AtomicU64::new(0),
            idle_closed: AtomicU64::new(0),
            ack_faults: Default::default(),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Receiver { local_addr, shared, accept })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Waits for the next delivery.
    pub async fn recv(&mut self) -> Delivery {
        let shared = self.shared.clone();
        loop {
            let ready = shared.ready.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            if let Some(d) = self.try_recv() {
                return d;
            }
            ready.await;
        }
    }

    /// A delivery if one is ready.
    pub fn try_recv(&mut self) -> Option<Delivery> {
        let now = self.shared.now();
        let (q, wake) = self.shared.inbox.lock().take(now)?;
        if let Some(signal) = wake {
            signal.notify.notify_one();
        }
        // Connections waiting for room (by count or by bytes) try again.
        if self.shared.space.receiver_count() > 0 {
            self.shared.space.send_modify(|v| *v = v.wrapping_add(1));
        }
        Some(self.delivery(q))
    }

    fn delivery(&self, q: Queued) -> Delivery {
        let receipt = match self.shared.config.ack_mode {
            AckMode::OnTake => None,
            AckMode::Explicit => Some(Receipt {
                shared: Arc::downgrade(&self.shared),
                queued: Some(Queued {
                    producer: q.producer.clone(),
                    incarnation: q.incarnation,
                    sequence: q.sequence,
                    content: q.content.clone(),
                    given_back: q.given_back,
                    stream: q.stream,
                }),
            }),
        };
        Delivery {
            producer: q.producer,
            incarnation: Incarnation(q.incarnation),
            sequence: q.sequence,
            content: q.content,
            deliveries: q.given_back.saturating_add(1),
            receipt,
        }
    }

    /// What it has seen so far.
    pub fn stats(&self) -> ReceiverStats {
        let (c, held) = {
            let inbox = self.shared.inbox.lock();
            (inbox.counts, inbox.held())
        };
        let s = &self.shared;
        ReceiverStats {
            delivered: c.taken,
            skipped: c.skipped,
            duplicates: c.duplicates,
            overflow: c.overflow,
            connections: c.connections,
            fenced: c.fenced,
            rejected: c.refused + s.rejected.load(Ordering::Relaxed),
            released: c.released,
            open_connections: s.open.load(Ordering::Relaxed),
            refused_capacity: s.refused_capacity.load(Ordering::Relaxed),
            unauthorized: s.unauthorized.load(Ordering::Relaxed),
            refused_busy: c.busy,
            handshake_timeouts: s.handshake_timeouts.load(Ordering::Relaxed),
            idle_closed: s.idle_closed.load(Ordering::Relaxed),
            producers: held.producers,
            evictions: c.evictions,
            unconfirmed_forgotten: c.unconfirmed_forgotten,
            bytes_buffered: held.buffered_bytes,
            queued: held.queued,
            bytes_queued: held.queued_bytes,
            acks_dropped: s.ack_faults[0].load(Ordering::Relaxed),
            acks_duplicated: s.ack_faults[1].load(Ordering::Relaxed),
            acks_delayed: s.ack_faults[2].load(Ordering::Relaxed),
        }
    }

    /// Stops accepting and closes every connection (a normal close);
    /// returns once the listening socket is closed (so its address can be
    /// bound again). What the application did not take stays with its
    /// producers, unacknowledged.
    pub async fn shutdown(mut self) {
        self.accept.abort();
        self.shared.stop_all();
        let accept = std::mem::replace(&mut self.accept, tokio::spawn(async {}));
        let _ = accept.await;
    }

    /// The next sequence the most recently admitted stream of `producer`
    /// will deliver (`None` if it has never seen it).
    pub fn next_for(&self, producer: &str) -> Option<u64> {
        self.shared.inbox.lock().next_for(producer)
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                if shared.open.load(Ordering::Acquire) >= shared.config.max_connections.max(1) {
                    // No task, no wait: the answer fits a fresh socket's
                    // buffer, and the socket closes when it drops. Over
                    // TLS a plaintext answer would read as a TLS failure
                    // to the client, and a TLS handshake is what the bound
                    // saves: the socket just closes.
                    #[cfg(feature = "tls")]
                    let plain = shared.config.tls.is_none();
                    #[cfg(not(feature = "tls"))]
                    let plain = true;
                    if plain {
                        let _ = stream.try_write(
                            b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
                        );
                    }
                    shared.refused_capacity.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(%peer, "egress receiver: at its connection bound, a connection refused");
                    continue;
                }
                let _ = stream.set_nodelay(true);
                shared.open.fetch_add(1, Ordering::AcqRel);
                let shared = shared.clone();
                let span = tracing::info_span!("egress_receiver", %peer);
                tokio::spawn(
                    async move {
                        let _open = Open(&shared);
                        match serve(stream, peer, &shared).await {
                            Ok(()) => tracing::debug!("egress receiver: a connection ended"),
                            Err(e) => tracing::warn!(error = %e, "egress receiver closed a connection"),
                        }
                    }
                    .instrument(span),
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "egress receiver: accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Counts a connection open for as long as its task lives.
struct Open<'a>(&'a Shared);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a connection ended badly.
#[derive(Debug, thiserror::Error)]
enum ServeError {
    #[error("websocket: {0}")]
    Ws(#[from] tokio_tungstenite::tungstenite::Error),
    #[error("tls: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("{0}")]
    Timeout(&'static str),
}

type Ws = tokio_tungstenite::WebSocketStream<Box<dyn crate::sender::Io>>;

/// Sends a close frame and closes, giving up after a second (a peer that
/// does not read must not hold the task).
async fn close(ws: &mut Ws, code: CloseCode, detail: u64, reason: impl Into<String>) {
    let frame = Frame::Close { code, detail, reason: reason.into() };
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = ws.send(Message::Binary(frame.encode())).await;
        let _ = ws.close(None).await;
    })
    .await;
}

/// Sends `message`, or fails if it takes longer than `limit` (a peer that
/// does not read).
async fn send_within(ws: &mut Ws, message: Message, limit: Duration) -> Result<(), ServeError> {
    match tokio::time::timeout(limit, ws.send(message)).await {
        Ok(sent) => sent.map_err(ServeError::Ws),
        Err(_) => Err(ServeError::Timeout("a write to the producer did not complete in time")),
    }
}

/// Reads the next binary message as a frame; `Ok(None)` when the peer
/// closed. Anything heard (pings and pongs included) is noted in `heard`.
async fn next_frame(ws: &mut Ws, limits: Limits, heard: &mut Instant) -> Result<Option<Frame>, FrameError> {
    loop {
        let message = ws.next().await;
        *heard = Instant::now();
        match message {
            None | Some(Ok(Message::Close(_))) => return Ok(None),
            Some(Ok(Message::Binary(bytes))) => {
                return Frame::decode(&bytes, limits).map(Some).map_err(FrameError::Decode);
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
            Some(Ok(Message::Text(_))) => return Err(FrameError::Text),
            Some(Err(e)) => return Err(FrameError::Ws(e)),
        }
    }
}

#[derive(Debug)]
enum FrameError {
    Decode(DecodeError),
    Text,
    Ws(tokio_tungstenite::tungstenite::Error),
}

impl FrameError {
    /// The close that answers it (none for a broken socket).
    fn close(&self) -> Option<(CloseCode, u64, String)> {
        match self {
            FrameError::Decode(DecodeError::Version(v)) => {
                Some((CloseCode::Version, u64::from(VERSION), format!("version {v} is not {VERSION}")))
            }
            FrameError::Decode(e) => Some((CloseCode::Protocol, 0, e.to_string())),
            FrameError::Text => Some((CloseCode::Protocol, 0, "a text message".into())),
            FrameError::Ws(tokio_tungstenite::tungstenite::Error::Capacity(e)) => {
                Some((CloseCode::Protocol, 0, e.to_string()))
            }
            FrameError::Ws(_) => None,
        }
    }

    fn into_error(self) -> ServeError {
        match self {
            FrameError::Ws(e) => ServeError::Ws(e),
            FrameError::Decode(e) => ServeError::Protocol(e.to_string()),
            FrameError::Text => ServeError::Protocol("a text message".into()),
        }
    }
}

fn ws_config(limits: Limits) -> WebSocketConfig {
    let max = limits.max_payload.saturating_add(64);
    WebSocketConfig::default().max_message_size(Some(max)).max_frame_size(Some(max))
}

/// Tells the inbox when the connection task ends, however it ends.
struct Admitted<'a> {
    shared: &'a Shared,
    producer: Arc<str>,
    conn: ConnId,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let now = self.shared.now();
        self.shared.inbox.lock().closed(&self.producer, self.conn, now);
    }
}

/// What the application's record says of a stream the inbox does not hold
/// (`None` without a record, or when the inbox holds it: memory is ahead).
async fn stored(shared: &Shared, producer: &Arc<str>, incarnation: u128) -> Result<Option<u64>, String> {
    let Some(resume) = shared.config.resume.clone() else { return Ok(None) };
    if shared.inbox.lock().holds(producer, incarnation) {
        return Ok(None);
    }
    let producer = producer.clone();
    match tokio::task::spawn_blocking(move || resume.resume(&producer, Incarnation(incarnation))).await {
        Ok(result) => result,
        Err(e) => Err(format!("the record's lookup failed: {e}")),
    }
}

async fn serve(stream: TcpStream, peer: std::net::SocketAddr, shared: &Shared) -> Result<(), ServeError> {
    let config = &shared.config;
    let refused = || shared.rejected.fetch_add(1, Ordering::Relaxed);
    // TLS, the upgrade and the handshake, within one timeout from accept.
    let opened = tokio::time::timeout(config.handshake_timeout, async {
        #[cfg(feature = "tls")]
        let stream = upgrade::secure(stream, config.tls.as_ref()).await?;
        #[cfg(not(feature = "tls"))]
        let stream = upgrade::secure(stream).await?;
        let mut refusal = None;
        // tungstenite's callback type: its error is the HTTP response.
        #[allow(clippy::result_large_err)]
        let answer = |request: &_, response| {
            let answer = upgrade::answer(config.authorize.as_ref(), peer, request, response, &mut refusal);
            // Counted before the refusal is written: a client that reads
            // it finds it counted.
            if answer.is_err() {
                shared.unauthorized.fetch_add(1, Ordering::Relaxed);
            }
            answer
        };
        let accepted =
            tokio_tungstenite::accept_hdr_async_with_config(stream, answer, Some(ws_config(config.limits))).await;
        if let Some(refusal) = refusal {
            tracing::info!(?refusal, "egress receiver: an upgrade refused by the authorization check");
            return Err(ServeError::Protocol(format!("upgrade refused: {refusal:?}")));
        }
        let mut ws = accepted?;
        let first = next_frame(&mut ws, config.limits, &mut Instant::now()).await;
        Ok::<_, ServeError>((ws, first))
    })
    .await;
    let (mut ws, first) = match opened {
        Ok(Ok(opened)) => opened,
        Ok(Err(e)) => {
            refused();
            return Err(e);
        }
        Err(_) => {
            refused();
            shared.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
            return Err(ServeError::Timeout("no upgrade and handshake in time"));
        }
    };
    let first = match first {
        Ok(Some(frame)) => frame,
        Ok(None) => return Ok(()),
        Err(e) => {
            refused();
            if let Some((code, detail, reason)) = e.close() {
                close(&mut ws, code, detail, reason).await;
            }
            return Err(e.into_error());
        }
    };
    let Frame::Handshake { producer, incarnation, generation, resume_from } = first else {
        refused();
        close(&mut ws, CloseCode::Protocol, 0, "expected a handshake").await;
        return Err(ServeError::Protocol(format!("expected a handshake, got {first:?}")));
    };
    let producer: Arc<str> = producer.into();
    let stored = match stored(shared, &producer, incarnation).await {
        Ok(stored) => stored,
        Err(why) => {
            refused();
            tracing::warn!(%producer, %why, "egress receiver: the application's record could not be read");
            close(&mut ws, CloseCode::Retry, 0, "the receiver's store is unavailable").await;
            return Err(ServeError::Protocol(why));
        }
    };
    let signal = Arc::new(Signal::default());
    let now = shared.now();
    let admission =
        shared.inbox.lock().handshake(&producer, incarnation, generation, resume_from, stored, signal.clone(), now);
    let (conn, next, received) = match admission {
        Admission::Welcome { conn, next, received, fenced } => {
            tracing::info!(
                %producer,
                incarnation = format_args!("{incarnation:032x}"),
                generation,
                next,
                received,
                fenced = fenced.is_some(),
                "egress receiver: a producer admitted"
            );
            if let Some(old) = fenced {
                old.fenced.store(true, Ordering::Release);
                old.notify.notify_one();
            }
            (conn, next, received)
        }
        Admission::Refused { code, detail, reason } => {
            if code == CloseCode::Busy {
                tracing::info!(%producer, "egress receiver: at its producer bound, a handshake refused");
            } else {
                tracing::debug!(%producer, ?code, detail, %reason, "egress receiver: a handshake refused");
            }
            close(&mut ws, code, detail, reason.clone()).await;
            return Err(ServeError::Protocol(reason));
        }
    };
    let admitted = Admitted { shared, producer, conn };
    let terms = Terms {
        max_payload: u32::try_from(config.limits.max_payload).unwrap_or(u32::MAX),
        keepalive_ms: u32::try_from(config.keepalive.as_millis()).unwrap_or(u32::MAX),
    };
    let welcome = Message::Binary(Frame::Welcome { generation, next, received, terms }.encode());
    send_within(&mut ws, welcome, config.idle_timeout).await?;
    Connection { shared, ws, signal, admitted, generation, acks: Acks::new(config, generation) }.run().await
}

/// An admitted connection's loop.
struct Connection<'a> {
    shared: &'a Shared,
    ws: Ws,
    signal: Arc<Signal>,
    admitted: Admitted<'a>,
    generation: u64,
    acks: Acks,
}

/// Whether the connection goes on.
enum Step {
    Go,
    /// An ack may be due (a commit woke the connection, or a timer fired).
    Ack,
    /// A protocol error found by the inbox: close with code 1.
    Refuse(String),
    /// The stream needs a sequence this connection dropped (its buffer
    /// above a gap was full): close with code 5, so that the producer
    /// replays from the welcome.
    Stuck,
    End(Result<(), ServeError>),
}

impl Connection<'_> {
    async fn run(mut self) -> Result<(), ServeError> {
        let config = &self.shared.config;
        let mut space = self.shared.space.subscribe();
        let mut waiting: Option<(u64, Content)> = None;
        // A ping once the connection has been silent for the keepalive the
        // welcome advertised: counted from the last thing sent, whatever
        // it was.
        let keepalive = config.keepalive.max(Duration::from_millis(1));
        let mut last_sent = Instant::now();
        // When the producer was last heard: a frame, a ping or a pong.
        let mut heard = Instant::now();
        let idle = config.idle_timeout;
        loop {
            let deadline = self.acks.deadline();
            let silent_at = heard + idle;
            let step = tokio::select! {
                frame = next_frame(&mut self.ws, config.limits, &mut heard), if waiting.is_none() => match frame {
                    Ok(Some(frame)) => self.frame(frame, &mut space, &mut waiting),
                    Ok(None) => return Ok(()),
                    Err(e) => {
                        if let Some((code, detail, reason)) = e.close() {
                            self.shared.rejected.fetch_add(1, Ordering::Relaxed);
                            close(&mut self.ws, code, detail, reason).await;
                        }
                        return Err(e.into_error());
                    }
                },
                changed = space.changed(), if waiting.is_some() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    let (sequence, content) = waiting.take().expect("invariant broken: waiting checked above");
                    let step = self.offer(sequence, content, &mut space, &mut waiting);
                    if waiting.is_none() {
                        // Reading again: silence counts from now.
                        heard = Instant::now();
                    }
                    step
                }
                () = self.signal.notify.notified() => self.signalled().await,
                () = sleep_until(deadline) => Step::Ack,
                () = tokio::time::sleep_until(silent_at), if waiting.is_none() => {
                    self.shared.idle_closed.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(producer = %self.admitted.producer, "egress receiver: a silent connection closed");
                    close(&mut self.ws, CloseCode::Normal, 0, "nothing heard in time").await;
                    return Err(ServeError::Timeout("nothing heard from the producer in time"));
                }
                () = tokio::time::sleep_until(last_sent + keepalive) => {
                    self.send(Message::Ping(Bytes::new())).await?;
                    last_sent = Instant::now();
                    Step::Go
                }
            };
            match step {
                Step::Go => continue,
                Step::Ack => {}
                Step::Refuse(reason) => {
                    self.shared.rejected.fetch_add(1, Ordering::Relaxed);
                    close(&mut self.ws, CloseCode::Protocol, 0, reason.clone()).await;
                    return Err(ServeError::Protocol(reason));
                }
                Step::Stuck => {
                    let why = "the next sequence was dropped above a gap: reconnect and resend from the welcome";
                    tracing::debug!(producer = %self.admitted.producer, why, "egress receiver: closing");
                    close(&mut self.ws, CloseCode::Retry, 0, why).await;
                    return Ok(());
                }
                Step::End(result) => return result,
            }
            let (shared, a) = (self.shared, &self.admitted);
            let due = self.acks.due(
                Instant::now(),
                |time_up| shared.inbox.lock().poll_ack(&a.producer, a.conn, time_up).map(|(_, through)| through),
                |fault| {
                    shared.ack_faults[fault as usize].fetch_add(1, Ordering::Relaxed);
                },
            );
            if !due.is_empty() {
                for frame in due {
                    tracing::trace!(?frame, "egress receiver: ack");
                    self.send(Message::Binary(frame.encode())).await?;
                }
                last_sent = Instant::now();
            }
        }
    }

    /// Sends within `idle_timeout`, or ends the connection (counted).
    async fn send(&mut self, message: Message) -> Result<(), ServeError> {
        let sent = send_within(&mut self.ws, message, self.shared.config.idle_timeout).await;
        if matches!(sent, Err(ServeError::Timeout(_))) {
            self.shared.idle_closed.fetch_add(1, Ordering::Relaxed);
            tracing::info!(producer = %self.admitted.producer, "egress receiver: a connection that does not read closed");
        }
        sent
    }

    fn frame(&mut self, frame: Frame, space: &mut watch::Receiver<u64>, waiting: &mut Option<(u64, Content)>) -> Step {
        match frame {
            Frame::Data { generation, sequence, payload, .. } if generation == self.generation => {
                tracing::trace!(sequence, len = payload.len(), "egress receiver: data");
                self.offer(sequence, Content::Message(payload), space, waiting)
            }
            Frame::Tombstone { generation, sequence, reason, .. } if generation == self.generation => {
                self.offer(sequence, Content::Skipped(reason), space, waiting)
            }
            Frame::Close { code, detail, reason } => {
                tracing::debug!(?code, detail, %reason, "producer closed the connection");
                // An orderly close names what the producer saw acknowledged.
                if code == CloseCode::Normal {
                    let a = &self.admitted;
                    a.shared.inbox.lock().confirm(&a.producer, a.conn, detail);
                }
                Step::End(Ok(()))
            }
            other => Step::Refuse(format!("unexpected frame {other:?}")),
        }
    }

    /// Offers a frame to the inbox; a full queue keeps it in `waiting`.
    fn offer(
        &mut self,
        sequence: u64,
        content: Content,
        space: &mut watch::Receiver<u64>,
        waiting: &mut Option<(u64, Content)>,
    ) -> Step {
        let a = &self.admitted;
        // Marked seen before the offer: a slot freed after it wakes us.
        space.borrow_and_update();
        let taken = self.shared.inbox.lock().take_frame(&a.producer, a.conn, self.generation, sequence, content);
        match taken {
            Taken::Delivered { stuck, .. } => {
                self.shared.ready.notify_one();
                if stuck { Step::Stuck } else { Step::Go }
            }
            Taken::Buffered | Taken::Duplicate | Taken::Overflow => Step::Go,
            Taken::Full(content) => {
                *waiting = Some((sequence, content));
                Step::Go
            }
            Taken::Fenced => {
                self.signal.fenced.store(true, Ordering::Release);
                self.signal.notify.notify_one();
                Step::Go
            }
            Taken::Invalid(reason) => Step::Refuse(reason),
        }
    }

    /// Handles the signals: fenced, stop, or an ack that may be due.
    async fn signalled(&mut self) -> Step {
        let s = &self.signal;
        let closing = if s.stop.load(Ordering::Acquire) {
            Some((CloseCode::Normal, "the receiver is shutting down"))
        } else if s.fenced.load(Ordering::Acquire) {
            Some((CloseCode::Fenced, "a newer connection replaced this one"))
        } else {
            None
        };
        if let Some((code, reason)) = closing {
            tracing::debug!(producer = %self.admitted.producer, ?code, reason, "egress receiver: closing");
            close(&mut self.ws, code, 0, reason).await;
            return Step::End(Ok(()));
        }
        let (shared, a) = (self.shared, &self.admitted);
        self.acks.woken(Instant::now(), || shared.inbox.lock().unacked(&a.producer, a.conn));
        Step::Ack
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// An injected ack fault, as counted in `Shared::ack_faults`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Dropped = 0,
    Duplicated = 1,
    Delayed = 2,
}

/// When to acknowledge on one connection, and the injected faults.
struct Acks {
    interval: Duration,
    generation: u64,
    /// When the first unacknowledged commit was seen.
    since: Option<Instant>,
    faults: AckFaults,
    rng: crate::rng::Xorshift,
    delayed: VecDeque<(Instant, u64)>,
}

impl Acks {
    fn new(config: &ReceiverConfig, generation: u64) -> Self {
        Acks {
            interval: config.ack_interval,
            generation,
            since: None,
            faults: config.ack_faults,
            rng: crate::rng::Xorshift::new(config.ack_faults.seed ^ generation.rotate_left(17) ^ 0x9E37_79B9_7F4A_7C15),
            delayed: VecDeque::new(),
        }
    }

    /// A commit woke the connection: start the interval if unacknowledged
    /// commits wait (`unacked` asks the inbox).
    fn woken(&mut self, now: Instant, unacked: impl FnOnce() -> bool) {
        if self.since.is_none() && unacked() {
            self.since = Some(now);
        }
    }

    fn deadline(&self) -> Option<Instant> {
        let coalesce = self.since.map(|s| s + self.interval);
        let delayed = self.delayed.front().map(|(at, _)| *at);
        match (coalesce, delayed) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        self.rng.next_f64() < p
    }

    /// The ack frames to send now. `poll` asks the inbox for the ack to
    /// send (given whether the interval is up: then any committed progress
    /// is acknowledged); `fault` counts each injected fault.
    fn due(&mut self, now: Instant, poll: impl FnOnce(bool) -> Option<u64>, fault: impl Fn(Fault)) -> Vec<Frame> {
        let mut out = Vec::new();
        let time_up = self.since.is_some_and(|s| now >= s + self.interval);
        if let Some(through) = poll(time_up) {
            self.since = None;
            if self.chance(self.faults.drop) {
                fault(Fault::Dropped);
            } else {
                let copies = if self.chance(self.faults.duplicate) { 2 } else { 1 };
                if copies == 2 {
                    fault(Fault::Duplicated);
                }
                for _ in 0..copies {
                    if self.chance(self.faults.delay_probability) {
                        fault(Fault::Delayed);
                        self.delayed.push_back((now + self.faults.delay, through));
                    } else {
                        out.push(Frame::Ack { generation: self.generation, through });
                    }
                }
            }
        } else if time_up {
            self.since = None;
        }
        while self.delayed.front().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, through)) = self.delayed.pop_front() {
                out.push(Frame::Ack { generation: self.generation, through });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn acks(faults: AckFaults) -> Acks {
        let config = ReceiverConfig { ack_interval: 100 * MS, ack_faults: faults, ..ReceiverConfig::default() };
        Acks::new(&config, 7)
    }

    fn ack(through: u64) -> Frame {
        Frame::Ack { generation: 7, through }
    }

    #[test]
    fn acks_wait_out_the_interval_from_the_first_unacknowledged_commit() {
        let mut a = acks(AckFaults::default());
        let t0 = Instant::now();
        a.woken(t0, || false);
        assert_eq!(a.deadline(), None, "nothing unacknowledged: no interval");
        a.woken(t0, || true);
        a.woken(t0 + 40 * MS, || true);
        assert_eq!(a.deadline(), Some(t0 + 100 * MS), "from the first commit, not the last");
        let asked = Cell::new(None);
        let poll = |up: bool, answer: Option<u64>| {
            asked.set(Some(up));
            answer
        };
        assert_eq!(a.due(t0 + 99 * MS, |up| poll(up, None), |_| unreachable!()), []);
        assert_eq!(asked.get(), Some(false), "not up a moment before");
        assert_eq!(a.deadline(), Some(t0 + 100 * MS));
        assert_eq!(a.due(t0 + 100 * MS, |up| poll(up, Some(3)), |_| unreachable!()), [ack(3)]);
        assert_eq!(asked.get(), Some(true), "up at the interval");
        assert_eq!(a.deadline(), None, "acknowledged: the interval ends");
        // An interval that ends with nothing to acknowledge ends too.
        a.woken(t0 + 200 * MS, || true);
        assert_eq!(a.due(t0 + 300 * MS, |up| poll(up, None), |_| unreachable!()), []);
        assert_eq!(asked.get(), Some(true));
        assert_eq!(a.deadline(), None);
    }

    #[test]
    fn injected_faults_drop_duplicate_and_delay_acks_and_are_counted() {
        let t0 = Instant::now();
        let counted = RefCell::new(Vec::new());
        let count = |f: Fault| counted.borrow_mut().push(f);
        let mut dropping = acks(AckFaults { drop: 1.0, ..AckFaults::default() });
        assert_eq!(dropping.due(t0, |_| Some(1), count), []);
        assert_eq!(counted.take(), [Fault::Dropped]);
        let mut doubling = acks(AckFaults { duplicate: 1.0, ..AckFaults::default() });
        assert_eq!(doubling.due(t0, |_| Some(2), count), [ack(2), ack(2)]);
        assert_eq!(counted.take(), [Fault::Duplicated]);
        let mut plain = acks(AckFaults::default());
        assert_eq!(plain.due(t0, |_| Some(3), count), [ack(3)]);
        assert_eq!(counted.take(), [], "no fault: nothing counted");
        let mut delaying =
            acks(AckFaults { duplicate: 1.0, delay_probability: 1.0, delay: 30 * MS, ..AckFaults::default() });
        assert_eq!(delaying.due(t0, |_| Some(4), count), []);
        assert_eq!(counted.take(), [Fault::Duplicated, Fault::Delayed, Fault::Delayed]);
        assert_eq!(delaying.deadline(), Some(t0 + 30 * MS), "the delayed ones set the deadline");
        delaying.woken(t0, || true);
        assert_eq!(delaying.deadline(), Some(t0 + 30 * MS), "the earlier of the interval and the delay");
        assert_eq!(delaying.due(t0 + 29 * MS, |_| None, count), [], "held until their time");
        assert_eq!(delaying.due(t0 + 30 * MS, |_| None, count), [ack(4), ack(4)]);
        assert_eq!(delaying.deadline(), Some(t0 + 100 * MS), "the interval remains");
        assert_eq!(counted.take(), []);
    }
}
