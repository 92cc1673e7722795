//! Where cells read the time: an injectable [`Clock`].
//!
//! The core takes time as an argument ([`Time`], in ticks); a cell reads it
//! from its clock whenever it needs `now` (a failed send, a timeout). For
//! every clock here **one tick is one millisecond**, so a policy's
//! `retry_base(Delay(100))` means 100 ms.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use egress_core::{Delay, Time};

/// A source of [`Time`], in milliseconds since some fixed start. The real
/// clocks never go backwards.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Time;
}

/// The real monotonic clock: milliseconds since the clock was made. The
/// default clock of [`EgressCell`](crate::EgressCell) and
/// [`ThreadSafeEgressCell`](crate::ThreadSafeEgressCell).
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    start: Instant,
}

impl MonotonicClock {
    /// A clock reading 0 now.
    #[must_use]
    pub fn new() -> Self {
        MonotonicClock { start: Instant::now() }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Time {
        Time(millis(self.start.elapsed()))
    }
}

/// A clock that moves only when told to: for tests, simulations and fixture
/// replays. Clones share one time.
///
/// ```
/// use egress_core::{Delay, Time};
/// use egress_reactive::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let seen_by_cell = clock.clone();
/// clock.advance(Delay(250));
/// assert_eq!(seen_by_cell.now(), Time(250));
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at time 0.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the clock to `time`, exactly. Nothing stops it from going
    /// backwards, which a replay of recorded inputs may need; the core takes
    /// whatever `now` it is given.
    pub fn set(&self, time: Time) {
        self.now.store(time.0, Ordering::SeqCst);
    }

    /// Moves the clock forward by `delay` (saturating).
    pub fn advance(&self, delay: Delay) {
        let _ = self.now.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| Some(t.saturating_add(delay.0)));
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Time {
        Time(self.now.load(Ordering::SeqCst))
    }
}

/// tokio's clock (`tokio::time::Instant`, which tests can pause and
/// advance): milliseconds since the clock was made. The default clock of
/// [`AsyncEgressCell`](crate::AsyncEgressCell).
#[cfg(feature = "async")]
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    start: tokio::time::Instant,
}

#[cfg(feature = "async")]
impl TokioClock {
    /// A clock reading 0 now.
    #[must_use]
    pub fn new() -> Self {
        TokioClock { start: tokio::time::Instant::now() }
    }

    /// The tokio instant at which this clock reads `time`.
    #[must_use]
    pub fn instant_at(&self, time: Time) -> tokio::time::Instant {
        self.start + Duration::from_millis(time.0)
    }
}

#[cfg(feature = "async")]
impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "async")]
impl Clock for TokioClock {
    fn now(&self) -> Time {
        Time(millis(self.start.elapsed()))
    }
}

/// Whole milliseconds, saturating.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A [`Delay`] in ticks of the cells' clocks (milliseconds).
#[must_use]
pub fn delay(d: Duration) -> Delay {
    Delay(millis(d))
}
