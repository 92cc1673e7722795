//! The relay fixtures (`conformance/relay/`) pass on the core and on the
//! relay cell of every flavour; a mutated fixture fails at the field
//! mutated on every target (a shell's invalidations are observed through
//! effects on its readers); a malformed one is an error naming its JSON
//! path.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use egress_conformance::{RelayFixture, Target, Verdict, collect_files, run_files, run_relay_session, targets};
use serde_json::{Value, json};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/relay")
}

fn load(name: &str) -> Value {
    let text = std::fs::read_to_string(dir().join(name)).expect("the fixture exists");
    serde_json::from_str(&text).expect("the fixture is JSON")
}

#[test]
fn every_relay_fixture_passes_on_the_core_and_on_every_shell() {
    let files = collect_files(&[dir()]).expect("the folder is readable");
    assert!(files.len() >= 7, "only {} relay fixtures", files.len());
    let reports = run_files(&files, &targets()).expect("the fixtures are well formed");
    assert_eq!(reports.len(), files.len() * targets().len());
    for report in &reports {
        assert!(matches!(report.verdict, Verdict::Passed { steps } if steps >= 6), "{report}");
    }
    let names: std::collections::BTreeSet<_> = reports.iter().map(|r| r.target).collect();
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["async", "context", "core", "thread-safe"]);
}

/// Where `value` fails on each target: (step, field).
fn mismatches(value: &Value) -> Vec<(usize, String)> {
    let fixture = RelayFixture::from_value(Path::new("mutated.json"), value).expect("still well formed");
    targets()
        .iter()
        .map(|t: &&dyn Target| {
            let mut session = t.relay(&fixture).expect("every target runs relays").expect("starts");
            match run_relay_session(&fixture, &mut *session) {
                Verdict::Mismatch(m) => (m.step, m.field),
                other => panic!("{}: expected a mismatch, got {other:?}", t.name()),
            }
        })
        .collect()
}

#[test]
fn a_mutated_relay_fixture_fails_at_the_field_mutated_on_every_target() {
    let name = "relay_spill_pages_go_before_the_entries.json";
    let cases = [
        (3, "/returns/page/1/0", json!([9]), "returns.page[1][0][0]"),
        (5, "/returns", json!({"popped": {"value": [3], "ops": 1}}), "returns.popped"),
        (6, "/expected/cold", json!(2), "expected.cold"),
        (3, "/expected/invalidates/cold", json!(false), "expected.invalidates.cold"),
        (5, "/expected/invalidates/depth", json!(true), "expected.invalidates.depth"),
        (13, "/expected/entries", json!([[5], [4]]), "expected.entries[0][0]"),
    ];
    for (step, pointer, value, field) in cases {
        let mut v = load(name);
        *v["steps"][step].pointer_mut(pointer).unwrap_or_else(|| panic!("{pointer}")) = value;
        for got in mismatches(&v) {
            assert_eq!(got, (step, field.to_owned()));
        }
    }
}

fn malformed(value: &Value) -> String {
    RelayFixture::from_value(Path::new("bad.json"), value).expect_err("malformed").path
}

#[test]
fn a_malformed_relay_fixture_names_its_json_path() {
    let name = "relay_block_is_full_at_high_and_not_full_again_until_low.json";
    let mut v = load(name);
    v["steps"][1]["op"] = json!({"type": "shove", "value": 1});
    assert_eq!(malformed(&v), "steps[1].op.type");
    let mut v = load(name);
    v["steps"][1]["op"]["lane"] = json!("x");
    assert_eq!(malformed(&v), "steps[1].op.lane");
    let mut v = load(name);
    v["steps"][1]["op"] = json!({"type": "replayed"});
    assert_eq!(malformed(&v), "steps[1].op.ops");
    let mut v = load(name);
    v["steps"][2]["expected"]["colour"] = json!(1);
    assert_eq!(malformed(&v), "steps[2].expected.colour");
    let mut v = load(name);
    v["steps"][2]["expected"]["invalidates"] = json!({"entries": true});
    assert_eq!(malformed(&v), "steps[2].expected.invalidates.entries");
    let mut v = load(name);
    v["policy"] = json!("average");
    assert_eq!(malformed(&v), "policy");
    let mut v = load(name);
    v["kind"] = json!("Lanes");
    assert_eq!(malformed(&v), "kind");
    let mut v = load(name);
    v["steps"] = json!([]);
    assert_eq!(malformed(&v), "steps");
    // A relay that cannot be built: Conflate over RawFifo.
    let mut v = load(name);
    v["policy"] = json!("raw_fifo");
    v["backpressure"]["overflow"] = json!("conflate");
    assert_eq!(malformed(&v), "backpressure");
}

#[test]
fn a_put_back_of_nothing_or_a_value_the_policy_does_not_take_is_a_target_error() {
    let name = "relay_block_is_full_at_high_and_not_full_again_until_low.json";
    for (op, message) in [(json!({"type": "unpop"}), "unpop"), (json!({"type": "unspill"}), "unspill")] {
        let mut v = load(name);
        v["steps"][0]["op"] = op;
        let fixture = RelayFixture::from_value(Path::new("x.json"), &v).unwrap();
        for t in targets() {
            let mut session = t.relay(&fixture).unwrap().unwrap();
            match run_relay_session(&fixture, &mut *session) {
                Verdict::TargetError { step: Some(0), message: m } => assert!(m.contains(message), "{m}"),
                other => panic!("{other:?}"),
            }
        }
    }
    let mut v = load("relay_conflate_folds_into_the_newest_entry.json");
    v["steps"][0]["op"]["value"] = json!("one");
    let fixture = RelayFixture::from_value(Path::new("x.json"), &v).unwrap();
    let mut session = fixture.core().unwrap();
    assert!(matches!(run_relay_session(&fixture, &mut *session), Verdict::TargetError { step: Some(0), .. }));
}
