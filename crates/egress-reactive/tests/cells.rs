//! Egress cells on every flavour: readers, exact invalidation, attachments,
//! failures, fencing and lifetimes. Each body runs on `EgressCell`
//! (Context), `ThreadSafeEgressCell` (ThreadSafeContext) and the
//! synchronous cell on an `AsyncContext`.

mod common;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, Weak};

use common::Counter;
use egress_core::{
    AckOutcome, Attempt, ClaimOutcome, DeadLetters, DeadReason, Delay, Envelope, FailOutcome, FailureKind, Generation,
    Incarnation, JitterSample, Ordering, Policy, ReceivedOutcome, ReconnectOutcome, Sequence, Time,
};
use egress_reactive::{CellOptions, EgressCellOf, ManualClock, SendError, Transport};

/// A transport that records what it sends, fails as scripted (one entry per
/// send: `None` succeeds), and lets tests watch when it is dropped.
#[derive(Clone, Default)]
struct Wire {
    sent: Arc<Mutex<Vec<Envelope<u32>>>>,
    script: Arc<Mutex<VecDeque<Option<FailureKind>>>>,
}

impl Wire {
    fn sent(&self) -> Vec<(u64, u64, u32)> {
        self.sent.lock().expect("wire").iter().map(|e| (e.generation.0, e.sequence.0, e.attempt.0)).collect()
    }
    fn sequences(&self) -> Vec<u64> {
        self.sent.lock().expect("wire").iter().map(|e| e.sequence.0).collect()
    }
    fn fail_next(&self, kinds: impl IntoIterator<Item = Option<FailureKind>>) {
        self.script.lock().expect("script").extend(kinds);
    }
    fn watch(&self) -> Weak<Mutex<Vec<Envelope<u32>>>> {
        Arc::downgrade(&self.sent)
    }
}

impl Transport<u32> for Wire {
    fn send(&mut self, envelope: Envelope<u32>) -> Result<(), SendError> {
        if let Some(Some(kind)) = self.script.lock().expect("script").pop_front() {
            return Err(SendError::new(kind, "scripted failure"));
        }
        self.sent.lock().expect("wire").push(envelope);
        Ok(())
    }
}

/// A transport that panics once, when `on` envelopes have gone out, and
/// otherwise sends on `wire`.
struct Panicky {
    wire: Wire,
    on: usize,
}

impl Transport<u32> for Panicky {
    fn send(&mut self, envelope: Envelope<u32>) -> Result<(), SendError> {
        let n = self.wire.sent.lock().expect("wire").len();
        if n == self.on {
            self.on = usize::MAX;
            panic!("the transport panics on send {n}");
        }
        self.wire.send(envelope)
    }
}

/// A payload whose `Clone` panics for 13.
#[derive(Debug, PartialEq)]
struct Bomb(u32);

impl Clone for Bomb {
    fn clone(&self) -> Self {
        assert!(self.0 != 13, "this payload cannot be copied");
        Bomb(self.0)
    }
}

struct BombWire(Arc<Mutex<Vec<u32>>>);

impl Transport<Bomb> for BombWire {
    fn send(&mut self, envelope: Envelope<Bomb>) -> Result<(), SendError> {
        self.0.lock().expect("sent").push(envelope.payload.0);
        Ok(())
    }
}

/// A payload whose clone panics while its flag is up.
#[derive(Debug)]
struct Fragile(u32, Arc<AtomicBool>);

impl Clone for Fragile {
    fn clone(&self) -> Self {
        assert!(!self.1.load(AtomicOrdering::Relaxed), "this payload cannot be copied now");
        Fragile(self.0, self.1.clone())
    }
}

/// A payload that counts its clones.
#[derive(Debug)]
struct Tally(u32, Arc<AtomicUsize>);

impl Clone for Tally {
    fn clone(&self) -> Self {
        self.1.fetch_add(1, AtomicOrdering::Relaxed);
        Tally(self.0, self.1.clone())
    }
}

/// A payload that counts the live instances of its kind.
#[derive(Debug)]
struct Live(Arc<AtomicUsize>);

impl Live {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, AtomicOrdering::Relaxed);
        Live(count.clone())
    }
}

impl Clone for Live {
    fn clone(&self) -> Self {
        Live::new(&self.0)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, AtomicOrdering::Relaxed);
    }
}

fn policy(window: usize) -> Policy {
    policy_with(window, DeadLetters::Skip)
}

fn policy_with(window: usize, dead_letters: DeadLetters) -> Policy {
    Policy::builder()
        .inflight_limit(window)
        .retry_budget(3)
        .retry_base(Delay(100))
        .retry_ceiling(Delay(1_000))
        .dead_letters(dead_letters)
        .build()
        .expect("valid policy")
}

fn options(clock: &ManualClock) -> CellOptions {
    CellOptions::new().generation(Generation(1)).clock(clock.clone()).jitter_seed(7)
}

/// One counting effect per reader: how many times each re-ran.
macro_rules! counters {
    ($cx:ident, $cell:ident: $($reader:ident),*) => {{
        let mut out = Vec::new();
        $(
            let hits = Counter::new();
            let _ = $cx.effect({
                let (r, hits) = ($cell.$reader().clone(), hits.clone());
                move || {
                    r.with(|_| ());
                    hits.hit();
                }
            });
            hits.reset();
            out.push((stringify!($reader), hits));
        )*
        out
    }};
}

fn fired(counters: &[(&'static str, Counter)]) -> Vec<&'static str> {
    let names = counters.iter().filter(|(_, c)| c.get() > 0).map(|(n, _)| *n).collect();
    for (_, c) in counters {
        c.reset();
    }
    names
}

/// A cell (window 4) with an attachment recording what it sends and
/// counters on its pending and in-flight counts: `(cell, wire,
/// attachment, counters)`.
macro_rules! attached_and_counted {
    ($cx:ident) => {{
        let clock = ManualClock::new();
        let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(&$cx.handle(), policy(4), options(&clock));
        let wire = Wire::default();
        let link = cell.attach(wire.clone());
        let c = counters!($cx, cell: pending_len, inflight_len);
        let _ = fired(&c);
        (cell, wire, link, c)
    }};
}

each_flavour! {
    fn readers_project_the_core(cx) {
        let clock = ManualClock::new();
        let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(&cx.handle(), policy(2), options(&clock));
        let seqs = cell.enqueue_all([10, 11, 12]);
        assert_eq!(seqs, Sequence(0)..Sequence(3));
        let g = Generation(1);
        let claimed = cell.claim_with(g, |o| match o {
            ClaimOutcome::Claimed(e) => Some((e.sequence, *e.payload)),
            _ => None,
        });
        assert_eq!(claimed, Some((Sequence(0), 10)));
        let pending: Vec<u32> = cell.pending().get().iter().map(|e| e.payload).collect();
        assert_eq!(pending, [11, 12]);
        assert_eq!(cell.inflight().get()[0].attempt, Attempt(1));
        assert_eq!((cell.pending_len().get(), cell.inflight_len().get(), cell.window_room().get()), (2, 1, 1));
        assert_eq!(cell.generation().get(), g);
        assert_eq!(cell.next_sequence(), Sequence(3));
        assert_eq!(cell.ack(g, Sequence(0)), AckOutcome::Advanced { through: Sequence(0) });
        assert_eq!(cell.acked_through().get(), Some(Sequence(0)));
        assert_eq!(cell.received_through().get(), Some(Sequence(0)), "an ack is a receipt too");
        assert_eq!(cell.inflight_len().get(), 0);
        // The window is a range above the watermark: 1 and 2 fit, 3 would not.
        assert_eq!(cell.window_room().get(), 2);
    }

    fn incarnations_are_minted_per_cell_or_given(cx) {
        let a: EgressCellOf<u32, _> = EgressCellOf::new(&cx.handle(), policy(2));
        let b: EgressCellOf<u32, _> = EgressCellOf::new(&cx.handle(), policy(2));
        assert_ne!(a.incarnation(), b.incarnation(), "each cell a new sequence space");
        assert_eq!(a.incarnation(), a.clone().incarnation());
        let given = CellOptions::new().incarnation(Incarnation(0xfeed));
        let c: EgressCellOf<u32, _> = EgressCellOf::with_options(&cx.handle(), policy(2), given);
        assert_eq!(c.incarnation(), Incarnation(0xfeed));
    }

    fn a_receipt_moves_held_records_back_in_flight_unsent(cx) {
        let clock = ManualClock::new();
        let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(&cx.handle(), policy(4), options(&clock));
        let c = counters!(cx, cell: pending, inflight, acked_through, received_through, generation, window_room);
        let wire = Wire::default();
        let link = cell.attach(wire.clone());
        cell.enqueue_all([10, 11, 12]);
        assert_eq!(wire.sequences(), [0, 1, 2]);
        let _ = fired(&c);
        // The connection dies; the receiver turns out to hold 0 and 1.
        drop(link);
        assert!(matches!(cell.reconnect(Generation(2)), ReconnectOutcome::Advanced { replayed: 3, .. }));
        assert_eq!(fired(&c), ["pending", "inflight", "generation"]);
        assert!(matches!(cell.received(Generation(2), Sequence(5)), ReceivedOutcome::Unsent { .. }));
        assert!(fired(&c).is_empty(), "a refused receipt changes nothing");
        assert_eq!(cell.received(Generation(2), Sequence(1)), ReceivedOutcome::Recorded { through: Sequence(1), moved: 2 });
        assert_eq!(fired(&c), ["pending", "inflight", "received_through"]);
        let new_wire = Wire::default();
        let _link = cell.attach(new_wire.clone());
        assert_eq!(new_wire.sequences(), [2], "only what the peer does not hold goes out again");
        assert_eq!(cell.received_through().get(), Some(Sequence(1)));
        assert_eq!(cell.acked_through().get(), None);
    }

    fn transitions_invalidate_exactly_their_readers(cx) {
        let clock = ManualClock::new();
        let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(&cx.handle(), policy(4), options(&clock));
        let c = counters!(cx, cell: pending, inflight, parked, exhausted, acked_through, retry, generation,
            pending_len, inflight_len, window_room, parked_len, exhausted_len);
        let g = Generation(1);
        cell.enqueue(1);
        assert_eq!(fired(&c), ["pending", "pending_len"]);
        cell.claim_with(g, |_| ());
        assert_eq!(fired(&c), ["pending", "inflight", "pending_len", "inflight_len", "window_room"]);
        // Refusals and no-ops invalidate nothing.
        assert!(matches!(cell.ack(Generation(0), Sequence(0)), AckOutcome::StaleGeneration { .. }));
        assert!(matches!(cell.ack(g, Sequence(9)), AckOutcome::Unsent { .. }));
        assert!(cell.claim_with(Generation(5), |o| o.refusal().is_some()));
        assert_eq!(cell.reconnect(g), ReconnectOutcome::Unchanged);
        assert!(fired(&c).is_empty());
        clock.set(Time(50));
        let failed = cell.fail_with(g, Sequence(0), FailureKind::Transient, JitterSample::ZERO);
        assert!(matches!(failed, FailOutcome::Retrying(r) if r.backoff == Delay(100)));
        // A retried record fits in the window again: the room is unchanged.
        assert_eq!(fired(&c), ["inflight", "parked", "retry", "inflight_len", "parked_len"]);
        assert_eq!(cell.parked().get()[0].due, Time(150));
        assert!(cell.handle_timeout(Time(149)).is_empty());
        assert!(fired(&c).is_empty());
        assert_eq!(cell.handle_timeout(Time(150)), [Sequence(0)]);
        assert_eq!(fired(&c), ["pending", "parked", "retry", "pending_len", "parked_len"]);
        assert!(matches!(cell.reconnect(Generation(2)), ReconnectOutcome::Advanced { replayed: 0, .. }));
        // Every pending envelope now carries the new generation.
        assert_eq!(fired(&c), ["pending", "generation"]);
        assert_eq!(cell.pending().get()[0].generation, Generation(2));
    }

    fn a_completion_above_a_gap_ends_isolation_recounts_the_room_and_wakes_the_attachment(cx) {
        // Three in flight when the connection dies, nothing acknowledged:
        // the next connection sends one at a time. Its probe 0 fails and
        // backs off; the next probe, 1, is then alone in flight.
        let isolating = |cell: &EgressCellOf<u32, _>| {
            cell.enqueue_all([10, 11, 12]);
            for _ in 0..3 {
                cell.claim_with(Generation(1), |_| ());
            }
            assert!(matches!(cell.reconnect(Generation(2)), ReconnectOutcome::Advanced { replayed: 3, .. }));
            let g = Generation(2);
            assert!(cell.claim_with(g, |o| matches!(o, ClaimOutcome::Claimed(e) if e.sequence == Sequence(0))));
            let failed = cell.fail_with(g, Sequence(0), FailureKind::Transient, JitterSample::ZERO);
            assert!(matches!(failed, FailOutcome::Retrying(_)), "{failed:?}");
            assert!(cell.claim_with(g, |o| matches!(o, ClaimOutcome::Claimed(e) if e.sequence == Sequence(1))));
            assert!(cell.claim_with(g, |o| matches!(o, ClaimOutcome::Isolating { probe: Sequence(1) })));
            assert_eq!(cell.window_room().get(), 0);
        };
        let g = Generation(2);
        let clock = ManualClock::new();
        let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(&cx.handle(), policy(4), options(&clock));
        isolating(&cell);
        let c = counters!(cx, cell: pending, inflight, parked, acked_through, generation,
            pending_len, inflight_len, window_room, parked_len);
        assert!(!cell.progressed(Generation(1), Sequence(1)), "an older generation's word");
        assert!(!cell.progressed(g, Sequence(0)), "0 is not in flight");
        assert!(!cell.progressed(g, Sequence(9)), "9 was never sent");
        assert!(fired(&c).is_empty(), "refusals change nothing");
        // 1 completed above the gap 0 leaves: progress, the window opens.
        assert!(cell.progressed(g, Sequence(1)));
        assert_eq!(fired(&c), ["window_room"], "only the room changed");
        assert_eq!(cell.window_room().get(), 1);
        assert!(!cell.progressed(g, Sequence(1)), "isolation already ended");
        assert!(fired(&c).is_empty());
        assert_eq!(cell.acked_through().get(), None, "neither watermark moves");

        // With an attachment waiting on the probe, the same word wakes it.
        let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(&cx.handle(), policy(4), options(&clock));
        isolating(&cell);
        let wire = Wire::default();
        let link = cell.attach(wire.clone());
        assert!(wire.sequences().is_empty(), "isolating: nothing goes");
        assert!(link.progressed(Sequence(1)));
        assert_eq!(wire.sequences(), [2], "woken: the window's room goes out");
        clock.set(Time(100));
        assert_eq!(cell.handle_timeout(Time(100)), [Sequence(0)]);
        assert_eq!(wire.sequences(), [2, 0], "the record below the gap, once due");
    }

    fn a_held_dead_letter_is_counted_by_its_own_reader(cx) {
        let policy = Policy::builder().inflight_limit(4).dead_letters(DeadLetters::Hold).build().expect("policy");
        let cell: EgressCellOf<u32, _> = EgressCellOf::new(&cx.handle(), policy);
        let c = counters!(cx, cell: exhausted, exhausted_len, pending_len, inflight_len);
        let g = cell.generation().get();
        cell.enqueue_all([7, 8]);
        cell.claim_with(g, |_| ());
        let _ = fired(&c);
        let failed = cell.fail_with(g, Sequence(0), FailureKind::Permanent, JitterSample::ZERO);
        assert!(matches!(failed, FailOutcome::Exhausted(_)), "{failed:?}");
        assert_eq!((cell.exhausted_len().get(), cell.inflight_len().get(), cell.pending_len().get()), (1, 0, 1));
        assert_eq!(fired(&c), ["exhausted", "exhausted_len", "inflight_len"]);
    }

    fn equality_cut_off_reaches_effects(cx) {
        let cell: EgressCellOf<u32, _> = EgressCellOf::new(&cx.handle(), policy(4));
        let busy = cx.computed({
            let n = cell.pending_len().clone();
            move || n.get() > 0
        });
        let runs = Counter::new();
        let _ = cx.effect({
            let (busy, runs) = (busy.clone(), runs.clone());
            move || {
                busy.get();
                runs.hit();
            }
        });
        for i in 0..5 {
            cell.enqueue(i);
        }
        assert_eq!(runs.get(), 2, "false at creation, true once");
        // One invalidation for a batch of records.
        let len_runs = Counter::new();
        let _ = cx.effect({
            let (n, hits) = (cell.pending_len().clone(), len_runs.clone());
            move || {
                n.get();
                hits.hit();
            }
        });
        cell.enqueue_all(0..100);
        assert_eq!(len_runs.get(), 2);
        assert_eq!(cell.pending_len().get(), 105);
    }

    fn an_attachment_sends_within_the_window_once_per_pass(cx) {
        let clock = ManualClock::new();
        let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(&cx.handle(), policy(4), options(&clock));
        cell.enqueue_all(0..10);
        let wire = Wire::default();
        let link = cell.attach(wire.clone());
        assert_eq!(wire.sequences(), [0, 1, 2, 3]);
        assert_eq!(link.runs(), 1, "its own claims do not re-run it");
        assert_eq!((cell.pending_len().get(), cell.inflight_len().get()), (6, 4));
        cell.enqueue(10);
        assert_eq!(link.runs(), 1, "an enqueue into a full window does not wake it");
        assert_eq!(link.ack(Sequence(1)), AckOutcome::Advanced { through: Sequence(1) });
        assert_eq!(wire.sequences(), [0, 1, 2, 3, 4, 5]);
        assert_eq!(link.runs(), 2);
        link.ack(Sequence(5));
        assert_eq!(wire.sequences(), (0..10).collect::<Vec<u64>>());
        assert_eq!(link.runs(), 3);
        link.ack(Sequence(9));
        assert_eq!(wire.sequences().len(), 11);
        assert_eq!(link.runs(), 4);
        link.ack(Sequence(10));
        assert_eq!(link.runs(), 4, "nothing left to claim: not woken");
        assert_eq!((cell.pending_len().get(), cell.inflight_len().get()), (0, 0));
        cell.enqueue(11);
        assert_eq!(link.runs(), 5);
        assert_eq!(wire.sent().last(), Some(&(1, 11, 1)));
    }

    fn an_enqueue_and_the_pass_it_runs_at_once_are_one_write(cx) {
        let clock = ManualClock::new();
        let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(&cx.handle(), policy(2), options(&clock));
        let wire = Wire::default();
        let link = cell.attach(wire.clone());
        let c = counters!(cx, cell: pending, inflight, pending_len, inflight_len, window_room);
        let _ = fired(&c);
        // Queued and claimed in one write: the pending count went 0, 1, 0
        // and notifies nobody; what the claim changed is notified once.
        cell.enqueue(1);
        assert_eq!(wire.sequences(), [0]);
        assert_eq!(fired(&c), ["pending", "inflight", "inflight_len", "window_room"]);
        assert_eq!((cell.pending_len().get(), cell.inflight_len().get(), cell.window_room().get()), (0, 1, 1));
        // Inside a batch the pass runs when the batch ends, after the
        // batch's writes are notified: the pending count's readers see 1,
        // then 0.
        cx.batch(|| cell.enqueue(2));
        assert_eq!(wire.sequences(), [0, 1]);
        assert_eq!(fired(&c), ["pending", "inflight", "pending_len", "inflight_len", "window_room"]);
        // Into a full window: no pass, the enqueue is notified alone.
        cell.enqueue(3);
        assert_eq!(fired(&c), ["pending", "pending_len"]);
        // An ack that reopens the window runs a pass as it always did.
        link.ack(Sequence(0));
        assert_eq!(wire.sequences(), [0, 1, 2]);
        assert_eq!(fired(&c), ["pending", "inflight", "pending_len"]);
        assert_eq!((cell.pending_len().get(), cell.inflight_len().get(), cell.window_room().get()), (0, 2, 0));
        // With the attachment gone, a wake runs no pass: the enqueue is
        // notified alone.
        drop(link);
        let _ = cell.reconnect(Generation(2));
        let _ = fired(&c);
        cell.enqueue(4);
        assert_eq!(fired(&c), ["pending", "pending_len"]);
        assert_eq!(cell.pending_len().get(), 3);
    }

    fn an_enqueue_from_a_cleanup_a_flush_runs_is_notified_at_once(cx) {
        // An effect's cleanup runs in the flush that re-runs the effect,
        // outside any batch or run, with the flush's queue in use: an
        // enqueue from there is notified on its own, and its pass queued
        // behind what is there.
        let (cell, wire, _link, c) = attached_and_counted!(cx);
        let go = cx.signal(0u32);
        let _effect = cx.effect({
            let (go, cell, h) = (go.clone(), cell.clone(), cx.handle());
            move || {
                let v = go.get();
                let cell = cell.clone();
                h.on_cleanup(move || {
                    cell.enqueue(v);
                });
            }
        });
        go.set(1);
        assert_eq!(wire.sent(), [(1, 0, 1)]);
        assert_eq!((cell.pending_len().get(), cell.inflight_len().get()), (0, 1));
        assert_eq!(fired(&c), ["pending_len", "inflight_len"]);
    }

    fn an_enqueue_from_a_batchs_settlement_is_notified_at_once(cx) {
        // A batch's end settles its writes, running a signal's equality
        // outside any batch, run or flush, with the writes still to settle:
        // an enqueue from there is notified on its own, before its pass.
        let (cell, wire, _link, c) = attached_and_counted!(cx);
        let calls = Arc::new(AtomicUsize::new(0));
        let same = cx.signal_with(0u32, {
            let (cell, calls) = (cell.clone(), calls.clone());
            move |a: &u32, b: &u32| {
                // The first call is the write's, inside the batch; the
                // second, the settlement's.
                if calls.fetch_add(1, AtomicOrdering::SeqCst) == 1 {
                    cell.enqueue(*b);
                }
                a == b
            }
        });
        cx.batch(|| same.set(7));
        assert!(calls.load(AtomicOrdering::SeqCst) >= 2);
        assert_eq!(wire.sent(), [(1, 0, 1)]);
        assert_eq!((cell.pending_len().get(), cell.inflight_len().get()), (0, 1));
        assert_eq!(fired(&c), ["pending_len", "inflight_len"]);
    }

    fn send_failures_become_fails_with_their_kind_and_the_clock(cx) {
        let clock = ManualClock::new();
        clock.set(Time(1_000));
        let hold = policy_with(8, DeadLetters::Hold);
        let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(&cx.handle(), hold, options(&clock));
        let wire = Wire::default();
        wire.fail_next([Some(FailureKind::Transient)]);
        let link = cell.attach(wire.clone());
        cell.enqueue_all(0..3);
        // The transient failure of 0 parks it and ends the pass.
        assert!(wire.sequences().is_empty());
        let parked = cell.parked().get();
        assert_eq!((parked[0].sequence, parked[0].due), (Sequence(0), Time(1_100)));
        assert_eq!(cell.retry().get().map(|r| r.sequence), Some(Sequence(0)));
        assert_eq!(cell.pending_len().get(), 2);
        assert_eq!(cell.timeout_in(), Some(std::time::Duration::from_millis(100)));
        // At the due time it is pending again, and the attachment resumes.
        clock.set(Time(1_100));
        cell.handle_timeout(cell.now());
        assert_eq!(wire.sent(), [(1, 0, 2), (1, 1, 1), (1, 2, 1)]);
        assert_eq!(cell.retry().get(), None);
        // A permanent failure makes a dead letter (held, by this policy) and
        // the pass goes on.
        wire.fail_next([Some(FailureKind::Permanent), None]);
        cell.enqueue_all([3, 4]);
        assert_eq!(cell.exhausted().get()[0].sequence, Sequence(3));
        assert_eq!(wire.sequences().last(), Some(&4));
        // A retry-after hint floors the backoff.
        wire.fail_next([Some(FailureKind::RetryAfter(Delay(5_000)))]);
        cell.enqueue(5);
        assert_eq!(cell.parked().get()[0].backoff, Delay(5_000));
        assert_eq!(cell.poll_timeout(), Some(Time(6_100)));
        // Requeue the dead letter: it goes out again.
        assert!(cell.requeue(link.generation(), Sequence(3)).refusal().is_none());
        assert_eq!(wire.sent().last(), Some(&(1, 3, 2)));
    }

    fn a_tombstone_that_keeps_failing_parks_for_its_backoff_rather_than_spinning(cx) {
        // A link that refuses the payload for good and fails every
        // tombstone: with no retry budget, a tombstone renewed at once
        // would be claimed again in the same pass, forever.
        struct Refusing(Arc<Mutex<u32>>);
        impl Transport<u32> for Refusing {
            fn send(&mut self, envelope: Envelope<u32>) -> Result<(), SendError> {
                let mut sends = self.0.lock().expect("sends");
                *sends += 1;
                assert!(*sends < 100, "a hot loop: {sends} sends");
                Err(match envelope.dead {
                    None => SendError::permanent("refused"),
                    Some(_) => SendError::transient("the link dropped it"),
                })
            }
        }
        let clock = ManualClock::new();
        let policy = Policy::builder().inflight_limit(8).retry_budget(0).retry_base(Delay(100)).build().expect("policy");
        let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(&cx.handle(), policy, options(&clock));
        let sends = Arc::new(Mutex::new(0));
        let _link = cell.attach(Refusing(sends.clone()));
        cell.enqueue(7);
        // The record, then its tombstone once: parked for its backoff, not
        // held (the receiver would wait on the gap), not sent again yet.
        assert_eq!(*sends.lock().expect("sends"), 2);
        assert_eq!(cell.parked().get().iter().map(|p| (p.sequence, p.due)).collect::<Vec<_>>(), [(
            Sequence(0),
            Time(100)
        )]);
        assert_eq!(cell.exhausted_len().get(), 0);
        assert_eq!(cell.retry().get().map(|r| r.exhausted), Some(false));
        // Due, it goes out once more, and parks again.
        clock.set(Time(100));
        cell.handle_timeout(cell.now());
        assert_eq!(*sends.lock().expect("sends"), 3);
        assert_eq!(cell.parked_len().get(), 1);
    }

    fn a_dead_letter_goes_out_as_a_tombstone_in_the_same_pass(cx) {
        let clock = ManualClock::new();
        let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(&cx.handle(), policy(8), options(&clock));
        let wire = Wire::default();
        let link = cell.attach(wire.clone());
        wire.fail_next([Some(FailureKind::Permanent)]);
        cell.enqueue_all([0, 1]);
        // 0 was refused for good: its tombstone follows in the same pass, in
        // its place, before 1; nothing is held.
        let sent = wire.sent.lock().expect("wire").clone();
        let shape: Vec<(u64, Option<DeadReason>)> = sent.iter().map(|e| (e.sequence.0, e.dead)).collect();
        assert_eq!(shape, [(0, Some(DeadReason::Permanent)), (1, None)]);
        assert_eq!((cell.exhausted_len().get(), cell.inflight_len().get()), (0, 2));
        assert_eq!(cell.retry().get().map(|r| r.exhausted), Some(true));
        assert_eq!(link.ack(Sequence(1)), AckOutcome::Advanced { through: Sequence(1) });
        assert_eq!(cell.retry().get(), None);
    }

    fn reconnect_fences_the_old_attachment_and_the_new_one_replays(cx) {
        let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(
            &cx.handle(), policy(3), CellOptions::new().generation(Generation(1)));
        let old_wire = Wire::default();
        let old = cell.attach(old_wire.clone());
        cell.enqueue_all(0..5);
        assert_eq!(old_wire.sequences(), [0, 1, 2]);
        old.ack(Sequence(0));
        assert_eq!(old_wire.sequences(), [0, 1, 2, 3]);
        let links = cx.link_count();
        assert!(matches!(cell.reconnect(Generation(2)), ReconnectOutcome::Advanced { replayed: 3, .. }));
        assert!(old.is_fenced());
        assert!(cx.link_count() < links, "the fenced effect left the graph");
        // Later changes neither wake nor reach it; its acks are refused.
        cell.enqueue(5);
        assert!(matches!(old.ack(Sequence(4)), AckOutcome::StaleGeneration { .. }));
        assert_eq!(old_wire.sequences(), [0, 1, 2, 3]);
        assert_eq!(old.runs(), 0);
        let new_wire = Wire::default();
        let new = cell.attach(new_wire.clone());
        assert_eq!(new.generation(), Generation(2));
        // The replay: what was in flight, in sequence order, attempt 2.
        assert_eq!(new_wire.sent(), [(2, 1, 2), (2, 2, 2), (2, 3, 2)]);
        new.ack(Sequence(3));
        assert_eq!(new_wire.sequences(), [1, 2, 3, 4, 5]);
        new.ack(Sequence(5));
        assert_eq!(cell.acked_through().get(), Some(Sequence(5)));
        assert_eq!(cell.inflight_len().get(), 0);
    }

    fn strict_ordering_holds_the_attachment_back(cx) {
        let strict = Policy::builder().inflight_limit(4).retry_budget(2).retry_base(Delay(10))
            .retry_ceiling(Delay(10)).ordering(Ordering::Strict).build().expect("policy");
        let clock = ManualClock::new();
        let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(&cx.handle(), strict, options(&clock));
        let wire = Wire::default();
        wire.fail_next([None, Some(FailureKind::Transient)]);
        let link = cell.attach(wire.clone());
        cell.enqueue_all(0..4);
        // 0 sent, 1 parked: 2 and 3 wait behind it.
        assert_eq!(wire.sequences(), [0]);
        link.ack(Sequence(0));
        assert_eq!(wire.sequences(), [0]);
        clock.set(Time(10));
        cell.handle_timeout(cell.now());
        assert_eq!(wire.sequences(), [0, 1, 2, 3]);
    }

    fn a_transport_may_acknowledge_from_inside_send(cx) {
        struct Echo<F: egress_reactive::Flavor> {
            cell: EgressCellOf<u32, F>,
            seen: Arc<Mutex<Vec<u64>>>,
        }
        impl<F: egress_reactive::CellFlavor<u32>> Transport<u32> for Echo<F> {
            fn send(&mut self, envelope: Envelope<u32>) -> Result<(), SendError> {
                self.seen.lock().expect("seen").push(envelope.sequence.0);
                self.cell.ack(envelope.generation, envelope.sequence);
                Ok(())
            }
        }
        let cell: EgressCellOf<u32, _> = EgressCellOf::new(&cx.handle(), policy(2));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let link = cell.attach(Echo { cell: cell.clone(), seen: seen.clone() });
        cell.enqueue_all(0..6);
        assert_eq!(*seen.lock().expect("seen"), [0, 1, 2, 3, 4, 5]);
        assert_eq!(cell.acked_through().get(), Some(Sequence(5)));
        drop(link);
        // The transport (and its clone of the cell) went with the attachment.
        assert_eq!(Arc::strong_count(&seen), 1);
    }

    fn dropping_attachments_and_cells_frees_their_nodes(cx) {
        let base = cx.node_count();
        let cell: EgressCellOf<u32, _> = EgressCellOf::new(&cx.handle(), policy(2));
        let _ = cell.pending().get();
        let wire = Wire::default();
        let watch = wire.watch();
        let link = cell.attach(wire);
        cell.enqueue(1);
        assert!(cx.node_count() > base);
        let with_link = cx.node_count();
        drop(link);
        assert_eq!(cx.node_count(), with_link - 1);
        assert!(watch.upgrade().is_none(), "the transport is dropped with its attachment");
        let reader = cell.pending_len().clone();
        drop(cell);
        assert_eq!(cx.node_count(), base);
        assert_eq!(cx.link_count(), 0);
        assert!(reader.try_get().is_err(), "a reader outliving its cell reads as disposed");
    }

    fn what_is_made_in_a_cells_scope_is_disposed_with_it(cx) {
        let cell: EgressCellOf<u32, _> = EgressCellOf::new(&cx.handle(), policy(2));
        let (flag, label) = cell
            .in_scope(|graph| {
                let flag = graph.signal(false);
                let label = graph.computed({
                    let (flag, pending) = (flag.clone(), cell.pending_len().clone());
                    move || format!("{} pending{}", pending.get(), if flag.get() { ", offline" } else { "" })
                });
                (flag, label)
            })
            .expect("the cell is alive");
        cell.enqueue(7);
        flag.set(true);
        assert_eq!(label.get(), "1 pending, offline");
        cell.dispose();
        assert!(flag.try_get().is_err() && label.try_get().is_err(), "disposed with the cell");
        assert!(cell.in_scope(|_| ()).is_err(), "a disposed cell owns nothing new");
    }

    fn a_disposed_cell_notifies_nobody_that_took_its_slots(cx) {
        // The cell's readers and triggers are freed; new signals, each
        // with a subscriber, take their slots. A transition of the disposed
        // cell reaches none of them.
        let cell: EgressCellOf<u32, _> = EgressCellOf::new(&cx.handle(), policy(2));
        // An attachment too: the wake the transitions mark is freed.
        let _link = cell.attach(Wire::default());
        let freed = cx.node_count();
        cell.dispose();
        let freed = freed - cx.node_count();
        assert!(freed > 0);
        let signals: Vec<_> = (0..freed + 8).map(|i| cx.signal(i)).collect();
        let runs = Counter::new();
        for s in &signals {
            cx.effect({ let (s, r) = (s.clone(), runs.clone()); move || { s.get(); r.hit(); } });
        }
        runs.reset();
        cell.enqueue_all([1, 2, 3]);
        assert_eq!(cell.with_core(|c| c.pending_len()), 3, "the transition applied");
        assert_eq!(runs.get(), 0, "and notified no node of the new ones");
        signals[0].set(100);
        assert_eq!(runs.get(), 1);
        // A status reader made now (outside the disposed cell's scope)
        // tracks none of the freed triggers, whose slots those signals hold.
        let status = cell.status(Sequence(0));
        assert!(status.get().is_some());
        assert_eq!(status.dependency_count(), 0);
        for s in &signals {
            s.set(s.get_untracked() + 1);
        }
        assert!(status.get().is_some());
        assert_eq!(status.runs(), 1, "no signal reaches it");
    }

    fn disposing_a_cell_frees_its_nodes_and_keeps_its_records(cx) {
        let base = cx.node_count();
        let cell: EgressCellOf<u32, _> = EgressCellOf::new(&cx.handle(), policy(2));
        let wire = Wire::default();
        let watch = wire.watch();
        let link = cell.attach(wire);
        cell.enqueue_all(0..3);
        assert!(!cell.is_disposed() && !link.is_fenced());
        let shown = format!("{link:?}");
        assert!(shown.contains(&format!("Attachment {{ generation: {:?}", link.generation())), "{shown}");
        let shown = format!("{cell:?}");
        for field in ["EgressCell", "next_sequence: Sequence(3)", "inflight: 2", "pending: 1"] {
            assert!(shown.contains(field), "{shown} shows {field}");
        }
        // A cell made without an incarnation draws all 128 bits of one.
        let other: EgressCellOf<u32, _> = EgressCellOf::new(&cx.handle(), policy(2));
        let (a, b) = (cell.incarnation().0, other.incarnation().0);
        assert!(a >> 64 != 0 && b >> 64 != 0 && a != b, "{a:032x} {b:032x}");
        other.dispose();
        cell.dispose();
        assert!(cell.is_disposed() && link.is_fenced());
        assert_eq!(cx.node_count(), base);
        assert!(watch.upgrade().is_none());
        assert!(cell.pending_len().try_get().is_err());
        // The records are still there, and transitions still apply.
        assert_eq!(cell.enqueue(3), Sequence(3));
        assert_eq!(cell.with_core(|c| c.pending_len() + c.inflight_len()), 4);
    }

    fn a_send_that_panics_fails_its_record_and_the_counts_agree(cx) {
        let clock = ManualClock::new();
        let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(&cx.handle(), policy(8), options(&clock));
        let wire = Wire::default();
        let link = cell.attach(Panicky { wire: wire.clone(), on: 1 });
        cell.enqueue(0);
        let hit = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cell.enqueue(1)));
        assert!(hit.is_err(), "the transport's panic reaches the caller whose change ran the pass");
        // 1 is not left in flight with nobody to send it: it failed (and
        // parked), and every count says what the core says.
        let core = cell.with_core(|c| (c.pending_len(), c.inflight_len(), c.parked_len()));
        assert_eq!(core, (0, 1, 1));
        assert_eq!((cell.pending_len().get(), cell.inflight_len().get(), cell.parked_len().get()), core);
        assert_eq!(cell.window_room().get(), cell.with_core(|c| c.window_room()));
        // The attachment lives on: at the due time 1 goes out again.
        assert!(!link.is_fenced());
        clock.set(Time(100));
        cell.handle_timeout(cell.now());
        assert_eq!(wire.sequences(), [0, 1]);
    }

    fn an_attach_whose_first_run_panics_leaves_no_effect_behind(cx) {
        let cell: EgressCellOf<u32, _> = EgressCellOf::new(&cx.handle(), policy(8));
        cell.enqueue(0);
        let base = cx.node_count();
        let wire = Wire::default();
        let attached = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cell.attach(Panicky { wire: wire.clone(), on: 0 })
        }));
        assert!(attached.is_err());
        assert_eq!(cx.node_count(), base, "its effect was disposed");
        // Nothing sends behind the caller's back.
        cell.enqueue(1);
        assert!(wire.sequences().is_empty());
        assert_eq!((cell.parked_len().get(), cell.pending_len().get()), (1, 1));
    }

    fn the_pending_reader_shares_its_copies_between_reads(cx) {
        let clock = ManualClock::new();
        let clones = Arc::new(AtomicUsize::new(0));
        let cell: EgressCellOf<Tally, _> = EgressCellOf::with_options(&cx.handle(), policy(8), options(&clock));
        let n = 2_000u32;
        let mut last = cell.pending().get();
        for i in 0..n {
            cell.enqueue(Tally(i, clones.clone()));
            let now = cell.pending().get();
            assert_eq!((now.len(), now.last().map(|e| e.payload.0)), (i as usize + 1, Some(i)));
            assert_eq!(last.len(), i as usize, "an earlier snapshot stays as it was");
            last = now;
        }
        // A read copies what joined since the one before, and merges copy a
        // record at most log2(4096) = 12 times more; reads that copied the
        // queue would have made n(n+1)/2 = 2,001,000 copies.
        let copied = clones.load(AtomicOrdering::Relaxed);
        assert!(copied <= n as usize * 13, "{copied} copies for {n} reads");
        assert!(last.iter().map(|e| e.payload.0).eq(0..n));
        // The reader stays the core's list through claims, a failure, a
        // reconnect and a requeue.
        let view = |cell: &EgressCellOf<Tally, _>| {
            let core = cell.with_core(|c| c.pending().map(|e| (e.generation, e.sequence, e.attempt, e.payload.0)).collect::<Vec<_>>());
            let read: Vec<_> = cell.pending().get().iter().map(|e| (e.generation, e.sequence, e.attempt, e.payload.0)).collect();
            assert_eq!(read, core);
            read
        };
        let g = Generation(1);
        for _ in 0..5 {
            cell.claim_with(g, |_| ());
        }
        assert_eq!(view(&cell)[0].1, Sequence(5));
        assert!(matches!(cell.fail(g, Sequence(2), FailureKind::Transient), FailOutcome::Retrying(_)));
        let _ = cell.handle_timeout(Time(u64::MAX / 2));
        assert_eq!(view(&cell)[..2].iter().map(|v| (v.1, v.2)).collect::<Vec<_>>(), [(Sequence(2), Attempt(1)), (Sequence(5), Attempt(0))]);
        assert!(matches!(cell.reconnect(Generation(2)), ReconnectOutcome::Advanced { .. }));
        let after = view(&cell);
        assert_eq!(after.len(), n as usize);
        assert!(after.iter().all(|v| v.0 == Generation(2)));
        cell.enqueue(Tally(n, clones.clone()));
        assert_eq!(view(&cell).last().map(|v| (v.1, v.3)), Some((Sequence(u64::from(n)), n)));
    }

    fn the_pending_reader_keeps_no_more_gone_payloads_alive_than_pending_ones(cx) {
        let clock = ManualClock::new();
        let live = Arc::new(AtomicUsize::new(0));
        let cell: EgressCellOf<Live, _> = EgressCellOf::with_options(&cx.handle(), policy(8), options(&clock));
        let n = 10_000u64;
        cell.enqueue_all((0..n).map(|_| Live::new(&live)));
        assert_eq!(cell.pending().get().len(), n as usize);
        assert_eq!(live.load(AtomicOrdering::Relaxed), 2 * n as usize, "the core's and the reader's");
        let g = Generation(1);
        for s in 0..n - 1 {
            cell.claim_with(g, |_| ());
            assert!(matches!(cell.ack(g, Sequence(s)), AckOutcome::Advanced { .. }));
            if s % 1_000 == 0 {
                assert_eq!(cell.pending().get().len(), (n - s - 1) as usize);
            }
        }
        // One record left: the reader copied it out of the chunk the others
        // left, and the snapshot before this read is gone.
        assert_eq!(cell.pending().get().len(), 1);
        assert_eq!(live.load(AtomicOrdering::Relaxed), 2, "{} payloads alive for one pending", live.load(AtomicOrdering::Relaxed));
    }

    fn a_payload_whose_clone_panics_during_a_pending_read_leaves_the_reader_true(cx) {
        let clock = ManualClock::new();
        let fragile = Arc::new(AtomicBool::new(false));
        let cell: EgressCellOf<Fragile, _> = EgressCellOf::with_options(&cx.handle(), policy(8), options(&clock));
        let core_list = |cell: &EgressCellOf<Fragile, _>| cell.with_core(|c| c.pending().map(|e| (e.sequence, e.payload.0)).collect::<Vec<_>>());
        let read_list = |cell: &EgressCellOf<Fragile, _>| cell.pending().get().iter().map(|e| (e.sequence, e.payload.0)).collect::<Vec<_>>();
        for i in 0..40u32 {
            cell.enqueue(Fragile(i, fragile.clone()));
        }
        let held = cell.pending().get();
        for round in 0..20u32 {
            cell.enqueue(Fragile(40 + round, fragile.clone()));
            if round % 4 == 1 {
                cell.claim_with(Generation(1), |_| ());
            }
            // Every third read meets a payload that cannot be copied.
            fragile.store(round % 3 == 0, AtomicOrdering::Relaxed);
            let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cell.pending().get().len()));
            fragile.store(false, AtomicOrdering::Relaxed);
            assert_eq!(read.is_err(), round % 3 == 0, "round {round}");
            assert_eq!(read_list(&cell), core_list(&cell), "round {round}: the next good read is the core's list");
        }
        assert_eq!(held.len(), 40, "a snapshot held through the panics stays as it was");
        assert!(held.iter().map(|e| e.payload.0).eq(0..40));
    }

    fn a_payload_whose_clone_panics_fails_its_record_and_the_counts_agree(cx) {
        let clock = ManualClock::new();
        let cell: EgressCellOf<Bomb, _> = EgressCellOf::with_options(&cx.handle(), policy(8), options(&clock));
        let sent = Arc::new(Mutex::new(Vec::new()));
        let link = cell.attach(BombWire(sent.clone()));
        cell.enqueue(Bomb(1));
        let hit = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cell.enqueue(Bomb(13))));
        assert!(hit.is_err());
        let core = cell.with_core(|c| (c.pending_len(), c.inflight_len(), c.parked_len()));
        assert_eq!(core, (0, 1, 1), "13 failed instead of sitting in flight unsent");
        assert_eq!((cell.pending_len().get(), cell.inflight_len().get(), cell.parked_len().get()), core);
        assert_eq!(*sent.lock().expect("sent"), [1]);
        assert!(!link.is_fenced());
    }

    fn an_attach_to_a_disposed_cell_is_fenced_from_the_start(cx) {
        let cell: EgressCellOf<u32, _> = EgressCellOf::new(&cx.handle(), policy(8));
        cell.dispose();
        let wire = Wire::default();
        let watch = wire.watch();
        let link = cell.attach(wire);
        assert!(link.is_fenced());
        assert!(watch.upgrade().is_none(), "the transport was dropped");
        cell.enqueue(0);
        assert_eq!(link.runs(), 0);
    }

    fn dropping_the_context_drops_transports(cx) {
        let cell: EgressCellOf<u32, _> = EgressCellOf::new(&cx.handle(), policy(2));
        let wire = Wire::default();
        let watch = wire.watch();
        let _link = cell.attach(wire);
        drop(cx);
        assert!(watch.upgrade().is_none());
        drop(cell);
    }

    fn the_jitter_generator_is_seeded(cx) {
        let jittery = Policy::builder().retry_base(Delay(1_000)).retry_ceiling(Delay(1_000)).jitter(0.5)
            .build().expect("policy");
        let backoffs = |seed: u64| {
            let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(
                &cx.handle(), jittery, CellOptions::new().jitter_seed(seed));
            (0..4).map(|i| {
                cell.enqueue(i);
                cell.claim_with(Generation(0), |_| ());
                match cell.fail(Generation(0), Sequence(u64::from(i)), FailureKind::Transient) {
                    FailOutcome::Retrying(r) => r.backoff.0,
                    other => panic!("unexpected {other:?}"),
                }
            }).collect::<Vec<_>>()
        };
        let a = backoffs(1);
        assert_eq!(a, backoffs(1));
        assert_ne!(a, backoffs(2));
        assert!(a.iter().all(|b| (1_000..=1_500).contains(b)), "{a:?}");
    }
}

#[test]
fn producers_on_eight_threads_lose_nothing() {
    let cx = egress_reactive::ThreadSafeContext::new();
    let cell: egress_reactive::ThreadSafeEgressCell<u32> = EgressCellOf::new(&cx.handle(), policy(16));
    let wire = Wire::default();
    let link = cell.attach(wire.clone());
    std::thread::scope(|s| {
        for t in 0..8u32 {
            let cell = cell.clone();
            s.spawn(move || {
                for i in 0..500 {
                    cell.enqueue(t * 1_000 + i);
                }
            });
        }
    });
    while cell.pending_len().get() + cell.inflight_len().get() > 0 {
        let last = wire.sent.lock().expect("wire").last().map(|e| e.sequence);
        link.ack(last.expect("something was sent"));
    }
    let sent = wire.sequences();
    assert_eq!(sent, (0..4_000).collect::<Vec<u64>>(), "each sequence once, in order");
    let mut payloads: Vec<u32> = wire.sent.lock().expect("wire").iter().map(|e| e.payload).collect();
    payloads.sort_unstable();
    let mut expected: Vec<u32> = (0..8).flat_map(|t| (0..500).map(move |i| t * 1_000 + i)).collect();
    expected.sort_unstable();
    assert_eq!(payloads, expected);
}

/// A transport that runs a closure (on `Context`, where it may hold `Rc`s).
struct Calls(Box<dyn FnMut(Envelope<u32>) -> Result<(), SendError>>);

impl Transport<u32> for Calls {
    fn send(&mut self, envelope: Envelope<u32>) -> Result<(), SendError> {
        (self.0)(envelope)
    }
}

/// The counts, the lists' lengths and the room as the readers say and as
/// the core says.
fn readers_and_core(cell: &EgressCellOf<u32, egress_reactive::Local>) -> [(usize, usize); 6] {
    let (p, i, r, k, x) =
        cell.with_core(|c| (c.pending_len(), c.inflight_len(), c.window_room(), c.parked_len(), c.exhausted_len()));
    [
        (cell.pending_len().get(), p),
        (cell.inflight_len().get(), i),
        (cell.window_room().get(), r),
        (cell.parked_len().get(), k),
        (cell.exhausted_len().get(), x),
        (cell.pending().get().len(), p),
    ]
}

fn agree(pairs: [(usize, usize); 6]) -> bool {
    pairs.iter().all(|(reader, core)| reader == core)
}

/// A send registers a cleanup that detaches the attachment, on the
/// attachment's run or (`in_a_scope`) on a scope the run made: the next
/// pass never runs (the cleanup disposes it as the run begins), so the
/// enqueue that woke it must notify on its own.
fn a_pass_whose_cleanup_detaches_the_attachment(in_a_scope: bool) {
    let cx = egress_reactive::Context::new();
    let h = cx.handle();
    let clock = ManualClock::new();
    let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(&h, policy(4), options(&clock));
    let slot = std::rc::Rc::new(std::cell::RefCell::new(None));
    let sent = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let scopes = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let transport = Calls(Box::new({
        let (h, slot, sent, scopes) = (h.clone(), slot.clone(), sent.clone(), scopes.clone());
        move |e| {
            sent.borrow_mut().push(e.sequence.0);
            let slot = slot.clone();
            let detach = move || drop(slot.borrow_mut().take());
            if in_a_scope {
                let (scope, ()) = h.scope(|| h.on_cleanup(detach));
                scopes.borrow_mut().push(scope);
            } else {
                h.on_cleanup(detach);
            }
            Ok(())
        }
    }));
    *slot.borrow_mut() = Some(cell.attach(transport));
    cell.enqueue(1);
    assert!(agree(readers_and_core(&cell)), "{:?}", readers_and_core(&cell));
    cell.enqueue(2);
    assert_eq!(*sent.borrow(), [0], "detached before its second pass");
    assert!(agree(readers_and_core(&cell)), "{:?}", readers_and_core(&cell));
    assert_eq!(cell.pending_len().get(), 1);
}

#[test]
fn a_pass_whose_cleanup_detaches_the_attachment_leaves_no_transition_unnotified() {
    a_pass_whose_cleanup_detaches_the_attachment(false);
}

#[test]
fn a_pass_whose_childs_cleanup_detaches_the_attachment_leaves_no_transition_unnotified() {
    a_pass_whose_cleanup_detaches_the_attachment(true);
}

#[test]
fn a_pass_whose_cleanup_panics_leaves_no_transition_unnotified() {
    // The cleanup panics as the next pass begins: the pass never runs, the
    // panic reaches the caller whose ack woke it, and the ack is notified.
    let cx = egress_reactive::Context::new();
    let h = cx.handle();
    let clock = ManualClock::new();
    let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(&h, policy(1), options(&clock));
    let armed = std::rc::Rc::new(std::cell::Cell::new(true));
    let transport = Calls(Box::new({
        let (h, armed) = (h.clone(), armed.clone());
        move |_| {
            let armed = armed.clone();
            h.on_cleanup(move || {
                if armed.replace(false) {
                    panic!("a cleanup panics");
                }
            });
            Ok(())
        }
    }));
    let link = cell.attach(transport);
    cell.enqueue_all([1, 2]);
    assert!(agree(readers_and_core(&cell)), "{:?}", readers_and_core(&cell));
    let acked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| link.ack(Sequence(0))));
    assert!(acked.is_err(), "the cleanup's panic reaches the caller");
    assert!(agree(readers_and_core(&cell)), "{:?}", readers_and_core(&cell));
    assert_eq!((cell.inflight_len().get(), cell.window_room().get()), (0, 1));
}

#[test]
fn the_readers_of_a_transition_one_with_its_pass_hear_of_it_after_the_pass_a_send_queued() {
    // docs/cells.md: the effects that read what such a transition changed
    // are queued when the pass ends, after any further pass its own sends
    // queued. The ack below reopens the window and runs a pass at once; its
    // send enqueues (which queues a second pass) and fails (which ends the
    // first). The effect over the in-flight count runs once, after the
    // second pass, and reads what it left.
    let cx = egress_reactive::Context::new();
    let h = cx.handle();
    let clock = ManualClock::new();
    let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(&h, policy(2), options(&clock));
    let log = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let transport = Calls(Box::new({
        let (cell, log) = (cell.clone(), log.clone());
        move |e| {
            log.borrow_mut().push(format!("send {}", e.payload));
            if e.payload == 2 {
                cell.enqueue(3);
                return Err(SendError::transient("refused"));
            }
            Ok(())
        }
    }));
    let _link = cell.attach(transport);
    let _screen = cx.effect({
        let (count, log) = (cell.inflight_len().clone(), log.clone());
        move || log.borrow_mut().push(format!("in flight {}", count.get()))
    });
    cell.enqueue_all([0, 1, 2]);
    log.borrow_mut().clear();
    assert_eq!(cell.ack(Generation(1), Sequence(1)), AckOutcome::Advanced { through: Sequence(1) });
    assert_eq!(*log.borrow(), ["send 2", "send 3", "in flight 1"]);
    assert!(agree(readers_and_core(&cell)), "{:?}", readers_and_core(&cell));
}

/// Triggers made on first need: their own module, for the flavour modules.
mod lazy_triggers {
    use super::*;

    each_flavour! {
        fn a_projection_has_a_trigger_once_a_reader_tracks_it(cx) {
            let h = cx.handle();
            let base = h.node_count();
            let cell: EgressCellOf<u32, _> = EgressCellOf::new(&h, policy(4));
            let built = h.node_count();
            // Transitions of projections no reader has read make nothing, and
            // the counts have no trigger.
            cell.enqueue_all([1, 2, 3]);
            assert_eq!(cell.pending_len().get(), 3);
            assert_eq!(h.node_count(), built);
            // A reader's first read makes its projection's trigger, once.
            assert_eq!(cell.pending().get().len(), 3);
            assert_eq!(h.node_count(), built + 1);
            assert_eq!(cell.pending().get().len(), 3);
            assert_eq!(h.node_count(), built + 1);
            // Two readers of one projection share its trigger.
            let _ = cell.durable_through().get();
            let _ = cell.generation_durable().get();
            assert_eq!(h.node_count(), built + 2);
            // The trigger notifies: the reader and an effect on it follow.
            let hits = watch!(cx, cell.pending());
            cell.enqueue(4);
            assert_eq!((cell.pending().get().len(), hits.get()), (4, 1));
            // A status reader makes the triggers of what it follows that no
            // reader made yet: every projection a status follows but pending
            // and durability.
            let status = cell.status(Sequence(0));
            assert_eq!(status.get(), Some(egress_core::MessageStatus::Queued));
            assert_eq!(h.node_count(), built + 2 + 1 + 1 + 5, "an effect, the status reader, five triggers");
            // The cell's disposal frees its triggers with the rest of it.
            cell.dispose();
            assert_eq!(h.node_count(), base + 1, "the effect is left");
        }

        fn a_trigger_a_reader_makes_while_its_cell_is_disposed_goes_with_it(cx) {
            let h = cx.handle();
            let base = h.node_count();
            let cell: EgressCellOf<u32, _> = EgressCellOf::new(&h, policy(4));
            let read = Arc::new(AtomicUsize::new(usize::MAX));
            // An effect in the cell's scope, made after its readers (so
            // disposed before them), whose cleanup is the first to read one.
            let made = cell.in_scope(|h| {
                h.effect({
                    let (h, cell, read) = (h.clone(), cell.clone(), read.clone());
                    move || {
                        let (cell, read) = (cell.clone(), read.clone());
                        h.on_cleanup(move || {
                            let acked = cell.acked_through().try_get();
                            read.store(acked.map_or(usize::MAX - 1, |a| a.map_or(0, |s| s.get() as usize + 1)), AtomicOrdering::SeqCst);
                        });
                    }
                })
            });
            let effect = made.expect("the cell is live");
            cell.dispose();
            assert_eq!(read.load(AtomicOrdering::SeqCst), 0, "the cleanup read the reader: nothing acknowledged");
            assert_eq!(h.node_count(), base, "the trigger the read made was freed with the cell");
            drop(effect);
        }

        fn a_first_read_while_the_core_is_read_makes_its_trigger(cx) {
            let h = cx.handle();
            let cell: EgressCellOf<u32, _> = EgressCellOf::new(&h, policy(4));
            cell.enqueue(1);
            let built = h.node_count();
            // Misuse `with_core`'s doc warns of, which a first read must
            // survive as later reads do: the state is borrowed meanwhile.
            let acked = cell.with_core(|_| cell.acked_through().get());
            assert_eq!(acked, None);
            assert_eq!(h.node_count(), built + 1, "one trigger, recorded");
            assert_eq!(cell.with_core(|_| cell.acked_through().get()), None);
            assert_eq!(h.node_count(), built + 1, "and found again");
        }
    }

    /// A payload whose `Clone` reads a reader of its own cell for the first
    /// time: a list reader's copy runs it with the cell's state borrowed.
    #[derive(Debug)]
    struct Sneaky(u32);

    thread_local! {
        static CELL: std::cell::RefCell<Option<EgressCellOf<Sneaky, egress_reactive::Local>>> =
            const { std::cell::RefCell::new(None) };
    }

    impl Clone for Sneaky {
        fn clone(&self) -> Self {
            CELL.with(|c| {
                if let Some(cell) = &*c.borrow() {
                    assert_eq!(cell.acked_through().get(), None);
                }
            });
            Sneaky(self.0)
        }
    }

    /// A payload whose `Clone` panics while `PANICS` is set.
    #[derive(Debug)]
    struct Brittle(u32);

    thread_local! {
        static PANICS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    impl Clone for Brittle {
        fn clone(&self) -> Self {
            assert!(!PANICS.with(std::cell::Cell::get), "a payload's Clone panics");
            Brittle(self.0)
        }
    }

    #[test]
    fn a_first_read_that_panics_in_user_code_keeps_the_trigger_it_made() {
        let cx = egress_reactive::Context::new();
        let h = cx.handle();
        let cell: EgressCellOf<Brittle, _> = EgressCellOf::new(&h, policy(4));
        cell.enqueue(Brittle(1));
        let built = h.node_count();
        PANICS.with(|p| p.set(true));
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cell.pending().get().len()));
        PANICS.with(|p| p.set(false));
        assert!(read.is_err(), "the payload's panic reaches the reader");
        assert_eq!(h.node_count(), built + 1, "the trigger was made and kept");
        // The next read makes no other, and the reader follows the cell.
        assert_eq!(cell.pending().get().len(), 1);
        cell.enqueue(Brittle(2));
        assert_eq!(cell.pending().get().len(), 2);
        assert_eq!(h.node_count(), built + 1);
    }

    #[test]
    fn a_first_read_from_a_payloads_clone_while_a_list_is_copied_makes_its_trigger() {
        let cx = egress_reactive::Context::new();
        let h = cx.handle();
        let cell: EgressCellOf<Sneaky, _> = EgressCellOf::new(&h, policy(4));
        cell.enqueue(Sneaky(1));
        CELL.with(|c| *c.borrow_mut() = Some(cell.clone()));
        let built = h.node_count();
        assert_eq!(cell.pending().get().len(), 1);
        assert_eq!(h.node_count(), built + 2, "the pending and acknowledgement triggers");
        CELL.with(|c| c.borrow_mut().take());
    }
}
