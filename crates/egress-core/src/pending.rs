//! The pending queue: records waiting to be claimed, in sequence order.
//!
//! Two parts merged on read: `fresh`, a `VecDeque` of newly enqueued records
//! (sequences only grow, so appending keeps it sorted), and `returned`, a
//! `BTreeMap` of records coming back from a failure, a requeue or a
//! reconnect, and of tombstones a restore found. Enqueue and claim stay O(1)
//! on the hot path with no allocation per record; putting a record back is
//! O(log n) wherever it lands.
//!
//! A fresh record was never claimed: its counts are all zero and it is no
//! tombstone, so the fresh part keeps only its sequence and payload (a
//! queued `u64` costs 16 bytes), and a claim makes the whole [`Record`].
//!
//! The fresh part changes only at its ends (claims and acknowledgements
//! take from its front, enqueues add at its back), except when a rebase
//! renumbers its tail; `rewrites` counts those, so a reader that keeps
//! copies of fresh records between reads ([`PendingParts`]) knows when its
//! copies may no longer match.

use std::collections::{BTreeMap, VecDeque};

use crate::envelope::{Envelope, Record};
use crate::ids::{Attempt, Generation, Sequence};
use crate::retry::DeadReason;

/// A record enqueued and never claimed: everything else a [`Record`]
/// holds is zero or absent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fresh<T> {
    pub(crate) sequence: Sequence,
    pub(crate) payload: T,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PendingQueue<T> {
    fresh: VecDeque<Fresh<T>>,
    returned: BTreeMap<Sequence, Record<T>>,
    /// How many times the fresh part was changed other than at its ends.
    rewrites: u64,
}

impl<T> Default for PendingQueue<T> {
    fn default() -> Self {
        Self { fresh: VecDeque::new(), returned: BTreeMap::new(), rewrites: 0 }
    }
}

impl<T> PendingQueue<T> {
    pub(crate) fn len(&self) -> usize {
        self.fresh.len() + self.returned.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.fresh.is_empty() && self.returned.is_empty()
    }

    /// Appends a new record whose sequence is above every sequence ever
    /// queued.
    #[inline]
    pub(crate) fn push_new(&mut self, sequence: Sequence, payload: T) {
        debug_assert!(self.fresh.back().is_none_or(|last| last.sequence < sequence));
        self.fresh.push_back(Fresh { sequence, payload });
    }

    /// Puts a record back in sequence order.
    pub(crate) fn put_back(&mut self, record: Record<T>) {
        let previous = self.returned.insert(record.sequence, record);
        assert!(previous.is_none(), "invariant broken: a sequence was pending twice");
    }

    /// The lowest pending sequence.
    pub(crate) fn head(&self) -> Option<Sequence> {
        self.locate().map(|(s, _)| s)
    }

    /// The lowest pending sequence and which part holds it (`true`:
    /// fresh), for [`pop`](Self::pop).
    #[inline]
    pub(crate) fn locate(&self) -> Option<(Sequence, bool)> {
        match (self.fresh.front(), self.returned.first_key_value()) {
            (Some(f), Some((r, _))) if *r < f.sequence => Some((*r, false)),
            (Some(f), _) => Some((f.sequence, true)),
            (None, Some((r, _))) => Some((*r, false)),
            (None, None) => None,
        }
    }

    /// Removes the lowest record from the part [`locate`](Self::locate)
    /// named (inlined: on the claim path a call costs as much as the pop).
    #[inline(always)]
    pub(crate) fn pop(&mut self, fresh: bool) -> Option<Record<T>> {
        if fresh {
            self.fresh.pop_front().map(|f| Record::new(f.sequence, f.payload))
        } else {
            self.returned.pop_first().map(|(_, r)| r)
        }
    }

    /// Removes the record with the lowest sequence.
    pub(crate) fn pop_head(&mut self) -> Option<Record<T>> {
        let (_, fresh) = self.locate()?;
        self.pop(fresh)
    }

    /// The records put back at or below `through`, in no particular order:
    /// the only pending records that can be tombstones.
    pub(crate) fn returned_through(&self, through: Sequence) -> impl Iterator<Item = &Record<T>> {
        self.returned.range(..=through).map(|(_, r)| r)
    }

    /// Whether a record put back at or below `through` is `what` (looked
    /// into only when the part holds something).
    pub(crate) fn any_returned_through(&self, through: Sequence, what: impl Fn(&Record<T>) -> bool) -> bool {
        !self.returned.is_empty() && self.returned_through(through).any(what)
    }

    /// Removes every record at or below `through`; returns whether any left.
    pub(crate) fn remove_through(&mut self, through: Sequence) -> bool {
        let before = self.len();
        // Popping (not a binary search) touches only the head: an ack usually
        // retires records in flight, and finds pending's head above it.
        while self.fresh.front().is_some_and(|r| r.sequence <= through) {
            self.fresh.pop_front();
        }
        if self.returned.first_key_value().is_some_and(|(s, _)| *s <= through) {
            self.returned = match through.0.checked_add(1) {
                Some(next) => self.returned.split_off(&Sequence(next)),
                None => BTreeMap::new(),
            };
        }
        self.len() != before
    }

    /// The newly enqueued records from sequence `from` on, in order.
    pub(crate) fn fresh_from(&self, from: Sequence) -> impl Iterator<Item = (Sequence, &T)> + '_ {
        let at = self.fresh.partition_point(|r| r.sequence < from);
        self.fresh.range(at..).map(|f| (f.sequence, &f.payload))
    }

    /// Whether `sequence` is pending, and if so its tombstone mark.
    pub(crate) fn dead(&self, sequence: Sequence) -> Option<Option<DeadReason>> {
        let at = self.fresh.partition_point(|r| r.sequence < sequence);
        match self.fresh.get(at) {
            Some(r) if r.sequence == sequence => Some(None),
            _ => self.returned.get(&sequence).map(|r| r.dead),
        }
    }

    /// Takes the newly enqueued records from sequence `from` on, in order
    /// (for a rebase, which puts them back under new sequences: a rewrite).
    pub(crate) fn split_fresh(&mut self, from: Sequence) -> VecDeque<Fresh<T>> {
        let at = self.fresh.partition_point(|r| r.sequence < from);
        self.rewrites = self.rewrites.wrapping_add(1);
        self.fresh.split_off(at)
    }

    /// The queue in its two parts, as [`PendingParts`] describes them.
    pub(crate) fn parts(&self, generation: Generation) -> PendingParts<'_, T> {
        PendingParts { queue: self, generation }
    }

    /// The records in sequence order, as a transport would see them under
    /// `generation`.
    pub(crate) fn iter(&self, generation: Generation) -> Merge<'_, T> {
        Merge { generation, fresh: self.fresh.iter().peekable(), returned: self.returned.values().peekable() }
    }
}

/// The pending records in two parts, for a reader that keeps copies of
/// them between reads and copies only what changed (the cells' `pending`
/// reader). From [`EgressCore::pending_parts`](crate::EgressCore::pending_parts).
///
/// The *fresh run* holds the records enqueued and never claimed, in
/// sequence order; each one's envelope has the core's generation, attempt
/// 0 and no tombstone mark. While [`rewrites`](Self::rewrites) stays the
/// same, the fresh run changes only at its ends: claims and
/// acknowledgements remove records from its front, and enqueues add
/// records at its back whose sequences are above every sequence it held
/// before. So a record keeps its sequence and payload for as long as it
/// stays in the run, and a reader that copied the run earlier finds what
/// it copied still true from [`fresh_first`](Self::fresh_first) up to the
/// last sequence it copied, and the rest with
/// [`fresh_from`](Self::fresh_from). A rebase
/// ([`EgressCore::rebase`](crate::EgressCore::rebase)) renumbers the run's
/// tail, and counts as a rewrite.
///
/// The other pending records, [`returned`](Self::returned), came back from
/// a claim (a failure, a requeue, a reconnect) or from a restore, and may
/// fall anywhere among the fresh run's sequences.
#[derive(Debug)]
pub struct PendingParts<'a, T> {
    queue: &'a PendingQueue<T>,
    generation: Generation,
}

impl<'a, T> PendingParts<'a, T> {
    /// The generation every envelope of the view carries.
    #[must_use]
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// How many times the fresh run has been rewritten (other than at its
    /// ends) in the core's life; wraps.
    #[must_use]
    pub fn rewrites(&self) -> u64 {
        self.queue.rewrites
    }

    /// The fresh run's lowest sequence (`None`: the run is empty).
    #[must_use]
    pub fn fresh_first(&self) -> Option<Sequence> {
        self.queue.fresh.front().map(|f| f.sequence)
    }

    /// How many records the fresh run holds.
    #[must_use]
    pub fn fresh_len(&self) -> usize {
        self.queue.fresh.len()
    }

    /// The fresh run's records from sequence `from` on, in order. Finding
    /// where to start is O(log n).
    pub fn fresh_from(&self, from: Sequence) -> impl ExactSizeIterator<Item = Envelope<&'a T>> + 'a {
        let generation = self.generation;
        let at = self.queue.fresh.partition_point(|r| r.sequence < from);
        self.queue.fresh.range(at..).map(move |f| Envelope {
            generation,
            sequence: f.sequence,
            attempt: Attempt(0),
            payload: &f.payload,
            dead: None,
        })
    }

    /// The pending records outside the fresh run, in sequence order.
    pub fn returned(&self) -> impl ExactSizeIterator<Item = Envelope<&'a T>> + 'a {
        let generation = self.generation;
        self.queue.returned.values().map(move |r| r.view(generation))
    }
}

/// Both parts of the queue, merged in sequence order.
#[derive(Clone, Debug)]
pub(crate) struct Merge<'a, T> {
    generation: Generation,
    fresh: std::iter::Peekable<std::collections::vec_deque::Iter<'a, Fresh<T>>>,
    returned: std::iter::Peekable<std::collections::btree_map::Values<'a, Sequence, Record<T>>>,
}

impl<'a, T> Iterator for Merge<'a, T> {
    type Item = Envelope<&'a T>;

    fn next(&mut self) -> Option<Self::Item> {
        let fresh = match (self.fresh.peek(), self.returned.peek()) {
            (Some(f), Some(r)) => f.sequence < r.sequence,
            (f, _) => f.is_some(),
        };
        if fresh {
            let f = self.fresh.next()?;
            Some(Envelope {
                generation: self.generation,
                sequence: f.sequence,
                attempt: Attempt(0),
                payload: &f.payload,
                dead: None,
            })
        } else {
            self.returned.next().map(|r| r.view(self.generation))
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.fresh.len() + self.returned.len();
        (n, Some(n))
    }
}

impl<T> ExactSizeIterator for Merge<'_, T> {}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(s: u64) -> Record<u64> {
        Record::new(Sequence(s), s)
    }

    fn order(q: &PendingQueue<u64>) -> Vec<u64> {
        q.iter(Generation(0)).map(|r| r.sequence.0).collect()
    }

    #[test]
    fn a_queued_u64_costs_its_payload_and_its_sequence() {
        assert_eq!(std::mem::size_of::<Fresh<u64>>(), 16);
        let mut q = PendingQueue::default();
        q.push_new(Sequence(3), 30u64);
        q.put_back(Record { dead: Some(DeadReason::Permanent), ..rec(2) });
        assert_eq!(q.dead(Sequence(3)), Some(None));
        assert_eq!(q.dead(Sequence(2)), Some(Some(DeadReason::Permanent)));
        assert_eq!(q.dead(Sequence(4)), None);
        let views: Vec<_> = q.iter(Generation(7)).collect();
        assert_eq!(views[0].dead, Some(DeadReason::Permanent));
        assert_eq!(
            views[1],
            Envelope {
                generation: Generation(7),
                sequence: Sequence(3),
                attempt: Attempt(0),
                payload: &30,
                dead: None
            }
        );
        assert_eq!(q.pop_head().map(|r| r.sequence), Some(Sequence(2)));
        assert_eq!(q.pop_head(), Some(Record::new(Sequence(3), 30)));
    }

    #[test]
    fn merges_fresh_and_returned_in_sequence_order() {
        let mut q = PendingQueue::default();
        for s in [4, 6, 9] {
            q.push_new(Sequence(s), s);
        }
        for s in [7, 1, 5] {
            q.put_back(rec(s));
        }
        assert_eq!(order(&q), [1, 4, 5, 6, 7, 9]);
        assert_eq!(q.head(), Some(Sequence(1)));
        let popped: Vec<u64> = std::iter::from_fn(|| q.pop_head()).map(|r| r.sequence.0).collect();
        assert_eq!(popped, [1, 4, 5, 6, 7, 9]);
        assert!(q.is_empty());
    }

    #[test]
    fn parts_show_the_fresh_run_apart_and_count_its_rewrites() {
        let mut q = PendingQueue::default();
        for s in [4, 6, 9] {
            q.push_new(Sequence(s), s * 10);
        }
        q.put_back(Record { attempt: Attempt(2), ..rec(5) });
        let p = q.parts(Generation(3));
        assert_eq!(
            (p.generation(), p.fresh_first(), p.fresh_len(), p.rewrites()),
            (Generation(3), Some(Sequence(4)), 3, 0)
        );
        let fresh: Vec<_> =
            p.fresh_from(Sequence(5)).map(|e| (e.generation, e.sequence.0, e.attempt, *e.payload, e.dead)).collect();
        assert_eq!(fresh, [(Generation(3), 6, Attempt(0), 60, None), (Generation(3), 9, Attempt(0), 90, None)]);
        assert_eq!(p.fresh_from(Sequence(4)).len(), 3);
        assert_eq!(p.fresh_from(Sequence(10)).len(), 0);
        let returned: Vec<_> = p.returned().map(|e| (e.generation, e.sequence.0, e.attempt)).collect();
        assert_eq!(returned, [(Generation(3), 5, Attempt(2))]);
        // Changes at the ends are no rewrite.
        assert!(q.pop_head().is_some() && q.remove_through(Sequence(6)));
        q.push_new(Sequence(12), 120);
        assert_eq!((q.parts(Generation(3)).rewrites(), q.parts(Generation(3)).fresh_first()), (0, Some(Sequence(9))));
        assert_eq!(q.split_fresh(Sequence(12)).len(), 1);
        assert_eq!(q.parts(Generation(3)).rewrites(), 1);
        assert_eq!(PendingQueue::<u64>::default().parts(Generation(0)).fresh_first(), None);
    }

    #[test]
    fn removes_through_a_watermark_from_both_parts() {
        let mut q = PendingQueue::default();
        for s in [3, 8] {
            q.push_new(Sequence(s), s);
        }
        for s in [2, 5, 9] {
            q.put_back(rec(s));
        }
        assert!(q.remove_through(Sequence(5)));
        assert_eq!(order(&q), [8, 9]);
        assert!(!q.remove_through(Sequence(5)));
        assert!(q.remove_through(Sequence(u64::MAX)));
        assert!(q.is_empty());
    }
}
