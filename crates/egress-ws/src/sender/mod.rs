//! The sending side: a WebSocket transport for an [`AsyncEgressCell`] and the
//! supervisor that keeps it connected.

mod config;
mod connection;
mod state;
mod transport;

pub use config::SenderConfig;
use connection::supervise;
use state::Counters;
pub use state::{ConnectionState, SenderStats};
use transport::Unwritten;
pub use transport::{ReceiverTooSmall, TooLarge, UNTIL_RECONNECT, Unencodable, WsTransport};

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use egress_codec::{Encode, Raw};
use egress_reactive::{AsyncEgressCell, Computed, ConnectionTracker, Threaded, Watch};
use futures_util::stream::SplitSink;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tracing::Instrument as _;

use crate::connect_error::ConnectError;
#[cfg(doc)]
use crate::protocol::{GENERATION_LIMIT, MAX_GENERATION_JUMP};

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
    state: ConnectionTracker<ConnectError>,
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
        let state = ConnectionTracker::new(&cell, "egress sender").map_err(|_| SpawnError::CellDisposed)?;
        let (stop, stop_rx) = watch::channel(false);
        let kill = Arc::new(Notify::new());
        let counters = Arc::new(Counters::new(state.clone(), config.max_payload));
        // The cell refuses at once what could only become a dead letter,
        // for as long as this sender lives.
        let check: egress_reactive::SizeCheck<T> = {
            let (codec, limit) = (codec.clone(), counters.payload_limit.clone());
            Arc::new(move |value: &T| {
                let limit = limit.load(Ordering::Relaxed);
                let size = egress_codec::guarded(|| Ok(codec.size(value))).ok().flatten()?;
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
                        let what = egress_core::panic_message(&*panic).unwrap_or_default();
                        Some(ConnectError::Fatal(format!("the sender panicked: {what}").into()))
                    }
                };
                let error = error.inspect(|why| *counters.fatal.lock() = Some(why.clone()));
                counters.report(ConnectionState::Stopped { error });
            }
            .instrument(span)
        });
        Ok(Sender { task, stop, kill, counters, state, _cell: Box::new(cell), uninstall: Some(uninstall) })
    }

    /// Where the connection is, as a computed on the cell's graph (owned by
    /// the cell): read it in an effect or a computed to follow it.
    pub fn state(&self) -> &Computed<ConnectionState, Threaded> {
        self.state.state()
    }

    /// Where the connection is, as a stream: the current state first, then
    /// each change (a slow reader skips to the latest).
    pub fn watch_state(&self) -> Watch<ConnectionState> {
        self.state.watch()
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
