//! How a publisher's epochs end and begin again, against a real
//! nats-server behind a proxy that drops connections on demand: a dropped
//! connection ends an idle epoch at once; losses without progress back off
//! more each time, with the retry time ahead; a stream deleted under a
//! running publisher is waited for (reading its last message fails, said
//! as such), and a record whose publish failed for want of a stream is
//! stored as itself once the stream is back, not given up as unstorable; a
//! subject at the last owner cannot be taken over, and one ahead of the
//! cell stops the publisher.
//!
//! The server comes from `EGRESS_NATS_URL`, as in `nats.rs`.

mod common;

use std::time::{Duration, Instant};

use egress_nats::{ConnectionState, LinkError, Publisher, PublisherConfig, PublisherError, Stamp};
use egress_reactive::AsyncContext;
use egress_ws::ChaosProxy;

use common::{acked, addr, cell, config, connect, contents, make_stream, next_state, payload, raw, stream, url};

fn online(s: &ConnectionState) -> bool {
    s.is_online()
}

fn offline(s: &ConnectionState) -> bool {
    !s.is_online()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_ends_an_idle_epoch_and_losses_without_progress_back_off_more() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "dropped", Duration::from_secs(120)).await;
    let proxy = ChaosProxy::start(addr(&url), None).await.expect("the proxy starts");
    let cx = AsyncContext::new();
    let c = cell(&cx, 8);
    let config = PublisherConfig {
        backoff_base: Duration::from_millis(300),
        backoff_max: Duration::from_millis(600),
        ..config("dropped", &name, &subject)
    };
    let p = Publisher::spawn(c.clone(), &format!("nats://{}", proxy.local_addr()), config).expect("valid");
    let mut states = p.watch_state();
    // Nothing is enqueued: no epoch can make progress.
    for expected_failures in 1..=2 {
        next_state(&mut states, offline).await;
        let dropped_at = Instant::now();
        proxy.kill_all();
        let ConnectionState::Reconnecting { retry_at, failures, error } = next_state(&mut states, online).await else {
            panic!("reconnecting after the drop");
        };
        assert_eq!(failures, expected_failures, "losses in a row without progress");
        assert!(retry_at > dropped_at, "the next attempt lies ahead of the drop");
        assert!(matches!(&error, LinkError::Lost(why) if why == "disconnected"), "{error:?}");
    }
    assert!(p.stats().lost >= 2, "{:?}", p.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_deleted_under_a_publisher_is_waited_for_and_its_record_stored_as_itself() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "deleted", Duration::from_secs(120)).await;
    let cx = AsyncContext::new();
    let c = cell(&cx, 8);
    let p = Publisher::spawn(c.clone(), &url, config("deleted", &name, &subject)).expect("valid");
    c.enqueue(payload(0));
    acked(&c, 0).await;
    let mut states = p.watch_state();
    js.delete_stream(&name).await.expect("deleted");
    // Its publish fails for want of a stream: retried, not a dead letter.
    c.enqueue(payload(1));
    let waiting = next_state(&mut states, |s| {
        !matches!(s, ConnectionState::Reconnecting { error: LinkError::Lost(why), .. } if why.starts_with("last message"))
    })
    .await;
    assert!(matches!(waiting, ConnectionState::Reconnecting { .. }), "{waiting:?}");
    // Back, empty: record 1 is stored as itself.
    make_stream(&js, &name, &subject, Duration::from_secs(120)).await;
    acked(&c, 1).await;
    let stored = contents(&js, &name).await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    let (stamp, body) = &stored[0];
    let stamp = stamp.as_ref().expect("an egress record");
    assert_eq!((stamp.sequence, stamp.dead, body), (1, None, &payload(1)));
    assert_eq!(p.stats().refused, 0, "{:?}", p.stats());
}

/// The subject's last message names the highest owner there can be
/// (2^32 - 1): no owner above it exists, so a publisher taking the subject
/// over stops, exhausted, rather than wrap around.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_at_the_last_owner_cannot_be_taken_over() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "lastowner", Duration::from_secs(120)).await;
    let top =
        Stamp { producer: "x".into(), incarnation: 1, sequence: 0, generation: u64::MAX, dead: None, claim: false };
    assert_eq!(egress_nats::owner_of(top.generation), (1 << 32) - 1);
    raw(&js, &subject, Some(&top), payload(0)).await;
    let cx = AsyncContext::new();
    let mut p = Publisher::spawn(cell(&cx, 8), &url, config("late", &name, &subject)).expect("valid");
    let stopped = tokio::time::timeout(egress_testkit::limit(), p.stopped()).await.expect("it stops");
    assert_eq!(stopped, Some(PublisherError::Exhausted));
}

/// The subject holds a record of this cell's own producer and incarnation
/// at a sequence the cell never sent (another writer with its identity):
/// the publisher stops and says so, and acknowledges nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_ahead_of_the_cell_stops_the_publisher() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "ahead", Duration::from_secs(120)).await;
    let cx = AsyncContext::new();
    let c = cell(&cx, 8);
    let mine = Stamp {
        producer: "ahead".into(),
        incarnation: c.incarnation().get(),
        sequence: 5,
        generation: 1 << 32,
        dead: None,
        claim: false,
    };
    raw(&js, &subject, Some(&mine), payload(5)).await;
    let mut p = Publisher::spawn(c.clone(), &url, config("ahead", &name, &subject)).expect("valid");
    let stopped = tokio::time::timeout(egress_testkit::limit(), p.stopped()).await.expect("it stops");
    assert_eq!(stopped, Some(PublisherError::AheadOfCell { held: 5, sent: None }));
    assert_eq!(c.acked_through().get_untracked(), None);
}
