//! A durable latest-value projection on SQLite: one row per projection
//! (its generation and owner) and one per key (its newest version not yet
//! applied with the value, and its frontier), written from the core's
//! journal ([`LatestReady`]) and read back for a restart.

use bytes::Bytes;
use egress_codec::{Codec, guarded};
use egress_core::{Generation, LatestReady, LatestWrite, RestoredKey, Version};
use rusqlite::{OptionalExtension, TransactionBehavior, params};

use crate::stored::{fresh_incarnation, restorable_generation, to_i64, to_u64};
use crate::{SqliteStore, StoreError};

/// What [`SqliteStore::load_latest`] found for a projection: the
/// generation this open takes (one above the last open's) and each key's
/// row, its values as bytes until [`decode`](Self::decode) reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedLatest<K, V = Bytes> {
    /// The generation to restore at.
    pub generation: Generation,
    /// Each stored key: its newest version not yet applied (the desire to
    /// restore) and its frontier.
    pub keys: Vec<RestoredKey<K, V>>,
}

impl<K> LoadedLatest<K> {
    /// The same projection with its values read by `codec` as `V`s.
    ///
    /// # Errors
    /// [`StoreError::LatestValue`] for the first value `codec` cannot
    /// read (`name` names the projection in it).
    pub fn decode<V: 'static>(self, name: &str, codec: &dyn Codec<V>) -> Result<LoadedLatest<K, V>, StoreError>
    where
        K: serde::Serialize,
    {
        let keys = self
            .keys
            .into_iter()
            .map(|k| {
                let desired = match k.desired {
                    Some((version, bytes)) => match guarded(|| codec.decode(&bytes)) {
                        Ok(value) => Some((version, value)),
                        Err(error) => return Err(value_error(name, &k.key, false, error)),
                    },
                    None => None,
                };
                Ok(RestoredKey { key: k.key, desired, durable_through: k.durable_through })
            })
            .collect::<Result<_, _>>()?;
        Ok(LoadedLatest { generation: self.generation, keys })
    }
}

/// The key as stored: JSON text.
pub(crate) fn key_text<K: serde::Serialize>(name: &str, key: &K) -> Result<String, StoreError> {
    serde_json::to_string(key).map_err(|e| StoreError::LatestKey { name: name.to_owned(), reason: e.to_string() })
}

/// A value its codec cannot write (`encode`) or read.
pub(crate) fn value_error<K: serde::Serialize>(
    name: &str,
    key: &K,
    encode: bool,
    error: egress_codec::CodecError,
) -> StoreError {
    let key = serde_json::to_string(key).unwrap_or_else(|_| "(a key serde cannot write)".to_owned());
    StoreError::LatestValue { name: name.to_owned(), key, encode, error }
}

/// A key's row as the stores hold it: the key's JSON, its newest version
/// and value, its frontier.
type StoredRow = (String, Option<i64>, Option<Vec<u8>>, Option<i64>);

/// A stored version or frontier.
fn version(what: &'static str, stored: Option<i64>) -> Result<Option<Version>, StoreError> {
    stored.map(|v| to_u64(what, v).map(Version)).transpose()
}

/// A stored key's row of the projection `name` read back (on SQLite and
/// on PostgreSQL alike).
///
/// # Errors
/// A key serde cannot read as a `K`, or one not stored as serde writes it
/// ([`StoreError::LatestKey`]); a version or frontier out of range, or a
/// version without its value or a value without its version
/// ([`StoreError::OutOfRange`]).
pub(crate) fn restored_key<K: serde::Serialize + serde::de::DeserializeOwned>(
    name: &str,
    text: &str,
    newest: Option<i64>,
    value: Option<Vec<u8>>,
    durable_through: Option<i64>,
) -> Result<RestoredKey<K, Bytes>, StoreError> {
    let key: K = serde_json::from_str(text)
        .map_err(|e| StoreError::LatestKey { name: name.to_owned(), reason: format!("{e}: {text}") })?;
    // Rows are found by the key as serde writes it: a row spelled
    // otherwise (edited by another program) would stand beside the key's
    // own row, and a delete would miss it.
    let canonical = key_text(name, &key)?;
    if canonical != text {
        let reason = format!("stored as {text}, not as serde writes it ({canonical})");
        return Err(StoreError::LatestKey { name: name.to_owned(), reason });
    }
    let desired = match (version("version", newest)?, value) {
        (Some(v), Some(bytes)) => Some((v, Bytes::from(bytes))),
        (None, None) => None,
        (Some(v), None) => {
            return Err(StoreError::OutOfRange { what: "a latest row's version (without a value)", value: v.0.into() });
        }
        (None, Some(_)) => {
            return Err(StoreError::OutOfRange { what: "a latest row's value (without a version)", value: 0 });
        }
    };
    Ok(RestoredKey { key, desired, durable_through: version("durable_through", durable_through)? })
}

/// Each write's key as stored (JSON, as serde writes it), in the order of
/// `ready`'s writes.
///
/// # Errors
/// A key serde cannot write, or a key written twice
/// ([`StoreError::LatestKey`]: the core writes each key once an epoch; two
/// writes of one key would leave the stores to disagree on which wins).
pub(crate) fn write_keys<K: serde::Serialize>(name: &str, ready: &LatestReady<K>) -> Result<Vec<String>, StoreError> {
    let mut texts = Vec::with_capacity(ready.writes.len());
    let mut seen = std::collections::HashSet::with_capacity(ready.writes.len());
    for write in &ready.writes {
        let (LatestWrite::Put { key, .. } | LatestWrite::Delete { key }) = write;
        let text = key_text(name, key)?;
        if !seen.insert(text.clone()) {
            return Err(StoreError::LatestKey {
                name: name.to_owned(),
                reason: format!("{text} written twice in one write"),
            });
        }
        texts.push(text);
    }
    Ok(texts)
}

/// Whether `values` match `ready`'s writes: one per write, present exactly
/// for a `Put` with a newest version.
///
/// # Errors
/// [`StoreError::LatestWrites`] when they do not.
pub(crate) fn values_match<K>(ready: &LatestReady<K>, values: &[Option<Bytes>]) -> Result<(), StoreError> {
    let matches = values.len() == ready.writes.len()
        && ready.writes.iter().zip(values).all(|(w, v)| match w {
            LatestWrite::Put { newest, .. } => newest.is_some() == v.is_some(),
            LatestWrite::Delete { .. } => v.is_none(),
        });
    if !matches {
        return Err(StoreError::LatestWrites { writes: ready.writes.len(), values: values.len() });
    }
    Ok(())
}

impl SqliteStore {
    /// Loads the latest projection `name` for a restart, and takes it over
    /// (a fresh owner token in its row: a store that loaded it before
    /// writes it no more, [`StoreError::Fenced`]): the generation one above
    /// the last open's, and every key's row (a new projection is created,
    /// empty).
    ///
    /// # Errors
    /// [`load_latest_then`](Self::load_latest_then)'s.
    pub fn load_latest<K: serde::Serialize + serde::de::DeserializeOwned>(
        &mut self,
        name: &str,
    ) -> Result<LoadedLatest<K>, StoreError> {
        self.load_latest_then(name, Ok)
    }

    /// [`load_latest`](Self::load_latest), handing what it read to
    /// `restore` inside the same transaction: the projection is taken over
    /// only when `restore` succeeds. An open that cannot restore (a value
    /// its codec cannot read, more keys than its policy allows) changes
    /// nothing, and fences no store that holds the projection.
    ///
    /// # Errors
    /// SQLite's error; a stored key serde cannot read as a `K`, or one not
    /// stored as serde writes it ([`StoreError::LatestKey`]); a stored row out of range (a version
    /// above `i64::MAX`, a version without a value); and `restore`'s.
    pub fn load_latest_then<K: serde::Serialize + serde::de::DeserializeOwned, R>(
        &mut self,
        name: &str,
        restore: impl FnOnce(LoadedLatest<K>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.prepare_cached("INSERT INTO egress_latest (name, generation) VALUES (?1, 0) ON CONFLICT (name) DO NOTHING")?
            .execute([name])?;
        let stored: i64 = tx.query_row("SELECT generation FROM egress_latest WHERE name = ?1", [name], |r| r.get(0))?;
        let generation = Generation(restorable_generation(to_u64("generation", stored)?)?.0 + 1);
        let rows: Vec<StoredRow> = {
            let mut select = tx.prepare_cached(
                "SELECT key, version, value, durable_through FROM egress_latest_key WHERE name = ?1 ORDER BY key",
            )?;
            let rows = select.query_map([name], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
            rows.collect::<Result<_, _>>()?
        };
        let keys = rows
            .into_iter()
            .map(|(text, newest, value, durable_through)| restored_key(name, &text, newest, value, durable_through))
            .collect::<Result<_, _>>()?;
        // Dropped without a commit on an error: nothing taken, nothing made.
        let restored = restore(LoadedLatest { generation, keys })?;
        let owner = fresh_incarnation();
        tx.prepare_cached("UPDATE egress_latest SET owner = ?2, generation = ?3 WHERE name = ?1")?.execute(params![
            name,
            owner.as_slice(),
            to_i64("generation", generation.0)?
        ])?;
        tx.commit()?;
        self.owned_latest.insert(name.to_owned(), owner);
        Ok(restored)
    }

    /// Writes one [`LatestReady`] of the projection `name` as one
    /// transaction: each `Put` its row (`values[i]` the encoded value of
    /// `ready.writes[i]`, present exactly for a `Put` with a newest
    /// version), each `Delete` its row gone. Synced to the disk before it
    /// returns when a desire is written (it is claimed only once stored);
    /// a write of frontiers alone is not (a frontier lost in a crash costs
    /// one write the sink already has, which its version makes
    /// idempotent).
    ///
    /// # Errors
    /// [`StoreError::NotLoaded`] (this store did not load it),
    /// [`StoreError::Fenced`] (another store has since),
    /// [`StoreError::LatestWrites`] (values that do not match the writes),
    /// a key serde cannot write or written twice ([`StoreError::LatestKey`]),
    /// a number out of range, or SQLite's error
    /// (a full disk, a locked database): nothing is written then.
    pub fn apply_latest<K: serde::Serialize>(
        &mut self,
        name: &str,
        ready: &LatestReady<K>,
        values: &[Option<Bytes>],
    ) -> Result<(), StoreError> {
        values_match(ready, values)?;
        let keys = write_keys(name, ready)?;
        let Some(mine) = self.owned_latest.get(name).copied() else {
            return Err(StoreError::NotLoaded { stream: name.to_owned() });
        };
        let must_sync = values.iter().any(Option::is_some);
        self.set_synchronous(must_sync)?;
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        still_latest_owner(&tx, name, &mine)?;
        for ((write, value), key) in ready.writes.iter().zip(values).zip(&keys) {
            match write {
                LatestWrite::Put { newest, durable_through, .. } => {
                    let newest = newest.map(|v| to_i64("version", v.0)).transpose()?;
                    let frontier = durable_through.map(|v| to_i64("durable_through", v.0)).transpose()?;
                    tx.prepare_cached(
                        "INSERT INTO egress_latest_key (name, key, version, value, durable_through)
                         VALUES (?1, ?2, ?3, ?4, ?5)
                         ON CONFLICT (name, key) DO UPDATE SET
                             version = excluded.version, value = excluded.value,
                             durable_through = excluded.durable_through",
                    )?
                    .execute(params![name, key, newest, value.as_deref(), frontier])?;
                }
                LatestWrite::Delete { .. } => {
                    tx.prepare_cached("DELETE FROM egress_latest_key WHERE name = ?1 AND key = ?2")?
                        .execute(params![name, key])?;
                }
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Whether this store still owns the projection `name`: it loaded it,
    /// and no other store has since.
    ///
    /// # Errors
    /// [`StoreError::NotLoaded`], [`StoreError::Fenced`], or SQLite's
    /// error.
    pub fn owns_latest(&self, name: &str) -> Result<(), StoreError> {
        let Some(mine) = self.owned_latest.get(name) else {
            return Err(StoreError::NotLoaded { stream: name.to_owned() });
        };
        still_latest_owner(&self.conn, name, mine)
    }
}

/// Whether the projection's row still holds the owner token `mine`.
fn still_latest_owner(conn: &rusqlite::Connection, name: &str, mine: &[u8; 16]) -> Result<(), StoreError> {
    let owner: Option<Vec<u8>> = conn
        .prepare_cached("SELECT owner FROM egress_latest WHERE name = ?1")?
        .query_row([name], |r| r.get(0))
        .optional()?
        .flatten();
    if owner.as_deref() != Some(mine.as_slice()) {
        return Err(StoreError::Fenced { stream: name.to_owned() });
    }
    Ok(())
}
