#![allow(clippy::unwrap_used)]
//! ThreadSafeContext under contention: 8 threads writing and reading a
//! shared graph, invariants checked by every reader and every effect run.

use egress_reactive::ThreadSafeContext;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

#[test]
fn eight_threads_write_and_read_with_invariants() {
    const THREADS: u64 = 8;
    const WRITES: u64 = 2_000;
    let cx = ThreadSafeContext::new();
    let cells: Vec<_> = (0..THREADS).map(|_| cx.signal(0u64)).collect();
    // Invariant: pair.0 == pair.1 at every settled state (written in one batch).
    let pair = (cx.signal(0u64), cx.signal(0u64));
    let total = cx.computed({
        let c = cells.clone();
        move || c.iter().map(|s| s.get()).sum::<u64>()
    });
    let pair_eq = cx.computed({
        let (a, b) = pair.clone();
        move || a.get() == b.get()
    });
    let effect_violations = Arc::new(AtomicU64::new(0));
    let last_total = Arc::new(AtomicU64::new(0));
    let fx = cx.effect({
        let (total, pair_eq, v, last) = (total.clone(), pair_eq.clone(), effect_violations.clone(), last_total.clone());
        move || {
            if !pair_eq.get() {
                v.fetch_add(1, Ordering::SeqCst);
            }
            let t = total.get();
            // Totals only grow: an effect never sees an older settled state.
            if t < last.swap(t, Ordering::SeqCst) {
                v.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    let reader_violations = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (cx, cells, pair, rv) = (cx.handle(), cells.clone(), pair.clone(), reader_violations.clone());
            let total = total.clone();
            s.spawn(move || {
                for i in 0..WRITES {
                    // Every thread increments its own cell and a shared counter.
                    cells[t as usize].update(|v| *v += 1);
                    cx.batch(|| {
                        pair.0.update(|v| *v += 1);
                        pair.1.update(|v| *v += 1);
                    });
                    if i % 16 == 0 {
                        let (a, b) = cx.batch(|| (pair.0.get(), pair.1.get()));
                        if a != b {
                            rv.fetch_add(1, Ordering::SeqCst);
                        }
                        if total.get() < i {
                            rv.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            });
        }
    });
    assert_eq!(total.get(), THREADS * WRITES, "no lost update");
    assert_eq!(pair.0.get(), THREADS * WRITES);
    assert_eq!(effect_violations.load(Ordering::SeqCst), 0);
    assert_eq!(reader_violations.load(Ordering::SeqCst), 0);
    // One run at creation, then at most one per settled change (3 writes per
    // iteration: one cell update and one two-write batch).
    let runs = u64::from(fx.runs());
    assert!(runs > 1 && runs <= 1 + 2 * THREADS * WRITES, "{runs}");
}

#[test]
fn handles_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ThreadSafeContext>();
    assert_send_sync::<egress_reactive::Signal<String, egress_reactive::Threaded>>();
    assert_send_sync::<egress_reactive::Computed<String, egress_reactive::Threaded>>();
    assert_send_sync::<egress_reactive::Effect<egress_reactive::Threaded>>();
    assert_send_sync::<egress_reactive::Handle<egress_reactive::Threaded>>();
}

#[test]
fn a_disposal_asked_while_another_thread_holds_the_graph_is_done_when_it_leaves() {
    // The main thread is inside graph `a` and disposes an effect of graph
    // `b`, which another thread holds (inside a batch): the disposal waits
    // for `b` to be free, and the thread leaving `b` does it.
    use std::sync::mpsc::channel;
    use std::time::Duration;
    let (a, b) = (ThreadSafeContext::new(), ThreadSafeContext::new());
    let cleaned = Arc::new(AtomicU64::new(0));
    let effect = b.effect({
        let (h, cleaned) = (b.handle(), cleaned.clone());
        move || {
            let cleaned = cleaned.clone();
            h.on_cleanup(move || {
                cleaned.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    let (inside_tx, inside_rx) = channel();
    let (leave_tx, leave_rx) = channel::<()>();
    let probe = b.signal(0u64);
    let holder = std::thread::spawn({
        let (hb, cleaned, probe) = (b.handle(), cleaned.clone(), probe.clone());
        move || {
            hb.batch(|| {
                inside_tx.send(()).unwrap();
                leave_rx.recv_timeout(Duration::from_secs(20)).expect("released");
                // A nested call leaves `b` but not this thread's outermost
                // call: the disposal waits for that.
                probe.get();
                cleaned.load(Ordering::SeqCst)
            })
        }
    });
    inside_rx.recv_timeout(Duration::from_secs(20)).expect("the holder is inside b");
    a.batch(|| effect.dispose());
    // (Asking `effect` now would wait for `b`.)
    assert_eq!(cleaned.load(Ordering::SeqCst), 0, "b is held: the disposal waits");
    leave_tx.send(()).unwrap();
    assert_eq!(holder.join().unwrap(), 0, "not done by a nested call's leaving");
    assert_eq!(cleaned.load(Ordering::SeqCst), 1, "done by the thread that left b");
    assert!(effect.is_disposed());
}

/// A disposal asked from inside another graph's call, of a graph no one
/// holds, is done at once (the graph's lock is taken without waiting), not
/// deferred to the graph's next call; the same for a context dropped there.
#[test]
fn a_disposal_asked_from_inside_another_graph_is_done_at_once_when_the_graph_is_free() {
    let (a, b) = (ThreadSafeContext::new(), ThreadSafeContext::new());
    let cleaned = Arc::new(AtomicU64::new(0));
    let cleanup_counter = |cx: &ThreadSafeContext| {
        let (h, cleaned) = (cx.handle(), cleaned.clone());
        move || {
            let cleaned = cleaned.clone();
            h.on_cleanup(move || {
                cleaned.fetch_add(1, Ordering::SeqCst);
            });
        }
    };
    let effect = b.effect(cleanup_counter(&b));
    let inside = a.batch(|| {
        effect.dispose();
        cleaned.load(Ordering::SeqCst)
    });
    assert_eq!(inside, 1, "b is free: disposed before a's call returned");
    assert!(effect.is_disposed());
    let c = ThreadSafeContext::new();
    let _kept = c.effect(cleanup_counter(&c));
    let inside = a.batch(|| {
        drop(c);
        cleaned.load(Ordering::SeqCst)
    });
    assert_eq!(inside, 2, "c is free: closed before a's call returned");
}

/// A thread's entry into a graph it is already inside takes no lock and
/// releases none: while one thread is inside (a batch, entering again at
/// every read and write in it), another that waits on the graph never gets
/// in, however often the inner entries end. (The waiting thread keeps
/// trying until the first is done; each of its entries checks.)
#[test]
fn a_nested_entry_neither_takes_nor_releases_the_graph() {
    use std::sync::atomic::AtomicBool;
    let cx = ThreadSafeContext::new();
    let s = cx.signal(0u64);
    let (inside, done) = (AtomicBool::new(false), AtomicBool::new(false));
    let (overlaps, entries) = (AtomicU64::new(0), AtomicU64::new(0));
    let start = std::sync::Barrier::new(2);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            start.wait();
            for round in 0..2_000u64 {
                cx.batch(|| {
                    inside.store(true, Ordering::SeqCst);
                    for i in 0..50 {
                        let v = s.get();
                        s.set(v + round + i);
                    }
                    inside.store(false, Ordering::SeqCst);
                });
            }
            done.store(true, Ordering::SeqCst);
        });
        scope.spawn(|| {
            start.wait();
            while !done.load(Ordering::SeqCst) {
                cx.batch(|| {
                    entries.fetch_add(1, Ordering::SeqCst);
                    if inside.load(Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
    });
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "a thread got into the graph while another was inside");
    assert!(entries.load(Ordering::SeqCst) > 0);
}

/// A panic in user code, deep in a thread's nested entries, unwinds out of
/// its outermost one and releases the graph: another thread then enters
/// (it does not wait for ever), and the panicking thread's writes made
/// before the panic are kept, the batch's settled.
#[test]
fn a_panic_out_of_nested_entries_releases_the_graph() {
    use std::sync::mpsc::channel;
    use std::time::Duration;
    let cx = ThreadSafeContext::new();
    let s = cx.signal(0u64);
    let panicker = std::thread::spawn({
        let (h, s) = (cx.handle(), s.clone());
        move || {
            h.batch(|| {
                s.set(1);
                h.batch(|| {
                    let _ = s.get();
                    panic!("user code panics two entries deep");
                })
            })
        }
    });
    assert!(panicker.join().is_err(), "the panic reached the thread's top");
    let (done, entered) = channel();
    std::thread::spawn({
        let (h, s) = (cx.handle(), s.clone());
        move || {
            let v = h.batch(|| {
                s.set(s.get() + 1);
                s.get()
            });
            let _ = done.send(v);
        }
    });
    let Ok(v) = entered.recv_timeout(Duration::from_secs(20)) else {
        // The graph stays held: dropping the handles would wait on it too.
        std::mem::forget((cx, s));
        panic!("no other thread entered the graph within 20 s of the panic");
    };
    assert_eq!(v, 2, "the panicking batch's write settled, then this one's");
    assert_eq!(s.get(), 2);
}
