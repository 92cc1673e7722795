//! [`LanesCellOf`]: an [`egress_core::Lanes`] projected into a graph, as
//! [`EgressCellOf`](super::EgressCellOf) projects one core. This file: the
//! cell, its state and the one transition path; its per-lane readers are in
//! `readers.rs`, its attachments in `attachment.rs`.

#[cfg(feature = "async")]
mod asynchronous;
mod attachment;
mod readers;

use std::collections::BTreeMap;
use std::panic::Location;
use std::sync::Arc;

use egress_core::{
    AckOutcome, Changes, CompleteOutcome, Enqueued, Epoch, FailOutcome, FailureKind, FlushEpoch, Generation,
    Incarnation, JitterSample, LaneKey, Lanes, LanesClaim, LanesPersisted, LanesPolicy, LanesReady, LanesReconnect,
    PersistError, Projection, ReceivedOutcome, ScheduleOutcome, Sequence, Time, TooManyLanes,
};

#[cfg(feature = "async")]
pub use self::asynchronous::AsyncLanesCell;
pub use self::attachment::{LaneItem, LanesAttachment, LanesRun, LanesTransport};
pub use self::readers::{LaneProject, LaneReaders};
use self::readers::{LaneReader, LaneReaderCache};
use super::clock::{Clock, MonotonicClock};
use super::fences::Attached;
use super::inner::{By, TRIGGERS, next_jitter, trace_failure};
use super::options::{CellOptions, EncodeCheck};
use super::readers::{ParkedRecord, Snapshot};
use crate::computed::{ByEq, Computed, ComputedObj};
use crate::context::{Handle, Scope};
use crate::flavor::{Entered, Flavor, Holds, Local, Threaded, ValueCell};
use crate::graph::Key;
use crate::run;

/// The flavours that can hold a lanes cell of keys `K` and payloads `T`:
/// [`Local`] for any, [`Threaded`] for `Send + Sync` keys and payloads.
/// (It names the node types a lanes cell creates, so that one generic
/// implementation serves both.)
#[doc(hidden)]
pub trait LanesFlavor<K: LaneKey + 'static, T: Clone + 'static>:
    Flavor
    + Holds<LaneReader<K, T, Snapshot<egress_core::Envelope<T>>, Self>>
    + Holds<LaneReader<K, T, Snapshot<ParkedRecord<T>>, Self>>
    + Holds<LaneReader<K, T, Option<Sequence>, Self>>
    + Holds<LaneReader<K, T, Option<egress_core::Retry>, Self>>
    + Holds<LaneReader<K, T, usize, Self>>
    + Holds<ComputedObj<Generation, Aggregate<K, T, Generation, Self>, ByEq, Self>>
    + Holds<ComputedObj<FlushEpoch, Aggregate<K, T, FlushEpoch, Self>, ByEq, Self>>
    + Holds<ComputedObj<usize, Aggregate<K, T, usize, Self>, ByEq, Self>>
    + Holds<ComputedObj<bool, Aggregate<K, T, bool, Self>, ByEq, Self>>
    + Holds<ComputedObj<Option<PersistError>, Aggregate<K, T, Option<PersistError>, Self>, ByEq, Self>>
{
    /// The clock of a cell built without one.
    fn default_clock() -> Arc<dyn Clock> {
        Arc::new(MonotonicClock::new())
    }
}

impl<K: LaneKey + 'static, T: Clone + 'static> LanesFlavor<K, T> for Local {}
impl<K: LaneKey + Send + Sync + 'static, T: Clone + Send + Sync + 'static> LanesFlavor<K, T> for Threaded {}

/// The lanes, the generator of jitter samples, and the triggers of the
/// lanes someone reads: touched only with the graph entered.
#[doc(hidden)]
pub struct LanesState<K, T> {
    lanes: Lanes<K, T>,
    rng: u64,
    /// One trigger per [`Projection`] of each lane that has readers.
    triggers: BTreeMap<K, [Key; TRIGGERS]>,
}

/// How many aggregate counts a lanes cell keeps, and their order.
const LANE_COUNTS: usize = 7;
const PENDING_LEN: usize = 0;
const INFLIGHT_LEN: usize = 1;
const OUTSTANDING: usize = 2;
const PARKED_LEN: usize = 3;
const EXHAUSTED_LEN: usize = 4;
const GATED_LEN: usize = 5;
const LANE_COUNT: usize = 6;

fn count<K: LaneKey, T>(lanes: &Lanes<K, T>, which: usize) -> usize {
    match which {
        PENDING_LEN => lanes.pending_len(),
        INFLIGHT_LEN => lanes.inflight_len(),
        OUTSTANDING => lanes.outstanding(),
        PARKED_LEN => lanes.parked_len(),
        EXHAUSTED_LEN => lanes.exhausted_len(),
        GATED_LEN => lanes.gated_len(),
        _ => lanes.lane_count(),
    }
}

/// What every part of a lanes cell shares: the graph, the state, the
/// aggregate triggers and counts, the clock. Cloned into each attachment
/// and reader, so that they do not keep the cell alive.
#[doc(hidden)]
pub struct LanesInner<K: 'static, T: 'static, F: Flavor> {
    handle: Handle<F>,
    state: F::Ptr<F::Cell<LanesState<K, T>>>,
    /// Notified when the generation moves.
    generation: Key,
    /// Notified when a release moves the flush epoch released.
    released: Key,
    /// Notified when a transition not made by an attachment makes a claim
    /// possible: what attachments track.
    wake: Key,
    /// Notified, for durable lanes, by every transition: what the journal
    /// may have to write, and its readers.
    journal: Key,
    counts: [Computed<usize, F>; LANE_COUNTS],
    clock: Arc<dyn Clock>,
}

impl<K: 'static, T: 'static, F: Flavor> Clone for LanesInner<K, T, F> {
    fn clone(&self) -> Self {
        LanesInner {
            handle: self.handle.clone(),
            state: self.state.clone(),
            generation: self.generation,
            released: self.released,
            wake: self.wake,
            journal: self.journal,
            counts: self.counts.clone(),
            clock: self.clock.clone(),
        }
    }
}

/// Which lanes a transition touched, with what it changed in each, and
/// what it changed of the whole.
pub(super) struct Touched<K> {
    lanes: Vec<(K, Changes)>,
    generation: bool,
    released: bool,
    /// A report of the journal (which may touch no lane).
    journal: bool,
}

impl<K> Touched<K> {
    const NOTHING: Self = Touched { lanes: Vec::new(), generation: false, released: false, journal: false };

    fn lane(key: K, changes: Changes) -> Self {
        if changes.is_empty() {
            return Self::NOTHING;
        }
        Touched { lanes: vec![(key, changes)], generation: false, released: false, journal: false }
    }

    fn is_empty(&self) -> bool {
        self.lanes.is_empty() && !self.generation && !self.released && !self.journal
    }
}

impl<K: LaneKey + 'static, T: 'static, F: Flavor> LanesInner<K, T, F> {
    /// Applies `op` to the state with the graph entered, then invalidates
    /// exactly the readers of what it touched (and wakes the attachments
    /// if a caller's transition made a claim possible), as one write. `op`
    /// must not call into the cell.
    pub(super) fn apply<R>(&self, by: By, op: impl FnOnce(&mut LanesState<K, T>) -> (R, Touched<K>)) -> R {
        self.handle.enter(|cell| {
            let entered = Entered::by(cell);
            let (outcome, keys) = self.state.with_mut(&entered, |s| {
                let (outcome, touched) = op(s);
                let wake = by == By::Caller && !touched.is_empty() && s.lanes.can_claim();
                (outcome, self.keys(&entered, s, &touched, wake))
            });
            if !keys.is_empty()
                && let Err(e) = run::notify(cell, &keys)
            {
                panic!("{e}");
            }
            outcome
        })
    }

    /// As [`apply`](Self::apply) inside an attachment's own run (`entered`:
    /// the graph is entered already): the keys go to `marks`, marked when
    /// the run ends.
    pub(super) fn apply_quiet<R>(
        &self,
        entered: &Entered,
        marks: &mut Vec<Key>,
        op: impl FnOnce(&mut LanesState<K, T>) -> (R, Touched<K>),
    ) -> R {
        self.state.with_mut(entered, |s| {
            let (outcome, touched) = op(s);
            marks.extend(self.keys(entered, s, &touched, false));
            outcome
        })
    }

    /// Marks `keys` dirty without running effects (an attachment's run
    /// ends: its flush runs them).
    pub(super) fn mark(&self, keys: &[Key]) {
        if !keys.is_empty() {
            self.handle.enter(|cell| run::mark(cell, keys));
        }
    }

    /// What to notify for `touched`: the triggers of the touched lanes'
    /// projections (for lanes that have readers), the counts whose value
    /// changed, the aggregate triggers, and the wake trigger.
    fn keys(&self, entered: &Entered, s: &LanesState<K, T>, touched: &Touched<K>, wake: bool) -> Vec<Key> {
        let mut keys = Vec::new();
        if touched.is_empty() {
            return keys;
        }
        if !s.triggers.is_empty() {
            for (lane, changes) in &touched.lanes {
                if let Some(triggers) = s.triggers.get(lane) {
                    let bits = changes.bits();
                    keys.extend(triggers.iter().enumerate().filter(|(i, _)| bits >> i & 1 != 0).map(|(_, k)| *k));
                }
            }
        }
        for (which, reader) in self.counts.iter().enumerate() {
            if reader.push(entered, count(&s.lanes, which)) {
                keys.push(reader.key);
            }
        }
        if touched.generation {
            keys.push(self.generation);
        }
        if touched.released {
            keys.push(self.released);
        }
        if wake {
            keys.push(self.wake);
        }
        if s.lanes.is_journaled() {
            keys.push(self.journal);
        }
        keys
    }

    /// Makes every parked record due at `now` pending again, in every lane;
    /// each lane touched is told of the union of the lanes' changes.
    pub(super) fn handle_timeout(&self, now: Time) -> Vec<(K, Vec<Sequence>)> {
        self.apply(By::Caller, |s| {
            let t = s.lanes.handle_timeout(now);
            let changes = t.changes;
            let lanes = t.outcome.iter().map(|(k, _)| (k.clone(), changes)).collect();
            (t.outcome, Touched { lanes, generation: false, released: false, journal: false })
        })
    }

    /// Reads the state, untracked.
    pub(super) fn with_lanes<R>(&self, f: impl FnOnce(&Lanes<K, T>) -> R) -> R {
        self.handle.enter(|cell| self.state.with(&Entered::by(cell), |s| f(&s.lanes)))
    }

    /// Makes the running computation depend on the wake trigger.
    pub(super) fn track_wake(&self) {
        self.handle.enter(|cell| Handle::track(cell, self.wake));
    }

    /// Reports a failed send of `sequence` in `lane`, now, with the cell's
    /// next jitter sample (or `jitter`).
    pub(super) fn fail(
        &self,
        by: By,
        generation: Generation,
        lane: &K,
        sequence: Sequence,
        kind: FailureKind,
        jitter: Option<JitterSample>,
    ) -> FailOutcome {
        let now = self.clock.now();
        let outcome = self.apply(by, |s| {
            let jitter = jitter.unwrap_or_else(|| next_jitter(&mut s.rng));
            let t = s.lanes.fail(generation, lane, sequence, kind, now, jitter);
            (t.outcome, Touched::lane(lane.clone(), t.changes))
        });
        trace_failure(&outcome, kind, Some(lane));
        outcome
    }
}

/// An aggregate reader's computation: one value of the whole [`Lanes`],
/// after tracking its trigger.
#[doc(hidden)]
pub struct Aggregate<K: 'static, T: 'static, P, F: Flavor> {
    inner: LanesInner<K, T, F>,
    trigger: Key,
    project: fn(&Lanes<K, T>) -> P,
}

impl<K: LaneKey + 'static, T: 'static, P: 'static, F: Flavor> crate::computed::Compute<P> for Aggregate<K, T, P, F> {
    fn compute(&self) -> P {
        let inner = &self.inner;
        inner.handle.enter(|cell| {
            Handle::track(cell, self.trigger);
            inner.state.with(&Entered::by(cell), |s| (self.project)(&s.lanes))
        })
    }
}

/// What the clones of a lanes cell share.
pub(super) struct Shared<K: 'static, T: 'static, F: Flavor> {
    inner: LanesInner<K, T, F>,
    generation: Computed<Generation, F>,
    released: Computed<FlushEpoch, F>,
    persist_error: Computed<Option<PersistError>, F>,
    unpersisted_len: Computed<usize, F>,
    generation_durable: Computed<bool, F>,
    /// The live attachments, by the generation each captured.
    attachments: Attached<F>,
    /// Owns every node of the cell.
    scope: Scope<F>,
    incarnation: Incarnation,
    capacity: Option<usize>,
    /// See [`LanesCellOf::set_encode_check`].
    encode_check: parking_lot::Mutex<Option<EncodeCheck<T>>>,
    readers: parking_lot::Mutex<LaneReaderCache<K, T, F>>,
}

/// Several egress streams over one connection, as signals: an
/// [`egress_core::Lanes`] (one core per lane key, released in enqueue
/// order across lanes; see its rules) projected into a graph, as
/// [`EgressCellOf`](super::EgressCellOf) projects one core. Use it as
/// [`LanesCell`] (on a [`Context`](crate::Context)) or
/// [`ThreadSafeLanesCell`] (on a [`ThreadSafeContext`](crate::ThreadSafeContext)
/// or an [`AsyncContext`](crate::AsyncContext)'s handle).
///
/// - **Aggregate readers**, kept eagerly like a cell's counts (O(1) per
///   transition, notifying only when their value changes):
///   [`pending_len`](Self::pending_len), [`inflight_len`](Self::inflight_len),
///   [`outstanding`](Self::outstanding), [`parked_len`](Self::parked_len),
///   [`exhausted_len`](Self::exhausted_len), [`gated_len`](Self::gated_len),
///   [`lane_count`](Self::lane_count); and [`generation`](Self::generation),
///   [`released`](Self::released).
/// - **Per-lane readers**, made on demand by [`lane`](Self::lane): the
///   lane's pending, in-flight, parked and held records, its watermarks,
///   its retry and its counts, each a lazy computed invalidated only by a
///   transition on that lane. A lane that does not exist (yet, or any
///   more: an idle lane may be freed) reads as empty.
/// - **Mutators** return the core's outcomes and invalidate exactly the
///   readers of what they changed, as one write.
/// - **Attachments** ([`attach`](Self::attach)) wire a
///   [`LanesTransport`] as one effect per connection: it claims while the
///   lanes allow and sends each record with its lane and ordinal.
///
/// The synchronous flavours own no timer: ask [`poll_timeout`](Self::poll_timeout)
/// and call [`handle_timeout`](Self::handle_timeout) then. Mutators and
/// readers must not be called from inside `claim_with`'s closure.
///
/// ```
/// use egress_core::{LaneKey, LaneKind, LanesPolicy, Policy};
/// use egress_reactive::{Context, LaneItem, LanesCell, LanesTransport, SendError};
/// use std::{cell::RefCell, rc::Rc};
///
/// #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
/// enum Lane { Room(&'static str), ToDevice }
/// impl LaneKey for Lane {
///     fn kind(&self) -> LaneKind { LaneKind::Serial }
/// }
///
/// struct Wire(Rc<RefCell<Vec<LaneItem<Lane, &'static str>>>>);
/// impl LanesTransport<Lane, &'static str> for Wire {
///     fn send(&mut self, item: LaneItem<Lane, &'static str>) -> Result<(), SendError> {
///         self.0.borrow_mut().push(item);
///         Ok(())
///     }
/// }
///
/// let cx = Context::new();
/// let cell = LanesCell::new(&cx, LanesPolicy::new(Policy::default(), 64)?);
/// let room = cell.lane(&Lane::Room("a"));
/// let wire = Rc::new(RefCell::new(Vec::new()));
/// let link = cell.attach(Wire(wire.clone()));
/// for (lane, text) in [(Lane::Room("a"), "a1"), (Lane::Room("a"), "a2"), (Lane::ToDevice, "k")] {
///     cell.enqueue(lane, text).expect("room for the lane");
/// }
/// // One in flight per serial lane: "a2" waits for "a1".
/// let sent: Vec<_> = wire.borrow().iter().map(|i| i.envelope.payload).collect();
/// assert_eq!(sent, ["a1", "k"]);
/// assert_eq!((room.pending_len().get(), room.inflight_len().get()), (1, 1));
/// link.complete(&Lane::Room("a"), egress_core::Sequence(0));
/// assert_eq!(wire.borrow().len(), 3, "a2 went once a1 completed");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LanesCellOf<K: 'static, T: 'static, F: Flavor> {
    shared: F::Ptr<Shared<K, T, F>>,
}

/// A lanes cell on a [`Context`](crate::Context) (one thread).
pub type LanesCell<K, T> = LanesCellOf<K, T, Local>;

/// A lanes cell on a [`ThreadSafeContext`](crate::ThreadSafeContext) or an
/// [`AsyncContext`](crate::AsyncContext): `Send + Sync`.
pub type ThreadSafeLanesCell<K, T> = LanesCellOf<K, T, Threaded>;

impl<K: 'static, T: 'static, F: Flavor> Clone for LanesCellOf<K, T, F> {
    fn clone(&self) -> Self {
        LanesCellOf { shared: self.shared.clone() }
    }
}

impl<K: LaneKey + 'static, T: 'static, F: Flavor> std::fmt::Debug for LanesCellOf<K, T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.inner.with_lanes(|l| {
            f.debug_struct("LanesCell")
                .field("generation", &l.generation())
                .field("lanes", &l.lane_count())
                .field("next_ordinal", &l.next_ordinal())
                .field("pending", &l.pending_len())
                .field("inflight", &l.inflight_len())
                .field("parked", &l.parked_len())
                .field("exhausted", &l.exhausted_len())
                .finish()
        })
    }
}

/// Why [`LanesCellOf::try_enqueue`] refused a payload (it comes back).
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LanesRefused<T> {
    /// The lanes hold the cell's [capacity](CellOptions::capacity) of
    /// records not yet acknowledged.
    #[error("refused: {capacity} records are waiting to be acknowledged, the cell's capacity")]
    Full {
        /// The payload, back.
        payload: T,
        /// The capacity.
        capacity: usize,
    },
    /// Every lane is busy and the key needs a new one.
    #[error(transparent)]
    TooManyLanes(TooManyLanes<T>),
    /// The payload does not encode with the codec of the cell's store (see
    /// [`LanesCellOf::set_encode_check`]): it could never be written, and
    /// so never sent.
    #[error("the payload does not encode: {reason}")]
    Unencodable {
        /// The payload, back.
        payload: T,
        /// The codec's error (or its panic).
        reason: String,
    },
}

impl<T> std::fmt::Debug for LanesRefused<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LanesRefused::Full { capacity, .. } => f.debug_struct("Full").field("capacity", capacity).finish(),
            LanesRefused::TooManyLanes(t) => f.debug_tuple("TooManyLanes").field(&t.limit).finish(),
            LanesRefused::Unencodable { reason, .. } => f.debug_struct("Unencodable").field("reason", reason).finish(),
        }
    }
}

impl<K: LaneKey + 'static, T: Clone + 'static, F: LanesFlavor<K, T>> LanesCellOf<K, T, F> {
    /// A lanes cell with `policy`, at generation 0, owned by the current
    /// owner of `cx` (disposed with it, or when its last clone drops).
    #[track_caller]
    pub fn new(cx: &Handle<F>, policy: LanesPolicy) -> Self {
        Self::with_options(cx, policy, CellOptions::new())
    }

    /// A lanes cell with `policy` and `options`: the generation, clock,
    /// jitter seed, incarnation and capacity (of records not yet
    /// acknowledged, over every lane, which [`try_enqueue`](Self::try_enqueue)
    /// applies) of [`CellOptions`].
    #[track_caller]
    pub fn with_options(cx: &Handle<F>, policy: LanesPolicy, mut options: CellOptions) -> Self {
        let clock = options.take_clock(F::default_clock);
        let lanes = Lanes::with_generation(policy, options.generation);
        Self::build(cx, lanes, &options, clock, Location::caller())
    }

    /// A lanes cell over `lanes` as they are: durable lanes a store
    /// restored ([`Lanes::restore`]), with their generation (the options'
    /// is not used) and, for their ordinals, the store's incarnation in
    /// `options`. Drive their journal with [`poll_ready`](Self::poll_ready)
    /// (egress-store's lanes relay does).
    #[track_caller]
    pub fn from_lanes(cx: &Handle<F>, lanes: Lanes<K, T>, mut options: CellOptions) -> Self {
        let clock = options.take_clock(F::default_clock);
        Self::build(cx, lanes, &options, clock, Location::caller())
    }

    pub(super) fn build(
        cx: &Handle<F>,
        lanes: Lanes<K, T>,
        options: &CellOptions,
        clock: Arc<dyn Clock>,
        at: &'static Location<'static>,
    ) -> Self {
        let (incarnation, rng) = options.identity();
        let (scope, (inner, generation, released, journal)) = cx.scope(|| {
            let counts = std::array::from_fn(|which| cx.pushed(count(&lanes, which), at));
            let state = F::ptr(ValueCell::new(LanesState { lanes, rng, triggers: BTreeMap::new() }));
            let inner = LanesInner {
                handle: cx.clone(),
                state,
                generation: cx.trigger(at),
                released: cx.trigger(at),
                wake: cx.trigger(at),
                journal: cx.trigger(at),
                counts,
                clock,
            };
            let generation = Aggregate { inner: inner.clone(), trigger: inner.generation, project: Lanes::generation };
            let generation = cx.make_computed(ByEq, generation, at);
            let released = Aggregate { inner: inner.clone(), trigger: inner.released, project: Lanes::released };
            let released = cx.make_computed(ByEq, released, at);
            let persist_error = Aggregate {
                inner: inner.clone(),
                trigger: inner.journal,
                project: |l: &Lanes<K, T>| l.persist_error().cloned(),
            };
            let unpersisted =
                Aggregate { inner: inner.clone(), trigger: inner.journal, project: Lanes::unpersisted_len };
            let durable =
                Aggregate { inner: inner.clone(), trigger: inner.journal, project: Lanes::generation_durable };
            let journal = (
                cx.make_computed(ByEq, persist_error, at),
                cx.make_computed(ByEq, unpersisted, at),
                cx.make_computed(ByEq, durable, at),
            );
            (inner, generation, released, journal)
        });
        let (persist_error, unpersisted_len, generation_durable) = journal;
        let shared = Shared {
            inner,
            generation,
            released,
            persist_error,
            unpersisted_len,
            generation_durable,
            attachments: Attached::new(),
            scope,
            incarnation,
            capacity: options.capacity,
            encode_check: parking_lot::Mutex::new(None),
            readers: parking_lot::Mutex::new(LaneReaderCache::new()),
        };
        LanesCellOf { shared: F::ptr(shared) }
    }

    // ----- mutators --------------------------------------------------

    /// Sets (or, with `None`, removes) the check that a payload encodes
    /// that [`try_enqueue`](Self::try_enqueue) applies: durable lanes'
    /// store installs its codec's (`egress_store::open_durable_lanes`
    /// does), so that a value its codec refuses (or panics on) is refused
    /// at once with why, rather than left unwritten, holding every lane's
    /// writes. It runs on the caller's thread, before the cell is touched.
    pub fn set_encode_check(&self, check: Option<EncodeCheck<T>>) {
        *self.shared.encode_check.lock() = check;
    }

    /// Queues `payload` in `lane` (see [`Lanes::enqueue`]). Wakes the
    /// attachments when it can go now.
    ///
    /// # Errors
    /// [`TooManyLanes`], the payload returned and nothing changed, when
    /// the key needs a new lane and every lane is busy.
    pub fn enqueue(&self, lane: K, payload: T) -> Result<Enqueued, TooManyLanes<T>> {
        self.shared.inner.apply(By::Caller, |s| enqueue_in(s, lane, |l, k| l.enqueue(k, payload)))
    }

    /// [`enqueue`](Self::enqueue), unless the payload does not encode
    /// with its store's codec (see [`set_encode_check`](Self::set_encode_check))
    /// or the lanes hold the cell's [capacity](CellOptions::capacity) of
    /// records not yet acknowledged: then the payload comes back and
    /// nothing changes. ([`enqueue`](Self::enqueue) checks neither: a
    /// payload that does not encode stops durable lanes' writes, every
    /// lane's, see `egress_store::open_durable_lanes`.)
    ///
    /// # Errors
    /// [`LanesRefused`]: not encodable, at capacity, or too many lanes.
    pub fn try_enqueue(&self, lane: K, payload: T) -> Result<Enqueued, LanesRefused<T>> {
        let check = self.shared.encode_check.lock().clone();
        if let Some(Err(reason)) = check.map(|check| check(&payload)) {
            return Err(LanesRefused::Unencodable { payload, reason });
        }
        let capacity = self.shared.capacity;
        self.shared.inner.apply(By::Caller, |s| {
            let held = s.lanes.pending_len() + s.lanes.inflight_len() + s.lanes.parked_len() + s.lanes.exhausted_len();
            match capacity {
                Some(capacity) if held >= capacity => (Err(LanesRefused::Full { payload, capacity }), Touched::NOTHING),
                _ => {
                    let (r, touched) = enqueue_in(s, lane, |l, k| l.enqueue(k, payload));
                    (r.map_err(LanesRefused::TooManyLanes), touched)
                }
            }
        })
    }

    /// Queues `payload` in `lane` to go out only once
    /// [`release`](Self::release) reaches `after` (see
    /// [`Lanes::enqueue_after`]).
    ///
    /// # Errors
    /// [`TooManyLanes`], as [`enqueue`](Self::enqueue).
    pub fn enqueue_after(&self, lane: K, payload: T, after: FlushEpoch) -> Result<Enqueued, TooManyLanes<T>> {
        self.shared.inner.apply(By::Caller, |s| enqueue_in(s, lane, |l, k| l.enqueue_after(k, payload, after)))
    }

    /// The application made its state durable through `through`: records
    /// of every lane waiting for it go on. See [`Lanes::release`].
    pub fn release(&self, through: FlushEpoch) -> Vec<(K, usize)> {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.lanes.release(through);
            let changes = t.changes;
            let lanes = t.outcome.iter().map(|(k, _)| (k.clone(), changes)).collect();
            let released = !changes.is_empty();
            (t.outcome, Touched { lanes, generation: false, released, journal: false })
        })
    }

    /// Claims the next record under `generation` by hand (attachments do
    /// this for you) and passes the outcome to `f`, which must not call
    /// into the cell. The readers are invalidated after `f` returns.
    pub fn claim_with<R>(&self, generation: Generation, f: impl FnOnce(LanesClaim<'_, K, T>) -> R) -> R {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.lanes.claim(generation);
            let touched = match &t.outcome {
                LanesClaim::Claimed(e) => Touched::lane(e.lane.clone(), t.changes),
                _ => Touched::NOTHING,
            };
            (f(t.outcome), touched)
        })
    }

    /// A cumulative acknowledgement of `lane` from the peer of
    /// `generation`. See [`Lanes::ack`].
    pub fn ack(&self, generation: Generation, lane: &K, through: Sequence) -> AckOutcome {
        self.on_lane(lane, |l| l.ack(generation, lane, through))
    }

    /// The peer of `generation` processed the in-flight record `sequence`
    /// of `lane`, in any order. See [`Lanes::complete`].
    pub fn complete(&self, generation: Generation, lane: &K, sequence: Sequence) -> CompleteOutcome {
        self.on_lane(lane, |l| l.complete(generation, lane, sequence))
    }

    /// A receipt of `lane` from the peer of `generation`. See
    /// [`Lanes::received`].
    pub fn received(&self, generation: Generation, lane: &K, through: Sequence) -> ReceivedOutcome {
        self.on_lane(lane, |l| l.received(generation, lane, through))
    }

    /// Reports a failed send of `sequence` in `lane`, now (by the cell's
    /// clock), with a jitter sample from the cell's generator. See
    /// [`Lanes::fail`].
    pub fn fail(&self, generation: Generation, lane: &K, sequence: Sequence, kind: FailureKind) -> FailOutcome {
        self.shared.inner.fail(By::Caller, generation, lane, sequence, kind, None)
    }

    /// [`fail`](Self::fail) with a given jitter sample.
    pub fn fail_with(
        &self,
        generation: Generation,
        lane: &K,
        sequence: Sequence,
        kind: FailureKind,
        jitter: JitterSample,
    ) -> FailOutcome {
        self.shared.inner.fail(By::Caller, generation, lane, sequence, kind, Some(jitter))
    }

    /// Sends the parked record `sequence` of `lane` again now. See
    /// [`Lanes::retry_now`].
    pub fn retry_now(&self, generation: Generation, lane: &K, sequence: Sequence) -> ScheduleOutcome {
        self.on_lane(lane, |l| l.retry_now(generation, lane, sequence))
    }

    /// Gives the held dead letter `sequence` of `lane` a fresh budget. See
    /// [`Lanes::requeue`].
    pub fn requeue(&self, generation: Generation, lane: &K, sequence: Sequence) -> ScheduleOutcome {
        self.on_lane(lane, |l| l.requeue(generation, lane, sequence))
    }

    /// Makes every parked record due at `now` pending again, in every lane.
    /// See [`Lanes::handle_timeout`].
    pub fn handle_timeout(&self, now: Time) -> Vec<(K, Vec<Sequence>)> {
        self.shared.inner.handle_timeout(now)
    }

    /// Fences the connection: every lane moves to `generation`, and every
    /// attachment of an older one is disposed first (it never sends again).
    /// Attach the new connection's transport to replay. See
    /// [`Lanes::reconnect`].
    pub fn reconnect(&self, generation: Generation) -> LanesReconnect<K> {
        let outcome = self.shared.inner.apply(By::Caller, |s| {
            let t = s.lanes.reconnect(generation);
            let touched = match &t.outcome {
                LanesReconnect::Advanced { lanes, .. } => {
                    Touched { lanes: lanes.clone(), generation: true, released: false, journal: false }
                }
                _ => Touched::NOTHING,
            };
            (t.outcome, touched)
        });
        if matches!(outcome, LanesReconnect::Advanced { .. }) {
            tracing::debug!(
                generation = generation.get(),
                "egress lanes: a new generation; earlier attachments fenced"
            );
            self.shared.attachments.fence_below(&self.shared.inner.handle, generation);
        }
        outcome
    }

    // ----- the journal (durable lanes) ---------------------------------

    /// What the store must write next, with the payloads of each lane's
    /// appends (cloned, in the order of `ready.lanes`). See
    /// [`Lanes::poll_ready`]; `None` without a journal.
    ///
    /// A payload whose `Clone` panics fails the epoch (the journal does
    /// not wait for a report that never comes), then the panic goes on.
    pub fn poll_ready(&self) -> Option<(LanesReady<K>, LanesAppends<T>)> {
        let (ready, panic) = self.shared.inner.apply(By::Caller, |s| {
            let Some(ready) = s.lanes.poll_ready() else { return ((None, None), Touched::NOTHING) };
            let copied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                ready
                    .lanes
                    .iter()
                    .map(|part| {
                        s.lanes.lane(&part.lane).map_or_else(Vec::new, |core| {
                            core.unwritten(part.ready.appends.clone()).map(|(q, p)| (q, p.clone())).collect()
                        })
                    })
                    .collect::<Vec<_>>()
            }));
            match copied {
                Ok(appends) => ((Some((ready, appends)), None), Touched::NOTHING),
                Err(panic) => {
                    let t = s.lanes.persist_failed(ready.epoch, "a payload's Clone panicked");
                    ((None, Some(panic)), touched_by_journal(&t.outcome, t.changes))
                }
            }
        });
        if let Some(panic) = panic {
            std::panic::resume_unwind(panic);
        }
        ready
    }

    /// The store wrote `epoch`. See [`Lanes::persisted`]; wakes the
    /// attachments when records became claimable.
    pub fn persisted(&self, epoch: Epoch) -> LanesPersisted<K> {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.lanes.persisted(epoch);
            let touched = touched_by_journal(&t.outcome, t.changes);
            (t.outcome, touched)
        })
    }

    /// The store could not write `epoch`. See [`Lanes::persist_failed`].
    pub fn persist_failed(&self, epoch: Epoch, reason: impl Into<String>) -> LanesPersisted<K> {
        let reason = reason.into();
        tracing::warn!(epoch = ?epoch, %reason, "egress lanes: the store could not write");
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.lanes.persist_failed(epoch, reason);
            let touched = touched_by_journal(&t.outcome, t.changes);
            (t.outcome, touched)
        })
    }

    /// The last failure to write the lanes, until a later write succeeds
    /// (`None` without a journal).
    pub fn persist_error(&self) -> &Computed<Option<PersistError>, F> {
        &self.shared.persist_error
    }

    /// Records enqueued and not yet durable, over every lane (0 without a
    /// journal). Reading it sums over the lanes.
    pub fn unpersisted_len(&self) -> &Computed<usize, F> {
        &self.shared.unpersisted_len
    }

    /// Makes the running effect or computed depend on every transition of
    /// durable lanes (none for lanes without a journal): a store's relay
    /// reads this in an effect to learn that the journal may have
    /// something to write (an append, an acknowledgement, a dead letter, a
    /// generation).
    pub fn track_journal(&self) {
        let inner = &self.shared.inner;
        inner.handle.enter(|cell| Handle::track(cell, inner.journal));
    }

    /// Whether the current generation is stored (always without a
    /// journal): nothing is claimed under it before.
    pub fn generation_durable(&self) -> &Computed<bool, F> {
        &self.shared.generation_durable
    }

    fn on_lane<O>(&self, lane: &K, op: impl FnOnce(&mut Lanes<K, T>) -> egress_core::Transition<O>) -> O {
        self.shared.inner.apply(By::Caller, |s| {
            let t = op(&mut s.lanes);
            (t.outcome, Touched::lane(lane.clone(), t.changes))
        })
    }

    // ----- aggregate readers ------------------------------------------

    /// Records pending, over every lane.
    pub fn pending_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[PENDING_LEN]
    }

    /// Records in flight, over every lane (completed ones waiting for an
    /// earlier record of their lane included).
    pub fn inflight_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[INFLIGHT_LEN]
    }

    /// Records in flight and not completed, over every lane: what the
    /// policy's [`inflight_cap`](LanesPolicy::inflight_cap) bounds.
    pub fn outstanding(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[OUTSTANDING]
    }

    /// Records parked for a retry, over every lane.
    pub fn parked_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[PARKED_LEN]
    }

    /// Dead letters held, over every lane.
    pub fn exhausted_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[EXHAUSTED_LEN]
    }

    /// Records waiting for a flush epoch, over every lane.
    pub fn gated_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[GATED_LEN]
    }

    /// How many lanes exist (idle ones included).
    pub fn lane_count(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[LANE_COUNT]
    }

    /// The generation of every lane.
    pub fn generation(&self) -> &Computed<Generation, F> {
        &self.shared.generation
    }

    /// Every flush epoch at or below it is released.
    pub fn released(&self) -> &Computed<FlushEpoch, F> {
        &self.shared.released
    }

    // ----- untracked ----------------------------------------------------

    /// When the earliest parked record of any lane is due (untracked): call
    /// [`handle_timeout`](Self::handle_timeout) then.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.with_lanes(Lanes::poll_timeout)
    }

    /// Reads the lanes directly, untracked (a lane's core, the ordinals,
    /// the policy). `f` must not call into the cell.
    pub fn with_lanes<R>(&self, f: impl FnOnce(&Lanes<K, T>) -> R) -> R {
        self.shared.inner.with_lanes(f)
    }

    /// The incarnation of the cell's sequence spaces (see
    /// [`CellOptions::incarnation`](crate::CellOptions::incarnation)).
    pub fn incarnation(&self) -> Incarnation {
        self.shared.incarnation
    }

    /// The cell's clock, read now.
    pub fn now(&self) -> Time {
        self.shared.inner.clock.now()
    }

    /// Disposes every node the cell created: its readers, triggers and
    /// attachments. The lanes and their records stay: mutators still apply
    /// transitions, and notify nothing. Dropping the last clone does the
    /// same. Idempotent.
    pub fn dispose(&self) {
        self.shared.scope.dispose();
    }

    /// Whether the cell was disposed (or its owner, or its context).
    pub fn is_disposed(&self) -> bool {
        self.shared.scope.is_disposed()
    }

    /// Runs `f` on the cell's graph with the cell as owner: what `f`
    /// creates there is disposed with the cell (a transport's state beside
    /// the cell's, such as its connection state).
    ///
    /// # Errors
    /// [`ReadError::Disposed`](crate::ReadError) (and `f` not run) if the
    /// cell was disposed.
    pub fn in_scope<R>(&self, f: impl FnOnce(&Handle<F>) -> R) -> Result<R, crate::ReadError> {
        let handle = &self.shared.inner.handle;
        self.shared.scope.try_run(|| f(handle))
    }
}

/// The payloads of a [`LanesReady`]'s appends: for each of its lanes, in
/// order, each appended record's sequence and payload.
pub type LanesAppends<T> = Vec<Vec<(Sequence, T)>>;

/// What a report of the journal touched: each lane of the epoch with the
/// union of the changes, and the journal's readers (an epoch may write a
/// generation and touch no lane).
fn touched_by_journal<K: Clone>(outcome: &LanesPersisted<K>, changes: Changes) -> Touched<K> {
    match outcome {
        LanesPersisted::Recorded { lanes } => Touched {
            lanes: lanes.iter().map(|k| (k.clone(), changes)).collect(),
            generation: false,
            released: false,
            journal: true,
        },
        _ => Touched::NOTHING,
    }
}

/// An enqueue on the state: the lane it touched, and the lane it freed
/// (whose readers now read it as no lane's).
fn enqueue_in<K: LaneKey, T, R>(
    s: &mut LanesState<K, T>,
    key: K,
    op: impl FnOnce(&mut Lanes<K, T>, K) -> egress_core::Transition<Result<Enqueued, R>>,
) -> (Result<Enqueued, R>, Touched<K>) {
    let freed = if s.lanes.lane(&key).is_none() { s.lanes.next_freed().cloned() } else { None };
    let t = op(&mut s.lanes, key.clone());
    let freed = freed.filter(|_| t.outcome.as_ref().is_ok_and(|e| e.new_lane));
    let Some(freed) = freed else { return (t.outcome, Touched::lane(key, t.changes)) };
    // The change set is the union of the new lane's and the freed lane's:
    // a new lane has no watermarks to change, the freed lane nothing but
    // its watermarks (which now read as no lane's).
    let watermarks = Changes::NONE.with(Projection::AckedThrough).with(Projection::Received);
    let new_lane = Projection::ALL
        .iter()
        .filter(|p| !watermarks.contains(**p))
        .fold(Changes::NONE, |c, p| c.with_if(*p, t.changes.contains(*p)));
    let mut touched = Touched::lane(key, new_lane);
    touched.lanes.push((freed, watermarks));
    (t.outcome, touched)
}
