//! Effects: side effects that re-run after every settled change of what
//! they read.

use std::panic::{AssertUnwindSafe, Location, catch_unwind, resume_unwind};

use crate::context::{Handle, NodeRef};
use crate::flavor::{Entered, Flavor, Holds, ValueCell};
use crate::graph::{NONE, NodeObj, flags::*};
use crate::run;

/// A side effect.
///
/// It runs once when created, then once after every settled change of what
/// it read (at the end of the write, or of the outermost batch). Before it
/// runs again, and when it is disposed, the nodes it created are disposed
/// (later ones first, inner before outer) and the cleanups it registered
/// with [`Handle::on_cleanup`] run. Writes inside an effect are allowed;
/// effects they reach run in the next round of the same flush, up to
/// [`MAX_FLUSH_ROUNDS`](crate::MAX_FLUSH_ROUNDS).
///
/// An effect lives until it is disposed: explicitly, with its owner, or with
/// its context. Dropping the handle does not dispose it.
///
/// ```
/// use egress_reactive::Context;
/// use std::{cell::RefCell, rc::Rc};
///
/// let cx = Context::new();
/// let n = cx.signal(1);
/// let log = Rc::new(RefCell::new(Vec::new()));
/// let effect = cx.effect({
///     let (n, log, h) = (n.clone(), log.clone(), cx.handle());
///     move || {
///         let value = n.get();
///         log.borrow_mut().push(format!("run {value}"));
///         let log = log.clone();
///         h.on_cleanup(move || log.borrow_mut().push(format!("cleanup {value}")));
///     }
/// });
/// n.set(2);
/// effect.dispose();
/// assert_eq!(*log.borrow(), ["run 1", "cleanup 1", "run 2", "cleanup 2"]);
/// ```
pub struct Effect<F: Flavor> {
    node: NodeRef<F>,
    created_at: &'static Location<'static>,
}

impl<F: Flavor> std::ops::Deref for Effect<F> {
    type Target = NodeRef<F>;
    fn deref(&self) -> &NodeRef<F> {
        &self.node
    }
}

/// What the graph runs for an effect.
#[doc(hidden)]
pub struct EffectObj<C: 'static, F: Flavor> {
    f: F::Cell<C>,
}

/// What an effect runs: any `FnMut()`, or a crate type that names its
/// function (an egress cell's attachment). `entered` is the proof that the
/// run is inside its graph: a crate type reaches the values of that graph's
/// cells through it without entering the graph again.
#[doc(hidden)]
pub trait RunEffect: 'static {
    fn run_effect(&mut self, entered: &Entered);
}

impl<C: FnMut() + 'static> RunEffect for C {
    #[inline(always)]
    fn run_effect(&mut self, _: &Entered) {
        self()
    }
}

impl<C: RunEffect, F: Flavor> NodeObj for EffectObj<C, F> {
    fn run(&self, entered: &Entered) -> bool {
        self.f.with_mut(entered, |f| f.run_effect(entered));
        true
    }
}

impl<F: Flavor> Clone for Effect<F> {
    fn clone(&self) -> Self {
        Effect { node: self.node.clone(), created_at: self.created_at }
    }
}

impl<F: Flavor> std::fmt::Debug for Effect<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Effect").field("created_at", &self.created_at).finish_non_exhaustive()
    }
}

impl<F: Flavor> Handle<F> {
    /// Creates an effect owned by the current owner and runs it once now.
    ///
    /// In a context that was dropped, the effect is born disposed: it never
    /// runs, and `f` is dropped at once.
    ///
    /// # Panics
    /// If its first run panics (the effect is disposed first: nobody holds
    /// a handle to it yet), if an effect its first run triggers panics (it
    /// stays), or if the writes it makes do not settle.
    #[track_caller]
    pub fn effect<C: FnMut() + 'static>(&self, f: C) -> Effect<F>
    where
        F: Holds<EffectObj<C, F>>,
    {
        self.make_effect(f, Location::caller())
    }

    pub(crate) fn make_effect<C: RunEffect>(&self, f: C, created_at: &'static Location<'static>) -> Effect<F>
    where
        F: Holds<EffectObj<C, F>>,
    {
        let obj = F::erase(F::ptr(EffectObj { f: ValueCell::new(f) }));
        let created = self.enter(|cell| cell.borrow_mut().create(EFFECT | DIRTY, Some(obj), NONE, created_at));
        let key = match created {
            Ok(key) => key,
            Err((dead, obj)) => {
                // A dropped context: born disposed, never run, its closure
                // dropped here.
                drop(obj);
                return Effect { node: NodeRef { handle: self.clone(), key: dead }, created_at };
            }
        };
        self.enter(|cell| {
            // A first run that panics leaves nobody a handle to dispose the
            // effect with: it is disposed, then the panic goes on.
            let first = catch_unwind(AssertUnwindSafe(|| run::update(cell, key)));
            if let Err(panic) = first {
                let alive = cell.borrow().alive(key);
                if alive {
                    drop(run::dispose_caught(cell, key.index, true));
                }
                resume_unwind(panic);
            }
            if let Err(e) = run::settle_and_flush(cell) {
                panic!("{e}");
            }
        });
        Effect { node: NodeRef { handle: self.clone(), key }, created_at }
    }
}

impl<F: Flavor> Effect<F> {
    /// Where the effect was created.
    pub fn created_at(&self) -> &'static Location<'static> {
        self.created_at
    }
}
