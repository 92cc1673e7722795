//! Payloads as JSON: the protocol carries bytes, and the encoding is the
//! application's; this is the convenience for serde types (feature `json`).
//!
//! ```
//! use egress_ws::json;
//!
//! #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
//! struct Reading { sensor: u32, celsius: f32 }
//!
//! let bytes = json::to_payload(&Reading { sensor: 4, celsius: 21.5 })?;
//! // ... cell.enqueue(bytes); the receiver gets `delivery.payload` ...
//! let back: Reading = json::from_payload(&bytes)?;
//! assert_eq!(back, Reading { sensor: 4, celsius: 21.5 });
//! # Ok::<(), serde_json::Error>(())
//! ```

use bytes::Bytes;

/// `value` as a JSON payload.
///
/// # Errors
/// serde_json's, for a value it cannot serialize (a map with non-string
/// keys, a failing `Serialize` impl).
pub fn to_payload<T: serde::Serialize + ?Sized>(value: &T) -> Result<Bytes, serde_json::Error> {
    serde_json::to_vec(value).map(Bytes::from)
}

/// A JSON payload as a `T`.
///
/// # Errors
/// serde_json's, for bytes that are not the JSON of a `T`.
pub fn from_payload<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(payload)
}
