//! [`EgressCellOf`]: an [`EgressCore`] projected into a graph. One
//! implementation for every flavour; the async cell wraps it. This file:
//! the cell, its construction and its mutators (the journal's too); its
//! readers are in `readers.rs`, its attachments in `attachment.rs`, the
//! state every part shares and the one transition path in `inner.rs`, its
//! options and refusals in `options.rs`.

use std::ops::Range;
use std::panic::{AssertUnwindSafe, Location, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::time::Duration;

use egress_core::{
    AckOutcome, AdoptOutcome, Changes, ClaimOutcome, EgressCore, Envelope, Epoch, FailOutcome, FailureKind, Generation,
    Incarnation, JitterSample, MessageStatus, PersistError, PersistOutcome, Policy, Projection, Ready, ReceivedOutcome,
    ReconnectOutcome, Retry, ScheduleOutcome, Sequence, Time,
};

use super::clock::{Clock, MonotonicClock};
use super::fences::Attached;
use super::inner::{
    By, EXHAUSTED_LEN, INFLIGHT_LEN, Inner, Keys, PARKED_LEN, PENDING_LEN, State, UNPERSISTED_LEN, WINDOW_ROOM, count,
    unacknowledged,
};
use super::options::{CellOptions, EncodeCheck, Refused, SizeCheck};
use super::readers::{
    ParkedRecord, PendingReader, Reader, Readers, Snapshot, StatusOf, Statuses, list, parked_records, pending_reader,
    reader,
};
use crate::computed::{ByEq, ComputedObj, Never};
use crate::context::{Handle, Scope};
use crate::flavor::{Entered, Flavor, Holds, Local, Threaded, ValueCell};

/// The flavours that can hold a cell of `T`: [`Local`] for any `T: Clone`,
/// [`Threaded`] for `T: Clone + Send + Sync`. (It names the node types a
/// cell creates, so that one generic implementation serves both.)
#[doc(hidden)]
pub trait CellFlavor<T: Clone + 'static>:
    Flavor
    + Holds<Reader<T, Option<Sequence>, ByEq, Self>>
    + Holds<Reader<T, Option<Retry>, ByEq, Self>>
    + Holds<Reader<T, Generation, ByEq, Self>>
    + Holds<Reader<T, Snapshot<Envelope<T>>, Never, Self>>
    + Holds<PendingReader<T, Self>>
    + Holds<Reader<T, Snapshot<ParkedRecord<T>>, Never, Self>>
    + Holds<Reader<T, Option<PersistError>, ByEq, Self>>
    + Holds<Reader<T, bool, ByEq, Self>>
    + Holds<ComputedObj<Option<MessageStatus>, StatusOf<T, Self>, ByEq, Self>>
{
    /// The clock of a cell built without one.
    fn default_clock() -> Arc<dyn Clock> {
        Arc::new(MonotonicClock::new())
    }
}

impl<T: Clone + 'static> CellFlavor<T> for Local {}
impl<T: Clone + Send + Sync + 'static> CellFlavor<T> for Threaded {}

/// What the clones of a cell share.
pub(super) struct Shared<T: 'static, F: Flavor> {
    pub(super) inner: Inner<T, F>,
    pub(super) readers: Readers<T, F>,
    /// The live attachments, by the generation each captured.
    pub(super) attachments: Attached<F>,
    /// Owns every node of the cell: its triggers, readers and attachments.
    pub(super) scope: Scope<F>,
    pub(super) incarnation: Incarnation,
    /// See [`CellOptions::capacity`].
    pub(super) capacity: Option<usize>,
    /// See [`EgressCellOf::set_size_check`].
    pub(super) size_check: parking_lot::Mutex<Option<SizeCheck<T>>>,
    /// See [`EgressCellOf::set_encode_check`].
    pub(super) encode_check: parking_lot::Mutex<Option<EncodeCheck<T>>>,
    /// See [`EgressCellOf::status`].
    pub(super) statuses: parking_lot::Mutex<Statuses<F>>,
}

/// An egress cell on a graph of flavour `F`: delivery state as signals.
/// Use it as [`EgressCell`] (on [`Context`](crate::Context)),
/// [`ThreadSafeEgressCell`] (on [`ThreadSafeContext`](crate::ThreadSafeContext))
/// or through [`AsyncEgressCell`](crate::AsyncEgressCell).
///
/// The cell owns an [`EgressCore`] and projects it into the graph:
///
/// - **Readers** are computeds: [`pending`](Self::pending),
///   [`inflight`](Self::inflight), [`parked`](Self::parked),
///   [`exhausted`](Self::exhausted) (snapshots), [`acked_through`](Self::acked_through),
///   [`received_through`](Self::received_through),
///   [`retry`](Self::retry), [`generation`](Self::generation), and the counts
///   [`pending_len`](Self::pending_len), [`inflight_len`](Self::inflight_len),
///   [`window_room`](Self::window_room), [`parked_len`](Self::parked_len),
///   [`exhausted_len`](Self::exhausted_len). The projections are lazy: one
///   nobody reads costs nothing, and a list is built only when read after a
///   change. The counts are kept eagerly, O(1) per transition that changes
///   their projection, and notify only when their value changes (they
///   never run: their `runs()` stays 0).
/// - **Mutators** ([`enqueue`](Self::enqueue), [`ack`](Self::ack),
///   [`fail`](Self::fail), ...) return the core's outcome and invalidate
///   exactly the readers of the projections the transition changed, as one
///   write (effects run once). A refused or no-op call invalidates nothing.
///   Scalar and count readers cut off by equality, so an effect over "is
///   anything pending?" re-runs only when the answer changes.
/// - **Attachments** ([`attach`](Self::attach)) wire a transport as one
///   effect per connection; see [`Attachment`](crate::Attachment).
///
/// Time comes from the cell's [`Clock`] (milliseconds; see
/// [`CellOptions`]). The synchronous cells do not own a timer: the
/// application's loop asks [`poll_timeout`](Self::poll_timeout) (or
/// [`timeout_in`](Self::timeout_in)) when the next parked record is due and
/// calls [`handle_timeout`](Self::handle_timeout) then.
///
/// Mutators and readers must not be called from inside `claim_with`'s
/// closure; everywhere else (effects, transports, other threads for the
/// thread-safe flavour) they may.
///
/// ```
/// use egress_core::{Delay, Envelope, Policy, Sequence};
/// use egress_reactive::{Context, EgressCell, SendError, Transport};
/// use std::{cell::RefCell, rc::Rc};
///
/// struct Wire(Rc<RefCell<Vec<Envelope<String>>>>);
/// impl Transport<String> for Wire {
///     fn send(&mut self, envelope: Envelope<String>) -> Result<(), SendError> {
///         self.0.borrow_mut().push(envelope);
///         Ok(())
///     }
/// }
///
/// let cx = Context::new();
/// let cell = EgressCell::new(&cx, Policy::builder().inflight_limit(2).build()?);
/// let status = cx.computed({
///     let (pending, inflight) = (cell.pending_len().clone(), cell.inflight_len().clone());
///     move || format!("{} waiting, {} sending", pending.get(), inflight.get())
/// });
///
/// let wire = Rc::new(RefCell::new(Vec::new()));
/// let link = cell.attach(Wire(wire.clone()));
/// for text in ["hi", "how are you", "bye"] {
///     cell.enqueue(text.to_string());
/// }
/// assert_eq!(wire.borrow().len(), 2); // the window holds two
/// assert_eq!(status.get(), "1 waiting, 2 sending");
///
/// link.ack(Sequence(1)); // the peer has 0 and 1: the window reopens
/// assert_eq!(wire.borrow().len(), 3);
/// assert_eq!(status.get(), "0 waiting, 1 sending");
/// # Ok::<(), egress_core::PolicyError>(())
/// ```
pub struct EgressCellOf<T: 'static, F: Flavor> {
    pub(super) shared: F::Ptr<Shared<T, F>>,
}

/// An egress cell on a [`Context`](crate::Context) (one thread).
pub type EgressCell<T> = EgressCellOf<T, Local>;

/// An egress cell on a [`ThreadSafeContext`](crate::ThreadSafeContext):
/// `Send + Sync`, mutators and readers usable from any thread.
///
/// The graph's lock is held for each call, including the attachment's
/// sends that a call triggers, so a slow synchronous transport holds up
/// the other threads' calls; use [`AsyncEgressCell`](crate::AsyncEgressCell)
/// for transports that wait.
pub type ThreadSafeEgressCell<T> = EgressCellOf<T, Threaded>;

impl<T: 'static, F: Flavor> EgressCellOf<T, F> {
    /// Whether `other` is a clone of this cell.
    pub(crate) fn same_cell(&self, other: &Self) -> bool {
        std::ptr::eq(&*self.shared, &*other.shared)
    }
}

impl<T: 'static, F: Flavor> Clone for EgressCellOf<T, F> {
    fn clone(&self) -> Self {
        EgressCellOf { shared: self.shared.clone() }
    }
}

impl<T: 'static, F: Flavor> std::fmt::Debug for EgressCellOf<T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = &self.shared.inner;
        inner.with_core(|core| {
            f.debug_struct("EgressCell")
                .field("generation", &core.generation())
                .field("next_sequence", &core.next_sequence())
                .field("pending", &core.pending_len())
                .field("inflight", &core.inflight_len())
                .field("parked", &core.parked_len())
                .field("exhausted", &core.exhausted_len())
                .field("acked_through", &core.acked_through())
                .field("received_through", &core.received_through())
                .finish()
        })
    }
}

impl<T: Clone + 'static, F: CellFlavor<T>> EgressCellOf<T, F> {
    /// A cell with `policy`, at generation 0, owned by the current owner of
    /// `cx` (disposed with it, or when the last clone of the cell drops).
    #[track_caller]
    pub fn new(cx: &Handle<F>, policy: Policy) -> Self {
        Self::with_options(cx, policy, CellOptions::new())
    }

    /// A cell with `policy` and `options`.
    #[track_caller]
    pub fn with_options(cx: &Handle<F>, policy: Policy, mut options: CellOptions) -> Self {
        let clock = options.take_clock(F::default_clock);
        let core = EgressCore::with_generation(policy, options.generation);
        Self::build(cx, core, options, clock, Location::caller())
    }

    /// A cell over `core`, as it is: for a core rebuilt by
    /// [`EgressCore::restore`] from a store, whose journal the cell then
    /// projects ([`durable_through`](Self::durable_through),
    /// [`unpersisted_len`](Self::unpersisted_len),
    /// [`persist_error`](Self::persist_error)) and whose writes a store's
    /// relay drives ([`poll_ready`](Self::poll_ready)). The options'
    /// generation is ignored (the core has one); give the stored
    /// incarnation, so that the receiver knows the sequence space.
    #[track_caller]
    pub fn from_core(cx: &Handle<F>, core: EgressCore<T>, mut options: CellOptions) -> Self {
        let clock = options.take_clock(F::default_clock);
        Self::build(cx, core, options, clock, Location::caller())
    }

    pub(crate) fn build(
        cx: &Handle<F>,
        core: EgressCore<T>,
        options: CellOptions,
        clock: Arc<dyn Clock>,
        at: &'static Location<'static>,
    ) -> Self {
        let (incarnation, seed) = options.identity();
        let (scope, (inner, readers)) = cx.scope(|| {
            let counts = [PENDING_LEN, INFLIGHT_LEN, WINDOW_ROOM, PARKED_LEN, EXHAUSTED_LEN, UNPERSISTED_LEN]
                .map(|which| cx.pushed(count(&core, which), at));
            let state = F::ptr(ValueCell::new(State::new(core, seed, at)));
            let inner = Inner { handle: cx.clone(), state, wake: cx.trigger(at), counts, clock };
            let readers = Readers {
                pending: pending_reader(&inner, at),
                inflight: reader(&inner, Projection::Inflight, Never, |c| list(c.inflight()), at),
                parked: reader(&inner, Projection::Parked, Never, parked_records, at),
                exhausted: reader(&inner, Projection::Exhausted, Never, |c| list(c.exhausted()), at),
                acked_through: reader(&inner, Projection::AckedThrough, ByEq, EgressCore::acked_through, at),
                received_through: reader(&inner, Projection::Received, ByEq, EgressCore::received_through, at),
                retry: reader(&inner, Projection::Retry, ByEq, EgressCore::retry, at),
                generation: reader(&inner, Projection::Generation, ByEq, EgressCore::generation, at),
                durable_through: reader(&inner, Projection::Durable, ByEq, EgressCore::durable_through, at),
                generation_durable: reader(&inner, Projection::Durable, ByEq, EgressCore::generation_durable, at),
                persist_error: reader(&inner, Projection::PersistError, ByEq, |c| c.persist_error().cloned(), at),
            };
            (inner, readers)
        });
        // The readers' triggers, made when first tracked, belong to the
        // scope.
        cx.enter(|cell| inner.state.with_mut(&Entered::by(cell), |s| s.owner = scope.key()));
        let capacity = options.capacity;
        let shared = Shared {
            inner,
            readers,
            attachments: Attached::new(),
            scope,
            incarnation,
            capacity,
            size_check: parking_lot::Mutex::new(None),
            encode_check: parking_lot::Mutex::new(None),
            statuses: parking_lot::Mutex::new(Statuses::new()),
        };
        EgressCellOf { shared: F::ptr(shared) }
    }

    // ----- mutators --------------------------------------------------

    /// Queues `payload` and returns its sequence. Wakes the attachment when
    /// the window has room.
    pub fn enqueue(&self, payload: T) -> Sequence {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.enqueue(payload);
            (t.outcome, t.changes)
        })
    }

    /// [`enqueue`](Self::enqueue), unless the payload is larger than the
    /// cell's transport carries ([`Refused::TooLarge`], see
    /// [`set_size_check`](Self::set_size_check)), does not encode with its
    /// store's codec ([`Refused::Unencodable`], see
    /// [`set_encode_check`](Self::set_encode_check)), or the cell holds its
    /// [capacity](CellOptions::capacity) of unacknowledged records
    /// ([`Refused::Full`]): then the payload comes back and nothing
    /// changes. ([`enqueue`](Self::enqueue) checks none of these: a payload
    /// too large becomes a dead letter when it is sent, and reads so; one
    /// that does not encode stops a durable cell's writes, see
    /// `egress_store::open_durable_with`.)
    ///
    /// # Errors
    /// [`Refused`]: too large, not encodable, or at capacity.
    pub fn try_enqueue(&self, payload: T) -> Result<Sequence, Refused<T>> {
        let payload = self.checked(payload)?;
        let capacity = self.shared.capacity;
        self.shared.inner.apply(By::Caller, |s| match capacity {
            Some(capacity) if unacknowledged(&s.core) >= capacity => {
                (Err(Refused::Full { payload, capacity }), Changes::NONE)
            }
            _ => {
                let t = s.core.enqueue(payload);
                (Ok(t.outcome), t.changes)
            }
        })
    }

    /// Sets (or, with `None`, removes) the check of a payload's size that
    /// [`try_enqueue`](Self::try_enqueue) applies: a transport that knows
    /// the largest payload it carries installs it (the WebSocket sender
    /// does when it starts, and lowers its limit to a receiver's when a
    /// welcome announces a smaller one), so that a caller is refused at
    /// once rather than told later of a dead letter.
    pub fn set_size_check(&self, check: Option<SizeCheck<T>>) {
        *self.shared.size_check.lock() = check;
    }

    /// `payload` back if the cell's checks take it: not larger than its
    /// transport carries, and encodable by its store's codec (the checks of
    /// [`try_enqueue`](Self::try_enqueue) but its capacity).
    pub(crate) fn checked(&self, payload: T) -> Result<T, Refused<T>> {
        let check = self.shared.size_check.lock().clone();
        if let Some((size, limit)) = check.and_then(|check| check(&payload)) {
            return Err(Refused::TooLarge { payload, size, limit });
        }
        let check = self.shared.encode_check.lock().clone();
        if let Some(Err(reason)) = check.map(|check| check(&payload)) {
            return Err(Refused::Unencodable { payload, reason });
        }
        Ok(payload)
    }

    /// Sets (or, with `None`, removes) the check that a payload encodes
    /// that [`try_enqueue`](Self::try_enqueue) applies: a durable cell's
    /// store installs its codec's (`egress_store::open_durable_with` does),
    /// so that a value its codec refuses (or panics on) is refused at once
    /// with why, rather than left unwritten, holding every record after it.
    /// It runs on the caller's thread, before the cell is touched; a check
    /// that panics is the caller's panic.
    pub fn set_encode_check(&self, check: Option<EncodeCheck<T>>) {
        *self.shared.encode_check.lock() = check;
    }

    /// Removes `check` if it is the one installed (a transport that goes
    /// away takes its own check, not a later transport's).
    pub fn remove_size_check(&self, check: &SizeCheck<T>) {
        let mut installed = self.shared.size_check.lock();
        if installed.as_ref().is_some_and(|c| Arc::ptr_eq(c, check)) {
            *installed = None;
        }
    }

    /// The size and limit of `payload` if the cell's transport would refuse
    /// it as too large (see [`set_size_check`](Self::set_size_check)).
    pub fn too_large(&self, payload: &T) -> Option<(usize, usize)> {
        let check = self.shared.size_check.lock().clone();
        check.and_then(|check| check(payload))
    }

    /// The cell's [capacity](CellOptions::capacity), if it has one.
    pub fn capacity(&self) -> Option<usize> {
        self.shared.capacity
    }

    /// Queues every payload in order: one transition, one invalidation, one
    /// attachment run for all of them. Returns the sequences assigned.
    pub fn enqueue_all(&self, payloads: impl IntoIterator<Item = T>) -> Range<Sequence> {
        // Collected first: the iterator is user code, which must not run
        // while the core is borrowed.
        let payloads: Vec<T> = payloads.into_iter().collect();
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.enqueue_all(payloads);
            (t.outcome, t.changes)
        })
    }

    /// Queues `payload` to go out only once the application's state it
    /// depends on is durable: once [`release`](Self::release) reaches
    /// `after`. See [`EgressCore::enqueue_after`].
    pub fn enqueue_after(&self, payload: T, after: egress_core::FlushEpoch) -> Sequence {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.enqueue_after(payload, after);
            (t.outcome, t.changes)
        })
    }

    /// The application made its state durable through flush epoch
    /// `through`: what waited for it goes on. See [`EgressCore::release`].
    pub fn release(&self, through: egress_core::FlushEpoch) -> usize {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.release(through);
            (t.outcome, t.changes)
        })
    }

    /// Claims the next record under `generation` by hand (attachments do
    /// this for you) and passes the outcome to `f`, which must not call into
    /// the cell. The readers are invalidated after `f` returns.
    pub fn claim_with<R>(&self, generation: Generation, f: impl FnOnce(ClaimOutcome<'_, T>) -> R) -> R {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.claim(generation);
            let changes = t.changes;
            (f(t.outcome), changes)
        })
    }

    /// A cumulative acknowledgement from the peer of `generation`: every
    /// sequence at or below `through` was delivered. See
    /// [`EgressCore::ack`]; an [`Attachment`](crate::Attachment) knows its generation.
    pub fn ack(&self, generation: Generation, through: Sequence) -> AckOutcome {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.ack(generation, through);
            (t.outcome, t.changes)
        })
    }

    /// A receipt from the peer of `generation`: it holds every sequence at
    /// or below `through`, acknowledged or not, so those pending are not
    /// sent again. See [`EgressCore::received`].
    pub fn received(&self, generation: Generation, through: Sequence) -> ReceivedOutcome {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.received(generation, through);
            (t.outcome, t.changes)
        })
    }

    /// Word from the peer of `generation` that it processed the in-flight
    /// record `sequence` out of order, above one it has not: a completion a
    /// [`Completions`](egress_core::Completions) tracker holds back. That is
    /// progress: isolation ends (a probe completed above a gap must not hold
    /// back the record below it), and the attachments are woken. Returns
    /// whether isolation ended. See [`EgressCore::progressed`].
    pub fn progressed(&self, generation: Generation, sequence: Sequence) -> bool {
        self.shared.inner.progressed(generation, sequence)
    }

    /// Reports a failed send of `sequence`, now (by the cell's clock), with a
    /// jitter sample from the cell's generator. See [`EgressCore::fail`].
    pub fn fail(&self, generation: Generation, sequence: Sequence, kind: FailureKind) -> FailOutcome {
        self.shared.inner.fail(By::Caller, generation, sequence, kind, None)
    }

    /// [`fail`](Self::fail) with a given jitter sample.
    pub fn fail_with(
        &self,
        generation: Generation,
        sequence: Sequence,
        kind: FailureKind,
        jitter: JitterSample,
    ) -> FailOutcome {
        self.shared.inner.fail(By::Caller, generation, sequence, kind, Some(jitter))
    }

    /// Makes the parked record `sequence` pending again now ("tap to
    /// retry"). See [`EgressCore::retry_now`].
    pub fn retry_now(&self, generation: Generation, sequence: Sequence) -> ScheduleOutcome {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.retry_now(generation, sequence);
            (t.outcome, t.changes)
        })
    }

    /// Gives the dead letter `sequence` a fresh budget and makes it pending.
    /// See [`EgressCore::requeue`].
    pub fn requeue(&self, generation: Generation, sequence: Sequence) -> ScheduleOutcome {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.requeue(generation, sequence);
            (t.outcome, t.changes)
        })
    }

    /// Fences the current connection: moves to `generation` and returns
    /// everything in flight or parked to pending. Every attachment of an
    /// older generation is disposed first: it never sends again and no
    /// change re-runs it. Attach the new connection's transport to replay.
    /// See [`EgressCore::reconnect`].
    pub fn reconnect(&self, generation: Generation) -> ReconnectOutcome {
        let inner = &self.shared.inner;
        inner.handle.enter(|cell| {
            let entered = Entered::by(cell);
            let mut keys = Keys::new(inner.wake);
            let outcome = inner.state.with_mut(&entered, |s| {
                let t = s.core.reconnect(generation);
                inner.keys(&entered, s, t.changes, false, &mut keys);
                t.outcome
            });
            if matches!(outcome, ReconnectOutcome::Advanced { .. }) {
                tracing::debug!(
                    generation = generation.get(),
                    "egress cell: a new generation; earlier attachments fenced"
                );
                self.shared.attachments.fence_below(&inner.handle, generation);
            }
            inner.notify(cell, keys.as_slice());
            outcome
        })
    }

    /// When the earliest parked record is due (`None` when nothing is
    /// parked): call [`handle_timeout`](Self::handle_timeout) then.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.shared.inner.poll_timeout()
    }

    /// How long from now (by the cell's clock) until
    /// [`poll_timeout`](Self::poll_timeout); zero when already due.
    ///
    /// The loop of a synchronous cell, with the transport's receive as the
    /// other input:
    ///
    /// ```no_run
    /// # use egress_core::{Generation, Policy, Sequence};
    /// # use egress_reactive::{Context, EgressCell};
    /// # use std::time::Duration;
    /// # let cx = Context::new();
    /// # let cell: EgressCell<String> = EgressCell::new(&cx, Policy::default());
    /// # let acks = std::sync::mpsc::channel::<(Generation, Sequence)>().1;
    /// loop {
    ///     let wait = cell.timeout_in().unwrap_or(Duration::from_secs(3600));
    ///     match acks.recv_timeout(wait) {
    ///         Ok((generation, through)) => { cell.ack(generation, through); }
    ///         Err(_) => { cell.handle_timeout(cell.now()); }
    ///     }
    /// }
    /// ```
    pub fn timeout_in(&self) -> Option<Duration> {
        let due = self.poll_timeout()?;
        Some(Duration::from_millis(due.0.saturating_sub(self.now().0)))
    }

    /// Makes every parked record due at `now` pending again, in sequence
    /// order, and returns their sequences. See [`EgressCore::handle_timeout`].
    pub fn handle_timeout(&self, now: Time) -> Vec<Sequence> {
        self.shared.inner.handle_timeout(now)
    }

    // ----- the journal -----------------------------------------------

    /// What the store must write next, with copies of the payloads to
    /// append, if anything (see [`EgressCore::poll_ready`]): one at a time,
    /// until reported by [`persisted`](Self::persisted) or
    /// [`persist_failed`](Self::persist_failed). For a store's relay only:
    /// a `Ready` taken and never reported stops the journal (nothing is
    /// written after it, and nothing more becomes claimable).
    ///
    /// # Panics
    /// A payload's `Clone` that panics: the epoch is failed first (so the
    /// journal does not wait for a report that never comes), then the panic
    /// goes on.
    pub fn poll_ready(&self) -> Option<(Ready, Vec<(Sequence, T)>)> {
        let (ready, panic) = self.shared.inner.apply(By::Caller, |s| {
            let Some(ready) = s.core.poll_ready() else { return ((None, None), Changes::NONE) };
            let copied = catch_unwind(AssertUnwindSafe(|| {
                s.core.unwritten(ready.appends.clone()).map(|(q, p)| (q, p.clone())).collect::<Vec<_>>()
            }));
            match copied {
                Ok(appends) => ((Some((ready, appends)), None), Changes::NONE),
                Err(panic) => {
                    let t = s.core.persist_failed(ready.epoch, "a payload's Clone panicked");
                    ((None, Some(panic)), t.changes)
                }
            }
        });
        if let Some(panic) = panic {
            resume_unwind(panic);
        }
        ready
    }

    /// The store wrote `epoch`. See [`EgressCore::persisted`]; wakes the
    /// attachments when records became claimable.
    pub fn persisted(&self, epoch: Epoch) -> PersistOutcome {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.persisted(epoch);
            (t.outcome, t.changes)
        })
    }

    /// The store could not write `epoch`. See [`EgressCore::persist_failed`].
    pub fn persist_failed(&self, epoch: Epoch, reason: impl Into<String>) -> PersistOutcome {
        let reason = reason.into();
        tracing::warn!(epoch = ?epoch, %reason, "egress cell: the store could not write");
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.persist_failed(epoch, reason);
            (t.outcome, t.changes)
        })
    }

    /// Takes a record the store appended itself under `sequence` (inside an
    /// application's transaction). See [`EgressCore::adopt`].
    pub fn adopt(&self, sequence: Sequence, payload: T) -> AdoptOutcome {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.adopt(sequence, payload);
            (t.outcome, t.changes)
        })
    }

    /// Takes records another writer appended to the store under the
    /// sequences of records the cell enqueued but has not written (never
    /// sent), which move behind them. See [`EgressCore::rebase`].
    pub fn rebase(&self, appended: Vec<(Sequence, T)>) -> egress_core::RebaseOutcome {
        self.shared.inner.apply(By::Caller, |s| {
            let t = s.core.rebase(appended);
            (t.outcome, t.changes)
        })
    }
}

#[cfg(test)]
mod tests {
    use egress_core::Policy;

    use super::EgressCellOf;
    use crate::Context;

    /// How many nodes a cell makes when it is built: its scope, the wake,
    /// the counts, the readers (a projection's trigger is made when a
    /// reader first tracks it). A new graph has room for them
    /// (`Graph::FIRST_NODES`).
    const CELL_NODES: usize = 19;

    #[test]
    fn a_new_graph_has_room_for_a_cell_and_a_cell_makes_its_nodes() {
        let cx = Context::new();
        let h = cx.handle();
        let arena = || {
            h.enter(|cell| {
                let g = cell.borrow();
                (g.nodes.len(), g.nodes.capacity())
            })
        };
        let (len, capacity) = arena();
        assert_eq!(len, 1, "the root");
        assert!(capacity >= len + CELL_NODES + 2, "room for a cell, its screen's effect and an attachment");
        let cell: EgressCellOf<u64, _> = EgressCellOf::new(&h, Policy::default());
        assert_eq!(cx.node_count() - len, CELL_NODES, "the count the graph's first room is made for");
        assert_eq!(arena().1, capacity, "no growth");
        drop(cell);
    }
}
