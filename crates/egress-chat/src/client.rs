//! The client without its screen: rooms, each an egress stream, and the
//! state the screen shows, as signals and computeds of one
//! [`AsyncContext`].
//!
//! - **Sending.** [`Client::send`] writes the line to the client's own
//!   table and appends it to the room's outbox **in one SQLite
//!   transaction** (`egress_store::Outbox`): once `send` returns, the line
//!   is on disk and queued, whatever happens to the process. The room's
//!   durable cell adopts the append, its sender (egress-ws) sends it, and
//!   the cell's `status(seq)` tells where it is: saving, queued, sending,
//!   retrying, failed (with why) or delivered.
//! - **Receiving.** The push channel ([`crate::push`]) hands over every
//!   line the server stored, each room's in the server's order, own lines
//!   included; they are kept in the client's table, so a restart shows the
//!   history at once and asks only for what came after.
//! - **Offline.** [`Client::set_online`] drops every connection on purpose
//!   (the senders and the push channel), and makes them again.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use egress_codec::Json;
use egress_core::{MessageStatus, Policy, Sequence};
use egress_reactive::{AsyncContext, AsyncEgressCell, CellOptions, Computed, Handle, Signal, Threaded};
use egress_store::{Durable, Outbox, RelayConfig, open_durable_with};
use egress_ws::{ConnectionState, Sender, SenderConfig};
use rusqlite::{Connection, params};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::sync::watch;

use crate::message::{Line, Posted, Subscribe};
use crate::server::MAX_LINE;

/// Where the client connects and keeps its rooms.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Who writes.
    pub name: String,
    /// The rooms, at least one.
    pub rooms: Vec<String>,
    /// The server's egress endpoint.
    pub server: SocketAddr,
    /// The server's push channel.
    pub push: SocketAddr,
    /// The client's SQLite database (its outbox and its history).
    pub db: PathBuf,
    /// A certificate (PEM) to trust: the egress endpoint is then
    /// `wss://` and the push channel TLS, the server's name `localhost`.
    pub tls_ca: Option<PathBuf>,
}

/// One of the client's own lines the server has not pushed back yet, with
/// its delivery state.
#[derive(Clone)]
pub struct Mine {
    /// Its sequence in the room's stream.
    pub seq: Sequence,
    /// The line.
    pub line: Line,
    /// Where it is (the cell's `status(seq)`).
    pub status: Computed<Option<MessageStatus>, Threaded>,
}

impl PartialEq for Mine {
    fn eq(&self, other: &Self) -> bool {
        self.seq == other.seq && self.line == other.line
    }
}

/// The push channel's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PushState {
    /// Connecting.
    Connecting,
    /// Subscribed: lines flow.
    Connected,
    /// Waiting before the next attempt, after this error.
    Reconnecting(String),
    /// Dropped on purpose ([`Client::set_online`]).
    Offline,
}

/// One room: its durable egress cell, its sender, what the server stored
/// of it, and the client's own lines not yet pushed back.
pub struct Room {
    /// Its name.
    pub name: String,
    durable: Durable<Line>,
    sender: Mutex<Option<Sender>>,
    /// Bumped whenever the sender is made or dropped (so that readers of
    /// its state read the new one).
    sender_epoch: Signal<u64, Threaded>,
    /// The lines the server stored, in its order.
    pub history: Signal<Vec<Posted>, Threaded>,
    /// The client's own lines not yet pushed back, in the order sent.
    pub mine: Signal<Vec<Mine>, Threaded>,
    /// Lines of others pushed while the room was not shown.
    pub unread: Signal<usize, Threaded>,
}

impl Room {
    /// The sender's connection state (`None` while offline), tracked.
    #[must_use]
    pub fn connection(&self) -> Option<ConnectionState> {
        let _ = self.sender_epoch.get();
        let sender = self.sender.lock().ok()?;
        sender.as_ref().map(|s| s.state().get())
    }

    /// How many of the client's own lines are not delivered yet (not
    /// failed either), tracked.
    #[must_use]
    pub fn unsent(&self) -> usize {
        self.mine.with(|mine| mine.iter().filter(|m| unsent(m.status.get())).count())
    }

    /// [`unsent`](Self::unsent), untracked.
    #[must_use]
    pub fn unsent_untracked(&self) -> usize {
        self.mine.with_untracked(|mine| mine.iter().filter(|m| unsent(m.status.get_untracked())).count())
    }

    /// The room's egress cell.
    #[must_use]
    pub fn cell(&self) -> &AsyncEgressCell<Line> {
        &self.durable.cell
    }

    /// The room's stream in the client's store.
    fn stream(name: &str) -> String {
        format!("room:{name}")
    }
}

/// Whether a line in this state is still to be sent (neither delivered nor
/// failed).
fn unsent(status: Option<MessageStatus>) -> bool {
    !matches!(status, Some(MessageStatus::Dead(_) | MessageStatus::Acknowledged))
}

/// A chat client's state and connections (see the module's rules).
pub struct Client {
    cx: Handle<Threaded>,
    config: ClientConfig,
    /// The trust `config.tls_ca` names, read once.
    tls: Option<Arc<egress_ws::tls::rustls::ClientConfig>>,
    /// The lock on the database: one client per database (a second
    /// would take the rooms' streams over and fence the first).
    _lock: std::fs::File,
    conn: Arc<Mutex<Connection>>,
    rooms: Arc<Vec<Room>>,
    /// The room shown.
    pub current: Signal<usize, Threaded>,
    /// Whether the connections are wanted.
    pub online: Signal<bool, Threaded>,
    /// The push channel's state.
    pub push_state: Signal<PushState, Threaded>,
    /// The last error an action met (a line too long, a store that
    /// refused), for the status bar.
    pub notice: Signal<Option<String>, Threaded>,
    wanted: watch::Sender<bool>,
    push_task: tokio::task::JoinHandle<()>,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.push_task.abort();
    }
}

impl Client {
    /// Opens the client's database, restores each room (its unsent lines
    /// queued again, its history from the table), and connects.
    ///
    /// # Errors
    /// The database's or a room's store error, or a certificate that does
    /// not load.
    pub async fn start(cx: &AsyncContext, config: ClientConfig) -> anyhow::Result<Client> {
        anyhow::ensure!(!config.rooms.is_empty(), "at least one room");
        anyhow::ensure!(config.rooms.len() <= crate::push::MAX_ROOMS, "at most {} rooms", crate::push::MAX_ROOMS);
        for name in std::iter::once(&config.name).chain(&config.rooms) {
            anyhow::ensure!(
                valid_name(name),
                "{name:?}: a name or room is 1 to 64 characters, without '@' or control characters"
            );
        }
        let lock = lock_db(&config.db)?;
        let tls = match &config.tls_ca {
            Some(ca) => {
                let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
                Some(egress_ws::tls::client_config_from_pem(&pem)?)
            }
            None => None,
        };
        let conn = open_db(&config.db)?;
        let mut rooms = Vec::with_capacity(config.rooms.len());
        for name in &config.rooms {
            let relay = RelayConfig { poll_interval: Duration::from_millis(10), ..RelayConfig::default() };
            let durable = open_durable_with(
                cx,
                &config.db,
                &Room::stream(name),
                Json,
                Policy::default(),
                CellOptions::new(),
                relay,
            )
            .await
            .with_context(|| format!("opening room {name}"))?;
            let history = load_history(&conn, name)?;
            let seen: std::collections::HashSet<&str> = history.iter().map(|p| p.line.id.as_str()).collect();
            let mine = load_mine(&conn, name, &config.name)?
                .into_iter()
                .filter(|(_, line)| !seen.contains(line.id.as_str()))
                .map(|(seq, line)| Mine { seq, line, status: durable.cell.status(seq) })
                .collect();
            rooms.push(Room {
                name: name.clone(),
                durable,
                sender: Mutex::new(None),
                sender_epoch: cx.signal(0),
                history: cx.signal(history),
                mine: cx.signal(mine),
                unread: cx.signal(0),
            });
        }
        let rooms = Arc::new(rooms);
        let conn = Arc::new(Mutex::new(conn));
        let (wanted, wanted_rx) = watch::channel(true);
        let push_state = cx.signal(PushState::Connecting);
        let current = cx.signal(0usize);
        let push_task = tokio::spawn(push_loop(
            cx.handle(),
            config.push,
            tls.clone(),
            config.name.clone(),
            rooms.clone(),
            conn.clone(),
            push_state.clone(),
            current.clone(),
            wanted_rx,
        ));
        let client = Client {
            cx: cx.handle(),
            config,
            tls,
            _lock: lock,
            conn,
            rooms,
            current,
            online: cx.signal(true),
            push_state,
            notice: cx.signal(None),
            wanted,
            push_task,
        };
        for room in client.rooms.iter() {
            client.connect(room)?;
        }
        Ok(client)
    }

    /// The rooms, in the order given.
    #[must_use]
    pub fn rooms(&self) -> &[Room] {
        &self.rooms
    }

    /// The client's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Shows room `index` (its unread count back to 0).
    pub fn show(&self, index: usize) {
        if let Some(room) = self.rooms.get(index) {
            self.cx.batch(|| {
                self.current.set(index);
                room.unread.set(0);
            });
        }
    }

    /// Sends `text` to room `index`: the line in the client's table and
    /// the room's outbox in one transaction; returns its sequence once
    /// that committed.
    ///
    /// # Errors
    /// No such room, a line too long for the server, or the store's error;
    /// nothing was written then.
    pub async fn send(&self, index: usize, text: &str) -> anyhow::Result<Sequence> {
        let room = self.rooms.get(index).context("no such room")?;
        let line = Line::new(&room.name, &self.config.name, text);
        let seq = {
            let (conn, line, stream) = (self.conn.clone(), line.clone(), Room::stream(&room.name));
            tokio::task::spawn_blocking(move || -> anyhow::Result<Sequence> {
                let mut conn = conn.lock().map_err(|_| anyhow::anyhow!("the database's lock was poisoned"))?;
                let tx = conn.transaction()?;
                let seq = Outbox::new(stream).max_payload(MAX_LINE).append_json(&tx, &line)?;
                tx.execute(
                    "INSERT INTO chat_mine (room, seq, msg_id, text) VALUES (?1, ?2, ?3, ?4)",
                    params![line.room, i64::try_from(seq.0)?, line.id, line.text],
                )?;
                tx.commit()?;
                Ok(seq)
            })
            .await??
        };
        let status = room.durable.cell.status(seq);
        room.mine.update(|mine| mine.push(Mine { seq, line, status }));
        Ok(seq)
    }

    /// Drops every connection on purpose (`false`), or makes them again.
    pub async fn set_online(&self, online: bool) {
        if self.online.get_untracked() == online {
            return;
        }
        self.online.set(online);
        let _ = self.wanted.send(online);
        for room in self.rooms.iter() {
            if online {
                if let Err(e) = self.connect(room) {
                    self.notice.set(Some(format!("room {}: {e}", room.name)));
                }
            } else {
                let sender = room.sender.lock().ok().and_then(|mut s| s.take());
                room.sender_epoch.update(|e| *e += 1);
                if let Some(sender) = sender {
                    sender.shutdown().await;
                }
            }
        }
    }

    /// Starts the room's sender.
    fn connect(&self, room: &Room) -> anyhow::Result<()> {
        let (scheme, host) = match &self.tls {
            Some(_) => ("wss", format!("localhost:{}", self.config.server.port())),
            None => ("ws", self.config.server.to_string()),
        };
        let url = format!("{scheme}://{host}/");
        let producer = format!("{}@{}", self.config.name, room.name);
        let mut config = SenderConfig { max_payload: MAX_LINE, ..SenderConfig::new(producer) };
        config.tls = self.tls.clone();
        let sender = Sender::spawn_typed(room.durable.cell.clone(), Json, url, config)?;
        if let Ok(mut slot) = room.sender.lock() {
            *slot = Some(sender);
        }
        room.sender_epoch.update(|e| *e += 1);
        Ok(())
    }

    /// Stops the senders and writes what the stores hold; for a clean
    /// exit.
    pub async fn shutdown(self) {
        self.set_online(false).await;
        let rooms = self.rooms.clone();
        drop(self);
        if let Ok(rooms) = Arc::try_unwrap(rooms) {
            for room in rooms {
                room.durable.relay.shutdown().await;
            }
        }
    }
}

/// A name or a room: 1 to 64 characters, no `@` (a stream is named
/// `NAME@ROOM`), no control character.
#[must_use]
pub fn valid_name(name: &str) -> bool {
    let n = name.chars().count();
    (1..=64).contains(&n) && !name.chars().any(|c| c == '@' || c.is_control())
}

/// Locks the database at `db` for this client (a file beside it, locked
/// while the client lives; the system unlocks it when the process dies,
/// killed or not).
///
/// # Errors
/// Another client holds it, or the lock file cannot be made.
fn lock_db(db: &std::path::Path) -> anyhow::Result<std::fs::File> {
    // The file itself, wherever a symbolic link leads (a hard link is
    // another path to it that this does not see).
    let db = match std::fs::canonicalize(db) {
        Ok(real) => real,
        Err(_) => {
            let dir = db.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
            let name = db.file_name().with_context(|| format!("{}: not a file's path", db.display()))?;
            std::fs::canonicalize(dir).with_context(|| format!("{}", dir.display()))?.join(name)
        }
    };
    let db = db.as_path();
    let mut path = db.as_os_str().to_owned();
    path.push(".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", std::path::Path::new(&path).display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => {
            anyhow::bail!("another egress-chat client uses {}: give this one another --name (or --db)", db.display())
        }
        Err(std::fs::TryLockError::Error(e)) => Err(e).context("locking the database"),
    }
}

/// Opens the client's database: WAL, its tables.
///
/// # Errors
/// SQLite's.
pub fn open_db(path: &std::path::Path) -> anyhow::Result<Connection> {
    let conn = Connection::open(path).with_context(|| format!("opening {}", path.display()))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.busy_timeout(Duration::from_secs(5))?;
    egress_store::migrate(&conn)?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS chat_history (
             id INTEGER PRIMARY KEY,
             msg_id TEXT NOT NULL UNIQUE,
             room TEXT NOT NULL,
             sender TEXT NOT NULL,
             text TEXT NOT NULL
         );
         CREATE TABLE IF NOT EXISTS chat_mine (
             room TEXT NOT NULL,
             seq INTEGER NOT NULL,
             msg_id TEXT NOT NULL UNIQUE,
             text TEXT NOT NULL,
             PRIMARY KEY (room, seq)
         );",
    )?;
    Ok(conn)
}

/// The room's stored history, in the server's order.
fn load_history(conn: &Connection, room: &str) -> anyhow::Result<Vec<Posted>> {
    let mut select = conn.prepare("SELECT id, msg_id, sender, text FROM chat_history WHERE room = ?1 ORDER BY id")?;
    let rows = select.query_map([room], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, String>(3)?))
    })?;
    let mut history = Vec::new();
    for row in rows {
        let (id, msg_id, from, text) = row?;
        history.push(Posted { id: u64::try_from(id)?, line: Line { id: msg_id, room: room.into(), from, text } });
    }
    Ok(history)
}

/// The client's own lines of the room, in the order sent.
fn load_mine(conn: &Connection, room: &str, me: &str) -> anyhow::Result<Vec<(Sequence, Line)>> {
    let mut select = conn.prepare("SELECT seq, msg_id, text FROM chat_mine WHERE room = ?1 ORDER BY seq")?;
    let rows =
        select.query_map([room], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?)))?;
    let mut mine = Vec::new();
    for row in rows {
        let (seq, id, text) = row?;
        mine.push((Sequence(u64::try_from(seq)?), Line { id, room: room.into(), from: me.into(), text }));
    }
    Ok(mine)
}

/// A push connection, plain or TLS.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for S {}

/// The push subscription: connects, asks for what came after the last
/// line stored, keeps each line (table, then signals), and reconnects
/// after a failure (200 ms, doubling to 2 s) while the client is online.
#[allow(clippy::too_many_arguments)]
async fn push_loop(
    cx: Handle<Threaded>,
    addr: SocketAddr,
    tls: Option<Arc<egress_ws::tls::rustls::ClientConfig>>,
    me: String,
    rooms: Arc<Vec<Room>>,
    conn: Arc<Mutex<Connection>>,
    state: Signal<PushState, Threaded>,
    current: Signal<usize, Threaded>,
    mut wanted: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(200);
    loop {
        if !*wanted.borrow() {
            state.set(PushState::Offline);
            if wanted.changed().await.is_err() {
                return;
            }
            continue;
        }
        state.set(PushState::Connecting);
        let started = tokio::time::Instant::now();
        let session = subscribe(&cx, addr, tls.as_ref(), &me, &rooms, &conn, &state, &current);
        let ended = tokio::select! {
            ended = session => ended,
            _ = wanted.wait_for(|w| !*w) => Ok(()),
        };
        if !*wanted.borrow() {
            continue;
        }
        let why = match ended {
            Ok(()) => "the server closed the channel".to_owned(),
            Err(e) => format!("{e:#}"),
        };
        state.set(PushState::Reconnecting(why));
        // A session that lasted is a new start; one the server ended at
        // once (a full server closes a new subscriber) backs off further.
        if started.elapsed() >= Duration::from_secs(2) {
            backoff = Duration::from_millis(200);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// One push session, until the connection ends.
#[allow(clippy::too_many_arguments)]
async fn subscribe(
    cx: &Handle<Threaded>,
    addr: SocketAddr,
    tls: Option<&Arc<egress_ws::tls::rustls::ClientConfig>>,
    me: &str,
    rooms: &Arc<Vec<Room>>,
    conn: &Arc<Mutex<Connection>>,
    state: &Signal<PushState, Threaded>,
    current: &Signal<usize, Threaded>,
) -> anyhow::Result<()> {
    // From the room that has the least: a room joined again (or new) gets
    // what it missed; what another room has already is skipped below.
    let since = rooms.iter().map(|r| r.history.with_untracked(|h| h.last().map_or(0, |p| p.id))).min().unwrap_or(0);
    let names = rooms.iter().map(|r| r.name.clone()).collect();
    let stream = tokio::net::TcpStream::connect(addr).await.context("connecting the push channel")?;
    let _ = stream.set_nodelay(true);
    let stream: Box<dyn Io> = match tls {
        Some(tls) => {
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from("localhost")?;
            let connector = tokio_rustls::TlsConnector::from(tls.clone());
            Box::new(connector.connect(name, stream).await.context("the push channel's TLS handshake")?)
        }
        None => Box::new(stream),
    };
    let (read, mut write) = tokio::io::split(stream);
    let mut request = serde_json::to_vec(&Subscribe { since, rooms: names })?;
    request.push(b'\n');
    write.write_all(&request).await?;
    let mut read = BufReader::new(read);
    state.set(PushState::Connected);
    while let Some(bytes) = crate::push::read_line(&mut read, crate::push::MAX_PUSHED).await? {
        let posted: Posted = serde_json::from_slice(&bytes).context("not a pushed line")?;
        let Some(index) = rooms.iter().position(|r| r.name == posted.line.room) else { continue };
        {
            let (conn, p) = (conn.clone(), posted.clone());
            let inserted = tokio::task::spawn_blocking(move || -> anyhow::Result<usize> {
                let conn = conn.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                Ok(conn.execute(
                    "INSERT INTO chat_history (id, msg_id, room, sender, text) VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT DO NOTHING",
                    params![i64::try_from(p.id)?, p.line.id, p.line.room, p.line.from, p.line.text],
                )?)
            })
            .await??;
            // Had already (a catch-up from the room with the least, or a
            // line pushed again under another number): the table and the
            // screen keep it once.
            if inserted == 0 {
                continue;
            }
        }
        let room = &rooms[index];
        let (id, from_me) = (posted.line.id.clone(), posted.line.from == me);
        cx.batch(|| {
            room.history.update(|h| {
                // In the server's order (a catch-up may bring a room a line
                // older than the newest it has).
                let at = h.partition_point(|q| q.id < posted.id);
                h.insert(at, posted);
            });
            if from_me {
                room.mine.update(|m| m.retain(|mine| mine.line.id != id));
            } else if current.get_untracked() != index {
                room.unread.update(|u| *u += 1);
            }
        });
    }
    Ok(())
}
