#![cfg(feature = "async")]
#![allow(clippy::unwrap_used)]
//! `send_when_room` on a thread-safe relay cell: it waits while the relay
//! is full (the hysteresis: until a drain takes it down to low water, not
//! just below high), sends once it is not, refuses at once what never
//! fits, and is cancel-safe.

use std::future::Future;
use std::pin::pin;
use std::task::{Context as TaskContext, Poll, Waker};

use egress_core::{Backpressure, KeepLatest, Overflow, RawFifo, SendRefused, Sent, Water};
use egress_reactive::{AsyncContext, ThreadSafeRelayCell};

fn blocking(high: u64, low: u64) -> Backpressure {
    Backpressure::count(Water::new(high, low), Overflow::Block)
}

/// Polls `fut` once, without a runtime's wake-up.
fn poll_once<F: Future>(fut: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut TaskContext::from_waker(Waker::noop()))
}

#[tokio::test]
async fn send_when_room_waits_until_low_water_then_sends() {
    let cx = AsyncContext::new();
    let relay = ThreadSafeRelayCell::new(&cx, KeepLatest, blocking(2, 0)).unwrap();
    assert_eq!(relay.send_when_room(1u32).await, Ok(Sent::Accepted), "not full: at once");
    assert_eq!(relay.send(2), Ok(Sent::Accepted));
    let waiting = tokio::spawn({
        let relay = relay.clone();
        async move { relay.send_when_room(3).await }
    });
    // It tried, found the relay full, and waits.
    while relay.blocked().get() == 0 {
        tokio::task::yield_now().await;
    }
    assert!(!waiting.is_finished());
    // Below high but above low: still full, still waiting.
    assert_eq!(relay.pop().map(|d| d.value), Some(1));
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!waiting.is_finished());
    assert_eq!(relay.depth().get(), 1);
    // Down to low: it sends.
    assert_eq!(relay.pop().map(|d| d.value), Some(2));
    assert_eq!(waiting.await.unwrap(), Ok(Sent::Accepted));
    assert_eq!(relay.with_relay(|r| r.iter().copied().collect::<Vec<_>>()), vec![3]);
}

#[tokio::test]
async fn send_when_room_refuses_at_once_what_never_fits() {
    let cx = AsyncContext::new();
    let bp = blocking(4, 0).with_bytes(Water::new(2, 0));
    let relay = ThreadSafeRelayCell::weighed(&cx, RawFifo, bp, |v: &Vec<u8>| v.len() as u64).unwrap();
    let refused = relay.send_when_room(vec![1, 2, 3]).await;
    assert!(matches!(refused, Err(SendRefused::TooLarge { bytes: 3, limit: 2, .. })));
    assert_eq!(relay.stats().accepted, 0);
}

#[tokio::test]
async fn send_when_room_dropped_while_waiting_sent_nothing() {
    let cx = AsyncContext::new();
    let relay = ThreadSafeRelayCell::new(&cx, KeepLatest, blocking(1, 0)).unwrap();
    assert_eq!(relay.send('a'), Ok(Sent::Accepted));
    {
        let mut fut = pin!(relay.send_when_room('b'));
        assert!(poll_once(fut.as_mut()).is_pending());
        assert!(poll_once(fut.as_mut()).is_pending());
    }
    // Dropped: the relay drained to empty takes nothing from it.
    assert_eq!(relay.pop().map(|d| d.value), Some('a'));
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let s = relay.stats();
    assert_eq!((s.depth, s.accepted, s.blocked), (0, 1, 1));
}

#[tokio::test]
async fn send_when_room_on_a_disposed_relay_does_not_wait() {
    let cx = AsyncContext::new();
    let relay = ThreadSafeRelayCell::new(&cx, KeepLatest, blocking(1, 0)).unwrap();
    assert_eq!(relay.send(1u8), Ok(Sent::Accepted));
    relay.dispose();
    assert_eq!(relay.send_when_room(2).await, Err(SendRefused::Blocked(2)));
}
