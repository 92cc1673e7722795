//! The reactive-graph corpus (`conformance/graph/`) passes on every graph
//! flavour, and the runner really checks: a wrong expectation fails at its
//! field, scenarios that should agree and do not are caught, what a flavour
//! does not offer is skipped with its reason, and bad input is refused.

use std::path::{Path, PathBuf};
use std::process::Command;

use egress_conformance::{GraphFixture, Report, Verdict, collect_files, run_files, run_graph_fixture, targets};
use serde_json::{Value, json};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/graph")
}

fn load(name: &str) -> Value {
    let text = std::fs::read_to_string(corpus_dir().join(name)).expect("fixture exists");
    serde_json::from_str(&text).expect("fixture is JSON")
}

/// The verdict of `doc` on each graph flavour, by target name.
fn verdicts(doc: &Value) -> Vec<(&'static str, Verdict)> {
    let fixture = GraphFixture::from_value(Path::new("inline.json"), doc).expect("well formed");
    targets()
        .into_iter()
        .filter_map(|t| t.graph().map(|start| (t.name(), run_graph_fixture(&fixture, &*start))))
        .collect()
}

/// The one verdict every flavour gives `doc`.
fn verdict(doc: &Value) -> Verdict {
    let all = verdicts(doc);
    assert_eq!(all.len(), 3, "three graph flavours");
    for (name, v) in &all {
        assert_eq!(v, &all[0].1, "{name} differs from {}", all[0].0);
    }
    all[0].1.clone()
}

fn mismatch(doc: &Value) -> (usize, String) {
    match verdict(doc) {
        Verdict::Mismatch(m) => (m.step, m.field),
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

#[test]
fn every_graph_fixture_passes_on_every_flavour() {
    let files = collect_files(&[corpus_dir()]).expect("readable");
    assert!(files.len() >= 10, "only {} graph fixtures", files.len());
    let reports = run_files(&files, &targets()).expect("well formed");
    let failures: Vec<String> = reports.iter().filter(|r| !r.passed()).map(ToString::to_string).collect();
    assert!(failures.is_empty(), "failing fixtures:\n{}", failures.join("\n"));
    // On the three flavours with a graph; the core has none.
    assert_eq!(reports.len(), files.len() * 3);
    let names: Vec<&str> = reports.iter().take(3).map(|r: &Report| r.target).collect();
    assert_eq!(names, ["context", "thread-safe", "async"]);
}

#[test]
fn a_wrong_expectation_fails_at_its_field() {
    let mut v = load("a_failed_compute_is_run_again_at_the_next_read.json");
    v["steps"][6]["expect"]["computes_of"]["twice"] = json!(2);
    assert_eq!(mismatch(&v), (6, "expect.computes_of.twice".to_owned()));

    let mut v = load("a_reader_of_a_disposed_node_fails_at_every_read.json");
    assert_eq!(v["steps"][10]["op"]["id"], "total");
    v["steps"][10]["expect"]["error"] = Value::Null;
    assert_eq!(mismatch(&v), (10, "expect.error".to_owned()));

    let mut v = load("scope_teardown_order_and_disarm.json");
    v["steps"][6]["expect"]["cleanup_order"] = json!(["e1", "e2", "e3", "c"]);
    assert_eq!(mismatch(&v), (6, "expect.cleanup_order".to_owned()));

    let mut v = load("disposal_runs_no_effect.json");
    v["steps"][7]["expect"]["observed_by"] = json!(["hears", "shows"]);
    assert_eq!(mismatch(&v), (7, "expect.observed_by".to_owned()));

    let mut v = load("a_feedback_loop_through_effects_reports_exhaustion.json");
    v["steps"][2]["expect"]["drain_exhausted"] = json!(false);
    assert_eq!(mismatch(&v), (2, "expect.drain_exhausted".to_owned()));
}

#[test]
fn scenarios_that_should_agree_and_do_not_are_caught() {
    // Leave `a` alive in the second scenario: its final state differs.
    let mut v = load("ending_a_scope_equals_disposing_its_members.json");
    let steps = v["scenarios"][1]["steps"].as_array_mut().expect("steps");
    let last = steps.pop().expect("a step");
    assert_eq!(last["op"]["id"], "a");
    let (_, field) = mismatch(&v);
    assert!(field.starts_with("scenario one_by_one: expected.final_state"), "{field}");

    // Drop only the final-state check: the scenarios still differ in what
    // they observed, which observationally_equal catches.
    v["expected"].as_object_mut().expect("object").remove("final_state");
    v["expected"]["after_publish"].as_object_mut().expect("object").remove("dependents_of");
    let (_, field) = mismatch(&v);
    assert_eq!(field, "observationally_equal: scope against one_by_one");
}

#[test]
fn what_a_flavour_does_not_offer_is_skipped_with_its_issue_and_the_rest_is_an_error() {
    let merge = json!({"kind": "ReactiveGraph", "steps": [
        {"op": {"type": "merge_cell", "id": "acc", "value": 0, "policy": "Sum"}}]});
    match verdict(&merge) {
        Verdict::Skipped { reason } => assert!(reason.contains("issue 33"), "{reason}"),
        other => panic!("expected a skip, got {other:?}"),
    }
    let key = json!({"kind": "ReactiveGraph", "steps": [
        {"op": {"type": "cell", "id": "c", "value": 0}, "expect": {"merges_of": {"c": 0}}}]});
    assert!(matches!(verdict(&key), Verdict::Skipped { .. }));
    let unknown = json!({"kind": "ReactiveGraph", "steps": [{"op": {"type": "teleport"}}]});
    assert!(matches!(verdict(&unknown), Verdict::TargetError { step: Some(0), .. }));
    let unknown_key = json!({"kind": "ReactiveGraph", "steps": [
        {"op": {"type": "cell", "id": "c", "value": 0}, "expect": {"colour": "red"}}]});
    assert!(matches!(verdict(&unknown_key), Verdict::TargetError { step: Some(0), .. }));
    let unknown_node = json!({"kind": "ReactiveGraph", "steps": [{"op": {"type": "read", "id": "nobody"}}]});
    assert!(matches!(verdict(&unknown_node), Verdict::TargetError { .. }));
}

#[test]
fn counts_and_read_lists_are_bounded_at_ten_thousand() {
    let ids = |n: usize| vec![json!("c"); n];
    let fixture = |fanout: u64, reads: usize| {
        json!({"kind": "ReactiveGraph", "steps": [
            {"op": {"type": "cell", "id": "c", "value": 1}},
            {"op": {"type": "computed", "id": "wide", "reads": ids(reads)}, "expect": {"computes_of": {"wide": 1}}},
            {"op": {"type": "fanout", "id_prefix": "f", "reads": ["c"], "count": fanout},
             "expect": {"dependents_of": {"c": fanout + 1}}}]})
    };
    assert_eq!(verdict(&fixture(10_000, 10_000)), Verdict::Passed { steps: 3 }, "the bound itself is allowed");
    for (fanout, reads, step) in [(10_001, 1, 2), (1, 10_001, 1)] {
        match verdict(&fixture(fanout, reads)) {
            Verdict::TargetError { step: Some(s), message } => {
                assert_eq!(s, step, "{message}");
                assert!(message.contains("10000"), "{message}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}

#[test]
fn a_passing_run_counts_the_steps_of_every_scenario() {
    let v = load("ending_a_scope_equals_disposing_its_members.json");
    let steps: usize =
        v["scenarios"].as_array().expect("scenarios").iter().map(|s| s["steps"].as_array().expect("steps").len()).sum();
    assert_eq!(verdict(&v), Verdict::Passed { steps });
}

#[test]
fn a_node_made_in_an_ended_scope_is_the_ops_failure() {
    let doc = json!({"kind": "ReactiveGraph", "steps": [
        {"op": {"type": "begin_scope", "scope": "s"}},
        {"op": {"type": "end_scope", "scope": "s"}},
        {"op": {"type": "cell", "id": "late", "value": 1, "scope": "s"}, "expect": {"error": null}}]});
    let (step, field) = mismatch(&doc);
    assert_eq!((step, field.as_str()), (2, "expect.error"));
}

#[test]
fn malformed_graph_fixtures_name_the_field() {
    let cases = [
        (json!({"kind": "ReactiveGraph"}), "."),
        (json!({"kind": "ReactiveGraph", "steps": {}}), "steps"),
        (json!({"kind": "ReactiveGraph", "steps": [{"op": {}}]}), "steps[0].op.type"),
        (json!({"kind": "ReactiveGraph", "steps": [{"op": {"type": "read"}, "expect": 3}]}), "steps[0].expect"),
        (json!({"kind": "ReactiveGraph", "scenarios": [{"name": "x"}]}), "scenarios[0].steps"),
        (json!({"kind": "ReactiveGraph", "steps": []}), "steps"),
        (json!({"kind": "ReactiveGraph", "steps": [{"op": {"type": "read"}, "expects": {}}]}), "steps[0].expects"),
        (json!({"kind": "ReactiveGraph", "steps": [3]}), "steps[0]"),
        (
            json!({"kind": "ReactiveGraph", "steps": [{"op": {"type": "read"}}], "expected": {"final_states": {}}}),
            "expected.final_states",
        ),
        (
            json!({"kind": "ReactiveGraph", "scenarios": [{"name": "a", "steps": [{"op": {"type": "read"}}]}],
                   "expected": {"observationally_equal": ["a"]}}),
            "expected.observationally_equal",
        ),
        (
            json!({"kind": "ReactiveGraph", "scenarios": [{"name": "a", "steps": [{"op": {"type": "read"}}]}],
                   "expected": {"observationally_equal": ["a", 7]}}),
            "expected.observationally_equal",
        ),
        (
            json!({"kind": "ReactiveGraph", "scenarios": [{"name": "a", "steps": [{"op": {"type": "read"}}]}],
                   "expected": {"observationally_equal": ["a", "b"]}}),
            "expected.observationally_equal",
        ),
        (
            json!({"kind": "ReactiveGraph", "scenarios": [
                      {"name": "a", "steps": [{"op": {"type": "read"}}]},
                      {"name": "b", "steps": [{"op": {"type": "read"}}]}],
                   "expected": {"observationally_equal": ["a", "b", 7]}}),
            "expected.observationally_equal",
        ),
        (
            json!({"kind": "ReactiveGraph", "scenarios": [
                      {"name": "a", "steps": [{"op": {"type": "read"}}]},
                      {"name": "b", "steps": [{"op": {"type": "read"}}]}],
                   "expected": {"observationally_equal": ["a", "c"]}}),
            "expected.observationally_equal",
        ),
        (
            json!({"kind": "ReactiveGraph", "steps": [{"op": {"type": "read"}}], "expected": {"final_state": 3}}),
            "expected.final_state",
        ),
    ];
    for (doc, path) in cases {
        let err = GraphFixture::from_value(Path::new("bad.json"), &doc).expect_err("malformed");
        assert_eq!(err.path, path, "{err}");
    }
}

#[test]
fn the_binary_runs_graph_and_latest_fixtures_and_refuses_a_kind_it_does_not_know() {
    let bin = env!("CARGO_BIN_EXE_egress-conformance");
    let dir = std::env::temp_dir().join(format!("egress-graph-conformance-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("a.json"), load("disposal_runs_no_effect.json").to_string()).expect("write");
    // The seed design's latest-projection fixture kind runs on every
    // target (it was skipped until issue 33).
    let latest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../conformance/latest/latest_a_reconnect_requeues_flights_and_fences_the_old_generation.json");
    std::fs::copy(latest, dir.join("b.json")).expect("copy");
    let out = Command::new(bin).arg(&dir).output().expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert_eq!(stdout.lines().last(), Some("conformance: 7 passed, 0 failed, 0 skipped"), "{stdout}");

    std::fs::write(dir.join("b.json"), json!({"kind": "Mystery", "steps": []}).to_string()).expect("write");
    let out = Command::new(bin).arg(&dir).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));

    let mut v = load("disposal_runs_no_effect.json");
    v["steps"][6]["expect"]["observed_count"] = json!(1);
    std::fs::write(dir.join("b.json"), v.to_string()).expect("write");
    let out = Command::new(bin).args(["--target", "async"]).arg(&dir).output().expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("FAIL  [async]") && stdout.contains("expect.observed_count"), "{stdout}");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
