//! The reference receiver: accepts many producers over WebSocket and
//! delivers each producer's stream to the application exactly once and in
//! order.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::protocol::{CloseCode, Frame, Limits};

/// How a [`Receiver`] acknowledges, buffers and checks.
#[derive(Clone, Debug)]
pub struct ReceiverConfig {
    /// Acknowledge after this many data frames on a connection...
    pub ack_every: usize,
    /// ...or this long after the first unacknowledged one, whichever comes
    /// first.
    pub ack_interval: Duration,
    /// How many frames per producer may wait out of order for a gap to fill;
    /// beyond that they are dropped (the producer's replay brings them back).
    pub max_buffered: usize,
    /// How many deliveries may wait for the application in
    /// [`Receiver::recv`]. When it is full, the receiver stops reading the
    /// producers' connections (and their windows fill): backpressure, not
    /// memory growth.
    pub delivery_buffer: usize,
    /// Decoding limits.
    pub limits: Limits,
    /// How long a new connection has to send its handshake.
    pub handshake_timeout: Duration,
    /// Faults injected into the acknowledgements this receiver sends, for
    /// tests and demos (none by default).
    pub ack_faults: AckFaults,
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        ReceiverConfig {
            ack_every: 32,
            ack_interval: Duration::from_millis(5),
            max_buffered: 4_096,
            delivery_buffer: 65_536,
            limits: Limits::default(),
            handshake_timeout: Duration::from_secs(5),
            ack_faults: AckFaults::default(),
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

/// One message, delivered to the application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The producer that sent it.
    pub producer: Arc<str>,
    /// Its sequence in that producer's stream.
    pub sequence: u64,
    /// The application's bytes.
    pub payload: Bytes,
}

/// Counters of what a receiver has seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    /// Messages delivered to the application.
    pub delivered: u64,
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
    /// Connections refused or closed for a protocol error (a close frame
    /// says why; logged through `tracing`).
    pub rejected: u64,
}

#[derive(Default)]
struct Counters {
    delivered: AtomicU64,
    duplicates: AtomicU64,
    overflow: AtomicU64,
    connections: AtomicU64,
    fenced: AtomicU64,
    rejected: AtomicU64,
}

/// What the receiver remembers of one producer.
struct Producer {
    /// The next sequence to deliver.
    next: u64,
    /// The highest generation accepted.
    generation: u64,
    /// Frames above `next`, waiting for the gap to fill.
    buffer: BTreeMap<u64, Bytes>,
    /// Tells the current connection it was fenced.
    fence: watch::Sender<u64>,
    /// Held while a connection takes a frame and hands its deliveries to the
    /// application, so that an old and a new connection of the producer
    /// never interleave their deliveries.
    turn: Arc<tokio::sync::Mutex<()>>,
}

struct Shared {
    config: ReceiverConfig,
    producers: Mutex<HashMap<Arc<str>, Producer>>,
    deliveries: mpsc::Sender<Delivery>,
    counters: Counters,
}

/// A WebSocket server that receives egress streams.
///
/// Per producer (named in the handshake), it delivers each sequence once,
/// in order, through [`Receiver::recv`] (a bounded queue: when the
/// application falls behind, the receiver stops reading, and the producers'
/// windows fill); drops duplicates; buffers up to
/// `max_buffered` frames out of order; acknowledges cumulatively every
/// `ack_every` frames or `ack_interval`; and fences a producer's older
/// connection when a newer generation connects. A receiver that starts
/// with no memory of a producer resumes where the handshake says
/// (`resume_from`). If it restarts after delivering messages it had not yet
/// acknowledged, it delivers those again: exactly-once holds for the life of
/// a receiver's memory.
///
/// Dropping the receiver stops accepting and closes its connections.
pub struct Receiver {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    deliveries: mpsc::Receiver<Delivery>,
    accept: JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.accept.abort();
        // Fence every connection, so that their tasks end.
        if let Ok(producers) = self.shared.producers.lock() {
            for p in producers.values() {
                let _ = p.fence.send(u64::MAX);
            }
        }
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
    /// The bind's I/O error.
    pub async fn bind(addr: impl ToSocketAddrs, config: ReceiverConfig) -> std::io::Result<Receiver> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let (tx, deliveries) = mpsc::channel(config.delivery_buffer.max(1));
        let shared = Arc::new(Shared {
            config,
            producers: Mutex::new(HashMap::new()),
            deliveries: tx,
            counters: Counters::default(),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Receiver { local_addr, shared, deliveries, accept })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The next delivery (`None` once the receiver is shut down).
    pub async fn recv(&mut self) -> Option<Delivery> {
        self.deliveries.recv().await
    }

    /// A delivery if one is ready.
    pub fn try_recv(&mut self) -> Option<Delivery> {
        self.deliveries.try_recv().ok()
    }

    /// What it has seen so far.
    pub fn stats(&self) -> ReceiverStats {
        let c = &self.shared.counters;
        ReceiverStats {
            delivered: c.delivered.load(Ordering::Relaxed),
            duplicates: c.duplicates.load(Ordering::Relaxed),
            overflow: c.overflow.load(Ordering::Relaxed),
            connections: c.connections.load(Ordering::Relaxed),
            fenced: c.fenced.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting and closes every connection; returns once the
    /// listening socket is closed (so its address can be bound again).
    pub async fn shutdown(mut self) {
        self.accept.abort();
        let accept = std::mem::replace(&mut self.accept, tokio::spawn(async {}));
        let _ = accept.await;
    }

    /// The next sequence it will deliver for `producer` (`None` if it has
    /// never seen it).
    pub fn next_for(&self, producer: &str) -> Option<u64> {
        self.shared.producers.lock().ok()?.get(producer).map(|p| p.next)
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                let shared = shared.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve(stream, &shared).await {
                        tracing::warn!(%peer, error = %e, "egress receiver closed a connection");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "egress receiver: accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Why a connection ended badly.
#[derive(Debug, thiserror::Error)]
enum ServeError {
    #[error("websocket: {0}")]
    Ws(#[from] tokio_tungstenite::tungstenite::Error),
    #[error("protocol: {0}")]
    Protocol(String),
}

type Ws = tokio_tungstenite::WebSocketStream<TcpStream>;

/// Sends a close frame and closes. A refusal (anything but a normal end or a
/// fence) is counted before the peer can see it.
async fn close(ws: &mut Ws, counters: &Counters, code: CloseCode, reason: impl Into<String>) {
    if !matches!(code, CloseCode::Normal | CloseCode::Fenced) {
        counters.rejected.fetch_add(1, Ordering::Relaxed);
    }
    let frame = Frame::Close { code, reason: reason.into() };
    let _ = ws.send(Message::Binary(frame.encode())).await;
    let _ = ws.close(None).await;
}

/// Reads the next binary message as a frame; `Ok(None)` when the peer
/// closed.
async fn next_frame(ws: &mut Ws, limits: Limits) -> Result<Option<Frame>, ServeError> {
    loop {
        match ws.next().await {
            None | Some(Ok(Message::Close(_))) => return Ok(None),
            Some(Ok(Message::Binary(bytes))) => {
                return Frame::decode(&bytes, limits).map(Some).map_err(|e| ServeError::Protocol(e.to_string()));
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
            Some(Ok(Message::Text(_))) => return Err(ServeError::Protocol("a text message".into())),
            Some(Err(e)) => return Err(e.into()),
        }
    }
}

fn ws_config(limits: Limits) -> WebSocketConfig {
    let max = limits.max_payload.saturating_add(64);
    WebSocketConfig::default().max_message_size(Some(max)).max_frame_size(Some(max))
}

async fn serve(stream: TcpStream, shared: &Shared) -> Result<(), ServeError> {
    let config = &shared.config;
    let mut ws = tokio_tungstenite::accept_async_with_config(stream, Some(ws_config(config.limits))).await?;
    let first = match tokio::time::timeout(config.handshake_timeout, next_frame(&mut ws, config.limits)).await {
        Ok(Ok(Some(frame))) => frame,
        Ok(Ok(None)) => return Ok(()),
        Ok(Err(e)) => {
            close(&mut ws, &shared.counters, CloseCode::Protocol, e.to_string()).await;
            return Err(e);
        }
        Err(_) => {
            close(&mut ws, &shared.counters, CloseCode::Protocol, "no handshake in time").await;
            return Err(ServeError::Protocol("no handshake in time".into()));
        }
    };
    let Frame::Handshake { producer, generation, resume_from } = first else {
        close(&mut ws, &shared.counters, CloseCode::Protocol, "expected a handshake").await;
        return Err(ServeError::Protocol(format!("expected a handshake, got {first:?}")));
    };
    let producer: Arc<str> = producer.into();
    // Register, fencing any older connection of the producer.
    let accepted = {
        let mut producers = shared.producers.lock().map_err(|_| ServeError::Protocol("poisoned".into()))?;
        match producers.get_mut(&producer) {
            Some(p) if generation <= p.generation => Err(p.generation),
            Some(p) => {
                p.generation = generation;
                // Everything below `resume_from` was acknowledged to the
                // producer, which no longer holds it: never wait for it.
                if resume_from > p.next {
                    p.next = resume_from;
                    p.buffer = p.buffer.split_off(&resume_from);
                }
                let _ = p.fence.send(generation);
                Ok((p.next, p.fence.subscribe(), p.turn.clone()))
            }
            None => {
                let (fence, rx) = watch::channel(generation);
                let turn = Arc::new(tokio::sync::Mutex::new(()));
                producers.insert(
                    producer.clone(),
                    Producer { next: resume_from, generation, buffer: BTreeMap::new(), fence, turn: turn.clone() },
                );
                Ok((resume_from, rx, turn))
            }
        }
    };
    let (next, mut fenced, turn) = match accepted {
        Ok(ok) => ok,
        Err(latest) => {
            let reason = format!("generation {generation} is not above {latest}");
            close(&mut ws, &shared.counters, CloseCode::StaleGeneration, reason.clone()).await;
            return Err(ServeError::Protocol(reason));
        }
    };
    shared.counters.connections.fetch_add(1, Ordering::Relaxed);
    ws.send(Message::Binary(Frame::Welcome { generation, next }.encode())).await?;

    let mut acks = Acks::new(config, generation);
    let mut ready = Vec::new();
    loop {
        let deadline = acks.deadline();
        tokio::select! {
            frame = next_frame(&mut ws, config.limits) => {
                let frame = match frame {
                    Ok(Some(frame)) => frame,
                    Ok(None) => return Ok(()),
                    Err(e) => {
                        close(&mut ws, &shared.counters, CloseCode::Protocol, e.to_string()).await;
                        return Err(e);
                    }
                };
                match frame {
                    Frame::Data { generation: g, sequence, payload, .. } if g == generation => {
                        let _turn = turn.lock().await;
                        match take(shared, &producer, generation, sequence, payload, &mut ready) {
                            Some(through) => {
                                for d in ready.drain(..) {
                                    if shared.deliveries.send(d).await.is_err() {
                                        return Ok(()); // the receiver is gone
                                    }
                                    shared.counters.delivered.fetch_add(1, Ordering::Relaxed);
                                }
                                acks.received(through);
                            }
                            None => {
                                shared.counters.fenced.fetch_add(1, Ordering::Relaxed);
                                close(&mut ws, &shared.counters, CloseCode::Fenced, "a newer connection replaced this one").await;
                                return Ok(());
                            }
                        }
                    }
                    Frame::Close { code, reason } => {
                        tracing::debug!(?code, %reason, "producer closed the connection");
                        return Ok(());
                    }
                    other => {
                        let reason = format!("unexpected frame {other:?}");
                        close(&mut ws, &shared.counters, CloseCode::Protocol, reason.clone()).await;
                        return Err(ServeError::Protocol(reason));
                    }
                }
            }
            _ = fenced.changed() => {
                if *fenced.borrow() != generation {
                    shared.counters.fenced.fetch_add(1, Ordering::Relaxed);
                    close(&mut ws, &shared.counters, CloseCode::Fenced, "a newer connection replaced this one").await;
                    return Ok(());
                }
            }
            () = sleep_until(deadline) => {}
        }
        for frame in acks.due(Instant::now()) {
            ws.send(Message::Binary(frame.encode())).await?;
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Takes one data frame of `producer`: adds it and whatever it unblocks to
/// `ready` (to hand to the application, in order), buffers it, or drops it
/// as a duplicate. Returns the watermark
/// to acknowledge (`u64::MAX` meaning nothing yet), or `None` if the
/// connection's generation was fenced.
fn take(
    shared: &Shared,
    producer: &Arc<str>,
    generation: u64,
    sequence: u64,
    payload: Bytes,
    ready: &mut Vec<Delivery>,
) -> Option<u64> {
    let mut producers = shared.producers.lock().ok()?;
    let p = producers.get_mut(producer)?;
    if p.generation != generation {
        return None;
    }
    let c = &shared.counters;
    if sequence < p.next || p.buffer.contains_key(&sequence) {
        c.duplicates.fetch_add(1, Ordering::Relaxed);
    } else if sequence == p.next {
        ready.push(Delivery { producer: producer.clone(), sequence, payload });
        p.next += 1;
        while let Some(payload) = p.buffer.remove(&p.next) {
            ready.push(Delivery { producer: producer.clone(), sequence: p.next, payload });
            p.next += 1;
        }
    } else if p.buffer.len() < shared.config.max_buffered {
        p.buffer.insert(sequence, payload);
    } else {
        c.overflow.fetch_add(1, Ordering::Relaxed);
    }
    Some(p.next.checked_sub(1).unwrap_or(u64::MAX))
}

/// When to acknowledge, and the injected faults.
struct Acks {
    every: usize,
    interval: Duration,
    generation: u64,
    unacked: usize,
    since: Option<Instant>,
    through: u64,
    faults: AckFaults,
    rng: u64,
    delayed: VecDeque<(Instant, u64)>,
}

impl Acks {
    fn new(config: &ReceiverConfig, generation: u64) -> Self {
        Acks {
            every: config.ack_every.max(1),
            interval: config.ack_interval,
            generation,
            unacked: 0,
            since: None,
            through: u64::MAX,
            faults: config.ack_faults,
            rng: config.ack_faults.seed ^ generation.rotate_left(17) ^ 0x9E37_79B9_7F4A_7C15,
            delayed: VecDeque::new(),
        }
    }

    fn received(&mut self, through: u64) {
        self.through = through;
        self.unacked += 1;
        self.since.get_or_insert_with(Instant::now);
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
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        #[allow(clippy::cast_precision_loss)]
        let x = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
        x < p
    }

    /// The ack frames to send now.
    fn due(&mut self, now: Instant) -> Vec<Frame> {
        let mut out = Vec::new();
        let time_up = self.since.is_some_and(|s| now >= s + self.interval);
        if self.unacked > 0 && (self.unacked >= self.every || time_up) {
            self.unacked = 0;
            self.since = None;
            if self.through != u64::MAX && !self.chance(self.faults.drop) {
                let copies = if self.chance(self.faults.duplicate) { 2 } else { 1 };
                for _ in 0..copies {
                    if self.chance(self.faults.delay_probability) {
                        self.delayed.push_back((now + self.faults.delay, self.through));
                    } else {
                        out.push(Frame::Ack { generation: self.generation, through: self.through });
                    }
                }
            }
        }
        while self.delayed.front().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, through)) = self.delayed.pop_front() {
                out.push(Frame::Ack { generation: self.generation, through });
            }
        }
        out
    }
}
