//! [`EgressCellOf`]: an [`EgressCore`] projected into a graph. One
//! implementation for every flavour; the async cell wraps it.

use std::hash::BuildHasher;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, Location, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::time::Duration;

use egress_core::{
    AckOutcome, AdoptOutcome, Changes, ClaimOutcome, DeadReason, EgressCore, Envelope, Epoch, FailOutcome, FailureKind,
    Generation, Incarnation, JitterSample, MessageStatus, PersistError, PersistOutcome, Policy, Projection, Ready,
    ReceivedOutcome, ReconnectOutcome, Retry, ScheduleOutcome, Sequence, Time,
};

use super::clock::{Clock, MonotonicClock};
use super::transport::{SendError, Transport};
use crate::computed::{ByEq, Compute, Computed, ComputedObj, Cutoff, Never};
use crate::context::{Handle, NodeRef, Scope};
use crate::effect::{EffectObj, RunEffect};
use crate::flavor::{Entered, Flavor, Holds, Local, Threaded, ValueCell};
use crate::graph::Key;
use crate::run;

/// A list reader's value: an immutable snapshot, cheap to clone (one
/// reference count). Built only when a list reader is read after a change;
/// no write path copies a list.
pub type Snapshot<E> = Arc<[E]>;

/// A parked record, as the [`parked`](EgressCellOf::parked) reader shows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ParkedRecord<T> {
    /// The record.
    pub sequence: Sequence,
    /// Attempts so far.
    pub attempt: egress_core::Attempt,
    /// The backoff it waits.
    pub backoff: egress_core::Delay,
    /// When it becomes due.
    pub due: Time,
    /// Its payload.
    pub payload: T,
    /// `Some` for a tombstone waiting for its retry.
    pub dead: Option<DeadReason>,
}

/// How to build a cell, beyond its policy: the generation it starts at, the
/// incarnation of its sequence space, its clock, and the seed of its jitter.
///
/// ```
/// use egress_core::{Generation, Policy, Time};
/// use egress_reactive::{CellOptions, Context, EgressCell, ManualClock};
///
/// let cx = Context::new();
/// let clock = ManualClock::new();
/// let options = CellOptions::new().generation(Generation(7)).clock(clock.clone()).jitter_seed(42);
/// let cell: EgressCell<&str> = EgressCell::with_options(&cx, Policy::default(), options);
/// assert_eq!(cell.generation().get(), Generation(7));
/// clock.set(Time(1_000));
/// assert_eq!(cell.now(), Time(1_000));
/// ```
#[derive(Clone, Default)]
pub struct CellOptions {
    generation: Generation,
    incarnation: Option<Incarnation>,
    clock: Option<Arc<dyn Clock>>,
    jitter_seed: Option<u64>,
    capacity: Option<usize>,
}

impl CellOptions {
    /// The defaults: generation 0, a random incarnation, the flavour's
    /// default clock, a random jitter seed.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The generation the cell starts at (a producer that restarts picks one
    /// above any it used before).
    #[must_use]
    pub fn generation(mut self, generation: Generation) -> Self {
        self.generation = generation;
        self
    }

    /// The incarnation of the cell's sequence space, which transports send
    /// so that a receiver never mistakes this sequence space for another
    /// producer's run (see [`Incarnation`]). By default 128 bits from the
    /// standard library's randomly seeded hasher, new for every cell: right
    /// for a cell whose records live only in memory. A cell restored from
    /// a store continues the stored incarnation.
    #[must_use]
    pub fn incarnation(mut self, incarnation: Incarnation) -> Self {
        self.incarnation = Some(incarnation);
        self
    }

    /// The clock the cell reads `now` from.
    #[must_use]
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The seed of the generator that draws each failure's jitter sample, for
    /// reproducible runs.
    #[must_use]
    pub fn jitter_seed(mut self, seed: u64) -> Self {
        self.jitter_seed = Some(seed);
        self
    }

    /// The most records the cell holds unacknowledged before
    /// [`try_enqueue`](EgressCellOf::try_enqueue) refuses (and
    /// [`AsyncEgressCell::enqueue_when_room`](crate::AsyncEgressCell::enqueue_when_room)
    /// waits): backpressure for a producer faster than its peer. Pending,
    /// in flight, retrying and dead letters not yet skipped all count;
    /// only an acknowledgement makes room. [`enqueue`](EgressCellOf::enqueue)
    /// ignores it. Without it, no bound.
    #[must_use]
    pub fn capacity(mut self, records: usize) -> Self {
        self.capacity = Some(records);
        self
    }

    #[cfg(feature = "async")]
    pub(crate) const fn generation_of(&self) -> Generation {
        self.generation
    }

    pub(crate) fn take_clock(&mut self, default: impl FnOnce() -> Arc<dyn Clock>) -> Arc<dyn Clock> {
        self.clock.take().unwrap_or_else(default)
    }
}

impl std::fmt::Debug for CellOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CellOptions")
            .field("generation", &self.generation)
            .field("incarnation", &self.incarnation)
            .field("clock", &self.clock.as_ref().map(|_| "custom"))
            .field("jitter_seed", &self.jitter_seed)
            .field("capacity", &self.capacity)
            .finish()
    }
}

/// The core and the generator of jitter samples, touched only with the
/// graph entered.
#[doc(hidden)]
pub struct State<T> {
    core: EgressCore<T>,
    rng: u64,
}

impl<T> State<T> {
    /// The next jitter sample (splitmix64).
    fn jitter(&mut self) -> JitterSample {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        #[allow(clippy::cast_possible_truncation)]
        JitterSample::from_u32((z >> 32) as u32)
    }
}

/// What every part of a cell needs to apply a transition and invalidate its
/// readers: the graph, the core, the triggers, the clock. Cloned into each
/// attachment, so an attachment does not keep the cell (or its readers)
/// alive.
#[doc(hidden)]
pub struct Inner<T: 'static, F: Flavor> {
    pub(crate) handle: Handle<F>,
    state: F::Ptr<F::Cell<State<T>>>,
    /// One trigger per [`Projection`], in declaration order.
    triggers: [Key; TRIGGERS],
    /// Notified when a transition not made by an attachment makes a claim
    /// possible: what attachments track.
    pub(crate) wake: Key,
    /// The count readers, pushed computeds kept up to date eagerly (O(1)
    /// per transition), in the order of [`COUNTED`].
    counts: [Computed<usize, F>; COUNTS],
    clock: Arc<dyn Clock>,
}

/// The order of [`Inner::counts`], and how each is counted.
/// How many triggers a cell has: one per projection.
const TRIGGERS: usize = Projection::ALL.len();
/// How many count readers a cell has.
const COUNTS: usize = 6;
const PENDING_LEN: usize = 0;
const INFLIGHT_LEN: usize = 1;
const WINDOW_ROOM: usize = 2;
const PARKED_LEN: usize = 3;
const EXHAUSTED_LEN: usize = 4;
const UNPERSISTED_LEN: usize = 5;

/// The projections each count follows, in [`Inner::counts`] order: a count
/// is recounted when a transition changes one of them. The window's room
/// follows what moves its end (the watermark), what fills it (claims), and
/// isolation (claims, failures, receipts, reconnects).
const COUNTED: [Changes; COUNTS] = [
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
fn overlaps(changes: u16, counted: u16) -> bool {
    changes & counted != 0
}

#[inline]
fn count<T>(core: &EgressCore<T>, which: usize) -> usize {
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
            triggers: self.triggers,
            wake: self.wake,
            counts: self.counts.clone(),
            clock: self.clock.clone(),
        }
    }
}

/// The keys one transition notifies: at most one per trigger, one per
/// count, and the wake trigger.
struct Keys {
    keys: [Key; TRIGGERS + COUNTS + 1],
    n: usize,
}

impl Keys {
    fn new(filler: Key) -> Self {
        Keys { keys: [filler; TRIGGERS + COUNTS + 1], n: 0 }
    }

    #[inline]
    fn push(&mut self, key: Key) {
        self.keys[self.n] = key;
        self.n += 1;
    }

    fn as_slice(&self) -> &[Key] {
        &self.keys[..self.n]
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
    pub(crate) fn apply<R>(&self, by: By, op: impl FnOnce(&mut State<T>) -> (R, Changes)) -> R {
        self.handle.enter(|cell| {
            let entered = Entered::by(cell);
            let mut keys = Keys::new(self.wake);
            let outcome = self.state.with_mut(&entered, |s| {
                let (outcome, changes) = op(s);
                let wake = by == By::Caller && !changes.is_empty() && s.core.can_claim();
                self.keys(&entered, &s.core, changes, wake, &mut keys);
                outcome
            });
            self.notify(cell, keys.as_slice());
            outcome
        })
    }

    fn notify(&self, cell: &run::Cell<F>, keys: &[Key]) {
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
    fn keys(&self, entered: &Entered, core: &EgressCore<T>, changes: Changes, wake: bool, keys: &mut Keys) {
        let bits = changes.bits();
        for (i, trigger) in self.triggers.iter().enumerate() {
            if bits >> i & 1 != 0 {
                keys.push(*trigger);
            }
        }
        for (which, reader) in self.counts.iter().enumerate() {
            if overlaps(bits, COUNTED[which].bits()) && reader.push(entered, count(core, which)) {
                keys.push(reader.key);
            }
        }
        if wake {
            keys.push(self.wake);
        }
    }

    /// Marks the readers of `changes` dirty without running effects: for an
    /// attachment's run, whose flush runs them when the run ends.
    fn mark(&self, changes: Changes) {
        if changes.is_empty() {
            return;
        }
        self.handle.enter(|cell| {
            let entered = Entered::by(cell);
            let mut keys = Keys::new(self.wake);
            self.state.with(&entered, |s| self.keys(&entered, &s.core, changes, false, &mut keys));
            run::mark(cell, keys.as_slice());
        });
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
        match outcome {
            FailOutcome::Retrying(r) => {
                tracing::debug!(
                    sequence = r.sequence.get(),
                    attempt = r.attempt.get(),
                    backoff = r.backoff.0,
                    ?kind,
                    "egress cell: a send failed, retrying"
                );
            }
            FailOutcome::Exhausted(r) => {
                tracing::warn!(
                    sequence = r.sequence.get(),
                    attempt = r.attempt.get(),
                    ?kind,
                    "egress cell: a dead letter"
                );
            }
            FailOutcome::UnknownSequence { .. } | FailOutcome::StaleGeneration { .. } => {}
        }
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

    /// Claims the next record for an attachment of `generation`: a copy of
    /// it, or `None` when the core allows no claim (or the attachment is
    /// fenced).
    #[cfg(feature = "async")]
    pub(crate) fn claim_for(&self, generation: Generation) -> Option<Envelope<T>>
    where
        T: Clone,
    {
        let clock = &*self.clock;
        let (envelope, panic) = self.apply(By::Attachment, |s| {
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

    /// [`claim_for`](Self::claim_for) inside the attachment's own effect run:
    /// the readers are marked with the run's other claims, when it ends (see
    /// [`Marks`]).
    fn claim_quiet(&self, generation: Generation, marks: &mut Marks<'_, T, F>) -> Option<Envelope<T>>
    where
        T: Clone,
    {
        let clock = &*self.clock;
        let (envelope, changes, panic) =
            self.handle.enter(|cell| self.state.with_mut(&Entered::by(cell), |s| Self::claim_in(s, generation, clock)));
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

/// What a reader computes: one projection of the core, after tracking the
/// projection's trigger.
#[doc(hidden)]
pub struct Project<T: 'static, P, F: Flavor> {
    inner: Inner<T, F>,
    trigger: Key,
    project: fn(&EgressCore<T>) -> P,
}

impl<T: 'static, P: 'static, F: Flavor> Compute<P> for Project<T, P, F> {
    fn compute(&self) -> P {
        let inner = &self.inner;
        inner.handle.enter(|cell| {
            Handle::track(cell, self.trigger);
            inner.state.with(&Entered::by(cell), |s| (self.project)(&s.core))
        })
    }
}

type Reader<T, P, E, F> = ComputedObj<P, Project<T, P, F>, E, F>;

/// What a [`status`](EgressCellOf::status) reader computes: one message's
/// status, after tracking every projection it depends on.
#[doc(hidden)]
pub struct StatusOf<T: 'static, F: Flavor> {
    inner: Inner<T, F>,
    sequence: Sequence,
}

/// The projections a message's status follows.
const STATUS_FOLLOWS: [Projection; 7] = [
    Projection::Pending,
    Projection::Inflight,
    Projection::Parked,
    Projection::Exhausted,
    Projection::AckedThrough,
    Projection::Received,
    Projection::Durable,
];

impl<T: 'static, F: Flavor> Compute<Option<MessageStatus>> for StatusOf<T, F> {
    fn compute(&self) -> Option<MessageStatus> {
        let inner = &self.inner;
        inner.handle.enter(|cell| {
            for p in STATUS_FOLLOWS {
                Handle::track(cell, inner.triggers[p as usize]);
            }
            inner.state.with(&Entered::by(cell), |s| s.core.status(self.sequence))
        })
    }
}

/// The flavours that can hold a cell of `T`: [`Local`] for any `T: Clone`,
/// [`Threaded`] for `T: Clone + Send + Sync`. (It names the node types a
/// cell creates, so that one generic implementation serves both.)
#[doc(hidden)]
pub trait CellFlavor<T: Clone + 'static>:
    Flavor
    + Holds<Reader<T, Option<Sequence>, ByEq, Self>>
    + Holds<Reader<T, Option<Retry>, ByEq, Self>>
    + Holds<Reader<T, Generation, ByEq, Self>>
    + Holds<Reader<T, Snapshot<Envelope<T>>, Never, Self>>
    + Holds<Reader<T, Snapshot<ParkedRecord<T>>, Never, Self>>
    + Holds<Reader<T, Option<PersistError>, ByEq, Self>>
    + Holds<Reader<T, bool, ByEq, Self>>
    + Holds<ComputedObj<Option<MessageStatus>, StatusOf<T, Self>, ByEq, Self>>
{
    /// The clock of a cell built without one.
    fn default_clock() -> Arc<dyn Clock> {
        Arc::new(MonotonicClock::new())
    }
}

impl<T: Clone + 'static> CellFlavor<T> for Local {}
impl<T: Clone + Send + Sync + 'static> CellFlavor<T> for Threaded {}

/// The readers of a cell, one computed per projection and count.
struct Readers<T: 'static, F: Flavor> {
    pending: Computed<Snapshot<Envelope<T>>, F>,
    inflight: Computed<Snapshot<Envelope<T>>, F>,
    parked: Computed<Snapshot<ParkedRecord<T>>, F>,
    exhausted: Computed<Snapshot<Envelope<T>>, F>,
    acked_through: Computed<Option<Sequence>, F>,
    received_through: Computed<Option<Sequence>, F>,
    retry: Computed<Option<Retry>, F>,
    generation: Computed<Generation, F>,
    durable_through: Computed<Option<Sequence>, F>,
    generation_durable: Computed<bool, F>,
    persist_error: Computed<Option<PersistError>, F>,
}

/// What the clones of a cell share.
struct Shared<T: 'static, F: Flavor> {
    inner: Inner<T, F>,
    readers: Readers<T, F>,
    /// The live attachments, by the generation each captured.
    attachments: F::Cell<Vec<(Generation, Key)>>,
    /// Owns every node of the cell: its triggers, readers and attachments.
    scope: Scope<F>,
    incarnation: Incarnation,
    /// See [`CellOptions::capacity`].
    capacity: Option<usize>,
    /// See [`EgressCellOf::set_size_check`].
    size_check: parking_lot::Mutex<Option<SizeCheck<T>>>,
    /// See [`EgressCellOf::status`].
    statuses: parking_lot::Mutex<Statuses<F>>,
}

/// The status readers [`EgressCellOf::status`] made, by sequence: the same
/// reader for the same sequence while the application holds it. Those no
/// handle outside holds any more are disposed at a sweep, when the map has
/// doubled since the last one: the map is bounded by twice the readers
/// held, and a sweep's cost is spread over the calls that grew it.
struct Statuses<F: Flavor> {
    by_sequence: std::collections::HashMap<Sequence, Computed<Option<MessageStatus>, F>>,
    /// The size at which the next sweep runs.
    sweep_at: usize,
}

/// The fewest readers at which [`Statuses`] sweeps.
const STATUS_SWEEP_MIN: usize = 64;

impl<F: Flavor> Statuses<F> {
    fn new() -> Self {
        Statuses { by_sequence: std::collections::HashMap::new(), sweep_at: STATUS_SWEEP_MIN }
    }

    /// Takes out the readers only the map holds, if a sweep is due, for
    /// the caller to dispose (outside the map's lock).
    fn sweep(&mut self) -> Vec<Computed<Option<MessageStatus>, F>> {
        if self.by_sequence.len() < self.sweep_at {
            return Vec::new();
        }
        let mut unheld = Vec::new();
        self.by_sequence.retain(|_, status| {
            let held = status.is_shared();
            if !held {
                unheld.push(status.clone());
            }
            held
        });
        self.sweep_at = (self.by_sequence.len() * 2).max(STATUS_SWEEP_MIN);
        unheld
    }
}

/// Why [`try_enqueue`](EgressCellOf::try_enqueue) refused a payload: it
/// comes back, nothing was queued.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refused<T> {
    /// The cell holds its [capacity](CellOptions::capacity) of
    /// unacknowledged records: room comes with acknowledgements.
    #[error("the cell holds {capacity} unacknowledged records, its capacity")]
    Full {
        /// The payload refused.
        payload: T,
        /// The cell's capacity.
        capacity: usize,
    },
    /// The payload is larger than the cell's transport can carry (see
    /// [`set_size_check`](EgressCellOf::set_size_check)): sent, it could
    /// only become a dead letter.
    #[error("the payload is {size} bytes, above the transport's limit of {limit}")]
    TooLarge {
        /// The payload refused.
        payload: T,
        /// Its size, as the transport would send it.
        size: usize,
        /// The largest the transport carries.
        limit: usize,
    },
}

impl<T> Refused<T> {
    /// The payload refused, back to the caller.
    pub fn into_payload(self) -> T {
        match self {
            Refused::Full { payload, .. } | Refused::TooLarge { payload, .. } => payload,
        }
    }
}

impl<T> std::fmt::Debug for Refused<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Full { capacity, .. } => {
                f.debug_struct("Full").field("capacity", capacity).finish_non_exhaustive()
            }
            Refused::TooLarge { size, limit, .. } => {
                f.debug_struct("TooLarge").field("size", size).field("limit", limit).finish_non_exhaustive()
            }
        }
    }
}

/// A transport's check of a payload's size, as it would send it:
/// `Some((size, limit))` when the payload is above the largest it carries
/// (see [`EgressCellOf::set_size_check`]).
pub type SizeCheck<T> = Arc<dyn Fn(&T) -> Option<(usize, usize)> + Send + Sync>;

/// How many records `core` holds unacknowledged: every sequence taken and
/// not yet at or below the watermark.
pub(crate) fn unacknowledged<T>(core: &EgressCore<T>) -> usize {
    let first = core.acked_through().map_or(0, |s| s.get().saturating_add(1));
    usize::try_from(core.next_sequence().get().saturating_sub(first)).unwrap_or(usize::MAX)
}

/// An egress cell on a graph of flavour `F`: delivery state as signals.
/// Use it as [`EgressCell`] (on [`Context`](crate::Context)),
/// [`ThreadSafeEgressCell`] (on [`ThreadSafeContext`](crate::ThreadSafeContext))
/// or through [`AsyncEgressCell`](crate::AsyncEgressCell).
///
/// The cell owns an [`EgressCore`] and projects it into the graph:
///
/// - **Readers** are computeds: [`pending`](Self::pending),
///   [`inflight`](Self::inflight), [`parked`](Self::parked),
///   [`exhausted`](Self::exhausted) (snapshots), [`acked_through`](Self::acked_through),
///   [`received_through`](Self::received_through),
///   [`retry`](Self::retry), [`generation`](Self::generation), and the counts
///   [`pending_len`](Self::pending_len), [`inflight_len`](Self::inflight_len),
///   [`window_room`](Self::window_room), [`parked_len`](Self::parked_len),
///   [`exhausted_len`](Self::exhausted_len). The projections are lazy: one
///   nobody reads costs nothing, and a list is built only when read after a
///   change. The counts are kept eagerly, O(1) per transition that changes
///   their projection, and notify only when their value changes (they
///   never run: their `runs()` stays 0).
/// - **Mutators** ([`enqueue`](Self::enqueue), [`ack`](Self::ack),
///   [`fail`](Self::fail), ...) return the core's outcome and invalidate
///   exactly the readers of the projections the transition changed, as one
///   write (effects run once). A refused or no-op call invalidates nothing.
///   Scalar and count readers cut off by equality, so an effect over "is
///   anything pending?" re-runs only when the answer changes.
/// - **Attachments** ([`attach`](Self::attach)) wire a transport as one
///   effect per connection; see [`Attachment`].
///
/// Time comes from the cell's [`Clock`] (milliseconds; see
/// [`CellOptions`]). The synchronous cells do not own a timer: the
/// application's loop asks [`poll_timeout`](Self::poll_timeout) (or
/// [`timeout_in`](Self::timeout_in)) when the next parked record is due and
/// calls [`handle_timeout`](Self::handle_timeout) then.
///
/// Mutators and readers must not be called from inside `claim_with`'s
/// closure; everywhere else (effects, transports, other threads for the
/// thread-safe flavour) they may.
///
/// ```
/// use egress_core::{Delay, Envelope, Policy, Sequence};
/// use egress_reactive::{Context, EgressCell, SendError, Transport};
/// use std::{cell::RefCell, rc::Rc};
///
/// struct Wire(Rc<RefCell<Vec<Envelope<String>>>>);
/// impl Transport<String> for Wire {
///     fn send(&mut self, envelope: Envelope<String>) -> Result<(), SendError> {
///         self.0.borrow_mut().push(envelope);
///         Ok(())
///     }
/// }
///
/// let cx = Context::new();
/// let cell = EgressCell::new(&cx, Policy::builder().inflight_limit(2).build()?);
/// let status = cx.computed({
///     let (pending, inflight) = (cell.pending_len().clone(), cell.inflight_len().clone());
///     move || format!("{} waiting, {} sending", pending.get(), inflight.get())
/// });
///
/// let wire = Rc::new(RefCell::new(Vec::new()));
/// let link = cell.attach(Wire(wire.clone()));
/// for text in ["hi", "how are you", "bye"] {
///     cell.enqueue(text.to_string());
/// }
/// assert_eq!(wire.borrow().len(), 2); // the window holds two
/// assert_eq!(status.get(), "1 waiting, 2 sending");
///
/// link.ack(Sequence(1)); // the peer has 0 and 1: the window reopens
/// assert_eq!(wire.borrow().len(), 3);
/// assert_eq!(status.get(), "0 waiting, 1 sending");
/// # Ok::<(), egress_core::PolicyError>(())
/// ```
pub struct EgressCellOf<T: 'static, F: Flavor> {
    shared: F::Ptr<Shared<T, F>>,
}

/// An egress cell on a [`Context`](crate::Context) (one thread).
pub type EgressCell<T> = EgressCellOf<T, Local>;

/// An egress cell on a [`ThreadSafeContext`](crate::ThreadSafeContext):
/// `Send + Sync`, mutators and readers usable from any thread.
///
/// The graph's lock is held for each call, including the attachment's
/// sends that a call triggers, so a slow synchronous transport holds up
/// the other threads' calls; use [`AsyncEgressCell`](crate::AsyncEgressCell)
/// for transports that wait.
pub type ThreadSafeEgressCell<T> = EgressCellOf<T, Threaded>;

impl<T: 'static, F: Flavor> Clone for EgressCellOf<T, F> {
    fn clone(&self) -> Self {
        EgressCellOf { shared: self.shared.clone() }
    }
}

impl<T: 'static, F: Flavor> std::fmt::Debug for EgressCellOf<T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = &self.shared.inner;
        inner.with_core(|core| {
            f.debug_struct("EgressCell")
                .field("generation", &core.generation())
                .field("next_sequence", &core.next_sequence())
                .field("pending", &core.pending_len())
                .field("inflight", &core.inflight_len())
                .field("parked", &core.parked_len())
                .field("exhausted", &core.exhausted_len())
                .field("acked_through", &core.acked_through())
                .field("received_through", &core.received_through())
                .finish()
        })
    }
}

fn list<'a, T: Clone + 'a>(items: impl Iterator<Item = Envelope<&'a T>>) -> Snapshot<Envelope<T>> {
    items.map(Envelope::cloned).collect()
}

impl<T: Clone + 'static, F: CellFlavor<T>> EgressCellOf<T, F> {
    /// A cell with `policy`, at generation 0, owned by the current owner of
    /// `cx` (disposed with it, or when the last clone of the cell drops).
    #[track_caller]
    pub fn new(cx: &Handle<F>, policy: Policy) -> Self {
        Self::with_options(cx, policy, CellOptions::new())
    }

    /// A cell with `policy` and `options`.
    #[track_caller]
    pub fn with_options(cx: &Handle<F>, policy: Policy, mut options: CellOptions) -> Self {
        let clock = options.take_clock(F::default_clock);
        let core = EgressCore::with_generation(policy, options.generation);
        Self::build(cx, core, options, clock, Location::caller())
    }

    /// A cell over `core`, as it is: for a core rebuilt by
    /// [`EgressCore::restore`] from a store, whose journal the cell then
    /// projects ([`durable_through`](Self::durable_through),
    /// [`unpersisted_len`](Self::unpersisted_len),
    /// [`persist_error`](Self::persist_error)) and whose writes a store's
    /// relay drives ([`poll_ready`](Self::poll_ready)). The options'
    /// generation is ignored (the core has one); give the stored
    /// incarnation, so that the receiver knows the sequence space.
    #[track_caller]
    pub fn from_core(cx: &Handle<F>, core: EgressCore<T>, mut options: CellOptions) -> Self {
        let clock = options.take_clock(F::default_clock);
        Self::build(cx, core, options, clock, Location::caller())
    }

    pub(crate) fn build(
        cx: &Handle<F>,
        core: EgressCore<T>,
        options: CellOptions,
        clock: Arc<dyn Clock>,
        at: &'static Location<'static>,
    ) -> Self {
        let random = || std::collections::hash_map::RandomState::new().hash_one(0u64);
        let seed = options.jitter_seed.unwrap_or_else(random);
        let incarnation =
            options.incarnation.unwrap_or_else(|| Incarnation(u128::from(random()) << 64 | u128::from(random())));
        let (scope, (inner, readers)) = cx.scope(|| {
            let triggers = Projection::ALL.map(|_| cx.trigger(at));
            let counts = [PENDING_LEN, INFLIGHT_LEN, WINDOW_ROOM, PARKED_LEN, EXHAUSTED_LEN, UNPERSISTED_LEN]
                .map(|which| cx.pushed(count(&core, which), at));
            let state = F::ptr(ValueCell::new(State { core, rng: seed }));
            let inner = Inner { handle: cx.clone(), state, triggers, wake: cx.trigger(at), counts, clock };
            let readers = Readers {
                pending: reader(&inner, Projection::Pending, Never, |c| list(c.pending()), at),
                inflight: reader(&inner, Projection::Inflight, Never, |c| list(c.inflight()), at),
                parked: reader(
                    &inner,
                    Projection::Parked,
                    Never,
                    |c| {
                        c.parked()
                            .map(|p| ParkedRecord {
                                sequence: p.sequence,
                                attempt: p.attempt,
                                backoff: p.backoff,
                                due: p.due,
                                payload: p.payload.clone(),
                                dead: p.dead,
                            })
                            .collect()
                    },
                    at,
                ),
                exhausted: reader(&inner, Projection::Exhausted, Never, |c| list(c.exhausted()), at),
                acked_through: reader(&inner, Projection::AckedThrough, ByEq, EgressCore::acked_through, at),
                received_through: reader(&inner, Projection::Received, ByEq, EgressCore::received_through, at),
                retry: reader(&inner, Projection::Retry, ByEq, EgressCore::retry, at),
                generation: reader(&inner, Projection::Generation, ByEq, EgressCore::generation, at),
                durable_through: reader(&inner, Projection::Durable, ByEq, EgressCore::durable_through, at),
                generation_durable: reader(&inner, Projection::Durable, ByEq, EgressCore::generation_durable, at),
                persist_error: reader(&inner, Projection::PersistError, ByEq, |c| c.persist_error().cloned(), at),
            };
            (inner, readers)
        });
        let capacity = options.capacity;
        let shared = Shared {
            inner,
            readers,
            attachments: ValueCell::new(Vec::new()),
            scope,
            incarnation,
            capacity,
            size_check: parking_lot::Mutex::new(None),
            statuses: parking_lot::Mutex::new(Statuses::new()),
        };
        EgressCellOf { shared: F::ptr(shared) }
    }

    // ----- readers ---------------------------------------------------

    /// The records waiting to be claimed, in sequence order.
    pub fn pending(&self) -> &Computed<Snapshot<Envelope<T>>, F> {
        &self.shared.readers.pending
    }

    /// The records in flight, in claim order.
    pub fn inflight(&self) -> &Computed<Snapshot<Envelope<T>>, F> {
        &self.shared.readers.inflight
    }

    /// The failed records waiting for their backoff, in sequence order.
    pub fn parked(&self) -> &Computed<Snapshot<ParkedRecord<T>>, F> {
        &self.shared.readers.parked
    }

    /// The dead letters (budget spent, or a permanent failure), in sequence
    /// order, each with the generation it failed under.
    pub fn exhausted(&self) -> &Computed<Snapshot<Envelope<T>>, F> {
        &self.shared.readers.exhausted
    }

    /// The cumulative acknowledgement watermark (`None` until the first ack).
    pub fn acked_through(&self) -> &Computed<Option<Sequence>, F> {
        &self.shared.readers.acked_through
    }

    /// The receipt watermark: the peer holds every sequence at or below it,
    /// acknowledged or not ("delivered" where `acked_through` is "read").
    pub fn received_through(&self) -> &Computed<Option<Sequence>, F> {
        &self.shared.readers.received_through
    }

    /// The most recent failure, while its record is parked or exhausted:
    /// what a UI shows as "retrying in 4 s" or "failed".
    pub fn retry(&self) -> &Computed<Option<Retry>, F> {
        &self.shared.readers.retry
    }

    /// The current generation.
    pub fn generation(&self) -> &Computed<Generation, F> {
        &self.shared.readers.generation
    }

    /// How many records are pending.
    pub fn pending_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[PENDING_LEN]
    }

    /// How many records are in flight.
    pub fn inflight_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[INFLIGHT_LEN]
    }

    /// How many more records the window admits.
    pub fn window_room(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[WINDOW_ROOM]
    }

    /// How many records are parked.
    pub fn parked_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[PARKED_LEN]
    }

    /// How many records are exhausted.
    pub fn exhausted_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[EXHAUSTED_LEN]
    }

    /// Every sequence at or below it is durable (`None` without a journal,
    /// or while nothing is). See [`EgressCore::durable_through`].
    pub fn durable_through(&self) -> &Computed<Option<Sequence>, F> {
        &self.shared.readers.durable_through
    }

    /// How many records are enqueued and not yet durable: the "saving…"
    /// count. Always 0 without a journal.
    pub fn unpersisted_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[UNPERSISTED_LEN]
    }

    /// Whether the current generation is durable, so that a handshake may
    /// use it. Always `true` without a journal.
    pub fn generation_durable(&self) -> &Computed<bool, F> {
        &self.shared.readers.generation_durable
    }

    /// A reader of where the message `sequence` stands (see
    /// [`EgressCore::status`]): "saving…", queued, sending, received,
    /// retrying, dead, acknowledged. It recomputes when a projection the
    /// status depends on changes and notifies only when the status does; an
    /// acknowledged message stays acknowledged, so a UI keeps it until it
    /// drops it itself.
    ///
    /// The reader is the cell's, not the caller's: a call for a sequence
    /// whose reader a handle still holds returns that reader (a redraw that
    /// asks again makes no new node), and a reader no handle holds any more
    /// is disposed at a later call (or with the cell). Drop the handle when
    /// done; do not dispose it, since another caller may hold the same
    /// reader. On a disposed cell the reader is made under the current
    /// owner, and reads fail as the cell's do.
    #[track_caller]
    pub fn status(&self, sequence: Sequence) -> Computed<Option<MessageStatus>, F> {
        let at = Location::caller();
        let make = || {
            let f = StatusOf { inner: self.shared.inner.clone(), sequence };
            self.shared.inner.handle.make_computed(ByEq, f, at)
        };
        // In the cell's scope, which holds the graph for the whole call: the
        // map is only ever locked inside the graph (no other order of the
        // two locks exists), and one thread at a time looks a sequence up
        // and makes its reader.
        let found = self.shared.scope.try_run(|| {
            let mut statuses = self.shared.statuses.lock();
            if let Some(held) = statuses.by_sequence.get(&sequence)
                && !held.is_disposed()
            {
                return (held.clone(), Vec::new());
            }
            let unheld = statuses.sweep();
            let made = make();
            statuses.by_sequence.insert(sequence, made.clone());
            (made, unheld)
        });
        let Ok((status, unheld)) = found else { return make() };
        for reader in unheld {
            reader.dispose();
        }
        status
    }

    /// What the store held when the cell's core was restored (see
    /// [`EgressCore::recovered`]); `None` for a cell not built from a
    /// restored core. It never changes, so it is a plain value, not a
    /// reader.
    pub fn recovered(&self) -> Option<egress_core::Recovered> {
        self.with_core(EgressCore::recovered)
    }

    /// The last failure to persist, until a later write succeeds: sending
    /// stalls on what is not durable meanwhile, visibly.
    pub fn persist_error(&self) -> &Computed<Option<PersistError>, F> {
        &self.shared.readers.persist_error
    }

    /// Disposes every node the cell created: its readers (reads of them fail
    /// with [`ReadError::Disposed`](crate::ReadError)), its triggers and its
    /// attachments (their transports are dropped). The core and its records
    /// stay: mutators still apply transitions, and notify nothing.
    /// Dropping the cell's last clone does the same. Idempotent.
    pub fn dispose(&self) {
        self.shared.scope.dispose();
    }

    /// Whether the cell was disposed (or its owner, or its context).
    pub fn is_disposed(&self) -> bool {
        self.shared.scope.is_disposed()
    }

    /// Runs `f` on the cell's graph with the cell as owner: what `f`
    /// creates there (signals, computeds, effects) is disposed with the
    /// cell. For the parts that project their own state beside the cell's,
    /// such as egress-ws's sender and its connection state.
    ///
    /// # Errors
    /// [`ReadError::Disposed`](crate::ReadError) (and `f` not run) if the
    /// cell was disposed.
    pub fn in_scope<R>(&self, f: impl FnOnce(&Handle<F>) -> R) -> Result<R, crate::ReadError> {
        let handle = &self.shared.inner.handle;
        self.shared.scope.try_run(|| f(handle))
    }

    /// Reads the core directly, untracked (for what no reader projects, such
    /// as the policy). `f` must not call into the cell.
    pub fn with_core<R>(&self, f: impl FnOnce(&EgressCore<T>) -> R) -> R {
        self.shared.inner.with_core(f)
    }

    /// The incarnation of the cell's sequence space (see
    /// [`CellOptions::incarnation`]).
    pub fn incarnation(&self) -> Incarnation {
        self.shared.incarnation
    }

    /// The sequence the next enqueue will assign (untracked).
    pub fn next_sequence(&self) -> Sequence {
        self.with_core(EgressCore::next_sequence)
    }

    /// The cell's clock, read now.
    pub fn now(&self) -> Time {
        self.shared.inner.now()
    }

    // ----- mutators --------------------------------------------------

    /// Queues `payload` and returns its sequence. Wakes the attachment when
    /// the window has room.
    pub fn enqueue(&self, payload: T) -> Sequence {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.enqueue(payload);
            (t.outcome, t.changes)
        })
    }

    /// [`enqueue`](Self::enqueue), unless the payload is larger than the
    /// cell's transport carries ([`Refused::TooLarge`], see
    /// [`set_size_check`](Self::set_size_check)) or the cell holds its
    /// [capacity](CellOptions::capacity) of unacknowledged records
    /// ([`Refused::Full`]): then the payload comes back and nothing
    /// changes. ([`enqueue`](Self::enqueue) takes a payload too large: it
    /// becomes a dead letter when it is sent, and reads so.)
    ///
    /// # Errors
    /// [`Refused`]: too large, or at capacity.
    pub fn try_enqueue(&self, payload: T) -> Result<Sequence, Refused<T>> {
        let check = self.shared.size_check.lock().clone();
        if let Some((size, limit)) = check.and_then(|check| check(&payload)) {
            return Err(Refused::TooLarge { payload, size, limit });
        }
        let capacity = self.shared.capacity;
        self.shared.inner.apply(By::Caller, |s| match capacity {
            Some(capacity) if unacknowledged(&s.core) >= capacity => {
                (Err(Refused::Full { payload, capacity }), Changes::NONE)
            }
            _ => {
                let t = s.core.enqueue(payload);
                (Ok(t.outcome), t.changes)
            }
        })
    }

    /// Sets (or, with `None`, removes) the check of a payload's size that
    /// [`try_enqueue`](Self::try_enqueue) applies: a transport that knows
    /// the largest payload it carries installs it (the WebSocket sender
    /// does when it starts, and lowers its limit to a receiver's when a
    /// welcome announces a smaller one), so that a caller is refused at
    /// once rather than told later of a dead letter.
    pub fn set_size_check(&self, check: Option<SizeCheck<T>>) {
        *self.shared.size_check.lock() = check;
    }

    /// Removes `check` if it is the one installed (a transport that goes
    /// away takes its own check, not a later transport's).
    pub fn remove_size_check(&self, check: &SizeCheck<T>) {
        let mut installed = self.shared.size_check.lock();
        if installed.as_ref().is_some_and(|c| Arc::ptr_eq(c, check)) {
            *installed = None;
        }
    }

    /// The size and limit of `payload` if the cell's transport would refuse
    /// it as too large (see [`set_size_check`](Self::set_size_check)).
    pub fn too_large(&self, payload: &T) -> Option<(usize, usize)> {
        let check = self.shared.size_check.lock().clone();
        check.and_then(|check| check(payload))
    }

    /// The cell's [capacity](CellOptions::capacity), if it has one.
    pub fn capacity(&self) -> Option<usize> {
        self.shared.capacity
    }

    /// Queues every payload in order: one transition, one invalidation, one
    /// attachment run for all of them. Returns the sequences assigned.
    pub fn enqueue_all(&self, payloads: impl IntoIterator<Item = T>) -> Range<Sequence> {
        // Collected first: the iterator is user code, which must not run
        // while the core is borrowed.
        let payloads: Vec<T> = payloads.into_iter().collect();
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.enqueue_all(payloads);
            (t.outcome, t.changes)
        })
    }

    /// Queues `payload` to go out only once the application's state it
    /// depends on is durable: once [`release`](Self::release) reaches
    /// `after`. See [`EgressCore::enqueue_after`].
    pub fn enqueue_after(&self, payload: T, after: egress_core::FlushEpoch) -> Sequence {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.enqueue_after(payload, after);
            (t.outcome, t.changes)
        })
    }

    /// The application made its state durable through flush epoch
    /// `through`: what waited for it goes on. See [`EgressCore::release`].
    pub fn release(&self, through: egress_core::FlushEpoch) -> usize {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.release(through);
            (t.outcome, t.changes)
        })
    }

    /// Claims the next record under `generation` by hand (attachments do
    /// this for you) and passes the outcome to `f`, which must not call into
    /// the cell. The readers are invalidated after `f` returns.
    pub fn claim_with<R>(&self, generation: Generation, f: impl FnOnce(ClaimOutcome<'_, T>) -> R) -> R {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.claim(generation);
            let changes = t.changes;
            (f(t.outcome), changes)
        })
    }

    /// A cumulative acknowledgement from the peer of `generation`: every
    /// sequence at or below `through` was delivered. See
    /// [`EgressCore::ack`]; an [`Attachment`] knows its generation.
    pub fn ack(&self, generation: Generation, through: Sequence) -> AckOutcome {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.ack(generation, through);
            (t.outcome, t.changes)
        })
    }

    /// A receipt from the peer of `generation`: it holds every sequence at
    /// or below `through`, acknowledged or not, so those pending are not
    /// sent again. See [`EgressCore::received`].
    pub fn received(&self, generation: Generation, through: Sequence) -> ReceivedOutcome {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.received(generation, through);
            (t.outcome, t.changes)
        })
    }

    /// Reports a failed send of `sequence`, now (by the cell's clock), with a
    /// jitter sample from the cell's generator. See [`EgressCore::fail`].
    pub fn fail(&self, generation: Generation, sequence: Sequence, kind: FailureKind) -> FailOutcome {
        self.shared.inner.fail(By::Caller, generation, sequence, kind, None)
    }

    /// [`fail`](Self::fail) with a given jitter sample.
    pub fn fail_with(
        &self,
        generation: Generation,
        sequence: Sequence,
        kind: FailureKind,
        jitter: JitterSample,
    ) -> FailOutcome {
        self.shared.inner.fail(By::Caller, generation, sequence, kind, Some(jitter))
    }

    /// Makes the parked record `sequence` pending again now ("tap to
    /// retry"). See [`EgressCore::retry_now`].
    pub fn retry_now(&self, generation: Generation, sequence: Sequence) -> ScheduleOutcome {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.retry_now(generation, sequence);
            (t.outcome, t.changes)
        })
    }

    /// Gives the dead letter `sequence` a fresh budget and makes it pending.
    /// See [`EgressCore::requeue`].
    pub fn requeue(&self, generation: Generation, sequence: Sequence) -> ScheduleOutcome {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.requeue(generation, sequence);
            (t.outcome, t.changes)
        })
    }

    /// Fences the current connection: moves to `generation` and returns
    /// everything in flight or parked to pending. Every attachment of an
    /// older generation is disposed first: it never sends again and no
    /// change re-runs it. Attach the new connection's transport to replay.
    /// See [`EgressCore::reconnect`].
    pub fn reconnect(&self, generation: Generation) -> ReconnectOutcome {
        let inner = &self.shared.inner;
        inner.handle.enter(|cell| {
            let entered = Entered::by(cell);
            let mut keys = Keys::new(inner.wake);
            let outcome = inner.state.with_mut(&entered, |s| {
                let t = s.core.reconnect(generation);
                inner.keys(&entered, &s.core, t.changes, false, &mut keys);
                t.outcome
            });
            if matches!(outcome, ReconnectOutcome::Advanced { .. }) {
                tracing::debug!(
                    generation = generation.get(),
                    "egress cell: a new generation; earlier attachments fenced"
                );
                let fenced: Vec<Key> = self.shared.attachments.with_mut(&Entered::by(cell), |list| {
                    let (old, kept) = list.drain(..).partition(|(g, _)| *g < generation);
                    *list = kept;
                    old.into_iter().map(|(_, key)| key).collect()
                });
                for key in fenced {
                    inner.handle.dispose_node(key);
                }
            }
            inner.notify(cell, keys.as_slice());
            outcome
        })
    }

    /// When the earliest parked record is due (`None` when nothing is
    /// parked): call [`handle_timeout`](Self::handle_timeout) then.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.shared.inner.poll_timeout()
    }

    /// How long from now (by the cell's clock) until
    /// [`poll_timeout`](Self::poll_timeout); zero when already due.
    ///
    /// The loop of a synchronous cell, with the transport's receive as the
    /// other input:
    ///
    /// ```no_run
    /// # use egress_core::{Generation, Policy, Sequence};
    /// # use egress_reactive::{Context, EgressCell};
    /// # use std::time::Duration;
    /// # let cx = Context::new();
    /// # let cell: EgressCell<String> = EgressCell::new(&cx, Policy::default());
    /// # let acks = std::sync::mpsc::channel::<(Generation, Sequence)>().1;
    /// loop {
    ///     let wait = cell.timeout_in().unwrap_or(Duration::from_secs(3600));
    ///     match acks.recv_timeout(wait) {
    ///         Ok((generation, through)) => { cell.ack(generation, through); }
    ///         Err(_) => { cell.handle_timeout(cell.now()); }
    ///     }
    /// }
    /// ```
    pub fn timeout_in(&self) -> Option<Duration> {
        let due = self.poll_timeout()?;
        Some(Duration::from_millis(due.0.saturating_sub(self.now().0)))
    }

    /// Makes every parked record due at `now` pending again, in sequence
    /// order, and returns their sequences. See [`EgressCore::handle_timeout`].
    pub fn handle_timeout(&self, now: Time) -> Vec<Sequence> {
        self.shared.inner.handle_timeout(now)
    }

    // ----- the journal -----------------------------------------------

    /// What the store must write next, with copies of the payloads to
    /// append, if anything (see [`EgressCore::poll_ready`]): one at a time,
    /// until reported by [`persisted`](Self::persisted) or
    /// [`persist_failed`](Self::persist_failed). For a store's relay only:
    /// a `Ready` taken and never reported stops the journal (nothing is
    /// written after it, and nothing more becomes claimable).
    ///
    /// # Panics
    /// A payload's `Clone` that panics: the epoch is failed first (so the
    /// journal does not wait for a report that never comes), then the panic
    /// goes on.
    pub fn poll_ready(&self) -> Option<(Ready, Vec<(Sequence, T)>)> {
        let (ready, panic) = self.shared.inner.apply(By::Caller, |s| {
            let Some(ready) = s.core.poll_ready() else { return ((None, None), Changes::NONE) };
            let copied = catch_unwind(AssertUnwindSafe(|| {
                s.core.unwritten(ready.appends.clone()).map(|(q, p)| (q, p.clone())).collect::<Vec<_>>()
            }));
            match copied {
                Ok(appends) => ((Some((ready, appends)), None), Changes::NONE),
                Err(panic) => {
                    let t = s.core.persist_failed(ready.epoch, "a payload's Clone panicked");
                    ((None, Some(panic)), t.changes)
                }
            }
        });
        if let Some(panic) = panic {
            resume_unwind(panic);
        }
        ready
    }

    /// The store wrote `epoch`. See [`EgressCore::persisted`]; wakes the
    /// attachments when records became claimable.
    pub fn persisted(&self, epoch: Epoch) -> PersistOutcome {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.persisted(epoch);
            (t.outcome, t.changes)
        })
    }

    /// The store could not write `epoch`. See [`EgressCore::persist_failed`].
    pub fn persist_failed(&self, epoch: Epoch, reason: impl Into<String>) -> PersistOutcome {
        let reason = reason.into();
        tracing::warn!(epoch = ?epoch, %reason, "egress cell: the store could not write");
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.persist_failed(epoch, reason);
            (t.outcome, t.changes)
        })
    }

    /// Takes a record the store appended itself under `sequence` (inside an
    /// application's transaction). See [`EgressCore::adopt`].
    pub fn adopt(&self, sequence: Sequence, payload: T) -> AdoptOutcome {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.adopt(sequence, payload);
            (t.outcome, t.changes)
        })
    }

    /// Takes records another writer appended to the store under the
    /// sequences of records the cell enqueued but has not written (never
    /// sent), which move behind them. See [`EgressCore::rebase`].
    pub fn rebase(&self, appended: Vec<(Sequence, T)>) -> egress_core::RebaseOutcome {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.rebase(appended);
            (t.outcome, t.changes)
        })
    }

    // ----- attachments -----------------------------------------------

    /// Attaches `transport` under the current generation: creates the one
    /// effect of this connection, which runs now and again whenever a
    /// transition by anyone but itself makes a claim possible. Each run
    /// claims while the core allows (window room, ordering) and sends each
    /// claimed envelope; see [`Attachment`] for failures and fencing.
    #[track_caller]
    pub fn attach<Tr: Transport<T>>(&self, transport: Tr) -> Attachment<T, F>
    where
        F: Holds<EffectObj<AttachRun<T, Tr, F>, F>>,
    {
        let at = Location::caller();
        let inner = self.shared.inner.clone();
        let generation = self.with_core(EgressCore::generation);
        let run = AttachRun { inner, transport, generation };
        let Ok(effect) = self.shared.scope.try_run(|| self.shared.inner.handle.make_effect(run, at)) else {
            // A disposed cell: the transport is dropped, never used.
            return self.fenced_attachment(generation);
        };
        self.register(generation, effect.key);
        Attachment { node: (*effect).clone(), generation, cell: self.clone(), _keep: None }
    }

    /// The attachment of a cell disposed before it could attach: fenced
    /// from the start.
    pub(crate) fn fenced_attachment(&self, generation: Generation) -> Attachment<T, F> {
        let handle = self.shared.inner.handle.clone();
        let key = handle.enter(|cell| cell.borrow().dead_key());
        Attachment { node: NodeRef { handle, key }, generation, cell: self.clone(), _keep: None }
    }

    /// Records a new attachment (and forgets disposed ones).
    pub(crate) fn register(&self, generation: Generation, key: Key) {
        self.shared.inner.handle.enter(|cell| {
            self.shared.attachments.with_mut(&Entered::by(cell), |list| {
                let g = cell.borrow();
                list.retain(|(_, k)| g.alive(*k));
                if g.alive(key) {
                    list.push((generation, key));
                }
            });
        });
    }

    #[cfg(feature = "async")]
    pub(crate) fn inner(&self) -> &Inner<T, F> {
        &self.shared.inner
    }

    #[cfg(feature = "async")]
    pub(crate) fn scope(&self) -> &Scope<F> {
        &self.shared.scope
    }
}

fn reader<T: Clone + 'static, P: 'static, E: Cutoff<P>, F>(
    inner: &Inner<T, F>,
    projection: Projection,
    cutoff: E,
    project: fn(&EgressCore<T>) -> P,
    at: &'static Location<'static>,
) -> Computed<P, F>
where
    F: Holds<Reader<T, P, E, F>>,
{
    let f = Project { inner: inner.clone(), trigger: inner.triggers[projection as usize], project };
    inner.handle.make_computed(cutoff, f, at)
}

/// The run of a synchronous attachment: claim, send, repeat.
#[doc(hidden)]
pub struct AttachRun<T: 'static, Tr, F: Flavor> {
    inner: Inner<T, F>,
    transport: Tr,
    generation: Generation,
}

/// The changes of an attachment run's claims, marked once when the run
/// ends (or unwinds): the run happens inside a flush or an effect's
/// creation, which then runs the effects the marks queued.
struct Marks<'a, T: 'static, F: Flavor> {
    inner: &'a Inner<T, F>,
    changes: Changes,
}

impl<T: 'static, F: Flavor> Drop for Marks<'_, T, F> {
    fn drop(&mut self) {
        self.inner.mark(self.changes);
    }
}

impl<T: Clone + 'static, Tr: Transport<T>, F: Flavor> RunEffect for AttachRun<T, Tr, F> {
    fn run_effect(&mut self) {
        self.inner.track_wake();
        let mut marks = Marks { inner: &self.inner, changes: Changes::NONE };
        while let Some(envelope) = self.inner.claim_quiet(self.generation, &mut marks) {
            let sequence = envelope.sequence;
            let transport = &mut self.transport;
            if !self.inner.send_in_pass(self.generation, sequence, || transport.send(envelope)) {
                break;
            }
        }
    }
}

/// One connection's transport, wired to a cell as one effect.
///
/// The effect captured the cell's generation when it was attached. Each
/// run claims while the core allows and sends each claimed envelope; its
/// own claims and failures do not wake it again (one run per sending pass),
/// while a caller's enqueue, ack, timeout, retry or requeue that makes a
/// claim possible does.
///
/// A send error becomes [`fail`](EgressCellOf::fail) with the error's kind
/// and the cell's clock as `now`. After a transient or retry-after failure
/// the pass stops (the connection is suspect; the record's backoff, an ack
/// or an enqueue starts the next pass); after a permanent one (the payload
/// was refused) it goes on with the next record.
///
/// [`reconnect`](EgressCellOf::reconnect) to a newer generation fences the
/// attachment: its effect is disposed, it never sends again and costs
/// nothing. Attach the new connection's transport; its first run replays
/// the records that were in flight or parked, under the new generation.
///
/// Dropping the attachment (or calling [`detach`](Self::detach)) disposes
/// its effect and drops the transport. What it had sent stays in flight
/// until acknowledged, failed, or replayed after a reconnect.
#[must_use = "dropping an Attachment detaches its transport"]
pub struct Attachment<T: 'static, F: Flavor> {
    pub(crate) node: NodeRef<F>,
    pub(crate) generation: Generation,
    pub(crate) cell: EgressCellOf<T, F>,
    /// What must live while the attachment does (an async cell's timer).
    pub(crate) _keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl<T: Clone + 'static, F: CellFlavor<T>> Attachment<T, F> {
    /// The generation this attachment sends under.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// An acknowledgement received on this connection.
    pub fn ack(&self, through: Sequence) -> AckOutcome {
        self.cell.ack(self.generation, through)
    }

    /// A receipt received on this connection (see
    /// [`EgressCellOf::received`]).
    pub fn received(&self, through: Sequence) -> ReceivedOutcome {
        self.cell.received(self.generation, through)
    }

    /// A failure reported on this connection (for transports that learn of
    /// failures after `send` returned).
    pub fn fail(&self, sequence: Sequence, kind: FailureKind) -> FailOutcome {
        self.cell.fail(self.generation, sequence, kind)
    }

    /// Whether a reconnect has fenced this attachment (or it was detached).
    pub fn is_fenced(&self) -> bool {
        self.node.is_disposed() || self.cell.with_core(|c| c.generation() != self.generation)
    }

    /// How many times the attachment's effect has run (0 once fenced or
    /// detached).
    pub fn runs(&self) -> u32 {
        self.node.runs()
    }

    /// The cell it is attached to.
    pub fn cell(&self) -> &EgressCellOf<T, F> {
        &self.cell
    }

    /// Disposes the effect and drops the transport (as dropping does).
    pub fn detach(self) {}
}

impl<T: 'static, F: Flavor> Drop for Attachment<T, F> {
    fn drop(&mut self) {
        self.node.dispose();
    }
}

impl<T: 'static, F: Flavor> std::fmt::Debug for Attachment<T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attachment").field("generation", &self.generation).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jitter_generator_is_splitmix64() {
        // Reference values computed apart (splitmix64 from state 0: the
        // high halves of 0xe220a8397b1dcdaf, 0x6e789e6a53e4a4a0, …).
        let mut s = State { core: EgressCore::<()>::new(Policy::default()), rng: 0 };
        let drawn: Vec<JitterSample> = (0..4).map(|_| s.jitter()).collect();
        let expected: Vec<JitterSample> =
            [0xe220_a839, 0x6e78_9e6a, 0x06c4_5d18, 0xf88b_b8a8].into_iter().map(JitterSample::from_u32).collect();
        assert_eq!(drawn, expected);
    }

    #[test]
    fn options_show_what_was_set() {
        let shown = format!("{:?}", CellOptions::new().generation(Generation(7)).jitter_seed(42).capacity(9));
        for field in ["generation: Generation(7)", "jitter_seed: Some(42)", "capacity: Some(9)", "clock: None"] {
            assert!(shown.contains(field), "{shown} shows {field}");
        }
    }
}
