//! Admission: a handshake admitted or refused, the bounds on producers and
//! streams it meets, and the forgetting of idle producers and old
//! incarnations that makes room.

use std::sync::Arc;

use super::{Admission, Conn, ConnId, Inbox, Producer, Rules, Stream, weight};
use crate::protocol::{CloseCode, GENERATION_LIMIT, MAX_GENERATION_JUMP};

/// Why a handshake must wait: the bound it met, and when room may be made
/// (in milliseconds from now; 0 when nothing foreseeable frees it).
struct Full {
    what: String,
    retry_after: u64,
}

impl<W: Clone> Inbox<W> {
    /// A producer's handshake at time `now`: admits it under `generation`
    /// (fencing its previous connection) or refuses it. A stream it starts
    /// begins at `resume_from`, or at `stored` if that is above: where the
    /// application's durable log says the stream goes on.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn handshake(
        &mut self,
        producer: &Arc<str>,
        incarnation: u128,
        generation: u64,
        resume_from: u64,
        stored: Option<u64>,
        wake: W,
        now: u64,
    ) -> Admission<W> {
        let rules = self.rules;
        if self.stopped {
            return Admission::Refused {
                code: CloseCode::Normal,
                detail: 0,
                reason: "the receiver is shutting down".into(),
            };
        }
        if generation >= GENERATION_LIMIT {
            self.counts.refused += 1;
            return Admission::Refused {
                code: CloseCode::Protocol,
                detail: 0,
                reason: format!("generation {generation} is not below 2^63"),
            };
        }
        self.forget_idle(now);
        let known = self.producers.get(producer).map(|p| (p.conn.is_some() || !p.streams.is_empty(), p.generation));
        if let Some((true, latest)) = known
            && generation <= latest
        {
            self.counts.refused += 1;
            return Admission::Refused {
                code: CloseCode::StaleGeneration,
                detail: latest,
                reason: format!("generation {generation} is not above {latest}"),
            };
        }
        // Room for it: a new producer id needs a place in the table, a new
        // incarnation a place among its id's streams. Checked before
        // anything changes: a refusal leaves the inbox as it was.
        let room = match self.producers.get(producer) {
            Some(p) => Self::room_for_stream(&rules, p, incarnation, now),
            None => self.room_for_producer(now).map(|()| (Vec::new(), 0)),
        };
        let (forgotten, expired) = match room {
            Ok(plan) => plan,
            Err(full) => {
                self.counts.busy += 1;
                return Admission::Refused { code: CloseCode::Busy, detail: full.retry_after, reason: full.what };
            }
        };
        let entry = self.producers.entry(producer.clone()).or_insert_with(|| Producer {
            generation: 0,
            conn: None,
            streams: Vec::new(),
            idle_since: None,
        });
        if let Some(since) = entry.idle_since.take() {
            self.idle.remove(&(since, producer.clone()));
            self.forgettable.remove(&(since, producer.clone()));
        }
        let known = entry.conn.is_some() || !entry.streams.is_empty();
        // Recorded as the latest, but at most MAX_GENERATION_JUMP above the
        // one before: a handshake far above (a squatter's) cannot put the
        // id out of its producer's reach, which follows a stale refusal by
        // at most that much per round trip.
        let floor = if known { entry.generation } else { 0 };
        entry.generation = generation.min(floor.saturating_add(MAX_GENERATION_JUMP));
        let mut freed = 0;
        let fenced = entry.conn.take().map(|old| {
            self.counts.fenced += 1;
            // The old connection's out-of-order frames go with it.
            if let Some(s) = entry.stream(old.incarnation) {
                freed += s.clear_buffer();
                s.ended = now;
            }
            old.wake
        });
        // The streams to forget for a new incarnation, chosen above.
        let mut dropped = Vec::with_capacity(forgotten.len());
        for id in forgotten {
            if let Some(i) = entry.streams.iter().position(|(_, s)| s.id == id) {
                dropped.push(entry.streams.remove(i).1);
            }
        }
        if expired > 0 {
            self.counts.unconfirmed_forgotten += expired;
            tracing::warn!(
                %producer,
                streams = expired,
                "egress receiver: incarnations idle past producer_idle are forgotten with acknowledgements their \
                 producer never confirmed"
            );
        }
        // Most recently admitted last.
        let index = entry.streams.iter().position(|(i, _)| *i == incarnation);
        let mut stream = match index {
            Some(i) => entry.streams.remove(i).1,
            None => {
                self.next_stream += 1;
                Stream::new(self.next_stream, resume_from.max(stored.unwrap_or(0)), now)
            }
        };
        // Everything below `resume_from` was acknowledged to the producer,
        // which no longer holds it: never wait for it. (Its buffer is empty:
        // only the current connection's stream buffers, and that buffer
        // went with the connection, fenced above or closed before.)
        if resume_from > stream.next {
            stream.next = resume_from;
        }
        // And a give-back below it is covered by that word, as a commit
        // would cover it.
        if resume_from > stream.wanted {
            stream.wanted = resume_from;
        }
        stream.redo = stream.redo.split_off(&resume_from);
        stream.settle();
        // The producer's word: it saw everything below `resume_from`
        // acknowledged.
        stream.confirmed = stream.confirmed.max(resume_from);
        stream.ended = now;
        let (next, received) = (stream.committed, stream.next);
        entry.streams.push((incarnation, stream));
        let conn = ConnId(self.next_conn);
        self.next_conn = self.next_conn.wrapping_add(1);
        entry.conn = Some(Conn { id: conn, incarnation, generation, wake, acked: next });
        self.counts.connections += 1;
        self.buffered_bytes -= freed;
        self.forget_streams(dropped);
        Admission::Welcome { conn, next, received, fenced }
    }

    /// Whether a new producer id fits in the table at `now`, forgetting for
    /// it the idle producer that has been idle the longest among those that
    /// may be forgotten: idle for at least `eviction_floor`, and holding no
    /// acknowledgement its producer has not confirmed (or with a durable
    /// record to resume from). A stream whose acknowledgements are not
    /// confirmed is never forgotten for a newcomer: its producer may come
    /// back from below what the application took.
    fn room_for_producer(&mut self, now: u64) -> Result<(), Full> {
        let rules = self.rules;
        if self.producers.len() < rules.max_producers.max(1) {
            return Ok(());
        }
        if let Some((since, producer)) = self.forgettable.first().cloned()
            && since.saturating_add(rules.eviction_floor) <= now
        {
            self.forget(&(since, producer));
            return Ok(());
        }
        // When room may be made: the first forgettable one reaching the
        // floor, or the first idle one reaching `producer_idle` (expired,
        // it goes whatever it holds).
        let floor = self.forgettable.first().map(|(since, _)| since.saturating_add(rules.eviction_floor));
        let expiry = self.idle.first().map(|(since, _)| since.saturating_add(rules.producer_idle));
        let at = floor.into_iter().chain(expiry).min();
        Err(Full {
            what: format!(
                "{} producers held, {} of them idle, none of them forgettable now",
                self.producers.len(),
                self.idle.len()
            ),
            retry_after: at.map_or(0, |at| at.saturating_sub(now).max(1)),
        })
    }

    /// Whether producer `p` can take stream `incarnation` at `now`: the
    /// streams to forget for it (by id, least recently admitted first), and
    /// how many of those go with acknowledgements their producer never
    /// confirmed. A stream may be forgotten for another incarnation only if
    /// nothing of it waits for the application and its producer confirmed
    /// every acknowledgement (or there is a durable record), or, failing
    /// that, once it has been without a connection for `producer_idle`.
    fn room_for_stream(rules: &Rules, p: &Producer<W>, incarnation: u128, now: u64) -> Result<(Vec<u64>, u64), Full> {
        let bound = rules.incarnations.max(1);
        if p.streams.len() < bound || p.streams.iter().any(|(i, _)| *i == incarnation) {
            return Ok((Vec::new(), 0));
        }
        let need = p.streams.len() + 1 - bound;
        let current = p.conn.as_ref().map(|c| c.incarnation);
        let expires = |s: &Stream| s.ended.saturating_add(rules.producer_idle);
        let (mut clean, mut expired) = (Vec::new(), Vec::new());
        for (i, s) in &p.streams {
            if !s.settled() {
                continue;
            }
            if rules.durable || s.confirmed() {
                clean.push(s.id);
            } else if Some(*i) != current && expires(s) <= now {
                expired.push(s.id);
            }
        }
        if clean.len() + expired.len() < need {
            // The earliest an unconfirmed stream without a connection
            // expires (the current one's clock starts when it is fenced).
            let at = p
                .streams
                .iter()
                .filter(|(i, s)| s.settled() && !s.confirmed() && Some(*i) != current)
                .map(|(_, s)| expires(s))
                .min()
                .or_else(|| current.map(|_| now.saturating_add(rules.producer_idle)));
            return Err(Full {
                what: format!(
                    "{} incarnations held for this producer id, none of them forgettable now",
                    p.streams.len()
                ),
                retry_after: at.map_or(0, |at| at.saturating_sub(now).max(1)),
            });
        }
        // Clean ones first (least recently admitted first among them), then
        // expired ones.
        let take_clean = clean.len().min(need);
        let take_expired = need - take_clean;
        let mut forget: Vec<u64> = clean.into_iter().take(take_clean).collect();
        forget.extend(expired.into_iter().take(take_expired));
        Ok((forget, u64::try_from(take_expired).unwrap_or(u64::MAX)))
    }

    /// Drops streams no longer remembered, with what they still had queued.
    /// A settled stream has nothing queued but what lies below a
    /// resume-from its producer named: a delivery it says was acknowledged
    /// (which only a producer that lies, or that lost track, says of one
    /// never taken). Their buffers are empty: only the current
    /// connection's stream buffers, and a forgotten stream is never that.
    fn forget_streams(&mut self, streams: Vec<Stream>) {
        if streams.is_empty() {
            return;
        }
        let ids: Vec<u64> = streams.iter().map(|s| s.id).collect();
        let mut dropped = 0;
        self.queue.retain(|q| {
            let keep = !ids.contains(&q.stream);
            if !keep {
                dropped += weight(&q.content);
            }
            keep
        });
        self.queued_bytes -= dropped;
    }

    /// Forgets the producers idle since `producer_idle` or longer before
    /// `now`, whatever they hold: past that age, a producer that comes back
    /// is a new one.
    pub(super) fn forget_idle(&mut self, now: u64) {
        while let Some(first) = self.idle.first().cloned()
            && first.0.saturating_add(self.rules.producer_idle) <= now
        {
            self.forget(&first);
        }
    }

    /// Forgets idle producer `(since, producer)`.
    fn forget(&mut self, key: &(u64, Arc<str>)) {
        self.idle.remove(key);
        self.forgettable.remove(key);
        let producer = &key.1;
        if let Some(p) = self.producers.remove(producer) {
            self.counts.evictions += 1;
            let unconfirmed = p.streams.iter().filter(|(_, s)| !s.confirmed()).count();
            if unconfirmed > 0 && !self.rules.durable {
                self.counts.unconfirmed_forgotten += u64::try_from(unconfirmed).unwrap_or(u64::MAX);
                tracing::warn!(
                    %producer,
                    streams = unconfirmed,
                    "egress receiver: a producer id idle past producer_idle is forgotten with acknowledgements it \
                     never confirmed"
                );
            } else {
                tracing::debug!(%producer, "egress receiver: an idle producer id is forgotten");
            }
            self.forget_streams(p.streams.into_iter().map(|(_, s)| s).collect());
        }
    }

    /// Notes that `producer` may have become idle at `now`.
    pub(super) fn maybe_idle(&mut self, producer: &Arc<str>, now: u64) {
        if let Some(p) = self.producers.get_mut(producer)
            && p.idle_since.is_none()
            && p.idle()
        {
            p.idle_since = Some(now);
            self.idle.insert((now, producer.clone()));
            if self.rules.durable || p.confirmed() {
                self.forgettable.insert((now, producer.clone()));
            }
        }
    }
}
