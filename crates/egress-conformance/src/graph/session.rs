// The reactive-graph interpreter for one graph flavour, included once per
// flavour by `graph/mod.rs` with `F` (the flavour) and the context type in
// scope. Everything it shares with the closures it puts in the graph is
// `Send + Sync`, so the same text compiles for `Local` and `Threaded`.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use egress_reactive::{Computed, Effect, Handle, NodeRef, ReadError, Scope, Signal, WriteError};
use serde_json::Value;

use super::{Applied, Failure, GraphSession, failure_name, field_i64, field_str, field_u64, ids};

/// A node a computation reads: a cell or a computed.
#[derive(Clone)]
enum Source {
    Cell(Signal<i64, F>),
    Computed(Computed<i64, F>),
}

impl Source {
    /// Its value, tracked; a disposed node is the run's failure.
    fn value(&self) -> i64 {
        let read = match self {
            Source::Cell(s) => s.try_get(),
            Source::Computed(c) => c.try_get(),
        };
        match read {
            Ok(v) => v,
            Err(ReadError::Disposed { .. }) => resume_unwind(Box::new(Failure::ReadAfterDispose)),
            Err(e) => resume_unwind(Box::new(Failure::Other(e.to_string()))),
        }
    }
}

/// A node of the fixture, by kind.
enum Node {
    Cell(Signal<i64, F>),
    Computed(Computed<i64, F>),
    Effect(Effect<F>),
    /// An eager computed: the computed and the effect that pulls it.
    Signal(Computed<i64, F>, Effect<F>),
}

impl Node {
    fn node_ref(&self) -> &NodeRef<F> {
        match self {
            Node::Cell(s) => s,
            Node::Computed(c) | Node::Signal(c, _) => c,
            Node::Effect(e) => e,
        }
    }
}

/// Pushes the node's id onto the log when the graph drops its function:
/// when the node is freed, in the order the graph frees nodes.
struct Gone {
    id: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Gone {
    fn drop(&mut self) {
        if let Ok(mut log) = self.log.lock() {
            log.push(std::mem::take(&mut self.id));
        }
    }
}

/// One fixture's run on a graph of flavour `F`.
struct Session {
    cx: Handle<F>,
    nodes: HashMap<String, Node>,
    /// The handle each id was last created with, never removed: what
    /// `dispose_stale_handle` disposes through.
    stale: HashMap<String, NodeRef<F>>,
    scopes: HashMap<String, Scope<F>>,
    /// Runs of each computed's or effect's function, from its creation.
    computes: HashMap<String, Arc<AtomicU64>>,
    /// Armed failures of each computed.
    armed: HashMap<String, Arc<AtomicU32>>,
    /// What each effect read last (the sum of its reads).
    seen: HashMap<String, Arc<AtomicI64>>,
    /// The effects that ran, in order, since the op began.
    ran: Arc<Mutex<Vec<String>>>,
    /// Every node freed since the fixture began, in order.
    gone: Arc<Mutex<Vec<String>>>,
    /// Every node by id, for computeds that dispose one while they run
    /// (`disposes`, an extension of our corpus).
    victims: Arc<Mutex<HashMap<String, NodeRef<F>>>>,
    /// What must outlive the session's nodes (the context).
    _keep: Box<dyn std::any::Any>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Session {
    fn new(cx: Handle<F>, keep: Box<dyn std::any::Any>) -> Self {
        Session {
            cx,
            nodes: HashMap::new(),
            stale: HashMap::new(),
            scopes: HashMap::new(),
            computes: HashMap::new(),
            armed: HashMap::new(),
            seen: HashMap::new(),
            ran: Arc::new(Mutex::new(Vec::new())),
            gone: Arc::new(Mutex::new(Vec::new())),
            victims: Arc::new(Mutex::new(HashMap::new())),
            _keep: keep,
        }
    }

    fn source(&self, id: &str) -> Result<Source, String> {
        match self.nodes.get(id) {
            Some(Node::Cell(s)) => Ok(Source::Cell(s.clone())),
            Some(Node::Computed(c) | Node::Signal(c, _)) => Ok(Source::Computed(c.clone())),
            Some(Node::Effect(_)) => Err(format!("{id} is an effect: nothing reads it")),
            None => Err(format!("unknown node {id}")),
        }
    }

    fn sources(&self, op: &Value) -> Result<Vec<Source>, String> {
        ids(op, "reads")?.iter().map(|id| self.source(id)).collect()
    }

    fn counter(&mut self, id: &str) -> Arc<AtomicU64> {
        let counter = Arc::new(AtomicU64::new(0));
        self.computes.insert(id.to_owned(), counter.clone());
        counter
    }

    fn gone(&self, id: &str) -> Gone {
        Gone { id: id.to_owned(), log: self.gone.clone() }
    }

    /// Runs `make` owned by the op's scope (`scope` or `group`), if it names
    /// one.
    fn owned<R>(&self, op: &Value, make: impl FnOnce() -> R) -> Result<R, String> {
        let scope = op.get("scope").or_else(|| op.get("group")).and_then(Value::as_str);
        match scope {
            None => Ok(make()),
            Some(name) => {
                let scope = self.scopes.get(name).ok_or_else(|| format!("unknown scope {name}"))?;
                match scope.try_run(make) {
                    Ok(made) => Ok(made),
                    // An ended scope: the op's failure, not the runner's.
                    Err(e) => resume_unwind(Box::new(Failure::Other(format!("scope {name}: {e}")))),
                }
            }
        }
    }

    fn insert(&mut self, id: &str, node: Node) {
        lock(&self.victims).insert(id.to_owned(), node.node_ref().clone());
        self.stale.insert(id.to_owned(), node.node_ref().clone());
        self.nodes.insert(id.to_owned(), node);
    }

    fn computed(&mut self, op: &Value) -> Result<(), String> {
        let id = field_str(op, "id")?;
        let reads = self.sources(op)?;
        let offset = op.get("offset").map_or(Ok(0), |_| field_i64(op, "offset"))?;
        let runs = self.counter(id);
        let armed = Arc::new(AtomicU32::new(0));
        self.armed.insert(id.to_owned(), armed.clone());
        // `{"disposes": {"id": X, "when": V}}`: a run whose value is V
        // disposes node X (whatever has that id when it runs).
        let disposes = match op.get("disposes") {
            None => None,
            Some(d) => Some((field_str(d, "id")?.to_owned(), field_i64(d, "when")?)),
        };
        let victims = self.victims.clone();
        let gone = self.gone(id);
        let cx = self.cx.clone();
        let computed = self.owned(op, move || {
            cx.computed(move || {
                let _gone = &gone;
                runs.fetch_add(1, Ordering::SeqCst);
                let sum = reads.iter().map(Source::value).fold(offset, i64::wrapping_add);
                if armed.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                    resume_unwind(Box::new(Failure::ComputeFailed));
                }
                if let Some((victim, when)) = &disposes
                    && sum == *when
                {
                    let node = lock(&victims).get(victim).cloned();
                    if let Some(node) = node {
                        node.dispose();
                    }
                }
                sum
            })
        })?;
        self.insert(id, Node::Computed(computed.clone()));
        // Materialized at creation, untracked: its edges exist from now on,
        // as the fixtures' degree counts expect (a lazy computed has none
        // until it first runs). A failure here is the op's error.
        computed.try_get().map_err(|e| e.to_string())?;
        Ok(())
    }

    fn effect(&mut self, op: &Value) -> Result<(), String> {
        let id = field_str(op, "id")?;
        if op.get("merges_into").is_some() {
            return Err(super::unsupported("merges_into (merge cells)"));
        }
        let effect = match op.get("writes_own_cone").and_then(Value::as_str) {
            Some(own) => self.diverging_effect(id, own)?,
            None => {
                let reads = self.sources(op)?;
                let body = self.effect_body(id, reads);
                let cx = self.cx.clone();
                self.owned(op, move || cx.effect(body))?
            }
        };
        self.insert(id, Node::Effect(effect));
        Ok(())
    }

    /// What an effect that reads `reads` runs: it records that it ran and
    /// what it saw.
    fn effect_body(&mut self, id: &str, reads: Vec<Source>) -> impl FnMut() + 'static {
        let runs = self.counter(id);
        let seen = Arc::new(AtomicI64::new(0));
        self.seen.insert(id.to_owned(), seen.clone());
        let (ran, gone, name) = (self.ran.clone(), self.gone(id), id.to_owned());
        move || {
            let _gone = &gone;
            runs.fetch_add(1, Ordering::SeqCst);
            lock(&ran).push(name.clone());
            let sum = reads.iter().map(Source::value).fold(0, i64::wrapping_add);
            seen.store(sum, Ordering::SeqCst);
        }
    }

    /// An effect that reads cell `own` and, each time a change makes it
    /// run again, writes it plus one: a feedback loop through the
    /// scheduler, which only the flush's round limit stops. (Its first run,
    /// at creation, writes nothing: the loop is kicked by a write.)
    fn diverging_effect(&mut self, id: &str, own: &str) -> Result<Effect<F>, String> {
        let Some(Node::Cell(cell)) = self.nodes.get(own) else {
            return Err(format!("writes_own_cone: {own} is not a cell"));
        };
        let cell = cell.clone();
        let runs = self.counter(id);
        let (ran, gone, name) = (self.ran.clone(), self.gone(id), id.to_owned());
        Ok(self.cx.effect(move || {
            let _gone = &gone;
            let first = runs.fetch_add(1, Ordering::SeqCst) == 0;
            lock(&ran).push(name.clone());
            let value = Source::Cell(cell.clone()).value();
            if !first {
                cell.set(value.wrapping_add(1));
            }
        }))
    }

    /// An eager computed: a computed and an effect that pulls it, so it is
    /// computed at creation and again at the end of every write (or batch)
    /// that changes what it reads, read or not.
    fn signal(&mut self, op: &Value) -> Result<(), String> {
        let id = field_str(op, "id")?;
        let reads = self.sources(op)?;
        let offset = op.get("offset").map_or(Ok(0), |_| field_i64(op, "offset"))?;
        let runs = self.counter(id);
        let computed = self.cx.computed(move || {
            runs.fetch_add(1, Ordering::SeqCst);
            reads.iter().map(Source::value).fold(offset, i64::wrapping_add)
        });
        let pulled = Source::Computed(computed.clone());
        let puller = self.cx.effect(move || {
            pulled.value();
        });
        self.insert(id, Node::Signal(computed, puller));
        Ok(())
    }

    fn set_cell(&self, id: &str, value: i64) -> Result<Option<WriteError>, String> {
        match self.nodes.get(id) {
            Some(Node::Cell(s)) => Ok(s.try_set(value).err()),
            _ => Err(format!("set_cell: {id} is not a cell")),
        }
    }

    fn read_node(&self, id: &str) -> Result<Result<i64, Failure>, String> {
        let read = match self.nodes.get(id) {
            Some(Node::Cell(s)) => s.try_get(),
            Some(Node::Computed(c) | Node::Signal(c, _)) => {
                match catch_unwind(AssertUnwindSafe(|| c.try_get())) {
                    Ok(read) => read,
                    Err(panic) => return Ok(Err(Failure::of(panic))),
                }
            }
            Some(Node::Effect(_)) => return Ok(Ok(self.seen.get(id).map_or(0, |v| v.load(Ordering::SeqCst)))),
            None => return Err(format!("read of unknown node {id}")),
        };
        Ok(read.map_err(|e| match e {
            ReadError::Disposed { .. } => Failure::ReadAfterDispose,
            other => Failure::Other(other.to_string()),
        }))
    }

    /// Applies one op (no panic escapes: it is the op's error).
    fn step(&mut self, op: &Value, applied: &mut Applied) -> Result<(), String> {
        let kind = field_str(op, "type")?;
        match kind {
            "cell" => {
                let id = field_str(op, "id")?;
                let value = field_i64(op, "value")?;
                let cx = self.cx.clone();
                let cell = self.owned(op, move || cx.signal(value))?;
                self.insert(id, Node::Cell(cell));
            }
            "computed" => self.computed(op)?,
            "effect" => {
                self.effect(op)?;
                let id = field_str(op, "id")?;
                applied.value = self.seen.get(id).map(|v| v.load(Ordering::SeqCst));
            }
            "signal" => {
                self.signal(op)?;
                match self.read_node(field_str(op, "id")?)? {
                    Ok(v) => applied.value = Some(v),
                    Err(failure) => applied.error = Some(failure_name(&failure)),
                }
            }
            "dispose_signal" => match self.nodes.get(field_str(op, "id")?) {
                Some(Node::Signal(_, puller)) => puller.dispose(),
                _ => return Err("dispose_signal: not a signal".into()),
            },
            "read" => match self.read_node(field_str(op, "id")?)? {
                Ok(v) => applied.value = Some(v),
                Err(failure) => applied.error = Some(failure_name(&failure)),
            },
            "set_cell" => {
                if let Some(e) = self.set_cell(field_str(op, "id")?, field_i64(op, "value")?)? {
                    match e {
                        WriteError::Loop(_) => applied.drain_exhausted = true,
                        other => applied.error = Some(other.to_string()),
                    }
                }
            }
            "batch" => {
                if op.get("merges").is_some() {
                    return Err(super::unsupported("batch merges (merge cells)"));
                }
                let mut writes = Vec::new();
                for w in op.get("writes").and_then(Value::as_array).into_iter().flatten() {
                    writes.push((field_str(w, "id")?.to_owned(), field_i64(w, "value")?));
                }
                let nested: Vec<Value> = op.get("ops").and_then(Value::as_array).cloned().unwrap_or_default();
                let cx = self.cx.clone();
                let mut inner = Ok(());
                let outcome = cx.try_batch(|| {
                    for (id, value) in &writes {
                        if let Err(e) = self.set_cell(id, *value) {
                            inner = Err(e);
                            return;
                        }
                    }
                    for op in &nested {
                        if let Err(e) = self.step(op, applied) {
                            inner = Err(e);
                            return;
                        }
                    }
                });
                inner?;
                if outcome.is_err() {
                    applied.drain_exhausted = true;
                }
            }
            "dispose" => {
                let node = self.nodes.get(field_str(op, "id")?).ok_or("dispose of an unknown node")?;
                match node {
                    Node::Signal(c, puller) => {
                        puller.dispose();
                        c.dispose();
                    }
                    other => other.node_ref().dispose(),
                }
            }
            "dispose_stale_handle" => {
                let of = field_str(op, "handle_of")?;
                self.stale.get(of).ok_or_else(|| format!("no handle of {of}"))?.dispose();
            }
            "fail_next" => {
                let id = field_str(op, "id")?;
                let count = u32::try_from(field_u64(op, "count")?).map_err(|_| "fail_next: count above u32")?;
                self.armed.get(id).ok_or_else(|| format!("fail_next: {id} is not a computed"))?.store(count, Ordering::SeqCst);
            }
            "begin_scope" | "begin_group" => {
                let name = field_str(op, if kind == "begin_scope" { "scope" } else { "group" })?;
                let (scope, ()) = self.cx.scope(|| ());
                self.scopes.insert(name.to_owned(), scope);
            }
            "end_scope" | "end_group" => {
                let name = field_str(op, if kind == "end_scope" { "scope" } else { "group" })?;
                self.scopes.get(name).ok_or_else(|| format!("unknown scope {name}"))?.dispose();
            }
            "disarm" | "cancel_teardown" => {
                let name = field_str(op, if kind == "disarm" { "scope" } else { "group" })?;
                self.scopes.get(name).ok_or_else(|| format!("unknown scope {name}"))?.disarm();
            }
            "fanout" => {
                let prefix = field_str(op, "id_prefix")?;
                for i in 0..field_u64(op, "count")? {
                    let reads = self.sources(op)?;
                    let id = format!("{prefix}_{i}");
                    let body = self.effect_body(&id, reads);
                    let effect = self.cx.effect(body);
                    self.insert(&id, Node::Effect(effect));
                }
            }
            "dispose_fanout" => {
                let prefix = field_str(op, "id_prefix")?;
                for i in 0..field_u64(op, "count")? {
                    if let Some(node) = self.nodes.get(&format!("{prefix}_{i}")) {
                        node.node_ref().dispose();
                    }
                }
            }
            "churn" => self.churn(op)?,
            "merge_cell" => return Err(super::unsupported("merge_cell (merge cells)")),
            "subscribe" | "unsubscribe" => return Err(super::unsupported("cell observers (subscribe)")),
            other => return Err(format!("unknown op {other:?}")),
        }
        Ok(())
    }

    /// `dispose_then_create`: each cycle disposes one of the `live_width`
    /// subscribers `{prefix}_{k}` and makes its replacement under the same
    /// id. `scope_per_cycle`: each cycle makes one subscriber in a scope of
    /// its own and ends the scope.
    fn churn(&mut self, op: &Value) -> Result<(), String> {
        let source = self.source(field_str(op, "source")?)?;
        let prefix = field_str(op, "id_prefix")?;
        let width = field_u64(op, "live_width")?.max(1);
        for cycle in 0..field_u64(op, "cycles")? {
            match field_str(op, "mode")? {
                "dispose_then_create" => {
                    let id = format!("{prefix}_{}", cycle % width);
                    if let Some(node) = self.nodes.get(&id) {
                        node.node_ref().dispose();
                    }
                    let body = self.effect_body(&id, vec![source.clone()]);
                    let effect = self.cx.effect(body);
                    self.insert(&id, Node::Effect(effect));
                }
                "scope_per_cycle" => {
                    let id = format!("{prefix}_{cycle}");
                    let body = self.effect_body(&id, vec![source.clone()]);
                    let cx = self.cx.clone();
                    let (scope, effect) = cx.scope(|| cx.effect(body));
                    self.insert(&id, Node::Effect(effect));
                    scope.dispose();
                }
                other => return Err(format!("churn: unknown mode {other:?}")),
            }
        }
        Ok(())
    }
}

impl GraphSession for Session {
    fn apply(&mut self, op: &Value) -> Result<Applied, String> {
        lock(&self.ran).clear();
        let mut applied = Applied::default();
        match catch_unwind(AssertUnwindSafe(|| self.step(op, &mut applied))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(panic) => applied.error = Some(failure_name(&Failure::of(panic))),
        }
        applied.ran = std::mem::take(&mut *lock(&self.ran));
        Ok(applied)
    }

    fn computes(&self, id: &str) -> Option<u64> {
        self.computes.get(id).map(|c| c.load(Ordering::SeqCst))
    }

    fn dependents(&self, id: &str) -> Option<usize> {
        self.nodes.get(id).map(|n| n.node_ref().subscriber_count())
    }

    fn dependencies(&self, id: &str) -> Option<usize> {
        self.nodes.get(id).map(|n| n.node_ref().dependency_count())
    }

    fn readable(&self, id: &str) -> Option<bool> {
        self.nodes.get(id).map(|n| !n.node_ref().is_disposed())
    }

    fn read(&mut self, id: &str) -> Result<Result<i64, String>, String> {
        Ok(self.read_node(id)?.map_err(|f| failure_name(&f)))
    }

    fn scope_owned(&self, scope: &str) -> Option<usize> {
        self.scopes.get(scope).map(Scope::owned_count)
    }

    fn cleanup_order(&self) -> Vec<String> {
        lock(&self.gone).clone()
    }
}

/// A session on graph `cx`; `keep` is what must outlive it.
pub(crate) fn start(cx: Handle<F>, keep: Box<dyn std::any::Any>) -> Box<dyn GraphSession> {
    Box::new(Session::new(cx, keep))
}
