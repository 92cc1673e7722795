#![allow(clippy::unwrap_used)]
// One body for every flavour: the Local one holds its context in an Arc too.
#![allow(clippy::arc_with_non_send_sync)]
//! The last context dropped from inside the user code it runs: an equality
//! called while a flush settles a write, a computed's run, a batch, a
//! cleanup. The graph closes there and then, and what is still to come
//! (queued effects, the batch's writes, the rest of the disposal walk)
//! meets disposed nodes: nothing panics, every captured value is dropped
//! once, and nothing runs after the close.

mod common;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Counts its drops.
struct Guard(Arc<AtomicUsize>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

each_flavour! {
    fn closed_by_an_equality_while_a_flush_settles_a_write(cx) {
        let h = cx.handle();
        let holder = Arc::new(Mutex::new(Some(cx)));
        let drops = Arc::new(AtomicUsize::new(0));
        let ran = Arc::new(AtomicUsize::new(0));
        // Called at the write (inside the writing effect's run), then when
        // the flush settles the write (between runs): the second call
        // closes the graph.
        let calls = Arc::new(AtomicUsize::new(0));
        let x = h.signal_with(0u32, {
            let (holder, calls) = (holder.clone(), calls.clone());
            move |a: &u32, b: &u32| {
                if (*a == 1 || *b == 1) && calls.fetch_add(1, Ordering::SeqCst) == 1 {
                    drop(holder.lock().unwrap().take());
                }
                a == b
            }
        });
        let s = h.signal(0u32);
        let _first = h.effect({
            let (s, x, guard) = (s.clone(), x.clone(), Guard(drops.clone()));
            move || {
                let _ = &guard;
                if s.get() == 1 {
                    x.set(1);
                }
            }
        });
        let _second = h.effect({
            let (s, ran, guard) = (s.clone(), ran.clone(), Guard(drops.clone()));
            move || {
                let _ = &guard;
                if s.get() == 1 {
                    ran.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        s.set(1);
        assert!(holder.lock().unwrap().is_none(), "closed");
        assert_eq!(ran.load(Ordering::SeqCst), 0, "the effect queued after the close did not run");
        assert_eq!(drops.load(Ordering::SeqCst), 2, "each effect's closure dropped once");
        assert_eq!(h.node_count(), 1, "the root alone");
    }

    fn closed_by_an_equality_at_the_write(cx) {
        let h = cx.handle();
        let holder = Arc::new(Mutex::new(Some(cx)));
        let drops = Arc::new(AtomicUsize::new(0));
        let x = h.signal_with(0u32, {
            let holder = holder.clone();
            move |a: &u32, b: &u32| {
                if *a == 1 || *b == 1 {
                    drop(holder.lock().unwrap().take());
                }
                a == b
            }
        });
        let _reader = h.effect({ let (x, guard) = (x.clone(), Guard(drops.clone())); move || { let _ = &guard; x.try_get().ok(); } });
        x.set(1);
        assert!(holder.lock().unwrap().is_none(), "closed");
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(h.node_count(), 1, "the root alone");
    }

    fn closed_by_a_computed_while_it_runs(cx) {
        let h = cx.handle();
        let holder = Arc::new(Mutex::new(Some(cx)));
        let drops = Arc::new(AtomicUsize::new(0));
        let _effect = h.effect({ let guard = Guard(drops.clone()); move || { let _ = &guard; } });
        let c = h.computed({
            let (holder, guard) = (holder.clone(), Guard(drops.clone()));
            move || {
                let _ = &guard;
                drop(holder.lock().unwrap().take());
                7u32
            }
        });
        let read = c.try_get();
        assert!(holder.lock().unwrap().is_none(), "closed");
        assert!(read.is_err(), "a computed closed under its own run has no value: {read:?}");
        assert_eq!(drops.load(Ordering::SeqCst), 2, "each closure dropped once");
        assert_eq!(h.node_count(), 1, "the root alone");
    }

    fn closed_inside_a_batch(cx) {
        let h = cx.handle();
        let holder = Arc::new(Mutex::new(Some(cx)));
        let drops = Arc::new(AtomicUsize::new(0));
        let ran = Arc::new(AtomicUsize::new(0));
        let s = h.signal(0u32);
        let _effect = h.effect({
            let (s, ran, guard) = (s.clone(), ran.clone(), Guard(drops.clone()));
            move || {
                let _ = &guard;
                if s.get() == 1 {
                    ran.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        h.batch(|| {
            s.set(1);
            drop(holder.lock().unwrap().take());
        });
        assert_eq!(ran.load(Ordering::SeqCst), 0, "nothing runs after the close");
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(h.node_count(), 1, "the root alone");
    }

    fn closed_by_a_cleanup_halfway_through_a_disposal(cx) {
        let h = cx.handle();
        let holder = Arc::new(Mutex::new(Some(cx)));
        let drops = Arc::new(AtomicUsize::new(0));
        let cleanups = Arc::new(AtomicUsize::new(0));
        let (scope, ()) = h.scope(|| {
            let _kept = h.effect({ let guard = Guard(drops.clone()); move || { let _ = &guard; } });
            std::mem::forget(_kept);
            h.on_cleanup({
                let (holder, cleanups) = (holder.clone(), cleanups.clone());
                move || {
                    cleanups.fetch_add(1, Ordering::SeqCst);
                    drop(holder.lock().unwrap().take());
                }
            });
            let _later = h.effect({ let guard = Guard(drops.clone()); move || { let _ = &guard; } });
            std::mem::forget(_later);
        });
        let _outside = h.effect({ let guard = Guard(drops.clone()); move || { let _ = &guard; } });
        scope.dispose();
        assert!(holder.lock().unwrap().is_none(), "closed");
        assert_eq!(cleanups.load(Ordering::SeqCst), 1, "the cleanup ran once");
        assert_eq!(drops.load(Ordering::SeqCst), 3, "each closure dropped once");
        assert_eq!(h.node_count(), 1, "the root alone");
    }
}
