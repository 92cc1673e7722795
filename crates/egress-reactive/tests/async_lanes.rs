#![allow(clippy::unwrap_used)]
//! AsyncLanesCell: its own retry timer on paused tokio time, a transport
//! that starts each request on a task of its own and reports the outcome
//! through the attachment, and a timer that stops with the cell.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_core::{CompleteOutcome, Delay, FailureKind, LaneKey, LaneKind, LanesPolicy, Policy, Sequence};
use egress_reactive::{AsyncContext, AsyncLanesCell, LaneItem, LanesTransport, SendError};
use tokio::sync::mpsc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Lane {
    Room(u8),
    Other,
}

impl LaneKey for Lane {
    fn kind(&self) -> LaneKind {
        match self {
            Lane::Room(_) => LaneKind::Serial,
            Lane::Other => LaneKind::Unordered(NonZeroUsize::new(4).unwrap()),
        }
    }
}

fn policy() -> LanesPolicy {
    let base = Policy::builder().retry_budget(5).retry_base(Delay(100)).retry_ceiling(Delay(800)).build().unwrap();
    LanesPolicy::new(base, 16).unwrap()
}

/// Hands each record to a channel at once (the test plays the server),
/// failing the first sends as scripted.
struct Requests {
    tx: mpsc::UnboundedSender<LaneItem<Lane, u32>>,
    fail: Arc<Mutex<Vec<FailureKind>>>,
}

impl LanesTransport<Lane, u32> for Requests {
    fn send(&mut self, item: LaneItem<Lane, u32>) -> Result<(), SendError> {
        if let Some(kind) = self.fail.lock().unwrap().pop() {
            return Err(SendError::new(kind, "scripted"));
        }
        self.tx.send(item).map_err(|_| SendError::transient("the server is gone"))
    }
}

#[tokio::test(start_paused = true)]
async fn the_timer_sends_a_parked_record_again_once_its_backoff_ends() {
    let cx = AsyncContext::new();
    let cell = AsyncLanesCell::new(&cx, policy());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let fail = Arc::new(Mutex::new(vec![FailureKind::RetryAfter(Delay(1_000))]));
    let link = cell.attach(Requests { tx, fail });
    cell.enqueue(Lane::Room(1), 7).unwrap();
    assert_eq!(cell.parked_len().get(), 1, "the first send failed: parked");
    tokio::time::sleep(Duration::from_millis(999)).await;
    assert!(rx.try_recv().is_err(), "not before the server's retry-after");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let item = rx.try_recv().expect("sent again once due, with nobody polling");
    assert_eq!((item.lane, item.ordinal.0, item.envelope.attempt.0), (Lane::Room(1), 0, 2));
    assert_eq!(link.complete(&Lane::Room(1), Sequence(0)), CompleteOutcome::Advanced { through: Sequence(0) });
    assert_eq!((cell.parked_len().get(), cell.outstanding().get()), (0, 0));
    assert!(
        format!("{cell:?}").starts_with("AsyncLanesCell(LanesCell { generation: Generation(0), lanes: 1"),
        "{cell:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn responses_in_any_order_complete_records_and_free_their_lanes() {
    let cx = AsyncContext::new();
    let cell = AsyncLanesCell::new(&cx, policy());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let link = cell.attach(Requests { tx, fail: Arc::default() });
    for i in 0..6 {
        cell.enqueue(Lane::Other, i).unwrap();
    }
    cell.enqueue(Lane::Room(1), 10).unwrap();
    cell.enqueue(Lane::Room(1), 11).unwrap();
    let mut got = Vec::new();
    while let Ok(item) = rx.try_recv() {
        got.push(item);
    }
    let payloads: Vec<u32> = got.iter().map(|i| i.envelope.payload).collect();
    assert_eq!(payloads, [0, 1, 2, 3, 10], "four unordered at once, one per room");
    // The server answers the last first: each completion is taken, and the
    // lanes' windows move once what is below them completed.
    for item in got.iter().rev() {
        let _ = link.complete(&item.lane, item.envelope.sequence);
    }
    let mut more = Vec::new();
    while let Ok(item) = rx.try_recv() {
        more.push(item.envelope.payload);
    }
    // Room 1's answer came first: 11 went at once; the unordered lane's
    // window moved only with the answer to 0, the last to come.
    assert_eq!(more, [11, 4, 5]);
    assert_eq!(cell.lane(&Lane::Other).acked_through().get(), Some(Sequence(3)));
}

#[tokio::test(start_paused = true)]
async fn the_timer_stops_once_the_cell_and_its_attachments_are_gone() {
    let cx = AsyncContext::new();
    let cell = AsyncLanesCell::new(&cx, policy());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let fail = Arc::new(Mutex::new(vec![FailureKind::Transient]));
    let link = cell.attach(Requests { tx, fail });
    cell.enqueue(Lane::Room(1), 1).unwrap();
    let weak_probe = cell.clone();
    drop((cell, weak_probe, link));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(rx.try_recv().is_err(), "nothing sent after the cell went");
    // The channel's sender went with the transport: the cell released it.
    assert!(rx.recv().await.is_none());
}

/// A send that panics when the timer retries its record: the timer goes
/// on, and another lane's parked record goes out when due (the timer once
/// died with the panic, and every lane's retries stalled).
#[tokio::test(start_paused = true)]
async fn a_send_that_panics_under_the_timer_does_not_stop_the_timer() {
    struct Poison {
        tx: mpsc::UnboundedSender<LaneItem<Lane, u32>>,
        fail: Arc<Mutex<Vec<FailureKind>>>,
    }
    impl LanesTransport<Lane, u32> for Poison {
        fn send(&mut self, item: LaneItem<Lane, u32>) -> Result<(), SendError> {
            assert_ne!(item.envelope.payload, 99, "the poison record");
            if let Some(kind) = self.fail.lock().unwrap().pop() {
                return Err(SendError::new(kind, "scripted"));
            }
            self.tx.send(item).map_err(|_| SendError::transient("gone"))
        }
    }
    let cx = AsyncContext::new();
    let cell = AsyncLanesCell::new(&cx, policy());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let fail = Arc::new(Mutex::new(vec![FailureKind::RetryAfter(Delay(5_000))]));
    let _link = cell.attach(Poison { tx, fail });
    cell.enqueue(Lane::Room(2), 7).unwrap();
    let poisoned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cell.enqueue(Lane::Room(1), 99)));
    assert!(poisoned.is_err(), "the first send's panic reaches the caller");
    assert_eq!(cell.parked_len().get(), 2);
    // The timer retries 99 first (its backoff is shorter): the send panics
    // again, under the timer, several times before 7 is due.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let item = rx.try_recv().expect("7 went once due, the timer still running");
    assert_eq!(item.envelope.payload, 7);
    assert!(cell.lane(&Lane::Room(1)).parked_len().get() <= 1, "99 is still retried, or dead");
}
