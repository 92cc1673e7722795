//! Durability: what a store must write, what it reported durable, and the
//! gates that keep a record off the wire until it is (R1) and a handshake
//! off the wire until its generation is (R2).
//!
//! The core does no I/O here either. A core built by
//! [`EgressCore::restore`] keeps a *journal*: [`poll_ready`] hands out one
//! numbered [`Ready`] at a time (everything to write since the last one),
//! the store writes it in one transaction, and reports back with
//! [`persisted`] or [`persist_failed`]. A record is claimable only once
//! its append is durable, and no claim is made under a generation that is
//! not. Acknowledgements and dead letters are written lazily: losing such
//! a write after a crash costs a replay (the receiver's welcome trims it)
//! or another try of a dead letter, never a record.
//!
//! [`poll_ready`]: EgressCore::poll_ready
//! [`persisted`]: EgressCore::persisted
//! [`persist_failed`]: EgressCore::persist_failed

use std::collections::BTreeMap;
use std::ops::Range;

use crate::changes::{Changes, Projection};
use crate::core::{EgressCore, Isolation};
use crate::envelope::{Exhausted, Record};
use crate::ids::{Epoch, FlushEpoch, Generation, Sequence};
use crate::outcome::Transition;
use crate::parked::ParkedSet;
use crate::pending::PendingQueue;
use crate::policy::Policy;
use crate::restored::{Recovered, RestoreError, Restored};
use crate::retry::DeadReason;
use crate::window::Window;

/// How a dead letter is kept: as a tombstone sent in its place, or held
/// back (see [`DeadLetters`](crate::DeadLetters)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DeadMark {
    /// Why it died.
    pub reason: DeadReason,
    /// `true`: held among the exhausted records; `false`: a tombstone.
    pub held: bool,
}

/// Everything a store must write for one epoch, in one transaction. Handed
/// out by [`EgressCore::poll_ready`]; report it with
/// [`persisted`](EgressCore::persisted) or
/// [`persist_failed`](EgressCore::persist_failed).
///
/// Writes are idempotent (an append of a sequence already stored with the
/// same payload, a watermark that only rises), so a store may retry a
/// failed epoch's contents; after a failure the next `Ready` carries them
/// again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ready {
    /// Its number: epochs rise by one per `Ready`.
    pub epoch: Epoch,
    /// Records to append: their payloads are
    /// [`EgressCore::unwritten`]'s. Not claimable until this epoch is
    /// persisted.
    pub appends: Range<Sequence>,
    /// Raise the stored acknowledgement watermark to this, and prune the
    /// records at or below it. May lag (R3): a lost write costs replays the
    /// receiver's welcome trims.
    pub acked_through: Option<Sequence>,
    /// Store this generation before any handshake under it (R2).
    pub generation: Option<Generation>,
    /// Records whose dead-letter state changed: `Some` dead, `None` alive
    /// again (a requeue). A lost write makes a dead letter try again after a
    /// restart, the safe direction.
    pub dead: Vec<(Sequence, Option<DeadMark>)>,
    /// Whether the transaction must reach the disk before it is reported
    /// (appends and generations must; watermarks and dead letters may wait
    /// for the next synced commit).
    pub must_sync: bool,
}

/// A stored failure to persist an epoch, as the core keeps it: shown by
/// [`EgressCore::persist_error`] until a later epoch is persisted.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PersistError {
    /// The epoch that failed.
    pub epoch: Epoch,
    /// What the store said.
    pub reason: String,
}

/// What [`persisted`](EgressCore::persisted) and
/// [`persist_failed`](EgressCore::persist_failed) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PersistOutcome {
    /// Taken: the durable watermark is now `durable_through`.
    Recorded {
        /// Every sequence at or below it is durable.
        durable_through: Option<Sequence>,
    },
    /// Refused: `epoch` is not the one being written (already reported, or
    /// never handed out). Nothing changed.
    UnknownEpoch {
        /// The epoch named.
        epoch: Epoch,
    },
}

/// What [`adopt`](EgressCore::adopt) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdoptOutcome {
    /// The record is pending under `sequence`, durable already.
    Adopted {
        /// Its sequence.
        sequence: Sequence,
    },
    /// Refused: a store assigns sequences in order, and the next one the
    /// core expects is `expected` (a record skipped or adopted twice).
    OutOfOrder {
        /// The sequence the core expects.
        expected: Sequence,
        /// The sequence named.
        found: Sequence,
    },
    /// Refused: records enqueued through the core are not yet durable, so
    /// the store would assign their sequences again. A stream takes either
    /// appends through the core or appends by the store, not both at once.
    Unwritten {
        /// The first sequence not durable.
        from: Sequence,
    },
}

/// What [`rebase`](EgressCore::rebase) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RebaseOutcome {
    /// `adopted` records of the other writer were taken in order, and the
    /// `moved` records the core had enqueued, never written nor sent, now
    /// follow them under new sequences.
    Rebased {
        /// Records taken from the store.
        adopted: usize,
        /// Records renumbered.
        moved: usize,
    },
    /// Refused: the other writer's records must start at `expected` (the
    /// first sequence not durable) and follow each other.
    OutOfOrder {
        /// The sequence expected.
        expected: Sequence,
        /// The sequence found.
        found: Sequence,
    },
    /// Refused: a `Ready` is being written; report it first.
    Writing,
    /// Refused: the core keeps no journal.
    NotJournaled,
}

/// Where one message stands: what a UI shows next to it, from "saving…"
/// to "delivered". See [`EgressCore::status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "snake_case"))]
pub enum MessageStatus {
    /// Enqueued, not yet durable (only with a journal); or, at or above
    /// the next sequence of a core with a journal, perhaps appended to the
    /// store by an application's transaction and not yet adopted.
    Saving,
    /// Waiting to be sent (durable, with a journal).
    Queued,
    /// Sent, not yet acknowledged.
    Sending,
    /// The peer holds it (a receipt), not yet acknowledged.
    Received,
    /// A send failed; waiting for its backoff.
    Retrying,
    /// A dead letter, for this reason: held, or sent as a tombstone in its
    /// place. Once the tombstone is acknowledged the receiver has skipped
    /// the sequence, and the status stays dead (for the newest
    /// [`SKIPPED_MEMORY`](crate::SKIPPED_MEMORY) such records, across a
    /// restart from a store that keeps them). A tombstone replaces every
    /// later try, not an earlier one: a try that reached the receiver
    /// before its acknowledgement was lost was delivered, which the sender
    /// cannot know (never so for a permanent refusal).
    Dead(DeadReason),
    /// Acknowledged: delivered. Stays so: the core forgets the record, not
    /// the watermark. (A skipped dead letter older than the newest
    /// [`SKIPPED_MEMORY`](crate::SKIPPED_MEMORY) reads so too.)
    Acknowledged,
}

/// A status as a UI's short label: "saving", "queued", "sending",
/// "received", "retrying", "failed: " and the [reason](DeadReason), or
/// "delivered".
impl core::fmt::Display for MessageStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            MessageStatus::Saving => f.write_str("saving"),
            MessageStatus::Queued => f.write_str("queued"),
            MessageStatus::Sending => f.write_str("sending"),
            MessageStatus::Received => f.write_str("received"),
            MessageStatus::Retrying => f.write_str("retrying"),
            MessageStatus::Dead(reason) => write!(f, "failed: {reason}"),
            MessageStatus::Acknowledged => f.write_str("delivered"),
        }
    }
}

/// What the core knows of the store: what it handed out, what is durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Journal {
    /// Every sequence below it is durable.
    durable_next: Sequence,
    /// Every sequence below it was handed out in a `Ready`.
    written_next: Sequence,
    durable_generation: Generation,
    written_generation: Generation,
    written_acked: Option<Sequence>,
    /// The acknowledgement watermark the store is known to hold: where a
    /// restart resumes from.
    durable_acked: Option<Sequence>,
    /// Dead-letter changes not yet handed out, latest per sequence.
    dead: BTreeMap<Sequence, Option<DeadMark>>,
    /// The epoch being written, with its dead-letter changes (given back
    /// on a failure), and the epoch after it.
    writing: Option<(Epoch, BTreeMap<Sequence, Option<DeadMark>>)>,
    next_epoch: Epoch,
    error: Option<PersistError>,
    recovered: Recovered,
}

impl<T> EgressCore<T> {
    /// Rebuilds a core from what a store recovered: every record not dead
    /// is pending under the stored generation, tombstones pending as
    /// tombstones, held dead letters held; nothing is in flight or parked,
    /// and no backoff or attempt count carries over. Every restored record
    /// may have been sent before the crash, so acknowledgements may cover
    /// all of them. The core keeps a journal from now on (see
    /// [`poll_ready`](Self::poll_ready)); `Restored::empty()` starts a new
    /// durable stream.
    ///
    /// # Errors
    /// A record missing, out of range, a watermark at or above the next
    /// sequence, or a next sequence above `i64::MAX`: [`RestoreError`].
    pub fn restore(policy: Policy, snapshot: Restored<T>) -> Result<Self, RestoreError> {
        let Restored { generation, next_sequence, acked_through, records, skipped } = snapshot;
        if next_sequence.0 > i64::MAX.unsigned_abs() {
            return Err(RestoreError::SequenceSpace { next_sequence });
        }
        if let Some(a) = acked_through
            && a >= next_sequence
        {
            return Err(RestoreError::AckedBeyondNext { acked_through: a, next_sequence });
        }
        let first = acked_through.map_or(Sequence(0), |a| a.next());
        let mut below = Some(first);
        for &(sequence, _) in skipped.iter().rev() {
            if below.is_none_or(|b| sequence >= b) {
                return Err(RestoreError::OutOfRange { sequence });
            }
            below = Some(sequence);
        }
        let mut expected = first;
        let mut pending = PendingQueue::default();
        let mut exhausted = BTreeMap::new();
        let mut tombstones = 0;
        for r in records {
            if r.sequence >= next_sequence || r.sequence < first {
                return Err(RestoreError::OutOfRange { sequence: r.sequence });
            }
            if r.sequence != expected {
                return Err(RestoreError::Gap { expected, found: Some(r.sequence) });
            }
            expected = r.sequence.next();
            let mut record = Record::new(r.sequence, r.payload);
            match r.dead {
                Some(DeadMark { reason, held: true }) => {
                    exhausted.insert(r.sequence, Exhausted { generation, reason, record });
                }
                Some(DeadMark { reason, held: false }) => {
                    // Tombstones are records put back, not fresh ones.
                    record.dead = Some(reason);
                    tombstones += 1;
                    pending.put_back(record);
                }
                None => pending.push_new(record.sequence, record.payload),
            }
        }
        if expected != next_sequence {
            return Err(RestoreError::Gap { expected, found: None });
        }
        let last = next_sequence.0.checked_sub(1).map(Sequence);
        let recovered = Recovered {
            generation,
            next_sequence,
            acked_through,
            pending: pending.len(),
            tombstones,
            held: exhausted.len(),
        };
        Ok(Self {
            policy,
            generation,
            next_sequence,
            pending,
            inflight: Window::default(),
            parked: ParkedSet::default(),
            exhausted,
            acked_through,
            received_through: acked_through,
            sent_through: last,
            retry: None,
            progressed: false,
            isolation: Isolation::Off,
            gates: BTreeMap::new(),
            released: FlushEpoch(0),
            skipped: skipped[skipped.len().saturating_sub(crate::SKIPPED_MEMORY)..].iter().copied().collect(),
            journal: Some(Box::new(Journal {
                durable_next: next_sequence,
                written_next: next_sequence,
                durable_generation: generation,
                written_generation: generation,
                written_acked: acked_through,
                durable_acked: acked_through,
                dead: BTreeMap::new(),
                writing: None,
                next_epoch: Epoch(0),
                error: None,
                recovered,
            })),
        })
    }

    /// What [`restore`](Self::restore) found in the store; `None` for a
    /// core built by [`new`](Self::new).
    #[must_use]
    pub fn recovered(&self) -> Option<Recovered> {
        self.journal.as_ref().map(|j| j.recovered)
    }

    /// Whether the core keeps a journal (it was built by
    /// [`restore`](Self::restore)): records are claimable only once
    /// durable.
    #[must_use]
    pub fn is_journaled(&self) -> bool {
        self.journal.is_some()
    }

    /// Every sequence at or below it is durable. `None` without a journal,
    /// or while nothing is.
    #[must_use]
    pub fn durable_through(&self) -> Option<Sequence> {
        self.journal.as_ref().and_then(|j| j.durable_next.0.checked_sub(1).map(Sequence))
    }

    /// The lowest sequence the producer holds for good: one above the
    /// acknowledgement watermark its store holds (with a journal), or the
    /// one it knows (without: a restart is a new incarnation anyway). A
    /// stored watermark trails the known one (acknowledgements are written
    /// with the next commit), and a restart resumes from the stored one:
    /// this is what the producer may tell a receiver it saw acknowledged
    /// (a handshake's resume-from, the detail of an orderly close), so that
    /// a receiver that forgets the stream on that word never sees it come
    /// back from lower.
    #[must_use]
    pub fn resume_from(&self) -> Sequence {
        let acked = match self.journal.as_deref() {
            Some(j) => j.durable_acked,
            None => self.acked_through,
        };
        acked.map_or(Sequence(0), |a| Sequence(a.0.saturating_add(1)))
    }

    /// How many records are enqueued and not yet durable: a chat UI's
    /// "saving…" count. Always 0 without a journal.
    #[must_use]
    pub fn unpersisted_len(&self) -> usize {
        self.journal
            .as_ref()
            .map_or(0, |j| usize::try_from(self.next_sequence.0 - j.durable_next.0).unwrap_or(usize::MAX))
    }

    /// Whether the current generation is durable, so that a handshake may
    /// use it (R2). Always `true` without a journal.
    #[must_use]
    pub fn generation_durable(&self) -> bool {
        self.journal.as_ref().is_none_or(|j| j.durable_generation >= self.generation)
    }

    /// The last failure to persist, until a later epoch is persisted.
    #[must_use]
    pub fn persist_error(&self) -> Option<&PersistError> {
        self.journal.as_ref().and_then(|j| j.error.as_ref())
    }

    /// The records of `range` not yet written, with their payloads, for the
    /// store to append ([`Ready::appends`]). Records outside what is
    /// unwritten are skipped.
    pub fn unwritten(&self, range: Range<Sequence>) -> impl Iterator<Item = (Sequence, &T)> + '_ {
        // Records not yet durable are never claimed, acknowledged or
        // failed: they are the tail of pending's fresh part.
        let durable = self.journal.as_ref().map_or(self.next_sequence, |j| j.durable_next);
        let (from, to) = (range.start.max(durable), range.end.min(self.next_sequence));
        self.pending.fresh_from(from).take_while(move |(s, _)| *s < to)
    }

    /// What the store must write next, if anything: one [`Ready`] at a time.
    /// Until it is reported ([`persisted`](Self::persisted) or
    /// [`persist_failed`](Self::persist_failed)) this returns `None`, and
    /// what happens meanwhile goes into the next one: group commit.
    ///
    /// Changes nothing observable.
    pub fn poll_ready(&mut self) -> Option<Ready> {
        let acked = self.acked_through;
        let (generation, next) = (self.generation, self.next_sequence);
        let j = self.journal.as_deref_mut()?;
        if j.writing.is_some() {
            return None;
        }
        // A record waiting for a flush epoch is not written (nor anything
        // after it) until released: what is stored after a crash never
        // depends on state the application had not made durable.
        let gate = self.gates.range(j.written_next..).next().map(|(s, _)| *s);
        let next = gate.map_or(next, |g| g.min(next));
        let appends = j.written_next..next;
        let acked_through = acked.filter(|a| j.written_acked.is_none_or(|w| *a > w));
        let new_generation = (generation > j.written_generation).then_some(generation);
        if appends.is_empty() && acked_through.is_none() && new_generation.is_none() && j.dead.is_empty() {
            return None;
        }
        let epoch = j.next_epoch;
        j.next_epoch = Epoch(epoch.0.wrapping_add(1));
        j.written_next = next;
        j.written_acked = acked_through.or(j.written_acked);
        j.written_generation = generation;
        let dead = std::mem::take(&mut j.dead);
        let ready = Ready {
            epoch,
            must_sync: !appends.is_empty() || new_generation.is_some(),
            appends,
            acked_through,
            generation: new_generation,
            dead: dead.iter().map(|(s, d)| (*s, *d)).collect(),
        };
        j.writing = Some((epoch, dead));
        Some(ready)
    }

    /// The store wrote epoch `epoch`: its appends are durable (and
    /// claimable), its generation may be used in a handshake, and a stored
    /// failure is cleared.
    ///
    /// Refused with `UnknownEpoch` unless `epoch` is the one being written.
    ///
    /// Changes: durable, if the durable watermark or the generation's
    /// durability moved; persist_error, if one was shown.
    pub fn persisted(&mut self, epoch: Epoch) -> Transition<PersistOutcome> {
        let generation = self.generation;
        let Some(j) = self.journal.as_deref_mut().filter(|j| j.writing.as_ref().is_some_and(|(e, _)| *e == epoch))
        else {
            return Transition::unchanged(PersistOutcome::UnknownEpoch { epoch });
        };
        j.writing = None;
        let was_durable = j.durable_generation >= generation;
        let moved = j.durable_next != j.written_next;
        j.durable_next = j.written_next;
        j.durable_generation = j.written_generation;
        // Only one epoch is written at a time, and nothing changes what it
        // said meanwhile: what it wrote is stored now.
        j.durable_acked = j.durable_acked.max(j.written_acked);
        let generation_moved = was_durable != (j.durable_generation >= generation);
        let cleared = j.error.take().is_some();
        let changes = Changes::NONE
            .with_if(Projection::Durable, moved || generation_moved)
            .with_if(Projection::PersistError, cleared);
        Transition::new(PersistOutcome::Recorded { durable_through: self.durable_through() }, changes)
    }

    /// The store could not write epoch `epoch` (`reason` is what it said):
    /// nothing of it counts as durable, the error is shown, and the next
    /// [`poll_ready`](Self::poll_ready) carries its contents again. Sending
    /// stalls on what is not durable rather than losing anything.
    ///
    /// Refused with `UnknownEpoch` unless `epoch` is the one being written.
    ///
    /// Changes: persist_error (it names the epoch, so it always differs
    /// from the one shown).
    pub fn persist_failed(&mut self, epoch: Epoch, reason: impl Into<String>) -> Transition<PersistOutcome> {
        let durable_through = self.durable_through();
        let Some(j) = self.journal.as_deref_mut().filter(|j| j.writing.as_ref().is_some_and(|(e, _)| *e == epoch))
        else {
            return Transition::unchanged(PersistOutcome::UnknownEpoch { epoch });
        };
        let (_, dead) = j.writing.take().expect("checked above");
        for (sequence, mark) in dead {
            j.dead.entry(sequence).or_insert(mark);
        }
        j.written_next = j.durable_next;
        j.written_generation = j.durable_generation;
        // The watermark is written again if it is above what is known to be
        // stored; not knowing, write it again.
        j.written_acked = None;
        let error = PersistError { epoch, reason: reason.into() };
        let changed = j.error.as_ref() != Some(&error);
        j.error = Some(error);
        Transition::new(
            PersistOutcome::Recorded { durable_through },
            Changes::NONE.with_if(Projection::PersistError, changed),
        )
    }

    /// Takes a record the store appended itself (inside an application's
    /// transaction) under `sequence`: durable already, so claimable at once.
    ///
    /// Refused with `OutOfOrder` unless `sequence` is
    /// [`next_sequence`](Self::next_sequence), and with `Unwritten` while
    /// records enqueued through the core are not durable yet.
    ///
    /// Changes: pending; durable, with a journal.
    pub fn adopt(&mut self, sequence: Sequence, payload: T) -> Transition<AdoptOutcome> {
        if sequence != self.next_sequence {
            return Transition::unchanged(AdoptOutcome::OutOfOrder { expected: self.next_sequence, found: sequence });
        }
        if let Some(j) = self.journal.as_deref()
            && j.durable_next != self.next_sequence
        {
            return Transition::unchanged(AdoptOutcome::Unwritten { from: j.durable_next });
        }
        let _ = self.enqueue(payload);
        let journaled = self.journal.is_some();
        if let Some(j) = self.journal.as_deref_mut() {
            j.written_next = self.next_sequence;
            j.durable_next = self.next_sequence;
        }
        Transition::new(
            AdoptOutcome::Adopted { sequence },
            Changes::NONE.with(Projection::Pending).with_if(Projection::Durable, journaled),
        )
    }

    /// Takes records another writer appended to the store (an application's
    /// transactional outbox) under the sequences the core had given to
    /// records it enqueued but has not written: those were never durable,
    /// so never sent, and they move behind the other writer's records,
    /// under new sequences, in the same order. A store refuses a write
    /// whose sequences another writer took (`Conflict`); its relay fails
    /// the epoch, reads the other writer's records and calls this. (A
    /// sequence `enqueue` returned is final once durable.)
    ///
    /// Refused unless the core keeps a journal, while a `Ready` is being
    /// written, and unless `appended` starts at the first sequence not
    /// durable and goes on without a gap. Nothing changes then.
    ///
    /// Changes: pending and durable, if anything was taken.
    pub fn rebase(&mut self, appended: Vec<(Sequence, T)>) -> Transition<RebaseOutcome> {
        let next = self.next_sequence;
        let Some(j) = self.journal.as_deref_mut() else {
            return Transition::unchanged(RebaseOutcome::NotJournaled);
        };
        if j.writing.is_some() {
            return Transition::unchanged(RebaseOutcome::Writing);
        }
        let from = j.durable_next;
        for (i, (sequence, _)) in appended.iter().enumerate() {
            let expected = Sequence(from.0.saturating_add(i as u64));
            if *sequence != expected {
                return Transition::unchanged(RebaseOutcome::OutOfOrder { expected, found: *sequence });
            }
        }
        let k = appended.len() as u64;
        if k == 0 {
            return Transition::unchanged(RebaseOutcome::Rebased { adopted: 0, moved: 0 });
        }
        if next.0.checked_add(k).is_none() {
            return Transition::unchanged(RebaseOutcome::OutOfOrder { expected: from, found: Sequence(u64::MAX) });
        }
        // Never durable, so never claimed: the tail of pending's fresh part.
        let moved = self.pending.split_fresh(from);
        let count = moved.len();
        for (sequence, payload) in appended {
            self.pending.push_new(sequence, payload);
        }
        let gates = self.gates.split_off(&from);
        self.gates.extend(gates.into_iter().map(|(s, e)| (Sequence(s.0 + k), e)));
        for record in moved {
            self.pending.push_new(Sequence(record.sequence.0 + k), record.payload);
        }
        self.next_sequence = Sequence(next.0 + k);
        j.durable_next = Sequence(from.0 + k);
        j.written_next = j.durable_next;
        Transition::new(
            RebaseOutcome::Rebased { adopted: k as usize, moved: count },
            Changes::NONE.with(Projection::Pending).with(Projection::Durable),
        )
    }

    /// Where the message `sequence` stands (`None`: never enqueued; with a
    /// journal, a sequence not yet taken is `Saving`, since an
    /// application's transaction may have appended it to the store and the
    /// core adopts it later: see [`adopt`](Self::adopt)). A
    /// message does not vanish from this view: once acknowledged it stays
    /// [`MessageStatus::Acknowledged`], and a dead letter whose tombstone
    /// was acknowledged stays [`MessageStatus::Dead`]. O(log n).
    #[must_use]
    pub fn status(&self, sequence: Sequence) -> Option<MessageStatus> {
        if sequence >= self.next_sequence {
            // With a journal the store may hold it already: appended in an
            // application's transaction, not yet adopted.
            return self.journal.is_some().then_some(MessageStatus::Saving);
        }
        if self.acked_through.is_some_and(|a| sequence <= a) {
            return Some(self.skipped_reason(sequence).map_or(MessageStatus::Acknowledged, MessageStatus::Dead));
        }
        if let Some(e) = self.exhausted.get(&sequence) {
            return Some(MessageStatus::Dead(e.reason));
        }
        let (dead, live) = if let Some(p) = self.parked.get(sequence) {
            (p.record.dead, MessageStatus::Retrying)
        } else if let Some(r) = self.inflight.get(sequence) {
            let held = self.received_through.is_some_and(|t| sequence <= t);
            (r.dead, if held { MessageStatus::Received } else { MessageStatus::Sending })
        } else if let Some(dead) = self.pending.dead(sequence) {
            let saving =
                self.gates.contains_key(&sequence) || self.journal.as_ref().is_some_and(|j| sequence >= j.durable_next);
            (dead, if saving { MessageStatus::Saving } else { MessageStatus::Queued })
        } else {
            return None;
        };
        Some(dead.map_or(live, MessageStatus::Dead))
    }

    /// Queues `payload`, like [`enqueue`](Self::enqueue), to go out only
    /// once the application's state it depends on is durable: once
    /// [`release`](Self::release) reaches `after` (at once if it has). It
    /// waits in order: the records after it wait too. With a journal it is
    /// not even written until then, so a crash never leaves a stored record
    /// whose state was lost.
    ///
    /// Changes: pending; durable, with a journal or when it waits.
    pub fn enqueue_after(&mut self, payload: T, after: FlushEpoch) -> Transition<Sequence> {
        let t = self.enqueue(payload);
        let waits = after > self.released;
        if waits {
            self.gates.insert(t.outcome, after);
        }
        Transition::new(t.outcome, t.changes.with_if(Projection::Durable, waits))
    }

    /// The application made its state durable through flush epoch
    /// `through`: records waiting for it or an earlier one go on. Returns
    /// how many were waiting.
    ///
    /// `Unchanged` (0, no change) when `through` is not above what was
    /// released.
    ///
    /// Changes: durable, when it rose.
    pub fn release(&mut self, through: FlushEpoch) -> Transition<usize> {
        if through <= self.released {
            return Transition::unchanged(0);
        }
        self.released = through;
        let before = self.gates.len();
        self.gates.retain(|_, e| *e > through);
        Transition::new(before - self.gates.len(), Changes::NONE.with(Projection::Durable))
    }

    /// Every flush epoch at or below it is released (see
    /// [`release`](Self::release)).
    #[must_use]
    pub const fn released(&self) -> FlushEpoch {
        self.released
    }

    /// How many records wait for a flush epoch.
    #[must_use]
    pub fn gated_len(&self) -> usize {
        self.gates.len()
    }

    /// Notes, for the journal, that the record `sequence` died or came back.
    pub(crate) fn note_dead(&mut self, sequence: Sequence, mark: Option<DeadMark>) {
        if let Some(j) = self.journal.as_deref_mut() {
            j.dead.insert(sequence, mark);
        }
    }

    /// The durability gates on claiming `head`: the generation, then the
    /// record.
    pub(crate) fn durability_refusal<'a>(&self, head: Sequence) -> Option<crate::outcome::ClaimOutcome<'a, T>> {
        let j = self.journal.as_deref()?;
        if j.durable_generation < self.generation {
            return Some(crate::outcome::ClaimOutcome::GenerationUnpersisted { generation: self.generation });
        }
        (head >= j.durable_next).then_some(crate::outcome::ClaimOutcome::Unpersisted { sequence: head })
    }

    /// Enqueue's changes beyond pending: with a journal, the record is not
    /// durable.
    pub(crate) fn enqueue_changes(&self) -> Changes {
        Changes::NONE.with(Projection::Pending).with_if(Projection::Durable, self.journal.is_some())
    }
}
