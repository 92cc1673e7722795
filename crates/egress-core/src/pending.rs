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
}

impl<T> Default for PendingQueue<T> {
    fn default() -> Self {
        Self { fresh: VecDeque::new(), returned: BTreeMap::new() }
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

    /// Takes the newly enqueued records from sequence `from` on, in order.
    pub(crate) fn split_fresh(&mut self, from: Sequence) -> VecDeque<Fresh<T>> {
        let at = self.fresh.partition_point(|r| r.sequence < from);
        self.fresh.split_off(at)
    }

    /// The records in sequence order, as a transport would see them under
    /// `generation`.
    pub(crate) fn iter(&self, generation: Generation) -> Merge<'_, T> {
        Merge { generation, fresh: self.fresh.iter().peekable(), returned: self.returned.values().peekable() }
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
