//! How a sender connects and reconnects.

use std::time::Duration;

#[cfg(feature = "tls")]
use std::sync::Arc;

use super::Connect;
#[cfg(doc)]
use super::{ReceiverTooSmall, Sender};
#[cfg(doc)]
use crate::ConnectError;
use crate::protocol::{DEFAULT_MAX_PAYLOAD, Limits};

/// How a [`Sender`] connects and reconnects.
#[derive(Clone)]
pub struct SenderConfig {
    /// The producer id sent in every handshake: with the cell's
    /// incarnation, the key of the receiver's state.
    pub producer: String,
    /// How long a connect and handshake may take.
    pub connect_timeout: Duration,
    /// The first reconnect delay; it doubles per failed connection...
    pub backoff_base: Duration,
    /// ...up to this.
    pub backoff_max: Duration,
    /// The seed of the reconnect jitter (each delay is drawn from its
    /// upper half).
    pub seed: u64,
    /// Reconnect when nothing at all (no frame, no ping) was heard from the
    /// receiver for this long while records are in flight: a dead peer. A
    /// live receiver whose application is slow keeps the connection alive
    /// with pings, and is waited for: the timeout in force on a connection
    /// is at least three of the keepalives its welcome advertised (each
    /// taken up to 60 s), whatever is configured here. `None`: never.
    pub stall_timeout: Option<Duration>,
    /// Decoding limits for what the receiver sends.
    pub limits: Limits,
    /// The largest payload this sender sends at all (1 MiB by default): a
    /// record above it is a dead letter at once (a permanent failure,
    /// tombstone reason 1), whatever a receiver accepts. A record within it
    /// but above what the connected receiver advertises is held for the
    /// next connection instead (see [`ReceiverTooSmall`]).
    pub max_payload: usize,
    /// Headers added to every WebSocket upgrade request, such as
    /// `("authorization", "Bearer ...")`; checked by [`Sender::spawn`].
    pub headers: Vec<(String, String)>,
    /// Opens the byte stream; `None`: a TCP connection to the URL's host.
    pub connect: Option<Connect>,
    /// The TLS configuration for `wss://` URLs; `None`: the webpki roots
    /// ([`tls::webpki_client_config`](crate::tls::webpki_client_config)).
    #[cfg(feature = "tls")]
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Whether a 401 or 403 to the upgrade is retried like any failure
    /// (`false` by default: the sender stops with
    /// [`ConnectError::Unauthorized`] or [`ConnectError::Forbidden`], since
    /// the same credentials cannot do better; spawn a new sender with new
    /// ones).
    pub retry_unauthorized: bool,
    /// Stops the sender with [`ConnectError::GaveUp`] once this many
    /// attempts or connections in a row have failed without moving the
    /// stream on (0 counts as 1: the first failure); `None` (the default):
    /// it never gives up. (A reconnect the receiver asks for at once, codes
    /// 4 and 5, is not a failure.)
    pub max_attempts: Option<u32>,
}

impl std::fmt::Debug for SenderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values may be secrets (a token): only their names.
        let headers: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("SenderConfig")
            .field("producer", &self.producer)
            .field("connect_timeout", &self.connect_timeout)
            .field("backoff_base", &self.backoff_base)
            .field("backoff_max", &self.backoff_max)
            .field("seed", &self.seed)
            .field("stall_timeout", &self.stall_timeout)
            .field("limits", &self.limits)
            .field("max_payload", &self.max_payload)
            .field("headers", &headers)
            .field("connect", &self.connect.as_ref().map(|_| "custom"))
            .field("retry_unauthorized", &self.retry_unauthorized)
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

impl SenderConfig {
    /// Adds `authorization: Bearer <token>` to the upgrade request (what
    /// [`Authorize::bearer`](crate::Authorize::bearer) checks on the
    /// reference receiver). The token is never shown by `Debug`.
    #[must_use]
    pub fn bearer(mut self, token: impl AsRef<str>) -> Self {
        self.headers.push(("authorization".into(), format!("Bearer {}", token.as_ref())));
        self
    }

    /// The defaults for producer `producer`.
    pub fn new(producer: impl Into<String>) -> Self {
        SenderConfig {
            producer: producer.into(),
            connect_timeout: Duration::from_secs(5),
            backoff_base: Duration::from_millis(20),
            backoff_max: Duration::from_secs(2),
            seed: 0x5eed,
            stall_timeout: Some(Duration::from_secs(5)),
            limits: Limits::default(),
            max_payload: DEFAULT_MAX_PAYLOAD,
            headers: Vec::new(),
            connect: None,
            #[cfg(feature = "tls")]
            tls: None,
            retry_unauthorized: false,
            max_attempts: None,
        }
    }
}
