//! The delivery policy: window size, retry budget, replay limit, backoff
//! schedule, jitter, ordering and what becomes of dead letters, validated
//! once at construction.

use crate::ids::Delay;

/// Whether a failed record holds back the records behind it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
pub enum Ordering {
    /// Later records keep flowing while an earlier one waits for its retry.
    /// The receiver may see gaps that a retry fills later.
    #[default]
    Pipelined,
    /// Nothing is claimed past a parked or exhausted record: claims report
    /// [`Blocked`](crate::ClaimOutcome::Blocked) until it is retried, requeued
    /// or acknowledged.
    Strict,
}

/// What becomes of a dead letter: a record whose retry budget or replay
/// limit is spent, or whose failure was permanent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
pub enum DeadLetters {
    /// The record becomes a **tombstone**: it stays in the stream, under a
    /// fresh budget, and is sent as "this sequence is skipped, for this
    /// reason" (its envelope's [`dead`](crate::Envelope::dead) is set), so a
    /// receiver that delivers in order moves past it and tells its
    /// application of the gap. Nothing behind a dead letter waits for it:
    /// a tombstone is never given up on for its budget or replays (one
    /// whose budget is spent parks for its backoff under a fresh budget,
    /// one replayed past the limit goes back to pending under a fresh
    /// budget, both with the first reason), so it reaches the receiver
    /// whatever the connection does. Only a transport that refuses the
    /// tombstone itself permanently makes it held, as [`Hold`](Self::Hold)
    /// holds a record.
    #[default]
    Skip,
    /// The record is held among the [`exhausted`](crate::EgressCore::exhausted)
    /// records until the application [`requeue`](crate::EgressCore::requeue)s
    /// it (or an acknowledgement covers it). A receiver that delivers in order
    /// delivers nothing behind it meanwhile: for streams that must never
    /// skip.
    Hold,
}

/// A policy that [`PolicyBuilder::build`] refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A window of zero could never send anything.
    #[error("inflight_limit must be at least 1")]
    ZeroInflightLimit,
    /// The first backoff would already be above the cap.
    #[error("retry_base ({base}) is above retry_ceiling ({ceiling})")]
    BaseAboveCeiling {
        /// The requested base.
        base: Delay,
        /// The requested ceiling.
        ceiling: Delay,
    },
    /// Jitter is a fraction of the backoff, so it must lie in `[0, 1]`.
    #[error("jitter must be within [0, 1], got {jitter}")]
    JitterOutOfRange {
        /// The requested jitter (possibly NaN).
        jitter: f64,
    },
}

/// How an [`EgressCore`](crate::EgressCore) sends and retries.
///
/// Built through [`Policy::builder`], which validates; [`Policy::default`]
/// is a window of 64, 5 retries, 8 replays, backoff from 100 to 30,000
/// ticks (100 ms to 30 s at the cells' millisecond tick), no jitter,
/// pipelined, dead letters skipped.
///
/// ```
/// use egress_core::{DeadLetters, Delay, Ordering, Policy};
///
/// let policy = Policy::builder()
///     .inflight_limit(256)
///     .retry_budget(3)
///     .replay_limit(4)
///     .retry_base(Delay(50))
///     .retry_ceiling(Delay(5_000))
///     .jitter(0.25)
///     .ordering(Ordering::Strict)
///     .dead_letters(DeadLetters::Hold)
///     .build()?;
/// assert_eq!(policy.inflight_limit(), 256);
///
/// assert!(Policy::builder().inflight_limit(0).build().is_err());
/// # Ok::<(), egress_core::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    inflight_limit: usize,
    retry_budget: u32,
    replay_limit: u32,
    retry_base: Delay,
    retry_ceiling: Delay,
    jitter: f64,
    ordering: Ordering,
    dead_letters: DeadLetters,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            inflight_limit: 64,
            retry_budget: 5,
            replay_limit: 8,
            retry_base: Delay(100),
            retry_ceiling: Delay(30_000),
            jitter: 0.0,
            ordering: Ordering::Pipelined,
            dead_letters: DeadLetters::Skip,
        }
    }
}

impl Policy {
    /// A builder starting from [`Policy::default`].
    pub fn builder() -> PolicyBuilder {
        PolicyBuilder { policy: Self::default() }
    }

    /// The size of the window, as a range of sequences: a record is
    /// claimed only if its sequence is below the acknowledgement watermark
    /// plus this many (`acked_through + 1 + inflight_limit`). So at most this
    /// many records are in flight, a peer that delivers in order buffers at
    /// most this many, and a record retried after a failure always fits
    /// (it lies below the records sent after it).
    #[must_use]
    pub const fn inflight_limit(&self) -> usize {
        self.inflight_limit
    }

    /// How many failures (reported by [`fail`](crate::EgressCore::fail)) a
    /// record may retry after, per budget, before it is a dead letter.
    #[must_use]
    pub const fn retry_budget(&self) -> u32 {
        self.retry_budget
    }

    /// How many replays a record may have per budget before it is a dead
    /// letter ([`DeadReason::Replays`](crate::DeadReason)): a replay is a
    /// [`reconnect`](crate::EgressCore::reconnect) that finds the record in
    /// flight, unless the peer then reports it already held it
    /// ([`received`](crate::EgressCore::received)). With
    /// the budget, this bounds the sends: a record is claimed at most
    /// `retry_budget + replay_limit + 1` times per budget.
    #[must_use]
    pub const fn replay_limit(&self) -> u32 {
        self.replay_limit
    }

    /// The backoff after the first failure of a budget; it doubles per
    /// further failure up to [`retry_ceiling`](Self::retry_ceiling).
    #[must_use]
    pub const fn retry_base(&self) -> Delay {
        self.retry_base
    }

    /// The cap of the doubling schedule (a retry-after hint may exceed it).
    #[must_use]
    pub const fn retry_ceiling(&self) -> Delay {
        self.retry_ceiling
    }

    /// The fraction in `[0, 1]` by which a backoff may be spread upward.
    #[must_use]
    pub const fn jitter(&self) -> f64 {
        self.jitter
    }

    /// Whether failures hold back later records.
    #[must_use]
    pub const fn ordering(&self) -> Ordering {
        self.ordering
    }

    /// What becomes of dead letters.
    #[must_use]
    pub const fn dead_letters(&self) -> DeadLetters {
        self.dead_letters
    }
}

impl Policy {
    /// This policy with a lane's window, ordering and dead letters (every
    /// value valid: `inflight_limit` is at least 1 by its type).
    pub(crate) const fn for_lane(
        mut self,
        inflight_limit: core::num::NonZeroUsize,
        ordering: Ordering,
        dead_letters: DeadLetters,
    ) -> Self {
        self.inflight_limit = inflight_limit.get();
        self.ordering = ordering;
        self.dead_letters = dead_letters;
        self
    }
}

/// Builds a validated [`Policy`]. Every setter is optional.
#[derive(Clone, Debug)]
#[must_use]
pub struct PolicyBuilder {
    policy: Policy,
}

impl PolicyBuilder {
    /// See [`Policy::inflight_limit`]; must be at least 1.
    pub fn inflight_limit(mut self, limit: usize) -> Self {
        self.policy.inflight_limit = limit;
        self
    }

    /// See [`Policy::retry_budget`].
    pub fn retry_budget(mut self, budget: u32) -> Self {
        self.policy.retry_budget = budget;
        self
    }

    /// See [`Policy::replay_limit`].
    pub fn replay_limit(mut self, limit: u32) -> Self {
        self.policy.replay_limit = limit;
        self
    }

    /// See [`Policy::retry_base`]; must not exceed the ceiling.
    pub fn retry_base(mut self, base: Delay) -> Self {
        self.policy.retry_base = base;
        self
    }

    /// See [`Policy::retry_ceiling`].
    pub fn retry_ceiling(mut self, ceiling: Delay) -> Self {
        self.policy.retry_ceiling = ceiling;
        self
    }

    /// See [`Policy::jitter`]; must lie in `[0, 1]`.
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.policy.jitter = jitter;
        self
    }

    /// See [`Policy::ordering`].
    pub fn ordering(mut self, ordering: Ordering) -> Self {
        self.policy.ordering = ordering;
        self
    }

    /// See [`Policy::dead_letters`].
    pub fn dead_letters(mut self, dead_letters: DeadLetters) -> Self {
        self.policy.dead_letters = dead_letters;
        self
    }

    /// Validates and returns the policy.
    ///
    /// # Errors
    /// [`PolicyError`] names the first rule the settings break.
    pub fn build(self) -> Result<Policy, PolicyError> {
        let p = self.policy;
        if p.inflight_limit == 0 {
            return Err(PolicyError::ZeroInflightLimit);
        }
        if p.retry_base > p.retry_ceiling {
            return Err(PolicyError::BaseAboveCeiling { base: p.retry_base, ceiling: p.retry_ceiling });
        }
        if !(0.0..=1.0).contains(&p.jitter) {
            return Err(PolicyError::JitterOutOfRange { jitter: p.jitter });
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_each_broken_rule() {
        assert_eq!(Policy::builder().inflight_limit(0).build(), Err(PolicyError::ZeroInflightLimit));
        assert_eq!(
            Policy::builder().retry_base(Delay(10)).retry_ceiling(Delay(9)).build(),
            Err(PolicyError::BaseAboveCeiling { base: Delay(10), ceiling: Delay(9) })
        );
        assert!(matches!(Policy::builder().jitter(1.5).build(), Err(PolicyError::JitterOutOfRange { .. })));
        assert!(matches!(Policy::builder().jitter(f64::NAN).build(), Err(PolicyError::JitterOutOfRange { .. })));
        assert!(matches!(Policy::builder().jitter(-0.1).build(), Err(PolicyError::JitterOutOfRange { .. })));
    }

    #[test]
    fn edges_are_accepted() {
        let p = Policy::builder()
            .inflight_limit(1)
            .retry_base(Delay(7))
            .retry_ceiling(Delay(7))
            .jitter(1.0)
            .build()
            .expect("edge values are valid");
        assert_eq!((p.inflight_limit(), p.retry_base(), p.retry_ceiling(), p.jitter()), (1, Delay(7), Delay(7), 1.0));
        assert_eq!(Policy::builder().build(), Ok(Policy::default()));
    }
}
