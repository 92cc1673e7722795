//! `AsyncContext`: the thread-safe graph for tokio, with async effects and
//! watch streams.

use std::future::Future;
use std::ops::Deref;
use std::panic::Location;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context as TaskContext, Poll};

use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::computed::Computed;
use crate::context::{Ctx, Handle, NodeRef};
use crate::effect::Effect;
use crate::error::ReadError;
use crate::flavor::{HoldsCleanup, Threaded};
use crate::graph::{Key, NONE, NodeObj, flags::*};
use crate::run;
use crate::signal::Signal;

/// The graph for async code on tokio: synchronous signals, computeds and
/// effects exactly as in [`ThreadSafeContext`](crate::ThreadSafeContext),
/// plus async effects ([`Handle::effect_async`]) and streams of a
/// computed's latest value ([`Handle::watch`]), which it reaches through
/// `Deref` (as any `Handle<Threaded>` does: clone one into a closure that
/// spawns effects, rather than an `Arc<AsyncContext>`).
///
/// Time, where the graph needs it, is `tokio::time`, so tests can pause it.
/// Works on the current-thread and the multi-thread runtime.
///
/// ```
/// use egress_reactive::AsyncContext;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let cx = AsyncContext::new();
/// let query = cx.signal(String::from("ru"));
/// let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
/// let search = cx.effect_async({
///     let query = query.clone();
///     move |ecx| {
///         let (query, tx) = (query.clone(), tx.clone());
///         async move {
///             let q = ecx.get(&query); // tracked, at any point of the run
///             tokio::task::yield_now().await;
///             tx.send(format!("results for {q}")).unwrap();
///         }
///     }
/// });
/// assert_eq!(rx.recv().await.unwrap(), "results for ru");
/// query.set("rust".into());
/// assert_eq!(rx.recv().await.unwrap(), "results for rust");
/// search.dispose();
/// # }
/// ```
pub struct AsyncContext {
    inner: Ctx<Threaded>,
}

impl AsyncContext {
    /// A new, empty graph.
    #[track_caller]
    pub fn new() -> Self {
        AsyncContext { inner: Ctx::new() }
    }

    /// A cloneable handle to this graph, for closures that create nodes.
    pub fn handle(&self) -> Handle<Threaded> {
        self.inner.handle()
    }

    /// The current time of tokio's clock (paused in tests that pause it).
    pub fn now(&self) -> tokio::time::Instant {
        tokio::time::Instant::now()
    }
}

impl Default for AsyncContext {
    #[track_caller]
    fn default() -> Self {
        Self::new()
    }
}

impl Deref for AsyncContext {
    type Target = Handle<Threaded>;
    fn deref(&self) -> &Handle<Threaded> {
        &self.inner
    }
}

impl std::fmt::Debug for AsyncContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AsyncContext").field(&*self.inner).finish()
    }
}

/// The handle an async effect reads through: every read through it, at any
/// point of a run (before or after an `.await`), is a dependency of the
/// effect.
#[derive(Clone)]
pub struct EffectCx {
    handle: Handle<Threaded>,
    key: Key,
}

/// What an [`EffectCx`] can read: signals and computeds.
pub trait Readable<T> {
    /// Reads the value, recording `observer` as a subscriber.
    #[doc(hidden)]
    fn read_for(&self, cx: &EffectCx) -> Result<T, ReadError>;
}

impl<T: Clone + Send + Sync + 'static> Readable<T> for Signal<T, Threaded> {
    fn read_for(&self, cx: &EffectCx) -> Result<T, ReadError> {
        self.read_observed(cx.key)
    }
}

impl<T: Clone + Send + Sync + 'static> Readable<T> for Computed<T, Threaded> {
    fn read_for(&self, cx: &EffectCx) -> Result<T, ReadError> {
        self.read_observed(cx.key)
    }
}

impl EffectCx {
    /// Reads `node` (a signal or a computed), tracked.
    ///
    /// # Panics
    /// If the node was disposed or closes a cycle; see [`EffectCx::try_get`].
    #[track_caller]
    pub fn get<T>(&self, node: &impl Readable<T>) -> T {
        match self.try_get(node) {
            Ok(v) => v,
            Err(e) => panic!("{e} (read at {})", Location::caller()),
        }
    }

    /// Reads `node`, tracked; disposal and cycles are errors.
    pub fn try_get<T>(&self, node: &impl Readable<T>) -> Result<T, ReadError> {
        node.read_for(self)
    }

    /// Makes trigger `trigger` a dependency of this effect.
    pub(crate) fn track(&self, trigger: Key) {
        self.handle.enter(|cell| {
            let mut g = cell.borrow_mut();
            if g.alive(self.key) && g.alive(trigger) {
                g.link(trigger.index, self.key.index);
            }
        });
    }

    /// Runs `f` with this effect as the owner: the nodes `f` creates belong
    /// to the effect, and are disposed before its next run and with it (as
    /// those created in a synchronous effect's run are). `None`, and `f`
    /// not run, if the effect was disposed. (Nodes created outside `own`
    /// belong to whatever owner is current where they are created: an
    /// async run has none of its own across `.await`s.)
    pub fn own<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        self.handle.with_owner(self.key, f).ok()
    }

    /// Registers `f` to run before this effect's next run and when it is
    /// disposed (also when disposal cancels a run in progress). Registered
    /// once the effect is disposed, `f` runs at once.
    pub fn on_cleanup<C: FnOnce() + Send + 'static>(&self, f: C)
    where
        Threaded: HoldsCleanup<C>,
    {
        let cleanup = Box::new(f);
        let gone = self.handle.enter(|cell| {
            let mut g = cell.borrow_mut();
            if g.alive(self.key) {
                g.add_cleanup(self.key.index, cleanup);
                None
            } else {
                Some(cleanup)
            }
        });
        // The effect is gone: nothing would ever run it.
        if let Some(cleanup) = gone {
            cleanup();
        }
    }
}

/// What the graph holds of an async effect: the bell of its task, and
/// what its runs' panics left.
struct AsyncEffectObj {
    bell: Arc<Notify>,
    task: OnceLock<AbortHandle>,
}

/// The panics of an async effect's runs.
#[derive(Default)]
struct Panics {
    count: std::sync::atomic::AtomicU64,
    last: parking_lot::Mutex<Option<String>>,
}

impl Panics {
    fn record(&self, panic: &(dyn std::any::Any + Send)) {
        let message =
            egress_core::panic_message(panic).unwrap_or("a panic with a payload that is not a string").to_owned();
        self.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        *self.last.lock() = Some(message);
    }
}

impl NodeObj for AsyncEffectObj {
    fn run(&self, _: &crate::flavor::Entered) -> bool {
        true
    }

    fn schedule(&self) {
        // One stored permit: however many changes arrive during a run, they
        // cause exactly one more run after it.
        self.bell.notify_one();
    }
}

impl Drop for AsyncEffectObj {
    fn drop(&mut self) {
        if let Some(task) = self.task.get() {
            task.abort();
        }
    }
}

/// A running async effect. Dropping the handle does not stop it; dispose it
/// (or its owner, or the context).
///
/// A run that panics (its future, or a computed it reads) ends there: its
/// cleanups run before the next run, the effect stays subscribed to what
/// the run read before the panic, and it runs again when that changes. The
/// panic is counted and its message kept ([`panics`](Self::panics),
/// [`last_panic`](Self::last_panic)); the task goes on.
#[derive(Clone)]
pub struct AsyncEffect {
    node: NodeRef<Threaded>,
    /// Shared with the task (not the graph's object: the task aborts when
    /// that drops, so neither may hold it).
    panics: Arc<Panics>,
}

impl Deref for AsyncEffect {
    type Target = NodeRef<Threaded>;
    fn deref(&self) -> &NodeRef<Threaded> {
        &self.node
    }
}

impl std::fmt::Debug for AsyncEffect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncEffect").field("runs", &self.runs()).finish()
    }
}

impl AsyncEffect {
    /// Cancels the effect: a run in progress is aborted at its next `.await`
    /// and never resumed, its cleanups run, and it never runs again.
    /// (The same as [`NodeRef::dispose`], said for async effects.)
    pub fn dispose(&self) {
        self.node.dispose();
    }

    /// How many of its runs panicked.
    pub fn panics(&self) -> u64 {
        self.panics.count.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The message of the last panic of a run, if any.
    pub fn last_panic(&self) -> Option<String> {
        self.panics.last.lock().clone()
    }
}

impl Handle<Threaded> {
    /// Spawns an async effect on the current tokio runtime, owned by the
    /// current owner. It runs once now,
    /// then once after every settled change of what it read through its
    /// [`EffectCx`]. Runs are serialized (never two at once) and coalesced:
    /// changes that arrive during a run cause exactly one more run after it.
    /// A re-run never aborts a run in progress; disposal does.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    #[track_caller]
    pub fn effect_async<C, Fut>(&self, f: C) -> AsyncEffect
    where
        C: Fn(EffectCx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.spawn_effect_async(f, Location::caller())
    }

    /// A stream of `computed`'s latest value: the current value first, then
    /// each settled change (intermediate values a slow consumer missed are
    /// skipped). The stream owns an effect, disposed when it is dropped. It
    /// ends when `computed` is disposed (its owner disposed: a cell's
    /// readers with their cell), rather than wait for ever.
    #[track_caller]
    pub fn watch<T>(&self, computed: &Computed<T, Threaded>) -> Watch<T>
    where
        T: Clone + PartialEq + Send + Sync + 'static,
    {
        let (tx, rx) = tokio::sync::watch::channel(computed.get_untracked());
        let source = computed.clone();
        // The effect belongs to the source's owner: disposed with the
        // source, it drops the sender, which ends the stream.
        let key = computed.key;
        let owner = self.enter(|cell| {
            let g = cell.borrow();
            g.alive(key).then(|| g.key(g.node(key.index).owner))
        });
        // Taken (and so dropped, which ends the stream) if the source is
        // gone when the effect runs.
        let tx = parking_lot::Mutex::new(Some(tx));
        let at = std::panic::Location::caller();
        let make = move || {
            self.make_effect(
                move || {
                    let Ok(v) = source.try_get() else {
                        tx.lock().take();
                        return;
                    };
                    if let Some(tx) = &*tx.lock() {
                        tx.send_if_modified(|cur| {
                            if *cur == v {
                                false
                            } else {
                                *cur = v;
                                true
                            }
                        });
                    }
                },
                at,
            )
        };
        let effect = match owner {
            Some(owner) => self.with_owner(owner, make).unwrap_or_else(|make| make()),
            None => make(),
        };
        Watch { stream: tokio_stream::wrappers::WatchStream::new(rx), effect }
    }
}

/// A future whose panics are caught, in its polls and in its drop: `Err`
/// with the payload when a poll panicked, or when the future, done, panicked
/// as it was dropped (its output is then lost: a send that panics is failed
/// whatever it returned). It borrows the future pinned where its caller
/// pinned it, in an `Option` that it empties once the future is done or has
/// panicked: an async effect's run in a box per run, an attachment's send in
/// place (in the run's state, which that box holds), so that a send costs no
/// allocation. Polled again once it returned, it is `Err` again.
pub(crate) struct CatchUnwind<'a, Fut>(pub(crate) Pin<&'a mut Option<Fut>>);

impl<Fut: Future> Future for CatchUnwind<'_, Fut> {
    type Output = Result<Fut::Output, crate::run::Panic>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let slot = &mut self.0;
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let Some(fut) = slot.as_mut().as_pin_mut() else {
                panic!("CatchUnwind polled after it returned");
            };
            let Poll::Ready(out) = fut.poll(cx) else { return Poll::Pending };
            slot.set(None);
            Poll::Ready(out)
        }));
        match polled {
            Ok(Poll::Ready(out)) => Poll::Ready(Ok(out)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => {
                // Dropped here, where a panic of its drop is caught too (the
                // slot is empty after a drop that panicked as well).
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| slot.set(None)));
                Poll::Ready(Err(panic))
            }
        }
    }
}

/// Starts one run: cleans up after the previous one and rewinds tracking.
/// Returns false if the effect was disposed.
fn begin_run(cx: &EffectCx) -> bool {
    cx.handle.enter(|cell| {
        if !cell.borrow().alive(cx.key) || !run::clean_before_run(cell, cx.key) {
            return false;
        }
        cell.borrow_mut().begin_detached(cx.key.index);
        true
    })
}

fn end_run(cx: &EffectCx) {
    cx.handle.enter(|cell| {
        let mut g = cell.borrow_mut();
        if g.alive(cx.key) {
            g.end_detached(cx.key.index);
        }
    });
}

/// A stream of a computed's latest values; see [`Handle::watch`].
pub struct Watch<T> {
    stream: tokio_stream::wrappers::WatchStream<T>,
    effect: Effect<Threaded>,
}

impl<T: Clone + Send + Sync + 'static> futures_core::Stream for Watch<T> {
    type Item = T;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<T>> {
        Pin::new(&mut self.stream).poll_next(cx)
    }
}

impl<T> Drop for Watch<T> {
    fn drop(&mut self) {
        self.effect.dispose();
    }
}

impl<T> std::fmt::Debug for Watch<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").finish_non_exhaustive()
    }
}

impl Handle<Threaded> {
    /// [`Handle::effect_async`], owned by the current owner (the egress
    /// cells spawn their attachments with it).
    pub(crate) fn spawn_effect_async<C, Fut>(&self, f: C, created_at: &'static Location<'static>) -> AsyncEffect
    where
        C: Fn(EffectCx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let bell = Arc::new(Notify::new());
        let obj = Arc::new(AsyncEffectObj { bell: bell.clone(), task: OnceLock::new() });
        let panics = Arc::new(Panics::default());
        let handle = self.clone();
        let erased: <Threaded as crate::Flavor>::Obj = obj.clone();
        let created =
            handle.enter(|cell| cell.borrow_mut().create(EFFECT | ASYNC | DIRTY, Some(erased), NONE, created_at));
        let key = match created {
            Ok(key) => key,
            // A dropped context: born disposed, never spawned.
            Err((dead, _)) => return AsyncEffect { node: NodeRef { handle, key: dead }, panics },
        };
        let cx = EffectCx { handle: handle.clone(), key };
        let runs = panics.clone();
        let task = tokio::spawn(async move {
            loop {
                if !begin_run(&cx) {
                    return;
                }
                // Boxed, one allocation per run: in place, the run's state
                // would be the task's for the effect's whole life, and built
                // on the stack of whoever spawns it.
                let mut run = Box::pin(Some(f(cx.clone())));
                match CatchUnwind(run.as_mut()).await {
                    Ok(()) => end_run(&cx),
                    // What the run did not get to read stays a dependency.
                    Err(panic) => runs.record(&*panic),
                }
                drop(run);
                bell.notified().await;
            }
        });
        // The object is alive (the graph holds it) unless disposed already,
        // in which case aborting now is what disposal wants.
        if obj.task.set(task.abort_handle()).is_err() {
            task.abort();
        }
        if handle.introspect(key, |_| ()).is_none() {
            task.abort();
        }
        AsyncEffect { node: NodeRef { handle, key }, panics }
    }
}
