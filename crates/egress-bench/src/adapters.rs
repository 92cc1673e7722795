//! One adapter per library and flavour, all with the same associated
//! functions (inherent, not a trait: each library keeps its own closure
//! bounds, `Send + Sync` or not, and the suite macro is checked against each
//! concretely).
//!
//! | function | meaning |
//! |---|---|
//! | `new()` / `run(&cx, f)` / `dispose(cx)` | a fresh graph; run with it as owner; dispose all of it |
//! | `signal(&cx, v)` | a writable source |
//! | `computed(&cx, f)` / `computed_unguarded(&cx, f)` | derived value with / without `PartialEq` cut-off |
//! | `effect(&cx, f)` | an effect, run now and after changes |
//! | `get(rx, &s)` / `read(rx, &c)` | reads inside a computation (tracked) |
//! | `peek_signal(&cx, &s)` / `peek(&cx, &c)` | reads outside any computation |
//! | `set(&cx, &s, v)` | `batch { s = v }` |
//! | `batch(&cx, f)` / `write(&cx, &s, v)` | several writes in one batch |
//!
//! Adapters are written from each library's public documentation.
#![allow(missing_docs, clippy::new_ret_no_self)]

/// The types the suite needs to name.
pub trait Types {
    /// A graph.
    type Cx;
    /// A signal of `i64`.
    type S64: Clone;
}

impl Types for EgressLocal {
    type Cx = egress_reactive::Context;
    type S64 = egress_reactive::Signal<i64, egress_reactive::Local>;
}
impl Types for EgressThreadSafe {
    type Cx = egress_reactive::ThreadSafeContext;
    type S64 = egress_reactive::Signal<i64, egress_reactive::Threaded>;
}
impl Types for EgressAsync {
    type Cx = egress_reactive::AsyncContext;
    type S64 = egress_reactive::Signal<i64, egress_reactive::Threaded>;
}
impl Types for EgressCopy {
    type Cx = egress_reactive::Context;
    type S64 = Stored<egress_reactive::Signal<i64, egress_reactive::Local>>;
}
impl Types for LazilyLocal {
    type Cx = lazily::Context;
    type S64 = lazily::Source<i64>;
}
impl Types for LazilyThreadSafe {
    type Cx = lazily::ThreadSafeContext;
    type S64 = lazily::Source<i64>;
}
impl Types for Alien {
    type Cx = AlienCx;
    type S64 = alien_signals::Signal<i64>;
}
impl Types for Leptos {
    type Cx = reactive_graph::owner::Owner;
    type S64 = reactive_graph::signal::RwSignal<i64>;
}
impl Types for Sycamore {
    type Cx = sycamore_reactive::NodeHandle;
    type S64 = sycamore_reactive::Signal<i64>;
}

/// Our single-threaded Context.
pub struct EgressLocal;
/// Our ThreadSafeContext.
pub struct EgressThreadSafe;
/// Our AsyncContext: its synchronous computeds and effects (the suite's
/// effects are synchronous by definition), on the same graph as ThreadSafe.
pub struct EgressAsync;
/// Our Context behind `Copy` handles, the way leptos and sycamore offer
/// them (issue 17's question: what would `Copy` handles cost?). A handle is
/// an index into a per-thread arena of the real handles, looked up on every
/// use; see [`Stored`].
pub struct EgressCopy;
/// lazily's Context.
pub struct LazilyLocal;
/// lazily's ThreadSafeContext.
pub struct LazilyThreadSafe;
/// alien-signals.
pub struct Alien;
/// sycamore-reactive.
pub struct Sycamore;
/// leptos reactive_graph, with its glitch-free (async) effects ticked after
/// every write.
pub struct Leptos;

macro_rules! egress_adapter {
    ($name:ident, $cx:ty, $flavor:ty, $label:literal, $new:expr) => {
        impl $name {
            pub const NAME: &'static str = $label;
            pub const LAZY: bool = true;
            pub fn new() -> $cx {
                $new
            }
            pub fn run<R>(_cx: &$cx, f: impl FnOnce() -> R) -> R {
                f()
            }
            pub fn dispose(cx: $cx) {
                drop(cx)
            }
            #[inline]
            pub fn signal<T: PartialEq + Clone + Send + Sync + 'static>(
                cx: &$cx,
                v: T,
            ) -> egress_reactive::Signal<T, $flavor> {
                cx.signal(v)
            }
            #[inline]
            pub fn get<T: Clone>(_rx: &(), s: &egress_reactive::Signal<T, $flavor>) -> T {
                s.get()
            }
            #[inline]
            pub fn read<T: Clone>(_rx: &(), c: &egress_reactive::Computed<T, $flavor>) -> T {
                c.get()
            }
            #[inline]
            pub fn peek_signal<T: Clone>(_cx: &$cx, s: &egress_reactive::Signal<T, $flavor>) -> T {
                s.get_untracked()
            }
            #[inline]
            pub fn peek<T: Clone>(_cx: &$cx, c: &egress_reactive::Computed<T, $flavor>) -> T {
                c.get_untracked()
            }
            #[inline]
            pub fn set<T: PartialEq>(cx: &$cx, s: &egress_reactive::Signal<T, $flavor>, v: T) {
                cx.batch(|| s.set(v))
            }
            #[inline]
            pub fn write<T: PartialEq>(_cx: &$cx, s: &egress_reactive::Signal<T, $flavor>, v: T) {
                s.set(v)
            }
            #[inline]
            pub fn batch<R>(cx: &$cx, f: impl FnOnce() -> R) -> R {
                cx.batch(f)
            }
        }
    };
}

egress_adapter!(
    EgressLocal,
    egress_reactive::Context,
    egress_reactive::Local,
    "egress Context",
    egress_reactive::Context::new()
);
egress_adapter!(
    EgressThreadSafe,
    egress_reactive::ThreadSafeContext,
    egress_reactive::Threaded,
    "egress ThreadSafe",
    egress_reactive::ThreadSafeContext::new()
);

egress_adapter!(
    EgressAsync,
    egress_reactive::AsyncContext,
    egress_reactive::Threaded,
    "egress Async",
    egress_reactive::AsyncContext::new()
);

impl EgressAsync {
    pub fn computed<T: PartialEq + Send + Sync + 'static>(
        cx: &egress_reactive::AsyncContext,
        f: impl Fn(&()) -> T + Send + Sync + 'static,
    ) -> egress_reactive::Computed<T, egress_reactive::Threaded> {
        cx.computed(move || f(&()))
    }
    pub fn computed_unguarded<T: Send + Sync + 'static>(
        cx: &egress_reactive::AsyncContext,
        f: impl Fn(&()) -> T + Send + Sync + 'static,
    ) -> egress_reactive::Computed<T, egress_reactive::Threaded> {
        cx.computed_unguarded(move || f(&()))
    }
    pub fn effect(cx: &egress_reactive::AsyncContext, f: impl Fn(&()) + Send + Sync + 'static) {
        cx.effect(move || f(&()));
    }
}

impl EgressLocal {
    pub fn computed<T: PartialEq + 'static>(
        cx: &egress_reactive::Context,
        f: impl Fn(&()) -> T + 'static,
    ) -> egress_reactive::Computed<T, egress_reactive::Local> {
        cx.computed(move || f(&()))
    }
    pub fn computed_unguarded<T: 'static>(
        cx: &egress_reactive::Context,
        f: impl Fn(&()) -> T + 'static,
    ) -> egress_reactive::Computed<T, egress_reactive::Local> {
        cx.computed_unguarded(move || f(&()))
    }
    pub fn effect(cx: &egress_reactive::Context, f: impl Fn(&()) + 'static) {
        cx.effect(move || f(&()));
    }
}

impl EgressThreadSafe {
    pub fn computed<T: PartialEq + Send + Sync + 'static>(
        cx: &egress_reactive::ThreadSafeContext,
        f: impl Fn(&()) -> T + Send + Sync + 'static,
    ) -> egress_reactive::Computed<T, egress_reactive::Threaded> {
        cx.computed(move || f(&()))
    }
    pub fn computed_unguarded<T: Send + Sync + 'static>(
        cx: &egress_reactive::ThreadSafeContext,
        f: impl Fn(&()) -> T + Send + Sync + 'static,
    ) -> egress_reactive::Computed<T, egress_reactive::Threaded> {
        cx.computed_unguarded(move || f(&()))
    }
    pub fn effect(cx: &egress_reactive::ThreadSafeContext, f: impl Fn(&()) + Send + Sync + 'static) {
        cx.effect(move || f(&()));
    }
}

// ---- egress behind Copy handles -------------------------------------------

thread_local! {
    /// The real handles behind [`Stored`] ones: appended on creation, cleared
    /// with the graph by [`EgressCopy::dispose`].
    static ARENA: std::cell::RefCell<Vec<Box<dyn std::any::Any>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A `Copy` handle: the index of a real handle (`Signal` or `Computed`) in
/// [`ARENA`]. This is the layout leptos (`ArenaItem`) and sycamore
/// (`NodeId` in a per-root slotmap) use: a handle that holds no pointer, so
/// every use pays a thread-local lookup, a borrow and a type check before it
/// reaches the node. Nested uses (a computed read inside another's run)
/// borrow the arena shared; creation borrows it exclusively, which the
/// suite does only outside runs.
pub struct Stored<H> {
    index: u32,
    _handle: std::marker::PhantomData<fn() -> H>,
}

impl<H> Clone for Stored<H> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<H> Copy for Stored<H> {}

impl<H: 'static> Stored<H> {
    fn new(handle: H) -> Self {
        ARENA.with(|a| {
            let mut a = a.borrow_mut();
            let index = u32::try_from(a.len()).expect("fewer than 2^32 handles");
            a.push(Box::new(handle));
            Stored { index, _handle: std::marker::PhantomData }
        })
    }

    #[inline]
    fn with<R>(self, f: impl FnOnce(&H) -> R) -> R {
        ARENA.with(|a| {
            let a = a.borrow();
            f(a[self.index as usize].downcast_ref::<H>().expect("a stored handle keeps its type"))
        })
    }
}

type CopySignal<T> = Stored<egress_reactive::Signal<T, egress_reactive::Local>>;
type CopyComputed<T> = Stored<egress_reactive::Computed<T, egress_reactive::Local>>;

impl EgressCopy {
    pub const NAME: &'static str = "egress Copy handles";
    pub const LAZY: bool = true;
    pub fn new() -> egress_reactive::Context {
        egress_reactive::Context::new()
    }
    pub fn run<R>(_cx: &egress_reactive::Context, f: impl FnOnce() -> R) -> R {
        f()
    }
    pub fn dispose(cx: egress_reactive::Context) {
        let handles = ARENA.with(|a| std::mem::take(&mut *a.borrow_mut()));
        drop(handles);
        drop(cx)
    }
    #[inline]
    pub fn signal<T: PartialEq + Clone + 'static>(cx: &egress_reactive::Context, v: T) -> CopySignal<T> {
        Stored::new(cx.signal(v))
    }
    pub fn computed<T: PartialEq + 'static>(
        cx: &egress_reactive::Context,
        f: impl Fn(&()) -> T + 'static,
    ) -> CopyComputed<T> {
        Stored::new(cx.computed(move || f(&())))
    }
    pub fn computed_unguarded<T: 'static>(
        cx: &egress_reactive::Context,
        f: impl Fn(&()) -> T + 'static,
    ) -> CopyComputed<T> {
        Stored::new(cx.computed_unguarded(move || f(&())))
    }
    pub fn effect(cx: &egress_reactive::Context, f: impl Fn(&()) + 'static) {
        cx.effect(move || f(&()));
    }
    #[inline]
    pub fn get<T: Clone + 'static>(_rx: &(), s: &CopySignal<T>) -> T {
        s.with(|s| s.get())
    }
    #[inline]
    pub fn read<T: Clone + 'static>(_rx: &(), c: &CopyComputed<T>) -> T {
        c.with(|c| c.get())
    }
    #[inline]
    pub fn peek_signal<T: Clone + 'static>(_cx: &egress_reactive::Context, s: &CopySignal<T>) -> T {
        s.with(|s| s.get_untracked())
    }
    #[inline]
    pub fn peek<T: Clone + 'static>(_cx: &egress_reactive::Context, c: &CopyComputed<T>) -> T {
        c.with(|c| c.get_untracked())
    }
    #[inline]
    pub fn set<T: PartialEq + 'static>(cx: &egress_reactive::Context, s: &CopySignal<T>, v: T) {
        cx.batch(|| s.with(|s| s.set(v)))
    }
    #[inline]
    pub fn write<T: PartialEq + 'static>(_cx: &egress_reactive::Context, s: &CopySignal<T>, v: T) {
        s.with(|s| s.set(v))
    }
    #[inline]
    pub fn batch<R>(cx: &egress_reactive::Context, f: impl FnOnce() -> R) -> R {
        cx.batch(f)
    }
}

// ---- lazily ---------------------------------------------------------------

impl LazilyLocal {
    pub const NAME: &'static str = "lazily Context";
    pub const LAZY: bool = true;
    pub fn new() -> lazily::Context {
        lazily::Context::new()
    }
    pub fn run<R>(_cx: &lazily::Context, f: impl FnOnce() -> R) -> R {
        f()
    }
    pub fn dispose(cx: lazily::Context) {
        drop(cx)
    }
    #[inline]
    pub fn signal<T: PartialEq + Clone + 'static>(cx: &lazily::Context, v: T) -> lazily::Source<T> {
        cx.source(v)
    }
    pub fn computed<T: PartialEq + Clone + 'static>(
        cx: &lazily::Context,
        f: impl Fn(&lazily::Compute<'_>) -> T + 'static,
    ) -> lazily::Computed<T> {
        cx.computed(f)
    }
    pub fn computed_unguarded<T: Clone + 'static>(
        cx: &lazily::Context,
        f: impl Fn(&lazily::Compute<'_>) -> T + 'static,
    ) -> lazily::Computed<T> {
        cx.slot(f)
    }
    pub fn effect(cx: &lazily::Context, f: impl Fn(&lazily::Compute<'_>) + 'static) {
        cx.effect(f);
    }
    #[inline]
    pub fn get<T: Clone + 'static>(rx: &lazily::Compute<'_>, s: &lazily::Source<T>) -> T {
        s.get(rx)
    }
    #[inline]
    pub fn read<T: Clone + 'static>(rx: &lazily::Compute<'_>, c: &lazily::Computed<T>) -> T {
        c.get(rx)
    }
    #[inline]
    pub fn peek_signal<T: Clone + 'static>(cx: &lazily::Context, s: &lazily::Source<T>) -> T {
        s.get(cx)
    }
    #[inline]
    pub fn peek<T: Clone + 'static>(cx: &lazily::Context, c: &lazily::Computed<T>) -> T {
        c.get(cx)
    }
    #[inline]
    pub fn set<T: PartialEq + 'static>(cx: &lazily::Context, s: &lazily::Source<T>, v: T) {
        cx.batch(|cx| s.set(cx, v))
    }
    #[inline]
    pub fn write<T: PartialEq + 'static>(cx: &lazily::Context, s: &lazily::Source<T>, v: T) {
        s.set(cx, v)
    }
    #[inline]
    pub fn batch<R>(cx: &lazily::Context, f: impl FnOnce() -> R) -> R {
        cx.batch(|_| f())
    }
}

impl LazilyThreadSafe {
    pub const NAME: &'static str = "lazily ThreadSafe";
    pub const LAZY: bool = true;
    pub fn new() -> lazily::ThreadSafeContext {
        lazily::ThreadSafeContext::new()
    }
    pub fn run<R>(_cx: &lazily::ThreadSafeContext, f: impl FnOnce() -> R) -> R {
        f()
    }
    pub fn dispose(cx: lazily::ThreadSafeContext) {
        drop(cx)
    }
    #[inline]
    pub fn signal<T: PartialEq + Clone + Send + Sync + 'static>(
        cx: &lazily::ThreadSafeContext,
        v: T,
    ) -> lazily::Source<T> {
        cx.source(v)
    }
    pub fn computed<T: PartialEq + Clone + Send + Sync + 'static>(
        cx: &lazily::ThreadSafeContext,
        f: impl Fn(&lazily::ThreadSafeContext) -> T + Send + Sync + 'static,
    ) -> lazily::Computed<T> {
        cx.computed(f)
    }
    pub fn computed_unguarded<T: Clone + Send + Sync + 'static>(
        cx: &lazily::ThreadSafeContext,
        f: impl Fn(&lazily::ThreadSafeContext) -> T + Send + Sync + 'static,
    ) -> lazily::Computed<T> {
        cx.slot(f)
    }
    pub fn effect(cx: &lazily::ThreadSafeContext, f: impl Fn(&lazily::ThreadSafeContext) + Send + Sync + 'static) {
        cx.effect(f);
    }
    #[inline]
    pub fn get<T: Clone + Send + Sync + 'static>(rx: &lazily::ThreadSafeContext, s: &lazily::Source<T>) -> T {
        rx.get(s)
    }
    #[inline]
    pub fn read<T: Clone + Send + Sync + 'static>(rx: &lazily::ThreadSafeContext, c: &lazily::Computed<T>) -> T {
        rx.get(c)
    }
    #[inline]
    pub fn peek_signal<T: Clone + Send + Sync + 'static>(cx: &lazily::ThreadSafeContext, s: &lazily::Source<T>) -> T {
        cx.get(s)
    }
    #[inline]
    pub fn peek<T: Clone + Send + Sync + 'static>(cx: &lazily::ThreadSafeContext, c: &lazily::Computed<T>) -> T {
        cx.get(c)
    }
    #[inline]
    pub fn set<T: PartialEq + Send + Sync + 'static>(cx: &lazily::ThreadSafeContext, s: &lazily::Source<T>, v: T) {
        cx.batch(|cx| cx.set(s, v))
    }
    #[inline]
    pub fn write<T: PartialEq + Send + Sync + 'static>(cx: &lazily::ThreadSafeContext, s: &lazily::Source<T>, v: T) {
        cx.set(s, v)
    }
    #[inline]
    pub fn batch<R>(cx: &lazily::ThreadSafeContext, f: impl FnOnce() -> R) -> R {
        cx.batch(|_| f())
    }
}

// ---- alien-signals ----------------------------------------------------------

/// alien-signals keeps every node in one process-wide arena that is never
/// freed; "disposal" here disposes the effects, which is all it offers.
pub struct AlienCx(std::cell::RefCell<Vec<alien_signals::Effect>>);

impl Alien {
    pub const NAME: &'static str = "alien-signals";
    pub const LAZY: bool = true;
    pub fn new() -> AlienCx {
        AlienCx(std::cell::RefCell::new(Vec::new()))
    }
    pub fn run<R>(_cx: &AlienCx, f: impl FnOnce() -> R) -> R {
        f()
    }
    pub fn dispose(cx: AlienCx) {
        for e in cx.0.into_inner() {
            e.dispose();
        }
    }
    #[inline]
    pub fn signal<T: PartialEq + Clone + 'static>(_cx: &AlienCx, v: T) -> alien_signals::Signal<T> {
        alien_signals::signal(v)
    }
    pub fn computed<T: PartialEq + Clone + 'static>(
        _cx: &AlienCx,
        f: impl Fn(&()) -> T + 'static,
    ) -> alien_signals::Computed<T> {
        alien_signals::computed(move |_| f(&()))
    }
    pub fn computed_unguarded<T: Clone + 'static>(
        _cx: &AlienCx,
        f: impl Fn(&()) -> T + 'static,
    ) -> alien_signals::Computed<T> {
        alien_signals::Computed::new_with_eq(move |_| f(&()), |_, _| false)
    }
    pub fn effect(cx: &AlienCx, f: impl Fn(&()) + 'static) {
        cx.0.borrow_mut().push(alien_signals::effect(move || f(&())));
    }
    #[inline]
    pub fn get<T: Clone + 'static>(_rx: &(), s: &alien_signals::Signal<T>) -> T {
        s.get()
    }
    #[inline]
    pub fn read<T: Clone + 'static>(_rx: &(), c: &alien_signals::Computed<T>) -> T {
        c.get()
    }
    #[inline]
    pub fn peek_signal<T: Clone + 'static>(_cx: &AlienCx, s: &alien_signals::Signal<T>) -> T {
        s.get()
    }
    #[inline]
    pub fn peek<T: Clone + 'static>(_cx: &AlienCx, c: &alien_signals::Computed<T>) -> T {
        c.get()
    }
    #[inline]
    pub fn set<T: Clone + 'static>(cx: &AlienCx, s: &alien_signals::Signal<T>, v: T) {
        Self::batch(cx, || s.set(v))
    }
    #[inline]
    pub fn write<T: Clone + 'static>(_cx: &AlienCx, s: &alien_signals::Signal<T>, v: T) {
        s.set(v)
    }
    #[inline]
    pub fn batch<R>(_cx: &AlienCx, f: impl FnOnce() -> R) -> R {
        alien_signals::start_batch();
        let r = f();
        alien_signals::end_batch();
        r
    }
}

// ---- sycamore-reactive ------------------------------------------------------

thread_local! {
    /// sycamore leaks every root it creates: make one per process and a child
    /// scope per graph.
    static SYCAMORE_ROOT: sycamore_reactive::RootHandle = sycamore_reactive::create_root(|| {});
}

impl Sycamore {
    pub const NAME: &'static str = "sycamore";
    /// Its memos are eager: they run on every change, read or not.
    pub const LAZY: bool = false;
    pub fn new() -> sycamore_reactive::NodeHandle {
        SYCAMORE_ROOT.with(|root| root.run_in(|| sycamore_reactive::create_child_scope(|| {})))
    }
    pub fn run<R>(cx: &sycamore_reactive::NodeHandle, f: impl FnOnce() -> R) -> R {
        SYCAMORE_ROOT.with(|root| root.run_in(|| cx.run_in(f)))
    }
    pub fn dispose(cx: sycamore_reactive::NodeHandle) {
        SYCAMORE_ROOT.with(|root| root.run_in(|| cx.dispose()))
    }
    #[inline]
    pub fn signal<T: 'static>(_cx: &sycamore_reactive::NodeHandle, v: T) -> sycamore_reactive::Signal<T> {
        sycamore_reactive::create_signal(v)
    }
    pub fn computed<T: PartialEq + 'static>(
        _cx: &sycamore_reactive::NodeHandle,
        f: impl Fn(&()) -> T + 'static,
    ) -> sycamore_reactive::ReadSignal<T> {
        sycamore_reactive::create_selector(move || f(&()))
    }
    pub fn computed_unguarded<T: 'static>(
        _cx: &sycamore_reactive::NodeHandle,
        f: impl Fn(&()) -> T + 'static,
    ) -> sycamore_reactive::ReadSignal<T> {
        sycamore_reactive::create_memo(move || f(&()))
    }
    pub fn effect(_cx: &sycamore_reactive::NodeHandle, f: impl Fn(&()) + 'static) {
        sycamore_reactive::create_effect(move || f(&()));
    }
    #[inline]
    pub fn get<T: Clone + 'static>(_rx: &(), s: &sycamore_reactive::Signal<T>) -> T {
        s.get_clone()
    }
    #[inline]
    pub fn read<T: Clone + 'static>(_rx: &(), c: &sycamore_reactive::ReadSignal<T>) -> T {
        c.get_clone()
    }
    #[inline]
    pub fn peek_signal<T: Clone + 'static>(_cx: &sycamore_reactive::NodeHandle, s: &sycamore_reactive::Signal<T>) -> T {
        s.get_clone_untracked()
    }
    #[inline]
    pub fn peek<T: Clone + 'static>(_cx: &sycamore_reactive::NodeHandle, c: &sycamore_reactive::ReadSignal<T>) -> T {
        c.get_clone_untracked()
    }
    #[inline]
    pub fn set<T: 'static>(_cx: &sycamore_reactive::NodeHandle, s: &sycamore_reactive::Signal<T>, v: T) {
        sycamore_reactive::batch(|| s.set(v))
    }
    #[inline]
    pub fn write<T: 'static>(_cx: &sycamore_reactive::NodeHandle, s: &sycamore_reactive::Signal<T>, v: T) {
        s.set(v)
    }
    #[inline]
    pub fn batch<R>(_cx: &sycamore_reactive::NodeHandle, f: impl FnOnce() -> R) -> R {
        sycamore_reactive::batch(f)
    }
}

// ---- leptos reactive_graph --------------------------------------------------

thread_local! {
    /// The local executor its effects run on: ticked after every write.
    static POOL: std::cell::RefCell<futures::executor::LocalPool> =
        std::cell::RefCell::new(futures::executor::LocalPool::new());
}

/// any_spawner's hook into [`POOL`].
struct LocalTicker;

impl any_spawner::CustomExecutor for LocalTicker {
    fn spawn(&self, fut: any_spawner::PinnedFuture<()>) {
        self.spawn_local(fut);
    }
    fn spawn_local(&self, fut: any_spawner::PinnedLocalFuture<()>) {
        use futures::task::LocalSpawnExt;
        POOL.with(|p| p.borrow().spawner().spawn_local(fut).expect("local pool accepts tasks"));
    }
    fn poll_local(&self) {
        tick();
    }
}

/// Runs every ready effect until none is.
fn tick() {
    POOL.with(|p| {
        if let Ok(mut pool) = p.try_borrow_mut() {
            pool.run_until_stalled();
        }
    });
}

impl Leptos {
    pub const NAME: &'static str = "reactive_graph";
    pub const LAZY: bool = true;
    pub fn new() -> reactive_graph::owner::Owner {
        let _ = any_spawner::Executor::init_local_custom_executor(LocalTicker);
        reactive_graph::owner::Owner::new()
    }
    pub fn run<R>(cx: &reactive_graph::owner::Owner, f: impl FnOnce() -> R) -> R {
        cx.with(f)
    }
    pub fn dispose(cx: reactive_graph::owner::Owner) {
        cx.cleanup();
        tick();
    }
    #[inline]
    pub fn signal<T: Send + Sync + 'static>(
        _cx: &reactive_graph::owner::Owner,
        v: T,
    ) -> reactive_graph::signal::RwSignal<T> {
        reactive_graph::signal::RwSignal::new(v)
    }
    pub fn computed<T: PartialEq + Send + Sync + 'static>(
        _cx: &reactive_graph::owner::Owner,
        f: impl Fn(&()) -> T + Send + Sync + 'static,
    ) -> reactive_graph::computed::Memo<T> {
        reactive_graph::computed::Memo::new(move |_| f(&()))
    }
    pub fn computed_unguarded<T: Send + Sync + 'static>(
        _cx: &reactive_graph::owner::Owner,
        f: impl Fn(&()) -> T + Send + Sync + 'static,
    ) -> reactive_graph::computed::Memo<T> {
        reactive_graph::computed::Memo::new_with_compare(move |_| f(&()), |_, _| true)
    }
    pub fn effect(_cx: &reactive_graph::owner::Owner, f: impl Fn(&()) + 'static) {
        reactive_graph::effect::Effect::new(move |_| f(&()));
        tick();
    }
    #[inline]
    pub fn get<T: Clone + Send + Sync + 'static>(_rx: &(), s: &reactive_graph::signal::RwSignal<T>) -> T {
        use reactive_graph::traits::Get;
        s.get()
    }
    #[inline]
    pub fn read<T: Clone + Send + Sync + 'static>(_rx: &(), c: &reactive_graph::computed::Memo<T>) -> T {
        use reactive_graph::traits::Get;
        c.get()
    }
    #[inline]
    pub fn peek_signal<T: Clone + Send + Sync + 'static>(
        _cx: &reactive_graph::owner::Owner,
        s: &reactive_graph::signal::RwSignal<T>,
    ) -> T {
        use reactive_graph::traits::GetUntracked;
        s.get_untracked()
    }
    #[inline]
    pub fn peek<T: Clone + Send + Sync + 'static>(
        _cx: &reactive_graph::owner::Owner,
        c: &reactive_graph::computed::Memo<T>,
    ) -> T {
        use reactive_graph::traits::GetUntracked;
        c.get_untracked()
    }
    #[inline]
    pub fn set<T: Send + Sync + 'static>(
        _cx: &reactive_graph::owner::Owner,
        s: &reactive_graph::signal::RwSignal<T>,
        v: T,
    ) {
        use reactive_graph::traits::Set;
        s.set(v);
        tick();
    }
    #[inline]
    pub fn write<T: Send + Sync + 'static>(
        _cx: &reactive_graph::owner::Owner,
        s: &reactive_graph::signal::RwSignal<T>,
        v: T,
    ) {
        use reactive_graph::traits::Set;
        s.set(v)
    }
    #[inline]
    pub fn batch<R>(_cx: &reactive_graph::owner::Owner, f: impl FnOnce() -> R) -> R {
        let r = f();
        tick();
        r
    }
}
