//! The chat without its screen: a server and clients on 127.0.0.1, through
//! the library the binary is built on. Lines reach the other client once,
//! in the server's order; a line typed offline waits queued; a client gone
//! without a shutdown (its tasks dropped, as a SIGKILL leaves its store)
//! sends it when started again; and the push channel refuses what is not
//! a subscription. (`tests/tmux.sh` drives the real binary in a terminal.)
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use egress_chat::client::{Client, ClientConfig};
use egress_chat::message::Posted;
use egress_chat::server::{Server, ServerConfig};
use egress_core::MessageStatus;
use egress_reactive::AsyncContext;
use egress_testkit::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn server(dir: &TempDir) -> Server {
    let config = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        push: "127.0.0.1:0".parse().unwrap(),
        db: dir.path().join("server.db"),
        tls: None,
    };
    Server::start(config).await.unwrap()
}

async fn client(cx: &AsyncContext, server: &Server, dir: &Path, name: &str) -> Client {
    let config = ClientConfig {
        name: name.into(),
        rooms: vec!["general".into(), "random".into()],
        server: server.ws_addr(),
        push: server.push_addr(),
        db: dir.join(format!("{name}.db")),
        tls_ca: None,
    };
    Client::start(cx, config).await.unwrap()
}

fn texts(client: &Client, room: usize) -> Vec<String> {
    client.rooms()[room].history.with_untracked(|h: &Vec<Posted>| h.iter().map(|p| p.line.text.clone()).collect())
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    egress_testkit::until(|| f().then_some(()), || what.to_owned()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_reach_the_other_client_once_and_a_line_typed_offline_survives_a_crash() {
    let dir = TempDir::new();
    let srv = server(&dir).await;
    let cx = AsyncContext::new();
    let bob = client(&cx, &srv, dir.path(), "bob").await;
    {
        let alice = client(&cx, &srv, dir.path(), "alice").await;
        let seq = alice.send(0, "hello").await.unwrap();
        until("bob sees hello", || texts(&bob, 0) == ["hello"]).await;
        let room = &alice.rooms()[0];
        until("alice's line delivered and pushed back", || room.mine.with_untracked(Vec::is_empty)).await;
        assert_eq!(room.history.with_untracked(|h| h.len()), 1);
        // The server's push can come before its acknowledgement: the line
        // is stored either way, and the acknowledgement follows.
        let status = room.cell().status(seq);
        until("acknowledged", || status.get_untracked() == Some(MessageStatus::Acknowledged)).await;
        // Offline: the line waits, queued, and bob does not get it.
        alice.set_online(false).await;
        alice.send(0, "typed offline").await.unwrap();
        until("queued", || {
            room.mine.with_untracked(|m| m.len() == 1 && m[0].status.get_untracked() == Some(MessageStatus::Queued))
        })
        .await;
        assert_eq!(room.unsent_untracked(), 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(texts(&bob, 0), ["hello"], "nothing sent while offline");
        // Gone without a shutdown.
        drop(alice);
    }
    let alice = client(&cx, &srv, dir.path(), "alice").await;
    assert_eq!(texts(&alice, 0), ["hello"], "the history from alice's store at once");
    assert_eq!(alice.rooms()[0].mine.with_untracked(Vec::len), 1, "the line typed offline, from her store");
    until("bob sees the line typed offline", || texts(&bob, 0) == ["hello", "typed offline"]).await;
    until("alice's unsent count back to 0", || alice.rooms()[0].unsent_untracked() == 0).await;
    // Bob's line in another room counts as unread for alice until shown.
    bob.send(1, "in random").await.unwrap();
    until("alice has it", || texts(&alice, 1) == ["in random"]).await;
    assert_eq!(alice.rooms()[1].unread.get_untracked(), 1);
    alice.show(1);
    assert_eq!(alice.rooms()[1].unread.get_untracked(), 0);
    // The server stored each line once.
    let db = rusqlite::Connection::open(dir.path().join("server.db")).unwrap();
    let (rows, distinct): (i64, i64) = db
        .query_row("SELECT COUNT(*), COUNT(DISTINCT msg_id) FROM chat_message", [], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    assert_eq!((rows, distinct), (3, 3));
}

/// One client per database: a second is refused (it would take the
/// rooms' streams over and fence the first); once the first is gone, the
/// database opens again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_client_on_the_same_database_is_refused() {
    let dir = TempDir::new();
    let srv = server(&dir).await;
    let cx = AsyncContext::new();
    let first = client(&cx, &srv, dir.path(), "alice").await;
    let config = ClientConfig {
        name: "alice".into(),
        rooms: vec!["general".into()],
        server: srv.ws_addr(),
        push: srv.push_addr(),
        db: dir.path().join("alice.db"),
        tls_ca: None,
    };
    let refused = Client::start(&cx, config.clone()).await.err().unwrap();
    assert!(format!("{refused:#}").contains("another egress-chat client uses"), "{refused:#}");
    first.send(0, "still mine").await.unwrap();
    until("delivered", || first.rooms()[0].unsent_untracked() == 0).await;
    drop(first);
    let again = Client::start(&cx, config).await.unwrap();
    assert_eq!(texts(&again, 0), ["still mine"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_too_long_for_the_server_is_refused_before_it_is_stored() {
    let dir = TempDir::new();
    let srv = server(&dir).await;
    let cx = AsyncContext::new();
    let alice = client(&cx, &srv, dir.path(), "alice").await;
    let refused = alice.send(0, &"x".repeat(egress_chat::server::MAX_LINE)).await.unwrap_err();
    assert!(format!("{refused:#}").contains("payload"), "{refused:#}");
    assert!(alice.rooms()[0].mine.with_untracked(Vec::is_empty));
    alice.send(0, "short").await.unwrap();
    until("delivered", || alice.rooms()[0].unsent_untracked() == 0 && texts(&alice, 0) == ["short"]).await;
}

/// What is not a subscription is answered by closing the connection; the
/// channel goes on serving a subscriber after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_push_channel_closes_on_what_is_not_a_subscription() {
    let dir = TempDir::new();
    let srv = server(&dir).await;
    for request in [b"not json\n".to_vec(), vec![b'{'; 5000], b"{\"since\": -1}\n".to_vec()] {
        let mut stream = tokio::net::TcpStream::connect(srv.push_addr()).await.unwrap();
        stream.write_all(&request).await.unwrap();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(egress_testkit::limit(), stream.read_to_end(&mut rest)).await.unwrap();
        assert!(read.is_err() || rest.is_empty(), "closed without an answer: {rest:?}");
    }
    let cx = AsyncContext::new();
    let alice = client(&cx, &srv, dir.path(), "alice").await;
    alice.send(0, "still serving").await.unwrap();
    until("pushed", || texts(&alice, 0) == ["still serving"]).await;
}

/// A pushed line longer than the limit is an error, not memory.
#[tokio::test]
async fn a_line_longer_than_its_limit_is_refused() {
    let mut long = tokio::io::BufReader::new(&b"0123456789\nok\n"[..]);
    assert!(egress_chat::push::read_line(&mut long, 4).await.is_err());
    let mut fine = tokio::io::BufReader::new(&b"0123\nok\n"[..]);
    assert_eq!(egress_chat::push::read_line(&mut fine, 4).await.unwrap(), Some(b"0123".to_vec()));
    assert_eq!(egress_chat::push::read_line(&mut fine, 4).await.unwrap(), Some(b"ok".to_vec()));
    assert_eq!(egress_chat::push::read_line(&mut fine, 4).await.unwrap(), None);
    let mut cut = tokio::io::BufReader::new(&b"abc"[..]);
    assert!(egress_chat::push::read_line(&mut cut, 4).await.is_err(), "a stream ended inside a line");
}

/// With a certificate, both the egress endpoint (`wss://`) and the push
/// channel are TLS; a client that trusts it talks, and a plain TCP client
/// of the push channel gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_certificate_both_endpoints_are_tls() {
    let dir = TempDir::new();
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.key_pair.serialize_pem()).unwrap();
    let config = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        push: "127.0.0.1:0".parse().unwrap(),
        db: dir.path().join("server.db"),
        tls: Some((cert.clone(), key)),
    };
    let srv = Server::start(config).await.unwrap();
    let cx = AsyncContext::new();
    let start = |name: &str| {
        let config = ClientConfig {
            name: name.into(),
            rooms: vec!["general".into()],
            server: srv.ws_addr(),
            push: srv.push_addr(),
            db: dir.path().join(format!("{name}.db")),
            tls_ca: Some(cert.clone()),
        };
        Client::start(&cx, config)
    };
    let alice = start("alice").await.unwrap();
    let bob = start("bob").await.unwrap();
    alice.send(0, "over tls").await.unwrap();
    until("bob has it", || texts(&bob, 0) == ["over tls"]).await;
    until("alice's delivered", || alice.rooms()[0].unsent_untracked() == 0).await;
    // A plain subscription is not answered.
    let mut plain = tokio::net::TcpStream::connect(srv.push_addr()).await.unwrap();
    plain.write_all(b"{\"since\": 0}\n").await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(egress_testkit::limit(), plain.read_to_end(&mut got)).await.unwrap();
    assert!(!String::from_utf8_lossy(&got).contains("over tls"), "a plain client read a line: {got:?}");
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_client_on_the_same_database_by_a_symlink_is_refused() {
    let dir = TempDir::new();
    let cx = AsyncContext::new();
    let config = |db: std::path::PathBuf| ClientConfig {
        name: "alice".into(),
        rooms: vec!["general".into()],
        server: "127.0.0.1:9".parse().unwrap(),
        push: "127.0.0.1:9".parse().unwrap(),
        db,
        tls_ca: None,
    };
    let real = dir.path().join("alice.db");
    let _first = Client::start(&cx, config(real.clone())).await.unwrap();
    let link = dir.path().join("alias.db");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let second = Client::start(&cx, config(link)).await;
    assert!(second.is_err(), "a second client opened the same database through a symlink");
}

/// The server's refusals to store a batch ("a batch not stored" warnings
/// of its store loop), counted process-wide through a tracing layer.
static REFUSED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

struct CountRefusals;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountRefusals {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Refusal(bool);
        impl tracing::field::Visit for Refusal {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" && format!("{value:?}").starts_with("a batch not stored") {
                    self.0 = true;
                }
            }
        }
        let mut refusal = Refusal(false);
        event.record(&mut refusal);
        if refusal.0 {
            REFUSED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// A batch the server's database refuses (a trigger aborts the insert, as
/// a full disk or a failed commit would) is given back uncommitted: the
/// line is not acknowledged and not stored, the server goes on trying, and
/// once the database takes writes again the line is stored once and
/// acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_database_refuses_is_given_back_and_stored_once_later() {
    use tracing_subscriber::layer::SubscriberExt;
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(CountRefusals))
        .expect("the only subscriber of this test binary");
    let dir = TempDir::new();
    let srv = server(&dir).await;
    let cx = AsyncContext::new();
    let alice = client(&cx, &srv, dir.path(), "alice").await;
    let db = rusqlite::Connection::open(dir.path().join("server.db")).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    db.execute_batch(
        "CREATE TRIGGER refuse BEFORE INSERT ON chat_message BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
    )
    .unwrap();
    let seq = alice.send(0, "held back").await.unwrap();
    let status = alice.rooms()[0].cell().status(seq);
    until("refused, given back, tried again and refused again", || {
        REFUSED.load(std::sync::atomic::Ordering::SeqCst) >= 2
    })
    .await;
    assert_ne!(status.get_untracked(), Some(MessageStatus::Acknowledged), "not acknowledged while refused");
    let rows = |db: &rusqlite::Connection| -> (i64, i64) {
        db.query_row("SELECT COUNT(*), COUNT(DISTINCT msg_id) FROM chat_message", [], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
    };
    assert_eq!(rows(&db), (0, 0), "nothing stored while refused");
    db.execute_batch("DROP TRIGGER refuse;").unwrap();
    until("acknowledged once the database takes writes", || {
        status.get_untracked() == Some(MessageStatus::Acknowledged)
    })
    .await;
    assert_eq!(rows(&db), (1, 1), "stored once");
    until("pushed back", || texts(&alice, 0) == ["held back"]).await;
    assert_eq!(rows(&db), (1, 1), "stored once, after the push too");
}
