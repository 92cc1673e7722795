//! Durable latest projections on PostgreSQL: the projection's own row is a
//! stream marked latest (its lanes `''`, the name of no lanes': no plain
//! take, plain write or outbox append meets it, and no lanes' write under
//! its lease passes `egress_apply_lanes`'s check, which wants the lanes'
//! own name), whose lease fences its writes and whose generation is the
//! projection's; each key is a row of
//! `egress_latest_key`, as on SQLite (see [`SqliteStore::load_latest`](crate::SqliteStore::load_latest)).

use std::time::Duration;

use bytes::Bytes;
use egress_core::{Generation, LatestReady, LatestWrite};

use super::{Lease, PgStore, busy_or};
use crate::StoreError;
use crate::latest::{LoadedLatest, restored_key, values_match, write_keys};
use crate::stored::{fresh_incarnation, restorable_generation, to_i64, to_u64};

impl PgStore {
    /// Takes the latest projection `name` (creating its row if it has
    /// none) for `lease` if no worker holds it, and loads it for a restart:
    /// the generation this take restores at (one above the last take's,
    /// stored under the lease before it returns) and every key's row.
    /// `None` while another worker's lease on it runs (or this store's
    /// own). As a stream's lease, it is renewed by a [`PgLatest`]'s
    /// keeper, or by hand with [`renew`](Self::renew).
    ///
    /// # Errors
    /// PostgreSQL's error; [`StoreError::LatestKind`] when a stream or
    /// lanes have the name; [`StoreError::Fenced`] when another worker
    /// took the projection between the take and the generation's write; a
    /// stored row out of range or a key serde cannot read as a `K`, as
    /// [`SqliteStore::load_latest`](crate::SqliteStore::load_latest)'s.
    pub async fn take_latest<K: serde::Serialize + serde::de::DeserializeOwned>(
        &self,
        name: &str,
        lease: Duration,
    ) -> Result<Option<(Lease, LoadedLatest<K>)>, StoreError> {
        crate::lanes::plain_name(name)?;
        let client = &self.shared.client;
        client
            .execute(
                "INSERT INTO egress_stream (stream, incarnation, lanes, latest)
                 SELECT $1, $2, '', true WHERE NOT EXISTS (SELECT 1 FROM egress_stream WHERE stream = $1)
                 ON CONFLICT (stream) DO NOTHING",
                &[&name, &fresh_incarnation().as_slice()],
            )
            .await
            .map_err(|e| busy_or(name, e))?;
        let marked = client.query_one("SELECT latest FROM egress_stream WHERE stream = $1", &[&name]).await?;
        if !marked.get::<_, bool>(0) {
            return Err(StoreError::LatestKind { name: name.to_owned(), latest: false });
        }
        let (sent, numbers) = self.take_leases(Some(name), Some(""), 1, lease).await?;
        let Some(number) = numbers.into_values().next() else { return Ok(None) };
        let lease = Lease { stream: name.to_owned(), number: number?, sent };
        // Read once the take committed: no write of the previous owner
        // commits after it (each share-locks the lease row).
        let stored: i64 =
            client.query_one("SELECT generation FROM egress_stream WHERE stream = $1", &[&name]).await?.get(0);
        let generation = Generation(restorable_generation(to_u64("generation", stored)?)?.0 + 1);
        let raised = client
            .execute(
                "WITH held AS (SELECT 1 FROM egress_lease WHERE stream = $1 AND lease = $2 FOR SHARE)
                 UPDATE egress_stream SET generation = $3 WHERE stream = $1 AND latest AND EXISTS (SELECT 1 FROM held)",
                &[&name, &to_i64("lease", lease.number)?, &to_i64("generation", generation.0)?],
            )
            .await
            .map_err(|e| busy_or(name, e))?;
        if raised == 0 {
            return Err(StoreError::Fenced { stream: name.to_owned() });
        }
        let rows = client
            .query(
                "SELECT key, version, value, durable_through FROM egress_latest_key WHERE name = $1 ORDER BY key",
                &[&name],
            )
            .await?;
        let keys = rows
            .iter()
            .map(|row| restored_key(name, row.get(0), row.get(1), row.get(2), row.get(3)))
            .collect::<Result<_, _>>()?;
        Ok(Some((lease, LoadedLatest { generation, keys })))
    }

    /// Writes one [`LatestReady`] of the projection `lease` holds as one
    /// transaction (one call of the `egress_apply_latest` function, one
    /// round trip), as [`SqliteStore::apply_latest`](crate::SqliteStore::apply_latest)
    /// does: each `Delete` its row gone, each `Put` its row (`values[i]`
    /// the encoded value of `ready.writes[i]`, present exactly for a `Put`
    /// with a newest version). Commits with `synchronous_commit = off`
    /// unless a desire is written (it is claimed only once stored; a
    /// frontier lost in a crash costs one write the sink already has, which
    /// its version makes idempotent).
    ///
    /// # Errors
    /// [`StoreError::Fenced`] when the projection was taken over;
    /// [`StoreError::LatestWrites`] (values that do not match the writes);
    /// a key serde cannot write or written twice ([`StoreError::LatestKey`]),
    /// or a number out of range;
    /// [`StoreError::Busy`] when another transaction holds its lease row;
    /// PostgreSQL's error. Nothing is written then.
    pub async fn apply_latest<K: serde::Serialize>(
        &self,
        lease: &Lease,
        ready: &LatestReady<K>,
        values: &[Option<Bytes>],
    ) -> Result<(), StoreError> {
        values_match(ready, values)?;
        let name = lease.stream.as_str();
        let texts = write_keys(name, ready)?;
        let n = ready.writes.len();
        let mut forget = Vec::new();
        let (mut keys, mut versions, mut bytes, mut frontiers) =
            (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        for ((write, value), key) in ready.writes.iter().zip(values).zip(texts) {
            match write {
                LatestWrite::Put { newest, durable_through, .. } => {
                    keys.push(key);
                    versions.push(newest.map(|v| to_i64("version", v.0)).transpose()?);
                    bytes.push(value.as_deref());
                    frontiers.push(durable_through.map(|v| to_i64("durable_through", v.0)).transpose()?);
                }
                LatestWrite::Delete { .. } => forget.push(key),
            }
        }
        let must_sync = values.iter().any(Option::is_some);
        let row = self
            .shared
            .client
            .query_one(
                &self.shared.statements.apply_latest,
                &[&name, &to_i64("lease", lease.number)?, &forget, &keys, &versions, &bytes, &frontiers, &must_sync],
            )
            .await
            .map_err(|e| busy_or(name, e))?;
        if row.try_get::<_, bool>(0)? {
            return Err(StoreError::Fenced { stream: name.to_owned() });
        }
        Ok(())
    }
}

#[cfg(feature = "relay")]
pub use journal::{PgLatest, open_durable_latest};

#[cfg(feature = "relay")]
mod journal {
    use std::num::NonZeroUsize;
    use std::time::Duration;

    use bytes::Bytes;
    use egress_codec::Codec;
    use egress_core::{Latest, LatestReady, Policy};
    use egress_reactive::{AsyncContext, AsyncLatestCell, CellOptions};

    use crate::postgres::keeper::Held;
    use crate::postgres::{Lease, MAX_LEASE, MIN_LEASE, PgStore};
    use crate::{DurableLatest, LatestJournal, LatestRelay, RelayConfig, StoreError};

    /// A latest projection a [`PgStore`] has taken
    /// ([`PgStore::take_latest`]), as a [`LatestJournal`]: each write one
    /// call of `egress_apply_latest` on the store's connection, fenced by
    /// the projection's lease, which the store's lease keeper renews with
    /// its other leases. A lease lost (another worker took the projection)
    /// reads as [`StoreError::Fenced`] at once, without a round trip.
    /// Closing it gives the lease up.
    #[derive(Debug)]
    pub struct PgLatest(Held);

    impl PgLatest {
        /// The projection `lease` holds on `store`, taken for `duration`
        /// (and renewed for it from now on, for at least
        /// [`MIN_LEASE`](super::super::MIN_LEASE)).
        pub fn new(store: PgStore, lease: Lease, duration: Duration) -> Self {
            PgLatest(Held::new(store, lease, duration))
        }

        /// The lease.
        pub fn lease(&self) -> &Lease {
            &self.0.lease
        }
    }

    impl<K: serde::Serialize + Send + Sync + 'static> LatestJournal<K> for PgLatest {
        fn name(&self) -> &str {
            &self.0.lease.stream
        }

        async fn apply(&self, ready: LatestReady<K>, values: Vec<Option<Bytes>>) -> Result<(), StoreError> {
            self.0.store.apply_latest(&self.0.lease, &ready, &values).await
        }

        async fn owns(&self) -> Result<(), StoreError> {
            self.0.holds()
        }

        async fn close(&self) {
            let _ = self.0.release().await;
        }
    }

    /// Takes the latest projection `name` on `store` for `lease`
    /// ([`PgStore::take_latest`]; a lease below [`MIN_LEASE`] is taken as
    /// it), restores an [`AsyncLatestCell`] from it and starts its
    /// [`LatestRelay`] over a [`PgLatest`], as the SQLite store's
    /// [`open_durable_latest`](crate::open_durable_latest) does: each key
    /// at its stored frontier, with its stored desire claimable at once,
    /// nothing in flight, no backoff carried over; at a generation above
    /// the last take's. `None` while another worker's lease on the
    /// projection runs.
    ///
    /// A take whose projection does not restore (a value `codec` cannot
    /// read, more keys than `max_keys`) keeps the lease until it runs out,
    /// as a stream's does: no worker was holding the projection (the take
    /// found the lease free).
    ///
    /// # Errors
    /// [`PgStore::take_latest`]'s, [`StoreError::LatestValue`], or
    /// [`StoreError::LatestRestore`].
    ///
    /// # Panics
    /// Outside a tokio runtime.
    #[allow(clippy::too_many_arguments)]
    pub async fn open_durable_latest<K, V>(
        cx: &AsyncContext,
        store: &PgStore,
        name: &str,
        lease: Duration,
        codec: impl Codec<V>,
        policy: Policy,
        max_keys: NonZeroUsize,
        options: CellOptions,
        config: RelayConfig,
    ) -> Result<Option<DurableLatest<K, V>>, StoreError>
    where
        K: Ord + Clone + serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
        V: Clone + PartialEq + Send + Sync + 'static,
    {
        let lease = lease.clamp(MIN_LEASE, MAX_LEASE);
        let Some((taken, loaded)) = store.take_latest::<K>(name, lease).await? else { return Ok(None) };
        let loaded = loaded.decode(name, &codec)?;
        let latest = Latest::restore_journaled(policy, max_keys, loaded.generation, loaded.keys)?;
        let cell = AsyncLatestCell::from_latest(cx, latest, options);
        let journal = PgLatest::new(store.clone(), taken, lease);
        let relay = LatestRelay::spawn_with(cx, &cell, journal, codec, config);
        Ok(Some(DurableLatest { cell, relay }))
    }
}
