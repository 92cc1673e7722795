//! The transitions of failure: `fail`, `retry_now`, `handle_timeout`,
//! `requeue`, and what becomes of a dead letter.

use crate::changes::{Changes, Projection};
use crate::core::{EgressCore, Isolation};
use crate::durable::DeadMark;
use crate::envelope::{Exhausted, Record};
use crate::ids::{Generation, Sequence, Time};
use crate::outcome::{FailOutcome, ScheduleOutcome, Transition};
use crate::parked::Parked;
use crate::policy::DeadLetters;
use crate::retry::{DeadReason, FailureKind, JitterSample, Retry, backoff};

impl<T> EgressCore<T> {
    /// Reports that sending the in-flight record `sequence` failed at `now`.
    ///
    /// With k the failures in its current budget, this one included, the
    /// backoff is `min(retry_ceiling, retry_base * 2^(k-1))` (saturating),
    /// raised to a [`FailureKind::RetryAfter`] hint if that is longer, then
    /// spread upward by `policy.jitter() * jitter` of itself. A permanent
    /// failure, or k above the retry budget, makes the record a dead letter
    /// (`Exhausted`: a tombstone back in pending, or held, as the policy's
    /// [`DeadLetters`] says); otherwise it is parked until `now + backoff`
    /// (`Retrying`). A tombstone (under [`DeadLetters::Skip`]) whose budget
    /// is spent is not given up on: it parks for its backoff under a fresh
    /// budget. Replays after a reconnect do not count here (see
    /// [`Policy::replay_limit`](crate::Policy::replay_limit)).
    ///
    /// Refused with `StaleGeneration` unless `generation` is the core's, and
    /// with `UnknownSequence` unless `sequence` is in flight.
    ///
    /// Changes: inflight, retry, and parked, or pending (a tombstone) or
    /// exhausted.
    pub fn fail(
        &mut self,
        generation: Generation,
        sequence: Sequence,
        kind: FailureKind,
        now: Time,
        jitter: JitterSample,
    ) -> Transition<FailOutcome> {
        if generation != self.generation {
            return Transition::unchanged(FailOutcome::StaleGeneration { current: self.generation });
        }
        let Some(mut record) = self.inflight.remove(sequence) else {
            return Transition::unchanged(FailOutcome::UnknownSequence { sequence });
        };
        if self.isolation == Isolation::Probing(sequence) {
            self.isolation = Isolation::Ready;
        }
        record.failures = record.failures.saturating_add(1);
        let k = record.failures;
        let hint = match kind {
            FailureKind::RetryAfter(delay) => Some(delay),
            FailureKind::Transient | FailureKind::Permanent => None,
        };
        let delay = backoff(&self.policy, k, hint, jitter);
        let skip = self.policy.dead_letters() == DeadLetters::Skip;
        let dead = if kind == FailureKind::Permanent {
            Some(DeadReason::Permanent)
        } else if k > self.policy.retry_budget() && !(skip && record.dead.is_some()) {
            Some(DeadReason::Retries)
        } else {
            if k > self.policy.retry_budget() {
                // A tombstone is not given up on for its budget (its receiver
                // would wait on the gap for good): it parks for its backoff,
                // under a fresh budget.
                record.fresh_budget();
            }
            None
        };
        let retry = Retry { sequence, attempt: record.attempt, backoff: delay, exhausted: dead.is_some() };
        let changes = Changes::NONE.with(Projection::Inflight).with_if(Projection::Retry, self.retry != Some(retry));
        self.retry = Some(retry);
        if let Some(reason) = dead {
            let buried = self.bury(record, reason);
            Transition::new(FailOutcome::Exhausted(retry), changes.with(buried))
        } else {
            self.parked.insert(Parked { record, backoff: delay, due: now.saturating_add(delay) });
            Transition::new(FailOutcome::Retrying(retry), changes.with(Projection::Parked))
        }
    }

    /// Disposes of a dead letter as the policy says: under
    /// [`DeadLetters::Skip`] a live record becomes a tombstone with a fresh
    /// budget, back in pending, and a tombstone replayed past its limit goes
    /// on under a fresh budget, with its first reason (its receiver must
    /// learn of the gap, or it waits on it for good; one whose budget is
    /// spent parks instead, see [`fail`](Self::fail)); otherwise (a hold,
    /// or a tombstone refused permanently) it is held among the exhausted
    /// records. Returns the projection it went to.
    pub(crate) fn bury(&mut self, mut record: Record<T>, reason: DeadReason) -> Projection {
        let sequence = record.sequence;
        let skip = self.policy.dead_letters() == DeadLetters::Skip;
        if skip && record.dead.is_none() {
            record.dead = Some(reason);
            record.fresh_budget();
            self.pending.put_back(record);
            self.note_dead(sequence, Some(DeadMark { reason, held: false }));
            Projection::Pending
        } else if skip && reason == DeadReason::Replays {
            record.fresh_budget();
            self.pending.put_back(record);
            Projection::Pending
        } else {
            self.exhausted.insert(sequence, Exhausted { generation: self.generation, reason, record });
            self.note_dead(sequence, Some(DeadMark { reason, held: true }));
            Projection::Exhausted
        }
    }

    /// Schedules the parked record `sequence` now, without waiting for its
    /// backoff: it goes back to pending in sequence order.
    ///
    /// Refused with `StaleGeneration` unless `generation` is the core's, and
    /// with `UnknownSequence` unless `sequence` is parked (a held dead
    /// letter needs [`requeue`](Self::requeue)).
    ///
    /// Changes: parked, pending; retry, if it described this record.
    pub fn retry_now(&mut self, generation: Generation, sequence: Sequence) -> Transition<ScheduleOutcome> {
        if generation != self.generation {
            return Transition::unchanged(ScheduleOutcome::StaleGeneration { current: self.generation });
        }
        let Some(parked) = self.parked.remove(sequence) else {
            return Transition::unchanged(ScheduleOutcome::UnknownSequence { sequence });
        };
        self.pending.put_back(parked.record);
        let changes = Changes::NONE
            .with(Projection::Parked)
            .with(Projection::Pending)
            .with_if(Projection::Retry, self.clear_retry_of(sequence));
        Transition::new(ScheduleOutcome::Scheduled { sequence }, changes)
    }

    /// Schedules every parked record due at or before `now`, as
    /// [`retry_now`](Self::retry_now) would, and returns their sequences in
    /// order.
    ///
    /// Changes: parked and pending, if anything was due; retry, if it
    /// described one of them.
    pub fn handle_timeout(&mut self, now: Time) -> Transition<Vec<Sequence>> {
        let due = self.parked.take_due(now);
        let mut retry_cleared = false;
        let mut scheduled = Vec::with_capacity(due.len());
        for parked in due {
            let sequence = parked.record.sequence;
            retry_cleared |= self.clear_retry_of(sequence);
            self.pending.put_back(parked.record);
            scheduled.push(sequence);
        }
        let any = !scheduled.is_empty();
        let changes = Changes::NONE
            .with_if(Projection::Parked, any)
            .with_if(Projection::Pending, any)
            .with_if(Projection::Retry, retry_cleared);
        Transition::new(scheduled, changes)
    }

    /// Gives the held dead letter `sequence` another life: back to pending
    /// in sequence order, under the current generation, with a fresh retry
    /// budget, replay limit and backoff schedule (its attempt count carries
    /// on; a tombstone stays a tombstone).
    ///
    /// Refused with `StaleGeneration` unless `generation` is the core's, and
    /// with `UnknownSequence` unless `sequence` is exhausted.
    ///
    /// Changes: exhausted, pending; retry, if it described this record.
    pub fn requeue(&mut self, generation: Generation, sequence: Sequence) -> Transition<ScheduleOutcome> {
        if generation != self.generation {
            return Transition::unchanged(ScheduleOutcome::StaleGeneration { current: self.generation });
        }
        let Some(Exhausted { mut record, .. }) = self.exhausted.remove(&sequence) else {
            return Transition::unchanged(ScheduleOutcome::UnknownSequence { sequence });
        };
        record.fresh_budget();
        let mark = record.dead.map(|reason| DeadMark { reason, held: false });
        self.pending.put_back(record);
        self.note_dead(sequence, mark);
        let changes = Changes::NONE
            .with(Projection::Exhausted)
            .with(Projection::Pending)
            .with_if(Projection::Retry, self.clear_retry_of(sequence));
        Transition::new(ScheduleOutcome::Scheduled { sequence }, changes)
    }
}
