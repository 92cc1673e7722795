//! What each transition reports: an outcome, and the projections it changed.

use crate::changes::Changes;
use crate::envelope::Envelope;
use crate::ids::{Generation, Sequence};
use crate::retry::Retry;

/// The result of one transition: what happened, and which projections a
/// shell must invalidate. Refusals and no-ops carry [`Changes::NONE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a transition's outcome says whether it was refused, and its changes what to invalidate"]
pub struct Transition<O> {
    /// What happened.
    pub outcome: O,
    /// The projections whose value changed.
    pub changes: Changes,
}

impl<O> Transition<O> {
    pub(crate) const fn new(outcome: O, changes: Changes) -> Self {
        Self { outcome, changes }
    }

    pub(crate) const fn unchanged(outcome: O) -> Self {
        Self { outcome, changes: Changes::NONE }
    }
}

/// A call the core refused: bad input from the caller or a peer. The state
/// is unchanged and nothing was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The caller works under an older or newer generation than the core.
    /// A fenced transport should stop; wait for the next attachment.
    #[error("stale generation: the core is at {current}")]
    StaleGeneration {
        /// The core's generation.
        current: Generation,
    },
    /// The sequence is not where the operation needs it (not in flight for
    /// `fail`, not parked for `retry_now`, not exhausted for `requeue`).
    #[error("sequence {sequence} is not in a state this operation applies to")]
    UnknownSequence {
        /// The sequence named by the caller.
        sequence: Sequence,
    },
    /// An acknowledgement of a sequence never assigned: it would drop
    /// records that were never sent, so it is refused.
    #[error("ack through {through} refused: only sequences below {next_sequence} were assigned")]
    Unassigned {
        /// The acknowledged sequence.
        through: Sequence,
        /// The next sequence the core would assign.
        next_sequence: Sequence,
    },
}

/// What [`claim`](crate::EgressCore::claim) found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimOutcome<'a, T> {
    /// The oldest pending record, now in flight: send it.
    Claimed(Envelope<&'a T>),
    /// Nothing is pending.
    Empty,
    /// The window is full: wait for an ack or a failure.
    WindowFull,
    /// Strict ordering: this parked or exhausted sequence lies before the
    /// head of pending and holds it back.
    Blocked {
        /// The lowest blocking sequence.
        sequence: Sequence,
    },
    /// Refused: see [`Refusal::StaleGeneration`].
    StaleGeneration {
        /// The core's generation.
        current: Generation,
    },
}

/// What [`ack`](crate::EgressCore::ack) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckOutcome {
    /// The watermark moved to `through`.
    Advanced {
        /// The new watermark.
        through: Sequence,
    },
    /// Already acknowledged (a duplicate or reordered ack): no change.
    Unchanged {
        /// The current watermark.
        through: Option<Sequence>,
    },
    /// Refused: see [`Refusal::Unassigned`].
    Unassigned {
        /// The acknowledged sequence.
        through: Sequence,
        /// The next sequence the core would assign.
        next_sequence: Sequence,
    },
    /// Refused: see [`Refusal::StaleGeneration`].
    StaleGeneration {
        /// The core's generation.
        current: Generation,
    },
}

/// What [`fail`](crate::EgressCore::fail) did with the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailOutcome {
    /// Parked until `now + retry.backoff`.
    Retrying(Retry),
    /// Its budget is spent, or the failure was permanent: a dead letter.
    Exhausted(Retry),
    /// Refused: see [`Refusal::UnknownSequence`].
    UnknownSequence {
        /// The sequence named by the caller.
        sequence: Sequence,
    },
    /// Refused: see [`Refusal::StaleGeneration`].
    StaleGeneration {
        /// The core's generation.
        current: Generation,
    },
}

/// What [`retry_now`](crate::EgressCore::retry_now) and
/// [`requeue`](crate::EgressCore::requeue) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleOutcome {
    /// The record is pending again, in sequence order.
    Scheduled {
        /// The record.
        sequence: Sequence,
    },
    /// Refused: see [`Refusal::UnknownSequence`].
    UnknownSequence {
        /// The sequence named by the caller.
        sequence: Sequence,
    },
    /// Refused: see [`Refusal::StaleGeneration`].
    StaleGeneration {
        /// The core's generation.
        current: Generation,
    },
}

/// What [`reconnect`](crate::EgressCore::reconnect) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReconnectOutcome {
    /// The core moved to `generation`; `replayed` in-flight and parked
    /// records went back to pending.
    Advanced {
        /// The new generation.
        generation: Generation,
        /// How many records were moved back to pending.
        replayed: usize,
    },
    /// Already at that generation: no change.
    Unchanged,
    /// Refused: the requested generation is below the current one.
    StaleGeneration {
        /// The core's generation.
        current: Generation,
    },
}

macro_rules! refusal_of {
    ($ty:ty $(, $life:lifetime, $t:ident)?; $($pat:pat => $refusal:expr),* $(,)?) => {
        impl$(<$life, $t>)? $ty {
            /// The refusal this outcome stands for, if it is one.
            #[must_use]
            pub fn refusal(&self) -> Option<Refusal> {
                #[allow(unreachable_patterns)]
                match *self {
                    $($pat => Some($refusal),)*
                    _ => None,
                }
            }
        }
    };
}

refusal_of!(ClaimOutcome<'a, T>, 'a, T; Self::StaleGeneration { current } => Refusal::StaleGeneration { current });
refusal_of!(FailOutcome;
    Self::StaleGeneration { current } => Refusal::StaleGeneration { current },
    Self::UnknownSequence { sequence } => Refusal::UnknownSequence { sequence },
);
refusal_of!(ScheduleOutcome;
    Self::StaleGeneration { current } => Refusal::StaleGeneration { current },
    Self::UnknownSequence { sequence } => Refusal::UnknownSequence { sequence },
);
refusal_of!(ReconnectOutcome; Self::StaleGeneration { current } => Refusal::StaleGeneration { current });

refusal_of!(AckOutcome;
    Self::StaleGeneration { current } => Refusal::StaleGeneration { current },
    Self::Unassigned { through, next_sequence } => Refusal::Unassigned { through, next_sequence },
);
