//! The reactive-graph fixtures (`"kind": "ReactiveGraph"`): the seed
//! design's corpus of graph behaviour (disposal and churn returning to
//! baseline, scope teardown order, failed computes never cached, eager
//! signals materializing once per batch, ...), run against the graph of
//! every flavour: `Context` (`context`), `ThreadSafeContext`
//! (`thread-safe`) and `AsyncContext` (`async`).
//!
//! A fixture is a list of steps (or of named scenarios, compared at the
//! end), each an op and what must hold after it (`expect`). The ops build
//! nodes by string id: cells (signals of `i64`), computeds (the sum of what
//! they read plus an offset), effects (which record that they ran and what
//! they read), eager signals (a computed and the effect that pulls it),
//! scopes. How each op and each `expect` key is read is in
//! `conformance/README.md`, "The reactive-graph fixtures".
//!
//! What a flavour does not offer yet is reported as skipped, with the
//! reason and the issue that brings it ([`unsupported_reason`]); the run
//! does not count it as passed.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value, json};

use crate::fixture::FixtureError;
use crate::runner::{Mismatch, Verdict};

/// What one op did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Applied {
    /// The op's value: what a `read` read, a `signal` materialized, an
    /// `effect` saw at its first run.
    pub value: Option<i64>,
    /// The op's error, by name (`read_after_dispose`, `compute_failed`, or
    /// the text of any other failure).
    pub error: Option<String>,
    /// A write or batch whose effects did not settle: the flush stopped at
    /// its round limit and said so.
    pub drain_exhausted: bool,
    /// The effects that ran during the op, in order (an eager signal's
    /// puller is not among them).
    pub ran: Vec<String>,
}

/// One fixture's run on one graph.
pub trait GraphSession {
    /// Applies one op. A panic inside is the op's error, not the session's.
    ///
    /// # Errors
    /// An op the session cannot apply: malformed, naming an unknown node,
    /// or needing what the flavour does not offer (see [`unsupported`]).
    fn apply(&mut self, op: &Value) -> Result<Applied, String>;
    /// How many times the function of computed, effect or signal `id` ran.
    fn computes(&self, id: &str) -> Option<u64>;
    /// How many computations depend on node `id` now.
    fn dependents(&self, id: &str) -> Option<usize>;
    /// How many nodes the last run of `id` read.
    fn dependencies(&self, id: &str) -> Option<usize>;
    /// Whether node `id` is alive.
    fn readable(&self, id: &str) -> Option<bool>;
    /// Reads node `id` now: its value, or the name of the read's failure.
    ///
    /// # Errors
    /// An unknown id.
    fn read(&mut self, id: &str) -> Result<Result<i64, String>, String>;
    /// How many nodes scope `scope` owns.
    fn scope_owned(&self, scope: &str) -> Option<usize>;
    /// Every computed and effect freed since the fixture began, in the
    /// order the graph freed them.
    fn cleanup_order(&self) -> Vec<String>;
}

/// Why a run failed, carried as a panic's payload through the graph (raised
/// with `resume_unwind`, so no panic message is printed).
#[derive(Clone, Debug, PartialEq)]
pub enum Failure {
    /// A computation read a disposed node.
    ReadAfterDispose,
    /// A computed armed by `fail_next` failed.
    ComputeFailed,
    /// Anything else, in words.
    Other(String),
}

impl Failure {
    /// The failure a caught panic carries.
    #[must_use]
    pub fn of(panic: Box<dyn std::any::Any + Send>) -> Failure {
        match panic.downcast::<Failure>() {
            Ok(failure) => *failure,
            Err(panic) => {
                let text = egress_core::panic_message(&*panic).unwrap_or("a panic");
                Failure::Other(format!("panic: {text}"))
            }
        }
    }
}

/// The fixture's name for a failure.
#[must_use]
pub fn failure_name(failure: &Failure) -> String {
    match failure {
        Failure::ReadAfterDispose => "read_after_dispose".to_owned(),
        Failure::ComputeFailed => "compute_failed".to_owned(),
        Failure::Other(text) => text.clone(),
    }
}

/// The prefix of an op error that means "not offered by this graph yet".
const UNSUPPORTED: &str = "unsupported: ";

/// The error for an op that needs `feature`.
#[must_use]
pub fn unsupported(feature: &str) -> String {
    format!("{UNSUPPORTED}{feature}")
}

/// Why a fixture that needs `feature` is skipped, and which issue brings
/// it; `None` for a feature not on the list (then the fixture fails).
#[must_use]
pub fn unsupported_reason(feature: &str) -> Option<&'static str> {
    if feature.contains("merge cells") {
        Some(
            "merge cells (a source folding explicit merges under a policy, fed by effects) are not in \
             egress-reactive yet: they come with the relay's merge policies (issue 33)",
        )
    } else if feature.contains("cell observers") {
        Some(
            "per-write cell observers (subscribe/unsubscribe, delivered per write even inside a batch) are \
             not in egress-reactive: effects are its only observers (see conformance/README.md)",
        )
    } else {
        None
    }
}

/// A reactive-graph fixture, as read.
#[derive(Clone, Debug)]
pub struct GraphFixture {
    /// What it checks.
    pub description: String,
    /// Its scenarios: one unnamed one for the `steps` shape.
    pub scenarios: Vec<(String, Vec<Value>)>,
    /// For the `scenarios` shape: what must hold at the end of each, and
    /// between them.
    pub expected: Option<Value>,
}

impl GraphFixture {
    /// Reads a fixture whose `kind` is `ReactiveGraph`.
    ///
    /// # Errors
    /// A [`FixtureError`] naming the field that is missing or malformed.
    pub fn from_value(file: &Path, doc: &Value) -> Result<GraphFixture, FixtureError> {
        let err = |path: &str, message: &str| FixtureError {
            file: file.to_path_buf(),
            path: path.to_owned(),
            message: message.to_owned(),
        };
        let description = doc.get("description").and_then(Value::as_str).unwrap_or_default().to_owned();
        let steps_of = |v: &Value, path: &str| -> Result<Vec<Value>, FixtureError> {
            let steps = v.as_array().ok_or_else(|| err(path, "not a list of steps"))?;
            if steps.is_empty() {
                return Err(err(path, "no steps"));
            }
            for (i, step) in steps.iter().enumerate() {
                let keys = step.as_object().ok_or_else(|| err(&format!("{path}[{i}]"), "not an object"))?;
                if let Some(key) = keys.keys().find(|k| !["op", "expect", "note"].contains(&k.as_str())) {
                    return Err(err(&format!("{path}[{i}].{key}"), "unknown key (a step has op, expect, note)"));
                }
                let kind = step.get("op").and_then(|op| op.get("type")).and_then(Value::as_str);
                if kind.is_none() {
                    return Err(err(&format!("{path}[{i}].op.type"), "missing"));
                }
                if let Some(expect) = step.get("expect")
                    && !expect.is_object()
                {
                    return Err(err(&format!("{path}[{i}].expect"), "not an object"));
                }
            }
            Ok(steps.clone())
        };
        let mut scenarios = Vec::new();
        if let Some(steps) = doc.get("steps") {
            scenarios.push((String::new(), steps_of(steps, "steps")?));
        }
        if let Some(list) = doc.get("scenarios") {
            let list = list.as_array().ok_or_else(|| err("scenarios", "not a list"))?;
            for (i, scenario) in list.iter().enumerate() {
                let name = scenario.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
                let steps = scenario.get("steps").ok_or_else(|| err(&format!("scenarios[{i}].steps"), "missing"))?;
                scenarios.push((name, steps_of(steps, &format!("scenarios[{i}].steps"))?));
            }
        }
        if scenarios.is_empty() {
            return Err(err(".", "neither steps nor scenarios"));
        }
        let expected = doc.get("expected").cloned();
        if let Some(expected) = &expected {
            let block = expected.as_object().ok_or_else(|| err("expected", "not an object"))?;
            for (key, value) in block {
                match key.as_str() {
                    "final_state" | "after_publish" if value.is_object() => {}
                    "observationally_equal" => {
                        let names: Vec<&str> =
                            value.as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                        let known = |n: &&str| scenarios.iter().any(|(name, _)| name == n);
                        if names.len() < 2
                            || value.as_array().map(Vec::len) != Some(names.len())
                            || !names.iter().all(known)
                        {
                            return Err(err(
                                "expected.observationally_equal",
                                "not a list of two or more scenario names",
                            ));
                        }
                    }
                    _ => return Err(err(&format!("expected.{key}"), "unknown key, or not an object")),
                }
            }
        }
        Ok(GraphFixture { description, scenarios, expected })
    }
}

/// A mismatch of scenario `scenario` (empty: the only one) at `step`.
fn mismatch(scenario: &str, step: usize, op: &Value, field: &str, expected: Value, actual: Value) -> Verdict {
    let field = if scenario.is_empty() { field.to_owned() } else { format!("scenario {scenario}: {field}") };
    Verdict::Mismatch(Mismatch { step, op: op.clone(), field, expected: Some(expected), actual: Some(actual) })
}

/// Checks every key of `expect` after an op that did `applied`.
fn check(session: &mut dyn GraphSession, applied: &Applied, expect: &Map<String, Value>) -> Result<(), Disagreement> {
    for (key, want) in in_reading_order(expect) {
        let got = observe(session, applied, key, want)?;
        if let Some((field, want, got)) = differs(key, want, &got) {
            return Err(Disagreement::Field(field, want, got));
        }
    }
    Ok(())
}

/// The keys of an `expect` block in the order they are observed: `read`
/// first (a read materializes what it reads, as the fixtures' own reads
/// do), then the rest in name order, so that the degrees of a computed are
/// observed once it has run.
fn in_reading_order(expect: &Map<String, Value>) -> impl Iterator<Item = (&String, &Value)> {
    let reads = expect.iter().filter(|(k, _)| *k == "read");
    reads.chain(expect.iter().filter(|(k, _)| *k != "read"))
}

/// What disagreed, or could not be checked.
enum Disagreement {
    /// `(field, expected, actual)`.
    Field(String, Value, Value),
    /// The session could not answer (unknown id, unsupported key).
    Session(String),
}

/// The value a session shows for `key`, in the shape of `want`.
fn observe(session: &mut dyn GraphSession, applied: &Applied, key: &str, want: &Value) -> Result<Value, Disagreement> {
    let per_id = |want: &Value| -> Result<Vec<String>, Disagreement> {
        want.as_object()
            .map(|m| m.keys().cloned().collect())
            .ok_or_else(|| Disagreement::Session(format!("expect.{key} is not an object")))
    };
    let unknown = |id: &str| Disagreement::Session(format!("expect.{key}: unknown node {id}"));
    Ok(match key {
        "note" => want.clone(),
        "value" => json!(applied.value),
        "error" => json!(applied.error),
        "drain_exhausted" => json!(applied.drain_exhausted),
        "observed_count" => json!(applied.ran.len()),
        "observed_by" => {
            let mut ran = applied.ran.clone();
            ran.sort();
            ran.dedup();
            let mut want: Vec<String> =
                want.as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect();
            want.sort();
            return Ok(if want == ran { json!(want) } else { json!(ran) });
        }
        "cleanup_order" => json!(session.cleanup_order()),
        "computes_of" | "dependents_of" | "dependencies_of" | "readable" | "scope_owned_count"
        | "group_owned_count" | "read" => {
            let mut out = Map::new();
            for id in per_id(want)? {
                let v = match key {
                    "computes_of" => json!(session.computes(&id).ok_or_else(|| unknown(&id))?),
                    "dependents_of" => json!(session.dependents(&id).ok_or_else(|| unknown(&id))?),
                    "dependencies_of" => json!(session.dependencies(&id).ok_or_else(|| unknown(&id))?),
                    "readable" => json!(session.readable(&id).ok_or_else(|| unknown(&id))?),
                    "read" => match session.read(&id).map_err(Disagreement::Session)? {
                        Ok(v) => json!(v),
                        Err(e) => json!({ "error": e }),
                    },
                    _ => json!(session.scope_owned(&id).ok_or_else(|| unknown(&id))?),
                };
                out.insert(id, v);
            }
            Value::Object(out)
        }
        "merges_of" => return Err(Disagreement::Session(unsupported("merges_of (merge cells)"))),
        "observed_order" | "observed_counts" => {
            return Err(Disagreement::Session(unsupported("observed_order (cell observers)")));
        }
        other => return Err(Disagreement::Session(format!("unknown expect key {other:?}"))),
    })
}

/// The first field where `got` differs from `want`, under `key`.
fn differs(key: &str, want: &Value, got: &Value) -> Option<(String, Value, Value)> {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => w.iter().find_map(|(k, wv)| {
            let gv = g.get(k).cloned().unwrap_or(Value::Null);
            (wv != &gv).then(|| (format!("expect.{key}.{k}"), wv.clone(), gv))
        }),
        _ if want == got => None,
        _ => Some((format!("expect.{key}"), want.clone(), got.clone())),
    }
}

/// A session that ran one scenario to its end, with what it observed.
struct Ran {
    session: Box<dyn GraphSession>,
    /// How many steps it ran.
    steps: usize,
}

/// Runs one scenario's steps; the verdict if it did not pass.
fn run_steps(start: &dyn Fn() -> Box<dyn GraphSession>, name: &str, steps: &[Value]) -> Result<Ran, Box<Verdict>> {
    let mut session = start();
    for (i, step) in steps.iter().enumerate() {
        let op = step.get("op").cloned().unwrap_or(Value::Null);
        let applied = session.apply(&op).map_err(|message| Box::new(skipped_or_error(i, message)))?;
        let expect = step.get("expect").and_then(Value::as_object).cloned().unwrap_or_default();
        match check(session.as_mut(), &applied, &expect) {
            Ok(()) => {}
            Err(Disagreement::Field(field, want, got)) => {
                return Err(Box::new(mismatch(name, i, &op, &field, want, got)));
            }
            Err(Disagreement::Session(message)) => return Err(Box::new(skipped_or_error(i, message))),
        }
    }
    Ok(Ran { session, steps: steps.len() })
}

/// An op or key the session could not handle: skipped when the feature is
/// on the list of what a flavour does not offer yet, an error otherwise.
fn skipped_or_error(step: usize, message: String) -> Verdict {
    match message.strip_prefix(UNSUPPORTED).and_then(unsupported_reason) {
        Some(reason) => Verdict::Skipped { reason: reason.to_owned() },
        None => Verdict::TargetError { step: Some(step), message },
    }
}

/// What a scenario leaves behind, for `observationally_equal`.
type Observed = BTreeMap<String, Value>;

/// Checks the `scenarios` shape's `expected` block on a scenario that ran:
/// `final_state` now, then `after_publish` (its op and what must hold).
fn check_tail(ran: &mut Ran, name: &str, expected: &Value) -> Result<Observed, Box<Verdict>> {
    let mut observed = Observed::new();
    let session = ran.session.as_mut();
    // Reported as the step after the scenario's last.
    let tail_step = ran.steps;
    let mut check_block =
        |session: &mut dyn GraphSession, applied: &Applied, block: &Value, label: &str, op: &Value| {
            let block: Map<String, Value> = block
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| *k != "op")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            for (key, want) in in_reading_order(&block) {
                match observe(session, applied, key, want) {
                    Ok(got) => {
                        observed.insert(format!("{label}.{key}"), got.clone());
                        if let Some((field, want, got)) = differs(key, want, &got) {
                            let field = format!("expected.{label}: {field}");
                            return Err(Box::new(mismatch(name, tail_step, op, &field, want, got)));
                        }
                    }
                    Err(Disagreement::Session(m)) => return Err(Box::new(skipped_or_error(tail_step, m))),
                    Err(Disagreement::Field(..)) => unreachable!("observe reports no field disagreement"),
                }
            }
            Ok(())
        };
    if let Some(block) = expected.get("final_state") {
        check_block(session, &Applied::default(), block, "final_state", &Value::Null)?;
    }
    if let Some(block) = expected.get("after_publish") {
        let op = block.get("op").cloned().unwrap_or(Value::Null);
        let applied = session.apply(&op).map_err(|m| Box::new(skipped_or_error(tail_step, m)))?;
        check_block(session, &applied, block, "after_publish", &op)?;
    }
    observed.insert("cleanup_order".into(), json!(session.cleanup_order()));
    Ok(observed)
}

/// Runs a reactive-graph fixture on the graph `start` makes.
pub fn run_graph_fixture(fixture: &GraphFixture, start: &dyn Fn() -> Box<dyn GraphSession>) -> Verdict {
    let mut observations: BTreeMap<String, Observed> = BTreeMap::new();
    let mut steps = 0;
    for (name, scenario) in &fixture.scenarios {
        let mut ran = match run_steps(start, name, scenario) {
            Ok(ran) => ran,
            Err(verdict) => return *verdict,
        };
        steps += scenario.len();
        if let Some(expected) = &fixture.expected {
            match check_tail(&mut ran, name, expected) {
                Ok(observed) => {
                    observations.insert(name.clone(), observed);
                }
                Err(verdict) => return *verdict,
            }
        }
    }
    let pair = fixture.expected.as_ref().and_then(|e| e.get("observationally_equal")).and_then(Value::as_array);
    if let Some(pair) = pair {
        let names: Vec<&str> = pair.iter().filter_map(Value::as_str).collect();
        for window in names.windows(2) {
            // Both ran: the names were checked against the scenarios when
            // the fixture was read, and every scenario is observed.
            let (a, b) = (observations.get(window[0]), observations.get(window[1]));
            if a != b {
                return Verdict::Mismatch(Mismatch {
                    step: steps,
                    op: Value::Null,
                    field: format!("observationally_equal: {} against {}", window[0], window[1]),
                    expected: a.map(|o| json!(o)),
                    actual: b.map(|o| json!(o)),
                });
            }
        }
    }
    Verdict::Passed { steps }
}

/// Reads a JSON field of an op.
pub(crate) fn field_str<'a>(op: &'a Value, key: &str) -> Result<&'a str, String> {
    op.get(key).and_then(Value::as_str).ok_or_else(|| format!("op field {key} missing or not a string"))
}

pub(crate) fn field_i64(op: &Value, key: &str) -> Result<i64, String> {
    op.get(key).and_then(Value::as_i64).ok_or_else(|| format!("op field {key} missing or not an integer"))
}

/// The most nodes (or cycles) one `fanout` or `churn` op may ask for, and
/// the most ids one `reads` may name: a fixture is a test, and a count
/// past these is a mistake, not a load. (A fixture is code the runner
/// runs: a feedback loop over many effects still costs what it asks for,
/// up to the flush's round limit per write.)
pub const MAX_COUNT: u64 = 10_000;

pub(crate) fn field_u64(op: &Value, key: &str) -> Result<u64, String> {
    let n = op.get(key).and_then(Value::as_u64).ok_or_else(|| format!("op field {key} missing or not a count"))?;
    if n > MAX_COUNT {
        return Err(format!("op field {key}: {n} is above {MAX_COUNT}"));
    }
    Ok(n)
}

pub(crate) fn ids<'a>(op: &'a Value, key: &str) -> Result<Vec<&'a str>, String> {
    match op.get(key) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) if items.len() as u64 > MAX_COUNT => {
            Err(format!("op field {key}: more than {MAX_COUNT} ids"))
        }
        Some(Value::Array(items)) => {
            items.iter().map(|v| v.as_str().ok_or_else(|| format!("op field {key}: not a list of ids"))).collect()
        }
        Some(_) => Err(format!("op field {key}: not a list of ids")),
    }
}

/// The interpreter on `Context`'s graph. (Its shared state is in `Arc`s
/// so that the same text compiles for the thread-safe graph, where the
/// closures that hold it must be `Send + Sync`.)
#[allow(clippy::arc_with_non_send_sync)]
pub(crate) mod local {
    use egress_reactive::Local as F;
    include!("session.rs");
}

/// The interpreter on the thread-safe graph (`ThreadSafeContext` and
/// `AsyncContext`).
pub(crate) mod threaded {
    use egress_reactive::Threaded as F;
    include!("session.rs");
}
