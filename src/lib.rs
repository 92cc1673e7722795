//! egress: reactive signals whose egress cells make send-side delivery state
//! observable.
//!
//! This facade re-exports the workspace's crates: the pure delivery state
//! machine, [`egress_core`], at the root, and the reactive graph,
//! [`egress_reactive`], as [`reactive`] (its main types also at the root,
//! with the egress cells: [`EgressCell`], [`ThreadSafeEgressCell`],
//! [`AsyncEgressCell`]). The WebSocket transport joins them as it lands.
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

pub use egress_reactive::{
    AsyncContext, AsyncEgressCell, AsyncTransport, Attachment, CellOptions, Clock, Computed, Context, Effect,
    EgressCell, ManualClock, MonotonicClock, ParkedRecord, Scope, SendError, Signal, Snapshot, ThreadSafeContext,
    ThreadSafeEgressCell, TokioClock, Transport,
};

#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
