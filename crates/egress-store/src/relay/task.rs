//! The relay's task: group commits, each reported in a task of its own,
//! adoption of what the outbox appended, and the backoff between failures.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use egress_core::{AdoptOutcome, Ready, Sequence};
use egress_reactive::AsyncEgressCell;
use tokio::sync::{Notify, watch};

use super::journal::JournalStore;
use super::report::{Reported, Written, conflict, report};
use super::{Counters, RelayConfig, Tally, commit_in_task};
use crate::StoreError;
use crate::stored::{decode, encode_all};

/// Writes one `Ready` into the store and reports it to the cell, in a task
/// of its own: a relay aborted while the store works (dropped) does not
/// stop the commit from being reported, so the cell never waits for a
/// `Ready` no one will answer.
async fn commit<S: JournalStore, T: Clone + Send + Sync + 'static>(
    store: Arc<tokio::sync::Mutex<S>>,
    cell: AsyncEgressCell<T>,
    ready: Ready,
    appends: Vec<(Sequence, T)>,
    written: Written<T>,
    tally: Tally,
) -> Result<(), StoreError> {
    let Written { stored, codec, .. } = written;
    let mut store = store.lock().await;
    let (result, count) = match encode_all(&*codec, store.stream(), &appends) {
        Ok(bytes) => (store.apply(&ready, &bytes).await, bytes.len()),
        Err(e) => (Err(e), 0),
    };
    let wrote = result.is_ok();
    let reported = report(&cell, ready.epoch, result, count, Some(&tally));
    if wrote && let Some(acked) = ready.acked_through {
        stored.send_if_modified(|s| {
            let raised = s.is_none_or(|s| acked > s);
            if raised {
                *s = Some(acked);
            }
            raised
        });
    }
    match reported? {
        Reported::Written(_) => Ok(()),
        Reported::Conflict { from, count } => {
            let theirs = store.appended(from, count).await;
            conflict(&cell, ready.epoch, theirs, &*codec, store.stream(), Some(&tally))
        }
    }
}

/// Commits one `Ready` if the journal has one. Returns whether it did
/// anything, and the error if the commit failed. The counters are counted
/// before the cell is told (in the commit's task), so whoever sees the
/// cell's state sees them.
async fn write_once<S: JournalStore, T: Clone + Send + Sync + 'static>(
    cell: &AsyncEgressCell<T>,
    store: &Arc<tokio::sync::Mutex<S>>,
    written: &Written<T>,
) -> Option<Result<(), StoreError>> {
    let (ready, appends) = match poll_caught(|| cell.poll_ready(), &written.counters)? {
        Ok(polled) => polled,
        Err(e) => return Some(Err(e)),
    };
    let epoch = ready.epoch;
    let (store, task_cell, written_too) = (store.clone(), cell.clone(), written.clone());
    let commit = |tally| commit(store, task_cell, ready, appends, written_too, tally);
    Some(
        commit_in_task(&written.counters, commit, |why| {
            let _ = cell.persist_failed(epoch, why);
        })
        .await,
    )
}

/// Adopts what applications appended; returns whether a full batch came
/// (there may be more).
async fn adopt<S: JournalStore, T: Clone + Send + Sync + 'static>(
    cell: &AsyncEgressCell<T>,
    store: &tokio::sync::Mutex<S>,
    batch: usize,
    force: bool,
    written: &Written<T>,
) -> Result<bool, StoreError> {
    let counters = &written.counters;
    // From the core, not the reader: the application may have dropped its
    // context (and the readers with it) while the relay goes on.
    if cell.with_core(|c| c.unpersisted_len()) != 0 {
        return Ok(false);
    }
    let from = cell.next_sequence();
    let (rows, stream) = {
        let mut store = store.lock().await;
        let rows = if store.changed().await? || force { store.appended(from, batch).await? } else { Vec::new() };
        (rows, store.stream().to_owned())
    };
    let mut more = rows.len() == batch;
    let mut adopted = 0u64;
    for (sequence, bytes) in rows {
        // A record the codec cannot read stops adoption there, as a record
        // out of order does: the records after it wait, nothing is lost.
        let payload = match decode(&*written.codec, &stream, sequence, &bytes) {
            Ok(payload) => payload,
            Err(e) => {
                tracing::warn!(error = %e, "egress relay: adoption stopped at a record its codec cannot read");
                counters.undecodable.fetch_add(1, Ordering::Relaxed);
                more = false;
                break;
            }
        };
        match cell.adopt(sequence, payload) {
            AdoptOutcome::Adopted { .. } => adopted += 1,
            AdoptOutcome::Unwritten { .. } => {
                more = false;
                break;
            }
            other => {
                tracing::warn!(?other, "egress relay: adoption stopped at a record out of order");
                counters.adoption_stalls.fetch_add(1, Ordering::Relaxed);
                more = false;
                break;
            }
        }
    }
    if adopted > 0 {
        counters.adopted.fetch_add(adopted, Ordering::Relaxed);
        tracing::event!(
            target: "egress::metrics",
            tracing::Level::DEBUG,
            monotonic_counter.egress_relay_adopted = adopted,
            "egress relay: adopted"
        );
    }
    Ok(more)
}

/// Stops the relay for a fenced store (another writer has the stream) or
/// a closed one.
fn fenced(counters: &Counters, why: &StoreError) {
    match why {
        StoreError::Closed => tracing::error!("egress relay: the store's connection closed; stopping"),
        _ => tracing::error!("egress relay: another store took the stream over; stopping"),
    }
    tracing::event!(target: "egress::metrics", tracing::Level::DEBUG, monotonic_counter.egress_relay_fenced = 1u64, "egress relay: fenced");
    counters.fenced.store(true, Ordering::Relaxed);
}

/// After a fence: nothing more is written. `fail_offered` asks the cell
/// for what it would have written next and fails it with why (true when
/// it did): called now, then at each ring of `bell` until it did (or a
/// stop), so the cell shows why once and keeps showing it (no later epoch
/// is persisted) rather than hold what comes next unwritten with no
/// reason. A payload's `Clone` that panics in it ends the wait: the cell
/// failed that epoch itself and shows that.
pub(super) async fn refuse(fail_offered: impl Fn() -> bool, bell: &Notify, stop: &mut watch::Receiver<bool>) {
    loop {
        let rung = bell.notified();
        tokio::pin!(rung);
        rung.as_mut().enable();
        if *stop.borrow() {
            return;
        }
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(&fail_offered)).unwrap_or(true) {
            return;
        }
        tokio::select! {
            () = &mut rung => {}
            _ = stop.changed() => {}
        }
    }
}

/// `poll` (a cell's `poll_ready`), with a payload's `Clone` that panics in
/// it caught: the cell failed that epoch (and shows it), the failure is
/// counted, and the epoch is offered again after the backoff.
pub(super) fn poll_caught<R>(poll: impl FnOnce() -> Option<R>, counters: &Counters) -> Option<Result<R, StoreError>> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(poll)) {
        Ok(polled) => polled.map(Ok),
        Err(panic) => {
            let what = egress_core::panic_message(&*panic).unwrap_or_default();
            let e = StoreError::Task(format!("a payload's Clone panicked: {what}"));
            counters.failed(&e);
            Some(Err(e))
        }
    }
}

pub(super) async fn run<S: JournalStore, T: Clone + Send + Sync + 'static>(
    cell: AsyncEgressCell<T>,
    store: Arc<tokio::sync::Mutex<S>>,
    config: RelayConfig,
    bell: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
    written: Written<T>,
) {
    let counters = written.counters.clone();
    let mut failures: u32 = 0;
    let mut more = true;
    // The loop ends only at a fence (a stop returns from it); its bell wait
    // is dropped by then, so the fence's own wait hears the bell.
    let fence = loop {
        let rung = bell.notified();
        tokio::pin!(rung);
        rung.as_mut().enable();
        if *stop.borrow() {
            while let Some(Ok(())) = write_once(&cell, &store, &written).await {}
            let _ = store.lock().await.close().await;
            return;
        }
        if let Err(e @ (StoreError::Fenced { .. } | StoreError::Closed)) = store.lock().await.keep().await {
            break e;
        }
        match write_once(&cell, &store, &written).await {
            Some(Ok(())) => {
                failures = 0;
                continue;
            }
            Some(Err(e @ (StoreError::Fenced { .. } | StoreError::Closed))) => break e,
            Some(Err(_)) => {
                let wait = backoff(&config, failures);
                failures = failures.saturating_add(1);
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
            None => {}
        }
        match adopt(&cell, &store, config.adopt_batch.max(1), more, &written).await {
            Ok(full) => {
                more = full;
                if full {
                    continue;
                }
            }
            Err(e) => tracing::warn!(error = %e, "egress relay: reading the outbox failed"),
        }
        let news = store.lock().await.news();
        tokio::select! {
            () = &mut rung => {}
            () = news => {}
            () = tokio::time::sleep(config.poll_interval) => {}
            _ = stop.changed() => {}
        }
    };
    fenced(&counters, &fence);
    let fail_offered = || {
        let offered = cell.poll_ready();
        if let Some((ready, _)) = &offered {
            let _ = cell.persist_failed(ready.epoch, format!("{fence}: nothing more is written"));
        }
        offered.is_some()
    };
    refuse(fail_offered, &bell, &mut stop).await;
}

/// `retry_base * 2^failures`, capped at `retry_max`.
pub(super) fn backoff(config: &RelayConfig, failures: u32) -> Duration {
    config.retry_base.saturating_mul(1u32 << failures.min(20)).min(config.retry_max)
}
