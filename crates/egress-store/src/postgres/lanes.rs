//! Durable lanes on PostgreSQL: the lanes' own row is a stream named after
//! them, whose lease fences every lane (one take, one renewal, one fence
//! for all of them), whose generation is theirs and whose counter is their
//! next ordinal; each lane is a stream marked with its lanes and its key
//! (as on SQLite, see [`lane_stream`](crate::lane_stream)), each record
//! with its ordinal. A plain take ([`PgStore::take`]) never takes lanes or
//! a lane's stream, and a plain write ([`PgStore::apply`]) never writes
//! one.

use std::time::Duration;

use bytes::Bytes;
use egress_core::{LanesReady, Sequence};

use super::{Lease, PgStore, busy_or};
use crate::StoreError;
use crate::lanes::{LoadedLanes, StoredLane, assemble, checked_names};
use crate::stored::{dead_code, fresh_incarnation, incarnation_of, to_i64, to_u64};

impl PgStore {
    /// Takes the lanes `lanes` (creating their row if they have none) for
    /// `lease` if no worker holds them, and loads them for a restart: their
    /// incarnation, generation and next ordinal, and every lane's records
    /// above its watermark, each with its ordinal. `None` while another
    /// worker's lease on them runs (or this store's own). As a stream's
    /// lease, it is renewed by a [`PgLanes`]'s keeper, or by hand with
    /// [`renew`](Self::renew).
    ///
    /// # Errors
    /// PostgreSQL's error; [`StoreError::OtherKind`] when a plain stream
    /// (or a lane's) has the name, [`StoreError::LatestKind`] when a latest
    /// projection has it; a stored value out of range; a lane key serde cannot
    /// read as a `K`, or one that does not read back as stored
    /// ([`StoreError::LaneKey`]); a lane's record without its ordinal.
    pub async fn take_lanes<K: serde::Serialize + serde::de::DeserializeOwned>(
        &self,
        lanes: &str,
        lease: Duration,
    ) -> Result<Option<(Lease, LoadedLanes<K>)>, StoreError> {
        crate::lanes::plain_name(lanes)?;
        let client = &self.shared.client;
        client
            .execute(
                "INSERT INTO egress_stream (stream, incarnation, lanes)
                 SELECT $1, $2, $1 WHERE NOT EXISTS (SELECT 1 FROM egress_stream WHERE stream = $1)
                 ON CONFLICT (stream) DO NOTHING",
                &[&lanes, &fresh_incarnation().as_slice()],
            )
            .await
            .map_err(|e| busy_or(lanes, e))?;
        let marked = client.query_one("SELECT lanes, latest FROM egress_stream WHERE stream = $1", &[&lanes]).await?;
        if marked.get::<_, bool>(1) {
            return Err(StoreError::LatestKind { name: lanes.to_owned(), latest: true });
        }
        if marked.get::<_, Option<&str>>(0) != Some(lanes) {
            return Err(StoreError::OtherKind { stream: lanes.to_owned(), lanes: marked.get(0) });
        }
        let (sent, numbers) = self.take_leases(Some(lanes), Some(lanes), 1, lease).await?;
        let Some(number) = numbers.into_values().next() else { return Ok(None) };
        let lease = Lease { stream: lanes.to_owned(), number: number?, sent };
        // Read once the take committed: no write of the previous owner
        // commits after it (each share-locks the lease row).
        let row = client
            .query_one("SELECT incarnation, generation, next_sequence FROM egress_stream WHERE stream = $1", &[&lanes])
            .await?;
        let incarnation = incarnation_of(&row.get::<_, Vec<u8>>(0))?;
        let generation = to_u64("generation", row.get(1))?;
        let next_ordinal = to_u64("next_ordinal", row.get(2))?;
        let rows = client
            .query(
                "SELECT stream, lane, generation, next_sequence, acked_through FROM egress_stream
                 WHERE lanes = $1 AND lane IS NOT NULL ORDER BY stream",
                &[&lanes],
            )
            .await?;
        let mut stored = Vec::with_capacity(rows.len());
        for row in &rows {
            stored.push(StoredLane {
                stream: row.get(0),
                key: row.get(1),
                generation: to_u64("generation", row.get(2))?,
                next_sequence: to_u64("next_sequence", row.get(3))?,
                acked: row.get::<_, Option<i64>>(4).map(|a| to_u64("acked_through", a)).transpose()?,
                records: Vec::new(),
                skipped: Vec::new(),
                ordinals: Vec::new(),
            });
        }
        let ranges: Vec<_> = stored.iter().map(|l| (l.stream.clone(), l.acked, l.next_sequence)).collect();
        let mut read = self.load_ranges(&ranges).await?;
        for lane in &mut stored {
            if let Some(records) = read.remove(&lane.stream) {
                let records = records?;
                (lane.records, lane.ordinals, lane.skipped) = (records.records, records.ordinals, records.skipped);
            }
        }
        let loaded = assemble(lanes, incarnation, generation, next_ordinal, stored)?;
        Ok(Some((lease, loaded)))
    }

    /// Writes one [`LanesReady`] of the lanes `lease` holds as one
    /// transaction (one call of the `egress_apply_lanes` function, one
    /// round trip), as [`SqliteStore::apply_lanes`](crate::SqliteStore::apply_lanes)
    /// does: the streams of the lanes it forgets deleted, each lane's
    /// `Ready` written with each append's ordinal, the lanes' next ordinal
    /// and generation raised. Commits with `synchronous_commit = off`
    /// unless `ready.must_sync`. Dead letters stay, as a stream's do, until
    /// their lane is freed: a lane is freed only when idle (a held dead
    /// letter keeps it busy), and its stream goes with its tombstones.
    ///
    /// `appends[i]` are the payloads of `ready.lanes[i]`'s appends, in
    /// order.
    ///
    /// # Errors
    /// [`StoreError::Fenced`] when the lanes were taken over; payloads
    /// that do not match the appends; a lane's counter moved under it
    /// ([`StoreError::Conflict`]); [`StoreError::Busy`] when another
    /// transaction holds a row it needs; PostgreSQL's error. Nothing is
    /// written then.
    pub async fn apply_lanes<K: serde::Serialize>(
        &self,
        lease: &Lease,
        ready: &LanesReady<K>,
        appends: &[Vec<(Sequence, Bytes)>],
    ) -> Result<(), StoreError> {
        let lanes = lease.stream.as_str();
        let (names, forget) = checked_names(lanes, ready, appends)?;
        let n = ready.lanes.len();
        let (mut streams, mut keys) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut starts, mut counts, mut generations, mut acked) =
            (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut seqs, mut payloads, mut ordinals) = (Vec::new(), Vec::new(), Vec::new());
        let (mut dead_lanes, mut dead_seqs, mut reasons, mut held) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, ((part, bytes), (stream, key))) in ready.lanes.iter().zip(appends).zip(&names).enumerate() {
            streams.push(stream.as_str());
            keys.push(key.as_str());
            starts.push(to_i64("sequence", part.ready.appends.start.0)?);
            counts.push(
                i32::try_from(bytes.len())
                    .map_err(|_| StoreError::OutOfRange { what: "appends of one lane", value: bytes.len() as i128 })?,
            );
            generations.push(part.ready.generation.map(|g| to_i64("generation", g.0)).transpose()?);
            acked.push(part.ready.acked_through.map(|a| to_i64("acked_through", a.0)).transpose()?);
            for ((sequence, payload), ordinal) in bytes.iter().zip(&part.ordinals) {
                seqs.push(to_i64("sequence", sequence.0)?);
                payloads.push(payload.as_ref());
                ordinals.push(to_i64("ordinal", ordinal.0)?);
            }
            // The lane's index, from 1 as SQL's arrays count.
            let lane = i32::try_from(i + 1).map_err(|_| StoreError::OutOfRange { what: "lanes", value: n as i128 })?;
            for (sequence, mark) in &part.ready.dead {
                dead_lanes.push(lane);
                dead_seqs.push(to_i64("sequence", sequence.0)?);
                reasons.push(mark.map(|m| i16::try_from(dead_code(m.reason)).unwrap_or(i16::MAX)));
                held.push(mark.map(|m| m.held));
            }
        }
        let forget: Vec<&str> = forget.iter().map(String::as_str).collect();
        let next_ordinal = to_i64("next_ordinal", ready.next_ordinal.0)?;
        let generation = ready.generation.map(|g| to_i64("generation", g.0)).transpose()?;
        let row = self
            .shared
            .client
            .query_one(
                &self.shared.statements.apply_lanes,
                &[
                    &lanes,
                    &to_i64("lease", lease.number)?,
                    &forget,
                    &streams,
                    &keys,
                    &starts,
                    &counts,
                    &generations,
                    &acked,
                    &seqs,
                    &payloads,
                    &ordinals,
                    &dead_lanes,
                    &dead_seqs,
                    &reasons,
                    &held,
                    &next_ordinal,
                    &generation,
                    &ready.must_sync,
                ],
            )
            .await
            .map_err(|e| busy_or(lanes, e))?;
        if row.try_get::<_, bool>(0)? {
            return Err(StoreError::Fenced { stream: lanes.to_owned() });
        }
        if let Some(stream) = row.try_get::<_, Option<String>>(1)? {
            let stored = to_u64("next_sequence", row.try_get::<_, i64>(2)?)?;
            let expected = names
                .iter()
                .zip(&ready.lanes)
                .find(|((s, _), _)| *s == stream)
                .map_or(0, |(_, part)| part.ready.appends.start.0);
            return Err(StoreError::Conflict { stream, stored, expected });
        }
        Ok(())
    }
}

#[cfg(feature = "relay")]
pub use journal::{PgLanes, open_durable_lanes};

#[cfg(feature = "relay")]
mod journal {
    use std::time::Duration;

    use crate::postgres::keeper::Held;
    use crate::postgres::{Lease, MAX_LEASE, MIN_LEASE, PgStore};
    use crate::{DurableLanes, LanesJournal, LanesRelay, RelayConfig, StoreError};
    use bytes::Bytes;
    use egress_codec::Codec;
    use egress_core::{LaneKey, Lanes, LanesPolicy, LanesReady, Sequence};
    use egress_reactive::{AsyncContext, AsyncLanesCell, CellOptions};

    /// Lanes a [`PgStore`] has taken ([`PgStore::take_lanes`]), as a
    /// [`LanesJournal`]: each write one call of `egress_apply_lanes` on the
    /// store's connection, fenced by the lanes' lease, which the store's
    /// lease keeper renews with its other leases (see
    /// [`PgJournal`](super::super::PgJournal)). A lease lost (another worker
    /// took the lanes) reads as [`StoreError::Fenced`] at once, without a
    /// round trip. Closing it gives the lease up.
    #[derive(Debug)]
    pub struct PgLanes(Held);

    impl PgLanes {
        /// The lanes `lease` holds on `store`, taken for `duration` (and
        /// renewed for it from now on, for at least
        /// [`MIN_LEASE`](super::super::MIN_LEASE)).
        pub fn new(store: PgStore, lease: Lease, duration: Duration) -> Self {
            PgLanes(Held::new(store, lease, duration))
        }

        /// The lease.
        pub fn lease(&self) -> &Lease {
            &self.0.lease
        }
    }

    impl<K: serde::Serialize + Send + Sync + 'static> LanesJournal<K> for PgLanes {
        fn lanes(&self) -> &str {
            &self.0.lease.stream
        }

        async fn apply(&self, ready: LanesReady<K>, appends: Vec<Vec<(Sequence, Bytes)>>) -> Result<(), StoreError> {
            self.0.store.apply_lanes(&self.0.lease, &ready, &appends).await
        }

        async fn owns(&self) -> Result<(), StoreError> {
            self.0.holds()
        }

        async fn close(&self) {
            let _ = self.0.release().await;
        }
    }

    /// Takes the lanes `lanes` on `store` for `lease` ([`PgStore::take_lanes`];
    /// a lease below [`MIN_LEASE`] is taken as it), restores an
    /// [`AsyncLanesCell`] from them and starts its [`LanesRelay`] over a
    /// [`PgLanes`], as the SQLite store's
    /// [`open_durable_lanes`](crate::open_durable_lanes) does: every lane
    /// with each record not yet acknowledged pending again under its
    /// sequence and ordinal (nothing in flight, no backoff carried over),
    /// released in the original order across lanes. `None` while another
    /// worker's lease on the lanes runs.
    ///
    /// A take whose lanes do not restore (a record `codec` cannot read,
    /// more lanes than `policy` allows) keeps the lease until it runs out,
    /// as a stream's does ([`open_durable`](super::super::open_durable)):
    /// no worker was holding the lanes (the take found the lease free).
    ///
    /// # Errors
    /// [`PgStore::take_lanes`]'s, [`StoreError::Undecodable`], or
    /// [`StoreError::LanesRestore`].
    ///
    /// # Panics
    /// Outside a tokio runtime.
    #[allow(clippy::too_many_arguments)]
    pub async fn open_durable_lanes<K, T>(
        cx: &AsyncContext,
        store: &PgStore,
        lanes: &str,
        lease: Duration,
        codec: impl Codec<T>,
        policy: LanesPolicy,
        options: CellOptions,
        config: RelayConfig,
    ) -> Result<Option<DurableLanes<K, T>>, StoreError>
    where
        K: LaneKey + serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
        T: Clone + Send + Sync + 'static,
    {
        let lease = lease.clamp(MIN_LEASE, MAX_LEASE);
        let Some((taken, loaded)) = store.take_lanes::<K>(lanes, lease).await? else { return Ok(None) };
        let loaded = loaded.decode(lanes, &codec)?;
        let restored = Lanes::restore(policy, loaded.restored)?;
        let cell = AsyncLanesCell::from_lanes(cx, restored, options.incarnation(loaded.incarnation));
        let journal = PgLanes::new(store.clone(), taken, lease);
        let relay = LanesRelay::spawn_with(cx, &cell, journal, codec, config);
        Ok(Some(DurableLanes { cell, relay }))
    }
}
