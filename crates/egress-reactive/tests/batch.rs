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
