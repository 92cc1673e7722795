#![allow(clippy::unwrap_used)]
// One body for every flavour: the Local one holds its handles in an Arc too.
#![allow(clippy::arc_with_non_send_sync)]
//! The graph's link bookkeeping at its edges, each found by the mutation
//! gate: a signal disposed while a live computation still reads it, from
//! any place in the reader's dependency list, or by that computation's own
//! run right after reading it; and a computed whose last reader goes while
//! the computed itself is running.

mod common;
use std::sync::{Arc, Mutex};

fn none_like<T>(_: &T) -> Option<T> {
    None
}

each_flavour! {
    fn a_disposed_signal_leaves_a_live_readers_dependencies_whole_from_any_place(cx) {
        // The reader's dependencies in every order of `b` and `z` (both
        // disposed while it lives, `b` first) around `a` (kept).
        for order in [["b", "z", "a"], ["b", "a", "z"], ["a", "b", "z"], ["z", "b", "a"], ["a", "z", "b"]] {
            let (nodes, links) = (cx.node_count(), cx.link_count());
            let a = cx.signal(1u32);
            let (first, b) = cx.scope(|| cx.signal(10u32));
            let (second, z) = cx.scope(|| cx.signal(100u32));
            let seen = Arc::new(Mutex::new(Vec::new()));
            let fx = cx.effect({
                let (a, b, z, seen) = (a.clone(), b.clone(), z.clone(), seen.clone());
                move || {
                    let mut sum = 0;
                    for name in order {
                        sum += match name {
                            "a" => a.get(),
                            "b" => b.try_get().unwrap_or(0),
                            _ => z.try_get().unwrap_or(0),
                        };
                    }
                    seen.lock().unwrap().push(sum);
                }
            });
            assert_eq!(fx.dependency_count(), 3, "{order:?}");
            first.dispose();
            assert_eq!(cx.link_count(), links + 2, "{order:?}: b's link went");
            second.dispose();
            assert_eq!(cx.link_count(), links + 1, "{order:?}: z's link went");
            // The reader runs again (what it read is gone) and on each
            // change of what is left.
            a.set(2);
            a.set(3);
            assert_eq!(*seen.lock().unwrap(), [111, 2, 3], "{order:?}");
            assert_eq!(fx.dependency_count(), 1, "{order:?}");
            fx.dispose();
            a.dispose();
            assert_eq!((cx.node_count(), cx.link_count()), (nodes, links), "{order:?}: nothing left over");
        }
    }

    fn a_signal_disposed_by_its_reader_during_the_run_that_read_it_leaves_the_run_reading_on(cx) {
        let (nodes, links) = (cx.node_count(), cx.link_count());
        let a = cx.signal(1u32);
        let b = cx.signal(10u32);
        let (scope, x) = cx.scope(|| cx.signal(100u32));
        let scope = Arc::new(Mutex::new(Some(scope)));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let fx = cx.effect({
            let (a, b, x, scope, seen) = (a.clone(), b.clone(), x.clone(), scope.clone(), seen.clone());
            move || {
                let mut sum = a.get() + x.try_get().unwrap_or(0);
                // The first run disposes what it has just read (its last
                // dependency so far), then reads on.
                if let Some(scope) = scope.lock().unwrap().take() {
                    scope.dispose();
                }
                sum += b.get();
                seen.lock().unwrap().push(sum);
            }
        });
        assert_eq!(fx.dependency_count(), 2, "a and b: x went");
        assert_eq!(b.subscriber_count(), 1);
        b.set(20);
        a.set(2);
        let runs = seen.lock().unwrap().clone();
        assert_eq!(runs.last(), Some(&22), "{runs:?}");
        assert_eq!(fx.dependency_count(), 2);
        fx.dispose();
        a.dispose();
        b.dispose();
        assert_eq!((cx.node_count(), cx.link_count()), (nodes, links), "nothing left over");
    }

    fn a_computed_whose_last_reader_goes_during_its_own_run_keeps_what_it_read(cx) {
        let s = cx.signal(1u32);
        // (An effect's handle, of this flavour's type.)
        let dummy = cx.effect(|| {});
        let victim = Arc::new(Mutex::new(none_like(&dummy)));
        dummy.dispose();
        let runs = Arc::new(Mutex::new(0u32));
        let c = cx.computed({
            let (s, victim, runs) = (s.clone(), victim.clone(), runs.clone());
            move || {
                *runs.lock().unwrap() += 1;
                // Its only reader, disposed from inside its run.
                let reader: Option<_> = victim.lock().unwrap().take();
                if let Some(reader) = reader {
                    reader.dispose();
                }
                s.get() * 2
            }
        });
        let fx = cx.effect({
            let c = c.clone();
            move || {
                c.get();
            }
        });
        assert_eq!((*runs.lock().unwrap(), c.subscriber_count()), (1, 1));
        *victim.lock().unwrap() = Some(fx.clone());
        // Read (not by its reader) after a write: it runs, and its reader
        // goes while it runs.
        cx.batch(|| {
            s.set(2);
            assert_eq!(c.get_untracked(), 4);
        });
        assert!(fx.is_disposed());
        assert_eq!((*runs.lock().unwrap(), c.subscriber_count(), c.dependency_count()), (2, 0, 1));
        // It kept what its run read, and its value: no run for a read.
        assert_eq!(c.get_untracked(), 4);
        assert_eq!(*runs.lock().unwrap(), 2, "up to date: not run again");
        s.set(3);
        assert_eq!(c.get_untracked(), 6);
        assert_eq!(*runs.lock().unwrap(), 3);
    }
}
