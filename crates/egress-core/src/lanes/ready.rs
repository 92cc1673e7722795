//! The release index of [`Lanes`](crate::Lanes): each lane that can claim
//! now, by the ordinal of its head.
//!
//! The common pattern is a queue: a claim takes the lowest entry, and the
//! lane comes back at the ordinal of its next record, usually above every
//! other entry (lanes enqueued to in turn). Such an entry is appended to a
//! FIFO in O(1); one that comes back below the FIFO's last goes to a binary
//! heap, O(log L) for L ready lanes. The lowest entry is the lower of the
//! two fronts.
//!
//! Entries are not searched for: a lane that leaves or moves only changes
//! its ordinal in `current`, and its old entry, now stale, is dropped when
//! it reaches a front. Stale entries are bounded: when they outnumber the
//! live ones (plus a margin), both parts are rebuilt from `current`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::ids::Ordinal;

/// Stale entries allowed beyond the live ones before a rebuild.
const SLACK: usize = 64;

/// Lane slots by the ordinal of their head: at most one live entry per
/// slot. Ordinals are unique across lanes, so the order is total.
#[derive(Clone, Debug)]
pub(super) struct ReadyHeap {
    /// By slot: the ordinal of its entry, if it has one.
    current: Vec<Option<Ordinal>>,
    /// Slots with an entry.
    live: usize,
    /// Entries in ascending order (stale ones among them).
    fifo: Fifo,
    /// Entries that came in below the FIFO's last (stale ones among them).
    heap: BinaryHeap<Reverse<(Ordinal, usize)>>,
}

/// A queue of entries in a `Vec` read from `head` on: popping the front
/// moves `head`, and the popped prefix is cut off once it is at least as
/// long as what follows it (and 32 entries), so each entry is moved at
/// most once on average and the `Vec` holds at most twice the queue (or 64).
#[derive(Clone, Debug)]
struct Fifo {
    entries: Vec<(Ordinal, usize)>,
    head: usize,
}

impl Fifo {
    #[inline]
    fn front(&self) -> Option<&(Ordinal, usize)> {
        self.entries.get(self.head)
    }

    #[inline]
    fn back(&self) -> Option<&(Ordinal, usize)> {
        if self.head < self.entries.len() { self.entries.last() } else { None }
    }

    #[inline]
    fn pop_front(&mut self) {
        self.head += 1;
    }

    #[inline]
    fn push_back(&mut self, entry: (Ordinal, usize)) {
        if self.head >= 32 && self.head * 2 >= self.entries.len() {
            self.entries.drain(..self.head);
            self.head = 0;
        }
        self.entries.push(entry);
    }

    #[inline]
    fn len(&self) -> usize {
        self.entries.len() - self.head
    }
}

/// Two indexes are equal when the same slots are at the same ordinals,
/// however each came to hold them.
impl PartialEq for ReadyHeap {
    fn eq(&self, other: &Self) -> bool {
        let entries = |h: &Self| h.current.iter().enumerate().filter_map(|(s, o)| Some((s, (*o)?))).collect::<Vec<_>>();
        entries(self) == entries(other)
    }
}

impl ReadyHeap {
    /// No entries.
    pub(super) const fn new() -> Self {
        Self { current: Vec::new(), live: 0, fifo: Fifo { entries: Vec::new(), head: 0 }, heap: BinaryHeap::new() }
    }

    /// The entry with the lowest ordinal.
    #[inline]
    pub(super) fn first(&self) -> Option<(Ordinal, usize)> {
        // Both fronts are live (see `clean`).
        match (self.fifo.front(), self.heap.peek()) {
            (Some(f), Some(Reverse(h))) => Some(if h.0 < f.0 { *h } else { *f }),
            (Some(f), None) => Some(*f),
            (None, Some(Reverse(h))) => Some(*h),
            (None, None) => None,
        }
    }

    /// How many slots have an entry.
    #[inline]
    pub(super) const fn len(&self) -> usize {
        self.live
    }

    /// The ordinal `slot` is at, if it has an entry.
    #[cfg(test)]
    fn get(&self, slot: usize) -> Option<Ordinal> {
        self.current.get(slot).copied().flatten()
    }

    /// Puts `slot` at `ordinal`, or takes its entry out (`None`).
    pub(super) fn set(&mut self, slot: usize, ordinal: Option<Ordinal>) {
        if slot >= self.current.len() {
            if ordinal.is_none() {
                return;
            }
            self.current.resize(slot + 1, None);
        }
        let old = std::mem::replace(&mut self.current[slot], ordinal);
        if old == ordinal {
            return;
        }
        self.live = self.live + usize::from(ordinal.is_some()) - usize::from(old.is_some());
        if let Some(ordinal) = ordinal {
            if self.fifo.back().is_none_or(|last| last.0 < ordinal) {
                self.fifo.push_back((ordinal, slot));
            } else {
                self.heap.push(Reverse((ordinal, slot)));
            }
        }
        self.clean();
    }

    /// The [`first`](Self::first) entry, of `slot`, was claimed: the slot
    /// goes to `next` (above its old ordinal), or out. The common queue
    /// step (the first entry in the FIFO, nothing in the heap, `next`
    /// above every entry) moves it from the front to the back.
    #[inline]
    pub(super) fn claimed(&mut self, slot: usize, next: Option<Ordinal>) {
        if let Some(next) = next
            && self.heap.is_empty()
            && self.fifo.front().is_some_and(|f| f.1 == slot)
            && self.fifo.back().is_some_and(|last| last.0 < next)
        {
            self.fifo.pop_front();
            self.fifo.push_back((next, slot));
            self.current[slot] = Some(next);
            self.drop_stale_fifo_front();
            return;
        }
        self.set(slot, next);
    }

    /// Drops the stale entries at the FIFO's front.
    #[inline]
    fn drop_stale_fifo_front(&mut self) {
        while let Some(&front) = self.fifo.front()
            && !self.is_live(front)
        {
            self.fifo.pop_front();
        }
    }

    /// Whether an entry is its slot's current one.
    #[inline]
    fn is_live(&self, (ordinal, slot): (Ordinal, usize)) -> bool {
        self.current[slot] == Some(ordinal)
    }

    /// Drops stale entries from both fronts, and rebuilds when stale
    /// entries outnumber the live ones by more than [`SLACK`].
    fn clean(&mut self) {
        self.drop_stale_fifo_front();
        while let Some(&Reverse(top)) = self.heap.peek()
            && !self.is_live(top)
        {
            self.heap.pop();
        }
        if self.fifo.len() + self.heap.len() > 2 * self.live + SLACK {
            self.rebuild();
        }
    }

    /// Both parts from `current` alone: every entry live, in the FIFO.
    #[cold]
    fn rebuild(&mut self) {
        let mut entries: Vec<(Ordinal, usize)> =
            self.current.iter().enumerate().filter_map(|(slot, o)| Some(((*o)?, slot))).collect();
        entries.sort_unstable();
        self.fifo = Fifo { entries, head: 0 };
        self.heap.clear();
    }

    /// Entries held, stale ones included.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.fifo.len() + self.heap.len()
    }

    /// The FIFO's `Vec`, popped prefix included.
    #[cfg(test)]
    fn fifo_capacity_used(&self) -> usize {
        self.fifo.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The heap against a `BTreeMap` of the same entries, through a
    /// sequence of puts, moves and removals from a seeded generator.
    #[test]
    fn agrees_with_an_ordered_map_through_random_updates() {
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for slots in [1_usize, 2, 3, 7, 64] {
            let mut heap = ReadyHeap::new();
            let mut model: BTreeMap<usize, Ordinal> = BTreeMap::new();
            for step in 0..4_000_u64 {
                let slot = usize::try_from(next() % slots as u64).expect("small");
                // Ordinals unique across slots: the step, spread.
                let ordinal = (next() % 3 != 0).then(|| Ordinal(step * 64 + slot as u64 + next() % 7 * 1_000_000));
                let ordinal = ordinal.filter(|o| model.iter().all(|(s, m)| *s == slot || m != o));
                heap.set(slot, ordinal);
                match ordinal {
                    Some(o) => model.insert(slot, o),
                    None => model.remove(&slot),
                };
                let lowest = model.iter().map(|(s, o)| (*o, *s)).min();
                assert_eq!(heap.first(), lowest, "step {step}: the lowest entry");
                assert_eq!(heap.len(), model.len());
                for s in 0..slots {
                    assert_eq!(heap.get(s), model.get(&s).copied(), "step {step}: slot {s}");
                }
            }
        }
    }

    #[test]
    fn a_slot_never_seen_taken_out_changes_nothing() {
        let mut heap = ReadyHeap::new();
        heap.set(5, None);
        assert_eq!((heap.current.len(), heap.held()), (0, 0), "no room made for nothing");
        heap.set(2, Some(Ordinal(9)));
        heap.set(0, Some(Ordinal(4)));
        heap.set(0, Some(Ordinal(12)));
        assert_eq!(heap.first(), Some((Ordinal(9), 2)), "a raised entry goes below");
        heap.set(0, Some(Ordinal(1)));
        assert_eq!(heap.first(), Some((Ordinal(1), 0)), "a lowered entry goes above");
        heap.set(0, None);
        heap.set(0, None);
        assert_eq!((heap.first(), heap.len()), (Some((Ordinal(9), 2)), 1));
        heap.set(7, Some(Ordinal(10)));
        assert_eq!(heap.first(), Some((Ordinal(9), 2)));
        heap.set(2, Some(Ordinal(11)));
        assert_eq!(heap.first(), Some((Ordinal(10), 7)), "raised above the next");
        heap.set(7, None);
        assert_eq!((heap.first(), heap.len(), heap.get(7)), (Some((Ordinal(11), 2)), 1, None), "taken out");
    }

    #[test]
    fn entries_above_the_last_are_appended_and_others_go_to_the_heap() {
        let mut heap = ReadyHeap::new();
        for slot in 0..4 {
            heap.set(slot, Some(Ordinal(10 * slot as u64)));
        }
        assert_eq!((heap.fifo.len(), heap.heap.len()), (4, 0), "ascending: each one appended");
        heap.set(0, Some(Ordinal(25)));
        assert_eq!(
            (heap.fifo.len(), heap.heap.len()),
            (3, 1),
            "below the last (30): into the heap, its old entry dropped"
        );
        assert_eq!(heap.first(), Some((Ordinal(10), 1)));
        heap.claimed(1, Some(Ordinal(40)));
        assert_eq!((heap.fifo.len(), heap.heap.len()), (3, 1), "a claim with entries in the heap goes through `set`");
        assert_eq!(heap.first(), Some((Ordinal(20), 2)));
    }

    #[test]
    fn the_fifo_keeps_at_most_twice_its_queue() {
        // Round-robin claims over 3 lanes: each claimed front goes to the
        // back, 30,000 times; the popped prefix is cut off as it grows.
        let mut heap = ReadyHeap::new();
        for slot in 0..3 {
            heap.set(slot, Some(Ordinal(slot as u64)));
        }
        for o in 3..30_003_u64 {
            let (first, slot) = heap.first().expect("three lanes ready");
            assert_eq!(first.0 + 3, o, "claimed in ordinal order");
            heap.claimed(slot, Some(Ordinal(o)));
            assert!(heap.fifo_capacity_used() <= 64, "{} entries kept for 3", heap.fifo_capacity_used());
        }
        assert_eq!((heap.len(), heap.held()), (3, 3));
        // With 100 lanes, the popped prefix is cut off once it is as long
        // as the queue (not before: each cut moves the queue, so each entry
        // is moved at most once on average).
        let mut heap = ReadyHeap::new();
        for slot in 0..100 {
            heap.set(slot, Some(Ordinal(slot as u64)));
        }
        let mut most = 0;
        for o in 100..10_100_u64 {
            let (_, slot) = heap.first().expect("a hundred lanes ready");
            heap.claimed(slot, Some(Ordinal(o)));
            most = most.max(heap.fifo_capacity_used());
        }
        // The cut comes when a claim has popped 99 with 99 queued behind
        // them: at most 98 popped and 99 queued, and the one pushed.
        assert_eq!(most, 98 + 99 + 1, "cut off at twice the queue, and only then");
    }

    #[test]
    fn a_claimed_front_goes_to_the_back_or_where_it_belongs() {
        let mut heap = ReadyHeap::new();
        for (slot, o) in [(0, 1), (1, 2), (2, 3)] {
            heap.set(slot, Some(Ordinal(o)));
        }
        heap.claimed(0, Some(Ordinal(4)));
        assert_eq!(heap.first(), Some((Ordinal(2), 1)));
        assert_eq!((heap.held(), heap.get(0)), (3, Some(Ordinal(4))), "moved, not copied");
        heap.set(2, None);
        heap.claimed(1, Some(Ordinal(5)));
        assert_eq!(heap.first(), Some((Ordinal(4), 0)), "the stale entry of slot 2 dropped from the front");
        assert_eq!((heap.held(), heap.len()), (2, 2));
        heap.claimed(0, Some(Ordinal(3)));
        assert_eq!(heap.first(), Some((Ordinal(3), 0)), "below the last: not appended after it");
        heap.claimed(0, None);
        assert_eq!((heap.first(), heap.len(), heap.get(0)), (Some((Ordinal(5), 1)), 1, None), "out");
        heap.claimed(1, Some(Ordinal(6)));
        assert_eq!((heap.first(), heap.held()), (Some((Ordinal(6), 1)), 1), "alone: to the back of itself");
    }

    #[test]
    fn stale_entries_are_bounded_by_the_live_ones() {
        // One lane leaving and coming back below the others, over and
        // over, while a lower lane stays at the front: its stale entries
        // cannot reach a front, so only a rebuild drops them.
        let mut heap = ReadyHeap::new();
        heap.set(0, Some(Ordinal(0)));
        heap.set(1, Some(Ordinal(1_000_000)));
        let mut most = 0;
        for i in 0..10_000 {
            heap.set(2, Some(Ordinal(500_000 - i)));
            most = most.max(heap.held());
            heap.set(3, Some(Ordinal(10 + i)));
            most = most.max(heap.held());
            assert!(heap.held() <= 2 * heap.len() + SLACK, "{} entries held for {} live", heap.held(), heap.len());
        }
        assert_eq!(most, 2 * 4 + SLACK, "rebuilt only past twice the live entries and the slack");
        assert!(heap.heap.len() > 1, "lane 2 came back below the FIFO's last: into the heap");
        assert_eq!(heap.first(), Some((Ordinal(0), 0)));
        heap.set(0, None);
        assert_eq!(heap.first(), Some((Ordinal(10 + 9_999), 3)), "the live entries survive rebuilds");
        let mut fresh = ReadyHeap::new();
        for (slot, o) in [(1, 1_000_000), (2, 490_001), (3, 10_009)] {
            fresh.set(slot, Some(Ordinal(o)));
        }
        assert_eq!(heap, fresh, "equal: the same slots at the same ordinals");
        fresh.set(1, Some(Ordinal(1_000_001)));
        assert_ne!(heap, fresh, "a slot at another ordinal differs");
    }
}
