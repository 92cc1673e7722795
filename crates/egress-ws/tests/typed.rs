//! A cell of typed messages over the wire as JSON: the readers show the
//! typed values, the receiver gets their bytes, and a value with no JSON
//! form is a dead letter (skipped) rather than a wedge.
#![cfg(feature = "json")]
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use common::{limit, policy, sender_config};
use egress_core::{DeadReason, Sequence};
use egress_reactive::{AsyncContext, AsyncEgressCell};
use egress_ws::{Content, Json, Receiver, ReceiverConfig, Sender};

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Chat {
    to: String,
    text: String,
    /// JSON has no form for a map with non-string keys.
    tags: BTreeMap<Vec<u8>, u8>,
}

/// The next `n` deliveries: each chat's text, or why it was skipped.
async fn received(receiver: &mut Receiver, n: usize) -> Vec<Result<String, DeadReason>> {
    let mut got = Vec::new();
    for _ in 0..n {
        let d = tokio::time::timeout(limit(), receiver.recv()).await.unwrap();
        got.push(match &d.content {
            Content::Message(bytes) => Ok(egress_ws::json::from_payload::<Chat>(bytes).unwrap().text),
            Content::Skipped(reason) => Err(*reason),
        });
    }
    got
}

fn chat(text: &str) -> Chat {
    Chat { to: "ann".into(), text: text.into(), tags: BTreeMap::new() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_messages_go_out_as_json_and_one_without_a_json_form_is_skipped() {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<Chat> = AsyncEgressCell::new(&cx, policy());
    // Queued before the sender connects: the reader shows typed values.
    cell.enqueue(chat("hi"));
    let mut bad = chat("never");
    bad.tags.insert(vec![1], 1);
    cell.enqueue(bad);
    cell.enqueue(chat("bye"));
    let texts: Vec<String> = cell.pending().get().iter().map(|e| e.payload.text.clone()).collect();
    assert_eq!(texts, ["hi", "never", "bye"]);

    let sender =
        Sender::spawn_typed(cell.clone(), Json, format!("ws://{}", receiver.local_addr()), sender_config(71)).unwrap();
    let got = received(&mut receiver, 3).await;
    assert_eq!(got, [Ok("hi".to_owned()), Err(DeadReason::Permanent), Ok("bye".to_owned())]);
    let settled = tokio::time::timeout(limit(), cell.delivered(Sequence(2))).await.unwrap();
    assert_eq!(settled, Ok(()), "acknowledged: nothing wedged behind the skipped one");
    assert_eq!(
        cell.delivered(Sequence(1)).await,
        Err(egress_reactive::Undelivered::Dead(DeadReason::Permanent)),
        "the skipped one's tombstone was acknowledged, and it reads dead, not delivered"
    );
    sender.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_message_is_measured_by_its_encoding_and_refused_at_once_when_too_large() {
    let receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<Chat> = AsyncEgressCell::new(&cx, policy());
    let config = egress_ws::SenderConfig { max_payload: 64, ..sender_config(72) };
    let sender = Sender::spawn_typed(cell.clone(), Json, format!("ws://{}", receiver.local_addr()), config).unwrap();
    let long = chat(&"x".repeat(100));
    let size = egress_ws::json::to_payload(&long).unwrap().len();
    match cell.try_enqueue(long.clone()) {
        Err(egress_reactive::Refused::TooLarge { payload, size: s, limit: 64 }) => {
            assert_eq!((payload, s), (long, size), "its JSON's size, and the payload back");
        }
        other => panic!("{other:?}"),
    }
    let short = chat("hi");
    assert!(egress_ws::json::to_payload(&short).unwrap().len() <= 64);
    assert_eq!(cell.try_enqueue(short), Ok(Sequence(0)));
    // A value with no JSON form has no size: not refused for its size (it
    // becomes a dead letter when sent, as before).
    let mut bad = chat("never");
    bad.tags.insert(vec![1], 1);
    assert_eq!(cell.too_large(&bad), None);
    sender.shutdown().await;
}

/// JSON, except that it panics on a chat whose text is "boom" (in `size`
/// too), as an application's codec with a bug would.
struct Panicky;

impl egress_ws::Encode<Chat> for Panicky {
    fn encode(&self, value: &Chat) -> Result<bytes::Bytes, egress_ws::CodecError> {
        assert_ne!(value.text, "boom", "the codec's bug");
        egress_ws::Encode::encode(&Json, value)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codec_that_panics_on_a_message_makes_it_a_dead_letter_and_the_stream_goes_on() {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let cx = AsyncContext::new();
    let cell: AsyncEgressCell<Chat> = AsyncEgressCell::new(&cx, policy());
    let sender =
        Sender::spawn_typed(cell.clone(), Panicky, format!("ws://{}", receiver.local_addr()), sender_config(73))
            .unwrap();
    // The size check at enqueue runs the codec too: its panic is no size,
    // so the enqueue is taken (and the send fails it).
    for text in ["hi", "boom", "bye"] {
        assert!(cell.try_enqueue(chat(text)).is_ok());
    }
    let got = received(&mut receiver, 3).await;
    assert_eq!(got, [Ok("hi".to_owned()), Err(DeadReason::Permanent), Ok("bye".to_owned())]);
    assert_eq!(tokio::time::timeout(limit(), cell.delivered(Sequence(2))).await.unwrap(), Ok(()));
    assert!(sender.failure().is_none(), "the sender goes on: {:?}", sender.failure());
    sender.shutdown().await;
}
