//! A list reader's value ([`Snapshot`]), and the pending reader's copies of
//! the fresh run ([`FreshCopies`]), which its successive snapshots share.

use std::collections::VecDeque;
use std::sync::Arc;

use egress_core::{Envelope, Generation, PendingParts, Sequence};

/// A list reader's value: an immutable list, cheap to clone (one reference
/// count). Built only when a list reader is read after a change; no write
/// path copies a list.
///
/// A snapshot holds its records in shared, immutable chunks. The
/// [`pending`](crate::EgressCell::pending) reader's snapshots share the
/// records they have in common: reading it after an enqueue copies the new
/// record, not the queue. (What a read of `pending` copies, and what it
/// costs, is in docs/cells.md, "Reading the lists".) The other list
/// readers copy their records on each read after a change; they hold at
/// most a window in flight, or the parked and dead records.
///
/// Read it as a slice that is not contiguous: [`len`](Self::len),
/// [`get`](Self::get), indexing, [`iter`](Self::iter) (double-ended, exact
/// size), [`to_vec`](Self::to_vec).
///
/// ```
/// use egress_reactive::Snapshot;
///
/// let s: Snapshot<u32> = [1, 2, 3].into();
/// assert_eq!((s.len(), s[1], s.last()), (3, 2, Some(&3)));
/// assert_eq!(s.iter().rev().copied().collect::<Vec<_>>(), [3, 2, 1]);
/// assert_eq!(s, Snapshot::from(vec![1, 2, 3]));
/// ```
pub struct Snapshot<E> {
    parts: Arc<[Part<E>]>,
    len: usize,
}

/// A run of one chunk's records, `start..end`, at index `at` of its
/// snapshot. Never empty.
struct Part<E> {
    chunk: Arc<[E]>,
    start: usize,
    end: usize,
    at: usize,
}

impl<E> Part<E> {
    fn records(&self) -> &[E] {
        &self.chunk[self.start..self.end]
    }
}

impl<E> Clone for Part<E> {
    fn clone(&self) -> Self {
        Part { chunk: Arc::clone(&self.chunk), start: self.start, end: self.end, at: self.at }
    }
}

impl<E> Snapshot<E> {
    /// Collects runs of chunks (`chunk`, `start..end`), in order, skipping
    /// the empty ones.
    fn from_runs(runs: impl IntoIterator<Item = (Arc<[E]>, usize, usize)>) -> Self {
        let mut len = 0;
        let parts: Vec<Part<E>> = runs
            .into_iter()
            .filter(|(_, start, end)| start < end)
            .map(|(chunk, start, end)| {
                let part = Part { chunk, start, end, at: len };
                len += end - start;
                part
            })
            .collect();
        Snapshot { parts: parts.into(), len }
    }

    /// How many records it holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The record at `index`, if there is one. O(log chunks).
    #[must_use]
    pub fn get(&self, index: usize) -> Option<&E> {
        if index >= self.len {
            return None;
        }
        // The last part starting at or before `index` holds it.
        let part = &self.parts[self.parts.partition_point(|p| p.at <= index) - 1];
        part.chunk.get(part.start + (index - part.at))
    }

    /// The first record.
    #[must_use]
    pub fn first(&self) -> Option<&E> {
        self.parts.first().map(|p| &p.chunk[p.start])
    }

    /// The last record.
    #[must_use]
    pub fn last(&self) -> Option<&E> {
        self.parts.last().map(|p| &p.chunk[p.end - 1])
    }

    /// The records, in order.
    pub fn iter(&self) -> Iter<'_, E> {
        Iter { inner: self.parts.iter().flat_map(Part::records as Records<'_, E>), left: self.len }
    }

    /// The records, copied into a `Vec`.
    #[must_use]
    pub fn to_vec(&self) -> Vec<E>
    where
        E: Clone,
    {
        self.iter().cloned().collect()
    }
}

/// A part's records.
type Records<'a, E> = fn(&'a Part<E>) -> &'a [E];

/// The records of a [`Snapshot`], in order.
pub struct Iter<'a, E> {
    inner: std::iter::FlatMap<std::slice::Iter<'a, Part<E>>, &'a [E], Records<'a, E>>,
    left: usize,
}

impl<'a, E> Iterator for Iter<'a, E> {
    type Item = &'a E;

    fn next(&mut self) -> Option<&'a E> {
        let next = self.inner.next()?;
        self.left -= 1;
        Some(next)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl<E> DoubleEndedIterator for Iter<'_, E> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let next = self.inner.next_back()?;
        self.left -= 1;
        Some(next)
    }
}

impl<E> ExactSizeIterator for Iter<'_, E> {}
impl<E> std::iter::FusedIterator for Iter<'_, E> {}

impl<E> Clone for Iter<'_, E> {
    fn clone(&self) -> Self {
        Iter { inner: self.inner.clone(), left: self.left }
    }
}

impl<'a, E> IntoIterator for &'a Snapshot<E> {
    type Item = &'a E;
    type IntoIter = Iter<'a, E>;

    fn into_iter(self) -> Iter<'a, E> {
        self.iter()
    }
}

impl<E> std::ops::Index<usize> for Snapshot<E> {
    type Output = E;

    fn index(&self, index: usize) -> &E {
        match self.get(index) {
            Some(e) => e,
            None => panic!("index {index} out of a snapshot of {}", self.len),
        }
    }
}

impl<E> Clone for Snapshot<E> {
    fn clone(&self) -> Self {
        Snapshot { parts: Arc::clone(&self.parts), len: self.len }
    }
}

impl<E> Default for Snapshot<E> {
    fn default() -> Self {
        Snapshot { parts: Arc::new([]), len: 0 }
    }
}

impl<E> From<Vec<E>> for Snapshot<E> {
    fn from(records: Vec<E>) -> Self {
        let len = records.len();
        Snapshot::from_runs([(records.into(), 0, len)])
    }
}

impl<E, const N: usize> From<[E; N]> for Snapshot<E> {
    fn from(records: [E; N]) -> Self {
        Vec::from(records).into()
    }
}

impl<E> FromIterator<E> for Snapshot<E> {
    fn from_iter<I: IntoIterator<Item = E>>(records: I) -> Self {
        records.into_iter().collect::<Vec<E>>().into()
    }
}

impl<E: std::fmt::Debug> std::fmt::Debug for Snapshot<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<E: PartialEq> PartialEq for Snapshot<E> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && (Arc::ptr_eq(&self.parts, &other.parts) || self.iter().eq(other.iter()))
    }
}

impl<E: Eq> Eq for Snapshot<E> {}

impl<E: PartialEq> PartialEq<[E]> for Snapshot<E> {
    fn eq(&self, other: &[E]) -> bool {
        self.len == other.len() && self.iter().eq(other.iter())
    }
}

impl<E: PartialEq, const N: usize> PartialEq<[E; N]> for Snapshot<E> {
    fn eq(&self, other: &[E; N]) -> bool {
        *self == other[..]
    }
}

impl<E: PartialEq> PartialEq<Vec<E>> for Snapshot<E> {
    fn eq(&self, other: &Vec<E>) -> bool {
        *self == other[..]
    }
}

impl<E: std::hash::Hash> std::hash::Hash for Snapshot<E> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.len.hash(state);
        for e in self {
            e.hash(state);
        }
    }
}

/// The most records a chunk of [`FreshCopies`] gathers by merging: the
/// fewest records a snapshot of a long queue keeps per part, but the last
/// few, and the most a merge copies.
pub(super) const MERGE_MAX: usize = 4096;

/// The pending reader's copies of the core's fresh run (the records
/// enqueued and never claimed; see [`PendingParts`]), in the chunks its
/// snapshots share.
///
/// Each read copies the records that joined the run since the last read,
/// as a new chunk at the back, and forgets those that left its front.
/// Chunks at the back are merged as a binary counter's digits carry (see
/// [`push_joined`](Self::push_joined)), up to [`MERGE_MAX`] records, so a
/// run of `n` copied records is at most about `2n / MERGE_MAX + log2
/// MERGE_MAX` chunks however it was read, and a record's payload is cloned
/// once when it joins and at most `log2 MERGE_MAX` times by later merges.
/// Records leave only from the first chunk's front; they stay in it,
/// skipped, while they are fewer than its records still pending, and then
/// the pending ones are copied out (at most one clone per record that
/// left): the copies keep at most as many gone payloads alive as pending
/// ones (a snapshot the application holds keeps its own chunks). The records put back
/// ([`PendingParts::returned`]) are copied on each read, placed among the
/// shared ones by sequence. A new generation or a rewrite of the run (a
/// rebase) starts the copies over.
pub(super) struct FreshCopies<T> {
    /// Each non-empty, in sequence order.
    chunks: VecDeque<Arc<[Envelope<T>]>>,
    /// How many records at the front of the first chunk left the run.
    skip: usize,
    generation: Generation,
    rewrites: u64,
}

impl<T> Default for FreshCopies<T> {
    fn default() -> Self {
        FreshCopies { chunks: VecDeque::new(), skip: 0, generation: Generation(0), rewrites: 0 }
    }
}

impl<T: Clone> FreshCopies<T> {
    /// The pending records `parts` shows, sharing what earlier snapshots
    /// copied. A payload's `Clone` that panics leaves the copies as they
    /// were, or with a step completed (each step replaces what it copied
    /// only once it has copied it all).
    pub(super) fn snapshot(&mut self, parts: &PendingParts<'_, T>) -> Snapshot<Envelope<T>> {
        if (parts.generation(), parts.rewrites()) != (self.generation, self.rewrites) {
            *self = FreshCopies { generation: parts.generation(), rewrites: parts.rewrites(), ..Self::default() };
        }
        self.forget_before(parts.fresh_first());
        // Every record of the run at or below the last copied one is
        // copied: copy those above it.
        let from = match self.chunks.back().and_then(|c| c.last()) {
            Some(last) => last.sequence.0.checked_add(1),
            None => Some(0),
        };
        if let Some(from) = from {
            let joined: Vec<Envelope<T>> = parts.fresh_from(Sequence(from)).map(Envelope::cloned).collect();
            if !joined.is_empty() {
                self.push_joined(joined);
            }
        }
        let returned: Arc<[Envelope<T>]> = parts.returned().map(Envelope::cloned).collect();
        self.interleave(returned)
    }

    /// Forgets the records below `first`, the run's front (all of them if
    /// the run is empty). A payload's `Clone` that panics here leaves the
    /// front chunk whole, with its records that left skipped.
    fn forget_before(&mut self, first: Option<Sequence>) {
        let Some(first) = first else {
            self.chunks.clear();
            self.skip = 0;
            return;
        };
        while self.chunks.front().is_some_and(|c| c.last().is_none_or(|e| e.sequence < first)) {
            self.chunks.pop_front();
            self.skip = 0;
        }
        let Some(front) = self.chunks.front_mut() else { return };
        self.skip = front.partition_point(|e| e.sequence < first);
        // Records that left are kept only while they are fewer than those
        // still in the chunk: past that, the live part is copied out (each
        // record that left pays for at most one live copy), so the copies
        // never keep more gone payloads alive than pending ones.
        if self.skip * 2 > front.len() {
            *front = front[self.skip..].iter().cloned().collect();
            self.skip = 0;
        }
    }

    /// Adds the records that joined the run as a chunk at the back,
    /// merged in one copy with the chunks at the back of a level no higher
    /// than what it gathers (a chunk of `n` live records has level
    /// `log2 n`), within [`MERGE_MAX`]. So levels fall strictly towards the
    /// back but for merges the bound stopped, and each merge raises the
    /// level of every record it copies from an earlier chunk.
    fn push_joined(&mut self, joined: Vec<Envelope<T>>) {
        let level = |n: usize| usize::BITS - n.leading_zeros();
        let (mut total, mut first) = (joined.len(), self.chunks.len());
        while first > 0 {
            let live = self.chunks[first - 1].len() - if first == 1 { self.skip } else { 0 };
            if level(live) > level(total) || total + live > MERGE_MAX {
                break;
            }
            total += live;
            first -= 1;
        }
        if first == self.chunks.len() {
            self.chunks.push_back(joined.into());
            return;
        }
        let mut merged = Vec::with_capacity(total);
        for (i, chunk) in self.chunks.range(first..).enumerate() {
            let from = if first + i == 0 { self.skip } else { 0 };
            merged.extend(chunk[from..].iter().cloned());
        }
        merged.extend(joined);
        self.chunks.truncate(first);
        if first == 0 {
            self.skip = 0;
        }
        self.chunks.push_back(merged.into());
    }

    /// The snapshot: the shared runs, with the records put back placed
    /// among them by sequence.
    fn interleave(&self, returned: Arc<[Envelope<T>]>) -> Snapshot<Envelope<T>> {
        let mut runs = Vec::with_capacity(self.chunks.len() + 2 * returned.len() + 1);
        let mut r = 0;
        for (i, chunk) in self.chunks.iter().enumerate() {
            let mut at = if i == 0 { self.skip } else { 0 };
            while at < chunk.len() {
                // The records put back below the next shared one go first.
                let below = r + returned[r..].partition_point(|e| e.sequence < chunk[at].sequence);
                runs.push((Arc::clone(&returned), r, below));
                r = below;
                // Then the shared ones up to the next record put back.
                let upto = match returned.get(r) {
                    Some(next) => at + chunk[at..].partition_point(|e| e.sequence < next.sequence),
                    None => chunk.len(),
                };
                runs.push((Arc::clone(chunk), at, upto));
                at = upto;
            }
        }
        let n = returned.len();
        runs.push((returned, r, n));
        Snapshot::from_runs(runs)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use egress_core::{
        ClaimOutcome, DeadMark, DeadReason, EgressCore, FailureKind, JitterSample, Policy, RebaseOutcome, Restored,
        RestoredRecord, Time,
    };

    use super::*;

    thread_local! {
        static CLONES: Cell<usize> = const { Cell::new(0) };
        static PANIC_ON_CLONE: Cell<bool> = const { Cell::new(false) };
    }

    /// A payload that counts its clones, and panics in one on demand.
    #[derive(Debug, PartialEq, Eq)]
    struct Counted(u64);

    impl Clone for Counted {
        fn clone(&self) -> Self {
            assert!(!PANIC_ON_CLONE.get(), "clone refused");
            CLONES.set(CLONES.get() + 1);
            Counted(self.0)
        }
    }

    fn clones() -> usize {
        CLONES.get()
    }

    fn expected(core: &EgressCore<Counted>) -> Vec<Envelope<Counted>> {
        let before = clones();
        let list = core.pending().map(Envelope::cloned).collect();
        CLONES.set(before);
        list
    }

    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn a_snapshot_reads_as_a_list_across_its_parts() {
        let a: Arc<[u32]> = vec![0, 1, 2, 3].into();
        let b: Arc<[u32]> = vec![10, 11].into();
        let s = Snapshot::from_runs([(a.clone(), 1, 3), (b.clone(), 0, 0), (b, 0, 2), (a, 3, 4)]);
        assert_eq!((s.len(), s.is_empty(), s.parts.len()), (5, false, 3));
        assert_eq!(s.to_vec(), [1, 2, 10, 11, 3]);
        assert_eq!(
            (0..6).map(|i| s.get(i).copied()).collect::<Vec<_>>(),
            [Some(1), Some(2), Some(10), Some(11), Some(3), None]
        );
        assert_eq!((s[2], s.first(), s.last()), (10, Some(&1), Some(&3)));
        assert_eq!(s.iter().rev().copied().collect::<Vec<_>>(), [3, 11, 10, 2, 1]);
        let mut it = s.iter();
        assert_eq!((it.len(), it.next(), it.next_back(), it.len()), (5, Some(&1), Some(&3), 3));
        assert_eq!(it.clone().count(), 3);
        assert_eq!(s, [1, 2, 10, 11, 3]);
        assert_ne!(s, [1, 2, 10, 11, 4]);
        assert_ne!(s, [1, 2, 10, 11]);
        assert!(s == vec![1, 2, 10, 11, 3] && s != vec![1, 2, 10, 11, 4] && s != vec![1, 2, 10, 11, 3, 5]);
        assert!(s == [1, 2, 10, 11, 3][..] && s != [1, 2, 10, 11, 4][..] && s != [1, 2][..]);
        assert_eq!(s, Snapshot::from(vec![1, 2, 10, 11, 3]));
        assert_ne!(s, Snapshot::from(vec![1, 2, 10, 11, 4]));
        assert_ne!(s, Snapshot::from(vec![1, 2, 10, 11]));
        assert_eq!(format!("{s:?}"), "[1, 2, 10, 11, 3]");
        let state = std::hash::RandomState::new();
        let h = |s: &Snapshot<u32>| std::hash::BuildHasher::hash_one(&state, s);
        assert_eq!(h(&s), h(&[1, 2, 10, 11, 3].into_iter().collect()));
        assert_ne!(h(&s), h(&Snapshot::from([1, 2, 10, 11])));
        let copy = s.clone();
        assert!(copy == s && copy.to_vec() == s.to_vec());
        assert_eq!(Snapshot::from(vec![7, 8]).to_vec(), [7, 8]);
        assert_eq!(Snapshot::from([7, 8, 9]).to_vec(), [7, 8, 9]);
        assert_eq!((5..8).collect::<Snapshot<u32>>().to_vec(), [5, 6, 7]);
        let empty = Snapshot::<u32>::default();
        assert_eq!(
            (empty.len(), empty.is_empty(), empty.first(), empty.last(), empty.get(0)),
            (0, true, None, None, None)
        );
        assert_eq!(empty.iter().next(), None);
        assert!(std::panic::catch_unwind(|| s[5]).is_err());
    }

    /// Every snapshot equals a copy of the core's pending records, through
    /// every transition that moves records in or out of pending, read after
    /// every step or after several; the copies stay few chunks and clone
    /// each payload a bounded number of times.
    #[test]
    fn fresh_copies_match_the_core_through_random_transitions() {
        for seed in 1..=300u64 {
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let restored = Restored {
                next_sequence: Sequence(3),
                records: (0..3)
                    .map(|s| RestoredRecord {
                        sequence: Sequence(s),
                        payload: Counted(1000 + s),
                        // A tombstone, restored among the records put back.
                        dead: (s == 1).then_some(DeadMark { reason: DeadReason::Permanent, held: false }),
                    })
                    .collect(),
                ..Restored::empty()
            };
            let policy = Policy::builder().inflight_limit(8).retry_budget(2).build().expect("a policy");
            let mut core = EgressCore::restore(policy, restored).expect("a restore");
            let mut copies = FreshCopies::default();
            let (mut now, mut payload, mut joined, mut returned, mut restarts) = (0u64, 0u64, 3usize, 0usize, 0usize);
            let mut stamp = (core.generation(), 0);
            let start = clones();
            for step in 0..400 {
                let g = core.generation();
                match xorshift(&mut rng) % 12 {
                    0..=3 => {
                        for _ in 0..=xorshift(&mut rng) % 5 {
                            payload += 1;
                            let _ = core.enqueue(Counted(payload));
                            joined += 1;
                        }
                    }
                    4 => {
                        if let Some(ready) = core.poll_ready() {
                            let _ = core.persisted(ready.epoch);
                        }
                    }
                    5 | 6 => {
                        for _ in 0..=xorshift(&mut rng) % 4 {
                            let _ = matches!(core.claim(g).outcome, ClaimOutcome::Claimed(_));
                        }
                    }
                    7 => {
                        let last = core.inflight().last().map(|e| e.sequence);
                        if let Some(last) = last {
                            let _ = core.ack(g, last);
                        }
                    }
                    8 => {
                        let first = core.inflight().next().map(|e| e.sequence);
                        if let Some(s) = first {
                            let kind = if xorshift(&mut rng).is_multiple_of(4) {
                                FailureKind::Permanent
                            } else {
                                FailureKind::Transient
                            };
                            let _ = core.fail(g, s, kind, Time(now), JitterSample::ZERO);
                        }
                    }
                    9 => {
                        now += 50;
                        let _ = core.handle_timeout(Time(now));
                        let dead = core.exhausted().next().map(|e| e.sequence);
                        if let Some(s) = dead {
                            let _ = core.requeue(g, s);
                        }
                    }
                    10 => {
                        let _ = core.reconnect(egress_core::Generation(g.0 + 1));
                    }
                    _ => {
                        let from = core.durable_through().map_or(0, |d| d.0 + 1);
                        let theirs =
                            (0..=xorshift(&mut rng) % 3).map(|k| (Sequence(from + k), Counted(5000 + step * 10 + k)));
                        let theirs: Vec<_> = theirs.collect();
                        let n = theirs.len();
                        if let RebaseOutcome::Rebased { .. } = core.rebase(theirs).outcome {
                            joined += n;
                        }
                    }
                }
                if !xorshift(&mut rng).is_multiple_of(3) {
                    continue;
                }
                let parts = core.pending_parts();
                if (parts.generation(), parts.rewrites()) != stamp {
                    // A new generation or a rebase: every record is copied again.
                    stamp = (parts.generation(), parts.rewrites());
                    restarts += core.pending_len();
                }
                returned += parts.returned().len();
                let snapshot = copies.snapshot(&core.pending_parts());
                assert_eq!(snapshot.to_vec(), expected(&core), "seed {seed}, step {step}");
                let copied: usize = copies.chunks.iter().map(|c| c.len()).sum();
                assert!(
                    copies.chunks.len() <= 2 * copied / MERGE_MAX + 2 + MERGE_MAX.ilog2() as usize,
                    "seed {seed}, step {step}: {} chunks for {copied} records",
                    copies.chunks.len()
                );
                assert!(copies.chunks.iter().all(|c| !c.is_empty()), "no empty chunk");
                assert!(
                    copies.skip * 2 <= copies.chunks.front().map_or(0, |c| c.len()),
                    "gone records at most the live ones"
                );
            }
            // What the reads copy beside the records that joined (once, and
            // by merges): the records put back, on each read, and everything
            // after a restart (and its merges).
            let bound = (joined + restarts) * (2 + MERGE_MAX.ilog2() as usize) + returned;
            assert!(clones() - start <= bound, "seed {seed}: {} clones, over {bound}", clones() - start);
        }
    }

    #[test]
    fn reading_after_each_enqueue_clones_each_payload_a_bounded_number_of_times() {
        let mut core = EgressCore::new(Policy::default());
        let mut copies = FreshCopies::default();
        let n = 20_000;
        let start = clones();
        let mut last = Snapshot::default();
        for i in 0..n {
            let _ = core.enqueue(Counted(i));
            last = copies.snapshot(&core.pending_parts());
        }
        let per_record = (clones() - start) as f64 / n as f64;
        assert!(per_record <= 1.0 + f64::from(MERGE_MAX.ilog2()), "{per_record} clones per record");
        assert_eq!(last.len(), n as usize);
        assert!(last.iter().map(|e| e.payload.0).eq(0..n));
        // The long queue is a few shared chunks, and the next read shares
        // them: merges fill chunks up to the bound, and no further.
        assert!(copies.chunks.len() <= 2 * n as usize / MERGE_MAX + 13, "{} chunks", copies.chunks.len());
        assert!(copies.chunks[0].len() == MERGE_MAX && copies.chunks.iter().all(|c| c.len() <= MERGE_MAX));
        let _ = core.enqueue(Counted(n));
        let before = clones();
        let next = copies.snapshot(&core.pending_parts());
        assert!(clones() - before <= MERGE_MAX, "one read clones at most a merge");
        assert!(Arc::ptr_eq(&last.parts[0].chunk, &next.parts[0].chunk), "the front chunk is shared");
    }

    fn lengths(copies: &FreshCopies<Counted>) -> Vec<usize> {
        copies.chunks.iter().map(|c| c.len()).collect()
    }

    #[test]
    fn chunks_merge_as_a_binary_counter_carries_counting_the_live_records() {
        let mut core = EgressCore::new(Policy::default());
        let mut copies = FreshCopies::default();
        let mut seen = Vec::new();
        for i in 0..8 {
            let _ = core.enqueue(Counted(i));
            let _ = copies.snapshot(&core.pending_parts());
            seen.push(lengths(&copies));
        }
        let expected: [&[usize]; 8] = [&[1], &[2], &[2, 1], &[4], &[4, 1], &[4, 2], &[4, 2, 1], &[8]];
        assert_eq!(seen, expected);
        // 3 of the 8 leave: skipped, not copied out (3 < 5 remain).
        let g = core.generation();
        for _ in 0..3 {
            assert!(matches!(core.claim(g).outcome, ClaimOutcome::Claimed(_)));
        }
        let _ = copies.snapshot(&core.pending_parts());
        assert_eq!((lengths(&copies), copies.skip), (vec![8], 3));
        // 4 join: the first chunk's 5 live records are of the same level, so
        // they merge, and only the live ones are copied.
        for i in 8..12 {
            let _ = core.enqueue(Counted(i));
        }
        let before = clones();
        let snapshot = copies.snapshot(&core.pending_parts());
        assert_eq!((lengths(&copies), copies.skip, clones() - before), (vec![9], 0, 5 + 4));
        assert!(snapshot.iter().map(|e| e.payload.0).eq(3..12));
        // 5 of the 9 leave: more than remain, so the 4 left are copied out.
        for _ in 0..5 {
            assert!(matches!(core.claim(g).outcome, ClaimOutcome::Claimed(_)));
        }
        let before = clones();
        let _ = copies.snapshot(&core.pending_parts());
        assert_eq!((lengths(&copies), copies.skip, clones() - before), (vec![4], 0, 4));
        // Half of them leave: as many gone as live is kept, skipped.
        for _ in 0..2 {
            assert!(matches!(core.claim(g).outcome, ClaimOutcome::Claimed(_)));
        }
        let _ = copies.snapshot(&core.pending_parts());
        assert_eq!((lengths(&copies), copies.skip), (vec![4], 2));
    }

    #[test]
    fn copies_are_kept_under_a_generation_and_a_rewrite_count_not_zero() {
        let restored = Restored { generation: egress_core::Generation(6), ..Restored::empty() };
        let mut core = EgressCore::restore(Policy::default(), restored).expect("a restore");
        assert!(matches!(core.rebase(vec![(Sequence(0), Counted(0))]).outcome, RebaseOutcome::Rebased { .. }));
        let parts = core.pending_parts();
        assert!(parts.generation() != egress_core::Generation(0) && parts.rewrites() == 1);
        let mut copies = FreshCopies::default();
        let start = clones();
        for i in 1..=1_000 {
            let _ = core.enqueue(Counted(i));
            let _ = copies.snapshot(&core.pending_parts());
        }
        // Kept across reads: a payload cloned at most 1 + log2(1000) times,
        // where copies started over at each read would clone 500,500.
        assert!(clones() - start <= 1_001 * 11, "{} clones", clones() - start);
    }

    #[test]
    fn a_clone_that_panics_leaves_the_copies_true() {
        let mut core = EgressCore::new(Policy::default());
        let mut copies = FreshCopies::default();
        for i in 0..100 {
            let _ = core.enqueue(Counted(i));
            if i % 7 == 0 {
                let _ = copies.snapshot(&core.pending_parts());
            }
        }
        for i in 100..200 {
            let _ = core.enqueue(Counted(i));
            PANIC_ON_CLONE.set(i % 3 == 0);
            let read =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| copies.snapshot(&core.pending_parts())));
            PANIC_ON_CLONE.set(false);
            assert_eq!(read.is_err(), i % 3 == 0);
            assert_eq!(copies.snapshot(&core.pending_parts()).to_vec(), expected(&core), "after {i}");
        }
    }
}
