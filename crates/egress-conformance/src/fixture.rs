//! The fixture schema (see `conformance/README.md`) and its loading, with
//! errors that name the file and the JSON path.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use egress_core::{
    DeadLetters, DeadMark, DeadReason, Delay, EgressCore, FailureKind, Generation, JitterSample, Ordering, Policy,
    Restored, RestoredRecord, Sequence, Time,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One fixture: a policy, a starting generation and the steps to replay.
#[derive(Clone, Debug)]
pub struct Fixture {
    /// What the fixture checks, in words.
    pub description: String,
    /// Always `"Egress"`.
    pub kind: String,
    /// Always `"EgressCore"`.
    pub model: String,
    /// The generation the core starts at.
    pub generation: u64,
    /// The policy, as integers in ticks.
    pub policy: FixturePolicy,
    /// A store's snapshot to restore from: the core keeps a journal (an
    /// extension of this corpus, in `conformance/durable/`).
    pub restored: Option<FixtureRestored>,
    /// The steps, in order.
    pub steps: Vec<Step>,
}

/// A store's snapshot, as a fixture gives it (`generation` is the
/// fixture's).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixtureRestored {
    /// The next sequence.
    pub next_sequence: u64,
    /// The acknowledgement watermark.
    #[serde(default)]
    pub acked_through: Option<u64>,
    /// The stored records, in order.
    #[serde(default)]
    pub records: Vec<FixtureRecord>,
}

/// One stored record.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixtureRecord {
    /// Its sequence.
    pub sequence: u64,
    /// Its payload.
    pub payload: Value,
    /// Why it died, for a dead letter.
    #[serde(default)]
    pub dead: Option<DeadReason>,
    /// Whether a dead letter is held (otherwise a tombstone).
    #[serde(default)]
    pub held: bool,
}

/// A fixture's policy.
#[derive(Clone, Debug, Deserialize)]
pub struct FixturePolicy {
    /// See [`Policy::inflight_limit`].
    pub inflight_limit: usize,
    /// See [`Policy::retry_budget`].
    pub retry_budget: u32,
    /// See [`Policy::replay_limit`]. Absent: no limit (`u32::MAX`), as the
    /// design has none; an extension of this corpus, so a fixture that
    /// relies on a limit states it.
    #[serde(default = "design_replay_limit")]
    pub replay_limit: u32,
    /// See [`Policy::retry_base`], in ticks.
    pub retry_base: u64,
    /// See [`Policy::retry_ceiling`], in ticks.
    pub retry_ceiling: u64,
    /// `"pipelined"` (the default) or `"strict"`.
    #[serde(default)]
    pub ordering: Ordering,
    /// An extension of this corpus: the jitter fraction (default 0).
    #[serde(default)]
    pub jitter: f64,
    /// `"skip"` (dead letters become tombstones) or `"hold"`. Absent:
    /// `"hold"`, the design's reading (an exhausted record is terminal and
    /// stays out of the stream), not [`Policy::default`]'s `skip`: an
    /// extension of this corpus, so a fixture that relies on tombstones
    /// states it.
    #[serde(default = "design_dead_letters")]
    pub dead_letters: DeadLetters,
}

const fn design_replay_limit() -> u32 {
    u32::MAX
}

const fn design_dead_letters() -> DeadLetters {
    DeadLetters::Hold
}

/// One step: an operation, what it must return, and the state after it.
#[derive(Clone, Debug)]
pub struct Step {
    /// The operation.
    pub op: Op,
    /// The exact return value.
    pub returns: Value,
    /// The state afterwards; only the keys present are asserted.
    pub expected: BTreeMap<String, Value>,
}

/// The document as read, before ops are decoded one by one (so that an
/// error inside an op can name its field).
#[derive(Deserialize)]
struct RawFixture {
    description: String,
    kind: String,
    model: String,
    generation: u64,
    policy: FixturePolicy,
    #[serde(default)]
    restored: Option<FixtureRestored>,
    steps: Vec<RawStep>,
}

#[derive(Deserialize)]
struct RawStep {
    op: Value,
    returns: Value,
    #[serde(default)]
    expected: BTreeMap<String, Value>,
}

/// Every field any op may carry but `payload` (taken out first, since a
/// `null` payload is a payload).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OpFields {
    #[serde(rename = "type")]
    ty: String,
    generation: Option<u64>,
    through: Option<u64>,
    sequence: Option<u64>,
    kind: Option<FailKindName>,
    retry_after: Option<u64>,
    now: Option<u64>,
    jitter_sample: Option<f64>,
    epoch: Option<u64>,
    reason: Option<String>,
    after: Option<u64>,
    appended: Option<Vec<(u64, Value)>>,
}

/// The op types, as fixtures name them.
pub const OP_TYPES: [&str; 16] = [
    "enqueue",
    "claim",
    "ack",
    "received",
    "fail",
    "retry_now",
    "handle_timeout",
    "requeue",
    "reconnect",
    "poll_ready",
    "persisted",
    "persist_failed",
    "adopt",
    "enqueue_after",
    "release",
    "rebase",
];

/// A fixture operation, tagged by `"type"`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Op {
    /// `enqueue(payload)`.
    Enqueue {
        /// Any JSON value.
        payload: Value,
    },
    /// `claim(generation)`.
    Claim {
        /// The caller's generation.
        generation: u64,
    },
    /// `ack(generation, through)`.
    Ack {
        /// The caller's generation.
        generation: u64,
        /// The acknowledged sequence.
        through: u64,
    },
    /// `received(generation, through)`.
    Received {
        /// The caller's generation.
        generation: u64,
        /// The sequence the peer holds everything through.
        through: u64,
    },
    /// `fail(generation, sequence, kind, now)`.
    Fail {
        /// The caller's generation.
        generation: u64,
        /// The failed sequence.
        sequence: u64,
        /// `"transient"` (the default) or `"permanent"`.
        #[serde(skip_serializing_if = "Option::is_none")]
        kind: Option<FailKindName>,
        /// A retry-after hint in ticks (makes the kind `RetryAfter`).
        #[serde(skip_serializing_if = "Option::is_none")]
        retry_after: Option<u64>,
        /// The failure time (default 0).
        now: u64,
        /// An extension of this corpus: the jitter sample in `[0, 1]`
        /// (default 0).
        #[serde(skip_serializing_if = "Option::is_none")]
        jitter_sample: Option<f64>,
    },
    /// `retry_now(generation, sequence)`.
    RetryNow {
        /// The caller's generation.
        generation: u64,
        /// The parked sequence.
        sequence: u64,
    },
    /// `handle_timeout(now)`.
    HandleTimeout {
        /// The time (default 0).
        now: u64,
    },
    /// `requeue(generation, sequence)`.
    Requeue {
        /// The caller's generation.
        generation: u64,
        /// The exhausted sequence.
        sequence: u64,
    },
    /// `reconnect(generation)`.
    Reconnect {
        /// The new generation.
        generation: u64,
    },
    /// `poll_ready()`, with the payloads of its appends.
    PollReady,
    /// `persisted(epoch)`.
    Persisted {
        /// The epoch written.
        epoch: u64,
    },
    /// `persist_failed(epoch, reason)`.
    PersistFailed {
        /// The epoch that failed.
        epoch: u64,
        /// What the store said.
        reason: String,
    },
    /// `enqueue_after(payload, after)`.
    EnqueueAfter {
        /// Any JSON value.
        payload: Value,
        /// The flush epoch it waits for.
        after: u64,
    },
    /// `release(through)`.
    Release {
        /// The flush epoch released.
        through: u64,
    },
    /// `adopt(sequence, payload)`.
    Adopt {
        /// The sequence the store assigned.
        sequence: u64,
        /// Any JSON value.
        payload: Value,
    },
    /// `rebase(appended)`: another writer's records, `[sequence, payload]`
    /// each.
    Rebase {
        /// The records in store order.
        appended: Vec<(u64, Value)>,
    },
}

/// The failure kinds a fixture may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailKindName {
    /// Retry after the backoff.
    Transient,
    /// Never retry.
    Permanent,
}

/// The keys `expected` may hold.
pub const STATE_KEYS: [&str; 15] = [
    "gated_len",
    "durable_through",
    "unpersisted_len",
    "generation_durable",
    "persist_error",
    "generation",
    "next_sequence",
    "pending",
    "inflight",
    "acked_through",
    "retry",
    "parked",
    "exhausted",
    "received_through",
    "invalidates",
];

/// The readers `expected.invalidates` may name (`generation` is an
/// extension of this corpus).
pub const INVALIDATION_KEYS: [&str; 10] = [
    "pending",
    "inflight",
    "acked_through",
    "retry",
    "parked",
    "exhausted",
    "generation",
    "received_through",
    "durable",
    "persist_error",
];

/// A fixture that cannot be run: unreadable, not JSON, or not the schema.
#[derive(Debug, thiserror::Error)]
#[error("{file}: at {path}: {message}")]
pub struct FixtureError {
    /// The fixture file.
    pub file: PathBuf,
    /// The JSON path of the offending value (`.` for the document).
    pub path: String,
    /// What is wrong with it.
    pub message: String,
}

impl FixtureError {
    fn new(file: &Path, path: impl Into<String>, message: impl Into<String>) -> Self {
        Self { file: file.to_path_buf(), path: path.into(), message: message.into() }
    }
}

/// The typed arguments of a `fail` op.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FailArgs {
    /// The caller's generation.
    pub generation: Generation,
    /// The failed sequence.
    pub sequence: Sequence,
    /// The failure kind.
    pub kind: FailureKind,
    /// The failure time.
    pub now: Time,
    /// The jitter sample.
    pub jitter: JitterSample,
}

impl Op {
    /// The `fail` arguments in core types, or `None` for other ops.
    /// Validated at load time, so a loaded fixture never fails here.
    #[must_use]
    pub fn fail_args(&self) -> Option<FailArgs> {
        let Self::Fail { generation, sequence, kind, retry_after, now, jitter_sample } = *self else {
            return None;
        };
        let kind = match (kind, retry_after) {
            (Some(FailKindName::Permanent), _) => FailureKind::Permanent,
            (_, Some(d)) => FailureKind::RetryAfter(Delay(d)),
            (Some(FailKindName::Transient) | None, None) => FailureKind::Transient,
        };
        Some(FailArgs {
            generation: Generation(generation),
            sequence: Sequence(sequence),
            kind,
            now: Time(now),
            jitter: jitter_sample.and_then(|j| JitterSample::new(j).ok()).unwrap_or(JitterSample::ZERO),
        })
    }
}

impl Fixture {
    /// Reads and validates a fixture file.
    ///
    /// # Errors
    /// [`FixtureError`] naming the file and the JSON path at fault.
    pub fn load(file: &Path) -> Result<Self, FixtureError> {
        let text =
            std::fs::read_to_string(file).map_err(|e| FixtureError::new(file, ".", format!("unreadable: {e}")))?;
        Self::parse(file, &text)
    }

    /// Parses and validates fixture text; `file` is only used in errors.
    ///
    /// # Errors
    /// [`FixtureError`] naming the file and the JSON path at fault.
    pub fn parse(file: &Path, text: &str) -> Result<Self, FixtureError> {
        let mut de = serde_json::Deserializer::from_str(text);
        let raw: RawFixture = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            FixtureError::new(file, path, e.into_inner().to_string())
        })?;
        de.end().map_err(|e| FixtureError::new(file, ".", e.to_string()))?;
        let mut steps = Vec::with_capacity(raw.steps.len());
        for (i, step) in raw.steps.into_iter().enumerate() {
            let op = decode_op(step.op)
                .map_err(|(path, message)| FixtureError::new(file, format!("steps[{i}].op{path}"), message))?;
            steps.push(Step { op, returns: step.returns, expected: step.expected });
        }
        let fixture = Self {
            description: raw.description,
            kind: raw.kind,
            model: raw.model,
            generation: raw.generation,
            policy: raw.policy,
            restored: raw.restored,
            steps,
        };
        fixture.validate(file)?;
        Ok(fixture)
    }

    fn validate(&self, file: &Path) -> Result<(), FixtureError> {
        if self.kind != "Egress" {
            return Err(FixtureError::new(file, "kind", format!("expected \"Egress\", got {:?}", self.kind)));
        }
        if self.model != "EgressCore" {
            return Err(FixtureError::new(file, "model", format!("expected \"EgressCore\", got {:?}", self.model)));
        }
        self.policy.to_policy().map_err(|e| FixtureError::new(file, "policy", e.to_string()))?;
        if self.restored.is_some() {
            self.core().map_err(|e| FixtureError::new(file, "restored", e))?;
        }
        for (i, step) in self.steps.iter().enumerate() {
            if let Op::Fail { kind: Some(FailKindName::Permanent), retry_after: Some(_), .. } = step.op {
                return Err(FixtureError::new(
                    file,
                    format!("steps[{i}].op"),
                    "a permanent failure cannot carry retry_after",
                ));
            }
            if let Op::Fail { jitter_sample: Some(j), .. } = step.op {
                JitterSample::new(j)
                    .map_err(|e| FixtureError::new(file, format!("steps[{i}].op.jitter_sample"), e.to_string()))?;
            }
            for (key, value) in &step.expected {
                if !STATE_KEYS.contains(&key.as_str()) {
                    return Err(FixtureError::new(
                        file,
                        format!("steps[{i}].expected.{key}"),
                        format!("unknown key; expected one of {STATE_KEYS:?}"),
                    ));
                }
                if key == "invalidates" {
                    let Value::Object(map) = value else {
                        return Err(FixtureError::new(
                            file,
                            format!("steps[{i}].expected.invalidates"),
                            "expected an object of booleans",
                        ));
                    };
                    for (reader, flag) in map {
                        if !INVALIDATION_KEYS.contains(&reader.as_str()) || !flag.is_boolean() {
                            return Err(FixtureError::new(
                                file,
                                format!("steps[{i}].expected.invalidates.{reader}"),
                                format!("expected a boolean for one of {INVALIDATION_KEYS:?}"),
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

impl Fixture {
    /// The core a target starts from: restored from `restored` when
    /// present (a journal), otherwise empty at `generation`.
    ///
    /// # Errors
    /// The policy's or the snapshot's refusal, in words.
    pub fn core(&self) -> Result<EgressCore<Value>, String> {
        let policy = self.policy.to_policy().map_err(|e| e.to_string())?;
        let Some(r) = &self.restored else {
            return Ok(EgressCore::with_generation(policy, Generation(self.generation)));
        };
        let snapshot = Restored {
            generation: Generation(self.generation),
            next_sequence: Sequence(r.next_sequence),
            acked_through: r.acked_through.map(Sequence),
            records: r
                .records
                .iter()
                .map(|x| RestoredRecord {
                    sequence: Sequence(x.sequence),
                    payload: x.payload.clone(),
                    dead: x.dead.map(|reason| DeadMark { reason, held: x.held }),
                })
                .collect(),
            skipped: Vec::new(),
        };
        EgressCore::restore(policy, snapshot).map_err(|e| e.to_string())
    }
}

impl FixturePolicy {
    /// The validated core policy.
    ///
    /// # Errors
    /// The core's [`egress_core::PolicyError`].
    pub fn to_policy(&self) -> Result<Policy, egress_core::PolicyError> {
        Policy::builder()
            .inflight_limit(self.inflight_limit)
            .retry_budget(self.retry_budget)
            .replay_limit(self.replay_limit)
            .retry_base(Delay(self.retry_base))
            .retry_ceiling(Delay(self.retry_ceiling))
            .jitter(self.jitter)
            .ordering(self.ordering)
            .dead_letters(self.dead_letters)
            .build()
    }
}

/// Decodes one op; an error carries the path below the op (`""` for the op
/// itself, `".generation"` for a field) and a message.
pub(crate) fn decode_op(value: Value) -> Result<Op, (String, String)> {
    let Value::Object(mut map) = value else {
        return Err((String::new(), "expected an object with a \"type\"".into()));
    };
    let payload = map.remove("payload");
    let fields: OpFields = serde_path_to_error::deserialize(Value::Object(map)).map_err(|e| {
        let path = e.path().to_string();
        let below = if path == "." { String::new() } else { format!(".{path}") };
        (below, e.into_inner().to_string())
    })?;
    let ty = fields.ty.as_str();
    if !OP_TYPES.contains(&ty) {
        return Err((".type".into(), format!("unknown op type {ty:?}; expected one of {OP_TYPES:?}")));
    }
    let allowed: &[&str] = match ty {
        "enqueue" => &["payload"],
        "claim" | "reconnect" => &["generation"],
        "ack" | "received" => &["generation", "through"],
        "fail" => &["generation", "sequence", "kind", "retry_after", "now", "jitter_sample"],
        "handle_timeout" => &["now"],
        "poll_ready" => &[],
        "persisted" => &["epoch"],
        "persist_failed" => &["epoch", "reason"],
        "adopt" => &["sequence", "payload"],
        "enqueue_after" => &["payload", "after"],
        "release" => &["through"],
        "rebase" => &["appended"],
        _ => &["generation", "sequence"],
    };
    let present = [
        ("payload", payload.is_some()),
        ("generation", fields.generation.is_some()),
        ("through", fields.through.is_some()),
        ("sequence", fields.sequence.is_some()),
        ("kind", fields.kind.is_some()),
        ("retry_after", fields.retry_after.is_some()),
        ("now", fields.now.is_some()),
        ("jitter_sample", fields.jitter_sample.is_some()),
        ("epoch", fields.epoch.is_some()),
        ("reason", fields.reason.is_some()),
        ("after", fields.after.is_some()),
        ("appended", fields.appended.is_some()),
    ];
    if let Some((name, _)) = present.iter().find(|(name, here)| *here && !allowed.contains(name)) {
        return Err((format!(".{name}"), format!("not a field of a {ty} op; expected some of {allowed:?}")));
    }
    let need = |name: &str, v: Option<u64>| v.ok_or_else(|| (format!(".{name}"), format!("a {ty} op needs {name}")));
    Ok(match ty {
        "enqueue" => {
            Op::Enqueue { payload: payload.ok_or_else(|| (".payload".into(), "an enqueue op needs payload".into()))? }
        }
        "claim" => Op::Claim { generation: need("generation", fields.generation)? },
        "reconnect" => Op::Reconnect { generation: need("generation", fields.generation)? },
        "ack" => {
            Op::Ack { generation: need("generation", fields.generation)?, through: need("through", fields.through)? }
        }
        "received" => Op::Received {
            generation: need("generation", fields.generation)?,
            through: need("through", fields.through)?,
        },
        "fail" => Op::Fail {
            generation: need("generation", fields.generation)?,
            sequence: need("sequence", fields.sequence)?,
            kind: fields.kind,
            retry_after: fields.retry_after,
            now: fields.now.unwrap_or(0),
            jitter_sample: fields.jitter_sample,
        },
        "handle_timeout" => Op::HandleTimeout { now: fields.now.unwrap_or(0) },
        "poll_ready" => Op::PollReady,
        "persisted" => Op::Persisted { epoch: need("epoch", fields.epoch)? },
        "persist_failed" => Op::PersistFailed {
            epoch: need("epoch", fields.epoch)?,
            reason: fields
                .reason
                .ok_or_else(|| (".reason".to_owned(), "a persist_failed op needs reason".to_owned()))?,
        },
        "enqueue_after" => Op::EnqueueAfter {
            payload: payload.ok_or_else(|| (".payload".into(), "an enqueue_after op needs payload".into()))?,
            after: need("after", fields.after)?,
        },
        "release" => Op::Release { through: need("through", fields.through)? },
        "rebase" => Op::Rebase {
            appended: fields
                .appended
                .ok_or_else(|| (".appended".to_owned(), "a rebase op needs appended".to_owned()))?,
        },
        "adopt" => Op::Adopt {
            sequence: need("sequence", fields.sequence)?,
            payload: payload.ok_or_else(|| (".payload".into(), "an adopt op needs payload".into()))?,
        },
        "retry_now" => Op::RetryNow {
            generation: need("generation", fields.generation)?,
            sequence: need("sequence", fields.sequence)?,
        },
        _ => Op::Requeue {
            generation: need("generation", fields.generation)?,
            sequence: need("sequence", fields.sequence)?,
        },
    })
}
