//! [`EgressCore`]: the state, its getters, and the transitions of the send
//! path (enqueue, claim, ack). Failures live in `failures.rs`, fencing and
//! receipts in `fencing.rs`.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;

use crate::changes::{Changes, Projection};
use crate::durable::Journal;
use crate::envelope::{Envelope, Exhausted, Record};
use crate::ids::{FlushEpoch, Generation, Sequence, Time};
use crate::outcome::{AckOutcome, ClaimOutcome, Transition};
use crate::parked::ParkedSet;
use crate::pending::{PendingParts, PendingQueue};
use crate::policy::{Ordering, Policy};
use crate::retry::{DeadReason, ParkedView, Retry};
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
///                ▲  ▲  ▲              │  │
///                │  │  └─received─────┘  └─fail: dead, Hold─▶ exhausted
///                │  └──retry_now──┐   │                           │
///                │   handle_timeout  fail ─ dead, Skip: a tombstone, back to pending
///                │                └─ parked ◀┘                    │
///                └────────────────── requeue ─────────────────────┘
///   reconnect: inflight and parked ──▶ pending, under the new generation
/// ```
///
/// # Methods by role
/// - **Inputs from the application:** [`enqueue`], [`enqueue_all`],
///   [`retry_now`], [`requeue`].
/// - **Inputs from the transport:** [`claim`] (under the transport's
///   generation), [`ack`], [`received`], [`fail`], [`reconnect`], and
///   [`progressed`] (a record processed out of order).
/// - **Timers:** [`poll_timeout`] says when the earliest parked record is
///   due; at that time call [`handle_timeout`].
/// - **Getters:** [`pending`], [`inflight`], [`parked`], [`exhausted`],
///   [`acked_through`], [`received_through`], [`sent_through`], [`retry`],
///   [`generation`], [`next_sequence`], [`isolation`] and the counts.
///
/// Every transition returns a [`Transition`]: its outcome and the
/// [`Changes`] it made. A refused call (a stale generation, an unknown
/// sequence, an ack of a sequence never sent) and a no-op return
/// [`Changes::NONE`] and leave the state exactly as it was.
///
/// # The rules that bound what goes on the wire
/// - **The window is a range.** A record is claimed only if its sequence is
///   below `acked_through + 1 + inflight_limit`. A record retried after a
///   failure lies below the records sent after it, so it always fits: no
///   stall needs a reconnect to clear.
/// - **Acks are bounded by what was sent.** An ack (or receipt) beyond the
///   highest sequence ever claimed is refused ([`AckOutcome::Unsent`]).
/// - **Sends are bounded.** Failures count against
///   [`Policy::retry_budget`], replays after a reconnect against
///   [`Policy::replay_limit`]; past either a record is a dead letter, so a
///   record is claimed at most `retry_budget + replay_limit + 1` times per
///   budget. `attempt` counts every claim.
/// - **A suspect is isolated.** When a connection dies with records in
///   flight and nothing reached the peer since the previous reconnect
///   (neither [`ack`] nor [`received`] moved the receipt watermark), records
///   are then claimed one at a time ([`isolation`]): a record that kills
///   its connections is the only one replayed, so it alone spends its
///   replay limit. The first progress ends isolation.
/// - **Dead letters do not stall the stream** under
///   [`DeadLetters::Skip`](crate::DeadLetters) (the default): they become
///   tombstones, sent in their place.
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
/// // An ack beyond what was sent is refused and changes nothing.
/// assert!(matches!(core.ack(g, Sequence(2)).outcome, AckOutcome::Unsent { .. }));
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
/// timeouts, replay, tombstones) is O(log n); an ack removing k records is
/// O(k + log n) while the window is in claim-equals-sequence order, and
/// O(window) otherwise; `fail` is O(log window) or O(window) likewise, plus
/// O(log n); `reconnect` is O(r log n) for r replayed records, `received`
/// O(m log n) for m records moved.
///
/// [`enqueue`]: Self::enqueue
/// [`enqueue_all`]: Self::enqueue_all
/// [`retry_now`]: Self::retry_now
/// [`requeue`]: Self::requeue
/// [`claim`]: Self::claim
/// [`ack`]: Self::ack
/// [`received`]: Self::received
/// [`fail`]: Self::fail
/// [`reconnect`]: Self::reconnect
/// [`progressed`]: Self::progressed
/// [`poll_timeout`]: Self::poll_timeout
/// [`handle_timeout`]: Self::handle_timeout
/// [`pending`]: Self::pending
/// [`inflight`]: Self::inflight
/// [`parked`]: Self::parked
/// [`exhausted`]: Self::exhausted
/// [`acked_through`]: Self::acked_through
/// [`received_through`]: Self::received_through
/// [`sent_through`]: Self::sent_through
/// [`retry`]: Self::retry
/// [`generation`]: Self::generation
/// [`next_sequence`]: Self::next_sequence
/// [`isolation`]: Self::isolation
#[derive(Clone, Debug, PartialEq)]
pub struct EgressCore<T> {
    pub(crate) policy: Policy,
    pub(crate) generation: Generation,
    pub(crate) next_sequence: Sequence,
    pub(crate) pending: PendingQueue<T>,
    pub(crate) inflight: Window<T>,
    pub(crate) parked: ParkedSet<T>,
    pub(crate) exhausted: BTreeMap<Sequence, Exhausted<T>>,
    pub(crate) acked_through: Option<Sequence>,
    pub(crate) received_through: Option<Sequence>,
    pub(crate) sent_through: Option<Sequence>,
    pub(crate) retry: Option<Retry>,
    /// The receipt watermark moved since the last reconnect.
    pub(crate) progressed: bool,
    pub(crate) isolation: Isolation,
    /// What the store holds, for a core built by `restore`.
    pub(crate) journal: Option<Box<Journal>>,
    /// Records that wait for a flush epoch of the application's state
    /// (`enqueue_after`), by sequence: only those above `released`.
    pub(crate) gates: BTreeMap<Sequence, FlushEpoch>,
    /// Every flush epoch at or below it is released.
    pub(crate) released: FlushEpoch,
    /// The dead letters whose tombstones were acknowledged (skipped by the
    /// receiver), ascending: the newest [`SKIPPED_MEMORY`] of them, so that
    /// their status stays dead once the records are gone.
    pub(crate) skipped: VecDeque<(Sequence, DeadReason)>,
}

/// How many skipped dead letters a core remembers (see
/// [`EgressCore::status`]): their status reads dead, with the reason, after
/// their tombstones were acknowledged and the records forgotten. Past this
/// many the oldest is forgotten, and its status reads acknowledged, like
/// any sequence at or below the watermark.
pub const SKIPPED_MEMORY: usize = 4096;

/// Whether records are sent one at a time, to isolate one that kills its
/// connections (see [`EgressCore`]'s rules).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Isolation {
    /// The window is open.
    #[default]
    Off,
    /// The next claim sends a record alone.
    Ready,
    /// This record is in flight alone: nothing else is claimed until it is
    /// acknowledged, fails, or is replayed.
    Probing(Sequence),
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
            received_through: None,
            sent_through: None,
            retry: None,
            progressed: false,
            isolation: Isolation::Off,
            journal: None,
            gates: BTreeMap::new(),
            released: FlushEpoch(0),
            skipped: VecDeque::new(),
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

    /// The receipt watermark: the peer holds every sequence at or below it,
    /// acknowledged or not (it is at least [`acked_through`](Self::acked_through)).
    /// `None` until the first ack or [`received`](Self::received).
    #[must_use]
    pub const fn received_through(&self) -> Option<Sequence> {
        self.received_through
    }

    /// The highest sequence ever claimed: what acknowledgements and
    /// receipts may cover. Every sequence below it was claimed at least
    /// once. `None` until the first claim.
    #[must_use]
    pub const fn sent_through(&self) -> Option<Sequence> {
        self.sent_through
    }

    /// The state of the most recent failure, while its record is parked or
    /// a dead letter.
    #[must_use]
    pub const fn retry(&self) -> Option<Retry> {
        self.retry
    }

    /// Whether records are being sent one at a time (see the rules above).
    #[must_use]
    pub const fn isolation(&self) -> Isolation {
        self.isolation
    }

    /// The records waiting to be claimed, in sequence order.
    pub fn pending(&self) -> impl ExactSizeIterator<Item = Envelope<&T>> + '_ {
        self.pending.iter(self.generation)
    }

    /// The records waiting to be claimed, in two parts, for a reader that
    /// keeps copies of them between reads: see [`PendingParts`].
    #[must_use]
    pub fn pending_parts(&self) -> PendingParts<'_, T> {
        self.pending.parts(self.generation)
    }

    /// The records in flight, in the order they went in flight.
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
            dead: p.record.dead,
        })
    }

    /// The dead letters held back ([`DeadLetters::Hold`](crate::DeadLetters),
    /// or a tombstone that could not be delivered either), in sequence
    /// order, each with the generation it failed under and, as its `dead`,
    /// why.
    pub fn exhausted(&self) -> impl ExactSizeIterator<Item = Envelope<&T>> + '_ {
        self.exhausted.values().map(|e| Envelope { dead: Some(e.reason), ..e.record.view(e.generation) })
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

    /// How many dead letters are held.
    #[must_use]
    pub fn exhausted_len(&self) -> usize {
        self.exhausted.len()
    }

    /// How many records never sent the window admits now: from the next
    /// sequence not yet sent up to the end of the window, 0 while a probe is
    /// in flight and at most 1 while isolating. (A record sent before always
    /// fits in the window again.)
    #[must_use]
    pub fn window_room(&self) -> usize {
        let unsent = self.sent_through.map_or(0, |s| s.0.saturating_add(1));
        let room = usize::try_from(self.window_end().0.saturating_sub(unsent)).unwrap_or(usize::MAX);
        match self.isolation {
            Isolation::Off => room,
            Isolation::Ready => room.min(1),
            Isolation::Probing(_) => 0,
        }
    }

    /// The first sequence beyond the window: `acked_through + 1 +
    /// inflight_limit`, saturating.
    #[must_use]
    pub fn window_end(&self) -> Sequence {
        let base = self.acked_through.map_or(0, |a| a.0.saturating_add(1));
        let limit = u64::try_from(self.policy.inflight_limit()).unwrap_or(u64::MAX);
        Sequence(base.saturating_add(limit))
    }

    /// Whether [`claim`](Self::claim) under the current generation would
    /// claim a record now.
    #[must_use]
    #[inline]
    pub fn can_claim(&self) -> bool {
        self.pending.head().is_some_and(|head| self.refusal_for(head).is_none())
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
    /// With a journal it is claimable once durable (see
    /// [`poll_ready`](Self::poll_ready)).
    ///
    /// Changes: pending; durable, with a journal.
    pub fn enqueue(&mut self, payload: T) -> Transition<Sequence> {
        let sequence = self.next_sequence;
        self.pending.push_new(sequence, payload);
        self.next_sequence = sequence.next();
        Transition::new(sequence, self.enqueue_changes())
    }

    /// Queues every payload in order and returns the range of sequences
    /// assigned: one transition, one invalidation, for many records.
    ///
    /// Changes: pending (and durable, with a journal), if anything was
    /// queued.
    pub fn enqueue_all(&mut self, payloads: impl IntoIterator<Item = T>) -> Transition<Range<Sequence>> {
        let first = self.next_sequence;
        for payload in payloads {
            let _ = self.enqueue(payload);
        }
        let range = first..self.next_sequence;
        let changed = !range.is_empty();
        Transition::new(range, if changed { self.enqueue_changes() } else { Changes::NONE })
    }

    /// Whether the pending record `head` (the lowest) can be claimed now.
    #[inline]
    pub(crate) fn claimable(&self, head: Sequence) -> bool {
        self.refusal_for(head).is_none()
    }

    /// Why the pending record `head` cannot be claimed now, if it cannot.
    /// The checks in the order their outcomes are reported: an ordering
    /// rule, then isolation, then the window, then a flush gate, then
    /// durability.
    #[inline]
    fn refusal_for<'a>(&self, head: Sequence) -> Option<ClaimOutcome<'a, T>> {
        if self.policy.ordering() == Ordering::Strict {
            let parked = self.parked.first_sequence();
            let exhausted = self.exhausted.first_key_value().map(|(s, _)| *s);
            let lowest = match (parked, exhausted) {
                (Some(p), Some(e)) => Some(p.min(e)),
                (p, e) => p.or(e),
            };
            if let Some(sequence) = lowest.filter(|s| *s < head) {
                return Some(ClaimOutcome::Blocked { sequence });
            }
        }
        if let Isolation::Probing(probe) = self.isolation {
            return Some(ClaimOutcome::Isolating { probe });
        }
        if head >= self.window_end() {
            return Some(ClaimOutcome::WindowFull);
        }
        if self.gates.is_empty() && self.journal.is_none() {
            return None;
        }
        self.gate_refusal(head)
    }

    /// The flush gate and the durability gates on claiming `head` (kept
    /// out of line: a core without a journal or gates never gets here).
    #[inline(never)]
    fn gate_refusal<'a>(&self, head: Sequence) -> Option<ClaimOutcome<'a, T>> {
        if let Some(&epoch) = self.gates.get(&head) {
            return Some(ClaimOutcome::Gated { sequence: head, epoch });
        }
        self.durability_refusal(head)
    }

    /// Moves the lowest pending record into flight and hands out a view of
    /// it, with its attempt count incremented. A tombstone (its envelope's
    /// `dead` set) is claimed like any record; send it as a skip.
    ///
    /// Refused with `StaleGeneration` unless `generation` is the core's.
    /// Then, in this order: `Empty` (nothing pending); under
    /// [`Ordering::Strict`], `Blocked` by the lowest parked or exhausted
    /// sequence below the lowest pending one; `Isolating` (a probe is in
    /// flight alone); `WindowFull` (the lowest pending sequence lies at or
    /// beyond [`window_end`](Self::window_end)); with a journal,
    /// `GenerationUnpersisted` (the current generation is not durable) and
    /// `Unpersisted` (the record is not); before those, `Gated` (the
    /// record waits for a flush epoch: see
    /// [`enqueue_after`](Self::enqueue_after)).
    ///
    /// Changes: pending and inflight, when claimed.
    #[inline(always)]
    pub fn claim(&mut self, generation: Generation) -> Transition<ClaimOutcome<'_, T>> {
        if generation != self.generation {
            return Transition::unchanged(ClaimOutcome::StaleGeneration { current: self.generation });
        }
        let Some((head, fresh)) = self.pending.locate() else {
            return Transition::unchanged(ClaimOutcome::Empty);
        };
        if let Some(refusal) = self.refusal_for(head) {
            return Transition::unchanged(refusal);
        }
        let g = self.generation;
        let claimed = self.claim_located(head, fresh).view(g);
        Transition::new(
            ClaimOutcome::Claimed(claimed),
            Changes::NONE.with(Projection::Pending).with(Projection::Inflight),
        )
    }

    /// Moves the pending head `head` (in the part `fresh` names, as
    /// [`PendingQueue::locate`] said) into flight, with its attempt
    /// counted: [`claim`](Self::claim) once nothing refuses it, or a caller
    /// that knows nothing does (see [`claimable`](Self::claimable)).
    #[inline(always)]
    pub(crate) fn claim_located(&mut self, head: Sequence, fresh: bool) -> &Record<T> {
        debug_assert!(self.refusal_for(head).is_none(), "a claim of a head that cannot go");
        let mut record = self.pending.pop(fresh).expect("invariant broken: pending has a head but no record");
        record.attempt = record.attempt.saturating_next();
        record.resend = false;
        self.sent_through = Some(self.sent_through.map_or(head, |s| s.max(head)));
        if self.isolation == Isolation::Ready {
            self.isolation = Isolation::Probing(head);
        }
        self.inflight.push(record)
    }

    /// Takes a cumulative acknowledgement: every sequence at or below
    /// `through` was delivered.
    ///
    /// Refused with `StaleGeneration` unless `generation` is the core's, and
    /// with `Unsent` when `through` is above [`sent_through`](Self::sent_through)
    /// (an ack of what never went on the wire must not drop records).
    /// `Unchanged` when the watermark is already at or past `through`.
    ///
    /// Changes: acked_through; received, if `through` is above it; each of
    /// pending, inflight, parked, exhausted that lost a record; retry, if its
    /// record was acknowledged.
    pub fn ack(&mut self, generation: Generation, through: Sequence) -> Transition<AckOutcome> {
        if generation != self.generation {
            return Transition::unchanged(AckOutcome::StaleGeneration { current: self.generation });
        }
        if self.sent_through.is_none_or(|s| through > s) {
            return Transition::unchanged(AckOutcome::Unsent { through, sent_through: self.sent_through });
        }
        if self.acked_through.is_some_and(|w| through <= w) {
            return Transition::unchanged(AckOutcome::Unchanged { through: self.acked_through });
        }
        self.remember_skipped(through);
        self.acked_through = Some(through);
        let received = self.note_receipt(through);
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
        if let Isolation::Probing(probe) = self.isolation
            && probe <= through
        {
            self.isolation = Isolation::Ready;
        }
        let changes = Changes::NONE
            .with(Projection::AckedThrough)
            .with_if(Projection::Received, received)
            .with_if(Projection::Pending, self.pending.remove_through(through))
            .with_if(Projection::Inflight, self.inflight.remove_through(through))
            .with_if(Projection::Parked, self.parked.remove_through(through))
            .with_if(Projection::Exhausted, exhausted_changed)
            .with_if(Projection::Retry, retry_cleared);
        Transition::new(AckOutcome::Advanced { through }, changes)
    }

    /// Remembers the tombstones an acknowledgement through `through` is
    /// about to retire: the receiver skipped them.
    fn remember_skipped(&mut self, through: Sequence) {
        // Usually none of them is a tombstone: look before gathering.
        let dead = |r: &Record<T>| r.dead.is_some();
        if !(self.inflight.any_through(through, dead)
            || self.pending.any_returned_through(through, dead)
            || self.parked.any_through(through, dead))
        {
            return;
        }
        let mut skipped: Vec<(Sequence, DeadReason)> = self
            .inflight
            .through(through)
            .chain(self.pending.returned_through(through))
            .chain(self.parked.through(through))
            .filter_map(|r| Some((r.sequence, r.dead?)))
            .collect();
        skipped.sort_unstable_by_key(|(s, _)| *s);
        self.remember(skipped);
    }

    /// Appends skipped dead letters (ascending, above every one remembered)
    /// to the memory, forgetting the oldest past [`SKIPPED_MEMORY`].
    pub(crate) fn remember(&mut self, skipped: impl IntoIterator<Item = (Sequence, DeadReason)>) {
        for entry in skipped {
            debug_assert!(self.skipped.back().is_none_or(|(s, _)| *s < entry.0));
            if self.skipped.len() == SKIPPED_MEMORY {
                self.skipped.pop_front();
            }
            self.skipped.push_back(entry);
        }
    }

    /// Why the acknowledged sequence `sequence` was skipped, if it was a
    /// dead letter the core still remembers.
    pub(crate) fn skipped_reason(&self, sequence: Sequence) -> Option<DeadReason> {
        let at = self.skipped.binary_search_by_key(&sequence, |(s, _)| *s).ok()?;
        Some(self.skipped[at].1)
    }

    /// Takes word that the peer processed the in-flight record `sequence`
    /// of the current generation out of order, before an earlier record: a
    /// completion above the acknowledgement watermark, as
    /// [`Completions`](crate::Completions) tracks them. That is progress, as
    /// a receipt is: isolation ends (a probe completed above a gap must not
    /// hold back the record below it, or the lane waits for a reconnect),
    /// and the next reconnect does not isolate. Neither watermark moves.
    /// Returns whether isolation ended.
    ///
    /// Refused (`false`, no change) unless `generation` is the core's and
    /// `sequence` is in flight.
    ///
    /// Changes: none of the projections (isolation is not one; the room
    /// of the window, which it bounds, is worth recounting when the outcome
    /// is `true`).
    pub fn progressed(&mut self, generation: Generation, sequence: Sequence) -> Transition<bool> {
        if generation != self.generation || self.inflight.get(sequence).is_none() {
            return Transition::unchanged(false);
        }
        self.progressed = true;
        let ended = self.isolation != Isolation::Off;
        self.isolation = Isolation::Off;
        Transition::unchanged(ended)
    }

    /// Raises the receipt watermark to `through` if it is below; that is
    /// progress, and ends isolation. Returns whether it moved.
    pub(crate) fn note_receipt(&mut self, through: Sequence) -> bool {
        if self.received_through.is_some_and(|r| through <= r) {
            return false;
        }
        self.received_through = Some(through);
        self.progressed = true;
        self.isolation = Isolation::Off;
        true
    }

    /// Clears `retry` if it describes `sequence`; returns whether it did.
    pub(crate) fn clear_retry_of(&mut self, sequence: Sequence) -> bool {
        let clear = self.retry.is_some_and(|r| r.sequence == sequence);
        if clear {
            self.retry = None;
        }
        clear
    }
}
