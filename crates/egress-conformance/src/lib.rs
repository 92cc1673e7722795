//! Runs the egress fixture corpus (`conformance/egress/*.json`, schema in
//! `conformance/README.md`) against the core (`core`) and every shell: the
//! egress cells on a `Context` (`context`), a `ThreadSafeContext`
//! (`thread-safe`) and an `AsyncContext` (`async`).
//!
//! ```text
//!  fixture.json ──load──▶ Fixture ──run_fixture──▶ Target ─start─▶ Session
//!                                        ▲                          │ apply(op)
//!                                        └──── Observation ◀────────┘
//!                         compare: returns exactly, expected keys present
//! ```
//!
//! ```
//! use std::path::Path;
//! use egress_conformance::{CoreTarget, Fixture, Verdict, run_fixture};
//!
//! let text = r#"{
//!   "description": "enqueue assigns sequence 0",
//!   "kind": "Egress", "model": "EgressCore", "generation": 1,
//!   "policy": {"inflight_limit": 1, "retry_budget": 0, "retry_base": 1, "retry_ceiling": 1},
//!   "steps": [{"op": {"type": "enqueue", "payload": "a"}, "returns": {"sequence": 0},
//!              "expected": {"next_sequence": 1, "invalidates": {"pending": true, "inflight": false}}}]
//! }"#;
//! let fixture = Fixture::parse(Path::new("inline.json"), text)?;
//! assert_eq!(run_fixture(&fixture, &CoreTarget), Verdict::Passed { steps: 1 });
//! # Ok::<(), egress_conformance::FixtureError>(())
//! ```

pub mod fixture;
pub mod graph;
pub mod lanes;
mod lanes_shell;
pub mod latest;
pub mod relay;
pub mod runner;
pub mod shell;
pub mod target;

pub use fixture::{Fixture, FixtureError, Op};
pub use graph::{GraphFixture, GraphSession, run_graph_fixture};
pub use lanes::{LanesFixture, LanesOp, LanesSession, run_lanes_fixture, run_lanes_session};
pub use latest::{LatestFixture, LatestOp, LatestSession, LatestStart, run_latest_fixture};
pub use relay::{RelayFixture, RelayOp, RelaySession, run_relay_session};
pub use runner::{Mismatch, Report, Verdict, collect_files, run_files, run_fixture};
pub use shell::{AsyncTarget, ContextTarget, ThreadSafeTarget};
pub use target::{CoreTarget, GraphStart, Observation, Session, Target};

/// Every target this build knows, by name.
#[must_use]
pub fn targets() -> Vec<&'static dyn Target> {
    vec![&CoreTarget, &ContextTarget, &ThreadSafeTarget, &AsyncTarget]
}
