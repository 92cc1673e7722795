#![allow(clippy::unwrap_used)]
//! A receiver that resumes from its application's record: a restarted
//! receiver hands over nothing the application recorded, a record that
//! cannot be read refuses the handshake (the producer comes back) rather
//! than delivering twice, and a lookup that panics does neither harm.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::Bytes;
use common::{limit, payload, policy, sender_config};
use egress_core::Incarnation;
use egress_reactive::{AsyncContext, AsyncEgressCell};
use egress_ws::{AckFaults, AckMode, Receiver, ReceiverConfig, Resume, Sender};

/// An application's record kept in memory (a real store would be
/// `egress_store::ReceivedLog`), which can be made to fail or panic.
#[derive(Debug, Default)]
struct Record {
    next: parking_lot::Mutex<HashMap<(String, u128), u64>>,
    /// Lookups to fail (1) or panic (2) before answering, counted down.
    faults: parking_lot::Mutex<Vec<u8>>,
    lookups: AtomicU32,
}

impl Resume for Record {
    fn resume(&self, producer: &str, incarnation: Incarnation) -> Result<Option<u64>, String> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        match self.faults.lock().pop() {
            Some(1) => return Err("the disk is gone".into()),
            Some(2) => panic!("a lookup that panics"),
            _ => {}
        }
        Ok(self.next.lock().get(&(producer.to_owned(), incarnation.0)).copied())
    }
}

fn config(record: &Arc<Record>) -> ReceiverConfig {
    ReceiverConfig { ack_mode: AckMode::Explicit, resume: Some(record.clone()), ..ReceiverConfig::default() }
}

/// Takes `n` deliveries, "applies" each (records it), then commits it.
async fn apply(receiver: &mut Receiver, record: &Record, n: u64) -> Vec<u64> {
    let mut got = Vec::new();
    for _ in 0..n {
        let d = tokio::time::timeout(limit(), receiver.recv()).await.expect("a delivery in time");
        record.next.lock().insert((d.producer.to_string(), d.incarnation.0), d.sequence + 1);
        got.push(d.sequence);
        d.commit();
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_receiver_hands_over_nothing_its_application_recorded() {
    let record = Arc::new(Record::default());
    // The first receiver's acknowledgements never arrive: the producer
    // learns nothing of what its application applied.
    let silent = ReceiverConfig { ack_faults: AckFaults { drop: 1.0, ..AckFaults::default() }, ..config(&record) };
    let mut first = Receiver::bind("127.0.0.1:0", silent).await.unwrap();
    let addr = first.local_addr();
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<Bytes> = AsyncEgressCell::new(&cx, policy());
    cell.enqueue_all((0..20).map(payload));
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), sender_config(7)).unwrap();
    assert_eq!(apply(&mut first, &record, 12).await, (0..12).collect::<Vec<_>>());
    // The receiver goes before the producer heard of what was applied.
    first.shutdown().await;
    assert_eq!(cell.acked_through().get_untracked(), None);
    let mut second = Receiver::bind(addr, config(&record)).await.unwrap();
    assert_eq!(apply(&mut second, &record, 8).await, (12..20).collect::<Vec<_>>(), "nothing applied twice");
    let _ = sender.shutdown().await;
    assert!(record.lookups.load(Ordering::SeqCst) >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_cannot_be_read_refuses_the_handshake_and_the_producer_comes_back() {
    let record = Arc::new(Record::default());
    // The first lookup fails, the second panics, the third answers.
    *record.faults.lock() = vec![2, 1];
    let mut receiver = Receiver::bind("127.0.0.1:0", config(&record)).await.unwrap();
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<Bytes> = AsyncEgressCell::new(&cx, policy());
    cell.enqueue_all((0..5).map(payload));
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", receiver.local_addr()), sender_config(7)).unwrap();
    assert_eq!(apply(&mut receiver, &record, 5).await, (0..5).collect::<Vec<_>>());
    let stats = sender.shutdown().await;
    assert_eq!(record.lookups.load(Ordering::SeqCst), 3);
    assert!(stats.failed_attempts >= 2, "{stats:?}");
    assert!(receiver.stats().rejected >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_forgotten_for_a_newcomer_resumes_from_the_record_and_delivers_nothing_twice() {
    // Two producer ids at most, and acknowledgements that never arrive:
    // the producer never learns what the application applied. Its id is
    // forgotten for newcomers while it is away; back, it resumes from the
    // application's record, not from its own resume-from (0).
    let record = Arc::new(Record::default());
    let lossy = ReceiverConfig {
        max_producers: 2,
        eviction_floor: std::time::Duration::ZERO,
        ack_faults: AckFaults { drop: 1.0, ..AckFaults::default() },
        ..config(&record)
    };
    let mut receiver = Receiver::bind("127.0.0.1:0", lossy).await.unwrap();
    let url = format!("ws://{}", receiver.local_addr());
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<Bytes> = AsyncEgressCell::new(&cx, policy());
    cell.enqueue_all((0..10).map(payload));
    let sender = Sender::spawn(cell.clone(), url.clone(), sender_config(8)).unwrap();
    assert_eq!(apply(&mut receiver, &record, 10).await, (0..10).collect::<Vec<_>>());
    let _ = sender.shutdown().await;
    assert_eq!(cell.acked_through().get_untracked(), None, "no acknowledgement reached the producer");
    // The sender's shutdown returns once its close is answered, which may be
    // before the receiver's connection task has let the stream go: a
    // stranger arriving in between would find it connected and be told Busy.
    common::until(&receiver, "the producer's connection ended", |s| s.open_connections == 0).await;
    // Two strangers: the second takes the idle producer's place.
    let mut strangers = Vec::new();
    for name in ["s1", "s2"] {
        let mut ws = common::raw_client(&receiver).await;
        let hello = egress_ws::protocol::Frame::Handshake {
            producer: name.into(),
            incarnation: 1,
            generation: 1,
            resume_from: 0,
        };
        futures_util::SinkExt::send(&mut ws, tokio_tungstenite::tungstenite::Message::Binary(hello.encode()))
            .await
            .unwrap();
        assert!(matches!(common::next_frame(&mut ws).await, Some(egress_ws::protocol::Frame::Welcome { .. })));
        strangers.push(ws);
    }
    assert!(receiver.stats().evictions >= 1, "{:?}", receiver.stats());
    // The strangers leave, so that the producer finds room again.
    drop(strangers);
    cell.enqueue_all((10..12).map(payload));
    let sender = Sender::spawn(cell.clone(), url, sender_config(9)).unwrap();
    assert_eq!(apply(&mut receiver, &record, 2).await, [10, 11], "nothing applied twice");
    let _ = sender.shutdown().await;
}
