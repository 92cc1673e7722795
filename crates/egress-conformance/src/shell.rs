//! The shell targets: the egress cells of `egress-reactive`, driven through
//! their public API, on each graph flavour.
//!
//! A shell reports what it invalidated from the graph, not from the core:
//! after each op it reads every reader and checks whether the reader's
//! computed ran again (a reader recomputes exactly when the op dirtied it).
//! The state it reports comes from the readers too, so a reader that shows
//! a stale value fails its fixture as well.

use std::any::Any;

use egress_core::{Generation, Projection, Sequence, Time};
use egress_reactive::{
    AsyncContext, AsyncEgressCell, CellFlavor, CellOptions, Computed, Context, Ctx, EgressCellOf, Flavor, ManualClock,
    NodeRef, ThreadSafeContext,
};
use serde_json::{Map, Value, json};

use crate::fixture::{Fixture, Op};
use crate::target::{Observation, Session, Target, invalidation_key, parked_entry, returns};

/// `EgressCell` on a `Context`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ContextTarget;

/// `ThreadSafeEgressCell` on a `ThreadSafeContext`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadSafeTarget;

/// `AsyncEgressCell` on an `AsyncContext`, inside a tokio runtime. The
/// runtime is not driven while a fixture runs, so the cell's own timer
/// never fires: `handle_timeout` happens exactly where the fixture says.
#[derive(Clone, Copy, Debug, Default)]
pub struct AsyncTarget;

/// One fixture's run on a cell; `keep` holds what must outlive the cell's
/// use (its context, the runtime).
struct ShellSession<F: Flavor> {
    cell: EgressCellOf<Value, F>,
    clock: ManualClock,
    _keep: Box<dyn Any>,
}

fn setup(fixture: &Fixture) -> Result<(egress_core::EgressCore<Value>, CellOptions, ManualClock), String> {
    let core = fixture.core()?;
    let clock = ManualClock::new();
    let options = CellOptions::new().generation(Generation(fixture.generation)).clock(clock.clone()).jitter_seed(0);
    Ok((core, options, clock))
}

/// A session of a synchronous cell on graph `cx`, which the session keeps.
fn on_graph<F: CellFlavor<Value>>(cx: Ctx<F>, fixture: &Fixture) -> Result<Box<dyn Session>, String> {
    let (core, options, clock) = setup(fixture)?;
    let cell = EgressCellOf::from_core(&cx.handle(), core, options);
    Ok(Box::new(ShellSession { cell, clock, _keep: Box::new(cx) }))
}

impl Target for ContextTarget {
    fn latest(&self) -> Option<crate::latest::LatestStart> {
        Some(crate::latest::on_context)
    }

    fn relay(
        &self,
        fixture: &crate::relay::RelayFixture,
    ) -> Option<Result<Box<dyn crate::relay::RelaySession>, String>> {
        Some(crate::relay::on_context(fixture))
    }

    fn lanes(
        &self,
        fixture: &crate::lanes::LanesFixture,
    ) -> Option<Result<Box<dyn crate::lanes::LanesSession>, String>> {
        Some(Ok(Self::lanes_session(fixture)))
    }

    fn graph(&self) -> Option<crate::target::GraphStart> {
        Some(Box::new(|| {
            let cx = Context::new();
            crate::graph::local::start(cx.handle(), Box::new(cx))
        }))
    }

    fn name(&self) -> &'static str {
        "context"
    }

    fn start(&self, fixture: &Fixture) -> Result<Box<dyn Session>, String> {
        on_graph(Context::new(), fixture)
    }
}

impl Target for ThreadSafeTarget {
    fn latest(&self) -> Option<crate::latest::LatestStart> {
        Some(crate::latest::on_thread_safe)
    }

    fn relay(
        &self,
        fixture: &crate::relay::RelayFixture,
    ) -> Option<Result<Box<dyn crate::relay::RelaySession>, String>> {
        Some(crate::relay::on_thread_safe(fixture))
    }

    fn lanes(
        &self,
        fixture: &crate::lanes::LanesFixture,
    ) -> Option<Result<Box<dyn crate::lanes::LanesSession>, String>> {
        Some(Ok(Self::lanes_session(fixture)))
    }

    fn graph(&self) -> Option<crate::target::GraphStart> {
        Some(Box::new(|| {
            let cx = ThreadSafeContext::new();
            crate::graph::threaded::start(cx.handle(), Box::new(cx))
        }))
    }

    fn name(&self) -> &'static str {
        "thread-safe"
    }

    fn start(&self, fixture: &Fixture) -> Result<Box<dyn Session>, String> {
        on_graph(ThreadSafeContext::new(), fixture)
    }
}

impl Target for AsyncTarget {
    fn latest(&self) -> Option<crate::latest::LatestStart> {
        Some(crate::latest::on_async)
    }

    fn relay(
        &self,
        fixture: &crate::relay::RelayFixture,
    ) -> Option<Result<Box<dyn crate::relay::RelaySession>, String>> {
        Some(crate::relay::on_async(fixture))
    }

    fn lanes(
        &self,
        fixture: &crate::lanes::LanesFixture,
    ) -> Option<Result<Box<dyn crate::lanes::LanesSession>, String>> {
        Some(Ok(Self::lanes_session(fixture)))
    }

    fn graph(&self) -> Option<crate::target::GraphStart> {
        Some(Box::new(|| {
            let cx = AsyncContext::new();
            crate::graph::threaded::start(cx.handle(), Box::new(cx))
        }))
    }

    fn name(&self) -> &'static str {
        "async"
    }

    fn start(&self, fixture: &Fixture) -> Result<Box<dyn Session>, String> {
        let (core, options, clock) = setup(fixture)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|e| format!("cannot start a tokio runtime: {e}"))?;
        let cx = AsyncContext::new();
        let cell = {
            let _entered = runtime.enter();
            AsyncEgressCell::from_core(&cx, core, options)
        };
        let inner = (*cell).clone();
        // Dropped in order: the async cell (its timer's abort), then the
        // runtime (the timer task), then the context.
        Ok(Box::new(ShellSession { cell: inner, clock, _keep: Box::new((cell, runtime, cx)) }))
    }
}

impl<F: CellFlavor<Value>> ShellSession<F> {
    /// The reader that projects each invalidation key.
    fn reader(&self, projection: Projection) -> &NodeRef<F> {
        let c = &self.cell;
        match projection {
            Projection::Pending => c.pending(),
            Projection::Inflight => c.inflight(),
            Projection::AckedThrough => c.acked_through(),
            Projection::Retry => c.retry(),
            Projection::Parked => c.parked(),
            Projection::Exhausted => c.exhausted(),
            Projection::Generation => c.generation(),
            Projection::Received => c.received_through(),
            Projection::Durable => c.durable_through(),
            Projection::PersistError => c.persist_error(),
        }
    }

    /// How many times each reader has run, reading each first (so a dirty
    /// reader runs now).
    fn revisions(&self) -> Result<[u32; 10], String> {
        let mut out = [0; 10];
        for (i, p) in Projection::ALL.iter().enumerate() {
            self.state_of(*p)?;
            out[i] = self.reader(*p).runs();
        }
        Ok(out)
    }

    fn state_of(&self, projection: Projection) -> Result<Value, String> {
        fn read<T: Clone + 'static, F: Flavor>(c: &Computed<T, F>) -> Result<T, String> {
            c.try_get().map_err(|e| e.to_string())
        }
        let c = &self.cell;
        Ok(match projection {
            Projection::Pending => json!(read(c.pending())?.to_vec()),
            Projection::Inflight => json!(read(c.inflight())?.to_vec()),
            Projection::AckedThrough => json!(read(c.acked_through())?),
            Projection::Retry => json!(read(c.retry())?),
            Projection::Parked => Value::Array(
                read(c.parked())?
                    .iter()
                    .map(|p| parked_entry(p.sequence, p.attempt, p.backoff, p.due, p.dead))
                    .collect(),
            ),
            Projection::Exhausted => json!(read(c.exhausted())?.to_vec()),
            Projection::Generation => json!(read(c.generation())?),
            Projection::Received => json!(read(c.received_through())?),
            Projection::Durable => json!(read(c.durable_through())?),
            Projection::PersistError => json!(read(c.persist_error())?),
        })
    }

    fn apply_op(&self, op: &Op) -> Value {
        let c = &self.cell;
        match op {
            Op::Enqueue { payload } => returns::enqueue(c.enqueue(payload.clone())),
            Op::Claim { generation } => c.claim_with(Generation(*generation), |o| returns::claim(&o)),
            Op::Ack { generation, through } => returns::ack(&c.ack(Generation(*generation), Sequence(*through))),
            Op::Received { generation, through } => {
                returns::received(&c.received(Generation(*generation), Sequence(*through)))
            }
            Op::Fail { .. } => {
                let a = op.fail_args().expect("invariant broken: a fail op has fail arguments");
                self.clock.set(a.now);
                returns::fail(&c.fail_with(a.generation, a.sequence, a.kind, a.jitter))
            }
            Op::RetryNow { generation, sequence } => {
                returns::schedule("retry_action", &c.retry_now(Generation(*generation), Sequence(*sequence)))
            }
            Op::HandleTimeout { now } => returns::handle_timeout(&c.handle_timeout(Time(*now))),
            Op::Requeue { generation, sequence } => {
                returns::schedule("requeue", &c.requeue(Generation(*generation), Sequence(*sequence)))
            }
            Op::Reconnect { generation } => returns::reconnect(&c.reconnect(Generation(*generation))),
            Op::PollReady => match c.poll_ready() {
                Some((ready, appends)) => {
                    let payloads: Vec<Value> = appends.into_iter().map(|(_, p)| p).collect();
                    returns::ready(Some(&ready), &payloads)
                }
                None => returns::ready(None, &[]),
            },
            Op::Persisted { epoch } => returns::persist(&c.persisted(egress_core::Epoch(*epoch))),
            Op::PersistFailed { epoch, reason } => {
                returns::persist(&c.persist_failed(egress_core::Epoch(*epoch), reason.clone()))
            }
            Op::Adopt { sequence, payload } => returns::adopt(&c.adopt(Sequence(*sequence), payload.clone())),
            Op::EnqueueAfter { payload, after } => {
                returns::enqueue(c.enqueue_after(payload.clone(), egress_core::FlushEpoch(*after)))
            }
            Op::Release { through } => returns::release(c.release(egress_core::FlushEpoch(*through))),
            Op::Rebase { appended } => returns::rebase(&c.rebase(returns::appended(appended))),
        }
    }
}

impl<F: CellFlavor<Value>> Session for ShellSession<F> {
    fn apply(&mut self, op: &Op) -> Result<Observation, String> {
        let before = self.revisions()?;
        let returns = self.apply_op(op);
        let after = self.revisions()?;
        let mut state = Map::new();
        for p in Projection::ALL {
            state.insert(invalidation_key(p).to_owned(), self.state_of(p)?);
        }
        state.insert("next_sequence".into(), json!(self.cell.next_sequence()));
        state.insert("gated_len".into(), json!(self.cell.with_core(egress_core::EgressCore::gated_len)));
        let read = |r: Result<Value, String>| r.unwrap_or_else(Value::String);
        state.insert(
            "durable_through".into(),
            read(self.cell.durable_through().try_get().map(|v| json!(v)).map_err(|e| e.to_string())),
        );
        state.insert(
            "unpersisted_len".into(),
            read(self.cell.unpersisted_len().try_get().map(|v| json!(v)).map_err(|e| e.to_string())),
        );
        state.insert(
            "generation_durable".into(),
            read(self.cell.generation_durable().try_get().map(|v| json!(v)).map_err(|e| e.to_string())),
        );
        let invalidated = Projection::ALL
            .iter()
            .enumerate()
            .map(|(i, p)| (invalidation_key(*p).to_owned(), Value::Bool(after[i] != before[i])))
            .collect();
        Ok(Observation { returns, state, invalidated })
    }
}
