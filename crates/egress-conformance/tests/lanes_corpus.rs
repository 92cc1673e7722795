//! The lanes fixtures (`conformance/lanes/`) pass on the core and on the
//! lanes cell of every flavour; a mutated lanes
//! fixture fails at the field mutated, and a malformed one is an error that
//! names its JSON path.

use std::path::{Path, PathBuf};

use egress_conformance::{LanesFixture, Verdict, collect_files, run_files, run_lanes_fixture, targets};
use serde_json::{Value, json};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/lanes")
}

fn load(name: &str) -> Value {
    let text = std::fs::read_to_string(dir().join(name)).expect("the fixture exists");
    serde_json::from_str(&text).expect("the fixture is JSON")
}

#[test]
fn every_lanes_fixture_passes_on_the_core_and_on_every_shell() {
    let files = collect_files(&[dir()]).expect("the folder is readable");
    assert!(files.len() >= 5, "only {} lanes fixtures", files.len());
    let reports = run_files(&files, &targets()).expect("the fixtures are well formed");
    assert_eq!(reports.len(), files.len() * targets().len());
    for report in &reports {
        assert!(matches!(report.verdict, Verdict::Passed { steps } if steps >= 5), "{report}");
    }
    let names: std::collections::BTreeSet<_> = reports.iter().map(|r| r.target).collect();
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["async", "context", "core", "thread-safe"]);
}

fn mismatch(value: &Value) -> (usize, String) {
    let fixture = LanesFixture::from_value(Path::new("mutated.json"), value).expect("still well formed");
    match run_lanes_fixture(&fixture) {
        Verdict::Mismatch(m) => (m.step, m.field),
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

#[test]
fn a_mutated_lanes_fixture_fails_at_the_field_mutated() {
    let name = "lanes_release_in_enqueue_order_skipping_occupied_lanes.json";
    let mut v = load(name);
    v["steps"][8]["returns"]["lane"] = json!("room:a");
    assert_eq!(mismatch(&v), (8, "returns.lane".to_owned()));

    let mut v = load(name);
    v["steps"][13]["expected"]["outstanding"] = json!(5);
    assert_eq!(mismatch(&v), (13, "expected.outstanding".to_owned()));

    let mut v = load(name);
    v["steps"][16]["expected"]["lane_states"]["other"]["acked_through"] = json!(0);
    assert_eq!(mismatch(&v), (16, "expected.lane_states.other.acked_through".to_owned()));

    let mut v = load(name);
    v["steps"][13]["expected"]["invalidates"]["inflight"] = json!(false);
    assert_eq!(mismatch(&v), (13, "expected.invalidates.inflight".to_owned()));

    let mut v = load(name);
    v["steps"][6]["expected"]["lanes"] = json!(["other", "room:a", "room:b"]);
    assert_eq!(mismatch(&v), (6, "expected.lanes[3]".to_owned()));
}

fn malformed(value: &Value) -> String {
    LanesFixture::from_value(Path::new("bad.json"), value).expect_err("malformed").path
}

#[test]
fn a_malformed_lanes_fixture_names_its_json_path() {
    let name = "lanes_a_flush_epoch_holds_its_lane_and_not_the_others.json";
    let mut v = load(name);
    v["steps"][0]["op"]["lane"] = json!("room:z");
    assert_eq!(malformed(&v), "steps[0].op.lane", "an undeclared lane");

    let mut v = load(name);
    v["steps"][3]["op"]["lane"] = json!("room:a");
    assert_eq!(malformed(&v), "steps[3].op.lane", "a claim takes no lane");

    let mut v = load(name);
    v["steps"][1]["op"].as_object_mut().expect("an op is an object").remove("lane");
    assert_eq!(malformed(&v), "steps[1].op.lane", "an enqueue names its lane");

    let mut v = load(name);
    v["steps"][1]["op"]["type"] = json!("poll_ready");
    assert_eq!(malformed(&v), "steps[1].op.type", "not a lanes op");

    let mut v = load(name);
    v["steps"][1]["expected"] = json!({"pending": []});
    assert_eq!(malformed(&v), "steps[1].expected.pending", "an unknown expected key");

    let mut v = load(name);
    v["max_lanes"] = json!(0);
    assert_eq!(malformed(&v), "max_lanes");

    let mut v = load(name);
    v["lanes"]["room:a"] = json!("fifo");
    assert_eq!(malformed(&v), "lanes.room:a");

    let mut v = load(name);
    v["kind"] = json!("Egress");
    assert_eq!(malformed(&v), "kind");

    let mut v = load(name);
    v["steps"] = json!([]);
    assert_eq!(malformed(&v), "steps");
}
