//! The receiver's I/O: the accept loop, a connection's handshake, and the
//! task that moves its frames between the socket and the inbox.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use egress_core::Incarnation;
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tracing::Instrument as _;

use super::acks::Acks;
use super::inbox::{Admission, ConnId, Content, Taken};
use super::{Shared, Signal, upgrade};
use crate::protocol::{CloseCode, DecodeError, Frame, Limits, Terms, VERSION};

pub(super) async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                if shared.open.load(Ordering::Acquire) >= shared.config.max_connections.max(1) {
                    // No task, no wait: the answer fits a fresh socket's
                    // buffer, and the socket closes when it drops. Over
                    // TLS a plaintext answer would read as a TLS failure
                    // to the client, and a TLS handshake is what the bound
                    // saves: the socket just closes.
                    #[cfg(feature = "tls")]
                    let plain = shared.config.tls.is_none();
                    #[cfg(not(feature = "tls"))]
                    let plain = true;
                    if plain {
                        let _ = stream.try_write(
                            b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
                        );
                    }
                    shared.refused_capacity.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(%peer, "egress receiver: at its connection bound, a connection refused");
                    continue;
                }
                let _ = stream.set_nodelay(true);
                shared.open.fetch_add(1, Ordering::AcqRel);
                let shared = shared.clone();
                let span = tracing::info_span!("egress_receiver", %peer);
                tokio::spawn(
                    async move {
                        let _open = Open(&shared);
                        match serve(stream, peer, &shared).await {
                            Ok(()) => tracing::debug!("egress receiver: a connection ended"),
                            Err(e) => tracing::warn!(error = %e, "egress receiver closed a connection"),
                        }
                    }
                    .instrument(span),
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "egress receiver: accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Counts a connection open for as long as its task lives.
struct Open<'a>(&'a Shared);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a connection ended badly.
#[derive(Debug, thiserror::Error)]
enum ServeError {
    #[error("websocket: {0}")]
    Ws(#[from] tokio_tungstenite::tungstenite::Error),
    #[error("tls: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("{0}")]
    Timeout(&'static str),
}

type Ws = tokio_tungstenite::WebSocketStream<Box<dyn crate::sender::Io>>;

/// Sends a close frame and closes, giving up after a second (a peer that
/// does not read must not hold the task).
async fn close(ws: &mut Ws, code: CloseCode, detail: u64, reason: impl Into<String>) {
    let frame = Frame::Close { code, detail, reason: reason.into() };
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = ws.send(Message::Binary(frame.encode())).await;
        let _ = ws.close(None).await;
    })
    .await;
}

/// Sends `message`, or fails if it takes longer than `limit` (a peer that
/// does not read).
async fn send_within(ws: &mut Ws, message: Message, limit: Duration) -> Result<(), ServeError> {
    match tokio::time::timeout(limit, ws.send(message)).await {
        Ok(sent) => sent.map_err(ServeError::Ws),
        Err(_) => Err(ServeError::Timeout("a write to the producer did not complete in time")),
    }
}

/// What one read of a connection brought.
enum Heard {
    /// A frame (a binary message).
    Frame(Frame),
    /// A ping or a pong.
    Control,
    /// The end: the peer closed.
    Closed,
}

/// Reads the next message; notes when in `heard` (whatever it was: the
/// idle timer counts pings and pongs as heard).
async fn next_message(ws: &mut Ws, limits: Limits, heard: &mut Instant) -> Result<Heard, FrameError> {
    let message = ws.next().await;
    *heard = Instant::now();
    match message {
        None | Some(Ok(Message::Close(_))) => Ok(Heard::Closed),
        Some(Ok(Message::Binary(bytes))) => Frame::decode(&bytes, limits).map(Heard::Frame).map_err(FrameError::Decode),
        Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => Ok(Heard::Control),
        Some(Ok(Message::Text(_))) => Err(FrameError::Text),
        Some(Err(e)) => Err(FrameError::Ws(e)),
    }
}

/// The next frame, past pings and pongs; `Ok(None)` when the peer closed.
async fn next_frame(ws: &mut Ws, limits: Limits) -> Result<Option<Frame>, FrameError> {
    loop {
        match next_message(ws, limits, &mut Instant::now()).await? {
            Heard::Frame(frame) => return Ok(Some(frame)),
            Heard::Control => {}
            Heard::Closed => return Ok(None),
        }
    }
}

#[derive(Debug)]
enum FrameError {
    Decode(DecodeError),
    Text,
    Ws(tokio_tungstenite::tungstenite::Error),
}

impl FrameError {
    /// The close that answers it (none for a broken socket).
    fn close(&self) -> Option<(CloseCode, u64, String)> {
        match self {
            FrameError::Decode(DecodeError::Version(v)) => {
                Some((CloseCode::Version, u64::from(VERSION), format!("version {v} is not {VERSION}")))
            }
            FrameError::Decode(e) => Some((CloseCode::Protocol, 0, e.to_string())),
            FrameError::Text => Some((CloseCode::Protocol, 0, "a text message".into())),
            FrameError::Ws(tokio_tungstenite::tungstenite::Error::Capacity(e)) => {
                Some((CloseCode::Protocol, 0, e.to_string()))
            }
            FrameError::Ws(_) => None,
        }
    }

    fn into_error(self) -> ServeError {
        match self {
            FrameError::Ws(e) => ServeError::Ws(e),
            FrameError::Decode(e) => ServeError::Protocol(e.to_string()),
            FrameError::Text => ServeError::Protocol("a text message".into()),
        }
    }
}

/// How much a connection reads from its socket at a time. tungstenite
/// zero-fills that much of its read buffer before every read, so its
/// default of 128 KiB cost the reference receiver more per small message
/// than decoding it (about 1,100 instructions a message in the egress-ws
/// bench, docs/benchmarks.md). 16 KiB holds a full window of 256 small
/// frames; a larger frame still arrives whole, in several reads (the
/// buffer grows to the frame's length).
const READ_CHUNK: usize = 16 * 1024;

/// The most a connection's WebSocket keeps of what it has not yet written.
/// tungstenite answers every ping it reads with a pong, buffered while the
/// socket is blocked, and by default without a limit: a producer that
/// floods pings and never reads grew the receiver by tens of megabytes a
/// second until its connection was closed. At the limit, the pong waits
/// (only the latest is kept). The receiver's own writes are flushed one by
/// one, so they never gather here ([`WebSocketConfig::write_buffer_size`]
/// 0: each frame goes to the socket as it is written).
const WRITE_LIMIT: usize = 64 * 1024;

fn ws_config(limits: Limits) -> WebSocketConfig {
    let max = limits.max_payload.saturating_add(64);
    WebSocketConfig::default()
        .max_message_size(Some(max))
        .max_frame_size(Some(max))
        .read_buffer_size(READ_CHUNK)
        .write_buffer_size(0)
        .max_write_buffer_size(WRITE_LIMIT)
}

/// Tells the inbox when the connection task ends, however it ends.
struct Admitted<'a> {
    shared: &'a Shared,
    producer: Arc<str>,
    conn: ConnId,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let now = self.shared.now();
        self.shared.inbox.lock().closed(&self.producer, self.conn, now);
    }
}

/// What the application's record says of a stream the inbox does not hold
/// (`None` without a record, or when the inbox holds it: memory is ahead).
async fn stored(shared: &Shared, producer: &Arc<str>, incarnation: u128) -> Result<Option<u64>, String> {
    let Some(resume) = shared.config.resume.clone() else { return Ok(None) };
    if shared.inbox.lock().holds(producer, incarnation) {
        return Ok(None);
    }
    let producer = producer.clone();
    match tokio::task::spawn_blocking(move || resume.resume(&producer, Incarnation(incarnation))).await {
        Ok(result) => result,
        Err(e) => Err(format!("the record's lookup failed: {e}")),
    }
}

async fn serve(stream: TcpStream, peer: std::net::SocketAddr, shared: &Shared) -> Result<(), ServeError> {
    let config = &shared.config;
    let refused = || shared.rejected.fetch_add(1, Ordering::Relaxed);
    // TLS, the upgrade and the handshake, within one timeout from accept.
    let opened = tokio::time::timeout(config.handshake_timeout, async {
        #[cfg(feature = "tls")]
        let stream = upgrade::secure(stream, config.tls.as_ref()).await?;
        #[cfg(not(feature = "tls"))]
        let stream = upgrade::secure(stream).await?;
        let mut refusal = None;
        // tungstenite's callback type: its error is the HTTP response.
        #[allow(clippy::result_large_err)]
        let answer = |request: &_, response| {
            let answer = upgrade::answer(config.authorize.as_ref(), peer, request, response, &mut refusal);
            // Counted before the refusal is written: a client that reads
            // it finds it counted.
            if answer.is_err() {
                shared.unauthorized.fetch_add(1, Ordering::Relaxed);
            }
            answer
        };
        let accepted =
            tokio_tungstenite::accept_hdr_async_with_config(stream, answer, Some(ws_config(config.limits))).await;
        if let Some(refusal) = refusal {
            tracing::info!(?refusal, "egress receiver: an upgrade refused by the authorization check");
            return Err(ServeError::Protocol(format!("upgrade refused: {refusal:?}")));
        }
        let mut ws = accepted?;
        let first = next_frame(&mut ws, config.limits).await;
        Ok::<_, ServeError>((ws, first))
    })
    .await;
    let (mut ws, first) = match opened {
        Ok(Ok(opened)) => opened,
        Ok(Err(e)) => {
            refused();
            return Err(e);
        }
        Err(_) => {
            refused();
            shared.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
            return Err(ServeError::Timeout("no upgrade and handshake in time"));
        }
    };
    let first = match first {
        Ok(Some(frame)) => frame,
        Ok(None) => return Ok(()),
        Err(e) => {
            refused();
            if let Some((code, detail, reason)) = e.close() {
                close(&mut ws, code, detail, reason).await;
            }
            return Err(e.into_error());
        }
    };
    let Frame::Handshake { producer, incarnation, generation, resume_from } = first else {
        refused();
        close(&mut ws, CloseCode::Protocol, 0, "expected a handshake").await;
        return Err(ServeError::Protocol(format!("expected a handshake, got {first:?}")));
    };
    let producer: Arc<str> = producer.into();
    let stored = match stored(shared, &producer, incarnation).await {
        Ok(stored) => stored,
        Err(why) => {
            refused();
            tracing::warn!(%producer, %why, "egress receiver: the application's record could not be read");
            close(&mut ws, CloseCode::Retry, 0, "the receiver's store is unavailable").await;
            return Err(ServeError::Protocol(why));
        }
    };
    let signal = Arc::new(Signal::default());
    let now = shared.now();
    let admission =
        shared.inbox.lock().handshake(&producer, incarnation, generation, resume_from, stored, signal.clone(), now);
    let (conn, next, received) = match admission {
        Admission::Welcome { conn, next, received, fenced } => {
            tracing::info!(
                %producer,
                incarnation = format_args!("{incarnation:032x}"),
                generation,
                next,
                received,
                fenced = fenced.is_some(),
                "egress receiver: a producer admitted"
            );
            if let Some(old) = fenced {
                old.fenced.store(true, Ordering::Release);
                old.notify.notify_one();
            }
            (conn, next, received)
        }
        Admission::Refused { code, detail, reason } => {
            if code == CloseCode::Busy {
                tracing::info!(%producer, "egress receiver: at its producer bound, a handshake refused");
            } else {
                tracing::debug!(%producer, ?code, detail, %reason, "egress receiver: a handshake refused");
            }
            close(&mut ws, code, detail, reason.clone()).await;
            return Err(ServeError::Protocol(reason));
        }
    };
    let admitted = Admitted { shared, producer, conn };
    let terms = Terms {
        max_payload: u32::try_from(config.limits.max_payload).unwrap_or(u32::MAX),
        keepalive_ms: u32::try_from(config.keepalive.as_millis()).unwrap_or(u32::MAX),
    };
    let welcome = Message::Binary(Frame::Welcome { generation, next, received, terms }.encode());
    send_within(&mut ws, welcome, config.idle_timeout).await?;
    Connection { shared, ws, signal, admitted, generation, acks: Acks::new(config, generation) }.run().await
}

/// An admitted connection's loop.
struct Connection<'a> {
    shared: &'a Shared,
    ws: Ws,
    signal: Arc<Signal>,
    admitted: Admitted<'a>,
    generation: u64,
    acks: Acks,
}

/// Whether the connection goes on.
enum Step {
    Go,
    /// An ack may be due (a commit woke the connection, or a timer fired).
    Ack,
    /// A protocol error found by the inbox: close with code 1.
    Refuse(String),
    /// The stream needs a sequence this connection dropped (its buffer
    /// above a gap was full): close with code 5, so that the producer
    /// replays from the welcome.
    Stuck,
    End(Result<(), ServeError>),
}

impl Connection<'_> {
    async fn run(mut self) -> Result<(), ServeError> {
        let config = &self.shared.config;
        let mut space = self.shared.space.subscribe();
        let mut waiting: Option<(u64, Content)> = None;
        // A ping once the connection has been silent for the keepalive the
        // welcome advertised: counted from the last thing sent, whatever
        // it was.
        let keepalive = config.keepalive.max(Duration::from_millis(1));
        let mut last_sent = Instant::now();
        // When the producer was last heard: a frame, a ping or a pong.
        let mut heard = Instant::now();
        let idle = config.idle_timeout;
        loop {
            let deadline = self.acks.deadline();
            let silent_at = heard + idle;
            let step = tokio::select! {
                // A ping or a pong goes round the loop, so that the idle
                // timer starts again from it.
                heard_now = next_message(&mut self.ws, config.limits, &mut heard), if waiting.is_none() => match heard_now {
                    Ok(Heard::Frame(frame)) => self.frame(frame, &mut space, &mut waiting),
                    Ok(Heard::Control) => Step::Go,
                    Ok(Heard::Closed) => return Ok(()),
                    Err(e) => {
                        if let Some((code, detail, reason)) = e.close() {
                            self.shared.rejected.fetch_add(1, Ordering::Relaxed);
                            close(&mut self.ws, code, detail, reason).await;
                        }
                        return Err(e.into_error());
                    }
                },
                changed = space.changed(), if waiting.is_some() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    let (sequence, content) = waiting.take().expect("invariant broken: waiting checked above");
                    let step = self.offer(sequence, content, &mut space, &mut waiting);
                    if waiting.is_none() {
                        // Reading again: silence counts from now.
                        heard = Instant::now();
                    }
                    step
                }
                () = self.signal.notify.notified() => self.signalled().await,
                () = sleep_until(deadline) => Step::Ack,
                () = tokio::time::sleep_until(silent_at), if waiting.is_none() => {
                    self.shared.idle_closed.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(producer = %self.admitted.producer, "egress receiver: a silent connection closed");
                    close(&mut self.ws, CloseCode::Normal, 0, "nothing heard in time").await;
                    return Err(ServeError::Timeout("nothing heard from the producer in time"));
                }
                () = tokio::time::sleep_until(last_sent + keepalive) => {
                    self.send(Message::Ping(Bytes::new())).await?;
                    last_sent = Instant::now();
                    Step::Go
                }
            };
            match step {
                Step::Go => continue,
                Step::Ack => {}
                Step::Refuse(reason) => {
                    self.shared.rejected.fetch_add(1, Ordering::Relaxed);
                    close(&mut self.ws, CloseCode::Protocol, 0, reason.clone()).await;
                    return Err(ServeError::Protocol(reason));
                }
                Step::Stuck => {
                    let why = "the next sequence was dropped above a gap: reconnect and resend from the welcome";
                    tracing::debug!(producer = %self.admitted.producer, why, "egress receiver: closing");
                    close(&mut self.ws, CloseCode::Retry, 0, why).await;
                    return Ok(());
                }
                Step::End(result) => return result,
            }
            let (shared, a) = (self.shared, &self.admitted);
            let due = self.acks.due(
                Instant::now(),
                |time_up| shared.inbox.lock().poll_ack(&a.producer, a.conn, time_up).map(|(_, through)| through),
                |fault| {
                    shared.ack_faults[fault as usize].fetch_add(1, Ordering::Relaxed);
                },
            );
            if !due.is_empty() {
                for frame in due {
                    tracing::trace!(?frame, "egress receiver: ack");
                    self.send(Message::Binary(frame.encode())).await?;
                }
                last_sent = Instant::now();
            }
        }
    }

    /// Sends within `idle_timeout`, or ends the connection (counted).
    async fn send(&mut self, message: Message) -> Result<(), ServeError> {
        let sent = send_within(&mut self.ws, message, self.shared.config.idle_timeout).await;
        if matches!(sent, Err(ServeError::Timeout(_))) {
            self.shared.idle_closed.fetch_add(1, Ordering::Relaxed);
            tracing::info!(producer = %self.admitted.producer, "egress receiver: a connection that does not read closed");
        }
        sent
    }

    fn frame(&mut self, frame: Frame, space: &mut watch::Receiver<u64>, waiting: &mut Option<(u64, Content)>) -> Step {
        match frame {
            Frame::Data { generation, sequence, payload, .. } if generation == self.generation => {
                tracing::trace!(sequence, len = payload.len(), "egress receiver: data");
                // Copied out of the read buffer: the frame is a slice of it,
                // and a slice keeps the whole buffer alive (1 MiB after a
                // frame that large) for as long as the receiver or the
                // application keeps the payload. The byte bounds count
                // payload bytes, so each kept payload owns only its own.
                self.offer(sequence, Content::Message(Bytes::copy_from_slice(&payload)), space, waiting)
            }
            Frame::Tombstone { generation, sequence, reason, .. } if generation == self.generation => {
                self.offer(sequence, Content::Skipped(reason), space, waiting)
            }
            Frame::Close { code, detail, reason } => {
                tracing::debug!(?code, detail, %reason, "producer closed the connection");
                // An orderly close names what the producer saw acknowledged.
                if code == CloseCode::Normal {
                    let a = &self.admitted;
                    a.shared.inbox.lock().confirm(&a.producer, a.conn, detail);
                }
                Step::End(Ok(()))
            }
            other => Step::Refuse(format!("unexpected frame {other:?}")),
        }
    }

    /// Offers a frame to the inbox; a full queue keeps it in `waiting`.
    fn offer(
        &mut self,
        sequence: u64,
        content: Content,
        space: &mut watch::Receiver<u64>,
        waiting: &mut Option<(u64, Content)>,
    ) -> Step {
        let a = &self.admitted;
        // Marked seen before the offer: a slot freed after it wakes us.
        space.borrow_and_update();
        let taken = self.shared.inbox.lock().take_frame(&a.producer, a.conn, self.generation, sequence, content);
        match taken {
            Taken::Delivered { stuck, .. } => {
                self.shared.ready.notify_one();
                if stuck { Step::Stuck } else { Step::Go }
            }
            Taken::Buffered | Taken::Duplicate | Taken::Overflow => Step::Go,
            Taken::Full(content) => {
                *waiting = Some((sequence, content));
                Step::Go
            }
            Taken::Fenced => {
                self.signal.fenced.store(true, Ordering::Release);
                self.signal.notify.notify_one();
                Step::Go
            }
            Taken::Invalid(reason) => Step::Refuse(reason),
        }
    }

    /// Handles the signals: fenced, stop, or an ack that may be due.
    async fn signalled(&mut self) -> Step {
        let s = &self.signal;
        let closing = if s.stop.load(Ordering::Acquire) {
            Some((CloseCode::Normal, "the receiver is shutting down"))
        } else if s.fenced.load(Ordering::Acquire) {
            Some((CloseCode::Fenced, "a newer connection replaced this one"))
        } else {
            None
        };
        if let Some((code, reason)) = closing {
            tracing::debug!(producer = %self.admitted.producer, ?code, reason, "egress receiver: closing");
            close(&mut self.ws, code, 0, reason).await;
            return Step::End(Ok(()));
        }
        let (shared, a) = (self.shared, &self.admitted);
        self.acks.woken(Instant::now(), || shared.inbox.lock().unacked(&a.producer, a.conn));
        Step::Ack
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
