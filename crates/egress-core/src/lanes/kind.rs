//! What a lane is: its kind (the in-flight limit and ordering its records
//! keep), the key that names it, and the policy of a [`Lanes`](crate::Lanes).

use core::fmt;
use core::num::NonZeroUsize;

use crate::policy::{DeadLetters, Ordering, Policy};

/// How a lane sends: its window and what a failure holds back.
///
/// A lane's window is a range of its sequences, as every core's is (see
/// [`Policy::inflight_limit`]): a record waiting for its retry lies below
/// the records after it, so with a window of one nothing in the lane
/// overtakes it, while it backs off or at any other time.
///
/// The kinds of a Matrix client's outgoing queue, as keys of one enum:
///
/// | Traffic      | Key                  | Kind                   | Why |
/// |--------------|----------------------|------------------------|-----|
/// | sync filter  | one key              | [`Serial`](Self::Serial) | one request at a time |
/// | to-device    | one key              | [`Serial`](Self::Serial) | two sends racing desynchronize a peer's ratchet |
/// | room events  | one key per room     | [`Serial`](Self::Serial) | each room keeps its order; rooms do not wait for each other |
/// | account data | one key              | [`Strict`](Self::Strict) | each write replaces the value: an earlier write must never land after a later one, even one given up on and requeued |
/// | everything else | one key           | [`Unordered`](Self::Unordered) | bounded concurrency, no order |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LaneKind {
    /// One record in flight at a time, in the lane's order. A dead letter
    /// is disposed of as the base policy's [`DeadLetters`] says (by
    /// default a tombstone, and the lane goes on).
    Serial,
    /// One record in flight at a time, in the lane's order, and a dead
    /// letter is held: nothing behind it goes until it is
    /// [`requeue`](crate::Lanes::requeue)d or acknowledged
    /// ([`Ordering::Strict`] with [`DeadLetters::Hold`]).
    Strict,
    /// Up to this many records in flight at once
    /// ([`Ordering::Pipelined`]): a record waiting for its retry does not
    /// hold back the others while they fit in the window.
    Unordered(NonZeroUsize),
}

impl LaneKind {
    /// The core policy of a lane of this kind: `base` with the kind's
    /// window, ordering and (for [`Strict`](Self::Strict)) dead letters.
    #[must_use]
    pub const fn policy(self, base: Policy) -> Policy {
        match self {
            Self::Serial => base.for_lane(NonZeroUsize::MIN, Ordering::Pipelined, base.dead_letters()),
            Self::Strict => base.for_lane(NonZeroUsize::MIN, Ordering::Strict, DeadLetters::Hold),
            Self::Unordered(limit) => base.for_lane(limit, Ordering::Pipelined, base.dead_letters()),
        }
    }
}

/// The key of a lane: which lane a record goes in, and so its kind. Keys
/// that compare equal are one lane.
///
/// ```
/// use egress_core::{LaneKey, LaneKind};
/// use std::num::NonZeroUsize;
///
/// #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
/// enum Lane {
///     ToDevice,
///     Room(String),
///     AccountData,
///     Other,
/// }
///
/// impl LaneKey for Lane {
///     fn kind(&self) -> LaneKind {
///         match self {
///             Lane::ToDevice | Lane::Room(_) => LaneKind::Serial,
///             Lane::AccountData => LaneKind::Strict,
///             Lane::Other => LaneKind::Unordered(NonZeroUsize::new(4).unwrap()),
///         }
///     }
/// }
/// assert_eq!(Lane::Room("!a".into()).kind(), LaneKind::Serial);
/// ```
///
/// Keys are held in ordered maps: their `Ord` must be a total order, and
/// their `Clone`, `Ord` and `kind` must not panic. A `kind` that panics
/// while a new lane is made changes nothing; a `Clone` or `Ord` that
/// panics inside a transition may leave the `Lanes` unusable (its indexes
/// half updated), as a `BTreeMap`'s order that breaks its rules may.
pub trait LaneKey: Ord + Clone + fmt::Debug {
    /// The kind of this key's lane. It must not change for a key while
    /// its lane exists.
    fn kind(&self) -> LaneKind;
}

/// A [`LanesPolicy`] that [`LanesPolicy::new`] refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LanesPolicyError {
    /// No lane could ever exist.
    #[error("max_lanes must be at least 1")]
    ZeroMaxLanes,
}

/// How a [`Lanes`](crate::Lanes) sends: the core policy its lanes derive
/// theirs from, how many lanes may exist at once, and an optional cap on
/// the records in flight across every lane.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LanesPolicy {
    base: Policy,
    max_lanes: usize,
    inflight_cap: Option<NonZeroUsize>,
}

impl LanesPolicy {
    /// At most `max_lanes` lanes at once (a new key past that is refused
    /// while every lane is busy), each with `base`'s retry schedule and the
    /// window of its [`LaneKind`]; no cap across lanes.
    ///
    /// # Errors
    /// [`LanesPolicyError::ZeroMaxLanes`] for `max_lanes` 0.
    pub const fn new(base: Policy, max_lanes: usize) -> Result<Self, LanesPolicyError> {
        if max_lanes == 0 {
            return Err(LanesPolicyError::ZeroMaxLanes);
        }
        Ok(Self { base, max_lanes, inflight_cap: None })
    }

    /// This policy with at most `cap` records in flight across every lane
    /// (records completed out of order, waiting for an earlier one, do not
    /// count: see [`Lanes::outstanding`](crate::Lanes::outstanding)).
    #[must_use]
    pub const fn inflight_cap(mut self, cap: NonZeroUsize) -> Self {
        self.inflight_cap = Some(cap);
        self
    }

    /// The policy lanes derive theirs from.
    #[must_use]
    pub const fn base(&self) -> &Policy {
        &self.base
    }

    /// How many lanes may exist at once.
    #[must_use]
    pub const fn max_lanes(&self) -> usize {
        self.max_lanes
    }

    /// The cap on records in flight across lanes, if any.
    #[must_use]
    pub const fn cap(&self) -> Option<NonZeroUsize> {
        self.inflight_cap
    }
}
