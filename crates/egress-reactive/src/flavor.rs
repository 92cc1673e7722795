//! The one type parameter that separates the flavours.
//!
//! The algorithm in [`crate::graph`] is written once against [`Flavor`]. A
//! flavour chooses how the graph is shared and locked, and what user code it
//! may hold:
//!
//! | | [`Local`] (`Context`) | [`Threaded`] (`ThreadSafeContext`, `AsyncContext`) |
//! |---|---|---|
//! | shared pointer | `Rc` | `Arc` |
//! | graph | `RefCell` | a re-entrant `lock_api` mutex (`parking_lot`'s raw mutex) around a `RefCell` |
//! | node values | `RefCell` | [`Guarded`]: a `RefCell` made `Sync` by the graph lock |
//! | closures and values | any `'static` | `Send + Sync + 'static` |
//!
//! `Local` pays for no lock and no atomic. `Threaded` holds its re-entrant
//! graph lock for the whole of one public call, user code included, so calls
//! from the same thread (an effect that reads or writes) never deadlock, and
//! calls from other threads wait for it (see `ThreadSafeContext`).

use std::cell::RefCell;
use std::marker::PhantomData;
use std::ops::Deref;
use std::rc::Rc;
use std::sync::Arc;

use crate::graph::NodeObj;

mod sealed {
    pub trait Sealed {}
    /// The proof a caller is this crate: `Flavor::enter` and
    /// `Flavor::try_lock` take it, so that no code outside the crate can
    /// make a graph's entry (whose soundness rests on how the crate nests
    /// them: see `ThreadedGuard`).
    pub struct Token(pub(crate) ());
}
pub(crate) use sealed::Token;

/// How a graph is shared between handles and threads. Implemented by
/// [`Local`] and [`Threaded`] only.
pub trait Flavor: sealed::Sealed + Sized + 'static {
    /// The shared pointer handles hold (`Rc` or `Arc`).
    type Ptr<T: ?Sized + 'static>: Clone + Deref<Target = T>;
    /// A type-erased node object held by the graph.
    #[doc(hidden)]
    type Obj: Clone;
    /// A cleanup callback held by the graph.
    #[doc(hidden)]
    type Cleanup;
    /// A cell holding one node's value.
    #[doc(hidden)]
    type Cell<T: 'static>: ValueCell<T>;
    /// The cell around the whole graph.
    #[doc(hidden)]
    type GraphCell<G: 'static>;
    /// A type-erased value the graph keeps for a kind of node (the current
    /// block of signal slots of one value type): `dyn Any`, `+ Send` for
    /// [`Threaded`].
    #[doc(hidden)]
    type Any: ?Sized + 'static;
    /// What [`Flavor::enter`] returns: access to the graph's `RefCell` for
    /// the duration of one public call.
    #[doc(hidden)]
    type Guard<'a, G: 'static>: Deref<Target = RefCell<G>>;
    /// A signal's own equality (see `Handle::signal_with`): `Rc<dyn Fn>`,
    /// or `Arc<dyn Fn + Send + Sync>` for [`Threaded`].
    #[doc(hidden)]
    type EqFn<T: 'static>: Clone + 'static;

    #[doc(hidden)]
    fn ptr<T: 'static>(value: T) -> Self::Ptr<T>;
    #[doc(hidden)]
    fn obj(obj: &Self::Obj) -> &dyn NodeObj;
    /// Whether two objects are one (pointer equality).
    #[doc(hidden)]
    fn same_obj(a: &Self::Obj, b: &Self::Obj) -> bool;
    #[doc(hidden)]
    fn downcast<T: 'static>(any: &Self::Any) -> Option<&T>;
    /// Whether `ptr` is the only pointer to its value, strong or weak.
    #[doc(hidden)]
    fn is_unique<T: ?Sized + 'static>(ptr: &Self::Ptr<T>) -> bool;
    /// How many strong pointers share `ptr`'s value.
    #[doc(hidden)]
    fn strong_count<T: ?Sized + 'static>(ptr: &Self::Ptr<T>) -> usize;
    #[doc(hidden)]
    fn run_cleanup(cleanup: Self::Cleanup);
    #[doc(hidden)]
    fn same<T: 'static>(eq: &Self::EqFn<T>, old: &T, new: &T) -> bool;
    /// The value behind an erased [`Flavor::Any`].
    #[doc(hidden)]
    fn any(any: &Self::Any) -> &dyn std::any::Any;
    #[doc(hidden)]
    fn graph_cell<G: 'static>(graph: G) -> Self::GraphCell<G>;
    /// Whether a thread can be refused entry ([`Threaded`]): then calls
    /// check for deferred disposals on their way out.
    #[doc(hidden)]
    const REFUSES: bool;
    /// Enters the graph for one call (waiting for its lock, for
    /// [`Threaded`]); `None`, without waiting, if this thread is inside a
    /// call into another graph of the flavour (see [`Threaded`]).
    #[doc(hidden)]
    fn enter<G: 'static>(cell: &Self::GraphCell<G>, crate_only: Token) -> Option<Self::Guard<'_, G>>;
    /// Enters the graph only if that needs no waiting, whatever graph this
    /// thread is inside: for disposals, which must neither deadlock nor
    /// fail.
    #[doc(hidden)]
    fn try_lock<G: 'static>(cell: &Self::GraphCell<G>, crate_only: Token) -> Option<Self::Guard<'_, G>>;
    /// Leaves the graph; returns whether this was the thread's outermost
    /// entry into it.
    #[doc(hidden)]
    fn leave<G: 'static>(guard: Self::Guard<'_, G>) -> bool;
}

/// A flavour can hold node object `O` (a closure-bearing computed or effect)
/// when `O` satisfies the flavour's bounds: any `'static` for [`Local`],
/// `Send + Sync + 'static` for [`Threaded`].
#[doc(hidden)]
pub trait Holds<O: NodeObj>: Flavor {
    fn erase(obj: Self::Ptr<O>) -> Self::Obj;
    /// The same pointer, erased as [`Flavor::Any`].
    fn erase_any(obj: Self::Ptr<O>) -> Box<Self::Any>;
}

/// A flavour can hold cleanup `C`.
#[doc(hidden)]
pub trait HoldsCleanup<C: FnOnce() + 'static>: Flavor {
    fn erase_cleanup(cleanup: C) -> Self::Cleanup;
}

/// Proof that the current thread has entered a graph (holds its lock, for
/// [`Threaded`]). Only code holding the graph's `RefCell`, which only
/// [`Flavor::enter`] hands out, can make one; value cells ask for it.
#[doc(hidden)]
pub struct Entered(());

impl Entered {
    /// The proof, from the entered graph's cell.
    #[inline(always)]
    pub(crate) fn by<G>(_cell: &RefCell<G>) -> Self {
        Entered(())
    }
}

/// A flavour can hold equality `E` for signals of `T`.
#[doc(hidden)]
pub trait HoldsEq<T: 'static, E: Fn(&T, &T) -> bool + 'static>: Flavor {
    fn erase_eq(eq: E) -> Self::Ptr<Self::Any>;
}

/// A cell for one node's value, touched only while its graph is entered.
#[doc(hidden)]
pub trait ValueCell<T> {
    fn new(value: T) -> Self;
    fn with<R>(&self, entered: &Entered, f: impl FnOnce(&T) -> R) -> R;
    fn with_mut<R>(&self, entered: &Entered, f: impl FnOnce(&mut T) -> R) -> R;
    /// As [`with_mut`](Self::with_mut), or `None` (without calling `f`)
    /// while the value is borrowed: by the user code it is lent to (a
    /// signal's equality), which reached back into the graph.
    fn try_with_mut<R>(&self, entered: &Entered, f: impl FnOnce(&mut T) -> R) -> Option<R>;
}

/// The single-threaded flavour: `Rc` and `RefCell`, no locks, no atomics.
#[derive(Debug, Clone, Copy, Default)]
pub struct Local;

/// The thread-safe flavour: `Arc`, a re-entrant graph lock, `Send + Sync`
/// handles.
///
/// A thread is inside at most one thread-safe graph at a time: while it is
/// in a call into one (running its computeds, effects, cleanups, or the
/// closure of its `batch` or `scope`), a read or write of another
/// thread-safe graph's node is refused (`ReadError::ForeignGraph`,
/// `WriteError::ForeignGraph`, a panic from the methods without `try_`).
/// Two graphs whose effects touched each other could otherwise deadlock,
/// each thread holding one lock and waiting for the other. Disposals (and
/// the drops that dispose: a `Scope`, a context) are not refused: they take
/// effect at once if the other graph is free, and otherwise when its
/// current call ends. To move data between graphs, send it (a channel, a
/// task) instead of writing across.
#[derive(Debug, Clone, Copy, Default)]
pub struct Threaded;

impl sealed::Sealed for Local {}
impl sealed::Sealed for Threaded {}

/// The graph cell of [`Local`]: entering it is free.
#[doc(hidden)]
pub struct LocalCell<G>(RefCell<G>);

impl<T> ValueCell<T> for RefCell<T> {
    #[inline]
    fn new(value: T) -> Self {
        RefCell::new(value)
    }
    #[inline]
    fn with<R>(&self, _: &Entered, f: impl FnOnce(&T) -> R) -> R {
        f(&self.borrow())
    }
    #[inline]
    fn with_mut<R>(&self, _: &Entered, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.borrow_mut())
    }
    #[inline]
    fn try_with_mut<R>(&self, _: &Entered, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.try_borrow_mut().ok().map(|mut v| f(&mut v))
    }
}

/// The value cell of [`Threaded`]: a `RefCell` that may be shared between
/// threads because its graph's lock serializes every access to it.
///
/// Reads of a value happen on every read of every node, so a lock or an
/// atomic per value would double the cost of a `ThreadSafeContext` read (the
/// reactivity suite measured 3.1x `Context` on `repeatedObservers` with a
/// `parking_lot::RwLock` here; see docs/benchmarks.md). The graph lock is
/// already held for each of those accesses, so this cell relies on it.
#[doc(hidden)]
pub struct Guarded<T>(RefCell<T>);

// SAFETY: `Guarded` is only reached through `ValueCell::with` and
// `ValueCell::with_mut` (its field is private to this module), both of which
// take an `Entered` proof. `Entered` is made only from the graph's `RefCell`,
// which `Threaded::enter` hands out while the calling thread holds that
// graph's `ReentrantMutex`, and every `Guarded` belongs to the one graph
// whose code touches it (a node's value cell is reached only through that
// node's own graph). So at any time at most one thread, the lock holder,
// touches the inner `RefCell`, whose non-atomic borrow flag then needs no
// synchronization, and whose borrow checks still catch re-entrant misuse on
// that thread. The value moves between threads over time, hence `T: Send`
// (as for `Mutex<T>: Sync`). Exercised by `tests/threads.rs`, which writes
// and reads one graph from 8 threads under invariants.
#[allow(unsafe_code)]
unsafe impl<T: Send> Sync for Guarded<T> {}

impl<T> ValueCell<T> for Guarded<T> {
    #[inline]
    fn new(value: T) -> Self {
        Guarded(RefCell::new(value))
    }
    #[inline]
    fn with<R>(&self, _: &Entered, f: impl FnOnce(&T) -> R) -> R {
        f(&self.0.borrow())
    }
    #[inline]
    fn with_mut<R>(&self, _: &Entered, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.0.borrow_mut())
    }
    #[inline]
    fn try_with_mut<R>(&self, _: &Entered, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.0.try_borrow_mut().ok().map(|mut v| f(&mut v))
    }
}

impl Flavor for Local {
    type Ptr<T: ?Sized + 'static> = Rc<T>;
    type Obj = Rc<dyn NodeObj>;
    type Cleanup = Box<dyn FnOnce()>;
    type Cell<T: 'static> = RefCell<T>;
    type GraphCell<G: 'static> = LocalCell<G>;
    type Any = dyn std::any::Any;
    type Guard<'a, G: 'static> = &'a RefCell<G>;
    type EqFn<T: 'static> = Rc<dyn Fn(&T, &T) -> bool>;

    #[inline]
    fn ptr<T: 'static>(value: T) -> Rc<T> {
        Rc::new(value)
    }
    #[inline]
    fn obj(obj: &Self::Obj) -> &dyn NodeObj {
        &**obj
    }
    #[inline(always)]
    fn same_obj(a: &Self::Obj, b: &Self::Obj) -> bool {
        Self::Ptr::ptr_eq(a, b)
    }
    #[inline]
    fn downcast<T: 'static>(any: &Self::Any) -> Option<&T> {
        any.downcast_ref()
    }
    fn is_unique<T: ?Sized + 'static>(ptr: &Self::Ptr<T>) -> bool {
        Self::Ptr::<T>::strong_count(ptr) == 1 && Self::Ptr::<T>::weak_count(ptr) == 0
    }
    fn strong_count<T: ?Sized + 'static>(ptr: &Self::Ptr<T>) -> usize {
        Self::Ptr::<T>::strong_count(ptr)
    }
    fn run_cleanup(cleanup: Self::Cleanup) {
        cleanup()
    }
    fn same<T: 'static>(eq: &Self::EqFn<T>, old: &T, new: &T) -> bool {
        eq(old, new)
    }
    fn any(any: &Self::Any) -> &dyn std::any::Any {
        any
    }
    fn graph_cell<G: 'static>(graph: G) -> LocalCell<G> {
        LocalCell(RefCell::new(graph))
    }
    const REFUSES: bool = false;
    #[inline(always)]
    fn enter<G: 'static>(cell: &LocalCell<G>, _: Token) -> Option<&RefCell<G>> {
        Some(&cell.0)
    }
    #[inline(always)]
    fn try_lock<G: 'static>(cell: &LocalCell<G>, _: Token) -> Option<&RefCell<G>> {
        Some(&cell.0)
    }
    #[inline(always)]
    fn leave<G: 'static>(_: &RefCell<G>) -> bool {
        false
    }
}

impl<O: NodeObj + 'static> Holds<O> for Local {
    #[inline]
    fn erase(obj: Rc<O>) -> Self::Obj {
        obj
    }
    fn erase_any(obj: Rc<O>) -> Box<Self::Any> {
        Box::new(obj)
    }
}

impl<T: 'static, E: Fn(&T, &T) -> bool + 'static> HoldsEq<T, E> for Local {
    fn erase_eq(eq: E) -> Rc<dyn std::any::Any> {
        let eq: Self::EqFn<T> = Rc::new(eq);
        Rc::new(eq)
    }
}

impl<C: FnOnce() + 'static> HoldsCleanup<C> for Local {
    fn erase_cleanup(cleanup: C) -> Self::Cleanup {
        Box::new(cleanup)
    }
}

impl Flavor for Threaded {
    type Ptr<T: ?Sized + 'static> = Arc<T>;
    type Obj = Arc<dyn NodeObj + Send + Sync>;
    type Cleanup = Box<dyn FnOnce() + Send>;
    type Cell<T: 'static> = Guarded<T>;
    type GraphCell<G: 'static> = lock_api::ReentrantMutex<parking_lot::RawMutex, ThreadMark, RefCell<G>>;
    type Any = dyn std::any::Any + Send + Sync;
    type Guard<'a, G: 'static> = ThreadedGuard<'a, G>;
    type EqFn<T: 'static> = Arc<dyn Fn(&T, &T) -> bool + Send + Sync>;

    #[inline]
    fn ptr<T: 'static>(value: T) -> Arc<T> {
        Arc::new(value)
    }
    #[inline]
    fn obj(obj: &Self::Obj) -> &dyn NodeObj {
        &**obj
    }
    #[inline(always)]
    fn same_obj(a: &Self::Obj, b: &Self::Obj) -> bool {
        Self::Ptr::ptr_eq(a, b)
    }
    #[inline]
    fn downcast<T: 'static>(any: &Self::Any) -> Option<&T> {
        any.downcast_ref()
    }
    fn is_unique<T: ?Sized + 'static>(ptr: &Self::Ptr<T>) -> bool {
        Self::Ptr::<T>::strong_count(ptr) == 1 && Self::Ptr::<T>::weak_count(ptr) == 0
    }
    fn strong_count<T: ?Sized + 'static>(ptr: &Self::Ptr<T>) -> usize {
        Self::Ptr::<T>::strong_count(ptr)
    }
    fn run_cleanup(cleanup: Self::Cleanup) {
        cleanup()
    }
    fn same<T: 'static>(eq: &Self::EqFn<T>, old: &T, new: &T) -> bool {
        eq(old, new)
    }
    fn any(any: &Self::Any) -> &dyn std::any::Any {
        any
    }
    fn graph_cell<G: 'static>(graph: G) -> Self::GraphCell<G> {
        lock_api::ReentrantMutex::new(RefCell::new(graph))
    }
    const REFUSES: bool = true;
    #[inline]
    fn enter<G: 'static>(cell: &Self::GraphCell<G>, _: Token) -> Option<ThreadedGuard<'_, G>> {
        let me = std::ptr::from_ref(cell).addr();
        let outer = INSIDE.get();
        if outer != me {
            if outer != 0 {
                return None;
            }
            INSIDE.set(me);
            // Released by the guard's drop (`force_unlock`), as this entry
            // took it.
            std::mem::forget(cell.lock());
        }
        // Nested (`outer == me`): the thread holds the lock already, through
        // the entry that set the mark (see `ThreadedGuard`); this one takes
        // and releases nothing.
        Some(ThreadedGuard { cell, outer, me, not_send: PhantomData })
    }
    fn try_lock<G: 'static>(cell: &Self::GraphCell<G>, _: Token) -> Option<ThreadedGuard<'_, G>> {
        let me = std::ptr::from_ref(cell).addr();
        if INSIDE.get() == me {
            return Self::enter(cell, Token(()));
        }
        std::mem::forget(cell.try_lock()?);
        let outer = INSIDE.replace(me);
        Some(ThreadedGuard { cell, outer, me, not_send: PhantomData })
    }
    #[inline]
    fn leave<G: 'static>(guard: ThreadedGuard<'_, G>) -> bool {
        let outermost = guard.outer == 0;
        drop(guard);
        outermost
    }
}

thread_local! {
    /// The [`Threaded`] graph this thread is inside a call into (the address
    /// of its cell), or 0. Its own address is the thread's id for the graph
    /// locks ([`ThreadMark`]): one thread-local serves both, so entering a
    /// graph reads one.
    static INSIDE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The thread id of the re-entrant graph locks: the address of this
/// thread's [`INSIDE`]. (`parking_lot`'s own id reads a lazily initialized
/// thread-local through a call that is not inlined; this one shares its
/// thread-local with the cross-graph mark, so an entry reads one. Measured
/// in docs/benchmarks.md.)
#[doc(hidden)]
pub struct ThreadMark;

// SAFETY: `lock_api` requires that no two live threads share an id. The id
// is the address of this thread's instance of `INSIDE`, a thread-local of
// non-zero size (a `Cell<usize>`): every live thread has its own instance,
// at its own address, for as long as the thread lives, and an address of a
// live value is never 0. (An exited thread's address may be reused, which
// the trait allows.) Tested by `tests/threads.rs` (8 threads on one graph)
// and `tests/robustness.rs` (two graphs on two threads).
#[allow(unsafe_code)]
unsafe impl lock_api::GetThreadId for ThreadMark {
    const INIT: Self = ThreadMark;
    #[inline(always)]
    fn nonzero_thread_id(&self) -> std::num::NonZeroUsize {
        let id = INSIDE.with(|mark| std::ptr::from_ref(mark).addr());
        std::num::NonZeroUsize::new(id).expect("a thread-local's address is not 0")
    }
}

/// A thread's entry into a [`Threaded`] graph, and the graph the thread was
/// inside before (restored when it leaves).
///
/// The entry that finds the thread outside the graph takes its lock (and
/// forgets the lock's guard) and sets the thread's mark ([`INSIDE`]) to the
/// graph; its drop restores the mark, then releases the lock. An entry
/// that finds the mark already set to this graph is nested in such an
/// entry, on the same thread: it takes and releases nothing. So the mark
/// is a graph's while, and only while, an entry holding the graph's lock
/// is alive on the thread (set before the lock is taken, with no code of
/// the thread running in between; cleared just before it is released).
/// Every entry is a local of a call made inside the one that took the
/// lock (`Flavor::enter`'s callers are all in this crate, which alone can
/// make the `Token` they take, and all scoped so), and is not `Send`: it
/// is dropped first.
#[doc(hidden)]
pub struct ThreadedGuard<'a, G> {
    cell: &'a lock_api::ReentrantMutex<parking_lot::RawMutex, ThreadMark, RefCell<G>>,
    outer: usize,
    /// This graph's mark.
    me: usize,
    /// Neither `Send` nor `Sync`: an entry stays on its thread.
    not_send: PhantomData<*const ()>,
}

impl<G> Deref for ThreadedGuard<'_, G> {
    type Target = RefCell<G>;
    #[inline(always)]
    fn deref(&self) -> &RefCell<G> {
        // SAFETY: this thread holds the graph's lock for as long as this
        // entry lives (see the type's docs), so no other thread touches the
        // `RefCell` meanwhile, and the borrow ends with `&self`. Tested by
        // `tests/threads.rs` (threads entering again at every read while
        // another waits on the graph; 8 threads on one graph).
        #[allow(unsafe_code)]
        unsafe {
            &*self.cell.data_ptr()
        }
    }
}

impl<G> Drop for ThreadedGuard<'_, G> {
    #[inline]
    fn drop(&mut self) {
        // A nested entry (the common case: reads inside a run) leaves the
        // mark and the lock as it found them.
        if self.outer != self.me {
            INSIDE.set(self.outer);
            // SAFETY: this entry took the lock, and forgot its guard; it
            // releases it once, here.
            #[allow(unsafe_code)]
            unsafe {
                self.cell.force_unlock();
            }
        }
    }
}

impl<O: NodeObj + Send + Sync + 'static> Holds<O> for Threaded {
    #[inline]
    fn erase(obj: Arc<O>) -> Self::Obj {
        obj
    }
    fn erase_any(obj: Arc<O>) -> Box<Self::Any> {
        Box::new(obj)
    }
}

impl<T: 'static, E: Fn(&T, &T) -> bool + Send + Sync + 'static> HoldsEq<T, E> for Threaded {
    fn erase_eq(eq: E) -> Arc<dyn std::any::Any + Send + Sync> {
        let eq: Self::EqFn<T> = Arc::new(eq);
        Arc::new(eq)
    }
}

impl<C: FnOnce() + Send + 'static> HoldsCleanup<C> for Threaded {
    fn erase_cleanup(cleanup: C) -> Self::Cleanup {
        Box::new(cleanup)
    }
}
