#![allow(clippy::unwrap_used)]
//! AsyncContext and AsyncEgressCell under panics and misuse: a run that
//! panics, a transport that panics, an `EffectCx` that outlives its effect,
//! ownership inside an async run, the retry timer across runtimes and
//! handle drops. Time is tokio's, paused.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use egress_core::{Delay, Envelope, FailureKind, Policy, Sequence};
use egress_reactive::{AsyncContext, AsyncEgressCell, AsyncTransport, SendError};
use futures::StreamExt;
use tokio::sync::mpsc;

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn an_async_effect_whose_run_panics_runs_again_and_reports_it() {
    let cx = AsyncContext::new();
    let s = cx.signal(0);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let fx = cx.effect_async({
        let s = s.clone();
        move |ecx| {
            let (s, tx) = (s.clone(), tx.clone());
            async move {
                let v = ecx.get(&s);
                tokio::task::yield_now().await;
                assert!(v != 1, "one is not allowed");
                tx.send(v).unwrap();
            }
        }
    });
    assert_eq!(rx.recv().await.unwrap(), 0);
    s.set(1);
    settle().await;
    assert_eq!((fx.panics(), fx.last_panic().as_deref()), (1, Some("one is not allowed")));
    s.set(2);
    assert_eq!(rx.recv().await.unwrap(), 2, "the task lives on, subscribed to what it read");
    assert!(!fx.is_disposed());
    assert_eq!(fx.panics(), 1);
}

/// A run done at once, whose future panics as it is dropped when it read 1.
struct DoneThenPanics {
    value: u32,
    tx: mpsc::UnboundedSender<u32>,
}

impl Future for DoneThenPanics {
    type Output = ();
    fn poll(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        self.tx.send(self.value).unwrap();
        std::task::Poll::Ready(())
    }
}

impl Drop for DoneThenPanics {
    fn drop(&mut self) {
        assert!(self.value != 1, "one panics as it goes");
    }
}

#[tokio::test(start_paused = true)]
async fn an_async_effect_whose_run_panics_in_its_drop_runs_again_and_reports_it() {
    let cx = AsyncContext::new();
    let s = cx.signal(0);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let fx = cx.effect_async({
        let s = s.clone();
        move |ecx| DoneThenPanics { value: ecx.get(&s), tx: tx.clone() }
    });
    assert_eq!(rx.recv().await.unwrap(), 0);
    s.set(1);
    assert_eq!(rx.recv().await.unwrap(), 1);
    settle().await;
    assert_eq!((fx.panics(), fx.last_panic().as_deref()), (1, Some("one panics as it goes")));
    s.set(2);
    assert_eq!(rx.recv().await.unwrap(), 2, "the task lives on, subscribed to what it read");
    assert_eq!(fx.panics(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_watch_over_a_computed_that_panicked_once_goes_on() {
    let cx = AsyncContext::new();
    let a = cx.signal(0);
    let c = cx.computed({
        let a = a.clone();
        move || {
            let v = a.get();
            assert!(v != 1, "one is not allowed");
            v
        }
    });
    let mut values = cx.watch(&c);
    assert_eq!(values.next().await, Some(0));
    let hit = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.set(1)));
    assert!(hit.is_err());
    a.set(2);
    assert_eq!(tokio::time::timeout(Duration::from_secs(1), values.next()).await.unwrap(), Some(2));
    a.set(3);
    assert_eq!(tokio::time::timeout(Duration::from_secs(1), values.next()).await.unwrap(), Some(3));
}

#[tokio::test(start_paused = true)]
async fn an_effect_cx_that_outlives_its_effect_tracks_nothing() {
    let cx = AsyncContext::new();
    let s = cx.signal(0);
    let (kept_tx, mut kept) = mpsc::unbounded_channel();
    let fx = cx.effect_async(move |ecx| {
        let _ = kept_tx.send(ecx);
        async {}
    });
    let stale = kept.recv().await.unwrap();
    fx.dispose();
    // A new effect takes the freed slot.
    let runs = Arc::new(AtomicUsize::new(0));
    let other = cx.effect({
        let runs = runs.clone();
        move || {
            runs.fetch_add(1, SeqCst);
        }
    });
    assert_eq!(stale.get(&s), 0, "the read still reads");
    s.set(1);
    assert_eq!(runs.load(SeqCst), 1, "the stranger in the slot did not become a subscriber");
    assert_eq!(other.dependency_count(), 0);
    assert_eq!(s.subscriber_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn what_an_async_run_creates_under_own_is_disposed_with_the_run() {
    let cx = AsyncContext::new();
    let s = cx.signal(0);
    let live = Arc::new(AtomicUsize::new(0));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let h = cx.handle();
    let fx = cx.effect_async({
        let (s, live) = (s.clone(), live.clone());
        move |ecx| {
            let (s, live, h, tx) = (s.clone(), live.clone(), h.clone(), tx.clone());
            async move {
                let v = ecx.get(&s);
                tokio::task::yield_now().await;
                let made = ecx.own(|| {
                    live.fetch_add(1, SeqCst);
                    let live = live.clone();
                    h.on_cleanup(move || {
                        live.fetch_sub(1, SeqCst);
                    });
                    h.signal(v)
                });
                tx.send(made.is_some()).unwrap();
            }
        }
    });
    assert!(rx.recv().await.unwrap());
    let nodes = cx.node_count();
    s.set(1);
    assert!(rx.recv().await.unwrap());
    assert_eq!(live.load(SeqCst), 1, "the first run's cleanup ran before the second run");
    assert_eq!(cx.node_count(), nodes, "and its signal was disposed");
    fx.dispose();
    assert_eq!(live.load(SeqCst), 0);
    assert_eq!(cx.node_count(), nodes - 2, "the effect and what it owned are gone");
}

#[tokio::test(start_paused = true)]
async fn effect_async_is_reachable_from_a_handle_in_a_closure() {
    let cx = AsyncContext::new();
    let h = cx.handle();
    let s = cx.signal(1);
    let (tx, mut rx) = mpsc::unbounded_channel();
    // An effect that spawns an async effect through a cloned handle: no
    // Arc<AsyncContext>, no cycle.
    cx.effect({
        let (h, s) = (h.clone(), s.clone());
        move || {
            let v = s.get();
            let tx = tx.clone();
            h.effect_async(move |_| {
                let tx = tx.clone();
                async move { tx.send(v).unwrap() }
            });
        }
    });
    assert_eq!(rx.recv().await.unwrap(), 1);
    s.set(2);
    assert_eq!(rx.recv().await.unwrap(), 2);
    drop(cx);
    assert_eq!(h.node_count(), 1, "nothing leaked");
}

/// Sends on a channel; panics once, on the `on`-th send.
struct Panicky {
    tx: mpsc::UnboundedSender<Envelope<u32>>,
    on: usize,
    sends: usize,
}

impl AsyncTransport<u32> for Panicky {
    async fn send(&mut self, envelope: Envelope<u32>) -> Result<(), SendError> {
        let n = self.sends;
        self.sends += 1;
        tokio::task::yield_now().await;
        assert!(n != self.on, "the transport panics on send {n}");
        self.tx.send(envelope).map_err(|_| SendError::transient("gone"))
    }
}

fn policy() -> Policy {
    Policy::builder().inflight_limit(8).retry_base(Delay(100)).retry_ceiling(Delay(800)).build().unwrap()
}

async fn sent(rx: &mut mpsc::UnboundedReceiver<Envelope<u32>>) -> Vec<(u64, u32)> {
    settle().await;
    std::iter::from_fn(|| rx.try_recv().ok()).map(|e| (e.sequence.0, e.attempt.0)).collect()
}

#[tokio::test(start_paused = true)]
async fn an_async_transport_that_panics_fails_its_record_and_sends_on() {
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let link = cell.attach(Panicky { tx, on: 1, sends: 0 });
    cell.enqueue_all([10, 11, 12]);
    assert_eq!(sent(&mut rx).await, [(0, 1)]);
    // 1 failed (it is not left in flight with nobody to send it).
    assert_eq!((cell.inflight_len().get(), cell.parked_len().get(), cell.pending_len().get()), (1, 1, 1));
    assert!(!link.is_fenced());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(sent(&mut rx).await, [(1, 2), (2, 1)], "resent after its backoff, and the pass went on");
    link.ack(Sequence(2));
    assert_eq!(cell.acked_through().get(), Some(Sequence(2)));
}

/// Fails its first send (transiently), then sends on a channel.
struct FailOnce {
    tx: mpsc::UnboundedSender<Envelope<u32>>,
    failed: bool,
}

impl AsyncTransport<u32> for FailOnce {
    async fn send(&mut self, envelope: Envelope<u32>) -> Result<(), SendError> {
        if !std::mem::replace(&mut self.failed, true) {
            return Err(SendError::new(FailureKind::Transient, "once"));
        }
        self.tx.send(envelope).map_err(|_| SendError::transient("gone"))
    }
}

#[tokio::test(start_paused = true)]
async fn the_timer_lives_while_an_attachment_does() {
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let link = cell.attach(FailOnce { tx, failed: false });
    let enqueue = cell.clone();
    drop(cell);
    enqueue.enqueue(5);
    let core = link.cell().clone();
    drop(enqueue);
    settle().await;
    assert_eq!(core.parked_len().get(), 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(sent(&mut rx).await, [(0, 2)], "the parked record was retried: the timer outlived the cell handles");
    drop(link);
}

#[test]
fn the_timer_comes_back_on_another_runtime() {
    let runtime = || tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    let cx = AsyncContext::new();
    // Made on a runtime that then shuts down, with its timer.
    let cell = runtime().block_on(async { AsyncEgressCell::new(&cx, policy()) });
    runtime().block_on(async {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let _link = cell.attach(FailOnce { tx, failed: false });
        cell.enqueue(5);
        settle().await;
        assert_eq!(cell.parked_len().get(), 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(sent(&mut rx).await, [(0, 2)], "retried by a timer on this runtime");
    });
}
