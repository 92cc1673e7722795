//! The sending side: a WebSocket transport for an [`AsyncEgressCell`] and the
//! supervisor that keeps it connected.

use crate::connect_error::ConnectError;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use egress_codec::{Encode, Raw};
use egress_core::{AckOutcome, Envelope, Generation, ReceivedOutcome, Sequence};
use egress_reactive::{AsyncEgressCell, AsyncTransport, Backoff, Computed, Handle, SendError, Signal, Threaded, Watch};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::{Mutex, Notify, OwnedMutexGuard, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tracing::Instrument as _;

use crate::protocol::{
    CloseCode, DEFAULT_MAX_PAYLOAD, DecodeError, Frame, GENERATION_LIMIT, Limits, MAX_GENERATION_JUMP, MIN_MAX_PAYLOAD,
    VERSION,
};

/// A byte stream a sender can speak WebSocket over: what a [`Connect`]
/// opens (a TCP connection by default; a Unix socket, a proxy tunnel or an
/// in-memory pipe of your own).
pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Io for T {}

/// Opens the byte stream to the receiver, given the URL's host and port
/// (its default port if it names none): bring your own stream. TLS for a
/// `wss://` URL is layered on top of it.
pub type Connect =
    Arc<dyn Fn(String, u16) -> futures_util::future::BoxFuture<'static, std::io::Result<Box<dyn Io>>> + Send + Sync>;

type Ws = WebSocketStream<MaybeTlsStream<Box<dyn Io>>>;
type Sink = SplitSink<Ws, Message>;

/// How a [`Sender`] connects and reconnects.
#[derive(Clone)]
pub struct SenderConfig {
    /// The producer id sent in every handshake: with the cell's
    /// incarnation, the key of the receiver's state.
    pub producer: String,
    /// How long a connect and handshake may take.
    pub connect_timeout: Duration,
    /// The first reconnect delay; it doubles per failed connection...
    pub backoff_base: Duration,
    /// ...up to this.
    pub backoff_max: Duration,
    /// The seed of the reconnect jitter (each delay is drawn from its
    /// upper half).
    pub seed: u64,
    /// Reconnect when nothing at all (no frame, no ping) was heard from the
    /// receiver for this long while records are in flight: a dead peer. A
    /// live receiver whose application is slow keeps the connection alive
    /// with pings, and is waited for: the timeout in force on a connection
    /// is at least three of the keepalives its welcome advertised (each
    /// taken up to 60 s), whatever is configured here. `None`: never.
    pub stall_timeout: Option<Duration>,
    /// Decoding limits for what the receiver sends.
    pub limits: Limits,
    /// The largest payload this sender sends at all (1 MiB by default): a
    /// record above it is a dead letter at once (a permanent failure,
    /// tombstone reason 1), whatever a receiver accepts. A record within it
    /// but above what the connected receiver advertises is held for the
    /// next connection instead (see [`ReceiverTooSmall`]).
    pub max_payload: usize,
    /// Headers added to every WebSocket upgrade request, such as
    /// `("authorization", "Bearer ...")`; checked by [`Sender::spawn`].
    pub headers: Vec<(String, String)>,
    /// Opens the byte stream; `None`: a TCP connection to the URL's host.
    pub connect: Option<Connect>,
    /// The TLS configuration for `wss://` URLs; `None`: the webpki roots
    /// ([`tls::webpki_client_config`](crate::tls::webpki_client_config)).
    #[cfg(feature = "tls")]
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Whether a 401 or 403 to the upgrade is retried like any failure
    /// (`false` by default: the sender stops with
    /// [`ConnectError::Unauthorized`] or [`ConnectError::Forbidden`], since
    /// the same credentials cannot do better; spawn a new sender with new
    /// ones).
    pub retry_unauthorized: bool,
    /// Stops the sender with [`ConnectError::GaveUp`] once this many
    /// attempts or connections in a row have failed without moving the
    /// stream on (0 counts as 1: the first failure); `None` (the default):
    /// it never gives up. (A reconnect the receiver asks for at once, codes
    /// 4 and 5, is not a failure.)
    pub max_attempts: Option<u32>,
}

impl std::fmt::Debug for SenderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values may be secrets (a token): only their names.
        let headers: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("SenderConfig")
            .field("producer", &self.producer)
            .field("connect_timeout", &self.connect_timeout)
            .field("backoff_base", &self.backoff_base)
            .field("backoff_max", &self.backoff_max)
            .field("seed", &self.seed)
            .field("stall_timeout", &self.stall_timeout)
            .field("limits", &self.limits)
            .field("max_payload", &self.max_payload)
            .field("headers", &headers)
            .field("connect", &self.connect.as_ref().map(|_| "custom"))
            .field("retry_unauthorized", &self.retry_unauthorized)
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

impl SenderConfig {
    /// Adds `authorization: Bearer <token>` to the upgrade request (what
    /// [`Authorize::bearer`](crate::Authorize::bearer) checks on the
    /// reference receiver). The token is never shown by `Debug`.
    #[must_use]
    pub fn bearer(mut self, token: impl AsRef<str>) -> Self {
        self.headers.push(("authorization".into(), format!("Bearer {}", token.as_ref())));
        self
    }

    /// The defaults for producer `producer`.
    pub fn new(producer: impl Into<String>) -> Self {
        SenderConfig {
            producer: producer.into(),
            connect_timeout: Duration::from_secs(5),
            backoff_base: Duration::from_millis(20),
            backoff_max: Duration::from_secs(2),
            seed: 0x5eed,
            stall_timeout: Some(Duration::from_secs(5)),
            limits: Limits::default(),
            max_payload: DEFAULT_MAX_PAYLOAD,
            headers: Vec::new(),
            connect: None,
            #[cfg(feature = "tls")]
            tls: None,
            retry_unauthorized: false,
            max_attempts: None,
        }
    }
}

/// Where a [`Sender`]'s connection is, for a UI to say "connected",
/// "offline, retrying in 3 s" or "stopped: why": a signal on the cell's
/// graph ([`Sender::state`]) and a stream ([`Sender::watch_state`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionState {
    /// Connecting and handshaking: `attempt` counts the attempts since the
    /// last connection that moved the stream on (1: the first).
    Connecting {
        /// Which attempt.
        attempt: u32,
    },
    /// Open: the receiver welcomed this generation, and the cell sends.
    Connected {
        /// The connection's generation.
        generation: Generation,
    },
    /// Waiting for the backoff before the next attempt.
    Reconnecting {
        /// When the next attempt starts.
        retry_at: std::time::Instant,
        /// How many connections or attempts failed in a row (what the
        /// backoff doubles with).
        failures: u32,
        /// Why the last one ended.
        error: ConnectError,
    },
    /// Not connecting again: shut down or dropped (`error: None`), or
    /// stopped on its own (`error`: why; see [`Sender::failure`]): refused
    /// credentials, [`SenderConfig::max_attempts`] reached, or no
    /// generation left.
    Stopped {
        /// Why it stopped on its own.
        error: Option<ConnectError>,
    },
}

impl ConnectionState {
    /// Whether the sender is connected: a receiver welcomed it, and the
    /// cell sends.
    pub fn is_online(&self) -> bool {
        matches!(self, ConnectionState::Connected { .. })
    }

    /// The error of a reconnect or a stop, if any.
    pub fn error(&self) -> Option<&ConnectError> {
        match self {
            ConnectionState::Reconnecting { error, .. } | ConnectionState::Stopped { error: Some(error) } => {
                Some(error)
            }
            _ => None,
        }
    }
}

/// A few words for a status bar: "online", "connecting (attempt 2)",
/// "offline: connection refused; retrying in 3 s", "stopped: unauthorized
/// (401)".
impl std::fmt::Display for ConnectionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectionState::Connecting { attempt: 1 } => f.write_str("connecting"),
            ConnectionState::Connecting { attempt } => write!(f, "connecting (attempt {attempt})"),
            ConnectionState::Connected { .. } => f.write_str("online"),
            ConnectionState::Reconnecting { retry_at, error, .. } => {
                let wait = retry_at.saturating_duration_since(std::time::Instant::now());
                // Rounded up: "in 0 s" would read as now.
                let secs = wait.as_millis().div_ceil(1000);
                write!(f, "offline: {error}; retrying in {secs} s")
            }
            ConnectionState::Stopped { error: None } => f.write_str("stopped"),
            ConnectionState::Stopped { error: Some(error) } => write!(f, "stopped: {error}"),
        }
    }
}

/// Counters of a sender's connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Connections whose handshake succeeded.
    pub connections: u64,
    /// Connections that ended (lost, killed, stalled, refused) and were
    /// replaced.
    pub reconnects: u64,
    /// Attempts that failed before the handshake completed.
    pub failed_attempts: u64,
    /// Connections ended for a protocol error (of either side; this side
    /// closes with code 1 when it finds one).
    pub protocol_errors: u64,
    /// Handshakes refused for a stale generation, each answered with a
    /// generation above the receiver's latest, or at most 2^32 closer to it
    /// (at once, unless the one before was answered at once too and nothing
    /// got through since).
    pub stale_refusals: u64,
    /// Sends held back because the payload was above the connected
    /// receiver's advertised max-payload (but within the sender's own):
    /// each ended its connection, and its record waited for the next.
    pub held_too_large: u64,
}

struct Counters {
    /// Where the connection is; see [`ConnectionState`].
    state: Signal<ConnectionState, Threaded>,
    connections: AtomicU64,
    reconnects: AtomicU64,
    failed_attempts: AtomicU64,
    protocol_errors: AtomicU64,
    stale_refusals: AtomicU64,
    held_too_large: AtomicU64,
    fatal: parking_lot::Mutex<Option<ConnectError>>,
    /// The largest payload that can go out: the own limit, or the last
    /// welcome's if smaller. The cell's size check reads it (its own
    /// handle: the check, held by the cell, holds nothing of the graph).
    payload_limit: Arc<std::sync::atomic::AtomicUsize>,
}

impl Counters {
    fn new(state: Signal<ConnectionState, Threaded>, own_max: usize) -> Self {
        Counters {
            payload_limit: Arc::new(std::sync::atomic::AtomicUsize::new(own_max)),
            state,
            connections: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            failed_attempts: AtomicU64::new(0),
            protocol_errors: AtomicU64::new(0),
            stale_refusals: AtomicU64::new(0),
            held_too_large: AtomicU64::new(0),
            fatal: parking_lot::Mutex::new(None),
        }
    }

    /// Moves the connection's state to `new`, with an event: a connection
    /// or a reconnect at info, a stop for an error at error, an attempt at
    /// debug.
    fn report(&self, new: ConnectionState) {
        match &new {
            ConnectionState::Connecting { attempt } => tracing::debug!(attempt, "egress sender: connecting"),
            ConnectionState::Connected { generation } => {
                tracing::info!(generation = generation.get(), "egress sender: connected");
            }
            ConnectionState::Reconnecting { retry_at, failures, error } => {
                let delay_ms = retry_at.saturating_duration_since(std::time::Instant::now()).as_millis();
                tracing::info!(%error, failures, delay_ms, "egress sender: reconnecting");
            }
            ConnectionState::Stopped { error: Some(error) } => tracing::error!(%error, "egress sender: stopped"),
            ConnectionState::Stopped { error: None } => tracing::info!("egress sender: shut down"),
        }
        // A disposed cell has no readers left to tell.
        let _ = self.state.try_set(new);
    }

    fn snapshot(&self) -> SenderStats {
        SenderStats {
            connections: self.connections.load(Ordering::Relaxed),
            reconnects: self.reconnects.load(Ordering::Relaxed),
            failed_attempts: self.failed_attempts.load(Ordering::Relaxed),
            protocol_errors: self.protocol_errors.load(Ordering::Relaxed),
            stale_refusals: self.stale_refusals.load(Ordering::Relaxed),
            held_too_large: self.held_too_large.load(Ordering::Relaxed),
        }
    }
}

/// A payload above the sender's own limit ([`SenderConfig::max_payload`]):
/// it is never sent, so its send fails as permanent (the record becomes a
/// dead letter).
#[derive(Debug, thiserror::Error)]
#[error("a payload of {len} bytes exceeds the sender's limit of {limit}")]
pub struct TooLarge {
    /// The payload's length.
    pub len: usize,
    /// The sender's limit.
    pub limit: usize,
}

/// A payload within the sender's own limit but above the max-payload the
/// connected receiver advertised. The receiver's limit is not a verdict on
/// the data (another receiver, or this one reconfigured, may take it): the
/// send fails with a retry-after of [`UNTIL_RECONNECT`], so the record
/// parks until the next connection, and the connection ends at once (the
/// stream cannot go past the record on it; an orderly close, code 0). Each
/// such refusal spends one failure of the record's retry budget: a record
/// that connection after connection refuses becomes a dead letter
/// ([`DeadReason::Retries`]), its tombstone sent, once the budget is spent.
///
/// [`DeadReason::Retries`]: egress_core::DeadReason::Retries
#[derive(Debug, thiserror::Error)]
#[error("a payload of {len} bytes exceeds this receiver's limit of {limit}: held for the next connection")]
pub struct ReceiverTooSmall {
    /// The payload's length.
    pub len: usize,
    /// The connected receiver's advertised limit.
    pub limit: usize,
}

/// The retry-after of a record held for a receiver too small for it: never
/// due on its own; a reconnect (or `retry_now`) makes it pending again.
pub const UNTIL_RECONNECT: egress_core::Delay = egress_core::Delay(u64::MAX);

/// The transport an attachment sends through: the connection's write half.
/// Frames are queued by `send` and written by `flush`, once per pass. A
/// payload above the receiver's limit fails as permanent without being sent;
/// a tombstone goes out as a tombstone frame.
pub struct WsTransport<T = Bytes> {
    codec: Arc<dyn Encode<T>>,
    sink: Arc<Mutex<Sink>>,
    /// Held from the first send of a pass to its flush.
    pass: Option<OwnedMutexGuard<Sink>>,
    /// The sender's own limit.
    own_max: usize,
    /// The connected receiver's advertised limit.
    max_payload: usize,
    unwritten: Arc<Unwritten>,
    counters: Arc<Counters>,
    /// Told when a record is above the receiver's limit.
    too_small: Arc<Notify>,
}

/// The sequences this sender refused before writing them, on every
/// connection so far (too large, or not encodable): no receiver can hold
/// them, so an acknowledgement or a receipt that covers one is a lie. Under
/// [`DeadLetters::Hold`] such a record stays held, and a record held back
/// for a receiver's limit waits for the next connection: an ack covering
/// either would drop it. A refused entry goes when its sequence is written
/// (a tombstone in its place, or the record on a later connection); a
/// sequence written once is never refused-unwritten again (a receiver may
/// hold it from then on), and is remembered until an ack covers it. So at
/// most one entry per record the cell holds.
///
/// [`DeadLetters::Hold`]: egress_core::DeadLetters::Hold
#[derive(Debug, Default)]
struct Unwritten(parking_lot::Mutex<Writes>);

#[derive(Debug, Default)]
struct Writes {
    refused: std::collections::BTreeSet<u64>,
    written: std::collections::BTreeSet<u64>,
}

impl Unwritten {
    /// The lowest refused sequence at or below `through`, if any.
    fn covered(&self, through: u64) -> Option<u64> {
        self.0.lock().refused.first().copied().filter(|&s| s <= through)
    }

    /// `sequence`'s send was refused before it was written.
    fn refused(&self, sequence: u64) {
        let mut w = self.0.lock();
        if !w.written.contains(&sequence) {
            w.refused.insert(sequence);
        }
    }

    /// `sequence` goes to the wire (if the write fails, a receiver may
    /// still hold it).
    fn written(&self, sequence: u64) {
        let mut w = self.0.lock();
        w.refused.remove(&sequence);
        w.written.insert(sequence);
    }

    /// Everything through `through` is acknowledged: its writes need no
    /// remembering.
    fn acked(&self, through: u64) {
        let mut w = self.0.lock();
        w.written = match through.checked_add(1) {
            Some(above) => w.written.split_off(&above),
            None => std::collections::BTreeSet::new(),
        };
    }
}

impl<T: Send + Sync + 'static> AsyncTransport<T> for WsTransport<T> {
    async fn send(&mut self, envelope: Envelope<T>) -> Result<(), SendError> {
        let (generation, sequence, attempt) =
            (envelope.generation.get(), envelope.sequence.get(), envelope.attempt.get());
        let frame = match envelope.dead {
            Some(reason) => Frame::Tombstone { generation, sequence, attempt, reason },
            None => {
                let payload = match self.codec.encode(&envelope.payload) {
                    Ok(payload) => payload,
                    Err(e) => {
                        self.unwritten.refused(sequence);
                        return Err(SendError::permanent(Unencodable(e)));
                    }
                };
                if payload.len() > self.own_max {
                    self.unwritten.refused(sequence);
                    return Err(SendError::permanent(TooLarge { len: payload.len(), limit: self.own_max }));
                }
                if payload.len() > self.max_payload {
                    self.unwritten.refused(sequence);
                    self.counters.held_too_large.fetch_add(1, Ordering::Relaxed);
                    let (len, limit) = (payload.len(), self.max_payload);
                    tracing::warn!(
                        sequence,
                        len,
                        limit,
                        "egress sender: a record above the receiver's limit is held, and the connection ends"
                    );
                    // The stream cannot go past it on this connection: the
                    // connection ends, and the record waits for the next.
                    self.too_small.notify_one();
                    return Err(SendError::retry_after(UNTIL_RECONNECT, ReceiverTooSmall { len, limit }));
                }
                Frame::Data { generation, sequence, attempt, payload }
            }
        };
        self.unwritten.written(sequence);
        tracing::trace!(sequence, attempt, tombstone = envelope.dead.is_some(), "egress sender: frame");
        let sink = match &mut self.pass {
            Some(sink) => sink,
            None => self.pass.insert(self.sink.clone().lock_owned().await),
        };
        sink.feed(Message::Binary(frame.encode())).await.map_err(SendError::transient)
    }

    async fn flush(&mut self) -> Result<(), SendError> {
        let result = match &mut self.pass {
            Some(sink) => sink.flush().await.map_err(SendError::transient),
            None => Ok(()),
        };
        self.pass = None;
        result
    }
}

/// A payload its codec could not encode: it fails as permanent.
#[derive(Debug, thiserror::Error)]
#[error("the payload does not encode: {0}")]
pub struct Unencodable(pub Box<dyn std::error::Error + Send + Sync>);

/// Keeps an [`AsyncEgressCell`] connected to a receiver.
///
/// Its task connects, handshakes (the producer id, the cell's incarnation, a
/// generation strictly higher than any the cell used, and where the stream
/// resumes), applies the welcome (what the receiver acknowledged, what it
/// already holds, its payload limit), attaches a [`WsTransport`] to the cell
/// and feeds the receiver's acknowledgements into the attachment. On any
/// disconnect, error or stall it drops the attachment, waits a jittered
/// exponential backoff, and connects again under the next generation. The
/// cell's `reconnect` fences the old attachment, and the new one replays
/// exactly what the receiver does not hold.
///
/// - A handshake refused as stale is answered with a generation above the
///   one the receiver names (at most [`MAX_GENERATION_JUMP`] above the
///   cell's per refusal), and a `Retry` close with a new connection: at
///   once, unless the previous reconnect was at once too and nothing got
///   through since. A stale close naming a generation at or above
///   [`GENERATION_LIMIT`] is a protocol error.
/// - An acknowledgement or a welcome that covers a record this sender
///   found too large to send is a protocol error: no receiver holds it
///   (under [`DeadLetters::Hold`](egress_core::DeadLetters::Hold) it would
///   otherwise drop the held record).
/// - The backoff resets after a connection on which the receiver's receipt
///   watermark moved, or one that ended idle after at least `backoff_max`:
///   a connection that keeps dying soon after its handshake (a record that
///   kills it) backs off further each time.
/// - A receiver that acknowledges or holds what was never sent, or breaks
///   the protocol otherwise, is closed with code 1 and counted.
/// - The generation space running out (`u64::MAX`) stops the sender; see
///   [`failure`](Self::failure).
///
/// The cell outlives the sender: [`shutdown`](Self::shutdown) it (a normal
/// close), and spawn another sender on the same cell to continue. Dropping
/// the `Sender` aborts its task at once, closing nothing: keep it for as
/// long as it should send. A `Sender` not kept is a compile-time warning:
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// # use egress_ws::{Sender, SenderConfig};
/// # fn f(cell: egress_reactive::AsyncEgressCell<bytes::Bytes>) {
/// Sender::spawn(cell, "ws://127.0.0.1:9000", SenderConfig::new("uplink")).unwrap();
/// # }
/// ```
///
/// ```no_run
/// #![deny(unused_must_use)]
/// # use egress_ws::{Sender, SenderConfig};
/// # fn f(cell: egress_reactive::AsyncEgressCell<bytes::Bytes>) {
/// let sender = Sender::spawn(cell, "ws://127.0.0.1:9000", SenderConfig::new("uplink")).unwrap();
/// # drop(sender);
/// # }
/// ```
#[must_use = "dropping a Sender aborts it at once: keep it, or call shutdown()"]
pub struct Sender {
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
    kill: Arc<Notify>,
    counters: Arc<Counters>,
    state: Computed<ConnectionState, Threaded>,
    graph: Handle<Threaded>,
    /// Keeps the cell, and with it the state's nodes, for as long as the
    /// sender is kept.
    _cell: Box<dyn std::any::Any + Send + Sync>,
    /// Takes this sender's size check off the cell when it goes.
    uninstall: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        if !self.task.is_finished() {
            self.task.abort();
            self.counters.report(ConnectionState::Stopped { error: None });
        }
        if let Some(uninstall) = self.uninstall.take() {
            uninstall();
        }
    }
}

impl Sender {
    /// Starts the supervisor for `cell`, connecting to `url`
    /// (`ws://host[:port][/path]`).
    ///
    /// # Errors
    /// A URL that no retry could make work: [`SpawnError`].
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn(
        cell: AsyncEgressCell<Bytes>,
        url: impl Into<String>,
        config: SenderConfig,
    ) -> Result<Sender, SpawnError> {
        Self::spawn_typed(cell, Raw, url, config)
    }

    /// [`spawn`](Self::spawn) for a cell of typed messages, each encoded by
    /// `codec` as it goes out (the cell, and what a UI reads of it, keep the
    /// typed values):
    ///
    /// ```no_run
    /// # #[cfg(feature = "json")]
    /// # async fn f() -> Result<(), egress_ws::SpawnError> {
    /// #[derive(Clone, serde::Serialize)]
    /// struct Chat { to: String, text: String }
    ///
    /// let cx = egress_reactive::AsyncContext::new();
    /// let cell = egress_reactive::AsyncEgressCell::new(&cx, egress_core::Policy::default());
    /// let sender = egress_ws::Sender::spawn_typed(cell.clone(), egress_ws::Json, "ws://127.0.0.1:9000", egress_ws::SenderConfig::new("chat"))?;
    /// cell.enqueue(Chat { to: "ann".into(), text: "hi".into() });
    /// // cell.pending() shows Chat values; the receiver gets their JSON.
    /// # drop(sender); Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`spawn`](Self::spawn).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn_typed<T: Clone + Send + Sync + 'static>(
        cell: AsyncEgressCell<T>,
        codec: impl Encode<T>,
        url: impl Into<String>,
        config: SenderConfig,
    ) -> Result<Sender, SpawnError> {
        let codec: Arc<dyn Encode<T>> = Arc::new(codec);
        let url = url.into();
        let target = Target::new(&url, &config.headers)?;
        let (signal, state, graph) = cell
            .in_scope(|graph| {
                let signal = graph.signal(ConnectionState::Connecting { attempt: 1 });
                let state = graph.computed({
                    let signal = signal.clone();
                    move || signal.get()
                });
                (signal, state, graph.clone())
            })
            .map_err(|_| SpawnError::CellDisposed)?;
        let (stop, stop_rx) = watch::channel(false);
        let kill = Arc::new(Notify::new());
        let counters = Arc::new(Counters::new(signal, config.max_payload));
        // The cell refuses at once what could only become a dead letter,
        // for as long as this sender lives.
        let check: egress_reactive::SizeCheck<T> = {
            let (codec, limit) = (codec.clone(), counters.payload_limit.clone());
            Arc::new(move |value: &T| {
                let limit = limit.load(Ordering::Relaxed);
                let size = codec.size(value)?;
                (size > limit).then_some((size, limit))
            })
        };
        cell.set_size_check(Some(check.clone()));
        let uninstall: Box<dyn FnOnce() + Send + Sync> = Box::new({
            let cell = cell.clone();
            move || cell.remove_size_check(&check)
        });
        let span = tracing::info_span!("egress_sender", producer = %config.producer, %url);
        let task = tokio::spawn({
            let counters = counters.clone();
            let watched = cell.clone();
            let supervisor = supervise(cell.clone(), codec, target, config, stop_rx, kill.clone(), counters.clone());
            async move {
                // A cell disposed under the sender (its context dropped)
                // makes its reads panic, as may the application's own code
                // it runs (a `connect`): the sender stops, and says why,
                // rather than end with its state stale.
                let ended = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(supervisor)).await;
                let error = match ended {
                    Ok(error) => error,
                    Err(_) if watched.is_disposed() => Some(ConnectError::Fatal("the cell was disposed".into())),
                    Err(panic) => {
                        let what = panic
                            .downcast_ref::<&str>()
                            .map(|s| (*s).to_owned())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        Some(ConnectError::Fatal(format!("the sender panicked: {what}").into()))
                    }
                };
                let error = error.inspect(|why| *counters.fatal.lock() = Some(why.clone()));
                counters.report(ConnectionState::Stopped { error });
            }
            .instrument(span)
        });
        Ok(Sender { task, stop, kill, counters, state, graph, _cell: Box::new(cell), uninstall: Some(uninstall) })
    }

    /// Where the connection is, as a computed on the cell's graph (owned by
    /// the cell): read it in an effect or a computed to follow it.
    pub fn state(&self) -> &Computed<ConnectionState, Threaded> {
        &self.state
    }

    /// Where the connection is, as a stream: the current state first, then
    /// each change (a slow reader skips to the latest).
    pub fn watch_state(&self) -> Watch<ConnectionState> {
        self.graph.watch(&self.state)
    }

    /// The largest payload that can go out now, in encoded bytes: the own
    /// limit ([`SenderConfig::max_payload`]), or the last welcome's if a
    /// receiver announced a smaller one. The cell's
    /// [`try_enqueue`](egress_reactive::EgressCellOf::try_enqueue) refuses
    /// larger payloads with `Refused::TooLarge`.
    pub fn payload_limit(&self) -> usize {
        self.counters.payload_limit.load(Ordering::Relaxed)
    }

    /// What it has done so far.
    pub fn stats(&self) -> SenderStats {
        self.counters.snapshot()
    }

    /// Why the sender stopped on its own, if it did (credentials refused,
    /// [`SenderConfig::max_attempts`] reached, the cell's generation space
    /// run out): it will not connect again.
    pub fn failure(&self) -> Option<ConnectError> {
        self.counters.fatal.lock().clone()
    }

    /// Drops the current connection at once, as a network failure would
    /// (for chaos tests and demos); the supervisor reconnects.
    pub fn kill_connection(&self) {
        self.kill.notify_one();
    }

    /// Closes the connection (a normal close) and stops the supervisor;
    /// returns its stats.
    pub async fn shutdown(mut self) -> SenderStats {
        let _ = self.stop.send(true);
        let task = std::mem::replace(&mut self.task, tokio::spawn(async {}));
        let _ = task.await;
        self.counters.snapshot()
    }
}

/// Why [`Sender::spawn`] refused a URL: retrying would never connect.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// Not a URL a WebSocket client can connect to: unparsable, another
    /// scheme than `ws`, or no host.
    #[error("not a WebSocket URL: {url:?}: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The cell was disposed: nothing could be sent from it.
    #[error("the cell was disposed")]
    CellDisposed,
    /// A `wss://` URL, and this crate was built without its `tls`
    /// feature.
    #[error("{url:?}: wss:// needs TLS: build egress-ws with its `tls` feature")]
    TlsUnsupported {
        /// The URL given.
        url: String,
    },
    /// A header in [`SenderConfig::headers`] that is not a valid HTTP
    /// header.
    #[error("header {name:?}: {reason}")]
    InvalidHeader {
        /// The header's name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Where a sender connects: the upgrade request (URL and headers, checked),
/// the host and port, and whether TLS goes on top.
#[derive(Clone, Debug)]
struct Target {
    request: tokio_tungstenite::tungstenite::handshake::client::Request,
    host: String,
    port: u16,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    tls: bool,
}

impl Target {
    /// Checks `url` (a `ws://` or `wss://` URL with a host and a valid
    /// port) and `headers`.
    fn new(url: &str, headers: &[(String, String)]) -> Result<Self, SpawnError> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        use tokio_tungstenite::tungstenite::http::{HeaderName, HeaderValue};
        let invalid = |reason: String| SpawnError::InvalidUrl { url: url.to_owned(), reason };
        let mut request = url.into_client_request().map_err(|e| invalid(e.to_string()))?;
        let uri = request.uri();
        let tls = match uri.scheme_str() {
            Some("ws") => false,
            Some("wss") if cfg!(feature = "tls") => true,
            Some("wss") => return Err(SpawnError::TlsUnsupported { url: url.to_owned() }),
            Some(other) => return Err(invalid(format!("the scheme is {other:?}, not \"ws\" or \"wss\""))),
            None => return Err(invalid("no scheme (expected ws://host:port)".into())),
        };
        let host = uri.host().unwrap_or_default();
        if host.is_empty() {
            return Err(invalid("no host".into()));
        }
        // `Uri::port` is `None` for a port that is not a number: look at the
        // authority itself (after any user info, and after an IPv6 literal).
        let authority = uri.authority().map_or("", |a| a.as_str());
        let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
        let after_host = host_port.rsplit_once(']').map_or(host_port, |(_, rest)| rest);
        let port = match after_host.rsplit_once(':') {
            Some((_, port)) => {
                port.parse::<u16>().map_err(|_| invalid(format!("the port {port:?} is not a number below 65536")))?
            }
            None if tls => 443,
            None => 80,
        };
        // An IPv6 literal connects without its brackets.
        let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        for (name, value) in headers {
            let bad = |reason: String| SpawnError::InvalidHeader { name: name.clone(), reason };
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|e| bad(e.to_string()))?;
            let value = HeaderValue::from_str(value).map_err(|e| bad(e.to_string()))?;
            request.headers_mut().append(header, value);
        }
        Ok(Target { request, host, port, tls })
    }
}

/// Why a connection ended.
enum End {
    /// The sender is shutting down.
    Stop,
    /// The attempt failed, or the connection was lost (a network failure,
    /// a kill, a stall, a close by the receiver): reconnect after the
    /// backoff (unless the policy stops on it).
    Lost(ConnectError),
    /// The receiver asked to reconnect at once.
    Retry,
    /// The receiver is at one of its bounds (code 6): reconnect after the
    /// backoff, and not before the retry-after it named (in milliseconds,
    /// taken up to [`MAX_BUSY_WAIT`]).
    Busy(u64, String),
    /// The receiver's latest generation for this producer: reconnect at
    /// once above it.
    Stale(u64),
    /// A protocol error (of either side).
    Protocol(String),
    /// The receiver speaks another version (a protocol error, closed with
    /// code 2).
    Version(String),
    /// The sender cannot go on.
    Fatal(ConnectError),
}

/// What the supervisor learned from a connection besides how it ended.
struct Outcome {
    end: End,
    /// The receipt watermark moved while it was up.
    progressed: bool,
    /// How long it was up (zero when it never got through the handshake).
    lasted: Duration,
}

async fn supervise<T: Clone + Send + Sync + 'static>(
    cell: AsyncEgressCell<T>,
    codec: Arc<dyn Encode<T>>,
    target: Target,
    config: SenderConfig,
    mut stop: watch::Receiver<bool>,
    kill: Arc<Notify>,
    counters: Arc<Counters>,
) -> Option<ConnectError> {
    let mut backoff = Backoff::new(config.backoff_base, config.backoff_max, config.seed);
    let mut failures: u32 = 0;
    // A generation the next attempt must exceed (a receiver's latest).
    let mut floor = Generation(0);
    // The last reconnect was at once (codes 4 and 5), and nothing got
    // through since: the next one waits, so that a receiver cannot drive a
    // hot loop of refusals.
    let mut hurried = false;
    let unwritten = Arc::new(Unwritten::default());
    loop {
        if *stop.borrow() {
            return None;
        }
        counters.report(ConnectionState::Connecting { attempt: failures.saturating_add(1) });
        let outcome = connection(&cell, &codec, &target, &config, &kill, &counters, floor, &unwritten, &mut stop).await;
        let idle = cell.inflight_len().get_untracked() == 0;
        if outcome.progressed || (idle && outcome.lasted >= config.backoff_max) {
            failures = 0;
        }
        if outcome.progressed {
            hurried = false;
        }
        let mut at_least = Duration::ZERO;
        let (wait, why) = match outcome.end {
            End::Stop => return None,
            End::Fatal(why) => return Some(why),
            End::Lost(why) if why.is_auth() && !config.retry_unauthorized => return Some(why),
            End::Lost(why) => (true, why),
            End::Busy(retry_after, why) => {
                at_least = Duration::from_millis(retry_after).min(MAX_BUSY_WAIT);
                (true, ConnectError::Busy(why.into()))
            }
            End::Protocol(why) | End::Version(why) => {
                counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%why, "egress sender: protocol error");
                (true, ConnectError::Protocol(why.into()))
            }
            End::Retry => (
                std::mem::replace(&mut hurried, true),
                ConnectError::Renew("the receiver asked for a new connection".into()),
            ),
            End::Stale(latest) => {
                counters.stale_refusals.fetch_add(1, Ordering::Relaxed);
                let why = ConnectError::Renew(format!("a stale generation (the receiver's latest is {latest})").into());
                if latest >= GENERATION_LIMIT {
                    counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(latest, "egress sender: a stale-generation close names a generation out of range");
                    (true, why)
                } else {
                    // Above the receiver's latest, by at most
                    // MAX_GENERATION_JUMP per refusal (receivers record no
                    // bigger step): a receiver cannot take the cell's
                    // generations away in one frame.
                    let current = cell.generation().get_untracked().max(floor).get();
                    floor = floor.max(Generation(latest.min(current.saturating_add(MAX_GENERATION_JUMP))));
                    (std::mem::replace(&mut hurried, true), why)
                }
            }
        };
        if wait {
            let delay = backoff.delay(failures).max(at_least);
            failures = failures.saturating_add(1);
            if config.max_attempts.is_some_and(|most| failures >= most) {
                return Some(ConnectError::GaveUp { attempts: failures, last: Box::new(why) });
            }
            counters.reconnects.fetch_add(1, Ordering::Relaxed);
            let retry_at = std::time::Instant::now() + delay;
            counters.report(ConnectionState::Reconnecting { retry_at, failures, error: why });
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = stop.changed() => return None,
            }
        } else {
            counters.reconnects.fetch_add(1, Ordering::Relaxed);
            tracing::info!(error = %why, "egress sender: reconnecting at once");
        }
    }
}

/// Sends a close frame, giving up after a moment (a peer that does not read
/// must not hold the sender).
async fn send_close(sink: &Mutex<Sink>, code: CloseCode, reason: &str) {
    let mut sink = sink.lock().await;
    close_with(&mut *sink, code, 0, reason).await;
}

/// Sends the close frame `code` (`detail`, `reason`, cut to the protocol's
/// limit by the encoding) and closes, giving up after a moment.
async fn close_with<S>(sink: &mut S, code: CloseCode, detail: u64, reason: &str)
where
    S: futures_util::Sink<Message> + Unpin,
{
    let frame = Frame::Close { code, detail, reason: reason.into() };
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = sink.send(Message::Binary(frame.encode())).await;
        let _ = sink.close().await;
    })
    .await;
}

/// Closes for `end`, if it is the receiver's breach of the protocol: code 1,
/// or code 2 (with the version this side speaks) for another version.
async fn close_for<S>(sink: &mut S, end: &End)
where
    S: futures_util::Sink<Message> + Unpin,
{
    match end {
        End::Protocol(why) => close_with(sink, CloseCode::Protocol, 0, why).await,
        End::Version(why) => close_with(sink, CloseCode::Version, u64::from(VERSION), why).await,
        _ => {}
    }
}

#[allow(clippy::too_many_arguments)]
async fn connection<T: Clone + Send + Sync + 'static>(
    cell: &AsyncEgressCell<T>,
    codec: &Arc<dyn Encode<T>>,
    target: &Target,
    config: &SenderConfig,
    kill: &Notify,
    counters: &Arc<Counters>,
    floor: Generation,
    unwritten: &Arc<Unwritten>,
    stop: &mut watch::Receiver<bool>,
) -> Outcome {
    let lost = |end| Outcome { end, progressed: false, lasted: Duration::ZERO };
    let connecting = tokio::time::timeout(config.connect_timeout, async {
        let mut ws = open(target, config).await.map_err(End::Lost)?;
        // Up: only now a generation strictly above every one the cell has
        // used and the receiver's latest (an attempt refused before its
        // upgrade stores none). This also fences the previous connection:
        // what it had in flight or parked goes back to pending, to be
        // replayed on this one.
        let above = cell.generation().get_untracked().max(floor);
        let Some(next) = above.get().checked_add(1) else {
            let why = format!("no generation above {above}: the generation space is exhausted");
            return Err(End::Fatal(ConnectError::Fatal(why.into())));
        };
        let generation = Generation(next);
        let _ = cell.reconnect(generation);
        // A durable cell stores the generation before any handshake uses it.
        cell.generation_stored().await;
        let resume_from = cell.with_core(|core| core.resume_from().get());
        let hello = Frame::Handshake {
            producer: config.producer.clone(),
            incarnation: cell.incarnation().get(),
            generation: generation.get(),
            resume_from,
        };
        ws.send(Message::Binary(hello.encode())).await.map_err(|e| End::Lost(ConnectError::of_ws(&e)))?;
        let end = match read_frame(&mut ws, config.limits, &mut Instant::now()).await {
            Ok(Frame::Welcome { generation: g, next, received, terms }) if g == generation.get() => {
                return Ok((ws, next, received, terms, resume_from, generation));
            }
            Ok(Frame::Close { code: CloseCode::StaleGeneration, detail, .. }) => return Err(End::Stale(detail)),
            Ok(Frame::Close { code: CloseCode::Retry, .. }) => return Err(End::Retry),
            Ok(Frame::Close { code: CloseCode::Busy, detail, reason }) => return Err(End::Busy(detail, reason)),
            Ok(Frame::Close { code: CloseCode::Normal, reason, .. }) => {
                return Err(End::Lost(ConnectError::Lost(format!("refused: {reason}").into())));
            }
            // The receiver closed: nothing to answer.
            Ok(Frame::Close { code, reason, .. }) => return Err(End::Protocol(format!("refused: {code:?} {reason}"))),
            Ok(Frame::Welcome { generation: g, .. }) => {
                End::Protocol(format!("a welcome for generation {g}, not {generation}"))
            }
            Ok(other) => End::Protocol(format!("expected a welcome, got {other:?}")),
            Err(end) => end,
        };
        // The receiver broke the protocol: it is told so before the close.
        close_for(&mut ws, &end).await;
        Err(end)
    });
    let connected = tokio::select! {
        connected = connecting => connected,
        _ = stop.changed() => return lost(End::Stop),
    };
    let (ws, next, received, terms, resume_from, generation) = match connected {
        Ok(Ok(ok)) => ok,
        Ok(Err(end)) => {
            counters.failed_attempts.fetch_add(1, Ordering::Relaxed);
            return lost(end);
        }
        Err(_) => {
            counters.failed_attempts.fetch_add(1, Ordering::Relaxed);
            return lost(End::Lost(ConnectError::Timeout));
        }
    };
    let opened = Instant::now();
    let (sink, mut stream) = ws.split();
    let sink = Arc::new(Mutex::new(sink));
    let protocol = |why: String| async {
        send_close(&sink, CloseCode::Protocol, &why).await;
        End::Protocol(why)
    };
    counters.connections.fetch_add(1, Ordering::Relaxed);
    if next < resume_from {
        // The receiver forgot what this producer said it holds (or never
        // listened): the records below are gone here, and it would wait on
        // them for good.
        let why = format!("welcome: next {next} is below the resume-from {resume_from} of the handshake");
        return Outcome { end: protocol(why).await, progressed: false, lasted: opened.elapsed() };
    }
    if terms.max_payload < MIN_MAX_PAYLOAD {
        let why = format!("welcome: max-payload {} is below the floor of {MIN_MAX_PAYLOAD}", terms.max_payload);
        return Outcome { end: protocol(why).await, progressed: false, lasted: opened.elapsed() };
    }
    if let Err(why) = welcome(cell, generation, next, received, unwritten) {
        return Outcome { end: protocol(why).await, progressed: false, lasted: opened.elapsed() };
    }
    tracing::debug!(next, received, max_payload = terms.max_payload, "egress sender: welcomed");
    counters.report(ConnectionState::Connected { generation });
    let receipt = cell.received_through().get_untracked();
    let max_payload = usize::try_from(terms.max_payload).unwrap_or(usize::MAX);
    counters.payload_limit.store(max_payload.min(config.max_payload), Ordering::Relaxed);
    let too_small = Arc::new(Notify::new());
    let transport = WsTransport {
        codec: codec.clone(),
        sink: sink.clone(),
        pass: None,
        own_max: config.max_payload,
        max_payload,
        unwritten: unwritten.clone(),
        counters: counters.clone(),
        too_small: too_small.clone(),
    };
    let link = cell.attach(transport);
    let stall = stall_in_force(config.stall_timeout, terms.keepalive_ms);
    let mut heard = Instant::now();
    let end = loop {
        let check = tokio::time::sleep(stall.min(Duration::from_secs(3600)) / 4);
        tokio::select! {
            frame = read_frame(&mut stream, config.limits, &mut heard) => match frame {
                Ok(Frame::Ack { generation: g, through }) if g == generation.get() => {
                    tracing::trace!(through, "egress sender: ack");
                    if let Some(never) = unwritten.covered(through) {
                        break protocol(format!("ack through {through}, but {never} was never sent")).await;
                    }
                    if let AckOutcome::Unsent { sent_through, .. } = link.ack(Sequence(through)) {
                        break protocol(format!("ack through {through}, but only {sent_through:?} was sent")).await;
                    }
                    unwritten.acked(through);
                }
                Ok(Frame::Close { code: CloseCode::Busy, detail, reason }) => break End::Busy(detail, reason),
                Ok(Frame::Close { code: CloseCode::Normal | CloseCode::Fenced, reason, .. }) => {
                    break End::Lost(ConnectError::Lost(format!("closed by the receiver: {reason}").into()));
                }
                Ok(Frame::Close { code: CloseCode::Retry, .. }) => break End::Retry,
                Ok(Frame::Close { code: CloseCode::StaleGeneration, detail, .. }) => break End::Stale(detail),
                Ok(Frame::Close { code, reason, .. }) => break End::Protocol(format!("{code:?}: {reason}")),
                Ok(other) => break protocol(format!("unexpected frame {other:?}")).await,
                Err(End::Protocol(why)) => break protocol(why).await,
                Err(end @ End::Version(_)) => {
                    close_for(&mut *sink.lock().await, &end).await;
                    break end;
                }
                Err(end) => break end,
            },
            () = kill.notified() => break End::Lost(ConnectError::Lost("killed".into())),
            () = too_small.notified() => {
                let resume_from = cell.with_core(|core| core.resume_from().get());
                let why = "a record is above this receiver's max-payload";
                close_with(&mut *sink.lock().await, CloseCode::Normal, resume_from, why).await;
                break End::Lost(ConnectError::Lost(why.into()));
            }
            _ = stop.changed() => {
                // The detail is the resume-from: the acknowledgements this
                // producer holds for good (its store's, for a durable cell),
                // on which the receiver may forget the stream.
                let resume_from = cell.with_core(|core| core.resume_from().get());
                close_with(&mut *sink.lock().await, CloseCode::Normal, resume_from, "the producer is shutting down")
                    .await;
                break End::Stop;
            }
            () = check => {}
        }
        if cell.inflight_len().get_untracked() > 0 && heard.elapsed() >= stall {
            break End::Lost(ConnectError::Lost("the receiver fell silent".into()));
        }
    };
    drop(link);
    let progressed = cell.received_through().get_untracked() > receipt;
    Outcome { end, progressed, lasted: opened.elapsed() }
}

/// The longest a receiver may keep silent before it counts as dead: at
/// least three of the keepalives its welcome advertised (a live receiver
/// pings at least once per keepalive, whatever its application does), so a
/// stall timeout configured below that cannot drop a slow but live peer;
/// the keepalive is taken up to [`MAX_KEEPALIVE_WAIT`], so a receiver
/// cannot advertise its way out of ever being found dead. `None`: never.
fn stall_in_force(configured: Option<Duration>, keepalive_ms: u32) -> Duration {
    let Some(configured) = configured else { return Duration::MAX };
    let keepalive = Duration::from_millis(u64::from(keepalive_ms)).min(MAX_KEEPALIVE_WAIT);
    configured.max(keepalive.saturating_mul(3))
}

/// The longest advertised keepalive a sender waits three times for before
/// a silent receiver counts as dead.
const MAX_KEEPALIVE_WAIT: Duration = Duration::from_secs(60);

/// The longest retry-after of a busy receiver (code 6) a sender honours: a
/// receiver cannot park a producer for longer with one frame.
const MAX_BUSY_WAIT: Duration = Duration::from_secs(60);

/// Opens the byte stream ([`SenderConfig::connect`], or TCP), then TLS on
/// top for `wss://`, then the WebSocket upgrade with the configured headers.
async fn open(target: &Target, config: &SenderConfig) -> Result<Ws, ConnectError> {
    let io: Box<dyn Io> = match &config.connect {
        Some(connect) => connect(target.host.clone(), target.port).await.map_err(|e| ConnectError::of_io(&e))?,
        None => {
            let tcp =
                TcpStream::connect((target.host.as_str(), target.port)).await.map_err(|e| ConnectError::of_io(&e))?;
            let _ = tcp.set_nodelay(true);
            Box::new(tcp)
        }
    };
    let request = target.request.clone();
    #[cfg(feature = "tls")]
    if target.tls {
        let tls = config.tls.clone().unwrap_or_else(crate::tls::webpki_client_config);
        let connector = Some(tokio_tungstenite::Connector::Rustls(tls));
        let (ws, _) = tokio_tungstenite::client_async_tls_with_config(request, io, None, connector)
            .await
            .map_err(|e| ConnectError::of_ws(&e))?;
        return Ok(ws);
    }
    // Without the `tls` feature, `Target::new` refused wss:// already.
    let (ws, _) = tokio_tungstenite::client_async_with_config(request, MaybeTlsStream::Plain(io), None)
        .await
        .map_err(|e| ConnectError::of_ws(&e))?;
    Ok(ws)
}

/// Applies a welcome: what the receiver acknowledged, then what it holds.
/// Either beyond what was sent, or a receipt below the acknowledgement, is
/// a protocol error of the receiver.
fn welcome<T: Clone + Send + Sync + 'static>(
    cell: &AsyncEgressCell<T>,
    generation: Generation,
    next: u64,
    received: u64,
    unwritten: &Unwritten,
) -> Result<(), String> {
    if received < next {
        return Err(format!("welcome: holds through {received} but acknowledged through {next}"));
    }
    if let Some(never) = received.checked_sub(1).and_then(|through| unwritten.covered(through)) {
        return Err(format!("welcome holds {received} records, but {never} was never sent"));
    }
    if let Some(through) = next.checked_sub(1) {
        if let AckOutcome::Unsent { sent_through, .. } = cell.ack(generation, Sequence(through)) {
            return Err(format!("welcome acknowledges {next} records, but only {sent_through:?} was sent"));
        }
        unwritten.acked(through);
    }
    if let Some(through) = received.checked_sub(1)
        && let ReceivedOutcome::Unsent { sent_through, .. } = cell.received(generation, Sequence(through))
    {
        return Err(format!("welcome holds {received} records, but only {sent_through:?} was sent"));
    }
    Ok(())
}

/// The next frame from the receiver, skipping pings and pongs; anything
/// heard (pings included) is noted in `heard`.
async fn read_frame<S>(stream: &mut S, limits: Limits, heard: &mut Instant) -> Result<Frame, End>
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    loop {
        let message = stream.next().await;
        *heard = Instant::now();
        match message {
            Some(Ok(Message::Binary(bytes))) => {
                return Frame::decode(&bytes, limits).map_err(|e| match e {
                    DecodeError::Version(_) => End::Version(e.to_string()),
                    e => End::Protocol(e.to_string()),
                });
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
            Some(Ok(Message::Text(_))) => return Err(End::Protocol("a text message".into())),
            Some(Ok(Message::Close(_))) | None => {
                return Err(End::Lost(ConnectError::Lost("connection closed".into())));
            }
            Some(Err(e)) => return Err(End::Lost(ConnectError::Lost(e.to_string().into()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Duration, Unwritten, stall_in_force};

    #[test]
    fn what_was_written_is_remembered_until_acknowledged_and_never_refused_again() {
        let u = Unwritten::default();
        u.refused(3);
        assert_eq!((u.covered(2), u.covered(3)), (None, Some(3)));
        // Written on a later connection: no longer unwritten, and a later
        // refusal (a smaller receiver) does not make it so again.
        u.written(3);
        u.refused(3);
        assert_eq!(u.covered(9), None);
        for s in 4..8 {
            u.written(s);
        }
        // An ack through 5 forgets the writes it covers: a refusal of 6 is
        // still not unwritten, one of 2 (acknowledged) would be.
        u.acked(5);
        assert_eq!(u.0.lock().written.iter().copied().collect::<Vec<_>>(), [6, 7]);
        u.refused(6);
        assert_eq!(u.covered(9), None);
        u.acked(u64::MAX);
        assert!(u.0.lock().written.is_empty());
    }

    #[test]
    fn the_stall_in_force_is_at_least_three_advertised_keepalives() {
        let ms = Duration::from_millis;
        assert_eq!(stall_in_force(Some(ms(60)), 200), ms(600));
        assert_eq!(stall_in_force(Some(ms(5_000)), 1_000), ms(5_000));
        assert_eq!(stall_in_force(Some(ms(60)), 0), ms(60));
        assert_eq!(stall_in_force(Some(ms(60)), u32::MAX), Duration::from_secs(180));
        assert_eq!(stall_in_force(None, 1_000), Duration::MAX);
    }
}
