//! Side-by-side benchmarks of egress against peer signal libraries.
//!
//! `cargo run --release -p egress-bench -- reactivity` runs the reactivity
//! suite (`shared/benchmarks/reactivity-suite.md`) against our three
//! flavours and the peers, one child process per (library, test) with a
//! time limit, and prints a markdown table. `--quick` runs every assertion
//! at reduced sizes (what CI runs). See `--help`.

mod adapters;
mod alloc;
mod cells;
mod durable;
mod http;
mod nats;
mod pg;
mod prng;
mod queued;
mod spill;
mod suite;
mod ws;

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

#[global_allocator]
static GLOBAL: alloc::Counting = alloc::Counting;

suite::suite!(egress_context, crate::adapters::EgressLocal);
suite::suite!(egress_thread_safe, crate::adapters::EgressThreadSafe);
suite::suite!(egress_async, crate::adapters::EgressAsync);
suite::suite!(egress_copy, crate::adapters::EgressCopy);
suite::suite!(lazily_context, crate::adapters::LazilyLocal);
suite::suite!(lazily_thread_safe, crate::adapters::LazilyThreadSafe);
suite::suite!(alien, crate::adapters::Alien);
suite::suite!(sycamore, crate::adapters::Sycamore);
suite::suite!(leptos, crate::adapters::Leptos);

type Runner = fn(&str, &suite::Opts) -> Result<suite::Score, String>;

/// Libraries in column order: ours first.
const LIBS: &[(&str, &str, Runner)] = &[
    ("egress", egress_context::NAME, egress_context::run),
    ("egress-ts", egress_thread_safe::NAME, egress_thread_safe::run),
    ("egress-async", egress_async::NAME, egress_async::run),
    ("egress-copy", egress_copy::NAME, egress_copy::run),
    ("lazily", lazily_context::NAME, lazily_context::run),
    ("lazily-ts", lazily_thread_safe::NAME, lazily_thread_safe::run),
    ("alien", alien::NAME, alien::run),
    ("sycamore", sycamore::NAME, sycamore::run),
    ("leptos", leptos::NAME, leptos::run),
];

/// Columns run only when `--libs` names them: egress-copy is a question
/// (what `Copy` handles would cost), not a library; compare it with
/// `--libs egress,egress-copy`.
const OPT_IN: &[&str] = &["egress-copy"];

const HELP: &str = "\
egress-bench: side-by-side benchmarks

USAGE:
  egress-bench reactivity [--quick] [--tests A,B] [--libs X,Y] [--timeout SECS] [--best-of N]
  egress-bench child LIB TEST [--quick]     (one measurement; used by `reactivity`)
  egress-bench cells [--sizes N,M] [--libs X,Y] [--timeout SECS]
  egress-bench cells-child LIB N [RUNS]      (one measurement; used by `cells`)
  egress-bench list-tests                    (the reactivity suite's tests, one per line)
  egress-bench ws [--messages N] [--runs K]
  egress-bench ws-child plain|split|egress N (one run of one path, for callgrind)
  egress-bench durable [--appends N] [--groups G,H] [--messages M] [--runs K] [--dir PATH]
  egress-bench pg [--url URL] [--messages N] [--runs K] [--batch B]
  egress-bench nats [--url URL] [--messages N] [--runs K]
  egress-bench http [--requests N] [--runs K]
  egress-bench spill [--ops N] [--dir PATH]
  egress-bench spill-child N DIR             (one measurement; used by `spill`)
  egress-bench queued [--n N] [--reads K]
  egress-bench queued-child LIB N            (one measurement; used by `queued`)
  egress-bench queued-reads-child LIB N K    (one measurement; used by `queued`)

  --quick     assertions at reduced sizes, one repetition (what CI runs)
  --tests     comma-separated test names or prefixes (default: all)
  --libs      comma-separated library keys (default: all): egress, egress-ts,
              egress-async, lazily, lazily-ts, alien, sycamore, leptos; and,
              only when named, egress-copy (egress Context behind Copy
              handles: what they would cost)
  --timeout   seconds per (library, test) before it is reported TIMEOUT (default 10)
  --best-of   run each (library, test) N times, keep the best (damps a noisy host; default 1)

cells: ns per envelope through each egress cell (enqueue, attached effect
sends, ack every 32, one UI effect on the pending count) at each size
(default 1000,1000000); libraries: core, lanes-1, lanes-16, lanes-1000
(egress_core::Lanes with that many unordered lanes, a cap of one window
across them, completed 32 at a time), egress, egress-ts, egress-async,
lazily, lazily-ts, lazily-async; --timeout defaults to 60 s.

spill: peak RSS of N RawFifo ops (default 10,000,000) through a RelayCell
with Overflow::Spill over a SqliteSpill into an EgressCell delivering one
record per two ops sent, against the same run of 1,000 ops (each run its
own process; every op checked delivered once, in order).

queued: bytes per queued envelope: N u64 payloads (default 1,000,000)
enqueued and left queued in the bare core and in each cell, against a
VecDeque<u64> filled one push at a time; each its own process, reading
its resident set (VmRSS) and the allocator's net bytes before and after.
Then what a read of the pending list costs at N queued: K reads (default
100), each after one more enqueue, in EgressCell and ThreadSafeEgressCell
against a copy of the core's pending list per read.

http: requests per second over loopback HTTP to the homeserver: the egress
path (AsyncLanesCell + HttpSender, 32 serial lanes) against a plain reqwest
loop keeping 32 requests open, alternating, best of K runs (default 5) of N
requests (default 20000); each checks the server applied every request once.

ws: messages per second over loopback WebSocket (window 256): the egress
cell path (AsyncEgressCell + Sender) against plain tokio-tungstenite loops
(one task; a reader and a writer task) sending the same frames and reading
the same acks, alternating, best of K
runs (default 5) of N messages (default 200000); and the time from a killed
connection to the first replayed frame acknowledged (median of K).

durable: appends per second on SQLite (WAL, synchronous=FULL, 64-byte
payloads): egress's journal and store (a core, SqliteStore::apply per
group) against a plain rusqlite loop making the same inserts and counter
update in the same groups, alternating, K runs (default 5) of N appends
(default 20000) per group size (default 1,64); the median and p99 of each
commit; and durable messages per second end to end over loopback WebSocket
(M messages, default 100000, the relay grouping commits as they come).
--dir: where the databases go (default the system's temporary directory).

nats: messages per second into a JetStream stream (--url or
EGRESS_NATS_URL; a fresh stream of one subject per run), the egress path
(AsyncEgressCell + egress_nats::Publisher, window 256) against a plain
async-nats loop publishing the same messages with the same headers (message
id, expected-sequence fence, stamp) and at most 256 acknowledgements
outstanding, each awaited; alternating, best of K runs (default 3) of N
messages (default 100000). Each run checks the stream holds N messages.

Repetitions within a test stop after a 3 s budget (the fastest of those
completed counts), so slow libraries do not stretch the run.
";

/// `pg`: records drained per second through egress's PostgreSQL workers
/// against a plain `SKIP LOCKED` loop, 1 and 4 workers, 1 and 64 streams.
fn pg_table(args: &[String]) -> anyhow::Result<()> {
    let (mut url, mut n, mut runs, mut batch) = (std::env::var("EGRESS_PG_URL").ok(), 20_000u64, 3usize, 64usize);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--url" => url = Some(it.next().context("--url needs a value")?.clone()),
            "--messages" => n = it.next().context("--messages needs a value")?.parse()?,
            "--runs" => runs = it.next().context("--runs needs a value")?.parse::<usize>()?.max(1),
            "--batch" => batch = it.next().context("--batch needs a value")?.parse::<usize>()?.max(1),
            other => bail!("unknown option {other:?}\n\n{HELP}"),
        }
    }
    let url = url.context("pg needs --url or EGRESS_PG_URL")?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    println!(
        "| workers | streams | plain SKIP LOCKED records/s (best of {runs}) | egress records/s | egress / plain |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for (workers, streams) in [(1u64, 1u64), (1, 64), (4, 1), (4, 64)] {
        let (mut best_plain, mut best_egress) = (Duration::MAX, Duration::MAX);
        for run in 0..runs {
            let p = rt.block_on(pg::plain(&url, n, streams, workers, i64::try_from(batch)?))?;
            let e = rt.block_on(pg::egress(&url, n, streams, workers, batch))?;
            eprintln!(
                "{workers} workers, {streams} streams, run {run}: plain {:.0}/s, egress {:.0}/s",
                n as f64 / p.as_secs_f64(),
                n as f64 / e.as_secs_f64()
            );
            best_plain = best_plain.min(p);
            best_egress = best_egress.min(e);
        }
        println!(
            "| {workers} | {streams} | {:.0} | {:.0} | {:.2}x |",
            n as f64 / best_plain.as_secs_f64(),
            n as f64 / best_egress.as_secs_f64(),
            best_plain.as_secs_f64() / best_egress.as_secs_f64()
        );
    }
    Ok(())
}

/// The NATS JetStream table: messages per second, the egress publisher
/// against a plain async-nats loop with the same acknowledgement
/// discipline, alternating, best of K.
fn nats_table(args: &[String]) -> anyhow::Result<()> {
    let mut url = std::env::var("EGRESS_NATS_URL").ok();
    let mut n = 100_000u64;
    let mut runs = 3usize;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--url" => url = Some(it.next().context("--url needs a value")?.clone()),
            "--messages" => n = it.next().context("--messages needs a value")?.parse::<u64>()?.max(1),
            "--runs" => runs = it.next().context("--runs needs a value")?.parse::<usize>()?.max(1),
            other => bail!("unknown option {other:?}\n\n{HELP}"),
        }
    }
    let url = url.context("nats needs --url or EGRESS_NATS_URL")?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (mut best_plain, mut best_egress) = (Duration::MAX, Duration::MAX);
    for run in 0..runs {
        let p = rt.block_on(nats::plain(&url, n))?;
        let e = rt.block_on(nats::egress(&url, n))?;
        eprintln!("run {run}: plain {:.0} msg/s, egress {:.0} msg/s", rate(n, p), rate(n, e));
        best_plain = best_plain.min(p);
        best_egress = best_egress.min(e);
    }
    println!("| path | messages/s (best of {runs}, {n} messages, window {}) | egress / plain |", nats::WINDOW);
    println!("|---|---:|---:|");
    println!("| plain async-nats loop, same headers and fence | {:.0} | |", rate(n, best_plain));
    println!(
        "| egress AsyncEgressCell + Publisher | {:.0} | {:.2}x |",
        rate(n, best_egress),
        best_plain.as_secs_f64() / best_egress.as_secs_f64()
    );
    println!("\nRun of {}.", date());
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("reactivity") => reactivity(&args[1..]),
        Some("child") => child(&args[1..]),
        Some("cells") => cells_table(&args[1..]),
        Some("cells-child") => cells_child(&args[1..]),
        Some("list-tests") => {
            suite::TESTS.iter().for_each(|t| println!("{t}"));
            Ok(())
        }
        Some("ws") => ws_table(&args[1..]),
        Some("ws-child") => ws_child(&args[1..]),
        Some("durable") => durable_table(&args[1..]),
        Some("pg") => pg_table(&args[1..]),
        Some("nats") => nats_table(&args[1..]),
        Some("http") => http_table(&args[1..]),
        Some("spill") => spill::table(&args[1..]),
        Some("spill-child") => spill::child(&args[1..]),
        Some("queued") => queued::table(&args[1..]),
        Some("queued-child") => queued::child(&args[1..]),
        Some("queued-reads-child") => queued::reads_child(&args[1..]),
        Some("--help") | Some("-h") | None => {
            print!("{HELP}");
            Ok(())
        }
        Some(other) => bail!("unknown command {other:?}\n\n{HELP}"),
    }
}

/// Runs one test of one library in this process and prints `OK best median`
/// or `FAIL reason` on stdout.
fn child(args: &[String]) -> anyhow::Result<()> {
    let [lib, test, rest @ ..] = args else { bail!("usage: child LIB TEST [--quick]") };
    let opts = suite::Opts { quick: rest.iter().any(|a| a == "--quick") };
    let (_, _, run) = LIBS.iter().find(|(k, _, _)| k == lib).with_context(|| format!("unknown library {lib:?}"))?;
    std::panic::set_hook(Box::new(|_| {}));
    let outcome = std::panic::catch_unwind(|| run(test, &opts));
    let line = match outcome {
        Ok(Ok(s)) => format!("OK {} {}", s.best.as_nanos(), s.median.map_or(0, |m| m.as_nanos())),
        Ok(Err(e)) => format!("FAIL {e}"),
        Err(panic) => format!("FAIL {}", panic_message(&*panic)),
    };
    println!("{line}");
    Ok(())
}

enum Cell {
    Time(Duration, Option<Duration>),
    Fail(String),
    Timeout,
}

fn reactivity(args: &[String]) -> anyhow::Result<()> {
    let mut quick = false;
    let mut tests: Vec<String> = Vec::new();
    let mut libs: Vec<String> = Vec::new();
    let mut timeout = Duration::from_secs(10);
    let mut best_of = 1;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--tests" => tests = it.next().context("--tests needs a value")?.split(',').map(str::to_owned).collect(),
            "--libs" => libs = it.next().context("--libs needs a value")?.split(',').map(str::to_owned).collect(),
            "--timeout" => timeout = Duration::from_secs(it.next().context("--timeout needs a value")?.parse()?),
            "--best-of" => best_of = it.next().context("--best-of needs a value")?.parse::<usize>()?.max(1),
            other => bail!("unknown option {other:?}\n\n{HELP}"),
        }
    }
    let selected_tests: Vec<&str> = suite::TESTS
        .iter()
        .copied()
        .filter(|t| tests.is_empty() || tests.iter().any(|p| t.starts_with(p.as_str())))
        .collect();
    let selected_libs: Vec<_> = LIBS
        .iter()
        .filter(|(k, _, _)| if libs.is_empty() { !OPT_IN.contains(k) } else { libs.iter().any(|l| l == k) })
        .collect();
    if selected_tests.is_empty() || selected_libs.is_empty() {
        bail!("nothing selected");
    }
    let exe = std::env::current_exe()?;
    let started = Instant::now();
    let mut table: Vec<Vec<Cell>> = Vec::new();
    let mut failures = 0;
    for test in &selected_tests {
        let mut row = Vec::new();
        for (key, _, _) in &selected_libs {
            eprint!("{test} / {key} ... ");
            let _ = std::io::stderr().flush();
            let mut cell = run_child(&exe, key, test, quick, timeout)?;
            for _ in 1..best_of {
                let again = run_child(&exe, key, test, quick, timeout)?;
                if let (Cell::Time(best, _), Cell::Time(t, _)) = (&cell, &again)
                    && t < best
                {
                    cell = again;
                }
            }
            match &cell {
                Cell::Time(t, _) => eprintln!("{:.3} ms", ms(*t)),
                Cell::Fail(e) => eprintln!("FAIL {e}"),
                Cell::Timeout => eprintln!("TIMEOUT"),
            }
            if key.starts_with("egress") && !matches!(cell, Cell::Time(..)) {
                failures += 1;
            }
            row.push(cell);
        }
        table.push(row);
    }
    print_table(&selected_tests, &selected_libs, &table);
    println!(
        "\nRun of {} in {:.0} s{}.",
        date(),
        started.elapsed().as_secs_f64(),
        if quick { " (--quick)" } else { "" }
    );
    if failures > 0 {
        bail!("{failures} egress measurement(s) failed");
    }
    Ok(())
}

fn run_child(exe: &std::path::Path, lib: &str, test: &str, quick: bool, timeout: Duration) -> anyhow::Result<Cell> {
    let mut cmd = Command::new(exe);
    cmd.args(["child", lib, test]).stdout(Stdio::piped()).stderr(Stdio::null());
    if quick {
        cmd.arg("--quick");
    }
    wait_child(cmd, timeout)
}

/// Runs a child to completion or `timeout`; parses its last line (`OK best
/// [median]` in ns, or `FAIL reason`).
fn wait_child(mut cmd: Command, timeout: Duration) -> anyhow::Result<Cell> {
    let mut child = cmd.spawn()?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            let mut out = String::new();
            std::io::Read::read_to_string(&mut child.stdout.take().context("stdout")?, &mut out)?;
            let line = out.lines().last().unwrap_or("");
            return Ok(if let Some(rest) = line.strip_prefix("OK ") {
                let mut nums = rest.split(' ').map(|n| n.parse::<u64>().unwrap_or(0));
                let best = Duration::from_nanos(nums.next().unwrap_or(0));
                let median = nums.next().filter(|&m| m > 0).map(Duration::from_nanos);
                Cell::Time(best, median)
            } else if let Some(reason) = line.strip_prefix("FAIL ") {
                Cell::Fail(reason.chars().take(120).collect())
            } else {
                Cell::Fail(format!("crashed ({status})"))
            });
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(Cell::Timeout);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn print_table(tests: &[&str], libs: &[&(&str, &str, Runner)], table: &[Vec<Cell>]) {
    print!("| test |");
    for (_, name, _) in libs {
        print!(" {name} |");
    }
    println!(" egress / best peer |");
    print!("|---|");
    for _ in libs {
        print!("---:|");
    }
    println!("---:|");
    for (test, row) in tests.iter().zip(table) {
        let bytes = test.starts_with("bytes/");
        print!("| {test} |");
        for cell in row {
            match cell {
                Cell::Time(t, _) if bytes => print!(" {} B |", t.as_nanos()),
                Cell::Time(t, Some(m)) => print!(" {:.2} (med {:.2}) |", ms(*t), ms(*m)),
                Cell::Time(t, None) => print!(" {:.2} |", ms(*t)),
                Cell::Fail(e) => print!(" FAIL: {} |", e.replace('|', "/")),
                Cell::Timeout => print!(" TIMEOUT |"),
            }
        }
        let ours = libs.iter().zip(row).find(|((k, _, _), _)| *k == "egress").and_then(|(_, c)| time(c));
        let best_peer =
            libs.iter().zip(row).filter(|((k, _, _), _)| !k.starts_with("egress")).filter_map(|(_, c)| time(c)).min();
        match (ours, best_peer) {
            (Some(o), Some(p)) if !p.is_zero() => println!(" {:.2}x |", o.as_secs_f64() / p.as_secs_f64()),
            _ => println!(" - |"),
        }
    }
    println!(
        "\nTimes in ms (kairo: fastest of 10 x 500 iterations, with the median; cellx and create/update: as the suite defines); bytes rows: bytes per node. Lower is better; a ratio below 1.00x means egress Context is faster than every peer."
    );
}

fn time(c: &Cell) -> Option<Duration> {
    match c {
        Cell::Time(t, _) => Some(*t),
        _ => None,
    }
}

/// Runs this binary as a child with `args` (its own process, so that a
/// measurement of memory sees only its own work) and returns the fields of
/// the `OK f1 f2 ...` line it prints.
fn child_fields(args: &[&str]) -> anyhow::Result<Vec<String>> {
    let out = std::process::Command::new(std::env::current_exe()?)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()?;
    let line = String::from_utf8(out.stdout)?;
    let Some(rest) = line.trim().strip_prefix("OK ") else { anyhow::bail!("{}: {line}", args.join(" ")) };
    Ok(rest.split(' ').map(str::to_owned).collect())
}

/// Field `i` of a child's line ([`child_fields`]), parsed; `what` names it
/// in the error.
fn field<N: std::str::FromStr>(fields: &[String], i: usize, what: &str) -> anyhow::Result<N>
where
    N::Err: std::error::Error + Send + Sync + 'static,
{
    Ok(fields.get(i).ok_or_else(|| anyhow::anyhow!("no {what} in {fields:?}"))?.parse()?)
}

/// A line of this process's `/proc/self/status` (`VmRSS`, `VmHWM`), in
/// bytes.
fn proc_status_bytes(key: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.strip_prefix(key).is_some_and(|r| r.starts_with(':')))
        .ok_or_else(|| anyhow::anyhow!("no {key} in /proc/self/status"))?;
    let kib: u64 = line.split_whitespace().nth(1).ok_or_else(|| anyhow::anyhow!("{key}"))?.parse()?;
    Ok(kib * 1024)
}

fn date() -> String {
    Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map_or_else(|| "unknown date".into(), |s| s.trim().to_owned())
}

/// `cells-child LIB N`: one cell measurement, printed as `OK nanos-per-envelope`.
fn cells_child(args: &[String]) -> anyhow::Result<()> {
    let [lib, n, rest @ ..] = args else { bail!("usage: cells-child LIB N [RUNS]") };
    // A fixed number of runs (for instruction counts under valgrind).
    let runs: Option<usize> = rest.first().map(|r| r.parse()).transpose().context("RUNS must be a number")?;
    let n: usize = n.parse().context("N must be a number")?;
    let (_, _, run) =
        cells::LIBS.iter().find(|(k, _, _)| k == lib).with_context(|| format!("unknown library {lib:?}"))?;
    std::panic::set_hook(Box::new(|_| {}));
    let budget = Duration::from_secs(if n >= 100_000 { 4 } else { 1 });
    let measured = std::panic::catch_unwind(|| match runs {
        Some(k) => (0..k.max(1)).map(|_| run(n)).min().unwrap_or_default(),
        None => cells::measure(*run, n, budget),
    });
    let line = match measured {
        Ok(t) => format!("OK {}", t.as_nanos() / n.max(1) as u128),
        Err(panic) => format!("FAIL {}", panic_message(&*panic)),
    };
    println!("{line}");
    Ok(())
}

/// `cells`: the cell benchmark table, one child process per (size, library).
fn cells_table(args: &[String]) -> anyhow::Result<()> {
    let mut sizes = vec![1_000usize, 1_000_000];
    let mut libs: Vec<String> = Vec::new();
    let mut timeout = Duration::from_secs(60);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--sizes" => {
                sizes = it
                    .next()
                    .context("--sizes needs a value")?
                    .split(',')
                    .map(|s| s.parse().context("sizes are numbers"))
                    .collect::<anyhow::Result<_>>()?
            }
            "--libs" => libs = it.next().context("--libs needs a value")?.split(',').map(str::to_owned).collect(),
            "--timeout" => timeout = Duration::from_secs(it.next().context("--timeout needs a value")?.parse()?),
            other => bail!("unknown option {other:?}\n\n{HELP}"),
        }
    }
    let selected: Vec<_> =
        cells::LIBS.iter().filter(|(k, _, _)| libs.is_empty() || libs.iter().any(|l| l == k)).collect();
    if selected.is_empty() {
        bail!("no library selected");
    }
    let exe = std::env::current_exe()?;
    let started = Instant::now();
    let mut failures = 0;
    print!("| queued |");
    for (_, name, _) in &selected {
        print!(" {name} |");
    }
    println!(" lazily / egress | egress-ts / egress |");
    print!("|---:|");
    for _ in &selected {
        print!("---:|");
    }
    println!("---:|---:|");
    for n in &sizes {
        let mut row: Vec<(&str, Cell)> = Vec::new();
        for (key, _, _) in &selected {
            eprint!("cells {n} / {key} ... ");
            let _ = std::io::stderr().flush();
            let cell = run_cells_child(&exe, key, *n, timeout)?;
            match &cell {
                Cell::Time(t, _) => eprintln!("{} ns/envelope", t.as_nanos()),
                Cell::Fail(e) => eprintln!("FAIL {e}"),
                Cell::Timeout => eprintln!("TIMEOUT"),
            }
            if key.starts_with("egress") && !matches!(cell, Cell::Time(..)) {
                failures += 1;
            }
            row.push((key, cell));
        }
        print!("| {n} |");
        for (_, cell) in &row {
            match cell {
                Cell::Time(t, _) => print!(" {} |", t.as_nanos()),
                Cell::Fail(e) => print!(" FAIL: {} |", e.replace('|', "/")),
                Cell::Timeout => print!(" TIMEOUT |"),
            }
        }
        let get = |k: &str| row.iter().find(|(key, _)| *key == k).and_then(|(_, c)| time(c));
        let ratio = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
            (Some(a), Some(b)) if !b.is_zero() => format!("{:.1}x", a.as_secs_f64() / b.as_secs_f64()),
            (None, Some(_)) => "> timeout".into(),
            _ => "-".into(),
        };
        println!(" {} | {} |", ratio(get("lazily"), get("egress")), ratio(get("egress-ts"), get("egress")));
    }
    println!(
        "\nns per envelope (best of repeated runs); window {}, ack every {}. Run of {} in {:.0} s; TIMEOUT: over {} s.",
        cells::WINDOW,
        cells::ACK_EVERY,
        date(),
        started.elapsed().as_secs_f64(),
        timeout.as_secs()
    );
    if failures > 0 {
        bail!("{failures} egress measurement(s) failed");
    }
    Ok(())
}

fn run_cells_child(exe: &std::path::Path, lib: &str, n: usize, timeout: Duration) -> anyhow::Result<Cell> {
    let mut cmd = Command::new(exe);
    cmd.args(["cells-child", lib, &n.to_string()]).stdout(Stdio::piped()).stderr(Stdio::null());
    wait_child(cmd, timeout)
}

/// `ws`: the WebSocket benchmark table.
fn durable_table(args: &[String]) -> anyhow::Result<()> {
    let (mut n, mut groups, mut messages, mut runs) = (20_000u64, vec![1u64, 64], 100_000u64, 5usize);
    let mut dir = std::env::temp_dir().join(format!("egress-bench-durable-{}", std::process::id()));
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--appends" => n = value()?.parse()?,
            "--groups" => groups = value()?.split(',').map(str::parse).collect::<Result<_, _>>()?,
            "--messages" => messages = value()?.parse()?,
            "--runs" => runs = value()?.parse::<usize>()?.max(1),
            "--dir" => dir = value()?.into(),
            other => bail!("unknown option {other:?}\n\n{HELP}"),
        }
    }
    std::fs::create_dir_all(&dir)?;
    println!(
        "| group | plain rusqlite rows/s (best of {runs}) | egress rows/s | egress / plain | plain commit p50 / p99 | egress commit p50 / p99 |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for &group in &groups {
        let group = group.max(1);
        let (mut best_plain, mut best_egress) = (Duration::MAX, Duration::MAX);
        let (mut plain_commits, mut egress_commits) = (Vec::new(), Vec::new());
        let mut ratios = Vec::new();
        for run in 0..runs {
            // Alternate which goes first: fsync cost drifts within minutes.
            let (p, e) = if run % 2 == 0 {
                let p = durable::plain(&dir, n, group);
                (p, durable::egress(&dir, n, group))
            } else {
                let e = durable::egress(&dir, n, group);
                (durable::plain(&dir, n, group), e)
            };
            eprintln!(
                "group {group} run {run}: plain {:.0} rows/s, egress {:.0} rows/s",
                rate(n, p.total),
                rate(n, e.total)
            );
            ratios.push(p.total.as_secs_f64() / e.total.as_secs_f64());
            best_plain = best_plain.min(p.total);
            best_egress = best_egress.min(e.total);
            plain_commits.extend(p.commits);
            egress_commits.extend(e.commits);
        }
        ratios.sort_by(f64::total_cmp);
        let q = |c: &mut Vec<Duration>, x| ms(durable::quantile(c, x));
        println!(
            "| {group} | {:.0} | {:.0} | {:.2}x (median of runs {:.2}x) | {:.2} / {:.2} ms | {:.2} / {:.2} ms |",
            rate(n, best_plain),
            rate(n, best_egress),
            best_plain.as_secs_f64() / best_egress.as_secs_f64(),
            ratios[ratios.len() / 2],
            q(&mut plain_commits, 0.5),
            q(&mut plain_commits, 0.99),
            q(&mut egress_commits, 0.5),
            q(&mut egress_commits, 0.99),
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (mut best_durable, mut best_memory) = (Duration::MAX, Duration::MAX);
    for run in 0..runs {
        let d = rt.block_on(durable::end_to_end(&dir, messages));
        let m = rt.block_on(ws::egress(messages));
        eprintln!(
            "end to end run {run}: durable {:.0} msg/s, in memory {:.0} msg/s",
            rate(messages, d),
            rate(messages, m)
        );
        best_durable = best_durable.min(d);
        best_memory = best_memory.min(m);
    }
    println!(
        "\nEnd to end over loopback WebSocket (window 256, {messages} messages of 64 bytes, best of {runs}): durable on SQLite {:.0} msg/s; the same cell in memory {:.0} msg/s (32-byte messages).",
        rate(messages, best_durable),
        rate(messages, best_memory)
    );
    println!("{n} appends of 64 bytes per group size; WAL, synchronous=FULL; run of {}.", date());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn http_table(args: &[String]) -> anyhow::Result<()> {
    let mut n = 20_000usize;
    let mut runs = 5usize;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--requests" => n = it.next().context("--requests needs a value")?.parse()?,
            "--runs" => runs = it.next().context("--runs needs a value")?.parse::<usize>()?.max(1),
            other => bail!("unknown option {other:?}\n\n{HELP}"),
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (mut egress, mut plain) = (Duration::MAX, Duration::MAX);
    for run in 0..runs {
        let p = rt.block_on(http::plain(n));
        let e = rt.block_on(http::egress(n));
        eprintln!("run {run}: plain {:.0} req/s, egress {:.0} req/s", rate(n as u64, p), rate(n as u64, e));
        plain = plain.min(p);
        egress = egress.min(e);
    }
    let c = http::CONCURRENCY;
    println!("| path ({c} requests open, {n} requests) | requests/s (best of {runs}) | egress / this |");
    println!("|---|---:|---:|");
    println!(
        "| plain reqwest loop | {:.0} | {:.2}x |",
        rate(n as u64, plain),
        plain.as_secs_f64() / egress.as_secs_f64()
    );
    println!("| egress AsyncLanesCell + HttpSender, {c} rooms | {:.0} | 1.00x |", rate(n as u64, egress));
    Ok(())
}

/// `ws-child PATH N`: one run of one path of the WebSocket table (`plain`,
/// `split` or `egress`), for a profiler or callgrind: prints `OK nanos`.
fn ws_child(args: &[String]) -> anyhow::Result<()> {
    let [path, n] = args else { bail!("usage: ws-child plain|split|egress N") };
    let n: u64 = n.parse()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let took = match path.as_str() {
        "plain" => rt.block_on(ws::plain(n)),
        "split" => rt.block_on(ws::plain_split(n)),
        "egress" => rt.block_on(ws::egress(n)),
        other => bail!("unknown path {other:?}"),
    };
    println!("OK {}", took.as_nanos());
    Ok(())
}

fn ws_table(args: &[String]) -> anyhow::Result<()> {
    let mut n = 200_000u64;
    let mut runs = 5usize;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--messages" => n = it.next().context("--messages needs a value")?.parse()?,
            "--runs" => runs = it.next().context("--runs needs a value")?.parse::<usize>()?.max(1),
            other => bail!("unknown option {other:?}\n\n{HELP}"),
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (mut egress, mut plain, mut split, mut recovery) = (Duration::MAX, Duration::MAX, Duration::MAX, Vec::new());
    for run in 0..runs {
        let p = rt.block_on(ws::plain(n));
        let s = rt.block_on(ws::plain_split(n));
        let e = rt.block_on(ws::egress(n));
        let r = rt.block_on(ws::recovery());
        eprintln!(
            "run {run}: plain {:.0} msg/s, plain split {:.0} msg/s, egress {:.0} msg/s, recovery {:.2} ms",
            rate(n, p),
            rate(n, s),
            rate(n, e),
            ms(r)
        );
        plain = plain.min(p);
        split = split.min(s);
        egress = egress.min(e);
        recovery.push(r);
    }
    recovery.sort();
    let ratio = |base: Duration| base.as_secs_f64() / egress.as_secs_f64();
    println!("| path | messages/s (best of {runs}) | egress / this |");
    println!("|---|---:|---:|");
    println!("| plain tokio-tungstenite loop, one task | {:.0} | {:.2}x |", rate(n, plain), ratio(plain));
    println!(
        "| plain tokio-tungstenite loop, reader and writer tasks | {:.0} | {:.2}x |",
        rate(n, split),
        ratio(split)
    );
    println!("| egress AsyncEgressCell + Sender | {:.0} | 1.00x |", rate(n, egress));
    println!(
        "\nKilled connection to the first replayed frame acknowledged: median {:.2} ms (min {:.2}, max {:.2}) over {runs} kills.",
        ms(recovery[recovery.len() / 2]),
        ms(recovery[0]),
        ms(recovery[recovery.len() - 1])
    );
    println!("{n} messages of 32 bytes, window {}, loopback; run of {}.", ws::WINDOW, date());
    Ok(())
}

fn rate(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

/// A caught panic's message, on one line.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    egress_core::panic_message(panic).unwrap_or("panicked").replace('\n', " ")
}
