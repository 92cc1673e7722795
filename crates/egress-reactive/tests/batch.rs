#![allow(clippy::unwrap_used)]
//! Batches: one notification at the end, reads see new values, reverts
//! notify nothing, nesting, panics.

mod common;
use common::Counter;
use std::panic::{AssertUnwindSafe, catch_unwind};

each_flavour! {
    fn writes_notify_once_at_the_end(cx) {
        let a = cx.signal(0);
        let b = cx.signal(0);
        let runs = Counter::new();
        cx.effect({ let (a, b, r) = (a.clone(), b.clone(), runs.clone()); move || { a.get(); b.get(); r.hit(); } });
        cx.batch(|| {
            for i in 1..=10 { a.set(i); b.set(i); }
            assert_eq!(runs.get(), 1, "no effect runs inside the batch");
        });
        assert_eq!(runs.get(), 2);
    }

    fn reads_inside_see_new_values(cx) {
        let a = cx.signal(1);
        let double = cx.computed({ let a = a.clone(); move || a.get() * 2 });
        cx.effect({ let d = double.clone(); move || { d.get(); } });
        cx.batch(|| {
            a.set(5);
            assert_eq!(a.get(), 5);
            assert_eq!(double.get(), 10);
        });
    }

    fn a_batch_that_reverts_notifies_nothing(cx) {
        let a = cx.signal(1);
        let runs = Counter::new();
        let c = cx.computed({ let a = a.clone(); move || a.get() + 1 });
        cx.effect({ let (a, c, r) = (a.clone(), c.clone(), runs.clone()); move || { a.get(); c.get(); r.hit(); } });
        cx.batch(|| { a.set(2); a.set(3); a.set(1); });
        assert_eq!(runs.get(), 1);
        assert_eq!(c.runs(), 1);
    }

    fn nested_batches_notify_at_the_outermost_end(cx) {
        let a = cx.signal(0);
        let runs = Counter::new();
        cx.effect({ let (a, r) = (a.clone(), runs.clone()); move || { a.get(); r.hit(); } });
        cx.batch(|| {
            cx.batch(|| a.set(1));
            assert_eq!(runs.get(), 1);
            a.set(2);
        });
        assert_eq!(runs.get(), 2);
        assert_eq!(a.get(), 2);
    }

    fn a_nested_batch_settles_with_the_outermost(cx) {
        // The inner batch's end settles nothing: the outer batch writes the
        // value back, and the batch as a whole changed nothing.
        let a = cx.signal(0);
        let runs = Counter::new();
        cx.effect({ let (a, r) = (a.clone(), runs.clone()); move || { a.get(); r.hit(); } });
        cx.batch(|| {
            cx.batch(|| a.set(1));
            a.set(0);
        });
        assert_eq!(runs.get(), 1, "written back before the outermost end: nothing to notify");
        cx.batch(|| cx.batch(|| a.set(2)));
        assert_eq!(runs.get(), 2, "a nested write that stays notifies at the outermost end");
    }

    fn a_batch_in_a_cleanup_run_by_a_flush_is_read_back_fresh(cx) {
        // A cleanup runs while the flush re-runs its effect, outside any
        // computation: a batch it ends settles there and then, as a plain
        // write would, so the computeds it reads next see the batch.
        let h = cx.handle();
        let go = cx.signal(0);
        let a = cx.signal(1);
        let double = cx.computed({ let a = a.clone(); move || a.get() * 2 });
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let watcher = Counter::new();
        cx.effect({ let (d, w) = (double.clone(), watcher.clone()); move || { d.get(); w.hit(); } });
        cx.effect({
            let (h, go, a, double, seen) = (h.clone(), go.clone(), a.clone(), double.clone(), seen.clone());
            move || {
                let round = go.get();
                let (h2, a, double, seen) = (h.clone(), a.clone(), double.clone(), seen.clone());
                h.on_cleanup(move || {
                    h2.batch(|| a.set(round + 5));
                    seen.lock().unwrap().push(double.get());
                });
            }
        });
        go.set(1);
        assert_eq!(*seen.lock().unwrap(), [10], "the cleanup's read sees its own batch");
        assert_eq!(watcher.get(), 2, "and the effect reading it ran once more");
        go.set(2);
        assert_eq!(*seen.lock().unwrap(), [10, 12]);
        assert_eq!(double.get(), 12);
    }

    fn an_equality_that_writes_as_a_batch_ends_joins_the_settlement(cx) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        // x's equality writes z when the batch's end compares x: the write
        // joins the settlement (it settles after x's, and z's effect runs
        // once, in the flush after it) rather than starting a settlement
        // of its own, which would compare x again while x is compared.
        let z = cx.signal(0u32);
        let calls = Arc::new(AtomicUsize::new(0));
        let x = cx.signal_with(0u32, {
            let (z, calls) = (z.clone(), calls.clone());
            move |a: &u32, b: &u32| {
                // The first call is the write's, inside the batch; the
                // second, the settlement's.
                if calls.fetch_add(1, Ordering::SeqCst) == 1 {
                    z.set(*b + 100);
                }
                a == b
            }
        });
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        cx.effect({ let (x, z, seen) = (x.clone(), z.clone(), seen.clone()); move || seen.lock().unwrap().push((x.get(), z.get())) });
        cx.batch(|| x.set(1));
        assert_eq!(calls.load(Ordering::SeqCst), 2, "compared at the write and at the settlement only");
        assert_eq!(*seen.lock().unwrap(), [(0, 0), (1, 101)], "one run, after both writes");
    }

    fn an_equality_that_reads_a_computed_and_writes_as_a_batch_ends_settles_everything_once(cx) {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        // x's equality reads a computed over z (written in the same batch,
        // not yet settled) and writes w: the read settles the rest of the
        // batch's writes (z's) without comparing x again, the write joins
        // the settlement, and no write is lost or left marked.
        let z = cx.signal(0u32);
        let zc = cx.computed({ let z = z.clone(); move || z.get() + 1 });
        let w = cx.signal(0u32);
        let armed = Arc::new(AtomicBool::new(false));
        let read = Arc::new(Mutex::new(Vec::new()));
        let x = cx.signal_with(0u32, {
            let (zc, w, armed, read) = (zc.clone(), w.clone(), armed.clone(), read.clone());
            move |a: &u32, b: &u32| {
                if armed.swap(false, Ordering::SeqCst) {
                    read.lock().unwrap().push(zc.get());
                    w.set(7);
                }
                a == b
            }
        });
        let seen = Arc::new(Mutex::new(Vec::new()));
        cx.effect({ let (x, w, seen) = (x.clone(), w.clone(), seen.clone()); move || seen.lock().unwrap().push((x.get(), w.get())) });
        cx.batch(|| {
            x.set(1);
            z.set(5);
            armed.store(true, Ordering::SeqCst);
        });
        assert_eq!(*read.lock().unwrap(), [6], "the computed read the batch's value of z");
        assert_eq!(*seen.lock().unwrap(), [(0, 0), (1, 7)], "one run, after every write");
        // w's write was settled: a later batched write still notifies.
        cx.batch(|| w.set(8));
        assert_eq!(seen.lock().unwrap().last(), Some(&(1, 8)));
    }

    fn an_equality_that_panics_as_a_batch_ends_lets_that_write_and_the_later_ones_through(cx) {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Arc;
        let armed = Arc::new(AtomicBool::new(false));
        let x = cx.signal_with(0u32, {
            let armed = armed.clone();
            move |a: &u32, b: &u32| {
                assert!(!armed.load(Ordering::SeqCst), "the equality refuses");
                a == b
            }
        });
        let compared = Arc::new(AtomicUsize::new(0));
        let w = cx.signal(0u32);
        let y = cx.signal_with(0u32, {
            let compared = compared.clone();
            move |a: &u32, b: &u32| {
                compared.fetch_add(1, Ordering::SeqCst);
                a == b
            }
        });
        let seen = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)]);
        for (i, s) in [w.clone(), x.clone(), y.clone()].into_iter().enumerate() {
            cx.effect({ let seen = seen.clone(); move || { s.get(); seen[i].fetch_add(1, Ordering::SeqCst); } });
        }
        let runs = || seen.iter().map(|n| n.load(Ordering::SeqCst)).collect::<Vec<_>>();
        // Written in this order: w (plain), x (its equality panics when the
        // batch ends), y (plain).
        let ended = catch_unwind(AssertUnwindSafe(|| {
            cx.batch(|| {
                w.set(1);
                x.set(1);
                y.set(1);
                armed.store(true, Ordering::SeqCst);
                compared.store(0, Ordering::SeqCst);
            })
        }));
        assert!(ended.is_err(), "the equality's panic goes on");
        assert_eq!(compared.load(Ordering::SeqCst), 1, "y's write settled before the panic went on");
        assert_eq!(runs(), [1, 1, 1], "the readers wait for the next flush");
        cx.batch(|| {});
        assert_eq!(runs(), [2, 2, 2], "w settled as usual; x and y counted as changes");
        // y's write was not compared: what it replaced is forgotten, so a
        // batch that writes y back to 0 is a change.
        cx.batch(|| y.set(0));
        assert_eq!(runs(), [2, 2, 3], "y changed from 1 to 0");
        // The signals take writes as before.
        armed.store(false, Ordering::SeqCst);
        cx.batch(|| {
            x.set(2);
            y.set(2);
            w.set(1);
        });
        assert_eq!(runs(), [2, 3, 4]);
        assert_eq!((w.get(), x.get(), y.get()), (1, 2, 2));
    }

    fn a_panicking_batch_leaves_the_graph_consistent(cx) {
        let a = cx.signal(0);
        let double = cx.computed({ let a = a.clone(); move || a.get() * 2 });
        let seen = cx.signal(0);
        cx.effect({ let (d, s) = (double.clone(), seen.clone()); move || s.set(d.get()) });
        let result = catch_unwind(AssertUnwindSafe(|| cx.batch(|| { a.set(4); panic!("boom"); })));
        assert!(result.is_err());
        assert_eq!(double.get(), 8);
        assert_eq!(seen.get(), 8, "the writes made before the panic were applied and effects ran");
        a.set(5);
        assert_eq!(seen.get(), 10, "the graph keeps working");
    }

    fn batch_returns_its_value(cx) {
        let a = cx.signal(1);
        let got = cx.batch(|| { a.set(3); a.get() * 2 });
        assert_eq!(got, 6);
        assert_eq!(cx.try_batch(|| 7).unwrap(), 7);
    }
}
