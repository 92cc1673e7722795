//! egress: reactive signals whose egress cells make send-side delivery state
//! observable.
//!
//! This facade re-exports the workspace's crates: the pure delivery state
//! machine, [`egress_core`], at the root, and the reactive graph,
//! [`egress_reactive`], as [`reactive`] (its main types also at the root).
//! The egress cells and the WebSocket transport join them as they land.
//!
//! ```
//! use egress::{EgressCore, Policy};
//!
//! let mut core = EgressCore::new(Policy::default());
//! let seq = core.enqueue(b"ping".to_vec()).outcome;
//! assert_eq!(core.pending_len(), 1);
//! assert_eq!(seq.get(), 0);
//! ```

pub use egress_core::*;

/// The reactive graph in three flavours: see [`egress_reactive`].
pub mod reactive {
    pub use egress_reactive::*;
}

pub use egress_reactive::{AsyncContext, Computed, Context, Effect, Scope, Signal, ThreadSafeContext};

#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
