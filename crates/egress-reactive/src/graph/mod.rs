//! The graph: an arena of nodes and an arena of dependency links, and the
//! transitions on them that run no user code.
//!
//! # Algorithm
//!
//! Push-dirty, pull-validate (the colouring of Reactively, with the link
//! structure of alien-signals), written from our own specification:
//!
//! - A write to a signal marks its direct subscribers `DIRTY` and everything
//!   further downstream `PENDING` ([`Graph::propagate`]), iteratively, and
//!   queues each effect it reaches once. Nothing is recomputed by a write.
//! - A read of a computed, or a queued effect about to run, re-validates
//!   pull-wise: a `PENDING` node walks its dependencies in the order it read
//!   them, recomputing `DIRTY` ones deepest first, and stops at the first whose
//!   value changed (`crate::run::check_dirty`). A recomputation whose value is
//!   equal to the old one changes nothing downstream (equality cut-off).
//!   Because everything a computation reads has been re-validated before it
//!   runs, no computation observes a mix of old and new values, and the
//!   native stack never grows with the depth of the graph.
//! - Dependencies are re-tracked on every run: a link is reused when the
//!   run reads the same dependency at the same position, created otherwise,
//!   and the links past the last one read are removed when the run ends.
//!
//! Links are doubly linked in two lists at once (the subscriber's
//! dependencies, the dependency's subscribers), so linking, unlinking and
//! disposal are O(1) per link.

use std::collections::HashMap;
use std::panic::Location;

use crate::flavor::{Entered, Flavor};

mod blocks;
mod ownership;
mod propagation;
mod tracking;
pub(crate) use blocks::{Blocks, MAX_SLOTS, aux_block, aux_slot, signal_aux};
pub(crate) use ownership::Freed;
pub(crate) use tracking::Queued;

/// No node, no link.
pub(crate) const NONE: u32 = u32::MAX;

/// Node flags.
pub(crate) mod flags {
    pub(crate) const SIGNAL: u32 = 1;
    pub(crate) const COMPUTED: u32 = 1 << 1;
    pub(crate) const EFFECT: u32 = 1 << 2;
    pub(crate) const SCOPE: u32 = 1 << 3;
    /// A dependency changed: must recompute.
    pub(crate) const DIRTY: u32 = 1 << 4;
    /// Something upstream may have changed: re-validate before use.
    pub(crate) const PENDING: u32 = 1 << 5;
    /// The node's function is running.
    pub(crate) const RUNNING: u32 = 1 << 6;
    /// The effect is in the run queue.
    pub(crate) const QUEUED: u32 = 1 << 7;
    /// The effect runs on an executor: it is scheduled, not run inline.
    pub(crate) const ASYNC: u32 = 1 << 8;
    /// The node has cleanups registered.
    pub(crate) const HAS_CLEANUP: u32 = 1 << 9;
    /// The slot holds a live node.
    pub(crate) const ALIVE: u32 = 1 << 10;
    /// The signal was written in the current batch.
    pub(crate) const BATCHED: u32 = 1 << 11;
    /// A computed whose last run panicked: clean for propagation (a change
    /// of what it read before the panic reaches it and what depends on it),
    /// but its value is not valid: the next read runs it again, and its next
    /// successful run counts as a change.
    pub(crate) const FAILED: u32 = 1 << 12;
    /// Disposed while its own function was running: detached from its owner,
    /// and disposed when the run ends.
    pub(crate) const DOOMED: u32 = 1 << 13;
    /// A signal with its own equality, kept in [`Graph::equalities`].
    pub(crate) const CUSTOM_EQ: u32 = 1 << 14;
    /// A node it read, directly or not, was disposed: its next read (or,
    /// for an effect, its next queued run) runs it again, so a computation
    /// that still reads the disposed node fails there instead of serving
    /// the value it had. Not a mark for propagation (a later write still
    /// queues the node); cleared when the node runs.
    pub(crate) const ORPHAN: u32 = 1 << 15;
    /// The node is on a re-validation walk ([`check_dirty`]): its start,
    /// or a pending computed the walk descended into and has not settled.
    /// Like [`RUNNING`], the node is being evaluated: a computed run inside
    /// the walk that reads it closes a cycle, and a walk that meets it as
    /// a dependency does not descend into it again. Cleared when the walk
    /// settles the node (or runs it, or unwinds, or starts over).
    ///
    /// [`check_dirty`]: crate::run::check_dirty
    pub(crate) const WALKING: u32 = 1 << 16;
    /// A signal with a value (a trigger has none): the value is in a slot
    /// of one of [`Graph::blocks`], which the node's `aux` names
    /// ([`signal_aux`](super::signal_aux)).
    pub(crate) const VALUED: u32 = 1 << 17;
}
use flags::*;

/// A node's identity: its slot and the slot's generation, so a handle to a
/// disposed node never reaches the node that reuses its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

/// What the graph holds of a node's user-facing part.
pub trait NodeObj {
    /// Computed: evaluate, store, and return whether the value changed.
    /// Effect: run. Signal: not called.
    fn run(&self, entered: &Entered) -> bool;
    /// Signal: the batch that wrote it ends; drop the value it replaced and
    /// return whether the current value differs from it. `aux` is the
    /// node's auxiliary word (for a signal, where its value lives).
    /// `eq` is the signal's own equality, if it has one (an `F::EqFn<T>`).
    fn settle(&self, _entered: &Entered, _aux: u32, _eq: Option<&dyn std::any::Any>) -> bool {
        true
    }
    /// The node was disposed: drop what it holds apart from the object
    /// itself (a signal's value in its block). Called outside the graph's
    /// borrow, since it runs user destructors.
    fn release(&self, _entered: &Entered, _aux: u32) {}
    /// Async effect: wake the task that runs it.
    fn schedule(&self) {}
}

/// 64 bytes: every field a propagation or a run touches. What only error
/// reports need (where the node was created) lives beside, in
/// [`Graph::sites`]. (Not `align(64)`: an over-aligned arena grows by
/// allocate-copy-free instead of `realloc`, which cost signal creation more
/// than the alignment gave the runs; see docs/benchmarks.md.)
pub(crate) struct Node<F: Flavor> {
    pub(crate) flags: u32,
    pub(crate) generation: u32,
    pub(crate) deps_head: u32,
    pub(crate) deps_tail: u32,
    pub(crate) subs_head: u32,
    pub(crate) subs_tail: u32,
    pub(crate) owner: u32,
    pub(crate) last_child: u32,
    pub(crate) prev_sibling: u32,
    pub(crate) next_sibling: u32,
    pub(crate) runs: u32,
    /// A computation, while running: the computation that was running when
    /// it started (the chain a cycle report follows). A signal: its block of
    /// [`Graph::blocks`] and its slot there ([`signal_aux`]; signals never
    /// run). Fits in what was padding.
    pub(crate) aux: u32,
    pub(crate) obj: Option<F::Obj>,
}

impl<F: Flavor> Node<F> {
    /// A live node with no links and no children.
    #[inline(always)]
    fn fresh(kind: u32, generation: u32, owner: u32, prev_sibling: u32, aux: u32, obj: Option<F::Obj>) -> Self {
        Node {
            flags: kind | ALIVE,
            generation,
            deps_head: NONE,
            deps_tail: NONE,
            subs_head: NONE,
            subs_tail: NONE,
            owner,
            last_child: NONE,
            prev_sibling,
            next_sibling: NONE,
            runs: 0,
            aux,
            obj,
        }
    }

    /// Turns the node into a free slot (no links, owner, siblings or
    /// children; a new generation, so handles to it stay dead) and returns
    /// its object. The caller has unlinked it from its links and siblings.
    #[inline(always)]
    fn vacate(&mut self) -> Option<F::Obj> {
        let mut free = Node::fresh(0, self.generation.wrapping_add(1), NONE, NONE, NONE, None);
        free.flags = 0;
        std::mem::replace(self, free).obj
    }
}

/// 28 bytes. (Aligning links to 32 bytes saved about 2% of the
/// instructions of an effect run but cost every computed 5 bytes, which the
/// memory bar does not allow; see docs/benchmarks.md.)
#[derive(Clone, Copy)]
pub(crate) struct Link {
    pub(crate) dep: u32,
    pub(crate) sub: u32,
    pub(crate) prev_dep: u32,
    pub(crate) next_dep: u32,
    pub(crate) prev_sub: u32,
    pub(crate) next_sub: u32,
    /// The subscriber's run count when the link was last read: a read
    /// already linked in the running run is recognized by it.
    pub(crate) version: u32,
}

/// What a run replaces in the graph's context, restored when it ends.
///
/// Everything is restored by value, never undone by arithmetic: a
/// decrement would load what the run's start stored moments before, and a
/// load wider than those stores (the compiler pairs adjacent fields) stalls
/// until they reach the cache.
#[derive(Clone, Copy)]
pub(crate) struct Saved {
    active: u32,
    owner: u32,
    pub(crate) depth: u32,
}

pub(crate) struct Graph<F: Flavor> {
    /// The blocks of the live signals' values (and the pools' current
    /// blocks), held once each for all their signals. The first field, so
    /// that a graph dropped whole frees its blocks before its node table:
    /// in the other order, the reactivity suite's createSignals took five
    /// times the page faults and four times as long (glibc's heap gave its
    /// memory back after each graph; see docs/benchmarks.md).
    pub(crate) blocks: Blocks<F>,
    pub(crate) nodes: Vec<Node<F>>,
    /// Where each node (by index) was created, for error reports. (Kept
    /// for every node, signals included: computeds then cost less memory
    /// than with a table grown on demand; see docs/benchmarks.md.)
    sites: Vec<&'static Location<'static>>,
    /// The free slots, last freed first: a list threaded through the freed
    /// nodes' `next_sibling` (a free slot has no siblings), so that freeing
    /// never allocates and a freed slot costs nothing beside itself.
    free_head: u32,
    /// How many slots [`free_head`](Self::free_head)'s list holds.
    free_count: u32,
    pub(crate) links: Vec<Link>,
    free_link: u32,
    live_links: usize,
    /// The computation whose reads are being tracked.
    pub(crate) active: u32,
    /// The owner of nodes created now.
    pub(crate) owner: u32,
    /// How many [`Handle::batch`](crate::Handle::batch) calls are open
    /// (runs defer writes too: see [`Graph::batching`]).
    pub(crate) batch_depth: u32,
    pub(crate) flushing: bool,
    /// Effects to run, in the order they were reached.
    pub(crate) queue: Vec<Key>,
    /// Signals written in the current batch, settled when it ends.
    pub(crate) writes: Vec<Key>,
    /// How many of `writes` the settlement under way has taken: a
    /// settlement asked for inside another (a computed read, or a write,
    /// in an equality it runs) goes on from here rather than starting
    /// over, so no write is compared twice, or while it is compared.
    pub(crate) settled: usize,
    pub(crate) cleanups: HashMap<u32, Vec<F::Cleanup>>,
    /// How many runs are nested now (the native stack grows with it).
    pub(crate) depth: u32,
    /// Scratch stacks, reused so that a steady-state pass allocates nothing.
    pub(crate) walk_stack: Vec<(u32, u32)>,
    /// Computeds that just lost their last subscriber (scratch).
    unwatched: Vec<u32>,
    propagate_stack: Vec<u32>,
    pub(crate) root: u32,
    /// A cycle found by a plain read, for the `try_` read it unwinds to.
    pub(crate) cycle: Option<crate::error::CycleError>,
    /// Per signal value type, the block new signals take their slot from.
    pub(crate) pools: Vec<Pool<F>>,
    /// Bumped whenever a node with links is freed: a walk that ran user
    /// code checks it to learn whether the nodes and links it stands on may
    /// be gone.
    pub(crate) epoch: u32,
    /// The context was dropped: nodes created from now on are born
    /// disposed (nothing would ever dispose them).
    pub(crate) closed: bool,
    /// How many disposals are running cleanups now (the graph is not
    /// [`quiet`](Graph::quiet) while one is).
    pub(crate) cleaning: u32,
    /// Bumped whenever nodes change owner ([`Graph::hand_children_up`]): a
    /// disposal walk that ran user code checks it to learn whether the
    /// owner it climbs to may lie outside the subtree it disposes.
    pub(crate) reparents: u32,
    /// The equality of each signal made with one (flag [`CUSTOM_EQ`]), by
    /// node index: an `F::EqFn<T>`, erased. A side table, so that signals
    /// without one pay no memory for it.
    pub(crate) equalities: HashMap<u32, F::Ptr<F::Any>>,
    /// What freed nodes held that runs user destructors when dropped,
    /// waiting to be dropped outside the graph's borrow.
    pub(crate) dropped: Vec<F::Ptr<F::Any>>,
}

/// How a run ended, for the caller to finish outside the graph's borrow.
pub(crate) struct Ended<F: Flavor> {
    /// The object of a node freed during its run (dropped by the caller).
    pub(crate) leftover: Option<F::Obj>,
    /// The node's flags when its run ended, before `end` cleared `RUNNING`
    /// and `FAILED` (0 if it was freed): [`DOOMED`] (disposed during its
    /// run: dispose it now), [`FAILED`] (its last run before this one
    /// failed).
    pub(crate) flags: u32,
}

/// The block of value slots that new signals of one value type take their
/// slot from (see `crate::signal::SignalBlock`).
pub(crate) struct Pool<F: Flavor> {
    pub(crate) type_id: std::any::TypeId,
    /// The block: an `F::Ptr<SignalBlock<T, F>>`, erased.
    pub(crate) block: Box<F::Any>,
    /// Its number in [`Graph::blocks`].
    pub(crate) held: u32,
    /// How many of its slots are taken.
    pub(crate) used: u32,
}

impl<F: Flavor> Graph<F> {
    /// The nodes a new graph has room for: an egress cell's (19) with its
    /// context's root and what a screen puts around it, so that a small
    /// graph's arena does not grow by reallocation at each power of two
    /// (a cell's setup went 4, 8, 16, 32; about 2 KiB per context).
    pub(crate) const FIRST_NODES: usize = 32;

    #[track_caller]
    pub(crate) fn new() -> Self {
        let mut graph = Graph {
            nodes: Vec::with_capacity(Self::FIRST_NODES),
            sites: Vec::with_capacity(Self::FIRST_NODES),
            free_head: NONE,
            free_count: 0,
            links: Vec::new(),
            free_link: NONE,
            live_links: 0,
            active: NONE,
            owner: NONE,
            batch_depth: 0,
            flushing: false,
            queue: Vec::new(),
            writes: Vec::new(),
            settled: 0,
            cleanups: HashMap::new(),
            depth: 0,
            walk_stack: Vec::new(),
            unwatched: Vec::new(),
            propagate_stack: Vec::new(),
            root: NONE,
            cycle: None,
            pools: Vec::new(),
            blocks: Blocks::new(),
            epoch: 0,
            closed: false,
            cleaning: 0,
            reparents: 0,
            equalities: HashMap::new(),
            dropped: Vec::new(),
        };
        let root = graph.alloc(SCOPE, None, NONE, Location::caller());
        graph.root = root.index;
        graph.owner = root.index;
        graph
    }

    /// Creates a node owned by the current owner.
    #[inline(always)]
    pub(crate) fn alloc(
        &mut self,
        kind: u32,
        obj: Option<F::Obj>,
        aux: u32,
        created_at: &'static Location<'static>,
    ) -> Key {
        let owner = self.owner;
        // The new node is its owner's last child.
        let prev =
            if owner == NONE { NONE } else { std::mem::replace(&mut self.nodes[owner as usize].last_child, NONE) };
        let (index, generation) = if self.free_head == NONE {
            let index = u32::try_from(self.nodes.len()).ok().filter(|&i| i != NONE);
            let index = index.expect("graph invariant: fewer than 2^32 - 1 live nodes");
            self.nodes.push(Node::fresh(kind, 0, owner, prev, aux, obj));
            self.sites.push(created_at);
            (index, 0)
        } else {
            let index = self.free_head;
            let node = &mut self.nodes[index as usize];
            self.free_head = node.next_sibling;
            self.free_count -= 1;
            let generation = node.generation;
            *node = Node::fresh(kind, generation, owner, prev, aux, obj);
            self.sites[index as usize] = created_at;
            (index, generation)
        };
        if owner != NONE {
            self.nodes[owner as usize].last_child = index;
            if prev != NONE {
                self.nodes[prev as usize].next_sibling = index;
            }
        }
        Key { index, generation }
    }

    /// [`Graph::alloc`], unless the context was dropped: then nothing is
    /// created, and the caller gets a key that is never alive and its
    /// object back (to drop outside the graph's borrow).
    #[inline(always)]
    pub(crate) fn create(
        &mut self,
        kind: u32,
        obj: Option<F::Obj>,
        aux: u32,
        created_at: &'static Location<'static>,
    ) -> Result<Key, (Key, Option<F::Obj>)> {
        if self.closed {
            return Err((self.dead_key(), obj));
        }
        Ok(self.alloc(kind, obj, aux, created_at))
    }

    /// Where node `index` was created.
    pub(crate) fn site(&self, index: u32) -> &'static Location<'static> {
        self.sites[index as usize]
    }

    #[inline]
    pub(crate) fn alive(&self, key: Key) -> bool {
        let node = &self.nodes[key.index as usize];
        node.generation == key.generation && node.flags & ALIVE != 0
    }

    #[inline]
    pub(crate) fn node(&self, index: u32) -> &Node<F> {
        &self.nodes[index as usize]
    }

    #[inline]
    pub(crate) fn node_mut(&mut self, index: u32) -> &mut Node<F> {
        &mut self.nodes[index as usize]
    }

    #[inline]
    pub(crate) fn link_at(&self, link: u32) -> &Link {
        &self.links[link as usize]
    }

    pub(crate) fn key(&self, index: u32) -> Key {
        Key { index, generation: self.nodes[index as usize].generation }
    }

    /// A key that is never alive: the root's slot under another generation
    /// (the root is never freed). What a node made in a closed graph gets.
    pub(crate) fn dead_key(&self) -> Key {
        Key { index: self.root, generation: self.nodes[self.root as usize].generation.wrapping_add(1) }
    }

    /// Marks a node whose run (or the re-validation before it) panicked: a
    /// computed is [`FAILED`], an effect clean (the next change of what it
    /// read queues it again). Neither stays marked (dirty, pending or on a
    /// walk), so propagation reaches them and what depends on them.
    pub(crate) fn mark_failed(&mut self, index: u32) {
        let node = &mut self.nodes[index as usize];
        if node.flags & ALIVE == 0 {
            return;
        }
        node.flags &= !(DIRTY | PENDING | WALKING);
        if node.flags & COMPUTED != 0 {
            node.flags |= FAILED;
        }
    }

    pub(crate) fn live_nodes(&self) -> usize {
        self.nodes.len() - self.free_count as usize
    }

    pub(crate) fn live_links(&self) -> usize {
        self.live_links
    }

    /// Puts freed slot `index` at the head of the free list.
    #[inline]
    pub(super) fn push_free(&mut self, index: u32) {
        self.nodes[index as usize].next_sibling = self.free_head;
        self.free_head = index;
        self.free_count += 1;
    }
}

#[cfg(test)]
mod tests {
    use std::panic::Location;
    use std::rc::Rc;

    use super::flags::SIGNAL;
    use super::{Freed, Graph, Key, NONE, NodeObj};
    use crate::flavor::{Entered, Local};

    /// A node object that does nothing.
    pub(super) struct Inert;

    impl NodeObj for Inert {
        fn run(&self, _: &Entered) -> bool {
            false
        }
    }

    fn make(g: &mut Graph<Local>) -> Key {
        g.alloc(SIGNAL, Some(Rc::new(Inert)), NONE, Location::caller())
    }

    #[test]
    fn freed_slots_are_reused_last_freed_first_and_counted() {
        let mut g = Graph::<Local>::new();
        let keys: Vec<Key> = (0..4).map(|_| make(&mut g)).collect();
        assert_eq!(g.live_nodes(), 5, "the root and four");
        let mut freed = Freed::new();
        assert!(g.free(keys[1].index, &mut freed));
        assert!(g.free(keys[3].index, &mut freed));
        assert_eq!(freed.len(), 2);
        assert!(!g.alive(keys[1]) && !g.alive(keys[3]));
        assert_eq!(g.live_nodes(), 3);
        let (a, b) = (make(&mut g), make(&mut g));
        assert_eq!((a.index, b.index), (keys[3].index, keys[1].index), "the last freed first");
        assert_eq!((a.generation, b.generation), (1, 1), "a reused slot is a new generation");
        assert_eq!(g.live_nodes(), 5);
        // The list is empty again: the next node is a new slot.
        assert_eq!(make(&mut g).index, 5);
        assert_eq!((g.nodes.len(), g.live_nodes()), (6, 6));
    }

    #[test]
    fn freeing_everything_frees_every_slot_but_the_root_lowest_first() {
        let mut g = Graph::<Local>::new();
        let keys: Vec<Key> = (0..6).map(|_| make(&mut g)).collect();
        // One slot is free already: it is listed once.
        assert!(g.free(keys[1].index, &mut Freed::new()));
        let mut freed = Freed::new();
        assert!(g.free_all(&mut freed));
        assert_eq!(freed.len(), 5, "the objects of the live nodes");
        assert_eq!(g.live_nodes(), 1, "the root");
        assert!(keys.iter().all(|&k| !g.alive(k)));
        let again: Vec<u32> = (0..6).map(|_| make(&mut g).index).collect();
        assert_eq!(again, [1, 2, 3, 4, 5, 6]);
        assert_eq!((g.nodes.len(), g.live_nodes()), (7, 7));
    }
}
