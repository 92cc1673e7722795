//! Failure kinds, the retry state a failure leaves, and the backoff
//! schedule: `min(ceiling, base * 2^(k-1))`, floored by a retry-after hint,
//! then spread upward by jitter.

use crate::ids::{Attempt, Delay, Sequence, Time};
use crate::policy::Policy;

/// Why a send failed, as the transport reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
pub enum FailureKind {
    /// Worth retrying after the backoff.
    Transient,
    /// Retrying cannot help: the record goes straight to the dead letters.
    Permanent,
    /// The peer asked to wait at least this long before retrying.
    RetryAfter(Delay),
}

/// Why a record became a dead letter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
pub enum DeadReason {
    /// The transport reported a [`FailureKind::Permanent`] failure (the peer
    /// refused the payload, or it can never be sent, such as a payload
    /// above the peer's limit).
    Permanent,
    /// More failures than [`Policy::retry_budget`](crate::Policy::retry_budget)
    /// allows.
    Retries,
    /// Replayed after more dead connections than
    /// [`Policy::replay_limit`](crate::Policy::replay_limit) allows: the
    /// record is suspected of killing its connections.
    Replays,
}

impl DeadReason {
    /// Every reason, in declaration order.
    pub const ALL: [Self; 3] = [Self::Permanent, Self::Retries, Self::Replays];
}

impl core::fmt::Display for DeadReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::Permanent => "refused permanently",
            Self::Retries => "retry budget spent",
            Self::Replays => "replay limit reached",
        })
    }
}

/// The state of the most recent failure: what a UI shows as "retrying in
/// 4 s" or "failed".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Retry {
    /// The record that failed.
    pub sequence: Sequence,
    /// The attempt that failed.
    pub attempt: Attempt,
    /// The delay chosen before its next attempt.
    pub backoff: Delay,
    /// Whether its budget is spent (it is a dead letter now).
    pub exhausted: bool,
}

/// A failed record waiting for its backoff, as
/// [`EgressCore::parked`](crate::EgressCore::parked) shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParkedView<'a, T> {
    /// The record.
    pub sequence: Sequence,
    /// Attempts so far.
    pub attempt: Attempt,
    /// The backoff it waits.
    pub backoff: Delay,
    /// When it becomes due: the failure's `now` plus the backoff.
    pub due: Time,
    /// Its payload.
    pub payload: &'a T,
    /// `Some` for a tombstone waiting to be retried.
    pub dead: Option<DeadReason>,
}

/// A uniform sample in `[0, 1]` that spreads a backoff by the policy's
/// jitter. The caller draws it (the core reads no random source); with a
/// policy jitter of 0 it has no effect.
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd)]
pub struct JitterSample(f64);

/// A jitter sample outside `[0, 1]`.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error("a jitter sample must lie within [0, 1], got {0}")]
pub struct JitterSampleError(pub f64);

impl JitterSample {
    /// No spread.
    pub const ZERO: Self = Self(0.0);

    /// A sample in `[0, 1]`.
    ///
    /// # Errors
    /// [`JitterSampleError`] for anything outside `[0, 1]`, NaN included.
    pub fn new(sample: f64) -> Result<Self, JitterSampleError> {
        if (0.0..=1.0).contains(&sample) { Ok(Self(sample)) } else { Err(JitterSampleError(sample)) }
    }

    /// Maps a uniformly random `u32` (the usual output of an RNG) onto
    /// `[0, 1]`.
    #[must_use]
    pub fn from_u32(random: u32) -> Self {
        Self(f64::from(random) / f64::from(u32::MAX))
    }

    /// The sample.
    #[must_use]
    pub const fn get(self) -> f64 {
        self.0
    }
}

/// The backoff for the `k`-th failure of a budget (`k >= 1`).
pub(crate) fn backoff(policy: &Policy, k: u32, hint: Option<Delay>, sample: JitterSample) -> Delay {
    let exponent = k.saturating_sub(1);
    let factor = 1u64.checked_shl(exponent).unwrap_or(u64::MAX);
    let scheduled = policy.retry_base().0.saturating_mul(factor).min(policy.retry_ceiling().0);
    let floored = hint.map_or(scheduled, |h| scheduled.max(h.0));
    // The float product is at most `floored`, so the cast cannot exceed it;
    // `as` saturates, and the add saturates too.
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let spread = (floored as f64 * policy.jitter() * sample.0) as u64;
    Delay(floored.saturating_add(spread))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(base: u64, ceiling: u64, jitter: f64) -> Policy {
        Policy::builder()
            .retry_base(Delay(base))
            .retry_ceiling(Delay(ceiling))
            .jitter(jitter)
            .build()
            .expect("valid test policy")
    }

    #[test]
    fn doubles_up_to_the_ceiling() {
        let p = policy(10, 75, 0.0);
        let got: Vec<u64> = (1..=6).map(|k| backoff(&p, k, None, JitterSample::ZERO).0).collect();
        assert_eq!(got, [10, 20, 40, 75, 75, 75]);
    }

    #[test]
    fn saturates_instead_of_overflowing() {
        let p = policy(u64::MAX / 2, u64::MAX, 0.0);
        assert_eq!(backoff(&p, 3, None, JitterSample::ZERO), Delay(u64::MAX));
        assert_eq!(backoff(&p, u32::MAX, None, JitterSample::ZERO), Delay(u64::MAX));
        let full = policy(u64::MAX, u64::MAX, 1.0);
        let one = JitterSample::new(1.0).expect("in range");
        assert_eq!(backoff(&full, 200, None, one), Delay(u64::MAX));
    }

    #[test]
    fn a_hint_is_a_floor_not_a_cap() {
        let p = policy(10, 100, 0.0);
        assert_eq!(backoff(&p, 1, Some(Delay(500)), JitterSample::ZERO), Delay(500));
        assert_eq!(backoff(&p, 4, Some(Delay(5)), JitterSample::ZERO), Delay(80));
    }

    #[test]
    fn jitter_only_adds_and_at_most_its_fraction() {
        let p = policy(100, 1_000, 0.5);
        assert_eq!(backoff(&p, 1, None, JitterSample::ZERO), Delay(100));
        assert_eq!(backoff(&p, 1, None, JitterSample::new(1.0).expect("in range")), Delay(150));
        assert_eq!(backoff(&p, 1, None, JitterSample::new(0.5).expect("in range")), Delay(125));
    }

    #[test]
    fn samples_are_validated() {
        assert!(JitterSample::new(1.01).is_err());
        assert!(JitterSample::new(f64::NAN).is_err());
        assert_eq!(JitterSample::from_u32(u32::MAX).get(), 1.0);
        assert_eq!(JitterSample::from_u32(0).get(), 0.0);
    }
}
