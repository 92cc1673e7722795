//! Where a transport's connection is: the value a sender or a publisher
//! shows a UI, and the node on its cell's graph that holds it. One type
//! for every transport (egress-ws's `Sender`, egress-nats's `Publisher`),
//! over the transport's own error.

use std::fmt;

use egress_core::Generation;

use super::AsyncEgressCell;
use crate::asynchronous::Watch;
use crate::{Computed, Handle, Signal, Threaded};

/// Where a transport's connection is, for a UI to say "online", "offline:
/// why; retrying in 3 s" or "stopped: why". `E` is the transport's error
/// (egress-ws: `ConnectError`; egress-nats: `LinkError`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionState<E> {
    /// Connecting (and handshaking): `attempt` counts the attempts since
    /// the last connection that moved the stream on (1: the first).
    Connecting {
        /// Which attempt.
        attempt: u32,
    },
    /// Open: the other side accepted this generation, and the cell sends.
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
        error: E,
    },
    /// Not connecting again: shut down or dropped (`error: None`), or
    /// stopped on its own (`error`: why).
    Stopped {
        /// Why it stopped on its own.
        error: Option<E>,
    },
}

impl<E> ConnectionState<E> {
    /// Whether it is connected: the other side accepted it, and the cell
    /// sends.
    pub fn is_online(&self) -> bool {
        matches!(self, ConnectionState::Connected { .. })
    }

    /// The error of a reconnect or a stop, if any.
    pub fn error(&self) -> Option<&E> {
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
impl<E: fmt::Display> fmt::Display for ConnectionState<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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

/// A cell whose scope owns what a transport of it projects (its
/// [`ConnectionTracker`]): an [`AsyncEgressCell`] or an
/// [`AsyncLanesCell`](crate::AsyncLanesCell).
pub trait CellScope {
    /// Runs `f` on the cell's graph with the cell as owner.
    ///
    /// # Errors
    /// [`ReadError::Disposed`](crate::ReadError) (and `f` not run) if the
    /// cell was disposed.
    fn in_scope<R>(&self, f: impl FnOnce(&Handle<Threaded>) -> R) -> Result<R, crate::ReadError>;
}

impl<T: Clone + Send + Sync + 'static> CellScope for AsyncEgressCell<T> {
    fn in_scope<R>(&self, f: impl FnOnce(&Handle<Threaded>) -> R) -> Result<R, crate::ReadError> {
        crate::EgressCellOf::in_scope(self, f)
    }
}

impl<K: egress_core::LaneKey + Send + Sync + 'static, T: Clone + Send + Sync + 'static> CellScope
    for crate::AsyncLanesCell<K, T>
{
    fn in_scope<R>(&self, f: impl FnOnce(&Handle<Threaded>) -> R) -> Result<R, crate::ReadError> {
        crate::LanesCellOf::in_scope(self, f)
    }
}

/// A transport's [`ConnectionState`] on its cell's graph: the signal the
/// transport's task moves, and the computed (and stream) the application
/// reads. Its nodes belong to the cell's scope, as the cell's readers do.
///
/// Each move is logged (through `tracing`, in the caller's span) as
/// "`{who}`: connecting" at debug, "connected" and "reconnecting" at info,
/// "stopped" (with its error) at error, and "shut down" at info.
///
/// `Stopped` is final: the first one set stays, and later moves are
/// dropped (a task aborted by a drop may run on to its next await and try
/// to say it connected).
pub struct ConnectionTracker<E: 'static> {
    signal: Signal<ConnectionState<E>, Threaded>,
    state: Computed<ConnectionState<E>, Threaded>,
    graph: Handle<Threaded>,
    who: &'static str,
    /// The first `Stopped` set: final.
    stopped: std::sync::Arc<std::sync::OnceLock<ConnectionState<E>>>,
}

impl<E: 'static> Clone for ConnectionTracker<E> {
    fn clone(&self) -> Self {
        ConnectionTracker {
            signal: self.signal.clone(),
            state: self.state.clone(),
            graph: self.graph.clone(),
            who: self.who,
            stopped: self.stopped.clone(),
        }
    }
}

impl<E: 'static> fmt::Debug for ConnectionTracker<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionTracker").field("who", &self.who).finish_non_exhaustive()
    }
}

impl<E: fmt::Display + Clone + PartialEq + Send + Sync + 'static> ConnectionTracker<E> {
    /// Makes one in `cell`'s scope, at `Connecting { attempt: 1 }`; `who`
    /// names the transport in its log lines ("egress sender").
    ///
    /// # Errors
    /// [`ReadError::Disposed`](crate::ReadError) if the cell was disposed.
    pub fn new(cell: &impl CellScope, who: &'static str) -> Result<Self, crate::ReadError> {
        cell.in_scope(|graph| {
            let signal = graph.signal(ConnectionState::Connecting { attempt: 1 });
            let state = graph.computed({
                let signal = signal.clone();
                move || signal.get()
            });
            ConnectionTracker { signal, state, graph: graph.clone(), who, stopped: Default::default() }
        })
    }

    /// Moves the state to `new`, and logs the move. A disposed cell has no
    /// reader left to tell: the move is only logged. After a `Stopped`,
    /// nothing moves.
    pub fn set(&self, new: ConnectionState<E>) {
        if self.stopped.get().is_some() {
            return;
        }
        if matches!(new, ConnectionState::Stopped { .. }) && self.stopped.set(new.clone()).is_err() {
            // Another stop came first.
            return;
        }
        let who = self.who;
        match &new {
            ConnectionState::Connecting { attempt } => tracing::debug!(attempt, "{who}: connecting"),
            ConnectionState::Connected { generation } => {
                tracing::info!(generation = generation.get(), "{who}: connected");
            }
            ConnectionState::Reconnecting { retry_at, failures, error } => {
                let delay_ms = retry_at.saturating_duration_since(std::time::Instant::now()).as_millis();
                tracing::info!(%error, failures, delay_ms, "{who}: reconnecting");
            }
            ConnectionState::Stopped { error: Some(error) } => tracing::error!(%error, "{who}: stopped"),
            ConnectionState::Stopped { error: None } => tracing::info!("{who}: shut down"),
        }
        let _ = self.signal.try_set(new);
        // A stop set while this move was being made wins: set again, last.
        if let Some(last) = self.stopped.get() {
            let _ = self.signal.try_set(last.clone());
        }
    }

    /// The state, as a computed on the cell's graph: read it in an effect
    /// or a computed to follow it.
    pub fn state(&self) -> &Computed<ConnectionState<E>, Threaded> {
        &self.state
    }

    /// The state, as a stream: the current one first, then each change (a
    /// slow reader skips to the latest).
    pub fn watch(&self) -> Watch<ConnectionState<E>> {
        self.graph.watch(&self.state)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use egress_core::Policy;
    use futures::StreamExt as _;

    use super::*;
    use crate::AsyncContext;

    type State = ConnectionState<String>;

    #[test]
    fn online_only_when_connected_and_the_error_only_of_a_reconnect_or_a_failed_stop() {
        let later = Instant::now() + Duration::from_secs(3);
        let reconnecting = State::Reconnecting { retry_at: later, failures: 2, error: "refused".into() };
        assert!(State::Connected { generation: Generation(4) }.is_online());
        for s in [State::Connecting { attempt: 1 }, reconnecting.clone(), State::Stopped { error: None }] {
            assert!(!s.is_online(), "{s:?}");
        }
        assert_eq!(reconnecting.error().map(String::as_str), Some("refused"));
        assert_eq!(State::Stopped { error: Some("gone".into()) }.error().map(String::as_str), Some("gone"));
        for s in [
            State::Connecting { attempt: 2 },
            State::Connected { generation: Generation(1) },
            State::Stopped { error: None },
        ] {
            assert_eq!(s.error(), None, "{s:?}");
        }
    }

    #[test]
    fn a_status_bar_reads_a_few_words() {
        let text = |s: State| s.to_string();
        assert_eq!(text(State::Connecting { attempt: 1 }), "connecting");
        assert_eq!(text(State::Connecting { attempt: 3 }), "connecting (attempt 3)");
        assert_eq!(text(State::Connected { generation: Generation(1) }), "online");
        // 2.5 s away reads as 3 s (rounded up), a passed time as 0 s.
        let at = Instant::now() + Duration::from_millis(2_500);
        let shown = text(State::Reconnecting { retry_at: at, failures: 1, error: "refused".into() });
        assert!(
            shown == "offline: refused; retrying in 3 s" || shown == "offline: refused; retrying in 2 s",
            "{shown}"
        );
        let past = Instant::now().checked_sub(Duration::from_secs(1)).unwrap_or_else(Instant::now);
        assert_eq!(
            text(State::Reconnecting { retry_at: past, failures: 1, error: "x".into() }),
            "offline: x; retrying in 0 s"
        );
        assert_eq!(text(State::Stopped { error: None }), "stopped");
        assert_eq!(text(State::Stopped { error: Some("401".into()) }), "stopped: 401");
    }

    #[tokio::test]
    async fn the_tracker_shows_each_move_as_a_computed_and_a_stream_and_outlives_nothing() {
        let cx = AsyncContext::new();
        let cell = AsyncEgressCell::<u64>::new(&cx, Policy::default());
        let tracker = ConnectionTracker::<String>::new(&cell, "test transport").expect("a live cell");
        assert_eq!(tracker.state().get_untracked(), State::Connecting { attempt: 1 });
        let mut states = tracker.watch();
        assert_eq!(states.next().await, Some(State::Connecting { attempt: 1 }));
        tracker.set(State::Connected { generation: Generation(7) });
        assert_eq!(states.next().await, Some(State::Connected { generation: Generation(7) }));
        assert_eq!(tracker.clone().state().get_untracked(), State::Connected { generation: Generation(7) });
        assert_eq!(format!("{tracker:?}"), r#"ConnectionTracker { who: "test transport", .. }"#);
        // Stopped is final: a later move (a task aborted by a drop, running
        // on to its next await) does not undo it, nor does a second stop.
        tracker.set(State::Stopped { error: Some("first".into()) });
        tracker.set(State::Connected { generation: Generation(8) });
        tracker.set(State::Stopped { error: None });
        assert_eq!(tracker.state().get_untracked(), State::Stopped { error: Some("first".into()) });
        assert_eq!(states.next().await, Some(State::Stopped { error: Some("first".into()) }));
        // Its nodes are the cell's: disposed with it, after which a move
        // is dropped without a panic.
        cell.dispose();
        tracker.set(State::Stopped { error: None });
        assert!(ConnectionTracker::<String>::new(&cell, "test transport").is_err());
    }
}
