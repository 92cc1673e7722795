//! The latest-value durable projection (`Latest`): each rule of its docs
//! as a test, and random schedules of every transition checked against
//! the laws (exact change sets, key isolation, a monotone frontier, one
//! flight per key, the claim taking the newest desire, stale reports as
//! no-ops, convergence to the newest value).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::num::NonZeroUsize;

use egress_core::{
    Applied, Delay, Failed, ForgetRefused, Generation, JitterSample, KeyChanges, KeyProjection, Latest, LatestClaim,
    LatestReconnect, LatestRestoreError, Policy, RestoredKey, Time, TooManyKeys, Upserted, Version,
};
use proptest::prelude::*;

fn latest(max_keys: usize) -> Latest<u8, u32> {
    let policy = Policy::builder().retry_base(Delay(100)).retry_ceiling(Delay(1_000)).jitter(0.5).build().unwrap();
    Latest::new(policy, NonZeroUsize::new(max_keys).unwrap())
}

const G0: Generation = Generation(0);

fn claimed(l: &mut Latest<u8, u32>, key: u8) -> (Version, u32) {
    match l.claim(l.generation(), &key).outcome {
        LatestClaim::Claimed(e) => (e.version, *e.value),
        other => panic!("expected a claim, got {other:?}"),
    }
}

#[test]
fn a_newer_version_wins_and_older_or_applied_ones_change_nothing() {
    let mut l = latest(4);
    let t = l.upsert(1, Version(5), 50);
    assert_eq!(t.outcome, Ok(Upserted::Accepted { replaced: None }));
    assert_eq!(t.changes, KeyChanges::NONE.with(KeyProjection::Desired));
    let t = l.upsert(1, Version(7), 70);
    assert_eq!(
        (t.outcome, t.changes.contains(KeyProjection::Desired)),
        (Ok(Upserted::Accepted { replaced: Some(Version(5)) }), true)
    );
    for (version, value, outcome) in [
        (6, 60, Upserted::StaleVersion { current: Version(7) }),
        (7, 70, Upserted::Unchanged),
        (7, 71, Upserted::VersionConflict { version: Version(7) }),
    ] {
        let t = l.upsert(1, Version(version), value);
        assert_eq!((t.outcome, t.changes), (Ok(outcome), KeyChanges::NONE), "v{version} = {value}");
    }
    assert_eq!(l.desired(&1), Some((Version(7), &70)), "the first value of a version stays");
    // In flight, the version counts as the key's newest.
    assert_eq!(claimed(&mut l, 1), (Version(7), 70));
    assert_eq!(l.upsert(1, Version(7), 71).outcome, Ok(Upserted::VersionConflict { version: Version(7) }));
    assert_eq!(l.upsert(1, Version(6), 1).outcome, Ok(Upserted::StaleVersion { current: Version(7) }));
    let _ = l.ack_applied(G0, &1, Version(7));
    for v in [3, 7] {
        let t = l.upsert(1, Version(v), 1);
        assert_eq!(
            (t.outcome, t.changes),
            (Ok(Upserted::AlreadyDurable { durable_through: Version(7) }), KeyChanges::NONE)
        );
    }
    assert!(l.is_settled());
}

#[test]
fn one_flight_per_key_and_a_newer_desire_waits_for_it_and_survives_its_ack() {
    let mut l = latest(4);
    let _ = l.upsert(1, Version(1), 10);
    let _ = l.upsert(2, Version(1), 20);
    let t = l.claim(G0, &1);
    assert_eq!(t.changes, KeyChanges::NONE.with(KeyProjection::Desired).with(KeyProjection::Inflight));
    assert!(matches!(t.outcome, LatestClaim::Claimed(e) if e.generation == G0 && *e.key == 1));
    let _ = l.upsert(1, Version(2), 11);
    let t = l.claim(G0, &1);
    assert_eq!((t.outcome, t.changes), (LatestClaim::Busy { inflight: Version(1) }, KeyChanges::NONE));
    // Keys are independent: key 2 goes while key 1 is busy.
    assert_eq!(claimed(&mut l, 2), (Version(1), 20));
    let t = l.ack_applied(G0, &1, Version(1));
    assert_eq!(t.outcome, Applied::Advanced { durable_through: Version(1) });
    assert_eq!(t.changes, KeyChanges::NONE.with(KeyProjection::Inflight).with(KeyProjection::DurableThrough));
    assert_eq!(l.desired(&1), Some((Version(2), &11)), "the ack never clears a newer desire");
    assert_eq!(l.claimable().copied().collect::<Vec<_>>(), [1]);
    assert_eq!(claimed(&mut l, 1), (Version(2), 11), "the claim takes the newest desire");
    // Duplicates and strangers change nothing.
    let t = l.ack_applied(G0, &1, Version(1));
    assert_eq!((t.outcome, t.changes), (Applied::Unchanged, KeyChanges::NONE));
    assert_eq!(l.ack_applied(G0, &1, Version(9)).outcome, Applied::UnknownVersion { version: Version(9) });
    assert_eq!(l.ack_applied(G0, &3, Version(1)).outcome, Applied::UnknownVersion { version: Version(1) });
    assert_eq!(l.claim(G0, &3).outcome, LatestClaim::Empty);
    assert_eq!(l.claim(G0, &2).outcome, LatestClaim::Busy { inflight: Version(1) });
}

#[test]
fn a_failure_keeps_the_desire_and_the_key_waits_its_backoff_without_a_spin() {
    let mut l = latest(4);
    let _ = l.upsert(1, Version(1), 10);
    let _ = claimed(&mut l, 1);
    // Backoffs double from 100 (jitter 0.5 at sample 0: none) up to 1,000.
    let t = l.fail_retryable(G0, &1, Version(1), Time(1_000), None, JitterSample::ZERO);
    assert_eq!(t.outcome, Failed::Pending { retry_at: Time(1_100) });
    let all = KeyChanges::NONE.with(KeyProjection::Desired).with(KeyProjection::Inflight).with(KeyProjection::Backoff);
    assert_eq!(t.changes, all);
    assert_eq!(l.desired(&1), Some((Version(1), &10)));
    assert_eq!(l.claim(G0, &1).outcome, LatestClaim::Backoff { until: Time(1_100) });
    assert!(l.claim_next(G0).is_none(), "nothing claimable while it waits");
    assert_eq!(l.poll_timeout(), Some(Time(1_100)));
    assert!(l.handle_timeout(Time(1_099)).is_empty());
    assert_eq!(l.handle_timeout(Time(1_100)), [(1, KeyChanges::NONE.with(KeyProjection::Backoff))]);
    let _ = claimed(&mut l, 1);
    let second = l.fail_retryable(G0, &1, Version(1), Time(2_000), None, JitterSample::ZERO).outcome;
    assert_eq!(second, Failed::Pending { retry_at: Time(2_200) }, "the second failure in a row waits twice as long");
    let _ = l.handle_timeout(Time(2_200));
    // A newer desire while in flight: the failed value is dropped for it.
    let _ = claimed(&mut l, 1);
    let _ = l.upsert(1, Version(2), 20);
    let hint = Some(Delay(5_000));
    let t = l.fail_retryable(G0, &1, Version(1), Time(3_000), hint, JitterSample::new(1.0).unwrap());
    assert_eq!(t.outcome, Failed::Superseded { retry_at: Time(10_500) }, "at least the hint, spread by the jitter");
    assert!(!t.changes.contains(KeyProjection::Desired));
    assert_eq!(l.desired(&1), Some((Version(2), &20)));
    let _ = l.handle_timeout(Time(10_500));
    assert_eq!(claimed(&mut l, 1), (Version(2), 20));
    let _ = l.ack_applied(G0, &1, Version(2));
    // An applied value resets the count: the next failure waits the base.
    let _ = l.upsert(1, Version(3), 30);
    let _ = claimed(&mut l, 1);
    let t = l.fail_retryable(G0, &1, Version(3), Time(20_000), None, JitterSample::ZERO);
    assert_eq!(t.outcome, Failed::Pending { retry_at: Time(20_100) });
    // Reports that are not the flight's change nothing.
    let t = l.fail_retryable(G0, &1, Version(3), Time(0), None, JitterSample::ZERO);
    assert_eq!((t.outcome, t.changes), (Failed::UnknownVersion { version: Version(3) }, KeyChanges::NONE));
    let t = l.fail_retryable(G0, &9, Version(3), Time(0), None, JitterSample::ZERO);
    assert_eq!(t.outcome, Failed::UnknownVersion { version: Version(3) });
}

#[test]
fn a_policy_with_no_base_still_waits_a_tick_between_tries() {
    let policy = Policy::builder().retry_base(Delay(0)).retry_ceiling(Delay(0)).build().unwrap();
    let mut l: Latest<u8, u32> = Latest::new(policy, NonZeroUsize::new(2).unwrap());
    let _ = l.upsert(1, Version(1), 10);
    for now in [5, 6, 7] {
        let _ = claimed(&mut l, 1);
        let t = l.fail_retryable(G0, &1, Version(1), Time(now), None, JitterSample::ZERO);
        assert_eq!(t.outcome, Failed::Pending { retry_at: Time(now + 1) }, "no retry in the same instant");
        assert!(l.handle_timeout(Time(now)).is_empty());
        assert_eq!(l.handle_timeout(Time(now + 1)).len(), 1);
    }
}

#[test]
fn a_reconnect_requeues_unsuperseded_flights_and_fences_the_old_generation() {
    let mut l = latest(4);
    for key in [1, 2, 3] {
        let _ = l.upsert(key, Version(1), u32::from(key));
    }
    let _ = claimed(&mut l, 1);
    let _ = claimed(&mut l, 2);
    let _ = l.upsert(2, Version(2), 22);
    let g1 = Generation(1);
    let r = l.reconnect(g1);
    let inflight = KeyChanges::NONE.with(KeyProjection::Inflight);
    assert_eq!(
        r,
        LatestReconnect::Advanced {
            generation: g1,
            requeued: 1,
            superseded: 1,
            keys: vec![(1, inflight.with(KeyProjection::Desired)), (2, inflight)]
        }
    );
    assert_eq!(l.desired(&1), Some((Version(1), &1)));
    assert_eq!(l.desired(&2), Some((Version(2), &22)));
    // The old generation's reports are refused; nothing moves.
    assert_eq!(l.ack_applied(G0, &1, Version(1)).outcome, Applied::StaleGeneration { current: g1 });
    let stale = l.fail_retryable(G0, &1, Version(1), Time(0), None, JitterSample::ZERO).outcome;
    assert_eq!(stale, Failed::StaleGeneration { current: g1 });
    assert_eq!(l.claim(G0, &1).outcome, LatestClaim::StaleGeneration { current: g1 });
    assert!(matches!(l.claim_next(G0).unwrap().outcome, LatestClaim::StaleGeneration { .. }));
    assert_eq!(l.durable_through(&1), None);
    assert_eq!(
        (l.reconnect(g1), l.reconnect(G0)),
        (LatestReconnect::Unchanged, LatestReconnect::StaleGeneration { current: g1 })
    );
    // Every key is claimable again, under the new generation.
    assert_eq!(l.claimable().copied().collect::<Vec<_>>(), [1, 2, 3]);
    let LatestClaim::Claimed(e) = l.claim_next(g1).unwrap().outcome else { panic!("claimable") };
    assert_eq!((*e.key, e.generation), (1, g1));
}

#[test]
fn keys_are_bounded_and_a_settled_key_can_be_forgotten() {
    let mut l = latest(2);
    let _ = l.upsert(1, Version(1), 10);
    let _ = l.upsert(2, Version(1), 20);
    let t = l.upsert(3, Version(1), 30);
    assert_eq!(t.outcome, Err(TooManyKeys { limit: 2, value: 30 }));
    assert_eq!(t.changes, KeyChanges::NONE);
    let refused = t.outcome.unwrap_err();
    assert_eq!(
        (format!("{refused:?}"), refused.to_string()),
        ("TooManyKeys { limit: 2, .. }".into(), "refused: 2 keys exist, the most the projection holds".into())
    );
    assert_eq!(l.forget(&1), Err(ForgetRefused::Busy));
    assert_eq!(l.forget(&3), Err(ForgetRefused::Unknown));
    let _ = claimed(&mut l, 1);
    assert_eq!(l.forget(&1), Err(ForgetRefused::Busy), "in flight");
    let _ = l.ack_applied(G0, &1, Version(1));
    assert_eq!(l.forget(&1), Ok(Some(Version(1))));
    assert_eq!(l.len(), 1);
    assert!(l.upsert(3, Version(1), 30).outcome.is_ok(), "room again");
}

#[test]
fn a_restore_resumes_each_key_at_its_frontier_and_refuses_what_breaks_the_rules() {
    let policy = Policy::default();
    let two = NonZeroUsize::new(2).unwrap();
    let key = |key: u8, desired: Option<u64>, durable: Option<u64>| RestoredKey {
        key,
        desired: desired.map(|v| (Version(v), u32::from(key))),
        durable_through: durable.map(Version),
    };
    let mut l =
        Latest::restore(policy, two, Generation(3), vec![key(1, Some(5), Some(4)), key(2, None, Some(9))]).unwrap();
    assert_eq!(l.generation(), Generation(3));
    assert_eq!(l.claimable().copied().collect::<Vec<_>>(), [1]);
    assert_eq!((l.desired_len(), l.inflight_len(), l.is_settled()), (1, 0, false), "the restored desire counts");
    assert_eq!(l.upsert(2, Version(9), 0).outcome, Ok(Upserted::AlreadyDurable { durable_through: Version(9) }));
    assert_eq!(claimed(&mut l, 1), (Version(5), 1));
    let refusals = [
        (
            vec![key(1, None, None), key(2, None, None), key(3, None, None)],
            LatestRestoreError::TooManyKeys { found: 3, limit: 2 },
        ),
        (vec![key(1, None, None), key(1, None, None)], LatestRestoreError::DuplicateKey { index: 1 }),
        (
            vec![key(1, Some(4), Some(4))],
            LatestRestoreError::DesireNotAboveFrontier { index: 0, desired: Version(4), durable_through: Version(4) },
        ),
    ];
    for (keys, error) in refusals {
        assert_eq!(Latest::restore(policy, two, Generation(0), keys), Err(error.clone()), "{error}");
    }
}

#[test]
fn changes_and_getters_say_what_they_hold() {
    let changes = KeyChanges::NONE.with(KeyProjection::Backoff).union(KeyChanges::NONE.with(KeyProjection::Desired));
    assert_eq!(format!("{changes:?}"), "{Desired, Backoff}");
    assert_eq!(changes.iter().collect::<Vec<_>>(), [KeyProjection::Desired, KeyProjection::Backoff]);
    assert!(!changes.is_empty() && KeyChanges::NONE.is_empty());
    assert_eq!(KeyChanges::NONE.with_if(KeyProjection::Inflight, false), KeyChanges::NONE);
    // Adding what is there already keeps it.
    assert_eq!(changes.with(KeyProjection::Desired), changes);
    assert_eq!(changes.union(changes), changes);
    let mut l = latest(3);
    assert!(l.is_empty() && l.is_settled());
    assert_eq!((l.max_keys().get(), l.policy().retry_base()), (3, Delay(100)));
    let _ = l.upsert(2, Version(1), 1);
    let _ = l.upsert(1, Version(1), 1);
    assert_eq!((l.len(), l.is_empty(), l.is_settled()), (2, false, false));
    assert_eq!(l.keys().copied().collect::<Vec<_>>(), [1, 2]);
    let _ = claimed(&mut l, 1);
    assert_eq!(l.inflight(&1), Some((G0, Version(1), &1)));
    assert_eq!((l.desired(&1), l.backoff(&1), l.durable_through(&1)), (None, None, None));
}

// ----- random schedules against the laws -----------------------------------

#[derive(Clone, Debug)]
enum Op {
    Upsert(u8, u64, u32),
    Claim(u8),
    ClaimNext,
    /// Ack the key's flight (or, with `stale`, a report of another
    /// generation or version).
    Ack(u8, bool),
    Fail(u8, bool, u64),
    Timeout(u64),
    Reconnect,
    Forget(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..4;
    prop_oneof![
        4 => (key.clone(), 0u64..12, 0u32..3).prop_map(|(k, v, x)| Op::Upsert(k, v, x)),
        2 => key.clone().prop_map(Op::Claim),
        2 => Just(Op::ClaimNext),
        3 => (key.clone(), any::<bool>()).prop_map(|(k, s)| Op::Ack(k, s)),
        2 => (key.clone(), any::<bool>(), 0u64..500).prop_map(|(k, s, h)| Op::Fail(k, s, h)),
        2 => (0u64..3_000).prop_map(Op::Timeout),
        1 => Just(Op::Reconnect),
        1 => key.prop_map(Op::Forget),
    ]
}

/// What a reader of one key shows.
type View = (Option<(Version, u32)>, Option<(Generation, Version, u32)>, Option<Version>, Option<Time>);

fn view(l: &Latest<u8, u32>, key: u8) -> View {
    (
        l.desired(&key).map(|(v, x)| (v, *x)),
        l.inflight(&key).map(|(g, v, x)| (g, v, *x)),
        l.durable_through(&key),
        l.backoff(&key),
    )
}

/// Exactly the projections that differ between two views.
fn diff(a: &View, b: &View) -> KeyChanges {
    KeyChanges::NONE
        .with_if(KeyProjection::Desired, a.0 != b.0)
        .with_if(KeyProjection::Inflight, a.1 != b.1)
        .with_if(KeyProjection::DurableThrough, a.2 != b.2)
        .with_if(KeyProjection::Backoff, a.3 != b.3)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_schedule_keeps_the_laws(ops in prop::collection::vec(op(), 1..80)) {
        let mut l = latest(3);
        let mut now = 0u64;
        // The newest version each key accepted: what it must converge to.
        let mut newest: BTreeMap<u8, (Version, u32)> = BTreeMap::new();
        for op in ops {
            let keys: Vec<u8> = (0..4).collect();
            let before: Vec<View> = keys.iter().map(|k| view(&l, *k)).collect();
            let generation = l.generation();
            // The key a one-key transition touched, with its reported changes.
            let mut touched: Vec<(u8, KeyChanges)> = Vec::new();
            match op {
                Op::Upsert(k, v, x) => {
                    let t = l.upsert(k, Version(v), x);
                    if let Ok(Upserted::Accepted { .. }) = t.outcome {
                        prop_assert!(newest.get(&k).is_none_or(|(n, _)| *n < Version(v)), "newer wins only");
                        newest.insert(k, (Version(v), x));
                    }
                    touched.push((k, t.changes));
                }
                Op::Claim(k) => {
                    let desire = l.desired(&k).map(|(v, x)| (v, *x));
                    let t = l.claim(generation, &k);
                    let changes = t.changes;
                    if let LatestClaim::Claimed(e) = t.outcome {
                        prop_assert_eq!(Some((e.version, *e.value)), desire, "the claim takes the desire");
                        prop_assert_eq!(before[usize::from(k)].1, None, "one flight per key");
                    }
                    touched.push((k, changes));
                }
                Op::ClaimNext => {
                    let first = l.claimable().next().copied();
                    let t = l.claim_next(generation);
                    prop_assert_eq!(t.is_some(), first.is_some());
                    if let (Some(t), Some(k)) = (t, first) {
                        prop_assert!(matches!(t.outcome, LatestClaim::Claimed(_)), "a claimable key claims");
                        touched.push((k, t.changes));
                    }
                }
                Op::Ack(k, stale) => {
                    let flight = l.inflight(&k).map(|(g, v, _)| (g, v));
                    let (g, v) = match (flight, stale) {
                        (Some((g, v)), false) => (g, v),
                        (Some((g, v)), true) => (Generation(g.0 + 1), v),
                        (None, _) => (generation, Version(3)),
                    };
                    // Another version of a key in flight is never its
                    // flight: refused, nothing changed.
                    if let Some((fg, fv)) = flight.filter(|_| !stale) {
                        let other = l.ack_applied(fg, &k, Version(fv.0 + 1));
                        prop_assert_eq!(other.changes, KeyChanges::NONE);
                        prop_assert!(matches!(other.outcome, Applied::UnknownVersion { .. }), "{:?}", other.outcome);
                    }
                    let t = l.ack_applied(g, &k, v);
                    if stale && flight.is_some() {
                        prop_assert!(t.changes.is_empty(), "a stale generation's report is a no-op");
                    }
                    touched.push((k, t.changes));
                }
                Op::Fail(k, stale, hint) => {
                    let flight = l.inflight(&k).map(|(g, v, _)| (g, v));
                    let v = match (flight, stale) {
                        (Some((_, v)), false) => v,
                        (Some((_, v)), true) => Version(v.0 + 1),
                        (None, _) => Version(1),
                    };
                    let t = l.fail_retryable(generation, &k, v, Time(now), Some(Delay(hint)), JitterSample::ZERO);
                    if stale && flight.is_some() {
                        prop_assert!(matches!(t.outcome, Failed::UnknownVersion { .. }), "{:?}", t.outcome);
                    }
                    if let Failed::Pending { retry_at } | Failed::Superseded { retry_at } = t.outcome {
                        prop_assert!(retry_at.0 >= now + hint.max(1), "never sooner than the hint or the base");
                        prop_assert!(l.desired(&k).is_some(), "a failure keeps a desire");
                    }
                    touched.push((k, t.changes));
                }
                Op::Timeout(dt) => {
                    now += dt;
                    touched = l.handle_timeout(Time(now));
                }
                Op::Reconnect => {
                    let next = Generation(generation.0 + 1);
                    match l.reconnect(next) {
                        LatestReconnect::Advanced { keys, .. } => touched = keys,
                        other => prop_assert!(false, "{other:?}"),
                    }
                    for k in &keys {
                        prop_assert_eq!(l.inflight(k), None, "nothing in flight after a reconnect");
                    }
                }
                Op::Forget(k) => {
                    if l.forget(&k).is_ok() {
                        newest.remove(&k);
                        prop_assert_eq!(view(&l, k), (None, None, None, None));
                    } else {
                        prop_assert_eq!(view(&l, k), before[usize::from(k)], "a refused forget changes nothing");
                    }
                    continue;
                }
            }
            // Exact changes, and nothing of another key moved.
            for k in &keys {
                let after = view(&l, *k);
                let reported = touched.iter().find(|(t, _)| t == k).map_or(KeyChanges::NONE, |(_, c)| *c);
                prop_assert_eq!(reported, diff(&before[usize::from(*k)], &after), "key {}", k);
                prop_assert!(after.2 >= before[usize::from(*k)].2, "the frontier never falls");
                if let (Some((d, _)), Some(f)) = (after.0, after.2) {
                    prop_assert!(d > f, "a desire is above the frontier");
                }
                prop_assert!(!(after.1.is_some() && after.3.is_some()), "no backoff while in flight");
                let claimable = after.0.is_some() && after.1.is_none() && after.3.is_none();
                prop_assert_eq!(l.claimable().any(|c| c == k), claimable);
            }
            // The kept counts are the counts.
            let views: Vec<View> = keys.iter().map(|k| view(&l, *k)).collect();
            prop_assert_eq!(l.desired_len(), views.iter().filter(|v| v.0.is_some()).count());
            prop_assert_eq!(l.inflight_len(), views.iter().filter(|v| v.1.is_some()).count());
            prop_assert_eq!(l.waiting_len(), views.iter().filter(|v| v.3.is_some()).count());
            prop_assert_eq!(l.claimable_len(), l.claimable().count());
            prop_assert_eq!(l.is_settled(), views.iter().all(|v| v.0.is_none() && v.1.is_none()));
        }
        // Convergence: a sink that now always succeeds brings every key to
        // its newest accepted value.
        let _ = l.reconnect(Generation(l.generation().0 + 1));
        let _ = l.handle_timeout(Time(u64::MAX));
        let g = l.generation();
        for _ in 0..16 {
            let Some(t) = l.claim_next(g) else { break };
            let LatestClaim::Claimed(e) = t.outcome else { unreachable!("claimable") };
            let (k, v) = (*e.key, e.version);
            let _ = l.ack_applied(g, &k, v);
        }
        prop_assert!(l.is_settled());
        for (k, (v, _)) in newest {
            prop_assert_eq!(l.durable_through(&k), Some(v), "key {} reached its newest", k);
        }
    }
}
