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
//! One [`PgStore`] is one connection, shared by every stream its worker
//! holds: each write is one statement, so the streams' writes pipeline on
//! it. Its notifications wake the journal of the stream they name (with a
//! polling fallback in the relay: `NOTIFY` does not pass a
//! transaction-mode pooler).
//!
//! **Dead letters stay.** A record that died (its handler failed
//! permanently, or its retries ran out) keeps its row when the stream's
//! watermark passes it: [`PgStore::dead_letters`] (or the
//! `egress_dead_letters` view) lists them, [`PgStore::requeue`] appends
//! one again at the end of its stream, [`PgStore::discard`] deletes it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use egress_core::{DeadMark, Ready, RestoredRecord, Sequence};
use parking_lot::Mutex;
use tokio_postgres::{AsyncMessage, Client, GenericClient, NoTls, Statement, Transaction};

use crate::stored::{dead_code, dead_of, fresh_incarnation, incarnation_of, restorable_generation, to_i64, to_u64};
use crate::{Loaded, StoreError};

/// The channel the outbox notifies on at commit (the payload is the
/// stream's name).
pub const CHANNEL: &str = "egress_outbox";

/// The schema, one migration per version; `egress_schema` holds how many
/// were applied. Never edit a migration that shipped; add one.
const MIGRATIONS: &[&str] = &[
    "
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
",
    "
    -- One Ready of a leased stream as one statement (one round trip, one
    -- implicit transaction): NULL when the lease is not the stream's any
    -- more (fenced, nothing written); otherwise the stored next sequence,
    -- and the appends were written only if it is where they start. The
    -- stream's row is locked NOWAIT: an application's transaction holding
    -- it (an append not yet committed) fails this call at once with
    -- lock_not_available instead of stalling every stream behind it on the
    -- worker's connection. Arguments that break the store's rules raise
    -- (nothing written). Meant to run as a statement of its own: inside a
    -- caller's transaction, p_sync false turns synchronous_commit off for
    -- the rest of that transaction.
    CREATE FUNCTION egress_apply(
        p_stream text, p_lease bigint, p_start bigint, p_seqs bigint[], p_payloads bytea[],
        p_generation bigint, p_dead_seqs bigint[], p_dead_reasons smallint[], p_dead_held boolean[],
        p_acked bigint, p_sync boolean)
    RETURNS bigint LANGUAGE plpgsql AS $$
    DECLARE
        stored bigint;
        appended bigint := coalesce(cardinality(p_seqs), 0);
    BEGIN
        IF coalesce(cardinality(p_payloads), 0) <> appended
           OR p_seqs IS DISTINCT FROM ARRAY(SELECT generate_series(p_start, p_start + appended - 1)) AND appended > 0
        THEN
            RAISE EXCEPTION 'egress_apply: the appends are not % payloads from %', appended, p_start;
        END IF;
        IF coalesce(cardinality(p_dead_seqs), 0) <> coalesce(cardinality(p_dead_reasons), 0)
           OR coalesce(cardinality(p_dead_seqs), 0) <> coalesce(cardinality(p_dead_held), 0)
        THEN
            RAISE EXCEPTION 'egress_apply: the dead letters'' arrays differ in length';
        END IF;
        IF NOT p_sync THEN
            PERFORM set_config('synchronous_commit', 'off', true);
        END IF;
        SELECT next_sequence INTO stored FROM egress_stream
        WHERE stream = p_stream AND lease = p_lease FOR UPDATE NOWAIT;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        IF p_acked IS NOT NULL AND p_acked >= stored + appended THEN
            RAISE EXCEPTION 'egress_apply: acknowledged through % but the next sequence is %', p_acked, stored + appended;
        END IF;
        IF appended > 0 THEN
            IF stored <> p_start THEN
                RETURN stored;
            END IF;
            INSERT INTO egress_outbox (stream, seq, payload)
            SELECT p_stream, u.seq, u.payload FROM unnest(p_seqs, p_payloads) AS u(seq, payload);
        END IF;
        IF appended > 0 OR p_generation IS NOT NULL OR p_acked IS NOT NULL THEN
            UPDATE egress_stream SET
                next_sequence = next_sequence + appended,
                generation = GREATEST(generation, coalesce(p_generation, generation)),
                acked_through = CASE WHEN p_acked IS NULL THEN acked_through
                                     ELSE GREATEST(coalesce(acked_through, -1), p_acked) END
            WHERE stream = p_stream;
        END IF;
        IF coalesce(cardinality(p_dead_seqs), 0) > 0 THEN
            UPDATE egress_outbox o SET dead_reason = d.reason, dead_held = d.held
            FROM unnest(p_dead_seqs, p_dead_reasons, p_dead_held) AS d(seq, reason, held)
            WHERE o.stream = p_stream AND o.seq = d.seq;
        END IF;
        IF p_acked IS NOT NULL THEN
            -- Dead letters stay, below the watermark too, until requeued
            -- or discarded.
            DELETE FROM egress_outbox WHERE stream = p_stream AND seq <= p_acked AND dead_reason IS NULL;
        END IF;
        RETURN stored;
    END $$;

    -- Dead letters, for people: every record held or tombstoned, with why
    -- and who holds its stream.
    CREATE VIEW egress_dead_letters AS
    SELECT o.stream, o.seq,
           CASE o.dead_reason WHEN 0 THEN 'permanent' WHEN 1 THEN 'retries' WHEN 2 THEN 'replays' END AS reason,
           o.dead_held AS held, length(o.payload) AS bytes, s.owner, s.lease_until
    FROM egress_outbox o JOIN egress_stream s USING (stream)
    WHERE o.dead_reason IS NOT NULL;
",
];

/// How long a store's statement waits for a row lock an application's
/// transaction holds before it fails as [`StoreError::Busy`].
const LOCK_TIMEOUT_MS: u32 = 50;

/// The PostgreSQL schema version this library writes.
pub const PG_SCHEMA_VERSION: u32 = 2;

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
    admission: crate::Admission,
}

impl PgOutbox {
    /// The outbox of `stream`, with no limit on a payload's size and no
    /// capacity.
    pub fn new(stream: impl Into<String>) -> Self {
        PgOutbox { stream: stream.into(), admission: crate::Admission::default() }
    }

    /// Refuses payloads above `bytes` with [`StoreError::TooLarge`], as
    /// [`Outbox::max_payload`](crate::Outbox::max_payload) does.
    #[must_use]
    pub fn max_payload(mut self, bytes: usize) -> Self {
        self.admission.max_payload = Some(bytes);
        self
    }

    /// Refuses an append while the stream holds `records` not yet
    /// acknowledged with [`StoreError::Full`], as
    /// [`Outbox::capacity`](crate::Outbox::capacity) does.
    #[must_use]
    pub fn capacity(mut self, records: u64) -> Self {
        self.admission.capacity = Some(records);
        self
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
    /// PostgreSQL's error (the schema missing: call [`migrate`] first), the
    /// counter out of range, a payload above the
    /// [limit](Self::max_payload) or an append past the
    /// [capacity](Self::capacity); nothing is appended then.
    pub async fn append(&self, tx: &Transaction<'_>, payload: &[u8]) -> Result<Sequence, StoreError> {
        self.admission.size(payload.len())?;
        tx.batch_execute("SAVEPOINT egress_append").await?;
        let result = async {
            // One statement: the counter (the stream's row created at 1 if
            // it has none), the record, the notification.
            let row = tx
                .query_one(
                    "WITH counter AS (
                         INSERT INTO egress_stream (stream, incarnation, next_sequence) VALUES ($1, $2, 1)
                         ON CONFLICT (stream) DO UPDATE SET next_sequence = egress_stream.next_sequence + 1
                         RETURNING next_sequence - 1 AS seq, acked_through),
                     record AS (
                         INSERT INTO egress_outbox (stream, seq, payload) SELECT $1, seq, $3 FROM counter
                         RETURNING seq)
                     SELECT record.seq, pg_notify($4, $1)::text, counter.acked_through FROM record, counter",
                    &[&self.stream, &fresh_incarnation().as_slice(), &payload, &CHANNEL],
                )
                .await?;
            let sequence = to_u64("sequence", row.get(0))?;
            let acked = row.get::<_, Option<i64>>(2).map(|a| to_u64("acked_through", a)).transpose()?;
            // Refused, the savepoint takes back the counter, the record and
            // the notification.
            self.admission.room(&self.stream, sequence, acked)?;
            Ok(Sequence(sequence))
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

    /// Appends `value` as `codec` encodes it (see [`append`](Self::append)):
    /// the append of a typed durable cell's stream, whose relay reads the
    /// record back with the same codec ([`open_durable_with`]).
    ///
    /// # Errors
    /// [`StoreError::Unencodable`] for a value `codec` refuses (nothing is
    /// appended), or [`append`](Self::append)'s.
    pub async fn append_encoded<T: 'static>(
        &self,
        tx: &Transaction<'_>,
        codec: &impl egress_codec::Encode<T>,
        value: &T,
    ) -> Result<Sequence, StoreError> {
        let payload = crate::stored::encode_one(codec, &self.stream, value)?;
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

/// One stream a [`PgStore::take_many`] took: its name, and its lease and
/// what was loaded, or why it could not be loaded.
pub type Taken = (String, Result<(Lease, Loaded), StoreError>);

/// A dead letter as the store keeps it (see [`PgStore::dead_letters`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// Its stream.
    pub stream: String,
    /// Its sequence.
    pub sequence: Sequence,
    /// Why it died, and whether it is held (the stream waits at it) or a
    /// tombstone (the stream moved past it).
    pub mark: DeadMark,
    /// Its payload.
    pub payload: Bytes,
}

/// A wake-up for one listener: set, and a waiter woken, when a
/// notification for it comes.
#[derive(Debug, Default)]
struct Bell {
    rung: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Bell {
    fn ring(&self) {
        self.rung.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    fn rung(&self) -> bool {
        self.rung.swap(false, Ordering::AcqRel)
    }
}

/// The streams whose journals listen on a store's connection, by name: one
/// entry per live [`PgJournal`] (a bound the worker's leases set).
type Bells = Arc<Mutex<HashMap<String, Arc<Bell>>>>;

/// The statements a store runs, prepared once per connection: each is one
/// round trip, and one implicit transaction.
struct Statements {
    take: Statement,
    load: Statement,
    skipped: Statement,
    apply: Statement,
    appended: Statement,
    renew: Statement,
    release: Statement,
}

struct Shared {
    client: Client,
    /// This worker's name, stored as the owner of the streams it takes (for
    /// people reading the table; the fence is the lease number).
    worker: String,
    statements: Statements,
    /// Rung by every notification.
    any: Arc<Bell>,
    /// Rung by a notification for their stream (registered by the relay's
    /// journals: without the `relay` feature, none).
    #[cfg_attr(not(feature = "relay"), allow(dead_code))]
    bells: Bells,
    connection: tokio::task::JoinHandle<()>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

/// One connection to a PostgreSQL database holding egress streams, for one
/// worker: it takes streams ([`take_many`](Self::take_many)), loads them,
/// writes their journals ([`apply`](Self::apply)) fenced by each stream's
/// lease, and hears the outbox's notifications.
///
/// A store is a handle: clones share the connection, and every stream the
/// worker holds goes through it. Each write is one statement (prepared
/// once; a `Ready` is one call of the `egress_apply` function, one round
/// trip and one transaction), so the writes of many streams pipeline on
/// the one connection instead of each holding a connection and a
/// transaction of its own. When the connection fails, every call fails
/// ([`is_closed`](Self::is_closed) tells); the leases then run out and
/// other workers take the streams over.
#[derive(Clone)]
pub struct PgStore {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").field("worker", &self.shared.worker).finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects to `url` (a libpq connection string or URL; no TLS), runs
    /// the connection on the current tokio runtime, migrates the schema,
    /// prepares the store's statements and listens on [`CHANNEL`]. `worker`
    /// names this store as the owner of the streams it takes.
    ///
    /// # Errors
    /// PostgreSQL's error, or a schema newer than this library.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub async fn connect(url: &str, worker: impl Into<String>) -> Result<Self, StoreError> {
        let (mut client, mut connection) = tokio_postgres::connect(url, NoTls).await?;
        let any = Arc::new(Bell { rung: AtomicBool::new(true), ..Bell::default() });
        let bells = Bells::default();
        let task = {
            let (any, bells) = (any.clone(), bells.clone());
            tokio::spawn(async move {
                while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    match message {
                        Ok(AsyncMessage::Notification(n)) => {
                            any.ring();
                            if let Some(bell) = bells.lock().get(n.payload()) {
                                bell.ring();
                            }
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
        let prepared = async {
            migrate(&mut client).await?;
            // The connection is every stream's: a statement waits at most
            // this long for a lock an application's transaction holds,
            // then fails as StoreError::Busy (and is retried), rather than
            // stalling the other streams behind it.
            client.batch_execute(&format!("SET lock_timeout = '{LOCK_TIMEOUT_MS}ms'; LISTEN {CHANNEL}")).await?;
            Ok::<_, StoreError>(Statements {
                take: client
                    .prepare(
                        "WITH free AS (
                             SELECT stream FROM egress_stream
                             WHERE (owner IS NULL OR lease_until IS NULL OR lease_until < clock_timestamp())
                               AND ($3::text IS NULL OR stream = $3)
                               AND lease < 9223372036854775807
                             ORDER BY lease_until NULLS FIRST, stream
                             LIMIT $4::bigint
                             FOR UPDATE SKIP LOCKED)
                         UPDATE egress_stream s
                         SET owner = $1::text, lease = s.lease + 1,
                             lease_until = clock_timestamp() + $2::bigint * interval '1 millisecond'
                         FROM free WHERE s.stream = free.stream
                         RETURNING s.stream, s.incarnation, s.lease, s.generation, s.next_sequence,
                                   s.acked_through",
                    )
                    .await?,
                load: client
                    .prepare(
                        "SELECT o.stream, o.seq, o.payload, o.dead_reason, o.dead_held
                         FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS t(stream, lo, hi)
                         JOIN egress_outbox o ON o.stream = t.stream AND o.seq >= t.lo AND o.seq < t.hi
                         ORDER BY o.stream, o.seq",
                    )
                    .await?,
                // The newest tombstones at or below each watermark: dead
                // letters the receiver skipped, whose status stays dead.
                skipped: client
                    .prepare(
                        "SELECT t.stream, d.seq, d.dead_reason, d.dead_held
                         FROM unnest($1::text[], $2::bigint[]) AS t(stream, lo)
                         CROSS JOIN LATERAL (
                             SELECT o.seq, o.dead_reason, o.dead_held FROM egress_outbox o
                             WHERE o.stream = t.stream AND o.seq < t.lo
                               AND o.dead_reason IS NOT NULL AND o.dead_held IS NOT TRUE
                             ORDER BY o.seq DESC LIMIT $3::bigint) AS d
                         ORDER BY t.stream, d.seq",
                    )
                    .await?,
                apply: client
                    .prepare(
                        "SELECT egress_apply($1::text, $2::bigint, $3::bigint, $4::bigint[], $5::bytea[],
                                             $6::bigint, $7::bigint[], $8::smallint[], $9::boolean[],
                                             $10::bigint, $11::boolean)",
                    )
                    .await?,
                appended: client
                    .prepare(
                        "SELECT seq, payload FROM egress_outbox
                         WHERE stream = $1::text AND seq >= $2::bigint ORDER BY seq LIMIT $3::bigint",
                    )
                    .await?,
                renew: client
                    .prepare(
                        "UPDATE egress_stream
                         SET lease_until = clock_timestamp() + $3::bigint * interval '1 millisecond'
                         WHERE stream = $1::text AND lease = $2::bigint",
                    )
                    .await?,
                release: client
                    .prepare(
                        "UPDATE egress_stream SET owner = NULL, lease_until = NULL
                         WHERE stream = $1::text AND lease = $2::bigint",
                    )
                    .await?,
            })
        }
        .await;
        let statements = match prepared {
            Ok(statements) => statements,
            Err(e) => {
                task.abort();
                return Err(e);
            }
        };
        let shared = Shared { client, worker: worker.into(), statements, any, bells, connection: task };
        Ok(PgStore { shared: Arc::new(shared) })
    }

    /// The connection, for reads (and for tests).
    pub fn client(&self) -> &Client {
        &self.shared.client
    }

    /// Whether the connection has failed or closed: every call fails from
    /// then on; connect again.
    pub fn is_closed(&self) -> bool {
        self.shared.client.is_closed()
    }

    /// Whether a notification came since the last call (`true` the first
    /// time, so that a new worker reads once). Cheap: no round trip.
    pub fn changed(&self) -> bool {
        self.shared.any.rung()
    }

    /// Completes when a notification comes (for a worker looking for
    /// streams to take, beside its poll interval).
    pub async fn notified(&self) {
        self.shared.any.notify.notified().await;
    }

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

    /// The dead letters of `stream` (every stream with `None`), in order,
    /// up to `limit`: records whose handler failed permanently or whose
    /// retries ran out, kept (below the stream's watermark too) until
    /// requeued or discarded. The same rows as the `egress_dead_letters`
    /// view, for people with `psql`.
    ///
    /// # Errors
    /// PostgreSQL's error, or a stored value out of range.
    pub async fn dead_letters(&self, stream: Option<&str>, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .shared
            .client
            .query(
                "SELECT stream, seq, dead_reason, dead_held, payload FROM egress_outbox
                 WHERE dead_reason IS NOT NULL AND ($1::text IS NULL OR stream = $1)
                 ORDER BY stream, seq LIMIT $2",
                &[&stream, &limit],
            )
            .await?;
        let mut letters = Vec::with_capacity(rows.len());
        for row in rows {
            let mark =
                dead_of(row.get::<_, Option<i16>>(2).map(i64::from), row.get::<_, Option<bool>>(3).map(i64::from))?;
            let Some(mark) = mark else { continue };
            letters.push(DeadLetter {
                stream: row.get(0),
                sequence: Sequence(to_u64("seq", row.get(1))?),
                mark,
                payload: Bytes::from(row.get::<_, Vec<u8>>(4)),
            });
        }
        Ok(letters)
    }

    /// Sends a dead letter the stream has moved past (its sequence at or
    /// below the stream's watermark) again: in one transaction, its row
    /// goes and its payload is appended to the end of the stream, as
    /// [`PgOutbox::append`] appends (the stream's worker adopts it and
    /// hands it to the handler afresh). Returns its new sequence.
    ///
    /// A dead letter the stream still waits at (held, above the watermark)
    /// is requeued in place by the cell that holds the stream
    /// ([`requeue`](egress_reactive::EgressCellOf::requeue)), not here.
    ///
    /// # Errors
    /// [`StoreError::NotDead`] when the record is not a dead letter the
    /// stream has passed (nothing changed), or PostgreSQL's error.
    pub async fn requeue(&self, stream: &str, sequence: Sequence) -> Result<Sequence, StoreError> {
        // One statement (clones share the connection, so no transaction
        // may span statements): the dead letter's row goes, the counter
        // rises (an application's append in progress holds it: then this
        // fails as busy after the lock timeout, and nothing changed), the
        // payload goes in at the old counter, and the stream's worker is
        // notified.
        let row = self
            .shared
            .client
            .query_opt(
                &format!(
                    "WITH dead AS ({DELETE_PASSED_DEAD}),
                 counter AS (
                     UPDATE egress_stream SET next_sequence = next_sequence + 1
                     WHERE stream = $1 AND EXISTS (SELECT 1 FROM dead)
                     RETURNING next_sequence - 1 AS seq),
                 record AS (
                     INSERT INTO egress_outbox (stream, seq, payload)
                     SELECT $1, counter.seq, dead.payload FROM counter, dead
                     RETURNING seq)
                 SELECT seq, pg_notify($3, $1)::text FROM record"
                ),
                &[&stream, &to_i64("sequence", sequence.0)?, &CHANNEL],
            )
            .await
            .map_err(|e| busy_or(stream, e))?;
        let row = row.ok_or_else(|| StoreError::NotDead { stream: stream.to_owned(), sequence })?;
        Ok(Sequence(to_u64("sequence", row.get(0))?))
    }

    /// Deletes a dead letter the stream has moved past, for good.
    ///
    /// # Errors
    /// [`StoreError::NotDead`] when the record is not a dead letter the
    /// stream has passed (nothing changed), or PostgreSQL's error.
    pub async fn discard(&self, stream: &str, sequence: Sequence) -> Result<(), StoreError> {
        let deleted = self
            .shared
            .client
            .execute(DELETE_PASSED_DEAD, &[&stream, &to_i64("sequence", sequence.0)?])
            .await
            .map_err(|e| busy_or(stream, e))?;
        if deleted == 0 {
            return Err(StoreError::NotDead { stream: stream.to_owned(), sequence });
        }
        Ok(())
    }
}

/// Deletes the dead letter `$2` of stream `$1` if the stream's watermark
/// has passed it, returning its payload: what `requeue` and `discard` both
/// start with.
const DELETE_PASSED_DEAD: &str = "
    DELETE FROM egress_outbox o USING egress_stream s
    WHERE o.stream = $1 AND o.seq = $2 AND o.dead_reason IS NOT NULL
      AND s.stream = o.stream AND o.seq <= s.acked_through
    RETURNING o.payload";

/// The longest lease: 100 years (a timestamp that far ahead is still one
/// PostgreSQL can store). Longer leases are taken as this.
pub const MAX_LEASE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A lease's duration in milliseconds, at most [`MAX_LEASE`].
fn lease_millis(lease: Duration) -> i64 {
    i64::try_from(lease.min(MAX_LEASE).as_millis()).unwrap_or(i64::MAX)
}

/// PostgreSQL's error, or [`StoreError::Busy`] when it is a lock that an
/// application's transaction holds (`lock_not_available`: `NOWAIT`, or the
/// connection's `lock_timeout`).
fn busy_or(stream: &str, e: tokio_postgres::Error) -> StoreError {
    if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
        StoreError::Busy { stream: stream.to_owned() }
    } else {
        StoreError::Postgres(e)
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
/// stream being another worker's), reads the outbox when notified of the
/// stream or every `poll` at the latest (`NOTIFY` does not pass a
/// transaction-mode pooler), and releases the lease when it shuts down.
#[cfg(feature = "relay")]
#[derive(Debug)]
pub struct PgJournal {
    store: PgStore,
    lease: Lease,
    bell: Arc<Bell>,
    duration: Duration,
    poll: Duration,
    renew_at: tokio::time::Instant,
    poll_at: tokio::time::Instant,
}

#[cfg(feature = "relay")]
impl Drop for PgJournal {
    fn drop(&mut self) {
        let mut bells = self.store.shared.bells.lock();
        if bells.get(&self.lease.stream).is_some_and(|b| Arc::ptr_eq(b, &self.bell)) {
            bells.remove(&self.lease.stream);
        }
    }
}

#[cfg(feature = "relay")]
impl PgJournal {
    /// `lease` of `store`, taken for `duration`; the outbox read every
    /// `poll` at the latest, and when a notification names the stream.
    pub fn new(store: PgStore, lease: Lease, duration: Duration, poll: Duration) -> Self {
        let bell = Arc::new(Bell { rung: AtomicBool::new(true), ..Bell::default() });
        store.shared.bells.lock().insert(lease.stream.clone(), bell.clone());
        let now = tokio::time::Instant::now();
        PgJournal { store, lease, bell, duration, poll, renew_at: now + duration / 2, poll_at: now + poll }
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
        Ok(self.bell.rung() || polled)
    }

    async fn keep(&mut self) -> Result<(), StoreError> {
        if self.store.is_closed() {
            return Err(StoreError::Closed);
        }
        let now = tokio::time::Instant::now();
        if now >= self.renew_at {
            self.store.renew(&self.lease, self.duration).await?;
            self.renew_at = now + self.duration / 2;
        }
        Ok(())
    }

    fn news(&self) -> impl Future<Output = ()> + Send + 'static {
        let bell = self.bell.clone();
        async move { bell.notify.notified().await }
    }

    async fn close(&mut self) -> Result<(), StoreError> {
        self.store.release(&self.lease).await
    }

    fn stream(&self) -> &str {
        &self.lease.stream
    }
}

/// Takes `stream` for `lease` (see [`PgStore::take_stream`]), or with
/// `None` any free stream ([`PgStore::take`]), restores a cell from it and
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
/// [`PgOutbox::append_encoded`] and the same codec).
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
    loaded: Loaded,
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
