//! The demo binary end to end: in one process with chaos, and as two
//! processes. Its JSON summary must report every message delivered exactly
//! once and in order.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn summary(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("the summary was written")).expect("JSON")
}

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("egress-demo-{}-{name}.json", std::process::id()))
}

#[test]
fn one_process_with_chaos_delivers_exactly_once_in_order() {
    let path = temp("together");
    let out = Command::new(env!("CARGO_BIN_EXE_egress-demo"))
        .args(["--messages", "20000", "--seed", "3", "--chaos-ms", "10", "--summary-json"])
        .arg(&path)
        .output()
        .expect("the demo runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = summary(&path);
    assert_eq!(s["exactly_once_in_order"], true, "{s}");
    assert_eq!(s["delivered"], 20000);
    assert_eq!(s["left_pending_inflight_parked"], 0);
    let _ = std::fs::remove_file(path);
}

#[test]
fn send_and_receive_as_two_processes() {
    let path = temp("receive");
    let mut receiver = Command::new(env!("CARGO_BIN_EXE_egress-demo"))
        .args(["receive", "--listen", "127.0.0.1:0", "--messages", "5000", "--summary-json"])
        .arg(&path)
        .stdout(Stdio::piped())
        .spawn()
        .expect("the receiver starts");
    let mut out = BufReader::new(receiver.stdout.take().expect("stdout"));
    let mut first = String::new();
    out.read_line(&mut first).expect("a first line");
    // Keep reading, so the receiver's later output has somewhere to go.
    let drain = std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("ws://"))
        .expect("the address is printed")
        .trim_end_matches(',');
    let mut sender = Command::new(env!("CARGO_BIN_EXE_egress-demo"))
        .args(["send", "--url", url, "--messages", "5000"])
        .stdout(Stdio::null())
        .spawn()
        .expect("the sender runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = sender.try_wait().expect("waits") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = (sender.kill(), receiver.kill());
            panic!("the sender did not finish within 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success());
    assert!(receiver.wait().expect("the receiver ends").success());
    let _ = drain.join();
    let s = summary(&path);
    assert_eq!((s["delivered"].as_u64(), s["in_order"].as_bool()), (Some(5000), Some(true)), "{s}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn bad_usage_is_an_error_not_a_panic() {
    let out = Command::new(env!("CARGO_BIN_EXE_egress-demo")).args(["--messages", "lots"]).output().expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--messages takes a number"));
}
