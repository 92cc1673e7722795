#![allow(clippy::unwrap_used)]
//! Disposal from inside a computed's evaluation: the computed disposes a
//! node while the graph is running it, and every other observer of the
//! computed still sees the new value. (The reactive-framework suite's case:
//! `s` goes to 1, the computed `a` disposes effect e1 while it evaluates,
//! and the sibling effect e2, which also reads `a`, must show 1.)

mod common;
use std::sync::{Arc, Mutex};

use common::Log;

/// A slot a computed can reach a node through, filled after the node exists.
type Slot<T> = Arc<Mutex<Option<T>>>;

fn slot<T>() -> Slot<T> {
    Arc::new(Mutex::new(None))
}

/// A computed of signal `s` that, when it evaluates to 1, disposes what
/// `victim` holds.
macro_rules! disposing_at_1 {
    ($cx:ident, $s:ident, $victim:ident) => {
        $cx.computed({
            let (s, victim) = ($s.clone(), $victim.clone());
            move || {
                let v = s.get();
                if v == 1
                    && let Some(node) = victim.lock().unwrap().as_ref()
                {
                    node.dispose();
                }
                v
            }
        })
    };
}

each_flavour! {
    fn a_sibling_effect_sees_the_value_when_a_computed_disposes_an_effect_created_before_it(cx) {
        let s = cx.signal(0);
        let victim: Slot<egress_reactive::Effect<_>> = slot();
        let a = disposing_at_1!(cx, s, victim);
        let log = Log::new();
        let e1 = cx.effect({ let (a, log) = (a.clone(), log.clone()); move || log.push(format!("e1 {}", a.get())) });
        *victim.lock().unwrap() = Some(e1.clone());
        cx.effect({ let (a, log) = (a.clone(), log.clone()); move || log.push(format!("e2 {}", a.get())) });
        assert_eq!(log.take(), ["e1 0", "e2 0"]);
        s.set(1);
        assert_eq!(log.take(), ["e2 1"]);
        assert!(e1.is_disposed());
        s.set(2);
        assert_eq!(log.take(), ["e2 2"]);
    }

    fn a_sibling_effect_sees_the_value_when_a_computed_disposes_an_effect_created_after_it(cx) {
        let s = cx.signal(0);
        let victim: Slot<egress_reactive::Effect<_>> = slot();
        let a = disposing_at_1!(cx, s, victim);
        let log = Log::new();
        cx.effect({ let (a, log) = (a.clone(), log.clone()); move || log.push(format!("e2 {}", a.get())) });
        let e1 = cx.effect({ let (a, log) = (a.clone(), log.clone()); move || log.push(format!("e1 {}", a.get())) });
        *victim.lock().unwrap() = Some(e1.clone());
        assert_eq!(log.take(), ["e2 0", "e1 0"]);
        s.set(1);
        assert_eq!(log.take(), ["e2 1"]);
        assert!(e1.is_disposed());
        s.set(2);
        assert_eq!(log.take(), ["e2 2"]);
    }

    fn a_sibling_effect_sees_the_value_when_a_computed_disposes_a_computed(cx) {
        let s = cx.signal(0);
        let victim: Slot<egress_reactive::Computed<i32, _>> = slot();
        let a = disposing_at_1!(cx, s, victim);
        // `c` stands between `a` and e1: e1's re-validation walks through
        // it to `a`, whose run frees `c` under the walk.
        let c = cx.computed({ let a = a.clone(); move || a.get() * 10 });
        *victim.lock().unwrap() = Some(c.clone());
        let log = Log::new();
        let e1 = cx.effect({ let (c, log) = (c.clone(), log.clone()); move || log.push(format!("e1 {:?}", c.try_get().ok())) });
        cx.effect({ let (a, log) = (a.clone(), log.clone()); move || log.push(format!("e2 {}", a.get())) });
        assert_eq!(log.take(), ["e1 Some(0)", "e2 0"]);
        s.set(1);
        let seen = log.take();
        assert!(seen.contains(&"e2 1".to_string()), "e2 missed the update: {seen:?}");
        assert!(c.is_disposed());
        s.set(2);
        assert!(log.take().contains(&"e2 2".to_string()));
        e1.dispose();
    }

    fn a_sibling_effect_sees_the_value_when_a_computed_disposes_an_effect_inside_a_batch(cx) {
        let s = cx.signal(0);
        let other = cx.signal(0);
        let victim: Slot<egress_reactive::Effect<_>> = slot();
        let a = disposing_at_1!(cx, s, victim);
        let log = Log::new();
        let e1 = cx.effect({ let (a, log) = (a.clone(), log.clone()); move || log.push(format!("e1 {}", a.get())) });
        *victim.lock().unwrap() = Some(e1.clone());
        cx.effect({ let (a, log) = (a.clone(), log.clone()); move || log.push(format!("e2 {}", a.get())) });
        let e3 = cx.effect({ let (other, log) = (other.clone(), log.clone()); move || log.push(format!("e3 {}", other.get())) });
        assert_eq!(log.take(), ["e1 0", "e2 0", "e3 0"]);
        cx.batch(|| {
            s.set(7);
            other.set(1);
            s.set(1);
        });
        assert_eq!(log.take(), ["e2 1", "e3 1"]);
        assert!(e1.is_disposed());
        e3.dispose();
    }

    fn a_change_deep_in_the_walk_reaches_a_sibling_when_a_computed_frees_the_walks_start(cx) {
        // s -> b -> a -> {e1, e2}: b's run disposes e1 while e1's
        // re-validation walks through `a` to `b`.
        let s = cx.signal(0);
        let victim: Slot<egress_reactive::Effect<_>> = slot();
        let b = disposing_at_1!(cx, s, victim);
        let a = cx.computed({ let b = b.clone(); move || b.get() + 100 });
        let log = Log::new();
        let e1 = cx.effect({ let (a, log) = (a.clone(), log.clone()); move || log.push(format!("e1 {}", a.get())) });
        *victim.lock().unwrap() = Some(e1.clone());
        cx.effect({ let (a, log) = (a.clone(), log.clone()); move || log.push(format!("e2 {}", a.get())) });
        assert_eq!(log.take(), ["e1 100", "e2 100"]);
        s.set(1);
        assert_eq!(log.take(), ["e2 101"]);
        assert!(e1.is_disposed());
    }
}
