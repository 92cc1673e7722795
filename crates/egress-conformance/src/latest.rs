//! The latest-value projection fixtures (`"kind":
//! "LatestDurableProjection"`, `conformance/latest/`, and the seed
//! design's `latest_durable_projection.json`): scenarios of
//! `egress_core::Latest`'s ops (upsert, claim, ack, retryable failure,
//! reconnect) with each key's state after every op. The schema is in
//! `conformance/README.md`, "The latest-value projection fixtures".
//!
//! The `core` target runs them on `Latest`, the shell targets on the
//! latest cell of each flavour, whose invalidations are read off its
//! per-key readers (a reader runs again exactly when its key's projection
//! changed).

use std::collections::BTreeSet;
use std::num::NonZeroUsize;
use std::path::Path;

use egress_core::{
    Applied, Delay, Failed, Generation, JitterSample, KeyChanges, KeyProjection, Latest, LatestClaim, LatestReconnect,
    Policy, Time, TooManyKeys, Upserted, Version,
};
use egress_reactive::{CellOptions, Flavor, KeyReaders, LatestCellOf, LatestFlavor, ManualClock};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::fixture::FixtureError;
use crate::runner::{RawStep, Verdict, judge_step};

/// The keys `expected` may hold.
pub const LATEST_STATE_KEYS: [&str; 3] = ["generation", "entries", "invalidates"];

/// A key's projections, as `invalidates` names them.
const PROJECTIONS: [(&str, KeyProjection); 4] = [
    ("desired", KeyProjection::Desired),
    ("inflight", KeyProjection::Inflight),
    ("durable_through", KeyProjection::DurableThrough),
    ("backoff", KeyProjection::Backoff),
];

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackoff {
    base: u64,
    ceiling: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLatestFixture {
    description: String,
    kind: String,
    model: String,
    #[serde(default)]
    backoff: Option<RawBackoff>,
    #[serde(default)]
    max_keys: Option<NonZeroUsize>,
    scenarios: Vec<RawScenario>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    id: String,
    generation: u64,
    steps: Vec<RawStep>,
}

/// One op of a latest fixture.
#[derive(Clone, Debug, PartialEq)]
pub enum LatestOp {
    /// `upsert(key, epoch, value)`.
    Upsert {
        /// The key.
        key: String,
        /// Its version (the design's epoch).
        epoch: u64,
        /// The value.
        value: Value,
    },
    /// `claim(generation, key)`.
    Claim {
        /// The key.
        key: String,
        /// The caller's generation.
        generation: u64,
    },
    /// `ack_applied(generation, key, epoch)`.
    Ack {
        /// The key.
        key: String,
        /// The caller's generation.
        generation: u64,
        /// The version applied.
        epoch: u64,
    },
    /// `fail_retryable(generation, key, epoch, now, retry_after)`.
    Fail {
        /// The key.
        key: String,
        /// The caller's generation.
        generation: u64,
        /// The version that failed.
        epoch: u64,
        /// When.
        now: u64,
        /// The sink's own "retry after", in ticks.
        retry_after: Option<u64>,
    },
    /// `handle_timeout(now)`.
    HandleTimeout {
        /// When.
        now: u64,
    },
    /// `reconnect(generation)`.
    Reconnect {
        /// The new generation.
        generation: u64,
    },
}

/// One step: the op, its return, and what must hold after it.
#[derive(Clone, Debug)]
pub struct LatestStep {
    /// The op.
    pub op: LatestOp,
    /// The op as the fixture spells it (for reports).
    pub text: Value,
    /// What the op returns.
    pub returns: Value,
    /// What must hold after it.
    pub expected: Map<String, Value>,
}

/// A scenario: a fresh projection at a generation, and its steps.
#[derive(Clone, Debug)]
pub struct LatestScenario {
    /// Its name.
    pub id: String,
    /// The generation the projection starts at.
    pub generation: u64,
    /// The steps.
    pub steps: Vec<LatestStep>,
}

/// A parsed latest fixture.
#[derive(Clone, Debug)]
pub struct LatestFixture {
    /// What it shows.
    pub description: String,
    /// The retry policy (the backoff's base and ceiling, no jitter).
    pub policy: Policy,
    /// Whether the fixture has a clock: without `backoff` (the design's
    /// fixtures), every backoff has ended before each op.
    pub clocked: bool,
    /// The most keys the projection holds.
    pub max_keys: NonZeroUsize,
    /// The scenarios, each on a fresh projection.
    pub scenarios: Vec<LatestScenario>,
}

/// The keys a design's fixture may hold: more than any fixture names.
const DESIGN_MAX_KEYS: NonZeroUsize = NonZeroUsize::new(1024).expect("not zero");

impl LatestFixture {
    /// Parses and validates a latest fixture; `file` is only used in
    /// errors.
    ///
    /// # Errors
    /// [`FixtureError`] naming the file and the JSON path at fault.
    pub fn from_value(file: &Path, doc: &Value) -> Result<Self, FixtureError> {
        let err = |path: String, message: String| FixtureError { file: file.to_path_buf(), path, message };
        let raw: RawLatestFixture =
            serde_path_to_error::deserialize(doc).map_err(|e| err(e.path().to_string(), e.into_inner().to_string()))?;
        if raw.kind != "LatestDurableProjection" || raw.model != "LatestDurableProjectionCore" {
            return Err(err(
                "kind".into(),
                format!(
                    "expected kind \"LatestDurableProjection\" and model \"LatestDurableProjectionCore\", got {:?}, {:?}",
                    raw.kind, raw.model
                ),
            ));
        }
        let policy = match raw.backoff {
            Some(b) => Policy::builder()
                .retry_base(Delay(b.base))
                .retry_ceiling(Delay(b.ceiling))
                .jitter(0.0)
                .build()
                .map_err(|e| err("backoff".into(), e.to_string()))?,
            None => Policy::default(),
        };
        if raw.scenarios.is_empty() {
            return Err(err("scenarios".into(), "no scenarios: a fixture must assert something".into()));
        }
        let mut scenarios = Vec::with_capacity(raw.scenarios.len());
        for (s, scenario) in raw.scenarios.into_iter().enumerate() {
            if scenario.steps.is_empty() {
                return Err(err(format!("scenarios[{s}].steps"), "no steps".into()));
            }
            let mut steps = Vec::with_capacity(scenario.steps.len());
            for (i, step) in scenario.steps.into_iter().enumerate() {
                let at = |path: &str| format!("scenarios[{s}].steps[{i}].{path}");
                let op = decode_op(&step.op, raw.backoff.is_some())
                    .map_err(|(path, message)| err(at(&format!("op{path}")), message))?;
                if let Some(key) = step.expected.keys().find(|k| !LATEST_STATE_KEYS.contains(&k.as_str())) {
                    return Err(err(
                        at(&format!("expected.{key}")),
                        format!("unknown key; expected one of {LATEST_STATE_KEYS:?}"),
                    ));
                }
                if let Some(Value::Object(keys)) = step.expected.get("invalidates") {
                    for (key, flags) in keys {
                        let Value::Object(flags) = flags else {
                            return Err(err(at(&format!("expected.invalidates.{key}")), "expected an object".into()));
                        };
                        if let Some(name) = flags.keys().find(|n| PROJECTIONS.iter().all(|(p, _)| p != n)) {
                            return Err(err(
                                at(&format!("expected.invalidates.{key}.{name}")),
                                "not one of desired, inflight, durable_through, backoff".into(),
                            ));
                        }
                    }
                }
                steps.push(LatestStep { op, text: step.op, returns: step.returns, expected: step.expected });
            }
            scenarios.push(LatestScenario { id: scenario.id, generation: scenario.generation, steps });
        }
        Ok(LatestFixture {
            description: raw.description,
            policy,
            clocked: raw.backoff.is_some(),
            max_keys: raw.max_keys.unwrap_or(DESIGN_MAX_KEYS),
            scenarios,
        })
    }

    /// Every key an op of the scenario names, in key order.
    fn keys(scenario: &LatestScenario) -> BTreeSet<String> {
        scenario
            .steps
            .iter()
            .filter_map(|s| match &s.op {
                LatestOp::Upsert { key, .. }
                | LatestOp::Claim { key, .. }
                | LatestOp::Ack { key, .. }
                | LatestOp::Fail { key, .. } => Some(key.clone()),
                LatestOp::HandleTimeout { .. } | LatestOp::Reconnect { .. } => None,
            })
            .collect()
    }
}

fn decode_op(value: &Value, clocked: bool) -> Result<LatestOp, (String, String)> {
    let Value::Object(map) = value else {
        return Err((String::new(), "expected an object with a \"type\"".into()));
    };
    let ty = map.get("type").and_then(Value::as_str).unwrap_or_default();
    let allowed: &[&str] = match ty {
        "upsert_desired" => &["type", "key", "epoch", "value"],
        "claim" => &["type", "key", "generation"],
        "ack_applied" => &["type", "key", "generation", "epoch"],
        "fail_retryable" => &["type", "key", "generation", "epoch", "now", "retry_after"],
        "handle_timeout" => &["type", "now"],
        "reconnect" => &["type", "generation"],
        _ => {
            return Err((
                ".type".into(),
                format!(
                    "{ty:?} is not a latest op: upsert_desired, claim, ack_applied, fail_retryable, handle_timeout, reconnect"
                ),
            ));
        }
    };
    if let Some(key) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err((format!(".{key}"), format!("unknown field of {ty:?}")));
    }
    let num = |name: &str| {
        map.get(name).and_then(Value::as_u64).ok_or_else(|| (format!(".{name}"), "expected a number".to_owned()))
    };
    let key = || {
        map.get("key")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| (".key".to_owned(), "expected a string".to_owned()))
    };
    Ok(match ty {
        "upsert_desired" => LatestOp::Upsert {
            key: key()?,
            epoch: num("epoch")?,
            value: map.get("value").cloned().ok_or((".value".to_owned(), "missing".to_owned()))?,
        },
        "claim" => LatestOp::Claim { key: key()?, generation: num("generation")? },
        "ack_applied" => LatestOp::Ack { key: key()?, generation: num("generation")?, epoch: num("epoch")? },
        "fail_retryable" => {
            // A fixture with a clock says when; the design's has none.
            let now = if clocked { num("now")? } else { map.get("now").and_then(Value::as_u64).unwrap_or(0) };
            let retry_after = match map.get("retry_after") {
                None => None,
                Some(v) => Some(v.as_u64().ok_or((".retry_after".to_owned(), "expected a number".to_owned()))?),
            };
            LatestOp::Fail { key: key()?, generation: num("generation")?, epoch: num("epoch")?, now, retry_after }
        }
        "handle_timeout" => LatestOp::HandleTimeout { now: num("now")? },
        _ => LatestOp::Reconnect { generation: num("generation")? },
    })
}

// ----- returns --------------------------------------------------------

fn upserted(outcome: &Result<Upserted, TooManyKeys<Value>>) -> Value {
    match outcome {
        Ok(Upserted::Accepted { .. }) => json!({"upsert": "accepted"}),
        Ok(Upserted::Unchanged) => json!({"upsert": "unchanged"}),
        Ok(Upserted::AlreadyDurable { durable_through }) => {
            json!({"upsert": "already_durable", "durable_through": durable_through.0})
        }
        Ok(Upserted::StaleVersion { current }) => json!({"upsert": "stale_epoch", "current": current.0}),
        Ok(Upserted::VersionConflict { .. }) => json!({"upsert": "epoch_conflict"}),
        Err(refused) => json!({"upsert": "too_many_keys", "limit": refused.limit}),
    }
}

fn claimed(outcome: &LatestClaim<'_, String, Value>) -> Value {
    match outcome {
        LatestClaim::Claimed(e) => json!({"claim": "claimed", "envelope": {
            "generation": e.generation.0, "key": e.key, "epoch": e.version.0, "value": e.value,
        }}),
        LatestClaim::Empty => json!({"claim": "empty"}),
        LatestClaim::Busy { .. } => json!({"claim": "busy"}),
        LatestClaim::Backoff { until } => json!({"claim": "backoff", "until": until.0}),
        LatestClaim::Unwritten => json!({"claim": "unwritten"}),
        LatestClaim::StaleGeneration { current } => json!({"claim": "stale_generation", "current": current.0}),
    }
}

fn applied(outcome: &Applied) -> Value {
    match outcome {
        Applied::Advanced { durable_through } => json!({"ack": "advanced", "durable_through": durable_through.0}),
        Applied::Unchanged => json!({"ack": "unchanged"}),
        Applied::UnknownVersion { .. } => json!({"ack": "unknown_epoch"}),
        Applied::StaleGeneration { current } => json!({"ack": "stale_generation", "current": current.0}),
    }
}

/// A failure's return: `retry_at` only where the fixture has a clock (the
/// design's failure has no backoff).
fn failed(outcome: &Failed, clocked: bool) -> Value {
    let with = |tag: &str, at: Time| {
        if clocked { json!({"failure": tag, "retry_at": at.0}) } else { json!({"failure": tag}) }
    };
    match outcome {
        Failed::Pending { retry_at } => with("pending", *retry_at),
        Failed::Superseded { retry_at } => with("superseded", *retry_at),
        Failed::UnknownVersion { .. } => json!({"failure": "unknown_epoch"}),
        Failed::StaleGeneration { current } => json!({"failure": "stale_generation", "current": current.0}),
    }
}

fn reconnected(outcome: &LatestReconnect<String>) -> Value {
    match outcome {
        LatestReconnect::Advanced { generation, requeued, superseded, .. } => json!({
            "reconnect": "advanced", "generation": generation.0, "requeued": requeued, "superseded": superseded,
        }),
        LatestReconnect::Unchanged => json!({"reconnect": "unchanged"}),
        LatestReconnect::StaleGeneration { current } => json!({"reconnect": "stale_generation", "current": current.0}),
    }
}

/// Every key's state, in key order.
fn entries(latest: &Latest<String, Value>, clocked: bool) -> Value {
    Value::Array(
        latest
            .keys()
            .map(|k| {
                let mut e = json!({
                    "key": k,
                    "desired": latest.desired(k).map(|(v, x)| json!({"epoch": v.0, "value": x})),
                    "inflight": latest.inflight(k).map(|(g, v, x)| json!({"generation": g.0, "key": k, "epoch": v.0, "value": x})),
                    "durable_through": latest.durable_through(k).map(|v| v.0),
                });
                if clocked {
                    e["backoff"] = json!(latest.backoff(k).map(|t| t.0));
                }
                e
            })
            .collect(),
    )
}

/// One scenario's run on a target.
pub trait LatestSession {
    /// Applies `op`: its return, and the state after it (`generation`,
    /// `entries`, `invalidates`).
    ///
    /// # Errors
    /// A failure of the target itself (not a mismatch).
    fn apply(&mut self, op: &LatestOp) -> Result<(Value, Map<String, Value>), String>;
}

/// A starter of one scenario's session on a target.
pub type LatestStart = fn(&LatestFixture, &LatestScenario) -> Box<dyn LatestSession>;

struct CoreLatest {
    latest: Latest<String, Value>,
    clocked: bool,
}

impl CoreLatest {
    fn start(fixture: &LatestFixture, scenario: &LatestScenario) -> Box<dyn LatestSession> {
        let latest = Latest::with_generation(fixture.policy, fixture.max_keys, Generation(scenario.generation));
        Box::new(CoreLatest { latest, clocked: fixture.clocked })
    }
}

/// The changes as `invalidates` spells them: each touched key, each of its
/// projections.
fn flags(touched: &[(String, KeyChanges)]) -> Value {
    let mut m = Map::new();
    for (key, changes) in touched {
        let e = m.entry(key.clone()).or_insert_with(|| json!({}));
        for (name, p) in PROJECTIONS {
            let was = e.get(name).and_then(Value::as_bool).unwrap_or(false);
            e[name] = json!(was || changes.contains(p));
        }
    }
    Value::Object(m)
}

impl LatestSession for CoreLatest {
    fn apply(&mut self, op: &LatestOp) -> Result<(Value, Map<String, Value>), String> {
        let l = &mut self.latest;
        if !self.clocked {
            // The design has no backoff: every one has ended.
            let _ = l.handle_timeout(Time(u64::MAX));
        }
        let (returns, touched) = match op {
            LatestOp::Upsert { key, epoch, value } => {
                let t = l.upsert(key.clone(), Version(*epoch), value.clone());
                (upserted(&t.outcome), vec![(key.clone(), t.changes)])
            }
            LatestOp::Claim { key, generation } => {
                let t = l.claim(Generation(*generation), key);
                (claimed(&t.outcome), vec![(key.clone(), t.changes)])
            }
            LatestOp::Ack { key, generation, epoch } => {
                let t = l.ack_applied(Generation(*generation), key, Version(*epoch));
                (applied(&t.outcome), vec![(key.clone(), t.changes)])
            }
            LatestOp::Fail { key, generation, epoch, now, retry_after } => {
                let t = l.fail_retryable(
                    Generation(*generation),
                    key,
                    Version(*epoch),
                    Time(*now),
                    retry_after.map(Delay),
                    JitterSample::ZERO,
                );
                (failed(&t.outcome, self.clocked), vec![(key.clone(), t.changes)])
            }
            LatestOp::HandleTimeout { now } => {
                let freed = l.handle_timeout(Time(*now));
                let keys: Vec<&String> = freed.iter().map(|(k, _)| k).collect();
                (json!({"freed": keys}), freed)
            }
            LatestOp::Reconnect { generation } => {
                let outcome = l.reconnect(Generation(*generation));
                let touched = match &outcome {
                    LatestReconnect::Advanced { keys, .. } => keys.clone(),
                    _ => Vec::new(),
                };
                (reconnected(&outcome), touched)
            }
        };
        let mut s = Map::new();
        s.insert("generation".into(), json!(l.generation().0));
        s.insert("entries".into(), entries(l, self.clocked));
        s.insert("invalidates".into(), flags(&touched));
        Ok((returns, s))
    }
}

/// The latest cell on a graph, with each named key's readers.
struct ShellLatest<F: LatestFlavor<String, Value>> {
    cell: LatestCellOf<String, Value, F>,
    readers: Vec<(String, KeyReaders<String, Value, F>)>,
    clock: ManualClock,
    clocked: bool,
    _keep: Box<dyn std::any::Any>,
}

fn shell<F: LatestFlavor<String, Value>>(
    handle: &egress_reactive::Handle<F>,
    fixture: &LatestFixture,
    scenario: &LatestScenario,
    keep: Box<dyn std::any::Any>,
) -> Box<dyn LatestSession> {
    let clock = ManualClock::new();
    let options = CellOptions::new().generation(Generation(scenario.generation)).clock(clock.clone()).jitter_seed(0);
    let cell = LatestCellOf::with_options(handle, fixture.policy, fixture.max_keys, options);
    let readers = LatestFixture::keys(scenario).into_iter().map(|k| (k.clone(), cell.key(&k))).collect();
    Box::new(ShellLatest { cell, readers, clock, clocked: fixture.clocked, _keep: keep })
}

impl<F: LatestFlavor<String, Value>> ShellLatest<F> {
    /// How many times each reader of each key has run, reading each
    /// first (so that a dirty reader runs now).
    fn revisions(&self) -> Result<Vec<[u32; 4]>, String> {
        fn read<T: Clone + 'static, F: Flavor>(c: &egress_reactive::Computed<T, F>) -> Result<u32, String> {
            c.try_get().map_err(|e| e.to_string())?;
            Ok(c.runs())
        }
        self.readers
            .iter()
            .map(|(_, r)| Ok([read(r.desired())?, read(r.inflight())?, read(r.durable_through())?, read(r.backoff())?]))
            .collect()
    }
}

impl<F: LatestFlavor<String, Value>> LatestSession for ShellLatest<F> {
    fn apply(&mut self, op: &LatestOp) -> Result<(Value, Map<String, Value>), String> {
        let c = &self.cell;
        if !self.clocked {
            let _ = c.handle_timeout(Time(u64::MAX));
        }
        let before = self.revisions()?;
        let returns = match op {
            LatestOp::Upsert { key, epoch, value } => match c.upsert(key.clone(), Version(*epoch), value.clone()) {
                Ok(outcome) => upserted(&Ok(outcome)),
                Err(egress_reactive::LatestRefused::TooManyKeys(refused)) => upserted(&Err(refused)),
                Err(other) => return Err(format!("the cell refused the upsert: {other:?}")),
            },
            LatestOp::Claim { key, generation } => c.claim_with(Generation(*generation), key, |o| claimed(&o)),
            LatestOp::Ack { key, generation, epoch } => {
                applied(&c.ack_applied(Generation(*generation), key, Version(*epoch)))
            }
            LatestOp::Fail { key, generation, epoch, now, retry_after } => {
                self.clock.set(Time(*now));
                let outcome = c.fail_retryable_with(
                    Generation(*generation),
                    key,
                    Version(*epoch),
                    retry_after.map(Delay),
                    JitterSample::ZERO,
                );
                failed(&outcome, self.clocked)
            }
            LatestOp::HandleTimeout { now } => json!({"freed": c.handle_timeout(Time(*now))}),
            LatestOp::Reconnect { generation } => reconnected(&c.reconnect(Generation(*generation))),
        };
        let after = self.revisions()?;
        let mut s = Map::new();
        s.insert("generation".into(), json!(c.generation().get_untracked().0));
        s.insert("entries".into(), c.with_latest(|l| entries(l, self.clocked)));
        let mut invalidated = Map::new();
        for (i, (key, _)) in self.readers.iter().enumerate() {
            let mut f = Map::new();
            for (j, (name, _)) in PROJECTIONS.iter().enumerate() {
                f.insert((*name).to_owned(), json!(after[i][j] != before[i][j]));
            }
            invalidated.insert(key.clone(), Value::Object(f));
        }
        s.insert("invalidates".into(), Value::Object(invalidated));
        Ok((returns, s))
    }
}

/// A scenario on the pure `Latest`.
pub(crate) fn on_core(fixture: &LatestFixture, scenario: &LatestScenario) -> Box<dyn LatestSession> {
    CoreLatest::start(fixture, scenario)
}

/// A scenario on a latest cell on a `Context`.
pub(crate) fn on_context(fixture: &LatestFixture, scenario: &LatestScenario) -> Box<dyn LatestSession> {
    let cx = egress_reactive::Context::new();
    let handle = cx.handle();
    shell(&handle, fixture, scenario, Box::new(cx))
}

/// A scenario on a latest cell on a `ThreadSafeContext`.
pub(crate) fn on_thread_safe(fixture: &LatestFixture, scenario: &LatestScenario) -> Box<dyn LatestSession> {
    let cx = egress_reactive::ThreadSafeContext::new();
    let handle = cx.handle();
    shell(&handle, fixture, scenario, Box::new(cx))
}

/// A scenario on a latest cell on an `AsyncContext`'s graph.
pub(crate) fn on_async(fixture: &LatestFixture, scenario: &LatestScenario) -> Box<dyn LatestSession> {
    let cx = egress_reactive::AsyncContext::new();
    let handle = cx.handle();
    shell(&handle, fixture, scenario, Box::new(cx))
}

/// Runs every scenario of `fixture`, each on a fresh session `start`
/// makes. A step's number counts across scenarios, from 0.
#[must_use]
pub fn run_latest_fixture(fixture: &LatestFixture, start: LatestStart) -> Verdict {
    let mut n = 0;
    for scenario in &fixture.scenarios {
        let mut session = start(fixture, scenario);
        for step in &scenario.steps {
            let (got, state) = match session.apply(&step.op) {
                Ok(applied) => applied,
                Err(message) => return Verdict::TargetError { step: Some(n), message },
            };
            // Each entry asserts the fields it names (`backoff` is ours,
            // not the design's); `invalidates` each key and projection
            // named (a key not touched reads as all false).
            let named = [("entries", 2), ("invalidates", 2)];
            let op = json!({"scenario": scenario.id, "op": step.text});
            if let Some(verdict) = judge_step(n, &op, (&step.returns, &got), (&step.expected, &state), &named) {
                return verdict;
            }
            n += 1;
        }
    }
    Verdict::Passed { steps: n }
}
