//! Durable egress on SQLite: what an egress cell enqueues survives a crash
//! of its process, and a restarted producer continues its own sequence
//! space where it stopped.
//!
//! ```text
//!  app ──enqueue──▶ cell (core + journal) ──poll_ready──▶ Relay ──one tx──▶ SQLite
//!   │                  ▲      │ claims only durable records      │
//!   │                  │      └──────▶ transport (egress-ws)      │
//!   │                  └──persisted / persist_failed / adopt──────┘
//!   └──Outbox::append(&tx) inside the app's own transaction ─────▶ SQLite
//! ```
//!
//! The core decides and does no I/O ([`egress_core::EgressCore::restore`],
//! [`poll_ready`](egress_core::EgressCore::poll_ready)); the [`Relay`] is
//! the one task that writes. The rules it keeps:
//!
//! - **R1:** a sequence reaches the wire only after its record is durable
//!   (claims are gated on the journal), so a crash can never bind a sent
//!   sequence to another payload.
//! - **R2:** a generation is durable before a handshake uses it (the
//!   sender waits for [`generation_durable`](egress_reactive::EgressCellOf::generation_durable)).
//! - **R3:** acknowledgements are written lazily, with the next commit; one
//!   lost in a crash costs a replay that the receiver's welcome trims.
//! - **R4:** dead letters are stored with their state, so a tombstone stays
//!   a tombstone (and does not stall a cumulative-ack receiver) across
//!   restarts.
//! - A failed commit is shown ([`persist_error`](egress_reactive::EgressCellOf::persist_error)),
//!   retried with a bounded backoff, and stalls sending rather than losing
//!   anything.
//!
//! On the receiving side, a [`ReceivedLog`] records what the application
//! committed in the application's own transaction, and the reference
//! receiver resumes from it after a restart: it is an
//! [`egress_core::Resume`], the seam below both store and transport, so
//! this crate does not depend on the WebSocket crate.
//!
//! Appends come either from the cell's `enqueue` (the relay writes them
//! in groups) or from an [`Outbox`] inside the application's own
//! transaction (the relay notices the commit and adopts them).

mod lanes;
mod latest;
mod spill;
mod sqlite;
mod stored;

#[cfg(feature = "postgres")]
pub mod postgres;

#[cfg(feature = "relay")]
mod relay;

use std::ops::Range;

use egress_core::{RestoreError, Sequence};

pub use crate::lanes::{LoadedLanes, lane_stream};
pub use crate::latest::LoadedLatest;
#[cfg(feature = "relay")]
pub use crate::relay::{
    Durable, DurableLanes, DurableLatest, JournalStore, LanesJournal, LanesRelay, LatestJournal, LatestRelay, Relay,
    RelayConfig, RelayStats, SqliteJournal, SqliteLanes, SqliteLatest, open_durable, open_durable_lanes,
    open_durable_lanes_raw, open_durable_latest, open_durable_with,
};
pub use crate::spill::SqliteSpill;
pub use crate::sqlite::{Loaded, Outbox, ReceivedLog, SCHEMA_VERSION, SqliteStore, migrate};

impl egress_core::Resume for ReceivedLog {
    fn resume(&self, producer: &str, incarnation: egress_core::Incarnation) -> Result<Option<u64>, String> {
        self.next(producer, incarnation).map_err(|e| e.to_string())
    }
}

/// Why the store could not do what was asked. Nothing was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// SQLite refused (a full disk, an I/O error, a locked database, a
    /// missing table).
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL refused, or the connection failed.
    #[cfg(feature = "postgres")]
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// A pragma the store depends on did not take.
    #[error("pragma {name} is {found}, expected {expected}")]
    Pragma {
        /// The pragma.
        name: &'static str,
        /// What was set.
        expected: String,
        /// What SQLite reports.
        found: String,
    },
    /// The database was written by a newer version of this library.
    #[error("schema version {found} is newer than this library's {supported}")]
    SchemaTooNew {
        /// The database's version.
        found: u32,
        /// The newest this library knows.
        supported: u32,
    },
    /// A number that does not fit where it goes (a stored value that is
    /// negative, or a sequence above `i64::MAX`).
    #[error("{what} out of range: {value}")]
    OutOfRange {
        /// What it is.
        what: &'static str,
        /// Its value.
        value: i128,
    },
    /// The stream's stored counter is not where the appends continue it:
    /// another writer appended to the stream meanwhile.
    #[error("stream {stream}: the stored counter is at {stored}, the appends start at {expected}")]
    Conflict {
        /// The stream.
        stream: String,
        /// The stored next sequence.
        stored: u64,
        /// Where the appends start.
        expected: u64,
    },
    /// Another store loaded the stream since this one did: it is that
    /// store's now, and this one's writes are refused.
    #[error("stream {stream} was taken over by another store")]
    Fenced {
        /// The stream.
        stream: String,
    },
    /// This store never loaded the stream: it writes only streams it has
    /// taken ([`SqliteStore::load`]), so that one store writes a stream.
    #[error("stream {stream} was not loaded by this store: load it first")]
    NotLoaded {
        /// The stream.
        stream: String,
    },
    /// Another transaction holds a row the call needs: the stream's (an
    /// application's append not yet committed) or, with PostgreSQL, its
    /// lease's (a take in progress, or a lock taken by hand). Nothing was
    /// written; try again.
    #[error("stream {stream} is locked by another transaction (an application's append, or a take); try again")]
    Busy {
        /// The stream.
        stream: String,
    },
    /// A PostgreSQL stream without its lease row (every stream gets one
    /// with its own row; this one was deleted by hand): no store can take
    /// it until the row is back, with a lease number above every one the
    /// stream had (a lower one could let an old owner's writes through).
    #[error("stream {stream} has no lease row: no store can take it")]
    NoLease {
        /// The stream.
        stream: String,
    },
    /// The store's connection is gone for good: nothing more can be
    /// written through it (its leases run out; connect again).
    #[error("the store's connection is closed")]
    Closed,
    /// The payloads given do not match the appends of the `Ready`.
    #[error("the Ready appends {expected:?} but {given} payloads were given")]
    Appends {
        /// The appends of the `Ready`.
        expected: Range<Sequence>,
        /// How many payloads came.
        given: usize,
    },
    /// The record is not a dead letter its stream has moved past (no such
    /// record, not dead, or still above the stream's watermark).
    #[error("stream {stream}: no dead letter at or below the watermark at {sequence}")]
    NotDead {
        /// The stream.
        stream: String,
        /// The sequence asked for.
        sequence: Sequence,
    },
    /// The name is of the other kind: a plain stream asked for as lanes
    /// (`lanes` is `None`), or lanes or a lane's stream asked for as a
    /// plain stream (`lanes` names them). Nothing was taken.
    #[error("{stream}: {}", lanes.as_ref().map_or_else(
        || "a plain stream, not lanes".to_owned(),
        |l| format!("belongs to the lanes {l}: take the lanes")))]
    OtherKind {
        /// The name asked for.
        stream: String,
        /// The lanes it belongs to, if any.
        lanes: Option<String>,
    },
    /// On PostgreSQL, where streams, lanes and latest projections share
    /// one namespace: the name is a latest projection's, asked for as a
    /// stream or lanes (`latest` true), or a stream's or lanes', asked for
    /// as a latest projection (`latest` false). Nothing was taken.
    #[error("{name}: {}", if *latest {
        "a latest projection, not a stream or lanes: take it with take_latest"
    } else {
        "a stream or lanes, not a latest projection"
    })]
    LatestKind {
        /// The name asked for.
        name: String,
        /// Whether the name is a latest projection's.
        latest: bool,
    },
    /// A lane key serde cannot write, or a stored one it cannot read as
    /// the lanes' key type.
    #[error("lanes {lanes}: a lane key: {reason}")]
    LaneKey {
        /// The lanes.
        lanes: String,
        /// Serde's reason (with the stored key, when reading).
        reason: String,
    },
    /// A latest projection's key serde cannot write, or a stored one it
    /// cannot read as the projection's key type.
    #[error("latest {name}: a key: {reason}")]
    LatestKey {
        /// The projection.
        name: String,
        /// Serde's reason (with the stored key, when reading).
        reason: String,
    },
    /// A spilled value its codec cannot write (an entry being written:
    /// nothing was) or read (a stored entry, by its id).
    #[error("spill {name}: {}: {error}", id.map_or_else(|| "a value does not encode".to_owned(), |id| format!("entry {id} does not decode")))]
    SpillValue {
        /// The spill's name.
        name: String,
        /// The stored entry's id (`None`: an entry being written).
        id: Option<u64>,
        /// The codec's reason.
        #[source]
        error: egress_codec::CodecError,
    },
    /// A latest projection's value its codec cannot write (`encode`) or
    /// read: nothing was written, or nothing restored.
    #[error("latest {name}: the value of key {key} does not {}: {error}", if *encode { "encode" } else { "decode" })]
    LatestValue {
        /// The projection.
        name: String,
        /// The key, as JSON.
        key: String,
        /// Whether writing (or else reading) failed.
        encode: bool,
        /// The codec's reason.
        #[source]
        error: egress_codec::CodecError,
    },
    /// The values given for a `LatestReady` are not one per write, present
    /// exactly for a `Put` with a newest version: nothing was written.
    #[error("a LatestReady of {writes} writes was given {values} values that do not match them")]
    LatestWrites {
        /// The writes.
        writes: usize,
        /// The values given.
        values: usize,
    },
    /// A stored latest projection breaks the core's rules (more keys than
    /// the policy allows, a desire at or below its frontier).
    #[error("the stored latest projection cannot be restored: {0}")]
    LatestRestore(#[from] egress_core::LatestRestoreError),
    /// The stream has no row.
    #[error("unknown stream {0}")]
    UnknownStream(String),
    /// The stored records break the core's rules (a gap, a record out of
    /// range).
    #[error("the stored stream cannot be restored: {0}")]
    Restore(#[from] RestoreError),
    /// Stored lanes break the core's rules (ordinals out of order or
    /// twice, more lanes than the policy allows, a lane's stream).
    #[error("the stored lanes cannot be restored: {0}")]
    LanesRestore(#[from] egress_core::LanesRestoreError),
    /// A message serde could not encode.
    #[error("encode: {0}")]
    Encode(serde_json::Error),
    /// A payload its codec cannot encode: nothing was written (see
    /// `open_durable_with`).
    #[error("stream {stream}: {} does not encode: {error}", sequence.map_or_else(|| "a payload".to_owned(), |s| format!("record {s}")))]
    Unencodable {
        /// The stream.
        stream: String,
        /// The record's sequence (`None`: an outbox append, refused before
        /// it took one).
        sequence: Option<Sequence>,
        /// The codec's reason.
        #[source]
        error: egress_codec::CodecError,
    },
    /// A stored record its codec cannot read as a `T` (appended with
    /// another encoding): nothing was changed, and the record is kept
    /// (see `open_durable_with`).
    #[error("stream {stream}: record {sequence} does not decode: {error}")]
    Undecodable {
        /// The stream.
        stream: String,
        /// The record's sequence.
        sequence: Sequence,
        /// The codec's reason.
        #[source]
        error: egress_codec::CodecError,
    },
    /// The relay's blocking task panicked or was cancelled.
    #[error("the store's task ended: {0}")]
    Task(String),
    /// An outbox refused a payload above its limit (see
    /// [`Outbox::max_payload`]): nothing was appended.
    #[error("the payload is {size} bytes, above the outbox's limit of {limit}")]
    TooLarge {
        /// The payload's size.
        size: usize,
        /// The outbox's limit.
        limit: usize,
    },
    /// An outbox refused an append past its capacity (see
    /// [`Outbox::capacity`]): the stream holds that many records not yet
    /// acknowledged; nothing was appended. Room comes with
    /// acknowledgements.
    #[error("stream {stream} holds {capacity} unacknowledged records, the outbox's capacity")]
    Full {
        /// The stream.
        stream: String,
        /// The outbox's capacity.
        capacity: u64,
    },
}

/// What an outbox refuses before its append lands: a payload above its
/// limit, an append past its capacity. One rule for [`Outbox`] and the
/// PostgreSQL outbox.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Admission {
    pub(crate) max_payload: Option<usize>,
    pub(crate) capacity: Option<u64>,
}

impl Admission {
    /// Refuses a payload of `size` bytes above the limit.
    pub(crate) fn size(&self, size: usize) -> Result<(), StoreError> {
        match self.max_payload {
            Some(limit) if size > limit => Err(StoreError::TooLarge { size, limit }),
            _ => Ok(()),
        }
    }

    /// Refuses the append that took `sequence` when the records from the
    /// stored watermark `acked` on (the new one included) are more than
    /// the capacity.
    pub(crate) fn room(&self, stream: &str, sequence: u64, acked: Option<u64>) -> Result<(), StoreError> {
        let Some(capacity) = self.capacity else { return Ok(()) };
        let first = acked.map_or(0, |a| a.saturating_add(1));
        if sequence.saturating_sub(first) >= capacity {
            return Err(StoreError::Full { stream: stream.to_owned(), capacity });
        }
        Ok(())
    }

    /// How many more appends fit, with the stored counter at `next` and
    /// the watermark at `acked` (`None`: no capacity).
    pub(crate) fn free(&self, next: u64, acked: Option<u64>) -> Option<u64> {
        let first = acked.map_or(0, |a| a.saturating_add(1));
        self.capacity.map(|c| c.saturating_sub(next.saturating_sub(first)))
    }
}
