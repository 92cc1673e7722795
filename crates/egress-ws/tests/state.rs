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
    assert_eq!(error, egress_ws::ConnectError::Refused, "nobody listens");
    assert_eq!(error.to_string(), "connection refused");

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
    // A generation is taken once a connection is up: a live receiver.
    let receiver = egress_ws::Receiver::bind("127.0.0.1:0", egress_ws::ReceiverConfig::default()).await.unwrap();
    let sender = Sender::spawn(cell, format!("ws://{}", receiver.local_addr()), sender_config(44)).unwrap();
    let mut states = sender.watch_state();
    let stopped = next_state(&mut states, |s| !matches!(s, ConnectionState::Stopped { .. })).await;
    let ConnectionState::Stopped { error: Some(why) } = stopped else { panic!("{stopped:?}") };
    assert!(matches!(&why, egress_ws::ConnectError::Fatal(d) if d.contains("exhausted")), "{why:?}");
    assert_eq!(Some(why), sender.failure());
}

/// A server that answers every WebSocket upgrade with `status` and counts
/// the requests it saw.
async fn http_refuser(status: &'static str) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicU32>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(std::sync::atomic::AtomicU32::new(0));
    tokio::spawn({
        let seen = seen.clone();
        async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let answer = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                let _ = tcp.write_all(answer.as_bytes()).await;
            }
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_or_403_stops_the_sender_with_a_typed_error_unless_told_to_retry() {
    use egress_ws::ConnectError;
    for (status, expected) in
        [("401 Unauthorized", ConnectError::Unauthorized), ("403 Forbidden", ConnectError::Forbidden)]
    {
        let (addr, seen) = http_refuser(status).await;
        let cx = AsyncContext::new();
        let cell: AsyncEgressCell<bytes::Bytes> = AsyncEgressCell::new(&cx, policy());
        cell.enqueue(payload(0));
        let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), sender_config(45)).unwrap();
        let mut states = sender.watch_state();
        let stopped = next_state(&mut states, |s| matches!(s, ConnectionState::Connecting { .. })).await;
        assert_eq!(stopped, ConnectionState::Stopped { error: Some(expected.clone()) }, "{status}: stops at once");
        assert_eq!(sender.failure(), Some(expected.clone()));
        assert!(stopped.to_string().starts_with("stopped: "), "{stopped}");
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 1, "{status}: asked once, not again");
        assert_eq!(cell.generation().get_untracked(), Generation(0), "no connection, no generation taken");
        assert_eq!(cell.pending_len().get_untracked(), 1, "nothing lost");
        sender.shutdown().await;
    }
    // Told to retry: it does, with the typed reason each time.
    let (addr, seen) = http_refuser("401 Unauthorized").await;
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<bytes::Bytes> = AsyncEgressCell::new(&cx, policy());
    let config = egress_ws::SenderConfig { retry_unauthorized: true, ..sender_config(46) };
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), config).unwrap();
    let mut states = sender.watch_state();
    for _ in 0..2 {
        let state = next_state(&mut states, |s| matches!(s, ConnectionState::Connecting { .. })).await;
        assert_eq!(state.error(), Some(&ConnectError::Unauthorized), "{state:?}");
        assert!(!state.is_online());
    }
    assert!(seen.load(std::sync::atomic::Ordering::SeqCst) >= 2);
    sender.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_attempts_take_no_generation_and_max_attempts_gives_up_with_the_last_reason() {
    use egress_ws::ConnectError;
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<bytes::Bytes> = AsyncEgressCell::new(&cx, policy());
    cell.enqueue(payload(0));
    let config = egress_ws::SenderConfig { max_attempts: Some(4), ..sender_config(47) };
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", free_port()), config).unwrap();
    let mut states = sender.watch_state();
    let stopped = next_state(&mut states, |s| !matches!(s, ConnectionState::Stopped { .. })).await;
    let gave_up = ConnectError::GaveUp { attempts: 4, last: Box::new(ConnectError::Refused) };
    assert_eq!(stopped, ConnectionState::Stopped { error: Some(gave_up.clone()) });
    assert_eq!(stopped.to_string(), "stopped: gave up after 4 attempts: connection refused");
    assert_eq!((sender.stats().failed_attempts, sender.stats().reconnects), (4, 3), "no reconnect after the last");
    assert_eq!(cell.generation().get_untracked(), Generation(0), "four refused attempts, no generation");
    assert_eq!(cell.pending_len().get_untracked(), 1, "nothing lost");
    sender.shutdown().await;
}

#[test]
fn a_connection_state_reads_in_a_few_words() {
    use egress_ws::ConnectError;
    let later = std::time::Instant::now() + Duration::from_millis(2_500);
    let offline = ConnectionState::Reconnecting { retry_at: later, failures: 2, error: ConnectError::Refused };
    assert_eq!(offline.to_string(), "offline: connection refused; retrying in 3 s");
    assert_eq!(offline.error(), Some(&ConnectError::Refused));
    assert!(!offline.is_online());
    let online = ConnectionState::Connected { generation: Generation(3) };
    assert!(online.is_online() && online.error().is_none());
    assert_eq!(online.to_string(), "online");
    assert_eq!(ConnectionState::Connecting { attempt: 1 }.to_string(), "connecting");
    assert_eq!(ConnectionState::Connecting { attempt: 2 }.to_string(), "connecting (attempt 2)");
    assert_eq!(ConnectionState::Stopped { error: None }.to_string(), "stopped");
    let tls = ConnectError::Tls("invalid peer certificate: UnknownIssuer (wss://example.org/x)".into());
    assert_eq!(tls.to_string(), "TLS failed");
    assert!(tls.detail().is_some_and(|d| d.contains("UnknownIssuer")));
    assert!(ConnectError::Unauthorized.is_auth() && ConnectError::Forbidden.is_auth());
    assert!(!ConnectError::Http(404).is_auth());
    assert_eq!(ConnectError::Http(503).to_string(), "HTTP 503");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_whose_context_is_dropped_stops_and_says_why() {
    // The application keeps the cell and the sender but drops the context:
    // the cell's nodes are disposed under the sender.
    let (cell, sender) = {
        let cx = AsyncContext::new();
        let cell: AsyncEgressCell<bytes::Bytes> = AsyncEgressCell::new(&cx, policy());
        cell.enqueue(payload(0));
        let sender = Sender::spawn(cell.clone(), format!("ws://{}", free_port()), sender_config(48)).unwrap();
        (cell, sender)
    };
    let deadline = tokio::time::Instant::now() + limit();
    while sender.failure().is_none() {
        assert!(tokio::time::Instant::now() < deadline, "the sender goes on over a disposed cell");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(sender.failure(), Some(egress_ws::ConnectError::Fatal("the cell was disposed".into())));
    assert!(cell.is_disposed());
    sender.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_the_applications_connect_stops_the_sender_with_its_message() {
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<bytes::Bytes> = AsyncEgressCell::new(&cx, policy());
    cell.enqueue(payload(0));
    let connect: egress_ws::Connect = Arc::new(|_host, _port| panic!("a bug in connect"));
    let config = egress_ws::SenderConfig { connect: Some(connect), ..sender_config(49) };
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", free_port()), config).unwrap();
    let mut states = sender.watch_state();
    let stopped = next_state(&mut states, |s| !matches!(s, ConnectionState::Stopped { .. })).await;
    let why = egress_ws::ConnectError::Fatal("the sender panicked: a bug in connect".into());
    assert_eq!(stopped, ConnectionState::Stopped { error: Some(why.clone()) });
    assert_eq!(sender.failure(), Some(why));
    assert!(!cell.is_disposed());
    assert_eq!(cell.pending_len().get_untracked(), 1, "nothing lost");
    sender.shutdown().await;
}
