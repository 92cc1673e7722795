//! The lanes cell on every flavour: release order across lanes through an
//! attachment, exact invalidation per lane, failures, fencing, the
//! per-lane readers' lifetime, a freed lane, panics in user code, and the
//! refusals. (The lanes fixtures run on it too: egress-conformance.)

mod common;

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use common::Counter;
use egress_core::{
    CompleteOutcome, DeadLetters, Delay, FailOutcome, FailureKind, Generation, Incarnation, JitterSample, LaneKey,
    LaneKind, Lanes, LanesClaim, LanesPersisted, LanesPolicy, LanesReconnect, Policy, RestoredLanes, Sequence, Time,
};
use egress_reactive::{CellOptions, LaneItem, LanesCellOf, LanesRefused, LanesTransport, ManualClock, SendError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Lane {
    Room(u8),
    AccountData,
    Other,
}

impl LaneKey for Lane {
    fn kind(&self) -> LaneKind {
        match self {
            Lane::Room(_) => LaneKind::Serial,
            Lane::AccountData => LaneKind::Strict,
            Lane::Other => LaneKind::Unordered(NonZeroUsize::new(2).expect("2")),
        }
    }
}

/// What a wire saw: lane, ordinal, sequence, attempt, payload.
type Sent = (Lane, u64, u64, u32, u32);

/// A transport that records what it sends, fails as scripted (one entry
/// per send: `None` succeeds), and panics when told to.
#[derive(Clone, Default)]
struct Wire {
    sent: Arc<Mutex<Vec<Sent>>>,
    script: Arc<Mutex<std::collections::VecDeque<Option<FailureKind>>>>,
    panic_on: Arc<Mutex<Option<u32>>>,
}

impl Wire {
    fn sent(&self) -> Vec<Sent> {
        self.sent.lock().expect("wire").clone()
    }
    fn payloads(&self) -> Vec<u32> {
        self.sent().iter().map(|s| s.4).collect()
    }
    fn fail_next(&self, kinds: impl IntoIterator<Item = Option<FailureKind>>) {
        self.script.lock().expect("script").extend(kinds);
    }
}

impl LanesTransport<Lane, u32> for Wire {
    fn send(&mut self, item: LaneItem<Lane, u32>) -> Result<(), SendError> {
        if *self.panic_on.lock().expect("panic_on") == Some(item.envelope.payload) {
            panic!("the transport panicked on {}", item.envelope.payload);
        }
        if let Some(Some(kind)) = self.script.lock().expect("script").pop_front() {
            return Err(SendError::new(kind, "scripted failure"));
        }
        let e = &item.envelope;
        self.sent.lock().expect("wire").push((item.lane, item.ordinal.0, e.sequence.0, e.attempt.0, e.payload));
        Ok(())
    }
}

fn policy(max_lanes: usize) -> LanesPolicy {
    let base = Policy::builder()
        .retry_budget(3)
        .retry_base(Delay(100))
        .retry_ceiling(Delay(1_000))
        .dead_letters(DeadLetters::Skip)
        .build()
        .expect("valid policy");
    LanesPolicy::new(base, max_lanes).expect("valid lanes policy")
}

fn options(clock: &ManualClock) -> CellOptions {
    CellOptions::new().generation(Generation(1)).clock(clock.clone()).jitter_seed(7)
}

each_flavour! {
    fn records_go_in_enqueue_order_across_lanes_within_each_lanes_window(cx) {
        let clock = ManualClock::new();
        let cell: LanesCellOf<Lane, u32, _> = LanesCellOf::with_options(&cx.handle(), policy(8), options(&clock));
        let wire = Wire::default();
        let link = cell.attach(wire.clone());
        for (lane, payload) in [
            (Lane::Room(1), 10),
            (Lane::Room(1), 11),
            (Lane::Room(2), 20),
            (Lane::Other, 30),
            (Lane::Other, 31),
            (Lane::Other, 32),
        ] {
            cell.enqueue(lane, payload).expect("room for the lane");
        }
        // One in flight per room, two for the unordered lane.
        assert_eq!(wire.payloads(), [10, 20, 30, 31]);
        let ordinals: Vec<u64> = wire.sent().iter().map(|s| s.1).collect();
        assert_eq!(ordinals, [0, 2, 3, 4], "each record keeps the ordinal of its enqueue");
        assert_eq!((cell.pending_len().get(), cell.inflight_len().get(), cell.outstanding().get()), (2, 4, 4));
        assert_eq!(cell.lane_count().get(), 3);
        assert_eq!(link.complete(&Lane::Room(1), Sequence(0)), CompleteOutcome::Advanced { through: Sequence(0) });
        assert_eq!(wire.payloads(), [10, 20, 30, 31, 11], "the room's next record, once its first completed");
        // The second unordered record completes first: waiting for the
        // first, the window does not move.
        assert_eq!(link.complete(&Lane::Other, Sequence(1)), CompleteOutcome::Waiting);
        assert_eq!((cell.inflight_len().get(), cell.outstanding().get()), (4, 3));
        assert_eq!(wire.payloads().len(), 5);
        assert_eq!(link.complete(&Lane::Other, Sequence(0)), CompleteOutcome::Advanced { through: Sequence(1) });
        assert_eq!(wire.payloads(), [10, 20, 30, 31, 11, 32]);
        assert_eq!(cell.lane(&Lane::Other).acked_through().get(), Some(Sequence(1)));
    }

    fn a_transition_on_one_lane_invalidates_only_that_lanes_readers(cx) {
        let clock = ManualClock::new();
        let cell: LanesCellOf<Lane, u32, _> = LanesCellOf::with_options(&cx.handle(), policy(8), options(&clock));
        let (a, b) = (cell.lane(&Lane::Room(1)), cell.lane(&Lane::Room(2)));
        let hits = [
            watch!(cx, a.pending()),
            watch!(cx, a.pending_len()),
            watch!(cx, a.inflight()),
            watch!(cx, a.acked_through()),
            watch!(cx, b.pending()),
            watch!(cx, b.pending_len()),
            watch!(cx, b.acked_through()),
            watch!(cx, cell.pending_len()),
            watch!(cx, cell.generation()),
        ];
        let fired = || -> Vec<usize> {
            let out = hits.iter().enumerate().filter(|(_, h)| h.get() > 0).map(|(i, _)| i).collect();
            hits.iter().for_each(Counter::reset);
            out
        };
        cell.enqueue(Lane::Room(1), 1).expect("room");
        assert_eq!(fired(), [0, 1, 7], "lane a's pending and the total; nothing of lane b");
        let g = Generation(1);
        assert!(cell.claim_with(g, |o| matches!(o, LanesClaim::Claimed(e) if *e.lane == Lane::Room(1))));
        assert_eq!(fired(), [0, 1, 2, 7]);
        assert_eq!(cell.complete(g, &Lane::Room(1), Sequence(0)), CompleteOutcome::Advanced { through: Sequence(0) });
        assert_eq!(fired(), [2, 3], "in flight and acknowledged, of lane a only");
        // Refusals change nothing.
        assert!(matches!(cell.complete(Generation(0), &Lane::Room(1), Sequence(0)), CompleteOutcome::StaleGeneration { .. }));
        assert_eq!(cell.complete(g, &Lane::Room(2), Sequence(0)), CompleteOutcome::UnknownSequence { sequence: Sequence(0) });
        assert!(fired().is_empty());
        cell.enqueue(Lane::Room(2), 2).expect("room");
        assert_eq!(fired(), [4, 5, 7]);
        assert!(matches!(cell.reconnect(Generation(2)), LanesReconnect::Advanced { .. }));
        // The generation, and lane b's pending (its envelopes now carry
        // the new generation); lane a is empty, nothing of it changed.
        assert_eq!(fired(), [4, 8]);
    }

    fn an_attachments_own_claims_reach_the_readers_and_the_effects_over_them(cx) {
        let clock = ManualClock::new();
        let cell: LanesCellOf<Lane, u32, _> = LanesCellOf::with_options(&cx.handle(), policy(8), options(&clock));
        let room = cell.lane(&Lane::Room(1));
        let (lane_inflight, total_inflight) = (watch!(cx, room.inflight_len()), watch!(cx, cell.inflight_len()));
        assert_eq!((room.inflight_len().get(), room.pending_len().get()), (0, 0), "read before");
        let wire = Wire::default();
        let _link = cell.attach(wire.clone());
        cell.enqueue(Lane::Room(1), 1).expect("room");
        assert_eq!(wire.payloads(), [1], "claimed and sent by the attachment");
        assert_eq!((room.inflight_len().get(), room.pending_len().get()), (1, 0), "the lane's readers saw the claim");
        assert_eq!(room.inflight().get().len(), 1);
        assert!(lane_inflight.get() >= 1 && total_inflight.get() >= 1, "the effects over them re-ran");
        assert_eq!(cell.inflight_len().get(), 1);
    }

    fn a_failure_parks_its_record_and_stops_the_pass_a_dead_letter_does_not(cx) {
        let clock = ManualClock::new();
        let cell: LanesCellOf<Lane, u32, _> = LanesCellOf::with_options(&cx.handle(), policy(8), options(&clock));
        // Two records claimable when the transport attaches; the first send
        // fails.
        cell.enqueue(Lane::Room(1), 1).expect("room");
        cell.enqueue(Lane::Room(2), 2).expect("room");
        let wire = Wire::default();
        wire.fail_next([Some(FailureKind::Transient)]);
        let _link = cell.attach(wire.clone());
        assert!(wire.sent().is_empty(), "the first send failed, and that stopped the pass");
        assert_eq!((cell.parked_len().get(), cell.lane(&Lane::Room(1)).parked_len().get()), (1, 1));
        assert_eq!(cell.lane(&Lane::Room(2)).pending_len().get(), 1, "room 2 waits for the next pass");
        // A refused call changes nothing and starts no pass; an enqueue
        // starts the next.
        assert!(matches!(
            cell.complete(Generation(0), &Lane::Room(1), Sequence(0)),
            CompleteOutcome::StaleGeneration { .. }
        ));
        assert!(cell.release(egress_core::FlushEpoch(0)).is_empty(), "nothing to release: no change");
        assert!(wire.sent().is_empty(), "a refusal wakes no attachment");
        cell.enqueue(Lane::Room(3), 3).expect("room");
        assert_eq!(wire.payloads(), [2, 3]);
        let due = cell.poll_timeout().expect("a record is parked");
        assert!(due.0 >= 100, "after the backoff: {due:?}");
        clock.set(due);
        assert_eq!(cell.handle_timeout(due), [(Lane::Room(1), vec![Sequence(0)])]);
        assert_eq!(wire.sent().last(), Some(&(Lane::Room(1), 0, 0, 2, 1)), "the same ordinal, its second attempt");
        assert_eq!(wire.payloads(), [2, 3, 1]);
        // A permanent failure: a dead letter whose tombstone goes out in the
        // same pass, and the pass goes on to the next record.
        wire.fail_next([Some(FailureKind::Permanent)]);
        cell.enqueue_after(Lane::Other, 30, egress_core::FlushEpoch(1)).expect("room");
        cell.enqueue(Lane::Other, 31).expect("room");
        cell.enqueue(Lane::Room(4), 40).expect("room");
        assert_eq!(cell.gated_len().get(), 1, "30 waits for the epoch, 31 behind it in its lane");
        assert_eq!(wire.payloads(), [2, 3, 1, 40], "room 3 does not wait");
        assert_eq!(cell.release(egress_core::FlushEpoch(1)), [(Lane::Other, 1)]);
        assert_eq!(cell.released().get(), egress_core::FlushEpoch(1));
        let last: Vec<u32> = wire.payloads().into_iter().skip(4).collect();
        assert_eq!(last, [30, 31], "the tombstone of 30 (Skip), then the rest of the pass");
        assert_eq!(cell.lane(&Lane::Other).exhausted_len().get(), 0, "skipped, not held");
    }

    fn a_reconnect_fences_the_old_attachment_and_the_new_one_replays_in_enqueue_order(cx) {
        let clock = ManualClock::new();
        let cell: LanesCellOf<Lane, u32, _> = LanesCellOf::with_options(&cx.handle(), policy(8), options(&clock));
        let old = Wire::default();
        let link = cell.attach(old.clone());
        cell.enqueue(Lane::Room(2), 20).expect("room");
        cell.enqueue(Lane::Room(1), 10).expect("room");
        cell.enqueue(Lane::Room(2), 21).expect("room");
        assert_eq!(old.payloads(), [20, 10]);
        let outcome = cell.reconnect(Generation(2));
        assert!(matches!(outcome, LanesReconnect::Advanced { replayed: 2, .. }), "{outcome:?}");
        assert!(link.is_fenced() && link.runs() == 0);
        assert!(matches!(link.complete(&Lane::Room(2), Sequence(0)), CompleteOutcome::StaleGeneration { .. }));
        let new = Wire::default();
        let link = cell.attach(new.clone());
        assert_eq!(link.generation(), Generation(2));
        assert_eq!(new.payloads(), [20, 10], "replayed in enqueue order; 21 still waits for 20");
        assert_eq!(old.payloads().len(), 2, "the fenced transport never sends again");
        cell.enqueue(Lane::Room(3), 30).expect("room");
        assert_eq!(new.payloads(), [20, 10, 30]);
        assert_eq!(old.payloads().len(), 2);
    }

    fn lane_readers_are_one_set_per_lane_while_in_use_and_reclaimed_after(cx) {
        let cell: LanesCellOf<Lane, u32, _> = LanesCellOf::new(&cx.handle(), policy(300));
        let held = cell.lane(&Lane::Room(1));
        let nodes = cx.node_count();
        let again = cell.lane(&Lane::Room(1));
        assert_eq!(cx.node_count(), nodes, "asked again: the same readers");
        assert_eq!(again.pending().created_at(), held.pending().created_at());
        drop(again);
        // Readers asked for and dropped, lane after lane: reclaimed.
        for room in 2..=250 {
            let readers = cell.lane(&Lane::Room(room));
            assert_eq!(readers.pending_len().get(), 0);
        }
        assert!(cx.node_count() < nodes + 600, "{} nodes after 249 dropped lanes' readers", cx.node_count() - nodes);
        // One reader kept of a dropped set keeps the set, and it follows.
        let kept = cell.lane(&Lane::Room(251)).pending_len().clone();
        for room in 2..=250 {
            let _ = cell.lane(&Lane::Room(room));
        }
        assert!(!held.pending_len().is_disposed() && !kept.is_disposed());
        cell.enqueue(Lane::Room(1), 1).expect("room");
        cell.enqueue(Lane::Room(251), 2).expect("room");
        assert_eq!((held.pending_len().get(), kept.get()), (1, 1));
    }

    fn unused_lane_readers_are_swept_once_the_set_has_doubled_not_before(cx) {
        let cell: LanesCellOf<Lane, u32, _> = LanesCellOf::new(&cx.handle(), policy(64));
        let base = cx.node_count();
        let _ = cell.lane(&Lane::Room(0));
        let per_lane = cx.node_count() - base;
        assert!(per_lane >= 12, "readers and triggers: {per_lane}");
        // Below 16 lanes' sets, nothing is swept: a sweep's cost is spread
        // over the calls that grew the set.
        for room in 1..16 {
            let _ = cell.lane(&Lane::Room(room));
        }
        assert_eq!(cx.node_count(), base + 16 * per_lane);
        // The 17th call finds 16 sets, none in use: swept, and its own made.
        let _ = cell.lane(&Lane::Room(16));
        assert_eq!(cx.node_count(), base + per_lane);
        let readers = cell.lane(&Lane::Room(16));
        assert_eq!(format!("{readers:?}"), "LaneReaders { .. }");
        drop(readers);
        // Ten sets held through a sweep: the next sweep waits until the
        // set has doubled from them (20), not before.
        let held: Vec<_> = (20..30).map(|room| cell.lane(&Lane::Room(room))).collect();
        for room in 30..35 {
            let _ = cell.lane(&Lane::Room(room));
        }
        assert_eq!(cx.node_count(), base + 16 * per_lane, "16 sets: 10 held, 6 not");
        let _ = cell.lane(&Lane::Room(35));
        assert_eq!(cx.node_count(), base + 11 * per_lane, "swept: the 10 held stay");
        for room in 36..45 {
            let _ = cell.lane(&Lane::Room(room));
        }
        assert_eq!(cx.node_count(), base + 20 * per_lane, "no sweep below twice the 10 kept");
        let _ = cell.lane(&Lane::Room(45));
        assert_eq!(cx.node_count(), base + 11 * per_lane);
        assert!(held.iter().all(|r| !r.pending().is_disposed()));
    }

    fn a_freed_lane_reads_as_no_lanes_and_its_readers_hear_of_it(cx) {
        let cell: LanesCellOf<Lane, u32, _> = LanesCellOf::new(&cx.handle(), policy(1));
        let room = cell.lane(&Lane::Room(1));
        let acked = watch!(cx, room.acked_through());
        let g = cell.generation().get();
        cell.enqueue(Lane::Room(1), 1).expect("room");
        cell.claim_with(g, |_| ());
        cell.complete(g, &Lane::Room(1), Sequence(0));
        assert_eq!((room.acked_through().get(), acked.get()), (Some(Sequence(0)), 1));
        // One lane at most: room 2 frees the idle room 1.
        let e = cell.enqueue(Lane::Room(2), 2).expect("an idle lane makes room");
        assert!(e.new_lane);
        assert_eq!(room.acked_through().get(), None, "no lane: no watermark");
        assert_eq!(acked.get(), 2, "and the effect over it re-ran");
        assert_eq!(cell.lane_count().get(), 1);
        // Now every lane is busy: refused, the payload back, nothing changed.
        let refused = cell.enqueue(Lane::Room(3), 3).expect_err("room 2 is busy");
        assert_eq!((refused.limit, refused.payload), (1, 3));
        let too_many = cell.try_enqueue(Lane::Room(3), 4).expect_err("room 2 is busy");
        assert_eq!(format!("{too_many:?}"), "TooManyLanes(1)");
        assert!(matches!(too_many, LanesRefused::TooManyLanes(t) if t.payload == 4));
        assert_eq!(cell.pending_len().get(), 1);
    }

    fn try_enqueue_refuses_at_capacity_and_gives_the_payload_back(cx) {
        let clock = ManualClock::new();
        let options = options(&clock).capacity(4);
        let cell: LanesCellOf<Lane, u32, _> = LanesCellOf::with_options(&cx.handle(), policy(8), options);
        let g = cell.generation().get();
        // One record in each state that holds one: pending, in flight,
        // parked, held (the strict lane holds its dead letters).
        cell.try_enqueue(Lane::Room(1), 1).expect("room");
        cell.try_enqueue(Lane::Room(1), 2).expect("room");
        cell.claim_with(g, |_| ());
        cell.try_enqueue(Lane::Room(2), 3).expect("room");
        cell.claim_with(g, |_| ());
        cell.fail_with(g, &Lane::Room(2), Sequence(0), FailureKind::Transient, JitterSample::ZERO);
        cell.try_enqueue(Lane::AccountData, 4).expect("room");
        cell.claim_with(g, |_| ());
        cell.fail_with(g, &Lane::AccountData, Sequence(0), FailureKind::Permanent, JitterSample::ZERO);
        let counts = (cell.pending_len().get(), cell.inflight_len().get(), cell.parked_len().get());
        assert_eq!((counts, cell.exhausted_len().get()), ((1, 1, 1), 1));
        let refused = cell.try_enqueue(Lane::Room(3), 5).expect_err("4 held: at capacity");
        assert_eq!(format!("{refused:?}"), "Full { capacity: 4 }");
        assert_eq!(refused.to_string(), "refused: 4 records are waiting to be acknowledged, the cell's capacity");
        assert!(matches!(refused, LanesRefused::Full { payload: 5, capacity: 4 }));
        assert_eq!((cell.pending_len().get(), cell.lane_count().get()), (1, 3), "nothing changed");
        // An acknowledgement makes room again.
        cell.complete(g, &Lane::Room(1), Sequence(0));
        cell.try_enqueue(Lane::Room(3), 5).expect("room again");
    }

    fn try_enqueue_refuses_what_the_store_cannot_encode_and_gives_it_back(cx) {
        let clock = ManualClock::new();
        let cell: LanesCellOf<Lane, u32, _> = LanesCellOf::with_options(&cx.handle(), policy(8), options(&clock));
        let check: egress_reactive::EncodeCheck<u32> =
            std::sync::Arc::new(|v: &u32| if *v == 13 { Err(format!("{v} has no encoding")) } else { Ok(()) });
        cell.set_encode_check(Some(check));
        let refused = cell.try_enqueue(Lane::Room(1), 13).expect_err("13 does not encode");
        assert_eq!(format!("{refused:?}"), "Unencodable { reason: \"13 has no encoding\" }");
        assert_eq!(refused.to_string(), "the payload does not encode: 13 has no encoding");
        assert!(matches!(refused, LanesRefused::Unencodable { payload: 13, .. }));
        assert_eq!((cell.pending_len().get(), cell.lane_count().get()), (0, 0), "nothing changed, no lane made");
        cell.try_enqueue(Lane::Room(1), 12).expect("12 encodes");
        // Removed, nothing is refused; plain enqueue never checks.
        cell.enqueue(Lane::Room(1), 13).expect("unchecked");
        cell.set_encode_check(None);
        cell.try_enqueue(Lane::Room(1), 13).expect("no check");
        assert_eq!(cell.pending_len().get(), 3);
    }

    fn a_panicking_transport_fails_its_record_which_goes_out_again(cx) {
        let clock = ManualClock::new();
        let cell: LanesCellOf<Lane, u32, _> = LanesCellOf::with_options(&cx.handle(), policy(8), options(&clock));
        let wire = Wire::default();
        *wire.panic_on.lock().expect("panic_on") = Some(1);
        let _link = cell.attach(wire.clone());
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cell.enqueue(Lane::Room(1), 1)));
        assert!(panicked.is_err(), "the panic reaches the caller");
        assert_eq!((cell.inflight_len().get(), cell.parked_len().get()), (0, 1), "failed, not left in flight");
        *wire.panic_on.lock().expect("panic_on") = None;
        let due = cell.poll_timeout().expect("parked");
        clock.set(due);
        cell.handle_timeout(due);
        assert_eq!(wire.payloads(), [1]);
        let failed = cell.fail_with(Generation(1), &Lane::Room(1), Sequence(0), FailureKind::Transient, JitterSample::ZERO);
        assert!(matches!(failed, FailOutcome::Retrying(_)), "{failed:?}");
        assert_eq!(cell.now(), due);
    }

    fn a_disposed_cell_fences_new_attachments_and_keeps_its_records(cx) {
        let cell: LanesCellOf<Lane, u32, _> = LanesCellOf::new(&cx.handle(), policy(8));
        let readers = cell.lane(&Lane::Room(1));
        cell.enqueue(Lane::Room(1), 1).expect("room");
        let live_wire = Wire::default();
        let live = cell.attach(live_wire.clone());
        assert!(!cell.is_disposed() && !live.is_fenced(), "a live cell, a live attachment");
        assert!(live.runs() >= 1, "its effect ran");
        assert_eq!(format!("{live:?}"), "LanesAttachment { generation: Generation(0), .. }");
        drop(live);
        cell.enqueue(Lane::Room(2), 7).expect("room");
        assert_eq!(live_wire.payloads(), [1], "a dropped attachment sends nothing more");
        cell.dispose();
        assert!(cell.is_disposed() && readers.pending_len().is_disposed());
        let wire = Wire::default();
        let link = cell.attach(wire.clone());
        assert!(link.is_fenced());
        cell.enqueue(Lane::Room(1), 2).expect("room");
        assert!(wire.sent().is_empty(), "a fenced attachment never sends");
        assert_eq!(cell.with_lanes(|l| (l.pending_len(), l.inflight_len())), (2, 1), "the records stay");
        let fresh = cell.lane(&Lane::Room(1));
        assert_eq!(fresh.pending_len().get(), 1, "readers made under the caller's owner read the lanes once");
        assert!(format!("{cell:?}").starts_with("LanesCell { generation: Generation(0)"), "{cell:?}");
        let other: LanesCellOf<Lane, u32, _> = LanesCellOf::new(&cx.handle(), policy(8));
        assert_ne!(cell.incarnation(), other.incarnation(), "each cell a new sequence space");
        let given = CellOptions::new().incarnation(egress_core::Incarnation(0xfeed));
        let given: LanesCellOf<Lane, u32, _> = LanesCellOf::with_options(&cx.handle(), policy(8), given);
        assert_eq!(given.incarnation(), egress_core::Incarnation(0xfeed));
    }

    fn durable_lanes_send_only_what_is_written_and_their_readers_show_the_journal(cx) {
        let lanes = Lanes::restore(policy(4), RestoredLanes::empty()).expect("nothing restores");
        let options = CellOptions::new().incarnation(Incarnation(9));
        let cell: LanesCellOf<Lane, u32, _> = LanesCellOf::from_lanes(&cx.handle(), lanes, options);
        assert_eq!(cell.incarnation(), Incarnation(9));
        let wire = Wire::default();
        let _link = cell.attach(wire.clone());
        let unpersisted = watch!(cx, cell.unpersisted_len());
        let error = watch!(cx, cell.persist_error());
        let durable = watch!(cx, cell.generation_durable());
        let journal = Counter::new();
        let _ = cx.effect({
            let (cell, journal) = (cell.clone(), journal.clone());
            move || {
                cell.track_journal();
                journal.hit();
            }
        });
        journal.reset();
        cell.enqueue(Lane::Room(1), 1).expect("room");
        cell.enqueue(Lane::Room(2), 2).expect("room");
        assert!(wire.sent().is_empty(), "nothing goes out before it is written");
        assert_eq!(cell.unpersisted_len().get(), 2);
        assert!(unpersisted.get() >= 1 && journal.get() >= 2, "{} {}", unpersisted.get(), journal.get());
        let (ready, appends) = cell.poll_ready().expect("two appends");
        assert_eq!(appends, vec![vec![(Sequence(0), 1)], vec![(Sequence(0), 2)]]);
        assert!(cell.poll_ready().is_none(), "one epoch at a time");
        let both = LanesPersisted::Recorded { lanes: vec![Lane::Room(1), Lane::Room(2)] };
        error.reset();
        assert_eq!(cell.persist_failed(ready.epoch, "disk full"), both);
        assert_eq!(cell.persist_error().get().map(|e| e.reason), Some("disk full".to_owned()));
        assert_eq!(error.get(), 1, "the error's reader heard of it");
        assert!(wire.sent().is_empty());
        let (again, appends) = cell.poll_ready().expect("written again");
        assert_eq!(appends.len(), 2);
        unpersisted.reset();
        assert_eq!(cell.persisted(again.epoch), both);
        assert_eq!(wire.payloads(), [1, 2], "sent once written, in enqueue order");
        assert_eq!((cell.persist_error().get(), cell.unpersisted_len().get()), (None, 0));
        assert!(unpersisted.get() >= 1);
        assert_eq!(cell.persisted(again.epoch), LanesPersisted::UnknownEpoch { epoch: again.epoch });
        // A new generation is stored before anything goes under it.
        durable.reset();
        let _ = cell.reconnect(Generation(1));
        assert!(!cell.generation_durable().get());
        let (stored, _) = cell.poll_ready().expect("the generation");
        assert_eq!(stored.generation, Some(Generation(1)));
        let _ = cell.persisted(stored.epoch);
        assert!(cell.generation_durable().get());
        assert_eq!(durable.get(), 2, "not durable, then durable");
    }

    fn lanes_without_a_journal_have_nothing_to_write(cx) {
        let cell: LanesCellOf<Lane, u32, _> = LanesCellOf::new(&cx.handle(), policy(4));
        cell.enqueue(Lane::Room(1), 1).expect("room");
        assert!(cell.poll_ready().is_none());
        assert_eq!((cell.persist_error().get(), cell.unpersisted_len().get()), (None, 0));
        assert!(cell.generation_durable().get());
        let epoch = egress_core::Epoch(0);
        assert_eq!(cell.persisted(epoch), LanesPersisted::UnknownEpoch { epoch });
        assert_eq!(cell.persist_failed(epoch, "no"), LanesPersisted::UnknownEpoch { epoch });
        assert_eq!(cell.persist_error().get(), None);
    }
}

/// A payload whose `Clone` panics while `FRAGILE` is set.
#[derive(Debug, PartialEq)]
struct Fragile(u32);

static FRAGILE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Clone for Fragile {
    fn clone(&self) -> Self {
        assert!(!FRAGILE.load(std::sync::atomic::Ordering::SeqCst), "no clone today");
        Fragile(self.0)
    }
}

#[test]
fn a_payload_clone_that_panics_in_poll_ready_fails_the_epoch_which_is_offered_again() {
    let cx = egress_reactive::Context::new();
    let lanes = Lanes::restore(policy(4), RestoredLanes::empty()).expect("nothing restores");
    let cell: LanesCellOf<Lane, Fragile, _> = LanesCellOf::from_lanes(&cx.handle(), lanes, CellOptions::new());
    cell.enqueue(Lane::Room(1), Fragile(1)).expect("room");
    FRAGILE.store(true, std::sync::atomic::Ordering::SeqCst);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cell.poll_ready()));
    FRAGILE.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(panicked.is_err(), "the panic goes on");
    let error = cell.persist_error().get().expect("shown");
    assert!(error.reason.contains("Clone panicked"), "{}", error.reason);
    let (ready, appends) = cell.poll_ready().expect("offered again");
    assert_eq!(appends, vec![vec![(Sequence(0), Fragile(1))]]);
    let _ = cell.persisted(ready.epoch);
    assert_eq!(cell.persist_error().get(), None);
}

#[test]
fn a_strict_lane_is_not_overtaken_while_its_head_backs_off() {
    let clock = ManualClock::new();
    let cx = egress_reactive::Context::new();
    let cell: LanesCellOf<Lane, u32, _> = LanesCellOf::with_options(&cx.handle(), policy(8), options(&clock));
    let wire = Wire::default();
    let _link = cell.attach(wire.clone());
    wire.fail_next([Some(FailureKind::RetryAfter(Delay(500)))]);
    cell.enqueue(Lane::AccountData, 1).expect("room");
    cell.enqueue(Lane::AccountData, 2).expect("room");
    cell.enqueue(Lane::Room(1), 3).expect("room");
    assert_eq!(wire.payloads(), [3], "the write behind the one backing off waits; the room goes on");
    let due = cell.poll_timeout().expect("parked");
    assert!(due >= Time(500), "{due:?}");
    clock.set(due);
    cell.handle_timeout(due);
    assert_eq!(wire.payloads(), [3, 1], "the first write, alone");
    cell.with_lanes(|l| assert_eq!(l.lane(&Lane::AccountData).map(egress_core::EgressCore::inflight_len), Some(1)));
}

thread_local! {
    /// Counts down the clones of a [`BombLane`] on this thread: the clone
    /// at 0 panics.
    static BOMB: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// A lane key whose `Clone` panics when [`BOMB`] counts down to it.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct BombLane(u8);

impl Clone for BombLane {
    fn clone(&self) -> Self {
        BOMB.with(|b| match b.get() {
            Some(0) => {
                b.set(None);
                panic!("a lane key's Clone panicked");
            }
            Some(n) => b.set(Some(n - 1)),
            None => {}
        });
        BombLane(self.0)
    }
}

impl LaneKey for BombLane {
    fn kind(&self) -> LaneKind {
        match self.0 {
            0 => LaneKind::Unordered(NonZeroUsize::new(2).expect("2")),
            _ => LaneKind::Serial,
        }
    }
}

/// Records each payload sent.
struct Collect(Arc<Mutex<Vec<u32>>>);

impl LanesTransport<BombLane, u32> for Collect {
    fn send(&mut self, item: LaneItem<BombLane, u32>) -> Result<(), SendError> {
        self.0.lock().expect("collect").push(item.envelope.payload);
        Ok(())
    }
}

/// On every flavour, apart from the main list (one `each_flavour!` a module).
mod bomb {
    use super::*;

    each_flavour! {
        fn a_lane_key_whose_clone_panics_never_leaves_a_record_in_flight_unsent(cx) {
            // The panic comes at every clone of the key in turn (in the
            // enqueue, the claim, the copy for the transport): wherever it
            // lands, a record in flight was handed to the transport, and the
            // readers show what the lanes hold.
            // Two records in a batch, in a serial lane and in an unordered one
            // (which can claim again after a claim: the release index takes
            // the lane back, once with a copy of its key, found by a hostile
            // review; now with none).
            for (lane, at) in [0u8, 1].into_iter().flat_map(|lane| (0..32).map(move |at| (lane, at))) {
                let clock = ManualClock::new();
                let cell: LanesCellOf<BombLane, u32, _> = LanesCellOf::with_options(&cx.handle(), policy(8), options(&clock));
                let sent = Arc::new(Mutex::new(Vec::new()));
                let _link = cell.attach(Collect(sent.clone()));
                BOMB.with(|b| b.set(Some(at)));
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    cx.batch(|| {
                        let _ = cell.enqueue(BombLane(lane), 10);
                        let _ = cell.enqueue(BombLane(lane), 11);
                    })
                }));
                BOMB.with(|b| b.set(None));
                let inflight = cell.with_lanes(|l| l.lanes().map(|(_, core)| core.inflight_len()).sum::<usize>());
                let sent = sent.lock().expect("collect").len();
                assert!(inflight <= sent, "lane {lane}, clone #{at}: {inflight} in flight, {sent} sent");
                assert_eq!(cell.inflight_len().get(), inflight, "lane {lane}, clone #{at}: the readers show the state");
            }
        }
    }
}
