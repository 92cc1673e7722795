//! What the transitions of a [`Latest`](super::Latest) return: their
//! outcomes, and the projections of one key that changed.

use core::fmt;

use crate::ids::{Generation, Time, Version};

/// A projection of one key of a [`Latest`](super::Latest): what a reader of
/// that key shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyProjection {
    /// The desired `(version, value)`, not yet claimed.
    Desired,
    /// The value in flight to the sink.
    Inflight,
    /// The highest version the sink applied.
    DurableThrough,
    /// Until when the key waits after a failure.
    Backoff,
}

impl KeyProjection {
    /// Every projection, in declaration order.
    pub const ALL: [Self; 4] = [Self::Desired, Self::Inflight, Self::DurableThrough, Self::Backoff];

    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// The projections of one key a transition changed: exactly those whose
/// value differs after it (a no-op or a refusal changes none).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
#[must_use]
pub struct KeyChanges(u8);

impl KeyChanges {
    /// Nothing changed.
    pub const NONE: Self = Self(0);

    /// Whether nothing changed.
    #[must_use]
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether `projection` changed.
    #[must_use]
    pub const fn contains(self, projection: KeyProjection) -> bool {
        self.0 & projection.bit() != 0
    }

    /// These changes and `projection`.
    pub const fn with(self, projection: KeyProjection) -> Self {
        Self(self.0 | projection.bit())
    }

    /// These changes, and `projection` when `changed`.
    pub const fn with_if(self, projection: KeyProjection, changed: bool) -> Self {
        if changed { self.with(projection) } else { self }
    }

    /// Both sets.
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// The projections changed, in declaration order.
    pub fn iter(self) -> impl Iterator<Item = KeyProjection> {
        KeyProjection::ALL.into_iter().filter(move |p| self.contains(*p))
    }
}

impl fmt::Debug for KeyChanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// A transition on one key: what happened, and what of the key changed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct KeyTransition<O> {
    /// What happened.
    pub outcome: O,
    /// The key's projections whose value changed.
    pub changes: KeyChanges,
}

impl<O> KeyTransition<O> {
    pub(crate) const fn new(outcome: O, changes: KeyChanges) -> Self {
        Self { outcome, changes }
    }

    pub(crate) const fn unchanged(outcome: O) -> Self {
        Self { outcome, changes: KeyChanges::NONE }
    }
}

/// What [`Latest::upsert`](super::Latest::upsert) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upserted {
    /// The version is newer than every version of the key: it is the
    /// desire now (replacing `replaced`, an older desire not yet claimed,
    /// if there was one; a value in flight is never touched).
    Accepted {
        /// The desire it replaced.
        replaced: Option<Version>,
    },
    /// The same version with the same value: nothing to do.
    Unchanged,
    /// The sink already applied this version or a newer one.
    AlreadyDurable {
        /// The highest version the sink applied.
        durable_through: Version,
    },
    /// A newer version is desired or in flight.
    StaleVersion {
        /// The newest version of the key.
        current: Version,
    },
    /// The same version with another value: refused (fails closed), the
    /// first value stays. Two writers disagree about what a version is.
    VersionConflict {
        /// The version.
        version: Version,
    },
}

/// [`Latest::upsert`](super::Latest::upsert) of a new key when every key
/// the policy allows exists: the value comes back, nothing changed.
#[derive(Clone, PartialEq, Eq)]
pub struct TooManyKeys<V> {
    /// The most keys a [`Latest`](super::Latest) holds.
    pub limit: usize,
    /// The value refused.
    pub value: V,
}

impl<V> fmt::Debug for TooManyKeys<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TooManyKeys").field("limit", &self.limit).finish_non_exhaustive()
    }
}

impl<V> fmt::Display for TooManyKeys<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "refused: {} keys exist, the most the projection holds", self.limit)
    }
}

impl<V> std::error::Error for TooManyKeys<V> {}

/// What [`Latest::claim`](super::Latest::claim) did.
#[derive(Debug, PartialEq, Eq)]
pub enum LatestClaim<'a, K, V> {
    /// The desire moved into flight: write it to the sink, then report
    /// [`ack_applied`](super::Latest::ack_applied) or
    /// [`fail_retryable`](super::Latest::fail_retryable) with its
    /// generation and version.
    Claimed(LatestEnvelope<'a, K, V>),
    /// The key has no desire (or does not exist).
    Empty,
    /// A value of the key is in flight: one flight per key, even when a
    /// newer desire waits.
    Busy {
        /// The version in flight.
        inflight: Version,
    },
    /// The key waits after a failure until `until` (see
    /// [`handle_timeout`](super::Latest::handle_timeout)).
    Backoff {
        /// When it may be claimed again.
        until: Time,
    },
    /// The desire is not yet stored (a durable projection): it is
    /// claimable once [`persisted`](super::Latest::persisted) says so.
    Unwritten,
    /// Not the current generation: a fenced actor.
    StaleGeneration {
        /// The current generation.
        current: Generation,
    },
}

/// A value in flight to the sink.
#[derive(Debug, PartialEq, Eq)]
pub struct LatestEnvelope<'a, K, V> {
    /// Its key.
    pub key: &'a K,
    /// Its version.
    pub version: Version,
    /// The generation it was claimed under.
    pub generation: Generation,
    /// The value.
    pub value: &'a V,
}

/// What [`Latest::ack_applied`](super::Latest::ack_applied) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The flight was the sink's: the frontier moved to its version (a
    /// newer desire stays).
    Advanced {
        /// The highest version the sink applied.
        durable_through: Version,
    },
    /// A duplicate: the version is at or below the frontier already.
    Unchanged,
    /// No such flight of the key (nor one at or below its frontier).
    UnknownVersion {
        /// The version reported.
        version: Version,
    },
    /// Not the current generation: a fenced actor's report.
    StaleGeneration {
        /// The current generation.
        current: Generation,
    },
}

/// What [`Latest::fail_retryable`](super::Latest::fail_retryable) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failed {
    /// The value is desired again, claimable at `retry_at`.
    Pending {
        /// When the key may be claimed again.
        retry_at: Time,
    },
    /// A newer desire exists: the failed value is dropped; the newer one
    /// is claimable at `retry_at`.
    Superseded {
        /// When the key may be claimed again.
        retry_at: Time,
    },
    /// No such flight of the key.
    UnknownVersion {
        /// The version reported.
        version: Version,
    },
    /// Not the current generation: a fenced actor's report.
    StaleGeneration {
        /// The current generation.
        current: Generation,
    },
}

/// What [`Latest::reconnect`](super::Latest::reconnect) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LatestReconnect<K> {
    /// The generation rose: every flight is back, as the desire unless a
    /// newer one exists; reports of the old generation are refused from
    /// now on.
    Advanced {
        /// The new generation.
        generation: Generation,
        /// Flights back as the desire.
        requeued: usize,
        /// Flights dropped for a newer desire.
        superseded: usize,
        /// Each key that had a flight, in key order, with what changed.
        keys: Vec<(K, KeyChanges)>,
    },
    /// Already at that generation.
    Unchanged,
    /// Below the current generation.
    StaleGeneration {
        /// The current generation.
        current: Generation,
    },
}

/// Why [`Latest::forget`](super::Latest::forget) kept a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForgetRefused {
    /// No such key.
    Unknown,
    /// The key has a desire or a flight.
    Busy,
    /// The key's row is not yet written as it is (a durable projection):
    /// forget it once the store holds its frontier.
    Unwritten,
}

/// Why [`Latest::restore`](super::Latest::restore) refused what a store
/// handed back: nothing restored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LatestRestoreError {
    /// More keys than the policy allows.
    #[error("{found} keys stored, more than the {limit} the projection holds")]
    TooManyKeys {
        /// Keys stored.
        found: usize,
        /// The most allowed.
        limit: usize,
    },
    /// One key stored twice.
    #[error("key #{index} is stored twice")]
    DuplicateKey {
        /// Its place in the list.
        index: usize,
    },
    /// A desire at or below its key's frontier: the sink applied it.
    #[error("key #{index}: desired version {desired} is not above the frontier {durable_through}")]
    DesireNotAboveFrontier {
        /// Its place in the list.
        index: usize,
        /// The desired version.
        desired: Version,
        /// The frontier.
        durable_through: Version,
    },
}
