//! Hostile producers: raw egress-ws peers (a hostile review's probes). One
//! starts its stream at a sequence the receiver accepts (`resume_from` up
//! to `u64::MAX - 1`) but the server's SQLite columns cannot hold (`i64`);
//! one posts as another client, and into another room. The server skips
//! each (committed, not stored) and goes on storing the others' lines.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use egress_chat::client::{Client, ClientConfig};
use egress_chat::server::{Server, ServerConfig};
use egress_reactive::AsyncContext;
use egress_testkit::TempDir;
use egress_ws::protocol::Frame;
use futures_util::{SinkExt as _, StreamExt as _};
use tokio_tungstenite::tungstenite::Message;

async fn server(dir: &TempDir) -> Server {
    let config = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        push: "127.0.0.1:0".parse().unwrap(),
        db: dir.path().join("server.db"),
        tls: None,
    };
    Server::start(config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_a_sequence_above_i64_max_does_not_stop_the_server() {
    let dir = TempDir::new();
    let srv = server(&dir).await;
    let (ws, push) = (srv.ws_addr(), srv.push_addr());
    let running = tokio::spawn(srv.run());

    // The hostile peer: a new stream, resumed at 2^63, one data frame (any
    // payload: not a line at all here).
    let (mut raw, _) = tokio_tungstenite::connect_async(format!("ws://{ws}/")).await.unwrap();
    let start = 1u64 << 63;
    let handshake =
        Frame::Handshake { producer: "mallory@general".into(), incarnation: 7, generation: 1, resume_from: start };
    raw.send(Message::Binary(handshake.encode())).await.unwrap();
    let welcome = tokio::time::timeout(egress_testkit::limit(), raw.next()).await.unwrap().unwrap().unwrap();
    assert!(matches!(welcome, Message::Binary(_)), "welcomed: {welcome:?}");
    let data = Frame::Data { generation: 1, sequence: start, attempt: 1, payload: bytes::Bytes::from_static(b"x") };
    raw.send(Message::Binary(data.encode())).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;

    assert!(!running.is_finished(), "the server stopped on a peer's sequence: {:?}", running.await);

    // And an honest client's line is still stored and pushed.
    let cx = AsyncContext::new();
    let alice = Client::start(
        &cx,
        ClientConfig {
            name: "alice".into(),
            rooms: vec!["general".into()],
            server: ws,
            push,
            db: dir.path().join("alice.db"),
            tls_ca: None,
        },
    )
    .await
    .unwrap();
    alice.send(0, "after mallory").await.unwrap();
    egress_testkit::until(
        || alice.rooms()[0].history.with_untracked(|h| h.iter().any(|p| p.line.text == "after mallory")).then_some(()),
        || "alice's line stored and pushed back".to_owned(),
    )
    .await;
}

/// A line stored only as its producer's: a stream named `mallory@general`
/// cannot post as alice, nor into another room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_is_stored_only_as_its_producers() {
    use egress_chat::message::Line;
    let dir = TempDir::new();
    let srv = server(&dir).await;
    let (mut raw, _) = tokio_tungstenite::connect_async(format!("ws://{}/", srv.ws_addr())).await.unwrap();
    let handshake =
        Frame::Handshake { producer: "mallory@general".into(), incarnation: 9, generation: 1, resume_from: 0 };
    raw.send(Message::Binary(handshake.encode())).await.unwrap();
    let _welcome = tokio::time::timeout(egress_testkit::limit(), raw.next()).await.unwrap().unwrap().unwrap();
    let lines = [
        Line { id: "1".repeat(32), room: "general".into(), from: "alice".into(), text: "as alice".into() },
        Line { id: "2".repeat(32), room: "random".into(), from: "mallory".into(), text: "elsewhere".into() },
        Line { id: "3".repeat(32), room: "general".into(), from: "mallory".into(), text: "as myself".into() },
    ];
    for (seq, line) in lines.iter().enumerate() {
        let payload = bytes::Bytes::from(serde_json::to_vec(line).unwrap());
        let data = Frame::Data { generation: 1, sequence: seq as u64, attempt: 1, payload };
        raw.send(Message::Binary(data.encode())).await.unwrap();
    }
    let db = dir.path().join("server.db");
    let stored = || {
        let conn = rusqlite::Connection::open(&db).unwrap();
        let mut select = conn.prepare("SELECT text FROM chat_message ORDER BY id").unwrap();
        select.query_map([], |r| r.get::<_, String>(0)).unwrap().collect::<Result<Vec<_>, _>>().unwrap()
    };
    egress_testkit::until(|| (!stored().is_empty()).then_some(()), || "mallory's own line stored".to_owned()).await;
    assert_eq!(stored(), ["as myself"]);
}
