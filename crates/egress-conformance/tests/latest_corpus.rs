//! The latest-value projection fixtures (`conformance/latest/`, in the
//! seed design's `LatestDurableProjection` shape) pass on the core and on
//! the latest cell of every flavour; a mutated fixture fails at the field
//! mutated on every target (a shell's invalidations read off its per-key
//! readers); a malformed one is an error naming its JSON path; a fixture
//! of the design (no clock) runs with every backoff ended.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use egress_conformance::{LatestFixture, Target, Verdict, collect_files, run_files, run_latest_fixture, targets};
use serde_json::{Value, json};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/latest")
}

fn load(name: &str) -> Value {
    let text = std::fs::read_to_string(dir().join(name)).expect("the fixture exists");
    serde_json::from_str(&text).expect("the fixture is JSON")
}

#[test]
fn every_latest_fixture_passes_on_the_core_and_on_every_shell() {
    let files = collect_files(&[dir()]).expect("the folder is readable");
    assert!(files.len() >= 3, "only {} latest fixtures", files.len());
    let reports = run_files(&files, &targets()).expect("the fixtures are well formed");
    assert_eq!(reports.len(), files.len() * targets().len());
    for report in &reports {
        assert!(matches!(report.verdict, Verdict::Passed { steps } if steps >= 10), "{report}");
    }
}

/// Where `value` fails on each target: (step, field).
fn mismatches(value: &Value) -> Vec<(usize, String)> {
    let fixture = LatestFixture::from_value(Path::new("mutated.json"), value).expect("still well formed");
    targets()
        .iter()
        .map(|t: &&dyn Target| match run_latest_fixture(&fixture, t.latest().expect("every target")) {
            Verdict::Mismatch(m) => (m.step, m.field),
            other => panic!("{}: expected a mismatch, got {other:?}", t.name()),
        })
        .collect()
}

#[test]
fn a_mutated_latest_fixture_fails_at_the_field_mutated_on_every_target() {
    let name = "latest_a_failure_keeps_the_desire_and_waits_its_backoff.json";
    let cases = [
        (3, "/returns/retry_at", json!(111), "returns.retry_at"),
        (4, "/returns/until", json!(109), "returns.until"),
        (3, "/expected/entries/0/backoff", json!(null), "expected.entries[0].backoff"),
        (3, "/expected/invalidates/k/durable_through", json!(true), "expected.invalidates.k.durable_through"),
        (3, "/expected/invalidates/other/desired", json!(true), "expected.invalidates.other.desired"),
        (7, "/expected/invalidates/k/backoff", json!(false), "expected.invalidates.k.backoff"),
        (7, "/returns/freed", json!([]), "returns.freed[0]"),
        (10, "/expected/entries/0/desired/value", json!("v1"), "expected.entries[0].desired.value"),
    ];
    for (step, pointer, value, field) in cases {
        let mut v = load(name);
        *v["scenarios"][0]["steps"][step].pointer_mut(pointer).unwrap_or_else(|| panic!("{pointer}")) = value;
        for got in mismatches(&v) {
            assert_eq!(got, (step, field.to_owned()), "{pointer}");
        }
    }
    // The step number counts across scenarios; the generation is asserted.
    let mut v = load("latest_a_reconnect_requeues_flights_and_fences_the_old_generation.json");
    v["scenarios"][0]["steps"][11]["expected"]["generation"] = json!(5);
    for got in mismatches(&v) {
        assert_eq!(got, (11, "expected.generation".to_owned()));
    }
}

#[test]
fn a_fixture_of_the_design_has_no_clock_every_backoff_ended_before_each_op() {
    let doc = json!({
        "description": "a failure, then a claim, with no clock",
        "kind": "LatestDurableProjection", "model": "LatestDurableProjectionCore",
        "scenarios": [{"id": "retry", "generation": 1, "steps": [
            {"op": {"type": "upsert_desired", "key": "k", "epoch": 1, "value": "A"}, "returns": {"upsert": "accepted"}},
            {"op": {"type": "claim", "key": "k", "generation": 1},
             "returns": {"claim": "claimed", "envelope": {"generation": 1, "key": "k", "epoch": 1, "value": "A"}}},
            {"op": {"type": "fail_retryable", "key": "k", "generation": 1, "epoch": 1}, "returns": {"failure": "pending"},
             "expected": {"entries": [{"key": "k", "desired": {"epoch": 1, "value": "A"}, "inflight": null, "durable_through": null}]}},
            {"op": {"type": "claim", "key": "k", "generation": 1},
             "returns": {"claim": "claimed", "envelope": {"generation": 1, "key": "k", "epoch": 1, "value": "A"}}}
        ]}]
    });
    let fixture = LatestFixture::from_value(Path::new("design.json"), &doc).unwrap();
    for t in targets() {
        assert_eq!(run_latest_fixture(&fixture, t.latest().unwrap()), Verdict::Passed { steps: 4 }, "{}", t.name());
    }
    // With a clock, the same fixture needs `now`.
    let mut clocked = doc.clone();
    clocked["backoff"] = json!({"base": 10, "ceiling": 100});
    let err = LatestFixture::from_value(Path::new("clocked.json"), &clocked).unwrap_err();
    assert_eq!(err.path, "scenarios[0].steps[2].op.now");
}

fn malformed(value: &Value) -> String {
    LatestFixture::from_value(Path::new("bad.json"), value).expect_err("malformed").path
}

#[test]
fn a_malformed_latest_fixture_names_its_json_path() {
    let name = "latest_upserts_newer_wins_and_every_refusal_changes_nothing.json";
    let step = |v: &mut Value, i: usize, path: &str, x: Value| {
        *v["scenarios"][0]["steps"][i].pointer_mut(path).unwrap() = x;
    };
    let mut v = load(name);
    step(&mut v, 1, "/op", json!({"type": "delete", "key": "a"}));
    assert_eq!(malformed(&v), "scenarios[0].steps[1].op.type");
    let mut v = load(name);
    step(&mut v, 1, "/op", json!({"type": "claim", "key": "a", "generation": 1, "lane": "x"}));
    assert_eq!(malformed(&v), "scenarios[0].steps[1].op.lane");
    let mut v = load(name);
    step(&mut v, 1, "/op", json!({"type": "claim", "key": 7, "generation": 1}));
    assert_eq!(malformed(&v), "scenarios[0].steps[1].op.key");
    let mut v = load(name);
    step(&mut v, 1, "/op", json!({"type": "ack_applied", "key": "a", "generation": 1}));
    assert_eq!(malformed(&v), "scenarios[0].steps[1].op.epoch");
    let mut v = load(name);
    step(
        &mut v,
        1,
        "/op",
        json!({"type": "fail_retryable", "key": "a", "generation": 1, "epoch": 1, "now": 0, "retry_after": "soon"}),
    );
    assert_eq!(malformed(&v), "scenarios[0].steps[1].op.retry_after");
    let mut v = load(name);
    v["scenarios"][0]["steps"][1]["expected"] = json!({"colour": 1});
    assert_eq!(malformed(&v), "scenarios[0].steps[1].expected.colour");
    let mut v = load(name);
    v["scenarios"][0]["steps"][1]["expected"] = json!({"invalidates": {"a": {"colour": true}}});
    assert_eq!(malformed(&v), "scenarios[0].steps[1].expected.invalidates.a.colour");
    let mut v = load(name);
    v["scenarios"][0]["steps"][1]["expected"] = json!({"invalidates": {"a": true}});
    assert_eq!(malformed(&v), "scenarios[0].steps[1].expected.invalidates.a");
    let mut v = load(name);
    v["model"] = json!("Latest");
    assert_eq!(malformed(&v), "kind");
    let mut v = load(name);
    v["backoff"] = json!({"base": 10, "ceiling": 5});
    assert_eq!(malformed(&v), "backoff");
    let mut v = load(name);
    v["scenarios"] = json!([]);
    assert_eq!(malformed(&v), "scenarios");
    let mut v = load(name);
    v["scenarios"][0]["steps"] = json!([]);
    assert_eq!(malformed(&v), "scenarios[0].steps");
}
