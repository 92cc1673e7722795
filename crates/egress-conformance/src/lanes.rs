//! The lanes fixtures (`"kind": "Lanes"`, `conformance/lanes/`): several
//! lanes of one `Lanes`, each op of the egress corpus naming its lane, and
//! the ops only lanes have (`complete`). The schema is in
//! `conformance/README.md`, "The lanes fixtures".
//!
//! The `core` target runs them on `egress_core::Lanes`, the shell targets
//! on the lanes cell of each flavour (`lanes_shell.rs`).

use std::cmp::Ordering as CmpOrdering;
use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::Path;

use egress_core::{
    CompleteOutcome, Enqueued, FlushEpoch, Generation, LaneKey, LaneKind, Lanes, LanesClaim, LanesPolicy,
    LanesReconnect, Projection, ReconnectOutcome, Sequence, Time, TooManyLanes,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::fixture::{FixtureError, FixturePolicy, Op, decode_op};
use crate::runner::{RawStep, Verdict, judge_step};
use crate::target::{invalidation_key, returns, state_of};

/// A lane of a fixture: its name, and the kind the fixture declares for it.
/// Lanes compare by name.
#[derive(Clone, Debug)]
pub struct FixtureLane {
    pub(crate) name: String,
    kind: LaneKind,
}

impl PartialEq for FixtureLane {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for FixtureLane {}

impl PartialOrd for FixtureLane {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

impl Ord for FixtureLane {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        self.name.cmp(&other.name)
    }
}

impl LaneKey for FixtureLane {
    fn kind(&self) -> LaneKind {
        self.kind
    }
}

/// A lane kind as a fixture spells it.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum KindName {
    Serial,
    Strict,
    Unordered(NonZeroUsize),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLanesFixture {
    description: String,
    kind: String,
    model: String,
    generation: u64,
    policy: FixturePolicy,
    max_lanes: usize,
    #[serde(default)]
    inflight_cap: Option<NonZeroUsize>,
    lanes: BTreeMap<String, KindName>,
    steps: Vec<RawStep>,
}

/// One op of a lanes fixture.
#[derive(Clone, Debug, PartialEq)]
pub enum LanesOp {
    /// An op of the egress corpus, on the lane named (for the ops that
    /// act on one lane) or on every lane.
    Egress {
        /// The lane, for the ops on one lane.
        lane: Option<FixtureLaneName>,
        /// The op.
        op: Op,
    },
    /// `complete(generation, lane, sequence)`.
    Complete {
        /// The caller's generation.
        generation: u64,
        /// The lane.
        lane: FixtureLaneName,
        /// The completed sequence.
        sequence: u64,
    },
}

/// A lane named by an op.
pub type FixtureLaneName = String;

/// One step: the op, its return, and what must hold after it.
#[derive(Clone, Debug)]
pub struct LanesStep {
    /// The op.
    pub op: LanesOp,
    /// The op as written, for reports.
    pub text: Value,
    /// The exact return value.
    pub returns: Value,
    /// The keys asserted after the op.
    pub expected: Map<String, Value>,
}

/// A parsed lanes fixture.
#[derive(Clone, Debug)]
pub struct LanesFixture {
    /// What it checks.
    pub description: String,
    /// The generation the lanes start at.
    pub generation: u64,
    /// The lanes' policy.
    pub policy: LanesPolicy,
    /// Every lane the fixture may name, by name.
    pub lanes: BTreeMap<String, FixtureLane>,
    /// The steps.
    pub steps: Vec<LanesStep>,
}

/// The ops on one lane (they need `lane`); the others act on every lane.
const LANE_OPS: [&str; 8] = ["enqueue", "enqueue_after", "ack", "received", "fail", "retry_now", "requeue", "complete"];
/// The ops on every lane.
const ALL_LANES_OPS: [&str; 4] = ["claim", "handle_timeout", "release", "reconnect"];
/// The keys `expected` may hold.
pub const LANES_STATE_KEYS: [&str; 12] = [
    "generation",
    "next_ordinal",
    "lanes",
    "pending_len",
    "inflight_len",
    "outstanding",
    "parked_len",
    "exhausted_len",
    "gated_len",
    "poll_timeout",
    "lane_states",
    "invalidates",
];

impl LanesFixture {
    /// Parses and validates a lanes fixture; `file` is only used in errors.
    ///
    /// # Errors
    /// [`FixtureError`] naming the file and the JSON path at fault.
    pub fn from_value(file: &Path, doc: &Value) -> Result<Self, FixtureError> {
        let err = |path: String, message: String| FixtureError { file: file.to_path_buf(), path, message };
        let raw: RawLanesFixture =
            serde_path_to_error::deserialize(doc).map_err(|e| err(e.path().to_string(), e.into_inner().to_string()))?;
        if raw.kind != "Lanes" || raw.model != "Lanes" {
            return Err(err(
                "kind".into(),
                format!("expected kind and model \"Lanes\", got {:?}, {:?}", raw.kind, raw.model),
            ));
        }
        let base = raw.policy.to_policy().map_err(|e| err("policy".into(), e.to_string()))?;
        let mut policy = LanesPolicy::new(base, raw.max_lanes).map_err(|e| err("max_lanes".into(), e.to_string()))?;
        if let Some(cap) = raw.inflight_cap {
            policy = policy.inflight_cap(cap);
        }
        let lanes: BTreeMap<String, FixtureLane> = raw
            .lanes
            .into_iter()
            .map(|(name, kind)| {
                let kind = match kind {
                    KindName::Serial => LaneKind::Serial,
                    KindName::Strict => LaneKind::Strict,
                    KindName::Unordered(n) => LaneKind::Unordered(n),
                };
                (name.clone(), FixtureLane { name, kind })
            })
            .collect();
        if raw.steps.is_empty() {
            return Err(err("steps".into(), "no steps: a fixture must assert something".into()));
        }
        let mut steps = Vec::with_capacity(raw.steps.len());
        for (i, step) in raw.steps.into_iter().enumerate() {
            let at = |path: &str| format!("steps[{i}].{path}");
            let op =
                decode_lanes_op(&step.op, &lanes).map_err(|(path, message)| err(at(&format!("op{path}")), message))?;
            if let Some(key) = step.expected.keys().find(|k| !LANES_STATE_KEYS.contains(&k.as_str())) {
                return Err(err(
                    at(&format!("expected.{key}")),
                    format!("unknown key; expected one of {LANES_STATE_KEYS:?}"),
                ));
            }
            if let Some(Value::Object(states)) = step.expected.get("lane_states")
                && let Some(name) = states.keys().find(|n| !lanes.contains_key(*n))
            {
                return Err(err(
                    at(&format!("expected.lane_states.{name}")),
                    "a lane the fixture does not declare".into(),
                ));
            }
            steps.push(LanesStep { op, text: step.op, returns: step.returns, expected: step.expected });
        }
        Ok(Self { description: raw.description, generation: raw.generation, policy, lanes, steps })
    }
}

fn decode_lanes_op(value: &Value, lanes: &BTreeMap<String, FixtureLane>) -> Result<LanesOp, (String, String)> {
    let Value::Object(map) = value else {
        return Err((String::new(), "expected an object with a \"type\"".into()));
    };
    let mut map = map.clone();
    let ty = map.get("type").and_then(Value::as_str).unwrap_or_default().to_owned();
    let lane = match map.remove("lane") {
        None => None,
        Some(Value::String(name)) if lanes.contains_key(&name) => Some(name),
        Some(other) => return Err((".lane".into(), format!("{other} is not a lane the fixture declares"))),
    };
    let on_one_lane = LANE_OPS.contains(&ty.as_str());
    if !on_one_lane && !ALL_LANES_OPS.contains(&ty.as_str()) {
        return Err((
            ".type".into(),
            format!("{ty:?} is not a lanes op; expected one of {LANE_OPS:?} or {ALL_LANES_OPS:?}"),
        ));
    }
    match (on_one_lane, &lane) {
        (true, None) => return Err((".lane".into(), format!("{ty:?} acts on one lane: name it"))),
        (false, Some(_)) => return Err((".lane".into(), format!("{ty:?} acts on every lane: it takes no lane"))),
        _ => {}
    }
    if ty == "complete" {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Complete {
            #[serde(rename = "type")]
            _ty: String,
            generation: u64,
            sequence: u64,
        }
        let c: Complete = serde_json::from_value(Value::Object(map)).map_err(|e| (String::new(), e.to_string()))?;
        let lane = lane.expect("checked above: complete names its lane");
        return Ok(LanesOp::Complete { generation: c.generation, lane, sequence: c.sequence });
    }
    Ok(LanesOp::Egress { lane, op: decode_op(Value::Object(map))? })
}

/// One lanes fixture's run on one target.
pub trait LanesSession {
    /// Applies `op`; returns its fixture-shaped return value and the state
    /// after it, with every key of [`LANES_STATE_KEYS`].
    ///
    /// # Errors
    /// A description of a failure of the target itself (not a mismatch).
    fn apply(&mut self, op: &LanesOp) -> Result<(Value, Map<String, Value>), String>;
}

/// The `core` target's session: a [`Lanes`], whose change sets say what
/// each op invalidated.
pub(crate) struct CoreLanes {
    lanes: Lanes<FixtureLane, Value>,
    fixture: LanesFixture,
}

impl CoreLanes {
    pub(crate) fn new(fixture: &LanesFixture) -> Self {
        let lanes = Lanes::with_generation(fixture.policy, Generation(fixture.generation));
        CoreLanes { lanes, fixture: fixture.clone() }
    }
}

impl LanesSession for CoreLanes {
    fn apply(&mut self, op: &LanesOp) -> Result<(Value, Map<String, Value>), String> {
        let (got, changes) = apply(&mut self.lanes, &self.fixture, op)?;
        Ok((got, state(&self.lanes, changes)))
    }
}

/// Runs every step of `fixture` on a fresh [`Lanes`] (the `core` target).
#[must_use]
pub fn run_lanes_fixture(fixture: &LanesFixture) -> Verdict {
    run_lanes_session(fixture, &mut CoreLanes::new(fixture))
}

/// Runs every step of `fixture` on `session`.
#[must_use]
pub fn run_lanes_session(fixture: &LanesFixture, session: &mut dyn LanesSession) -> Verdict {
    for (i, step) in fixture.steps.iter().enumerate() {
        let (got, state) = match session.apply(&step.op) {
            Ok(applied) => applied,
            Err(message) => return Verdict::TargetError { step: Some(i), message },
        };
        // `lane_states` and `invalidates` assert the keys they name (a
        // lane's keys, each exactly); every other key is asserted whole.
        let named = [("lane_states", 2), ("invalidates", 1)];
        if let Some(verdict) = judge_step(i, &step.text, (&step.returns, &got), (&step.expected, &state), &named) {
            return verdict;
        }
    }
    Verdict::Passed { steps: fixture.steps.len() }
}

/// The observable state after an op, with what it invalidated.
pub(crate) fn state(lanes: &Lanes<FixtureLane, Value>, changes: egress_core::Changes) -> Map<String, Value> {
    let mut s = Map::new();
    s.insert("generation".into(), json!(lanes.generation()));
    s.insert("next_ordinal".into(), json!(lanes.next_ordinal()));
    s.insert("lanes".into(), json!(lanes.lanes().map(|(k, _)| k.name.clone()).collect::<Vec<_>>()));
    s.insert("pending_len".into(), json!(lanes.pending_len()));
    s.insert("inflight_len".into(), json!(lanes.inflight_len()));
    s.insert("outstanding".into(), json!(lanes.outstanding()));
    s.insert("parked_len".into(), json!(lanes.parked_len()));
    s.insert("exhausted_len".into(), json!(lanes.exhausted_len()));
    s.insert("gated_len".into(), json!(lanes.gated_len()));
    s.insert("poll_timeout".into(), json!(lanes.poll_timeout()));
    let states: Map<String, Value> =
        lanes.lanes().map(|(k, core)| (k.name.clone(), Value::Object(state_of(core)))).collect();
    s.insert("lane_states".into(), Value::Object(states));
    let invalidated: Map<String, Value> =
        Projection::ALL.iter().map(|p| (invalidation_key(*p).to_owned(), Value::Bool(changes.contains(*p)))).collect();
    s.insert("invalidates".into(), Value::Object(invalidated));
    s
}

pub(crate) fn lane_list<X: serde::Serialize>(touched: &[(FixtureLane, X)]) -> Value {
    Value::Array(touched.iter().map(|(k, x)| json!([k.name, x])).collect())
}

pub(crate) fn enqueued<T>(outcome: &Result<Enqueued, TooManyLanes<T>>) -> Value {
    match outcome {
        Ok(e) => json!({"ordinal": e.ordinal, "sequence": e.sequence, "new_lane": e.new_lane}),
        Err(refused) => json!({"refused": "too_many_lanes", "limit": refused.limit}),
    }
}

pub(crate) fn claimed<T: serde::Serialize>(outcome: &LanesClaim<'_, FixtureLane, T>) -> Value {
    match outcome {
        LanesClaim::Claimed(e) => {
            json!({"claim": "claimed", "lane": e.lane.name, "ordinal": e.ordinal, "envelope": e.envelope})
        }
        LanesClaim::Empty => json!({"claim": "empty"}),
        LanesClaim::Waiting => json!({"claim": "waiting"}),
        LanesClaim::Full { cap } => json!({"claim": "full", "cap": cap}),
        LanesClaim::StaleGeneration { current } => json!({"claim": "stale_generation", "current": current}),
    }
}

pub(crate) fn completed(outcome: &CompleteOutcome) -> Value {
    match outcome {
        CompleteOutcome::Advanced { through } => json!({"complete": "advanced", "through": through}),
        CompleteOutcome::Waiting => json!({"complete": "waiting"}),
        CompleteOutcome::Unchanged => json!({"complete": "unchanged"}),
        CompleteOutcome::UnknownSequence { .. } => json!({"complete": "unknown_sequence"}),
        CompleteOutcome::StaleGeneration { current } => json!({"complete": "stale_generation", "current": current}),
    }
}

pub(crate) fn reconnected(outcome: &LanesReconnect<FixtureLane>) -> Value {
    returns::reconnect(&match outcome {
        LanesReconnect::Advanced { generation, replayed, dead, .. } => {
            ReconnectOutcome::Advanced { generation: *generation, replayed: *replayed, dead: *dead }
        }
        LanesReconnect::Unchanged => ReconnectOutcome::Unchanged,
        LanesReconnect::StaleGeneration { current } => ReconnectOutcome::StaleGeneration { current: *current },
    })
}

fn apply(
    lanes: &mut Lanes<FixtureLane, Value>,
    fixture: &LanesFixture,
    op: &LanesOp,
) -> Result<(Value, egress_core::Changes), String> {
    let key = |name: &Option<String>| -> Result<FixtureLane, String> {
        let name = name.as_ref().ok_or("an op on one lane without its lane")?;
        fixture.lanes.get(name).cloned().ok_or_else(|| format!("undeclared lane {name:?}"))
    };
    let (lane, lane_op) = match op {
        LanesOp::Complete { generation, lane, sequence } => {
            let t = lanes.complete(Generation(*generation), &key(&Some(lane.clone()))?, Sequence(*sequence));
            return Ok((completed(&t.outcome), t.changes));
        }
        LanesOp::Egress { lane, op } => (lane, op),
    };
    Ok(match lane_op {
        Op::Enqueue { payload } | Op::EnqueueAfter { payload, .. } => {
            let k = key(lane)?;
            let t = match lane_op {
                Op::EnqueueAfter { after, .. } => lanes.enqueue_after(k, payload.clone(), FlushEpoch(*after)),
                _ => lanes.enqueue(k, payload.clone()),
            };
            (enqueued(&t.outcome), t.changes)
        }
        Op::Claim { generation } => {
            let t = lanes.claim(Generation(*generation));
            (claimed(&t.outcome), t.changes)
        }
        Op::Ack { generation: g, through } => {
            let t = lanes.ack(Generation(*g), &key(lane)?, Sequence(*through));
            (returns::ack(&t.outcome), t.changes)
        }
        Op::Received { generation: g, through } => {
            let t = lanes.received(Generation(*g), &key(lane)?, Sequence(*through));
            (returns::received(&t.outcome), t.changes)
        }
        Op::Fail { .. } => {
            let a = lane_op.fail_args().ok_or("a fail op without fail arguments")?;
            let t = lanes.fail(a.generation, &key(lane)?, a.sequence, a.kind, a.now, a.jitter);
            (returns::fail(&t.outcome), t.changes)
        }
        Op::RetryNow { generation: g, sequence } => {
            let t = lanes.retry_now(Generation(*g), &key(lane)?, Sequence(*sequence));
            (returns::schedule("retry_action", &t.outcome), t.changes)
        }
        Op::Requeue { generation: g, sequence } => {
            let t = lanes.requeue(Generation(*g), &key(lane)?, Sequence(*sequence));
            (returns::schedule("requeue", &t.outcome), t.changes)
        }
        Op::HandleTimeout { now } => {
            let t = lanes.handle_timeout(Time(*now));
            (json!({"scheduled": lane_list(&t.outcome)}), t.changes)
        }
        Op::Release { through } => {
            let t = lanes.release(FlushEpoch(*through));
            (json!({"released": lane_list(&t.outcome)}), t.changes)
        }
        Op::Reconnect { generation: g } => {
            let t = lanes.reconnect(Generation(*g));
            (reconnected(&t.outcome), t.changes)
        }
        other => return Err(format!("not a lanes op: {other:?}")),
    })
}
