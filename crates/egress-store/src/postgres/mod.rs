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
//! **Lanes** ([`PgStore::take_lanes`], [`open_durable_lanes`]): the lanes'
//! own row is a stream whose lease fences every lane; each lane is a
//! stream of theirs that no plain take takes.
//!
//! **Latest projections** ([`PgStore::take_latest`],
//! [`open_durable_latest`]): the projection's own row is a stream marked
//! latest whose lease fences its writes; each key is a row of
//! `egress_latest_key`. Streams, lanes and latest projections share one
//! namespace: a name is one of them ([`StoreError::LatestKind`],
//! [`StoreError::OtherKind`] otherwise).
//!
//! **Dead letters stay.** A record that died (its handler failed
//! permanently, or its retries ran out) keeps its row when the stream's
//! watermark passes it: [`PgStore::dead_letters`] (or the
//! `egress_dead_letters` view) lists them, [`PgStore::requeue`] appends
//! one again at the end of its stream, [`PgStore::discard`] deletes it.

mod dead_letters;
mod journal;
mod keeper;
mod lanes;
mod latest;
mod leases;
mod outbox;
mod schema;
mod store;

pub use dead_letters::DeadLetter;
#[cfg(feature = "relay")]
pub use journal::{PgJournal, open_durable, open_durable_many, open_durable_with};
pub use keeper::LeaseStats;
#[cfg(feature = "relay")]
pub use lanes::{PgLanes, open_durable_lanes};
#[cfg(feature = "relay")]
pub use latest::{PgLatest, open_durable_latest};
pub use leases::{Lease, MAX_LEASE, MIN_LEASE, Taken, lease_for};
pub use outbox::PgOutbox;
pub use schema::{PG_SCHEMA_VERSION, migrate};
pub use store::PgStore;

use tokio_postgres::GenericClient;

use crate::StoreError;
use crate::stored::fresh_incarnation;

/// The channel the outbox notifies on at commit (the payload is the
/// stream's name).
pub const CHANNEL: &str = "egress_outbox";

/// PostgreSQL's error; [`StoreError::Busy`] when it is a lock that an
/// application's transaction holds (`lock_not_available`: `NOWAIT`, or the
/// connection's `lock_timeout`); [`StoreError::OtherKind`] when a write
/// met a stream of other lanes, or of none (`EGR01`, raised by
/// `egress_write` and `egress_apply_lanes` with the stream as its detail
/// and the lanes it belongs to as its hint).
fn busy_or(stream: &str, e: tokio_postgres::Error) -> StoreError {
    if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
        return StoreError::Busy { stream: stream.to_owned() };
    }
    if e.code().is_some_and(|c| c.code() == OTHER_KIND)
        && let Some(db) = e.as_db_error()
    {
        let lanes = db.hint().filter(|h| !h.is_empty()).map(str::to_owned);
        return StoreError::OtherKind { stream: db.detail().unwrap_or(stream).to_owned(), lanes };
    }
    StoreError::Postgres(e)
}

/// The SQLSTATE of a write that met a stream of other lanes (or of none).
const OTHER_KIND: &str = "EGR01";

/// Creates the stream's row if it has none (generation 0, nothing stored,
/// a fresh incarnation, held by no one).
async fn ensure_stream(client: &impl GenericClient, stream: &str) -> Result<(), StoreError> {
    client
        .execute(
            // Not even tried when the row is there (an application's
            // transaction may hold it: the insert would wait for it).
            "INSERT INTO egress_stream (stream, incarnation)
             SELECT $1, $2 WHERE NOT EXISTS (SELECT 1 FROM egress_stream WHERE stream = $1)
             ON CONFLICT (stream) DO NOTHING",
            &[&stream, &fresh_incarnation().as_slice()],
        )
        .await?;
    Ok(())
}
