//! The subscriber's per-producer bookkeeping against a real nats-server: a
//! gap shorter than `gap_timeout` is waited for, not skipped; a stream
//! holding a record (queued, or above a gap) is never evicted as idle, nor
//! is one that went idle and got records again; a new stream read first
//! above 0, with no hole in the broker's stream, is not taken as having
//! lost what lies below; takeover claims are counted, not delivered.
//!
//! The server comes from `EGRESS_NATS_URL`, as in `nats.rs`.

mod common;

use std::time::Duration;

use egress_nats::{Stamp, Subscriber, SubscriberConfig};

use common::{connect, fresh, payload, raw, stamp, stream, took, url};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_is_waited_for_and_a_stream_holding_records_is_never_evicted() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "gapwait", Duration::from_secs(120)).await;
    let lane_idle = Duration::from_millis(200);
    let config =
        SubscriberConfig { lane_idle, gap_timeout: Duration::from_secs(30), ..SubscriberConfig::new(fresh("gapwait")) };
    let mut sub = Subscriber::new(&js, &name, config).await.expect("consumer");
    raw(&js, &subject, Some(&stamp("w", 1, 0)), payload(0)).await;
    assert_eq!(took(&mut sub).await, ("w".into(), 0, None));
    // "w" is idle now. Record 2 comes before 1: above a gap, it is held,
    // and the stream is busy again.
    raw(&js, &subject, Some(&stamp("w", 1, 2)), payload(2)).await;
    let early = tokio::time::timeout(Duration::from_millis(500), sub.next()).await.map(|d| d.map(|d| d.sequence()));
    assert!(early.is_err(), "record 2 waited for 1, not handed out past the gap: {early:?}");
    // Past the idle time, with record 2 still held above the gap: not
    // evicted (evicting would lose record 2).
    tokio::time::sleep(lane_idle * 2).await;
    raw(&js, &subject, Some(&stamp("w", 1, 1)), payload(1)).await;
    raw(&js, &subject, Some(&stamp("w", 1, 3)), payload(3)).await;
    // 1 fills the gap: 1 and 2 are queued together. Take 1 and leave 2
    // queued past the idle time: still not evicted.
    assert_eq!(took(&mut sub).await, ("w".into(), 1, None));
    tokio::time::sleep(lane_idle * 2).await;
    assert_eq!(took(&mut sub).await, ("w".into(), 2, None));
    assert_eq!(took(&mut sub).await, ("w".into(), 3, None));
    let stats = sub.stats();
    assert_eq!((stats.evicted, stats.skipped, stats.duplicates), (0, 0, 0), "{stats:?}");
    assert_eq!(sub.lanes(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_read_first_above_zero_without_a_hole_lost_nothing_and_claims_are_counted() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "abovezero", Duration::from_secs(120)).await;
    // A producer whose earlier records this stream never held (it began
    // here at 3), and a takeover's claim before its next record.
    raw(&js, &subject, Some(&stamp("z", 1, 3)), payload(3)).await;
    let claim = Stamp { claim: true, ..stamp("z", 1, 4) };
    raw(&js, &subject, Some(&claim), bytes::Bytes::new()).await;
    raw(&js, &subject, Some(&stamp("z", 1, 4)), payload(4)).await;
    let mut sub = Subscriber::new(&js, &name, SubscriberConfig::new(fresh("abovezero"))).await.expect("consumer");
    let first = tokio::time::timeout(Duration::from_secs(10), sub.next()).await.expect("a delivery").expect("read");
    assert_eq!(
        (first.sequence(), first.skipped(), first.stream_sequence()),
        (3, None, 1),
        "nothing below 3 is said lost"
    );
    let shown = format!("{first:?}");
    assert!(shown.starts_with("Delivery { stamp: Some(Stamp { producer: \"z\""), "{shown}");
    first.ack().await.expect("acked");
    let second = tokio::time::timeout(Duration::from_secs(10), sub.next()).await.expect("a delivery").expect("read");
    // The claim took stream sequence 2.
    assert_eq!((second.sequence(), second.stream_sequence()), (4, 3));
    second.ack().await.expect("acked");
    let stats = sub.stats();
    assert_eq!((stats.skipped, stats.discarded, stats.claims, stats.delivered), (0, 0, 1, 2), "{stats:?}");
    let shown = format!("{sub:?}");
    assert!(shown.starts_with("Subscriber { stats: SubscriberStats {"), "{shown}");
    assert!(shown.contains("lanes: 1"), "{shown}");
}
