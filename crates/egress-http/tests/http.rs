//! The sender against the homeserver on 127.0.0.1: every response mapped
//! onto the core's failure kinds, the idempotency key on every attempt,
//! lanes' order and windows as the server sees them, the connection state,
//! and the rejections.
#![allow(clippy::unwrap_used)]

use std::num::NonZeroUsize;
use std::time::Duration;

use egress_core::{LaneKey, LaneKind, LanesPolicy};
use egress_http::homeserver::{Chaos, Homeserver};
use egress_http::{HttpConfig, HttpError, HttpRequest, HttpSender, Method};
use egress_reactive::{AsyncContext, AsyncLanesCell, CellOptions, ConnectionState};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Lane {
    Room(String),
    ToDevice,
    AccountData,
    Other,
}

impl LaneKey for Lane {
    fn kind(&self) -> LaneKind {
        match self {
            Lane::Room(_) | Lane::ToDevice => LaneKind::Serial,
            Lane::AccountData => LaneKind::Strict,
            Lane::Other => LaneKind::Unordered(NonZeroUsize::new(3).unwrap()),
        }
    }
}

fn request(lane: &Lane, n: u32) -> HttpRequest {
    let path = match lane {
        Lane::Room(room) => format!("rooms/{room}/send/m.text/t{n}"),
        Lane::ToDevice => format!("sendToDevice/m.key/t{n}"),
        Lane::AccountData => format!("user/account_data/m.setting/w{n}"),
        Lane::Other => format!("other/o{n}"),
    };
    HttpRequest::json(Method::PUT, path, &serde_json::json!({ "n": n })).unwrap()
}

fn cell(cx: &AsyncContext, budget: u32) -> AsyncLanesCell<Lane, HttpRequest> {
    let policy = LanesPolicy::new(HttpConfig::policy(budget), 64).unwrap();
    AsyncLanesCell::with_options(cx, policy, CellOptions::new().jitter_seed(11))
}

async fn settled(cell: &AsyncLanesCell<Lane, HttpRequest>) {
    egress_testkit::until(
        || {
            let busy = cell.pending_len().get() + cell.inflight_len().get() + cell.parked_len().get();
            (busy == 0).then_some(())
        },
        || format!("{cell:?}"),
    )
    .await;
}

/// Waits until the sender has counted `n` dead letters (and so listed
/// them): it does so just after the cell takes each, so a settled cell
/// alone does not say the list is complete.
async fn rejected(sender: &HttpSender<Lane>, n: u64) {
    egress_testkit::until(|| (sender.stats().rejected >= n).then_some(()), || format!("{:?}", sender.stats())).await;
}

/// Waits until the sender's connection reads offline, and returns that state.
async fn reconnecting(sender: &HttpSender<Lane>) -> ConnectionState<HttpError> {
    egress_testkit::until(
        || match sender.connection().get_untracked() {
            s @ ConnectionState::Reconnecting { .. } => Some(s),
            _ => None,
        },
        || format!("{:?}", sender.connection().get_untracked()),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_is_applied_once_in_its_lanes_order_within_its_lanes_window() {
    let server = Homeserver::start(Chaos::none()).await.unwrap();
    let cx = AsyncContext::new();
    let cell = cell(&cx, 10);
    let config = HttpConfig::new(&server.url()).unwrap().producer("phone").unwrap();
    let sender = HttpSender::start(&cell, config).unwrap();
    let lanes = [Lane::Room("a".into()), Lane::Room("b".into()), Lane::ToDevice, Lane::AccountData, Lane::Other];
    for n in 0..20 {
        for lane in &lanes {
            cell.enqueue(lane.clone(), request(lane, n)).unwrap();
        }
    }
    settled(&cell).await;
    let applied = server.applied();
    assert_eq!(applied.len(), 100);
    assert_eq!(server.duplicates(), 0);
    // Each lane's requests in its order (the unordered lane's may not be).
    for prefix in
        ["rooms/a/send/m.text/t", "rooms/b/send/m.text/t", "sendToDevice/m.key/t", "user/account_data/m.setting/w"]
    {
        let order: Vec<u32> =
            applied.iter().filter_map(|a| a.path.strip_prefix(prefix)).map(|n| n.parse().unwrap()).collect();
        assert_eq!(order, (0..20).collect::<Vec<_>>(), "{prefix}");
    }
    let most = server.most_in_flight();
    for serial in ["rooms/a/send/m.text", "rooms/b/send/m.text", "sendToDevice/m.key", "user/account_data/m.setting"] {
        assert_eq!(most[serial], 1, "{serial}: {most:?}");
    }
    assert!(most["other"] <= 3, "{most:?}");
    // Keys: producer, incarnation, ordinal; unique.
    let prefix = format!("phone:{:032x}:", cell.incarnation().0);
    assert!(applied.iter().all(|a| a.key.starts_with(&prefix)), "{:?}", applied[0].key);
    let keys: std::collections::BTreeSet<_> = applied.iter().map(|a| a.key.clone()).collect();
    assert_eq!(keys.len(), 100);
    assert_eq!(sender.connection().get_untracked().to_string(), "online");
    let stats = sender.shutdown().await;
    assert_eq!((stats.completed, stats.retried, stats.rejected), (100, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_chaos_each_record_is_applied_exactly_once_and_lanes_keep_their_order() {
    let chaos = Chaos {
        seed: 42,
        rate_limited: 0.1,
        retry_after_ms: 20,
        server_error: 0.1,
        drop_before: 0.05,
        drop_after: 0.05,
        slow: 0.05,
        slow_for: Duration::from_millis(400),
    };
    let server = Homeserver::start(chaos).await.unwrap();
    let cx = AsyncContext::new();
    // Short backoffs for the test: the schedule's shape is the policy's.
    let base = egress_core::Policy::builder()
        .retry_budget(50)
        .retry_base(egress_core::Delay(5))
        .retry_ceiling(egress_core::Delay(40))
        .jitter(1.0)
        .build()
        .unwrap();
    let cell =
        AsyncLanesCell::with_options(&cx, LanesPolicy::new(base, 64).unwrap(), CellOptions::new().jitter_seed(3));
    let config = HttpConfig::new(&server.url()).unwrap().timeout(Duration::from_millis(150));
    let sender = HttpSender::start(&cell, config).unwrap();
    let lanes = [Lane::Room("a".into()), Lane::ToDevice, Lane::AccountData, Lane::Other];
    for n in 0..40 {
        for lane in &lanes {
            cell.enqueue(lane.clone(), request(lane, n)).unwrap();
        }
    }
    settled(&cell).await;
    let applied = server.applied();
    assert_eq!(applied.len(), 160, "each applied once");
    assert!(server.duplicates() > 0, "answers were lost, and retries were recognized by their keys");
    for prefix in ["rooms/a/send/m.text/t", "sendToDevice/m.key/t", "user/account_data/m.setting/w"] {
        let order: Vec<u32> =
            applied.iter().filter_map(|a| a.path.strip_prefix(prefix)).map(|n| n.parse().unwrap()).collect();
        assert_eq!(order, (0..40).collect::<Vec<_>>(), "{prefix}");
    }
    let most = server.most_in_flight();
    assert_eq!((most["sendToDevice/m.key"], most["user/account_data/m.setting"]), (1, 1), "{most:?}");
    let stats = sender.shutdown().await;
    assert_eq!(stats.rejected, 0);
    assert!(stats.retried > 0 && stats.completed >= 160, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_is_a_dead_letter_with_the_status_and_the_body() {
    let server = Homeserver::start(Chaos::none()).await.unwrap();
    let cx = AsyncContext::new();
    // Two retries at most: a 503 for good runs out quickly.
    let cell = cell(&cx, 2);
    let sender = HttpSender::start(&cell, HttpConfig::new(&server.url()).unwrap().excerpt(12)).unwrap();
    let at = |path: &str| HttpRequest::new(Method::POST, path);
    cell.enqueue(Lane::Other, at("status/403/forbidden")).unwrap();
    cell.enqueue(Lane::Other, at("http://[::1")).unwrap();
    cell.enqueue(Lane::Other, at("status/503/down")).unwrap();
    cell.enqueue(Lane::ToDevice, request(&Lane::ToDevice, 1)).unwrap();
    settled(&cell).await;
    rejected(&sender, 3).await;
    let rejections = sender.rejections().get_untracked();
    let errors: Vec<_> = rejections.iter().map(|r| (r.ordinal.0, r.error.clone())).collect();
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(errors.contains(&(0, HttpError::Status { status: 403, body: r#"{"errcode":""#.into() })), "{errors:?}");
    assert!(errors.iter().any(|(o, e)| *o == 1 && matches!(e, HttpError::Unsendable(_))), "{errors:?}");
    assert!(errors.iter().any(|(o, e)| *o == 2 && matches!(e, HttpError::Status { status: 503, .. })), "{errors:?}");
    // The refusals held nothing back: the other lane's request went, and
    // the unordered lane's tombstones completed without a request.
    assert_eq!(server.applied().len(), 1);
    assert_eq!(server.requests(), 1 + 1 + 3, "the 403 once, the 503 three times, the path that makes no URL never");
    assert_eq!(cell.lane(&Lane::Other).acked_through().get_untracked(), Some(egress_core::Sequence(2)));
    let stats = sender.stats();
    assert_eq!((stats.completed, stats.retried, stats.rejected), (1, 2, 3), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_gone_reads_offline_with_the_error_and_the_records_wait() {
    // A port nothing listens on: bound, then released.
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let cx = AsyncContext::new();
    let cell = cell(&cx, 10);
    let sender = HttpSender::start(&cell, HttpConfig::new(&format!("http://{addr}/")).unwrap()).unwrap();
    cell.enqueue(Lane::ToDevice, request(&Lane::ToDevice, 1)).unwrap();
    let state = reconnecting(&sender).await;
    // The error says why, through its sources (reqwest's own message says
    // only that sending failed).
    assert!(matches!(state.error(), Some(HttpError::Transport(t)) if t.contains("refused")), "{state:?}");
    assert!(state.to_string().starts_with("offline: "), "{state}");
    // The record waits (parked, or, on a slow machine, already due again
    // and retried into the same refusal).
    assert_eq!(cell.parked_len().get() + cell.pending_len().get() + cell.inflight_len().get(), 1);
    // The server comes up on that port: the record goes once due.
    let server = Homeserver::start_on(addr, Chaos::none()).await.unwrap();
    settled(&cell).await;
    assert_eq!(server.applied().len(), 1);
    assert_eq!(sender.connection().get_untracked().to_string(), "online");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_holds_the_record_for_at_least_what_the_server_asked_and_reads_offline() {
    let chaos = Chaos { seed: 1, rate_limited: 1.0, retry_after_ms: 60_000, ..Chaos::none() };
    let server = Homeserver::start(chaos).await.unwrap();
    let cx = AsyncContext::new();
    let cell = cell(&cx, 10);
    let sender = HttpSender::start(&cell, HttpConfig::new(&server.url()).unwrap()).unwrap();
    cell.enqueue(Lane::AccountData, request(&Lane::AccountData, 1)).unwrap();
    cell.enqueue(Lane::AccountData, request(&Lane::AccountData, 2)).unwrap();
    let state = reconnecting(&sender).await;
    assert_eq!(state.error(), Some(&HttpError::RateLimited { retry_after_ms: Some(60_000) }));
    assert!(
        state.to_string().starts_with("offline: rate limited (429); retry after 60000 ms; retrying in "),
        "{state}"
    );
    let due = cell.poll_timeout().expect("parked");
    assert!(due.0 >= cell.now().0 + 59_000, "at least the server's minute: due {due:?}, now {:?}", cell.now());
    match &state {
        ConnectionState::Reconnecting { retry_at, .. } => {
            assert!(*retry_at >= std::time::Instant::now() + Duration::from_secs(30), "retrying ahead, not behind");
        }
        other => panic!("{other:?}"),
    }
    // The strict lane's second write does not overtake the first.
    assert_eq!((cell.parked_len().get(), cell.pending_len().get(), server.requests()), (1, 1, 1));
    assert!(server.applied().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_homeserver_refuses_a_request_without_a_key_and_answers_a_status_path_as_asked() {
    let server = Homeserver::start(Chaos::none()).await.unwrap();
    let client = reqwest::Client::new();
    let bare = client.put(format!("{}rooms/a/send/m/1", server.url())).body("{}").send().await.unwrap();
    assert_eq!(bare.status().as_u16(), 400);
    let keyed = client.put(format!("{}rooms/a/send/m/1", server.url())).header("idempotency-key", "k1");
    assert_eq!(keyed.try_clone().unwrap().send().await.unwrap().status().as_u16(), 200);
    assert_eq!(keyed.send().await.unwrap().status().as_u16(), 200);
    let teapot = client.get(format!("{}status/418/x", server.url())).send().await.unwrap();
    assert_eq!(teapot.status().as_u16(), 418);
    assert_eq!((server.applied().len(), server.duplicates(), server.requests()), (1, 1, 4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_cannot_be_made_or_a_redirect_is_a_dead_letter_and_the_rest_goes_on() {
    let server = Homeserver::start(Chaos::none()).await.unwrap();
    let cx = AsyncContext::new();
    let cell = cell(&cx, 10);
    let sender = HttpSender::start(&cell, HttpConfig::new(&server.url()).unwrap()).unwrap();
    let a = Lane::Room("a".into());
    let mut bad_type = request(&a, 0);
    bad_type.content_type = Some("text/plain\n".into());
    cell.enqueue(a.clone(), bad_type).unwrap();
    cell.enqueue(a.clone(), HttpRequest::new(Method::PUT, "status/303/moved")).unwrap();
    cell.enqueue(a.clone(), request(&a, 2)).unwrap();
    settled(&cell).await;
    rejected(&sender, 2).await;
    let errors: Vec<_> = sender.rejections().get_untracked().iter().map(|r| r.error.clone()).collect();
    assert!(
        matches!(&errors[..], [HttpError::Unsendable(why), HttpError::Status { status: 303, .. }] if why.contains("content type")),
        "{errors:?}"
    );
    let applied: Vec<_> = server.applied().iter().map(|a| a.path.clone()).collect();
    assert_eq!(applied, ["rooms/a/send/m.text/t2"], "the redirect was not followed; the lane went on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_effect_that_panics_does_not_stop_the_sender() {
    let server = Homeserver::start(Chaos::none()).await.unwrap();
    let cx = AsyncContext::new();
    let cell = cell(&cx, 10);
    let sender = HttpSender::start(&cell, HttpConfig::new(&server.url()).unwrap()).unwrap();
    // An effect that panics the first time the first completion reaches it
    // (on the sender's task).
    let panicked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let _effect = cx.effect({
        let (acked, panicked) = (cell.lane(&Lane::ToDevice).acked_through().clone(), panicked.clone());
        move || {
            if acked.get().is_some() && !panicked.swap(true, std::sync::atomic::Ordering::SeqCst) {
                panic!("the application's effect panics");
            }
        }
    });
    cell.enqueue(Lane::ToDevice, request(&Lane::ToDevice, 1)).unwrap();
    egress_testkit::until(|| panicked.load(std::sync::atomic::Ordering::SeqCst).then_some(()), || "no panic".into())
        .await;
    cell.enqueue(Lane::ToDevice, request(&Lane::ToDevice, 2)).unwrap();
    settled(&cell).await;
    assert_eq!(server.applied().len(), 2, "the sender went on");
    assert_eq!(sender.stats().completed, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_asking_for_ages_waits_at_most_the_limit_and_a_later_sender_fences_the_first() {
    let chaos = Chaos { seed: 5, rate_limited: 1.0, retry_after_ms: u64::MAX, ..Chaos::none() };
    let server = Homeserver::start(chaos).await.unwrap();
    let cx = AsyncContext::new();
    let cell = cell(&cx, 10);
    let config = HttpConfig::new(&server.url()).unwrap().max_retry_after(Duration::from_secs(90));
    let first = HttpSender::start(&cell, config.clone()).unwrap();
    cell.enqueue(Lane::Other, request(&Lane::Other, 1)).unwrap();
    egress_testkit::until(|| (cell.parked_len().get() == 1).then_some(()), || format!("{cell:?}")).await;
    let wait = cell.poll_timeout().unwrap().0 - cell.now().0;
    // At least the limit, and at most twice it (the policy's jitter).
    assert!((85_000..=180_000).contains(&wait), "{wait} ms");
    let second = HttpSender::start(&cell, config).unwrap();
    egress_testkit::until(
        || matches!(first.connection().get_untracked(), ConnectionState::Stopped { .. }).then_some(()),
        || format!("{:?}", first.connection().get_untracked()),
    )
    .await;
    assert!(!matches!(second.connection().get_untracked(), ConnectionState::Stopped { .. }));
}

/// The rejections keep the newest `rejections(n)` (none for 0), while the
/// stats count every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rejections_keep_the_newest_as_many_as_asked() {
    let server = Homeserver::start(Chaos::none()).await.unwrap();
    for kept in [0usize, 1] {
        let cx = AsyncContext::new();
        let cell = cell(&cx, 2);
        let config = HttpConfig::new(&server.url()).unwrap().rejections(kept);
        let sender = HttpSender::start(&cell, config).unwrap();
        // One serial lane: the refusals come in their order.
        for _ in 0..3 {
            cell.enqueue(Lane::ToDevice, HttpRequest::new(Method::POST, "status/403/no")).unwrap();
        }
        settled(&cell).await;
        rejected(&sender, 3).await;
        let ordinals: Vec<u64> = sender.rejections().get_untracked().iter().map(|r| r.ordinal.0).collect();
        let newest: Vec<u64> = (3 - kept as u64..3).collect();
        assert_eq!(ordinals, newest, "kept {kept}");
        assert_eq!(sender.stats().rejected, 3);
        assert_eq!(format!("{sender:?}"), "HttpSender { .. }");
        // Dropped, it reads stopped.
        let connection = sender.connection().clone();
        drop(sender);
        assert_eq!(connection.get_untracked(), ConnectionState::Stopped { error: None });
    }
}

/// An error's body is read up to 64 KiB, and kept up to the excerpt: a
/// body of many chunks is read past its first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_body_of_many_chunks_is_read_up_to_64_kib() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = [0u8; 4096];
        let _ = socket.read(&mut request).await.unwrap();
        let body = vec![b'x'; 100_000];
        let head = format!("HTTP/1.1 403 Forbidden\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
        socket.write_all(head.as_bytes()).await.unwrap();
        for piece in body.chunks(1_000) {
            socket.write_all(piece).await.unwrap();
            socket.flush().await.unwrap();
        }
    });
    let cx = AsyncContext::new();
    let cell = cell(&cx, 2);
    let config = HttpConfig::new(&format!("http://{addr}/")).unwrap().excerpt(usize::MAX);
    let sender = HttpSender::start(&cell, config).unwrap();
    cell.enqueue(Lane::Other, HttpRequest::new(Method::POST, "big")).unwrap();
    settled(&cell).await;
    rejected(&sender, 1).await;
    let rejections = sender.rejections().get_untracked();
    match &rejections[0].error {
        HttpError::Status { status: 403, body } => assert_eq!(body.len(), 65_536),
        other => panic!("{other:?}"),
    }
    server.abort();
}
