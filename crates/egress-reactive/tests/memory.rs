#![allow(clippy::unwrap_used)]
//! What a signal costs in memory: its node, its slot in a block shared
//! with other signals of its type, and no allocation of its own. Counted
//! by an instrumented allocator (this binary's only test: the count is
//! process-wide).

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use std::alloc::System;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Live bytes allocated while `f` runs and not freed by its end, per item.
fn bytes_per<R>(items: usize, f: impl FnOnce() -> R) -> (usize, R) {
    let region = Region::new(GLOBAL);
    let kept = f();
    let change = region.change();
    let live = change.bytes_allocated as isize - change.bytes_deallocated as isize + change.bytes_reallocated;
    (usize::try_from(live).unwrap() / items, kept)
}

const SIGNALS: usize = 4096;

#[test]
fn signals_share_blocks_per_type() {
    let cx = egress_reactive::Context::new();
    let mut kept = Vec::with_capacity(2 * SIGNALS);
    let mut small = Vec::with_capacity(SIGNALS);
    // The node table grows by doubling: fill it past what is measured, then
    // free those nodes, so the measured signals reuse its slots.
    let warm: Vec<_> = (0..3 * SIGNALS as u64).map(|i| cx.signal(i)).collect();
    for s in &warm {
        s.dispose();
    }
    drop(warm);
    let (local, ()) = bytes_per(SIGNALS, || kept.extend((0..SIGNALS as u64).map(|i| cx.signal(i))));
    // Two types interleaved: each keeps its own current block.
    let (mixed, ()) = bytes_per(SIGNALS, || {
        for i in 0..SIGNALS as u64 / 2 {
            kept.push(cx.signal(i));
            small.push(cx.signal(i as u32));
        }
    });
    println!("bytes per signal: {local} (one type), {mixed} (two types)");
    // The nodes' slots were allocated by the warm-up: what is left is the
    // signal's slot in its type's current block (a u64's is 40 bytes, 64 to a
    // 4 KiB block).
    assert!(local <= 64, "{local} bytes per signal");
    assert!(mixed <= 64, "{mixed} bytes per signal");
    assert_eq!(
        kept.iter().map(|s| s.get()).sum::<u64>(),
        (0..SIGNALS as u64).sum::<u64>() + (0..SIGNALS as u64 / 2).sum::<u64>()
    );
}
