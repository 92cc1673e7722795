#![allow(clippy::unwrap_used, clippy::arc_with_non_send_sync)] // Arc: one test body serves the local and the thread-safe flavours
//! What disposal leaves behind: a computation that read a disposed node
//! runs again before its value is used (and fails there while it still
//! reads it), an effect is not run by the disposal itself, and a scope's
//! teardown can be cancelled.

mod common;
use std::panic::{AssertUnwindSafe, catch_unwind};

use common::Log;

each_flavour! {
    fn a_reader_of_a_disposed_computed_fails_at_its_next_read_instead_of_serving_its_value(cx) {
        let src = cx.signal(4);
        let derived = cx.computed({ let src = src.clone(); move || src.get() });
        let reader = cx.computed({ let d = derived.clone(); move || d.get() + 1 });
        assert_eq!(reader.get(), 5);
        derived.dispose();
        for _ in 0..2 {
            // It stays broken: every read runs it again, and it fails again.
            let runs = reader.runs();
            assert!(catch_unwind(AssertUnwindSafe(|| reader.get())).is_err(), "served a value computed from a disposed node");
            assert_eq!(reader.runs(), runs + 1);
        }
        assert!(!reader.is_disposed());
    }

    fn a_reader_that_no_longer_reads_the_disposed_node_recovers(cx) {
        let src = cx.signal(4);
        let use_derived = cx.signal(true);
        let derived = cx.computed({ let src = src.clone(); move || src.get() * 10 });
        let reader = cx.computed({
            let (d, src, use_derived) = (derived.clone(), src.clone(), use_derived.clone());
            move || if use_derived.get() { d.try_get().unwrap_or(-1) } else { src.get() }
        });
        assert_eq!(reader.get(), 40);
        derived.dispose();
        assert_eq!(reader.get(), -1, "the read ran it again");
        use_derived.set(false);
        assert_eq!(reader.get(), 4);
        src.set(5);
        assert_eq!(reader.get(), 5);
    }

    fn disposal_runs_no_effect_and_an_unrelated_write_does_not_either(cx) {
        let src = cx.signal(1);
        let other = cx.signal(100);
        let mid = cx.computed({ let src = src.clone(); move || src.get() + 10 });
        let log = Log::new();
        let watch = cx.effect({ let (mid, log) = (mid.clone(), log.clone()); move || log.push(format!("watch {:?}", mid.try_get().ok())) });
        cx.effect({ let (other, log) = (other.clone(), log.clone()); move || log.push(format!("keeper {}", other.get())) });
        assert_eq!(log.take(), ["watch Some(11)", "keeper 100"]);
        mid.dispose();
        assert_eq!(log.take(), Vec::<String>::new());
        other.set(200);
        assert_eq!(log.take(), ["keeper 200"]);
        assert!(!watch.is_disposed());
    }

    fn an_effect_that_read_a_disposed_node_runs_again_when_another_of_its_sources_changes(cx) {
        let src = cx.signal(1);
        let other = cx.signal(0);
        let mid = cx.computed({ let src = src.clone(); move || src.get() + 10 });
        // `other` read first, so its change queues the effect as pending
        // and the re-validation, not the write, decides that it runs.
        let below = cx.computed({ let other = other.clone(); move || other.get() % 2 });
        let log = Log::new();
        cx.effect({
            let (below, mid, log) = (below.clone(), mid.clone(), log.clone());
            move || log.push(format!("{} {:?}", below.get(), mid.try_get().ok()))
        });
        assert_eq!(log.take(), ["0 Some(11)"]);
        mid.dispose();
        // `below` keeps its value (2 % 2 == 0): only the disposal makes the
        // effect run again, and it sees the node gone.
        other.set(2);
        assert_eq!(log.take(), ["0 None"]);
        other.set(4);
        assert_eq!(log.take(), Vec::<String>::new());
    }

    fn a_disarmed_scope_disposes_nothing_and_its_nodes_go_on(cx) {
        let topic = cx.signal(1);
        let log = Log::new();
        let (scope, (escaped, watch)) = cx.scope(|| {
            let escaped = cx.computed({ let t = topic.clone(); move || t.get() + 5 });
            let watch = cx.effect({ let (e, log) = (escaped.clone(), log.clone()); move || log.push(format!("watch {}", e.get())) });
            (escaped, watch)
        });
        assert_eq!(scope.owned_count(), 2);
        let nodes = cx.node_count();
        scope.disarm();
        assert_eq!(scope.owned_count(), 0);
        assert_eq!(cx.node_count(), nodes);
        scope.dispose();
        assert!(!escaped.is_disposed() && !watch.is_disposed());
        topic.set(4);
        assert_eq!(log.take(), ["watch 6", "watch 9"]);
        // They belong to the context now, in the order they were made,
        // and can still be disposed one by one.
        watch.dispose();
        escaped.dispose();
        assert_eq!(topic.subscriber_count(), 0);
    }

    fn a_disarmed_scope_inside_an_effect_hands_its_nodes_to_the_effect(cx) {
        let trigger = cx.signal(0);
        let made = Log::new();
        let h = cx.handle();
        let outer = cx.effect({
            let (trigger, made, h) = (trigger.clone(), made.clone(), h.clone());
            move || {
                trigger.get();
                let (scope, inner) = h.scope(|| h.signal(7));
                scope.disarm();
                drop(scope);
                made.push(format!("{}", inner.get()));
            }
        });
        let count = cx.node_count();
        trigger.set(1);
        // The rerun disposed what the first run made (the effect owned it).
        assert_eq!(cx.node_count(), count);
        assert_eq!(made.take(), ["7", "7"]);
        outer.dispose();
    }

    fn disarm_keeps_creation_order_for_teardown(cx) {
        let log = Log::new();
        let (outer, ()) = cx.scope(|| {
            let h = cx.handle();
            let (inner, ()) = cx.scope(|| {
                for name in ["a", "b", "c"] {
                    let log = log.clone();
                    let h2 = h.clone();
                    cx.effect(move || { let log = log.clone(); h2.on_cleanup(move || log.push(name)); });
                }
            });
            inner.disarm();
            drop(inner);
            let log = log.clone();
            cx.effect(move || { let log = log.clone(); h.on_cleanup(move || log.push("d")); });
        });
        outer.dispose();
        assert_eq!(log.take(), ["d", "c", "b", "a"]);
    }


    // Found by attacking the first version of the mark: it reached only the
    // direct readers, a running reader was marked for a node it no longer
    // read, and a scope disarmed from a cleanup of its own disposal let the
    // disposal walk climb out of it.
    fn a_reader_two_steps_from_a_disposed_node_fails_too(cx) {
        let src = cx.signal(4);
        let d = cx.computed({ let s = src.clone(); move || s.get() * 10 });
        let c = cx.computed({ let d = d.clone(); move || d.get() + 1 });
        let x = cx.computed({ let c = c.clone(); move || c.get() + 100 });
        let watch = cx.effect({ let x = x.clone(); move || { let _ = x.try_get(); } });
        assert_eq!(x.get(), 141);
        d.dispose();
        assert!(catch_unwind(AssertUnwindSafe(|| x.get())).is_err(), "x served 141, computed from a disposed node");
        assert!(catch_unwind(AssertUnwindSafe(|| c.get())).is_err());
        watch.dispose();
    }

    fn a_run_that_disposes_a_node_it_no_longer_reads_is_not_run_again_for_it(cx) {
        let flag = cx.signal(true);
        let base = cx.signal(1);
        let parity = cx.computed({ let b = base.clone(); move || b.get() % 2 });
        let x = cx.signal(100);
        let log = Log::new();
        cx.effect({
            let (flag, parity, x, log) = (flag.clone(), parity.clone(), x.clone(), log.clone());
            move || {
                let p = parity.get();
                if flag.get() {
                    log.push(format!("p{p} x{}", x.get()));
                } else {
                    x.dispose();
                    log.push(format!("p{p} no x"));
                }
            }
        });
        assert_eq!(log.take(), ["p1 x100"]);
        flag.set(false);
        assert_eq!(log.take(), ["p1 no x"]);
        // parity stays 1: nothing the effect reads changed.
        base.set(3);
        assert_eq!(log.take(), Vec::<String>::new());

        let flag = cx.signal(true);
        let y = cx.signal(7);
        let c = cx.computed({
            let (flag, y) = (flag.clone(), y.clone());
            move || if flag.get() { y.get() } else { y.dispose(); 0 }
        });
        assert_eq!(c.get(), 7);
        flag.set(false);
        assert_eq!(c.get(), 0);
        let runs = c.runs();
        assert_eq!(c.get(), 0);
        assert_eq!(c.runs(), runs, "run again with nothing changed");
    }

    fn a_scope_disarmed_from_a_cleanup_of_its_own_disposal_disposes_nothing_outside_it(cx) {
        use std::sync::{Arc, Mutex};
        let h = cx.handle();
        let (scope, kept) = cx.scope(|| cx.signal(10));
        let after = cx.signal(2);
        let after_c = cx.computed({ let a = after.clone(); move || a.get() + 1 });
        let slot: Arc<Mutex<Option<Arc<egress_reactive::Scope<_>>>>> = Arc::new(Mutex::new(None));
        let eff = scope.run(|| {
            let (slot, h2) = (slot.clone(), h.clone());
            cx.effect(move || {
                let slot = slot.clone();
                h2.on_cleanup(move || {
                    if let Some(s) = slot.lock().unwrap().as_ref() {
                        s.disarm();
                    }
                });
            })
        });
        let scope = Arc::new(scope);
        *slot.lock().unwrap() = Some(scope.clone());
        scope.dispose();
        assert!(!after.is_disposed() && !after_c.is_disposed(), "the walk climbed out of the scope");
        assert_eq!(after_c.get(), 3);
        assert!(eff.is_disposed(), "the node whose cleanup ran was being disposed");
        assert!(!kept.is_disposed(), "what the scope still held was handed up");
        *slot.lock().unwrap() = None;
    }

    fn disarm_after_dispose_inside_run_is_a_no_op(cx) {
        let (scope, ()) = cx.scope(|| ());
        let made = scope.run(|| {
            let s = cx.signal(1);
            scope.dispose();
            scope.disarm();
            s
        });
        assert!(scope.is_disposed());
        assert!(made.is_disposed(), "disposal waited for the run, and disarm did not undo it");
    }

    fn a_failed_run_that_kept_a_disposed_dependency_runs_again(cx) {
        // Run 2 panics before reading `x`: its link to `x` is kept (a
        // change there must still reach it). Disposing `x` then marks the
        // effect, so the next change that queues it, even one its values
        // do not show, runs it.
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::sync::Arc;
        let x = cx.signal(1);
        let s = cx.signal(0);
        let boom = cx.signal(false);
        let parity = cx.computed({ let s = s.clone(); move || s.get() % 2 });
        let panics = Arc::new(AtomicU32::new(1));
        let log = Log::new();
        cx.effect({
            let (x, parity, boom, panics, log) = (x.clone(), parity.clone(), boom.clone(), panics.clone(), log.clone());
            move || {
                let p = parity.get();
                if boom.get() && panics.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                    std::panic::resume_unwind(Box::new("the second run fails"));
                }
                log.push(format!("{p} {:?}", x.try_get().ok()));
            }
        });
        assert_eq!(log.take(), ["0 Some(1)"]);
        assert!(catch_unwind(AssertUnwindSafe(|| boom.set(true))).is_err());
        assert_eq!(log.take(), Vec::<String>::new());
        x.dispose();
        s.set(2);
        assert_eq!(log.take(), ["0 None"]);
    }

    fn a_read_through_an_unchanged_computed_runs_nothing_again(cx) {
        // The read path's re-validation: `top` is pending after the write,
        // but `parity` keeps its value, so `top` is not run again.
        let a = cx.signal(1);
        let parity = cx.computed({ let a = a.clone(); move || a.get() % 2 });
        let top = cx.computed({ let p = parity.clone(); move || p.get() + 10 });
        assert_eq!(top.get(), 11);
        a.set(3);
        assert_eq!(top.get(), 11);
        assert_eq!((parity.runs(), top.runs()), (2, 1));
    }
}
