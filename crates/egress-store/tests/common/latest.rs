//! What the durable latest projection tests share (SQLite's and
//! PostgreSQL's): a settings key, sinks that keep what they are handed,
//! and the projection's policy.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use egress_core::{Delay, Policy};
use egress_reactive::{LatestItem, LatestSink, SendError, Written};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum Setting {
    Volume,
    Theme(String),
}

/// Keeps what it is handed: (key, version, value), applied at once.
#[derive(Clone, Default)]
pub struct Panel(pub Arc<Mutex<Vec<(Setting, u64, u32)>>>);

impl Panel {
    pub fn seen(&self) -> Vec<(Setting, u64, u32)> {
        self.0.lock().unwrap().clone()
    }
}

impl LatestSink<Setting, u32> for Panel {
    fn write(&mut self, item: LatestItem<Setting, u32>) -> Result<Written, SendError> {
        self.0.lock().unwrap().push((item.key, item.version.0, item.value));
        Ok(Written::Applied)
    }
}

/// Takes what it is handed, to be answered by the test.
#[derive(Clone, Default)]
pub struct Later(pub Arc<Mutex<Vec<(Setting, u64, u32)>>>);

impl LatestSink<Setting, u32> for Later {
    fn write(&mut self, item: LatestItem<Setting, u32>) -> Result<Written, SendError> {
        self.0.lock().unwrap().push((item.key, item.version.0, item.value));
        Ok(Written::Taken)
    }
}

pub fn policy() -> Policy {
    Policy::builder().retry_base(Delay(10)).retry_ceiling(Delay(100)).build().unwrap()
}

pub async fn until(what: &str, mut f: impl FnMut() -> bool) {
    egress_testkit::until(|| f().then_some(()), || what.to_owned()).await;
}

pub fn theme(name: &str) -> Setting {
    Setting::Theme(name.to_owned())
}
