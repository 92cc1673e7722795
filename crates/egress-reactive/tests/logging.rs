//! What the cells log (through `tracing`): failed sends at debug, dead
//! letters and store failures at warn, new generations at debug. Alone in
//! its binary: `tracing` caches per call site whether anyone listens, and a
//! test on another thread without a subscriber could make a site here
//! silent.
#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use egress_core::{Delay, Envelope, FailureKind, Generation, Policy};
use egress_reactive::{CellOptions, EgressCellOf, ManualClock, SendError, Transport};

/// Sends what it is given, failing as scripted (`None` succeeds).
#[derive(Clone, Default)]
struct Wire(Arc<Mutex<VecDeque<Option<FailureKind>>>>);

impl Transport<u32> for Wire {
    fn send(&mut self, _: Envelope<u32>) -> Result<(), SendError> {
        match self.0.lock().unwrap().pop_front() {
            Some(Some(kind)) => Err(SendError::new(kind, "scripted failure")),
            _ => Ok(()),
        }
    }
}

/// The events logged on this thread while `f` runs, at debug and above.
fn logged(f: impl FnOnce()) -> String {
    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Log {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("log").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let log = Log::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let log = log.clone();
            move || log.clone()
        })
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    String::from_utf8(log.0.lock().expect("log").clone()).expect("UTF-8")
}

#[test]
fn failures_dead_letters_reconnects_and_store_failures_are_logged() {
    let cx = egress_reactive::Context::new();
    let clock = ManualClock::new();
    let policy = Policy::builder().inflight_limit(8).retry_base(Delay(100)).build().unwrap();
    let options = CellOptions::new().generation(Generation(1)).clock(clock.clone());
    let cell: EgressCellOf<u32, _> = EgressCellOf::with_options(&cx.handle(), policy, options);
    let wire = Wire::default();
    let _link = cell.attach(wire.clone());
    let text = logged(|| {
        // 0 is refused for good (its tombstone goes next, in the same pass),
        // then 1 fails for now.
        wire.0.lock().unwrap().extend([Some(FailureKind::Permanent), None, Some(FailureKind::Transient)]);
        cell.enqueue_all([0, 1]);
        let _ = cell.reconnect(Generation(5));
        let _ = cell.persist_failed(egress_core::Epoch(1), "disk full");
    });
    for (level, event) in [
        ("DEBUG", "egress cell: a send failed, retrying"),
        ("WARN", "egress cell: a dead letter"),
        ("DEBUG", "egress cell: a new generation"),
        ("WARN", "egress cell: the store could not write"),
    ] {
        assert!(text.lines().any(|l| l.contains(level) && l.contains(event)), "{level} {event:?} in:\n{text}");
    }
    assert!(text.contains("disk full"));
    // Nothing is logged for what changes nothing.
    assert_eq!(
        logged(|| {
            let _ = cell.reconnect(Generation(5));
        }),
        ""
    );
}

/// Sends at once, but never completes the send of 2.
struct Stuck(Arc<Mutex<Vec<u64>>>);

impl egress_reactive::AsyncTransport<u32> for Stuck {
    async fn send(&mut self, envelope: Envelope<u32>) -> Result<(), SendError> {
        if envelope.sequence.0 == 2 {
            std::future::pending::<()>().await;
        }
        self.0.lock().unwrap().push(envelope.sequence.0);
        Ok(())
    }
}

#[test]
fn an_effect_panic_in_an_async_pass_that_is_cancelled_is_logged() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let text = logged(|| {
        runtime.block_on(async {
            let cx = egress_reactive::AsyncContext::new();
            let policy = Policy::builder().inflight_limit(8).build().unwrap();
            let cell: egress_reactive::AsyncEgressCell<u32> = egress_reactive::AsyncEgressCell::new(&cx, policy);
            for i in 0..4 {
                cell.enqueue(i);
            }
            let _screen = cx.effect({
                let count = cell.inflight_len().clone();
                move || assert!(count.get() != 3, "the screen cannot show 3")
            });
            let link = cell.attach(Stuck(sent.clone()));
            for _ in 0..20 {
                tokio::task::yield_now().await;
            }
            // The pass waits on 2 for ever, holding the effect's panic for
            // its end; dropping the attachment cancels it instead.
            drop(link);
            for _ in 0..20 {
                tokio::task::yield_now().await;
            }
        });
    });
    assert_eq!(*sent.lock().unwrap(), [0, 1]);
    assert!(
        text.lines().any(|l| l.contains("ERROR")
            && l.contains("which was cancelled")
            && l.contains("the screen cannot show 3")),
        "in:\n{text}"
    );
}
