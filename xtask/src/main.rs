//! `cargo run -p xtask -- unmoved-diff`: see [`moved`].
//!
//! `cargo run -p xtask -- screen-svg IN OUT`: see [`screen`].
//!
//! `cargo run -p xtask -- packaging`: checks what `cargo publish` and a
//! user's toolchain rely on and no compiler checks.
//!
//! For every publishable workspace crate: a description, a license, a
//! readme, one to five keywords, at least one category, no placeholder
//! repository, and a `rust-version` that is true for every feature: at or
//! above every normal dependency's own `rust-version` (the graph resolved
//! for this host with every feature of every member on, so an optional
//! dependency behind a feature counts), and
//! at or above 1.88 if its code uses let chains (`if let … && …`, stable in
//! 1.88); and every workspace crate on its floor (see [`FLOORS`]). Std
//! APIs newer than the declared version are clippy's
//! `incompatible_msrv` lint, which CI runs with `-D warnings`. A crate that
//! is not published is checked only if it declares a `rust-version`.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use serde_json::Value;

mod moved;
mod screen;

/// Each workspace crate's floor: a crate depends (normal dependencies) only
/// on crates of lower floors, so stores sit below transports and nothing
/// reaches back up. docs/architecture.md ("Floors") shows the same table.
const FLOORS: &[(&str, u32)] = &[
    ("egress-core", 0),
    ("egress-codec", 1),
    ("egress-testkit", 0),
    ("xtask", 0),
    ("egress-reactive", 1),
    ("egress-store", 2),
    ("egress-ws", 3),
    ("egress-nats", 3),
    ("egress-dispatch", 3),
    ("egress-http", 3),
    ("egress-conformance", 3),
    ("egress", 4),
    ("egress-demo", 4),
    ("egress-chat", 4),
    ("egress-bench", 4),
];

/// The first release with let chains in edition 2024.
const LET_CHAINS: (u64, u64, u64) = (1, 88, 0);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("packaging") => packaging(),
        Some("screen-svg") => {
            let [_, input, output] = args.as_slice() else {
                eprintln!("usage: cargo run -p xtask -- screen-svg CAPTURE.txt OUT.svg");
                return ExitCode::from(2);
            };
            return match screen::write_svg(Path::new(input), Path::new(output)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("xtask screen-svg: {e:#}");
                    ExitCode::from(2)
                }
            };
        }
        Some("unmoved-diff") => {
            let mut diff = String::new();
            let written = std::io::Read::read_to_string(&mut std::io::stdin(), &mut diff)
                .map_err(anyhow::Error::from)
                .and_then(|_| moved::unmoved_diff(&diff));
            return match written {
                Ok(out) => {
                    print!("{out}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("xtask unmoved-diff: {e:#}");
                    ExitCode::from(2)
                }
            };
        }
        _ => {
            eprintln!("usage: cargo run -p xtask -- packaging | unmoved-diff < DIFF | screen-svg CAPTURE.txt OUT.svg");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(problems) if problems.is_empty() => {
            println!("xtask packaging: every crate's metadata and rust-version hold");
            ExitCode::SUCCESS
        }
        Ok(problems) => {
            for p in &problems {
                println!("{p}");
            }
            println!("xtask packaging: {} problem(s)", problems.len());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("xtask packaging: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// A `rust-version` as (major, minor, patch).
fn version(v: &str) -> Option<(u64, u64, u64)> {
    let mut parts = v.split('.').map(|p| p.parse::<u64>().ok());
    let major = parts.next()??;
    let minor = parts.next().unwrap_or(Some(0))?;
    let patch = parts.next().unwrap_or(Some(0))?;
    Some((major, minor, patch))
}

fn host() -> Result<String> {
    let out = Command::new("rustc").arg("-vV").output().context("running rustc -vV")?;
    let text = String::from_utf8(out.stdout)?;
    text.lines().find_map(|l| l.strip_prefix("host: ")).map(str::to_owned).context("rustc -vV names no host")
}

fn metadata() -> Result<Value> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--all-features", "--filter-platform", &host()?])
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Every problem found, one line each.
fn packaging() -> Result<Vec<String>> {
    let meta = metadata()?;
    let packages: HashMap<&str, &Value> = meta["packages"]
        .as_array()
        .context("no packages")?
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let nodes: HashMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .context("no resolve graph")?
        .iter()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    let mut problems = Vec::new();
    for id in meta["workspace_members"].as_array().context("no workspace members")? {
        let id = id.as_str().context("a member id")?;
        let package = packages.get(id).context("a member without a package")?;
        let name = package["name"].as_str().unwrap_or("?");
        let published = !package["publish"].as_array().is_some_and(Vec::is_empty);
        let declared = package["rust_version"].as_str();
        let mut problem = |what: String| problems.push(format!("{name}: {what}"));
        if published {
            for field in ["description", "license", "readme"] {
                if package[field].as_str().is_none_or(str::is_empty) {
                    problem(format!("no {field}"));
                }
            }
            let keywords = package["keywords"].as_array().map_or(0, Vec::len);
            if !(1..=5).contains(&keywords) {
                problem(format!("{keywords} keywords (crates.io takes one to five)"));
            }
            if package["categories"].as_array().is_none_or(Vec::is_empty) {
                problem("no categories".into());
            }
            if package["repository"].as_str().is_some_and(|r| r.contains("example.invalid")) {
                problem("a placeholder repository URL".into());
            }
            if declared.is_none() {
                problem("no rust-version".into());
            }
        }
        match FLOORS.iter().find(|(n, _)| *n == name) {
            None => problem("no floor in xtask's FLOORS (and docs/architecture.md)".into()),
            Some(&(_, floor)) => {
                for dep in workspace_dependencies(id, &packages, &nodes) {
                    match FLOORS.iter().find(|(n, _)| *n == dep) {
                        Some(&(_, below)) if below < floor => {}
                        _ => problem(format!("depends on {dep}, which is not on a floor below {floor}")),
                    }
                }
            }
        }
        let Some(declared) = declared else { continue };
        let Some(have) = version(declared) else {
            problem(format!("rust-version {declared:?} is not a version"));
            continue;
        };
        for (dep, needs) in dependency_versions(id, &packages, &nodes) {
            if needs > have {
                problem(format!("rust-version {declared} is below {dep}'s ({}.{}.{})", needs.0, needs.1, needs.2));
            }
        }
        let manifest = package["manifest_path"].as_str().context("no manifest path")?;
        let src = Path::new(manifest).parent().context("a manifest at the root")?.join("src");
        if have < LET_CHAINS
            && let Some(file) = first_let_chain(&src)?
        {
            problem(format!("rust-version {declared}, but {file} uses let chains (stable in 1.88)"));
        }
    }
    Ok(problems)
}

/// The workspace members `id` depends on directly (normal dependencies),
/// by name.
fn workspace_dependencies(id: &str, packages: &HashMap<&str, &Value>, nodes: &HashMap<&str, &Value>) -> Vec<String> {
    let Some(node) = nodes.get(id) else { return Vec::new() };
    node["deps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|dep| dep["dep_kinds"].as_array().into_iter().flatten().any(|k| k["kind"].is_null()))
        .filter_map(|dep| packages.get(dep["pkg"].as_str()?))
        .filter(|p| p["source"].is_null())
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect()
}

/// The `rust-version` of every package `id` depends on (normal
/// dependencies, transitively), with the package's name.
fn dependency_versions(
    id: &str,
    packages: &HashMap<&str, &Value>,
    nodes: &HashMap<&str, &Value>,
) -> Vec<(String, (u64, u64, u64))> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![id.to_owned()];
    let mut out = Vec::new();
    while let Some(at) = stack.pop() {
        let Some(node) = nodes.get(at.as_str()) else { continue };
        for dep in node["deps"].as_array().into_iter().flatten() {
            let normal = dep["dep_kinds"].as_array().into_iter().flatten().any(|k| k["kind"].is_null());
            let Some(pkg) = dep["pkg"].as_str() else { continue };
            if !normal || !seen.insert(pkg.to_owned()) {
                continue;
            }
            stack.push(pkg.to_owned());
            if let Some(p) = packages.get(pkg)
                && let Some(v) = p["rust_version"].as_str().and_then(version)
            {
                out.push((p["name"].as_str().unwrap_or("?").to_owned(), v));
            }
        }
    }
    out
}

/// The first source file under `dir` with a let chain: an `if let` or
/// `while let` whose condition goes on with `&&` before its block, or a
/// `&& let`.
fn first_let_chain(dir: &Path) -> Result<Option<String>> {
    let mut files = vec![dir.to_path_buf()];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                files.push(entry?.path());
            }
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        if has_let_chain(&text) {
            return Ok(Some(path.display().to_string()));
        }
    }
    Ok(None)
}

fn has_let_chain(text: &str) -> bool {
    let code: String = text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    if code.contains("&& let ") {
        return true;
    }
    ["if let ", "while let "].iter().any(|start| {
        code.match_indices(start).any(|(at, _)| {
            let rest = &code[at..];
            let condition = rest.find('{').map_or(rest, |end| &rest[..end]);
            condition.contains("&&")
        })
    })
}

#[cfg(test)]
mod tests {
    use super::{has_let_chain, version};

    #[test]
    fn let_chains_are_found_and_plain_lets_are_not() {
        assert!(has_let_chain("if let Some(x) = a && x > 1 { }"));
        assert!(has_let_chain("if ready\n    && let Some(x) = a\n{ }"));
        assert!(has_let_chain("while let Some(x) = it.next()\n    && x.ok()\n{ }"));
        assert!(!has_let_chain("if let Some(x) = a { if x > 1 && y { } }"));
        assert!(!has_let_chain("// if let Some(x) = a && b {\nlet y = 1;"));
    }

    #[test]
    fn versions_compare_by_number() {
        assert_eq!(version("1.88"), Some((1, 88, 0)));
        assert!(version("1.89.0") > version("1.88"));
        assert!(version("1.100") > version("1.99.9"));
        assert_eq!(version("one"), None);
    }
}
