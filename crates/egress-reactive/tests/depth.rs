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

/// A chain whose computeds each hold 16 KiB on the stack while they read
/// the one below: 1,000 levels need at least 16 MiB. The first levels fit the
/// thread's 8 MiB; deeper, evaluation moves to new stack segments before
/// the room left is less than a level needs.
#[test]
fn a_chain_of_computeds_with_large_frames_grows_its_stack() {
    const LEVELS: usize = 1_000;
    const FRAME: usize = 16 * 1024;
    std::thread::Builder::new()
        .stack_size(8 * 1024 * 1024)
        .spawn(|| {
            let cx = egress_reactive::Context::new();
            let head = cx.signal(1u64);
            let mut tail = cx.computed({
                let h = head.clone();
                move || h.get()
            });
            for _ in 1..LEVELS {
                let prev = tail.clone();
                tail = cx.computed(move || {
                    let frame = std::hint::black_box([1u8; FRAME]);
                    prev.get() + u64::from(frame[FRAME - 1])
                });
            }
            assert_eq!(tail.get(), LEVELS as u64);
            head.set(2);
            assert_eq!(tail.get(), LEVELS as u64 + 1);
        })
        .unwrap()
        .join()
        .unwrap();
}
