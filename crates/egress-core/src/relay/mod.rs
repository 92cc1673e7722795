//! [`Relay`]: what sits ahead of an egress stream's enqueue when a producer
//! can be faster than its transport. A bounded window of ops, folded under
//! a [`MergePolicy`] when it is under pressure, with a [`Backpressure`]
//! policy for what does not fit; a drain takes its entries, oldest first,
//! into a stream (the cell's `RelayCellOf::drain_into` feeds an egress
//! cell). Sequence assignment, acknowledgements and the fence stay in the
//! stream: the relay only decides what is sent, and how folded.

mod backpressure;
mod merge;

use std::collections::VecDeque;

pub use self::backpressure::{Backpressure, Overflow, RelayConfigError, Water};
pub use self::merge::{KeepLatest, Max, MergePolicy, RawFifo, SetUnion, Sum};

/// A bounded window of ops ahead of a stream, folded under `M` when under
/// pressure. Pure: no I/O, no clock, no threads.
///
/// ```
/// use egress_core::{Backpressure, Overflow, Relay, Sent, Sum, Water};
///
/// // Counter increments: at most 2 entries; under pressure, fold.
/// let mut relay = Relay::new(Sum, Backpressure::count(Water::new(2, 0), Overflow::Conflate))?;
/// for delta in [1u64, 2, 3, 4] {
///     relay.send(delta).expect("a conflating relay takes every op");
/// }
/// // 1 and 2 went in as they were; at high water 3 and 4 folded into 2.
/// assert_eq!(relay.stats().depth, 2);
/// assert_eq!(relay.stats().conflated, 2);
/// assert_eq!(relay.pop().map(|d| d.value), Some(1));
/// assert_eq!(relay.pop().map(|d| (d.value, d.ops)), Some((9, 3)));
/// // Drained to low water: not full any more.
/// assert!(!relay.stats().full);
/// # Ok::<(), egress_core::RelayConfigError>(())
/// ```
///
/// # The rules
/// - **Entries, oldest first.** An op that fits is a new entry at the
///   back; [`pop`](Self::pop) takes the front. An entry holds one op, or
///   several folded under `M` (consecutive ops, in order).
/// - **Fits** means: the relay is not full, and one more entry (of the
///   op's weight) stays within every high water mark.
/// - **Hysteresis.** The relay is full once it holds a high water mark
///   (in entries or bytes), or an op did not fit; it stays full until a
///   drain takes it down to every low water mark. While full, every op
///   goes to the [`Overflow`] action, even if it would fit.
/// - **Overflow** ([`Backpressure::overflow`]): refuse
///   ([`Overflow::Block`]), drop the op, drop the oldest entries until it
///   fits, fold it into the newest entry ([`Overflow::Conflate`]), or ask
///   for the entries to be written to storage first ([`Overflow::Spill`]).
/// - **Spill.** [`spill`](Self::spill) takes every entry out as one page
///   (folded into one entry under a policy that conflates) and counts its
///   ops as *cold*: written out, ahead of the entries. While any op is
///   cold, [`pop`](Self::pop) takes nothing: the pages go first, and
///   [`replayed`](Self::replayed) counts them into the stream as they do
///   ([`lost`](Self::lost), those the storage lost). An entry put back
///   ([`unpop`](Self::unpop)) while ops are cold is older than all of
///   them: it goes first, and no spill or fold takes it. A page that
///   could not be written comes back with [`unspill`](Self::unspill), as
///   it was taken out (folded, under a policy that conflates).
/// - **Too large.** An op heavier than the high water mark in bytes is
///   refused whatever the action ([`SendRefused::TooLarge`]): it would
///   never fit.
/// - **Converges.** Folding what the drain delivered, then what the relay
///   holds, equals folding every op taken and not dropped, in order, for
///   any drain schedule (for an associative policy; tests/relay.rs).
/// - **Counts.** [`stats`](Self::stats): entries, ops and bytes held,
///   whether full, and the ops taken, folded, dropped, blocked and drained
///   since the relay was built.
/// - **User code.** The merge policy, the weigher and `T`'s `Drop` run
///   inside transitions; a panic in any goes on to the caller and leaves
///   the relay usable, every op taken still held, drained or counted as
///   dropped. A panicking weigher of an op changes nothing (it runs
///   first). A fold of the op into the newest entry that panics (in the
///   policy, or weighing its result) loses the op, never counted as
///   taken (the entry folded into is as the panic left it); a fold of the newest entries together (the bound in bytes)
///   that panics loses the newer entry, counted as dropped. An entry
///   whose `Drop` panics as `DropOldest` drops it is counted as dropped.
pub struct Relay<T, M> {
    policy: M,
    bounds: Backpressure,
    weigh: fn(&T) -> u64,
    window: VecDeque<Entry<T>>,
    /// Each entry's weight, in the window's order, kept only with a bound
    /// in bytes (empty without one: an entry is then its value and its op
    /// count alone, and a send or pop touches no weight).
    weights: VecDeque<u64>,
    /// The sum of the entries' weights (0 without a bound in bytes: the
    /// weigher is then never called). Wider than one weight: a fold that
    /// grows may hold more than a `u64` sums to.
    bytes: u128,
    /// Whether the relay is full, and what its fast paths must know of its
    /// configuration and its cold ops, as bits ([`mode`]): `send` and
    /// `pop` test them in one compare.
    mode: u8,
    /// The count below which `send` pushes an op with no other check: the
    /// high mark in entries while the relay is neither full nor bounded in
    /// bytes, else 0 (kept with `mode` by `set_full`).
    room: u64,
    /// The count below which `pop` leaves a full relay not full: the low
    /// mark in entries plus one while the relay is full and not bounded
    /// in bytes, else 0 (kept with `mode` by `set_full`).
    drained_below: u64,
    /// Ops written out to storage and not yet replayed into the stream:
    /// they go before the entries.
    cold: u64,
    /// How many entries at the front were put back ([`Relay::unpop`])
    /// while ops were cold: older than every cold op, they go first, and
    /// no spill or fold takes them (0 once nothing is cold).
    returned: usize,
    counters: Counters,
}

/// The bits of [`Relay`]'s `mode`.
mod mode {
    /// The relay is full (the hysteresis rule).
    pub(super) const FULL: u8 = 1;
    /// It has a bound in bytes: it weighs each op and keeps the weights.
    pub(super) const WEIGHS: u8 = 2;
    /// Its overflow action is [`Overflow::Conflate`](super::Overflow::Conflate).
    pub(super) const CONFLATES: u8 = 4;
    /// Ops are cold: [`Relay::pop`](super::Relay::pop) takes only entries
    /// put back meanwhile.
    pub(super) const COLD: u8 = 8;
}

use self::mode::{COLD, CONFLATES, FULL, WEIGHS};

/// One entry: a value (one op, or several folded) and how many ops it
/// holds (its weight, with a bound in bytes, is in `Relay::weights`).
struct Entry<T> {
    value: T,
    ops: u64,
}

/// The counters since the relay was built. Like the ops held, they wrap
/// at `u64::MAX` rather than check (2^64 ops is centuries at a billion a
/// second; a check would cost every send).
#[derive(Clone, Copy, Default)]
struct Counters {
    /// Ops taken as a new entry (the accepted are these and the
    /// conflated: one counter moves per op taken).
    pushed: u64,
    conflated: u64,
    /// Ops dropped as they came (`DropNewest`): never taken.
    dropped_new: u64,
    /// Ops dropped once taken (`DropOldest`, a fold that panicked).
    dropped_held: u64,
    blocked: u64,
    drained: u64,
    /// Ops taken out in pages ([`Relay::spill`]).
    spilled: u64,
    /// Cold ops counted into the stream ([`Relay::replayed`]).
    replayed: u64,
    /// Cold ops the storage lost ([`Relay::lost`]).
    lost: u64,
}

impl Counters {
    /// The ops the entries hold: every op taken is held, drained, spilled
    /// or dropped once taken, so the count is kept by the counters alone.
    const fn held(&self) -> u64 {
        self.accepted().wrapping_sub(self.drained).wrapping_sub(self.dropped_held).wrapping_sub(self.spilled)
    }

    /// Ops taken: as a new entry, or folded into one.
    const fn accepted(&self) -> u64 {
        self.pushed.wrapping_add(self.conflated)
    }
}

/// What a relay holds and has done: its every projection, as one value a
/// shell reads after each transition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RelayStats {
    /// Entries held.
    pub depth: u64,
    /// Ops the entries hold (at least `depth`).
    pub ops: u64,
    /// The entries' weight (0 without a bound in bytes; `u64::MAX` if
    /// larger).
    pub bytes: u64,
    /// Whether the relay is full (see the hysteresis rule).
    pub full: bool,
    /// Ops taken: as an entry, or folded into one.
    pub accepted: u64,
    /// Of those, ops folded into an entry ([`Overflow::Conflate`]).
    pub conflated: u64,
    /// Ops dropped: by [`Overflow::DropNewest`], held by an entry
    /// [`Overflow::DropOldest`] dropped, or cold and lost by the storage
    /// ([`Relay::lost`]).
    pub dropped: u64,
    /// Ops refused by [`Overflow::Block`].
    pub blocked: u64,
    /// Ops the drain took: entries popped and not put back, and cold ops
    /// replayed.
    pub drained: u64,
    /// Ops taken out in pages to be written to storage
    /// ([`Overflow::Spill`]).
    pub spilled: u64,
    /// Ops written out and not yet replayed into the stream (those this
    /// relay spilled, and those a restart found stored): they go before
    /// the entries.
    pub cold: u64,
}

/// What [`Relay::send`] did with an op it did not refuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// A new entry.
    Accepted,
    /// Folded into the newest entry.
    Conflated,
    /// Dropped (the relay was full, [`Overflow::DropNewest`]).
    Dropped,
    /// A new entry, after dropping the oldest entries
    /// ([`Overflow::DropOldest`]) that held `ops` ops (0: it fitted).
    DroppedOldest {
        /// The ops the dropped entries held.
        ops: u64,
    },
}

/// Why [`Relay::send`] refused an op (it comes back; nothing changed but
/// the counts a refusal moves).
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendRefused<T> {
    /// The relay is full and its overflow action is
    /// [`Overflow::Block`]: send it again once the relay is not full.
    #[error("the relay is full")]
    Blocked(T),
    /// The op weighs more than the high water mark in bytes: it never
    /// fits. Nothing changed.
    #[error("the op weighs {bytes} bytes, above the relay's high water mark of {limit}")]
    TooLarge {
        /// The op, back.
        op: T,
        /// Its weight.
        bytes: u64,
        /// The high water mark in bytes.
        limit: u64,
    },
    /// The relay is full and its overflow action is [`Overflow::Spill`]:
    /// write its entries out ([`Relay::spill`]), then send the op again.
    /// Nothing changed.
    #[error("the relay is full: its entries must be written out first")]
    MustSpill(T),
    /// A relay cell could not write its entries out (the op's
    /// [`Overflow::Spill`]): they are back in the relay as they were, and
    /// nothing changed but the relay is full.
    #[error("the relay could not write its entries out: {reason}")]
    SpillFailed {
        /// The op, back.
        op: T,
        /// Why (the store's error).
        reason: String,
    },
}

impl<T> SendRefused<T> {
    /// The op, back.
    pub fn into_op(self) -> T {
        match self {
            SendRefused::Blocked(op)
            | SendRefused::TooLarge { op, .. }
            | SendRefused::MustSpill(op)
            | SendRefused::SpillFailed { op, .. } => op,
        }
    }
}

impl<T> std::fmt::Debug for SendRefused<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendRefused::Blocked(_) => f.write_str("Blocked"),
            SendRefused::TooLarge { bytes, limit, .. } => {
                f.debug_struct("TooLarge").field("bytes", bytes).field("limit", limit).finish()
            }
            SendRefused::MustSpill(_) => f.write_str("MustSpill"),
            SendRefused::SpillFailed { reason, .. } => f.debug_struct("SpillFailed").field("reason", reason).finish(),
        }
    }
}

/// An entry the drain took: its value and how many ops it folds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drained<T> {
    /// The value: one op, or several folded in order.
    pub value: T,
    /// How many ops it folds (at least 1).
    pub ops: u64,
    bytes: u64,
}

/// The entries a relay took out to be written to storage
/// ([`Relay::spill`]), oldest first: one, folded, under a policy that
/// conflates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpillPage<T> {
    entries: Vec<Drained<T>>,
    ops: u64,
}

impl<T> SpillPage<T> {
    /// The entries, oldest first: each a value and how many ops it folds.
    #[must_use]
    pub fn entries(&self) -> &[Drained<T>] {
        &self.entries
    }

    /// The ops the page holds.
    #[must_use]
    pub const fn ops(&self) -> u64 {
        self.ops
    }
}

impl<T> Drained<T> {
    /// The value, and the entry without it: for a drain that moves the
    /// value out to deliver it, and may get it back (its stream refused it
    /// as full) to [`unpop`](Relay::unpop) with
    /// [`with_value`](Self::with_value).
    pub fn split(self) -> (T, Drained<()>) {
        (self.value, Drained { value: (), ops: self.ops, bytes: self.bytes })
    }

    /// The same entry holding `value` instead: what
    /// [`split`](Self::split) took out.
    #[must_use]
    pub fn with_value<U>(self, value: U) -> Drained<U> {
        Drained { value, ops: self.ops, bytes: self.bytes }
    }
}

impl<T, M: MergePolicy<T>> Relay<T, M> {
    /// An empty relay folding under `policy`, bounded by `backpressure` in
    /// entries.
    ///
    /// # Errors
    /// [`RelayConfigError`]: a high mark of 0, a low mark not below it,
    /// `Conflate` with a policy that does not conflate, or a bound in bytes
    /// (which needs a weigher: [`weighed`](Self::weighed)).
    pub fn new(policy: M, backpressure: Backpressure) -> Result<Self, RelayConfigError> {
        if backpressure.bytes.is_some() {
            return Err(RelayConfigError::NoWeigher);
        }
        Self::weighed(policy, backpressure, |_| 0)
    }

    /// An empty relay folding under `policy`, bounded by `backpressure`,
    /// each entry weighing what `weigh` says (its bytes: called on each op,
    /// and on each fold, only with a bound in bytes; it must say the same
    /// of the same value).
    ///
    /// # Errors
    /// [`RelayConfigError`]: a high mark of 0, a low mark not below it, or
    /// `Conflate` with a policy that does not conflate.
    pub fn weighed(policy: M, backpressure: Backpressure, weigh: fn(&T) -> u64) -> Result<Self, RelayConfigError> {
        backpressure.check(M::CONFLATES)?;
        let mode = if backpressure.bytes.is_some() { WEIGHS } else { 0 }
            | if backpressure.overflow == Overflow::Conflate { CONFLATES } else { 0 };
        Ok(Relay {
            policy,
            bounds: backpressure,
            weigh,
            window: VecDeque::new(),
            weights: VecDeque::new(),
            bytes: 0,
            mode,
            room: if mode & WEIGHS == 0 { backpressure.count.high } else { 0 },
            drained_below: 0,
            cold: 0,
            returned: 0,
            counters: Counters::default(),
        })
    }

    /// Takes `op`: as a new entry if it fits, else as the overflow action
    /// says (see the rules).
    ///
    /// # Errors
    /// [`SendRefused`], with the op: blocked, or too large.
    #[inline(always)]
    pub fn send(&mut self, op: T) -> Result<Sent, SendRefused<T>> {
        // The two common cases without a bound in bytes, inlined: an op
        // that fits, and an op folded into a full conflating relay.
        let len = self.window.len();
        if (len as u64) < self.room {
            self.window.push_back(Entry { value: op, ops: 1 });
            self.counters.pushed = self.counters.pushed.wrapping_add(1);
            if len as u64 + 1 >= self.room {
                self.set_full(true);
            }
            return Ok(Sent::Accepted);
        }
        if self.mode & (FULL | WEIGHS | CONFLATES) == FULL | CONFLATES
            && len > self.returned
            && let Some(back) = self.window.back_mut()
        {
            // The counts move only once the merge returned.
            self.policy.merge(&mut back.value, op);
            back.ops = back.ops.wrapping_add(1);
            self.counters.conflated = self.counters.conflated.wrapping_add(1);
            return Ok(Sent::Conflated);
        }
        self.send_slow(op)
    }

    /// [`send`](Self::send), every case.
    #[inline(never)]
    fn send_slow(&mut self, op: T) -> Result<Sent, SendRefused<T>> {
        let weight = match self.bounds.bytes {
            None => 0,
            Some(Water { high: limit, .. }) => {
                let weight = (self.weigh)(&op);
                if weight > limit {
                    return Err(SendRefused::TooLarge { op, bytes: weight, limit });
                }
                weight
            }
        };
        if !self.is_full() && self.fits(weight) {
            self.push(op, weight);
            if self.at_high() {
                self.set_full(true);
            }
            return Ok(Sent::Accepted);
        }
        // Full from here on, set once the action's own work is done: an
        // entry dropped by `DropOldest` runs user code (its `Drop`), and a
        // panic there must not leave an empty relay full.
        match self.bounds.overflow {
            Overflow::Block => {
                self.set_full(true);
                self.counters.blocked = self.counters.blocked.wrapping_add(1);
                Err(SendRefused::Blocked(op))
            }
            Overflow::DropNewest => {
                self.set_full(true);
                self.counters.dropped_new = self.counters.dropped_new.wrapping_add(1);
                Ok(Sent::Dropped)
            }
            Overflow::DropOldest => {
                let mut ops = 0u64;
                while !self.fits(weight) {
                    let Some((entry, _)) = self.take_front() else { break };
                    // Counted before the entry drops (its `Drop` may panic),
                    // and an empty relay is not full.
                    ops = ops.wrapping_add(entry.ops);
                    self.counters.dropped_held = self.counters.dropped_held.wrapping_add(entry.ops);
                    if self.window.is_empty() {
                        self.set_full(false);
                    }
                }
                self.push(op, weight);
                self.set_full(true);
                Ok(Sent::DroppedOldest { ops })
            }
            Overflow::Conflate => {
                self.set_full(true);
                Ok(self.conflate(op, weight))
            }
            Overflow::Spill => {
                self.set_full(true);
                Err(SendRefused::MustSpill(op))
            }
        }
    }

    /// Takes every entry out as one page to be written to storage (for
    /// [`Overflow::Spill`], or before a process stops), but those put back
    /// while ops are cold (older than the cold ops, they stay in front):
    /// folded into one entry first under a policy that conflates (newest
    /// into older, as a conflating overflow folds). Its ops count as
    /// spilled and cold (the cold count saturates); the relay is not full.
    /// `None` when it holds nothing to take.
    ///
    /// A fold that panics (the policy's, the weigher's) loses the newer
    /// entry, counted as dropped, and takes nothing out.
    pub fn spill(&mut self) -> Option<SpillPage<T>> {
        let first = self.returned;
        if M::CONFLATES {
            while self.window.len() > first + 1 {
                let Some((newest, _)) = self.take_back() else { break };
                self.counters.dropped_held = self.counters.dropped_held.wrapping_add(newest.ops);
                let ops = newest.ops;
                self.merge_into_back(newest.value, ops);
                self.counters.dropped_held = self.counters.dropped_held.wrapping_sub(ops);
            }
        }
        if self.window.len() <= first {
            return None;
        }
        let mut ops = 0u64;
        let weights: Vec<u64> = if self.weighs() { self.weights.drain(first..).collect() } else { Vec::new() };
        let entries: Vec<Drained<T>> = self
            .window
            .drain(first..)
            .enumerate()
            .map(|(i, e)| {
                ops = ops.wrapping_add(e.ops);
                Drained { value: e.value, ops: e.ops, bytes: weights.get(i).copied().unwrap_or(0) }
            })
            .collect();
        self.bytes -= weights.iter().map(|&w| u128::from(w)).sum::<u128>();
        self.set_full(false);
        // Saturating, as `restore_cold`: a count at the ceiling stays
        // there (wrapped, it would let the entries overtake the pages).
        self.set_cold(self.cold.saturating_add(ops));
        self.counters.spilled = self.counters.spilled.wrapping_add(ops);
        Some(SpillPage { entries, ops })
    }

    /// Puts back a page [`spill`](Self::spill) took, in front (behind
    /// the entries put back while ops were cold), when it could not be
    /// written: as it was taken out (under a policy that conflates, one
    /// entry folding the page's ops), and full (a relay is asked to spill
    /// when full). Only a page this relay's `spill` took, once (as
    /// [`unpop`](Self::unpop)).
    pub fn unspill(&mut self, page: SpillPage<T>) {
        let cold = self.cold.saturating_sub(page.ops);
        self.counters.spilled = self.counters.spilled.wrapping_sub(page.ops);
        // Behind the entries put back while cold, which the spill left.
        for entry in page.entries.into_iter().rev() {
            if self.weighs() {
                self.bytes += u128::from(entry.bytes);
                self.weights.insert(self.returned, entry.bytes);
            }
            self.window.insert(self.returned, Entry { value: entry.value, ops: entry.ops });
        }
        self.set_cold(cold);
        self.set_full(true);
    }

    /// Counts `ops` cold ops (written out by this relay, or found stored
    /// by a restart) as replayed into the stream: drained. At most the
    /// cold ops count; the rest is ignored. Once none is cold,
    /// [`pop`](Self::pop) takes the entries again.
    pub fn replayed(&mut self, ops: u64) {
        let ops = self.take_cold(ops);
        self.counters.replayed = self.counters.replayed.wrapping_add(ops);
    }

    /// Counts `ops` cold ops as lost: the storage no longer holds them
    /// (deleted under the relay). Counted as dropped; at most the cold ops
    /// count.
    pub fn lost(&mut self, ops: u64) {
        let ops = self.take_cold(ops);
        self.counters.lost = self.counters.lost.wrapping_add(ops);
    }

    /// Takes at most `ops` off the cold count: how many it took. Once none
    /// is cold, no entry is older than the cold ops any more.
    fn take_cold(&mut self, ops: u64) -> u64 {
        let ops = ops.min(self.cold);
        self.set_cold(self.cold - ops);
        ops
    }

    /// Adds `ops` ops a restart found written out (by an earlier relay)
    /// to the cold ops: they go before every entry (saturating).
    pub fn restore_cold(&mut self, ops: u64) {
        self.set_cold(self.cold.saturating_add(ops));
    }

    /// The cold count, and the mode's bit: once none is cold, no entry is
    /// older than the cold ops any more.
    fn set_cold(&mut self, cold: u64) {
        self.cold = cold;
        if cold == 0 {
            self.returned = 0;
            self.mode &= !COLD;
        } else {
            self.mode |= COLD;
        }
    }

    /// Ops written out and not yet replayed: while any is, `pop` takes
    /// nothing.
    #[must_use]
    pub const fn cold(&self) -> u64 {
        self.cold
    }

    /// Takes the oldest entry: the drain's next value, with how many ops
    /// it folds. The relay stops being full once this takes it down to
    /// every low water mark. While any op is [`cold`](Self::cold), only an
    /// entry put back meanwhile (older than every cold op): the pages go
    /// before the rest.
    #[inline]
    pub fn pop(&mut self) -> Option<Drained<T>> {
        // The common case, inlined: nothing cold, no bound in bytes (and so
        // no entry put back while cold, and no weight).
        if self.mode & (COLD | WEIGHS) != 0 {
            return self.pop_slow();
        }
        let entry = self.window.pop_front()?;
        self.counters.drained = self.counters.drained.wrapping_add(entry.ops);
        if (self.window.len() as u64) < self.drained_below {
            self.set_full(false);
        }
        Some(Drained { value: entry.value, ops: entry.ops, bytes: 0 })
    }

    /// [`pop`](Self::pop), every case.
    #[inline(never)]
    fn pop_slow(&mut self) -> Option<Drained<T>> {
        if self.cold != 0 && self.returned == 0 {
            return None;
        }
        let (entry, bytes) = self.take_front()?;
        self.counters.drained = self.counters.drained.wrapping_add(entry.ops);
        if self.is_full() && self.at_low() {
            self.set_full(false);
        }
        Some(Drained { value: entry.value, ops: entry.ops, bytes })
    }

    /// Puts back an entry [`pop`](Self::pop) took, in front, when the
    /// drain could not deliver it after all (its stream was full): as if
    /// it had not been taken, but for whether the relay is full, which
    /// stays as the pop left it. Only an entry this relay's `pop` took,
    /// once: another relay's entry, or one put back twice, leaves the
    /// counters wrong (the drained count wraps).
    ///
    /// While ops are cold (a spill since the pop), the entry is older than
    /// every one of them: it goes first, before the pages, and no spill or
    /// fold takes it.
    pub fn unpop(&mut self, drained: Drained<T>) {
        self.counters.drained = self.counters.drained.wrapping_sub(drained.ops);
        if self.weighs() {
            self.bytes += u128::from(drained.bytes);
            self.weights.push_front(drained.bytes);
        }
        self.window.push_front(Entry { value: drained.value, ops: drained.ops });
        if self.cold != 0 {
            self.returned += 1;
        }
    }

    /// The oldest entry's value, if any (what [`pop`](Self::pop) would
    /// take).
    #[must_use]
    pub fn front(&self) -> Option<&T> {
        self.window.front().map(|e| &e.value)
    }

    /// The entries' values, oldest first.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &T> {
        self.window.iter().map(|e| &e.value)
    }

    /// Whether the relay holds nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.window.is_empty()
    }

    /// What the relay holds and has done.
    #[must_use]
    pub fn stats(&self) -> RelayStats {
        let c = self.counters;
        RelayStats {
            depth: self.window.len() as u64,
            ops: c.held(),
            bytes: u64::try_from(self.bytes).unwrap_or(u64::MAX),
            full: self.is_full(),
            accepted: c.accepted(),
            conflated: c.conflated,
            dropped: c.dropped_new.wrapping_add(c.dropped_held).wrapping_add(c.lost),
            blocked: c.blocked,
            drained: c.drained.wrapping_add(c.replayed),
            spilled: c.spilled,
            cold: self.cold,
        }
    }

    /// The bounds and overflow action.
    #[must_use]
    pub const fn backpressure(&self) -> &Backpressure {
        &self.bounds
    }

    /// The merge policy.
    #[must_use]
    pub const fn policy(&self) -> &M {
        &self.policy
    }

    /// Whether one more entry of `weight` stays within every high mark.
    fn fits(&self, weight: u64) -> bool {
        let count = (self.window.len() as u64) < self.bounds.count.high;
        count && self.bounds.bytes.is_none_or(|b| self.bytes + u128::from(weight) <= u128::from(b.high))
    }

    /// Whether the relay holds a high mark.
    fn at_high(&self) -> bool {
        self.window.len() as u64 >= self.bounds.count.high
            || self.bounds.bytes.is_some_and(|b| self.bytes >= u128::from(b.high))
    }

    /// Whether the relay is down to every low mark.
    fn at_low(&self) -> bool {
        self.window.len() as u64 <= self.bounds.count.low
            && self.bounds.bytes.is_none_or(|b| self.bytes <= u128::from(b.low))
    }

    /// Whether the relay keeps its entries' weights: it has a bound in
    /// bytes.
    #[inline(always)]
    const fn weighs(&self) -> bool {
        self.mode & WEIGHS != 0
    }

    /// Whether the relay is full (the hysteresis rule).
    #[inline(always)]
    const fn is_full(&self) -> bool {
        self.mode & FULL != 0
    }

    /// Makes the relay full or not, and `room` with it.
    #[inline(always)]
    fn set_full(&mut self, full: bool) {
        if full {
            self.mode |= FULL;
            self.room = 0;
            if self.mode & WEIGHS == 0 {
                // Below the high mark, which is at most `u64::MAX`.
                self.drained_below = self.bounds.count.low + 1;
            }
        } else {
            self.mode &= !FULL;
            self.drained_below = 0;
            if self.mode & WEIGHS == 0 {
                self.room = self.bounds.count.high;
            }
        }
    }

    /// `op` as the newest entry, of `weight` (kept with a bound in bytes).
    #[inline(always)]
    fn push(&mut self, op: T, weight: u64) {
        self.window.push_back(Entry { value: op, ops: 1 });
        if self.weighs() {
            self.weights.push_back(weight);
            self.bytes += u128::from(weight);
        }
        self.counters.pushed = self.counters.pushed.wrapping_add(1);
    }

    /// The oldest entry out, with its weight (0 without a bound in bytes).
    #[inline(always)]
    fn take_front(&mut self) -> Option<(Entry<T>, u64)> {
        let entry = self.window.pop_front()?;
        let mut weight = 0;
        if self.weighs() {
            weight = self.weights.pop_front().unwrap_or(0);
            self.bytes -= u128::from(weight);
        }
        self.returned = self.returned.saturating_sub(1);
        Some((entry, weight))
    }

    /// The newest entry out, with its weight (0 without a bound in bytes).
    fn take_back(&mut self) -> Option<(Entry<T>, u64)> {
        let entry = self.window.pop_back()?;
        let mut weight = 0;
        if self.weighs() {
            weight = self.weights.pop_back().unwrap_or(0);
            self.bytes -= u128::from(weight);
        }
        Some((entry, weight))
    }

    /// Folds `op` into the newest entry, then the newest entries together
    /// while the relay is above its high mark in bytes.
    fn conflate(&mut self, op: T, weight: u64) -> Sent {
        if self.window.len() <= self.returned {
            // Every entry held was put back while ops are cold: older than
            // them, it takes no newer op (which goes behind the pages).
            // (An empty relay is not reached: a full relay holds an entry,
            // as it is full only once it held a high mark, or an op did
            // not fit, which an empty one always does, and a drain to
            // empty clears it; a `DropOldest` that empties it pushes its
            // op before it is full.)
            self.push(op, weight);
            return Sent::Accepted;
        }
        self.merge_into_back(op, 1);
        self.counters.conflated = self.counters.conflated.wrapping_add(1);
        if let Some(Water { high, .. }) = self.bounds.bytes {
            while self.window.len() > self.returned + 1 && self.bytes > u128::from(high) {
                let Some((newest, _)) = self.take_back() else { break };
                // Counted as dropped until the fold returns: a fold that
                // panics loses the entry, and the counts say so.
                self.counters.dropped_held = self.counters.dropped_held.wrapping_add(newest.ops);
                let ops = newest.ops;
                self.merge_into_back(newest.value, ops);
                self.counters.dropped_held = self.counters.dropped_held.wrapping_sub(ops);
            }
        }
        Sent::Conflated
    }

    /// Folds `value`, which holds `ops` ops, into the newest entry, and
    /// weighs the result (with a bound in bytes). The counts change only
    /// once the merge (and the weigher) returned.
    fn merge_into_back(&mut self, value: T, ops: u64) {
        let Some(back) = self.window.back_mut() else { return };
        self.policy.merge(&mut back.value, value);
        if self.mode & WEIGHS != 0 {
            let weight = (self.weigh)(&back.value);
            if let Some(kept) = self.weights.back_mut() {
                self.bytes = self.bytes - u128::from(*kept) + u128::from(weight);
                *kept = weight;
            }
        }
        back.ops = back.ops.wrapping_add(ops);
    }
}

impl<T, M> std::fmt::Debug for Relay<T, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("depth", &self.window.len())
            .field("ops", &self.counters.held())
            .field("bytes", &self.bytes)
            .field("full", &(self.mode & FULL != 0))
            .field("cold", &self.cold)
            .field("backpressure", &self.bounds)
            .finish_non_exhaustive()
    }
}
