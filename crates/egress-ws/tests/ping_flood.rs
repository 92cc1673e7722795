#![allow(clippy::unwrap_used)]
//! A producer that floods pings and never reads: the pongs the receiver
//! owes it are bounded, and the connection is closed by the write timeout.
//! Alone in its test binary, so that the resident set it measures is this
//! test's.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Client, handshake, next_frame, raw, raw_client, until, ws_frame};
use egress_ws::protocol::Frame;
use egress_ws::{Receiver, ReceiverConfig};
use futures_util::SinkExt;
use tokio::io::AsyncWriteExt;

/// This process's resident set, in bytes.
fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * 1024
}

/// The largest resident set seen every 10 ms until `stop`.
fn sample_peak(stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut peak = 0;
        while !stop.load(Ordering::Relaxed) {
            peak = peak.max(rss());
            std::thread::sleep(Duration::from_millis(10));
        }
        peak.max(rss())
    })
}

/// Writes 125-byte masked pings as fast as the socket takes them, never
/// reading, until `stop` or the receiver closes; returns the bytes written.
async fn flood(mut ws: Client, stop: Arc<AtomicBool>) -> usize {
    let ping = ws_frame(true, 9, &[0xAB; 125]);
    let batch: Vec<u8> = ping.iter().copied().cycle().take(ping.len() * 500).collect();
    let (mut written, mut at) = (0, 0);
    while !stop.load(Ordering::Relaxed) {
        match tokio::time::timeout(Duration::from_millis(50), raw(&mut ws).write(&batch[at..])).await {
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(n)) => {
                written += n;
                at = (at + n) % batch.len();
            }
            Err(_) => {}
        }
    }
    written
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_flood_that_never_reads_is_bounded_and_closed() {
    let (keepalive, idle) = (Duration::from_secs(1), Duration::from_secs(2));
    let config = ReceiverConfig { idle_timeout: idle, keepalive, ..ReceiverConfig::default() };
    let receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let mut ws = raw_client(&receiver).await;
    ws.send(handshake(1, 1, 0)).await.unwrap();
    assert!(matches!(next_frame(&mut ws).await, Some(Frame::Welcome { .. })));
    let base = rss();
    let stop = Arc::new(AtomicBool::new(false));
    let sampling = sample_peak(stop.clone());
    let started = tokio::time::Instant::now();
    let flooding = tokio::spawn(flood(ws, stop.clone()));
    let stats = until(&receiver, "the flooder closed", |s| s.idle_closed >= 1).await;
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let written = flooding.await.unwrap();
    let grown = sampling.join().unwrap().saturating_sub(base);
    assert!(written > 1_000_000, "a flood: {written} bytes of pings");
    assert!(took < keepalive + idle + Duration::from_secs(2), "closed by the write timeout: {took:?}; {stats:?}");
    assert!(grown < 16_000_000, "one ping-flooding connection grew the process by {grown} bytes ({written} written)");
}
