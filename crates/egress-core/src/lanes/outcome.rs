//! What the transitions of [`Lanes`](crate::Lanes) report beyond the
//! outcomes a single core reports.

use core::fmt;
use core::num::NonZeroUsize;

use crate::changes::Changes;
use crate::envelope::Envelope;
use crate::ids::{Generation, Ordinal, Sequence};
use crate::outcome::Refusal;

/// What [`enqueue`](crate::Lanes::enqueue) assigned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enqueued {
    /// The record's place in the enqueue order across lanes.
    pub ordinal: Ordinal,
    /// Its place in its lane's order.
    pub sequence: Sequence,
    /// Whether the lane was made for it (the set of lanes changed; an idle
    /// lane may have been freed to make room).
    pub new_lane: bool,
}

/// An enqueue refused because its key would be one lane too many: every
/// lane that exists is busy. The payload comes back; nothing changed.
#[derive(Clone, PartialEq, Eq)]
pub struct TooManyLanes<T> {
    /// How many lanes may exist at once.
    pub limit: usize,
    /// The refused payload, returned to the caller.
    pub payload: T,
}

impl<T> fmt::Debug for TooManyLanes<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TooManyLanes").field("limit", &self.limit).finish_non_exhaustive()
    }
}

impl<T> fmt::Display for TooManyLanes<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "refused: all {} lanes are busy, and a new key needs one more", self.limit)
    }
}

impl<T> std::error::Error for TooManyLanes<T> {}

/// A record [`claim`](crate::Lanes::claim)ed from a lane: send it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneEnvelope<'a, K, T> {
    /// The lane it belongs to.
    pub lane: &'a K,
    /// Its place in the enqueue order across lanes: with the producer and
    /// its incarnation, an idempotency key no other record of this
    /// `Lanes` shares.
    pub ordinal: Ordinal,
    /// The record, as its lane's core hands it out.
    pub envelope: Envelope<&'a T>,
}

/// What [`claim`](crate::Lanes::claim) found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LanesClaim<'a, K, T> {
    /// The releasable record enqueued first, now in flight.
    Claimed(LaneEnvelope<'a, K, T>),
    /// Nothing is pending in any lane.
    Empty,
    /// Records are pending, and none can go now: each one's lane is
    /// occupied (its window is full, or a held or backing-off record holds
    /// it), or it waits for a flush epoch.
    Waiting,
    /// The cap on records in flight across lanes is reached.
    Full {
        /// The cap.
        cap: NonZeroUsize,
    },
    /// Refused: see [`Refusal::StaleGeneration`].
    StaleGeneration {
        /// The current generation.
        current: Generation,
    },
}

/// What [`complete`](crate::Lanes::complete) did with a completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompleteOutcome {
    /// The lane's acknowledgement watermark moved to `through`: this
    /// completion closed the lowest gap.
    Advanced {
        /// The lane's new watermark.
        through: Sequence,
    },
    /// Recorded above a gap: the lane acknowledges it once every record
    /// below it completes.
    Waiting,
    /// Already completed (a duplicate): no change.
    Unchanged,
    /// Refused: see [`Refusal::UnknownSequence`] (not in flight in that
    /// lane).
    UnknownSequence {
        /// The sequence named.
        sequence: Sequence,
    },
    /// Refused: see [`Refusal::StaleGeneration`].
    StaleGeneration {
        /// The current generation.
        current: Generation,
    },
}

/// What [`reconnect`](crate::Lanes::reconnect) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LanesReconnect<K> {
    /// Every lane moved to `generation`.
    Advanced {
        /// The new generation.
        generation: Generation,
        /// Records that left flight or parking, over every lane.
        replayed: usize,
        /// How many of them became dead letters.
        dead: usize,
        /// Each lane, with what its reconnect changed.
        lanes: Vec<(K, Changes)>,
    },
    /// Already at that generation: no change.
    Unchanged,
    /// Refused: see [`Refusal::StaleGeneration`].
    StaleGeneration {
        /// The current generation.
        current: Generation,
    },
}

impl<K, T> LanesClaim<'_, K, T> {
    /// The refusal this outcome stands for, if it is one.
    #[must_use]
    pub const fn refusal(&self) -> Option<Refusal> {
        match *self {
            Self::StaleGeneration { current } => Some(Refusal::StaleGeneration { current }),
            _ => None,
        }
    }
}

impl CompleteOutcome {
    /// The refusal this outcome stands for, if it is one.
    #[must_use]
    pub const fn refusal(&self) -> Option<Refusal> {
        match *self {
            Self::StaleGeneration { current } => Some(Refusal::StaleGeneration { current }),
            Self::UnknownSequence { sequence } => Some(Refusal::UnknownSequence { sequence }),
            _ => None,
        }
    }
}

impl<K> LanesReconnect<K> {
    /// The refusal this outcome stands for, if it is one.
    #[must_use]
    pub const fn refusal(&self) -> Option<Refusal> {
        match *self {
            Self::StaleGeneration { current } => Some(Refusal::StaleGeneration { current }),
            _ => None,
        }
    }
}
