//! What a transport sends: a payload stamped with its generation, sequence
//! and attempt.

use crate::ids::{Attempt, Generation, Sequence};

/// A payload with its delivery stamps.
///
/// The core stores `Envelope`-shaped records and hands out
/// `Envelope<&T>` views, so claiming never clones a payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Envelope<P> {
    /// The generation the record is (or was last) sent under.
    pub generation: Generation,
    /// Its place in the send order.
    pub sequence: Sequence,
    /// How many times it has been claimed, this claim included.
    pub attempt: Attempt,
    /// The caller's payload.
    pub payload: P,
}

impl<P> Envelope<P> {
    /// The same stamps around a different payload.
    pub fn map<Q>(self, f: impl FnOnce(P) -> Q) -> Envelope<Q> {
        Envelope {
            generation: self.generation,
            sequence: self.sequence,
            attempt: self.attempt,
            payload: f(self.payload),
        }
    }
}

impl<P: Clone> Envelope<&P> {
    /// An owned copy (clones the payload).
    #[must_use]
    pub fn cloned(self) -> Envelope<P> {
        self.map(Clone::clone)
    }
}

/// A record while the core holds it. Its generation is implied (the core's)
/// except when exhausted, where [`Exhausted`] keeps its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record<T> {
    pub(crate) sequence: Sequence,
    pub(crate) attempt: Attempt,
    /// The attempt count when its current retry budget began.
    pub(crate) budget_start: Attempt,
    pub(crate) payload: T,
}

impl<T> Record<T> {
    pub(crate) fn view(&self, generation: Generation) -> Envelope<&T> {
        Envelope { generation, sequence: self.sequence, attempt: self.attempt, payload: &self.payload }
    }

    /// Failures since its budget began, the current one included.
    pub(crate) fn attempts_in_budget(&self) -> u32 {
        self.attempt.0.saturating_sub(self.budget_start.0)
    }
}

/// A dead letter: kept with the generation it failed under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Exhausted<T> {
    pub(crate) generation: Generation,
    pub(crate) record: Record<T>,
}
