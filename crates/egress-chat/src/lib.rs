//! egress-chat: a terminal chat application whose screen is an effect over
//! egress cells, and the server it talks to.
//!
//! - [`server`]: `egress-chat serve`, the reference receiver storing each
//!   line in SQLite with its record in the same transaction, and the push
//!   channel ([`push`]) that hands the lines to every client.
//! - [`client`]: a client's rooms (one durable egress stream each), its
//!   history and its own lines' delivery state, as signals.
//! - [`ui`]: the terminal screen (ratatui), drawn by one effect.

pub mod client;
pub mod message;
pub mod push;
pub mod server;
pub mod ui;
