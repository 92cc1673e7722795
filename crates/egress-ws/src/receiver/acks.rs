//! When one connection acknowledges, and the faults injected into its
//! acknowledgements.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::{AckFaults, ReceiverConfig};
use crate::protocol::Frame;

/// An injected ack fault, as counted in `Shared::ack_faults`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fault {
    Dropped = 0,
    Duplicated = 1,
    Delayed = 2,
}

/// When to acknowledge on one connection, and the injected faults.
pub(super) struct Acks {
    interval: Duration,
    generation: u64,
    /// When the first unacknowledged commit was seen.
    since: Option<Instant>,
    faults: AckFaults,
    rng: crate::rng::Xorshift,
    delayed: VecDeque<(Instant, u64)>,
}

impl Acks {
    pub(super) fn new(config: &ReceiverConfig, generation: u64) -> Self {
        Acks {
            interval: config.ack_interval,
            generation,
            since: None,
            faults: config.ack_faults,
            rng: crate::rng::Xorshift::new(config.ack_faults.seed ^ generation.rotate_left(17) ^ 0x9E37_79B9_7F4A_7C15),
            delayed: VecDeque::new(),
        }
    }

    /// A commit woke the connection: start the interval if unacknowledged
    /// commits wait (`unacked` asks the inbox).
    pub(super) fn woken(&mut self, now: Instant, unacked: impl FnOnce() -> bool) {
        if self.since.is_none() && unacked() {
            self.since = Some(now);
        }
    }

    pub(super) fn deadline(&self) -> Option<Instant> {
        let coalesce = self.since.map(|s| s + self.interval);
        let delayed = self.delayed.front().map(|(at, _)| *at);
        match (coalesce, delayed) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        self.rng.next_f64() < p
    }

    /// The ack frames to send now. `poll` asks the inbox for the ack to
    /// send (given whether the interval is up: then any committed progress
    /// is acknowledged); `fault` counts each injected fault.
    pub(super) fn due(
        &mut self,
        now: Instant,
        poll: impl FnOnce(bool) -> Option<u64>,
        fault: impl Fn(Fault),
    ) -> Vec<Frame> {
        let mut out = Vec::new();
        let time_up = self.since.is_some_and(|s| now >= s + self.interval);
        if let Some(through) = poll(time_up) {
            self.since = None;
            if self.chance(self.faults.drop) {
                fault(Fault::Dropped);
            } else {
                let copies = if self.chance(self.faults.duplicate) { 2 } else { 1 };
                if copies == 2 {
                    fault(Fault::Duplicated);
                }
                for _ in 0..copies {
                    if self.chance(self.faults.delay_probability) {
                        fault(Fault::Delayed);
                        self.delayed.push_back((now + self.faults.delay, through));
                    } else {
                        out.push(Frame::Ack { generation: self.generation, through });
                    }
                }
            }
        } else if time_up {
            self.since = None;
        }
        while self.delayed.front().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, through)) = self.delayed.pop_front() {
                out.push(Frame::Ack { generation: self.generation, through });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn acks(faults: AckFaults) -> Acks {
        let config = ReceiverConfig { ack_interval: 100 * MS, ack_faults: faults, ..ReceiverConfig::default() };
        Acks::new(&config, 7)
    }

    fn ack(through: u64) -> Frame {
        Frame::Ack { generation: 7, through }
    }

    #[test]
    fn acks_wait_out_the_interval_from_the_first_unacknowledged_commit() {
        let mut a = acks(AckFaults::default());
        let t0 = Instant::now();
        a.woken(t0, || false);
        assert_eq!(a.deadline(), None, "nothing unacknowledged: no interval");
        a.woken(t0, || true);
        a.woken(t0 + 40 * MS, || true);
        assert_eq!(a.deadline(), Some(t0 + 100 * MS), "from the first commit, not the last");
        let asked = Cell::new(None);
        let poll = |up: bool, answer: Option<u64>| {
            asked.set(Some(up));
            answer
        };
        assert_eq!(a.due(t0 + 99 * MS, |up| poll(up, None), |_| unreachable!()), []);
        assert_eq!(asked.get(), Some(false), "not up a moment before");
        assert_eq!(a.deadline(), Some(t0 + 100 * MS));
        assert_eq!(a.due(t0 + 100 * MS, |up| poll(up, Some(3)), |_| unreachable!()), [ack(3)]);
        assert_eq!(asked.get(), Some(true), "up at the interval");
        assert_eq!(a.deadline(), None, "acknowledged: the interval ends");
        // An interval that ends with nothing to acknowledge ends too.
        a.woken(t0 + 200 * MS, || true);
        assert_eq!(a.due(t0 + 300 * MS, |up| poll(up, None), |_| unreachable!()), []);
        assert_eq!(asked.get(), Some(true));
        assert_eq!(a.deadline(), None);
    }

    #[test]
    fn injected_faults_drop_duplicate_and_delay_acks_and_are_counted() {
        let t0 = Instant::now();
        let counted = RefCell::new(Vec::new());
        let count = |f: Fault| counted.borrow_mut().push(f);
        let mut dropping = acks(AckFaults { drop: 1.0, ..AckFaults::default() });
        assert_eq!(dropping.due(t0, |_| Some(1), count), []);
        assert_eq!(counted.take(), [Fault::Dropped]);
        let mut doubling = acks(AckFaults { duplicate: 1.0, ..AckFaults::default() });
        assert_eq!(doubling.due(t0, |_| Some(2), count), [ack(2), ack(2)]);
        assert_eq!(counted.take(), [Fault::Duplicated]);
        let mut plain = acks(AckFaults::default());
        assert_eq!(plain.due(t0, |_| Some(3), count), [ack(3)]);
        assert_eq!(counted.take(), [], "no fault: nothing counted");
        let mut delaying =
            acks(AckFaults { duplicate: 1.0, delay_probability: 1.0, delay: 30 * MS, ..AckFaults::default() });
        assert_eq!(delaying.due(t0, |_| Some(4), count), []);
        assert_eq!(counted.take(), [Fault::Duplicated, Fault::Delayed, Fault::Delayed]);
        assert_eq!(delaying.deadline(), Some(t0 + 30 * MS), "the delayed ones set the deadline");
        delaying.woken(t0, || true);
        assert_eq!(delaying.deadline(), Some(t0 + 30 * MS), "the earlier of the interval and the delay");
        assert_eq!(delaying.due(t0 + 29 * MS, |_| None, count), [], "held until their time");
        assert_eq!(delaying.due(t0 + 30 * MS, |_| None, count), [ack(4), ack(4)]);
        assert_eq!(delaying.deadline(), Some(t0 + 100 * MS), "the interval remains");
        assert_eq!(counted.take(), []);
    }
}
