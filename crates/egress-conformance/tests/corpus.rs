//! The whole corpus passes on every target, and the runner really checks:
//! mutated fixtures fail at the right field, malformed ones are errors that
//! name the file and the JSON path.

use std::path::{Path, PathBuf};
use std::process::Command;

use egress_conformance::{CoreTarget, Fixture, Verdict, collect_files, run_files, run_fixture, targets};
use serde_json::{Value, json};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/egress")
}

fn corpus() -> Vec<PathBuf> {
    collect_files(&[corpus_dir()]).expect("the corpus folder is readable")
}

#[test]
fn every_fixture_passes_on_every_target() {
    let files = corpus();
    assert!(files.len() >= 15, "the corpus has only {} fixtures", files.len());
    let reports = run_files(&files, &targets()).expect("the corpus is well formed");
    let failures: Vec<String> = reports.iter().filter(|r| !r.passed()).map(ToString::to_string).collect();
    assert!(failures.is_empty(), "failing fixtures:\n{}", failures.join("\n"));
    assert_eq!(reports.len(), files.len() * targets().len());
}

/// The journal's fixtures (`conformance/durable/`, an extension the Coq
/// model does not replay yet) pass on every target too.
#[test]
fn every_journal_fixture_passes_on_every_target() {
    let files = collect_files(&[corpus_dir().join("../durable")]).expect("the folder is readable");
    assert!(files.len() >= 5, "only {} journal fixtures", files.len());
    let reports = run_files(&files, &targets()).expect("the fixtures are well formed");
    let failures: Vec<String> = reports.iter().filter(|r| !r.passed()).map(ToString::to_string).collect();
    assert!(failures.is_empty(), "failing fixtures:\n{}", failures.join("\n"));
    assert_eq!(reports.len(), files.len() * targets().len());
}

fn load_value(name: &str) -> Value {
    let text = std::fs::read_to_string(corpus_dir().join(name)).expect("fixture exists");
    serde_json::from_str(&text).expect("fixture is JSON")
}

fn verdict_of(value: &Value) -> Verdict {
    let fixture = Fixture::parse(Path::new("mutated.json"), &value.to_string()).expect("still well formed");
    run_fixture(&fixture, &CoreTarget)
}

fn mismatch_field(value: &Value) -> (usize, String) {
    match verdict_of(value) {
        Verdict::Mismatch(m) => (m.step, m.field),
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

#[test]
fn a_wrong_return_value_is_reported_at_its_field() {
    let mut v = load_value("ordered_cumulative_ack.json");
    v["steps"][4]["returns"]["envelope"]["attempt"] = json!(2);
    assert_eq!(mismatch_field(&v), (4, "returns.envelope.attempt".to_owned()));
}

#[test]
fn a_wrong_state_is_reported_at_its_field() {
    let mut v = load_value("ordered_cumulative_ack.json");
    v["steps"][2]["expected"]["pending"][1]["payload"] = json!("B");
    assert_eq!(mismatch_field(&v), (2, "expected.pending[1].payload".to_owned()));

    let mut v = load_value("ordered_cumulative_ack.json");
    v["steps"][2]["expected"]["pending"].as_array_mut().expect("a list").pop();
    assert_eq!(mismatch_field(&v), (2, "expected.pending[2]".to_owned()));
}

#[test]
fn a_wrong_invalidation_is_reported() {
    let mut v = load_value("window_reopening.json");
    v["steps"][5]["expected"]["invalidates"]["inflight"] = json!(true);
    assert_eq!(mismatch_field(&v), (5, "expected.invalidates.inflight".to_owned()));
}

#[test]
fn every_shell_target_observes_invalidations_through_its_readers() {
    // Each direction of a wrong flag fails on every shell: a reader that was
    // dirtied when the fixture says not, and one left clean when it says so.
    let mut too_many = load_value("window_reopening.json");
    too_many["steps"][5]["expected"]["invalidates"]["inflight"] = json!(true);
    let mut too_few = load_value("retry_after_hint.json");
    too_few["steps"][2]["expected"]["invalidates"]["parked"] = json!(false);
    for target in targets() {
        for (v, step, field) in [(&too_many, 5, "inflight"), (&too_few, 2, "parked")] {
            let fixture = Fixture::parse(Path::new("mutated.json"), &v.to_string()).expect("still well formed");
            match run_fixture(&fixture, target) {
                Verdict::Mismatch(m) => {
                    assert_eq!((m.step, m.field), (step, format!("expected.invalidates.{field}")), "{}", target.name());
                }
                other => panic!("{}: expected a mismatch, got {other:?}", target.name()),
            }
        }
    }
    let names: Vec<&str> = targets().iter().map(|t| t.name()).collect();
    assert_eq!(names, ["core", "context", "thread-safe", "async"]);
}

#[test]
fn absent_expected_keys_are_not_asserted() {
    let mut v = load_value("bounded_retry.json");
    for step in v["steps"].as_array_mut().expect("steps") {
        step["expected"] = json!({});
    }
    assert!(matches!(verdict_of(&v), Verdict::Passed { .. }));
}

#[test]
fn an_extension_field_the_fixture_names_is_asserted() {
    // The second reconnect names `dead`: a wrong count fails there, and an
    // extension field of another op is not dropped.
    let mut v = load_value("design_reading_reconnect_names_dead_only_as_an_extension.json");
    v["steps"][4]["returns"]["dead"] = json!(1);
    assert_eq!(mismatch_field(&v), (4, "returns.dead".to_owned()));
    // A return that has no such extension keeps every field asserted.
    let mut v = load_value("design_reading_reconnect_names_dead_only_as_an_extension.json");
    v["steps"][4]["returns"].as_object_mut().expect("an object").remove("replayed");
    assert_eq!(mismatch_field(&v), (4, "returns.replayed".to_owned()));
}

#[test]
fn a_policy_naming_skip_gets_tombstones_where_the_design_reading_holds() {
    // The same steps under `dead_letters: skip`: the exhausted record
    // becomes a tombstone in pending, which the design reading's fixture
    // says is not there.
    let mut v = load_value("design_reading_absent_dead_letters_are_held.json");
    v["policy"]["dead_letters"] = json!("skip");
    assert_eq!(mismatch_field(&v).0, 3);
    v["policy"]["dead_letters"] = json!("hold");
    assert!(matches!(verdict_of(&v), Verdict::Passed { .. }));
}

fn malformed(text: &str) -> (String, String) {
    let e = Fixture::parse(Path::new("bad.json"), text).expect_err("must be refused");
    assert_eq!(e.file, Path::new("bad.json"));
    (e.path, e.message)
}

fn with(mutate: impl FnOnce(&mut Value)) -> String {
    let mut v = load_value("reconnect_fencing.json");
    mutate(&mut v);
    v.to_string()
}

#[test]
fn malformed_fixtures_name_the_json_path() {
    let (path, _) = malformed(&with(|v| v["steps"][3]["op"]["generation"] = json!("one")));
    assert_eq!(path, "steps[3].op.generation");
    let (path, message) = malformed(&with(|v| v["steps"][0]["op"]["type"] = json!("teleport")));
    assert_eq!(path, "steps[0].op.type");
    assert!(message.contains("teleport"), "{message}");
    let (path, _) = malformed(&with(|v| {
        v["steps"][1]["op"] = json!({"type": "fail", "generation": 1, "sequence": 0, "kind": "cosmic"})
    }));
    assert_eq!(path, "steps[1].op.kind");
    let (path, _) = malformed(&with(|v| v["steps"][0]["op"]["through"] = json!(3)));
    assert_eq!(path, "steps[0].op.through");
    let (path, _) = malformed(&with(|v| v["steps"][3]["op"] = json!({"type": "claim"})));
    assert_eq!(path, "steps[3].op.generation");
    let (path, _) =
        malformed(&with(|v| v["steps"][3]["op"] = json!({"type": "claim", "generation": 1, "genration": 1})));
    assert_eq!(path, "steps[3].op.genration");
    let (path, _) = malformed(&with(|v| v["steps"][3]["op"] = json!([1])));
    assert_eq!(path, "steps[3].op");
    let (path, _) = malformed(&with(|v| v["policy"]["inflight_limit"] = json!(0)));
    assert_eq!(path, "policy");
    let (path, _) = malformed(&with(|v| v["policy"]["ordering"] = json!("sideways")));
    assert_eq!(path, "policy.ordering");
    let (path, _) = malformed(&with(|v| v["kind"] = json!("Ingress")));
    assert_eq!(path, "kind");
    let (path, _) = malformed(&with(|v| v["steps"][2]["expected"]["pendnig"] = json!([])));
    assert_eq!(path, "steps[2].expected.pendnig");
    let (path, _) = malformed(&with(|v| v["steps"][2]["expected"]["invalidates"]["pending"] = json!("yes")));
    assert_eq!(path, "steps[2].expected.invalidates.pending");
    let (path, _) = malformed(&with(|v| v.as_object_mut().expect("object").remove("steps").map(|_| ()).unwrap_or(())));
    assert_eq!(path, ".");
    let (_, message) = malformed("{\"description\": ");
    assert!(message.contains("EOF"), "{message}");
    let (path, _) = malformed(&format!("{} trailing", with(|_| ())));
    assert_eq!(path, ".");
}

#[test]
fn the_binary_reports_and_sets_its_exit_status() {
    let bin = env!("CARGO_BIN_EXE_egress-conformance");
    let ok = Command::new(bin).arg(corpus_dir()).output().expect("runs");
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success(), "{stdout}");
    assert!(stdout.lines().last().is_some_and(|l| l.ends_with(" 0 failed, 0 skipped")), "{stdout}");

    let dir = std::env::temp_dir().join(format!("egress-conformance-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut v = load_value("window_reopening.json");
    v["steps"][3]["returns"]["envelope"]["sequence"] = json!(1);
    std::fs::write(dir.join("mutated.json"), v.to_string()).expect("write");
    let failed = Command::new(bin).args(["--target", "core"]).arg(&dir).output().expect("runs");
    let stdout = String::from_utf8_lossy(&failed.stdout);
    assert_eq!(failed.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("step 3") && stdout.contains("returns.envelope.sequence"), "{stdout}");

    std::fs::write(dir.join("mutated.json"), "{ not json").expect("write");
    let bad = Command::new(bin).arg(&dir).output().expect("runs");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("mutated.json"));

    let unknown = Command::new(bin).args(["--target", "nope"]).arg(&dir).output().expect("runs");
    assert_eq!(unknown.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
