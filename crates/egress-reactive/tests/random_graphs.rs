#![allow(clippy::unwrap_used, clippy::needless_range_loop)]
//! Property: on random DAGs of computeds (with dynamic branches) under random
//! batched writes, every read equals a from-scratch recomputation, and every
//! effect observes only consistent values and runs at most once per batch.

use egress_reactive::Context;
use proptest::prelude::*;
use std::cell::RefCell;
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn reads_match_recomputation(
        (n_sources, ops) in graph_strategy(),
        batches in prop::collection::vec(prop::collection::vec((0usize..5, -20i64..20), 1..4), 1..20),
        watched in prop::collection::vec(0usize..30, 1..4),
    ) {
        let cx = Context::new();
        let sources: Vec<_> = (0..n_sources).map(|i| cx.signal(i as i64)).collect();
        let mut nodes: Vec<Box<dyn Fn() -> i64>> = sources.iter().map(|s| {
            let s = s.clone();
            Box::new(move || s.get()) as Box<dyn Fn() -> i64>
        }).collect();
        let mut computeds = Vec::new();
        for op in &ops {
            let reader = |j: usize, computeds: &Vec<egress_reactive::Computed<i64, egress_reactive::Local>>| -> Rc<dyn Fn() -> i64> {
                if j < n_sources { let s = sources[j].clone(); Rc::new(move || s.get()) }
                else { let c = computeds[j - n_sources].clone(); Rc::new(move || c.get()) }
            };
            let c = match op.clone() {
                Op::Sum(inputs) => {
                    let rs: Vec<_> = inputs.iter().map(|&j| reader(j, &computeds)).collect();
                    cx.computed(move || rs.iter().map(|r| r()).sum::<i64>())
                }
                Op::Branch(c, a, b) => {
                    let (rc, ra, rb) = (reader(c, &computeds), reader(a, &computeds), reader(b, &computeds));
                    cx.computed(move || if rc() % 2 == 0 { ra() } else { rb() })
                }
                Op::Mod3(a) => { let ra = reader(a, &computeds); cx.computed(move || ra().rem_euclid(3)) }
            };
            let cc = c.clone();
            nodes.push(Box::new(move || cc.get()));
            computeds.push(c);
        }
        let total = n_sources + ops.len();
        // Effects over a few nodes record what they saw.
        let seen: Rc<RefCell<Vec<(usize, i64)>>> = Rc::new(RefCell::new(Vec::new()));
        let mut effects = Vec::new();
        for &w in &watched {
            let w = w % total;
            let reader: Rc<dyn Fn() -> i64> = if w < n_sources { let s = sources[w].clone(); Rc::new(move || s.get()) } else { let c = computeds[w - n_sources].clone(); Rc::new(move || c.get()) };
            let seen = seen.clone();
            effects.push((w, cx.effect(move || seen.borrow_mut().push((w, reader())))));
        }
        let mut values: Vec<i64> = (0..n_sources as i64).collect();
        for batch in &batches {
            seen.borrow_mut().clear();
            let runs_before: Vec<u32> = effects.iter().map(|(_, e)| e.runs()).collect();
            cx.batch(|| for &(s, v) in batch { let s = s % n_sources; values[s] = v; sources[s].set(v); });
            let mut memo = vec![None; total];
            // Every effect run saw the settled value.
            for &(w, v) in seen.borrow().iter() {
                prop_assert_eq!(v, eval(&ops, &values, w, &mut memo), "effect on node {} saw a stale or mixed value", w);
            }
            for (k, (_, e)) in effects.iter().enumerate() {
                prop_assert!(e.runs() <= runs_before[k] + 1, "an effect ran twice for one batch");
            }
            // Every read equals recomputation from scratch.
            for i in 0..total {
                prop_assert_eq!(nodes[i](), eval(&ops, &values, i, &mut memo), "node {} differs", i);
            }
        }
    }
}
