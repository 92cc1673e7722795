//! What the durable lanes tests share (SQLite's and PostgreSQL's): a
//! Matrix-like lane key, and a drain that claims and completes everything.
#![allow(clippy::unwrap_used)]

use std::num::NonZeroUsize;

use bytes::Bytes;
use egress_core::{LaneKey, LaneKind, Lanes, LanesClaim, LanesPolicy, LanesReady, Policy, Sequence};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum Lane {
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
            Lane::Other => LaneKind::Unordered(NonZeroUsize::new(4).unwrap()),
        }
    }
}

pub fn room(name: &str) -> Lane {
    Lane::Room(name.to_owned())
}

pub fn policy(max_lanes: usize) -> LanesPolicy {
    LanesPolicy::new(Policy::default(), max_lanes).unwrap()
}

pub fn text(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// Claims and completes everything, round by round, and returns the
/// payloads in claim order.
pub fn drain(lanes: &mut Lanes<Lane, Bytes>) -> Vec<String> {
    let mut order = Vec::new();
    for _ in 0..1_000 {
        let g = lanes.generation();
        let mut claimed = Vec::new();
        while let LanesClaim::Claimed(e) = lanes.claim(g).outcome {
            claimed.push((e.lane.clone(), e.envelope.sequence, e.envelope.payload.clone()));
        }
        if claimed.is_empty() {
            return order;
        }
        for (lane, sequence, payload) in claimed {
            let _ = lanes.complete(g, &lane, sequence);
            order.push(String::from_utf8(payload.to_vec()).unwrap());
        }
    }
    panic!("still claiming after 1,000 rounds");
}

/// The payloads of each lane's appends in `ready`, as a store's
/// `apply_lanes` takes them.
pub fn appends(lanes: &Lanes<Lane, Bytes>, ready: &LanesReady<Lane>) -> Vec<Vec<(Sequence, Bytes)>> {
    ready
        .lanes
        .iter()
        .map(|l| {
            let core = lanes.lane(&l.lane).unwrap();
            core.unwritten(l.ready.appends.clone()).map(|(s, p)| (s, p.clone())).collect()
        })
        .collect()
}
