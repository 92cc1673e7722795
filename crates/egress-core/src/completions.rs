//! Completions in any order, as one cumulative acknowledgement: what a
//! transport whose peer acknowledges each record (a handler's result, a
//! broker's publish acknowledgement) tells the core.

use std::collections::BTreeSet;

use crate::ids::Sequence;

/// Turns completions in any order into a cumulative acknowledgement: the
/// highest sequence below which everything completed. Holds only the
/// completions above the first gap, so it is bounded by the window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Completions {
    /// The first sequence not yet completed.
    next: u64,
    /// Completed sequences above `next`.
    above: BTreeSet<u64>,
}

impl Completions {
    /// A tracker whose first incomplete sequence is `next`.
    pub fn starting_at(next: u64) -> Self {
        Completions { next, above: BTreeSet::new() }
    }

    /// Records that `sequence` completed; returns the new cumulative
    /// acknowledgement when it moved. A sequence below the watermark (done
    /// before) changes nothing.
    #[inline]
    pub fn complete(&mut self, sequence: u64) -> Option<Sequence> {
        if sequence < self.next {
            return None;
        }
        if sequence == self.next && self.above.is_empty() {
            // In order, with nothing waiting: the common case, no set.
            self.next += 1;
            return Some(Sequence(sequence));
        }
        self.above.insert(sequence);
        let before = self.next;
        while self.above.remove(&self.next) {
            self.next += 1;
        }
        (self.next > before).then(|| Sequence(self.next - 1))
    }

    /// Whether `sequence` completed: below the watermark, or waiting above
    /// a gap.
    #[inline]
    pub(crate) fn contains(&self, sequence: u64) -> bool {
        sequence < self.next || self.above.contains(&sequence)
    }

    /// Moves the first incomplete sequence up to `next` (an acknowledgement
    /// that came another way), dropping the completions it covers. Returns
    /// the watermark when completions waiting just above `next` carried it
    /// further than `next - 1`.
    #[inline]
    pub(crate) fn advance_to(&mut self, next: u64) -> Option<Sequence> {
        if next <= self.next {
            return None;
        }
        self.above = self.above.split_off(&next);
        self.next = next;
        while self.above.remove(&self.next) {
            self.next += 1;
        }
        (self.next > next).then(|| Sequence(self.next - 1))
    }

    /// Completions waiting above a gap.
    #[inline]
    pub fn waiting(&self) -> usize {
        self.above.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_in_any_order_become_one_cumulative_acknowledgement() {
        let mut c = Completions::starting_at(10);
        assert_eq!(c.complete(12), None, "above a gap: waits");
        assert_eq!(c.complete(11), None);
        assert_eq!(c.waiting(), 2);
        assert_eq!(c.complete(10), Some(Sequence(12)), "the gap closes: all three at once");
        assert_eq!(c.waiting(), 0);
        assert_eq!(c.complete(9), None, "below the watermark: done before");
        assert_eq!(c.complete(12), None, "a duplicate changes nothing");
        assert_eq!(c.complete(13), Some(Sequence(13)));
        assert_eq!(Completions::default().complete(0), Some(Sequence(0)));
        // In order, one by one (nothing waiting): each moves the watermark.
        let mut c = Completions::starting_at(1);
        for s in 1..4 {
            assert_eq!(c.complete(s), Some(Sequence(s)), "{s} in order");
        }
        assert!(c.contains(3) && !c.contains(4));
        assert_eq!((c.waiting(), c.complete(5), c.waiting()), (0, None, 1), "5 waits above 4");
    }

    #[test]
    fn an_acknowledgement_from_elsewhere_carries_the_completions_just_above_it() {
        let mut c = Completions::starting_at(0);
        assert_eq!(c.complete(3), None);
        assert_eq!(c.complete(5), None);
        assert_eq!(c.advance_to(2), None, "nothing waits at 2: the watermark is 1, as acknowledged");
        assert!(c.contains(1) && !c.contains(2) && c.contains(3));
        assert_eq!(c.advance_to(3), Some(Sequence(3)), "3 waited just above: carried");
        assert_eq!(c.waiting(), 1);
        assert_eq!(c.advance_to(3), None, "not above the watermark: nothing");
        assert_eq!(c.advance_to(7), None, "5 is covered and dropped");
        assert_eq!((c.waiting(), c.contains(6), c.contains(7)), (0, true, false));
    }
}
