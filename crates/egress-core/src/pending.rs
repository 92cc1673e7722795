//! The pending queue: records waiting to be claimed, in sequence order.
//!
//! Two parts merged on read: `fresh`, a `VecDeque` of newly enqueued records
//! (sequences only grow, so appending keeps it sorted), and `returned`, a
//! `BTreeMap` of records coming back from a failure, a requeue or a
//! reconnect. Enqueue and claim stay O(1) on the hot path with no allocation
//! per record; putting a record back is O(log n) wherever it lands.

use std::collections::{BTreeMap, VecDeque};

use crate::envelope::Record;
use crate::ids::Sequence;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PendingQueue<T> {
    fresh: VecDeque<Record<T>>,
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

    /// Appends a record whose sequence is above every sequence ever queued.
    pub(crate) fn push_new(&mut self, record: Record<T>) {
        debug_assert!(self.fresh.back().is_none_or(|last| last.sequence < record.sequence));
        self.fresh.push_back(record);
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
    /// named.
    #[inline]
    pub(crate) fn pop(&mut self, fresh: bool) -> Option<Record<T>> {
        if fresh { self.fresh.pop_front() } else { self.returned.pop_first().map(|(_, r)| r) }
    }

    /// Removes the record with the lowest sequence.
    pub(crate) fn pop_head(&mut self) -> Option<Record<T>> {
        let (_, fresh) = self.locate()?;
        self.pop(fresh)
    }

    /// The records at or below `through`, in no particular order.
    pub(crate) fn through(&self, through: Sequence) -> impl Iterator<Item = &Record<T>> {
        self.fresh
            .iter()
            .take_while(move |r| r.sequence <= through)
            .chain(self.returned.range(..=through).map(|(_, r)| r))
    }

    /// Whether a record at or below `through` is `what` (the part put back
    /// looked into only when it holds something).
    pub(crate) fn any_through(&self, through: Sequence, what: impl Fn(&Record<T>) -> bool) -> bool {
        (self.fresh.front().is_some_and(|r| r.sequence <= through)
            && self.fresh.iter().take_while(|r| r.sequence <= through).any(&what))
            || (!self.returned.is_empty() && self.returned.range(..=through).any(|(_, r)| what(r)))
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
    pub(crate) fn fresh_from(&self, from: Sequence) -> impl Iterator<Item = &Record<T>> + '_ {
        let at = self.fresh.partition_point(|r| r.sequence < from);
        self.fresh.range(at..)
    }

    /// The record `sequence`, if pending.
    pub(crate) fn get(&self, sequence: Sequence) -> Option<&Record<T>> {
        let at = self.fresh.partition_point(|r| r.sequence < sequence);
        match self.fresh.get(at) {
            Some(r) if r.sequence == sequence => Some(r),
            _ => self.returned.get(&sequence),
        }
    }

    /// Takes the newly enqueued records from sequence `from` on, in order.
    pub(crate) fn split_fresh(&mut self, from: Sequence) -> VecDeque<Record<T>> {
        let at = self.fresh.partition_point(|r| r.sequence < from);
        self.fresh.split_off(at)
    }

    /// The records in sequence order.
    pub(crate) fn iter(&self) -> Merge<'_, T> {
        Merge { fresh: self.fresh.iter().peekable(), returned: self.returned.values().peekable() }
    }
}

/// Both parts of the queue, merged in sequence order.
#[derive(Clone, Debug)]
pub(crate) struct Merge<'a, T> {
    fresh: std::iter::Peekable<std::collections::vec_deque::Iter<'a, Record<T>>>,
    returned: std::iter::Peekable<std::collections::btree_map::Values<'a, Sequence, Record<T>>>,
}

impl<'a, T> Iterator for Merge<'a, T> {
    type Item = &'a Record<T>;

    fn next(&mut self) -> Option<Self::Item> {
        match (self.fresh.peek(), self.returned.peek()) {
            (Some(f), Some(r)) if r.sequence < f.sequence => self.returned.next(),
            (Some(_), _) => self.fresh.next(),
            (None, _) => self.returned.next(),
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
        q.iter().map(|r| r.sequence.0).collect()
    }

    #[test]
    fn merges_fresh_and_returned_in_sequence_order() {
        let mut q = PendingQueue::default();
        for s in [4, 6, 9] {
            q.push_new(rec(s));
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
            q.push_new(rec(s));
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
