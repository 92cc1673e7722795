//! Replays fixtures against a target and reports the first difference.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::fixture::{Fixture, FixtureError};
use crate::graph::{GraphFixture, run_graph_fixture};
use crate::lanes::{LanesFixture, run_lanes_session};
use crate::latest::{LatestFixture, run_latest_fixture};
use crate::relay::{RelayFixture, run_relay_session};
use crate::target::Target;

/// How one fixture went on one target.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Every step matched.
    Passed {
        /// How many steps ran.
        steps: usize,
    },
    /// A step differed from the fixture.
    Mismatch(Mismatch),
    /// The fixture needs what the target does not offer yet: not run to
    /// its end, and not counted as passed.
    Skipped {
        /// What is missing, and which issue brings it.
        reason: String,
    },
    /// The target itself failed.
    TargetError {
        /// The step, from 0 (`None` when starting the session).
        step: Option<usize>,
        /// What the target said.
        message: String,
    },
}

/// The first difference found in a fixture.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// The step, from 0.
    pub step: usize,
    /// The step's op, as JSON.
    pub op: Value,
    /// The path of the first differing field, as `returns.envelope.attempt`
    /// or `expected.pending[1].sequence`.
    pub field: String,
    /// What the fixture says there (`None`: absent).
    pub expected: Option<Value>,
    /// What the target gave (`None`: absent).
    pub actual: Option<Value>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<Value>| v.as_ref().map_or_else(|| "(absent)".to_owned(), Value::to_string);
        write!(
            f,
            "step {} {}: {}: expected {}, got {}",
            self.step,
            self.op,
            self.field,
            show(&self.expected),
            show(&self.actual)
        )
    }
}

/// One line of a run: a fixture file on a target.
#[derive(Clone, Debug)]
pub struct Report {
    /// The fixture file.
    pub file: PathBuf,
    /// The fixture's description.
    pub description: String,
    /// The target's name.
    pub target: &'static str,
    /// How it went.
    pub verdict: Verdict,
}

impl Report {
    /// Whether the fixture passed.
    #[must_use]
    pub const fn passed(&self) -> bool {
        matches!(self.verdict, Verdict::Passed { .. })
    }

    /// Whether the fixture failed (a skipped one did not).
    #[must_use]
    pub const fn failed(&self) -> bool {
        !matches!(self.verdict, Verdict::Passed { .. } | Verdict::Skipped { .. })
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = self.file.display();
        match &self.verdict {
            Verdict::Passed { steps } => write!(f, "ok    [{}] {file} ({steps} steps)", self.target),
            Verdict::Mismatch(m) => write!(f, "FAIL  [{}] {file}: {m}", self.target),
            Verdict::Skipped { reason } => write!(f, "SKIP  [{}] {file}: {reason}", self.target),
            Verdict::TargetError { step: Some(step), message } => {
                write!(f, "ERROR [{}] {file}: step {step}: {message}", self.target)
            }
            Verdict::TargetError { step: None, message } => write!(f, "ERROR [{}] {file}: {message}", self.target),
        }
    }
}

/// Runs every step of `fixture` on `target`.
pub fn run_fixture(fixture: &Fixture, target: &dyn Target) -> Verdict {
    let mut session = match target.start(fixture) {
        Ok(session) => session,
        Err(message) => return Verdict::TargetError { step: None, message },
    };
    for (i, step) in fixture.steps.iter().enumerate() {
        let observed = match session.apply(&step.op) {
            Ok(observed) => observed,
            Err(message) => return Verdict::TargetError { step: Some(i), message },
        };
        let op = serde_json::to_value(&step.op).unwrap_or(Value::Null);
        let mismatch = |field: String, expected: Option<&Value>, actual: Option<&Value>| {
            Verdict::Mismatch(Mismatch {
                step: i,
                op: op.clone(),
                field,
                expected: expected.cloned(),
                actual: actual.cloned(),
            })
        };
        let returns = design_reading(&op, &step.returns, observed.returns);
        if let Some((field, e, a)) = first_difference("returns".into(), &step.returns, &returns) {
            return mismatch(field, e, a);
        }
        for (key, want) in &step.expected {
            if key == "invalidates" {
                let Value::Object(flags) = want else { continue };
                for (reader, flag) in flags {
                    let got = observed.invalidated.get(reader);
                    if got != Some(flag) {
                        return mismatch(format!("expected.invalidates.{reader}"), Some(flag), got);
                    }
                }
                continue;
            }
            let Some(got) = observed.state.get(key) else {
                return mismatch(format!("expected.{key}"), Some(want), None);
            };
            if let Some((field, e, a)) = first_difference(format!("expected.{key}"), want, got) {
                return mismatch(field, e, a);
            }
        }
    }
    Verdict::Passed { steps: fixture.steps.len() }
}

/// Fields of a return value that extend the design's: `(op type, field)`.
/// A fixture written for the design does not name them, and they are not
/// asserted there; a fixture that names one asserts it like any other
/// field (`conformance/README.md`, "Reading a fixture written for the
/// design").
pub const EXTENSION_RETURNS: &[(&str, &str)] = &[("reconnect", "dead")];

/// `got` as the fixture reads it: without the extension fields
/// ([`EXTENSION_RETURNS`]) of this op that `want` does not name.
fn design_reading(op: &Value, want: &Value, mut got: Value) -> Value {
    let kind = op.get("type").and_then(Value::as_str).unwrap_or_default();
    if let (Value::Object(want), Value::Object(fields)) = (want, &mut got) {
        for &(_, field) in EXTENSION_RETURNS.iter().filter(|(of, _)| *of == kind) {
            if !want.contains_key(field) {
                fields.remove(field);
            }
        }
    }
    got
}

/// A step of the lanes, relay and latest fixtures, as written.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStep {
    pub(crate) op: Value,
    pub(crate) returns: Value,
    #[serde(default)]
    pub(crate) expected: Map<String, Value>,
}

/// The first difference of the fields `want` names, `depth` levels down:
/// an object asserts only the keys it names (a key the target does not
/// report reads as `false` where a flag is wanted, as an empty object
/// where an object is, `null` otherwise), an array of the same length each
/// element; below `depth` (and for anything else) exactly, as
/// [`first_difference`].
pub(crate) fn named_difference(
    path: String,
    want: &Value,
    got: &Value,
    depth: u8,
) -> Option<(String, Option<Value>, Option<Value>)> {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) if depth > 0 => w.iter().find_map(|(k, wv)| {
            let missing = match wv {
                Value::Bool(_) => Value::Bool(false),
                Value::Object(_) => Value::Object(Map::new()),
                _ => Value::Null,
            };
            named_difference(format!("{path}.{k}"), wv, g.get(k).unwrap_or(&missing), depth - 1)
        }),
        (Value::Array(w), Value::Array(g)) if depth > 0 && w.len() == g.len() => w
            .iter()
            .zip(g)
            .enumerate()
            .find_map(|(i, (wv, gv))| named_difference(format!("{path}[{i}]"), wv, gv, depth - 1)),
        _ => first_difference(path, want, got).map(|(p, e, a)| (p, e.cloned(), a.cloned())),
    }
}

/// Judges one step of a lanes, relay or latest fixture: its return
/// exactly, then each key of `expected` against `state`, a key in `named`
/// by [`named_difference`] to its depth, every other exactly. `op` names
/// the step in a mismatch.
pub(crate) fn judge_step(
    step: usize,
    op: &Value,
    (returns, got): (&Value, &Value),
    (expected, state): (&Map<String, Value>, &Map<String, Value>),
    named: &[(&str, u8)],
) -> Option<Verdict> {
    let mismatch = |(field, expected, actual): (String, Option<Value>, Option<Value>)| {
        Verdict::Mismatch(Mismatch { step, op: op.clone(), field, expected, actual })
    };
    if let Some(d) = first_difference("returns".into(), returns, got) {
        return Some(mismatch((d.0, d.1.cloned(), d.2.cloned())));
    }
    for (key, want) in expected {
        let got = state.get(key).unwrap_or(&Value::Null);
        let path = format!("expected.{key}");
        let difference = match named.iter().find(|(k, _)| k == key) {
            Some((_, depth)) => named_difference(path, want, got, *depth),
            None => first_difference(path, want, got).map(|(p, e, a)| (p, e.cloned(), a.cloned())),
        };
        if let Some(d) = difference {
            return Some(mismatch(d));
        }
    }
    None
}

/// The first path at which `want` and `got` differ, with both values there.
pub(crate) fn first_difference<'a>(
    path: String,
    want: &'a Value,
    got: &'a Value,
) -> Option<(String, Option<&'a Value>, Option<&'a Value>)> {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, wv) in w {
                let p = format!("{path}.{k}");
                match g.get(k) {
                    Some(gv) => {
                        if let Some(d) = first_difference(p, wv, gv) {
                            return Some(d);
                        }
                    }
                    None => return Some((p, Some(wv), None)),
                }
            }
            g.iter().find(|(k, _)| !w.contains_key(*k)).map(|(k, gv)| (format!("{path}.{k}"), None, Some(gv)))
        }
        (Value::Array(w), Value::Array(g)) => {
            for (i, (wv, gv)) in w.iter().zip(g).enumerate() {
                if let Some(d) = first_difference(format!("{path}[{i}]"), wv, gv) {
                    return Some(d);
                }
            }
            match w.len().cmp(&g.len()) {
                std::cmp::Ordering::Equal => None,
                std::cmp::Ordering::Greater => Some((format!("{path}[{}]", g.len()), w.get(g.len()), None)),
                std::cmp::Ordering::Less => Some((format!("{path}[{}]", w.len()), None, g.get(w.len()))),
            }
        }
        (w, g) if w == g => None,
        (w, g) => Some((path, Some(w), Some(g))),
    }
}

/// The fixture files under `paths`: files as given, folders searched
/// recursively for `*.json`, each folder's files in name order.
///
/// # Errors
/// A [`FixtureError`] for a path that cannot be read.
pub fn collect_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, FixtureError> {
    let mut files = Vec::new();
    for path in paths {
        collect(path, &mut files)?;
    }
    Ok(files)
}

fn collect(path: &Path, files: &mut Vec<PathBuf>) -> Result<(), FixtureError> {
    let meta = std::fs::metadata(path).map_err(|e| FixtureError {
        file: path.to_path_buf(),
        path: ".".into(),
        message: format!("unreadable: {e}"),
    })?;
    if !meta.is_dir() {
        files.push(path.to_path_buf());
        return Ok(());
    }
    let entries = std::fs::read_dir(path).map_err(|e| FixtureError {
        file: path.to_path_buf(),
        path: ".".into(),
        message: format!("unreadable: {e}"),
    })?;
    let mut children: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    children.sort();
    for child in children {
        if child.is_dir() || child.extension().is_some_and(|x| x == "json") {
            collect(&child, files)?;
        }
    }
    Ok(())
}

/// Loads each file and runs it on each target: one report per pair. An
/// egress fixture runs on every target; a reactive-graph fixture on the
/// targets that have a graph (not `core`); a lanes, relay or latest
/// fixture on every target that runs that kind.
///
/// # Errors
/// The first malformed fixture, or one of a kind no runner knows.
pub fn run_files(files: &[PathBuf], targets: &[&dyn Target]) -> Result<Vec<Report>, FixtureError> {
    let mut reports = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).map_err(|e| FixtureError {
            file: file.clone(),
            path: ".".into(),
            message: format!("unreadable: {e}"),
        })?;
        let doc: Value = serde_json::from_str(&text).map_err(|e| FixtureError {
            file: file.clone(),
            path: ".".into(),
            message: format!("not JSON: {e}"),
        })?;
        let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
        let description = doc.get("description").and_then(Value::as_str).unwrap_or_default().to_owned();
        let report = |target: &'static str, verdict| Report {
            file: file.clone(),
            description: description.clone(),
            target,
            verdict,
        };
        if kind == "Lanes" {
            let fixture = LanesFixture::from_value(file, &doc)?;
            for target in targets {
                let verdict = match target.lanes(&fixture) {
                    Some(Ok(mut session)) => run_lanes_session(&fixture, &mut *session),
                    Some(Err(message)) => Verdict::TargetError { step: None, message },
                    None => Verdict::Skipped { reason: format!("the {} target has no lanes", target.name()) },
                };
                reports.push(report(target.name(), verdict));
            }
        } else if kind == "LatestDurableProjection" {
            let fixture = LatestFixture::from_value(file, &doc)?;
            for target in targets {
                let verdict = match target.latest() {
                    Some(start) => run_latest_fixture(&fixture, start),
                    None => {
                        Verdict::Skipped { reason: format!("the {} target has no latest projection", target.name()) }
                    }
                };
                reports.push(report(target.name(), verdict));
            }
        } else if kind == "Relay" {
            let fixture = RelayFixture::from_value(file, &doc)?;
            for target in targets {
                let verdict = match target.relay(&fixture) {
                    Some(Ok(mut session)) => run_relay_session(&fixture, &mut *session),
                    Some(Err(message)) => Verdict::TargetError { step: None, message },
                    None => Verdict::Skipped { reason: format!("the {} target has no relay", target.name()) },
                };
                reports.push(report(target.name(), verdict));
            }
        } else if kind == "ReactiveGraph" {
            let fixture = GraphFixture::from_value(file, &doc)?;
            for target in targets {
                if let Some(start) = target.graph() {
                    reports.push(report(target.name(), run_graph_fixture(&fixture, &*start)));
                }
            }
        } else {
            let fixture = Fixture::parse(file, &text)?;
            for target in targets {
                reports.push(report(target.name(), run_fixture(&fixture, *target)));
            }
        }
    }
    Ok(reports)
}
