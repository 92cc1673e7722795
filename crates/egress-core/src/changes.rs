//! The set of projections a transition changed: what a shell must
//! invalidate, and nothing more.

use core::fmt;

/// One observable projection of the core's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Projection {
    /// The records waiting to be claimed.
    Pending,
    /// The records claimed and not yet acknowledged or failed.
    Inflight,
    /// The cumulative acknowledgement watermark.
    AckedThrough,
    /// The state of the most recent failure.
    Retry,
    /// Failed records waiting for their backoff.
    Parked,
    /// Records whose retry budget is spent.
    Exhausted,
    /// The current generation.
    Generation,
    /// The receipt watermark: the highest sequence the peer is known to hold
    /// (with everything below it), acknowledged or not.
    Received,
    /// Durability, with a journal: the durable watermark, how many records
    /// are not yet durable, whether the generation is.
    Durable,
    /// The last failure to persist.
    PersistError,
}

impl Projection {
    /// Every projection, in declaration order.
    pub const ALL: [Self; 10] = [
        Self::Pending,
        Self::Inflight,
        Self::AckedThrough,
        Self::Retry,
        Self::Parked,
        Self::Exhausted,
        Self::Generation,
        Self::Received,
        Self::Durable,
        Self::PersistError,
    ];

    const fn bit(self) -> u16 {
        1 << self as u8
    }
}

/// A set of [`Projection`]s, as returned with every transition.
///
/// ```
/// use egress_core::{Changes, Projection};
///
/// let changes = Changes::NONE.with(Projection::Pending).with(Projection::Inflight);
/// assert!(changes.contains(Projection::Pending));
/// assert!(!changes.contains(Projection::Retry));
/// assert_eq!(changes.iter().count(), 2);
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
#[must_use]
pub struct Changes(u16);

impl Changes {
    /// Nothing changed.
    pub const NONE: Self = Self(0);

    /// Whether nothing changed.
    #[must_use]
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The set as a bit mask: bit `i` stands for `Projection::ALL[i]`.
    #[must_use]
    pub const fn bits(self) -> u16 {
        self.0
    }

    /// Whether `projection` changed.
    #[must_use]
    pub const fn contains(self, projection: Projection) -> bool {
        self.0 & projection.bit() != 0
    }

    /// This set plus `projection`.
    pub const fn with(self, projection: Projection) -> Self {
        Self(self.0 | projection.bit())
    }

    /// This set plus `projection` when `changed` holds.
    pub const fn with_if(self, projection: Projection, changed: bool) -> Self {
        if changed { self.with(projection) } else { self }
    }

    /// Both sets together.
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// The projections in the set, in [`Projection::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = Projection> {
        Projection::ALL.into_iter().filter(move |p| self.contains(*p))
    }
}

impl fmt::Debug for Changes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl FromIterator<Projection> for Changes {
    fn from_iter<I: IntoIterator<Item = Projection>>(iter: I) -> Self {
        iter.into_iter().fold(Self::NONE, Self::with)
    }
}
