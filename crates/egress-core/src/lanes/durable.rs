//! Durable lanes: the journal of a [`Lanes`] over a store that keeps each
//! lane as a stream, the global ordinal of every record beside it, and
//! the lanes' generation and next ordinal in a row of their own.
//!
//! Each lane's core keeps its own journal (see [`EgressCore::poll_ready`]);
//! this gathers them into one [`LanesReady`], one transaction for every
//! lane that has something to write, and hands the store what only the
//! `Lanes` know: the ordinals, the generation, and the lanes freed.

use std::collections::BTreeSet;

use super::{Lane, LaneKey, Lanes, LanesPolicy};
use crate::changes::{Changes, Projection};
use crate::completions::Completions;
use crate::core::EgressCore;
use crate::durable::{PersistError, Ready};
use crate::ids::{Epoch, Generation, Ordinal, Sequence};
use crate::outcome::Transition;
use crate::restored::{RestoreError, Restored};

/// The epoch being written: each lane's epoch in it, and the lanes it
/// forgets.
type Writing<K> = (Vec<(K, Epoch)>, Vec<K>);

/// What the `Lanes` know of the store, beside each lane's own journal.
#[derive(Clone, Debug)]
pub(super) struct LanesJournal<K> {
    /// The slots of the lanes that may have something to write: each
    /// transition on a lane puts it here (by slot: no key is copied, so a
    /// key whose `Clone` panics cannot interrupt a transition here), and
    /// [`Lanes::poll_ready`] asks their cores, in key order.
    dirty: BTreeSet<usize>,
    /// Lanes freed since the last `LanesReady`: the store deletes their
    /// streams, so that a lane made again under the key starts again at
    /// sequence 0 (its ordinals go on from the stored counter).
    forget: Vec<K>,
    written_ordinal: Ordinal,
    durable_ordinal: Ordinal,
    written_generation: Generation,
    durable_generation: Generation,
    next_epoch: Epoch,
    /// The epoch being written: each lane's epoch in it, and the lanes it
    /// forgets (given back on a failure).
    writing: Option<(Epoch, Writing<K>)>,
    error: Option<PersistError>,
}

/// Everything a store must write for durable lanes, in one transaction:
/// first the streams of `forget` deleted, then each lane's [`Ready`] as a
/// stream's (its appends with their `ordinals`), then the lanes' row
/// raised to `next_ordinal` and `generation`. Handed out by
/// [`Lanes::poll_ready`]; report it with [`Lanes::persisted`] or
/// [`Lanes::persist_failed`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LanesReady<K> {
    /// Its number: epochs rise by one per `LanesReady`.
    pub epoch: Epoch,
    /// Lanes freed (idle, everything acknowledged): delete their streams
    /// and records before anything else. A key may come again in `lanes`
    /// (made again since): its stream starts again, empty.
    pub forget: Vec<K>,
    /// Each lane with something to write, in key order.
    pub lanes: Vec<LaneReady<K>>,
    /// Raise the stored next ordinal to this (it never falls): a restart
    /// goes on from it, so no ordinal is handed out twice.
    pub next_ordinal: Ordinal,
    /// Store this generation for the lanes before any request under it.
    pub generation: Option<Generation>,
    /// Whether the transaction must reach the disk before it is reported.
    pub must_sync: bool,
}

/// One lane's part of a [`LanesReady`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneReady<K> {
    /// The lane.
    pub lane: K,
    /// What its stream must write; the payloads of its appends are the
    /// lane core's [`unwritten`](EgressCore::unwritten).
    pub ready: Ready,
    /// The ordinal of each record of `ready.appends`, in order.
    pub ordinals: Vec<Ordinal>,
}

/// What [`Lanes::persisted`] and [`Lanes::persist_failed`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LanesPersisted<K> {
    /// Taken: these lanes (key order) heard of it.
    Recorded {
        /// Each lane of the epoch.
        lanes: Vec<K>,
    },
    /// Refused: `epoch` is not the one being written. Nothing changed.
    UnknownEpoch {
        /// The epoch given.
        epoch: Epoch,
    },
}

/// What a store recovered of durable lanes: see [`Lanes::restore`].
#[derive(Clone, Debug, PartialEq)]
pub struct RestoredLanes<K, T> {
    /// The stored generation of the lanes (every lane restores at it).
    pub generation: Generation,
    /// The stored next ordinal: above every stored record's.
    pub next_ordinal: Ordinal,
    /// Each stored lane.
    pub lanes: Vec<RestoredLane<K, T>>,
}

impl<K, T> RestoredLanes<K, T> {
    /// Nothing stored: no lanes, at generation 0.
    #[must_use]
    pub const fn empty() -> Self {
        Self { generation: Generation(0), next_ordinal: Ordinal(0), lanes: Vec::new() }
    }
}

/// One stored lane: its stream, and the ordinal of each of its records.
#[derive(Clone, Debug, PartialEq)]
pub struct RestoredLane<K, T> {
    /// Its key.
    pub lane: K,
    /// Its stream (its `generation` is ignored: the lanes' is used).
    pub restored: Restored<T>,
    /// The ordinal of each of `restored.records`, in order.
    pub ordinals: Vec<Ordinal>,
}

/// Why [`Lanes::restore`] refused what a store recovered. Nothing is
/// restored; the store's contents are left as they are.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LanesRestoreError {
    /// The lane at `index` does not restore as a stream.
    #[error("lane #{index}: {error}")]
    Lane {
        /// Its place in [`RestoredLanes::lanes`].
        index: usize,
        /// Why.
        error: RestoreError,
    },
    /// The lane at `index` has not one ordinal per record.
    #[error("lane #{index} has {ordinals} ordinals for {records} records")]
    OrdinalCount {
        /// Its place in [`RestoredLanes::lanes`].
        index: usize,
        /// Its records.
        records: usize,
        /// Its ordinals.
        ordinals: usize,
    },
    /// An ordinal is not above the one before it in its lane, is not below
    /// the stored next ordinal, or is another lane's too; or the stored
    /// next ordinal is the last one (`u64::MAX`), which no record can take.
    #[error("ordinal {ordinal} is out of order, above the next ordinal, twice, or the last")]
    Ordinal {
        /// The ordinal.
        ordinal: Ordinal,
    },
    /// A key is stored twice.
    #[error("lane #{index} is stored twice")]
    DuplicateLane {
        /// Its second place in [`RestoredLanes::lanes`].
        index: usize,
    },
    /// More lanes are stored than the policy allows.
    #[error("{stored} lanes are stored; the policy allows {limit}")]
    TooManyLanes {
        /// Lanes stored.
        stored: usize,
        /// The policy's [`max_lanes`](LanesPolicy::max_lanes).
        limit: usize,
    },
}

/// Equal when everything the store was told or will be told is: `dirty`
/// is left out, as it only says which lanes' cores to ask (a lane asked
/// with nothing to write answers nothing), so a call that marks a lane
/// and changes nothing else leaves the journal equal.
impl<K: PartialEq> PartialEq for LanesJournal<K> {
    fn eq(&self, other: &Self) -> bool {
        told(self) == told(other)
    }
}

/// What of a journal counts for its equality (everything but `dirty`).
type Told<'a, K> = (
    &'a [K],
    (Ordinal, Ordinal, Generation, Generation, Epoch),
    &'a Option<(Epoch, Writing<K>)>,
    &'a Option<PersistError>,
);

fn told<K>(j: &LanesJournal<K>) -> Told<'_, K> {
    (
        &j.forget,
        (j.written_ordinal, j.durable_ordinal, j.written_generation, j.durable_generation, j.next_epoch),
        &j.writing,
        &j.error,
    )
}

impl<K> LanesJournal<K> {
    const fn new(generation: Generation, next_ordinal: Ordinal) -> Self {
        Self {
            dirty: BTreeSet::new(),
            forget: Vec::new(),
            written_ordinal: next_ordinal,
            durable_ordinal: next_ordinal,
            written_generation: generation,
            durable_generation: generation,
            next_epoch: Epoch(0),
            writing: None,
            error: None,
        }
    }
}

impl<K: LaneKey> LanesJournal<K> {
    /// A transition touched the lane in `slot`.
    pub(super) fn touched(&mut self, slot: usize) {
        self.dirty.insert(slot);
    }

    /// The idle lane `key` was freed from `slot`.
    pub(super) fn freed(&mut self, key: K, slot: usize) {
        self.dirty.remove(&slot);
        self.forget.push(key);
    }

    /// A lane made now starts as stored at the durable generation, and
    /// moves to the current one through its journal.
    pub(super) const fn lane_generation(&self) -> Generation {
        self.durable_generation
    }
}

impl<K: LaneKey, T> Lanes<K, T> {
    /// Durable lanes from what a store recovered (or
    /// [`RestoredLanes::empty`] for a new store): every lane with nothing
    /// in flight and no backoff carried over, each record under its stored
    /// sequence and ordinal, released in ordinal order across lanes.
    ///
    /// Each lane's core then keeps a journal: a record is claimable once
    /// durable, the generation before a claim under it. Gather what must be
    /// written with [`poll_ready`](Self::poll_ready).
    ///
    /// # Errors
    /// [`LanesRestoreError`] for a lane that does not restore, ordinals
    /// that do not name the records in order and once, a key twice, or
    /// more lanes than the policy allows.
    pub fn restore(policy: LanesPolicy, stored: RestoredLanes<K, T>) -> Result<Self, LanesRestoreError> {
        let RestoredLanes { generation, next_ordinal, lanes: restored } = stored;
        if next_ordinal == Ordinal(u64::MAX) {
            // No record could be numbered: refused here, not at an enqueue.
            return Err(LanesRestoreError::Ordinal { ordinal: next_ordinal });
        }
        if restored.len() > policy.max_lanes() {
            return Err(LanesRestoreError::TooManyLanes { stored: restored.len(), limit: policy.max_lanes() });
        }
        let mut all = Vec::new();
        for (index, lane) in restored.iter().enumerate() {
            if lane.ordinals.len() != lane.restored.records.len() {
                return Err(LanesRestoreError::OrdinalCount {
                    index,
                    records: lane.restored.records.len(),
                    ordinals: lane.ordinals.len(),
                });
            }
            let mut last = None;
            for &ordinal in &lane.ordinals {
                if ordinal >= next_ordinal || last.is_some_and(|l| ordinal <= l) {
                    return Err(LanesRestoreError::Ordinal { ordinal });
                }
                last = Some(ordinal);
            }
            all.extend_from_slice(&lane.ordinals);
        }
        all.sort_unstable();
        if let Some(w) = all.windows(2).find(|w| w[0] == w[1]) {
            return Err(LanesRestoreError::Ordinal { ordinal: w[0] });
        }
        let mut lanes = Self::with_generation(policy, generation);
        lanes.next_ordinal = next_ordinal;
        lanes.journal = Some(Box::new(LanesJournal::new(generation, next_ordinal)));
        let mut made = Vec::with_capacity(restored.len());
        for (index, RestoredLane { lane: key, restored, ordinals }) in restored.into_iter().enumerate() {
            let stream = Restored { generation, ..restored };
            let base = Sequence(stream.acked_through.map_or(0, |a| a.0.saturating_add(1)));
            let core = EgressCore::restore(key.kind().policy(*lanes.policy.base()), stream)
                .map_err(|error| LanesRestoreError::Lane { index, error })?;
            if lanes.index.contains_key(&key) {
                return Err(LanesRestoreError::DuplicateLane { index });
            }
            let mut lane = Lane::new(key.clone(), core);
            lane.base = base;
            lane.completions = Completions::starting_at(base.0);
            lane.ordinals = ordinals.into();
            made.push(lanes.insert_lane(key, lane));
        }
        for slot in made {
            let _ = lanes.settle(slot, super::Counts::default());
        }
        lanes.debug_check();
        Ok(lanes)
    }

    /// Whether the lanes keep a journal (made by [`restore`](Self::restore)).
    #[must_use]
    pub fn is_journaled(&self) -> bool {
        self.journal.is_some()
    }

    /// The last failure to persist, until a later epoch is persisted.
    #[must_use]
    pub fn persist_error(&self) -> Option<&PersistError> {
        self.journal.as_ref().and_then(|j| j.error.as_ref())
    }

    /// Whether the current generation is stored (always, without a
    /// journal).
    #[must_use]
    pub fn generation_durable(&self) -> bool {
        self.journal.as_ref().is_none_or(|j| j.durable_generation >= self.generation)
    }

    /// Records enqueued and not yet durable, over every lane.
    #[must_use]
    pub fn unpersisted_len(&self) -> usize {
        if self.journal.is_none() {
            return 0;
        }
        self.slots.iter().flatten().map(|l| l.core.unpersisted_len()).sum()
    }

    /// What the store must write next, if anything: one [`LanesReady`] at
    /// a time. Until it is reported this returns `None`, and what happens
    /// meanwhile goes into the next one (group commit across lanes). A
    /// lane in it is not freed until it is reported.
    ///
    /// Changes nothing observable.
    pub fn poll_ready(&mut self) -> Option<LanesReady<K>> {
        let j = self.journal.as_deref_mut()?;
        if j.writing.is_some() {
            return None;
        }
        let mut lanes = Vec::new();
        let mut epochs = Vec::new();
        // In key order (sorted before the set is emptied: an `Ord` that
        // panics leaves every lane marked).
        let mut dirty: Vec<usize> = j.dirty.iter().copied().filter(|&slot| self.slots[slot].is_some()).collect();
        let slots = &self.slots;
        let key = |slot: usize| slots[slot].as_ref().map(|l| &l.key);
        dirty.sort_by(|&a, &b| key(a).cmp(&key(b)));
        j.dirty.clear();
        for slot in dirty {
            let lane = self.slots[slot].as_mut().expect("a dirty slot holds a lane: filtered above");
            let Some(ready) = lane.core.poll_ready() else { continue };
            let key = lane.key.clone();
            let ordinals = (ready.appends.start.0..ready.appends.end.0)
                .map(|s| lane.ordinal(Sequence(s)).expect("invariant broken: an unwritten record has no ordinal"))
                .collect();
            lane.writing = true;
            if lane.idle {
                // Not freed until its write is reported.
                lane.idle = false;
                self.idle.remove(&key);
            }
            epochs.push((key.clone(), ready.epoch));
            lanes.push(LaneReady { lane: key, ready, ordinals });
        }
        let generation = (self.generation > j.written_generation).then_some(self.generation);
        let forget = std::mem::take(&mut j.forget);
        // The next ordinal alone (records enqueued behind a flush gate,
        // not written) is not worth a write: it goes with the next one.
        if lanes.is_empty() && forget.is_empty() && generation.is_none() {
            return None;
        }
        let epoch = j.next_epoch;
        j.next_epoch = Epoch(epoch.0.wrapping_add(1));
        j.written_ordinal = self.next_ordinal;
        j.written_generation = self.generation;
        j.writing = Some((epoch, (epochs, forget.clone())));
        let must_sync = generation.is_some() || lanes.iter().any(|l| l.ready.must_sync);
        Some(LanesReady { epoch, forget, lanes, next_ordinal: self.next_ordinal, generation, must_sync })
    }

    /// The store wrote epoch `epoch`: each lane of it hears so (its
    /// appends become claimable, in ordinal order with the rest), the
    /// generation may be used, and a failure shown is cleared.
    ///
    /// Refused with `UnknownEpoch` unless `epoch` is the one being written.
    ///
    /// Changes: the union of the lanes' (durable, persist_error); durable
    /// when the generation became durable; persist_error when one was
    /// shown.
    pub fn persisted(&mut self, epoch: Epoch) -> Transition<LanesPersisted<K>> {
        let Some(epochs) = self.take_writing(epoch) else {
            return Transition::unchanged(LanesPersisted::UnknownEpoch { epoch });
        };
        let j = self.journal.as_deref_mut().expect("writing implies a journal");
        let was_durable = j.durable_generation >= self.generation;
        j.durable_ordinal = j.written_ordinal;
        j.durable_generation = j.written_generation;
        let cleared = j.error.take().is_some();
        let mut changes = Changes::NONE
            .with_if(Projection::Durable, was_durable != (j.durable_generation >= self.generation))
            .with_if(Projection::PersistError, cleared);
        let lanes = self.each_written(epochs, false, &mut changes, |core, e| core.persisted(e).changes);
        Transition::new(LanesPersisted::Recorded { lanes }, changes)
    }

    /// The store could not write epoch `epoch` (`reason` is what it said):
    /// nothing of it counts as durable, each lane of it shows the error, and
    /// the next [`poll_ready`](Self::poll_ready) carries it all again.
    ///
    /// Refused with `UnknownEpoch` unless `epoch` is the one being written.
    ///
    /// Changes: persist_error (the lanes' and their union).
    pub fn persist_failed(&mut self, epoch: Epoch, reason: impl Into<String>) -> Transition<LanesPersisted<K>> {
        let reason = reason.into();
        let Some(epochs) = self.take_writing(epoch) else {
            return Transition::unchanged(LanesPersisted::UnknownEpoch { epoch });
        };
        let j = self.journal.as_deref_mut().expect("writing implies a journal");
        j.written_ordinal = j.durable_ordinal;
        j.written_generation = j.durable_generation;
        let error = PersistError { epoch, reason: reason.clone() };
        let mut changes = Changes::NONE.with_if(Projection::PersistError, j.error.as_ref() != Some(&error));
        j.error = Some(error);
        let lanes =
            self.each_written(epochs, true, &mut changes, |core, e| core.persist_failed(e, reason.clone()).changes);
        Transition::new(LanesPersisted::Recorded { lanes }, changes)
    }

    /// Ends the epoch being written, if it is `epoch`: returns each lane's
    /// epoch in it and the lanes it forgot. `None` (nothing changed) for
    /// another epoch.
    fn take_writing(&mut self, epoch: Epoch) -> Option<Writing<K>> {
        let j = self.journal.as_deref_mut()?;
        if j.writing.as_ref().is_none_or(|(e, _)| *e != epoch) {
            return None;
        }
        j.writing.take().map(|(_, writing)| writing)
    }

    /// Reports an ended epoch to each of its lanes with `report`, and
    /// settles them (which marks them to be asked again: a failed lane's
    /// journal carries its contents again). A failed epoch's forgets are
    /// written again, ahead of any since.
    fn each_written(
        &mut self,
        (epochs, forget): Writing<K>,
        failed: bool,
        changes: &mut Changes,
        report: impl Fn(&mut EgressCore<T>, Epoch) -> Changes,
    ) -> Vec<K> {
        let mut lanes = Vec::with_capacity(epochs.len());
        for (key, epoch) in epochs {
            let t = self.on_lane(&key, |l, _| {
                l.writing = false;
                Transition::new((), report(&mut l.core, epoch))
            });
            *changes = changes.union(t.map_or(Changes::NONE, |t| t.changes));
            lanes.push(key);
        }
        if failed && let Some(j) = self.journal.as_deref_mut() {
            let mut again = forget;
            again.append(&mut j.forget);
            j.forget = again;
        }
        lanes
    }
}
