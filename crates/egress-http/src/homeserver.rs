//! A homeserver to prove the sender against: a local HTTP server (axum on
//! hyper) that applies each request once by its idempotency key, records
//! what it applied and how many requests of each path class were in flight
//! at once, and injects 429s, 5xx, dropped connections and slow responses
//! from a seed.
//!
//! A request is applied by its `Idempotency-Key` header: the first time,
//! its method, path and body are recorded, in the order applied; again
//! (a retry whose answer was lost), it is counted as a duplicate and
//! answered as the first time, and nothing is applied twice. A request
//! without the header is refused (400).
//!
//! A path beginning `status/NNN/` is answered with status `NNN` and the
//! body `{"errcode":"M_STATUS","status":NNN}` (a 3xx with `Location:
//! /redirected`), and not applied (how a test sees a refusal, a 404, a 503
//! for good or a redirect).
//!
//! The path class of a request is its path without the last segment
//! (`rooms/a/send/txn1` is of class `rooms/a/send`): the server records the
//! most requests of each class it ever had in flight at once, which is how
//! a test sees that a serial lane never had two requests out.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// What the server does to requests, each drawn from a generator seeded
/// with `seed` (probabilities in [0, 1], checked in this order; what is
/// left is a plain success).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Chaos {
    /// The generator's seed.
    pub seed: u64,
    /// Answer 429 with `{"retry_after_ms": retry_after_ms}` (not applied).
    pub rate_limited: f64,
    /// What a 429 asks to wait.
    pub retry_after_ms: u64,
    /// Answer 500 (not applied).
    pub server_error: f64,
    /// Drop the connection before applying.
    pub drop_before: f64,
    /// Apply, then drop the connection (the answer is lost).
    pub drop_after: f64,
    /// Apply, then answer only after `slow_for` (a client with a shorter
    /// timeout gives up: the answer is lost).
    pub slow: f64,
    /// How long a slow answer takes.
    pub slow_for: Duration,
}

impl Chaos {
    /// No chaos: every request applied and answered at once.
    pub fn none() -> Self {
        Chaos {
            seed: 0,
            rate_limited: 0.0,
            retry_after_ms: 0,
            server_error: 0.0,
            drop_before: 0.0,
            drop_after: 0.0,
            slow: 0.0,
            slow_for: Duration::ZERO,
        }
    }
}

/// A request the server applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// Its idempotency key.
    pub key: String,
    /// Its method.
    pub method: Method,
    /// Its path (without the leading `/`).
    pub path: String,
    /// Its body.
    pub body: Bytes,
}

/// What the server saw, and the generator of its chaos.
#[derive(Debug)]
struct Ledger {
    applied: Vec<Applied>,
    by_key: HashMap<String, usize>,
    requests: u64,
    duplicates: u64,
    in_flight: HashMap<String, usize>,
    most_in_flight: BTreeMap<String, usize>,
    /// The generator the transports' seeded draws share.
    rng: egress_reactive::Xorshift,
}

struct Shared {
    ledger: Mutex<Ledger>,
    chaos: Chaos,
}

/// A running homeserver on 127.0.0.1; stops when dropped.
pub struct Homeserver {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Homeserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Homeserver").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl Homeserver {
    /// Starts one on a free port of 127.0.0.1.
    ///
    /// # Errors
    /// The port could not be bound.
    pub async fn start(chaos: Chaos) -> std::io::Result<Self> {
        Self::start_on("127.0.0.1:0".parse().expect("an address"), chaos).await
    }

    /// Starts one on `addr`.
    ///
    /// # Errors
    /// The address could not be bound.
    pub async fn start_on(addr: SocketAddr, chaos: Chaos) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let ledger = Ledger {
            applied: Vec::new(),
            by_key: HashMap::new(),
            requests: 0,
            duplicates: 0,
            in_flight: HashMap::new(),
            most_in_flight: BTreeMap::new(),
            rng: egress_reactive::Xorshift::new(chaos.seed),
        };
        let shared = Arc::new(Shared { ledger: Mutex::new(ledger), chaos });
        let task = tokio::spawn(serve(listener, shared.clone()));
        Ok(Homeserver { addr, shared, task })
    }

    /// Its base URL (`http://127.0.0.1:PORT/`).
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// What it applied, in the order applied (each key once).
    pub fn applied(&self) -> Vec<Applied> {
        self.shared.ledger.lock().applied.clone()
    }

    /// Requests received (answered or not).
    pub fn requests(&self) -> u64 {
        self.shared.ledger.lock().requests
    }

    /// Requests whose key was applied before (answered as the first).
    pub fn duplicates(&self) -> u64 {
        self.shared.ledger.lock().duplicates
    }

    /// The most requests of each path class it had in flight at once.
    pub fn most_in_flight(&self) -> BTreeMap<String, usize> {
        self.shared.ledger.lock().most_in_flight.clone()
    }
}

impl Drop for Homeserver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        while connections.try_join_next().is_some() {}
        let kill = Arc::new(Notify::new());
        let router = Router::new().fallback(handle).with_state((shared.clone(), kill.clone()));
        connections.spawn(async move {
            let service = TowerToHyperService::new(router);
            let connection = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            // Dropping the connection's future closes its socket.
            tokio::select! {
                _ = connection => {}
                () = kill.notified() => {}
            }
        });
    }
}

/// The path class: the path without its last segment.
fn class(path: &str) -> String {
    path.rsplit_once('/').map_or_else(String::new, |(head, _)| head.to_owned())
}

/// What the chaos decided for one request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    RateLimited,
    ServerError,
    DropBefore,
    DropAfter,
    Slow,
    Plain,
}

/// Leaves its class's in-flight count when the request ends, however.
struct InFlight<'a> {
    shared: &'a Shared,
    class: String,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.shared.ledger.lock().in_flight.get_mut(&self.class) {
            *n = n.saturating_sub(1);
        }
    }
}

async fn handle(
    State((shared, kill)): State<(Arc<Shared>, Arc<Notify>)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().trim_start_matches('/').to_owned();
    shared.ledger.lock().requests += 1;
    if let Some(code) = path.strip_prefix("status/").and_then(|rest| rest.split('/').next())
        && let Some(status) = code.parse().ok().and_then(|c| StatusCode::from_u16(c).ok())
    {
        let body = format!(r#"{{"errcode":"M_STATUS","status":{}}}"#, status.as_u16());
        if status.is_redirection() {
            return (status, [("location", "/redirected")], body).into_response();
        }
        return (status, body).into_response();
    }
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_owned) else {
        return (StatusCode::BAD_REQUEST, "no Idempotency-Key").into_response();
    };
    let class = class(&path);
    let chaos = shared.chaos;
    let fate = {
        let mut ledger = shared.ledger.lock();
        let n = ledger.in_flight.entry(class.clone()).or_insert(0);
        *n += 1;
        let now = *n;
        let most = ledger.most_in_flight.entry(class.clone()).or_insert(0);
        *most = (*most).max(now);
        let r = ledger.rng.next_f64();
        let mut edge = 0.0;
        let mut fate = Fate::Plain;
        for (p, f) in [
            (chaos.rate_limited, Fate::RateLimited),
            (chaos.server_error, Fate::ServerError),
            (chaos.drop_before, Fate::DropBefore),
            (chaos.drop_after, Fate::DropAfter),
            (chaos.slow, Fate::Slow),
        ] {
            edge += p;
            if r < edge {
                fate = f;
                break;
            }
        }
        fate
    };
    let _in_flight = InFlight { shared: &shared, class };
    match fate {
        Fate::RateLimited => {
            let body = format!(r#"{{"errcode":"M_LIMIT_EXCEEDED","retry_after_ms":{}}}"#, chaos.retry_after_ms);
            return (StatusCode::TOO_MANY_REQUESTS, body).into_response();
        }
        Fate::ServerError => return (StatusCode::INTERNAL_SERVER_ERROR, "chaos: a server error").into_response(),
        Fate::DropBefore => return dropped(&kill).await,
        Fate::DropAfter | Fate::Slow | Fate::Plain => {}
    }
    {
        let mut ledger = shared.ledger.lock();
        if ledger.by_key.contains_key(&key) {
            ledger.duplicates += 1;
        } else {
            let at = ledger.applied.len();
            ledger.by_key.insert(key.clone(), at);
            ledger.applied.push(Applied { key: key.clone(), method, path, body });
        }
    }
    match fate {
        Fate::DropAfter => dropped(&kill).await,
        Fate::Slow => {
            tokio::time::sleep(chaos.slow_for).await;
            ok(&key)
        }
        _ => ok(&key),
    }
}

fn ok(key: &str) -> Response {
    let body = serde_json::json!({ "event_id": key }).to_string();
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap_or_else(|_| StatusCode::OK.into_response())
}

/// Closes the connection without an answer.
async fn dropped(kill: &Notify) -> Response {
    kill.notify_one();
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_is_the_path_without_its_last_segment() {
        assert_eq!(class("rooms/a/send/txn1"), "rooms/a/send");
        assert_eq!(class("sendToDevice/7"), "sendToDevice");
        assert_eq!(class("flat"), "");
    }
}
