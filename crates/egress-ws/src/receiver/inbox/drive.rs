//! The inbox driven by arbitrary bytes (see `mod.rs`).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use egress_core::DeadReason;

use super::{Admission, ConnId, Content, Inbox, Queued, Rules, Taken, weight};
use crate::protocol::GENERATION_LIMIT;

/// What the driver knows of one stream (by its inbox id).
#[derive(Default)]
struct Seen {
    /// The highest sequence handed over fresh (not given back before).
    last_fresh: Option<u64>,
    /// Given back, not committed since: no ack may cover one.
    outstanding: BTreeSet<u64>,
}

/// Runs the operations `data` encodes; panics if an invariant breaks.
pub(crate) fn run(data: &[u8]) {
    let mut bytes = data.iter().copied();
    let mut next = move || bytes.next();
    let Some(mode) = next() else { return };
    let rules = Rules {
        max_buffered: 4,
        queue: 6,
        incarnations: 2,
        commit_on_take: mode & 1 == 0,
        ack_every: 2,
        max_buffered_bytes: 40,
        max_buffered_bytes_total: 100,
        queue_bytes: 60,
        max_producers: 3,
        producer_idle: 50,
        eviction_floor: 5,
        durable: mode & 2 != 0,
    };
    let names: [Arc<str>; 4] = ["a".into(), "b".into(), "c".into(), "d".into()];
    let mut inbox: Inbox<u8> = Inbox::new(rules);
    let mut now = 0u64;
    let mut conns: Vec<(Arc<str>, ConnId, u64)> = Vec::new();
    let mut held: Vec<Queued> = Vec::new();
    let mut seen: HashMap<u64, Seen> = HashMap::new();
    while let (Some(op), Some(arg)) = (next(), next()) {
        let pick = |n: usize| usize::from(arg) % n.max(1);
        let before = promises(&inbox);
        match op % 9 {
            0 => {
                let producer = names[pick(4)].clone();
                let generation = match next().unwrap_or(0) {
                    250 => GENERATION_LIMIT,
                    251 => u64::MAX,
                    252 => GENERATION_LIMIT - 1,
                    g => u64::from(g),
                };
                let resume_from = match next().unwrap_or(0) {
                    255 => u64::MAX,
                    r => u64::from(r % 16),
                };
                let incarnation = u128::from(arg % 3);
                // What an application's durable log might say.
                let stored = next().filter(|b| b & 1 == 1).map(|b| u64::from(b >> 1) % 16);
                if let Admission::Welcome { conn, next, received, .. } =
                    inbox.handshake(&producer, incarnation, generation, resume_from, stored, 0, now)
                {
                    assert!(next <= received, "welcome: next {next} above received {received}");
                    // The producer says everything below `resume_from`
                    // was acknowledged: give-backs there are covered by
                    // its word, not by a commit.
                    let stream = inbox.producers[&producer].streams.iter().find(|(i, _)| *i == incarnation);
                    if let Some((_, s)) = stream
                        && let Some(seen) = seen.get_mut(&s.id)
                    {
                        seen.outstanding = seen.outstanding.split_off(&resume_from);
                    }
                    conns.push((producer, conn, generation));
                }
            }
            1 if !conns.is_empty() => {
                let (producer, conn, generation) = conns[pick(conns.len())].clone();
                let sequence = match next().unwrap_or(0) {
                    255 => u64::MAX,
                    s => u64::from(s % 24),
                };
                let len = usize::from(next().unwrap_or(0) % 32);
                let content = if len == 31 {
                    Content::Skipped(DeadReason::Replays)
                } else {
                    Content::Message(Bytes::from(vec![0u8; len]))
                };
                let generation = if op & 0x80 != 0 { generation.wrapping_add(1) } else { generation };
                if let Taken::Full(back) = inbox.take_frame(&producer, conn, generation, sequence, content.clone()) {
                    assert_eq!(back, content, "a refused frame is handed back whole");
                }
            }
            2 => {
                if let Some((q, _)) = inbox.take(now) {
                    let s = seen.entry(q.stream).or_default();
                    if q.given_back == 0 {
                        assert!(s.last_fresh.is_none_or(|l| q.sequence > l), "handed over twice or out of order");
                        s.last_fresh = Some(q.sequence);
                    }
                    if !rules.commit_on_take {
                        held.push(q);
                    }
                }
            }
            3 if !held.is_empty() => {
                let q = held.swap_remove(pick(held.len()));
                let _ = inbox.commit(&q, now);
                seen.entry(q.stream).or_default().outstanding.remove(&q.sequence);
            }
            4 if !held.is_empty() => {
                let q = held.swap_remove(pick(held.len()));
                let (stream, sequence) = (q.stream, q.sequence);
                if inbox.release(q) {
                    seen.entry(stream).or_default().outstanding.insert(sequence);
                }
            }
            5 if !conns.is_empty() => {
                let (producer, conn, _) = conns.swap_remove(pick(conns.len()));
                inbox.closed(&producer, conn, now);
            }
            6 if !conns.is_empty() => {
                let (producer, conn, _) = conns[pick(conns.len())].clone();
                if let Some((_, through)) = inbox.poll_ack(&producer, conn, arg & 1 == 0) {
                    let stream = inbox.producers[&producer].conn.as_ref().map(|c| c.incarnation);
                    let id = stream.and_then(|i| inbox.producers[&producer].streams.iter().find(|(j, _)| *j == i));
                    if let Some((_, s)) = id
                        && let Some(seen) = seen.get(&s.id)
                    {
                        assert!(seen.outstanding.range(..=through).next().is_none(), "an ack covers a give-back");
                    }
                }
            }
            7 => now = now.saturating_add(u64::from(arg)),
            _ => {
                let _ = inbox.unacked(&names[pick(4)], ConnId(u64::from(arg)));
            }
        }
        check(&inbox, &rules);
        // A stream goes only once its producer confirmed every
        // acknowledgement, or with a durable record, or past
        // `producer_idle` without a connection.
        let after = promises(&inbox);
        for (id, (confirmed, ended)) in before {
            if !after.contains_key(&id) {
                let expired = ended.saturating_add(rules.producer_idle) <= now;
                assert!(rules.durable || confirmed || expired, "stream {id} forgotten with an unconfirmed ack");
            }
        }
    }
}

/// Each stream's id: whether its producer confirmed every
/// acknowledgement, and since when it has been without a connection
/// (now for the connected ones).
fn promises(inbox: &Inbox<u8>) -> HashMap<u64, (bool, u64)> {
    let mut all = HashMap::new();
    for p in inbox.producers.values() {
        let current = p.conn.as_ref().map(|c| c.incarnation);
        for (i, s) in &p.streams {
            let ended = if Some(*i) == current { u64::MAX } else { s.ended };
            all.insert(s.id, (s.confirmed(), ended));
        }
    }
    all
}

/// The inbox's own bookkeeping agrees with what it holds, within its
/// bounds.
fn check(inbox: &Inbox<u8>, rules: &Rules) {
    let mut buffered = 0;
    for p in inbox.producers.values() {
        assert!(p.streams.len() <= rules.incarnations);
        for (incarnation, s) in &p.streams {
            let current = p.conn.as_ref().is_some_and(|c| c.incarnation == *incarnation);
            assert!(current || s.buffer.is_empty(), "only the current connection's stream buffers");
            let bytes: usize = s.buffer.values().map(weight).sum();
            assert_eq!(bytes, s.buffered_bytes, "a stream's buffered bytes");
            assert!(s.buffer.len() <= rules.max_buffered && bytes <= rules.max_buffered_bytes);
            assert!(s.buffer.keys().all(|&k| k > s.next), "buffered above next only");
            assert!(s.committed <= s.next && s.committed <= s.wanted.max(s.committed));
            assert!(s.redo.iter().all(|&r| r >= s.committed && r < s.next), "give-backs within the stream");
            buffered += bytes;
        }
        assert_eq!(
            p.idle_since.is_some(),
            inbox.idle.iter().any(|(_, q)| inbox.producers.get(q).is_some_and(|x| std::ptr::eq(x, p)))
        );
    }
    assert_eq!(buffered, inbox.buffered_bytes, "buffered bytes, all streams");
    assert!(buffered <= rules.max_buffered_bytes_total);
    let queued: usize = inbox.queue.iter().map(|q| weight(&q.content)).sum();
    assert_eq!(queued, inbox.queued_bytes, "queued bytes");
    assert!(inbox.producers.len() <= rules.max_producers);
    assert!(inbox.idle.iter().all(|(_, p)| inbox.producers.contains_key(p)), "the idle index names held producers");
    assert!(inbox.forgettable.is_subset(&inbox.idle), "only idle producers are forgettable");
    for p in inbox.producers.values() {
        assert!(p.idle_since.is_none() || p.idle(), "a producer listed idle is idle");
    }
    for q in &inbox.queue {
        let stream = inbox.producers.get(&q.producer).and_then(|p| p.streams.iter().find(|(i, _)| *i == q.incarnation));
        assert!(stream.is_some_and(|(_, s)| s.id == q.stream), "a queued delivery's stream is held");
    }
    for (_, name) in &inbox.forgettable {
        let p = &inbox.producers[name];
        assert!(rules.durable || p.confirmed(), "a forgettable producer confirmed every acknowledgement");
    }
}
