//! The operations that run user code: re-validation, recomputation, effect
//! runs, batch settlement, disposal.
//!
//! Every function here takes the graph's `RefCell` and borrows it only
//! between calls into user code, never across one, so user code may read,
//! write and create nodes freely (re-entrancy is the normal case: a computed
//! reads other computeds).

use std::cell::{RefCell, RefMut};

use crate::error::{CycleError, EffectLoopError};
use crate::flavor::{Entered, Flavor};
use crate::graph::{Graph, Key, NONE, Saved, flags::*};

pub(crate) type Cell<F> = RefCell<Graph<F>>;

/// A feedback loop among effects stops after this many rounds; see
/// [`EffectLoopError`].
pub const MAX_FLUSH_ROUNDS: u32 = 10_000;

/// Nested evaluations deeper than this run on a stack segment grown on
/// demand, so reading a long chain of never-evaluated computeds cannot
/// overflow the thread's stack.
const DEEP: usize = 64;

/// Ends a run if its function unwinds.
struct Unwind<'a, F: Flavor> {
    cell: &'a Cell<F>,
    key: Key,
    saved: Saved,
    obj: Option<F::Obj>,
}

impl<F: Flavor> Drop for Unwind<'_, F> {
    fn drop(&mut self) {
        let leftover = self.cell.borrow_mut().end(self.key, self.saved, self.obj.take(), true);
        drop(leftover);
    }
}

/// Runs the function of computed or effect `index`, tracked. Disposes what
/// its previous run created and runs its cleanups first. Returns whether a
/// computed's value changed (always true for an effect).
pub(crate) fn update<F: Flavor>(cell: &Cell<F>, index: u32) -> bool {
    update_borrowed(cell, cell.borrow_mut(), index)
}

/// [`update`] for a caller that has the graph borrowed already.
#[inline(always)]
fn update_borrowed<'a, F: Flavor>(cell: &'a Cell<F>, mut g: RefMut<'a, Graph<F>>, index: u32) -> bool {
    let node = g.node(index);
    if node.last_child != NONE || node.flags & HAS_CLEANUP != 0 {
        drop(g);
        dispose(cell, index, false);
        g = cell.borrow_mut();
    }
    let (key, saved, obj) = g.begin(index);
    drop(g);
    let guard = Unwind { cell, key, saved, obj: Some(obj) };
    let obj = guard.obj.as_ref().expect("graph invariant: a running node keeps its object");
    let entered = Entered::by(cell);
    let changed = if saved.depth as usize >= DEEP {
        stacker::maybe_grow(256 * 1024, 4 * 1024 * 1024, || F::obj(obj).run(&entered))
    } else {
        F::obj(obj).run(&entered)
    };
    let mut guard = std::mem::ManuallyDrop::new(guard);
    let obj = guard.obj.take();
    let leftover = cell.borrow_mut().end(key, saved, obj, false);
    drop(leftover);
    changed
}

/// Whether `start` (pending) must recompute: walks its dependencies in read
/// order, re-validating pending computeds deepest first and recomputing dirty
/// ones, and stops at the first whose value changed. Iterative: its frames
/// live on the graph's walk stack, above the frames of any walk that is
/// running user code further out.
pub(crate) fn check_dirty<F: Flavor>(cell: &Cell<F>, start: u32) -> bool {
    let mut g = cell.borrow_mut();
    let base = g.walk_stack.len();
    let mut node = start;
    let mut link = g.node(start).deps_head;
    let dirty = 'walk: loop {
        // Scan `node`'s dependencies from `link` for one to re-validate.
        let mut dirty = false;
        let mut step = None;
        while link != NONE {
            if g.node(node).flags & DIRTY != 0 {
                dirty = true;
                break;
            }
            let dep = g.link_at(link).dep;
            let f = g.node(dep).flags;
            if f & COMPUTED != 0 && f & (DIRTY | PENDING) != 0 {
                step = Some((dep, f & DIRTY != 0));
                break;
            }
            link = g.link_at(link).next_dep;
        }
        if link == NONE && g.node(node).flags & DIRTY != 0 {
            dirty = true;
        }
        match step {
            Some((dep, true)) => {
                let changed;
                (g, changed) = recompute_in_walk(cell, g, dep);
                if changed {
                    dirty = true;
                } else {
                    link = g.link_at(link).next_dep;
                    continue 'walk;
                }
            }
            Some((dep, false)) => {
                g.walk_stack.push((node, link));
                node = dep;
                link = g.node(dep).deps_head;
                continue 'walk;
            }
            None => {}
        }
        // `node` is settled: dirty (must recompute) or clean.
        loop {
            if g.walk_stack.len() == base {
                break 'walk dirty;
            }
            let (parent, parent_link) = g.walk_stack.pop().expect("stack above base");
            if dirty {
                let changed;
                (g, changed) = recompute_in_walk(cell, g, node);
                if changed {
                    node = parent;
                    continue;
                }
            } else {
                g.node_mut(node).flags &= !PENDING;
            }
            node = parent;
            link = g.link_at(parent_link).next_dep;
            continue 'walk;
        }
    };
    if !dirty {
        g.node_mut(start).flags &= !PENDING;
    }
    dirty
}

/// Recomputes `node` in the middle of a [`check_dirty`] walk: releases the
/// graph for the user code, drops any frames an unwound inner walk left
/// above ours, and marks the subscribers dirty if the value changed.
#[inline(always)]
fn recompute_in_walk<'a, F: Flavor>(
    cell: &'a Cell<F>,
    g: std::cell::RefMut<'a, Graph<F>>,
    node: u32,
) -> (std::cell::RefMut<'a, Graph<F>>, bool) {
    let depth = g.walk_stack.len();
    drop(g);
    let changed = update(cell, node);
    let mut g = cell.borrow_mut();
    g.walk_stack.truncate(depth);
    if changed {
        g.shallow_propagate(node);
    }
    (g, changed)
}

/// Brings computed `index` up to date (the read path). Fails, changing
/// nothing, when the computed is running: the read closes a cycle.
pub(crate) fn refresh<F: Flavor>(cell: &Cell<F>, index: u32) -> Result<(), CycleError> {
    let flags = {
        let g = cell.borrow();
        if !g.writes.is_empty() {
            drop(g);
            settle(cell);
        }
        cell.borrow().node(index).flags
    };
    if flags & RUNNING != 0 {
        let g = cell.borrow();
        // Follow the callers from the computation running now back to
        // `index`: that is the cycle, innermost first; report it from `index`.
        let mut nodes = Vec::new();
        let mut at = g.active;
        while at != NONE && at != index {
            nodes.push(g.site(at));
            at = g.node(at).aux;
        }
        nodes.push(g.site(index));
        nodes.reverse();
        return Err(CycleError { nodes });
    }
    let stale = flags & DIRTY != 0 || (flags & PENDING != 0 && check_dirty(cell, index));
    if stale && update(cell, index) {
        cell.borrow_mut().shallow_propagate(index);
    }
    Ok(())
}

/// Applies the writes of an ended batch: each signal whose value differs
/// from the one the batch replaced propagates; one written back to its old
/// value notifies nothing. Walks the write list in place.
pub(crate) fn settle<F: Flavor>(cell: &Cell<F>) {
    let mut next = 0;
    loop {
        let (key, obj) = {
            let mut g = cell.borrow_mut();
            let Some(&key) = g.writes.get(next) else {
                g.writes.clear();
                return;
            };
            next += 1;
            if !g.alive(key) {
                continue;
            }
            let node = g.node_mut(key.index);
            node.flags &= !BATCHED;
            (key, node.obj.clone().map(|obj| (obj, node.aux)))
        };
        // A source without an object is a trigger: written means changed.
        let changed = obj.is_none_or(|(obj, aux)| F::obj(&obj).settle(&Entered::by(cell), aux));
        if changed {
            cell.borrow_mut().propagate(key.index);
        }
    }
}

/// Notifies the subscribers of each live trigger in `triggers` (sources
/// without a value: see [`Handle::trigger`](crate::Handle)), as one write:
/// inside a batch they are deferred to its end like signal writes;
/// otherwise they propagate and queued effects run once, after all of them.
pub(crate) fn notify<F: Flavor>(cell: &Cell<F>, triggers: &[Key]) -> Result<(), EffectLoopError> {
    if mark(cell, triggers) { Ok(()) } else { flush(cell) }
}

/// [`notify`] without running the effects it queues: for code running
/// inside an effect, whose flush (or creation) runs them next. Returns
/// whether a batch deferred the triggers.
pub(crate) fn mark<F: Flavor>(cell: &Cell<F>, triggers: &[Key]) -> bool {
    {
        let mut g = cell.borrow_mut();
        let batching = g.batching();
        for &key in triggers {
            // Nobody to notify: a later subscriber reads the fresh value.
            if !g.alive(key) || g.node(key.index).subs_head == NONE {
                continue;
            }
            if batching {
                let node = g.node_mut(key.index);
                if node.flags & BATCHED == 0 {
                    node.flags |= BATCHED;
                    g.writes.push(key);
                }
            } else {
                g.propagate(key.index);
            }
        }
        batching
    }
}

/// Settles pending writes and runs queued effects, unless a batch, a
/// computation or a flush is in progress (that one finishes the job).
pub(crate) fn settle_and_flush<F: Flavor>(cell: &Cell<F>) -> Result<(), EffectLoopError> {
    {
        let g = cell.borrow();
        if g.batching() || g.flushing || (g.writes.is_empty() && g.queue.is_empty()) {
            return Ok(());
        }
    }
    settle(cell);
    flush(cell)
}

/// Ends a flush on every path: the queue loses what has run (if an effect
/// panicked, the ones not yet run stay queued, still marked, and the next
/// flush runs them).
struct FlushGuard<'a, F: Flavor> {
    cell: &'a Cell<F>,
    next: usize,
}

impl<F: Flavor> Drop for FlushGuard<'_, F> {
    fn drop(&mut self) {
        let mut g = self.cell.borrow_mut();
        g.flushing = false;
        let done = self.next.min(g.queue.len());
        g.queue.drain(..done);
    }
}

/// Runs queued effects, round by round (a round is what the previous one
/// queued), until none is queued. Walks the queue in place.
pub(crate) fn flush<F: Flavor>(cell: &Cell<F>) -> Result<(), EffectLoopError> {
    {
        let mut g = cell.borrow_mut();
        if g.flushing || g.batching() || g.queue.is_empty() {
            return Ok(());
        }
        g.flushing = true;
    }
    let mut guard = FlushGuard { cell, next: 0 };
    let (mut round_end, mut rounds) = (0, 0);
    loop {
        let mut g = cell.borrow_mut();
        // What the previous run wrote settles before anything else runs.
        if !g.writes.is_empty() {
            drop(g);
            settle(cell);
            g = cell.borrow_mut();
        }
        if guard.next == round_end {
            if round_end == g.queue.len() {
                break;
            }
            round_end = g.queue.len();
            rounds += 1;
            if rounds > MAX_FLUSH_ROUNDS {
                // Stop the loop: unmark what is still queued, so the next
                // change that reaches those effects queues them afresh.
                let stuck: Vec<Key> = g.queue.drain(guard.next..).collect();
                let effect = stuck.iter().find(|&&k| g.alive(k)).map(|k| g.site(k.index));
                for key in stuck {
                    if g.alive(key) {
                        g.node_mut(key.index).flags &= !(QUEUED | DIRTY | PENDING);
                    }
                }
                let effect = effect.unwrap_or_else(|| g.site(g.root));
                return Err(EffectLoopError { rounds: MAX_FLUSH_ROUNDS, effect });
            }
        }
        let key = g.queue[guard.next];
        guard.next += 1;
        run_queued(cell, g, key);
    }
    Ok(())
}

/// Runs a queued effect if what it read changed.
#[inline(always)]
fn run_queued<'a, F: Flavor>(cell: &'a Cell<F>, mut g: RefMut<'a, Graph<F>>, key: Key) {
    if !g.alive(key) {
        return;
    }
    let node = g.node_mut(key.index);
    node.flags &= !QUEUED;
    let flags = node.flags;
    if flags & (DIRTY | ASYNC) == DIRTY {
        // The common case: a synchronous effect that a write reached.
        update_borrowed(cell, g, key.index);
        return;
    }
    drop(g);
    if flags & DIRTY == 0 && !(flags & PENDING != 0 && check_dirty(cell, key.index)) {
        return;
    }
    if flags & ASYNC != 0 {
        let obj = {
            let mut g = cell.borrow_mut();
            let node = g.node_mut(key.index);
            node.flags |= DIRTY;
            node.obj.clone()
        };
        if let Some(obj) = obj {
            F::obj(&obj).schedule();
        }
    } else {
        update(cell, key.index);
    }
}

/// Disposes the subtree under `index`: children before parents, later
/// siblings first, each node's cleanups before it is freed. With
/// `include_self` false, `index` keeps its slot and links but loses its
/// children and runs its cleanups (what an owner does before it re-runs).
///
/// An iterative post-order walk over the ownership links, allocating
/// nothing: descend to the last child until a leaf, free it (its owner's
/// last child becomes its previous sibling), go back up. The graph is
/// released only to run cleanups and to drop user objects (in chunks).
pub(crate) fn dispose<F: Flavor>(cell: &Cell<F>, index: u32, include_self: bool) {
    const CHUNK: usize = 256;
    // Objects of freed nodes, with their `aux`, released outside the borrow.
    let mut objs: Vec<(F::Obj, u32)> = Vec::new();
    let release = |objs: &mut Vec<(F::Obj, u32)>| {
        let entered = Entered::by(cell);
        for (obj, aux) in objs.drain(..) {
            F::obj(&obj).release(&entered, aux);
        }
    };
    let mut g = cell.borrow_mut();
    if index == g.root && !include_self && g.free_all(&mut objs) {
        drop(g);
        release(&mut objs);
        return;
    }
    let root_key = g.key(index);
    let mut cur = index;
    loop {
        let last = g.node(cur).last_child;
        if last != NONE {
            cur = last;
            continue;
        }
        // `cur` has no children left: run its cleanups, then free it.
        if g.node(cur).flags & HAS_CLEANUP != 0 {
            let cleanups = g.take_cleanups(cur);
            drop(g);
            for cleanup in cleanups {
                F::run_cleanup(cleanup);
            }
            g = cell.borrow_mut();
            if !g.alive(root_key) {
                break;
            }
            if g.node(cur).last_child != NONE {
                continue; // a cleanup created something here: dispose it too
            }
        }
        let (owner, aux) = (g.node(cur).owner, g.node(cur).aux);
        if cur == index {
            if include_self {
                objs.extend(g.free(cur).map(|obj| (obj, aux)));
            }
            break;
        }
        objs.extend(g.free(cur).map(|obj| (obj, aux)));
        if objs.len() >= CHUNK {
            drop(g);
            release(&mut objs);
            g = cell.borrow_mut();
        }
        if owner == NONE || g.node(owner).flags & ALIVE == 0 {
            break;
        }
        cur = owner;
    }
    drop(g);
    release(&mut objs);
}
