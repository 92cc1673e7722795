//! `egress-demo`: messages through an `AsyncEgressCell` over WebSocket while
//! connections (or whole processes) are killed at random moments; nothing
//! is lost, and what is delivered twice is said.
//!
//! ```text
//! cargo run --release -p egress-demo                      # receiver + sender in one process, with chaos
//! cargo run --release -p egress-demo -- --messages 1000000 --max-rate --seed 7 --summary-json out.json
//! cargo run --release -p egress-demo -- restarts          # sender and receiver processes killed and restarted
//! cargo run --release -p egress-demo -- --durable         # the same, both sides on SQLite: exactly once across their crashes
//! cargo run --release -p egress-demo -- receive --listen 127.0.0.1:9000
//! cargo run --release -p egress-demo -- send --url ws://127.0.0.1:9000
//! ```

mod apart;
mod http;
mod nats;
mod restarts;
mod workers;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use clap::{Args, Parser, Subcommand, ValueEnum};
use egress_core::{Delay, Policy};
use egress_reactive::{AsyncContext, AsyncEgressCell, Effect, Threaded};
use egress_ws::{AckMode, ChaosProxy, Content, Receiver, ReceiverConfig, Sender, SenderConfig};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

/// `println!` that ignores a closed stdout (a pipe whose reader went away).
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// egress-demo: an egress cell over WebSocket, through killed connections.
///
/// Without a subcommand: a receiver and a sender in one process, the sender
/// connected through a proxy that kills its connection at seeded points of
/// the run, paced so a person can watch; the summary says whether every
/// message was delivered exactly once and in order.
#[derive(Debug, Parser)]
#[command(
    name = "egress-demo",
    version,
    about,
    long_about,
    args_conflicts_with_subcommands = true,
    max_term_width = 100
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    together: Together,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A receiver process and a sender process, killed in turn (SIGKILL) and
    /// restarted at random moments; says what held.
    ///
    /// Without a store a restarted sender is a new incarnation that starts
    /// over from sequence 0 and a restarted receiver resumes each stream
    /// where its producer says; with --durable (or --db) both sides keep
    /// their state in SQLite and the application's table is checked to
    /// hold each message exactly once and in order across every kill.
    Restarts(RestartsArgs),
    /// The receiving half: prints what arrived once --messages are in (and
    /// keeps acknowledging for a second after the last).
    Receive(ReceiveArgs),
    /// The sending half: without --db a new incarnation each run (it starts
    /// over from 0); with --db it continues the stored stream where it
    /// stopped.
    Send(SendArgs),
    /// Scale-out on PostgreSQL: worker processes share the streams through
    /// leases and dispatch each record to a typed handler that records it
    /// in the application's table; this process appends in its own
    /// transactions, SIGKILLs workers at random and starts new ones, then
    /// checks every record was handled, in order per stream.
    Workers(workers::WorkersArgs),
    /// One worker process (started by `workers`).
    #[command(hide = true)]
    Worker(workers::WorkerArgs),
    /// A chat client's outgoing queue over HTTP: durable lanes (rooms,
    /// to-device, account data, unordered calls) sent by egress-http to a
    /// homeserver with seeded chaos (429s, 5xx, dropped connections), the
    /// client process SIGKILLed and restarted at random; checks every
    /// message was applied exactly once, each lane in order, never two of
    /// a serial lane in flight.
    Http(http::HttpArgs),
    /// One client process (started by `http`).
    #[command(hide = true)]
    HttpClient(http::HttpClientArgs),
}

/// What every run takes.
#[derive(Debug, Args)]
struct Common {
    /// How many messages.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    messages: u64,
    /// Seeds the kill schedule, the backoff jitter and the cell's jitter: a
    /// run with the same seed kills at the same points.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write the summary as JSON to this file.
    #[arg(long, value_name = "PATH")]
    summary_json: Option<String>,
}

/// How fast messages are enqueued.
#[derive(Debug, Args)]
struct Pace {
    /// Enqueue at most this many messages per second (a pace a person can
    /// watch).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    rate: u64,
    /// Enqueue as fast as the cell takes them (for benchmarking): no pace.
    #[arg(long, conflicts_with = "rate")]
    max_rate: bool,
}

impl Pace {
    fn per_second(&self) -> Option<u64> {
        (!self.max_rate).then_some(self.rate)
    }
}

/// The process kills of `restarts` (and `--durable`).
#[derive(Debug, Args)]
struct Kills {
    /// How many process kills.
    #[arg(long, default_value_t = 6)]
    kills: u64,
    /// The mean time between process kills, in milliseconds.
    #[arg(long, default_value_t = 300)]
    kill_ms: u64,
    /// Which process to kill.
    #[arg(long, value_enum, default_value_t = Who::Both)]
    kill: Who,
    /// The sender's SQLite database (the receiver's is PATH.receiver);
    /// started afresh.
    #[arg(long, value_name = "PATH")]
    db: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Who {
    Sender,
    Receiver,
    Both,
}

/// The one-process run (no subcommand).
#[derive(Debug, Args)]
struct Together {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    pace: Pace,
    /// Do not kill connections.
    #[arg(long)]
    no_chaos: bool,
    /// Kill the connection after this many messages on average (the points
    /// are drawn from --seed).
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..))]
    kill_every: u64,
    /// Run `restarts` with both sides on SQLite instead (--db, default a new
    /// file in the temporary directory).
    #[arg(long)]
    durable: bool,
    #[command(flatten, next_help_heading = "With --durable")]
    kills: Kills,
    /// Run over NATS JetStream instead: publish into a fresh stream on the
    /// server at URL (nats://host:port, JetStream enabled) through the
    /// killing proxy, read it back with a subscriber, same summary.
    #[arg(long, value_name = "URL", conflicts_with = "durable")]
    nats: Option<String>,
}

#[derive(Debug, Args)]
struct RestartsArgs {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    pace: Pace,
    /// Both sides on SQLite (--db, default a new file in the temporary
    /// directory).
    #[arg(long)]
    durable: bool,
    #[command(flatten)]
    kills: Kills,
}

#[derive(Debug, Args)]
struct ReceiveArgs {
    /// How many messages to wait for before stopping (without --print).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "print")]
    messages: u64,
    /// Also write the summary as JSON to this file (without --print).
    #[arg(long, value_name = "PATH", conflicts_with = "print")]
    summary_json: Option<String>,
    /// Speak wss://: the certificate chain, PEM.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<String>,
    /// Speak wss://: the certificate's private key, PEM.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<String>,
    /// Admit only producers whose upgrade carries `Authorization: Bearer
    /// TOKEN` (others get 401).
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// The address to listen on (port 0: any free port).
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// Print each delivery as a line and commit it once the line is out,
    /// forever (instead of stopping after --messages).
    #[arg(long)]
    print: bool,
    /// With --print: first write each delivery to this SQLite database's
    /// table, with the receiver's record, and resume from it.
    #[arg(long, value_name = "PATH", requires = "print")]
    db: Option<String>,
}

#[derive(Debug, Args)]
struct SendArgs {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    pace: Pace,
    /// The receiver's URL (ws:// or wss://).
    #[arg(long, value_name = "ws://ADDR")]
    url: String,
    /// Send `Authorization: Bearer TOKEN` with the upgrade.
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// For wss://: trust exactly this certificate (PEM: the receiver's own,
    /// or its authority), instead of the webpki roots.
    #[arg(long, value_name = "PEM")]
    ca: Option<String>,
    /// Keep the stream in this SQLite database and continue it.
    #[arg(long, value_name = "PATH")]
    db: Option<String>,
}

/// What a run needs, from whichever command line.
pub(crate) struct Options {
    messages: u64,
    seed: u64,
    summary_json: Option<String>,
    rate: Option<u64>,
    chaos: bool,
    kill_every: u64,
    listen: Option<SocketAddr>,
    url: Option<String>,
    print: bool,
    kills: u64,
    kill_ms: u64,
    db: Option<String>,
    durable: bool,
    kill_sender: bool,
    kill_receiver: bool,
    /// The receiver's certificate chain and key (PEM files).
    tls: Option<(String, String)>,
    /// The bearer token: checked by the receiver, sent by the sender.
    token: Option<String>,
    /// The sender's root for wss:// (a PEM file).
    ca: Option<String>,
}

impl Options {
    fn new(common: Common, rate: Option<u64>) -> Self {
        Options {
            messages: common.messages,
            seed: common.seed,
            summary_json: common.summary_json,
            rate,
            chaos: false,
            kill_every: 5_000,
            listen: None,
            url: None,
            print: false,
            kills: 0,
            kill_ms: 300,
            db: None,
            durable: false,
            kill_sender: false,
            kill_receiver: false,
            tls: None,
            token: None,
            ca: None,
        }
    }

    fn with_kills(mut self, k: Kills, durable: bool) -> Self {
        (self.kills, self.kill_ms, self.db, self.durable) = (k.kills, k.kill_ms, k.db, durable);
        (self.kill_sender, self.kill_receiver) = (k.kill != Who::Receiver, k.kill != Who::Sender);
        self
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Events go to stderr, filtered by RUST_LOG (errors only without it):
    // RUST_LOG=info shows connections, reconnects and admissions;
    // RUST_LOG=egress_ws=trace every frame.
    tracing_subscriber::fmt()
        // Without RUST_LOG: errors only, and not the NATS client's report
        // of each connection the chaos kills (it reconnects by itself).
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error,async_nats=off")),
        )
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Some(Command::Restarts(a)) => {
            restarts::run(Options::new(a.common, a.pace.per_second()).with_kills(a.kills, a.durable)).await
        }
        Some(Command::Receive(a)) => {
            let common = Common { messages: a.messages, seed: 0, summary_json: a.summary_json };
            let tls = a.tls_cert.zip(a.tls_key);
            let (db, token) = (a.db, a.token);
            apart::receive(Options {
                listen: Some(a.listen),
                print: a.print,
                db,
                tls,
                token,
                ..Options::new(common, None)
            })
            .await
        }
        Some(Command::Workers(a)) => workers::run(a).await,
        Some(Command::Worker(a)) => workers::worker(a).await,
        Some(Command::Http(a)) => http::run(a).await,
        Some(Command::HttpClient(a)) => http::client(a).await,
        Some(Command::Send(a)) => {
            let (url, db, token, ca) = (Some(a.url), a.db, a.token, a.ca);
            apart::send(Options { url, db, token, ca, ..Options::new(a.common, a.pace.per_second()) }).await
        }
        None => {
            let t = cli.together;
            let o =
                Options { chaos: !t.no_chaos, kill_every: t.kill_every, ..Options::new(t.common, t.pace.per_second()) };
            if let Some(url) = &t.nats {
                nats::run(o, url).await
            } else if t.durable || t.kills.db.is_some() {
                restarts::run(o.with_kills(t.kills, t.durable)).await
            } else {
                together(o).await
            }
        }
    }
}

fn policy() -> anyhow::Result<Policy> {
    Ok(Policy::builder()
        .inflight_limit(256)
        .retry_budget(1_000)
        .replay_limit(1_000)
        .retry_base(Delay(10))
        .retry_ceiling(Delay(1_000))
        .jitter(0.5)
        .build()?)
}

/// The documented defaults (docs/protocol.md, "Timeouts, bounds and
/// backoff"), but for the reconnect backoff: 5 ms doubling to 500 ms
/// instead of 20 ms to 2 s, since the demo's proxy kills a connection every
/// few thousand messages on purpose (README says so).
fn sender_config(seed: u64) -> SenderConfig {
    SenderConfig {
        seed,
        backoff_base: Duration::from_millis(5),
        backoff_max: Duration::from_millis(500),
        ..SenderConfig::new("egress-demo")
    }
}

/// The progress bar, driven by an effect over the cell's readers; and the
/// failures the cell recorded (each change of its `retry` reader to a new
/// failure).
fn progress(
    cx: &AsyncContext,
    cell: &AsyncEgressCell<Bytes>,
    total: u64,
) -> (ProgressBar, Effect<Threaded>, Arc<AtomicU64>) {
    let bar = ProgressBar::new(total);
    bar.set_style(bar_style());
    let retries = Arc::new(AtomicU64::new(0));
    let effect = cx.effect({
        let (bar, cell, retries) = (bar.clone(), cell.clone(), retries.clone());
        let mut last_retry = None;
        move || {
            let acked = cell.acked_through().get().map_or(0, |s| s.get() + 1);
            let retry = cell.retry().get();
            if retry.is_some() && retry != last_retry {
                retries.fetch_add(1, Ordering::Relaxed);
            }
            last_retry = retry;
            bar.set_position(acked);
            bar.set_message(status_line(Status {
                acked,
                sending: cell.inflight_len().get(),
                queued: cell.pending_len().get(),
                retrying: cell.parked_len().get(),
                reconnects: cell.generation().get().get().saturating_sub(1),
            }));
        }
    });
    (bar, effect, retries)
}

/// The progress line: a spinner, a bar and [`status_line`], at most 80
/// columns wide whatever the counts.
fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {bar:9} {msg}").unwrap_or_else(|_| ProgressStyle::default_bar())
}

/// What the progress line says, read from the cell's computeds.
#[derive(Clone, Copy, Debug)]
struct Status {
    acked: u64,
    sending: usize,
    queued: usize,
    retrying: usize,
    reconnects: u64,
}

/// The status as a line of 68 columns: each count in at most 6 (see
/// [`compact`]).
fn status_line(s: Status) -> String {
    let n = |v: usize| compact(u64::try_from(v).unwrap_or(u64::MAX));
    format!(
        "acked {:>6} sending {:>6} queued {:>6} retry {:>6} reconn {:>6}",
        compact(s.acked),
        n(s.sending),
        n(s.queued),
        n(s.retrying),
        compact(s.reconnects)
    )
}

/// A count in at most 6 columns: `999`, `12.3k`, `4.5M`, up to `18.4E`.
fn compact(v: u64) -> String {
    if v < 1_000 {
        return v.to_string();
    }
    let mut x = v as f64;
    for unit in ["k", "M", "G", "T", "P", "E"] {
        x /= 1_000.0;
        if x < 999.95 {
            return format!("{x:.1}{unit}");
        }
    }
    format!("{x:.1}E")
}

fn payload(i: u64) -> Bytes {
    Bytes::from(format!("message {i}"))
}

pub(crate) fn finish(summary: serde_json::Value, path: Option<&str>) -> anyhow::Result<()> {
    say!("\nsummary");
    if let Some(map) = summary.as_object() {
        for (k, v) in map {
            say!("  {k:<32} {v}");
        }
    }
    if let Some(path) = path {
        std::fs::write(path, serde_json::to_string_pretty(&summary)? + "\n")
            .with_context(|| format!("writing {path}"))?;
        say!("  (written to {path})");
    }
    Ok(())
}

/// The demo's seeded generator (egress-reactive's xorshift64): every
/// schedule it draws is reproducible from `--seed`.
pub(crate) struct Xorshift(egress_reactive::Xorshift);

impl Xorshift {
    pub(crate) fn new(seed: u64) -> Self {
        Xorshift(egress_reactive::Xorshift::new(seed))
    }

    /// The next draw, in `0..n` (`n` at least 1).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0.next_u64() % n.max(1)
    }
}

/// Where the one-process run kills the connection: after these message
/// indices, drawn from `seed` with gaps uniform in `[1, 2 * every]`. The
/// points depend on nothing else, so a run is reproducible.
fn kill_points(seed: u64, every: u64, messages: u64) -> Vec<u64> {
    let mut rng = Xorshift::new(seed);
    let (mut at, mut points) = (0u64, Vec::new());
    loop {
        at = at.saturating_add(1 + rng.below(every.saturating_mul(2).max(1)));
        if at >= messages {
            return points;
        }
        points.push(at);
    }
}

/// Enqueues messages `range` at `rate` per second (or as fast as the cell
/// takes them), in chunks; before message `points[k]` is enqueued, kills
/// the proxy's connection (waiting for one to be open).
async fn enqueue_paced(
    cell: &AsyncEgressCell<Bytes>,
    range: std::ops::Range<u64>,
    rate: Option<u64>,
    kill: Option<(&ChaosProxy, &[u64])>,
) {
    const TICK: Duration = Duration::from_millis(10);
    let started = tokio::time::Instant::now();
    let (mut next, mut points) = (range.start, kill.map_or(&[][..], |(_, p)| p));
    while next < range.end {
        if let Some((proxy, _)) = kill
            && points.first().is_some_and(|&p| p <= next)
        {
            proxy.kill_next().await;
            points = &points[1..];
            continue;
        }
        // How far the pace allows by now, at most a chunk of 1,000, and not
        // past the next kill point.
        let due = rate.map_or(u64::MAX, |r| {
            let elapsed = started.elapsed().as_micros().saturating_mul(u128::from(r)) / 1_000_000;
            range.start.saturating_add(u64::try_from(elapsed).unwrap_or(u64::MAX))
        });
        let stop = points.first().copied().unwrap_or(u64::MAX);
        let end = due.min(next.saturating_add(1_000)).min(range.end).min(stop);
        if end > next {
            cell.enqueue_all((next..end).map(payload));
            next = end;
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(TICK).await;
        }
    }
}

/// Ends a one-process run: its summary (`fields`, and the time, rate and
/// what the cell still holds), and an error unless delivery was exactly
/// once and in order.
fn finish_run(
    o: &Options,
    cell: &AsyncEgressCell<Bytes>,
    elapsed: Duration,
    mut fields: serde_json::Value,
    exactly_once: bool,
) -> anyhow::Result<()> {
    if let Some(map) = fields.as_object_mut() {
        map.insert("seconds".into(), json!(elapsed.as_secs_f64()));
        map.insert("messages_per_second".into(), json!((o.messages as f64 / elapsed.as_secs_f64()).round()));
        let left = cell.pending_len().get() + cell.inflight_len().get() + cell.parked_len().get();
        map.insert("left_pending_inflight_parked".into(), json!(left));
    }
    finish(fields, o.summary_json.as_deref())?;
    if !exactly_once {
        bail!("delivery was not exactly once and in order");
    }
    Ok(())
}

/// What the opening line says of the chaos.
fn chaos_note(o: &Options, points: &[u64]) -> String {
    if o.chaos {
        format!("(chaos: {} kills, about one every {} messages, seed {})", points.len(), o.kill_every, o.seed)
    } else {
        "(no chaos)".into()
    }
}

/// The one-process run's cell (its jitter seeded by `--seed`) and context.
fn demo_cell(o: &Options) -> anyhow::Result<(AsyncContext, AsyncEgressCell<Bytes>)> {
    let cx = AsyncContext::new();
    let options = egress_reactive::CellOptions::new().jitter_seed(o.seed);
    let cell = AsyncEgressCell::with_options(&cx, policy()?, options);
    Ok((cx, cell))
}

async fn together(o: Options) -> anyhow::Result<()> {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await?;
    let proxy = ChaosProxy::start(receiver.local_addr(), None).await?;
    let points = if o.chaos { kill_points(o.seed, o.kill_every, o.messages) } else { Vec::new() };
    say!(
        "egress-demo: {} messages{}, receiver on {}, sender through {} {}",
        o.messages,
        o.rate.map(|r| format!(" at {r}/s")).unwrap_or_default(),
        receiver.local_addr(),
        proxy.local_addr(),
        chaos_note(&o, &points)
    );
    let (cx, cell) = demo_cell(&o)?;
    let (bar, _effect, retries) = progress(&cx, &cell, o.messages);
    let started = Instant::now();
    let sender = Sender::spawn(cell.clone(), format!("ws://{}", proxy.local_addr()), sender_config(o.seed))?;
    // The application side: check every delivery as it comes.
    let n = o.messages;
    let check = tokio::spawn(async move {
        let (mut next, mut out_of_order) = (0u64, 0u64);
        while next < n {
            let d = receiver.recv().await;
            if d.sequence != next || d.payload() != Some(&payload(next)) {
                out_of_order += 1;
            }
            next = d.sequence + 1;
        }
        (next, out_of_order, receiver)
    });
    enqueue_paced(&cell, 0..o.messages, o.rate, Some((&proxy, &points))).await;
    let (received, out_of_order, receiver) = check.await?;
    while cell.acked_through().get_untracked().map_or(0, |s| s.get() + 1) < o.messages {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    bar.finish();
    let stats = sender.shutdown().await;
    let r = receiver.stats();
    let exactly_once = received == o.messages && out_of_order == 0 && r.delivered == o.messages;
    finish_run(
        &o,
        &cell,
        elapsed,
        json!({
            "messages": o.messages,
            "delivered": r.delivered,
            "exactly_once_in_order": exactly_once,
            "duplicates_dropped_by_receiver": r.duplicates,
            "connections_killed": proxy.kills(),
            "kill_points": points,
            "reconnects": stats.reconnects,
            "retries": retries.load(Ordering::Relaxed),
        }),
        exactly_once,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use indicatif::{InMemoryTerm, ProgressDrawTarget};

    #[test]
    fn the_sender_runs_with_the_documented_timeouts() {
        // docs/protocol.md: connect timeout 5 s, stall timeout 5 s.
        let demo = sender_config(1);
        assert_eq!(demo.stall_timeout, Some(Duration::from_secs(5)));
        assert_eq!(demo.connect_timeout, Duration::from_secs(5));
        assert_eq!((demo.backoff_base, demo.backoff_max), (Duration::from_millis(5), Duration::from_millis(500)));
    }

    #[test]
    fn counts_take_at_most_six_columns() {
        for (v, text) in [(0, "0"), (999, "999"), (1_000, "1.0k"), (12_345, "12.3k"), (999_949, "999.9k")] {
            assert_eq!(compact(v), text);
        }
        assert_eq!(compact(999_950), "1.0M", "rounding up to the next unit, not to 1000.0k");
        assert_eq!(compact(u64::MAX), "18.4E");
        let mut v = 1u64;
        while let Some(next) = v.checked_mul(7) {
            assert!(compact(v).len() <= 6, "{v}: {}", compact(v));
            assert!(compact(v - 1).len() <= 6, "{}: {}", v - 1, compact(v - 1));
            v = next;
        }
    }

    #[test]
    fn the_progress_line_fits_80_columns() {
        // Rendered on a terminal wider than needed, so a line too long
        // shows its length rather than wrapping or being cut.
        let term = InMemoryTerm::new(4, 200);
        let bar = ProgressBar::with_draw_target(Some(u64::MAX), ProgressDrawTarget::term_like(Box::new(term.clone())));
        bar.set_style(bar_style());
        for (n, r) in [(u64::MAX, u64::MAX), (99_999, 9), (123_456_789, 1_234), (0, 0)] {
            let big = usize::try_from(n).unwrap_or(usize::MAX);
            bar.set_position(n / 2);
            bar.set_message(status_line(Status { acked: n, sending: big, queued: big, retrying: big, reconnects: r }));
            bar.tick();
            let screen = term.contents();
            let line = screen.lines().find(|l| !l.trim().is_empty()).unwrap_or_default().trim_end().to_owned();
            assert!(line.contains("reconn"), "rendered: {screen:?}");
            assert!(line.chars().count() <= 80, "{} columns: {line:?}", line.chars().count());
            term.reset();
        }
    }
}
