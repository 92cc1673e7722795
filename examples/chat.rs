//! A chat room's sending side, as a chat UI builds it on egress: typed
//! messages in a durable outbox (SQLite: a restart sends what is not yet
//! acknowledged), sent over `wss://` with a bearer token to a server that
//! terminates TLS and checks the token (the reference receiver), and each
//! message's delivery state on screen, redrawn by an effect. A message too
//! large for the server shows as failed, never as delivered.
//!
//! `cargo run --example chat` (features `ws` and `store`; `cargo test`
//! runs it too).

use std::error::Error;
use std::path::Path;
use std::sync::{Arc, Mutex};

use egress::prelude::*;
use egress::store::{RelayConfig, open_durable_with};
use egress::ws::{Authorize, Content, Receiver, ReceiverConfig, Sender, SenderConfig, json, tls};

/// What the room sends: the application's own type, JSON on the wire and
/// in the store.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Line {
    from: String,
    text: String,
}

const TOKEN: &str = "let-me-in";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn Error>> {
    let dir = std::env::temp_dir().join(format!("egress-chat-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = chat(&dir.join("chat.db")).await;
    let _ = std::fs::remove_dir_all(&dir);
    let (screen, received) = result?;
    println!("{}\nthe server received: {received:?}", screen.join("\n"));
    Ok(())
}

/// Runs the room: returns the screen's last frame and what the server's
/// application received.
async fn chat(db: &Path) -> Result<(Vec<String>, Vec<String>), Box<dyn Error>> {
    // The server: TLS with a certificate made here, the token checked at
    // the upgrade, messages up to 1 KiB.
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
    let (cert, key) = (made.cert.pem(), made.key_pair.serialize_pem());
    let tls = Some(tls::server_config_from_pem(cert.as_bytes(), key.as_bytes())?);
    let mut config = ReceiverConfig { tls, authorize: Some(Authorize::bearer(TOKEN)), ..ReceiverConfig::default() };
    config.limits.max_payload = 1024;
    let mut server = Receiver::bind("127.0.0.1:0", config).await?;
    let url = format!("wss://localhost:{}/rooms/tea", server.local_addr().port());
    // The server's application: takes three deliveries and goes on serving
    // (acknowledging) until the room is done.
    let received = tokio::spawn(async move {
        let mut texts = Vec::new();
        for _ in 0..3 {
            let delivery = server.recv().await;
            match &delivery.content {
                Content::Message(bytes) => {
                    texts.push(json::from_payload::<Line>(bytes).map(|l| l.text).unwrap_or_default())
                }
                Content::Skipped(reason) => texts.push(format!("(skipped: {reason})")),
            }
            delivery.commit();
        }
        (texts, server)
    });

    // The client: a durable, typed room; its sender, trusting the server's
    // certificate, showing the token, and sending at most 1 KiB (the
    // room's rule: larger fails at once rather than wait for a server that
    // takes more).
    let cx = AsyncContext::new();
    let config = RelayConfig::default();
    let room = open_durable_with(&cx, db, "room:tea", Json, Policy::default(), CellOptions::new(), config).await?;
    let trust = tls::client_config_from_pem(cert.as_bytes())?;
    let config = SenderConfig { tls: Some(trust), max_payload: 1024, ..SenderConfig::new("alice") }.bearer(TOKEN);
    let sender = Sender::spawn_typed(room.cell.clone(), Json, url, config)?;

    // The screen: the messages sent, each with its status, and the
    // connection; an effect redraws it whenever something it shows changed.
    let sent = cx.signal(Vec::<(Sequence, Line)>::new());
    let screen = Arc::new(Mutex::new(Vec::new()));
    let _redraw = cx.effect({
        let (cell, sent, screen, state) = (room.cell.clone(), sent.clone(), screen.clone(), sender.state().clone());
        move || {
            let mut frame = vec![format!("[{}]", state.get())];
            for (seq, line) in sent.get() {
                let status = cell.status(seq).get().map_or("?".into(), |s| s.to_string());
                let text: String = line.text.chars().take(24).collect();
                frame.push(format!("{}: {text:<24} {status}", line.from));
            }
            *screen.lock().expect("screen") = frame;
        }
    });
    let say = |text: String| {
        let line = Line { from: "alice".into(), text };
        let seq = room.cell.enqueue(line.clone());
        sent.update(|s| s.push((seq, line)));
        seq
    };
    let hello = say("hello, tea room".into());
    let big = say("x".repeat(4096)); // above the server's limit
    let bye = say("see you".into());
    for seq in [hello, bye] {
        room.cell.delivered(seq).await?;
    }
    let failed = room.cell.delivered(big).await;
    assert_eq!(failed, Err(Undelivered::Dead(DeadReason::Permanent)), "too large: failed, not delivered");
    // Now that the sender knows the server's limit, a message that large
    // is refused at once, nothing queued.
    let refused = room.cell.try_enqueue(Line { from: "alice".into(), text: "y".repeat(4096) });
    assert!(matches!(refused, Err(Refused::TooLarge { .. })));

    let (received, server) = received.await?;
    sender.shutdown().await;
    drop(server);
    room.relay.shutdown().await;
    let frame = screen.lock().expect("screen").clone();
    Ok((frame, received))
}

#[cfg(test)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_room_shows_delivered_and_failed_and_the_server_got_each_once_in_order() {
    let dir = std::env::temp_dir().join(format!("egress-chat-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let (screen, received) = chat(&dir.join("chat.db")).await.expect("the room runs");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(received, ["hello, tea room", "(skipped: refused permanently)", "see you"]);
    assert_eq!(screen.len(), 4, "{screen:?}");
    assert!(screen[1].ends_with(" delivered") && screen[3].ends_with(" delivered"), "{screen:?}");
    assert!(screen[2].ends_with(" failed: refused permanently"), "{screen:?}");
}
