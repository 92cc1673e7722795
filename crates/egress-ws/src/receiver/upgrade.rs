//! The receiver's door: TLS (feature `tls`) and the authorization of the
//! WebSocket upgrade request, before any protocol frame.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http;

use crate::sender::Io;

/// An upgrade request as [`Authorize`] sees it: the path, the headers and
/// the peer's address.
#[derive(Debug)]
pub struct Upgrade<'a> {
    request: &'a Request,
    peer: SocketAddr,
}

impl Upgrade<'_> {
    /// The request's path (with its query, if any).
    pub fn path(&self) -> &str {
        self.request.uri().path_and_query().map_or("/", http::uri::PathAndQuery::as_str)
    }

    /// The value of header `name` (case-insensitive); the first if there
    /// are several; `None` if absent.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.request.headers().get(name).map(http::HeaderValue::as_bytes)
    }

    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }
}

/// Why [`Authorize`] refused an upgrade: answered with the HTTP status,
/// before any protocol frame (the reference sender stops on either, as
/// `ConnectError::Unauthorized` or `ConnectError::Forbidden`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// 401: no credentials, or not valid ones (with `WWW-Authenticate:
    /// Bearer`).
    Unauthorized,
    /// 403: valid credentials that may not send here.
    Forbidden,
}

/// Decides whether an upgrade request may open a connection (see
/// [`ReceiverConfig::authorize`](crate::ReceiverConfig::authorize)). It
/// runs on the connection's task, before the handshake; a panic in it
/// refuses the connection like a 401 and touches nothing shared.
///
/// The check is synchronous (the WebSocket library's upgrade callback is),
/// so the handshake timeout cannot cut it short: keep it fast (a lookup in
/// memory; resolve tokens ahead of time rather than calling a service per
/// request). On a multi-thread tokio runtime it runs under
/// `block_in_place`, so a slow check holds its own connection only, and
/// the others go on; on a current-thread runtime a slow check holds the
/// whole receiver.
#[derive(Clone)]
pub struct Authorize(Arc<Check>);

/// The application's check behind an [`Authorize`].
type Check = dyn Fn(&Upgrade<'_>) -> Result<(), Refusal> + Send + Sync;

impl Authorize {
    /// A check of the application's own.
    pub fn new(check: impl Fn(&Upgrade<'_>) -> Result<(), Refusal> + Send + Sync + 'static) -> Self {
        Authorize(Arc::new(check))
    }

    /// Admits exactly the requests whose first `Authorization` header is
    /// `Bearer <token>`: the scheme in any case (RFC 7235), then spaces,
    /// then the token, compared in time independent of where it differs;
    /// any other is refused as [`Refusal::Unauthorized`]. The sender sends
    /// it with `SenderConfig::headers`.
    pub fn bearer(token: impl Into<String>) -> Self {
        let expected = token.into().into_bytes();
        Authorize::new(move |upgrade| match upgrade.header("authorization").and_then(bearer_token) {
            Some(given) if equal_in_constant_time(given, &expected) => Ok(()),
            _ => Err(Refusal::Unauthorized),
        })
    }

    /// What the check says of `upgrade`; a panic is a refusal. On a
    /// multi-thread runtime it runs under `block_in_place`, so a check
    /// that blocks holds this connection's worker only.
    pub(crate) fn check(&self, upgrade: &Upgrade<'_>) -> Result<(), Refusal> {
        let run = || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.0)(upgrade))).unwrap_or_else(|_| {
                tracing::error!(peer = %upgrade.peer, "egress receiver: the authorization check panicked; refused");
                Err(Refusal::Unauthorized)
            })
        };
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if multi_thread { tokio::task::block_in_place(run) } else { run() }
    }
}

impl std::fmt::Debug for Authorize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Authorize(..)")
    }
}

/// The token of an `Authorization` value of the `Bearer` scheme (in any
/// case), after the spaces that follow the scheme, trailing spaces and tabs
/// cut; `None` for another scheme.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || !rest.starts_with(b" ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Whether `a` and `b` are equal, looking at every byte of the longer
/// whatever the first difference.
fn equal_in_constant_time(a: &[u8], b: &[u8]) -> bool {
    let mut differ = u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        differ |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    differ == 0
}

/// The byte stream of an accepted TCP connection: TLS on top when the
/// receiver has a server configuration.
pub(crate) async fn secure(
    tcp: TcpStream,
    #[cfg(feature = "tls")] tls: Option<&Arc<rustls::ServerConfig>>,
) -> std::io::Result<Box<dyn Io>> {
    #[cfg(feature = "tls")]
    if let Some(config) = tls {
        let accepted = tokio_rustls::TlsAcceptor::from(config.clone()).accept(tcp).await?;
        return Ok(Box::new(accepted));
    }
    Ok(Box::new(tcp))
}

/// The answer to an upgrade request: the handshake goes on, or the
/// refusal's status.
#[allow(clippy::result_large_err)] // tungstenite's callback type
pub(crate) fn answer(
    authorize: Option<&Authorize>,
    peer: SocketAddr,
    request: &Request,
    response: Response,
    refused: &mut Option<Refusal>,
) -> Result<Response, ErrorResponse> {
    let Some(authorize) = authorize else { return Ok(response) };
    match authorize.check(&Upgrade { request, peer }) {
        Ok(()) => Ok(response),
        Err(refusal) => {
            *refused = Some(refusal);
            let mut denied = ErrorResponse::new(None);
            match refusal {
                Refusal::Unauthorized => {
                    *denied.status_mut() = http::StatusCode::UNAUTHORIZED;
                    denied.headers_mut().insert("www-authenticate", http::HeaderValue::from_static("Bearer"));
                }
                Refusal::Forbidden => *denied.status_mut() = http::StatusCode::FORBIDDEN,
            }
            Err(denied)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{bearer_token, equal_in_constant_time};

    #[test]
    fn a_bearer_token_is_read_after_the_scheme_in_any_case() {
        for (value, token) in [
            (&b"Bearer abc"[..], Some(&b"abc"[..])),
            (b"bearer abc", Some(b"abc")),
            (b"BEARER   abc \t", Some(b"abc")),
            (b"Bearer ", None),
            (b"Bearerabc", None),
            (b"Basic abc", None),
            (b"Bear", None),
            (b"", None),
        ] {
            assert_eq!(bearer_token(value), token, "{:?}", String::from_utf8_lossy(value));
        }
    }

    #[test]
    fn equal_in_constant_time_is_equality() {
        for (a, b) in [(&b""[..], &b""[..]), (b"abc", b"abc"), (b"abc", b"abd"), (b"abc", b"ab"), (b"", b"a")] {
            assert_eq!(equal_in_constant_time(a, b), a == b, "{a:?} {b:?}");
        }
    }
}
