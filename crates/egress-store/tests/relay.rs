//! The relay's own rhythm, over a `JournalStore` kept in memory and in
//! virtual time (tokio's paused clock): how long it waits after failed
//! commits, how it adopts a backlog larger than one batch, and that an idle
//! relay does not read the store.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use egress_core::{EgressCore, Policy, Ready, Restored, Sequence};
use egress_reactive::{AsyncContext, AsyncEgressCell, CellOptions};
use egress_store::{JournalStore, Relay, RelayConfig, StoreError};
use parking_lot::Mutex;
use tokio::time::Instant;

/// What the store saw, shared with the test.
#[derive(Default)]
struct Seen {
    /// The stored records (sequence = index): the relay's and other
    /// writers'.
    rows: Vec<Bytes>,
    /// Whether another writer appended since the relay last asked.
    changed: bool,
    /// How many commits to refuse before taking one.
    refuse: u32,
    /// How many commits panic (after the refusals) before one is taken.
    panic: u32,
    /// When each commit was tried.
    applies: Vec<Instant>,
    /// How many reads of stored records the relay made.
    reads: u64,
}

/// A stream kept in memory.
struct Memory(Arc<Mutex<Seen>>);

impl JournalStore for Memory {
    async fn apply(&mut self, _: &Ready, appends: &[(Sequence, Bytes)]) -> Result<(), StoreError> {
        let mut seen = self.0.lock();
        seen.applies.push(Instant::now());
        if seen.refuse > 0 {
            seen.refuse -= 1;
            return Err(StoreError::Task("refused".into()));
        }
        if seen.panic > 0 {
            seen.panic -= 1;
            drop(seen);
            panic!("the store panics");
        }
        seen.rows.extend(appends.iter().map(|(_, b)| b.clone()));
        Ok(())
    }

    async fn appended(&mut self, from: Sequence, limit: usize) -> Result<Vec<(Sequence, Bytes)>, StoreError> {
        let mut seen = self.0.lock();
        seen.reads += 1;
        let from = usize::try_from(from.0).unwrap();
        Ok(seen.rows.iter().enumerate().skip(from).take(limit).map(|(i, b)| (Sequence(i as u64), b.clone())).collect())
    }

    async fn changed(&mut self) -> Result<bool, StoreError> {
        Ok(std::mem::take(&mut self.0.lock().changed))
    }

    fn stream(&self) -> &str {
        "memory"
    }
}

fn cell(cx: &AsyncContext) -> AsyncEgressCell<Bytes> {
    let core = EgressCore::restore(Policy::default(), Restored::empty()).unwrap();
    AsyncEgressCell::from_core(cx, core, CellOptions::new())
}

/// Waits (in virtual time, at most `within`) until `done`.
async fn until(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    tokio::time::timeout(within, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .is_ok()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn after_failed_commits_the_relay_waits_twice_as_long_each_time_up_to_its_cap() {
    let cx = AsyncContext::new();
    let cell = cell(&cx);
    let seen = Arc::new(Mutex::new(Seen { refuse: 6, ..Seen::default() }));
    let config = RelayConfig {
        poll_interval: Duration::from_secs(3600),
        retry_base: Duration::from_millis(100),
        retry_max: Duration::from_secs(1),
        adopt_batch: 16,
    };
    let relay = Relay::spawn_on(&cx, &cell, Memory(seen.clone()), config);
    cell.enqueue(Bytes::from_static(b"m0"));
    assert!(until(Duration::from_secs(60), || seen.lock().rows.len() == 1).await, "written after the refusals");
    let applies = seen.lock().applies.clone();
    let waits: Vec<u128> = applies.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect();
    // The first commit may be the restore's own (the generation), refused
    // too; from the first refusal on, each wait doubles, capped at 1 s.
    assert_eq!(waits, [100, 200, 400, 800, 1000, 1000], "{applies:?}");
    assert_eq!(relay.stats().failures, 6);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_backlog_of_several_batches_is_adopted_at_once_and_an_idle_relay_reads_nothing() {
    let cx = AsyncContext::new();
    let cell = cell(&cx);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let config = RelayConfig { poll_interval: Duration::from_secs(1), adopt_batch: 4, ..RelayConfig::default() };
    let relay = Relay::spawn_on(&cx, &cell, Memory(seen.clone()), config);
    // The relay's first look (nothing there), then it waits.
    assert!(until(Duration::from_millis(500), || seen.lock().reads == 1).await);
    // Another writer appends ten records (two full batches and a part) and
    // the relay is told.
    {
        let mut seen = seen.lock();
        seen.rows.extend((0..10).map(|i| Bytes::from(format!("o{i}"))));
        seen.changed = true;
    }
    // Within one poll: one batch after another, without a poll's wait
    // between the full ones.
    let polled = until(Duration::from_millis(1_500), || relay.stats().adopted == 10).await;
    assert!(polled, "adopted {} of 10", relay.stats().adopted);
    let read = seen.lock().reads;
    assert!(read <= 4, "{read} reads for three batches");
    // Idle for ten polls: asks whether anything changed, reads nothing.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(seen.lock().reads, read, "an idle relay read the store");
    assert_eq!(cell.next_sequence(), Sequence(10));
}

/// A store that panics under a commit (before the cell is told): the
/// commit's task ends without an answer, and the relay answers for it: a
/// failure, counted, shown by the cell, and tried again.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_commit_whose_store_panics_is_a_failure_shown_and_tried_again() {
    let cx = AsyncContext::new();
    let cell = cell(&cx);
    let seen = Arc::new(Mutex::new(Seen { panic: 1, ..Seen::default() }));
    let config = RelayConfig { poll_interval: Duration::from_secs(3600), ..RelayConfig::default() };
    let relay = Relay::spawn_on(&cx, &cell, Memory(seen.clone()), config);
    let shown = Arc::new(Mutex::new(Vec::new()));
    let _effect = cx.effect({
        let (cell, shown) = (cell.clone(), shown.clone());
        move || {
            if let Some(error) = cell.persist_error().get() {
                shown.lock().push(error.reason);
            }
        }
    });
    cell.enqueue(Bytes::from_static(b"m0"));
    assert!(until(Duration::from_secs(60), || seen.lock().rows.len() == 1).await, "written after the panic");
    let stats = relay.stats();
    assert_eq!(stats.failures, 1, "{stats:?}");
    assert!(shown.lock().iter().any(|r| r.contains("panic")), "{:?}", shown.lock());
}
