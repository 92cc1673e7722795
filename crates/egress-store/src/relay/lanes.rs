//! Durable lanes with their relay: an [`AsyncLanesCell`] restored from a
//! store (SQLite's [`SqliteStore::load_lanes`], or PostgreSQL's
//! `PgStore::take_lanes`), and the one task that writes its journal through
//! a [`LanesJournal`], as [`Relay`](super::Relay) does for one stream.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use egress_codec::{Codec, Raw};
use egress_core::{Epoch, LaneKey, Lanes, LanesPolicy, LanesReady, Sequence};
use egress_reactive::{AsyncContext, AsyncLanesCell, CellOptions, LanesAppends};
use tokio::sync::Notify;

use super::link::{Blocking, Link, Running};
use super::{RelayConfig, RelayStats};
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
pub struct SqliteLanes(Blocking);

impl std::fmt::Debug for SqliteLanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteLanes").field("lanes", &self.0.name()).finish_non_exhaustive()
    }
}

impl SqliteLanes {
    /// The lanes `lanes` of `store`, which loaded them
    /// ([`SqliteStore::load_lanes`]).
    pub fn new(store: SqliteStore, lanes: &str) -> Self {
        SqliteLanes(Blocking::new(store, lanes))
    }
}

impl<K: serde::Serialize + Send + Sync + 'static> LanesJournal<K> for SqliteLanes {
    fn lanes(&self) -> &str {
        self.0.name()
    }

    async fn apply(&self, ready: LanesReady<K>, appends: Vec<Vec<(Sequence, Bytes)>>) -> Result<(), StoreError> {
        self.0.run(move |store, name| store.apply_lanes(name, &ready, &appends)).await
    }

    async fn owns(&self) -> Result<(), StoreError> {
        self.0.run(|store, name| store.owns_lanes(name)).await
    }

    async fn close(&self) {
        let _ = self.0.run(|store, _| store.checkpoint()).await;
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
pub struct LanesRelay(Running);

impl std::fmt::Debug for LanesRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LanesRelay").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

impl LanesRelay {
    /// What it has done (`adopted`, `rebases`, `adoption_stalls` and
    /// `undecodable` stay 0: lanes take no outbox appends).
    pub fn stats(&self) -> RelayStats {
        self.0.stats()
    }

    /// Writes what the journal holds, closes it (SQLite checkpoints its
    /// WAL; PostgreSQL releases the lease), and stops; returns the stats.
    pub async fn shutdown(self) -> RelayStats {
        self.0.shutdown().await
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
        let span = tracing::info_span!("egress_lanes_relay", lanes = journal.lanes());
        let codec: Arc<dyn Codec<T>> = Arc::new(codec);
        cell.set_encode_check(Some(crate::stored::encode_check(codec.clone())));
        let link = LanesLink { cell: cell.clone(), journal, codec };
        LanesRelay(Running::spawn(link, effect, bell, config, span))
    }
}

/// A lanes cell's journal and the store that writes it.
struct LanesLink<K: 'static, T: 'static, J> {
    cell: AsyncLanesCell<K, T>,
    journal: J,
    codec: Arc<dyn Codec<T>>,
}

impl<K, T, J> Link for LanesLink<K, T, J>
where
    K: LaneKey + serde::Serialize + Send + Sync + 'static,
    T: Clone + Send + Sync + 'static,
    J: LanesJournal<K>,
{
    type Offer = (LanesReady<K>, LanesAppends<T>);

    const WHAT: &'static str = "lanes";

    fn poll_ready(&self) -> Option<Self::Offer> {
        self.cell.poll_ready()
    }

    fn epoch((ready, _): &Self::Offer) -> Epoch {
        ready.epoch
    }

    fn appended((_, appends): &Self::Offer) -> u64 {
        appends.iter().map(|a| a.len() as u64).sum()
    }

    fn persisted(&self, epoch: Epoch) {
        let _ = self.cell.persisted(epoch);
    }

    fn persist_failed(&self, epoch: Epoch, reason: String) {
        let _ = self.cell.persist_failed(epoch, reason);
    }

    async fn write(&self, (ready, appends): Self::Offer) -> Result<(), StoreError> {
        let mut bytes: Vec<Vec<(Sequence, Bytes)>> = Vec::with_capacity(appends.len());
        for (part, payloads) in ready.lanes.iter().zip(&appends) {
            bytes.push(encode_all(&*self.codec, &lane_stream(self.journal.lanes(), &part.lane)?, payloads)?);
        }
        self.journal.apply(ready, bytes).await
    }

    async fn owns(&self) -> Result<(), StoreError> {
        self.journal.owns().await
    }

    async fn close(&self) {
        self.journal.close().await;
    }
}
