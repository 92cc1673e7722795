//! The supervisor and one epoch: connect, read the subject's last message,
//! take a generation (and the stream over), attach, turn publish
//! acknowledgements into cumulative ones, and end on a lost connection or
//! a refused expectation.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_nats::jetstream::context::{Context, PublishErrorKind};
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::{ConnectOptions, Event};
use bytes::Bytes;
use egress_codec::Encode;
use egress_core::{AckOutcome, Completions, Generation, Sequence};
use egress_reactive::{AsyncEgressCell, Backoff, ConnectionTracker};
use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{Notify, mpsc, watch};

use super::transport::{NatsTransport, Sent, Unstorable};
use super::{ConnectionState, Counters, LinkError, PublisherConfig, PublisherError, owner_of};
use crate::stamp::Stamp;

/// The client's connection, as its events tell it.
#[derive(Clone, Copy, Debug, Default)]
struct Link {
    connected: bool,
    /// Disconnects so far: an epoch ends when this moves.
    disconnects: u64,
}

/// Why an epoch ended.
enum End {
    Stop,
    /// The connection or a request failed: a new epoch after the backoff.
    Lost(String),
    /// An expectation (last sequence, last message id) was refused, a
    /// publish was answered "duplicate", or a record can never be stored:
    /// read the subject again.
    Resync(String),
    Fatal(PublisherError),
}

/// The subject's last message.
struct Last {
    /// Its stream sequence: what the next publish expects.
    stream_sequence: u64,
    /// Its stamp; `None` for a message without egress headers.
    stamp: Option<Stamp>,
}

/// What the supervisor and each of its epochs work with.
pub(super) struct Run<T: 'static> {
    pub(super) cell: AsyncEgressCell<T>,
    pub(super) codec: Arc<dyn Encode<T>>,
    pub(super) config: PublisherConfig,
    pub(super) kill: Arc<Notify>,
    pub(super) counters: Arc<Counters>,
    pub(super) state: ConnectionTracker<LinkError>,
}

/// Connects and runs epochs until it is stopped (`None`) or stops on its
/// own (why). Each epoch's start and end move the connection state.
pub(super) async fn supervise<T: Clone + Send + Sync + 'static>(
    run: Run<T>,
    servers: Vec<async_nats::ServerAddr>,
    mut stop: watch::Receiver<bool>,
) -> Option<PublisherError> {
    let config = &run.config;
    let (link_tx, mut link) = watch::channel(Link::default());
    let link_tx = Arc::new(link_tx);
    let (base, max) = (config.backoff_base, config.backoff_max);
    let options = config.options.as_ref().map_or_else(ConnectOptions::new, |make| make());
    let options = options
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connection_timeout(config.timeout)
        .reconnect_delay_callback(move |attempts| {
            let failures = u32::try_from(attempts).unwrap_or(u32::MAX);
            Backoff::delay_with(base, max, failures, u64::try_from(attempts).unwrap_or(0).wrapping_mul(0x9e37_79b9))
        })
        .event_callback(move |event| {
            let link_tx = link_tx.clone();
            async move {
                match event {
                    Event::Connected => link_tx.send_modify(|l| l.connected = true),
                    Event::Disconnected | Event::Closed => link_tx.send_modify(|l| {
                        l.connected = false;
                        l.disconnects += 1;
                    }),
                    _ => {}
                }
            }
        });
    let client = tokio::select! {
        client = options.connect(servers) => match client {
            Ok(client) => client,
            // With retry_on_initial_connect, only the options can fail.
            Err(e) => return Some(PublisherError::Options(e.to_string())),
        },
        _ = stop.changed() => return None,
    };
    let js = async_nats::jetstream::context::ContextBuilder::new()
        .timeout(config.timeout)
        .ack_timeout(config.timeout)
        .max_ack_inflight(config.max_ack_inflight.max(1))
        .build(client.clone());
    let mut backoff = Backoff::new(config.backoff_base, config.backoff_max, config.seed);
    let mut failures: u32 = 0;
    let mut owner: Option<u64> = None;
    // The last epoch was a resync that moved nothing: the next resync
    // waits, so that two writers cannot drive a hot loop.
    let mut hurried = false;
    loop {
        if *stop.borrow() {
            return None;
        }
        run.state.set(ConnectionState::Connecting { attempt: failures.saturating_add(1) });
        // Wait for the client's connection.
        tokio::select! {
            r = link.wait_for(|l| l.connected) => if r.is_err() { return None },
            _ = stop.changed() => return None,
        }
        let before = run.cell.acked_through().get_untracked();
        let end = run.epoch(&js, &mut owner, &mut link, &mut stop).await;
        let progressed = run.cell.acked_through().get_untracked() > before;
        if progressed {
            failures = 0;
            hurried = false;
        }
        let (wait, error) = match end {
            End::Stop => return None,
            End::Fatal(e) => return Some(e),
            End::Lost(why) => {
                run.counters.lost.fetch_add(1, Ordering::Relaxed);
                (true, LinkError::Lost(why))
            }
            End::Resync(why) => {
                run.counters.resyncs.fetch_add(1, Ordering::Relaxed);
                (std::mem::replace(&mut hurried, true), LinkError::Resync(why))
            }
        };
        let delay = if wait {
            let delay = backoff.delay(failures);
            failures = failures.saturating_add(1);
            delay
        } else {
            std::time::Duration::ZERO
        };
        let retry_at = std::time::Instant::now() + delay;
        run.state.set(ConnectionState::Reconnecting { retry_at, failures, error });
        if wait {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = stop.changed() => return None,
            }
        }
    }
}

/// Reads the subject's last message (`None`: the subject has none).
async fn read_last(js: &Context, config: &PublisherConfig, check_stream: bool) -> Result<Option<Last>, End> {
    let lost = |what: &str, e: &dyn std::fmt::Display| End::Lost(format!("{what}: {e}"));
    if check_stream {
        let mut stream = js.get_stream(&config.stream).await.map_err(|e| lost("stream info", &e))?;
        let subjects = stream.info().await.map_err(|e| lost("stream info", &e))?.config.subjects.clone();
        if subjects != [config.subject.clone()] {
            return Err(End::Fatal(PublisherError::SharedStream {
                stream: config.stream.clone(),
                subject: config.subject.clone(),
                subjects,
            }));
        }
    }
    let stream = js.get_stream_no_info(&config.stream).await.map_err(|e| lost("stream", &e))?;
    match stream.get_last_raw_message_by_subject(&config.subject).await {
        Ok(message) => {
            let stamp = match Stamp::from_headers(&message.headers) {
                Ok(stamp) => Some(stamp),
                Err(e) => {
                    tracing::warn!(error = %e, sequence = message.sequence, "egress nats publisher: the subject's last message is not an egress record");
                    None
                }
            };
            Ok(Some(Last { stream_sequence: message.sequence, stamp }))
        }
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(lost("last message", &e)),
    }
}

/// Whether the stream refused a message for its size (the stream's
/// `max_msg_size`, or its headers): no retry can store it.
fn never_storable(e: &async_nats::jetstream::context::PublishError) -> bool {
    use async_nats::jetstream::ErrorCode;
    std::error::Error::source(e).and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>()).is_some_and(
        |je| {
            matches!(
                je.error_code(),
                ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM | ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM
            )
        },
    )
}

/// Returns when the client has disconnected since `disconnects` (or is
/// gone).
async fn disconnected(link: &mut watch::Receiver<Link>, disconnects: u64) {
    let _ = link.wait_for(|l| l.disconnects != disconnects).await;
}

impl<T: Clone + Send + Sync + 'static> Run<T> {
    /// One epoch: from reading the subject's last message to its end.
    async fn epoch(
        &self,
        js: &Context,
        owner: &mut Option<u64>,
        link: &mut watch::Receiver<Link>,
        stop: &mut watch::Receiver<bool>,
    ) -> End {
        let Run { cell, config, counters, kill, .. } = self;
        let disconnects = link.borrow().disconnects;
        // A request written to a connection that died is never answered: the
        // read is bounded by the timeout and by the next disconnect.
        let last = tokio::select! {
            last = tokio::time::timeout(config.timeout, read_last(js, config, owner.is_none())) => last,
            () = disconnected(link, disconnects) => return End::Lost("disconnected".into()),
            _ = stop.changed() => return End::Stop,
        };
        let last = match last {
            Ok(Ok(last)) => last,
            Ok(Err(end)) => return end,
            Err(_) => return End::Lost("reading the last message timed out".into()),
        };
        let stored = last.as_ref().and_then(|l| l.stamp.as_ref()).map_or(0, |s| s.generation);
        let current = cell.generation().get_untracked().get();
        // A takeover's owner is the subject's only once its claim is stored.
        let mut claiming = None;
        let generation = match *owner {
            None => {
                // Take the stream over: the first generation of an owner above
                // every one stored, and above the cell's own.
                let Some(mine) = owner_of(stored).max(owner_of(current)).checked_add(1).filter(|o| *o < 1 << 32) else {
                    return End::Fatal(PublisherError::Exhausted);
                };
                claiming = Some(mine);
                mine << 32
            }
            Some(mine) => {
                if owner_of(stored) > mine {
                    return End::Fatal(PublisherError::Fenced { owner: mine, by: stored });
                }
                match current.max(stored).checked_add(1).filter(|g| owner_of(*g) == mine) {
                    Some(g) => g,
                    None => return End::Fatal(PublisherError::Exhausted),
                }
            }
        };
        let generation = Generation(generation);
        // Fences the previous epoch's attachment: what it had in flight goes
        // back to pending, to be replayed in this one.
        let _ = cell.reconnect(generation);
        tokio::select! {
            () = cell.generation_stored() => {}
            _ = stop.changed() => return End::Stop,
        }
        let incarnation = cell.incarnation().get();
        // What the stream holds of this producer's incarnation is delivered
        // (a claim of it: what it held when claimed).
        if let Some(stamp) = last.as_ref().and_then(|l| l.stamp.as_ref())
            && stamp.producer == config.producer
            && stamp.incarnation == incarnation
            && let Some(held) = if stamp.claim { stamp.sequence.checked_sub(1) } else { Some(stamp.sequence) }
        {
            match cell.ack(generation, Sequence(held)) {
                AckOutcome::Unsent { sent_through, .. } => {
                    return End::Fatal(PublisherError::AheadOfCell { held, sent: sent_through });
                }
                AckOutcome::Unchanged { through: Some(acked) } if acked.get() > held => {
                    tracing::warn!(
                        held,
                        acked = acked.get(),
                        "egress nats publisher: the stream holds less than it acknowledged (purged, or lost in a server crash)"
                    );
                }
                _ => {}
            }
        }
        let acked = cell.acked_through().get_untracked();
        let mut first_expected = last.as_ref().map_or(0, |l| l.stream_sequence);
        if let Some(mine) = claiming {
            let claim = Stamp {
                producer: config.producer.clone(),
                incarnation,
                sequence: acked.map_or(0, |s| s.get().saturating_add(1)),
                generation: generation.get(),
                dead: None,
                claim: true,
            };
            let mut headers = claim.to_headers();
            headers
                .insert(async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, first_expected.to_string().as_str());
            let claimed = async {
                let ack = js.publish_with_headers(config.subject.clone(), headers, Bytes::new()).await?;
                ack.await
            };
            let claimed = tokio::select! {
                claimed = tokio::time::timeout(config.timeout, claimed) => claimed,
                () = disconnected(link, disconnects) => return End::Lost("disconnected".into()),
                _ = stop.changed() => return End::Stop,
            };
            match claimed {
                Ok(Ok(ack)) => {
                    counters.claims.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        owner = mine,
                        stream_sequence = ack.sequence,
                        "egress nats publisher: took the subject over"
                    );
                    *owner = Some(mine);
                    first_expected = ack.sequence;
                }
                // Another publisher wrote since the read: read again, and take
                // over above it.
                Ok(Err(e)) if e.kind() == PublishErrorKind::WrongLastSequence => {
                    return End::Resync("another publisher wrote since the read".into());
                }
                Ok(Err(e)) => return End::Lost(format!("claim: {e}")),
                Err(_) => return End::Lost("claim: timed out".into()),
            }
        }
        let mut completions = Completions::starting_at(acked.map_or(0, |s| s.get().saturating_add(1)));
        let (sent_tx, mut sent) = mpsc::unbounded_channel();
        let transport = NatsTransport {
            js: js.clone(),
            subject: config.subject.clone().into(),
            producer: config.producer.clone(),
            incarnation,
            first_expected,
            previous: None,
            codec: self.codec.clone(),
            sent: sent_tx,
            counters: counters.clone(),
            done: false,
        };
        counters.epochs.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(generation = generation.get(), ?acked, "egress nats publisher: epoch");
        let attachment = cell.attach(transport);
        self.state.set(ConnectionState::Connected { generation });
        let mut acks = FuturesUnordered::new();
        let end = loop {
            tokio::select! {
                s = sent.recv() => match s {
                    Some(Sent::Published { sequence, ack }) => acks.push(async move { (sequence, ack.await) }),
                    Some(Sent::Unstorable(u)) => break unstorable(&attachment, counters, u),
                    Some(Sent::Broken(why)) => break End::Lost(format!("publish: {why}")),
                    // The attachment is gone: the cell was disposed.
                    None => break End::Stop,
                },
                Some((sequence, result)) = acks.next(), if !acks.is_empty() => match result {
                    Ok(ack) if ack.duplicate => {
                        // A message of this id is stored, but not necessarily
                        // this publisher's (a stale owner of the same
                        // incarnation answered "duplicate" is not fenced by
                        // the expectation, which the server checks after the
                        // id): the next epoch's read decides, and a higher
                        // owner there fences.
                        counters.duplicates.fetch_add(1, Ordering::Relaxed);
                        break End::Resync(format!("sequence {} was acknowledged as a duplicate", sequence.get()));
                    }
                    Ok(_) => {
                        if let Some(through) = completions.complete(sequence.get()) {
                            let _ = attachment.ack(through);
                        }
                    }
                    Err(e) if matches!(e.kind(), PublishErrorKind::WrongLastSequence | PublishErrorKind::WrongLastMessageId) => {
                        break End::Resync(format!("the expectation of sequence {} was refused", sequence.get()));
                    }
                    // Above the stream's own limits.
                    Err(e) if never_storable(&e) => break unstorable(&attachment, counters, Unstorable { sequence, why: e.to_string() }),
                    Err(e) => break End::Lost(format!("publish acknowledgement: {e}")),
                },
                () = disconnected(link, disconnects) => break End::Lost("disconnected".into()),
                () = kill.notified() => break End::Lost("killed".into()),
                _ = stop.changed() => break End::Stop,
            }
        };
        drop(attachment);
        end
    }
}

/// A record that can never be stored (see [`Unstorable`]): a dead letter,
/// whose tombstone the next epoch publishes in its place.
fn unstorable<T: Clone + Send + Sync + 'static>(
    attachment: &egress_reactive::Attachment<T, egress_reactive::Threaded>,
    counters: &Counters,
    u: Unstorable,
) -> End {
    counters.refused.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(sequence = u.sequence.get(), why = %u.why, "egress nats publisher: a record that can never be stored is a dead letter");
    let _ = attachment.fail(u.sequence, egress_core::FailureKind::Permanent);
    End::Resync(format!("sequence {} can never be stored: {}", u.sequence.get(), u.why))
}
