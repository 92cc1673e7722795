#![allow(clippy::unwrap_used)]
//! AsyncContext: async effects (serialized, coalesced, tracked through
//! `.await`, cancelled on disposal), watch streams, the multi-thread
//! runtime. Time is tokio's, paused: sleeps advance deterministically.

use egress_reactive::AsyncContext;
use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;
use tokio::sync::mpsc;

#[tokio::test(start_paused = true)]
async fn runs_at_creation_and_tracks_reads_after_an_await() {
    let cx = AsyncContext::new();
    let before = cx.signal(1);
    let after = cx.signal(10);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let fx = cx.effect_async({
        let (before, after) = (before.clone(), after.clone());
        move |ecx| {
            let (before, after, tx) = (before.clone(), after.clone(), tx.clone());
            async move {
                let b = ecx.get(&before);
                tokio::time::sleep(Duration::from_millis(10)).await;
                let a = ecx.get(&after); // read after an await: still tracked
                tx.send((b, a)).unwrap();
            }
        }
    });
    assert_eq!(rx.recv().await.unwrap(), (1, 10));
    after.set(20);
    assert_eq!(rx.recv().await.unwrap(), (1, 20), "a read after .await is a dependency");
    before.set(2);
    assert_eq!(rx.recv().await.unwrap(), (2, 20));
    assert_eq!(fx.runs(), 3);
    assert_eq!(fx.dependency_count(), 2);
}

#[tokio::test(start_paused = true)]
async fn runs_are_serialized_and_changes_during_a_run_coalesce_into_one() {
    let cx = AsyncContext::new();
    let s = cx.signal(0);
    let active = Arc::new(AtomicUsize::new(0));
    let max_active = Arc::new(AtomicUsize::new(0));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let fx = cx.effect_async({
        let (s, active, max_active) = (s.clone(), active.clone(), max_active.clone());
        move |ecx| {
            let (s, active, max_active, tx) = (s.clone(), active.clone(), max_active.clone(), tx.clone());
            async move {
                let now = active.fetch_add(1, SeqCst) + 1;
                max_active.fetch_max(now, SeqCst);
                let v = ecx.get(&s);
                tokio::time::sleep(Duration::from_millis(100)).await;
                active.fetch_sub(1, SeqCst);
                tx.send(v).unwrap();
            }
        }
    });
    // Let the first run start and sleep, then change the signal 5 times.
    tokio::time::sleep(Duration::from_millis(10)).await;
    for v in 1..=5 {
        s.set(v);
    }
    assert_eq!(rx.recv().await.unwrap(), 0, "the first run finishes undisturbed");
    assert_eq!(rx.recv().await.unwrap(), 5, "one more run, seeing the latest value");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(rx.try_recv().is_err(), "exactly one more run");
    assert_eq!(fx.runs(), 2);
    assert_eq!(max_active.load(SeqCst), 1, "never two runs at once");
}

#[tokio::test(start_paused = true)]
async fn disposal_cancels_a_run_in_progress_and_runs_its_cleanup() {
    let cx = AsyncContext::new();
    let s = cx.signal(0);
    let finished = Arc::new(AtomicUsize::new(0));
    let cleaned = Arc::new(AtomicUsize::new(0));
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let fx = cx.effect_async({
        let (s, finished, cleaned) = (s.clone(), finished.clone(), cleaned.clone());
        move |ecx| {
            let (s, finished, cleaned, started_tx) = (s.clone(), finished.clone(), cleaned.clone(), started_tx.clone());
            async move {
                ecx.get(&s);
                let c = cleaned.clone();
                ecx.on_cleanup(move || {
                    c.fetch_add(1, SeqCst);
                });
                started_tx.send(()).unwrap();
                tokio::time::sleep(Duration::from_secs(60)).await;
                finished.fetch_add(1, SeqCst);
            }
        }
    });
    started.recv().await.unwrap();
    fx.dispose();
    assert!(fx.is_disposed());
    assert_eq!(cleaned.load(SeqCst), 1, "cleanup ran on disposal");
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(finished.load(SeqCst), 0, "the cancelled run never resumed");
    s.set(1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(started.try_recv().is_err(), "a disposed effect never runs again");
}

#[tokio::test(start_paused = true)]
async fn watch_streams_the_latest_values() {
    let cx = AsyncContext::new();
    let s = cx.signal(1);
    let double = cx.computed({
        let s = s.clone();
        move || s.get() * 2
    });
    let mut stream = cx.watch(&double);
    assert_eq!(stream.next().await, Some(2), "the current value first");
    s.set(2);
    assert_eq!(stream.next().await, Some(4));
    // A slow consumer sees the latest value, not every intermediate one.
    s.set(3);
    s.set(4);
    assert_eq!(stream.next().await, Some(8));
    let nodes = cx.node_count();
    drop(stream);
    assert_eq!(cx.node_count(), nodes - 1, "dropping the stream disposes its effect");
}

#[tokio::test(start_paused = true)]
async fn a_watch_ends_when_what_it_watches_is_disposed() {
    let cx = AsyncContext::new();
    let s = cx.signal(1);
    let (scope, double) = cx.scope(|| {
        let s = s.clone();
        cx.computed(move || s.get() * 2)
    });
    let mut stream = cx.watch(&double);
    assert_eq!(stream.next().await, Some(2));
    scope.dispose();
    let ended = tokio::time::timeout(Duration::from_secs(60), stream.next()).await;
    assert_eq!(ended, Ok(None), "the stream ends instead of waiting for ever");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_on_the_multi_thread_runtime_with_writers_on_other_threads() {
    let cx = AsyncContext::new();
    let total = cx.signal(0u64);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _fx = cx.effect_async({
        let total = total.clone();
        move |ecx| {
            let (total, tx) = (total.clone(), tx.clone());
            async move {
                tx.send(ecx.get(&total)).unwrap();
            }
        }
    });
    assert_eq!(rx.recv().await.unwrap(), 0);
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let total = total.clone();
            std::thread::spawn(move || {
                for _ in 0..250 {
                    total.update(|t| *t += 1);
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    // Runs coalesce; the last one observes the final total.
    let mut last = 0;
    while last != 1000 {
        last = rx.recv().await.unwrap();
    }
    assert_eq!(total.get(), 1000);
}

#[tokio::test(start_paused = true)]
async fn sync_effects_and_computeds_work_as_in_thread_safe() {
    let cx = AsyncContext::new();
    let a = cx.signal(1);
    let b = cx.computed({
        let a = a.clone();
        move || a.get() + 1
    });
    let fx = cx.effect({
        let b = b.clone();
        move || {
            b.get();
        }
    });
    a.set(2);
    assert_eq!(b.get(), 3);
    assert_eq!(fx.runs(), 2);
    let t0 = cx.now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(cx.now() - t0, Duration::from_secs(5), "tokio's clock, paused");
}

#[tokio::test(start_paused = true)]
async fn an_async_effect_run_clears_the_mark_of_a_disposed_dependency() {
    // The disposal marks the effect: its next queued run happens even though
    // what it reads did not change. That run clears the mark: the one after
    // is decided by its dependencies again.
    let cx = AsyncContext::new();
    let x = cx.signal(1);
    let s = cx.signal(0);
    let parity = cx.computed({
        let s = s.clone();
        move || s.get() % 2
    });
    let (tx, mut rx) = mpsc::unbounded_channel();
    let fx = cx.effect_async({
        let (x, parity) = (x.clone(), parity.clone());
        move |ecx| {
            let (x, parity, tx) = (x.clone(), parity.clone(), tx.clone());
            async move {
                let p = ecx.get(&parity);
                tx.send((p, ecx.try_get(&x).ok())).unwrap();
            }
        }
    });
    assert_eq!(rx.recv().await.unwrap(), (0, Some(1)));
    x.dispose();
    s.set(2);
    assert_eq!(rx.recv().await.unwrap(), (0, None), "run again: it read a disposed node");
    s.set(4);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(rx.try_recv().is_err(), "nothing it reads changed");
    assert_eq!(fx.runs(), 2);
    s.set(5);
    let next = tokio::time::timeout(Duration::from_secs(1), rx.recv()).await;
    assert_eq!(next.ok().flatten(), Some((1, None)), "a change it reads still runs it");
}

#[tokio::test(start_paused = true)]
async fn an_async_effect_drops_what_it_no_longer_reads() {
    let cx = AsyncContext::new();
    let (which, a, b) = (cx.signal(true), cx.signal(0), cx.signal(0));
    let runs = Arc::new(AtomicUsize::new(0));
    let _fx = cx.effect_async({
        let (which, a, b, runs) = (which.clone(), a.clone(), b.clone(), runs.clone());
        move |ecx| {
            let (which, a, b, runs) = (which.clone(), a.clone(), b.clone(), runs.clone());
            async move {
                runs.fetch_add(1, SeqCst);
                if ecx.get(&which) {
                    ecx.get(&a);
                } else {
                    ecx.get(&b);
                }
            }
        }
    });
    let settle = || tokio::time::sleep(Duration::from_millis(10));
    settle().await;
    assert_eq!(runs.load(SeqCst), 1);
    which.set(false);
    settle().await;
    assert_eq!(runs.load(SeqCst), 2, "it now reads b");
    a.set(1);
    settle().await;
    assert_eq!(runs.load(SeqCst), 2, "a, read by the first run only, no longer runs it");
    b.set(1);
    settle().await;
    assert_eq!(runs.load(SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn an_async_effect_counts_its_panics_and_shows_its_runs() {
    let cx = AsyncContext::new();
    let s = cx.signal(0u32);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let fx = cx.effect_async({
        let s = s.clone();
        move |ecx| {
            let (s, tx) = (s.clone(), tx.clone());
            async move {
                let v = ecx.get(&s);
                tx.send(v).unwrap();
                assert!(v % 2 == 0, "odd values are refused");
            }
        }
    });
    assert_eq!(rx.recv().await.unwrap(), 0);
    assert_eq!((fx.panics(), fx.last_panic()), (0, None));
    assert_eq!(format!("{fx:?}"), "AsyncEffect { runs: 1 }");
    for (value, panics) in [(1, 1), (3, 2), (4, 2)] {
        s.set(value);
        assert_eq!(rx.recv().await.unwrap(), value);
        tokio::task::yield_now().await;
        assert_eq!(fx.panics(), panics, "after {value}");
    }
    assert_eq!(fx.last_panic().as_deref(), Some("odd values are refused"));
    assert_eq!(format!("{fx:?}"), "AsyncEffect { runs: 4 }");
    let c = cx.computed({
        let s = s.clone();
        move || s.get()
    });
    assert_eq!(format!("{:?}", cx.watch(&c)), "Watch { .. }");
}
