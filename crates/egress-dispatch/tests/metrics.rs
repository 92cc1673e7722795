//! The dispatcher's metrics through `tracing` (events of target
//! `egress::metrics` with `monotonic_counter.*` and `histogram.*` fields):
//! each outcome counted once, each handler run timed. Alone in its binary:
//! `tracing` caches per call site whether anyone listens.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use egress_core::{DeadLetters, Delay, Policy, Sequence};
use egress_dispatch::{Dispatcher, HandlerError, Handlers, Info};
use egress_reactive::{AsyncContext, AsyncEgressCell};
use egress_testkit::Metrics;
use tracing_subscriber::layer::SubscriberExt as _;

#[tokio::test(start_paused = true)]
async fn each_outcome_is_counted_once_and_each_run_timed() {
    let metrics = Metrics::default();
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(metrics.clone()));
    let cx = AsyncContext::new();
    let policy =
        Policy::builder().inflight_limit(4).retry_base(Delay(10)).dead_letters(DeadLetters::Skip).build().unwrap();
    let cell = AsyncEgressCell::new(&cx, policy);
    let handlers = Handlers::new().handle("n", |n: u64, info: Info| async move {
        match (n, info.attempt) {
            (2, 1) => Err(HandlerError::Transient("once".into())),
            (5, _) => Err(HandlerError::Permanent("never".into())),
            _ => Ok(()),
        }
    });
    let records: Vec<Bytes> = (0..10u64).map(|n| handlers.encode("n", &n).unwrap()).collect();
    let dispatcher = Dispatcher::spawn(&cell, "s", handlers);
    cell.enqueue_all(records);
    egress_testkit::until(
        || (cell.acked_through().get_untracked() == Some(Sequence(9))).then_some(()),
        || format!("acknowledged through {:?}", cell.acked_through().get_untracked()),
    )
    .await;
    let stats = dispatcher.shutdown().await;
    assert_eq!((stats.completed, stats.retried, stats.permanent, stats.skipped), (9, 1, 1, 1), "{stats:?}");
    assert_eq!(metrics.sum("monotonic_counter.egress_dispatch_completed"), 9.0);
    assert_eq!(metrics.sum("monotonic_counter.egress_dispatch_retried"), 1.0);
    assert_eq!(metrics.sum("monotonic_counter.egress_dispatch_permanent"), 1.0);
    assert_eq!(metrics.sum("monotonic_counter.egress_dispatch_skipped"), 1.0);
    assert_eq!(
        metrics.count("histogram.egress_dispatch_handler_seconds"),
        11,
        "every handler run: ten records, one twice"
    );
}
