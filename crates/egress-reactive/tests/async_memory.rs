#![allow(clippy::unwrap_used)]
//! What an idle async effect keeps: not its run's state, which lives in a
//! box for the run and is freed when the run ends (in the task, it would be
//! kept for the effect's whole life). Counted by an instrumented allocator
//! (this binary's only test: the count is process-wide).

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use std::alloc::System;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const EFFECTS: usize = 64;
/// What each run's state holds across its await.
const STATE: usize = 16 * 1024;

#[tokio::test(flavor = "current_thread")]
async fn an_idle_async_effect_keeps_nothing_of_its_last_run() {
    let cx = egress_reactive::AsyncContext::new();
    let s = cx.signal(1u8);
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut kept = Vec::with_capacity(EFFECTS);
    let region = Region::new(GLOBAL);
    for _ in 0..EFFECTS {
        kept.push(cx.effect_async({
            let (s, runs) = (s.clone(), runs.clone());
            move |ecx| {
                let (s, runs) = (s.clone(), runs.clone());
                async move {
                    let mut big = [0u8; STATE];
                    big[1] = ecx.get(&s);
                    tokio::task::yield_now().await;
                    std::hint::black_box(&big);
                    runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        }));
    }
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    let change = region.change();
    let live = change.bytes_allocated as isize - change.bytes_deallocated as isize + change.bytes_reallocated;
    let per_effect = usize::try_from(live).unwrap() / EFFECTS;
    println!("bytes per idle async effect: {per_effect}");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), EFFECTS, "every first run ended");
    assert!(per_effect < STATE / 4, "{per_effect} bytes per idle async effect");
}
