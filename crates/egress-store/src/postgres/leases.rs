//! Stream leases: taken with `SKIP LOCKED` (one, one named, or many in one
//! statement), renewed, released; each take raises the lease number that
//! fences the taker's writes. A lease is a row of `egress_lease`, apart
//! from the stream's row: an application's transaction holding the
//! stream's row (an append not yet committed) delays no take and no
//! renewal.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use egress_core::{Ordinal, RestoredRecord, Sequence};

use super::store::Shared;
use super::{PgStore, busy_or, ensure_stream};
use crate::stored::{dead_of, incarnation_of, restorable_generation, to_i64, to_u64};
use crate::{Loaded, StoreError};

/// A stream a [`PgStore`] has taken: its name and the lease number that
/// fences its writes. Valid until another store takes the stream, which it
/// can once the lease's duration has passed without a
/// [`renew`](PgStore::renew).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The stream.
    pub stream: String,
    /// The stream's lease number at the take: every write under this lease
    /// carries it.
    pub number: u64,
    /// When the take was sent: the database starts the lease's duration
    /// no earlier (at the take's execution), so no other store can take
    /// the stream before this instant plus the duration. A bound on this
    /// process's clock that needs no agreement with the database's.
    pub sent: tokio::time::Instant,
}

/// What a renewal did to one lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Renewal {
    /// Extended.
    Renewed,
    /// Not extended: another session held its row (a take in progress, or
    /// a lock taken by hand); still this store's. Try again.
    Busy,
    /// Another store took the stream (its number is not the lease's).
    Lost,
}

/// What [`PgStore::load_ranges`] read of one stream: its records in
/// order, each one's ordinal (`None` outside lanes), the dead letters it
/// skipped.
#[derive(Debug, Default)]
pub(super) struct StreamRead {
    pub(super) records: Vec<RestoredRecord<Bytes>>,
    pub(super) ordinals: Vec<Option<Ordinal>>,
    pub(super) skipped: Vec<(Sequence, egress_core::DeadReason)>,
}

/// One stream a [`PgStore::take_many`] took: its name, and its lease and
/// what was loaded, or why it could not be loaded.
pub type Taken = (String, Result<(Lease, Loaded), StoreError>);

impl PgStore {
    /// Takes one stream that no worker holds (never taken, released, or its
    /// lease run out) for `lease`, and loads it; `None` when every stream
    /// is held. Streams whose lease ran out longest ago go first.
    ///
    /// # Errors
    /// PostgreSQL's error, or a stored value out of range.
    pub async fn take(&self, lease: Duration) -> Result<Option<(Lease, Loaded)>, StoreError> {
        self.take_where(None, 1, lease).await?.pop().map(|(_, read)| read).transpose()
    }

    /// Takes up to `max` streams that no worker holds, as
    /// [`take`](Self::take) takes one, with one statement, and loads them
    /// with one more; ordered by name. A stream whose stored values are
    /// out of range comes back as its error, and the others load: its lease
    /// is left to run out (so that it does not come straight back to the
    /// next take), and whoever takes it next meets the same error until
    /// someone repairs it.
    ///
    /// # Errors
    /// PostgreSQL's error: the streams taken then stay leased until their
    /// leases run out.
    pub async fn take_many(&self, max: usize, lease: Duration) -> Result<Vec<Taken>, StoreError> {
        self.take_where(None, max, lease).await
    }

    /// Takes `stream` (creating it if it has no row) for `lease` if no
    /// worker holds it, and loads it; `None` when another worker's lease on
    /// it is still running (or this store's own).
    ///
    /// # Errors
    /// PostgreSQL's error, a stored value out of range,
    /// [`StoreError::NoLease`] for a stream whose lease row was deleted, or
    /// [`StoreError::OtherKind`] for lanes or a lane's stream (taken with
    /// [`take_lanes`](Self::take_lanes)), [`StoreError::LatestKind`] for a
    /// latest projection (taken with [`take_latest`](Self::take_latest)).
    pub async fn take_stream(&self, stream: &str, lease: Duration) -> Result<Option<(Lease, Loaded)>, StoreError> {
        crate::lanes::plain_name(stream)?;
        ensure_stream(&self.shared.client, stream).await.map_err(|e| match e {
            StoreError::Postgres(e) => busy_or(stream, e),
            other => other,
        })?;
        let taken = self.take_where(Some(stream), 1, lease).await?.pop().map(|(_, read)| read).transpose()?;
        if taken.is_none() {
            let row = self
                .shared
                .client
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM egress_lease WHERE stream = $1),
                            (SELECT lanes FROM egress_stream WHERE stream = $1),
                            coalesce((SELECT latest FROM egress_stream WHERE stream = $1), false)",
                    &[&stream],
                )
                .await?;
            if row.get::<_, bool>(2) {
                return Err(StoreError::LatestKind { name: stream.to_owned(), latest: true });
            }
            if let Some(lanes) = row.get::<_, Option<String>>(1) {
                return Err(StoreError::OtherKind { stream: stream.to_owned(), lanes: Some(lanes) });
            }
            if !row.get::<_, bool>(0) {
                return Err(StoreError::NoLease { stream: stream.to_owned() });
            }
        }
        Ok(taken)
    }

    /// The take (one statement), then the load of what it took (one more):
    /// a stream's records below its counter are committed by the time the
    /// take reads the counter (an append holds the stream's row until its
    /// transaction ends), and only the lease holder prunes, so the load
    /// needs no transaction shared with the take.
    async fn take_where(&self, stream: Option<&str>, max: usize, lease: Duration) -> Result<Vec<Taken>, StoreError> {
        let (sent, mut numbers) = self.take_leases(stream, None, max, lease).await?;
        if numbers.is_empty() {
            return Ok(Vec::new());
        }
        let Shared { client, statements, .. } = &*self.shared;
        // The streams' state, read once the take committed (a write of the
        // previous owner share-locks the lease row, so the take skipped
        // any stream with a write in progress, and no later write of the
        // previous owner passes the new number).
        let names: Vec<&str> = numbers.keys().map(String::as_str).collect();
        let states = client.query(&statements.state, &[&names]).await?;
        // Each stream read on its own, so that a value out of range fails
        // that stream only; the ranges to load of those read well.
        let mut taken: Vec<Taken> = Vec::with_capacity(states.len());
        let mut ranges = Vec::new();
        for row in &states {
            let stream: String = row.get(0);
            let Some(number) = numbers.remove(&stream) else { continue };
            let read = || {
                let number = number?;
                let incarnation = incarnation_of(&row.get::<_, Vec<u8>>(1))?;
                let generation = restorable_generation(to_u64("generation", row.get(2))?)?;
                let next = to_u64("next_sequence", row.get(3))?;
                let acked = row.get::<_, Option<i64>>(4).map(|a| to_u64("acked_through", a)).transpose()?;
                let loaded = Loaded::new(incarnation, generation, Sequence(next), acked.map(Sequence), Vec::new());
                Ok((Lease { stream: stream.clone(), number, sent }, loaded, acked))
            };
            let read = read().map(|(lease, loaded, acked)| {
                ranges.push((stream.clone(), acked, loaded.restored.next_sequence.0));
                (lease, loaded)
            });
            taken.push((stream, read));
        }
        let mut read = self.load_ranges(&ranges).await?;
        for (stream, taken) in &mut taken {
            let Ok((_, loaded)) = taken else { continue };
            match read.remove(stream.as_str()) {
                Some(Ok(records)) => {
                    loaded.restored.records = records.records;
                    loaded.restored.skipped = records.skipped;
                }
                Some(Err(e)) => *taken = Err(e),
                None => {}
            }
        }
        taken.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(taken)
    }

    /// Takes up to `max` leases (of `stream` only, when given) of streams
    /// whose `lanes` column is `lanes` (plain streams for `None`), with one
    /// statement: when it was sent, and each stream's new lease number.
    pub(super) async fn take_leases(
        &self,
        stream: Option<&str>,
        lanes: Option<&str>,
        max: usize,
        lease: Duration,
    ) -> Result<(tokio::time::Instant, HashMap<String, Result<u64, StoreError>>), StoreError> {
        let Shared { client, statements, worker, .. } = &*self.shared;
        let millis = lease_millis(lease);
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        let sent = tokio::time::Instant::now();
        let rows = client.query(&statements.take, &[worker, &millis, &stream, &max, &lanes]).await?;
        let mut numbers = HashMap::with_capacity(rows.len());
        for row in &rows {
            let stream: String = row.get(0);
            let (before, expired) = (row.get::<_, Option<&str>>(2), row.get::<_, Option<i64>>(3));
            taken_from(&stream, worker, before, expired);
            numbers.insert(stream, to_u64("lease", row.get(1)));
        }
        Ok((sent, numbers))
    }

    /// The records of each stream above its watermark (`acked`) and below
    /// its counter, with their ordinals, and the dead letters it skipped
    /// (the newest [`SKIPPED_MEMORY`](egress_core::SKIPPED_MEMORY) at or
    /// below the watermark): two statements for all of them. A stream
    /// with a stored value out of range reads as its error.
    pub(super) async fn load_ranges(
        &self,
        ranges: &[(String, Option<u64>, u64)],
    ) -> Result<HashMap<String, Result<StreamRead, StoreError>>, StoreError> {
        let Shared { client, statements, .. } = &*self.shared;
        let mut read: HashMap<String, Result<StreamRead, StoreError>> = HashMap::with_capacity(ranges.len());
        let (mut names, mut from, mut to) = (Vec::new(), Vec::new(), Vec::new());
        for (stream, acked, next) in ranges {
            let range = to_i64("sequence", acked.map_or(0, |a| a.saturating_add(1)))
                .and_then(|first| Ok((first, to_i64("next_sequence", *next)?)));
            match range {
                Ok((first, until)) => {
                    names.push(stream.as_str());
                    from.push(first);
                    to.push(until);
                    read.insert(stream.clone(), Ok(StreamRead::default()));
                }
                Err(e) => {
                    read.insert(stream.clone(), Err(e));
                }
            }
        }
        if names.is_empty() {
            return Ok(read);
        }
        // In one statement; matched by name, not by the order of both
        // lists (the database's collation need not sort names as Rust
        // does).
        for row in client.query(&statements.load, &[&names, &from, &to]).await? {
            let Some(Ok(stream)) = read.get_mut(row.get::<_, &str>(0)) else { continue };
            let record = || {
                let sequence = Sequence(to_u64("seq", row.get(1))?);
                let reason = row.get::<_, Option<i16>>(3).map(i64::from);
                let dead = dead_of(reason, row.get::<_, Option<bool>>(4).map(i64::from))?;
                let payload = Bytes::from(row.get::<_, Vec<u8>>(2));
                let ordinal = row.get::<_, Option<i64>>(5).map(|o| to_u64("ordinal", o).map(Ordinal)).transpose()?;
                Ok::<_, StoreError>((RestoredRecord { sequence, payload, dead }, ordinal))
            };
            match record() {
                Ok((record, ordinal)) => {
                    stream.records.push(record);
                    stream.ordinals.push(ordinal);
                }
                Err(e) => {
                    read.insert(row.get::<_, &str>(0).to_owned(), Err(e));
                }
            }
        }
        let memory = i64::try_from(egress_core::SKIPPED_MEMORY).unwrap_or(i64::MAX);
        for row in client.query(&statements.skipped, &[&names, &from, &memory]).await? {
            let Some(Ok(stream)) = read.get_mut(row.get::<_, &str>(0)) else { continue };
            let skipped = || {
                let sequence = Sequence(to_u64("seq", row.get(1))?);
                let held = row.get::<_, Option<bool>>(3).map(i64::from);
                let dead = dead_of(Some(i64::from(row.get::<_, i16>(2))), held)?;
                Ok::<_, StoreError>((sequence, dead.map_or(egress_core::DeadReason::Permanent, |d| d.reason)))
            };
            match skipped() {
                Ok(entry) => stream.skipped.push(entry),
                Err(e) => {
                    read.insert(row.get::<_, &str>(0).to_owned(), Err(e));
                }
            }
        }
        Ok(read)
    }

    /// Extends `lease` to `duration` from now, waiting for no lock. A
    /// `PgJournal` has its leases renewed for it (see its docs); this is
    /// for a worker that keeps its own.
    ///
    /// # Errors
    /// [`StoreError::Fenced`] when another worker has taken the stream (stop
    /// working on it), [`StoreError::Busy`] when another session holds the
    /// lease's row (a take in progress, or a lock taken by hand: try again
    /// soon), or PostgreSQL's error.
    pub async fn renew(&self, lease: &Lease, duration: Duration) -> Result<(), StoreError> {
        let renewals = self.renew_many(&[(lease, duration)]).await?;
        match renewals.first().map(|(_, r)| *r) {
            Some(Renewal::Renewed) => Ok(()),
            Some(Renewal::Busy) => Err(StoreError::Busy { stream: lease.stream.clone() }),
            Some(Renewal::Lost) | None => Err(StoreError::Fenced { stream: lease.stream.clone() }),
        }
    }

    /// Extends each lease to its duration from now, in one statement that
    /// waits for no lock; returns what became of each.
    pub(super) async fn renew_many(&self, leases: &[(&Lease, Duration)]) -> Result<Vec<(String, Renewal)>, StoreError> {
        let mut streams = Vec::with_capacity(leases.len());
        let mut numbers = Vec::with_capacity(leases.len());
        let mut millis = Vec::with_capacity(leases.len());
        for (lease, duration) in leases {
            streams.push(lease.stream.as_str());
            numbers.push(to_i64("lease", lease.number)?);
            millis.push(lease_millis(*duration));
        }
        let rows = self.shared.client.query(&self.shared.statements.renew, &[&streams, &numbers, &millis]).await?;
        Ok(rows
            .iter()
            .map(|row| {
                let renewal = match (row.get::<_, Option<bool>>(1), row.get::<_, Option<bool>>(2)) {
                    (Some(true), _) => Renewal::Renewed,
                    (_, Some(true)) => Renewal::Busy,
                    _ => Renewal::Lost,
                };
                (row.get(0), renewal)
            })
            .collect())
    }

    /// Gives `lease` up: the stream is free for any worker at once.
    ///
    /// # Errors
    /// [`StoreError::Fenced`] when another worker took it already, or
    /// PostgreSQL's error.
    pub async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let number = to_i64("lease", lease.number)?;
        let released = self
            .shared
            .client
            .execute(&self.shared.statements.release, &[&lease.stream, &number])
            .await
            .map_err(|e| busy_or(&lease.stream, e))?;
        if released == 0 {
            return Err(StoreError::Fenced { stream: lease.stream.clone() });
        }
        Ok(())
    }
}

/// Says who had a stream a take took: nobody (a new stream, or one
/// released), or a worker whose lease ran out `expired` milliseconds ago
/// (dead, or alive and not renewing: its own log says which).
fn taken_from(stream: &str, worker: &str, before: Option<&str>, expired: Option<i64>) {
    if let (Some(before), Some(ago)) = (before, expired) {
        tracing::info!(
            %stream, previous = before, expired_ms_ago = ago, taker = worker,
            "egress lease: took the stream over from a worker whose lease ran out"
        );
        tracing::event!(
            target: "egress::metrics",
            tracing::Level::DEBUG,
            monotonic_counter.egress_lease_takeovers = 1u64,
            "egress lease: a takeover"
        );
    }
}

/// The shortest lease [`lease_for`] gives: a lease shorter than a second
/// leaves renewals, which go through the worker's one connection behind
/// its writes, too little room on a loaded machine.
pub const MIN_LEASE: Duration = Duration::from_secs(1);

/// The lease for a worker whose handler runs take at most `run` (a record
/// starts only when its run can end under the lease, and a run the lease
/// runs out under is cut: `egress_dispatch::StoredAck::with_lease`), over
/// a connection whose renewals may take `round_trip` at worst:
/// `3 × (run + round_trip)`, at least [`MIN_LEASE`] and at most
/// [`MAX_LEASE`].
///
/// Why three: a `PgJournal`'s lease is renewed a third into it (less the
/// last renewal's round trip), and every renewal that gets through moves
/// its end to a full lease from when it was sent. Two thirds of the lease
/// are left when a renewal is sent, so a renewal may fail (and be tried
/// again) and a run started just before it still ends under the lease,
/// and the dispatcher's gate (`run` before the lease's end) stays open as
/// long as renewals get through. It is the outbox relays' rule (a lease of
/// `(ceil(batch / workers) + 1) × delivery timeout`) for a worker whose
/// stream runs its window of records at once, each within `run`, with the
/// renewals' own round trips counted.
pub fn lease_for(run: Duration, round_trip: Duration) -> Duration {
    run.saturating_add(round_trip).saturating_mul(3).clamp(MIN_LEASE, MAX_LEASE)
}

/// The longest lease: 100 years (a timestamp that far ahead is still one
/// PostgreSQL can store). Longer leases are taken as this.
pub const MAX_LEASE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A lease's duration in milliseconds, at most [`MAX_LEASE`].
fn lease_millis(lease: Duration) -> i64 {
    i64::try_from(lease.min(MAX_LEASE).as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_three_runs_and_round_trips_and_never_below_the_floor() {
        assert_eq!(lease_for(Duration::from_millis(250), Duration::from_millis(100)), Duration::from_millis(1050));
        assert_eq!(lease_for(Duration::from_millis(10), Duration::from_millis(10)), MIN_LEASE);
        assert_eq!(lease_for(Duration::MAX, Duration::from_secs(1)), MAX_LEASE);
        assert_eq!(lease_millis(Duration::MAX), lease_millis(MAX_LEASE));
    }
}
