//! A lanes cell's per-lane readers: lazy computeds over one projection of
//! one lane's core, made on demand and kept while in use.

use std::panic::Location;

use egress_core::{EgressCore, Envelope, LaneKey, Projection, Retry, Sequence};

use super::super::inner::TRIGGERS;
use super::super::keyed::{KeyedReaders, ReaderCache, readers_for};
use super::super::readers::{ParkedRecord, Snapshot, list, parked_records};
use super::{LanesCellOf, LanesFlavor, LanesInner};
use crate::computed::{ByEq, Compute, Computed, ComputedObj, Cutoff, Never};
use crate::context::Handle;
use crate::flavor::{Entered, Flavor, Holds, ValueCell};
use crate::graph::Key;

/// What a per-lane reader computes: one projection of one lane's core
/// (`None` while the lane does not exist), after tracking the lane's
/// trigger of that projection.
#[doc(hidden)]
pub struct LaneProject<K: 'static, T: 'static, P, F: Flavor> {
    inner: LanesInner<K, T, F>,
    lane: K,
    trigger: Key,
    project: fn(Option<&EgressCore<T>>) -> P,
}

impl<K: LaneKey + 'static, T: 'static, P: 'static, F: Flavor> Compute<P> for LaneProject<K, T, P, F> {
    fn compute(&self) -> P {
        let inner = &self.inner;
        inner.handle.enter(|cell| {
            Handle::track(cell, self.trigger);
            inner.state.with(&Entered::by(cell), |s| (self.project)(s.lanes.lane(&self.lane)))
        })
    }
}

/// A per-lane reader's node: lists never cut off (a new snapshot is a
/// change), values by equality.
#[doc(hidden)]
pub(super) type LaneReader<K, T, P, F> = ComputedObj<P, LaneProject<K, T, P, F>, <P as LaneCutoff>::By, F>;

/// How a per-lane reader's value cuts off.
#[doc(hidden)]
pub trait LaneCutoff: Sized + 'static {
    type By: Cutoff<Self> + Copy + 'static;
    const BY: Self::By;
}

impl<E: 'static> LaneCutoff for Snapshot<E> {
    type By = Never;
    const BY: Never = Never;
}

impl LaneCutoff for Option<Sequence> {
    type By = ByEq;
    const BY: ByEq = ByEq;
}

impl LaneCutoff for Option<Retry> {
    type By = ByEq;
    const BY: ByEq = ByEq;
}

impl LaneCutoff for usize {
    type By = ByEq;
    const BY: ByEq = ByEq;
}

/// The readers of one lane (see [`LanesCellOf::lane`]): each a lazy
/// computed over the lane's core, recomputed only after a transition on
/// that lane changed its projection. A lane that does not exist reads as
/// empty: no records, no watermarks, no retry.
pub struct LaneReaders<K: 'static, T: 'static, F: Flavor> {
    pending: Computed<Snapshot<Envelope<T>>, F>,
    inflight: Computed<Snapshot<Envelope<T>>, F>,
    parked: Computed<Snapshot<ParkedRecord<T>>, F>,
    exhausted: Computed<Snapshot<Envelope<T>>, F>,
    acked_through: Computed<Option<Sequence>, F>,
    received_through: Computed<Option<Sequence>, F>,
    retry: Computed<Option<Retry>, F>,
    pending_len: Computed<usize, F>,
    inflight_len: Computed<usize, F>,
    parked_len: Computed<usize, F>,
    exhausted_len: Computed<usize, F>,
    gated_len: Computed<usize, F>,
    /// The lane's triggers, one per projection.
    triggers: [Key; TRIGGERS],
    _lane: std::marker::PhantomData<fn() -> K>,
}

impl<K: 'static, T: 'static, F: Flavor> Clone for LaneReaders<K, T, F> {
    fn clone(&self) -> Self {
        LaneReaders {
            pending: self.pending.clone(),
            inflight: self.inflight.clone(),
            parked: self.parked.clone(),
            exhausted: self.exhausted.clone(),
            acked_through: self.acked_through.clone(),
            received_through: self.received_through.clone(),
            retry: self.retry.clone(),
            pending_len: self.pending_len.clone(),
            inflight_len: self.inflight_len.clone(),
            parked_len: self.parked_len.clone(),
            exhausted_len: self.exhausted_len.clone(),
            gated_len: self.gated_len.clone(),
            triggers: self.triggers,
            _lane: std::marker::PhantomData,
        }
    }
}

impl<K: 'static, T: 'static, F: Flavor> std::fmt::Debug for LaneReaders<K, T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneReaders").finish_non_exhaustive()
    }
}

impl<K: 'static, T: 'static, F: Flavor> LaneReaders<K, T, F> {
    /// The lane's records waiting to be claimed, in sequence order.
    pub fn pending(&self) -> &Computed<Snapshot<Envelope<T>>, F> {
        &self.pending
    }

    /// The lane's records in flight, in claim order.
    pub fn inflight(&self) -> &Computed<Snapshot<Envelope<T>>, F> {
        &self.inflight
    }

    /// The lane's failed records waiting for their backoff.
    pub fn parked(&self) -> &Computed<Snapshot<ParkedRecord<T>>, F> {
        &self.parked
    }

    /// The lane's dead letters held.
    pub fn exhausted(&self) -> &Computed<Snapshot<Envelope<T>>, F> {
        &self.exhausted
    }

    /// The lane's acknowledgement watermark.
    pub fn acked_through(&self) -> &Computed<Option<Sequence>, F> {
        &self.acked_through
    }

    /// The lane's receipt watermark.
    pub fn received_through(&self) -> &Computed<Option<Sequence>, F> {
        &self.received_through
    }

    /// The lane's most recent failure, while its record is parked or held.
    pub fn retry(&self) -> &Computed<Option<Retry>, F> {
        &self.retry
    }

    /// How many of the lane's records are pending.
    pub fn pending_len(&self) -> &Computed<usize, F> {
        &self.pending_len
    }

    /// How many of the lane's records are in flight.
    pub fn inflight_len(&self) -> &Computed<usize, F> {
        &self.inflight_len
    }

    /// How many of the lane's records are parked.
    pub fn parked_len(&self) -> &Computed<usize, F> {
        &self.parked_len
    }

    /// How many of the lane's dead letters are held.
    pub fn exhausted_len(&self) -> &Computed<usize, F> {
        &self.exhausted_len
    }

    /// How many of the lane's records wait for a flush epoch.
    pub fn gated_len(&self) -> &Computed<usize, F> {
        &self.gated_len
    }
}

impl<K: 'static, T: 'static, F: Flavor> KeyedReaders<F> for LaneReaders<K, T, F> {
    fn each(&self, f: &mut dyn FnMut(bool, &crate::context::NodeRef<F>)) {
        macro_rules! each {
            ($($r:ident),*) => { $(f(self.$r.is_shared() || self.$r.has_subscribers(), &self.$r);)* };
        }
        each!(
            pending,
            inflight,
            parked,
            exhausted,
            acked_through,
            received_through,
            retry,
            pending_len,
            inflight_len,
            parked_len,
            exhausted_len,
            gated_len
        );
    }

    fn triggers(&self) -> &[Key] {
        &self.triggers
    }
}

/// The per-lane readers a lanes cell made, by lane.
pub(super) type LaneReaderCache<K, T, F> = ReaderCache<K, LaneReaders<K, T, F>>;

fn reader<K, T, P, F>(
    inner: &LanesInner<K, T, F>,
    lane: &K,
    triggers: &[Key; TRIGGERS],
    projection: Projection,
    project: fn(Option<&EgressCore<T>>) -> P,
    at: &'static Location<'static>,
) -> Computed<P, F>
where
    K: LaneKey + 'static,
    T: 'static,
    P: LaneCutoff,
    F: Holds<LaneReader<K, T, P, F>>,
{
    let f = LaneProject { inner: inner.clone(), lane: lane.clone(), trigger: triggers[projection as usize], project };
    inner.handle.make_computed(P::BY, f, at)
}

impl<K: LaneKey + 'static, T: Clone + 'static, F: LanesFlavor<K, T>> LanesCellOf<K, T, F> {
    /// The readers of `lane`: made at the first call (for a lane that
    /// exists or not), the same ones at the next calls while they are in
    /// use (a handle holds one, or a live computed or effect reads one).
    /// A transition on the lane invalidates exactly the readers of what it
    /// changed; a transition on another lane none of them.
    ///
    /// On a disposed cell each call makes readers under the current owner,
    /// not kept by the cell, whose values never change.
    #[track_caller]
    pub fn lane(&self, lane: &K) -> LaneReaders<K, T, F> {
        let at = Location::caller();
        let inner = &self.shared.inner;
        let make = || {
            let triggers = std::array::from_fn(|_| inner.handle.trigger(at));
            macro_rules! r {
                ($p:expr, $project:expr) => {
                    reader(inner, lane, &triggers, $p, $project, at)
                };
            }
            LaneReaders {
                pending: r!(Projection::Pending, |c| c.map_or_else(|| Snapshot::from([]), |c| list(c.pending()))),
                inflight: r!(Projection::Inflight, |c| c.map_or_else(|| Snapshot::from([]), |c| list(c.inflight()))),
                parked: r!(Projection::Parked, |c| c.map_or_else(|| Snapshot::from([]), parked_records)),
                exhausted: r!(Projection::Exhausted, |c| {
                    c.map_or_else(|| Snapshot::from([]), |c| list(c.exhausted()))
                }),
                acked_through: r!(Projection::AckedThrough, |c| c.and_then(EgressCore::acked_through)),
                received_through: r!(Projection::Received, |c| c.and_then(EgressCore::received_through)),
                retry: r!(Projection::Retry, |c| c.and_then(EgressCore::retry)),
                pending_len: r!(Projection::Pending, |c| c.map_or(0, EgressCore::pending_len)),
                inflight_len: r!(Projection::Inflight, |c| c.map_or(0, EgressCore::inflight_len)),
                parked_len: r!(Projection::Parked, |c| c.map_or(0, EgressCore::parked_len)),
                exhausted_len: r!(Projection::Exhausted, |c| c.map_or(0, EgressCore::exhausted_len)),
                gated_len: r!(Projection::Durable, |c| c.map_or(0, EgressCore::gated_len)),
                triggers,
                _lane: std::marker::PhantomData,
            }
        };
        readers_for(&self.shared.scope, &self.shared.readers, &inner.handle, lane, make, |unused, made| {
            inner.handle.enter(|cell| {
                inner.state.with_mut(&Entered::by(cell), |s| {
                    for (gone, _) in unused {
                        s.triggers.remove(gone);
                    }
                    s.triggers.insert(lane.clone(), made.triggers);
                });
            });
        })
    }
}
