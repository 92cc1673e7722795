//! What egress's tests share, so that no test crate keeps its own copy:
//!
//! - the servers `.ci/run` starts, from the environment: [`pg_url`] and
//!   [`pg_database`] (`EGRESS_PG_URL`), [`nats_url`] (`EGRESS_NATS_URL`);
//!   without them a test says so and does nothing, unless the matching
//!   `*_REQUIRED` variable is set (as CI sets it): then it fails;
//! - [`fresh`] names no other test or earlier run uses, and [`TempDir`];
//! - [`Metrics`], a `tracing` layer that captures the `egress::metrics`
//!   events the crates emit (and the names their spans carry);
//! - [`Contention`], busy threads that take the machine's cores from the
//!   code under test, for as long as a test holds it (and never longer
//!   than [`limit`]);
//! - [`limit`], how long any wait in a test may take (the mutation gate
//!   lowers it), and [`until`], the bounded wait for a condition that only
//!   real I/O can make true.
//!
//! The seeded clock and the chaos schedule are not here: tests use the
//! ones the library itself runs on, so that what is tested is what ships.
//! Virtual time is `egress_reactive::ManualClock` (a cell's clock) and
//! tokio's paused clock; seeded randomness is `egress_reactive::Xorshift`
//! (the backoff's jitter, the receiver's injected ack faults, the demo's
//! schedules); the chaos schedule is `egress_ws::ChaosProxy` (kills at
//! seeded moments; the WebSocket and NATS tests put it in front of their
//! peers).
//!
//! Not published; a dev-dependency of the crates' tests. It depends on no
//! egress crate, so a crate's dependency tree stays its own.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tracing::field::{Field, Visit};

/// The URL in `var`, or `None` after saying so (a test without its server
/// does nothing); panics when `required` is set but `var` is not.
fn server(var: &str, required: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) => Some(url),
        Err(_) if std::env::var_os(required).is_some() => panic!("{required} is set but {var} is not"),
        Err(_) => {
            eprintln!("{var} is not set: this {what} test does nothing");
            None
        }
    }
}

/// The PostgreSQL server's URL (`EGRESS_PG_URL`, a
/// `postgres://user@host:port/db` URL), or `None`: see the crate's docs.
///
/// # Panics
/// `EGRESS_PG_REQUIRED` is set and `EGRESS_PG_URL` is not.
pub fn pg_url() -> Option<String> {
    server("EGRESS_PG_URL", "EGRESS_PG_REQUIRED", "PostgreSQL")
}

/// A new, empty database of its own on the PostgreSQL server (so that one
/// test's free streams are not another's to take), as a URL; `None` when
/// this run has no server. The databases are named after `prefix` and a
/// random suffix, and left for the throwaway cluster to take away.
///
/// # Panics
/// The server refuses, or [`pg_url`]'s.
pub async fn pg_database(prefix: &str) -> Option<String> {
    let url = pg_url()?;
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("the server");
    tokio::spawn(connection);
    let name = fresh(prefix).replace('-', "_");
    client.batch_execute(&format!("CREATE DATABASE {name}")).await.expect("a database of its own");
    let base = url.split('?').next().unwrap_or(&url);
    let (server, _) = base.rsplit_once('/').expect("EGRESS_PG_URL is a URL with a database");
    Some(format!("{server}/{name}"))
}

/// The NATS server's URL (`EGRESS_NATS_URL`, `nats://ip:port`), or `None`:
/// see the crate's docs.
///
/// # Panics
/// `EGRESS_NATS_REQUIRED` is set and `EGRESS_NATS_URL` is not.
pub fn nats_url() -> Option<String> {
    server("EGRESS_NATS_URL", "EGRESS_NATS_REQUIRED", "NATS")
}

/// How long any wait in a test may take: 60 s, or `EGRESS_TEST_LIMIT_SECS`
/// (the mutation gate sets it lower, so that a mutant that stops delivery
/// fails in seconds rather than a minute; a correct run needs a fraction
/// of either).
pub fn limit() -> std::time::Duration {
    static LIMIT: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        let secs = std::env::var("EGRESS_TEST_LIMIT_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
        std::time::Duration::from_secs(secs)
    })
}

/// Polls `ready` every 2 ms until it returns `Some`, and returns that. For
/// what only real I/O makes true (a server acknowledging, a socket
/// closing); a test of logic uses virtual time instead.
///
/// # Panics
/// After [`limit`], with `what()`: what was awaited and what was seen.
pub async fn until<T>(mut ready: impl FnMut() -> Option<T>, what: impl FnOnce() -> String) -> T {
    let deadline = tokio::time::Instant::now() + limit();
    loop {
        if let Some(value) = ready() {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "not within {:?}: {}", limit(), what());
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// Busy loops on threads of their own, one per core asked for: the CPU
/// contention of a loaded machine, for a test that must hold under it.
/// They stop when this is dropped, or after [`limit`] at the latest (a
/// test that panics without dropping it leaves no spinning thread behind
/// for long).
#[derive(Debug)]
pub struct Contention {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

impl Contention {
    /// Starts `threads` busy loops.
    ///
    /// # Panics
    /// A thread cannot be spawned.
    pub fn start(threads: usize) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let until = std::time::Instant::now() + limit();
        let threads = (0..threads)
            .map(|i| {
                let stop = stop.clone();
                std::thread::Builder::new()
                    .name(format!("contention-{i}"))
                    .spawn(move || {
                        let mut spins = 0u64;
                        while !stop.load(Ordering::Relaxed)
                            && (!spins.is_multiple_of(4096) || std::time::Instant::now() < until)
                        {
                            spins = std::hint::black_box(spins.wrapping_add(1));
                        }
                        spins
                    })
                    .expect("a busy thread")
            })
            .collect();
        Contention { stop, threads }
    }

    /// Stops the loops; returns how many turns each made (a loop that made
    /// none did not contend).
    pub fn stop(mut self) -> Vec<u64> {
        self.halt()
    }

    fn halt(&mut self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads.drain(..).map(|t| t.join().unwrap_or(0)).collect()
    }
}

impl Drop for Contention {
    fn drop(&mut self) {
        self.halt();
    }
}

/// `name` and 64 random bits: a name no other test (or earlier run) uses.
pub fn fresh(name: &str) -> String {
    use std::hash::BuildHasher;
    format!("{name}-{:016x}", std::collections::hash_map::RandomState::new().hash_one(0u64))
}

/// A fresh directory under the system's temporary one, removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates it.
    ///
    /// # Panics
    /// The directory cannot be created.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("egress-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        TempDir(dir)
    }

    /// The directory.
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }

    /// `egress.db` in it.
    pub fn db(&self) -> PathBuf {
        self.0.join("egress.db")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `tracing` layer that keeps every numeric field of every event of
/// target `egress::metrics` (the `monotonic_counter.*` and `histogram.*`
/// fields a metrics layer would turn into instruments), and the `stream`
/// field of every span named `span` (see [`Metrics::with_span`]). Install
/// it for the test's thread (`tracing::subscriber::set_default`); a test
/// binary that counts should hold one test, since `tracing` caches per
/// call site whether anyone listens.
#[derive(Clone, Default)]
pub struct Metrics {
    fields: Arc<Mutex<Vec<(String, f64)>>>,
    streams: Arc<Mutex<Vec<String>>>,
    span: Option<&'static str>,
    outside: Arc<Mutex<Vec<String>>>,
}

impl Metrics {
    /// Also keeps the `stream` field of each new span named `span`.
    #[must_use]
    pub fn with_span(mut self, span: &'static str) -> Self {
        self.span = Some(span);
        self
    }

    /// The sum of every value of field `name`.
    pub fn sum(&self, name: &str) -> f64 {
        self.fields.lock().iter().filter(|(n, _)| n == name).map(|(_, v)| v).sum()
    }

    /// How many values of field `name` came.
    pub fn count(&self, name: &str) -> usize {
        self.fields.lock().iter().filter(|(n, _)| n == name).count()
    }

    /// The name of every field kept, once per value.
    pub fn names(&self) -> Vec<String> {
        self.fields.lock().iter().map(|(n, _)| n.clone()).collect()
    }

    /// The `stream` of every span kept, in creation order.
    pub fn streams(&self) -> Vec<String> {
        self.streams.lock().clone()
    }

    /// The fields of every metrics event that came outside a span named
    /// as [`with_span`](Self::with_span) says (none without one).
    pub fn outside_span(&self) -> Vec<String> {
        self.outside.lock().clone()
    }
}

struct Fields<'a>(&'a mut Vec<(String, f64)>);

impl Visit for Fields<'_> {
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.push((field.name().to_owned(), value as f64));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.push((field.name().to_owned(), value));
    }
    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

struct Stream<'a>(&'a mut Vec<String>);

impl Visit for Stream<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "stream" {
            self.0.push(value.to_owned());
        }
    }
    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

impl<S> tracing_subscriber::Layer<S> for Metrics
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() == "egress::metrics" {
            event.record(&mut Fields(&mut self.fields.lock()));
            if let Some(name) = self.span
                && !ctx.event_scope(event).is_some_and(|mut scope| scope.any(|span| span.name() == name))
            {
                let fields = event.metadata().fields().iter().map(|f| f.name().to_owned());
                self.outside.lock().extend(fields);
            }
        }
    }

    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if self.span.is_some_and(|name| attrs.metadata().name() == name) {
            attrs.record(&mut Stream(&mut self.streams.lock()));
        }
    }
}
