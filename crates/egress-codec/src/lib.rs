//! How the typed payloads of egress cells become bytes and back.
//!
//! An egress cell holds whatever the application enqueues (`T`); what
//! leaves the process is bytes: a WebSocket data frame, a stored record, a
//! NATS message. One codec says how, and every store and transport takes
//! the same one:
//!
//! - [`Encode`] is what a transport needs (`T` to bytes, and the size it
//!   would send, for refusing a payload above a limit at enqueue);
//! - [`Codec`] adds the way back, which a store needs: a durable cell's
//!   records are read back as `T` when the cell is restored, and so are
//!   the records an application appended through an outbox.
//!
//! [`Raw`] is the codec of bytes as they are; [`Json`] (feature `json`)
//! that of serde types.
//!
//! ```
//! use egress_codec::{Codec, Encode, Json};
//!
//! #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
//! struct Line { room: String, text: String }
//!
//! let line = Line { room: "tea".into(), text: "hello".into() };
//! let bytes = Json.encode(&line)?;
//! assert_eq!(Encode::<Line>::size(&Json, &line), Some(bytes.len()));
//! let back: Line = Json.decode(&bytes)?;
//! assert_eq!(back, line);
//! # Ok::<(), egress_codec::CodecError>(())
//! ```

use bytes::Bytes;

/// Why a value has no encoding, or bytes are not the encoding of a value.
pub type CodecError = Box<dyn std::error::Error + Send + Sync>;

/// How a `T` becomes the bytes that leave the process. A payload that does
/// not encode cannot be sent or stored: a transport fails it as permanent
/// (a dead letter, since trying again would not help); a store refuses to
/// write it.
pub trait Encode<T>: Send + Sync + 'static {
    /// `value`'s bytes.
    ///
    /// # Errors
    /// Why `value` has no encoding.
    fn encode(&self, value: &T) -> Result<Bytes, CodecError>;

    /// How many bytes `value` encodes to (`None`: it does not encode), for
    /// a transport's check of a payload against the largest it carries. By
    /// default it encodes; a codec that knows the size cheaply says so.
    fn size(&self, value: &T) -> Option<usize> {
        self.encode(value).ok().map(|b| b.len())
    }
}

/// `f` (a call into the application's codec), with a panic in it as its
/// error: a codec that panics refuses the value, as one that returns an
/// error does, and the store, relay or transport that called it goes on.
/// Every caller of a codec in egress calls it through this.
///
/// # Errors
/// `f`'s, or "the codec panicked: …" with the panic's message.
pub fn guarded<R>(f: impl FnOnce() -> Result<R, CodecError>) -> Result<R, CodecError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(panic) => {
            let what = egress_core::panic_message(&*panic).unwrap_or("a panic that is not a message");
            Err(format!("the codec panicked: {what}").into())
        }
    }
}

/// A payload its codec could not encode, as a transport fails it: as
/// permanent (a dead letter; trying again would not help). The codec's
/// error is its source.
#[derive(Debug)]
pub struct Unencodable(pub CodecError);

impl std::fmt::Display for Unencodable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the payload does not encode: {}", self.0)
    }
}

impl std::error::Error for Unencodable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// [`Encode`] and the way back: what a store needs to give a durable cell
/// its typed records again. `decode(encode(v))` is `v` (the law every
/// codec here keeps, checked by this crate's tests).
pub trait Codec<T>: Encode<T> {
    /// The `T` whose encoding `bytes` is.
    ///
    /// # Errors
    /// Why `bytes` are not the encoding of a `T` (a store refuses to
    /// restore from them, and says which record it was).
    fn decode(&self, bytes: &Bytes) -> Result<T, CodecError>;
}

/// Bytes as they are: the codec of a cell of [`Bytes`]. Never fails;
/// decoding shares the buffer.
#[derive(Clone, Copy, Debug, Default)]
pub struct Raw;

impl Encode<Bytes> for Raw {
    fn encode(&self, value: &Bytes) -> Result<Bytes, CodecError> {
        Ok(value.clone())
    }

    fn size(&self, value: &Bytes) -> Option<usize> {
        Some(value.len())
    }
}

impl Codec<Bytes> for Raw {
    fn decode(&self, bytes: &Bytes) -> Result<Bytes, CodecError> {
        Ok(bytes.clone())
    }
}

/// JSON through serde (feature `json`). Encoding fails only where
/// serde_json does (a map with keys that are not strings, a failing
/// `Serialize` impl); decoding fails for bytes that are not the JSON of a
/// `T`.
#[cfg(feature = "json")]
#[derive(Clone, Copy, Debug, Default)]
pub struct Json;

#[cfg(feature = "json")]
impl<T: serde::Serialize> Encode<T> for Json {
    fn encode(&self, value: &T) -> Result<Bytes, CodecError> {
        Ok(serde_json::to_vec(value).map(Bytes::from)?)
    }
}

#[cfg(feature = "json")]
impl<T: serde::Serialize + serde::de::DeserializeOwned> Codec<T> for Json {
    fn decode(&self, bytes: &Bytes) -> Result<T, CodecError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use bytes::Bytes;
    use proptest::prelude::*;

    use super::{Codec, Encode, Raw, Unencodable, guarded};

    #[test]
    fn a_panicking_codec_is_a_refusal_that_says_so_and_a_fine_one_passes_through() {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let panicked = guarded::<Bytes>(|| panic!("no {} today", "lines"));
        let opaque = guarded::<Bytes>(|| std::panic::panic_any(3_u8));
        std::panic::set_hook(hook);
        assert_eq!(panicked.map_err(|e| e.to_string()), Err("the codec panicked: no lines today".to_owned()));
        assert_eq!(
            opaque.map_err(|e| e.to_string()),
            Err("the codec panicked: a panic that is not a message".to_owned())
        );
        assert_eq!(guarded(|| Raw.encode(&Bytes::from_static(b"ok"))).ok(), Some(Bytes::from_static(b"ok")));
        assert_eq!(guarded::<u8>(|| Err("refused".into())).map_err(|e| e.to_string()), Err("refused".to_owned()));
    }

    #[test]
    fn an_unencodable_payload_says_why_and_keeps_the_codecs_error_as_its_source() {
        let e = Unencodable("keys must be strings".into());
        assert_eq!(e.to_string(), "the payload does not encode: keys must be strings");
        let source = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("keys must be strings"));
    }

    proptest! {
        #[test]
        fn raw_gives_back_what_it_took_and_says_its_size(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let value = Bytes::from(data);
            let bytes = Raw.encode(&value).expect("raw encodes");
            prop_assert_eq!(&bytes, &value);
            prop_assert_eq!(Raw.size(&value), Some(value.len()));
            prop_assert_eq!(Raw.decode(&bytes).expect("raw decodes"), value);
        }

        #[cfg(feature = "json")]
        #[test]
        fn json_decodes_what_it_encoded_and_its_size_is_the_encodings(
            entries in proptest::collection::btree_map(".{0,8}", any::<i64>(), 0..8),
            text in ".{0,32}",
        ) {
            let value = (entries, text);
            let bytes = super::Json.encode(&value).expect("encodes");
            prop_assert_eq!(super::Json.size(&value), Some(bytes.len()));
            let back: (BTreeMap<String, i64>, String) = super::Json.decode(&bytes).expect("decodes");
            prop_assert_eq!(back, value);
        }
    }

    #[cfg(feature = "json")]
    #[test]
    fn json_refuses_what_has_no_encoding_and_bytes_of_another_type() {
        // A map whose keys are not strings has no JSON.
        let unencodable: BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into_iter().collect();
        assert!(super::Json.encode(&unencodable).is_err());
        assert_eq!(super::Json.size(&unencodable), None);
        // Bytes of a string are not a number, and not JSON at all are
        // nothing.
        let text = super::Json.encode(&"tea").expect("encodes");
        assert!(Codec::<u64>::decode(&super::Json, &text).is_err());
        assert!(Codec::<String>::decode(&super::Json, &Bytes::from_static(b"{not json")).is_err());
    }
}
