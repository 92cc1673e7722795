//! [`EgressCore`]: the state and its transitions.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::changes::{Changes, Projection};
use crate::envelope::{Envelope, Exhausted, Record};
use crate::ids::{Attempt, Generation, Sequence, Time};
use crate::outcome::{AckOutcome, ClaimOutcome, FailOutcome, ReconnectOutcome, ScheduleOutcome, Transition};
use crate::parked::{Parked, ParkedSet};
use crate::pending::PendingQueue;
use crate::policy::{Ordering, Policy};
use crate::retry::{FailureKind, JitterSample, ParkedView, Retry, backoff};
use crate::window::Window;

/// The delivery state machine of one egress stream.
///
/// It assigns sequences, keeps a bounded window in flight, takes cumulative
/// acknowledgements, parks failures for a bounded backoff, and fences a dead
/// connection by generation. It does no I/O and reads no clock: time and
/// jitter come in as arguments, timers go out as [`poll_timeout`].
///
/// Every record ever enqueued is, until acknowledged, in exactly one of
/// four places:
///
/// ```text
///   enqueue ──▶ pending ──claim──▶ inflight ──ack──▶ (gone: acked)
///                ▲  ▲                 │  │
///                │  └──retry_now──┐   │  └─fail: budget spent─▶ exhausted
///                │   handle_timeout  fail                           │
///                │                └─ parked ◀┘                      │
///                └────────────────── requeue ───────────────────────┘
///   reconnect: inflight and parked ──▶ pending, under the new generation
/// ```
///
/// # Methods by role
/// - **Inputs from the application:** [`enqueue`], [`enqueue_all`],
///   [`retry_now`], [`requeue`].
/// - **Inputs from the transport:** [`claim`] (under the transport's
///   generation), [`ack`], [`fail`], [`reconnect`].
/// - **Timers:** [`poll_timeout`] says when the earliest parked record is
///   due; at that time call [`handle_timeout`].
/// - **Getters:** [`pending`], [`inflight`], [`parked`], [`exhausted`],
///   [`acked_through`], [`retry`], [`generation`], [`next_sequence`] and the
///   counts.
///
/// Every transition returns a [`Transition`]: its outcome and the
/// [`Changes`] it made. A refused call (a stale generation, an unknown
/// sequence, an ack from the future) and a no-op return [`Changes::NONE`]
/// and leave the state exactly as it was.
///
/// # The loop
/// After every input, claim until the outcome is not `Claimed`, send what
/// was claimed, and re-arm the timer from `poll_timeout`.
///
/// ```
/// use egress_core::{AckOutcome, ClaimOutcome, EgressCore, Generation, Policy, Sequence};
///
/// let mut core = EgressCore::new(Policy::builder().inflight_limit(2).build()?);
/// let g = core.generation();
/// for text in ["a", "b", "c"] {
///     let _ = core.enqueue(text);
/// }
/// let mut sent = Vec::new();
/// while let ClaimOutcome::Claimed(envelope) = core.claim(g).outcome {
///     sent.push(*envelope.payload);
/// }
/// assert_eq!(sent, ["a", "b"]); // the window holds two
///
/// let ack = core.ack(g, Sequence(1));
/// assert_eq!(ack.outcome, AckOutcome::Advanced { through: Sequence(1) });
/// assert_eq!(core.inflight_len(), 0);
/// assert_eq!(core.pending_len(), 1);
///
/// // A transport of an older generation changes nothing.
/// let _ = core.reconnect(Generation(1));
/// assert!(core.claim(g).changes.is_empty());
/// # Ok::<(), egress_core::PolicyError>(())
/// ```
///
/// # Costs
/// `enqueue` and `claim` are O(1) amortized with no allocation per record
/// beyond the payload; putting a record back (`retry_now`, `requeue`,
/// timeouts, replay) is O(log n); an ack removing k records is O(k + log n)
/// while the window is in claim-equals-sequence order, and O(window)
/// otherwise; `fail` is O(log window) or O(window) likewise, plus O(log n);
/// `reconnect` is O(r log n) for r replayed records.
///
/// [`enqueue`]: Self::enqueue
/// [`enqueue_all`]: Self::enqueue_all
/// [`retry_now`]: Self::retry_now
/// [`requeue`]: Self::requeue
/// [`claim`]: Self::claim
/// [`ack`]: Self::ack
/// [`fail`]: Self::fail
/// [`reconnect`]: Self::reconnect
/// [`poll_timeout`]: Self::poll_timeout
/// [`handle_timeout`]: Self::handle_timeout
/// [`pending`]: Self::pending
/// [`inflight`]: Self::inflight
/// [`parked`]: Self::parked
/// [`exhausted`]: Self::exhausted
/// [`acked_through`]: Self::acked_through
/// [`retry`]: Self::retry
/// [`generation`]: Self::generation
/// [`next_sequence`]: Self::next_sequence
#[derive(Clone, Debug, PartialEq)]
pub struct EgressCore<T> {
    policy: Policy,
    generation: Generation,
    next_sequence: Sequence,
    pending: PendingQueue<T>,
    inflight: Window<T>,
    parked: ParkedSet<T>,
    exhausted: BTreeMap<Sequence, Exhausted<T>>,
    acked_through: Option<Sequence>,
    retry: Option<Retry>,
}

impl<T> EgressCore<T> {
    /// An empty core at generation 0.
    #[must_use]
    pub fn new(policy: Policy) -> Self {
        Self::with_generation(policy, Generation(0))
    }

    /// An empty core at `generation`.
    #[must_use]
    pub fn with_generation(policy: Policy, generation: Generation) -> Self {
        Self {
            policy,
            generation,
            next_sequence: Sequence(0),
            pending: PendingQueue::default(),
            inflight: Window::default(),
            parked: ParkedSet::default(),
            exhausted: BTreeMap::new(),
            acked_through: None,
            retry: None,
        }
    }

    // ----- getters -------------------------------------------------------

    /// The policy the core was built with.
    #[must_use]
    pub const fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The current generation.
    #[must_use]
    pub const fn generation(&self) -> Generation {
        self.generation
    }

    /// The sequence the next [`enqueue`](Self::enqueue) will assign.
    #[must_use]
    pub const fn next_sequence(&self) -> Sequence {
        self.next_sequence
    }

    /// The cumulative acknowledgement watermark: every sequence at or below
    /// it was delivered. `None` until the first ack.
    #[must_use]
    pub const fn acked_through(&self) -> Option<Sequence> {
        self.acked_through
    }

    /// The state of the most recent failure, while its record is parked or
    /// exhausted.
    #[must_use]
    pub const fn retry(&self) -> Option<Retry> {
        self.retry
    }

    /// The records waiting to be claimed, in sequence order.
    pub fn pending(&self) -> impl ExactSizeIterator<Item = Envelope<&T>> + '_ {
        let g = self.generation;
        self.pending.iter().map(move |r| r.view(g))
    }

    /// The records in flight, in claim order.
    pub fn inflight(&self) -> impl ExactSizeIterator<Item = Envelope<&T>> + '_ {
        let g = self.generation;
        self.inflight.iter().map(move |r| r.view(g))
    }

    /// The parked records, in sequence order.
    pub fn parked(&self) -> impl ExactSizeIterator<Item = ParkedView<'_, T>> + '_ {
        self.parked.iter().map(|p| ParkedView {
            sequence: p.record.sequence,
            attempt: p.record.attempt,
            backoff: p.backoff,
            due: p.due,
            payload: &p.record.payload,
        })
    }

    /// The dead letters, in sequence order, each with the generation it
    /// failed under.
    pub fn exhausted(&self) -> impl ExactSizeIterator<Item = Envelope<&T>> + '_ {
        self.exhausted.values().map(|e| e.record.view(e.generation))
    }

    /// How many records are pending.
    #[must_use]
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// How many records are in flight.
    #[must_use]
    pub fn inflight_len(&self) -> usize {
        self.inflight.len()
    }

    /// How many records are parked.
    #[must_use]
    pub fn parked_len(&self) -> usize {
        self.parked.len()
    }

    /// How many records are exhausted.
    #[must_use]
    pub fn exhausted_len(&self) -> usize {
        self.exhausted.len()
    }

    /// How many more records the window admits.
    #[must_use]
    pub fn window_room(&self) -> usize {
        self.policy.inflight_limit().saturating_sub(self.inflight.len())
    }

    /// The earliest time a parked record becomes due: call
    /// [`handle_timeout`](Self::handle_timeout) then. `None` when nothing is
    /// parked.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        self.parked.next_due()
    }

    // ----- inputs --------------------------------------------------------

    /// Queues `payload` under the next sequence and returns that sequence.
    ///
    /// Changes: pending.
    pub fn enqueue(&mut self, payload: T) -> Transition<Sequence> {
        let sequence = self.next_sequence;
        self.pending.push_new(Record { sequence, attempt: Attempt(0), budget_start: Attempt(0), payload });
        self.next_sequence = sequence.next();
        Transition::new(sequence, Changes::NONE.with(Projection::Pending))
    }

    /// Queues every payload in order and returns the range of sequences
    /// assigned: one transition, one invalidation, for many records.
    ///
    /// Changes: pending, if anything was queued.
    pub fn enqueue_all(&mut self, payloads: impl IntoIterator<Item = T>) -> Transition<Range<Sequence>> {
        let first = self.next_sequence;
        for payload in payloads {
            let _ = self.enqueue(payload);
        }
        let range = first..self.next_sequence;
        let changed = !range.is_empty();
        Transition::new(range, Changes::NONE.with_if(Projection::Pending, changed))
    }

    /// Moves the oldest pending record into flight and hands out a view of
    /// it, with its attempt count incremented.
    ///
    /// Refused with `StaleGeneration` unless `generation` is the core's.
    /// Then `Empty` (nothing pending), `WindowFull` (`inflight_limit`
    /// records already in flight), or, under [`Ordering::Strict`],
    /// `Blocked` by the lowest parked or exhausted sequence below the head
    /// of pending.
    ///
    /// Changes: pending and inflight, when claimed.
    pub fn claim(&mut self, generation: Generation) -> Transition<ClaimOutcome<'_, T>> {
        if generation != self.generation {
            return Transition::unchanged(ClaimOutcome::StaleGeneration { current: self.generation });
        }
        let Some(head) = self.pending.head() else {
            return Transition::unchanged(ClaimOutcome::Empty);
        };
        if self.inflight.len() >= self.policy.inflight_limit() {
            return Transition::unchanged(ClaimOutcome::WindowFull);
        }
        if self.policy.ordering() == Ordering::Strict {
            let parked = self.parked.first_sequence();
            let exhausted = self.exhausted.first_key_value().map(|(s, _)| *s);
            let lowest = match (parked, exhausted) {
                (Some(p), Some(e)) => Some(p.min(e)),
                (p, e) => p.or(e),
            };
            if let Some(sequence) = lowest.filter(|s| *s < head) {
                return Transition::unchanged(ClaimOutcome::Blocked { sequence });
            }
        }
        let mut record = self.pending.pop_head().expect("invariant broken: pending has a head but no record");
        record.attempt = Attempt(record.attempt.0.saturating_add(1));
        let g = self.generation;
        let claimed = self.inflight.push(record).view(g);
        Transition::new(
            ClaimOutcome::Claimed(claimed),
            Changes::NONE.with(Projection::Pending).with(Projection::Inflight),
        )
    }

    /// Takes a cumulative acknowledgement: every sequence at or below
    /// `through` was delivered.
    ///
    /// Refused with `StaleGeneration` unless `generation` is the core's, and
    /// with `Unassigned` when `through` was never assigned (an ack from the
    /// future must not drop records that were never sent). `Unchanged` when
    /// the watermark is already at or past `through`.
    ///
    /// Changes: acked_through; each of pending, inflight, parked, exhausted
    /// that lost a record; retry, if its record was acknowledged.
    pub fn ack(&mut self, generation: Generation, through: Sequence) -> Transition<AckOutcome> {
        if generation != self.generation {
            return Transition::unchanged(AckOutcome::StaleGeneration { current: self.generation });
        }
        if through >= self.next_sequence {
            return Transition::unchanged(AckOutcome::Unassigned { through, next_sequence: self.next_sequence });
        }
        if self.acked_through.is_some_and(|w| through <= w) {
            return Transition::unchanged(AckOutcome::Unchanged { through: self.acked_through });
        }
        self.acked_through = Some(through);
        let exhausted_changed = self.exhausted.first_key_value().is_some_and(|(s, _)| *s <= through);
        if exhausted_changed {
            self.exhausted = match through.0.checked_add(1) {
                Some(next) => self.exhausted.split_off(&Sequence(next)),
                None => BTreeMap::new(),
            };
        }
        let retry_cleared = self.retry.is_some_and(|r| r.sequence <= through);
        if retry_cleared {
            self.retry = None;
        }
        let changes = Changes::NONE
            .with(Projection::AckedThrough)
            .with_if(Projection::Pending, self.pending.remove_through(through))
            .with_if(Projection::Inflight, self.inflight.remove_through(through))
            .with_if(Projection::Parked, self.parked.remove_through(through))
            .with_if(Projection::Exhausted, exhausted_changed)
            .with_if(Projection::Retry, retry_cleared);
        Transition::new(AckOutcome::Advanced { through }, changes)
    }

    /// Reports that sending the in-flight record `sequence` failed at `now`.
    ///
    /// With k the attempts since its budget began, the backoff is
    /// `min(retry_ceiling, retry_base * 2^(k-1))` (saturating), raised to a
    /// [`FailureKind::RetryAfter`] hint if that is longer, then spread upward
    /// by `policy.jitter() * jitter` of itself. A permanent failure, or
    /// k above the retry budget, makes the record a dead letter
    /// (`Exhausted`); otherwise it is parked until `now + backoff`
    /// (`Retrying`).
    ///
    /// Refused with `StaleGeneration` unless `generation` is the core's, and
    /// with `UnknownSequence` unless `sequence` is in flight.
    ///
    /// Changes: inflight, retry, and parked or exhausted.
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
        let Some(record) = self.inflight.remove(sequence) else {
            return Transition::unchanged(FailOutcome::UnknownSequence { sequence });
        };
        let k = record.attempts_in_budget();
        let hint = match kind {
            FailureKind::RetryAfter(delay) => Some(delay),
            FailureKind::Transient | FailureKind::Permanent => None,
        };
        let delay = backoff(&self.policy, k, hint, jitter);
        let exhausted = kind == FailureKind::Permanent || k > self.policy.retry_budget();
        let retry = Retry { sequence, attempt: record.attempt, backoff: delay, exhausted };
        let changes = Changes::NONE
            .with(Projection::Inflight)
            .with_if(Projection::Retry, self.retry != Some(retry))
            .with(if exhausted { Projection::Exhausted } else { Projection::Parked });
        self.retry = Some(retry);
        if exhausted {
            self.exhausted.insert(sequence, Exhausted { generation: self.generation, record });
            Transition::new(FailOutcome::Exhausted(retry), changes)
        } else {
            self.parked.insert(Parked { record, backoff: delay, due: now.saturating_add(delay) });
            Transition::new(FailOutcome::Retrying(retry), changes)
        }
    }

    /// Schedules the parked record `sequence` now, without waiting for its
    /// backoff: it goes back to pending in sequence order.
    ///
    /// Refused with `StaleGeneration` unless `generation` is the core's, and
    /// with `UnknownSequence` unless `sequence` is parked (an exhausted
    /// record needs [`requeue`](Self::requeue)).
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

    /// Gives the dead letter `sequence` another life: back to pending in
    /// sequence order, under the current generation, with a fresh retry
    /// budget and backoff schedule (its attempt count carries on).
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
        record.budget_start = record.attempt;
        self.pending.put_back(record);
        let changes = Changes::NONE
            .with(Projection::Exhausted)
            .with(Projection::Pending)
            .with_if(Projection::Retry, self.clear_retry_of(sequence));
        Transition::new(ScheduleOutcome::Scheduled { sequence }, changes)
    }

    /// Fences the current connection: moves to `generation`, which must be
    /// higher, and returns every in-flight and parked record to pending in
    /// sequence order (keeping attempt counts) to be replayed under it.
    /// Sequences and the watermark are kept; dead letters stay as they are.
    /// Every claim, ack, fail, retry and requeue naming an older generation
    /// is refused from now on.
    ///
    /// `Unchanged` when already at `generation`; refused with
    /// `StaleGeneration` when it is lower.
    ///
    /// Changes: generation; pending, when anything is pending afterwards
    /// (every envelope now carries the new generation); inflight and parked,
    /// if they held records; retry, if its record was replayed.
    pub fn reconnect(&mut self, generation: Generation) -> Transition<ReconnectOutcome> {
        if generation < self.generation {
            return Transition::unchanged(ReconnectOutcome::StaleGeneration { current: self.generation });
        }
        if generation == self.generation {
            return Transition::unchanged(ReconnectOutcome::Unchanged);
        }
        self.generation = generation;
        let had_inflight = !self.inflight.is_empty();
        let had_parked = !self.parked.is_empty();
        let mut replayed = 0;
        let mut retry_cleared = false;
        for record in self.inflight.drain() {
            self.pending.put_back(record);
            replayed += 1;
        }
        let retry_sequence = self.retry.map(|r| r.sequence);
        for p in self.parked.drain() {
            retry_cleared |= retry_sequence == Some(p.record.sequence);
            self.pending.put_back(p.record);
            replayed += 1;
        }
        if retry_cleared {
            self.retry = None;
        }
        let changes = Changes::NONE
            .with(Projection::Generation)
            .with_if(Projection::Pending, !self.pending.is_empty())
            .with_if(Projection::Inflight, had_inflight)
            .with_if(Projection::Parked, had_parked)
            .with_if(Projection::Retry, retry_cleared);
        Transition::new(ReconnectOutcome::Advanced { generation, replayed }, changes)
    }

    /// Clears `retry` if it describes `sequence`; returns whether it did.
    fn clear_retry_of(&mut self, sequence: Sequence) -> bool {
        let clear = self.retry.is_some_and(|r| r.sequence == sequence);
        if clear {
            self.retry = None;
        }
        clear
    }
}
