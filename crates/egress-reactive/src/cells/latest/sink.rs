//! A sink attached to a latest cell: one effect per sink connection,
//! claiming every claimable key (one flight per key) and writing it, under
//! the generation it captured.

use std::panic::{AssertUnwindSafe, Location, catch_unwind, resume_unwind};

use egress_core::{Applied, Delay, Failed, FailureKind, Generation, Latest, LatestClaim, Time, Version};

use super::super::clock::Clock;
use super::super::inner::{By, next_jitter};
use super::super::transport::SendError;
use super::{LatestCellOf, LatestFlavor, LatestInner, LatestState, Touched, ack_in, fail_in};
use crate::context::NodeRef;
use crate::effect::{EffectObj, RunEffect};
use crate::flavor::{Entered, Flavor, Holds};
use crate::graph::Key;
use crate::run;

/// A key's value claimed for the sink, owned: what a [`LatestSink`]
/// writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatestItem<K, V> {
    /// The key.
    pub key: K,
    /// The value's version: with the key, what the sink reports back (and
    /// what makes a write idempotent: a sink that already holds this
    /// version or a newer one may skip it).
    pub version: Version,
    /// The generation it was claimed under.
    pub generation: Generation,
    /// The value.
    pub value: V,
}

/// What a [`LatestSink`] did with a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// The sink applied it (durably, for a durable sink): the key's
    /// frontier moves to its version at once.
    Applied,
    /// The sink took it and will apply it later: report the outcome with
    /// [`LatestAttachment::applied`] or [`LatestAttachment::fail`]. The
    /// key stays in flight (one flight per key) until then, or until a
    /// reconnect takes the flight back.
    Taken,
}

/// A sink for a latest cell's sink effects: where the newest value of
/// each key goes (a settings store, a presence endpoint, a row per key).
pub trait LatestSink<K, V>: 'static {
    /// Writes one key's value. It must not call into the cell: report a
    /// later outcome through the attachment.
    ///
    /// # Errors
    /// A [`SendError`]: the value goes back as the key's desire (unless a
    /// newer one replaced it) and the key waits for the policy's backoff,
    /// at least the error's [retry-after](FailureKind::RetryAfter). A
    /// latest value has no dead letter: a [permanent](FailureKind::Permanent)
    /// error waits the backoff too (and the next try writes the newest
    /// value, which may be one the sink takes).
    fn write(&mut self, item: LatestItem<K, V>) -> Result<Written, SendError>;
}

/// The "retry after" a failure kind carries, if any.
fn hint(kind: FailureKind) -> Option<Delay> {
    match kind {
        FailureKind::RetryAfter(delay) => Some(delay),
        _ => None,
    }
}

/// The run of a sink effect: claim, write, repeat.
#[doc(hidden)]
pub struct LatestRun<K: 'static, V: 'static, S, F: Flavor> {
    inner: LatestInner<K, V, F>,
    sink: S,
    generation: Generation,
}

/// The keys of a sink run's transitions, marked once when the run ends
/// (or unwinds).
struct Marks<'a, K: Ord + Clone + 'static, V: PartialEq + 'static, F: Flavor> {
    inner: &'a LatestInner<K, V, F>,
    keys: Vec<Key>,
}

impl<K: Ord + Clone + 'static, V: PartialEq + 'static, F: Flavor> Drop for Marks<'_, K, V, F> {
    fn drop(&mut self) {
        self.inner.mark(&self.keys);
    }
}

/// What one claim of a sink run came to.
enum Step<K, V> {
    /// Nothing claimable.
    Done,
    /// A key claimed: a copy of the key to report on, and the item.
    Claimed(K, LatestItem<K, V>),
    /// A copy of the claimed value (or key) panicked: the key was failed
    /// and backs off; the run goes on, then the panic does.
    Failed(run::Panic),
    /// A copy of the next key panicked before the claim: nothing changed,
    /// and the run stops (the same key is next again) with the panic.
    Stuck(run::Panic),
}

/// Claims the first claimable key and copies it and its value out. A copy
/// that panics after the claim fails the flight, so that it is not left in
/// flight unwritten; the panic is returned, to be resumed once the readers
/// know of both transitions.
fn claim_in<K: Ord + Clone, V: Clone + PartialEq>(
    s: &mut LatestState<K, V>,
    generation: Generation,
    clock: &dyn Clock,
) -> (Step<K, V>, Touched<K>) {
    if generation != s.latest.generation() {
        return (Step::Done, Touched::NOTHING);
    }
    // The key, copied before the claim: a `Clone` that panics here changes
    // nothing.
    let key = match catch_unwind(AssertUnwindSafe(|| s.latest.claimable().next().cloned())) {
        Ok(Some(key)) => key,
        Ok(None) => return (Step::Done, Touched::NOTHING),
        Err(panic) => return (Step::Stuck(panic), Touched::NOTHING),
    };
    let t = s.latest.claim(generation, &key);
    let changes = t.changes;
    let LatestClaim::Claimed(e) = t.outcome else { return (Step::Done, Touched::NOTHING) };
    let version = e.version;
    match catch_unwind(AssertUnwindSafe(|| (key.clone(), key.clone(), e.value.clone()))) {
        Ok((report, touched, value)) => {
            let item = LatestItem { key, version, generation, value };
            (Step::Claimed(report, item), Touched::key(touched, changes))
        }
        Err(panic) => {
            // A clock that panics too makes the key due at once.
            let now = catch_unwind(AssertUnwindSafe(|| clock.now())).unwrap_or(Time(0));
            let failed = s.latest.fail_retryable(generation, &key, version, now, None, next_jitter(&mut s.rng));
            (Step::Failed(panic), Touched::key(key, changes.union(failed.changes)))
        }
    }
}

impl<K, V, S, F> RunEffect for LatestRun<K, V, S, F>
where
    K: Ord + Clone + 'static,
    V: Clone + PartialEq + 'static,
    S: LatestSink<K, V>,
    F: Flavor,
{
    fn run_effect(&mut self, entered: &Entered) {
        self.inner.track_wake();
        let inner = self.inner.clone();
        let mut marks = Marks { inner: &inner, keys: Vec::new() };
        // The first panic of the run (a sink's, a copy's), resumed once
        // every other key claimable now was written.
        let mut panicked = None;
        // Each pass claims every key claimable now, each once: a write
        // consumes the key's desire, and a failure backs the key off, so
        // the pass ends. Keys are independent: one key's failure (or
        // panic) does not hold the others back.
        loop {
            let clock = &*inner.clock;
            let (key, item) = match inner.apply_quiet(entered, &mut marks.keys, |s| claim_in(s, self.generation, clock))
            {
                Step::Done => break,
                Step::Claimed(key, item) => (key, item),
                Step::Failed(panic) => {
                    panicked.get_or_insert(panic);
                    continue;
                }
                Step::Stuck(panic) => {
                    panicked.get_or_insert(panic);
                    break;
                }
            };
            let version = item.version;
            let sink = &mut self.sink;
            match catch_unwind(AssertUnwindSafe(|| sink.write(item))) {
                Ok(Ok(Written::Applied)) => {
                    inner.apply_quiet(entered, &mut marks.keys, |s| ack_in(s, self.generation, &key, version));
                }
                Ok(Ok(Written::Taken)) => {}
                Ok(Err(error)) => {
                    tracing::debug!(%error, "egress latest: a write failed; the key backs off");
                    let (now, hint) = (clock.now(), hint(error.kind()));
                    inner.apply_quiet(entered, &mut marks.keys, |s| {
                        fail_in(s, self.generation, &key, version, now, hint, None)
                    });
                }
                Err(panic) => {
                    // It may never have been written: failed, so that it is
                    // not left in flight with nobody to write it.
                    let now = clock.now();
                    inner.apply_quiet(entered, &mut marks.keys, |s| {
                        fail_in(s, self.generation, &key, version, now, None, None)
                    });
                    panicked.get_or_insert(panic);
                }
            }
        }
        if let Some(panic) = panicked {
            resume_unwind(panic);
        }
    }
}

impl<K: Ord + Clone + 'static, V: Clone + PartialEq + 'static, F: LatestFlavor<K, V>> LatestCellOf<K, V, F> {
    /// Attaches `sink` under the current generation: creates the one
    /// effect of this sink connection, which runs now and again whenever a
    /// transition by anyone but itself makes a key claimable (an upsert, a
    /// backoff that ended, an acknowledgement that freed a key with a
    /// newer desire). Each run claims every claimable key and writes it;
    /// see [`LatestAttachment`].
    #[track_caller]
    pub fn attach<S: LatestSink<K, V>>(&self, sink: S) -> LatestAttachment<K, V, F>
    where
        F: Holds<EffectObj<LatestRun<K, V, S, F>, F>>,
    {
        let at = Location::caller();
        let inner = self.shared.inner.clone();
        let generation = inner.with_latest(Latest::generation);
        let handle = inner.handle.clone();
        let run = LatestRun { inner, sink, generation };
        let node = self.shared.attachments.attach(
            &self.shared.scope,
            &handle,
            generation,
            || handle.make_effect(run, at),
            || self.with_latest(Latest::generation),
        );
        LatestAttachment { node, generation, cell: self.clone(), _keep: None }
    }
}

/// One sink connection, wired to a latest cell as one effect: its own
/// claims, acknowledgements and failures do not wake it; a caller's
/// transition that makes a key claimable does. A failed write backs the
/// key off (the [`Policy`](egress_core::Policy)'s retry schedule, at least
/// the error's retry-after), so a failing sink is written to once per
/// backoff, never in a spin. A reconnect fences it; dropping it detaches
/// the sink.
#[must_use = "dropping a LatestAttachment detaches its sink"]
pub struct LatestAttachment<K: 'static, V: 'static, F: Flavor> {
    node: NodeRef<F>,
    generation: Generation,
    cell: LatestCellOf<K, V, F>,
    /// What must live while the attachment does (an async cell's timer).
    pub(super) _keep: Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
}

impl<K: Ord + Clone + 'static, V: Clone + PartialEq + 'static, F: LatestFlavor<K, V>> LatestAttachment<K, V, F> {
    /// The generation this sink writes under.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The sink applied `key` at `version` (a value it [took](Written::Taken)).
    pub fn applied(&self, key: &K, version: Version) -> Applied {
        self.cell.shared.inner.ack_applied(By::Caller, self.generation, key, version)
    }

    /// Writing `key` at `version` failed (a value the sink
    /// [took](Written::Taken)): back to desired, backed off, at least
    /// `hint`.
    pub fn fail(&self, key: &K, version: Version, hint: Option<Delay>) -> Failed {
        self.cell.shared.inner.fail_retryable(By::Caller, self.generation, key, version, hint, None)
    }

    /// Whether a reconnect has fenced this attachment (or it was detached).
    pub fn is_fenced(&self) -> bool {
        self.node.is_disposed() || self.cell.with_latest(|l| l.generation() != self.generation)
    }

    /// How many times the sink effect has run (0 once fenced or detached).
    pub fn runs(&self) -> u32 {
        self.node.runs()
    }

    /// The cell it is attached to.
    pub fn cell(&self) -> &LatestCellOf<K, V, F> {
        &self.cell
    }

    /// Disposes the effect and drops the sink (as dropping does).
    pub fn detach(self) {}
}

impl<K: 'static, V: 'static, F: Flavor> Drop for LatestAttachment<K, V, F> {
    fn drop(&mut self) {
        self.node.dispose();
    }
}

impl<K: 'static, V: 'static, F: Flavor> std::fmt::Debug for LatestAttachment<K, V, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatestAttachment").field("generation", &self.generation).finish_non_exhaustive()
    }
}
