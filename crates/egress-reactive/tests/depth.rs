#![allow(clippy::unwrap_used)]
//! Propagation and re-validation are iterative: a chain of 100,000
//! computeds is read and updated on a thread with a 2 MiB stack.

const LEN: usize = 100_000;

fn on_small_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new().stack_size(2 * 1024 * 1024).spawn(f).unwrap().join().unwrap();
}

/// Builds the chain, reads it (evaluation nests 100,000 deep on first read),
/// updates its head (propagation marks 100,000 nodes, re-validation walks
/// them), then disposes it with its context (disposal walks it too).
macro_rules! chain_test {
    ($name:ident, $cx:expr) => {
        #[test]
        fn $name() {
            on_small_stack(|| {
                let cx = $cx;
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
                let fx = cx.effect({
                    let t = tail.clone();
                    move || {
                        t.get();
                    }
                });
                head.set(1);
                assert_eq!(tail.get(), LEN as u64);
                assert_eq!((fx.runs(), tail.runs()), (2, 2));
                drop(cx);
                assert!(tail.try_get().is_err());
            });
        }
    };
}

chain_test!(local_chain_of_100k_on_a_2mib_stack, egress_reactive::Context::new());
chain_test!(thread_safe_chain_of_100k_on_a_2mib_stack, egress_reactive::ThreadSafeContext::new());
