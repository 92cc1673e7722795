//! [`Latest`]: the latest-value durable projection. Per key, the obligation
//! is to bring a sink to the newest desired value, not to deliver every
//! value on the way: a slider, a cursor, a presence state, a setting.

mod journal;
mod outcome;

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroUsize;

use self::journal::Journal;
pub use self::journal::{LatestPersisted, LatestReady, LatestWrite};
pub use self::outcome::{
    Applied, Failed, ForgetRefused, KeyChanges, KeyProjection, KeyTransition, LatestClaim, LatestEnvelope,
    LatestReconnect, LatestRestoreError, TooManyKeys, Upserted,
};
use crate::ids::{Delay, Generation, Time, Version};
use crate::policy::Policy;
use crate::retry::{JitterSample, backoff};

/// The latest-value durable projection: per key a desired
/// `(version, value)`, at most one value in flight to the sink, and the
/// highest version the sink applied (`durable_through`). Pure: no I/O, no
/// clock (time and jitter come in as arguments), no threads.
///
/// ```
/// use egress_core::{Applied, Generation, Latest, LatestClaim, Policy, Upserted, Version};
///
/// let mut latest = Latest::new(Policy::default(), 16.try_into()?);
/// let g = latest.generation();
/// // A slider moved three times before the sink was free: only the
/// // newest goes.
/// for (v, value) in [(1, 10), (2, 20), (3, 30)] {
///     latest.upsert("volume", Version(v), value).outcome.expect("room for the key");
/// }
/// let LatestClaim::Claimed(e) = latest.claim(g, &"volume").outcome else { unreachable!() };
/// assert_eq!((e.version, *e.value), (Version(3), 30));
/// // One flight per key: a newer value waits for it.
/// assert!(matches!(latest.upsert("volume", Version(4), 40).outcome, Ok(Upserted::Accepted { .. })));
/// assert!(matches!(latest.claim(g, &"volume").outcome, LatestClaim::Busy { .. }));
/// let applied = latest.ack_applied(g, &"volume", Version(3)).outcome;
/// assert_eq!(applied, Applied::Advanced { durable_through: Version(3) });
/// assert_eq!(latest.desired(&"volume"), Some((Version(4), &40)), "the newer desire stays");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # The rules
/// - **Newer wins.** [`upsert`](Self::upsert) of a version above every
///   version of the key (desired, in flight, applied) becomes the desire;
///   an older or applied version is refused as such, and nothing changes.
///   The same version again is a no-op with the same value and a conflict
///   with another (refused: the first value stays).
/// - **One flight per key.** [`claim`](Self::claim) moves the desire into
///   flight; while a value is in flight, the key is busy even when a newer
///   desire waits. Keys are independent of each other.
/// - **Only the exact flight moves the frontier.**
///   [`ack_applied`](Self::ack_applied) of the flight's generation and
///   version raises `durable_through` to that version and frees the key;
///   it never clears a newer desire. A report of another generation or
///   version changes nothing.
/// - **A failure keeps the desire and waits.**
///   [`fail_retryable`](Self::fail_retryable) puts the value back as the
///   desire (unless a newer one exists, which goes instead) and holds the
///   key for a backoff (the [`Policy`]'s retry schedule: `retry_base`
///   doubling per failure in a row, up to `retry_ceiling`, spread by
///   `jitter`, at least a hint the sink gave, and at least one tick), so
///   that a failing sink is not retried in a spin. [`handle_timeout`](Self::handle_timeout) at
///   [`poll_timeout`](Self::poll_timeout) frees the key again; an applied
///   value resets the count.
/// - **One generation fences the sink.** [`reconnect`](Self::reconnect)
///   to a higher generation puts every flight back as the desire (unless
///   superseded); reports of the old generation are refused from then on.
/// - **Bounded keys.** At most `max_keys` keys exist: an upsert of a new
///   key beyond them is refused ([`TooManyKeys`], the value back). A key
///   stays (its frontier refuses old versions) until
///   [`forget`](Self::forget) drops it, once it has no desire and no
///   flight.
///
/// Every transition on a key returns its outcome and exactly the
/// projections of that key it changed ([`KeyChanges`]).
///
/// A key's `Ord` and `Clone` and a value's `PartialEq` must not panic: as
/// in the standard library's ordered collections, a panic in them during a
/// transition leaves the projection in a state that is memory-safe but
/// otherwise unspecified (the key map and its indexes may disagree). The
/// cells catch such a panic, show what the state then holds, and let it go
/// on to the caller.
#[derive(Clone, Debug, PartialEq)]
pub struct Latest<K, V> {
    policy: Policy,
    max_keys: NonZeroUsize,
    generation: Generation,
    keys: BTreeMap<K, Slot<V>>,
    /// The keys that can be claimed now: a desire, no flight, no backoff.
    ready: BTreeSet<K>,
    /// The keys waiting after a failure, by when.
    due: BTreeSet<(Time, K)>,
    /// How many keys have a desire, and how many a flight: the counts a
    /// shell reads after every transition, kept rather than counted.
    desired_len: usize,
    inflight_len: usize,
    /// With a store: what it must write, and what it wrote (`journal.rs`).
    journal: Option<Box<Journal<K>>>,
}

/// One key's state.
#[derive(Clone, Debug, PartialEq)]
struct Slot<V> {
    desired: Option<(Version, V)>,
    inflight: Option<Flight<V>>,
    durable_through: Option<Version>,
    /// Failures in a row (reset by an applied value).
    failures: u32,
    /// Until when it waits after a failure.
    backoff: Option<Time>,
    /// The newest version of its desire the store holds (without a
    /// journal, every desire's, at once): a desire is claimed only once
    /// stored, so a crash never takes back a value the sink may have seen.
    stored: Option<Version>,
}

#[derive(Clone, Debug, PartialEq)]
struct Flight<V> {
    generation: Generation,
    version: Version,
    value: V,
}

impl<V> Slot<V> {
    const fn empty() -> Self {
        Self { desired: None, inflight: None, durable_through: None, failures: 0, backoff: None, stored: None }
    }

    /// The newest version of the key, desired or in flight.
    fn newest(&self) -> Option<(Version, &V)> {
        match (&self.desired, &self.inflight) {
            (Some((v, value)), _) => Some((*v, value)),
            (None, Some(f)) => Some((f.version, &f.value)),
            (None, None) => None,
        }
    }

    fn claimable(&self) -> bool {
        let stored = match &self.desired {
            Some((version, _)) => self.stored.is_some_and(|s| s >= *version),
            None => false,
        };
        stored && self.inflight.is_none() && self.backoff.is_none()
    }
}

/// One key as a store kept it, for [`Latest::restore`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoredKey<K, V> {
    /// The key.
    pub key: K,
    /// Its desire, if one was not yet applied.
    pub desired: Option<(Version, V)>,
    /// The highest version the sink applied, if any.
    pub durable_through: Option<Version>,
}

impl<K: Ord + Clone, V: PartialEq> Latest<K, V> {
    /// No keys, at generation 0; `policy`'s retry schedule paces a failing
    /// key; at most `max_keys` keys.
    #[must_use]
    pub const fn new(policy: Policy, max_keys: NonZeroUsize) -> Self {
        Self {
            policy,
            max_keys,
            generation: Generation(0),
            keys: BTreeMap::new(),
            ready: BTreeSet::new(),
            due: BTreeSet::new(),
            desired_len: 0,
            inflight_len: 0,
            journal: None,
        }
    }

    /// No keys, at `generation` (a producer that restarts without a store
    /// picks one above any its sink saw).
    #[must_use]
    pub const fn with_generation(policy: Policy, max_keys: NonZeroUsize, generation: Generation) -> Self {
        let mut latest = Self::new(policy, max_keys);
        latest.generation = generation;
        latest
    }

    /// The keys a store kept, at `generation` (a restart's: above every
    /// generation the sink saw, so that no report of the process before
    /// counts): each with its desire and frontier, nothing in flight, no
    /// backoff.
    ///
    /// # Errors
    /// [`LatestRestoreError`]: more keys than allowed, a key twice, or a
    /// desire at or below its frontier. Nothing is restored then.
    pub fn restore(
        policy: Policy,
        max_keys: NonZeroUsize,
        generation: Generation,
        keys: Vec<RestoredKey<K, V>>,
    ) -> Result<Self, LatestRestoreError> {
        if keys.len() > max_keys.get() {
            return Err(LatestRestoreError::TooManyKeys { found: keys.len(), limit: max_keys.get() });
        }
        let mut latest = Self::with_generation(policy, max_keys, generation);
        for (index, stored) in keys.into_iter().enumerate() {
            if let (Some((desired, _)), Some(durable_through)) = (&stored.desired, stored.durable_through)
                && *desired <= durable_through
            {
                return Err(LatestRestoreError::DesireNotAboveFrontier { index, desired: *desired, durable_through });
            }
            if latest.keys.contains_key(&stored.key) {
                return Err(LatestRestoreError::DuplicateKey { index });
            }
            let version = stored.desired.as_ref().map(|(v, _)| *v);
            let slot = Slot {
                desired: stored.desired,
                durable_through: stored.durable_through,
                stored: version,
                ..Slot::empty()
            };
            latest.desired_len += usize::from(slot.desired.is_some());
            if slot.claimable() {
                latest.ready.insert(stored.key.clone());
            }
            latest.keys.insert(stored.key, slot);
        }
        Ok(latest)
    }

    // ----- getters -------------------------------------------------------

    /// The generation reports must carry.
    #[must_use]
    pub const fn generation(&self) -> Generation {
        self.generation
    }

    /// The policy (its retry schedule paces failing keys).
    #[must_use]
    pub const fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The most keys it holds.
    #[must_use]
    pub const fn max_keys(&self) -> NonZeroUsize {
        self.max_keys
    }

    /// How many keys exist.
    #[must_use]
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no key exists.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Every key, in order.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &K> + '_ {
        self.keys.keys()
    }

    /// The keys that can be claimed now, in order.
    pub fn claimable(&self) -> impl ExactSizeIterator<Item = &K> + '_ {
        self.ready.iter()
    }

    /// The desire of `key` not yet claimed.
    #[must_use]
    pub fn desired(&self, key: &K) -> Option<(Version, &V)> {
        self.keys.get(key)?.desired.as_ref().map(|(v, value)| (*v, value))
    }

    /// The value of `key` in flight: its generation, version and value.
    #[must_use]
    pub fn inflight(&self, key: &K) -> Option<(Generation, Version, &V)> {
        self.keys.get(key)?.inflight.as_ref().map(|f| (f.generation, f.version, &f.value))
    }

    /// The highest version of `key` the sink applied.
    #[must_use]
    pub fn durable_through(&self, key: &K) -> Option<Version> {
        self.keys.get(key)?.durable_through
    }

    /// Until when `key` waits after a failure.
    #[must_use]
    pub fn backoff(&self, key: &K) -> Option<Time> {
        self.keys.get(key)?.backoff
    }

    /// Whether every key's sink holds its newest value: no desire, no
    /// flight.
    #[must_use]
    pub const fn is_settled(&self) -> bool {
        self.desired_len == 0 && self.inflight_len == 0
    }

    /// How many keys have a desire not yet claimed (O(1)).
    #[must_use]
    pub const fn desired_len(&self) -> usize {
        self.desired_len
    }

    /// How many keys have a value in flight (O(1)).
    #[must_use]
    pub const fn inflight_len(&self) -> usize {
        self.inflight_len
    }

    /// How many keys wait after a failure (O(1)).
    #[must_use]
    pub fn waiting_len(&self) -> usize {
        self.due.len()
    }

    /// How many keys can be claimed now (O(1)).
    #[must_use]
    pub fn claimable_len(&self) -> usize {
        self.ready.len()
    }

    /// The earliest time a key waiting after a failure may be claimed:
    /// call [`handle_timeout`](Self::handle_timeout) then.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        self.due.first().map(|(t, _)| *t)
    }

    // ----- transitions ---------------------------------------------------

    /// Desires `value` at `version` for `key` (see the rules: newer wins).
    ///
    /// Refused with [`TooManyKeys`] (the value back, nothing changed) for a
    /// new key when `max_keys` keys exist.
    ///
    /// Changes: the key's desire, when accepted.
    pub fn upsert(&mut self, key: K, version: Version, value: V) -> KeyTransition<Result<Upserted, TooManyKeys<V>>> {
        // One walk of the tree for a key that exists: the common case.
        let Some(slot) = self.keys.get_mut(&key) else {
            if self.keys.len() >= self.max_keys.get() {
                return KeyTransition::unchanged(Err(TooManyKeys { limit: self.max_keys.get(), value }));
            }
            let stored = if self.journal.is_some() { None } else { Some(version) };
            let slot = Slot { desired: Some((version, value)), stored, ..Slot::empty() };
            let claimable = slot.claimable();
            // The map first, the indexes and counts after it (see the
            // rules on a key's `Ord`).
            self.keys.insert(key.clone(), slot);
            self.desired_len += 1;
            if claimable {
                self.ready.insert(key.clone());
            }
            self.touch(&key);
            let changes = KeyChanges::NONE.with(KeyProjection::Desired);
            return KeyTransition::new(Ok(Upserted::Accepted { replaced: None }), changes);
        };
        if let Some(durable_through) = slot.durable_through.filter(|d| version <= *d) {
            return KeyTransition::unchanged(Ok(Upserted::AlreadyDurable { durable_through }));
        }
        match slot.newest() {
            Some((current, _)) if version < current => {
                return KeyTransition::unchanged(Ok(Upserted::StaleVersion { current }));
            }
            Some((current, same)) if version == current => {
                let outcome = if *same == value { Upserted::Unchanged } else { Upserted::VersionConflict { version } };
                return KeyTransition::unchanged(Ok(outcome));
            }
            _ => {}
        }
        let was = slot.claimable();
        let replaced = slot.desired.replace((version, value)).map(|(v, _)| v);
        self.desired_len += usize::from(replaced.is_none());
        if self.journal.is_none() {
            slot.stored = Some(version);
        }
        // Claimable as it was, but for a first desire (which may make it
        // so) or one not yet stored (which unmakes it, until written).
        match (was, slot.claimable()) {
            (false, true) => {
                self.ready.insert(key.clone());
            }
            (true, false) => {
                self.ready.remove(&key);
            }
            _ => {}
        }
        self.touch(&key);
        KeyTransition::new(Ok(Upserted::Accepted { replaced }), KeyChanges::NONE.with(KeyProjection::Desired))
    }

    /// Moves the desire of `key` into flight, under `generation` (which
    /// must be the current one): one flight per key.
    ///
    /// Changes: the key's desire and flight, when claimed.
    pub fn claim(&mut self, generation: Generation, key: &K) -> KeyTransition<LatestClaim<'_, K, V>> {
        if generation != self.generation {
            return KeyTransition::unchanged(LatestClaim::StaleGeneration { current: self.generation });
        }
        let Some(slot) = self.keys.get(key) else { return KeyTransition::unchanged(LatestClaim::Empty) };
        if let Some(f) = &slot.inflight {
            return KeyTransition::unchanged(LatestClaim::Busy { inflight: f.version });
        }
        if slot.desired.is_none() {
            return KeyTransition::unchanged(LatestClaim::Empty);
        }
        if let Some(until) = slot.backoff {
            return KeyTransition::unchanged(LatestClaim::Backoff { until });
        }
        if !slot.claimable() {
            return KeyTransition::unchanged(LatestClaim::Unwritten);
        }
        let generation = self.generation;
        let slot = self.keys.get_mut(key).expect("the key exists: read above");
        let (version, value) = slot.desired.take().expect("a desire: checked above");
        slot.inflight = Some(Flight { generation, version, value });
        self.desired_len -= 1;
        self.inflight_len += 1;
        self.ready.remove(key);
        let (key, slot) = self.keys.get_key_value(key).expect("the key exists: read above");
        let flight = slot.inflight.as_ref().expect("in flight: just set");
        let envelope = LatestEnvelope { key, version, generation, value: &flight.value };
        let changes = KeyChanges::NONE.with(KeyProjection::Desired).with(KeyProjection::Inflight);
        KeyTransition::new(LatestClaim::Claimed(envelope), changes)
    }

    /// Claims the first key (in key order) that can be claimed now, if
    /// any: [`claim`](Self::claim) of it.
    pub fn claim_next(&mut self, generation: Generation) -> Option<KeyTransition<LatestClaim<'_, K, V>>> {
        if generation != self.generation {
            return Some(KeyTransition::unchanged(LatestClaim::StaleGeneration { current: self.generation }));
        }
        let key = self.ready.first()?.clone();
        Some(self.claim(generation, &key))
    }

    /// The sink applied the flight of `key` at `version`, claimed under
    /// `generation`: the frontier rises to it and the key is free again; a
    /// newer desire stays.
    ///
    /// Changes: the key's flight and frontier, when it advanced (and its
    /// backoff never: a key in flight has none).
    pub fn ack_applied(&mut self, generation: Generation, key: &K, version: Version) -> KeyTransition<Applied> {
        if generation != self.generation {
            return KeyTransition::unchanged(Applied::StaleGeneration { current: self.generation });
        }
        let Some(slot) = self.keys.get_mut(key) else {
            return KeyTransition::unchanged(Applied::UnknownVersion { version });
        };
        match &slot.inflight {
            // Every flight is of the current generation (a reconnect takes
            // them all back), which `generation` is: the version names it.
            Some(f) if f.version == version => {
                // A flight is always above the frontier (an upsert at or
                // below it is refused), so the frontier moves to it.
                slot.inflight = None;
                self.inflight_len -= 1;
                slot.failures = 0;
                slot.durable_through = Some(version);
                if slot.claimable() {
                    self.ready.insert(key.clone());
                }
                self.touch(key);
                let changes = KeyChanges::NONE.with(KeyProjection::Inflight).with(KeyProjection::DurableThrough);
                KeyTransition::new(Applied::Advanced { durable_through: version }, changes)
            }
            _ if slot.durable_through.is_some_and(|d| version <= d) => KeyTransition::unchanged(Applied::Unchanged),
            _ => KeyTransition::unchanged(Applied::UnknownVersion { version }),
        }
    }

    /// Writing the flight of `key` at `version`, claimed under
    /// `generation`, failed at `now` in a way worth retrying: the value is
    /// the desire again (unless a newer one exists, which replaces it) and
    /// the key waits for the backoff of its failures in a row (at least
    /// `hint`, the sink's own "retry after", which is not capped here: a
    /// sink effect bounds what a peer may ask, as the HTTP sender's
    /// `max_retry_after` does), spread by `jitter`.
    ///
    /// Changes: the key's flight and backoff, and its desire when the
    /// value went back to it.
    pub fn fail_retryable(
        &mut self,
        generation: Generation,
        key: &K,
        version: Version,
        now: Time,
        hint: Option<Delay>,
        jitter: JitterSample,
    ) -> KeyTransition<Failed> {
        if generation != self.generation {
            return KeyTransition::unchanged(Failed::StaleGeneration { current: self.generation });
        }
        let Some(slot) = self.keys.get_mut(key) else {
            return KeyTransition::unchanged(Failed::UnknownVersion { version });
        };
        // As in `ack_applied`: the version names the flight.
        if slot.inflight.as_ref().is_none_or(|f| f.version != version) {
            return KeyTransition::unchanged(Failed::UnknownVersion { version });
        }
        let flight = slot.inflight.take().expect("in flight: checked above");
        self.inflight_len -= 1;
        slot.failures = slot.failures.saturating_add(1);
        // At least one tick: a latest value has no retry budget, so a
        // policy with no base would retry a failing key in the same
        // instant without end.
        let wait = Delay(backoff(&self.policy, slot.failures, hint, jitter).0.max(1));
        let retry_at = now.saturating_add(wait);
        slot.backoff = Some(retry_at);
        self.due.insert((retry_at, key.clone()));
        let mut changes = KeyChanges::NONE.with(KeyProjection::Inflight).with(KeyProjection::Backoff);
        let outcome = if slot.desired.is_some() {
            Failed::Superseded { retry_at }
        } else {
            slot.desired = Some((flight.version, flight.value));
            self.desired_len += 1;
            changes = changes.with(KeyProjection::Desired);
            Failed::Pending { retry_at }
        };
        KeyTransition::new(outcome, changes)
    }

    /// Frees every key whose backoff ends at or before `now`, and returns
    /// them in key order, each with what changed (its backoff).
    pub fn handle_timeout(&mut self, now: Time) -> Vec<(K, KeyChanges)> {
        let mut freed = Vec::new();
        while let Some((due, key)) = self.due.first().cloned() {
            if due > now {
                break;
            }
            self.due.pop_first();
            let slot = self.keys.get_mut(&key).expect("invariant broken: a key in the timer index does not exist");
            slot.backoff = None;
            if slot.claimable() {
                self.ready.insert(key.clone());
            }
            freed.push((key, KeyChanges::NONE.with(KeyProjection::Backoff)));
        }
        freed.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
        freed
    }

    /// Fences the sink at `generation`: every flight goes back as its
    /// key's desire (unless a newer desire exists, which stays instead),
    /// and reports under an older generation are refused from now on.
    /// Frontiers and backoffs stay.
    ///
    /// `Unchanged` at the current generation; refused with
    /// `StaleGeneration` below it.
    pub fn reconnect(&mut self, generation: Generation) -> LatestReconnect<K> {
        if generation < self.generation {
            return LatestReconnect::StaleGeneration { current: self.generation };
        }
        if generation == self.generation {
            return LatestReconnect::Unchanged;
        }
        self.generation = generation;
        let (mut requeued, mut superseded, mut keys) = (0, 0, Vec::new());
        for (key, slot) in &mut self.keys {
            let Some(flight) = slot.inflight.take() else { continue };
            let mut changes = KeyChanges::NONE.with(KeyProjection::Inflight);
            if slot.desired.is_some() {
                superseded += 1;
            } else {
                slot.desired = Some((flight.version, flight.value));
                changes = changes.with(KeyProjection::Desired);
                requeued += 1;
            }
            if slot.claimable() {
                self.ready.insert(key.clone());
            }
            keys.push((key.clone(), changes));
        }
        self.inflight_len -= requeued + superseded;
        self.desired_len += requeued;
        LatestReconnect::Advanced { generation, requeued, superseded, keys }
    }

    /// Drops `key`, which has no desire and no flight: its frontier and
    /// backoff go with it, so a later upsert of any version of it is
    /// accepted. Returns its frontier.
    ///
    /// # Errors
    /// [`ForgetRefused`]: no such key, or it has a desire or a flight.
    pub fn forget(&mut self, key: &K) -> Result<Option<Version>, ForgetRefused> {
        let slot = self.keys.get(key).ok_or(ForgetRefused::Unknown)?;
        if slot.desired.is_some() || slot.inflight.is_some() {
            return Err(ForgetRefused::Busy);
        }
        if self.unwritten(key) {
            return Err(ForgetRefused::Unwritten);
        }
        if let Some(at) = slot.backoff {
            self.due.remove(&(at, key.clone()));
        }
        self.touch(key);
        Ok(self.keys.remove(key).and_then(|s| s.durable_through))
    }
}
