//! Durable lanes with their relay: an [`AsyncLanesCell`] restored from a
//! store (SQLite's [`SqliteStore::load_lanes`], or PostgreSQL's
//! `PgStore::take_lanes`), and the one task that writes its journal through
//! a [`LanesJournal`], as [`Relay`](super::Relay) does for one stream.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use egress_codec::{Codec, Raw};
use egress_core::{LaneKey, Lanes, LanesPolicy, LanesReady, Sequence};
use egress_reactive::{AsyncContext, AsyncLanesCell, CellOptions, Effect, LanesAppends, Threaded};
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::{Counters, RelayConfig, RelayStats};
use crate::stored::encode_all;
use crate::{SqliteStore, StoreError, lane_stream};

/// Durable lanes and the relay that writes them (see
/// [`open_durable_lanes`]).
pub struct DurableLanes<K: 'static, T: 'static = Bytes> {
    /// The cell: enqueue here, attach a transport (or start a sender) here.
    pub cell: AsyncLanesCell<K, T>,
    /// Its relay.
    pub relay: LanesRelay,
}

impl<K: LaneKey + 'static, T: 'static> std::fmt::Debug for DurableLanes<K, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableLanes").field("cell", &self.cell).field("relay", &self.relay).finish()
    }
}

/// Where a [`LanesRelay`] writes durable lanes: one [`LanesReady`] as one
/// transaction, fenced so that only the store that took the lanes last
/// writes them. [`SqliteLanes`] on SQLite; `egress_store::postgres::PgLanes`
/// on PostgreSQL (feature `postgres`).
pub trait LanesJournal<K>: Send + Sync + 'static {
    /// The lanes' name.
    fn lanes(&self) -> &str;

    /// Writes `ready` as one transaction, `appends[i]` the encoded
    /// payloads of `ready.lanes[i]`'s appends, in order. Nothing is
    /// written on an error; [`StoreError::Fenced`] stops the relay.
    fn apply(
        &self,
        ready: LanesReady<K>,
        appends: Vec<Vec<(Sequence, Bytes)>>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Whether the lanes are still this journal's: [`StoreError::Fenced`]
    /// once another store took them (asked when the relay has nothing to
    /// write, at most every 100 ms).
    fn owns(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Called once when the relay stops after writing what was pending
    /// (SQLite checkpoints its WAL; PostgreSQL gives the lease up).
    fn close(&self) -> impl Future<Output = ()> + Send;
}

/// Lanes of a [`SqliteStore`] as a [`LanesJournal`]: each write on a
/// blocking thread ([`SqliteStore::apply_lanes`]), the owner asked with
/// [`SqliteStore::owns_lanes`].
pub struct SqliteLanes {
    store: Arc<Mutex<SqliteStore>>,
    name: Arc<str>,
}

impl std::fmt::Debug for SqliteLanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteLanes").field("lanes", &self.name).finish_non_exhaustive()
    }
}

impl SqliteLanes {
    /// The lanes `lanes` of `store`, which loaded them
    /// ([`SqliteStore::load_lanes`]).
    pub fn new(store: SqliteStore, lanes: &str) -> Self {
        SqliteLanes { store: Arc::new(Mutex::new(store)), name: lanes.into() }
    }

    /// Runs `f` on the store on a blocking thread.
    async fn blocking<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut SqliteStore, &str) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let (store, name) = (self.store.clone(), self.name.clone());
        tokio::task::spawn_blocking(move || f(&mut store.lock(), &name))
            .await
            .map_err(|e| StoreError::Task(e.to_string()))?
    }
}

impl<K: serde::Serialize + Send + Sync + 'static> LanesJournal<K> for SqliteLanes {
    fn lanes(&self) -> &str {
        &self.name
    }

    async fn apply(&self, ready: LanesReady<K>, appends: Vec<Vec<(Sequence, Bytes)>>) -> Result<(), StoreError> {
        self.blocking(move |store, name| store.apply_lanes(name, &ready, &appends)).await
    }

    async fn owns(&self) -> Result<(), StoreError> {
        self.blocking(|store, name| store.owns_lanes(name)).await
    }

    async fn close(&self) {
        let _ = self.blocking(|store, _| store.checkpoint()).await;
    }
}

/// The task that makes a lanes cell's records durable: whenever any lane's
/// journal has something to write (records enqueued, a generation, an
/// acknowledgement, a dead letter, a lane freed), it takes one
/// [`LanesReady`] (every lane's part of it: group commit across lanes),
/// commits it as one transaction on a blocking thread, and reports it to
/// the cell (which makes the records claimable, or shows the error and
/// has the write tried again after a backoff). Another store that loads the
/// same lanes fences it: it shows the error and stops.
///
/// Each commit is reported by a task of its own, so dropping the relay
/// (which aborts its task) never leaves a commit unreported.
/// [`shutdown`](Self::shutdown) writes what is pending first. The store is
/// a [`LanesJournal`]: [`spawn`](Self::spawn) takes a SQLite store,
/// [`spawn_with`](Self::spawn_with) any journal.
pub struct LanesRelay {
    task: Option<JoinHandle<()>>,
    effect: Effect<Threaded>,
    stop: watch::Sender<bool>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for LanesRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LanesRelay").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

impl Drop for LanesRelay {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.effect.dispose();
    }
}

impl LanesRelay {
    /// What it has done (`adopted`, `rebases`, `adoption_stalls` and
    /// `undecodable` stay 0: lanes take no outbox appends).
    pub fn stats(&self) -> RelayStats {
        self.counters.snapshot()
    }

    /// Writes what the journal holds, closes it (SQLite checkpoints its
    /// WAL; PostgreSQL releases the lease), and stops; returns the stats.
    pub async fn shutdown(mut self) -> RelayStats {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.counters.snapshot()
    }
}

/// Opens the store at `path`, restores the lanes `lanes` from it and starts
/// their relay: every lane with each record not yet acknowledged pending
/// again under its sequence and ordinal (nothing in flight, no backoff
/// carried over), released in the original order across lanes; the cell
/// continues the lanes' incarnation, generation and ordinals. `codec`
/// writes the payloads and reads them back ([`Raw`] for bytes).
///
/// An open that fails changes nothing: the lanes are taken over (a
/// process holding them fenced) only once they restore.
///
/// # Errors
/// The store's ([`SqliteStore::open`], [`SqliteStore::load_lanes`]), a
/// stored record `codec` cannot read ([`StoreError::Undecodable`]), or
/// stored lanes that break the core's rules ([`StoreError::LanesRestore`]).
///
/// # Panics
/// Outside a tokio runtime.
pub async fn open_durable_lanes<K, T>(
    cx: &AsyncContext,
    path: impl AsRef<Path>,
    lanes: &str,
    codec: impl Codec<T>,
    policy: LanesPolicy,
    options: CellOptions,
    config: RelayConfig,
) -> Result<DurableLanes<K, T>, StoreError>
where
    K: LaneKey + serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
    T: Clone + Send + Sync + 'static,
{
    let (path, name) = (path.as_ref().to_owned(), lanes.to_owned());
    // Read, decoded and restored in the store's transaction: the lanes are
    // taken over only once they restore (an open that cannot changes
    // nothing, and fences no process that holds them).
    let opened = tokio::task::spawn_blocking(move || {
        let restored = SqliteStore::open(path).and_then(|mut store| {
            let restored = store.load_lanes_then::<K, _>(&name, |loaded| {
                let loaded = loaded.decode(&name, &codec)?;
                Ok((loaded.incarnation, Lanes::restore(policy, loaded.restored)?))
            })?;
            Ok((store, restored))
        });
        (codec, restored)
    })
    .await
    .map_err(|e| StoreError::Task(e.to_string()))?;
    let (codec, restored) = opened;
    let (store, (incarnation, restored)) = restored?;
    let cell = AsyncLanesCell::from_lanes(cx, restored, options.incarnation(incarnation));
    let relay = LanesRelay::spawn(cx, &cell, store, lanes, codec, config);
    Ok(DurableLanes { cell, relay })
}

/// [`open_durable_lanes`] for lanes of bytes.
///
/// # Errors
/// As [`open_durable_lanes`]'s.
///
/// # Panics
/// Outside a tokio runtime.
pub async fn open_durable_lanes_raw<K>(
    cx: &AsyncContext,
    path: impl AsRef<Path>,
    lanes: &str,
    policy: LanesPolicy,
    options: CellOptions,
    config: RelayConfig,
) -> Result<DurableLanes<K>, StoreError>
where
    K: LaneKey + serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    open_durable_lanes(cx, path, lanes, Raw, policy, options, config).await
}

/// What the relay's task holds.
struct Run<K: 'static, T: 'static, J> {
    cell: AsyncLanesCell<K, T>,
    journal: Arc<J>,
    codec: Arc<dyn Codec<T>>,
    counters: Arc<Counters>,
}

/// How often a relay with nothing to write asks whether another store
/// loaded its lanes (a write would find out at once).
const OWNER_CHECK: Duration = Duration::from_millis(100);

impl LanesRelay {
    /// Starts the relay of `cell` (lanes restored from `store`'s `lanes`)
    /// on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn<K, T>(
        cx: &AsyncContext,
        cell: &AsyncLanesCell<K, T>,
        store: SqliteStore,
        lanes: &str,
        codec: impl Codec<T>,
        config: RelayConfig,
    ) -> LanesRelay
    where
        K: LaneKey + serde::Serialize + Send + Sync + 'static,
        T: Clone + Send + Sync + 'static,
    {
        Self::spawn_with(cx, cell, SqliteLanes::new(store, lanes), codec, config)
    }

    /// Starts the relay of `cell` (lanes restored from what `journal`
    /// writes) on the current tokio runtime. Installs `codec`'s check on
    /// the cell ([`set_encode_check`](egress_reactive::LanesCellOf::set_encode_check)):
    /// its `try_enqueue` refuses a value `codec` cannot write.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn_with<K, T, J>(
        cx: &AsyncContext,
        cell: &AsyncLanesCell<K, T>,
        journal: J,
        codec: impl Codec<T>,
        config: RelayConfig,
    ) -> LanesRelay
    where
        K: LaneKey + serde::Serialize + Send + Sync + 'static,
        T: Clone + Send + Sync + 'static,
        J: LanesJournal<K>,
    {
        let bell = Arc::new(Notify::new());
        // Every transition of durable lanes may leave something to write.
        let effect = cx.effect({
            let (bell, cell) = (bell.clone(), cell.clone());
            move || {
                cell.track_journal();
                bell.notify_one();
            }
        });
        let (stop, stop_rx) = watch::channel(false);
        let counters = Arc::new(Counters::default());
        let span = tracing::info_span!("egress_lanes_relay", lanes = journal.lanes());
        let codec: Arc<dyn Codec<T>> = Arc::new(codec);
        cell.set_encode_check(Some(crate::stored::encode_check(codec.clone())));
        let run = Run { cell: cell.clone(), journal: Arc::new(journal), codec, counters: counters.clone() };
        let task = tokio::spawn(tracing::Instrument::instrument(run.run(config, bell, stop_rx), span));
        LanesRelay { task: Some(task), effect, stop, counters }
    }
}

impl<K, T, J> Run<K, T, J>
where
    K: LaneKey + serde::Serialize + Send + Sync + 'static,
    T: Clone + Send + Sync + 'static,
    J: LanesJournal<K>,
{
    async fn run(self, config: RelayConfig, bell: Arc<Notify>, mut stop: watch::Receiver<bool>) {
        let mut failures: u32 = 0;
        let mut check_at = tokio::time::Instant::now();
        // The loop ends only at a fence (a stop returns from it); its bell
        // wait is dropped by then, so the fence's own wait hears the bell.
        let fence = loop {
            let rung = bell.notified();
            tokio::pin!(rung);
            rung.as_mut().enable();
            if *stop.borrow() {
                while let Some(Ok(())) = self.write_once().await {}
                self.journal.close().await;
                return;
            }
            if tokio::time::Instant::now() >= check_at {
                check_at = tokio::time::Instant::now() + OWNER_CHECK;
                if let Err(e @ StoreError::Fenced { .. }) = self.journal.owns().await {
                    break e;
                }
            }
            match self.write_once().await {
                Some(Ok(())) => {
                    failures = 0;
                    continue;
                }
                Some(Err(e @ StoreError::Fenced { .. })) => break e,
                Some(Err(_)) => {
                    let wait = super::task::backoff(&config, failures);
                    failures = failures.saturating_add(1);
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        _ = stop.changed() => {}
                    }
                    continue;
                }
                None => {}
            }
            tokio::select! {
                () = &mut rung => {}
                () = tokio::time::sleep(config.poll_interval.max(OWNER_CHECK)) => {}
                _ = stop.changed() => {}
            }
        };
        self.fenced(&fence, &bell, &mut stop).await;
    }

    /// Another store took the lanes: nothing more is written here. The
    /// next epoch the cell offers (at once, or at its next transition) is
    /// failed with why, so the cell shows it (and keeps showing it: no
    /// later epoch is persisted) rather than hold what comes next as
    /// "saving" with no reason; then the task ends.
    async fn fenced(&self, why: &StoreError, bell: &Notify, stop: &mut watch::Receiver<bool>) {
        tracing::error!(error = %why, "egress lanes relay: another store took the lanes over; stopping");
        self.counters.fenced.store(true, Ordering::Relaxed);
        let fail_offered = || {
            let offered = self.cell.poll_ready();
            if let Some((ready, _)) = &offered {
                let _ = self.cell.persist_failed(ready.epoch, format!("{why}: nothing more is written"));
            }
            offered.is_some()
        };
        super::task::refuse(fail_offered, bell, stop).await;
    }

    /// Commits one `LanesReady` if the journal has one: whether it did, and
    /// the error if the commit failed.
    async fn write_once(&self) -> Option<Result<(), StoreError>> {
        let (ready, appends) = match super::task::poll_caught(|| self.cell.poll_ready(), &self.counters)? {
            Ok(polled) => polled,
            Err(e) => return Some(Err(e)),
        };
        let epoch = ready.epoch;
        let count: usize = appends.iter().map(Vec::len).sum();
        let task = tokio::spawn(commit(self.cell.clone(), self.journal.clone(), self.codec.clone(), ready, appends));
        let result = match task.await {
            Ok(result) => result,
            // The commit's task ended without answering (a panic under the
            // store): answered here, so that the cell shows it and offers
            // the write again.
            Err(e) => {
                let e = StoreError::Task(e.to_string());
                let _ = self.cell.persist_failed(epoch, e.to_string());
                Err(e)
            }
        };
        match &result {
            Ok(()) => {
                self.counters.commits.fetch_add(1, Ordering::Relaxed);
                self.counters.appended.fetch_add(count as u64, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(error = %e, "egress lanes relay: a commit failed");
                self.counters.failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        Some(result)
    }
}

/// Encodes, writes and reports one `LanesReady`, in a task of its own.
async fn commit<K, T, J>(
    cell: AsyncLanesCell<K, T>,
    journal: Arc<J>,
    codec: Arc<dyn Codec<T>>,
    ready: LanesReady<K>,
    appends: LanesAppends<T>,
) -> Result<(), StoreError>
where
    K: LaneKey + serde::Serialize + Send + Sync + 'static,
    T: Clone + Send + Sync + 'static,
    J: LanesJournal<K>,
{
    let epoch = ready.epoch;
    let result = async {
        let mut bytes: Vec<Vec<(Sequence, Bytes)>> = Vec::with_capacity(appends.len());
        for (part, payloads) in ready.lanes.iter().zip(&appends) {
            bytes.push(encode_all(&*codec, &lane_stream(journal.lanes(), &part.lane)?, payloads)?);
        }
        journal.apply(ready, bytes).await
    }
    .await;
    match &result {
        Ok(()) => {
            let _ = cell.persisted(epoch);
        }
        Err(e) => {
            let _ = cell.persist_failed(epoch, e.to_string());
        }
    }
    result
}
