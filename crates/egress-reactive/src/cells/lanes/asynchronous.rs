//! [`AsyncLanesCell`]: the lanes cell for tokio, with its own retry timer.

use std::ops::Deref;
use std::panic::Location;
use std::sync::Arc;

use egress_core::{LaneKey, Lanes, LanesPolicy, Time};

use super::super::asynchronous::{Timed, Timer, TimerTask};
use super::super::clock::TokioClock;
use super::super::options::CellOptions;
use super::{LanesAttachment, LanesCellOf, LanesInner, LanesRun, LanesTransport, ThreadSafeLanesCell};
use crate::asynchronous::AsyncContext;
use crate::context::Handle;
use crate::effect::EffectObj;
use crate::flavor::{Holds, Threaded};

impl<K: LaneKey + Send + Sync + 'static, T: Clone + Send + Sync + 'static> Timed for LanesInner<K, T, Threaded> {
    fn poll_timeout(&self) -> Option<Time> {
        self.with_lanes(egress_core::Lanes::poll_timeout)
    }
    fn now(&self) -> Time {
        self.clock.now()
    }
    fn handle_timeout(&self, now: Time) {
        let _ = LanesInner::handle_timeout(self, now);
    }
}

/// A lanes cell on an [`AsyncContext`]: everything a
/// [`ThreadSafeLanesCell`] has (it dereferences to one), plus **its own
/// timer**, as [`AsyncEgressCell`](crate::AsyncEgressCell) has: a task
/// sleeps (on `tokio::time`, so tests can pause it) until the earliest
/// parked record of any lane is due and calls `handle_timeout` then; a
/// failure that parks an earlier record re-arms it. There is nothing to
/// poll.
///
/// Its attachments take a [`LanesTransport`], whose `send` must not wait:
/// a transport for requests that take time (HTTP) starts each request on
/// its own task and reports its outcome through the attachment
/// ([`complete`](LanesAttachment::complete), [`fail`](LanesAttachment::fail)),
/// so that the lanes' windows, not the transport, bound what is in flight.
///
/// Time is tokio's clock by default, in milliseconds. The cell must be
/// made inside a tokio runtime. The timer runs while a clone of the cell
/// or one of its attachments lives.
pub struct AsyncLanesCell<K: 'static, T: 'static> {
    cell: ThreadSafeLanesCell<K, T>,
    timer: Arc<Timer>,
}

impl<K: 'static, T: 'static> Clone for AsyncLanesCell<K, T> {
    fn clone(&self) -> Self {
        AsyncLanesCell { cell: self.cell.clone(), timer: self.timer.clone() }
    }
}

impl<K: 'static, T: 'static> Deref for AsyncLanesCell<K, T> {
    type Target = ThreadSafeLanesCell<K, T>;
    fn deref(&self) -> &ThreadSafeLanesCell<K, T> {
        &self.cell
    }
}

impl<K: LaneKey + 'static, T: 'static> std::fmt::Debug for AsyncLanesCell<K, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AsyncLanesCell").field(&self.cell).finish()
    }
}

impl<K: LaneKey + Send + Sync + 'static, T: Clone + Send + Sync + 'static> AsyncLanesCell<K, T> {
    /// A lanes cell with `policy` on `cx`, its timer spawned on the current
    /// tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    #[track_caller]
    pub fn new(cx: &AsyncContext, policy: LanesPolicy) -> Self {
        Self::with_options(cx, policy, CellOptions::new())
    }

    /// A lanes cell with `policy` and `options` (a custom clock is read for
    /// `now`; the timer still sleeps on `tokio::time` for the difference).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    #[track_caller]
    pub fn with_options(cx: &AsyncContext, policy: LanesPolicy, mut options: CellOptions) -> Self {
        let clock = options.take_clock(|| Arc::new(TokioClock::new()));
        let lanes = Lanes::with_generation(policy, options.generation);
        Self::build(cx, lanes, options, clock, Location::caller())
    }

    /// A lanes cell over `lanes` as they are (see
    /// [`LanesCellOf::from_lanes`]), its timer spawned on the current tokio
    /// runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    #[track_caller]
    pub fn from_lanes(cx: &AsyncContext, lanes: Lanes<K, T>, mut options: CellOptions) -> Self {
        let clock = options.take_clock(|| Arc::new(TokioClock::new()));
        Self::build(cx, lanes, options, clock, Location::caller())
    }

    fn build(
        cx: &AsyncContext,
        lanes: Lanes<K, T>,
        options: CellOptions,
        clock: Arc<dyn super::super::clock::Clock>,
        at: &'static Location<'static>,
    ) -> Self {
        let handle: &Handle<Threaded> = cx;
        let cell = LanesCellOf::build(handle, lanes, &options, clock, at);
        let shared = &cell.shared;
        let timer = TimerTask::start(handle, &shared.scope, cell.parked_len().clone(), shared.inner.clone());
        AsyncLanesCell { cell, timer }
    }

    /// Attaches `transport` under the current generation (see
    /// [`LanesCellOf::attach`]); the attachment keeps the timer running.
    #[track_caller]
    pub fn attach<Tr: LanesTransport<K, T>>(&self, transport: Tr) -> LanesAttachment<K, T, Threaded>
    where
        Threaded: Holds<EffectObj<LanesRun<K, T, Tr, Threaded>, Threaded>>,
    {
        self.timer.0.ensure(&self.cell.shared.inner);
        let mut attachment = self.cell.attach(transport);
        let keep: Arc<dyn std::any::Any + Send + Sync> = self.timer.clone();
        attachment._keep = Some(keep);
        attachment
    }
}
