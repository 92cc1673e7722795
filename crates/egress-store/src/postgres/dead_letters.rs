//! Dead letters kept past the watermark: listed, requeued at the end of
//! their stream, or discarded.

use bytes::Bytes;
use egress_core::{DeadMark, Sequence};

use super::{CHANNEL, PgStore, busy_or};
use crate::StoreError;
use crate::stored::{dead_of, to_i64, to_u64};

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

impl PgStore {
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
    /// [`PgOutbox::append`](super::PgOutbox::append) appends (the stream's worker adopts it and
    /// hands it to the handler afresh). Returns its new sequence.
    ///
    /// A dead letter the stream still waits at (held, above the watermark)
    /// is requeued in place by the cell that holds the stream
    /// ([`requeue`](egress_reactive::EgressCellOf::requeue)), not here.
    ///
    /// # Errors
    /// [`StoreError::NotDead`] when the record is not a dead letter the
    /// stream has passed (nothing changed), [`StoreError::OtherKind`] for a
    /// lane's stream (its counter is its lanes' core's: a record appended
    /// here would stop every lane's writes), or PostgreSQL's error.
    pub async fn requeue(&self, stream: &str, sequence: Sequence) -> Result<Sequence, StoreError> {
        crate::lanes::plain_name(stream)?;
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
    /// stream has passed (nothing changed), [`StoreError::OtherKind`] for a
    /// lane's stream (written only through its lanes, whose freeing deletes
    /// it with its dead letters), or PostgreSQL's error.
    pub async fn discard(&self, stream: &str, sequence: Sequence) -> Result<(), StoreError> {
        crate::lanes::plain_name(stream)?;
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
