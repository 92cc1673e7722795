//! An HTTP transport for egress lanes: the outgoing queue of a client of a
//! request/response API (a Matrix homeserver, a REST backend), with the
//! delivery state as signals.
//!
//! ```text
//!  app ─ enqueue(lane, HttpRequest) ─▶ AsyncLanesCell ─ claims (each lane's window, the cap) ─▶ HttpSender
//!                                          ▲                                                     │ one request per record,
//!                                          │  complete (2xx) · fail (429, 5xx, timeout: retried;  │ Idempotency-Key on each
//!                                          └──── other status: a dead letter) ◀──────────────────┘ attempt, many at once
//! ```
//!
//! - [`HttpRequest`]: what the application enqueues, sent byte for byte
//!   the same at every attempt.
//! - [`HttpSender`]: the cell's transport; see its docs for the mapping of
//!   responses onto the core's failure kinds, the idempotency key and the
//!   connection state.
//! - [`HttpConfig::policy`]: the retry policy of an HTTP API (capped,
//!   jittered exponential backoff) as the lanes' base policy.
//! - With the `homeserver` feature, [`homeserver`]: a local server that
//!   records what it applied by idempotency key and injects 429s, 5xx,
//!   dropped connections and slow responses from a seed.
//!
//! The rules of lanes (which lane kinds exist, what holds a lane back) are
//! in docs/lanes.md; this crate's part is in docs/http.md.

#[cfg(feature = "homeserver")]
pub mod homeserver;
mod request;
mod response;
mod sender;

pub use request::{HttpCodec, HttpRequest};
pub use reqwest::Method;
pub use response::HttpError;
pub use sender::{ConfigError, HttpConfig, HttpSender, HttpStats, IDEMPOTENCY_KEY, Rejection, StartError};
