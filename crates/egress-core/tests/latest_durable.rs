//! The journal of a durable `Latest`: a desire is claimed only once the
//! store holds it, each epoch writes the rows of the keys that changed, a
//! failed write is carried again, and, under crashes at any point of random
//! schedules, a restart from what the store holds never takes back a value
//! the sink may have seen and resumes each key at its stored frontier.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::num::NonZeroUsize;

use egress_core::{
    Applied, Delay, Epoch, ForgetRefused, Generation, JitterSample, Latest, LatestClaim, LatestPersisted, LatestReady,
    LatestWrite, Policy, RestoredKey, Time, Upserted, Version,
};
use proptest::prelude::*;

fn policy() -> Policy {
    Policy::builder().retry_base(Delay(100)).retry_ceiling(Delay(1_000)).build().unwrap()
}

fn durable(keys: Vec<RestoredKey<u8, u32>>) -> Latest<u8, u32> {
    Latest::restore_journaled(policy(), NonZeroUsize::new(4).unwrap(), Generation(1), keys).unwrap()
}

const G: Generation = Generation(1);

fn put(key: u8, newest: Option<u64>, durable_through: Option<u64>) -> LatestWrite<u8> {
    LatestWrite::Put { key, newest: newest.map(Version), durable_through: durable_through.map(Version) }
}

#[test]
fn a_desire_is_claimed_only_once_the_store_holds_it() {
    let mut l = durable(Vec::new());
    assert!(l.is_journaled());
    assert_eq!(l.upsert(1, Version(1), 10).outcome, Ok(Upserted::Accepted { replaced: None }));
    assert_eq!(l.claimable().count(), 0, "not stored yet");
    assert_eq!(l.claim(G, &1).outcome, LatestClaim::Unwritten);
    assert!(l.claim_next(G).is_none());
    assert_eq!(l.unpersisted_len(), 1);
    let ready = l.poll_ready().unwrap();
    assert_eq!(ready, LatestReady { epoch: Epoch(1), writes: vec![put(1, Some(1), None)] });
    assert_eq!(l.newest(&1), Some((Version(1), &10)), "the value a Put stores");
    assert_eq!(l.unpersisted_len(), 1, "being written: not yet stored");
    assert_eq!(l.poll_ready(), None, "one epoch at a time");
    assert_eq!(l.claim(G, &1).outcome, LatestClaim::Unwritten, "written is not stored");
    assert_eq!(l.persisted(Epoch(2)), LatestPersisted::UnknownEpoch { epoch: Epoch(2) });
    assert_eq!(l.persisted(Epoch(1)), LatestPersisted::Recorded { claimable: vec![1] });
    assert_eq!(l.unpersisted_len(), 0);
    assert!(matches!(l.claim(G, &1).outcome, LatestClaim::Claimed(_)));
    // The flight's row is written again only when something of it changes:
    // its frontier, once applied.
    assert_eq!(l.poll_ready(), None);
    assert_eq!(l.ack_applied(G, &1, Version(1)).outcome, Applied::Advanced { durable_through: Version(1) });
    let ready = l.poll_ready().unwrap();
    assert_eq!(ready.writes, [put(1, None, Some(1))], "applied: no newest, the frontier");
    assert_eq!(l.persisted(ready.epoch), LatestPersisted::Recorded { claimable: vec![] });
}

#[test]
fn a_newer_desire_while_an_epoch_is_written_waits_for_its_own() {
    let mut l = durable(Vec::new());
    l.upsert(1, Version(1), 10).outcome.unwrap();
    let first = l.poll_ready().unwrap();
    l.upsert(1, Version(2), 20).outcome.unwrap();
    assert_eq!(l.unpersisted_len(), 1, "one key, in the epoch and dirty again");
    assert_eq!(l.persisted(first.epoch), LatestPersisted::Recorded { claimable: vec![] }, "2 is not stored yet");
    assert_eq!(l.claim(G, &1).outcome, LatestClaim::Unwritten);
    let second = l.poll_ready().unwrap();
    assert_eq!(second.writes, [put(1, Some(2), None)]);
    assert_eq!(l.persisted(second.epoch), LatestPersisted::Recorded { claimable: vec![1] });
    let LatestClaim::Claimed(e) = l.claim(G, &1).outcome else { panic!("claimable") };
    assert_eq!((e.version, *e.value), (Version(2), 20));
    // A desire replacing a stored one unclaimable until its own write.
    l.upsert(2, Version(1), 1).outcome.unwrap();
    let third = l.poll_ready().unwrap();
    let _ = l.persisted(third.epoch);
    assert_eq!(l.claimable().copied().collect::<Vec<_>>(), [2]);
    l.upsert(2, Version(2), 2).outcome.unwrap();
    assert_eq!(l.claimable().count(), 0, "the newer desire is not stored");
    assert_eq!(l.claimable_len(), 0);
}

#[test]
fn a_failed_write_is_shown_and_carried_again() {
    let mut l = durable(Vec::new());
    l.upsert(1, Version(1), 10).outcome.unwrap();
    l.upsert(2, Version(1), 20).outcome.unwrap();
    let ready = l.poll_ready().unwrap();
    assert_eq!(l.persist_failed(Epoch(9), "no"), LatestPersisted::UnknownEpoch { epoch: Epoch(9) });
    assert_eq!(l.persist_error(), None, "an unknown epoch changes nothing");
    assert_eq!(l.persist_failed(ready.epoch, "disk full"), LatestPersisted::Recorded { claimable: vec![] });
    let error = l.persist_error().unwrap();
    assert_eq!((error.epoch, error.reason.as_str()), (ready.epoch, "disk full"));
    assert_eq!((l.unpersisted_len(), l.claimable_len()), (2, 0));
    let again = l.poll_ready().unwrap();
    assert_eq!(again.writes, [put(1, Some(1), None), put(2, Some(1), None)]);
    assert!(again.epoch > ready.epoch);
    assert_eq!(l.persisted(again.epoch), LatestPersisted::Recorded { claimable: vec![1, 2] });
    assert_eq!(l.persist_error(), None, "cleared by a write");
}

#[test]
fn a_key_is_forgotten_once_its_row_is_written_and_its_row_goes() {
    let mut l = durable(vec![RestoredKey { key: 1, desired: None, durable_through: Some(Version(3)) }]);
    assert_eq!(l.poll_ready(), None, "restored rows are stored");
    l.upsert(2, Version(1), 10).outcome.unwrap();
    let ready = l.poll_ready().unwrap();
    let _ = l.persisted(ready.epoch);
    let _ = l.claim(G, &2);
    let _ = l.ack_applied(G, &2, Version(1));
    assert_eq!(l.forget(&2), Err(ForgetRefused::Unwritten), "its frontier is not stored yet");
    let ready = l.poll_ready().unwrap();
    assert_eq!(l.forget(&2), Err(ForgetRefused::Unwritten), "nor while it is written");
    let _ = l.persisted(ready.epoch);
    assert_eq!(l.forget(&2), Ok(Some(Version(1))));
    assert_eq!(l.forget(&1), Ok(Some(Version(3))));
    let ready = l.poll_ready().unwrap();
    assert_eq!(ready.writes, [LatestWrite::Delete { key: 1 }, LatestWrite::Delete { key: 2 }]);
    // Upserted again before its delete is written: its row is put.
    l.upsert(1, Version(1), 5).outcome.unwrap();
    let _ = l.persisted(ready.epoch);
    assert_eq!(l.claimable_len(), 0, "the delete's epoch does not store the new desire");
    assert_eq!(l.poll_ready().unwrap().writes, [put(1, Some(1), None)]);
}

#[test]
fn without_a_journal_nothing_is_written_and_every_desire_is_claimable() {
    let mut l: Latest<u8, u32> = Latest::new(policy(), NonZeroUsize::new(4).unwrap());
    l.upsert(1, Version(1), 10).outcome.unwrap();
    assert!(!l.is_journaled());
    assert_eq!((l.poll_ready(), l.unpersisted_len(), l.persist_error()), (None, 0, None));
    assert_eq!(l.persisted(Epoch(1)), LatestPersisted::UnknownEpoch { epoch: Epoch(1) });
    assert_eq!(l.persist_failed(Epoch(1), "x"), LatestPersisted::UnknownEpoch { epoch: Epoch(1) });
    assert_eq!(l.claimable_len(), 1);
}

/// What the store holds: each key's row (newest version and value, frontier).
type Rows = BTreeMap<u8, (Option<(Version, u32)>, Option<Version>)>;

#[derive(Clone, Debug)]
enum Op {
    Upsert(u8, u64, u32),
    ClaimNext,
    Ack(u8),
    Fail(u8),
    Timeout(u64),
    Poll,
    Commit,
    Abort,
    Forget(u8),
    Reconnect,
    /// The process dies here; it restarts from the store.
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..3;
    prop_oneof![
        4 => (key.clone(), 0u64..10, 0u32..3).prop_map(|(k, v, x)| Op::Upsert(k, v, x)),
        3 => Just(Op::ClaimNext),
        2 => key.clone().prop_map(Op::Ack),
        1 => key.clone().prop_map(Op::Fail),
        1 => (0u64..2_000).prop_map(Op::Timeout),
        3 => Just(Op::Poll),
        3 => Just(Op::Commit),
        1 => Just(Op::Abort),
        1 => key.prop_map(Op::Forget),
        1 => Just(Op::Reconnect),
        1 => Just(Op::Crash),
    ]
}

fn restart(rows: &Rows, generation: Generation) -> Latest<u8, u32> {
    let keys = rows
        .iter()
        .map(|(k, (newest, durable_through))| RestoredKey {
            key: *k,
            desired: *newest,
            durable_through: *durable_through,
        })
        .collect();
    Latest::restore_journaled(policy(), NonZeroUsize::new(4).unwrap(), generation, keys).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn a_crash_at_any_point_never_takes_back_what_the_sink_may_have_seen(ops in prop::collection::vec(op(), 1..100)) {
        let mut rows: Rows = BTreeMap::new();
        let mut l = restart(&rows, Generation(1));
        // The epoch being written, with the rows it will put.
        let mut writing: Option<(Epoch, Rows, Vec<u8>)> = None;
        // The highest version of each key the sink was handed, and applied.
        let mut seen: BTreeMap<u8, Version> = BTreeMap::new();
        let mut applied: BTreeMap<u8, Version> = BTreeMap::new();
        let mut now = 0u64;
        for op in ops {
            let g = l.generation();
            match op {
                Op::Upsert(k, v, x) => { let _ = l.upsert(k, Version(v), x); }
                Op::ClaimNext => {
                    if let Some(t) = l.claim_next(g)
                        && let LatestClaim::Claimed(e) = t.outcome
                    {
                        let (k, v) = (*e.key, e.version);
                        prop_assert!(rows.get(&k).and_then(|r| r.0).is_some_and(|(s, _)| s >= v),
                            "claimed {k}@{v:?} not stored: {rows:?}");
                        let s = seen.entry(k).or_insert(v);
                        *s = (*s).max(v);
                    }
                }
                Op::Ack(k) => {
                    if let Some((fg, v, _)) = l.inflight(&k) {
                        let _ = l.ack_applied(fg, &k, v);
                        let a = applied.entry(k).or_insert(v);
                        *a = (*a).max(v);
                    }
                }
                Op::Fail(k) => {
                    if let Some((fg, v, _)) = l.inflight(&k) {
                        let _ = l.fail_retryable(fg, &k, v, Time(now), None, JitterSample::ZERO);
                    }
                }
                Op::Timeout(dt) => { now += dt; let _ = l.handle_timeout(Time(now)); }
                Op::Poll => {
                    if writing.is_none() && let Some(ready) = l.poll_ready() {
                        let mut put = Rows::new();
                        let mut gone = Vec::new();
                        for w in ready.writes {
                            match w {
                                LatestWrite::Put { key, newest, durable_through } => {
                                    let value = newest.map(|v| {
                                        let (nv, x) = l.newest(&key).expect("a newest version to put");
                                        assert_eq!(nv, v);
                                        (v, *x)
                                    });
                                    put.insert(key, (value, durable_through));
                                }
                                LatestWrite::Delete { key } => gone.push(key),
                            }
                        }
                        writing = Some((ready.epoch, put, gone));
                    }
                }
                Op::Commit => {
                    if let Some((epoch, put, gone)) = writing.take() {
                        for k in gone { rows.remove(&k); }
                        rows.extend(put);
                        let _ = l.persisted(epoch);
                    }
                }
                Op::Abort => {
                    if let Some((epoch, _, _)) = writing.take() {
                        let _ = l.persist_failed(epoch, "refused");
                    }
                }
                Op::Forget(k) => {
                    if l.forget(&k).is_ok() {
                        // The application drops the key: what the sink saw
                        // of it no longer binds (a later version may be
                        // lower). What it applied stays the bound of any
                        // frontier stored.
                        seen.remove(&k);
                    }
                }
                Op::Reconnect => { let _ = l.reconnect(Generation(g.0 + 1)); }
                Op::Crash => {
                    // A write in progress may or may not have committed:
                    // it did not, here (a commit is the `Commit` op).
                    writing = None;
                    l = restart(&rows, Generation(g.0 + 1));
                }
            }
            // The store never falls behind what the sink may hold: a row
            // holds a version at or above everything handed to the sink,
            // and never a frontier above what the sink applied.
            for (k, v) in &seen {
                let row = rows.get(k);
                let top = row.and_then(|r| r.0.map(|(s, _)| s)).max(row.and_then(|r| r.1));
                prop_assert!(top >= Some(*v), "key {k}: the sink saw {v:?}, the store holds {row:?}");
            }
            for (k, (_, frontier)) in &rows {
                prop_assert!(*frontier <= applied.get(k).copied(), "key {k}: a frontier never applied");
            }
        }
        // Converges after a restart: every stored desire reaches the sink.
        let mut l = restart(&rows, Generation(1_000));
        let g = l.generation();
        while let Some(t) = l.claim_next(g) {
            let LatestClaim::Claimed(e) = t.outcome else { unreachable!("claimable") };
            let (k, v) = (*e.key, e.version);
            let _ = l.ack_applied(g, &k, v);
        }
        prop_assert!(l.is_settled());
        for (k, (newest, frontier)) in &rows {
            prop_assert_eq!(l.durable_through(k), newest.map(|(v, _)| v).or(*frontier));
        }
    }
}
