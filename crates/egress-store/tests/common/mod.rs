//! What the store's integration tests share: a throwaway directory, a
//! transport into a channel, a relay configuration with short waits.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use egress_reactive::{AsyncTransport, SendError};
use egress_store::RelayConfig;
use tokio::sync::mpsc;

/// A fresh directory under the system's temporary one, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "egress-store-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        TempDir(dir)
    }

    pub fn db(&self) -> PathBuf {
        self.0.join("egress.db")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

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
