//! [`SpillStore`]: where a relay cell with [`Overflow::Spill`] writes the
//! pages its relay takes out, and reads them back in order.
//!
//! [`Overflow::Spill`]: egress_core::Overflow::Spill

use egress_core::SpillPage;

/// A spill store's error: what it could not read or write (shown, counted
/// and retried by the relay cell; nothing is lost).
pub type SpillError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An entry a spill store holds: written by an
/// [`append`](SpillStore::append), read back by
/// [`read`](SpillStore::read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpilledEntry<T> {
    /// Its place in the store: entries are read in this order, and each
    /// id is above every id appended before it.
    pub id: u64,
    /// Its value: one op, or several folded in order.
    pub value: T,
    /// How many ops it folds (at least 1).
    pub ops: u64,
}

/// Durable storage for a relay cell's pages ([`Overflow::Spill`]): an
/// ordered log of entries, appended a page at a time, read back oldest
/// first, and reclaimed from the front once the stream acknowledged what
/// they held. egress-store's `SqliteSpill` is one (SQLite, the embedded
/// default).
///
/// The relay cell calls it with its graph entered (one call at a time):
/// each call must return rather than wait on the graph.
///
/// [`Overflow::Spill`]: egress_core::Overflow::Spill
pub trait SpillStore<T> {
    /// The ops the entries with an id above `after` fold (every entry's,
    /// with `None`: a restart's pages, not yet reclaimed, read when a
    /// relay cell is built over the store; and the rest of a replay, when
    /// an entry holds more ops than the relay counts cold).
    ///
    /// # Errors
    /// The store could not be read.
    fn stored_ops(&mut self, after: Option<u64>) -> Result<u64, SpillError>;

    /// Appends `page`'s entries, in order, after every entry appended
    /// before. When it returns `Ok`, they are durable (all of them: a
    /// page is written whole or not at all).
    ///
    /// # Errors
    /// Nothing was written (a full disk, a refused commit, a value the
    /// store cannot encode): the relay cell puts the page back.
    fn append(&mut self, page: &SpillPage<T>) -> Result<(), SpillError>;

    /// At most `max` entries with an id above `after` (every entry, with
    /// `None`), oldest first.
    ///
    /// # Errors
    /// The store could not be read, holds an entry it cannot decode, or
    /// (a store with one writer per name) was taken over.
    fn read(&mut self, after: Option<u64>, max: usize) -> Result<Vec<SpilledEntry<T>>, SpillError>;

    /// Deletes every entry with an id at or below `id`: what they held was
    /// acknowledged (or refused for good) by the stream.
    ///
    /// # Errors
    /// Nothing was deleted: the relay cell tries again later.
    fn reclaim_through(&mut self, id: u64) -> Result<(), SpillError>;
}
