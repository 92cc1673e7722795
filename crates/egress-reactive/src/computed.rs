//! Computeds: lazy, memoized derived values.

use std::panic::{AssertUnwindSafe, Location, catch_unwind, resume_unwind};

use crate::context::{Handle, NodeRef};
use crate::error::{NodeKind, ReadError};
use crate::flavor::{Entered, Flavor, Holds, ValueCell};
use crate::graph::{NONE, NodeObj, flags::*};
use crate::run;

/// A derived value: lazy (its function runs only when it is read, or needed
/// by an effect), memoized (it runs again only after something it read
/// changed), with dynamic dependencies (what it reads is tracked afresh on
/// every run) and an equality cut-off (a recomputation equal to the previous
/// value re-runs nothing downstream).
///
/// A panic inside the function is not cached: the reader sees it, the graph
/// stays consistent, and the next read runs the function again. A computed
/// that reads itself, directly or through others, is a [`ReadError::Cycle`]
/// naming the computeds on the cycle.
///
/// ```
/// use egress_reactive::Context;
///
/// let cx = Context::new();
/// let items = cx.signal(vec![3, 1, 2]);
/// let max = cx.computed({
///     let items = items.clone();
///     move || items.with(|v| v.iter().copied().max())
/// });
/// assert_eq!(max.get(), Some(3));
/// items.update(|v| v.push(7));
/// assert_eq!(max.get(), Some(7));
/// assert_eq!(max.runs(), 2);
/// ```
pub struct Computed<T: 'static, F: Flavor> {
    node: NodeRef<F>,
    slot: F::Ptr<Slot<T, F>>,
    /// Where it was created: kept by the handle, which outlives the node's
    /// slot in the graph (the cached value's slot need not carry it).
    created_at: &'static Location<'static>,
}

impl<T: 'static, F: Flavor> std::ops::Deref for Computed<T, F> {
    type Target = NodeRef<F>;
    fn deref(&self) -> &NodeRef<F> {
        &self.node
    }
}

/// A computed's cached value.
#[doc(hidden)]
pub struct Slot<T: 'static, F: Flavor> {
    value: F::Cell<Option<T>>,
}

/// What the graph runs for a computed.
#[doc(hidden)]
pub struct ComputedObj<T: 'static, C, E, F: Flavor> {
    slot: F::Ptr<Slot<T, F>>,
    f: C,
    cutoff: E,
}

/// When a recomputed value counts as unchanged. The two common cases are
/// zero-sized, so they cost a computed no memory.
#[doc(hidden)]
pub trait Cutoff<T>: 'static {
    fn same(&self, old: &T, new: &T) -> bool;
}

/// Cut off by `PartialEq`.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct ByEq;

/// Never cut off.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct Never;

impl<T: PartialEq> Cutoff<T> for ByEq {
    #[inline]
    fn same(&self, old: &T, new: &T) -> bool {
        old == new
    }
}

impl<T> Cutoff<T> for Never {
    #[inline]
    fn same(&self, _: &T, _: &T) -> bool {
        false
    }
}

/// Cut off by a closure: `same(old, new)`.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct SameBy<E>(pub E);

impl<T, E: Fn(&T, &T) -> bool + 'static> Cutoff<T> for SameBy<E> {
    #[inline]
    fn same(&self, old: &T, new: &T) -> bool {
        (self.0)(old, new)
    }
}

/// What a computed runs: any `Fn() -> T`, or a crate type that names its
/// function (so that generic code, like the egress cells, can state the
/// flavour bounds of the computeds it makes).
#[doc(hidden)]
pub trait Compute<T>: 'static {
    fn compute(&self) -> T;
}

impl<T, C: Fn() -> T + 'static> Compute<T> for C {
    #[inline(always)]
    fn compute(&self) -> T {
        self()
    }
}

impl<T: 'static, C: Compute<T>, E: Cutoff<T>, F: Flavor> NodeObj for ComputedObj<T, C, E, F> {
    fn run(&self, entered: &Entered) -> bool {
        let new = self.f.compute();
        self.slot.value.with_mut(entered, |slot| match slot {
            Some(old) if self.cutoff.same(old, &new) => false,
            _ => {
                *slot = Some(new);
                true
            }
        })
    }
}

impl<T: 'static, F: Flavor> Clone for Computed<T, F> {
    fn clone(&self) -> Self {
        Computed { node: self.node.clone(), slot: self.slot.clone(), created_at: self.created_at }
    }
}

impl<T: 'static, F: Flavor> std::fmt::Debug for Computed<T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Computed").field("created_at", &self.created_at).finish_non_exhaustive()
    }
}

impl<F: Flavor> Handle<F> {
    /// A computed over `f`, cut off by `PartialEq`. Nothing runs until it is
    /// read.
    #[track_caller]
    pub fn computed<T: PartialEq + 'static, C: Fn() -> T + 'static>(&self, f: C) -> Computed<T, F>
    where
        F: Holds<ComputedObj<T, C, ByEq, F>>,
    {
        self.make_computed(ByEq, f, Location::caller())
    }

    /// A computed whose cut-off is `same(old, new)`: when it returns true,
    /// the recomputation changes nothing downstream (and the old value is
    /// kept). A panic in `same` fails the run as a panic in `f` does.
    ///
    /// ```
    /// use egress_reactive::Context;
    ///
    /// let cx = Context::new();
    /// let raw = cx.signal(1.0_f64);
    /// let tolerance = 0.5;
    /// let smooth = cx.computed_with(move |a: &f64, b: &f64| (a - b).abs() < tolerance, {
    ///     let raw = raw.clone();
    ///     move || raw.get()
    /// });
    /// assert_eq!(smooth.get(), 1.0);
    /// raw.set(1.2);
    /// assert_eq!(smooth.get(), 1.0, "within the tolerance: unchanged");
    /// raw.set(2.0);
    /// assert_eq!(smooth.get(), 2.0);
    /// ```
    #[track_caller]
    pub fn computed_with<T: 'static, E, C>(&self, same: E, f: C) -> Computed<T, F>
    where
        E: Fn(&T, &T) -> bool + 'static,
        C: Fn() -> T + 'static,
        F: Holds<ComputedObj<T, C, SameBy<E>, F>>,
    {
        self.make_computed(SameBy(same), f, Location::caller())
    }

    /// A computed with no cut-off: every recomputation notifies downstream
    /// (for values without a meaningful equality, or fresh objects each run).
    #[track_caller]
    pub fn computed_unguarded<T: 'static, C: Fn() -> T + 'static>(&self, f: C) -> Computed<T, F>
    where
        F: Holds<ComputedObj<T, C, Never, F>>,
    {
        self.make_computed(Never, f, Location::caller())
    }

    pub(crate) fn make_computed<T: 'static, C: Compute<T>, E: Cutoff<T>>(
        &self,
        cutoff: E,
        f: C,
        created_at: &'static Location<'static>,
    ) -> Computed<T, F>
    where
        F: Holds<ComputedObj<T, C, E, F>>,
    {
        let slot = F::ptr(Slot { value: ValueCell::new(None) });
        let obj = F::erase(F::ptr(ComputedObj { slot: slot.clone(), f, cutoff }));
        let key = self.enter(|cell| cell.borrow_mut().create(COMPUTED | DIRTY, Some(obj), NONE, created_at));
        // In a dropped context: born disposed, its function dropped here,
        // outside the graph's borrow.
        let key = key.unwrap_or_else(|(dead, obj)| {
            drop(obj);
            dead
        });
        Computed { node: NodeRef { handle: self.clone(), key }, slot, created_at }
    }
}

/// The panic of a tracked read that failed (a cycle is kept for
/// [`Computed::try_with`]'s caller up the stack, which reports it). Out of
/// line: the read's fast path is smaller without it.
#[cold]
#[inline(never)]
fn read_failed<F: Flavor>(cell: &run::Cell<F>, e: ReadError, at: &Location<'_>) -> ! {
    if let ReadError::Cycle(c) = &e {
        cell.borrow_mut().cycle = Some(c.clone());
    }
    panic!("{e} (read at {at})")
}

impl<F: Flavor> Handle<F> {
    /// A computed whose value its owner pushes with [`Computed::push`]
    /// instead of a function: a source node with a slot. It never runs;
    /// readers track it like any computed. (The egress cells' counts.)
    pub(crate) fn pushed<T: 'static>(&self, value: T, created_at: &'static Location<'static>) -> Computed<T, F> {
        let slot = F::ptr(Slot { value: ValueCell::new(Some(value)) });
        let key = self.trigger(created_at);
        Computed { node: NodeRef { handle: self.clone(), key }, slot, created_at }
    }
}

impl<T: PartialEq + 'static, F: Flavor> Computed<T, F> {
    /// Stores `value` in a [pushed](Handle::pushed) computed; returns whether
    /// it differed from the value held (the caller then notifies its key).
    #[inline]
    pub(crate) fn push(&self, entered: &Entered, value: T) -> bool {
        self.slot.value.with_mut(entered, |held| {
            if held.as_ref() == Some(&value) {
                false
            } else {
                *held = Some(value);
                true
            }
        })
    }
}

impl<T: 'static, F: Flavor> Computed<T, F> {
    /// The value, cloned; tracked. Recomputes first if needed.
    ///
    /// # Panics
    /// If the computed was disposed or its read closes a cycle (the message
    /// names where the nodes were created), or its function panics.
    #[track_caller]
    pub fn get(&self) -> T
    where
        T: Clone,
    {
        self.with(T::clone)
    }

    /// The value, cloned; tracked. Disposal and cycles are errors; a panic of
    /// the function still propagates.
    pub fn try_get(&self) -> Result<T, ReadError>
    where
        T: Clone,
    {
        self.try_with(T::clone)
    }

    /// Calls `f` with a reference to the value; tracked.
    ///
    /// # Panics
    /// As [`Computed::get`].
    #[track_caller]
    pub fn with<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        let at = Location::caller();
        self.handle.enter(|cell| {
            if self.fresh(cell, true) {
                return self.read(cell, f);
            }
            self.with_slow(cell, f, at)
        })
    }

    /// [`Computed::with`] when the value is not known to be up to date: out
    /// of line, so that the fast path saves no registers for it.
    #[inline(never)]
    fn with_slow<R>(&self, cell: &run::Cell<F>, f: impl FnOnce(&T) -> R, at: &Location<'_>) -> R {
        match self.stale(cell, true) {
            Ok(()) => self.read(cell, f),
            Err(e) => read_failed(cell, e, at),
        }
    }

    /// Whether the computed is alive and up to date with nothing batched to
    /// settle first; then the read is tracked here (with `track`). The
    /// fast path of every read.
    #[inline(always)]
    fn fresh(&self, cell: &run::Cell<F>, track: bool) -> bool {
        let mut g = cell.borrow_mut();
        if !g.alive(self.key)
            || g.node(self.key.index).flags & (DIRTY | PENDING | RUNNING | FAILED | ORPHAN) != 0
            || !g.writes.is_empty()
        {
            return false;
        }
        let active = g.active;
        if track && active != NONE {
            g.link(self.key.index, active);
        }
        true
    }

    /// Calls `f` with a reference to the value; tracked. Disposal and cycles
    /// (here or in any computed this read re-runs) are errors.
    pub fn try_with<R>(&self, f: impl FnOnce(&T) -> R) -> Result<R, ReadError> {
        self.handle
            .try_enter(|cell| {
                match catch_unwind(AssertUnwindSafe(|| self.prepare(cell, true))) {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(e),
                    Err(panic) => match cell.borrow_mut().cycle.take() {
                        Some(cycle) => return Err(ReadError::Cycle(cycle)),
                        None => resume_unwind(panic),
                    },
                }
                Ok(self.read(cell, f))
            })
            .unwrap_or(Err(ReadError::ForeignGraph { kind: NodeKind::Computed }))
    }

    /// The value, cloned, without tracking. Recomputes first if needed.
    #[track_caller]
    pub fn get_untracked(&self) -> T
    where
        T: Clone,
    {
        let at = Location::caller();
        self.handle.enter(|cell| match self.prepare(cell, false) {
            Ok(()) => self.read(cell, T::clone),
            Err(e) => panic!("{e} (read at {at})"),
        })
    }

    /// Reads for an explicit observer (an async effect's run).
    #[cfg(feature = "async")]
    pub(crate) fn read_observed(&self, observer: crate::graph::Key) -> Result<T, ReadError>
    where
        T: Clone,
    {
        self.handle
            .try_enter(|cell| {
                self.prepare(cell, false)?;
                let mut g = cell.borrow_mut();
                // A disposed observer tracks nothing (its slot may be
                // another node's now).
                if g.alive(observer) {
                    g.link(self.key.index, observer.index);
                }
                drop(g);
                Ok(self.read(cell, T::clone))
            })
            .unwrap_or(Err(ReadError::ForeignGraph { kind: NodeKind::Computed }))
    }

    /// Brings the value up to date and tracks the read.
    #[inline(always)]
    fn prepare(&self, cell: &run::Cell<F>, track: bool) -> Result<(), ReadError> {
        if self.fresh(cell, track) {
            return Ok(());
        }
        self.prepare_slow(cell, track)
    }

    /// [`Computed::prepare`] when the computed is not [fresh](Self::fresh).
    #[inline(never)]
    fn prepare_slow(&self, cell: &run::Cell<F>, track: bool) -> Result<(), ReadError> {
        self.stale(cell, track)
    }

    /// The body of [`Computed::prepare_slow`], inlined into
    /// [`Computed::with_slow`] (a tracked read's slow path, one call): a
    /// disposed computed is an error; a live one is refreshed, then the
    /// read tracked.
    #[inline(always)]
    fn stale(&self, cell: &run::Cell<F>, track: bool) -> Result<(), ReadError> {
        if !cell.borrow().alive(self.key) {
            return Err(ReadError::Disposed { kind: NodeKind::Computed, created_at: self.created_at });
        }
        {
            // A refresh that panics still makes the reader depend on this
            // computed: its recovery must reach the reader.
            struct LinkOnUnwind<'a, F: Flavor>(&'a run::Cell<F>, crate::graph::Key, bool);
            impl<F: Flavor> Drop for LinkOnUnwind<'_, F> {
                #[inline(always)]
                fn drop(&mut self) {
                    if self.2 {
                        self.unwound();
                    }
                }
            }
            impl<F: Flavor> LinkOnUnwind<'_, F> {
                #[cold]
                #[inline(never)]
                fn unwound(&mut self) {
                    let mut g = self.0.borrow_mut();
                    let active = g.active;
                    if active != NONE && g.alive(self.1) {
                        g.link(self.1.index, active);
                    }
                }
            }
            let mut link = LinkOnUnwind(cell, self.key, track);
            let refreshed = run::refresh(cell, self.key.index);
            // Returned (not unwound): linked below, as usual.
            link.2 = false;
            refreshed?;
        }
        let top_level = {
            let mut g = cell.borrow_mut();
            // Its own run may have disposed it.
            if !g.alive(self.key) {
                return Err(ReadError::Disposed { kind: NodeKind::Computed, created_at: self.created_at });
            }
            let active = g.active;
            if track && active != NONE {
                g.link(self.key.index, active);
            }
            !g.batching()
        };
        if top_level && let Err(e) = run::settle_and_flush(cell) {
            panic!("{e}");
        }
        Ok(())
    }

    fn read<R>(&self, cell: &run::Cell<F>, f: impl FnOnce(&T) -> R) -> R {
        let v = |v: &Option<T>| f(v.as_ref().expect("graph invariant: a refreshed computed holds a value"));
        self.slot.value.with(&Entered::by(cell), v)
    }

    /// Where the computed was created.
    pub fn created_at(&self) -> &'static Location<'static> {
        self.created_at
    }

    /// Whether any handle but this one (and the graph's own reference,
    /// while the node lives) holds the computed.
    pub(crate) fn is_shared(&self) -> bool {
        F::strong_count(&self.slot) > 2
    }

    /// Whether a live computation (a computed or an effect) depends on it.
    pub(crate) fn has_subscribers(&self) -> bool {
        let key = self.node.key;
        self.node.handle.introspect(key, |g| g.node(key.index).subs_head != crate::graph::NONE).unwrap_or(false)
    }
}
