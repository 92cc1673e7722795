#![allow(clippy::unwrap_used, clippy::arc_with_non_send_sync)]
//! Panics, disposal from anywhere, and misuse, on every flavour: nothing
//! wedges, leaks, hangs or runs in the wrong place. Each test is one of the
//! ways the graph used to break (see the rules in the crate docs).

mod common;
use common::{Counter, Log};
use egress_reactive::{NodeKind, ReadError};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

fn panics(f: impl FnOnce()) -> bool {
    catch_unwind(AssertUnwindSafe(f)).is_err()
}

each_flavour! {
    fn an_effect_over_a_computed_that_panicked_once_runs_again(cx) {
        let a = cx.signal(0);
        let other = cx.signal(0);
        let c = cx.computed({ let a = a.clone(); move || { let v = a.get(); assert!(v != 1, "one is not allowed"); v } });
        let seen = Log::new();
        let e = cx.effect({
            let (c, other, seen) = (c.clone(), other.clone(), seen.clone());
            move || seen.push(format!("{} {}", c.get(), other.get()))
        });
        assert_eq!(seen.take(), ["0 0"]);
        assert!(panics(|| a.set(1)), "the writer sees the panic");
        // Its other direct dependency still reaches it (the computed fails
        // again: the failure is not cached, and the panic reaches the writer).
        assert!(panics(|| other.set(1)));
        // The computed recovers: the effect runs with it.
        a.set(2);
        assert_eq!(seen.take(), ["2 1"]);
        other.set(2);
        assert_eq!(seen.take(), ["2 2"]);
        assert!(e.runs() >= 3);
    }

    fn a_reader_that_caught_a_computeds_first_panic_runs_again_when_it_recovers(cx) {
        // The effect's first read of `c` panics, and the effect catches it:
        // it depends on `c` all the same, so `c`'s recovery reaches it.
        let a = cx.signal(0);
        let c = cx.computed({ let a = a.clone(); move || { let v = a.get(); assert!(v != 0, "zero is not allowed"); v } });
        let seen = Log::new();
        cx.effect({
            let (c, seen) = (c.clone(), seen.clone());
            move || match catch_unwind(AssertUnwindSafe(|| c.get())) {
                Ok(v) => seen.push(v.to_string()),
                Err(_) => seen.push("panicked"),
            }
        });
        assert_eq!(seen.take(), ["panicked"]);
        a.set(3);
        assert_eq!(seen.take(), ["3"], "the recovery reached the reader");
    }

    fn an_equality_that_reads_its_own_signal_panics_and_changes_nothing(cx) {
        let me = Arc::new(Mutex::new(None::<egress_reactive::Signal<u32, _>>));
        let s = cx.signal_with(1u32, {
            let me = me.clone();
            move |a: &u32, b: &u32| {
                let own = me.lock().unwrap().clone();
                if let Some(s) = own {
                    let _ = s.try_get();
                }
                a == b
            }
        });
        let runs = Counter::new();
        cx.effect({ let (s, r) = (s.clone(), runs.clone()); move || { s.get(); r.hit(); } });
        *me.lock().unwrap() = Some(s.clone());
        assert!(panics(|| s.set(2)), "the value is lent to the equality");
        me.lock().unwrap().take();
        assert_eq!((s.get(), runs.get()), (1, 1), "the write did not happen");
        s.set(2);
        assert_eq!((s.get(), runs.get()), (2, 2), "the signal takes writes as before");
    }

    fn a_chain_left_half_checked_by_a_panic_is_revalidated(cx) {
        let a = cx.signal(0);
        let c1 = cx.computed({ let a = a.clone(); move || { let v = a.get(); assert!(v != 1, "no ones"); v } });
        let c2 = cx.computed({ let c1 = c1.clone(); move || c1.get() * 10 });
        let seen = Log::new();
        cx.effect({ let (c2, seen) = (c2.clone(), seen.clone()); move || seen.push(c2.get().to_string()) });
        assert!(panics(|| a.set(1)));
        a.set(2);
        assert_eq!(seen.take(), ["0", "20"]);
        assert_eq!(c2.get(), 20);
    }

    fn a_walk_cut_short_above_its_first_frame_leaves_nothing_marked(cx) {
        // e reads l, l reads c2 then c1, c2 reads c1, c1 reads s. A write
        // that makes c2 panic while e re-validates (c1 recomputed, c2
        // recomputed from the frame of l): l must not stay marked, or the
        // next change never reaches e.
        let s = cx.signal(0i64);
        let c1 = cx.computed({ let s = s.clone(); move || s.get() });
        let c2 = cx.computed({ let c1 = c1.clone(); move || { let v = c1.get(); assert!(v != 1, "c2 fails at 1"); v } });
        let l = cx.computed({ let (c1, c2) = (c1.clone(), c2.clone()); move || c2.get() + c1.get() });
        let seen = Log::new();
        cx.effect({ let (l, seen) = (l.clone(), seen.clone()); move || seen.push(l.get().to_string()) });
        assert!(panics(|| s.set(1)));
        s.set(2);
        assert_eq!(seen.take(), ["0", "4"]);
    }

    fn a_scope_dropped_by_a_panic_whose_cleanup_panics_does_not_abort(cx) {
        let h = cx.handle();
        let ran = Counter::new();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let (_scope, ()) = cx.scope(|| {
                let ran = ran.clone();
                h.on_cleanup(move || {
                    ran.hit();
                    panic!("the cleanup panics too");
                });
            });
            panic!("the first panic");
        }));
        assert!(outcome.is_err(), "the first panic went on (a second would have aborted the process)");
        assert_eq!(ran.get(), 1, "the cleanup ran");
        let s = cx.signal(1);
        assert_eq!(s.get(), 1);
    }

    fn a_context_dropped_by_a_panic_whose_cleanup_panics_does_not_abort(cx) {
        let h = cx.handle();
        let ran = Counter::new();
        let outcome = catch_unwind(AssertUnwindSafe(move || {
            let _cx = cx;
            let ran = ran.clone();
            h.on_cleanup(move || {
                ran.hit();
                panic!("the cleanup panics too");
            });
            panic!("the first panic");
        }));
        assert!(outcome.is_err());
    }

    fn an_effect_whose_cleanup_panics_runs_again_later(cx) {
        let a = cx.signal(0);
        let h = cx.handle();
        let runs = Counter::new();
        cx.effect({
            let (a, h, runs) = (a.clone(), h.clone(), runs.clone());
            move || {
                runs.hit();
                let v = a.get();
                h.on_cleanup(move || assert!(v != 1, "the cleanup of run 1 panics"));
            }
        });
        a.set(1);
        assert!(panics(|| a.set(2)), "the cleanup's panic reaches the writer");
        a.set(3);
        assert_eq!(runs.get(), 3, "run at 0, at 1, not at 2 (its cleanup failed), at 3");
    }

    fn a_panicking_effect_does_not_stop_the_others_in_its_flush(cx) {
        let a = cx.signal(0);
        let log = Log::new();
        cx.effect({ let (a, log) = (a.clone(), log.clone()); move || { let v = a.get(); log.push(format!("first {v}")); assert!(v != 1, "first fails at 1"); } });
        cx.effect({ let (a, log) = (a.clone(), log.clone()); move || log.push(format!("second {}", a.get())) });
        assert_eq!(log.take(), ["first 0", "second 0"]);
        assert!(panics(|| a.set(1)), "the first panic reaches the writer, after the flush");
        assert_eq!(log.take(), ["first 1", "second 1"], "the second ran in the same flush");
        a.set(2);
        assert_eq!(log.take(), ["first 2", "second 2"]);
    }

    fn an_effect_disposed_by_its_own_cleanup_stops_cleanly(cx) {
        let a = cx.signal(0);
        let slot: Arc<Mutex<Option<egress_reactive::Effect<_>>>> = Arc::new(Mutex::new(None));
        let h = cx.handle();
        let e = cx.effect({
            let (a, slot, h) = (a.clone(), slot.clone(), h.clone());
            move || {
                a.get();
                let slot = slot.clone();
                h.on_cleanup(move || {
                    if let Some(me) = slot.lock().unwrap().take() { me.dispose(); }
                });
            }
        });
        *slot.lock().unwrap() = Some(e.clone());
        a.set(1);
        assert!(e.is_disposed());
        // The graph still works.
        let b = cx.signal(0);
        let seen = Counter::new();
        cx.effect({ let (b, seen) = (b.clone(), seen.clone()); move || { b.get(); seen.hit(); } });
        b.set(1);
        assert_eq!(seen.get(), 2);
    }

    fn a_computed_that_disposes_an_effect_reading_it_stops_it_cleanly(cx) {
        let a = cx.signal(0);
        let slot: Arc<Mutex<Option<egress_reactive::Effect<_>>>> = Arc::new(Mutex::new(None));
        let c = cx.computed({
            let (a, slot) = (a.clone(), slot.clone());
            move || {
                let v = a.get();
                if v == 1 && let Some(e) = slot.lock().unwrap().take() { e.dispose(); }
                v
            }
        });
        let runs = Counter::new();
        let e = cx.effect({ let (c, runs) = (c.clone(), runs.clone()); move || { c.get(); runs.hit(); } });
        *slot.lock().unwrap() = Some(e.clone());
        a.set(1);
        assert!(e.is_disposed());
        assert_eq!(runs.get(), 1, "disposed before it could run again");
        a.set(2);
        assert_eq!(c.get(), 2);
    }

    fn running_in_a_disposed_scope_is_an_error_not_a_hang(cx) {
        let (scope, ()) = cx.scope(|| {});
        scope.dispose();
        assert!(matches!(scope.try_run(|| ()), Err(ReadError::Disposed { kind: NodeKind::Scope, .. })));
        assert!(panics(|| { let _ = scope.run(|| cx.signal(1)); }));
        // Its slot, reused by another scope, is not this one's.
        let (other, ()) = cx.scope(|| {});
        assert!(scope.try_run(|| cx.signal(2)).is_err());
        let nodes = cx.node_count();
        other.dispose();
        assert_eq!(cx.node_count(), nodes - 1, "nothing was parented to the other scope");
        // The graph works.
        let s = cx.signal(3);
        assert_eq!(s.get(), 3);
    }

    fn a_cleanup_disposing_its_scope_during_an_outer_dispose_finishes_the_walk(cx) {
        let a = cx.signal(0);
        let runs = Counter::new();
        let slot: Arc<Mutex<Option<egress_reactive::Scope<_>>>> = Arc::new(Mutex::new(None));
        let h = cx.handle();
        let (outer, ()) = cx.scope(|| {
            let (inner, ()) = h.scope(|| {
                cx.effect({ let a = a.clone(); move || { a.get(); } });
                let slot = slot.clone();
                h.on_cleanup(move || { if let Some(s) = slot.lock().unwrap().take() { s.dispose(); } });
            });
            *slot.lock().unwrap() = Some(inner);
            cx.effect({ let (a, runs) = (a.clone(), runs.clone()); move || { a.get(); runs.hit(); } });
        });
        let nodes = cx.node_count();
        outer.dispose();
        assert!(outer.is_disposed());
        assert!(cx.node_count() < nodes);
        a.set(1);
        assert_eq!(runs.get(), 1, "the outer scope's effect was disposed too");
    }

    fn a_cleanup_registered_after_its_effect_disposed_itself_runs_with_it(cx) {
        let a = cx.signal(0);
        let log = Log::new();
        let slot: Arc<Mutex<Option<egress_reactive::Effect<_>>>> = Arc::new(Mutex::new(None));
        let h = cx.handle();
        let e = cx.effect({
            let (a, log, slot, h) = (a.clone(), log.clone(), slot.clone(), h.clone());
            move || {
                if a.get() == 1 {
                    if let Some(me) = slot.lock().unwrap().take() { me.dispose(); }
                    let log = log.clone();
                    h.on_cleanup(move || log.push("late cleanup"));
                }
            }
        });
        *slot.lock().unwrap() = Some(e.clone());
        a.set(1);
        assert!(e.is_disposed());
        assert_eq!(log.take(), ["late cleanup"], "it ran when its effect went, not later with a stranger");
        // A new node in the freed slot gets no stranger's cleanup.
        let (s, ()) = cx.scope(|| {});
        s.dispose();
        assert!(log.take().is_empty());
    }

    fn cleanups_run_untracked(cx) {
        let a = cx.signal(0);
        let b = cx.signal(0);
        let h = cx.handle();
        let (scope, ()) = cx.scope(|| {
            cx.effect({ let (h, b) = (h.clone(), b.clone()); move || { let b = b.clone(); h.on_cleanup(move || { b.get(); }); } });
        });
        let slot = Arc::new(Mutex::new(Some(scope)));
        let runs = Counter::new();
        let e = cx.effect({
            let (a, runs, slot) = (a.clone(), runs.clone(), slot.clone());
            move || {
                runs.hit();
                if a.get() == 1 && let Some(s) = slot.lock().unwrap().take() { s.dispose(); }
            }
        });
        a.set(1);
        assert_eq!(e.dependency_count(), 1, "the cleanup's read of b is not the effect's");
        b.set(1);
        assert_eq!(runs.get(), 2);
    }

    fn an_effect_created_after_its_context_dropped_never_runs_and_leaks_nothing(cx) {
        let h = cx.handle();
        drop(cx);
        let token = Arc::new(());
        let runs = Counter::new();
        let e = h.effect({ let (t, runs) = (token.clone(), runs.clone()); move || { let _ = &t; runs.hit(); } });
        assert_eq!(runs.get(), 0);
        assert!(e.is_disposed());
        assert_eq!(Arc::strong_count(&token), 1, "the closure was dropped: no handle/graph cycle");
        let s = h.signal(token.clone());
        assert!(s.try_get().is_err());
        assert_eq!(Arc::strong_count(&token), 1);
        let c = h.computed(|| 1);
        assert!(c.try_get().is_err());
    }

    fn a_signal_with_its_own_equality_notifies_only_on_a_difference(cx) {
        let s = cx.signal_with(1.0f64, |a: &f64, b: &f64| (a - b).abs() < 0.5);
        let runs = Counter::new();
        cx.effect({ let (s, runs) = (s.clone(), runs.clone()); move || { s.get(); runs.hit(); } });
        s.set(1.2);
        assert_eq!(runs.get(), 1, "within the tolerance: no change");
        assert_eq!(s.get(), 1.0, "and the value kept");
        s.set(2.0);
        assert_eq!(runs.get(), 2);
        let tol = 10;
        let c = cx.computed_with(move |a: &i32, b: &i32| (a - b).abs() < tol, { let s = s.clone(); move || s.get() as i32 * 3 });
        assert_eq!(c.get(), 6);
    }
}

#[test]
fn two_thread_safe_graphs_reading_each_other_from_effects_do_not_deadlock() {
    use egress_reactive::ThreadSafeContext;
    let (ga, gb) = (ThreadSafeContext::new(), ThreadSafeContext::new());
    let (a, b) = (ga.signal(0u64), gb.signal(0u64));
    let refused = Arc::new(std::sync::atomic::AtomicU64::new(0));
    // Each graph's effect reads the other graph's signal.
    ga.effect({
        let (a, b, r) = (a.clone(), b.clone(), refused.clone());
        move || {
            a.get();
            if matches!(b.try_get(), Err(ReadError::ForeignGraph { .. })) {
                r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    gb.effect({
        let (a, b, r) = (a.clone(), b.clone(), refused.clone());
        move || {
            b.get();
            if matches!(a.try_get(), Err(ReadError::ForeignGraph { .. })) {
                r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    for (s, tx) in [(a.clone(), done_tx.clone()), (b.clone(), done_tx.clone())] {
        std::thread::spawn(move || {
            for i in 1..=2_000 {
                s.set(i);
            }
            let _ = tx.send(());
        });
    }
    for _ in 0..2 {
        done_rx.recv_timeout(std::time::Duration::from_secs(20)).expect("no deadlock within 20 s");
    }
    assert!(refused.load(std::sync::atomic::Ordering::SeqCst) >= 2, "the foreign reads were refused");
}
