//! The NATS JetStream benchmark: messages per second published into a
//! JetStream stream and acknowledged by the server, the egress cell path
//! (AsyncEgressCell + egress_nats::Publisher) against a plain async-nats
//! loop with the same acknowledgement discipline: the same headers (message
//! id, the expected-sequence fence, the egress stamp), at most 256 publish
//! acknowledgements outstanding, every one awaited and checked.
//!
//! Each run publishes to a fresh stream of one subject (file storage, the
//! server's defaults) on the same server and client settings.

use std::future::IntoFuture as _;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, Context};
use bytes::Bytes;
use egress_core::{Policy, Sequence};
use egress_nats::{Publisher, PublisherConfig, Stamp};
use egress_reactive::{AsyncContext, AsyncEgressCell};
use futures_util::StreamExt as _;

pub const WINDOW: usize = 256;

fn payload(i: u64) -> Bytes {
    Bytes::from(format!("{i:032}"))
}

/// A fresh stream of one subject; its name and subject.
async fn stream(js: &Context, tag: &str) -> anyhow::Result<(String, String)> {
    use std::hash::BuildHasher;
    let name = format!("bench_{tag}_{:016x}", std::collections::hash_map::RandomState::new().hash_one(0u64));
    let subject = format!("bench.{name}");
    js.create_stream(jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        ..Default::default()
    })
    .await
    .map_err(|e| anyhow::anyhow!("create stream: {e}"))?;
    Ok((name, subject))
}

/// Checks that the stream holds `n` messages and deletes it.
async fn check(js: &Context, name: &str, n: u64) -> anyhow::Result<()> {
    let mut stream = js.get_stream(name).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let held = stream.info().await.map_err(|e| anyhow::anyhow!("{e}"))?.state.messages;
    anyhow::ensure!(held == n, "stream {name} holds {held} messages, not {n}");
    js.delete_stream(name).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// Time for `n` messages through a cell and the publisher.
pub async fn egress(url: &str, n: u64) -> anyhow::Result<Duration> {
    let js = jetstream::new(async_nats::connect(url).await?);
    let (name, subject) = stream(&js, "egress").await?;
    let cx = AsyncContext::new();
    let policy = Policy::builder().inflight_limit(WINDOW).build()?;
    let cell: AsyncEgressCell<Bytes> = AsyncEgressCell::new(&cx, policy);
    let publisher = Publisher::spawn(cell.clone(), url, PublisherConfig::new("bench", &name, &subject))?;
    // The first epoch open before the clock starts, as the plain loop's
    // connection is.
    while publisher.stats().epochs == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let t = Instant::now();
    for chunk in (0..n).collect::<Vec<_>>().chunks(4_096) {
        cell.enqueue_all(chunk.iter().map(|&i| payload(i)));
        tokio::task::yield_now().await;
    }
    while cell.acked_through().get_untracked() != Some(Sequence(n - 1)) {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let elapsed = t.elapsed();
    let stats = publisher.shutdown().await;
    anyhow::ensure!(stats.lost == 0 && stats.resyncs == 0, "a clean run: {stats:?}");
    // The stream holds the records and the takeover's claim (the run has
    // no lost epoch: one claim, acknowledged).
    check(&js, &name, n + stats.claims).await?;
    Ok(elapsed)
}

/// Time for `n` messages through a plain loop: the same headers, at most
/// `WINDOW` acknowledgements outstanding, each checked.
pub async fn plain(url: &str, n: u64) -> anyhow::Result<Duration> {
    let js = jetstream::context::ContextBuilder::new()
        .timeout(Duration::from_secs(2))
        .max_ack_inflight(16_384)
        .build(async_nats::connect(url).await?);
    let (name, subject) = stream(&js, "plain").await?;
    let subject: async_nats::Subject = subject.into();
    let t = Instant::now();
    let mut acks = futures_util::stream::FuturesUnordered::new();
    let mut previous: Option<String> = None;
    for i in 0..n {
        let stamp = Stamp {
            producer: "bench".into(),
            incarnation: 1,
            sequence: i,
            generation: 1 << 32,
            dead: None,
            claim: false,
        };
        let mut headers = stamp.to_headers();
        match &previous {
            None => headers.insert(async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, "0"),
            Some(id) => headers.insert(async_nats::header::NATS_EXPECTED_LAST_MESSAGE_ID, id.as_str()),
        }
        previous = Some(stamp.message_id());
        let ack = js.publish_with_headers(subject.clone(), headers, payload(i)).await?;
        acks.push(ack.into_future());
        if acks.len() >= WINDOW {
            let ack = acks.next().await.expect("one outstanding")?;
            anyhow::ensure!(!ack.duplicate, "no duplicates");
        }
    }
    while let Some(ack) = acks.next().await {
        anyhow::ensure!(!ack?.duplicate, "no duplicates");
    }
    let elapsed = t.elapsed();
    check(&js, &name, n).await?;
    Ok(elapsed)
}
