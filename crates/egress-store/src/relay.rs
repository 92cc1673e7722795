//! The relay: the one task that writes a durable cell's journal into its
//! store, and adopts what applications appended through the outbox.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use egress_core::{AdoptOutcome, EgressCore, Policy, Ready, Sequence};
use egress_reactive::{AsyncContext, AsyncEgressCell, CellFlavor, CellOptions, Effect, EgressCellOf, Threaded};
use parking_lot::Mutex;
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
    /// Whether the relay stopped because another store took the stream
    /// over.
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
            fenced: self.fenced.load(Ordering::Relaxed),
        }
    }
}

/// The task that makes a cell's records durable: whenever the cell's
/// journal has something to write (records enqueued, a new generation, an
/// acknowledgement, a dead letter), it takes one
/// [`Ready`](egress_core::Ready), commits it as one transaction on a
/// blocking thread, and reports it to the cell ([`persisted`], which makes
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
/// Each commit is reported to the cell by the blocking thread that made
/// it, so dropping the relay (which aborts its task) never leaves a commit
/// unreported. [`shutdown`](Self::shutdown) writes what is pending first.
///
/// [`persisted`]: egress_reactive::EgressCellOf::persisted
/// [`persist_failed`]: egress_reactive::EgressCellOf::persist_failed
pub struct Relay {
    task: Option<JoinHandle<()>>,
    effect: Effect<Threaded>,
    stop: watch::Sender<bool>,
    counters: Arc<Counters>,
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

/// A durable cell and the relay that writes it.
#[derive(Debug)]
pub struct Durable {
    /// The cell: enqueue here, attach a transport (or spawn a sender) here.
    pub cell: AsyncEgressCell<Bytes>,
    /// Its relay.
    pub relay: Relay,
}

/// Opens the store at `path`, restores `stream` from it and starts its
/// relay: the cell continues the stream's incarnation, generation and
/// sequences, with every record not yet acknowledged pending again (in
/// order, nothing in flight, no backoff carried over). The load runs on the
/// calling thread, once.
///
/// # Errors
/// The store's ([`SqliteStore::open`], [`SqliteStore::load`]), or stored
/// data that breaks the core's rules ([`StoreError::Restore`]).
///
/// # Panics
/// Outside a tokio runtime.
pub fn open_durable(
    cx: &AsyncContext,
    path: impl AsRef<Path>,
    stream: &str,
    policy: Policy,
    options: CellOptions,
    config: RelayConfig,
) -> Result<Durable, StoreError> {
    let mut store = SqliteStore::open(path)?;
    let loaded = store.load(stream)?;
    let core = EgressCore::restore(policy, loaded.restored)?;
    let cell = AsyncEgressCell::from_core(cx, core, options.incarnation(loaded.incarnation));
    let relay = Relay::spawn(cx, &cell, store, stream, config);
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
        let store = Arc::new(Mutex::new(store));
        let task = tokio::spawn(run(cell.clone(), store, stream.into(), config, bell, stop_rx, counters.clone()));
        Relay { task: Some(task), effect, stop, counters }
    }

    /// What it has done so far.
    pub fn stats(&self) -> RelayStats {
        self.counters.snapshot()
    }

    /// Writes what the journal holds, checkpoints the database, and stops;
    /// returns the stats.
    pub async fn shutdown(mut self) -> RelayStats {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.counters.snapshot()
    }
}

/// Runs `f` on the store on a blocking thread.
async fn blocking<R: Send + 'static>(
    store: &Arc<Mutex<SqliteStore>>,
    f: impl FnOnce(&mut SqliteStore) -> Result<R, StoreError> + Send + 'static,
) -> Result<R, StoreError> {
    let store = store.clone();
    match tokio::task::spawn_blocking(move || f(&mut store.lock())).await {
        Ok(result) => result,
        Err(e) => Err(StoreError::Task(e.to_string())),
    }
}

/// What one commit did, for the counters.
enum Committed {
    /// Written: this many records appended.
    Written(u64),
    /// Refused for another writer's appends; the cell's moved behind them.
    Rebased,
}

/// Writes one `Ready` of `cell`'s journal into `store` and reports it to the
/// cell: `persisted`, or `persist_failed` (and, when another writer's
/// appends took the sequences, a `rebase` onto them). The one
/// implementation behind the [`Relay`] and [`SqliteStore::write_journal`].
fn commit<F: CellFlavor<Bytes>>(
    cell: &EgressCellOf<Bytes, F>,
    store: &mut SqliteStore,
    stream: &str,
    ready: &Ready,
    appends: &[(Sequence, Bytes)],
) -> Result<Committed, StoreError> {
    let epoch = ready.epoch;
    match store.apply(stream, ready, appends) {
        Ok(()) => {
            let _ = cell.persisted(epoch);
            Ok(Committed::Written(appends.len() as u64))
        }
        Err(StoreError::Conflict { stored, expected, .. }) if stored > expected => {
            let _ = cell.persist_failed(epoch, "appended by another writer meanwhile");
            let theirs =
                store.appended(stream, Sequence(expected), usize::try_from(stored - expected).unwrap_or(usize::MAX))?;
            let outcome = cell.rebase(theirs);
            tracing::info!(?outcome, "egress relay: the cell's appends moved behind the outbox's");
            Ok(Committed::Rebased)
        }
        Err(e) => {
            let _ = cell.persist_failed(epoch, e.to_string());
            Err(e)
        }
    }
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
        let mut written = 0;
        while let Some((ready, appends)) = cell.poll_ready() {
            if let Committed::Written(n) = commit(cell, self, stream, &ready, &appends)? {
                written += n;
            }
        }
        Ok(written)
    }
}

/// Commits one `Ready` if the journal has one, reported to the cell from
/// the blocking thread itself (so that an aborted relay leaves no commit
/// unreported). Returns whether it did anything, and the error if the
/// commit failed.
async fn write_once(
    cell: &AsyncEgressCell<Bytes>,
    store: &Arc<Mutex<SqliteStore>>,
    stream: &Arc<str>,
    counters: &Arc<Counters>,
) -> Option<Result<(), StoreError>> {
    let (ready, appends) = cell.poll_ready()?;
    let (s, c, k) = (stream.clone(), cell.clone(), counters.clone());
    let result = blocking(store, move |st| {
        match commit(&c, st, &s, &ready, &appends)? {
            Committed::Written(n) => {
                k.commits.fetch_add(1, Ordering::Relaxed);
                k.appended.fetch_add(n, Ordering::Relaxed);
            }
            Committed::Rebased => {
                k.rebases.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    })
    .await;
    if let Err(e) = &result {
        tracing::warn!(error = %e, "egress relay: a commit failed");
        counters.failures.fetch_add(1, Ordering::Relaxed);
    }
    Some(result)
}

/// Adopts what applications appended; returns whether a full batch came
/// (there may be more).
async fn adopt(
    cell: &AsyncEgressCell<Bytes>,
    store: &Arc<Mutex<SqliteStore>>,
    stream: &Arc<str>,
    batch: usize,
    force: bool,
    counters: &Counters,
) -> Result<bool, StoreError> {
    if cell.unpersisted_len().get_untracked() != 0 {
        return Ok(false);
    }
    let from = cell.next_sequence();
    let s = stream.clone();
    let rows =
        blocking(store, move |st| if st.changed()? || force { st.appended(&s, from, batch) } else { Ok(Vec::new()) })
            .await?;
    let full = rows.len() == batch;
    for (sequence, payload) in rows {
        match cell.adopt(sequence, payload) {
            AdoptOutcome::Adopted { .. } => {
                counters.adopted.fetch_add(1, Ordering::Relaxed);
            }
            AdoptOutcome::Unwritten { .. } => return Ok(false),
            other => {
                tracing::warn!(?other, "egress relay: adoption stopped at a record out of order");
                counters.adoption_stalls.fetch_add(1, Ordering::Relaxed);
                return Ok(false);
            }
        }
    }
    Ok(full)
}

async fn run(
    cell: AsyncEgressCell<Bytes>,
    store: Arc<Mutex<SqliteStore>>,
    stream: String,
    config: RelayConfig,
    bell: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
    counters: Arc<Counters>,
) {
    let stream: Arc<str> = stream.into();
    let mut failures: u32 = 0;
    let mut more = true;
    loop {
        let rung = bell.notified();
        tokio::pin!(rung);
        rung.as_mut().enable();
        if *stop.borrow() {
            while let Some(Ok(())) = write_once(&cell, &store, &stream, &counters).await {}
            let _ = blocking(&store, |st| st.checkpoint()).await;
            return;
        }
        match write_once(&cell, &store, &stream, &counters).await {
            Some(Ok(())) => {
                failures = 0;
                continue;
            }
            Some(Err(StoreError::Fenced { .. })) => {
                tracing::error!(%stream, "egress relay: another store took the stream over; stopping");
                counters.fenced.store(true, Ordering::Relaxed);
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
        match adopt(&cell, &store, &stream, config.adopt_batch.max(1), more, &counters).await {
            Ok(full) => {
                more = full;
                if full {
                    continue;
                }
            }
            Err(e) => tracing::warn!(error = %e, "egress relay: reading the outbox failed"),
        }
        tokio::select! {
            () = &mut rung => {}
            () = tokio::time::sleep(config.poll_interval) => {}
            _ = stop.changed() => {}
        }
    }
}

/// `retry_base * 2^failures`, capped at `retry_max`.
fn backoff(config: &RelayConfig, failures: u32) -> Duration {
    config.retry_base.saturating_mul(1u32 << failures.min(20)).min(config.retry_max)
}
