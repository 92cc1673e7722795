//! The seam between a receiver and the store of its application: where a
//! producer's stream resumes after the receiver forgot it.

use crate::Incarnation;

/// The application's durable record of what it committed, consulted when
/// a handshake names a stream the receiver does not hold (after a restart
/// of the receiver, or once the stream was forgotten): the stream starts
/// where the record says, so that nothing the application committed is
/// delivered to it again.
///
/// The application writes the record in the same transaction as its own
/// effect of the delivery (`egress_store::ReceivedLog::record` does it for
/// SQLite), and commits the delivery once that transaction commits:
/// whatever the moment the receiver dies, a delivery's effect and its
/// record are both durable or both not.
///
/// It lives here, below both, so that a store implements it without
/// depending on a transport and a receiver takes it without depending on a
/// store (the reference receiver: `egress_ws::ReceiverConfig::resume`).
pub trait Resume: core::fmt::Debug + Send + Sync + 'static {
    /// The sequence the record says comes next on `producer`'s stream
    /// `incarnation` (every one below it was committed durably), or `None`
    /// if it has none. The reference receiver calls it on a blocking
    /// thread, and refuses the handshake on an error with close code 5
    /// (Retry): the producer comes back.
    ///
    /// # Errors
    /// The store's, in words.
    fn resume(&self, producer: &str, incarnation: Incarnation) -> Result<Option<u64>, String>;
}
