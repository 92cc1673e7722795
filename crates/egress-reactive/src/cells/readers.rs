//! The cell's readers: lazy computeds over one projection each, the
//! pushed counts, and the per-message status readers the cell keeps.

use std::panic::Location;

use egress_core::{
    DeadReason, EgressCore, Envelope, Generation, Incarnation, MessageStatus, PersistError, Projection, Retry,
    Sequence, Time,
};

use super::cell::{CellFlavor, EgressCellOf};
use super::inner::{
    EXHAUSTED_LEN, INFLIGHT_LEN, Inner, PARKED_LEN, PENDING_LEN, State, UNPERSISTED_LEN, WINDOW_ROOM, track,
};
use crate::computed::{ByEq, Compute, Computed, ComputedObj, Cutoff, Never};
use crate::context::Handle;
use crate::flavor::{Entered, Flavor, Holds, ValueCell};

use super::snapshot::FreshCopies;
pub use super::snapshot::Snapshot;

/// A parked record, as the [`parked`](EgressCellOf::parked) reader shows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ParkedRecord<T> {
    /// The record.
    pub sequence: Sequence,
    /// Attempts so far.
    pub attempt: egress_core::Attempt,
    /// The backoff it waits.
    pub backoff: egress_core::Delay,
    /// When it becomes due.
    pub due: Time,
    /// Its payload.
    pub payload: T,
    /// `Some` for a tombstone waiting for its retry.
    pub dead: Option<DeadReason>,
}

/// What a reader computes: one projection of the core, after tracking the
/// projection's trigger. It keeps the graph and the core, not the whole
/// [`Inner`] (the counts and the clock are not its to hold).
#[doc(hidden)]
pub struct Project<T: 'static, Pr, F: Flavor> {
    pub(super) handle: Handle<F>,
    pub(super) state: F::Ptr<F::Cell<State<T>>>,
    /// The projection it reads, whose trigger it tracks.
    pub(super) projection: Projection,
    pub(super) project: Pr,
}

/// How a [`Project`] reads the core: a plain function of it, or one that
/// keeps what it made between reads ([`PendingList`]).
#[doc(hidden)]
pub trait Projector<T: 'static, F: Flavor>: 'static {
    /// The reader's value.
    type Out: 'static;
    /// The value, from the core (inside the graph, as `entered` proves).
    fn project(&self, core: &EgressCore<T>, entered: &Entered) -> Self::Out;
}

impl<T: 'static, P: 'static, F: Flavor> Projector<T, F> for fn(&EgressCore<T>) -> P {
    type Out = P;
    #[inline]
    fn project(&self, core: &EgressCore<T>, _: &Entered) -> P {
        self(core)
    }
}

/// How the [`pending`](EgressCellOf::pending) reader reads the core: the
/// pending records, sharing the copies of earlier reads (see
/// [`Snapshot`]).
#[doc(hidden)]
pub struct PendingList<T: Clone + 'static, F: Flavor>(F::Cell<FreshCopies<T>>);

impl<T: Clone + 'static, F: Flavor> Projector<T, F> for PendingList<T, F> {
    type Out = Snapshot<Envelope<T>>;
    fn project(&self, core: &EgressCore<T>, entered: &Entered) -> Self::Out {
        self.0.with_mut(entered, |copies| copies.snapshot(&core.pending_parts()))
    }
}

impl<T: 'static, Pr: Projector<T, F>, F: Flavor> Compute<Pr::Out> for Project<T, Pr, F> {
    fn compute(&self) -> Pr::Out {
        self.handle.enter(|cell| {
            let entered = Entered::by(cell);
            self.state.with(&entered, |s| {
                track(&self.handle, s, cell, self.projection);
                self.project.project(&s.core, &entered)
            })
        })
    }
}

pub(super) type Reader<T, P, E, F> = ComputedObj<P, Project<T, fn(&EgressCore<T>) -> P, F>, E, F>;

pub(super) type PendingReader<T, F> = ComputedObj<Snapshot<Envelope<T>>, Project<T, PendingList<T, F>, F>, Never, F>;

/// What a [`status`](EgressCellOf::status) reader computes: one message's
/// status, after tracking every projection it depends on.
#[doc(hidden)]
pub struct StatusOf<T: 'static, F: Flavor> {
    pub(super) inner: Inner<T, F>,
    pub(super) sequence: Sequence,
}

/// The projections a message's status follows.
pub(super) const STATUS_FOLLOWS: [Projection; 7] = [
    Projection::Pending,
    Projection::Inflight,
    Projection::Parked,
    Projection::Exhausted,
    Projection::AckedThrough,
    Projection::Received,
    Projection::Durable,
];

impl<T: 'static, F: Flavor> Compute<Option<MessageStatus>> for StatusOf<T, F> {
    fn compute(&self) -> Option<MessageStatus> {
        let inner = &self.inner;
        inner.handle.enter(|cell| {
            inner.state.with(&Entered::by(cell), |s| {
                for p in STATUS_FOLLOWS {
                    track(&inner.handle, s, cell, p);
                }
                s.core.status(self.sequence)
            })
        })
    }
}

/// The readers of a cell, one computed per projection and count.
pub(super) struct Readers<T: 'static, F: Flavor> {
    pub(super) pending: Computed<Snapshot<Envelope<T>>, F>,
    pub(super) inflight: Computed<Snapshot<Envelope<T>>, F>,
    pub(super) parked: Computed<Snapshot<ParkedRecord<T>>, F>,
    pub(super) exhausted: Computed<Snapshot<Envelope<T>>, F>,
    pub(super) acked_through: Computed<Option<Sequence>, F>,
    pub(super) received_through: Computed<Option<Sequence>, F>,
    pub(super) retry: Computed<Option<Retry>, F>,
    pub(super) generation: Computed<Generation, F>,
    pub(super) durable_through: Computed<Option<Sequence>, F>,
    pub(super) generation_durable: Computed<bool, F>,
    pub(super) persist_error: Computed<Option<PersistError>, F>,
}

/// The status readers [`EgressCellOf::status`] made, by sequence: the same
/// reader for the same sequence while the application holds it or a live
/// computation reads it. Those neither held nor read any more are disposed
/// at a sweep, when the map has doubled since the last one: the map is
/// bounded by twice the readers in use, and a sweep's cost is spread over
/// the calls that grew it.
pub(super) struct Statuses<F: Flavor> {
    pub(super) by_sequence: std::collections::HashMap<Sequence, Computed<Option<MessageStatus>, F>>,
    /// The size at which the next sweep runs.
    pub(super) sweep_at: usize,
}

/// The fewest readers at which [`Statuses`] sweeps.
pub(super) const STATUS_SWEEP_MIN: usize = 64;

impl<F: Flavor> Statuses<F> {
    pub(super) fn new() -> Self {
        Statuses { by_sequence: std::collections::HashMap::new(), sweep_at: STATUS_SWEEP_MIN }
    }

    /// Takes out the readers only the map holds, if a sweep is due, for
    /// the caller to dispose (outside the map's lock).
    fn sweep(&mut self) -> Vec<Computed<Option<MessageStatus>, F>> {
        if self.by_sequence.len() < self.sweep_at {
            return Vec::new();
        }
        let mut unheld = Vec::new();
        self.by_sequence.retain(|_, status| {
            // Held by a handle, or read by a live computation (an effect
            // that asked for it and dropped the handle still follows it).
            let held = status.is_shared() || status.has_subscribers();
            if !held {
                unheld.push(status.clone());
            }
            held
        });
        self.sweep_at = (self.by_sequence.len() * 2).max(STATUS_SWEEP_MIN);
        unheld
    }
}

/// The parked records of `core`, as the `parked` readers show them.
pub(super) fn parked_records<T: Clone>(core: &EgressCore<T>) -> Snapshot<ParkedRecord<T>> {
    core.parked()
        .map(|p| ParkedRecord {
            sequence: p.sequence,
            attempt: p.attempt,
            backoff: p.backoff,
            due: p.due,
            payload: p.payload.clone(),
            dead: p.dead,
        })
        .collect()
}

pub(super) fn list<'a, T: Clone + 'a>(items: impl Iterator<Item = Envelope<&'a T>>) -> Snapshot<Envelope<T>> {
    items.map(Envelope::cloned).collect()
}

impl<T: Clone + 'static, F: CellFlavor<T>> EgressCellOf<T, F> {
    /// The records waiting to be claimed, in sequence order.
    pub fn pending(&self) -> &Computed<Snapshot<Envelope<T>>, F> {
        &self.shared.readers.pending
    }

    /// The records in flight, in claim order.
    pub fn inflight(&self) -> &Computed<Snapshot<Envelope<T>>, F> {
        &self.shared.readers.inflight
    }

    /// The failed records waiting for their backoff, in sequence order.
    pub fn parked(&self) -> &Computed<Snapshot<ParkedRecord<T>>, F> {
        &self.shared.readers.parked
    }

    /// The dead letters (budget spent, or a permanent failure), in sequence
    /// order, each with the generation it failed under.
    pub fn exhausted(&self) -> &Computed<Snapshot<Envelope<T>>, F> {
        &self.shared.readers.exhausted
    }

    /// The cumulative acknowledgement watermark (`None` until the first ack).
    pub fn acked_through(&self) -> &Computed<Option<Sequence>, F> {
        &self.shared.readers.acked_through
    }

    /// The receipt watermark: the peer holds every sequence at or below it,
    /// acknowledged or not ("delivered" where `acked_through` is "read").
    pub fn received_through(&self) -> &Computed<Option<Sequence>, F> {
        &self.shared.readers.received_through
    }

    /// The most recent failure, while its record is parked or exhausted:
    /// what a UI shows as "retrying in 4 s" or "failed".
    pub fn retry(&self) -> &Computed<Option<Retry>, F> {
        &self.shared.readers.retry
    }

    /// The current generation.
    pub fn generation(&self) -> &Computed<Generation, F> {
        &self.shared.readers.generation
    }

    /// How many records are pending.
    pub fn pending_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[PENDING_LEN]
    }

    /// How many records are in flight.
    pub fn inflight_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[INFLIGHT_LEN]
    }

    /// How many more records the window admits.
    pub fn window_room(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[WINDOW_ROOM]
    }

    /// How many records are parked.
    pub fn parked_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[PARKED_LEN]
    }

    /// How many records are exhausted.
    pub fn exhausted_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[EXHAUSTED_LEN]
    }

    /// Every sequence at or below it is durable (`None` without a journal,
    /// or while nothing is). See [`EgressCore::durable_through`].
    pub fn durable_through(&self) -> &Computed<Option<Sequence>, F> {
        &self.shared.readers.durable_through
    }

    /// How many records are enqueued and not yet durable: the "saving…"
    /// count. Always 0 without a journal.
    pub fn unpersisted_len(&self) -> &Computed<usize, F> {
        &self.shared.inner.counts[UNPERSISTED_LEN]
    }

    /// Whether the current generation is durable, so that a handshake may
    /// use it. Always `true` without a journal.
    pub fn generation_durable(&self) -> &Computed<bool, F> {
        &self.shared.readers.generation_durable
    }

    /// A reader of where the message `sequence` stands (see
    /// [`EgressCore::status`]): "saving…", queued, sending, received,
    /// retrying, dead, acknowledged. It recomputes when a projection the
    /// status depends on changes and notifies only when the status does; an
    /// acknowledged message stays acknowledged, so a UI keeps it until it
    /// drops it itself.
    ///
    /// The reader is the cell's, not the caller's: a call for a sequence
    /// whose reader is in use (a handle holds it, or a live computed or
    /// effect reads it) returns that reader, so a redraw that asks again
    /// makes no new node; a reader no longer in use is disposed at a later
    /// call (or with the cell). An effect may ask for the statuses it shows
    /// and drop the handles: it keeps following them. Do not dispose a
    /// status reader, since another caller may use the same one. On a
    /// disposed cell each call makes a reader under the current owner, not
    /// kept by the cell, whose value never changes (a disposed cell
    /// notifies nothing).
    #[track_caller]
    pub fn status(&self, sequence: Sequence) -> Computed<Option<MessageStatus>, F> {
        let at = Location::caller();
        let make = || {
            let f = StatusOf { inner: self.shared.inner.clone(), sequence };
            self.shared.inner.handle.make_computed(ByEq, f, at)
        };
        // In the cell's scope, which holds the graph for the whole call: the
        // map is only ever locked inside the graph (no other order of the
        // two locks exists), and one thread at a time looks a sequence up
        // and makes its reader.
        let found = self.shared.scope.try_run(|| {
            let mut statuses = self.shared.statuses.lock();
            if let Some(held) = statuses.by_sequence.get(&sequence)
                && !held.is_disposed()
            {
                return (held.clone(), Vec::new());
            }
            let unheld = statuses.sweep();
            let made = make();
            statuses.by_sequence.insert(sequence, made.clone());
            (made, unheld)
        });
        let Ok((status, unheld)) = found else { return make() };
        for reader in unheld {
            reader.dispose();
        }
        status
    }

    /// What the store held when the cell's core was restored (see
    /// [`EgressCore::recovered`]); `None` for a cell not built from a
    /// restored core. It never changes, so it is a plain value, not a
    /// reader.
    pub fn recovered(&self) -> Option<egress_core::Recovered> {
        self.with_core(EgressCore::recovered)
    }

    /// The last failure to persist, until a later write succeeds: sending
    /// stalls on what is not durable meanwhile, visibly.
    pub fn persist_error(&self) -> &Computed<Option<PersistError>, F> {
        &self.shared.readers.persist_error
    }

    /// Disposes every node the cell created: its readers (reads of them fail
    /// with [`ReadError::Disposed`](crate::ReadError)), its triggers and its
    /// attachments (their transports are dropped). The core and its records
    /// stay: mutators still apply transitions, and notify nothing.
    /// Dropping the cell's last clone does the same. Idempotent.
    pub fn dispose(&self) {
        self.shared.scope.dispose();
    }

    /// Whether the cell was disposed (or its owner, or its context).
    pub fn is_disposed(&self) -> bool {
        self.shared.scope.is_disposed()
    }

    /// Runs `f` on the cell's graph with the cell as owner: what `f`
    /// creates there (signals, computeds, effects) is disposed with the
    /// cell. For the parts that project their own state beside the cell's,
    /// such as egress-ws's sender and its connection state.
    ///
    /// # Errors
    /// [`ReadError::Disposed`](crate::ReadError) (and `f` not run) if the
    /// cell was disposed.
    pub fn in_scope<R>(&self, f: impl FnOnce(&Handle<F>) -> R) -> Result<R, crate::ReadError> {
        let handle = &self.shared.inner.handle;
        self.shared.scope.try_run(|| f(handle))
    }

    /// Reads the core directly, untracked (for what no reader projects, such
    /// as the policy). `f` must not call into the cell.
    pub fn with_core<R>(&self, f: impl FnOnce(&EgressCore<T>) -> R) -> R {
        self.shared.inner.with_core(f)
    }

    /// The incarnation of the cell's sequence space (see
    /// [`CellOptions::incarnation`](crate::CellOptions::incarnation)).
    pub fn incarnation(&self) -> Incarnation {
        self.shared.incarnation
    }

    /// The sequence the next enqueue will assign (untracked).
    pub fn next_sequence(&self) -> Sequence {
        self.with_core(EgressCore::next_sequence)
    }

    /// The cell's clock, read now.
    pub fn now(&self) -> Time {
        self.shared.inner.now()
    }
}

pub(super) fn pending_reader<T: Clone + 'static, F>(
    inner: &Inner<T, F>,
    at: &'static Location<'static>,
) -> Computed<Snapshot<Envelope<T>>, F>
where
    F: Holds<PendingReader<T, F>>,
{
    let f = Project {
        handle: inner.handle.clone(),
        state: inner.state.clone(),
        projection: Projection::Pending,
        project: PendingList(ValueCell::new(FreshCopies::default())),
    };
    inner.handle.make_computed(Never, f, at)
}

pub(super) fn reader<T: Clone + 'static, P: 'static, E: Cutoff<P>, F>(
    inner: &Inner<T, F>,
    projection: Projection,
    cutoff: E,
    project: fn(&EgressCore<T>) -> P,
    at: &'static Location<'static>,
) -> Computed<P, F>
where
    F: Holds<Reader<T, P, E, F>>,
{
    let f = Project { handle: inner.handle.clone(), state: inner.state.clone(), projection, project };
    inner.handle.make_computed(cutoff, f, at)
}
