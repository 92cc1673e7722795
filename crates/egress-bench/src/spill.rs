//! `spill`: memory while a relay spills a burst to SQLite. Each size runs
//! in its own process (`spill-child N`), which sends N `RawFifo` ops
//! through a `RelayCell` with `Overflow::Spill` over a `SqliteSpill` into
//! an `EgressCell` whose "transport" (claim and acknowledge by hand)
//! delivers one record per two ops sent, then drains the rest, checking
//! every op arrived once, in order. The row is the peak RSS of the large
//! run against the small one.

use std::num::NonZeroUsize;
use std::time::Instant;

use anyhow::{Context as _, bail};
use egress_codec::Json;
use egress_core::{Backpressure, ClaimOutcome, Overflow, Policy, RawFifo, Relay, Water};
use egress_reactive::{Context, EgressCell, RelayCell};
use egress_store::SqliteSpill;

/// The relay's marks: full at 1,024 entries, not full again until 256.
const WATER: Water = Water::new(1024, 256);

/// `spill-child N DIR`: prints `OK peak-rss-bytes seconds spilled-ops`.
pub fn child(args: &[String]) -> anyhow::Result<()> {
    let [n, dir, ..] = args else { bail!("usage: spill-child N DIR") };
    let n: u64 = n.parse().context("N")?;
    let db = std::path::Path::new(dir).join(format!("spill-{n}.db"));
    let _ = std::fs::remove_file(&db);
    let started = Instant::now();
    let cx = Context::new();
    let cell: EgressCell<Vec<u64>> = EgressCell::new(&cx, Policy::default());
    let store: SqliteSpill<Vec<u64>> = SqliteSpill::open(&db, "bench", Json)?;
    let relay = RelayCell::spilling(&cx, Relay::new(RawFifo, Backpressure::count(WATER, Overflow::Spill))?, store)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let _drain = relay.drain_into(&cell, NonZeroUsize::new(64).context("64")?)?;
    let mut next = 0u64;
    let mut deliver = |cell: &EgressCell<Vec<u64>>| -> anyhow::Result<bool> {
        let generation = cell.generation().get_untracked();
        let claimed = cell.claim_with(generation, |outcome| match outcome {
            ClaimOutcome::Claimed(e) => Some((e.sequence, e.payload.first().copied())),
            _ => None,
        });
        let Some((seq, value)) = claimed else { return Ok(false) };
        if value != Some(next) {
            bail!("delivered {value:?}, expected {next}");
        }
        next += 1;
        let _ = cell.ack(generation, seq);
        Ok(true)
    };
    for op in 0..n {
        relay.send(vec![op]).map_err(|e| anyhow::anyhow!("send {op}: {e}"))?;
        if op % 2 == 0 {
            deliver(&cell)?;
        }
    }
    while deliver(&cell)? {}
    if next != n {
        bail!("delivered {next} of {n}");
    }
    let spilled = relay.spilled().get_untracked();
    let seconds = started.elapsed().as_secs_f64();
    drop((relay, cell));
    let _ = std::fs::remove_file(&db);
    println!("OK {} {seconds:.1} {spilled}", crate::proc_status_bytes("VmHWM")?);
    Ok(())
}

/// `spill [--ops N] [--dir PATH]`: the table.
pub fn table(args: &[String]) -> anyhow::Result<()> {
    let mut ops = 10_000_000u64;
    let mut dir = std::env::temp_dir();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--ops" => ops = it.next().context("--ops N")?.parse()?,
            "--dir" => dir = it.next().context("--dir PATH")?.into(),
            other => bail!("unknown option {other:?}"),
        }
    }
    let run = |n: u64| -> anyhow::Result<(u64, String, String)> {
        let fields = crate::child_fields(&["spill-child", &n.to_string(), &dir.to_string_lossy()])?;
        Ok((
            crate::field(&fields, 0, "rss")?,
            crate::field(&fields, 1, "seconds")?,
            crate::field(&fields, 2, "spilled")?,
        ))
    };
    let (small, small_s, small_spilled) = run(1_000)?;
    let (large, large_s, large_spilled) = run(ops)?;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!("| ops | peak RSS | spilled ops | seconds |\n|---:|---:|---:|---:|");
    println!("| 1,000 | {:.1} MiB | {small_spilled} | {small_s} |", mib(small));
    println!("| {} | {:.1} MiB | {large_spilled} | {large_s} |", thousands(ops), mib(large));
    println!(
        "\nPeak RSS of {} ops minus 1,000: {:.1} MiB (RawFifo, Spill at {}/{}, SqliteSpill with synchronous=FULL, one delivery per two ops sent). Run of {}.",
        thousands(ops),
        mib(large.saturating_sub(small)),
        WATER.high,
        WATER.low,
        crate::date()
    );
    Ok(())
}

/// `n` with a comma every three digits.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
