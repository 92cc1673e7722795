#![allow(clippy::unwrap_used)]
//! What a signal costs in memory: its node, its slot in a block shared
//! with other signals of its type, and no allocation of its own; and that
//! the blocks go once their signals do. Counted by an instrumented
//! allocator, in this binary's one test (the count is process-wide: a
//! second test's thread would allocate into it).

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use std::alloc::System;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Live bytes allocated while `f` runs and not freed by its end, per item.
/// (stats_alloc counts a reallocation's growth in `bytes_allocated` and
/// its shrinking in `bytes_deallocated` already.)
fn bytes_per<R>(items: usize, f: impl FnOnce() -> R) -> (usize, R) {
    let region = Region::new(GLOBAL);
    let kept = f();
    let change = region.change();
    let live = change.bytes_allocated as isize - change.bytes_deallocated as isize;
    (usize::try_from(live).unwrap() / items, kept)
}

const SIGNALS: usize = 4096;

#[test]
fn signal_memory() {
    signals_share_blocks_per_type();
    disposed_signals_give_their_blocks_back();
}

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

/// Signals made and disposed, their handles dropped, give their blocks
/// back: rounds of several blocks' worth, of two types, leave nothing
/// behind. (A graph that held on to a block after its last signal went,
/// its type's pool gone on to the next block, would keep about 3 KiB for
/// every 64 signals: over 1 MiB here.)
fn disposed_signals_give_their_blocks_back() {
    macro_rules! churn {
        ($cx:expr) => {{
            let cx = $cx;
            let round = || {
                let wide: Vec<_> = (0..300u64).map(|i| cx.signal(i)).collect();
                let narrow: Vec<_> = (0..300u32).map(|i| cx.signal(i)).collect();
                assert_eq!(wide[299].get() + u64::from(narrow[299].get()), 598);
                wide.iter().for_each(|s| s.dispose());
                narrow.iter().for_each(|s| s.dispose());
            };
            // The node table, the blocks' table and each type's current
            // block (at its full size by now) are allocated once.
            for _ in 0..3 {
                round();
            }
            let (kept, ()) = bytes_per(1, || (0..50).for_each(|_| round()));
            assert!(kept <= 1024, "{kept} bytes kept by 50 rounds of 600 signals");
            assert_eq!(cx.node_count(), 1, "only the root");
        }};
    }
    churn!(egress_reactive::Context::new());
    churn!(egress_reactive::ThreadSafeContext::new());
    // Signals made through a handle that outlived its context are born
    // disposed: their slots are freed at once, and their blocks go too.
    let cx = egress_reactive::Context::new();
    let handle = cx.handle();
    drop(cx);
    let round = || {
        let born_dead: Vec<_> = (0..300u64).map(|i| handle.signal(i)).collect();
        assert!(born_dead.iter().all(|s| s.is_disposed()));
    };
    for _ in 0..3 {
        round();
    }
    let (kept, ()) = bytes_per(1, || (0..50).for_each(|_| round()));
    assert!(kept <= 1024, "{kept} bytes kept by 50 rounds of 300 signals born disposed");
}
