//! A relay cell with a spill store (`RelayCellOf::spilling`), on every
//! flavour, over a store kept in this test (the SQLite one is
//! egress-store's, tested there with a killed process): pages written when
//! full and replayed ahead of the relay's entries into the drain's cell,
//! reclaimed in batches once acknowledged; every store call failing or
//! panicking leaves nothing lost and the counts right; a restart's stored
//! ops replayed first; a cold entry refused for good reclaimed; a drain
//! into another cell waiting.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use egress_core::{
    Backpressure, ClaimOutcome, KeepLatest, Overflow, Policy, RawFifo, Relay, SendRefused, Sent, SpillPage, Water,
};
use egress_reactive::{CellFlavor, EgressCellOf, RelayCellOf, SpillError, SpillStore, SpilledEntry};

fn nz(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap()
}

fn spill(high: u64, low: u64) -> Backpressure {
    Backpressure::count(Water::new(high, low), Overflow::Spill)
}

/// What the test sees of a store: its entries, and which call fails or
/// panics.
#[derive(Default)]
struct Disk<T> {
    entries: VecDeque<SpilledEntry<T>>,
    next: u64,
    /// `("append" | "read" | "reclaim" | "stored", panic?)`.
    broken: Option<(&'static str, bool)>,
    appends: u64,
    reclaims: u64,
}

/// A spill store in memory, shared with the test.
struct Shared<T>(Arc<Mutex<Disk<T>>>);

/// The disk, even after a panic in the store poisoned its lock.
fn lock<T>(disk: &Mutex<Disk<T>>) -> std::sync::MutexGuard<'_, Disk<T>> {
    disk.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<T> Shared<T> {
    fn check(disk: &Disk<T>, call: &str) -> Result<(), SpillError> {
        match disk.broken {
            Some((c, true)) if c == call => panic!("the store panicked in {call}"),
            Some((c, false)) if c == call => Err(format!("{call} failed").into()),
            _ => Ok(()),
        }
    }
}

impl<T: Clone> SpillStore<T> for Shared<T> {
    fn stored_ops(&mut self, after: Option<u64>) -> Result<u64, SpillError> {
        let disk = lock(&self.0);
        Self::check(&disk, "stored")?;
        Ok(disk.entries.iter().filter(|e| after.is_none_or(|a| e.id > a)).map(|e| e.ops).sum())
    }

    fn append(&mut self, page: &SpillPage<T>) -> Result<(), SpillError> {
        let mut disk = lock(&self.0);
        Self::check(&disk, "append")?;
        for entry in page.entries() {
            let id = disk.next;
            disk.next += 1;
            disk.entries.push_back(SpilledEntry { id, value: entry.value.clone(), ops: entry.ops });
        }
        disk.appends += 1;
        Ok(())
    }

    fn read(&mut self, after: Option<u64>, max: usize) -> Result<Vec<SpilledEntry<T>>, SpillError> {
        let disk = lock(&self.0);
        Self::check(&disk, "read")?;
        Ok(disk.entries.iter().filter(|e| after.is_none_or(|a| e.id > a)).take(max).cloned().collect())
    }

    fn reclaim_through(&mut self, id: u64) -> Result<(), SpillError> {
        let mut disk = lock(&self.0);
        Self::check(&disk, "reclaim")?;
        disk.entries.retain(|e| e.id > id);
        disk.reclaims += 1;
        Ok(())
    }
}

/// Claims the next pending record of `cell` and acknowledges it.
fn deliver<T: Clone + 'static, F: CellFlavor<T>>(cell: &EgressCellOf<T, F>) -> Option<T> {
    let generation = cell.generation().get_untracked();
    let (seq, value) = cell.claim_with(generation, |outcome| match outcome {
        ClaimOutcome::Claimed(e) => Some((e.sequence, (*e.payload).clone())),
        _ => None,
    })?;
    let _ = cell.ack(generation, seq);
    Some(value)
}

type Store<T> = Arc<Mutex<Disk<T>>>;

fn store<T>() -> Store<T> {
    Arc::new(Mutex::new(Disk { entries: VecDeque::new(), next: 0, broken: None, appends: 0, reclaims: 0 }))
}

fn break_at<T>(disk: &Store<T>, call: &'static str, panics: bool) {
    lock(disk).broken = Some((call, panics));
}

fn mend<T>(disk: &Store<T>) {
    lock(disk).broken = None;
}

each_flavour! {
    fn pages_replay_first_in_order_and_are_reclaimed_in_batches_once_acknowledged(cx) {
        let disk = store::<Vec<u32>>();
        let cell = EgressCellOf::new(&cx, Policy::default());
        let relay = RelayCellOf::spilling(&cx, Relay::new(RawFifo, spill(4, 1)).unwrap(), Shared(disk.clone())).unwrap();
        let (spilled, cold) = (watch!(cx, relay.spilled()), watch!(cx, relay.cold()));
        let _drain = relay.drain_into(&cell, nz(2)).unwrap();
        let mut delivered = Vec::new();
        let mut stored_most = 0;
        for op in 0..1200u32 {
            assert_eq!(relay.send(vec![op]), Ok(Sent::Accepted));
            assert!(relay.depth().get_untracked() <= 4);
            stored_most = stored_most.max(lock(&disk).entries.len());
            if op % 3 == 0 {
                delivered.extend(deliver(&cell).into_iter().flatten());
            }
        }
        assert!(spilled.get() > 0 && cold.get() > 0, "the readers followed");
        let s = relay.stats();
        assert!(s.spilled > 700, "{s:?}");
        assert_eq!(relay.spilled().get_untracked(), s.spilled);
        assert_eq!(relay.cold().get_untracked(), s.cold);
        let reclaims = lock(&disk).reclaims;
        assert!(reclaims >= 1, "reclaimed in batches while the replay went on");
        let stored = lock(&disk).entries.len() as u64;
        assert!(stored < s.spilled, "{stored} of {}", s.spilled);
        while let Some(v) = deliver(&cell) {
            delivered.extend(v);
        }
        assert_eq!(delivered, (0..1200).collect::<Vec<_>>(), "every op once, in order");
        let s = relay.stats();
        assert_eq!((s.cold, s.depth, s.drained, s.accepted, s.ops), (0, 0, 1200, 1200, 0));
        assert!(lock(&disk).entries.is_empty(), "every entry reclaimed once the replay was over");
        assert_eq!(relay.spill_errors().get_untracked(), 0);
        // A batch is at least 256 entries, but for the last.
        let d = lock(&disk);
        assert!(d.reclaims <= s.spilled / 256 + 1, "{} reclaims for {} entries", d.reclaims, s.spilled);
        assert!(stored_most > 256, "{stored_most}");
    }

    fn every_store_call_that_fails_or_panics_loses_nothing(cx) {
        let disk = store::<Vec<u32>>();
        let cell = EgressCellOf::new(&cx, Policy::default());
        let relay = RelayCellOf::spilling(&cx, Relay::new(RawFifo, spill(2, 0)).unwrap(), Shared(disk.clone())).unwrap();
        let errors = watch!(cx, relay.spill_errors());
        relay.send(vec![0]).unwrap();
        relay.send(vec![1]).unwrap();
        let before = relay.stats();
        // An append refused: the page back, the op back.
        break_at(&disk, "append", false);
        match relay.send(vec![2]) {
            Err(SendRefused::SpillFailed { op, reason }) => assert_eq!((op, reason.as_str()), (vec![2], "append failed")),
            other => panic!("{other:?}"),
        }
        assert_eq!(relay.stats(), before);
        assert_eq!((errors.get(), relay.spill_errors().get_untracked()), (1, 1));
        assert_eq!(relay.spill_now(), Err("append failed".to_owned()));
        // An append that panics: the page back, the panic to the sender.
        break_at(&disk, "append", true);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| relay.send(vec![2])));
        assert!(panicked.is_err());
        assert_eq!(relay.stats(), before);
        assert_eq!(relay.spill_errors().get_untracked(), 3);
        mend(&disk);
        assert_eq!(relay.send(vec![2]), Ok(Sent::Accepted));
        assert_eq!(relay.stats().cold, 2);
        // A read refused, then one that panics: nothing moves.
        break_at(&disk, "read", false);
        let drain = relay.drain_into(&cell, nz(1)).unwrap();
        assert_eq!(cell.pending_len().get_untracked(), 0);
        assert_eq!(relay.spill_errors().get_untracked(), 4);
        break_at(&disk, "read", true);
        relay.send(vec![3]).unwrap(); // the drain runs again
        assert_eq!(cell.pending_len().get_untracked(), 0);
        assert_eq!(relay.spill_errors().get_untracked(), 5);
        assert!(!drain.is_stopped(), "a panicking read does not stop the drain");
        // Reclaims refused, then panicking: counted, tried again. (A new
        // drain's first run reads again.)
        break_at(&disk, "reclaim", false);
        drop(drain);
        let _again = relay.drain_into(&cell, nz(1)).unwrap();
        assert_eq!(deliver(&cell), Some(vec![0]));
        assert_eq!(relay.spill_errors().get_untracked(), 5, "one of two acknowledged: no reclaim yet");
        assert_eq!(deliver(&cell), Some(vec![1]));
        assert_eq!(relay.spill_errors().get_untracked(), 6, "the replay over: the reclaim failed");
        break_at(&disk, "reclaim", true);
        assert_eq!(deliver(&cell), Some(vec![2]));
        // Tried again at each run of the drain (the ack's, the claim's):
        // it panicked each time.
        assert!(relay.spill_errors().get_untracked() >= 7, "{}", relay.spill_errors().get_untracked());
        assert_eq!(lock(&disk).entries.len(), 2, "nothing deleted");
        mend(&disk);
        let mut rest = Vec::new();
        while let Some(v) = deliver(&cell) {
            rest.extend(v);
        }
        assert_eq!(rest, [3]);
        assert!(lock(&disk).entries.is_empty());
        assert_eq!(relay.stats().accepted, relay.stats().drained);
        // A store that cannot say what it holds builds no relay cell.
        break_at(&disk, "stored", false);
        let refused = RelayCellOf::spilling(&cx, Relay::new(RawFifo, spill(2, 0)).unwrap(), Shared(disk.clone()));
        assert_eq!(refused.map(|_| ()).unwrap_err().to_string(), "stored failed");
    }

    fn a_restart_replays_the_stored_ops_before_the_new_ones(cx) {
        let disk = store::<u32>();
        lock(&disk).entries.extend([
            SpilledEntry { id: 7, value: 70, ops: 3 },
            SpilledEntry { id: 9, value: 90, ops: 1 },
        ]);
        lock(&disk).next = 10;
        let cell = EgressCellOf::new(&cx, Policy::default());
        let relay = RelayCellOf::spilling(&cx, Relay::new(KeepLatest, spill(4, 0)).unwrap(), Shared(disk.clone())).unwrap();
        assert_eq!(relay.cold().get_untracked(), 4, "the stored ops are cold");
        relay.send(100).unwrap();
        assert_eq!(relay.pop(), None, "nothing pops while an op is cold");
        let _drain = relay.drain_into(&cell, nz(8)).unwrap();
        let mut seen = Vec::new();
        while let Some(v) = deliver(&cell) {
            seen.push(v);
        }
        assert_eq!(seen, [70, 90, 100]);
        let s = relay.stats();
        assert_eq!((s.cold, s.drained, s.spilled), (4 - 4, 5, 0));
        assert!(lock(&disk).entries.is_empty());
    }

    fn a_cold_entry_refused_for_good_is_counted_and_reclaimed(cx) {
        let disk = store::<Vec<u8>>();
        let cell = EgressCellOf::new(&cx, Policy::default());
        cell.set_size_check(Some(Arc::new(|v: &Vec<u8>| (v.len() > 2).then_some((v.len(), 2)))));
        let relay = RelayCellOf::spilling(&cx, Relay::new(RawFifo, spill(2, 0)).unwrap(), Shared(disk.clone())).unwrap();
        relay.send(vec![1, 2, 3]).unwrap();
        relay.send(vec![4]).unwrap();
        relay.send(vec![5]).unwrap(); // spills the first two
        let _drain = relay.drain_into(&cell, nz(8)).unwrap();
        assert_eq!(relay.rejected().get_untracked(), 1);
        assert_eq!((deliver(&cell), deliver(&cell), deliver(&cell)), (Some(vec![4]), Some(vec![5]), None));
        assert!(lock(&disk).entries.is_empty(), "the refused entry reclaimed with the acknowledged one");
        assert_eq!(relay.stats().drained, 3);
    }

    fn a_drain_into_another_cell_waits_while_an_op_is_cold(cx) {
        let disk = store::<u32>();
        let (first, other) = (EgressCellOf::new(&cx, Policy::default()), EgressCellOf::new(&cx, Policy::default()));
        let relay = RelayCellOf::spilling(&cx, Relay::new(KeepLatest, spill(1, 0)).unwrap(), Shared(disk.clone())).unwrap();
        relay.send(1).unwrap();
        relay.send(2).unwrap(); // 1 spilled
        relay.send(3).unwrap(); // 2 spilled
        let _to_first = relay.drain_into(&first, nz(1)).unwrap();
        let _to_other = relay.drain_into(&other, nz(8)).unwrap();
        assert_eq!((first.pending_len().get_untracked(), other.pending_len().get_untracked()), (1, 0));
        assert_eq!(relay.stats().depth, 1, "3 waits behind the cold op");
        assert_eq!(deliver(&first), Some(1));
        // The last cold op to the first cell; then the other drain takes
        // the relay's entry.
        assert_eq!((deliver(&first), deliver(&other)), (Some(2), Some(3)));
    }

    fn a_batch_of_exactly_256_acknowledged_entries_is_reclaimed_while_the_replay_goes_on(cx) {
        let disk = store::<Vec<u32>>();
        // A window wide enough to have 256 in flight at once.
        let cell = EgressCellOf::new(&cx, Policy::builder().inflight_limit(512).build().unwrap());
        let relay = RelayCellOf::spilling(&cx, Relay::new(RawFifo, spill(300, 0)).unwrap(), Shared(disk.clone())).unwrap();
        for op in 0..301u32 {
            relay.send(vec![op]).unwrap(); // the 301st writes the first 300 out
        }
        assert_eq!(relay.cold().get_untracked(), 300);
        let _drain = relay.drain_into(&cell, nz(256)).unwrap();
        assert_eq!(cell.pending_len().get_untracked(), 256);
        let generation = cell.generation().get_untracked();
        let mut last = None;
        for _ in 0..256 {
            last = cell.claim_with(generation, |o| match o {
                ClaimOutcome::Claimed(e) => Some(e.sequence),
                _ => None,
            });
            assert!(last.is_some());
        }
        assert_eq!(lock(&disk).reclaims, 0);
        let _ = cell.ack(generation, last.unwrap());
        assert_eq!(relay.cold().get_untracked(), 0, "the acks made room: the rest replayed");
        assert_eq!(lock(&disk).reclaims, 1, "256 acknowledged: one batch reclaimed");
        assert_eq!(lock(&disk).entries.len(), 300 - 256);
    }

    fn a_full_relay_without_a_store_asks_and_spill_now_without_one_writes_nothing(cx) {
        let relay = RelayCellOf::new(&cx, RawFifo, spill(1, 0)).unwrap();
        relay.send(vec![1u8]).unwrap();
        assert_eq!(relay.send(vec![2]), Err(SendRefused::MustSpill(vec![2])));
        assert_eq!(relay.spill_now(), Ok(0));
        assert_eq!((relay.stats().depth, relay.spill_errors().get_untracked()), (1, 0));
    }
}
