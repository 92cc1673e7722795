//! Parked records: failed, waiting for their backoff. Kept by sequence, with
//! a second index by due time so the next timer is O(log n).

use std::collections::{BTreeMap, BTreeSet};

use crate::envelope::Record;
use crate::ids::{Delay, Sequence, Time};

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Parked<T> {
    pub(crate) record: Record<T>,
    pub(crate) backoff: Delay,
    pub(crate) due: Time,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ParkedSet<T> {
    by_sequence: BTreeMap<Sequence, Parked<T>>,
    by_due: BTreeSet<(Time, Sequence)>,
}

impl<T> Default for ParkedSet<T> {
    fn default() -> Self {
        Self { by_sequence: BTreeMap::new(), by_due: BTreeSet::new() }
    }
}

impl<T> ParkedSet<T> {
    pub(crate) fn len(&self) -> usize {
        self.by_sequence.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_sequence.is_empty()
    }

    pub(crate) fn first_sequence(&self) -> Option<Sequence> {
        self.by_sequence.first_key_value().map(|(s, _)| *s)
    }

    pub(crate) fn next_due(&self) -> Option<Time> {
        self.by_due.first().map(|(t, _)| *t)
    }

    pub(crate) fn insert(&mut self, parked: Parked<T>) {
        let key = (parked.due, parked.record.sequence);
        let previous = self.by_sequence.insert(parked.record.sequence, parked);
        assert!(previous.is_none(), "invariant broken: a sequence was parked twice");
        self.by_due.insert(key);
    }

    pub(crate) fn get(&self, sequence: Sequence) -> Option<&Parked<T>> {
        self.by_sequence.get(&sequence)
    }

    pub(crate) fn remove(&mut self, sequence: Sequence) -> Option<Parked<T>> {
        let parked = self.by_sequence.remove(&sequence)?;
        self.by_due.remove(&(parked.due, sequence));
        Some(parked)
    }

    /// Removes every record due at or before `now`, in sequence order.
    pub(crate) fn take_due(&mut self, now: Time) -> Vec<Parked<T>> {
        let mut due: Vec<Sequence> = Vec::new();
        while let Some(&(t, s)) = self.by_due.first() {
            if t > now {
                break;
            }
            self.by_due.pop_first();
            due.push(s);
        }
        due.sort_unstable();
        due.into_iter()
            .map(|s| self.by_sequence.remove(&s).expect("invariant broken: the due index names an unparked sequence"))
            .collect()
    }

    /// Removes every record at or below `through`; returns whether any left.
    pub(crate) fn remove_through(&mut self, through: Sequence) -> bool {
        if self.first_sequence().is_none_or(|s| s > through) {
            return false;
        }
        let kept = match through.0.checked_add(1) {
            Some(next) => self.by_sequence.split_off(&Sequence(next)),
            None => BTreeMap::new(),
        };
        for (s, p) in std::mem::replace(&mut self.by_sequence, kept) {
            self.by_due.remove(&(p.due, s));
        }
        true
    }

    /// The records at or below `through`, in sequence order.
    /// Whether a record at or below `through` is `what`.
    pub(crate) fn any_through(&self, through: Sequence, what: impl Fn(&Record<T>) -> bool) -> bool {
        !self.is_empty() && self.through(through).any(what)
    }

    pub(crate) fn through(&self, through: Sequence) -> impl Iterator<Item = &Record<T>> {
        self.by_sequence.range(..=through).map(|(_, p)| &p.record)
    }

    pub(crate) fn drain(&mut self) -> impl Iterator<Item = Parked<T>> {
        self.by_due.clear();
        std::mem::take(&mut self.by_sequence).into_values()
    }

    pub(crate) fn iter(&self) -> impl ExactSizeIterator<Item = &Parked<T>> {
        self.by_sequence.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Attempt;

    fn parked(s: u64, due: u64) -> Parked<()> {
        Parked {
            record: Record { attempt: Attempt(1), ..Record::new(Sequence(s), ()) },
            backoff: Delay(due),
            due: Time(due),
        }
    }

    #[test]
    fn due_records_leave_in_sequence_order_and_the_index_follows() {
        let mut set = ParkedSet::default();
        for (s, due) in [(5, 10), (2, 30), (7, 10), (1, 20)] {
            set.insert(parked(s, due));
        }
        assert_eq!(set.next_due(), Some(Time(10)));
        let taken: Vec<u64> = set.take_due(Time(20)).iter().map(|p| p.record.sequence.0).collect();
        assert_eq!(taken, [1, 5, 7]);
        assert_eq!(set.next_due(), Some(Time(30)));
        assert!(set.remove_through(Sequence(2)));
        assert_eq!(set.next_due(), None);
        assert!(set.is_empty());
    }
}
