//! A write's push: direct subscribers dirty, everything further down
//! pending, effects queued once.

use super::flags::*;
use super::{Graph, Key, Link, NONE};
use crate::flavor::Flavor;

impl<F: Flavor> Graph<F> {
    /// A signal's value changed: mark its subscribers dirty and everything
    /// downstream pending, queueing each effect reached once. Iterative; a
    /// resume point is kept only where a sibling remains. Out of line: for
    /// a cell's transition, which marks its keys in a loop over its counts
    /// (inlined there, the cell's enqueue cost about 70 instructions more,
    /// measured with `egress-bench cells-child`).
    #[inline(never)]
    pub(crate) fn propagate(&mut self, signal: u32) {
        self.propagate_inline(signal);
    }

    /// [`propagate`](Self::propagate), inlined: for a signal's write and a
    /// batch's settlement, which reach one or two subscribers, where the
    /// call cost as much as the walk (`updateSignals` 3.6% fewer
    /// instructions).
    #[inline(always)]
    pub(crate) fn propagate_inline(&mut self, signal: u32) {
        let mut link = self.nodes[signal as usize].subs_head;
        while link != NONE {
            let Graph { nodes, links, queue, .. } = self;
            let Link { sub, next_sub, .. } = links[link as usize];
            link = next_sub;
            let node = &mut nodes[sub as usize];
            let f = node.flags;
            node.flags = f | DIRTY;
            if f & (DIRTY | PENDING) != 0 {
                continue;
            }
            if f & EFFECT != 0 {
                if f & QUEUED == 0 {
                    node.flags = f | DIRTY | QUEUED;
                    queue.push(Key { index: sub, generation: node.generation });
                }
                continue;
            }
            // A computed newly dirty: everything below it is pending.
            let below = node.subs_head;
            self.mark_pending(below);
        }
    }

    /// Marks pending everything reachable from the subscriber list starting
    /// at link `down`, queueing the effects it reaches.
    #[inline(never)]
    pub(super) fn mark_pending(&mut self, mut down: u32) {
        let mut stack = std::mem::take(&mut self.propagate_stack);
        loop {
            while down != NONE {
                let Link { sub, next_sub, .. } = self.links[down as usize];
                let node = &mut self.nodes[sub as usize];
                let f = node.flags;
                if f & (DIRTY | PENDING) == 0 {
                    node.flags = f | PENDING;
                    if f & EFFECT != 0 {
                        self.enqueue(sub);
                    } else if node.subs_head != NONE {
                        if next_sub != NONE {
                            stack.push(next_sub);
                        }
                        down = node.subs_head;
                        continue;
                    }
                }
                down = next_sub;
            }
            match stack.pop() {
                Some(next) => down = next,
                None => break,
            }
        }
        self.propagate_stack = stack;
    }

    /// A computed's value changed on re-validation: its pending subscribers
    /// are now dirty.
    pub(crate) fn shallow_propagate(&mut self, index: u32) {
        let mut link = self.nodes[index as usize].subs_head;
        while link != NONE {
            let Link { sub, next_sub, .. } = self.links[link as usize];
            let node = &mut self.nodes[sub as usize];
            if node.flags & (PENDING | DIRTY) == PENDING {
                node.flags |= DIRTY;
            }
            link = next_sub;
        }
    }

    pub(super) fn enqueue(&mut self, index: u32) {
        let node = &mut self.nodes[index as usize];
        if node.flags & QUEUED == 0 {
            node.flags |= QUEUED;
            let generation = node.generation;
            self.queue.push(Key { index, generation });
        }
    }
}
