//! The receiver's state, without I/O: who is connected under which
//! generation, each stream's watermarks and out-of-order buffer, the queue
//! of deliveries waiting for the application, and when to acknowledge.
//!
//! Every input is a call that returns what to do (a welcome or a refusal,
//! whether a frame was taken, which connection to wake); the connection
//! tasks in `mod.rs` do the I/O. The wake handle `W` is whatever those tasks
//! use to signal a connection (tests use `()`).
//!
//! A stream is keyed by producer id and incarnation. Its state:
//!
//! ```text
//!   committed ≤ next              the application acknowledged every sequence below
//!   │           │                 `committed`, and was handed (or queued) every one
//!   ▼           ▼                 below `next`; frames above `next` wait in `buffer`
//!   ──────────────┬───────────▶   until the gap fills (freed when their connection ends)
//! ```
//!
//! Nothing here panics on input: every number from the wire is checked, and
//! the arithmetic cannot overflow (a sequence of `u64::MAX` is refused: it
//! cannot be delivered without the watermark overflowing).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use egress_core::DeadReason;

use crate::protocol::CloseCode;

/// What a delivery carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// The application's bytes.
    Message(Bytes),
    /// The producer gave up on this sequence (a dead letter): there is no
    /// message, and the stream goes on past it.
    Skipped(DeadReason),
}

/// A connection, as the inbox knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ConnId(u64);

/// A delivery waiting in the queue for the application.
#[derive(Debug)]
pub(crate) struct Queued {
    pub(crate) producer: Arc<str>,
    pub(crate) incarnation: u128,
    pub(crate) sequence: u64,
    pub(crate) content: Content,
    /// The stream's epoch when it was queued (see [`Inbox::release`]).
    pub(crate) epoch: u64,
}

/// The bounds and rules the inbox applies.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rules {
    /// Frames per stream that may wait above a gap.
    pub(crate) max_buffered: usize,
    /// Deliveries that may wait for the application before in-order frames
    /// are refused as `Full` (frames released from a stream's buffer by a
    /// filled gap may go past it, by at most `max_buffered`).
    pub(crate) queue: usize,
    /// Incarnations remembered per producer id (least recently admitted
    /// forgotten first).
    pub(crate) incarnations: usize,
    /// Whether taking a delivery acknowledges it.
    pub(crate) commit_on_take: bool,
    /// Acknowledge once this many commits are unacknowledged.
    pub(crate) ack_every: u64,
}

/// Counters of what the inbox has seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) taken: u64,
    pub(crate) skipped: u64,
    pub(crate) duplicates: u64,
    pub(crate) overflow: u64,
    pub(crate) connections: u64,
    pub(crate) fenced: u64,
    pub(crate) refused: u64,
    pub(crate) released: u64,
}

/// What a handshake came to.
#[derive(Debug)]
pub(crate) enum Admission<W> {
    /// Admitted: send a welcome with these watermarks; `fenced` was the
    /// producer's connection until now, which must close.
    Welcome { conn: ConnId, next: u64, received: u64, fenced: Option<W> },
    /// Refused: close with this code.
    Refused { code: CloseCode, detail: u64, reason: String },
}

/// What became of a data or tombstone frame.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// It, and `count - 1` buffered frames after it, went to the queue.
    Delivered { count: usize },
    /// It waits above a gap.
    Buffered,
    /// Already received: dropped.
    Duplicate,
    /// Above a gap with the buffer full: dropped (the producer replays it).
    Overflow,
    /// The queue is full: not taken, and handed back. Offer it again when
    /// there is room (the connection stops reading meanwhile:
    /// backpressure).
    Full(Content),
    /// The connection was fenced by a newer one.
    Fenced,
    /// A protocol error: close the connection.
    Invalid(String),
}

/// One stream: a producer's sequence space.
#[derive(Debug, Default)]
struct Stream {
    next: u64,
    committed: u64,
    buffer: BTreeMap<u64, Content>,
    /// Bumped when the stream rewinds; releases of an older epoch are void.
    epoch: u64,
}

#[derive(Debug)]
struct Conn<W> {
    id: ConnId,
    incarnation: u128,
    generation: u64,
    wake: W,
    /// The `committed` value last acknowledged on this connection.
    acked: u64,
}

#[derive(Debug)]
struct Producer<W> {
    /// The highest generation admitted.
    generation: u64,
    conn: Option<Conn<W>>,
    /// The streams, least recently admitted first.
    streams: Vec<(u128, Stream)>,
}

impl<W> Producer<W> {
    fn stream(&mut self, incarnation: u128) -> Option<&mut Stream> {
        self.streams.iter_mut().find(|(i, _)| *i == incarnation).map(|(_, s)| s)
    }
}

/// The receiver's state. See the module docs.
#[derive(Debug)]
pub(crate) struct Inbox<W> {
    rules: Rules,
    producers: HashMap<Arc<str>, Producer<W>>,
    queue: VecDeque<Queued>,
    next_conn: u64,
    pub(crate) counts: Counts,
}

impl<W: Clone> Inbox<W> {
    pub(crate) fn new(rules: Rules) -> Self {
        Inbox { rules, producers: HashMap::new(), queue: VecDeque::new(), next_conn: 0, counts: Counts::default() }
    }

    /// A producer's handshake: admits it under `generation` (fencing its
    /// previous connection) or refuses it.
    pub(crate) fn handshake(
        &mut self,
        producer: &Arc<str>,
        incarnation: u128,
        generation: u64,
        resume_from: u64,
        wake: W,
    ) -> Admission<W> {
        let rules = self.rules;
        let entry = self.producers.entry(producer.clone()).or_insert_with(|| Producer {
            generation: 0,
            conn: None,
            streams: Vec::new(),
        });
        let known = entry.conn.is_some() || !entry.streams.is_empty();
        if known && generation <= entry.generation {
            self.counts.refused += 1;
            return Admission::Refused {
                code: CloseCode::StaleGeneration,
                detail: entry.generation,
                reason: format!("generation {generation} is not above {}", entry.generation),
            };
        }
        entry.generation = generation;
        let fenced = entry.conn.take().map(|old| {
            self.counts.fenced += 1;
            // The old connection's out-of-order frames go with it.
            if let Some(s) = entry.stream(old.incarnation) {
                s.buffer.clear();
            }
            old.wake
        });
        // Most recently admitted last; the least recent beyond the bound
        // are forgotten.
        let index = entry.streams.iter().position(|(i, _)| *i == incarnation);
        let mut stream = match index {
            Some(i) => entry.streams.remove(i).1,
            None => Stream { next: resume_from, committed: resume_from, buffer: BTreeMap::new(), epoch: 0 },
        };
        // Everything below `resume_from` was acknowledged to the producer,
        // which no longer holds it: never wait for it.
        if resume_from > stream.next {
            stream.next = resume_from;
            stream.buffer = stream.buffer.split_off(&resume_from);
        }
        stream.committed = stream.committed.max(resume_from);
        let (next, received) = (stream.committed, stream.next);
        entry.streams.push((incarnation, stream));
        let excess = entry.streams.len().saturating_sub(rules.incarnations.max(1));
        entry.streams.drain(..excess);
        let conn = ConnId(self.next_conn);
        self.next_conn = self.next_conn.wrapping_add(1);
        entry.conn = Some(Conn { id: conn, incarnation, generation, wake, acked: next });
        self.counts.connections += 1;
        Admission::Welcome { conn, next, received, fenced }
    }

    /// The current connection of `producer`, if it is `conn`.
    fn current(&mut self, producer: &str, conn: ConnId) -> Option<(&mut Conn<W>, &mut Stream)> {
        let p = self.producers.get_mut(producer)?;
        let c = p.conn.as_mut().filter(|c| c.id == conn)?;
        let incarnation = c.incarnation;
        let s = p.streams.iter_mut().find(|(i, _)| *i == incarnation).map(|(_, s)| s)?;
        Some((c, s))
    }

    /// A data frame (`Content::Message`) or a tombstone (`Content::Skipped`)
    /// on connection `conn` of `producer`.
    pub(crate) fn take_frame(
        &mut self,
        producer: &Arc<str>,
        conn: ConnId,
        generation: u64,
        sequence: u64,
        content: Content,
    ) -> Taken {
        let rules = self.rules;
        let queue_len = self.queue.len();
        let Some((c, stream)) = self.current(producer, conn) else {
            return Taken::Fenced;
        };
        if generation != c.generation {
            return Taken::Invalid(format!("a frame of generation {generation} on a connection of {}", c.generation));
        }
        if sequence == u64::MAX {
            return Taken::Invalid("sequence u64::MAX cannot be delivered".into());
        }
        let incarnation = c.incarnation;
        if sequence < stream.next || stream.buffer.contains_key(&sequence) {
            self.counts.duplicates += 1;
            return Taken::Duplicate;
        }
        if sequence > stream.next {
            if stream.buffer.len() >= rules.max_buffered {
                self.counts.overflow += 1;
                return Taken::Overflow;
            }
            stream.buffer.insert(sequence, content);
            return Taken::Buffered;
        }
        if queue_len >= rules.queue {
            return Taken::Full(content);
        }
        // `sequence == next < u64::MAX`, so `next + 1` cannot overflow, and
        // the buffer holds only sequences above `next`.
        let mut ready = vec![(sequence, content)];
        stream.next = sequence + 1;
        while let Some(content) = stream.buffer.remove(&stream.next) {
            ready.push((stream.next, content));
            match stream.next.checked_add(1) {
                Some(n) => stream.next = n,
                None => break,
            }
        }
        let epoch = stream.epoch;
        let count = ready.len();
        for (sequence, content) in ready {
            self.queue.push_back(Queued { producer: producer.clone(), incarnation, sequence, content, epoch });
        }
        Taken::Delivered { count }
    }

    /// How many deliveries are waiting.
    pub(crate) fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Hands the oldest delivery to the application; when taking commits,
    /// commits it, and returns the connection to wake for an ack.
    pub(crate) fn take(&mut self) -> Option<(Queued, Option<W>)> {
        let q = self.queue.pop_front()?;
        self.counts.taken += 1;
        if matches!(q.content, Content::Skipped(_)) {
            self.counts.skipped += 1;
        }
        let wake = if self.rules.commit_on_take { self.commit(&q.producer, q.incarnation, q.sequence) } else { None };
        Some((q, wake))
    }

    /// The application acknowledges `sequence` of a stream, and with it
    /// every sequence below. Returns the connection to wake when an ack may
    /// be due (the first commit since its last ack, to start its timer, and
    /// every commit from `ack_every` unacknowledged on).
    pub(crate) fn commit(&mut self, producer: &str, incarnation: u128, sequence: u64) -> Option<W> {
        let ack_every = self.rules.ack_every.max(1);
        let p = self.producers.get_mut(producer)?;
        let s = p.stream(incarnation)?;
        if sequence >= s.next || sequence < s.committed {
            return None;
        }
        let before = s.committed;
        // `sequence < next <= u64::MAX`: the add cannot overflow.
        s.committed = sequence + 1;
        let after = s.committed;
        let c = p.conn.as_ref().filter(|c| c.incarnation == incarnation)?;
        let (was, now) = (before.saturating_sub(c.acked), after.saturating_sub(c.acked));
        (was == 0 || now >= ack_every).then(|| c.wake.clone())
    }

    /// The application gave back a delivery it took without committing it:
    /// the stream rewinds to `sequence` (if the delivery is of the current
    /// epoch and not committed) so that the producer's replay delivers it
    /// again, and the queued deliveries of the stream from `sequence` on
    /// are dropped. Returns the connection to close with `Retry`.
    pub(crate) fn release(&mut self, producer: &str, incarnation: u128, sequence: u64, epoch: u64) -> Option<W> {
        let p = self.producers.get_mut(producer)?;
        let s = p.stream(incarnation)?;
        if s.epoch != epoch || sequence < s.committed || sequence >= s.next {
            return None;
        }
        s.next = sequence;
        s.buffer.clear();
        s.epoch = s.epoch.wrapping_add(1);
        self.counts.released += 1;
        self.queue.retain(|q| !(&*q.producer == producer && q.incarnation == incarnation && q.sequence >= sequence));
        p.conn.as_ref().filter(|c| c.incarnation == incarnation).map(|c| c.wake.clone())
    }

    /// The ack connection `conn` should send now, if any: the generation and
    /// the watermark. `force` sends whatever is unacknowledged; otherwise
    /// only once `ack_every` commits are.
    pub(crate) fn poll_ack(&mut self, producer: &str, conn: ConnId, force: bool) -> Option<(u64, u64)> {
        let ack_every = self.rules.ack_every.max(1);
        let (c, s) = self.current(producer, conn)?;
        let unacked = s.committed.saturating_sub(c.acked);
        if unacked == 0 || (!force && unacked < ack_every) {
            return None;
        }
        c.acked = s.committed;
        // `committed > acked >= 0`, so `committed - 1` cannot underflow.
        Some((c.generation, s.committed - 1))
    }

    /// Whether connection `conn` has commits it has not acknowledged.
    pub(crate) fn unacked(&mut self, producer: &str, conn: ConnId) -> bool {
        self.current(producer, conn).is_some_and(|(c, s)| s.committed > c.acked)
    }

    /// Connection `conn` ended: if it was its producer's current one, its
    /// out-of-order frames go (the producer replays them).
    pub(crate) fn closed(&mut self, producer: &str, conn: ConnId) {
        let Some(p) = self.producers.get_mut(producer) else { return };
        if p.conn.as_ref().is_some_and(|c| c.id == conn) {
            let incarnation = p.conn.take().map(|c| c.incarnation);
            if let Some(s) = incarnation.and_then(|i| p.stream(i)) {
                s.buffer.clear();
            }
        }
    }

    /// Every connection's wake handle, to close them all.
    pub(crate) fn connections(&self) -> Vec<W> {
        self.producers.values().filter_map(|p| p.conn.as_ref().map(|c| c.wake.clone())).collect()
    }

    /// The next sequence the most recently admitted stream of `producer`
    /// will take.
    pub(crate) fn next_for(&self, producer: &str) -> Option<u64> {
        self.producers.get(producer)?.streams.last().map(|(_, s)| s.next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Rules {
        Rules { max_buffered: 4, queue: 8, incarnations: 2, commit_on_take: true, ack_every: 2 }
    }

    fn msg(i: u64) -> Content {
        Content::Message(Bytes::from(i.to_string()))
    }

    fn admit(inbox: &mut Inbox<()>, p: &Arc<str>, inc: u128, g: u64, resume: u64) -> (ConnId, u64, u64) {
        match inbox.handshake(p, inc, g, resume, ()) {
            Admission::Welcome { conn, next, received, .. } => (conn, next, received),
            Admission::Refused { reason, .. } => panic!("refused: {reason}"),
        }
    }

    fn taken(inbox: &mut Inbox<()>) -> Vec<(u128, u64)> {
        std::iter::from_fn(|| inbox.take()).map(|(q, _)| (q.incarnation, q.sequence)).collect()
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
        assert_eq!(inbox.take_frame(&p, c, 1, 0, msg(0)), Taken::Delivered { count: 2 });
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
            assert_eq!(inbox.take_frame(&p, c, 5, s, msg(s)), Taken::Delivered { count: 1 });
        }
        let _ = taken(&mut inbox);
        // A restarted producer: new incarnation, generation 1.
        match inbox.handshake(&p, 2, 1, 0, ()) {
            Admission::Refused { code: CloseCode::StaleGeneration, detail, .. } => assert_eq!(detail, 5),
            other => panic!("expected a refusal, got {other:?}"),
        }
        let (c2, next, received) = admit(&mut inbox, &p, 2, 6, 0);
        assert_eq!((next, received), (0, 0), "its own sequence space, from 0");
        assert_eq!(inbox.take_frame(&p, c, 5, 3, msg(3)), Taken::Fenced);
        assert_eq!(inbox.take_frame(&p, c2, 6, 0, msg(0)), Taken::Delivered { count: 1 });
        assert_eq!(taken(&mut inbox), [(2, 0)]);
        // The first incarnation is remembered: it resumes where it was.
        let (_, next, received) = admit(&mut inbox, &p, 1, 7, 0);
        assert_eq!((next, received), (3, 3));
    }

    #[test]
    fn hostile_numbers_are_refused_without_panicking() {
        let mut inbox = Inbox::new(rules());
        let p: Arc<str> = "p".into();
        let (c, next, _) = admit(&mut inbox, &p, 1, u64::MAX, u64::MAX);
        assert_eq!(next, u64::MAX);
        assert!(matches!(inbox.take_frame(&p, c, u64::MAX, u64::MAX, msg(0)), Taken::Invalid(_)));
        assert_eq!(inbox.take_frame(&p, c, u64::MAX, 3, msg(3)), Taken::Duplicate);
        assert!(matches!(inbox.take_frame(&p, c, 1, 3, msg(3)), Taken::Invalid(_)));
        assert!(matches!(inbox.handshake(&p, 1, u64::MAX, 0, ()), Admission::Refused { .. }));
        // The last deliverable sequence is u64::MAX - 1.
        let q: Arc<str> = "q".into();
        let (c, ..) = admit(&mut inbox, &q, 1, 1, u64::MAX - 1);
        assert_eq!(inbox.take_frame(&q, c, 1, u64::MAX - 1, msg(0)), Taken::Delivered { count: 1 });
        assert_eq!(inbox.next_for("q"), Some(u64::MAX));
    }

    #[test]
    fn a_full_queue_refuses_in_order_frames_and_a_full_buffer_drops_out_of_order_ones() {
        let mut inbox = Inbox::new(Rules { queue: 2, max_buffered: 1, ..rules() });
        let p: Arc<str> = "p".into();
        let (c, ..) = admit(&mut inbox, &p, 1, 1, 0);
        assert_eq!(inbox.take_frame(&p, c, 1, 0, msg(0)), Taken::Delivered { count: 1 });
        assert_eq!(inbox.take_frame(&p, c, 1, 1, msg(1)), Taken::Delivered { count: 1 });
        assert_eq!(inbox.take_frame(&p, c, 1, 2, msg(2)), Taken::Full(msg(2)));
        assert_eq!(inbox.take_frame(&p, c, 1, 4, msg(4)), Taken::Buffered);
        assert_eq!(inbox.take_frame(&p, c, 1, 5, msg(5)), Taken::Overflow);
        let _ = inbox.take();
        assert_eq!(inbox.take_frame(&p, c, 1, 2, msg(2)), Taken::Delivered { count: 1 });
        // The buffer goes with its connection.
        inbox.closed(&p, c);
        let (c, _, received) = admit(&mut inbox, &p, 1, 2, 0);
        assert_eq!(received, 3);
        assert_eq!(inbox.take_frame(&p, c, 2, 3, msg(3)), Taken::Full(msg(3)));
    }

    #[test]
    fn explicit_commits_and_a_release_rewinds_the_stream() {
        let mut inbox = Inbox::new(Rules { commit_on_take: false, ..rules() });
        let p: Arc<str> = "p".into();
        let (c, ..) = admit(&mut inbox, &p, 1, 1, 0);
        for s in 0..5 {
            let _ = inbox.take_frame(&p, c, 1, s, msg(s));
        }
        let got: Vec<Queued> = std::iter::from_fn(|| inbox.take().map(|(q, _)| q)).take(3).collect();
        assert_eq!(inbox.poll_ack(&p, c, true), None, "taken is not committed");
        // A commit that jumps (0 and 1 at once) still wakes the connection.
        assert!(inbox.commit(&p, 1, got[1].sequence).is_some(), "the first commit since an ack wakes");
        assert!(inbox.commit(&p, 1, got[0].sequence).is_none(), "an older commit is void");
        assert_eq!(inbox.poll_ack(&p, c, true), Some((1, 1)));
        // Sequence 2 is given back: it and the queued 3, 4 go; the stream
        // waits for 2 again.
        assert!(inbox.release(&p, 1, 2, got[2].epoch).is_some());
        assert_eq!(inbox.queued(), 0);
        assert_eq!(inbox.take_frame(&p, c, 1, 3, msg(3)), Taken::Buffered);
        assert_eq!(inbox.take_frame(&p, c, 1, 2, msg(2)), Taken::Delivered { count: 2 });
        // A release of the old epoch, or of something committed, is void.
        assert!(inbox.release(&p, 1, 2, got[2].epoch).is_none());
        assert!(inbox.release(&p, 1, 0, got[0].epoch.wrapping_add(1)).is_none());
        assert_eq!(inbox.counts.released, 1);
    }
}
