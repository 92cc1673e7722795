//! The attachments of a cell, by the generation each captured: what a
//! reconnect fences. One list for the cell, the lanes cell and the latest
//! cell.

use egress_core::Generation;

use crate::context::{Handle, NodeRef, Scope};
use crate::flavor::{Entered, Flavor, ValueCell};
use crate::graph::Key;

/// The live attachments (effects) of one cell, each with the generation it
/// sends under. Touched only with the graph entered.
pub(crate) struct Attached<F: Flavor>(F::Cell<Vec<(Generation, Key)>>);

impl<F: Flavor> Attached<F> {
    pub(crate) fn new() -> Self {
        Attached(ValueCell::new(Vec::new()))
    }

    /// Records the effect `key`, attached under `generation` (unless it is
    /// disposed already), and forgets the attachments disposed since: the
    /// list holds only live effects.
    fn register(&self, handle: &Handle<F>, generation: Generation, key: Key) {
        handle.enter(|cell| {
            self.0.with_mut(&Entered::by(cell), |list| {
                let g = cell.borrow();
                list.retain(|(_, k)| g.alive(*k));
                if g.alive(key) {
                    list.push((generation, key));
                }
            });
        });
    }

    /// Makes an attachment's effect with `make`, in the cell's `scope`, and
    /// records it under `generation`: the effect's node, or a node disposed
    /// from the start when the cell is (`make` not run: what it would have
    /// owned, a transport or a sink, is dropped unused).
    ///
    /// `current` reads the cell's generation once the effect is recorded: a
    /// reconnect on another thread since `generation` was read may have
    /// fenced the list before the effect was in it, so an effect of an
    /// older generation than the cell's is disposed here.
    pub(crate) fn attach<E: std::ops::Deref<Target = NodeRef<F>>>(
        &self,
        scope: &Scope<F>,
        handle: &Handle<F>,
        generation: Generation,
        make: impl FnOnce() -> E,
        current: impl FnOnce() -> Generation,
    ) -> NodeRef<F> {
        let Ok(effect) = scope.try_run(make) else {
            let key = handle.enter(|cell| cell.borrow().dead_key());
            return NodeRef { handle: handle.clone(), key };
        };
        self.register(handle, generation, effect.key);
        if current() > generation {
            handle.dispose_node(effect.key);
        }
        (*effect).clone()
    }

    /// Disposes every attachment of a generation below `generation`: they
    /// never send again. Call after the state moved to `generation`, outside
    /// the graph.
    pub(crate) fn fence_below(&self, handle: &Handle<F>, generation: Generation) {
        let fenced: Vec<Key> = handle.enter(|cell| {
            self.0.with_mut(&Entered::by(cell), |list| {
                let (old, kept) = list.drain(..).partition(|(g, _)| *g < generation);
                *list = kept;
                old.into_iter().map(|(_, key)| key).collect()
            })
        });
        for key in fenced {
            handle.dispose_node(key);
        }
    }
}
