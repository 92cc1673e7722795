//! A transport attached to a cell: one effect per connection, claiming
//! and sending while the core allows, under the generation it captured.

use std::panic::Location;
use std::sync::Arc;

use egress_core::{AckOutcome, EgressCore, FailOutcome, FailureKind, Generation, ReceivedOutcome, Sequence};

use super::cell::{CellFlavor, EgressCellOf};
use super::inner::AttachRun;
use super::transport::Transport;
use crate::context::NodeRef;
use crate::effect::EffectObj;
use crate::flavor::{Flavor, Holds};

impl<T: Clone + 'static, F: CellFlavor<T>> EgressCellOf<T, F> {
    /// Attaches `transport` under the current generation: creates the one
    /// effect of this connection, which runs now and again whenever a
    /// transition by anyone but itself makes a claim possible. Each run
    /// claims while the core allows (window room, ordering) and sends each
    /// claimed envelope; see [`Attachment`] for failures and fencing.
    #[track_caller]
    pub fn attach<Tr: Transport<T>>(&self, transport: Tr) -> Attachment<T, F>
    where
        F: Holds<EffectObj<AttachRun<T, Tr, F>, F>>,
    {
        let at = Location::caller();
        let inner = self.shared.inner.clone();
        let generation = self.with_core(EgressCore::generation);
        inner.note_sync_attachment();
        let run = AttachRun { inner, transport, generation };
        let handle = &self.shared.inner.handle;
        let node = self.attach_with(generation, || handle.make_effect(run, at));
        Attachment { node, generation, cell: self.clone(), _keep: None }
    }

    /// Makes an attachment's effect with `make` under `generation` (see
    /// [`Attached::attach`](super::fences::Attached::attach)).
    pub(crate) fn attach_with<E: std::ops::Deref<Target = NodeRef<F>>>(
        &self,
        generation: Generation,
        make: impl FnOnce() -> E,
    ) -> NodeRef<F> {
        let shared = &self.shared;
        let current = || self.with_core(EgressCore::generation);
        shared.attachments.attach(&shared.scope, &shared.inner.handle, generation, make, current)
    }

    #[cfg(feature = "async")]
    pub(crate) fn inner(&self) -> &super::inner::Inner<T, F> {
        &self.shared.inner
    }

    #[cfg(feature = "async")]
    pub(crate) fn scope(&self) -> &crate::context::Scope<F> {
        &self.shared.scope
    }
}

/// One connection's transport, wired to a cell as one effect.
///
/// The effect captured the cell's generation when it was attached. Each
/// run claims while the core allows and sends each claimed envelope; its
/// own claims and failures do not wake it again (one run per sending pass),
/// while a caller's enqueue, ack, timeout, retry or requeue that makes a
/// claim possible does.
///
/// A send error becomes [`fail`](EgressCellOf::fail) with the error's kind
/// and the cell's clock as `now`. After a transient or retry-after failure
/// the pass stops (the connection is suspect; the record's backoff, an ack
/// or an enqueue starts the next pass); after a permanent one (the payload
/// was refused) it goes on with the next record.
///
/// [`reconnect`](EgressCellOf::reconnect) to a newer generation fences the
/// attachment: its effect is disposed, it never sends again and costs
/// nothing. Attach the new connection's transport; its first run replays
/// the records that were in flight or parked, under the new generation.
///
/// Dropping the attachment (or calling [`detach`](Self::detach)) disposes
/// its effect and drops the transport. What it had sent stays in flight
/// until acknowledged, failed, or replayed after a reconnect.
#[must_use = "dropping an Attachment detaches its transport"]
pub struct Attachment<T: 'static, F: Flavor> {
    pub(crate) node: NodeRef<F>,
    pub(crate) generation: Generation,
    pub(crate) cell: EgressCellOf<T, F>,
    /// What must live while the attachment does (an async cell's timer).
    pub(crate) _keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl<T: Clone + 'static, F: CellFlavor<T>> Attachment<T, F> {
    /// The generation this attachment sends under.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// An acknowledgement received on this connection.
    pub fn ack(&self, through: Sequence) -> AckOutcome {
        self.cell.ack(self.generation, through)
    }

    /// A receipt received on this connection (see
    /// [`EgressCellOf::received`]).
    pub fn received(&self, through: Sequence) -> ReceivedOutcome {
        self.cell.received(self.generation, through)
    }

    /// A completion above the watermark, received on this connection (see
    /// [`EgressCellOf::progressed`]): a transport that acknowledges through
    /// a [`Completions`](egress_core::Completions) tracker reports each
    /// completion the tracker holds back.
    pub fn progressed(&self, sequence: Sequence) -> bool {
        self.cell.progressed(self.generation, sequence)
    }

    /// A failure reported on this connection (for transports that learn of
    /// failures after `send` returned).
    pub fn fail(&self, sequence: Sequence, kind: FailureKind) -> FailOutcome {
        self.cell.fail(self.generation, sequence, kind)
    }

    /// Whether a reconnect has fenced this attachment (or it was detached).
    pub fn is_fenced(&self) -> bool {
        self.node.is_disposed() || self.cell.with_core(|c| c.generation() != self.generation)
    }

    /// How many times the attachment's effect has run (0 once fenced or
    /// detached).
    pub fn runs(&self) -> u32 {
        self.node.runs()
    }

    /// The cell it is attached to.
    pub fn cell(&self) -> &EgressCellOf<T, F> {
        &self.cell
    }

    /// Disposes the effect and drops the transport (as dropping does).
    pub fn detach(self) {}
}

impl<T: 'static, F: Flavor> Drop for Attachment<T, F> {
    fn drop(&mut self) {
        self.node.dispose();
    }
}

impl<T: 'static, F: Flavor> std::fmt::Debug for Attachment<T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attachment").field("generation", &self.generation).finish_non_exhaustive()
    }
}
