//! How egress's values are stored, the same in every database: numbers as
//! signed 64-bit integers (checked both ways), dead letters as a reason code
//! and a held flag, incarnations and owner tokens as 16 random bytes.

use bytes::Bytes;
use egress_codec::{Codec, guarded};
use egress_core::{DeadMark, DeadReason, Generation, Incarnation, Restored, RestoredRecord, Sequence};

use crate::StoreError;

pub(crate) fn to_i64(what: &'static str, value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::OutOfRange { what, value: i128::from(value) })
}

pub(crate) fn to_u64(what: &'static str, value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::OutOfRange { what, value: i128::from(value) })
}

pub(crate) fn dead_code(reason: DeadReason) -> i64 {
    match reason {
        DeadReason::Permanent => 0,
        DeadReason::Retries => 1,
        DeadReason::Replays => 2,
    }
}

pub(crate) fn dead_of(code: Option<i64>, held: Option<i64>) -> Result<Option<DeadMark>, StoreError> {
    let Some(code) = code else { return Ok(None) };
    let reason = match code {
        0 => DeadReason::Permanent,
        1 => DeadReason::Retries,
        2 => DeadReason::Replays,
        other => return Err(StoreError::OutOfRange { what: "dead_reason", value: i128::from(other) }),
    };
    let held = match held {
        Some(0) => false,
        Some(1) => true,
        other => return Err(StoreError::OutOfRange { what: "dead_held", value: other.map_or(-1, i128::from) }),
    };
    Ok(Some(DeadMark { reason, held }))
}

/// A new incarnation: 128 bits from the standard library's randomly seeded
/// hasher.
pub(crate) fn fresh_incarnation() -> [u8; 16] {
    use std::hash::BuildHasher;
    let random = || std::collections::hash_map::RandomState::new().hash_one(0u64);
    (u128::from(random()) << 64 | u128::from(random())).to_be_bytes()
}

/// A stored incarnation (16 bytes, big-endian).
pub(crate) fn incarnation_of(bytes: &[u8]) -> Result<Incarnation, StoreError> {
    let bytes = <[u8; 16]>::try_from(bytes)
        .map_err(|_| StoreError::OutOfRange { what: "incarnation length", value: bytes.len() as i128 })?;
    Ok(Incarnation(u128::from_be_bytes(bytes)))
}

/// A stored generation a restarted producer can go above: below
/// `i64::MAX`, where the next one is still storable (and the wire protocol
/// caps generations lower still).
pub(crate) fn restorable_generation(generation: u64) -> Result<Generation, StoreError> {
    if generation >= i64::MAX as u64 {
        let what = "generation (no handshake can go above it)";
        return Err(StoreError::OutOfRange { what, value: generation.into() });
    }
    Ok(Generation(generation))
}

/// `restored`'s records as `T`s, by `codec`.
pub(crate) fn decode_restored<T: 'static>(
    codec: &dyn Codec<T>,
    stream: &str,
    restored: Restored<Bytes>,
) -> Result<Restored<T>, StoreError> {
    let records = restored
        .records
        .into_iter()
        .map(|r| {
            Ok(RestoredRecord {
                sequence: r.sequence,
                payload: decode(codec, stream, r.sequence, &r.payload)?,
                dead: r.dead,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(Restored {
        generation: restored.generation,
        next_sequence: restored.next_sequence,
        acked_through: restored.acked_through,
        records,
        skipped: restored.skipped,
    })
}

/// One stored record as a `T`.
pub(crate) fn decode<T: 'static>(
    codec: &dyn Codec<T>,
    stream: &str,
    sequence: Sequence,
    bytes: &Bytes,
) -> Result<T, StoreError> {
    guarded(|| codec.decode(bytes)).map_err(|error| StoreError::Undecodable {
        stream: stream.to_owned(),
        sequence,
        error,
    })
}

/// Stored records as `T`s.
#[cfg(feature = "relay")]
pub(crate) fn decode_all<T: 'static>(
    codec: &dyn Codec<T>,
    stream: &str,
    rows: Vec<(Sequence, Bytes)>,
) -> Result<Vec<(Sequence, T)>, StoreError> {
    rows.into_iter().map(|(sequence, bytes)| Ok((sequence, decode(codec, stream, sequence, &bytes)?))).collect()
}

/// The bytes of the records a `Ready` appends.
#[cfg(feature = "relay")]
pub(crate) fn encode_all<T: 'static>(
    codec: &dyn Codec<T>,
    stream: &str,
    appends: &[(Sequence, T)],
) -> Result<Vec<(Sequence, Bytes)>, StoreError> {
    appends
        .iter()
        .map(|(sequence, value)| match guarded(|| codec.encode(value)) {
            Ok(bytes) => Ok((*sequence, bytes)),
            Err(error) => Err(StoreError::Unencodable { stream: stream.to_owned(), sequence: Some(*sequence), error }),
        })
        .collect()
}

/// The check a cell's `try_enqueue` applies for a relay writing with
/// `codec`: `Err(why)` for a value `codec` refuses or panics on.
#[cfg(feature = "relay")]
pub(crate) fn encode_check<T: 'static>(codec: std::sync::Arc<dyn Codec<T>>) -> egress_reactive::EncodeCheck<T> {
    std::sync::Arc::new(move |value: &T| guarded(|| codec.encode(value)).map(|_| ()).map_err(|e| e.to_string()))
}

/// One payload's bytes, for an outbox append (no sequence yet).
pub(crate) fn encode_one<T: 'static>(
    codec: &impl egress_codec::Encode<T>,
    stream: &str,
    value: &T,
) -> Result<Bytes, StoreError> {
    guarded(|| codec.encode(value)).map_err(|error| StoreError::Unencodable {
        stream: stream.to_owned(),
        sequence: None,
        error,
    })
}
