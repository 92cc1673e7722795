//! [`HttpRequest`]: one record, as the application enqueues it.

use std::borrow::Cow;

use bytes::{BufMut, Bytes, BytesMut};
use egress_codec::{Codec, CodecError, Encode};
use reqwest::Method;

/// One request, as the application enqueues it in a lanes cell: what is
/// sent, byte for byte, at every attempt. An API that wants the client's
/// transaction id in the path (Matrix's `PUT /rooms/{room}/send/{type}/{txn}`)
/// gets it in `path`, made once at enqueue; every attempt also carries the
/// header `Idempotency-Key` (see [`HttpSender`](crate::HttpSender)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpRequest {
    /// The method.
    pub method: Method,
    /// The path and query, relative to the sender's base URL (no leading
    /// `/` needed; one is allowed).
    pub path: String,
    /// The body.
    pub body: Bytes,
    /// The body's content type, if it has one.
    pub content_type: Option<Cow<'static, str>>,
}

impl HttpRequest {
    /// A request without a body.
    pub fn new(method: Method, path: impl Into<String>) -> Self {
        HttpRequest { method, path: path.into(), body: Bytes::new(), content_type: None }
    }

    /// A request with `value` as its JSON body.
    ///
    /// # Errors
    /// `value` does not serialize.
    pub fn json(method: Method, path: impl Into<String>, value: &impl serde::Serialize) -> serde_json::Result<Self> {
        let body = Bytes::from(serde_json::to_vec(value)?);
        Ok(HttpRequest { method, path: path.into(), body, content_type: Some(Cow::Borrowed("application/json")) })
    }

    /// How many bytes the request carries (its body).
    pub fn len(&self) -> usize {
        self.body.len()
    }

    /// Whether it has no body.
    pub fn is_empty(&self) -> bool {
        self.body.is_empty()
    }
}

/// The stored form of an [`HttpRequest`], for a durable lanes cell
/// (`egress_store::open_durable_lanes`): a version byte (1), then the
/// method, the path and the content type, each as a big-endian `u32`
/// length and its UTF-8 bytes (the content type's length `u32::MAX` for
/// none), then the body to the end. Decoding checks every length against
/// what is left and refuses anything else with an error, never a panic.
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpCodec;

const VERSION: u8 = 1;
const NO_TYPE: u32 = u32::MAX;

impl Encode<HttpRequest> for HttpCodec {
    fn encode(&self, value: &HttpRequest) -> Result<Bytes, CodecError> {
        let method = value.method.as_str();
        let kind = value.content_type.as_deref();
        let size = self.size(value).ok_or("a request of more than 4 GiB in a part")?;
        let mut out = BytesMut::with_capacity(size);
        out.put_u8(VERSION);
        for part in [method, value.path.as_str()] {
            out.put_u32(u32::try_from(part.len())?);
            out.put_slice(part.as_bytes());
        }
        match kind {
            Some(kind) => {
                out.put_u32(u32::try_from(kind.len()).ok().filter(|n| *n != NO_TYPE).ok_or("a content type of 4 GiB")?);
                out.put_slice(kind.as_bytes());
            }
            None => out.put_u32(NO_TYPE),
        }
        out.put_slice(&value.body);
        Ok(out.freeze())
    }

    fn size(&self, value: &HttpRequest) -> Option<usize> {
        let parts = [value.method.as_str().len(), value.path.len(), value.content_type.as_deref().map_or(0, str::len)];
        if parts.iter().any(|n| u32::try_from(*n).is_err()) {
            return None;
        }
        parts.iter().try_fold(1 + 12 + value.body.len(), |sum, n| sum.checked_add(*n))
    }
}

/// Reads one length-prefixed UTF-8 part from the front of `bytes`.
fn part(bytes: &mut Bytes, what: &str) -> Result<Option<String>, CodecError> {
    if bytes.len() < 4 {
        return Err(format!("the {what}'s length is cut off").into());
    }
    let len = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let _ = bytes.split_to(4);
    if len == NO_TYPE {
        return Ok(None);
    }
    let len = usize::try_from(len)?;
    if bytes.len() < len {
        return Err(format!("the {what} is cut off: {len} bytes said, {} left", bytes.len()).into());
    }
    let text = bytes.split_to(len);
    Ok(Some(std::str::from_utf8(&text).map_err(|e| format!("the {what}: {e}"))?.to_owned()))
}

impl Codec<HttpRequest> for HttpCodec {
    fn decode(&self, bytes: &Bytes) -> Result<HttpRequest, CodecError> {
        let mut rest = bytes.clone();
        match rest.first() {
            Some(&VERSION) => {}
            Some(v) => return Err(format!("version {v}, not {VERSION}").into()),
            None => return Err("empty".into()),
        }
        let _ = rest.split_to(1);
        let method = part(&mut rest, "method")?.ok_or("no method")?;
        let method = Method::from_bytes(method.as_bytes()).map_err(|e| format!("the method {method:?}: {e}"))?;
        let path = part(&mut rest, "path")?.ok_or("no path")?;
        let content_type = part(&mut rest, "content type")?.map(Cow::Owned);
        Ok(HttpRequest { method, path, body: rest, content_type })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codec_reads_back_what_it_wrote_and_refuses_what_it_did_not() {
        let codec = HttpCodec;
        let requests = [
            HttpRequest::json(Method::PUT, "rooms/a/send/m/1", &serde_json::json!({"body": "hi"}))
                .unwrap_or_else(|e| panic!("{e}")),
            HttpRequest::new(Method::DELETE, ""),
            // A content type and no body: the last part ends the bytes.
            HttpRequest { content_type: Some("application/json".into()), ..HttpRequest::new(Method::POST, "p") },
            HttpRequest {
                method: Method::from_bytes(b"PATCHY").unwrap_or_else(|e| panic!("{e}")),
                path: "x?y=é".into(),
                body: Bytes::from_static(&[0, 255, 1]),
                content_type: Some("text/plain; charset=utf-8".into()),
            },
        ];
        for request in requests {
            let bytes = codec.encode(&request).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(codec.size(&request), Some(bytes.len()));
            assert_eq!(codec.decode(&bytes).unwrap_or_else(|e| panic!("{e}")), request);
            // Every prefix that cuts a header is refused; one that cuts the
            // body is a shorter body (the body runs to the end).
            let header = bytes.len() - request.body.len();
            for cut in 0..header {
                assert!(codec.decode(&bytes.slice(..cut)).is_err(), "cut at {cut}");
            }
        }
        let mut wrong = codec.encode(&HttpRequest::new(Method::GET, "p")).unwrap_or_else(|e| panic!("{e}")).to_vec();
        wrong[0] = 2;
        assert!(codec.decode(&Bytes::from(wrong.clone())).is_err());
        wrong[0] = VERSION;
        wrong[5] = 0xff; // the method's first byte: not a token
        assert!(codec.decode(&Bytes::from(wrong)).is_err());
        let huge = Bytes::from_static(&[VERSION, 0x7f, 0xff, 0xff, 0xff, b'G']);
        assert!(codec.decode(&huge).is_err(), "a length past the end");
    }

    #[test]
    fn a_json_request_carries_its_body_and_type() {
        let r = HttpRequest::json(Method::PUT, "rooms/a/send/m/1", &serde_json::json!({"body": "hi"}))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.body.as_ref(), br#"{"body":"hi"}"#);
        assert_eq!((r.content_type.as_deref(), r.len(), r.is_empty()), (Some("application/json"), 13, false));
        let bare = HttpRequest::new(Method::DELETE, "x");
        assert!(bare.is_empty() && bare.content_type.is_none());
    }
}
