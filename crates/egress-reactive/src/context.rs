//! Contexts, handles and scopes: where nodes are created and who owns them.

use std::ops::Deref;
use std::panic::{AssertUnwindSafe, Location, catch_unwind, resume_unwind};

use crate::error::{EffectLoopError, NodeKind, ReadError};
use crate::flavor::{Flavor, HoldsCleanup, Local, Threaded, Token};
use crate::graph::{Graph, Key, NONE, flags::*};
use crate::run;

/// The shared state of one graph.
#[doc(hidden)]
pub struct Runtime<F: Flavor> {
    pub(crate) cell: F::GraphCell<Graph<F>>,
    /// Disposals asked for by a thread inside another graph while this one
    /// was busy (only [`Threaded`] refuses entry): done by whoever leaves
    /// the graph next. At most one entry per live node, and one close.
    deferred: parking_lot::Mutex<Vec<Deferred>>,
    has_deferred: std::sync::atomic::AtomicBool,
}

/// A disposal that waits for the graph to be free.
enum Deferred {
    Dispose(Key),
    /// The context was dropped.
    Close,
}

/// A thread inside a call into one thread-safe graph tried to enter
/// another (see [`Threaded`]).
#[derive(Debug)]
pub(crate) struct Foreign;

impl Foreign {
    #[cold]
    #[inline(never)]
    #[track_caller]
    pub(crate) fn panic(self) -> ! {
        panic!(
            "a thread-safe graph was entered from inside a call into another one (a computed, effect, cleanup, \
             batch or scope of the other): refused, as it could deadlock; send the data across instead"
        )
    }
}

/// A reactive graph: the owner of every node created in it.
///
/// Dropping the context disposes every node still alive and breaks every
/// reference cycle between nodes and the closures they hold. Registered
/// cleanups run in disposal order (children before parents, later siblings
/// first); the order in which the nodes' closures and signal values are
/// dropped is not specified. Handles to its nodes outlive it safely: `try_`
/// reads then return [`ReadError::Disposed`](crate::ReadError).
///
/// A context dereferences to [`Handle`], which has all the creation methods
/// and is cheap to clone into closures.
///
/// Use it through its flavours: [`Context`] (one thread), [`ThreadSafeContext`]
/// (any thread) and `AsyncContext` (tokio).
pub struct Ctx<F: Flavor> {
    handle: Handle<F>,
}

/// The single-threaded graph: no locks, no atomics; `!Send`.
///
/// ```
/// use egress_reactive::Context;
///
/// let cx = Context::new();
/// let count = cx.signal(1);
/// let double = cx.computed({
///     let count = count.clone();
///     move || count.get() * 2
/// });
/// let seen = cx.signal(0);
/// cx.effect({
///     let (double, seen) = (double.clone(), seen.clone());
///     move || seen.set(double.get())
/// });
/// assert_eq!(seen.get(), 2);
/// count.set(5);
/// assert_eq!(seen.get(), 10);
/// ```
pub type Context = Ctx<Local>;

/// The thread-safe graph: `Send + Sync` handles, usable from any thread.
///
/// One re-entrant lock guards the graph for the whole of each public call,
/// user code included. So: calls made from user code on the same thread (an
/// effect that reads or writes, a computed that reads others) never
/// deadlock; a call from another thread waits until the current call
/// (including any effects it triggers, and a whole [`Handle::batch`])
/// finishes. Every reader therefore sees a settled graph, each effect runs
/// once per settled change however writers race, and `update` never loses
/// a write. What may block: an effect or computed that waits on another
/// thread which is itself calling into the same graph deadlocks; do not do
/// that (send a message instead, or use `AsyncContext`).
///
/// ```
/// use egress_reactive::ThreadSafeContext;
///
/// let cx = ThreadSafeContext::new();
/// let hits = cx.signal(0u64);
/// std::thread::scope(|s| {
///     for _ in 0..4 {
///         let hits = hits.clone();
///         s.spawn(move || {
///             for _ in 0..1000 {
///                 hits.update(|h| *h += 1);
///             }
///         });
///     }
/// });
/// assert_eq!(hits.get(), 4000);
/// ```
pub type ThreadSafeContext = Ctx<Threaded>;

/// A cloneable handle to a graph, for closures that create nodes.
///
/// A handle does not own the graph's nodes: they are disposed with the
/// [`Ctx`] (or with their owner), whatever handles remain.
pub struct Handle<F: Flavor> {
    pub(crate) rt: F::Ptr<Runtime<F>>,
}

impl<F: Flavor> Clone for Handle<F> {
    fn clone(&self) -> Self {
        Handle { rt: self.rt.clone() }
    }
}

impl<F: Flavor> Ctx<F> {
    /// A new, empty graph.
    #[track_caller]
    pub fn new() -> Self {
        let rt = Runtime {
            cell: F::graph_cell(Graph::new()),
            deferred: parking_lot::Mutex::new(Vec::new()),
            has_deferred: std::sync::atomic::AtomicBool::new(false),
        };
        Ctx { handle: Handle { rt: F::ptr(rt) } }
    }

    /// A cloneable handle to this graph.
    pub fn handle(&self) -> Handle<F> {
        self.handle.clone()
    }
}

impl<F: Flavor> Default for Ctx<F> {
    #[track_caller]
    fn default() -> Self {
        Self::new()
    }
}

impl<F: Flavor> Deref for Ctx<F> {
    type Target = Handle<F>;
    fn deref(&self) -> &Handle<F> {
        &self.handle
    }
}

impl<F: Flavor> Drop for Ctx<F> {
    fn drop(&mut self) {
        let Some(guard) =
            F::enter(&self.handle.rt.cell, Token(())).or_else(|| F::try_lock(&self.handle.rt.cell, Token(())))
        else {
            // Dropped inside a call into another graph, with this one busy.
            self.handle.defer(Deferred::Close);
            return;
        };
        close(&self.handle, &guard);
        let outermost = F::leave(guard);
        self.handle.after(outermost);
    }
}

/// Disposes every node of a context being dropped.
fn close<F: Flavor>(handle: &Handle<F>, cell: &run::Cell<F>) {
    {
        let root = {
            let g = cell.borrow();
            // The last pointer to the graph, no cleanup to order: nothing
            // can reach the graph again, so dropping it (next) drops every
            // node's object and every signal's value at once, without
            // freeing nodes one by one first.
            if g.quiet() && F::is_unique(&handle.rt) {
                return;
            }
            g.root
        };
        // Nodes created from now on (by surviving handles, by cleanups) are
        // born disposed: nothing would ever dispose them.
        cell.borrow_mut().closed = true;
        // Dropped while unwinding, a cleanup's panic would be a second one.
        let panic = run::dispose_caught(cell, root, false);
        if let Some(panic) = panic
            && !std::thread::panicking()
        {
            resume_unwind(panic);
        }
    }
}

impl<F: Flavor> std::fmt::Debug for Ctx<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.handle.fmt(f)
    }
}

impl<F: Flavor> std::fmt::Debug for Handle<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle").field("nodes", &self.node_count()).field("links", &self.link_count()).finish()
    }
}

impl<F: Flavor> Handle<F> {
    /// Runs `f` with the graph entered: `cell` is valid for the call.
    ///
    /// # Panics
    /// If the thread is inside a call into another thread-safe graph.
    #[inline(always)]
    pub(crate) fn enter<R>(&self, f: impl FnOnce(&run::Cell<F>) -> R) -> R {
        if !F::REFUSES {
            // `Local`: entering is free and never refused.
            let Some(guard) = F::enter(&self.rt.cell, Token(())) else { Foreign.panic() };
            return f(&guard);
        }
        match self.try_enter(f) {
            Ok(r) => r,
            Err(foreign) => foreign.panic(),
        }
    }

    /// [`Handle::enter`], or `Foreign` (and `f` not run) if the thread is
    /// inside a call into another thread-safe graph.
    #[inline(always)]
    pub(crate) fn try_enter<R>(&self, f: impl FnOnce(&run::Cell<F>) -> R) -> Result<R, Foreign> {
        let Some(guard) = F::enter(&self.rt.cell, Token(())) else { return Err(Foreign) };
        if !F::REFUSES {
            return Ok(f(&guard));
        }
        // On unwinding, the guard's own drop leaves the graph (and the
        // deferred disposals wait for the next call).
        let r = f(&guard);
        let outermost = F::leave(guard);
        self.after(outermost);
        Ok(r)
    }

    /// After leaving the graph: if this was the thread's outermost entry,
    /// do the disposals deferred meanwhile.
    /// (Not while unwinding: a deferred cleanup's panic would be a second
    /// one. The next call out does them.)
    #[inline(always)]
    pub(crate) fn after(&self, outermost: bool) {
        if F::REFUSES
            && outermost
            && self.rt.has_deferred.load(std::sync::atomic::Ordering::SeqCst)
            && !std::thread::panicking()
        {
            self.drain();
        }
    }

    /// Asks for a disposal from inside another graph's call: done now if
    /// this graph is free, otherwise by whoever leaves it next.
    fn defer(&self, what: Deferred) {
        self.rt.deferred.lock().push(what);
        self.rt.has_deferred.store(true, std::sync::atomic::Ordering::SeqCst);
        // The holder may have left just before the push: try once more.
        self.drain();
    }

    /// Does the deferred disposals, if the graph is free (never waits). The
    /// first panic of their cleanups is resumed.
    #[cold]
    fn drain(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let mut first_panic = None;
        while self.rt.has_deferred.load(SeqCst) {
            let Some(guard) = F::try_lock(&self.rt.cell, Token(())) else { break };
            self.rt.has_deferred.store(false, SeqCst);
            let work = std::mem::take(&mut *self.rt.deferred.lock());
            for what in work {
                let done = catch_unwind(AssertUnwindSafe(|| match what {
                    Deferred::Dispose(key) => {
                        if guard.borrow().alive(key) {
                            run::dispose(&guard, key.index, true);
                        }
                    }
                    Deferred::Close => close(self, &guard),
                }));
                if let Err(panic) = done {
                    first_panic.get_or_insert(panic);
                }
            }
            drop(guard);
        }
        if let Some(panic) = first_panic {
            resume_unwind(panic);
        }
    }

    /// Runs `f` as one batch: writes inside it notify once, when it ends;
    /// reads inside it see the new values. A batch that writes a signal back
    /// to the value it had when the batch began notifies nothing for it.
    /// Batches nest; the outermost one notifies.
    ///
    /// A panic inside `f` still ends the batch (its writes are applied and
    /// effects run) before the panic continues.
    ///
    /// Its end compares each written signal with the value it replaced (its
    /// equality, user code): what that code writes joins the same
    /// settlement, a computed it reads sees every write of the batch, and
    /// the effects run once, after it.
    ///
    /// # Panics
    /// If the effects it triggers do not settle ([`EffectLoopError`]); use
    /// [`Handle::try_batch`] to get the error instead.
    #[track_caller]
    pub fn batch<R>(&self, f: impl FnOnce() -> R) -> R {
        match self.try_batch(f) {
            Ok(r) => r,
            Err(e) => panic!("{e} (batch at {})", Location::caller()),
        }
    }

    /// [`Handle::batch`], returning an effect feedback loop as an error. The
    /// batch's writes are applied either way.
    pub fn try_batch<R>(&self, f: impl FnOnce() -> R) -> Result<R, EffectLoopError> {
        self.enter(|cell| {
            cell.borrow_mut().batch_depth += 1;
            let result = catch_unwind(AssertUnwindSafe(f));
            cell.borrow_mut().batch_depth -= 1;
            let flushed = run::settle_and_flush(cell);
            match result {
                Ok(r) => flushed.map(|()| r),
                Err(panic) => resume_unwind(panic),
            }
        })
    }

    /// Runs `f` without tracking: what it reads does not become a dependency
    /// of the computation running now.
    pub fn untrack<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Restore<'a, F: Flavor>(&'a run::Cell<F>, u32);
        impl<F: Flavor> Drop for Restore<'_, F> {
            fn drop(&mut self) {
                self.0.borrow_mut().active = self.1;
            }
        }
        self.enter(|cell| {
            let prev = cell.borrow_mut().untrack();
            let _restore = Restore(cell, prev);
            f()
        })
    }

    /// Registers `f` to run when the current owner is cleaned up: before an
    /// effect or computed runs again, and when it, its scope or the context
    /// is disposed. Cleanups of one owner run in registration order, after
    /// those of its children; a cleanup registered by a cleanup runs right
    /// after it. Registered after the context was dropped, `f` runs at once.
    pub fn on_cleanup<C: FnOnce() + 'static>(&self, f: C)
    where
        F: HoldsCleanup<C>,
    {
        let cleanup = self.enter(|cell| {
            let mut g = cell.borrow_mut();
            if g.closed {
                return Some(f);
            }
            let owner = g.owner;
            g.add_cleanup(owner, F::erase_cleanup(f));
            None
        });
        // The context was dropped: its owner is gone already.
        if let Some(f) = cleanup {
            f();
        }
    }

    /// Runs `f` in a new scope, owned by the current owner. Everything `f`
    /// creates belongs to the scope and is disposed with it: when the
    /// returned [`Scope`] is dropped or disposed, or with its own owner.
    #[track_caller]
    pub fn scope<R>(&self, f: impl FnOnce() -> R) -> (Scope<F>, R) {
        let created_at = Location::caller();
        let key =
            self.enter(|cell| cell.borrow_mut().create(SCOPE, None, NONE, created_at)).unwrap_or_else(|(dead, _)| dead);
        let scope = Scope { handle: self.clone(), key, created_at };
        // In a dropped context the scope is born disposed, and so is
        // whatever `f` creates.
        let result = match self.with_owner(key, f) {
            Ok(r) => r,
            Err(f) => f(),
        };
        (scope, result)
    }

    /// Runs `f` with live node `key` as the owner, or gives `f` back if
    /// `key` is gone. The node counts as running meanwhile: disposing it
    /// from inside `f` takes effect when `f` returns (or unwinds), so that
    /// nothing `f` creates after that is owned by a freed slot.
    pub(crate) fn with_owner<R, C: FnOnce() -> R>(&self, key: Key, f: C) -> Result<R, C> {
        match self.try_with_owner(key, f) {
            Ok(result) => result,
            Err(foreign) => foreign.panic(),
        }
    }

    /// [`Handle::with_owner`], or `Foreign`.
    fn try_with_owner<R, C: FnOnce() -> R>(&self, key: Key, f: C) -> Result<Result<R, C>, Foreign> {
        struct Restore<'a, F: Flavor> {
            cell: &'a run::Cell<F>,
            prev: u32,
            key: Key,
            /// This call marked the node running (an inner `run` of the
            /// same scope leaves the mark to the outer one).
            marked: bool,
        }
        impl<F: Flavor> Drop for Restore<'_, F> {
            fn drop(&mut self) {
                let doomed = {
                    let mut g = self.cell.borrow_mut();
                    g.owner = self.prev;
                    if !self.marked || !g.alive(self.key) {
                        return;
                    }
                    let node = g.node_mut(self.key.index);
                    node.flags &= !RUNNING;
                    node.flags & DOOMED != 0
                };
                if doomed {
                    let panic = run::dispose_caught(self.cell, self.key.index, true);
                    // Resumed unless this is unwinding already.
                    if let Some(panic) = panic
                        && !std::thread::panicking()
                    {
                        resume_unwind(panic);
                    }
                }
            }
        }
        self.try_enter(|cell| {
            let (prev, marked) = {
                let mut g = cell.borrow_mut();
                if !g.alive(key) {
                    return Err(f);
                }
                let node = g.node_mut(key.index);
                let marked = node.flags & RUNNING == 0;
                node.flags |= RUNNING;
                (std::mem::replace(&mut g.owner, key.index), marked)
            };
            let _restore = Restore { cell, prev, key, marked };
            Ok(f())
        })
    }

    /// A trigger: a source node without a value, owned by the current
    /// owner. Computations that [`track`](Self::track) it re-run when it is
    /// [`notify`](run::notify)-ed. The egress cells invalidate their readers
    /// through triggers.
    pub(crate) fn trigger(&self, created_at: &'static Location<'static>) -> Key {
        self.enter(|cell| cell.borrow_mut().create(SIGNAL, None, NONE, created_at)).unwrap_or_else(|(dead, _)| dead)
    }

    /// Makes the running computation depend on trigger `key`.
    #[inline]
    pub(crate) fn track(cell: &run::Cell<F>, key: Key) {
        let mut g = cell.borrow_mut();
        let active = g.active;
        if active != NONE && g.alive(key) {
            g.link(key.index, active);
        }
    }

    /// Live nodes in the graph (its root scope included).
    pub fn node_count(&self) -> usize {
        self.enter(|cell| cell.borrow().live_nodes())
    }

    /// Live dependency links in the graph.
    pub fn link_count(&self) -> usize {
        self.enter(|cell| cell.borrow().live_links())
    }

    pub(crate) fn introspect<R>(&self, key: Key, f: impl FnOnce(&Graph<F>) -> R) -> Option<R> {
        self.enter(|cell| {
            let g = cell.borrow();
            g.alive(key).then(|| f(&g))
        })
    }

    /// Disposes node `key`. From inside a call into another thread-safe
    /// graph, and with this one busy, the disposal is deferred to the end
    /// of the call that holds it (see [`Threaded`]).
    ///
    /// Called while unwinding (a `Scope` dropped by a panic), the panics of
    /// the cleanups it runs are dropped: a second panic would abort.
    pub(crate) fn dispose_node(&self, key: Key) {
        let dispose = |cell: &run::Cell<F>| {
            if cell.borrow().alive(key) {
                let panic = run::dispose_caught(cell, key.index, true);
                if let Some(panic) = panic
                    && !std::thread::panicking()
                {
                    resume_unwind(panic);
                }
            }
        };
        if self.try_enter(dispose).is_err() {
            match F::try_lock(&self.rt.cell, Token(())) {
                Some(guard) => {
                    dispose(&guard);
                    drop(guard);
                }
                None => self.defer(Deferred::Dispose(key)),
            }
        }
    }
}

/// What every node handle shares, and reaches through `Deref`: its graph,
/// its identity, and the disposal and introspection every kind of node has.
pub struct NodeRef<F: Flavor> {
    pub(crate) handle: Handle<F>,
    pub(crate) key: Key,
}

impl<F: Flavor> Clone for NodeRef<F> {
    fn clone(&self) -> Self {
        NodeRef { handle: self.handle.clone(), key: self.key }
    }
}

impl<F: Flavor> NodeRef<F> {
    /// Disposes the node: what it owns is disposed first (later ones first),
    /// its cleanups run, its links go, and reads fail from now on.
    /// Idempotent.
    pub fn dispose(&self) {
        self.handle.dispose_node(self.key);
    }

    /// Whether the node was disposed.
    pub fn is_disposed(&self) -> bool {
        self.handle.introspect(self.key, |_| ()).is_none()
    }

    /// How many times its function has run (0 for a signal, and once
    /// disposed).
    pub fn runs(&self) -> u32 {
        self.handle.introspect(self.key, |g| g.node(self.key.index).runs).unwrap_or(0)
    }

    /// How many dependencies its last run read (0 for a signal, and once
    /// disposed).
    pub fn dependency_count(&self) -> usize {
        self.handle.introspect(self.key, |g| g.dependency_count(self.key.index)).unwrap_or(0)
    }

    /// How many computations depend on it now (0 once disposed).
    pub fn subscriber_count(&self) -> usize {
        self.handle.introspect(self.key, |g| g.subscriber_count(self.key.index)).unwrap_or(0)
    }
}

/// An owner of the nodes created inside [`Handle::scope`]. Dropping it, or
/// calling [`Scope::dispose`], disposes them: children before parents, later
/// ones first, cleanups run.
#[must_use = "dropping a Scope disposes everything created in it"]
pub struct Scope<F: Flavor> {
    handle: Handle<F>,
    key: Key,
    created_at: &'static Location<'static>,
}

impl<F: Flavor> Scope<F> {
    /// The scope's node.
    pub(crate) fn key(&self) -> Key {
        self.key
    }

    /// Disposes the scope and everything it owns. Idempotent.
    pub fn dispose(&self) {
        self.handle.dispose_node(self.key);
    }

    /// Runs `f` with this scope as owner: what `f` creates belongs to it.
    /// Disposing the scope from inside `f` takes effect when `f` returns.
    ///
    /// # Panics
    /// If the scope was disposed (without running `f`); see
    /// [`Scope::try_run`].
    #[track_caller]
    pub fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        match self.try_run(f) {
            Ok(r) => r,
            Err(e) => panic!("{e} (run at {})", Location::caller()),
        }
    }

    /// [`Scope::run`], or [`ReadError::Disposed`] (and `f` not run) if the
    /// scope was disposed ([`ReadError::ForeignGraph`] from inside a call
    /// into another thread-safe graph).
    pub fn try_run<R>(&self, f: impl FnOnce() -> R) -> Result<R, ReadError> {
        match self.handle.try_with_owner(self.key, f) {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) => Err(ReadError::Disposed { kind: NodeKind::Scope, created_at: self.created_at }),
            Err(Foreign) => Err(ReadError::ForeignGraph { kind: NodeKind::Scope }),
        }
    }

    /// Cancels the scope's teardown: the nodes it owns now are handed to
    /// the scope's own owner (the context, for a scope made outside any
    /// computation), as if they had been made there, after that owner's
    /// other nodes. Nothing is disposed and nothing else changes: values,
    /// dependencies and pending runs stay as they are, and each node can
    /// still be disposed on its own. Disposing the scope afterwards
    /// disposes only what was made in it since. A no-op on a scope that was
    /// disposed, or whose disposal waits for its [`run`](Self::run) to end.
    /// Called from a cleanup while the scope itself is being disposed, it
    /// hands up what is left, and the disposal stops at the scope.
    ///
    /// ```
    /// use egress_reactive::Context;
    ///
    /// let cx = Context::new();
    /// let (scope, kept) = cx.scope(|| cx.signal(1));
    /// scope.disarm();
    /// scope.dispose();
    /// assert_eq!(kept.get(), 1);
    /// ```
    pub fn disarm(&self) {
        self.handle.enter(|cell| {
            let mut g = cell.borrow_mut();
            if g.alive(self.key) && g.node(self.key.index).flags & DOOMED == 0 {
                g.hand_children_up(self.key.index);
            }
        });
    }

    /// How many nodes the scope owns directly (0 once disposed).
    pub fn owned_count(&self) -> usize {
        self.handle.introspect(self.key, |g| g.child_count(self.key.index)).unwrap_or(0)
    }

    /// Where the scope was created.
    pub fn created_at(&self) -> &'static Location<'static> {
        self.created_at
    }

    /// Whether the scope was disposed.
    pub fn is_disposed(&self) -> bool {
        self.handle.introspect(self.key, |_| ()).is_none()
    }
}

impl<F: Flavor> Drop for Scope<F> {
    fn drop(&mut self) {
        self.dispose();
    }
}
