//! Egress cells: delivery state as signals, transport I/O as one effect per
//! connection.
//!
//! ```text
//!  enqueue/ack/fail/...──▶ EgressCore ──changes──▶ triggers ──▶ readers (computeds) ──▶ UI effects
//!                              ▲                       └─wake─▶ attachment effect ──send──▶ transport
//!                              └──────── claim / fail (does not wake itself) ◀────────────┘
//! ```
//!
//! See [`EgressCellOf`] for the cell, [`Attachment`] for the transport
//! effect, and docs/cells.md for the rules.

#[cfg(feature = "async")]
mod asynchronous;
mod backoff;
mod cell;
mod clock;
mod transport;

#[cfg(feature = "async")]
pub use asynchronous::{AsyncEgressCell, Undelivered};
pub use backoff::{Backoff, Xorshift};
pub use cell::{
    AttachRun, Attachment, CellFlavor, CellOptions, EgressCell, EgressCellOf, Inner, ParkedRecord, Project, Refused,
    SizeCheck, Snapshot, State, ThreadSafeEgressCell,
};
#[cfg(feature = "async")]
pub use clock::TokioClock;
pub use clock::{Clock, ManualClock, MonotonicClock, delay};
pub use transport::{AsyncTransport, SendError, Transport};
