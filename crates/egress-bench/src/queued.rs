//! Memory per queued envelope: `N` `u64` payloads enqueued and left queued
//! (no transport attached, so every one stays pending), in the bare core
//! and in each cell, against a plain `VecDeque<u64>` filled the same way
//! (one push at a time). Each library runs in its own process, which reads
//! its resident set (`VmRSS`) and the counting allocator's net bytes before
//! the first enqueue and after the last; the row is each difference divided
//! by `N`. The resident set counts the pages touched; the allocator's count
//! also counts a growing buffer's spare capacity (up to 2x just after it
//! doubled), in the baseline as in ours.

use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};
use egress_core::EgressCore;
use egress_reactive::{AsyncContext, AsyncEgressCell, Context, EgressCell, ThreadSafeContext, ThreadSafeEgressCell};

/// The libraries, in column order: key and title.
const LIBS: &[(&str, &str)] = &[
    ("vecdeque", "VecDeque<u64> (baseline)"),
    ("core", "EgressCore"),
    ("egress", "EgressCell"),
    ("egress-ts", "ThreadSafeEgressCell"),
    ("egress-async", "AsyncEgressCell"),
];

/// The process's resident set now (VmRSS), in bytes.
fn rss() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("no VmRSS in /proc/self/status")?;
    let kib: u64 = line.split_whitespace().nth(1).context("VmRSS")?.parse()?;
    Ok(kib * 1024)
}

/// What a measurement reads: the resident set and the allocator's net bytes.
fn sample() -> anyhow::Result<(u64, i64)> {
    Ok((rss()?, crate::alloc::allocated()))
}

/// The samples around building a queue with `make`, enqueueing `0..n` with
/// `push`, and checking `len` says all `n` are queued (the queue is kept
/// until the second sample).
fn around<Q>(
    n: u64,
    make: impl FnOnce() -> Q,
    push: impl Fn(&mut Q, u64),
    len: impl Fn(&Q) -> usize,
) -> anyhow::Result<((u64, i64), (u64, i64))> {
    let before = sample()?;
    let mut queue = make();
    (0..n).for_each(|i| push(&mut queue, i));
    let after = sample()?;
    assert_eq!(len(&queue) as u64, n, "every payload queued");
    Ok((before, after))
}

/// `queued-child LIB N`: prints `OK rss-bytes allocated-bytes` (the
/// differences across enqueueing `N` payloads).
pub fn child(args: &[String]) -> anyhow::Result<()> {
    let [lib, n] = args else { bail!("queued-child LIB N") };
    let n: u64 = n.parse()?;
    let policy = egress_core::Policy::default();
    let (before, after) = match lib.as_str() {
        "vecdeque" => around(n, std::collections::VecDeque::new, |q, i| q.push_back(i), |q| q.len())?,
        "core" => around(
            n,
            || EgressCore::new(policy),
            |core, i| {
                let _ = core.enqueue(i);
            },
            |core| core.pending_len(),
        )?,
        "egress" => {
            let cx = Context::new();
            around(
                n,
                || EgressCell::<u64>::new(&cx, policy),
                |c, i| {
                    let _ = c.enqueue(i);
                },
                |c| c.pending_len().get(),
            )?
        }
        "egress-ts" => {
            let cx = ThreadSafeContext::new();
            around(
                n,
                || ThreadSafeEgressCell::<u64>::new(&cx, policy),
                |c, i| {
                    let _ = c.enqueue(i);
                },
                |c| c.pending_len().get(),
            )?
        }
        "egress-async" => {
            let rt = tokio::runtime::Builder::new_current_thread().build()?;
            let _entered = rt.enter();
            let cx = AsyncContext::new();
            around(
                n,
                || AsyncEgressCell::<u64>::new(&cx, policy),
                |c, i| {
                    let _ = c.enqueue(i);
                },
                |c| c.pending_len().get(),
            )?
        }
        other => bail!("unknown library {other:?}"),
    };
    println!("OK {} {}", after.0.saturating_sub(before.0), after.1 - before.1);
    Ok(())
}

/// `queued [--n N]`: the table (default N = 1,000,000).
pub fn table(args: &[String]) -> anyhow::Result<()> {
    let mut n = 1_000_000u64;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--n" => n = it.next().context("--n N")?.parse::<u64>()?.max(1),
            other => bail!("unknown option {other:?}"),
        }
    }
    println!("| {n} queued u64 envelopes | RSS difference, bytes each | allocated, bytes each |");
    println!("|---|---:|---:|");
    for (key, title) in LIBS {
        let out = Command::new(std::env::current_exe()?)
            .args(["queued-child", key, &n.to_string()])
            .stderr(Stdio::inherit())
            .output()?;
        let line = String::from_utf8(out.stdout)?;
        let Some(rest) = line.trim().strip_prefix("OK ") else { bail!("queued-child {key}: {line}") };
        let mut fields = rest.split(' ');
        let rss: f64 = fields.next().context("rss")?.parse()?;
        let allocated: f64 = fields.next().context("allocated")?.parse()?;
        println!("| {title} | {:.1} | {:.1} |", rss / n as f64, allocated / n as f64);
    }
    println!("\nRun of {}.", crate::date());
    Ok(())
}
