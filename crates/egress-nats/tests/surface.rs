//! What an application reads and hands over, against a real nats-server:
//! the publisher's connection state as a computed and a stream, typed
//! payloads through a codec (one that refuses a value: a dead letter in its
//! place), and the subscriber's per-incarnation state evicted when idle,
//! with and without the application's durable record.
//!
//! The server comes from `EGRESS_NATS_URL`, as in `nats.rs`.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use egress_core::{Incarnation, Policy, Resume};
use egress_nats::{
    ConnectionState, Content, LinkError, Publisher, PublisherError, SubscribeError, Subscriber, SubscriberConfig,
};
use egress_reactive::{AsyncContext, AsyncEgressCell};
use futures_util::StreamExt as _;

use common::{acked, cell, config, connect, contents, fresh, next_state, payload, raw, stamp, stream, took, url};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publishers_connection_is_a_computed_and_a_stream_from_connecting_to_stopped() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "state", Duration::from_secs(120)).await;
    let cx = AsyncContext::new();
    let c = cell(&cx, 8);
    let p = Publisher::spawn(c.clone(), &url, config("s", &name, &subject)).expect("valid");
    let mut states = p.watch_state();
    assert_eq!(next_state(&mut states, |_| false).await, ConnectionState::Connecting { attempt: 1 });
    let ConnectionState::Connected { generation } =
        next_state(&mut states, |s| matches!(s, ConnectionState::Connecting { .. })).await
    else {
        panic!("connected after connecting");
    };
    assert_eq!(p.state().get_untracked(), ConnectionState::Connected { generation });
    assert!(p.state().get_untracked().is_online());
    c.enqueue(payload(0));
    acked(&c, 0).await;

    // A lost epoch: reconnecting with why, then connected under a newer
    // generation.
    p.kill_connection();
    let lost = next_state(&mut states, |s| s.is_online()).await;
    assert!(
        matches!(&lost, ConnectionState::Reconnecting { error: LinkError::Lost(why), .. } if why == "killed"),
        "{lost:?}"
    );
    let ConnectionState::Connected { generation: again } = next_state(&mut states, |s| !s.is_online()).await else {
        unreachable!("the skip passes over everything else")
    };
    assert!(again > generation, "{again:?} after {generation:?}");

    p.shutdown().await;
    assert_eq!(next_state(&mut states, |s| s.is_online()).await, ConnectionState::Stopped { error: None });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_publisher_reads_stopped_with_the_fence_and_a_dropped_one_stopped() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "fencestate", Duration::from_secs(120)).await;
    let cx = AsyncContext::new();
    let first = cell(&cx, 8);
    let a = Publisher::spawn(first.clone(), &url, config("f", &name, &subject)).expect("valid");
    first.enqueue(payload(0));
    acked(&first, 0).await;
    let second = cell(&cx, 8);
    let b = Publisher::spawn(second.clone(), &url, config("f", &name, &subject)).expect("valid");
    second.enqueue(payload(1));
    acked(&second, 0).await;
    let mut states = a.watch_state();
    first.enqueue(payload(2));
    let stopped = next_state(&mut states, |s| !matches!(s, ConnectionState::Stopped { .. })).await;
    let ConnectionState::Stopped { error: Some(LinkError::Fatal(PublisherError::Fenced { owner: 1, by })) } = stopped
    else {
        panic!("stopped by the fence: {stopped:?}");
    };
    assert_eq!(egress_nats::owner_of(by), 2);
    assert!(stopped.to_string().starts_with("stopped: fenced"), "{stopped}");

    // Dropped while running: stopped, without an error.
    let mut states = b.watch_state();
    drop(b);
    assert_eq!(
        next_state(&mut states, |s| !matches!(s, ConnectionState::Stopped { .. })).await,
        ConnectionState::Stopped { error: None }
    );
}

/// A chat line, and a codec that refuses a line it was told to refuse (as
/// a serializer refuses a value it cannot write).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Line {
    room: String,
    text: String,
}

struct Lines;

impl egress_nats::Encode<Line> for Lines {
    fn encode(&self, line: &Line) -> Result<Bytes, egress_codec::CodecError> {
        if line.text == "unwritable" {
            return Err("this line has no encoding".into());
        }
        assert_ne!(line.text, "boom", "the codec's bug: it panics");
        egress_codec::Encode::encode(&egress_codec::Json, line)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_lines_go_through_the_codec_and_one_it_refuses_or_panics_on_is_a_tombstone_in_its_place() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "typed", Duration::from_secs(120)).await;
    let cx = AsyncContext::new();
    let lines = AsyncEgressCell::<Line>::new(&cx, Policy::builder().inflight_limit(8).build().expect("valid"));
    let p = Publisher::spawn_typed(lines.clone(), Lines, &url, config("t", &name, &subject)).expect("valid");
    let line = |text: &str| Line { room: "tea".into(), text: text.into() };
    for text in ["hello", "unwritable", "still here", "boom", "last"] {
        lines.enqueue(line(text));
    }
    acked(&lines, 4).await;
    assert_eq!(p.failure(), None, "a codec that panics is a refusal, not the publisher's end");
    let stats = p.shutdown().await;
    assert_eq!(stats.refused, 2);
    assert!(stats.resyncs >= 1, "the unstorable record ends its epoch: {stats:?}");
    let stored = contents(&js, &name).await;
    let seen: Vec<(u64, bool)> =
        stored.iter().map(|(s, _)| s.as_ref().map(|s| (s.sequence, s.dead.is_some())).expect("egress")).collect();
    assert_eq!(
        seen,
        [(0, false), (1, true), (2, false), (3, true), (4, false)],
        "each tombstone in its record's place"
    );

    let mut sub = Subscriber::new(&js, &name, SubscriberConfig::new(fresh("typed"))).await.expect("consumer");
    let mut got = Vec::new();
    for _ in 0..5 {
        let d = sub.next().await.expect("a delivery");
        got.push(match d.content() {
            Content::Message(bytes) => Some(serde_json::from_slice::<Line>(&bytes).expect("a line")),
            Content::Skipped(_) => None,
        });
        d.ack().await.expect("acked");
    }
    assert_eq!(got, [Some(line("hello")), None, Some(line("still here")), None, Some(line("last"))]);
}

/// The application's durable record of where each producer stream
/// resumes, kept as the application commits (a map here; egress-store's
/// `ReceivedLog` in an application), and able to fail on demand.
#[derive(Debug, Default)]
struct Record {
    next: Mutex<HashMap<(String, u128), u64>>,
    failing: std::sync::atomic::AtomicBool,
}

impl Resume for Record {
    fn resume(&self, producer: &str, incarnation: Incarnation) -> Result<Option<u64>, String> {
        if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err("the store is down".into());
        }
        Ok(self.next.lock().expect("unpoisoned").get(&(producer.to_owned(), incarnation.get())).copied())
    }
}

/// Takes the next delivery, records it in `record` (if any) and
/// acknowledges it; returns its (incarnation, sequence).
async fn take(sub: &mut Subscriber, record: Option<&Record>) -> (u128, u64) {
    let d = tokio::time::timeout(Duration::from_secs(10), sub.next()).await.expect("a delivery comes").expect("read");
    let (incarnation, sequence) = (d.stamp().incarnation, d.sequence());
    if let Some(record) = record {
        let p = d.position();
        record.next.lock().expect("unpoisoned").insert((p.producer, p.incarnation), p.next);
    }
    d.ack().await.expect("acked");
    (incarnation, sequence)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_incarnations_are_evicted_and_the_durable_record_still_drops_a_late_copy() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "evict", Duration::from_secs(120)).await;
    let record = Arc::new(Record::default());
    let lane_idle = Duration::from_millis(300);
    let config = SubscriberConfig {
        lane_idle,
        resume: Some(record.clone() as Arc<dyn Resume>),
        ..SubscriberConfig::new(fresh("evict"))
    };
    let mut sub = Subscriber::new(&js, &name, config).await.expect("consumer");
    // Twenty restarts of one producer, each an incarnation of two records.
    for incarnation in 1..=20_u128 {
        for sequence in 0..2 {
            raw(&js, &subject, Some(&stamp("p", incarnation, sequence)), payload(sequence)).await;
        }
    }
    for incarnation in 1..=20_u128 {
        for sequence in 0..2 {
            assert_eq!(take(&mut sub, Some(&record)).await, (incarnation, sequence));
        }
    }
    assert_eq!(sub.lanes(), 20, "held while recent");
    // Past the idle time, the next record evicts every idle one.
    tokio::time::sleep(lane_idle + Duration::from_millis(50)).await;
    raw(&js, &subject, Some(&stamp("p", 21, 0)), payload(0)).await;
    assert_eq!(take(&mut sub, Some(&record)).await, (21, 0));
    assert_eq!(sub.stats().evicted, 20);
    assert_eq!(sub.lanes(), 1);

    // A late copy of an evicted incarnation's record (a restarted process
    // of incarnation 3 replaying what it never saw acknowledged) is
    // dropped: the durable record says where incarnation 3 goes on. Its
    // next record is delivered.
    raw(&js, &subject, Some(&stamp("p", 3, 1)), payload(1)).await;
    raw(&js, &subject, Some(&stamp("p", 3, 2)), payload(2)).await;
    assert_eq!(take(&mut sub, Some(&record)).await, (3, 2));
    assert_eq!(sub.stats().duplicates, 1);

    // The record failing: the message that asked is kept, and the next
    // call asks again.
    record.failing.store(true, std::sync::atomic::Ordering::SeqCst);
    raw(&js, &subject, Some(&stamp("p", 4, 2)), payload(2)).await;
    let refused = tokio::time::timeout(Duration::from_secs(10), sub.next()).await.expect("an answer").map(|_| ());
    assert!(matches!(refused, Err(SubscribeError::Resume(ref why)) if why == "the store is down"), "{refused:?}");
    record.failing.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(take(&mut sub, Some(&record)).await, (4, 2), "incarnation 4 resumes at 2, as recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_with_a_delivery_given_back_is_not_evicted_and_without_a_record_a_late_copy_comes_again() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "noevict", Duration::from_secs(120)).await;
    let lane_idle = Duration::from_millis(300);
    let config = SubscriberConfig { lane_idle, ..SubscriberConfig::new(fresh("noevict")) };
    let mut sub = Subscriber::new(&js, &name, config).await.expect("consumer");
    for (incarnation, sequence) in [(1, 0), (1, 1), (2, 0)] {
        raw(&js, &subject, Some(&stamp("q", incarnation, sequence)), payload(sequence)).await;
    }
    assert_eq!(take(&mut sub, None).await, (1, 0));
    assert_eq!(take(&mut sub, None).await, (1, 1));
    // Incarnation 2's delivery is given back (dropped without an ack).
    drop(sub.next().await.expect("a delivery"));
    tokio::time::sleep(lane_idle + Duration::from_millis(50)).await;
    raw(&js, &subject, Some(&stamp("q", 5, 0)), payload(0)).await;
    // The given-back one comes first: its stream was not evicted (only
    // incarnation 1 was).
    assert_eq!(take(&mut sub, None).await, (2, 0));
    assert_eq!(sub.stats().evicted, 1);
    assert_eq!(take(&mut sub, None).await, (5, 0));
    assert_eq!(sub.lanes(), 2);
    // Without a durable record, a late copy of evicted incarnation 1 is
    // handed out again, as the docs say.
    raw(&js, &subject, Some(&stamp("q", 1, 1)), payload(1)).await;
    assert_eq!(take(&mut sub, None).await, (1, 1));
    assert_eq!(sub.lanes(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_the_streams_limits_discarded_before_they_were_read_are_reported_as_skipped() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = limited_stream(&js, "limits", 10).await;
    for sequence in 0..30 {
        raw(&js, &subject, Some(&stamp("l", 1, sequence)), payload(sequence)).await;
    }
    let mut sub = Subscriber::new(&js, &name, SubscriberConfig::new(fresh("limits"))).await.expect("consumer");
    let first = tokio::time::timeout(Duration::from_secs(10), sub.next()).await.expect("a delivery").expect("read");
    assert_eq!(first.sequence(), 20, "the stream keeps the last ten");
    assert_eq!(first.skipped(), Some(0..20), "the twenty it discarded, said on the first delivery after them");
    first.ack().await.expect("acked");
    for sequence in 21..30 {
        assert_eq!(take(&mut sub, None).await, (1, sequence));
    }
    let stats = sub.stats();
    assert_eq!((stats.discarded, stats.skipped, stats.delivered), (20, 20, 10), "{stats:?}");

    // A second subscriber, started after more were discarded: the same,
    // from its own start.
    for sequence in 30..45 {
        raw(&js, &subject, Some(&stamp("l", 1, sequence)), payload(sequence)).await;
    }
    let mut again = Subscriber::new(&js, &name, SubscriberConfig::new(fresh("limits2"))).await.expect("consumer");
    let d = tokio::time::timeout(Duration::from_secs(10), again.next()).await.expect("a delivery").expect("read");
    assert_eq!((d.sequence(), d.skipped()), (35, Some(0..35)));
    d.ack().await.expect("acked");
    assert_eq!(again.stats().discarded, 35);
}

/// A stream of one subject, in memory, keeping its last `max` messages
/// (older ones discarded); its name and subject.
async fn limited_stream(js: &async_nats::jetstream::Context, name: &str, max: i64) -> (String, String) {
    let name = fresh(name);
    let subject = format!("egress.{name}");
    js.create_stream(async_nats::jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        storage: async_nats::jetstream::stream::StorageType::Memory,
        max_messages: max,
        ..Default::default()
    })
    .await
    .expect("the stream is made");
    (name, subject)
}

/// A hole at the stream's start: a message of no producer, deleted.
async fn hole_at_start(js: &async_nats::jetstream::Context, name: &str, subject: &str) {
    raw(js, subject, None, payload(999)).await;
    let s = js.get_stream(name).await.expect("the stream");
    s.delete_message(1).await.expect("deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_evicted_after_a_hole_is_not_reported_as_having_lost_what_it_delivered() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "holeevict", Duration::from_secs(120)).await;
    hole_at_start(&js, &name, &subject).await;
    for s in 0..5 {
        raw(&js, &subject, Some(&stamp("a", 1, s)), payload(s)).await;
    }
    let lane_idle = Duration::from_millis(300);
    let config = SubscriberConfig { lane_idle, ..SubscriberConfig::new(fresh("holeevict")) };
    let mut sub = Subscriber::new(&js, &name, config).await.expect("consumer");
    for s in 0..5 {
        assert_eq!(took(&mut sub).await, ("a".into(), s, None));
    }
    tokio::time::sleep(lane_idle + Duration::from_millis(50)).await;
    raw(&js, &subject, Some(&stamp("a", 1, 5)), payload(5)).await;
    assert_eq!(took(&mut sub).await, ("a".into(), 5, None), "it delivered 0..5 itself");
    let stats = sub.stats();
    assert_eq!((stats.evicted, stats.discarded, stats.skipped), (1, 1, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_restarted_at_its_floor_counts_what_was_discarded_but_blames_no_producer_for_it() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = limited_stream(&js, "floor", 10).await;
    let durable = fresh("floor");
    for s in 0..5 {
        raw(&js, &subject, Some(&stamp("f", 1, s)), payload(s)).await;
    }
    {
        let mut sub = Subscriber::new(&js, &name, SubscriberConfig::new(durable.clone())).await.expect("consumer");
        for s in 0..5 {
            assert_eq!(took(&mut sub).await, ("f".into(), s, None));
        }
    }
    // Twelve more: the stream keeps ten, so 5 and 6 are discarded unread.
    for s in 5..17 {
        raw(&js, &subject, Some(&stamp("f", 1, s)), payload(s)).await;
    }
    let mut sub = Subscriber::new(&js, &name, SubscriberConfig::new(durable)).await.expect("consumer");
    // Records 0..5 went to the first life: nothing here says they were lost.
    assert_eq!(took(&mut sub).await, ("f".into(), 7, None));
    let stats = sub.stats();
    // The two discarded unread are counted from the floor the broker
    // reports, which it may itself move over discarded messages (then
    // fewer are seen missing); none is blamed on the producer.
    assert!(stats.discarded <= 2, "{stats:?}");
    assert_eq!(stats.skipped, 0, "{stats:?}");
}

/// A durable record that takes long to answer the first time.
#[derive(Debug, Default)]
struct Slow {
    calls: std::sync::atomic::AtomicUsize,
}

impl Resume for Slow {
    fn resume(&self, _: &str, _: Incarnation) -> Result<Option<u64>, String> {
        if self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(800));
        }
        Ok(None)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_next_dropped_while_the_durable_record_is_asked_loses_nothing() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "cancel", Duration::from_secs(120)).await;
    for s in 0..3 {
        raw(&js, &subject, Some(&stamp("c", 1, s)), payload(s)).await;
    }
    let durable = fresh("cancel");
    let slow = Arc::new(Slow::default());
    let config = SubscriberConfig { resume: Some(slow as Arc<dyn Resume>), ..SubscriberConfig::new(durable.clone()) };
    let mut sub = Subscriber::new(&js, &name, config).await.expect("consumer");
    // The first call is given up while the record is asked (a timeout
    // around `next`, as an application's select! would).
    assert!(tokio::time::timeout(Duration::from_millis(200), sub.next()).await.is_err());
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(took(&mut sub).await);
    }
    assert_eq!(got, [("c".into(), 0, None), ("c".into(), 1, None), ("c".into(), 2, None)], "every record, once");
    // And the broker's floor moved past them all.
    let stream = js.get_stream(&name).await.expect("the stream");
    let mut consumer =
        stream.get_consumer::<async_nats::jetstream::consumer::pull::Config>(&durable).await.expect("the consumer");
    // Acknowledgements are published, not awaited: the floor is read until
    // it moves (bounded).
    let moved = tokio::time::timeout(egress_testkit::limit(), async {
        while consumer.info().await.expect("info").ack_floor.stream_sequence < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    assert!(moved.await.is_ok(), "the broker's floor passes the three");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_records_at_the_top_of_the_sequence_space_neither_repeat_nor_overflow_a_counter() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "top", Duration::from_secs(120)).await;
    hole_at_start(&js, &name, &subject).await;
    // After a hole at the start, a producer whose first record is near the
    // top (its skipped count would overflow a plain sum with the next).
    raw(&js, &subject, Some(&stamp("x", 1, u64::MAX - 1)), payload(1)).await;
    raw(&js, &subject, Some(&stamp("y", 1, 5)), payload(2)).await;
    // The top sequence itself, twice, and a copy below it: never handed
    // out twice.
    raw(&js, &subject, Some(&stamp("x", 1, u64::MAX)), payload(3)).await;
    raw(&js, &subject, Some(&stamp("x", 1, u64::MAX)), payload(4)).await;
    raw(&js, &subject, Some(&stamp("x", 1, u64::MAX - 1)), payload(5)).await;
    raw(&js, &subject, Some(&stamp("z", 1, 0)), payload(6)).await;
    let mut sub = Subscriber::new(&js, &name, SubscriberConfig::new(fresh("top"))).await.expect("consumer");
    assert_eq!(took(&mut sub).await, ("x".into(), u64::MAX - 1, Some(0..u64::MAX - 1)));
    assert_eq!(took(&mut sub).await, ("y".into(), 5, Some(0..5)));
    assert_eq!(took(&mut sub).await, ("z".into(), 0, None));
    let stats = sub.stats();
    assert_eq!(stats.skipped, u64::MAX, "saturated, not wrapped: {stats:?}");
    assert_eq!((stats.foreign, stats.duplicates), (2, 1), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_whose_cell_is_disposed_stops_and_says_so() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "disposed", Duration::from_secs(120)).await;
    let cx = AsyncContext::new();
    let c = cell(&cx, 8);
    let mut p = Publisher::spawn(c.clone(), &url, config("d", &name, &subject)).expect("valid");
    c.enqueue(payload(0));
    acked(&c, 0).await;
    let mut states = p.watch_state();
    c.dispose();
    let stopped = tokio::time::timeout(egress_testkit::limit(), p.stopped()).await.expect("it stops");
    assert_eq!(stopped, Some(PublisherError::CellDisposed));
    assert_eq!(p.failure(), Some(PublisherError::CellDisposed));
    // The state lived on the cell's graph: its stream ends with the cell,
    // rather than wait for ever.
    let ended = tokio::time::timeout(egress_testkit::limit(), async { while states.next().await.is_some() {} });
    assert!(ended.await.is_ok(), "the state stream ends");
}
