//! `egress-demo http`: a chat client's outgoing queue (durable lanes on
//! SQLite, sent by `egress-http`) to a homeserver with seeded chaos, the
//! client process SIGKILLed and started again at random moments; then the
//! homeserver's record is checked.
//!
//! The client sends a plan of messages drawn from the seed: room messages
//! (one serial lane per room), to-device messages (one serial lane),
//! account-data writes (one strict lane) and unordered calls (one lane with
//! a window). Message `i` takes ordinal `i`: a restarted client restores the
//! lanes and enqueues from the stored next ordinal on (a message enqueued
//! but not yet durable when the process died was never sent, and is
//! enqueued again under the same ordinal). What must hold, and is checked
//! on what the homeserver applied:
//!
//! - every message applied exactly once (by its idempotency key
//!   `demo:INCARNATION:ORDINAL`, whose ordinal is the message's index);
//! - each room's messages, the to-device messages and the account-data
//!   writes applied in their order;
//! - never two requests of a room, of the to-device lane or of the
//!   account-data lane in flight at once, and never more unordered calls
//!   than their window.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use egress_core::{Delay, LaneKey, LaneKind, LanesPolicy, Policy};
use egress_http::homeserver::{Chaos, Homeserver};
use egress_http::{HttpCodec, HttpConfig, HttpRequest, HttpSender, Method};
use egress_reactive::{AsyncContext, CellOptions};
use egress_store::{RelayConfig, open_durable_lanes};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::process::Command;

use crate::{Xorshift, finish, say};

/// `http`: the parent (homeserver, kills, check).
#[derive(Debug, Args)]
pub(crate) struct HttpArgs {
    /// How many messages the client sends.
    #[arg(long, default_value_t = 3_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    messages: u64,
    /// How many rooms (one serial lane each).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(1..=64))]
    rooms: u64,
    /// How many unordered calls may be in flight at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    window: u64,
    /// How many times the client is killed (SIGKILL) and started again.
    #[arg(long, default_value_t = 3)]
    kills: u64,
    /// The mean time between kills, in milliseconds.
    #[arg(long, default_value_t = 500)]
    kill_ms: u64,
    /// Seeds the plan, the homeserver's chaos and the kill schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The client's database (default: a new file in the temp directory,
    /// removed at the end).
    #[arg(long, value_name = "PATH")]
    db: Option<PathBuf>,
    /// Also write the summary as JSON to this file.
    #[arg(long, value_name = "PATH")]
    summary_json: Option<String>,
}

/// `http-client`: one client process (started by `http`).
#[derive(Debug, Args)]
pub(crate) struct HttpClientArgs {
    /// The homeserver's base URL.
    #[arg(long)]
    url: String,
    /// The client's database.
    #[arg(long)]
    db: PathBuf,
    #[arg(long)]
    messages: u64,
    #[arg(long)]
    rooms: u64,
    #[arg(long)]
    window: u64,
    #[arg(long)]
    seed: u64,
}

/// The client's lanes: what a Matrix client's outgoing queue has.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
enum Lane {
    Room(u64),
    ToDevice,
    AccountData,
    Other,
}

/// The unordered lane's window, set once per process from the command line
/// (a lane's kind is a function of its key alone).
static WINDOW: std::sync::OnceLock<NonZeroUsize> = std::sync::OnceLock::new();

impl LaneKey for Lane {
    fn kind(&self) -> LaneKind {
        match self {
            Lane::Room(_) | Lane::ToDevice => LaneKind::Serial,
            Lane::AccountData => LaneKind::Strict,
            Lane::Other => LaneKind::Unordered(*WINDOW.get().unwrap_or(&NonZeroUsize::MIN)),
        }
    }
}

/// Message `i` of the plan: its lane and its request.
fn message(seed: u64, rooms: u64, i: u64) -> (Lane, HttpRequest) {
    let mut rng = Xorshift::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i.wrapping_add(1));
    let lane = match rng.below(10) {
        0..=5 => Lane::Room(rng.below(rooms)),
        6 => Lane::ToDevice,
        7 => Lane::AccountData,
        _ => Lane::Other,
    };
    let path = match &lane {
        Lane::Room(r) => format!("rooms/r{r}/send/m.room.message/{i}"),
        Lane::ToDevice => format!("sendToDevice/m.room.encrypted/{i}"),
        Lane::AccountData => format!("user/me/account_data/m.setting/{i}"),
        Lane::Other => format!("misc/call/{i}"),
    };
    let request = HttpRequest::json(Method::PUT, path, &json!({ "i": i })).expect("a JSON body");
    (lane, request)
}

/// The class of a lane's paths at the homeserver (see its docs).
fn class(lane: &Lane) -> String {
    match lane {
        Lane::Room(r) => format!("rooms/r{r}/send/m.room.message"),
        Lane::ToDevice => "sendToDevice/m.room.encrypted".into(),
        Lane::AccountData => "user/me/account_data/m.setting".into(),
        Lane::Other => "misc/call".into(),
    }
}

/// The client: restores the lanes, starts the sender, enqueues what the
/// store does not hold yet, and exits once everything is acknowledged.
pub(crate) async fn client(a: HttpClientArgs) -> anyhow::Result<()> {
    let _ = WINDOW.set(NonZeroUsize::new(usize::try_from(a.window)?).context("a window of 0")?);
    let cx = AsyncContext::new();
    // A quicker backoff than an HTTP API's (`HttpConfig::policy`), so that
    // a run with a few percent of failures takes seconds.
    let base =
        Policy::builder().retry_base(Delay(20)).retry_ceiling(Delay(400)).jitter(1.0).retry_budget(1_000).build()?;
    let policy =
        LanesPolicy::new(base, usize::try_from(a.rooms)? + 3)?.inflight_cap(NonZeroUsize::new(16).context("a cap")?);
    let relay = RelayConfig { retry_base: Duration::from_millis(5), ..RelayConfig::default() };
    let durable = open_durable_lanes(&cx, &a.db, "client", HttpCodec, policy, CellOptions::new(), relay)
        .await
        .context("opening the client's lanes")?;
    let cell = durable.cell.clone();
    let config = HttpConfig::new(&a.url)?.producer("demo")?.timeout(Duration::from_secs(2));
    let sender = HttpSender::start(&cell, config)?;
    let from = cell.with_lanes(|l| l.next_ordinal().0);
    say!("client: {from} of {} messages stored; enqueuing the rest", a.messages);
    for i in from..a.messages {
        let (lane, request) = message(a.seed, a.rooms, i);
        let enqueued = cell.enqueue(lane, request).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        if enqueued.ordinal.0 != i {
            bail!("message {i} took ordinal {}", enqueued.ordinal.0);
        }
        // Paced, so that a kill finds some of it enqueued and not stored.
        if i % 8 == 7 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    // Until everything is acknowledged (the relay's shutdown then writes
    // the last acknowledgements).
    while cell.with_lanes(|l| l.pending_len() + l.inflight_len() + l.parked_len() + l.unpersisted_len()) > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = sender.shutdown().await;
    let relay = durable.relay.shutdown().await;
    say!("client: done ({} completed, {} retried, {} commits)", stats.completed, stats.retried, relay.commits);
    Ok(())
}

/// The parent: the homeserver, the client processes and their kills, the
/// check.
pub(crate) async fn run(a: HttpArgs) -> anyhow::Result<()> {
    let chaos = Chaos {
        seed: a.seed,
        rate_limited: 0.05,
        retry_after_ms: 20,
        server_error: 0.05,
        drop_before: 0.03,
        drop_after: 0.03,
        slow: 0.0,
        slow_for: Duration::ZERO,
    };
    let server = Homeserver::start(chaos).await.context("starting the homeserver")?;
    let (db, temporary) = match &a.db {
        Some(db) => (db.clone(), false),
        None => {
            let name = format!("egress-demo-http-{}-{}.db", std::process::id(), a.seed);
            (std::env::temp_dir().join(name), true)
        }
    };
    say!(
        "egress-demo http: {} messages over {} rooms, to-device, account data and unordered calls (window {}); \
         the client killed {} times about every {} ms (seed {}); homeserver at {}",
        a.messages,
        a.rooms,
        a.window,
        a.kills,
        a.kill_ms,
        a.seed,
        server.url()
    );
    let started = Instant::now();
    let spawn = || -> anyhow::Result<tokio::process::Child> {
        Command::new(std::env::current_exe().context("the demo's own path")?)
            .arg("http-client")
            .args(["--url", &server.url(), "--db"])
            .arg(&db)
            .args(["--messages", &a.messages.to_string(), "--rooms", &a.rooms.to_string()])
            .args(["--window", &a.window.to_string(), "--seed", &a.seed.to_string()])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting a client")
    };
    let mut rng = Xorshift::new(a.seed ^ 0x6b69_6c6c);
    let mut killed = 0;
    let mut finished_early = 0;
    while killed < a.kills {
        let mut child = spawn()?;
        let wait = Duration::from_millis(a.kill_ms / 2 + rng.below(a.kill_ms.max(1)));
        tokio::select! {
            status = child.wait() => {
                // It finished before its kill: nothing left to kill.
                let status = status?;
                if !status.success() {
                    bail!("a client failed: {status}");
                }
                finished_early += 1;
                break;
            }
            () = tokio::time::sleep(wait) => {
                child.start_kill().context("SIGKILL")?;
                let _ = child.wait().await;
                killed += 1;
                say!("  client killed ({killed}) after {} ms; {} applied so far", wait.as_millis(), server.applied().len());
            }
        }
    }
    if finished_early == 0 {
        let mut child = spawn()?;
        let status = tokio::time::timeout(Duration::from_secs(300), child.wait())
            .await
            .context("the last client did not finish within 5 minutes")??;
        if !status.success() {
            bail!("the last client failed: {status}");
        }
    }
    let elapsed = started.elapsed();
    let summary = check(&a, &server, killed, elapsed);
    if temporary {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
        }
    }
    let ok = summary["ok"] == true;
    finish(summary, a.summary_json.as_deref())?;
    if !ok {
        bail!("the check failed (see the summary)");
    }
    Ok(())
}

/// What the homeserver applied, against the rules.
fn check(a: &HttpArgs, server: &Homeserver, killed: u64, elapsed: Duration) -> serde_json::Value {
    let applied = server.applied();
    let mut seen = vec![0u32; usize::try_from(a.messages).unwrap_or(0)];
    let (mut wrong_key, mut foreign) = (0u64, 0u64);
    let mut incarnations = std::collections::BTreeSet::new();
    let mut order: BTreeMap<Lane, Vec<u64>> = BTreeMap::new();
    for record in &applied {
        let i = serde_json::from_slice::<serde_json::Value>(&record.body).ok().and_then(|v| v["i"].as_u64());
        let Some(i) = i.filter(|i| *i < a.messages) else {
            foreign += 1;
            continue;
        };
        let mut parts = record.key.split(':');
        let (producer, incarnation, ordinal) = (parts.next(), parts.next(), parts.next());
        if producer != Some("demo") || ordinal.and_then(|o| o.parse::<u64>().ok()) != Some(i) {
            wrong_key += 1;
        }
        incarnations.extend(incarnation.map(str::to_owned));
        if let Some(slot) = usize::try_from(i).ok().and_then(|i| seen.get_mut(i)) {
            *slot += 1;
        }
        let (lane, _) = message(a.seed, a.rooms, i);
        order.entry(lane).or_default().push(i);
    }
    let missing = seen.iter().filter(|n| **n == 0).count();
    let twice = seen.iter().filter(|n| **n > 1).count();
    let out_of_order: u64 = order
        .iter()
        .filter(|(lane, _)| !matches!(lane, Lane::Other))
        .map(|(_, is)| is.windows(2).filter(|w| w[0] > w[1]).count() as u64)
        .sum();
    let most = server.most_in_flight();
    let mut serial_most = 0;
    let mut unordered_most = 0;
    for lane in order.keys() {
        let n = most.get(&class(lane)).copied().unwrap_or(0);
        match lane {
            Lane::Other => unordered_most = unordered_most.max(n),
            _ => serial_most = serial_most.max(n),
        }
    }
    let window = usize::try_from(a.window).unwrap_or(usize::MAX);
    let ok = missing == 0
        && twice == 0
        && wrong_key == 0
        && foreign == 0
        && incarnations.len() == 1
        && out_of_order == 0
        && serial_most <= 1
        && unordered_most <= window;
    json!({
        "ok": ok,
        "messages": a.messages,
        "applied": applied.len(),
        "missing": missing,
        "applied_twice": twice,
        "keys_not_their_ordinal": wrong_key,
        "incarnations": incarnations.len(),
        "out_of_order": out_of_order,
        "most_in_flight_serial_lane": serial_most,
        "most_in_flight_unordered": unordered_most,
        "unordered_window": a.window,
        "client_kills": killed,
        "requests": server.requests(),
        "duplicates_recognized": server.duplicates(),
        "elapsed_ms": u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
        "seed": a.seed,
    })
}
