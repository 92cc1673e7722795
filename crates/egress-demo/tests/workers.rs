//! Scale-out on a real PostgreSQL: `egress-demo workers` starts four worker
//! processes over 64 streams and appends in its own transactions; its
//! check must find every record handled, each stream in order. Once with
//! workers SIGKILLed at random and started again (re-runs within the
//! limit, per takeover); once with no kills on a machine made busy (two
//! busy loops beside the workers): no stream taken over, nothing run
//! twice. The server comes from `EGRESS_PG_URL` (`.ci/run` starts one and
//! sets it with `EGRESS_PG_REQUIRED=1`); without it each test says so and
//! does nothing.

/// Runs the demo with `args` on a database of its own (the workers take
/// any free stream there is) and returns its summary; `None` without a
/// server.
async fn workers(args: &[&str]) -> Option<serde_json::Value> {
    let db = egress_testkit::pg_database("egress_demo").await?;
    let path = std::env::temp_dir().join(format!("egress-demo-{}-workers.json", egress_testkit::fresh("summary")));
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_egress-demo"))
        .args(["workers", "--url", &db])
        .args(args)
        .arg("--summary-json")
        .arg(&path)
        .output()
        .await
        .expect("the demo runs");
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the summary was written")).expect("JSON");
    let _ = std::fs::remove_file(path);
    assert_eq!(s["ok"], true, "{s}");
    assert_eq!(s["out_of_order"], 0, "{s}");
    Some(s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_killed_at_random_handle_every_record_in_order_and_rerun_within_the_limit() {
    let args = ["--workers", "4", "--streams", "64", "--messages", "1500", "--kills", "3", "--kill-ms", "300"];
    let Some(s) = workers(&[&args[..], &["--seed", "5"]].concat()).await else { return };
    assert_eq!(s["handled"], 1500, "every record handled once in order: {s}");
    assert_eq!(s["kills"], 3, "the kills happened: {s}");
    assert!(
        s["most_rerun_per_takeover"].as_u64().expect("a count") <= s["rerun_limit"].as_u64().expect("a limit"),
        "{s}"
    );
}

/// The workers' leases hold while they live, on a machine whose cores two
/// busy loops take (the demo's own processes and PostgreSQL's compete for
/// what is left): no stream changes hands, no record runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_workers_on_a_busy_machine_keep_their_streams_and_run_nothing_twice() {
    let busy = egress_testkit::Contention::start(2);
    let args = ["--workers", "4", "--streams", "64", "--messages", "6000", "--kills", "0"];
    let Some(s) = workers(&args).await else { return };
    assert!(busy.stop().iter().all(|&spins| spins > 0), "the machine was busy");
    assert_eq!(s["handled"], 6000, "{s}");
    assert_eq!(s["takeovers"], 0, "no live worker's stream was taken over: {s}");
    assert_eq!(s["duplicates"], 0, "nothing ran twice: {s}");
}
