//! Why a sender is not connected, typed: what a UI tells a person (its
//! `Display` is a few words for a status bar, [`ConnectError::detail`] the
//! rest) and what a program decides on (retry, or stop and ask for new
//! credentials).

use std::sync::Arc;

/// Why a [`Sender`](crate::Sender)'s connection attempt failed or its
/// connection ended: in [`ConnectionState::Reconnecting`](crate::ConnectionState::Reconnecting)
/// and [`ConnectionState::Stopped`](crate::ConnectionState::Stopped).
///
/// `Display` is short ("unauthorized (401)", "connection refused", "TLS
/// failed"); [`detail`](Self::detail) carries what the network or the peer
/// said, which may be long and name the URL.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConnectError {
    /// The server answered the upgrade with 401: the credentials (say, a
    /// bearer token in [`SenderConfig::headers`](crate::SenderConfig::headers))
    /// are missing or wrong. Stops the sender unless
    /// [`SenderConfig::retry_unauthorized`](crate::SenderConfig::retry_unauthorized).
    Unauthorized,
    /// The server answered the upgrade with 403: these credentials may not
    /// send here. Stops the sender like [`Unauthorized`](Self::Unauthorized).
    Forbidden,
    /// The server answered the upgrade with another HTTP status (a 404, a
    /// 503 of a proxy, ...).
    Http(u16),
    /// Nothing listens there: the TCP connection was refused.
    Refused,
    /// The address did not resolve, the network is unreachable, or another
    /// I/O failure before the connection was up.
    Unreachable(Arc<str>),
    /// The TLS handshake failed (a certificate not trusted, a name that
    /// does not match, no common protocol).
    Tls(Arc<str>),
    /// The connection and its handshake took longer than
    /// [`SenderConfig::connect_timeout`](crate::SenderConfig::connect_timeout).
    Timeout,
    /// The receiver is at one of its bounds (close code 6) and named when
    /// to come back.
    Busy(Arc<str>),
    /// The receiver asked for a new connection (a stale generation, code 4;
    /// a stream it needs replayed, code 5): the sender reconnects at once.
    Renew(Arc<str>),
    /// A breach of the protocol, by the receiver or (as the receiver said)
    /// by this side.
    Protocol(Arc<str>),
    /// An open connection ended: lost, closed by the receiver, killed, or
    /// silent past the stall timeout.
    Lost(Arc<str>),
    /// [`SenderConfig::max_attempts`](crate::SenderConfig::max_attempts)
    /// attempts failed in a row; the last one for `last`.
    GaveUp {
        /// How many attempts failed in a row.
        attempts: u32,
        /// Why the last one failed.
        last: Box<ConnectError>,
    },
    /// The sender cannot go on (no generation is left above the last).
    Fatal(Arc<str>),
}

impl ConnectError {
    /// What the network or the peer said, when there is more to say than
    /// the kind (`None` for the kinds that say it all).
    pub fn detail(&self) -> Option<&str> {
        match self {
            ConnectError::Unreachable(d)
            | ConnectError::Tls(d)
            | ConnectError::Busy(d)
            | ConnectError::Renew(d)
            | ConnectError::Protocol(d)
            | ConnectError::Lost(d)
            | ConnectError::Fatal(d) => Some(d),
            ConnectError::GaveUp { last, .. } => Some(last.detail().unwrap_or("")),
            ConnectError::Unauthorized
            | ConnectError::Forbidden
            | ConnectError::Http(_)
            | ConnectError::Refused
            | ConnectError::Timeout => None,
        }
    }

    /// Whether the server refused these credentials (401 or 403): trying
    /// again with the same ones cannot help.
    pub fn is_auth(&self) -> bool {
        matches!(self, ConnectError::Unauthorized | ConnectError::Forbidden)
    }

    /// The kind of a failed upgrade or connect, from tungstenite's error.
    pub(crate) fn of_ws(e: &tokio_tungstenite::tungstenite::Error) -> Self {
        use tokio_tungstenite::tungstenite::Error as E;
        match e {
            E::Http(response) => match response.status().as_u16() {
                401 => ConnectError::Unauthorized,
                403 => ConnectError::Forbidden,
                status => ConnectError::Http(status),
            },
            E::Io(io) => Self::of_io(io),
            #[cfg(feature = "tls")]
            E::Tls(tls) => ConnectError::Tls(tls.to_string().into()),
            E::ConnectionClosed | E::AlreadyClosed => ConnectError::Lost(e.to_string().into()),
            other => ConnectError::Protocol(other.to_string().into()),
        }
    }

    /// The kind of an I/O failure before the connection was up: a refused
    /// TCP connection, a TLS failure (rustls reports through I/O errors), or
    /// the rest.
    pub(crate) fn of_io(e: &std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        match e.kind() {
            K::ConnectionRefused => return ConnectError::Refused,
            // Closed by the server during TLS or the upgrade (a receiver
            // at its connection bound closes a TLS socket so).
            K::UnexpectedEof | K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => {
                return ConnectError::Lost(e.to_string().into());
            }
            _ => {}
        }
        #[cfg(feature = "tls")]
        if e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()) {
            return ConnectError::Tls(e.to_string().into());
        }
        ConnectError::Unreachable(e.to_string().into())
    }
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Unauthorized => f.write_str("unauthorized (401)"),
            ConnectError::Forbidden => f.write_str("forbidden (403)"),
            ConnectError::Http(status) => write!(f, "HTTP {status}"),
            ConnectError::Refused => f.write_str("connection refused"),
            ConnectError::Unreachable(_) => f.write_str("unreachable"),
            ConnectError::Tls(_) => f.write_str("TLS failed"),
            ConnectError::Timeout => f.write_str("timed out"),
            ConnectError::Busy(_) => f.write_str("receiver busy"),
            ConnectError::Renew(_) => f.write_str("renewing the connection"),
            ConnectError::Protocol(_) => f.write_str("protocol error"),
            ConnectError::Lost(_) => f.write_str("connection lost"),
            ConnectError::GaveUp { attempts, last } => write!(f, "gave up after {attempts} attempts: {last}"),
            ConnectError::Fatal(_) => f.write_str("cannot go on"),
        }
    }
}

impl std::error::Error for ConnectError {}
