//! Scale-out on a real PostgreSQL: `egress-demo workers` starts four worker
//! processes over 64 streams, appends in its own transactions, SIGKILLs
//! workers at random and starts new ones; its check must find every record
//! handled, each stream in order, the kills done. The server comes from
//! `EGRESS_PG_URL` (`.ci/run` starts one and sets it with
//! `EGRESS_PG_REQUIRED=1`); without it the test says so and does nothing.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_killed_at_random_handle_every_record_in_order_and_rerun_within_the_limit() {
    // A database of its own (the workers take any free stream there is).
    let Some(db) = egress_testkit::pg_database("egress_demo").await else { return };

    let path = std::env::temp_dir().join(format!("egress-demo-{}-workers.json", std::process::id()));
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_egress-demo"))
        .args(["workers", "--url", &db, "--workers", "4", "--streams", "64", "--messages", "1500"])
        .args(["--kills", "3", "--kill-ms", "300", "--lease-ms", "500", "--seed", "5", "--summary-json"])
        .arg(&path)
        .output()
        .await
        .expect("the demo runs");
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the summary was written")).expect("JSON");
    let _ = std::fs::remove_file(path);
    assert_eq!(s["ok"], true, "{s}");
    assert_eq!(s["handled"], 1500, "every record handled once in order: {s}");
    assert_eq!(s["out_of_order"], 0, "{s}");
    assert_eq!(s["kills"], 3, "the kills happened: {s}");
    assert!(
        s["most_rerun_per_takeover"].as_u64().expect("a count") <= s["rerun_limit"].as_u64().expect("a limit"),
        "{s}"
    );
}
