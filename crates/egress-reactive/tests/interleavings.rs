#![allow(clippy::unwrap_used, clippy::too_many_lines)]
//! Property: random interleavings of writes, batches, reads, scope
//! creations and disposals (of scopes, effects, signals and computeds; from
//! outside, from effects and from cleanups), with panics in computeds,
//! effects and cleanups, leave the graph consistent after every step, on
//! every flavour:
//!
//! - every effect whose dependencies changed has run: where a from-scratch
//!   evaluation of what an effect reads succeeds, its last run saw exactly
//!   that (where it panics, the effect failed: its run, or the re-validation
//!   before it, panicked), unless its cleanup panicked since (which skips
//!   the run it came before) or a node it reads was disposed (disposal is
//!   not a change);
//! - a computed read from outside equals a from-scratch evaluation, and
//!   panics exactly when it does;
//! - exactly the nodes the harness expects are alive (it follows every
//!   disposal, whoever made it), the node count is theirs (no leak), every
//!   cleanup ran exactly once per run of a dead effect and once per earlier
//!   run of a live one, and with every scope gone no link to a freed node
//!   is left;
//! - no operation hangs: each case runs on its own thread, given 60 s.
//!
//! Every panic is deterministic in the values (a computed panics when its
//! value is 3 mod 7, an effect when its sum is 4 mod 5), so the harness
//! knows which reads must panic.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::time::Duration;

/// The shared part of every graph: 4 signals and 4 computeds, never
/// disposed. Readables 0..4 are the signals, 4..8 the computeds.
const SHARED_SIGNALS: usize = 4;
const SHARED: usize = 8;
/// Shared computed k reads these readables, plus this constant.
const SHARED_COMPUTEDS: [(&[usize], i64); 4] = [(&[0, 1], 1), (&[4, 2], 0), (&[3, 5], 2), (&[6, 0, 4], -1)];

fn computed_panics(value: i64) -> bool {
    value.rem_euclid(7) == 3
}

fn effect_panics(sum: i64) -> bool {
    sum.rem_euclid(5) == 4
}

fn effect_acts(sum: i64) -> bool {
    sum.rem_euclid(6) == 1
}

#[derive(Debug, Clone)]
struct EffectSpec {
    /// Readables: below `SHARED` a shared one, above it one of the
    /// scope's own (modulo how many it has).
    inputs: Vec<usize>,
    /// When its sum is 1 mod 6, it disposes this node (an index among the
    /// disposable nodes, modulo their number, at its creation).
    act: Option<usize>,
    /// Its cleanups panic.
    cleanup_panics: bool,
    /// Its cleanups dispose this node.
    cleanup_act: Option<usize>,
}

#[derive(Debug, Clone)]
struct ScopeSpec {
    signals: Vec<i64>,
    computeds: Vec<(Vec<usize>, i64)>,
    effects: Vec<EffectSpec>,
}

#[derive(Debug, Clone)]
enum Op {
    Write(usize, i64),
    Batch(usize, i64, usize, i64),
    Read(usize),
    NewScope(ScopeSpec),
    DisposeScope(usize),
    DisposeEffect(usize),
    DisposeLocal(usize),
}

fn effect_spec() -> impl Strategy<Value = EffectSpec> {
    (
        prop::collection::vec(0usize..16, 1..4),
        prop::option::weighted(0.3, any::<usize>()),
        prop::bool::weighted(0.15),
        prop::option::weighted(0.15, any::<usize>()),
    )
        .prop_map(|(inputs, act, cleanup_panics, cleanup_act)| EffectSpec {
            inputs,
            act,
            cleanup_panics,
            cleanup_act,
        })
}

fn op() -> impl Strategy<Value = Op> {
    let scope = (
        prop::collection::vec(-20i64..20, 0..3),
        prop::collection::vec((prop::collection::vec(0usize..16, 1..3), -5i64..5), 0..3),
        prop::collection::vec(effect_spec(), 1..4),
    )
        .prop_map(|(signals, computeds, effects)| ScopeSpec { signals, computeds, effects });
    prop_oneof![
        4 => (any::<usize>(), -20i64..20).prop_map(|(s, v)| Op::Write(s, v)),
        1 => (any::<usize>(), -20i64..20, any::<usize>(), -20i64..20).prop_map(|(a, x, b, y)| Op::Batch(a, x, b, y)),
        2 => any::<usize>().prop_map(Op::Read),
        2 => scope.prop_map(Op::NewScope),
        1 => any::<usize>().prop_map(Op::DisposeScope),
        1 => any::<usize>().prop_map(Op::DisposeEffect),
        1 => any::<usize>().prop_map(Op::DisposeLocal),
    ]
}

/// What a node is, for the harness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Signal,
    Computed,
    Effect,
    Scope,
}

/// What the effects and cleanups report, by effect id.
#[derive(Debug, Default, Clone)]
struct EffectLog {
    runs: u64,
    cleanups: u64,
    /// What its last run saw (`None`: it panicked).
    last: Option<Vec<i64>>,
    /// A cleanup of it panicked, and it has not run since.
    cleanup_failed: bool,
}

#[derive(Debug, Default)]
struct Log {
    effects: std::collections::HashMap<usize, EffectLog>,
    /// Nodes disposed by effects and cleanups, in order.
    disposed: Vec<usize>,
}

fn message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

macro_rules! harness {
    ($flavour:ident, $ctx:ty, $F:ty) => {
        mod $flavour {
            use super::*;
            use egress_reactive::{Computed, Effect, Handle, Scope, Signal};
            use std::sync::{Arc, Mutex};

            #[derive(Clone)]
            enum Node {
                Signal(Signal<i64, $F>),
                Computed(Computed<i64, $F>),
                Effect(Effect<$F>),
                Scope(Arc<Scope<$F>>),
            }

            impl Node {
                fn get(&self) -> i64 {
                    match self {
                        Node::Signal(s) => s.get(),
                        Node::Computed(c) => c.get(),
                        _ => unreachable!("only signals and computeds are read"),
                    }
                }
                fn dispose(&self) {
                    match self {
                        Node::Signal(s) => s.dispose(),
                        Node::Computed(c) => c.dispose(),
                        Node::Effect(e) => e.dispose(),
                        Node::Scope(s) => s.dispose(),
                    }
                }
                fn is_disposed(&self) -> bool {
                    match self {
                        Node::Signal(s) => s.is_disposed(),
                        Node::Computed(c) => c.is_disposed(),
                        Node::Effect(e) => e.is_disposed(),
                        Node::Scope(s) => s.is_disposed(),
                    }
                }
            }

            /// The harness's view of one node.
            struct Info {
                kind: Kind,
                /// The scope it was created in (`None`: shared, or a scope).
                scope: Option<usize>,
                /// For a signal: its value. For a computed: its constant.
                value: i64,
                /// For a computed or an effect: what it reads.
                inputs: Vec<usize>,
                alive: bool,
            }

            /// Every node by id; `None` for an effect being created (its
            /// first run may name itself).
            type Registry = Arc<Mutex<Vec<Option<Node>>>>;

            fn node(registry: &Registry, id: usize) -> Node {
                registry.lock().unwrap()[id].clone().expect("a node made already")
            }

            /// Disposes node `id` from user code, and says so in the log.
            /// (An effect disposing itself in its first run cannot: it has
            /// no handle yet. Its first run ends, it lives.)
            fn dispose_from_user_code(registry: &Registry, log: &Arc<Mutex<Log>>, id: usize) {
                let Some(target) = registry.lock().unwrap().get(id).cloned().flatten() else { return };
                log.lock().unwrap().disposed.push(id);
                target.dispose();
            }

            struct Harness {
                cx: Option<$ctx>,
                h: Handle<$F>,
                registry: Registry,
                log: Arc<Mutex<Log>>,
                infos: Vec<Info>,
                /// Captured by every closure: counts what was not dropped.
                token: Arc<()>,
            }

            impl Harness {
                fn new() -> Self {
                    let cx = <$ctx>::new();
                    let h = cx.handle();
                    let mut me = Harness {
                        cx: Some(cx),
                        h,
                        registry: Arc::default(),
                        log: Arc::default(),
                        infos: Vec::new(),
                        token: Arc::new(()),
                    };
                    for v in 0..SHARED_SIGNALS {
                        me.add_signal(None, v as i64);
                    }
                    for (inputs, k) in SHARED_COMPUTEDS {
                        me.add_computed(None, inputs.to_vec(), k);
                    }
                    me
                }

                fn add_signal(&mut self, scope: Option<usize>, value: i64) -> usize {
                    let s = self.h.signal(value);
                    self.push(Node::Signal(s), Info { kind: Kind::Signal, scope, value, inputs: vec![], alive: true })
                }

                fn add_computed(&mut self, scope: Option<usize>, inputs: Vec<usize>, k: i64) -> usize {
                    let reads: Vec<Node> = inputs.iter().map(|&i| node(&self.registry, i)).collect();
                    let token = self.token.clone();
                    let c = self.h.computed(move || {
                        let _ = &token;
                        let value = reads.iter().map(Node::get).sum::<i64>() + k;
                        assert!(!computed_panics(value), "the computed panics at {value}");
                        value
                    });
                    self.push(Node::Computed(c), Info { kind: Kind::Computed, scope, value: k, inputs, alive: true })
                }

                fn push(&mut self, node: Node, info: Info) -> usize {
                    let id = self.infos.len();
                    let mut registry = self.registry.lock().unwrap();
                    if registry.len() == id {
                        registry.push(Some(node));
                    } else {
                        registry[id] = Some(node);
                    }
                    drop(registry);
                    self.infos.push(info);
                    id
                }

                fn of_kind(&self, kind: Kind) -> Vec<usize> {
                    (0..self.infos.len()).filter(|&i| self.infos[i].kind == kind).collect()
                }

                /// The nodes that may be disposed (not shared), alive or not.
                fn disposable(&self) -> Vec<usize> {
                    (SHARED..self.infos.len()).collect()
                }

                fn pick(&self, of: &[usize], i: usize) -> Option<usize> {
                    (!of.is_empty()).then(|| of[i % of.len()])
                }

                /// From scratch: what reading `id` gives now (`None`: a
                /// panic).
                fn eval(&self, id: usize) -> Option<i64> {
                    let info = &self.infos[id];
                    if !info.alive {
                        return None;
                    }
                    match info.kind {
                        Kind::Signal => Some(info.value),
                        Kind::Computed => {
                            let mut sum = info.value;
                            for &i in &info.inputs {
                                sum += self.eval(i)?;
                            }
                            (!computed_panics(sum)).then_some(sum)
                        }
                        _ => unreachable!(),
                    }
                }

                /// Whether `id` reads (transitively) a disposed node.
                fn tainted(&self, id: usize) -> bool {
                    let info = &self.infos[id];
                    !info.alive || info.inputs.iter().any(|&i| self.tainted(i))
                }

                /// From scratch: what effect `id` sees now (`None`: a panic).
                fn sees(&self, id: usize) -> Option<Vec<i64>> {
                    let values: Option<Vec<i64>> = self.infos[id].inputs.iter().map(|&i| self.eval(i)).collect();
                    values.filter(|v| !effect_panics(v.iter().sum()))
                }

                fn new_scope(&mut self, spec: &ScopeSpec) {
                    let h = self.h.clone();
                    let (scope, ()) = h.scope(|| {});
                    let sid = self.push(
                        Node::Scope(Arc::new(scope)),
                        Info { kind: Kind::Scope, scope: None, value: 0, inputs: vec![], alive: true },
                    );
                    let Node::Scope(scope) = node(&self.registry, sid) else { unreachable!() };
                    let mut locals = Vec::new();
                    let readable = |locals: &[usize], i: usize| {
                        if i < SHARED || locals.is_empty() { i % SHARED } else { locals[(i - SHARED) % locals.len()] }
                    };
                    for &v in &spec.signals {
                        let id = scope.run(|| self.add_signal(Some(sid), v));
                        locals.push(id);
                    }
                    for (inputs, k) in &spec.computeds {
                        let inputs: Vec<usize> = inputs.iter().map(|&i| readable(&locals, i)).collect();
                        let id = scope.run(|| self.add_computed(Some(sid), inputs, *k));
                        locals.push(id);
                    }
                    for e in &spec.effects {
                        let inputs: Vec<usize> = e.inputs.iter().map(|&i| readable(&locals, i)).collect();
                        let id = self.infos.len();
                        let mut targets = self.disposable();
                        targets.push(id);
                        let act = e.act.and_then(|i| self.pick(&targets, i));
                        let cleanup_act = e.cleanup_act.and_then(|i| self.pick(&targets, i));
                        self.log.lock().unwrap().effects.insert(id, EffectLog::default());
                        self.registry.lock().unwrap().push(None);
                        let reads: Vec<Node> = inputs.iter().map(|&i| node(&self.registry, i)).collect();
                        let (log, registry, h, token) =
                            (self.log.clone(), self.registry.clone(), self.h.clone(), self.token.clone());
                        let cleanup_panics = e.cleanup_panics;
                        let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            scope.run(|| {
                                self.h.effect(move || {
                                    let _ = &token;
                                    {
                                        let mut l = log.lock().unwrap();
                                        let me = l.effects.get_mut(&id).unwrap();
                                        me.runs += 1;
                                        me.last = None;
                                        me.cleanup_failed = false;
                                    }
                                    let (log2, registry2) = (log.clone(), registry.clone());
                                    h.on_cleanup(move || {
                                        {
                                            let mut l = log2.lock().unwrap();
                                            let me = l.effects.get_mut(&id).unwrap();
                                            me.cleanups += 1;
                                            // Until it returns: its disposal
                                            // may panic too (a cleanup of
                                            // what it disposes).
                                            me.cleanup_failed = true;
                                        }
                                        if let Some(t) = cleanup_act {
                                            dispose_from_user_code(&registry2, &log2, t);
                                        }
                                        assert!(!cleanup_panics, "the cleanup panics");
                                        log2.lock().unwrap().effects.get_mut(&id).unwrap().cleanup_failed = false;
                                    });
                                    let values: Vec<i64> = reads.iter().map(Node::get).collect();
                                    let sum: i64 = values.iter().sum();
                                    assert!(!effect_panics(sum), "the effect panics at {sum}");
                                    log.lock().unwrap().effects.get_mut(&id).unwrap().last = Some(values);
                                    // (Its disposal may panic: a cleanup of
                                    // what it disposes.)
                                    if let Some(t) = act.filter(|_| effect_acts(sum)) {
                                        dispose_from_user_code(&registry, &log, t);
                                    }
                                })
                            })
                        }));
                        match made {
                            Ok(effect) => {
                                self.push(
                                    Node::Effect(effect),
                                    Info { kind: Kind::Effect, scope: Some(sid), value: 0, inputs, alive: true },
                                );
                            }
                            Err(panic) => {
                                // A first run that panics disposes the
                                // effect (nobody has a handle to it).
                                let m = message(&*panic);
                                let expected =
                                    ["the effect panics", "the computed panics", "the cleanup panics", "disposed"];
                                assert!(expected.iter().any(|e| m.contains(e)), "unexpected panic: {m}");
                                let dead = self.h.signal(0);
                                dead.dispose();
                                self.push(
                                    Node::Signal(dead),
                                    Info { kind: Kind::Effect, scope: Some(sid), value: 0, inputs, alive: false },
                                );
                            }
                        }
                    }
                }

                /// Marks `id` dead, and what it owns.
                fn kill(&mut self, id: usize) {
                    if !self.infos[id].alive {
                        return;
                    }
                    self.infos[id].alive = false;
                    if self.infos[id].kind == Kind::Scope {
                        for i in 0..self.infos.len() {
                            if self.infos[i].scope == Some(id) {
                                self.infos[i].alive = false;
                            }
                        }
                    }
                }

                fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
                    let signals: Vec<usize> = (0..self.infos.len())
                        .filter(|&i| self.infos[i].kind == Kind::Signal && self.infos[i].alive)
                        .collect();
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match op {
                        Op::Write(s, v) => {
                            if let Some(id) = self.pick(&signals, *s) {
                                self.infos[id].value = *v;
                                let Node::Signal(sig) = node(&self.registry, id) else { unreachable!() };
                                sig.set(*v);
                            }
                        }
                        Op::Batch(a, x, b, y) => {
                            let (Some(a), Some(b)) = (self.pick(&signals, *a), self.pick(&signals, *b)) else { return };
                            self.infos[a].value = *x;
                            self.infos[b].value = *y;
                            let (Node::Signal(sa), Node::Signal(sb)) =
                                (node(&self.registry, a), node(&self.registry, b))
                            else {
                                unreachable!()
                            };
                            self.h.batch(|| {
                                sa.set(*x);
                                sb.set(*y);
                            });
                        }
                        Op::Read(_) | Op::DisposeScope(_) | Op::DisposeEffect(_) | Op::DisposeLocal(_) => {}
                        Op::NewScope(spec) => self.new_scope(spec),
                    }));
                    if let Err(panic) = outcome {
                        let m = message(&*panic);
                        let expected = ["the effect panics", "the computed panics", "the cleanup panics", "disposed"];
                        prop_assert!(expected.iter().any(|e| m.contains(e)), "unexpected panic: {}", m);
                    }
                    match op {
                        Op::Read(c) => {
                            let computeds = self.of_kind(Kind::Computed);
                            if let Some(id) = self.pick(&computeds, *c) {
                                let Node::Computed(comp) = node(&self.registry, id) else { unreachable!() };
                                let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| comp.get())).ok();
                                if !self.tainted(id) {
                                    prop_assert_eq!(got, self.eval(id), "computed {} read from outside", id);
                                }
                            }
                        }
                        Op::DisposeScope(i) => {
                            if let Some(id) = self.pick(&self.of_kind(Kind::Scope), *i) {
                                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                    dispose_from_user_code(&self.registry, &self.log, id);
                                }));
                                drop(outcome); // a cleanup's panic reaches the disposer
                            }
                        }
                        Op::DisposeEffect(i) => {
                            if let Some(id) = self.pick(&self.of_kind(Kind::Effect), *i) {
                                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                    dispose_from_user_code(&self.registry, &self.log, id);
                                }));
                                drop(outcome);
                            }
                        }
                        Op::DisposeLocal(i) => {
                            let locals: Vec<usize> = (SHARED..self.infos.len())
                                .filter(|&i| matches!(self.infos[i].kind, Kind::Signal | Kind::Computed))
                                .collect();
                            if let Some(id) = self.pick(&locals, *i) {
                                dispose_from_user_code(&self.registry, &self.log, id);
                            }
                        }
                        _ => {}
                    }
                    // Follow every disposal user code made.
                    let disposed = std::mem::take(&mut self.log.lock().unwrap().disposed);
                    for id in disposed {
                        self.kill(id);
                    }
                    self.check()
                }

                fn check(&self) -> Result<(), TestCaseError> {
                    let registry: Vec<Node> =
                        self.registry.lock().unwrap().iter().map(|n| n.clone().unwrap()).collect();
                    let log = self.log.lock().unwrap().effects.clone();
                    let mut alive = 1; // the root
                    for (id, info) in self.infos.iter().enumerate() {
                        prop_assert_eq!(registry[id].is_disposed(), !info.alive, "node {} ({:?})", id, info.kind);
                        alive += usize::from(info.alive);
                        if info.kind != Kind::Effect {
                            continue;
                        }
                        let e = &log[&id];
                        // One cleanup per run, run once the next run (or the
                        // disposal) came.
                        // (A cleanup that panicked skipped the run it came
                        // before: none is pending until the next run.)
                        let pending = u64::from(info.alive && !e.cleanup_failed);
                        prop_assert_eq!(e.cleanups + pending, e.runs, "effect {} cleanups", id);
                        // Where the evaluation panics, the effect failed (its
                        // run, or the re-validation before it, panicked);
                        // where it does not, the effect ran and saw it.
                        if info.alive
                            && !e.cleanup_failed
                            && !self.tainted(id)
                            && let Some(now) = self.sees(id)
                        {
                            prop_assert_eq!(e.last.as_ref(), Some(&now), "effect {} is up to date", id);
                        }
                    }
                    prop_assert_eq!(self.h.node_count(), alive, "no node leaks");
                    Ok(())
                }

                /// Disposes every scope; then nothing but the shared nodes
                /// is left, and no link; then the context goes, with every
                /// closure.
                fn finish(mut self) -> Result<(), TestCaseError> {
                    let scopes: Vec<usize> =
                        (0..self.infos.len()).filter(|&i| self.infos[i].kind == Kind::Scope).collect();
                    for id in scopes {
                        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            dispose_from_user_code(&self.registry, &self.log, id);
                        }));
                        drop(outcome);
                    }
                    let disposed = std::mem::take(&mut self.log.lock().unwrap().disposed);
                    for id in disposed {
                        self.kill(id);
                    }
                    self.check()?;
                    prop_assert_eq!(self.h.node_count(), 1 + SHARED);
                    // Only links among the shared nodes are left: those of
                    // shared computeds read from outside (an unobserved
                    // computed keeps its dependencies until it is observed
                    // and loses its last observer).
                    let shared_links: usize = SHARED_COMPUTEDS.iter().map(|(inputs, _)| inputs.len()).sum();
                    prop_assert!(self.h.link_count() <= shared_links, "{} links left", self.h.link_count());
                    let nodes = std::mem::take(&mut *self.registry.lock().unwrap());
                    drop(nodes);
                    drop(self.cx.take());
                    prop_assert_eq!(Arc::strong_count(&self.token), 1, "every closure was dropped");
                    Ok(())
                }
            }

            fn case(ops: Vec<Op>) -> Result<(), TestCaseError> {
                let mut harness = Harness::new();
                for op in &ops {
                    harness.step(op)?;
                }
                harness.finish()
            }

            #[test]
            fn random_interleavings_keep_the_graph_consistent() {
                // Expected panics are caught by the harness; keep them quiet.
                let hook = std::panic::take_hook();
                std::panic::set_hook(Box::new(|_| {}));
                // Seeded: the same cases every run. PROPTEST_CASES and
                // INTERLEAVINGS_SEED explore further.
                let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(96);
                let seed: u64 = std::env::var("INTERLEAVINGS_SEED").ok().and_then(|c| c.parse().ok()).unwrap_or(13);
                let mut bytes = [0u8; 32];
                bytes[..8].copy_from_slice(&seed.to_le_bytes());
                let rng =
                    proptest::test_runner::TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &bytes);
                let config = Config { cases, failure_persistence: None, ..Config::default() };
                let mut runner = TestRunner::new_with_rng(config, rng);
                let result = runner.run(&prop::collection::vec(op(), 1..40), |ops| {
                    // Its own thread, so that a hang fails the case.
                    let (tx, rx) = std::sync::mpsc::channel();
                    std::thread::spawn(move || {
                        let _ = tx.send(case(ops));
                    });
                    match rx.recv_timeout(Duration::from_secs(60)) {
                        Ok(result) => result,
                        Err(_) => Err(TestCaseError::fail("a case hung (or its thread died)")),
                    }
                });
                std::panic::set_hook(hook);
                if let Err(e) = result {
                    panic!("{e}");
                }
            }
        }
    };
}

harness!(local, egress_reactive::Context, egress_reactive::Local);
harness!(thread_safe, egress_reactive::ThreadSafeContext, egress_reactive::Threaded);
harness!(async_context, egress_reactive::AsyncContext, egress_reactive::Threaded);
