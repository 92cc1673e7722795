//! What the store's integration tests share beyond egress-testkit: a
//! transport into a channel, a relay configuration with short waits.
#![allow(dead_code, unreachable_pub, unused_imports)]

use std::time::Duration;

use egress_reactive::{AsyncTransport, SendError};
use egress_store::RelayConfig;
use tokio::sync::mpsc;

pub use egress_testkit::TempDir;

pub mod lanes;
pub mod latest;

/// A transport that hands each envelope's sequence and payload to a
/// channel.
pub struct Channel<T>(pub mpsc::UnboundedSender<(u64, T)>);

impl<T: Send + 'static> AsyncTransport<T> for Channel<T> {
    async fn send(&mut self, envelope: egress_core::Envelope<T>) -> Result<(), SendError> {
        self.0.send((envelope.sequence.0, envelope.payload)).map_err(|_| SendError::transient("gone"))
    }
}

/// A relay that polls and retries every 5 ms.
pub fn config() -> RelayConfig {
    RelayConfig {
        poll_interval: Duration::from_millis(5),
        retry_base: Duration::from_millis(5),
        ..RelayConfig::default()
    }
}
