//! What the NATS tests share: the server from the environment, fresh
//! streams, publishers' configs, and raw reads and writes of a stream.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use async_nats::jetstream::{self, Context};
use bytes::Bytes;
use egress_core::{Policy, Sequence};
use egress_nats::{PublisherConfig, Stamp};
use egress_reactive::{AsyncContext, AsyncEgressCell};
use futures_util::StreamExt as _;

pub(crate) fn url() -> Option<String> {
    if std::env::var_os("EGRESS_TEST_LOG").is_some() {
        let _ = tracing_subscriber::fmt().with_env_filter("egress_nats=debug").with_test_writer().try_init();
    }
    egress_testkit::nats_url()
}

pub(crate) fn addr(url: &str) -> SocketAddr {
    url.trim_start_matches("nats://").parse().expect("EGRESS_NATS_URL is nats://ip:port")
}

/// A name no other test (or earlier run) uses (NATS names take `_`).
pub(crate) fn fresh(name: &str) -> String {
    egress_testkit::fresh(name).replace('-', "_")
}

/// A JetStream stream of one subject, in memory; its name and subject.
pub(crate) async fn stream(js: &Context, name: &str, duplicate_window: Duration) -> (String, String) {
    let name = fresh(name);
    let subject = format!("egress.{name}");
    make_stream(js, &name, &subject, duplicate_window).await;
    (name, subject)
}

/// Makes the in-memory stream `name` of the one subject `subject` (again,
/// after a test deleted it).
pub(crate) async fn make_stream(js: &Context, name: &str, subject: &str, duplicate_window: Duration) {
    js.create_stream(jetstream::stream::Config {
        name: name.to_owned(),
        subjects: vec![subject.to_owned()],
        storage: jetstream::stream::StorageType::Memory,
        duplicate_window,
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("the stream is made: {e}"));
}

/// A record's stamp: `producer`'s incarnation `incarnation`, generation 1.
pub(crate) fn stamp(producer: &str, incarnation: u128, sequence: u64) -> Stamp {
    Stamp { producer: producer.into(), incarnation, sequence, generation: 1, dead: None, claim: false }
}

/// The next delivery's (producer, sequence, skipped), acknowledged.
pub(crate) async fn took(sub: &mut egress_nats::Subscriber) -> (String, u64, Option<std::ops::Range<u64>>) {
    let d = tokio::time::timeout(Duration::from_secs(10), sub.next()).await.expect("a delivery comes").expect("read");
    let out = (d.stamp().producer.clone(), d.sequence(), d.skipped());
    d.ack().await.expect("acked");
    out
}

pub(crate) async fn connect(url: &str) -> Context {
    jetstream::new(async_nats::connect(url).await.expect("the server answers"))
}

pub(crate) fn cell(cx: &AsyncContext, window: usize) -> AsyncEgressCell<Bytes> {
    AsyncEgressCell::new(cx, Policy::builder().inflight_limit(window).build().expect("a valid policy"))
}

pub(crate) fn config(producer: &str, stream: &str, subject: &str) -> PublisherConfig {
    PublisherConfig {
        timeout: Duration::from_secs(1),
        backoff_base: Duration::from_millis(5),
        backoff_max: Duration::from_millis(100),
        ..PublisherConfig::new(producer, stream, subject)
    }
}

/// Waits (bounded by the test kit's limit) until the cell's
/// acknowledgement watermark reaches `through`.
pub(crate) async fn acked<T: Clone + Send + Sync + 'static>(cell: &AsyncEgressCell<T>, through: u64) {
    egress_testkit::until(
        || (cell.acked_through().get_untracked() >= Some(Sequence(through))).then_some(()),
        || format!("acked through {:?}, not {through}", cell.acked_through().get_untracked()),
    )
    .await;
}

/// Every record of the stream (takeover claims left out), in stream order,
/// read raw (no dedupe): its stamp (or `None`) and payload.
pub(crate) async fn contents(js: &Context, stream: &str) -> Vec<(Option<Stamp>, Bytes)> {
    messages(js, stream).await.into_iter().filter(|(s, _)| !s.as_ref().is_some_and(|s| s.claim)).collect()
}

/// Every message of the stream, in stream order, read raw.
pub(crate) async fn messages(js: &Context, stream: &str) -> Vec<(Option<Stamp>, Bytes)> {
    let stream = js.get_stream(stream).await.expect("the stream exists");
    let count = stream.cached_info().state.messages;
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            ack_policy: jetstream::consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .expect("a reader");
    let mut messages = consumer.messages().await.expect("messages");
    let mut out = Vec::new();
    while (out.len() as u64) < count {
        let m = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .expect("the stream's messages come")
            .expect("not ended")
            .expect("a message");
        out.push((m.headers.as_ref().and_then(|h| Stamp::from_headers(h).ok()), m.payload.clone()));
    }
    out
}

pub(crate) fn payload(i: u64) -> Bytes {
    Bytes::from(format!("message {i}"))
}

/// Publishes a raw message with `stamp`'s headers (no message id: the
/// broker does not deduplicate it), as a hostile or broken peer would.
pub(crate) async fn raw(js: &Context, subject: &str, stamp: Option<&Stamp>, body: Bytes) {
    let headers = stamp.map(|s| {
        let mut h = async_nats::HeaderMap::new();
        for (name, values) in s.to_headers().iter() {
            if AsRef::<str>::as_ref(name) != "Nats-Msg-Id" {
                for v in values {
                    h.append(name.clone(), v.clone());
                }
            }
        }
        h
    });
    let ack = match headers {
        Some(h) => js.publish_with_headers(subject.to_owned(), h, body).await,
        None => js.publish(subject.to_owned(), body).await,
    };
    ack.expect("sent").await.expect("stored");
}

/// The next state of `states` that `skip` does not pass over, within 30 s.
pub(crate) async fn next_state(
    states: &mut (impl futures_util::Stream<Item = egress_nats::ConnectionState> + Unpin),
    skip: impl Fn(&egress_nats::ConnectionState) -> bool,
) -> egress_nats::ConnectionState {
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let s = states.next().await.expect("the stream goes on while the publisher is kept");
            if !skip(&s) {
                return s;
            }
        }
    })
    .await;
    found.expect("the state moves within 30 s")
}
