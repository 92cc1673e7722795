//! How a cell is built ([`CellOptions`]) and what it refuses at enqueue
//! ([`Refused`], with a transport's [`SizeCheck`]).

use std::sync::Arc;

use egress_core::{Generation, Incarnation};

use super::clock::Clock;

/// How to build a cell, beyond its policy: the generation it starts at, the
/// incarnation of its sequence space, its clock, and the seed of its jitter.
///
/// ```
/// use egress_core::{Generation, Policy, Time};
/// use egress_reactive::{CellOptions, Context, EgressCell, ManualClock};
///
/// let cx = Context::new();
/// let clock = ManualClock::new();
/// let options = CellOptions::new().generation(Generation(7)).clock(clock.clone()).jitter_seed(42);
/// let cell: EgressCell<&str> = EgressCell::with_options(&cx, Policy::default(), options);
/// assert_eq!(cell.generation().get(), Generation(7));
/// clock.set(Time(1_000));
/// assert_eq!(cell.now(), Time(1_000));
/// ```
#[derive(Clone, Default)]
pub struct CellOptions {
    pub(super) generation: Generation,
    pub(super) incarnation: Option<Incarnation>,
    pub(super) clock: Option<Arc<dyn Clock>>,
    pub(super) jitter_seed: Option<u64>,
    pub(super) capacity: Option<usize>,
}

impl CellOptions {
    /// The defaults: generation 0, a random incarnation, the flavour's
    /// default clock, a random jitter seed.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The generation the cell starts at (a producer that restarts picks one
    /// above any it used before).
    #[must_use]
    pub fn generation(mut self, generation: Generation) -> Self {
        self.generation = generation;
        self
    }

    /// The incarnation of the cell's sequence space, which transports send
    /// so that a receiver never mistakes this sequence space for another
    /// producer's run (see [`Incarnation`]). By default 128 bits from the
    /// standard library's randomly seeded hasher, new for every cell: right
    /// for a cell whose records live only in memory. A cell restored from
    /// a store continues the stored incarnation.
    #[must_use]
    pub fn incarnation(mut self, incarnation: Incarnation) -> Self {
        self.incarnation = Some(incarnation);
        self
    }

    /// The clock the cell reads `now` from.
    #[must_use]
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The seed of the generator that draws each failure's jitter sample, for
    /// reproducible runs.
    #[must_use]
    pub fn jitter_seed(mut self, seed: u64) -> Self {
        self.jitter_seed = Some(seed);
        self
    }

    /// The most records the cell holds unacknowledged before
    /// [`try_enqueue`](crate::EgressCellOf::try_enqueue) refuses (and
    /// [`AsyncEgressCell::enqueue_when_room`](crate::AsyncEgressCell::enqueue_when_room)
    /// waits): backpressure for a producer faster than its peer. Pending,
    /// in flight, retrying and dead letters not yet skipped all count;
    /// only an acknowledgement makes room. [`enqueue`](crate::EgressCellOf::enqueue)
    /// ignores it. Without it, no bound.
    #[must_use]
    pub fn capacity(mut self, records: usize) -> Self {
        self.capacity = Some(records);
        self
    }

    #[cfg(feature = "async")]
    pub(crate) const fn generation_of(&self) -> Generation {
        self.generation
    }

    /// The cell's incarnation and jitter seed: the given ones, or drawn at
    /// random (from the standard library's randomly seeded hasher). One
    /// rule for every cell.
    pub(crate) fn identity(&self) -> (Incarnation, u64) {
        use std::hash::BuildHasher;
        let random = || std::collections::hash_map::RandomState::new().hash_one(0u64);
        let seed = self.jitter_seed.unwrap_or_else(random);
        let incarnation =
            self.incarnation.unwrap_or_else(|| Incarnation(u128::from(random()) << 64 | u128::from(random())));
        (incarnation, seed)
    }

    pub(crate) fn take_clock(&mut self, default: impl FnOnce() -> Arc<dyn Clock>) -> Arc<dyn Clock> {
        self.clock.take().unwrap_or_else(default)
    }
}

impl std::fmt::Debug for CellOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CellOptions")
            .field("generation", &self.generation)
            .field("incarnation", &self.incarnation)
            .field("clock", &self.clock.as_ref().map(|_| "custom"))
            .field("jitter_seed", &self.jitter_seed)
            .field("capacity", &self.capacity)
            .finish()
    }
}

/// Why [`try_enqueue`](crate::EgressCellOf::try_enqueue) refused a payload: it
/// comes back, nothing was queued.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refused<T> {
    /// The cell holds its [capacity](CellOptions::capacity) of
    /// unacknowledged records: room comes with acknowledgements.
    #[error("the cell holds {capacity} unacknowledged records, its capacity")]
    Full {
        /// The payload refused.
        payload: T,
        /// The cell's capacity.
        capacity: usize,
    },
    /// The payload is larger than the cell's transport can carry (see
    /// [`set_size_check`](crate::EgressCellOf::set_size_check)): sent, it could
    /// only become a dead letter.
    #[error("the payload is {size} bytes, above the transport's limit of {limit}")]
    TooLarge {
        /// The payload refused.
        payload: T,
        /// Its size, as the transport would send it.
        size: usize,
        /// The largest the transport carries.
        limit: usize,
    },
    /// The payload does not encode with the codec of the cell's store (see
    /// [`set_encode_check`](crate::EgressCellOf::set_encode_check)): it
    /// could never be written, and so never sent.
    #[error("the payload does not encode: {reason}")]
    Unencodable {
        /// The payload refused.
        payload: T,
        /// The codec's error (or its panic).
        reason: String,
    },
}

impl<T> Refused<T> {
    /// The payload refused, back to the caller.
    pub fn into_payload(self) -> T {
        match self {
            Refused::Full { payload, .. }
            | Refused::TooLarge { payload, .. }
            | Refused::Unencodable { payload, .. } => payload,
        }
    }
}

impl<T> std::fmt::Debug for Refused<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Full { capacity, .. } => {
                f.debug_struct("Full").field("capacity", capacity).finish_non_exhaustive()
            }
            Refused::TooLarge { size, limit, .. } => {
                f.debug_struct("TooLarge").field("size", size).field("limit", limit).finish_non_exhaustive()
            }
            Refused::Unencodable { reason, .. } => {
                f.debug_struct("Unencodable").field("reason", reason).finish_non_exhaustive()
            }
        }
    }
}

/// A transport's check of a payload's size, as it would send it:
/// `Some((size, limit))` when the payload is above the largest it carries
/// (see [`EgressCellOf::set_size_check`](crate::EgressCellOf::set_size_check)).
pub type SizeCheck<T> = Arc<dyn Fn(&T) -> Option<(usize, usize)> + Send + Sync>;

/// A store's check that a payload encodes with its codec: `Err(why)` when
/// it does not (see
/// [`EgressCellOf::set_encode_check`](crate::EgressCellOf::set_encode_check)).
pub type EncodeCheck<T> = Arc<dyn Fn(&T) -> Result<(), String> + Send + Sync>;

#[cfg(test)]
mod tests {
    use egress_core::Generation;

    use super::CellOptions;

    #[test]
    fn options_show_what_was_set() {
        let shown = format!("{:?}", CellOptions::new().generation(Generation(7)).jitter_seed(42).capacity(9));
        for field in ["generation: Generation(7)", "jitter_seed: Some(42)", "capacity: Some(9)", "clock: None"] {
            assert!(shown.contains(field), "{shown} shows {field}");
        }
    }
}
