//! The HTTP benchmark: requests per second over loopback, the egress path
//! (an `AsyncLanesCell` and the `HttpSender`) against a plain reqwest loop
//! keeping the same number of requests open, to the same homeserver (no
//! chaos), with the same bodies and the same `Idempotency-Key` header.
//!
//! The egress path spreads the records over `CONCURRENCY` serial lanes
//! (rooms: one request open per room), so that at most `CONCURRENCY`
//! requests are open at once, as in the plain loop. Both run on one
//! multi-thread runtime (2 workers) and check that the server applied
//! every request once.

use std::time::{Duration, Instant};

use egress_core::{LaneKey, LaneKind, LanesPolicy};
use egress_http::homeserver::{Chaos, Homeserver};
use egress_http::{HttpConfig, HttpRequest, HttpSender, Method};
use egress_reactive::{AsyncContext, AsyncLanesCell};
use tokio::task::JoinSet;

/// Requests open at once, on both paths.
pub const CONCURRENCY: usize = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Room(usize);

impl LaneKey for Room {
    fn kind(&self) -> LaneKind {
        LaneKind::Serial
    }
}

fn path(i: usize) -> String {
    format!("rooms/{}/send/m.text/t{i}", i % CONCURRENCY)
}

fn body(i: usize) -> bytes::Bytes {
    bytes::Bytes::from(format!(r#"{{"msgtype":"m.text","body":"message {i:08}"}}"#))
}

/// Time for `n` requests through the lanes cell and the sender.
pub async fn egress(n: usize) -> Duration {
    let server = Homeserver::start(Chaos::none()).await.expect("bind");
    let cx = AsyncContext::new();
    let policy = LanesPolicy::new(HttpConfig::policy(10), CONCURRENCY).expect("a valid policy");
    let cell = AsyncLanesCell::new(&cx, policy);
    let sender = HttpSender::start(&cell, HttpConfig::new(&server.url()).expect("a URL")).expect("started");
    let t = Instant::now();
    for i in 0..n {
        let request = HttpRequest {
            method: Method::PUT,
            path: path(i),
            body: body(i),
            content_type: Some("application/json".into()),
        };
        cell.enqueue(Room(i % CONCURRENCY), request).expect("a lane");
        if i % 1_024 == 0 {
            tokio::task::yield_now().await;
        }
    }
    while cell.pending_len().get_untracked() + cell.inflight_len().get_untracked() > 0 {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let elapsed = t.elapsed();
    assert_eq!(server.applied().len(), n, "every request applied once");
    let _ = sender.shutdown().await;
    elapsed
}

/// Time for `n` requests from a plain loop keeping `CONCURRENCY` open.
pub async fn plain(n: usize) -> Duration {
    let server = Homeserver::start(Chaos::none()).await.expect("bind");
    let client = reqwest::Client::new();
    let base = server.url();
    let t = Instant::now();
    let mut open = JoinSet::new();
    for i in 0..n {
        if open.len() == CONCURRENCY {
            open.join_next().await.expect("one open").expect("joined");
        }
        let request = client
            .put(format!("{base}{}", path(i)))
            .header("idempotency-key", format!("plain:{i}"))
            .header("content-type", "application/json")
            .body(body(i));
        open.spawn(async move {
            let mut response = request.send().await.expect("sent");
            assert!(response.status().is_success());
            while let Ok(Some(_)) = response.chunk().await {}
        });
    }
    while let Some(done) = open.join_next().await {
        done.expect("joined");
    }
    let elapsed = t.elapsed();
    assert_eq!(server.applied().len(), n, "every request applied once");
    elapsed
}
