//! What a restart starts from: what a store recovered for one stream
//! ([`Restored`], one [`RestoredRecord`] per stored record), why the core
//! refuses it ([`RestoreError`]), and what it found ([`Recovered`]). The
//! restore itself is [`EgressCore::restore`](crate::EgressCore::restore).

#[cfg(doc)]
use crate::EgressCore;
use crate::durable::DeadMark;
use crate::ids::{Generation, Sequence};
use crate::retry::DeadReason;

/// What a store recovered for one stream, for [`EgressCore::restore`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restored<T> {
    /// The stored generation: the next handshake goes above it.
    pub generation: Generation,
    /// The sequence the next record takes.
    pub next_sequence: Sequence,
    /// The stored acknowledgement watermark.
    pub acked_through: Option<Sequence>,
    /// Every stored record above `acked_through`, ascending, without a gap,
    /// up to `next_sequence - 1`.
    pub records: Vec<RestoredRecord<T>>,
    /// The dead letters the store remembers as skipped (their tombstones
    /// acknowledged), ascending, each at or below `acked_through`: their
    /// [`status`](EgressCore::status) stays dead after the restart. A store
    /// that keeps none gives none; of more than
    /// [`SKIPPED_MEMORY`](crate::SKIPPED_MEMORY) the newest are kept.
    pub skipped: Vec<(Sequence, DeadReason)>,
}

impl<T> Restored<T> {
    /// Nothing stored: a new stream at generation 0.
    #[must_use]
    pub const fn empty() -> Self {
        Restored {
            generation: Generation(0),
            next_sequence: Sequence(0),
            acked_through: None,
            records: Vec::new(),
            skipped: Vec::new(),
        }
    }
}

/// One stored record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoredRecord<T> {
    /// Its sequence.
    pub sequence: Sequence,
    /// Its payload.
    pub payload: T,
    /// `Some` for a dead letter.
    pub dead: Option<DeadMark>,
}

/// Why a snapshot cannot be restored. Nothing is built; the store's data is
/// not consistent with the rules it was written under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RestoreError {
    /// A record is missing: the receiver would wait for it forever.
    #[error("record {expected} is missing (found {found:?} in its place)")]
    Gap {
        /// The sequence expected.
        expected: Sequence,
        /// What was found instead (`None`: the records ended).
        found: Option<Sequence>,
    },
    /// A record lies outside `(acked_through, next_sequence)`, or a skipped
    /// dead letter above `acked_through` or out of ascending order.
    #[error("record {sequence} lies outside the stored range")]
    OutOfRange {
        /// The sequence found.
        sequence: Sequence,
    },
    /// `next_sequence` is above `i64::MAX`: fewer than 2^63 sequences
    /// would be left to assign. Below the bound, running out takes 2^63
    /// enqueues (292 years at a billion a second), so `enqueue` never
    /// meets the end of the sequence space; the stores (SQLite and
    /// PostgreSQL integers) cannot hold more anyway.
    #[error("the next sequence {next_sequence} is above i64::MAX")]
    SequenceSpace {
        /// The stored next sequence.
        next_sequence: Sequence,
    },
    /// The acknowledgement watermark is at or above `next_sequence`.
    #[error("acknowledged through {acked_through} but the next sequence is {next_sequence}")]
    AckedBeyondNext {
        /// The stored watermark.
        acked_through: Sequence,
        /// The stored next sequence.
        next_sequence: Sequence,
    },
}

/// What [`EgressCore::restore`] found in the store: what a UI shows after a
/// restart ("12 messages recovered, 1 dead"). It does not change
/// afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recovered {
    /// The stored generation.
    pub generation: Generation,
    /// The stored next sequence.
    pub next_sequence: Sequence,
    /// The stored acknowledgement watermark.
    pub acked_through: Option<Sequence>,
    /// Records restored to pending, tombstones included.
    pub pending: usize,
    /// Of those, tombstones.
    pub tombstones: usize,
    /// Dead letters restored as held.
    pub held: usize,
}
