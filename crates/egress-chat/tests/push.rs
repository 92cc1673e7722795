//! The push channel from the client's side (a hostile review's probes): a
//! fake (hostile) push server, and the real one with a client whose rooms
//! change between runs.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use egress_chat::client::{Client, ClientConfig};
use egress_chat::message::{Line, Posted};
use egress_chat::server::{Server, ServerConfig};
use egress_reactive::AsyncContext;
use egress_testkit::TempDir;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpListener;

fn config(
    name: &str,
    rooms: &[&str],
    ws: std::net::SocketAddr,
    push: std::net::SocketAddr,
    dir: &Path,
) -> ClientConfig {
    ClientConfig {
        name: name.into(),
        rooms: rooms.iter().map(|r| (*r).to_owned()).collect(),
        server: ws,
        push,
        db: dir.join(format!("{name}.db")),
        tls_ca: None,
    }
}

fn texts(client: &Client, room: usize) -> Vec<String> {
    client.rooms()[room].history.with_untracked(|h: &Vec<Posted>| h.iter().map(|p| p.line.text.clone()).collect())
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    egress_testkit::until(|| f().then_some(()), || what.to_owned()).await;
}

/// A push server that sends one line (one message id) twice under two
/// numbers: the client's table keeps it once (`msg_id` is unique), its
/// screen's history twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_pushed_twice_under_two_numbers_is_shown_once() {
    let dir = TempDir::new();
    let fake = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let push = fake.local_addr().unwrap();
    tokio::spawn(async move {
        let (stream, _) = fake.accept().await.unwrap();
        let (read, mut write) = stream.into_split();
        let mut request = String::new();
        BufReader::new(read).read_line(&mut request).await.unwrap();
        let line = Line { id: "0".repeat(32), room: "general".into(), from: "bob".into(), text: "once".into() };
        for id in [1, 2] {
            let mut bytes = serde_json::to_vec(&Posted { id, line: line.clone() }).unwrap();
            bytes.push(b'\n');
            write.write_all(&bytes).await.unwrap();
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
    let cx = AsyncContext::new();
    let ws = "127.0.0.1:9".parse().unwrap(); // nothing there: the senders retry, no matter
    let alice = Client::start(&cx, config("alice", &["general"], ws, push, dir.path())).await.unwrap();
    until("the pushed line arrives", || !texts(&alice, 0).is_empty()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let db = rusqlite::Connection::open(dir.path().join("alice.db")).unwrap();
    let stored: i64 = db.query_row("SELECT COUNT(*) FROM chat_history", [], |r| r.get(0)).unwrap();
    assert_eq!(stored, 1, "the table keeps it once");
    assert_eq!(texts(&alice, 0), ["once"], "the screen shows a line twice (the table has it once)");
}

/// A push server that takes the connection and closes it at once (what the
/// real one does to the 257th subscriber): the client's backoff must grow
/// (200 ms doubling to 2 s, says `push_loop`), not restart at 200 ms
/// after every connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_server_that_closes_at_once_is_not_hammered() {
    let dir = TempDir::new();
    let fake = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let push = fake.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    tokio::spawn({
        let accepted = accepted.clone();
        async move {
            loop {
                let (stream, _) = fake.accept().await.unwrap();
                accepted.fetch_add(1, Ordering::Relaxed);
                drop(stream);
            }
        }
    });
    let cx = AsyncContext::new();
    let ws = "127.0.0.1:9".parse().unwrap();
    let _alice = Client::start(&cx, config("alice", &["general"], ws, push, dir.path())).await.unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    // Doubling from 200 ms: attempts at 0, 0.2, 0.6, 1.4, 3.0 s (5, and 6
    // with scheduling slack) within 4 s.
    let n = accepted.load(Ordering::Relaxed);
    assert!(n <= 6, "{n} connections in 4 s: the backoff restarts at 200 ms after each connect");
}

/// A client leaves a room and joins it again (its `--room` list between
/// runs): a line posted to that room meanwhile must come when it is back.
/// The client asks the channel for everything after the highest number of
/// any room it has now, so the room it left never gets the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_joined_again_gets_the_lines_it_missed() {
    let dir = TempDir::new();
    let srv = Server::start(ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        push: "127.0.0.1:0".parse().unwrap(),
        db: dir.path().join("server.db"),
        tls: None,
    })
    .await
    .unwrap();
    let (ws, push) = (srv.ws_addr(), srv.push_addr());
    let cx = AsyncContext::new();
    let bob = Client::start(&cx, config("bob", &["general", "random"], ws, push, dir.path())).await.unwrap();

    let alice = Client::start(&cx, config("alice", &["general", "random"], ws, push, dir.path())).await.unwrap();
    bob.send(1, "r1").await.unwrap();
    until("alice has r1", || texts(&alice, 1) == ["r1"]).await;
    alice.shutdown().await;

    // Alice, in general only, while bob writes in both.
    let alice = Client::start(&cx, config("alice", &["general"], ws, push, dir.path())).await.unwrap();
    bob.send(1, "r2").await.unwrap();
    bob.send(0, "g1").await.unwrap();
    until("alice has g1", || texts(&alice, 0) == ["g1"]).await;
    alice.shutdown().await;

    // Back in both: r2 is the server's, after r1 (the last she has of random).
    let alice = Client::start(&cx, config("alice", &["general", "random"], ws, push, dir.path())).await.unwrap();
    bob.send(0, "g2").await.unwrap();
    until("alice has g2 (the catch-up is done: the channel is in order)", || texts(&alice, 0) == ["g1", "g2"]).await;
    assert_eq!(texts(&alice, 1), ["r1", "r2"], "random lost the line posted while alice was away from it");
}

/// At most `MAX_SUBSCRIBERS` subscribe at once: the next connection is
/// closed without an answer, and the subscribers already there are still
/// served (a line stored reaches the first and the last of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_beyond_the_bound_are_closed_and_those_within_are_served() {
    use egress_chat::push::MAX_SUBSCRIBERS;
    use tokio::io::AsyncReadExt as _;
    let dir = TempDir::new();
    let config = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        push: "127.0.0.1:0".parse().unwrap(),
        db: dir.path().join("server.db"),
        tls: None,
    };
    let srv = Server::start(config).await.unwrap();
    let mut held = Vec::with_capacity(MAX_SUBSCRIBERS);
    for _ in 0..MAX_SUBSCRIBERS {
        let mut stream = tokio::net::TcpStream::connect(srv.push_addr()).await.unwrap();
        stream.write_all(b"{\"since\": 0, \"rooms\": []}\n").await.unwrap();
        held.push(BufReader::new(stream));
    }
    let mut extra = tokio::net::TcpStream::connect(srv.push_addr()).await.unwrap();
    let _ = extra.write_all(b"{\"since\": 0, \"rooms\": []}\n").await;
    let mut rest = Vec::new();
    let read = tokio::time::timeout(egress_testkit::limit(), extra.read_to_end(&mut rest)).await.unwrap();
    assert!(read.is_err() || rest.is_empty(), "one beyond the bound is closed without an answer: {rest:?}");
    let cx = AsyncContext::new();
    let alice = Client::start(&cx, config_for(&srv, dir.path())).await.unwrap();
    alice.send(0, "to every subscriber").await.unwrap();
    for at in [0, MAX_SUBSCRIBERS - 1] {
        let mut line = String::new();
        tokio::time::timeout(egress_testkit::limit(), held[at].read_line(&mut line)).await.unwrap().unwrap();
        let posted: Posted = serde_json::from_str(&line).unwrap();
        assert_eq!(posted.line.text, "to every subscriber", "subscriber {at} served");
    }
}

fn config_for(srv: &Server, dir: &Path) -> ClientConfig {
    config("alice", &["general"], srv.ws_addr(), srv.push_addr(), dir)
}
