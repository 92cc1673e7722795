//! The transport a sender attaches to its cell for one connection, and
//! the limits it holds a payload to.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use egress_codec::Encode;
use egress_core::Envelope;
use egress_reactive::{AsyncTransport, SendError};
use futures_util::SinkExt;
use tokio::sync::{Mutex, Notify, OwnedMutexGuard};
use tokio_tungstenite::tungstenite::Message;

#[cfg(doc)]
use super::SenderConfig;
use super::{Counters, Sink};
use crate::protocol::Frame;

/// A payload above the sender's own limit ([`SenderConfig::max_payload`]):
/// it is never sent, so its send fails as permanent (the record becomes a
/// dead letter).
#[derive(Debug, thiserror::Error)]
#[error("a payload of {len} bytes exceeds the sender's limit of {limit}")]
pub struct TooLarge {
    /// The payload's length.
    pub len: usize,
    /// The sender's limit.
    pub limit: usize,
}

/// A payload within the sender's own limit but above the max-payload the
/// connected receiver advertised. The receiver's limit is not a verdict on
/// the data (another receiver, or this one reconfigured, may take it): the
/// send fails with a retry-after of [`UNTIL_RECONNECT`], so the record
/// parks until the next connection, and the connection ends at once (the
/// stream cannot go past the record on it; an orderly close, code 0). Each
/// such refusal spends one failure of the record's retry budget: a record
/// that connection after connection refuses becomes a dead letter
/// ([`DeadReason::Retries`]), its tombstone sent, once the budget is spent.
///
/// [`DeadReason::Retries`]: egress_core::DeadReason::Retries
#[derive(Debug, thiserror::Error)]
#[error("a payload of {len} bytes exceeds this receiver's limit of {limit}: held for the next connection")]
pub struct ReceiverTooSmall {
    /// The payload's length.
    pub len: usize,
    /// The connected receiver's advertised limit.
    pub limit: usize,
}

/// The retry-after of a record held for a receiver too small for it: never
/// due on its own; a reconnect (or `retry_now`) makes it pending again.
pub const UNTIL_RECONNECT: egress_core::Delay = egress_core::Delay(u64::MAX);

/// The transport an attachment sends through: the connection's write half.
/// Frames are queued by `send` and written by `flush`, once per pass. A
/// payload above the receiver's limit fails as permanent without being sent;
/// a tombstone goes out as a tombstone frame.
pub struct WsTransport<T = Bytes> {
    pub(super) codec: Arc<dyn Encode<T>>,
    pub(super) sink: Arc<Mutex<Sink>>,
    /// Held from the first send of a pass to its flush.
    pub(super) pass: Option<OwnedMutexGuard<Sink>>,
    /// The sender's own limit.
    pub(super) own_max: usize,
    /// The connected receiver's advertised limit.
    pub(super) max_payload: usize,
    pub(super) unwritten: Arc<Unwritten>,
    pub(super) counters: Arc<Counters>,
    /// Told when a record is above the receiver's limit.
    pub(super) too_small: Arc<Notify>,
}

/// The sequences this sender refused before writing them, on every
/// connection so far (too large, or not encodable): no receiver can hold
/// them, so an acknowledgement or a receipt that covers one is a lie. Under
/// [`DeadLetters::Hold`] such a record stays held, and a record held back
/// for a receiver's limit waits for the next connection: an ack covering
/// either would drop it. A refused entry goes when its sequence is written
/// (a tombstone in its place, or the record on a later connection); a
/// sequence written once is never refused-unwritten again (a receiver may
/// hold it from then on), and is remembered until an ack covers it. So at
/// most one entry per record the cell holds.
///
/// [`DeadLetters::Hold`]: egress_core::DeadLetters::Hold
#[derive(Debug, Default)]
pub(super) struct Unwritten(parking_lot::Mutex<Writes>);

#[derive(Debug, Default)]
struct Writes {
    refused: std::collections::BTreeSet<u64>,
    written: Ranges,
}

/// A set of sequences as disjoint, non-adjacent ranges (`start -> end`,
/// both included). Writes come in runs (a window, then its replay), so
/// adding the next sequence of a run extends the last range in place
/// rather than taking a node per sequence; at most one range per record
/// the cell holds.
#[derive(Debug, Default)]
struct Ranges(std::collections::BTreeMap<u64, u64>);

impl Ranges {
    fn contains(&self, s: u64) -> bool {
        self.0.range(..=s).next_back().is_some_and(|(_, &end)| end >= s)
    }

    fn insert(&mut self, s: u64) {
        if let Some(mut last) = self.0.last_entry()
            && *last.key() <= s
        {
            // The common case: at or after the last range's start.
            match s.checked_sub(1) {
                _ if s <= *last.get() => return,
                Some(before) if before == *last.get() => {
                    *last.get_mut() = s;
                    return;
                }
                _ => {}
            }
            self.0.insert(s, s);
            return;
        }
        if self.contains(s) {
            return;
        }
        // Below the last range: joined to its neighbours where adjacent.
        let mut start = s;
        if let Some(before) = s.checked_sub(1)
            && let Some((&b, &end)) = self.0.range(..=before).next_back()
            && end == before
        {
            start = b;
        }
        let mut end = s;
        if let Some(after) = s.checked_add(1)
            && let Some(after_end) = self.0.remove(&after)
        {
            end = after_end;
        }
        self.0.insert(start, end);
    }

    /// Forgets everything at or below `through`.
    fn forget_through(&mut self, through: u64) {
        let Some(above) = through.checked_add(1) else {
            self.0.clear();
            return;
        };
        let straddling = self.0.range(..above).next_back().map(|(_, &end)| end).filter(|&end| end >= above);
        self.0 = self.0.split_off(&above);
        if let Some(end) = straddling {
            self.0.insert(above, end);
        }
    }

    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.0.iter().flat_map(|(&start, &end)| start..=end)
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Unwritten {
    /// The lowest refused sequence at or below `through`, if any.
    pub(super) fn covered(&self, through: u64) -> Option<u64> {
        self.0.lock().refused.first().copied().filter(|&s| s <= through)
    }

    /// `sequence`'s send was refused before it was written.
    pub(super) fn refused(&self, sequence: u64) {
        let mut w = self.0.lock();
        if !w.written.contains(sequence) {
            w.refused.insert(sequence);
        }
    }

    /// `sequence` goes to the wire (if the write fails, a receiver may
    /// still hold it).
    pub(super) fn written(&self, sequence: u64) {
        let mut w = self.0.lock();
        if !w.refused.is_empty() {
            w.refused.remove(&sequence);
        }
        w.written.insert(sequence);
    }

    /// Everything through `through` is acknowledged: its writes need no
    /// remembering.
    pub(super) fn acked(&self, through: u64) {
        self.0.lock().written.forget_through(through);
    }
}

impl<T: Send + Sync + 'static> AsyncTransport<T> for WsTransport<T> {
    async fn send(&mut self, envelope: Envelope<T>) -> Result<(), SendError> {
        let (generation, sequence, attempt) =
            (envelope.generation.get(), envelope.sequence.get(), envelope.attempt.get());
        let frame = match envelope.dead {
            Some(reason) => Frame::Tombstone { generation, sequence, attempt, reason },
            None => {
                let payload = match egress_codec::guarded(|| self.codec.encode(&envelope.payload)) {
                    Ok(payload) => payload,
                    Err(e) => {
                        self.unwritten.refused(sequence);
                        return Err(SendError::permanent(Unencodable(e)));
                    }
                };
                if payload.len() > self.own_max {
                    self.unwritten.refused(sequence);
                    return Err(SendError::permanent(TooLarge { len: payload.len(), limit: self.own_max }));
                }
                if payload.len() > self.max_payload {
                    self.unwritten.refused(sequence);
                    self.counters.held_too_large.fetch_add(1, Ordering::Relaxed);
                    let (len, limit) = (payload.len(), self.max_payload);
                    tracing::warn!(
                        sequence,
                        len,
                        limit,
                        "egress sender: a record above the receiver's limit is held, and the connection ends"
                    );
                    // The stream cannot go past it on this connection: the
                    // connection ends, and the record waits for the next.
                    self.too_small.notify_one();
                    return Err(SendError::retry_after(UNTIL_RECONNECT, ReceiverTooSmall { len, limit }));
                }
                Frame::Data { generation, sequence, attempt, payload }
            }
        };
        self.unwritten.written(sequence);
        tracing::trace!(sequence, attempt, tombstone = envelope.dead.is_some(), "egress sender: frame");
        let sink = match &mut self.pass {
            Some(sink) => sink,
            None => self.pass.insert(self.sink.clone().lock_owned().await),
        };
        sink.feed(Message::Binary(frame.encode())).await.map_err(SendError::transient)
    }

    async fn flush(&mut self) -> Result<(), SendError> {
        let result = match &mut self.pass {
            Some(sink) => sink.flush().await.map_err(SendError::transient),
            None => Ok(()),
        };
        self.pass = None;
        result
    }
}

pub use egress_codec::Unencodable;

#[cfg(test)]
mod tests {
    use super::{Ranges, Unwritten};

    #[test]
    fn what_was_written_is_remembered_until_acknowledged_and_never_refused_again() {
        let u = Unwritten::default();
        u.refused(3);
        assert_eq!((u.covered(2), u.covered(3)), (None, Some(3)));
        // Written on a later connection: no longer unwritten, and a later
        // refusal (a smaller receiver) does not make it so again.
        u.written(3);
        u.refused(3);
        assert_eq!(u.covered(9), None);
        for s in 4..8 {
            u.written(s);
        }
        // An ack through 5 forgets the writes it covers: a refusal of 6 is
        // still not unwritten, one of 2 (acknowledged) would be.
        u.acked(5);
        assert_eq!(u.0.lock().written.iter().collect::<Vec<_>>(), [6, 7]);
        u.refused(6);
        assert_eq!(u.covered(9), None);
        u.acked(u64::MAX);
        assert!(u.0.lock().written.is_empty());
    }

    /// The ranges against a `BTreeSet` of the same sequences, through
    /// seeded random inserts (runs, replays, gaps, the ends of `u64`) and
    /// forgets.
    #[test]
    fn the_written_ranges_hold_what_a_set_would() {
        use std::collections::BTreeSet;
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..200 {
            let mut ranges = Ranges::default();
            let mut set = BTreeSet::new();
            let base = if round % 10 == 0 { u64::MAX - 40 } else { 0 };
            for _ in 0..300 {
                let s = base + next(41);
                match next(10) {
                    0 => {
                        ranges.forget_through(s);
                        set.retain(|&x| x > s);
                    }
                    1 => {
                        ranges.forget_through(u64::MAX);
                        set.clear();
                    }
                    _ => {
                        ranges.insert(s);
                        set.insert(s);
                    }
                }
                assert_eq!(ranges.iter().collect::<Vec<_>>(), set.iter().copied().collect::<Vec<_>>(), "round {round}");
                assert!((0..41).all(|d| ranges.contains(base + d) == set.contains(&(base + d))));
                // Disjoint and not adjacent: the fewest ranges.
                let spans: Vec<(u64, u64)> = ranges.0.iter().map(|(&a, &b)| (a, b)).collect();
                assert!(spans.iter().all(|(a, b)| a <= b));
                assert!(spans.windows(2).all(|w| w[0].1.checked_add(1).is_some_and(|n| n < w[1].0)), "{spans:?}");
            }
        }
    }
}
