//! [`AsyncEgressCell`]: the egress cell for tokio, with its own retry timer
//! and async transports.

use std::ops::Deref;
use std::panic::Location;
use std::sync::Arc;
use std::time::Duration;

use egress_core::Policy;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use super::cell::{Attachment, CellOptions, EgressCellOf};
use super::clock::TokioClock;
use super::transport::AsyncTransport;
use crate::asynchronous::AsyncContext;
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
/// inside a tokio runtime; dropping its last clone stops the timer.
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
    _timer: Arc<Timer>,
}

/// Stops the timer task when the last clone of the cell drops.
struct Timer {
    task: AbortHandle,
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<T: 'static> Clone for AsyncEgressCell<T> {
    fn clone(&self) -> Self {
        AsyncEgressCell { cell: self.cell.clone(), _timer: self._timer.clone() }
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
    pub fn with_options(cx: &AsyncContext, policy: Policy, mut options: CellOptions) -> Self {
        let at = Location::caller();
        let clock = options.take_clock(|| Arc::new(TokioClock::new()));
        let handle: &Handle<Threaded> = cx;
        let cell = EgressCellOf::build(handle, policy, options, clock, at);
        // The timer re-arms whenever the parked set changes.
        let bell = Arc::new(Notify::new());
        let parked = cell.parked_len().clone();
        let ring = bell.clone();
        let _ = cell.scope().run(|| {
            handle.effect(move || {
                let _ = parked.try_get();
                ring.notify_one();
            })
        });
        let task = tokio::spawn(run_timer(cell.clone(), bell));
        AsyncEgressCell { cell, _timer: Arc::new(Timer { task: task.abort_handle() }) }
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
        let generation = self.cell.generation().get_untracked();
        let transport = Arc::new(tokio::sync::Mutex::new(transport));
        let run = move |ecx: crate::EffectCx| {
            let (inner, transport) = (inner.clone(), transport.clone());
            async move {
                ecx.track(inner.wake);
                // Runs are serialized, so the lock is never contended.
                let mut transport = transport.lock().await;
                while let Some(envelope) = inner.claim_for(generation) {
                    let sequence = envelope.sequence;
                    if let Err(error) = transport.send(envelope).await
                        && !inner.fail_in_pass(generation, sequence, error.kind())
                    {
                        break;
                    }
                }
                // A failed flush leaves the records in flight for the replay.
                let _ = transport.flush().await;
            }
        };
        let handle = self.cell.inner().handle.clone();
        let effect = self.cell.scope().run(|| handle.spawn_effect_async(run, at));
        self.cell.register(generation, effect.key);
        Attachment { node: (*effect).clone(), generation, cell: self.cell.clone() }
    }
}

/// Sleeps until the earliest parked record is due, then makes it pending;
/// wakes early when the parked set changes.
async fn run_timer<T: Clone + Send + Sync + 'static>(cell: EgressCellOf<T, Threaded>, bell: Arc<Notify>) {
    loop {
        let changed = bell.notified();
        tokio::pin!(changed);
        // Registered before reading the due time, so a change in between is
        // not missed (a stored permit also makes it ready at once).
        changed.as_mut().enable();
        match cell.poll_timeout() {
            None => changed.await,
            Some(due) => {
                let wait = Duration::from_millis(due.0.saturating_sub(cell.now().0));
                tokio::select! {
                    () = tokio::time::sleep(wait) => {
                        let now = cell.now();
                        if now >= due {
                            let _ = cell.handle_timeout(now);
                        }
                    }
                    () = &mut changed => {}
                }
            }
        }
    }
}
