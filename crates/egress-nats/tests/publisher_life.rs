//! A publisher's life without a server: what `spawn` accepts, how a
//! publisher whose connect options panic stops and says why (the cell
//! still alive: not "disposed"), that dropping one reads stopped at once,
//! and what it shows. The address is a loopback port
//! nothing listens on, so the publisher connects (and retries) for ever
//! until it is stopped.

mod common;

use std::sync::Arc;

use egress_nats::{ConnectionState, Publisher, PublisherConfig, PublisherError, SpawnError};
use egress_reactive::AsyncContext;

use common::cell;

/// A loopback address with nothing listening: a port bound, then let go.
fn nowhere() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = listener.local_addr().expect("bound").port();
    drop(listener);
    format!("nats://127.0.0.1:{port}")
}

fn config(producer: &str) -> PublisherConfig {
    PublisherConfig::new(producer, "stream", "egress.subject")
}

#[tokio::test]
async fn a_producer_id_is_printable_ascii_spaces_included() {
    let cx = AsyncContext::new();
    let url = nowhere();
    let spawned = Publisher::spawn(cell(&cx, 4), &url, config("two words")).map(|_| ());
    assert_eq!(spawned, Ok(()), "a space is printable");
    for bad in ["a\tb", "new\nline", "é", ""] {
        let refused = Publisher::spawn(cell(&cx, 4), &url, config(bad)).map(|_| ());
        assert_eq!(refused, Err(SpawnError::InvalidProducer(bad.to_owned())), "{bad:?}");
    }
}

/// Dropped, a publisher reads stopped at once: before its task runs again
/// (a runtime of one thread, and no await between the drop and the read).
#[tokio::test(flavor = "current_thread")]
async fn a_dropped_publisher_reads_stopped_at_once() {
    let cx = AsyncContext::new();
    let c = cell(&cx, 4);
    let p = Publisher::spawn(c.clone(), &nowhere(), config("dropped")).expect("valid");
    let state = p.state().clone();
    // Its task runs, connecting to nothing.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(matches!(state.get_untracked(), ConnectionState::Connecting { .. }), "{:?}", state.get_untracked());
    drop(p);
    assert_eq!(state.get_untracked(), ConnectionState::Stopped { error: None });
}

#[tokio::test]
async fn a_publisher_whose_connect_options_panic_stops_and_says_so() {
    let cx = AsyncContext::new();
    let c = cell(&cx, 4);
    let config = PublisherConfig { options: Some(Arc::new(|| panic!("no credentials"))), ..config("panics") };
    let mut p = Publisher::spawn(c.clone(), &nowhere(), config).expect("valid");
    let stopped = tokio::time::timeout(egress_testkit::limit(), p.stopped()).await.expect("it stops");
    assert_eq!(stopped, Some(PublisherError::Panicked("no credentials".into())));
    assert!(!c.is_disposed());
}

#[test]
fn a_publisher_shows_its_stats() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let _in = rt.enter();
    let cx = AsyncContext::new();
    let p = Publisher::spawn(cell(&cx, 4), &nowhere(), config("shown")).expect("valid");
    let shown = format!("{p:?}");
    assert!(shown.starts_with("Publisher { stats: PublisherStats {"), "{shown}");
}

#[test]
fn a_config_shows_its_fields_and_whether_its_options_are_custom() {
    let plain = format!("{:?}", config("shown"));
    assert!(
        plain.starts_with("PublisherConfig { producer: \"shown\", stream: \"stream\", subject: \"egress.subject\""),
        "{plain}"
    );
    assert!(plain.ends_with("max_ack_inflight: 16384, options: None }"), "{plain}");
    let custom = PublisherConfig { options: Some(Arc::new(async_nats::ConnectOptions::new)), ..config("shown") };
    assert!(format!("{custom:?}").ends_with("options: Some(\"custom\") }"), "{custom:?}");
}
