#![allow(clippy::unwrap_used)]
//! The dispatcher on a real async cell, on paused tokio time: concurrency
//! up to the window with out-of-order completions acknowledged
//! cumulatively, failures mapped onto the core's kinds with the same
//! idempotency key on every attempt, records that cannot be dispatched
//! failing permanently without a wedge, a panicking handler retried, and a
//! bounded dispatcher held to its limit past the stored watermark.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use egress_core::{DeadLetters, Delay, Policy, Sequence};
use egress_dispatch::{DispatchError, Dispatcher, HandlerError, Handlers, Info, StoredAck};
use egress_reactive::{AsyncContext, AsyncEgressCell};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Job {
    id: u64,
    millis: u64,
}

fn policy() -> Policy {
    Policy::builder().inflight_limit(16).retry_base(Delay(10)).dead_letters(DeadLetters::Skip).build().unwrap()
}

/// Waits (on paused time) until the cell has everything through `last`
/// acknowledged.
async fn acknowledged(cell: &AsyncEgressCell<Bytes>, last: u64) {
    egress_testkit::until(
        || (cell.acked_through().get_untracked() == Some(Sequence(last))).then_some(()),
        || format!("acknowledged through {:?}, not {last}", cell.acked_through().get_untracked()),
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn handlers_run_concurrently_up_to_the_window_and_complete_into_cumulative_acks() {
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let order = Arc::new(Mutex::new(Vec::new()));
    let handlers = Handlers::new().handle("job", {
        let (running, most, order) = (running.clone(), most.clone(), order.clone());
        move |job: Job, info: Info| {
            let (running, most, order) = (running.clone(), most.clone(), order.clone());
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(job.millis)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                assert_eq!(info.sequence, Sequence(job.id), "each record to its own run");
                order.lock().push(job.id);
                Ok(())
            }
        }
    });
    // Delays from a fixed generator: later records often finish first.
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let records: Vec<Bytes> = (0..200)
        .map(|id| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            handlers.encode("job", &Job { id, millis: 1 + x % 50 }).unwrap()
        })
        .collect();
    let dispatcher = Dispatcher::spawn(&cell, "jobs", handlers);
    cell.enqueue_all(records);
    acknowledged(&cell, 199).await;
    let order = order.lock().clone();
    assert_eq!(order.len(), 200, "each record handled once");
    assert!(order.windows(2).any(|w| w[0] > w[1]), "completions came out of order");
    let most = most.load(Ordering::SeqCst);
    assert!((2..=16).contains(&most), "{most} at once: concurrent, within the window");
    let stats = dispatcher.shutdown().await;
    assert_eq!((stats.completed, stats.retried, stats.permanent), (200, 0, 0), "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn failures_map_onto_the_cores_kinds_with_one_key_for_every_attempt() {
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let calls: Arc<Mutex<Vec<(Info, tokio::time::Instant)>>> = Arc::default();
    let handlers = Handlers::new().handle("flaky", {
        let calls = calls.clone();
        move |id: u64, info: Info| {
            calls.lock().push((info.clone(), tokio::time::Instant::now()));
            async move {
                match (id, info.attempt) {
                    (5, 1) => Err(HandlerError::Transient("a timeout".into())),
                    (7, 1) => Err(HandlerError::RetryAfter(Duration::from_secs(2))),
                    (9, _) => Err(HandlerError::Permanent("refused".into())),
                    _ => Ok(()),
                }
            }
        }
    });
    let records: Vec<Bytes> = (0..20u64).map(|id| handlers.encode("flaky", &id).unwrap()).collect();
    let dispatcher = Dispatcher::spawn(&cell, "flaky-stream", handlers);
    cell.enqueue_all(records);
    acknowledged(&cell, 19).await;
    let calls = calls.lock().clone();
    let of = |s: u64| calls.iter().filter(|(i, _)| i.sequence == Sequence(s)).cloned().collect::<Vec<_>>();
    for s in [5, 7] {
        let tries = of(s);
        assert_eq!(tries.iter().map(|(i, _)| i.attempt).collect::<Vec<_>>(), [1, 2], "sequence {s}");
        assert_eq!(tries[0].0.key(), tries[1].0.key(), "one idempotency key for every attempt");
        assert_eq!(tries[0].0.key(), (Arc::from("flaky-stream"), s));
    }
    let seven = of(7);
    assert!(seven[1].1 - seven[0].1 >= Duration::from_secs(2), "retried after at least the delay asked");
    assert_eq!(of(9).len(), 1, "a permanent failure is not retried");
    assert_eq!(of(3).len(), 1);
    let stats = dispatcher.shutdown().await;
    assert_eq!((stats.completed, stats.retried, stats.permanent, stats.skipped), (19, 2, 1, 1), "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn records_that_cannot_be_dispatched_fail_permanently_and_wedge_nothing() {
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let handled = Arc::new(Mutex::new(Vec::new()));
    let handlers = Handlers::new().handle("job", {
        let handled = handled.clone();
        move |job: Job, _: Info| {
            handled.lock().push(job.id);
            async { Ok(()) }
        }
    });
    // An unknown name is refused when the record is made...
    assert!(matches!(handlers.encode("nobody", &1), Err(DispatchError::UnknownHandler(n)) if n == "nobody"));
    // ...and records made some other way fail at dispatch, permanently.
    let records = vec![
        handlers.encode("job", &Job { id: 0, millis: 0 }).unwrap(),
        Bytes::from_static(b"\xff not json"),
        Bytes::from_static(br#"{"handler":"nobody","message":1}"#),
        Bytes::from_static(br#"{"handler":"job","message":{"id":"not a number"}}"#),
        handlers.encode("job", &Job { id: 4, millis: 0 }).unwrap(),
    ];
    let dispatcher = Dispatcher::spawn(&cell, "s", handlers);
    cell.enqueue_all(records);
    acknowledged(&cell, 4).await;
    assert_eq!(*handled.lock(), [0, 4]);
    let stats = dispatcher.shutdown().await;
    assert_eq!((stats.completed, stats.permanent, stats.retried, stats.skipped), (2, 3, 0, 3), "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn a_handler_that_panics_is_retried() {
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let handlers = Handlers::new().handle("boom", {
        let attempts = attempts.clone();
        move |(): (), info: Info| {
            attempts.lock().push(info.attempt);
            async move {
                assert!(info.attempt > 1, "the first attempt panics");
                Ok(())
            }
        }
    });
    let record = handlers.encode("boom", &()).unwrap();
    let dispatcher = Dispatcher::spawn(&cell, "s", handlers);
    cell.enqueue(record);
    acknowledged(&cell, 0).await;
    assert_eq!(*attempts.lock(), [1, 2]);
    let stats = dispatcher.shutdown().await;
    assert_eq!((stats.completed, stats.retried), (1, 1), "{stats:?}");
}

/// The store's watermark stands in a watch the test moves (as a relay's
/// commits would): a bounded dispatcher starts no record at or past
/// `stored + 1 + limit`, whatever the window, and goes on as the watermark
/// rises; with the watermark's sender gone, nothing more starts.
#[tokio::test(start_paused = true)]
async fn a_bounded_dispatcher_runs_at_most_its_limit_past_the_stored_watermark() {
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let started = Arc::new(Mutex::new(Vec::new()));
    let handlers = Handlers::new().handle("job", {
        let started = started.clone();
        move |job: Job, _: Info| {
            let started = started.clone();
            async move {
                started.lock().push(job.id);
                Ok(())
            }
        }
    });
    let records: Vec<Bytes> = (0..40).map(|id| handlers.encode("job", &Job { id, millis: 0 }).unwrap()).collect();
    let (stored, watermark) = tokio::sync::watch::channel(None);
    // A limit of 5 under a window of 16.
    let dispatcher = Dispatcher::spawn_bounded(&cell, "jobs", handlers, StoredAck::new(watermark, 5));
    cell.enqueue_all(records);
    acknowledged(&cell, 4).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(*started.lock(), [0, 1, 2, 3, 4], "nothing stored: sequences 0..5 only");
    stored.send(Some(Sequence(2))).unwrap();
    acknowledged(&cell, 7).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(started.lock().len(), 8, "stored through 2: up to 7, not 8");
    stored.send(Some(Sequence(20))).unwrap();
    acknowledged(&cell, 25).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(started.lock().len(), 26, "stored through 20: up to 25");
    // The last value allows up to 35, but the relay is gone (the sender
    // dropped before the dispatcher saw the value): nothing more starts.
    stored.send(Some(Sequence(30))).unwrap();
    drop(stored);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(started.lock().len(), 26, "the watermark's sender gone: nothing more starts");
    assert_eq!(*started.lock(), (0..26).collect::<Vec<_>>(), "each once, in order");
    let stats = dispatcher.shutdown().await;
    assert_eq!(stats.completed, 26);
}

/// Dropping a dispatcher stops it: records enqueued afterwards are not
/// handled (and its Debug, and the handlers', say what they hold).
#[tokio::test(start_paused = true)]
async fn a_dropped_dispatcher_handles_nothing_more() {
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let handled = Arc::new(Mutex::new(Vec::new()));
    let handlers = Handlers::new()
        .handle("job", {
            let handled = handled.clone();
            move |job: Job, _: Info| {
                handled.lock().push(job.id);
                async { Ok(()) }
            }
        })
        .handle("another", |_: u64, _: Info| async { Ok(()) });
    assert_eq!(format!("{handlers:?}"), r#"Handlers { names: ["another", "job"] }"#);
    let first = handlers.encode("job", &Job { id: 0, millis: 0 }).unwrap();
    let second = handlers.encode("job", &Job { id: 1, millis: 0 }).unwrap();
    let dispatcher = Dispatcher::spawn(&cell, "s", handlers);
    assert!(format!("{dispatcher:?}").starts_with("Dispatcher { stats: DispatchStats"), "{dispatcher:?}");
    cell.enqueue(first);
    acknowledged(&cell, 0).await;
    drop(dispatcher);
    tokio::time::sleep(Duration::from_millis(10)).await;
    cell.enqueue(second);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(*handled.lock(), [0], "nothing handled after the drop");
    assert_eq!(cell.acked_through().get_untracked(), Some(Sequence(0)));
}

/// A dispatcher held to a lease (a watch the test moves, as a lease
/// keeper's renewals would): a record starts only when its expected run
/// ends by the lease's bound; a bound too near holds it until a renewal
/// moves the bound; a long run goes on while renewals come, and is cut
/// when the bound passes without one (retried once the lease holds
/// again); with the lease lost, or its sender gone, nothing more starts.
#[tokio::test(start_paused = true)]
async fn a_dispatcher_held_to_a_lease_starts_nothing_it_could_not_finish_under_it() {
    use tokio::time::Instant;

    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let runs = Arc::new(Mutex::new(Vec::new()));
    let handlers = Handlers::new().handle("job", {
        let runs = runs.clone();
        move |job: Job, info: Info| {
            let runs = runs.clone();
            async move {
                let started = Instant::now();
                tokio::time::sleep(Duration::from_millis(job.millis)).await;
                runs.lock().push((job.id, info.attempt, started, Instant::now()));
                Ok(())
            }
        }
    });
    let job = |id, millis| handlers.encode("job", &Job { id, millis }).unwrap();
    let t0 = Instant::now();
    let (lease, until) = tokio::sync::watch::channel(Some(t0 + Duration::from_secs(1)));
    let (_stored, watermark) = tokio::sync::watch::channel(None);
    let bound = StoredAck::new(watermark, 1_000).with_lease(until, Duration::from_millis(250));
    let dispatcher = Dispatcher::spawn_bounded(&cell, "jobs", handlers.clone(), bound);
    cell.enqueue_all([job(0, 10), job(1, 10)]);
    acknowledged(&cell, 1).await;
    // At 0.8 s a run of 250 ms would end past the bound: held.
    tokio::time::sleep_until(t0 + Duration::from_millis(800)).await;
    cell.enqueue(job(2, 10));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(runs.lock().len(), 2, "nothing started that could run past the lease");
    assert_eq!(dispatcher.stats().waited, 1, "the one held back");
    // A renewal moves the bound: it starts.
    lease.send(Some(Instant::now() + Duration::from_secs(1))).unwrap();
    acknowledged(&cell, 2).await;
    assert!(runs.lock()[2].2 >= t0 + Duration::from_millis(950), "{:?}", runs.lock());
    // A run of 3 s, far past its expected 250 ms, goes on while renewals
    // come every 500 ms...
    cell.enqueue(job(3, 3_000));
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        lease.send(Some(Instant::now() + Duration::from_secs(1))).unwrap();
    }
    assert_eq!(runs.lock().iter().filter(|r| r.0 == 3).map(|r| r.1).collect::<Vec<_>>(), [1], "{:?}", runs.lock());
    assert_eq!(dispatcher.stats().retried, 0, "never cut while the lease held");
    // ...and another is cut when the bound passes with no renewal: it is
    // retried only once the lease holds again.
    cell.enqueue(job(4, 3_000));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(runs.lock().iter().all(|r| r.0 != 4), "cut at the bound: {:?}", runs.lock());
    assert_eq!(dispatcher.stats().retried, 1, "{:?}", dispatcher.stats());
    let renewed = Instant::now();
    lease.send(Some(renewed + Duration::from_secs(600))).unwrap();
    acknowledged(&cell, 4).await;
    let retry = *runs.lock().iter().find(|r| r.0 == 4).unwrap();
    assert_eq!(retry.1, 2, "the second attempt");
    assert!(retry.2 >= renewed, "not before the renewal: {retry:?}");
    // Lost: a run going on is cut at once, and nothing more starts; with
    // the sender gone neither.
    cell.enqueue(job(5, 3_000));
    tokio::time::sleep(Duration::from_millis(100)).await;
    lease.send(None).unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(dispatcher.stats().retried, 2, "cut when the lease was lost");
    cell.enqueue(job(6, 10));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(runs.lock().iter().all(|r| r.0 < 5), "the lease lost: nothing starts: {:?}", runs.lock());
    lease.send(Some(Instant::now() + Duration::from_secs(600))).unwrap();
    drop(lease);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(runs.lock().iter().all(|r| r.0 < 5), "the lease's sender gone: nothing starts: {:?}", runs.lock());
    drop(dispatcher);
}

/// A worker paused past its lease (stopped, or starved of CPU: here the
/// clock jumps while the handler waits) finds, when it goes on, both its
/// handler's wait and the lease's bound passed: the run is cut before it
/// can go on, not finished after another worker may have taken the stream.
/// A run too long for any lease holds its record back and panics nowhere.
#[tokio::test(start_paused = true)]
async fn a_run_paused_past_its_lease_is_cut_when_it_wakes_and_a_run_too_long_for_any_lease_waits() {
    use tokio::time::Instant;

    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let done = Arc::new(Mutex::new(Vec::new()));
    let handlers = Handlers::new().handle("job", {
        let done = done.clone();
        move |job: Job, info: Info| {
            let done = done.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(job.millis)).await;
                done.lock().push((job.id, info.attempt));
                Ok(())
            }
        }
    });
    let (lease, until) = tokio::sync::watch::channel(Some(Instant::now() + Duration::from_secs(1)));
    let (_stored, watermark) = tokio::sync::watch::channel(None);
    let bound = StoredAck::new(watermark.clone(), 1_000).with_lease(until, Duration::from_millis(250));
    let dispatcher = Dispatcher::spawn_bounded(&cell, "jobs", handlers.clone(), bound);
    cell.enqueue(handlers.encode("job", &Job { id: 0, millis: 300 }).unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Paused for 5 s: the handler's 300 ms and the lease's 1 s both pass.
    tokio::time::advance(Duration::from_secs(5)).await;
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(done.lock().is_empty(), "cut when it woke, not finished: {:?}", done.lock());
    assert_eq!(dispatcher.stats().retried, 1);
    // A renewal: it runs again, and ends.
    lease.send(Some(Instant::now() + Duration::from_secs(600))).unwrap();
    acknowledged(&cell, 0).await;
    assert_eq!(*done.lock(), [(0, 2)]);
    drop(dispatcher);

    // A run no lease can hold: its record waits, and nothing panics.
    let other = AsyncEgressCell::new(&cx, policy());
    let bound = StoredAck::new(watermark, 1_000).with_lease(lease.subscribe(), Duration::MAX);
    let dispatcher = Dispatcher::spawn_bounded(&other, "long", handlers.clone(), bound);
    other.enqueue(handlers.encode("job", &Job { id: 1, millis: 0 }).unwrap());
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(done.lock().len(), 1, "never started");
    assert_eq!(dispatcher.stats(), egress_dispatch::DispatchStats { waited: 1, ..Default::default() });
    assert_eq!(other.acked_through().get_untracked(), None);
}

/// A dispatcher that starts after a worker died with records in flight
/// sends them one at a time (isolation: one of them may be what killed the
/// worker). Its probe, the first record, fails and backs off; the next
/// probe, the second record, completes above the gap the first left. That
/// completion is progress: isolation ends, and the first record, due
/// again, runs (before the fix the cell still waited for the second probe's
/// acknowledgement, which could only come after the first record's, and
/// the stream stalled until the next reconnect).
#[tokio::test(start_paused = true)]
async fn a_probe_completed_above_a_gap_ends_isolation_after_a_restart() {
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let runs = Arc::new(Mutex::new(Vec::new()));
    let handlers = || {
        Handlers::new().handle("job", {
            let runs = runs.clone();
            move |job: Job, info: Info| {
                runs.lock().push((job.id, info.attempt));
                async move {
                    match (job.id, info.attempt) {
                        // The first worker's runs never end: it dies.
                        (_, 1) => std::future::pending().await,
                        (0, 2) => Err(HandlerError::Transient("not yet".into())),
                        _ => Ok(()),
                    }
                }
            }
        })
    };
    let first = handlers();
    let records: Vec<Bytes> = (0..3).map(|id| first.encode("job", &Job { id, millis: 0 }).unwrap()).collect();
    let dead = Dispatcher::spawn(&cell, "jobs", first);
    cell.enqueue_all(records);
    egress_testkit::until(|| (runs.lock().len() == 3).then_some(()), || format!("{:?}", runs.lock())).await;
    drop(dead);
    let generation = egress_core::Generation(cell.generation().get_untracked().get() + 1);
    cell.reconnect(generation);
    let dispatcher = Dispatcher::spawn(&cell, "jobs", handlers());
    acknowledged(&cell, 2).await;
    let runs = runs.lock().clone();
    assert_eq!(runs[3..5], [(0, 2), (1, 2)], "one at a time: the probe failed, the next probe ran: {runs:?}");
    assert!(runs.contains(&(0, 3)) && runs.contains(&(2, 2)), "{runs:?}");
    let stats = dispatcher.shutdown().await;
    assert_eq!((stats.completed, stats.retried), (3, 1), "{stats:?}");
}
