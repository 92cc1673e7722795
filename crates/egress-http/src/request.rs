//! [`HttpRequest`]: one record, as the application enqueues it.

use bytes::Bytes;
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
    pub content_type: Option<&'static str>,
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
        Ok(HttpRequest { method, path: path.into(), body, content_type: Some("application/json") })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_request_carries_its_body_and_type() {
        let r = HttpRequest::json(Method::PUT, "rooms/a/send/m/1", &serde_json::json!({"body": "hi"}))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.body.as_ref(), br#"{"body":"hi"}"#);
        assert_eq!((r.content_type, r.len(), r.is_empty()), (Some("application/json"), 13, false));
        let bare = HttpRequest::new(Method::DELETE, "x");
        assert!(bare.is_empty() && bare.content_type.is_none());
    }
}
