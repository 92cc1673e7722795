//! The relay ahead of enqueue (`Relay`): the laws each built-in merge
//! policy claims, each rule of the relay's docs as a test, random
//! schedules checked against a model written from the rules, and the
//! convergence law (what the drain delivered, folded, equals the fold of
//! every op taken) for every built-in policy and any drain schedule.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::fmt::Debug;

use egress_core::{
    Backpressure, KeepLatest, Max, MergePolicy, Overflow, RawFifo, Relay, RelayConfigError, RelayStats, SendRefused,
    Sent, SetUnion, Sum, Water,
};
use proptest::prelude::*;

fn fold<T: Clone, M: MergePolicy<T>>(policy: &M, ops: &[T]) -> Option<T> {
    let (first, rest) = ops.split_first()?;
    let mut acc = first.clone();
    for op in rest {
        policy.merge(&mut acc, op.clone());
    }
    Some(acc)
}

fn merged<T, M: MergePolicy<T>>(policy: &M, mut a: T, b: T) -> T {
    policy.merge(&mut a, b);
    a
}

/// Checks the laws `M` declares on `a`, `b`, `c`: associativity always,
/// commutativity and idempotence as declared.
fn laws<T: Clone + PartialEq + Debug, M: MergePolicy<T>>(policy: &M, a: T, b: T, c: T) {
    let left = merged(policy, merged(policy, a.clone(), b.clone()), c.clone());
    let right = merged(policy, a.clone(), merged(policy, b.clone(), c));
    assert_eq!(left, right, "associative");
    if M::COMMUTATIVE {
        assert_eq!(merged(policy, a.clone(), b.clone()), merged(policy, b, a.clone()), "commutative");
    }
    if M::IDEMPOTENT {
        assert_eq!(merged(policy, a.clone(), a.clone()), a, "idempotent");
    }
}

proptest! {
    #[test]
    fn keep_latest_keeps_its_laws(a: u32, b: u32, c: u32) {
        laws(&KeepLatest, a, b, c);
        prop_assert_eq!(merged(&KeepLatest, a, b), b);
    }

    #[test]
    fn max_keeps_its_laws(a: i64, b: i64, c: i64) {
        laws(&Max, a, b, c);
        prop_assert_eq!(merged(&Max, a, b), a.max(b));
    }

    #[test]
    fn sum_keeps_its_laws_saturating_unsigned_and_wrapping_signed(a: u64, b: u64, c: u64, x: i32, y: i32, z: i32, p: u8, q: u8, r: u8) {
        laws(&Sum, a, b, c);
        laws(&Sum, x, y, z);
        laws(&Sum, p, q, r);
        prop_assert_eq!(merged(&Sum, a, b), a.saturating_add(b));
        prop_assert_eq!(merged(&Sum, x, y), x.wrapping_add(y));
    }

    #[test]
    fn set_union_keeps_its_laws(a: BTreeSet<u8>, b: BTreeSet<u8>, c: BTreeSet<u8>, x: HashSet<u8>, y: HashSet<u8>, z: HashSet<u8>) {
        laws(&SetUnion, a.clone(), b.clone(), c);
        laws(&SetUnion, x, y, z);
        prop_assert_eq!(merged(&SetUnion, a.clone(), b.clone()), a.union(&b).copied().collect::<BTreeSet<_>>());
    }

    #[test]
    fn raw_fifo_keeps_its_laws(a: Vec<u8>, b: Vec<u8>, c: Vec<u8>) {
        laws(&RawFifo, a.clone(), b.clone(), c);
        prop_assert_eq!(merged(&RawFifo, a.clone(), b.clone()), [a, b].concat());
    }
}

#[test]
fn the_declared_laws_are_not_understated_or_overstated() {
    // KeepLatest is not commutative; Sum and RawFifo are not idempotent;
    // RawFifo is not commutative: a counterexample of each.
    assert!(
        !<KeepLatest as MergePolicy<u8>>::COMMUTATIVE && merged(&KeepLatest, 1u8, 2) != merged(&KeepLatest, 2u8, 1)
    );
    assert!(!<Sum as MergePolicy<u8>>::IDEMPOTENT && merged(&Sum, 1u8, 1) != 1);
    assert!(!<RawFifo as MergePolicy<Vec<u8>>>::IDEMPOTENT && merged(&RawFifo, vec![1u8], vec![1]) != vec![1]);
    const {
        assert!(!<RawFifo as MergePolicy<Vec<u8>>>::COMMUTATIVE);
        assert!(!<RawFifo as MergePolicy<Vec<u8>>>::CONFLATES);
        assert!(<KeepLatest as MergePolicy<u8>>::CONFLATES && <SetUnion as MergePolicy<BTreeSet<u8>>>::IDEMPOTENT);
    }
    // Max keeps the first of equal ops.
    #[derive(Debug, Clone, Copy)]
    struct Tagged(u8, char);
    impl PartialEq for Tagged {
        fn eq(&self, other: &Self) -> bool {
            self.0 == other.0
        }
    }
    impl Eq for Tagged {}
    impl PartialOrd for Tagged {
        fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for Tagged {
        fn cmp(&self, other: &Self) -> std::cmp::Ordering {
            self.0.cmp(&other.0)
        }
    }
    assert_eq!(merged(&Max, Tagged(1, 'a'), Tagged(1, 'b')).1, 'a');
    assert_eq!(merged(&Max, Tagged(1, 'a'), Tagged(2, 'b')).1, 'b');
}

fn count(high: u64, low: u64, overflow: Overflow) -> Backpressure {
    Backpressure::count(Water::new(high, low), overflow)
}

#[test]
fn a_relay_refuses_bounds_it_cannot_keep() {
    let err = |bp| Relay::<u64, Sum>::weighed(Sum, bp, |v| *v).unwrap_err();
    assert_eq!(err(count(0, 0, Overflow::Block)), RelayConfigError::ZeroHigh { dimension: "count" });
    assert_eq!(
        err(count(4, 4, Overflow::Block)),
        RelayConfigError::NoHysteresis { dimension: "count", high: 4, low: 4 }
    );
    assert_eq!(
        err(count(4, 1, Overflow::Block).with_bytes(Water::new(0, 0))),
        RelayConfigError::ZeroHigh { dimension: "bytes" }
    );
    assert_eq!(
        err(count(4, 1, Overflow::Block).with_bytes(Water::new(10, 11))),
        RelayConfigError::NoHysteresis { dimension: "bytes", high: 10, low: 11 }
    );
    assert_eq!(
        Relay::<Vec<u8>, RawFifo>::new(RawFifo, count(4, 1, Overflow::Conflate)).unwrap_err(),
        RelayConfigError::ConflateNotBounding
    );
    assert_eq!(
        Relay::<u64, Sum>::new(Sum, count(4, 1, Overflow::Block).with_bytes(Water::new(10, 5))).unwrap_err(),
        RelayConfigError::NoWeigher
    );
    // The edges that are allowed: low one below high, RawFifo blocking.
    assert!(Relay::<u64, Sum>::weighed(Sum, count(1, 0, Overflow::Block).with_bytes(Water::new(1, 0)), |v| *v).is_ok());
    assert!(Relay::<Vec<u8>, RawFifo>::new(RawFifo, count(4, 1, Overflow::DropOldest)).is_ok());
}

#[test]
fn block_is_full_at_high_and_not_full_again_until_low() {
    let mut relay = Relay::new(KeepLatest, count(4, 1, Overflow::Block)).unwrap();
    for op in 0..4u32 {
        assert_eq!(relay.send(op), Ok(Sent::Accepted));
        assert_eq!(relay.stats().full, op == 3, "full at high");
    }
    assert!(matches!(relay.send(4), Err(SendRefused::Blocked(4))));
    // Drained to 2 (above low), there is room, but it stays full.
    assert_eq!(relay.pop().map(|d| d.value), Some(0));
    assert_eq!(relay.pop().map(|d| d.value), Some(1));
    assert!(relay.stats().full);
    assert_eq!(relay.send(5).map_err(SendRefused::into_op), Err(5));
    // Down to low: not full.
    assert_eq!(relay.pop().map(|d| d.value), Some(2));
    assert!(!relay.stats().full);
    assert_eq!(relay.send(6), Ok(Sent::Accepted));
    let stats = relay.stats();
    assert_eq!(
        stats,
        RelayStats {
            depth: 2,
            ops: 2,
            bytes: 0,
            full: false,
            accepted: 5,
            conflated: 0,
            dropped: 0,
            blocked: 2,
            drained: 3,
            spilled: 0,
            cold: 0,
        }
    );
    assert_eq!(relay.iter().copied().collect::<Vec<_>>(), vec![3, 6]);
    assert!(!relay.is_empty());
    let debug = format!("{relay:?}");
    assert!(debug.starts_with("Relay { depth: 2, ops: 2, bytes: 0, full: false"), "{debug}");
    assert_eq!(format!("{:?}", SendRefused::Blocked(4)), "Blocked");
    let too_large = SendRefused::TooLarge { op: 4, bytes: 9, limit: 8 };
    assert_eq!(format!("{too_large:?}"), "TooLarge { bytes: 9, limit: 8 }");
    assert_eq!(too_large.to_string(), "the op weighs 9 bytes, above the relay's high water mark of 8");
    while relay.pop().is_some() {}
    assert!(relay.is_empty());
}

#[test]
fn an_op_heavier_than_high_water_is_refused_whatever_the_action_and_changes_nothing() {
    for overflow in [Overflow::Block, Overflow::DropNewest, Overflow::DropOldest, Overflow::Conflate] {
        let bp = count(8, 1, overflow).with_bytes(Water::new(100, 10));
        let mut relay = Relay::weighed(Sum, bp, |v: &u64| *v).unwrap();
        assert_eq!(relay.send(100), Ok(Sent::Accepted), "{overflow:?}: exactly high fits");
        let before = relay.stats();
        assert!(before.full, "{overflow:?}: at high in bytes");
        match relay.send(101) {
            Err(SendRefused::TooLarge { op: 101, bytes: 101, limit: 100 }) => {}
            other => panic!("{overflow:?}: {other:?}"),
        }
        assert_eq!(relay.stats(), before, "{overflow:?}: nothing changed");
    }
}

#[test]
fn drop_newest_drops_while_full_and_counts_it() {
    let mut relay = Relay::new(KeepLatest, count(2, 0, Overflow::DropNewest)).unwrap();
    assert_eq!(relay.send('a'), Ok(Sent::Accepted));
    assert_eq!(relay.send('b'), Ok(Sent::Accepted));
    assert_eq!(relay.send('c'), Ok(Sent::Dropped));
    assert_eq!(relay.pop().map(|d| d.value), Some('a'));
    // Room for one, but full until low (0).
    assert_eq!(relay.send('d'), Ok(Sent::Dropped));
    assert_eq!(relay.pop().map(|d| d.value), Some('b'));
    assert_eq!(relay.send('e'), Ok(Sent::Accepted));
    let s = relay.stats();
    assert_eq!((s.accepted, s.dropped, s.drained, s.depth), (3, 2, 2, 1));
}

#[test]
fn drop_oldest_drops_entries_until_the_op_fits_counting_their_ops() {
    let bp = count(3, 0, Overflow::DropOldest).with_bytes(Water::new(10, 2));
    let mut relay = Relay::weighed(Sum, bp, |v: &u64| *v).unwrap();
    for op in [2u64, 3, 4] {
        assert_eq!(relay.send(op), Ok(Sent::Accepted));
    }
    // 3 entries: full; a 1 drops the oldest (2) to fit by count.
    assert_eq!(relay.send(1), Ok(Sent::DroppedOldest { ops: 1 }));
    assert_eq!(relay.iter().copied().collect::<Vec<_>>(), vec![3, 4, 1]);
    // A 9 must drop 3 and 4 to fit 10 bytes (1 + 9).
    assert_eq!(relay.send(9), Ok(Sent::DroppedOldest { ops: 2 }));
    assert_eq!(relay.iter().copied().collect::<Vec<_>>(), vec![1, 9]);
    let s = relay.stats();
    assert_eq!((s.accepted, s.dropped, s.bytes, s.depth, s.full), (5, 3, 10, 2, true));
    // Drained to 1 entry of 9 bytes: room, but still full (above both low
    // marks): an op that fits is taken without a drop.
    assert_eq!(relay.pop().map(|d| d.value), Some(1));
    assert!(relay.stats().full);
    assert_eq!(relay.send(1), Ok(Sent::DroppedOldest { ops: 0 }));
    assert_eq!(relay.iter().copied().collect::<Vec<_>>(), vec![9, 1]);
}

#[test]
fn conflate_folds_into_the_newest_entry_and_the_drain_folds_to_the_same() {
    let mut relay = Relay::new(Sum, count(2, 0, Overflow::Conflate)).unwrap();
    for op in 1..=10u64 {
        let sent = relay.send(op).unwrap();
        assert_eq!(sent, if op <= 2 { Sent::Accepted } else { Sent::Conflated });
    }
    let s = relay.stats();
    assert_eq!((s.depth, s.ops, s.accepted, s.conflated), (2, 10, 10, 8));
    let first = relay.pop().unwrap();
    let second = relay.pop().unwrap();
    assert_eq!((first.value, first.ops, second.value, second.ops), (1, 1, 54, 9));
    assert_eq!(relay.pop(), None);
    assert!(!relay.stats().full);
}

#[test]
fn conflate_folds_the_newest_entries_together_while_above_high_in_bytes() {
    fn weigh(s: &BTreeSet<u8>) -> u64 {
        s.len() as u64
    }
    let bp = count(3, 0, Overflow::Conflate).with_bytes(Water::new(4, 1));
    let mut relay = Relay::weighed(SetUnion, bp, weigh).unwrap();
    let set = |v: &[u8]| v.iter().copied().collect::<BTreeSet<u8>>();
    assert_eq!(relay.send(set(&[1])), Ok(Sent::Accepted));
    assert_eq!(relay.send(set(&[2])), Ok(Sent::Accepted));
    assert_eq!(relay.send(set(&[3])), Ok(Sent::Accepted));
    // Full by count: {4, 5} folds into {3}: 1 + 1 + 3 = 5 bytes > 4, so
    // the newest two fold together: {1}, {2, 3, 4, 5} = 5 > 4 again, so
    // all of it: {1, 2, 3, 4, 5}, one entry, as small as it gets.
    assert_eq!(relay.send(set(&[4, 5])), Ok(Sent::Conflated));
    let s = relay.stats();
    assert_eq!((s.depth, s.ops, s.bytes), (1, 4, 5));
    assert_eq!(relay.front(), Some(&set(&[1, 2, 3, 4, 5])));
    // A fold that shrinks back within bounds stops folding as soon as it fits.
    let mut relay =
        Relay::weighed(SetUnion, count(3, 0, Overflow::Conflate).with_bytes(Water::new(4, 1)), weigh).unwrap();
    for v in [&[1u8][..], &[2], &[3]] {
        assert_eq!(relay.send(set(v)), Ok(Sent::Accepted));
    }
    assert_eq!(relay.send(set(&[3])), Ok(Sent::Conflated));
    assert_eq!(relay.stats().depth, 3, "{{3}} ∪ {{3}} stays 1 byte: nothing more to fold");
    // A fold that reaches the high mark exactly is not above it: no more
    // folding.
    assert_eq!(relay.send(set(&[4])), Ok(Sent::Conflated));
    let s = relay.stats();
    assert_eq!((s.depth, s.bytes), (3, 4), "at high, not above: the entries stay apart");
    assert_eq!(relay.iter().cloned().collect::<Vec<_>>(), vec![set(&[1]), set(&[2]), set(&[3, 4])]);
}

#[test]
fn unpop_puts_an_entry_back_in_front_as_it_was() {
    let bp = count(2, 0, Overflow::Conflate).with_bytes(Water::new(100, 10));
    let mut relay = Relay::weighed(Sum, bp, |v: &u64| *v).unwrap();
    for op in [1u64, 2, 3] {
        relay.send(op).unwrap();
    }
    let before = relay.stats();
    let drained = relay.pop().unwrap();
    assert_eq!(relay.stats().drained, 1);
    // A drain moved the value out, and got it back.
    let (value, entry) = drained.split();
    assert_eq!((value, entry.ops), (1, 1));
    relay.unpop(entry.with_value(value));
    let after = relay.stats();
    assert_eq!(after, before);
    assert_eq!(relay.iter().copied().collect::<Vec<_>>(), vec![1, 5]);
}

#[test]
fn a_panicking_merge_or_weigher_leaves_the_relay_usable_and_its_counts_its_entries() {
    #[derive(Clone, Debug, PartialEq)]
    struct Bomb;
    impl MergePolicy<u64> for Bomb {
        const COMMUTATIVE: bool = true;
        const IDEMPOTENT: bool = false;
        fn merge(&self, acc: &mut u64, op: u64) {
            assert!(op != 13, "user code panicked");
            *acc += op;
        }
    }
    fn weigh(v: &u64) -> u64 {
        assert!(*v != 7, "weigher panicked");
        1
    }
    let bp = count(2, 0, Overflow::Conflate).with_bytes(Water::new(100, 10));
    let mut relay = Relay::weighed(Bomb, bp, weigh).unwrap();
    assert_eq!(relay.send(1), Ok(Sent::Accepted));
    assert_eq!(relay.send(2), Ok(Sent::Accepted));
    let before = relay.stats();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| relay.send(7)));
    assert!(panicked.is_err());
    assert_eq!(relay.stats(), before, "the weigher runs before anything changes");
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| relay.send(13)));
    assert!(panicked.is_err());
    assert_eq!(relay.stats(), before, "the fold's op is lost, the counts are the entries'");
    assert_eq!(relay.send(3), Ok(Sent::Conflated));
    assert_eq!(relay.iter().copied().collect::<Vec<_>>(), vec![1, 5]);
    assert_eq!(relay.stats().ops, 3);
}

#[test]
fn a_panicking_fold_of_the_newest_entries_counts_the_lost_entry_as_dropped() {
    // Found by a hostile review: the fold of the newest entries (the bound
    // in bytes) panicked after the newer one left the window, and its ops,
    // taken long before, were counted nowhere.
    struct Bomb;
    impl MergePolicy<u64> for Bomb {
        const COMMUTATIVE: bool = true;
        const IDEMPOTENT: bool = false;
        fn merge(&self, acc: &mut u64, op: u64) {
            assert!(op < 100, "user merge panicked");
            *acc += op;
        }
    }
    let bp = count(4, 0, Overflow::Conflate).with_bytes(Water::new(100, 0));
    let mut relay = Relay::weighed(Bomb, bp, |v: &u64| *v).unwrap();
    assert_eq!(relay.send(10), Ok(Sent::Accepted));
    assert_eq!(relay.send(60), Ok(Sent::Accepted));
    // Full (70 of 100 bytes with 50 not fitting): 50 folds into 60 (110
    // bytes in all: over), then 110 into 10, which panics.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| relay.send(50)));
    assert!(panicked.is_err());
    let s = relay.stats();
    assert_eq!(relay.iter().copied().collect::<Vec<_>>(), vec![10]);
    assert_eq!((s.accepted, s.ops, s.dropped, s.bytes), (3, 1, 2, 10));
    assert_eq!(s.accepted, s.ops + s.drained + s.dropped, "every op taken is held, drained or dropped");
}

#[test]
fn a_panicking_drop_of_an_entry_drop_oldest_drops_counts_it_and_never_leaves_a_full_relay_empty() {
    // Found by a hostile review: the relay was marked full before the
    // drop, and the dropped ops were counted after it.
    struct Loud(u32);
    impl Drop for Loud {
        fn drop(&mut self) {
            if self.0 == 1 && !std::thread::panicking() {
                panic!("drop panicked");
            }
        }
    }
    let mut relay = Relay::new(KeepLatest, count(1, 0, Overflow::DropOldest)).unwrap();
    assert!(relay.send(Loud(1)).is_ok());
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| relay.send(Loud(2))));
    assert!(panicked.is_err());
    let s = relay.stats();
    assert_eq!((s.depth, s.full, s.accepted, s.dropped), (0, false, 1, 1));
    // Usable: the next op is taken.
    assert!(matches!(relay.send(Loud(3)), Ok(Sent::Accepted)));
    assert!(relay.stats().full);
}

#[test]
fn spill_asks_when_full_takes_every_entry_out_and_the_pages_go_first() {
    let mut relay = Relay::new(RawFifo, count(2, 0, Overflow::Spill)).unwrap();
    assert_eq!(relay.spill(), None, "nothing to take out");
    assert_eq!(relay.send(vec![1u8]), Ok(Sent::Accepted));
    assert_eq!(relay.send(vec![2]), Ok(Sent::Accepted));
    let before = relay.stats();
    assert!(matches!(relay.send(vec![3]), Err(SendRefused::MustSpill(op)) if op == vec![3]));
    assert_eq!(relay.stats(), before, "asking changes nothing");
    // RawFifo does not conflate: the page keeps each entry.
    let page = relay.spill().unwrap();
    assert_eq!(page.ops(), 2);
    assert_eq!(
        page.entries().iter().map(|d| (d.value.clone(), d.ops)).collect::<Vec<_>>(),
        [(vec![1], 1), (vec![2], 1)]
    );
    let s = relay.stats();
    assert_eq!((s.depth, s.ops, s.full, s.spilled, s.cold, s.drained), (0, 0, false, 2, 2, 0));
    assert_eq!(relay.send(vec![3]), Ok(Sent::Accepted));
    // The page goes first: nothing pops while an op is cold.
    assert_eq!(relay.pop(), None);
    relay.replayed(1);
    assert_eq!(relay.pop(), None, "one op still cold");
    relay.replayed(5);
    assert_eq!((relay.cold(), relay.stats().drained), (0, 2), "at most the cold ops count");
    assert_eq!(relay.pop().map(|d| d.value), Some(vec![3]));
    // A restart's stored ops go before the entries too.
    assert_eq!(relay.send(vec![4]), Ok(Sent::Accepted));
    relay.restore_cold(u64::MAX - 1);
    relay.restore_cold(7);
    assert_eq!(relay.cold(), u64::MAX, "saturates");
    assert_eq!(relay.pop(), None);
    let s = relay.stats();
    assert_eq!((s.accepted, s.ops, s.drained, s.spilled), (4, 1, 3, 2));
    let debug = format!("{relay:?}");
    assert!(debug.contains(&format!("cold: {}", u64::MAX)), "{debug}");
    assert_eq!(format!("{:?}", SendRefused::MustSpill(1)), "MustSpill");
    assert_eq!(SendRefused::MustSpill(1).into_op(), 1);
    let failed = SendRefused::SpillFailed { op: 2, reason: "disk full".into() };
    assert_eq!(failed.to_string(), "the relay could not write its entries out: disk full");
    assert_eq!(format!("{failed:?}"), r#"SpillFailed { reason: "disk full" }"#);
    assert_eq!(failed.into_op(), 2);
}

#[test]
fn cold_ops_the_storage_lost_count_as_dropped_and_an_entry_put_back_goes_before_the_pages() {
    let mut relay = Relay::new(Sum, count(3, 0, Overflow::Spill)).unwrap();
    for op in [1u64, 2] {
        relay.send(op).unwrap();
    }
    let taken = relay.pop().unwrap();
    for op in [3, 4] {
        relay.send(op).unwrap();
    }
    assert!(matches!(relay.send(5), Err(SendRefused::MustSpill(5))));
    let page = relay.spill().unwrap();
    assert_eq!(page.entries().iter().map(|d| (d.value, d.ops)).collect::<Vec<_>>(), [(9, 3)], "2, 3, 4 folded");
    relay.send(5).unwrap();
    // 1 was taken before the page was written: back, it goes first.
    relay.unpop(taken);
    assert_eq!(relay.iter().copied().collect::<Vec<_>>(), [1, 5]);
    // No spill takes it; a page put back goes behind it.
    let page = relay.spill().unwrap();
    assert_eq!(page.entries().iter().map(|d| d.value).collect::<Vec<_>>(), [5]);
    assert_eq!(relay.iter().copied().collect::<Vec<_>>(), [1]);
    relay.unspill(page);
    assert_eq!(relay.iter().copied().collect::<Vec<_>>(), [1, 5], "back behind it");
    // The storage lost some cold ops, not all: 1 still goes first.
    relay.lost(1);
    assert_eq!(relay.cold(), 2);
    assert_eq!(relay.pop().map(|d| d.value), Some(1), "first, while ops are cold");
    assert_eq!(relay.pop(), None, "then the pages");
    // The storage lost the rest: counted as dropped, not drained.
    relay.lost(9);
    let s = relay.stats();
    assert_eq!((s.cold, s.dropped, s.drained, s.accepted), (0, 3, 1, 5));
    assert_eq!(s.accepted, s.ops + s.drained + s.cold + s.dropped);
    assert_eq!(relay.pop().map(|d| d.value), Some(5));
}

#[test]
fn spill_folds_under_a_conflating_policy_and_unspill_puts_the_page_back_full() {
    let bp = count(3, 1, Overflow::Spill).with_bytes(Water::new(100, 10));
    let mut relay = Relay::weighed(Sum, bp, |v: &u64| *v).unwrap();
    for op in [5u64, 6, 7] {
        assert_eq!(relay.send(op), Ok(Sent::Accepted));
    }
    assert!(matches!(relay.send(8), Err(SendRefused::MustSpill(8))));
    let page = relay.spill().unwrap();
    assert_eq!(page.entries().iter().map(|d| (d.value, d.ops)).collect::<Vec<_>>(), [(18, 3)]);
    let s = relay.stats();
    assert_eq!((s.bytes, s.full, s.cold), (0, false, 3));
    // The write failed: back as it was taken (one folded entry), and full.
    relay.unspill(page);
    let s = relay.stats();
    assert_eq!((s.depth, s.ops, s.bytes, s.full, s.spilled, s.cold), (1, 3, 18, true, 0, 0));
    assert!(matches!(relay.send(8), Err(SendRefused::MustSpill(8))), "still full");
    assert_eq!(relay.pop().map(|d| (d.value, d.ops)), Some((18, 3)));
    assert_eq!(relay.stats().accepted, relay.stats().drained);
}

#[test]
fn a_panicking_fold_while_spilling_loses_the_newer_entry_counted_as_dropped() {
    struct Bomb;
    impl MergePolicy<u64> for Bomb {
        const COMMUTATIVE: bool = true;
        const IDEMPOTENT: bool = false;
        fn merge(&self, acc: &mut u64, op: u64) {
            assert!(op != 13, "user merge panicked");
            *acc += op;
        }
    }
    let bp = count(3, 0, Overflow::Spill).with_bytes(Water::new(100, 0));
    let mut relay = Relay::weighed(Bomb, bp, |v: &u64| *v).unwrap();
    for op in [1u64, 13, 2] {
        assert_eq!(relay.send(op), Ok(Sent::Accepted));
    }
    // 2 folds into 13 (15), then 15 into 1: no panic; 13 itself is never
    // the op folded. Send 13 alone as the newest to make it so.
    let page = relay.spill().unwrap();
    assert_eq!(page.entries().iter().map(|d| d.value).collect::<Vec<_>>(), [16]);
    relay.replayed(page.ops());
    for op in [1u64, 2, 13] {
        assert_eq!(relay.send(op), Ok(Sent::Accepted));
    }
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| relay.spill()));
    assert!(panicked.is_err());
    let s = relay.stats();
    assert_eq!(relay.iter().copied().collect::<Vec<_>>(), [1, 2], "nothing taken out");
    assert_eq!((s.ops, s.bytes, s.dropped, s.spilled, s.cold), (2, 3, 1, 3, 0));
    assert_eq!(s.accepted, s.ops + s.drained + s.cold + s.dropped);
}

// ----- the model ------------------------------------------------------

/// The rules, written plainly: entries as (value, ops, weight), sums
/// recomputed on every read.
#[derive(Default)]
struct Model {
    entries: VecDeque<(u64, u64, u64)>,
    full: bool,
    accepted: u64,
    conflated: u64,
    dropped: u64,
    blocked: u64,
    drained: u64,
    /// Of `dropped`, the ops `DropNewest` dropped (never taken).
    dropped_newest: u64,
    /// The pages written out, oldest first: each entry as (value, ops).
    pages: VecDeque<Vec<(u64, u64)>>,
    spilled: u64,
    /// How many entries at the front were put back while pages were
    /// waiting: they go first, and no spill or fold takes them.
    returned: usize,
}

impl Model {
    fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.2).sum()
    }

    fn fits(&self, bp: &Backpressure, weight: u64) -> bool {
        (self.entries.len() as u64) < bp.count.high && bp.bytes.is_none_or(|b| self.bytes() + weight <= b.high)
    }

    /// `weight` is the op's value (the relay weighs a `u64` as itself).
    fn send(&mut self, bp: &Backpressure, op: u64) -> Result<Sent, ()> {
        let weight = if bp.bytes.is_some() { op } else { 0 };
        if bp.bytes.is_some_and(|b| weight > b.high) {
            return Err(());
        }
        if !self.full && self.fits(bp, weight) {
            self.entries.push_back((op, 1, weight));
            self.accepted += 1;
            let count_high = self.entries.len() as u64 >= bp.count.high;
            self.full = count_high || bp.bytes.is_some_and(|b| self.bytes() >= b.high);
            return Ok(Sent::Accepted);
        }
        self.full = true;
        match bp.overflow {
            Overflow::Block => {
                self.blocked += 1;
                Err(())
            }
            Overflow::Spill => Err(()),
            Overflow::DropNewest => {
                self.dropped += 1;
                self.dropped_newest += 1;
                Ok(Sent::Dropped)
            }
            Overflow::DropOldest => {
                let mut ops = 0;
                while !self.fits(bp, weight) {
                    ops += self.entries.pop_front().unwrap().1;
                    self.returned = self.returned.saturating_sub(1);
                }
                self.dropped += ops;
                self.entries.push_back((op, 1, weight));
                self.accepted += 1;
                Ok(Sent::DroppedOldest { ops })
            }
            _ if self.entries.len() <= self.returned => {
                // Only entries older than the pages: the op goes behind.
                self.entries.push_back((op, 1, weight));
                self.accepted += 1;
                Ok(Sent::Accepted)
            }
            _ => {
                let back = self.entries.back_mut().unwrap();
                back.0 = back.0.saturating_add(op);
                back.1 += 1;
                back.2 = if bp.bytes.is_some() { back.0 } else { 0 };
                self.accepted += 1;
                self.conflated += 1;
                while self.entries.len() > self.returned + 1 && bp.bytes.is_some_and(|b| self.bytes() > b.high) {
                    let (v, n, _) = self.entries.pop_back().unwrap();
                    let back = self.entries.back_mut().unwrap();
                    back.0 = back.0.saturating_add(v);
                    back.1 += n;
                    back.2 = back.0;
                }
                Ok(Sent::Conflated)
            }
        }
    }

    /// Puts back an entry taken: in front, and ahead of the pages.
    fn unpop(&mut self, v: u64, n: u64, w: u64) {
        self.drained -= n;
        self.entries.push_front((v, n, w));
        if !self.pages.is_empty() {
            self.returned += 1;
        }
    }

    fn cold(&self) -> u64 {
        self.pages.iter().flatten().map(|e| e.1).sum()
    }

    /// The entries out as one page, folded (`Sum` conflates).
    fn spill(&mut self) -> Option<Vec<(u64, u64)>> {
        if self.entries.len() <= self.returned {
            return None;
        }
        let (mut v, mut n) = (0u64, 0u64);
        for (value, ops, _) in self.entries.drain(self.returned..) {
            v = v.saturating_add(value);
            n += ops;
        }
        self.full = false;
        self.spilled += n;
        self.pages.push_back(vec![(v, n)]);
        Some(vec![(v, n)])
    }

    fn pop(&mut self, bp: &Backpressure) -> Option<(u64, u64)> {
        if !self.pages.is_empty() && self.returned == 0 {
            return None;
        }
        let (v, n, _) = self.entries.pop_front()?;
        self.returned = self.returned.saturating_sub(1);
        self.drained += n;
        let low = self.entries.len() as u64 <= bp.count.low && bp.bytes.is_none_or(|b| self.bytes() <= b.low);
        if low {
            self.full = false;
        }
        Some((v, n))
    }

    fn stats(&self) -> RelayStats {
        RelayStats {
            depth: self.entries.len() as u64,
            ops: self.entries.iter().map(|e| e.1).sum(),
            bytes: self.bytes(),
            full: self.full,
            accepted: self.accepted,
            conflated: self.conflated,
            dropped: self.dropped,
            blocked: self.blocked,
            drained: self.drained,
            spilled: self.spilled,
            cold: self.cold(),
        }
    }
}

#[derive(Clone, Debug)]
enum Step {
    Send(u64),
    Pop,
    PopAndPutBack,
    /// Take a page out (and write it).
    Spill,
    /// Take a page out, fail to write it, put it back.
    SpillAndPutBack,
    /// Replay the oldest page written.
    Replay,
    /// Pop an entry, spill the rest, put the entry back: it goes before
    /// the page.
    PopSpillPutBack,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u64..40).prop_map(Step::Send),
        3 => Just(Step::Pop),
        1 => Just(Step::PopAndPutBack),
        1 => Just(Step::Spill),
        1 => Just(Step::SpillAndPutBack),
        2 => Just(Step::Replay),
        1 => Just(Step::PopSpillPutBack),
    ]
}

fn backpressure() -> impl Strategy<Value = Backpressure> {
    let overflow = prop_oneof![
        Just(Overflow::Block),
        Just(Overflow::DropNewest),
        Just(Overflow::DropOldest),
        Just(Overflow::Conflate),
        Just(Overflow::Spill),
    ];
    let bytes = proptest::option::of((1u64..120).prop_flat_map(|high| (Just(high), 0..high)));
    ((1u64..6).prop_flat_map(|high| (Just(high), 0..high)), bytes, overflow).prop_map(
        |((high, low), bytes, overflow)| {
            let bp = Backpressure::count(Water::new(high, low), overflow);
            match bytes {
                Some((high, low)) => bp.with_bytes(Water::new(high, low)),
                None => bp,
            }
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Every transition's outcome, the counts and the entries agree with
    /// the model, for every overflow action, with and without a bound in
    /// bytes; and the bounds hold.
    #[test]
    fn the_relay_follows_its_rules(bp in backpressure(), steps in prop::collection::vec(step(), 0..80)) {
        let mut relay = Relay::weighed(Sum, bp, |v: &u64| *v).unwrap();
        let mut model = Model::default();
        let weight = |v: u64| if bp.bytes.is_some() { v } else { 0 };
        for step in steps {
            match step {
                Step::Send(op) => {
                    let got = relay.send(op).map_err(|_| ());
                    prop_assert_eq!(got, model.send(&bp, op));
                }
                Step::Pop => {
                    prop_assert_eq!(relay.pop().map(|d| (d.value, d.ops)), model.pop(&bp));
                }
                Step::PopAndPutBack => {
                    // Put back as it was, but for whether full, which
                    // stays as the pop left it.
                    if let Some(d) = relay.pop() {
                        relay.unpop(d);
                    }
                    if let Some((v, n)) = model.pop(&bp) {
                        model.unpop(v, n, weight(v));
                    }
                }
                Step::PopSpillPutBack => {
                    if let Some(d) = relay.pop() {
                        let page = relay.spill().map(|p| p.entries().iter().map(|d| (d.value, d.ops)).collect::<Vec<_>>());
                        relay.unpop(d);
                        let (v, n) = model.pop(&bp).unwrap();
                        prop_assert_eq!(page, model.spill());
                        model.unpop(v, n, weight(v));
                    } else {
                        prop_assert_eq!(model.pop(&bp), None);
                    }
                }
                Step::Spill => {
                    let page = relay.spill().map(|p| p.entries().iter().map(|d| (d.value, d.ops)).collect::<Vec<_>>());
                    prop_assert_eq!(page, model.spill());
                }
                Step::SpillAndPutBack => {
                    let was_full = model.full;
                    if let Some(page) = relay.spill() {
                        relay.unspill(page);
                        // Back as one folded entry, and full.
                        let page = model.spill().unwrap();
                        model.pages.pop_back();
                        model.spilled -= page[0].1;
                        model.entries.push_back((page[0].0, page[0].1, weight(page[0].0)));
                        if model.pages.is_empty() {
                            model.returned = 0;
                        }
                        model.full = true;
                    } else {
                        prop_assert_eq!(relay.stats().full, was_full, "nothing to spill changes nothing");
                    }
                }
                Step::Replay => {
                    if let Some(page) = model.pages.pop_front() {
                        let ops = page.iter().map(|e| e.1).sum::<u64>();
                        relay.replayed(ops);
                        model.drained += ops;
                        if model.pages.is_empty() {
                            model.returned = 0;
                        }
                    } else {
                        let before = relay.stats();
                        relay.replayed(3);
                        prop_assert_eq!(relay.stats(), before, "nothing cold: nothing replayed");
                    }
                }
            }
            let stats = relay.stats();
            prop_assert_eq!(stats, model.stats());
            prop_assert_eq!(relay.iter().copied().collect::<Vec<_>>(), model.entries.iter().map(|e| e.0).collect::<Vec<_>>());
            prop_assert_eq!(relay.cold(), stats.cold);
            prop_assert!(stats.depth <= bp.count.high, "bounded in entries");
            if let (Some(b), true) = (bp.bytes, bp.overflow != Overflow::Conflate) {
                prop_assert!(stats.bytes <= b.high, "bounded in bytes");
            }
            // Every op taken is held, drained, cold, or dropped by DropOldest.
            prop_assert_eq!(stats.accepted, stats.ops + stats.drained + stats.cold + stats.dropped - model.dropped_newest);
        }
    }
}

// ----- convergence ----------------------------------------------------

/// Sends every op, draining at the steps `drain` marks, and checks that
/// the fold of what the drain took, then of what is left, equals the fold
/// of every op the relay took (a `Block`ed op is not taken).
fn converges<T, M>(policy: M, backpressure: Backpressure, ops: Vec<T>, drain: &[bool])
where
    T: Clone + PartialEq + Debug,
    M: MergePolicy<T> + Clone,
{
    let mut relay = Relay::new(policy.clone(), backpressure).unwrap();
    let mut taken = Vec::new();
    let mut delivered = Vec::new();
    // What a spill store holds: the pages' entries, oldest first.
    let mut disk = VecDeque::new();
    for (i, op) in ops.into_iter().enumerate() {
        let sent = match relay.send(op.clone()) {
            Err(SendRefused::MustSpill(op)) => {
                let page = relay.spill().expect("a full relay holds entries");
                disk.extend(page.entries().iter().map(|d| (d.value.clone(), d.ops)));
                relay.send(op)
            }
            sent => sent,
        };
        if sent.is_ok() {
            taken.push(op);
        }
        if drain.get(i).copied().unwrap_or(false) {
            if let Some((value, ops)) = disk.pop_front() {
                relay.replayed(ops);
                delivered.push(value);
            } else {
                delivered.extend(relay.pop().map(|d| d.value));
            }
        }
    }
    delivered.extend(disk.into_iter().map(|(value, _)| value));
    delivered.extend(relay.iter().cloned());
    assert_eq!(fold(&policy, &delivered), fold(&policy, &taken));
    let stats = relay.stats();
    assert_eq!(stats.dropped, 0);
    assert_eq!(stats.accepted, taken.len() as u64);
}

fn pressure() -> impl Strategy<Value = (u64, u64, bool)> {
    (1u64..5).prop_flat_map(|high| (Just(high), 0..high, any::<bool>()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_policy_converges_to_the_flat_fold_for_any_drain_schedule(
        (high, low, block) in pressure(),
        spill in any::<bool>(),
        ops in prop::collection::vec(0u16..1000, 0..60),
        drain in prop::collection::vec(prop::bool::weighted(0.3), 0..60),
    ) {
        let overflow = match (spill, block) {
            (true, _) => Overflow::Spill,
            (false, true) => Overflow::Block,
            (false, false) => Overflow::Conflate,
        };
        let bp = Backpressure::count(Water::new(high, low), overflow);
        converges(KeepLatest, bp, ops.clone(), &drain);
        converges(Max, bp, ops.clone(), &drain);
        converges(Sum, bp, ops.iter().map(|&v| u64::from(v)).collect(), &drain);
        converges(Sum, bp, ops.iter().map(|&v| i16::try_from(v).unwrap().wrapping_mul(97)).collect(), &drain);
        converges(SetUnion, bp, ops.iter().map(|&v| BTreeSet::from([v % 16, v % 7])).collect(), &drain);
        let fifo = Backpressure::count(Water::new(high, low), if spill { Overflow::Spill } else { Overflow::Block });
        converges(RawFifo, fifo, ops.iter().map(|&v| vec![v]).collect(), &drain);
    }
}
