//! The attachment's transport: each envelope published with its stamp and
//! its fence.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_nats::jetstream::context::{Context, PublishErrorKind};
use bytes::Bytes;
use egress_codec::Encode;
use egress_core::{Envelope, Sequence};
use egress_reactive::{AsyncTransport, SendError};
use tokio::sync::mpsc;

use super::Counters;
use crate::stamp::Stamp;

/// What the transport tells its epoch.
pub(super) enum Sent {
    /// A message went out; its acknowledgement will say where it went.
    Published { sequence: Sequence, ack: async_nats::jetstream::context::PublishAckFuture },
    /// A record that can never be stored was not published: see
    /// [`Unstorable`]. Nothing after it goes out in this epoch.
    Unstorable(Unstorable),
    /// The client refused a publish: the epoch ends.
    Broken(String),
}

/// A record that can never be stored: its codec refused it, or it is above
/// the server's payload limit (refused by the client before it is sent) or
/// the stream's own limits (refused by the server in its acknowledgement).
///
/// One path for all three, so that the stream never has a hole: the epoch
/// fails the record as permanent (the cell makes it a dead letter, whose
/// tombstone is an ordinary envelope) and resyncs; the next epoch reads
/// what the stream holds and publishes from there, the tombstone in the
/// record's place. What was pipelined behind the record in this epoch is
/// refused by its fence (it expects the record before it), or was never
/// published (the transport stops at the record).
pub(super) struct Unstorable {
    pub(super) sequence: Sequence,
    pub(super) why: String,
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
pub(super) struct NatsTransport<T> {
    pub(super) js: Context,
    pub(super) subject: async_nats::Subject,
    pub(super) producer: String,
    pub(super) incarnation: u128,
    /// The subject's last sequence when the epoch read it.
    pub(super) first_expected: u64,
    /// The message id of the message published before the next one.
    pub(super) previous: Option<String>,
    pub(super) codec: Arc<dyn Encode<T>>,
    pub(super) sent: mpsc::UnboundedSender<Sent>,
    pub(super) counters: Arc<Counters>,
    /// The epoch is over for this transport (the client refused a publish,
    /// or a record was unstorable): nothing more goes out (what is claimed
    /// stays in flight, and the next epoch replays it in order).
    pub(super) done: bool,
}

impl<T> NatsTransport<T> {
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

    /// Ends this transport's part of the epoch with `sent`.
    fn end(&mut self, sent: Sent) {
        self.done = true;
        let _ = self.sent.send(sent);
    }
}

impl<T: Send + Sync + 'static> AsyncTransport<T> for NatsTransport<T> {
    async fn send(&mut self, envelope: Envelope<T>) -> Result<(), SendError> {
        if self.done {
            return Ok(());
        }
        let sequence = envelope.sequence;
        let payload = match envelope.dead {
            Some(_) => Bytes::new(),
            None => match egress_codec::guarded(|| self.codec.encode(&envelope.payload)) {
                Ok(payload) => payload,
                Err(e) => {
                    let why = egress_codec::Unencodable(e).to_string();
                    self.end(Sent::Unstorable(Unstorable { sequence, why }));
                    return Ok(());
                }
            },
        };
        let stamp = Stamp {
            producer: self.producer.clone(),
            incarnation: self.incarnation,
            sequence: sequence.get(),
            generation: envelope.generation.get(),
            dead: envelope.dead,
            claim: false,
        };
        match self.publish(&stamp, payload).await {
            Ok(()) => {}
            Err(e) if e.kind() == PublishErrorKind::MaxPayloadExceeded => {
                self.end(Sent::Unstorable(Unstorable { sequence, why: e.to_string() }));
            }
            Err(e) => self.end(Sent::Broken(e.to_string())),
        }
        Ok(())
    }
}
