//! The SQLite store: schema, pragmas, recovery, group commit, and the
//! transactional outbox's append.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use egress_core::{Generation, Incarnation, Ordinal, Ready, Restored, RestoredRecord, Sequence};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::stored::{dead_code, dead_of, fresh_incarnation, incarnation_of, restorable_generation, to_i64, to_u64};
use crate::{Admission, StoreError};

/// The schema, one migration per version: `PRAGMA user_version` counts the
/// ones applied. Never edit a migration that shipped; add one.
const MIGRATIONS: &[&str] = &[
    "
    CREATE TABLE egress_stream (
        stream TEXT PRIMARY KEY NOT NULL,
        incarnation BLOB NOT NULL,
        generation INTEGER NOT NULL,
        next_sequence INTEGER NOT NULL,
        acked_through INTEGER
    ) STRICT;
    CREATE TABLE egress_outbox (
        stream TEXT NOT NULL,
        seq INTEGER NOT NULL,
        payload BLOB NOT NULL,
        dead_reason INTEGER,
        dead_held INTEGER,
        PRIMARY KEY (stream, seq)
    ) STRICT, WITHOUT ROWID;
",
    "
    CREATE TABLE egress_received (
        producer TEXT NOT NULL,
        incarnation BLOB NOT NULL,
        next INTEGER NOT NULL,
        PRIMARY KEY (producer, incarnation)
    ) STRICT, WITHOUT ROWID;
",
    "
    ALTER TABLE egress_stream ADD COLUMN owner BLOB;
",
    "
    CREATE TABLE egress_lanes (
        lanes TEXT PRIMARY KEY NOT NULL,
        incarnation BLOB NOT NULL,
        generation INTEGER NOT NULL,
        next_ordinal INTEGER NOT NULL,
        owner BLOB
    ) STRICT;
    ALTER TABLE egress_stream ADD COLUMN lanes TEXT;
    ALTER TABLE egress_stream ADD COLUMN lane TEXT;
    CREATE INDEX egress_stream_by_lanes ON egress_stream (lanes) WHERE lanes IS NOT NULL;
    ALTER TABLE egress_outbox ADD COLUMN ordinal INTEGER;
",
    "
    CREATE TABLE egress_latest (
        name TEXT PRIMARY KEY NOT NULL,
        generation INTEGER NOT NULL,
        owner BLOB
    ) STRICT;
    CREATE TABLE egress_latest_key (
        name TEXT NOT NULL,
        key TEXT NOT NULL,
        version INTEGER,
        value BLOB,
        durable_through INTEGER,
        PRIMARY KEY (name, key)
    ) STRICT, WITHOUT ROWID;
",
    "
    CREATE TABLE egress_spill_owner (
        name TEXT PRIMARY KEY NOT NULL,
        owner BLOB NOT NULL
    ) STRICT;
    CREATE TABLE egress_spill (
        name TEXT NOT NULL,
        id INTEGER NOT NULL,
        ops INTEGER NOT NULL,
        value BLOB NOT NULL,
        PRIMARY KEY (name, id)
    ) STRICT;
",
];

/// The schema version this library writes.
pub const SCHEMA_VERSION: u32 = 6;

/// Whether `stream`'s row still holds the owner token `mine`.
fn still_owner(conn: &Connection, stream: &str, mine: &[u8; 16]) -> Result<(), StoreError> {
    let owner: Option<Vec<u8>> = conn
        .prepare_cached("SELECT owner FROM egress_stream WHERE stream = ?1")?
        .query_row([stream], |r| r.get(0))
        .optional()?
        .flatten();
    if owner.as_deref() != Some(mine.as_slice()) {
        return Err(StoreError::Fenced { stream: stream.to_owned() });
    }
    Ok(())
}

/// The schema version of the database on `conn` (0: none yet), read
/// without changing anything.
///
/// # Errors
/// [`StoreError::SchemaTooNew`] for a version newer than this library's.
fn schema_version(conn: &Connection) -> Result<u32, StoreError> {
    let version: u32 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let supported = u32::try_from(MIGRATIONS.len()).unwrap_or(u32::MAX);
    if version > supported {
        return Err(StoreError::SchemaTooNew { found: version, supported });
    }
    Ok(version)
}

/// Installs (or upgrades) egress's tables on `conn`, in one transaction:
/// for an application that opens its own connection to the database its
/// business data lives in, before the first
/// [`Outbox::append`](crate::Outbox::append). Idempotent.
///
/// # Errors
/// A database written by a newer version of this library
/// ([`StoreError::SchemaTooNew`]), or SQLite's error.
pub fn migrate(conn: &Connection) -> Result<(), StoreError> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = (|| {
        let version = schema_version(conn)?;
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            conn.execute_batch(sql)?;
            conn.pragma_update(None, "user_version", u32::try_from(i + 1).unwrap_or(u32::MAX))?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => conn.execute_batch("COMMIT")?,
        Err(_) => {
            let _ = conn.execute_batch("ROLLBACK");
        }
    }
    result
}

/// A durable home for egress streams in one SQLite database: WAL,
/// `synchronous=FULL` for the commits that must reach the disk (appends and
/// generations), `NORMAL` for the rest, every write in `BEGIN IMMEDIATE`.
/// The pragmas are read back after being set: a setting SQLite ignored is
/// an error, not a surprise.
///
/// One `SqliteStore` is one connection, the stream's single writer: the
/// relay ([`Relay`](crate::Relay)) owns it and commits each
/// [`Ready`] as one transaction (group commit: everything enqueued while
/// the previous commit ran goes into the next). Applications append from
/// their own connections with [`Outbox`](crate::Outbox).
///
/// Numbers are stored as SQLite integers: the stored next sequence and the
/// generation must stay below 2^63, so the last sequence a stream can take
/// is `i64::MAX - 1`; beyond, the write fails with
/// [`StoreError::OutOfRange`] (the wire protocol caps generations at 2^63
/// already).
///
/// **One writer per stream.** [`load`](Self::load) makes this store the
/// stream's owner (a fresh token in the stream's row); a later `load` by
/// another store (another process, another relay) takes the stream over,
/// and this one's writes are refused from then on
/// ([`StoreError::Fenced`]); a store writes no stream it has not loaded
/// ([`StoreError::NotLoaded`]). So two producers never write one stream.
#[derive(Debug)]
pub struct SqliteStore {
    pub(crate) conn: Connection,
    /// The `synchronous` setting now in force: 2 (FULL) or 1 (NORMAL).
    synchronous: u8,
    data_version: Option<i64>,
    /// The owner token this store wrote into each stream it loaded.
    owned: std::collections::HashMap<String, [u8; 16]>,
    /// The owner token this store wrote into each lanes' row it loaded.
    pub(crate) owned_lanes: std::collections::HashMap<String, [u8; 16]>,
    /// The owner token this store wrote into each latest projection's row
    /// it loaded.
    pub(crate) owned_latest: std::collections::HashMap<String, [u8; 16]>,
}

/// What [`SqliteStore::load`] found for a stream: the incarnation of its
/// sequence space and the snapshot to [`restore`](egress_core::EgressCore::restore)
/// from.
/// Its records are bytes as stored; [`decode`](Self::decode) reads them
/// as the `T`s of a typed cell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loaded<T = Bytes> {
    /// The stream's incarnation, kept for its life: a restarted producer
    /// continues the same sequence space.
    pub incarnation: Incarnation,
    /// The stored state.
    pub restored: Restored<T>,
}

impl Loaded {
    /// The same stream with its records read by `codec` as `T`s.
    ///
    /// # Errors
    /// [`StoreError::Undecodable`] for the first record `codec` cannot
    /// read, with its sequence (`stream` names the stream in it).
    pub fn decode<T: 'static>(self, stream: &str, codec: &dyn egress_codec::Codec<T>) -> Result<Loaded<T>, StoreError> {
        Ok(Loaded {
            incarnation: self.incarnation,
            restored: crate::stored::decode_restored(codec, stream, self.restored)?,
        })
    }

    /// A stream as a store read it: its incarnation, its stored generation,
    /// counter and watermark, and the records above the watermark.
    pub fn new(
        incarnation: Incarnation,
        generation: Generation,
        next_sequence: Sequence,
        acked_through: Option<Sequence>,
        records: Vec<RestoredRecord<Bytes>>,
    ) -> Self {
        Loaded {
            incarnation,
            restored: Restored { generation, next_sequence, acked_through, records, skipped: Vec::new() },
        }
    }
}

/// A stream's stored records above `acked` (with each one's ordinal, `None`
/// outside lanes), and the newest tombstones at or below it: dead letters
/// the receiver skipped, whose status stays dead.
pub(crate) fn stream_records(tx: &Connection, stream: &str, acked: Option<u64>) -> Result<StreamRecords, StoreError> {
    let from = acked.map_or(0, |a| a.saturating_add(1));
    let mut records = Vec::new();
    let mut skipped = Vec::new();
    let mut ordinals = Vec::new();
    {
        // A held flag other than 0 (or 1, excluded) is refused below.
        let mut select = tx.prepare_cached(
            "SELECT seq, dead_reason, dead_held FROM (
                 SELECT seq, dead_reason, dead_held FROM egress_outbox
                 WHERE stream = ?1 AND seq < ?2 AND dead_reason IS NOT NULL AND dead_held IS NOT 1
                 ORDER BY seq DESC LIMIT ?3)
             ORDER BY seq",
        )?;
        let memory = i64::try_from(egress_core::SKIPPED_MEMORY).unwrap_or(i64::MAX);
        let mut rows = select.query(params![stream, to_i64("sequence", from)?, memory])?;
        while let Some(row) = rows.next()? {
            let sequence = Sequence(to_u64("seq", row.get(0)?)?);
            if let Some(mark) = dead_of(row.get(1)?, row.get(2)?)? {
                skipped.push((sequence, mark.reason));
            }
        }
    }
    let mut select = tx.prepare_cached(
        "SELECT seq, payload, dead_reason, dead_held, ordinal FROM egress_outbox
         WHERE stream = ?1 AND seq >= ?2 ORDER BY seq",
    )?;
    let mut rows = select.query(params![stream, to_i64("sequence", from)?])?;
    while let Some(row) = rows.next()? {
        let sequence = Sequence(to_u64("seq", row.get(0)?)?);
        let payload: Vec<u8> = row.get(1)?;
        let dead = dead_of(row.get(2)?, row.get(3)?)?;
        let ordinal: Option<i64> = row.get(4)?;
        ordinals.push(ordinal.map(|o| to_u64("ordinal", o).map(Ordinal)).transpose()?);
        records.push(RestoredRecord { sequence, payload: Bytes::from(payload), dead });
    }
    Ok((records, skipped, ordinals))
}

/// What [`stream_records`] reads: the records, the skipped dead letters,
/// each record's ordinal.
pub(crate) type StreamRecords =
    (Vec<RestoredRecord<Bytes>>, Vec<(Sequence, egress_core::DeadReason)>, Vec<Option<Ordinal>>);

/// Refuses payloads that are not the appends of `ready`, one per sequence
/// in order.
pub(crate) fn check_appends(ready: &Ready, appends: &[(Sequence, Bytes)]) -> Result<(), StoreError> {
    let range = ready.appends.clone();
    let count = range.end.0.saturating_sub(range.start.0);
    if appends.len() as u64 != count || appends.iter().zip(range.start.0..).any(|((s, _), e)| s.0 != e) {
        return Err(StoreError::Appends { expected: range, given: appends.len() });
    }
    Ok(())
}

/// Writes one [`Ready`] of `stream` inside `tx` (see
/// [`SqliteStore::apply`]), each append with its ordinal when `ordinals`
/// (one per append) is given: a lane's.
pub(crate) fn write_ready(
    tx: &Connection,
    stream: &str,
    ready: &Ready,
    appends: &[(Sequence, Bytes)],
    ordinals: Option<&[Ordinal]>,
) -> Result<(), StoreError> {
    let range = ready.appends.clone();
    let next = match stream_row(tx, stream) {
        Ok((_, next, _)) => next,
        Err(StoreError::UnknownStream(_)) => {
            ensure_stream(tx, stream)?;
            stream_row(tx, stream)?.1
        }
        Err(e) => return Err(e),
    };
    // An acknowledgement of a record the stream never held (a core never
    // says one; a stream named wrongly would) is refused, not stored.
    let counter = if range.is_empty() { next } else { range.end.0 };
    if let Some(a) = ready.acked_through.filter(|a| a.0 >= counter) {
        return Err(StoreError::OutOfRange {
            what: "acked_through (at or above the stream's counter)",
            value: a.0.into(),
        });
    }
    if !range.is_empty() {
        if next == range.start.0 {
            let mut insert =
                tx.prepare_cached("INSERT INTO egress_outbox (stream, seq, payload, ordinal) VALUES (?1, ?2, ?3, ?4)")?;
            for (i, (sequence, payload)) in appends.iter().enumerate() {
                let ordinal = ordinals.and_then(|o| o.get(i)).map(|o| to_i64("ordinal", o.0)).transpose()?;
                insert.execute(params![stream, to_i64("sequence", sequence.0)?, payload.as_ref(), ordinal])?;
            }
            tx.prepare_cached("UPDATE egress_stream SET next_sequence = ?2 WHERE stream = ?1")?
                .execute(params![stream, to_i64("sequence", range.end.0)?])?;
        } else {
            return Err(StoreError::Conflict { stream: stream.to_owned(), stored: next, expected: range.start.0 });
        }
    }
    if let Some(g) = ready.generation {
        tx.prepare_cached("UPDATE egress_stream SET generation = MAX(generation, ?2) WHERE stream = ?1")?
            .execute(params![stream, to_i64("generation", g.0)?])?;
    }
    for (sequence, mark) in &ready.dead {
        tx.prepare_cached("UPDATE egress_outbox SET dead_reason = ?3, dead_held = ?4 WHERE stream = ?1 AND seq = ?2")?
            .execute(params![
                stream,
                to_i64("sequence", sequence.0)?,
                mark.map(|m| dead_code(m.reason)),
                mark.map(|m| i64::from(m.held)),
            ])?;
    }
    if let Some(a) = ready.acked_through {
        let a = to_i64("acked_through", a.0)?;
        tx.prepare_cached(
            "UPDATE egress_stream SET acked_through = MAX(COALESCE(acked_through, -1), ?2) WHERE stream = ?1",
        )?
        .execute(params![stream, a])?;
        // Tombstones stay, the newest SKIPPED_MEMORY of them: the
        // receiver skipped them, and their status stays dead across a
        // restart.
        tx.prepare_cached(
            "DELETE FROM egress_outbox WHERE stream = ?1 AND seq <= ?2
             AND (dead_reason IS NULL OR dead_held IS NOT 0)",
        )?
        .execute(params![stream, a])?;
        tx.prepare_cached(
            "DELETE FROM egress_outbox WHERE stream = ?1 AND seq <= ?2 AND seq < (
                 SELECT seq FROM egress_outbox WHERE stream = ?1 AND seq <= ?2
                 ORDER BY seq DESC LIMIT 1 OFFSET ?3)",
        )?
        .execute(params![stream, a, i64::try_from(egress_core::SKIPPED_MEMORY - 1).unwrap_or(i64::MAX)])?;
    }
    Ok(())
}

/// Creates the stream's row if it has none (generation 0, nothing stored).
fn ensure_stream(conn: &Connection, stream: &str) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO egress_stream (stream, incarnation, generation, next_sequence, acked_through)
         VALUES (?1, ?2, 0, 0, NULL) ON CONFLICT (stream) DO NOTHING",
    )?
    .execute(params![stream, fresh_incarnation().as_slice()])?;
    Ok(())
}

/// The stream's row: generation, next sequence, acknowledgement watermark.
fn stream_row(conn: &Connection, stream: &str) -> Result<(u64, u64, Option<u64>), StoreError> {
    let (g, n, a): (i64, i64, Option<i64>) = conn
        .prepare_cached("SELECT generation, next_sequence, acked_through FROM egress_stream WHERE stream = ?1")?
        .query_row([stream], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?
        .ok_or_else(|| StoreError::UnknownStream(stream.to_owned()))?;
    Ok((to_u64("generation", g)?, to_u64("next_sequence", n)?, a.map(|a| to_u64("acked_through", a)).transpose()?))
}

impl SqliteStore {
    /// Opens (or creates) the database at `path`, sets and checks its
    /// pragmas, and installs or upgrades the schema.
    ///
    /// # Errors
    /// SQLite's error; a pragma that did not take ([`StoreError::Pragma`]:
    /// WAL needs a file, not `:memory:`); a schema newer than this library.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        // Before anything changes the file: a database of a newer schema is
        // refused as it is (switching it to WAL would rewrite its header).
        schema_version(&conn)?;
        let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Pragma { name: "journal_mode", expected: "wal".into(), found: mode });
        }
        let mut store = SqliteStore {
            conn,
            synchronous: 0,
            data_version: None,
            owned: std::collections::HashMap::new(),
            owned_lanes: std::collections::HashMap::new(),
            owned_latest: std::collections::HashMap::new(),
        };
        store.set_synchronous(true)?;
        migrate(&store.conn)?;
        Ok(store)
    }

    /// Sets `synchronous` to FULL (`sync`) or NORMAL, and checks it took.
    pub(crate) fn set_synchronous(&mut self, sync: bool) -> Result<(), StoreError> {
        let want: u8 = if sync { 2 } else { 1 };
        if self.synchronous == want {
            return Ok(());
        }
        self.conn.pragma_update(None, "synchronous", want)?;
        let found: u8 = self.conn.query_row("PRAGMA synchronous", [], |r| r.get(0))?;
        if found != want {
            return Err(StoreError::Pragma {
                name: "synchronous",
                expected: want.to_string(),
                found: found.to_string(),
            });
        }
        self.synchronous = want;
        Ok(())
    }

    /// The connection, for reads (and for tests that need to break it).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Loads `stream` for a restart, and takes it over (see the type's
    /// docs): its incarnation and every stored record above its
    /// acknowledgement watermark, in order (a new stream is created, empty,
    /// at generation 0). Every record not yet acknowledged is held in
    /// memory by the core, so this is as large as what is unacknowledged.
    ///
    /// # Errors
    /// SQLite's error, a stored value out of range (a generation at or
    /// above `i64::MAX`, which no handshake could go above), or a name
    /// holding U+001F, which only lanes' streams hold
    /// ([`StoreError::OtherKind`]: a lane is loaded with its lanes).
    pub fn load(&mut self, stream: &str) -> Result<Loaded, StoreError> {
        self.load_then(stream, Ok)
    }

    /// [`load`](Self::load), handing what it read to `restore` inside the
    /// same transaction: the stream is taken over only when `restore`
    /// succeeds. An open that cannot restore (a record its codec cannot
    /// read, records that break the core's rules) changes nothing, and
    /// fences no store that holds the stream.
    ///
    /// # Errors
    /// [`load`](Self::load)'s, and `restore`'s.
    pub fn load_then<R>(
        &mut self,
        stream: &str,
        restore: impl FnOnce(Loaded) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        crate::lanes::plain_name(stream)?;
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        ensure_stream(&tx, stream)?;
        let incarnation: Vec<u8> =
            tx.query_row("SELECT incarnation FROM egress_stream WHERE stream = ?1", [stream], |r| r.get(0))?;
        let incarnation = incarnation_of(&incarnation)?;
        let (generation, next, acked) = stream_row(&tx, stream)?;
        let generation = restorable_generation(generation)?;
        let (records, skipped, _) = stream_records(&tx, stream, acked)?;
        let mut loaded = Loaded::new(incarnation, generation, Sequence(next), acked.map(Sequence), records);
        loaded.restored.skipped = skipped;
        // Dropped without a commit on an error: nothing taken, nothing made.
        let restored = restore(loaded)?;
        let owner = fresh_incarnation();
        tx.prepare_cached("UPDATE egress_stream SET owner = ?2 WHERE stream = ?1")?
            .execute(params![stream, owner.as_slice()])?;
        tx.commit()?;
        self.owned.insert(stream.to_owned(), owner);
        Ok(restored)
    }

    /// Writes one [`Ready`] of `stream` as one transaction: the appends
    /// (`appends`, the payloads of `ready.appends`, in order), the
    /// generation, the dead letters, the acknowledgement watermark with the
    /// records at or below it pruned. Synced to the disk before it returns
    /// when `ready.must_sync`.
    ///
    /// The appends must continue the stream's stored counter: a stream
    /// whose counter moved (an application appended through the
    /// [`Outbox`](crate::Outbox) meanwhile) refuses them with
    /// [`StoreError::Conflict`], and nothing of the transaction is written
    /// (the relay then takes the application's records and renumbers the
    /// cell's, never sent: [`EgressCore::rebase`](egress_core::EgressCore::rebase)).
    /// A stream another store has loaded since this one did is refused
    /// with [`StoreError::Fenced`], one this store never loaded with
    /// [`StoreError::NotLoaded`].
    ///
    /// # Errors
    /// SQLite's error (a full disk, a locked database), a conflict, a
    /// fence, or a number out of range; nothing is written then.
    pub fn apply(&mut self, stream: &str, ready: &Ready, appends: &[(Sequence, Bytes)]) -> Result<(), StoreError> {
        check_appends(ready, appends)?;
        // Every write is the owner's: a stream this store never loaded
        // may be another's (loaded or not), and is refused untouched.
        let Some(mine) = self.owned.get(stream).copied() else {
            return Err(StoreError::NotLoaded { stream: stream.to_owned() });
        };
        self.set_synchronous(ready.must_sync)?;
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        still_owner(&tx, stream, &mine)?;
        write_ready(&tx, stream, ready, appends, None)?;
        tx.commit()?;
        Ok(())
    }

    /// Whether this store still owns `stream`: it loaded it, and no other
    /// store has loaded it since. A relay with nothing to write asks this
    /// to learn of a takeover.
    ///
    /// # Errors
    /// [`StoreError::NotLoaded`], [`StoreError::Fenced`], or SQLite's
    /// error.
    pub fn owns(&self, stream: &str) -> Result<(), StoreError> {
        let Some(mine) = self.owned.get(stream) else {
            return Err(StoreError::NotLoaded { stream: stream.to_owned() });
        };
        still_owner(&self.conn, stream, mine)
    }

    /// Whether another connection committed since the last call (`true` the
    /// first time): SQLite's `PRAGMA data_version`, which a connection's own
    /// commits do not move. Cheap enough to poll.
    ///
    /// # Errors
    /// SQLite's error.
    pub fn changed(&mut self) -> Result<bool, StoreError> {
        let version: i64 = self.conn.query_row("PRAGMA data_version", [], |r| r.get(0))?;
        Ok(self.data_version.replace(version) != Some(version))
    }

    /// Up to `limit` records of `stream` from sequence `from` on, in order:
    /// what applications appended that the cell has not adopted yet.
    ///
    /// # Errors
    /// SQLite's error, or a stored value out of range.
    pub fn appended(
        &mut self,
        stream: &str,
        from: Sequence,
        limit: usize,
    ) -> Result<Vec<(Sequence, Bytes)>, StoreError> {
        let mut select = self.conn.prepare_cached(
            "SELECT seq, payload FROM egress_outbox WHERE stream = ?1 AND seq >= ?2 ORDER BY seq LIMIT ?3",
        )?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut rows = select.query(params![stream, to_i64("sequence", from.0)?, limit])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let payload: Vec<u8> = row.get(1)?;
            out.push((Sequence(to_u64("seq", row.get(0)?)?), Bytes::from(payload)));
        }
        Ok(out)
    }

    /// Checkpoints the WAL into the database file and truncates it, for a
    /// clean close.
    ///
    /// # Errors
    /// SQLite's error.
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        self.conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(())
    }
}

/// Appends to an egress stream from inside the application's own
/// transaction: the record and the stream's counter commit or roll back
/// with the application's writes, so a rolled-back append consumes no
/// sequence and a committed one is durable when the transaction is. The
/// stream's [`Relay`](crate::Relay) notices the commit and adopts the
/// record into its cell.
///
/// A stream takes appends either from its cell's `enqueue` or from an
/// `Outbox`, not both at once: while records enqueued through the cell are
/// not yet durable, an append here moves the counter under them and their
/// write fails with [`StoreError::Conflict`] (shown as the cell's
/// `persist_error`), and nothing is lost or overwritten.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use egress_store::{Outbox, migrate};
///
/// let dir = std::env::temp_dir().join(format!("egress-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let mut conn = rusqlite::Connection::open(dir.join("app.db"))?;
/// migrate(&conn)?;
/// conn.execute_batch("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT)")?;
/// let outbox = Outbox::new("orders");
///
/// let tx = conn.transaction()?;
/// tx.execute("INSERT INTO orders (item) VALUES ('tea')", [])?;
/// let first = outbox.append_json(&tx, &serde_json::json!({"order": "tea"}))?;
/// tx.commit()?;
///
/// let tx = conn.transaction()?;
/// let _ = outbox.append_json(&tx, &serde_json::json!({"order": "cake"}))?;
/// tx.rollback()?; // consumes no sequence
///
/// let tx = conn.transaction()?;
/// let second = outbox.append(&tx, b"raw bytes")?;
/// tx.commit()?;
/// assert_eq!((first.0, second.0), (0, 1));
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outbox {
    stream: String,
    admission: Admission,
}

impl Outbox {
    /// The outbox of `stream`, with no limit on a payload's size and no
    /// capacity.
    pub fn new(stream: impl Into<String>) -> Self {
        Outbox { stream: stream.into(), admission: Admission::default() }
    }

    /// Refuses payloads above `bytes` with [`StoreError::TooLarge`]
    /// (nothing appended): give it the transport's limit (the WebSocket
    /// sender's `max_payload`), so that what could only become a dead
    /// letter is refused inside the caller's transaction.
    #[must_use]
    pub fn max_payload(mut self, bytes: usize) -> Self {
        self.admission.max_payload = Some(bytes);
        self
    }

    /// Refuses an append while the stream holds `records` not yet
    /// acknowledged (counted from the stored watermark, which the relay
    /// writes at its next commit after an acknowledgement) with
    /// [`StoreError::Full`], nothing appended: backpressure inside the
    /// caller's transaction. [`room`](Self::room) says how many fit now;
    /// to wait for room before a transaction, wait on the cell
    /// (`AsyncEgressCell::room` with the same capacity).
    #[must_use]
    pub fn capacity(mut self, records: u64) -> Self {
        self.admission.capacity = Some(records);
        self
    }

    /// How many appends fit now under the [capacity](Self::capacity)
    /// (`None`: no capacity), as the store counts.
    ///
    /// # Errors
    /// SQLite's error, or a stored value out of range.
    pub fn room(&self, conn: &Connection) -> Result<Option<u64>, StoreError> {
        if self.admission.capacity.is_none() {
            return Ok(None);
        }
        let row: Option<(i64, Option<i64>)> = conn
            .query_row(
                "SELECT next_sequence, acked_through FROM egress_stream WHERE stream = ?1",
                [&self.stream],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let (next, acked) = match row {
            Some((next, acked)) => {
                (to_u64("next_sequence", next)?, acked.map(|a| to_u64("acked_through", a)).transpose()?)
            }
            None => (0, None),
        };
        Ok(self.admission.free(next, acked))
    }

    /// The stream's name.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// Appends `payload` on `conn`, which may be a `rusqlite::Transaction`
    /// or `Savepoint` (they dereference to a `Connection`): inside the
    /// caller's transaction, under a savepoint of its own, so that a failed
    /// append leaves the caller's transaction as it was. Outside a
    /// transaction it commits by itself. Returns the sequence assigned.
    ///
    /// # Errors
    /// SQLite's error (the schema missing: call [`migrate`] first), the
    /// counter out of range, a payload above the
    /// [limit](Self::max_payload) ([`StoreError::TooLarge`]) or an append
    /// past the [capacity](Self::capacity) ([`StoreError::Full`]), or a
    /// lane's stream ([`StoreError::OtherKind`]: lanes are written only
    /// through their lanes); nothing is appended then.
    pub fn append(&self, conn: &Connection, payload: &[u8]) -> Result<Sequence, StoreError> {
        crate::lanes::plain_name(&self.stream)?;
        self.admission.size(payload.len())?;
        conn.execute_batch("SAVEPOINT egress_append")?;
        let result = (|| {
            ensure_stream(conn, &self.stream)?;
            let (sequence, acked, lanes): (i64, Option<i64>, Option<String>) = conn.query_row(
                "UPDATE egress_stream SET next_sequence = next_sequence + 1 WHERE stream = ?1
                 RETURNING next_sequence - 1, acked_through, lanes",
                [&self.stream],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
            // A lane's stream is written only through its lanes (its
            // counter is the core's): refused, and taken back below.
            if let Some(lanes) = lanes {
                return Err(StoreError::OtherKind { stream: self.stream.clone(), lanes: Some(lanes) });
            }
            let acked = acked.map(|a| to_u64("acked_through", a)).transpose()?;
            self.admission.room(&self.stream, to_u64("sequence", sequence)?, acked)?;
            conn.execute(
                "INSERT INTO egress_outbox (stream, seq, payload) VALUES (?1, ?2, ?3)",
                params![self.stream, sequence, payload],
            )?;
            Ok(Sequence(to_u64("sequence", sequence)?))
        })();
        match result {
            Ok(_) => {
                conn.execute_batch("RELEASE egress_append")?;
                // Its commit comes later, in the caller's hands: the
                // stream's relay in this process watches closely for it.
                #[cfg(feature = "relay")]
                crate::relay::Appends::of(&self.stream).opened();
            }
            Err(_) => {
                let _ = conn.execute_batch("ROLLBACK TO egress_append; RELEASE egress_append");
            }
        }
        result
    }

    /// Appends `message` as JSON (see [`append`](Self::append)).
    ///
    /// # Errors
    /// A message serde cannot encode, or [`append`](Self::append)'s.
    pub fn append_json<M: serde::Serialize + ?Sized>(
        &self,
        conn: &Connection,
        message: &M,
    ) -> Result<Sequence, StoreError> {
        let payload = serde_json::to_vec(message).map_err(StoreError::Encode)?;
        self.append(conn, &payload)
    }

    /// Appends `value` as `codec` encodes it (see [`append`](Self::append)):
    /// the append of a typed durable cell's stream, whose relay reads the
    /// record back with the same codec (`open_durable_with`).
    ///
    /// # Errors
    /// [`StoreError::Unencodable`] for a value `codec` refuses (nothing is
    /// appended), or [`append`](Self::append)'s.
    pub fn append_encoded<T: 'static>(
        &self,
        conn: &Connection,
        codec: &impl egress_codec::Encode<T>,
        value: &T,
    ) -> Result<Sequence, StoreError> {
        let payload = crate::stored::encode_one(codec, &self.stream, value)?;
        self.append(conn, &payload)
    }
}

/// The receiving application's durable record of what it committed, per
/// producer stream: for exactly once across restarts of the receiver
/// itself, not only of the producer.
///
/// In the transaction that makes a delivery's effect durable, call
/// [`record`](Self::record); commit the transaction, then commit the
/// `egress_ws::Delivery`. Give the receiver the log as its
/// `ReceiverConfig::resume` (the log is an [`egress_core::Resume`]): a stream it does not hold (after its own
/// restart) starts where the log says, so nothing the application
/// committed is handed to it again, whenever the receiver died.
///
/// One row per producer stream, kept until the application deletes it.
#[derive(Debug)]
pub struct ReceivedLog {
    conn: parking_lot::Mutex<Connection>,
}

impl ReceivedLog {
    /// Opens the log in the database at `path` (creating the schema), with
    /// a connection of its own for the receiver's lookups.
    ///
    /// # Errors
    /// As [`SqliteStore::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let store = SqliteStore::open(path)?;
        Ok(ReceivedLog { conn: parking_lot::Mutex::new(store.conn) })
    }

    /// Records, on `conn` (the application's transaction), that every
    /// sequence of `producer`'s stream `incarnation` up to `sequence` is
    /// committed. The record only rises.
    ///
    /// # Errors
    /// SQLite's error (the schema missing: call [`migrate`] first), or a
    /// sequence out of range.
    pub fn record(
        conn: &Connection,
        producer: &str,
        incarnation: Incarnation,
        sequence: u64,
    ) -> Result<(), StoreError> {
        let next = to_i64("sequence", sequence.saturating_add(1))?;
        conn.prepare_cached(
            "INSERT INTO egress_received (producer, incarnation, next) VALUES (?1, ?2, ?3)
             ON CONFLICT (producer, incarnation) DO UPDATE SET next = MAX(next, excluded.next)",
        )?
        .execute(params![producer, incarnation.0.to_be_bytes().as_slice(), next])?;
        Ok(())
    }

    /// The sequence that comes next on `producer`'s stream `incarnation`,
    /// if the log has it.
    ///
    /// # Errors
    /// SQLite's error, or a stored value out of range.
    pub fn next(&self, producer: &str, incarnation: Incarnation) -> Result<Option<u64>, StoreError> {
        let conn = self.conn.lock();
        let next: Option<i64> = conn
            .prepare_cached("SELECT next FROM egress_received WHERE producer = ?1 AND incarnation = ?2")?
            .query_row(params![producer, incarnation.0.to_be_bytes().as_slice()], |r| r.get(0))
            .optional()?;
        next.map(|n| to_u64("next", n)).transpose()
    }
}
