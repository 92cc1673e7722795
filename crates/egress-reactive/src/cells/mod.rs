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
mod attachment;
mod backoff;
mod cell;
mod clock;
#[cfg(feature = "async")]
mod connection;
mod fences;
mod inner;
mod keyed;
mod lanes;
mod latest;
mod options;
mod readers;
mod relay;
mod snapshot;
mod spill;
mod transport;

#[cfg(feature = "async")]
pub use asynchronous::{AsyncEgressCell, Undelivered};
pub use attachment::Attachment;
pub use backoff::{Backoff, Xorshift};
pub use cell::{CellFlavor, EgressCell, EgressCellOf, ThreadSafeEgressCell};
#[cfg(feature = "async")]
pub use clock::TokioClock;
pub use clock::{Clock, ManualClock, MonotonicClock, delay};
#[cfg(feature = "async")]
pub use connection::{CellScope, ConnectionState, ConnectionTracker};
pub use inner::{AttachRun, Inner, State};
#[cfg(feature = "async")]
pub use lanes::AsyncLanesCell;
pub use lanes::{
    Aggregate, LaneItem, LaneProject, LaneReaders, LanesAppends, LanesAttachment, LanesCell, LanesCellOf, LanesFlavor,
    LanesInner, LanesRefused, LanesRun, LanesState, LanesTransport, ThreadSafeLanesCell,
};
#[cfg(feature = "async")]
pub use latest::AsyncLatestCell;
pub use latest::{
    KeyProject, KeyReaders, LatestAttachment, LatestCell, LatestCellOf, LatestCheck, LatestFlavor, LatestInner,
    LatestItem, LatestRefused, LatestRun, LatestSink, LatestState, ThreadSafeLatestCell, Written,
};
pub use options::{CellOptions, EncodeCheck, Refused, SizeCheck};
pub use readers::{ParkedRecord, PendingList, Project, Projector, Snapshot};
pub use relay::{DrainRefused, DrainRun, RelayCell, RelayCellOf, RelayDrain, ThreadSafeRelayCell};
pub use snapshot::Iter as SnapshotIter;
pub use spill::{SpillError, SpillStore, SpilledEntry};
pub use transport::{AsyncTransport, SendError, Transport};
