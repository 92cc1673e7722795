//! What every part of a cell shares: the graph, the core and its jitter,
//! the triggers and counts, the clock; and the one path every transition
//! takes (apply, then notify exactly what changed).

use std::panic::{AssertUnwindSafe, Location, catch_unwind, resume_unwind};
use std::sync::Arc;

use egress_core::{
    Changes, ClaimOutcome, EgressCore, Envelope, FailOutcome, FailureKind, Generation, JitterSample, Projection,
    Sequence, Time,
};

use super::clock::Clock;
use super::transport::SendError;
use super::transport::Transport;
use crate::computed::Computed;
use crate::context::Handle;
use crate::effect::RunEffect;
use crate::flavor::{Entered, Flavor, ValueCell};
use crate::graph::{Key, NONE};
use crate::run;

/// The core and the generator of jitter samples, touched only with the
/// graph entered.
#[doc(hidden)]
pub struct State<T> {
    pub(super) core: EgressCore<T>,
    pub(super) rng: u64,
    /// What a caller's transition changed whose readers it left to the
    /// sending pass it runs at once (see [`Inner::apply`]): notified when
    /// that pass ends (an attachment's run marks it with its own changes).
    pub(super) deferred: Changes,
    /// Whether a synchronous attachment was ever made: only then may a
    /// wake run a pass at once, and [`Inner::apply`] look for one (an
    /// async cell's attachments are scheduled, never run by the wake).
    pub(super) sync_attached: bool,
    /// One trigger per [`Projection`], in declaration order, made when a
    /// reader first tracks it ([`track`]): a projection nobody reads has
    /// none, and a transition that changes it marks nothing. `NONE` while
    /// not made. Set through a shared borrow of the state, since a first
    /// read may come while the state is read (inside
    /// [`with_core`](super::EgressCellOf::with_core), or from a payload's
    /// `Clone` while a list reader copies it).
    pub(super) triggers: [std::cell::Cell<Key>; TRIGGERS],
    /// What owns the triggers: the cell's scope (set once it is made).
    pub(super) owner: Key,
    /// Where the cell was made: its triggers' site.
    pub(super) created_at: &'static Location<'static>,
}

/// A trigger not made yet.
const UNMADE: Key = Key { index: NONE, generation: 0 };

impl<T> State<T> {
    /// The state of a new cell over `core`, its jitter drawn from `rng`,
    /// made at `created_at`.
    pub(super) fn new(core: EgressCore<T>, rng: u64, created_at: &'static Location<'static>) -> Self {
        State {
            core,
            rng,
            deferred: Changes::NONE,
            sync_attached: false,
            triggers: [const { std::cell::Cell::new(UNMADE) }; TRIGGERS],
            owner: UNMADE,
            created_at,
        }
    }

    /// The next jitter sample.
    fn jitter(&mut self) -> JitterSample {
        next_jitter(&mut self.rng)
    }
}

/// Makes the running computation depend on projection `p` of the cell
/// whose state is `s`: tracks its trigger, made now (owned by the cell's
/// scope) if no reader has tracked it before. Nothing is tracked once the
/// scope is gone: the readers went with it. Making the trigger needs only
/// the graph: `s` stays borrowed (shared) for the reader's projection.
pub(super) fn track<T, F: Flavor>(handle: &Handle<F>, s: &State<T>, cell: &run::Cell<F>, p: Projection) {
    let slot = &s.triggers[p as usize];
    let mut trigger = slot.get();
    if trigger.index == NONE {
        // (The scope is set as soon as the cell is built, before anything
        // can read a reader.)
        if s.owner.index == NONE {
            return;
        }
        let Ok(made) = handle.with_owner(s.owner, || handle.trigger(s.created_at)) else { return };
        slot.set(made);
        trigger = made;
    }
    Handle::track(cell, trigger);
}

/// Logs a failure that parked a record (debug) or made a dead letter
/// (warn): a cell's, or a lanes cell's with its lane.
pub(super) fn trace_failure(outcome: &FailOutcome, kind: FailureKind, lane: Option<&impl std::fmt::Debug>) {
    match outcome {
        FailOutcome::Retrying(r) => tracing::debug!(
            ?lane,
            sequence = r.sequence.get(),
            attempt = r.attempt.get(),
            backoff = r.backoff.0,
            ?kind,
            "egress cell: a send failed, retrying"
        ),
        FailOutcome::Exhausted(r) => {
            tracing::warn!(
                ?lane,
                sequence = r.sequence.get(),
                attempt = r.attempt.get(),
                ?kind,
                "egress cell: a dead letter"
            );
        }
        FailOutcome::UnknownSequence { .. } | FailOutcome::StaleGeneration { .. } => {}
    }
}

/// The next jitter sample from the generator state `rng` (splitmix64): a
/// cell's and a lanes cell's.
pub(super) fn next_jitter(rng: &mut u64) -> JitterSample {
    *rng = rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *rng;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    #[allow(clippy::cast_possible_truncation)]
    JitterSample::from_u32((z >> 32) as u32)
}

/// What every part of a cell needs to apply a transition and invalidate its
/// readers: the graph, the core, the triggers, the clock. Cloned into each
/// attachment, so an attachment does not keep the cell (or its readers)
/// alive.
#[doc(hidden)]
pub struct Inner<T: 'static, F: Flavor> {
    pub(crate) handle: Handle<F>,
    pub(super) state: F::Ptr<F::Cell<State<T>>>,
    /// Notified when a transition not made by an attachment makes a claim
    /// possible: what attachments track.
    pub(crate) wake: Key,
    /// The count readers, pushed computeds kept up to date eagerly (O(1)
    /// per transition), in the order of [`COUNTED`].
    pub(super) counts: [Computed<usize, F>; COUNTS],
    pub(super) clock: Arc<dyn Clock>,
}

/// How many triggers a cell can have: one per projection.
pub(super) const TRIGGERS: usize = Projection::ALL.len();
/// How many count readers a cell has.
pub(super) const COUNTS: usize = 6;
pub(super) const PENDING_LEN: usize = 0;
pub(super) const INFLIGHT_LEN: usize = 1;
pub(super) const WINDOW_ROOM: usize = 2;
pub(super) const PARKED_LEN: usize = 3;
pub(super) const EXHAUSTED_LEN: usize = 4;
pub(super) const UNPERSISTED_LEN: usize = 5;

/// The projections each count follows, in [`Inner::counts`] order: a count
/// is recounted when a transition changes one of them. The window's room
/// follows what moves its end (the watermark), what fills it (claims), and
/// isolation (claims, failures, receipts, reconnects).
pub(super) const COUNTED: [Changes; COUNTS] = [
    Changes::NONE.with(Projection::Pending),
    Changes::NONE.with(Projection::Inflight),
    Changes::NONE
        .with(Projection::Inflight)
        .with(Projection::AckedThrough)
        .with(Projection::Received)
        .with(Projection::Generation),
    Changes::NONE.with(Projection::Parked),
    Changes::NONE.with(Projection::Exhausted),
    Changes::NONE.with(Projection::Durable),
];

/// Whether a change set touches a count's projections: only then is the
/// count worth recounting (recounting it anyway finds the same number).
#[inline]
pub(super) fn overlaps(changes: u16, counted: u16) -> bool {
    changes & counted != 0
}

#[inline]
pub(super) fn count<T>(core: &EgressCore<T>, which: usize) -> usize {
    match which {
        PENDING_LEN => core.pending_len(),
        INFLIGHT_LEN => core.inflight_len(),
        WINDOW_ROOM => core.window_room(),
        PARKED_LEN => core.parked_len(),
        EXHAUSTED_LEN => core.exhausted_len(),
        _ => core.unpersisted_len(),
    }
}

impl<T: 'static, F: Flavor> Clone for Inner<T, F> {
    fn clone(&self) -> Self {
        Inner {
            handle: self.handle.clone(),
            state: self.state.clone(),
            wake: self.wake,
            counts: self.counts.clone(),
            clock: self.clock.clone(),
        }
    }
}

/// The keys one transition notifies: at most one per trigger, one per
/// count, and the wake trigger.
pub(super) struct Keys {
    pub(super) keys: [Key; TRIGGERS + COUNTS + 1],
    pub(super) n: usize,
}

impl Keys {
    pub(super) fn new(filler: Key) -> Self {
        Keys { keys: [filler; TRIGGERS + COUNTS + 1], n: 0 }
    }

    pub(super) fn as_slice(&self) -> &[Key] {
        &self.keys[..self.n]
    }
}

/// Where the keys a transition notifies go: gathered, for a caller that
/// must do something between learning them and notifying ([`Keys`]), or
/// marked as they come, under one borrow of the graph ([`run::Marker`]).
pub(super) trait KeySink {
    fn push(&mut self, key: Key);
}

impl KeySink for Keys {
    #[inline]
    fn push(&mut self, key: Key) {
        self.keys[self.n] = key;
        self.n += 1;
    }
}

impl<F: Flavor> KeySink for run::Marker<'_, F> {
    #[inline(always)]
    fn push(&mut self, key: Key) {
        self.mark(key);
    }
}

/// Who made a transition: attachments' own claims and failures must not wake
/// attachments (one run per sending pass).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum By {
    Caller,
    Attachment,
}

impl<T: 'static, F: Flavor> Inner<T, F> {
    /// Applies `op` to the core with the graph entered, then invalidates
    /// exactly the readers of the projections it changed (and wakes the
    /// attachments if a caller's transition made a claim possible), as one
    /// write. `op` must not call into the cell.
    ///
    /// A wake that runs a synchronous attachment at once (no batch, run,
    /// settlement or flush under way, so that its pass is the first thing
    /// the write runs, and a run that begins with its own code: see
    /// [`wake_first`](Self::wake_first)) makes the transition and the pass
    /// one write: the readers are notified once, when the pass ends, of
    /// what both changed, and a count the pass brings back where it was
    /// (the pending count of an enqueue sent at once) notifies nobody.
    pub(crate) fn apply<R>(&self, by: By, op: impl FnOnce(&mut State<T>) -> (R, Changes)) -> R {
        self.transition(by, true, op)
    }

    /// [`apply`](Self::apply), which runs the effects it queued (`flush`)
    /// or leaves them queued, for the caller to run soon: the readers know
    /// of the transition either way (a count read now is the new count).
    #[inline(always)]
    fn transition<R>(&self, by: By, flush: bool, op: impl FnOnce(&mut State<T>) -> (R, Changes)) -> R {
        self.handle.enter(|cell| {
            let entered = Entered::by(cell);
            let (outcome, marked, deferred) = self.state.with_mut(&entered, |s| {
                let (outcome, changes) = op(s);
                if changes.is_empty() {
                    return (outcome, None, false);
                }
                let wake = by == By::Caller && s.core.can_claim();
                let mut marker = run::Marker::new(cell);
                let deferred = if flush && wake && s.sync_attached {
                    self.wake_first(&entered, s, changes, &mut marker)
                } else {
                    self.keys(&entered, s, changes, wake, &mut marker);
                    false
                };
                (outcome, Some(marker), deferred)
            });
            // The effects run once the core is released: they read it.
            if flush
                && let Some(marker) = marked
                && let Err(e) = marker.flush()
            {
                panic!("{e}");
            }
            // The pass ran first in the flush (`wake_first`), and an
            // attachment's run ends by marking what was deferred (`Marks`),
            // whether it returns or unwinds.
            debug_assert!(
                !deferred || self.state.with(&entered, |s| s.deferred.is_empty()),
                "a deferred notification outlived the pass it was left to"
            );
            outcome
        })
    }

    /// [`keys`](Self::keys) for a transition that wakes the attachments of
    /// a cell that has had a synchronous one: marks the wake, then leaves
    /// `changes` to the pass it runs at once, if it does (see
    /// [`apply`](Self::apply)), or marks their readers. Returns whether it
    /// left them. Out of line: the transitions that wake no attachment
    /// stay small.
    #[inline(never)]
    fn wake_first(
        &self,
        entered: &Entered,
        s: &mut State<T>,
        changes: Changes,
        marker: &mut run::Marker<'_, F>,
    ) -> bool {
        let idle = marker.idle();
        marker.mark(self.wake);
        // Only the wake's subscribers are queued, in subscription order,
        // and they are attachments: the first one queued, if it runs at
        // once, is the pass that runs first, and its run ends by marking
        // what is deferred (`Marks`), whether it returns or unwinds.
        if idle && marker.first_queued_runs_at_once() {
            s.deferred = s.deferred.union(changes);
            return true;
        }
        self.keys(entered, s, changes, false, marker);
        false
    }

    /// Runs the effects that transitions left queued (see
    /// [`claim_marked`](Self::claim_marked)), unless a batch or a flush
    /// under way is to run them.
    #[cfg(feature = "async")]
    pub(crate) fn flush_effects(&self) {
        self.handle.enter(|cell| {
            if let Err(e) = run::flush(cell) {
                panic!("{e}");
            }
        });
    }

    pub(super) fn notify(&self, cell: &run::Cell<F>, keys: &[Key]) {
        if !keys.is_empty()
            && let Err(e) = run::notify(cell, keys)
        {
            panic!("{e}");
        }
    }

    /// What to notify for `changes`, into `keys` (the caller's, so that no
    /// array is copied out): the triggers of the lazy readers, the counts
    /// whose value changed (recounted here, from `core`), and the wake
    /// trigger.
    #[inline(always)]
    pub(super) fn keys(&self, entered: &Entered, s: &State<T>, changes: Changes, wake: bool, keys: &mut impl KeySink) {
        let core = &s.core;
        // The wake first: the attachments it queues run before the
        // effects of the readers, which then see their claims too (one run
        // of a screen's effect per enqueue that starts a pass, not two).
        if wake {
            keys.push(self.wake);
        }
        let bits = changes.bits();
        // The set bits only: a transition changes one to three of the ten
        // projections. A trigger not made has no reader to notify.
        let mut rest = bits;
        while rest != 0 {
            if let Some(trigger) = s.triggers.get(rest.trailing_zeros() as usize).map(std::cell::Cell::get)
                && trigger.index != NONE
            {
                keys.push(trigger);
            }
            rest &= rest - 1;
        }
        // Each count by its constant index, written out rather than looped
        // over: every caller then tests each count's projections against a
        // constant and recounts it with its own accessor (where the
        // compiler kept the loop, as in an attachment's run's marks, each
        // count went through `count`'s jump table).
        macro_rules! recount {
            ($($which:expr),*) => {$(
                let reader = &self.counts[$which];
                if overlaps(bits, COUNTED[$which].bits()) && reader.push(entered, count(core, $which)) {
                    keys.push(reader.key);
                }
            )*};
        }
        recount!(PENDING_LEN, INFLIGHT_LEN, WINDOW_ROOM, PARKED_LEN, EXHAUSTED_LEN, UNPERSISTED_LEN);
    }

    /// Takes a completion above the acknowledgement watermark (see
    /// [`EgressCore::progressed`]). It changes no projection; when it ends
    /// isolation, the window's room is recounted and the attachments are
    /// woken if a claim is now possible.
    pub(crate) fn progressed(&self, generation: Generation, sequence: Sequence) -> bool {
        self.handle.enter(|cell| {
            let entered = Entered::by(cell);
            let mut keys = Keys::new(self.wake);
            let ended = self.state.with_mut(&entered, |s| {
                let ended = s.core.progressed(generation, sequence).outcome;
                if ended {
                    // The wake first, as in `keys`.
                    if s.core.can_claim() {
                        keys.push(self.wake);
                    }
                    let room = &self.counts[WINDOW_ROOM];
                    if room.push(&entered, s.core.window_room()) {
                        keys.push(room.key);
                    }
                }
                ended
            });
            self.notify(cell, keys.as_slice());
            ended
        })
    }

    /// Marks the readers of `changes` (and of what is
    /// [deferred](State::deferred)) dirty without running effects: for an
    /// attachment's run, whose flush runs them when the run ends.
    pub(super) fn mark(&self, changes: Changes) {
        self.handle.enter(|cell| {
            let entered = Entered::by(cell);
            self.state.with_mut(&entered, |s| {
                let changes = changes.union(std::mem::take(&mut s.deferred));
                if !changes.is_empty() {
                    self.keys(&entered, s, changes, false, &mut run::Marker::new(cell));
                }
            });
        });
    }

    /// Notes that a synchronous attachment is being made (see
    /// [`State::sync_attached`]).
    pub(super) fn note_sync_attachment(&self) {
        self.handle.enter(|cell| self.state.with_mut(&Entered::by(cell), |s| s.sync_attached = true));
    }

    /// Reads the core, untracked.
    pub(crate) fn with_core<R>(&self, f: impl FnOnce(&EgressCore<T>) -> R) -> R {
        self.handle.enter(|cell| self.state.with(&Entered::by(cell), |s| f(&s.core)))
    }

    pub(crate) fn now(&self) -> Time {
        self.clock.now()
    }

    pub(crate) fn fail(
        &self,
        by: By,
        generation: Generation,
        sequence: Sequence,
        kind: FailureKind,
        jitter: Option<JitterSample>,
    ) -> FailOutcome {
        let now = self.clock.now();
        let outcome = self.apply(by, |s| {
            let jitter = jitter.unwrap_or_else(|| s.jitter());
            let t = s.core.fail(generation, sequence, kind, now, jitter);
            (t.outcome, t.changes)
        });
        trace_failure(&outcome, kind, None::<&()>);
        outcome
    }

    /// Reports an attachment's failed send; returns whether its sending pass
    /// goes on. A failure that parks the record stops the pass (the
    /// connection is suspect; the record's timer, or the next ack or
    /// enqueue, starts the next one). One that makes a dead letter does not:
    /// the payload was at fault, and its tombstone, if it has one, goes out
    /// in this pass.
    pub(crate) fn fail_in_pass(&self, generation: Generation, sequence: Sequence, kind: FailureKind) -> bool {
        !matches!(self.fail(By::Attachment, generation, sequence, kind, None), FailOutcome::Retrying(_))
    }

    /// Claims the next record for an async attachment of `generation`: a
    /// copy of it, or `None` when the core allows no claim (or the
    /// attachment is fenced). The readers know of the claim when this
    /// returns (its sends run outside the graph's lock, where another
    /// thread may see what was sent); the effects it queued are left
    /// queued, for the attachment to run before it waits and when its pass
    /// ends ([`flush_effects`](Self::flush_effects)), so that a pass of
    /// sends that complete at once runs them once.
    #[cfg(feature = "async")]
    pub(crate) fn claim_marked(&self, generation: Generation) -> Option<Envelope<T>>
    where
        T: Clone,
    {
        let clock = &*self.clock;
        let (envelope, panic) = self.transition(By::Attachment, false, |s| {
            let (envelope, changes, panic) = Self::claim_in(s, generation, clock);
            ((envelope, panic), changes)
        });
        if let Some(panic) = panic {
            resume_unwind(panic);
        }
        envelope
    }

    /// Claims in the core and copies the record out. A copy that panics (a
    /// payload whose `Clone` panics) fails the record as a transient
    /// failure, so that it is not left in flight unsent; the panic is
    /// returned, to be resumed once the readers know of both transitions.
    #[inline(always)]
    fn claim_in(
        s: &mut State<T>,
        generation: Generation,
        clock: &dyn Clock,
    ) -> (Option<Envelope<T>>, Changes, Option<run::Panic>)
    where
        T: Clone,
    {
        let t = s.core.claim(generation);
        let changes = t.changes;
        let ClaimOutcome::Claimed(envelope) = t.outcome else { return (None, changes, None) };
        let sequence = envelope.sequence;
        match catch_unwind(AssertUnwindSafe(|| envelope.cloned())) {
            Ok(envelope) => (Some(envelope), changes, None),
            Err(panic) => {
                // The clock is read only here, on this rare path (not per
                // claim); a clock that panics too makes the record due at
                // once.
                let now = catch_unwind(AssertUnwindSafe(|| clock.now())).unwrap_or(Time(0));
                let jitter = s.jitter();
                let failed = s.core.fail(generation, sequence, FailureKind::Transient, now, jitter);
                (None, changes.union(failed.changes), Some(panic))
            }
        }
    }

    /// A claim, as [`claim_marked`](Self::claim_marked) makes, inside a
    /// synchronous attachment's own effect run (`entered`: the graph is
    /// entered already): the readers are marked with the run's other
    /// claims when it ends (see [`Marks`]), since its sends run under the
    /// graph's lock.
    #[inline]
    pub(super) fn claim_quiet(
        &self,
        entered: &Entered,
        generation: Generation,
        marks: &mut Marks<'_, T, F>,
    ) -> Option<Envelope<T>>
    where
        T: Clone,
    {
        let clock = &*self.clock;
        let (envelope, changes, panic) = self.state.with_mut(entered, |s| Self::claim_in(s, generation, clock));
        marks.changes = marks.changes.union(changes);
        if let Some(panic) = panic {
            resume_unwind(panic);
        }
        envelope
    }

    /// Sends one claimed envelope through `send`; a send that panics fails
    /// the record (as transient: it may never have left) before the panic
    /// goes on, so that it is not left in flight with nobody to send it.
    /// Returns whether the pass goes on (see [`fail_in_pass`](Self::fail_in_pass)).
    #[inline]
    pub(crate) fn send_in_pass(
        &self,
        generation: Generation,
        sequence: Sequence,
        send: impl FnOnce() -> Result<(), SendError>,
    ) -> bool {
        match catch_unwind(AssertUnwindSafe(send)) {
            Ok(Ok(())) => true,
            Ok(Err(error)) => self.fail_in_pass(generation, sequence, error.kind()),
            Err(panic) => {
                self.fail(By::Attachment, generation, sequence, FailureKind::Transient, None);
                resume_unwind(panic)
            }
        }
    }

    /// When the earliest parked record is due.
    pub(crate) fn poll_timeout(&self) -> Option<Time> {
        self.with_core(EgressCore::poll_timeout)
    }

    /// Makes every parked record due at `now` pending again.
    pub(crate) fn handle_timeout(&self, now: Time) -> Vec<Sequence> {
        self.apply(By::Caller, |s| {
            let t = s.core.handle_timeout(now);
            (t.outcome, t.changes)
        })
    }

    /// Makes the running computation depend on the wake trigger.
    pub(crate) fn track_wake(&self) {
        self.handle.enter(|cell| Handle::track(cell, self.wake));
    }
}

/// How many records `core` holds unacknowledged: every sequence taken and
/// not yet at or below the watermark.
pub(crate) fn unacknowledged<T>(core: &EgressCore<T>) -> usize {
    let first = core.acked_through().map_or(0, |s| s.get().saturating_add(1));
    usize::try_from(core.next_sequence().get().saturating_sub(first)).unwrap_or(usize::MAX)
}

/// The run of a synchronous attachment: claim, send, repeat.
#[doc(hidden)]
pub struct AttachRun<T: 'static, Tr, F: Flavor> {
    pub(super) inner: Inner<T, F>,
    pub(super) transport: Tr,
    pub(super) generation: Generation,
}

/// The changes of an attachment run's claims, marked once when the run
/// ends (or unwinds): the run happens inside a flush or an effect's
/// creation, which then runs the effects the marks queued.
pub(super) struct Marks<'a, T: 'static, F: Flavor> {
    pub(super) inner: &'a Inner<T, F>,
    pub(super) changes: Changes,
}

impl<T: 'static, F: Flavor> Drop for Marks<'_, T, F> {
    fn drop(&mut self) {
        self.inner.mark(self.changes);
    }
}

impl<T: Clone + 'static, Tr: Transport<T>, F: Flavor> RunEffect for AttachRun<T, Tr, F> {
    #[inline]
    fn run_effect(&mut self, entered: &Entered) {
        self.inner.track_wake();
        let mut marks = Marks { inner: &self.inner, changes: Changes::NONE };
        while let Some(envelope) = self.inner.claim_quiet(entered, self.generation, &mut marks) {
            let sequence = envelope.sequence;
            let transport = &mut self.transport;
            if !self.inner.send_in_pass(self.generation, sequence, || transport.send(envelope)) {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use egress_core::{EgressCore, JitterSample, Policy};

    use super::State;

    #[test]
    fn the_jitter_generator_is_splitmix64() {
        // Reference values computed apart (splitmix64 from state 0: the
        // high halves of 0xe220a8397b1dcdaf, 0x6e789e6a53e4a4a0, …).
        let mut s = State::new(EgressCore::<()>::new(Policy::default()), 0, std::panic::Location::caller());
        let drawn: Vec<JitterSample> = (0..4).map(|_| s.jitter()).collect();
        let expected: Vec<JitterSample> =
            [0xe220_a839, 0x6e78_9e6a, 0x06c4_5d18, 0xf88b_b8a8].into_iter().map(JitterSample::from_u32).collect();
        assert_eq!(drawn, expected);
    }
}
