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
    /// An acknowledgement (or a receipt) of a sequence never sent: the peer
    /// cannot hold it, and taking it would drop records that never went on
    /// the wire, so it is refused. A peer that sends one is broken.
    #[error("{through} refused: nothing above {sent_through:?} was ever sent")]
    Unsent {
        /// The acknowledged sequence.
        through: Sequence,
        /// The highest sequence ever claimed (`None`: nothing was).
        sent_through: Option<Sequence>,
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
    /// Connections died with records in flight and no progress: records are
    /// sent one at a time, and this one (the probe) is in flight. Wait for
    /// its acknowledgement or failure.
    Isolating {
        /// The record in flight alone.
        probe: Sequence,
    },
    /// The record at the head waits for the application's state it
    /// depends on to be durable: until [`release`](crate::EgressCore::release)
    /// reaches `epoch`.
    Gated {
        /// The record waiting.
        sequence: Sequence,
        /// The flush epoch it waits for.
        epoch: crate::ids::FlushEpoch,
    },
    /// The record at the head is not durable yet: wait for the store
    /// ([`persisted`](crate::EgressCore::persisted)). Only with a journal.
    Unpersisted {
        /// The record waiting.
        sequence: Sequence,
    },
    /// The current generation is not durable yet, so nothing goes out under
    /// it. Only with a journal.
    GenerationUnpersisted {
        /// The generation waiting.
        generation: Generation,
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
    /// Refused: see [`Refusal::Unsent`].
    Unsent {
        /// The acknowledged sequence.
        through: Sequence,
        /// The highest sequence ever claimed.
        sent_through: Option<Sequence>,
    },
    /// Refused: see [`Refusal::StaleGeneration`].
    StaleGeneration {
        /// The core's generation.
        current: Generation,
    },
}

/// What [`received`](crate::EgressCore::received) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReceivedOutcome {
    /// The receipt watermark moved to `through` (if it was below), and
    /// `moved` pending records at or below it went back in flight without
    /// being sent again.
    Recorded {
        /// The receipt watermark now.
        through: Sequence,
        /// How many pending records went to in flight.
        moved: usize,
    },
    /// Already known, and nothing pending at or below it: no change.
    Unchanged {
        /// The receipt watermark.
        through: Option<Sequence>,
    },
    /// Refused: see [`Refusal::Unsent`].
    Unsent {
        /// The sequence named.
        through: Sequence,
        /// The highest sequence ever claimed.
        sent_through: Option<Sequence>,
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
    /// Its budget is spent, or the failure was permanent: a dead letter,
    /// a tombstone or held as the policy's
    /// [`DeadLetters`](crate::DeadLetters) says.
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
    /// records went back to pending, of which `dead` in-flight records had
    /// spent their replay limit and became dead letters.
    Advanced {
        /// The new generation.
        generation: Generation,
        /// How many records left flight or parking.
        replayed: usize,
        /// How many of them became dead letters
        /// ([`DeadReason::Replays`](crate::DeadReason)).
        dead: usize,
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
    Self::Unsent { through, sent_through } => Refusal::Unsent { through, sent_through },
);
refusal_of!(ReceivedOutcome;
    Self::StaleGeneration { current } => Refusal::StaleGeneration { current },
    Self::Unsent { through, sent_through } => Refusal::Unsent { through, sent_through },
);
