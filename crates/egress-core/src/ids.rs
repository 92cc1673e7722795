//! One newtype per number space: a generation can never be passed where a
//! sequence is expected, and a point in time never where a delay is.

use core::fmt;

macro_rules! number_space {
    ($(#[$doc:meta])* $name:ident($inner:ty), $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(transparent))]
        pub struct $name(pub $inner);

        impl $name {
            /// The raw number.
            #[must_use]
            pub const fn get(self) -> $inner {
                self.0
            }
        }

        impl From<$inner> for $name {
            fn from(value: $inner) -> Self {
                Self(value)
            }
        }

        impl From<$name> for $inner {
            fn from(value: $name) -> Self {
                value.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

number_space!(
    /// A connection epoch. Every transport attachment works under one
    /// generation; [`reconnect`](crate::EgressCore::reconnect) moves the core
    /// to a strictly higher one and fences every caller still holding the old.
    Generation(u64),
    "g"
);
number_space!(
    /// The position of a record in the send order. Assigned by
    /// [`enqueue`](crate::EgressCore::enqueue) from 0 upward, never reused.
    Sequence(u64),
    "#"
);
number_space!(
    /// The identity of a sequence space: which run of a producer assigned a
    /// sequence. A producer whose records live only in memory starts a new
    /// sequence space (from 0) every time it starts, so a receiver keys its
    /// state by producer *and* incarnation, and a restarted producer is never
    /// mistaken for the one before it. The core does not use it; cells mint
    /// one (128 random bits) and transports carry it.
    Incarnation(u128),
    "i"
);
number_space!(
    /// How many times a record has been claimed for sending (0 until its
    /// first claim).
    Attempt(u32),
    "attempt "
);
number_space!(
    /// A point in time, in ticks of the caller's clock. The core never reads a
    /// clock: the shell passes `now` in. The unit is the shell's choice (the
    /// reactive cells use milliseconds since the cell's clock started).
    Time(u64),
    "t="
);
number_space!(
    /// The number of a [`Ready`](crate::Ready): one batch of writes a store
    /// makes durable in one transaction.
    Epoch(u64),
    "e"
);
number_space!(
    /// A flush epoch of the application's own state: a record enqueued
    /// with [`enqueue_after`](crate::EgressCore::enqueue_after) waits until
    /// the application [`release`](crate::EgressCore::release)s its epoch,
    /// having made the state it depends on durable. Epochs start at 1.
    FlushEpoch(u64),
    "f"
);
number_space!(
    /// A record's place in the enqueue order across every lane of a
    /// [`Lanes`](crate::Lanes): assigned from 0 upward, never reused by that
    /// `Lanes`, so it names one record even where its lane's sequences
    /// started again (an idle lane freed and made anew).
    Ordinal(u64),
    "o"
);
number_space!(
    /// The version of a key's value in a [`Latest`](crate::Latest)
    /// projection (the design's "epoch"): the caller's, rising with each
    /// newer value of the key; a higher version replaces a lower one.
    Version(u64),
    "v"
);
number_space!(
    /// A span of time in the same ticks as [`Time`].
    Delay(u64),
    "+"
);

/// `next()` for a number space that counts up from 0 and is never reused.
macro_rules! counts_up {
    ($name:ident, $what:literal, $panics:literal) => {
        impl $name {
            #[doc = concat!("The ", $what, " after this one.")]
            ///
            /// # Panics
            #[doc = $panics]
            #[must_use]
            #[inline]
            pub const fn next(self) -> Self {
                match self.0.checked_add(1) {
                    Some(n) => Self(n),
                    None => panic!(concat!("invariant broken: the ", $what, " space (u64) is exhausted")),
                }
            }
        }
    };
}

counts_up!(
    Sequence,
    "sequence",
    "At `u64::MAX`, which would take 2^64 enqueues to reach (2^63 after a restore, which refuses a next sequence above `i64::MAX`)."
);
counts_up!(Ordinal, "ordinal", "At `u64::MAX`, which would take 2^64 enqueues to reach.");

impl Attempt {
    /// The attempt after this one, saturating at `u32::MAX`.
    #[must_use]
    pub const fn saturating_next(self) -> Self {
        Self(self.0.saturating_add(1))
    }
}

impl Time {
    /// `self + delay`, saturating at the end of time instead of wrapping.
    #[must_use]
    pub const fn saturating_add(self, delay: Delay) -> Self {
        Self(self.0.saturating_add(delay.0))
    }
}

impl Delay {
    /// No delay at all.
    pub const ZERO: Self = Self(0);
}
