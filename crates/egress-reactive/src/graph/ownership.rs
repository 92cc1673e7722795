//! Ownership and disposal: cleanups, freeing a node with its links and
//! children, orphaned dependents, the counts tests and reports read.

use super::flags::*;
use super::{Blocks, Graph, Link, NONE, Node};
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
    /// among its siblings, its slot; its object (a signal's: its block) goes
    /// on `freed`, released outside the borrow. Returns whether it was alive.
    ///
    /// A freed slot keeps `generation + 1` and otherwise the state
    /// [`Graph::alloc`] expects of a free slot: no links, no children, no
    /// object, and for a sibling only the next free slot.
    pub(crate) fn free(&mut self, index: u32, freed: &mut Freed<F>) -> bool {
        let node = &self.nodes[index as usize];
        if node.flags & ALIVE == 0 {
            return false;
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
        vacate_into(&mut self.nodes[index as usize], &mut self.blocks, freed);
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
        true
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
    /// that had one (with their `aux`) onto `freed`, and returns whether it
    /// did. Only a graph with no cleanups registered and no run, batch or
    /// flush in progress qualifies: then nothing orders the frees (cleanups
    /// are what disposal orders) and nothing outside the freed set links to
    /// it, so links go wholesale instead of one by one.
    pub(crate) fn free_all(&mut self, freed: &mut Freed<F>) -> bool {
        if !self.quiet() {
            return false;
        }
        let root = self.root;
        // Room for every live node's object (the root has none) at once.
        freed.reserve(self.live_nodes());
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
                vacate_into(node, &mut self.blocks, freed);
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

/// Vacates live node `node` ([`Node::vacate`]) and puts its object on
/// `freed`: a signal's object is its block, which `blocks` holds for it.
#[inline(always)]
fn vacate_into<F: Flavor>(node: &mut Node<F>, blocks: &mut Blocks<F>, freed: &mut Freed<F>) {
    let (valued, aux) = (node.flags & VALUED != 0, node.aux);
    let obj = node.vacate();
    if valued {
        blocks.free_slot(aux, freed);
    } else if let Some(obj) = obj {
        freed.push(obj, aux);
    }
}

/// What freed nodes leave to release outside the graph's borrow, in the
/// order they were freed: each node's object with its `aux`, for
/// [`NodeObj::release`](super::NodeObj::release) and then the object's
/// drop (both run user code).
///
/// A signal's object is its value block: a run of signals of one block
/// (a disposal frees a block's signals one after another, as they were
/// made) shares one pointer to it, the entries after the first holding
/// `None` (the object before). So freeing a signal takes no reference
/// count of its own but once per run.
pub(crate) struct Freed<F: Flavor> {
    items: Vec<(Option<F::Obj>, u32)>,
    /// Where the last object (`Some`) is in `items`.
    last: usize,
}

impl<F: Flavor> Freed<F> {
    pub(crate) fn new() -> Self {
        Freed { items: Vec::new(), last: 0 }
    }

    /// Adds a freed node's object.
    #[inline(always)]
    pub(crate) fn push(&mut self, obj: F::Obj, aux: u32) {
        self.last = self.items.len();
        self.items.push((Some(obj), aux));
    }

    /// Adds a freed signal of `block` (the graph's pointer to it): as a
    /// `None` if the last object added is the same block, else with a
    /// copy of the pointer.
    #[inline(always)]
    pub(crate) fn push_signal(&mut self, block: &F::Obj, aux: u32) {
        match self.items.get(self.last) {
            Some((Some(last), _)) if F::same_obj(last, block) => self.items.push((None, aux)),
            _ => self.push(block.clone(), aux),
        }
    }

    /// Room for `more` nodes.
    pub(crate) fn reserve(&mut self, more: usize) {
        self.items.reserve(more);
    }

    /// How many freed nodes were added.
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// Takes everything added, in order: each node's object (`None`: the
    /// one before) and `aux`.
    pub(crate) fn drain(&mut self) -> std::vec::Drain<'_, (Option<F::Obj>, u32)> {
        self.last = 0;
        self.items.drain(..)
    }
}
