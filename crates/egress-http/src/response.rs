//! What a response (or its absence) means for the record: the mapping onto
//! the core's failure kinds, apart from the network so that it is tested
//! as a table.

use std::time::Duration;

use egress_core::{Delay, FailureKind};
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, RETRY_AFTER};

/// Why a request did not succeed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// The server answered with a status that is not a success (and not
    /// 429), with the start of its body.
    #[error("{status}: {body}")]
    Status {
        /// The status code.
        status: u16,
        /// The start of the body (at most the sender's excerpt length, as
        /// lossy UTF-8).
        body: String,
    },
    /// The server answered 429.
    #[error("rate limited (429){}", retry_after_ms.map(|ms| format!("; retry after {ms} ms")).unwrap_or_default())]
    RateLimited {
        /// How long it asked to wait, if it said (`retry_after_ms` in a
        /// JSON body, or a `Retry-After` header in seconds).
        retry_after_ms: Option<u64>,
    },
    /// No answer within the sender's timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The request did not complete: refused, reset, dropped.
    #[error("{0}")]
    Transport(String),
    /// The request cannot be made: its path does not make a URL with the
    /// sender's base, or its content type cannot go in a header.
    #[error("the request cannot be made: {0}")]
    Unsendable(String),
}

impl HttpError {
    /// The core's failure kind for it: 429 waits at least what the server
    /// asked (a floor the policy's jitter spreads upward); 5xx, a timeout
    /// and a failed connection are transient (the policy's backoff); any
    /// other status, and a request that cannot be made, are permanent (a
    /// dead letter: retrying cannot help).
    pub fn kind(&self) -> FailureKind {
        match self {
            HttpError::RateLimited { retry_after_ms: Some(ms) } => FailureKind::RetryAfter(Delay(*ms)),
            HttpError::RateLimited { retry_after_ms: None } | HttpError::Timeout(_) | HttpError::Transport(_) => {
                FailureKind::Transient
            }
            HttpError::Status { status, .. } if (500..600).contains(status) => FailureKind::Transient,
            HttpError::Status { .. } | HttpError::Unsendable(_) => FailureKind::Permanent,
        }
    }

    /// Whether the server answered (it is reachable), whatever it said.
    pub fn answered(&self) -> bool {
        matches!(self, HttpError::Status { .. } | HttpError::RateLimited { .. })
    }
}

/// What `status`, `headers` and the start of the `body` mean: `Ok` for a
/// success (2xx), the error otherwise. `excerpt` bounds the body kept in
/// the error, in bytes; `max_wait_ms` what a 429 may ask to wait (a longer
/// wait is cut to it).
pub(crate) fn classify(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    excerpt: usize,
    max_wait_ms: u64,
) -> Result<(), HttpError> {
    if status.is_success() {
        return Ok(());
    }
    if status == StatusCode::TOO_MANY_REQUESTS {
        let retry_after_ms = retry_after_ms(headers, body).map(|ms| ms.min(max_wait_ms));
        return Err(HttpError::RateLimited { retry_after_ms });
    }
    let body = String::from_utf8_lossy(&body[..body.len().min(excerpt)]).into_owned();
    Err(HttpError::Status { status: status.as_u16(), body })
}

/// How long a 429 asks to wait: the JSON body's `retry_after_ms` (Matrix's
/// field), else the `Retry-After` header in whole seconds (saturating). An
/// HTTP-date in the header, or a value of neither form, is ignored (the
/// policy's backoff applies).
fn retry_after_ms(headers: &HeaderMap, body: &[u8]) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Body {
        retry_after_ms: Option<u64>,
    }
    if let Ok(Body { retry_after_ms: Some(ms) }) = serde_json::from_slice::<Body>(body) {
        return Some(ms);
    }
    let seconds: u64 = headers.get(RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    Some(seconds.saturating_mul(1_000))
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    fn with_retry_after(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_str(value).unwrap_or_else(|e| panic!("{e}")));
        h
    }

    #[test]
    fn statuses_map_onto_the_cores_failure_kinds() {
        let none = HeaderMap::new();
        let kind = |status: u16, headers: &HeaderMap, body: &[u8]| {
            let status = StatusCode::from_u16(status).unwrap_or_else(|e| panic!("{e}"));
            classify(status, headers, body, 8, u64::MAX).map_err(|e| (e.kind(), e))
        };
        for ok in [200, 201, 204, 299] {
            assert_eq!(kind(ok, &none, b""), Ok(()), "{ok}");
        }
        // 429: the body's retry_after_ms first, then the header, else the
        // policy's backoff.
        let both = with_retry_after("7");
        assert_eq!(
            kind(429, &both, br#"{"errcode":"M_LIMIT_EXCEEDED","retry_after_ms":1500}"#),
            Err((FailureKind::RetryAfter(Delay(1_500)), HttpError::RateLimited { retry_after_ms: Some(1_500) }))
        );
        assert_eq!(kind(429, &both, b"busy").map_err(|e| e.0), Err(FailureKind::RetryAfter(Delay(7_000))));
        assert_eq!(kind(429, &none, b"{}").map_err(|e| e.0), Err(FailureKind::Transient));
        let huge = with_retry_after("18446744073709551615");
        assert_eq!(kind(429, &huge, b"").map_err(|e| e.0), Err(FailureKind::RetryAfter(Delay(u64::MAX))));
        for ignored in ["Wed, 21 Oct 2026 07:28:00 GMT", "-3", "1.5", ""] {
            let h = with_retry_after(ignored);
            assert_eq!(kind(429, &h, b"").map_err(|e| e.0), Err(FailureKind::Transient), "{ignored:?}");
        }
        // 5xx: transient; any other status: permanent, with the start of
        // the body.
        for transient in [500, 502, 503, 599] {
            assert_eq!(kind(transient, &none, b"").map_err(|e| e.0), Err(FailureKind::Transient), "{transient}");
        }
        for permanent in [400, 401, 403, 404, 409, 413, 301, 600] {
            assert_eq!(kind(permanent, &none, b"").map_err(|e| e.0), Err(FailureKind::Permanent), "{permanent}");
        }
        assert_eq!(
            kind(400, &none, "M_BAD_JSON: the body is not \u{e9}".as_bytes()),
            Err((FailureKind::Permanent, HttpError::Status { status: 400, body: "M_BAD_JS".into() }))
        );
    }

    #[test]
    fn a_429_asking_for_longer_than_the_limit_is_cut_to_it() {
        let limited = |body: &[u8], headers: &HeaderMap| {
            classify(StatusCode::TOO_MANY_REQUESTS, headers, body, 8, 3_600_000).map_err(|e| e.kind())
        };
        let huge = br#"{"retry_after_ms":18446744073709551615}"#;
        assert_eq!(limited(huge, &HeaderMap::new()), Err(FailureKind::RetryAfter(Delay(3_600_000))));
        let days = with_retry_after("864000");
        assert_eq!(limited(b"", &days), Err(FailureKind::RetryAfter(Delay(3_600_000))));
        assert_eq!(limited(br#"{"retry_after_ms":1200}"#, &days), Err(FailureKind::RetryAfter(Delay(1_200))));
    }

    #[test]
    fn errors_say_what_happened_and_whether_the_server_answered() {
        let limited = HttpError::RateLimited { retry_after_ms: Some(250) };
        assert_eq!(limited.to_string(), "rate limited (429); retry after 250 ms");
        assert_eq!(HttpError::RateLimited { retry_after_ms: None }.to_string(), "rate limited (429)");
        assert_eq!(HttpError::Status { status: 404, body: "gone".into() }.to_string(), "404: gone");
        assert_eq!(HttpError::Timeout(Duration::from_secs(2)).to_string(), "no answer within 2s");
        assert!(limited.answered() && HttpError::Status { status: 500, body: String::new() }.answered());
        for silent in [
            HttpError::Timeout(Duration::ZERO),
            HttpError::Transport("reset".into()),
            HttpError::Unsendable("x".into()),
        ] {
            assert!(!silent.answered(), "{silent:?}");
        }
        assert_eq!(HttpError::Unsendable("::".into()).kind(), FailureKind::Permanent);
        assert_eq!(HttpError::Timeout(Duration::ZERO).kind(), FailureKind::Transient);
    }
}
