//! The homeserver itself, through a plain HTTP client: what each chaos
//! fate does to a request (applied or not, answered or not), its answer,
//! and that it stops when dropped.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use egress_http::homeserver::{Chaos, Homeserver};

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_millis(500)).build().unwrap()
}

async fn put(server: &Homeserver, path: &str, key: &str) -> reqwest::Result<reqwest::Response> {
    client().put(format!("{}{path}", server.url())).header("Idempotency-Key", key).body("{}").send().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_request_is_applied_once_and_answered_with_its_key() {
    let server = Homeserver::start(Chaos::none()).await.unwrap();
    assert!(format!("{server:?}").starts_with("Homeserver { addr: 127.0.0.1:"), "{server:?}");
    let answer = put(&server, "rooms/a/send/t1", "k1").await.unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.headers()["content-type"], "application/json");
    let body: serde_json::Value = serde_json::from_slice(&answer.bytes().await.unwrap()).unwrap();
    assert_eq!(body["event_id"], "k1");
    let again = put(&server, "rooms/a/send/t1", "k1").await.unwrap();
    assert_eq!(again.status(), 200, "a retry is answered as the first");
    assert_eq!((server.applied().len(), server.duplicates(), server.requests()), (1, 1, 2));
    assert_eq!(server.applied()[0].path, "rooms/a/send/t1");
    let refused = client().put(format!("{}x/y", server.url())).send().await.unwrap();
    assert_eq!(refused.status(), 400, "no key, no apply");
    assert_eq!(server.most_in_flight().get("rooms/a/send"), Some(&1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_dropped_after_applying_loses_the_answer_not_the_apply() {
    let chaos = Chaos { seed: 3, drop_after: 1.0, ..Chaos::none() };
    let server = Homeserver::start(chaos).await.unwrap();
    let answer = put(&server, "p/1", "k1").await;
    assert!(answer.is_err(), "no answer: {answer:?}");
    assert_eq!(server.applied().len(), 1, "applied before the drop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_answer_outlasts_the_clients_timeout_after_applying() {
    let chaos = Chaos { seed: 3, slow: 1.0, slow_for: Duration::from_secs(30), ..Chaos::none() };
    let server = Homeserver::start(chaos).await.unwrap();
    let answer = put(&server, "p/1", "k1").await;
    assert!(answer.as_ref().is_err_and(reqwest::Error::is_timeout), "timed out: {answer:?}");
    assert_eq!(server.applied().len(), 1, "applied before the wait");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_homeserver_takes_no_more_connections() {
    let server = Homeserver::start(Chaos::none()).await.unwrap();
    let addr = server.url().trim_start_matches("http://").trim_end_matches('/').to_owned();
    assert!(tokio::net::TcpStream::connect(&addr).await.is_ok());
    drop(server);
    egress_testkit::until(
        || {
            let refused =
                std::net::TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_millis(200)).is_err();
            refused.then_some(())
        },
        || format!("{addr} still takes connections"),
    )
    .await;
}

/// The fates of a run of requests, one at a time, under `seed`.
async fn fates(seed: u64) -> Vec<u16> {
    let chaos = Chaos { seed, server_error: 0.5, ..Chaos::none() };
    let server = Homeserver::start(chaos).await.unwrap();
    let mut statuses = Vec::new();
    for i in 0..32 {
        statuses.push(put(&server, &format!("p/{i}"), &format!("k{i}")).await.unwrap().status().as_u16());
    }
    statuses
}

/// The chaos is drawn from its seed: the same seed, the same fates; another
/// seed, others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_seed_gives_the_same_fates_and_another_seed_others() {
    let (one, again, two) = (fates(1).await, fates(1).await, fates(2).await);
    assert_eq!(one, again);
    assert_ne!(one, two);
    assert!(one.contains(&500) && one.contains(&200), "{one:?}");
}
