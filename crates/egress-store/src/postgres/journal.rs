//! A leased stream's journal: one `Ready` per call of `egress_apply`, the
//! records appended since a sequence, and the relay's `PgJournal` with
//! `open_durable`.

#[cfg(feature = "relay")]
use std::sync::Arc;
#[cfg(feature = "relay")]
use std::sync::atomic::AtomicBool;
#[cfg(feature = "relay")]
use std::time::Duration;

use bytes::Bytes;
use egress_core::{Ready, Sequence};

#[cfg(feature = "relay")]
use super::keeper::Held;
#[cfg(feature = "relay")]
use super::store::Bell;
use super::{Lease, PgStore, busy_or};
use crate::StoreError;
use crate::stored::{dead_code, to_i64, to_u64};

impl PgStore {
    /// Writes one [`Ready`] of the leased stream as one transaction, as
    /// [`SqliteStore::apply`](crate::SqliteStore::apply) does (appends
    /// continuing the stored counter or [`StoreError::Conflict`], the
    /// generation, dead letters, the watermark with pruning), fenced by the
    /// lease: one call of the `egress_apply` function, one round trip. A
    /// `Ready` that need not reach the disk (`must_sync` false: watermarks,
    /// dead letters) commits with `synchronous_commit = off`. Dead letters
    /// are kept when the watermark passes them, until
    /// [`requeue`](Self::requeue)d or [`discard`](Self::discard)ed.
    ///
    /// # Errors
    /// [`StoreError::Fenced`] when the stream was taken over, a conflict,
    /// a number out of range, or PostgreSQL's error; nothing is written
    /// then.
    pub async fn apply(&self, lease: &Lease, ready: &Ready, appends: &[(Sequence, Bytes)]) -> Result<(), StoreError> {
        let range = ready.appends.clone();
        let count = range.end.0.saturating_sub(range.start.0);
        if appends.len() as u64 != count || appends.iter().zip(range.start.0..).any(|((s, _), e)| s.0 != e) {
            return Err(StoreError::Appends { expected: range, given: appends.len() });
        }
        let stream = &lease.stream;
        let mut seqs = Vec::with_capacity(appends.len());
        for (sequence, _) in appends {
            seqs.push(to_i64("sequence", sequence.0)?);
        }
        let payloads: Vec<&[u8]> = appends.iter().map(|(_, p)| p.as_ref()).collect();
        let (mut dead_seqs, mut reasons, mut held) = (Vec::new(), Vec::new(), Vec::new());
        for (sequence, mark) in &ready.dead {
            dead_seqs.push(to_i64("sequence", sequence.0)?);
            reasons.push(mark.map(|m| i16::try_from(dead_code(m.reason)).unwrap_or(i16::MAX)));
            held.push(mark.map(|m| m.held));
        }
        let generation = ready.generation.map(|g| to_i64("generation", g.0)).transpose()?;
        let acked = ready.acked_through.map(|a| to_i64("acked_through", a.0)).transpose()?;
        let row = self
            .shared
            .client
            .query_one(
                &self.shared.statements.apply,
                &[
                    stream,
                    &to_i64("lease", lease.number)?,
                    &to_i64("sequence", range.start.0)?,
                    &seqs,
                    &payloads,
                    &generation,
                    &dead_seqs,
                    &reasons,
                    &held,
                    &acked,
                    &ready.must_sync,
                ],
            )
            .await
            .map_err(|e| busy_or(stream, e))?;
        let Some(stored) = row.get::<_, Option<i64>>(0) else {
            return Err(StoreError::Fenced { stream: stream.clone() });
        };
        let stored = to_u64("next_sequence", stored)?;
        if !range.is_empty() && stored != range.start.0 {
            return Err(StoreError::Conflict { stream: stream.clone(), stored, expected: range.start.0 });
        }
        Ok(())
    }

    /// Up to `limit` records of `stream` from sequence `from` on, in order:
    /// what applications appended that the worker's cell has not adopted.
    ///
    /// # Errors
    /// PostgreSQL's error, or a stored value out of range.
    pub async fn appended(
        &self,
        stream: &str,
        from: Sequence,
        limit: usize,
    ) -> Result<Vec<(Sequence, Bytes)>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let from = to_i64("sequence", from.0)?;
        let rows = self.shared.client.query(&self.shared.statements.appended, &[&stream, &from, &limit]).await?;
        rows.into_iter()
            .map(|row| Ok((Sequence(to_u64("seq", row.get(0))?), Bytes::from(row.get::<_, Vec<u8>>(1)))))
            .collect()
    }
}

/// A stream a [`PgStore`] has leased, as a relay's
/// [`JournalStore`](crate::JournalStore): the store's lease keeper renews
/// the lease (with every other lease of the store, in one statement, a
/// third into the lease less the renewal's round trip, on a task of its
/// own, so that neither the relay's backoff nor an application's
/// transaction on the stream delays it); a renewal refused stops the relay,
/// the stream being another worker's. It reads the outbox when notified of
/// the stream or every `poll` at the latest (`NOTIFY` does not pass a
/// transaction-mode pooler), and releases the lease when it shuts down.
///
/// [`lease`](crate::JournalStore::lease) (and the relay's
/// [`Relay::lease`](crate::Relay::lease)) tells until when the lease
/// surely holds: a dispatcher gated on it starts nothing its worker could
/// not finish under the lease. A lease that runs out while its worker
/// lives (no renewal got through in time) is logged and counted
/// (`egress_lease_lapsed`) apart from a lease lost to another worker
/// (`egress_lease_lost`) and from a takeover of a stream whose worker's
/// lease ran out (`egress_lease_takeovers`, by the taker).
#[cfg(feature = "relay")]
#[derive(Debug)]
pub struct PgJournal {
    held: Held,
    bell: Arc<Bell>,
    poll: Duration,
    poll_at: tokio::time::Instant,
}

#[cfg(feature = "relay")]
impl Drop for PgJournal {
    fn drop(&mut self) {
        let Held { store, lease, .. } = &self.held;
        let mut bells = store.shared.bells.lock();
        if bells.get(&lease.stream).is_some_and(|b| Arc::ptr_eq(b, &self.bell)) {
            bells.remove(&lease.stream);
        }
    }
}

#[cfg(feature = "relay")]
impl PgJournal {
    /// `lease` of `store`, taken for `duration` (and renewed for it from
    /// now on, for at least [`MIN_LEASE`](super::MIN_LEASE)); the outbox
    /// read every `poll` at the latest, and when a notification names the
    /// stream.
    pub fn new(store: PgStore, lease: Lease, duration: Duration, poll: Duration) -> Self {
        let bell = Arc::new(Bell { rung: AtomicBool::new(true), ..Bell::default() });
        store.shared.bells.lock().insert(lease.stream.clone(), bell.clone());
        let held = Held::new(store, lease, duration);
        let poll_at = tokio::time::Instant::now() + poll;
        PgJournal { held, bell, poll, poll_at }
    }

    /// The lease.
    pub fn lease(&self) -> &Lease {
        &self.held.lease
    }
}

#[cfg(feature = "relay")]
impl crate::JournalStore for PgJournal {
    async fn apply(&mut self, ready: &Ready, appends: &[(Sequence, Bytes)]) -> Result<(), StoreError> {
        self.held.store.apply(&self.held.lease, ready, appends).await
    }

    async fn appended(&mut self, from: Sequence, limit: usize) -> Result<Vec<(Sequence, Bytes)>, StoreError> {
        self.held.store.appended(&self.held.lease.stream, from, limit).await
    }

    async fn changed(&mut self) -> Result<bool, StoreError> {
        let now = tokio::time::Instant::now();
        let polled = now >= self.poll_at;
        if polled {
            self.poll_at = now + self.poll;
        }
        Ok(self.bell.rung() || polled)
    }

    async fn keep(&mut self) -> Result<(), StoreError> {
        self.held.holds()
    }

    fn lease(&self) -> Option<tokio::sync::watch::Receiver<Option<tokio::time::Instant>>> {
        Some(self.held.until())
    }

    fn news(&self) -> impl Future<Output = ()> + Send + 'static {
        let bell = self.bell.clone();
        async move { bell.notify.notified().await }
    }

    async fn close(&mut self) -> Result<(), StoreError> {
        self.held.release().await
    }

    fn stream(&self) -> &str {
        &self.held.lease.stream
    }
}

/// Takes `stream` for `lease` (see [`PgStore::take_stream`]; a lease below
/// [`MIN_LEASE`](super::MIN_LEASE) is taken as it), or with `None` any free
/// stream ([`PgStore::take`]), restores a cell from it and
/// starts its relay over a [`PgJournal`] on `store`'s connection (the
/// outbox read every 250 ms at the latest, beside the notifications).
/// Returns the stream's name with the cell and relay; `None` when the
/// stream (or every stream) is held by another worker whose lease still
/// runs.
///
/// # Errors
/// The store's, or stored data that breaks the core's rules
/// ([`StoreError::Restore`]).
///
/// # Panics
/// Outside a tokio runtime.
#[cfg(feature = "relay")]
pub async fn open_durable(
    cx: &egress_reactive::AsyncContext,
    store: &PgStore,
    stream: Option<&str>,
    lease: Duration,
    policy: egress_core::Policy,
    options: egress_reactive::CellOptions,
    config: crate::RelayConfig,
) -> Result<Option<(String, crate::Durable)>, StoreError> {
    open_durable_with(cx, store, stream, lease, egress_codec::Raw, policy, options, config).await
}

/// [`open_durable`] for a cell of `T`, whose records `codec` writes and
/// reads back, as the SQLite store's
/// [`open_durable_with`](crate::open_durable_with) (the same rules for a
/// record that does not decode or encode; applications append with
/// [`PgOutbox::append_encoded`](super::PgOutbox::append_encoded) and the same codec).
///
/// # Errors
/// [`open_durable`]'s, and [`StoreError::Undecodable`].
///
/// # Panics
/// Outside a tokio runtime.
#[cfg(feature = "relay")]
#[allow(clippy::too_many_arguments)]
pub async fn open_durable_with<T: Clone + Send + Sync + 'static>(
    cx: &egress_reactive::AsyncContext,
    store: &PgStore,
    stream: Option<&str>,
    lease: Duration,
    codec: impl egress_codec::Codec<T>,
    policy: egress_core::Policy,
    options: egress_reactive::CellOptions,
    config: crate::RelayConfig,
) -> Result<Option<(String, crate::Durable<T>)>, StoreError> {
    let lease = lease.clamp(super::MIN_LEASE, super::MAX_LEASE);
    let taken = match stream {
        Some(stream) => store.take_stream(stream, lease).await?,
        None => store.take(lease).await?,
    };
    let Some((taken, loaded)) = taken else { return Ok(None) };
    let name = taken.stream.clone();
    let durable = start(cx, store, taken, loaded, lease, codec, policy, options, config)?;
    Ok(Some((name, durable)))
}

/// Takes up to `max` free streams ([`PgStore::take_many`]: two statements
/// for all of them) and starts each as [`open_durable`] starts one, all on
/// `store`'s connection. Returns each stream's name with its cell and
/// relay, or with the error that kept it from starting (stored values out
/// of range, or data that breaks the core's rules: that stream's lease is
/// left to run out, and the others run).
///
/// # Errors
/// The store's, when the take itself fails.
///
/// # Panics
/// Outside a tokio runtime.
#[cfg(feature = "relay")]
pub async fn open_durable_many(
    cx: &egress_reactive::AsyncContext,
    store: &PgStore,
    max: usize,
    lease: Duration,
    policy: egress_core::Policy,
    options: egress_reactive::CellOptions,
    config: crate::RelayConfig,
) -> Result<Vec<(String, Result<crate::Durable, StoreError>)>, StoreError> {
    let lease = lease.clamp(super::MIN_LEASE, super::MAX_LEASE);
    let taken = store.take_many(max, lease).await?;
    Ok(taken
        .into_iter()
        .map(|(name, read)| {
            let started = read.and_then(|(taken, loaded)| {
                start(cx, store, taken, loaded, lease, egress_codec::Raw, policy, options.clone(), config.clone())
            });
            (name, started)
        })
        .collect())
}

/// A cell restored from `loaded` and its relay over `taken`.
#[cfg(feature = "relay")]
#[allow(clippy::too_many_arguments)]
fn start<T: Clone + Send + Sync + 'static>(
    cx: &egress_reactive::AsyncContext,
    store: &PgStore,
    taken: Lease,
    loaded: crate::Loaded,
    lease: Duration,
    codec: impl egress_codec::Codec<T>,
    policy: egress_core::Policy,
    options: egress_reactive::CellOptions,
    config: crate::RelayConfig,
) -> Result<crate::Durable<T>, StoreError> {
    let loaded = loaded.decode(&taken.stream, &codec)?;
    let core = egress_core::EgressCore::restore(policy, loaded.restored)?;
    let cell = egress_reactive::AsyncEgressCell::from_core(cx, core, options.incarnation(loaded.incarnation));
    let journal = PgJournal::new(store.clone(), taken, lease, Duration::from_millis(250));
    let relay = crate::Relay::spawn_with(cx, &cell, journal, codec, config);
    Ok(crate::Durable { cell, relay })
}

#[cfg(all(test, feature = "relay"))]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A journal's bell is in the store's registry (notifications of its
    /// stream ring it) while it lives, and gone once it is dropped: the
    /// registry holds one bell per journal alive, not one per stream ever
    /// journaled. A newer journal's bell is not taken by an older one's
    /// drop.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_journal_takes_its_bell_and_only_its_bell_out_of_the_registry() {
        let Some(url) = egress_testkit::pg_database("egress_journal_bell").await else { return };
        let store = PgStore::connect(&url, "w1").await.unwrap();
        let long = Duration::from_secs(600);
        let (lease, _) = store.take_stream("s", long).await.unwrap().unwrap();
        let journal = PgJournal::new(store.clone(), lease.clone(), long, long);
        assert!(store.shared.bells.lock().contains_key("s"));
        drop(journal);
        assert!(!store.shared.bells.lock().contains_key("s"), "the dropped journal's bell stayed");
        let older = PgJournal::new(store.clone(), lease.clone(), long, long);
        let newer = PgJournal::new(store.clone(), lease, long, long);
        drop(older);
        let bells = store.shared.bells.lock();
        assert!(bells.get("s").is_some_and(|b| Arc::ptr_eq(b, &newer.bell)), "the newer journal's bell stays");
    }
}
