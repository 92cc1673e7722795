//! A transport attached to a lanes cell: one effect per connection,
//! claiming and sending while the lanes allow, under the generation it
//! captured.

use std::panic::{AssertUnwindSafe, Location, catch_unwind, resume_unwind};

use egress_core::{
    AckOutcome, CompleteOutcome, Envelope, FailOutcome, FailureKind, Generation, LaneKey, LanesClaim, Ordinal,
    ReceivedOutcome, Sequence, Time,
};

use super::super::clock::Clock;
use super::super::inner::By;
use super::super::inner::next_jitter;
use super::super::transport::SendError;
use super::{LanesCellOf, LanesFlavor, LanesInner, LanesState, Touched};
use crate::context::NodeRef;
use crate::effect::{EffectObj, RunEffect};
use crate::flavor::{Entered, Flavor, Holds};
use crate::graph::Key;
use crate::run;

/// A record claimed from a lane, owned: what a [`LanesTransport`] sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneItem<K, T> {
    /// The lane it belongs to.
    pub lane: K,
    /// Its place in the enqueue order across lanes: with the producer and
    /// the cell's incarnation, a key no other record of the cell shares
    /// (an idempotency key; a retry resends the same one).
    pub ordinal: Ordinal,
    /// The record (its sequence is the lane's).
    pub envelope: Envelope<T>,
}

/// A synchronous transport for a lanes cell's attachments: as
/// [`Transport`](crate::Transport), with each record's lane and ordinal.
/// `Ok` means the transport took the record; its delivery is reported
/// later with [`LanesAttachment::complete`] (in any order) or
/// [`LanesAttachment::ack`] (cumulative, per lane).
pub trait LanesTransport<K, T>: 'static {
    /// Sends one record.
    ///
    /// # Errors
    /// A [`SendError`] whose kind decides what the lane's core does with
    /// the record.
    fn send(&mut self, item: LaneItem<K, T>) -> Result<(), SendError>;
}

/// The run of a lanes attachment: claim, send, repeat.
#[doc(hidden)]
pub struct LanesRun<K: 'static, T: 'static, Tr, F: Flavor> {
    inner: LanesInner<K, T, F>,
    transport: Tr,
    generation: Generation,
}

/// The keys of an attachment run's claims, marked once when the run ends
/// (or unwinds).
struct Marks<'a, K: LaneKey + 'static, T: 'static, F: Flavor> {
    inner: &'a LanesInner<K, T, F>,
    keys: Vec<Key>,
}

impl<K: LaneKey + 'static, T: 'static, F: Flavor> Drop for Marks<'_, K, T, F> {
    fn drop(&mut self) {
        self.inner.mark(&self.keys);
    }
}

/// A claim's copy of its record, and the panic of a copy that panicked.
/// What [`claim_in`] came to: a copy of the lane key to report on and
/// the item, or nothing to claim; and a panic to resume.
type Claimed<K, T> = (Option<(K, LaneItem<K, T>)>, Option<run::Panic>);

/// Claims in the lanes and copies the record out, with a copy of its lane
/// key to report on. The lane key is copied before the claim (a `Clone`
/// that panics there changes nothing: the panic is returned, and the run
/// stops). A copy that panics after the claim (the key's or the
/// payload's) fails the record as transient, so that it is not left in
/// flight unsent; the panic is returned, to be resumed once the readers
/// know of both transitions.
fn claim_in<K: LaneKey, T: Clone>(
    s: &mut LanesState<K, T>,
    generation: Generation,
    clock: &dyn Clock,
) -> (Claimed<K, T>, Touched<K>) {
    if generation != s.lanes.generation() {
        return ((None, None), Touched::NOTHING);
    }
    let lane = match catch_unwind(AssertUnwindSafe(|| s.lanes.next_claim().cloned())) {
        Ok(Some(lane)) => lane,
        Ok(None) => return ((None, None), Touched::NOTHING),
        Err(panic) => return ((None, Some(panic)), Touched::NOTHING),
    };
    let t = s.lanes.claim(generation);
    let changes = t.changes;
    let LanesClaim::Claimed(e) = t.outcome else { return ((None, None), Touched::NOTHING) };
    let (ordinal, sequence) = (e.ordinal, e.envelope.sequence);
    match catch_unwind(AssertUnwindSafe(|| (lane.clone(), lane.clone(), e.envelope.cloned()))) {
        Ok((report, touched, envelope)) => {
            let item = LaneItem { lane, ordinal, envelope };
            ((Some((report, item)), None), Touched::lane(touched, changes))
        }
        Err(panic) => {
            // A clock that panics too makes the record due at once.
            let now = catch_unwind(AssertUnwindSafe(|| clock.now())).unwrap_or(Time(0));
            let jitter = next_jitter(&mut s.rng);
            let failed = s.lanes.fail(generation, &lane, sequence, FailureKind::Transient, now, jitter);
            ((None, Some(panic)), Touched::lane(lane, changes.union(failed.changes)))
        }
    }
}

impl<K: LaneKey + 'static, T: Clone + 'static, Tr: LanesTransport<K, T>, F: Flavor> RunEffect
    for LanesRun<K, T, Tr, F>
{
    fn run_effect(&mut self, entered: &Entered) {
        let inner = &self.inner;
        inner.track_wake();
        let mut marks = Marks { inner, keys: Vec::new() };
        loop {
            let clock = &*inner.clock;
            let (item, panic) = inner.apply_quiet(entered, &mut marks.keys, |s| claim_in(s, self.generation, clock));
            if let Some(panic) = panic {
                resume_unwind(panic);
            }
            let Some((lane, item)) = item else { break };
            let sequence = item.envelope.sequence;
            let transport = &mut self.transport;
            match catch_unwind(AssertUnwindSafe(|| transport.send(item))) {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    // A failure that parks the record stops the pass (the
                    // connection is suspect); a dead letter does not.
                    let failed = inner.fail(By::Attachment, self.generation, &lane, sequence, error.kind(), None);
                    if matches!(failed, FailOutcome::Retrying(_)) {
                        break;
                    }
                }
                Err(panic) => {
                    // It may never have left: failed, so that it is not left
                    // in flight with nobody to send it.
                    inner.fail(By::Attachment, self.generation, &lane, sequence, FailureKind::Transient, None);
                    resume_unwind(panic)
                }
            }
        }
    }
}

impl<K: LaneKey + 'static, T: Clone + 'static, F: LanesFlavor<K, T>> LanesCellOf<K, T, F> {
    /// Attaches `transport` under the current generation: creates the one
    /// effect of this connection, which runs now and again whenever a
    /// transition by anyone but itself makes a claim possible. Each run
    /// claims while the lanes allow (each lane's window and ordering, the
    /// cap across lanes) and sends each record; see [`LanesAttachment`].
    #[track_caller]
    pub fn attach<Tr: LanesTransport<K, T>>(&self, transport: Tr) -> LanesAttachment<K, T, F>
    where
        F: Holds<EffectObj<LanesRun<K, T, Tr, F>, F>>,
    {
        let at = Location::caller();
        let inner = self.shared.inner.clone();
        let generation = inner.with_lanes(egress_core::Lanes::generation);
        let handle = inner.handle.clone();
        let run = LanesRun { inner, transport, generation };
        let node = self.shared.attachments.attach(
            &self.shared.scope,
            &handle,
            generation,
            || handle.make_effect(run, at),
            || self.with_lanes(egress_core::Lanes::generation),
        );
        LanesAttachment { node, generation, cell: self.clone(), _keep: None }
    }
}

/// One connection's transport, wired to a lanes cell as one effect (see
/// [`Attachment`](crate::Attachment), whose rules it follows): its own
/// claims and failures do not wake it; a caller's transition that makes a
/// claim possible does. A send error fails the record with the error's
/// kind; a failure that parks it stops the pass, a dead letter does not.
/// A reconnect fences it; dropping it detaches the transport.
#[must_use = "dropping a LanesAttachment detaches its transport"]
pub struct LanesAttachment<K: 'static, T: 'static, F: Flavor> {
    node: NodeRef<F>,
    generation: Generation,
    cell: LanesCellOf<K, T, F>,
    /// What must live while the attachment does (an async cell's timer).
    pub(super) _keep: Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
}

impl<K: LaneKey + 'static, T: Clone + 'static, F: LanesFlavor<K, T>> LanesAttachment<K, T, F> {
    /// The generation this attachment sends under.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// A cumulative acknowledgement of `lane`, received on this connection.
    pub fn ack(&self, lane: &K, through: Sequence) -> AckOutcome {
        self.cell.ack(self.generation, lane, through)
    }

    /// A completion of `sequence` of `lane`, in any order, received on this
    /// connection.
    pub fn complete(&self, lane: &K, sequence: Sequence) -> CompleteOutcome {
        self.cell.complete(self.generation, lane, sequence)
    }

    /// A receipt of `lane`, received on this connection.
    pub fn received(&self, lane: &K, through: Sequence) -> ReceivedOutcome {
        self.cell.received(self.generation, lane, through)
    }

    /// A failure of `sequence` of `lane` reported on this connection (for
    /// transports that learn of failures after `send` returned).
    pub fn fail(&self, lane: &K, sequence: Sequence, kind: FailureKind) -> FailOutcome {
        self.cell.fail(self.generation, lane, sequence, kind)
    }

    /// Whether a reconnect has fenced this attachment (or it was detached).
    pub fn is_fenced(&self) -> bool {
        self.node.is_disposed() || self.cell.with_lanes(|l| l.generation() != self.generation)
    }

    /// How many times the attachment's effect has run (0 once fenced or
    /// detached).
    pub fn runs(&self) -> u32 {
        self.node.runs()
    }

    /// The cell it is attached to.
    pub fn cell(&self) -> &LanesCellOf<K, T, F> {
        &self.cell
    }

    /// Disposes the effect and drops the transport (as dropping does).
    pub fn detach(self) {}
}

impl<K: 'static, T: 'static, F: Flavor> Drop for LanesAttachment<K, T, F> {
    fn drop(&mut self) {
        self.node.dispose();
    }
}

impl<K: 'static, T: 'static, F: Flavor> std::fmt::Debug for LanesAttachment<K, T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LanesAttachment").field("generation", &self.generation).finish_non_exhaustive()
    }
}
