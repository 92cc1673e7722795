//! The publishing side: a JetStream transport for an [`AsyncEgressCell`]
//! and the supervisor that keeps it publishing (see the crate's docs).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::context::{Context, PublishErrorKind};
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::{ConnectOptions, Event};
use bytes::Bytes;
use egress_core::{AckOutcome, Completions, DeadLetters, Envelope, Generation, Sequence};
use egress_reactive::{AsyncEgressCell, AsyncTransport, Backoff, SendError};
use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;
use tracing::Instrument as _;

use crate::stamp::Stamp;

/// The owner part of a generation: its upper 32 bits. A publisher taking a
/// stream over starts at the first generation of an owner above every
/// generation stored on the subject; its reconnects count up within its
/// owner. A message of a higher owner on the subject fences it.
pub const fn owner_of(generation: u64) -> u64 {
    generation >> 32
}

/// Makes the client's connect options: for credentials, TLS, or a name.
/// The publisher adds its own event callback (it replaces one set here),
/// reconnect delays and retry on the first connect.
pub type Options = Arc<dyn Fn() -> ConnectOptions + Send + Sync>;

/// How a [`Publisher`] publishes.
#[derive(Clone)]
pub struct PublisherConfig {
    /// The producer id, in every message's headers and message id: with
    /// the cell's incarnation, the key of the consumers' state.
    pub producer: String,
    /// The JetStream stream, which must hold `subject` only (the fence
    /// expects the stream's last message id, so another subject's message
    /// would refuse every publish: checked at the first connection,
    /// [`PublisherError::SharedStream`]).
    pub stream: String,
    /// The subject the records are published to: one egress stream.
    pub subject: String,
    /// How long a publish acknowledgement or a JetStream request may take
    /// before the connection is taken as lost.
    pub timeout: Duration,
    /// The first delay before a new epoch after a lost one; it doubles per
    /// failure...
    pub backoff_base: Duration,
    /// ...up to this.
    pub backoff_max: Duration,
    /// The seed of the backoff's jitter.
    pub seed: u64,
    /// Publish acknowledgements the client may wait for at once (its
    /// `max_ack_inflight`; acknowledgements abandoned with a lost
    /// connection hold theirs until `timeout`).
    pub max_ack_inflight: usize,
    /// The client's connect options; `None`: the defaults.
    pub options: Option<Options>,
}

impl std::fmt::Debug for PublisherConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublisherConfig")
            .field("producer", &self.producer)
            .field("stream", &self.stream)
            .field("subject", &self.subject)
            .field("timeout", &self.timeout)
            .field("backoff_base", &self.backoff_base)
            .field("backoff_max", &self.backoff_max)
            .field("seed", &self.seed)
            .field("max_ack_inflight", &self.max_ack_inflight)
            .field("options", &self.options.as_ref().map(|_| "custom"))
            .finish()
    }
}

impl PublisherConfig {
    /// The defaults for `producer` publishing to `subject` of JetStream
    /// stream `stream`.
    pub fn new(producer: impl Into<String>, stream: impl Into<String>, subject: impl Into<String>) -> Self {
        PublisherConfig {
            producer: producer.into(),
            stream: stream.into(),
            subject: subject.into(),
            timeout: Duration::from_secs(2),
            backoff_base: Duration::from_millis(20),
            backoff_max: Duration::from_secs(2),
            seed: 0x5eed,
            max_ack_inflight: 16_384,
            options: None,
        }
    }
}

/// Why [`Publisher::spawn`] refused its arguments: no retry could help.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// Not a NATS server address.
    #[error("not a NATS URL: {url:?}: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A producer id that cannot go in a header: empty, or not printable
    /// ASCII.
    #[error("producer id {0:?}: not empty printable ASCII")]
    InvalidProducer(String),
    /// A subject a message cannot be published to: empty, with a wildcard
    /// or white space, or an empty token.
    #[error("subject {0:?}: not a publishable subject")]
    InvalidSubject(String),
    /// An empty stream name, or one with a `.`, `*`, `>` or white space.
    #[error("stream {0:?}: not a stream name")]
    InvalidStream(String),
    /// The cell was disposed: nothing could be published from it.
    #[error("the cell was disposed")]
    CellDisposed,
    /// The cell's policy holds dead letters: a stream's order is fixed as
    /// it is published, so a dead letter takes its place as a tombstone
    /// ([`DeadLetters::Skip`]); a held one would leave a hole that the
    /// stream's last message covers.
    #[error("the cell's policy holds dead letters: NATS streams need DeadLetters::Skip")]
    HoldUnsupported,
}

/// Why a [`Publisher`] stopped on its own.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PublisherError {
    /// Another publisher took the stream over: the subject's last message
    /// was published under a higher owner than this one's.
    #[error("fenced: the subject holds a message of generation {by} (owner {}), above this publisher's owner {owner}", owner_of(*by))]
    Fenced {
        /// This publisher's owner part.
        owner: u64,
        /// The generation found.
        by: u64,
    },
    /// The JetStream stream holds other subjects too: the fence's
    /// expectations would fail after every foreign message.
    #[error("stream {stream:?} holds subjects {subjects:?}, not only {subject:?}")]
    SharedStream {
        /// The stream.
        stream: String,
        /// The subject of this publisher.
        subject: String,
        /// The stream's subjects.
        subjects: Vec<String>,
    },
    /// The subject's last message carries this producer's id and
    /// incarnation and a sequence the cell never sent: another writer
    /// uses its identity.
    #[error("the subject holds sequence {held} of this producer's incarnation, but the cell sent only {sent:?}")]
    AheadOfCell {
        /// The sequence the subject holds.
        held: u64,
        /// What the cell sent.
        sent: Option<Sequence>,
    },
    /// No generation is left (2^32 owners, or 2^32 epochs of one owner).
    #[error("the generation space is exhausted")]
    Exhausted,
}

/// Counters of a publisher's work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Epochs started: the first, and one per reconnect or resync.
    pub epochs: u64,
    /// Epochs ended by the connection (a disconnect, a timeout, a failed
    /// request).
    pub lost: u64,
    /// Epochs ended by a refused expectation that was not a fence.
    pub resyncs: u64,
    /// Messages published (sent, acknowledged or not).
    pub published: u64,
    /// Publish acknowledgements that said "duplicate".
    pub duplicates: u64,
    /// Records refused before publishing (above the server's payload
    /// limit): permanent failures.
    pub refused: u64,
    /// Takeover claims acknowledged as stored (messages of the subject
    /// that are no record; see [`Stamp::claim`]). A claim whose
    /// acknowledgement was lost with its connection is stored but not
    /// counted (the takeover then claims again).
    pub claims: u64,
}

#[derive(Default)]
struct Counters {
    epochs: AtomicU64,
    lost: AtomicU64,
    resyncs: AtomicU64,
    published: AtomicU64,
    duplicates: AtomicU64,
    refused: AtomicU64,
    claims: AtomicU64,
    failure: parking_lot::Mutex<Option<PublisherError>>,
}

impl Counters {
    fn snapshot(&self) -> PublisherStats {
        PublisherStats {
            epochs: self.epochs.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            resyncs: self.resyncs.load(Ordering::Relaxed),
            published: self.published.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            claims: self.claims.load(Ordering::Relaxed),
        }
    }
}

/// Publishes an [`AsyncEgressCell`]'s records to a JetStream subject, in
/// order, each stored once, fenced by generation (see the crate's docs).
///
/// Its task connects (retrying), reads the subject's last message, takes a
/// generation, applies what the stream holds to the cell, attaches a
/// transport and turns the publish acknowledgements into cumulative
/// acknowledgements; any lost connection or refused expectation ends that
/// epoch and starts the next. Dropping the `Publisher` aborts its task;
/// [`shutdown`](Self::shutdown) stops it and returns its stats.
#[must_use = "dropping a Publisher aborts it at once: keep it, or call shutdown()"]
pub struct Publisher {
    task: Option<JoinHandle<()>>,
    stop: watch::Sender<bool>,
    kill: Arc<Notify>,
    counters: Arc<Counters>,
    stopped: watch::Receiver<bool>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl Publisher {
    /// Starts publishing `cell`'s records through the NATS server at `url`
    /// (`nats://host:port`, or a list separated by commas).
    ///
    /// # Errors
    /// Arguments no retry could make work: [`SpawnError`].
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn(cell: AsyncEgressCell<Bytes>, url: &str, config: PublisherConfig) -> Result<Publisher, SpawnError> {
        let servers = url
            .split(',')
            .map(|u| u.trim().parse::<async_nats::ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| SpawnError::InvalidUrl { url: url.to_owned(), reason: e.to_string() })?;
        if config.producer.is_empty() || !config.producer.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
            return Err(SpawnError::InvalidProducer(config.producer));
        }
        let subject_ok = !config.subject.is_empty()
            && config.subject.split('.').all(|t| !t.is_empty() && t != "*" && t != ">")
            && config.subject.bytes().all(|b| b.is_ascii_graphic());
        if !subject_ok {
            return Err(SpawnError::InvalidSubject(config.subject));
        }
        let stream_ok = !config.stream.is_empty()
            && config.stream.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b'.' | b'*' | b'>'));
        if !stream_ok {
            return Err(SpawnError::InvalidStream(config.stream));
        }
        if cell.is_disposed() {
            return Err(SpawnError::CellDisposed);
        }
        if cell.with_core(|core| core.policy().dead_letters()) != DeadLetters::Skip {
            return Err(SpawnError::HoldUnsupported);
        }
        let (stop, stop_rx) = watch::channel(false);
        let (stopped_tx, stopped) = watch::channel(false);
        let kill = Arc::new(Notify::new());
        let counters = Arc::new(Counters::default());
        let span = tracing::info_span!("egress_nats_publisher", producer = %config.producer, subject = %config.subject);
        let task = tokio::spawn({
            let (kill, counters) = (kill.clone(), counters.clone());
            async move {
                if let Some(error) = supervise(cell, servers, config, stop_rx, kill, counters.clone()).await {
                    tracing::error!(%error, "egress nats publisher: stopped");
                    *counters.failure.lock() = Some(error);
                }
                let _ = stopped_tx.send(true);
            }
            .instrument(span)
        });
        Ok(Publisher { task: Some(task), stop, kill, counters, stopped })
    }

    /// What it has done so far.
    pub fn stats(&self) -> PublisherStats {
        self.counters.snapshot()
    }

    /// Why it stopped on its own, if it did.
    pub fn failure(&self) -> Option<PublisherError> {
        self.counters.failure.lock().clone()
    }

    /// Waits until it stops on its own (fenced, or another
    /// [`PublisherError`]) and returns why.
    pub async fn stopped(&mut self) -> Option<PublisherError> {
        let _ = self.stopped.wait_for(|s| *s).await;
        self.failure()
    }

    /// Ends the current epoch at once, as a lost connection would (for
    /// chaos tests and demos): the next one replays what the stream does
    /// not hold.
    pub fn kill_connection(&self) {
        self.kill.notify_one();
    }

    /// Stops publishing (what is in flight stays in the cell, for another
    /// publisher) and returns the stats.
    pub async fn shutdown(mut self) -> PublisherStats {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.counters.snapshot()
    }
}

/// The client's connection, as its events tell it.
#[derive(Clone, Copy, Debug, Default)]
struct Link {
    connected: bool,
    /// Disconnects so far: an epoch ends when this moves.
    disconnects: u64,
}

/// Why an epoch ended.
enum End {
    Stop,
    /// The connection or a request failed: a new epoch after the backoff.
    Lost(String),
    /// An expectation (last sequence, last message id) was refused: read
    /// the subject again.
    Resync,
    Fatal(PublisherError),
}

/// The subject's last message.
struct Last {
    /// Its stream sequence: what the next publish expects.
    stream_sequence: u64,
    /// Its stamp; `None` for a message without egress headers.
    stamp: Option<Stamp>,
}

async fn supervise(
    cell: AsyncEgressCell<Bytes>,
    servers: Vec<async_nats::ServerAddr>,
    config: PublisherConfig,
    mut stop: watch::Receiver<bool>,
    kill: Arc<Notify>,
    counters: Arc<Counters>,
) -> Option<PublisherError> {
    let (link_tx, mut link) = watch::channel(Link::default());
    let link_tx = Arc::new(link_tx);
    let (base, max) = (config.backoff_base, config.backoff_max);
    let options = config.options.as_ref().map_or_else(ConnectOptions::new, |make| make());
    let options = options
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connection_timeout(config.timeout)
        .reconnect_delay_callback(move |attempts| {
            let failures = u32::try_from(attempts).unwrap_or(u32::MAX);
            Backoff::delay_with(base, max, failures, u64::try_from(attempts).unwrap_or(0).wrapping_mul(0x9e37_79b9))
        })
        .event_callback(move |event| {
            let link_tx = link_tx.clone();
            async move {
                match event {
                    Event::Connected => link_tx.send_modify(|l| l.connected = true),
                    Event::Disconnected | Event::Closed => link_tx.send_modify(|l| {
                        l.connected = false;
                        l.disconnects += 1;
                    }),
                    _ => {}
                }
            }
        });
    let client = tokio::select! {
        client = options.connect(servers) => match client {
            Ok(client) => client,
            Err(e) => {
                // With retry_on_initial_connect, only the options can fail.
                tracing::error!(error = %e, "egress nats publisher: cannot connect");
                return None;
            }
        },
        _ = stop.changed() => return None,
    };
    let js = async_nats::jetstream::context::ContextBuilder::new()
        .timeout(config.timeout)
        .ack_timeout(config.timeout)
        .max_ack_inflight(config.max_ack_inflight.max(1))
        .build(client.clone());
    let mut backoff = Backoff::new(config.backoff_base, config.backoff_max, config.seed);
    let mut failures: u32 = 0;
    let mut owner: Option<u64> = None;
    // The last epoch was a resync that moved nothing: the next resync
    // waits, so that two writers cannot drive a hot loop.
    let mut hurried = false;
    loop {
        if *stop.borrow() {
            return None;
        }
        // Wait for the client's connection.
        tokio::select! {
            r = link.wait_for(|l| l.connected) => if r.is_err() { return None },
            _ = stop.changed() => return None,
        }
        let before = cell.acked_through().get_untracked();
        let end = epoch(&cell, &js, &config, &mut owner, &counters, &mut link, &kill, &mut stop).await;
        let progressed = cell.acked_through().get_untracked() > before;
        if progressed {
            failures = 0;
            hurried = false;
        }
        let wait = match end {
            End::Stop => return None,
            End::Fatal(e) => return Some(e),
            End::Lost(why) => {
                counters.lost.fetch_add(1, Ordering::Relaxed);
                tracing::info!(%why, "egress nats publisher: epoch lost");
                true
            }
            End::Resync => {
                counters.resyncs.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("egress nats publisher: an expectation was refused; resyncing");
                std::mem::replace(&mut hurried, true)
            }
        };
        if wait {
            let delay = backoff.delay(failures);
            failures = failures.saturating_add(1);
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = stop.changed() => return None,
            }
        }
    }
}

/// Reads the subject's last message (`None`: the subject has none).
async fn read_last(js: &Context, config: &PublisherConfig, check_stream: bool) -> Result<Option<Last>, End> {
    let lost = |what: &str, e: &dyn std::fmt::Display| End::Lost(format!("{what}: {e}"));
    if check_stream {
        let mut stream = js.get_stream(&config.stream).await.map_err(|e| lost("stream info", &e))?;
        let subjects = stream.info().await.map_err(|e| lost("stream info", &e))?.config.subjects.clone();
        if subjects != [config.subject.clone()] {
            return Err(End::Fatal(PublisherError::SharedStream {
                stream: config.stream.clone(),
                subject: config.subject.clone(),
                subjects,
            }));
        }
    }
    let stream = js.get_stream_no_info(&config.stream).await.map_err(|e| lost("stream", &e))?;
    match stream.get_last_raw_message_by_subject(&config.subject).await {
        Ok(message) => {
            let stamp = match Stamp::from_headers(&message.headers) {
                Ok(stamp) => Some(stamp),
                Err(e) => {
                    tracing::warn!(error = %e, sequence = message.sequence, "egress nats publisher: the subject's last message is not an egress record");
                    None
                }
            };
            Ok(Some(Last { stream_sequence: message.sequence, stamp }))
        }
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(lost("last message", &e)),
    }
}

/// Whether the stream refused a message for its size (the stream's
/// `max_msg_size`, or its headers): no retry can store it.
fn never_storable(e: &async_nats::jetstream::context::PublishError) -> bool {
    use async_nats::jetstream::ErrorCode;
    std::error::Error::source(e).and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>()).is_some_and(
        |je| {
            matches!(
                je.error_code(),
                ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM | ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM
            )
        },
    )
}

/// Returns when the client has disconnected since `disconnects` (or is
/// gone).
async fn disconnected(link: &mut watch::Receiver<Link>, disconnects: u64) {
    let _ = link.wait_for(|l| l.disconnects != disconnects).await;
}

/// What the transport tells its epoch.
enum Sent {
    /// A message went out; its acknowledgement will say where it went.
    Published { sequence: Sequence, ack: async_nats::jetstream::context::PublishAckFuture },
    /// The client refused a publish: the epoch ends.
    Broken(String),
}

/// The attachment's transport: publishes each envelope with its stamp and
/// its fence, and passes the acknowledgement's future to the epoch.
///
/// The fence: the epoch's first message expects the subject's last
/// sequence as read (`Nats-Expected-Last-Subject-Sequence`); each later one
/// expects the message id of the one published before it
/// (`Nats-Expected-Last-Msg-Id`). So a message is stored only right after
/// its predecessor: once one is refused, every later one of the epoch is
/// refused too (a later expectation cannot line up with another writer's
/// messages), and of each producer incarnation the stream holds a gap-free
/// prefix. What the last message says was sent is then all there.
struct NatsTransport {
    js: Context,
    subject: async_nats::Subject,
    producer: String,
    incarnation: u128,
    /// The subject's last sequence when the epoch read it.
    first_expected: u64,
    /// The message id of the message published before the next one.
    previous: Option<String>,
    /// Sequences whose record was too large, published as tombstones in
    /// their place: the cell's own tombstone for one is not sent again.
    placed: std::collections::BTreeSet<u64>,
    sent: mpsc::UnboundedSender<Sent>,
    counters: Arc<Counters>,
    /// The client refused a publish: nothing more goes out in this epoch
    /// (what is claimed stays in flight, and the next epoch replays it in
    /// order).
    broken: bool,
}

impl NatsTransport {
    /// Publishes `stamp` with `payload` behind the previous message.
    async fn publish(
        &mut self,
        stamp: &Stamp,
        payload: Bytes,
    ) -> Result<(), async_nats::jetstream::context::PublishError> {
        let mut headers = stamp.to_headers();
        match &self.previous {
            None => headers.insert(
                async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
                self.first_expected.to_string().as_str(),
            ),
            Some(id) => headers.insert(async_nats::header::NATS_EXPECTED_LAST_MESSAGE_ID, id.as_str()),
        }
        let ack = self.js.publish_with_headers(self.subject.clone(), headers, payload).await?;
        self.counters.published.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(sequence = stamp.sequence, "egress nats publisher: published");
        self.previous = Some(stamp.message_id());
        let _ = self.sent.send(Sent::Published { sequence: Sequence(stamp.sequence), ack });
        Ok(())
    }

    fn broke(&mut self, e: &dyn std::fmt::Display) {
        self.broken = true;
        let _ = self.sent.send(Sent::Broken(e.to_string()));
    }
}

impl AsyncTransport<Bytes> for NatsTransport {
    async fn send(&mut self, envelope: Envelope<Bytes>) -> Result<(), SendError> {
        if self.broken {
            return Ok(());
        }
        let sequence = envelope.sequence.get();
        if envelope.dead.is_some() && self.placed.remove(&sequence) {
            // Its tombstone went out in its place already.
            return Ok(());
        }
        let stamp = Stamp {
            producer: self.producer.clone(),
            incarnation: self.incarnation,
            sequence,
            generation: envelope.generation.get(),
            dead: envelope.dead,
            claim: false,
        };
        let payload = if envelope.dead.is_some() { Bytes::new() } else { envelope.payload };
        match self.publish(&stamp, payload).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == PublishErrorKind::MaxPayloadExceeded => {
                // Never publishable: a dead letter. Its tombstone takes its
                // place now, so that the stream's order has no hole.
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                let tombstone = Stamp { dead: Some(egress_core::DeadReason::Permanent), ..stamp };
                match self.publish(&tombstone, Bytes::new()).await {
                    Ok(()) => {
                        self.placed.insert(sequence);
                    }
                    Err(t) => self.broke(&t),
                }
                Err(SendError::permanent(e))
            }
            Err(e) => {
                self.broke(&e);
                Ok(())
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn epoch(
    cell: &AsyncEgressCell<Bytes>,
    js: &Context,
    config: &PublisherConfig,
    owner: &mut Option<u64>,
    counters: &Arc<Counters>,
    link: &mut watch::Receiver<Link>,
    kill: &Notify,
    stop: &mut watch::Receiver<bool>,
) -> End {
    let disconnects = link.borrow().disconnects;
    // A request written to a connection that died is never answered: the
    // read is bounded by the timeout and by the next disconnect.
    let last = tokio::select! {
        last = tokio::time::timeout(config.timeout, read_last(js, config, owner.is_none())) => last,
        () = disconnected(link, disconnects) => return End::Lost("disconnected".into()),
        _ = stop.changed() => return End::Stop,
    };
    let last = match last {
        Ok(Ok(last)) => last,
        Ok(Err(end)) => return end,
        Err(_) => return End::Lost("reading the last message timed out".into()),
    };
    let stored = last.as_ref().and_then(|l| l.stamp.as_ref()).map_or(0, |s| s.generation);
    let current = cell.generation().get_untracked().get();
    // A takeover's owner is the subject's only once its claim is stored.
    let mut claiming = None;
    let generation = match *owner {
        None => {
            // Take the stream over: the first generation of an owner above
            // every one stored, and above the cell's own.
            let Some(mine) = owner_of(stored).max(owner_of(current)).checked_add(1).filter(|o| *o < 1 << 32) else {
                return End::Fatal(PublisherError::Exhausted);
            };
            claiming = Some(mine);
            mine << 32
        }
        Some(mine) => {
            if owner_of(stored) > mine {
                return End::Fatal(PublisherError::Fenced { owner: mine, by: stored });
            }
            match current.max(stored).checked_add(1).filter(|g| owner_of(*g) == mine) {
                Some(g) => g,
                None => return End::Fatal(PublisherError::Exhausted),
            }
        }
    };
    let generation = Generation(generation);
    // Fences the previous epoch's attachment: what it had in flight goes
    // back to pending, to be replayed in this one.
    let _ = cell.reconnect(generation);
    tokio::select! {
        () = cell.generation_stored() => {}
        _ = stop.changed() => return End::Stop,
    }
    let incarnation = cell.incarnation().get();
    // What the stream holds of this producer's incarnation is delivered
    // (a claim of it: what it held when claimed).
    if let Some(stamp) = last.as_ref().and_then(|l| l.stamp.as_ref())
        && stamp.producer == config.producer
        && stamp.incarnation == incarnation
        && let Some(held) = if stamp.claim { stamp.sequence.checked_sub(1) } else { Some(stamp.sequence) }
    {
        match cell.ack(generation, Sequence(held)) {
            AckOutcome::Unsent { sent_through, .. } => {
                return End::Fatal(PublisherError::AheadOfCell { held, sent: sent_through });
            }
            AckOutcome::Unchanged { through: Some(acked) } if acked.get() > held => {
                tracing::warn!(
                    held,
                    acked = acked.get(),
                    "egress nats publisher: the stream holds less than it acknowledged (purged, or lost in a server crash)"
                );
            }
            _ => {}
        }
    }
    let acked = cell.acked_through().get_untracked();
    let mut first_expected = last.as_ref().map_or(0, |l| l.stream_sequence);
    if let Some(mine) = claiming {
        let claim = Stamp {
            producer: config.producer.clone(),
            incarnation,
            sequence: acked.map_or(0, |s| s.get().saturating_add(1)),
            generation: generation.get(),
            dead: None,
            claim: true,
        };
        let mut headers = claim.to_headers();
        headers.insert(async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, first_expected.to_string().as_str());
        let claimed = async {
            let ack = js.publish_with_headers(config.subject.clone(), headers, Bytes::new()).await?;
            ack.await
        };
        let claimed = tokio::select! {
            claimed = tokio::time::timeout(config.timeout, claimed) => claimed,
            () = disconnected(link, disconnects) => return End::Lost("disconnected".into()),
            _ = stop.changed() => return End::Stop,
        };
        match claimed {
            Ok(Ok(ack)) => {
                counters.claims.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    owner = mine,
                    stream_sequence = ack.sequence,
                    "egress nats publisher: took the subject over"
                );
                *owner = Some(mine);
                first_expected = ack.sequence;
            }
            // Another publisher wrote since the read: read again, and take
            // over above it.
            Ok(Err(e)) if e.kind() == PublishErrorKind::WrongLastSequence => return End::Resync,
            Ok(Err(e)) => return End::Lost(format!("claim: {e}")),
            Err(_) => return End::Lost("claim: timed out".into()),
        }
    }
    let mut completions = Completions::starting_at(acked.map_or(0, |s| s.get().saturating_add(1)));
    let (sent_tx, mut sent) = mpsc::unbounded_channel();
    let transport = NatsTransport {
        js: js.clone(),
        subject: config.subject.clone().into(),
        producer: config.producer.clone(),
        incarnation,
        first_expected,
        previous: None,
        placed: std::collections::BTreeSet::new(),
        sent: sent_tx,
        counters: counters.clone(),
        broken: false,
    };
    counters.epochs.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(generation = generation.get(), ?acked, "egress nats publisher: epoch");
    let attachment = cell.attach(transport);
    let mut acks = FuturesUnordered::new();
    let end = loop {
        tokio::select! {
            s = sent.recv() => match s {
                Some(Sent::Published { sequence, ack }) => acks.push(async move { (sequence, ack.await) }),
                Some(Sent::Broken(why)) => break End::Lost(format!("publish: {why}")),
                // The attachment is gone: the cell was disposed.
                None => break End::Stop,
            },
            Some((sequence, result)) = acks.next(), if !acks.is_empty() => match result {
                Ok(ack) if ack.duplicate => {
                    // A message of this id is stored, but not necessarily
                    // this publisher's (a stale owner of the same
                    // incarnation answered "duplicate" is not fenced by
                    // the expectation, which the server checks after the
                    // id): the next epoch's read decides, and a higher
                    // owner there fences.
                    counters.duplicates.fetch_add(1, Ordering::Relaxed);
                    break End::Resync;
                }
                Ok(_) => {
                    if let Some(through) = completions.complete(sequence.get()) {
                        let _ = attachment.ack(through);
                    }
                }
                Err(e) if matches!(e.kind(), PublishErrorKind::WrongLastSequence | PublishErrorKind::WrongLastMessageId) => {
                    break End::Resync;
                }
                Err(e) if never_storable(&e) => {
                    // Above the stream's own limits: never storable, a dead
                    // letter. What was pipelined behind it is refused by its
                    // fence; the next epoch puts its tombstone in its place.
                    counters.refused.fetch_add(1, Ordering::Relaxed);
                    let _ = attachment.fail(sequence, egress_core::FailureKind::Permanent);
                    break End::Resync;
                }
                Err(e) => break End::Lost(format!("publish acknowledgement: {e}")),
            },
            () = disconnected(link, disconnects) => break End::Lost("disconnected".into()),
            () = kill.notified() => break End::Lost("killed".into()),
            _ = stop.changed() => break End::Stop,
        }
    };
    drop(attachment);
    end
}
