//! egress: reactive signals whose egress cells make send-side delivery state
//! observable.
//!
//! This facade re-exports the workspace's crates: the pure delivery state
//! machine, [`egress_core`], at the root, and the reactive graph,
//! [`egress_reactive`], as [`reactive`] (its main types also at the root,
//! with the egress cells: [`EgressCell`], [`ThreadSafeEgressCell`],
//! [`AsyncEgressCell`]).
//!
//! Features (none by default):
//!
//! - `ws`: the WebSocket transport (`Sender`), the reference receiver and
//!   the wire protocol, as `egress::ws` ([egress-ws](https://docs.rs/egress-ws)).
//! - `store`: durable egress on SQLite (a transactional outbox, its relay,
//!   restart recovery), as `egress::store`
//!   ([egress-store](https://docs.rs/egress-store); needs Rust 1.89).
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

/// The WebSocket transport, reference receiver and wire protocol (feature
/// `ws`): see `egress_ws`.
#[cfg(feature = "ws")]
pub mod ws {
    pub use egress_ws::*;
}

/// Durable egress on SQLite (feature `store`): see `egress_store`.
#[cfg(feature = "store")]
pub mod store {
    pub use egress_store::*;
}

/// The NATS JetStream transport and subscriber (feature `nats`): see
/// `egress_nats`.
#[cfg(feature = "nats")]
pub mod nats {
    pub use egress_nats::*;
}

pub use egress_reactive::{
    AsyncContext, AsyncEgressCell, AsyncTransport, Attachment, CellOptions, Clock, Computed, Context, Effect,
    EgressCell, ManualClock, MonotonicClock, ParkedRecord, Scope, SendError, Signal, Snapshot, ThreadSafeContext,
    ThreadSafeEgressCell, TokioClock, Transport,
};

#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
