//! What the relays of a journal without an outbox share (durable lanes', a
//! durable latest projection's): the task that writes each epoch the cell
//! offers as one transaction and reports it, backs off after a failure,
//! stops at a fence, and writes what is pending at a shutdown; and the
//! handle that owns that task.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use egress_core::Epoch;
use egress_reactive::{Effect, Threaded};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::{Counters, RelayConfig, RelayStats};
use crate::{SqliteStore, StoreError};

/// A durable cell's journal, linked to the store that writes it.
pub(super) trait Link: Send + Sync + 'static {
    /// One epoch as the cell offers it (what to write, with the values).
    type Offer: Send + 'static;

    /// What the journal is, for the logs ("lanes", "latest").
    const WHAT: &'static str;

    /// The cell's next epoch, if it has one (it may panic: a value's
    /// `Clone`; the cell failed the epoch then).
    fn poll_ready(&self) -> Option<Self::Offer>;

    /// The epoch of `offer`.
    fn epoch(offer: &Self::Offer) -> Epoch;

    /// How many records `offer` appends (for the stats).
    fn appended(offer: &Self::Offer) -> u64;

    /// Tells the cell the store wrote `epoch`.
    fn persisted(&self, epoch: Epoch);

    /// Tells the cell the store could not write `epoch`.
    fn persist_failed(&self, epoch: Epoch, reason: String);

    /// Encodes and writes `offer` as one transaction; nothing is written on
    /// an error, and [`StoreError::Fenced`] stops the relay.
    fn write(&self, offer: Self::Offer) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Whether the journal is still this store's ([`StoreError::Fenced`]
    /// once another store took it over).
    fn owns(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Called once when the relay stops after writing what was pending.
    fn close(&self) -> impl Future<Output = ()> + Send;
}

/// A running relay: its task, the effect that rings it, its stop signal
/// and its counters. Dropping it aborts the task (each commit is reported
/// by a task of its own, so none is left unreported).
pub(super) struct Running {
    task: Option<JoinHandle<()>>,
    effect: Effect<Threaded>,
    stop: watch::Sender<bool>,
    pub(super) counters: Arc<Counters>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.effect.dispose();
    }
}

impl Running {
    /// Starts the relay of `link` on the current tokio runtime, rung by
    /// `effect` (which rings `bell` at every transition of the journal).
    pub(super) fn spawn<L: Link>(
        link: L,
        effect: Effect<Threaded>,
        bell: Arc<Notify>,
        config: RelayConfig,
        span: tracing::Span,
    ) -> Self {
        let (stop, stop_rx) = watch::channel(false);
        let counters = Arc::new(Counters::default());
        let run = Run { link: Arc::new(link), counters: counters.clone() };
        let task = tokio::spawn(tracing::Instrument::instrument(run.run(config, bell, stop_rx), span));
        Running { task: Some(task), effect, stop, counters }
    }

    pub(super) fn stats(&self) -> RelayStats {
        self.counters.snapshot()
    }

    /// Writes what the journal holds, closes it, and stops; returns the
    /// stats.
    pub(super) async fn shutdown(mut self) -> RelayStats {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.counters.snapshot()
    }
}

/// What the relay's task holds.
struct Run<L> {
    link: Arc<L>,
    counters: Arc<Counters>,
}

/// How often a relay with nothing to write asks whether another store
/// took its journal (a write would find out at once).
const OWNER_CHECK: Duration = Duration::from_millis(100);

impl<L: Link> Run<L> {
    async fn run(self, config: RelayConfig, bell: Arc<Notify>, mut stop: watch::Receiver<bool>) {
        let mut failures: u32 = 0;
        let mut check_at = tokio::time::Instant::now();
        // The loop ends only at a fence (a stop returns from it); its bell
        // wait is dropped by then, so the fence's own wait hears the bell.
        let fence = loop {
            let rung = bell.notified();
            tokio::pin!(rung);
            rung.as_mut().enable();
            if *stop.borrow() {
                while let Some(Ok(())) = self.write_once().await {}
                self.link.close().await;
                return;
            }
            if tokio::time::Instant::now() >= check_at {
                check_at = tokio::time::Instant::now() + OWNER_CHECK;
                if let Err(e @ StoreError::Fenced { .. }) = self.link.owns().await {
                    break e;
                }
            }
            match self.write_once().await {
                Some(Ok(())) => {
                    failures = 0;
                    continue;
                }
                Some(Err(e @ StoreError::Fenced { .. })) => break e,
                Some(Err(_)) => {
                    let wait = super::task::backoff(&config, failures);
                    failures = failures.saturating_add(1);
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        _ = stop.changed() => {}
                    }
                    continue;
                }
                None => {}
            }
            tokio::select! {
                () = &mut rung => {}
                () = tokio::time::sleep(config.poll_interval.max(OWNER_CHECK)) => {}
                _ = stop.changed() => {}
            }
        };
        self.fenced(&fence, &bell, &mut stop).await;
    }

    /// Another store took the journal: nothing more is written here. The
    /// next epoch the cell offers (at once, or at its next transition) is
    /// failed with why, so the cell shows it (and keeps showing it: no
    /// later epoch is persisted) rather than hold what comes next as
    /// "saving" with no reason; then the task ends.
    async fn fenced(&self, why: &StoreError, bell: &Notify, stop: &mut watch::Receiver<bool>) {
        tracing::error!(error = %why, what = L::WHAT, "egress relay: another store took the journal over; stopping");
        self.counters.fenced.store(true, Ordering::Relaxed);
        let fail_offered = || {
            let offered = self.link.poll_ready();
            if let Some(offer) = &offered {
                self.link.persist_failed(L::epoch(offer), format!("{why}: nothing more is written"));
            }
            offered.is_some()
        };
        super::task::refuse(fail_offered, bell, stop).await;
    }

    /// Commits one epoch if the journal has one: whether it did, and the
    /// error if the commit failed.
    async fn write_once(&self) -> Option<Result<(), StoreError>> {
        let offer = match super::task::poll_caught(|| self.link.poll_ready(), &self.counters)? {
            Ok(offer) => offer,
            Err(e) => return Some(Err(e)),
        };
        let (epoch, appended) = (L::epoch(&offer), L::appended(&offer));
        let link = self.link.clone();
        // Counted before the cell is told, so whoever sees its state sees
        // the count.
        let commit = |tally: super::Tally| async move {
            let result = link.write(offer).await;
            match &result {
                Ok(()) => {
                    tally.committed(appended);
                    link.persisted(epoch);
                }
                Err(e) => {
                    tally.failed(e);
                    link.persist_failed(epoch, e.to_string());
                }
            }
            result
        };
        let result = super::commit_in_task(&self.counters, commit, |why| self.link.persist_failed(epoch, why)).await;
        Some(result)
    }
}

/// A SQLite store and the name of what it writes, each call on a blocking
/// thread: what the SQLite journals of lanes and of a latest projection
/// hold.
pub(super) struct Blocking {
    store: Arc<parking_lot::Mutex<SqliteStore>>,
    name: Arc<str>,
}

impl Blocking {
    pub(super) fn new(store: SqliteStore, name: &str) -> Self {
        Blocking { store: Arc::new(parking_lot::Mutex::new(store)), name: name.into() }
    }

    /// The name.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// Runs `f` on the store, with the name, on a blocking thread.
    pub(super) async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut SqliteStore, &str) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let (store, name) = (self.store.clone(), self.name.clone());
        tokio::task::spawn_blocking(move || f(&mut store.lock(), &name))
            .await
            .map_err(|e| StoreError::Task(e.to_string()))?
    }
}
