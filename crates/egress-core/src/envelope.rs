//! What a transport sends: a payload stamped with its generation, sequence
//! and attempt, or a tombstone saying the sequence is skipped.

use crate::ids::{Attempt, Generation, Sequence};
use crate::retry::DeadReason;

/// A payload with its delivery stamps.
///
/// The core stores `Envelope`-shaped records and hands out
/// `Envelope<&T>` views, so claiming never clones a payload.
///
/// When [`dead`](Self::dead) is `Some`, the envelope is a **tombstone**: the
/// record is a dead letter (see [`DeadLetters::Skip`](crate::DeadLetters)),
/// and the transport must tell the peer that this sequence is skipped, for
/// that reason, instead of sending the payload. The payload stays attached
/// so that the application can still see what was lost.
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
    /// `Some(reason)` for a tombstone: send "sequence skipped" instead of
    /// the payload.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub dead: Option<DeadReason>,
}

impl<P> Envelope<P> {
    /// The same stamps around a different payload.
    pub fn map<Q>(self, f: impl FnOnce(P) -> Q) -> Envelope<Q> {
        Envelope {
            generation: self.generation,
            sequence: self.sequence,
            attempt: self.attempt,
            payload: f(self.payload),
            dead: self.dead,
        }
    }

    /// Whether this is a tombstone (see [`dead`](Self::dead)).
    pub const fn is_tombstone(&self) -> bool {
        self.dead.is_some()
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
    /// Claims so far, over the record's whole life (saturating).
    pub(crate) attempt: Attempt,
    /// Failures reported by `fail` in the current budget.
    pub(crate) failures: u32,
    /// Replays in the current budget: reconnects that found the record in
    /// flight, less those the peer turned out to hold before it was sent
    /// again (see `EgressCore::received`).
    pub(crate) replays: u32,
    /// The last reconnect charged a replay to this record and it has not
    /// been claimed since: a `received` covering it refunds the charge.
    pub(crate) resend: bool,
    /// Set when the record became a tombstone.
    pub(crate) dead: Option<DeadReason>,
    pub(crate) payload: T,
}

impl<T> Record<T> {
    pub(crate) const fn new(sequence: Sequence, payload: T) -> Self {
        Record { sequence, attempt: Attempt(0), failures: 0, replays: 0, resend: false, dead: None, payload }
    }

    pub(crate) fn view(&self, generation: Generation) -> Envelope<&T> {
        Envelope { generation, sequence: self.sequence, attempt: self.attempt, payload: &self.payload, dead: self.dead }
    }

    /// Starts a fresh budget: no failures, no replays.
    pub(crate) fn fresh_budget(&mut self) {
        self.failures = 0;
        self.replays = 0;
        self.resend = false;
    }
}

/// A dead letter held back (see [`DeadLetters::Hold`](crate::DeadLetters)):
/// kept with the generation it failed under and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Exhausted<T> {
    pub(crate) generation: Generation,
    pub(crate) reason: DeadReason,
    pub(crate) record: Record<T>,
}
