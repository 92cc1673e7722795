#![allow(clippy::unwrap_used)]
//! Graph propagation: diamonds, jagged and stacked diamonds, cut-offs,
//! fan-in and fan-out, laziness and caching. Run counts, not only values.

mod common;
use common::Counter;

each_flavour! {
    fn a_write_settled_mid_walk_reaches_the_node_the_walk_returns_to(cx) {
        // p reads s, then a. Re-validating p walks into a: c runs (and
        // writes s, deferred), then a runs and reads x, whose refresh
        // settles the write: p is marked dirty while the walk is below it.
        // a's value is unchanged, and a was p's last dependency: p must
        // still run, and see the new s.
        let u = cx.signal(0);
        let s = cx.signal(0);
        let c = cx.computed({ let (u, s) = (u.clone(), s.clone()); move || { let v = u.get(); if v > 0 { s.set(v * 10); } v } });
        let x = cx.computed(|| 0);
        let a = cx.computed({ let (c, x) = (c.clone(), x.clone()); move || { c.get(); x.get() } });
        let p = cx.computed({ let (s, a) = (s.clone(), a.clone()); move || s.get() + a.get() });
        assert_eq!(p.get(), 0);
        u.set(1);
        assert_eq!(p.get(), 10, "p ran after the write its walk settled");
        assert_eq!(s.get(), 10);
    }

    fn computed_is_lazy_and_memoized(cx) {
        let a = cx.signal(1);
        let runs = Counter::new();
        let b = cx.computed({ let (a, runs) = (a.clone(), runs.clone()); move || { runs.hit(); a.get() * 2 } });
        assert_eq!(runs.get(), 0, "nothing runs before a read");
        assert_eq!(b.get(), 2);
        assert_eq!(b.get(), 2);
        assert_eq!(runs.get(), 1, "a second read is served from the cache");
        a.set(5);
        assert_eq!(runs.get(), 1, "a write recomputes nothing by itself");
        assert_eq!(b.get(), 10);
        assert_eq!(runs.get(), 2);
        assert_eq!(b.runs(), 2);
    }

    fn diamond_runs_each_node_once(cx) {
        let a = cx.signal(1);
        let b = cx.computed({ let a = a.clone(); move || a.get() + 1 });
        let c = cx.computed({ let a = a.clone(); move || a.get() * 2 });
        let d_runs = Counter::new();
        let d = cx.computed({ let (b, c, r) = (b.clone(), c.clone(), d_runs.clone()); move || { r.hit(); (b.get(), c.get()) } });
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let e = cx.effect({ let (d, seen) = (d.clone(), seen.clone()); move || seen.lock().unwrap().push(d.get()) });
        a.set(2);
        a.set(3);
        assert_eq!(*seen.lock().unwrap(), vec![(2, 2), (3, 4), (4, 6)], "never a mix of old and new");
        assert_eq!(d_runs.get(), 3);
        assert_eq!(e.runs(), 3);
        assert_eq!((b.runs(), c.runs()), (3, 3));
    }

    fn jagged_diamond_is_glitch_free(cx) {
        // a -> b -> c -> d ; a -> e -> d (long and short legs)
        let a = cx.signal(1);
        let b = cx.computed({ let a = a.clone(); move || a.get() + 1 });
        let c = cx.computed({ let b = b.clone(); move || b.get() + 1 });
        let e = cx.computed({ let a = a.clone(); move || a.get() * 10 });
        let d_runs = Counter::new();
        let d = cx.computed({ let (c, e, r) = (c.clone(), e.clone(), d_runs.clone()); move || { r.hit(); c.get() + e.get() } });
        let last = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        cx.effect({ let (d, last) = (d.clone(), last.clone()); move || last.lock().unwrap().push(d.get()) });
        a.set(2);
        assert_eq!(*last.lock().unwrap(), vec![13, 24]);
        assert_eq!(d_runs.get(), 2);
    }

    fn stacked_diamonds_run_each_node_once_per_change(cx) {
        let a = cx.signal(0);
        let mut level = vec![cx.computed({ let a = a.clone(); move || a.get() })];
        let runs = Counter::new();
        for _ in 0..5 {
            let top = level.last().unwrap().clone();
            let l = cx.computed({ let (t, r) = (top.clone(), runs.clone()); move || { r.hit(); t.get() + 1 } });
            let rr = cx.computed({ let (t, r) = (top.clone(), runs.clone()); move || { r.hit(); t.get() * 2 } });
            level.push(cx.computed({ let r = runs.clone(); move || { r.hit(); l.get() + rr.get() } }));
        }
        let tail = level.last().unwrap().clone();
        let fx = cx.effect({ let t = tail.clone(); move || { t.get(); } });
        runs.reset();
        a.set(1);
        assert_eq!(runs.get(), 15, "each of the 15 diamond nodes runs exactly once");
        assert_eq!(fx.runs(), 2);
    }

    fn equality_cutoff_reaches_effects(cx) {
        // A -> B -> A style: the value downstream does not change.
        let a = cx.signal(1);
        let parity = cx.computed({ let a = a.clone(); move || a.get() % 2 });
        let after_runs = Counter::new();
        let after = cx.computed({ let (p, r) = (parity.clone(), after_runs.clone()); move || { r.hit(); p.get() + 100 } });
        let fx = cx.effect({ let after = after.clone(); move || { after.get(); } });
        a.set(3);
        a.set(5);
        assert_eq!(parity.runs(), 3, "the cut-off node itself re-runs");
        assert_eq!(after_runs.get(), 1, "nothing below an unchanged value re-runs");
        assert_eq!(fx.runs(), 1);
        a.set(4);
        assert_eq!(after_runs.get(), 2);
        assert_eq!(fx.runs(), 2);
    }

    fn equal_write_notifies_nothing(cx) {
        let a = cx.signal(7);
        let fx = cx.effect({ let a = a.clone(); move || { a.get(); } });
        a.set(7);
        assert_eq!(fx.runs(), 1);
        a.set_unchecked(7);
        assert_eq!(fx.runs(), 2, "an unchecked write notifies even when equal");
        a.update(|v| *v += 0);
        assert_eq!(fx.runs(), 3, "an update in place always notifies");
    }

    fn unguarded_computed_always_propagates(cx) {
        let a = cx.signal(1);
        let fresh = cx.computed_unguarded({ let a = a.clone(); move || vec![a.get() % 2] });
        let fx = cx.effect({ let f = fresh.clone(); move || { f.get(); } });
        a.set(3);
        assert_eq!(fx.runs(), 2);
        let custom = cx.computed_with(|x: &i32, y: &i32| (x - y).abs() < 10, { let a = a.clone(); move || a.get() });
        let fx2 = cx.effect({ let c = custom.clone(); move || { c.get(); } });
        a.set(5);
        assert_eq!(fx2.runs(), 1, "within the custom tolerance");
        a.set(50);
        assert_eq!(fx2.runs(), 2);
    }

    fn fan_out_and_fan_in(cx) {
        let a = cx.signal(1);
        let runs = Counter::new();
        let leaves: Vec<_> = (0..100).map(|i| cx.computed({ let a = a.clone(); move || a.get() + i })).collect();
        let sum = cx.computed({ let (l, r) = (leaves.clone(), runs.clone()); move || { r.hit(); l.iter().map(|c| c.get()).sum::<i32>() } });
        let fx = cx.effect({ let s = sum.clone(); move || { s.get(); } });
        a.set(2);
        assert_eq!(sum.get(), 100 * 2 + 4950);
        assert_eq!(runs.get(), 2);
        assert_eq!(fx.runs(), 2);
        assert_eq!(a.subscriber_count(), 100);
        assert_eq!(sum.dependency_count(), 100);
    }

    fn untracked_reads_are_not_dependencies(cx) {
        let a = cx.signal(1);
        let b = cx.signal(10);
        let h = cx.handle();
        let c = cx.computed({ let (a, b) = (a.clone(), b.clone()); move || a.get() + h.untrack(|| b.get()) });
        let d = cx.computed({ let (a, b) = (a.clone(), b.clone()); move || a.get() + b.get_untracked() });
        assert_eq!((c.get(), d.get()), (11, 11));
        b.set(20);
        assert_eq!((c.get(), d.get()), (11, 11), "untracked reads do not invalidate");
        assert_eq!((c.dependency_count(), d.dependency_count()), (1, 1));
        a.set(2);
        assert_eq!((c.get(), d.get()), (22, 22));
    }

    fn reads_after_an_untracked_block_are_tracked_again(cx) {
        let (a, b, z) = (cx.signal(1), cx.signal(10), cx.signal(100));
        let h = cx.handle();
        let c = cx.computed({ let (a, b, z) = (a.clone(), b.clone(), z.clone()); move || h.untrack(|| b.get()) + a.get() + z.get() });
        assert_eq!(c.get(), 111);
        assert_eq!(c.dependency_count(), 2, "a and z, read after the untracked block");
        z.set(200);
        assert_eq!(c.get(), 211);
    }

    fn writes_inside_computed_are_applied(cx) {
        let a = cx.signal(1);
        let mirror = cx.signal(0);
        let c = cx.computed({ let (a, m) = (a.clone(), mirror.clone()); move || { let v = a.get(); m.set(v); v } });
        let fx = cx.effect({ let m = mirror.clone(); move || { m.get(); } });
        assert_eq!(c.get(), 1);
        assert_eq!(mirror.get(), 1);
        assert_eq!(fx.runs(), 2);
    }
}
