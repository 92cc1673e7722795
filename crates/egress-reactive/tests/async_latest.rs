#![allow(clippy::unwrap_used)]
//! AsyncLatestCell: its own backoff timer on paused tokio time, a sink that
//! takes each value for a write on its own task and reports the outcome
//! through the attachment, a failing sink that is retried once per backoff
//! with nobody polling, and a timer that stops with the cell.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_core::{Applied, Delay, Policy, Version};
use egress_reactive::{AsyncContext, AsyncLatestCell, LatestItem, LatestSink, SendError, Written};
use tokio::sync::mpsc;

fn policy() -> Policy {
    Policy::builder().retry_base(Delay(100)).retry_ceiling(Delay(800)).build().unwrap()
}

fn keys(n: usize) -> std::num::NonZeroUsize {
    std::num::NonZeroUsize::new(n).unwrap()
}

/// Takes each value for a write the test plays (the channel), failing the
/// first writes as scripted.
struct Requests {
    tx: mpsc::UnboundedSender<LatestItem<&'static str, u32>>,
    fail: Arc<Mutex<Vec<SendError>>>,
}

impl LatestSink<&'static str, u32> for Requests {
    fn write(&mut self, item: LatestItem<&'static str, u32>) -> Result<Written, SendError> {
        if let Some(error) = self.fail.lock().unwrap().pop() {
            return Err(error);
        }
        self.tx.send(item).map_err(|_| SendError::transient("the server is gone"))?;
        Ok(Written::Taken)
    }
}

fn drain(rx: &mut mpsc::UnboundedReceiver<LatestItem<&'static str, u32>>) -> Vec<(&'static str, u64, u32)> {
    let mut got = Vec::new();
    while let Ok(item) = rx.try_recv() {
        got.push((item.key, item.version.0, item.value));
    }
    got
}

#[tokio::test(start_paused = true)]
async fn the_timer_writes_a_failed_key_again_once_its_backoff_ends_with_nobody_polling() {
    let cx = AsyncContext::new();
    let cell = AsyncLatestCell::new(&cx, policy(), keys(8));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let fail = Arc::new(Mutex::new(vec![SendError::retry_after(Delay(1_000), "429")]));
    let link = cell.attach(Requests { tx, fail });
    cell.upsert("volume", Version(1), 10).unwrap();
    assert_eq!(cell.waiting_len().get(), 1, "the first write failed: waiting");
    // A newer value while waiting: it is the one written when due.
    cell.upsert("volume", Version(2), 20).unwrap();
    tokio::time::sleep(Duration::from_millis(999)).await;
    assert!(drain(&mut rx).is_empty(), "not before the sink's retry-after");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(drain(&mut rx), [("volume", 2, 20)], "written once due, the newest value");
    assert_eq!(link.applied(&"volume", Version(2)), Applied::Advanced { durable_through: Version(2) });
    assert!(cell.is_settled().get());
    assert!(format!("{cell:?}").starts_with("AsyncLatestCell(LatestCell { generation: Generation(0), keys: 1"));
}

#[tokio::test(start_paused = true)]
async fn answers_on_other_tasks_free_their_keys_and_the_newest_desire_goes_next() {
    let cx = AsyncContext::new();
    let cell = AsyncLatestCell::new(&cx, policy(), keys(8));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let link = Arc::new(cell.attach(Requests { tx, fail: Arc::default() }));
    for (key, v) in [("a", 1), ("b", 1), ("a", 2), ("a", 3)] {
        cell.upsert(key, Version(v), u32::try_from(v).unwrap()).unwrap();
    }
    let first = drain(&mut rx);
    assert_eq!(first, [("a", 1, 1), ("b", 1, 1)], "one flight per key");
    // The server answers on its own tasks, in reverse order.
    let answers: Vec<_> = first
        .into_iter()
        .rev()
        .map(|(key, v, _)| {
            let link = link.clone();
            tokio::spawn(async move { link.applied(&key, Version(v)) })
        })
        .collect();
    for answer in answers {
        assert!(matches!(answer.await.unwrap(), Applied::Advanced { .. }));
    }
    assert_eq!(drain(&mut rx), [("a", 3, 3)], "2 was replaced before the key was free");
    assert_eq!(link.applied(&"a", Version(3)), Applied::Advanced { durable_through: Version(3) });
    assert!(cell.is_settled().get());
}

#[tokio::test(start_paused = true)]
async fn the_timer_stops_once_the_cell_and_its_attachments_are_gone() {
    let cx = AsyncContext::new();
    let cell = AsyncLatestCell::new(&cx, policy(), keys(8));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let fail = Arc::new(Mutex::new(vec![SendError::transient("down")]));
    let link = cell.attach(Requests { tx, fail });
    cell.upsert("volume", Version(1), 1).unwrap();
    drop((cell, link));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(rx.try_recv().is_err(), "nothing written after the cell went");
    // The channel's sender went with the sink: the cell released it.
    assert!(rx.recv().await.is_none());
}

/// A sink that panics when the timer writes a key again: the timer goes
/// on, and another key waiting after a failure is written when due.
#[tokio::test(start_paused = true)]
async fn a_sink_that_panics_under_the_timer_does_not_stop_the_timer() {
    struct Poison {
        tx: mpsc::UnboundedSender<LatestItem<&'static str, u32>>,
        fail: Arc<Mutex<Vec<SendError>>>,
    }
    impl LatestSink<&'static str, u32> for Poison {
        fn write(&mut self, item: LatestItem<&'static str, u32>) -> Result<Written, SendError> {
            assert_ne!(item.value, 99, "the poison value");
            if let Some(error) = self.fail.lock().unwrap().pop() {
                return Err(error);
            }
            self.tx.send(item).map_err(|_| SendError::transient("gone"))?;
            Ok(Written::Taken)
        }
    }
    let cx = AsyncContext::new();
    let cell = AsyncLatestCell::new(&cx, policy(), keys(8));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let fail = Arc::new(Mutex::new(vec![SendError::retry_after(Delay(5_000), "429")]));
    let _link = cell.attach(Poison { tx, fail });
    cell.upsert("b", Version(1), 7).unwrap();
    let poisoned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cell.upsert("a", Version(1), 99)));
    assert!(poisoned.is_err(), "the first write's panic reaches the caller");
    assert_eq!(cell.waiting_len().get(), 2);
    // The timer writes "a" first (its backoff is shorter): the sink panics
    // again, under the timer, several times before "b" is due.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(drain(&mut rx), [("b", 1, 7)], "b went once due, the timer still running");
    assert_eq!(cell.key(&"a").inflight().get(), None, "the poison value is never left in flight");
}
