//! The operations that run user code: re-validation, recomputation, effect
//! runs, batch settlement, disposal.
//!
//! Every function here takes the graph's `RefCell` and borrows it only
//! between calls into user code, never across one, so user code may read,
//! write and create nodes freely (re-entrancy is the normal case: a computed
//! reads other computeds).

use std::cell::{RefCell, RefMut};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use crate::error::{CycleError, EffectLoopError};
use crate::flavor::{Entered, Flavor};
use crate::graph::{Ended, Freed, Graph, Key, NONE, Queued, Saved, aux_block, flags::*};

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
        let ended = self.cell.borrow_mut().end(self.key, self.saved, self.obj.take(), true);
        // A node disposed during a run that failed is disposed now. A panic
        // of the user code that runs (its cleanups, destructors) would be a
        // second panic while this one unwinds: it is dropped.
        drop(finish(self.cell, self.key, ended));
    }
}

/// Drops what a run left over, and disposes a node disposed during it.
/// Returns the first panic of the user code that ran.
#[inline(always)]
fn finish<F: Flavor>(cell: &Cell<F>, key: Key, ended: Ended<F>) -> Option<Panic> {
    if ended.leftover.is_none() && ended.flags & DOOMED == 0 {
        return None;
    }
    finish_slow(cell, key, ended)
}

#[cold]
#[inline(never)]
fn finish_slow<F: Flavor>(cell: &Cell<F>, key: Key, ended: Ended<F>) -> Option<Panic> {
    let mut first_panic = ended.leftover.and_then(|obj| catch_unwind(AssertUnwindSafe(|| drop(obj))).err());
    if ended.flags & DOOMED != 0 {
        let alive = cell.borrow().alive(key);
        if alive && let Some(panic) = dispose_caught(cell, key.index, true) {
            first_panic.get_or_insert(panic);
        }
    }
    first_panic
}

/// Runs the function of computed or effect `key`, tracked, if it is alive.
/// Disposes what its previous run created and runs its cleanups first.
/// Returns whether a computed's value changed (always true for an effect;
/// false when it did not run).
pub(crate) fn update<F: Flavor>(cell: &Cell<F>, key: Key) -> bool {
    let g = cell.borrow_mut();
    // User code may have freed it (and a new node taken its slot) since the
    // caller looked.
    if !g.alive(key) {
        return false;
    }
    update_borrowed(cell, g, key).0
}

/// [`update`] for a caller that has the graph borrowed already; returns the
/// graph borrowed again, for the caller's next step.
#[inline(always)]
fn update_borrowed<'a, F: Flavor>(
    cell: &'a Cell<F>,
    mut g: RefMut<'a, Graph<F>>,
    key: Key,
) -> (bool, RefMut<'a, Graph<F>>) {
    let index = key.index;
    debug_assert!(g.alive(key), "graph invariant: only live nodes are updated");
    let node = g.node(index);
    if node.last_child != NONE || node.flags & HAS_CLEANUP != 0 {
        drop(g);
        if !clean_before_run(cell, key) {
            return (false, cell.borrow_mut());
        }
        g = cell.borrow_mut();
    }
    let Some((key, saved, obj)) = g.begin(index) else { return (false, g) };
    run_begun(cell, g, key, saved, obj)
}

/// Runs the function of node `key`, whose run [`Graph::begin`] (or
/// [`Graph::begin_queued`]) has begun, and ends the run; as
/// [`update_borrowed`] returns.
#[inline(always)]
fn run_begun<'a, F: Flavor>(
    cell: &'a Cell<F>,
    g: RefMut<'a, Graph<F>>,
    key: Key,
    saved: Saved,
    obj: F::Obj,
) -> (bool, RefMut<'a, Graph<F>>) {
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
    let mut g = cell.borrow_mut();
    let ended = g.end(key, saved, obj, false);
    // A computed that had failed has had no valid value since: whatever it
    // computes now is a change.
    let changed = changed || ended.flags & FAILED != 0;
    if ended.leftover.is_none() && ended.flags & DOOMED == 0 {
        return (changed, g);
    }
    drop(g);
    if let Some(panic) = finish_slow(cell, key, ended) {
        resume_unwind(panic);
    }
    (changed, cell.borrow_mut())
}

/// Disposes what the previous run of `key` created and runs its cleanups.
/// Returns whether `key` may run: not if its cleanups disposed it (then it
/// is disposed now). A cleanup that panicked fails the run it came before:
/// the node is marked failed and the panic resumed.
#[cold]
#[inline(never)]
pub(crate) fn clean_before_run<F: Flavor>(cell: &Cell<F>, key: Key) -> bool {
    let mut first_panic = dispose_caught(cell, key.index, false);
    let mut g = cell.borrow_mut();
    let alive = g.alive(key);
    let doomed = alive && g.node(key.index).flags & DOOMED != 0;
    if let Some(panic) = first_panic.take() {
        if alive && !doomed {
            g.mark_failed(key.index);
            drop(g);
            resume_unwind(panic);
        }
        first_panic = Some(panic);
    }
    drop(g);
    if doomed && let Some(panic) = dispose_caught(cell, key.index, true) {
        first_panic.get_or_insert(panic);
    }
    if let Some(panic) = first_panic {
        resume_unwind(panic);
    }
    alive && !doomed
}

/// Undoes an unwound [`check_dirty`] walk: its frames leave the walk stack
/// and every node it stood on is marked failed ([`Graph::mark_failed`]),
/// so that none stays marked with nothing queued to clear it (a node left
/// `DIRTY` or `PENDING` stops propagation for good). While the walk runs
/// user code, every node it stands on is in a frame or in `node` (the node
/// being recomputed marks itself, through its run's own guard).
struct Walk<'a, F: Flavor> {
    cell: &'a Cell<F>,
    base: usize,
    start: u32,
    /// The node whose dependency is being recomputed, if it is in no frame.
    node: u32,
    /// Cleared when the walk returns. (Not `thread::panicking()`: a walk
    /// may run, and return, while an outer panic unwinds, inside a flush
    /// that finishes its queue first: see [`FlushGuard`].)
    armed: bool,
}

impl<F: Flavor> Drop for Walk<'_, F> {
    #[inline(always)]
    fn drop(&mut self) {
        if self.armed {
            self.unwound();
        }
    }
}

impl<F: Flavor> Walk<'_, F> {
    #[cold]
    #[inline(never)]
    fn unwound(&mut self) {
        let mut g = self.cell.borrow_mut();
        let len = g.walk_stack.len();
        let frames = g.walk_stack.split_off(self.base.min(len));
        g.mark_failed(self.start);
        if self.node != NONE {
            g.mark_failed(self.node);
        }
        for (node, _) in frames {
            g.mark_failed(node);
        }
    }
}

/// Whether `start` (pending) must recompute: walks its dependencies in read
/// order, re-validating pending computeds deepest first and recomputing dirty
/// (or failed) ones, and stops at the first whose value changed. Iterative:
/// its frames live on the graph's walk stack, above the frames of any walk
/// that is running user code further out.
///
/// A recomputation that frees nodes (user code may dispose anything) could
/// free what the walk stands on: then the walk starts over from `start`, if
/// it is still alive (what it already re-validated stays clean). If it
/// unwinds, every node it stood on is marked failed ([`Walk`]).
pub(crate) fn check_dirty<F: Flavor>(cell: &Cell<F>, start: Key) -> bool {
    check_dirty_borrowed(cell, cell.borrow_mut(), start, true).0
}

/// [`check_dirty`] for a caller that has the graph borrowed already;
/// returns the graph borrowed again, for the caller's next step (a queued
/// effect's run). `computed`: the start is a computed, marked [`WALKING`]
/// while the walk stands on it; an effect is not (nothing reads it or
/// depends on it), which saves its walk the mark.
#[inline(always)]
fn check_dirty_borrowed<'a, F: Flavor>(
    cell: &'a Cell<F>,
    mut g: RefMut<'a, Graph<F>>,
    start: Key,
    computed: bool,
) -> (bool, RefMut<'a, Graph<F>>) {
    let base = g.walk_stack.len();
    let mut walk = Walk { cell, base, start: start.index, node: NONE, armed: true };
    debug_assert!(g.alive(start), "graph invariant: only live nodes are re-validated");
    'restart: loop {
        let mut node = start.index;
        if computed {
            g.node_mut(node).flags |= WALKING;
        }
        let mut link = g.node(node).deps_head;
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
                if f & COMPUTED != 0 && f & (DIRTY | PENDING | FAILED | RUNNING | WALKING) != 0 {
                    if f & (RUNNING | WALKING) != 0 {
                        // Being evaluated (its function runs, or a walk
                        // stands on it): `node` read it after reading
                        // nothing that changed, so its next run reads it
                        // again and closes a cycle. `node` must run, to
                        // meet it, not keep a value computed from what
                        // `dep` is replacing. When `dep` is on this walk,
                        // `node` is on a loop of links back to it (a read
                        // that failed in the cycle links its reader): the
                        // walk backs up to `dep`, which must run, as it
                        // would were it read for the first time; what it
                        // backs out of stays pending.
                        if f & WALKING != 0 && on_walk(&g, base, dep) {
                            while node != dep {
                                g.node_mut(node).flags &= !WALKING;
                                let Some((parent, _)) = g.walk_stack.pop() else { break };
                                node = parent;
                            }
                        }
                        dirty = true;
                        break;
                    }
                    step = Some((dep, f & (DIRTY | FAILED) != 0));
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
                    walk.node = node;
                    (g, changed) = recompute_in_walk(cell, g, dep);
                    walk.node = NONE;
                    let Some(changed) = changed else {
                        unwalk(&mut g, base, node, start.index);
                        if g.alive(start) {
                            continue 'restart;
                        }
                        walk.armed = false;
                        return (false, g);
                    };
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
                    let dep = g.node_mut(dep);
                    dep.flags |= WALKING;
                    link = dep.deps_head;
                    continue 'walk;
                }
                None => {}
            }
            // `node` is settled: dirty (must recompute) or clean.
            loop {
                if g.walk_stack.len() == base {
                    break 'walk dirty;
                }
                let (parent, parent_link) = g.walk_stack[g.walk_stack.len() - 1];
                if dirty {
                    // The parent's frame stays while `node` runs.
                    let changed;
                    (g, changed) = recompute_in_walk(cell, g, node);
                    let Some(changed) = changed else {
                        unwalk(&mut g, base, node, start.index);
                        if g.alive(start) {
                            continue 'restart;
                        }
                        walk.armed = false;
                        return (false, g);
                    };
                    g.walk_stack.pop();
                    if changed {
                        node = parent;
                        continue;
                    }
                } else {
                    g.walk_stack.pop();
                    g.node_mut(node).flags &= !(PENDING | WALKING);
                }
                node = parent;
                link = g.link_at(parent_link).next_dep;
                continue 'walk;
            }
        };
        // Dirty, it stays pending for the run that follows.
        if computed {
            g.node_mut(start.index).flags &= if dirty { !WALKING } else { !(PENDING | WALKING) };
        } else if !dirty {
            g.node_mut(start.index).flags &= !PENDING;
        }
        walk.armed = false;
        return (dirty, g);
    }
}

/// Whether `index` is on the walk whose frames start at `base`, above the
/// node it stands on now: a frame's node (the walk's start is the first
/// frame's, once it has descended; before, the start reads nothing on the
/// walk, since no computed is its own dependency: a read of itself fails
/// before it links).
#[cold]
fn on_walk<F: Flavor>(g: &Graph<F>, base: usize, index: u32) -> bool {
    g.walk_stack.iter().skip(base).any(|&(at, _)| at == index)
}

/// A walk starts over (or ends): the nodes it stood on, `start`, the
/// frames above `base` and `node` (where it was), are off it. A slot freed
/// meanwhile clears a mark it no longer has, or one a new node never had.
#[cold]
fn unwalk<F: Flavor>(g: &mut Graph<F>, base: usize, node: u32, start: u32) {
    let frames = g.walk_stack.split_off(base);
    for (at, _) in frames.into_iter().chain([(node, NONE), (start, NONE)]) {
        g.node_mut(at).flags &= !WALKING;
    }
}

/// Recomputes live node `node` in the middle of a [`check_dirty`] walk:
/// releases the graph for the user code, drops any frames an unwound inner
/// walk left above ours, and marks the subscribers dirty if the value
/// changed. Returns whether it changed, or `None` if user code freed linked
/// nodes meanwhile (the walk must start over: what it stands on may be
/// gone, the recomputed node included).
#[inline(always)]
fn recompute_in_walk<'a, F: Flavor>(
    cell: &'a Cell<F>,
    g: std::cell::RefMut<'a, Graph<F>>,
    node: u32,
) -> (std::cell::RefMut<'a, Graph<F>>, Option<bool>) {
    let depth = g.walk_stack.len();
    let epoch = g.epoch;
    let key = g.key(node);
    // Alive: the walk reached it through a link, under this borrow.
    let (changed, mut g) = update_borrowed(cell, g, key);
    g.walk_stack.truncate(depth);
    // A changed value reaches the subscribers before anything else: when
    // the run freed nodes, the walk starts over (or ends, its start gone),
    // and a subscriber that is not on it (a sibling effect queued behind
    // it) learns of the change only through this mark.
    if changed && g.alive(key) {
        g.shallow_propagate(node);
    }
    if g.epoch != epoch {
        return (g, None);
    }
    (g, Some(changed))
}

/// Brings computed `index` up to date (the read path). Fails, changing
/// nothing, when the computed is running: the read closes a cycle.
pub(crate) fn refresh<F: Flavor>(cell: &Cell<F>, index: u32) -> Result<(), CycleError> {
    let (flags, key) = {
        let mut g = cell.borrow();
        if !g.writes.is_empty() {
            drop(g);
            settle(cell);
            g = cell.borrow();
        }
        let node = g.node(index);
        (node.flags, Key { index, generation: node.generation })
    };
    if flags & (RUNNING | WALKING) != 0 {
        let g = cell.borrow();
        // Follow the callers from the computation running now back to
        // `index`: that is the cycle, innermost first; report it from `index`.
        // A computed on a walk is not among the callers (the walk runs what
        // it depends on, and the callers go on past the walk): the cycle
        // is named by `index` and the computation that read it.
        let mut nodes = Vec::new();
        let mut at = g.active;
        if flags & RUNNING == 0 && at != NONE {
            nodes.push(g.site(at));
            at = index;
        }
        while at != NONE && at != index {
            nodes.push(g.site(at));
            at = g.node(at).aux;
        }
        nodes.push(g.site(index));
        nodes.reverse();
        return Err(CycleError { nodes });
    }
    let stale = flags & (DIRTY | FAILED | ORPHAN) != 0 || (flags & PENDING != 0 && check_dirty(cell, key));
    if stale && update(cell, key) {
        let mut g = cell.borrow_mut();
        if g.alive(key) {
            g.shallow_propagate(index);
        }
    }
    Ok(())
}

/// Applies the writes of an ended batch: each signal whose value differs
/// from the one the batch replaced propagates; one written back to its old
/// value notifies nothing. Walks the write list in place. An equality that
/// panics (a signal's own, or `PartialEq`) counts as a difference: that
/// write propagates, and every one after it settles as usual ([`Settling`]),
/// before the panic goes on.
///
/// The settlement counts as a batch: what the user code it runs (an
/// equality) writes joins it, at the list's end, and what that code's
/// transitions mark waits for the flush after it. A settlement asked for
/// while one is under way (that code reads a computed) goes on from where
/// it is ([`Graph::settled`](crate::graph::Graph)): it never compares a
/// write twice, or the one being compared.
pub(crate) fn settle<F: Flavor>(cell: &Cell<F>) {
    cell.borrow_mut().batch_depth += 1;
    let mut settling = Settling { cell, current: None, armed: true };
    settle_from(cell, &mut settling.current);
    settling.armed = false;
}

/// The body of [`settle`]: settles the writes from the list's cursor on,
/// then clears the list. `current` holds the write whose equality runs.
#[inline(always)]
fn settle_from<F: Flavor>(cell: &Cell<F>, current: &mut Option<Key>) {
    loop {
        let (key, obj) = {
            let mut g = cell.borrow_mut();
            let Some(&key) = g.writes.get(g.settled) else {
                g.writes.clear();
                g.settled = 0;
                return;
            };
            g.settled += 1;
            if !g.alive(key) {
                continue;
            }
            let node = g.node_mut(key.index);
            node.flags &= !BATCHED;
            let (flags, aux) = (node.flags, node.aux);
            let obj = (flags & VALUED != 0).then(|| g.blocks.get(aux_block(aux)).clone());
            (key, obj.map(|obj| (obj, aux, if flags & CUSTOM_EQ != 0 { own_equality(&g, key) } else { None })))
        };
        // A source without a value is a trigger: written means changed.
        *current = Some(key);
        let changed =
            obj.is_none_or(|(obj, aux, own)| F::obj(&obj).settle(&Entered::by(cell), aux, own.as_deref().map(F::any)));
        *current = None;
        if changed {
            cell.borrow_mut().propagate_inline(key.index);
        }
    }
}

/// A signal's own equality (cloned out of the graph: it is called outside
/// the graph's borrow).
#[cold]
#[inline(never)]
fn own_equality<F: Flavor>(g: &Graph<F>, key: Key) -> Option<F::Ptr<F::Any>> {
    g.equalities.get(&key.index).cloned()
}

/// Ends a [`settle`] cut short by a panicking equality: the write being
/// settled (`current`, whose comparison consumed what it replaced) counts
/// as a change, and the later ones settle as usual, each equality's panic
/// caught and dropped (the first one is on its way), so that every write
/// forgets what it replaced and none is left marked.
struct Settling<'a, F: Flavor> {
    cell: &'a Cell<F>,
    current: Option<Key>,
    /// Cleared when `settle` returns (see [`Walk::armed`]).
    armed: bool,
}

impl<F: Flavor> Drop for Settling<'_, F> {
    #[inline(always)]
    fn drop(&mut self) {
        if self.armed {
            self.unwound();
        }
        self.cell.borrow_mut().batch_depth -= 1;
    }
}

impl<F: Flavor> Settling<'_, F> {
    #[cold]
    #[inline(never)]
    fn unwound(&mut self) {
        loop {
            if let Some(key) = self.current.take() {
                let mut g = self.cell.borrow_mut();
                if g.alive(key) {
                    g.propagate(key.index);
                }
            }
            if catch_unwind(AssertUnwindSafe(|| settle_from(self.cell, &mut self.current))).is_ok() {
                return;
            }
        }
    }
}

/// Notifies the subscribers of each live trigger in `triggers` (sources
/// without a value: see [`Handle::trigger`](crate::Handle)), as one write:
/// inside a batch they are deferred to its end like signal writes;
/// otherwise they propagate and queued effects run once, after all of them.
pub(crate) fn notify<F: Flavor>(cell: &Cell<F>, triggers: &[Key]) -> Result<(), EffectLoopError> {
    let mut marker = Marker::new(cell);
    for &key in triggers {
        marker.mark(key);
    }
    marker.flush()
}

/// [`notify`] without running the effects it queues: for code running
/// inside an effect, whose flush (or creation) runs them next.
pub(crate) fn mark<F: Flavor>(cell: &Cell<F>, triggers: &[Key]) {
    let mut marker = Marker::new(cell);
    for &key in triggers {
        marker.mark(key);
    }
}

/// Marks triggers one at a time under one borrow of the graph, as
/// [`mark`] does a slice of them: for a caller that learns them one by one
/// (a cell recounting its readers), so that they are never gathered first.
/// Runs no user code; dropping it releases the graph.
pub(crate) struct Marker<'a, F: Flavor> {
    cell: &'a Cell<F>,
    g: RefMut<'a, Graph<F>>,
    batching: bool,
}

impl<'a, F: Flavor> Marker<'a, F> {
    #[inline(always)]
    pub(crate) fn new(cell: &'a Cell<F>) -> Self {
        let g = cell.borrow_mut();
        let batching = g.batching();
        Marker { cell, g, batching }
    }

    /// Notifies the subscribers of trigger `key`, if it is alive and has
    /// any: deferred to the batch's end inside one, propagated otherwise.
    #[inline(always)]
    pub(crate) fn mark(&mut self, key: Key) {
        let g = &mut *self.g;
        // Nobody to notify: a later subscriber reads the fresh value.
        if !g.alive(key) || g.node(key.index).subs_head == NONE {
            return;
        }
        if self.batching {
            let node = g.node_mut(key.index);
            if node.flags & BATCHED == 0 {
                node.flags |= BATCHED;
                g.writes.push(key);
            }
        } else {
            g.propagate(key.index);
        }
    }

    /// Whether nothing is queued and nothing defers what this marking
    /// queues: no batch, run or settlement is under way (then nothing is
    /// waiting to settle either, and the flush that ends the marking runs
    /// what it queued, first), and the queue is empty (a flush under way
    /// never empties it before it ends).
    #[inline(always)]
    pub(crate) fn idle(&self) -> bool {
        !self.batching && self.g.queue.is_empty()
    }

    /// Whether the first effect queued runs its own code as soon as the
    /// flush reaches it: synchronous, and with no cleanups to run and no
    /// children to dispose first (user code that may dispose it, or
    /// panic, before it runs). The flush that ends an [idle](Self::idle)
    /// marking runs it before anything else.
    #[inline(always)]
    pub(crate) fn first_queued_runs_at_once(&self) -> bool {
        self.g.queue.first().is_some_and(|k| {
            let node = self.g.node(k.index);
            node.flags & (ASYNC | HAS_CLEANUP) == 0 && node.last_child == NONE
        })
    }

    /// Ends the marking: runs the effects it queued, unless a batch (or a
    /// run, or a flush under way) is to run them.
    #[inline(always)]
    pub(crate) fn flush(self) -> Result<(), EffectLoopError> {
        if self.batching {
            return Ok(());
        }
        flush_borrowed(self.cell, self.g)
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

/// Ends a flush that unwinds: the queue loses what has run. If the flush
/// unwinds (an effect, a computed it read or a cleanup panicked), it first
/// runs every effect still queued, each under `catch_unwind` (their panics
/// are dropped: the first one is on its way), so a panic never cuts a
/// flush short and the normal path pays for no `catch_unwind`. (A flush
/// that returns ends itself, under the borrow it returns with.)
struct FlushGuard<'a, F: Flavor> {
    cell: &'a Cell<F>,
    /// The queue position: what is before it has run.
    next: usize,
    /// Cleared when the flush returns (see [`Walk::armed`]).
    armed: bool,
}

impl<F: Flavor> Drop for FlushGuard<'_, F> {
    #[inline(always)]
    fn drop(&mut self) {
        if self.armed {
            self.unwound();
        }
    }
}

impl<F: Flavor> FlushGuard<'_, F> {
    /// Runs what is still queued (counting rounds afresh), each panic
    /// caught and dropped, then ends the flush.
    #[cold]
    #[inline(never)]
    fn unwound(&mut self) {
        while catch_unwind(AssertUnwindSafe(|| drop(flush_rounds(self.cell, self.cell.borrow_mut(), &mut self.next))))
            .is_err()
        {}
        let mut g = self.cell.borrow_mut();
        g.flushing = false;
        let done = self.next.min(g.queue.len());
        g.queue.drain(..done);
    }
}

/// Runs queued effects, round by round (a round is what the previous one
/// queued), until none is queued. Walks the queue in place.
///
/// A panicking effect (or a computed it reads, or a cleanup it runs) ends
/// that effect's run, which is marked failed; the flush goes on with the
/// others ([`FlushGuard`]), and the first panic continues once every queued
/// effect has run.
pub(crate) fn flush<F: Flavor>(cell: &Cell<F>) -> Result<(), EffectLoopError> {
    flush_borrowed(cell, cell.borrow_mut())
}

/// [`flush`] for a caller that has the graph borrowed already (it has just
/// propagated a write).
#[inline]
pub(crate) fn flush_borrowed<'a, F: Flavor>(
    cell: &'a Cell<F>,
    mut g: RefMut<'a, Graph<F>>,
) -> Result<(), EffectLoopError> {
    if g.flushing || g.batching() || g.queue.is_empty() {
        return Ok(());
    }
    g.flushing = true;
    let mut guard = FlushGuard { cell, next: 0, armed: true };
    let (result, mut g) = flush_rounds(cell, g, &mut guard.next);
    guard.armed = false;
    // Returned, so everything queued has run (or was unqueued, on a loop).
    g.flushing = false;
    g.queue.clear();
    result
}

/// The body of [`flush`]: runs queued effects from `*next` on. Returns with
/// the graph borrowed and `*next` at the queue's end.
#[inline(always)]
fn flush_rounds<'a, F: Flavor>(
    cell: &'a Cell<F>,
    mut g: RefMut<'a, Graph<F>>,
    next: &mut usize,
) -> (Result<(), EffectLoopError>, RefMut<'a, Graph<F>>) {
    let mut round_end = *next;
    let mut rounds = 0;
    loop {
        // What the previous run wrote settles before anything else runs.
        if !g.writes.is_empty() {
            drop(g);
            settle(cell);
            g = cell.borrow_mut();
        }
        if *next == round_end {
            if round_end == g.queue.len() {
                return (Ok(()), g);
            }
            round_end = g.queue.len();
            rounds += 1;
            if rounds > MAX_FLUSH_ROUNDS {
                // Stop the loop: unmark what is still queued, so the next
                // change that reaches those effects queues them afresh.
                let stuck: Vec<Key> = g.queue.drain(*next..).collect();
                let effect = stuck.iter().find(|&&k| g.alive(k)).map(|k| g.site(k.index));
                for key in stuck {
                    if g.alive(key) {
                        g.node_mut(key.index).flags &= !(QUEUED | DIRTY | PENDING);
                    }
                }
                let effect = effect.unwrap_or_else(|| g.site(g.root));
                return (Err(EffectLoopError { rounds: MAX_FLUSH_ROUNDS, effect }), g);
            }
        }
        // Past the end only if something drained the queue under this
        // flush (a nested flush, which `flush` never starts): nothing left.
        let Some(&key) = g.queue.get(*next) else {
            *next = g.queue.len();
            return (Ok(()), g);
        };
        *next += 1;
        g = run_queued(cell, g, key);
    }
}

/// Runs a queued effect if what it read changed. If the re-validation
/// unwinds, the effect is marked failed. Returns the graph borrowed again.
#[inline(always)]
fn run_queued<'a, F: Flavor>(cell: &'a Cell<F>, mut g: RefMut<'a, Graph<F>>, key: Key) -> RefMut<'a, Graph<F>> {
    match g.begin_queued(key) {
        Queued::Gone => g,
        // The common case: a synchronous effect that a write reached.
        Queued::Begun(key, saved, obj) => run_begun(cell, g, key, saved, obj).1,
        Queued::Other(flags) => run_queued_other(cell, g, key, flags),
    }
}

/// [`run_queued`] for any other queued effect (`flags`: its flags,
/// unqueued): one that read a computed (re-validated first), an async one
/// (scheduled), one with children or cleanups. Out of line: the flush's
/// common case stays small.
#[inline(never)]
fn run_queued_other<'a, F: Flavor>(
    cell: &'a Cell<F>,
    mut g: RefMut<'a, Graph<F>>,
    key: Key,
    flags: u32,
) -> RefMut<'a, Graph<F>> {
    let run = if flags & (DIRTY | ORPHAN) != 0 {
        true
    } else if flags & PENDING != 0 {
        let dirty;
        (dirty, g) = check_dirty_borrowed(cell, g, key, false);
        dirty
    } else {
        false
    };
    // The re-validation may have freed it.
    if !run || !g.alive(key) {
        return g;
    }
    if flags & ASYNC == 0 {
        return update_borrowed(cell, g, key).1;
    }
    let node = g.node_mut(key.index);
    node.flags |= DIRTY;
    let obj = node.obj.clone();
    drop(g);
    if let Some(obj) = obj {
        F::obj(&obj).schedule();
    }
    cell.borrow_mut()
}

/// A panic caught from user code, to be resumed later.
pub(crate) type Panic = Box<dyn std::any::Any + Send>;

/// Disposes the subtree under `index` (see [`dispose_caught`]), then
/// resumes the first panic of the user code it ran.
pub(crate) fn dispose<F: Flavor>(cell: &Cell<F>, index: u32, include_self: bool) {
    if let Some(panic) = dispose_caught(cell, index, include_self) {
        resume_unwind(panic);
    }
}

/// Disposes the subtree under `index`: children before parents, later
/// siblings first, each node's cleanups before it is freed. With
/// `include_self` false, `index` keeps its slot and links but loses its
/// children and runs its cleanups (what an owner does before it re-runs).
/// Returns the first panic of the user code it ran (cleanups, destructors);
/// every cleanup runs even if one panics.
///
/// An iterative post-order walk over the ownership links, allocating
/// nothing: descend to the last child until a leaf, free it (its owner's
/// last child becomes its previous sibling), go back up. The graph is
/// released only to run cleanups and to drop user objects (in chunks).
///
/// - A node whose function is running is not freed under it: it is
///   detached and [doomed](Graph::doom), and disposed when its run ends.
/// - Cleanups run untracked, owned by the node they clean up after (what
///   they create is disposed right after them, and cleanups they register
///   run right after them, up to [`MAX_FLUSH_ROUNDS`] rounds). The node
///   counts as running meanwhile, so a cleanup that disposes its own node,
///   or an owner of it, dooms it rather than freeing it under the walk.
/// - A cleanup may dispose anything else, this subtree included: the walk
///   then goes on from the nearest live owner, or ends if `index` is gone.
pub(crate) fn dispose_caught<F: Flavor>(cell: &Cell<F>, index: u32, include_self: bool) -> Option<Panic> {
    const CHUNK: usize = 256;
    let mut first_panic = None;
    // Objects of freed nodes, with their `aux`, released outside the borrow.
    let mut objs = Freed::<F>::new();
    let release = |objs: &mut Freed<F>, first_panic: &mut Option<Panic>| {
        let entered = Entered::by(cell);
        // Dropping an object runs the user's destructors too.
        let drop_caught = |obj: F::Obj, first_panic: &mut Option<Panic>| {
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| drop(obj))) {
                first_panic.get_or_insert(panic);
            }
        };
        // Each object is dropped once its own release and those of the
        // signals that share it (`None`) are done: in the order freed.
        let mut current: Option<F::Obj> = None;
        for (obj, aux) in objs.drain() {
            if let Some(obj) = obj
                && let Some(done) = current.replace(obj)
            {
                drop_caught(done, first_panic);
            }
            if let Some(obj) = &current
                && let Err(panic) = catch_unwind(AssertUnwindSafe(|| F::obj(obj).release(&entered, aux)))
            {
                first_panic.get_or_insert(panic);
            }
        }
        if let Some(done) = current {
            drop_caught(done, first_panic);
        }
        let dropped = std::mem::take(&mut cell.borrow_mut().dropped);
        for value in dropped {
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| drop(value))) {
                first_panic.get_or_insert(panic);
            }
        }
    };
    let mut g = cell.borrow_mut();
    if !g.alive(g.key(index)) {
        return None;
    }
    if index == g.root && !include_self && g.free_all(&mut objs) {
        drop(g);
        release(&mut objs, &mut first_panic);
        return first_panic;
    }
    let root_key = g.key(index);
    if include_self && g.node(index).flags & RUNNING != 0 {
        g.doom(index);
        return None;
    }
    let mut cur = index;
    // Cleanup rounds run at `cur` so far (a cleanup may register another).
    let mut rounds = 0;
    // A cleanup may disarm a scope of this subtree, handing nodes out of it.
    let reparents = g.reparents;
    loop {
        let last = g.node(cur).last_child;
        if last != NONE {
            if g.node(last).flags & RUNNING != 0 {
                g.doom(last);
            } else {
                cur = last;
                rounds = 0;
            }
            continue;
        }
        // `cur` has no children left: run its cleanups, then free it.
        if g.node(cur).flags & HAS_CLEANUP != 0 {
            let cleanups = g.take_cleanups(cur);
            rounds += 1;
            if rounds > MAX_FLUSH_ROUNDS {
                // Cleanups that keep registering cleanups: drop the rest.
                drop(g);
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| drop(cleanups))) {
                    first_panic.get_or_insert(panic);
                }
                g = cell.borrow_mut();
                continue;
            }
            let saved = (g.active, g.owner);
            (g.active, g.owner) = (NONE, cur);
            let node = g.node_mut(cur);
            let was_running = node.flags & RUNNING;
            node.flags |= RUNNING;
            g.cleaning += 1;
            drop(g);
            for cleanup in cleanups {
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| F::run_cleanup(cleanup))) {
                    first_panic.get_or_insert(panic);
                }
            }
            g = cell.borrow_mut();
            g.cleaning -= 1;
            (g.active, g.owner) = saved;
            // Still alive: running, it could only be doomed.
            let node = g.node_mut(cur);
            node.flags = node.flags & !RUNNING | was_running;
            if node.flags & DOOMED != 0 && (cur != index || include_self) {
                // Disposed by its own cleanups: this walk frees it.
                node.flags &= !DOOMED;
            }
            // Children or cleanups its cleanups added go first.
            continue;
        }
        if cur == index {
            if include_self {
                g.free(cur, &mut objs);
            }
            break;
        }
        let owner = g.node(cur).owner;
        g.free(cur, &mut objs);
        if objs.len() >= CHUNK {
            drop(g);
            release(&mut objs, &mut first_panic);
            g = cell.borrow_mut();
        }
        rounds = 0;
        // Unless a nested disposal (a cleanup's) detached `cur`, its owner
        // is under `index` and outlives it. After a cleanup disarmed a scope
        // (nodes changed owner), the owner may lie outside: the walk goes
        // back to `index` and down again instead.
        cur = if owner != NONE && g.node(owner).flags & (ALIVE | DOOMED | RUNNING) == ALIVE && g.reparents == reparents
        {
            owner
        } else if g.alive(root_key) {
            index
        } else {
            break;
        };
    }
    drop(g);
    release(&mut objs, &mut first_panic);
    first_panic
}
