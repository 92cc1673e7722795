//! The attachment's transport: each envelope published with its stamp and
//! its fence.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_nats::jetstream::context::{Context, PublishErrorKind};
use bytes::Bytes;
use egress_core::{Envelope, Sequence};
use egress_reactive::{AsyncTransport, SendError};
use tokio::sync::mpsc;

use super::Counters;
use crate::stamp::Stamp;

/// What the transport tells its epoch.
pub(super) enum Sent {
    /// A message went out; its acknowledgement will say where it went.
    Published { sequence: Sequence, ack: async_nats::jetstream::context::PublishAckFuture },
    /// The client refused a publish: the epoch ends.
    Broken(String),
}

/// The attachment's transport: publishes each envelope with its stamp and
/// its fence, and passes the acknowledgement's future to the epoch.
///
/// The fence: the epoch's first message expects the subject's last
/// sequence as read (`Nats-Expected-Last-Subject-Sequence`); each later one
/// expects the message id of the one published before it
/// (`Nats-Expected-Last-Msg-Id`). So a message is stored only right after
/// its predecessor: once one is refused, every later one of the epoch is
/// refused too (a later expectation cannot line up with another writer's
/// messages), and of each producer incarnation the stream holds a gap-free
/// prefix. What the last message says was sent is then all there.
pub(super) struct NatsTransport {
    pub(super) js: Context,
    pub(super) subject: async_nats::Subject,
    pub(super) producer: String,
    pub(super) incarnation: u128,
    /// The subject's last sequence when the epoch read it.
    pub(super) first_expected: u64,
    /// The message id of the message published before the next one.
    pub(super) previous: Option<String>,
    /// Sequences whose record was too large, published as tombstones in
    /// their place: the cell's own tombstone for one is not sent again.
    pub(super) placed: std::collections::BTreeSet<u64>,
    pub(super) sent: mpsc::UnboundedSender<Sent>,
    pub(super) counters: Arc<Counters>,
    /// The client refused a publish: nothing more goes out in this epoch
    /// (what is claimed stays in flight, and the next epoch replays it in
    /// order).
    pub(super) broken: bool,
}

impl NatsTransport {
    /// Publishes `stamp` with `payload` behind the previous message.
    async fn publish(
        &mut self,
        stamp: &Stamp,
        payload: Bytes,
    ) -> Result<(), async_nats::jetstream::context::PublishError> {
        let mut headers = stamp.to_headers();
        match &self.previous {
            None => headers.insert(
                async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
                self.first_expected.to_string().as_str(),
            ),
            Some(id) => headers.insert(async_nats::header::NATS_EXPECTED_LAST_MESSAGE_ID, id.as_str()),
        }
        let ack = self.js.publish_with_headers(self.subject.clone(), headers, payload).await?;
        self.counters.published.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(sequence = stamp.sequence, "egress nats publisher: published");
        self.previous = Some(stamp.message_id());
        let _ = self.sent.send(Sent::Published { sequence: Sequence(stamp.sequence), ack });
        Ok(())
    }

    fn broke(&mut self, e: &dyn std::fmt::Display) {
        self.broken = true;
        let _ = self.sent.send(Sent::Broken(e.to_string()));
    }
}

impl AsyncTransport<Bytes> for NatsTransport {
    async fn send(&mut self, envelope: Envelope<Bytes>) -> Result<(), SendError> {
        if self.broken {
            return Ok(());
        }
        let sequence = envelope.sequence.get();
        if envelope.dead.is_some() && self.placed.remove(&sequence) {
            // Its tombstone went out in its place already.
            return Ok(());
        }
        let stamp = Stamp {
            producer: self.producer.clone(),
            incarnation: self.incarnation,
            sequence,
            generation: envelope.generation.get(),
            dead: envelope.dead,
            claim: false,
        };
        let payload = if envelope.dead.is_some() { Bytes::new() } else { envelope.payload };
        match self.publish(&stamp, payload).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == PublishErrorKind::MaxPayloadExceeded => {
                // Never publishable: a dead letter. Its tombstone takes its
                // place now, so that the stream's order has no hole.
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                let tombstone = Stamp { dead: Some(egress_core::DeadReason::Permanent), ..stamp };
                match self.publish(&tombstone, Bytes::new()).await {
                    Ok(()) => {
                        self.placed.insert(sequence);
                    }
                    Err(t) => self.broke(&t),
                }
                Err(SendError::permanent(e))
            }
            Err(e) => {
                self.broke(&e);
                Ok(())
            }
        }
    }
}
