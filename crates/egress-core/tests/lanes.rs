//! The rules of `Lanes`, one test each, on the lanes of a chat client:
//! rooms (serial, one lane per room), to-device (serial, one lane),
//! account data (strict FIFO) and other calls (unordered, up to 3).

// Unwraps name what a test expects to exist; a panic is the failure.
#![allow(clippy::unwrap_used)]

use std::num::NonZeroUsize;

use egress_core::{
    AckOutcome, CompleteOutcome, DeadReason, Delay, FailOutcome, FailureKind, FlushEpoch, Generation, JitterSample,
    LaneKey, LaneKind, Lanes, LanesClaim, LanesPolicy, LanesPolicyError, LanesReconnect, Ordinal, Policy, Projection,
    ScheduleOutcome, Sequence, Time,
};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Lane {
    ToDevice,
    Room(&'static str),
    AccountData,
    Other,
}

impl LaneKey for Lane {
    fn kind(&self) -> LaneKind {
        match self {
            Lane::ToDevice | Lane::Room(_) => LaneKind::Serial,
            Lane::AccountData => LaneKind::Strict,
            Lane::Other => LaneKind::Unordered(NonZeroUsize::new(3).unwrap()),
        }
    }
}

fn policy() -> LanesPolicy {
    let base = Policy::builder().retry_base(Delay(100)).retry_ceiling(Delay(1_000)).retry_budget(3).build().unwrap();
    LanesPolicy::new(base, 16).unwrap()
}

fn lanes() -> Lanes<Lane, &'static str> {
    Lanes::new(policy())
}

/// Claims until nothing more goes; returns what went, as (lane, payload).
fn drain(lanes: &mut Lanes<Lane, &'static str>) -> Vec<(Lane, &'static str)> {
    let g = lanes.generation();
    let mut sent = Vec::new();
    while let LanesClaim::Claimed(e) = lanes.claim(g).outcome {
        sent.push((e.lane.clone(), *e.envelope.payload));
    }
    sent
}

fn enqueue(lanes: &mut Lanes<Lane, &'static str>, items: &[(Lane, &'static str)]) {
    for (lane, payload) in items {
        lanes.enqueue(lane.clone(), *payload).outcome.expect("room for every lane");
    }
}

fn fail(lanes: &mut Lanes<Lane, &'static str>, lane: &Lane, seq: u64, kind: FailureKind, now: u64) -> FailOutcome {
    let g = lanes.generation();
    lanes.fail(g, lane, Sequence(seq), kind, Time(now), JitterSample::ZERO).outcome
}

#[test]
fn releases_in_enqueue_order_across_lanes_skipping_occupied_ones() {
    let mut l = lanes();
    enqueue(
        &mut l,
        &[
            (Lane::Room("a"), "a1"),
            (Lane::Room("a"), "a2"),
            (Lane::ToDevice, "d1"),
            (Lane::Room("b"), "b1"),
            (Lane::ToDevice, "d2"),
            (Lane::Other, "o1"),
            (Lane::Other, "o2"),
        ],
    );
    // One in flight per room and for to-device; "other" takes two at once.
    assert_eq!(
        drain(&mut l),
        [
            (Lane::Room("a"), "a1"),
            (Lane::ToDevice, "d1"),
            (Lane::Room("b"), "b1"),
            (Lane::Other, "o1"),
            (Lane::Other, "o2")
        ]
    );
    assert_eq!(l.claim(l.generation()).outcome, LanesClaim::Waiting, "a2 and d2 wait for their lanes");
    // Freeing to-device lets d2 go, not a2: its room is still occupied.
    let g = l.generation();
    assert_eq!(l.ack(g, &Lane::ToDevice, Sequence(0)).outcome, AckOutcome::Advanced { through: Sequence(0) });
    assert_eq!(drain(&mut l), [(Lane::ToDevice, "d2")]);
    assert_eq!(l.ack(g, &Lane::Room("a"), Sequence(0)).outcome, AckOutcome::Advanced { through: Sequence(0) });
    assert_eq!(drain(&mut l), [(Lane::Room("a"), "a2")]);
}

#[test]
fn ordinals_follow_enqueue_order_and_a_retry_keeps_its_own() {
    let mut l = lanes();
    enqueue(&mut l, &[(Lane::Room("a"), "a1"), (Lane::Room("b"), "b1"), (Lane::Room("a"), "a2")]);
    assert_eq!(l.ordinal(&Lane::Room("a"), Sequence(1)), Some(Ordinal(2)));
    assert_eq!(l.next_ordinal(), Ordinal(3));
    let g = l.generation();
    let LanesClaim::Claimed(first) = l.claim(g).outcome else { panic!("a1 goes") };
    assert_eq!((first.ordinal, first.envelope.sequence), (Ordinal(0), Sequence(0)));
    assert!(matches!(fail(&mut l, &Lane::Room("a"), 0, FailureKind::Transient, 0), FailOutcome::Retrying(_)));
    enqueue(&mut l, &[(Lane::Room("c"), "c1")]);
    // While a1 backs off, b1 and c1 go; a2 waits behind a1 in its room.
    assert_eq!(drain(&mut l), [(Lane::Room("b"), "b1"), (Lane::Room("c"), "c1")]);
    assert_eq!(l.poll_timeout(), Some(Time(100)));
    let due = l.handle_timeout(Time(100));
    assert_eq!(due.outcome, [(Lane::Room("a"), vec![Sequence(0)])]);
    assert!(due.changes.contains(Projection::Parked) && due.changes.contains(Projection::Pending));
    enqueue(&mut l, &[(Lane::Room("d"), "d1")]);
    // a1 keeps ordinal 0: it goes before d1, enqueued after it.
    let LanesClaim::Claimed(retried) = l.claim(g).outcome else { panic!("a1 goes again") };
    assert_eq!((retried.ordinal, *retried.envelope.payload), (Ordinal(0), "a1"));
    assert_eq!(drain(&mut l), [(Lane::Room("d"), "d1")]);
}

/// The strict FIFO lane is not overtaken while its head backs off, nor
/// while its head is a held dead letter, nor after that letter is requeued.
#[test]
fn the_strict_lane_is_never_overtaken_by_a_later_write() {
    let mut l = lanes();
    let g = l.generation();
    enqueue(&mut l, &[(Lane::AccountData, "w1"), (Lane::AccountData, "w2"), (Lane::AccountData, "w3")]);
    assert_eq!(drain(&mut l), [(Lane::AccountData, "w1")]);
    assert!(matches!(
        fail(&mut l, &Lane::AccountData, 0, FailureKind::RetryAfter(Delay(500)), 0),
        FailOutcome::Retrying(_)
    ));
    // Backing off: every claim until the backoff elapses leaves w2 and w3.
    for now in [0, 100, 499] {
        let _ = l.handle_timeout(Time(now));
        assert_eq!(l.claim(g).outcome, LanesClaim::Waiting, "w2 overtook w1 at t={now}");
    }
    let _ = l.handle_timeout(Time(500));
    assert_eq!(drain(&mut l), [(Lane::AccountData, "w1")]);
    // A permanent failure holds w1: still nothing behind it goes.
    assert!(matches!(fail(&mut l, &Lane::AccountData, 0, FailureKind::Permanent, 600), FailOutcome::Exhausted(_)));
    assert_eq!(l.exhausted_len(), 1);
    let _ = l.handle_timeout(Time(1_000_000));
    assert_eq!(l.claim(g).outcome, LanesClaim::Waiting, "w2 overtook a held w1");
    // Requeued, w1 goes first, then w2, then w3, one at a time.
    assert_eq!(
        l.requeue(g, &Lane::AccountData, Sequence(0)).outcome,
        ScheduleOutcome::Scheduled { sequence: Sequence(0) }
    );
    let mut order = Vec::new();
    for through in 0..3 {
        let sent = drain(&mut l);
        assert_eq!(sent.len(), 1, "one write in flight at a time");
        order.push(sent[0].1);
        assert_eq!(
            l.complete(g, &Lane::AccountData, Sequence(through)).outcome,
            CompleteOutcome::Advanced { through: Sequence(through) }
        );
    }
    assert_eq!(order, ["w1", "w2", "w3"]);
}

/// The contrast that shows the test above can fail: an unordered lane lets
/// later records go while an earlier one backs off.
#[test]
fn an_unordered_lane_goes_on_while_a_record_backs_off() {
    let mut l = lanes();
    enqueue(&mut l, &[(Lane::Other, "o1"), (Lane::Other, "o2")]);
    assert_eq!(drain(&mut l).len(), 2);
    assert!(matches!(fail(&mut l, &Lane::Other, 0, FailureKind::Transient, 0), FailOutcome::Retrying(_)));
    enqueue(&mut l, &[(Lane::Other, "o3")]);
    assert_eq!(drain(&mut l), [(Lane::Other, "o3")], "o3 goes while o1 backs off");
}

#[test]
fn completions_in_any_order_acknowledge_each_lane_cumulatively() {
    let mut l = lanes();
    let g = l.generation();
    enqueue(&mut l, &[(Lane::Other, "o1"), (Lane::Other, "o2"), (Lane::Other, "o3")]);
    assert_eq!(drain(&mut l).len(), 3);
    assert_eq!((l.inflight_len(), l.outstanding()), (3, 3));
    let other = Lane::Other;
    let t = l.complete(g, &other, Sequence(2));
    assert_eq!(t.outcome, CompleteOutcome::Waiting);
    assert_eq!(t.changes, egress_core::Changes::NONE.with(Projection::Inflight));
    assert_eq!((l.inflight_len(), l.outstanding()), (3, 2), "completed, not yet acknowledged");
    assert_eq!(l.complete(g, &other, Sequence(2)).outcome, CompleteOutcome::Unchanged);
    assert!(
        matches!(fail(&mut l, &other, 2, FailureKind::Transient, 0), FailOutcome::UnknownSequence { .. }),
        "a completed record cannot fail"
    );
    assert_eq!(l.complete(g, &other, Sequence(1)).outcome, CompleteOutcome::Waiting);
    let t = l.complete(g, &other, Sequence(0));
    assert_eq!(t.outcome, CompleteOutcome::Advanced { through: Sequence(2) });
    assert!(t.changes.contains(Projection::AckedThrough));
    assert_eq!(l.lane(&other).unwrap().acked_through(), Some(Sequence(2)));
    assert_eq!((l.inflight_len(), l.outstanding()), (0, 0));
    assert_eq!(l.complete(g, &other, Sequence(0)).outcome, CompleteOutcome::Unchanged, "acknowledged before");
    assert_eq!(l.complete(g, &other, Sequence(3)).outcome, CompleteOutcome::UnknownSequence { sequence: Sequence(3) });
    assert_eq!(
        l.complete(g, &Lane::Room("x"), Sequence(0)).outcome,
        CompleteOutcome::UnknownSequence { sequence: Sequence(0) }
    );
}

#[test]
fn a_cumulative_ack_carries_the_completions_waiting_above_it() {
    let mut l = lanes();
    let g = l.generation();
    enqueue(&mut l, &[(Lane::Other, "o1"), (Lane::Other, "o2"), (Lane::Other, "o3")]);
    assert_eq!(drain(&mut l).len(), 3);
    let _ = l.complete(g, &Lane::Other, Sequence(1));
    let _ = l.complete(g, &Lane::Other, Sequence(2));
    // The ack names where the lane reached: through 2, carried.
    assert_eq!(l.ack(g, &Lane::Other, Sequence(0)).outcome, AckOutcome::Advanced { through: Sequence(2) });
    assert_eq!(l.lane(&Lane::Other).unwrap().acked_through(), Some(Sequence(2)));
    assert_eq!((l.inflight_len(), l.outstanding(), l.ordinal(&Lane::Other, Sequence(2))), (0, 0, None));
}

#[test]
fn the_cap_across_lanes_bounds_what_is_outstanding() {
    let mut l = Lanes::new(policy().inflight_cap(NonZeroUsize::new(2).unwrap()));
    enqueue(&mut l, &[(Lane::Room("a"), "a1"), (Lane::Room("b"), "b1"), (Lane::Other, "o1")]);
    assert_eq!(drain(&mut l).len(), 2);
    let g = l.generation();
    assert_eq!(l.claim(g).outcome, LanesClaim::Full { cap: NonZeroUsize::new(2).unwrap() });
    assert!(!l.can_claim());
    // A completion frees a place even before its lane acknowledges it.
    let _ = l.complete(g, &Lane::Room("b"), Sequence(0));
    assert!(l.can_claim());
    assert_eq!(drain(&mut l), [(Lane::Other, "o1")]);
}

#[test]
fn can_claim_says_whether_a_lane_could_send_now_below_the_cap() {
    let mut l = lanes();
    assert!(!l.can_claim(), "no lanes");
    enqueue(&mut l, &[(Lane::Room("a"), "a1"), (Lane::Room("a"), "a2")]);
    assert!(l.can_claim());
    let g = l.generation();
    assert!(matches!(l.claim(g).outcome, LanesClaim::Claimed(_)));
    assert!(!l.can_claim(), "a2 waits for a1 in its serial lane: no lane can send, and no cap is reached");
    assert!(matches!(l.claim(g).outcome, LanesClaim::Waiting));
    let _ = l.complete(g, &Lane::Room("a"), Sequence(0));
    assert!(l.can_claim(), "a1 completed: a2 can go");
}

#[test]
fn next_claim_names_the_lane_claim_takes_and_nothing_when_it_would_not() {
    let mut l = Lanes::new(policy().inflight_cap(NonZeroUsize::new(2).unwrap()));
    assert_eq!(l.next_claim(), None, "empty");
    let items = [(Lane::Room("b"), "b1"), (Lane::Room("a"), "a1"), (Lane::Room("a"), "a2"), (Lane::Room("c"), "c1")];
    enqueue(&mut l, &items);
    let g = l.generation();
    let claim = |l: &mut Lanes<Lane, &'static str>, expected: Lane| {
        assert_eq!(l.next_claim(), Some(&expected));
        match l.claim(g).outcome {
            LanesClaim::Claimed(e) => assert_eq!(e.lane, &expected),
            other => panic!("{other:?}"),
        }
    };
    claim(&mut l, Lane::Room("b"));
    claim(&mut l, Lane::Room("a"));
    // c1 could go, but the cap is reached.
    assert_eq!(l.next_claim(), None, "at the cap");
    let _ = l.complete(g, &Lane::Room("b"), Sequence(0));
    // a2 waits behind a1 in its serial lane: c1 is next.
    claim(&mut l, Lane::Room("c"));
    let _ = l.complete(g, &Lane::Room("c"), Sequence(0));
    assert_eq!(l.next_claim(), None, "a1 occupies its lane");
    let _ = l.complete(g, &Lane::Room("a"), Sequence(0));
    claim(&mut l, Lane::Room("a"));
}

#[test]
fn a_flush_epoch_holds_its_lane_and_not_the_others() {
    let mut l = lanes();
    let g = l.generation();
    let gated = l.enqueue_after(Lane::Room("a"), "a1", FlushEpoch(2));
    assert!(gated.changes.contains(Projection::Durable));
    enqueue(&mut l, &[(Lane::Room("a"), "a2"), (Lane::Room("b"), "b1")]);
    assert_eq!(l.gated_len(), 1);
    assert_eq!(drain(&mut l), [(Lane::Room("b"), "b1")]);
    assert_eq!(l.release(FlushEpoch(1)).outcome, []);
    assert_eq!(l.claim(g).outcome, LanesClaim::Waiting);
    let released = l.release(FlushEpoch(2));
    assert_eq!(released.outcome, [(Lane::Room("a"), 1)]);
    assert!(released.changes.contains(Projection::Durable));
    assert_eq!(l.release(FlushEpoch(2)).changes, egress_core::Changes::NONE, "not above what was released");
    assert_eq!(drain(&mut l), [(Lane::Room("a"), "a1")]);
    // A lane made after a release starts released.
    enqueue(&mut l, &[]);
    let t = l.enqueue_after(Lane::Room("c"), "c1", FlushEpoch(2));
    assert!(!t.changes.contains(Projection::Durable), "epoch 2 was released before the lane existed");
    assert_eq!(drain(&mut l), [(Lane::Room("c"), "c1")]);
}

#[test]
fn lanes_are_bounded_and_an_idle_lane_makes_room() {
    let mut l: Lanes<Lane, &str> = Lanes::new(LanesPolicy::new(Policy::default(), 2).unwrap());
    let g = l.generation();
    assert!(l.enqueue(Lane::Room("a"), "a1").outcome.unwrap().new_lane);
    assert!(!l.enqueue(Lane::Room("a"), "a2").outcome.unwrap().new_lane);
    assert!(l.enqueue(Lane::Room("b"), "b1").outcome.unwrap().new_lane);
    let before = l.clone();
    let refused = l.enqueue(Lane::Room("c"), "c1");
    let err = refused.outcome.expect_err("both lanes are busy");
    assert_eq!((err.limit, err.payload), (2, "c1"), "the payload comes back");
    assert!(refused.changes.is_empty());
    assert!(l == before, "a refused enqueue changes nothing");
    assert_eq!(err.to_string(), "refused: all 2 lanes are busy, and a new key needs one more");
    // Room b delivers everything: it is idle, and room c takes its place.
    assert_eq!(drain(&mut l).len(), 2);
    assert_eq!(
        l.complete(g, &Lane::Room("b"), Sequence(0)).outcome,
        CompleteOutcome::Advanced { through: Sequence(0) }
    );
    assert_eq!(l.lane_count(), 2, "an idle lane stays until its room is needed");
    let made = l.enqueue(Lane::Room("c"), "c1").outcome.unwrap();
    assert!(made.new_lane);
    assert!(l.lane(&Lane::Room("b")).is_none());
    assert_eq!(l.lanes().map(|(k, _)| k.clone()).collect::<Vec<_>>(), [Lane::Room("a"), Lane::Room("c")]);
    // A lane made again starts its sequences again; its ordinals do not.
    let again = l.enqueue(Lane::Room("b"), "b2");
    assert!(again.outcome.is_err(), "a and c are busy");
    let _ = l.complete(g, &Lane::Room("c"), Sequence(0));
    assert_eq!(drain(&mut l), [(Lane::Room("c"), "c1")]);
    let _ = l.complete(g, &Lane::Room("c"), Sequence(0));
    let b2 = l.enqueue(Lane::Room("b"), "b2").outcome.unwrap();
    assert_eq!((b2.sequence, b2.ordinal), (Sequence(0), Ordinal(4)));
    assert_eq!(LanesPolicy::new(Policy::default(), 0), Err(LanesPolicyError::ZeroMaxLanes));
}

#[test]
fn one_reconnect_fences_every_lane() {
    let mut l = lanes();
    let g0 = l.generation();
    enqueue(&mut l, &[(Lane::Room("a"), "a1"), (Lane::ToDevice, "d1"), (Lane::Other, "o1"), (Lane::Other, "o2")]);
    assert_eq!(drain(&mut l).len(), 4);
    let _ = l.complete(g0, &Lane::Other, Sequence(1));
    assert!(matches!(fail(&mut l, &Lane::ToDevice, 0, FailureKind::Transient, 0), FailOutcome::Retrying(_)));
    let t = l.reconnect(Generation(1));
    let LanesReconnect::Advanced { generation, replayed, dead, lanes: touched } = t.outcome else { panic!("advanced") };
    assert_eq!((generation, replayed, dead), (Generation(1), 4, 0));
    assert_eq!(touched.len(), 3);
    assert!(touched.iter().all(|(_, c)| c.contains(Projection::Generation)));
    assert!(t.changes.contains(Projection::Parked) && t.changes.contains(Projection::Inflight));
    assert_eq!((l.pending_len(), l.inflight_len(), l.parked_len(), l.outstanding()), (4, 0, 0, 0));
    assert!(l.lanes().all(|(_, core)| core.generation() == Generation(1)));
    // The old transport is fenced in every lane.
    let before = l.clone();
    assert!(l.claim(g0).outcome.refusal().is_some());
    assert!(l.ack(g0, &Lane::Room("a"), Sequence(0)).outcome.refusal().is_some());
    assert!(l == before);
    // Everything goes again under the new generation; a lane made now is
    // at it too.
    enqueue(&mut l, &[(Lane::Room("z"), "z1")]);
    assert_eq!(l.lane(&Lane::Room("z")).unwrap().generation(), Generation(1));
    let g1 = l.generation();
    let mut sent = Vec::new();
    while let LanesClaim::Claimed(e) = l.claim(g1).outcome {
        assert_eq!(e.envelope.generation, g1);
        sent.push(*e.envelope.payload);
    }
    // "other" completed o2 before the reconnect (progress, though not
    // acknowledged): it does not isolate, and both go again at once. The
    // to-device lane, whose record failed with nothing delivered, sends
    // one record at a time (it has only one).
    assert_eq!(sent, ["a1", "d1", "o1", "o2", "z1"]);
    assert_eq!(l.lane(&Lane::Other).unwrap().isolation(), egress_core::Isolation::Off);
    assert_eq!(l.lane(&Lane::ToDevice).unwrap().isolation(), egress_core::Isolation::Off, "d1 failed: not in flight");
    assert!(matches!(l.lane(&Lane::Room("a")).unwrap().isolation(), egress_core::Isolation::Probing(_)));
}

#[test]
fn a_dead_letter_in_a_serial_lane_is_a_tombstone_and_the_lane_goes_on() {
    let mut l = lanes();
    enqueue(&mut l, &[(Lane::Room("a"), "a1"), (Lane::Room("a"), "a2")]);
    assert_eq!(drain(&mut l).len(), 1);
    assert!(matches!(fail(&mut l, &Lane::Room("a"), 0, FailureKind::Permanent, 0), FailOutcome::Exhausted(_)));
    let g = l.generation();
    let LanesClaim::Claimed(tombstone) = l.claim(g).outcome else { panic!("the tombstone goes") };
    assert_eq!(tombstone.envelope.dead, Some(DeadReason::Permanent));
    let _ = l.complete(g, &Lane::Room("a"), Sequence(0));
    assert_eq!(drain(&mut l), [(Lane::Room("a"), "a2")]);
}

#[test]
fn transitions_on_a_lane_that_does_not_exist_are_refused() {
    let mut l = lanes();
    let g = l.generation();
    let nowhere = Lane::Room("nowhere");
    assert_eq!(
        l.ack(g, &nowhere, Sequence(0)).outcome,
        AckOutcome::Unsent { through: Sequence(0), sent_through: None }
    );
    assert!(l.received(g, &nowhere, Sequence(0)).outcome.refusal().is_some());
    assert!(matches!(fail(&mut l, &nowhere, 0, FailureKind::Transient, 0), FailOutcome::UnknownSequence { .. }));
    assert_eq!(
        l.retry_now(g, &nowhere, Sequence(0)).outcome,
        ScheduleOutcome::UnknownSequence { sequence: Sequence(0) }
    );
    assert_eq!(l.requeue(g, &nowhere, Sequence(0)).outcome, ScheduleOutcome::UnknownSequence { sequence: Sequence(0) });
    assert_eq!(l.claim(g).outcome, LanesClaim::Empty);
    assert_eq!(l.lane_count(), 0);
}

#[test]
fn a_receipt_and_dead_letters_of_a_reconnect_are_taken_lane_by_lane() {
    let base = Policy::builder().replay_limit(0).build().unwrap();
    let mut l: Lanes<Lane, &str> = Lanes::new(LanesPolicy::new(base, 8).unwrap());
    enqueue(&mut l, &[(Lane::Room("a"), "a1"), (Lane::Room("b"), "b1"), (Lane::Room("c"), "c1")]);
    assert_eq!(drain(&mut l).len(), 3);
    let g = l.generation();
    // The peer holds c1: a receipt for it, taken by its lane.
    let receipt = l.received(g, &Lane::Room("c"), Sequence(0));
    assert_eq!(receipt.outcome, egress_core::ReceivedOutcome::Recorded { through: Sequence(0), moved: 0 });
    assert!(receipt.changes.contains(Projection::Received));
    assert_eq!(l.lane(&Lane::Room("c")).unwrap().received_through(), Some(Sequence(0)));
    // With no replay allowed, a1 and b1 die at the reconnect (tombstones
    // in their place), and so does c1: a receipt is not an ack.
    let LanesReconnect::Advanced { replayed, dead, .. } = l.reconnect(Generation(1)).outcome else {
        panic!("advanced")
    };
    assert_eq!((replayed, dead), (3, 3));
    let g1 = l.generation();
    let mut tombstones = 0;
    while let LanesClaim::Claimed(e) = l.claim(g1).outcome {
        tombstones += usize::from(e.envelope.dead == Some(DeadReason::Replays));
    }
    assert_eq!(tombstones, 3);
}

#[test]
fn refusals_and_debug_output_name_what_they_are() {
    let refused = egress_core::TooManyLanes { limit: 3, payload: "secret" };
    assert_eq!(format!("{refused:?}"), "TooManyLanes { limit: 3, .. }", "the payload is not shown");
    let unknown = CompleteOutcome::UnknownSequence { sequence: Sequence(4) };
    assert_eq!(unknown.refusal(), Some(egress_core::Refusal::UnknownSequence { sequence: Sequence(4) }));
    let stale = CompleteOutcome::StaleGeneration { current: Generation(2) };
    assert_eq!(stale.refusal(), Some(egress_core::Refusal::StaleGeneration { current: Generation(2) }));
    assert_eq!(CompleteOutcome::Waiting.refusal(), None);
    assert_eq!(LanesReconnect::<Lane>::Unchanged.refusal(), None);
    assert_eq!(LanesClaim::<Lane, &str>::Waiting.refusal(), None);
}

/// A probe completed above a gap is progress: the record below it goes
/// when it is due, rather than the lane waiting for a reconnect (found by
/// a hostile review: before, claims answered `Waiting` for ever).
#[test]
fn a_probe_completed_out_of_order_ends_isolation() {
    let mut l = lanes();
    enqueue(&mut l, &[(Lane::Other, "o1"), (Lane::Other, "o2")]);
    assert_eq!(drain(&mut l).len(), 2);
    // Died with both in flight and nothing acknowledged: isolation.
    let _ = l.reconnect(Generation(1));
    let g = l.generation();
    assert_eq!(drain(&mut l), [(Lane::Other, "o1")], "one probe at a time");
    assert!(matches!(fail(&mut l, &Lane::Other, 0, FailureKind::Transient, 0), FailOutcome::Retrying(_)));
    assert_eq!(drain(&mut l), [(Lane::Other, "o2")], "the next probe");
    assert_eq!(l.complete(g, &Lane::Other, Sequence(1)).outcome, CompleteOutcome::Waiting);
    assert_eq!(l.lane(&Lane::Other).unwrap().isolation(), egress_core::Isolation::Off);
    let _ = l.handle_timeout(Time(100));
    assert_eq!(drain(&mut l), [(Lane::Other, "o1")], "o1 goes again once due");
    assert_eq!(l.complete(g, &Lane::Other, Sequence(0)).outcome, CompleteOutcome::Advanced { through: Sequence(1) });
}

/// An ack that carries the completions waiting just above it reports the
/// watermark it reached and every projection it changed (found by a
/// hostile review: before, it named the caller's `through` and left
/// inflight out).
#[test]
fn an_ack_carrying_completions_reports_where_it_reached_and_what_it_changed() {
    let mut l = lanes();
    enqueue(&mut l, &[(Lane::Other, "o1"), (Lane::Other, "o2")]);
    assert_eq!(drain(&mut l).len(), 2);
    let g = l.generation();
    assert_eq!(l.complete(g, &Lane::Other, Sequence(1)).outcome, CompleteOutcome::Waiting);
    let t = l.ack(g, &Lane::Other, Sequence(0));
    assert_eq!(t.outcome, AckOutcome::Advanced { through: Sequence(1) });
    assert!(t.changes.contains(Projection::Inflight) && t.changes.contains(Projection::AckedThrough));
    assert_eq!(l.inflight_len(), 0);
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Fussy(u8);

static FUSSY_PANICS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl LaneKey for Fussy {
    fn kind(&self) -> LaneKind {
        assert!(!FUSSY_PANICS.load(std::sync::atomic::Ordering::SeqCst), "no kind today");
        LaneKind::Serial
    }
}

/// A key whose `kind` panics as its lane is made changes nothing: not even
/// the idle lane that would have made room (found by a hostile review).
#[test]
fn a_kind_that_panics_as_a_lane_is_made_changes_nothing() {
    let mut l: Lanes<Fussy, u32> = Lanes::new(LanesPolicy::new(Policy::default(), 1).unwrap());
    let g = l.generation();
    l.enqueue(Fussy(0), 0).outcome.unwrap();
    assert!(matches!(l.claim(g).outcome, LanesClaim::Claimed(_)));
    assert_eq!(l.complete(g, &Fussy(0), Sequence(0)).outcome, CompleteOutcome::Advanced { through: Sequence(0) });
    let before = l.clone();
    FUSSY_PANICS.store(true, std::sync::atomic::Ordering::SeqCst);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l.enqueue(Fussy(1), 1)));
    FUSSY_PANICS.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(panicked.is_err());
    assert!(l == before, "the idle lane is still there, nothing else moved");
    assert!(l.enqueue(Fussy(1), 1).outcome.unwrap().new_lane);
    assert_eq!(l.lanes().map(|(k, _)| k.0).collect::<Vec<_>>(), [1]);
}

/// `EgressCore::progressed`, which `complete` uses: only for a record in
/// flight under the current generation, and it says whether isolation
/// ended.
#[test]
fn progress_is_taken_for_a_record_in_flight_under_the_current_generation_only() {
    let mut core = egress_core::EgressCore::new(Policy::default());
    for p in ["a", "b"] {
        let _ = core.enqueue(p);
    }
    let g0 = core.generation();
    while let egress_core::ClaimOutcome::Claimed(_) = core.claim(g0).outcome {}
    let _ = core.reconnect(Generation(1));
    let g = core.generation();
    assert!(matches!(core.claim(g).outcome, egress_core::ClaimOutcome::Claimed(_)));
    assert_eq!(core.isolation(), egress_core::Isolation::Probing(Sequence(0)));
    let before = core.clone();
    assert!(!core.progressed(g0, Sequence(0)).outcome, "an old generation");
    assert!(!core.progressed(g, Sequence(1)).outcome, "not in flight");
    assert!(core == before, "refused: nothing changed");
    let t = core.progressed(g, Sequence(0));
    assert!(t.outcome, "isolation ended");
    assert!(t.changes.is_empty());
    assert_eq!(core.isolation(), egress_core::Isolation::Off);
    assert!(!core.progressed(g, Sequence(0)).outcome, "already over");
    // Progress since the reconnect: the next one does not isolate.
    let _ = core.reconnect(Generation(2));
    assert_eq!(core.isolation(), egress_core::Isolation::Off);
}

thread_local! {
    /// How many times a [`Counted`] key was cloned on this thread.
    static CLONES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A lane key that counts its clones: lane 0 unordered, the others serial.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Counted(u8);

impl Clone for Counted {
    fn clone(&self) -> Self {
        CLONES.with(|c| c.set(c.get() + 1));
        Counted(self.0)
    }
}

impl LaneKey for Counted {
    fn kind(&self) -> LaneKind {
        if self.0 == 0 { LaneKind::Unordered(NonZeroUsize::new(2).unwrap()) } else { LaneKind::Serial }
    }
}

#[test]
fn a_claim_copies_no_lane_key() {
    // A shell copies the key before a claim, so that a `Clone` that panics
    // changes nothing; a copy inside the claim (putting the lane back in
    // the release index) came after the record was in flight.
    let mut l: Lanes<Counted, u32> = Lanes::new(policy());
    for (lane, payload) in [(0, 1), (0, 2), (0, 3), (1, 4), (1, 5)] {
        let _ = l.enqueue(Counted(lane), payload).outcome.unwrap();
    }
    CLONES.with(|c| c.set(0));
    let g = l.generation();
    let mut claimed = Vec::new();
    while let LanesClaim::Claimed(e) = l.claim(g).outcome {
        claimed.push(*e.envelope.payload);
    }
    assert_eq!(claimed, [1, 2, 4], "two of the unordered lane, one of the serial");
    assert_eq!(CLONES.with(std::cell::Cell::get), 0, "no key copied");
    assert_eq!(l.next_claim(), None);
    let _ = l.complete(g, &Counted(0), Sequence(0));
    assert_eq!(l.next_claim(), Some(&Counted(0)), "the lane is back in the index");
}
