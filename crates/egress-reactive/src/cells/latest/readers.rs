//! A latest cell's per-key readers: lazy computeds over one projection of
//! one key, made on demand and kept while in use.

use std::panic::Location;

use egress_core::{KeyProjection, Latest, Time, Version};

use super::super::keyed::{KeyedReaders, ReaderCache, readers_for};
use super::{KEY_TRIGGERS, LatestCellOf, LatestFlavor, LatestInner};
use crate::computed::{ByEq, Compute, Computed, ComputedObj};
use crate::context::Handle;
use crate::flavor::{Entered, Flavor, Holds, ValueCell};
use crate::graph::Key;

/// What a per-key reader computes: one projection of one key (`None`
/// while the key does not exist), after tracking the key's trigger of that
/// projection.
#[doc(hidden)]
pub struct KeyProject<K: 'static, V: 'static, P, F: Flavor> {
    inner: LatestInner<K, V, F>,
    key: K,
    trigger: Key,
    project: fn(&Latest<K, V>, &K) -> P,
}

impl<K: Ord + Clone + 'static, V: PartialEq + 'static, P: 'static, F: Flavor> Compute<P> for KeyProject<K, V, P, F> {
    fn compute(&self) -> P {
        let inner = &self.inner;
        inner.handle.enter(|cell| {
            Handle::track(cell, self.trigger);
            inner.state.with(&Entered::by(cell), |s| (self.project)(&s.latest, &self.key))
        })
    }
}

/// A per-key reader's node: values cut off by equality.
#[doc(hidden)]
pub(super) type KeyReader<K, V, P, F> = ComputedObj<P, KeyProject<K, V, P, F>, ByEq, F>;

/// The readers of one key (see [`LatestCellOf::key`]): each a lazy
/// computed, recomputed only after a transition changed what it shows. A
/// key that does not exist reads as `None` throughout.
pub struct KeyReaders<K: 'static, V: 'static, F: Flavor> {
    desired: Computed<Option<(Version, V)>, F>,
    inflight: Computed<Option<(Version, V)>, F>,
    durable_through: Computed<Option<Version>, F>,
    backoff: Computed<Option<Time>, F>,
    /// The key's triggers, one per [`KeyProjection`].
    triggers: [Key; KEY_TRIGGERS],
    _key: std::marker::PhantomData<fn() -> K>,
}

impl<K: 'static, V: 'static, F: Flavor> Clone for KeyReaders<K, V, F> {
    fn clone(&self) -> Self {
        KeyReaders {
            desired: self.desired.clone(),
            inflight: self.inflight.clone(),
            durable_through: self.durable_through.clone(),
            backoff: self.backoff.clone(),
            triggers: self.triggers,
            _key: std::marker::PhantomData,
        }
    }
}

impl<K: 'static, V: 'static, F: Flavor> std::fmt::Debug for KeyReaders<K, V, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyReaders").finish_non_exhaustive()
    }
}

impl<K: 'static, V: 'static, F: Flavor> KeyReaders<K, V, F> {
    /// The key's desire not yet claimed: its version and value.
    pub fn desired(&self) -> &Computed<Option<(Version, V)>, F> {
        &self.desired
    }

    /// The key's value in flight to the sink: its version and value.
    pub fn inflight(&self) -> &Computed<Option<(Version, V)>, F> {
        &self.inflight
    }

    /// The highest version of the key the sink applied.
    pub fn durable_through(&self) -> &Computed<Option<Version>, F> {
        &self.durable_through
    }

    /// Until when the key waits after a failure.
    pub fn backoff(&self) -> &Computed<Option<Time>, F> {
        &self.backoff
    }
}

impl<K: 'static, V: 'static, F: Flavor> KeyedReaders<F> for KeyReaders<K, V, F> {
    fn each(&self, f: &mut dyn FnMut(bool, &crate::context::NodeRef<F>)) {
        macro_rules! each {
            ($($r:ident),*) => { $(f(self.$r.is_shared() || self.$r.has_subscribers(), &self.$r);)* };
        }
        each!(desired, inflight, durable_through, backoff);
    }

    fn triggers(&self) -> &[Key] {
        &self.triggers
    }
}

/// The per-key readers a latest cell made, by key.
pub(super) type KeyReaderCache<K, V, F> = ReaderCache<K, KeyReaders<K, V, F>>;

fn reader<K, V, P, F>(
    inner: &LatestInner<K, V, F>,
    key: &K,
    triggers: &[Key; KEY_TRIGGERS],
    projection: KeyProjection,
    project: fn(&Latest<K, V>, &K) -> P,
    at: &'static Location<'static>,
) -> Computed<P, F>
where
    K: Ord + Clone + 'static,
    V: PartialEq + 'static,
    P: PartialEq + 'static,
    F: Holds<KeyReader<K, V, P, F>>,
{
    let f = KeyProject { inner: inner.clone(), key: key.clone(), trigger: triggers[projection as usize], project };
    inner.handle.make_computed(ByEq, f, at)
}

impl<K: Ord + Clone + 'static, V: Clone + PartialEq + 'static, F: LatestFlavor<K, V>> LatestCellOf<K, V, F> {
    /// The readers of `key`: made at the first call (for a key that exists
    /// or not), the same ones at the next calls while they are in use (a
    /// handle holds one, or a live computed or effect reads one). A
    /// transition on the key invalidates exactly the readers of what it
    /// changed; a transition on another key none of them.
    ///
    /// On a disposed cell each call makes readers under the current owner,
    /// not kept by the cell, whose values never change.
    #[track_caller]
    pub fn key(&self, key: &K) -> KeyReaders<K, V, F> {
        let at = Location::caller();
        let inner = &self.shared.inner;
        let make = || {
            let triggers = std::array::from_fn(|_| inner.handle.trigger(at));
            KeyReaders {
                desired: reader(
                    inner,
                    key,
                    &triggers,
                    KeyProjection::Desired,
                    |l, k| l.desired(k).map(|(v, x)| (v, x.clone())),
                    at,
                ),
                inflight: reader(
                    inner,
                    key,
                    &triggers,
                    KeyProjection::Inflight,
                    |l, k| l.inflight(k).map(|(_, v, x)| (v, x.clone())),
                    at,
                ),
                durable_through: reader(
                    inner,
                    key,
                    &triggers,
                    KeyProjection::DurableThrough,
                    Latest::durable_through,
                    at,
                ),
                backoff: reader(inner, key, &triggers, KeyProjection::Backoff, Latest::backoff, at),
                triggers,
                _key: std::marker::PhantomData,
            }
        };
        readers_for(&self.shared.scope, &self.shared.readers, &inner.handle, key, make, |unused, made| {
            inner.handle.enter(|cell| {
                inner.state.with_mut(&Entered::by(cell), |s| {
                    for (gone, _) in unused {
                        s.triggers.remove(gone);
                    }
                    s.triggers.insert(key.clone(), made.triggers);
                });
            });
        })
    }
}
