//! The lanes fixtures on the shell targets: the lanes cell of
//! `egress-reactive` on each graph flavour, driven through its public API.
//!
//! As for the egress fixtures, a shell reports what it invalidated from the
//! graph, not from the core: before the first op it makes the readers of
//! every lane the fixture declares (a lane that does not exist yet reads as
//! empty), and after each op it reads every reader and checks whether it
//! ran again. The counts it reports are the cell's aggregate readers, and a
//! lane's projected keys come from that lane's readers, so a reader left
//! stale fails its fixture too.

use std::any::Any;

use egress_core::{FlushEpoch, Generation, Projection, Sequence, Time};
use egress_reactive::{
    AsyncContext, CellOptions, Computed, Context, Ctx, Flavor, LaneReaders, LanesCellOf, LanesFlavor, ManualClock,
    NodeRef, ThreadSafeContext,
};
use serde_json::{Map, Value, json};

use crate::fixture::Op;
use crate::lanes::{
    FixtureLane, LanesFixture, LanesOp, LanesSession, claimed, completed, enqueued, lane_list, reconnected,
};
use crate::shell::{AsyncTarget, ContextTarget, ThreadSafeTarget};
use crate::target::{invalidation_key, parked_entry, returns, state_of};

/// One lanes fixture's run on a lanes cell; `keep` holds what must outlive
/// the cell's use (its context, a runtime).
struct ShellLanes<F: Flavor> {
    cell: LanesCellOf<FixtureLane, Value, F>,
    /// The readers of each lane the fixture declares, by name.
    readers: Vec<(FixtureLane, LaneReaders<FixtureLane, Value, F>)>,
    fixture: LanesFixture,
    clock: ManualClock,
    _keep: Box<dyn Any>,
}

fn start<F: LanesFlavor<FixtureLane, Value>>(
    cx: &egress_reactive::Handle<F>,
    fixture: &LanesFixture,
    keep: Box<dyn Any>,
) -> ShellLanes<F> {
    let clock = ManualClock::new();
    let options = CellOptions::new().generation(Generation(fixture.generation)).clock(clock.clone()).jitter_seed(0);
    let cell = LanesCellOf::with_options(cx, fixture.policy, options);
    let readers = fixture.lanes.values().map(|lane| (lane.clone(), cell.lane(lane))).collect();
    ShellLanes { cell, readers, fixture: fixture.clone(), clock, _keep: keep }
}

fn on_graph<F: LanesFlavor<FixtureLane, Value>>(cx: Ctx<F>, fixture: &LanesFixture) -> Box<dyn LanesSession> {
    let handle = cx.handle();
    Box::new(start(&handle, fixture, Box::new(cx)))
}

impl ContextTarget {
    pub(crate) fn lanes_session(fixture: &LanesFixture) -> Box<dyn LanesSession> {
        on_graph(Context::new(), fixture)
    }
}

impl ThreadSafeTarget {
    pub(crate) fn lanes_session(fixture: &LanesFixture) -> Box<dyn LanesSession> {
        on_graph(ThreadSafeContext::new(), fixture)
    }
}

impl AsyncTarget {
    /// On an `AsyncContext`'s graph (the lanes cell has no timer of its
    /// own: `handle_timeout` happens where the fixture says).
    pub(crate) fn lanes_session(fixture: &LanesFixture) -> Box<dyn LanesSession> {
        let cx = AsyncContext::new();
        let handle = cx.handle();
        Box::new(start(&handle, fixture, Box::new(cx)))
    }
}

fn read<T: Clone + 'static, F: Flavor>(c: &Computed<T, F>) -> Result<T, String> {
    c.try_get().map_err(|e| e.to_string())
}

impl<F: LanesFlavor<FixtureLane, Value>> ShellLanes<F> {
    /// The per-lane reader of each projection a lane has readers for.
    fn lane_reader(r: &LaneReaders<FixtureLane, Value, F>, projection: Projection) -> Option<&NodeRef<F>> {
        Some(match projection {
            Projection::Pending => r.pending(),
            Projection::Inflight => r.inflight(),
            Projection::AckedThrough => r.acked_through(),
            Projection::Retry => r.retry(),
            Projection::Parked => r.parked(),
            Projection::Exhausted => r.exhausted(),
            Projection::Received => r.received_through(),
            Projection::Durable => r.gated_len(),
            Projection::Generation | Projection::PersistError => return None,
        })
    }

    /// Every reader that shows a projection: each lane's, and the
    /// aggregate generation and release readers.
    fn readers_of(&self, projection: Projection) -> Vec<&NodeRef<F>> {
        let mut out: Vec<&NodeRef<F>> =
            self.readers.iter().filter_map(|(_, r)| Self::lane_reader(r, projection)).collect();
        match projection {
            Projection::Generation => out.push(self.cell.generation()),
            Projection::Durable => out.push(self.cell.released()),
            _ => {}
        }
        out
    }

    /// How many times each reader has run, reading each first (so that a
    /// dirty reader runs now).
    fn revisions(&self) -> Result<Vec<Vec<u32>>, String> {
        for (_, r) in &self.readers {
            read(r.pending())?;
            read(r.inflight())?;
            read(r.acked_through())?;
            read(r.retry())?;
            read(r.parked())?;
            read(r.exhausted())?;
            read(r.received_through())?;
            read(r.gated_len())?;
        }
        read(self.cell.generation())?;
        read(self.cell.released())?;
        Ok(Projection::ALL.iter().map(|p| self.readers_of(*p).iter().map(|n| n.runs()).collect()).collect())
    }

    /// A lane's state: the core's keys, with those the lane's readers
    /// project taken from the readers.
    fn lane_state(&self, lane: &FixtureLane) -> Result<Option<Map<String, Value>>, String> {
        let Some(mut state) = self.cell.with_lanes(|l| l.lane(lane).map(state_of)) else { return Ok(None) };
        let Some((_, r)) = self.readers.iter().find(|(k, _)| k == lane) else { return Ok(Some(state)) };
        state.insert("pending".into(), json!(read(r.pending())?.to_vec()));
        state.insert("inflight".into(), json!(read(r.inflight())?.to_vec()));
        state.insert("acked_through".into(), json!(read(r.acked_through())?));
        state.insert("received_through".into(), json!(read(r.received_through())?));
        state.insert("retry".into(), json!(read(r.retry())?));
        state.insert("exhausted".into(), json!(read(r.exhausted())?.to_vec()));
        let parked: Vec<Value> =
            read(r.parked())?.iter().map(|p| parked_entry(p.sequence, p.attempt, p.backoff, p.due, p.dead)).collect();
        state.insert("parked".into(), Value::Array(parked));
        state.insert("gated_len".into(), json!(read(r.gated_len())?));
        Ok(Some(state))
    }

    fn key(&self, name: Option<&String>) -> Result<FixtureLane, String> {
        let name = name.ok_or("an op on one lane without its lane")?;
        self.fixture.lanes.get(name).cloned().ok_or_else(|| format!("undeclared lane {name:?}"))
    }

    fn apply_op(&self, op: &LanesOp) -> Result<Value, String> {
        let c = &self.cell;
        let (lane, op) = match op {
            LanesOp::Complete { generation, lane, sequence } => {
                let key = self.key(Some(lane))?;
                return Ok(completed(&c.complete(Generation(*generation), &key, Sequence(*sequence))));
            }
            LanesOp::Egress { lane, op } => (lane.as_ref(), op),
        };
        Ok(match op {
            Op::Enqueue { payload } => enqueued(&c.enqueue(self.key(lane)?, payload.clone())),
            Op::EnqueueAfter { payload, after } => {
                enqueued(&c.enqueue_after(self.key(lane)?, payload.clone(), FlushEpoch(*after)))
            }
            Op::Claim { generation } => c.claim_with(Generation(*generation), |o| claimed(&o)),
            Op::Ack { generation, through } => {
                returns::ack(&c.ack(Generation(*generation), &self.key(lane)?, Sequence(*through)))
            }
            Op::Received { generation, through } => {
                returns::received(&c.received(Generation(*generation), &self.key(lane)?, Sequence(*through)))
            }
            Op::Fail { .. } => {
                let a = op.fail_args().ok_or("a fail op without fail arguments")?;
                self.clock.set(a.now);
                returns::fail(&c.fail_with(a.generation, &self.key(lane)?, a.sequence, a.kind, a.jitter))
            }
            Op::RetryNow { generation, sequence } => returns::schedule(
                "retry_action",
                &c.retry_now(Generation(*generation), &self.key(lane)?, Sequence(*sequence)),
            ),
            Op::Requeue { generation, sequence } => {
                returns::schedule("requeue", &c.requeue(Generation(*generation), &self.key(lane)?, Sequence(*sequence)))
            }
            Op::HandleTimeout { now } => json!({"scheduled": lane_list(&c.handle_timeout(Time(*now)))}),
            Op::Release { through } => json!({"released": lane_list(&c.release(FlushEpoch(*through)))}),
            Op::Reconnect { generation } => reconnected(&c.reconnect(Generation(*generation))),
            other => return Err(format!("not a lanes op: {other:?}")),
        })
    }
}

impl<F: LanesFlavor<FixtureLane, Value>> LanesSession for ShellLanes<F> {
    fn apply(&mut self, op: &LanesOp) -> Result<(Value, Map<String, Value>), String> {
        let before = self.revisions()?;
        let returns = self.apply_op(op)?;
        let after = self.revisions()?;
        let c = &self.cell;
        let mut s = Map::new();
        s.insert("generation".into(), json!(read(c.generation())?));
        s.insert("next_ordinal".into(), json!(c.with_lanes(|l| l.next_ordinal())));
        let names: Vec<String> = c.with_lanes(|l| l.lanes().map(|(k, _)| k.name.clone()).collect());
        s.insert("lanes".into(), json!(names));
        s.insert("pending_len".into(), json!(read(c.pending_len())?));
        s.insert("inflight_len".into(), json!(read(c.inflight_len())?));
        s.insert("outstanding".into(), json!(read(c.outstanding())?));
        s.insert("parked_len".into(), json!(read(c.parked_len())?));
        s.insert("exhausted_len".into(), json!(read(c.exhausted_len())?));
        s.insert("gated_len".into(), json!(read(c.gated_len())?));
        s.insert("poll_timeout".into(), json!(c.poll_timeout()));
        let mut states = Map::new();
        for name in names {
            let lane = self.key(Some(&name))?;
            if let Some(state) = self.lane_state(&lane)? {
                states.insert(name, Value::Object(state));
            }
        }
        s.insert("lane_states".into(), Value::Object(states));
        let invalidated = Projection::ALL
            .iter()
            .enumerate()
            .map(|(i, p)| (invalidation_key(*p).to_owned(), Value::Bool(after[i] != before[i])))
            .collect();
        s.insert("invalidates".into(), Value::Object(invalidated));
        Ok((returns, s))
    }
}
