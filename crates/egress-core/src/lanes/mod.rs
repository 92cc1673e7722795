//! [`Lanes`]: several ordering domains, one [`EgressCore`] per lane key,
//! released in enqueue order across lanes. The state, its indexes and the
//! send path live here; the other transitions in `transitions.rs`.

mod durable;
mod kind;
mod outcome;
mod ready;
mod transitions;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub use self::durable::{LaneReady, LanesPersisted, LanesReady, LanesRestoreError, RestoredLane, RestoredLanes};
pub use self::kind::{LaneKey, LaneKind, LanesPolicy, LanesPolicyError};
pub use self::outcome::{CompleteOutcome, Enqueued, LaneEnvelope, LanesClaim, LanesReconnect, TooManyLanes};
use crate::changes::{Changes, Projection};
use crate::completions::Completions;
use crate::core::EgressCore;
use crate::ids::{FlushEpoch, Generation, Ordinal, Sequence, Time};
use crate::outcome::Transition;

/// Several egress streams with one connection: each lane key has its own
/// [`EgressCore`] (its own sequences, window and watermark, with the window
/// and ordering of its [`LaneKind`]), and [`claim`](Self::claim) releases
/// records **in the order they were enqueued across every lane**, skipping a
/// record whose lane cannot send it now.
///
/// This is the outgoing queue of a chat client: each room keeps its order
/// without waiting for the others, two to-device sends never race, an
/// account-data write is never overtaken by a later one, and unordered
/// calls are bounded in number.
///
/// ```
/// use egress_core::{Generation, LaneKey, LaneKind, Lanes, LanesClaim, LanesPolicy, Policy};
///
/// #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
/// enum Lane { Room(&'static str), AccountData }
/// impl LaneKey for Lane {
///     fn kind(&self) -> LaneKind {
///         match self { Lane::Room(_) => LaneKind::Serial, Lane::AccountData => LaneKind::Strict }
///     }
/// }
///
/// let mut lanes = Lanes::new(LanesPolicy::new(Policy::default(), 64)?);
/// let g = lanes.generation();
/// for (lane, text) in [(Lane::Room("a"), "a1"), (Lane::Room("a"), "a2"), (Lane::Room("b"), "b1")] {
///     lanes.enqueue(lane, text).outcome.expect("room for the lane");
/// }
/// let mut sent = Vec::new();
/// while let LanesClaim::Claimed(e) = lanes.claim(g).outcome {
///     sent.push(*e.envelope.payload);
/// }
/// // "a2" waits for "a1": one in flight per room; room b does not wait.
/// assert_eq!(sent, ["a1", "b1"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # The rules
/// - **Release order.** [`claim`](Self::claim) hands out the record with
///   the lowest [`Ordinal`] among the heads of lanes that can claim now
///   (see [`EgressCore::can_claim`]). A record back from a retry keeps its
///   ordinal, so it goes ahead of everything enqueued after it.
/// - **Skipped, never reordered within a lane.** A lane that cannot claim
///   (its window full, a record before its head backing off or held, a
///   flush epoch not released) is skipped; the lanes after it go on.
/// - **A cap across lanes.** With [`LanesPolicy::inflight_cap`], nothing is
///   claimed while that many records are [`outstanding`](Self::outstanding).
/// - **One connection, one generation.** Every lane is at the generation of
///   the `Lanes`; [`reconnect`](Self::reconnect) fences them all at once.
/// - **Bounded lanes.** At most [`LanesPolicy::max_lanes`] lanes exist. A
///   lane with nothing pending, in flight, parked, held or gated is idle; a
///   new key frees an idle lane when it needs the room, and is refused
///   ([`TooManyLanes`], the payload returned) only when every lane is busy.
///   A lane made again starts its sequences again: name a record to a peer
///   by its ordinal (or its lane and the lane's first ordinal), not by its
///   lane and sequence alone.
///
/// # Completions
/// A request/response transport completes records one by one, in any
/// order: [`complete`](Self::complete) turns them into each lane's
/// cumulative acknowledgement (a lane acknowledges a record once every
/// record before it in the lane completed). A stream transport acknowledges
/// cumulatively with [`ack`](Self::ack). Both may be mixed.
///
/// # Changes
/// A transition on one lane (named by the caller, or by the outcome of
/// `claim`) reports that lane's [`Changes`]; the aggregate counts
/// ([`pending_len`](Self::pending_len) and the others) change with them.
/// A transition on many lanes lists each lane it touched.
///
/// # Costs
/// A transition on one lane costs what the lane's core costs plus O(log L)
/// for L lanes: finding the lane by its key, and moving it in the release
/// index and, when its timer moved, in the timer index. `claim` finds no
/// key: it takes the lane at the front of the release index. A key is
/// cloned when a lane is made (it is kept twice: in the lane and in the
/// index of keys) and when it becomes idle. `reconnect` and `release` visit
/// every lane.
///
/// Two `Lanes` are equal when their lanes (by key, each with its core and
/// the ordinals of its records), generation, counters and what their store
/// was told are: which slot holds a lane does not count.
#[derive(Clone, Debug)]
pub struct Lanes<K, T> {
    policy: LanesPolicy,
    generation: Generation,
    next_ordinal: Ordinal,
    released: FlushEpoch,
    /// Each lane's slot, by key.
    index: BTreeMap<K, usize>,
    /// The lanes, by slot; `None` for a slot free to reuse.
    slots: Vec<Option<Lane<K, T>>>,
    /// The free slots.
    free: Vec<usize>,
    /// Each lane that can claim now, by the ordinal of its head.
    ready: ready::ReadyHeap,
    /// Each lane with a parked record, by when its first one is due.
    due: BTreeSet<(Time, usize)>,
    /// The lanes with nothing left in them.
    idle: BTreeSet<K>,
    /// The sums of every lane's counts.
    totals: Counts,
    /// What the store was told, for durable lanes (see [`Lanes::restore`]).
    journal: Option<Box<durable::LanesJournal<K>>>,
}

impl<K: PartialEq, T: PartialEq> PartialEq for Lanes<K, T> {
    fn eq(&self, other: &Self) -> bool {
        compared(self) == compared(other)
    }
}

/// What of a [`Lanes`] counts for its equality: everything but where each
/// lane sits (its slot) and the indexes, which follow from the lanes.
type Compared<'a, K, T> = (
    (LanesPolicy, Generation, Ordinal, FlushEpoch, Counts),
    &'a BTreeSet<K>,
    &'a Option<Box<durable::LanesJournal<K>>>,
    Vec<(&'a K, &'a Option<Lane<K, T>>)>,
);

fn compared<K, T>(l: &Lanes<K, T>) -> Compared<'_, K, T> {
    (
        (l.policy, l.generation, l.next_ordinal, l.released, l.totals),
        &l.idle,
        &l.journal,
        l.index.iter().map(|(k, &slot)| (k, &l.slots[slot])).collect(),
    )
}

/// One lane: its key, its core, the ordinal of each of its records, its
/// completions, and where it stands in the indexes of the [`Lanes`].
#[derive(Clone, Debug, PartialEq)]
struct Lane<K, T> {
    key: K,
    core: EgressCore<T>,
    /// The ordinal of each record not yet acknowledged, by sequence from
    /// `base` (ascending: a lane's records are enqueued in its order).
    ordinals: VecDeque<Ordinal>,
    /// The sequence of `ordinals[0]`: the lowest not acknowledged.
    base: Sequence,
    completions: Completions,
    /// Its key in `Lanes::ready`, if it is there.
    ready: Option<Ordinal>,
    /// Its time in `Lanes::due`, if it is there.
    due: Option<Time>,
    /// Whether it is in `Lanes::idle`.
    idle: bool,
    /// Whether its journal is being written (a lane is not freed then).
    writing: bool,
}

/// A lane's counts, or their sums over lanes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    pending: usize,
    inflight: usize,
    parked: usize,
    exhausted: usize,
    gated: usize,
    /// In flight and not completed.
    outstanding: usize,
}

impl Counts {
    #[inline]
    fn of<K, T>(lane: &Lane<K, T>) -> Self {
        let inflight = lane.core.inflight_len();
        Self {
            pending: lane.core.pending_len(),
            inflight,
            parked: lane.core.parked_len(),
            exhausted: lane.core.exhausted_len(),
            gated: lane.core.gated_len(),
            outstanding: inflight - lane.completions.waiting(),
        }
    }

    const fn is_idle(self) -> bool {
        self.pending == 0 && self.inflight == 0 && self.parked == 0 && self.exhausted == 0 && self.gated == 0
    }

    /// `self - before + after`, field by field (`self` includes `before`).
    const fn replace(self, before: Self, after: Self) -> Self {
        Self {
            pending: self.pending - before.pending + after.pending,
            inflight: self.inflight - before.inflight + after.inflight,
            parked: self.parked - before.parked + after.parked,
            exhausted: self.exhausted - before.exhausted + after.exhausted,
            gated: self.gated - before.gated + after.gated,
            outstanding: self.outstanding - before.outstanding + after.outstanding,
        }
    }
}

impl<K, T> Lane<K, T> {
    /// What freeing this idle lane changes: its watermarks read as no
    /// lane's (`None`); nothing else of an idle lane differs from that.
    fn freed_changes(&self) -> Changes {
        Changes::NONE
            .with_if(Projection::AckedThrough, self.core.acked_through().is_some())
            .with_if(Projection::Received, self.core.received_through().is_some())
    }

    fn new(key: K, core: EgressCore<T>) -> Self {
        Self {
            key,
            core,
            ordinals: VecDeque::new(),
            base: Sequence(0),
            completions: Completions::default(),
            ready: None,
            due: None,
            idle: false,
            writing: false,
        }
    }

    /// The ordinal of the unacknowledged record `sequence`.
    #[inline]
    fn ordinal(&self, sequence: Sequence) -> Option<Ordinal> {
        let offset = usize::try_from(sequence.0.checked_sub(self.base.0)?).ok()?;
        self.ordinals.get(offset).copied()
    }

    /// The ordinal of the head of pending, if the lane can claim it now.
    #[inline]
    fn ready_ordinal(&self) -> Option<Ordinal> {
        let head = self.core.pending.head()?;
        if self.core.claimable(head) { self.ordinal(head) } else { None }
    }
}

impl<K: LaneKey, T> Lanes<K, T> {
    /// No lanes, at generation 0.
    #[must_use]
    pub const fn new(policy: LanesPolicy) -> Self {
        Self::with_generation(policy, Generation(0))
    }

    /// No lanes, at `generation`.
    #[must_use]
    pub const fn with_generation(policy: LanesPolicy, generation: Generation) -> Self {
        Self {
            policy,
            generation,
            next_ordinal: Ordinal(0),
            released: FlushEpoch(0),
            index: BTreeMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            ready: ready::ReadyHeap::new(),
            due: BTreeSet::new(),
            idle: BTreeSet::new(),
            totals: Counts { pending: 0, inflight: 0, parked: 0, exhausted: 0, gated: 0, outstanding: 0 },
            journal: None,
        }
    }

    // ----- getters -------------------------------------------------------

    /// The policy.
    #[must_use]
    pub const fn policy(&self) -> &LanesPolicy {
        &self.policy
    }

    /// The generation of every lane.
    #[must_use]
    pub const fn generation(&self) -> Generation {
        self.generation
    }

    /// The ordinal the next enqueue will assign.
    #[must_use]
    pub const fn next_ordinal(&self) -> Ordinal {
        self.next_ordinal
    }

    /// Every flush epoch at or below it is released.
    #[must_use]
    pub const fn released(&self) -> FlushEpoch {
        self.released
    }

    /// The core of `lane`, if the lane exists: everything about the lane
    /// (its pending, in-flight and parked records, its watermark, its
    /// retry state) through the core's getters. Its transitions go through
    /// the `Lanes`.
    #[must_use]
    pub fn lane(&self, lane: &K) -> Option<&EgressCore<T>> {
        self.index.get(lane).map(|&slot| &self.at(slot).core)
    }

    /// Every lane that exists, in key order, with its core.
    pub fn lanes(&self) -> impl ExactSizeIterator<Item = (&K, &EgressCore<T>)> + '_ {
        self.index.iter().map(|(k, &slot)| (k, &self.at(slot).core))
    }

    /// How many lanes exist (idle ones included).
    #[must_use]
    pub fn lane_count(&self) -> usize {
        self.index.len()
    }

    /// The idle lane an enqueue to a new key would free now (the first in
    /// key order), if every lane the policy allows exists and one is idle.
    #[must_use]
    pub fn next_freed(&self) -> Option<&K> {
        if self.index.len() < self.policy.max_lanes() {
            return None;
        }
        self.idle.first()
    }

    /// The lane whose head [`claim`](Self::claim) would move into flight
    /// now (under the current generation), if it would claim at all: for a
    /// shell that must own a copy of the lane key before the claim (a copy
    /// whose `Clone` panics then changes nothing).
    #[must_use]
    pub fn next_claim(&self) -> Option<&K> {
        if self.cap_reached() {
            return None;
        }
        self.ready.first().map(|(_, slot)| &self.at(slot).key)
    }

    /// The ordinal of the record `sequence` of `lane`, while it is not
    /// acknowledged.
    #[must_use]
    pub fn ordinal(&self, lane: &K, sequence: Sequence) -> Option<Ordinal> {
        self.at(*self.index.get(lane)?).ordinal(sequence)
    }

    /// Records pending, over every lane.
    #[must_use]
    pub const fn pending_len(&self) -> usize {
        self.totals.pending
    }

    /// Records in flight, over every lane (completed ones waiting for an
    /// earlier record of their lane included).
    #[must_use]
    pub const fn inflight_len(&self) -> usize {
        self.totals.inflight
    }

    /// Records in flight and not completed, over every lane: what the
    /// [`inflight_cap`](LanesPolicy::inflight_cap) bounds.
    #[must_use]
    pub const fn outstanding(&self) -> usize {
        self.totals.outstanding
    }

    /// Records parked for a retry, over every lane.
    #[must_use]
    pub const fn parked_len(&self) -> usize {
        self.totals.parked
    }

    /// Dead letters held, over every lane.
    #[must_use]
    pub const fn exhausted_len(&self) -> usize {
        self.totals.exhausted
    }

    /// Records waiting for a flush epoch, over every lane.
    #[must_use]
    pub const fn gated_len(&self) -> usize {
        self.totals.gated
    }

    /// Whether [`claim`](Self::claim) under the current generation would
    /// claim a record now.
    #[must_use]
    pub fn can_claim(&self) -> bool {
        self.ready.len() > 0 && !self.cap_reached()
    }

    /// The earliest time a parked record of any lane is due: call
    /// [`handle_timeout`](Self::handle_timeout) then.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        self.due.first().map(|(t, _)| *t)
    }

    #[inline]
    fn cap_reached(&self) -> bool {
        self.policy.cap().is_some_and(|cap| self.totals.outstanding >= cap.get())
    }

    // ----- the send path -------------------------------------------------

    /// Queues `payload` in `lane`, under the lane's next sequence and the
    /// next ordinal.
    ///
    /// Refused with [`TooManyLanes`] (the payload returned, nothing
    /// changed) when the lane does not exist, [`max_lanes`](LanesPolicy::max_lanes)
    /// lanes do, and none of them is idle.
    ///
    /// Changes: the lane's pending; and when an idle lane was freed for it
    /// ([`next_freed`](Self::next_freed)), what of that lane now reads as
    /// no lane's: its acknowledgement and receipt watermarks, if it had
    /// them.
    pub fn enqueue(&mut self, lane: K, payload: T) -> Transition<Result<Enqueued, TooManyLanes<T>>> {
        self.enqueue_with(lane, payload, |core, payload| core.enqueue(payload))
    }

    /// Queues `payload` in `lane`, like [`enqueue`](Self::enqueue), to go
    /// out only once [`release`](Self::release) reaches `after` (see
    /// [`EgressCore::enqueue_after`]). It waits in its lane's order; other
    /// lanes go on.
    ///
    /// Changes: the lane's pending; durable, when it waits.
    pub fn enqueue_after(
        &mut self,
        lane: K,
        payload: T,
        after: FlushEpoch,
    ) -> Transition<Result<Enqueued, TooManyLanes<T>>> {
        self.enqueue_with(lane, payload, |core, payload| core.enqueue_after(payload, after))
    }

    fn enqueue_with(
        &mut self,
        key: K,
        payload: T,
        enqueue: impl FnOnce(&mut EgressCore<T>, T) -> Transition<Sequence>,
    ) -> Transition<Result<Enqueued, TooManyLanes<T>>> {
        let (slot, new_lane, freed) = match self.index.get(&key) {
            Some(&slot) => (slot, false, Changes::NONE),
            None => match self.make_lane(key) {
                Ok((slot, freed)) => (slot, true, freed),
                Err(limit) => return Transition::unchanged(Err(TooManyLanes { limit, payload })),
            },
        };
        let lane = self.slots[slot].as_mut().expect("invariant broken: an index names a free slot");
        let gated = lane.core.gated_len();
        let ordinal = self.next_ordinal;
        // Before the record goes in: at the end of the ordinals (2^64
        // enqueues, or a store's counter restored there) the panic leaves
        // every count true.
        let next = ordinal.next();
        let t = enqueue(&mut lane.core, payload);
        lane.ordinals.push_back(ordinal);
        self.next_ordinal = next;
        // What an enqueue moves, and nothing else: one record pending
        // (gated, when it waits). Its head was there before (the new
        // record is the highest of the lane) unless nothing was pending, in
        // which case the lane was not in the release index; no timer moves;
        // a lane with a record pending is not idle.
        self.totals.pending += 1;
        self.totals.gated += lane.core.gated_len() - gated;
        if lane.ready.is_none() {
            lane.ready = lane.ready_ordinal();
            self.ready.set(slot, lane.ready);
        }
        if lane.idle {
            // Out of the set before the flag: an `Ord` that panics leaves
            // the lane marked idle and in the set, to be taken out again.
            self.idle.remove(&lane.key);
            lane.idle = false;
        }
        if let Some(j) = self.journal.as_deref_mut() {
            j.touched(slot);
        }
        self.debug_check();
        Transition::new(Ok(Enqueued { ordinal, sequence: t.outcome, new_lane }), t.changes.union(freed))
    }

    /// Makes the lane `key`, freeing an idle one when every lane the policy
    /// allows exists. Returns its slot and what freeing changed, or the
    /// limit when every lane is busy (nothing changed).
    #[cold]
    fn make_lane(&mut self, key: K) -> Result<(usize, Changes), usize> {
        let full = self.index.len() >= self.policy.max_lanes();
        if full && self.idle.is_empty() {
            return Err(self.policy.max_lanes());
        }
        // The lane is made (the key's `kind` and `clone` called) before an
        // idle one is freed: a key whose `kind` or `clone` panics leaves
        // every lane where it was.
        let policy = key.kind().policy(*self.policy.base());
        let mut core = match self.journal.as_deref() {
            None => EgressCore::with_generation(policy, self.generation),
            // Durable: a new stream, stored at the durable generation,
            // moving to the current one through its journal.
            Some(j) => {
                let stored = crate::Restored { generation: j.lane_generation(), ..crate::Restored::empty() };
                let mut core = EgressCore::restore(policy, stored).expect("an empty stream restores");
                let _ = core.reconnect(self.generation);
                core
            }
        };
        let _ = core.release(self.released);
        let lane = Lane::new(key.clone(), core);
        let mut freed = Changes::NONE;
        if full && let Some(idle) = self.idle.pop_first() {
            let slot = self.index.remove(&idle).expect("invariant broken: an idle lane has no slot");
            freed = self.take_slot(slot).map_or(Changes::NONE, |gone| gone.freed_changes());
            if let Some(j) = self.journal.as_deref_mut() {
                j.freed(idle, slot);
            }
        }
        Ok((self.insert_lane(key, lane), freed))
    }

    /// Puts `lane` in a free slot under `key` (not in the index before).
    /// The key goes into the index first: an `Ord` that panics there
    /// leaves no slot taken.
    fn insert_lane(&mut self, key: K, lane: Lane<K, T>) -> usize {
        let slot = self.free.last().copied().unwrap_or(self.slots.len());
        self.index.insert(key, slot);
        if slot == self.slots.len() {
            self.slots.push(Some(lane));
        } else {
            self.free.pop();
            self.slots[slot] = Some(lane);
        }
        slot
    }

    /// Empties the slot of a freed lane (idle: in no index but the keys').
    fn take_slot(&mut self, slot: usize) -> Option<Lane<K, T>> {
        let gone = self.slots.get_mut(slot)?.take()?;
        debug_assert!(gone.ready.is_none() && gone.due.is_none(), "a freed lane was idle");
        self.free.push(slot);
        Some(gone)
    }

    /// The lane in `slot`, which an index named.
    #[inline]
    fn at(&self, slot: usize) -> &Lane<K, T> {
        self.slots[slot].as_ref().expect("invariant broken: an index names a free slot")
    }

    /// Moves into flight the record enqueued first among those that can go
    /// now: the lowest ordinal at the head of a lane that can claim (see
    /// the rules above).
    ///
    /// Refused with `StaleGeneration` unless `generation` is the current
    /// one. Then, in this order: `Full` (the cap across lanes is reached),
    /// `Empty` (nothing pending) and `Waiting` (nothing pending can go
    /// now). Records whose backoff elapsed go back to pending in
    /// [`handle_timeout`](Self::handle_timeout): call it at
    /// [`poll_timeout`](Self::poll_timeout).
    ///
    /// Changes: the claimed lane's pending and inflight.
    pub fn claim(&mut self, generation: Generation) -> Transition<LanesClaim<'_, K, T>> {
        if generation != self.generation {
            return Transition::unchanged(LanesClaim::StaleGeneration { current: self.generation });
        }
        if let Some(cap) = self.policy.cap().filter(|cap| self.totals.outstanding >= cap.get()) {
            return Transition::unchanged(LanesClaim::Full { cap });
        }
        let Some((ordinal, slot)) = self.ready.first() else {
            let outcome = if self.totals.pending == 0 { LanesClaim::Empty } else { LanesClaim::Waiting };
            return Transition::unchanged(outcome);
        };
        let lane = self.slots[slot].as_mut().expect("invariant broken: a ready lane does not exist");
        // The lane is in the release index because its head can go now
        // (`ready_ordinal`, kept true by every transition): claimed without
        // asking again.
        let (head, fresh) = lane.core.pending.locate().expect("invariant broken: a ready lane has nothing pending");
        let _ = lane.core.claim_located(head, fresh);
        // What a claim moves, and nothing else: one record from pending
        // into flight, not completed; the lane's head. No timer moves, and
        // a lane with a record in flight is not idle. (No key is copied: a
        // key whose `Clone` panics cannot leave a record in flight with no
        // one told of it.)
        self.totals.pending -= 1;
        self.totals.inflight += 1;
        self.totals.outstanding += 1;
        lane.ready = lane.ready_ordinal();
        self.ready.claimed(slot, lane.ready);
        if let Some(j) = self.journal.as_deref_mut() {
            j.touched(slot);
        }
        self.debug_check();
        let lane = self.at(slot);
        let record = lane.core.inflight.newest().expect("the claimed record is in flight");
        Transition::new(
            LanesClaim::Claimed(LaneEnvelope { lane: &lane.key, ordinal, envelope: record.view(self.generation) }),
            Changes::NONE.with(Projection::Pending).with(Projection::Inflight),
        )
    }

    // ----- bookkeeping ---------------------------------------------------

    /// Brings the lane in `slot` and the indexes up to date after a
    /// transition on it: drops the ordinals of what it acknowledged, moves
    /// its completions to its watermark, and puts it where it now belongs
    /// in the release index, the timer index and the idle set. `before` is
    /// its counts before the transition. Returns what acknowledging the
    /// completions carried along changed.
    fn settle(&mut self, slot: usize, before: Counts) -> Changes {
        let lane = self.slots[slot].as_mut().expect("invariant broken: an index names a free slot");
        let mut carried = Changes::NONE;
        let acked = lane.core.acked_through().map_or(0, |a| a.0.saturating_add(1));
        if acked > lane.base.0 {
            let next = match lane.completions.advance_to(acked) {
                // Completions waiting just above an acknowledgement that came
                // another way: the lane acknowledges them too.
                Some(through) => {
                    carried = lane.core.ack(self.generation, through).changes;
                    through.0 + 1
                }
                None => acked,
            };
            let drop = usize::try_from(next - lane.base.0).unwrap_or(usize::MAX).min(lane.ordinals.len());
            if drop == 1 {
                lane.ordinals.pop_front();
            } else {
                lane.ordinals.drain(..drop);
            }
            lane.base = Sequence(next);
        }
        let after = Counts::of(lane);
        self.totals = self.totals.replace(before, after);
        let ready = lane.ready_ordinal();
        if ready != lane.ready {
            self.ready.set(slot, ready);
            lane.ready = ready;
        }
        let due = lane.core.poll_timeout();
        if due != lane.due {
            if let Some(old) = lane.due {
                self.due.remove(&(old, slot));
            }
            if let Some(new) = due {
                self.due.insert((new, slot));
            }
            lane.due = due;
        }
        if let Some(j) = self.journal.as_deref_mut() {
            j.touched(slot);
        }
        let idle = after.is_idle() && !lane.writing;
        if idle != lane.idle {
            if idle {
                self.idle.insert(lane.key.clone());
            } else {
                self.idle.remove(&lane.key);
            }
            lane.idle = idle;
        }
        carried
    }

    /// Runs `f` on the lane in `slot` and settles it: the shared shape of
    /// the transitions on one lane.
    fn on_slot<O>(
        &mut self,
        slot: usize,
        f: impl FnOnce(&mut Lane<K, T>, Generation) -> Transition<O>,
    ) -> Transition<O> {
        let generation = self.generation;
        let lane = self.slots[slot].as_mut().expect("invariant broken: an index names a free slot");
        let before = Counts::of(lane);
        let t = f(lane, generation);
        let carried = self.settle(slot, before);
        self.debug_check();
        Transition::new(t.outcome, t.changes.union(carried))
    }

    /// [`on_slot`](Self::on_slot) on the lane `key`; `None` when the lane
    /// does not exist.
    fn on_lane<O>(
        &mut self,
        key: &K,
        f: impl FnOnce(&mut Lane<K, T>, Generation) -> Transition<O>,
    ) -> Option<Transition<O>> {
        let slot = *self.index.get(key)?;
        Some(self.on_slot(slot, f))
    }

    /// Each lane's key (cloned: a clone that panics changes nothing) and
    /// slot, in key order: for the transitions on every lane.
    fn every_lane(&self) -> Vec<(K, usize)> {
        self.index.iter().map(|(k, &slot)| (k.clone(), slot)).collect()
    }

    /// In tests, that the sums are the sums of the lanes and the indexes
    /// name exactly the lanes that belong in them.
    #[inline]
    fn debug_check(&self) {
        #[cfg(debug_assertions)]
        {
            let mut sums = Counts::default();
            let mut ready = 0;
            for (key, &slot) in &self.index {
                let lane = self.at(slot);
                debug_assert!(lane.key == *key, "the index names a lane under another key");
                sums = sums.replace(Counts::default(), Counts::of(lane));
                debug_assert_eq!(lane.ready, lane.ready_ordinal(), "a lane out of place in the release index");
                ready += usize::from(lane.ready.is_some());
                debug_assert_eq!(lane.idle, self.idle.contains(key), "the idle set");
            }
            debug_assert_eq!(sums, self.totals, "the sums of the lanes' counts");
            debug_assert_eq!(ready, self.ready.len(), "the release index holds only ready lanes");
        }
    }
}
