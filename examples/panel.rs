//! A settings and chat panel: why the composition primitives exist.
//!
//! - **A slider** (the volume) moves 200 times in a burst. Its writes go
//!   through a latest cell (`AsyncLatestCell`): one value in flight per
//!   key, and only the newest desire waits behind it, so the server sees a
//!   handful of writes, the last one the newest, not 200.
//! - **Chat lines** go through a relay with `Block` backpressure
//!   (`ThreadSafeRelayCell`, at most 4 entries waiting, not full again
//!   until 1): the producer sends each with `send_when_room`, which waits
//!   while the relay is full, and the relay's drain feeds the chat stream's
//!   egress cell one record at a time, so nothing is dropped and nothing
//!   piles up unbounded.
//! - Both streams go over the WebSocket sender to the reference receiver,
//!   and the screen (redrawn by an effect) shows the counters.
//!
//! The one piece of glue the app writes: the latest cell's sink enqueues
//! each value into the settings stream's egress cell and reports it
//! applied once that stream's cell has it acknowledged.
//!
//! `cargo run --example panel` (feature `ws`; `cargo test` runs it too).

use std::collections::VecDeque;
use std::error::Error;
use std::sync::{Arc, Mutex};

use egress::core::{Backpressure, Overflow, RawFifo, Version, Water};
use egress::prelude::*;
use egress::reactive::{AsyncLatestCell, LatestItem, LatestSink, SendError, ThreadSafeRelayCell, Written};
use egress::ws::{Content, Receiver, ReceiverConfig, Sender, SenderConfig, json};
use tokio_stream::StreamExt as _;

/// A setting's write, as the settings stream carries it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Setting {
    key: String,
    version: u64,
    value: u32,
}

/// A chat line.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Line {
    from: String,
    text: String,
}

/// What the server's application saw.
#[derive(Debug, Default)]
struct Seen {
    /// Every setting write, in order.
    settings: Vec<(String, u32)>,
    /// Every chat line, in order.
    lines: Vec<String>,
}

/// The settings' sink: each value the latest cell writes goes into the
/// settings stream (an egress cell: sequenced, retried, acknowledged), and
/// stays in flight until that stream's cell has it acknowledged.
struct ToStream {
    cell: AsyncEgressCell<Setting>,
    /// Written, not yet acknowledged: the sequence, the key and version.
    sent: Arc<Mutex<VecDeque<(Sequence, String, Version)>>>,
}

impl LatestSink<String, u32> for ToStream {
    fn write(&mut self, item: LatestItem<String, u32>) -> Result<Written, SendError> {
        let setting = Setting { key: item.key.clone(), version: item.version.0, value: item.value };
        let sequence = self.cell.enqueue(setting);
        self.sent.lock().expect("sent").push_back((sequence, item.key, item.version));
        Ok(Written::Taken)
    }
}

const MOVES: u64 = 200;
const LINES: usize = 30;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn Error>> {
    let (screen, seen) = panel().await?;
    println!("{}", screen.join("\n"));
    println!(
        "the server saw {} volume writes (of {MOVES} moves) and {} chat lines",
        volume(&seen).len(),
        seen.lines.len()
    );
    Ok(())
}

/// The volume writes the server saw.
fn volume(seen: &Seen) -> Vec<u32> {
    seen.settings.iter().filter(|(k, _)| k == "volume").map(|(_, v)| *v).collect()
}

/// Runs the panel: the screen's last frame, and what the server saw.
async fn panel() -> Result<(Vec<String>, Seen), Box<dyn Error>> {
    // The server: the reference receiver, and an application that keeps
    // what it is given, by producer.
    let mut server = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await?;
    let url = format!("ws://127.0.0.1:{}/panel", server.local_addr().port());
    let seen = Arc::new(Mutex::new(Seen::default()));
    let app = tokio::spawn({
        let seen = seen.clone();
        async move {
            loop {
                let delivery = server.recv().await;
                if let Content::Message(bytes) = &delivery.content {
                    let mut seen = seen.lock().expect("seen");
                    if &*delivery.producer == "settings" {
                        if let Ok(s) = json::from_payload::<Setting>(bytes) {
                            seen.settings.push((s.key, s.value));
                        }
                    } else if let Ok(lines) = json::from_payload::<Vec<Line>>(bytes) {
                        seen.lines.extend(lines.into_iter().map(|l| l.text));
                    }
                }
                delivery.commit();
            }
        }
    });

    let cx = AsyncContext::new();
    // Two streams, each its own egress cell and sender.
    let settings = AsyncEgressCell::<Setting>::new(&cx, Policy::default());
    let chat = AsyncEgressCell::<Vec<Line>>::new(&cx, Policy::default());
    let settings_sender = Sender::spawn_typed(settings.clone(), Json, url.clone(), SenderConfig::new("settings"))?;
    let chat_sender = Sender::spawn_typed(chat.clone(), Json, url, SenderConfig::new("chat"))?;

    // The settings: a latest cell whose sink is the settings stream, and
    // the glue that reports a write applied once the stream's cell has it
    // acknowledged.
    let latest = AsyncLatestCell::<String, u32>::new(&cx, Policy::default(), 16.try_into()?);
    let sent = Arc::new(Mutex::new(VecDeque::new()));
    let sink = Arc::new(latest.attach(ToStream { cell: settings.clone(), sent: sent.clone() }));
    let _applied = cx.effect({
        let (settings, sent, sink) = (settings.clone(), sent.clone(), sink.clone());
        move || {
            let acked = settings.acked_through().get();
            let mut sent = sent.lock().expect("sent");
            while let Some((sequence, key, version)) = sent.front().cloned() {
                if acked.is_none_or(|acked| sequence > acked) {
                    break;
                }
                sent.pop_front();
                let _ = sink.applied(&key, version);
            }
        }
    });

    // The chat: a relay that blocks at 4 waiting entries (not full again
    // until 1), drained into the chat stream's cell one record at a time.
    let relay = ThreadSafeRelayCell::new(&cx, RawFifo, Backpressure::count(Water::new(4, 1), Overflow::Block))?;
    let _drain = relay.drain_into(&chat, 1.try_into()?)?;

    // The screen, redrawn by an effect whenever what it shows changed.
    let screen = Arc::new(Mutex::new(Vec::new()));
    let volume_key = latest.key(&"volume".to_owned());
    let _redraw = cx.effect({
        let (screen, latest, relay, chat) = (screen.clone(), latest.clone(), relay.clone(), chat.clone());
        let (settings_state, chat_state) = (settings_sender.state().clone(), chat_sender.state().clone());
        move || {
            let desired = volume_key.desired().get().map(|(v, value)| format!("{value} (v{})", v.0));
            let durable = volume_key.durable_through().get().map(|v| v.0);
            *screen.lock().expect("screen") = vec![
                format!("settings [{}]  chat [{}]", settings_state.get(), chat_state.get()),
                format!(
                    "volume: waiting {}, in flight {}, applied through v{}, settled {}",
                    desired.unwrap_or_else(|| "-".into()),
                    latest.inflight_len().get(),
                    durable.map_or_else(|| "-".into(), |v| v.to_string()),
                    latest.is_settled().get(),
                ),
                format!(
                    "chat relay: {} waiting, full {}, accepted {}, blocked {}, drained {}; chat stream acknowledged through {}",
                    relay.depth().get(),
                    relay.is_full().get(),
                    relay.accepted().get(),
                    relay.blocked().get(),
                    relay.drained().get(),
                    chat.acked_through().get().map_or_else(|| "-".into(), |s| s.0.to_string()),
                ),
            ];
        }
    });

    // The slider: 200 moves in a burst. Each is an upsert; the sink has
    // one value in flight, and only the newest desire waits behind it.
    for step in 0..MOVES {
        let _ = latest.upsert("volume".to_owned(), Version(step + 1), u32::try_from(step)?);
    }
    let _ = latest.upsert("presence".to_owned(), Version(1), 1);
    // The chat: each line waits for room in the relay.
    for i in 0..LINES {
        let line = Line { from: "alice".into(), text: format!("line {i}") };
        relay.send_when_room(vec![line]).await.map_err(|e| format!("{e}"))?;
    }

    // Done once every setting is applied and every line acknowledged.
    let mut settled = cx.watch(latest.is_settled());
    while settled.next().await.is_some_and(|settled| !settled) {}
    let mut acked = cx.watch(chat.acked_through());
    let last = Sequence(LINES as u64 - 1);
    while acked.next().await.is_some_and(|a| a != Some(last)) {}
    // A write waits for a flush under way on another thread: once it is
    // done, the redraw of what the waits saw has run.
    cx.signal(0u8).set(1);

    let frame = screen.lock().expect("screen").clone();
    settings_sender.shutdown().await;
    chat_sender.shutdown().await;
    app.abort();
    let seen = std::mem::take(&mut *seen.lock().expect("seen"));
    Ok((frame, seen))
}

#[cfg(test)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_sees_the_newest_setting_and_every_line_in_order() {
    let (screen, seen) = panel().await.expect("the panel runs");
    let volume = volume(&seen);
    // The newest value last, and far fewer writes than moves.
    assert_eq!(volume.last(), Some(&(MOVES as u32 - 1)), "{volume:?}");
    assert!(volume.len() < MOVES as usize / 2, "coalesced: {} writes", volume.len());
    assert!(volume.windows(2).all(|w| w[0] < w[1]), "never an older value after a newer: {volume:?}");
    let presence: std::collections::BTreeMap<_, _> =
        seen.settings.iter().filter(|(k, _)| k == "presence").cloned().collect();
    assert_eq!(presence.get("presence"), Some(&1));
    // Every line, once, in order.
    let expected: Vec<String> = (0..LINES).map(|i| format!("line {i}")).collect();
    assert_eq!(seen.lines, expected);
    assert!(screen[1].contains("settled true"), "{screen:?}");
    assert!(screen[2].contains(&format!("accepted {LINES}")) && screen[2].contains("0 waiting"), "{screen:?}");
}
