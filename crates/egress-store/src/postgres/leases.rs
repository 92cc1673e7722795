//! Stream leases: taken with `SKIP LOCKED` (one, one named, or many in one
//! statement), renewed, released; each take raises the lease number that
//! fences the taker's writes.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use egress_core::{RestoredRecord, Sequence};

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
    /// PostgreSQL's error, or a stored value out of range.
    pub async fn take_stream(&self, stream: &str, lease: Duration) -> Result<Option<(Lease, Loaded)>, StoreError> {
        ensure_stream(&self.shared.client, stream).await.map_err(|e| match e {
            StoreError::Postgres(e) => busy_or(stream, e),
            other => other,
        })?;
        self.take_where(Some(stream), 1, lease).await?.pop().map(|(_, read)| read).transpose()
    }

    /// The take (one statement), then the load of what it took (one more):
    /// a stream's records below its counter are committed by the time the
    /// take reads the counter (an append holds the stream's row until its
    /// transaction ends), and only the lease holder prunes, so the load
    /// needs no transaction shared with the take.
    async fn take_where(&self, stream: Option<&str>, max: usize, lease: Duration) -> Result<Vec<Taken>, StoreError> {
        let Shared { client, statements, worker, .. } = &*self.shared;
        let millis = lease_millis(lease);
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        let rows = client.query(&statements.take, &[worker, &millis, &stream, &max]).await?;
        // Each stream read on its own, so that a value out of range fails
        // that stream only; the ranges to load of those read well.
        let mut taken: Vec<Taken> = Vec::with_capacity(rows.len());
        let (mut names, mut from, mut to, mut index) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for row in &rows {
            let stream: String = row.get(0);
            let read = || {
                let incarnation = incarnation_of(&row.get::<_, Vec<u8>>(1))?;
                let number = to_u64("lease", row.get(2))?;
                let generation = restorable_generation(to_u64("generation", row.get(3))?)?;
                let next = to_u64("next_sequence", row.get(4))?;
                let acked = row.get::<_, Option<i64>>(5).map(|a| to_u64("acked_through", a)).transpose()?;
                let first = to_i64("sequence", acked.map_or(0, |a| a.saturating_add(1)))?;
                let loaded = Loaded::new(incarnation, generation, Sequence(next), acked.map(Sequence), Vec::new());
                Ok((Lease { stream: stream.clone(), number }, loaded, first, row.get::<_, i64>(4)))
            };
            let read = read().map(|(lease, loaded, first, until)| {
                names.push(stream.clone());
                from.push(first);
                to.push(until);
                index.push(taken.len());
                (lease, loaded)
            });
            taken.push((stream, read));
        }
        if !names.is_empty() {
            // In one statement; matched by name, not by the order of both
            // lists (the database's collation need not sort names as Rust
            // does).
            let at: HashMap<&str, usize> = names.iter().map(String::as_str).zip(index).collect();
            for row in client.query(&statements.load, &[&names, &from, &to]).await? {
                let Some(&i) = at.get(row.get::<_, &str>(0)) else { continue };
                let record = || {
                    let sequence = Sequence(to_u64("seq", row.get(1))?);
                    let reason = row.get::<_, Option<i16>>(3).map(i64::from);
                    let dead = dead_of(reason, row.get::<_, Option<bool>>(4).map(i64::from))?;
                    let payload = Bytes::from(row.get::<_, Vec<u8>>(2));
                    Ok::<_, StoreError>(RestoredRecord { sequence, payload, dead })
                };
                if let Ok((_, loaded)) = &mut taken[i].1 {
                    match record() {
                        Ok(record) => loaded.restored.records.push(record),
                        Err(e) => taken[i].1 = Err(e),
                    }
                }
            }
            let memory = i64::try_from(egress_core::SKIPPED_MEMORY).unwrap_or(i64::MAX);
            for row in client.query(&statements.skipped, &[&names, &from, &memory]).await? {
                let Some(&i) = at.get(row.get::<_, &str>(0)) else { continue };
                let skipped = || {
                    let sequence = Sequence(to_u64("seq", row.get(1))?);
                    let held = row.get::<_, Option<bool>>(3).map(i64::from);
                    let dead = dead_of(Some(i64::from(row.get::<_, i16>(2))), held)?;
                    Ok::<_, StoreError>((sequence, dead.map_or(egress_core::DeadReason::Permanent, |d| d.reason)))
                };
                if let Ok((_, loaded)) = &mut taken[i].1 {
                    match skipped() {
                        Ok(entry) => loaded.restored.skipped.push(entry),
                        Err(e) => taken[i].1 = Err(e),
                    }
                }
            }
        }
        taken.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(taken)
    }

    /// Extends `lease` to `duration` from now (renew at half the lease).
    ///
    /// # Errors
    /// [`StoreError::Fenced`] when another worker has taken the stream (stop
    /// working on it), or PostgreSQL's error.
    pub async fn renew(&self, lease: &Lease, duration: Duration) -> Result<(), StoreError> {
        let millis = lease_millis(duration);
        let number = to_i64("lease", lease.number)?;
        let renewed = self
            .shared
            .client
            .execute(&self.shared.statements.renew, &[&lease.stream, &number, &millis])
            .await
            .map_err(|e| busy_or(&lease.stream, e))?;
        if renewed == 0 {
            return Err(StoreError::Fenced { stream: lease.stream.clone() });
        }
        Ok(())
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

/// The longest lease: 100 years (a timestamp that far ahead is still one
/// PostgreSQL can store). Longer leases are taken as this.
pub const MAX_LEASE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A lease's duration in milliseconds, at most [`MAX_LEASE`].
fn lease_millis(lease: Duration) -> i64 {
    i64::try_from(lease.min(MAX_LEASE).as_millis()).unwrap_or(i64::MAX)
}
