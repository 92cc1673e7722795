#![allow(clippy::unwrap_used, clippy::arc_with_non_send_sync)] // Arc: one test body serves the local and the thread-safe flavours
//! Effect lifecycle: first run, re-runs, cleanup order, nested effects,
//! writes inside effects, feedback loops.

mod common;
use common::{Counter, Log};
use egress_reactive::{MAX_FLUSH_ROUNDS, WriteError};

each_flavour! {
    fn a_stale_queue_entry_does_not_run_the_node_that_took_its_slot(cx) {
        // Two effects on one signal. At the write, the first to run
        // disposes the second (queued behind it) and creates a computed,
        // which takes the second's freed slot and is never read. The flush
        // then reaches the second's queue entry: stale, it must not run
        // the computed in the slot now.
        let s = cx.signal(0);
        let evaluated = Counter::new();
        let victim = std::sync::Arc::new(std::sync::Mutex::new(None));
        let made = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let h = cx.handle();
        let _first = cx.effect({
            let (s, victim, made, evaluated) = (s.clone(), victim.clone(), made.clone(), evaluated.clone());
            move || {
                if s.get() == 1 {
                    if let Some(second) = victim.lock().unwrap().take() {
                        let second: egress_reactive::Effect<_> = second;
                        second.dispose();
                    }
                    let evaluated = evaluated.clone();
                    made.lock().unwrap().push(h.computed(move || {
                        evaluated.hit();
                        1
                    }));
                }
            }
        });
        let second = cx.effect({
            let s = s.clone();
            move || {
                s.get();
            }
        });
        *victim.lock().unwrap() = Some(second);
        s.set(1);
        assert_eq!(made.lock().unwrap().len(), 1, "the computed was made");
        assert_eq!(evaluated.get(), 0, "the computed, never read, never ran");
    }

    fn runs_at_creation_and_after_each_change(cx) {
        let a = cx.signal(0);
        let runs = Counter::new();
        cx.effect({ let (a, r) = (a.clone(), runs.clone()); move || { a.get(); r.hit(); } });
        assert_eq!(runs.get(), 1);
        for i in 1..=10 {
            a.set(i);
        }
        assert_eq!(runs.get(), 11);
    }

    fn cleanup_runs_before_rerun_and_on_dispose(cx) {
        let a = cx.signal(1);
        let log = Log::new();
        let h = cx.handle();
        let fx = cx.effect({
            let (a, log) = (a.clone(), log.clone());
            move || {
                let v = a.get();
                log.push(format!("run {v}"));
                let log = log.clone();
                h.on_cleanup(move || log.push(format!("clean {v}")));
            }
        });
        a.set(2);
        fx.dispose();
        a.set(3);
        assert_eq!(log.take(), ["run 1", "clean 1", "run 2", "clean 2"]);
        assert!(fx.is_disposed());
        assert_eq!(fx.runs(), 0);
    }

    fn a_write_in_a_cleanup_run_by_a_flush_joins_that_flush(cx) {
        // The flush re-runs `a`; its cleanup writes `s`, which queues `b`:
        // `b` runs in the same flush, once, after `a`, and every later
        // round still runs.
        let h = cx.handle();
        let go = cx.signal(0);
        let s = cx.signal(0);
        let log = Log::default();
        cx.effect({
            let (h, go, s, log) = (h.clone(), go.clone(), s.clone(), log.clone());
            move || {
                let round = go.get();
                log.push(format!("a {round}"));
                let s = s.clone();
                h.on_cleanup(move || s.set(round + 1));
            }
        });
        cx.effect({ let (s, log) = (s.clone(), log.clone()); move || log.push(format!("b {}", s.get())) });
        assert_eq!(log.take(), ["a 0", "b 0"]);
        go.set(1);
        assert_eq!(log.take(), ["a 1", "b 1"], "one flush: a's cleanup queued b behind a");
        go.set(2);
        assert_eq!(log.take(), ["a 2", "b 2"], "and the next flush starts clean");
        assert_eq!(s.get(), 2);
    }

    fn cleanup_order_inner_first_and_siblings_last_created_first(cx) {
        let log = Log::new();
        let h = cx.handle();
        let (scope, ()) = cx.scope(|| {
            for name in ["outer1", "outer2"] {
                let (h2, log) = (h.clone(), log.clone());
                h.effect(move || {
                    for inner in ["a", "b"] {
                        let (log, h3) = (log.clone(), h2.clone());
                        h2.effect(move || {
                            let log = log.clone();
                            h3.on_cleanup(move || log.push(format!("{name}.{inner}")));
                        });
                    }
                    let log = log.clone();
                    h2.on_cleanup(move || log.push(name.to_string()));
                });
            }
        });
        scope.dispose();
        assert_eq!(log.take(), ["outer2.b", "outer2.a", "outer2", "outer1.b", "outer1.a", "outer1"]);
    }

    fn nested_effects_are_disposed_when_the_parent_reruns(cx) {
        let a = cx.signal(0);
        let b = cx.signal(0);
        let inner_runs = Counter::new();
        let h = cx.handle();
        let nodes_before = cx.node_count();
        let outer = cx.effect({
            let (a, b, r) = (a.clone(), b.clone(), inner_runs.clone());
            move || {
                a.get();
                let (b, r) = (b.clone(), r.clone());
                h.effect(move || { b.get(); r.hit(); });
            }
        });
        assert_eq!(cx.node_count(), nodes_before + 2);
        b.set(1);
        assert_eq!(inner_runs.get(), 2);
        a.set(1);
        assert_eq!(cx.node_count(), nodes_before + 2, "the old inner effect was disposed, a new one made");
        inner_runs.reset();
        b.set(2);
        assert_eq!(inner_runs.get(), 1, "only the live inner effect runs");
        outer.dispose();
        assert_eq!(cx.node_count(), nodes_before);
        b.set(3);
        assert_eq!(inner_runs.get(), 1);
    }

    fn writes_inside_effects_converge(cx) {
        let celsius = cx.signal(0i64);
        let fahrenheit = cx.signal(32i64);
        let fx1 = cx.effect({ let (c, f) = (celsius.clone(), fahrenheit.clone()); move || f.set(c.get() * 9 / 5 + 32) });
        let fx2 = cx.effect({ let (c, f) = (celsius.clone(), fahrenheit.clone()); move || c.set((f.get() - 32) * 5 / 9) });
        celsius.set(100);
        assert_eq!(fahrenheit.get(), 212);
        fahrenheit.set(50);
        assert_eq!(celsius.get(), 10);
        assert!(fx1.runs() <= 4 && fx2.runs() <= 4, "{} {}", fx1.runs(), fx2.runs());
    }

    fn feedback_loop_stops_with_an_error(cx) {
        let on = cx.signal(false);
        let a = cx.signal(0u64);
        let fx = cx.effect({ let (on, a) = (on.clone(), a.clone()); move || { if on.get() { let v = a.get(); a.set(v + 1); } } });
        let err = on.try_set(true).unwrap_err();
        match err {
            WriteError::Loop(e) => {
                assert_eq!(e.rounds, MAX_FLUSH_ROUNDS);
                assert_eq!(e.effect, fx.created_at());
            }
            other => panic!("expected a loop error, got {other}"),
        }
        assert!(on.get(), "the write itself was applied");
        assert!(a.get() >= u64::from(MAX_FLUSH_ROUNDS));
        // The graph is still usable, and the effect still reacts.
        let runs = fx.runs();
        on.set(false);
        assert_eq!(fx.runs(), runs + 1);
        let before = a.get();
        a.set(before + 10);
        assert_eq!(fx.runs(), runs + 1, "off: it no longer reads a");
    }

    fn effect_reading_a_computed_chain_runs_once_per_batch(cx) {
        let a = cx.signal(1);
        let b = cx.signal(2);
        let sum = cx.computed({ let (a, b) = (a.clone(), b.clone()); move || a.get() + b.get() });
        let fx = cx.effect({ let s = sum.clone(); move || { s.get(); } });
        cx.batch(|| { a.set(10); b.set(20); });
        assert_eq!(fx.runs(), 2);
        assert_eq!(sum.get(), 30);
    }
}
