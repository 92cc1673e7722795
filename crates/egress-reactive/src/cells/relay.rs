//! [`RelayCellOf`]: an [`egress_core::Relay`] projected into a graph, and
//! its drain into an egress cell ([`RelayCellOf::drain_into`]); with a
//! [`SpillStore`], its pages written out and replayed.

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::panic::{AssertUnwindSafe, Location, catch_unwind, resume_unwind};

use egress_core::{
    Backpressure, Drained, MergePolicy, Relay, RelayConfigError, RelayStats, SendRefused, Sent, Sequence,
};

use super::cell::{CellFlavor, EgressCellOf};
use super::inner::unacknowledged;
use super::options::Refused;
use super::spill::{SpillError, SpillStore, SpilledEntry};
use crate::computed::Computed;
use crate::context::{Handle, NodeRef, Scope};
use crate::effect::{EffectObj, RunEffect};
use crate::flavor::{Entered, Flavor, Holds, ValueCell};
use crate::run;

/// How many counts a relay cell keeps, and their order.
const COUNTS: usize = 12;
const DEPTH: usize = 0;
const OPS: usize = 1;
const BYTES: usize = 2;
const ACCEPTED: usize = 3;
const CONFLATED: usize = 4;
const DROPPED: usize = 5;
const BLOCKED: usize = 6;
const DRAINED: usize = 7;
const REJECTED: usize = 8;
const SPILLED: usize = 9;
const COLD: usize = 10;
const SPILL_ERRORS: usize = 11;

/// How many spilled entries a drain reads at a time.
const READ_AHEAD: usize = 64;

/// How many acknowledged spilled entries a reclaim waits for (one
/// transaction deletes them), unless they are the last handed.
const RECLAIM_BATCH: usize = 256;

/// The relay, and the entries its drains' cells refused for good: touched
/// only with the graph entered.
struct RelayState<T: 'static, M, F: Flavor> {
    relay: Relay<T, M>,
    rejected: u64,
    spill: Option<Spill<T, F>>,
}

/// A relay cell's spill store, and where its replay is.
struct Spill<T: 'static, F: Flavor> {
    store: Box<dyn SpillStore<T> + Send>,
    /// Entries read from the store, not yet in the stream (at most
    /// [`READ_AHEAD`]).
    ahead: VecDeque<SpilledEntry<T>>,
    /// The newest id read (into `ahead`, or on into the stream).
    cursor: Option<u64>,
    /// Entries in the stream, oldest first, with the sequence each got
    /// (`None`: refused for good, done): reclaimed once acknowledged.
    handed: VecDeque<(u64, Option<Sequence>)>,
    /// The cell the spilled entries go into: the first drain's. Only its
    /// drains replay them (its acknowledgements reclaim them).
    target: Option<EgressCellOf<T, F>>,
    /// The store's errors so far.
    errors: u64,
}

impl<T: 'static, F: Flavor> Spill<T, F> {
    fn failed(&mut self, what: &'static str, error: &SpillError) {
        self.errors = self.errors.saturating_add(1);
        tracing::warn!(%error, what, "egress relay: the spill store failed");
    }
}

impl<T, M: MergePolicy<T>, F: Flavor> RelayState<T, M, F> {
    /// Every count, in reader order, and whether the relay is full: read
    /// once per transition.
    fn counts(&self) -> ([u64; COUNTS], bool) {
        let s: RelayStats = self.relay.stats();
        let errors = self.spill.as_ref().map_or(0, |spill| spill.errors);
        let counts = [
            s.depth,
            s.ops,
            s.bytes,
            s.accepted,
            s.conflated,
            s.dropped,
            s.blocked,
            s.drained,
            self.rejected,
            s.spilled,
            s.cold,
            errors,
        ];
        (counts, s.full)
    }

    /// [`Relay::send`], and for [`MustSpill`](SendRefused::MustSpill) with
    /// a store: the page written, then the op sent again.
    fn send(&mut self, op: T) -> Result<Sent, SendRefused<T>> {
        match self.relay.send(op) {
            Err(SendRefused::MustSpill(op)) => {
                let Some(spill) = &mut self.spill else { return Err(SendRefused::MustSpill(op)) };
                if let Err(reason) = Self::write_out(&mut self.relay, spill) {
                    return Err(SendRefused::SpillFailed { op, reason });
                }
                self.relay.send(op)
            }
            sent => sent,
        }
    }

    /// Takes the relay's entries out as a page and appends it to the
    /// store; a page the store refuses (or panics on) goes back. The ops
    /// written.
    fn write_out(relay: &mut Relay<T, M>, spill: &mut Spill<T, F>) -> Result<u64, String> {
        let Some(page) = relay.spill() else { return Ok(0) };
        match catch_unwind(AssertUnwindSafe(|| spill.store.append(&page))) {
            Ok(Ok(())) => Ok(page.ops()),
            Ok(Err(error)) => {
                spill.failed("append", &error);
                relay.unspill(page);
                Err(error.to_string())
            }
            Err(panic) => {
                spill.errors = spill.errors.saturating_add(1);
                relay.unspill(page);
                resume_unwind(panic)
            }
        }
    }
}

/// What a drain took: an entry of the relay's, or a spilled one.
enum Taken {
    Hot(Drained<()>),
    Cold { id: u64, ops: u64 },
}

impl<T: Clone + 'static, M: MergePolicy<T>, F: CellFlavor<T>> RelayState<T, M, F> {
    /// The next value for `cell`: a spilled entry while any op is cold
    /// (only for the spill's cell: none for another), else the oldest
    /// entry.
    fn take(&mut self, cell: &EgressCellOf<T, F>) -> Option<(T, Taken)> {
        // The relay's own entry, unless ops are cold: then only one put
        // back meanwhile, which is older than them.
        let hot = |relay: &mut Relay<T, M>| {
            relay.pop().map(|d| {
                let (value, entry) = d.split();
                (value, Taken::Hot(entry))
            })
        };
        if let Some(taken) = hot(&mut self.relay) {
            return Some(taken);
        }
        let cold = self.relay.cold();
        let spill = self.spill.as_mut().filter(|_| cold != 0)?;
        let target = spill.target.get_or_insert_with(|| cell.clone());
        if !target.same_cell(cell) {
            return None;
        }
        if spill.ahead.is_empty() {
            match catch_unwind(AssertUnwindSafe(|| spill.store.read(spill.cursor, READ_AHEAD))) {
                Ok(Ok(read)) => spill.ahead.extend(read),
                Ok(Err(error)) => {
                    spill.failed("read", &error);
                    return None;
                }
                Err(_) => {
                    spill.errors = spill.errors.saturating_add(1);
                    tracing::error!("egress relay: the spill store panicked reading");
                    return None;
                }
            }
        }
        let Some(entry) = spill.ahead.pop_front() else {
            // The store holds fewer ops than the relay counts cold
            // (deleted under it): nothing more to replay; the lost ops
            // count as dropped.
            tracing::warn!(cold, "egress relay: the spill store ran out before the ops counted cold");
            spill.errors = spill.errors.saturating_add(1);
            self.relay.lost(cold);
            return hot(&mut self.relay);
        };
        if entry.ops > cold {
            // The entry holds more ops than the relay counts cold (a row
            // edited under it): the store is the truth; count what it
            // holds from here, so the rest of it still goes first.
            let after = spill.store.stored_ops(Some(entry.id));
            match after {
                Ok(rest) => {
                    tracing::warn!(
                        id = entry.id,
                        ops = entry.ops,
                        cold,
                        "egress relay: a spilled entry holds more ops than counted cold"
                    );
                    spill.errors = spill.errors.saturating_add(1);
                    self.relay.restore_cold(entry.ops.saturating_add(rest).saturating_sub(cold));
                }
                Err(error) => {
                    spill.failed("count", &error);
                    spill.ahead.push_front(entry);
                    return None;
                }
            }
        }
        spill.cursor = Some(entry.id);
        Some((entry.value, Taken::Cold { id: entry.id, ops: entry.ops }))
    }

    /// Puts back what [`take`](Self::take) took, in front.
    fn untake(&mut self, value: T, taken: Taken) {
        match taken {
            Taken::Hot(entry) => self.relay.unpop(entry.with_value(value)),
            Taken::Cold { id, ops } => {
                if let Some(spill) = &mut self.spill {
                    spill.ahead.push_front(SpilledEntry { id, value, ops });
                }
            }
        }
    }

    /// What became of what [`take`](Self::take) took: in the stream at
    /// `seq`, or refused for good (`None`).
    fn handed(&mut self, taken: &Taken, seq: Option<Sequence>) {
        if let Taken::Cold { id, ops } = *taken {
            self.relay.replayed(ops);
            if let Some(spill) = &mut self.spill {
                spill.handed.push_back((id, seq));
            }
        }
    }

    /// Deletes from the store the spilled entries `cell` (the spill's
    /// cell) acknowledged, or that were refused for good: in batches of
    /// [`RECLAIM_BATCH`], or all once none is cold and every one handed is
    /// done.
    fn reclaim(&mut self, cell: &EgressCellOf<T, F>) {
        let Some(spill) = &mut self.spill else { return };
        if !spill.target.as_ref().is_some_and(|target| target.same_cell(cell)) {
            return;
        }
        let acked = cell.with_core(egress_core::EgressCore::acked_through);
        let count =
            spill.handed.iter().take_while(|(_, seq)| seq.is_none_or(|seq| acked.is_some_and(|a| seq <= a))).count();
        let Some(&(through, _)) = count.checked_sub(1).and_then(|last| spill.handed.get(last)) else { return };
        // In batches while the replay goes on; every one once it is over.
        let over = count == spill.handed.len() && self.relay.cold() == 0;
        if count < RECLAIM_BATCH && !over {
            return;
        }
        match catch_unwind(AssertUnwindSafe(|| spill.store.reclaim_through(through))) {
            Ok(Ok(())) => {
                spill.handed.drain(..count);
            }
            Ok(Err(error)) => spill.failed("reclaim", &error),
            Err(_) => {
                spill.errors = spill.errors.saturating_add(1);
                tracing::error!("egress relay: the spill store panicked reclaiming");
            }
        }
    }
}

/// What the clones of a relay cell, and its drains, share.
struct Inner<T: 'static, M: 'static, F: Flavor> {
    handle: Handle<F>,
    state: F::Ptr<F::Cell<RelayState<T, M, F>>>,
    counts: [Computed<u64, F>; COUNTS],
    full: Computed<bool, F>,
}

impl<T: 'static, M: 'static, F: Flavor> Clone for Inner<T, M, F> {
    fn clone(&self) -> Self {
        Inner {
            handle: self.handle.clone(),
            state: self.state.clone(),
            counts: self.counts.clone(),
            full: self.full.clone(),
        }
    }
}

impl<T: 'static, M: MergePolicy<T> + 'static, F: Flavor> Inner<T, M, F> {
    /// Applies `op` to the state with the graph entered, then pushes every
    /// count and notifies those whose value changed, as one write. A panic
    /// in `op` (the merge policy's, the weigher's) goes on once the counts
    /// are pushed. `op` must not call into the cell.
    fn apply<R>(&self, op: impl FnOnce(&mut RelayState<T, M, F>) -> R) -> R {
        self.handle.enter(|cell| {
            let entered = Entered::by(cell);
            let (outcome, keys, changed) = self.state.with_mut(&entered, |s| {
                let outcome = catch_unwind(AssertUnwindSafe(|| op(s)));
                // On the stack: a send moves a counter every time, and a
                // list on the heap cost an allocation each.
                let mut keys = [crate::graph::Key { index: 0, generation: 0 }; COUNTS + 1];
                let mut changed = 0;
                let (counts, full) = s.counts();
                for (reader, count) in self.counts.iter().zip(counts) {
                    if reader.push(&entered, count) {
                        keys[changed] = reader.key;
                        changed += 1;
                    }
                }
                if self.full.push(&entered, full) {
                    keys[changed] = self.full.key;
                    changed += 1;
                }
                (outcome, keys, changed)
            });
            if changed != 0
                && let Err(e) = run::notify(cell, &keys[..changed])
            {
                panic!("{e}");
            }
            outcome.unwrap_or_else(|panic| resume_unwind(panic))
        })
    }

    fn with<R>(&self, f: impl FnOnce(&RelayState<T, M, F>) -> R) -> R {
        self.handle.enter(|cell| self.state.with(&Entered::by(cell), f))
    }
}

/// What the clones of a relay cell share.
struct Shared<T: 'static, M: 'static, F: Flavor> {
    inner: Inner<T, M, F>,
    /// Owns every node of the cell.
    scope: Scope<F>,
}

/// A relay ahead of an egress cell's enqueue, as signals: an
/// [`egress_core::Relay`] (a bounded window of ops, folded under a
/// [`MergePolicy`] under pressure, with a [`Backpressure`] policy; see
/// its rules) projected into a graph. For a producer that can be faster
/// than its transport: a slider, a sensor, a counter, a log.
///
/// - **Readers**, kept eagerly (each notifies only when its value
///   changes): [`depth`](Self::depth), [`ops`](Self::ops),
///   [`bytes`](Self::bytes), [`is_full`](Self::is_full), and the
///   counters [`accepted`](Self::accepted), [`conflated`](Self::conflated),
///   [`dropped`](Self::dropped), [`blocked`](Self::blocked),
///   [`drained`](Self::drained), [`rejected`](Self::rejected).
/// - **Mutators**: [`send`](Self::send) (the producer's), and
///   [`pop`](Self::pop)/[`unpop`](Self::unpop) for a drain by hand.
/// - **Drain** ([`drain_into`](Self::drain_into)): one effect that moves
///   the relay's entries, oldest first, into an egress cell while that
///   cell has fewer than a bound of records waiting to be claimed (and
///   room under its capacity): the relay folds only while the transport
///   is behind. Sequence assignment, acknowledgements and the fence stay
///   in the cell.
///
/// The merge policy and the weigher run inside the cell's transitions:
/// they must not call into the relay cell (a read there panics as a
/// re-entrant borrow).
///
/// Use it as [`RelayCell`] on a [`Context`](crate::Context) or
/// [`ThreadSafeRelayCell`] on a [`ThreadSafeContext`](crate::ThreadSafeContext)
/// or an [`AsyncContext`](crate::AsyncContext)'s handle (which also has
/// [`send_when_room`](Self::send_when_room)).
///
/// ```
/// use egress_core::{Backpressure, Overflow, Policy, Sum, Water};
/// use egress_reactive::{Context, EgressCell, RelayCell};
///
/// let cx = Context::new();
/// let cell = EgressCell::new(&cx, Policy::default());
/// // Counter increments: under pressure, folded into the newest entry.
/// let relay = RelayCell::new(&cx, Sum, Backpressure::count(Water::new(2, 0), Overflow::Conflate))?;
/// // At most one record waits in the cell to be claimed (no transport
/// // here claims it, so the rest wait in the relay).
/// let drain = relay.drain_into(&cell, 1.try_into()?)?;
/// for delta in [1u64, 2, 3, 4] {
///     relay.send(delta).expect("a conflating relay takes every op");
/// }
/// assert_eq!(cell.pending_len().get(), 1); // 1 went to the cell
/// assert_eq!(relay.depth().get(), 2); // 2, then 3 and 4 folded: 7
/// assert_eq!(relay.conflated().get(), 1);
/// # drop(drain);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RelayCellOf<T: 'static, M: 'static, F: Flavor> {
    shared: F::Ptr<Shared<T, M, F>>,
}

/// A relay cell on a [`Context`](crate::Context) (one thread).
pub type RelayCell<T, M> = RelayCellOf<T, M, crate::flavor::Local>;

/// A relay cell on a [`ThreadSafeContext`](crate::ThreadSafeContext) or an
/// [`AsyncContext`](crate::AsyncContext): `Send + Sync` for `Send` ops and
/// policies.
pub type ThreadSafeRelayCell<T, M> = RelayCellOf<T, M, crate::flavor::Threaded>;

impl<T: 'static, M: 'static, F: Flavor> Clone for RelayCellOf<T, M, F> {
    fn clone(&self) -> Self {
        RelayCellOf { shared: self.shared.clone() }
    }
}

impl<T: 'static, M: MergePolicy<T> + 'static, F: Flavor> std::fmt::Debug for RelayCellOf<T, M, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RelayCell").field(&self.stats()).finish()
    }
}

impl<T: 'static, M: MergePolicy<T> + 'static, F: Flavor> RelayCellOf<T, M, F> {
    /// An empty relay cell folding under `policy`, bounded by
    /// `backpressure` in entries (see [`Relay::new`]), owned by the
    /// current owner of `cx` (disposed with it, or when its last clone
    /// drops).
    ///
    /// # Errors
    /// [`RelayConfigError`], as [`Relay::new`].
    #[track_caller]
    pub fn new(cx: &Handle<F>, policy: M, backpressure: Backpressure) -> Result<Self, RelayConfigError> {
        Ok(Self::build(cx, Relay::new(policy, backpressure)?, Location::caller()))
    }

    /// An empty relay cell weighing each entry with `weigh` (see
    /// [`Relay::weighed`]): for a bound in bytes.
    ///
    /// # Errors
    /// [`RelayConfigError`], as [`Relay::weighed`].
    #[track_caller]
    pub fn weighed(
        cx: &Handle<F>,
        policy: M,
        backpressure: Backpressure,
        weigh: fn(&T) -> u64,
    ) -> Result<Self, RelayConfigError> {
        Ok(Self::build(cx, Relay::weighed(policy, backpressure, weigh)?, Location::caller()))
    }

    /// A relay cell over `relay` as it is.
    #[track_caller]
    pub fn from_relay(cx: &Handle<F>, relay: Relay<T, M>) -> Self {
        Self::build(cx, relay, Location::caller())
    }

    /// A relay cell over `relay` that writes its pages to `store`
    /// ([`Overflow::Spill`](egress_core::Overflow::Spill)): what `store`
    /// already holds (a restart's pages) counts as cold, and its drain
    /// replays it first.
    ///
    /// - **Spilling.** A [`send`](Self::send) to the full relay takes its
    ///   entries out as a page, appends it to the store, then takes the
    ///   op: when it returns, every op taken before it is durable (or in
    ///   the stream). A page the store refuses goes back, and the op comes
    ///   back ([`SendRefused::SpillFailed`]).
    /// - **Replay.** While any op is cold, the drain moves spilled
    ///   entries, oldest first, into its cell before any of the relay's;
    ///   only into the cell of the first drain that replays (a drain into
    ///   another cell moves nothing meanwhile).
    /// - **Reclaim.** A spilled entry is deleted from the store once its
    ///   cell acknowledged its sequence (or refused it for good): a
    ///   process killed in between replays it again (at least once; a
    ///   policy that is idempotent makes it harmless).
    /// - **The relay's own entries are in memory**: a process killed loses
    ///   them. [`spill_now`](Self::spill_now) writes them out (before a
    ///   stop).
    /// - **Store errors** are counted in [`spill_errors`](Self::spill_errors)
    ///   and logged; a drain that could not read stops until its next run,
    ///   and a reclaim is tried again at the next.
    ///
    /// # Errors
    /// The store could not say what it holds.
    #[track_caller]
    pub fn spilling(
        cx: &Handle<F>,
        mut relay: Relay<T, M>,
        mut store: impl SpillStore<T> + Send + 'static,
    ) -> Result<Self, SpillError> {
        relay.restore_cold(store.stored_ops(None)?);
        let spill = Spill {
            store: Box::new(store),
            ahead: VecDeque::new(),
            cursor: None,
            handed: VecDeque::new(),
            target: None,
            errors: 0,
        };
        Ok(Self::build_with(cx, relay, Some(spill), Location::caller()))
    }

    fn build(cx: &Handle<F>, relay: Relay<T, M>, at: &'static Location<'static>) -> Self {
        Self::build_with(cx, relay, None, at)
    }

    fn build_with(
        cx: &Handle<F>,
        relay: Relay<T, M>,
        spill: Option<Spill<T, F>>,
        at: &'static Location<'static>,
    ) -> Self {
        let state = RelayState { relay, rejected: 0, spill };
        let (scope, (counts, full)) = cx.scope(|| {
            let (counts, full) = state.counts();
            (counts.map(|count| cx.pushed(count, at)), cx.pushed(full, at))
        });
        let inner = Inner { handle: cx.clone(), state: F::ptr(ValueCell::new(state)), counts, full };
        RelayCellOf { shared: F::ptr(Shared { inner, scope }) }
    }

    // ----- mutators --------------------------------------------------

    /// Takes `op`: as a new entry if it fits, else as the overflow action
    /// says (see [`Relay::send`]). Wakes the drains.
    ///
    /// # Errors
    /// [`SendRefused`], with the op: blocked (the relay is full and its
    /// action is [`Block`](egress_core::Overflow::Block)), or heavier than
    /// the high water mark in bytes.
    ///
    /// With a spill store ([`spilling`](Self::spilling)), a full relay
    /// writes its entries out first; [`SendRefused::SpillFailed`] if the
    /// store refused them (they stay, as they were). Without one, a full
    /// relay whose action is `Spill` refuses with
    /// [`SendRefused::MustSpill`].
    pub fn send(&self, op: T) -> Result<Sent, SendRefused<T>> {
        self.shared.inner.apply(|s| s.send(op))
    }

    /// Writes the relay's entries out to its spill store now (before a
    /// process stops: they survive it, and a restart replays them): the
    /// ops written (0: nothing held, or no store).
    ///
    /// # Errors
    /// The store refused them (they stay, as they were, and the relay is
    /// full).
    pub fn spill_now(&self) -> Result<u64, String> {
        self.shared.inner.apply(|s| match &mut s.spill {
            Some(spill) => RelayState::write_out(&mut s.relay, spill),
            None => Ok(0),
        })
    }

    /// Takes the oldest entry, for a drain by hand (see [`Relay::pop`]).
    pub fn pop(&self) -> Option<Drained<T>> {
        self.shared.inner.apply(|s| s.relay.pop())
    }

    /// Puts back an entry [`pop`](Self::pop) took (see [`Relay::unpop`]).
    pub fn unpop(&self, drained: Drained<T>) {
        self.shared.inner.apply(|s| s.relay.unpop(drained));
    }

    /// A transition of the relay by hand (a spill or a replay by hand, a
    /// fixture's op): `f` runs on the relay with the graph entered, then
    /// every reader is pushed, notifying those whose value changed. `f`
    /// must not call into the cell; a panic in it goes on once the readers
    /// are pushed. With a spill store ([`spilling`](Self::spilling)), the
    /// replay is the drain's: a spill or replay by hand here is not the
    /// store's.
    pub fn with_relay_mut<R>(&self, f: impl FnOnce(&mut Relay<T, M>) -> R) -> R {
        self.shared.inner.apply(|s| f(&mut s.relay))
    }

    // ----- readers -----------------------------------------------------

    /// Entries held.
    pub fn depth(&self) -> &Computed<u64, F> {
        &self.shared.inner.counts[DEPTH]
    }

    /// Ops the entries hold.
    pub fn ops(&self) -> &Computed<u64, F> {
        &self.shared.inner.counts[OPS]
    }

    /// The entries' weight (0 without a bound in bytes).
    pub fn bytes(&self) -> &Computed<u64, F> {
        &self.shared.inner.counts[BYTES]
    }

    /// Whether the relay is full: from the moment it reaches a high water
    /// mark (or an op does not fit) until a drain takes it down to every
    /// low water mark. What a producer that must not lose ops watches.
    pub fn is_full(&self) -> &Computed<bool, F> {
        &self.shared.inner.full
    }

    /// Ops taken, as an entry or folded into one.
    pub fn accepted(&self) -> &Computed<u64, F> {
        &self.shared.inner.counts[ACCEPTED]
    }

    /// Ops folded into an entry.
    pub fn conflated(&self) -> &Computed<u64, F> {
        &self.shared.inner.counts[CONFLATED]
    }

    /// Ops dropped by the overflow action.
    pub fn dropped(&self) -> &Computed<u64, F> {
        &self.shared.inner.counts[DROPPED]
    }

    /// Ops refused as blocked.
    pub fn blocked(&self) -> &Computed<u64, F> {
        &self.shared.inner.counts[BLOCKED]
    }

    /// Ops the drains took.
    pub fn drained(&self) -> &Computed<u64, F> {
        &self.shared.inner.counts[DRAINED]
    }

    /// Entries a drain took that its cell refused for good (too large for
    /// its transport, or not encodable by its store; each logged with
    /// why): counted among [`drained`](Self::drained) too.
    pub fn rejected(&self) -> &Computed<u64, F> {
        &self.shared.inner.counts[REJECTED]
    }

    /// Ops written out to the spill store.
    pub fn spilled(&self) -> &Computed<u64, F> {
        &self.shared.inner.counts[SPILLED]
    }

    /// Ops in the spill store not yet replayed into the stream (a
    /// restart's too): they go before the relay's entries.
    pub fn cold(&self) -> &Computed<u64, F> {
        &self.shared.inner.counts[COLD]
    }

    /// The spill store's errors (each logged): appends refused, reads and
    /// reclaims that failed.
    pub fn spill_errors(&self) -> &Computed<u64, F> {
        &self.shared.inner.counts[SPILL_ERRORS]
    }

    // ----- untracked ----------------------------------------------------

    /// What the relay holds and has done, now (untracked).
    pub fn stats(&self) -> RelayStats {
        self.shared.inner.with(|s| s.relay.stats())
    }

    /// Reads the relay directly, untracked. `f` must not call into the
    /// cell.
    pub fn with_relay<R>(&self, f: impl FnOnce(&Relay<T, M>) -> R) -> R {
        self.shared.inner.with(|s| f(&s.relay))
    }

    /// Disposes every node the cell created: its readers and drains. The
    /// relay stays: mutators still apply, and notify nothing. Dropping the
    /// last clone does the same. Idempotent.
    pub fn dispose(&self) {
        self.shared.scope.dispose();
    }

    /// Whether the cell was disposed (or its owner, or its context).
    pub fn is_disposed(&self) -> bool {
        self.shared.scope.is_disposed()
    }
}

/// Why [`RelayCellOf::drain_into`] made no drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DrainRefused {
    /// The egress cell is on another graph than the relay: one effect
    /// cannot track both.
    #[error("the egress cell is on another graph than the relay")]
    OtherGraph,
    /// The relay cell or the egress cell was disposed.
    #[error("the relay cell or the egress cell was disposed")]
    Disposed,
}

/// The run of a drain: move entries while the cell takes them.
#[doc(hidden)]
pub struct DrainRun<T: 'static, M: 'static, F: Flavor> {
    relay: Inner<T, M, F>,
    cell: EgressCellOf<T, F>,
    max_pending: usize,
}

impl<T: Clone + 'static, M: MergePolicy<T> + 'static, F: CellFlavor<T>> RunEffect for DrainRun<T, M, F> {
    fn run_effect(&mut self, _: &Entered) {
        // What makes room or work: a new entry, a claim, an ack (under a
        // capacity). Read tracked; a read of a disposed node ends the run.
        let tracked = self.relay.counts[DEPTH].try_get().and_then(|_| self.cell.pending_len().try_get());
        let capacity = self.cell.capacity();
        if tracked.is_err() || (capacity.is_some() && self.cell.acked_through().try_get().is_err()) {
            return;
        }
        let spilling = self.relay.with(|s| s.spill.is_some());
        if spilling {
            // Acknowledgements reclaim spilled entries; new cold ops (a
            // page written) wake the replay.
            if self.cell.acked_through().try_get().is_err() || self.relay.counts[COLD].try_get().is_err() {
                return;
            }
            let cell = &self.cell;
            self.relay.apply(|s| s.reclaim(cell));
        }
        loop {
            // A check (user code) may dispose the cell mid-run: nothing
            // goes into a disposed cell.
            if self.cell.is_disposed() {
                return;
            }
            let (pending, held) = self.cell.with_core(|c| (c.pending_len(), unacknowledged(c)));
            if pending >= self.max_pending || capacity.is_some_and(|capacity| held >= capacity) {
                return;
            }
            let cell = &self.cell;
            let Some((value, taken)) = self.relay.apply(|s| s.take(cell)) else { return };
            let ops = match &taken {
                Taken::Hot(entry) => entry.ops,
                Taken::Cold { ops, .. } => *ops,
            };
            match catch_unwind(AssertUnwindSafe(|| cell.try_enqueue(value))) {
                Ok(Ok(seq)) => self.relay.apply(|s| s.handed(&taken, Some(seq))),
                Ok(Err(Refused::Full { payload, .. })) => {
                    // Filled by another producer since the check: back in
                    // front, as it was.
                    self.relay.apply(|s| s.untake(payload, taken));
                    return;
                }
                Ok(Err(refused)) => {
                    tracing::warn!(error = %refused, ops, "egress relay: the cell refused an entry for good");
                    self.relay.apply(|s| {
                        s.rejected = s.rejected.saturating_add(1);
                        s.handed(&taken, None);
                    });
                }
                Err(panic) => {
                    // A check of the cell's (user code) panicked: the entry
                    // is gone with it; counted and logged, and the drain goes
                    // on. (Not resumed: an effect whose first run panics is
                    // disposed, and the drain's first run is `drain_into`'s.)
                    let message = egress_core::panic_message(&*panic).unwrap_or("(not a string)");
                    tracing::error!(%message, ops, "egress relay: the cell's check panicked; the entry is lost");
                    self.relay.apply(|s| {
                        s.rejected = s.rejected.saturating_add(1);
                        s.handed(&taken, None);
                    });
                }
            }
        }
    }
}

impl<T: Clone + 'static, M: MergePolicy<T> + 'static, F: CellFlavor<T>> RelayCellOf<T, M, F> {
    /// Drains the relay into `cell`: creates one effect (owned by the
    /// relay cell) that, now and whenever the relay takes an op or the
    /// cell's transport claims (or, for a cell with a capacity, an
    /// acknowledgement frees room), moves the relay's entries, oldest
    /// first, into the cell with [`try_enqueue`](EgressCellOf::try_enqueue)
    /// while the cell holds fewer than `max_pending` records waiting to be
    /// claimed and fewer than its capacity unacknowledged. The rest waits
    /// (and folds, under pressure) in the relay.
    ///
    /// An entry the cell refuses as full (another producer filled it since
    /// the check) goes back in front, as it was; one it refuses for good
    /// (too large for its transport, not encodable by its store) is
    /// counted in [`rejected`](Self::rejected) and logged. A panic in the
    /// cell's checks (user code) loses the entry, counted in `rejected`
    /// and logged with its message, and the drain goes on (the panic does
    /// not reach the writer). The drain moves nothing once either cell is
    /// disposed (even by a check, in the middle of a run); dropping the
    /// [`RelayDrain`] stops it too.
    ///
    /// A transport that claims synchronously, in the same flush, takes two
    /// flush rounds per `max_pending` entries (the drain's run, then the
    /// transport's): a relay deeper than half
    /// [`MAX_FLUSH_ROUNDS`](crate::MAX_FLUSH_ROUNDS) times `max_pending`,
    /// drained into one in a single flush, stops the flush as a loop.
    ///
    /// # Errors
    /// [`DrainRefused`]: the cell is on another graph, or either cell was
    /// disposed.
    #[track_caller]
    pub fn drain_into(
        &self,
        cell: &EgressCellOf<T, F>,
        max_pending: NonZeroUsize,
    ) -> Result<RelayDrain<F>, DrainRefused>
    where
        F: Holds<EffectObj<DrainRun<T, M, F>, F>>,
    {
        let at = Location::caller();
        let handle = &self.shared.inner.handle;
        let same =
            cell.in_scope(|theirs| std::ptr::eq(&*theirs.rt, &*handle.rt)).map_err(|_| DrainRefused::Disposed)?;
        if !same {
            return Err(DrainRefused::OtherGraph);
        }
        let run = DrainRun { relay: self.shared.inner.clone(), cell: cell.clone(), max_pending: max_pending.get() };
        let effect = self.shared.scope.try_run(|| handle.make_effect(run, at)).map_err(|_| DrainRefused::Disposed)?;
        Ok(RelayDrain { node: (*effect).clone() })
    }
}

/// A relay's drain into an egress cell: one effect (see
/// [`RelayCellOf::drain_into`]). Dropping it stops the drain.
#[must_use = "dropping a RelayDrain stops the drain"]
pub struct RelayDrain<F: Flavor> {
    node: NodeRef<F>,
}

impl<F: Flavor> RelayDrain<F> {
    /// How many times the drain has run (0 once stopped).
    pub fn runs(&self) -> u32 {
        self.node.runs()
    }

    /// Whether the drain's effect is gone: its relay cell (or the graph)
    /// was disposed. (A drain whose egress cell was disposed stays, idle:
    /// it moves nothing.)
    pub fn is_stopped(&self) -> bool {
        self.node.is_disposed()
    }

    /// Stops the drain (as dropping does).
    pub fn stop(self) {}
}

impl<F: Flavor> Drop for RelayDrain<F> {
    fn drop(&mut self) {
        self.node.dispose();
    }
}

impl<F: Flavor> std::fmt::Debug for RelayDrain<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayDrain").field("stopped", &self.is_stopped()).finish()
    }
}

#[cfg(feature = "async")]
impl<T: Send + 'static, M: MergePolicy<T> + Send + 'static> RelayCellOf<T, M, crate::flavor::Threaded> {
    /// Sends `op` once the relay is not full: at once if it is not, else
    /// after a drain took it down to its low water marks (the hysteresis
    /// rule). For a producer that must not lose ops, with
    /// [`Overflow::Block`](egress_core::Overflow::Block) (with another
    /// action, a full relay takes the op as that action says, and this
    /// does not wait). Cancel-safe: dropped while waiting, nothing was
    /// sent, and the op is dropped with the future.
    ///
    /// # Errors
    /// [`SendRefused::TooLarge`], at once, for an op that never fits; and
    /// [`SendRefused::Blocked`] once the relay cell is disposed (nothing
    /// will drain it).
    pub async fn send_when_room(&self, op: T) -> Result<Sent, SendRefused<T>> {
        use tokio_stream::StreamExt as _;
        let mut op = op;
        let handle = &self.shared.inner.handle;
        // Owned by the cell: its disposal ends the stream.
        let Ok(mut full) = self.shared.scope.try_run(|| handle.watch(self.is_full())) else {
            return self.send(op);
        };
        // Watching before trying: a drain between a try and the wait is a
        // change the watch still yields.
        let _ = full.next().await; // the value now
        loop {
            match self.send(op) {
                Err(SendRefused::Blocked(back)) => op = back,
                sent => return sent,
            }
            if full.next().await.is_none() {
                return self.send(op);
            }
        }
    }
}
