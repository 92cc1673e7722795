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
    AckOutcome, Attempt, ClaimOutcome, DeadLetters, DeadReason, Delay, EgressCore, Envelope, FailOutcome, FailureKind,
    Generation, Isolation, JitterSample, Ordering, Policy, Projection, ReceivedOutcome, ReconnectOutcome,
    ScheduleOutcome, Sequence, Time,
};
use proptest::prelude::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rec {
    generation: u64,
    sequence: u64,
    attempt: u32,
    failures: u32,
    replays: u32,
    resend: bool,
    dead: Option<DeadReason>,
    payload: u32,
    /// Claims in the current budget: not part of the core's state, kept to
    /// check the bound on sends.
    claims: u32,
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
    replay_limit: u32,
    base: u64,
    ceiling: u64,
    jitter: f64,
    strict: bool,
    hold: bool,
    generation: u64,
    next: u64,
    pending: Vec<Rec>,
    inflight: Vec<Rec>,
    parked: Vec<ParkedRec>,
    exhausted: Vec<(u64, DeadReason, Rec)>,
    acked: Option<u64>,
    received: Option<u64>,
    sent: Option<u64>,
    retry: Option<(u64, u32, u64, bool)>,
    progressed: bool,
    isolation: Isolation,
}

/// Outcomes in one comparable shape.
#[derive(Clone, Debug, PartialEq)]
enum Out {
    Seq(u64),
    Claimed(u64, u64, u32, u32, Option<DeadReason>),
    Empty,
    WindowFull,
    Blocked(u64),
    Isolating(u64),
    Stale(u64),
    Advanced(u64),
    Unchanged(Option<u64>),
    Unsent(Option<u64>),
    Recorded(u64, usize),
    Retrying(u64, u32, u64),
    Exhausted(u64, u32, u64),
    Unknown,
    Scheduled(u64),
    Timeout(Vec<u64>),
    Reconnected(u64, usize, usize),
    ReconnectUnchanged,
}

impl Model {
    fn sort_pending(&mut self) {
        self.pending.sort_by_key(|r| r.sequence);
    }

    fn window_end(&self) -> u64 {
        self.acked.map_or(0, |a| a + 1) + self.limit as u64
    }

    fn enqueue(&mut self, payload: u32) -> Out {
        let s = self.next;
        self.pending.push(Rec {
            generation: self.generation,
            sequence: s,
            attempt: 0,
            failures: 0,
            replays: 0,
            resend: false,
            dead: None,
            payload,
            claims: 0,
        });
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
        let head = self.pending[0].sequence;
        if self.strict {
            let lowest =
                self.parked.iter().map(|p| p.rec.sequence).chain(self.exhausted.iter().map(|e| e.2.sequence)).min();
            if let Some(l) = lowest.filter(|l| *l < head) {
                return Out::Blocked(l);
            }
        }
        if let Isolation::Probing(p) = self.isolation {
            return Out::Isolating(p.0);
        }
        if head >= self.window_end() {
            return Out::WindowFull;
        }
        let mut r = self.pending.remove(0);
        r.attempt += 1;
        r.claims += 1;
        r.resend = false;
        self.sent = Some(self.sent.map_or(head, |s| s.max(head)));
        if self.isolation == Isolation::Ready {
            self.isolation = Isolation::Probing(Sequence(head));
        }
        self.inflight.push(r);
        Out::Claimed(r.generation, r.sequence, r.attempt, r.payload, r.dead)
    }

    /// The peer holds `t`: progress, if that is news.
    fn receipt(&mut self, t: u64) -> bool {
        if self.received.is_some_and(|r| t <= r) {
            return false;
        }
        self.received = Some(t);
        self.progressed = true;
        self.isolation = Isolation::Off;
        true
    }

    fn ack(&mut self, g: u64, through: u64) -> Out {
        if g != self.generation {
            return Out::Stale(self.generation);
        }
        if self.sent.is_none_or(|s| through > s) {
            return Out::Unsent(self.sent);
        }
        if self.acked.is_some_and(|a| through <= a) {
            return Out::Unchanged(self.acked);
        }
        self.acked = Some(through);
        self.receipt(through);
        self.pending.retain(|r| r.sequence > through);
        self.inflight.retain(|r| r.sequence > through);
        self.parked.retain(|p| p.rec.sequence > through);
        self.exhausted.retain(|e| e.2.sequence > through);
        if self.retry.is_some_and(|r| r.0 <= through) {
            self.retry = None;
        }
        if let Isolation::Probing(p) = self.isolation
            && p.0 <= through
        {
            self.isolation = Isolation::Ready;
        }
        Out::Advanced(through)
    }

    fn received(&mut self, g: u64, through: u64) -> Out {
        if g != self.generation {
            return Out::Stale(self.generation);
        }
        if self.sent.is_none_or(|s| through > s) {
            return Out::Unsent(self.sent);
        }
        let rose = self.receipt(through);
        let mut moved = 0;
        while self.pending.first().is_some_and(|r| r.sequence <= through) {
            let mut r = self.pending.remove(0);
            if r.resend {
                r.resend = false;
                r.replays -= 1;
            }
            self.inflight.push(r);
            moved += 1;
        }
        if !rose && moved == 0 {
            return Out::Unchanged(self.received);
        }
        Out::Recorded(self.received.expect("set above"), moved)
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

    /// A dead letter under skip becomes a tombstone; a tombstone replayed
    /// past the limit goes on (with its first reason); held otherwise
    /// (hold, or a tombstone refused permanently).
    fn bury(&mut self, mut r: Rec, reason: DeadReason) {
        if !self.hold && (r.dead.is_none() || reason == DeadReason::Replays) {
            r.dead = r.dead.or(Some(reason));
            r.failures = 0;
            r.replays = 0;
            r.resend = false;
            r.claims = 0;
            self.pending.push(r);
            self.sort_pending();
        } else {
            self.exhausted.push((self.generation, reason, r));
            self.exhausted.sort_by_key(|e| e.2.sequence);
        }
    }

    fn fail(&mut self, g: u64, s: u64, kind: FailureKind, now: u64, sample: f64) -> Out {
        if g != self.generation {
            return Out::Stale(self.generation);
        }
        let Some(i) = self.inflight.iter().position(|r| r.sequence == s) else {
            return Out::Unknown;
        };
        let mut r = self.inflight.remove(i);
        if self.isolation == Isolation::Probing(Sequence(s)) {
            self.isolation = Isolation::Ready;
        }
        r.failures += 1;
        let k = r.failures;
        let hint = if let FailureKind::RetryAfter(d) = kind { Some(d.0) } else { None };
        let b = self.backoff(k, hint, sample);
        // A tombstone under skip is never given up on for its budget: it
        // parks for its backoff under a fresh one.
        let renew = r.dead.is_some() && !self.hold;
        let dead = if kind == FailureKind::Permanent {
            Some(DeadReason::Permanent)
        } else if k > self.budget && !renew {
            Some(DeadReason::Retries)
        } else {
            if k > self.budget {
                r.failures = 0;
                r.replays = 0;
                r.resend = false;
                r.claims = 0;
            }
            None
        };
        self.retry = Some((s, r.attempt, b, dead.is_some()));
        if let Some(reason) = dead {
            self.bury(r, reason);
            Out::Exhausted(s, r.attempt, b)
        } else {
            self.parked.push(ParkedRec { rec: r, backoff: b, due: now.saturating_add(b) });
            self.parked.sort_by_key(|p| p.rec.sequence);
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
        let Some(i) = self.exhausted.iter().position(|e| e.2.sequence == s) else {
            return Out::Unknown;
        };
        let (_, _, mut r) = self.exhausted.remove(i);
        r.generation = self.generation;
        r.failures = 0;
        r.replays = 0;
        r.resend = false;
        r.claims = 0;
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
        let had_inflight = !self.inflight.is_empty();
        let flown: Vec<Rec> = self.inflight.drain(..).collect();
        let (mut replayed, mut dead) = (0, 0);
        for mut r in flown {
            replayed += 1;
            r.replays += 1;
            r.resend = true;
            if r.replays > self.replay_limit {
                dead += 1;
                self.bury(r, DeadReason::Replays);
            } else {
                self.pending.push(r);
            }
        }
        let from_parked: Vec<Rec> = self.parked.drain(..).map(|p| p.rec).collect();
        for r in from_parked {
            self.clear_retry(r.sequence);
            self.pending.push(r);
            replayed += 1;
        }
        for r in &mut self.pending {
            r.generation = g;
        }
        self.sort_pending();
        self.isolation = if self.progressed {
            Isolation::Off
        } else if had_inflight || self.isolation != Isolation::Off {
            Isolation::Ready
        } else {
            Isolation::Off
        };
        self.progressed = false;
        Out::Reconnected(g, replayed, dead)
    }
}

/// Everything observable, projection by projection.
#[derive(Clone, Debug, PartialEq)]
struct Observed {
    pending: Vec<(u64, u64, u32, u32, Option<DeadReason>)>,
    inflight: Vec<(u64, u64, u32, u32, Option<DeadReason>)>,
    acked: Option<u64>,
    retry: Option<(u64, u32, u64, bool)>,
    parked: Vec<(u64, u32, u64, u64, u32, Option<DeadReason>)>,
    exhausted: Vec<(u64, u64, u32, u32, Option<DeadReason>)>,
    generation: u64,
    received: Option<u64>,
}

fn env(e: Envelope<&u32>) -> (u64, u64, u32, u32, Option<DeadReason>) {
    (e.generation.0, e.sequence.0, e.attempt.0, *e.payload, e.dead)
}

fn observe(core: &EgressCore<u32>) -> Observed {
    Observed {
        pending: core.pending().map(env).collect(),
        inflight: core.inflight().map(env).collect(),
        acked: core.acked_through().map(|s| s.0),
        retry: core.retry().map(|r| (r.sequence.0, r.attempt.0, r.backoff.0, r.exhausted)),
        parked: core.parked().map(|p| (p.sequence.0, p.attempt.0, p.backoff.0, p.due.0, *p.payload, p.dead)).collect(),
        exhausted: core.exhausted().map(env).collect(),
        generation: core.generation().0,
        received: core.received_through().map(|s| s.0),
    }
}

fn observe_model(m: &Model) -> Observed {
    let e = |r: &Rec| (r.generation, r.sequence, r.attempt, r.payload, r.dead);
    Observed {
        pending: m.pending.iter().map(e).collect(),
        inflight: m.inflight.iter().map(e).collect(),
        acked: m.acked,
        retry: m.retry,
        parked: m
            .parked
            .iter()
            .map(|p| (p.rec.sequence, p.rec.attempt, p.backoff, p.due, p.rec.payload, p.rec.dead))
            .collect(),
        exhausted: m
            .exhausted
            .iter()
            .map(|(g, reason, r)| (*g, r.sequence, r.attempt, r.payload, Some(*reason)))
            .collect(),
        generation: m.generation,
        received: m.received,
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
    check(Projection::Received, a.received != b.received);
    set
}

#[derive(Clone, Debug)]
enum Op {
    Enqueue(u32),
    Claim(i8),
    Ack(i8, u64),
    Received(i8, u64),
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
        1 => (gen_offset(), 0u64..24).prop_map(|(g, s)| Op::Received(g, s)),
        3 => (gen_offset(), 0u64..24, 0u8..4, 0u64..40, prop_oneof![Just(0.0), Just(1.0), 0.0f64..1.0])
            .prop_map(|(g, s, k, d, j)| Op::Fail(g, s, k, d, j)),
        1 => (gen_offset(), 0u64..24).prop_map(|(g, s)| Op::RetryNow(g, s)),
        2 => (0u64..60).prop_map(Op::Tick),
        1 => (gen_offset(), 0u64..24).prop_map(|(g, s)| Op::Requeue(g, s)),
        2 => prop_oneof![Just(1i8), Just(0i8), Just(-1i8), Just(3i8)].prop_map(Op::Reconnect),
    ]
}

/// limit, budget, replay limit, base, ceiling, jitter, strict, hold.
type Params = (usize, u32, u32, u64, u64, f64, bool, bool);

fn policy() -> impl Strategy<Value = Params> {
    (
        1usize..5,
        0u32..4,
        0u32..3,
        0u64..10,
        0u64..60,
        prop_oneof![Just(0.0), Just(0.5), Just(1.0)],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(l, b, r, base, extra, j, strict, hold)| (l, b, r, base, base + extra, j, strict, hold))
}

fn run(params: Params, start: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let (limit, budget, replay_limit, base, ceiling, jitter, strict, hold) = params;
    let policy = Policy::builder()
        .inflight_limit(limit)
        .retry_budget(budget)
        .replay_limit(replay_limit)
        .retry_base(Delay(base))
        .retry_ceiling(Delay(ceiling))
        .jitter(jitter)
        .ordering(if strict { Ordering::Strict } else { Ordering::Pipelined })
        .dead_letters(if hold { DeadLetters::Hold } else { DeadLetters::Skip })
        .build()
        .expect("the strategy only builds valid policies");
    let mut core: EgressCore<u32> = EgressCore::with_generation(policy, Generation(start));
    let mut model = Model {
        limit,
        budget,
        replay_limit,
        base,
        ceiling,
        jitter,
        strict,
        hold,
        generation: start,
        next: 0,
        pending: vec![],
        inflight: vec![],
        parked: vec![],
        exhausted: vec![],
        acked: None,
        received: None,
        sent: None,
        retry: None,
        progressed: false,
        isolation: Isolation::Off,
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
                    ClaimOutcome::Claimed(e) => {
                        Out::Claimed(e.generation.0, e.sequence.0, e.attempt.0, *e.payload, e.dead)
                    }
                    ClaimOutcome::Empty => Out::Empty,
                    ClaimOutcome::WindowFull => Out::WindowFull,
                    ClaimOutcome::Blocked { sequence } => Out::Blocked(sequence.0),
                    ClaimOutcome::Isolating { probe } => Out::Isolating(probe.0),
                    ClaimOutcome::StaleGeneration { current } => Out::Stale(current.0),
                    ClaimOutcome::Unpersisted { .. }
                    | ClaimOutcome::GenerationUnpersisted { .. }
                    | ClaimOutcome::Gated { .. } => {
                        panic!("a core without a journal or gates refused a claim for durability")
                    }
                };
                (out, t.changes, model.claim(target), stale(off))
            }
            Op::Ack(off, s) => {
                let target = g(off);
                let t = core.ack(Generation(target), Sequence(s));
                let out = match t.outcome {
                    AckOutcome::Advanced { through } => Out::Advanced(through.0),
                    AckOutcome::Unchanged { through } => Out::Unchanged(through.map(|s| s.0)),
                    AckOutcome::Unsent { sent_through, .. } => Out::Unsent(sent_through.map(|s| s.0)),
                    AckOutcome::StaleGeneration { current } => Out::Stale(current.0),
                };
                (out, t.changes, model.ack(target, s), stale(off))
            }
            Op::Received(off, s) => {
                let target = g(off);
                let t = core.received(Generation(target), Sequence(s));
                let out = match t.outcome {
                    ReceivedOutcome::Recorded { through, moved } => Out::Recorded(through.0, moved),
                    ReceivedOutcome::Unchanged { through } => Out::Unchanged(through.map(|s| s.0)),
                    ReceivedOutcome::Unsent { sent_through, .. } => Out::Unsent(sent_through.map(|s| s.0)),
                    ReceivedOutcome::StaleGeneration { current } => Out::Stale(current.0),
                };
                (out, t.changes, model.received(target, s), stale(off))
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
                    ReconnectOutcome::Advanced { generation, replayed, dead } => {
                        Out::Reconnected(generation.0, replayed, dead)
                    }
                    ReconnectOutcome::Unchanged => Out::ReconnectUnchanged,
                    ReconnectOutcome::StaleGeneration { current } => Out::Stale(current.0),
                };
                (out, t.changes, model.reconnect(target), target < current)
            }
        };
        let after = observe(&core);
        prop_assert_eq!(&got, &expected, "step {}: outcome differs from the model", step);
        prop_assert_eq!(&after, &observe_model(&model), "step {}: state differs from the model", step);
        prop_assert_eq!(core.isolation(), model.isolation, "step {}: isolation differs from the model", step);
        prop_assert_eq!(core.sent_through().map(|s| s.0), model.sent, "step {}: sent_through differs", step);
        prop_assert_eq!(
            core.can_claim(),
            matches!(model.clone().claim(model.generation), Out::Claimed(..)),
            "step {}: can_claim is not what a claim would do",
            step
        );
        let reported: BTreeSet<Projection> = changes.iter().collect();
        prop_assert_eq!(reported, differing(&before, &after), "step {}: change set is not what changed", step);
        if is_stale || changes.is_empty() {
            prop_assert!(core == before_state, "step {}: a stale or no-change call altered the state", step);
        }
        prop_assert!(changes.is_empty() || !is_stale, "step {}: a stale call reported changes", step);
        check_invariants(&core, &before_state)?;
        check_model_bounds(&model)?;
    }
    Ok(())
}

/// The rules on sends, checked on the model (which keeps the claims per
/// budget that the core does not).
fn check_model_bounds(m: &Model) -> Result<(), TestCaseError> {
    let bound = m.budget + m.replay_limit + 1;
    let live = m.pending.iter().chain(&m.inflight).chain(m.parked.iter().map(|p| &p.rec));
    for r in live.clone().chain(m.exhausted.iter().map(|e| &e.2)) {
        prop_assert!(r.claims <= bound, "#{} claimed {} times in one budget (bound {})", r.sequence, r.claims, bound);
    }
    for r in live {
        prop_assert!(r.failures <= m.budget, "#{} lives with {} failures", r.sequence, r.failures);
        prop_assert!(r.replays <= m.replay_limit, "#{} lives with {} replays", r.sequence, r.replays);
    }
    // A record sent before always fits in the window again: no retry waits
    // for a reconnect.
    for r in m.pending.iter().chain(m.parked.iter().map(|p| &p.rec)) {
        if r.attempt > 0 {
            prop_assert!(r.sequence < m.window_end(), "#{} was sent but lies beyond the window", r.sequence);
        }
    }
    if let Isolation::Probing(p) = m.isolation {
        prop_assert!(m.inflight.iter().any(|r| r.sequence == p.0), "the probe #{} is not in flight", p.0);
    }
    Ok(())
}

fn check_invariants(core: &EgressCore<u32>, before: &EgressCore<u32>) -> Result<(), TestCaseError> {
    prop_assert!(core.next_sequence() >= before.next_sequence(), "sequences went backwards");
    prop_assert!(core.acked_through() >= before.acked_through(), "the watermark regressed");
    prop_assert!(core.received_through() >= before.received_through(), "the receipt watermark regressed");
    prop_assert!(core.acked_through() <= core.received_through(), "acked beyond what was received");
    prop_assert!(core.received_through() <= core.sent_through(), "received beyond what was sent");
    prop_assert!(core.generation() >= before.generation(), "the generation regressed");
    prop_assert!(core.inflight_len() <= core.policy().inflight_limit(), "the window overflowed");
    for e in core.inflight() {
        prop_assert!(e.sequence < core.window_end(), "{} is in flight beyond the window", e.sequence);
    }
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
    // PROPTEST_CASES lowers the count for a quick run (cargo-mutants).
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(10_000),
        ..ProptestConfig::default()
    })]

    #[test]
    fn core_matches_the_reference_model(params in policy(), start in 0u64..3, ops in prop::collection::vec(op(), 1..60)) {
        run(params, start, ops)?;
    }
}
