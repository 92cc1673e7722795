//! [`HttpSender`]: a lanes cell's transport over HTTP.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use egress_core::{Delay, FailOutcome, Generation, LaneKey, Ordinal, Policy, Sequence};
use egress_reactive::{
    AsyncLanesCell, Computed, ConnectionState, ConnectionTracker, LaneItem, LanesAttachment, LanesTransport, SendError,
    Signal, Threaded,
};
use reqwest::Url;
use reqwest::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::request::HttpRequest;
use crate::response::{HttpError, classify};

/// The header every attempt carries: the record's idempotency key.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// How much of an error's body is read (and parsed, for a 429's
/// `retry_after_ms`); the rest is not read.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// Where and how an [`HttpSender`] sends.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    base: Url,
    timeout: Duration,
    producer: String,
    excerpt: usize,
    rejections: usize,
    max_retry_after: Duration,
    client: Option<reqwest::Client>,
}

/// A configuration [`HttpConfig`] refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The base is not an `http` or `https` URL.
    #[error("not an http(s) base URL: {0}")]
    Base(String),
    /// The producer name cannot go in a header (empty, or a character
    /// other than visible ASCII).
    #[error("a producer name must be visible ASCII, not {0:?}")]
    Producer(String),
}

impl HttpConfig {
    /// Sends to paths below `base` (`https://matrix.example/_matrix/client/v3/`),
    /// with a timeout of 30 s per request, as producer `egress`, keeping
    /// 256 bytes of an error's body and the last 256 rejections.
    ///
    /// # Errors
    /// [`ConfigError::Base`] for a base that is not an `http(s)` URL.
    pub fn new(base: &str) -> Result<Self, ConfigError> {
        let mut base = Url::parse(base).map_err(|e| ConfigError::Base(format!("{base}: {e}")))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(ConfigError::Base(base.to_string()));
        }
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        Ok(HttpConfig {
            base,
            timeout: Duration::from_secs(30),
            producer: "egress".into(),
            excerpt: 256,
            rejections: 256,
            max_retry_after: Duration::from_secs(3_600),
            client: None,
        })
    }

    /// Each request's timeout: with no answer by then, it fails as
    /// transient.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The producer's name, the first part of every idempotency key.
    ///
    /// # Errors
    /// [`ConfigError::Producer`] for a name that cannot go in a header.
    pub fn producer(mut self, name: &str) -> Result<Self, ConfigError> {
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ConfigError::Producer(name.to_owned()));
        }
        self.producer = name.to_owned();
        Ok(self)
    }

    /// How many bytes of an error's body a rejection keeps.
    #[must_use]
    pub fn excerpt(mut self, bytes: usize) -> Self {
        self.excerpt = bytes.min(ERROR_BODY_LIMIT);
        self
    }

    /// The longest a 429 may make a record wait: a server asking for more
    /// (a bug, or a hostile server holding a lane back for good) is taken
    /// to ask for this (1 hour by default).
    #[must_use]
    pub fn max_retry_after(mut self, limit: Duration) -> Self {
        self.max_retry_after = limit;
        self
    }

    /// How many rejections [`HttpSender::rejections`] keeps (the newest).
    #[must_use]
    pub fn rejections(mut self, kept: usize) -> Self {
        self.rejections = kept;
        self
    }

    /// The client to send with (its TLS roots, proxies, pool, redirect
    /// policy); by default a `reqwest::Client` with rustls and the web's
    /// roots that follows no redirect (a 303 would turn a `PUT` into a
    /// `GET` whose 2xx completes a record that was never applied: a
    /// redirect is a dead letter).
    #[must_use]
    pub fn client(mut self, client: reqwest::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// The retry policy of an HTTP API, as a base for the lanes' policy:
    /// the `k`-th failure in a row of a record (5xx, a timeout, a failed
    /// connection) waits a time drawn from [50%, 100%] of
    /// `min(60 s, 1 s × 2^(k−1))`, at the cells' millisecond tick, and a
    /// 429 at least what the server asked, spread the same way. A record
    /// is retried after each of its first `retry_budget` failures; the
    /// next makes it a dead letter. (The core's
    /// backoff is `b = min(30 s, 500 ms × 2^(k−1))` plus `b × sample` for a
    /// jitter sample in [0, 1]: `[b, 2b]`, the range above.)
    ///
    /// # Panics
    /// Never: the values are valid.
    pub fn policy(retry_budget: u32) -> Policy {
        Policy::builder()
            .retry_budget(retry_budget)
            .retry_base(Delay(500))
            .retry_ceiling(Delay(30_000))
            .jitter(1.0)
            .build()
            .expect("a valid policy")
    }
}

/// A record the server refused for good (any status but 2xx, 429 and
/// 5xx), or that ran out of its retries: a dead letter, with what the
/// server said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection<K> {
    /// Its lane.
    pub lane: K,
    /// Its ordinal (in its idempotency key).
    pub ordinal: Ordinal,
    /// Its sequence in the lane.
    pub sequence: Sequence,
    /// The last error.
    pub error: HttpError,
}

/// What an [`HttpSender`] has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HttpStats {
    /// Requests answered with a success.
    pub completed: u64,
    /// Requests that failed and were retried later.
    pub retried: u64,
    /// Records that became dead letters. Counted once
    /// [`HttpSender::rejections`] lists them: a count read says the list
    /// holds them (the newest it keeps).
    pub rejected: u64,
}

#[derive(Default)]
struct Counters {
    completed: AtomicU64,
    retried: AtomicU64,
    rejected: AtomicU64,
}

/// One request's end, from its task to the sender's.
struct Done<K> {
    lane: K,
    ordinal: Ordinal,
    sequence: Sequence,
    generation: Generation,
    result: Result<(), HttpError>,
    /// A tombstone, completed without a request.
    skipped: bool,
}

/// The lanes cell's transport: starts each record's request on a task of
/// its own and reports its end to the sender's task.
struct Transport<K> {
    client: reqwest::Client,
    base: Url,
    timeout: Duration,
    /// `producer:incarnation:` (the ordinal follows).
    key_prefix: String,
    excerpt: usize,
    max_wait_ms: u64,
    done: mpsc::UnboundedSender<Done<K>>,
    /// The requests running; dropped with the transport, which aborts them.
    requests: JoinSet<()>,
}

impl<K: LaneKey + Send + Sync + 'static> LanesTransport<K, HttpRequest> for Transport<K> {
    fn send(&mut self, item: LaneItem<K, HttpRequest>) -> Result<(), SendError> {
        // Ended requests leave their results here: taken, so that the set
        // holds only what runs (at most what the lanes have in flight).
        while self.requests.try_join_next().is_some() {}
        let LaneItem { lane, ordinal, envelope } = item;
        let (sequence, generation) = (envelope.sequence, envelope.generation);
        let done = self.done.clone();
        if envelope.dead.is_some() {
            // A dead letter's tombstone (under `DeadLetters::Skip`): an
            // HTTP API has no skip to send, so it completes at once and the
            // lane goes on.
            let _ = done.send(Done { lane, ordinal, sequence, generation, result: Ok(()), skipped: true });
            return Ok(());
        }
        let request = envelope.payload;
        let made = self.base.join(request.path.trim_start_matches('/')).map_err(|e| format!("{}: {e}", request.path));
        let content_type = request
            .content_type
            .map(|t| HeaderValue::from_str(&t).map_err(|_| format!("the content type {t:?}")))
            .transpose();
        let (url, content_type) = match (made, content_type) {
            (Ok(url), Ok(content_type)) => (url, content_type),
            (Err(why), _) | (_, Err(why)) => {
                let result = Err(HttpError::Unsendable(why));
                let _ = done.send(Done { lane, ordinal, sequence, generation, result, skipped: false });
                return Ok(());
            }
        };
        let key = format!("{}{}", self.key_prefix, ordinal.0);
        let mut builder = self.client.request(request.method, url).timeout(self.timeout).body(request.body);
        builder = builder.header(IDEMPOTENCY_KEY, key);
        if let Some(content_type) = content_type {
            builder = builder.header(CONTENT_TYPE, content_type);
        }
        let (timeout, excerpt, max_wait_ms) = (self.timeout, self.excerpt, self.max_wait_ms);
        self.requests.spawn(async move {
            let result = execute(builder, timeout, excerpt, max_wait_ms).await;
            let _ = done.send(Done { lane, ordinal, sequence, generation, result, skipped: false });
        });
        Ok(())
    }
}

/// Sends one request and says how it ended. A success's body is read to
/// its end and dropped (so the connection goes back to the pool); an
/// error's, up to [`ERROR_BODY_LIMIT`].
async fn execute(
    builder: reqwest::RequestBuilder,
    timeout: Duration,
    excerpt: usize,
    max_wait_ms: u64,
) -> Result<(), HttpError> {
    let failed = |e: reqwest::Error| {
        if e.is_timeout() { HttpError::Timeout(timeout) } else { HttpError::Transport(chain(&e)) }
    };
    let mut response = builder.send().await.map_err(failed)?;
    let status = response.status();
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        if status.is_success() {
            continue;
        }
        let room = ERROR_BODY_LIMIT.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= ERROR_BODY_LIMIT {
            break;
        }
    }
    classify(status, response.headers(), &body, excerpt, max_wait_ms)
}

/// An error with its sources: reqwest's own message says little ("error
/// sending request").
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Sends a lanes cell's records over HTTP: each record is one request (an
/// [`HttpRequest`], sent byte for byte the same at every attempt, with the
/// header `Idempotency-Key: producer:incarnation:ordinal`, which no other
/// record of the cell shares), started as soon as its lane and the cap
/// across lanes allow, so that many lanes' requests run at once.
///
/// - A 2xx completes the record (in any order; each lane acknowledges in
///   its own order). A dead letter's tombstone (under
///   [`DeadLetters::Skip`](egress_core::DeadLetters::Skip)) completes at
///   once, without a request: the lane goes on past it.
/// - A 429 retries after at least the body's `retry_after_ms`, or the
///   `Retry-After` header's seconds (at most
///   [`max_retry_after`](HttpConfig::max_retry_after)); 5xx, a timeout or a failed connection
///   after the policy's backoff (see [`HttpConfig::policy`]); any other
///   status is permanent: a dead letter, listed in
///   [`rejections`](Self::rejections) with the status and the start of the
///   body, as is a record whose retries ran out.
/// - [`connection`](Self::connection) says "online" once the server
///   answers, and "offline: why; retrying in N s" after a request it did
///   not answer (or answered 5xx or 429).
///
/// Starting a sender fences every earlier attachment of the cell (a
/// reconnect to the next generation), so that what an earlier sender left
/// in flight goes out again, under the same idempotency key. Dropping the
/// sender (or [`shutdown`](Self::shutdown)) aborts the requests running;
/// their records stay in flight until the next sender.
pub struct HttpSender<K: 'static> {
    task: Option<JoinHandle<()>>,
    stop: watch::Sender<bool>,
    connection: ConnectionTracker<HttpError>,
    rejections: Computed<Arc<[Rejection<K>]>, Threaded>,
    counters: Arc<Counters>,
}

/// Why [`HttpSender::start`] could not start.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The cell was disposed.
    #[error("the cell was disposed")]
    CellDisposed,
    /// The default client could not be built (its TLS roots).
    #[error("the HTTP client: {0}")]
    Client(String),
}

impl<K: LaneKey + Send + Sync + 'static> HttpSender<K> {
    /// Fences the cell's earlier attachments, attaches to it and sends its
    /// records under `config`, on the current tokio runtime.
    ///
    /// # Errors
    /// [`StartError`]: a disposed cell, or a client that cannot be built.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(cell: &AsyncLanesCell<K, HttpRequest>, config: HttpConfig) -> Result<Self, StartError> {
        let client = match config.client {
            Some(client) => client,
            None => reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| StartError::Client(chain(&e)))?,
        };
        let connection = ConnectionTracker::new(cell, "egress http sender").map_err(|_| StartError::CellDisposed)?;
        let (rejections, rejected) = cell
            .in_scope(|graph| {
                let signal = graph.signal(Arc::<[Rejection<K>]>::from([]));
                let view = graph.computed({
                    let signal = signal.clone();
                    move || signal.get()
                });
                (signal, view)
            })
            .map_err(|_| StartError::CellDisposed)?;
        let next = Generation(cell.with_lanes(|l| l.generation().get()).saturating_add(1));
        let _ = cell.reconnect(next);
        let (done, rx) = mpsc::unbounded_channel();
        let transport = Transport {
            client,
            base: config.base,
            timeout: config.timeout,
            key_prefix: format!("{}:{:032x}:", config.producer, cell.incarnation().0),
            excerpt: config.excerpt,
            max_wait_ms: u64::try_from(config.max_retry_after.as_millis()).unwrap_or(u64::MAX),
            done,
            requests: JoinSet::new(),
        };
        let link = cell.attach(transport);
        let counters = Arc::new(Counters::default());
        let (stop, stop_rx) = watch::channel(false);
        let run = Run {
            link,
            connection: connection.clone(),
            rejections,
            kept: config.rejections,
            counters: counters.clone(),
            failures: 0,
        };
        let task = tokio::spawn(run.run(rx, stop_rx));
        Ok(HttpSender { task: Some(task), stop, connection, rejections: rejected, counters })
    }

    /// Where the connection is, for a UI: "online", "offline: why; retrying
    /// in N s".
    pub fn connection(&self) -> &Computed<ConnectionState<HttpError>, Threaded> {
        self.connection.state()
    }

    /// The newest dead letters, with what the server said (at most the
    /// config's number), oldest first.
    pub fn rejections(&self) -> &Computed<Arc<[Rejection<K>]>, Threaded> {
        &self.rejections
    }

    /// What it has done so far.
    pub fn stats(&self) -> HttpStats {
        let c = &self.counters;
        HttpStats {
            completed: c.completed.load(Ordering::Relaxed),
            retried: c.retried.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Acquire),
        }
    }

    /// Stops: the requests running are aborted (their records stay in
    /// flight for the next sender). Returns the stats.
    pub async fn shutdown(mut self) -> HttpStats {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.connection.set(ConnectionState::Stopped { error: None });
        self.stats()
    }
}

impl<K: 'static> Drop for HttpSender<K> {
    /// Aborts the requests running (their records stay in flight for the
    /// next sender); the connection state reads stopped, as after a
    /// shutdown.
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            self.connection.set(ConnectionState::Stopped { error: None });
        }
    }
}

impl<K: 'static> std::fmt::Debug for HttpSender<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSender").finish_non_exhaustive()
    }
}

/// The sender's task: takes each request's end to the cell.
struct Run<K: 'static> {
    link: LanesAttachment<K, HttpRequest, Threaded>,
    connection: ConnectionTracker<HttpError>,
    rejections: Signal<Arc<[Rejection<K>]>, Threaded>,
    kept: usize,
    counters: Arc<Counters>,
    /// Requests in a row that the server did not answer.
    failures: u32,
}

impl<K: LaneKey + Send + Sync + 'static> Run<K> {
    async fn run(mut self, mut done: mpsc::UnboundedReceiver<Done<K>>, mut stop: watch::Receiver<bool>) {
        loop {
            let ended = tokio::select! {
                d = done.recv() => match d {
                    Some(d) => d,
                    // The transport is gone: a reconnect (a later sender)
                    // fenced this one, or the cell was disposed.
                    None => {
                        tracing::info!("egress http sender: fenced or disposed; stopping");
                        self.connection.set(ConnectionState::Stopped { error: None });
                        return;
                    }
                },
                _ = stop.changed() => return,
            };
            // Taking a result runs the graph's effects (the attachment's
            // next sends, the application's own): a panic there has no
            // caller to go to, and this task must go on.
            let taken = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.take(ended)));
            if let Err(panic) = taken {
                tracing::error!(
                    panic = egress_core::panic_message(&*panic).unwrap_or("(not a message)"),
                    "egress http sender: a panic while taking a response; the sender goes on"
                );
            }
        }
    }

    fn take(&mut self, done: Done<K>) {
        let Done { lane, ordinal, sequence, generation, result, skipped } = done;
        let error = match result {
            Ok(()) if skipped => {
                let _ = self.link.complete(&lane, sequence);
                return;
            }
            Ok(()) => {
                self.counters.completed.fetch_add(1, Ordering::Relaxed);
                let _ = self.link.complete(&lane, sequence);
                self.online(generation);
                return;
            }
            Err(error) => error,
        };
        let outcome = self.link.fail(&lane, sequence, error.kind());
        match outcome {
            FailOutcome::Retrying(retry) => {
                self.counters.retried.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(?lane, ordinal = ordinal.0, %error, "egress http sender: retrying");
                // Only a 5xx, a 429, a timeout or a failed connection is
                // retried: the server cannot take the record now.
                self.failures = self.failures.saturating_add(1);
                let retry_at = Instant::now() + Duration::from_millis(retry.backoff.0);
                self.connection.set(ConnectionState::Reconnecting { retry_at, failures: self.failures, error });
            }
            FailOutcome::Exhausted(_) => {
                tracing::warn!(?lane, ordinal = ordinal.0, %error, "egress http sender: a dead letter");
                if error.answered() {
                    self.online(generation);
                }
                let rejection = Rejection { lane, ordinal, sequence, error };
                let kept = self.kept;
                let _ = self.rejections.try_update(|list| {
                    let skip = (list.len() + 1).saturating_sub(kept);
                    *list = list.iter().skip(skip).cloned().chain((kept > 0).then_some(rejection)).collect();
                });
                // Counted once listed: a count read says the list has it.
                self.counters.rejected.fetch_add(1, Ordering::Release);
            }
            // Fenced (a later sender took over) or already settled.
            FailOutcome::UnknownSequence { .. } | FailOutcome::StaleGeneration { .. } => {}
        }
    }

    fn online(&mut self, generation: Generation) {
        self.failures = 0;
        if !self.connection.state().get_untracked().is_online() {
            self.connection.set(ConnectionState::Connected { generation });
        }
    }
}

#[cfg(test)]
mod tests {
    use egress_core::{EgressCore, FailOutcome, FailureKind, JitterSample, Time};

    use super::*;

    /// The `k`-th failure in a row waits within [50%, 100%] of
    /// `min(60 s, 1 s × 2^(k−1))`: the ends at the smallest and the largest
    /// jitter sample, for every `k` up to past the cap.
    #[test]
    fn the_policy_backs_off_within_half_to_all_of_the_capped_doubling() {
        for (sample, half) in
            [(JitterSample::ZERO, true), (JitterSample::new(1.0).unwrap_or(JitterSample::ZERO), false)]
        {
            let mut core = EgressCore::new(HttpConfig::policy(20));
            let _ = core.enqueue(());
            for k in 1..=12u32 {
                let g = core.generation();
                let _ = core.claim(g);
                let FailOutcome::Retrying(r) =
                    core.fail(g, Sequence(0), FailureKind::Transient, Time(0), sample).outcome
                else {
                    panic!("retried");
                };
                let full = 1_000u64.saturating_mul(1 << (k - 1)).min(60_000);
                assert_eq!(r.backoff.0, if half { full / 2 } else { full }, "failure {k}");
                let _ = core.retry_now(g, Sequence(0));
            }
        }
    }

    #[test]
    fn a_configuration_refuses_what_it_cannot_send_with() {
        assert!(matches!(HttpConfig::new("ftp://x/"), Err(ConfigError::Base(_))));
        assert!(matches!(HttpConfig::new("not a url"), Err(ConfigError::Base(_))));
        assert!(matches!(HttpConfig::new("mailto:a@b"), Err(ConfigError::Base(_))));
        let config = HttpConfig::new("https://h.example/_matrix/client/v3").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(config.base.as_str(), "https://h.example/_matrix/client/v3/", "a base ends with a slash");
        assert_eq!(
            config.base.join("rooms/a").map(String::from).ok().as_deref(),
            Some("https://h.example/_matrix/client/v3/rooms/a")
        );
        for bad in ["", "a b", "caf\u{e9}", "tab\t"] {
            assert!(matches!(config.clone().producer(bad), Err(ConfigError::Producer(_))), "{bad:?}");
        }
        let config =
            config.producer("phone-1").map(|c| c.excerpt(1 << 30).rejections(3)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((config.producer.as_str(), config.excerpt, config.rejections), ("phone-1", ERROR_BODY_LIMIT, 3));
        assert_eq!(ERROR_BODY_LIMIT, 65_536, "an error's body is read up to 64 KiB (docs/http.md)");
    }
}
