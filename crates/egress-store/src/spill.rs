//! [`SqliteSpill`]: a relay cell's pages on SQLite
//! ([`Overflow::Spill`](egress_core::Overflow::Spill)).

use std::path::Path;
use std::sync::Arc;

use egress_codec::{Codec, guarded};
use egress_core::SpillPage;
use rusqlite::{OptionalExtension, TransactionBehavior, params};

use crate::stored::{fresh_incarnation, to_i64, to_u64};
use crate::{SqliteStore, StoreError};

/// A relay cell's spill store on SQLite: an ordered log of entries under
/// a name, each a value its codec wrote, with how many ops it folds.
/// Hand it to `RelayCellOf::spilling` (it is egress-reactive's
/// `SpillStore`).
///
/// - **A page is one transaction**: written whole or not at all, durable
///   (`synchronous = FULL`) when the append returns.
/// - **One writer per name**: opening takes the name over (a fresh owner
///   token); a store that opened it before writes it no more
///   ([`StoreError::Fenced`]), so two processes never interleave pages.
/// - **Bounded by what is not yet acknowledged**: entries are deleted from
///   the front as the stream acknowledges them; the file keeps its pages
///   for SQLite to reuse.
///
/// ```
/// use egress_codec::Json;
/// use egress_store::SqliteSpill;
///
/// let dir = std::env::temp_dir().join(format!("egress-spill-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let spill: SqliteSpill<Vec<u32>> = SqliteSpill::open(dir.join("spill.db"), "log", Json)?;
/// assert_eq!(spill.name(), "log");
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SqliteSpill<T> {
    store: SqliteStore,
    name: String,
    owner: [u8; 16],
    codec: Arc<dyn Codec<T>>,
    /// The id the next entry takes.
    next_id: u64,
}

impl<T> std::fmt::Debug for SqliteSpill<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteSpill").field("name", &self.name).field("next_id", &self.next_id).finish_non_exhaustive()
    }
}

impl<T: 'static> SqliteSpill<T> {
    /// Opens (or creates) the database at `path` and takes the spill
    /// `name` over.
    ///
    /// # Errors
    /// [`SqliteStore::open`]'s, and [`new`](Self::new)'s.
    pub fn open(path: impl AsRef<Path>, name: &str, codec: impl Codec<T>) -> Result<Self, StoreError> {
        Self::new(SqliteStore::open(path)?, name, codec)
    }

    /// Takes the spill `name` over in `store`'s database (a fresh owner
    /// token: a store that held it writes it no more).
    ///
    /// # Errors
    /// SQLite's error; a stored id out of range.
    pub fn new(mut store: SqliteStore, name: &str, codec: impl Codec<T>) -> Result<Self, StoreError> {
        let owner = fresh_incarnation();
        let tx = store.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.prepare_cached(
            "INSERT INTO egress_spill_owner (name, owner) VALUES (?1, ?2)
             ON CONFLICT (name) DO UPDATE SET owner = excluded.owner",
        )?
        .execute(params![name, owner.as_slice()])?;
        let newest: Option<i64> =
            tx.query_row("SELECT max(id) FROM egress_spill WHERE name = ?1", [name], |r| r.get(0))?;
        let next_id = match newest {
            Some(id) => to_u64("spill id", id)?
                .checked_add(1)
                .ok_or(StoreError::OutOfRange { what: "spill id", value: i128::from(id) })?,
            None => 0,
        };
        tx.commit()?;
        Ok(SqliteSpill { store, name: name.to_owned(), owner, codec: Arc::new(codec), next_id })
    }

    /// The spill's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ops the stored entries with an id above `after` fold (every
    /// entry's, with `None`).
    ///
    /// # Errors
    /// SQLite's error; a stored count out of range.
    pub fn stored_ops(&self, after: Option<u64>) -> Result<u64, StoreError> {
        let after = match after {
            Some(id) => to_i64("spill id", id)?,
            None => -1,
        };
        let ops: i64 = self.store.conn.query_row(
            "SELECT coalesce(sum(ops), 0) FROM egress_spill WHERE name = ?1 AND id > ?2",
            params![self.name, after],
            |r| r.get(0),
        )?;
        to_u64("spilled ops", ops)
    }

    /// How many entries are stored.
    ///
    /// # Errors
    /// SQLite's error.
    pub fn stored_entries(&self) -> Result<u64, StoreError> {
        let n: i64 =
            self.store
                .conn
                .query_row("SELECT count(*) FROM egress_spill WHERE name = ?1", [&self.name], |r| r.get(0))?;
        to_u64("spilled entries", n)
    }

    /// Appends `page`'s entries in one transaction, after every entry
    /// appended before.
    ///
    /// # Errors
    /// SQLite's error (nothing written); a value the codec cannot write
    /// ([`StoreError::SpillValue`], nothing written); the name taken over
    /// by another store ([`StoreError::Fenced`]).
    pub fn append(&mut self, page: &SpillPage<T>) -> Result<(), StoreError> {
        let mut rows = Vec::with_capacity(page.entries().len());
        for entry in page.entries() {
            let bytes = guarded(|| self.codec.encode(&entry.value)).map_err(|error| StoreError::SpillValue {
                name: self.name.clone(),
                id: None,
                error,
            })?;
            rows.push((to_i64("spill ops", entry.ops)?, bytes));
        }
        let tx = self.store.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        still_owner(&tx, &self.name, &self.owner)?;
        let mut id = self.next_id;
        {
            let mut insert =
                tx.prepare_cached("INSERT INTO egress_spill (name, id, ops, value) VALUES (?1, ?2, ?3, ?4)")?;
            for (ops, bytes) in &rows {
                insert.execute(params![self.name, to_i64("spill id", id)?, ops, bytes.as_ref()])?;
                id += 1;
            }
        }
        tx.commit()?;
        self.next_id = id;
        Ok(())
    }

    /// At most `max` stored entries with an id above `after` (all, with
    /// `None`), oldest first, as `(id, value, ops)`.
    ///
    /// # Errors
    /// SQLite's error; a stored value the codec cannot read
    /// ([`StoreError::SpillValue`]); a stored id or count out of range (an
    /// entry of 0 ops); the name taken over by another store
    /// ([`StoreError::Fenced`]: what it holds is the new owner's).
    pub fn read(&self, after: Option<u64>, max: usize) -> Result<Vec<(u64, T, u64)>, StoreError> {
        still_owner(&self.store.conn, &self.name, &self.owner)?;
        let after = match after {
            Some(id) => to_i64("spill id", id)?,
            None => -1,
        };
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        let mut select = self.store.conn.prepare_cached(
            "SELECT id, ops, value FROM egress_spill WHERE name = ?1 AND id > ?2 ORDER BY id LIMIT ?3",
        )?;
        let rows = select.query_map(params![self.name, after, max], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, bytes::Bytes::from(r.get::<_, Vec<u8>>(2)?)))
        })?;
        let mut entries = Vec::new();
        for row in rows {
            let (id, ops, bytes) = row?;
            let id = to_u64("spill id", id)?;
            let ops = to_u64("spill ops", ops)?;
            if ops == 0 {
                return Err(StoreError::OutOfRange { what: "spill ops (an entry folds at least one)", value: 0 });
            }
            let value = guarded(|| self.codec.decode(&bytes)).map_err(|error| StoreError::SpillValue {
                name: self.name.clone(),
                id: Some(id),
                error,
            })?;
            entries.push((id, value, ops));
        }
        Ok(entries)
    }

    /// Deletes every stored entry with an id at or below `id`.
    ///
    /// # Errors
    /// SQLite's error (nothing deleted); the name taken over by another
    /// store ([`StoreError::Fenced`]).
    pub fn reclaim_through(&mut self, id: u64) -> Result<(), StoreError> {
        let id = i64::try_from(id).unwrap_or(i64::MAX);
        let tx = self.store.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        still_owner(&tx, &self.name, &self.owner)?;
        tx.prepare_cached("DELETE FROM egress_spill WHERE name = ?1 AND id <= ?2")?.execute(params![self.name, id])?;
        tx.commit()?;
        Ok(())
    }
}

/// Whether the spill `name` is still ours (`mine`).
fn still_owner(conn: &rusqlite::Connection, name: &str, mine: &[u8; 16]) -> Result<(), StoreError> {
    let owner: Option<Vec<u8>> = conn
        .prepare_cached("SELECT owner FROM egress_spill_owner WHERE name = ?1")?
        .query_row([name], |r| r.get(0))
        .optional()?;
    if owner.as_deref() != Some(mine.as_slice()) {
        return Err(StoreError::Fenced { stream: name.to_owned() });
    }
    Ok(())
}

#[cfg(feature = "relay")]
impl<T: 'static> egress_reactive::SpillStore<T> for SqliteSpill<T> {
    fn stored_ops(&mut self, after: Option<u64>) -> Result<u64, egress_reactive::SpillError> {
        Ok(SqliteSpill::stored_ops(self, after)?)
    }

    fn append(&mut self, page: &SpillPage<T>) -> Result<(), egress_reactive::SpillError> {
        Ok(SqliteSpill::append(self, page)?)
    }

    fn read(
        &mut self,
        after: Option<u64>,
        max: usize,
    ) -> Result<Vec<egress_reactive::SpilledEntry<T>>, egress_reactive::SpillError> {
        let entries = SqliteSpill::read(self, after, max)?;
        Ok(entries.into_iter().map(|(id, value, ops)| egress_reactive::SpilledEntry { id, value, ops }).collect())
    }

    fn reclaim_through(&mut self, id: u64) -> Result<(), egress_reactive::SpillError> {
        Ok(SqliteSpill::reclaim_through(self, id)?)
    }
}
