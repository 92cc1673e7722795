//! What the sender and the receiver log (through `tracing`): a connection,
//! a reconnect and a shutdown at info, each inside the sender's span; an
//! admitted producer at info inside the receiver's connection span; frames
//! at trace only. Alone in its binary: `tracing` caches per call site
//! whether anyone listens, and a test on another thread without a
//! subscriber could make a site here silent.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};

use common::{drained, payload, policy, receive_in_order, sender_config};
use egress_reactive::{AsyncContext, AsyncEgressCell};
use egress_ws::{ConnectionState, Receiver, ReceiverConfig, Sender};
use futures_util::StreamExt;

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn connections_reconnects_and_shutdowns_are_logged_at_info_in_their_spans() {
    // One thread: every task logs through this subscriber.
    let log = Log::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let log = log.clone();
            move || log.clone()
        })
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    // Nobody listens at first: an attempt fails, and the sender reconnects.
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}"), sender_config(51)).unwrap();
    let mut states = sender.watch_state();
    while !matches!(states.next().await, Some(ConnectionState::Reconnecting { .. })) {}
    let mut receiver = Receiver::bind(addr, ReceiverConfig::default()).await.unwrap();
    cell.enqueue_all((0..5).map(payload));
    receive_in_order(&mut receiver, 0, 5).await;
    drained(&cell, 5).await;
    sender.shutdown().await;

    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let line = |event: &str| text.lines().find(|l| l.contains(event)).unwrap_or_default().to_owned();
    for event in ["egress sender: reconnecting", "egress sender: connected", "egress sender: shut down"] {
        let line = line(event);
        assert!(line.contains(" INFO "), "{event:?} at info in:\n{text}");
        assert!(line.contains("egress_sender{producer=producer-1"), "{event:?} in the sender's span:\n{text}");
    }
    let admitted = line("egress receiver: a producer admitted");
    assert!(admitted.contains(" INFO ") && admitted.contains("egress_receiver{peer=127.0.0.1:"), "{text}");
    assert!(admitted.contains("producer=producer-1"), "{admitted}");
    assert!(!text.contains("frame"), "frames are logged at trace only:\n{text}");
}
