#![allow(clippy::unwrap_used, clippy::arc_with_non_send_sync)]
//! Errors and panics: disposed reads, cycles, panics inside computeds.

mod common;
use common::Counter;
use egress_reactive::{NodeKind, ReadError, WriteError};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

each_flavour! {
    fn debug_output_names_each_handle_and_where_it_was_made(cx) {
        let line = line!() + 1;
        let (s, c, e) = (cx.signal(1), cx.computed(|| 2), cx.effect(|| {}));
        let site = |shown: String, kind: &str| {
            assert!(shown.starts_with(&format!("{kind} {{ created_at: ")), "{shown}");
            assert!(shown.contains(&format!("file: \"{}\", line: {line}", file!())), "{shown}");
            assert!(shown.ends_with(", .. }"), "{shown}");
        };
        site(format!("{s:?}"), "Signal");
        site(format!("{c:?}"), "Computed");
        site(format!("{e:?}"), "Effect");
        let graph = format!("Handle {{ nodes: {}, links: {} }}", cx.node_count(), cx.link_count());
        assert_eq!(format!("{:?}", cx.handle()), graph);
        assert!(format!("{cx:?}").contains(&graph), "{cx:?}");
    }

    fn reading_a_disposed_node_is_a_typed_error(cx) {
        let s = cx.signal(1);
        let c = cx.computed({ let s = s.clone(); move || s.get() });
        assert_eq!(c.get(), 1);
        c.dispose();
        s.dispose();
        match c.try_get() {
            Err(ReadError::Disposed { kind: NodeKind::Computed, created_at }) => assert_eq!(created_at, c.created_at()),
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(s.try_get(), Err(ReadError::Disposed { kind: NodeKind::Signal, .. })));
        assert!(matches!(s.try_set(2), Err(WriteError::Disposed { .. })));
        let msg = catch_unwind(AssertUnwindSafe(|| s.get())).unwrap_err();
        let msg = msg.downcast_ref::<String>().unwrap();
        assert!(msg.contains("disposed signal created at") && msg.contains("errors.rs"), "{msg}");
    }

    fn handles_outlive_their_context(cx) {
        let s = cx.signal(1);
        drop(cx);
        assert!(matches!(s.try_get(), Err(ReadError::Disposed { .. })));
    }

    fn a_computed_reading_itself_is_a_cycle_error(cx) {
        let slot: Arc<Mutex<Option<egress_reactive::Computed<i32, _>>>> = Arc::new(Mutex::new(None));
        let switch = cx.signal(true);
        let c = cx.computed({
            let (slot, switch) = (slot.clone(), switch.clone());
            move || {
                if switch.get() {
                    let me = slot.lock().unwrap().clone().unwrap();
                    me.get() + 1
                } else {
                    0
                }
            }
        });
        *slot.lock().unwrap() = Some(c.clone());
        match c.try_get() {
            Err(ReadError::Cycle(cycle)) => {
                assert_eq!(cycle.nodes, vec![c.created_at()]);
                assert!(cycle.to_string().contains("cycle"));
            }
            other => panic!("expected a cycle, got {other:?}"),
        }
        // Recovery: break the cycle, the computed works again.
        switch.set(false);
        assert_eq!(c.try_get(), Ok(0));
        *slot.lock().unwrap() = None;
    }

    fn an_indirect_cycle_names_every_node(cx) {
        let slot: Arc<Mutex<Option<egress_reactive::Computed<i32, _>>>> = Arc::new(Mutex::new(None));
        let a = cx.computed({
            let slot = slot.clone();
            move || {
                let b = slot.lock().unwrap().clone().unwrap();
                b.get() + 1
            }
        });
        let b = cx.computed({ let a = a.clone(); move || a.get() + 1 });
        *slot.lock().unwrap() = Some(b.clone());
        match b.try_get() {
            Err(ReadError::Cycle(cycle)) => assert_eq!(cycle.nodes, vec![b.created_at(), a.created_at()]),
            other => panic!("expected a cycle, got {other:?}"),
        }
        *slot.lock().unwrap() = None;
    }

    fn a_panic_in_a_computed_is_not_cached(cx) {
        let a = cx.signal(0);
        let runs = Counter::new();
        let c = cx.computed({
            let (a, r) = (a.clone(), runs.clone());
            move || { r.hit(); let v = a.get(); assert!(v != 1, "one is not allowed"); v * 10 }
        });
        assert_eq!(c.get(), 0);
        a.set(1);
        assert!(catch_unwind(AssertUnwindSafe(|| c.get())).is_err());
        assert!(catch_unwind(AssertUnwindSafe(|| c.get())).is_err(), "the failure is not cached: it runs again");
        assert_eq!(runs.get(), 3);
        a.set(2);
        assert_eq!(c.get(), 20);
        assert_eq!(runs.get(), 4);
    }

    fn a_panicking_effect_does_not_wedge_the_graph(cx) {
        let a = cx.signal(0);
        let seen = cx.signal(0);
        cx.effect({ let (a, s) = (a.clone(), seen.clone()); move || { let v = a.get(); assert!(v != 1, "no ones"); s.set(v); } });
        assert!(catch_unwind(AssertUnwindSafe(|| a.set(1))).is_err());
        a.set(2);
        assert_eq!(seen.get(), 2);
    }
}
