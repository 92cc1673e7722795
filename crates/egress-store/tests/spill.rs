//! A relay cell spilling to SQLite (`Overflow::Spill` over `SqliteSpill`):
//! the pages replayed in order ahead of the relay's entries and reclaimed
//! once acknowledged, memory bounded while the disk takes the burst; a
//! refused commit puts the page back; a restart replays what was not
//! acknowledged; a second opener fences the first; a stored value that
//! does not decode stops the replay without a panic; and a process killed
//! by SIGKILL while spilling loses nothing a page held.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::num::NonZeroUsize;
use std::process::{Command, Stdio};

use egress_codec::Json;
use egress_core::{Backpressure, ClaimOutcome, KeepLatest, Overflow, Policy, RawFifo, Relay, SendRefused, Sent, Water};
use egress_reactive::{CellFlavor, Context, EgressCell, EgressCellOf, RelayCell, RelayCellOf, SpillStore};
use egress_store::{SqliteSpill, StoreError};
use egress_testkit::TempDir;

fn spill(high: u64, low: u64) -> Backpressure {
    Backpressure::count(Water::new(high, low), Overflow::Spill)
}

fn nz(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap()
}

/// Claims the next pending record of `cell` and acknowledges it: its
/// payload.
fn deliver<T: Clone + 'static, F: CellFlavor<T>>(cell: &EgressCellOf<T, F>) -> Option<T> {
    let generation = cell.generation().get_untracked();
    let (seq, value) = cell.claim_with(generation, |outcome| match outcome {
        ClaimOutcome::Claimed(e) => Some((e.sequence, (*e.payload).clone())),
        _ => None,
    })?;
    let _ = cell.ack(generation, seq);
    Some(value)
}

type Fifo = RelayCell<Vec<u32>, RawFifo>;

fn fifo(cx: &Context, db: &std::path::Path, high: u64, low: u64) -> Fifo {
    let store: SqliteSpill<Vec<u32>> = SqliteSpill::open(db, "log", Json).unwrap();
    RelayCell::spilling(cx, Relay::new(RawFifo, spill(high, low)).unwrap(), store).unwrap()
}

/// The same body on every flavour's context.
macro_rules! each_flavour {
    (fn $name:ident($cx:ident) $body:block) => {
        mod $name {
            use super::*;
            #[test]
            fn local() {
                let $cx = egress_reactive::Context::new();
                $body
            }
            #[test]
            fn thread_safe() {
                let $cx = egress_reactive::ThreadSafeContext::new();
                $body
            }
            #[test]
            fn async_context() {
                let $cx = egress_reactive::AsyncContext::new();
                $body
            }
        }
    };
}

each_flavour! {
    fn pages_replay_in_order_ahead_of_the_relay_and_are_reclaimed_once_acknowledged(cx) {
        let dir = TempDir::new();
        let cell = EgressCellOf::new(&cx, Policy::default());
        let store: SqliteSpill<Vec<u32>> = SqliteSpill::open(dir.db(), "log", Json).unwrap();
        let relay = RelayCellOf::spilling(&cx, Relay::new(RawFifo, spill(4, 1)).unwrap(), store).unwrap();
        let drain = relay.drain_into(&cell, nz(2)).unwrap();
        let mut delivered = Vec::new();
        let mut deepest = 0;
        for op in 0..1000u32 {
            assert!(matches!(relay.send(vec![op]), Ok(Sent::Accepted)), "{op}");
            deepest = deepest.max(relay.depth().get_untracked());
            // A transport slower than the producer: one delivery per 3 ops.
            if op % 3 == 0 {
                delivered.extend(deliver(&cell).into_iter().flatten());
            }
        }
        assert!(deepest <= 4, "memory bounded by the marks: {deepest}");
        let spilled = relay.spilled().get_untracked();
        assert!(spilled > 500, "the disk took the burst: {spilled}");
        assert!(relay.cold().get_untracked() > 0);
        let conn = rusqlite::Connection::open(dir.db()).unwrap();
        let rows = |conn: &rusqlite::Connection| -> u64 {
            let n: i64 = conn.query_row("SELECT count(*) FROM egress_spill WHERE name = 'log'", [], |r| r.get(0)).unwrap();
            n as u64
        };
        assert!(rows(&conn) <= spilled - 256, "reclaimed in batches while the replay goes on");
        while let Some(value) = deliver(&cell) {
            delivered.extend(value);
        }
        assert_eq!(delivered, (0..1000).collect::<Vec<_>>(), "every op once, in order");
        let s = relay.stats();
        assert_eq!((s.cold, s.depth, s.drained, s.accepted), (0, 0, 1000, 1000));
        assert_eq!(relay.spill_errors().get_untracked(), 0);
        // Every page was acknowledged: the store is empty again.
        assert_eq!(rows(&conn), 0, "reclaimed once acknowledged");
        drop(drain);
    }
}

#[test]
fn a_conflating_policy_spills_one_folded_entry_per_page() {
    let dir = TempDir::new();
    let cx = Context::new();
    let cell = EgressCell::new(&cx, Policy::default());
    let store: SqliteSpill<u32> = SqliteSpill::open(dir.db(), "cursor", Json).unwrap();
    let relay = RelayCell::spilling(&cx, Relay::new(KeepLatest, spill(8, 2)).unwrap(), store).unwrap();
    let _drain = relay.drain_into(&cell, nz(1)).unwrap();
    for op in 0..100u32 {
        relay.send(op).unwrap();
    }
    let peek = rusqlite::Connection::open(dir.db()).unwrap();
    let (rows, ops): (i64, i64) = peek
        .query_row("SELECT count(*), sum(ops) FROM egress_spill WHERE name = 'cursor'", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(ops as u64, relay.spilled().get_untracked());
    assert_eq!(rows * 8, ops, "each page of 8 ops is one row");
    let mut seen = Vec::new();
    while let Some(v) = deliver(&cell) {
        seen.push(v);
    }
    assert_eq!(seen.last(), Some(&99), "the newest value arrives last");
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "in order: {seen:?}");
    assert!(seen.len() < 40, "folded: {} records for 100 ops", seen.len());
}

#[test]
fn a_refused_commit_puts_the_page_back_and_the_op_comes_back() {
    let dir = TempDir::new();
    let cx = Context::new();
    let relay = fifo(&cx, &dir.db(), 2, 0);
    relay.send(vec![1]).unwrap();
    relay.send(vec![2]).unwrap();
    let conn = rusqlite::Connection::open(dir.db()).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER refuse BEFORE INSERT ON egress_spill BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
    )
    .unwrap();
    let before = relay.stats();
    match relay.send(vec![3]) {
        Err(SendRefused::SpillFailed { op, reason }) => {
            assert_eq!(op, vec![3]);
            assert!(reason.contains("disk full"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(relay.stats(), before, "the page is back, as it was");
    assert_eq!(relay.spill_errors().get_untracked(), 1);
    assert_eq!(relay.spill_now(), Err("sqlite: disk full".to_owned()));
    conn.execute_batch("DROP TRIGGER refuse").unwrap();
    assert_eq!(relay.send(vec![3]), Ok(Sent::Accepted));
    assert_eq!(relay.spilled().get_untracked(), 2);
    assert_eq!(relay.spill_now(), Ok(1), "the entry left, written out for a stop");
    assert_eq!(relay.spill_now(), Ok(0), "nothing held");
}

#[test]
fn a_restart_replays_what_was_not_acknowledged_before_anything_new() {
    let dir = TempDir::new();
    let mut delivered = Vec::new();
    {
        let cx = Context::new();
        let cell = EgressCell::new(&cx, Policy::default());
        let relay = fifo(&cx, &dir.db(), 4, 0);
        let _drain = relay.drain_into(&cell, nz(1)).unwrap();
        for op in 0..20u32 {
            relay.send(vec![op]).unwrap();
        }
        // Two delivered and acknowledged; the third claimed, never acked.
        delivered.extend(deliver(&cell).unwrap());
        delivered.extend(deliver(&cell).unwrap());
        let generation = cell.generation().get_untracked();
        assert!(cell.claim_with(generation, |o| matches!(o, ClaimOutcome::Claimed(_))));
        let held = relay.stats().ops;
        assert_eq!(relay.spill_now(), Ok(held));
        // Dropped without a stop, as a killed process leaves it.
    }
    let cx = Context::new();
    let cell = EgressCell::new(&cx, Policy::default());
    let relay = fifo(&cx, &dir.db(), 4, 0);
    let cold = relay.cold().get_untracked();
    assert!(cold > 0);
    relay.send(vec![100]).unwrap();
    let _drain = relay.drain_into(&cell, nz(1)).unwrap();
    while let Some(v) = deliver(&cell) {
        delivered.extend(v);
    }
    // The first was in memory only (drained before any page): lost with
    // the process. Every op a page held comes back, in order, before 100.
    assert_eq!(delivered.last(), Some(&100), "the new op after the replay: {delivered:?}");
    let replayed = &delivered[2..delivered.len() - 1];
    assert!(replayed.windows(2).all(|w| w[0] < w[1]), "in order: {replayed:?}");
    assert_eq!(replayed.len() as u64, cold, "one op per entry");
    // 1 was acknowledged but not yet reclaimed (reclaims go in batches,
    // or once the replay is over): at least once. 2 was claimed and never
    // acknowledged.
    assert!(replayed.starts_with(&[1, 2]), "{replayed:?}");
    assert_eq!(replayed.last(), Some(&19), "the newest op written out");
}

#[test]
fn a_store_says_what_it_holds() {
    let dir = TempDir::new();
    let cx = Context::new();
    let relay = fifo(&cx, &dir.db(), 2, 0);
    for op in 0..5u32 {
        relay.send(vec![op]).unwrap(); // two pages of two
    }
    let store: SqliteSpill<Vec<u32>> = SqliteSpill::open(dir.db(), "log", Json).unwrap();
    assert_eq!(store.name(), "log");
    assert_eq!(format!("{store:?}"), r#"SqliteSpill { name: "log", next_id: 4, .. }"#);
    assert_eq!(
        (store.stored_entries().unwrap(), store.stored_ops(None).unwrap(), store.stored_ops(Some(1)).unwrap()),
        (4, 4, 2)
    );
    let other: SqliteSpill<Vec<u32>> = SqliteSpill::open(dir.db(), "other", Json).unwrap();
    assert_eq!((other.stored_entries().unwrap(), format!("{other:?}").contains("next_id: 0")), (0, true));
}

#[test]
fn a_second_opener_fences_the_first() {
    let dir = TempDir::new();
    let cx = Context::new();
    let first = fifo(&cx, &dir.db(), 1, 0);
    first.send(vec![1]).unwrap();
    let mut second: SqliteSpill<Vec<u32>> = SqliteSpill::open(dir.db(), "log", Json).unwrap();
    match first.send(vec![2]) {
        Err(SendRefused::SpillFailed { reason, .. }) => assert!(reason.contains("taken over"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(first.stats().depth, 1, "the page is back");
    assert!(matches!(SqliteSpill::reclaim_through(&mut second, 5), Ok(())));
    assert_eq!(SpillStore::stored_ops(&mut second, None).unwrap(), 0);
}

#[test]
fn a_stored_value_that_does_not_decode_stops_the_replay_without_a_panic() {
    let dir = TempDir::new();
    {
        let cx = Context::new();
        let relay = fifo(&cx, &dir.db(), 2, 0);
        for op in 0..5u32 {
            relay.send(vec![op]).unwrap();
        }
    }
    let conn = rusqlite::Connection::open(dir.db()).unwrap();
    conn.execute("UPDATE egress_spill SET value = x'ff' WHERE id = 1", []).unwrap();
    let cx = Context::new();
    let cell = EgressCell::new(&cx, Policy::default());
    let relay = fifo(&cx, &dir.db(), 2, 0);
    let _drain = relay.drain_into(&cell, nz(4)).unwrap();
    // The read of a batch fails as a whole: nothing replayed, counted.
    assert_eq!(cell.pending_len().get_untracked(), 0);
    assert!(relay.spill_errors().get_untracked() >= 1);
    assert_eq!(relay.cold().get_untracked(), 4);
    let store: SqliteSpill<Vec<u32>> = SqliteSpill::open(dir.db(), "log", Json).unwrap();
    match store.read(None, 10) {
        Err(e @ StoreError::SpillValue { id: Some(1), .. }) => {
            assert!(e.to_string().starts_with("spill log: entry 1 does not decode"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    conn.execute("UPDATE egress_spill SET ops = 0 WHERE id = 0", []).unwrap();
    assert!(matches!(store.read(None, 1), Err(StoreError::OutOfRange { .. })));
}

/// The child of the SIGKILL test: sends ops forever through a spilling
/// relay cell into a cell a slow "transport" delivers from, and prints
/// each page's ops once written and each op once acknowledged.
#[test]
fn spill_child() {
    let Ok(db) = std::env::var("EGRESS_SPILL_CHILD") else { return };
    let cx = Context::new();
    let cell = EgressCell::new(&cx, Policy::default());
    let relay = fifo(&cx, std::path::Path::new(&db), 16, 4);
    let _drain = relay.drain_into(&cell, nz(2)).unwrap();
    for op in 0..1_000_000u32 {
        let window: Vec<u32> = relay.with_relay(|r| r.iter().flatten().copied().collect());
        let spilled = relay.spilled().get_untracked();
        relay.send(vec![op]).unwrap();
        if relay.spilled().get_untracked() != spilled {
            let page: Vec<String> = window.iter().map(u32::to_string).collect();
            println!("page {}", page.join(" "));
        }
        if op % 5 == 0
            && let Some(v) = deliver(&cell)
        {
            println!("acked {}", v[0]);
        }
    }
}

#[test]
fn a_process_killed_while_spilling_loses_nothing_a_page_held() {
    // Killed after a number of pages from a fixed list: early, mid-burst,
    // late.
    for pages in [1usize, 7, 23] {
        let dir = TempDir::new();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "spill_child", "--nocapture", "--test-threads=1"])
            .env("EGRESS_SPILL_CHILD", dir.db())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut written = BTreeSet::new();
        let mut acked = BTreeSet::new();
        let mut seen = 0;
        while seen < pages {
            let line = lines.next().expect("the child printed").unwrap();
            if let Some(page) = line.strip_prefix("page ") {
                written.extend(page.split(' ').map(|v| v.parse::<u32>().unwrap()));
                seen += 1;
            } else if let Some(v) = line.strip_prefix("acked ") {
                acked.insert(v.parse::<u32>().unwrap());
            }
        }
        child.kill().unwrap(); // SIGKILL
        let _ = child.wait();
        // What it printed before the kill is a lower bound of what it did.
        let cx = Context::new();
        let cell = EgressCell::new(&cx, Policy::default());
        let relay = fifo(&cx, &dir.db(), 16, 4);
        let _drain = relay.drain_into(&cell, nz(2)).unwrap();
        let mut replayed = Vec::new();
        while let Some(v) = deliver(&cell) {
            replayed.extend(v);
        }
        assert!(replayed.windows(2).all(|w| w[0] < w[1]), "in order, once: {replayed:?}");
        let replayed: BTreeSet<u32> = replayed.into_iter().collect();
        let lost: Vec<_> = written.difference(&acked).filter(|v| !replayed.contains(v)).collect();
        assert!(lost.is_empty(), "after {pages} pages, written and neither acknowledged nor replayed: {lost:?}");
        assert!(!written.is_empty());
        assert_eq!(relay.cold().get_untracked(), 0);
    }
}

/// A user's spill store over SQLite's that panics where told.
struct Bomb {
    inner: SqliteSpill<Vec<u32>>,
    panic_on: std::sync::Arc<std::sync::Mutex<&'static str>>,
}

impl Bomb {
    fn armed(&self, at: &str) -> bool {
        *self.panic_on.lock().unwrap() == at
    }
}

impl SpillStore<Vec<u32>> for Bomb {
    fn stored_ops(&mut self, after: Option<u64>) -> Result<u64, egress_reactive::SpillError> {
        SpillStore::stored_ops(&mut self.inner, after)
    }
    fn append(&mut self, page: &egress_core::SpillPage<Vec<u32>>) -> Result<(), egress_reactive::SpillError> {
        assert!(!self.armed("append"), "user store panicked appending");
        SpillStore::append(&mut self.inner, page)
    }
    fn read(
        &mut self,
        after: Option<u64>,
        max: usize,
    ) -> Result<Vec<egress_reactive::SpilledEntry<Vec<u32>>>, egress_reactive::SpillError> {
        assert!(!self.armed("read"), "user store panicked reading");
        SpillStore::read(&mut self.inner, after, max)
    }
    fn reclaim_through(&mut self, id: u64) -> Result<(), egress_reactive::SpillError> {
        assert!(!self.armed("reclaim"), "user store panicked reclaiming");
        SpillStore::reclaim_through(&mut self.inner, id)
    }
}

#[test]
fn a_panicking_store_puts_the_page_back_and_a_drain_goes_on_later() {
    let dir = TempDir::new();
    let cx = Context::new();
    let cell = EgressCell::new(&cx, Policy::default());
    let arm = std::sync::Arc::new(std::sync::Mutex::new("append"));
    let store = Bomb { inner: SqliteSpill::open(dir.db(), "log", Json).unwrap(), panic_on: arm.clone() };
    let relay = RelayCell::spilling(&cx, Relay::new(RawFifo, spill(2, 0)).unwrap(), store).unwrap();
    relay.send(vec![0]).unwrap();
    relay.send(vec![1]).unwrap();
    let before = relay.stats();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| relay.send(vec![2])));
    assert!(panicked.is_err(), "the store's panic goes on to the sender");
    assert_eq!(relay.stats(), before, "the page is back");
    assert_eq!(relay.spill_errors().get_untracked(), 1);
    *arm.lock().unwrap() = "read";
    assert_eq!(relay.send(vec![2]), Ok(Sent::Accepted));
    let _drain = relay.drain_into(&cell, nz(1)).unwrap();
    assert_eq!(cell.pending_len().get_untracked(), 0, "a read that panicked moves nothing");
    assert_eq!(relay.spill_errors().get_untracked(), 2);
    *arm.lock().unwrap() = "reclaim";
    relay.send(vec![3]).unwrap(); // a change: the drain runs again
    assert_eq!(deliver(&cell), Some(vec![0]));
    assert_eq!(relay.spill_errors().get_untracked(), 2, "one of two acknowledged: no reclaim yet");
    assert_eq!(deliver(&cell), Some(vec![1]));
    assert_eq!(relay.spill_errors().get_untracked(), 3, "the replay over: the reclaim panicked");
    *arm.lock().unwrap() = "";
    let mut rest = Vec::new();
    while let Some(v) = deliver(&cell) {
        rest.extend(v);
    }
    assert_eq!(rest, [2, 3]);
    let conn = rusqlite::Connection::open(dir.db()).unwrap();
    let left: i64 = conn.query_row("SELECT count(*) FROM egress_spill", [], |r| r.get(0)).unwrap();
    assert_eq!(left, 0, "reclaimed once the store works again");
}

#[test]
fn a_drain_into_another_cell_waits_and_a_store_emptied_under_the_relay_lets_it_go_on() {
    let dir = TempDir::new();
    let cx = Context::new();
    let (first, other) = (EgressCell::new(&cx, Policy::default()), EgressCell::new(&cx, Policy::default()));
    let relay = fifo(&cx, &dir.db(), 2, 0);
    for op in 0..5u32 {
        relay.send(vec![op]).unwrap();
    }
    let to_first = relay.drain_into(&first, nz(1)).unwrap();
    assert_eq!(deliver(&first), Some(vec![0]));
    let _to_other = relay.drain_into(&other, nz(8)).unwrap();
    assert_eq!(other.pending_len().get_untracked(), 0, "spilled entries go to the first drain's cell only");
    drop(to_first);
    let _again = relay.drain_into(&first, nz(8)).unwrap();
    let mut rest = Vec::new();
    while let Some(v) = deliver(&first) {
        rest.extend(v);
    }
    assert_eq!(rest, [1, 2, 3, 4], "a new drain into the first cell goes on");
    // The pages deleted under a relay (by another program) before its
    // replay: it finds nothing, says so, and its own entries go on.
    let dir = TempDir::new();
    let relay = fifo(&cx, &dir.db(), 2, 0);
    for op in 0..5u32 {
        relay.send(vec![op]).unwrap();
    }
    assert_eq!(relay.cold().get_untracked(), 4);
    let conn = rusqlite::Connection::open(dir.db()).unwrap();
    conn.execute("DELETE FROM egress_spill", []).unwrap();
    let cell = EgressCell::new(&cx, Policy::default());
    let _drain = relay.drain_into(&cell, nz(8)).unwrap();
    relay.send(vec![5]).unwrap();
    let mut rest = Vec::new();
    while let Some(v) = deliver(&cell) {
        rest.extend(v);
    }
    assert_eq!(rest, [4, 5], "the relay's own entries");
    assert_eq!(relay.cold().get_untracked(), 0);
    assert_eq!(relay.spill_errors().get_untracked(), 1);
}

// ----- found by a hostile review --------------------------------------

#[test]
fn a_fenced_store_reads_nothing_of_the_new_owners() {
    // It read on, and replayed the pages the new owner wrote.
    let dir = TempDir::new();
    let db = dir.db();
    let cx_a = Context::new();
    let a = fifo(&cx_a, &db, 2, 0);
    for op in 0..5u32 {
        a.send(vec![op]).unwrap();
    }
    assert_eq!(a.cold().get_untracked(), 4);
    let cx_b = Context::new();
    let cell_b = EgressCell::new(&cx_b, Policy::default());
    let b = fifo(&cx_b, &db, 2, 0); // takes the name over: A is fenced
    let drain_b = b.drain_into(&cell_b, nz(8)).unwrap();
    let mut got_b = Vec::new();
    while let Some(v) = deliver(&cell_b) {
        got_b.extend(v);
    }
    assert_eq!(got_b, [0, 1, 2, 3]);
    drop(drain_b);
    for op in 100..103u32 {
        b.send(vec![op]).unwrap();
    }
    let cell_a = EgressCell::new(&cx_a, Policy::default());
    let _drain_a = a.drain_into(&cell_a, nz(8)).unwrap();
    assert_eq!(deliver(&cell_a), None, "a fenced store replays nothing");
    assert!(a.spill_errors().get_untracked() >= 1);
}

#[test]
fn an_entry_put_back_after_a_spill_goes_before_the_page() {
    // It went behind the page written while it was out.
    let dir = TempDir::new();
    let cx = Context::new();
    let relay = fifo(&cx, &dir.db(), 2, 0);
    relay.send(vec![0]).unwrap();
    relay.send(vec![1]).unwrap();
    let taken = relay.pop().unwrap();
    relay.send(vec![2]).unwrap(); // full: [1] written out
    assert_eq!(relay.cold().get_untracked(), 1);
    relay.unpop(taken);
    let cell = EgressCell::new(&cx, Policy::default());
    let _drain = relay.drain_into(&cell, nz(8)).unwrap();
    let mut got = Vec::new();
    while let Some(v) = deliver(&cell) {
        got.extend(v);
    }
    assert_eq!(got, [0, 1, 2], "each op once, in order");
}

#[test]
fn an_entry_the_cell_refuses_as_full_after_a_spill_goes_back_before_the_page() {
    // The drain's put-back (a racing producer filled the cell and made
    // the relay spill) went behind the page.
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = TempDir::new();
    let cx = egress_reactive::ThreadSafeContext::new();
    let cell = EgressCellOf::with_options(&cx, Policy::default(), egress_reactive::CellOptions::default().capacity(2));
    let store: SqliteSpill<Vec<u32>> = SqliteSpill::open(dir.db(), "log", Json).unwrap();
    let relay: egress_reactive::ThreadSafeRelayCell<Vec<u32>, RawFifo> =
        RelayCellOf::spilling(&cx, Relay::new(RawFifo, spill(2, 0)).unwrap(), store).unwrap();
    let armed = Arc::new(AtomicBool::new(false));
    {
        let (relay, cell2, armed) = (relay.clone(), cell.clone(), armed.clone());
        cell.set_size_check(Some(Arc::new(move |_: &Vec<u32>| {
            if armed.swap(false, Ordering::SeqCst) {
                relay.send(vec![2]).unwrap();
                relay.send(vec![3]).unwrap();
                relay.send(vec![4]).unwrap(); // a page [2, 3] written
                cell2.enqueue(vec![999]); // the cell at capacity
            }
            None
        })));
    }
    relay.send(vec![0]).unwrap();
    cell.enqueue(vec![998]);
    let _drain = relay.drain_into(&cell, nz(8)).unwrap();
    armed.store(true, Ordering::SeqCst);
    relay.send(vec![1]).unwrap();
    let mut got = Vec::new();
    while let Some(v) = deliver(&cell) {
        got.extend(v);
    }
    got.retain(|v| *v < 900);
    assert_eq!(got, [0, 1, 2, 3, 4], "each op once, in order");
}

#[test]
fn a_refused_page_under_a_conflating_policy_comes_back_folded_with_every_op() {
    let dir = TempDir::new();
    let cx = Context::new();
    let cell = EgressCell::new(&cx, Policy::default());
    let store: SqliteSpill<u32> = SqliteSpill::open(dir.db(), "log", Json).unwrap();
    let relay = RelayCell::spilling(&cx, Relay::new(KeepLatest, spill(4, 0)).unwrap(), store).unwrap();
    for op in 0..4u32 {
        relay.send(op).unwrap();
    }
    let conn = rusqlite::Connection::open(dir.db()).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER refuse BEFORE INSERT ON egress_spill BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
    )
    .unwrap();
    let before = relay.stats();
    assert!(matches!(relay.send(4), Err(SendRefused::SpillFailed { .. })));
    let after = relay.stats();
    // As it was taken out: one entry folding the four ops.
    assert_eq!((after.depth, after.ops, after.accepted, after.full), (1, 4, before.accepted, true));
    assert_eq!(relay.with_relay(|r| r.iter().copied().collect::<Vec<_>>()), [3]);
    let _drain = relay.drain_into(&cell, nz(1)).unwrap();
    assert_eq!(deliver(&cell), Some(3));
}

#[test]
fn ops_the_store_lost_count_as_dropped_not_drained() {
    let dir = TempDir::new();
    let cx = Context::new();
    let relay = fifo(&cx, &dir.db(), 2, 0);
    for op in 0..5u32 {
        relay.send(vec![op]).unwrap();
    }
    let conn = rusqlite::Connection::open(dir.db()).unwrap();
    conn.execute("DELETE FROM egress_spill", []).unwrap();
    let cell = EgressCell::new(&cx, Policy::default());
    let _drain = relay.drain_into(&cell, nz(8)).unwrap();
    let mut got = Vec::new();
    while let Some(v) = deliver(&cell) {
        got.extend(v);
    }
    let s = relay.stats();
    assert_eq!(got, [4]);
    assert_eq!((s.drained, s.dropped, s.cold), (1, 4, 0), "drained counts what went into the cell");
    assert_eq!(s.accepted, s.ops + s.drained + s.cold + s.dropped);
}

#[test]
fn an_entry_holding_more_ops_than_counted_cold_still_lets_the_rest_of_the_store_go_first() {
    let dir = TempDir::new();
    let db = dir.db();
    {
        let cx = Context::new();
        let relay = fifo(&cx, &db, 2, 0);
        for op in 0..5u32 {
            relay.send(vec![op]).unwrap();
        }
        relay.spill_now().unwrap();
    }
    let conn = rusqlite::Connection::open(&db).unwrap();
    let cx = Context::new();
    let relay = fifo(&cx, &db, 2, 0);
    conn.execute("UPDATE egress_spill SET ops = 100 WHERE id = 0", []).unwrap();
    relay.send(vec![5]).unwrap();
    let cell = EgressCell::new(&cx, Policy::default());
    let _drain = relay.drain_into(&cell, nz(8)).unwrap();
    let mut got = Vec::new();
    while let Some(v) = deliver(&cell) {
        got.extend(v);
    }
    assert_eq!(got, [0, 1, 2, 3, 4, 5], "every op a page held, in order");
    assert_eq!(relay.spill_errors().get_untracked(), 1, "the row's count disagreed: counted");
    assert_eq!(relay.cold().get_untracked(), 0);
}

/// A codec over JSON that refuses to write 13 and panics writing 14: a
/// user's codec, called while a page is written.
struct Picky;

impl egress_codec::Encode<Vec<u32>> for Picky {
    fn encode(&self, value: &Vec<u32>) -> Result<bytes::Bytes, egress_codec::CodecError> {
        assert!(!value.contains(&14), "the codec panicked");
        if value.contains(&13) {
            return Err("13 has no encoding".into());
        }
        egress_codec::Encode::encode(&Json, value)
    }
}

impl egress_codec::Codec<Vec<u32>> for Picky {
    fn decode(&self, bytes: &bytes::Bytes) -> Result<Vec<u32>, egress_codec::CodecError> {
        egress_codec::Codec::decode(&Json, bytes)
    }
}

#[test]
fn a_codec_that_refuses_or_panics_on_a_page_writes_nothing_and_loses_nothing() {
    let dir = TempDir::new();
    let cx = Context::new();
    let store: SqliteSpill<Vec<u32>> = SqliteSpill::open(dir.db(), "log", Picky).unwrap();
    let relay = RelayCell::spilling(&cx, Relay::new(RawFifo, spill(2, 0)).unwrap(), store).unwrap();
    for bad in [13u32, 14] {
        relay.send(vec![1]).unwrap();
        relay.send(vec![bad]).unwrap();
        let before = relay.stats();
        // The page [1], [bad] does not encode (a refusal, or a panic the
        // store turns into one): nothing written, the page back, the op
        // back.
        match relay.send(vec![2]) {
            Err(SendRefused::SpillFailed { op, reason }) => {
                assert_eq!(op, vec![2]);
                assert!(reason.contains("does not encode"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(relay.stats(), before);
        let conn = rusqlite::Connection::open(dir.db()).unwrap();
        let rows: i64 = conn.query_row("SELECT count(*) FROM egress_spill", [], |r| r.get(0)).unwrap();
        assert_eq!(rows, 0, "a page is written whole or not at all");
        // Drained by hand, the relay goes on; the entries are all there.
        let held: Vec<Vec<u32>> = relay.with_relay(|r| r.iter().cloned().collect());
        assert_eq!(held, [vec![1], vec![bad]]);
        while relay.pop().is_some() {}
    }
    assert_eq!(relay.spill_errors().get_untracked(), 2);
    relay.send(vec![5]).unwrap();
    relay.send(vec![6]).unwrap();
    assert_eq!(relay.send(vec![7]), Ok(Sent::Accepted), "a page that encodes is written");
    assert_eq!(relay.cold().get_untracked(), 2);
}
