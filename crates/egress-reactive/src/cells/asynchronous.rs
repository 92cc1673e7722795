//! [`AsyncEgressCell`]: the egress cell for tokio, with its own retry timer
//! and async transports.

use std::ops::Deref;
use std::panic::Location;
use std::sync::Arc;
use std::time::Duration;

use std::panic::resume_unwind;

use egress_core::{DeadReason, EgressCore, MessageStatus, Policy, Sequence};
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio_stream::StreamExt as _;

use super::attachment::Attachment;
use super::cell::EgressCellOf;
use super::clock::TokioClock;
use super::inner::Inner;
use super::options::CellOptions;
use super::transport::AsyncTransport;
use crate::asynchronous::{AsyncContext, CatchUnwind};
use crate::context::Handle;
use crate::flavor::Threaded;

/// An egress cell on an [`AsyncContext`]: everything a
/// [`ThreadSafeEgressCell`](crate::ThreadSafeEgressCell) has (it
/// dereferences to one), plus:
///
/// - **Its own timer**: a task sleeps (on `tokio::time`, so tests can pause
///   it) until the core's next due time and calls `handle_timeout` then; a
///   failure that parks an earlier record re-arms it. There is nothing to
///   poll.
/// - **Async transports**: [`attach`](Self::attach) takes an
///   [`AsyncTransport`] and runs its sends in an async effect. Runs are
///   serialized: a change during a send never aborts it, it causes one more
///   run after it. Dropping the [`Attachment`] mid-send cancels the send at
///   its next `.await`; the envelope stays in flight and is replayed after
///   the next reconnect.
///
/// Time is tokio's clock by default, in milliseconds. The cell must be made
/// inside a tokio runtime. The timer runs while a clone of the cell or one
/// of its [`Attachment`]s lives; if the runtime it was spawned on shuts
/// down, the next change of the parked records (or the next `attach`)
/// spawns it again on the runtime current there.
///
/// ```
/// use egress_core::{Envelope, Policy, Sequence};
/// use egress_reactive::{AsyncContext, AsyncEgressCell, AsyncTransport, SendError};
/// use tokio::sync::mpsc;
///
/// struct Channel(mpsc::UnboundedSender<Envelope<String>>);
/// impl AsyncTransport<String> for Channel {
///     async fn send(&mut self, envelope: Envelope<String>) -> Result<(), SendError> {
///         self.0.send(envelope).map_err(|_| SendError::transient("peer gone"))
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let cx = AsyncContext::new();
/// let cell = AsyncEgressCell::new(&cx, Policy::default());
/// let (tx, mut rx) = mpsc::unbounded_channel();
/// let link = cell.attach(Channel(tx));
/// cell.enqueue("hello".to_string());
/// let envelope = rx.recv().await.unwrap();
/// assert_eq!(envelope.payload, "hello");
/// link.ack(envelope.sequence);
/// assert_eq!(cell.acked_through().get(), Some(Sequence(0)));
/// # }
/// ```
pub struct AsyncEgressCell<T: 'static> {
    cell: EgressCellOf<T, Threaded>,
    timer: Arc<Timer>,
}

/// What a timer drives: the parked records of a cell, or of a lanes cell.
pub(super) trait Timed: Clone + Send + Sync + 'static {
    /// When the earliest parked record is due.
    fn poll_timeout(&self) -> Option<egress_core::Time>;
    /// The cell's clock, now.
    fn now(&self) -> egress_core::Time;
    /// Makes every parked record due at `now` pending again.
    fn handle_timeout(&self, now: egress_core::Time);
}

impl<T: Clone + Send + Sync + 'static> Timed for Inner<T, Threaded> {
    fn poll_timeout(&self) -> Option<egress_core::Time> {
        Inner::poll_timeout(self)
    }
    fn now(&self) -> egress_core::Time {
        Inner::now(self)
    }
    fn handle_timeout(&self, now: egress_core::Time) {
        let _ = Inner::handle_timeout(self, now);
    }
}

/// The timer's task, and what restarts it.
pub(super) struct TimerTask {
    task: parking_lot::Mutex<Option<AbortHandle>>,
    /// The last clone of the cell and the last attachment dropped.
    stopped: std::sync::atomic::AtomicBool,
    bell: Arc<Notify>,
}

impl TimerTask {
    /// Spawns the timer on the current runtime unless it runs, or was
    /// stopped, or there is no runtime here.
    pub(super) fn ensure(&self, inner: &impl Timed) {
        if self.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let mut task = self.task.lock();
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            *task = Some(runtime.spawn(run_timer(inner.clone(), self.bell.clone())).abort_handle());
        }
    }
}

impl TimerTask {
    /// A timer for `inner`, re-armed by an effect (made in `scope`, over
    /// `parked`: the count of parked records) whenever the parked set
    /// changes, and spawned again there if its runtime is gone.
    pub(super) fn start(
        handle: &Handle<Threaded>,
        scope: &crate::context::Scope<Threaded>,
        parked: crate::Computed<usize, Threaded>,
        inner: impl Timed,
    ) -> Arc<Timer> {
        let bell = Arc::new(Notify::new());
        let task =
            Arc::new(TimerTask { task: parking_lot::Mutex::new(None), stopped: false.into(), bell: bell.clone() });
        let timer = task.clone();
        let _ = scope.try_run(|| {
            handle.effect(move || {
                let _ = parked.try_get();
                timer.ensure(&inner);
                bell.notify_one();
            })
        });
        Arc::new(Timer(task))
    }
}

/// Stops the timer task when the last clone of the cell, and the last of
/// its attachments, drop.
pub(super) struct Timer(pub(super) Arc<TimerTask>);

impl Drop for Timer {
    fn drop(&mut self) {
        self.0.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(task) = self.0.task.lock().take() {
            task.abort();
        }
    }
}

/// Why [`AsyncEgressCell::delivered`] ended without an acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Undelivered {
    /// The message became a dead letter, for this reason.
    #[error("a dead letter: {0}")]
    Dead(DeadReason),
    /// The cell never took this sequence (a cell without a journal: a
    /// journaled cell waits for it, since the store may hold it, appended
    /// by an application's transaction and not yet adopted).
    #[error("sequence {0} was never enqueued")]
    Unknown(Sequence),
    /// The cell was disposed while waiting.
    #[error("the cell was disposed")]
    Disposed,
}

impl<T: 'static> Clone for AsyncEgressCell<T> {
    fn clone(&self) -> Self {
        AsyncEgressCell { cell: self.cell.clone(), timer: self.timer.clone() }
    }
}

impl<T: 'static> Deref for AsyncEgressCell<T> {
    type Target = EgressCellOf<T, Threaded>;
    fn deref(&self) -> &EgressCellOf<T, Threaded> {
        &self.cell
    }
}

impl<T: 'static> std::fmt::Debug for AsyncEgressCell<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AsyncEgressCell").field(&self.cell).finish()
    }
}

impl<T: Clone + Send + Sync + 'static> AsyncEgressCell<T> {
    /// A cell with `policy` on `cx`, its timer spawned on the current tokio
    /// runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    #[track_caller]
    pub fn new(cx: &AsyncContext, policy: Policy) -> Self {
        Self::with_options(cx, policy, CellOptions::new())
    }

    /// A cell with `policy` and `options` (a custom clock is read for `now`;
    /// the timer still sleeps on `tokio::time` for the difference).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    #[track_caller]
    pub fn with_options(cx: &AsyncContext, policy: Policy, options: CellOptions) -> Self {
        let core = EgressCore::with_generation(policy, options.generation_of());
        Self::build(cx, core, options, Location::caller())
    }

    /// A cell over `core` as it is, such as one rebuilt from a store by
    /// [`EgressCore::restore`] (see
    /// [`EgressCellOf::from_core`](crate::EgressCellOf::from_core)).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    #[track_caller]
    pub fn from_core(cx: &AsyncContext, core: EgressCore<T>, options: CellOptions) -> Self {
        Self::build(cx, core, options, Location::caller())
    }

    fn build(cx: &AsyncContext, core: EgressCore<T>, mut options: CellOptions, at: &'static Location<'static>) -> Self {
        let clock = options.take_clock(|| Arc::new(TokioClock::new()));
        let handle: &Handle<Threaded> = cx;
        let cell = EgressCellOf::build(handle, core, options, clock, at);
        let timer = TimerTask::start(handle, cell.scope(), cell.parked_len().clone(), cell.inner().clone());
        AsyncEgressCell { cell, timer }
    }

    /// Queues `payload` once the cell holds fewer than its
    /// [capacity](crate::CellOptions::capacity) of unacknowledged records,
    /// waiting for acknowledgements to make room (at once without a
    /// capacity). Cancel-safe: dropped while waiting, nothing was queued.
    ///
    /// # Errors
    /// [`Refused::TooLarge`](crate::Refused::TooLarge) with the payload,
    /// at once, for a payload the cell's transport would not carry (no
    /// room would ever make it fit), and
    /// [`Refused::Unencodable`](crate::Refused::Unencodable) for one its
    /// store's codec cannot write; never `Full`. (Once the cell's graph is
    /// gone, nothing will make room: the payload is queued anyway, checked
    /// as these say.)
    pub async fn enqueue_when_room(&self, payload: T) -> Result<Sequence, crate::Refused<T>> {
        let mut payload = payload;
        loop {
            // Watching before trying: an acknowledgement between the try
            // and the wait is a change the watch still yields.
            // Owned by the cell: its disposal ends the stream.
            let Ok(mut acked) = self.cell.in_scope(|graph| graph.watch(self.cell.acked_through())) else {
                return self.cell.checked(payload).map(|p| self.cell.enqueue(p));
            };
            let _ = acked.next().await; // the value now
            match self.cell.try_enqueue(payload) {
                Ok(sequence) => return Ok(sequence),
                Err(crate::Refused::Full { payload: back, .. }) => payload = back,
                Err(refused) => return Err(refused),
            }
            if acked.next().await.is_none() {
                // The graph is gone: nothing will make room. Queue it
                // anyway (checked) rather than wait forever.
                return self.cell.checked(payload).map(|p| self.cell.enqueue(p));
            }
        }
    }

    /// Waits until the cell holds fewer than its
    /// [capacity](crate::CellOptions::capacity) of unacknowledged records
    /// (at once without a capacity, or once the cell is disposed). For the
    /// transactional path: wait here before opening the transaction whose
    /// outbox append (with the same capacity) would otherwise be refused
    /// as full. Records appended through an outbox count once the relay
    /// has adopted them, so the append's own check stays the bound.
    /// Cancel-safe.
    pub async fn room(&self) {
        let Some(capacity) = self.cell.capacity() else { return };
        // Owned by the cell: its disposal ends the stream.
        let Ok(mut acked) = self.cell.in_scope(|graph| graph.watch(self.cell.acked_through())) else { return };
        loop {
            // Watching before reading: an acknowledgement between the read
            // and the wait is a change the watch still yields.
            if acked.next().await.is_none() || self.cell.with_core(super::inner::unacknowledged) < capacity {
                return;
            }
        }
    }

    /// Waits until the message `sequence` is acknowledged (`Ok`), or
    /// becomes a dead letter (`Err(Undelivered::Dead)`: a tombstone goes in
    /// its place, or it is held, as the policy says). A dead letter whose
    /// tombstone was acknowledged (the receiver skipped it) stays dead, so
    /// a wait that begins after the skip still reports it (for the newest
    /// [`SKIPPED_MEMORY`](egress_core::SKIPPED_MEMORY) of them; see
    /// [`MessageStatus::Dead`]).
    ///
    /// # Errors
    /// [`Undelivered`]: a dead letter, a sequence the cell never took, or a
    /// cell disposed while waiting.
    pub async fn delivered(&self, sequence: Sequence) -> Result<(), Undelivered> {
        // Both owned by the cell: its disposal ends the stream.
        let Ok((status, mut statuses)) = self.cell.in_scope(|graph| {
            let status = self.cell.status(sequence);
            let statuses = graph.watch(&status);
            (status, statuses)
        }) else {
            return Err(Undelivered::Disposed);
        };
        let outcome = loop {
            match statuses.next().await {
                Some(Some(MessageStatus::Acknowledged)) => break Ok(()),
                Some(Some(MessageStatus::Dead(reason))) => break Err(Undelivered::Dead(reason)),
                Some(None) => break Err(Undelivered::Unknown(sequence)),
                Some(Some(_)) => {}
                None => break Err(Undelivered::Disposed),
            }
        };
        // The reader is the cell's, perhaps held by others too: dropped,
        // not disposed (the cell disposes it once no one uses it).
        drop((statuses, status));
        outcome
    }

    /// Attaches an async transport under the current generation: one async
    /// effect, which runs now and again whenever a transition by anyone but
    /// itself makes a claim possible. Each run claims while the core allows
    /// and awaits each send; see [`Attachment`] for failures and fencing.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    #[track_caller]
    pub fn attach<Tr: AsyncTransport<T>>(&self, transport: Tr) -> Attachment<T, Threaded> {
        let at = Location::caller();
        let inner = self.cell.inner().clone();
        let generation = self.cell.with_core(EgressCore::generation);
        self.timer.0.ensure(&inner);
        let transport = Arc::new(tokio::sync::Mutex::new(transport));
        let run = move |ecx: crate::EffectCx| {
            let (inner, transport) = (inner.clone(), transport.clone());
            async move {
                ecx.track(inner.wake);
                // Runs are serialized, so the lock is never contended.
                let mut transport = transport.lock().await;
                let mut pass = Pass { inner: &inner, queued: false, panic: None };
                loop {
                    // Set first: a claim whose copy panics has queued them.
                    pass.queued = true;
                    let Some(envelope) = inner.claim_marked(generation) else { break };
                    let sequence = envelope.sequence;
                    let send = CatchUnwind(std::pin::pin!(Some(transport.send(envelope))));
                    let sent = RunQueuedBeforeWaiting { pass: &mut pass, send }.await;
                    let goes_on = inner.send_in_pass(generation, sequence, || match sent {
                        Ok(result) => result,
                        Err(panic) => resume_unwind(panic),
                    });
                    if !goes_on {
                        break;
                    }
                }
                pass.run_queued();
                // A failed flush leaves the records in flight for the replay.
                let _ = transport.flush().await;
                if let Some(panic) = pass.panic.take() {
                    resume_unwind(panic);
                }
            }
        };
        let handle = self.cell.inner().handle.clone();
        let node = self.cell.attach_with(generation, || handle.spawn_effect_async(run, at));
        let keep: Arc<dyn std::any::Any + Send + Sync> = self.timer.clone();
        Attachment { node, generation, cell: self.cell.clone(), _keep: Some(keep) }
    }
}

impl<T: Clone + Send + Sync + 'static> AsyncEgressCell<T> {
    /// Waits until the current generation is durable: at once without a
    /// journal, or once the store wrote it. A transport calls this between
    /// [`reconnect`](EgressCellOf::reconnect) and its handshake, so that no
    /// handshake uses a generation a crash could take back (a restarted
    /// producer would then reuse it, and be refused as stale). Returns at
    /// once if the cell is disposed.
    pub async fn generation_stored(&self) {
        use tokio_stream::StreamExt;
        if self.cell.is_disposed() || self.cell.generation_durable().get_untracked() {
            return;
        }
        // Owned by the cell, so that its disposal ends the stream (a watch
        // owned by the graph's root outlived the cell, and the wait with it).
        let Ok(mut stored) = self.cell.in_scope(|graph| graph.watch(self.cell.generation_durable())) else { return };
        while let Some(now) = stored.next().await {
            if now {
                return;
            }
        }
    }
}

/// An async attachment's sending pass: its claims queue the effects that
/// read the cell without running them ([`Inner::claim_marked`]), and the
/// pass runs them before it waits on a send and when it ends. Its sends
/// that complete at once (a transport that buffers) thus run the effects
/// once, as a synchronous attachment's pass does, and nothing it queued
/// waits while it is suspended (where a cancellation may drop it). If the
/// pass unwinds, its drop runs them.
///
/// An effect that panics there does not end the pass: every queued effect
/// runs, the sends go on, and the first panic goes on when the pass ends,
/// as a panic of the attachment's run (which runs again at the next wake).
struct Pass<'a, T: 'static> {
    inner: &'a Inner<T, Threaded>,
    /// Whether effects may be queued by this pass and not run yet.
    queued: bool,
    /// The first panic of an effect the pass ran.
    panic: Option<crate::run::Panic>,
}

impl<T: 'static> Pass<'_, T> {
    /// Runs the effects the pass queued, keeping the first panic.
    fn run_queued(&mut self) {
        if std::mem::take(&mut self.queued)
            && let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.inner.flush_effects()))
        {
            self.panic.get_or_insert(panic);
        }
    }
}

impl<T: 'static> Drop for Pass<'_, T> {
    fn drop(&mut self) {
        // Only when unwinding: a pass that returned, or is suspended, has
        // nothing queued.
        self.run_queued();
        // A pass cancelled while it waited (its attachment dropped or
        // fenced) never ends: its effect's panic has no run to go on from.
        if let Some(panic) = self.panic.take() {
            tracing::error!(
                panic = egress_core::panic_message(&*panic).unwrap_or("(not a message)"),
                "egress cell: an effect panicked during an async attachment's pass, which was cancelled"
            );
        }
    }
}

/// A send of a [`Pass`]: the pass's queued effects run before the send
/// first waits.
struct RunQueuedBeforeWaiting<'p, 'a, T: 'static, Fut> {
    pass: &'p mut Pass<'a, T>,
    send: Fut,
}

impl<T: 'static, Fut: Future + Unpin> Future for RunQueuedBeforeWaiting<'_, '_, T, Fut> {
    type Output = Fut::Output;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Fut::Output> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.send).poll(cx);
        if polled.is_pending() {
            this.pass.run_queued();
        }
        polled
    }
}

/// Sleeps until the earliest parked record is due, then makes it pending;
/// wakes early when the parked set changes.
async fn run_timer(inner: impl Timed, bell: Arc<Notify>) {
    loop {
        let changed = bell.notified();
        tokio::pin!(changed);
        // Registered before reading the due time, so a change in between is
        // not missed (a stored permit also makes it ready at once).
        changed.as_mut().enable();
        match inner.poll_timeout() {
            None => changed.await,
            Some(due) => {
                let wait = Duration::from_millis(due.0.saturating_sub(inner.now().0));
                tokio::select! {
                    () = tokio::time::sleep(wait) => {
                        let now = inner.now();
                        if now >= due {
                            // What the records made due set off (an
                            // attachment's send, the application's effects)
                            // may panic: the panic has no caller here to go
                            // to, and the timer must go on for the other
                            // records (the core failed the record whose send
                            // panicked before the panic went on).
                            let fired = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                inner.handle_timeout(now);
                            }));
                            if let Err(panic) = fired {
                                tracing::error!(
                                    panic = egress_core::panic_message(&*panic).unwrap_or("(not a message)"),
                                    "egress cell timer: a panic while retrying; the timer goes on"
                                );
                            }
                        }
                    }
                    () = &mut changed => {}
                }
            }
        }
    }
}
