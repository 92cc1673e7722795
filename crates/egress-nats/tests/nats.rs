//! End to end against a real nats-server with JetStream: the publisher
//! through a chaos proxy that kills its connections, a second publisher
//! taking a stream over, hostile messages in the stream, and the
//! subscriber's order, dedupe and acknowledgements.
//!
//! The server comes from `EGRESS_NATS_URL` (`.ci/run` starts a throwaway
//! `nats-server -js` on a loopback port and sets it, with
//! `EGRESS_NATS_REQUIRED=1`). Without it each test says so and passes,
//! unless `EGRESS_NATS_REQUIRED` is set: then a missing server fails it.

mod common;

use std::time::Duration;

use async_nats::jetstream;
use bytes::Bytes;
use common::{acked, addr, cell, config, connect, contents, fresh, messages, payload, raw, stream, url};
use egress_core::{Policy, Sequence};
use egress_nats::{
    Content, Publisher, PublisherConfig, PublisherError, Stamp, SubscribeError, Subscriber, SubscriberConfig, owner_of,
};
use egress_reactive::{AsyncContext, AsyncEgressCell};
use egress_ws::{Chaos, ChaosProxy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_messages_through_killed_connections_are_stored_once_each_in_order() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "chaos", Duration::from_secs(120)).await;
    let proxy = ChaosProxy::start(addr(&url), Some(Chaos { seed: 0xc4a05, mean_interval: Duration::from_millis(150) }))
        .await
        .expect("the proxy starts");
    let cx = AsyncContext::new();
    let cell = cell(&cx, 512);
    const N: u64 = 100_000;
    let publisher =
        Publisher::spawn(cell.clone(), &format!("nats://{}", proxy.local_addr()), config("chaos", &name, &subject))
            .expect("valid arguments");
    for i in 0..N {
        cell.enqueue(payload(i));
    }
    acked(&cell, N - 1).await;
    let kills = proxy.kills();
    let stats = publisher.shutdown().await;
    assert!(kills >= 3, "the proxy killed connections: {kills}");
    // The last epoch may be lost too (killed just before the shutdown), so
    // every epoch may count as lost: replaced means more than one.
    assert!(stats.lost >= 1 && stats.epochs >= 2, "epochs were lost and replaced: {stats:?}");

    let stored = contents(&js, &name).await;
    assert_eq!(stored.len() as u64, N, "each message once: {stats:?}");
    for (i, (stamp, body)) in stored.iter().enumerate() {
        let stamp = stamp.as_ref().expect("an egress record");
        assert_eq!(stamp.sequence, i as u64, "in order");
        assert_eq!(body, &payload(i as u64));
        assert_eq!(stamp.producer, "chaos");
    }
    // The generations only rise along the stream, within one owner.
    let generations: Vec<u64> = stored.iter().map(|(s, _)| s.as_ref().map_or(0, |s| s.generation)).collect();
    assert!(generations.windows(2).all(|w| w[0] <= w[1]), "generations rise");
    assert!(generations.iter().all(|g| owner_of(*g) == 1), "one owner");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_publisher_takes_the_stream_over_and_the_first_is_fenced_by_the_broker() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    // The shortest duplicate window the server takes: the fence must not
    // rest on it.
    let (name, subject) = stream(&js, "takeover", Duration::from_millis(100)).await;
    let cx = AsyncContext::new();
    let first = cell(&cx, 64);
    let mut a = Publisher::spawn(first.clone(), &url, config("p", &name, &subject)).expect("valid");
    for i in 0..100 {
        first.enqueue(payload(i));
    }
    acked(&first, 99).await;

    // A second instance of the producer (another process: another
    // incarnation) takes over.
    let second = cell(&cx, 64);
    let b = Publisher::spawn(second.clone(), &url, config("p", &name, &subject)).expect("valid");
    for i in 0..10 {
        second.enqueue(payload(1_000 + i));
    }
    acked(&second, 9).await;

    // The first goes on publishing: the broker refuses it, and it stops.
    for i in 100..150 {
        first.enqueue(payload(i));
    }
    let stopped = tokio::time::timeout(Duration::from_secs(30), a.stopped()).await.expect("the first stops");
    match stopped {
        Some(PublisherError::Fenced { owner, by }) => {
            assert_eq!(owner, 1);
            assert_eq!(owner_of(by), 2);
        }
        other => panic!("expected a fence, got {other:?}"),
    }
    assert!(first.acked_through().get_untracked() <= Some(Sequence(99)), "nothing after the takeover was acknowledged");
    // The second goes on.
    second.enqueue(payload(1_010));
    acked(&second, 10).await;
    b.shutdown().await;

    let claims = messages(&js, &name).await.iter().filter(|(s, _)| s.as_ref().is_some_and(|s| s.claim)).count();
    assert_eq!(claims, 2, "one claim per takeover");
    let stored = contents(&js, &name).await;
    let incarnations: Vec<u128> = stored.iter().filter_map(|(s, _)| s.as_ref().map(|s| s.incarnation)).collect();
    let switch = incarnations.iter().position(|i| *i == second.incarnation().get()).expect("the second's records");
    assert_eq!(switch, 100, "the first's 100 records, then the second's");
    assert!(incarnations[switch..].iter().all(|i| *i == second.incarnation().get()), "none of the first's after");
    let bodies: Vec<Bytes> = stored[switch..].iter().map(|(_, b)| b.clone()).collect();
    assert_eq!(bodies, (0..11).map(|i| payload(1_000 + i)).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_publisher_with_the_same_identity_resumes_after_what_the_stream_holds() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "resume", Duration::from_secs(120)).await;
    let cx = AsyncContext::new();
    let c = cell(&cx, 32);
    let p = Publisher::spawn(c.clone(), &url, config("r", &name, &subject)).expect("valid");
    for i in 0..50 {
        c.enqueue(payload(i));
    }
    acked(&c, 49).await;
    p.shutdown().await;
    // More records while no publisher runs, then a new publisher on the
    // same cell: it takes over (a new owner) and sends only the new ones.
    for i in 50..60 {
        c.enqueue(payload(i));
    }
    let p = Publisher::spawn(c.clone(), &url, config("r", &name, &subject)).expect("valid");
    acked(&c, 59).await;
    let stats = p.shutdown().await;
    assert_eq!(stats.published, 10, "only what the stream did not hold: {stats:?}");
    let stored = contents(&js, &name).await;
    let sequences: Vec<u64> = stored.iter().map(|(s, _)| s.as_ref().expect("egress").sequence).collect();
    assert_eq!(sequences, (0..60).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_stream_and_bad_arguments_are_refused() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let name = fresh("shared");
    js.create_stream(jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![format!("{name}.a"), format!("{name}.b")],
        storage: jetstream::stream::StorageType::Memory,
        ..Default::default()
    })
    .await
    .expect("made");
    let cx = AsyncContext::new();
    let c = cell(&cx, 8);
    let mut p = Publisher::spawn(c.clone(), &url, config("s", &name, &format!("{name}.a"))).expect("valid");
    let stopped = tokio::time::timeout(Duration::from_secs(10), p.stopped()).await.expect("stops");
    assert!(matches!(stopped, Some(PublisherError::SharedStream { .. })), "{stopped:?}");

    use egress_nats::SpawnError;
    let spawn =
        |cfg: PublisherConfig, url: &str| Publisher::spawn(c.clone(), url, cfg).map(|_| ()).expect_err("refused");
    assert!(matches!(spawn(config("s", &name, "a.*"), &url), SpawnError::InvalidSubject(_)));
    assert!(matches!(spawn(config("s", &name, "a..b"), &url), SpawnError::InvalidSubject(_)));
    assert!(matches!(spawn(config("s\r\nX: y", &name, "a.b"), &url), SpawnError::InvalidProducer(_)));
    assert!(matches!(spawn(config("", &name, "a.b"), &url), SpawnError::InvalidProducer(_)));
    assert!(matches!(spawn(config("s", "a.b", "a.b"), &url), SpawnError::InvalidStream(_)));
    assert!(matches!(spawn(config("s", &name, "a.b"), "nats://[::1"), SpawnError::InvalidUrl { .. }));
    let held = Policy::builder().dead_letters(egress_core::DeadLetters::Hold).build().expect("valid");
    let holding = AsyncEgressCell::<Bytes>::new(&cx, held);
    let refused = Publisher::spawn(holding, &url, config("s", &name, "a.b")).map(|_| ()).expect_err("refused");
    assert_eq!(refused, SpawnError::HoldUnsupported);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_above_the_servers_limit_is_a_dead_letter_and_the_stream_goes_on() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "large", Duration::from_secs(120)).await;
    let cx = AsyncContext::new();
    let c = cell(&cx, 8);
    let p = Publisher::spawn(c.clone(), &url, config("l", &name, &subject)).expect("valid");
    c.enqueue(payload(0));
    c.enqueue(Bytes::from(vec![0u8; 2 << 20])); // above the default 1 MiB
    c.enqueue(payload(2));
    acked(&c, 2).await;
    let stats = p.shutdown().await;
    assert_eq!(stats.refused, 1);
    let stored = contents(&js, &name).await;
    let seen: Vec<(u64, bool)> = stored
        .iter()
        .map(|(s, _)| {
            let s = s.as_ref().expect("egress");
            (s.sequence, s.dead.is_some())
        })
        .collect();
    // The tombstone takes the record's place: the stream has no hole.
    assert_eq!(seen, [(0, false), (1, true), (2, false)]);
    let mut sub = Subscriber::new(&js, &name, SubscriberConfig::new(fresh("d"))).await.expect("consumer");
    let mut got = Vec::new();
    for _ in 0..3 {
        let d = sub.next().await.expect("a delivery");
        got.push((d.sequence(), d.content()));
        d.ack().await.expect("acked");
    }
    assert_eq!(got[0], (0, Content::Message(payload(0))));
    assert!(matches!(got[1], (1, Content::Skipped(_))));
    assert_eq!(got[2], (2, Content::Message(payload(2))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscriber_delivers_each_record_once_in_order_and_acknowledges_only_what_the_application_did() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "sub", Duration::from_secs(120)).await;
    let stamp = |sequence: u64| Stamp {
        producer: "q".into(),
        incarnation: 7,
        sequence,
        generation: 1 << 32,
        dead: None,
        claim: false,
    };
    // Out of order, with copies beyond the duplicate window, a foreign
    // message, and a message whose headers are hostile.
    for s in [0, 2, 1, 1, 0, 3] {
        raw(&js, &subject, Some(&stamp(s)), payload(s)).await;
    }
    raw(&js, &subject, None, Bytes::from_static(b"not ours")).await;
    let mut bad = stamp(4).to_headers();
    bad.insert(egress_nats::headers::SEQUENCE, "-4");
    js.publish_with_headers(subject.clone(), bad, payload(4)).await.expect("sent").await.expect("stored");
    raw(&js, &subject, Some(&stamp(4)), payload(4)).await;

    let durable = fresh("app");
    let mut sub = Subscriber::new(&js, &name, SubscriberConfig::new(durable.clone())).await.expect("consumer");
    let mut got = Vec::new();
    for _ in 0..3 {
        let d = sub.next().await.expect("a delivery");
        got.push(d.sequence());
        d.ack().await.expect("acked");
    }
    // The next one dropped without an acknowledgement comes back.
    {
        let d = sub.next().await.expect("a delivery");
        assert_eq!(d.sequence(), 3);
    }
    let d = sub.next().await.expect("again");
    assert_eq!(d.sequence(), 3, "given back, handed out again");
    let position = d.position();
    d.ack().await.expect("acked");
    got.push(3);
    assert_eq!(got, [0, 1, 2, 3]);
    let d = sub.next().await.expect("a delivery");
    assert_eq!((d.sequence(), d.content()), (4, Content::Message(payload(4))));
    drop(d); // not processed: the broker must send it again
    let stats = sub.stats();
    assert_eq!((stats.delivered, stats.duplicates, stats.foreign), (4, 2, 2), "{stats:?}");
    drop(sub);

    // A new subscriber on the same durable consumer resumes at the
    // broker's floor; with the position the application stored, nothing
    // it processed comes again.
    let mut config = SubscriberConfig::new(durable);
    config.positions = vec![position];
    let mut sub = Subscriber::new(&js, &name, config).await.expect("consumer");
    let d = sub.next().await.expect("a delivery");
    assert_eq!(d.sequence(), 4, "only the unprocessed one");
    d.ack().await.expect("acked");
    let next = tokio::time::timeout(Duration::from_millis(300), sub.next()).await;
    assert!(next.is_err(), "nothing more");
    let _: Option<SubscribeError> = None;
}

/// The restarted process of `cell`'s producer: a cell of the same
/// incarnation restored as its store would restore it (everything through
/// `acked` acknowledged, at `generation`), its journal kept durable.
fn restarted(cx: &AsyncContext, cell: &AsyncEgressCell<Bytes>, acked: u64) -> AsyncEgressCell<Bytes> {
    use egress_core::{EgressCore, Restored};
    let restored = Restored {
        generation: cell.generation().get_untracked(),
        next_sequence: Sequence(acked + 1),
        acked_through: Some(Sequence(acked)),
        records: vec![],
        skipped: vec![],
    };
    let core = EgressCore::restore(Policy::builder().inflight_limit(16).build().expect("valid"), restored)
        .expect("a valid restore");
    let options = egress_reactive::CellOptions::new().incarnation(cell.incarnation());
    let b = AsyncEgressCell::from_core(cx, core, options);
    let journal = b.clone();
    tokio::spawn(async move {
        loop {
            while let Some((ready, _)) = journal.poll_ready() {
                let _ = journal.persisted(ready.epoch);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_of_the_same_incarnation_is_fenced_not_told_duplicate() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "zombie", Duration::from_secs(120)).await;
    let cx = AsyncContext::new();
    let a = cell(&cx, 16);
    let mut pa = Publisher::spawn(a.clone(), &url, config("z", &name, &subject)).expect("valid");
    for i in 0..100 {
        a.enqueue(payload(i));
    }
    acked(&a, 99).await;
    // The producer's process restarted from its store (same incarnation)
    // while the old one lives on: the new one takes over and goes on.
    let b = restarted(&cx, &a, 99);
    let pb = Publisher::spawn(b.clone(), &url, config("z", &name, &subject)).expect("valid");
    for i in 100..200 {
        b.enqueue(Bytes::from(format!("new {i}")));
    }
    acked(&b, 199).await;
    // The old one enqueues the same sequences (other payloads): every id
    // is a duplicate to the broker, which answers before the fence.
    for i in 100..200 {
        a.enqueue(Bytes::from(format!("old {i}")));
    }
    let stopped = tokio::time::timeout(Duration::from_secs(30), pa.stopped()).await.expect("the old one stops");
    assert!(matches!(stopped, Some(PublisherError::Fenced { owner: 1, .. })), "{stopped:?}");
    assert_eq!(a.acked_through().get_untracked(), Some(Sequence(99)), "nothing of the old one's acknowledged");
    pb.shutdown().await;
    let stored = contents(&js, &name).await;
    let bodies: Vec<Bytes> = stored.iter().map(|(_, b)| b.clone()).collect();
    let expected: Vec<Bytes> =
        (0..100).map(payload).chain((100..200).map(|i| Bytes::from(format!("new {i}")))).collect();
    assert_eq!(bodies, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_publishers_taking_over_at_once_one_owns_the_subject_and_the_other_is_fenced() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    for round in 0..3 {
        let (name, subject) = stream(&js, "race", Duration::from_secs(120)).await;
        let cx = AsyncContext::new();
        let (a, b) = (cell(&cx, 64), cell(&cx, 64));
        // Both read the empty subject and take it over at once.
        let mut pa = Publisher::spawn(a.clone(), &url, config("r", &name, &subject)).expect("valid");
        let mut pb = Publisher::spawn(b.clone(), &url, config("r", &name, &subject)).expect("valid");
        let settled = tokio::time::timeout(Duration::from_secs(30), async {
            while pa.stats().epochs == 0 || pb.stats().epochs == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
        assert!(settled.is_ok(), "round {round}: both claimed: {:?} {:?}", pa.stats(), pb.stats());
        for i in 0..300 {
            a.enqueue(payload(i));
            b.enqueue(payload(1_000 + i));
        }
        // One of them is fenced; the other publishes everything.
        let (fenced, winner, loser) = tokio::select! {
            f = pa.stopped() => (f, b.clone(), a.clone()),
            f = pb.stopped() => (f, a.clone(), b.clone()),
            () = tokio::time::sleep(Duration::from_secs(30)) => panic!("round {round}: nobody was fenced"),
        };
        assert!(matches!(fenced, Some(PublisherError::Fenced { .. })), "round {round}: {fenced:?}");
        acked(&winner, 299).await;
        let stored = contents(&js, &name).await;
        let of = |c: &AsyncEgressCell<Bytes>| -> Vec<u64> {
            stored
                .iter()
                .filter_map(|(s, _)| s.as_ref())
                .filter(|s| s.incarnation == c.incarnation().get())
                .map(|s| s.sequence)
                .collect()
        };
        assert_eq!(of(&winner), (0..300).collect::<Vec<_>>(), "round {round}: the owner's records, in order, once");
        assert!(of(&loser).is_empty(), "round {round}: nothing of the fenced one: {:?}", of(&loser));
        assert_eq!(loser.acked_through().get_untracked(), None, "round {round}");
        drop((pa, pb));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_that_never_fills_is_given_up_and_said_not_a_stall_of_every_producer() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let stamp = |producer: &str, sequence: u64| Stamp {
        producer: producer.into(),
        incarnation: 9,
        sequence,
        generation: 1 << 32,
        dead: None,
        claim: false,
    };
    // Held at the broker's limit: q's 1..5 never come, while r's records
    // keep coming behind q:5.
    let (name, subject) = stream(&js, "gap", Duration::from_secs(120)).await;
    raw(&js, &subject, Some(&stamp("q", 0)), payload(0)).await;
    raw(&js, &subject, Some(&stamp("q", 5)), payload(5)).await;
    for i in 0..50 {
        raw(&js, &subject, Some(&stamp("r", i)), payload(i)).await;
    }
    let config = SubscriberConfig {
        max_ack_pending: 16,
        gap_timeout: Duration::from_secs(3600),
        ..SubscriberConfig::new(fresh("g"))
    };
    let mut sub = Subscriber::new(&js, &name, config).await.expect("consumer");
    let mut r = 0;
    let mut q = Vec::new();
    let all = tokio::time::timeout(Duration::from_secs(20), async {
        while r < 50 || q.len() < 2 {
            let d = sub.next().await.expect("a delivery");
            if d.stamp().producer == "r" {
                assert_eq!(d.sequence(), r, "r in order");
                r += 1;
            } else {
                q.push((d.sequence(), d.skipped()));
            }
            d.ack().await.expect("acked");
        }
    })
    .await;
    assert!(all.is_ok(), "stalled after r {r}, q {q:?}");
    assert_eq!(q, [(0, None), (5, Some(1..5))]);
    assert_eq!(sub.stats().skipped, 4);

    // Or after the gap's timeout.
    let (name, subject) = stream(&js, "gap2", Duration::from_secs(120)).await;
    raw(&js, &subject, Some(&stamp("q", 0)), payload(0)).await;
    raw(&js, &subject, Some(&stamp("q", 3)), payload(3)).await;
    let config = SubscriberConfig { gap_timeout: Duration::from_millis(200), ..SubscriberConfig::new(fresh("g")) };
    let mut sub = Subscriber::new(&js, &name, config).await.expect("consumer");
    let d = sub.next().await.expect("q:0");
    assert_eq!((d.sequence(), d.skipped()), (0, None));
    d.ack().await.expect("acked");
    let d = tokio::time::timeout(Duration::from_secs(10), sub.next()).await.expect("given up in time").expect("q:3");
    assert_eq!((d.sequence(), d.skipped()), (3, Some(1..3)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_above_the_streams_own_size_limit_is_a_dead_letter_in_its_place_at_once() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let name = fresh("maxsize");
    let subject = format!("egress.{name}");
    js.create_stream(jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        storage: jetstream::stream::StorageType::Memory,
        max_message_size: 1024,
        ..Default::default()
    })
    .await
    .expect("made");
    let cx = AsyncContext::new();
    let c = cell(&cx, 8);
    let p = Publisher::spawn(c.clone(), &url, config("m", &name, &subject)).expect("valid");
    c.enqueue(payload(0));
    c.enqueue(Bytes::from(vec![b'x'; 2_000])); // under the server's limit, above the stream's
    c.enqueue(payload(2));
    acked(&c, 2).await;
    let stats = p.shutdown().await;
    assert_eq!(stats.refused, 1, "{stats:?}");
    assert_eq!(stats.lost, 0, "a refusal for size is no lost connection: {stats:?}");
    let seen: Vec<(u64, bool)> = contents(&js, &name)
        .await
        .iter()
        .map(|(s, _)| {
            let s = s.as_ref().expect("egress");
            (s.sequence, s.dead.is_some())
        })
        .collect();
    assert_eq!(seen, [(0, false), (1, true), (2, false)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_message_of_a_higher_owner_fences_the_publisher_and_nothing_after_it_is_acknowledged() {
    let Some(url) = url() else { return };
    let js = connect(&url).await;
    let (name, subject) = stream(&js, "forged", Duration::from_secs(120)).await;
    let cx = AsyncContext::new();
    let c = cell(&cx, 16);
    let mut p = Publisher::spawn(c.clone(), &url, config("f", &name, &subject)).expect("valid");
    for i in 0..20 {
        c.enqueue(payload(i));
    }
    acked(&c, 19).await;
    // A writer with publish permission forges a message of owner 9.
    let forged =
        Stamp { producer: "x".into(), incarnation: 1, sequence: 0, generation: 9 << 32, dead: None, claim: false };
    raw(&js, &subject, Some(&forged), Bytes::from_static(b"forged")).await;
    for i in 20..30 {
        c.enqueue(payload(i));
    }
    let stopped = tokio::time::timeout(Duration::from_secs(30), p.stopped()).await.expect("it stops");
    assert_eq!(stopped, Some(PublisherError::Fenced { owner: 1, by: 9 << 32 }));
    assert_eq!(c.acked_through().get_untracked(), Some(Sequence(19)), "nothing after the forgery acknowledged");
    assert_eq!(
        c.pending_len().get_untracked() + c.inflight_len().get_untracked(),
        10,
        "nothing lost: still in the cell"
    );
}
