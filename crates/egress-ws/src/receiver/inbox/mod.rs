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
//! Under explicit commits the application may give a delivery back (drop it
//! uncommitted): the inbox queues it again, ahead of everything else, and
//! from then on only a commit of that sequence itself covers it (a commit of
//! a later one does not), however often it is taken and given back.
//!
//! Nothing here panics on input: every number from the wire is checked, and
//! the arithmetic cannot overflow (a sequence of `u64::MAX` is refused: it
//! cannot be delivered without the watermark overflowing; a generation at or
//! above [`GENERATION_LIMIT`] is refused, and the latest generation recorded
//! for a producer id rises by at most [`MAX_GENERATION_JUMP`] per handshake:
//! one handshake must not put a producer id out of its producer's reach).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use egress_core::DeadReason;

use crate::protocol::CloseCode;

mod admission;
mod stream;

use stream::{Conn, Producer, Stream};

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
    /// How many times the application was handed this sequence before (it
    /// gave it back that many times).
    pub(crate) given_back: u32,
    /// Which [`Stream`] it came from: a stream forgotten and made again
    /// under the same key is another stream.
    pub(crate) stream: u64,
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
    /// Payload bytes per stream that may wait above a gap.
    pub(crate) max_buffered_bytes: usize,
    /// Payload bytes that may wait above gaps, all streams together.
    pub(crate) max_buffered_bytes_total: usize,
    /// Payload bytes that may wait for the application (like `queue`: at
    /// least one delivery always fits, and a filled gap may release its
    /// stream's buffered frames past it).
    pub(crate) queue_bytes: usize,
    /// Producer ids remembered at once; a new one beyond is admitted only
    /// if an idle one can be forgotten.
    pub(crate) max_producers: usize,
    /// How long (in the inbox's time unit, milliseconds) a producer id may
    /// sit idle (no connection, nothing of its streams waiting for the
    /// application) before it is forgotten.
    pub(crate) producer_idle: u64,
    /// How long a producer id must have been idle before it may be
    /// forgotten to make room for a newcomer.
    pub(crate) eviction_floor: u64,
    /// Whether the application keeps a durable record of what it committed
    /// (`ReceiverConfig::resume`): a forgotten stream is resumed from it,
    /// so forgetting one never costs exactly-once.
    pub(crate) durable: bool,
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
    /// Handshakes refused because the producer table was full of producers
    /// that could not be forgotten.
    pub(crate) busy: u64,
    /// Producer ids forgotten (idle too long, or to make room).
    pub(crate) evictions: u64,
    /// Streams forgotten (with their producer id, or as an incarnation
    /// beyond the per-id bound) while their producer had not confirmed
    /// every acknowledgement, once `producer_idle` had passed: if it comes
    /// back, what its application took since its last confirmation is
    /// delivered again (without a durable record).
    pub(crate) unconfirmed_forgotten: u64,
}

/// What an inbox holds at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) producers: usize,
    pub(crate) buffered_bytes: usize,
    pub(crate) queued: usize,
    pub(crate) queued_bytes: usize,
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
    /// `stuck`: the next sequence the stream needs is one this connection
    /// dropped above a gap (its buffer was full): the producer will not
    /// send it again on this connection, so the stream cannot go on here
    /// (close with code 5: the producer reconnects and replays from the
    /// welcome).
    Delivered { count: usize, stuck: bool },
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

/// What a delivery weighs against the byte bounds: its payload.
pub(crate) fn weight(content: &Content) -> usize {
    match content {
        Content::Message(bytes) => bytes.len(),
        Content::Skipped(_) => 0,
    }
}

/// The receiver's state. See the module docs.
#[derive(Debug)]
pub(crate) struct Inbox<W> {
    rules: Rules,
    producers: HashMap<Arc<str>, Producer<W>>,
    queue: VecDeque<Queued>,
    next_conn: u64,
    next_stream: u64,
    /// The receiver is shutting down: no more admissions.
    stopped: bool,
    /// Idle producers, by when they became idle: the order they are
    /// forgotten in.
    idle: BTreeSet<(u64, Arc<str>)>,
    /// The idle producers that may be forgotten for a newcomer (every
    /// acknowledgement confirmed, or a durable record), by when they
    /// became idle: a subset of `idle`.
    forgettable: BTreeSet<(u64, Arc<str>)>,
    /// Payload bytes buffered above gaps, all streams together.
    buffered_bytes: usize,
    /// Payload bytes in the queue.
    queued_bytes: usize,
    pub(crate) counts: Counts,
}

impl<W: Clone> Inbox<W> {
    pub(crate) fn new(rules: Rules) -> Self {
        Inbox {
            rules,
            producers: HashMap::new(),
            queue: VecDeque::new(),
            next_conn: 0,
            next_stream: 0,
            stopped: false,
            idle: BTreeSet::new(),
            forgettable: BTreeSet::new(),
            buffered_bytes: 0,
            queued_bytes: 0,
            counts: Counts::default(),
        }
    }

    /// Whether the inbox holds `producer`'s stream `incarnation` (if not, a
    /// handshake for it starts a stream, from what the application's store
    /// says if it has one).
    pub(crate) fn holds(&self, producer: &str, incarnation: u128) -> bool {
        self.producers.get(producer).is_some_and(|p| p.streams.iter().any(|(i, _)| *i == incarnation))
    }

    /// The producer of connection `conn` closed it in order, saying it
    /// holds everything from `resume_from` on (the detail of its code-0
    /// close): every acknowledgement below is confirmed. A claim above
    /// what was committed confirms only what was.
    pub(crate) fn confirm(&mut self, producer: &str, conn: ConnId, resume_from: u64) {
        if let Some((_, s)) = self.current(producer, conn) {
            s.confirmed = s.confirmed.max(resume_from.min(s.committed));
        }
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
        let (queue_len, queued_bytes, buffered_bytes) = (self.queue.len(), self.queued_bytes, self.buffered_bytes);
        let Some((c, stream)) = self.current(producer, conn) else {
            return Taken::Fenced;
        };
        if generation != c.generation {
            return Taken::Invalid(format!("a frame of generation {generation} on a connection of {}", c.generation));
        }
        if sequence == u64::MAX {
            return Taken::Invalid("sequence u64::MAX cannot be delivered".into());
        }
        let (incarnation, stream_id) = (c.incarnation, stream.id);
        if sequence < stream.next || stream.buffer.contains_key(&sequence) {
            self.counts.duplicates += 1;
            return Taken::Duplicate;
        }
        let size = weight(&content);
        if sequence > stream.next {
            // Every bound in `usize`, every sum checked: a bound of
            // `usize::MAX` must not overflow either.
            let fits = |used: usize, bound: usize| used.checked_add(size).is_some_and(|total| total <= bound);
            if stream.buffer.len() >= rules.max_buffered
                || !fits(stream.buffered_bytes, rules.max_buffered_bytes)
                || !fits(buffered_bytes, rules.max_buffered_bytes_total)
            {
                stream.dropped =
                    Some(stream.dropped.map_or((sequence, sequence), |(lo, hi)| (lo.min(sequence), hi.max(sequence))));
                self.counts.overflow += 1;
                return Taken::Overflow;
            }
            stream.buffer.insert(sequence, content);
            stream.buffered_bytes += size;
            self.buffered_bytes += size;
            return Taken::Buffered;
        }
        let room = queue_len < rules.queue
            && (queue_len == 0 || queued_bytes.checked_add(size).is_some_and(|total| total <= rules.queue_bytes));
        if !room {
            return Taken::Full(content);
        }
        // `sequence == next < u64::MAX`, so `next + 1` cannot overflow, and
        // the buffer holds only sequences above `next`.
        let mut ready = vec![(sequence, content)];
        let mut released = 0;
        stream.next = sequence + 1;
        while let Some(content) = stream.buffer.remove(&stream.next) {
            released += weight(&content);
            ready.push((stream.next, content));
            match stream.next.checked_add(1) {
                Some(n) => stream.next = n,
                None => break,
            }
        }
        stream.buffered_bytes -= released;
        // Past the highest dropped sequence (the producer sent them again):
        // nothing dropped is left. Within the range, the next one may be
        // missing: stuck (a needless reconnect at worst).
        if stream.dropped.is_some_and(|(_, hi)| hi < stream.next) {
            stream.dropped = None;
        }
        let stuck = stream.dropped.is_some_and(|(lo, _)| lo <= stream.next);
        self.buffered_bytes -= released;
        self.queued_bytes += size + released;
        let count = ready.len();
        for (sequence, content) in ready {
            let (producer, stream) = (producer.clone(), stream_id);
            self.queue.push_back(Queued { producer, incarnation, sequence, content, given_back: 0, stream });
        }
        Taken::Delivered { count, stuck }
    }

    /// Hands the oldest delivery to the application; when taking commits,
    /// commits it. Returns the connection to wake for an ack, if one may be
    /// due.
    pub(crate) fn take(&mut self, now: u64) -> Option<(Queued, Option<W>)> {
        let q = self.queue.pop_front()?;
        self.queued_bytes -= weight(&q.content);
        self.counts.taken += 1;
        if matches!(q.content, Content::Skipped(_)) {
            self.counts.skipped += 1;
        }
        let wake = if self.rules.commit_on_take { self.commit(&q, now) } else { None };
        Some((q, wake))
    }

    /// The application acknowledges delivery `q`, and with it every earlier
    /// sequence of its stream except those given back and not committed
    /// since (each needs a commit of its own). Returns the connection to
    /// wake when an ack may be due.
    pub(crate) fn commit(&mut self, q: &Queued, now: u64) -> Option<W> {
        let sequence = q.sequence;
        self.update(q, now, |s| {
            if sequence >= s.next || sequence < s.committed {
                return None;
            }
            let given_back = s.redo.remove(&sequence);
            // `sequence < next <= u64::MAX`: the add cannot overflow.
            if sequence + 1 > s.wanted {
                s.wanted = sequence + 1;
            } else if !given_back {
                return None;
            }
            Some(())
        })
    }

    /// Applies `change` to the stream delivery `q` came from (not to one
    /// made since under the same key), then raises its committed watermark
    /// as far as allowed; returns the connection to wake when an ack may
    /// be due (the first commit since its last ack, to start its timer, and
    /// every commit from `ack_every` unacknowledged on).
    fn update(&mut self, q: &Queued, now: u64, change: impl FnOnce(&mut Stream) -> Option<()>) -> Option<W> {
        let ack_every = self.rules.ack_every.max(1);
        let p = self.producers.get_mut(&q.producer)?;
        let s = p.stream(q.incarnation).filter(|s| s.id == q.stream)?;
        change(s)?;
        let before = s.committed;
        if !s.settle() {
            return None;
        }
        let after = s.committed;
        let Some(c) = p.conn.as_ref() else {
            // A producer without a connection may be idle now.
            self.maybe_idle(&q.producer, now);
            return None;
        };
        if c.incarnation != q.incarnation {
            return None;
        }
        let (was, unacked) = (before.saturating_sub(c.acked), after.saturating_sub(c.acked));
        (was == 0 || unacked >= ack_every).then(|| c.wake.clone())
    }

    /// The application gave back a delivery it took without committing it:
    /// it is queued again, among the others given back at the front of the
    /// queue, after those of its stream with lower sequences and before
    /// those with higher ones; until a commit of it, nothing covers it.
    /// Returns whether it was queued (not if a commit covered it already,
    /// or its stream is gone: then its producer still holds it and replays
    /// it).
    pub(crate) fn release(&mut self, q: Queued) -> bool {
        let Some(p) = self.producers.get_mut(&q.producer) else { return false };
        let Some(s) = p.stream(q.incarnation) else { return false };
        if s.id != q.stream || q.sequence < s.committed || q.sequence >= s.next {
            return false;
        }
        s.redo.insert(q.sequence);
        self.counts.released += 1;
        // Its stream waits for the application again: its producer is not
        // idle (nor forgettable) until that is committed.
        if let Some(since) = p.idle_since.take() {
            let key = (since, q.producer.clone());
            self.idle.remove(&key);
            self.forgettable.remove(&key);
        }
        let same = |o: &Queued| o.stream == q.stream;
        let mut at = 0;
        for (i, o) in self.queue.iter().enumerate() {
            if o.given_back == 0 || (same(o) && o.sequence > q.sequence) {
                break;
            }
            if same(o) {
                at = i + 1;
            }
        }
        self.queued_bytes += weight(&q.content);
        self.queue.insert(at, Queued { given_back: q.given_back.saturating_add(1), ..q });
        true
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

    /// Connection `conn` ended at `now`: if it was its producer's current
    /// one, its out-of-order frames go (the producer replays them), and the
    /// producer may be idle.
    pub(crate) fn closed(&mut self, producer: &Arc<str>, conn: ConnId, now: u64) {
        let Some(p) = self.producers.get_mut(producer) else { return };
        if p.conn.as_ref().is_some_and(|c| c.id == conn) {
            let incarnation = p.conn.take().map(|c| c.incarnation);
            if let Some(s) = incarnation.and_then(|i| p.stream(i)) {
                self.buffered_bytes -= s.clear_buffer();
                s.ended = now;
            }
            self.maybe_idle(producer, now);
            self.forget_idle(now);
        }
    }

    /// What the inbox holds now, for the receiver's stats.
    pub(crate) fn held(&self) -> Held {
        Held {
            producers: self.producers.len(),
            buffered_bytes: self.buffered_bytes,
            queued: self.queue.len(),
            queued_bytes: self.queued_bytes,
        }
    }

    /// Stops admitting connections, and returns every admitted one's wake
    /// handle, to close them all: a connection whose handshake is still on
    /// its way is refused when it arrives.
    pub(crate) fn stop(&mut self) -> Vec<W> {
        self.stopped = true;
        self.producers.values().filter_map(|p| p.conn.as_ref().map(|c| c.wake.clone())).collect()
    }

    /// The next sequence the most recently admitted stream of `producer`
    /// will take.
    pub(crate) fn next_for(&self, producer: &str) -> Option<u64> {
        self.producers.get(producer)?.streams.last().map(|(_, s)| s.next)
    }
}

/// The inbox driven by arbitrary bytes, with its invariants checked after
/// every step: for cargo-fuzz (`fuzz/fuzz_targets/inbox.rs`, feature
/// `fuzzing`) and the property test in `tests.rs`, which run the same driver.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod drive;

#[cfg(test)]
mod tests;
