//! Memory per queued envelope: `N` `u64` payloads enqueued and left queued
//! (no transport attached, so every one stays pending), in the bare core
//! and in each cell, against a plain `VecDeque<u64>` filled the same way
//! (one push at a time). Each library runs in its own process, which reads
//! its resident set (`VmRSS`) and the counting allocator's net bytes before
//! the first enqueue and after the last; the row is each difference divided
//! by `N`. The resident set counts the pages touched; the allocator's count
//! also counts a growing buffer's spare capacity (up to 2x just after it
//! doubled), in the baseline as in ours.

use anyhow::{Context as _, bail};
use egress_core::EgressCore;
use egress_reactive::{
    AsyncContext, AsyncEgressCell, CellFlavor, Context, EgressCell, EgressCellOf, Handle, ThreadSafeContext,
    ThreadSafeEgressCell,
};

/// The libraries, in column order: key and title.
const LIBS: &[(&str, &str)] = &[
    ("vecdeque", "VecDeque<u64> (baseline)"),
    ("core", "EgressCore"),
    ("egress", "EgressCell"),
    ("egress-ts", "ThreadSafeEgressCell"),
    ("egress-async", "AsyncEgressCell"),
];

/// What a measurement reads: the resident set and the allocator's net bytes.
fn sample() -> anyhow::Result<(u64, i64)> {
    Ok((crate::proc_status_bytes("VmRSS")?, crate::alloc::allocated()))
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

/// The pending reads' rows, in column order: key and title.
const READS: &[(&str, &str)] = &[
    ("copy", "a copy of the core's pending list per read (the reader before sharing)"),
    ("egress", "EgressCell `pending()`"),
    ("egress-ts", "ThreadSafeEgressCell `pending()`"),
];

/// What a pending read costs at `n` queued: `k` times, one more enqueue
/// and a read of the whole pending list, holding the last snapshot as a UI
/// would. Returns the nanoseconds and the bytes requested from the
/// allocator per read.
fn reads_of<Q, S>(
    n: u64,
    k: u64,
    queue: &mut Q,
    push: impl Fn(&mut Q, u64),
    read: impl Fn(&Q) -> S,
    len: impl Fn(&S) -> usize,
) -> (f64, f64) {
    (0..n).for_each(|i| push(queue, i));
    let mut held = read(queue);
    let (bytes, started) = (crate::alloc::requested(), std::time::Instant::now());
    for i in n..n + k {
        push(queue, i);
        held = read(queue);
    }
    let elapsed = started.elapsed();
    let bytes = crate::alloc::requested() - bytes;
    assert_eq!(len(&held) as u64, n + k, "every payload in the snapshot");
    (elapsed.as_nanos() as f64 / k as f64, bytes as f64 / k as f64)
}

/// [`reads_of`] through a cell of flavour `F`.
fn cell_reads<F: CellFlavor<u64>>(cx: &Handle<F>, n: u64, k: u64) -> (f64, f64) {
    let mut cell = EgressCellOf::<u64, F>::new(cx, egress_core::Policy::default());
    reads_of(
        n,
        k,
        &mut cell,
        |c, i| {
            let _ = c.enqueue(i);
        },
        |c| c.pending().get(),
        |s| s.len(),
    )
}

/// `queued-reads-child LIB N K`: prints `OK ns-per-read bytes-per-read`.
pub fn reads_child(args: &[String]) -> anyhow::Result<()> {
    let [lib, n, k] = args else { bail!("queued-reads-child LIB N K") };
    let (n, k): (u64, u64) = (n.parse()?, k.parse::<u64>()?.max(1));
    let policy = egress_core::Policy::default();
    let (nanos, bytes) = match lib.as_str() {
        "copy" => reads_of(
            n,
            k,
            &mut EgressCore::new(policy),
            |core, i| {
                let _ = core.enqueue(i);
            },
            |core| core.pending().map(egress_core::Envelope::cloned).collect::<std::sync::Arc<[_]>>(),
            |s| s.len(),
        ),
        "egress" => cell_reads(&Context::new().handle(), n, k),
        "egress-ts" => cell_reads(&ThreadSafeContext::new().handle(), n, k),
        other => bail!("unknown library {other:?}"),
    };
    println!("OK {nanos} {bytes}");
    Ok(())
}

/// `queued [--n N] [--reads K]`: the tables (default N = 1,000,000, K =
/// 100).
pub fn table(args: &[String]) -> anyhow::Result<()> {
    let (mut n, mut reads) = (1_000_000u64, 100u64);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--n" => n = it.next().context("--n N")?.parse::<u64>()?.max(1),
            "--reads" => reads = it.next().context("--reads K")?.parse::<u64>()?.max(1),
            other => bail!("unknown option {other:?}"),
        }
    }
    println!("| {n} queued u64 envelopes | RSS difference, bytes each | allocated, bytes each |");
    println!("|---|---:|---:|");
    for (key, title) in LIBS {
        let fields = crate::child_fields(&["queued-child", key, &n.to_string()])?;
        let (rss, allocated): (f64, f64) = (crate::field(&fields, 0, "rss")?, crate::field(&fields, 1, "allocated")?);
        println!("| {title} | {:.1} | {:.1} |", rss / n as f64, allocated / n as f64);
    }
    println!(
        "\n| a pending read at {n} queued ({reads} reads, one enqueue before each) | ns per enqueue and read | bytes allocated per read |"
    );
    println!("|---|---:|---:|");
    for (key, title) in READS {
        let fields = crate::child_fields(&["queued-reads-child", key, &n.to_string(), &reads.to_string()])?;
        let (nanos, bytes): (f64, f64) = (crate::field(&fields, 0, "nanos")?, crate::field(&fields, 1, "bytes")?);
        println!("| {title} | {nanos:.0} | {bytes:.0} |");
    }
    println!("\nRun of {}.", crate::date());
    Ok(())
}
