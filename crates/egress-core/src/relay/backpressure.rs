//! How full a [`Relay`](super::Relay) may get, and what it does then.

/// A high and a low water mark of one dimension (entries, or bytes): the
/// relay is full once it reaches `high`, and not full again until it is
/// down to `low` (hysteresis: a producer blocked at `high` is not woken
/// for every entry drained).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Water {
    /// Full at this many (at least 1).
    pub high: u64,
    /// Not full again until this many or fewer (below `high`).
    pub low: u64,
}

impl Water {
    /// `high` and `low` (checked when a relay is built).
    #[must_use]
    pub const fn new(high: u64, low: u64) -> Self {
        Water { high, low }
    }
}

/// What a relay does with an op that comes while it is full (or that
/// would take it above a high water mark).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum Overflow {
    /// Refuse it ([`SendRefused::Blocked`](super::SendRefused::Blocked),
    /// the op back): the producer waits until the relay is not full.
    Block,
    /// Drop it (counted as dropped).
    DropNewest,
    /// Drop the oldest entries until it fits, then take it (each op the
    /// dropped entries held is counted as dropped).
    DropOldest,
    /// Fold it into the newest entry under the merge policy: the number of
    /// entries stays bounded, and what the drain delivers still folds to
    /// the same value. If the fold leaves the relay above its high water
    /// mark in bytes, the newest entries are folded together until it is
    /// not, or one entry is left (a fold that grows, such as a set union,
    /// is bounded in bytes only as far as it shrinks). Refused at
    /// construction for a policy that does not conflate.
    Conflate,
    /// Write the entries out to storage, then take it: the relay's shell
    /// takes them as one page ([`Relay::spill`](super::Relay::spill),
    /// folded into one entry under a policy that conflates), writes the
    /// page after every page before it, and sends the op again into the
    /// emptied relay. Until the pages are replayed into the stream
    /// ([`Relay::replayed`](super::Relay::replayed)), the relay's own
    /// entries wait behind them: memory stays bounded by the marks while
    /// storage takes the burst. The pure relay only asks
    /// ([`SendRefused::MustSpill`](super::SendRefused::MustSpill)); a
    /// relay cell with a spill store does the rest.
    Spill,
}

/// A relay's bounds and overflow action.
///
/// ```
/// use egress_core::{Backpressure, Overflow, Water};
///
/// // Full at 64 entries or 1 MiB, not full again until 16 and 256 KiB.
/// let bp = Backpressure::count(Water::new(64, 16), Overflow::Block).with_bytes(Water::new(1 << 20, 1 << 18));
/// assert_eq!(bp.bytes, Some(Water::new(1 << 20, 1 << 18)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Backpressure {
    /// The bound in entries (an entry is one op, or several folded).
    pub count: Water,
    /// The bound in bytes, as the relay's weigher counts them (none:
    /// unbounded in bytes).
    pub bytes: Option<Water>,
    /// What an op that does not fit does.
    pub overflow: Overflow,
}

impl Backpressure {
    /// A bound in entries only.
    #[must_use]
    pub const fn count(count: Water, overflow: Overflow) -> Self {
        Backpressure { count, bytes: None, overflow }
    }

    /// This bound, and one in bytes.
    #[must_use]
    pub const fn with_bytes(mut self, bytes: Water) -> Self {
        self.bytes = Some(bytes);
        self
    }
}

/// Why a relay could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RelayConfigError {
    /// A high water mark of 0: nothing would ever fit.
    #[error("the high water mark of {dimension} is 0")]
    ZeroHigh {
        /// `"count"` or `"bytes"`.
        dimension: &'static str,
    },
    /// A low water mark not below the high one: there is no hysteresis.
    #[error("the low water mark of {dimension} ({low}) is not below the high one ({high})")]
    NoHysteresis {
        /// `"count"` or `"bytes"`.
        dimension: &'static str,
        /// The high mark.
        high: u64,
        /// The low mark.
        low: u64,
    },
    /// [`Overflow::Conflate`] with a merge policy that does not conflate
    /// ([`RawFifo`](super::RawFifo)): nothing would bound the relay.
    #[error("overflow by conflating needs a merge policy that conflates")]
    ConflateNotBounding,
    /// A bound in bytes for a relay built without a weigher
    /// ([`Relay::new`](super::Relay::new) rather than
    /// [`Relay::weighed`](super::Relay::weighed)).
    #[error("a bound in bytes needs a weigher")]
    NoWeigher,
}

impl Backpressure {
    /// Checks the marks, and `Conflate` against whether the policy
    /// `conflates`.
    pub(super) fn check(&self, conflates: bool) -> Result<(), RelayConfigError> {
        let marks = [("count", Some(self.count)), ("bytes", self.bytes)];
        for (dimension, water) in marks {
            let Some(Water { high, low }) = water else { continue };
            if high == 0 {
                return Err(RelayConfigError::ZeroHigh { dimension });
            }
            if low >= high {
                return Err(RelayConfigError::NoHysteresis { dimension, high, low });
            }
        }
        if self.overflow == Overflow::Conflate && !conflates {
            return Err(RelayConfigError::ConflateNotBounding);
        }
        Ok(())
    }
}
