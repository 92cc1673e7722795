//! egress: reactive signals whose egress cells make send-side delivery state
//! observable.
//!
//! This facade re-exports the workspace's crates. At the root, what an
//! application uses: the delivery core's types ([`EgressCore`], [`Policy`],
//! [`Sequence`], the outcomes), the reactive contexts and the egress cells
//! ([`EgressCell`], [`ThreadSafeEgressCell`], [`AsyncEgressCell`]), and
//! the codecs that make typed payloads bytes for every store and transport
//! ([`Codec`], [`Encode`], [`Json`], [`Raw`]);
//! [`prelude`] has the few an application starts with. The journal
//! protocol a store implements is in [`journal`]; all of
//! [`egress_core`] is in [`core`], all of [`egress_reactive`] in
//! [`reactive`].
//!
//! Features (none by default):
//!
//! - `ws`: the WebSocket transport (`Sender`), the reference receiver and
//!   the wire protocol, as `egress::ws` ([egress-ws](https://docs.rs/egress-ws)).
//! - `store`: durable egress on SQLite (a transactional outbox, its relay,
//!   restart recovery), as `egress::store`
//!   ([egress-store](https://docs.rs/egress-store)).
//!
//! ```
//! use egress::{EgressCore, Policy};
//!
//! let mut core = EgressCore::new(Policy::default());
//! let seq = core.enqueue(b"ping".to_vec()).outcome;
//! assert_eq!(core.pending_len(), 1);
//! assert_eq!(seq.get(), 0);
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

pub use egress_core::{
    AckOutcome, Attempt, Changes, ClaimOutcome, DeadLetters, DeadReason, Delay, EgressCore, Envelope, FailOutcome,
    FailureKind, FlushEpoch, Generation, Incarnation, JitterSample, MessageStatus, Ordering, ParkedView, Policy,
    PolicyBuilder, PolicyError, Projection, ReceivedOutcome, ReconnectOutcome, Retry, ScheduleOutcome, Sequence, Time,
    Transition,
};

/// What an application starts with: `use egress::prelude::*;`.
pub mod prelude {
    pub use egress_codec::Json;
    pub use egress_core::{DeadReason, MessageStatus, Policy, Sequence};
    pub use egress_reactive::{AsyncContext, AsyncEgressCell, CellOptions, Context, EgressCell, Refused, Undelivered};
}

/// The journal protocol between a durable core and its store (see
/// `docs/durable.md`): what a store writes ([`Ready`](journal::Ready)),
/// what it reads back ([`Restored`](journal::Restored)), and the outcomes.
/// An application that uses `egress::store` never touches it.
pub mod journal {
    pub use egress_core::{
        AdoptOutcome, DeadMark, Epoch, PersistError, PersistOutcome, Ready, RebaseOutcome, Recovered, RestoreError,
        Restored, RestoredRecord, SKIPPED_MEMORY,
    };
}

/// The pure delivery state machine, all of it: see [`egress_core`].
pub mod core {
    pub use egress_core::*;
}

/// The reactive graph in three flavours: see [`egress_reactive`].
pub mod reactive {
    pub use egress_reactive::*;
}

/// The WebSocket transport, reference receiver and wire protocol (feature
/// `ws`): see `egress_ws`.
#[cfg(feature = "ws")]
#[cfg_attr(docsrs, doc(cfg(feature = "ws")))]
pub mod ws {
    pub use egress_ws::*;
}

/// Durable egress on SQLite (feature `store`): see `egress_store`.
#[cfg(feature = "store")]
#[cfg_attr(docsrs, doc(cfg(feature = "store")))]
pub mod store {
    pub use egress_store::*;
}

/// The NATS JetStream transport and subscriber (feature `nats`): see
/// `egress_nats`.
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats {
    pub use egress_nats::*;
}

pub use egress_codec::{Codec, CodecError, Encode, Json, Raw};
pub use egress_reactive::{
    AsyncContext, AsyncEgressCell, AsyncTransport, Attachment, CellOptions, Clock, Computed, Context, Effect,
    EgressCell, ManualClock, MonotonicClock, ParkedRecord, Refused, Scope, SendError, Signal, Snapshot,
    ThreadSafeContext, ThreadSafeEgressCell, TokioClock, Transport, Undelivered,
};

#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
