//! What the runner drives: a [`Target`] opens one [`Session`] per fixture
//! and reports, after each op, its return value, its observable state and
//! which readers it invalidated.
//!
//! The core target reads invalidations off the core's change set. Shell
//! targets (the reactive cells) must observe them through their readers in
//! the graph instead, so that a shell which forgets to invalidate fails.

use egress_core::{
    AckOutcome, ClaimOutcome, EgressCore, FailOutcome, Generation, Projection, ReceivedOutcome, ReconnectOutcome,
    ScheduleOutcome, Sequence, Time,
};
use serde_json::{Map, Value, json};

use crate::fixture::{Fixture, Op};

/// An implementation the corpus can run against.
pub trait Target {
    /// The name used on the command line and in reports.
    fn name(&self) -> &'static str;

    /// A fresh session for `fixture`, set up with its generation and policy.
    ///
    /// # Errors
    /// A description of why the target cannot start.
    fn start(&self, fixture: &Fixture) -> Result<Box<dyn Session>, String>;

    /// What starts a fresh reactive graph of this target's flavour for a
    /// reactive-graph fixture; `None` for a target without a graph (the
    /// core).
    fn graph(&self) -> Option<GraphStart> {
        None
    }

    /// A fresh session of a lanes fixture (`"kind": "Lanes"`) on this
    /// target, or `None` for a target that runs none.
    ///
    /// # Errors
    /// A description of why the target cannot start.
    fn lanes(
        &self,
        fixture: &crate::lanes::LanesFixture,
    ) -> Option<Result<Box<dyn crate::lanes::LanesSession>, String>> {
        let _ = fixture;
        None
    }

    /// A fresh session of a relay fixture (`"kind": "Relay"`) on this
    /// target, or `None` for a target that runs none.
    ///
    /// # Errors
    /// A description of why the target cannot start.
    fn relay(
        &self,
        fixture: &crate::relay::RelayFixture,
    ) -> Option<Result<Box<dyn crate::relay::RelaySession>, String>> {
        let _ = fixture;
        None
    }

    /// What starts a scenario of a latest-value projection fixture
    /// (`"kind": "LatestDurableProjection"`) on this target, or `None`
    /// for a target that runs none.
    fn latest(&self) -> Option<crate::latest::LatestStart> {
        None
    }
}

/// Starts a session of the reactive-graph interpreter on a fresh graph.
pub type GraphStart = Box<dyn Fn() -> Box<dyn crate::graph::GraphSession>>;

/// One fixture's run on one target.
pub trait Session {
    /// Applies `op` and reports what happened.
    ///
    /// # Errors
    /// A description of a failure of the target itself (not a mismatch).
    fn apply(&mut self, op: &Op) -> Result<Observation, String>;
}

/// What a session reports after one op.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    /// The return value, in the fixture's `returns` shape.
    pub returns: Value,
    /// The state, with every key of the fixture's `expected` but
    /// `invalidates`.
    pub state: Map<String, Value>,
    /// Which readers the op invalidated, by `invalidates` key.
    pub invalidated: Map<String, Value>,
}

/// The fixture's name for a projection in `invalidates`.
#[must_use]
pub const fn invalidation_key(projection: Projection) -> &'static str {
    match projection {
        Projection::Pending => "pending",
        Projection::Inflight => "inflight",
        Projection::AckedThrough => "acked_through",
        Projection::Retry => "retry",
        Projection::Parked => "parked",
        Projection::Exhausted => "exhausted",
        Projection::Generation => "generation",
        Projection::Received => "received_through",
        Projection::Durable => "durable",
        Projection::PersistError => "persist_error",
    }
}

/// The observable state of a core, in the fixture's `expected` shape.
#[must_use]
pub fn state_of(core: &EgressCore<Value>) -> Map<String, Value> {
    let mut state = Map::new();
    state.insert("generation".into(), json!(core.generation()));
    state.insert("next_sequence".into(), json!(core.next_sequence()));
    state.insert("pending".into(), json!(core.pending().collect::<Vec<_>>()));
    state.insert("inflight".into(), json!(core.inflight().collect::<Vec<_>>()));
    state.insert("acked_through".into(), json!(core.acked_through()));
    state.insert("retry".into(), json!(core.retry()));
    let parked: Vec<Value> =
        core.parked().map(|p| parked_entry(p.sequence, p.attempt, p.backoff, p.due, p.dead)).collect();
    state.insert("parked".into(), Value::Array(parked));
    state.insert("exhausted".into(), json!(core.exhausted().collect::<Vec<_>>()));
    state.insert("received_through".into(), json!(core.received_through()));
    state.insert("durable_through".into(), json!(core.durable_through()));
    state.insert("unpersisted_len".into(), json!(core.unpersisted_len()));
    state.insert("generation_durable".into(), json!(core.generation_durable()));
    state.insert("persist_error".into(), json!(core.persist_error()));
    state.insert("gated_len".into(), json!(core.gated_len()));
    state
}

/// A parked record in the fixture's shape (`dead` only for a tombstone).
#[must_use]
pub fn parked_entry(
    sequence: Sequence,
    attempt: egress_core::Attempt,
    backoff: egress_core::Delay,
    due: Time,
    dead: Option<egress_core::DeadReason>,
) -> Value {
    let mut entry = json!({"sequence": sequence, "attempt": attempt, "backoff": backoff, "due": due});
    if let (Some(dead), Some(map)) = (dead, entry.as_object_mut()) {
        map.insert("dead".into(), json!(dead));
    }
    entry
}

/// Applies a fixture op to a core; returns the fixture-shaped return value
/// and the change set. Shells reuse the return shapes through
/// [`returns`].
pub fn apply_to_core(core: &mut EgressCore<Value>, op: &Op) -> (Value, egress_core::Changes) {
    match op {
        Op::Enqueue { payload } => {
            let t = core.enqueue(payload.clone());
            (returns::enqueue(t.outcome), t.changes)
        }
        Op::Claim { generation } => {
            let t = core.claim(Generation(*generation));
            (returns::claim(&t.outcome), t.changes)
        }
        Op::Ack { generation, through } => {
            let t = core.ack(Generation(*generation), Sequence(*through));
            (returns::ack(&t.outcome), t.changes)
        }
        Op::Received { generation, through } => {
            let t = core.received(Generation(*generation), Sequence(*through));
            (returns::received(&t.outcome), t.changes)
        }
        Op::Fail { .. } => {
            let a = op.fail_args().expect("invariant broken: a fail op has fail arguments");
            let t = core.fail(a.generation, a.sequence, a.kind, a.now, a.jitter);
            (returns::fail(&t.outcome), t.changes)
        }
        Op::RetryNow { generation, sequence } => {
            let t = core.retry_now(Generation(*generation), Sequence(*sequence));
            (returns::schedule("retry_action", &t.outcome), t.changes)
        }
        Op::HandleTimeout { now } => {
            let t = core.handle_timeout(Time(*now));
            (returns::handle_timeout(&t.outcome), t.changes)
        }
        Op::Requeue { generation, sequence } => {
            let t = core.requeue(Generation(*generation), Sequence(*sequence));
            (returns::schedule("requeue", &t.outcome), t.changes)
        }
        Op::Reconnect { generation } => {
            let t = core.reconnect(Generation(*generation));
            (returns::reconnect(&t.outcome), t.changes)
        }
        Op::PollReady => {
            let ready = core.poll_ready();
            let payloads: Vec<Value> = ready
                .as_ref()
                .map(|r| core.unwritten(r.appends.clone()).map(|(_, p)| p.clone()).collect())
                .unwrap_or_default();
            (returns::ready(ready.as_ref(), &payloads), egress_core::Changes::NONE)
        }
        Op::Persisted { epoch } => {
            let t = core.persisted(egress_core::Epoch(*epoch));
            (returns::persist(&t.outcome), t.changes)
        }
        Op::PersistFailed { epoch, reason } => {
            let t = core.persist_failed(egress_core::Epoch(*epoch), reason.clone());
            (returns::persist(&t.outcome), t.changes)
        }
        Op::Adopt { sequence, payload } => {
            let t = core.adopt(Sequence(*sequence), payload.clone());
            (returns::adopt(&t.outcome), t.changes)
        }
        Op::EnqueueAfter { payload, after } => {
            let t = core.enqueue_after(payload.clone(), egress_core::FlushEpoch(*after));
            (returns::enqueue(t.outcome), t.changes)
        }
        Op::Release { through } => {
            let t = core.release(egress_core::FlushEpoch(*through));
            (returns::release(t.outcome), t.changes)
        }
        Op::Rebase { appended } => {
            let t = core.rebase(returns::appended(appended));
            (returns::rebase(&t.outcome), t.changes)
        }
    }
}

/// The fixture shapes of the core's outcomes.
pub mod returns {
    use super::{
        AckOutcome, ClaimOutcome, FailOutcome, ReceivedOutcome, ReconnectOutcome, ScheduleOutcome, Sequence, Value,
        json,
    };

    /// `{"sequence": S}`
    #[must_use]
    pub fn enqueue(sequence: Sequence) -> Value {
        json!({"sequence": sequence})
    }

    /// The `claim` shapes.
    #[must_use]
    pub fn claim(outcome: &ClaimOutcome<'_, Value>) -> Value {
        match outcome {
            ClaimOutcome::Claimed(envelope) => json!({"claim": "claimed", "envelope": envelope}),
            ClaimOutcome::Empty => json!({"claim": "empty"}),
            ClaimOutcome::WindowFull => json!({"claim": "window_full"}),
            ClaimOutcome::Blocked { sequence } => json!({"claim": "blocked", "sequence": sequence}),
            ClaimOutcome::Isolating { probe } => json!({"claim": "isolating", "probe": probe}),
            ClaimOutcome::StaleGeneration { current } => json!({"claim": "stale_generation", "current": current}),
            ClaimOutcome::Unpersisted { sequence } => json!({"claim": "unpersisted", "sequence": sequence}),
            ClaimOutcome::Gated { sequence, epoch } => json!({"claim": "gated", "sequence": sequence, "epoch": epoch}),
            ClaimOutcome::GenerationUnpersisted { generation } => {
                json!({"claim": "generation_unpersisted", "generation": generation})
            }
        }
    }

    /// The `ack` shapes.
    #[must_use]
    pub fn ack(outcome: &AckOutcome) -> Value {
        match outcome {
            AckOutcome::Advanced { through } => json!({"ack": "advanced", "through": through}),
            AckOutcome::Unchanged { through } => json!({"ack": "unchanged", "through": through}),
            AckOutcome::Unsent { sent_through, .. } => json!({"ack": "unsent", "sent_through": sent_through}),
            AckOutcome::StaleGeneration { current } => json!({"ack": "stale_generation", "current": current}),
        }
    }

    /// The `received` shapes.
    #[must_use]
    pub fn received(outcome: &ReceivedOutcome) -> Value {
        match outcome {
            ReceivedOutcome::Recorded { through, moved } => {
                json!({"received": "recorded", "through": through, "moved": moved})
            }
            ReceivedOutcome::Unchanged { through } => json!({"received": "unchanged", "through": through}),
            ReceivedOutcome::Unsent { sent_through, .. } => {
                json!({"received": "unsent", "sent_through": sent_through})
            }
            ReceivedOutcome::StaleGeneration { current } => {
                json!({"received": "stale_generation", "current": current})
            }
        }
    }

    /// The `fail` shapes.
    #[must_use]
    pub fn fail(outcome: &FailOutcome) -> Value {
        match outcome {
            FailOutcome::Retrying(retry) => json!({"failure": "retrying", "retry": retry}),
            FailOutcome::Exhausted(retry) => json!({"failure": "exhausted", "retry": retry}),
            FailOutcome::UnknownSequence { .. } => json!({"failure": "unknown_sequence"}),
            FailOutcome::StaleGeneration { current } => json!({"failure": "stale_generation", "current": current}),
        }
    }

    /// The `retry_now` (tag `retry_action`) and `requeue` (tag `requeue`)
    /// shapes.
    #[must_use]
    pub fn schedule(tag: &str, outcome: &ScheduleOutcome) -> Value {
        match outcome {
            ScheduleOutcome::Scheduled { sequence } => json!({tag: "scheduled", "sequence": sequence}),
            ScheduleOutcome::UnknownSequence { .. } => json!({tag: "unknown_sequence"}),
            ScheduleOutcome::StaleGeneration { current } => json!({tag: "stale_generation", "current": current}),
        }
    }

    /// `{"scheduled": [S, ...]}`
    #[must_use]
    pub fn handle_timeout(scheduled: &[Sequence]) -> Value {
        json!({"scheduled": scheduled})
    }

    /// `{"ready": null}`, or the `Ready` with the payloads of its appends:
    /// `{"ready": {"epoch", "appends": [start, end], "payloads",
    /// "acked_through", "generation", "dead": [[S, {"reason", "held"} | null]],
    /// "must_sync"}}`.
    #[must_use]
    pub fn ready(ready: Option<&egress_core::Ready>, payloads: &[Value]) -> Value {
        let Some(r) = ready else { return json!({"ready": null}) };
        let dead: Vec<Value> =
            r.dead.iter().map(|(s, m)| json!([s, m.map(|m| json!({"reason": m.reason, "held": m.held}))])).collect();
        json!({"ready": {
            "epoch": r.epoch,
            "appends": [r.appends.start, r.appends.end],
            "payloads": payloads,
            "acked_through": r.acked_through,
            "generation": r.generation,
            "dead": dead,
            "must_sync": r.must_sync,
        }})
    }

    /// `{"released": K}`: how many records waited.
    #[must_use]
    pub fn release(waiting: usize) -> Value {
        json!({"released": waiting})
    }

    /// The `persisted` and `persist_failed` shapes.
    #[must_use]
    pub fn persist(outcome: &egress_core::PersistOutcome) -> Value {
        match outcome {
            egress_core::PersistOutcome::Recorded { durable_through } => {
                json!({"persist": "recorded", "durable_through": durable_through})
            }
            egress_core::PersistOutcome::UnknownEpoch { epoch } => json!({"persist": "unknown_epoch", "epoch": epoch}),
        }
    }

    /// The `adopt` shapes.
    #[must_use]
    pub fn adopt(outcome: &egress_core::AdoptOutcome) -> Value {
        match outcome {
            egress_core::AdoptOutcome::Adopted { sequence } => json!({"adopt": "adopted", "sequence": sequence}),
            egress_core::AdoptOutcome::OutOfOrder { expected, found } => {
                json!({"adopt": "out_of_order", "expected": expected, "found": found})
            }
            egress_core::AdoptOutcome::Unwritten { from } => json!({"adopt": "unwritten", "from": from}),
        }
    }

    /// A rebase op's records, as the core takes them.
    #[must_use]
    pub fn appended(appended: &[(u64, Value)]) -> Vec<(Sequence, Value)> {
        appended.iter().map(|(s, p)| (Sequence(*s), p.clone())).collect()
    }

    /// The `rebase` shapes.
    #[must_use]
    pub fn rebase(outcome: &egress_core::RebaseOutcome) -> Value {
        match outcome {
            egress_core::RebaseOutcome::Rebased { adopted, moved } => {
                json!({"rebase": "rebased", "adopted": adopted, "moved": moved})
            }
            egress_core::RebaseOutcome::OutOfOrder { expected, found } => {
                json!({"rebase": "out_of_order", "expected": expected, "found": found})
            }
            egress_core::RebaseOutcome::Writing => json!({"rebase": "writing"}),
            egress_core::RebaseOutcome::NotJournaled => json!({"rebase": "not_journaled"}),
        }
    }

    /// The `reconnect` shapes.
    #[must_use]
    pub fn reconnect(outcome: &ReconnectOutcome) -> Value {
        match outcome {
            ReconnectOutcome::Advanced { generation, replayed, dead } => {
                json!({"reconnect": "advanced", "generation": generation, "replayed": replayed, "dead": dead})
            }
            ReconnectOutcome::Unchanged => json!({"reconnect": "unchanged"}),
            ReconnectOutcome::StaleGeneration { current } => {
                json!({"reconnect": "stale_generation", "current": current})
            }
        }
    }
}

/// The pure core, with invalidations read off its change sets.
#[derive(Clone, Copy, Debug, Default)]
pub struct CoreTarget;

struct CoreSession {
    core: EgressCore<Value>,
}

impl Target for CoreTarget {
    fn name(&self) -> &'static str {
        "core"
    }

    fn lanes(
        &self,
        fixture: &crate::lanes::LanesFixture,
    ) -> Option<Result<Box<dyn crate::lanes::LanesSession>, String>> {
        Some(Ok(Box::new(crate::lanes::CoreLanes::new(fixture))))
    }

    fn relay(
        &self,
        fixture: &crate::relay::RelayFixture,
    ) -> Option<Result<Box<dyn crate::relay::RelaySession>, String>> {
        Some(fixture.core())
    }

    fn latest(&self) -> Option<crate::latest::LatestStart> {
        Some(crate::latest::on_core)
    }

    fn start(&self, fixture: &Fixture) -> Result<Box<dyn Session>, String> {
        Ok(Box::new(CoreSession { core: fixture.core()? }))
    }
}

impl Session for CoreSession {
    fn apply(&mut self, op: &Op) -> Result<Observation, String> {
        let (returns, changes) = apply_to_core(&mut self.core, op);
        let invalidated = Projection::ALL
            .iter()
            .map(|p| (invalidation_key(*p).to_owned(), Value::Bool(changes.contains(*p))))
            .collect();
        Ok(Observation { returns, state: state_of(&self.core), invalidated })
    }
}
