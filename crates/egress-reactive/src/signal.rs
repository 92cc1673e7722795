//! Signals: writable sources.

use std::panic::Location;

use crate::context::{Handle, NodeRef};
use crate::error::{NodeKind, ReadError, WriteError};
use crate::flavor::{Entered, Flavor, Holds, ValueCell};
use crate::graph::{NONE, NodeObj, flags::*};
use crate::run;

/// A writable source of the graph.
///
/// Reads inside a computation (a computed or an effect) are tracked: the
/// computation re-runs when the value changes. Reads elsewhere, or through
/// `get_untracked`, are plain reads.
///
/// ```
/// use egress_reactive::Context;
///
/// let cx = Context::new();
/// let name = cx.signal(String::from("ada"));
/// name.update(|n| n.make_ascii_uppercase());
/// assert_eq!(name.get(), "ADA");
/// name.with(|n| assert_eq!(n.len(), 3));
/// ```
pub struct Signal<T: 'static, F: Flavor> {
    node: NodeRef<F>,
    inner: F::Ptr<SignalInner<T, F>>,
}

impl<T: 'static, F: Flavor> std::ops::Deref for Signal<T, F> {
    type Target = NodeRef<F>;
    fn deref(&self) -> &NodeRef<F> {
        &self.node
    }
}

/// The value of a signal, and what a batch replaced.
#[doc(hidden)]
pub struct SignalInner<T: 'static, F: Flavor> {
    state: F::Cell<SignalState<T>>,
    created_at: &'static Location<'static>,
}

/// An equality test.
type Eq<T> = fn(&T, &T) -> bool;

struct SignalState<T> {
    value: T,
    /// The value the current batch replaced, and how to compare with it.
    replaced: Option<(T, Eq<T>)>,
    /// A write in the current batch that cannot be compared (in place, or
    /// unchecked): the batch notifies whatever the final value.
    forced: bool,
}

impl<T: 'static, F: Flavor> NodeObj for SignalInner<T, F> {
    fn run(&self, _: &Entered) -> bool {
        false
    }

    fn settle(&self, entered: &Entered) -> bool {
        self.state.with_mut(entered, |s| {
            let forced = std::mem::take(&mut s.forced);
            match s.replaced.take() {
                Some((old, eq)) => forced || !eq(&old, &s.value),
                None => true,
            }
        })
    }
}

impl<T: 'static, F: Flavor> Clone for Signal<T, F> {
    fn clone(&self) -> Self {
        Signal { node: self.node.clone(), inner: self.inner.clone() }
    }
}

impl<T: 'static, F: Flavor> std::fmt::Debug for Signal<T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signal").field("created_at", &self.inner.created_at).finish_non_exhaustive()
    }
}

impl<F: Flavor> Handle<F> {
    /// A new signal holding `value`, owned by the current owner.
    #[track_caller]
    pub fn signal<T: 'static>(&self, value: T) -> Signal<T, F>
    where
        F: Holds<SignalInner<T, F>>,
    {
        let created_at = Location::caller();
        let state = SignalState { value, replaced: None, forced: false };
        let inner = F::ptr(SignalInner { state: ValueCell::new(state), created_at });
        let obj = F::erase(inner.clone());
        let key = self.enter(|cell| cell.borrow_mut().alloc(SIGNAL, Some(obj), created_at));
        Signal { node: NodeRef { handle: self.clone(), key }, inner }
    }
}

impl<T: 'static, F: Flavor> Signal<T, F> {
    /// The value, cloned; tracked.
    ///
    /// # Panics
    /// If the signal was disposed (the message names where it was created).
    #[track_caller]
    pub fn get(&self) -> T
    where
        T: Clone,
    {
        self.with(T::clone)
    }

    /// The value, cloned; tracked. Fails if the signal was disposed.
    pub fn try_get(&self) -> Result<T, ReadError>
    where
        T: Clone,
    {
        self.try_with(T::clone)
    }

    /// Calls `f` with a reference to the value; tracked.
    ///
    /// # Panics
    /// If the signal was disposed.
    #[track_caller]
    pub fn with<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        match self.try_with(f) {
            Ok(r) => r,
            Err(e) => panic!("{e} (read at {})", Location::caller()),
        }
    }

    /// Calls `f` with a reference to the value; tracked. Fails if the signal
    /// was disposed.
    pub fn try_with<R>(&self, f: impl FnOnce(&T) -> R) -> Result<R, ReadError> {
        self.handle.enter(|cell| {
            {
                let mut g = cell.borrow_mut();
                if !g.alive(self.key) {
                    return Err(self.disposed());
                }
                let active = g.active;
                if active != NONE {
                    g.link(self.key.index, active);
                }
            }
            Ok(self.inner.state.with(&Entered::by(cell), |s| f(&s.value)))
        })
    }

    /// Reads for an explicit observer (an async effect's run).
    #[cfg(feature = "async")]
    pub(crate) fn read_observed(&self, observer: u32) -> Result<T, ReadError>
    where
        T: Clone,
    {
        self.handle.enter(|cell| {
            {
                let mut g = cell.borrow_mut();
                if !g.alive(self.key) {
                    return Err(self.disposed());
                }
                g.link(self.key.index, observer);
            }
            Ok(self.inner.state.with(&Entered::by(cell), |s| s.value.clone()))
        })
    }

    /// The value, cloned, without tracking (a peek).
    #[track_caller]
    pub fn get_untracked(&self) -> T
    where
        T: Clone,
    {
        self.with_untracked(T::clone)
    }

    /// Calls `f` with a reference to the value, without tracking.
    #[track_caller]
    pub fn with_untracked<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        let at = Location::caller();
        self.handle.enter(|cell| {
            if !cell.borrow().alive(self.key) {
                panic!("{} (read at {at})", self.disposed());
            }
            self.inner.state.with(&Entered::by(cell), |s| f(&s.value))
        })
    }

    /// Sets the value. A value equal to the current one notifies nothing
    /// (equality cut-off). Outside a batch, effects run before this returns.
    ///
    /// # Panics
    /// If the signal was disposed, or the effects this write triggers do not
    /// settle; [`Signal::try_set`] returns those as errors.
    #[track_caller]
    pub fn set(&self, value: T)
    where
        T: PartialEq,
    {
        if let Err(e) = self.try_set(value) {
            panic!("{e} (write at {})", Location::caller());
        }
    }

    /// [`Signal::set`], returning failures as errors. A disposed signal is
    /// left unchanged; on [`WriteError::Loop`] the value was written.
    pub fn try_set(&self, value: T) -> Result<(), WriteError>
    where
        T: PartialEq,
    {
        self.write(move |s, batching| {
            if s.value == value {
                return false;
            }
            let old = std::mem::replace(&mut s.value, value);
            if batching && s.replaced.is_none() && !s.forced {
                s.replaced = Some((old, T::eq));
            }
            true
        })
    }

    /// Sets the value and notifies, without comparing.
    #[track_caller]
    pub fn set_unchecked(&self, value: T) {
        self.update(move |v| *v = value);
    }

    /// Updates the value in place and notifies (no comparison).
    ///
    /// # Panics
    /// As [`Signal::set`].
    #[track_caller]
    pub fn update(&self, f: impl FnOnce(&mut T)) {
        if let Err(e) = self.try_update(f) {
            panic!("{e} (write at {})", Location::caller());
        }
    }

    /// [`Signal::update`], returning failures as errors.
    pub fn try_update(&self, f: impl FnOnce(&mut T)) -> Result<(), WriteError> {
        self.write(move |s, batching| {
            f(&mut s.value);
            if batching {
                s.forced = true;
            }
            true
        })
    }

    fn write(&self, f: impl FnOnce(&mut SignalState<T>, bool) -> bool) -> Result<(), WriteError> {
        self.handle.enter(|cell| {
            let batching = {
                let g = cell.borrow();
                if !g.alive(self.key) {
                    return Err(WriteError::Disposed { created_at: self.inner.created_at });
                }
                g.batch_depth > 0
            };
            if !self.inner.state.with_mut(&Entered::by(cell), |s| f(s, batching)) {
                return Ok(());
            }
            {
                let mut g = cell.borrow_mut();
                if batching {
                    let node = g.node_mut(self.key.index);
                    if node.flags & BATCHED == 0 {
                        node.flags |= BATCHED;
                        g.writes.push(self.key);
                    }
                    return Ok(());
                }
                g.propagate(self.key.index);
            }
            run::flush(cell).map_err(WriteError::from)
        })
    }

    /// Where the signal was created.
    pub fn created_at(&self) -> &'static Location<'static> {
        self.inner.created_at
    }

    fn disposed(&self) -> ReadError {
        ReadError::Disposed { kind: NodeKind::Signal, created_at: self.inner.created_at }
    }
}
