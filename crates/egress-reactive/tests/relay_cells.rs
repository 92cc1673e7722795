//! The relay cell on every flavour: readers that follow the relay and
//! notify only on change; the drain into an egress cell (bounded by what
//! waits in the cell and by its capacity, putting back what a racing
//! producer's fill refused, counting what the cell refuses for good, a
//! panicking check); the converged egress equal to the flat fold of every
//! op for random schedules; refusals of a drain that cannot be.
#![allow(clippy::unwrap_used)]

mod common;

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use egress_core::{
    Backpressure, ClaimOutcome, Generation, KeepLatest, MergePolicy, Overflow, Policy, RawFifo, SendRefused, Sent,
    Sequence, Sum, Water,
};
use egress_reactive::{CellOptions, DrainRefused, EgressCellOf, RelayCellOf};
use proptest::prelude::*;

fn nz(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap()
}

fn conflating(high: u64, low: u64) -> Backpressure {
    Backpressure::count(Water::new(high, low), Overflow::Conflate)
}

/// Claims the next pending record of `cell` by hand: its payload.
fn claim<T: Clone + 'static, F: egress_reactive::CellFlavor<T>>(cell: &EgressCellOf<T, F>) -> Option<(Sequence, T)> {
    cell.claim_with(cell.generation().get(), |outcome| match outcome {
        ClaimOutcome::Claimed(e) => Some((e.sequence, (*e.payload).clone())),
        _ => None,
    })
}

thread_local! {
    /// What a check runs to race the drain (see
    /// `an_entry_refused_as_full_by_a_racing_fill_goes_back_in_front`).
    static RACE: std::cell::RefCell<Option<Box<dyn Fn()>>> = const { std::cell::RefCell::new(None) };
}

#[test]
fn a_drain_into_a_cell_of_another_graph_is_refused() {
    let (a, b) = (egress_reactive::Context::new(), egress_reactive::Context::new());
    let relay = RelayCellOf::new(&a, Sum, conflating(2, 0)).unwrap();
    let cell = EgressCellOf::<u64, _>::new(&b, Policy::default());
    assert_eq!(relay.drain_into(&cell, nz(1)).map(|_| ()), Err(DrainRefused::OtherGraph));
    let (a, b) = (egress_reactive::ThreadSafeContext::new(), egress_reactive::ThreadSafeContext::new());
    let relay = RelayCellOf::new(&a, Sum, conflating(2, 0)).unwrap();
    let cell = EgressCellOf::<u64, _>::new(&b, Policy::default());
    assert_eq!(relay.drain_into(&cell, nz(1)).map(|_| ()), Err(DrainRefused::OtherGraph));
    let same = EgressCellOf::<u64, _>::new(&a, Policy::default());
    assert!(relay.drain_into(&same, nz(1)).is_ok());
}

each_flavour! {
    fn readers_follow_the_relay_and_notify_only_when_their_value_changes(cx) {
        let relay = RelayCellOf::new(&cx, Sum, conflating(2, 0)).unwrap();
        let depth = watch!(cx, relay.depth());
        let full = watch!(cx, relay.is_full());
        let conflated = watch!(cx, relay.conflated());
        assert_eq!(relay.send(1u64), Ok(Sent::Accepted));
        assert_eq!((depth.get(), full.get(), conflated.get()), (1, 0, 0));
        assert_eq!(relay.send(2), Ok(Sent::Accepted));
        assert_eq!((depth.get(), full.get(), conflated.get()), (2, 1, 0));
        assert!(relay.is_full().get());
        // Folded: the depth stays, only the fold's counters move.
        assert_eq!(relay.send(3), Ok(Sent::Conflated));
        assert_eq!((depth.get(), full.get(), conflated.get()), (2, 1, 1));
        assert_eq!((relay.ops().get(), relay.accepted().get(), relay.conflated().get()), (3, 3, 1));
        let d = relay.pop().unwrap();
        assert_eq!((d.value, d.ops), (1, 1));
        assert_eq!((relay.depth().get(), relay.drained().get(), relay.is_full().get()), (1, 1, true));
        relay.unpop(d);
        assert_eq!((relay.depth().get(), relay.drained().get()), (2, 0));
        assert_eq!(relay.pop().map(|d| d.value), Some(1));
        assert_eq!(relay.pop().map(|d| (d.value, d.ops)), Some((5, 2)));
        assert!(!relay.is_full().get(), "drained to low");
        assert_eq!(relay.stats().drained, 3);
        // A refusal moves only its counter.
        let blocking = RelayCellOf::new(&cx, KeepLatest, Backpressure::count(Water::new(1, 0), Overflow::Block)).unwrap();
        assert_eq!(blocking.send('a'), Ok(Sent::Accepted));
        let depth = watch!(cx, blocking.depth());
        assert_eq!(blocking.send('b'), Err(SendRefused::Blocked('b')));
        assert_eq!((depth.get(), blocking.blocked().get(), blocking.dropped().get()), (0, 1, 0));
        let dropping = RelayCellOf::new(&cx, KeepLatest, Backpressure::count(Water::new(1, 0), Overflow::DropNewest)).unwrap();
        assert_eq!((dropping.send('a'), dropping.send('b')), (Ok(Sent::Accepted), Ok(Sent::Dropped)));
        assert_eq!(dropping.dropped().get(), 1);
        let weighed = RelayCellOf::weighed(&cx, RawFifo, Backpressure::count(Water::new(4, 0), Overflow::Block).with_bytes(Water::new(3, 1)), |v: &Vec<u8>| v.len() as u64).unwrap();
        assert_eq!(weighed.send(vec![1, 2]), Ok(Sent::Accepted));
        assert_eq!(weighed.bytes().get(), 2);
        assert!(matches!(weighed.send(vec![1, 2, 3, 4]), Err(SendRefused::TooLarge { bytes: 4, limit: 3, .. })));
    }

    fn a_relay_that_cannot_be_built_is_refused(cx) {
        let err = RelayCellOf::<Vec<u8>, RawFifo, _>::new(&cx, RawFifo, conflating(2, 0)).unwrap_err();
        assert_eq!(err, egress_core::RelayConfigError::ConflateNotBounding);
        let err = RelayCellOf::<u64, Sum, _>::weighed(&cx, Sum, conflating(2, 2), |v| *v).unwrap_err();
        assert!(matches!(err, egress_core::RelayConfigError::NoHysteresis { .. }));
        let relay = RelayCellOf::from_relay(&cx, egress_core::Relay::new(Sum, conflating(3, 1)).unwrap());
        assert_eq!(relay.send(7u32), Ok(Sent::Accepted));
        assert_eq!(relay.with_relay(|r| r.front().copied()), Some(7));
    }

    fn the_drain_keeps_at_most_max_pending_waiting_in_the_cell_and_the_rest_folds(cx) {
        let cell = EgressCellOf::new(&cx, Policy::default());
        let relay = RelayCellOf::new(&cx, Sum, conflating(2, 0)).unwrap();
        let drain = relay.drain_into(&cell, nz(2)).unwrap();
        for delta in 1..=10u64 {
            relay.send(delta).unwrap();
        }
        // 1 and 2 went to the cell; 3 and 4 into the relay; 5..=10 folded into 4.
        assert_eq!(cell.pending_len().get(), 2);
        assert_eq!((relay.depth().get(), relay.ops().get(), relay.conflated().get()), (2, 8, 6));
        // The transport claims one: the drain moves the next entry at once.
        assert_eq!(claim(&cell).map(|c| c.1), Some(1));
        assert_eq!((cell.pending_len().get(), relay.depth().get()), (2, 1));
        let mut sent = vec![1];
        while let Some((_, payload)) = claim(&cell) {
            sent.push(payload);
        }
        assert_eq!(sent, vec![1, 2, 3, 49], "each entry one record, folds in order");
        assert_eq!(sent.iter().sum::<u64>(), (1..=10).sum::<u64>());
        assert_eq!((relay.depth().get(), relay.drained().get()), (0, 10));
        let runs = drain.runs();
        assert!(runs > 1, "it ran on each claim");
        let _ = claim(&cell);
        relay.send(7).unwrap();
        assert!(drain.runs() > runs);
        assert_eq!(claim(&cell).map(|c| c.1), Some(7));
        assert!(!drain.is_stopped());
        assert_eq!(format!("{drain:?}"), "RelayDrain { stopped: false }");
        assert!(format!("{relay:?}").starts_with("RelayCell(RelayStats { depth: 0, ops: 0"), "{relay:?}");
        // Stopped: what comes next stays in the relay.
        drain.stop();
        relay.send(100).unwrap();
        assert_eq!((relay.depth().get(), cell.pending_len().get()), (1, 0));
    }

    fn the_drain_respects_the_cells_capacity_and_an_ack_makes_room(cx) {
        let cell = EgressCellOf::with_options(&cx, Policy::default(), CellOptions::new().capacity(2));
        let relay = RelayCellOf::new(&cx, KeepLatest, Backpressure::count(Water::new(8, 2), Overflow::Block)).unwrap();
        let _drain = relay.drain_into(&cell, nz(8)).unwrap();
        for v in 0..5u32 {
            assert_eq!(relay.send(v), Ok(Sent::Accepted));
        }
        assert_eq!((cell.pending_len().get(), relay.depth().get()), (2, 3));
        let (first, _) = claim(&cell).unwrap();
        // Claimed is not acknowledged: still at capacity.
        assert_eq!(relay.depth().get(), 3);
        let _ = cell.ack(cell.generation().get(), first);
        assert_eq!(relay.depth().get(), 2, "the ack made room for one");
        assert_eq!(cell.pending_len().get(), 2);
    }

    fn an_entry_refused_as_full_by_a_racing_fill_goes_back_in_front(cx) {
        let cell = EgressCellOf::with_options(&cx, Policy::default(), CellOptions::new().capacity(1));
        let relay = RelayCellOf::new(&cx, Sum, conflating(4, 0)).unwrap();
        // A check that fills the cell from inside the drain's enqueue, as
        // another producer would between the drain's check and its
        // enqueue: the cell then refuses the entry as full. (The cell is
        // reached through a thread-local: a check must be Send + Sync, a
        // Local cell is not; the drain runs on this thread.)
        let racer = cell.clone();
        RACE.with(|r| *r.borrow_mut() = Some(Box::new(move || {
            racer.enqueue(1_000);
        })));
        let raced = Arc::new(Mutex::new(false));
        let once = raced.clone();
        cell.set_size_check(Some(Arc::new(move |_: &u64| {
            let mut raced = once.lock().unwrap();
            if !*raced {
                *raced = true;
                RACE.with(|r| r.borrow().as_ref().map(|race| race()));
            }
            None
        })));
        let _drain = relay.drain_into(&cell, nz(4)).unwrap();
        assert_eq!(relay.send(5u64), Ok(Sent::Accepted));
        assert!(*raced.lock().unwrap());
        assert_eq!(relay.with_relay(|r| r.iter().copied().collect::<Vec<_>>()), vec![5], "back in front, as it was");
        let s = relay.stats();
        assert_eq!((s.drained, s.depth, s.ops), (0, 1, 1));
        assert_eq!(relay.rejected().get(), 0);
        // Once the racer's record is acknowledged, the entry goes.
        let (seq, payload) = claim(&cell).unwrap();
        assert_eq!(payload, 1_000);
        let _ = cell.ack(cell.generation().get(), seq);
        assert_eq!(claim(&cell).map(|c| c.1), Some(5));
        assert_eq!(relay.drained().get(), 1);
    }

    fn an_entry_the_cell_refuses_for_good_is_counted_and_the_rest_flow(cx) {
        let cell = EgressCellOf::new(&cx, Policy::default());
        cell.set_size_check(Some(Arc::new(|v: &Vec<u8>| (v.len() > 2).then_some((v.len(), 2)))));
        let relay = RelayCellOf::new(&cx, RawFifo, Backpressure::count(Water::new(8, 0), Overflow::Block)).unwrap();
        let _drain = relay.drain_into(&cell, nz(8)).unwrap();
        let rejected = watch!(cx, relay.rejected());
        relay.send(vec![1]).unwrap();
        relay.send(vec![1, 2, 3]).unwrap();
        relay.send(vec![4]).unwrap();
        assert_eq!(rejected.get(), 1);
        assert_eq!((relay.rejected().get(), relay.drained().get(), relay.depth().get()), (1, 3, 0));
        assert_eq!((claim(&cell).map(|c| c.1), claim(&cell).map(|c| c.1)), (Some(vec![1]), Some(vec![4])));
        assert_eq!(claim(&cell), None);
    }

    fn a_panicking_check_loses_its_entry_counted_and_the_drain_goes_on(cx) {
        let cell = EgressCellOf::new(&cx, Policy::default());
        cell.set_encode_check(Some(Arc::new(|v: &u32| {
            assert!(*v != 13, "the codec panicked");
            Ok(())
        })));
        let relay = RelayCellOf::new(&cx, KeepLatest, Backpressure::count(Water::new(8, 0), Overflow::Block)).unwrap();
        let _drain = relay.drain_into(&cell, nz(8)).unwrap();
        assert_eq!(relay.send(13u32), Ok(Sent::Accepted), "the panic stays in the drain");
        assert_eq!((relay.rejected().get(), relay.depth().get()), (1, 0));
        assert_eq!(relay.send(14), Ok(Sent::Accepted));
        assert_eq!(claim(&cell).map(|c| c.1), Some(14));
    }

    fn a_panicking_check_in_the_drains_first_run_leaves_the_drain_running(cx) {
        // Found by a hostile review: the drain's first run is
        // `drain_into`'s, and an effect whose first run panics is disposed:
        // the entries after the panicking one stayed in the relay for good.
        let cell = EgressCellOf::new(&cx, Policy::default());
        cell.set_encode_check(Some(Arc::new(|v: &u64| {
            assert!(*v != 13, "the codec panicked");
            Ok(())
        })));
        let relay = RelayCellOf::new(&cx, KeepLatest, Backpressure::count(Water::new(8, 0), Overflow::Block)).unwrap();
        relay.send(13u64).unwrap();
        relay.send(14).unwrap();
        let drain = relay.drain_into(&cell, nz(8)).unwrap();
        relay.send(15).unwrap();
        assert_eq!((claim(&cell).map(|c| c.1), claim(&cell).map(|c| c.1)), (Some(14), Some(15)));
        assert_eq!((relay.rejected().get(), relay.drained().get(), relay.depth().get()), (1, 3, 0));
        assert!(!drain.is_stopped());
    }

    fn a_cell_disposed_by_a_check_in_the_middle_of_a_run_gets_nothing_more(cx) {
        // Found by a hostile review: disposal was checked once per run.
        let cell = EgressCellOf::new(&cx, Policy::default());
        let relay = RelayCellOf::new(&cx, KeepLatest, Backpressure::count(Water::new(8, 0), Overflow::Block)).unwrap();
        for v in 1..=3u64 {
            relay.send(v).unwrap();
        }
        let doomed = cell.clone();
        RACE.with(|r| *r.borrow_mut() = Some(Box::new(move || doomed.dispose())));
        cell.set_size_check(Some(Arc::new(|v: &u64| {
            if *v == 1 {
                RACE.with(|r| r.borrow().as_ref().map(|dispose| dispose()));
            }
            None
        })));
        let _drain = relay.drain_into(&cell, nz(8)).unwrap();
        assert!(cell.is_disposed());
        let s = relay.stats();
        assert_eq!((s.depth, s.drained), (2, 1), "2 and 3 stay in the relay");
    }

    fn a_synchronous_transport_drains_thousands_of_entries_in_one_flush(cx) {
        // Two flush rounds per entry at max_pending 1 (the drain's run, the
        // transport's): 3,000 entries take 6,000, under the bound.
        let cell = EgressCellOf::new(&cx, Policy::default());
        let relay = RelayCellOf::new(&cx, RawFifo, Backpressure::count(Water::new(4_000, 0), Overflow::Block)).unwrap();
        for v in 0..3_000u32 {
            relay.send(vec![v]).unwrap();
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let _transport = cx.effect({
            let (cell, seen) = (cell.clone(), seen.clone());
            move || {
                if cell.pending_len().get() > 0 {
                    while let Some((seq, v)) = claim(&cell) {
                        seen.lock().unwrap().extend(v);
                        let _ = cell.ack(cell.generation().get_untracked(), seq);
                    }
                }
            }
        });
        let _drain = relay.drain_into(&cell, nz(1)).unwrap();
        assert_eq!(*seen.lock().unwrap(), (0..3_000).collect::<Vec<u32>>());
        assert_eq!(relay.depth().get(), 0);
    }

    fn a_panicking_merge_keeps_the_readers_true(cx) {
        #[derive(Clone, Copy)]
        struct Bomb;
        impl MergePolicy<u32> for Bomb {
            const COMMUTATIVE: bool = true;
            const IDEMPOTENT: bool = false;
            fn merge(&self, acc: &mut u32, op: u32) {
                assert!(op != 13, "the merge panicked");
                *acc += op;
            }
        }
        let relay = RelayCellOf::new(&cx, Bomb, conflating(1, 0)).unwrap();
        assert_eq!(relay.send(1), Ok(Sent::Accepted));
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| relay.send(13)));
        assert!(panicked.is_err());
        assert_eq!((relay.depth().get(), relay.ops().get(), relay.accepted().get()), (1, 1, 1));
        assert_eq!(relay.send(2), Ok(Sent::Conflated));
        assert_eq!((relay.ops().get(), relay.conflated().get()), (2, 1));
        assert_eq!(relay.with_relay(|r| r.front().copied()), Some(3));
    }

    fn a_drain_that_cannot_be_is_refused(cx) {
        let cell = EgressCellOf::new(&cx, Policy::default());
        let relay = RelayCellOf::new(&cx, Sum, conflating(2, 0)).unwrap();
        cell.dispose();
        assert_eq!(relay.drain_into(&cell, nz(1)).map(|_| ()), Err(DrainRefused::Disposed));
        let cell = EgressCellOf::new(&cx, Policy::default());
        let drain = relay.drain_into(&cell, nz(1)).unwrap();
        assert!(!relay.is_disposed() && !drain.is_stopped());
        relay.dispose();
        assert!(relay.is_disposed());
        assert!(drain.is_stopped(), "the relay cell owns its drains");
        assert_eq!(drain.runs(), 0);
        assert_eq!(relay.drain_into(&cell, nz(1)).map(|_| ()), Err(DrainRefused::Disposed));
        // Disposed, the relay still takes ops, and notifies nothing.
        assert_eq!(relay.send(1u64), Ok(Sent::Accepted));
        assert_eq!(relay.stats().depth, 1);
    }

    fn a_drain_whose_cell_is_disposed_stops_moving_entries(cx) {
        let cell = EgressCellOf::new(&cx, Policy::default());
        let relay = RelayCellOf::new(&cx, Sum, conflating(4, 0)).unwrap();
        let _drain = relay.drain_into(&cell, nz(1)).unwrap();
        relay.send(1u64).unwrap();
        assert_eq!(cell.with_core(|c| c.pending_len()), 1);
        cell.dispose();
        relay.send(2).unwrap();
        relay.send(3).unwrap();
        assert_eq!(relay.depth().get(), 2, "nothing drains into a disposed cell");
    }

    fn the_converged_egress_is_the_flat_fold_of_every_op_for_random_schedules(cx) {
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(48));
        let steps = prop::collection::vec((0u64..1_000, 0u8..4), 0..80);
        let bounds = (1u64..5).prop_flat_map(|high| (Just(high), 0..high, 1usize..4));
        runner
            .run(&(bounds, steps), |((high, low, max_pending), steps)| {
                let cell = EgressCellOf::new(&cx, Policy::default());
                let relay = RelayCellOf::new(&cx, Sum, conflating(high, low)).unwrap();
                let _drain = relay.drain_into(&cell, nz(max_pending)).unwrap();
                let g: Generation = cell.generation().get();
                let mut delivered = 0u64;
                for (op, action) in &steps {
                    relay.send(*op).unwrap();
                    // Some sends are followed by claims and acks.
                    for _ in 0..*action {
                        if let Some((seq, v)) = claim(&cell) {
                            delivered += v;
                            let _ = cell.ack(g, seq);
                        }
                    }
                    prop_assert!(cell.pending_len().get() <= max_pending);
                    prop_assert!(relay.depth().get() <= high);
                }
                while let Some((_, v)) = claim(&cell) {
                    delivered += v;
                }
                prop_assert_eq!(relay.depth().get(), 0);
                prop_assert_eq!(delivered, steps.iter().map(|s| s.0).sum::<u64>());
                prop_assert_eq!(relay.drained().get(), steps.len() as u64);
                Ok(())
            })
            .unwrap();
    }
}

/// Producers on four threads race a transport thread that claims and
/// acknowledges (a cell with a capacity, so the drain both waits for room
/// and can be refused as full by a racing enqueue of another producer's
/// drain): every op sent reaches the transport, folded but never lost or
/// counted twice, and the drain never leaves more than `max_pending`
/// waiting.
#[test]
fn producers_on_threads_race_the_transport_and_nothing_is_lost() {
    const THREADS: u64 = 4;
    const OPS: u64 = 2_000;
    let cx = egress_reactive::ThreadSafeContext::new();
    let cell = EgressCellOf::<u64, _>::with_options(&cx, Policy::default(), CellOptions::new().capacity(8));
    let relay = RelayCellOf::new(&cx, Sum, conflating(16, 4)).unwrap();
    let _drain = relay.drain_into(&cell, nz(2)).unwrap();
    let producers: Vec<_> = (0..THREADS)
        .map(|t| {
            let relay = relay.clone();
            std::thread::spawn(move || {
                for i in 0..OPS {
                    relay.send(t * OPS + i).unwrap();
                }
            })
        })
        .collect();
    let expected: u64 = (0..THREADS * OPS).sum();
    let mut delivered = 0u64;
    let g = cell.generation().get();
    // Until every op is drained and claimed: the producers end, and the
    // drain runs on each claim, so this ends.
    while relay.drained().get() < THREADS * OPS || cell.with_core(|c| c.pending_len()) > 0 {
        match claim(&cell) {
            Some((seq, v)) => {
                delivered += v;
                let _ = cell.ack(g, seq);
            }
            None => std::thread::yield_now(),
        }
        assert!(cell.with_core(|c| c.pending_len()) <= 2, "bounded by the drain");
    }
    for p in producers {
        p.join().unwrap();
    }
    assert_eq!(delivered, expected, "every op once");
    let s = relay.stats();
    assert_eq!((s.accepted, s.drained, s.depth, s.dropped), (THREADS * OPS, THREADS * OPS, 0, 0));
}
