//! What the chat sends and stores: a [`Line`] a client writes (the payload
//! of its room's egress stream, JSON), and a [`Posted`] line as the server
//! stored it and pushes it to every client.

use serde::{Deserialize, Serialize};

/// A message as its author's client sends it: the payload of the room's
/// egress stream. Its `id` (random, made by the client) names it across
/// the client's store, the wire and the server's table, so that a client
/// knows its own line when the server pushes it back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    /// The message's id: 32 hex digits, random.
    pub id: String,
    /// The room it is posted to.
    pub room: String,
    /// Its author.
    pub from: String,
    /// What it says.
    pub text: String,
}

impl Line {
    /// A new line with a fresh random id.
    #[must_use]
    pub fn new(room: &str, from: &str, text: &str) -> Self {
        Line { id: format!("{:032x}", rand::random::<u128>()), room: room.into(), from: from.into(), text: text.into() }
    }
}

/// A line as the server stored it: numbered in the order the server
/// committed it (`id`, from 1, the same for every client), pushed to every
/// client subscribed ([`crate::push`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Posted {
    /// Its number in the server's table.
    pub id: u64,
    /// The line.
    pub line: Line,
}

/// What a client asks the push channel for: every line after `since`,
/// then each new one as the server stores it, of `rooms` (every room when
/// empty).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscribe {
    /// The last line's number the client has (0: none).
    pub since: u64,
    /// The rooms it wants (empty: all).
    #[serde(default)]
    pub rooms: Vec<String>,
}
