//! `egress-demo restarts`: a receiver process and a sender process, each
//! killed with SIGKILL and restarted at random moments, and a reader that
//! checks what the receiver's application was handed.
//!
//! The receiver runs `receive --print`: its application writes each delivery
//! as a line and commits it once the line is out, so its acknowledgements
//! cover exactly what reached this reader. Neither process has a store: a
//! restarted sender is a new incarnation that sends every message again
//! from sequence 0, and a restarted receiver resumes each stream where its
//! producer says. What must hold, and is checked:
//!
//! - within each incarnation, each receiver run hands over the stream in
//!   order, with no gap, starting no later than where the previous run
//!   stopped: nothing is lost;
//! - the only duplicates are re-deliveries at the start of a receiver run
//!   (messages taken, whose acknowledgement died with the receiver): they
//!   are counted, not hidden;
//! - across sender restarts every message is delivered at least once, and
//!   the last run's incarnation is delivered whole.
//!
//! With `--durable` (or `--db PATH`) both sides keep their state in SQLite
//! (`egress-store`): every sender run continues the one incarnation where
//! the last one stopped, and the receiving application writes each delivery
//! into its `delivered` table with the receiver's record in one
//! transaction, from which every receiver run resumes. What is checked then
//! is that table: each message exactly once, in order, whichever process
//! was killed when.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::{Options, finish};

/// What the reader saw of one incarnation (stream).
#[derive(Debug, Default)]
struct Stream {
    /// The highest sequence seen, plus one.
    seen: u64,
    /// The receiver run of the last delivery, and its sequence.
    last: Option<(u64, u64)>,
    delivered: u64,
    redelivered: u64,
    gaps: u64,
    out_of_order: u64,
}

/// Everything the receiver processes printed.
#[derive(Debug, Default)]
struct Log {
    streams: HashMap<String, Stream>,
    /// Per message index, whether it was delivered.
    messages: Vec<bool>,
    malformed: u64,
}

impl Log {
    /// Takes one line of receiver run `run`.
    fn line(&mut self, run: u64, line: &str) {
        let mut words = line.splitn(5, ' ');
        let (Some(kind), Some(_producer), Some(incarnation), Some(sequence), rest) =
            (words.next(), words.next(), words.next(), words.next(), words.next())
        else {
            self.malformed += 1;
            return;
        };
        let Ok(sequence) = sequence.parse::<u64>() else {
            self.malformed += 1;
            return;
        };
        if kind == "D"
            && let Some(i) = rest.and_then(|p| p.strip_prefix("message ")).and_then(|i| i.parse::<usize>().ok())
            && let Some(slot) = self.messages.get_mut(i)
        {
            *slot = true;
        }
        let s = self.streams.entry(incarnation.to_owned()).or_default();
        s.delivered += 1;
        match s.last {
            // The same receiver run: strictly the next one.
            Some((r, last)) if r == run => {
                if sequence != last.saturating_add(1) {
                    s.out_of_order += 1;
                }
            }
            // A new run picks the stream up where its producer resumed: no
            // later than where the last run stopped.
            _ => {
                if sequence > s.seen {
                    s.gaps += 1;
                }
            }
        }
        if sequence < s.seen {
            s.redelivered += 1;
        }
        s.seen = s.seen.max(sequence.saturating_add(1));
        s.last = Some((run, sequence));
    }
}

fn exe() -> anyhow::Result<std::path::PathBuf> {
    std::env::current_exe().context("the demo's own path")
}

/// The receiver's database, next to the sender's.
fn receiver_db(o: &Options) -> Option<String> {
    o.db.as_ref().map(|db| format!("{db}.receiver"))
}

/// Starts receiver run `run` on `addr`, its lines fed to `lines`.
fn start_receiver(
    addr: &str,
    o: &Options,
    run: u64,
    lines: &mpsc::UnboundedSender<(u64, String)>,
) -> anyhow::Result<Child> {
    let db = receiver_db(o);
    let mut child = Command::new(exe()?)
        .args(["receive", "--listen", addr, "--print"])
        .args(db.iter().flat_map(|db| ["--db", db.as_str()]))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting the receiver process")?;
    let stdout = child.stdout.take().context("the receiver's stdout")?;
    let lines = lines.clone();
    tokio::spawn(async move {
        let mut reader = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            if line.starts_with("D ") || line.starts_with("S ") {
                let _ = lines.send((run, line));
            }
        }
    });
    Ok(child)
}

fn start_sender(url: &str, o: &Options, run: u64) -> anyhow::Result<Child> {
    let db = o.db.iter().flat_map(|db| ["--db", db.as_str()]);
    Command::new(exe()?)
        .args(["send", "--url", url, "--messages", &o.messages.to_string()])
        .args(["--seed", &o.seed.wrapping_add(run).to_string()])
        .args(db)
        .args(match o.rate {
            Some(rate) => vec!["--rate".to_owned(), rate.to_string()],
            None => vec!["--max-rate".to_owned()],
        })
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting the sender process")
}

pub(crate) async fn run(mut o: Options) -> anyhow::Result<()> {
    if o.durable && o.db.is_none() {
        let path = std::env::temp_dir().join(format!("egress-demo-{}.db", std::process::id()));
        o.db = Some(path.to_string_lossy().into_owned());
    }
    // A stream starts afresh: message i is record i.
    for db in o.db.iter().chain(receiver_db(&o).iter()) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{db}{suffix}"));
        }
    }
    if !o.kill_sender && !o.kill_receiver {
        bail!("--kill names nobody");
    }
    // A free port on loopback, for every receiver run.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.to_string();
    let url = format!("ws://{addr}");
    crate::say!(
        "egress-demo restarts: {} messages; a receiver and a sender process on {addr}, {} kills about every {} ms (seed {}){}",
        o.messages,
        o.kills,
        o.kill_ms,
        o.seed,
        o.db.as_deref().map(|db| format!("; both on SQLite at {db} and {db}.receiver")).unwrap_or_default()
    );
    let started = Instant::now();
    let (lines, mut read) = mpsc::unbounded_channel();
    let mut log = Log { messages: vec![false; usize::try_from(o.messages).unwrap_or(usize::MAX)], ..Log::default() };
    let (mut receiver_runs, mut sender_runs) = (1u64, 1u64);
    let mut receiver = start_receiver(&addr, &o, receiver_runs, &lines)?;
    let mut sender = start_sender(&url, &o, sender_runs)?;
    let (mut killed_receivers, mut killed_senders) = (0u64, 0u64);
    let mut rng = crate::Xorshift::new(o.seed);
    let span = o.kill_ms.max(1).saturating_mul(2);
    let mut kills = 0;
    // Kills alternate between the two processes (the sender first), at
    // seeded random moments; they stop early if the sender finishes.
    while kills < o.kills {
        let at = tokio::time::Instant::now() + Duration::from_millis(rng.below(span));
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(at) => break,
                Some((run, line)) = read.recv() => log.line(run, &line),
            }
        }
        if sender.try_wait()?.is_some() {
            break;
        }
        kills += 1;
        let receiver_turn = if o.kill_sender && o.kill_receiver { kills % 2 == 0 } else { o.kill_receiver };
        if receiver_turn {
            receiver.kill().await.context("killing the receiver")?;
            killed_receivers += 1;
            receiver_runs += 1;
            if o.db.is_some() {
                crate::say!(
                    "  killed the receiver process (SIGKILL); receiver run {receiver_runs} resumes from its application's log"
                );
            } else {
                crate::say!(
                    "  killed the receiver process (SIGKILL); receiver run {receiver_runs} starts without memory"
                );
            }
            receiver = start_receiver(&addr, &o, receiver_runs, &lines)?;
        } else {
            sender.kill().await.context("killing the sender")?;
            killed_senders += 1;
            sender_runs += 1;
            if o.db.is_some() {
                crate::say!("  killed the sender process (SIGKILL); sender run {sender_runs} continues from its store");
            } else {
                crate::say!(
                    "  killed the sender process (SIGKILL); sender run {sender_runs} starts over as a new incarnation"
                );
            }
            sender = start_sender(&url, &o, sender_runs)?;
        }
    }
    // No more kills: the last sender run finishes once everything it sent
    // is acknowledged, that is, printed.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    let status = loop {
        tokio::select! {
            status = sender.wait() => break status?,
            Some((run, line)) = read.recv() => log.line(run, &line),
            () = tokio::time::sleep_until(deadline) => bail!("the last sender run did not finish within 300 s"),
        }
    };
    // Its last lines may still be in the pipe.
    while let Ok(Some((run, line))) = tokio::time::timeout(Duration::from_millis(300), read.recv()).await {
        log.line(run, &line);
    }
    receiver.kill().await.ok();
    let elapsed = started.elapsed();
    let (mut gaps, mut out_of_order, mut redelivered, mut delivered) = (0, 0, 0, 0);
    for s in log.streams.values() {
        gaps += s.gaps;
        out_of_order += s.out_of_order;
        redelivered += s.redelivered;
        delivered += s.delivered;
    }
    let every_message = log.messages.iter().all(|&m| m);
    let mut held = status.success() && gaps == 0 && out_of_order == 0 && every_message && log.malformed == 0;
    // With stores on both sides, what counts is the receiving application's
    // durable log (a line printed after its commit may die with its
    // process): one incarnation, each message once, in order.
    let durable = o.db.is_some();
    let one_stream = log.streams.len() == 1;
    let mut exactly_once =
        every_message && redelivered == 0 && delivered == o.messages && gaps == 0 && out_of_order == 0;
    let mut applied = None;
    if let Some(db) = receiver_db(&o) {
        let checked = check_applied(&db, o.messages)?;
        exactly_once = checked.exactly_once;
        applied = Some(checked);
        held = status.success() && one_stream && exactly_once;
    }
    let mut summary = json!({
        "messages": o.messages,
        "receiver_processes_killed": killed_receivers,
        "sender_processes_killed": killed_senders,
        "incarnations_seen": log.streams.len(),
        "last_sender_run_acknowledged_everything": status.success(),
        "exactly_once_in_order": exactly_once,
        "seconds": elapsed.as_secs_f64(),
    });
    // Without stores, the printed lines are the application's log; with
    // them, its table is (a line printed after a commit may die with the
    // process, so lines are not counted).
    let more = match &applied {
        None => json!({
            "deliveries": delivered,
            "within_each_incarnation_in_order_without_gaps": gaps == 0 && out_of_order == 0,
            "gaps": gaps,
            "out_of_order": out_of_order,
            "redelivered_after_receiver_restarts": redelivered,
            "every_message_delivered_at_least_once": every_message,
        }),
        Some(a) => json!({
            "sender_and_receiver_on_sqlite": true,
            "applied_rows": a.rows,
            "applied_duplicates": a.duplicates,
            "applied_out_of_order": a.out_of_order,
        }),
    };
    if let (Some(map), Some(more)) = (summary.as_object_mut(), more.as_object()) {
        map.extend(more.clone());
    }
    finish(summary, o.summary_json.as_deref())?;
    if durable {
        crate::say!(
            "\nWhat held: {sender_runs} sender runs continued one stream from SQLite ({} incarnation seen), and \
             {receiver_runs} receiver runs resumed it from the application's log in SQLite; the log holds each \
             message exactly once and in order: {exactly_once}.",
            log.streams.len()
        );
    } else {
        crate::say!(
            "\nWhat held: within each incarnation, every receiver run handed the stream over in order, with no \
             gap; {redelivered} deliveries repeated messages taken just before a receiver was killed (it has no \
             store); across {sender_runs} sender runs (each a new incarnation, no store) every message arrived at \
             least once."
        );
    }
    if !held {
        bail!("a delivery rule was broken (see the summary)");
    }
    Ok(())
}

/// What the receiving application's durable log holds.
struct Applied {
    rows: u64,
    duplicates: u64,
    out_of_order: u64,
    exactly_once: bool,
}

/// Reads the receiving application's `delivered` table in the order it was
/// written: one incarnation, sequence i carrying message i, each once, from
/// 0 to `n - 1`.
fn check_applied(db: &str, n: u64) -> anyhow::Result<Applied> {
    let conn = rusqlite::Connection::open(db).with_context(|| format!("opening {db}"))?;
    let mut select = conn.prepare("SELECT incarnation, seq, payload FROM delivered ORDER BY rowid")?;
    let mut rows = select.query([])?;
    let (mut count, mut duplicates, mut out_of_order, mut expected) = (0u64, 0u64, 0u64, 0u64);
    let mut incarnations = std::collections::HashSet::new();
    let mut seen = std::collections::HashSet::new();
    while let Some(row) = rows.next()? {
        let (incarnation, seq, payload): (String, i64, Option<String>) = (row.get(0)?, row.get(1)?, row.get(2)?);
        let seq = u64::try_from(seq)?;
        incarnations.insert(incarnation);
        count += 1;
        if !seen.insert(seq) {
            duplicates += 1;
        }
        if seq != expected || payload.as_deref() != Some(format!("message {seq}").as_str()) {
            out_of_order += 1;
        }
        expected = seq + 1;
    }
    let exactly_once = count == n && duplicates == 0 && out_of_order == 0 && incarnations.len() == 1;
    Ok(Applied { rows: count, duplicates, out_of_order, exactly_once })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_tells_gaps_reorders_and_redeliveries_apart() {
        let mut log = Log { messages: vec![false; 4], ..Log::default() };
        for (run, line) in
            [(1, "D p a 0 message 0"), (1, "D p a 1 message 1"), (2, "D p a 1 message 1"), (2, "D p a 2 message 2")]
        {
            log.line(run, line);
        }
        let s = &log.streams["a"];
        assert_eq!((s.delivered, s.redelivered, s.gaps, s.out_of_order), (4, 1, 0, 0));
        log.line(2, "D p a 4 message 3");
        log.line(3, "D p a 9 message 3");
        let s = &log.streams["a"];
        assert_eq!((s.gaps, s.out_of_order), (1, 1));
        assert!(log.messages.iter().all(|&m| m));
        log.line(3, "garbage");
        assert_eq!(log.malformed, 1);
    }
}
