//! The relay: the one task that writes a durable cell's journal into its
//! store, and adopts what applications appended through the outbox.

mod journal;
mod lanes;
mod latest;
mod link;
mod report;
mod task;

pub(crate) use journal::Appends;
pub use journal::{JournalStore, SqliteJournal};
pub use lanes::{DurableLanes, LanesJournal, LanesRelay, SqliteLanes, open_durable_lanes, open_durable_lanes_raw};
pub use latest::{DurableLatest, LatestJournal, LatestRelay, SqliteLatest, open_durable_latest};
use report::Written;
use task::run;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use egress_codec::{Codec, Raw};
use egress_core::{EgressCore, Policy, Sequence};
use egress_reactive::{AsyncContext, AsyncEgressCell, CellOptions, Effect, Threaded};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::{SqliteStore, StoreError};

/// How a [`Relay`] writes and polls.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// How often to look for records appended through the
    /// [`Outbox`](crate::Outbox) by other connections (a cheap
    /// `PRAGMA data_version`).
    pub poll_interval: Duration,
    /// The first wait after a failed commit; it doubles per failure in a
    /// row...
    pub retry_base: Duration,
    /// ...up to this.
    pub retry_max: Duration,
    /// At most this many records adopted per read.
    pub adopt_batch: usize,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            poll_interval: Duration::from_millis(20),
            retry_base: Duration::from_millis(20),
            retry_max: Duration::from_secs(2),
            adopt_batch: 1024,
        }
    }
}

/// What a relay has done. Each commit, rebase and failed write (a fence
/// included) is counted before the cell is told of it, so whoever sees the
/// cell's state (its records written, or its `persist_error`) sees the
/// count that made it. (A payload whose `Clone` panics as the relay takes
/// a `Ready` is caught by the cell, which shows it first; the relay counts
/// it as a failure after.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Transactions committed (one per `Ready`).
    pub commits: u64,
    /// Records appended by those commits.
    pub appended: u64,
    /// Commits that failed (each retried after a backoff).
    pub failures: u64,
    /// Records adopted from the outbox.
    pub adopted: u64,
    /// Times the cell's own appends met an application's outbox appends
    /// and moved behind them (see `EgressCore::rebase`).
    pub rebases: u64,
    /// Times adoption stopped at a record out of order (a gap another
    /// writer left in the stream): the records after it wait.
    pub adoption_stalls: u64,
    /// Times a record the relay's codec cannot read (appended with another
    /// encoding) stopped it: adoption stops there (it and the records after
    /// it wait), and a commit that must move the cell's records behind it
    /// fails (shown by the cell, tried again).
    pub undecodable: u64,
    /// Whether the relay stopped because the stream is not its store's any
    /// more: another store took it over, or the store's connection is gone
    /// for good (its lease runs out, and another worker takes it).
    pub fenced: bool,
}

#[derive(Default)]
struct Counters {
    commits: AtomicU64,
    appended: AtomicU64,
    failures: AtomicU64,
    adopted: AtomicU64,
    rebases: AtomicU64,
    adoption_stalls: AtomicU64,
    undecodable: AtomicU64,
    fenced: std::sync::atomic::AtomicBool,
}

impl Counters {
    /// A commit of `appended` records that `took` so long, counted before the cell is told, so
    /// that whoever sees the cell's state sees the count.
    fn committed(&self, appended: u64, took: Duration) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.appended.fetch_add(appended, Ordering::Relaxed);
        tracing::event!(
            target: "egress::metrics",
            tracing::Level::DEBUG,
            monotonic_counter.egress_relay_commits = 1u64,
            monotonic_counter.egress_relay_appended = appended,
            histogram.egress_relay_commit_seconds = took.as_secs_f64(),
            "egress relay: committed"
        );
    }

    /// A cell's appends moved behind an application's, counted before the
    /// cell is told.
    fn rebased(&self) {
        self.rebases.fetch_add(1, Ordering::Relaxed);
        tracing::event!(target: "egress::metrics", tracing::Level::DEBUG, monotonic_counter.egress_relay_rebases = 1u64, "egress relay: rebased");
    }

    /// A commit that failed with `error`, counted before the cell shows it
    /// (a fence sets `fenced` here too; the relay stops after).
    fn failed(&self, error: &StoreError) {
        if matches!(error, StoreError::Fenced { .. } | StoreError::Closed) {
            self.fenced.store(true, Ordering::Relaxed);
        }
        tracing::warn!(%error, "egress relay: a commit failed");
        tracing::event!(target: "egress::metrics", tracing::Level::DEBUG, monotonic_counter.egress_relay_failures = 1u64, "egress relay: a commit failed");
        if let StoreError::Undecodable { .. } = error {
            self.undecodable.fetch_add(1, Ordering::Relaxed);
        }
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> RelayStats {
        RelayStats {
            commits: self.commits.load(Ordering::Relaxed),
            appended: self.appended.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            adopted: self.adopted.load(Ordering::Relaxed),
            rebases: self.rebases.load(Ordering::Relaxed),
            adoption_stalls: self.adoption_stalls.load(Ordering::Relaxed),
            undecodable: self.undecodable.load(Ordering::Relaxed),
            fenced: self.fenced.load(Ordering::Relaxed),
        }
    }
}

/// One commit's counting, done in its task: each outcome counted once,
/// before the cell is told, and `told` set then, so that a panic after it
/// (an effect the cell's answer ran) is not counted again as a failure.
struct Tally {
    counters: Arc<Counters>,
    started: std::time::Instant,
    told: Arc<std::sync::atomic::AtomicBool>,
}

impl Tally {
    fn committed(&self, appended: u64) {
        self.counters.committed(appended, self.started.elapsed());
        self.told.store(true, Ordering::Relaxed);
    }

    fn rebased(&self) {
        self.counters.rebased();
        self.told.store(true, Ordering::Relaxed);
    }

    fn failed(&self, error: &StoreError) {
        self.counters.failed(error);
        self.told.store(true, Ordering::Relaxed);
    }
}

/// Runs one commit (`commit`, given its tally) in a task of its own, in the
/// relay's span: a relay aborted while the store works does not leave the
/// commit unreported. A task that ends without telling the cell (a panic
/// under the store) is a failure, counted, and answered with `answer`
/// (the cell shows it and offers the write again); one that panics after
/// the cell was told (an effect its answer ran) was counted already. The
/// one rule of both relays (task.rs, link.rs).
async fn commit_in_task<F>(
    counters: &Arc<Counters>,
    commit: impl FnOnce(Tally) -> F,
    answer: impl FnOnce(String),
) -> Result<(), StoreError>
where
    F: Future<Output = Result<(), StoreError>> + Send + 'static,
{
    let told = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tally = Tally { counters: counters.clone(), started: std::time::Instant::now(), told: told.clone() };
    match tokio::spawn(tracing::Instrument::in_current_span(commit(tally))).await {
        Ok(result) => result,
        Err(e) if told.load(Ordering::Relaxed) => {
            tracing::warn!(error = %e, "egress relay: the commit's task panicked after the cell was told");
            Err(StoreError::Task(e.to_string()))
        }
        Err(e) => {
            let e = StoreError::Task(e.to_string());
            counters.failed(&e);
            answer(e.to_string());
            Err(e)
        }
    }
}

/// The task that makes a cell's records durable: whenever the cell's
/// journal has something to write (records enqueued, a new generation, an
/// acknowledgement, a dead letter), it takes one
/// [`Ready`](egress_core::Ready), commits it as one transaction (SQLite's
/// on a blocking thread), and reports it to the cell ([`persisted`], which makes
/// the records claimable, or [`persist_failed`], which shows the error;
/// the write is retried after a backoff). Everything enqueued while a
/// commit runs goes into the next one: group commit. It also polls the
/// database for records applications appended through the
/// [`Outbox`](crate::Outbox), and adopts them in order.
///
/// When the cell's own appends meet records an application appended
/// through the outbox under the same sequences, the store refuses them
/// whole; the relay then takes the application's records and moves the
/// cell's (never written, never sent) behind them
/// ([`rebase`](egress_reactive::EgressCellOf::rebase)). When another store
/// takes the stream over ([`SqliteStore::load`] elsewhere), the relay
/// shows the error (at once if a write was refused, else at the cell's
/// next record, which stays unwritten) and stops.
///
/// The relay reads the cell's core, never its readers: an application
/// that drops its context first (the readers with it) leaves the relay
/// adopting and writing until it is shut down or dropped.
///
/// Each commit runs in a task of its own that reports it to the cell, so
/// dropping the relay (which aborts its task) never leaves a commit
/// unreported. [`shutdown`](Self::shutdown) writes what is pending first.
///
/// [`persisted`]: egress_reactive::EgressCellOf::persisted
/// [`persist_failed`]: egress_reactive::EgressCellOf::persist_failed
pub struct Relay {
    task: Option<JoinHandle<()>>,
    effect: Effect<Threaded>,
    stop: watch::Sender<bool>,
    counters: Arc<Counters>,
    stored_ack: watch::Receiver<Option<Sequence>>,
    lease: Option<watch::Receiver<Option<tokio::time::Instant>>>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.effect.dispose();
    }
}

/// A durable cell and the relay that writes it: a cell of bytes from
/// [`open_durable`], of `T` from [`open_durable_with`] and a [`Codec`].
#[derive(Debug)]
pub struct Durable<T: Clone + Send + Sync + 'static = Bytes> {
    /// The cell: enqueue here, attach a transport (or spawn a sender) here.
    pub cell: AsyncEgressCell<T>,
    /// Its relay.
    pub relay: Relay,
}

/// Opens the store at `path`, restores `stream` from it and starts its
/// relay: the cell continues the stream's incarnation, generation and
/// sequences, with every record not yet acknowledged pending again (in
/// order, nothing in flight, no backoff carried over). The open and the
/// load run on a blocking thread, once, so the runtime's threads go on.
///
/// # Errors
/// The store's ([`SqliteStore::open`], [`SqliteStore::load`]), or stored
/// data that breaks the core's rules ([`StoreError::Restore`]).
///
/// # Panics
/// Outside a tokio runtime.
pub async fn open_durable(
    cx: &AsyncContext,
    path: impl AsRef<Path>,
    stream: &str,
    policy: Policy,
    options: CellOptions,
    config: RelayConfig,
) -> Result<Durable, StoreError> {
    open_durable_with(cx, path, stream, Raw, policy, options, config).await
}

/// [`open_durable`] for a cell of `T`: `codec` makes the stored bytes of
/// what the cell holds, and reads the stored records back as `T`s (those
/// restored here, and those applications append through the
/// [`Outbox`](crate::Outbox), with
/// [`append_encoded`](crate::Outbox::append_encoded) and the same codec).
/// The cell, its readers and a UI over them hold the typed messages; give
/// a sender the same codec (`egress_ws::Sender::spawn_typed`).
///
/// A stored record that does not decode refuses the open
/// ([`StoreError::Undecodable`], with its sequence): nothing is lost, the
/// stream is not taken over (a process holding it goes on), and the stream
/// opened with [`Raw`] shows its bytes. A value the codec cannot encode is
/// refused by the cell's `try_enqueue` (`Refused::Unencodable`: the relay
/// installs its codec's check). Through plain `enqueue`, such a record
/// fails its commit ([`StoreError::Unencodable`], shown as the cell's
/// `persist_error`) and the relay tries again after its backoff: nothing
/// of that commit (the records grouped with it, before it too) and nothing
/// after it is written or sent, and the cell holds them all unwritten;
/// there is no way to take such a record out, so enqueue through
/// `try_enqueue` when the codec can refuse. A codec that panics counts as
/// one that refused.
///
/// # Errors
/// [`open_durable`]'s, and [`StoreError::Undecodable`].
///
/// # Panics
/// Outside a tokio runtime.
pub async fn open_durable_with<T: Clone + Send + Sync + 'static>(
    cx: &AsyncContext,
    path: impl AsRef<Path>,
    stream: &str,
    codec: impl Codec<T>,
    policy: Policy,
    options: CellOptions,
    config: RelayConfig,
) -> Result<Durable<T>, StoreError> {
    let (path, name) = (path.as_ref().to_owned(), stream.to_owned());
    // Read, decoded and restored in the store's transaction: the stream is
    // taken over only once it restores (an open that cannot changes
    // nothing, and fences no process that holds the stream).
    let opened = tokio::task::spawn_blocking(move || {
        let restored = SqliteStore::open(path).and_then(|mut store| {
            let restored = store.load_then(&name, |loaded| {
                let loaded = loaded.decode(&name, &codec)?;
                Ok((loaded.incarnation, EgressCore::restore(policy, loaded.restored)?))
            })?;
            Ok((store, restored))
        });
        (codec, restored)
    })
    .await
    .map_err(|e| StoreError::Task(e.to_string()))?;
    let (codec, restored) = opened;
    let (store, (incarnation, core)) = restored?;
    let cell = AsyncEgressCell::from_core(cx, core, options.incarnation(incarnation));
    let relay = Relay::spawn_with(cx, &cell, SqliteJournal::new(store, stream), codec, config);
    Ok(Durable { cell, relay })
}

impl Relay {
    /// Starts the relay of `cell` (a cell over a core restored from
    /// `store`'s `stream`) on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn(
        cx: &AsyncContext,
        cell: &AsyncEgressCell<Bytes>,
        store: SqliteStore,
        stream: impl Into<String>,
        config: RelayConfig,
    ) -> Relay {
        Relay::spawn_on(cx, cell, SqliteJournal::new(store, stream), config)
    }

    /// Starts the relay of `cell` (a cell over a core restored from
    /// `store`'s stream) over any [`JournalStore`], on the current tokio
    /// runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn_on<S: JournalStore>(
        cx: &AsyncContext,
        cell: &AsyncEgressCell<Bytes>,
        store: S,
        config: RelayConfig,
    ) -> Relay {
        Relay::spawn_with(cx, cell, store, Raw, config)
    }

    /// [`spawn_on`](Self::spawn_on) for a cell of `T`, whose records
    /// `codec` writes and reads back (see [`open_durable_with`]). Installs
    /// `codec`'s check on the cell
    /// ([`set_encode_check`](egress_reactive::EgressCellOf::set_encode_check)):
    /// its `try_enqueue` refuses a value `codec` cannot write.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn_with<T: Clone + Send + Sync + 'static, S: JournalStore>(
        cx: &AsyncContext,
        cell: &AsyncEgressCell<T>,
        store: S,
        codec: impl Codec<T>,
        config: RelayConfig,
    ) -> Relay {
        let codec: Arc<dyn Codec<T>> = Arc::new(codec);
        cell.set_encode_check(Some(crate::stored::encode_check(codec.clone())));
        let bell = Arc::new(Notify::new());
        // Whatever the journal may have to write moves one of these.
        let effect = cx.effect({
            let bell = bell.clone();
            let watched = (
                cell.unpersisted_len().clone(),
                cell.generation().clone(),
                cell.acked_through().clone(),
                cell.exhausted_len().clone(),
                cell.pending_len().clone(),
            );
            move || {
                let _ = watched.0.try_get();
                let _ = watched.1.try_get();
                let _ = watched.2.try_get();
                let _ = watched.3.try_get();
                let _ = watched.4.try_get();
                bell.notify_one();
            }
        });
        let (stop, stop_rx) = watch::channel(false);
        let counters = Arc::new(Counters::default());
        let span = tracing::info_span!("egress_relay", stream = store.stream());
        let (stored, stored_ack) = watch::channel(cell.with_core(|c| c.acked_through()));
        let lease = store.lease();
        let store = Arc::new(tokio::sync::Mutex::new(store));
        let written = Written { counters: counters.clone(), stored: Arc::new(stored), codec };
        let task = tokio::spawn(tracing::Instrument::instrument(
            run(cell.clone(), store, config, bell, stop_rx, written),
            span,
        ));
        Relay { task: Some(task), effect, stop, counters, stored_ack, lease }
    }

    /// The stream's acknowledgement watermark as the store holds it: what
    /// the cell was restored with, then raised by every commit that wrote
    /// a higher one. A new owner of the stream (after this process dies)
    /// starts above it, so every record past it that was handed on may be
    /// handed on again; a dispatcher bounds that
    /// (`egress_dispatch::Dispatcher::spawn_bounded`).
    pub fn stored_ack(&self) -> watch::Receiver<Option<Sequence>> {
        self.stored_ack.clone()
    }

    /// Until when the stream surely stays this relay's, for a store that
    /// holds it by a lease (see [`JournalStore::lease`]); a dispatcher
    /// gated on it (`egress_dispatch::StoredAck::with_lease`) starts no
    /// handler that could run past it. `None` for a store without leases.
    pub fn lease(&self) -> Option<watch::Receiver<Option<tokio::time::Instant>>> {
        self.lease.clone()
    }

    /// What it has done so far.
    pub fn stats(&self) -> RelayStats {
        self.counters.snapshot()
    }

    /// Writes what the journal holds, closes the store (a checkpoint of
    /// SQLite's WAL), and stops; returns the stats.
    pub async fn shutdown(mut self) -> RelayStats {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.counters.snapshot()
    }
}
