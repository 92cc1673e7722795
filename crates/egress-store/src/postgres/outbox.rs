//! The outbox: appends in the application's own PostgreSQL transaction.

use egress_core::Sequence;
use tokio_postgres::Transaction;

use super::CHANNEL;
use crate::StoreError;
use crate::stored::{fresh_incarnation, to_u64};

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
    /// PostgreSQL's error (the schema missing: call [`migrate`](super::migrate) first), the
    /// counter out of range, a payload above the
    /// [limit](Self::max_payload) or an append past the
    /// [capacity](Self::capacity), or a stream of lanes
    /// ([`StoreError::OtherKind`]: lanes are written only through their
    /// lanes), or a latest projection's name ([`StoreError::LatestKind`]);
    /// nothing is appended then.
    pub async fn append(&self, tx: &Transaction<'_>, payload: &[u8]) -> Result<Sequence, StoreError> {
        crate::lanes::plain_name(&self.stream)?;
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
                         RETURNING next_sequence - 1 AS seq, acked_through, lanes, latest),
                     record AS (
                         INSERT INTO egress_outbox (stream, seq, payload) SELECT $1, seq, $3 FROM counter
                         RETURNING seq)
                     SELECT record.seq, pg_notify($4, $1)::text, counter.acked_through, counter.lanes, counter.latest
                     FROM record, counter",
                    &[&self.stream, &fresh_incarnation().as_slice(), &payload, &CHANNEL],
                )
                .await?;
            // Lanes are written only through their lanes (their counters
            // are the core's): refused, and taken back below.
            if row.get::<_, bool>(4) {
                return Err(StoreError::LatestKind { name: self.stream.clone(), latest: true });
            }
            if let Some(lanes) = row.get::<_, Option<String>>(3) {
                return Err(StoreError::OtherKind { stream: self.stream.clone(), lanes: Some(lanes) });
            }
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
    /// record back with the same codec (`open_durable_with`).
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
