//! The relay fixtures (`"kind": "Relay"`, `conformance/relay/`): the ops
//! of `egress_core::Relay` (send, pop, put back, spill, replay) under one
//! of the built-in merge policies and a backpressure policy. The schema is
//! in `conformance/README.md`, "The relay fixtures".
//!
//! The `core` target runs them on `Relay`, the shell targets on the relay
//! cell of each flavour (`RelayCellOf`), whose invalidations are observed
//! through an effect on each of its readers.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use egress_core::{
    Backpressure, Drained, KeepLatest, Max, MergePolicy, Overflow, RawFifo, Relay, RelayStats, SendRefused, Sent,
    SetUnion, SpillPage, Sum, Water,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::fixture::FixtureError;
use crate::runner::{RawStep, Verdict, judge_step};

/// The keys `expected` may hold: the relay's stats, its entries, and what
/// the op invalidated.
pub const RELAY_STATE_KEYS: [&str; 13] = [
    "depth",
    "ops",
    "bytes",
    "full",
    "accepted",
    "conflated",
    "dropped",
    "blocked",
    "drained",
    "spilled",
    "cold",
    "entries",
    "invalidates",
];

/// The readers a shell observes, by the stats key they show.
const READERS: [&str; 11] =
    ["depth", "ops", "bytes", "full", "accepted", "conflated", "dropped", "blocked", "drained", "spilled", "cold"];

/// A merge policy as a fixture names it.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PolicyName {
    /// `KeepLatest` over any JSON value.
    KeepLatest,
    /// `Max` over unsigned integers.
    Max,
    /// `Sum` over unsigned integers (saturating).
    Sum,
    /// `SetUnion` over sets of unsigned integers (JSON arrays, sorted).
    SetUnion,
    /// `RawFifo` over arrays of any JSON value.
    RawFifo,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWater {
    high: u64,
    low: u64,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum OverflowName {
    Block,
    DropNewest,
    DropOldest,
    Conflate,
    Spill,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackpressure {
    count: RawWater,
    #[serde(default)]
    bytes: Option<RawWater>,
    overflow: OverflowName,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRelayFixture {
    description: String,
    kind: String,
    model: String,
    policy: PolicyName,
    backpressure: RawBackpressure,
    steps: Vec<RawStep>,
}

/// One op of a relay fixture.
#[derive(Clone, Debug, PartialEq)]
pub enum RelayOp {
    /// `send(value)`.
    Send(Value),
    /// `pop()`.
    Pop,
    /// `unpop` of the most recent entry popped and not yet put back.
    Unpop,
    /// `spill()`.
    Spill,
    /// `unspill` of the most recent page spilled and not yet put back.
    Unspill,
    /// `replayed(ops)`.
    Replayed(u64),
    /// `restore_cold(ops)`.
    RestoreCold(u64),
}

/// One step: the op, its return, and what must hold after it.
#[derive(Clone, Debug)]
pub struct RelayStep {
    /// The op.
    pub op: RelayOp,
    /// The op as the fixture spells it (for reports).
    pub text: Value,
    /// What the op returns.
    pub returns: Value,
    /// What must hold after it.
    pub expected: Map<String, Value>,
}

/// A parsed relay fixture.
#[derive(Clone, Debug)]
pub struct RelayFixture {
    /// What it shows.
    pub description: String,
    /// The merge policy.
    pub policy: PolicyName,
    /// The backpressure policy.
    pub backpressure: Backpressure,
    /// The steps.
    pub steps: Vec<RelayStep>,
}

impl RelayFixture {
    /// Parses and validates a relay fixture; `file` is only used in
    /// errors.
    ///
    /// # Errors
    /// [`FixtureError`] naming the file and the JSON path at fault.
    pub fn from_value(file: &Path, doc: &Value) -> Result<Self, FixtureError> {
        let err = |path: String, message: String| FixtureError { file: file.to_path_buf(), path, message };
        let raw: RawRelayFixture =
            serde_path_to_error::deserialize(doc).map_err(|e| err(e.path().to_string(), e.into_inner().to_string()))?;
        if raw.kind != "Relay" || raw.model != "Relay" {
            return Err(err(
                "kind".into(),
                format!("expected kind and model \"Relay\", got {:?}, {:?}", raw.kind, raw.model),
            ));
        }
        let b = raw.backpressure;
        let overflow = match b.overflow {
            OverflowName::Block => Overflow::Block,
            OverflowName::DropNewest => Overflow::DropNewest,
            OverflowName::DropOldest => Overflow::DropOldest,
            OverflowName::Conflate => Overflow::Conflate,
            OverflowName::Spill => Overflow::Spill,
        };
        let mut backpressure = Backpressure::count(Water::new(b.count.high, b.count.low), overflow);
        if let Some(bytes) = b.bytes {
            backpressure = backpressure.with_bytes(Water::new(bytes.high, bytes.low));
        }
        if raw.steps.is_empty() {
            return Err(err("steps".into(), "no steps: a fixture must assert something".into()));
        }
        let mut steps = Vec::with_capacity(raw.steps.len());
        for (i, step) in raw.steps.into_iter().enumerate() {
            let at = |path: &str| format!("steps[{i}].{path}");
            let op = decode_op(&step.op).map_err(|(path, message)| err(at(&format!("op{path}")), message))?;
            if let Some(key) = step.expected.keys().find(|k| !RELAY_STATE_KEYS.contains(&k.as_str())) {
                return Err(err(
                    at(&format!("expected.{key}")),
                    format!("unknown key; expected one of {RELAY_STATE_KEYS:?}"),
                ));
            }
            if let Some(Value::Object(flags)) = step.expected.get("invalidates")
                && let Some(key) = flags.keys().find(|k| !READERS.contains(&k.as_str()))
            {
                return Err(err(at(&format!("expected.invalidates.{key}")), format!("not one of {READERS:?}")));
            }
            steps.push(RelayStep { op, text: step.op, returns: step.returns, expected: step.expected });
        }
        let fixture = RelayFixture { description: raw.description, policy: raw.policy, backpressure, steps };
        // The relay must build: a fixture of a refused construction is
        // malformed (the refusals are unit tests).
        fixture.core().map_err(|e| err("backpressure".into(), e))?;
        Ok(fixture)
    }

    /// A fresh session on the pure relay.
    ///
    /// # Errors
    /// The relay refused the fixture's policies.
    pub fn core(&self) -> Result<Box<dyn RelaySession>, String> {
        fn make<T: Typed, M: MergePolicy<T> + 'static>(
            policy: M,
            bp: Backpressure,
        ) -> Result<Box<dyn RelaySession>, String> {
            let relay = Relay::weighed(policy, bp, weigh::<T>).map_err(|e| e.to_string())?;
            Ok(Box::new(CoreRelay { relay, popped: Vec::new(), pages: Vec::new() }))
        }
        let bp = self.backpressure;
        match self.policy {
            PolicyName::KeepLatest => make::<Value, _>(KeepLatest, bp),
            PolicyName::Max => make::<u64, _>(Max, bp),
            PolicyName::Sum => make::<u64, _>(Sum, bp),
            PolicyName::SetUnion => make::<BTreeSet<u64>, _>(SetUnion, bp),
            PolicyName::RawFifo => make::<Vec<Value>, _>(RawFifo, bp),
        }
    }
}

fn decode_op(value: &Value) -> Result<RelayOp, (String, String)> {
    let Value::Object(map) = value else {
        return Err((String::new(), "expected an object with a \"type\"".into()));
    };
    let ty = map.get("type").and_then(Value::as_str).unwrap_or_default();
    let allowed: &[&str] = match ty {
        "send" => &["type", "value"],
        "replayed" | "restore_cold" => &["type", "ops"],
        "pop" | "unpop" | "spill" | "unspill" => &["type"],
        _ => {
            return Err((
                ".type".into(),
                format!("{ty:?} is not a relay op: send, pop, unpop, spill, unspill, replayed, restore_cold"),
            ));
        }
    };
    if let Some(key) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err((format!(".{key}"), format!("unknown field of {ty:?}")));
    }
    let ops = || map.get("ops").and_then(Value::as_u64).ok_or((".ops".to_owned(), "expected a number".to_owned()));
    Ok(match ty {
        "send" => RelayOp::Send(map.get("value").cloned().ok_or((".value".to_owned(), "missing".to_owned()))?),
        "pop" => RelayOp::Pop,
        "unpop" => RelayOp::Unpop,
        "spill" => RelayOp::Spill,
        "unspill" => RelayOp::Unspill,
        "replayed" => RelayOp::Replayed(ops()?),
        _ => RelayOp::RestoreCold(ops()?),
    })
}

/// What a relay fixture's values are: read from and written as JSON.
pub trait Typed: Clone + serde::Serialize + DeserializeOwned + Send + 'static {}
impl<T: Clone + serde::Serialize + DeserializeOwned + Send + 'static> Typed for T {}

/// A value's weight: the length of its compact JSON text.
fn weigh<T: serde::Serialize>(value: &T) -> u64 {
    serde_json::to_vec(value).map_or(u64::MAX, |b| b.len() as u64)
}

fn typed<T: DeserializeOwned>(value: &Value) -> Result<T, String> {
    serde_json::from_value(value.clone()).map_err(|e| format!("a value this policy does not take ({value}): {e}"))
}

/// The return of a `send`.
pub(crate) fn sent<T>(outcome: &Result<Sent, SendRefused<T>>) -> Value {
    match outcome {
        Ok(Sent::Accepted) => json!({"sent": "accepted"}),
        Ok(Sent::Conflated) => json!({"sent": "conflated"}),
        Ok(Sent::Dropped) => json!({"sent": "dropped"}),
        Ok(Sent::DroppedOldest { ops }) => json!({"sent": "dropped_oldest", "ops": ops}),
        Err(SendRefused::Blocked(_)) => json!({"refused": "blocked"}),
        Err(SendRefused::TooLarge { bytes, limit, .. }) => {
            json!({"refused": "too_large", "bytes": bytes, "limit": limit})
        }
        Err(SendRefused::MustSpill(_)) => json!({"refused": "must_spill"}),
        Err(SendRefused::SpillFailed { reason, .. }) => json!({"refused": "spill_failed", "reason": reason}),
        Err(_) => json!({"refused": "unknown"}),
    }
}

/// The return of a `pop`.
pub(crate) fn popped<T: serde::Serialize>(d: Option<&Drained<T>>) -> Value {
    d.map_or(json!({"popped": null}), |d| json!({"popped": {"value": d.value, "ops": d.ops}}))
}

/// The return of a `spill`.
pub(crate) fn page<T: serde::Serialize>(p: Option<&SpillPage<T>>) -> Value {
    let entries = |p: &SpillPage<T>| p.entries().iter().map(|d| json!([d.value, d.ops])).collect::<Vec<_>>();
    p.map_or(json!({"page": null}), |p| json!({"page": entries(p)}))
}

/// The stats and entries of `relay`, as the fixture's keys.
fn state<T: serde::Serialize, M: MergePolicy<T>>(relay: &Relay<T, M>) -> Map<String, Value> {
    let mut m = stats(&relay.stats());
    m.insert("entries".into(), Value::Array(relay.iter().map(|v| json!(v)).collect()));
    m
}

fn stats(s: &RelayStats) -> Map<String, Value> {
    match json!(s) {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// One relay fixture's run on a target.
pub trait RelaySession {
    /// Applies `op`: its return, and the state after it (the stats keys,
    /// `entries`, and `invalidates`).
    ///
    /// # Errors
    /// A failure of the target itself (not a mismatch).
    fn apply(&mut self, op: &RelayOp) -> Result<(Value, Map<String, Value>), String>;
}

/// What a session applies an op with: the relay, the entries popped and
/// the pages spilled that the fixture may put back.
fn step<T: Typed, M: MergePolicy<T>>(
    relay: &mut Relay<T, M>,
    popped_back: &mut Vec<Drained<T>>,
    pages: &mut Vec<SpillPage<T>>,
    op: &RelayOp,
) -> Result<Value, String> {
    Ok(match op {
        RelayOp::Send(v) => sent(&relay.send(typed(v)?)),
        RelayOp::Pop => {
            let d = relay.pop();
            let out = popped(d.as_ref());
            popped_back.extend(d);
            out
        }
        RelayOp::Unpop => {
            relay.unpop(popped_back.pop().ok_or("unpop with no entry popped")?);
            Value::Null
        }
        RelayOp::Spill => {
            let p = relay.spill();
            let out = page(p.as_ref());
            pages.extend(p);
            out
        }
        RelayOp::Unspill => {
            relay.unspill(pages.pop().ok_or("unspill with no page spilled")?);
            Value::Null
        }
        RelayOp::Replayed(ops) => {
            relay.replayed(*ops);
            Value::Null
        }
        RelayOp::RestoreCold(ops) => {
            relay.restore_cold(*ops);
            Value::Null
        }
    })
}

struct CoreRelay<T, M> {
    relay: Relay<T, M>,
    popped: Vec<Drained<T>>,
    pages: Vec<SpillPage<T>>,
}

impl<T: Typed, M: MergePolicy<T>> RelaySession for CoreRelay<T, M> {
    fn apply(&mut self, op: &RelayOp) -> Result<(Value, Map<String, Value>), String> {
        let before = self.relay.stats();
        let returns = step(&mut self.relay, &mut self.popped, &mut self.pages, op)?;
        let mut s = state(&self.relay);
        // The pure relay's change set: the stats that changed.
        let (b, a) = (stats(&before), stats(&self.relay.stats()));
        let flags = READERS.iter().map(|k| ((*k).to_owned(), Value::Bool(b.get(*k) != a.get(*k)))).collect();
        s.insert("invalidates".into(), Value::Object(flags));
        Ok((returns, s))
    }
}

/// The relay cell on a graph, each reader watched by an effect counting
/// its runs.
struct ShellRelay<T: 'static, M: 'static, F: egress_reactive::Flavor> {
    cell: egress_reactive::RelayCellOf<T, M, F>,
    runs: Vec<Arc<AtomicU32>>,
    popped: Vec<Drained<T>>,
    pages: Vec<SpillPage<T>>,
    _keep: Box<dyn std::any::Any>,
}

impl<T: Typed, M: MergePolicy<T> + 'static, F: egress_reactive::Flavor> ShellRelay<T, M, F> {
    fn readers(cell: &egress_reactive::RelayCellOf<T, M, F>) -> [Value; 11] {
        [
            json!(cell.depth().get_untracked()),
            json!(cell.ops().get_untracked()),
            json!(cell.bytes().get_untracked()),
            json!(cell.is_full().get_untracked()),
            json!(cell.accepted().get_untracked()),
            json!(cell.conflated().get_untracked()),
            json!(cell.dropped().get_untracked()),
            json!(cell.blocked().get_untracked()),
            json!(cell.drained().get_untracked()),
            json!(cell.spilled().get_untracked()),
            json!(cell.cold().get_untracked()),
        ]
    }
}

impl<T: Typed, M: MergePolicy<T> + 'static, F: egress_reactive::Flavor> RelaySession for ShellRelay<T, M, F> {
    fn apply(&mut self, op: &RelayOp) -> Result<(Value, Map<String, Value>), String> {
        let before: Vec<u32> = self.runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
        let (popped, pages) = (&mut self.popped, &mut self.pages);
        let returns = self.cell.with_relay_mut(|relay| step(relay, popped, pages, op))?;
        let after: Vec<u32> = self.runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
        // The state as the readers show it, and the entries from the relay.
        let mut s: Map<String, Value> =
            READERS.iter().zip(Self::readers(&self.cell)).map(|(k, v)| ((*k).to_owned(), v)).collect();
        let entries = self.cell.with_relay(|r| r.iter().map(|v| json!(v)).collect());
        s.insert("entries".into(), Value::Array(entries));
        let flags =
            READERS.iter().enumerate().map(|(i, k)| ((*k).to_owned(), Value::Bool(after[i] != before[i]))).collect();
        s.insert("invalidates".into(), Value::Object(flags));
        Ok((returns, s))
    }
}

/// Builds the shell session of `fixture` on a graph of each flavour: one
/// macro arm per concrete flavour, as an effect's closure needs one.
macro_rules! shell_session {
    ($name:ident, $flavor:ty, $cx:expr) => {
        /// A session of `fixture` on a relay cell of this flavour.
        pub(crate) fn $name(fixture: &RelayFixture) -> Result<Box<dyn RelaySession>, String> {
            fn make<T: Typed + Sync, M: MergePolicy<T> + Send + Sync + 'static>(
                policy: M,
                bp: Backpressure,
            ) -> Result<Box<dyn RelaySession>, String> {
                let cx = $cx;
                let handle: egress_reactive::Handle<$flavor> = cx.handle();
                let relay = Relay::weighed(policy, bp, weigh::<T>).map_err(|e| e.to_string())?;
                let cell = egress_reactive::RelayCellOf::from_relay(&handle, relay);
                let mut runs = Vec::new();
                let mut effects = Vec::new();
                for i in 0..READERS.len() {
                    let count = Arc::new(AtomicU32::new(0));
                    let (c, n) = (cell.clone(), count.clone());
                    effects.push(handle.effect(move || {
                        let _ = match i {
                            0 => c.depth().try_get().map(|_| ()),
                            1 => c.ops().try_get().map(|_| ()),
                            2 => c.bytes().try_get().map(|_| ()),
                            3 => c.is_full().try_get().map(|_| ()),
                            4 => c.accepted().try_get().map(|_| ()),
                            5 => c.conflated().try_get().map(|_| ()),
                            6 => c.dropped().try_get().map(|_| ()),
                            7 => c.blocked().try_get().map(|_| ()),
                            8 => c.drained().try_get().map(|_| ()),
                            9 => c.spilled().try_get().map(|_| ()),
                            _ => c.cold().try_get().map(|_| ()),
                        };
                        n.fetch_add(1, Ordering::SeqCst);
                    }));
                    runs.push(count);
                }
                Ok(Box::new(ShellRelay {
                    cell,
                    runs,
                    popped: Vec::new(),
                    pages: Vec::new(),
                    _keep: Box::new((effects, cx)),
                }))
            }
            let bp = fixture.backpressure;
            match fixture.policy {
                PolicyName::KeepLatest => make::<Value, _>(KeepLatest, bp),
                PolicyName::Max => make::<u64, _>(Max, bp),
                PolicyName::Sum => make::<u64, _>(Sum, bp),
                PolicyName::SetUnion => make::<BTreeSet<u64>, _>(SetUnion, bp),
                PolicyName::RawFifo => make::<Vec<Value>, _>(RawFifo, bp),
            }
        }
    };
}

shell_session!(on_context, egress_reactive::Local, egress_reactive::Context::new());
shell_session!(on_thread_safe, egress_reactive::Threaded, egress_reactive::ThreadSafeContext::new());
shell_session!(on_async, egress_reactive::Threaded, egress_reactive::AsyncContext::new());

/// Runs every step of `fixture` on `session`.
#[must_use]
pub fn run_relay_session(fixture: &RelayFixture, session: &mut dyn RelaySession) -> Verdict {
    for (i, step) in fixture.steps.iter().enumerate() {
        let (got, state) = match session.apply(&step.op) {
            Ok(applied) => applied,
            Err(message) => return Verdict::TargetError { step: Some(i), message },
        };
        // `invalidates` asserts the readers it names.
        let named = [("invalidates", 1)];
        if let Some(verdict) = judge_step(i, &step.text, (&step.returns, &got), (&step.expected, &state), &named) {
            return verdict;
        }
    }
    Verdict::Passed { steps: fixture.steps.len() }
}
