//! `egress-chat serve`: the reference receiver (egress-ws) with an
//! application that stores each line in SQLite, with the receiver's record
//! in the same transaction, and pushes it to every subscribed client.
//!
//! - **Exactly once.** Each batch of deliveries is one transaction: the
//!   lines (`chat_message`, numbered in commit order) and the receiver's
//!   record of what it committed (`ReceivedLog`). Only then are the
//!   deliveries committed (acknowledged to their clients). A server killed
//!   at any point resumes each client's stream after its last stored line
//!   (the receiver reads the record at the handshake), so no line is
//!   stored twice and none is lost; a line's id is unique in the table
//!   too, which the tests check.
//! - **Fan-out** ([`crate::push`]): each client subscribes with the last
//!   line number it has and gets every line after it, then each new one.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use egress_ws::{AckMode, Content, Delivery, Receiver, ReceiverConfig};
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::broadcast;

use crate::message::{Line, Posted};

/// The largest line a client may send, in bytes of JSON (the receiver
/// refuses larger: the client's cell shows it failed, never delivered).
pub const MAX_LINE: usize = 4096;

/// How many deliveries one transaction takes at most.
const BATCH: usize = 256;

/// Where the server listens and keeps its lines.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The egress WebSocket endpoint (`ws://` or, with `tls`, `wss://`).
    pub listen: SocketAddr,
    /// The push channel (see [`crate::push`]).
    pub push: SocketAddr,
    /// The server's SQLite database.
    pub db: PathBuf,
    /// A certificate and key (PEM files): the egress endpoint is then
    /// `wss://` and the push channel TLS.
    pub tls: Option<(PathBuf, PathBuf)>,
}

/// A running server: its addresses, and the task that stores what the
/// receiver delivers.
pub struct Server {
    ws: SocketAddr,
    push: SocketAddr,
    store: tokio::task::JoinHandle<anyhow::Result<()>>,
    push_task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.store.abort();
        self.push_task.abort();
    }
}

impl Server {
    /// Opens the database (creating its table), binds both endpoints and
    /// starts serving.
    ///
    /// # Errors
    /// The database's, a certificate or key that does not load, or an
    /// address that does not bind.
    pub async fn start(config: ServerConfig) -> anyhow::Result<Server> {
        let conn = open_db(&config.db)?;
        let log = Arc::new(egress_store::ReceivedLog::open(&config.db).context("opening the receiver's log")?);
        let mut receiver_config =
            ReceiverConfig { ack_mode: AckMode::Explicit, resume: Some(log), ..ReceiverConfig::default() };
        receiver_config.limits.max_payload = MAX_LINE;
        let tls = match &config.tls {
            Some((cert, key)) => {
                let read = |path: &Path| std::fs::read(path).with_context(|| format!("reading {}", path.display()));
                Some(egress_ws::tls::server_config_from_pem(&read(cert)?, &read(key)?)?)
            }
            None => None,
        };
        receiver_config.tls = tls.clone();
        let receiver = Receiver::bind(config.listen, receiver_config).await.context("binding the egress endpoint")?;
        let ws = receiver.local_addr();
        let (posted, _) = broadcast::channel(1024);
        let (push, push_task) = crate::push::serve(config.push, config.db.clone(), posted.clone(), tls).await?;
        let store = tokio::spawn(store_loop(receiver, Arc::new(Mutex::new(conn)), posted));
        tracing::info!(%ws, %push, db = %config.db.display(), "egress-chat server started");
        Ok(Server { ws, push, store, push_task })
    }

    /// The egress endpoint's address.
    #[must_use]
    pub fn ws_addr(&self) -> SocketAddr {
        self.ws
    }

    /// The push channel's address.
    #[must_use]
    pub fn push_addr(&self) -> SocketAddr {
        self.push
    }

    /// Serves until the storing task fails (a database error).
    ///
    /// # Errors
    /// Why it stopped.
    pub async fn run(mut self) -> anyhow::Result<()> {
        (&mut self.store).await.context("the storing task")?
    }
}

/// Opens the server's database: WAL, and its table of lines.
///
/// # Errors
/// SQLite's.
pub fn open_db(path: &Path) -> anyhow::Result<Connection> {
    let conn = Connection::open(path).with_context(|| format!("opening {}", path.display()))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS chat_message (
             id INTEGER PRIMARY KEY AUTOINCREMENT,
             msg_id TEXT NOT NULL UNIQUE,
             room TEXT NOT NULL,
             sender TEXT NOT NULL,
             text TEXT NOT NULL,
             producer TEXT NOT NULL,
             seq INTEGER NOT NULL
         );
         CREATE INDEX IF NOT EXISTS chat_message_room ON chat_message (room, id);",
    )?;
    Ok(conn)
}

/// Takes the receiver's deliveries in batches: each batch's lines and the
/// receiver's record in one transaction, then the deliveries committed,
/// then the new lines pushed. A batch the database refuses (a full disk, a
/// locked file) is given back to the receiver uncommitted, to come again
/// after a pause (1 s): nothing is lost, and the server goes on.
async fn store_loop(
    mut receiver: Receiver,
    conn: Arc<Mutex<Connection>>,
    posted: broadcast::Sender<Posted>,
) -> anyhow::Result<()> {
    loop {
        let mut batch = vec![receiver.recv().await];
        while batch.len() < BATCH
            && let Some(d) = receiver.try_recv()
        {
            batch.push(d);
        }
        let (batch, stored) = tokio::task::spawn_blocking({
            let conn = conn.clone();
            move || {
                let mut conn = conn.lock().map_err(|_| anyhow::anyhow!("the database's lock was poisoned"))?;
                let stored = store_batch(&mut conn, &batch);
                Ok::<_, anyhow::Error>((batch, stored))
            }
        })
        .await??;
        let stored = match stored {
            Ok(stored) => stored,
            Err(e) => {
                // Dropped uncommitted: given back, delivered again.
                tracing::warn!(error = %e, lines = batch.len(), "a batch not stored: given back, tried again in 1 s");
                drop(batch);
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        for d in batch {
            d.commit();
        }
        for p in stored {
            // No subscriber is no error.
            let _ = posted.send(p);
        }
    }
}

/// Whether `line` is its producer's: a client's stream is named
/// `NAME@ROOM` (see [`crate::client`]), and a line is stored only as its
/// stream's author and room (a client cannot post as another, or into a
/// room through another room's stream).
#[must_use]
pub fn authored_by(line: &Line, producer: &str) -> bool {
    producer.split_once('@').is_some_and(|(name, room)| name == line.from && room == line.room)
}

/// Writes a batch: each line not stored before, and the receiver's record,
/// in one transaction. Returns the lines stored. A delivery whose sequence
/// the table cannot hold (at or above `i64::MAX`: a peer's stream started
/// there on purpose) is neither stored nor recorded, only committed: a
/// peer's bad input, like a payload that is not a line.
fn store_batch(conn: &mut Connection, batch: &[Delivery]) -> anyhow::Result<Vec<Posted>> {
    let tx = conn.transaction()?;
    let mut stored = Vec::new();
    for d in batch {
        if i64::try_from(d.sequence).map_or(true, |s| s == i64::MAX) {
            tracing::warn!(producer = %d.producer, sequence = d.sequence, "a sequence out of the table's range: skipped");
            continue;
        }
        if let Content::Message(bytes) = &d.content {
            match serde_json::from_slice::<Line>(bytes) {
                Ok(line) if !authored_by(&line, &d.producer) => {
                    tracing::warn!(producer = %d.producer, from = %line.from, room = %line.room, "a line not its producer's: skipped");
                }
                Ok(line) => {
                    let seq = i64::try_from(d.sequence)?;
                    let inserted = tx
                        .prepare_cached(
                            "INSERT INTO chat_message (msg_id, room, sender, text, producer, seq)
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (msg_id) DO NOTHING RETURNING id",
                        )?
                        .query_row(params![line.id, line.room, line.from, line.text, &*d.producer, seq], |r| {
                            r.get::<_, i64>(0)
                        })
                        .optional()?;
                    match inserted {
                        Some(id) => stored.push(Posted { id: u64::try_from(id)?, line }),
                        None => tracing::warn!(id = %line.id, "a line stored before came again: skipped"),
                    }
                }
                // A peer's bad payload is committed (skipped), never stored.
                Err(e) => tracing::warn!(producer = %d.producer, sequence = d.sequence, error = %e, "not a line"),
            }
        }
        egress_store::ReceivedLog::record(&tx, &d.producer, d.incarnation, d.sequence)?;
    }
    tx.commit()?;
    Ok(stored)
}
