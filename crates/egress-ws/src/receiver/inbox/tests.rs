use super::*;
use crate::protocol::{GENERATION_LIMIT, MAX_GENERATION_JUMP};

fn rules() -> Rules {
    Rules {
        max_buffered: 4,
        queue: 8,
        incarnations: 2,
        commit_on_take: true,
        ack_every: 2,
        max_buffered_bytes: usize::MAX,
        max_buffered_bytes_total: usize::MAX,
        queue_bytes: usize::MAX,
        max_producers: 100,
        producer_idle: u64::MAX,
        eviction_floor: 0,
        durable: false,
    }
}

fn msg(i: u64) -> Content {
    Content::Message(Bytes::from(i.to_string()))
}

fn admit(inbox: &mut Inbox<()>, p: &Arc<str>, inc: u128, g: u64, resume: u64) -> (ConnId, u64, u64) {
    match inbox.handshake(p, inc, g, resume, None, (), 0) {
        Admission::Welcome { conn, next, received, .. } => (conn, next, received),
        Admission::Refused { reason, .. } => panic!("refused: {reason}"),
    }
}

fn taken(inbox: &mut Inbox<()>) -> Vec<(u128, u64)> {
    std::iter::from_fn(|| inbox.take(0)).map(|(q, _)| (q.incarnation, q.sequence)).collect()
}

#[test]
fn delivers_in_order_once_and_acks_what_was_taken() {
    let mut inbox = Inbox::new(rules());
    let p: Arc<str> = "p".into();
    let (c, next, received) = admit(&mut inbox, &p, 7, 1, 0);
    assert_eq!((next, received), (0, 0));
    assert_eq!(inbox.take_frame(&p, c, 1, 1, msg(1)), Taken::Buffered);
    assert_eq!(inbox.take_frame(&p, c, 1, 1, msg(1)), Taken::Duplicate);
    assert_eq!(inbox.poll_ack(&p, c, true), None, "nothing taken, nothing acknowledged");
    assert_eq!(inbox.take_frame(&p, c, 1, 0, msg(0)), Taken::Delivered { count: 2, stuck: false });
    assert_eq!(inbox.take_frame(&p, c, 1, 0, msg(0)), Taken::Duplicate);
    assert_eq!(inbox.poll_ack(&p, c, true), None, "queued is not acknowledged");
    assert_eq!(taken(&mut inbox), [(7, 0), (7, 1)]);
    assert_eq!(inbox.poll_ack(&p, c, false), Some((1, 1)));
    assert_eq!(inbox.poll_ack(&p, c, true), None);
}

#[test]
fn a_new_incarnation_is_a_new_stream_and_a_stale_generation_is_refused_with_the_latest() {
    let mut inbox = Inbox::new(rules());
    let p: Arc<str> = "p".into();
    let (c, ..) = admit(&mut inbox, &p, 1, 5, 0);
    for s in 0..3 {
        assert_eq!(inbox.take_frame(&p, c, 5, s, msg(s)), Taken::Delivered { count: 1, stuck: false });
    }
    let _ = taken(&mut inbox);
    // A restarted producer: new incarnation, generation 1.
    match inbox.handshake(&p, 2, 1, 0, None, (), 0) {
        Admission::Refused { code: CloseCode::StaleGeneration, detail, .. } => assert_eq!(detail, 5),
        other => panic!("expected a refusal, got {other:?}"),
    }
    let (c2, next, received) = admit(&mut inbox, &p, 2, 6, 0);
    assert_eq!((next, received), (0, 0), "its own sequence space, from 0");
    assert_eq!(inbox.take_frame(&p, c, 5, 3, msg(3)), Taken::Fenced);
    assert_eq!(inbox.take_frame(&p, c2, 6, 0, msg(0)), Taken::Delivered { count: 1, stuck: false });
    assert_eq!(taken(&mut inbox), [(2, 0)]);
    // The first incarnation is remembered: it resumes where it was.
    let (_, next, received) = admit(&mut inbox, &p, 1, 7, 0);
    assert_eq!((next, received), (3, 3));
}

#[test]
fn hostile_numbers_are_refused_without_panicking() {
    let mut inbox = Inbox::new(rules());
    let p: Arc<str> = "p".into();
    let (c, next, _) = admit(&mut inbox, &p, 1, GENERATION_LIMIT - 1, u64::MAX);
    assert_eq!(next, u64::MAX);
    let g = GENERATION_LIMIT - 1;
    assert!(matches!(inbox.take_frame(&p, c, g, u64::MAX, msg(0)), Taken::Invalid(_)));
    assert_eq!(inbox.take_frame(&p, c, g, 3, msg(3)), Taken::Duplicate);
    assert!(matches!(inbox.take_frame(&p, c, 1, 3, msg(3)), Taken::Invalid(_)));
    assert!(matches!(inbox.handshake(&p, 1, u64::MAX, 0, None, (), 0), Admission::Refused { .. }));
    // The last deliverable sequence is u64::MAX - 1.
    let q: Arc<str> = "q".into();
    let (c, ..) = admit(&mut inbox, &q, 1, 1, u64::MAX - 1);
    assert_eq!(inbox.take_frame(&q, c, 1, u64::MAX - 1, msg(0)), Taken::Delivered { count: 1, stuck: false });
    assert_eq!(inbox.next_for("q"), Some(u64::MAX));
}

#[test]
fn one_handshake_cannot_put_a_producer_id_out_of_reach() {
    let mut inbox = Inbox::new(rules());
    let p: Arc<str> = "p".into();
    for g in [GENERATION_LIMIT, u64::MAX] {
        match inbox.handshake(&p, 1, g, 0, None, (), 0) {
            Admission::Refused { code: CloseCode::Protocol, .. } => {}
            other => panic!("generation {g}: expected a protocol refusal, got {other:?}"),
        }
    }
    // A squatter's first handshake far up is admitted, but the latest
    // recorded rises by MAX_GENERATION_JUMP at most...
    admit(&mut inbox, &p, 9, GENERATION_LIMIT - 1, 0);
    let stale = |inbox: &mut Inbox<()>, g| match inbox.handshake(&p, 1, g, 0, None, (), 0) {
        Admission::Refused { code: CloseCode::StaleGeneration, detail, .. } => detail,
        other => panic!("expected a stale refusal, got {other:?}"),
    };
    assert_eq!(stale(&mut inbox, 5), MAX_GENERATION_JUMP);
    // ...so the producer, told the latest, is admitted above it.
    admit(&mut inbox, &p, 1, MAX_GENERATION_JUMP + 1, 0);
    // And so for every later jump.
    admit(&mut inbox, &p, 9, GENERATION_LIMIT - 1, 0);
    assert_eq!(stale(&mut inbox, 7), 2 * MAX_GENERATION_JUMP + 1);
    admit(&mut inbox, &p, 1, 2 * MAX_GENERATION_JUMP + 2, 0);
}

#[test]
fn a_stopped_inbox_admits_nobody() {
    let mut inbox: Inbox<u8> = Inbox::new(rules());
    let p: Arc<str> = "p".into();
    assert!(matches!(inbox.handshake(&p, 1, 1, 0, None, 7, 0), Admission::Welcome { .. }));
    assert_eq!(inbox.stop(), [7], "the admitted connection is to be closed");
    match inbox.handshake(&"q".into(), 1, 1, 0, None, 8, 0) {
        Admission::Refused { code: CloseCode::Normal, .. } => {}
        other => panic!("expected a normal refusal, got {other:?}"),
    }
}

#[test]
fn a_full_queue_refuses_in_order_frames_and_a_full_buffer_drops_out_of_order_ones() {
    let mut inbox = Inbox::new(Rules { queue: 2, max_buffered: 1, ..rules() });
    let p: Arc<str> = "p".into();
    let (c, ..) = admit(&mut inbox, &p, 1, 1, 0);
    assert_eq!(inbox.take_frame(&p, c, 1, 0, msg(0)), Taken::Delivered { count: 1, stuck: false });
    assert_eq!(inbox.take_frame(&p, c, 1, 1, msg(1)), Taken::Delivered { count: 1, stuck: false });
    assert_eq!(inbox.take_frame(&p, c, 1, 2, msg(2)), Taken::Full(msg(2)));
    assert_eq!(inbox.take_frame(&p, c, 1, 4, msg(4)), Taken::Buffered);
    assert_eq!(inbox.take_frame(&p, c, 1, 5, msg(5)), Taken::Overflow);
    let _ = inbox.take(0);
    assert_eq!(inbox.take_frame(&p, c, 1, 2, msg(2)), Taken::Delivered { count: 1, stuck: false });
    // The buffer goes with its connection.
    inbox.closed(&p, c, 0);
    let (c, _, received) = admit(&mut inbox, &p, 1, 2, 0);
    assert_eq!(received, 3);
    assert_eq!(inbox.take_frame(&p, c, 2, 3, msg(3)), Taken::Full(msg(3)));
}

#[test]
fn every_event_is_counted_once() {
    let mut inbox = Inbox::new(Rules { queue: 2, max_buffered: 1, max_producers: 1, commit_on_take: false, ..rules() });
    let p: Arc<str> = "p".into();
    let (c, ..) = admit(&mut inbox, &p, 1, 5, 0);
    // Refused: a generation out of range, a stale one; busy: no room.
    assert!(matches!(inbox.handshake(&p, 1, GENERATION_LIMIT, 0, None, (), 0), Admission::Refused { .. }));
    assert!(matches!(inbox.handshake(&p, 1, 5, 0, None, (), 0), Admission::Refused { .. }));
    assert!(matches!(inbox.handshake(&"q".into(), 1, 1, 0, None, (), 0), Admission::Refused { .. }));
    let _ = inbox.take_frame(&p, c, 5, 0, msg(0));
    let _ = inbox.take_frame(&p, c, 5, 0, msg(0)); // a duplicate
    let _ = inbox.take_frame(&p, c, 5, 1, Content::Skipped(egress_core::DeadReason::Permanent));
    let _ = inbox.take_frame(&p, c, 5, 3, msg(3)); // buffered
    let _ = inbox.take_frame(&p, c, 5, 4, msg(4)); // overflow
    let taken = take_all(&mut inbox);
    assert!(inbox.release(again(&taken[0])));
    let (c, ..) = admit(&mut inbox, &p, 1, 6, 0); // fences the first
    inbox.closed(&p, c, 0);
    let counts = Counts {
        taken: 2,
        skipped: 1,
        duplicates: 1,
        overflow: 1,
        connections: 2,
        fenced: 1,
        refused: 2,
        released: 1,
        busy: 1,
        evictions: 0,
        unconfirmed_forgotten: 0,
    };
    assert_eq!(inbox.counts, counts);
}

#[test]
fn byte_bounds_weigh_payload_bytes_and_tombstones_weigh_nothing() {
    let rules = Rules { max_buffered_bytes: 5, max_buffered_bytes_total: 8, queue_bytes: 10, ..rules() };
    let mut inbox = Inbox::new(rules);
    let p: Arc<str> = "p".into();
    let (c, ..) = admit(&mut inbox, &p, 1, 1, 0);
    let bytes = |n: usize| Content::Message(Bytes::from(vec![7u8; n]));
    // Above a gap: 6 bytes do not fit the stream's 5; 4 do; then 2 more
    // do not (6 > 5); a tombstone weighs nothing.
    assert_eq!(inbox.take_frame(&p, c, 1, 5, bytes(6)), Taken::Overflow);
    assert_eq!(inbox.take_frame(&p, c, 1, 5, bytes(4)), Taken::Buffered);
    assert_eq!(inbox.take_frame(&p, c, 1, 6, bytes(2)), Taken::Overflow);
    let skipped = Content::Skipped(egress_core::DeadReason::Permanent);
    assert_eq!(inbox.take_frame(&p, c, 1, 6, skipped), Taken::Buffered);
    assert_eq!(inbox.held().buffered_bytes, 4);
    // In order: 6 bytes queued; 5 more would pass the queue's 10.
    assert_eq!(inbox.take_frame(&p, c, 1, 0, bytes(6)), Taken::Delivered { count: 1, stuck: false });
    assert_eq!(inbox.take_frame(&p, c, 1, 1, bytes(5)), Taken::Full(bytes(5)));
    assert_eq!(inbox.take_frame(&p, c, 1, 1, bytes(4)), Taken::Delivered { count: 1, stuck: false });
    assert_eq!((inbox.held().queued_bytes, inbox.held().buffered_bytes), (10, 4));
    // Another producer's buffer counts against the total of 8.
    let q: Arc<str> = "q".into();
    let (cq, ..) = admit(&mut inbox, &q, 1, 1, 0);
    assert_eq!(inbox.take_frame(&q, cq, 1, 3, bytes(5)), Taken::Overflow, "4 + 5 > 8");
    assert_eq!(inbox.take_frame(&q, cq, 1, 3, bytes(4)), Taken::Buffered, "4 + 4 = 8");
}

#[test]
fn a_producer_without_a_connection_is_still_refused_a_stale_generation() {
    let mut inbox = Inbox::new(rules());
    let p: Arc<str> = "p".into();
    let (c, ..) = admit(&mut inbox, &p, 1, 5, 0);
    inbox.closed(&p, c, 0);
    for g in [3, 5] {
        match inbox.handshake(&p, 1, g, 0, None, (), 0) {
            Admission::Refused { code: CloseCode::StaleGeneration, detail: 5, .. } => {}
            other => panic!("generation {g} after 5: expected a stale refusal, got {other:?}"),
        }
    }
    admit(&mut inbox, &p, 1, 6, 0);
    // Its latest rises from the last one recorded, not from zero, also
    // while it has no connection: at most MAX_GENERATION_JUMP a step.
    let jump = MAX_GENERATION_JUMP;
    let q: Arc<str> = "q".into();
    let (c, ..) = admit(&mut inbox, &q, 1, 5 * jump, 0); // recorded: jump
    inbox.closed(&q, c, 0);
    let (c, ..) = admit(&mut inbox, &q, 1, 5 * jump, 0); // recorded: 2 * jump
    inbox.closed(&q, c, 0);
    match inbox.handshake(&q, 1, 2 * jump, 0, None, (), 0) {
        Admission::Refused { code: CloseCode::StaleGeneration, detail, .. } => assert_eq!(detail, 2 * jump),
        other => panic!("expected a stale refusal at 2^33, got {other:?}"),
    }
}

fn take_all(inbox: &mut Inbox<()>) -> Vec<Queued> {
    std::iter::from_fn(|| inbox.take(0).map(|(q, _)| q)).collect()
}

fn again(q: &Queued) -> Queued {
    Queued { producer: q.producer.clone(), content: q.content.clone(), ..*q }
}

fn commit(inbox: &mut Inbox<()>, q: &Queued) -> bool {
    inbox.commit(q, 0).is_some()
}

#[test]
fn explicit_commits_cover_what_was_taken() {
    let mut inbox = Inbox::new(Rules { commit_on_take: false, ..rules() });
    let p: Arc<str> = "p".into();
    let (c, ..) = admit(&mut inbox, &p, 1, 1, 0);
    for s in 0..5 {
        let _ = inbox.take_frame(&p, c, 1, s, msg(s));
    }
    let got: Vec<Queued> = std::iter::from_fn(|| inbox.take(0).map(|(q, _)| q)).take(3).collect();
    assert_eq!(inbox.poll_ack(&p, c, true), None, "taken is not committed");
    // A commit that jumps (0 and 1 at once) still wakes the connection.
    assert!(commit(&mut inbox, &got[1]), "the first commit since an ack wakes");
    assert!(!commit(&mut inbox, &got[0]), "an older commit is void");
    assert_eq!(inbox.poll_ack(&p, c, true), Some((1, 1)));
    let never = Queued { sequence: 5, ..again(&got[0]) };
    assert!(!commit(&mut inbox, &never), "a commit of what was never received is void");
    assert!(!inbox.release(again(&got[0])), "a give-back of something committed is void");
    assert_eq!(inbox.counts.released, 0);
}

#[test]
fn acks_are_due_on_the_first_commit_and_from_every_ack_every_on() {
    // ack_every is 2.
    let mut inbox = Inbox::new(Rules { commit_on_take: false, ..rules() });
    let p: Arc<str> = "p".into();
    let (c, ..) = admit(&mut inbox, &p, 1, 1, 0);
    for s in 0..6 {
        let _ = inbox.take_frame(&p, c, 1, s, msg(s));
    }
    let got = take_all(&mut inbox);
    assert!(!inbox.unacked(&p, c), "nothing committed");
    assert!(commit(&mut inbox, &got[0]), "the first commit since the ack wakes (to start the timer)");
    assert!(inbox.unacked(&p, c));
    assert_eq!(inbox.poll_ack(&p, c, false), None, "1 unacknowledged, below ack_every");
    assert!(commit(&mut inbox, &got[1]), "2 unacknowledged: due");
    assert_eq!(inbox.poll_ack(&p, c, false), Some((1, 1)));
    assert!(!inbox.unacked(&p, c), "all acknowledged");
    assert!(commit(&mut inbox, &got[2]), "the first since the ack");
    assert!(commit(&mut inbox, &got[3]), "2 unacknowledged");
    assert!(commit(&mut inbox, &got[4]), "and on");
    assert_eq!(inbox.poll_ack(&p, c, false), Some((1, 4)));
    assert!(!inbox.unacked(&p, ConnId(c.0 + 1)), "another connection has nothing");
    // Without a connection, a commit wakes nothing.
    inbox.closed(&p, c, 0);
    assert!(!commit(&mut inbox, &got[5]), "no connection to wake");
}

#[test]
fn a_message_above_the_queue_bytes_passes_an_empty_queue() {
    let mut inbox = Inbox::new(Rules { queue_bytes: 10, ..rules() });
    let p: Arc<str> = "p".into();
    let (c, ..) = admit(&mut inbox, &p, 1, 1, 0);
    let big = Content::Message(Bytes::from(vec![1u8; 20]));
    assert_eq!(
        inbox.take_frame(&p, c, 1, 0, big.clone()),
        Taken::Delivered { count: 1, stuck: false },
        "else it wedges"
    );
    assert_eq!(inbox.take_frame(&p, c, 1, 1, big.clone()), Taken::Full(big), "not past another");
    assert_eq!(inbox.held().queued_bytes, 20);
}

#[test]
fn a_resume_point_above_what_a_stream_holds_moves_it_on() {
    let mut inbox = Inbox::new(rules());
    let p: Arc<str> = "p".into();
    let (c, ..) = admit(&mut inbox, &p, 1, 1, 0);
    for s in 0..2 {
        let _ = inbox.take_frame(&p, c, 1, s, msg(s));
    }
    let _ = taken(&mut inbox);
    inbox.closed(&p, c, 0);
    // At its own watermark: nothing moves.
    let (c, next, received) = admit(&mut inbox, &p, 1, 2, 2);
    assert_eq!((next, received), (2, 2));
    inbox.closed(&p, c, 0);
    // Below it: nothing moves back.
    let (c, next, received) = admit(&mut inbox, &p, 1, 3, 1);
    assert_eq!((next, received), (2, 2));
    inbox.closed(&p, c, 0);
    // Above it: the producer no longer holds 2..5, so they are not waited for.
    let (c, next, received) = admit(&mut inbox, &p, 1, 4, 5);
    assert_eq!((next, received), (5, 5));
    assert_eq!(inbox.take_frame(&p, c, 4, 5, msg(5)), Taken::Delivered { count: 1, stuck: false });
}

#[test]
fn a_resume_point_covers_the_give_backs_below_it_and_only_those() {
    let mut inbox = Inbox::new(Rules { commit_on_take: false, ..rules() });
    let p: Arc<str> = "p".into();
    let (c, ..) = admit(&mut inbox, &p, 1, 1, 0);
    for s in 0..4 {
        let _ = inbox.take_frame(&p, c, 1, s, msg(s));
    }
    let got = take_all(&mut inbox);
    // 1 and 3 given back, 2 committed: committed through 0 only.
    assert!(inbox.release(again(&got[1])) && inbox.release(again(&got[3])));
    let _ = commit(&mut inbox, &got[2]);
    inbox.closed(&p, c, 0);
    let (c, next, received) = admit(&mut inbox, &p, 1, 2, 0);
    assert_eq!((next, received), (1, 4), "the give-backs hold the watermark at 1");
    inbox.closed(&p, c, 0);
    // The producer says everything below 3 was acknowledged: that
    // covers 1 (at the application's watermark, 3, too), not 3.
    let (_, next, received) = admit(&mut inbox, &p, 1, 3, 3);
    assert_eq!((next, received), (3, 4));
}

#[test]
fn a_stream_with_deliveries_waiting_is_not_forgotten_for_a_new_incarnation() {
    let mut inbox = Inbox::new(Rules { incarnations: 1, ..rules() });
    let p: Arc<str> = "p".into();
    let (c, ..) = admit(&mut inbox, &p, 1, 1, 0);
    let _ = inbox.take_frame(&p, c, 1, 0, Content::Message(Bytes::from(vec![0u8; 7])));
    inbox.closed(&p, c, 0);
    // Even with a durable record, and past the producer-idle time: what
    // waits for the application keeps its stream.
    inbox.rules.durable = true;
    inbox.rules.producer_idle = 0;
    match inbox.handshake(&p, 2, 2, 0, None, (), 5) {
        Admission::Refused { code: CloseCode::Busy, .. } => {}
        other => panic!("expected busy, got {other:?}"),
    }
    assert_eq!(inbox.held(), Held { producers: 1, buffered_bytes: 0, queued: 1, queued_bytes: 7 });
    assert!(inbox.take(5).is_some());
    admit(&mut inbox, &p, 2, 2, 0);
    assert!(!inbox.holds(&p, 1) && inbox.holds(&p, 2));
}

#[test]
fn a_delivery_given_back_is_handed_over_again_first_and_not_committed_meanwhile() {
    let mut inbox = Inbox::new(Rules { commit_on_take: false, ..rules() });
    let p: Arc<str> = "p".into();
    let (c, ..) = admit(&mut inbox, &p, 1, 1, 0);
    for s in 0..6 {
        let _ = inbox.take_frame(&p, c, 1, s, msg(s));
    }
    let got: Vec<Queued> = std::iter::from_fn(|| inbox.take(0).map(|(q, _)| q)).take(4).collect();
    // Given back in reverse order (as locals drop when a handler
    // unwinds): both come back, in sequence order, before 4 and 5.
    assert!(inbox.release(again(&got[3])));
    assert!(inbox.release(again(&got[2])));
    assert_eq!(inbox.counts.released, 2);
    // A commit of 1 is applied; one of 3 (taken before, given back)
    // covers nothing past 1 while 2 and 3 wait.
    assert!(commit(&mut inbox, &got[1]));
    assert!(!commit(&mut inbox, &got[3]));
    assert_eq!(inbox.poll_ack(&p, c, true), Some((1, 1)));
    let again: Vec<Queued> = take_all(&mut inbox);
    let shape: Vec<(u64, u32)> = again.iter().map(|q| (q.sequence, q.given_back)).collect();
    assert_eq!(shape, [(2, 1), (3, 1), (4, 0), (5, 0)]);
    // Taken again, they still wait for commits of their own: 2 given
    // back once more comes back once more.
    assert_eq!(inbox.poll_ack(&p, c, true), None);
    assert!(inbox.release(super::tests::again(&again[0])));
    assert_eq!(inbox.poll_ack(&p, c, true), None);
    let third = take_all(&mut inbox);
    assert_eq!((third[0].sequence, third[0].given_back), (2, 2));
    // Committed itself, 2 is covered, and 3 with it (committed before).
    assert!(commit(&mut inbox, &third[0]));
    assert_eq!(inbox.poll_ack(&p, c, true), Some((1, 3)));
    // Nothing was asked of the producer: the stream never rewound.
    assert_eq!(inbox.next_for("p"), Some(6));
}

#[test]
fn give_backs_of_several_streams_come_back_in_order_within_each() {
    let mut inbox = Inbox::new(Rules { commit_on_take: false, ..rules() });
    let (p, q): (Arc<str>, Arc<str>) = ("p".into(), "q".into());
    let (cp, ..) = admit(&mut inbox, &p, 1, 1, 0);
    let (cq, ..) = admit(&mut inbox, &q, 1, 1, 0);
    for s in 1..3 {
        let _ = inbox.take_frame(&p, cp, 1, s - 1, msg(s));
    }
    let _ = inbox.take_frame(&q, cq, 1, 0, msg(1));
    // Held: P0, P1, Q0; given back P0, Q0, P1.
    let got = take_all(&mut inbox);
    let find = |name: &str, seq: u64| got.iter().find(|g| &*g.producer == name && g.sequence == seq).expect("taken");
    for (name, seq) in [("p", 0), ("q", 0), ("p", 1)] {
        assert!(inbox.release(again(find(name, seq))));
    }
    let order: Vec<(String, u64)> = take_all(&mut inbox).iter().map(|g| (g.producer.to_string(), g.sequence)).collect();
    assert_eq!(order, [("q".into(), 0), ("p".into(), 0), ("p".into(), 1)]);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 2_000,
        failure_persistence: None,
        rng_algorithm: proptest::test_runner::RngAlgorithm::ChaCha,
        ..proptest::prelude::ProptestConfig::default()
    })]
    /// The fuzz target's driver, on random bytes (a fresh seed each run:
    /// a failure prints its minimal input, kept as a test below).
    #[test]
    fn any_sequence_of_operations_keeps_the_inbox_consistent(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400)) {
        super::drive::run(&data);
    }
}

#[test]
fn a_connection_whose_next_sequence_it_dropped_is_stuck_until_it_is_sent_again() {
    let mut inbox = Inbox::new(Rules { max_buffered: 1, ..rules() });
    let p: Arc<str> = "p".into();
    let (c, ..) = admit(&mut inbox, &p, 1, 1, 0);
    assert_eq!(inbox.take_frame(&p, c, 1, 0, msg(0)), Taken::Delivered { count: 1, stuck: false });
    assert_eq!(inbox.take_frame(&p, c, 1, 3, msg(3)), Taken::Buffered);
    // The buffer is full: 2, then 4, are dropped.
    assert_eq!(inbox.take_frame(&p, c, 1, 4, msg(4)), Taken::Overflow);
    assert_eq!(inbox.take_frame(&p, c, 1, 2, msg(2)), Taken::Overflow);
    // 1 fills the gap below 2, which this connection dropped: stuck.
    assert_eq!(inbox.take_frame(&p, c, 1, 1, msg(1)), Taken::Delivered { count: 1, stuck: true });
    // Sent again, 2 goes, with 3 from the buffer; 4 is needed next and
    // was dropped: stuck again (any sequence between the lowest and the
    // highest dropped may be missing).
    assert_eq!(inbox.take_frame(&p, c, 1, 2, msg(2)), Taken::Delivered { count: 2, stuck: true });
    assert_eq!(inbox.take_frame(&p, c, 1, 4, msg(4)), Taken::Delivered { count: 1, stuck: false });
    // A new connection forgets what the old one dropped.
    assert_eq!(inbox.take_frame(&p, c, 1, 7, msg(7)), Taken::Buffered);
    assert_eq!(inbox.take_frame(&p, c, 1, 6, msg(6)), Taken::Overflow);
    let (c, ..) = admit(&mut inbox, &p, 1, 2, 0);
    assert_eq!(inbox.take_frame(&p, c, 2, 5, msg(5)), Taken::Delivered { count: 1, stuck: false });
}

/// A handshake at `now`: `Ok` with its connection, or the busy
/// retry-after.
fn at(inbox: &mut Inbox<()>, p: &Arc<str>, inc: u128, g: u64, now: u64) -> Result<ConnId, u64> {
    match inbox.handshake(p, inc, g, 0, None, (), now) {
        Admission::Welcome { conn, .. } => Ok(conn),
        Admission::Refused { code: CloseCode::Busy, detail, .. } => Err(detail),
        Admission::Refused { code, reason, .. } => panic!("refused with {code:?}: {reason}"),
    }
}

#[test]
fn an_unconfirmed_incarnation_goes_only_once_expired_and_never_while_connected() {
    let mut inbox = Inbox::new(Rules { incarnations: 2, producer_idle: 100, ..rules() });
    let p: Arc<str> = "p".into();
    // Two incarnations, each with a message taken and never confirmed.
    let c = at(&mut inbox, &p, 1, 1, 0).expect("admitted");
    let _ = inbox.take_frame(&p, c, 1, 0, msg(0));
    let _ = inbox.take(0);
    inbox.closed(&p, c, 510);
    let c = at(&mut inbox, &p, 2, 2, 520).expect("admitted");
    let _ = inbox.take_frame(&p, c, 2, 0, msg(0));
    let _ = inbox.take(520);
    // A third: room when incarnation 1 expires (its end plus the idle
    // time); incarnation 2, connected, never counts.
    assert_eq!(at(&mut inbox, &p, 3, 3, 600), Err(10));
    assert_eq!(inbox.counts.unconfirmed_forgotten, 0);
    let c = at(&mut inbox, &p, 3, 3, 610).expect("admitted");
    assert!(!inbox.holds(&p, 1) && inbox.holds(&p, 2) && inbox.holds(&p, 3));
    assert_eq!((inbox.counts.unconfirmed_forgotten, inbox.counts.busy), (1, 1));
    let _ = inbox.take_frame(&p, c, 3, 0, msg(0));
    let _ = inbox.take(610);
    // Incarnation 3 (unconfirmed too) connected since 610, 2 ended then
    // (fenced): long after, a fourth finds 2 expired, never 3.
    assert!(at(&mut inbox, &p, 4, 4, 5_000).is_ok());
    assert!(!inbox.holds(&p, 2) && inbox.holds(&p, 3));
    // With only the current one left to wait for: room no sooner than
    // the idle time after its end, counted from now.
    let mut inbox = Inbox::new(Rules { incarnations: 1, producer_idle: 100, ..rules() });
    let c = at(&mut inbox, &p, 1, 1, 0).expect("admitted");
    let _ = inbox.take_frame(&p, c, 1, 0, msg(0));
    let _ = inbox.take(0);
    assert_eq!(at(&mut inbox, &p, 2, 2, 500), Err(100));
}

#[test]
fn the_retry_after_counts_only_streams_that_can_expire() {
    let mut inbox = Inbox::new(Rules { incarnations: 2, producer_idle: 100, commit_on_take: false, ..rules() });
    let p: Arc<str> = "p".into();
    // Incarnation 1 ends at 5 with a delivery the application holds
    // (never forgettable meanwhile); incarnation 2 ends at 10,
    // committed and unconfirmed.
    let c = at(&mut inbox, &p, 1, 1, 0).expect("admitted");
    let _ = inbox.take_frame(&p, c, 1, 0, msg(0));
    let held = inbox.take(0).expect("queued").0;
    inbox.closed(&p, c, 5);
    let c = at(&mut inbox, &p, 2, 2, 6).expect("admitted");
    let _ = inbox.take_frame(&p, c, 2, 0, msg(0));
    let q = inbox.take(6).expect("queued").0;
    let _ = inbox.commit(&q, 6);
    inbox.closed(&p, c, 10);
    assert_eq!(at(&mut inbox, &p, 3, 3, 50), Err(60), "incarnation 2's expiry, not 1's");
    assert!(at(&mut inbox, &p, 3, 3, 110).is_ok());
    assert!(inbox.holds(&p, 1) && !inbox.holds(&p, 2), "the held delivery keeps its stream");
    let _ = inbox.commit(&held, 110);
}

#[test]
fn a_confirmed_incarnation_goes_first_and_alone() {
    let mut inbox = Inbox::new(Rules { incarnations: 2, producer_idle: 100, ..rules() });
    let p: Arc<str> = "p".into();
    // Incarnation 1: unconfirmed, expired by the time 3 comes.
    let c = at(&mut inbox, &p, 1, 1, 0).expect("admitted");
    let _ = inbox.take_frame(&p, c, 1, 0, msg(0));
    let _ = inbox.take(0);
    inbox.closed(&p, c, 0);
    // Incarnation 2: nothing taken, so confirmed.
    let c = at(&mut inbox, &p, 2, 2, 1).expect("admitted");
    inbox.closed(&p, c, 1);
    assert!(at(&mut inbox, &p, 3, 3, 100).is_ok());
    assert!(inbox.holds(&p, 1) && !inbox.holds(&p, 2) && inbox.holds(&p, 3));
    assert_eq!(inbox.counts.unconfirmed_forgotten, 0);
}

#[test]
fn with_a_durable_record_nothing_forgotten_counts_as_unconfirmed() {
    let mut inbox = Inbox::new(Rules { durable: true, producer_idle: 100, ..rules() });
    let p: Arc<str> = "p".into();
    let c = at(&mut inbox, &p, 1, 1, 0).expect("admitted");
    let _ = inbox.take_frame(&p, c, 1, 0, msg(0));
    let _ = inbox.take(0);
    inbox.closed(&p, c, 0);
    let _ = at(&mut inbox, &"q".into(), 1, 1, 100);
    assert!(!inbox.holds(&p, 1));
    assert_eq!((inbox.counts.evictions, inbox.counts.unconfirmed_forgotten), (1, 0));
}

/// A stream forgotten with a delivery still queued (found by the
/// property test once forgetting stopped dropping queued deliveries).
#[test]
fn no_stream_is_forgotten_with_a_delivery_queued() {
    super::drive::run(&[
        0, 1, 0, 1, 0, 9, 174, 0, 60, 0, 11, 0, 82, 0, 204, 0, 3, 0, 30, 0, 12, 0, 3, 0, 1, 0, 0, 0, 57, 0, 3, 0, 144,
        162, 1, 205, 0, 3, 0, 3, 0, 0, 19, 0, 0, 0, 3, 0, 99, 0, 0, 0, 0, 1, 0, 0, 0, 3, 0, 12, 0, 39, 0, 30, 0, 5, 0,
        185, 112, 79, 50, 194, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
}

/// The fuzzer's first find, a flaw of the driver's model: a handshake
/// whose `resume_from` is above a give-back covers it (the producer
/// says it was acknowledged), and an ack may then cover it too.
#[test]
fn the_driver_lets_a_resume_point_cover_a_give_back() {
    super::drive::run(&[
        1, // commit on `commit`, not on take
        0, 0, 1, 0, // a, incarnation 0, generation 1, from 0
        1, 0, 0, 1, // frame 0
        2, 0, // take it
        4, 0, // give it back
        0, 0, 2, 1, // a again, generation 2, from 1
        1, 1, 1, 1, // frame 1 on the new connection
        2, 0, // take 0 again (given back)
        2, 0, // take 1
        3, 1, // commit 1 only
        5, 0, // the first connection ends
        6, 0, // ack, forced: covers 0 and 1
    ]);
}

#[test]
fn a_producer_is_forgotten_only_once_idle_long_enough_with_nothing_uncommitted() {
    let mut inbox = Inbox::new(Rules { commit_on_take: false, producer_idle: 10, ..rules() });
    let p: Arc<str> = "p".into();
    let (c, ..) = admit(&mut inbox, &p, 1, 1, 0);
    assert!(inbox.holds(&p, 1) && !inbox.holds(&p, 2) && !inbox.holds("q", 1));
    for s in 0..2 {
        let _ = inbox.take_frame(&p, c, 1, s, msg(s));
    }
    let (first, second) = (inbox.take(0).expect("0").0, inbox.take(0).expect("1").0);
    // Its connection ends with both taken and neither committed: a
    // forgotten stream would deliver them again.
    inbox.closed(&p, c, 0);
    let newcomer = |inbox: &mut Inbox<()>, name: &str, now| {
        let _ = inbox.handshake(&name.into(), 1, 1, 0, None, (), now);
    };
    newcomer(&mut inbox, "q", 100);
    assert!(inbox.holds(&p, 1), "kept: two deliveries are not committed");
    // One committed, the other still out.
    assert!(inbox.commit(&first, 100).is_none());
    newcomer(&mut inbox, "r", 200);
    assert!(inbox.holds(&p, 1), "kept: one delivery is not committed");
    // Everything committed: idle from now, forgotten once idle long enough.
    assert!(inbox.commit(&second, 200).is_none());
    newcomer(&mut inbox, "s", 205);
    assert!(inbox.holds(&p, 1), "idle for 5 of the 10 allowed");
    newcomer(&mut inbox, "t", 210);
    assert!(!inbox.holds(&p, 1), "forgotten after 10 idle");
    assert_eq!(inbox.counts.evictions, 1);
}

#[test]
fn a_stream_forgotten_once_confirmed_comes_back_as_a_new_one_and_an_old_delivery_is_void() {
    let mut inbox = Inbox::new(Rules { commit_on_take: false, incarnations: 1, ..rules() });
    let p: Arc<str> = "p".into();
    let (c, ..) = admit(&mut inbox, &p, 1, 1, 0);
    for s in 0..3 {
        let _ = inbox.take_frame(&p, c, 1, s, msg(s));
    }
    let all = take_all(&mut inbox);
    // Given back, then taken and held: the stream waits on it.
    assert!(inbox.release(again(&all[0])));
    let held = inbox.take(0).expect("given back").0;
    assert!(matches!(inbox.handshake(&p, 2, 2, 0, None, (), 0), Admission::Refused { code: CloseCode::Busy, .. }));
    for q in [&held, &all[1], &all[2]] {
        let _ = inbox.commit(q, 0);
    }
    // Committed, but the producer never said it saw the acks: still
    // not forgettable; once it says so (resume-from 3), it is.
    assert!(matches!(inbox.handshake(&p, 2, 2, 0, None, (), 0), Admission::Refused { code: CloseCode::Busy, .. }));
    let (c, next, _) = admit(&mut inbox, &p, 1, 2, 3);
    assert_eq!(next, 3);
    inbox.closed(&p, c, 0);
    admit(&mut inbox, &p, 2, 3, 0);
    // Incarnation 1 comes back: a new stream, resumed where it says;
    // a give-back or commit of the old stream's delivery is void.
    let (c, next, _) = admit(&mut inbox, &p, 1, 4, 3);
    assert_eq!(next, 3);
    assert!(!inbox.release(again(&held)), "a give-back of the old stream is void");
    assert!(inbox.commit(&held, 0).is_none(), "and so is its commit");
    let _ = inbox.take_frame(&p, c, 4, 3, msg(3));
    let order: Vec<u64> = take_all(&mut inbox).iter().map(|g| g.sequence).collect();
    assert_eq!(order, [3], "each once, in order");
}
