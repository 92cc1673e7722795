#![allow(clippy::unwrap_used, clippy::arc_with_non_send_sync)]
//! Errors and panics: disposed reads, cycles, panics inside computeds.

mod common;
use common::Counter;
use egress_reactive::{NodeKind, ReadError, WriteError};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

each_flavour! {
    fn debug_output_names_each_handle_and_where_it_was_made(cx) {
        let line = line!() + 1;
        let (s, c, e) = (cx.signal(1), cx.computed(|| 2), cx.effect(|| {}));
        let site = |shown: String, kind: &str| {
            assert!(shown.starts_with(&format!("{kind} {{ created_at: ")), "{shown}");
            assert!(shown.contains(&format!("file: \"{}\", line: {line}", file!())), "{shown}");
            assert!(shown.ends_with(", .. }"), "{shown}");
        };
        site(format!("{s:?}"), "Signal");
        site(format!("{c:?}"), "Computed");
        site(format!("{e:?}"), "Effect");
        let graph = format!("Handle {{ nodes: {}, links: {} }}", cx.node_count(), cx.link_count());
        assert_eq!(format!("{:?}", cx.handle()), graph);
        assert!(format!("{cx:?}").contains(&graph), "{cx:?}");
    }

    fn reading_a_disposed_node_is_a_typed_error(cx) {
        let s = cx.signal(1);
        let c = cx.computed({ let s = s.clone(); move || s.get() });
        assert_eq!(c.get(), 1);
        c.dispose();
        s.dispose();
        match c.try_get() {
            Err(ReadError::Disposed { kind: NodeKind::Computed, created_at }) => assert_eq!(created_at, c.created_at()),
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(s.try_get(), Err(ReadError::Disposed { kind: NodeKind::Signal, .. })));
        assert!(matches!(s.try_set(2), Err(WriteError::Disposed { .. })));
        let msg = catch_unwind(AssertUnwindSafe(|| s.get())).unwrap_err();
        let msg = msg.downcast_ref::<String>().unwrap();
        assert!(msg.contains("disposed signal created at") && msg.contains("errors.rs"), "{msg}");
    }

    fn handles_outlive_their_context(cx) {
        let s = cx.signal(1);
        drop(cx);
        assert!(matches!(s.try_get(), Err(ReadError::Disposed { .. })));
    }

    fn a_computed_reading_itself_is_a_cycle_error(cx) {
        let slot: Arc<Mutex<Option<egress_reactive::Computed<i32, _>>>> = Arc::new(Mutex::new(None));
        let switch = cx.signal(true);
        let c = cx.computed({
            let (slot, switch) = (slot.clone(), switch.clone());
            move || {
                if switch.get() {
                    let me = slot.lock().unwrap().clone().unwrap();
                    me.get() + 1
                } else {
                    0
                }
            }
        });
        *slot.lock().unwrap() = Some(c.clone());
        match c.try_get() {
            Err(ReadError::Cycle(cycle)) => {
                assert_eq!(cycle.nodes, vec![c.created_at()]);
                assert!(cycle.to_string().contains("cycle"));
            }
            other => panic!("expected a cycle, got {other:?}"),
        }
        // Recovery: break the cycle, the computed works again.
        switch.set(false);
        assert_eq!(c.try_get(), Ok(0));
        *slot.lock().unwrap() = None;
    }

    fn an_indirect_cycle_names_every_node(cx) {
        let slot: Arc<Mutex<Option<egress_reactive::Computed<i32, _>>>> = Arc::new(Mutex::new(None));
        let a = cx.computed({
            let slot = slot.clone();
            move || {
                let b = slot.lock().unwrap().clone().unwrap();
                b.get() + 1
            }
        });
        let b = cx.computed({ let a = a.clone(); move || a.get() + 1 });
        *slot.lock().unwrap() = Some(b.clone());
        match b.try_get() {
            Err(ReadError::Cycle(cycle)) => assert_eq!(cycle.nodes, vec![b.created_at(), a.created_at()]),
            other => panic!("expected a cycle, got {other:?}"),
        }
        *slot.lock().unwrap() = None;
    }

    fn a_panic_in_a_computed_is_not_cached(cx) {
        let a = cx.signal(0);
        let runs = Counter::new();
        let c = cx.computed({
            let (a, r) = (a.clone(), runs.clone());
            move || { r.hit(); let v = a.get(); assert!(v != 1, "one is not allowed"); v * 10 }
        });
        assert_eq!(c.get(), 0);
        a.set(1);
        assert!(catch_unwind(AssertUnwindSafe(|| c.get())).is_err());
        assert!(catch_unwind(AssertUnwindSafe(|| c.get())).is_err(), "the failure is not cached: it runs again");
        assert_eq!(runs.get(), 3);
        a.set(2);
        assert_eq!(c.get(), 20);
        assert_eq!(runs.get(), 4);
    }

    fn a_panicking_effect_does_not_wedge_the_graph(cx) {
        let a = cx.signal(0);
        let seen = cx.signal(0);
        cx.effect({ let (a, s) = (a.clone(), seen.clone()); move || { let v = a.get(); assert!(v != 1, "no ones"); s.set(v); } });
        assert!(catch_unwind(AssertUnwindSafe(|| a.set(1))).is_err());
        a.set(2);
        assert_eq!(seen.get(), 2);
    }
}

/// Runs `body` on a thread of its own; fails if it has not finished within
/// 20 s. For graphs whose bug is a hang (a walk that never ends) rather
/// than a wrong value: a correct run takes milliseconds.
fn within(body: impl FnOnce() + Send + 'static) {
    use std::sync::mpsc::{RecvTimeoutError, channel};
    let (done, finished) = channel();
    let run = std::thread::spawn(move || {
        body();
        let _ = done.send(());
    });
    match finished.recv_timeout(std::time::Duration::from_secs(20)) {
        Ok(()) | Err(RecvTimeoutError::Disconnected) => {
            if let Err(panic) = run.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(RecvTimeoutError::Timeout) => panic!("the graph did not finish within 20 s"),
    }
}

/// [`each_flavour!`], each test's context made inside [`within`].
macro_rules! each_flavour_within {
    ($( fn $name:ident($cx:ident) $body:block )*) => {
        mod within_local {
            use super::*;
            $( #[test] fn $name() { within(|| { let $cx = egress_reactive::Context::new(); $body }) } )*
        }
        mod within_thread_safe {
            use super::*;
            $( #[test] fn $name() { within(|| { let $cx = egress_reactive::ThreadSafeContext::new(); $body }) } )*
        }
        mod within_async_context {
            use super::*;
            $( #[test] fn $name() { within(|| { let $cx = egress_reactive::AsyncContext::new(); $body }) } )*
        }
    };
}

/// A computed that reads the computed put in `slot` later, catching its
/// failure: `try_with(..).unwrap_or(-1) + from`. Returns `(computed, slot,
/// errors)`, the errors its reads returned.
macro_rules! catcher {
    ($cx:ident, $from:expr) => {{
        let slot: Arc<Mutex<Option<egress_reactive::Computed<i64, _>>>> = Arc::new(Mutex::new(None));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let catcher = $cx.computed({
            let (slot, errors, from) = (slot.clone(), errors.clone(), $from.clone());
            move || {
                let read = slot.lock().unwrap().clone().unwrap().try_with(|v| *v);
                if let Err(e) = &read {
                    errors.lock().unwrap().push(e.clone());
                }
                read.unwrap_or(-1) + from.get()
            }
        });
        (catcher, slot, errors)
    }};
}

/// The cycle `c3 -> c5 -> c3`, with `c3` catching the failed read:
/// `c3 = c5.try_with(..).unwrap_or(-1) + from`, `c5 = c3 + 1`. Returns
/// `(c3, c5, errors, slot)`, the errors `c3`'s reads of `c5` returned.
macro_rules! caught_cycle {
    ($cx:ident, $from:expr) => {{
        let (c3, slot, errors) = catcher!($cx, $from);
        let c5 = $cx.computed({
            let c3 = c3.clone();
            move || c3.get() + 1
        });
        *slot.lock().unwrap() = Some(c5.clone());
        (c3, c5, errors, slot)
    }};
}

/// [`caught_cycle!`] from `c4 = s`, with an effect recording `c5`'s reads.
/// Returns `(s, c3, c5, errors, slot, seen, effect)`.
macro_rules! watched_cycle {
    ($cx:ident) => {{
        let s = $cx.signal(0i64);
        let c4 = $cx.computed({
            let s = s.clone();
            move || s.get()
        });
        let (c3, c5, errors, slot) = caught_cycle!($cx, c4);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let effect = $cx.effect({
            let (c5, seen) = (c5.clone(), seen.clone());
            move || seen.lock().unwrap().push(c5.try_get().ok())
        });
        (s, c3, c5, errors, slot, seen, effect)
    }};
}

each_flavour_within! {
    // c3 is recomputed on an effect's walk that stands on c5 (pending
    // through c4); c3's read of c5 closes the cycle there, as it did on
    // the first run. It once re-validated c5 as clean (c3, its dependency,
    // was running, not dirty), returned c5's old value and linked c3 to
    // c5: a loop of links that the next write's walk followed for ever.
    fn a_cycle_closed_on_a_revalidation_walk_is_reported_as_on_the_first_run(cx) {
        let (s, c3, c5, errors, slot, seen, _effect) = watched_cycle!(cx);
        let links = cx.link_count();
        for v in 1..=4 {
            s.set(v);
            assert_eq!(cx.link_count(), links, "c3 read c5 in a cycle: no link, as on the first run");
        }
        assert_eq!(*seen.lock().unwrap(), [Some(0), Some(1), Some(2), Some(3), Some(4)]);
        assert_eq!(c3.get(), 3);
        let errors = errors.lock().unwrap();
        assert_eq!(errors.len(), 5, "{errors:?}");
        for e in errors.iter() {
            match e {
                ReadError::Cycle(cycle) => assert_eq!(cycle.nodes, vec![c5.created_at(), c3.created_at()]),
                other => panic!("expected a cycle, got {other:?}"),
            }
        }
        *slot.lock().unwrap() = None;
    }

    // c3 is read (and recomputed) first; c5, pending under it, depends on
    // c3, which is running: c5 must run to find the cycle. It once
    // re-validated as clean, and c3 computed from its old value.
    fn a_computed_whose_dependency_is_running_runs_and_meets_the_cycle(cx) {
        let s = cx.signal(0i64);
        let (c3, c5, errors, slot) = caught_cycle!(cx, s);
        assert_eq!(c5.get(), 0);
        for v in 1..=4 {
            s.set(v);
            assert_eq!(c3.get(), v - 1, "c3's read of c5 runs c5, which reads c3: a cycle, as on a first run");
            assert_eq!(c5.get(), v);
        }
        let errors = errors.lock().unwrap();
        assert_eq!(errors.len(), 5, "{errors:?}");
        for (i, e) in errors.iter().enumerate() {
            // The first run read c5 running; the later ones ran c5, which read c3 running.
            let expected = if i == 0 { vec![c5.created_at(), c3.created_at()] } else { vec![c3.created_at(), c5.created_at()] };
            match e {
                ReadError::Cycle(cycle) => assert_eq!(cycle.nodes, expected, "read {i}"),
                other => panic!("expected a cycle, got {other:?}"),
            }
        }
        *slot.lock().unwrap() = None;
    }

    // A loop of links under an effect: its walk descends c3, then c5, whose
    // dependency c3 is on the walk (a frame, not its start). It backs up
    // to c3 and runs it, as a first read would: c3's read of c5 runs c5,
    // whose read of c3 fails, and c3 catches that. (Run first, c5 would
    // have met c3 on the walk, failed, and the effect's walk with it.)
    fn a_walk_backs_up_to_the_computed_its_loop_of_links_returns_to(cx) {
        let s = cx.signal(0i64);
        let c4 = cx.computed({ let s = s.clone(); move || s.get() });
        let (c3, c5, _errors, slot) = caught_cycle!(cx, c4);
        assert_eq!(c5.get(), 0);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let _effect = cx.effect({
            let (c3, seen) = (c3.clone(), seen.clone());
            move || seen.lock().unwrap().push(c3.try_get())
        });
        for v in 1..=4 {
            s.set(v);
            // c5 failed in c3's run (the read that links c3 to it); read, it
            // recovers, and the next write finds the loop pending.
            assert_eq!(c5.try_get(), Ok(v));
        }
        assert_eq!(*seen.lock().unwrap(), [Ok(-1), Ok(0), Ok(1), Ok(2), Ok(3)]);
        *slot.lock().unwrap() = None;
    }

    // A walk inside another: the effect's walk stands on x and runs r,
    // whose read of y walks y (down to z) and meets x, on the outer walk,
    // not this one: z must run (and meets the cycle at its read of x), and
    // the inner walk does not back out of frames that are not its own.
    // `r = y.try_with(..).unwrap_or(-1) + s`, `y = z + 1`, `z = x + 1`,
    // `x = r + 1`: as on a first run, r's read of y fails, so r = s - 1,
    // x = s, z = s + 1 and y = s + 2.
    fn a_walk_inside_another_meets_the_outer_walk_as_a_cycle(cx) {
        let s = cx.signal(0i64);
        let (r, slot, errors) = catcher!(cx, s);
        let x = cx.computed({ let r = r.clone(); move || r.get() + 1 });
        let z = cx.computed({ let x = x.clone(); move || x.get() + 1 });
        let y = cx.computed({ let z = z.clone(); move || z.get() + 1 });
        *slot.lock().unwrap() = Some(y.clone());
        assert_eq!(y.get(), 2, "y read first: r's read of y fails");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let _effect = cx.effect({
            let (x, seen) = (x.clone(), seen.clone());
            move || seen.lock().unwrap().push(x.try_get().ok())
        });
        for v in 1..=3 {
            s.set(v);
            assert_eq!((r.try_get(), x.try_get()), (Ok(v - 1), Ok(v)));
            assert_eq!((z.try_get(), y.try_get()), (Ok(v + 1), Ok(v + 2)));
        }
        assert_eq!(*seen.lock().unwrap(), [Some(0), Some(1), Some(2), Some(3)]);
        let errors = errors.lock().unwrap();
        assert_eq!(errors.len(), 4, "{errors:?}");
        assert_eq!(errors[0], ReadError::Cycle(egress_reactive::CycleError { nodes: vec![y.created_at(), z.created_at(), x.created_at(), r.created_at()] }));
        for e in &errors[1..] {
            // z, run by the inner walk, read x, on the outer one.
            assert_eq!(*e, ReadError::Cycle(egress_reactive::CycleError { nodes: vec![x.created_at(), z.created_at()] }));
        }
        *slot.lock().unwrap() = None;
    }

    // A write closes a cycle through a dependency read anew: c1 now reads
    // c0, which reads c1 and catches the failure. A first run of c0 gives
    // its fallback (-50); re-validated, c0 may meet the cycle at c1's read
    // of c0 instead (an error: see the crate's docs), but never keeps the
    // value it had before the cycle (0), as it once did.
    fn a_cycle_a_write_closes_is_never_read_as_the_value_before_it(cx) {
        let (s0, s3) = (cx.signal(0i64), cx.signal(0i64));
        let slot: Arc<Mutex<Option<egress_reactive::Computed<i64, _>>>> = Arc::new(Mutex::new(None));
        let c0 = cx.computed({
            let slot = slot.clone();
            move || {
                let c1 = slot.lock().unwrap().clone().unwrap();
                c1.try_get().unwrap_or(-50)
            }
        });
        let c1 = cx.computed({
            let (s0, s3, c0) = (s0.clone(), s3.clone(), c0.clone());
            move || if s3.get() % 2 == 1 { s0.get() + c0.get() } else { s0.get() }
        });
        *slot.lock().unwrap() = Some(c1.clone());
        assert_eq!(c0.try_get(), Ok(0));
        s3.set(1);
        match c0.try_get() {
            Ok(v) => assert_eq!(v, -50, "a first run's value"),
            Err(ReadError::Cycle(cycle)) => assert_eq!(cycle.nodes, vec![c0.created_at(), c1.created_at()]),
            Err(other) => panic!("expected -50 or the cycle, got {other:?}"),
        }
        s3.set(2);
        assert_eq!((c0.try_get(), c1.try_get()), (Ok(0), Ok(0)), "the cycle opened again");
        *slot.lock().unwrap() = None;
    }

    // A failed read still links its reader (so that a recovery reaches it):
    // c3's read of c5, failed in the cycle, links c3 to c5, which links
    // back to c3. A walk down that loop of links ends (it does not descend
    // into a computed it stands on) and runs c3, the computed it started
    // from, as a first read would: c3 meets the cycle in its read of c5.
    fn a_walk_ends_on_a_loop_of_links(cx) {
        let (s, c3, c5, _errors, slot, seen, _effect) = watched_cycle!(cx);
        for v in 1..=4i64 {
            // Read first in the batch, c3 runs c5 (pending, off any walk),
            // whose run fails on the cycle: c3 is linked to c5 from then on.
            let inside = cx.batch(|| {
                s.set(v);
                c3.try_get()
            });
            assert_eq!(inside, Ok(v - 1), "as on a first run: c3's read of c5 fails, c3's value stands");
            assert_eq!(c3.try_get(), Ok(v - 1));
            assert_eq!(c5.try_get(), Ok(v));
        }
        assert_eq!(seen.lock().unwrap().last(), Some(&Some(4)));
        *slot.lock().unwrap() = None;
    }
}
