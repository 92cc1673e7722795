//! The supervisor and one connection: connect, handshake, attach, read
//! acknowledgements, close, back off and connect again.

use crate::connect_error::ConnectError;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use egress_codec::Encode;
use egress_core::{AckOutcome, Generation, ReceivedOutcome, Sequence};
use egress_reactive::{AsyncEgressCell, Backoff};
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::{Mutex, Notify, watch};
use tokio::time::Instant;
use tokio_tungstenite::MaybeTlsStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use super::{ConnectionState, Counters, Io, SenderConfig, Sink, Target, Unwritten, Ws, WsTransport};
use crate::protocol::{
    CloseCode, DecodeError, Frame, GENERATION_LIMIT, Limits, MAX_GENERATION_JUMP, MIN_MAX_PAYLOAD, VERSION,
};

/// Why a connection ended.
enum End {
    /// The sender is shutting down.
    Stop,
    /// The attempt failed, or the connection was lost (a network failure,
    /// a kill, a stall, a close by the receiver): reconnect after the
    /// backoff (unless the policy stops on it).
    Lost(ConnectError),
    /// The receiver asked to reconnect at once.
    Retry,
    /// The receiver is at one of its bounds (code 6): reconnect after the
    /// backoff, and not before the retry-after it named (in milliseconds,
    /// taken up to [`MAX_BUSY_WAIT`]).
    Busy(u64, String),
    /// The receiver's latest generation for this producer: reconnect at
    /// once above it.
    Stale(u64),
    /// A protocol error (of either side).
    Protocol(String),
    /// The receiver speaks another version (a protocol error, closed with
    /// code 2).
    Version(String),
    /// The sender cannot go on.
    Fatal(ConnectError),
}

/// What the supervisor learned from a connection besides how it ended.
struct Outcome {
    end: End,
    /// The receipt watermark moved while it was up.
    progressed: bool,
    /// How long it was up (zero when it never got through the handshake).
    lasted: Duration,
}

pub(super) async fn supervise<T: Clone + Send + Sync + 'static>(
    cell: AsyncEgressCell<T>,
    codec: Arc<dyn Encode<T>>,
    target: Target,
    config: SenderConfig,
    mut stop: watch::Receiver<bool>,
    kill: Arc<Notify>,
    counters: Arc<Counters>,
) -> Option<ConnectError> {
    let mut backoff = Backoff::new(config.backoff_base, config.backoff_max, config.seed);
    let mut failures: u32 = 0;
    // A generation the next attempt must exceed (a receiver's latest).
    let mut floor = Generation(0);
    // The last reconnect was at once (codes 4 and 5), and nothing got
    // through since: the next one waits, so that a receiver cannot drive a
    // hot loop of refusals.
    let mut hurried = false;
    let unwritten = Arc::new(Unwritten::default());
    loop {
        if *stop.borrow() {
            return None;
        }
        counters.report(ConnectionState::Connecting { attempt: failures.saturating_add(1) });
        let outcome = connection(&cell, &codec, &target, &config, &kill, &counters, floor, &unwritten, &mut stop).await;
        let idle = cell.inflight_len().get_untracked() == 0;
        if outcome.progressed || (idle && outcome.lasted >= config.backoff_max) {
            failures = 0;
        }
        if outcome.progressed {
            hurried = false;
        }
        let mut at_least = Duration::ZERO;
        let (wait, why) = match outcome.end {
            End::Stop => return None,
            End::Fatal(why) => return Some(why),
            End::Lost(why) if why.is_auth() && !config.retry_unauthorized => return Some(why),
            End::Lost(why) => (true, why),
            End::Busy(retry_after, why) => {
                at_least = Duration::from_millis(retry_after).min(MAX_BUSY_WAIT);
                (true, ConnectError::Busy(why.into()))
            }
            End::Protocol(why) | End::Version(why) => {
                counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%why, "egress sender: protocol error");
                (true, ConnectError::Protocol(why.into()))
            }
            End::Retry => (
                std::mem::replace(&mut hurried, true),
                ConnectError::Renew("the receiver asked for a new connection".into()),
            ),
            End::Stale(latest) => {
                counters.stale_refusals.fetch_add(1, Ordering::Relaxed);
                let why = ConnectError::Renew(format!("a stale generation (the receiver's latest is {latest})").into());
                if latest >= GENERATION_LIMIT {
                    counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(latest, "egress sender: a stale-generation close names a generation out of range");
                    (true, why)
                } else {
                    // Above the receiver's latest, by at most
                    // MAX_GENERATION_JUMP per refusal (receivers record no
                    // bigger step): a receiver cannot take the cell's
                    // generations away in one frame.
                    let current = cell.generation().get_untracked().max(floor).get();
                    floor = floor.max(Generation(latest.min(current.saturating_add(MAX_GENERATION_JUMP))));
                    (std::mem::replace(&mut hurried, true), why)
                }
            }
        };
        if wait {
            let delay = backoff.delay(failures).max(at_least);
            failures = failures.saturating_add(1);
            if config.max_attempts.is_some_and(|most| failures >= most) {
                return Some(ConnectError::GaveUp { attempts: failures, last: Box::new(why) });
            }
            counters.reconnects.fetch_add(1, Ordering::Relaxed);
            let retry_at = std::time::Instant::now() + delay;
            counters.report(ConnectionState::Reconnecting { retry_at, failures, error: why });
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = stop.changed() => return None,
            }
        } else {
            counters.reconnects.fetch_add(1, Ordering::Relaxed);
            tracing::info!(error = %why, "egress sender: reconnecting at once");
        }
    }
}

/// Sends a close frame, giving up after a moment (a peer that does not read
/// must not hold the sender).
async fn send_close(sink: &Mutex<Sink>, code: CloseCode, reason: &str) {
    let mut sink = sink.lock().await;
    close_with(&mut *sink, code, 0, reason).await;
}

/// Sends the close frame `code` (`detail`, `reason`, cut to the protocol's
/// limit by the encoding) and closes, giving up after a moment.
async fn close_with<S>(sink: &mut S, code: CloseCode, detail: u64, reason: &str)
where
    S: futures_util::Sink<Message> + Unpin,
{
    let frame = Frame::Close { code, detail, reason: reason.into() };
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = sink.send(Message::Binary(frame.encode())).await;
        let _ = sink.close().await;
    })
    .await;
}

/// Closes for `end`, if it is the receiver's breach of the protocol: code 1,
/// or code 2 (with the version this side speaks) for another version.
async fn close_for<S>(sink: &mut S, end: &End)
where
    S: futures_util::Sink<Message> + Unpin,
{
    match end {
        End::Protocol(why) => close_with(sink, CloseCode::Protocol, 0, why).await,
        End::Version(why) => close_with(sink, CloseCode::Version, u64::from(VERSION), why).await,
        _ => {}
    }
}

#[allow(clippy::too_many_arguments)]
async fn connection<T: Clone + Send + Sync + 'static>(
    cell: &AsyncEgressCell<T>,
    codec: &Arc<dyn Encode<T>>,
    target: &Target,
    config: &SenderConfig,
    kill: &Notify,
    counters: &Arc<Counters>,
    floor: Generation,
    unwritten: &Arc<Unwritten>,
    stop: &mut watch::Receiver<bool>,
) -> Outcome {
    let lost = |end| Outcome { end, progressed: false, lasted: Duration::ZERO };
    let connecting = tokio::time::timeout(config.connect_timeout, async {
        let mut ws = open(target, config).await.map_err(End::Lost)?;
        // Up: only now a generation strictly above every one the cell has
        // used and the receiver's latest (an attempt refused before its
        // upgrade stores none). This also fences the previous connection:
        // what it had in flight or parked goes back to pending, to be
        // replayed on this one.
        let above = cell.generation().get_untracked().max(floor);
        let Some(next) = above.get().checked_add(1) else {
            let why = format!("no generation above {above}: the generation space is exhausted");
            return Err(End::Fatal(ConnectError::Fatal(why.into())));
        };
        let generation = Generation(next);
        let _ = cell.reconnect(generation);
        // A durable cell stores the generation before any handshake uses it.
        cell.generation_stored().await;
        let resume_from = cell.with_core(|core| core.resume_from().get());
        let hello = Frame::Handshake {
            producer: config.producer.clone(),
            incarnation: cell.incarnation().get(),
            generation: generation.get(),
            resume_from,
        };
        ws.send(Message::Binary(hello.encode())).await.map_err(|e| End::Lost(ConnectError::of_ws(&e)))?;
        let end = match read_frame(&mut ws, config.limits, &mut Instant::now()).await {
            Ok(Frame::Welcome { generation: g, next, received, terms }) if g == generation.get() => {
                return Ok((ws, next, received, terms, resume_from, generation));
            }
            Ok(Frame::Close { code: CloseCode::StaleGeneration, detail, .. }) => return Err(End::Stale(detail)),
            Ok(Frame::Close { code: CloseCode::Retry, .. }) => return Err(End::Retry),
            Ok(Frame::Close { code: CloseCode::Busy, detail, reason }) => return Err(End::Busy(detail, reason)),
            Ok(Frame::Close { code: CloseCode::Normal, reason, .. }) => {
                return Err(End::Lost(ConnectError::Lost(format!("refused: {reason}").into())));
            }
            // The receiver closed: nothing to answer.
            Ok(Frame::Close { code, reason, .. }) => return Err(End::Protocol(format!("refused: {code:?} {reason}"))),
            Ok(Frame::Welcome { generation: g, .. }) => {
                End::Protocol(format!("a welcome for generation {g}, not {generation}"))
            }
            Ok(other) => End::Protocol(format!("expected a welcome, got {other:?}")),
            Err(end) => end,
        };
        // The receiver broke the protocol: it is told so before the close.
        close_for(&mut ws, &end).await;
        Err(end)
    });
    let connected = tokio::select! {
        connected = connecting => connected,
        _ = stop.changed() => return lost(End::Stop),
    };
    let (ws, next, received, terms, resume_from, generation) = match connected {
        Ok(Ok(ok)) => ok,
        Ok(Err(end)) => {
            counters.failed_attempts.fetch_add(1, Ordering::Relaxed);
            return lost(end);
        }
        Err(_) => {
            counters.failed_attempts.fetch_add(1, Ordering::Relaxed);
            return lost(End::Lost(ConnectError::Timeout));
        }
    };
    let opened = Instant::now();
    let (sink, mut stream) = ws.split();
    let sink = Arc::new(Mutex::new(sink));
    let protocol = |why: String| async {
        send_close(&sink, CloseCode::Protocol, &why).await;
        End::Protocol(why)
    };
    counters.connections.fetch_add(1, Ordering::Relaxed);
    if next < resume_from {
        // The receiver forgot what this producer said it holds (or never
        // listened): the records below are gone here, and it would wait on
        // them for good.
        let why = format!("welcome: next {next} is below the resume-from {resume_from} of the handshake");
        return Outcome { end: protocol(why).await, progressed: false, lasted: opened.elapsed() };
    }
    if terms.max_payload < MIN_MAX_PAYLOAD {
        let why = format!("welcome: max-payload {} is below the floor of {MIN_MAX_PAYLOAD}", terms.max_payload);
        return Outcome { end: protocol(why).await, progressed: false, lasted: opened.elapsed() };
    }
    if let Err(why) = welcome(cell, generation, next, received, unwritten) {
        return Outcome { end: protocol(why).await, progressed: false, lasted: opened.elapsed() };
    }
    tracing::debug!(next, received, max_payload = terms.max_payload, "egress sender: welcomed");
    counters.report(ConnectionState::Connected { generation });
    let receipt = cell.received_through().get_untracked();
    let max_payload = usize::try_from(terms.max_payload).unwrap_or(usize::MAX);
    counters.payload_limit.store(max_payload.min(config.max_payload), Ordering::Relaxed);
    let too_small = Arc::new(Notify::new());
    let transport = WsTransport {
        codec: codec.clone(),
        sink: sink.clone(),
        pass: None,
        own_max: config.max_payload,
        max_payload,
        unwritten: unwritten.clone(),
        counters: counters.clone(),
        too_small: too_small.clone(),
    };
    let link = cell.attach(transport);
    let stall = stall_in_force(config.stall_timeout, terms.keepalive_ms);
    let mut heard = Instant::now();
    let end = loop {
        let check = tokio::time::sleep(stall.min(Duration::from_secs(3600)) / 4);
        tokio::select! {
            frame = read_frame(&mut stream, config.limits, &mut heard) => match frame {
                Ok(Frame::Ack { generation: g, through }) if g == generation.get() => {
                    tracing::trace!(through, "egress sender: ack");
                    if let Some(never) = unwritten.covered(through) {
                        break protocol(format!("ack through {through}, but {never} was never sent")).await;
                    }
                    if let AckOutcome::Unsent { sent_through, .. } = link.ack(Sequence(through)) {
                        break protocol(format!("ack through {through}, but only {sent_through:?} was sent")).await;
                    }
                    unwritten.acked(through);
                }
                Ok(Frame::Close { code: CloseCode::Busy, detail, reason }) => break End::Busy(detail, reason),
                Ok(Frame::Close { code: CloseCode::Normal | CloseCode::Fenced, reason, .. }) => {
                    break End::Lost(ConnectError::Lost(format!("closed by the receiver: {reason}").into()));
                }
                Ok(Frame::Close { code: CloseCode::Retry, .. }) => break End::Retry,
                Ok(Frame::Close { code: CloseCode::StaleGeneration, detail, .. }) => break End::Stale(detail),
                Ok(Frame::Close { code, reason, .. }) => break End::Protocol(format!("{code:?}: {reason}")),
                Ok(other) => break protocol(format!("unexpected frame {other:?}")).await,
                Err(End::Protocol(why)) => break protocol(why).await,
                Err(end @ End::Version(_)) => {
                    close_for(&mut *sink.lock().await, &end).await;
                    break end;
                }
                Err(end) => break end,
            },
            () = kill.notified() => break End::Lost(ConnectError::Lost("killed".into())),
            () = too_small.notified() => {
                let resume_from = cell.with_core(|core| core.resume_from().get());
                let why = "a record is above this receiver's max-payload";
                close_with(&mut *sink.lock().await, CloseCode::Normal, resume_from, why).await;
                break End::Lost(ConnectError::Lost(why.into()));
            }
            _ = stop.changed() => {
                // The detail is the resume-from: the acknowledgements this
                // producer holds for good (its store's, for a durable cell),
                // on which the receiver may forget the stream.
                let resume_from = cell.with_core(|core| core.resume_from().get());
                close_with(&mut *sink.lock().await, CloseCode::Normal, resume_from, "the producer is shutting down")
                    .await;
                break End::Stop;
            }
            () = check => {}
        }
        if cell.inflight_len().get_untracked() > 0 && heard.elapsed() >= stall {
            break End::Lost(ConnectError::Lost("the receiver fell silent".into()));
        }
    };
    drop(link);
    let progressed = cell.received_through().get_untracked() > receipt;
    Outcome { end, progressed, lasted: opened.elapsed() }
}

/// The longest a receiver may keep silent before it counts as dead: at
/// least three of the keepalives its welcome advertised (a live receiver
/// pings at least once per keepalive, whatever its application does), so a
/// stall timeout configured below that cannot drop a slow but live peer;
/// the keepalive is taken up to [`MAX_KEEPALIVE_WAIT`], so a receiver
/// cannot advertise its way out of ever being found dead. `None`: never.
fn stall_in_force(configured: Option<Duration>, keepalive_ms: u32) -> Duration {
    let Some(configured) = configured else { return Duration::MAX };
    let keepalive = Duration::from_millis(u64::from(keepalive_ms)).min(MAX_KEEPALIVE_WAIT);
    configured.max(keepalive.saturating_mul(3))
}

/// The longest advertised keepalive a sender waits three times for before
/// a silent receiver counts as dead.
const MAX_KEEPALIVE_WAIT: Duration = Duration::from_secs(60);

/// The longest retry-after of a busy receiver (code 6) a sender honours: a
/// receiver cannot park a producer for longer with one frame.
const MAX_BUSY_WAIT: Duration = Duration::from_secs(60);

/// The sender's WebSocket read buffer. What it reads are the receiver's
/// small frames (a welcome, acknowledgements, receipts); tungstenite
/// zero-fills the free part of this buffer before every read, so its
/// default of 128 KiB cost more than the rest of a read of an ack. A larger
/// frame still arrives whole: the buffer grows to a frame's length.
const READ_BUFFER: usize = 4 * 1024;

/// The sender's WebSocket configuration (tungstenite's defaults but for
/// [`READ_BUFFER`]).
fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default().read_buffer_size(READ_BUFFER)
}

/// Opens the byte stream ([`SenderConfig::connect`], or TCP), then TLS on
/// top for `wss://`, then the WebSocket upgrade with the configured headers.
async fn open(target: &Target, config: &SenderConfig) -> Result<Ws, ConnectError> {
    let io: Box<dyn Io> = match &config.connect {
        Some(connect) => connect(target.host.clone(), target.port).await.map_err(|e| ConnectError::of_io(&e))?,
        None => {
            let tcp =
                TcpStream::connect((target.host.as_str(), target.port)).await.map_err(|e| ConnectError::of_io(&e))?;
            let _ = tcp.set_nodelay(true);
            Box::new(tcp)
        }
    };
    let request = target.request.clone();
    #[cfg(feature = "tls")]
    if target.tls {
        let tls = config.tls.clone().unwrap_or_else(crate::tls::webpki_client_config);
        let connector = Some(tokio_tungstenite::Connector::Rustls(tls));
        let (ws, _) = tokio_tungstenite::client_async_tls_with_config(request, io, Some(ws_config()), connector)
            .await
            .map_err(|e| ConnectError::of_ws(&e))?;
        return Ok(ws);
    }
    // Without the `tls` feature, `Target::new` refused wss:// already.
    let (ws, _) = tokio_tungstenite::client_async_with_config(request, MaybeTlsStream::Plain(io), Some(ws_config()))
        .await
        .map_err(|e| ConnectError::of_ws(&e))?;
    Ok(ws)
}

/// Applies a welcome: what the receiver acknowledged, then what it holds.
/// Either beyond what was sent, or a receipt below the acknowledgement, is
/// a protocol error of the receiver.
fn welcome<T: Clone + Send + Sync + 'static>(
    cell: &AsyncEgressCell<T>,
    generation: Generation,
    next: u64,
    received: u64,
    unwritten: &Unwritten,
) -> Result<(), String> {
    if received < next {
        return Err(format!("welcome: holds through {received} but acknowledged through {next}"));
    }
    if let Some(never) = received.checked_sub(1).and_then(|through| unwritten.covered(through)) {
        return Err(format!("welcome holds {received} records, but {never} was never sent"));
    }
    if let Some(through) = next.checked_sub(1) {
        if let AckOutcome::Unsent { sent_through, .. } = cell.ack(generation, Sequence(through)) {
            return Err(format!("welcome acknowledges {next} records, but only {sent_through:?} was sent"));
        }
        unwritten.acked(through);
    }
    if let Some(through) = received.checked_sub(1)
        && let ReceivedOutcome::Unsent { sent_through, .. } = cell.received(generation, Sequence(through))
    {
        return Err(format!("welcome holds {received} records, but only {sent_through:?} was sent"));
    }
    Ok(())
}

/// The next frame from the receiver, skipping pings and pongs; anything
/// heard (pings included) is noted in `heard`.
async fn read_frame<S>(stream: &mut S, limits: Limits, heard: &mut Instant) -> Result<Frame, End>
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    loop {
        let message = stream.next().await;
        *heard = Instant::now();
        match message {
            Some(Ok(Message::Binary(bytes))) => {
                return Frame::decode(&bytes, limits).map_err(|e| match e {
                    DecodeError::Version(_) => End::Version(e.to_string()),
                    e => End::Protocol(e.to_string()),
                });
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
            Some(Ok(Message::Text(_))) => return Err(End::Protocol("a text message".into())),
            Some(Ok(Message::Close(_))) | None => {
                return Err(End::Lost(ConnectError::Lost("connection closed".into())));
            }
            Some(Err(e)) => return Err(End::Lost(ConnectError::Lost(e.to_string().into()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Duration, stall_in_force};

    #[test]
    fn the_stall_in_force_is_at_least_three_advertised_keepalives() {
        let ms = Duration::from_millis;
        assert_eq!(stall_in_force(Some(ms(60)), 200), ms(600));
        assert_eq!(stall_in_force(Some(ms(5_000)), 1_000), ms(5_000));
        assert_eq!(stall_in_force(Some(ms(60)), 0), ms(60));
        assert_eq!(stall_in_force(Some(ms(60)), u32::MAX), Duration::from_secs(180));
        assert_eq!(stall_in_force(None, 1_000), Duration::MAX);
    }
}
