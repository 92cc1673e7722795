//! The store's half of the relay: the journal contract every store keeps,
//! SQLite's implementation of it, and the watch on appends through the
//! outbox.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use egress_core::{Ready, Sequence};
use parking_lot::Mutex;
use tokio::sync::Notify;

#[cfg(doc)]
use super::Relay;
use crate::{SqliteStore, StoreError};

/// One stream's home, as a [`Relay`] uses it: the store's half of the
/// contract every store keeps the same way (a `Ready` as one transaction,
/// appends that continue the stored counter or a
/// [`StoreError::Conflict`], [`StoreError::Fenced`] once the stream is
/// another writer's). The relay's logic (group commit, reports to the cell,
/// rebase, adoption, backoff) is written once over it.
///
/// Implemented by [`SqliteJournal`] and, with the feature `postgres`, by
/// `postgres::PgJournal`.
pub trait JournalStore: Send + 'static {
    /// Writes one `Ready` of the stream (`appends` are the payloads of
    /// `ready.appends`, in order) as one transaction.
    fn apply(
        &mut self,
        ready: &Ready,
        appends: &[(Sequence, Bytes)],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Up to `limit` stored records of the stream from `from` on, in order.
    fn appended(
        &mut self,
        from: Sequence,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(Sequence, Bytes)>, StoreError>> + Send;

    /// Whether other writers may have appended since the last call (`true`
    /// the first time).
    fn changed(&mut self) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Called on every pass of the relay: whether the stream is still this
    /// store's; [`StoreError::Fenced`] or [`StoreError::Closed`] stops the
    /// relay.
    fn keep(&mut self) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { Ok(()) }
    }

    /// Until when the stream surely stays this store's, for a store that
    /// holds it by a lease that runs out (PostgreSQL's): `Some(until)`
    /// while it is held, an instant in the past once it ran out with no
    /// renewal, `None` once another store took it. `None` here for a
    /// store that holds its stream until another takes it (SQLite's).
    fn lease(&self) -> Option<tokio::sync::watch::Receiver<Option<tokio::time::Instant>>> {
        None
    }

    /// A future that completes when the store has news (a notification),
    /// if it can tell; the relay also polls.
    fn news(&self) -> impl Future<Output = ()> + Send + 'static {
        std::future::pending()
    }

    /// A clean close, after the relay's last commit.
    fn close(&mut self) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { Ok(()) }
    }

    /// The stream's name, for the relay's events.
    fn stream(&self) -> &str;
}

/// The [`Outbox`](crate::Outbox) appends this process opened on one stream
/// name: a relay of the stream watches closely for their commits, so that
/// an append is adopted within a millisecond or so of its commit rather
/// than at the next poll. SQLite cannot tell another connection of a
/// commit, and the application's transaction commits after the append
/// returns, so the relay polls the cheap `PRAGMA data_version` every
/// [`HOT_POLL`] for [`HOT_FOR`] after an append opened.
#[derive(Debug, Default)]
pub(crate) struct Appends {
    opened: Notify,
    last: Mutex<Option<std::time::Instant>>,
}

/// How often a relay looks for a commit while an append of its stream is
/// recent.
const HOT_POLL: Duration = Duration::from_millis(1);
/// How long after an append opened its relay looks that often.
const HOT_FOR: Duration = Duration::from_secs(1);

impl Appends {
    /// The entry of `stream`: one per stream name an outbox or relay of this
    /// process used (the bound is the application's streams).
    pub(crate) fn of(stream: &str) -> Arc<Appends> {
        static ALL: std::sync::LazyLock<Mutex<std::collections::HashMap<String, Arc<Appends>>>> =
            std::sync::LazyLock::new(Mutex::default);
        let mut all = ALL.lock();
        match all.get(stream) {
            Some(appends) => appends.clone(),
            None => all.entry(stream.to_owned()).or_default().clone(),
        }
    }

    /// An append opened: its relay watches closely for the commit.
    pub(crate) fn opened(&self) {
        *self.last.lock() = Some(std::time::Instant::now());
        self.opened.notify_waiters();
    }

    /// Completes at the next close look: after [`HOT_POLL`] while an append
    /// is recent, else once one opens.
    async fn news(self: Arc<Self>) {
        loop {
            let opened = self.opened.notified();
            tokio::pin!(opened);
            opened.as_mut().enable();
            if self.last.lock().is_some_and(|t| t.elapsed() < HOT_FOR) {
                tokio::time::sleep(HOT_POLL).await;
                return;
            }
            opened.await;
        }
    }
}

/// A [`SqliteStore`] and one of its streams, as a [`JournalStore`]: every
/// call runs on a blocking thread.
#[derive(Debug, Clone)]
pub struct SqliteJournal {
    store: Arc<Mutex<SqliteStore>>,
    stream: Arc<str>,
    appends: Arc<Appends>,
    /// When [`keep`](JournalStore::keep) next asks whether the stream is
    /// still this store's.
    check_at: tokio::time::Instant,
}

/// How often a relay with nothing to write asks whether its stream was
/// taken over (a write would find out at once).
const OWNER_CHECK: std::time::Duration = std::time::Duration::from_millis(100);

impl SqliteJournal {
    /// `stream` of `store` (a store that has [`load`](SqliteStore::load)ed
    /// it).
    pub fn new(store: SqliteStore, stream: impl Into<String>) -> Self {
        let stream: String = stream.into();
        SqliteJournal {
            store: Arc::new(Mutex::new(store)),
            appends: Appends::of(&stream),
            stream: stream.into(),
            check_at: tokio::time::Instant::now(),
        }
    }

    /// Runs `f` on the store on a blocking thread.
    async fn blocking<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut SqliteStore, &str) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let (store, stream) = (self.store.clone(), self.stream.clone());
        match tokio::task::spawn_blocking(move || f(&mut store.lock(), &stream)).await {
            Ok(result) => result,
            Err(e) => Err(StoreError::Task(e.to_string())),
        }
    }
}

impl JournalStore for SqliteJournal {
    async fn apply(&mut self, ready: &Ready, appends: &[(Sequence, Bytes)]) -> Result<(), StoreError> {
        let (ready, appends) = (ready.clone(), appends.to_vec());
        self.blocking(move |st, stream| st.apply(stream, &ready, &appends)).await
    }

    async fn appended(&mut self, from: Sequence, limit: usize) -> Result<Vec<(Sequence, Bytes)>, StoreError> {
        self.blocking(move |st, stream| st.appended(stream, from, limit)).await
    }

    async fn changed(&mut self) -> Result<bool, StoreError> {
        self.blocking(|st, _| st.changed()).await
    }

    /// Asks (at most every 100 ms) whether another store loaded
    /// the stream: a relay that has nothing to write learns of a takeover
    /// too, and stops.
    async fn keep(&mut self) -> Result<(), StoreError> {
        let now = tokio::time::Instant::now();
        if now < self.check_at {
            return Ok(());
        }
        self.check_at = now + OWNER_CHECK;
        self.blocking(|st, stream| st.owns(stream)).await
    }

    fn news(&self) -> impl Future<Output = ()> + Send + 'static {
        self.appends.clone().news()
    }

    async fn close(&mut self) -> Result<(), StoreError> {
        self.blocking(|st, _| st.checkpoint()).await
    }

    fn stream(&self) -> &str {
        &self.stream
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{Appends, HOT_FOR};

    #[tokio::test(flavor = "current_thread")]
    async fn news_waits_for_an_append_then_looks_every_millisecond_while_it_is_recent() {
        let appends = Arc::new(Appends::default());
        // Nothing opened: no news, however long (here 50 ms).
        let quiet = tokio::time::timeout(Duration::from_millis(50), appends.clone().news()).await;
        assert!(quiet.is_err(), "no append, no news");
        // An append opens while the relay waits: news, within a moment.
        let waiting = tokio::spawn(appends.clone().news());
        tokio::task::yield_now().await;
        appends.opened();
        tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("news after an append").expect("joined");
        // Recent: every look is news after a millisecond.
        for _ in 0..3 {
            tokio::time::timeout(Duration::from_secs(10), appends.clone().news()).await.expect("a close look");
        }
        // Long past: quiet again.
        *appends.last.lock() = Some(std::time::Instant::now() - HOT_FOR - Duration::from_millis(1));
        let quiet = tokio::time::timeout(Duration::from_millis(50), appends.clone().news()).await;
        assert!(quiet.is_err(), "an old append is no news");
        // One entry per stream name.
        assert!(Arc::ptr_eq(&Appends::of("s"), &Appends::of("s")));
        assert!(!Arc::ptr_eq(&Appends::of("s"), &Appends::of("t")));
    }
}
