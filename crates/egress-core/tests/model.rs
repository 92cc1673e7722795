//! Model-based property test: the core against a plain reference model of
//! the specification, with the invariants checked after every step.
//!
//! The reference model keeps every record in a `Vec` with its generation
//! written out, sorts by hand and recomputes everything from scratch. The
//! change set of each transition is checked against the projections that
//! actually differ before and after it, so "invalidate exactly what changed"
//! is tested, not assumed.

use std::collections::BTreeSet;

use egress_core::{
    AckOutcome, Attempt, ClaimOutcome, Delay, EgressCore, Envelope, FailOutcome, FailureKind, Generation, JitterSample,
    Ordering, Policy, Projection, ReconnectOutcome, ScheduleOutcome, Sequence, Time,
};
use proptest::prelude::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rec {
    generation: u64,
    sequence: u64,
    attempt: u32,
    budget_start: u32,
    payload: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct ParkedRec {
    rec: Rec,
    backoff: u64,
    due: u64,
}

/// The specification, written as plainly as possible.
#[derive(Clone, Debug)]
struct Model {
    limit: usize,
    budget: u32,
    base: u64,
    ceiling: u64,
    jitter: f64,
    strict: bool,
    generation: u64,
    next: u64,
    pending: Vec<Rec>,
    inflight: Vec<Rec>,
    parked: Vec<ParkedRec>,
    exhausted: Vec<Rec>,
    acked: Option<u64>,
    retry: Option<(u64, u32, u64, bool)>,
}

/// Outcomes in one comparable shape.
#[derive(Clone, Debug, PartialEq)]
enum Out {
    Seq(u64),
    Claimed(u64, u64, u32, u32),
    Empty,
    WindowFull,
    Blocked(u64),
    Stale(u64),
    Advanced(u64),
    Unchanged(Option<u64>),
    Unassigned(u64),
    Retrying(u64, u32, u64),
    Exhausted(u64, u32, u64),
    Unknown,
    Scheduled(u64),
    Timeout(Vec<u64>),
    Reconnected(u64, usize),
    ReconnectUnchanged,
}

impl Model {
    fn sort_pending(&mut self) {
        self.pending.sort_by_key(|r| r.sequence);
    }

    fn enqueue(&mut self, payload: u32) -> Out {
        let s = self.next;
        self.pending.push(Rec { generation: self.generation, sequence: s, attempt: 0, budget_start: 0, payload });
        self.next += 1;
        Out::Seq(s)
    }

    fn claim(&mut self, g: u64) -> Out {
        if g != self.generation {
            return Out::Stale(self.generation);
        }
        if self.pending.is_empty() {
            return Out::Empty;
        }
        if self.inflight.len() >= self.limit {
            return Out::WindowFull;
        }
        let head = self.pending[0].sequence;
        if self.strict {
            let lowest =
                self.parked.iter().map(|p| p.rec.sequence).chain(self.exhausted.iter().map(|r| r.sequence)).min();
            if let Some(l) = lowest.filter(|l| *l < head) {
                return Out::Blocked(l);
            }
        }
        let mut r = self.pending.remove(0);
        r.attempt += 1;
        self.inflight.push(r);
        Out::Claimed(r.generation, r.sequence, r.attempt, r.payload)
    }

    fn ack(&mut self, g: u64, through: u64) -> Out {
        if g != self.generation {
            return Out::Stale(self.generation);
        }
        if through >= self.next {
            return Out::Unassigned(self.next);
        }
        if self.acked.is_some_and(|a| through <= a) {
            return Out::Unchanged(self.acked);
        }
        self.acked = Some(through);
        self.pending.retain(|r| r.sequence > through);
        self.inflight.retain(|r| r.sequence > through);
        self.parked.retain(|p| p.rec.sequence > through);
        self.exhausted.retain(|r| r.sequence > through);
        if self.retry.is_some_and(|r| r.0 <= through) {
            self.retry = None;
        }
        Out::Advanced(through)
    }

    fn backoff(&self, k: u32, hint: Option<u64>, sample: f64) -> u64 {
        let mut b: u128 = u128::from(self.base);
        for _ in 1..k {
            b *= 2;
            if b > u128::from(self.ceiling) {
                break;
            }
        }
        let mut b = u64::try_from(b.min(u128::from(self.ceiling))).expect("capped by a u64 ceiling");
        if let Some(h) = hint {
            b = b.max(h);
        }
        let spread = (b as f64 * self.jitter * sample) as u64;
        b.saturating_add(spread)
    }

    fn fail(&mut self, g: u64, s: u64, kind: FailureKind, now: u64, sample: f64) -> Out {
        if g != self.generation {
            return Out::Stale(self.generation);
        }
        let Some(i) = self.inflight.iter().position(|r| r.sequence == s) else {
            return Out::Unknown;
        };
        let r = self.inflight.remove(i);
        let k = r.attempt - r.budget_start;
        let hint = if let FailureKind::RetryAfter(d) = kind { Some(d.0) } else { None };
        let b = self.backoff(k, hint, sample);
        if kind == FailureKind::Permanent || k > self.budget {
            self.exhausted.push(r);
            self.exhausted.sort_by_key(|r| r.sequence);
            self.retry = Some((s, r.attempt, b, true));
            Out::Exhausted(s, r.attempt, b)
        } else {
            self.parked.push(ParkedRec { rec: r, backoff: b, due: now.saturating_add(b) });
            self.parked.sort_by_key(|p| p.rec.sequence);
            self.retry = Some((s, r.attempt, b, false));
            Out::Retrying(s, r.attempt, b)
        }
    }

    fn clear_retry(&mut self, s: u64) {
        if self.retry.is_some_and(|r| r.0 == s) {
            self.retry = None;
        }
    }

    fn retry_now(&mut self, g: u64, s: u64) -> Out {
        if g != self.generation {
            return Out::Stale(self.generation);
        }
        let Some(i) = self.parked.iter().position(|p| p.rec.sequence == s) else {
            return Out::Unknown;
        };
        let p = self.parked.remove(i);
        self.pending.push(p.rec);
        self.sort_pending();
        self.clear_retry(s);
        Out::Scheduled(s)
    }

    fn handle_timeout(&mut self, now: u64) -> Out {
        let due: Vec<ParkedRec> = self.parked.iter().filter(|p| p.due <= now).cloned().collect();
        self.parked.retain(|p| p.due > now);
        let mut seqs = Vec::new();
        for p in due {
            seqs.push(p.rec.sequence);
            self.clear_retry(p.rec.sequence);
            self.pending.push(p.rec);
        }
        self.sort_pending();
        Out::Timeout(seqs)
    }

    fn requeue(&mut self, g: u64, s: u64) -> Out {
        if g != self.generation {
            return Out::Stale(self.generation);
        }
        let Some(i) = self.exhausted.iter().position(|r| r.sequence == s) else {
            return Out::Unknown;
        };
        let mut r = self.exhausted.remove(i);
        r.generation = self.generation;
        r.budget_start = r.attempt;
        self.pending.push(r);
        self.sort_pending();
        self.clear_retry(s);
        Out::Scheduled(s)
    }

    fn reconnect(&mut self, g: u64) -> Out {
        if g < self.generation {
            return Out::Stale(self.generation);
        }
        if g == self.generation {
            return Out::ReconnectUnchanged;
        }
        self.generation = g;
        let mut moved: Vec<Rec> = self.inflight.drain(..).collect();
        let replayed_parked: Vec<Rec> = self.parked.drain(..).map(|p| p.rec).collect();
        for r in &replayed_parked {
            self.clear_retry(r.sequence);
        }
        moved.extend(replayed_parked);
        let replayed = moved.len();
        self.pending.extend(moved);
        for r in &mut self.pending {
            r.generation = g;
        }
        self.sort_pending();
        Out::Reconnected(g, replayed)
    }
}

/// Everything observable, projection by projection.
#[derive(Clone, Debug, PartialEq)]
struct Observed {
    pending: Vec<(u64, u64, u32, u32)>,
    inflight: Vec<(u64, u64, u32, u32)>,
    acked: Option<u64>,
    retry: Option<(u64, u32, u64, bool)>,
    parked: Vec<(u64, u32, u64, u64, u32)>,
    exhausted: Vec<(u64, u64, u32, u32)>,
    generation: u64,
}

fn env(e: Envelope<&u32>) -> (u64, u64, u32, u32) {
    (e.generation.0, e.sequence.0, e.attempt.0, *e.payload)
}

fn observe(core: &EgressCore<u32>) -> Observed {
    Observed {
        pending: core.pending().map(env).collect(),
        inflight: core.inflight().map(env).collect(),
        acked: core.acked_through().map(|s| s.0),
        retry: core.retry().map(|r| (r.sequence.0, r.attempt.0, r.backoff.0, r.exhausted)),
        parked: core.parked().map(|p| (p.sequence.0, p.attempt.0, p.backoff.0, p.due.0, *p.payload)).collect(),
        exhausted: core.exhausted().map(env).collect(),
        generation: core.generation().0,
    }
}

fn observe_model(m: &Model) -> Observed {
    let e = |r: &Rec| (r.generation, r.sequence, r.attempt, r.payload);
    Observed {
        pending: m.pending.iter().map(e).collect(),
        inflight: m.inflight.iter().map(e).collect(),
        acked: m.acked,
        retry: m.retry,
        parked: m.parked.iter().map(|p| (p.rec.sequence, p.rec.attempt, p.backoff, p.due, p.rec.payload)).collect(),
        exhausted: m.exhausted.iter().map(e).collect(),
        generation: m.generation,
    }
}

fn differing(a: &Observed, b: &Observed) -> BTreeSet<Projection> {
    let mut set = BTreeSet::new();
    let mut check = |p, changed: bool| {
        if changed {
            set.insert(p);
        }
    };
    check(Projection::Pending, a.pending != b.pending);
    check(Projection::Inflight, a.inflight != b.inflight);
    check(Projection::AckedThrough, a.acked != b.acked);
    check(Projection::Retry, a.retry != b.retry);
    check(Projection::Parked, a.parked != b.parked);
    check(Projection::Exhausted, a.exhausted != b.exhausted);
    check(Projection::Generation, a.generation != b.generation);
    set
}

#[derive(Clone, Debug)]
enum Op {
    Enqueue(u32),
    Claim(i8),
    Ack(i8, u64),
    Fail(i8, u64, u8, u64, f64),
    RetryNow(i8, u64),
    Tick(u64),
    Requeue(i8, u64),
    Reconnect(i8),
}

/// A generation offset: mostly the current generation, sometimes a stale or
/// future one.
fn gen_offset() -> impl Strategy<Value = i8> {
    prop_oneof![8 => Just(0i8), 1 => Just(-1i8), 1 => Just(1i8)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => any::<u32>().prop_map(Op::Enqueue),
        5 => gen_offset().prop_map(Op::Claim),
        2 => (gen_offset(), 0u64..24).prop_map(|(g, s)| Op::Ack(g, s)),
        3 => (gen_offset(), 0u64..24, 0u8..4, 0u64..40, prop_oneof![Just(0.0), Just(1.0), 0.0f64..1.0])
            .prop_map(|(g, s, k, d, j)| Op::Fail(g, s, k, d, j)),
        1 => (gen_offset(), 0u64..24).prop_map(|(g, s)| Op::RetryNow(g, s)),
        2 => (0u64..60).prop_map(Op::Tick),
        1 => (gen_offset(), 0u64..24).prop_map(|(g, s)| Op::Requeue(g, s)),
        1 => prop_oneof![Just(1i8), Just(0i8), Just(-1i8), Just(3i8)].prop_map(Op::Reconnect),
    ]
}

fn policy() -> impl Strategy<Value = (usize, u32, u64, u64, f64, bool)> {
    (1usize..5, 0u32..4, 0u64..10, 0u64..60, prop_oneof![Just(0.0), Just(0.5), Just(1.0)], any::<bool>())
        .prop_map(|(l, b, base, extra, j, strict)| (l, b, base, base + extra, j, strict))
}

fn run(params: (usize, u32, u64, u64, f64, bool), start: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let (limit, budget, base, ceiling, jitter, strict) = params;
    let policy = Policy::builder()
        .inflight_limit(limit)
        .retry_budget(budget)
        .retry_base(Delay(base))
        .retry_ceiling(Delay(ceiling))
        .jitter(jitter)
        .ordering(if strict { Ordering::Strict } else { Ordering::Pipelined })
        .build()
        .expect("the strategy only builds valid policies");
    let mut core: EgressCore<u32> = EgressCore::with_generation(policy, Generation(start));
    let mut model = Model {
        limit,
        budget,
        base,
        ceiling,
        jitter,
        strict,
        generation: start,
        next: 0,
        pending: vec![],
        inflight: vec![],
        parked: vec![],
        exhausted: vec![],
        acked: None,
        retry: None,
    };
    let mut now = 0u64;
    for (step, op) in ops.into_iter().enumerate() {
        let before_state = core.clone();
        let before = observe(&core);
        let current = model.generation;
        let g = move |off: i8| current.saturating_add_signed(i64::from(off));
        let stale = move |off: i8| g(off) != current;
        let (got, changes, expected, is_stale) = match op {
            Op::Enqueue(p) => {
                let t = core.enqueue(p);
                (Out::Seq(t.outcome.0), t.changes, model.enqueue(p), false)
            }
            Op::Claim(off) => {
                let target = g(off);
                let t = core.claim(Generation(target));
                let out = match t.outcome {
                    ClaimOutcome::Claimed(e) => Out::Claimed(e.generation.0, e.sequence.0, e.attempt.0, *e.payload),
                    ClaimOutcome::Empty => Out::Empty,
                    ClaimOutcome::WindowFull => Out::WindowFull,
                    ClaimOutcome::Blocked { sequence } => Out::Blocked(sequence.0),
                    ClaimOutcome::StaleGeneration { current } => Out::Stale(current.0),
                };
                (out, t.changes, model.claim(target), stale(off))
            }
            Op::Ack(off, s) => {
                let target = g(off);
                let t = core.ack(Generation(target), Sequence(s));
                let out = match t.outcome {
                    AckOutcome::Advanced { through } => Out::Advanced(through.0),
                    AckOutcome::Unchanged { through } => Out::Unchanged(through.map(|s| s.0)),
                    AckOutcome::Unassigned { next_sequence, .. } => Out::Unassigned(next_sequence.0),
                    AckOutcome::StaleGeneration { current } => Out::Stale(current.0),
                };
                (out, t.changes, model.ack(target, s), stale(off))
            }
            Op::Fail(off, s, k, d, j) => {
                let target = g(off);
                let kind = match k {
                    0 | 1 => FailureKind::Transient,
                    2 => FailureKind::Permanent,
                    _ => FailureKind::RetryAfter(Delay(d)),
                };
                let sample = JitterSample::new(j).expect("strategy samples lie in [0, 1]");
                let t = core.fail(Generation(target), Sequence(s), kind, Time(now), sample);
                let out = match t.outcome {
                    FailOutcome::Retrying(r) => Out::Retrying(r.sequence.0, r.attempt.0, r.backoff.0),
                    FailOutcome::Exhausted(r) => Out::Exhausted(r.sequence.0, r.attempt.0, r.backoff.0),
                    FailOutcome::UnknownSequence { .. } => Out::Unknown,
                    FailOutcome::StaleGeneration { current } => Out::Stale(current.0),
                };
                (out, t.changes, model.fail(target, s, kind, now, j), stale(off))
            }
            Op::RetryNow(off, s) | Op::Requeue(off, s) => {
                let target = g(off);
                let requeue = matches!(op, Op::Requeue(..));
                let t = if requeue {
                    core.requeue(Generation(target), Sequence(s))
                } else {
                    core.retry_now(Generation(target), Sequence(s))
                };
                let out = match t.outcome {
                    ScheduleOutcome::Scheduled { sequence } => Out::Scheduled(sequence.0),
                    ScheduleOutcome::UnknownSequence { .. } => Out::Unknown,
                    ScheduleOutcome::StaleGeneration { current } => Out::Stale(current.0),
                };
                let expected = if requeue { model.requeue(target, s) } else { model.retry_now(target, s) };
                (out, t.changes, expected, stale(off))
            }
            Op::Tick(d) => {
                now += d;
                let t = core.handle_timeout(Time(now));
                (Out::Timeout(t.outcome.iter().map(|s| s.0).collect()), t.changes, model.handle_timeout(now), false)
            }
            Op::Reconnect(off) => {
                let target = g(off);
                let t = core.reconnect(Generation(target));
                let out = match t.outcome {
                    ReconnectOutcome::Advanced { generation, replayed } => Out::Reconnected(generation.0, replayed),
                    ReconnectOutcome::Unchanged => Out::ReconnectUnchanged,
                    ReconnectOutcome::StaleGeneration { current } => Out::Stale(current.0),
                };
                (out, t.changes, model.reconnect(target), target < current)
            }
        };
        let after = observe(&core);
        prop_assert_eq!(&got, &expected, "step {}: outcome differs from the model", step);
        prop_assert_eq!(&after, &observe_model(&model), "step {}: state differs from the model", step);
        let reported: BTreeSet<Projection> = changes.iter().collect();
        prop_assert_eq!(reported, differing(&before, &after), "step {}: change set is not what changed", step);
        if is_stale || changes.is_empty() {
            prop_assert!(core == before_state, "step {}: a stale or no-change call altered the state", step);
        }
        prop_assert!(changes.is_empty() || !is_stale, "step {}: a stale call reported changes", step);
        check_invariants(&core, &before_state)?;
    }
    Ok(())
}

fn check_invariants(core: &EgressCore<u32>, before: &EgressCore<u32>) -> Result<(), TestCaseError> {
    prop_assert!(core.next_sequence() >= before.next_sequence(), "sequences went backwards");
    prop_assert!(core.acked_through() >= before.acked_through(), "the watermark regressed");
    prop_assert!(core.generation() >= before.generation(), "the generation regressed");
    prop_assert!(core.inflight_len() <= core.policy().inflight_limit(), "the window overflowed");
    let pending: Vec<Sequence> = core.pending().map(|e| e.sequence).collect();
    prop_assert!(pending.windows(2).all(|w| w[0] < w[1]), "pending is not sorted: {:?}", pending);
    let mut seen = vec![0u8; usize::try_from(core.next_sequence().0).expect("small in tests")];
    let places = pending
        .into_iter()
        .chain(core.inflight().map(|e| e.sequence))
        .chain(core.parked().map(|p| p.sequence))
        .chain(core.exhausted().map(|e| e.sequence));
    for s in places {
        let slot = seen.get_mut(usize::try_from(s.0).expect("small in tests"));
        prop_assert!(slot.is_some(), "{} was never assigned", s);
        if let Some(slot) = slot {
            *slot += 1;
        }
    }
    for (s, count) in seen.iter().enumerate() {
        let acked = core.acked_through().is_some_and(|w| (s as u64) <= w.0);
        if acked {
            prop_assert_eq!(*count, 0, "#{} is acknowledged yet still held", s);
        } else {
            prop_assert_eq!(*count, 1, "#{} is held in {} places (lost if 0)", s, count);
        }
    }
    for e in core.pending().chain(core.inflight()) {
        prop_assert_eq!(e.generation, core.generation(), "a live envelope carries an old generation");
        prop_assert!(e.attempt <= Attempt(u32::MAX));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

    #[test]
    fn core_matches_the_reference_model(params in policy(), start in 0u64..3, ops in prop::collection::vec(op(), 1..60)) {
        run(params, start, ops)?;
    }
}
