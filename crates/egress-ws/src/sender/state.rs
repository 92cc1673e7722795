//! Where a sender's connection is, and its counters.

use crate::connect_error::ConnectError;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(doc)]
use super::{Sender, SenderConfig};
use egress_core::Generation;
use egress_reactive::{Signal, Threaded};

/// Where a [`Sender`]'s connection is, for a UI to say "connected",
/// "offline, retrying in 3 s" or "stopped: why": a signal on the cell's
/// graph ([`Sender::state`]) and a stream ([`Sender::watch_state`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionState {
    /// Connecting and handshaking: `attempt` counts the attempts since the
    /// last connection that moved the stream on (1: the first).
    Connecting {
        /// Which attempt.
        attempt: u32,
    },
    /// Open: the receiver welcomed this generation, and the cell sends.
    Connected {
        /// The connection's generation.
        generation: Generation,
    },
    /// Waiting for the backoff before the next attempt.
    Reconnecting {
        /// When the next attempt starts.
        retry_at: std::time::Instant,
        /// How many connections or attempts failed in a row (what the
        /// backoff doubles with).
        failures: u32,
        /// Why the last one ended.
        error: ConnectError,
    },
    /// Not connecting again: shut down or dropped (`error: None`), or
    /// stopped on its own (`error`: why; see [`Sender::failure`]): refused
    /// credentials, [`SenderConfig::max_attempts`] reached, or no
    /// generation left.
    Stopped {
        /// Why it stopped on its own.
        error: Option<ConnectError>,
    },
}

impl ConnectionState {
    /// Whether the sender is connected: a receiver welcomed it, and the
    /// cell sends.
    pub fn is_online(&self) -> bool {
        matches!(self, ConnectionState::Connected { .. })
    }

    /// The error of a reconnect or a stop, if any.
    pub fn error(&self) -> Option<&ConnectError> {
        match self {
            ConnectionState::Reconnecting { error, .. } | ConnectionState::Stopped { error: Some(error) } => {
                Some(error)
            }
            _ => None,
        }
    }
}

/// A few words for a status bar: "online", "connecting (attempt 2)",
/// "offline: connection refused; retrying in 3 s", "stopped: unauthorized
/// (401)".
impl std::fmt::Display for ConnectionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectionState::Connecting { attempt: 1 } => f.write_str("connecting"),
            ConnectionState::Connecting { attempt } => write!(f, "connecting (attempt {attempt})"),
            ConnectionState::Connected { .. } => f.write_str("online"),
            ConnectionState::Reconnecting { retry_at, error, .. } => {
                let wait = retry_at.saturating_duration_since(std::time::Instant::now());
                // Rounded up: "in 0 s" would read as now.
                let secs = wait.as_millis().div_ceil(1000);
                write!(f, "offline: {error}; retrying in {secs} s")
            }
            ConnectionState::Stopped { error: None } => f.write_str("stopped"),
            ConnectionState::Stopped { error: Some(error) } => write!(f, "stopped: {error}"),
        }
    }
}

/// Counters of a sender's connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Connections whose handshake succeeded.
    pub connections: u64,
    /// Connections that ended (lost, killed, stalled, refused) and were
    /// replaced.
    pub reconnects: u64,
    /// Attempts that failed before the handshake completed.
    pub failed_attempts: u64,
    /// Connections ended for a protocol error (of either side; this side
    /// closes with code 1 when it finds one).
    pub protocol_errors: u64,
    /// Handshakes refused for a stale generation, each answered with a
    /// generation above the receiver's latest, or at most 2^32 closer to it
    /// (at once, unless the one before was answered at once too and nothing
    /// got through since).
    pub stale_refusals: u64,
    /// Sends held back because the payload was above the connected
    /// receiver's advertised max-payload (but within the sender's own):
    /// each ended its connection, and its record waited for the next.
    pub held_too_large: u64,
}

pub(super) struct Counters {
    /// Where the connection is; see [`ConnectionState`].
    pub(super) state: Signal<ConnectionState, Threaded>,
    pub(super) connections: AtomicU64,
    pub(super) reconnects: AtomicU64,
    pub(super) failed_attempts: AtomicU64,
    pub(super) protocol_errors: AtomicU64,
    pub(super) stale_refusals: AtomicU64,
    pub(super) held_too_large: AtomicU64,
    pub(super) fatal: parking_lot::Mutex<Option<ConnectError>>,
    /// The largest payload that can go out: the own limit, or the last
    /// welcome's if smaller. The cell's size check reads it (its own
    /// handle: the check, held by the cell, holds nothing of the graph).
    pub(super) payload_limit: Arc<std::sync::atomic::AtomicUsize>,
}

impl Counters {
    pub(super) fn new(state: Signal<ConnectionState, Threaded>, own_max: usize) -> Self {
        Counters {
            payload_limit: Arc::new(std::sync::atomic::AtomicUsize::new(own_max)),
            state,
            connections: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            failed_attempts: AtomicU64::new(0),
            protocol_errors: AtomicU64::new(0),
            stale_refusals: AtomicU64::new(0),
            held_too_large: AtomicU64::new(0),
            fatal: parking_lot::Mutex::new(None),
        }
    }

    /// Moves the connection's state to `new`, with an event: a connection
    /// or a reconnect at info, a stop for an error at error, an attempt at
    /// debug.
    pub(super) fn report(&self, new: ConnectionState) {
        match &new {
            ConnectionState::Connecting { attempt } => tracing::debug!(attempt, "egress sender: connecting"),
            ConnectionState::Connected { generation } => {
                tracing::info!(generation = generation.get(), "egress sender: connected");
            }
            ConnectionState::Reconnecting { retry_at, failures, error } => {
                let delay_ms = retry_at.saturating_duration_since(std::time::Instant::now()).as_millis();
                tracing::info!(%error, failures, delay_ms, "egress sender: reconnecting");
            }
            ConnectionState::Stopped { error: Some(error) } => tracing::error!(%error, "egress sender: stopped"),
            ConnectionState::Stopped { error: None } => tracing::info!("egress sender: shut down"),
        }
        // A disposed cell has no readers left to tell.
        let _ = self.state.try_set(new);
    }

    pub(super) fn snapshot(&self) -> SenderStats {
        SenderStats {
            connections: self.connections.load(Ordering::Relaxed),
            reconnects: self.reconnects.load(Ordering::Relaxed),
            failed_attempts: self.failed_attempts.load(Ordering::Relaxed),
            protocol_errors: self.protocol_errors.load(Ordering::Relaxed),
            stale_refusals: self.stale_refusals.load(Ordering::Relaxed),
            held_too_large: self.held_too_large.load(Ordering::Relaxed),
        }
    }
}
