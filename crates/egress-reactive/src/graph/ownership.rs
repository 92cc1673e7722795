//! Ownership and disposal: cleanups, freeing a node with its links and
//! children, orphaned dependents, the counts tests and reports read.

use super::flags::*;
use super::{Graph, Link, NONE};
use crate::flavor::Flavor;

impl<F: Flavor> Graph<F> {
    pub(crate) fn take_cleanups(&mut self, index: u32) -> Vec<F::Cleanup> {
        let node = &mut self.nodes[index as usize];
        if node.flags & HAS_CLEANUP == 0 {
            return Vec::new();
        }
        node.flags &= !HAS_CLEANUP;
        self.cleanups.remove(&index).unwrap_or_default()
    }

    pub(crate) fn add_cleanup(&mut self, index: u32, cleanup: F::Cleanup) {
        self.nodes[index as usize].flags |= HAS_CLEANUP;
        self.cleanups.entry(index).or_default().push(cleanup);
    }

    /// Frees one node whose children are gone: its links both ways, its place
    /// among its siblings, its slot. Returns its object, to be dropped by the
    /// caller outside the graph borrow (dropping it runs user destructors).
    ///
    /// A freed slot keeps `generation + 1` and otherwise the state
    /// [`Graph::alloc`] expects of a free slot: no links, no children, no
    /// object, and for a sibling only the next free slot.
    pub(crate) fn free(&mut self, index: u32) -> Option<F::Obj> {
        let node = &self.nodes[index as usize];
        if node.flags & ALIVE == 0 {
            return None;
        }
        debug_assert_eq!(node.last_child, NONE, "graph invariant: children are freed before their owner");
        if node.deps_head != NONE || node.subs_head != NONE {
            self.epoch = self.epoch.wrapping_add(1);
            self.unlink_all(index);
        }
        let node = &mut self.nodes[index as usize];
        let (owner, prev, next) = (node.owner, node.prev_sibling, node.next_sibling);
        let had_cleanups = node.flags & HAS_CLEANUP != 0;
        if node.flags & CUSTOM_EQ != 0
            && let Some(eq) = self.equalities.remove(&index)
        {
            self.dropped.push(eq);
        }
        let node = &mut self.nodes[index as usize];
        let obj = node.vacate();
        if prev != NONE {
            self.nodes[prev as usize].next_sibling = next;
        }
        if next != NONE {
            self.nodes[next as usize].prev_sibling = prev;
        } else if owner != NONE {
            self.nodes[owner as usize].last_child = prev;
        }
        // `run::dispose` runs (or takes) every cleanup before it frees.
        debug_assert!(!had_cleanups, "graph invariant: cleanups are taken before their node is freed");
        if had_cleanups {
            self.cleanups.remove(&index);
        }
        self.push_free(index);
        obj
    }

    /// Takes running node `index` out of its owner's children (it becomes
    /// ownerless) and marks it [`DOOMED`]: disposing it waits for its run
    /// to end, and its owner need not wait for it.
    pub(crate) fn doom(&mut self, index: u32) {
        let node = &mut self.nodes[index as usize];
        node.flags |= DOOMED;
        let (owner, prev, next) = (node.owner, node.prev_sibling, node.next_sibling);
        node.owner = NONE;
        node.prev_sibling = NONE;
        node.next_sibling = NONE;
        if prev != NONE {
            self.nodes[prev as usize].next_sibling = next;
        }
        if next != NONE {
            self.nodes[next as usize].prev_sibling = prev;
        } else if owner != NONE {
            self.nodes[owner as usize].last_child = prev;
        }
    }

    /// `sub` read a node being freed (through a link read at its run
    /// `version`): it, and everything that read it, directly or not, is
    /// marked [`ORPHAN`], so that none serves a value computed from the
    /// gone node before it runs again. A running subscriber is marked only
    /// if its run already read the node: otherwise the run reads it later
    /// (and fails there) or no longer reads it. A node marked already is
    /// not walked again (what reads it was marked with it, or has run since
    /// it ran).
    pub(super) fn orphan(&mut self, sub: u32, version: u32) {
        let node = &self.nodes[sub as usize];
        if node.flags & ORPHAN != 0 || (node.flags & RUNNING != 0 && version != node.runs) {
            return;
        }
        let mut stack = std::mem::take(&mut self.propagate_stack);
        stack.push(sub);
        while let Some(n) = stack.pop() {
            let node = &mut self.nodes[n as usize];
            if node.flags & ORPHAN != 0 {
                continue;
            }
            node.flags |= ORPHAN;
            let mut l = node.subs_head;
            while l != NONE {
                let Link { sub, next_sub, .. } = self.links[l as usize];
                stack.push(sub);
                l = next_sub;
            }
        }
        self.propagate_stack = stack;
    }

    /// How many nodes `index` owns directly.
    pub(crate) fn child_count(&self, index: u32) -> usize {
        let mut n = 0;
        let mut child = self.nodes[index as usize].last_child;
        while child != NONE {
            n += 1;
            child = self.nodes[child as usize].prev_sibling;
        }
        n
    }

    /// Hands every child of `index` to the owner of `index` (the root if it
    /// has none), after that owner's own children and in their creation
    /// order: disposing `index` then disposes none of them. Links, values
    /// and flags are untouched.
    pub(crate) fn hand_children_up(&mut self, index: u32) {
        let heir = match self.nodes[index as usize].owner {
            NONE => self.root,
            owner => owner,
        };
        // The first child: the children list runs backwards from the last.
        let mut first = self.nodes[index as usize].last_child;
        if first == NONE {
            return;
        }
        while self.nodes[first as usize].prev_sibling != NONE {
            first = self.nodes[first as usize].prev_sibling;
        }
        self.reparents = self.reparents.wrapping_add(1);
        let last = std::mem::replace(&mut self.nodes[index as usize].last_child, NONE);
        let mut child = first;
        while child != NONE {
            self.nodes[child as usize].owner = heir;
            child = self.nodes[child as usize].next_sibling;
        }
        // Splice the whole list after the heir's last child.
        let tail = std::mem::replace(&mut self.nodes[heir as usize].last_child, last);
        self.nodes[first as usize].prev_sibling = tail;
        if tail != NONE {
            self.nodes[tail as usize].next_sibling = first;
        }
    }

    /// Removes every link of `index`, both ways.    /// Removes every link of `index`, both ways.
    #[inline(never)]
    pub(super) fn unlink_all(&mut self, index: u32) {
        let mut l = self.nodes[index as usize].deps_head;
        while l != NONE {
            let next = self.links[l as usize].next_dep;
            self.unlink_sub_side(l);
            self.free_link(l);
            l = next;
        }
        // Not itself released below: the caller frees it.
        self.nodes[index as usize].flags &= !COMPUTED;
        self.release_unwatched();
        let mut l = self.nodes[index as usize].subs_head;
        while l != NONE {
            let Link { sub, next_sub, version, .. } = self.links[l as usize];
            self.orphan(sub, version);
            self.unlink_dep_side(l);
            self.free_link(l);
            l = next_sub;
        }
        let node = &mut self.nodes[index as usize];
        node.deps_head = NONE;
        node.deps_tail = NONE;
        node.subs_head = NONE;
        node.subs_tail = NONE;
    }

    /// Whether no cleanup is registered and no run, batch or flush is in
    /// progress: then disposing every node needs no order.
    pub(crate) fn quiet(&self) -> bool {
        self.cleanups.is_empty() && self.depth == 0 && self.batch_depth == 0 && !self.flushing && self.cleaning == 0
    }

    /// Whether writes are deferred now: inside a batch, or inside a run
    /// (a computation's writes settle when the outermost run ends).
    #[inline(always)]
    pub(crate) fn batching(&self) -> bool {
        self.batch_depth != 0 || self.depth != 0
    }

    /// Frees every node but the root at once, pushing the objects of those
    /// that had one (with their `aux`) onto `objs`, and returns whether it
    /// did. Only a graph with no cleanups registered and no run, batch or
    /// flush in progress qualifies: then nothing orders the frees (cleanups
    /// are what disposal orders) and nothing outside the freed set links to
    /// it, so links go wholesale instead of one by one.
    pub(crate) fn free_all(&mut self, objs: &mut Vec<(F::Obj, u32)>) -> bool {
        if !self.quiet() {
            return false;
        }
        let root = self.root;
        // Room for every live node's object (the root has none) at once.
        objs.reserve(self.live_nodes());
        // Every slot but the root's goes on the free list, the lowest first
        // (as they were made).
        let (mut head, mut count) = (NONE, 0);
        for (index, node) in self.nodes.iter_mut().enumerate().rev() {
            let index = index as u32;
            if index == root {
                node.last_child = NONE;
                continue;
            }
            if node.flags & ALIVE != 0 {
                let aux = node.aux;
                if let Some(obj) = node.vacate() {
                    objs.push((obj, aux));
                }
            }
            node.next_sibling = head;
            (head, count) = (index, count + 1);
        }
        (self.free_head, self.free_count) = (head, count);
        self.links.clear();
        self.free_link = NONE;
        self.live_links = 0;
        self.queue.clear();
        self.writes.clear();
        self.unwatched.clear();
        self.dropped.extend(self.equalities.drain().map(|(_, eq)| eq));
        true
    }

    pub(crate) fn dependency_count(&self, index: u32) -> usize {
        let mut n = 0;
        let mut l = self.nodes[index as usize].deps_head;
        while l != NONE {
            n += 1;
            l = self.links[l as usize].next_dep;
        }
        n
    }

    pub(crate) fn subscriber_count(&self, index: u32) -> usize {
        let mut n = 0;
        let mut l = self.nodes[index as usize].subs_head;
        while l != NONE {
            n += 1;
            l = self.links[l as usize].next_sub;
        }
        n
    }
}
