//! A stream's watermarks and out-of-order buffer, a connection as the
//! inbox knows it, and a producer: the records the inbox keeps.

use std::collections::{BTreeMap, BTreeSet};

use super::{ConnId, Content};

/// One stream: a producer's sequence space.
#[derive(Debug, Default)]
pub(super) struct Stream {
    /// Unique within the inbox.
    pub(super) id: u64,
    pub(super) next: u64,
    /// Every sequence below it is committed: `min(wanted, redo.first())`,
    /// never lowered.
    pub(super) committed: u64,
    /// One above the highest sequence the application committed.
    pub(super) wanted: u64,
    /// Sequences given back and not committed since, queued again or taken
    /// again: only a commit of the sequence itself covers it. At most one
    /// per delivery the application holds or gave back.
    pub(super) redo: BTreeSet<u64>,
    pub(super) buffer: BTreeMap<u64, Content>,
    /// The payload bytes in `buffer`.
    pub(super) buffered_bytes: usize,
    /// The highest watermark the producer said it holds acknowledged (the
    /// resume-from of its handshakes, the detail of its orderly close):
    /// commits above it may have been acknowledged without the producer
    /// knowing, and forgetting the stream would deliver them again.
    pub(super) confirmed: u64,
    /// When its last connection ended (or, while one is up, was admitted).
    pub(super) ended: u64,
    /// The lowest and highest sequences the current connection sent above
    /// a gap and the stream dropped (its buffer full): any between may be
    /// missing. Goes with the connection.
    pub(super) dropped: Option<(u64, u64)>,
}

impl Stream {
    pub(super) fn new(id: u64, from: u64, now: u64) -> Self {
        Stream {
            id,
            next: from,
            committed: from,
            wanted: from,
            redo: BTreeSet::new(),
            buffer: BTreeMap::new(),
            buffered_bytes: 0,
            confirmed: from,
            ended: now,
            dropped: None,
        }
    }

    /// Whether the producer confirmed every acknowledgement the stream may
    /// have sent: forgetting it then costs nothing (the producer resumes
    /// at or above everything committed).
    pub(super) fn confirmed(&self) -> bool {
        self.committed <= self.confirmed
    }

    /// Empties the out-of-order buffer (and forgets what the connection
    /// dropped); returns the bytes freed.
    pub(super) fn clear_buffer(&mut self) -> usize {
        self.buffer.clear();
        self.dropped = None;
        std::mem::take(&mut self.buffered_bytes)
    }

    /// Whether nothing of the stream waits for the application: everything
    /// delivered was committed (which covers what is queued or held).
    pub(super) fn settled(&self) -> bool {
        self.committed == self.next && self.redo.is_empty()
    }

    /// Raises `committed` as far as the commits and the give-backs allow;
    /// returns whether it moved.
    pub(super) fn settle(&mut self) -> bool {
        let to = self.redo.first().map_or(self.wanted, |&r| self.wanted.min(r));
        let moved = to > self.committed;
        if moved {
            self.committed = to;
        }
        moved
    }
}

#[derive(Debug)]
pub(super) struct Conn<W> {
    pub(super) id: ConnId,
    pub(super) incarnation: u128,
    pub(super) generation: u64,
    pub(super) wake: W,
    /// The `committed` value last acknowledged on this connection.
    pub(super) acked: u64,
}

#[derive(Debug)]
pub(super) struct Producer<W> {
    /// The highest generation admitted.
    pub(super) generation: u64,
    pub(super) conn: Option<Conn<W>>,
    /// The streams, least recently admitted first.
    pub(super) streams: Vec<(u128, Stream)>,
    /// Since when it has been idle (in [`Inbox::idle`]), if it is.
    pub(super) idle_since: Option<u64>,
}

impl<W> Producer<W> {
    pub(super) fn stream(&mut self, incarnation: u128) -> Option<&mut Stream> {
        self.streams.iter_mut().find(|(i, _)| *i == incarnation).map(|(_, s)| s)
    }

    /// No connection, and nothing of its streams waits for the application:
    /// forgetting it loses nothing (its producer holds whatever was not
    /// acknowledged, and resumes from there).
    pub(super) fn idle(&self) -> bool {
        self.conn.is_none() && self.streams.iter().all(|(_, s)| s.settled())
    }

    /// Whether its producer confirmed every acknowledgement of every stream.
    pub(super) fn confirmed(&self) -> bool {
        self.streams.iter().all(|(_, s)| s.confirmed())
    }
}
