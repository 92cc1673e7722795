//! The blocks of signal values the graph holds for its live signals.
//!
//! A signal's value lives in a slot of a block shared by up to 64 signals
//! of its type (`crate::signal::SignalBlock`). The graph needs the block
//! to settle a batched write and to drop a disposed signal's value, so it
//! holds one pointer to each block with a live signal, here, and each
//! signal's node names its block and slot in its `aux` word
//! ([`signal_aux`]). A node holding a pointer of its own instead cost
//! every signal a count up when made and a count down when freed (atomic
//! read-modify-writes in a `ThreadSafeContext`); see docs/benchmarks.md.

use super::{Freed, NONE};
use crate::flavor::Flavor;

/// Bits of a signal's `aux` that hold its slot in its block.
const SLOT_BITS: u32 = 6;

/// The most blocks a graph holds at once (a block's number fills the bits
/// of `aux` its slot leaves).
pub(crate) const MAX_BLOCKS: u32 = 1 << (32 - SLOT_BITS);

/// A signal node's `aux`: block `block` of [`Blocks`] (below
/// [`MAX_BLOCKS`]), slot `slot` in it (below [`MAX_SLOTS`]).
#[inline(always)]
pub(crate) fn signal_aux(block: u32, slot: u32) -> u32 {
    (block << SLOT_BITS) | slot
}

/// The slot in its block of the signal whose `aux` this is.
#[inline(always)]
pub(crate) fn aux_slot(aux: u32) -> u32 {
    aux & ((1 << SLOT_BITS) - 1)
}

/// The block of the signal whose `aux` this is.
#[inline(always)]
pub(crate) fn aux_block(aux: u32) -> u32 {
    aux >> SLOT_BITS
}

/// The most slots [`signal_aux`] can name in a block.
pub(crate) const MAX_SLOTS: usize = 1 << SLOT_BITS;

/// The number of a block that `len` blocks precede, if one may have it.
fn number(len: usize) -> Option<u32> {
    u32::try_from(len).ok().filter(|&i| i < MAX_BLOCKS)
}

/// The blocks held, by number, and a list of the free numbers.
pub(crate) struct Blocks<F: Flavor> {
    held: Vec<Held<F>>,
    /// The first free entry: a list threaded through the free entries'
    /// counts.
    free: u32,
}

/// One entry of [`Blocks`].
struct Held<F: Flavor> {
    /// The block, erased as the node objects are; `None` while free.
    block: Option<F::Obj>,
    /// Held: its slots not yet freed (a slot is freed with its signal;
    /// a slot not yet taken counts), plus one while it is the block new
    /// signals of its type take their slot from (its type's pool's). A
    /// pool takes every slot of its block before it takes another block,
    /// so the count reaches 0 when the pool has left the block and every
    /// signal of it is freed. Counting the slots up front, not the
    /// signals as they come, leaves making a signal nothing to count.
    /// Free: the next free entry.
    count: u32,
}

impl<F: Flavor> Blocks<F> {
    pub(crate) fn new() -> Self {
        Blocks { held: Vec::new(), free: NONE }
    }

    /// Holds `block`, of `slots` slots, a new current block for its type
    /// (counted once for its pool, and once for each slot), and returns
    /// its number.
    ///
    /// # Panics
    /// With [`MAX_BLOCKS`] held already: each held block has a live signal
    /// or is a type's current one, so a graph gets there only with tens of
    /// millions of signals of values too large to share a block.
    pub(crate) fn hold(&mut self, block: F::Obj, slots: u32) -> u32 {
        let fresh = Held { block: Some(block), count: slots + 1 };
        if self.free != NONE {
            let index = self.free;
            self.free = std::mem::replace(&mut self.held[index as usize], fresh).count;
            return index;
        }
        let index = number(self.held.len()).expect("a graph holds fewer than 2^26 blocks of signal values at once");
        self.held.push(fresh);
        index
    }

    /// Held block `index`.
    #[inline(always)]
    pub(crate) fn get(&self, index: u32) -> &F::Obj {
        self.held[index as usize].block.as_ref().expect("graph invariant: a live signal's block is held")
    }

    /// Counts one slot (freed), or the pool (gone on to another block),
    /// less in held block `index`.
    /// Returns the block once nothing counts in it: its entry is then
    /// free, and the caller drops the pointer outside the graph's borrow
    /// (the block's drop may run a value's destructor).
    #[inline(always)]
    pub(crate) fn uncount(&mut self, index: u32) -> Option<F::Obj> {
        let held = &mut self.held[index as usize];
        held.count -= 1;
        if held.count != 0 {
            return None;
        }
        let block = held.block.take();
        held.count = std::mem::replace(&mut self.free, index);
        block
    }

    /// Frees the slot of the signal whose `aux` this is: puts its block
    /// on `freed`, for the caller to release the slot outside the graph's
    /// borrow (the graph's own pointer if the slot was the last thing
    /// counted in the block).
    #[inline(always)]
    pub(crate) fn free_slot(&mut self, aux: u32, freed: &mut Freed<F>) {
        let index = aux_block(aux);
        let held = &mut self.held[index as usize];
        if held.count > 1 {
            held.count -= 1;
            let block = held.block.as_ref().expect("graph invariant: a live signal's block is held");
            freed.push_signal(block, aux);
        } else if let Some(block) = self.uncount(index) {
            freed.push(block, aux);
        }
    }

    /// How many blocks are held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.held.iter().filter(|h| h.block.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;
    use crate::flavor::Local;
    use crate::graph::tests::Inert;
    use crate::graph::{Freed, NodeObj};

    #[test]
    fn a_signals_aux_names_its_block_and_slot_at_the_limits() {
        for (block, slot) in [(0, 0), (1, 63), (MAX_BLOCKS - 1, 0), (MAX_BLOCKS - 1, 63), (12_345, 17)] {
            let aux = signal_aux(block, slot);
            assert_eq!((aux_block(aux), aux_slot(aux)), (block, slot));
        }
        assert_eq!(MAX_SLOTS, 64);
        // The numbers there are: as many as `aux` has room for.
        assert_eq!(number(0), Some(0));
        assert_eq!(number(MAX_BLOCKS as usize - 1), Some(MAX_BLOCKS - 1));
        assert_eq!(number(MAX_BLOCKS as usize), None);
        assert_eq!(number(usize::MAX), None);
    }

    #[test]
    fn a_block_is_held_while_anything_counts_in_it_and_its_number_is_reused() {
        let mut blocks = Blocks::<Local>::new();
        let a: Rc<dyn NodeObj> = Rc::new(Inert);
        // Three slots, and the pool.
        let first = blocks.hold(a.clone(), 3);
        assert_eq!(Rc::strong_count(&a), 2, "one pointer for the block, however many slots");
        let mut freed = Freed::new();
        blocks.free_slot(signal_aux(first, 0), &mut freed);
        blocks.free_slot(signal_aux(first, 1), &mut freed);
        assert_eq!(Rc::strong_count(&a), 3, "one copy for the two freed signals");
        let items: Vec<_> = freed.drain().collect();
        assert!(items[0].0.as_ref().is_some_and(|b| Rc::ptr_eq(b, &a)), "a copy while more counts");
        assert!(items[1].0.is_none(), "the second shares the first's pointer");
        assert_eq!((items[0].1, items[1].1), (signal_aux(first, 0), signal_aux(first, 1)));
        drop(items);
        assert!(blocks.uncount(first).is_none(), "the third slot still counts");
        blocks.free_slot(signal_aux(first, 2), &mut freed);
        assert_eq!(Rc::strong_count(&a), 2, "the graph's own pointer, moved, not copied");
        drop(freed);
        assert_eq!((Rc::strong_count(&a), blocks.len()), (1, 0));
        // Freed numbers are taken again, the last freed first.
        let b = blocks.hold(Rc::new(Inert), 1);
        let c = blocks.hold(Rc::new(Inert), 1);
        assert_eq!((b, c), (first, first + 1));
        assert!(blocks.uncount(b).is_none() && blocks.uncount(c).is_none(), "their slots count");
        assert!(blocks.uncount(b).is_some() && blocks.uncount(c).is_some());
        assert_eq!(blocks.hold(Rc::new(Inert), 1), c);
        assert_eq!(blocks.hold(Rc::new(Inert), 1), b);
        assert_eq!(blocks.hold(Rc::new(Inert), 1), c + 1);
        assert_eq!(blocks.len(), 3);
    }

    #[test]
    fn freed_signals_share_a_pointer_only_with_the_object_just_before_of_their_block() {
        let mut blocks = Blocks::<Local>::new();
        let (a, b) = (blocks.hold(Rc::new(Inert), 4), blocks.hold(Rc::new(Inert), 4));
        let mut freed = Freed::new();
        blocks.free_slot(signal_aux(a, 0), &mut freed);
        blocks.free_slot(signal_aux(b, 0), &mut freed);
        blocks.free_slot(signal_aux(a, 1), &mut freed);
        freed.push(Rc::new(Inert), 7);
        blocks.free_slot(signal_aux(a, 2), &mut freed);
        blocks.free_slot(signal_aux(a, 3), &mut freed);
        let shared: Vec<_> = freed.drain().map(|(obj, _)| obj.is_none()).collect();
        assert_eq!(shared, [false, false, false, false, false, true]);
        // Drained, it starts over.
        blocks.free_slot(signal_aux(b, 1), &mut freed);
        assert!(freed.drain().all(|(obj, _)| obj.is_some()));
    }
}
