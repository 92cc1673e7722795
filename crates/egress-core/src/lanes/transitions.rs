//! The transitions of [`Lanes`] beyond the send path: acknowledgements and
//! completions, failures, timers, flush epochs and the fence. Each one on a
//! lane is its core's transition, then the indexes settled.

use super::{Lane, LaneKey, Lanes, outcome::CompleteOutcome, outcome::LanesReconnect};
use crate::changes::{Changes, Projection};
use crate::core::EgressCore;
use crate::ids::{FlushEpoch, Generation, Sequence, Time};
use crate::outcome::{AckOutcome, FailOutcome, ReceivedOutcome, ReconnectOutcome, ScheduleOutcome, Transition};
use crate::retry::{FailureKind, JitterSample};

impl<K: LaneKey, T> Lanes<K, T> {
    /// Takes a cumulative acknowledgement of `lane`: every record of the
    /// lane at or below `through` was delivered (see [`EgressCore::ack`](crate::EgressCore::ack)).
    ///
    /// Refused as the lane's core refuses; a lane that does not exist
    /// never sent anything (`Unsent`).
    ///
    /// Changes: the lane's, as its core reports them.
    pub fn ack(&mut self, generation: Generation, lane: &K, through: Sequence) -> Transition<AckOutcome> {
        if generation != self.generation {
            return Transition::unchanged(AckOutcome::StaleGeneration { current: self.generation });
        }
        let t = self
            .on_lane(lane, |l, g| l.core.ack(g, through))
            .unwrap_or_else(|| Transition::unchanged(AckOutcome::Unsent { through, sent_through: None }));
        // Completions waiting just above `through` were carried with it:
        // the outcome names the watermark the lane reached.
        match (t.outcome, self.lane(lane).and_then(EgressCore::acked_through)) {
            (AckOutcome::Advanced { .. }, Some(reached)) => {
                Transition::new(AckOutcome::Advanced { through: reached }, t.changes)
            }
            _ => t,
        }
    }

    /// Takes the completion of one record in flight, in any order: the lane
    /// acknowledges it once every record before it in the lane completed
    /// (`Advanced`), and until then it waits (`Waiting`), no longer
    /// [`outstanding`](Self::outstanding).
    ///
    /// Refused with `StaleGeneration` unless `generation` is the current
    /// one, and with `UnknownSequence` unless `sequence` is in flight in
    /// `lane`. `Unchanged` for a record already completed.
    ///
    /// Changes: the lane's inflight, when it completed (and what the
    /// acknowledgement changed, when it moved).
    pub fn complete(&mut self, generation: Generation, lane: &K, sequence: Sequence) -> Transition<CompleteOutcome> {
        if generation != self.generation {
            return Transition::unchanged(CompleteOutcome::StaleGeneration { current: self.generation });
        }
        let unknown = Transition::unchanged(CompleteOutcome::UnknownSequence { sequence });
        let Some(&slot) = self.index.get(lane) else { return unknown };
        let l = self.at(slot);
        if l.completions.contains(sequence.0) {
            return Transition::unchanged(CompleteOutcome::Unchanged);
        }
        if l.core.inflight.get(sequence).is_none() {
            return unknown;
        }
        self.on_slot(slot, |l, g| match l.completions.complete(sequence.0) {
            Some(through) => {
                let ack = l.core.ack(g, through);
                debug_assert!(matches!(ack.outcome, AckOutcome::Advanced { .. }));
                Transition::new(CompleteOutcome::Advanced { through }, ack.changes.with(Projection::Inflight))
            }
            None => {
                // Processed out of order: progress for the lane's isolation.
                let _ = l.core.progressed(g, sequence);
                Transition::new(CompleteOutcome::Waiting, Changes::NONE.with(Projection::Inflight))
            }
        })
    }

    /// Takes a receipt of `lane` (see [`EgressCore::received`](crate::EgressCore::received)).
    ///
    /// Refused as the lane's core refuses; a lane that does not exist
    /// never sent anything (`Unsent`).
    ///
    /// Changes: the lane's, as its core reports them.
    pub fn received(&mut self, generation: Generation, lane: &K, through: Sequence) -> Transition<ReceivedOutcome> {
        if generation != self.generation {
            return Transition::unchanged(ReceivedOutcome::StaleGeneration { current: self.generation });
        }
        self.on_lane(lane, |l, g| l.core.received(g, through))
            .unwrap_or_else(|| Transition::unchanged(ReceivedOutcome::Unsent { through, sent_through: None }))
    }

    /// Reports that sending the in-flight record `sequence` of `lane`
    /// failed at `now` (see [`EgressCore::fail`](crate::EgressCore::fail)):
    /// it parks for its backoff, or is a dead letter, in its lane; the
    /// other lanes go on.
    ///
    /// Refused with `StaleGeneration` unless `generation` is the current
    /// one, and with `UnknownSequence` unless the record is in flight in
    /// `lane` and not completed.
    ///
    /// Changes: the lane's, as its core reports them.
    pub fn fail(
        &mut self,
        generation: Generation,
        lane: &K,
        sequence: Sequence,
        kind: FailureKind,
        now: Time,
        jitter: JitterSample,
    ) -> Transition<FailOutcome> {
        if generation != self.generation {
            return Transition::unchanged(FailOutcome::StaleGeneration { current: self.generation });
        }
        let unknown = Transition::unchanged(FailOutcome::UnknownSequence { sequence });
        if self.index.get(lane).is_none_or(|&slot| self.at(slot).completions.contains(sequence.0)) {
            return unknown;
        }
        self.on_lane(lane, |l, g| l.core.fail(g, sequence, kind, now, jitter)).unwrap_or(unknown)
    }

    /// Schedules the parked record `sequence` of `lane` now (see
    /// [`EgressCore::retry_now`](crate::EgressCore::retry_now)).
    ///
    /// Changes: the lane's, as its core reports them.
    pub fn retry_now(&mut self, generation: Generation, lane: &K, sequence: Sequence) -> Transition<ScheduleOutcome> {
        self.schedule(generation, lane, sequence, |l, g| l.core.retry_now(g, sequence))
    }

    /// Gives the held dead letter `sequence` of `lane` another life (see
    /// [`EgressCore::requeue`](crate::EgressCore::requeue)): it keeps its
    /// ordinal, so it goes before what was enqueued after it.
    ///
    /// Changes: the lane's, as its core reports them.
    pub fn requeue(&mut self, generation: Generation, lane: &K, sequence: Sequence) -> Transition<ScheduleOutcome> {
        self.schedule(generation, lane, sequence, |l, g| l.core.requeue(g, sequence))
    }

    fn schedule(
        &mut self,
        generation: Generation,
        lane: &K,
        sequence: Sequence,
        f: impl FnOnce(&mut Lane<K, T>, Generation) -> Transition<ScheduleOutcome>,
    ) -> Transition<ScheduleOutcome> {
        if generation != self.generation {
            return Transition::unchanged(ScheduleOutcome::StaleGeneration { current: self.generation });
        }
        self.on_lane(lane, f).unwrap_or_else(|| Transition::unchanged(ScheduleOutcome::UnknownSequence { sequence }))
    }

    /// Schedules every parked record due at or before `now`, in every lane,
    /// and returns each lane touched (in key order) with the sequences it
    /// scheduled.
    ///
    /// Changes: the union of the lanes' (parked and pending, and retry
    /// where it described one of them).
    pub fn handle_timeout(&mut self, now: Time) -> Transition<Vec<(K, Vec<Sequence>)>> {
        let mut touched = Vec::new();
        let mut changes = Changes::NONE;
        while let Some(&(due, slot)) = self.due.first() {
            if due > now {
                break;
            }
            let key = self.at(slot).key.clone();
            let t = self.on_slot(slot, |l, _| l.core.handle_timeout(now));
            debug_assert!(!t.outcome.is_empty(), "a lane was due and scheduled nothing");
            changes = changes.union(t.changes);
            touched.push((key, t.outcome));
        }
        touched.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
        Transition::new(touched, changes)
    }

    /// The application made its state durable through flush epoch
    /// `through`: records of every lane waiting for it or an earlier one go
    /// on. Returns each lane that had records waiting for it, with how many.
    ///
    /// `Unchanged` (nothing, no change) when `through` is not above what
    /// was released.
    ///
    /// Changes: durable, when it rose (every lane's gates are a part of
    /// it).
    pub fn release(&mut self, through: FlushEpoch) -> Transition<Vec<(K, usize)>> {
        if through <= self.released {
            return Transition::unchanged(Vec::new());
        }
        self.released = through;
        let mut released = Vec::new();
        for (key, slot) in self.every_lane() {
            let n = self.on_slot(slot, |l, _| l.core.release(through)).outcome;
            if n > 0 {
                released.push((key, n));
            }
        }
        Transition::new(released, Changes::NONE.with(Projection::Durable))
    }

    /// Fences every lane at `generation` (see
    /// [`EgressCore::reconnect`](crate::EgressCore::reconnect)): what was in
    /// flight or parked in any lane is pending again, and completions not
    /// yet acknowledged are forgotten (those records are sent again; a peer
    /// that applied them recognizes them by their idempotency key).
    ///
    /// `Unchanged` when already at `generation`; refused with
    /// `StaleGeneration` when it is lower.
    ///
    /// Changes: each lane's, listed in the outcome; their union here.
    pub fn reconnect(&mut self, generation: Generation) -> Transition<LanesReconnect<K>> {
        if generation < self.generation {
            return Transition::unchanged(LanesReconnect::StaleGeneration { current: self.generation });
        }
        if generation == self.generation {
            return Transition::unchanged(LanesReconnect::Unchanged);
        }
        // The keys first: a key's clone that panics leaves nothing changed.
        let keys = self.every_lane();
        self.generation = generation;
        let (mut replayed, mut dead, mut changes) = (0, 0, Changes::NONE.with(Projection::Generation));
        let mut lanes = Vec::with_capacity(keys.len());
        for (key, slot) in keys {
            let t = self.on_slot(slot, |l, g| {
                l.completions = crate::completions::Completions::starting_at(l.base.0);
                l.core.reconnect(g)
            });
            if let ReconnectOutcome::Advanced { replayed: r, dead: d, .. } = t.outcome {
                replayed += r;
                dead += d;
            }
            changes = changes.union(t.changes);
            lanes.push((key, t.changes));
        }
        Transition::new(LanesReconnect::Advanced { generation, replayed, dead, lanes }, changes)
    }
}
