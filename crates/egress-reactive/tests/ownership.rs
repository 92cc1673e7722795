#![allow(clippy::unwrap_used)]
// One body for every flavour: the Local one holds its effects in an Arc too.
#![allow(clippy::arc_with_non_send_sync)]
//! Ownership and memory: scopes, disposal of what a scope or an effect
//! created, links freed when subscribers go, drop of captured values.

mod common;
use common::Log;
use egress_reactive::{Context, Handle, Local, MAX_FLUSH_ROUNDS, NodeKind, ReadError};
use std::sync::{Arc, Mutex};

each_flavour! {
    fn an_effect_whose_cleanup_disposes_it_runs_no_more(cx) {
        // The cleanup runs before the re-run, and disposes the effect it
        // cleans up after: the re-run does not happen, and nothing after.
        let h = cx.handle();
        let s = cx.signal(0);
        let me = Arc::new(Mutex::new(None::<egress_reactive::Effect<_>>));
        let log = Log::default();
        let e = cx.effect({
            let (h, s, me, log) = (h.clone(), s.clone(), me.clone(), log.clone());
            move || {
                let v = s.get();
                log.push(format!("run {v}"));
                let (me, log) = (me.clone(), log.clone());
                h.on_cleanup(move || {
                    log.push(format!("clean {v}"));
                    if let Some(e) = me.lock().unwrap().take() {
                        e.dispose();
                    }
                });
            }
        });
        *me.lock().unwrap() = Some(e.clone());
        s.set(1);
        assert_eq!(log.take(), ["run 0", "clean 0"]);
        assert!(e.is_disposed(), "disposed by its own cleanup");
        s.set(2);
        assert!(log.take().is_empty());
    }

    fn a_child_whose_cleanup_disposes_it_goes_when_its_owner_reruns(cx) {
        // The owner's re-run disposes its child; the child's cleanup
        // disposes the child too and creates a node the child owns: both
        // are freed, run after run.
        let h = cx.handle();
        let s = cx.signal(0);
        let log = Log::default();
        let outer = cx.effect({
            let (h, s, log) = (h.clone(), s.clone(), log.clone());
            move || {
                let v = s.get();
                let me = Arc::new(Mutex::new(None::<egress_reactive::Effect<_>>));
                let child = h.effect({
                    let (h, me, log) = (h.clone(), me.clone(), log.clone());
                    move || {
                        let (h2, me, log) = (h.clone(), me.clone(), log.clone());
                        h.on_cleanup(move || {
                            log.push(format!("clean {v}"));
                            if let Some(e) = me.lock().unwrap().take() {
                                e.dispose();
                            }
                            drop(h2.signal(v));
                        });
                    }
                });
                *me.lock().unwrap() = Some(child);
            }
        });
        let count = cx.node_count();
        for v in 1..=3 {
            s.set(v);
            assert_eq!(log.take(), [format!("clean {}", v - 1)]);
            assert_eq!(cx.node_count(), count, "the child and what its cleanup made are freed");
        }
        outer.dispose();
    }

    fn a_scope_disposed_inside_its_nested_runs_goes_when_the_outer_run_ends(cx) {
        let h = cx.handle();
        let log = Log::default();
        let (scope, ()) = cx.scope(|| {
            let log = log.clone();
            h.on_cleanup(move || log.push("cleaned"));
        });
        scope.run(|| {
            scope.run(|| log.push("inner"));
            scope.dispose();
            log.push("outer goes on");
        });
        assert_eq!(log.take(), ["inner", "outer goes on", "cleaned"], "disposed when the outer run returned");
        assert!(scope.is_disposed());
    }

    fn a_panic_of_a_cleanup_of_a_scope_disposed_in_its_run_reaches_the_run(cx) {
        let h = cx.handle();
        let (scope, ()) = cx.scope(|| {});
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            scope.run(|| {
                h.on_cleanup(|| panic!("the scope's cleanup"));
                scope.dispose();
            })
        }));
        let message = ran.expect_err("the cleanup's panic goes on").downcast::<&str>().map(|m| *m);
        assert_eq!(message.ok(), Some("the scope's cleanup"));
        assert!(scope.is_disposed());
    }

    fn effects_whose_cleanups_dispose_them_go_with_their_scope(cx) {
        let h = cx.handle();
        let base = cx.node_count();
        let log = Log::default();
        let (scope, effects) = cx.scope(|| {
            let signal = cx.signal(7);
            (0..3)
                .map(|i| {
                    let me = Arc::new(Mutex::new(None::<egress_reactive::Effect<_>>));
                    let e = cx.effect({
                        let (h, signal, me, log) = (h.clone(), signal.clone(), me.clone(), log.clone());
                        move || {
                            log.push(format!("run {i} {}", signal.get()));
                            let (me, log, h2) = (me.clone(), log.clone(), h.clone());
                            h.on_cleanup(move || {
                                log.push(format!("clean {i}"));
                                if let Some(e) = me.lock().unwrap().take() {
                                    e.dispose();
                                }
                                // Owned by the doomed effect: freed with it.
                                drop(h2.signal(i));
                            });
                        }
                    });
                    *me.lock().unwrap() = Some(e.clone());
                    e
                })
                .collect::<Vec<_>>()
        });
        assert_eq!(log.take(), ["run 0 7", "run 1 7", "run 2 7"]);
        scope.dispose();
        assert_eq!(log.take(), ["clean 2", "clean 1", "clean 0"], "later siblings first, each once");
        assert!(effects.iter().all(|e| e.is_disposed()));
        assert_eq!(cx.node_count(), base, "every node freed");
        let again = cx.signal(1);
        let seen = Log::default();
        cx.effect({ let (again, seen) = (again.clone(), seen.clone()); move || seen.push(again.get().to_string()) });
        again.set(2);
        assert_eq!(seen.take(), ["1", "2"], "the graph goes on");
    }

    fn a_disposed_signal_lets_go_of_its_own_equality(cx) {
        let held = Arc::new(());
        let (scope, signal) = cx.scope(|| {
            let held = held.clone();
            cx.signal_with(1u32, move |a: &u32, b: &u32| { let _ = &held; a == b })
        });
        assert_eq!(Arc::strong_count(&held), 2, "the equality holds its capture");
        // Read by an effect outside the scope: the signal goes with a
        // subscriber still linked to it.
        let reader = cx.effect({ let signal = signal.clone(); move || { let _ = signal.try_get(); } });
        signal.set(1);
        scope.dispose();
        drop(reader);
        assert_eq!(Arc::strong_count(&held), 1, "disposed with the signal, not left in the graph");
        // And a signal made in the freed slot does not use it.
        let plain = cx.signal(1u32);
        let fx = cx.effect({ let plain = plain.clone(); move || { plain.get(); } });
        plain.set(1);
        plain.set(2);
        assert_eq!(fx.runs(), 2, "the plain signal's own equality");
    }

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

    fn a_scope_disposes_its_signals_later_ones_first_values_and_closures_alike(cx) {
        // Each value (and the effect's closure) says when it is dropped.
        struct Said(&'static str, Log);
        impl Drop for Said {
            fn drop(&mut self) {
                self.1.push(self.0);
            }
        }
        let log = Log::new();
        let (scope, ()) = cx.scope(|| {
            let _a = cx.signal(Said("a", log.clone()));
            let said = Said("effect", log.clone());
            cx.effect(move || { let _ = &said; });
            // Signals of one value block, freed one after another.
            for name in ["b", "c", "d"] {
                let _ = cx.signal(Said(name, log.clone()));
            }
        });
        assert!(log.take().is_empty());
        drop(scope);
        assert_eq!(log.take(), ["d", "c", "b", "effect", "a"]);
    }

    fn a_value_whose_drop_panics_leaves_the_others_of_its_block_dropped_once(cx) {
        // Signals of one value block share its pointer when freed together;
        // one value's panicking destructor must not cost the others theirs.
        struct Said(&'static str, Log, bool);
        impl Drop for Said {
            fn drop(&mut self) {
                self.1.push(self.0);
                assert!(!self.2, "{} panics when dropped", self.0);
            }
        }
        let log = Log::new();
        let nodes = cx.node_count();
        let (scope, ()) = cx.scope(|| {
            for (name, panics) in [("a", false), ("b", true), ("c", false), ("d", false)] {
                let _ = cx.signal(Said(name, log.clone(), panics));
            }
        });
        let disposed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scope.dispose()));
        assert!(disposed.is_err(), "the destructor's panic reaches the disposal");
        assert_eq!(log.take(), ["d", "c", "b", "a"], "each value dropped once, in order");
        assert_eq!(cx.node_count(), nodes);
        let after = cx.signal(Said("e", log.clone(), false));
        assert!(after.try_with(|s| s.0).is_ok_and(|n| n == "e"));
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

    fn disposing_a_signal_drops_its_value_at_once(cx) {
        let token = Arc::new(());
        let line = line!() + 1;
        let a = cx.signal(token.clone());
        let b = cx.signal(token.clone());
        assert_eq!(Arc::strong_count(&token), 3);
        a.dispose();
        assert_eq!(Arc::strong_count(&token), 2, "a's value went with it, though its handle lives");
        match a.try_get() {
            Err(ReadError::Disposed { kind: NodeKind::Signal, created_at }) => assert_eq!(created_at.line(), line),
            other => panic!("expected a disposed read, got {other:?}"),
        }
        assert!(Arc::ptr_eq(&b.get(), &token));
        assert_eq!(a.created_at().line(), line);
    }

    fn stale_signal_handles_keep_their_own_creation_site(cx) {
        let line = line!() + 1;
        let a = cx.signal(0u64);
        a.dispose();
        // Enough signals of the same type to fill several value blocks.
        let others: Vec<_> = (0..300u64).map(|i| cx.signal(i)).collect();
        match a.try_get() {
            Err(ReadError::Disposed { created_at, .. }) => assert_eq!(created_at.line(), line),
            other => panic!("expected a disposed read, got {other:?}"),
        }
        assert!(a.try_set(5).is_err());
        assert!(others.iter().enumerate().all(|(i, s)| s.get() == i as u64));
    }

    fn signals_of_many_types_keep_their_values(cx) {
        let ints: Vec<_> = (0..200i64).map(|i| cx.signal(i)).collect();
        let texts: Vec<_> = (0..200).map(|i| cx.signal(format!("t{i}"))).collect();
        let bytes: Vec<_> = (0..200u8).map(|i| cx.signal(vec![i; 3])).collect();
        let units: Vec<_> = (0..200).map(|_| cx.signal(())).collect();
        for i in (0..200).step_by(2) {
            ints[i].dispose();
            texts[i].dispose();
            bytes[i].dispose();
        }
        for i in (1..200).step_by(2) {
            texts[i].update(|t| t.push('!'));
            assert_eq!(ints[i].get(), i as i64);
            assert_eq!(texts[i].get(), format!("t{i}!"));
            assert_eq!(bytes[i].get(), vec![i as u8; 3]);
        }
        assert!(ints[0].try_get().is_err() && texts[0].try_get().is_err() && bytes[0].try_get().is_err());
        assert!(units.iter().all(|u| u.try_get().is_ok()));
        // Values larger than a block's byte bound: one slot per block.
        let big: Vec<_> = (0..5u8).map(|i| cx.signal([i; 5000])).collect();
        big[2].dispose();
        for (i, s) in big.iter().enumerate() {
            assert_eq!(s.try_with(|a| a[4999]).ok(), (i != 2).then_some(i as u8));
        }
    }

    fn dropping_the_context_drops_signal_values_with_handles_alive(cx) {
        let token = Arc::new(());
        let h = cx.handle();
        let s = cx.signal(token.clone());
        let c = cx.computed({ let s = s.clone(); move || Arc::strong_count(&s.get()) });
        assert!(c.get() >= 2);
        drop(cx);
        assert_eq!(Arc::strong_count(&token), 1, "values and closures were dropped");
        assert!(s.try_get().is_err() && c.try_get().is_err());
        assert_eq!((h.node_count(), h.link_count()), (1, 0), "only the root is left");
        // A node made through a surviving handle is born disposed: nothing
        // would ever dispose it (and a value holding a handle would keep
        // the graph alive for good).
        let fresh = h.signal(7);
        assert!(fresh.try_get().is_err() && fresh.is_disposed());
        assert_eq!(h.node_count(), 1);
    }

    fn dropping_the_last_pointer_to_the_graph_drops_every_value(cx) {
        let token = Arc::new(());
        let signals: Vec<_> = (0..100).map(|_| cx.signal(token.clone())).collect();
        drop(signals);
        assert_eq!(Arc::strong_count(&token), 101, "values live with their nodes, not their handles");
        drop(cx);
        assert_eq!(Arc::strong_count(&token), 1);
    }

    fn a_value_dropped_with_the_context_may_read_the_graph(cx) {
        struct ReadsOnDrop<S: Fn() -> bool>(S, Log);
        impl<S: Fn() -> bool> Drop for ReadsOnDrop<S> {
            fn drop(&mut self) {
                self.1.push(if (self.0)() { "read ok" } else { "read disposed" });
            }
        }
        let log = Log::new();
        let other = cx.signal(1);
        let keep = other.clone();
        let _s = cx.signal(ReadsOnDrop(move || keep.try_get().is_ok(), log.clone()));
        drop(cx);
        assert_eq!(log.take(), ["read disposed"]);
        assert!(other.try_get().is_err());
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

/// Registers a cleanup that counts its run and registers itself again.
fn again(h: Handle<Local>, runs: Arc<Mutex<u32>>, dropped: Arc<Mutex<u32>>) {
    struct Dropped(Arc<Mutex<u32>>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            *self.0.lock().unwrap() += 1;
        }
    }
    let token = Dropped(dropped.clone());
    let h2 = h.clone();
    h.on_cleanup(move || {
        let _token = token;
        *runs.lock().unwrap() += 1;
        again(h2, runs, dropped);
    });
}

#[test]
fn cleanups_that_keep_registering_cleanups_stop_after_the_bound() {
    // Each round's cleanup registers the next one: MAX_FLUSH_ROUNDS rounds
    // run, the next is dropped unrun, and the disposal ends.
    let cx = Context::new();
    let base = cx.node_count();
    let (runs, dropped) = (Arc::new(Mutex::new(0)), Arc::new(Mutex::new(0)));
    let (scope, ()) = cx.scope(|| {
        cx.effect({
            let (h, runs, dropped) = (cx.handle(), runs.clone(), dropped.clone());
            move || again(h.clone(), runs.clone(), dropped.clone())
        });
    });
    scope.dispose();
    assert_eq!(*runs.lock().unwrap(), MAX_FLUSH_ROUNDS);
    assert_eq!(*dropped.lock().unwrap(), MAX_FLUSH_ROUNDS + 1, "the unrun one dropped too");
    assert_eq!(cx.node_count(), base);
}
