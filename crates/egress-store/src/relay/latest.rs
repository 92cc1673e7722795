//! A durable latest-value projection with its relay: an
//! [`AsyncLatestCell`] restored from a store (SQLite's
//! [`SqliteStore::load_latest`], or PostgreSQL's `PgStore::take_latest`),
//! and the one task that writes its journal through a [`LatestJournal`], as
//! [`LanesRelay`](super::LanesRelay) does for lanes (one run loop for both:
//! `link.rs`).

use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use egress_codec::{Codec, guarded};
use egress_core::{Epoch, Latest, LatestReady, LatestWrite, Policy, Version};
use egress_reactive::{AsyncContext, AsyncLatestCell, CellOptions, LatestCheck};
use tokio::sync::Notify;

use super::link::{Blocking, Link, Running};
use super::{RelayConfig, RelayStats};
use crate::latest::{key_text, value_error};
use crate::stored::to_i64;
use crate::{SqliteStore, StoreError};

/// A durable latest projection and the relay that writes it (see
/// [`open_durable_latest`]).
pub struct DurableLatest<K: 'static, V: 'static = Bytes> {
    /// The cell: upsert here, attach a sink here.
    pub cell: AsyncLatestCell<K, V>,
    /// Its relay.
    pub relay: LatestRelay,
}

impl<K: Ord + Clone + 'static, V: PartialEq + 'static> std::fmt::Debug for DurableLatest<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableLatest").field("cell", &self.cell).field("relay", &self.relay).finish()
    }
}

/// Where a [`LatestRelay`] writes a latest projection: one [`LatestReady`]
/// as one transaction, fenced so that only the store that took the
/// projection last writes it. [`SqliteLatest`] on SQLite;
/// `egress_store::postgres::PgLatest` on PostgreSQL (feature `postgres`).
pub trait LatestJournal<K>: Send + Sync + 'static {
    /// The projection's name.
    fn name(&self) -> &str;

    /// Writes `ready` as one transaction, `values[i]` the encoded value of
    /// `ready.writes[i]` (present exactly for a `Put` with a newest
    /// version). Nothing is written on an error; [`StoreError::Fenced`]
    /// stops the relay.
    fn apply(
        &self,
        ready: LatestReady<K>,
        values: Vec<Option<Bytes>>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Whether the projection is still this journal's:
    /// [`StoreError::Fenced`] once another store took it (asked when the
    /// relay has nothing to write, at most every 100 ms).
    fn owns(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Called once when the relay stops after writing what was pending
    /// (SQLite checkpoints its WAL; PostgreSQL gives the lease up).
    fn close(&self) -> impl Future<Output = ()> + Send;
}

/// A projection of a [`SqliteStore`] as a [`LatestJournal`]: each write on
/// a blocking thread ([`SqliteStore::apply_latest`]), the owner asked with
/// [`SqliteStore::owns_latest`].
pub struct SqliteLatest(Blocking);

impl std::fmt::Debug for SqliteLatest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteLatest").field("name", &self.0.name()).finish_non_exhaustive()
    }
}

impl SqliteLatest {
    /// The projection `name` of `store`, which loaded it
    /// ([`SqliteStore::load_latest`]).
    pub fn new(store: SqliteStore, name: &str) -> Self {
        SqliteLatest(Blocking::new(store, name))
    }
}

impl<K: serde::Serialize + Send + Sync + 'static> LatestJournal<K> for SqliteLatest {
    fn name(&self) -> &str {
        self.0.name()
    }

    async fn apply(&self, ready: LatestReady<K>, values: Vec<Option<Bytes>>) -> Result<(), StoreError> {
        self.0.run(move |store, name| store.apply_latest(name, &ready, &values)).await
    }

    async fn owns(&self) -> Result<(), StoreError> {
        self.0.run(|store, name| store.owns_latest(name)).await
    }

    async fn close(&self) {
        let _ = self.0.run(|store, _| store.checkpoint()).await;
    }
}

/// The task that makes a latest projection durable: whenever its journal
/// has something to write (desires upserted, frontiers the sink applied,
/// keys forgotten), it takes one [`LatestReady`] (every key that changed
/// since the last: group commit), commits it as one transaction on a
/// blocking thread, and reports it to the cell (which makes the stored
/// desires claimable, or shows the error and has the write tried again
/// after a backoff). Another store that loads the same projection fences
/// it: it shows the error and stops.
///
/// Each commit is reported by a task of its own, so dropping the relay
/// (which aborts its task) never leaves a commit unreported.
/// [`shutdown`](Self::shutdown) writes what is pending first. The store is
/// a [`LatestJournal`]: [`spawn`](Self::spawn) takes a SQLite store,
/// [`spawn_with`](Self::spawn_with) any journal.
pub struct LatestRelay(Running);

impl std::fmt::Debug for LatestRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatestRelay").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

impl LatestRelay {
    /// What it has done (`commits` and `failures`; `appended` counts the
    /// desires written; the outbox counters stay 0).
    pub fn stats(&self) -> RelayStats {
        self.0.stats()
    }

    /// Writes what the journal holds, closes it (SQLite checkpoints its
    /// WAL; PostgreSQL releases the lease), and stops; returns the stats.
    pub async fn shutdown(self) -> RelayStats {
        self.0.shutdown().await
    }

    /// Starts the relay of `cell` (restored from `store`'s projection
    /// `name`) on the current tokio runtime, writing values with `codec`.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn<K, V>(
        cx: &AsyncContext,
        cell: &AsyncLatestCell<K, V>,
        store: SqliteStore,
        name: &str,
        codec: impl Codec<V>,
        config: RelayConfig,
    ) -> LatestRelay
    where
        K: Ord + Clone + serde::Serialize + Send + Sync + 'static,
        V: Clone + PartialEq + Send + Sync + 'static,
    {
        Self::spawn_with(cx, cell, SqliteLatest::new(store, name), codec, config)
    }

    /// Starts the relay of `cell` (restored from what `journal` writes) on
    /// the current tokio runtime, writing values with `codec`. Installs
    /// the store's check on the cell
    /// ([`set_write_check`](egress_reactive::LatestCellOf::set_write_check)):
    /// its `upsert` refuses a value `codec` cannot encode, a key serde
    /// cannot write, and a version above `i64::MAX` (the stores' integers).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn_with<K, V, J>(
        cx: &AsyncContext,
        cell: &AsyncLatestCell<K, V>,
        journal: J,
        codec: impl Codec<V>,
        config: RelayConfig,
    ) -> LatestRelay
    where
        K: Ord + Clone + serde::Serialize + Send + Sync + 'static,
        V: Clone + PartialEq + Send + Sync + 'static,
        J: LatestJournal<K>,
    {
        let bell = Arc::new(Notify::new());
        // Every transition of a durable projection may leave something to
        // write.
        let effect = cx.effect({
            let (bell, cell) = (bell.clone(), cell.clone());
            move || {
                cell.track_journal();
                bell.notify_one();
            }
        });
        let span = tracing::info_span!("egress_latest_relay", latest = journal.name());
        let codec: Arc<dyn Codec<V>> = Arc::new(codec);
        cell.set_write_check(Some(write_check(journal.name(), codec.clone())));
        let link = LatestLink { cell: cell.clone(), journal, codec };
        LatestRelay(Running::spawn(link, effect, bell, config, span))
    }
}

/// Opens the store at `path`, restores the latest projection `name` from
/// it and starts its relay: each key at its stored frontier, with its
/// stored desire (a value not yet applied when the process stopped)
/// claimable at once, nothing in flight, no backoff carried over; at a
/// generation above the last open's. `codec` writes the values and reads
/// them back; keys are stored as JSON (serde). At most `max_keys` keys.
///
/// An open that fails changes nothing: the projection is taken over (a
/// process holding it fenced) only once it restores.
///
/// # Errors
/// The store's ([`SqliteStore::open`], [`SqliteStore::load_latest`]), a
/// stored value `codec` cannot read ([`StoreError::LatestValue`]), or a
/// stored projection that breaks the core's rules
/// ([`StoreError::LatestRestore`]: more keys than `max_keys`).
///
/// # Panics
/// Outside a tokio runtime.
#[allow(clippy::too_many_arguments)]
pub async fn open_durable_latest<K, V>(
    cx: &AsyncContext,
    path: impl AsRef<Path>,
    name: &str,
    codec: impl Codec<V>,
    policy: Policy,
    max_keys: NonZeroUsize,
    options: CellOptions,
    config: RelayConfig,
) -> Result<DurableLatest<K, V>, StoreError>
where
    K: Ord + Clone + serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
    V: Clone + PartialEq + Send + Sync + 'static,
{
    let (path, owned) = (path.as_ref().to_owned(), name.to_owned());
    // Read, decoded and restored in the store's transaction: the
    // projection is taken over only once it restores.
    let opened = tokio::task::spawn_blocking(move || {
        let restored = SqliteStore::open(path).and_then(|mut store| {
            let latest = store.load_latest_then::<K, _>(&owned, |loaded| {
                let loaded = loaded.decode(&owned, &codec)?;
                Ok(Latest::restore_journaled(policy, max_keys, loaded.generation, loaded.keys)?)
            })?;
            Ok((store, latest))
        });
        (codec, restored)
    })
    .await
    .map_err(|e| StoreError::Task(e.to_string()))?;
    let (codec, restored) = opened;
    let (store, latest) = restored?;
    let cell = AsyncLatestCell::from_latest(cx, latest, options);
    let relay = LatestRelay::spawn(cx, &cell, store, name, codec, config);
    Ok(DurableLatest { cell, relay })
}

/// What the store can write: a value `codec` encodes, a key serde writes,
/// a version the stores' integers hold (an upsert of anything else would be
/// accepted and never written, holding back every key's writes).
fn write_check<K, V>(name: &str, codec: Arc<dyn Codec<V>>) -> LatestCheck<K, V>
where
    K: serde::Serialize + 'static,
    V: 'static,
{
    let name = name.to_owned();
    Arc::new(move |key: &K, version: Version, value: &V| {
        to_i64("version", version.0).map_err(|e| e.to_string())?;
        key_text(&name, key).map_err(|e| e.to_string())?;
        guarded(|| codec.encode(value)).map(|_| ()).map_err(|e| e.to_string())
    })
}

/// A latest cell's journal and the store that writes it.
struct LatestLink<K: 'static, V: 'static, J> {
    cell: AsyncLatestCell<K, V>,
    journal: J,
    codec: Arc<dyn Codec<V>>,
}

impl<K, V, J> Link for LatestLink<K, V, J>
where
    K: Ord + Clone + serde::Serialize + Send + Sync + 'static,
    V: Clone + PartialEq + Send + Sync + 'static,
    J: LatestJournal<K>,
{
    type Offer = (LatestReady<K>, Vec<Option<V>>);

    const WHAT: &'static str = "latest";

    fn poll_ready(&self) -> Option<Self::Offer> {
        self.cell.poll_ready()
    }

    fn epoch((ready, _): &Self::Offer) -> Epoch {
        ready.epoch
    }

    fn appended((_, values): &Self::Offer) -> u64 {
        values.iter().filter(|v| v.is_some()).count() as u64
    }

    fn persisted(&self, epoch: Epoch) {
        let _ = self.cell.persisted(epoch);
    }

    fn persist_failed(&self, epoch: Epoch, reason: String) {
        let _ = self.cell.persist_failed(epoch, reason);
    }

    async fn write(&self, (ready, values): Self::Offer) -> Result<(), StoreError> {
        let mut bytes = Vec::with_capacity(values.len());
        for (write, value) in ready.writes.iter().zip(&values) {
            let encoded = match (write, value) {
                (LatestWrite::Put { key, .. }, Some(value)) => match guarded(|| self.codec.encode(value)) {
                    Ok(encoded) => Some(encoded),
                    Err(error) => return Err(value_error(self.journal.name(), key, true, error)),
                },
                _ => None,
            };
            bytes.push(encoded);
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
