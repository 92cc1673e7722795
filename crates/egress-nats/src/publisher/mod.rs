//! The publishing side: a JetStream transport for an [`AsyncEgressCell`]
//! and the supervisor that keeps it publishing (see the crate's docs).

mod config;
mod epoch;
mod transport;

pub use config::{Options, PublisherConfig, SpawnError};
use epoch::{Run, supervise};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use egress_codec::{Encode, Raw};
use egress_core::{DeadLetters, Sequence};
use egress_reactive::{AsyncEgressCell, Computed, ConnectionTracker, Threaded, Watch};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::Instrument as _;

#[cfg(doc)]
use crate::stamp::Stamp;

/// The owner part of a generation: its upper 32 bits. A publisher taking a
/// stream over starts at the first generation of an owner above every
/// generation stored on the subject; its reconnects count up within its
/// owner. A message of a higher owner on the subject fences it.
pub const fn owner_of(generation: u64) -> u64 {
    generation >> 32
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
    /// The client's connect options ([`PublisherConfig::options`]) cannot
    /// make a client (a TLS or credentials setting it refuses).
    #[error("the connect options are unusable: {0}")]
    Options(String),
    /// Its task panicked (in the application's connect options).
    #[error("the publisher panicked: {0}")]
    Panicked(String),
    /// The cell was disposed under it (its context dropped): nothing is
    /// left to publish.
    #[error("the cell was disposed")]
    CellDisposed,
}

/// Why an epoch ended, or why the publisher stopped: the error of its
/// [`ConnectionState`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LinkError {
    /// The connection or a request failed (a disconnect, a timeout, a
    /// publish the client refused): the next epoch replays what the stream
    /// does not hold.
    #[error("connection lost: {0}")]
    Lost(String),
    /// The stream refused an expectation (another writer came between), a
    /// publish was answered "duplicate", or a record can never be stored
    /// (its dead letter's tombstone goes in its place): the next epoch
    /// reads the subject again.
    #[error("resync: {0}")]
    Resync(String),
    /// It stopped on its own: see [`Publisher::failure`].
    #[error(transparent)]
    Fatal(PublisherError),
}

/// Where a [`Publisher`]'s connection is, for a UI: `Connecting` while the
/// client connects and an epoch starts, `Connected` once an epoch has
/// attached to the cell (the stream taken over, or resumed), `Reconnecting`
/// after an epoch ended (with its [`LinkError`]), `Stopped` at the end (see
/// [`Publisher::state`]).
pub type ConnectionState = egress_reactive::ConnectionState<LinkError>;

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
    state: ConnectionTracker<LinkError>,
    /// Keeps the cell, and with it the state's nodes, for as long as the
    /// publisher is kept.
    _cell: Box<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        if let Some(task) = &self.task
            && !task.is_finished()
        {
            task.abort();
            self.state.set(ConnectionState::Stopped { error: None });
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
        Publisher::spawn_typed(cell, Raw, url, config)
    }

    /// [`spawn`](Self::spawn) for a cell of any payload type: `codec` makes
    /// each record's bytes as it is published (the codec the WebSocket
    /// sender and the stores take). A record that does not encode (its
    /// codec refuses it, or panics on it) can never be stored: it becomes
    /// a dead letter, whose tombstone takes its place in the stream.
    ///
    /// # Errors
    /// Arguments no retry could make work: [`SpawnError`].
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn_typed<T: Clone + Send + Sync + 'static>(
        cell: AsyncEgressCell<T>,
        codec: impl Encode<T>,
        url: &str,
        config: PublisherConfig,
    ) -> Result<Publisher, SpawnError> {
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
        let state = ConnectionTracker::new(&cell, "egress nats publisher").map_err(|_| SpawnError::CellDisposed)?;
        let (stop, stop_rx) = watch::channel(false);
        let (stopped_tx, stopped) = watch::channel(false);
        let kill = Arc::new(Notify::new());
        let counters = Arc::new(Counters::default());
        let span = tracing::info_span!("egress_nats_publisher", producer = %config.producer, subject = %config.subject);
        let run = Run {
            cell: cell.clone(),
            codec: Arc::new(codec),
            config,
            kill: kill.clone(),
            counters: counters.clone(),
            state: state.clone(),
        };
        let task = tokio::spawn({
            let (counters, state, watched) = (counters.clone(), state.clone(), cell.clone());
            async move {
                // A cell disposed under the publisher (its context dropped)
                // makes its reads panic, as may a codec or the application's
                // connect options: the publisher stops, and says why,
                // rather than end with its state stale.
                let ended = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(supervise(
                    run, servers, stop_rx,
                )))
                .await;
                let error = if watched.is_disposed() {
                    // However the run ended (a read of the disposed cell
                    // panicked, or its attachment went with it and the
                    // epoch ended as stopped), the cause is said, not taken
                    // as a shutdown or a bug.
                    Some(PublisherError::CellDisposed)
                } else {
                    match ended {
                        Ok(error) => error,
                        Err(panic) => Some(PublisherError::Panicked(
                            egress_core::panic_message(&*panic).unwrap_or("a panic").to_owned(),
                        )),
                    }
                };
                if let Some(error) = &error {
                    *counters.failure.lock() = Some(error.clone());
                }
                state.set(ConnectionState::Stopped { error: error.map(LinkError::Fatal) });
                let _ = stopped_tx.send(true);
            }
            .instrument(span)
        });
        Ok(Publisher { task: Some(task), stop, kill, counters, stopped, state, _cell: Box::new(cell) })
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
