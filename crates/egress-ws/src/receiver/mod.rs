//! The reference receiver: accepts many producers over WebSocket and
//! delivers each producer's stream to the application exactly once and in
//! order, acknowledging only what the application has taken (or committed).
//!
//! The state lives in [`inbox`] (no I/O); [`connection`] runs one task per
//! connection around it, [`acks`] decides when it acknowledges, and
//! [`upgrade`] is its door (the HTTP upgrade, authorization). This file is
//! the application's side: the receiver, its deliveries and its counters.

mod acks;
mod config;
mod connection;
mod inbox;
mod upgrade;

#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_inbox(data: &[u8]) {
    inbox::drive::run(data);
}

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use bytes::Bytes;
use egress_core::Incarnation;
use parking_lot::Mutex;
use tokio::net::{TcpListener, ToSocketAddrs};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use self::config::{AckFaults, AckMode, ReceiverConfig};
use self::connection::accept_loop;
pub use self::inbox::Content;
use self::inbox::{Inbox, Queued, Rules};
pub use self::upgrade::{Authorize, Refusal, Upgrade};

/// The application's durable record of what it committed (the trait is
/// egress-core's, so that stores implement it without depending on this
/// crate).
pub use egress_core::Resume;

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
