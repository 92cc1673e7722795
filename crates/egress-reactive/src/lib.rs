//! A glitch-free reactive graph in three flavours over one implementation.
//!
//! ```text
//!   Signal ──▶ Computed ──▶ Computed ──▶ Effect ──▶ (I/O)
//!      │          ▲  lazy, memoized,         runs once per settled change
//!      └──────────┘  equality cut-off
//!   write: mark dirty downstream (push)   read/flush: re-validate (pull)
//! ```
//!
//! | flavour | type | for |
//! |---|---|---|
//! | single-threaded | [`Context`] | UIs and event loops on one thread: no locks, no atomics |
//! | thread-safe | [`ThreadSafeContext`] | handles shared between threads |
//! | tokio | `AsyncContext` (feature `async`) | synchronous computeds, async effects, watch streams |
//!
//! All three run the same algorithm (see the `graph` module docs), chosen
//! by the [`Flavor`] type parameter: [`Local`] or [`Threaded`].
//!
//! What it guarantees, in every flavour:
//! - **Glitch-free**: no computed or effect observes a mix of old and new
//!   values; each effect runs at most once per settled change.
//! - **Lazy and memoized** computeds with dynamic dependencies and an
//!   equality cut-off that reaches effects.
//! - **Batches**: writes notify once at the end; a batch that restores a
//!   value notifies nothing; a panicking batch leaves the graph consistent.
//! - **Ownership**: nodes created inside an effect, computed or [`Scope`]
//!   belong to it and are disposed with it, children first, later ones
//!   first. Reading a disposed node is a typed error ([`ReadError`]) from the
//!   `try_` methods, and a panic naming where the node was created from the
//!   others.
//! - **No hangs, no stack overflows**: cycles of computeds are errors
//!   ([`CycleError`]); effect feedback loops stop at [`MAX_FLUSH_ROUNDS`];
//!   propagation and re-validation are iterative, so a chain of 100,000
//!   computeds is read and updated on a 2 MiB stack.
//!
//! ```
//! use egress_reactive::Context;
//! use std::{cell::Cell, rc::Rc};
//!
//! let cx = Context::new();
//! let a = cx.signal(1);
//! let b = cx.computed({ let a = a.clone(); move || a.get() + 1 });
//! let c = cx.computed({ let a = a.clone(); move || a.get() * 10 });
//! let seen = Rc::new(Cell::new((0, 0)));
//! let runs = cx.effect({
//!     let (b, c, seen) = (b.clone(), c.clone(), seen.clone());
//!     move || seen.set((b.get(), c.get()))
//! });
//! cx.batch(|| { a.set(2); a.set(3); });
//! assert_eq!(seen.get(), (4, 30)); // never (3, 30) nor (4, 20)
//! assert_eq!(runs.runs(), 2);      // once at creation, once per settled change
//! ```

#[cfg(feature = "async")]
mod asynchronous;
mod cells;
mod computed;
mod context;
mod effect;
mod error;
mod flavor;
mod graph;
mod run;
mod signal;

#[cfg(feature = "async")]
pub use asynchronous::{AsyncContext, AsyncEffect, EffectCx, Readable, Watch};
#[cfg(feature = "async")]
pub use cells::{AsyncEgressCell, TokioClock};
pub use cells::{
    AsyncTransport, AttachRun, Attachment, CellFlavor, CellOptions, Clock, EgressCell, EgressCellOf, Inner,
    ManualClock, MonotonicClock, ParkedRecord, Project, SendError, Snapshot, State, ThreadSafeEgressCell, Transport,
    delay,
};
pub use computed::{ByEq, Compute, Computed, ComputedObj, Cutoff, Never, SameBy, Slot};
pub use context::{Context, Ctx, Handle, NodeRef, Runtime, Scope, ThreadSafeContext};
pub use effect::{Effect, EffectObj, RunEffect};
pub use error::{CycleError, EffectLoopError, NodeKind, ReadError, WriteError};
pub use flavor::{Flavor, Holds, HoldsCleanup, HoldsEq, Local, Threaded, ValueCell};
pub use graph::NodeObj;
pub use run::MAX_FLUSH_ROUNDS;
pub use signal::{Signal, SignalBlock};
