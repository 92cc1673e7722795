//! The lease keeper: one task per store renews every lease its journals
//! hold, all in one statement, well before each runs out; it tells each
//! journal (and a dispatcher gated on it) until when its lease surely
//! holds, and says a lease that lapsed while its worker lived apart from a
//! stream taken over.
//!
//! The bound it publishes is this process's: the instant the last
//! acknowledged renewal (or the take) was *sent*, plus the lease's
//! duration. The database starts the duration no earlier than it executes
//! the statement, so no other worker can take the stream before the bound,
//! whatever the renewal's round trip was and whatever the two clocks read.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::leases::Renewal;
use super::store::Shared;
use super::{Lease, MAX_LEASE, MIN_LEASE, PgStore};
use crate::StoreError;

/// A lease a journal holds ([`PgJournal`](super::PgJournal)'s,
/// [`PgLanes`](super::PgLanes)'s, [`PgLatest`](super::PgLatest)'s):
/// renewed by its store's keeper from its take until it is released or
/// dropped, and fenced (a renewal refused) once another worker took it.
#[cfg(feature = "relay")]
#[derive(Debug)]
pub(super) struct Held {
    pub(super) store: PgStore,
    pub(super) lease: Lease,
    until: watch::Receiver<Option<Instant>>,
}

#[cfg(feature = "relay")]
impl Drop for Held {
    fn drop(&mut self) {
        self.store.shared.keeper.unregister(&self.lease);
    }
}

#[cfg(feature = "relay")]
impl Held {
    /// `lease` of `store`, taken for `duration` (and renewed for it from
    /// now on, for at least [`MIN_LEASE`]).
    pub(super) fn new(store: PgStore, lease: Lease, duration: Duration) -> Self {
        let until = store.shared.keeper.register(&lease, duration);
        Held { store, lease, until }
    }

    /// Until when the lease surely holds (`None` once it was taken over).
    pub(super) fn until(&self) -> watch::Receiver<Option<Instant>> {
        self.until.clone()
    }

    /// Whether the lease is still held, without a round trip:
    /// [`StoreError::Closed`] once the store's connection failed,
    /// [`StoreError::Fenced`] once another worker took the lease.
    pub(super) fn holds(&self) -> Result<(), StoreError> {
        if self.store.is_closed() {
            return Err(StoreError::Closed);
        }
        if self.until.borrow().is_none() {
            return Err(StoreError::Fenced { stream: self.lease.stream.clone() });
        }
        Ok(())
    }

    /// Stops renewing the lease and gives it up.
    ///
    /// # Errors
    /// [`PgStore::release`]'s.
    pub(super) async fn release(&self) -> Result<(), StoreError> {
        self.store.shared.keeper.unregister(&self.lease);
        self.store.release(&self.lease).await
    }
}

/// How far into its lease a renewal is sent (at the latest, less the last
/// renewal's round trip): a third, so that two more attempts fit before
/// the lease can run out.
const RENEW_AT: u32 = 3;

/// The shortest wait between renewals of one lease: a tenth of it (a
/// round trip longer than a third of the lease leaves this much).
const RENEW_AT_LEAST: u32 = 10;

/// A renewal whose round trip takes more than this part of the lease is
/// reported (the lease is too short for what the connection does now).
const SLOW_PART: u32 = 6;

/// When a renewal failed, the next attempt comes after this part of the
/// lease (at least [`RETRY_MIN`]).
const RETRY_PART: u32 = 20;
const RETRY_MIN: Duration = Duration::from_millis(10);

/// The wait before `lease`'s next renewal, from the last one's sending,
/// given its round trip.
pub(super) fn renew_after(lease: Duration, round_trip: Duration) -> Duration {
    (lease / RENEW_AT).saturating_sub(round_trip).max(lease / RENEW_AT_LEAST)
}

/// One lease the keeper renews.
struct Kept {
    lease: Lease,
    duration: Duration,
    /// When to send its next renewal.
    renew_at: Instant,
    /// Until when no other worker can take it (see the module's docs).
    until: Instant,
    /// `until` passed with no renewal acknowledged (reported once).
    lapsed: bool,
    /// A renewal's round trip was above a [`SLOW_PART`] of the lease
    /// (reported once, until one is fast again).
    slow: bool,
    tx: watch::Sender<Option<Instant>>,
}

/// What a store's lease keeper has seen, counted from the store's
/// connection ([`PgStore::lease_stats`]): the same events as its logs and
/// its `egress_lease_*` metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseStats {
    /// Leases extended.
    pub renewed: u64,
    /// Renewals of a lease whose row another session held: skipped, tried
    /// again soon.
    pub busy: u64,
    /// Renewal statements that failed (each lease in them tried again
    /// soon).
    pub failed: u64,
    /// Leases whose bound passed with no renewal acknowledged, while this
    /// store lived (each lapse once).
    pub lapsed: u64,
    /// Leases lost to another store after they had lapsed: the lease ran
    /// out while this worker lived (renewals did not get through in time).
    pub lost_after_lapse: u64,
    /// Leases lost to another store while their bound still ran: the table
    /// changed by hand, or the database's clock jumped.
    pub lost_while_valid: u64,
    /// Renewals whose round trip took more than a sixth of the lease
    /// (counted when one does after faster ones: the lease is too short
    /// for what the connection does now).
    pub slow: u64,
}

/// The leases a store's keeper renews, shared by the store and the task.
#[derive(Default)]
pub(super) struct Keeper {
    leases: Mutex<HashMap<String, Kept>>,
    wake: Notify,
    stats: Mutex<LeaseStats>,
}

impl Keeper {
    /// Starts renewing `lease` (taken for `duration`); returns its bound, as
    /// it moves: `Some(until)` while this store holds it, `None` once
    /// another store took it.
    #[cfg_attr(not(feature = "relay"), allow(dead_code))]
    pub(super) fn register(&self, lease: &Lease, duration: Duration) -> watch::Receiver<Option<Instant>> {
        // The take's own duration holds until the first renewal (as the
        // database took it); every renewal is for at least the floor.
        let taken = duration.min(MAX_LEASE);
        let duration = duration.clamp(MIN_LEASE, MAX_LEASE);
        let until = lease.sent + taken;
        let (tx, rx) = watch::channel(Some(until));
        let kept = Kept {
            lease: lease.clone(),
            duration,
            renew_at: lease.sent + renew_after(taken, Duration::ZERO),
            until,
            lapsed: false,
            slow: false,
            tx,
        };
        self.leases.lock().insert(lease.stream.clone(), kept);
        self.wake.notify_one();
        rx
    }

    /// Stops renewing `lease` (its journal is gone, or released it).
    #[cfg_attr(not(feature = "relay"), allow(dead_code))]
    pub(super) fn unregister(&self, lease: &Lease) {
        let mut leases = self.leases.lock();
        if leases.get(&lease.stream).is_some_and(|k| k.lease.number == lease.number) {
            leases.remove(&lease.stream);
        }
    }

    /// What it has seen so far.
    pub(super) fn stats(&self) -> LeaseStats {
        *self.stats.lock()
    }

    /// The next instant the keeper has something to do.
    fn next(&self) -> Option<Instant> {
        let leases = self.leases.lock();
        leases.values().map(|k| if k.lapsed { k.renew_at } else { k.renew_at.min(k.until) }).min()
    }

    /// Reports each lease whose bound passed without a renewal, once; and
    /// returns the leases due for renewal by `now` (with those due within
    /// a tenth of their lease, so that renewals go together).
    fn due(&self, now: Instant) -> Vec<(Lease, Duration)> {
        let mut leases = self.leases.lock();
        for k in leases.values_mut() {
            if !k.lapsed && k.until <= now {
                k.lapsed = true;
                self.stats.lock().lapsed += 1;
                tracing::error!(
                    stream = %k.lease.stream,
                    lease_ms = k.duration.as_millis() as u64,
                    "egress lease: this worker's lease ran out while it lives (no renewal got through in time): \
                     it starts nothing more on the stream until a renewal does, and another worker may take it"
                );
                tracing::event!(
                    target: "egress::metrics",
                    tracing::Level::DEBUG,
                    monotonic_counter.egress_lease_lapsed = 1u64,
                    "egress lease: lapsed"
                );
            }
        }
        leases
            .values()
            .filter(|k| k.renew_at <= now + k.duration / RENEW_AT_LEAST)
            .map(|k| (k.lease.clone(), k.duration))
            .collect()
    }

    /// Takes in what the renewal of `due`, sent at `sent`, came back with
    /// (what became of each lease, or the statement's error) at `now`.
    fn renewed(
        &self,
        due: &[(Lease, Duration)],
        sent: Instant,
        now: Instant,
        result: Result<Vec<(String, Renewal)>, StoreError>,
    ) {
        let round_trip = now.saturating_duration_since(sent);
        let mut leases = self.leases.lock();
        let mut stats = self.stats.lock();
        let renewals: HashMap<String, Renewal> = match result {
            Ok(renewals) => renewals.into_iter().collect(),
            Err(e) => {
                tracing::warn!(error = %e, "egress lease: a renewal failed; trying again");
                stats.failed += 1;
                HashMap::new()
            }
        };
        for (lease, duration) in due {
            let Some(k) = leases.get_mut(&lease.stream).filter(|k| k.lease.number == lease.number) else {
                continue;
            };
            match renewals.get(&lease.stream) {
                Some(Renewal::Renewed) => {
                    if k.lapsed {
                        tracing::warn!(stream = %lease.stream, "egress lease: a lapsed lease was renewed before another worker took it");
                    }
                    stats.renewed += 1;
                    let slow = round_trip > k.duration / SLOW_PART;
                    if slow && !k.slow {
                        stats.slow += 1;
                        tracing::warn!(
                            stream = %lease.stream,
                            round_trip_ms = round_trip.as_millis() as u64,
                            lease_ms = k.duration.as_millis() as u64,
                            "egress lease: a renewal's round trip took more than a sixth of the lease: lengthen the \
                             lease"
                        );
                    }
                    (k.slow, k.lapsed) = (slow, false);
                    k.until = sent + k.duration;
                    k.renew_at = sent + renew_after(k.duration, round_trip);
                    k.tx.send_replace(Some(k.until));
                }
                Some(Renewal::Lost) => {
                    let expired = sent >= k.until;
                    if expired {
                        stats.lost_after_lapse += 1;
                    } else {
                        stats.lost_while_valid += 1;
                    }
                    tracing::error!(
                        stream = %lease.stream,
                        expired_while_alive = expired,
                        "{}",
                        if expired {
                            "egress lease: another worker took the stream after this worker's lease ran out while it \
                             lived: lengthen the lease, or find what kept the renewals from getting through"
                        } else {
                            "egress lease: another worker took the stream while this worker's lease still ran (the \
                             table changed by hand, or the database's clock jumped)"
                        }
                    );
                    tracing::event!(
                        target: "egress::metrics",
                        tracing::Level::DEBUG,
                        monotonic_counter.egress_lease_lost = 1u64,
                        expired_while_alive = expired,
                        "egress lease: lost"
                    );
                    k.tx.send_replace(None);
                    leases.remove(&lease.stream);
                }
                // Its row held by another session, or the statement failed:
                // soon again.
                Some(Renewal::Busy) | None => {
                    if renewals.get(&lease.stream) == Some(&Renewal::Busy) {
                        stats.busy += 1;
                    }
                    k.renew_at = now + (*duration / RETRY_PART).max(RETRY_MIN);
                }
            }
        }
    }
}

/// The keeper's task: sleeps until a renewal is due or a bound passes,
/// then renews every lease due in one statement. Ends with the store.
pub(super) async fn run(keeper: Arc<Keeper>, shared: Weak<Shared>) {
    loop {
        let next = keeper.next();
        tokio::select! {
            () = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {}
            () = keeper.wake.notified() => {}
        }
        let due = keeper.due(Instant::now());
        if due.is_empty() {
            continue;
        }
        let Some(shared) = shared.upgrade() else { return };
        let store = PgStore { shared };
        let sent = Instant::now();
        let leases: Vec<(&Lease, Duration)> = due.iter().map(|(l, d)| (l, *d)).collect();
        let result = store.renew_many(&leases).await;
        drop(store);
        keeper.renewed(&due, sent, Instant::now(), result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(stream: &str, number: u64, sent: Instant) -> Lease {
        Lease { stream: stream.into(), number, sent }
    }

    #[test]
    fn a_renewal_comes_a_third_into_the_lease_less_its_round_trip_and_never_sooner_than_a_tenth() {
        let second = Duration::from_secs(3);
        assert_eq!(renew_after(second, Duration::ZERO), Duration::from_secs(1));
        assert_eq!(renew_after(second, Duration::from_millis(400)), Duration::from_millis(600));
        assert_eq!(renew_after(second, Duration::from_secs(5)), Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn the_bound_moves_with_each_renewal_from_its_sending_and_a_refusal_ends_it() {
        let keeper = Keeper::default();
        let t0 = Instant::now();
        let rx = keeper.register(&lease("s", 1, t0), Duration::from_secs(3));
        assert_eq!(*rx.borrow(), Some(t0 + Duration::from_secs(3)), "the take's sending plus the lease");
        assert_eq!(keeper.next(), Some(t0 + Duration::from_secs(1)));
        assert!(keeper.due(t0 + Duration::from_millis(600)).is_empty(), "not yet due");
        let due = keeper.due(t0 + Duration::from_millis(800));
        assert_eq!(due.len(), 1, "due within a tenth of the lease");
        // Sent at 0.8 s, back at 1.3 s: the bound is 0.8 s + 3 s, the next
        // renewal a third of the lease less the round trip after the sending.
        let sent = t0 + Duration::from_millis(800);
        keeper.renewed(&due, sent, sent + Duration::from_millis(500), Ok(vec![("s".into(), Renewal::Renewed)]));
        assert_eq!(*rx.borrow(), Some(sent + Duration::from_secs(3)));
        assert_eq!(keeper.stats(), LeaseStats { renewed: 1, ..LeaseStats::default() }, "500 ms of 3 s: not slow");
        assert_eq!(keeper.next(), Some(sent + Duration::from_millis(500)));
        // A failed renewal leaves the bound and tries again soon.
        let due = keeper.due(sent + Duration::from_millis(500));
        let failed = sent + Duration::from_millis(600);
        keeper.renewed(&due, sent + Duration::from_millis(500), failed, Err(StoreError::Closed));
        assert_eq!(*rx.borrow(), Some(sent + Duration::from_secs(3)));
        assert_eq!(keeper.next(), Some(failed + Duration::from_millis(150)));
        assert_eq!((keeper.stats().failed, keeper.stats().busy), (1, 0));
        // Its row held by another session: the bound stays, and soon again.
        let due = keeper.due(failed + Duration::from_millis(150));
        let busy = failed + Duration::from_millis(160);
        keeper.renewed(&due, busy, busy, Ok(vec![("s".into(), Renewal::Busy)]));
        assert_eq!(*rx.borrow(), Some(sent + Duration::from_secs(3)));
        assert_eq!(keeper.next(), Some(busy + Duration::from_millis(150)));
        assert_eq!(keeper.stats().busy, 1);
        // Refused: taken over. The bound is gone and nothing is renewed.
        let due = keeper.due(busy + Duration::from_millis(150));
        keeper.renewed(&due, busy, busy, Ok(vec![("s".into(), Renewal::Lost)]));
        assert_eq!(*rx.borrow(), None);
        assert_eq!(keeper.next(), None);
        let stats = keeper.stats();
        assert_eq!((stats.lost_while_valid, stats.lost_after_lapse, stats.lapsed), (1, 0, 0), "its bound still ran");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lapsed_lease_keeps_its_past_bound_until_a_renewal_gets_through() {
        let keeper = Keeper::default();
        let t0 = Instant::now();
        let rx = keeper.register(&lease("s", 7, t0), Duration::from_secs(1));
        let late = t0 + Duration::from_millis(1500);
        let due = keeper.due(late);
        assert!(keeper.leases.lock()["s"].lapsed, "its bound passed");
        assert_eq!(*rx.borrow(), Some(t0 + Duration::from_secs(1)), "the bound stays where it was, in the past");
        assert_eq!(keeper.next(), Some(t0 + Duration::from_secs(1) / 3), "the overdue renewal, not the bound");
        keeper.renewed(&due, late, late, Ok(vec![("s".into(), Renewal::Renewed)]));
        assert!(!keeper.leases.lock()["s"].lapsed);
        assert_eq!(*rx.borrow(), Some(late + Duration::from_secs(1)));
        assert_eq!(keeper.stats(), LeaseStats { renewed: 1, lapsed: 1, ..LeaseStats::default() });
        // Lapsed again, and this time taken: lost after the lapse.
        let later = late + Duration::from_secs(2);
        let due = keeper.due(later);
        keeper.renewed(&due, later, later, Ok(vec![("s".into(), Renewal::Lost)]));
        let stats = keeper.stats();
        assert_eq!((stats.lapsed, stats.lost_after_lapse, stats.lost_while_valid), (2, 1, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_renewal_is_counted_once_until_one_is_fast_again() {
        let keeper = Keeper::default();
        let t0 = Instant::now();
        let _rx = keeper.register(&lease("s", 1, t0), Duration::from_secs(6));
        let mut at = t0;
        // Round trips of 1 s and more are above a sixth of 6 s; exactly
        // 1 s is not.
        for (millis, slow) in [(1_000, 0), (1_001, 1), (2_000, 1), (100, 1), (1_500, 2)] {
            let due = keeper.due(at + Duration::from_secs(6));
            keeper.renewed(&due, at, at + Duration::from_millis(millis), Ok(vec![("s".into(), Renewal::Renewed)]));
            assert_eq!(keeper.stats().slow, slow, "after a round trip of {millis} ms");
            at += Duration::from_secs(2);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_of_any_length_is_kept_as_the_database_takes_it_and_never_below_the_floor() {
        let keeper = Keeper::default();
        let t0 = Instant::now();
        // Taken for nothing: due at once, then renewed for the floor.
        let short = keeper.register(&lease("short", 1, t0), Duration::ZERO);
        assert_eq!(*short.borrow(), Some(t0));
        let due = keeper.due(t0);
        assert_eq!(due.len(), 1);
        keeper.renewed(&due, t0, t0, Ok(vec![("short".into(), Renewal::Renewed)]));
        assert_eq!(*short.borrow(), Some(t0 + MIN_LEASE));
        keeper.unregister(&lease("short", 1, t0));
        let rx = keeper.register(&lease("s", 1, t0), Duration::MAX);
        assert_eq!(*rx.borrow(), Some(t0 + MAX_LEASE));
        let due = keeper.due(t0 + MAX_LEASE / 3);
        keeper.renewed(&due, t0 + MAX_LEASE / 3, t0 + MAX_LEASE / 3, Ok(vec![("s".into(), Renewal::Renewed)]));
        assert_eq!(*rx.borrow(), Some(t0 + MAX_LEASE / 3 + MAX_LEASE));
    }

    #[tokio::test(start_paused = true)]
    async fn another_lease_number_is_neither_renewed_nor_unregistered() {
        let keeper = Keeper::default();
        let t0 = Instant::now();
        let old = lease("s", 1, t0);
        let _rx = keeper.register(&lease("s", 2, t0), Duration::from_secs(1));
        keeper.unregister(&old);
        assert_eq!(keeper.leases.lock().len(), 1, "the newer lease stays");
        keeper.renewed(&[(old.clone(), Duration::from_secs(1))], t0, t0, Ok(vec![("s".into(), Renewal::Lost)]));
        assert_eq!(keeper.leases.lock().len(), 1, "a refusal of the old number leaves the new one");
        keeper.unregister(&lease("s", 2, t0));
        assert!(keeper.leases.lock().is_empty());
    }
}
