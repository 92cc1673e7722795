//! The sending side: a WebSocket transport for an [`AsyncEgressCell`] and the
//! supervisor that keeps it connected.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use egress_core::{AckOutcome, Envelope, Generation, Sequence};
use egress_reactive::{AsyncEgressCell, AsyncTransport, SendError};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::protocol::{CloseCode, Frame, Limits};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How a [`Sender`] connects and reconnects.
#[derive(Clone, Debug)]
pub struct SenderConfig {
    /// The producer id sent in every handshake: the receiver keys its
    /// per-producer state by it.
    pub producer: String,
    /// How long a connect and handshake may take.
    pub connect_timeout: Duration,
    /// The first reconnect delay; it doubles per failed attempt...
    pub backoff_base: Duration,
    /// ...up to this.
    pub backoff_max: Duration,
    /// The seed of the reconnect jitter (each delay is drawn from its
    /// upper half).
    pub seed: u64,
    /// Reconnect when nothing was acknowledged for this long while records
    /// are in flight (a peer that stopped acknowledging, or a gap that only a
    /// replay fills). `None`: never.
    pub stall_timeout: Option<Duration>,
    /// Decoding limits for what the receiver sends.
    pub limits: Limits,
}

impl SenderConfig {
    /// The defaults for producer `producer`.
    pub fn new(producer: impl Into<String>) -> Self {
        SenderConfig {
            producer: producer.into(),
            connect_timeout: Duration::from_secs(5),
            backoff_base: Duration::from_millis(20),
            backoff_max: Duration::from_secs(2),
            seed: 0x5eed,
            stall_timeout: Some(Duration::from_secs(2)),
            limits: Limits::default(),
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
    /// Connections ended for a protocol error from the receiver.
    pub protocol_errors: u64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    reconnects: AtomicU64,
    failed_attempts: AtomicU64,
    protocol_errors: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> SenderStats {
        SenderStats {
            connections: self.connections.load(Ordering::Relaxed),
            reconnects: self.reconnects.load(Ordering::Relaxed),
            failed_attempts: self.failed_attempts.load(Ordering::Relaxed),
            protocol_errors: self.protocol_errors.load(Ordering::Relaxed),
        }
    }
}

/// The transport an attachment sends through: the connection's write half.
/// Frames are queued by `send` and written by `flush`, once per pass.
pub struct WsTransport {
    sink: SplitSink<Ws, Message>,
}

impl AsyncTransport<Bytes> for WsTransport {
    async fn send(&mut self, envelope: Envelope<Bytes>) -> Result<(), SendError> {
        let frame = Frame::Data {
            generation: envelope.generation.get(),
            sequence: envelope.sequence.get(),
            attempt: envelope.attempt.get(),
            payload: envelope.payload,
        };
        self.sink.feed(Message::Binary(frame.encode())).await.map_err(SendError::transient)
    }

    async fn flush(&mut self) -> Result<(), SendError> {
        self.sink.flush().await.map_err(SendError::transient)
    }
}

impl std::fmt::Debug for WsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsTransport").finish_non_exhaustive()
    }
}

/// Keeps an [`AsyncEgressCell`] connected to a receiver.
///
/// Its task connects, handshakes (the producer id, a generation strictly
/// higher than any the cell used, and where the stream resumes), attaches a
/// [`WsTransport`] to the cell and feeds the receiver's acknowledgements
/// into the attachment. On any disconnect, error or stall it drops the
/// attachment, waits a jittered exponential backoff, and connects again
/// under the next generation. The cell's `reconnect` fences the old
/// attachment, and the new one replays exactly what is unacknowledged.
///
/// The cell outlives the sender: [`shutdown`](Self::shutdown) it, and
/// spawn another sender on the same cell to continue.
pub struct Sender {
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
    kill: Arc<Notify>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Sender {
    /// Starts the supervisor for `cell`, connecting to `url`
    /// (`ws://host:port`).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn(cell: AsyncEgressCell<Bytes>, url: impl Into<String>, config: SenderConfig) -> Sender {
        let (stop, stop_rx) = watch::channel(false);
        let kill = Arc::new(Notify::new());
        let counters = Arc::new(Counters::default());
        let task = tokio::spawn(supervise(cell, url.into(), config, stop_rx, kill.clone(), counters.clone()));
        Sender { task, stop, kill, counters }
    }

    /// What it has done so far.
    pub fn stats(&self) -> SenderStats {
        self.counters.snapshot()
    }

    /// Drops the current connection at once, as a network failure would
    /// (for chaos tests and demos); the supervisor reconnects.
    pub fn kill_connection(&self) {
        self.kill.notify_one();
    }

    /// Closes the connection and stops the supervisor; returns its stats.
    pub async fn shutdown(mut self) -> SenderStats {
        let _ = self.stop.send(true);
        let task = std::mem::replace(&mut self.task, tokio::spawn(async {}));
        let _ = task.await;
        self.counters.snapshot()
    }
}

/// Why a connection ended.
enum End {
    Stop,
    Lost(String),
    Protocol(String),
}

async fn supervise(
    cell: AsyncEgressCell<Bytes>,
    url: String,
    config: SenderConfig,
    mut stop: watch::Receiver<bool>,
    kill: Arc<Notify>,
    counters: Arc<Counters>,
) {
    let mut rng = config.seed | 1;
    let mut failures: u32 = 0;
    loop {
        if *stop.borrow() {
            return;
        }
        let connected_before = counters.connections.load(Ordering::Relaxed);
        let end = tokio::select! {
            end = connection(&cell, &url, &config, &kill, &counters) => end,
            _ = stop.changed() => End::Stop,
        };
        // A connection that got through its handshake resets the backoff:
        // the next delay starts from the base again.
        if counters.connections.load(Ordering::Relaxed) > connected_before {
            failures = 0;
        }
        match end {
            End::Stop => return,
            End::Lost(why) => {
                tracing::debug!(%why, "egress sender: connection ended");
            }
            End::Protocol(why) => {
                counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%why, "egress sender: protocol error");
            }
        }
        counters.reconnects.fetch_add(1, Ordering::Relaxed);
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let delay = backoff(&config, failures, rng);
        failures = failures.saturating_add(1);
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
    }
}

/// The jittered exponential backoff after `failures` failed attempts in a
/// row: a delay drawn (by `random`) from the upper half of
/// `backoff_base * 2^failures`, capped at `backoff_max`.
fn backoff(config: &SenderConfig, failures: u32, random: u64) -> Duration {
    let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let full = micros(config.backoff_base).saturating_mul(1u64 << failures.min(40)).min(micros(config.backoff_max));
    Duration::from_micros(full / 2 + random % (full / 2 + 1))
}

async fn connection(
    cell: &AsyncEgressCell<Bytes>,
    url: &str,
    config: &SenderConfig,
    kill: &Notify,
    counters: &Counters,
) -> End {
    // A generation strictly above every one the cell has used, taken now:
    // an attempt refused as stale moves the next one higher still. This
    // also fences the previous connection: what it had in flight or parked
    // goes back to pending, to be replayed on this one.
    let generation = Generation(cell.generation().get_untracked().get() + 1);
    let _ = cell.reconnect(generation);
    let connected = tokio::time::timeout(config.connect_timeout, async {
        let (mut ws, _) = tokio_tungstenite::connect_async(url).await.map_err(|e| End::Lost(e.to_string()))?;
        let resume_from = cell.acked_through().get_untracked().map_or(0, |s| s.get() + 1);
        let hello = Frame::Handshake { producer: config.producer.clone(), generation: generation.get(), resume_from };
        ws.send(Message::Binary(hello.encode())).await.map_err(|e| End::Lost(e.to_string()))?;
        match read_frame(&mut ws, config.limits).await? {
            Frame::Welcome { generation: g, next } if g == generation.get() => Ok((ws, next)),
            Frame::Close { code, reason } => Err(End::Protocol(format!("refused: {code:?} {reason}"))),
            other => Err(End::Protocol(format!("expected a welcome, got {other:?}"))),
        }
    })
    .await;
    let (ws, next) = match connected {
        Ok(Ok(ok)) => ok,
        Ok(Err(end)) => {
            counters.failed_attempts.fetch_add(1, Ordering::Relaxed);
            return end;
        }
        Err(_) => {
            counters.failed_attempts.fetch_add(1, Ordering::Relaxed);
            return End::Lost("connect timed out".into());
        }
    };
    // The receiver may already have more than was acknowledged.
    if next > 0 {
        if let AckOutcome::Unsent { .. } = cell.ack(generation, Sequence(next - 1)) {
            return End::Protocol(format!("the receiver claims to have {next} records, more than were sent"));
        }
    }
    counters.connections.fetch_add(1, Ordering::Relaxed);
    let (sink, mut stream) = ws.split();
    let link = cell.attach(WsTransport { sink });
    let mut last_ack = (cell.acked_through().get_untracked(), tokio::time::Instant::now());
    let stall = config.stall_timeout.unwrap_or(Duration::MAX);
    loop {
        let check = tokio::time::sleep(stall.min(Duration::from_secs(3600)) / 4);
        tokio::select! {
            frame = read_frame(&mut stream, config.limits) => match frame {
                Ok(Frame::Ack { generation: g, through }) if g == generation.get() => {
                    if let AckOutcome::Unsent { .. } = link.ack(Sequence(through)) {
                        return End::Protocol(format!("ack through {through}: never sent"));
                    }
                }
                Ok(Frame::Close { code: CloseCode::Normal, .. }) => return End::Lost("closed by the receiver".into()),
                Ok(Frame::Close { code, reason }) => return End::Protocol(format!("{code:?}: {reason}")),
                Ok(other) => return End::Protocol(format!("unexpected frame {other:?}")),
                Err(end) => return end,
            },
            () = kill.notified() => return End::Lost("killed".into()),
            () = check => {}
        }
        let acked = cell.acked_through().get_untracked();
        if acked != last_ack.0 {
            last_ack = (acked, tokio::time::Instant::now());
        } else if cell.inflight_len().get_untracked() > 0 && last_ack.1.elapsed() >= stall {
            return End::Lost("acknowledgements stalled".into());
        } else if cell.inflight_len().get_untracked() == 0 {
            last_ack.1 = tokio::time::Instant::now();
        }
    }
}

/// The next frame from the receiver, skipping pings and pongs.
async fn read_frame<S>(stream: &mut S, limits: Limits) -> Result<Frame, End>
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    loop {
        match stream.next().await {
            Some(Ok(Message::Binary(bytes))) => {
                return Frame::decode(&bytes, limits).map_err(|e| End::Protocol(e.to_string()));
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
            Some(Ok(Message::Text(_))) => return Err(End::Protocol("a text message".into())),
            Some(Ok(Message::Close(_))) | None => return Err(End::Lost("connection closed".into())),
            Some(Err(e)) => return Err(End::Lost(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_base_up_to_the_cap_within_its_upper_half() {
        let config = SenderConfig {
            backoff_base: Duration::from_millis(10),
            backoff_max: Duration::from_millis(100),
            ..SenderConfig::new("p")
        };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        for (failures, full) in [(0, 10.0), (1, 20.0), (2, 40.0), (3, 80.0), (4, 100.0), (60, 100.0)] {
            for random in [0, 1, 12_345, u64::MAX] {
                let d = ms(backoff(&config, failures, random));
                assert!(
                    (full / 2.0..=full).contains(&d),
                    "failures {failures}: {d} ms not in [{}, {full}]",
                    full / 2.0
                );
            }
        }
        assert_eq!(backoff(&config, 0, 0), Duration::from_millis(5));
    }
}
