//! The sender's connection state as signals and as a stream: connecting,
//! connected, reconnecting (when, after how many failures, why), stopped.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};

use std::time::Duration;

use common::{drained, limit, payload, policy, receive_in_order, sender_config};
use egress_core::Generation;
use egress_reactive::{AsyncContext, AsyncEgressCell};
use egress_ws::{ConnectionState, Receiver, ReceiverConfig, Sender, SpawnError};
use futures_util::StreamExt;

/// The next state from `states` that is not `skip`, within the limit.
async fn next_state(
    states: &mut (impl futures_util::Stream<Item = ConnectionState> + Unpin),
    skip: impl Fn(&ConnectionState) -> bool,
) -> ConnectionState {
    loop {
        let state = tokio::time::timeout(limit(), states.next()).await.expect("a state in time").expect("the stream");
        if !skip(&state) {
            return state;
        }
    }
}

/// A loopback port nobody listens on (bound, then let go).
fn free_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn the_connection_state_follows_connects_failures_and_shutdown() {
    let addr = free_port();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), sender_config(41)).unwrap();
    // An effect over the computed sees the same states as the stream.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let _effect = cx.effect({
        let (state, seen) = (sender.state().clone(), seen.clone());
        move || seen.lock().unwrap().push(state.get())
    });
    let mut states = sender.watch_state();
    assert_eq!(next_state(&mut states, |_| false).await, ConnectionState::Connecting { attempt: 1 });

    // Nobody listens: the attempt fails, and the state says when the next
    // one starts, after how many failures, and why.
    let before = std::time::Instant::now();
    let ConnectionState::Reconnecting { retry_at, failures, error } =
        next_state(&mut states, |s| matches!(s, ConnectionState::Connecting { .. })).await
    else {
        panic!("a failed attempt is followed by reconnecting")
    };
    assert!(failures >= 1);
    assert!(retry_at > before, "the next attempt is in the future of the failure");
    assert!(retry_at <= before + Duration::from_millis(50) + limit(), "within the backoff");
    assert!(!error.is_empty());

    // A receiver comes up where the sender looks: connected.
    let mut receiver = Receiver::bind(addr, ReceiverConfig::default()).await.unwrap();
    let ConnectionState::Connected { generation } =
        next_state(&mut states, |s| !matches!(s, ConnectionState::Connected { .. })).await
    else {
        unreachable!()
    };
    assert_eq!(generation, cell.generation().get_untracked(), "the state names the connection's generation");
    cell.enqueue_all((0..10).map(payload));
    receive_in_order(&mut receiver, 0, 10).await;
    drained(&cell, 10).await;

    // The receiver goes away: reconnecting again, with its reason.
    drop(receiver);
    let again = next_state(&mut states, |s| !matches!(s, ConnectionState::Reconnecting { .. })).await;
    assert!(matches!(again, ConnectionState::Reconnecting { .. }), "{again:?}");

    sender.shutdown().await;
    assert_eq!(
        next_state(&mut states, |s| !matches!(s, ConnectionState::Stopped { .. })).await,
        ConnectionState::Stopped { error: None }
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.first(), Some(&ConnectionState::Connecting { attempt: 1 }));
    assert_eq!(seen.last(), Some(&ConnectionState::Stopped { error: None }));
    assert!(seen.iter().any(|s| matches!(s, ConnectionState::Connected { .. })), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_sender_says_it_stopped_and_a_disposed_cell_is_refused() {
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", free_port()), sender_config(42)).unwrap();
    let state = sender.state().clone();
    drop(sender);
    assert_eq!(state.get(), ConnectionState::Stopped { error: None });
    cell.dispose();
    assert!(state.try_get().is_err(), "the state is the cell's: disposed with it");
    let refused = Sender::spawn(cell, format!("ws://{}", free_port()), sender_config(43));
    assert_eq!(refused.err(), Some(SpawnError::CellDisposed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_that_runs_out_of_generations_stops_with_its_reason() {
    let cx = AsyncContext::new();
    let options = egress_reactive::CellOptions::new().generation(Generation(u64::MAX));
    let cell: AsyncEgressCell<bytes::Bytes> = AsyncEgressCell::with_options(&cx, policy(), options);
    let sender = Sender::spawn(cell, format!("ws://{}", free_port()), sender_config(44)).unwrap();
    let mut states = sender.watch_state();
    let stopped = next_state(&mut states, |s| !matches!(s, ConnectionState::Stopped { .. })).await;
    let ConnectionState::Stopped { error: Some(why) } = stopped else { panic!("{stopped:?}") };
    assert_eq!(Some(why.to_string()), sender.failure());
}
