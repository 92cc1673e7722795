//! The journal of a durable [`Latest`]: what a store must write so that a
//! restart resumes each key at its frontier with its newest desire, and
//! what the store reported written. The core decides what to write; the
//! store's relay writes it and reports back.

use std::collections::BTreeSet;
use std::num::NonZeroUsize;

use super::{Latest, LatestRestoreError, RestoredKey};
use crate::durable::PersistError;
use crate::ids::{Epoch, Generation, Version};
use crate::policy::Policy;

/// One key's row, as the store must hold it after an epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LatestWrite<K> {
    /// The key as it is: its newest version not yet applied (the desire,
    /// or the value in flight; read its value with [`Latest::newest`]),
    /// and its frontier. Restored, the newest version is the key's
    /// desire.
    Put {
        /// The key.
        key: K,
        /// Its newest version above the frontier, if any.
        newest: Option<Version>,
        /// The highest version the sink applied, if any.
        durable_through: Option<Version>,
    },
    /// The key was forgotten: its row goes.
    Delete {
        /// The key.
        key: K,
    },
}

/// What the store must write next (see [`Latest::poll_ready`]): the rows
/// of every key that changed since the last epoch, in key order, as one
/// transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatestReady<K> {
    /// Report it with [`Latest::persisted`] or [`Latest::persist_failed`].
    pub epoch: Epoch,
    /// One write per key.
    pub writes: Vec<LatestWrite<K>>,
}

/// What [`Latest::persisted`] and [`Latest::persist_failed`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LatestPersisted<K> {
    /// Taken. After `persisted`: the keys whose desire became claimable
    /// (it is stored now), in key order; after `persist_failed`: none.
    Recorded {
        /// The keys that can be claimed now and could not before.
        claimable: Vec<K>,
    },
    /// Not the epoch being written: nothing changed.
    UnknownEpoch {
        /// The epoch reported.
        epoch: Epoch,
    },
}

/// The keys an epoch writes, each with the newest version it puts (`None`
/// for a key with none, or deleted).
type Written<K> = Vec<(K, Option<Version>)>;

/// The journal's state.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Journal<K> {
    /// The keys whose row differs from what the store holds, or may.
    /// Bounded: at most every key, and the keys forgotten since the last
    /// epoch, each of which was written before it could be forgotten (so
    /// at most `max_keys` of them).
    dirty: BTreeSet<K>,
    /// The epoch being written: each key with the newest version it put.
    writing: Option<(Epoch, Written<K>)>,
    next_epoch: Epoch,
    error: Option<PersistError>,
}

impl<K: Ord + Clone, V: PartialEq> Latest<K, V> {
    /// [`restore`](Self::restore), with a journal: from then on a desire is
    /// claimed only once the store holds it ([`poll_ready`](Self::poll_ready)
    /// says what to write, [`persisted`](Self::persisted) that it was), so
    /// a crash never takes back a value the sink may have seen; the
    /// restored desires are stored already. With no keys, a new durable
    /// projection.
    ///
    /// # Errors
    /// As [`restore`](Self::restore).
    pub fn restore_journaled(
        policy: Policy,
        max_keys: NonZeroUsize,
        generation: Generation,
        keys: Vec<RestoredKey<K, V>>,
    ) -> Result<Self, LatestRestoreError> {
        let mut latest = Self::restore(policy, max_keys, generation, keys)?;
        latest.journal =
            Some(Box::new(Journal { dirty: BTreeSet::new(), writing: None, next_epoch: Epoch(1), error: None }));
        Ok(latest)
    }

    /// Whether it keeps a journal (made by
    /// [`restore_journaled`](Self::restore_journaled)).
    #[must_use]
    pub fn is_journaled(&self) -> bool {
        self.journal.is_some()
    }

    /// The last failure to write, until a later epoch is written.
    #[must_use]
    pub fn persist_error(&self) -> Option<&PersistError> {
        self.journal.as_ref().and_then(|j| j.error.as_ref())
    }

    /// How many keys' rows are not yet written as they are (0 without a
    /// journal).
    #[must_use]
    pub fn unpersisted_len(&self) -> usize {
        self.journal.as_ref().map_or(0, |j| {
            let writing = j.writing.as_ref().map_or(0, |(_, w)| w.iter().filter(|(k, _)| !j.dirty.contains(k)).count());
            j.dirty.len() + writing
        })
    }

    /// The newest version of `key` not yet applied, with its value: the
    /// desire, or else the value in flight. What a [`LatestWrite::Put`]
    /// stores.
    #[must_use]
    pub fn newest(&self, key: &K) -> Option<(Version, &V)> {
        self.keys.get(key)?.newest()
    }

    /// Marks `key`'s row to be written (with a journal).
    pub(super) fn touch(&mut self, key: &K) {
        if let Some(j) = self.journal.as_deref_mut() {
            j.dirty.insert(key.clone());
        }
    }

    /// Whether `key`'s row is not yet written as it is.
    pub(super) fn unwritten(&self, key: &K) -> bool {
        self.journal.as_ref().is_some_and(|j| {
            j.dirty.contains(key) || j.writing.as_ref().is_some_and(|(_, w)| w.iter().any(|(k, _)| k == key))
        })
    }

    /// What the store must write next, if anything: one [`LatestReady`] at
    /// a time. Until it is reported this returns `None`, and what changes
    /// meanwhile goes into the next one (group commit).
    ///
    /// Changes nothing observable.
    pub fn poll_ready(&mut self) -> Option<LatestReady<K>> {
        let j = self.journal.as_deref_mut()?;
        if j.writing.is_some() || j.dirty.is_empty() {
            return None;
        }
        let keys = std::mem::take(&mut j.dirty);
        let epoch = j.next_epoch;
        j.next_epoch = Epoch(epoch.0.wrapping_add(1));
        let mut writes = Vec::with_capacity(keys.len());
        let mut written = Vec::with_capacity(keys.len());
        for key in keys {
            match self.keys.get(&key) {
                Some(slot) => {
                    let newest = slot.newest().map(|(v, _)| v);
                    written.push((key.clone(), newest));
                    writes.push(LatestWrite::Put { key, newest, durable_through: slot.durable_through });
                }
                None => {
                    written.push((key.clone(), None));
                    writes.push(LatestWrite::Delete { key });
                }
            }
        }
        j.writing = Some((epoch, written));
        Some(LatestReady { epoch, writes })
    }

    /// The store wrote `epoch`: each desire it put is stored, and claimable
    /// if nothing else holds its key; a failure shown is cleared.
    ///
    /// Refused with `UnknownEpoch` unless `epoch` is the one being written.
    ///
    /// Changes no key's projections (a desire stays the desire): it may
    /// make keys claimable, which the outcome lists.
    pub fn persisted(&mut self, epoch: Epoch) -> LatestPersisted<K> {
        let Some(written) = self.take_writing(epoch) else { return LatestPersisted::UnknownEpoch { epoch } };
        if let Some(j) = self.journal.as_deref_mut() {
            j.error = None;
        }
        let mut claimable = Vec::new();
        for (key, newest) in written {
            let Some(slot) = self.keys.get_mut(&key) else { continue };
            // A newer desire since is still to be written (its key is
            // dirty again): `stored` is what this epoch put.
            if newest > slot.stored {
                let was = slot.claimable();
                slot.stored = newest;
                if !was && slot.claimable() {
                    self.ready.insert(key.clone());
                    claimable.push(key);
                }
            }
        }
        LatestPersisted::Recorded { claimable }
    }

    /// The store could not write `epoch` (`reason` is what it said):
    /// nothing of it counts as stored, the error is shown, and the next
    /// [`poll_ready`](Self::poll_ready) carries its keys again.
    ///
    /// Refused with `UnknownEpoch` unless `epoch` is the one being written.
    pub fn persist_failed(&mut self, epoch: Epoch, reason: impl Into<String>) -> LatestPersisted<K> {
        let Some(written) = self.take_writing(epoch) else { return LatestPersisted::UnknownEpoch { epoch } };
        if let Some(j) = self.journal.as_deref_mut() {
            j.dirty.extend(written.into_iter().map(|(k, _)| k));
            j.error = Some(PersistError { epoch, reason: reason.into() });
        }
        LatestPersisted::Recorded { claimable: Vec::new() }
    }

    /// Ends the epoch being written, if it is `epoch`.
    fn take_writing(&mut self, epoch: Epoch) -> Option<Written<K>> {
        let j = self.journal.as_deref_mut()?;
        if j.writing.as_ref().is_none_or(|(e, _)| *e != epoch) {
            return None;
        }
        j.writing.take().map(|(_, written)| written)
    }
}
