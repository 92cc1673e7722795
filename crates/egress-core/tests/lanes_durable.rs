//! Durable lanes in the pure core: what `Lanes::poll_ready` hands a store,
//! what `persisted` and `persist_failed` do with it, and what
//! `Lanes::restore` rebuilds. The store here is a map written exactly as
//! `LanesReady` says (the SQLite and PostgreSQL stores are tested against
//! the same rules in egress-store).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::num::NonZeroUsize;

use egress_core::{
    Generation, LaneKey, LaneKind, Lanes, LanesClaim, LanesPersisted, LanesPolicy, LanesReady, LanesRestoreError,
    Ordinal, Policy, Restored, RestoredLane, RestoredLanes, RestoredRecord, Sequence,
};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Lane {
    Room(&'static str),
    AccountData,
    Other,
}

impl LaneKey for Lane {
    fn kind(&self) -> LaneKind {
        match self {
            Lane::Room(_) => LaneKind::Serial,
            Lane::AccountData => LaneKind::Strict,
            Lane::Other => LaneKind::Unordered(NonZeroUsize::new(4).unwrap()),
        }
    }
}

fn policy(max_lanes: usize) -> LanesPolicy {
    LanesPolicy::new(Policy::default(), max_lanes).unwrap()
}

/// A lane's stream as a store keeps it.
#[derive(Clone, Debug, Default)]
struct Stream {
    next: u64,
    acked: Option<u64>,
    /// seq -> (ordinal, payload)
    records: BTreeMap<u64, (Ordinal, String)>,
}

/// A store kept exactly as `LanesReady` says.
#[derive(Clone, Debug, Default)]
struct Store {
    generation: Generation,
    next_ordinal: Ordinal,
    streams: BTreeMap<Lane, Stream>,
}

impl Store {
    fn apply(&mut self, lanes: &Lanes<Lane, String>, ready: &LanesReady<Lane>) {
        for key in &ready.forget {
            self.streams.remove(key);
        }
        for part in &ready.lanes {
            let core = lanes.lane(&part.lane).expect("a lane being written exists");
            let stream = self.streams.entry(part.lane.clone()).or_default();
            assert_eq!(stream.next, part.ready.appends.start.0, "appends continue the stored counter");
            let payloads: Vec<_> = core.unwritten(part.ready.appends.clone()).map(|(s, p)| (s, p.clone())).collect();
            assert_eq!(payloads.len(), part.ordinals.len());
            for ((sequence, payload), ordinal) in payloads.into_iter().zip(&part.ordinals) {
                stream.records.insert(sequence.0, (*ordinal, payload));
            }
            stream.next = part.ready.appends.end.0;
            if let Some(a) = part.ready.acked_through {
                stream.acked = stream.acked.max(Some(a.0));
                stream.records.retain(|s, _| *s > a.0);
            }
        }
        self.next_ordinal = self.next_ordinal.max(ready.next_ordinal);
        if let Some(g) = ready.generation {
            self.generation = self.generation.max(g);
        }
    }

    fn restored(&self) -> RestoredLanes<Lane, String> {
        RestoredLanes {
            generation: self.generation,
            next_ordinal: self.next_ordinal,
            lanes: self
                .streams
                .iter()
                .map(|(key, s)| RestoredLane {
                    lane: key.clone(),
                    restored: Restored {
                        generation: Generation(0),
                        next_sequence: Sequence(s.next),
                        acked_through: s.acked.map(Sequence),
                        records: s
                            .records
                            .iter()
                            .map(|(seq, (_, p))| RestoredRecord {
                                sequence: Sequence(*seq),
                                payload: p.clone(),
                                dead: None,
                            })
                            .collect(),
                        skipped: Vec::new(),
                    },
                    ordinals: s.records.values().map(|(o, _)| *o).collect(),
                })
                .collect(),
        }
    }

    /// Writes everything the lanes have to write.
    fn flush(&mut self, lanes: &mut Lanes<Lane, String>) {
        for _ in 0..16 {
            let Some(ready) = lanes.poll_ready() else { return };
            self.apply(lanes, &ready);
            assert!(matches!(lanes.persisted(ready.epoch).outcome, LanesPersisted::Recorded { .. }));
        }
        panic!("the journal still has something to write after 16 epochs");
    }
}

fn claim_all(lanes: &mut Lanes<Lane, String>) -> Vec<(Lane, Sequence, String)> {
    let g = lanes.generation();
    let mut out = Vec::new();
    while let LanesClaim::Claimed(e) = lanes.claim(g).outcome {
        out.push((e.lane.clone(), e.envelope.sequence, e.envelope.payload.clone()));
    }
    out
}

fn fresh(max_lanes: usize) -> Lanes<Lane, String> {
    Lanes::restore(policy(max_lanes), RestoredLanes::empty()).expect("nothing restores")
}

#[test]
fn a_record_is_claimable_once_its_lanes_epoch_is_persisted() {
    let mut lanes = fresh(8);
    assert!(lanes.is_journaled());
    lanes.enqueue(Lane::Room("a"), "a0".to_owned()).outcome.unwrap();
    lanes.enqueue(Lane::Other, "o0".to_owned()).outcome.unwrap();
    assert_eq!(lanes.unpersisted_len(), 2);
    assert!(claim_all(&mut lanes).is_empty(), "nothing claimable before it is durable");
    let ready = lanes.poll_ready().expect("two appends to write");
    assert_eq!(ready.lanes.len(), 2);
    assert_eq!(ready.next_ordinal, Ordinal(2));
    assert!(ready.must_sync && ready.forget.is_empty() && ready.generation.is_none());
    let ordinals: Vec<_> = ready.lanes.iter().map(|l| (l.lane.clone(), l.ordinals.clone())).collect();
    assert_eq!(ordinals, vec![(Lane::Room("a"), vec![Ordinal(0)]), (Lane::Other, vec![Ordinal(1)])]);
    assert!(lanes.poll_ready().is_none(), "one epoch at a time");
    // Enqueued meanwhile: in the next epoch.
    lanes.enqueue(Lane::Room("a"), "a1".to_owned()).outcome.unwrap();
    let t = lanes.persisted(ready.epoch);
    assert_eq!(t.outcome, LanesPersisted::Recorded { lanes: vec![Lane::Room("a"), Lane::Other] });
    assert!(t.changes.contains(egress_core::Projection::Durable));
    assert_eq!(lanes.unpersisted_len(), 1);
    let sent: Vec<_> = claim_all(&mut lanes).into_iter().map(|(_, _, p)| p).collect();
    assert_eq!(sent, ["a0", "o0"]);
    assert_eq!(lanes.persisted(ready.epoch).outcome, LanesPersisted::UnknownEpoch { epoch: ready.epoch });
}

#[test]
fn a_failed_epoch_is_shown_and_written_again_whole() {
    let mut lanes = fresh(8);
    lanes.enqueue(Lane::Room("a"), "a0".to_owned()).outcome.unwrap();
    let first = lanes.poll_ready().unwrap();
    let t = lanes.persist_failed(first.epoch, "disk full");
    assert!(t.changes.contains(egress_core::Projection::PersistError));
    assert_eq!(lanes.persist_error().map(|e| e.reason.as_str()), Some("disk full"));
    assert!(lanes.lane(&Lane::Room("a")).unwrap().persist_error().is_some(), "the lane shows it too");
    assert!(claim_all(&mut lanes).is_empty());
    let again = lanes.poll_ready().expect("written again");
    assert_eq!(again.lanes.len(), 1);
    assert_eq!(again.lanes[0].ready.appends, first.lanes[0].ready.appends);
    assert_eq!(again.lanes[0].ordinals, first.lanes[0].ordinals);
    assert_eq!(again.next_ordinal, Ordinal(1));
    assert_ne!(again.epoch, first.epoch);
    let t = lanes.persisted(again.epoch);
    assert!(t.changes.contains(egress_core::Projection::PersistError));
    assert!(lanes.persist_error().is_none());
    assert_eq!(claim_all(&mut lanes).len(), 1);
}

/// The test: interleaved lanes, some of it sent, some acknowledged,
/// a reconnect; a crash; the restart holds nothing in flight and no
/// backoff, and releases in the original global enqueue order.
#[test]
fn a_restart_releases_every_lane_in_the_original_global_order() {
    let mut store = Store::default();
    let mut lanes = fresh(8);
    let plan = [
        (Lane::Room("a"), "a0"),
        (Lane::Room("b"), "b0"),
        (Lane::AccountData, "d0"),
        (Lane::Room("a"), "a1"),
        (Lane::Other, "o0"),
        (Lane::Room("b"), "b1"),
        (Lane::AccountData, "d1"),
        (Lane::Other, "o1"),
        (Lane::Room("a"), "a2"),
    ];
    for (lane, text) in plan.iter().take(6) {
        lanes.enqueue(lane.clone(), (*text).to_owned()).outcome.unwrap();
    }
    store.flush(&mut lanes);
    let sent = claim_all(&mut lanes);
    let g = lanes.generation();
    // a0 and o0 delivered; d0 failed and backs off; b0 in flight.
    let _ = lanes.complete(g, &Lane::Room("a"), Sequence(0));
    let _ = lanes.complete(g, &Lane::Other, Sequence(0));
    let _ = lanes.fail(
        g,
        &Lane::AccountData,
        Sequence(0),
        egress_core::FailureKind::Transient,
        egress_core::Time(0),
        egress_core::JitterSample::ZERO,
    );
    let sent: Vec<_> = sent.into_iter().map(|(_, _, p)| p).collect();
    assert_eq!(sent, ["a0", "b0", "d0", "o0"], "a1 and b1 wait behind their rooms' heads");
    for (lane, text) in plan.iter().skip(6) {
        lanes.enqueue(lane.clone(), (*text).to_owned()).outcome.unwrap();
    }
    let _ = lanes.reconnect(Generation(g.0 + 1));
    store.flush(&mut lanes);
    assert_eq!(store.generation, Generation(g.0 + 1));
    // The crash: only the store is left.
    let mut restarted = Lanes::restore(policy(8), store.restored()).expect("restores");
    assert_eq!(restarted.inflight_len(), 0);
    assert_eq!(restarted.parked_len(), 0);
    assert_eq!(restarted.generation(), Generation(g.0 + 1));
    assert_eq!(restarted.next_ordinal(), Ordinal(9));
    let order: Vec<String> = drain(&mut restarted);
    // Each round takes the head of every lane that can go, lowest ordinal
    // first: b0 d0 a1 o1 (o1 was enqueued after b1 and d1, whose lanes wait
    // on b0 and d0), then b1 d1 a2.
    assert_eq!(order, ["b0", "d0", "a1", "o1", "b1", "d1", "a2"]);
    // The same as the lanes that never crashed, fenced by a reconnect.
    let _ = lanes.reconnect(Generation(g.0 + 2));
    assert!(drain(&mut lanes).is_empty(), "not before the generation is stored");
    store.flush(&mut lanes);
    assert_eq!(drain(&mut lanes), order);
}

/// Claims and completes everything, lane by lane as it allows, and returns
/// the payloads in claim order.
fn drain(lanes: &mut Lanes<Lane, String>) -> Vec<String> {
    let mut order = Vec::new();
    for _ in 0..1_000 {
        let claimed = claim_all(lanes);
        if claimed.is_empty() {
            return order;
        }
        let g = lanes.generation();
        for (lane, sequence, payload) in claimed {
            let _ = lanes.complete(g, &lane, sequence);
            order.push(payload);
        }
    }
    panic!("still claiming after 1,000 rounds");
}

#[test]
fn a_freed_lane_is_forgotten_by_the_store_and_made_again_from_sequence_zero() {
    let mut store = Store::default();
    let mut lanes = fresh(1);
    lanes.enqueue(Lane::Room("a"), "a0".to_owned()).outcome.unwrap();
    store.flush(&mut lanes);
    let _ = drain(&mut lanes);
    store.flush(&mut lanes);
    assert_eq!(store.streams[&Lane::Room("a")].acked, Some(0));
    let made = lanes.enqueue(Lane::Room("b"), "b0".to_owned()).outcome.unwrap();
    assert_eq!((made.sequence, made.ordinal), (Sequence(0), Ordinal(1)));
    let ready = lanes.poll_ready().unwrap();
    assert_eq!(ready.forget, vec![Lane::Room("a")]);
    store.apply(&lanes, &ready);
    let _ = lanes.persisted(ready.epoch);
    assert!(!store.streams.contains_key(&Lane::Room("a")));
    // And the key again: its stream starts again at 0; ordinals go on.
    let _ = drain(&mut lanes);
    store.flush(&mut lanes);
    let again = lanes.enqueue(Lane::Room("a"), "a-again".to_owned()).outcome.unwrap();
    assert_eq!((again.sequence, again.ordinal), (Sequence(0), Ordinal(2)));
    store.flush(&mut lanes);
    let restarted = Lanes::restore(policy(1), store.restored()).unwrap();
    assert_eq!(restarted.next_ordinal(), Ordinal(3));
    assert_eq!(restarted.ordinal(&Lane::Room("a"), Sequence(0)), Some(Ordinal(2)));
}

#[test]
fn a_lane_being_written_is_not_freed_and_a_failed_forget_is_written_again() {
    let mut lanes = fresh(1);
    lanes.enqueue(Lane::Room("a"), "a0".to_owned()).outcome.unwrap();
    let ready = lanes.poll_ready().unwrap();
    let _ = lanes.persisted(ready.epoch);
    let _ = drain(&mut lanes);
    // Its acknowledgement is being written: not idle for a new key yet.
    let ack = lanes.poll_ready().unwrap();
    assert!(ack.lanes[0].ready.acked_through.is_some());
    assert!(lanes.next_freed().is_none());
    let refused = lanes.enqueue(Lane::Room("b"), "b0".to_owned()).outcome;
    assert!(refused.is_err(), "{refused:?}");
    let _ = lanes.persisted(ack.epoch);
    assert_eq!(lanes.next_freed(), Some(&Lane::Room("a")));
    lanes.enqueue(Lane::Room("b"), "b0".to_owned()).outcome.unwrap();
    let forget = lanes.poll_ready().unwrap();
    assert_eq!(forget.forget, vec![Lane::Room("a")]);
    let _ = lanes.persist_failed(forget.epoch, "locked");
    let again = lanes.poll_ready().unwrap();
    assert_eq!(again.forget, vec![Lane::Room("a")], "the forget is written again");
    assert_eq!(again.lanes.len(), 1);
}

#[test]
fn a_reconnect_is_stored_before_a_claim_under_it_even_with_no_lanes() {
    let mut lanes = fresh(4);
    let _ = lanes.reconnect(Generation(1));
    assert!(!lanes.generation_durable());
    let ready = lanes.poll_ready().expect("the generation alone");
    assert_eq!(ready.generation, Some(Generation(1)));
    assert!(ready.must_sync && ready.lanes.is_empty());
    let _ = lanes.persisted(ready.epoch);
    assert!(lanes.generation_durable());
    // A lane made now is at the stored generation already.
    lanes.enqueue(Lane::Room("a"), "a0".to_owned()).outcome.unwrap();
    let ready = lanes.poll_ready().unwrap();
    assert_eq!(ready.generation, None);
    assert_eq!(ready.lanes[0].ready.generation, None);
    let _ = lanes.persisted(ready.epoch);
    assert_eq!(claim_all(&mut lanes).len(), 1);
    // A lane made while a reconnect is not yet stored waits for it.
    let _ = lanes.reconnect(Generation(2));
    lanes.enqueue(Lane::Room("b"), "b0".to_owned()).outcome.unwrap();
    let ready = lanes.poll_ready().unwrap();
    assert_eq!(ready.generation, Some(Generation(2)));
    let b = ready.lanes.iter().find(|l| l.lane == Lane::Room("b")).expect("b is written");
    assert_eq!(b.ready.generation, Some(Generation(2)));
    let _ = lanes.persisted(ready.epoch);
    let sent: Vec<_> = claim_all(&mut lanes).into_iter().map(|(_, _, p)| p).collect();
    assert_eq!(sent, ["a0", "b0"]);
}

fn one_lane(ordinals: Vec<Ordinal>, records: u64) -> RestoredLane<Lane, String> {
    RestoredLane {
        lane: Lane::Room("a"),
        restored: Restored {
            generation: Generation(0),
            next_sequence: Sequence(records),
            acked_through: None,
            records: (0..records)
                .map(|s| RestoredRecord { sequence: Sequence(s), payload: format!("r{s}"), dead: None })
                .collect(),
            skipped: Vec::new(),
        },
        ordinals,
    }
}

#[test]
fn a_store_whose_ordinals_or_lanes_do_not_add_up_is_refused_with_a_typed_error() {
    let restore = |lanes: Vec<RestoredLane<Lane, String>>, next: u64, max: usize| {
        Lanes::restore(policy(max), RestoredLanes { generation: Generation(3), next_ordinal: Ordinal(next), lanes })
            .err()
    };
    assert_eq!(
        restore(vec![one_lane(vec![Ordinal(0)], 2)], 5, 4),
        Some(LanesRestoreError::OrdinalCount { index: 0, records: 2, ordinals: 1 })
    );
    assert_eq!(
        restore(vec![one_lane(vec![Ordinal(3), Ordinal(2)], 2)], 5, 4),
        Some(LanesRestoreError::Ordinal { ordinal: Ordinal(2) })
    );
    assert_eq!(
        restore(vec![one_lane(vec![Ordinal(3), Ordinal(5)], 2)], 5, 4),
        Some(LanesRestoreError::Ordinal { ordinal: Ordinal(5) })
    );
    let mut other = one_lane(vec![Ordinal(1)], 1);
    other.lane = Lane::Room("b");
    assert_eq!(
        restore(vec![one_lane(vec![Ordinal(1)], 1), other.clone()], 5, 4),
        Some(LanesRestoreError::Ordinal { ordinal: Ordinal(1) })
    );
    assert_eq!(
        restore(vec![one_lane(vec![Ordinal(1)], 1), one_lane(vec![Ordinal(2)], 1)], 5, 4),
        Some(LanesRestoreError::DuplicateLane { index: 1 })
    );
    assert_eq!(
        restore(vec![one_lane(vec![Ordinal(0)], 1), other], 5, 1),
        Some(LanesRestoreError::TooManyLanes { stored: 2, limit: 1 })
    );
    let mut gap = one_lane(vec![Ordinal(0), Ordinal(1)], 2);
    gap.restored.records.remove(0);
    gap.ordinals.remove(0);
    assert!(matches!(restore(vec![gap], 5, 4), Some(LanesRestoreError::Lane { index: 0, .. })));
    let fine = Lanes::restore(
        policy(4),
        RestoredLanes {
            generation: Generation(3),
            next_ordinal: Ordinal(5),
            lanes: vec![one_lane(vec![Ordinal(1), Ordinal(4)], 2)],
        },
    )
    .expect("restores");
    assert_eq!(fine.generation(), Generation(3));
    assert_eq!(fine.ordinal(&Lane::Room("a"), Sequence(1)), Some(Ordinal(4)));
    assert_eq!(fine.pending_len(), 2);
}

#[test]
fn lanes_kept_in_memory_have_no_journal() {
    let mut lanes: Lanes<Lane, String> = Lanes::new(policy(4));
    lanes.enqueue(Lane::Room("a"), "a0".to_owned()).outcome.unwrap();
    assert!(!lanes.is_journaled());
    assert!(lanes.poll_ready().is_none());
    assert_eq!(lanes.unpersisted_len(), 0);
    assert!(lanes.generation_durable());
    assert_eq!(claim_all(&mut lanes).len(), 1);
}

/// What `persisted` and `persist_failed` change when an epoch holds no
/// lane: a generation alone (durable moves), a forget alone (nothing but
/// the error moves).
#[test]
fn an_epoch_without_lanes_changes_exactly_what_it_wrote() {
    use egress_core::{FlushEpoch, Projection};
    let mut lanes = fresh(1);
    let _ = lanes.reconnect(Generation(1));
    let failed = lanes.poll_ready().expect("the generation");
    assert!(failed.lanes.is_empty());
    let t = lanes.persist_failed(failed.epoch, "locked");
    assert!(t.changes.contains(Projection::PersistError), "the error shows, with no lane to show it: {:?}", t.changes);
    assert!(!t.changes.contains(Projection::Durable));
    let again = lanes.poll_ready().expect("again");
    let t = lanes.persisted(again.epoch);
    assert!(t.changes.contains(Projection::Durable), "the generation became durable: {:?}", t.changes);
    assert!(t.changes.contains(Projection::PersistError), "the error cleared");
    // A forget alone: a room freed for a write behind a flush gate (not
    // written until released).
    lanes.enqueue(Lane::Room("a"), "a0".to_owned()).outcome.unwrap();
    let ready = lanes.poll_ready().unwrap();
    let _ = lanes.persisted(ready.epoch);
    let _ = drain(&mut lanes);
    let ready = lanes.poll_ready().unwrap();
    let _ = lanes.persisted(ready.epoch);
    lanes.enqueue_after(Lane::Room("b"), "b0".to_owned(), FlushEpoch(1)).outcome.unwrap();
    let forget = lanes.poll_ready().expect("the forget");
    assert_eq!((forget.forget.len(), forget.lanes.len(), forget.generation), (1, 0, None));
    let t = lanes.persisted(forget.epoch);
    assert!(t.changes.is_empty(), "nothing a reader shows moved: {:?}", t.changes);
    assert_eq!(t.outcome, LanesPersisted::Recorded { lanes: Vec::new() });
}

// ---- a hostile review's probes (2026-12-06) --------------------------------

mod probes {
    use std::cell::Cell;

    use egress_core::{
        Generation, LaneKey, LaneKind, Lanes, LanesPolicy, LanesRestoreError, Ordinal, Policy, Restored, RestoredLane,
        RestoredLanes, RestoredRecord, ScheduleOutcome, Sequence,
    };

    #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
    struct Key(u8);
    impl LaneKey for Key {
        fn kind(&self) -> LaneKind {
            LaneKind::Serial
        }
    }

    fn lane(k: u8, ordinal: u64) -> RestoredLane<Key, u8> {
        RestoredLane {
            lane: Key(k),
            restored: Restored {
                generation: Generation(0),
                next_sequence: Sequence(1),
                acked_through: None,
                records: vec![RestoredRecord { sequence: Sequence(0), payload: k, dead: None }],
                skipped: Vec::new(),
            },
            ordinals: vec![Ordinal(ordinal)],
        }
    }

    /// Durable lanes with one record in `key`, written and reported.
    fn one_record_persisted<K: LaneKey, T>(key: K, payload: T) -> Lanes<K, T> {
        let policy = LanesPolicy::new(Policy::default(), 4).unwrap();
        let mut lanes = Lanes::restore(policy, RestoredLanes::empty()).unwrap();
        lanes.enqueue(key, payload).outcome.unwrap();
        let ready = lanes.poll_ready().unwrap();
        let _ = lanes.persisted(ready.epoch);
        lanes
    }

    /// Which slot holds a lane does not count: the same store restored
    /// with its lanes listed in another order is the same `Lanes`.
    #[test]
    fn lanes_restored_in_another_order_are_equal() {
        let stored = |lanes| RestoredLanes { generation: Generation(1), next_ordinal: Ordinal(2), lanes };
        let policy = LanesPolicy::new(Policy::default(), 4).unwrap();
        let ab = Lanes::restore(policy, stored(vec![lane(1, 0), lane(2, 1)])).unwrap();
        let ba = Lanes::restore(policy, stored(vec![lane(2, 1), lane(1, 0)])).unwrap();
        assert_eq!((ab.next_claim(), ab.pending_len()), (ba.next_claim(), ba.pending_len()));
        assert!(ab == ba, "the same lanes, in other slots");
        let mut other = ba.clone();
        let _ = other.enqueue(Key(3), 3);
        assert!(ab != other, "a lane more differs");
    }

    /// A refused call on durable lanes leaves them equal: marking a lane
    /// to be asked for writes is not a change (asked, it has none).
    #[test]
    fn a_refused_call_on_durable_lanes_changes_nothing() {
        let mut lanes: Lanes<Key, u8> = one_record_persisted(Key(1), 7);
        let before = lanes.clone();
        let g = lanes.generation();
        let t = lanes.requeue(g, &Key(1), Sequence(9));
        assert_eq!(t.outcome, ScheduleOutcome::UnknownSequence { sequence: Sequence(9) });
        assert!(t.changes.is_empty());
        assert!(lanes == before, "refused: unchanged");
        assert_eq!(lanes.poll_ready(), None, "and nothing to write");
    }

    /// What the store was told counts: two lanes alike but for a write
    /// handed out (the generation's) differ.
    #[test]
    fn what_the_store_was_told_counts_for_equality() {
        let policy = LanesPolicy::new(Policy::default(), 4).unwrap();
        let mut told: Lanes<Key, u8> = Lanes::restore(policy, RestoredLanes::empty()).unwrap();
        let _ = told.reconnect(Generation(1));
        let untold = told.clone();
        let ready = told.poll_ready().expect("the generation to write");
        assert_eq!((ready.generation, ready.lanes.len()), (Some(Generation(1)), 0));
        assert!(told != untold, "a write handed out");
        assert!(told.clone() == told);
    }

    thread_local! { static PANIC: Cell<bool> = const { Cell::new(false) }; }

    #[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
    struct Fragile(u8);
    impl Clone for Fragile {
        fn clone(&self) -> Self {
            assert!(!PANIC.with(Cell::get), "a clone that panics");
            Fragile(self.0)
        }
    }
    impl LaneKey for Fragile {
        fn kind(&self) -> LaneKind {
            LaneKind::Serial
        }
    }

    /// A durable claim copies no key: a key whose `Clone` panics cannot
    /// interrupt it after the record went in flight.
    #[test]
    fn a_durable_claim_copies_no_key() {
        let mut lanes: Lanes<Fragile, u32> = one_record_persisted(Fragile(1), 7);
        assert!(lanes.poll_ready().is_none(), "nothing more to write: the lane is not marked");
        let g = lanes.generation();
        PANIC.with(|p| p.set(true));
        let claimed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            matches!(lanes.claim(g).outcome, egress_core::LanesClaim::Claimed(_))
        }));
        PANIC.with(|p| p.set(false));
        assert_eq!(claimed.ok(), Some(true), "claimed, no clone");
        assert_eq!((lanes.pending_len(), lanes.inflight_len()), (0, 1));
    }

    /// A stored next ordinal at the end of the ordinals is refused at the
    /// restore (no enqueue could be numbered).
    #[test]
    fn a_next_ordinal_at_the_end_is_refused() {
        let policy = LanesPolicy::new(Policy::default(), 4).unwrap();
        let stored: RestoredLanes<Key, u8> =
            RestoredLanes { generation: Generation(0), next_ordinal: Ordinal(u64::MAX), lanes: Vec::new() };
        assert_eq!(
            Lanes::restore(policy, stored).err(),
            Some(LanesRestoreError::Ordinal { ordinal: Ordinal(u64::MAX) })
        );
        let stored: RestoredLanes<Key, u8> =
            RestoredLanes { generation: Generation(0), next_ordinal: Ordinal(u64::MAX - 1), lanes: Vec::new() };
        let mut lanes = Lanes::restore(policy, stored).unwrap();
        assert_eq!(lanes.enqueue(Key(1), 1).outcome.map(|e| e.ordinal).ok(), Some(Ordinal(u64::MAX - 1)));
    }
}
