#![allow(clippy::unwrap_used, clippy::needless_range_loop)]
//! Property: on random DAGs of computeds (with dynamic branches) under random
//! batched writes, every read equals a from-scratch recomputation, and every
//! effect observes only consistent values, runs at most once per batch, and
//! has seen the settled value of what it reads once the batch ends (none
//! misses an update). Some computeds dispose effects from inside their own
//! evaluation (a "killer" armed from a chosen batch on), so the walks that
//! re-validate the graph have nodes freed under them.

use egress_reactive::{Computed, Context, Effect, Local, Signal};
use proptest::prelude::*;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

#[derive(Debug, Clone)]
enum Op {
    /// sum of the inputs.
    Sum(Vec<usize>),
    /// if input0 is even then input1 else input2 (dynamic dependencies).
    Branch(usize, usize, usize),
    /// input % 3 (cuts off often).
    Mod3(usize),
}

fn eval(ops: &[Op], sources: &[i64], i: usize, memo: &mut Vec<Option<i64>>) -> i64 {
    if i < sources.len() {
        return sources[i];
    }
    if let Some(v) = memo[i] {
        return v;
    }
    let v = match &ops[i - sources.len()] {
        Op::Sum(inputs) => inputs.iter().map(|&j| eval(ops, sources, j, memo)).sum(),
        Op::Branch(c, a, b) => {
            if eval(ops, sources, *c, memo) % 2 == 0 {
                eval(ops, sources, *a, memo)
            } else {
                eval(ops, sources, *b, memo)
            }
        }
        Op::Mod3(a) => eval(ops, sources, *a, memo).rem_euclid(3),
    };
    memo[i] = Some(v);
    v
}

fn graph_strategy() -> impl Strategy<Value = (usize, Vec<Op>)> {
    (1usize..5, 1usize..25).prop_flat_map(|(n_sources, n_nodes)| {
        let ops: Vec<_> = (0..n_nodes)
            .map(move |k| {
                let below = n_sources + k;
                prop_oneof![
                    prop::collection::vec(0..below, 1..4).prop_map(Op::Sum),
                    (0..below, 0..below, 0..below).prop_map(|(c, a, b)| Op::Branch(c, a, b)),
                    (0..below).prop_map(Op::Mod3),
                ]
                .boxed()
            })
            .collect();
        (Just(n_sources), ops)
    })
}

/// What reads node `j`: source `j`, or computed `j - sources.len()`.
fn reader(sources: &[Signal<i64, Local>], computeds: &[Computed<i64, Local>], j: usize) -> Rc<dyn Fn() -> i64> {
    if j < sources.len() {
        let s = sources[j].clone();
        Rc::new(move || s.get())
    } else {
        let c = computeds[j - sources.len()].clone();
        Rc::new(move || c.get())
    }
}

/// Computeds that dispose an effect while they evaluate: `(node, victim,
/// from_batch)`, the computed of node `node` (taken modulo the number of
/// computeds) disposes victim effect `victim` (modulo their number) in any
/// evaluation from batch `from_batch` on.
type Killers = Vec<(usize, usize, usize)>;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn reads_match_recomputation(
        (n_sources, ops) in graph_strategy(),
        batches in prop::collection::vec(prop::collection::vec((0usize..5, -20i64..20), 1..4), 1..20),
        watched in prop::collection::vec(0usize..30, 1..4),
        victims in prop::collection::vec(0usize..30, 0..4),
        killers in prop::collection::vec((0usize..25, 0usize..4, 0usize..20), 0..3),
    ) {
        check(n_sources, &ops, &batches, &watched, &victims, &killers)?;
    }
}

fn check(
    n_sources: usize,
    ops: &[Op],
    batches: &[Vec<(usize, i64)>],
    watched: &[usize],
    victims: &[usize],
    killers: &Killers,
) -> Result<(), TestCaseError> {
    let cx = Context::new();
    let sources: Vec<_> = (0..n_sources).map(|i| cx.signal(i as i64)).collect();
    let mut nodes: Vec<Box<dyn Fn() -> i64>> = sources
        .iter()
        .map(|s| {
            let s = s.clone();
            Box::new(move || s.get()) as Box<dyn Fn() -> i64>
        })
        .collect();
    // The victims, filled once the effects exist; the batch running now.
    let victim_slots: Rc<RefCell<Vec<Option<Effect<Local>>>>> = Rc::new(RefCell::new(Vec::new()));
    let batch_no = Rc::new(Cell::new(0usize));
    let mut computeds = Vec::new();
    for (k, op) in ops.iter().enumerate() {
        let reader = |j: usize, computeds: &[Computed<i64, Local>]| reader(&sources, computeds, j);
        let value: Rc<dyn Fn() -> i64> = match op.clone() {
            Op::Sum(inputs) => {
                let rs: Vec<_> = inputs.iter().map(|&j| reader(j, &computeds)).collect();
                Rc::new(move || rs.iter().map(|r| r()).sum::<i64>())
            }
            Op::Branch(c, a, b) => {
                let (rc, ra, rb) = (reader(c, &computeds), reader(a, &computeds), reader(b, &computeds));
                Rc::new(move || if rc() % 2 == 0 { ra() } else { rb() })
            }
            Op::Mod3(a) => {
                let ra = reader(a, &computeds);
                Rc::new(move || ra().rem_euclid(3))
            }
        };
        // The victims this computed disposes, and from which batch on.
        let kills: Vec<(usize, usize)> =
            killers.iter().filter(|&&(node, _, _)| node % ops.len() == k).map(|&(_, v, from)| (v, from)).collect();
        let c = if kills.is_empty() {
            cx.computed(move || value())
        } else {
            let (slots, batch_no) = (victim_slots.clone(), batch_no.clone());
            cx.computed(move || {
                let v = value();
                for &(victim, from) in &kills {
                    let slots = slots.borrow();
                    if batch_no.get() >= from
                        && !slots.is_empty()
                        && let Some(e) = &slots[victim % slots.len()]
                    {
                        e.dispose();
                    }
                }
                v
            })
        };
        let cc = c.clone();
        nodes.push(Box::new(move || cc.get()));
        computeds.push(c);
    }
    let total = n_sources + ops.len();
    let reader_of = |w: usize| reader(&sources, &computeds, w);
    // Effects over a few nodes (the watched ones, then the victims) record
    // what they saw: (effect, node, value).
    let seen: Rc<RefCell<Vec<(usize, usize, i64)>>> = Rc::new(RefCell::new(Vec::new()));
    let mut effects = Vec::new();
    for (id, &w) in watched.iter().chain(victims).enumerate() {
        let w = w % total;
        let reader = reader_of(w);
        let seen = seen.clone();
        effects.push((w, cx.effect(move || seen.borrow_mut().push((id, w, reader())))));
    }
    *victim_slots.borrow_mut() = effects[watched.len()..].iter().map(|(_, e)| Some(e.clone())).collect();
    // What each effect saw last.
    let mut last: Vec<Option<i64>> = vec![None; effects.len()];
    for &(id, _, v) in seen.borrow().iter() {
        last[id] = Some(v);
    }
    let mut values: Vec<i64> = (0..n_sources as i64).collect();
    for (b, batch) in batches.iter().enumerate() {
        batch_no.set(b);
        seen.borrow_mut().clear();
        let runs_before: Vec<u32> = effects.iter().map(|(_, e)| e.runs()).collect();
        cx.batch(|| {
            for &(s, v) in batch {
                let s = s % n_sources;
                values[s] = v;
                sources[s].set(v);
            }
        });
        let mut memo = vec![None; total];
        // Every effect run saw the settled value.
        for &(id, w, v) in seen.borrow().iter() {
            prop_assert_eq!(v, eval(ops, &values, w, &mut memo), "effect on node {} saw a stale or mixed value", w);
            last[id] = Some(v);
        }
        for (k, (w, e)) in effects.iter().enumerate() {
            prop_assert!(e.runs() <= runs_before[k] + 1, "an effect ran twice for one batch");
            // No live effect missed an update: what it saw last is what it
            // reads now.
            if !e.is_disposed() {
                prop_assert_eq!(
                    last[k],
                    Some(eval(ops, &values, *w, &mut memo)),
                    "effect {} on node {} missed an update",
                    k,
                    w
                );
            }
        }
        // Every read equals recomputation from scratch.
        for i in 0..total {
            prop_assert_eq!(nodes[i](), eval(ops, &values, i, &mut memo), "node {} differs", i);
        }
    }
    for (_, e) in &effects {
        e.dispose();
    }
    Ok(())
}
