//! The journal under crashes: a property test that drives a journaled core
//! and a model of a store through random operations, crashes at any point
//! (dropping whatever was not reported durable, or keeping a write whose
//! report was lost), restores from the store, and checks after every step:
//!
//! 1. no sequence that reached the wire is ever bound to another payload
//!    (R1), and nothing goes out under a generation not stored (R2);
//! 2. no durable record is lost: after a restore every stored record above
//!    the stored watermark is back, alive or dead as stored;
//! 3. restoring what a fully written core stored gives back the same
//!    pending and dead records, sequence and generation;
//! 4. the durability projections change exactly when their flags say;
//! 5. a dead letter whose tombstone was acknowledged reads dead, with its
//!    reason, not acknowledged: in the core that saw the acknowledgement,
//!    and after a restart from a store that stored it.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use egress_core::{
    AdoptOutcome, ClaimOutcome, DeadLetters, DeadMark, DeadReason, EgressCore, Epoch, FailureKind, FlushEpoch,
    Generation, JitterSample, PersistOutcome, Policy, Projection, Ready, RebaseOutcome, RestoreError, Restored,
    RestoredRecord, Sequence, Time,
};
use proptest::prelude::*;

/// A store, as plainly as possible: what a transaction leaves behind.
#[derive(Clone, Debug, Default)]
struct Disk {
    generation: u64,
    next: u64,
    acked: Option<u64>,
    records: BTreeMap<u64, (u32, Option<DeadMark>)>,
    /// The tombstones pruned by an acknowledgement: skipped, by reason.
    skipped: BTreeMap<u64, DeadReason>,
}

impl Disk {
    /// Applies one `Ready` as a store's transaction would; refuses it whole
    /// (`false`) when another writer took its sequences.
    fn apply(&mut self, ready: &Ready, core: &EgressCore<u32>) -> bool {
        let appended: Vec<(Sequence, u32)> = core.unwritten(ready.appends.clone()).map(|(s, p)| (s, *p)).collect();
        assert_eq!(appended.len() as u64, ready.appends.end.0 - ready.appends.start.0, "every append has its payload");
        if !appended.is_empty() && self.next != ready.appends.start.0 {
            return false;
        }
        for (s, p) in appended {
            assert_eq!(s.0, self.next, "appends are contiguous");
            self.records.insert(s.0, (p, None));
            self.next = s.0 + 1;
        }
        if let Some(g) = ready.generation {
            self.generation = self.generation.max(g.0);
        }
        for (s, mark) in &ready.dead {
            if let Some(r) = self.records.get_mut(&s.0) {
                r.1 = *mark;
            }
        }
        if let Some(a) = ready.acked_through {
            let a = self.acked.map_or(a.0, |old| old.max(a.0));
            self.acked = Some(a);
            let kept = self.records.split_off(&(a + 1));
            for (s, (_, mark)) in std::mem::replace(&mut self.records, kept) {
                if let Some(DeadMark { reason, held: false }) = mark {
                    self.skipped.insert(s, reason);
                }
            }
        }
        true
    }

    fn snapshot(&self) -> Restored<u32> {
        Restored {
            generation: Generation(self.generation),
            next_sequence: Sequence(self.next),
            acked_through: self.acked.map(Sequence),
            records: self
                .records
                .iter()
                .map(|(s, (p, d))| RestoredRecord { sequence: Sequence(*s), payload: *p, dead: *d })
                .collect(),
            skipped: self.skipped.iter().map(|(s, r)| (Sequence(*s), *r)).collect(),
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Enqueue,
    /// Enqueue waiting for a flush epoch of the application's state.
    EnqueueAfter(u8),
    /// The application made its state durable through an epoch.
    Release(u8),
    Adopt,
    /// Another writer appends to the store (an application's outbox).
    Outside,
    Claim,
    Ack(u8),
    Fail(bool),
    Reconnect,
    Timeout(u8),
    Requeue,
    /// Write the next `Ready` and report it.
    Persist,
    /// Write it, but fail the report.
    PersistFail,
    /// The process dies: a write in progress lands (`true`) or not.
    Crash(bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Enqueue),
        1 => any::<u8>().prop_map(Op::EnqueueAfter),
        1 => any::<u8>().prop_map(Op::Release),
        1 => Just(Op::Adopt),
        1 => Just(Op::Outside),
        4 => Just(Op::Claim),
        3 => any::<u8>().prop_map(Op::Ack),
        2 => any::<bool>().prop_map(Op::Fail),
        1 => Just(Op::Reconnect),
        1 => any::<u8>().prop_map(Op::Timeout),
        1 => Just(Op::Requeue),
        4 => Just(Op::Persist),
        1 => Just(Op::PersistFail),
        1 => any::<bool>().prop_map(Op::Crash),
    ]
}

/// The durability projections' values, to check the change flags.
fn durable_view(core: &EgressCore<u32>) -> (Option<Sequence>, usize, bool, FlushEpoch, usize) {
    (core.durable_through(), core.unpersisted_len(), core.generation_durable(), core.released(), core.gated_len())
}

fn run(policy: &Policy, ops: &[Op]) {
    let mut disk = Disk::default();
    let mut core = EgressCore::restore(*policy, disk.snapshot()).expect("an empty store restores");
    // What went on the wire, over every incarnation: sequence -> payload.
    let mut wire: BTreeMap<u64, u32> = BTreeMap::new();
    let mut payloads = 0u32;
    let mut writing: Option<Ready> = None;
    let mut now = 0u64;
    // The flush epoch each payload waits for.
    let mut gates: BTreeMap<u32, FlushEpoch> = BTreeMap::new();
    // The epochs released before the last crash stay released: the
    // application's state is durable.
    // The tombstones this core saw acknowledged, or restored as skipped.
    let mut skipped: BTreeMap<u64, DeadReason> = BTreeMap::new();
    for op in ops {
        let (before, error_before) = (durable_view(&core), core.persist_error().cloned());
        let g = core.generation();
        let changes = match op {
            Op::Enqueue => {
                payloads += 1;
                core.enqueue(payloads).changes
            }
            Op::Adopt => {
                // The relay adopts what another writer appended to the
                // store, in order (refused while the core's own appends
                // are not durable).
                let from = core.next_sequence().0;
                let theirs: Vec<(u64, u32)> = disk.records.range(from..).map(|(s, (p, _))| (*s, *p)).collect();
                let Some(&(first, payload)) = theirs.first() else { continue };
                let t = core.adopt(Sequence(first), payload);
                match t.outcome {
                    AdoptOutcome::Adopted { sequence } => assert_eq!(sequence.0, first),
                    AdoptOutcome::Unwritten { .. } => {
                        assert!(t.changes.is_empty());
                        assert!(core.unpersisted_len() > 0);
                    }
                    AdoptOutcome::OutOfOrder { .. } => panic!("the store's next record is the core's next sequence"),
                }
                t.changes
            }
            Op::EnqueueAfter(e) => {
                payloads += 1;
                let after = FlushEpoch(u64::from(*e % 8));
                let t = core.enqueue_after(payloads, after);
                gates.insert(payloads, after);
                t.changes
            }
            Op::Release(e) => {
                let through = FlushEpoch(core.released().0 + u64::from(*e % 3));
                core.release(through).changes
            }
            Op::Outside => {
                payloads += 1;
                disk.records.insert(disk.next, (payloads, None));
                disk.next += 1;
                continue;
            }
            Op::Claim => {
                let durable = core.durable_through();
                let gen_ok = core.generation_durable();
                let released = core.released();
                let t = core.claim(g);
                if let ClaimOutcome::Claimed(e) = t.outcome {
                    let gate = gates.get(e.payload).copied().unwrap_or(FlushEpoch(0));
                    assert!(gate <= released, "claimed before the state it depends on was released");
                    assert!(gen_ok && g.0 <= disk.generation, "claimed under a generation not stored (R2)");
                    assert!(durable.is_some_and(|d| e.sequence <= d), "claimed a record not durable (R1)");
                    let stored = disk.records.get(&e.sequence.0).map(|r| r.0);
                    assert_eq!(stored, Some(*e.payload), "the wire carries what is stored");
                    let bound = *wire.entry(e.sequence.0).or_insert(*e.payload);
                    assert_eq!(bound, *e.payload, "a sequence on the wire bound to another payload");
                }
                t.changes
            }
            Op::Ack(k) => {
                let Some(sent) = core.sent_through() else { continue };
                let base = core.acked_through().map_or(0, |a| a.0 + 1);
                if base > sent.0 {
                    continue;
                }
                let through = base + u64::from(*k) % (sent.0 - base + 1);
                // The tombstones it covers (dead, not held) become skipped.
                let tombstones: Vec<(u64, DeadReason)> = (base..=through)
                    .filter_map(|s| match core.status(Sequence(s)) {
                        Some(egress_core::MessageStatus::Dead(r)) if core.exhausted().all(|e| e.sequence.0 != s) => {
                            Some((s, r))
                        }
                        _ => None,
                    })
                    .collect();
                let t = core.ack(g, Sequence(through));
                skipped.extend(tombstones);
                t.changes
            }
            Op::Fail(permanent) => {
                let Some(s) = core.inflight().next().map(|e| e.sequence) else { continue };
                let kind = if *permanent { FailureKind::Permanent } else { FailureKind::Transient };
                core.fail(g, s, kind, Time(now), JitterSample::ZERO).changes
            }
            Op::Reconnect => core.reconnect(Generation(g.0 + 1)).changes,
            Op::Timeout(d) => {
                now += u64::from(*d);
                core.handle_timeout(Time(now)).changes
            }
            Op::Requeue => {
                let Some(s) = core.exhausted().next().map(|e| e.sequence) else { continue };
                core.requeue(g, s).changes
            }
            Op::Persist | Op::PersistFail => {
                let ready = match writing.take() {
                    Some(r) => r,
                    None => match core.poll_ready() {
                        Some(r) => r,
                        None => continue,
                    },
                };
                assert!(core.poll_ready().is_none(), "one Ready at a time");
                if matches!(op, Op::Persist) && !disk.apply(&ready, &core) {
                    // Refused: the other writer's records are taken, and
                    // the core's unwritten ones move behind them.
                    let failed = core.persist_failed(ready.epoch, "conflict").changes;
                    let from = core.durable_through().map_or(0, |d| d.0 + 1);
                    let theirs: Vec<(Sequence, u32)> =
                        disk.records.range(from..).map(|(s, (p, _))| (Sequence(*s), *p)).collect();
                    let before_next = core.next_sequence();
                    let t = core.rebase(theirs.clone());
                    assert!(matches!(t.outcome, RebaseOutcome::Rebased { .. }), "{:?}", t.outcome);
                    assert_eq!(core.next_sequence().0, before_next.0 + theirs.len() as u64);
                    assert_eq!(core.durable_through().map(|d| d.0 + 1), Some(disk.next));
                    failed.union(t.changes)
                } else if matches!(op, Op::Persist) {
                    let t = core.persisted(ready.epoch);
                    assert!(matches!(t.outcome, PersistOutcome::Recorded { .. }));
                    assert!(matches!(core.persisted(ready.epoch).outcome, PersistOutcome::UnknownEpoch { .. }));
                    t.changes
                } else {
                    let t = core.persist_failed(ready.epoch, "disk full");
                    assert!(matches!(t.outcome, PersistOutcome::Recorded { .. }));
                    assert!(core.persist_error().is_some());
                    t.changes
                }
            }
            Op::Crash(lands) => {
                // A write in progress may or may not have committed.
                if let Some(r) = writing.take().or_else(|| core.poll_ready()).filter(|_| *lands) {
                    let _ = disk.apply(&r, &core);
                }
                // Nothing stored waits for state the application had not
                // released.
                for (p, _) in disk.records.values() {
                    assert!(
                        gates.get(p).is_none_or(|g| *g <= core.released()),
                        "a stored record's state was not durable"
                    );
                }
                let restored = EgressCore::restore(*policy, disk.snapshot()).expect("the store restores");
                // Nothing durable is lost.
                let live: Vec<(u64, u32)> = restored.pending().map(|e| (e.sequence.0, *e.payload)).collect();
                let held: Vec<(u64, u32)> = restored.exhausted().map(|e| (e.sequence.0, *e.payload)).collect();
                let mut all: Vec<(u64, u32)> = live.iter().chain(&held).copied().collect();
                all.sort_unstable();
                let stored: Vec<(u64, u32)> = disk.records.iter().map(|(s, (p, _))| (*s, *p)).collect();
                assert_eq!(all, stored, "a restore brings back every stored record");
                let released = core.released();
                core = restored;
                // What the store remembers as skipped, and nothing else.
                skipped.clone_from(&disk.skipped);
                assert!(core.generation_durable() && core.unpersisted_len() == 0);
                // The application announces what of its state is durable.
                let _ = core.release(released);
                continue;
            }
        };
        // Writes handed out by other ops stay in progress until an op
        // persists, fails or crashes them.
        if writing.is_none() {
            writing = core.poll_ready();
        }
        let after = durable_view(&core);
        assert_eq!(changes.contains(Projection::Durable), before != after, "durable flag after {op:?}");
        assert_eq!(
            changes.contains(Projection::PersistError),
            error_before.as_ref() != core.persist_error(),
            "persist_error flag after {op:?}"
        );
        assert!(core.durable_through().is_none_or(|d| d < core.next_sequence()));
        check_statuses(&core, &skipped);
    }
    // Released and written in full, a restore is the identity on what
    // survives a crash.
    let _ = core.release(FlushEpoch(u64::MAX));
    loop {
        let ready = match writing.take() {
            Some(r) => r,
            None => match core.poll_ready() {
                Some(r) => r,
                None => break,
            },
        };
        if disk.apply(&ready, &core) {
            let _ = core.persisted(ready.epoch);
        } else {
            let _ = core.persist_failed(ready.epoch, "conflict");
            let from = core.durable_through().map_or(0, |d| d.0 + 1);
            let theirs = disk.records.range(from..).map(|(s, (p, _))| (Sequence(*s), *p)).collect();
            let _ = core.rebase(theirs);
        }
    }
    // And what other writers appended is adopted.
    let from = core.next_sequence().0;
    for (s, (p, _)) in disk.records.range(from..) {
        assert!(matches!(core.adopt(Sequence(*s), *p).outcome, AdoptOutcome::Adopted { .. }));
    }
    let restored = EgressCore::restore(*policy, disk.snapshot()).expect("the store restores");
    let view = |c: &EgressCore<u32>| {
        let mut live: Vec<(u64, u32, bool)> = c
            .pending()
            .chain(c.inflight())
            .chain(c.parked().map(|p| egress_core::Envelope {
                generation: c.generation(),
                sequence: p.sequence,
                attempt: p.attempt,
                payload: p.payload,
                dead: p.dead,
            }))
            .map(|e| (e.sequence.0, *e.payload, e.dead.is_some()))
            .collect();
        live.sort_unstable();
        let held: Vec<(u64, u32)> = c.exhausted().map(|e| (e.sequence.0, *e.payload)).collect();
        (live, held, c.next_sequence(), c.generation())
    };
    assert_eq!(view(&restored), view(&core), "restore after a full write gives the same state back");
}

fn policy() -> impl Strategy<Value = Policy> {
    (1usize..5, 0u32..3, 0u32..3, any::<bool>()).prop_map(|(limit, budget, replays, hold)| {
        Policy::builder()
            .inflight_limit(limit)
            .retry_budget(budget)
            .replay_limit(replays)
            .dead_letters(if hold { DeadLetters::Hold } else { DeadLetters::Skip })
            .build()
            .expect("a valid policy")
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(2_000),
        failure_persistence: None,
        rng_algorithm: proptest::test_runner::RngAlgorithm::ChaCha,
        ..ProptestConfig::default()
    })]
    #[test]
    fn crashes_at_any_point_lose_nothing_and_rebind_nothing(policy in policy(), ops in prop::collection::vec(op(), 0..120)) {
        run(&policy, &ops);
    }
}

#[test]
fn a_record_is_claimed_only_once_durable_and_a_generation_used_only_once_stored() {
    let mut core: EgressCore<&str> = EgressCore::restore(Policy::default(), Restored::empty()).unwrap();
    let g = core.generation();
    let t = core.enqueue("a");
    assert!(t.changes.contains(Projection::Durable));
    assert_eq!((core.unpersisted_len(), core.durable_through()), (1, None));
    assert_eq!(core.claim(g).outcome, ClaimOutcome::Unpersisted { sequence: Sequence(0) });
    assert!(!core.can_claim());
    let ready = core.poll_ready().unwrap();
    assert_eq!((ready.appends.clone(), ready.must_sync), (Sequence(0)..Sequence(1), true));
    assert_eq!(core.unwritten(ready.appends.clone()).map(|(_, p)| *p).collect::<Vec<_>>(), ["a"]);
    // Still being written: not claimable, and the next enqueue waits for
    // the next Ready.
    let _ = core.enqueue("b");
    assert!(core.poll_ready().is_none());
    assert_eq!(core.claim(g).outcome, ClaimOutcome::Unpersisted { sequence: Sequence(0) });
    let t = core.persisted(ready.epoch);
    assert_eq!(t.outcome, PersistOutcome::Recorded { durable_through: Some(Sequence(0)) });
    assert_eq!(t.changes.iter().collect::<Vec<_>>(), [Projection::Durable]);
    assert!(core.can_claim());
    assert!(matches!(core.claim(g).outcome, ClaimOutcome::Claimed(e) if e.sequence == Sequence(0)));
    assert_eq!(core.claim(g).outcome, ClaimOutcome::Unpersisted { sequence: Sequence(1) });

    // A new generation goes out only once stored.
    let t = core.reconnect(Generation(1));
    assert!(t.changes.contains(Projection::Durable) && !core.generation_durable());
    let g = Generation(1);
    assert_eq!(core.claim(g).outcome, ClaimOutcome::GenerationUnpersisted { generation: g });
    // A second reconnect before the write changes no durability.
    assert!(!core.reconnect(Generation(2)).changes.contains(Projection::Durable));
    let g = Generation(2);
    let ready = core.poll_ready().unwrap();
    assert_eq!((ready.generation, ready.appends.clone()), (Some(g), Sequence(1)..Sequence(2)));
    let _ = core.persisted(ready.epoch);
    assert!(core.generation_durable());
    assert!(matches!(core.claim(g).outcome, ClaimOutcome::Claimed(e) if e.sequence == Sequence(0)));
}

#[test]
fn a_failed_write_is_shown_counts_for_nothing_and_is_written_again() {
    let mut core: EgressCore<&str> = EgressCore::restore(Policy::default(), Restored::empty()).unwrap();
    let _ = core.enqueue("a");
    let first = core.poll_ready().unwrap();
    let t = core.persist_failed(first.epoch, "disk I/O error");
    assert_eq!(t.changes.iter().collect::<Vec<_>>(), [Projection::PersistError]);
    assert_eq!(core.persist_error().map(|e| (e.epoch, e.reason.as_str())), Some((first.epoch, "disk I/O error")));
    assert_eq!((core.durable_through(), core.unpersisted_len()), (None, 1));
    // The same failure again, for the next epoch: the error shown names it.
    let again = core.poll_ready().unwrap();
    assert_eq!(again.appends, first.appends);
    assert_ne!(again.epoch, first.epoch);
    assert_eq!(
        core.persist_failed(again.epoch, "disk I/O error").changes.iter().collect::<Vec<_>>(),
        [Projection::PersistError]
    );
    assert_eq!(core.persist_error().map(|e| e.epoch), Some(again.epoch));
    // A report of an epoch not being written is refused.
    let third = core.poll_ready().unwrap();
    assert_eq!(core.persisted(Epoch(99)).outcome, PersistOutcome::UnknownEpoch { epoch: Epoch(99) });
    assert_eq!(core.persisted(first.epoch).changes, egress_core::Changes::NONE);
    let t = core.persisted(third.epoch);
    assert!(t.changes.contains(Projection::PersistError) && t.changes.contains(Projection::Durable));
    assert!(core.persist_error().is_none());
}

#[test]
fn acks_and_dead_letters_are_written_lazily_and_only_once() {
    let policy = Policy::builder().dead_letters(DeadLetters::Hold).build().unwrap();
    let mut core: EgressCore<&str> = EgressCore::restore(policy, Restored::empty()).unwrap();
    let g = core.generation();
    let _ = core.enqueue_all(["a", "b"]);
    let r = core.poll_ready().unwrap();
    let _ = core.persisted(r.epoch);
    let _ = core.claim(g);
    let _ = core.claim(g);
    let _ = core.ack(g, Sequence(0));
    let _ = core.fail(g, Sequence(1), FailureKind::Permanent, Time(0), JitterSample::ZERO);
    let r = core.poll_ready().unwrap();
    let held = DeadMark { reason: egress_core::DeadReason::Permanent, held: true };
    assert_eq!(
        (r.acked_through, r.dead.clone(), r.must_sync),
        (Some(Sequence(0)), vec![(Sequence(1), Some(held))], false)
    );
    assert!(core.persisted(r.epoch).changes.is_empty(), "nothing observable became durable");
    assert!(core.poll_ready().is_none(), "written once");
    let _ = core.requeue(g, Sequence(1));
    assert_eq!(core.poll_ready().unwrap().dead, vec![(Sequence(1), None)]);
}

#[test]
fn restore_refuses_a_store_that_breaks_its_rules() {
    let rec = |s: u64| RestoredRecord { sequence: Sequence(s), payload: (), dead: None };
    let snap = |acked: Option<u64>, next: u64, records: Vec<RestoredRecord<()>>| Restored {
        generation: Generation(3),
        next_sequence: Sequence(next),
        acked_through: acked.map(Sequence),
        records,
        skipped: vec![],
    };
    let restore = |s| EgressCore::restore(Policy::default(), s).map(|_| ());
    assert_eq!(
        restore(snap(None, 3, vec![rec(0), rec(2)])),
        Err(RestoreError::Gap { expected: Sequence(1), found: Some(Sequence(2)) })
    );
    assert_eq!(
        restore(snap(None, 3, vec![rec(0), rec(1)])),
        Err(RestoreError::Gap { expected: Sequence(2), found: None })
    );
    assert_eq!(
        restore(snap(Some(1), 3, vec![rec(1), rec(2)])),
        Err(RestoreError::OutOfRange { sequence: Sequence(1) })
    );
    assert_eq!(restore(snap(None, 1, vec![rec(0), rec(1)])), Err(RestoreError::OutOfRange { sequence: Sequence(1) }));
    assert_eq!(
        restore(snap(Some(3), 3, vec![])),
        Err(RestoreError::AckedBeyondNext { acked_through: Sequence(3), next_sequence: Sequence(3) })
    );
    // The sequence space: up to i64::MAX, and not one above (an enqueue at
    // u64::MAX would have nowhere to go).
    let top = i64::MAX.unsigned_abs();
    let mut core = EgressCore::restore(Policy::default(), snap(Some(top - 1), top, vec![])).expect("at the bound");
    assert_eq!(core.enqueue(()).outcome, Sequence(top));
    for next in [top + 1, u64::MAX] {
        assert_eq!(
            restore(snap(Some(next - 1), next, vec![])),
            Err(RestoreError::SequenceSpace { next_sequence: Sequence(next) })
        );
    }
    // What the restore found, as a UI shows it after a restart.
    let tomb = |s: u64, held: bool| RestoredRecord {
        sequence: Sequence(s),
        payload: (),
        dead: Some(DeadMark { reason: egress_core::DeadReason::Retries, held }),
    };
    let records = vec![rec(5), tomb(6, false), tomb(7, false), tomb(8, true)];
    let found = EgressCore::restore(Policy::default(), snap(Some(4), 9, records)).unwrap().recovered().unwrap();
    assert_eq!(
        (found.generation, found.next_sequence, found.acked_through, found.pending, found.tombstones, found.held),
        (Generation(3), Sequence(9), Some(Sequence(4)), 3, 2, 1)
    );
    assert_eq!(EgressCore::<()>::new(Policy::default()).recovered(), None, "nothing restored");
    let core = EgressCore::restore(Policy::default(), snap(Some(4), 7, vec![rec(5), rec(6)])).unwrap();
    assert_eq!(
        (core.sent_through(), core.acked_through(), core.pending_len()),
        (Some(Sequence(6)), Some(Sequence(4)), 2)
    );
    assert_eq!(core.generation(), Generation(3));
}

#[test]
fn without_a_journal_nothing_of_durability_changes_or_gates() {
    let mut core: EgressCore<&str> = EgressCore::new(Policy::default());
    assert!(!core.is_journaled());
    assert!(!core.enqueue("a").changes.contains(Projection::Durable));
    assert!(!core.reconnect(Generation(1)).changes.contains(Projection::Durable));
    assert!(core.poll_ready().is_none());
    assert_eq!((core.durable_through(), core.unpersisted_len(), core.generation_durable()), (None, 0, true));
    assert!(matches!(core.claim(Generation(1)).outcome, ClaimOutcome::Claimed(_)));
    assert!(EgressCore::<&str>::restore(Policy::default(), Restored::empty()).unwrap().is_journaled());
}

/// Every message below `next_sequence` has a status, and it agrees with
/// where the record is.
fn check_statuses(core: &EgressCore<u32>, skipped: &BTreeMap<u64, DeadReason>) {
    use egress_core::MessageStatus as M;
    let next = core.next_sequence().0;
    // Journaled, a sequence not yet taken may be in the store already.
    let beyond = core.is_journaled().then_some(M::Saving);
    assert_eq!((core.status(Sequence(next)), core.status(Sequence(u64::MAX))), (beyond, beyond));
    let durable = core.durable_through().map_or(0, |d| d.0 + 1);
    for e in core.pending() {
        let expected = match e.dead {
            Some(r) => M::Dead(r),
            None if core.is_journaled() && e.sequence.0 >= durable => M::Saving,
            None => M::Queued,
        };
        assert_eq!(core.status(e.sequence), Some(expected));
    }
    for e in core.inflight() {
        let held = core.received_through().is_some_and(|r| e.sequence <= r);
        let expected = e.dead.map_or(if held { M::Received } else { M::Sending }, M::Dead);
        assert_eq!(core.status(e.sequence), Some(expected));
    }
    for p in core.parked() {
        assert_eq!(core.status(p.sequence), Some(p.dead.map_or(M::Retrying, M::Dead)));
    }
    for e in core.exhausted() {
        assert!(matches!(core.status(e.sequence), Some(M::Dead(_))));
    }
    if let Some(a) = core.acked_through() {
        for s in 0..=a.0 {
            let expected = skipped.get(&s).map_or(M::Acknowledged, |r| M::Dead(*r));
            assert_eq!(core.status(Sequence(s)), Some(expected), "acknowledged {s}");
        }
    }
    let listed = core.pending_len() + core.inflight_len() + core.parked_len() + core.exhausted_len();
    let acked = core.acked_through().map_or(0, |a| a.0 + 1);
    assert_eq!(listed as u64, next - acked, "every message below next_sequence is somewhere");
}

#[test]
fn a_record_waits_for_the_flush_epoch_of_the_state_it_depends_on() {
    // Without a journal: the claim waits, in order.
    let mut core: EgressCore<&str> = EgressCore::new(Policy::default());
    let g = core.generation();
    let t = core.enqueue_after("reply", FlushEpoch(2));
    assert!(t.changes.contains(Projection::Durable));
    let _ = core.enqueue("after it");
    assert_eq!(core.claim(g).outcome, ClaimOutcome::Gated { sequence: Sequence(0), epoch: FlushEpoch(2) });
    assert_eq!(core.status(Sequence(0)), Some(egress_core::MessageStatus::Saving));
    let t = core.release(FlushEpoch(1));
    assert_eq!((t.outcome, t.changes.contains(Projection::Durable)), (0, true));
    assert!(matches!(core.claim(g).outcome, ClaimOutcome::Gated { .. }));
    assert!(core.release(FlushEpoch(1)).changes.is_empty(), "not above what was released");
    assert_eq!(core.release(FlushEpoch(2)).outcome, 1);
    assert!(matches!(core.claim(g).outcome, ClaimOutcome::Claimed(e) if *e.payload == "reply"));
    assert!(matches!(core.claim(g).outcome, ClaimOutcome::Claimed(e) if *e.payload == "after it"));
    // Already released: no wait.
    assert!(!core.enqueue_after("late", FlushEpoch(1)).changes.contains(Projection::Durable));
    assert_eq!(core.gated_len(), 0);

    // With a journal: not even written until released.
    let mut core: EgressCore<&str> = EgressCore::restore(Policy::default(), Restored::empty()).unwrap();
    let _ = core.enqueue("a");
    let _ = core.enqueue_after("b", FlushEpoch(1));
    let _ = core.enqueue("c");
    let ready = core.poll_ready().unwrap();
    assert_eq!(ready.appends, Sequence(0)..Sequence(1), "written up to the gate");
    let _ = core.persisted(ready.epoch);
    assert!(core.poll_ready().is_none());
    let _ = core.release(FlushEpoch(1));
    assert_eq!(core.poll_ready().unwrap().appends, Sequence(1)..Sequence(3));
}

#[test]
fn the_resume_point_is_the_stored_acknowledgement_not_the_known_one() {
    let mut core: EgressCore<&str> = EgressCore::restore(Policy::default(), Restored::empty()).unwrap();
    let g = core.generation();
    let _ = core.enqueue("a");
    let _ = core.enqueue("b");
    let ready = core.poll_ready().unwrap();
    let _ = core.persisted(ready.epoch);
    assert!(matches!(core.claim(g).outcome, ClaimOutcome::Claimed(_)));
    assert!(matches!(core.claim(g).outcome, ClaimOutcome::Claimed(_)));
    let _ = core.ack(g, Sequence(1));
    // Known, not stored: a crash now resumes from 0.
    assert_eq!((core.acked_through(), core.resume_from()), (Some(Sequence(1)), Sequence(0)));
    let ready = core.poll_ready().unwrap();
    assert_eq!(ready.acked_through, Some(Sequence(1)));
    assert_eq!(core.resume_from(), Sequence(0), "written, not yet reported stored");
    let t = core.persist_failed(ready.epoch, "disk full");
    assert!(!t.changes.is_empty());
    assert_eq!(core.resume_from(), Sequence(0), "a failed write stores nothing");
    let ready = core.poll_ready().unwrap();
    let _ = core.persisted(ready.epoch);
    assert_eq!(core.resume_from(), Sequence(2));
    // Restored from what was stored, it resumes from there; a core without
    // a journal resumes from what it knows.
    let restored: EgressCore<&str> = EgressCore::restore(
        Policy::default(),
        Restored { acked_through: Some(Sequence(1)), next_sequence: Sequence(2), ..Restored::empty() },
    )
    .unwrap();
    assert_eq!(restored.resume_from(), Sequence(2));
    let mut plain: EgressCore<&str> = EgressCore::new(Policy::default());
    assert_eq!(plain.resume_from(), Sequence(0));
    let _ = plain.enqueue("a");
    let g = plain.generation();
    let _ = plain.claim(g);
    let _ = plain.ack(g, Sequence(0));
    assert_eq!(plain.resume_from(), Sequence(1));
}

#[test]
fn a_skipped_dead_letter_reads_dead_for_the_newest_skipped_memory_of_them() {
    use egress_core::{MessageStatus as M, SKIPPED_MEMORY};
    let n = SKIPPED_MEMORY as u64 + 2;
    let policy = Policy::builder().inflight_limit(n as usize).build().unwrap();
    let mut core: EgressCore<u64> = EgressCore::new(policy);
    let g = core.generation();
    for i in 0..n {
        let _ = core.enqueue(i);
    }
    for _ in 0..n {
        assert!(matches!(core.claim(g).outcome, ClaimOutcome::Claimed(_)));
    }
    // Every record but the last refused for good: tombstones, sent again.
    for s in 0..n - 1 {
        let _ = core.fail(g, Sequence(s), FailureKind::Permanent, Time(0), JitterSample::ZERO);
    }
    while matches!(core.claim(g).outcome, ClaimOutcome::Claimed(_)) {}
    assert_eq!(core.status(Sequence(0)), Some(M::Dead(egress_core::DeadReason::Permanent)));
    // The receiver skips them all and delivers the last.
    let t = core.ack(g, Sequence(n - 1));
    assert!(t.changes.contains(Projection::AckedThrough) && !t.changes.contains(Projection::Pending));
    assert_eq!(core.status(Sequence(n - 1)), Some(M::Acknowledged), "delivered");
    assert_eq!(core.status(Sequence(n - 2)), Some(M::Dead(egress_core::DeadReason::Permanent)), "skipped");
    assert_eq!(core.status(Sequence(1)), Some(M::Dead(egress_core::DeadReason::Permanent)), "the oldest remembered");
    assert_eq!(core.status(Sequence(0)), Some(M::Acknowledged), "past the memory: forgotten");
}

#[test]
fn restore_refuses_skipped_dead_letters_above_the_watermark_or_out_of_order() {
    let snap = |acked: Option<u64>, skipped: &[u64]| Restored::<()> {
        generation: Generation(1),
        next_sequence: Sequence(10),
        acked_through: acked.map(Sequence),
        records: (acked.map_or(0, |a| a + 1)..10)
            .map(|s| RestoredRecord { sequence: Sequence(s), payload: (), dead: None })
            .collect(),
        skipped: skipped.iter().map(|s| (Sequence(*s), DeadReason::Retries)).collect(),
    };
    let restore = |s| EgressCore::restore(Policy::default(), s).map(|c| c.status(Sequence(3)));
    assert_eq!(restore(snap(Some(5), &[1, 3, 5])), Ok(Some(egress_core::MessageStatus::Dead(DeadReason::Retries))));
    assert_eq!(restore(snap(Some(5), &[1, 4])), Ok(Some(egress_core::MessageStatus::Acknowledged)));
    assert_eq!(restore(snap(Some(5), &[1, 6])), Err(RestoreError::OutOfRange { sequence: Sequence(6) }));
    assert_eq!(restore(snap(Some(5), &[3, 3])), Err(RestoreError::OutOfRange { sequence: Sequence(3) }));
    assert_eq!(restore(snap(Some(5), &[4, 3])), Err(RestoreError::OutOfRange { sequence: Sequence(4) }));
    assert_eq!(restore(snap(None, &[0])), Err(RestoreError::OutOfRange { sequence: Sequence(0) }));
}

#[test]
fn a_tombstone_acknowledged_while_parked_or_behind_a_higher_record_in_the_window_reads_dead() {
    use egress_core::MessageStatus as M;
    let dead = Some(M::Dead(DeadReason::Permanent));
    // Parked: the tombstone's own send failed, and it waits for its
    // backoff when an acknowledgement covers it.
    let mut core: EgressCore<u32> = EgressCore::new(Policy::default());
    let g = core.generation();
    let _ = core.enqueue(0);
    let _ = core.enqueue(1);
    assert!(matches!(core.claim(g).outcome, ClaimOutcome::Claimed(_)));
    assert!(matches!(core.claim(g).outcome, ClaimOutcome::Claimed(_)));
    let _ = core.fail(g, Sequence(0), FailureKind::Permanent, Time(0), JitterSample::ZERO);
    assert!(matches!(core.claim(g).outcome, ClaimOutcome::Claimed(e) if e.dead.is_some()));
    let _ = core.fail(g, Sequence(0), FailureKind::Transient, Time(0), JitterSample::ZERO);
    assert_eq!(
        core.parked().map(|p| (p.sequence, p.dead)).collect::<Vec<_>>(),
        [(Sequence(0), Some(DeadReason::Permanent))]
    );
    let _ = core.ack(g, Sequence(1));
    assert_eq!(core.status(Sequence(0)), dead, "parked, then skipped");
    assert_eq!(core.status(Sequence(1)), Some(M::Acknowledged));

    // In the window behind a higher record: claimed again after 3, the
    // window's claim order is 1, 2, 3, 0; an acknowledgement through 2
    // retires the tombstone past 3.
    let mut core: EgressCore<u32> = EgressCore::new(Policy::default());
    let g = core.generation();
    for i in 0..4 {
        let _ = core.enqueue(i);
    }
    assert!(matches!(core.claim(g).outcome, ClaimOutcome::Claimed(_)));
    let _ = core.fail(g, Sequence(0), FailureKind::Permanent, Time(0), JitterSample::ZERO);
    let order: Vec<u64> = std::iter::from_fn(|| match core.claim(g).outcome {
        ClaimOutcome::Claimed(e) => Some(e.sequence.0),
        _ => None,
    })
    .collect();
    assert_eq!(order, [0, 1, 2, 3], "the tombstone goes first: pending is in sequence order");
    // Claim order puts it first; make it last: fail 0 again, after 1..3
    // are out, and claim it behind them.
    let _ = core.fail(g, Sequence(0), FailureKind::Transient, Time(0), JitterSample::ZERO);
    let _ = core.retry_now(g, Sequence(0));
    assert!(matches!(core.claim(g).outcome, ClaimOutcome::Claimed(e) if e.sequence == Sequence(0)));
    assert_eq!(core.inflight().map(|e| e.sequence.0).collect::<Vec<_>>(), [1, 2, 3, 0]);
    let _ = core.ack(g, Sequence(2));
    assert_eq!(core.status(Sequence(0)), dead, "behind 3 in the window, still found");
    assert_eq!(core.status(Sequence(2)), Some(M::Acknowledged));
}

#[test]
fn every_status_has_a_short_label_a_ui_can_show() {
    use egress_core::{DeadReason, MessageStatus as M};
    let labels: Vec<String> = [
        M::Saving,
        M::Queued,
        M::Sending,
        M::Received,
        M::Retrying,
        M::Dead(DeadReason::Permanent),
        M::Dead(DeadReason::Retries),
        M::Acknowledged,
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    assert_eq!(
        labels,
        [
            "saving",
            "queued",
            "sending",
            "received",
            "retrying",
            "failed: refused permanently",
            "failed: retry budget spent",
            "delivered"
        ]
    );
}
