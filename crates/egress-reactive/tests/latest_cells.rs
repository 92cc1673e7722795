//! The latest cell on every flavour: only the newest value of each key
//! reaches the sink, one flight per key; exact invalidation per key and
//! per projection; a failing sink backs off and never spins; a reconnect
//! fences the old sink; panics in the sink; the bound on keys; the
//! per-key readers' lifetime.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use common::Counter;
use egress_core::{
    Applied, Delay, Failed, ForgetRefused, Generation, JitterSample, Latest, LatestClaim, LatestPersisted,
    LatestReconnect, LatestWrite, Policy, RestoredKey, Time, Upserted, Version,
};
use egress_reactive::{
    CellOptions, LatestCellOf, LatestItem, LatestRefused, LatestSink, ManualClock, SendError, Written,
};

/// What a sink saw: key, version, generation, value.
type Wrote = (u8, u64, u64, u32);

/// A sink that records what it is given, and answers as scripted (one
/// entry per write: `None` applies it at once), or takes it for a later
/// report, or panics when told to.
#[derive(Clone, Default)]
struct Sink {
    wrote: Arc<Mutex<Vec<Wrote>>>,
    script: Arc<Mutex<std::collections::VecDeque<Option<SendError>>>>,
    take: Arc<Mutex<bool>>,
    panic_on: Arc<Mutex<Option<u32>>>,
    /// What the sink holds, by key: the last value applied.
    table: Arc<Mutex<BTreeMap<u8, u32>>>,
}

impl Sink {
    fn wrote(&self) -> Vec<Wrote> {
        self.wrote.lock().expect("sink").clone()
    }
    fn values(&self) -> Vec<u32> {
        self.wrote().iter().map(|w| w.3).collect()
    }
    fn fail_next(&self, errors: impl IntoIterator<Item = Option<SendError>>) {
        self.script.lock().expect("script").extend(errors);
    }
    fn taking(&self, take: bool) {
        *self.take.lock().expect("take") = take;
    }
}

impl LatestSink<u8, u32> for Sink {
    fn write(&mut self, item: LatestItem<u8, u32>) -> Result<Written, SendError> {
        if *self.panic_on.lock().expect("panic_on") == Some(item.value) {
            panic!("the sink panicked on {}", item.value);
        }
        self.wrote.lock().expect("sink").push((item.key, item.version.0, item.generation.0, item.value));
        if let Some(Some(error)) = self.script.lock().expect("script").pop_front() {
            return Err(error);
        }
        if *self.take.lock().expect("take") {
            return Ok(Written::Taken);
        }
        self.table.lock().expect("table").insert(item.key, item.value);
        Ok(Written::Applied)
    }
}

fn policy() -> Policy {
    Policy::builder().retry_base(Delay(100)).retry_ceiling(Delay(1_000)).build().expect("valid policy")
}

fn options(clock: &ManualClock) -> CellOptions {
    CellOptions::new().generation(Generation(1)).clock(clock.clone()).jitter_seed(7)
}

fn keys(n: usize) -> std::num::NonZeroUsize {
    std::num::NonZeroUsize::new(n).expect("not zero")
}

each_flavour! {
    fn only_the_newest_value_of_a_key_is_written_and_one_flight_per_key(cx) {
        let clock = ManualClock::new();
        let cell: LatestCellOf<u8, u32, _> = LatestCellOf::with_options(&cx.handle(), policy(), keys(8), options(&clock));
        let sink = Sink::default();
        sink.taking(true);
        let link = cell.attach(sink.clone());
        assert_eq!(cell.upsert(1, Version(1), 10), Ok(Upserted::Accepted { replaced: None }));
        assert_eq!(sink.wrote(), [(1, 1, 1, 10)], "written at once: the key was free");
        // In flight: newer values replace each other as the desire, unwritten.
        for (v, x) in [(2, 20), (3, 30)] {
            assert!(matches!(cell.upsert(1, Version(v), x), Ok(Upserted::Accepted { .. })));
        }
        assert_eq!(cell.upsert(2, Version(1), 100), Ok(Upserted::Accepted { replaced: None }));
        assert_eq!(sink.values(), [10, 100], "another key is not held back by the first's flight");
        let one = cell.key(&1);
        assert_eq!(one.inflight().get(), Some((Version(1), 10)));
        assert_eq!(one.desired().get(), Some((Version(3), 30)));
        assert_eq!((cell.desired_len().get(), cell.inflight_len().get(), cell.len().get()), (1, 2, 2));
        // Applied: the frontier moves, and the newest desire goes next.
        assert_eq!(link.applied(&1, Version(1)), Applied::Advanced { durable_through: Version(1) });
        assert_eq!(sink.values(), [10, 100, 30], "20 was never written: 30 replaced it first");
        assert_eq!(one.durable_through().get(), Some(Version(1)));
        assert_eq!(link.applied(&1, Version(3)), Applied::Advanced { durable_through: Version(3) });
        assert_eq!(link.applied(&2, Version(1)), Applied::Advanced { durable_through: Version(1) });
        assert!(cell.is_settled().get());
        // Stale and duplicate reports change nothing.
        assert_eq!(link.applied(&1, Version(3)), Applied::Unchanged);
        assert_eq!(link.applied(&1, Version(9)), Applied::UnknownVersion { version: Version(9) });
        assert_eq!(cell.upsert(1, Version(2), 0), Ok(Upserted::AlreadyDurable { durable_through: Version(3) }));
        assert_eq!(sink.wrote().len(), 3);
    }

    fn a_sink_that_applies_at_once_sees_only_the_last_value_of_a_batch(cx) {
        let cell: LatestCellOf<u8, u32, _> = LatestCellOf::new(&cx.handle(), policy(), keys(8));
        let sink = Sink::default();
        let link = cell.attach(sink.clone());
        let runs = link.runs();
        cx.batch(|| {
            for v in 1..=50 {
                cell.upsert(v as u8 % 2, Version(u64::from(v)), v).expect("room");
            }
        });
        assert_eq!(sink.values(), [50, 49], "one write per key: the newest, in key order");
        assert_eq!(link.runs(), runs + 1, "one sink run for the batch");
        assert_eq!(*sink.table.lock().expect("table"), BTreeMap::from([(0, 50), (1, 49)]));
        assert_eq!(cell.key(&0).durable_through().get(), Some(Version(50)));
        assert!(cell.is_settled().get() && !link.is_fenced());
    }

    fn a_transition_on_one_key_invalidates_only_what_it_changed(cx) {
        let clock = ManualClock::new();
        let cell: LatestCellOf<u8, u32, _> = LatestCellOf::with_options(&cx.handle(), policy(), keys(8), options(&clock));
        let (a, b) = (cell.key(&1), cell.key(&2));
        let hits = [
            watch!(cx, a.desired()),
            watch!(cx, a.inflight()),
            watch!(cx, a.durable_through()),
            watch!(cx, a.backoff()),
            watch!(cx, b.desired()),
            watch!(cx, cell.desired_len()),
            watch!(cx, cell.is_settled()),
        ];
        let counts = || hits.iter().map(Counter::get).collect::<Vec<_>>();
        cell.upsert(1, Version(1), 10).expect("room");
        assert_eq!(counts(), [1, 0, 0, 0, 0, 1, 1], "an upsert changes the key's desire, and the counts");
        cell.upsert(1, Version(2), 20).expect("room");
        assert_eq!(counts(), [2, 0, 0, 0, 0, 1, 1], "a replaced desire: only the desire");
        let _ = cell.upsert(1, Version(1), 10);
        let _ = cell.upsert(1, Version(2), 21);
        assert_eq!(counts(), [2, 0, 0, 0, 0, 1, 1], "a stale version and a conflict change nothing");
        let g = Generation(1);
        let claimed = cell.claim_with(g, &1, |c| matches!(c, LatestClaim::Claimed(e) if *e.value == 20));
        assert!(claimed);
        assert_eq!(counts(), [3, 1, 0, 0, 0, 2, 1], "a claim: desire and flight");
        let failed = cell.fail_retryable_with(g, &1, Version(2), None, JitterSample::ZERO);
        assert_eq!(failed, Failed::Pending { retry_at: Time(100) });
        assert_eq!(counts(), [4, 2, 0, 1, 0, 3, 1], "a failure: flight, desire back, backoff");
        assert_eq!(a.backoff().get(), Some(Time(100)));
        assert_eq!(cell.handle_timeout(Time(99)), Vec::<u8>::new());
        assert_eq!(counts(), [4, 2, 0, 1, 0, 3, 1], "not yet due: nothing");
        assert_eq!(cell.handle_timeout(Time(100)), [1]);
        assert_eq!(counts(), [4, 2, 0, 2, 0, 3, 1], "due: the backoff only");
        assert!(cell.claim_with(g, &1, |c| matches!(c, LatestClaim::Claimed(_))));
        assert_eq!(cell.ack_applied(g, &1, Version(2)), Applied::Advanced { durable_through: Version(2) });
        assert_eq!(counts(), [5, 4, 1, 2, 0, 4, 2], "applied: flight and frontier; settled");
        assert_eq!(b.desired().get(), None, "the other key never moved");
        assert_eq!(cell.forget(&1), Ok(Some(Version(2))));
        assert_eq!(counts(), [5, 4, 2, 2, 0, 4, 2], "forgotten: the frontier reads None");
        assert_eq!(a.durable_through().get(), None);
        assert_eq!(cell.forget(&1), Err(ForgetRefused::Unknown));
        assert_eq!(counts(), [5, 4, 2, 2, 0, 4, 2], "a refused forget changes nothing");
    }

    fn a_failing_sink_backs_off_on_the_schedule_and_never_spins(cx) {
        let clock = ManualClock::new();
        let cell: LatestCellOf<u8, u32, _> = LatestCellOf::with_options(&cx.handle(), policy(), keys(8), options(&clock));
        let sink = Sink::default();
        sink.fail_next([
            Some(SendError::transient("down")),
            Some(SendError::retry_after(Delay(5_000), "429")),
            Some(SendError::permanent("no")),
        ]);
        let link = cell.attach(sink.clone());
        cell.upsert(1, Version(1), 10).expect("room");
        cell.upsert(2, Version(1), 20).expect("room");
        assert_eq!(sink.values(), [10, 20], "each key written once, then backed off: no spin");
        assert_eq!((cell.waiting_len().get(), cell.desired_len().get(), cell.inflight_len().get()), (2, 2, 0));
        let runs = link.runs();
        // Upserts of a waiting key do not write it before its backoff.
        cell.upsert(1, Version(2), 11).expect("room");
        assert_eq!(sink.values(), [10, 20]);
        let due_1 = cell.key(&1).backoff().get().expect("waits");
        assert_eq!(cell.now(), Time(0), "the cell's clock");
        let due_2 = cell.key(&2).backoff().get().expect("waits");
        assert!(due_2 >= Time(5_000), "the sink's retry-after is a floor: {due_2:?}");
        assert!(due_1 < due_2);
        assert_eq!(cell.poll_timeout(), Some(due_1));
        clock.set(due_1);
        assert_eq!(cell.now(), due_1);
        assert_eq!(cell.handle_timeout(due_1), [1]);
        assert_eq!(sink.values(), [10, 20, 11], "the newest desire of key 1 went at its due time, and failed");
        // Key 1 failed permanently: a latest value has no dead letter, it
        // waits its (second, longer) backoff and goes again.
        let again = cell.poll_timeout().expect("key 1 waits");
        assert!(again > due_1 && again < due_2, "{again:?}");
        clock.set(again);
        assert_eq!(cell.handle_timeout(again), [1]);
        assert_eq!(sink.values(), [10, 20, 11, 11]);
        assert_eq!(cell.key(&1).durable_through().get(), Some(Version(2)));
        clock.set(due_2);
        assert_eq!(cell.handle_timeout(due_2), [2]);
        assert_eq!(sink.values(), [10, 20, 11, 11, 20]);
        assert_eq!(cell.key(&2).durable_through().get(), Some(Version(1)));
        assert!(cell.is_settled().get());
        assert!(link.runs() <= runs + 3, "one run per wake: {} after {runs}", link.runs());
    }

    fn a_reconnect_fences_the_old_sink_and_the_new_one_writes_the_flight_again(cx) {
        let clock = ManualClock::new();
        let cell: LatestCellOf<u8, u32, _> = LatestCellOf::with_options(&cx.handle(), policy(), keys(8), options(&clock));
        let generation = watch!(cx, cell.generation());
        let old_sink = Sink::default();
        old_sink.taking(true);
        let old = cell.attach(old_sink.clone());
        cell.upsert(1, Version(1), 10).expect("room");
        cell.upsert(2, Version(1), 20).expect("room");
        cell.upsert(2, Version(2), 21).expect("room");
        assert_eq!(old_sink.values(), [10, 20]);
        let reconnect = cell.reconnect(Generation(2));
        let LatestReconnect::Advanced { requeued, superseded, .. } = reconnect else { panic!("{reconnect:?}") };
        assert_eq!((requeued, superseded), (1, 1), "key 2's flight was superseded by 21");
        assert!(old.is_fenced() && old.runs() == 0, "the old sink's effect is gone");
        assert_eq!(generation.get(), 1);
        assert_eq!(cell.generation().get(), Generation(2));
        assert_eq!(old.applied(&1, Version(1)), Applied::StaleGeneration { current: Generation(2) });
        assert_eq!(old.fail(&1, Version(1), None), Failed::StaleGeneration { current: Generation(2) });
        cell.upsert(3, Version(1), 30).expect("room");
        assert_eq!(old_sink.values(), [10, 20], "a fenced sink never writes again");
        let new_sink = Sink::default();
        let new = cell.attach(new_sink.clone());
        assert_eq!(new.generation(), Generation(2));
        assert_eq!(new_sink.wrote(), [(1, 1, 2, 10), (2, 2, 2, 21), (3, 1, 2, 30)]);
        assert!(cell.is_settled().get());
        assert_eq!(cell.reconnect(Generation(2)), LatestReconnect::Unchanged);
        assert_eq!(cell.reconnect(Generation(1)), LatestReconnect::StaleGeneration { current: Generation(2) });
    }

    fn a_panicking_sink_leaves_the_key_backed_off_not_in_flight(cx) {
        let clock = ManualClock::new();
        let cell: LatestCellOf<u8, u32, _> = LatestCellOf::with_options(&cx.handle(), policy(), keys(8), options(&clock));
        let sink = Sink::default();
        *sink.panic_on.lock().expect("panic_on") = Some(10);
        let _link = cell.attach(sink.clone());
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cell.upsert(1, Version(1), 10)));
        assert!(panicked.is_err(), "the panic reaches the caller");
        assert_eq!((cell.inflight_len().get(), cell.waiting_len().get()), (0, 1), "failed, not left in flight");
        assert_eq!(cell.key(&1).desired().get(), Some((Version(1), 10)), "the value is kept");
        *sink.panic_on.lock().expect("panic_on") = None;
        let due = cell.poll_timeout().expect("waits");
        clock.set(due);
        cell.handle_timeout(due);
        assert_eq!(sink.values(), [10]);
        assert!(cell.is_settled().get());
    }

    fn keys_are_bounded_with_the_value_back(cx) {
        let cell: LatestCellOf<u8, u32, _> = LatestCellOf::new(&cx.handle(), policy(), keys(2));
        cell.upsert(1, Version(1), 10).expect("room");
        cell.upsert(2, Version(1), 20).expect("room");
        let refused = cell.upsert(3, Version(1), 30).expect_err("a third key");
        let LatestRefused::TooManyKeys(refused) = refused else { panic!("{refused:?}") };
        assert_eq!((refused.limit, refused.value), (2, 30));
        assert_eq!(cell.len().get(), 2);
        assert_eq!(cell.key(&3).desired().get(), None);
        assert_eq!(cell.forget(&1), Err(ForgetRefused::Busy), "a key with a desire stays");
        assert!(format!("{cell:?}").contains("keys: 2"), "{cell:?}");
    }

    fn per_key_readers_are_shared_while_used_and_swept_after(cx) {
        let cell: LatestCellOf<u8, u32, _> = LatestCellOf::new(&cx.handle(), policy(), keys(64));
        let held = cell.key(&0);
        cell.upsert(0, Version(1), 1).expect("room");
        assert_eq!(held.desired().get(), Some((Version(1), 1)));
        let again = cell.key(&0);
        cell.upsert(0, Version(2), 2).expect("room");
        assert_eq!((held.desired().get(), again.desired().get()), (Some((Version(2), 2)), Some((Version(2), 2))));
        // Readers of many keys made and dropped: swept, and made again on demand.
        for k in 1..40u8 {
            let r = cell.key(&k);
            cell.upsert(k, Version(1), u32::from(k)).expect("room");
            assert_eq!(r.desired().get(), Some((Version(1), u32::from(k))));
        }
        assert_eq!(cell.key(&5).desired().get(), Some((Version(1), 5)));
        assert_eq!(held.desired().get(), Some((Version(2), 2)), "a held reader survives the sweep");
        cell.upsert(0, Version(3), 3).expect("room");
        assert_eq!(held.desired().get(), Some((Version(3), 3)), "and is still invalidated");
    }

    fn a_restored_projection_resumes_each_key_at_its_frontier(cx) {
        let stored = vec![
            RestoredKey { key: 1u8, desired: Some((Version(5), 50u32)), durable_through: Some(Version(4)) },
            RestoredKey { key: 2, desired: None, durable_through: Some(Version(9)) },
        ];
        let latest = Latest::restore(policy(), keys(8), Generation(3), stored).expect("valid");
        let cell = LatestCellOf::from_latest(&cx.handle(), latest, CellOptions::new());
        assert_eq!((cell.generation().get(), cell.desired_len().get(), cell.len().get()), (Generation(3), 1, 2));
        let sink = Sink::default();
        let link = cell.attach(sink.clone());
        assert_eq!(sink.wrote(), [(1, 5, 3, 50)], "the unapplied desire goes; the applied key does not");
        assert_eq!(cell.upsert(2, Version(9), 0), Ok(Upserted::AlreadyDurable { durable_through: Version(9) }));
        assert!(cell.is_settled().get());
        drop(link);
    }

    fn a_disposed_cell_fences_new_sinks_and_keeps_its_keys(cx) {
        let cell: LatestCellOf<u8, u32, _> = LatestCellOf::new(&cx.handle(), policy(), keys(8));
        let readers = cell.key(&1);
        assert!(!cell.is_disposed());
        cell.dispose();
        assert!(cell.is_disposed());
        let sink = Sink::default();
        let link = cell.attach(sink.clone());
        assert!(link.is_fenced(), "a disposed cell's attachment is fenced from the start");
        cell.upsert(1, Version(1), 10).expect("room");
        assert!(sink.wrote().is_empty(), "nothing is written by a fenced sink");
        assert_eq!(cell.with_latest(|l| l.desired(&1).map(|(v, x)| (v, *x))), Some((Version(1), 10)));
        assert!(readers.desired().try_get().is_err(), "its readers are disposed");
        assert_eq!(cell.key(&1).desired().get(), Some((Version(1), 10)), "fresh readers read, unkept");
    }

    fn a_durable_cell_writes_a_desire_to_the_sink_only_once_the_store_holds_it(cx) {
        let latest = Latest::restore_journaled(policy(), keys(8), Generation(1), Vec::new()).expect("empty");
        let cell: LatestCellOf<u8, u32, _> = LatestCellOf::from_latest(&cx.handle(), latest, CellOptions::new());
        let unpersisted = watch!(cx, cell.unpersisted_len());
        let errors = watch!(cx, cell.persist_error());
        let sink = Sink::default();
        let _link = cell.attach(sink.clone());
        cell.upsert(1, Version(1), 10).expect("room");
        cell.upsert(2, Version(1), 20).expect("room");
        assert!(sink.wrote().is_empty(), "nothing reaches the sink before the store holds it");
        assert_eq!((cell.unpersisted_len().get(), unpersisted.get()), (2, 2));
        assert_eq!(cell.claimable_len().get(), 0);
        let (ready, values) = cell.poll_ready().expect("two rows to write");
        assert_eq!(values, [Some(10), Some(20)]);
        assert!(cell.poll_ready().is_none(), "one epoch at a time");
        assert_eq!(cell.persist_failed(ready.epoch, "disk full"), LatestPersisted::Recorded { claimable: vec![] });
        assert_eq!(cell.persist_error().get().map(|e| e.reason), Some("disk full".to_owned()));
        assert_eq!(errors.get(), 1);
        assert!(sink.wrote().is_empty(), "a failed write stores nothing");
        let (ready, values) = cell.poll_ready().expect("carried again");
        assert_eq!(values, [Some(10), Some(20)]);
        assert_eq!(cell.persisted(ready.epoch), LatestPersisted::Recorded { claimable: vec![1, 2] });
        assert_eq!(sink.values(), [10, 20], "stored: the sink effect woke and wrote both");
        assert_eq!((cell.persist_error().get(), errors.get()), (None, 2));
        // The frontiers the sink applied are the next rows to write.
        let (ready, values) = cell.poll_ready().expect("the frontiers");
        let frontier = |key| LatestWrite::Put { key, newest: None, durable_through: Some(Version(1)) };
        assert_eq!(ready.writes, [frontier(1), frontier(2)]);
        assert_eq!(values, [None, None]);
        let _ = cell.persisted(ready.epoch);
        assert_eq!(cell.unpersisted_len().get(), 0);
        assert!(cell.is_settled().get());
    }

    fn a_value_whose_clone_panics_fails_the_epoch_which_is_offered_again(cx) {
        let latest = Latest::restore_journaled(policy(), keys(8), Generation(1), Vec::new()).expect("empty");
        let cell: LatestCellOf<u8, Fragile, _> = LatestCellOf::from_latest(&cx.handle(), latest, CellOptions::new());
        cell.upsert(1, Version(1), Fragile(true)).expect("room");
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cell.poll_ready()));
        assert!(panicked.is_err(), "the panic goes on");
        let error = cell.persist_error().get().expect("the epoch failed");
        assert!(error.reason.contains("Clone panicked"), "{}", error.reason);
        assert_eq!(cell.unpersisted_len().get(), 1, "carried again");
    }

    fn a_sink_that_panics_on_one_key_does_not_hold_back_the_others(cx) {
        let cell: LatestCellOf<u8, u32, _> = LatestCellOf::new(&cx.handle(), policy(), keys(8));
        let sink = Sink::default();
        *sink.panic_on.lock().expect("panic_on") = Some(10);
        let _link = cell.attach(sink.clone());
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cx.batch(|| {
                cell.upsert(1, Version(1), 10).expect("room");
                cell.upsert(2, Version(1), 20).expect("room");
            });
        }));
        assert!(panicked.is_err(), "the panic reaches the caller");
        assert_eq!(sink.wrote(), [(2, 1, 0, 20)], "key 2 was written in the same run, after key 1 panicked");
        assert_eq!((cell.waiting_len().get(), cell.inflight_len().get()), (1, 0), "key 1 failed, backs off");
        assert_eq!(cell.key(&2).durable_through().get(), Some(Version(1)));
    }

    fn a_value_whose_clone_panics_at_the_claim_is_failed_and_the_others_go(cx) {
        let cell: LatestCellOf<u8, Fragile, _> = LatestCellOf::new(&cx.handle(), policy(), keys(8));
        let wrote = Arc::new(Mutex::new(Vec::new()));
        let _link = cell.attach(Collect(wrote.clone()));
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cx.batch(|| {
                cell.upsert(1, Version(1), Fragile(true)).expect("room");
                cell.upsert(2, Version(1), Fragile(false)).expect("room");
            });
        }));
        assert!(panicked.is_err(), "the panic goes on");
        assert_eq!(*wrote.lock().expect("sink"), [2], "the other key went");
        assert!(cell.with_latest(|l| l.inflight(&1).is_none()), "not left in flight");
        assert_eq!((cell.waiting_len().get(), cell.desired_len().get()), (1, 1), "failed, its value kept");
    }

    fn a_key_whose_clone_panics_is_never_left_in_flight_and_the_counts_hold(cx) {
        // The panic comes at every clone of the key in turn: wherever it
        // lands, the key is not left in flight unwritten, and the readers
        // show what the projection holds.
        for at in 0..12 {
            let cell: LatestCellOf<Bomb, u32, _> = LatestCellOf::new(&cx.handle(), policy(), keys(8));
            let wrote = Arc::new(Mutex::new(Vec::new()));
            let _link = cell.attach(Collect(wrote.clone()));
            BOMB.with(|b| b.set(Some(at)));
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cell.upsert(Bomb(1), Version(1), 10)));
            BOMB.with(|b| b.set(None));
            let (inflight, counts) = cell.with_latest(|l| {
                let counts = (l.len(), l.desired_len(), l.inflight_len(), l.waiting_len(), l.claimable_len());
                (l.inflight(&Bomb(1)).is_some(), counts)
            });
            assert!(!inflight, "clone #{at}: left in flight");
            let read = (
                cell.len().get(),
                cell.desired_len().get(),
                cell.inflight_len().get(),
                cell.waiting_len().get(),
                cell.claimable_len().get(),
            );
            assert_eq!(read, counts, "clone #{at}: the readers show the state");
        }
    }

    fn what_the_store_cannot_write_is_refused_with_why_and_changes_nothing(cx) {
        let cell: LatestCellOf<u8, u32, _> = LatestCellOf::new(&cx.handle(), policy(), keys(8));
        let check: egress_reactive::LatestCheck<u8, u32> = Arc::new(|k: &u8, v: Version, x: &u32| match (k, v, x) {
            (_, _, 13) => Err("unlucky".to_owned()),
            (_, Version(1_000), _) => Err("too high".to_owned()),
            (7, _, _) => Err("no such key".to_owned()),
            _ => Ok(()),
        });
        cell.set_write_check(Some(check));
        let refused = cell.upsert(1, Version(1), 13).expect_err("refused");
        assert_eq!(refused, LatestRefused::Unwritable { value: 13, reason: "unlucky".to_owned() });
        assert_eq!(format!("{refused:?}"), "Unwritable { reason: \"unlucky\" }");
        assert_eq!(refused.to_string(), "the store cannot write it: unlucky");
        let refused = cell.upsert(1, Version(1_000), 1).expect_err("refused");
        assert_eq!(refused, LatestRefused::Unwritable { value: 1, reason: "too high".to_owned() });
        assert!(matches!(cell.upsert(7, Version(1), 1), Err(LatestRefused::Unwritable { .. })));
        assert_eq!((cell.len().get(), cell.key(&1).desired().get()), (0, None), "nothing changed");
        assert_eq!(cell.upsert(1, Version(1), 12), Ok(Upserted::Accepted { replaced: None }));
        cell.set_write_check(None);
        assert!(matches!(cell.upsert(1, Version(2), 13), Ok(Upserted::Accepted { .. })), "no check: taken");
    }

    fn readers_of_which_one_was_disposed_are_replaced_whole(cx) {
        let cell: LatestCellOf<u8, u32, _> = LatestCellOf::new(&cx.handle(), policy(), keys(8));
        let old = cell.key(&1);
        old.desired().dispose();
        let fresh = cell.key(&1);
        cell.upsert(1, Version(1), 10).expect("room");
        assert_eq!(fresh.desired().get(), Some((Version(1), 10)), "fresh readers, invalidated");
        assert!(old.durable_through().try_get().is_err(), "the rest of the old set is disposed, not left stale");
        assert_eq!(cell.key(&1).desired().get(), Some((Version(1), 10)), "the fresh set is kept");
    }

    fn a_sink_attached_when_the_generation_moves_is_not_fenced_by_that_reconnect(cx) {
        // An effect that attaches a new sink whenever the generation moves
        // runs within the reconnect, before the older sinks are disposed:
        // its sink, of the new generation, must live.
        let cell: LatestCellOf<u8, u32, _> = LatestCellOf::new(&cx.handle(), policy(), keys(8));
        // One body for every flavour: on a `Context` an attachment is not
        // `Send`, and the `Arc` is only ever used on this thread.
        #[allow(clippy::arc_with_non_send_sync)]
        let links = Arc::new(Mutex::new(Vec::new()));
        let wrote = Arc::new(Mutex::new(Vec::new()));
        let _attacher = cx.effect({
            let (cell, links, wrote) = (cell.clone(), links.clone(), wrote.clone());
            move || {
                let _ = cell.generation().get();
                let link = cell.attach(Collect(wrote.clone()));
                links.lock().expect("links").push(link);
            }
        });
        assert_eq!(cell.reconnect(Generation(1)), LatestReconnect::Advanced {
            generation: Generation(1),
            requeued: 0,
            superseded: 0,
            keys: vec![],
        });
        let live: Vec<(Generation, bool)> =
            links.lock().expect("links").iter().map(|l| (l.generation(), l.is_fenced())).collect();
        assert_eq!(live, [(Generation(0), true), (Generation(1), false)]);
        cell.upsert(1, Version(1), 10).expect("room");
        assert_eq!(*wrote.lock().expect("sink"), [1], "the new sink writes");
    }

    fn a_transition_that_changes_nothing_wakes_no_journal_watcher(cx) {
        let latest = Latest::restore_journaled(policy(), keys(8), Generation(1), Vec::new()).expect("empty");
        let cell: LatestCellOf<u8, u32, _> = LatestCellOf::from_latest(&cx.handle(), latest, CellOptions::new());
        let runs = Counter::new();
        let _watcher = cx.effect({
            let (cell, runs) = (cell.clone(), runs.clone());
            move || {
                cell.track_journal();
                runs.hit();
            }
        });
        runs.reset();
        cell.upsert(1, Version(2), 20).expect("room");
        assert_eq!(runs.get(), 1, "an upsert: the journal has a row to write");
        let _ = cell.upsert(1, Version(1), 10);
        let _ = cell.upsert(1, Version(2), 20);
        let _ = cell.ack_applied(Generation(1), &1, Version(5));
        let _ = cell.forget(&9);
        let _ = cell.persisted(egress_core::Epoch(7));
        assert_eq!(runs.get(), 1, "refusals and no-ops wake nothing");
    }

    fn readers_read_before_a_sink_run_see_what_it_did(cx) {
        let cell: LatestCellOf<u8, u32, _> = LatestCellOf::new(&cx.handle(), policy(), keys(8));
        let one = cell.key(&1);
        let applied = watch!(cx, one.durable_through());
        let inflight = watch!(cx, one.inflight());
        let _link = cell.attach(Sink::default());
        cell.upsert(1, Version(1), 10).expect("room");
        // The sink run's own claim and acknowledgement invalidate what
        // they changed, once the run ends.
        assert_eq!((one.durable_through().get(), one.inflight().get()), (Some(Version(1)), None));
        assert_eq!(applied.get(), 1, "the frontier's watcher ran");
        // In flight and out again within the run: the flight reads as it
        // was, so its watcher is cut off.
        assert_eq!(inflight.get(), 0);
        assert_eq!(one.desired().get(), None);
        assert!(cell.is_settled().get());
    }

    fn unused_key_readers_are_swept_with_their_triggers(cx) {
        let cell: LatestCellOf<u8, u32, _> = LatestCellOf::new(&cx.handle(), policy(), keys(64));
        let base = cx.node_count();
        let readers = cell.key(&0);
        assert_eq!(format!("{readers:?}"), "KeyReaders { .. }");
        drop(readers);
        let per_key = cx.node_count() - base;
        assert_eq!(per_key, 8, "four readers and four triggers");
        for key in 1..16 {
            let _ = cell.key(&key);
        }
        assert_eq!(cx.node_count(), base + 16 * per_key, "below 16 sets, nothing is swept");
        // The 17th call finds 16 sets, none in use: swept, readers and
        // triggers, and its own made.
        let _ = cell.key(&16);
        assert_eq!(cx.node_count(), base + per_key);
    }

    fn dropping_or_detaching_an_attachment_stops_its_sink(cx) {
        let cell: LatestCellOf<u8, u32, _> = LatestCellOf::new(&cx.handle(), policy(), keys(8));
        let sink = Sink::default();
        let link = cell.attach(sink.clone());
        assert_eq!(format!("{link:?}"), "LatestAttachment { generation: Generation(0), .. }");
        cell.upsert(1, Version(1), 10).expect("room");
        drop(link);
        cell.upsert(2, Version(1), 20).expect("room");
        assert_eq!(sink.values(), [10], "a dropped attachment writes no more");
        let link = cell.attach(sink.clone());
        assert_eq!(sink.values(), [10, 20], "a new one writes what waits");
        link.detach();
        cell.upsert(3, Version(1), 30).expect("room");
        assert_eq!(sink.values(), [10, 20]);
    }
}

/// A value whose `Clone` panics when it says so.
#[derive(Debug, PartialEq)]
struct Fragile(bool);

impl Clone for Fragile {
    fn clone(&self) -> Self {
        assert!(!self.0, "a fragile value");
        Fragile(self.0)
    }
}

/// A sink that applies every value at once and records the keys.
struct Collect<K>(Arc<Mutex<Vec<K>>>);

impl<K: Clone + 'static, V> LatestSink<K, V> for Collect<K> {
    fn write(&mut self, item: LatestItem<K, V>) -> Result<Written, SendError> {
        self.0.lock().expect("sink").push(item.key);
        Ok(Written::Applied)
    }
}

thread_local! {
    /// Counts down the clones of a [`Bomb`] on this thread: the clone at 0
    /// panics.
    static BOMB: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// A key whose `Clone` panics when [`BOMB`] counts down to it.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Bomb(u8);

impl Clone for Bomb {
    fn clone(&self) -> Self {
        BOMB.with(|b| match b.get() {
            Some(0) => {
                b.set(None);
                panic!("a key's Clone panicked");
            }
            Some(n) => b.set(Some(n - 1)),
            None => {}
        });
        Bomb(self.0)
    }
}

/// A reconnect that comes while a sink effect is being attached (here from
/// the sink's first write, which runs as the effect is made; on another
/// thread it may come between the attach's read of the generation and its
/// record of the effect): the effect is disposed, not left alive under an
/// old generation (the reconnect once fenced the list before the effect
/// was in it, and the effect lived on, running at every wake).
#[test]
fn a_reconnect_while_a_sink_is_attached_leaves_no_live_effect_of_an_older_generation() {
    struct Reconnects(std::rc::Rc<std::cell::RefCell<Option<egress_reactive::LatestCell<u8, u32>>>>);
    impl LatestSink<u8, u32> for Reconnects {
        fn write(&mut self, _: LatestItem<u8, u32>) -> Result<Written, SendError> {
            if let Some(cell) = self.0.borrow_mut().take() {
                let _ = cell.reconnect(Generation(1));
            }
            Ok(Written::Taken)
        }
    }
    let cx = egress_reactive::Context::new();
    let cell: egress_reactive::LatestCell<u8, u32> = LatestCellOf::new(&cx.handle(), policy(), keys(8));
    cell.upsert(1, Version(1), 10).expect("room");
    let link = cell.attach(Reconnects(std::rc::Rc::new(std::cell::RefCell::new(Some(cell.clone())))));
    assert_eq!((link.generation(), cell.generation().get()), (Generation(0), Generation(1)));
    assert_eq!(link.runs(), 0, "the sink effect of generation 0 is disposed");
    assert!(link.is_fenced());
}
