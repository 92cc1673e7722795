#![allow(clippy::unwrap_used)]
//! Ownership and memory: scopes, disposal of what a scope or an effect
//! created, links freed when subscribers go, drop of captured values.

mod common;
use common::Log;
use std::sync::Arc;

each_flavour! {
    fn dropping_a_scope_frees_every_node_and_link(cx) {
        let source = cx.signal(1);
        let (nodes, links) = (cx.node_count(), cx.link_count());
        let (scope, ()) = cx.scope(|| {
            for i in 0..100 {
                let c = cx.computed({ let s = source.clone(); move || s.get() + i });
                cx.effect(move || { c.get(); });
            }
        });
        assert_eq!(cx.node_count(), nodes + 201);
        assert_eq!(cx.link_count(), links + 200);
        assert_eq!(source.subscriber_count(), 100);
        drop(scope);
        assert_eq!((cx.node_count(), cx.link_count()), (nodes, links));
        assert_eq!(source.subscriber_count(), 0);
    }

    fn disposing_frees_captured_values(cx) {
        let token = Arc::new(());
        let (scope, ()) = cx.scope(|| {
            let t = token.clone();
            cx.effect(move || { let _ = &t; });
            let t = token.clone();
            let c = cx.computed(move || Arc::strong_count(&t));
            assert!(c.get() >= 2);
        });
        assert_eq!(Arc::strong_count(&token), 3);
        scope.dispose();
        assert_eq!(Arc::strong_count(&token), 1, "closures were dropped");
        assert!(scope.is_disposed());
    }

    fn dropping_the_context_runs_cleanups_and_breaks_cycles(cx) {
        let log = Log::new();
        let token = Arc::new(());
        let h = cx.handle();
        let a = cx.signal(0);
        cx.effect({
            let (log, a, t, h2) = (log.clone(), a.clone(), token.clone(), h.clone());
            move || {
                a.get();
                let _ = &t;
                let log = log.clone();
                h2.on_cleanup(move || log.push("cleanup"));
            }
        });
        drop(h);
        drop(cx);
        assert_eq!(log.take(), ["cleanup"]);
        assert_eq!(Arc::strong_count(&token), 1);
        assert!(a.is_disposed());
    }

    fn slots_are_reused_and_stale_handles_stay_dead(cx) {
        let a = cx.signal(1);
        a.dispose();
        let b = cx.signal(2);
        assert!(a.try_get().is_err(), "a's slot went to b; a stays disposed");
        assert_eq!(b.get(), 2);
    }

    fn scope_run_adds_to_an_existing_scope(cx) {
        let (scope, ()) = cx.scope(|| ());
        let n = cx.node_count();
        scope.run(|| { cx.signal(1); });
        assert_eq!(cx.node_count(), n + 1);
        drop(scope);
        assert_eq!(cx.node_count(), n - 1);
    }

    fn links_are_freed_when_the_last_subscriber_goes(cx) {
        let s = cx.signal(1);
        let a = cx.computed({ let s = s.clone(); move || s.get() * 2 });
        let b = cx.computed({ let a = a.clone(); move || a.get() + 1 });
        let fx = cx.effect({ let b = b.clone(); move || { b.get(); } });
        let links = cx.link_count();
        assert_eq!((s.subscriber_count(), a.dependency_count(), b.dependency_count()), (1, 1, 1));
        fx.dispose();
        assert_eq!(cx.link_count(), links - 3, "b and a, unobserved now, let go of theirs too");
        assert_eq!((s.subscriber_count(), a.subscriber_count(), b.dependency_count()), (0, 0, 0));
        let runs = a.runs();
        s.set(5);
        assert_eq!(a.runs(), runs, "an unobserved computed costs a write nothing");
        assert_eq!(b.get(), 11, "read again: recomputed");
        assert_eq!((s.subscriber_count(), a.subscriber_count()), (1, 1), "and re-subscribed");
        s.set(6);
        assert_eq!(b.get(), 13);
    }

    fn a_computed_still_observed_keeps_its_links(cx) {
        let s = cx.signal(1);
        let c = cx.computed({ let s = s.clone(); move || s.get() * 2 });
        let one = cx.effect({ let c = c.clone(); move || { c.get(); } });
        let _two = cx.effect({ let c = c.clone(); move || { c.get(); } });
        one.dispose();
        assert_eq!((s.subscriber_count(), c.subscriber_count()), (1, 1));
        let runs = c.runs();
        assert_eq!(c.get(), 2);
        assert_eq!(c.runs(), runs, "still memoized");
    }
}
