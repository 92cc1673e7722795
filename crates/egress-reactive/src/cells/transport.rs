//! The transport seam: what an attachment sends through, and how a failed
//! send is reported.

use std::error::Error as StdError;
use std::future::Future;

use egress_core::{Delay, Envelope, FailureKind};

/// A failed send, with the [`FailureKind`] the cell passes to the core: a
/// transient failure parks the record for its backoff, a permanent one makes
/// it a dead letter, a retry-after floors the backoff.
///
/// ```
/// use egress_core::{Delay, FailureKind};
/// use egress_reactive::SendError;
///
/// let e = SendError::retry_after(Delay(5_000), "429 too many requests");
/// assert_eq!(e.kind(), FailureKind::RetryAfter(Delay(5_000)));
/// assert_eq!(e.to_string(), "send failed (RetryAfter(Delay(5000))): 429 too many requests");
/// ```
#[derive(Debug, thiserror::Error)]
#[error("send failed ({kind:?}): {source}")]
pub struct SendError {
    kind: FailureKind,
    source: Box<dyn StdError + Send + Sync>,
}

impl SendError {
    /// A failure of the given kind.
    pub fn new(kind: FailureKind, source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        SendError { kind, source: source.into() }
    }

    /// Worth retrying after the backoff (a dropped connection, a timeout).
    pub fn transient(source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self::new(FailureKind::Transient, source)
    }

    /// Retrying cannot help (the peer rejected the payload).
    pub fn permanent(source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self::new(FailureKind::Permanent, source)
    }

    /// The peer asked to wait at least `delay` ticks.
    pub fn retry_after(delay: Delay, source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self::new(FailureKind::RetryAfter(delay), source)
    }

    /// The kind the core receives.
    #[must_use]
    pub fn kind(&self) -> FailureKind {
        self.kind
    }
}

/// A synchronous transport, for the attachments of
/// [`EgressCell`](crate::EgressCell) and
/// [`ThreadSafeEgressCell`](crate::ThreadSafeEgressCell).
///
/// `send` hands one claimed envelope to the wire (or a buffer, or a
/// channel). `Ok` means the transport took it, not that the peer has it:
/// delivery is proven by a later acknowledgement, fed back with
/// [`Attachment::ack`](crate::Attachment::ack). The envelope is a copy
/// (the core keeps the record until it is acknowledged), so it can be moved
/// on without another clone.
///
/// `send` may call back into the cell (an in-memory transport may
/// acknowledge at once); those calls take effect in order, and a send they
/// make possible happens in a later run of the attachment.
pub trait Transport<T>: 'static {
    /// Sends one envelope.
    ///
    /// # Errors
    /// A [`SendError`] whose kind decides what the core does with the record.
    fn send(&mut self, envelope: Envelope<T>) -> Result<(), SendError>;
}

impl<T, Tr: Transport<T> + ?Sized> Transport<T> for Box<Tr> {
    fn send(&mut self, envelope: Envelope<T>) -> Result<(), SendError> {
        (**self).send(envelope)
    }
}

/// An async transport, for the attachments of
/// [`AsyncEgressCell`](crate::AsyncEgressCell). As [`Transport`], awaited.
///
/// ```
/// use egress_core::Envelope;
/// use egress_reactive::{AsyncTransport, SendError};
///
/// struct Channel(tokio::sync::mpsc::Sender<Envelope<String>>);
///
/// impl AsyncTransport<String> for Channel {
///     async fn send(&mut self, envelope: Envelope<String>) -> Result<(), SendError> {
///         self.0.send(envelope).await.map_err(|_| SendError::transient("receiver gone"))
///     }
/// }
/// ```
pub trait AsyncTransport<T>: Send + 'static {
    /// Sends one envelope (it may only queue it: see [`flush`](Self::flush)).
    ///
    /// # Errors
    /// A [`SendError`] whose kind decides what the core does with the record.
    fn send(&mut self, envelope: Envelope<T>) -> impl Future<Output = Result<(), SendError>> + Send;

    /// Pushes out what `send` queued; called once at the end of each sending
    /// pass. The default does nothing. A failed flush leaves the pass's
    /// records in flight: the connection's supervisor reconnects and the
    /// next attachment replays them.
    ///
    /// # Errors
    /// The transport's failure, logged and otherwise ignored by the cell.
    fn flush(&mut self) -> impl Future<Output = Result<(), SendError>> + Send {
        std::future::ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use egress_core::{Attempt, Generation, Sequence};

    use super::*;

    /// Refuses everything.
    struct Refuse;

    impl Transport<u32> for Refuse {
        fn send(&mut self, _: Envelope<u32>) -> Result<(), SendError> {
            Err(SendError::permanent("refused"))
        }
    }

    #[test]
    fn a_boxed_transport_is_the_transport_in_its_box() {
        let mut boxed: Box<dyn Transport<u32>> = Box::new(Refuse);
        let envelope =
            Envelope { generation: Generation(1), sequence: Sequence(0), attempt: Attempt(1), payload: 7, dead: None };
        let refused = boxed.send(envelope).expect_err("the box's transport answers");
        assert_eq!(refused.kind, FailureKind::Permanent);
    }
}
