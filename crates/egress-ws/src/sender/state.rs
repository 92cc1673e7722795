//! Where a sender's connection is, and its counters.

use crate::connect_error::ConnectError;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(doc)]
use super::{Sender, SenderConfig};
use egress_reactive::ConnectionTracker;

/// Where a [`Sender`]'s connection is, for a UI to say "connected",
/// "offline, retrying in 3 s" or "stopped: why": a signal on the cell's
/// graph ([`Sender::state`]) and a stream ([`Sender::watch_state`]). The
/// type every transport shares, over this one's error: `Connected` once a
/// receiver welcomed the generation; `Stopped` with an error for refused
/// credentials, [`SenderConfig::max_attempts`] reached, or no generation
/// left (see [`Sender::failure`]).
pub type ConnectionState = egress_reactive::ConnectionState<ConnectError>;

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
    pub(super) state: ConnectionTracker<ConnectError>,
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
    pub(super) fn new(state: ConnectionTracker<ConnectError>, own_max: usize) -> Self {
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

    /// Moves the connection's state to `new` (and logs it: see
    /// [`ConnectionTracker`]).
    pub(super) fn report(&self, new: ConnectionState) {
        self.state.set(new);
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
