//! How a [`Relay`](super::Relay) folds ops: [`MergePolicy`] and the
//! built-in policies.

use std::collections::{BTreeSet, HashSet};
use std::hash::{BuildHasher, Hash};

/// How two ops of type `T` fold into one: `merge(acc, op)` leaves in `acc`
/// the op `acc ⊕ op`, where `acc` came first. A relay folds under pressure
/// (see [`Overflow::Conflate`](super::Overflow::Conflate)), and drains what
/// it folded; what reaches the other side then equals the fold of every op
/// it took, in order, for any drain schedule, **provided `⊕` is
/// associative**: `(a ⊕ b) ⊕ c == a ⊕ (b ⊕ c)`. Every policy must be; the
/// constants declare what else it is, and the built-in policies' claims
/// are checked by property tests (tests/relay.rs).
///
/// `merge` is user code to the relay: a panic in it goes on to the
/// caller, and leaves the relay's counts as they were before the op (the
/// value it was merging into is what the panicking `merge` left).
pub trait MergePolicy<T> {
    /// Whether the relay may fold two ops into one at all. A policy that
    /// does not ([`RawFifo`]) cannot bound a window by folding, so a relay
    /// refuses [`Overflow::Conflate`](super::Overflow::Conflate) with it.
    const CONFLATES: bool = true;
    /// `a ⊕ b == b ⊕ a`.
    const COMMUTATIVE: bool;
    /// `a ⊕ a == a`: delivering an op twice (a replay) changes nothing.
    const IDEMPOTENT: bool;

    /// Folds `op` into `acc`, which came before it.
    fn merge(&self, acc: &mut T, op: T);
}

/// The newest op wins: `a ⊕ b = b`. Associative and idempotent, not
/// commutative. For a state whose newest value is all that matters (a
/// position, a setting), as a stream rather than per key (for per-key
/// values with a durable sink, see [`Latest`](crate::Latest)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeepLatest;

impl<T> MergePolicy<T> for KeepLatest {
    const COMMUTATIVE: bool = false;
    const IDEMPOTENT: bool = true;

    fn merge(&self, acc: &mut T, op: T) {
        *acc = op;
    }
}

/// The greatest op wins: `a ⊕ b = max(a, b)` (by `Ord`; of equal ops, the
/// first stays). Associative, commutative and idempotent. For a high-water
/// mark: a read position, a progress counter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Max;

impl<T: Ord> MergePolicy<T> for Max {
    const COMMUTATIVE: bool = true;
    const IDEMPOTENT: bool = true;

    fn merge(&self, acc: &mut T, op: T) {
        if op > *acc {
            *acc = op;
        }
    }
}

/// Ops add: `a ⊕ b = a + b`, for deltas (a counter's increments). For
/// unsigned integers the sum saturates at the type's maximum; for signed
/// integers it wraps (two's complement), the one total addition on them
/// that stays associative. Associative and commutative, not idempotent:
/// an op delivered twice counts twice, so drain it through a stream that
/// delivers exactly once (an egress cell does).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sum;

macro_rules! sum {
    ($add:ident: $($t:ty),*) => {$(
        impl MergePolicy<$t> for Sum {
            const COMMUTATIVE: bool = true;
            const IDEMPOTENT: bool = false;

            fn merge(&self, acc: &mut $t, op: $t) {
                *acc = acc.$add(op);
            }
        }
    )*};
}

sum!(saturating_add: u8, u16, u32, u64, u128, usize);
sum!(wrapping_add: i8, i16, i32, i64, i128, isize);

/// Sets join: `a ⊕ b = a ∪ b`. Associative, commutative and idempotent.
/// For membership that only grows within a window (tags added, ids seen);
/// note that a union can be larger than either op, so a bound in bytes
/// holds only as far as the union shrinks (see
/// [`Overflow::Conflate`](super::Overflow::Conflate)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetUnion;

impl<U: Ord> MergePolicy<BTreeSet<U>> for SetUnion {
    const COMMUTATIVE: bool = true;
    const IDEMPOTENT: bool = true;

    fn merge(&self, acc: &mut BTreeSet<U>, mut op: BTreeSet<U>) {
        acc.append(&mut op);
    }
}

impl<U: Eq + Hash, S: BuildHasher> MergePolicy<HashSet<U, S>> for SetUnion {
    const COMMUTATIVE: bool = true;
    const IDEMPOTENT: bool = true;

    fn merge(&self, acc: &mut HashSet<U, S>, op: HashSet<U, S>) {
        acc.extend(op);
    }
}

/// Every op, in order: `a ⊕ b` is `a` followed by `b` (concatenation of
/// batches). Associative; neither commutative nor idempotent; and it does
/// not conflate: a relay never folds two of its ops, so each op reaches
/// the drain as it was sent (a relay with it bounds a window by
/// [`Block`](super::Overflow::Block) or by dropping, never by
/// [`Conflate`](super::Overflow::Conflate)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawFifo;

impl<U> MergePolicy<Vec<U>> for RawFifo {
    const CONFLATES: bool = false;
    const COMMUTATIVE: bool = false;
    const IDEMPOTENT: bool = false;

    fn merge(&self, acc: &mut Vec<U>, mut op: Vec<U>) {
        acc.append(&mut op);
    }
}
