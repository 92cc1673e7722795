//! Model-based property test of [`Lanes`]: against a reference model that
//! keeps one plain `EgressCore` per lane in a map and decides every release
//! by scanning every lane's head, with no index, no running count and no
//! completion tracker (a set of completed records instead). Each lane's own
//! rules are the core's, which `model.rs` tests against its own model; what
//! this test checks is what `Lanes` adds: release order across lanes, the
//! cap, completions in any order, the lane bound, freeing idle lanes, one
//! generation for all, and that every lane's core ends each step exactly as
//! the model's does.

// Unwraps name what a test expects to exist; a panic is the failure.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroUsize;

use egress_core::{
    AckOutcome, Changes, CompleteOutcome, Delay, EgressCore, FailOutcome, FailureKind, FlushEpoch, Generation,
    JitterSample, LaneKey, LaneKind, Lanes, LanesClaim, LanesPolicy, LanesReconnect, Policy, Projection,
    ReconnectOutcome, ScheduleOutcome, Sequence, Time,
};
use proptest::prelude::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key(u8);

impl LaneKey for Key {
    fn kind(&self) -> LaneKind {
        match self.0 % 4 {
            0 => LaneKind::Serial,
            1 => LaneKind::Strict,
            2 => LaneKind::Unordered(NonZeroUsize::new(2).unwrap()),
            _ => LaneKind::Unordered(NonZeroUsize::new(3).unwrap()),
        }
    }
}

const MAX_LANES: usize = 4;

fn base() -> Policy {
    Policy::builder()
        .retry_budget(2)
        .replay_limit(2)
        .retry_base(Delay(5))
        .retry_ceiling(Delay(20))
        .jitter(0.5)
        .build()
        .unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Enqueue {
        lane: u8,
        after: Option<u64>,
    },
    Claim,
    Complete(usize),
    Ack {
        lane: u8,
        back: u64,
    },
    Fail {
        pick: usize,
        kind: u8,
        jitter: u32,
    },
    Advance(u64),
    RetryNow(usize),
    Requeue(usize),
    Reconnect,
    Release(u64),
    /// A hostile caller: an op naming a sequence its lane never assigned
    /// (or `u64::MAX`), or an old generation; it must be refused and change
    /// nothing.
    Hostile {
        lane: u8,
        which: u8,
        far: bool,
        stale: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, prop::option::weighted(0.2, 1u64..4)).prop_map(|(lane, after)| Op::Enqueue { lane, after }),
        4 => Just(Op::Claim),
        3 => any::<usize>().prop_map(Op::Complete),
        1 => (0u8..6, 0u64..3).prop_map(|(lane, back)| Op::Ack { lane, back }),
        2 => (any::<usize>(), 0u8..4, any::<u32>()).prop_map(|(pick, kind, jitter)| Op::Fail { pick, kind, jitter }),
        2 => (0u64..30).prop_map(Op::Advance),
        1 => any::<usize>().prop_map(Op::RetryNow),
        1 => any::<usize>().prop_map(Op::Requeue),
        1 => Just(Op::Reconnect),
        1 => (1u64..4).prop_map(Op::Release),
        1 => (0u8..6, 0u8..6, any::<bool>(), any::<bool>())
            .prop_map(|(lane, which, far, stale)| Op::Hostile { lane, which, far, stale }),
    ]
}

/// The reference: plain cores, and every question answered by a scan.
struct Model {
    cap: Option<usize>,
    generation: Generation,
    released: FlushEpoch,
    next_ordinal: u64,
    cores: BTreeMap<Key, EgressCore<u32>>,
    /// The ordinal of every record not acknowledged, by lane and sequence.
    ordinals: BTreeMap<(Key, u64), u64>,
    completed: BTreeSet<(Key, u64)>,
}

impl Model {
    fn idle(core: &EgressCore<u32>) -> bool {
        core.pending_len() + core.inflight_len() + core.parked_len() + core.exhausted_len() + core.gated_len() == 0
    }

    fn watermark(core: &EgressCore<u32>) -> u64 {
        core.acked_through().map_or(0, |a| a.0 + 1)
    }

    /// Forgets what the lane acknowledged, and acknowledges completions
    /// that an acknowledgement made contiguous; returns what that changed.
    fn tidy(&mut self, key: Key) -> egress_core::Changes {
        let Some(core) = self.cores.get_mut(&key) else { return egress_core::Changes::NONE };
        let mut next = Self::watermark(core);
        let mut carried = next;
        while self.completed.contains(&(key, carried)) {
            carried += 1;
        }
        let mut changes = egress_core::Changes::NONE;
        if carried > next {
            changes = core.ack(self.generation, Sequence(carried - 1)).changes;
            next = carried;
        }
        self.completed.retain(|(k, s)| *k != key || *s >= next);
        self.ordinals.retain(|(k, s), _| *k != key || *s >= next);
        changes
    }

    fn outstanding(&self) -> usize {
        let inflight: usize = self.cores.values().map(EgressCore::inflight_len).sum();
        inflight - self.completed.len()
    }

    fn inflight(&self) -> Vec<(Key, Sequence)> {
        let mut all = Vec::new();
        for (k, core) in &self.cores {
            all.extend(core.inflight().map(|e| (*k, e.sequence)).filter(|(k, s)| !self.completed.contains(&(*k, s.0))));
        }
        all
    }
}

fn check(lanes: &Lanes<Key, u32>, model: &Model) -> Result<(), TestCaseError> {
    let keys: Vec<Key> = lanes.lanes().map(|(k, _)| *k).collect();
    let model_keys: Vec<Key> = model.cores.keys().copied().collect();
    prop_assert_eq!(keys, model_keys);
    for (k, core) in lanes.lanes() {
        prop_assert!(Some(core) == model.cores.get(k), "lane {:?} differs from the model", k);
    }
    let sum = |f: fn(&EgressCore<u32>) -> usize| model.cores.values().map(f).sum::<usize>();
    prop_assert_eq!(lanes.pending_len(), sum(EgressCore::pending_len));
    prop_assert_eq!(lanes.inflight_len(), sum(EgressCore::inflight_len));
    prop_assert_eq!(lanes.parked_len(), sum(EgressCore::parked_len));
    prop_assert_eq!(lanes.exhausted_len(), sum(EgressCore::exhausted_len));
    prop_assert_eq!(lanes.gated_len(), sum(EgressCore::gated_len));
    prop_assert_eq!(lanes.outstanding(), model.outstanding());
    if let Some(cap) = model.cap {
        prop_assert!(lanes.outstanding() <= cap);
    }
    prop_assert_eq!(lanes.poll_timeout(), model.cores.values().filter_map(EgressCore::poll_timeout).min());
    prop_assert_eq!(lanes.generation(), model.generation);
    for ((k, s), o) in &model.ordinals {
        prop_assert_eq!(lanes.ordinal(k, Sequence(*s)).map(|o| o.0), Some(*o));
    }
    for (k, core) in &model.cores {
        // The lane kinds' windows: one in flight in a serial or strict lane.
        if matches!(k.kind(), LaneKind::Serial | LaneKind::Strict) {
            prop_assert!(core.inflight_len() <= 1);
        }
    }
    Ok(())
}

fn run(ops: Vec<Op>, cap: Option<usize>) -> Result<(), TestCaseError> {
    let mut policy = LanesPolicy::new(base(), MAX_LANES).unwrap();
    if let Some(cap) = cap {
        policy = policy.inflight_cap(NonZeroUsize::new(cap).unwrap());
    }
    let mut lanes: Lanes<Key, u32> = Lanes::new(policy);
    let mut model = Model {
        cap,
        generation: Generation(0),
        released: FlushEpoch(0),
        next_ordinal: 0,
        cores: BTreeMap::new(),
        ordinals: BTreeMap::new(),
        completed: BTreeSet::new(),
    };
    let mut now = 0u64;
    let mut payload = 0u32;
    for op in ops {
        let g = model.generation;
        match op {
            Op::Enqueue { lane, after } => {
                let key = Key(lane);
                payload += 1;
                let before = lanes.clone();
                let t = match after {
                    Some(e) => lanes.enqueue_after(key, payload, FlushEpoch(e)),
                    None => lanes.enqueue(key, payload),
                };
                let exists = model.cores.contains_key(&key);
                // What a freed lane's readers see change: its watermarks
                // read as no lane's.
                let mut freed = Changes::NONE;
                let full = model.cores.len() >= MAX_LANES;
                let first_idle = model.cores.iter().find(|(_, c)| Model::idle(c)).map(|(k, _)| *k);
                prop_assert_eq!(
                    before.next_freed().copied(),
                    first_idle.filter(|_| full),
                    "the lane a new key would free: the first idle one, only with every lane in use"
                );
                if !exists && full {
                    let idle = first_idle;
                    match idle {
                        Some(k) => {
                            let gone = model.cores.remove(&k).expect("found above");
                            freed = Changes::NONE
                                .with_if(Projection::AckedThrough, gone.acked_through().is_some())
                                .with_if(Projection::Received, gone.received_through().is_some());
                        }
                        None => {
                            let refused = t.outcome.expect_err("every lane is busy: refused");
                            prop_assert_eq!((refused.limit, refused.payload), (MAX_LANES, payload));
                            prop_assert!(t.changes.is_empty());
                            prop_assert!(lanes == before, "a refused enqueue changed the state");
                            continue;
                        }
                    }
                }
                let core = model.cores.entry(key).or_insert_with(|| {
                    let mut c = EgressCore::with_generation(key.kind().policy(base()), g);
                    let _ = c.release(model.released);
                    c
                });
                let m = match after {
                    Some(e) => core.enqueue_after(payload, FlushEpoch(e)),
                    None => core.enqueue(payload),
                };
                let e = t.outcome.expect("a lane exists or was made");
                prop_assert_eq!((e.ordinal.0, e.sequence, e.new_lane), (model.next_ordinal, m.outcome, !exists));
                prop_assert_eq!(t.changes, m.changes.union(freed));
                model.ordinals.insert((key, m.outcome.0), model.next_ordinal);
                model.next_ordinal += 1;
            }
            Op::Claim => {
                let t = lanes.claim(g);
                let full = model.cap.is_some_and(|c| model.outstanding() >= c);
                // The scan: the lowest ordinal at the head of a lane that
                // can claim.
                let best = model
                    .cores
                    .iter()
                    .filter(|(_, c)| c.can_claim())
                    .map(|(k, c)| {
                        let head = c.pending().next().expect("can claim: something pending").sequence;
                        (model.ordinals[&(*k, head.0)], *k)
                    })
                    .min();
                let pending: usize = model.cores.values().map(EgressCore::pending_len).sum();
                match (t.outcome, full, best) {
                    (LanesClaim::Full { cap }, true, _) => prop_assert_eq!(Some(cap.get()), model.cap),
                    (LanesClaim::Claimed(got), false, Some((ordinal, key))) => {
                        prop_assert_eq!((got.ordinal.0, *got.lane), (ordinal, key));
                        let core = model.cores.get_mut(&key).unwrap();
                        let egress_core::ClaimOutcome::Claimed(want) = core.claim(g).outcome else {
                            return Err(TestCaseError::fail("the model's lane refused"));
                        };
                        prop_assert_eq!(got.envelope, want);
                    }
                    (LanesClaim::Empty, false, None) => prop_assert_eq!(pending, 0),
                    (LanesClaim::Waiting, false, None) => prop_assert!(pending > 0),
                    (other, full, best) => {
                        return Err(TestCaseError::fail(format!("claim: {other:?}, model full {full} best {best:?}")));
                    }
                }
            }
            Op::Complete(pick) => {
                let inflight = model.inflight();
                let Some(&(key, seq)) = inflight.get(pick % inflight.len().max(1)) else {
                    let t = lanes.complete(g, &Key(0), Sequence(0));
                    prop_assert!(t.changes.is_empty());
                    continue;
                };
                let t = lanes.complete(g, &key, seq);
                model.completed.insert((key, seq.0));
                let before = Model::watermark(&model.cores[&key]);
                let _ = model.tidy(key);
                let after = Model::watermark(&model.cores[&key]);
                if after > before {
                    prop_assert_eq!(t.outcome, CompleteOutcome::Advanced { through: Sequence(after - 1) });
                } else {
                    // Processed out of order: progress, which ends isolation.
                    let _ = model.cores.get_mut(&key).unwrap().progressed(g, seq);
                    prop_assert_eq!(t.outcome, CompleteOutcome::Waiting);
                }
                // A duplicate changes nothing.
                let again = lanes.complete(g, &key, seq);
                prop_assert_eq!(again.outcome, CompleteOutcome::Unchanged);
            }
            Op::Ack { lane, back } => {
                let key = Key(lane);
                let through =
                    model.cores.get(&key).and_then(EgressCore::sent_through).map(|s| s.0.saturating_sub(back));
                let through = Sequence(through.unwrap_or(back));
                let t = lanes.ack(g, &key, through);
                match model.cores.get_mut(&key) {
                    Some(core) => {
                        let m = core.ack(g, through);
                        let carried = model.tidy(key);
                        // The outcome names the watermark reached, carried
                        // completions included, and the changes cover both.
                        let want = match m.outcome {
                            AckOutcome::Advanced { .. } => {
                                AckOutcome::Advanced { through: model.cores[&key].acked_through().expect("advanced") }
                            }
                            other => other,
                        };
                        prop_assert_eq!(t.outcome, want);
                        prop_assert_eq!(t.changes, m.changes.union(carried));
                    }
                    None => prop_assert_eq!(t.outcome, AckOutcome::Unsent { through, sent_through: None }),
                }
            }
            Op::Fail { pick, kind, jitter } => {
                let kind = match kind {
                    0 => FailureKind::Permanent,
                    1 => FailureKind::RetryAfter(Delay(12)),
                    _ => FailureKind::Transient,
                };
                let inflight = model.inflight();
                let Some(&(key, seq)) = inflight.get(pick % inflight.len().max(1)) else { continue };
                let j = JitterSample::from_u32(jitter);
                let t = lanes.fail(g, &key, seq, kind, Time(now), j);
                let m = model.cores.get_mut(&key).unwrap().fail(g, seq, kind, Time(now), j);
                prop_assert_eq!(t.outcome, m.outcome);
                prop_assert_eq!(t.changes, m.changes);
            }
            Op::Advance(by) => {
                now += by;
                let t = lanes.handle_timeout(Time(now));
                let mut want = Vec::new();
                for (k, core) in &mut model.cores {
                    let m = core.handle_timeout(Time(now));
                    if !m.outcome.is_empty() {
                        want.push((*k, m.outcome));
                    }
                }
                prop_assert_eq!(t.outcome, want);
            }
            Op::RetryNow(pick) | Op::Requeue(pick) => {
                let requeue = matches!(op, Op::Requeue(_));
                let mut all = Vec::new();
                for (k, core) in &model.cores {
                    if requeue {
                        all.extend(core.exhausted().map(|e| (*k, e.sequence)));
                    } else {
                        all.extend(core.parked().map(|p| (*k, p.sequence)));
                    }
                }
                let (key, seq) = all.get(pick % all.len().max(1)).copied().unwrap_or((Key(0), Sequence(0)));
                let core = model.cores.get_mut(&key);
                let (t, m) = if requeue {
                    (lanes.requeue(g, &key, seq), core.map(|c| c.requeue(g, seq)))
                } else {
                    (lanes.retry_now(g, &key, seq), core.map(|c| c.retry_now(g, seq)))
                };
                let want = m.map_or(ScheduleOutcome::UnknownSequence { sequence: seq }, |m| m.outcome);
                prop_assert_eq!(t.outcome, want);
            }
            Op::Reconnect => {
                let next = Generation(g.0 + 1);
                let t = lanes.reconnect(next);
                model.generation = next;
                model.completed.clear();
                let (mut want, mut sums) = (Vec::new(), (0, 0));
                for (k, core) in &mut model.cores {
                    let m = core.reconnect(next);
                    if let ReconnectOutcome::Advanced { replayed, dead, .. } = m.outcome {
                        sums = (sums.0 + replayed, sums.1 + dead);
                    }
                    want.push((*k, m.changes));
                }
                let LanesReconnect::Advanced { generation, lanes: got, replayed, dead } = t.outcome else {
                    return Err(TestCaseError::fail("reconnect refused"));
                };
                prop_assert_eq!(generation, next);
                prop_assert_eq!(got, want);
                prop_assert_eq!((replayed, dead), sums);
                // The old generation is fenced everywhere.
                prop_assert!(lanes.claim(g).outcome.refusal().is_some());
                prop_assert!(lanes.reconnect(g).outcome.refusal().is_some());
            }
            Op::Hostile { lane, which, far, stale } => {
                let key = Key(lane);
                let unassigned = model.cores.get(&key).map_or(0, |c| c.next_sequence().0);
                let seq = Sequence(if far { u64::MAX } else { unassigned });
                // Generation 0 is old once a reconnect happened; before
                // that, a stale caller uses a generation never reached.
                let g = if stale { Generation(if g.0 == 0 { 7 } else { 0 }) } else { g };
                let before = lanes.clone();
                let refused = match which {
                    0 => lanes.ack(g, &key, seq).outcome.refusal(),
                    1 => lanes.complete(g, &key, seq).outcome.refusal(),
                    2 => lanes.received(g, &key, seq).outcome.refusal(),
                    3 => lanes
                        .fail(g, &key, seq, FailureKind::Transient, Time(now), JitterSample::ZERO)
                        .outcome
                        .refusal(),
                    4 => lanes.retry_now(g, &key, seq).outcome.refusal(),
                    _ => lanes.requeue(g, &key, seq).outcome.refusal(),
                };
                prop_assert!(refused.is_some(), "op {} on {:?} at {:?} under {:?} was not refused", which, key, seq, g);
                prop_assert!(lanes == before, "a refused op changed the state");
            }
            Op::Release(e) => {
                let t = lanes.release(FlushEpoch(e));
                let mut want = Vec::new();
                if FlushEpoch(e) > model.released {
                    model.released = FlushEpoch(e);
                    for (k, core) in &mut model.cores {
                        let n = core.release(FlushEpoch(e)).outcome;
                        if n > 0 {
                            want.push((*k, n));
                        }
                    }
                }
                prop_assert_eq!(t.outcome, want);
            }
        }
        check(&lanes, &model)?;
    }
    Ok(())
}

proptest! {
    // PROPTEST_CASES lowers the count for a quick run (cargo-mutants).
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(2_000),
        ..ProptestConfig::default()
    })]

    #[test]
    fn lanes_match_the_reference_model(ops in prop::collection::vec(op(), 1..120), cap in prop::option::of(1usize..5)) {
        run(ops, cap)?;
    }
}

#[test]
fn a_stale_generation_is_refused_by_every_transition_and_changes_nothing() {
    let mut lanes: Lanes<Key, u32> = Lanes::new(LanesPolicy::new(base(), MAX_LANES).unwrap());
    lanes.enqueue(Key(0), 1).outcome.unwrap();
    let _ = lanes.reconnect(Generation(1));
    let before = lanes.clone();
    let old = Generation(0);
    let k = Key(0);
    assert!(lanes.claim(old).outcome.refusal().is_some());
    assert!(lanes.ack(old, &k, Sequence(0)).outcome.refusal().is_some());
    assert!(lanes.complete(old, &k, Sequence(0)).outcome.refusal().is_some());
    assert!(lanes.received(old, &k, Sequence(0)).outcome.refusal().is_some());
    let fail = lanes.fail(old, &k, Sequence(0), FailureKind::Transient, Time(0), JitterSample::ZERO);
    assert!(matches!(fail.outcome, FailOutcome::StaleGeneration { current: Generation(1) }));
    assert!(lanes.retry_now(old, &k, Sequence(0)).outcome.refusal().is_some());
    assert!(lanes.requeue(old, &k, Sequence(0)).outcome.refusal().is_some());
    assert!(lanes.reconnect(old).outcome.refusal().is_some());
    assert_eq!(lanes.reconnect(Generation(1)).outcome, LanesReconnect::Unchanged);
    assert!(lanes == before);
}
