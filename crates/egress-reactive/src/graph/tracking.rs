//! Dependency tracking: links made, reused and trimmed as a computation
//! runs, in the two lists each link sits in.

use super::flags::*;
use super::{Ended, Graph, Key, Link, NONE, Node, Saved};
use crate::flavor::Flavor;

/// What [`Graph::begin_queued`] found.
pub(crate) enum Queued<F: Flavor> {
    /// The effect was disposed since it was queued: nothing to run.
    Gone,
    /// Its run has begun: key, what the run replaces, and the object.
    Begun(Key, Saved, F::Obj),
    /// Anything else, with the node's flags (unqueued).
    Other(u32),
}

/// The body of [`Graph::begin`] for `node` (at `index`), whose object `obj`
/// was taken out: `active`, `owner` and `depth` are the graph's.
#[inline(always)]
fn start<F: Flavor>(
    node: &mut Node<F>,
    index: u32,
    obj: F::Obj,
    active: &mut u32,
    owner: &mut u32,
    depth: &mut u32,
) -> (Key, Saved, F::Obj) {
    let saved = Saved { active: *active, owner: *owner, depth: *depth };
    node.flags = (node.flags & !(DIRTY | PENDING | ORPHAN | WALKING)) | RUNNING;
    node.deps_tail = NONE;
    node.runs = node.runs.wrapping_add(1);
    node.aux = saved.active;
    let key = Key { index, generation: node.generation };
    *owner = index;
    *active = index;
    *depth = saved.depth + 1;
    (key, saved, obj)
}

impl<F: Flavor> Graph<F> {
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
        // A dependency read again in this run, after others (its link is
        // the newest of its subscribers'): nothing to do.
        let runs = node.runs;
        let subs_tail = nodes[dep as usize].subs_tail;
        if subs_tail != NONE {
            let last = &links[subs_tail as usize];
            if last.sub == sub && last.version == runs {
                return;
            }
        }
        self.link_slow(dep, sub, prev, next, subs_tail);
    }

    /// Links `dep` to `sub` anew, between `prev` and `next` in the
    /// subscriber's dependencies and after `subs_tail` in the dependency's
    /// subscribers.
    #[inline(never)]
    pub(super) fn link_slow(&mut self, dep: u32, sub: u32, prev: u32, next: u32, subs_tail: u32) {
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

    pub(super) fn alloc_link(&mut self, link: Link) -> u32 {
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

    pub(super) fn free_link(&mut self, l: u32) {
        self.live_links -= 1;
        let link = &mut self.links[l as usize];
        link.dep = NONE;
        link.sub = NONE;
        link.next_dep = self.free_link;
        self.free_link = l;
    }

    /// Removes `l` from its dependency's subscriber list. A computed left
    /// with no subscriber is noted, for [`Graph::release_unwatched`].
    pub(super) fn unlink_sub_side(&mut self, l: u32) {
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
    pub(super) fn release_unwatched(&mut self) {
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
    pub(super) fn unlink_dep_side(&mut self, l: u32) {
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
        let Graph { nodes, active, owner, depth, .. } = self;
        let node = &mut nodes[index as usize];
        let obj = node.obj.take()?;
        Some(start(node, index, obj, active, owner, depth))
    }

    /// Unqueues effect `key` (queued by a write) and, in the common case, a
    /// synchronous effect the write reached with nothing to dispose or
    /// clean up before it runs, begins its run as [`Graph::begin`] does,
    /// in the same look at the node. Any other case is left to the caller
    /// with the node's flags: one whose dependencies must be re-validated,
    /// an async one, one with children or cleanups, or one without an
    /// object.
    #[inline(always)]
    pub(crate) fn begin_queued(&mut self, key: Key) -> Queued<F> {
        let Graph { nodes, active, owner, depth, .. } = self;
        let node = &mut nodes[key.index as usize];
        if node.generation != key.generation || node.flags & ALIVE == 0 {
            return Queued::Gone;
        }
        let flags = node.flags & !QUEUED;
        node.flags = flags;
        if flags & (DIRTY | ASYNC | HAS_CLEANUP) != DIRTY || node.last_child != NONE {
            return Queued::Other(flags);
        }
        let Some(obj) = node.obj.take() else { return Queued::Other(flags) };
        let (key, saved, obj) = start(node, key.index, obj, active, owner, depth);
        Queued::Begun(key, saved, obj)
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
    pub(super) fn trim(&mut self, index: u32) {
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
}
