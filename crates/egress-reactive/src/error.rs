//! Errors of the reactive graph.

use std::fmt;
use std::panic::Location;

/// The kind of a node, as named in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeKind {
    /// A writable signal.
    Signal,
    /// A derived, memoized value.
    Computed,
    /// A side effect.
    Effect,
    /// An owner of other nodes.
    Scope,
}

impl fmt::Display for NodeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeKind::Signal => "signal",
            NodeKind::Computed => "computed",
            NodeKind::Effect => "effect",
            NodeKind::Scope => "scope",
        })
    }
}

/// A computed read itself, directly or through others.
///
/// `nodes` lists where each computed on the cycle was created, from the one
/// read again (first) to the one that read it (last). A cycle can also be
/// closed while a computed is being re-validated rather than run (a write
/// upstream made it pending; checking its dependencies reruns one, and that
/// run reads it): then `nodes` names the two, the computed read and the
/// computed that read it, and not the dependencies between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CycleError {
    /// Creation sites of the computeds on the cycle.
    pub nodes: Vec<&'static Location<'static>>,
}

impl fmt::Display for CycleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("cycle: computed")?;
        for (i, at) in self.nodes.iter().enumerate() {
            if i > 0 {
                f.write_str(" -> computed")?;
            }
            write!(f, " created at {at}")?;
        }
        if let Some(first) = self.nodes.first() {
            write!(f, " -> computed created at {first}")?;
        }
        Ok(())
    }
}

impl std::error::Error for CycleError {}

/// Why a read failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The node was disposed (explicitly, by its owner, or with its context).
    #[error("read of a disposed {kind} created at {created_at}")]
    Disposed {
        /// What the node was.
        kind: NodeKind,
        /// Where it was created.
        created_at: &'static Location<'static>,
    },
    /// The read closed a cycle of computeds.
    #[error(transparent)]
    Cycle(#[from] CycleError),
    /// A read of a thread-safe graph's node from inside a call into another
    /// thread-safe graph: refused, as it could deadlock (see
    /// [`Threaded`](crate::Threaded)). Nothing was read.
    #[error("read of a {kind} from inside a call into another thread-safe graph")]
    ForeignGraph {
        /// What the node is.
        kind: NodeKind,
    },
}

/// Why a write failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The signal was disposed.
    #[error("write to a disposed signal created at {created_at}")]
    Disposed {
        /// Where it was created.
        created_at: &'static Location<'static>,
    },
    /// The write was applied, but the effects it triggered did not settle.
    #[error(transparent)]
    Loop(#[from] EffectLoopError),
    /// A write from inside a call into another thread-safe graph: refused,
    /// as it could deadlock (see [`Threaded`](crate::Threaded)). Nothing was
    /// written.
    #[error("write to a signal from inside a call into another thread-safe graph")]
    ForeignGraph,
}

/// Effects kept re-triggering each other past the bound: a feedback loop
/// that does not converge.
///
/// The flush stops after [`MAX_FLUSH_ROUNDS`](crate::MAX_FLUSH_ROUNDS)
/// rounds (a round runs every effect queued by the previous one). The graph
/// stays consistent: the effects still queued are unmarked and run again at
/// the next change that reaches them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("effects did not settle after {rounds} rounds; still re-running: effect created at {effect}")]
pub struct EffectLoopError {
    /// Rounds run before stopping.
    pub rounds: u32,
    /// Where one of the effects still re-running was created.
    pub effect: &'static Location<'static>,
}
