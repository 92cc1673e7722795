//! The relay's metrics through `tracing` (events of target
//! `egress::metrics` whose `monotonic_counter.*` and `histogram.*` fields a
//! metrics layer turns into instruments), and its stored watermark. Alone
//! in its binary: `tracing` caches per call site whether anyone listens.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use egress_core::{Policy, Sequence};
use egress_reactive::{AsyncContext, AsyncTransport, CellOptions, SendError};
use egress_store::{RelayConfig, open_durable};
use egress_testkit::Metrics;
use tracing_subscriber::layer::SubscriberExt as _;

/// Sends into a channel.
struct Channel(tokio::sync::mpsc::UnboundedSender<u64>);

impl AsyncTransport<Bytes> for Channel {
    async fn send(&mut self, envelope: egress_core::Envelope<Bytes>) -> Result<(), SendError> {
        self.0.send(envelope.sequence.get()).map_err(|_| SendError::transient("gone"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_are_counted_in_metrics_and_raise_the_stored_watermark() {
    let metrics = Metrics::default().with_span("egress_relay");
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(metrics.clone())).unwrap();
    let dir = egress_testkit::TempDir::new();
    let db = dir.db();
    let config = RelayConfig { poll_interval: Duration::from_millis(5), ..RelayConfig::default() };
    let cx = AsyncContext::new();
    let policy = Policy::builder().inflight_limit(128).build().unwrap();
    let durable = open_durable(&cx, &db, "s", policy, CellOptions::new(), config.clone()).await.unwrap();
    let stored = durable.relay.stored_ack();
    assert_eq!(*stored.borrow(), None, "a new stream: nothing acknowledged in the store");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let link = durable.cell.attach(Channel(tx));
    for i in 0..100u32 {
        durable.cell.enqueue(Bytes::from(i.to_be_bytes().to_vec()));
        if i % 10 == 9 {
            tokio::task::yield_now().await;
        }
    }
    let mut sent = Vec::new();
    while sent.len() < 100 {
        sent.push(tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.unwrap().unwrap());
    }
    assert_eq!(*stored.borrow(), None, "sent, nothing acknowledged");
    let _ = link.ack(Sequence(49));
    let mut watch = stored.clone();
    tokio::time::timeout(Duration::from_secs(10), watch.wait_for(|s| *s == Some(Sequence(49)))).await.unwrap().unwrap();
    let _ = link.ack(Sequence(99));
    tokio::time::timeout(Duration::from_secs(10), watch.wait_for(|s| *s == Some(Sequence(99)))).await.unwrap().unwrap();
    let stats = durable.relay.shutdown().await;
    // Every commit an event: its records, its time.
    assert_eq!(metrics.sum("monotonic_counter.egress_relay_appended"), 100.0);
    assert_eq!(metrics.sum("monotonic_counter.egress_relay_commits") as u64, stats.commits);
    assert_eq!(metrics.count("histogram.egress_relay_commit_seconds") as u64, stats.commits);
    assert!(stats.commits >= 2, "appends, then the acknowledgement: {stats:?}");
    assert_eq!(metrics.sum("monotonic_counter.egress_relay_failures"), 0.0);
    // Nothing came through an outbox: no adoption event at all (not one
    // of zero records per poll).
    assert_eq!(metrics.count("monotonic_counter.egress_relay_adopted") as u64, 0);
    drop(link);
    drop(durable.cell);
    // A restarted relay starts from the stored watermark.
    let again = open_durable(&cx, &db, "s", policy, CellOptions::new(), config).await.unwrap();
    assert_eq!(*again.relay.stored_ack().borrow(), Some(Sequence(99)));
    let _ = again.relay.shutdown().await;
    let by_name: HashMap<String, usize> = metrics.names().into_iter().fold(HashMap::new(), |mut m, n| {
        *m.entry(n).or_default() += 1;
        m
    });
    assert!(by_name.keys().all(|n| n.starts_with("monotonic_counter.") || n.starts_with("histogram.")), "{by_name:?}");
    assert_eq!(metrics.streams(), ["s", "s"], "each relay in a span naming its stream");
    assert_eq!(metrics.outside_span(), Vec::<String>::new(), "every metrics event in its relay's span");
}
