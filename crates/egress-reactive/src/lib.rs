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
//!   first (see below for nodes disposed from anywhere). Reading a disposed
//!   node is a typed error ([`ReadError`]) from the `try_` methods, and a
//!   panic naming where the node was created from the others. A computed
//!   that read a node which was then disposed, directly or through other
//!   computeds, runs again at its next read (and an effect at its next
//!   run), so it fails there rather than serve what it computed from the
//!   gone node; the disposal itself runs no effect. [`Scope::disarm`]
//!   cancels a scope's teardown.
//! - **No hangs, no stack overflows**: cycles of computeds are errors
//!   ([`CycleError`]), never a hang or a value computed from what the cycle
//!   is replacing: a computed whose dependency is being evaluated runs and
//!   meets the cycle. A re-validation (after a write upstream) can meet a
//!   cycle at another read than a first run would, so a `try_` read that
//!   catches it on a first run may not see it there; a cycle a `try_` read
//!   caught (the failed read still links its reader, so the graph's links
//!   loop) leaves no re-validation that loops. Effect feedback loops stop
//!   at [`MAX_FLUSH_ROUNDS`];
//!   propagation and re-validation are iterative, so a chain of 100,000
//!   computeds is read and updated on a 2 MiB stack.
//!
//! # Panics
//!
//! A panic in user code never wedges the graph, in any flavour (the
//! thread-safe lock does not poison: the graph stays usable from every
//! thread). What a panic leaves behind:
//!
//! - **A computed** that panics caches nothing: the reader sees the panic,
//!   and the next read runs it again. It stays subscribed to what it read
//!   before the panic and to what its last successful run read, so a
//!   change there reaches it and everything below it; its first successful
//!   run after a panic counts as a change.
//! - **An effect** whose run panics (or whose re-validation does: a
//!   computed it reads panics) ends that run. It keeps its subscriptions in
//!   the same way and runs again at the next change of what it read. The
//!   flush goes on: every other effect queued runs, in the same flush, and
//!   the first panic resumes once all have (so the writer whose change ran
//!   them sees it). Nothing is left queued for an unrelated later write.
//! - **An effect's first run** that panics disposes the effect (nobody holds
//!   a handle to it yet) before the panic reaches its creator.
//! - **A cleanup** that panics does not stop the others: every cleanup runs,
//!   then the first panic resumes (to the disposer, or to the writer whose
//!   change re-ran the effect). A cleanup that panics before a re-run skips
//!   that run; the effect runs again at the next change.
//! - **An async effect** ([`AsyncEffect`]) whose run panics is counted
//!   ([`AsyncEffect::panics`]), keeps its subscriptions, and runs again at
//!   the next change: its task goes on.
//! - **A transport** whose `send` panics fails the record it was sending (as
//!   a transient failure: it parks for its backoff, it is not left in
//!   flight with nobody to send it); the panic then goes on as an effect's.
//!   A payload whose `Clone` panics when claimed fails its record the same
//!   way.
//!
//! # Disposal and ownership, from anywhere
//!
//! - A node disposed while its own function runs (an effect or computed
//!   disposing itself, a cleanup disposing its own node or an owner of it,
//!   a scope disposed inside its own [`Scope::run`]) is detached at once and
//!   disposed when that run ends: nothing ever runs in, or is filed under,
//!   a freed slot, and what the run creates meanwhile goes with it.
//! - Cleanups run untracked (their reads subscribe nothing), with the node
//!   they clean up after as the owner: what they create is disposed with
//!   it, and a cleanup they register runs right after them.
//! - Inside an async effect's run, [`EffectCx::own`] makes the effect the
//!   owner of what a closure creates (an async run has no owner of its own
//!   across `.await`s); an [`EffectCx`] that outlives its effect reads
//!   without subscribing anything.
//! - After the [`Ctx`] is dropped, what a surviving [`Handle`] creates is
//!   born disposed (no effect runs, closures and values are dropped at once:
//!   no reference cycle can keep the graph alive), and a cleanup registered
//!   then runs at once.
//! - [`Scope::run`] on a disposed scope panics without running its closure
//!   ([`Scope::try_run`] returns [`ReadError::Disposed`]).
//! - A thread is inside at most one thread-safe graph at a time: see
//!   [`Threaded`] (a read or write across is [`ReadError::ForeignGraph`],
//!   [`WriteError::ForeignGraph`]; a disposal across waits for nothing).
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
pub use cells::{
    Aggregate, AsyncTransport, AttachRun, Attachment, Backoff, CellFlavor, CellOptions, Clock, DrainRefused, DrainRun,
    EgressCell, EgressCellOf, EncodeCheck, Inner, KeyProject, KeyReaders, LaneItem, LaneProject, LaneReaders,
    LanesAppends, LanesAttachment, LanesCell, LanesCellOf, LanesFlavor, LanesInner, LanesRefused, LanesRun, LanesState,
    LanesTransport, LatestAttachment, LatestCell, LatestCellOf, LatestCheck, LatestFlavor, LatestInner, LatestItem,
    LatestRefused, LatestRun, LatestSink, LatestState, ManualClock, MonotonicClock, ParkedRecord, PendingList, Project,
    Projector, Refused, RelayCell, RelayCellOf, RelayDrain, SendError, SizeCheck, Snapshot, SnapshotIter, SpillError,
    SpillStore, SpilledEntry, State, ThreadSafeEgressCell, ThreadSafeLanesCell, ThreadSafeLatestCell,
    ThreadSafeRelayCell, Transport, Written, Xorshift, delay,
};
#[cfg(feature = "async")]
pub use cells::{
    AsyncEgressCell, AsyncLanesCell, AsyncLatestCell, CellScope, ConnectionState, ConnectionTracker, TokioClock,
    Undelivered,
};
pub use computed::{ByEq, Compute, Computed, ComputedObj, Cutoff, Never, SameBy, Slot};
pub use context::{Context, Ctx, Handle, NodeRef, Runtime, Scope, ThreadSafeContext};
pub use effect::{Effect, EffectObj, RunEffect};
pub use error::{CycleError, EffectLoopError, NodeKind, ReadError, WriteError};
pub use flavor::{Flavor, Holds, HoldsCleanup, HoldsEq, Local, Threaded, ValueCell};
pub use graph::NodeObj;
pub use run::MAX_FLUSH_ROUNDS;
pub use signal::{Signal, SignalBlock};
