//! Fencing and receipts: `reconnect` moves to a new generation and returns
//! what was in flight or parked to pending; `received` learns what the peer
//! already holds, so that it is not sent again.

use crate::changes::{Changes, Projection};
use crate::core::{EgressCore, Isolation};
use crate::ids::{Generation, Sequence};
use crate::outcome::{ReceivedOutcome, ReconnectOutcome, Transition};
use crate::retry::DeadReason;

impl<T> EgressCore<T> {
    /// Fences the current connection: moves to `generation`, which must be
    /// higher, and returns every in-flight and parked record to pending in
    /// sequence order (keeping attempt counts) to be replayed under it.
    /// Sequences and both watermarks are kept; held dead letters stay as
    /// they are. Every claim, ack, receipt, fail, retry and requeue naming
    /// an older generation is refused from now on.
    ///
    /// Each record that was in flight is charged a **replay**; one whose
    /// replays then exceed [`Policy::replay_limit`](crate::Policy::replay_limit)
    /// is a dead letter ([`DeadReason::Replays`]), disposed of as the
    /// policy's [`DeadLetters`](crate::DeadLetters) says. A later
    /// [`received`](Self::received) refunds the charge of a record the peer
    /// turns out to hold. If records were in flight and nothing reached the
    /// peer since the previous reconnect, the core **isolates**: the next
    /// claims send one record at a time until the receipt watermark moves.
    ///
    /// `Unchanged` when already at `generation`; refused with
    /// `StaleGeneration` when it is lower.
    ///
    /// Changes: generation; pending, when anything is pending afterwards
    /// (every envelope now carries the new generation); inflight and parked,
    /// if they held records; exhausted, if a record died and is held; retry,
    /// if its record was replayed from parked; durable, with a journal, if
    /// the generation was durable (the new one is not, until written: see
    /// [`generation_durable`](Self::generation_durable)).
    pub fn reconnect(&mut self, generation: Generation) -> Transition<ReconnectOutcome> {
        if generation < self.generation {
            return Transition::unchanged(ReconnectOutcome::StaleGeneration { current: self.generation });
        }
        if generation == self.generation {
            return Transition::unchanged(ReconnectOutcome::Unchanged);
        }
        let was_durable = self.is_journaled() && self.generation_durable();
        self.generation = generation;
        let had_inflight = !self.inflight.is_empty();
        let had_parked = !self.parked.is_empty();
        let (mut replayed, mut dead, mut held) = (0, 0, false);
        let limit = self.policy.replay_limit();
        let flown: Vec<_> = self.inflight.drain().collect();
        for mut record in flown {
            replayed += 1;
            record.replays = record.replays.saturating_add(1);
            record.resend = true;
            if record.replays > limit {
                dead += 1;
                held |= self.bury(record, DeadReason::Replays) == Projection::Exhausted;
            } else {
                self.pending.put_back(record);
            }
        }
        let mut retry_cleared = false;
        let retry_sequence = self.retry.map(|r| r.sequence);
        for p in self.parked.drain() {
            retry_cleared |= retry_sequence == Some(p.record.sequence);
            self.pending.put_back(p.record);
            replayed += 1;
        }
        if retry_cleared {
            self.retry = None;
        }
        self.isolation = if self.progressed {
            Isolation::Off
        } else if had_inflight {
            Isolation::Ready
        } else {
            match self.isolation {
                Isolation::Off => Isolation::Off,
                Isolation::Ready | Isolation::Probing(_) => Isolation::Ready,
            }
        };
        self.progressed = false;
        let changes = Changes::NONE
            .with(Projection::Generation)
            .with_if(Projection::Pending, !self.pending.is_empty())
            .with_if(Projection::Inflight, had_inflight)
            .with_if(Projection::Parked, had_parked)
            .with_if(Projection::Exhausted, held)
            .with_if(Projection::Retry, retry_cleared)
            .with_if(Projection::Durable, was_durable);
        Transition::new(ReconnectOutcome::Advanced { generation, replayed, dead }, changes)
    }

    /// Takes a receipt: the peer holds every sequence at or below `through`
    /// (it may not have acknowledged them yet), as a receiver reports when a
    /// connection opens. The receipt watermark rises to `through` (progress:
    /// isolation ends), and every pending record at or below it goes back in
    /// flight without being sent again; a replay charged to such a record by
    /// the last reconnect is refunded.
    ///
    /// Refused with `StaleGeneration` unless `generation` is the core's, and
    /// with `Unsent` when `through` is above [`sent_through`](Self::sent_through).
    /// `Unchanged` when the watermark is already at or past `through` and
    /// nothing pending lies at or below it.
    ///
    /// Changes: received, if it rose; pending and inflight, if records moved.
    pub fn received(&mut self, generation: Generation, through: Sequence) -> Transition<ReceivedOutcome> {
        if generation != self.generation {
            return Transition::unchanged(ReceivedOutcome::StaleGeneration { current: self.generation });
        }
        if self.sent_through.is_none_or(|s| through > s) {
            return Transition::unchanged(ReceivedOutcome::Unsent { through, sent_through: self.sent_through });
        }
        let rose = self.note_receipt(through);
        let mut moved = 0;
        while self.pending.head().is_some_and(|h| h <= through) {
            let mut record = self.pending.pop_head().expect("invariant broken: pending has a head but no record");
            if record.resend {
                record.resend = false;
                record.replays = record.replays.saturating_sub(1);
            }
            let _ = self.inflight.push(record);
            moved += 1;
        }
        if !rose && moved == 0 {
            return Transition::unchanged(ReceivedOutcome::Unchanged { through: self.received_through });
        }
        let through = self.received_through.unwrap_or(through);
        let changes = Changes::NONE
            .with_if(Projection::Received, rose)
            .with_if(Projection::Pending, moved > 0)
            .with_if(Projection::Inflight, moved > 0);
        Transition::new(ReceivedOutcome::Recorded { through, moved }, changes)
    }
}
