//! [`LatestCellOf`]: an [`egress_core::Latest`] projected into a graph, as
//! [`LanesCellOf`](super::LanesCellOf) projects lanes. This file: the cell,
//! its state and the one transition path; its per-key readers are in
//! `readers.rs`, its sink effects in `sink.rs`.

#[cfg(feature = "async")]
mod asynchronous;
mod readers;
mod sink;

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::panic::Location;
use std::sync::Arc;

use egress_core::{
    Applied, Delay, Epoch, Failed, ForgetRefused, Generation, JitterSample, KeyChanges, KeyProjection, Latest,
    LatestClaim, LatestPersisted, LatestReady, LatestReconnect, LatestWrite, PersistError, Policy, Time, TooManyKeys,
    Upserted, Version,
};

#[cfg(feature = "async")]
pub use self::asynchronous::AsyncLatestCell;
pub use self::readers::{KeyProject, KeyReaders};
use self::readers::{KeyReader, KeyReaderCache};
pub use self::sink::{LatestAttachment, LatestItem, LatestRun, LatestSink, Written};
use super::clock::{Clock, MonotonicClock};
use super::fences::Attached;
use super::inner::{By, next_jitter};
use super::options::CellOptions;
use crate::computed::{ByEq, Computed, ComputedObj};
use crate::context::{Handle, Scope};
use crate::flavor::{Entered, Flavor, Holds, Local, Threaded, ValueCell};
use crate::graph::Key;
use crate::run;

/// The flavours that can hold a latest cell of keys `K` and values `V`:
/// [`Local`] for any, [`Threaded`] for `Send + Sync` keys and values. (It
/// names the node types a latest cell creates, so that one generic
/// implementation serves both.)
#[doc(hidden)]
pub trait LatestFlavor<K: Ord + Clone + 'static, V: Clone + PartialEq + 'static>:
    Flavor
    + Holds<KeyReader<K, V, Option<(Version, V)>, Self>>
    + Holds<KeyReader<K, V, Option<Version>, Self>>
    + Holds<KeyReader<K, V, Option<Time>, Self>>
    + Holds<ComputedObj<usize, Journaled<K, V, usize, Self>, ByEq, Self>>
    + Holds<ComputedObj<Option<PersistError>, Journaled<K, V, Option<PersistError>, Self>, ByEq, Self>>
{
    /// The clock of a cell built without one.
    fn default_clock() -> Arc<dyn Clock> {
        Arc::new(MonotonicClock::new())
    }
}

impl<K: Ord + Clone + 'static, V: Clone + PartialEq + 'static> LatestFlavor<K, V> for Local {}
impl<K: Ord + Clone + Send + Sync + 'static, V: Clone + PartialEq + Send + Sync + 'static> LatestFlavor<K, V>
    for Threaded
{
}

/// How many triggers a key with readers has: one per [`KeyProjection`].
const KEY_TRIGGERS: usize = KeyProjection::ALL.len();

/// The projection, the generator of jitter samples, and the triggers of
/// the keys someone reads: touched only with the graph entered.
#[doc(hidden)]
pub struct LatestState<K, V> {
    latest: Latest<K, V>,
    rng: u64,
    /// One trigger per [`KeyProjection`] of each key that has readers.
    triggers: BTreeMap<K, [Key; KEY_TRIGGERS]>,
}

/// How many aggregate counts a latest cell keeps, and their order.
const COUNTS: usize = 5;
const LEN: usize = 0;
const DESIRED_LEN: usize = 1;
const INFLIGHT_LEN: usize = 2;
const WAITING_LEN: usize = 3;
const CLAIMABLE_LEN: usize = 4;

fn count<K: Ord + Clone, V: PartialEq>(latest: &Latest<K, V>, which: usize) -> usize {
    match which {
        LEN => latest.len(),
        DESIRED_LEN => latest.desired_len(),
        INFLIGHT_LEN => latest.inflight_len(),
        WAITING_LEN => latest.waiting_len(),
        _ => latest.claimable_len(),
    }
}

/// What every part of a latest cell shares: the graph, the state, the
/// aggregate readers (pushed after each transition), the clock. Cloned
/// into each sink effect and reader, so that they do not keep the cell
/// alive.
#[doc(hidden)]
pub struct LatestInner<K: 'static, V: 'static, F: Flavor> {
    handle: Handle<F>,
    state: F::Ptr<F::Cell<LatestState<K, V>>>,
    /// Notified when a transition not made by a sink effect makes a claim
    /// possible: what sink effects track.
    wake: Key,
    /// Notified, for a durable projection, by every transition: what the
    /// journal may have to write, and its readers.
    journal: Key,
    counts: [Computed<usize, F>; COUNTS],
    settled: Computed<bool, F>,
    generation: Computed<Generation, F>,
    clock: Arc<dyn Clock>,
}

impl<K: 'static, V: 'static, F: Flavor> Clone for LatestInner<K, V, F> {
    fn clone(&self) -> Self {
        LatestInner {
            handle: self.handle.clone(),
            state: self.state.clone(),
            wake: self.wake,
            journal: self.journal,
            counts: self.counts.clone(),
            settled: self.settled.clone(),
            generation: self.generation.clone(),
            clock: self.clock.clone(),
        }
    }
}

/// The keys a transition touched, each with what of it changed (empty
/// for a no-op), and whether it moved the generation.
pub(super) struct Touched<K> {
    keys: Vec<(K, KeyChanges)>,
    /// It moved the generation, or the journal (a report of the store's,
    /// which changes no key's projections): the aggregates may change.
    whole: bool,
}

impl<K> Touched<K> {
    const NOTHING: Self = Touched { keys: Vec::new(), whole: false };

    fn key(key: K, changes: KeyChanges) -> Self {
        if changes.is_empty() {
            return Self::NOTHING;
        }
        Touched { keys: vec![(key, changes)], whole: false }
    }

    fn is_empty(&self) -> bool {
        self.keys.is_empty() && !self.whole
    }
}

impl<K: Ord + Clone + 'static, V: PartialEq + 'static, F: Flavor> LatestInner<K, V, F> {
    /// Applies `op` to the state with the graph entered, then invalidates
    /// exactly the readers of what it touched (and wakes the sink effects
    /// if a caller's transition made a claim possible), as one write. `op`
    /// must not call into the cell.
    pub(super) fn apply<R>(&self, by: By, op: impl FnOnce(&mut LatestState<K, V>) -> (R, Touched<K>)) -> R {
        self.handle.enter(|cell| {
            let entered = Entered::by(cell);
            let (outcome, keys) = self.state.with_mut(&entered, |s| {
                let (outcome, touched) = caught(s, op);
                let wake = by == By::Caller && !touched.is_empty() && s.latest.claimable_len() > 0;
                (outcome, self.keys(&entered, s, &touched, wake))
            });
            if !keys.is_empty()
                && let Err(e) = run::notify(cell, &keys)
            {
                panic!("{e}");
            }
            outcome.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// As [`apply`](Self::apply) inside a sink effect's own run (`entered`:
    /// the graph is entered already): the keys go to `marks`, marked when
    /// the run ends.
    pub(super) fn apply_quiet<R>(
        &self,
        entered: &Entered,
        marks: &mut Vec<Key>,
        op: impl FnOnce(&mut LatestState<K, V>) -> (R, Touched<K>),
    ) -> R {
        let outcome = self.state.with_mut(entered, |s| {
            let (outcome, touched) = caught(s, op);
            marks.extend(self.keys(entered, s, &touched, false));
            outcome
        });
        outcome.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    /// Marks `keys` dirty without running effects (a sink effect's run
    /// ends: its flush runs them).
    pub(super) fn mark(&self, keys: &[Key]) {
        if !keys.is_empty() {
            self.handle.enter(|cell| run::mark(cell, keys));
        }
    }

    /// What to notify for `touched`: the triggers of the touched keys'
    /// projections (for keys that have readers), the aggregate readers
    /// whose value changed, and the wake trigger.
    fn keys(&self, entered: &Entered, s: &LatestState<K, V>, touched: &Touched<K>, wake: bool) -> Vec<Key> {
        let mut keys = Vec::new();
        if touched.is_empty() {
            return keys;
        }
        if !s.triggers.is_empty() {
            for (key, changes) in &touched.keys {
                if let Some(triggers) = s.triggers.get(key) {
                    let changed = KeyProjection::ALL.iter().zip(triggers).filter(|(p, _)| changes.contains(**p));
                    keys.extend(changed.map(|(_, k)| *k));
                }
            }
        }
        for (which, reader) in self.counts.iter().enumerate() {
            if reader.push(entered, count(&s.latest, which)) {
                keys.push(reader.key);
            }
        }
        if self.settled.push(entered, s.latest.is_settled()) {
            keys.push(self.settled.key);
        }
        if self.generation.push(entered, s.latest.generation()) {
            keys.push(self.generation.key);
        }
        if wake {
            keys.push(self.wake);
        }
        if s.latest.is_journaled() {
            keys.push(self.journal);
        }
        keys
    }

    /// Frees every key whose backoff ended at `now`.
    pub(super) fn handle_timeout(&self, now: Time) -> Vec<K> {
        self.apply(By::Caller, |s| {
            let freed = s.latest.handle_timeout(now);
            let keys = freed.iter().map(|(k, _)| k.clone()).collect();
            (keys, Touched { keys: freed, whole: false })
        })
    }

    /// Reads the state, untracked.
    pub(super) fn with_latest<R>(&self, f: impl FnOnce(&Latest<K, V>) -> R) -> R {
        self.handle.enter(|cell| self.state.with(&Entered::by(cell), |s| f(&s.latest)))
    }

    /// Makes the running computation depend on the wake trigger.
    pub(super) fn track_wake(&self) {
        self.handle.enter(|cell| Handle::track(cell, self.wake));
    }

    /// The sink applied the flight of `key` at `version`.
    pub(super) fn ack_applied(&self, by: By, generation: Generation, key: &K, version: Version) -> Applied {
        self.apply(by, |s| ack_in(s, generation, key, version))
    }

    /// Writing the flight of `key` at `version` failed, now (by the cell's
    /// clock), with the cell's next jitter sample (or `jitter`).
    pub(super) fn fail_retryable(
        &self,
        by: By,
        generation: Generation,
        key: &K,
        version: Version,
        hint: Option<Delay>,
        jitter: Option<JitterSample>,
    ) -> Failed {
        let now = self.clock.now();
        self.apply(by, |s| fail_in(s, generation, key, version, now, hint, jitter))
    }
}

/// Runs `op` on the state, catching a panic from user code inside it (a
/// key's `Clone` or `Ord`, a value's `PartialEq`): the aggregate readers are
/// then pushed from the state as it is (a panicking `Ord` may leave the
/// projection inconsistent, see [`Latest`]; the readers at least show what
/// it holds), and the panic goes on once they are.
fn caught<K, V, R>(
    s: &mut LatestState<K, V>,
    op: impl FnOnce(&mut LatestState<K, V>) -> (R, Touched<K>),
) -> (Result<R, run::Panic>, Touched<K>) {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| op(s))) {
        Ok((outcome, touched)) => (Ok(outcome), touched),
        Err(panic) => (Err(panic), Touched { keys: Vec::new(), whole: true }),
    }
}

/// [`Latest::ack_applied`] on the state, with what it touched.
pub(super) fn ack_in<K: Ord + Clone, V: PartialEq>(
    s: &mut LatestState<K, V>,
    generation: Generation,
    key: &K,
    version: Version,
) -> (Applied, Touched<K>) {
    let t = s.latest.ack_applied(generation, key, version);
    (t.outcome, Touched::key(key.clone(), t.changes))
}

/// [`Latest::fail_retryable`] on the state at `now`, with `jitter` or the
/// state's next sample, and what it touched.
pub(super) fn fail_in<K: Ord + Clone, V: PartialEq>(
    s: &mut LatestState<K, V>,
    generation: Generation,
    key: &K,
    version: Version,
    now: Time,
    hint: Option<Delay>,
    jitter: Option<JitterSample>,
) -> (Failed, Touched<K>) {
    let jitter = jitter.unwrap_or_else(|| next_jitter(&mut s.rng));
    let t = s.latest.fail_retryable(generation, key, version, now, hint, jitter);
    (t.outcome, Touched::key(key.clone(), t.changes))
}

/// A reader of the journal's state: one value of the whole [`Latest`],
/// after tracking the journal's trigger.
#[doc(hidden)]
pub struct Journaled<K: 'static, V: 'static, P, F: Flavor> {
    inner: LatestInner<K, V, F>,
    project: fn(&Latest<K, V>) -> P,
}

impl<K: Ord + Clone + 'static, V: PartialEq + 'static, P: 'static, F: Flavor> crate::computed::Compute<P>
    for Journaled<K, V, P, F>
{
    fn compute(&self) -> P {
        let inner = &self.inner;
        inner.handle.enter(|cell| {
            Handle::track(cell, inner.journal);
            inner.state.with(&Entered::by(cell), |s| (self.project)(&s.latest))
        })
    }
}

/// A store's check that it can write an upsert (key, version, value):
/// `Err(why)` when it cannot (see [`LatestCellOf::set_write_check`]).
pub type LatestCheck<K, V> = Arc<dyn Fn(&K, Version, &V) -> Result<(), String> + Send + Sync>;

/// Why [`LatestCellOf::upsert`] refused a value (it comes back).
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LatestRefused<V> {
    /// Every key the projection holds exists and the key is new.
    #[error(transparent)]
    TooManyKeys(TooManyKeys<V>),
    /// The cell's store could not write the key, version or value (see
    /// [`LatestCellOf::set_write_check`]): a value its codec cannot
    /// encode, a key serde cannot write, a version above what it stores.
    #[error("the store cannot write it: {reason}")]
    Unwritable {
        /// The value, back.
        value: V,
        /// Why.
        reason: String,
    },
}

impl<V> std::fmt::Debug for LatestRefused<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LatestRefused::TooManyKeys(t) => f.debug_tuple("TooManyKeys").field(&t.limit).finish(),
            LatestRefused::Unwritable { reason, .. } => f.debug_struct("Unwritable").field("reason", reason).finish(),
        }
    }
}

/// What the clones of a latest cell share.
pub(super) struct Shared<K: 'static, V: 'static, F: Flavor> {
    inner: LatestInner<K, V, F>,
    persist_error: Computed<Option<PersistError>, F>,
    unpersisted_len: Computed<usize, F>,
    /// The live sink effects, by the generation each captured.
    attachments: Attached<F>,
    /// Owns every node of the cell.
    scope: Scope<F>,
    readers: parking_lot::Mutex<KeyReaderCache<K, V, F>>,
    /// See [`LatestCellOf::set_write_check`].
    write_check: parking_lot::Mutex<Option<LatestCheck<K, V>>>,
}

/// The newest value of each key, brought to a sink, as signals: an
/// [`egress_core::Latest`] (per key a desire, at most one value in flight,
/// the highest version the sink applied; see its rules) projected into a
/// graph, as [`EgressCellOf`](super::EgressCellOf) projects one stream.
/// For what only the latest value of matters (a slider, a cursor, a
/// presence state, a setting): intermediate values a newer one replaced
/// before the sink was free are never written. Use it as [`LatestCell`]
/// (on a [`Context`](crate::Context)) or [`ThreadSafeLatestCell`] (on a
/// [`ThreadSafeContext`](crate::ThreadSafeContext) or an
/// [`AsyncContext`](crate::AsyncContext)'s handle), or as
/// [`AsyncLatestCell`] with its own timer.
///
/// - **Aggregate readers**, kept eagerly (O(1) per transition, notifying
///   only when their value changes): [`len`](Self::len),
///   [`desired_len`](Self::desired_len), [`inflight_len`](Self::inflight_len),
///   [`waiting_len`](Self::waiting_len), [`claimable_len`](Self::claimable_len),
///   [`is_settled`](Self::is_settled), [`generation`](Self::generation).
/// - **Per-key readers**, made on demand by [`key`](Self::key): the key's
///   desire, flight, frontier and backoff, each a lazy computed
///   invalidated only by a transition that changed it. A key that does
///   not exist (yet, or any more) reads as `None` throughout.
/// - **Mutators** return the core's outcomes and invalidate exactly the
///   readers of what they changed, as one write.
/// - **Sink effects** ([`attach`](Self::attach)): one effect per sink
///   connection claims every claimable key, one flight per key, and
///   writes each to a [`LatestSink`]; a failed write backs the key off on
///   the [`Policy`]'s retry schedule, so a failing sink is never retried
///   in a spin.
///
/// The synchronous flavours own no timer: ask [`poll_timeout`](Self::poll_timeout)
/// and call [`handle_timeout`](Self::handle_timeout) then. Mutators and
/// readers must not be called from inside `claim_with`'s closure.
///
/// ```
/// use egress_core::{Policy, Version};
/// use egress_reactive::{Context, LatestCell, LatestItem, LatestSink, SendError, Written};
/// use std::{cell::RefCell, collections::BTreeMap, rc::Rc};
///
/// // A sink that applies each value at once: a settings table.
/// struct Table(Rc<RefCell<BTreeMap<&'static str, u32>>>);
/// impl LatestSink<&'static str, u32> for Table {
///     fn write(&mut self, item: LatestItem<&'static str, u32>) -> Result<Written, SendError> {
///         self.0.borrow_mut().insert(item.key, item.value);
///         Ok(Written::Applied)
///     }
/// }
///
/// let cx = Context::new();
/// let cell = LatestCell::new(&cx, Policy::default(), 64.try_into()?);
/// let volume = cell.key(&"volume");
/// let table = Rc::new(RefCell::new(BTreeMap::new()));
/// let sink = cell.attach(Table(table.clone()));
/// cx.batch(|| {
///     // Three moves of a slider in one batch: the sink sees the last.
///     for (v, value) in [(1, 10), (2, 20), (3, 30)] {
///         cell.upsert("volume", Version(v), value).expect("room for the key");
///     }
/// });
/// assert_eq!(table.borrow()["volume"], 30);
/// assert_eq!(volume.durable_through().get(), Some(Version(3)));
/// assert!(cell.is_settled().get());
/// # drop(sink);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LatestCellOf<K: 'static, V: 'static, F: Flavor> {
    shared: F::Ptr<Shared<K, V, F>>,
}

/// A latest cell on a [`Context`](crate::Context) (one thread).
pub type LatestCell<K, V> = LatestCellOf<K, V, Local>;

/// A latest cell on a [`ThreadSafeContext`](crate::ThreadSafeContext) or
/// an [`AsyncContext`](crate::AsyncContext): `Send + Sync`.
pub type ThreadSafeLatestCell<K, V> = LatestCellOf<K, V, Threaded>;

impl<K: 'static, V: 'static, F: Flavor> Clone for LatestCellOf<K, V, F> {
    fn clone(&self) -> Self {
        LatestCellOf { shared: self.shared.clone() }
    }
}

impl<K: Ord + Clone + 'static, V: PartialEq + 'static, F: Flavor> std::fmt::Debug for LatestCellOf<K, V, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.inner.with_latest(|l| {
            f.debug_struct("LatestCell")
                .field("generation", &l.generation())
                .field("keys", &l.len())
                .field("desired", &l.desired_len())
                .field("inflight", &l.inflight_len())
                .field("waiting", &l.waiting_len())
                .finish()
        })
    }
}

impl<K: Ord + Clone + 'static, V: Clone + PartialEq + 'static, F: LatestFlavor<K, V>> LatestCellOf<K, V, F> {
    /// A latest cell with `policy` (its retry schedule paces a failing
    /// key) and at most `max_keys` keys, at generation 0, owned by the
    /// current owner of `cx` (disposed with it, or when its last clone
    /// drops).
    #[track_caller]
    pub fn new(cx: &Handle<F>, policy: Policy, max_keys: NonZeroUsize) -> Self {
        Self::with_options(cx, policy, max_keys, CellOptions::new())
    }

    /// A latest cell with `policy`, `max_keys` and `options`: the
    /// generation, clock and jitter seed of [`CellOptions`] (its
    /// incarnation and capacity do not apply: a key is named by the
    /// caller, and `max_keys` bounds the keys).
    #[track_caller]
    pub fn with_options(cx: &Handle<F>, policy: Policy, max_keys: NonZeroUsize, mut options: CellOptions) -> Self {
        let clock = options.take_clock(F::default_clock);
        let latest = Latest::with_generation(policy, max_keys, options.generation);
        Self::build(cx, latest, &options, clock, Location::caller())
    }

    /// A latest cell over `latest` as it is: keys a store restored
    /// ([`Latest::restore`]), with their generation (the options' is not
    /// used).
    #[track_caller]
    pub fn from_latest(cx: &Handle<F>, latest: Latest<K, V>, mut options: CellOptions) -> Self {
        let clock = options.take_clock(F::default_clock);
        Self::build(cx, latest, &options, clock, Location::caller())
    }

    pub(super) fn build(
        cx: &Handle<F>,
        latest: Latest<K, V>,
        options: &CellOptions,
        clock: Arc<dyn Clock>,
        at: &'static Location<'static>,
    ) -> Self {
        let (_, rng) = options.identity();
        let (scope, (inner, persist_error, unpersisted_len)) = cx.scope(|| {
            let counts = std::array::from_fn(|which| cx.pushed(count(&latest, which), at));
            let settled = cx.pushed(latest.is_settled(), at);
            let generation = cx.pushed(latest.generation(), at);
            let state = F::ptr(ValueCell::new(LatestState { latest, rng, triggers: BTreeMap::new() }));
            let (wake, journal) = (cx.trigger(at), cx.trigger(at));
            let inner = LatestInner { handle: cx.clone(), state, wake, journal, counts, settled, generation, clock };
            let error = Journaled { inner: inner.clone(), project: |l: &Latest<K, V>| l.persist_error().cloned() };
            let unpersisted = Journaled { inner: inner.clone(), project: Latest::unpersisted_len };
            let (error, unpersisted) = (cx.make_computed(ByEq, error, at), cx.make_computed(ByEq, unpersisted, at));
            (inner, error, unpersisted)
        });
        let shared = Shared {
            inner,
            persist_error,
            unpersisted_len,
            attachments: Attached::new(),
            scope,
            readers: parking_lot::Mutex::new(KeyReaderCache::new()),
            write_check: parking_lot::Mutex::new(None),
        };
        LatestCellOf { shared: F::ptr(shared) }
    }

    // ----- mutators --------------------------------------------------

    /// Sets (or, with `None`, removes) the check that the store can write
    /// an upsert's key, version and value, which [`upsert`](Self::upsert)
    /// applies: a durable projection's store installs its own
    /// (`egress_store::open_durable_latest` does: the value encodes with
    /// its codec, the key with serde, the version fits its integers), so
    /// that what it could never write is refused at once with why, rather
    /// than accepted and never written, which would hold every key's write
    /// back.
    pub fn set_write_check(&self, check: Option<LatestCheck<K, V>>) {
        *self.shared.write_check.lock() = check;
    }

    /// Desires `value` at `version` for `key`: newer wins (see
    /// [`Latest::upsert`] for the outcomes). Wakes the sink effects when
    /// the key can be written now.
    ///
    /// # Errors
    /// [`LatestRefused`] (the value back, nothing changed): a new key when
    /// `max_keys` keys exist, or what the store cannot write (see
    /// [`set_write_check`](Self::set_write_check)).
    pub fn upsert(&self, key: K, version: Version, value: V) -> Result<Upserted, LatestRefused<V>> {
        let check = self.shared.write_check.lock().clone();
        if let Some(check) = check
            && let Err(reason) = check(&key, version, &value)
        {
            return Err(LatestRefused::Unwritable { value, reason });
        }
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.latest.upsert(key.clone(), version, value);
            (t.outcome.map_err(LatestRefused::TooManyKeys), Touched::key(key, t.changes))
        })
    }

    /// Claims the desire of `key` under `generation` by hand (sink effects
    /// do this for you) and passes the outcome to `f`, which must not call
    /// into the cell. The readers are invalidated after `f` returns.
    pub fn claim_with<R>(&self, generation: Generation, key: &K, f: impl FnOnce(LatestClaim<'_, K, V>) -> R) -> R {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.latest.claim(generation, key);
            let changes = t.changes;
            (f(t.outcome), Touched::key(key.clone(), changes))
        })
    }

    /// The sink of `generation` applied `key` at `version`: only the exact
    /// flight moves the frontier. See [`Latest::ack_applied`].
    pub fn ack_applied(&self, generation: Generation, key: &K, version: Version) -> Applied {
        self.shared.inner.ack_applied(By::Caller, generation, key, version)
    }

    /// Writing `key` at `version` under `generation` failed, now (by the
    /// cell's clock), with a jitter sample from the cell's generator, at
    /// least `hint` (the sink's "retry after") before the next try. See
    /// [`Latest::fail_retryable`].
    pub fn fail_retryable(&self, generation: Generation, key: &K, version: Version, hint: Option<Delay>) -> Failed {
        self.shared.inner.fail_retryable(By::Caller, generation, key, version, hint, None)
    }

    /// [`fail_retryable`](Self::fail_retryable) with a given jitter sample.
    pub fn fail_retryable_with(
        &self,
        generation: Generation,
        key: &K,
        version: Version,
        hint: Option<Delay>,
        jitter: JitterSample,
    ) -> Failed {
        self.shared.inner.fail_retryable(By::Caller, generation, key, version, hint, Some(jitter))
    }

    /// Frees every key whose backoff ends at or before `now`, and returns
    /// them in key order; wakes the sink effects. See
    /// [`Latest::handle_timeout`].
    pub fn handle_timeout(&self, now: Time) -> Vec<K> {
        self.shared.inner.handle_timeout(now)
    }

    /// Fences the sink: the projection moves to `generation` (every flight
    /// back as its key's desire unless superseded), and every sink effect
    /// of an older one is disposed (it never writes again). Attach the new
    /// connection's sink to write them. See [`Latest::reconnect`].
    pub fn reconnect(&self, generation: Generation) -> LatestReconnect<K> {
        let outcome = self.shared.inner.apply(By::Caller, |s| {
            let outcome = s.latest.reconnect(generation);
            let touched = match &outcome {
                LatestReconnect::Advanced { keys, .. } => Touched { keys: keys.clone(), whole: true },
                _ => Touched::NOTHING,
            };
            (outcome, touched)
        });
        if matches!(outcome, LatestReconnect::Advanced { .. }) {
            tracing::debug!(generation = generation.get(), "egress latest: a new generation; earlier sinks fenced");
            self.shared.attachments.fence_below(&self.shared.inner.handle, generation);
        }
        outcome
    }

    /// Drops `key`, which has no desire and no flight: its frontier and
    /// backoff go with it, and its readers read `None`. See
    /// [`Latest::forget`].
    ///
    /// # Errors
    /// [`ForgetRefused`]: no such key, or it has a desire or a flight.
    pub fn forget(&self, key: &K) -> Result<Option<Version>, ForgetRefused> {
        self.shared.inner.apply(By::Caller, |s| {
            let had = KeyChanges::NONE
                .with_if(KeyProjection::DurableThrough, s.latest.durable_through(key).is_some())
                .with_if(KeyProjection::Backoff, s.latest.backoff(key).is_some());
            match s.latest.forget(key) {
                Ok(frontier) => (Ok(frontier), Touched { keys: vec![(key.clone(), had)], whole: false }),
                Err(refused) => (Err(refused), Touched::NOTHING),
            }
        })
    }

    // ----- the journal (a durable projection) ---------------------------

    /// What the store must write next, with the value of each write that
    /// puts one (cloned, in the order of `ready.writes`). See
    /// [`Latest::poll_ready`]; `None` without a journal.
    ///
    /// A value whose `Clone` panics fails the epoch (the journal does not
    /// wait for a report that never comes), then the panic goes on.
    pub fn poll_ready(&self) -> Option<(LatestReady<K>, Vec<Option<V>>)> {
        let (ready, panic) = self.shared.inner.apply(By::Caller, |s| {
            let Some(ready) = s.latest.poll_ready() else { return ((None, None), Touched::NOTHING) };
            let copied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let value = |w: &LatestWrite<K>| match w {
                    LatestWrite::Put { key, newest: Some(_), .. } => s.latest.newest(key).map(|(_, v)| v.clone()),
                    _ => None,
                };
                ready.writes.iter().map(value).collect::<Vec<_>>()
            }));
            match copied {
                Ok(values) => ((Some((ready, values)), None), Touched::NOTHING),
                Err(panic) => {
                    let _ = s.latest.persist_failed(ready.epoch, "a value's Clone panicked");
                    ((None, Some(panic)), Touched { keys: Vec::new(), whole: true })
                }
            }
        });
        if let Some(panic) = panic {
            std::panic::resume_unwind(panic);
        }
        ready
    }

    /// The store wrote `epoch`. See [`Latest::persisted`]; wakes the sink
    /// effects when desires became claimable.
    pub fn persisted(&self, epoch: Epoch) -> LatestPersisted<K> {
        self.shared.inner.apply(By::Caller, |s| {
            let outcome = s.latest.persisted(epoch);
            let whole = matches!(outcome, LatestPersisted::Recorded { .. });
            (outcome, Touched { keys: Vec::new(), whole })
        })
    }

    /// The store could not write `epoch`. See [`Latest::persist_failed`].
    pub fn persist_failed(&self, epoch: Epoch, reason: impl Into<String>) -> LatestPersisted<K> {
        let reason = reason.into();
        tracing::warn!(epoch = ?epoch, %reason, "egress latest: the store could not write");
        self.shared.inner.apply(By::Caller, |s| {
            let outcome = s.latest.persist_failed(epoch, reason);
            let whole = matches!(outcome, LatestPersisted::Recorded { .. });
            (outcome, Touched { keys: Vec::new(), whole })
        })
    }

    /// The last failure to write the projection, until a later write
    /// succeeds (`None` without a journal).
    pub fn persist_error(&self) -> &Computed<Option<PersistError>, F> {
        &self.shared.persist_error
    }

    /// Keys whose rows are not yet written as they are (0 without a
    /// journal).
    pub fn unpersisted_len(&self) -> &Computed<usize, F> {
        &self.shared.unpersisted_len
    }

    /// Makes the running effect or computed depend on every transition of
    /// a durable projection (none without a journal): a store's relay
    /// reads this in an effect to learn that the journal may have
    /// something to write.
    pub fn track_journal(&self) {
        let inner = &self.shared.inner;
        inner.handle.enter(|cell| Handle::track(cell, inner.journal));
    }

    // ----- aggregate readers ------------------------------------------

    /// How many keys exist.
    pub fn len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[LEN]
    }

    /// How many keys have a desire not yet claimed.
    pub fn desired_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[DESIRED_LEN]
    }

    /// How many keys have a value in flight.
    pub fn inflight_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[INFLIGHT_LEN]
    }

    /// How many keys wait after a failure.
    pub fn waiting_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[WAITING_LEN]
    }

    /// How many keys can be claimed now.
    pub fn claimable_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[CLAIMABLE_LEN]
    }

    /// Whether the sink holds the newest value of every key: no desire,
    /// no flight.
    pub fn is_settled(&self) -> &Computed<bool, F> {
        &self.shared.inner.settled
    }

    /// The generation reports must carry.
    pub fn generation(&self) -> &Computed<Generation, F> {
        &self.shared.inner.generation
    }

    // ----- untracked ----------------------------------------------------

    /// When the earliest key waiting after a failure may be claimed
    /// (untracked): call [`handle_timeout`](Self::handle_timeout) then.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.with_latest(Latest::poll_timeout)
    }

    /// Reads the projection directly, untracked. `f` must not call into
    /// the cell.
    pub fn with_latest<R>(&self, f: impl FnOnce(&Latest<K, V>) -> R) -> R {
        self.shared.inner.with_latest(f)
    }

    /// The cell's clock, read now.
    pub fn now(&self) -> Time {
        self.shared.inner.clock.now()
    }

    /// Disposes every node the cell created: its readers, triggers and
    /// sink effects. The keys stay: mutators still apply transitions, and
    /// notify nothing. Dropping the last clone does the same. Idempotent.
    pub fn dispose(&self) {
        self.shared.scope.dispose();
    }

    /// Whether the cell was disposed (or its owner, or its context).
    pub fn is_disposed(&self) -> bool {
        self.shared.scope.is_disposed()
    }
}
