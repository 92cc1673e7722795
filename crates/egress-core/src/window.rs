//! The in-flight window: claimed records in claim order.
//!
//! Claim order usually equals sequence order; while it does (tracked by
//! `sorted`), lookups are binary searches and a cumulative ack pops a prefix
//! in O(k). A retried record claimed after higher ones makes the window
//! unsorted until it drains; then lookups and acks scan the window, which is
//! bounded by `inflight_limit`.

use std::collections::VecDeque;

use crate::envelope::Record;
use crate::ids::Sequence;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Window<T> {
    records: VecDeque<Record<T>>,
    sorted: bool,
}

impl<T> Default for Window<T> {
    fn default() -> Self {
        Self { records: VecDeque::new(), sorted: true }
    }
}

impl<T> Window<T> {
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub(crate) fn push(&mut self, record: Record<T>) -> &Record<T> {
        if self.records.back().is_some_and(|last| last.sequence > record.sequence) {
            self.sorted = false;
        }
        self.records.push_back(record);
        self.records.back().expect("invariant broken: a record was just pushed")
    }

    /// The record claimed last.
    #[inline]
    pub(crate) fn newest(&self) -> Option<&Record<T>> {
        self.records.back()
    }

    fn position(&self, sequence: Sequence) -> Option<usize> {
        if self.sorted {
            self.records.binary_search_by_key(&sequence, |r| r.sequence).ok()
        } else {
            self.records.iter().position(|r| r.sequence == sequence)
        }
    }

    pub(crate) fn get(&self, sequence: Sequence) -> Option<&Record<T>> {
        self.records.get(self.position(sequence)?)
    }

    pub(crate) fn remove(&mut self, sequence: Sequence) -> Option<Record<T>> {
        let record = self.records.remove(self.position(sequence)?);
        self.settle();
        record
    }

    /// Removes every record at or below `through`; returns whether any left.
    pub(crate) fn remove_through(&mut self, through: Sequence) -> bool {
        let before = self.records.len();
        if self.sorted {
            // One record (a request/response transport acknowledges each)
            // is popped; more are cut in one go.
            if self.records.get(1).is_none_or(|r| r.sequence > through) {
                if self.records.front().is_some_and(|r| r.sequence <= through) {
                    self.records.pop_front();
                }
            } else {
                let cut = self.records.partition_point(|r| r.sequence <= through);
                self.records.drain(..cut);
            }
        } else {
            self.records.retain(|r| r.sequence > through);
            self.sorted = self.records.iter().zip(self.records.iter().skip(1)).all(|(a, b)| a.sequence < b.sequence);
        }
        self.settle();
        self.records.len() != before
    }

    /// Whether a record at or below `through` is `what`: sorted, only the
    /// prefix at or below `through` is looked at (by index: usually one
    /// record, and an iterator over a ring costs more than it).
    pub(crate) fn any_through(&self, through: Sequence, what: impl Fn(&Record<T>) -> bool) -> bool {
        if !self.sorted {
            return self.records.iter().any(|r| r.sequence <= through && what(r));
        }
        let mut i = 0;
        while let Some(r) = self.records.get(i)
            && r.sequence <= through
        {
            if what(r) {
                return true;
            }
            i += 1;
        }
        false
    }

    /// The records at or below `through`, in no particular order.
    pub(crate) fn through(&self, through: Sequence) -> impl Iterator<Item = &Record<T>> {
        // Sorted, the prefix ends at the first record above `through`;
        // unsorted (bounded by the window), every record is looked at.
        let sorted = self.sorted;
        self.records.iter().take_while(move |r| !sorted || r.sequence <= through).filter(move |r| r.sequence <= through)
    }

    pub(crate) fn drain(&mut self) -> impl Iterator<Item = Record<T>> + '_ {
        self.sorted = true;
        self.records.drain(..)
    }

    pub(crate) fn iter(&self) -> std::collections::vec_deque::Iter<'_, Record<T>> {
        self.records.iter()
    }

    fn settle(&mut self) {
        if self.records.is_empty() {
            self.sorted = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Attempt;

    fn rec(s: u64) -> Record<()> {
        Record { attempt: Attempt(1), ..Record::new(Sequence(s), ()) }
    }

    fn order(w: &Window<()>) -> Vec<u64> {
        w.iter().map(|r| r.sequence.0).collect()
    }

    #[test]
    fn keeps_claim_order_and_finds_records_either_way() {
        let mut w = Window::default();
        for s in [1, 2, 5] {
            let _ = w.push(rec(s));
        }
        assert!(w.sorted);
        let _ = w.push(rec(0));
        assert!(!w.sorted);
        assert_eq!(order(&w), [1, 2, 5, 0]);
        assert_eq!(w.remove(Sequence(2)).map(|r| r.sequence), Some(Sequence(2)));
        assert!(w.remove(Sequence(3)).is_none());
        assert!(w.remove_through(Sequence(1)));
        assert_eq!(order(&w), [5]);
        assert!(w.sorted, "a single record is sorted again");
        assert!(!w.remove_through(Sequence(4)));
    }

    #[test]
    fn an_ack_that_leaves_records_out_of_order_keeps_them_marked_so() {
        // 6 is retried after 7 went out: claim order [5, 7, 6].
        let mut w = Window::default();
        for s in [5, 7, 6] {
            let _ = w.push(rec(s));
        }
        assert!(w.remove_through(Sequence(5)));
        assert_eq!(order(&w), [7, 6]);
        assert!(!w.sorted, "7 before 6 is not sorted");
        // A later ack must find 6 behind 7 (a binary search would not).
        assert!(w.remove_through(Sequence(6)));
        assert_eq!(order(&w), [7]);
    }
}
