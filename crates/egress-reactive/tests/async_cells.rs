#![allow(clippy::unwrap_used)]
//! AsyncEgressCell: async transports (serialized runs, cancellation keeps
//! the envelope in flight), its own retry timer on paused tokio time, the
//! multi-thread runtime, and what its drop releases.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use egress_core::{Delay, Envelope, FailureKind, Generation, Policy, Sequence};
use egress_reactive::{AsyncContext, AsyncEgressCell, AsyncTransport, SendError};
use tokio::sync::{Semaphore, mpsc};

/// Sends into a channel after an optional delay; fails as scripted.
struct Channel {
    tx: mpsc::UnboundedSender<Envelope<u32>>,
    delay: Duration,
    fail: Vec<Option<FailureKind>>,
    active: Arc<AtomicUsize>,
    max_active: Arc<AtomicUsize>,
}

impl Channel {
    fn new(tx: mpsc::UnboundedSender<Envelope<u32>>) -> Self {
        Channel { tx, delay: Duration::ZERO, fail: Vec::new(), active: Arc::default(), max_active: Arc::default() }
    }
}

impl AsyncTransport<u32> for Channel {
    async fn send(&mut self, envelope: Envelope<u32>) -> Result<(), SendError> {
        let now = self.active.fetch_add(1, SeqCst) + 1;
        self.max_active.fetch_max(now, SeqCst);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.active.fetch_sub(1, SeqCst);
        if let Some(Some(kind)) = (!self.fail.is_empty()).then(|| self.fail.remove(0)) {
            return Err(SendError::new(kind, "scripted"));
        }
        self.tx.send(envelope).map_err(|_| SendError::transient("receiver gone"))
    }
}

/// A synchronous transport that records the sequences it sends.
#[derive(Clone, Default)]
struct Sink(Arc<std::sync::Mutex<Vec<u64>>>);

impl egress_reactive::Transport<u32> for Sink {
    fn send(&mut self, envelope: Envelope<u32>) -> Result<(), SendError> {
        self.0.lock().expect("sink").push(envelope.sequence.0);
        Ok(())
    }
}

fn policy(window: usize) -> Policy {
    Policy::builder()
        .inflight_limit(window)
        .retry_budget(5)
        .retry_base(Delay(100))
        .retry_ceiling(Delay(800))
        .build()
        .unwrap()
}

async fn drain(rx: &mut mpsc::UnboundedReceiver<Envelope<u32>>) -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    while let Ok(e) = rx.try_recv() {
        out.push((e.sequence.0, e.attempt.0));
    }
    out
}

#[tokio::test(start_paused = true)]
async fn the_timer_resends_a_failed_record_when_its_backoff_ends() {
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy(4));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut transport = Channel::new(tx);
    transport.fail = vec![Some(FailureKind::Transient)];
    let link = cell.attach(transport);
    cell.enqueue(7);
    assert_eq!(drain(&mut rx).await, []);
    assert_eq!(cell.parked_len().get(), 1);
    let due = cell.poll_timeout().unwrap();
    tokio::time::sleep(Duration::from_millis(99)).await;
    assert_eq!(drain(&mut rx).await, [], "not before its due time");
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(drain(&mut rx).await, [(0, 2)], "resent at {due:?} by the timer");
    assert_eq!(cell.parked_len().get(), 0);
    link.ack(Sequence(0));
    assert_eq!(cell.acked_through().get(), Some(Sequence(0)));
}

#[tokio::test(start_paused = true)]
async fn an_earlier_failure_re_arms_the_timer() {
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy(4));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let link = cell.attach(Channel::new(tx));
    cell.enqueue_all([1, 2]);
    assert_eq!(drain(&mut rx).await, [(0, 1), (1, 1)]);
    // 0 waits 800 ms (a hint), then 1 fails with the 100 ms base.
    link.fail(Sequence(0), FailureKind::RetryAfter(Delay(800)));
    link.fail(Sequence(1), FailureKind::Transient);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(drain(&mut rx).await, [(1, 2)]);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(drain(&mut rx).await, [(0, 2)]);
}

#[tokio::test(start_paused = true)]
async fn runs_are_serialized_and_a_change_during_a_send_does_not_abort_it() {
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy(8));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut transport = Channel::new(tx);
    transport.delay = Duration::from_millis(10);
    let max_active = transport.max_active.clone();
    let link = cell.attach(transport);
    cell.enqueue(0);
    tokio::time::sleep(Duration::from_millis(5)).await;
    // Mid-send: more work arrives; the send in progress completes.
    cell.enqueue_all([1, 2]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(drain(&mut rx).await, [(0, 1), (1, 1), (2, 1)]);
    assert_eq!(max_active.load(SeqCst), 1, "never two sends at once");
    assert!(link.runs() <= 3, "one run at attach, at most one per wake: {}", link.runs());
}

#[tokio::test(start_paused = true)]
async fn an_attachment_dropped_mid_send_leaves_the_envelope_in_flight_for_the_replay() {
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy(8));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut slow = Channel::new(tx.clone());
    slow.delay = Duration::from_secs(60);
    let link = cell.attach(slow);
    cell.enqueue(42);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(cell.inflight_len().get(), 1);
    drop(link);
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(drain(&mut rx).await, [], "the cancelled send never completed");
    assert_eq!(cell.inflight_len().get(), 1, "still in flight");
    cell.reconnect(Generation(1));
    let fresh = cell.attach(Channel::new(tx));
    let replayed = drain(&mut rx).await;
    assert_eq!(replayed, [(0, 2)]);
    fresh.ack(Sequence(0));
    assert_eq!(cell.inflight_len().get() + cell.pending_len().get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flaky_peer_on_the_multi_thread_runtime_loses_nothing() {
    let cx = AsyncContext::new();
    // Strict ordering: with pipelined ordering, a record retried after its
    // backoff can find the window full of later records that this receiver
    // (which acknowledges only a contiguous prefix) will not acknowledge
    // until the retried one arrives; only a reconnect's replay resolves
    // that (see docs/cells.md).
    let policy = Policy::builder()
        .inflight_limit(32)
        .retry_base(Delay(1))
        .retry_ceiling(Delay(4))
        .retry_budget(50)
        .ordering(egress_core::Ordering::Strict)
        .build()
        .unwrap();
    let cell = AsyncEgressCell::new(&cx, policy);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut transport = Channel::new(tx);
    // Every seventh send fails.
    transport.fail = (0..2_000).map(|i| (i % 7 == 3).then_some(FailureKind::Transient)).collect();
    let link = cell.attach(transport);
    let producers: Vec<_> = (0..4u32)
        .map(|p| {
            let cell = cell.clone();
            tokio::spawn(async move {
                for i in 0..250 {
                    cell.enqueue(p * 1_000 + i);
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for p in producers {
        p.await.unwrap();
    }
    // The receiving side: acknowledge the contiguous prefix received.
    let mut received = std::collections::BTreeMap::new();
    let mut next = 0u64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while next < 1_000 {
        let e = match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(e) => e.unwrap(),
            Err(_) => panic!(
                "stalled at {next}: pending head {:?} inflight {:?} parked {:?} timeout {:?} now {:?} runs {}",
                cell.pending().get().first().map(|e| e.sequence.0),
                cell.inflight().get().iter().map(|e| e.sequence.0).collect::<Vec<_>>(),
                cell.parked().get().iter().map(|p| (p.sequence.0, p.due)).collect::<Vec<_>>(),
                cell.poll_timeout(),
                cell.now(),
                link.runs()
            ),
        };
        received.entry(e.sequence.0).or_insert(e.payload);
        while received.contains_key(&next) {
            next += 1;
        }
        if next > 0 {
            link.ack(Sequence(next - 1));
        }
    }
    let mut payloads: Vec<u32> = received.into_values().collect();
    payloads.sort_unstable();
    let mut expected: Vec<u32> = (0..4).flat_map(|p| (0..250).map(move |i| p * 1_000 + i)).collect();
    expected.sort_unstable();
    assert_eq!(payloads, expected);
    assert_eq!(cell.pending_len().get() + cell.inflight_len().get() + cell.parked_len().get(), 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_cell_stops_its_timer_and_frees_its_nodes() {
    let cx = AsyncContext::new();
    let base = cx.node_count();
    let tasks = tokio::runtime::Handle::current().metrics().num_alive_tasks();
    let cell = AsyncEgressCell::new(&cx, policy(4));
    let (tx, _rx) = mpsc::unbounded_channel();
    let sem = Arc::new(Semaphore::new(0));
    let watch = Arc::downgrade(&sem);
    struct Held(Channel, #[allow(dead_code)] Arc<Semaphore>);
    impl AsyncTransport<u32> for Held {
        async fn send(&mut self, e: Envelope<u32>) -> Result<(), SendError> {
            self.0.send(e).await
        }
    }
    let link = cell.attach(Held(Channel::new(tx), sem));
    cell.enqueue(1);
    link.fail(Sequence(0), FailureKind::Transient);
    assert!(cx.node_count() > base);
    tokio::task::yield_now().await;
    assert!(
        tokio::runtime::Handle::current().metrics().num_alive_tasks() > tasks,
        "a parked record runs the timer task"
    );
    drop(link);
    drop(cell);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(watch.upgrade().is_none(), "the transport is gone");
    assert_eq!(cx.node_count(), base, "the timer task released the cell");
    assert_eq!(
        tokio::runtime::Handle::current().metrics().num_alive_tasks(),
        tasks,
        "the timer task was stopped, not left to sleep out its backoff"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_cells_debug_shows_its_state() {
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::<u32>::new(&cx, policy(4));
    cell.enqueue(1);
    let shown = format!("{cell:?}");
    assert!(shown.starts_with("AsyncEgressCell(") && shown.contains("pending"), "{shown}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_handshake_waits_for_its_generation_to_be_stored() {
    use futures::FutureExt as _;
    let cx = AsyncContext::new();
    let core = egress_core::EgressCore::restore(policy(4), egress_core::Restored::empty()).unwrap();
    let cell = AsyncEgressCell::<u32>::from_core(&cx, core, egress_reactive::CellOptions::new());
    // Nothing to wait for while the generation is stored.
    cell.generation_stored().await;
    let _ = cell.reconnect(Generation(1));
    let mut waiting = Box::pin(cell.generation_stored());
    assert!(waiting.as_mut().now_or_never().is_none(), "generation 1 is not stored yet");
    let (ready, _) = cell.poll_ready().unwrap();
    assert_eq!(ready.generation, Some(Generation(1)));
    let _ = cell.persisted(ready.epoch);
    tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("stored: the wait ends");
    // A disposed cell is waited for by no one.
    let _ = cell.reconnect(Generation(2));
    let mut waiting = Box::pin(cell.generation_stored());
    assert!(waiting.as_mut().now_or_never().is_none());
    cell.dispose();
    tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("disposed: the wait ends");
}

#[tokio::test(flavor = "current_thread")]
async fn a_cell_at_capacity_refuses_or_waits_for_room_and_delivered_waits_for_the_outcome() {
    use egress_reactive::{CellOptions, Refused, Undelivered};
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<u32> =
        AsyncEgressCell::with_options(&cx, policy(8), CellOptions::new().generation(Generation(1)).capacity(3));
    assert_eq!(cell.capacity(), Some(3));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut channel = Channel::new(tx);
    channel.fail = vec![None, None, Some(FailureKind::Permanent)];
    let link = cell.attach(channel);
    for i in 0..3 {
        assert_eq!(cell.try_enqueue(i), Ok(Sequence(u64::from(i))));
    }
    // Three unacknowledged (two sent, one a dead letter now): full. The
    // payload comes back, and nothing changed.
    let _ = drain(&mut rx).await;
    assert_eq!(cell.try_enqueue(3), Err(Refused::Full { payload: 3, capacity: 3 }));
    let shown = format!("{:?}", Refused::Full { payload: 3, capacity: 3 });
    assert!(shown.starts_with("Full") && shown.contains("capacity: 3"), "{shown}");
    assert_eq!(cell.next_sequence(), Sequence(3));

    // Waiting for room, and for outcomes.
    let waiter = tokio::spawn({
        let cell = cell.clone();
        async move { cell.enqueue_when_room(3).await }
    });
    let first = tokio::spawn({
        let cell = cell.clone();
        async move { cell.delivered(Sequence(0)).await }
    });
    let dead = tokio::spawn({
        let cell = cell.clone();
        async move { cell.delivered(Sequence(2)).await }
    });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!waiter.is_finished() && !first.is_finished(), "no ack yet: no room, no outcome");
    assert_eq!(dead.await.unwrap(), Err(Undelivered::Dead(egress_core::DeadReason::Permanent)));
    link.ack(Sequence(0));
    assert_eq!(first.await.unwrap(), Ok(()));
    assert_eq!(waiter.await.unwrap(), Ok(Sequence(3)), "room after the ack");
    assert_eq!(cell.delivered(Sequence(0)).await, Ok(()), "an acknowledged message stays so");
    assert_eq!(cell.delivered(Sequence(9)).await, Err(Undelivered::Unknown(Sequence(9))));
    // Plain enqueue ignores the capacity.
    let _ = cell.enqueue(4);
    assert_eq!(cell.next_sequence(), Sequence(5));
    assert!(cell.try_enqueue(5).is_err());
}

#[tokio::test(flavor = "current_thread")]
async fn a_delivered_future_ends_when_its_cell_is_disposed() {
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<u32> = AsyncEgressCell::new(&cx, policy(8));
    let _ = cell.enqueue(1);
    let waiting = tokio::spawn({
        let cell = cell.clone();
        async move { cell.delivered(Sequence(0)).await }
    });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    cell.dispose();
    assert_eq!(waiting.await.unwrap(), Err(egress_reactive::Undelivered::Disposed));
    assert_eq!(cell.delivered(Sequence(0)).await, Err(egress_reactive::Undelivered::Disposed));
}

#[tokio::test(flavor = "current_thread")]
async fn an_enqueue_waiting_for_room_that_is_dropped_queues_nothing() {
    let cx = AsyncContext::new();
    let options = egress_reactive::CellOptions::new().generation(Generation(1)).capacity(1);
    let cell: AsyncEgressCell<u32> = AsyncEgressCell::with_options(&cx, policy(8), options);
    assert_eq!(cell.try_enqueue(0), Ok(Sequence(0)));
    // Full: the wait is abandoned (a timeout, as a caller's select! would).
    let waited = tokio::time::timeout(Duration::from_millis(20), cell.enqueue_when_room(1)).await;
    assert!(waited.is_err(), "no acknowledgement, no room");
    assert_eq!(cell.next_sequence(), Sequence(1), "the abandoned payload was not queued");
    assert_eq!(cell.pending_len().get_untracked() + cell.inflight_len().get_untracked(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_payload_its_store_cannot_encode_is_refused_at_once_and_comes_back() {
    use egress_reactive::Refused;
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<Vec<u8>> = AsyncEgressCell::new(&cx, policy(8));
    let check: egress_reactive::EncodeCheck<Vec<u8>> =
        std::sync::Arc::new(|p: &Vec<u8>| if p.is_empty() { Err("nothing to encode".into()) } else { Ok(()) });
    cell.set_encode_check(Some(check));
    let refused = cell.try_enqueue(Vec::new());
    assert_eq!(refused, Err(Refused::Unencodable { payload: Vec::new(), reason: "nothing to encode".into() }));
    let shown = format!("{:?} / {}", refused.clone().unwrap_err(), refused.clone().unwrap_err());
    assert_eq!(
        shown,
        "Unencodable { reason: \"nothing to encode\", .. } / the payload does not encode: nothing to encode"
    );
    assert_eq!(refused.unwrap_err().into_payload(), Vec::<u8>::new(), "the payload comes back");
    assert_eq!(cell.next_sequence(), Sequence(0), "nothing queued");
    // Waiting for room never waits for a payload that cannot be written.
    assert!(matches!(cell.enqueue_when_room(Vec::new()).await, Err(Refused::Unencodable { .. })));
    assert_eq!(cell.try_enqueue(vec![1]), Ok(Sequence(0)));
    // Plain enqueue never checks; removed, nothing is refused.
    assert_eq!(cell.enqueue(Vec::new()), Sequence(1));
    cell.set_encode_check(None);
    assert_eq!(cell.try_enqueue(Vec::new()), Ok(Sequence(2)));
    // Once the graph is gone, a wait for room queues at once, still
    // checked (a hostile review found it skipped the checks there).
    let check: egress_reactive::EncodeCheck<Vec<u8>> =
        std::sync::Arc::new(|p: &Vec<u8>| if p.is_empty() { Err("nothing to encode".into()) } else { Ok(()) });
    cell.set_encode_check(Some(check));
    cell.set_size_check(Some(std::sync::Arc::new(|p: &Vec<u8>| (p.len() > 4).then_some((p.len(), 4)))));
    cell.dispose();
    assert!(matches!(cell.enqueue_when_room(Vec::new()).await, Err(Refused::Unencodable { .. })));
    assert!(matches!(cell.enqueue_when_room(vec![0; 5]).await, Err(Refused::TooLarge { .. })));
    assert_eq!(cell.enqueue_when_room(vec![1]).await, Ok(Sequence(3)));
}

#[tokio::test(flavor = "current_thread")]
async fn a_payload_above_the_transports_limit_is_refused_at_once_and_comes_back() {
    use egress_reactive::Refused;
    let cx = AsyncContext::new();
    let options = egress_reactive::CellOptions::new().capacity(2);
    let cell: AsyncEgressCell<Vec<u8>> = AsyncEgressCell::with_options(&cx, policy(8), options);
    assert_eq!(cell.too_large(&vec![0; 100]), None, "no transport, no limit");
    cell.set_size_check(Some(std::sync::Arc::new(|p: &Vec<u8>| (p.len() > 4).then_some((p.len(), 4)))));
    assert_eq!(cell.too_large(&vec![0; 5]), Some((5, 4)));
    assert_eq!(cell.too_large(&vec![0; 4]), None);
    let refused = cell.try_enqueue(vec![7; 5]);
    assert_eq!(refused, Err(Refused::TooLarge { payload: vec![7; 5], size: 5, limit: 4 }));
    let shown = format!("{:?} / {}", refused.clone().unwrap_err(), refused.clone().unwrap_err());
    assert!(shown.starts_with("TooLarge") && shown.contains("size: 5") && shown.contains("limit of 4"), "{shown}");
    assert_eq!(refused.unwrap_err().into_payload(), vec![7; 5], "the payload comes back");
    assert_eq!(cell.next_sequence(), Sequence(0), "nothing queued");
    assert_eq!(cell.try_enqueue(vec![1; 4]), Ok(Sequence(0)), "at the limit: taken");
    // Waiting for room never waits for a payload no room would fit.
    assert_eq!(
        cell.enqueue_when_room(vec![2; 9]).await,
        Err(Refused::TooLarge { payload: vec![2; 9], size: 9, limit: 4 })
    );
    assert_eq!(cell.enqueue_when_room(vec![3]).await, Ok(Sequence(1)));
    // Too large is said before full.
    assert!(matches!(cell.try_enqueue(vec![0; 5]), Err(Refused::TooLarge { .. })));
    assert!(matches!(cell.try_enqueue(vec![0; 1]), Err(Refused::Full { capacity: 2, .. })));
    // Removed by another's hand: only the check installed goes.
    let other: egress_reactive::SizeCheck<Vec<u8>> = std::sync::Arc::new(|_: &Vec<u8>| Some((1, 0)));
    cell.remove_size_check(&other);
    assert_eq!(cell.too_large(&vec![0; 5]), Some((5, 4)), "not the installed one: it stays");
    cell.set_size_check(Some(other.clone()));
    assert_eq!(cell.too_large(&vec![0; 1]), Some((1, 0)));
    cell.remove_size_check(&other);
    assert_eq!(cell.too_large(&vec![0; 100]), None, "the installed one: gone");
    // Removed, nothing is too large; plain enqueue never checks.
    cell.set_size_check(None);
    assert_eq!(cell.too_large(&vec![0; 100]), None);
    assert_eq!(cell.enqueue(vec![0; 100]), Sequence(2));
}

#[tokio::test(flavor = "current_thread")]
async fn room_waits_until_an_acknowledgement_makes_room_and_never_without_a_capacity() {
    let cx = AsyncContext::new();
    AsyncEgressCell::<u32>::new(&cx, policy(8)).room().await;
    let options = egress_reactive::CellOptions::new().generation(Generation(1)).capacity(2);
    let cell: AsyncEgressCell<u32> = AsyncEgressCell::with_options(&cx, policy(8), options);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let link = cell.attach(Channel::new(tx));
    let _ = cell.enqueue(0);
    cell.room().await; // one of two: room
    let _ = cell.enqueue(1);
    let _ = drain(&mut rx).await;
    let room = tokio::spawn({
        let cell = cell.clone();
        async move { cell.room().await }
    });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!room.is_finished(), "full: no room until an acknowledgement");
    link.ack(Sequence(0));
    tokio::time::timeout(Duration::from_secs(10), room).await.expect("room after the ack").unwrap();
    // A disposed cell ends the wait.
    let _ = cell.enqueue(2);
    let room = tokio::spawn({
        let cell = cell.clone();
        async move { cell.room().await }
    });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!room.is_finished());
    cell.dispose();
    tokio::time::timeout(Duration::from_secs(10), room).await.expect("disposed: the wait ends").unwrap();
}

/// Sends at once, except that the send of `hold` waits for a permit and the
/// send of `panic` panics (once).
struct Gate {
    hold: u64,
    panic: Option<u64>,
    permit: Arc<Semaphore>,
    sent: Arc<std::sync::Mutex<Vec<u64>>>,
    /// A count read as each send starts, and what it read.
    probe: Option<(Count, Arc<std::sync::Mutex<Vec<usize>>>)>,
}

type Count = egress_reactive::Computed<usize, egress_reactive::Threaded>;

impl AsyncTransport<u32> for Gate {
    async fn send(&mut self, envelope: Envelope<u32>) -> Result<(), SendError> {
        if let Some((count, read)) = &self.probe {
            read.lock().unwrap().push(count.get());
        }
        if envelope.sequence.0 == self.hold {
            self.permit.acquire().await.unwrap().forget();
        }
        if self.panic.take_if(|p| *p == envelope.sequence.0).is_some() {
            panic!("the transport panics on {}", envelope.sequence.0);
        }
        self.sent.lock().unwrap().push(envelope.sequence.0);
        Ok(())
    }
}

/// An effect on `count` that records each value it runs with.
fn seen(
    cx: &AsyncContext,
    count: &egress_reactive::Computed<usize, egress_reactive::Threaded>,
) -> (egress_reactive::Effect<egress_reactive::Threaded>, Arc<std::sync::Mutex<Vec<usize>>>) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let effect = cx.effect({
        let (count, seen) = (count.clone(), seen.clone());
        move || seen.lock().unwrap().push(count.get())
    });
    (effect, seen)
}

#[tokio::test(flavor = "current_thread")]
async fn an_async_attachment_tells_the_readers_of_each_claim_before_its_send() {
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<u32> = AsyncEgressCell::new(&cx, policy(8));
    for i in 0..4 {
        cell.enqueue(i);
    }
    let (_ui, inflight) = seen(&cx, cell.inflight_len());
    let permit = Arc::new(Semaphore::new(0));
    let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
    let read = Arc::new(std::sync::Mutex::new(Vec::new()));
    let probe = Some((cell.inflight_len().clone(), read.clone()));
    let _link = cell.attach(Gate { hold: 2, panic: None, permit: permit.clone(), sent: sent.clone(), probe });
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    // Sends 0 and 1 were done at their first poll, 2 waits. Its sends run
    // outside the graph's lock, where another thread may see what was sent:
    // the readers heard of each claim before its send.
    assert_eq!(*sent.lock().unwrap(), [0, 1]);
    assert_eq!(*read.lock().unwrap(), [1, 2, 3]);
    assert_eq!((cell.inflight_len().get(), cell.pending_len().get()), (3, 1));
    // The effects its claims queued ran once, before the pass waited on 2
    // (not once per claim: sends 0 and 1 completed at once).
    assert_eq!(*inflight.lock().unwrap(), [0, 3]);
    permit.add_permits(1);
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert_eq!(*sent.lock().unwrap(), [0, 1, 2, 3]);
    assert_eq!(*read.lock().unwrap(), [1, 2, 3, 4]);
    assert_eq!((cell.inflight_len().get(), cell.pending_len().get()), (4, 0));
    // And once more when the pass ended.
    assert_eq!(*inflight.lock().unwrap(), [0, 3, 4]);
}

#[tokio::test(flavor = "current_thread")]
async fn an_async_send_that_panics_fails_its_record_and_the_readers_know_both() {
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<u32> = AsyncEgressCell::new(&cx, policy(8));
    for i in 0..3 {
        cell.enqueue(i);
    }
    let (_ui, pending) = seen(&cx, cell.pending_len());
    let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
    let gate =
        Gate { hold: u64::MAX, panic: Some(1), permit: Arc::new(Semaphore::new(0)), sent: sent.clone(), probe: None };
    let _link = cell.attach(gate);
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    // 0 was sent, 1 panicked and is parked for its retry (the pass ended
    // there: 2 is still pending). The effects ran once the failure was
    // known (the pass's claims of 0 and 1 had queued them).
    assert_eq!(*sent.lock().unwrap(), [0]);
    assert_eq!((cell.pending_len().get(), cell.inflight_len().get(), cell.parked_len().get()), (1, 1, 1));
    assert_eq!(*pending.lock().unwrap(), [3, 1]);
}

/// Sends at once; the future of the send of `armed`, once it has returned
/// `Ok`, panics when dropped.
struct DropBomb {
    armed: Option<u64>,
    sent: Arc<std::sync::Mutex<Vec<u64>>>,
}

struct Bomb {
    sequence: u64,
    armed: bool,
    sent: Arc<std::sync::Mutex<Vec<u64>>>,
}

impl std::future::Future for Bomb {
    type Output = Result<(), SendError>;
    fn poll(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        self.sent.lock().unwrap().push(self.sequence);
        std::task::Poll::Ready(Ok(()))
    }
}

impl Drop for Bomb {
    fn drop(&mut self) {
        if self.armed {
            panic!("the send of {} panics in its drop", self.sequence);
        }
    }
}

impl AsyncTransport<u32> for DropBomb {
    fn send(&mut self, envelope: Envelope<u32>) -> impl Future<Output = Result<(), SendError>> + Send {
        let sequence = envelope.sequence.0;
        let armed = self.armed.take_if(|a| *a == sequence).is_some();
        Bomb { sequence, armed, sent: self.sent.clone() }
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_async_send_whose_future_panics_in_its_drop_fails_its_record_and_the_pass_goes_on_later() {
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<u32> = AsyncEgressCell::new(&cx, policy(8));
    for i in 0..3 {
        cell.enqueue(i);
    }
    let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
    let _link = cell.attach(DropBomb { armed: Some(1), sent: sent.clone() });
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    // 1 returned Ok, but its future panicked when dropped: failed as a send
    // that panicked, parked for its retry, and the pass ended there.
    assert_eq!(*sent.lock().unwrap(), [0, 1]);
    assert_eq!((cell.pending_len().get(), cell.inflight_len().get(), cell.parked_len().get()), (1, 1, 1));
    // Its retry comes due and wakes the attachment, which sends it and 2.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(*sent.lock().unwrap(), [0, 1, 1, 2]);
    assert_eq!((cell.pending_len().get(), cell.inflight_len().get(), cell.parked_len().get()), (0, 3, 0));
}

#[tokio::test(flavor = "current_thread")]
async fn an_effect_that_panics_in_an_async_pass_neither_stops_the_sends_nor_goes_unreported() {
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<u32> = AsyncEgressCell::new(&cx, policy(8));
    for i in 0..4 {
        cell.enqueue(i);
    }
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let _ui = cx.effect({
        let (count, seen) = (cell.inflight_len().clone(), seen.clone());
        move || {
            let n = count.get();
            seen.lock().unwrap().push(n);
            assert!(n != 3, "the screen cannot show 3");
        }
    });
    let permit = Arc::new(Semaphore::new(0));
    let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
    let link = cell.attach(Gate { hold: 2, panic: None, permit: permit.clone(), sent: sent.clone(), probe: None });
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    // The effect panicked on 3 as the pass was about to wait on 2's send;
    // the send waits on.
    assert_eq!(*seen.lock().unwrap(), [0, 3]);
    assert_eq!(*sent.lock().unwrap(), [0, 1]);
    permit.add_permits(1);
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert_eq!(*sent.lock().unwrap(), [0, 1, 2, 3]);
    assert_eq!((cell.inflight_len().get(), cell.pending_len().get()), (4, 0));
    assert_eq!(*seen.lock().unwrap(), [0, 3, 4]);
    // The pass ended with the effect's panic; the attachment sends on.
    cell.enqueue(4);
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert_eq!(*sent.lock().unwrap(), [0, 1, 2, 3, 4]);
    assert!(!link.is_fenced());
}

/// A payload whose copy panics when it is 1.
#[derive(Debug, PartialEq)]
struct Fragile(u32);

impl Clone for Fragile {
    fn clone(&self) -> Self {
        assert!(self.0 != 1, "1 cannot be copied");
        Fragile(self.0)
    }
}

struct FragileSink(Arc<std::sync::Mutex<Vec<u32>>>);

impl AsyncTransport<Fragile> for FragileSink {
    async fn send(&mut self, envelope: Envelope<Fragile>) -> Result<(), SendError> {
        self.0.lock().unwrap().push(envelope.payload.0);
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn an_async_pass_that_unwinds_runs_the_effects_its_claims_queued() {
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<Fragile> = AsyncEgressCell::new(&cx, policy(8));
    for i in 0..3 {
        cell.enqueue(Fragile(i));
    }
    let (_ui, inflight) = seen(&cx, cell.inflight_len());
    let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
    let _link = cell.attach(FragileSink(sent.clone()));
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    // 0 was sent; the copy of 1 panicked, which failed it (parked) and
    // unwound the pass: the effects its claims had queued ran as it
    // unwound, with nothing else to run them.
    assert_eq!(*sent.lock().unwrap(), [0]);
    assert_eq!((cell.inflight_len().get(), cell.parked_len().get(), cell.pending_len().get()), (1, 1, 1));
    assert_eq!(*inflight.lock().unwrap(), [0, 1]);
}

/// Holds the send of 1 until told, after saying it started.
struct Held {
    started: std::sync::mpsc::Sender<u64>,
    release: Arc<Semaphore>,
}

impl AsyncTransport<u32> for Held {
    async fn send(&mut self, envelope: Envelope<u32>) -> Result<(), SendError> {
        let _ = self.started.send(envelope.sequence.0);
        if envelope.sequence.0 == 1 {
            self.release.acquire().await.unwrap().forget();
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_thread_reading_during_an_async_send_sees_its_claim() {
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<u32> = AsyncEgressCell::new(&cx, policy(8));
    for i in 0..3 {
        cell.enqueue(i);
    }
    let (started, sends) = std::sync::mpsc::channel();
    let release = Arc::new(Semaphore::new(0));
    let _link = cell.attach(Held { started, release: release.clone() });
    // A thread apart from the runtime's: it learns from the transport that
    // the send of 1 began, and reads the counts while that send waits.
    let reader = std::thread::spawn({
        let cell = cell.clone();
        move || {
            let mut seen = Vec::new();
            for _ in 0..2 {
                sends.recv().unwrap();
                seen.push((cell.inflight_len().get(), cell.pending_len().get()));
            }
            seen
        }
    });
    let seen = tokio::task::spawn_blocking(move || reader.join().unwrap()).await.unwrap();
    // 0's send began with 0 claimed; 1's with 0 and 1 claimed (2 still
    // pending): each read came after its send began, so it counts that
    // claim.
    let [(first, _), second] = seen[..] else { panic!("two reads: {seen:?}") };
    assert!(first >= 1, "{seen:?}");
    assert_eq!(second, (2, 1), "{seen:?}");
    release.add_permits(1);
}

#[tokio::test(start_paused = true)]
async fn a_wake_that_only_schedules_an_async_pass_notifies_its_transition_at_once() {
    // The cell had a synchronous attachment once; the wake now schedules
    // an async pass, which runs later: the enqueue is notified at once.
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy(4));
    let sink = Sink::default();
    drop((*cell).attach(sink.clone()));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _link = cell.attach(Channel::new(tx));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let _screen = cx.effect({
        let (count, seen) = (cell.pending_len().clone(), seen.clone());
        move || seen.lock().expect("seen").push(count.get())
    });
    cell.enqueue(7);
    assert_eq!(cell.pending_len().get(), 1);
    assert_eq!(*seen.lock().expect("seen"), [0, 1]);
    assert_eq!(drain(&mut rx).await, [(0, 1)]);
    assert_eq!(*seen.lock().expect("seen"), [0, 1, 0]);
    assert!(sink.0.lock().expect("sink").is_empty(), "the dropped attachment sent nothing");
}
