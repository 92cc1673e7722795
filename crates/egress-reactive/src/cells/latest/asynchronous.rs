//! [`AsyncLatestCell`]: the latest cell for tokio, with its own backoff
//! timer.

use std::num::NonZeroUsize;
use std::ops::Deref;
use std::panic::Location;
use std::sync::Arc;

use egress_core::{Latest, Policy, Time};

use super::super::asynchronous::{Timed, Timer, TimerTask};
use super::super::clock::{Clock, TokioClock};
use super::super::options::CellOptions;
use super::{LatestAttachment, LatestCellOf, LatestInner, LatestRun, LatestSink, ThreadSafeLatestCell};
use crate::asynchronous::AsyncContext;
use crate::context::Handle;
use crate::effect::EffectObj;
use crate::flavor::{Holds, Threaded};

impl<K, V> Timed for LatestInner<K, V, Threaded>
where
    K: Ord + Clone + Send + Sync + 'static,
    V: Clone + PartialEq + Send + Sync + 'static,
{
    fn poll_timeout(&self) -> Option<Time> {
        self.with_latest(Latest::poll_timeout)
    }
    fn now(&self) -> Time {
        self.clock.now()
    }
    fn handle_timeout(&self, now: Time) {
        let _ = LatestInner::handle_timeout(self, now);
    }
}

/// A latest cell on an [`AsyncContext`]: everything a
/// [`ThreadSafeLatestCell`] has (it dereferences to one), plus **its own
/// timer**, as [`AsyncEgressCell`](crate::AsyncEgressCell) has: a task
/// sleeps (on `tokio::time`, so tests can pause it) until the earliest key
/// waiting after a failure is due and frees it then, which wakes the sink
/// effects. There is nothing to poll.
///
/// Its attachments take a [`LatestSink`], whose `write` must not wait: a
/// sink that takes time (a request, a database write) starts the write on
/// its own task, returns [`Written::Taken`](super::Written::Taken), and
/// reports the outcome through the attachment
/// ([`applied`](LatestAttachment::applied), [`fail`](LatestAttachment::fail)).
///
/// Time is tokio's clock by default, in milliseconds. The cell must be
/// made inside a tokio runtime. The timer runs while a clone of the cell
/// or one of its attachments lives.
pub struct AsyncLatestCell<K: 'static, V: 'static> {
    cell: ThreadSafeLatestCell<K, V>,
    timer: Arc<Timer>,
}

impl<K: 'static, V: 'static> Clone for AsyncLatestCell<K, V> {
    fn clone(&self) -> Self {
        AsyncLatestCell { cell: self.cell.clone(), timer: self.timer.clone() }
    }
}

impl<K: 'static, V: 'static> Deref for AsyncLatestCell<K, V> {
    type Target = ThreadSafeLatestCell<K, V>;
    fn deref(&self) -> &ThreadSafeLatestCell<K, V> {
        &self.cell
    }
}

impl<K: Ord + Clone + 'static, V: PartialEq + 'static> std::fmt::Debug for AsyncLatestCell<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AsyncLatestCell").field(&self.cell).finish()
    }
}

impl<K, V> AsyncLatestCell<K, V>
where
    K: Ord + Clone + Send + Sync + 'static,
    V: Clone + PartialEq + Send + Sync + 'static,
{
    /// A latest cell with `policy` and at most `max_keys` keys on `cx`, its
    /// timer spawned on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    #[track_caller]
    pub fn new(cx: &AsyncContext, policy: Policy, max_keys: NonZeroUsize) -> Self {
        Self::with_options(cx, policy, max_keys, CellOptions::new())
    }

    /// A latest cell with `policy`, `max_keys` and `options` (a custom
    /// clock is read for `now`; the timer still sleeps on `tokio::time`
    /// for the difference).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    #[track_caller]
    pub fn with_options(cx: &AsyncContext, policy: Policy, max_keys: NonZeroUsize, mut options: CellOptions) -> Self {
        let clock = options.take_clock(|| Arc::new(TokioClock::new()));
        let latest = Latest::with_generation(policy, max_keys, options.generation);
        Self::build(cx, latest, &options, clock, Location::caller())
    }

    /// A latest cell over `latest` as it is (see
    /// [`LatestCellOf::from_latest`]), its timer spawned on the current
    /// tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    #[track_caller]
    pub fn from_latest(cx: &AsyncContext, latest: Latest<K, V>, mut options: CellOptions) -> Self {
        let clock = options.take_clock(|| Arc::new(TokioClock::new()));
        Self::build(cx, latest, &options, clock, Location::caller())
    }

    fn build(
        cx: &AsyncContext,
        latest: Latest<K, V>,
        options: &CellOptions,
        clock: Arc<dyn Clock>,
        at: &'static Location<'static>,
    ) -> Self {
        let handle: &Handle<Threaded> = cx;
        let cell = LatestCellOf::build(handle, latest, options, clock, at);
        let shared = &cell.shared;
        let timer = TimerTask::start(handle, &shared.scope, cell.waiting_len().clone(), shared.inner.clone());
        AsyncLatestCell { cell, timer }
    }

    /// Attaches `sink` under the current generation (see
    /// [`LatestCellOf::attach`]); the attachment keeps the timer running.
    #[track_caller]
    pub fn attach<S: LatestSink<K, V>>(&self, sink: S) -> LatestAttachment<K, V, Threaded>
    where
        Threaded: Holds<EffectObj<LatestRun<K, V, S, Threaded>, Threaded>>,
    {
        self.timer.0.ensure(&self.cell.shared.inner);
        let mut attachment = self.cell.attach(sink);
        let keep: Arc<dyn std::any::Any + Send + Sync> = self.timer.clone();
        attachment._keep = Some(keep);
        attachment
    }
}
