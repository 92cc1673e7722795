//! A typed dispatcher: an egress cell's transport that hands each record to
//! the handler registered under its name, in-process.
//!
//! ```text
//!  Handlers::encode("email.send", &msg) ──▶ bytes ──▶ cell.enqueue / outbox append
//!                                                          │ claims (window)
//!  Dispatcher ◀── one task per claimed record: decode, call the handler ◀┘
//!      │ completions, in any order ──▶ completion tracker ──▶ ack(through), cumulative
//!      └ HandlerError ──▶ fail(sequence, Transient | RetryAfter | Permanent)
//! ```
//!
//! - **Handlers by name, typed.** [`Handlers::handle`] registers an async
//!   function of a serde type under a name; [`Handlers::encode`] refuses a
//!   name nothing handles ([`DispatchError::UnknownHandler`]) at append,
//!   so it is not discovered at dispatch. A record whose name or message
//!   does not decode is a permanent failure (a dead letter, never retried).
//! - **Failures onto the core's kinds.** [`HandlerError::Transient`] is
//!   retried after the policy's backoff, [`HandlerError::RetryAfter`] after
//!   at least its delay (the policy's jitter spreads it upward, so that
//!   workers do not retry in step), [`HandlerError::Permanent`] never. A
//!   handler that panics failed transiently. The policy's retry budget
//!   bounds the attempts.
//! - **Concurrency up to the window.** Each claimed record runs in a task of
//!   its own, so at most the policy's in-flight limit run at once; a
//!   [`Completions`] tracker turns their completions, in any order, into
//!   cumulative acknowledgements (a completion above a gap waits for it).
//!   Handlers of one stream therefore run in order only with a window of
//!   1; a wider window trades that order for concurrency (the
//!   acknowledgements stay in order). Many streams, one dispatcher each,
//!   give concurrency with order per stream.
//! - **The idempotency key.** A handler is called with an [`Info`]: the
//!   stream, the sequence, the attempt and the generation. `(stream,
//!   sequence)` ([`Info::key`]) is the same for every attempt, on every
//!   worker, across restarts: a handler that may run twice (its completion
//!   was not yet stored when its worker died) uses it to do its effect once.
//!
//! - **Re-runs after a takeover, bounded.** A worker that dies loses the
//!   acknowledgements its store had not yet written, and the stream's next
//!   owner runs those records again. [`Dispatcher::spawn_bounded`] holds
//!   the dispatcher to at most `limit` records past the watermark the store
//!   holds ([`StoredAck`], from the relay's `stored_ack`): a record starts
//!   only when its sequence is below `stored + 1 + limit`. A takeover then
//!   re-runs at most `limit` records, each under the same key.
//!   [`StoredAck::with_lease`] also holds every run to the stream's lease
//!   (the relay's `lease`): a record starts only when its expected run
//!   ends before the lease could run out, and a run still going when the
//!   lease runs out is cut there, so a worker whose lease renewals stop
//!   getting through stops working on the stream before another worker
//!   can take it.
//! - **Metrics through `tracing`**: events of target `egress::metrics`
//!   (level debug) with `monotonic_counter.*` and `histogram.*` fields,
//!   the names a metrics layer (tracing-opentelemetry's) turns into
//!   instruments: `egress_dispatch_completed`, `_retried`, `_permanent`,
//!   `_skipped`, `_cut` (runs cut when their lease ran out), and
//!   `egress_dispatch_handler_seconds`.
//!
//! Dead letters under [`DeadLetters::Skip`](egress_core::DeadLetters::Skip)
//! reach the dispatcher as tombstones and complete at once, so a cumulative
//! acknowledgement never stalls on them; under `Hold` a held record stops
//! the acknowledgements at its sequence (that is what holding means).

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
pub use egress_core::Completions;
use egress_core::{Delay, Envelope, FailureKind, Generation, Sequence};
use egress_reactive::{AsyncEgressCell, AsyncTransport, Attachment, SendError, Threaded};
use futures_util::FutureExt as _;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What a handler is told of the record it handles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Info {
    /// The stream the record belongs to.
    pub stream: Arc<str>,
    /// Its sequence in the stream.
    pub sequence: Sequence,
    /// Which attempt this is (1 the first time).
    pub attempt: u32,
    /// The cell's generation when it was claimed.
    pub generation: Generation,
}

impl Info {
    /// The record's idempotency key: the same for every attempt, on every
    /// worker, across restarts.
    pub fn key(&self) -> (Arc<str>, u64) {
        (self.stream.clone(), self.sequence.get())
    }
}

/// Why a handler did not complete.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HandlerError {
    /// Worth retrying after the policy's backoff.
    #[error("transient: {0}")]
    Transient(String),
    /// Worth retrying after at least this long (a rate limit's
    /// `Retry-After`).
    #[error("retry after {0:?}")]
    RetryAfter(Duration),
    /// Never worth retrying: the record becomes a dead letter.
    #[error("permanent: {0}")]
    Permanent(String),
}

impl HandlerError {
    /// The core's failure kind for it.
    pub fn kind(&self) -> FailureKind {
        match self {
            HandlerError::Transient(_) => FailureKind::Transient,
            HandlerError::RetryAfter(d) => {
                FailureKind::RetryAfter(Delay(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
            }
            HandlerError::Permanent(_) => FailureKind::Permanent,
        }
    }
}

/// Why a message could not be encoded for dispatch.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// No handler is registered under this name.
    #[error("no handler is registered for {0:?}")]
    UnknownHandler(String),
    /// serde could not encode the message.
    #[error("encode: {0}")]
    Encode(#[from] serde_json::Error),
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;
type Handler = Arc<dyn Fn(&[u8], Info) -> BoxFuture + Send + Sync>;

/// Handlers by name.
#[derive(Clone, Default)]
pub struct Handlers {
    by_name: HashMap<String, Handler>,
}

impl std::fmt::Debug for Handlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.by_name.keys().collect();
        names.sort();
        f.debug_struct("Handlers").field("names", &names).finish()
    }
}

/// A record on the wire: the handler's name and the message.
#[derive(Serialize)]
struct Outgoing<'a, M: ?Sized> {
    handler: &'a str,
    message: &'a M,
}

#[derive(Deserialize)]
struct Incoming<'a> {
    #[serde(borrow)]
    handler: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    message: &'a serde_json::value::RawValue,
}

impl Handlers {
    /// No handlers.
    pub fn new() -> Self {
        Handlers::default()
    }

    /// Registers `handler` for messages of type `M` under `name` (a later
    /// registration under the same name replaces it).
    #[must_use]
    pub fn handle<M, F, Fut>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        M: DeserializeOwned + Send + 'static,
        F: Fn(M, Info) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let erased: Handler = Arc::new(move |message: &[u8], info: Info| -> BoxFuture {
            match serde_json::from_slice::<M>(message) {
                Ok(m) => Box::pin(handler(m, info)),
                Err(e) => Box::pin(std::future::ready(Err(HandlerError::Permanent(format!("undecodable: {e}"))))),
            }
        });
        self.by_name.insert(name.into(), erased);
        self
    }

    /// Whether a handler is registered under `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The record for `message` to the handler `name`: what to enqueue or
    /// append.
    ///
    /// # Errors
    /// [`DispatchError::UnknownHandler`] when nothing handles `name` (the
    /// record would only ever fail), or serde's.
    pub fn encode<M: Serialize + ?Sized>(&self, name: &str, message: &M) -> Result<Bytes, DispatchError> {
        if !self.contains(name) {
            return Err(DispatchError::UnknownHandler(name.to_owned()));
        }
        Ok(Bytes::from(serde_json::to_vec(&Outgoing { handler: name, message })?))
    }

    /// Runs the handler a record names; a record that does not decode, or
    /// names no handler, fails permanently. A handler that panics failed
    /// transiently.
    async fn dispatch(&self, record: &[u8], info: Info) -> Result<(), HandlerError> {
        let incoming: Incoming<'_> = serde_json::from_slice(record)
            .map_err(|e| HandlerError::Permanent(format!("not a dispatch record: {e}")))?;
        let Some(handler) = self.by_name.get(incoming.handler.as_ref()) else {
            return Err(HandlerError::Permanent(format!("no handler is registered for {:?}", incoming.handler)));
        };
        match AssertUnwindSafe(handler(incoming.message.get().as_bytes(), info)).catch_unwind().await {
            Ok(result) => result,
            Err(_) => Err(HandlerError::Transient("the handler panicked".into())),
        }
    }
}

/// What a dispatcher has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DispatchStats {
    /// Handler runs that completed.
    pub completed: u64,
    /// Runs that failed and will be retried (transient or retry-after).
    pub retried: u64,
    /// Runs that failed permanently (the record is a dead letter).
    pub permanent: u64,
    /// Tombstones passed over (dead letters under `Skip`).
    pub skipped: u64,
    /// Records held back for the stream's lease (their run would have
    /// ended past its bound, see [`StoredAck::with_lease`]): each counted
    /// once, and logged.
    pub waited: u64,
}

#[derive(Default)]
struct Counters {
    waited: AtomicU64,
    completed: AtomicU64,
    retried: AtomicU64,
    permanent: AtomicU64,
    skipped: AtomicU64,
}

/// One handler run's outcome, from its task to the dispatcher's.
struct Done {
    sequence: Sequence,
    /// A tombstone passed over rather than a handler's run.
    skipped: bool,
    result: Result<(), HandlerError>,
}

/// How far past the stored acknowledgement watermark a dispatcher may run
/// records (see [`Dispatcher::spawn_bounded`]), and, with
/// [`with_lease`](Self::with_lease), the lease its records run under.
#[derive(Clone, Debug)]
pub struct StoredAck {
    watermark: watch::Receiver<Option<Sequence>>,
    limit: u64,
    lease: Option<(watch::Receiver<Option<Instant>>, Duration)>,
}

impl StoredAck {
    /// The store's watermark as `watermark` follows it (the relay's
    /// `stored_ack`), and at most `limit` records (at least 1; a limit
    /// below the policy's window keeps the window from filling) started
    /// past it.
    pub fn new(watermark: watch::Receiver<Option<Sequence>>, limit: u64) -> Self {
        StoredAck { watermark, limit: limit.max(1), lease: None }
    }

    /// Holds every handler run to the lease `until` follows (the relay's
    /// `lease`: `Some(instant)` before which no other worker can take the
    /// stream, `None` once another did). A record starts only when `run`
    /// (the longest a run is expected to take) from now ends by the
    /// lease's bound; a run goes on as long as renewals move the bound,
    /// and one still going when the bound passes with no renewal, or when
    /// the lease is lost, is cut there (its future dropped: a transient
    /// failure, retried once the lease holds again). A worker whose
    /// renewals stop getting through therefore starts nothing more, and
    /// every run it started ends, before another worker can take the
    /// stream and run the same records. With `until`'s sender gone (the
    /// relay stopped), nothing more starts, and runs end by the last
    /// bound. What a handler spawned elsewhere is its own: the cut reaches
    /// what it awaits.
    ///
    /// For the gate to stay open while renewals get through, `run` is at
    /// most the part of the lease a renewal leaves (a PostgreSQL journal
    /// renews a third into the lease: a quarter of the lease is safe).
    #[must_use]
    pub fn with_lease(mut self, until: watch::Receiver<Option<Instant>>, run: Duration) -> Self {
        self.lease = Some((until, run));
        self
    }

    /// Whether `sequence` may start with the store at `stored`.
    fn allows(limit: u64, stored: Option<Sequence>, sequence: Sequence) -> bool {
        let first = stored.map_or(0, |s| s.get().saturating_add(1));
        sequence.get() < first.saturating_add(limit)
    }
}

/// The cell's transport: starts a task per claimed record and returns at
/// once (the record stays in flight until its task reports).
struct Spawner {
    handlers: Arc<Handlers>,
    stream: Arc<str>,
    done: mpsc::UnboundedSender<Done>,
    bound: Option<StoredAck>,
    counters: Arc<Counters>,
}

impl AsyncTransport<Bytes> for Spawner {
    async fn send(&mut self, envelope: Envelope<Bytes>) -> Result<(), SendError> {
        let sequence = envelope.sequence;
        if envelope.dead.is_some() {
            let _ = self.done.send(Done { sequence, skipped: true, result: Ok(()) });
            return Ok(());
        }
        let mut held_to = None;
        if let Some(StoredAck { watermark, limit, lease }) = &mut self.bound {
            let limit = *limit;
            let allowed = watermark.wait_for(|stored| StoredAck::allows(limit, *stored, sequence)).await.is_ok();
            // `wait_for` answers from the last value even once the sender
            // is gone: ask whether it is.
            if !allowed || watermark.has_changed().is_err() {
                // The relay is gone (fenced, or shut down): nothing more
                // of this stream runs here.
                std::future::pending::<()>().await;
            }
            if let Some((until, run)) = lease {
                let run = *run;
                // A renewal moves the bound; until one does, a bound too
                // near (or passed) holds the record back. (A run too long
                // for any lease never fits.)
                let fits = |u: &Option<Instant>| {
                    u.is_some_and(|u| Instant::now().checked_add(run).is_some_and(|end| end <= u))
                };
                if !fits(&until.borrow()) {
                    self.counters.waited.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        stream = %self.stream,
                        sequence = sequence.get(),
                        run_ms = u64::try_from(run.as_millis()).unwrap_or(u64::MAX),
                        "egress dispatch: a record waits for the stream's lease: its run would end past the lease's bound"
                    );
                }
                let held = until.wait_for(fits).await.is_ok();
                if !held || until.has_changed().is_err() {
                    std::future::pending::<()>().await;
                }
                held_to = Some(until.clone());
            }
        }
        let info = Info {
            stream: self.stream.clone(),
            sequence,
            attempt: envelope.attempt.get(),
            generation: envelope.generation,
        };
        let (handlers, done, stream) = (self.handlers.clone(), self.done.clone(), self.stream.clone());
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let run = handlers.dispatch(&envelope.payload, info);
            let result = match held_to {
                None => run.await,
                Some(until) => under_lease(until, run, &stream, sequence).await,
            };
            tracing::event!(
                target: "egress::metrics",
                tracing::Level::DEBUG,
                histogram.egress_dispatch_handler_seconds = started.elapsed().as_secs_f64(),
                "egress dispatch: a handler ran"
            );
            let _ = done.send(Done { sequence, skipped: false, result });
        });
        Ok(())
    }
}

/// Runs `run` while the lease `until` follows holds: cut (a transient
/// failure) when its bound passes with no renewal, or once it is lost.
/// The bound is looked at before every poll of the run, so a run whose
/// process was paused past the bound (stopped, or starved of CPU) is cut
/// before it can go on, even if what it awaited finished meanwhile.
async fn under_lease(
    mut until: watch::Receiver<Option<Instant>>,
    run: impl Future<Output = Result<(), HandlerError>>,
    stream: &str,
    sequence: Sequence,
) -> Result<(), HandlerError> {
    tokio::pin!(run);
    let mut renewing = true;
    let passed = |until: &watch::Receiver<Option<Instant>>| until.borrow().is_none_or(|b| b <= Instant::now());
    let why = loop {
        let Some(bound) = *until.borrow_and_update() else { break "the stream's lease was lost" };
        let polled = std::future::poll_fn(|cx| {
            if Instant::now() >= bound {
                return std::task::Poll::Ready(None);
            }
            run.as_mut().poll(cx).map(Some)
        });
        tokio::select! {
            biased;
            () = tokio::time::sleep_until(bound) => {}
            changed = until.changed(), if renewing => {
                renewing = changed.is_ok();
                continue;
            }
            result = polled => if let Some(result) = result {
                return result;
            },
        }
        // The bound this pass held passed: cut, unless a renewal moved it.
        if passed(&until) {
            break if until.borrow().is_none() {
                "the stream's lease was lost"
            } else {
                "the stream's lease ran out under it"
            };
        }
    };
    tracing::warn!(%stream, sequence = sequence.get(), "egress dispatch: a handler's run was cut: {why}");
    tracing::event!(
        target: "egress::metrics",
        tracing::Level::DEBUG,
        monotonic_counter.egress_dispatch_cut = 1u64,
        "egress dispatch: a run cut"
    );
    Err(HandlerError::Transient(format!("cut: {why}")))
}

/// Dispatches a cell's records to its handlers until shut down (see the
/// crate's docs). Dropping it stops it (its task ends when the stop
/// signal's sender goes, and the cell's attachment with it); records whose handlers were running
/// stay in flight, and a new dispatcher on the cell (after a
/// [`reconnect`](egress_reactive::EgressCellOf::reconnect)) runs them again.
pub struct Dispatcher {
    task: Option<JoinHandle<()>>,
    stop: watch::Sender<bool>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// Attaches to `cell` (the records of `stream`) and dispatches its
    /// records to `handlers`, on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn(cell: &AsyncEgressCell<Bytes>, stream: impl Into<Arc<str>>, handlers: Handlers) -> Dispatcher {
        Dispatcher::start(cell, stream.into(), handlers, None)
    }

    /// As [`spawn`](Self::spawn), with at most `bound`'s limit of records
    /// started past the store's acknowledgement watermark: a record waits
    /// (and the records behind it) until the store's watermark is within
    /// the limit of it. What a takeover of the stream runs again is then at
    /// most that limit. When the watermark's sender is gone (the relay
    /// stopped), nothing more starts.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn_bounded(
        cell: &AsyncEgressCell<Bytes>,
        stream: impl Into<Arc<str>>,
        handlers: Handlers,
        bound: StoredAck,
    ) -> Dispatcher {
        Dispatcher::start(cell, stream.into(), handlers, Some(bound))
    }

    fn start(cell: &AsyncEgressCell<Bytes>, stream: Arc<str>, handlers: Handlers, bound: Option<StoredAck>) -> Self {
        let (done, rx) = mpsc::unbounded_channel();
        let next = cell.acked_through().get_untracked().map_or(0, |s| s.get().saturating_add(1));
        let counters = Arc::new(Counters::default());
        let spawner = Spawner { handlers: Arc::new(handlers), stream, done, bound, counters: counters.clone() };
        let link = cell.attach(spawner);
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(link, Completions::starting_at(next), rx, stop_rx, counters.clone()));
        Dispatcher { task: Some(task), stop, counters }
    }

    /// What it has done so far.
    pub fn stats(&self) -> DispatchStats {
        let c = &self.counters;
        DispatchStats {
            completed: c.completed.load(Ordering::Relaxed),
            retried: c.retried.load(Ordering::Relaxed),
            permanent: c.permanent.load(Ordering::Relaxed),
            skipped: c.skipped.load(Ordering::Relaxed),
            waited: c.waited.load(Ordering::Relaxed),
        }
    }

    /// Stops dispatching (runs already started finish, but are not
    /// reported) and returns the stats.
    pub async fn shutdown(mut self) -> DispatchStats {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.stats()
    }
}

async fn run(
    link: Attachment<Bytes, Threaded>,
    mut completions: Completions,
    mut done: mpsc::UnboundedReceiver<Done>,
    mut stop: watch::Receiver<bool>,
    counters: Arc<Counters>,
) {
    loop {
        let Done { sequence, skipped, result } = tokio::select! {
            d = done.recv() => match d {
                Some(d) => d,
                None => return,
            },
            _ = stop.changed() => return,
        };
        match result {
            Ok(()) => {
                let counter = if skipped { &counters.skipped } else { &counters.completed };
                counter.fetch_add(1, Ordering::Relaxed);
                if skipped {
                    metric_skipped();
                } else {
                    metric_completed();
                }
                match completions.complete(sequence.get()) {
                    Some(through) => {
                        let _ = link.ack(through);
                    }
                    // Above a gap: not acknowledged yet, but progress (a
                    // probe that completed ends isolation).
                    None => {
                        let _ = link.progressed(sequence);
                    }
                }
            }
            Err(e) => {
                let kind = e.kind();
                if kind == FailureKind::Permanent {
                    counters.permanent.fetch_add(1, Ordering::Relaxed);
                    metric_permanent();
                    tracing::warn!(%sequence, error = %e, "egress dispatch: a handler failed permanently");
                } else {
                    counters.retried.fetch_add(1, Ordering::Relaxed);
                    metric_retried();
                    tracing::debug!(%sequence, error = %e, "egress dispatch: a handler failed; retried later");
                }
                let _ = link.fail(sequence, kind);
            }
        }
    }
}

fn metric_completed() {
    tracing::event!(target: "egress::metrics", tracing::Level::DEBUG, monotonic_counter.egress_dispatch_completed = 1u64, "egress dispatch: completed");
}

fn metric_skipped() {
    tracing::event!(target: "egress::metrics", tracing::Level::DEBUG, monotonic_counter.egress_dispatch_skipped = 1u64, "egress dispatch: a tombstone passed");
}

fn metric_permanent() {
    tracing::event!(target: "egress::metrics", tracing::Level::DEBUG, monotonic_counter.egress_dispatch_permanent = 1u64, "egress dispatch: failed for good");
}

fn metric_retried() {
    tracing::event!(target: "egress::metrics", tracing::Level::DEBUG, monotonic_counter.egress_dispatch_retried = 1u64, "egress dispatch: failed, retried");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handler_errors_map_onto_the_cores_failure_kinds() {
        assert_eq!(HandlerError::Transient("x".into()).kind(), FailureKind::Transient);
        assert_eq!(HandlerError::Permanent("x".into()).kind(), FailureKind::Permanent);
        assert_eq!(
            HandlerError::RetryAfter(Duration::from_millis(1_500)).kind(),
            FailureKind::RetryAfter(Delay(1_500))
        );
        assert_eq!(HandlerError::RetryAfter(Duration::MAX).kind(), FailureKind::RetryAfter(Delay(u64::MAX)));
    }
}
