//! The push channel: how the server hands every client the lines it
//! stored. A client connects over TCP (TLS when the server has a
//! certificate, within 5 s of the connection) and sends one JSON line,
//! [`Subscribe`] `{"since": N, "rooms": [...]}`; the server answers with
//! every stored line of those rooms numbered above `N`, in order, then each
//! new one as it is stored, one JSON [`Posted`] per line. A client that
//! reconnects asks again from the last number of its room with the least
//! (a room joined again gets what it missed), and keeps each line once (by
//! its id: what its other rooms had already is skipped).
//!
//! Bounds: at most [`MAX_SUBSCRIBERS`] connections (beyond, a new one is
//! closed at once); a request line of at most 4 KiB, naming at most
//! [`MAX_ROOMS`] rooms, within 5 s; a line
//! pushed of at most [`MAX_PUSHED`] bytes (the client refuses longer); a
//! subscriber that does not take a line within 10 s is dropped (it
//! reconnects and asks again); a subscriber too slow for the live queue
//! (1,024 lines) reads the rest from the table.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rusqlite::{Connection, params};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, broadcast};

use crate::message::{Line, Posted, Subscribe};

/// How many clients may subscribe at once.
pub const MAX_SUBSCRIBERS: usize = 256;

/// How many rooms one subscription may name.
pub const MAX_ROOMS: usize = 64;

/// The longest line the channel carries, in bytes: a stored line's JSON
/// is below it (the server takes lines of at most
/// [`MAX_LINE`](crate::server::MAX_LINE) bytes).
pub const MAX_PUSHED: usize = 4 * crate::server::MAX_LINE;

/// How many lines one read of the table takes.
const PAGE: usize = 512;

/// Binds the push channel at `addr` and serves it from the database at
/// `db` and the live lines of `posted`.
///
/// # Errors
/// An address that does not bind.
pub(crate) async fn serve(
    addr: SocketAddr,
    db: PathBuf,
    posted: broadcast::Sender<Posted>,
    tls: Option<Arc<egress_ws::tls::rustls::ServerConfig>>,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let listener = TcpListener::bind(addr).await.context("binding the push channel")?;
    let local = listener.local_addr()?;
    let slots = Arc::new(Semaphore::new(MAX_SUBSCRIBERS));
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else { continue };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::warn!(%peer, "push: too many subscribers, refused");
                continue;
            };
            // Subscribed before the table is read: a line stored meanwhile
            // is in the table or in the queue (or both: skipped by number).
            let live = posted.subscribe();
            let (db, acceptor) = (db.clone(), acceptor.clone());
            tokio::spawn(async move {
                let _ = stream.set_nodelay(true);
                let served = match acceptor {
                    Some(acceptor) => match tokio::time::timeout(Duration::from_secs(5), acceptor.accept(stream)).await
                    {
                        Ok(Ok(tls)) => subscriber(tls, db, live).await,
                        Ok(Err(e)) => Err(anyhow::Error::from(e).context("the TLS handshake")),
                        Err(_) => Err(anyhow::anyhow!("no TLS handshake within 5 s")),
                    },
                    None => subscriber(stream, db, live).await,
                };
                if let Err(e) = served {
                    tracing::info!(%peer, error = %e, "push: subscriber gone");
                }
                drop(slot);
            });
        }
    });
    Ok((local, task))
}

/// One subscriber: its request, the table after it, then the live lines.
async fn subscriber(
    stream: impl AsyncRead + AsyncWrite + Unpin,
    db: PathBuf,
    mut live: broadcast::Receiver<Posted>,
) -> anyhow::Result<()> {
    let (read, mut write) = tokio::io::split(stream);
    let mut read = BufReader::new(read);
    let request = tokio::time::timeout(Duration::from_secs(5), read_line(&mut read, 4096))
        .await
        .context("no request within 5 s")??
        .context("closed before its request")?;
    let Subscribe { since, rooms } = serde_json::from_slice(&request).context("not a subscription")?;
    anyhow::ensure!(rooms.len() <= MAX_ROOMS, "more than {MAX_ROOMS} rooms");
    let wanted = |p: &Posted| rooms.is_empty() || rooms.contains(&p.line.room);
    let conn = {
        let db = db.clone();
        tokio::task::spawn_blocking(move || Connection::open(&db)).await??
    };
    let conn = Arc::new(std::sync::Mutex::new(conn));
    let mut last = since;
    last = catch_up(&conn, &mut write, last, &wanted).await?;
    loop {
        match live.recv().await {
            Ok(p) if p.id <= last => {}
            Ok(p) => {
                if wanted(&p) {
                    send(&mut write, &p).await?;
                }
                last = p.id;
            }
            Err(broadcast::error::RecvError::Lagged(_)) => last = catch_up(&conn, &mut write, last, &wanted).await?,
            Err(broadcast::error::RecvError::Closed) => return Ok(()),
        }
    }
}

/// Sends every stored line numbered above `last`, a page at a time;
/// returns the last number sent.
async fn catch_up(
    conn: &Arc<std::sync::Mutex<Connection>>,
    write: &mut (impl AsyncWriteExt + Unpin),
    mut last: u64,
    wanted: &impl Fn(&Posted) -> bool,
) -> anyhow::Result<u64> {
    loop {
        let page = {
            let conn = conn.clone();
            tokio::task::spawn_blocking(move || {
                let conn = conn.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                read_after(&conn, last)
            })
            .await??
        };
        for p in &page {
            if wanted(p) {
                send(write, p).await?;
            }
            last = p.id;
        }
        if page.len() < PAGE {
            return Ok(last);
        }
    }
}

/// The stored lines numbered above `after`, at most a page.
fn read_after(conn: &Connection, after: u64) -> anyhow::Result<Vec<Posted>> {
    let after = i64::try_from(after).unwrap_or(i64::MAX);
    let mut select = conn
        .prepare_cached("SELECT id, msg_id, room, sender, text FROM chat_message WHERE id > ?1 ORDER BY id LIMIT ?2")?;
    let rows = select.query_map(params![after, PAGE as i64], |r| {
        Ok((r.get::<_, i64>(0)?, Line { id: r.get(1)?, room: r.get(2)?, from: r.get(3)?, text: r.get(4)? }))
    })?;
    let mut page = Vec::new();
    for row in rows {
        let (id, line) = row?;
        page.push(Posted { id: u64::try_from(id)?, line });
    }
    Ok(page)
}

/// Writes one line, within 10 s.
async fn send(write: &mut (impl AsyncWriteExt + Unpin), p: &Posted) -> anyhow::Result<()> {
    let mut bytes = serde_json::to_vec(p)?;
    bytes.push(b'\n');
    tokio::time::timeout(Duration::from_secs(10), write.write_all(&bytes)).await.context("a subscriber too slow")??;
    Ok(())
}

/// Reads one `\n`-terminated line of at most `limit` bytes (without the
/// newline); `None` at the end of the stream.
///
/// # Errors
/// A line longer than `limit`, or the stream's error.
pub async fn read_line(read: &mut (impl AsyncBufRead + Unpin), limit: usize) -> anyhow::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let n = (&mut *read).take(limit as u64 + 1).read_until(b'\n', &mut line).await?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        anyhow::ensure!(line.len() <= limit, "a line longer than {limit} bytes");
        anyhow::bail!("the stream ended inside a line");
    }
    line.pop();
    Ok(Some(line))
}
