//! A durable latest-value projection with its relay: an
//! [`AsyncLatestCell`] restored from SQLite ([`SqliteStore::load_latest`]),
//! and the one task that writes its journal, as
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
/// [`shutdown`](Self::shutdown) writes what is pending first.
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

    /// Writes what the journal holds, checkpoints the WAL, and stops;
    /// returns the stats.
    pub async fn shutdown(self) -> RelayStats {
        self.0.shutdown().await
    }

    /// Starts the relay of `cell` (restored from `store`'s projection
    /// `name`) on the current tokio runtime, writing values with `codec`.
    /// Installs the store's check on the cell
    /// ([`set_write_check`](egress_reactive::LatestCellOf::set_write_check)):
    /// its `upsert` refuses a value `codec` cannot encode, a key serde
    /// cannot write, and a version above `i64::MAX` (SQLite's integers).
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
        let span = tracing::info_span!("egress_latest_relay", latest = name);
        let codec: Arc<dyn Codec<V>> = Arc::new(codec);
        cell.set_write_check(Some(write_check(name, codec.clone())));
        let link = LatestLink { cell: cell.clone(), store: Blocking::new(store, name), codec };
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
/// a version SQLite's integers hold (an upsert of anything else would be
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

/// A latest cell's journal and the SQLite store that writes it.
struct LatestLink<K: 'static, V: 'static> {
    cell: AsyncLatestCell<K, V>,
    store: Blocking,
    codec: Arc<dyn Codec<V>>,
}

impl<K, V> Link for LatestLink<K, V>
where
    K: Ord + Clone + serde::Serialize + Send + Sync + 'static,
    V: Clone + PartialEq + Send + Sync + 'static,
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
                    Err(error) => return Err(value_error(self.store.name(), key, true, error)),
                },
                _ => None,
            };
            bytes.push(encoded);
        }
        self.store.run(move |store, name| store.apply_latest(name, &ready, &bytes)).await
    }

    async fn owns(&self) -> Result<(), StoreError> {
        self.store.run(|store, name| store.owns_latest(name)).await
    }

    async fn close(&self) {
        let _ = self.store.run(|store, _| store.checkpoint()).await;
    }
}
