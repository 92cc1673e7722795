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
    /// it started (the chain a cycle report follows). A signal: its slot in
    /// its value block (signals never run). Fits in what was padding.
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
    pub(crate) nodes: Vec<Node<F>>,
    /// Where each node (by index) was created, for error reports. (Kept
    /// for every node, signals included: computeds then cost less memory
    /// than with a table grown on demand; see docs/benchmarks.md.)
    sites: Vec<&'static Location<'static>>,
    free_nodes: Vec<u32>,
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
    /// How many of its slots are taken.
    pub(crate) used: u32,
}

impl<F: Flavor> Graph<F> {
    #[track_caller]
    pub(crate) fn new() -> Self {
        let mut graph = Graph {
            nodes: Vec::new(),
            sites: Vec::new(),
            free_nodes: Vec::new(),
            links: Vec::new(),
            free_link: NONE,
            live_links: 0,
            active: NONE,
            owner: NONE,
            batch_depth: 0,
            flushing: false,
            queue: Vec::new(),
            writes: Vec::new(),
            cleanups: HashMap::new(),
            depth: 0,
            walk_stack: Vec::new(),
            unwatched: Vec::new(),
            propagate_stack: Vec::new(),
            root: NONE,
            cycle: None,
            pools: Vec::new(),
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
        let (index, generation) = match self.free_nodes.pop() {
            Some(index) => {
                let node = &mut self.nodes[index as usize];
                let generation = node.generation;
                *node = Node::fresh(kind, generation, owner, prev, aux, obj);
                self.sites[index as usize] = created_at;
                (index, generation)
            }
            None => {
                let index = u32::try_from(self.nodes.len()).ok().filter(|&i| i != NONE);
                let index = index.expect("graph invariant: fewer than 2^32 - 1 live nodes");
                self.nodes.push(Node::fresh(kind, 0, owner, prev, aux, obj));
                self.sites.push(created_at);
                (index, 0)
            }
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
    /// read queues it again). Neither stays marked, so propagation reaches
    /// them and what depends on them.
    pub(crate) fn mark_failed(&mut self, index: u32) {
        let node = &mut self.nodes[index as usize];
        if node.flags & ALIVE == 0 {
            return;
        }
        node.flags &= !(DIRTY | PENDING);
        if node.flags & COMPUTED != 0 {
            node.flags |= FAILED;
        }
    }

    pub(crate) fn live_nodes(&self) -> usize {
        self.nodes.len() - self.free_nodes.len()
    }

    pub(crate) fn live_links(&self) -> usize {
        self.live_links
    }

    // ---- tracking ----------------------------------------------------

    /// Records that `sub`, now running, read `dep`. The common case, a run
    /// reading what the previous run read in the same order, only moves the
    /// cursor (inlined); the rest is out of line.
    #[inline(always)]
    pub(crate) fn link(&mut self, dep: u32, sub: u32) {
        let Graph { nodes, links, .. } = self;
        let node = &mut nodes[sub as usize];
        let prev = node.deps_tail;
        let next = if prev == NONE {
            node.deps_head
        } else {
            let prev_link = &links[prev as usize];
            if prev_link.dep == dep {
                return;
            }
            prev_link.next_dep
        };
        if next != NONE {
            let link = &mut links[next as usize];
            if link.dep == dep {
                link.version = node.runs;
                node.deps_tail = next;
                return;
            }
        }
        self.link_slow(dep, sub, prev, next);
    }

    #[inline(never)]
    fn link_slow(&mut self, dep: u32, sub: u32, prev: u32, next: u32) {
        let subs_tail = self.nodes[dep as usize].subs_tail;
        if subs_tail != NONE {
            let last = &self.links[subs_tail as usize];
            if last.sub == sub && last.version == self.nodes[sub as usize].runs {
                return;
            }
        }
        let link = Link {
            dep,
            sub,
            prev_dep: prev,
            next_dep: next,
            prev_sub: subs_tail,
            next_sub: NONE,
            version: self.nodes[sub as usize].runs,
        };
        let l = self.alloc_link(link);
        if prev == NONE {
            self.nodes[sub as usize].deps_head = l;
        } else {
            self.links[prev as usize].next_dep = l;
        }
        if next != NONE {
            self.links[next as usize].prev_dep = l;
        }
        self.nodes[sub as usize].deps_tail = l;
        if subs_tail == NONE {
            self.nodes[dep as usize].subs_head = l;
        } else {
            self.links[subs_tail as usize].next_sub = l;
        }
        self.nodes[dep as usize].subs_tail = l;
    }

    fn alloc_link(&mut self, link: Link) -> u32 {
        self.live_links += 1;
        if self.free_link != NONE {
            let l = self.free_link;
            self.free_link = self.links[l as usize].next_dep;
            self.links[l as usize] = link;
            l
        } else {
            let l = u32::try_from(self.links.len()).ok().filter(|&i| i != NONE);
            let l = l.expect("graph invariant: fewer than 2^32 - 1 live links");
            self.links.push(link);
            l
        }
    }

    fn free_link(&mut self, l: u32) {
        self.live_links -= 1;
        let link = &mut self.links[l as usize];
        link.dep = NONE;
        link.sub = NONE;
        link.next_dep = self.free_link;
        self.free_link = l;
    }

    /// Removes `l` from its dependency's subscriber list. A computed left
    /// with no subscriber is noted, for [`Graph::release_unwatched`].
    fn unlink_sub_side(&mut self, l: u32) {
        let Link { dep, prev_sub, next_sub, .. } = self.links[l as usize];
        if prev_sub == NONE {
            self.nodes[dep as usize].subs_head = next_sub;
        } else {
            self.links[prev_sub as usize].next_sub = next_sub;
        }
        if next_sub == NONE {
            self.nodes[dep as usize].subs_tail = prev_sub;
        } else {
            self.links[next_sub as usize].prev_sub = prev_sub;
        }
        let node = &self.nodes[dep as usize];
        if node.subs_head == NONE && node.flags & COMPUTED != 0 {
            self.unwatched.push(dep);
        }
    }

    /// Computeds that lost their last subscriber let go of their own
    /// dependencies (cascading upstream) and become dirty: nothing observes
    /// them, so they keep no links alive and cost writes nothing; the next
    /// read recomputes and re-subscribes. A running computed keeps its
    /// dependencies (its run is tracking them).
    fn release_unwatched(&mut self) {
        while let Some(index) = self.unwatched.pop() {
            let node = &mut self.nodes[index as usize];
            if node.flags & (ALIVE | COMPUTED | RUNNING) != ALIVE | COMPUTED || node.subs_head != NONE {
                continue;
            }
            let mut l = node.deps_head;
            node.deps_head = NONE;
            node.deps_tail = NONE;
            node.flags = (node.flags & !PENDING) | DIRTY;
            while l != NONE {
                let next = self.links[l as usize].next_dep;
                self.unlink_sub_side(l);
                self.free_link(l);
                l = next;
            }
        }
    }

    /// Removes `l` from its subscriber's dependency list.
    fn unlink_dep_side(&mut self, l: u32) {
        let Link { sub, prev_dep, next_dep, .. } = self.links[l as usize];
        let node = &mut self.nodes[sub as usize];
        if node.deps_tail == l {
            node.deps_tail = prev_dep;
        }
        if prev_dep == NONE {
            node.deps_head = next_dep;
        } else {
            self.links[prev_dep as usize].next_dep = next_dep;
        }
        if next_dep != NONE {
            self.links[next_dep as usize].prev_dep = prev_dep;
        }
    }

    /// Starts a tracked run of live node `index`: clears its marks, makes
    /// it the active computation and owner, rewinds its dependency cursor,
    /// and lends out its object (returned by [`Graph::end`]). Returns the
    /// node's key, what the run replaces, and the object; `None` (and no
    /// change) if the node has no object to run.
    #[inline(always)]
    pub(crate) fn begin(&mut self, index: u32) -> Option<(Key, Saved, F::Obj)> {
        let node = &mut self.nodes[index as usize];
        let obj = node.obj.take()?;
        let saved = Saved { active: self.active, owner: self.owner, depth: self.depth };
        node.flags = (node.flags & !(DIRTY | PENDING | ORPHAN)) | RUNNING;
        node.deps_tail = NONE;
        node.runs = node.runs.wrapping_add(1);
        node.aux = saved.active;
        let key = Key { index, generation: node.generation };
        self.owner = index;
        self.active = index;
        self.depth = saved.depth + 1;
        Some((key, saved, obj))
    }

    /// Ends a run started by [`Graph::begin`]: restores the context, takes
    /// the object back, and drops the dependencies this run did not read.
    /// On `failed` (the function panicked) the node is marked as
    /// [`Graph::mark_failed`] says and keeps every dependency (the old
    /// ones it did not get to); otherwise a computed's failure is over.
    #[inline(always)]
    pub(crate) fn end(&mut self, key: Key, saved: Saved, obj: Option<F::Obj>, failed: bool) -> Ended<F> {
        self.active = saved.active;
        self.owner = saved.owner;
        self.depth = saved.depth;
        let node = &mut self.nodes[key.index as usize];
        if node.generation != key.generation || node.flags & ALIVE == 0 {
            return Ended { leftover: obj, flags: 0 };
        }
        if let Some(previous) = std::mem::replace(&mut node.obj, obj) {
            unreachable!("graph invariant: a running node's object is lent out ({:p})", &previous);
        }
        let flags = node.flags;
        node.flags = flags & !(RUNNING | FAILED);
        if failed {
            // What the failed run did not get to read stays a dependency:
            // a change there must still reach the node.
            self.mark_failed(key.index);
            return Ended { leftover: None, flags };
        }
        let tail = node.deps_tail;
        let stale = if tail == NONE { node.deps_head } else { self.links[tail as usize].next_dep };
        if stale != NONE {
            self.trim(key.index);
        }
        Ended { leftover: None, flags }
    }

    /// Starts a run tracked through an explicit handle (an async effect):
    /// like [`Graph::begin`] for the node, leaving the context untouched.
    #[cfg(feature = "async")]
    pub(crate) fn begin_detached(&mut self, index: u32) {
        let node = &mut self.nodes[index as usize];
        node.flags &= !(DIRTY | PENDING | ORPHAN);
        node.deps_tail = NONE;
        node.runs = node.runs.wrapping_add(1);
    }

    /// Ends a run started by [`Graph::begin_detached`]: drops the
    /// dependencies it did not read.
    #[cfg(feature = "async")]
    pub(crate) fn end_detached(&mut self, index: u32) {
        self.trim(index);
    }

    /// Drops the dependencies of `index` past its dependency cursor.
    fn trim(&mut self, index: u32) {
        let tail = self.nodes[index as usize].deps_tail;
        let mut l =
            if tail == NONE { self.nodes[index as usize].deps_head } else { self.links[tail as usize].next_dep };
        while l != NONE {
            let next = self.links[l as usize].next_dep;
            self.unlink_sub_side(l);
            self.free_link(l);
            l = next;
        }
        if tail == NONE {
            self.nodes[index as usize].deps_head = NONE;
        } else {
            self.links[tail as usize].next_dep = NONE;
        }
        self.release_unwatched();
    }

    /// Starts an untracked stretch: reads inside link to nothing.
    pub(crate) fn untrack(&mut self) -> u32 {
        std::mem::replace(&mut self.active, NONE)
    }

    // ---- propagation -------------------------------------------------

    /// A signal's value changed: mark its subscribers dirty and everything
    /// downstream pending, queueing each effect reached once. Iterative; a
    /// resume point is kept only where a sibling remains.
    pub(crate) fn propagate(&mut self, signal: u32) {
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
    fn mark_pending(&mut self, mut down: u32) {
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

    fn enqueue(&mut self, index: u32) {
        let node = &mut self.nodes[index as usize];
        if node.flags & QUEUED == 0 {
            node.flags |= QUEUED;
            let generation = node.generation;
            self.queue.push(Key { index, generation });
        }
    }

    // ---- ownership and disposal --------------------------------------

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
    /// siblings, no object.
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
        self.free_nodes.push(index);
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
    fn orphan(&mut self, sub: u32, version: u32) {
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
    fn unlink_all(&mut self, index: u32) {
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
        self.free_nodes.clear();
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
            self.free_nodes.push(index);
        }
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
