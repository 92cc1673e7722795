//! The store: one connection shared by its worker's streams, its prepared
//! statements, and the notifications that wake each stream's journal.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use tokio_postgres::{AsyncMessage, Client, NoTls, Statement};

use super::CHANNEL;
use super::keeper::{self, Keeper, LeaseStats};
use super::schema::{LOCK_TIMEOUT_MS, migrate};
use crate::StoreError;

/// A wake-up for one listener: set, and a waiter woken, when a
/// notification for it comes.
#[derive(Debug, Default)]
pub(super) struct Bell {
    pub(super) rung: AtomicBool,
    pub(super) notify: tokio::sync::Notify,
}

impl Bell {
    pub(super) fn ring(&self) {
        self.rung.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    pub(super) fn rung(&self) -> bool {
        self.rung.swap(false, Ordering::AcqRel)
    }
}

/// The streams whose journals listen on a store's connection, by name: one
/// entry per live [`PgJournal`] (a bound the worker's leases set).
pub(super) type Bells = Arc<Mutex<HashMap<String, Arc<Bell>>>>;

/// The statements a store runs, prepared once per connection: each is one
/// round trip, and one implicit transaction.
pub(super) struct Statements {
    pub(super) take: Statement,
    pub(super) state: Statement,
    pub(super) load: Statement,
    pub(super) skipped: Statement,
    pub(super) apply: Statement,
    pub(super) appended: Statement,
    pub(super) renew: Statement,
    pub(super) release: Statement,
    pub(super) apply_lanes: Statement,
    pub(super) apply_latest: Statement,
}

pub(super) struct Shared {
    pub(super) client: Client,
    /// This worker's name, stored as the owner of the streams it takes (for
    /// people reading the table; the fence is the lease number).
    pub(super) worker: String,
    pub(super) statements: Statements,
    /// Rung by every notification.
    pub(super) any: Arc<Bell>,
    /// Rung by a notification for their stream (registered by the relay's
    /// journals: without the `relay` feature, none).
    #[cfg_attr(not(feature = "relay"), allow(dead_code))]
    pub(super) bells: Bells,
    pub(super) connection: tokio::task::JoinHandle<()>,
    /// The leases the store's journals hold, renewed by `keeper_task`.
    #[cfg_attr(not(feature = "relay"), allow(dead_code))]
    pub(super) keeper: Arc<Keeper>,
    pub(super) keeper_task: tokio::task::JoinHandle<()>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.connection.abort();
        self.keeper_task.abort();
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
    pub(super) shared: Arc<Shared>,
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
                             SELECT stream, owner, until FROM egress_lease
                             WHERE (owner IS NULL OR until IS NULL OR until < clock_timestamp())
                               AND ($3::text IS NULL OR stream = $3)
                               AND lease < 9223372036854775807
                               -- Lanes only by their own take; a plain take only plain streams.
                               AND (SELECT s.lanes FROM egress_stream s WHERE s.stream = egress_lease.stream)
                                   IS NOT DISTINCT FROM $5::text
                             ORDER BY until NULLS FIRST, stream
                             LIMIT $4::bigint
                             FOR UPDATE SKIP LOCKED)
                         UPDATE egress_lease l
                         SET owner = $1::text, lease = l.lease + 1,
                             until = clock_timestamp() + $2::bigint * interval '1 millisecond'
                         FROM free WHERE l.stream = free.stream
                         RETURNING l.stream, l.lease, free.owner,
                                   CASE WHEN isfinite(free.until)
                                        THEN (extract(epoch FROM clock_timestamp() - free.until) * 1000)::bigint
                                   END",
                    )
                    .await?,
                // What a take took, read once the take committed: no write
                // of the stream's previous owner can commit after it.
                state: client
                    .prepare(
                        "SELECT stream, incarnation, generation, next_sequence, acked_through
                         FROM egress_stream WHERE stream = ANY($1::text[])",
                    )
                    .await?,
                load: client
                    .prepare(
                        "SELECT o.stream, o.seq, o.payload, o.dead_reason, o.dead_held, o.ordinal
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
                // Each lease renewed unless another session holds its row
                // (a take in progress, or a lock taken by hand): that one
                // is skipped, not waited for, so one held row delays no
                // other lease. Per lease: renewed, and whether its number
                // is still the stream's (skipped and still its own: busy).
                renew: client
                    .prepare(
                        "WITH r AS (
                             SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS r(stream, lease, millis)),
                         held AS (
                             SELECT l.stream FROM egress_lease l JOIN r ON l.stream = r.stream AND l.lease = r.lease
                             FOR UPDATE OF l SKIP LOCKED),
                         renewed AS (
                             UPDATE egress_lease l
                             SET until = clock_timestamp() + r.millis * interval '1 millisecond'
                             FROM r, held WHERE l.stream = r.stream AND l.stream = held.stream
                             RETURNING l.stream)
                         SELECT r.stream, r.stream IN (SELECT stream FROM renewed),
                                EXISTS (SELECT 1 FROM egress_lease l WHERE l.stream = r.stream AND l.lease = r.lease)
                         FROM r",
                    )
                    .await?,
                release: client
                    .prepare(
                        "UPDATE egress_lease SET owner = NULL, until = NULL
                         WHERE stream = $1::text AND lease = $2::bigint",
                    )
                    .await?,
                apply_lanes: client
                    .prepare(
                        "SELECT fenced, conflict, stored FROM egress_apply_lanes(
                             $1::text, $2::bigint, $3::text[], $4::text[], $5::text[], $6::bigint[], $7::integer[],
                             $8::bigint[], $9::bigint[], $10::bigint[], $11::bytea[], $12::bigint[], $13::integer[],
                             $14::bigint[], $15::smallint[], $16::boolean[], $17::bigint, $18::bigint, $19::boolean)",
                    )
                    .await?,
                apply_latest: client
                    .prepare(
                        "SELECT egress_apply_latest($1::text, $2::bigint, $3::text[], $4::text[], $5::bigint[],
                             $6::bytea[], $7::bigint[], $8::boolean)",
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
        let keeper = Arc::new(Keeper::default());
        let shared = Arc::new_cyclic(|weak| Shared {
            client,
            worker: worker.into(),
            statements,
            any,
            bells,
            connection: task,
            keeper_task: tokio::spawn(keeper::run(keeper.clone(), weak.clone())),
            keeper,
        });
        Ok(PgStore { shared })
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

    /// What the store's lease keeper has seen (the leases of its
    /// `PgJournal`s): renewals, lapses, losses.
    pub fn lease_stats(&self) -> LeaseStats {
        self.shared.keeper.stats()
    }

    /// Completes when a notification comes (for a worker looking for
    /// streams to take, beside its poll interval).
    pub async fn notified(&self) {
        self.shared.any.notify.notified().await;
    }
}
