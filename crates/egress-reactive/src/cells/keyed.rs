//! Readers made on demand, per key: a lane's (of a lanes cell), a key's
//! (of a latest cell). The same readers for the same key while they are in
//! use; those no longer in use are disposed at a sweep, when the map has
//! doubled since the last one, as a cell's status readers are.

use std::collections::BTreeMap;

use crate::context::{Handle, NodeRef, Scope};
use crate::flavor::Flavor;
use crate::graph::Key;

/// The readers of one key, as a [`ReaderCache`] keeps them.
pub(crate) trait KeyedReaders<F: Flavor>: Clone {
    /// Calls `f` with each reader's node, and whether that reader is in
    /// use: held by a handle, or read by a live computation.
    fn each(&self, f: &mut dyn FnMut(bool, &NodeRef<F>));
    /// The key's triggers.
    fn triggers(&self) -> &[Key];

    /// Whether they were disposed (with the cell).
    fn is_disposed(&self) -> bool {
        let mut disposed = false;
        self.each(&mut |_, node| disposed |= node.is_disposed());
        disposed
    }

    /// Whether one of them is held by a handle, or read by a live
    /// computation.
    fn in_use(&self) -> bool {
        let mut used = false;
        self.each(&mut |in_use, _| used |= in_use);
        used
    }

    /// Disposes every reader, and the key's triggers.
    fn dispose(&self, handle: &Handle<F>) {
        self.each(&mut |_, node| node.dispose());
        for key in self.triggers() {
            handle.dispose_node(*key);
        }
    }
}

/// The per-key readers a cell made, by key.
pub(crate) struct ReaderCache<K, R> {
    by_key: BTreeMap<K, R>,
    sweep_at: usize,
}

/// The fewest keys with readers at which the cache sweeps.
const SWEEP_MIN: usize = 16;

impl<K: Ord + Clone, R> ReaderCache<K, R> {
    pub(crate) const fn new() -> Self {
        ReaderCache { by_key: BTreeMap::new(), sweep_at: SWEEP_MIN }
    }

    /// Takes out the readers no longer in use, if a sweep is due.
    fn sweep<F: Flavor>(&mut self) -> Vec<(K, R)>
    where
        R: KeyedReaders<F>,
    {
        if self.by_key.len() < self.sweep_at {
            return Vec::new();
        }
        let unused: Vec<K> = self.by_key.iter().filter(|(_, r)| !r.in_use()).map(|(k, _)| k.clone()).collect();
        let out = unused.into_iter().filter_map(|k| self.by_key.remove_entry(&k)).collect();
        self.sweep_at = (self.by_key.len() * 2).max(SWEEP_MIN);
        out
    }
}

/// The readers of `key`: those `cache` holds (unless one of them was
/// disposed), or new ones from `make`.
/// New ones are given to `register` with the keys whose readers a sweep
/// took out (to record the new triggers and forget the old, in the cell's
/// state), then the swept readers are disposed.
///
/// Runs in the cell's `scope`, which holds the graph for the whole call:
/// the cache is only ever locked inside the graph. On a disposed cell each
/// call makes readers under the current owner, not kept by the cell.
pub(crate) fn readers_for<K, R, F>(
    scope: &Scope<F>,
    cache: &parking_lot::Mutex<ReaderCache<K, R>>,
    handle: &Handle<F>,
    key: &K,
    make: impl Fn() -> R,
    register: impl FnOnce(&[(K, R)], &R),
) -> R
where
    K: Ord + Clone,
    R: KeyedReaders<F>,
    F: Flavor,
{
    let found = scope.try_run(|| {
        let mut cache = cache.lock();
        if let Some(held) = cache.by_key.get(key)
            && !held.is_disposed()
        {
            return (held.clone(), Vec::new());
        }
        let mut unused = cache.sweep();
        // Readers of which one was disposed (by hand) are replaced whole:
        // the rest are disposed too, rather than left alive and never
        // invalidated again (the key's triggers are the new readers').
        if let Some(partly) = cache.by_key.remove(key) {
            unused.push((key.clone(), partly));
        }
        let made = make();
        register(&unused, &made);
        cache.by_key.insert(key.clone(), made.clone());
        (made, unused)
    });
    let Ok((readers, unused)) = found else { return make() };
    for (_, gone) in unused {
        gone.dispose(handle);
    }
    readers
}
