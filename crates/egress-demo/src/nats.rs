//! `egress-demo --nats URL`: the main job over NATS JetStream. The cell
//! publishes into a fresh stream through a proxy that kills its connection
//! at the seeded points; a subscriber reads the stream back and the summary
//! says whether each message arrived exactly once and in order.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream;
use egress_nats::{Content, Publisher, PublisherConfig, Subscriber, SubscriberConfig};
use egress_ws::ChaosProxy;
use serde_json::json;

use crate::{Options, chaos_note, demo_cell, enqueue_paced, finish_run, kill_points, payload, progress};

pub(crate) async fn run(o: Options, url: &str) -> anyhow::Result<()> {
    let server: std::net::SocketAddr = tokio::net::lookup_host(url.trim_start_matches("nats://"))
        .await
        .with_context(|| format!("{url}: not host:port"))?
        .next()
        .with_context(|| format!("{url}: no address"))?;
    let js = jetstream::new(async_nats::connect(url).await.with_context(|| format!("connecting to {url}"))?);
    let name = format!("egress_demo_{}_{}", std::process::id(), o.seed);
    let subject = format!("egress.demo.{name}");
    js.create_stream(jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        ..Default::default()
    })
    .await
    .map_err(|e| anyhow::anyhow!("creating stream {name}: {e}"))?;
    let proxy = ChaosProxy::start(server, None).await?;
    let points = if o.chaos { kill_points(o.seed, o.kill_every, o.messages) } else { Vec::new() };
    crate::say!(
        "egress-demo: {} messages{} into NATS stream {name} at {url}, through {} {}",
        o.messages,
        o.rate.map(|r| format!(" at {r}/s")).unwrap_or_default(),
        proxy.local_addr(),
        chaos_note(&o, &points)
    );
    let (cx, cell) = demo_cell(&o)?;
    let (bar, _effect, retries) = progress(&cx, &cell, o.messages);
    let started = Instant::now();
    let config = PublisherConfig {
        seed: o.seed,
        backoff_base: Duration::from_millis(5),
        backoff_max: Duration::from_millis(500),
        ..PublisherConfig::new("egress-demo", &name, &subject)
    };
    let publisher = Publisher::spawn(cell.clone(), &format!("nats://{}", proxy.local_addr()), config)?;
    // The application side: read the stream back and check each delivery.
    let n = o.messages;
    let mut subscriber = Subscriber::new(&js, &name, SubscriberConfig::new("egress-demo")).await?;
    let check = tokio::spawn(async move {
        let (mut next, mut out_of_order) = (0u64, 0u64);
        while next < n {
            let d = match subscriber.next().await {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(error = %e, "egress-demo: reading the stream");
                    continue;
                }
            };
            if d.sequence() != next || d.content() != Content::Message(payload(next)) {
                out_of_order += 1;
            }
            next = d.sequence() + 1;
            d.ack().await?;
        }
        anyhow::Ok((next, out_of_order, subscriber))
    });
    enqueue_paced(&cell, 0..o.messages, o.rate, Some((&proxy, &points))).await;
    let (received, out_of_order, subscriber) = check.await??;
    while cell.acked_through().get_untracked().map_or(0, |s| s.get() + 1) < o.messages {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    bar.finish();
    let stats = publisher.shutdown().await;
    let s = subscriber.stats();
    // The stream holds the records and the publisher's takeover claims
    // (more than one when a claim's acknowledgement was lost), which the
    // subscriber passed over.
    let stored = js.get_stream(&name).await?.cached_info().state.messages.saturating_sub(s.claims);
    let _ = js.delete_stream(&name).await;
    let exactly_once = received == o.messages && out_of_order == 0 && s.delivered == o.messages && stored == o.messages;
    finish_run(
        &o,
        &cell,
        elapsed,
        json!({
            "messages": o.messages,
            "delivered": s.delivered,
            "exactly_once_in_order": exactly_once,
            "stored_in_stream": stored,
            "duplicates_dropped_by_receiver": s.duplicates,
            "duplicates_acknowledged_by_broker": stats.duplicates,
            "connections_killed": proxy.kills(),
            "kill_points": points,
            "reconnects": stats.lost + stats.resyncs,
            "retries": retries.load(Ordering::Relaxed),
        }),
        exactly_once,
    )
}
