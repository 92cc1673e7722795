//! The pure delivery state machine behind egress cells.
//!
//! An application enqueues messages; [`EgressCore`] assigns each a
//! [`Sequence`], lets a transport claim a bounded window of them, takes
//! cumulative acknowledgements, parks failures for a bounded exponential
//! backoff, and fences a dead connection by [`Generation`] so that a
//! reconnect replays exactly what is unacknowledged.
//!
//! ```text
//!  application ──enqueue──▶ ┌────────────┐ ──claim──▶ transport ──▶ peer
//!                           │ EgressCore │ ◀──ack / fail────────────┘
//!  shell timer ──now──────▶ └────────────┘ ──poll_timeout──▶ shell timer
//!                              │ Transition { outcome, changes }
//!                              ▼
//!                  shell invalidates exactly `changes`
//! ```
//!
//! The core decides; shells (the reactive cells of `egress-reactive`)
//! project its state as signals and invalidate exactly the projections a
//! transition reports in its [`Changes`].
//!
//! ```
//! use egress_core::{ClaimOutcome, Delay, EgressCore, FailOutcome, FailureKind, JitterSample, Policy, Time};
//!
//! let policy = Policy::builder().retry_base(Delay(100)).retry_ceiling(Delay(1_000)).build()?;
//! let mut core = EgressCore::new(policy);
//! let g = core.generation();
//! let seq = core.enqueue("hello").outcome;
//!
//! let ClaimOutcome::Claimed(envelope) = core.claim(g).outcome else { unreachable!() };
//! assert_eq!((envelope.sequence, *envelope.payload), (seq, "hello"));
//!
//! // The send failed: the record is parked for 100 ticks.
//! let failed = core.fail(g, seq, FailureKind::Transient, Time(0), JitterSample::ZERO);
//! assert!(matches!(failed.outcome, FailOutcome::Retrying(r) if r.backoff == Delay(100)));
//! assert_eq!(core.poll_timeout(), Some(Time(100)));
//!
//! // At that time it is pending again.
//! assert_eq!(core.handle_timeout(Time(100)).outcome, vec![seq]);
//! assert_eq!(core.pending_len(), 1);
//! # Ok::<(), egress_core::PolicyError>(())
//! ```
//!
//! # What this crate does not do
//! No I/O, no clock, no threads, no randomness, no `unsafe`, no allocation
//! per record beyond what the payload owns on the enqueue-claim-ack path.
//! Transports, timers and signals live in the shells.

mod changes;
mod completions;
mod core;
mod durable;
mod envelope;
mod failures;
mod fencing;
mod ids;
mod lanes;
mod latest;
mod outcome;
mod panic;
mod parked;
mod pending;
mod policy;
mod relay;
mod restored;
mod resume;
mod retry;
mod window;

pub use crate::changes::{Changes, Projection};
pub use crate::completions::Completions;
pub use crate::core::{EgressCore, Isolation, SKIPPED_MEMORY};
pub use crate::durable::{AdoptOutcome, DeadMark, MessageStatus, PersistError, PersistOutcome, Ready, RebaseOutcome};
pub use crate::envelope::Envelope;
pub use crate::ids::{Attempt, Delay, Epoch, FlushEpoch, Generation, Incarnation, Ordinal, Sequence, Time, Version};
pub use crate::lanes::{
    CompleteOutcome, Enqueued, LaneEnvelope, LaneKey, LaneKind, LaneReady, Lanes, LanesClaim, LanesPersisted,
    LanesPolicy, LanesPolicyError, LanesReady, LanesReconnect, LanesRestoreError, RestoredLane, RestoredLanes,
    TooManyLanes,
};
pub use crate::latest::{
    Applied, Failed, ForgetRefused, KeyChanges, KeyProjection, KeyTransition, Latest, LatestClaim, LatestEnvelope,
    LatestPersisted, LatestReady, LatestReconnect, LatestRestoreError, LatestWrite, RestoredKey, TooManyKeys, Upserted,
};
pub use crate::outcome::{
    AckOutcome, ClaimOutcome, FailOutcome, ReceivedOutcome, ReconnectOutcome, Refusal, ScheduleOutcome, Transition,
};
pub use crate::panic::panic_message;
pub use crate::pending::PendingParts;
pub use crate::policy::{DeadLetters, Ordering, Policy, PolicyBuilder, PolicyError};
pub use crate::relay::{
    Backpressure, Drained, KeepLatest, Max, MergePolicy, Overflow, RawFifo, Relay, RelayConfigError, RelayStats,
    SendRefused, Sent, SetUnion, SpillPage, Sum, Water,
};
pub use crate::restored::{Recovered, RestoreError, Restored, RestoredRecord};
pub use crate::resume::Resume;
pub use crate::retry::{DeadReason, FailureKind, JitterSample, JitterSampleError, ParkedView, Retry};
