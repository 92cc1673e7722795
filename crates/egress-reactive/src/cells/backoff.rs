//! The seeded randomness the transports share: a xorshift64 generator,
//! and the reconnect backoff of their supervisors (the WebSocket sender,
//! the NATS publisher): jittered, exponential, capped, and reproducible
//! from a seed.

use std::time::Duration;

/// A xorshift64 generator (shifts 13, 7, 17): the seeded draws of the
/// backoff, the chaos proxy's kill schedule, the receiver's injected
/// faults and the demo's schedules, each reproducible from its seed. Its
/// state is never zero (a zero state would stay zero): the seed's lowest
/// bit is set, so seeds that differ only there give the same sequence.
#[derive(Clone, Copy, Debug)]
pub struct Xorshift(u64);

impl Xorshift {
    /// The generator of `seed`.
    pub const fn new(seed: u64) -> Self {
        Xorshift(seed | 1)
    }

    /// The next value (never zero).
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A value uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let x = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        x
    }
}

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
    rng: Xorshift,
}

impl Backoff {
    /// Delays from `base`, doubling up to `max`, drawn with seed `seed`.
    pub const fn new(base: Duration, max: Duration, seed: u64) -> Self {
        Backoff { base, max, rng: Xorshift::new(seed) }
    }

    /// The cap.
    pub const fn max(&self) -> Duration {
        self.max
    }

    /// The delay after `failures` failed connections in a row.
    pub fn delay(&mut self, failures: u32) -> Duration {
        let random = self.rng.next_u64();
        Self::delay_with(self.base, self.max, failures, random)
    }

    /// The delay after `failures` failures with the draw `random`.
    pub fn delay_with(base: Duration, max: Duration, failures: u32, random: u64) -> Duration {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let full = micros(base).saturating_mul(1u64 << failures.min(40)).min(micros(max));
        Duration::from_micros(full / 2 + random % (full / 2 + 1))
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
    fn a_seed_gives_one_sequence_that_never_sticks_at_zero() {
        let run = |seed| {
            let mut g = Xorshift::new(seed);
            (0..64).map(|_| g.next_u64()).collect::<Vec<_>>()
        };
        for seed in [0, 1, 2, u64::MAX] {
            let values = run(seed);
            assert!(values.iter().all(|&v| v != 0), "seed {seed}");
            assert!(values.windows(2).all(|w| w[0] != w[1]), "seed {seed}: it moves");
            assert_eq!(values, run(seed), "reproducible");
        }
        assert_eq!(run(0), run(1), "the lowest bit is set");
        assert_ne!(run(2), run(4));
        // The first values of seed 1, computed apart (in Python) from the
        // published xorshift64 (13, 7, 17).
        let mut g = Xorshift::new(1);
        let reference =
            [1_082_269_761, 1_152_992_998_833_853_505, 11_177_516_664_432_764_457, 17_678_023_832_001_937_445];
        assert_eq!([g.next_u64(), g.next_u64(), g.next_u64(), g.next_u64()], reference);
        // next_f64: the top 53 bits over 2^53.
        let mut g = Xorshift::new(1);
        assert_eq!(g.next_f64(), (1_082_269_761u64 >> 11) as f64 / (1u64 << 53) as f64);
        let f = Xorshift::new(7).next_f64();
        assert!((0.0..1.0).contains(&f));
    }

    #[test]
    fn the_backoff_draws_from_its_seed() {
        // Seed 1's first draw, 1,082,269,761, at 10 ms (10,000 us):
        // 5,000 + 1,082,269,761 mod 5,001 us.
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_secs(1), 1);
        assert_eq!(b.delay(0), Duration::from_micros(5_000 + 1_082_269_761 % 5_001));
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
