//! Bad input from a file gets a clear error and never a panic: corpus
//! fixtures (egress and reactive-graph) with random values swapped in at
//! random places, and arbitrary bytes, are either refused with a
//! `FixtureError` or run to a verdict.

use std::path::Path;
use std::sync::OnceLock;

use egress_conformance::{
    ContextTarget, CoreTarget, Fixture, GraphFixture, Target, collect_files, run_fixture, run_graph_fixture,
};
use proptest::prelude::*;
use serde_json::{Value, json};

fn load(folder: &str) -> Vec<Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance").join(folder);
    collect_files(&[dir])
        .expect("the corpus is readable")
        .iter()
        .map(|f| serde_json::from_str(&std::fs::read_to_string(f).expect("readable")).expect("JSON"))
        .collect()
}

fn corpus() -> &'static [Value] {
    static CORPUS: OnceLock<Vec<Value>> = OnceLock::new();
    CORPUS.get_or_init(|| load("egress"))
}

fn graph_corpus() -> &'static [Value] {
    static CORPUS: OnceLock<Vec<Value>> = OnceLock::new();
    CORPUS.get_or_init(|| load("graph"))
}

/// Values likely to break a careless loader: extremes, wrong types, empties.
fn hostile_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(null)),
        Just(json!(-1)),
        Just(json!(0)),
        Just(json!(u64::MAX)),
        Just(json!(1.5)),
        Just(json!(f64::MAX)),
        Just(json!("")),
        Just(json!("claim")),
        Just(json!("permanent")),
        Just(json!([])),
        Just(json!({})),
        Just(json!({"type": "fail", "generation": 1, "sequence": 0, "jitter_sample": 2.0})),
        Just(json!({"type": "ack", "generation": u64::MAX, "through": u64::MAX})),
        Just(json!({"type": "fanout", "id_prefix": "x", "reads": ["nobody"], "count": u64::MAX})),
        Just(
            json!({"type": "churn", "source": "feed", "id_prefix": "sub", "live_width": 0, "cycles": 7, "mode": "scope_per_cycle"})
        ),
        Just(json!({"type": "batch", "ops": [{"type": "batch", "ops": [{"type": "dispose", "id": "a"}]}]})),
        Just(json!({"type": "dispose_signal", "id": "a"})),
        Just(json!(["a", "a", "nobody"])),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        "[a-z_]{0,12}".prop_map(|s| json!(s)),
    ]
}

/// Replaces the value found by following `path` (indices taken modulo the
/// number of children) with `replacement`.
fn mutate(value: &mut Value, path: &[usize], replacement: Value) {
    let Some((&choice, rest)) = path.split_first() else {
        *value = replacement;
        return;
    };
    match value {
        Value::Object(map) if !map.is_empty() => {
            let key = map.keys().nth(choice % map.len()).cloned().expect("index within length");
            mutate(map.get_mut(&key).expect("key just read"), rest, replacement);
        }
        Value::Array(items) if !items.is_empty() => {
            let len = items.len();
            mutate(&mut items[choice % len], rest, replacement);
        }
        _ => *value = replacement,
    }
}

proptest! {
    // PROPTEST_CASES lowers the count for a quick run (cargo-mutants).
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(2_000),
        ..ProptestConfig::default()
    })]

    #[test]
    fn mutated_fixtures_are_refused_or_run(
        which in any::<usize>(),
        edits in prop::collection::vec((prop::collection::vec(any::<usize>(), 0..6), hostile_value()), 1..4),
    ) {
        let corpus = corpus();
        let mut value = corpus[which % corpus.len()].clone();
        for (path, replacement) in edits {
            mutate(&mut value, &path, replacement);
        }
        match Fixture::parse(Path::new("mutated.json"), &value.to_string()) {
            Ok(fixture) => {
                let _verdict = run_fixture(&fixture, &CoreTarget);
            }
            Err(e) => {
                prop_assert_eq!(e.file.as_path(), Path::new("mutated.json"));
                prop_assert!(!e.message.is_empty());
            }
        }
    }

    #[test]
    fn mutated_graph_fixtures_are_refused_or_run(
        which in any::<usize>(),
        edits in prop::collection::vec((prop::collection::vec(any::<usize>(), 0..6), hostile_value()), 1..4),
    ) {
        let corpus = graph_corpus();
        let mut value = corpus[which % corpus.len()].clone();
        for (path, replacement) in edits {
            mutate(&mut value, &path, replacement);
        }
        match GraphFixture::from_value(Path::new("mutated.json"), &value) {
            Ok(fixture) => {
                let start = ContextTarget.graph().expect("the context has a graph");
                let _verdict = run_graph_fixture(&fixture, &*start);
            }
            Err(e) => {
                prop_assert_eq!(e.file.as_path(), Path::new("mutated.json"));
                prop_assert!(!e.message.is_empty());
            }
        }
    }

    #[test]
    fn arbitrary_bytes_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let text = String::from_utf8_lossy(&bytes);
        prop_assert!(Fixture::parse(Path::new("noise.json"), &text).is_err());
    }
}
