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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_when_told_and_saturates() {
        let clock = ManualClock::new();
        let shared = clock.clone();
        clock.advance(Delay(250));
        clock.advance(Delay(5));
        assert_eq!(shared.now(), Time(255));
        clock.set(Time(u64::MAX - 1));
        clock.advance(Delay(5));
        assert_eq!(shared.now(), Time(u64::MAX));
    }

    #[test]
    fn the_monotonic_clock_counts_milliseconds_since_it_was_made() {
        let Some(start) = Instant::now().checked_sub(Duration::from_millis(1_500)) else { return };
        let clock = MonotonicClock { start };
        let now = clock.now();
        assert!(now >= Time(1_500) && now < Time(60_000), "{now:?}");
    }

    #[test]
    fn delays_are_whole_milliseconds_saturating() {
        assert_eq!(delay(Duration::from_micros(2_999)), Delay(2));
        assert_eq!(delay(Duration::from_secs(3)), Delay(3_000));
        assert_eq!(delay(Duration::MAX), Delay(u64::MAX));
    }

    #[cfg(feature = "async")]
    #[tokio::test(start_paused = true)]
    async fn the_tokio_clock_follows_tokio_time_both_ways() {
        let clock = TokioClock::new();
        tokio::time::advance(Duration::from_millis(1_234)).await;
        assert_eq!(clock.now(), Time(1_234));
        assert_eq!(clock.instant_at(Time(1_234)), tokio::time::Instant::now());
        assert_eq!(clock.instant_at(Time(2_000)) - clock.instant_at(Time(0)), Duration::from_millis(2_000));
    }
}
