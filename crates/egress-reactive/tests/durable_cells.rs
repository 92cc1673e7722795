#![allow(clippy::unwrap_used)]
//! A cell over a journaled core, as a chat screen shows it: a message's
//! status goes saving, (queued,) sending, acknowledged, one notification
//! per settled change, and never vanishes; the durability readers follow
//! the journal.

use std::cell::RefCell;
use std::rc::Rc;

use egress_core::{EgressCore, FailureKind, MessageStatus as M, Policy, Restored, Sequence};
use egress_reactive::{CellOptions, Context, EgressCell, SendError, Transport};

struct Wire(Rc<RefCell<Vec<u64>>>);

impl Transport<String> for Wire {
    fn send(&mut self, envelope: egress_core::Envelope<String>) -> Result<(), SendError> {
        self.0.borrow_mut().push(envelope.sequence.0);
        Ok(())
    }
}

#[test]
fn a_message_status_walks_from_saving_to_acknowledged_and_stays() {
    let cx = Context::new();
    let core = EgressCore::restore(Policy::default(), Restored::empty()).unwrap();
    let cell: EgressCell<String> = EgressCell::from_core(&cx.handle(), core, CellOptions::new());
    let wire = Rc::new(RefCell::new(Vec::new()));
    let link = cell.attach(Wire(wire.clone()));
    let seen = Rc::new(RefCell::new(Vec::new()));
    let status = cell.status(Sequence(0));
    let saving = cell.unpersisted_len().clone();
    cx.effect({
        let (status, seen, saving) = (status.clone(), seen.clone(), saving.clone());
        move || seen.borrow_mut().push((status.get(), saving.get()))
    });
    cell.enqueue("hello".into());
    assert!(wire.borrow().is_empty(), "not sent before it is durable");
    let (ready, appends) = cell.poll_ready().unwrap();
    assert_eq!(appends, [(Sequence(0), "hello".to_string())]);
    let _ = cell.persisted(ready.epoch);
    assert_eq!(*wire.borrow(), [0], "sent once durable");
    assert_eq!(cell.durable_through().get(), Some(Sequence(0)));
    let _ = link.ack(Sequence(0));
    // Unrelated traffic does not re-notify a settled status.
    cell.enqueue("later".into());
    let (ready, _) = cell.poll_ready().unwrap();
    let _ = cell.persisted(ready.epoch);
    assert_eq!(
        *seen.borrow(),
        [
            // Journaled, a sequence not yet taken may be in the store.
            (Some(M::Saving), 0),
            (Some(M::Saving), 1),
            // Durable, then claimed by the attachment it woke, in one
            // flush: the attachment runs before the screen's effect, which
            // sees the claim (one redraw, not a queued then a sending).
            (Some(M::Sending), 0),
            (Some(M::Acknowledged), 0),
            (Some(M::Acknowledged), 1),
            (Some(M::Acknowledged), 0)
        ],
    );
    // (The effect ran exactly once per change of what it reads: the status
    // reader recomputes on every transition of its projections, O(log n),
    // and cuts off by equality.)
    assert!(status.runs() >= 5);
    // A failure is shown as retrying; a permanent one as dead.
    let later = cell.status(Sequence(1));
    assert_eq!(later.get(), Some(M::Sending));
    let _ = link.fail(Sequence(1), FailureKind::Transient);
    assert_eq!(later.get(), Some(M::Retrying));
}

#[test]
fn a_cell_says_what_its_restore_found_and_a_new_one_says_nothing() {
    use egress_core::{DeadMark, DeadReason, Generation, RestoredRecord};
    let cx = Context::new();
    let rec = |s: u64, dead: Option<DeadMark>| RestoredRecord { sequence: Sequence(s), payload: format!("m{s}"), dead };
    let tomb = DeadMark { reason: DeadReason::Retries, held: false };
    let held = DeadMark { reason: DeadReason::Permanent, held: true };
    let snapshot = Restored {
        generation: Generation(7),
        next_sequence: Sequence(6),
        acked_through: Some(Sequence(1)),
        records: vec![rec(2, None), rec(3, None), rec(4, Some(tomb)), rec(5, Some(held))],
        skipped: vec![],
    };
    let core = EgressCore::restore(Policy::default(), snapshot).unwrap();
    let cell: EgressCell<String> = EgressCell::from_core(&cx.handle(), core, CellOptions::new());
    let found = cell.recovered().expect("restored");
    assert_eq!(
        (found.generation, found.next_sequence, found.acked_through, found.pending, found.tombstones, found.held),
        (Generation(7), Sequence(6), Some(Sequence(1)), 3, 1, 1)
    );
    cell.enqueue("later".into());
    assert_eq!(cell.recovered(), Some(found), "it does not change afterwards");
    let fresh: EgressCell<String> = EgressCell::new(&cx.handle(), Policy::default());
    assert_eq!(fresh.recovered(), None);
}

#[test]
fn a_status_reader_is_one_per_sequence_while_held_and_reclaimed_once_dropped() {
    let cx = Context::new();
    let cell: EgressCell<String> = EgressCell::new(&cx.handle(), Policy::default());
    let held = cell.status(Sequence(3));
    let nodes = cx.node_count();
    // Asked again (a redraw): the same reader, no new node.
    let again = cell.status(Sequence(3));
    assert_eq!(cx.node_count(), nodes);
    assert_eq!(again.created_at(), held.created_at(), "made once, where it was first asked for");
    drop(again);
    // A screen that asks for thousands of statuses and drops each: the
    // readers no one holds are reclaimed, so the graph stays bounded.
    for s in 100..5_100 {
        let status = cell.status(Sequence(s));
        assert_eq!(status.get(), None);
    }
    assert!(cx.node_count() < nodes + 200, "{} nodes after 5,000 dropped statuses", cx.node_count() - nodes);
    // The held reader survived every sweep and still follows the cell.
    assert!(!held.is_disposed());
    assert_eq!(held.get(), None);
    cell.enqueue_all((0..4).map(|i| format!("m{i}")));
    assert_eq!(held.get(), Some(M::Queued));
}

#[test]
fn a_status_reader_is_the_cells_not_the_scope_it_was_asked_in_and_goes_with_the_cell() {
    let cx = Context::new();
    let cell: EgressCell<String> = EgressCell::new(&cx.handle(), Policy::default());
    cell.enqueue("m0".into());
    // Asked for inside a scope that is then disposed: the reader lives on,
    // since it is the cell's (and another caller may hold it).
    let (scope, status) = cx.scope(|| cell.status(Sequence(0)));
    scope.dispose();
    assert!(!status.is_disposed());
    assert_eq!(status.get(), Some(M::Queued));
    // Disposed by a caller anyway: the next call gives a live reader.
    status.dispose();
    let fresh = cell.status(Sequence(0));
    assert!(!fresh.is_disposed());
    assert_eq!(fresh.get(), Some(M::Queued));
    // The cell's disposal takes its readers with it.
    cell.dispose();
    assert!(fresh.is_disposed());
}

#[test]
fn status_readers_no_one_holds_are_disposed_at_a_sweep_once_the_set_has_doubled() {
    let cx = Context::new();
    let cell: EgressCell<String> = EgressCell::new(&cx.handle(), Policy::default());
    let base = cx.node_count();
    // 64 readers asked for and dropped: kept while the set is below 64...
    for s in 0..64 {
        drop(cell.status(Sequence(s)));
    }
    assert_eq!(cx.node_count(), base + 64);
    // ...and the next call sweeps them all away.
    let mut held = vec![cell.status(Sequence(64))];
    assert_eq!(cx.node_count(), base + 1);
    for s in 65..128 {
        held.push(cell.status(Sequence(s)));
    }
    assert_eq!(cx.node_count(), base + 64);
    // A sweep keeps what is held (all 64 here), and the next waits until
    // the set has doubled, to 128.
    for s in 128..192 {
        drop(cell.status(Sequence(s)));
    }
    assert_eq!(cx.node_count(), base + 128, "no sweep before the set doubles");
    drop(cell.status(Sequence(192)));
    assert_eq!(cx.node_count(), base + 65, "the dropped 64 swept, the held 64 kept, one new");
    assert!(held.iter().all(|r| !r.is_disposed()));
}

#[test]
fn a_held_status_reader_survives_the_sweeps_on_the_thread_safe_flavour_too() {
    // A handle is what holds a reader: counted through the flavour's own
    // shared pointer (an `Arc` here), so this is the thread-safe twin of
    // the test above, with no computation reading the reader.
    use egress_reactive::{ThreadSafeContext, ThreadSafeEgressCell};
    let cx = ThreadSafeContext::new();
    let cell: ThreadSafeEgressCell<String> = ThreadSafeEgressCell::new(&cx, Policy::default());
    let held = cell.status(Sequence(3));
    let base = cx.node_count();
    for s in 100..400 {
        drop(cell.status(Sequence(s)));
    }
    assert!(cx.node_count() < base + 130, "{} nodes after 300 dropped statuses", cx.node_count() - base);
    assert!(!held.is_disposed(), "a held reader was swept");
    cell.enqueue_all((0..4).map(|i| format!("m{i}")));
    assert_eq!(held.get(), Some(M::Queued));
}

#[test]
fn threads_asking_for_one_status_together_share_one_reader() {
    use egress_reactive::{ThreadSafeContext, ThreadSafeEgressCell};
    let cx = ThreadSafeContext::new();
    let cell: ThreadSafeEgressCell<String> = ThreadSafeEgressCell::new(&cx, Policy::default());
    let base = cx.node_count();
    let barrier = std::sync::Barrier::new(4);
    let readers: Vec<_> = std::thread::scope(|s| {
        let asks: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    (0..50).map(|i| cell.status(Sequence(i))).collect::<Vec<_>>()
                })
            })
            .collect();
        asks.into_iter().map(|a| a.join().expect("no panic")).collect()
    });
    assert_eq!(cx.node_count(), base + 50, "one reader per sequence, whichever thread asked first");
    cell.enqueue("m0".into());
    assert!(readers.iter().all(|r| r[0].get() == Some(M::Queued)));
}

#[test]
fn effects_that_ask_for_statuses_and_drop_the_handles_keep_following_them() {
    use egress_core::Envelope;
    struct Sink;
    impl Transport<String> for Sink {
        fn send(&mut self, _: Envelope<String>) -> Result<(), SendError> {
            Ok(())
        }
    }
    let cx = Context::new();
    let policy = Policy::builder().inflight_limit(128).build().unwrap();
    let cell: EgressCell<String> = EgressCell::new(&cx.handle(), policy);
    cell.enqueue_all((0..70).map(|i| format!("m{i}")));
    // One effect per row of a list, each asking for its message's status
    // and dropping the handle: 70 rows, past the first sweep.
    let shown = Rc::new(RefCell::new(vec![None; 70]));
    let rows: Vec<_> = (0..70u64)
        .map(|i| {
            let (cell, shown) = (cell.clone(), shown.clone());
            cx.effect(move || {
                let status = cell.status(Sequence(i)).get();
                shown.borrow_mut()[i as usize] = status;
            })
        })
        .collect();
    assert!(shown.borrow().iter().all(|s| *s == Some(M::Queued)));
    // And unrelated code asks for a hundred other statuses and drops them.
    for s in 1_000..1_100 {
        drop(cell.status(Sequence(s)));
    }
    // Every row follows its message: the readers the effects read were
    // not swept away under them.
    let _link = cell.attach(Sink);
    assert!(shown.borrow().iter().all(|s| *s == Some(M::Sending)), "{:?}", shown.borrow());
    // A redraw (each effect runs again) makes no new reader. (The
    // generation is read first: a reader's first read makes its trigger.)
    let generation = cell.generation().get();
    let nodes = cx.node_count();
    cell.enqueue("more".into());
    let _ = cell.ack(generation, Sequence(69));
    assert!(shown.borrow().iter().all(|s| *s == Some(M::Acknowledged)));
    assert_eq!(cx.node_count(), nodes, "the rows' readers are the same ones");
    drop(rows);
}
