//! egress: reactive signals whose egress cells make send-side delivery state
//! observable.
//!
//! This facade re-exports the workspace's crates. Today that is the pure
//! delivery state machine, [`egress_core`], re-exported at the root; the
//! reactive graphs and cells, and the WebSocket transport, join it as they
//! land.
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

#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
