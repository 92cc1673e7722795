//! Signals: writable sources.

use std::any::TypeId;
use std::panic::Location;

use crate::context::{Foreign, Handle, NodeRef};
use crate::error::{NodeKind, ReadError, WriteError};
use crate::flavor::{Entered, Flavor, Holds, HoldsEq, Token, ValueCell};
use crate::graph::{Graph, NONE, NodeObj, Pool, aux_slot, flags::*, signal_aux};
use crate::run;

/// A writable source of the graph.
///
/// Reads inside a computation (a computed or an effect) are tracked: the
/// computation re-runs when the value changes. Reads elsewhere, or through
/// `get_untracked`, are plain reads.
///
/// ```
/// use egress_reactive::Context;
///
/// let cx = Context::new();
/// let name = cx.signal(String::from("ada"));
/// name.update(|n| n.make_ascii_uppercase());
/// assert_eq!(name.get(), "ADA");
/// name.with(|n| assert_eq!(n.len(), 3));
/// ```
pub struct Signal<T: 'static, F: Flavor> {
    node: NodeRef<F>,
    block: F::Ptr<SignalBlock<T, F>>,
    slot: u32,
}

impl<T: 'static, F: Flavor> std::ops::Deref for Signal<T, F> {
    type Target = NodeRef<F>;
    fn deref(&self) -> &NodeRef<F> {
        &self.node
    }
}

/// A block of value slots for signals of one value type, shared by the
/// graph (which holds each block once for all its live signals, each
/// signal's node naming its block and slot) and by the signals' handles.
///
/// Signals take their slots in order from the current block of their type
/// and never reuse one, so a handle's slot stays its own (with the place it
/// was created, for messages about a disposed signal) for as long as the
/// handle lives. A disposed signal's value is dropped at once; its emptied
/// slot goes with its block, when every signal of the block is disposed and
/// its handles are dropped. Blocks hold up to [`SignalBlock::MAX_SLOTS`]
/// slots and at most about [`SignalBlock::MAX_BYTES`], so a surviving handle
/// keeps at most that much of emptied slots alive.
///
/// Creating a signal therefore allocates nothing on the heap but, once per
/// block, the block; nor does it count a pointer for the graph.
#[doc(hidden)]
pub struct SignalBlock<T: 'static, F: Flavor> {
    slots: Box<[F::Cell<Slot<T>>]>,
}

/// One signal's slot.
struct Slot<T> {
    created_at: &'static Location<'static>,
    /// `None` before the slot is taken and once its signal is disposed.
    state: Option<SignalState<T>>,
}

/// An equality test.
type Eq<T> = fn(&T, &T) -> bool;

struct SignalState<T> {
    value: T,
    /// The value the current batch replaced, and how to compare with it.
    replaced: Option<(T, Eq<T>)>,
    /// A write in the current batch that cannot be compared (in place, or
    /// unchecked): the batch notifies whatever the final value.
    forced: bool,
}

impl<T: 'static, F: Flavor> SignalBlock<T, F> {
    /// The most slots a block holds (as many as a node's `aux` names).
    pub const MAX_SLOTS: usize = crate::graph::MAX_SLOTS;
    /// The most bytes of slots a block holds, unless one slot is larger.
    pub const MAX_BYTES: usize = 4096;
    /// The slots of the first block of a type.
    const FIRST_SLOTS: usize = 4;

    /// A block with room for `len` signals, none taken.
    fn new(len: usize) -> Self {
        let empty = || ValueCell::new(Slot { created_at: Location::caller(), state: None });
        SignalBlock { slots: (0..len).map(|_| empty()).collect() }
    }

    /// How many slots the block after one of `len` slots holds: twice as
    /// many, within the bounds.
    fn next_len(len: usize) -> usize {
        let max = (Self::MAX_BYTES / std::mem::size_of::<F::Cell<Slot<T>>>().max(1)).clamp(1, Self::MAX_SLOTS);
        (len * 2).clamp(Self::FIRST_SLOTS.min(max), max)
    }

    #[inline(always)]
    fn slot(&self, slot: u32) -> &F::Cell<Slot<T>> {
        &self.slots[slot as usize]
    }
}

impl<T> Slot<T> {
    #[inline(always)]
    fn state(&mut self) -> &mut SignalState<T> {
        self.state.as_mut().expect("graph invariant: a live signal's slot holds its value")
    }

    #[inline(always)]
    fn value(&self) -> &T {
        &self.state.as_ref().expect("graph invariant: a live signal's slot holds its value").value
    }
}

impl<T: 'static, F: Flavor> NodeObj for SignalBlock<T, F> {
    fn run(&self, _: &Entered) -> bool {
        false
    }

    fn settle(&self, entered: &Entered, aux: u32, own: Option<&dyn std::any::Any>) -> bool {
        self.slot(aux_slot(aux)).with_mut(entered, |s| {
            let s = s.state();
            let forced = std::mem::take(&mut s.forced);
            match s.replaced.take() {
                Some((old, eq)) => {
                    forced
                        || match own {
                            None => !eq(&old, &s.value),
                            Some(own) => !same_by_own::<T, F>(own, &old, &s.value),
                        }
                }
                None => true,
            }
        })
    }

    /// Drops the signal's value. While the value is lent out (the graph
    /// closed from inside the signal's own equality, which holds it), it
    /// stays in the slot: the slot's next signal, or the block's drop,
    /// drops it.
    fn release(&self, entered: &Entered, aux: u32) {
        let state = self.slot(aux_slot(aux)).try_with_mut(entered, |s| s.state.take());
        drop(state);
    }
}

/// A signal's own equality, erased as the graph keeps it, applied.
#[cold]
#[inline(never)]
fn same_by_own<T: 'static, F: Flavor>(own: &dyn std::any::Any, old: &T, new: &T) -> bool {
    let own = own.downcast_ref::<F::EqFn<T>>().expect("graph invariant: a signal's equality is of its type");
    F::same(own, old, new)
}

impl<T: 'static, F: Flavor> Clone for Signal<T, F> {
    fn clone(&self) -> Self {
        Signal { node: self.node.clone(), block: self.block.clone(), slot: self.slot }
    }
}

impl<T: 'static, F: Flavor> std::fmt::Debug for Signal<T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signal").field("created_at", &self.created_at()).finish_non_exhaustive()
    }
}

impl<F: Flavor> Handle<F> {
    /// A new signal holding `value`, owned by the current owner. In a
    /// context that was dropped, the signal is born disposed (and `value`
    /// dropped at once).
    #[track_caller]
    #[inline(always)]
    pub fn signal<T: 'static>(&self, value: T) -> Signal<T, F>
    where
        F: Holds<SignalBlock<T, F>>,
    {
        self.make_signal(value, None, Location::caller())
    }

    /// A new signal whose writes compare with `same(old, new)` instead of
    /// `PartialEq`: a [`set`](Signal::set) for which it returns true
    /// changes nothing (the old value is kept) and notifies nothing, and a
    /// batch that ends on a value it finds the same as the one the batch
    /// began with notifies nothing. A panic in `same` during `set` leaves
    /// the value unchanged; at the end of a batch it counts as a change.
    /// `same` is lent the signal's values: reading or writing the signal
    /// itself from inside it panics (the value is borrowed), which counts
    /// as such a panic.
    ///
    /// The equality is kept beside the graph, not in the signal's slot:
    /// signals without one pay nothing for the feature. It may close the
    /// graph (drop the last context, tests/close_inside.rs): the signal's
    /// value, lent to it then, is dropped later (when the slot is taken
    /// again, or with the graph's memory).
    ///
    /// ```
    /// use egress_reactive::Context;
    ///
    /// let cx = Context::new();
    /// let position = cx.signal_with((0.0_f64, 0.0_f64), |a, b| (a.0 - b.0).hypot(a.1 - b.1) < 1.0);
    /// position.set((0.3, 0.4));
    /// assert_eq!(position.get(), (0.0, 0.0), "moved less than 1: unchanged");
    /// position.set((3.0, 4.0));
    /// assert_eq!(position.get(), (3.0, 4.0));
    /// ```
    #[track_caller]
    pub fn signal_with<T: 'static, E>(&self, value: T, same: E) -> Signal<T, F>
    where
        E: Fn(&T, &T) -> bool + 'static,
        F: Holds<SignalBlock<T, F>> + HoldsEq<T, E>,
    {
        self.make_signal(value, Some(F::erase_eq(same)), Location::caller())
    }

    #[inline(always)]
    fn make_signal<T: 'static>(
        &self,
        value: T,
        same: Option<F::Ptr<F::Any>>,
        created_at: &'static Location<'static>,
    ) -> Signal<T, F>
    where
        F: Holds<SignalBlock<T, F>>,
    {
        let Some(guard) = F::enter(&self.rt.cell, Token(())) else { Foreign.panic() };
        let cell: &run::Cell<F> = &guard;
        let mut g = cell.borrow_mut();
        let mut retired = None;
        let (block, held, slot) = take_slot::<T, F>(&mut g, &mut retired);
        let created = g.create(SIGNAL | VALUED, None, signal_aux(held, slot), created_at);
        let key = match created {
            Ok(key) => {
                if let Some(same) = same {
                    g.node_mut(key.index).flags |= CUSTOM_EQ;
                    g.equalities.insert(key.index, same);
                }
                key
            }
            Err((dead, _)) => {
                // A dropped context: the slot stays empty (it still names
                // where the signal was created), the value goes now. The
                // slot, never a live signal's, is freed at once.
                let freed = g.blocks.uncount(held);
                drop(g);
                drop(freed);
                block.slot(slot).with_mut(&Entered::by(cell), |s| s.created_at = created_at);
                drop(value);
                drop_retired::<F>(retired);
                let outermost = F::leave(guard);
                self.after(outermost);
                return Signal { node: NodeRef { handle: self.clone(), key: dead }, block, slot };
            }
        };
        drop(g);
        // No user code ran since the slot was taken: moving `value` in runs
        // none either.
        let state = SignalState { value, replaced: None, forced: false };
        block.slot(slot).with_mut(&Entered::by(cell), |s| *s = Slot { created_at, state: Some(state) });
        // The block the type's pool left, if nothing counts in it now: its
        // drop may run a value's destructor (one left in its slot, lent out
        // when its signal was disposed), so only now, with the signal made.
        drop_retired::<F>(retired);
        let outermost = F::leave(guard);
        self.after(outermost);
        Signal { node: NodeRef { handle: self.clone(), key }, block, slot }
    }
}

/// A slot a signal took: its block (for the signal's handle), the block's
/// number in [`Graph::blocks`], and the slot.
type Taken<T, F> = (<F as Flavor>::Ptr<SignalBlock<T, F>>, u32, u32);

/// A block that stopped being its type's current one when nothing counted
/// in it any more (every signal of it was disposed): dropped outside the
/// graph's borrow, as its drop may run a value's destructor.
type Retired<F> = (<F as Flavor>::Obj, Box<<F as Flavor>::Any>);

/// Drops `retired`, if a block was, out of line: rarely one is.
#[inline(always)]
fn drop_retired<F: Flavor>(retired: Option<Retired<F>>) {
    #[cold]
    #[inline(never)]
    fn drop_block<F: Flavor>(retired: Retired<F>) {
        drop(retired);
    }
    if let Some(retired) = retired {
        drop_block::<F>(retired);
    }
}

/// A free slot for a signal of type `T`: the next one of the current block
/// of that type, or the first of a new block ([`new_block`], which may
/// retire the block it replaces).
#[inline(always)]
fn take_slot<T: 'static, F: Holds<SignalBlock<T, F>>>(
    g: &mut Graph<F>,
    retired: &mut Option<Retired<F>>,
) -> Taken<T, F> {
    let type_id = TypeId::of::<SignalBlock<T, F>>();
    if let Some(pool) = g.pools.iter_mut().find(|p| p.type_id == type_id) {
        let block = F::downcast::<F::Ptr<SignalBlock<T, F>>>(&pool.block)
            .expect("graph invariant: a pool holds blocks of its own type");
        if (pool.used as usize) < block.slots.len() {
            let slot = pool.used;
            pool.used += 1;
            return (block.clone(), pool.held, slot);
        }
    }
    new_block(g, retired)
}

/// [`take_slot`] when the current block of `T` is full, or there is none:
/// the first slot of a new block, which becomes the current one. The block
/// it replaces goes to `retired` if nothing counts in it any more.
#[cold]
#[inline(never)]
fn new_block<T: 'static, F: Holds<SignalBlock<T, F>>>(
    g: &mut Graph<F>,
    retired: &mut Option<Retired<F>>,
) -> Taken<T, F> {
    let type_id = TypeId::of::<SignalBlock<T, F>>();
    let pool = g.pools.iter().position(|p| p.type_id == type_id);
    let len = pool
        .and_then(|i| F::downcast::<F::Ptr<SignalBlock<T, F>>>(&g.pools[i].block))
        .map_or(0, |block| block.slots.len());
    let block = F::ptr(SignalBlock::new(SignalBlock::<T, F>::next_len(len)));
    let slots = u32::try_from(block.slots.len()).expect("a block has at most 64 slots");
    let held = g.blocks.hold(F::erase(block.clone()), slots);
    let fresh = Pool { type_id, block: F::erase_any(block.clone()), held, used: 1 };
    match pool {
        Some(i) => {
            let old = std::mem::replace(&mut g.pools[i], fresh);
            // The pool counted in its block; its signals may count still.
            *retired = g.blocks.uncount(old.held).map(|obj| (obj, old.block));
        }
        None => g.pools.push(fresh),
    }
    (block, held, 0)
}

impl<T: 'static, F: Flavor> Signal<T, F> {
    /// The value, cloned; tracked.
    ///
    /// # Panics
    /// If the signal was disposed (the message names where it was created).
    #[track_caller]
    pub fn get(&self) -> T
    where
        T: Clone,
    {
        self.with(T::clone)
    }

    /// The value, cloned; tracked. Fails if the signal was disposed.
    pub fn try_get(&self) -> Result<T, ReadError>
    where
        T: Clone,
    {
        self.try_with(T::clone)
    }

    /// Calls `f` with a reference to the value; tracked.
    ///
    /// # Panics
    /// If the signal was disposed.
    #[track_caller]
    pub fn with<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        match self.try_with(f) {
            Ok(r) => r,
            Err(e) => read_failed(e, Location::caller()),
        }
    }

    /// Calls `f` with a reference to the value; tracked. Fails if the signal
    /// was disposed.
    pub fn try_with<R>(&self, f: impl FnOnce(&T) -> R) -> Result<R, ReadError> {
        self.handle
            .try_enter(|cell| {
                {
                    let mut g = cell.borrow_mut();
                    if !g.alive(self.key) {
                        drop(g);
                        return Err(self.disposed(cell));
                    }
                    let active = g.active;
                    if active != NONE {
                        g.link(self.key.index, active);
                    }
                }
                Ok(self.block.slot(self.slot).with(&Entered::by(cell), |s| f(s.value())))
            })
            .unwrap_or(Err(ReadError::ForeignGraph { kind: NodeKind::Signal }))
    }

    /// Reads for an explicit observer (an async effect's run).
    #[cfg(feature = "async")]
    pub(crate) fn read_observed(&self, observer: crate::graph::Key) -> Result<T, ReadError>
    where
        T: Clone,
    {
        self.handle
            .try_enter(|cell| {
                {
                    let mut g = cell.borrow_mut();
                    if !g.alive(self.key) {
                        drop(g);
                        return Err(self.disposed(cell));
                    }
                    // A disposed observer tracks nothing (its slot may be
                    // another node's now).
                    if g.alive(observer) {
                        g.link(self.key.index, observer.index);
                    }
                }
                Ok(self.block.slot(self.slot).with(&Entered::by(cell), |s| s.value().clone()))
            })
            .unwrap_or(Err(ReadError::ForeignGraph { kind: NodeKind::Signal }))
    }

    /// The value, cloned, without tracking (a peek).
    #[track_caller]
    pub fn get_untracked(&self) -> T
    where
        T: Clone,
    {
        self.with_untracked(T::clone)
    }

    /// Calls `f` with a reference to the value, without tracking.
    #[track_caller]
    pub fn with_untracked<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        let at = Location::caller();
        self.handle.enter(|cell| {
            if !cell.borrow().alive(self.key) {
                panic!("{} (read at {at})", self.disposed(cell));
            }
            self.block.slot(self.slot).with(&Entered::by(cell), |s| f(s.value()))
        })
    }

    /// Sets the value. A value equal to the current one notifies nothing
    /// (equality cut-off). Outside a batch, effects run before this returns.
    ///
    /// # Panics
    /// If the signal was disposed, or the effects this write triggers do not
    /// settle; [`Signal::try_set`] returns those as errors.
    #[track_caller]
    pub fn set(&self, value: T)
    where
        T: PartialEq,
    {
        if let Err(e) = self.try_set(value) {
            panic!("{e} (write at {})", Location::caller());
        }
    }

    /// [`Signal::set`], returning failures as errors. A disposed signal is
    /// left unchanged; on [`WriteError::Loop`] the value was written.
    pub fn try_set(&self, value: T) -> Result<(), WriteError>
    where
        T: PartialEq,
    {
        self.write(move |s, batching, own| {
            let same = match own {
                Some(own) => F::same(own, &s.value, &value),
                None => s.value == value,
            };
            if same {
                return false;
            }
            let old = std::mem::replace(&mut s.value, value);
            if batching && s.replaced.is_none() && !s.forced {
                s.replaced = Some((old, T::eq));
            }
            true
        })
    }

    /// Sets the value and notifies, without comparing.
    #[track_caller]
    pub fn set_unchecked(&self, value: T) {
        self.update(move |v| *v = value);
    }

    /// Updates the value in place and notifies (no comparison).
    ///
    /// # Panics
    /// As [`Signal::set`].
    #[track_caller]
    pub fn update(&self, f: impl FnOnce(&mut T)) {
        if let Err(e) = self.try_update(f) {
            panic!("{e} (write at {})", Location::caller());
        }
    }

    /// [`Signal::update`], returning failures as errors.
    pub fn try_update(&self, f: impl FnOnce(&mut T)) -> Result<(), WriteError> {
        self.write(move |s, batching, _| {
            f(&mut s.value);
            if batching {
                s.forced = true;
            }
            true
        })
    }

    fn write(&self, f: impl FnOnce(&mut SignalState<T>, bool, Option<&F::EqFn<T>>) -> bool) -> Result<(), WriteError> {
        let written = self.handle.try_enter(|cell| {
            let (batching, custom) = {
                let g = cell.borrow();
                if !g.alive(self.key) {
                    drop(g);
                    return Err(WriteError::Disposed { created_at: self.created_at_in(cell) });
                }
                (g.batching(), g.node(self.key.index).flags & CUSTOM_EQ != 0)
            };
            let changed = if custom {
                let own = self.own_eq(cell);
                let own = own.as_ref().and_then(|eq| F::any(eq).downcast_ref::<F::EqFn<T>>());
                self.block.slot(self.slot).with_mut(&Entered::by(cell), |s| f(s.state(), batching, own))
            } else {
                self.block.slot(self.slot).with_mut(&Entered::by(cell), |s| f(s.state(), batching, None))
            };
            if !changed {
                return Ok(());
            }
            let mut g = cell.borrow_mut();
            if batching {
                let node = g.node_mut(self.key.index);
                if node.flags & BATCHED == 0 {
                    node.flags |= BATCHED;
                    g.writes.push(self.key);
                }
                return Ok(());
            }
            g.propagate_inline(self.key.index);
            run::flush_borrowed(cell, g).map_err(WriteError::from)
        });
        written.unwrap_or(Err(WriteError::ForeignGraph))
    }

    /// The signal's own equality (it has one).
    #[cold]
    #[inline(never)]
    fn own_eq(&self, cell: &run::Cell<F>) -> Option<F::Ptr<F::Any>> {
        cell.borrow().equalities.get(&self.key.index).cloned()
    }

    /// Where the signal was created.
    pub fn created_at(&self) -> &'static Location<'static> {
        self.handle.enter(|cell| self.created_at_in(cell))
    }

    fn created_at_in(&self, cell: &run::Cell<F>) -> &'static Location<'static> {
        self.block.slot(self.slot).with(&Entered::by(cell), |s| s.created_at)
    }

    fn disposed(&self, cell: &run::Cell<F>) -> ReadError {
        ReadError::Disposed { kind: NodeKind::Signal, created_at: self.created_at_in(cell) }
    }
}

/// The panic of a plain read that failed; out of line, so the reads
/// themselves stay small.
#[cold]
#[inline(never)]
fn read_failed(e: ReadError, at: &'static Location<'static>) -> ! {
    panic!("{e} (read at {at})")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flavor::Local;

    #[test]
    fn blocks_double_from_four_up_to_their_bounds() {
        let mut len = 0;
        let mut seen = Vec::new();
        for _ in 0..7 {
            len = SignalBlock::<u64, Local>::next_len(len);
            seen.push(len);
        }
        assert_eq!(seen, [4, 8, 16, 32, 64, 64, 64]);
        // A larger value type: as many slots as fit in the byte bound.
        let slot = std::mem::size_of::<std::cell::RefCell<Slot<[u8; 256]>>>();
        let max = SignalBlock::<[u8; 256], Local>::MAX_BYTES / slot;
        assert!((4..8).contains(&max), "a slot of 256-byte values is {slot} bytes");
        assert_eq!(SignalBlock::<[u8; 256], Local>::next_len(0), 4);
        assert_eq!(SignalBlock::<[u8; 256], Local>::next_len(4), max);
        assert_eq!(SignalBlock::<[u8; 256], Local>::next_len(max), max);
        // A value larger than the bound: one slot per block.
        assert_eq!(SignalBlock::<[u8; 10_000], Local>::next_len(0), 1);
        assert_eq!(SignalBlock::<[u8; 10_000], Local>::next_len(1), 1);
    }
}
