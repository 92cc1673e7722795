//! How a commit's outcome reaches the cell (written, a conflict with the
//! outbox, a rebase), and the synchronous relay of a cell that owns its
//! connection.

use std::sync::Arc;

use bytes::Bytes;
use egress_codec::{Codec, Raw};
use egress_core::{Epoch, Sequence};
use egress_reactive::{CellFlavor, EgressCellOf};
use tokio::sync::watch;

#[cfg(doc)]
use super::open_durable_with;
use super::{Counters, Tally};
use crate::stored::{decode_all, encode_all};
use crate::{SqliteStore, StoreError};

/// Where a relay's commits are told (its counters, and the stored
/// watermark), and how its records become bytes and back.
pub(super) struct Written<T> {
    pub(super) counters: Arc<Counters>,
    pub(super) stored: Arc<watch::Sender<Option<Sequence>>>,
    pub(super) codec: Arc<dyn Codec<T>>,
}

impl<T> Clone for Written<T> {
    fn clone(&self) -> Self {
        Self { counters: self.counters.clone(), stored: self.stored.clone(), codec: self.codec.clone() }
    }
}

/// What a store's answer to one `Ready` means for the cell, reported to it
/// (`persisted`, or `persist_failed`): the one rule behind every store and
/// both relays ([`Relay`], [`SqliteStore::write_journal`]).
pub(super) enum Reported {
    /// Written: this many records appended.
    Written(u64),
    /// Another writer's appends took the sequences from `from` on
    /// (`count` of them): read them and rebase the cell onto them.
    Conflict { from: Sequence, count: usize },
}

pub(super) fn report<T: Clone + 'static, F: CellFlavor<T>>(
    cell: &EgressCellOf<T, F>,
    epoch: Epoch,
    result: Result<(), StoreError>,
    appended: usize,
    tally: Option<&Tally>,
) -> Result<Reported, StoreError> {
    match result {
        Ok(()) => {
            if let Some(tally) = tally {
                tally.committed(appended as u64);
            }
            let _ = cell.persisted(epoch);
            Ok(Reported::Written(appended as u64))
        }
        // Answered once their records are read ([`conflict`]).
        Err(StoreError::Conflict { stored, expected, .. }) if stored > expected => Ok(Reported::Conflict {
            from: Sequence(expected),
            count: usize::try_from(stored - expected).unwrap_or(usize::MAX),
        }),
        Err(e) => {
            if let Some(tally) = tally {
                tally.failed(&e);
            }
            let _ = cell.persist_failed(epoch, e.to_string());
            Err(e)
        }
    }
}

/// Answers a `Ready` the store refused for another writer's appends,
/// `theirs` as read from the store: with them in hand, the cell's
/// unwritten records move behind them; when they cannot be read (the
/// store's error, or a record the codec cannot read), the cell shows that
/// error, not the conflict, and the relay tries again.
pub(super) fn conflict<T: Clone + 'static, F: CellFlavor<T>>(
    cell: &EgressCellOf<T, F>,
    epoch: Epoch,
    theirs: Result<Vec<(Sequence, Bytes)>, StoreError>,
    codec: &dyn Codec<T>,
    stream: &str,
    tally: Option<&Tally>,
) -> Result<(), StoreError> {
    match theirs.and_then(|rows| decode_all(codec, stream, rows)) {
        Ok(theirs) => {
            if let Some(tally) = tally {
                tally.rebased();
            }
            let _ = cell.persist_failed(epoch, "appended by another writer meanwhile");
            rebase(cell, theirs);
            Ok(())
        }
        Err(e) => {
            if let Some(tally) = tally {
                tally.failed(&e);
            }
            let _ = cell.persist_failed(epoch, e.to_string());
            Err(e)
        }
    }
}

/// Moves the cell's unwritten records behind `theirs` (another writer's).
fn rebase<T: Clone + 'static, F: CellFlavor<T>>(cell: &EgressCellOf<T, F>, theirs: Vec<(Sequence, T)>) {
    let outcome = cell.rebase(theirs);
    tracing::info!(?outcome, "egress relay: the cell's appends moved behind the outbox's");
}

impl SqliteStore {
    /// Writes everything `cell`'s journal holds for `stream`, one
    /// transaction per `Ready`, on the calling thread: the relay of a
    /// synchronous cell (a UI thread that owns its connection calls it from
    /// its loop, after enqueues and acks). Returns how many records were
    /// appended. The cell must be over a core restored from this store's
    /// `stream` ([`load`](Self::load)).
    ///
    /// # Errors
    /// The first commit that failed (shown by the cell's `persist_error`;
    /// call again to retry).
    pub fn write_journal<F: CellFlavor<Bytes>>(
        &mut self,
        cell: &EgressCellOf<Bytes, F>,
        stream: &str,
    ) -> Result<u64, StoreError> {
        self.write_journal_with(cell, stream, &Raw)
    }

    /// [`write_journal`](Self::write_journal) for a cell of `T`, whose
    /// records `codec` writes and reads back (see [`open_durable_with`];
    /// restore the cell from [`Loaded::decode`](crate::Loaded::decode)).
    ///
    /// # Errors
    /// [`write_journal`](Self::write_journal)'s, and
    /// [`StoreError::Unencodable`] or [`StoreError::Undecodable`] for a
    /// record `codec` refuses (nothing of that `Ready` is written).
    pub fn write_journal_with<T: Clone + 'static, F: CellFlavor<T>>(
        &mut self,
        cell: &EgressCellOf<T, F>,
        stream: &str,
        codec: &dyn Codec<T>,
    ) -> Result<u64, StoreError> {
        let mut written = 0;
        while let Some((ready, appends)) = cell.poll_ready() {
            let (result, count) = match encode_all(codec, stream, &appends) {
                Ok(bytes) => (self.apply(stream, &ready, &bytes), bytes.len()),
                Err(e) => (Err(e), 0),
            };
            match report(cell, ready.epoch, result, count, None)? {
                Reported::Written(n) => written += n,
                Reported::Conflict { from, count } => {
                    let theirs = self.appended(stream, from, count);
                    conflict(cell, ready.epoch, theirs, codec, stream, None)?;
                }
            }
        }
        Ok(written)
    }
}
