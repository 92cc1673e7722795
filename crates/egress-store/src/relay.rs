//! The relay: the one task that writes a durable cell's journal into its
//! store, and adopts what applications appended through the outbox.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use egress_codec::{Codec, Raw};
use egress_core::{AdoptOutcome, EgressCore, Epoch, Policy, Ready, Sequence};
use egress_reactive::{AsyncContext, AsyncEgressCell, CellFlavor, CellOptions, Effect, EgressCellOf, Threaded};
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::stored::{decode, decode_all, encode_all};
use crate::{SqliteStore, StoreError};

/// One stream's home, as a [`Relay`] uses it: the store's half of the
/// contract every store keeps the same way (a `Ready` as one transaction,
/// appends that continue the stored counter or a
/// [`StoreError::Conflict`], [`StoreError::Fenced`] once the stream is
/// another writer's). The relay's logic (group commit, reports to the cell,
/// rebase, adoption, backoff) is written once over it.
///
/// Implemented by [`SqliteJournal`] and, with the feature `postgres`, by
/// `postgres::PgJournal`.
pub trait JournalStore: Send + 'static {
    /// Writes one `Ready` of the stream (`appends` are the payloads of
    /// `ready.appends`, in order) as one transaction.
    fn apply(
        &mut self,
        ready: &Ready,
        appends: &[(Sequence, Bytes)],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Up to `limit` stored records of the stream from `from` on, in order.
    fn appended(
        &mut self,
        from: Sequence,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(Sequence, Bytes)>, StoreError>> + Send;

    /// Whether other writers may have appended since the last call (`true`
    /// the first time).
    fn changed(&mut self) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Called on every pass of the relay: keeps the stream this store's
    /// (a lease renewed when due); [`StoreError::Fenced`] or
    /// [`StoreError::Closed`] stops the relay.
    fn keep(&mut self) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { Ok(()) }
    }

    /// A future that completes when the store has news (a notification),
    /// if it can tell; the relay also polls.
    fn news(&self) -> impl Future<Output = ()> + Send + 'static {
        std::future::pending()
    }

    /// A clean close, after the relay's last commit.
    fn close(&mut self) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { Ok(()) }
    }

    /// The stream's name, for the relay's events.
    fn stream(&self) -> &str;
}

/// The [`Outbox`](crate::Outbox) appends this process opened on one stream
/// name: a relay of the stream watches closely for their commits, so that
/// an append is adopted within a millisecond or so of its commit rather
/// than at the next poll. SQLite cannot tell another connection of a
/// commit, and the application's transaction commits after the append
/// returns, so the relay polls the cheap `PRAGMA data_version` every
/// [`HOT_POLL`] for [`HOT_FOR`] after an append opened.
#[derive(Debug, Default)]
pub(crate) struct Appends {
    opened: Notify,
    last: Mutex<Option<std::time::Instant>>,
}

/// How often a relay looks for a commit while an append of its stream is
/// recent.
const HOT_POLL: Duration = Duration::from_millis(1);
/// How long after an append opened its relay looks that often.
const HOT_FOR: Duration = Duration::from_secs(1);

impl Appends {
    /// The entry of `stream`: one per stream name an outbox or relay of this
    /// process used (the bound is the application's streams).
    pub(crate) fn of(stream: &str) -> Arc<Appends> {
        static ALL: std::sync::LazyLock<Mutex<std::collections::HashMap<String, Arc<Appends>>>> =
            std::sync::LazyLock::new(Mutex::default);
        let mut all = ALL.lock();
        match all.get(stream) {
            Some(appends) => appends.clone(),
            None => all.entry(stream.to_owned()).or_default().clone(),
        }
    }

    /// An append opened: its relay watches closely for the commit.
    pub(crate) fn opened(&self) {
        *self.last.lock() = Some(std::time::Instant::now());
        self.opened.notify_waiters();
    }

    /// Completes at the next close look: after [`HOT_POLL`] while an append
    /// is recent, else once one opens.
    async fn news(self: Arc<Self>) {
        loop {
            let opened = self.opened.notified();
            tokio::pin!(opened);
            opened.as_mut().enable();
            if self.last.lock().is_some_and(|t| t.elapsed() < HOT_FOR) {
                tokio::time::sleep(HOT_POLL).await;
                return;
            }
            opened.await;
        }
    }
}

/// A [`SqliteStore`] and one of its streams, as a [`JournalStore`]: every
/// call runs on a blocking thread.
#[derive(Debug, Clone)]
pub struct SqliteJournal {
    store: Arc<Mutex<SqliteStore>>,
    stream: Arc<str>,
    appends: Arc<Appends>,
}

impl SqliteJournal {
    /// `stream` of `store` (a store that has [`load`](SqliteStore::load)ed
    /// it).
    pub fn new(store: SqliteStore, stream: impl Into<String>) -> Self {
        let stream: String = stream.into();
        SqliteJournal { store: Arc::new(Mutex::new(store)), appends: Appends::of(&stream), stream: stream.into() }
    }

    /// Runs `f` on the store on a blocking thread.
    async fn blocking<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut SqliteStore, &str) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let (store, stream) = (self.store.clone(), self.stream.clone());
        match tokio::task::spawn_blocking(move || f(&mut store.lock(), &stream)).await {
            Ok(result) => result,
            Err(e) => Err(StoreError::Task(e.to_string())),
        }
    }
}

impl JournalStore for SqliteJournal {
    async fn apply(&mut self, ready: &Ready, appends: &[(Sequence, Bytes)]) -> Result<(), StoreError> {
        let (ready, appends) = (ready.clone(), appends.to_vec());
        self.blocking(move |st, stream| st.apply(stream, &ready, &appends)).await
    }

    async fn appended(&mut self, from: Sequence, limit: usize) -> Result<Vec<(Sequence, Bytes)>, StoreError> {
        self.blocking(move |st, stream| st.appended(stream, from, limit)).await
    }

    async fn changed(&mut self) -> Result<bool, StoreError> {
        self.blocking(|st, _| st.changed()).await
    }

    fn news(&self) -> impl Future<Output = ()> + Send + 'static {
        self.appends.clone().news()
    }

    async fn close(&mut self) -> Result<(), StoreError> {
        self.blocking(|st, _| st.checkpoint()).await
    }

    fn stream(&self) -> &str {
        &self.stream
    }
}

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

/// What a relay has done.
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
/// shows the error and stops.
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
/// ([`StoreError::Undecodable`], with its sequence): nothing is lost, and
/// the stream opened with [`Raw`] shows its bytes. Of what the relay
/// writes, a record that does not encode fails its commit
/// ([`StoreError::Unencodable`], shown as the cell's `persist_error`) and
/// the relay tries again after its backoff: nothing of that commit (the
/// records grouped with it, before it too) and nothing after it is written
/// or sent, and the cell holds them all unwritten; there is no way to take
/// such a record out, so a codec whose `encode` can fail for a value the
/// application enqueues wants a check before the enqueue
/// ([`Encode::size`](egress_codec::Encode::size) is `None` for such a
/// value). A codec that panics counts as one that refused.
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
    let opened = tokio::task::spawn_blocking(move || {
        let mut store = SqliteStore::open(path)?;
        let loaded = store.load(&name)?;
        Ok::<_, StoreError>((store, loaded))
    })
    .await
    .map_err(|e| StoreError::Task(e.to_string()))?;
    let (store, loaded) = opened?;
    let loaded = loaded.decode(stream, &codec)?;
    let core = EgressCore::restore(policy, loaded.restored)?;
    let cell = AsyncEgressCell::from_core(cx, core, options.incarnation(loaded.incarnation));
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
    /// `codec` writes and reads back (see [`open_durable_with`]).
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
        let (stored, stored_ack) = watch::channel(cell.acked_through().get_untracked());
        let store = Arc::new(tokio::sync::Mutex::new(store));
        let written = Written { counters: counters.clone(), stored: Arc::new(stored), codec };
        let task = tokio::spawn(tracing::Instrument::instrument(
            run(cell.clone(), store, config, bell, stop_rx, written),
            span,
        ));
        Relay { task: Some(task), effect, stop, counters, stored_ack }
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

/// Where a relay's commits are told (its counters, and the stored
/// watermark), and how its records become bytes and back.
struct Written<T> {
    counters: Arc<Counters>,
    stored: Arc<watch::Sender<Option<Sequence>>>,
    codec: Arc<dyn Codec<T>>,
}

/// What one commit did, for the counters.
enum Committed {
    /// Written: this many records appended.
    Written(u64),
    /// Refused for another writer's appends; the cell's moved behind them.
    Rebased,
}

/// What a store's answer to one `Ready` means for the cell, reported to it
/// (`persisted`, or `persist_failed`): the one rule behind every store and
/// both relays ([`Relay`], [`SqliteStore::write_journal`]).
enum Reported {
    /// Written: this many records appended.
    Written(u64),
    /// Another writer's appends took the sequences from `from` on
    /// (`count` of them): read them and rebase the cell onto them.
    Conflict { from: Sequence, count: usize },
}

fn report<T: Clone + 'static, F: CellFlavor<T>>(
    cell: &EgressCellOf<T, F>,
    epoch: Epoch,
    result: Result<(), StoreError>,
    appended: usize,
) -> Result<Reported, StoreError> {
    match result {
        Ok(()) => {
            let _ = cell.persisted(epoch);
            Ok(Reported::Written(appended as u64))
        }
        // Answered once their records are read ([`conflict`]).
        Err(StoreError::Conflict { stored, expected, .. }) if stored > expected => Ok(Reported::Conflict {
            from: Sequence(expected),
            count: usize::try_from(stored - expected).unwrap_or(usize::MAX),
        }),
        Err(e) => {
            let _ = cell.persist_failed(epoch, e.to_string());
            Err(e)
        }
    }
}

/// Answers a `Ready` the store refused for another writer's appends,
/// `theirs` as read from the store: with them in hand, the cell's
/// unwritten records move behind them; when they cannot be read (the
/// store's error, or a record the codec cannot read), the cell shows that
/// error, not the conflict, and the relay tries again.
fn conflict<T: Clone + 'static, F: CellFlavor<T>>(
    cell: &EgressCellOf<T, F>,
    epoch: Epoch,
    theirs: Result<Vec<(Sequence, Bytes)>, StoreError>,
    codec: &dyn Codec<T>,
    stream: &str,
) -> Result<Committed, StoreError> {
    match theirs.and_then(|rows| decode_all(codec, stream, rows)) {
        Ok(theirs) => {
            let _ = cell.persist_failed(epoch, "appended by another writer meanwhile");
            Ok(rebase(cell, theirs))
        }
        Err(e) => {
            let _ = cell.persist_failed(epoch, e.to_string());
            Err(e)
        }
    }
}

/// Moves the cell's unwritten records behind `theirs` (another writer's).
fn rebase<T: Clone + 'static, F: CellFlavor<T>>(cell: &EgressCellOf<T, F>, theirs: Vec<(Sequence, T)>) -> Committed {
    let outcome = cell.rebase(theirs);
    tracing::info!(?outcome, "egress relay: the cell's appends moved behind the outbox's");
    Committed::Rebased
}

impl SqliteStore {
    /// Writes everything `cell`'s journal holds for `stream`, one
    /// transaction per `Ready`, on the calling thread: the relay of a
    /// synchronous cell (a UI thread that owns its connection calls it from
    /// its loop, after enqueues and acks). Returns how many records were
    /// appended. The cell must be over a core restored from this store's
    /// `stream` ([`load`](Self::load)).
    ///
    /// # Errors
    /// The first commit that failed (shown by the cell's `persist_error`;
    /// call again to retry).
    pub fn write_journal<F: CellFlavor<Bytes>>(
        &mut self,
        cell: &EgressCellOf<Bytes, F>,
        stream: &str,
    ) -> Result<u64, StoreError> {
        self.write_journal_with(cell, stream, &Raw)
    }

    /// [`write_journal`](Self::write_journal) for a cell of `T`, whose
    /// records `codec` writes and reads back (see [`open_durable_with`];
    /// restore the cell from [`Loaded::decode`](crate::Loaded::decode)).
    ///
    /// # Errors
    /// [`write_journal`](Self::write_journal)'s, and
    /// [`StoreError::Unencodable`] or [`StoreError::Undecodable`] for a
    /// record `codec` refuses (nothing of that `Ready` is written).
    pub fn write_journal_with<T: Clone + 'static, F: CellFlavor<T>>(
        &mut self,
        cell: &EgressCellOf<T, F>,
        stream: &str,
        codec: &dyn Codec<T>,
    ) -> Result<u64, StoreError> {
        let mut written = 0;
        while let Some((ready, appends)) = cell.poll_ready() {
            let (result, count) = match encode_all(codec, stream, &appends) {
                Ok(bytes) => (self.apply(stream, &ready, &bytes), bytes.len()),
                Err(e) => (Err(e), 0),
            };
            match report(cell, ready.epoch, result, count)? {
                Reported::Written(n) => written += n,
                Reported::Conflict { from, count } => {
                    let theirs = self.appended(stream, from, count);
                    conflict(cell, ready.epoch, theirs, codec, stream)?;
                }
            }
        }
        Ok(written)
    }
}

/// Writes one `Ready` into the store and reports it to the cell, in a task
/// of its own: a relay aborted while the store works (dropped) does not
/// stop the commit from being reported, so the cell never waits for a
/// `Ready` no one will answer.
async fn commit<S: JournalStore, T: Clone + Send + Sync + 'static>(
    store: Arc<tokio::sync::Mutex<S>>,
    cell: AsyncEgressCell<T>,
    ready: Ready,
    appends: Vec<(Sequence, T)>,
    stored: Arc<watch::Sender<Option<Sequence>>>,
    codec: Arc<dyn Codec<T>>,
) -> Result<Committed, StoreError> {
    let mut store = store.lock().await;
    let (result, count) = match encode_all(&*codec, store.stream(), &appends) {
        Ok(bytes) => (store.apply(&ready, &bytes).await, bytes.len()),
        Err(e) => (Err(e), 0),
    };
    let wrote = result.is_ok();
    let reported = report(&cell, ready.epoch, result, count);
    if wrote && let Some(acked) = ready.acked_through {
        stored.send_if_modified(|s| {
            let raised = s.is_none_or(|s| acked > s);
            if raised {
                *s = Some(acked);
            }
            raised
        });
    }
    match reported? {
        Reported::Written(n) => Ok(Committed::Written(n)),
        Reported::Conflict { from, count } => {
            let theirs = store.appended(from, count).await;
            conflict(&cell, ready.epoch, theirs, &*codec, store.stream())
        }
    }
}

/// Commits one `Ready` if the journal has one. Returns whether it did
/// anything, and the error if the commit failed.
async fn write_once<S: JournalStore, T: Clone + Send + Sync + 'static>(
    cell: &AsyncEgressCell<T>,
    store: &Arc<tokio::sync::Mutex<S>>,
    written: &Written<T>,
) -> Option<Result<(), StoreError>> {
    let (ready, appends) = cell.poll_ready()?;
    let epoch = ready.epoch;
    let counters = &written.counters;
    let started = std::time::Instant::now();
    let (stored, codec) = (written.stored.clone(), written.codec.clone());
    let task = tokio::spawn(commit(store.clone(), cell.clone(), ready, appends, stored, codec));
    let result = match task.await {
        Ok(Ok(Committed::Written(n))) => {
            counters.commits.fetch_add(1, Ordering::Relaxed);
            counters.appended.fetch_add(n, Ordering::Relaxed);
            tracing::event!(
                target: "egress::metrics",
                tracing::Level::DEBUG,
                monotonic_counter.egress_relay_commits = 1u64,
                monotonic_counter.egress_relay_appended = n,
                histogram.egress_relay_commit_seconds = started.elapsed().as_secs_f64(),
                "egress relay: committed"
            );
            Ok(())
        }
        Ok(Ok(Committed::Rebased)) => {
            counters.rebases.fetch_add(1, Ordering::Relaxed);
            tracing::event!(target: "egress::metrics", tracing::Level::DEBUG, monotonic_counter.egress_relay_rebases = 1u64, "egress relay: rebased");
            Ok(())
        }
        Ok(Err(e)) => Err(e),
        // The commit's task ended without answering the `Ready` (a panic
        // under the store): answered here, so that the cell shows it and
        // offers the `Ready` again rather than wait for an answer that
        // never comes. (An answer given already makes this one stale.)
        Err(e) => {
            let e = StoreError::Task(e.to_string());
            let _ = cell.persist_failed(epoch, e.to_string());
            Err(e)
        }
    };
    if let Err(StoreError::Undecodable { .. }) = &result {
        counters.undecodable.fetch_add(1, Ordering::Relaxed);
    }
    if let Err(e) = &result {
        tracing::warn!(error = %e, "egress relay: a commit failed");
        tracing::event!(target: "egress::metrics", tracing::Level::DEBUG, monotonic_counter.egress_relay_failures = 1u64, "egress relay: a commit failed");
        counters.failures.fetch_add(1, Ordering::Relaxed);
    }
    Some(result)
}

/// Adopts what applications appended; returns whether a full batch came
/// (there may be more).
async fn adopt<S: JournalStore, T: Clone + Send + Sync + 'static>(
    cell: &AsyncEgressCell<T>,
    store: &tokio::sync::Mutex<S>,
    batch: usize,
    force: bool,
    written: &Written<T>,
) -> Result<bool, StoreError> {
    let counters = &written.counters;
    if cell.unpersisted_len().get_untracked() != 0 {
        return Ok(false);
    }
    let from = cell.next_sequence();
    let (rows, stream) = {
        let mut store = store.lock().await;
        let rows = if store.changed().await? || force { store.appended(from, batch).await? } else { Vec::new() };
        (rows, store.stream().to_owned())
    };
    let mut more = rows.len() == batch;
    let mut adopted = 0u64;
    for (sequence, bytes) in rows {
        // A record the codec cannot read stops adoption there, as a record
        // out of order does: the records after it wait, nothing is lost.
        let payload = match decode(&*written.codec, &stream, sequence, &bytes) {
            Ok(payload) => payload,
            Err(e) => {
                tracing::warn!(error = %e, "egress relay: adoption stopped at a record its codec cannot read");
                counters.undecodable.fetch_add(1, Ordering::Relaxed);
                more = false;
                break;
            }
        };
        match cell.adopt(sequence, payload) {
            AdoptOutcome::Adopted { .. } => adopted += 1,
            AdoptOutcome::Unwritten { .. } => {
                more = false;
                break;
            }
            other => {
                tracing::warn!(?other, "egress relay: adoption stopped at a record out of order");
                counters.adoption_stalls.fetch_add(1, Ordering::Relaxed);
                more = false;
                break;
            }
        }
    }
    if adopted > 0 {
        counters.adopted.fetch_add(adopted, Ordering::Relaxed);
        tracing::event!(
            target: "egress::metrics",
            tracing::Level::DEBUG,
            monotonic_counter.egress_relay_adopted = adopted,
            "egress relay: adopted"
        );
    }
    Ok(more)
}

/// Stops the relay for a fenced store: another writer has the stream.
fn fenced(counters: &Counters) {
    tracing::error!("egress relay: another store took the stream over; stopping");
    tracing::event!(target: "egress::metrics", tracing::Level::DEBUG, monotonic_counter.egress_relay_fenced = 1u64, "egress relay: fenced");
    counters.fenced.store(true, Ordering::Relaxed);
}

async fn run<S: JournalStore, T: Clone + Send + Sync + 'static>(
    cell: AsyncEgressCell<T>,
    store: Arc<tokio::sync::Mutex<S>>,
    config: RelayConfig,
    bell: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
    written: Written<T>,
) {
    let counters = written.counters.clone();
    let mut failures: u32 = 0;
    let mut more = true;
    loop {
        let rung = bell.notified();
        tokio::pin!(rung);
        rung.as_mut().enable();
        if *stop.borrow() {
            while let Some(Ok(())) = write_once(&cell, &store, &written).await {}
            let _ = store.lock().await.close().await;
            return;
        }
        if let Err(StoreError::Fenced { .. } | StoreError::Closed) = store.lock().await.keep().await {
            fenced(&counters);
            return;
        }
        match write_once(&cell, &store, &written).await {
            Some(Ok(())) => {
                failures = 0;
                continue;
            }
            Some(Err(StoreError::Fenced { .. } | StoreError::Closed)) => {
                fenced(&counters);
                return;
            }
            Some(Err(_)) => {
                let wait = backoff(&config, failures);
                failures = failures.saturating_add(1);
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
            None => {}
        }
        match adopt(&cell, &store, config.adopt_batch.max(1), more, &written).await {
            Ok(full) => {
                more = full;
                if full {
                    continue;
                }
            }
            Err(e) => tracing::warn!(error = %e, "egress relay: reading the outbox failed"),
        }
        let news = store.lock().await.news();
        tokio::select! {
            () = &mut rung => {}
            () = news => {}
            () = tokio::time::sleep(config.poll_interval) => {}
            _ = stop.changed() => {}
        }
    }
}

/// `retry_base * 2^failures`, capped at `retry_max`.
fn backoff(config: &RelayConfig, failures: u32) -> Duration {
    config.retry_base.saturating_mul(1u32 << failures.min(20)).min(config.retry_max)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{Appends, HOT_FOR};

    #[tokio::test(flavor = "current_thread")]
    async fn news_waits_for_an_append_then_looks_every_millisecond_while_it_is_recent() {
        let appends = Arc::new(Appends::default());
        // Nothing opened: no news, however long (here 50 ms).
        let quiet = tokio::time::timeout(Duration::from_millis(50), appends.clone().news()).await;
        assert!(quiet.is_err(), "no append, no news");
        // An append opens while the relay waits: news, within a moment.
        let waiting = tokio::spawn(appends.clone().news());
        tokio::task::yield_now().await;
        appends.opened();
        tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("news after an append").expect("joined");
        // Recent: every look is news after a millisecond.
        for _ in 0..3 {
            tokio::time::timeout(Duration::from_secs(10), appends.clone().news()).await.expect("a close look");
        }
        // Long past: quiet again.
        *appends.last.lock() = Some(std::time::Instant::now() - HOT_FOR - Duration::from_millis(1));
        let quiet = tokio::time::timeout(Duration::from_millis(50), appends.clone().news()).await;
        assert!(quiet.is_err(), "an old append is no news");
        // One entry per stream name.
        assert!(Arc::ptr_eq(&Appends::of("s"), &Appends::of("s")));
        assert!(!Arc::ptr_eq(&Appends::of("s"), &Appends::of("t")));
    }
}
