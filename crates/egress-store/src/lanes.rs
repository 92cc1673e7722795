//! Durable lanes on SQLite: each lane of an [`egress_core::Lanes`] is a
//! stream of the store, every record keeps its global ordinal beside it,
//! and the lanes' own row keeps their incarnation, generation and next
//! ordinal. See [`SqliteStore::load_lanes`] and [`SqliteStore::apply_lanes`].
//!
//! A lane's stream is named `{lanes}\u{1f}{key}`, its key as JSON (serde),
//! and marked with the lanes' name: it is written only through its lanes
//! (an [`Outbox`](crate::Outbox) append to it is refused with
//! [`StoreError::OtherKind`]: it would move the lane's counter under the
//! core that assigns it).

use bytes::Bytes;
use egress_core::{
    DeadReason, Generation, Incarnation, LanesReady, Ordinal, Restored, RestoredLane, RestoredLanes, RestoredRecord,
    Sequence,
};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::StoreError;
use crate::sqlite::{SqliteStore, stream_records, write_ready};
use crate::stored::{fresh_incarnation, incarnation_of, restorable_generation, to_i64, to_u64};

/// The stream name of the lane `key` of `lanes`.
///
/// # Errors
/// [`StoreError::LaneKey`] for a key serde cannot write.
pub fn lane_stream<K: serde::Serialize>(lanes: &str, key: &K) -> Result<String, StoreError> {
    Ok(stream_of(lanes, &key_json(lanes, key)?))
}

pub(crate) fn stream_of(lanes: &str, key: &str) -> String {
    format!("{lanes}\u{1f}{key}")
}

/// Refuses a plain stream's name, or a set of lanes' name, that holds
/// U+001F: that character names a lane's stream (`{lanes}\u{1f}{key}`), so
/// a plain stream under such a name could squat a lane (the lanes' next
/// write to it refused, every lane's with it) and lanes under it could
/// collide with another's lane.
///
/// # Errors
/// [`StoreError::OtherKind`], naming the lanes the name belongs to.
pub(crate) fn plain_name(name: &str) -> Result<(), StoreError> {
    match name.split_once('\u{1f}') {
        Some((lanes, _)) => Err(StoreError::OtherKind { stream: name.to_owned(), lanes: Some(lanes.to_owned()) }),
        None => Ok(()),
    }
}

/// The lane key as stored: JSON.
pub(crate) fn key_json<K: serde::Serialize>(lanes: &str, key: &K) -> Result<String, StoreError> {
    serde_json::to_string(key).map_err(|e| StoreError::LaneKey { lanes: lanes.to_owned(), reason: e.to_string() })
}

/// What [`SqliteStore::load_lanes`] found: the incarnation of the lanes'
/// ordinals (kept for their life) and the snapshot to
/// [`restore`](egress_core::Lanes::restore) from. Its records are bytes as
/// stored; [`decode`](Self::decode) reads them as the `T`s of a typed cell.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadedLanes<K, T = Bytes> {
    /// The lanes' incarnation: a restarted producer goes on in it.
    pub incarnation: Incarnation,
    /// The stored state.
    pub restored: RestoredLanes<K, T>,
}

impl<K> LoadedLanes<K> {
    /// The same lanes with their records read by `codec` as `T`s.
    ///
    /// # Errors
    /// [`StoreError::Undecodable`] for the first record `codec` cannot
    /// read (its lane's stream named in it).
    pub fn decode<T: 'static>(
        self,
        lanes: &str,
        codec: &dyn egress_codec::Codec<T>,
    ) -> Result<LoadedLanes<K, T>, StoreError>
    where
        K: serde::Serialize,
    {
        let RestoredLanes { generation, next_ordinal, lanes: stored } = self.restored;
        let mut decoded = Vec::with_capacity(stored.len());
        for lane in stored {
            let stream = lane_stream(lanes, &lane.lane)?;
            let restored = crate::stored::decode_restored(codec, &stream, lane.restored)?;
            decoded.push(RestoredLane { lane: lane.lane, restored, ordinals: lane.ordinals });
        }
        Ok(LoadedLanes {
            incarnation: self.incarnation,
            restored: RestoredLanes { generation, next_ordinal, lanes: decoded },
        })
    }
}

/// One lane's stream as a store read it, before its key is read.
pub(crate) struct StoredLane {
    pub(crate) stream: String,
    /// The key as stored (JSON).
    pub(crate) key: String,
    pub(crate) generation: u64,
    pub(crate) next_sequence: u64,
    pub(crate) acked: Option<u64>,
    pub(crate) records: Vec<RestoredRecord<Bytes>>,
    pub(crate) skipped: Vec<(Sequence, DeadReason)>,
    /// One per record: `None` for a record written without one.
    pub(crate) ordinals: Vec<Option<Ordinal>>,
}

/// The lanes a store read (their row's incarnation, generation and next
/// ordinal, and each lane's stream) as [`LoadedLanes`], in every store
/// the same way: each key read as a `K` and refused unless it writes back
/// as stored (its stream is named by it), the generation the highest
/// stored, the next ordinal past every stored one, a record without its
/// ordinal refused.
pub(crate) fn assemble<K: serde::Serialize + serde::de::DeserializeOwned>(
    lanes: &str,
    incarnation: Incarnation,
    mut generation: u64,
    mut next_ordinal: u64,
    stored: Vec<StoredLane>,
) -> Result<LoadedLanes<K>, StoreError> {
    let mut restored_lanes = Vec::with_capacity(stored.len());
    for StoredLane { stream, key, generation: g, next_sequence, acked, records, skipped, ordinals } in stored {
        let lane: K = serde_json::from_str(&key)
            .map_err(|e| StoreError::LaneKey { lanes: lanes.to_owned(), reason: format!("{key}: {e}") })?;
        let again = key_json(lanes, &lane)?;
        if again != key || stream != stream_of(lanes, &key) {
            let reason = format!("the stored key {key} reads back as {again}: a key must serialize as stored");
            return Err(StoreError::LaneKey { lanes: lanes.to_owned(), reason });
        }
        generation = generation.max(g);
        let ordinals = ordinals
            .into_iter()
            .map(|o| o.ok_or(StoreError::OutOfRange { what: "ordinal (a lane's record without one)", value: -1 }))
            .collect::<Result<Vec<Ordinal>, _>>()?;
        if let Some(last) = ordinals.last() {
            next_ordinal = next_ordinal.max(last.0.saturating_add(1));
        }
        let restored = Restored {
            generation: Generation(0),
            next_sequence: Sequence(next_sequence),
            acked_through: acked.map(Sequence),
            records,
            skipped,
        };
        restored_lanes.push(RestoredLane { lane, restored, ordinals });
    }
    // Every ordinal handed out from here must be storable: refused now,
    // not at the first write.
    to_i64("next_ordinal", next_ordinal)?;
    Ok(LoadedLanes {
        incarnation,
        restored: RestoredLanes {
            generation: restorable_generation(generation)?,
            next_ordinal: Ordinal(next_ordinal),
            lanes: restored_lanes,
        },
    })
}

/// The streams a [`LanesReady`] writes (with each lane's key as stored)
/// and those it forgets, once its appends are checked: one list of
/// payloads per lane, each matching its lane's appends and ordinals.
pub(crate) type LaneNames = (Vec<(String, String)>, Vec<String>);

/// See [`LaneNames`].
pub(crate) fn checked_names<K: serde::Serialize>(
    lanes: &str,
    ready: &LanesReady<K>,
    appends: &[Vec<(Sequence, Bytes)>],
) -> Result<LaneNames, StoreError> {
    if appends.len() != ready.lanes.len() {
        return Err(StoreError::Appends {
            expected: ready.lanes.first().map_or(Sequence(0)..Sequence(0), |l| l.ready.appends.clone()),
            given: appends.len(),
        });
    }
    let mut names = Vec::with_capacity(ready.lanes.len());
    for (part, payloads) in ready.lanes.iter().zip(appends) {
        crate::sqlite::check_appends(&part.ready, payloads)?;
        if part.ordinals.len() != payloads.len() {
            return Err(StoreError::Appends { expected: part.ready.appends.clone(), given: part.ordinals.len() });
        }
        let key = key_json(lanes, &part.lane)?;
        names.push((stream_of(lanes, &key), key));
    }
    let forget = ready.forget.iter().map(|k| lane_stream(lanes, k)).collect::<Result<Vec<_>, _>>()?;
    Ok((names, forget))
}

/// Whether the lanes' row still holds the owner token `mine`.
fn still_owner(conn: &Connection, lanes: &str, mine: &[u8; 16]) -> Result<(), StoreError> {
    let owner: Option<Vec<u8>> = conn
        .prepare_cached("SELECT owner FROM egress_lanes WHERE lanes = ?1")?
        .query_row([lanes], |r| r.get(0))
        .optional()?
        .flatten();
    if owner.as_deref() != Some(mine.as_slice()) {
        return Err(StoreError::Fenced { stream: lanes.to_owned() });
    }
    Ok(())
}

impl SqliteStore {
    /// Loads the lanes `lanes` for a restart, and takes them over (one
    /// writer, as for a stream: a later `load_lanes` by another store
    /// fences this one): their incarnation, generation and next ordinal,
    /// and every lane's stored records above its watermark, each with its
    /// ordinal. New lanes are created, empty, at generation 0.
    ///
    /// # Errors
    /// SQLite's error; a stored number out of range; a lane key serde
    /// cannot read as a `K`, or one that does not read back as stored
    /// ([`StoreError::LaneKey`]: its lane's stream is named by the key as
    /// written, so a key must serialize as it was stored); a record of a
    /// lane without its ordinal ([`StoreError::OutOfRange`]).
    pub fn load_lanes<K: serde::Serialize + serde::de::DeserializeOwned>(
        &mut self,
        lanes: &str,
    ) -> Result<LoadedLanes<K>, StoreError> {
        self.load_lanes_then(lanes, Ok)
    }

    /// [`load_lanes`](Self::load_lanes), handing what it read to `restore`
    /// inside the same transaction: the lanes are taken over only when
    /// `restore` succeeds. An open that cannot restore (a record its codec
    /// cannot read, more lanes than its policy allows) changes nothing,
    /// and fences no store that holds the lanes.
    ///
    /// # Errors
    /// [`load_lanes`](Self::load_lanes)'s, and `restore`'s.
    pub fn load_lanes_then<K: serde::Serialize + serde::de::DeserializeOwned, R>(
        &mut self,
        lanes: &str,
        restore: impl FnOnce(LoadedLanes<K>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        plain_name(lanes)?;
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.prepare_cached(
            "INSERT INTO egress_lanes (lanes, incarnation, generation, next_ordinal) VALUES (?1, ?2, 0, 0)
             ON CONFLICT (lanes) DO NOTHING",
        )?
        .execute(params![lanes, fresh_incarnation().as_slice()])?;
        let (incarnation, generation, next_ordinal): (Vec<u8>, i64, i64) = tx.query_row(
            "SELECT incarnation, generation, next_ordinal FROM egress_lanes WHERE lanes = ?1",
            [lanes],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?;
        let incarnation = incarnation_of(&incarnation)?;
        let generation = to_u64("generation", generation)?;
        let next_ordinal = to_u64("next_ordinal", next_ordinal)?;
        let streams: Vec<(String, String, i64, i64, Option<i64>)> = {
            let mut select = tx.prepare_cached(
                "SELECT stream, lane, generation, next_sequence, acked_through FROM egress_stream
                 WHERE lanes = ?1 ORDER BY stream",
            )?;
            let rows = select.query_map([lanes], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))?;
            rows.collect::<Result<_, _>>()?
        };
        let mut stored = Vec::with_capacity(streams.len());
        for (stream, key, g, next, acked) in streams {
            let acked = acked.map(|a| to_u64("acked_through", a)).transpose()?;
            let (records, skipped, ordinals) = stream_records(&tx, &stream, acked)?;
            stored.push(StoredLane {
                generation: to_u64("generation", g)?,
                next_sequence: to_u64("next_sequence", next)?,
                stream,
                key,
                acked,
                records,
                skipped,
                ordinals,
            });
        }
        let loaded = assemble(lanes, incarnation, generation, next_ordinal, stored)?;
        // Dropped without a commit on an error: nothing taken, nothing made.
        let restored = restore(loaded)?;
        let owner = fresh_incarnation();
        tx.prepare_cached("UPDATE egress_lanes SET owner = ?2 WHERE lanes = ?1")?
            .execute(params![lanes, owner.as_slice()])?;
        tx.commit()?;
        self.owned_lanes.insert(lanes.to_owned(), owner);
        Ok(restored)
    }

    /// Writes one [`LanesReady`] of `lanes` as one transaction: the
    /// streams of the lanes it forgets deleted, each lane's `Ready` written
    /// as its stream's (see [`apply`](Self::apply)) with each append's
    /// ordinal, the lanes' next ordinal and generation raised. Synced to the
    /// disk before it returns when `ready.must_sync`.
    ///
    /// `appends[i]` are the payloads of `ready.lanes[i]`'s appends, in
    /// order.
    ///
    /// # Errors
    /// SQLite's error (a full disk, a locked database); a fence (another
    /// store loaded the lanes since) or lanes never loaded here; payloads
    /// that do not match the appends; a lane's counter moved under it
    /// ([`StoreError::Conflict`]). Nothing is written then.
    pub fn apply_lanes<K: serde::Serialize>(
        &mut self,
        lanes: &str,
        ready: &LanesReady<K>,
        appends: &[Vec<(Sequence, Bytes)>],
    ) -> Result<(), StoreError> {
        let (names, forget) = checked_names(lanes, ready, appends)?;
        let Some(mine) = self.owned_lanes.get(lanes).copied() else {
            return Err(StoreError::NotLoaded { stream: lanes.to_owned() });
        };
        self.set_synchronous(ready.must_sync)?;
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        still_owner(&tx, lanes, &mine)?;
        for stream in &forget {
            tx.prepare_cached("DELETE FROM egress_outbox WHERE stream = ?1")?.execute([stream])?;
            tx.prepare_cached("DELETE FROM egress_stream WHERE stream = ?1")?.execute([stream])?;
        }
        for ((part, payloads), (stream, key)) in ready.lanes.iter().zip(appends).zip(&names) {
            tx.prepare_cached(
                "INSERT INTO egress_stream (stream, incarnation, generation, next_sequence, acked_through, lanes, lane)
                 VALUES (?1, ?2, 0, 0, NULL, ?3, ?4) ON CONFLICT (stream) DO NOTHING",
            )?
            .execute(params![stream, fresh_incarnation().as_slice(), lanes, key])?;
            write_ready(&tx, stream, &part.ready, payloads, Some(&part.ordinals))?;
        }
        let generation = ready.generation.map(|g| to_i64("generation", g.0)).transpose()?;
        tx.prepare_cached(
            "UPDATE egress_lanes SET next_ordinal = MAX(next_ordinal, ?2),
                 generation = MAX(generation, COALESCE(?3, generation)) WHERE lanes = ?1",
        )?
        .execute(params![lanes, to_i64("next_ordinal", ready.next_ordinal.0)?, generation])?;
        tx.commit()?;
        Ok(())
    }

    /// Whether this store still owns `lanes`: it loaded them, and no other
    /// store has since.
    ///
    /// # Errors
    /// [`StoreError::NotLoaded`], [`StoreError::Fenced`], or SQLite's
    /// error.
    pub fn owns_lanes(&self, lanes: &str) -> Result<(), StoreError> {
        let Some(mine) = self.owned_lanes.get(lanes) else {
            return Err(StoreError::NotLoaded { stream: lanes.to_owned() });
        };
        still_owner(&self.conn, lanes, mine)
    }
}
