//! `egress-conformance [--target NAME]... [--quiet] PATH...`: runs fixture
//! files or folders against the named targets (default: all), one line per
//! fixture and target (with `--quiet`, only what did not pass). Exit status: 0 none failed (skipped ones
//! say why: a kind or feature not offered yet, and its issue), 1 a fixture failed, 2 bad usage or a
//! malformed fixture.

use std::path::PathBuf;
use std::process::ExitCode;

use egress_conformance::{Target, collect_files, run_files, targets};

const USAGE: &str = "usage: egress-conformance [--target NAME]... [--quiet] PATH...\n\
    runs the fixture files (or folders of *.json) against each target (default: all);\n\
    --quiet prints only the failures and the summary";

fn main() -> ExitCode {
    let known = targets();
    let mut chosen: Vec<&dyn Target> = Vec::new();
    let mut paths: Vec<PathBuf> = Vec::new();
    let mut quiet = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                let names: Vec<&str> = known.iter().map(|t| t.name()).collect();
                println!("{USAGE}\ntargets: {}", names.join(", "));
                return ExitCode::SUCCESS;
            }
            "--quiet" | "-q" => quiet = true,
            "--target" | "-t" => {
                let Some(name) = args.next() else {
                    eprintln!("--target needs a name\n{USAGE}");
                    return ExitCode::from(2);
                };
                if name == "all" {
                    chosen.extend(known.iter().copied());
                } else if let Some(t) = known.iter().find(|t| t.name() == name) {
                    chosen.push(*t);
                } else {
                    let names: Vec<&str> = known.iter().map(|t| t.name()).collect();
                    eprintln!("unknown target {name:?}; known: {}", names.join(", "));
                    return ExitCode::from(2);
                }
            }
            _ => paths.push(PathBuf::from(arg)),
        }
    }
    if paths.is_empty() {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    }
    if chosen.is_empty() {
        chosen = known;
    }
    let reports = match collect_files(&paths).and_then(|files| run_files(&files, &chosen)) {
        Ok(reports) => reports,
        Err(e) => {
            eprintln!("malformed fixture: {e}");
            return ExitCode::from(2);
        }
    };
    let failed = reports.iter().filter(|r| r.failed()).count();
    let passed = reports.iter().filter(|r| r.passed()).count();
    let skipped = reports.len() - failed - passed;
    for report in reports.iter().filter(|r| !quiet || !r.passed()) {
        println!("{report}");
    }
    println!("conformance: {passed} passed, {failed} failed, {skipped} skipped");
    if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
