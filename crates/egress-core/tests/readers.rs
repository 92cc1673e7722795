#![allow(clippy::unwrap_used)]
//! The core's readers and change sets as a shell uses them: the window's
//! room through a claim, an ack, and isolation; what `enqueue_all` reports;
//! the `Changes` set's operations and its `Debug` form.

use egress_core::{Changes, EgressCore, Generation, Policy, Projection, Sequence};

#[test]
fn window_room_counts_what_the_window_still_admits() {
    let policy = Policy::builder().inflight_limit(4).build().unwrap();
    let mut core: EgressCore<&str> = EgressCore::new(policy);
    assert_eq!(core.window_room(), 4, "an empty window admits its limit");
    let _ = core.enqueue_all(["a", "b", "c", "d", "e"]);
    let g = core.generation();
    let _ = core.claim(g);
    let _ = core.claim(g);
    assert_eq!(core.window_room(), 2, "two sent, two more fit");
    let _ = core.ack(g, Sequence(0));
    assert_eq!(core.window_room(), 3, "an ack moves the window");
    // The ack was progress, so the first reconnect sends freely; a second
    // one with records in flight and no progress since sends a suspect
    // alone: one fits, and none while the probe is out.
    let _ = core.reconnect(Generation(g.0 + 1));
    let g = core.generation();
    assert_eq!(core.window_room(), 3, "after progress, the whole window");
    let _ = core.claim(g);
    let _ = core.reconnect(Generation(g.0 + 1));
    let g = core.generation();
    assert_eq!(core.window_room(), 1, "isolating: one at a time");
    let _ = core.claim(g);
    assert_eq!(core.window_room(), 0, "the probe is out");
}

#[test]
fn enqueue_all_reports_pending_only_when_it_queued_something() {
    let mut core: EgressCore<&str> = EgressCore::new(Policy::default());
    let none = core.enqueue_all(Vec::new());
    assert_eq!((none.outcome, none.changes), (Sequence(0)..Sequence(0), Changes::NONE));
    let two = core.enqueue_all(["a", "b"]);
    assert_eq!((two.outcome, two.changes), (Sequence(0)..Sequence(2), Changes::NONE.with(Projection::Pending)));
}

#[test]
fn changes_unite_collect_and_print_as_sets() {
    let a = Changes::NONE.with(Projection::Pending).with(Projection::Inflight);
    let b = Changes::NONE.with(Projection::Inflight).with(Projection::Retry);
    let both = a.union(b);
    assert_eq!(both.iter().collect::<Vec<_>>(), [Projection::Pending, Projection::Inflight, Projection::Retry]);
    assert!(both.contains(Projection::Inflight), "a projection in both stays");
    let collected: Changes = [Projection::Retry, Projection::Pending].into_iter().collect();
    assert_eq!(collected, Changes::NONE.with(Projection::Pending).with(Projection::Retry));
    assert_eq!(format!("{a:?}"), "{Pending, Inflight}");
    assert_eq!(format!("{:?}", Changes::NONE), "{}");
}

#[test]
fn a_tombstone_says_so_and_a_live_record_does_not() {
    use egress_core::{DeadLetters, FailureKind, JitterSample, Time};
    let policy = Policy::builder().retry_budget(0).dead_letters(DeadLetters::Skip).build().unwrap();
    let mut core: EgressCore<&str> = EgressCore::new(policy);
    let _ = core.enqueue_all(["a", "b"]);
    let g = core.generation();
    let _ = core.claim(g);
    let _ = core.fail(g, Sequence(0), FailureKind::Transient, Time(0), JitterSample::ZERO);
    let tombstones: Vec<(u64, bool)> = core.pending().map(|e| (e.sequence.0, e.is_tombstone())).collect();
    assert_eq!(tombstones, [(0, true), (1, false)]);
}

#[test]
fn pending_knows_its_length_across_fresh_and_returned_records() {
    use egress_core::{FailureKind, JitterSample, Time};
    let mut core: EgressCore<&str> = EgressCore::new(Policy::default());
    let _ = core.enqueue_all(["a", "b", "c"]);
    let g = core.generation();
    let _ = core.claim(g);
    let _ = core.fail(g, Sequence(0), FailureKind::Permanent, Time(0), JitterSample::ZERO);
    // Sequence 0 came back (as a tombstone); 1 and 2 were never sent.
    let pending = core.pending();
    assert_eq!((pending.size_hint(), pending.len()), ((3, Some(3)), 3));
    assert_eq!(core.pending().map(|e| e.sequence.0).collect::<Vec<_>>(), [0, 1, 2]);
}

#[test]
fn dead_reasons_read_as_words() {
    use egress_core::DeadReason;
    let words: Vec<String> = DeadReason::ALL.iter().map(ToString::to_string).collect();
    assert_eq!(words, ["refused permanently", "retry budget spent", "replay limit reached"]);
}
