//! The hot path, enqueue -> claim -> ack (every 32), with `u64` payloads,
//! beside a baseline making the same moves with two plain `VecDeque`s, at
//! 1,000 to 1,000,000 records queued. One iteration moves one envelope, so
//! the reported time is the cost per envelope.
//!
//! `cargo bench -p egress-core --bench cycle`

// `criterion_group!` generates an undocumented function.
#![allow(missing_docs)]

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use egress_core::{ClaimOutcome, EgressCore, Policy, Sequence};

const ACK_EVERY: u64 = 32;
const QUEUED: [usize; 4] = [1_000, 10_000, 100_000, 1_000_000];

fn policy() -> Policy {
    Policy::builder().inflight_limit(64).build().expect("a window of 64 is valid")
}

/// The core in steady state: `queued` records pending, one enqueued and one
/// claimed per iteration, a cumulative ack every 32 claims.
struct CoreLoop {
    core: EgressCore<u64>,
    claimed: u64,
    last: Sequence,
}

impl CoreLoop {
    fn new(queued: usize) -> Self {
        let mut core = EgressCore::new(policy());
        let _ = core.enqueue_all(0..queued as u64);
        Self { core, claimed: 0, last: Sequence(0) }
    }

    fn step(&mut self, payload: u64) {
        let g = self.core.generation();
        let _ = self.core.enqueue(payload);
        if let ClaimOutcome::Claimed(envelope) = self.core.claim(g).outcome {
            black_box(envelope.payload);
            self.last = envelope.sequence;
            self.claimed += 1;
        }
        if self.claimed.is_multiple_of(ACK_EVERY) {
            let _ = black_box(self.core.ack(g, self.last));
        }
    }
}

#[derive(Clone, Copy)]
struct Rec {
    sequence: u64,
    attempt: u32,
    payload: u64,
}

/// The same moves with no state machine: two deques and a watermark.
struct DequeLoop {
    pending: VecDeque<Rec>,
    inflight: VecDeque<Rec>,
    next: u64,
    claimed: u64,
    last: u64,
}

impl DequeLoop {
    fn new(queued: usize) -> Self {
        // Pushed one by one, as the core's `enqueue_all` does, so both
        // queues grow to the same capacity.
        let mut pending = VecDeque::new();
        for s in 0..queued as u64 {
            pending.push_back(Rec { sequence: s, attempt: 0, payload: s });
        }
        Self { pending, inflight: VecDeque::new(), next: queued as u64, claimed: 0, last: 0 }
    }

    fn step(&mut self, payload: u64) {
        self.pending.push_back(Rec { sequence: self.next, attempt: 0, payload });
        self.next += 1;
        if self.inflight.len() < 64
            && let Some(mut rec) = self.pending.pop_front()
        {
            rec.attempt += 1;
            black_box(&rec.payload);
            self.last = rec.sequence;
            self.inflight.push_back(rec);
            self.claimed += 1;
        }
        if self.claimed.is_multiple_of(ACK_EVERY) {
            while self.inflight.front().is_some_and(|r| r.sequence <= self.last) {
                black_box(self.inflight.pop_front());
            }
        }
    }
}

fn cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("enqueue_claim_ack");
    group.throughput(Throughput::Elements(1));
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    for queued in QUEUED {
        group.bench_with_input(BenchmarkId::new("egress_core", queued), &queued, |b, &queued| {
            let mut state = CoreLoop::new(queued);
            let mut x = 0u64;
            b.iter(|| {
                x = x.wrapping_add(1);
                state.step(black_box(x));
            });
        });
        group.bench_with_input(BenchmarkId::new("two_vecdeques", queued), &queued, |b, &queued| {
            let mut state = DequeLoop::new(queued);
            let mut x = 0u64;
            b.iter(|| {
                x = x.wrapping_add(1);
                state.step(black_box(x));
            });
        });
    }
    group.finish();
}

criterion_group!(benches, cycle);
criterion_main!(benches);
