//! The reconnect backoff shared by the transports' supervisors (the
//! WebSocket sender, the NATS publisher): jittered, exponential, capped,
//! and reproducible from a seed.

use std::time::Duration;

/// A supervisor's reconnect delays: after `failures` failed connections in
/// a row, a delay drawn from the upper half of `base * 2^failures`, capped
/// at `max`. The draws come from a seeded xorshift64 generator, so a seed
/// reproduces a schedule.
///
/// ```
/// use std::time::Duration;
/// use egress_reactive::Backoff;
///
/// let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(100), 7);
/// let d = backoff.delay(2);
/// assert!(d >= Duration::from_millis(20) && d <= Duration::from_millis(40));
/// ```
#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    state: u64,
}

impl Backoff {
    /// Delays from `base`, doubling up to `max`, drawn with seed `seed`.
    pub const fn new(base: Duration, max: Duration, seed: u64) -> Self {
        // A zero state would stay zero: the lowest bit is set.
        Backoff { base, max, state: seed | 1 }
    }

    /// The cap.
    pub const fn max(&self) -> Duration {
        self.max
    }

    /// The delay after `failures` failed connections in a row.
    pub fn delay(&mut self, failures: u32) -> Duration {
        let random = self.next_u64();
        Self::delay_with(self.base, self.max, failures, random)
    }

    /// The delay after `failures` failures with the draw `random`.
    pub fn delay_with(base: Duration, max: Duration, failures: u32, random: u64) -> Duration {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let full = micros(base).saturating_mul(1u64 << failures.min(40)).min(micros(max));
        Duration::from_micros(full / 2 + random % (full / 2 + 1))
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state = x;
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_base_up_to_the_cap_within_its_upper_half() {
        let (base, max) = (Duration::from_millis(10), Duration::from_millis(100));
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        for (failures, full) in [(0, 10.0), (1, 20.0), (2, 40.0), (3, 80.0), (4, 100.0), (60, 100.0)] {
            for random in [0, 1, 12_345, u64::MAX] {
                let d = ms(Backoff::delay_with(base, max, failures, random));
                assert!(
                    (full / 2.0..=full).contains(&d),
                    "failures {failures}: {d} ms not in [{}, {full}]",
                    full / 2.0
                );
            }
        }
        assert_eq!(Backoff::delay_with(base, max, 0, 0), Duration::from_millis(5));
        // The draw covers the whole upper half, its top included, and
        // wraps: at 10 ms (10,000 us), 5,000 us plus the draw mod 5,001.
        let us = |random| Backoff::delay_with(base, max, 0, random).as_micros();
        assert_eq!([us(1), us(4_999), us(5_000), us(5_001), us(5_002)], [5_001, 9_999, 10_000, 5_000, 5_001]);
    }

    #[test]
    fn a_seed_reproduces_its_delays_and_another_seed_differs() {
        let run = |seed| {
            let mut b = Backoff::new(Duration::from_millis(10), Duration::from_secs(10), seed);
            (0..8).map(|f| b.delay(f)).collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(5));
        assert_eq!(Backoff::new(Duration::ZERO, Duration::from_secs(1), 0).max(), Duration::from_secs(1));
    }
}
