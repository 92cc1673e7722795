#![allow(clippy::unwrap_used)]
//! Propagation and re-validation are iterative: a chain of 100,000
//! computeds is read and updated on a thread with a 2 MiB stack.

const LEN: usize = 100_000;

fn on_small_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new().stack_size(2 * 1024 * 1024).spawn(f).unwrap().join().unwrap();
}

#[test]
fn local_chain_of_100k_on_a_2mib_stack() {
    on_small_stack(|| {
        let cx = egress_reactive::Context::new();
        let head = cx.signal(0u64);
        let mut tail = cx.computed({
            let h = head.clone();
            move || h.get()
        });
        for _ in 1..LEN {
            let prev = tail.clone();
            tail = cx.computed(move || prev.get() + 1);
        }
        // First read: nothing has run; evaluation nests 100,000 deep.
        assert_eq!(tail.get(), LEN as u64 - 1);
        let fx = cx.effect({
            let t = tail.clone();
            move || {
                t.get();
            }
        });
        // Update: propagation marks 100,000 nodes, re-validation walks them.
        head.set(1);
        assert_eq!(tail.get(), LEN as u64);
        assert_eq!(fx.runs(), 2);
        assert_eq!(tail.runs(), 2);
    });
}

#[test]
fn thread_safe_chain_of_100k_on_a_2mib_stack() {
    on_small_stack(|| {
        let cx = egress_reactive::ThreadSafeContext::new();
        let head = cx.signal(0u64);
        let mut tail = cx.computed({
            let h = head.clone();
            move || h.get()
        });
        for _ in 1..LEN {
            let prev = tail.clone();
            tail = cx.computed(move || prev.get() + 1);
        }
        assert_eq!(tail.get(), LEN as u64 - 1);
        head.set(1);
        assert_eq!(tail.get(), LEN as u64);
        // Disposal of the whole chain is iterative too.
        drop(cx);
        assert!(tail.try_get().is_err());
    });
}
