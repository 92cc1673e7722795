//! The PostgreSQL store (feature `postgres`): the SQLite store's contract on
//! a shared database, where many relay workers share the streams.
//!
//! - **Appends in the caller's transaction** ([`PgOutbox::append`]): the
//!   stream row's counter is updated with `RETURNING`, which locks the row
//!   until the caller's transaction ends, so sequences are gap-free per
//!   stream and commit in sequence order; a rolled-back append consumes no
//!   sequence. A `NOTIFY` on [`CHANNEL`] goes out at commit.
//! - **Stream leases, not row claims** ([`PgStore::take`]): order is per
//!   stream, so a worker takes a whole stream, free or with its lease run
//!   out, with one statement (`FOR UPDATE SKIP LOCKED`, so workers never
//!   wait on each other's choice). Each take raises the stream's lease
//!   number; every later write of the taker carries it (`AND lease = $n`),
//!   and a write that finds another number is [`StoreError::Fenced`]: the
//!   stream was taken over, stop.
//! - **Two numbers, two fences.** The lease number fences the store. The
//!   wire generation (what the cell's handshake carries) fences the
//!   receiver: it is stored before any handshake uses it (R2) and only
//!   under the lease, so a new owner's first handshake (one above the
//!   stored generation) is above every generation the old owner ever used,
//!   and the receiver refuses the old owner from then on. The generation
//!   cannot be the lease number itself: the cell raises it on every
//!   reconnect within one lease.
//!
//! One [`PgStore`] is one connection; its [`changed`](PgStore::changed)
//! reports the outbox's notifications (with a polling fallback in the
//! relay: `NOTIFY` does not pass a transaction-mode pooler).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use egress_core::{Ready, Restored, RestoredRecord, Sequence};
use tokio_postgres::{AsyncMessage, Client, GenericClient, NoTls, Transaction};

use crate::stored::{dead_code, dead_of, fresh_incarnation, incarnation_of, restorable_generation, to_i64, to_u64};
use crate::{Loaded, StoreError};

/// The channel the outbox notifies on at commit (the payload is the
/// stream's name).
pub const CHANNEL: &str = "egress_outbox";

/// The schema, one migration per version; `egress_schema` holds how many
/// were applied. Never edit a migration that shipped; add one.
const MIGRATIONS: &[&str] = &["
    CREATE TABLE egress_stream (
        stream text PRIMARY KEY,
        incarnation bytea NOT NULL CHECK (length(incarnation) = 16),
        generation bigint NOT NULL DEFAULT 0 CHECK (generation >= 0),
        next_sequence bigint NOT NULL DEFAULT 0 CHECK (next_sequence >= 0),
        acked_through bigint CHECK (acked_through >= 0),
        lease bigint NOT NULL DEFAULT 0,
        owner text,
        lease_until timestamptz
    );
    CREATE TABLE egress_outbox (
        stream text NOT NULL,
        seq bigint NOT NULL CHECK (seq >= 0),
        payload bytea NOT NULL,
        dead_reason smallint,
        dead_held boolean,
        PRIMARY KEY (stream, seq)
    );
"];

/// The PostgreSQL schema version this library writes.
pub const PG_SCHEMA_VERSION: u32 = 1;

/// Installs (or upgrades) egress's tables, in one transaction, under an
/// advisory lock so that workers starting together migrate once.
/// Idempotent.
///
/// # Errors
/// A database written by a newer version of this library
/// ([`StoreError::SchemaTooNew`]), or PostgreSQL's error.
pub async fn migrate(client: &mut Client) -> Result<(), StoreError> {
    // Already at this version (every worker's connection asks): no lock.
    let current =
        client.query_opt("SELECT version FROM egress_schema WHERE to_regclass('egress_schema') IS NOT NULL", &[]).await;
    if let Ok(Some(row)) = current
        && u32::try_from(row.get::<_, i32>(0)).is_ok_and(|v| v == PG_SCHEMA_VERSION)
    {
        return Ok(());
    }
    let tx = client.transaction().await?;
    tx.batch_execute(
        "SELECT pg_advisory_xact_lock(7236450910388245059);
         CREATE TABLE IF NOT EXISTS egress_schema (version integer NOT NULL);
         INSERT INTO egress_schema (version) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM egress_schema);",
    )
    .await?;
    let version: i32 = tx.query_one("SELECT version FROM egress_schema", &[]).await?.get(0);
    let supported = PG_SCHEMA_VERSION;
    let version = u32::try_from(version).unwrap_or(u32::MAX);
    if version > supported {
        return Err(StoreError::SchemaTooNew { found: version, supported });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.batch_execute(sql).await?;
        let applied = i32::try_from(i + 1).unwrap_or(i32::MAX);
        tx.execute("UPDATE egress_schema SET version = $1", &[&applied]).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Appends to an egress stream from inside the application's own
/// PostgreSQL transaction: the record and the stream's counter commit or
/// roll back with the application's writes. The counter's row stays locked
/// until that transaction ends, so two transactions appending to one stream
/// take their sequences one after the other (appends to one stream
/// serialise; different streams do not contend), the sequences have no
/// gap, and they commit in order. The stream's worker hears of the commit
/// through `NOTIFY` (or its poll) and adopts the records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgOutbox {
    stream: String,
}

impl PgOutbox {
    /// The outbox of `stream`.
    pub fn new(stream: impl Into<String>) -> Self {
        PgOutbox { stream: stream.into() }
    }

    /// The stream's name.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// Appends `payload` inside `tx`, under a savepoint of its own, so that
    /// a failed append leaves the caller's transaction usable and as it
    /// was. Returns the sequence assigned (final once `tx` commits).
    ///
    /// # Errors
    /// PostgreSQL's error (the schema missing: call [`migrate`] first), or
    /// the counter out of range; nothing is appended then.
    pub async fn append(&self, tx: &Transaction<'_>, payload: &[u8]) -> Result<Sequence, StoreError> {
        tx.batch_execute("SAVEPOINT egress_append").await?;
        let result = async {
            // One statement: the counter (the stream's row created at 1 if
            // it has none), the record, the notification.
            let row = tx
                .query_one(
                    "WITH counter AS (
                         INSERT INTO egress_stream (stream, incarnation, next_sequence) VALUES ($1, $2, 1)
                         ON CONFLICT (stream) DO UPDATE SET next_sequence = egress_stream.next_sequence + 1
                         RETURNING next_sequence - 1 AS seq),
                     record AS (
                         INSERT INTO egress_outbox (stream, seq, payload) SELECT $1, seq, $3 FROM counter
                         RETURNING seq)
                     SELECT seq, pg_notify($4, $1)::text FROM record",
                    &[&self.stream, &fresh_incarnation().as_slice(), &payload, &CHANNEL],
                )
                .await?;
            let sequence: i64 = row.get(0);
            Ok(Sequence(to_u64("sequence", sequence)?))
        }
        .await;
        match result {
            Ok(_) => tx.batch_execute("RELEASE SAVEPOINT egress_append").await?,
            Err(_) => {
                let _ = tx.batch_execute("ROLLBACK TO SAVEPOINT egress_append; RELEASE SAVEPOINT egress_append").await;
            }
        }
        result
    }

    /// Appends `message` as JSON (see [`append`](Self::append)).
    ///
    /// # Errors
    /// A message serde cannot encode, or [`append`](Self::append)'s.
    pub async fn append_json<M: serde::Serialize + ?Sized>(
        &self,
        tx: &Transaction<'_>,
        message: &M,
    ) -> Result<Sequence, StoreError> {
        let payload = serde_json::to_vec(message).map_err(StoreError::Encode)?;
        self.append(tx, &payload).await
    }
}

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

/// One connection to a PostgreSQL database holding egress streams, for one
/// worker: it takes streams ([`take`](Self::take)), loads them, writes
/// their journals ([`apply`](Self::apply)) fenced by the lease, and hears
/// the outbox's notifications.
pub struct PgStore {
    client: Client,
    /// This worker's name, stored as the owner of the streams it takes (for
    /// people reading the table; the fence is the lease number).
    worker: String,
    /// Set by the connection's task when a notification arrives.
    notified: Arc<AtomicBool>,
    bell: Arc<tokio::sync::Notify>,
    connection: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").field("worker", &self.worker).finish_non_exhaustive()
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

impl PgStore {
    /// Connects to `url` (a libpq connection string or URL; no TLS), runs
    /// the connection on the current tokio runtime, migrates the schema and
    /// listens on [`CHANNEL`]. `worker` names this store as the owner of
    /// the streams it takes.
    ///
    /// # Errors
    /// PostgreSQL's error, or a schema newer than this library.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub async fn connect(url: &str, worker: impl Into<String>) -> Result<Self, StoreError> {
        let (mut client, mut connection) = tokio_postgres::connect(url, NoTls).await?;
        let notified = Arc::new(AtomicBool::new(true));
        let bell = Arc::new(tokio::sync::Notify::new());
        let task = {
            let (notified, bell) = (notified.clone(), bell.clone());
            tokio::spawn(async move {
                while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    match message {
                        Ok(AsyncMessage::Notification(_)) => {
                            notified.store(true, Ordering::Release);
                            bell.notify_one();
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "egress postgres: the connection failed");
                            break;
                        }
                    }
                }
            })
        };
        migrate(&mut client).await?;
        client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
        Ok(PgStore { client, worker: worker.into(), notified, bell, connection: task })
    }

    /// The connection, for reads (and for tests).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Whether a notification came since the last call (`true` the first
    /// time, so that a new relay reads once). Cheap: no round trip.
    pub fn changed(&mut self) -> bool {
        self.notified.swap(false, Ordering::AcqRel)
    }

    /// Completes when a notification comes (for a relay's wait, beside its
    /// poll interval).
    pub async fn notified(&self) {
        self.bell.notified().await;
    }

    /// Takes one stream that no worker holds (never taken, released, or its
    /// lease run out) for `lease`, and loads it; `None` when every stream
    /// is held. Streams whose lease ran out longest ago go first.
    ///
    /// # Errors
    /// PostgreSQL's error, or a stored value out of range.
    pub async fn take(&mut self, lease: Duration) -> Result<Option<(Lease, Loaded)>, StoreError> {
        self.take_where(None, lease).await
    }

    /// Takes `stream` (creating it if it has no row) for `lease` if no
    /// worker holds it, and loads it; `None` when another worker's lease on
    /// it is still running.
    ///
    /// # Errors
    /// PostgreSQL's error, or a stored value out of range.
    pub async fn take_stream(&mut self, stream: &str, lease: Duration) -> Result<Option<(Lease, Loaded)>, StoreError> {
        ensure_stream(&self.client, stream).await?;
        self.take_where(Some(stream), lease).await
    }

    async fn take_where(
        &mut self,
        stream: Option<&str>,
        lease: Duration,
    ) -> Result<Option<(Lease, Loaded)>, StoreError> {
        let millis = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
        let tx = self.client.transaction().await?;
        let row = tx
            .query_opt(
                "WITH free AS (
                     SELECT stream FROM egress_stream
                     WHERE (owner IS NULL OR lease_until IS NULL OR lease_until < clock_timestamp())
                       AND ($3::text IS NULL OR stream = $3)
                     ORDER BY lease_until NULLS FIRST, stream
                     LIMIT 1
                     FOR UPDATE SKIP LOCKED)
                 UPDATE egress_stream s
                 SET owner = $1, lease = s.lease + 1,
                     lease_until = clock_timestamp() + $2::bigint * interval '1 millisecond'
                 FROM free WHERE s.stream = free.stream
                 RETURNING s.stream, s.incarnation, s.lease, s.generation, s.next_sequence, s.acked_through",
                &[&self.worker, &millis, &stream],
            )
            .await?;
        let Some(row) = row else {
            tx.commit().await?;
            return Ok(None);
        };
        let stream: String = row.get(0);
        let incarnation: Vec<u8> = row.get(1);
        let number = to_u64("lease", row.get(2))?;
        let generation = to_u64("generation", row.get(3))?;
        let next = to_u64("next_sequence", row.get(4))?;
        let acked = row.get::<_, Option<i64>>(5).map(|a| to_u64("acked_through", a)).transpose()?;
        let incarnation = incarnation_of(&incarnation)?;
        let generation = restorable_generation(generation)?;
        let from = acked.map_or(0, |a| a.saturating_add(1));
        let rows = tx
            .query(
                "SELECT seq, payload, dead_reason, dead_held FROM egress_outbox
                 WHERE stream = $1 AND seq >= $2 AND seq < $3 ORDER BY seq",
                &[&stream, &to_i64("sequence", from)?, &to_i64("sequence", next)?],
            )
            .await?;
        let mut records = Vec::with_capacity(rows.len());
        for row in rows {
            let sequence = Sequence(to_u64("seq", row.get(0))?);
            let payload: Vec<u8> = row.get(1);
            let dead =
                dead_of(row.get::<_, Option<i16>>(2).map(i64::from), row.get::<_, Option<bool>>(3).map(i64::from))?;
            records.push(RestoredRecord { sequence, payload: Bytes::from(payload), dead });
        }
        tx.commit().await?;
        let loaded = Loaded {
            incarnation,
            restored: Restored {
                generation,
                next_sequence: Sequence(next),
                acked_through: acked.map(Sequence),
                records,
            },
        };
        Ok(Some((Lease { stream, number }, loaded)))
    }

    /// Extends `lease` to `duration` from now (renew at half the lease).
    ///
    /// # Errors
    /// [`StoreError::Fenced`] when another worker has taken the stream (stop
    /// working on it), or PostgreSQL's error.
    pub async fn renew(&mut self, lease: &Lease, duration: Duration) -> Result<(), StoreError> {
        let millis = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        let renewed = self
            .client
            .execute(
                "UPDATE egress_stream SET lease_until = clock_timestamp() + $3::bigint * interval '1 millisecond'
                 WHERE stream = $1 AND lease = $2",
                &[&lease.stream, &to_i64("lease", lease.number)?, &millis],
            )
            .await?;
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
    pub async fn release(&mut self, lease: &Lease) -> Result<(), StoreError> {
        let released = self
            .client
            .execute(
                "UPDATE egress_stream SET owner = NULL, lease_until = NULL WHERE stream = $1 AND lease = $2",
                &[&lease.stream, &to_i64("lease", lease.number)?],
            )
            .await?;
        if released == 0 {
            return Err(StoreError::Fenced { stream: lease.stream.clone() });
        }
        Ok(())
    }

    /// Writes one [`Ready`] of the leased stream as one transaction, as
    /// [`SqliteStore::apply`](crate::SqliteStore::apply) does (appends
    /// continuing the stored counter or [`StoreError::Conflict`], the
    /// generation, dead letters, the watermark with pruning), fenced by the
    /// lease. A `Ready` that need not reach the disk (`must_sync` false:
    /// watermarks, dead letters) commits with `synchronous_commit = off`.
    ///
    /// # Errors
    /// [`StoreError::Fenced`] when the stream was taken over, a conflict,
    /// a number out of range, or PostgreSQL's error; nothing is written
    /// then.
    pub async fn apply(
        &mut self,
        lease: &Lease,
        ready: &Ready,
        appends: &[(Sequence, Bytes)],
    ) -> Result<(), StoreError> {
        let range = ready.appends.clone();
        let count = range.end.0.saturating_sub(range.start.0);
        if appends.len() as u64 != count || appends.iter().zip(range.start.0..).any(|((s, _), e)| s.0 != e) {
            return Err(StoreError::Appends { expected: range, given: appends.len() });
        }
        let stream = &lease.stream;
        let number = to_i64("lease", lease.number)?;
        let tx = self.client.transaction().await?;
        if !ready.must_sync {
            tx.batch_execute("SET LOCAL synchronous_commit = off").await?;
        }
        let row = tx
            .query_opt(
                "SELECT next_sequence FROM egress_stream WHERE stream = $1 AND lease = $2 FOR UPDATE",
                &[stream, &number],
            )
            .await?;
        let Some(row) = row else {
            return Err(StoreError::Fenced { stream: stream.clone() });
        };
        let next = to_u64("next_sequence", row.get(0))?;
        if !range.is_empty() {
            if next != range.start.0 {
                return Err(StoreError::Conflict { stream: stream.clone(), stored: next, expected: range.start.0 });
            }
            let mut seqs = Vec::with_capacity(appends.len());
            for (sequence, _) in appends {
                seqs.push(to_i64("sequence", sequence.0)?);
            }
            let payloads: Vec<&[u8]> = appends.iter().map(|(_, p)| p.as_ref()).collect();
            tx.execute(
                "INSERT INTO egress_outbox (stream, seq, payload) SELECT $1, * FROM unnest($2::bigint[], $3::bytea[])",
                &[stream, &seqs, &payloads],
            )
            .await?;
            tx.execute(
                "UPDATE egress_stream SET next_sequence = $2 WHERE stream = $1",
                &[stream, &to_i64("sequence", range.end.0)?],
            )
            .await?;
        }
        if let Some(g) = ready.generation {
            tx.execute(
                "UPDATE egress_stream SET generation = GREATEST(generation, $2) WHERE stream = $1",
                &[stream, &to_i64("generation", g.0)?],
            )
            .await?;
        }
        for (sequence, mark) in &ready.dead {
            let reason = mark.map(|m| i16::try_from(dead_code(m.reason)).unwrap_or(i16::MAX));
            let held = mark.map(|m| m.held);
            tx.execute(
                "UPDATE egress_outbox SET dead_reason = $3, dead_held = $4 WHERE stream = $1 AND seq = $2",
                &[stream, &to_i64("sequence", sequence.0)?, &reason, &held],
            )
            .await?;
        }
        if let Some(a) = ready.acked_through {
            let a = to_i64("acked_through", a.0)?;
            tx.execute(
                "UPDATE egress_stream SET acked_through = GREATEST(COALESCE(acked_through, -1), $2) WHERE stream = $1",
                &[stream, &a],
            )
            .await?;
            tx.execute("DELETE FROM egress_outbox WHERE stream = $1 AND seq <= $2", &[stream, &a]).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Up to `limit` records of `stream` from sequence `from` on, in order:
    /// what applications appended that the worker's cell has not adopted.
    ///
    /// # Errors
    /// PostgreSQL's error, or a stored value out of range.
    pub async fn appended(
        &mut self,
        stream: &str,
        from: Sequence,
        limit: usize,
    ) -> Result<Vec<(Sequence, Bytes)>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .client
            .query(
                "SELECT seq, payload FROM egress_outbox WHERE stream = $1 AND seq >= $2 ORDER BY seq LIMIT $3",
                &[&stream, &to_i64("sequence", from.0)?, &limit],
            )
            .await?;
        rows.into_iter()
            .map(|row| Ok((Sequence(to_u64("seq", row.get(0))?), Bytes::from(row.get::<_, Vec<u8>>(1)))))
            .collect()
    }
}

/// Creates the stream's row if it has none (generation 0, nothing stored,
/// a fresh incarnation, held by no one).
async fn ensure_stream(client: &impl GenericClient, stream: &str) -> Result<(), StoreError> {
    client
        .execute(
            "INSERT INTO egress_stream (stream, incarnation) VALUES ($1, $2) ON CONFLICT (stream) DO NOTHING",
            &[&stream, &fresh_incarnation().as_slice()],
        )
        .await?;
    Ok(())
}

/// A stream a [`PgStore`] has leased, as a relay's
/// [`JournalStore`](crate::JournalStore): the relay keeps the lease
/// (renewed at half its duration; a renewal refused stops the relay, the
/// stream being another worker's), reads the outbox when notified or every
/// `poll` at the latest (`NOTIFY` does not pass a transaction-mode pooler),
/// and releases the lease when it shuts down.
#[cfg(feature = "relay")]
#[derive(Debug)]
pub struct PgJournal {
    store: PgStore,
    lease: Lease,
    duration: Duration,
    poll: Duration,
    renew_at: tokio::time::Instant,
    poll_at: tokio::time::Instant,
}

#[cfg(feature = "relay")]
impl PgJournal {
    /// `lease` of `store`, taken for `duration`; the outbox read every
    /// `poll` at the latest.
    pub fn new(store: PgStore, lease: Lease, duration: Duration, poll: Duration) -> Self {
        let now = tokio::time::Instant::now();
        PgJournal { store, lease, duration, poll, renew_at: now + duration / 2, poll_at: now + poll }
    }

    /// The lease.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }
}

#[cfg(feature = "relay")]
impl crate::JournalStore for PgJournal {
    async fn apply(&mut self, ready: &Ready, appends: &[(Sequence, Bytes)]) -> Result<(), StoreError> {
        self.store.apply(&self.lease, ready, appends).await
    }

    async fn appended(&mut self, from: Sequence, limit: usize) -> Result<Vec<(Sequence, Bytes)>, StoreError> {
        self.store.appended(&self.lease.stream, from, limit).await
    }

    async fn changed(&mut self) -> Result<bool, StoreError> {
        let now = tokio::time::Instant::now();
        let polled = now >= self.poll_at;
        if polled {
            self.poll_at = now + self.poll;
        }
        Ok(self.store.changed() || polled)
    }

    async fn keep(&mut self) -> Result<(), StoreError> {
        let now = tokio::time::Instant::now();
        if now >= self.renew_at {
            self.store.renew(&self.lease, self.duration).await?;
            self.renew_at = now + self.duration / 2;
        }
        Ok(())
    }

    fn news(&self) -> impl Future<Output = ()> + Send + 'static {
        let bell = self.store.bell.clone();
        async move { bell.notified().await }
    }

    async fn close(&mut self) -> Result<(), StoreError> {
        self.store.release(&self.lease).await
    }
}

/// Takes `stream` for `lease` (see [`PgStore::take_stream`]), or with
/// `None` any free stream ([`PgStore::take`]), restores a cell from it and
/// starts its relay over a [`PgJournal`] (the outbox read every 250 ms at
/// the latest, beside the notifications). Returns the stream's name with
/// the cell and relay; `None` when the stream (or every stream) is held by
/// another worker whose lease still runs.
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
    mut store: PgStore,
    stream: Option<&str>,
    lease: Duration,
    policy: egress_core::Policy,
    options: egress_reactive::CellOptions,
    config: crate::RelayConfig,
) -> Result<Option<(String, crate::Durable)>, StoreError> {
    let taken = match stream {
        Some(stream) => store.take_stream(stream, lease).await?,
        None => store.take(lease).await?,
    };
    let Some((taken, loaded)) = taken else { return Ok(None) };
    let name = taken.stream.clone();
    let core = egress_core::EgressCore::restore(policy, loaded.restored)?;
    let cell = egress_reactive::AsyncEgressCell::from_core(cx, core, options.incarnation(loaded.incarnation));
    let journal = PgJournal::new(store, taken, lease, Duration::from_millis(250));
    let relay = crate::Relay::spawn_on(cx, &cell, journal, config);
    Ok(Some((name, crate::Durable { cell, relay })))
}
