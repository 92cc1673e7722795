//! How a publisher is configured, and what it refuses at spawn.

use std::sync::Arc;
use std::time::Duration;

use async_nats::ConnectOptions;

/// Makes the client's connect options: for credentials, TLS, or a name.
/// The publisher adds its own event callback (it replaces one set here),
/// reconnect delays and retry on the first connect.
pub type Options = Arc<dyn Fn() -> ConnectOptions + Send + Sync>;

#[cfg(doc)]
use egress_core::DeadLetters;

#[cfg(doc)]
use super::{Publisher, PublisherError};

/// How a [`Publisher`] publishes.
#[derive(Clone)]
pub struct PublisherConfig {
    /// The producer id, in every message's headers and message id: with
    /// the cell's incarnation, the key of the consumers' state.
    pub producer: String,
    /// The JetStream stream, which must hold `subject` only (the fence
    /// expects the stream's last message id, so another subject's message
    /// would refuse every publish: checked at the first connection,
    /// [`PublisherError::SharedStream`]).
    pub stream: String,
    /// The subject the records are published to: one egress stream.
    pub subject: String,
    /// How long a publish acknowledgement or a JetStream request may take
    /// before the connection is taken as lost.
    pub timeout: Duration,
    /// The first delay before a new epoch after a lost one; it doubles per
    /// failure...
    pub backoff_base: Duration,
    /// ...up to this.
    pub backoff_max: Duration,
    /// The seed of the backoff's jitter.
    pub seed: u64,
    /// Publish acknowledgements the client may wait for at once (its
    /// `max_ack_inflight`; acknowledgements abandoned with a lost
    /// connection hold theirs until `timeout`).
    pub max_ack_inflight: usize,
    /// The client's connect options; `None`: the defaults.
    pub options: Option<Options>,
}

impl std::fmt::Debug for PublisherConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublisherConfig")
            .field("producer", &self.producer)
            .field("stream", &self.stream)
            .field("subject", &self.subject)
            .field("timeout", &self.timeout)
            .field("backoff_base", &self.backoff_base)
            .field("backoff_max", &self.backoff_max)
            .field("seed", &self.seed)
            .field("max_ack_inflight", &self.max_ack_inflight)
            .field("options", &self.options.as_ref().map(|_| "custom"))
            .finish()
    }
}

impl PublisherConfig {
    /// The defaults for `producer` publishing to `subject` of JetStream
    /// stream `stream`.
    pub fn new(producer: impl Into<String>, stream: impl Into<String>, subject: impl Into<String>) -> Self {
        PublisherConfig {
            producer: producer.into(),
            stream: stream.into(),
            subject: subject.into(),
            timeout: Duration::from_secs(2),
            backoff_base: Duration::from_millis(20),
            backoff_max: Duration::from_secs(2),
            seed: 0x5eed,
            max_ack_inflight: 16_384,
            options: None,
        }
    }
}

/// Why [`Publisher::spawn`] refused its arguments: no retry could help.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// Not a NATS server address.
    #[error("not a NATS URL: {url:?}: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A producer id that cannot go in a header: empty, or not printable
    /// ASCII.
    #[error("producer id {0:?}: not empty printable ASCII")]
    InvalidProducer(String),
    /// A subject a message cannot be published to: empty, with a wildcard
    /// or white space, or an empty token.
    #[error("subject {0:?}: not a publishable subject")]
    InvalidSubject(String),
    /// An empty stream name, or one with a `.`, `*`, `>` or white space.
    #[error("stream {0:?}: not a stream name")]
    InvalidStream(String),
    /// The cell was disposed: nothing could be published from it.
    #[error("the cell was disposed")]
    CellDisposed,
    /// The cell's policy holds dead letters: a stream's order is fixed as
    /// it is published, so a dead letter takes its place as a tombstone
    /// ([`DeadLetters::Skip`]); a held one would leave a hole that the
    /// stream's last message covers.
    #[error("the cell's policy holds dead letters: NATS streams need DeadLetters::Skip")]
    HoldUnsupported,
}
