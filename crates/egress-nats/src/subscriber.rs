//! The consuming side: a JetStream stream's egress records handed to the
//! application in order and once per producer, each acknowledged to the
//! broker when the application acknowledges it.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::Context;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use bytes::Bytes;
use egress_core::{DeadReason, Incarnation, Resume};
use futures_util::StreamExt as _;

use crate::stamp::Stamp;

/// How a [`Subscriber`] consumes.
#[derive(Clone, Debug)]
pub struct SubscriberConfig {
    /// The durable consumer's name: the broker keeps its acknowledgement
    /// floor across restarts. One subscriber per name at a time (a new one
    /// takes the consumer over).
    pub durable: String,
    /// Messages taken from the broker and not yet acknowledged to it, at
    /// most: the bound of what the subscriber holds (deliveries waiting,
    /// records waiting above a gap).
    pub max_ack_pending: usize,
    /// How long the broker waits for an acknowledgement before sending a
    /// message again (the subscriber ignores a copy of one it holds).
    pub ack_wait: Duration,
    /// How long a record may wait above a gap before the subscriber gives
    /// the gap up (the missing records were discarded by the stream's
    /// limits, or never written): it then goes on past it and says so
    /// ([`Delivery::skipped`], [`SubscriberStats::skipped`]). It also gives
    /// the oldest gap up at once when it holds `max_ack_pending` messages,
    /// since the broker sends nothing more then.
    pub gap_timeout: Duration,
    /// Where each producer's stream resumes, as the application stored it
    /// with its effects ([`Delivery::position`]): what makes delivery
    /// exactly once across the application's restarts. A producer stream
    /// not named here starts at the first of its records the consumer
    /// reads.
    pub positions: Vec<Position>,
    /// How long a producer stream's state is kept once every record of it
    /// was acknowledged and none came since; then it is evicted, so that a
    /// subscriber that lives through many producer restarts (each a new
    /// incarnation) holds state only for the recent ones. A record of an
    /// evicted stream starts it again: at [`resume`](Self::resume)'s
    /// record if there is one (exactly once), otherwise at that record (a
    /// copy of an older one arriving later is then handed out again).
    /// [`Duration::MAX`]: never.
    pub lane_idle: Duration,
    /// The application's durable record of where each producer stream
    /// resumes (the same trait the WebSocket receiver takes; egress-store's
    /// `ReceivedLog` is one): asked, on a blocking thread, for a stream the
    /// subscriber holds no state of and [`positions`](Self::positions) do
    /// not name.
    pub resume: Option<Arc<dyn Resume>>,
}

impl SubscriberConfig {
    /// The defaults for durable consumer `durable`.
    pub fn new(durable: impl Into<String>) -> Self {
        SubscriberConfig {
            durable: durable.into(),
            max_ack_pending: 4096,
            ack_wait: Duration::from_secs(30),
            gap_timeout: Duration::from_secs(30),
            positions: Vec::new(),
            lane_idle: Duration::from_secs(600),
            resume: None,
        }
    }
}

/// Where a producer's stream resumes: the first sequence the application
/// has not processed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Position {
    /// The producer id.
    pub producer: String,
    /// Its incarnation.
    pub incarnation: u128,
    /// The first sequence not processed.
    pub next: u64,
}

/// What a delivery carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// The application's bytes.
    Message(Bytes),
    /// The producer gave up on this sequence (a dead letter): there is no
    /// message, and the stream goes on past it.
    Skipped(DeadReason),
}

/// Why the subscriber could not go on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubscribeError {
    /// Setting up the consumer failed.
    #[error("consumer: {0}")]
    Consumer(String),
    /// Reading messages failed (the client reconnects; calling
    /// [`Subscriber::next`] again goes on).
    #[error("messages: {0}")]
    Messages(String),
    /// The message stream ended.
    #[error("the consumer's message stream ended")]
    Ended,
    /// Acknowledging to the broker failed: the broker sends the message
    /// again after `ack_wait`, and the subscriber's sequence check drops
    /// the copy.
    #[error("acknowledge: {0}")]
    Ack(String),
    /// The application's durable record ([`SubscriberConfig::resume`])
    /// could not say where a producer stream resumes: the record that
    /// asked is kept, and calling [`Subscriber::next`] again asks again.
    #[error("resume: {0}")]
    Resume(String),
}

/// Counters of a subscriber's work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubscriberStats {
    /// Deliveries the application acknowledged.
    pub delivered: u64,
    /// Copies dropped: a sequence delivered or queued before.
    pub duplicates: u64,
    /// Messages without egress headers, acknowledged and dropped.
    pub foreign: u64,
    /// Takeover claims passed over (messages that are no record).
    pub claims: u64,
    /// Sequences given up: gaps that did not fill within `gap_timeout`
    /// (or while the subscriber held all it may).
    pub skipped: u64,
    /// Producer streams whose state was evicted after `lane_idle`.
    pub evicted: u64,
    /// Messages of the JetStream stream the subscriber never received:
    /// stream sequences missing between its floor and the first message
    /// it read, or between two it read (discarded by the stream's limits,
    /// or deleted). Which producers they were from cannot be told; after a
    /// hole at the start of a new consumer, what lies below a producer
    /// stream's first record is reported per producer (see
    /// [`Delivery::skipped`] and docs/nats.md).
    pub discarded: u64,
}

/// A record taken from the broker.
struct Item {
    key: Key,
    /// Sequences given up right before this one.
    gap: Option<std::ops::Range<u64>>,
    stamp: Stamp,
    payload: Bytes,
    stream_sequence: u64,
    message: async_nats::jetstream::Message,
}

type Key = (Arc<str>, u128);

/// One producer stream's progress.
struct Lane {
    /// The first sequence not yet queued for delivery.
    handed: u64,
    /// Records above a gap, waiting for it.
    buffer: BTreeMap<u64, Item>,
    /// Since when the buffer has waited (`None`: empty).
    waiting_since: Option<tokio::time::Instant>,
    /// Its records queued for the application or held by it.
    live: usize,
    /// Since when nothing of it is held here (`None`: something is), as
    /// entered in `Subscriber::idle`.
    idle_since: Option<tokio::time::Instant>,
}

impl Lane {
    fn new(handed: u64) -> Lane {
        Lane { handed, buffer: BTreeMap::new(), waiting_since: None, live: 0, idle_since: None }
    }

    /// Queues the records that follow `handed` without a gap.
    fn release(&mut self, ready: &mut VecDeque<Item>) {
        while let Some(item) = self.buffer.remove(&self.handed) {
            self.handed = self.handed.saturating_add(1);
            self.live += 1;
            ready.push_back(item);
        }
        self.waiting_since = if self.buffer.is_empty() { None } else { Some(tokio::time::Instant::now()) };
    }
}

/// Reads egress records from a JetStream stream and hands them to the
/// application in sequence order, once, per producer stream (producer id
/// and incarnation); see the crate's docs.
///
/// ```text
///  broker ──(stream order)──▶ per producer: below `handed` → a copy: dropped
///                                          at `handed`    → queued for the application
///                                          above          → waits for the gap
///  next() ──▶ Delivery ──ack()──▶ the broker's acknowledgement (cumulative, up to the
///                                 first message still held)
/// ```
///
/// The consumer is durable with cumulative acknowledgements: the broker
/// acknowledges a message only once every message before it was handled
/// (delivered and acknowledged by the application, or dropped). A
/// subscriber started again resumes at that floor, so the application sees
/// again at most what it had not acknowledged; give it the
/// [`positions`](SubscriberConfig::positions) it stored with its effects
/// and it drops those copies too (exactly once). A [`Delivery`] dropped
/// without [`ack`](Delivery::ack) comes back at the next
/// [`next`](Self::next).
pub struct Subscriber {
    messages: pull::Stream,
    lanes: HashMap<Key, Lane>,
    ready: VecDeque<Item>,
    /// Stream sequences taken in and not yet handled.
    outstanding: BTreeSet<u64>,
    /// Handled messages above the first outstanding one: the highest is
    /// acknowledged (cumulatively) when the ones below it are handled.
    handled: BTreeMap<u64, async_nats::jetstream::Message>,
    /// The highest stream sequence taken in: a copy at or below it is the
    /// broker's redelivery of a message held here.
    seen: u64,
    positions: HashMap<Key, u64>,
    resume: Option<Arc<dyn Resume>>,
    /// The lanes with nothing held here, by since when: the order they are
    /// evicted in.
    idle: BTreeSet<(tokio::time::Instant, Key)>,
    lane_idle: Duration,
    /// A message that could not be sorted yet (the resume record failed,
    /// or a `next` was dropped while it was asked): sorted first at the
    /// next `next`.
    stalled: Option<(async_nats::jetstream::Message, u64)>,
    /// The consumer started at the stream's beginning (floor 0) and its
    /// first message came after a hole: the stream's first messages were
    /// discarded before anything could read them.
    initial_hole: bool,
    max_ack_pending: usize,
    gap_timeout: Duration,
    stats: SubscriberStats,
}

impl std::fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber")
            .field("stats", &self.stats)
            .field("ready", &self.ready.len())
            .field("outstanding", &self.outstanding.len())
            .field("lanes", &self.lanes.len())
            .finish_non_exhaustive()
    }
}

impl Subscriber {
    /// Consumes JetStream stream `stream` through durable consumer
    /// `config.durable`, from the consumer's acknowledgement floor (the
    /// stream's start for a new consumer).
    ///
    /// # Errors
    /// [`SubscribeError::Consumer`]: the stream or the consumer could not
    /// be read or made.
    pub async fn new(js: &Context, stream: &str, config: SubscriberConfig) -> Result<Subscriber, SubscribeError> {
        let consumer_error = |e: &dyn std::fmt::Display| SubscribeError::Consumer(e.to_string());
        let stream = js.get_stream(stream).await.map_err(|e| consumer_error(&e))?;
        // A consumer's unacknowledged messages would come back only after
        // `ack_wait`, after newer ones: it is made again at its floor, so
        // that everything comes in stream order.
        let floor = match stream.get_consumer::<pull::Config>(&config.durable).await {
            Ok(mut consumer) => {
                let floor = consumer.info().await.map_err(|e| consumer_error(&e))?.ack_floor.stream_sequence;
                stream.delete_consumer(&config.durable).await.map_err(|e| consumer_error(&e))?;
                floor
            }
            Err(_) => 0,
        };
        let deliver_policy = match floor {
            0 => DeliverPolicy::All,
            floor => DeliverPolicy::ByStartSequence { start_sequence: floor.saturating_add(1) },
        };
        let consumer = stream
            .create_consumer(pull::Config {
                durable_name: Some(config.durable.clone()),
                ack_policy: AckPolicy::All,
                deliver_policy,
                ack_wait: config.ack_wait,
                max_ack_pending: i64::try_from(config.max_ack_pending.max(1)).unwrap_or(i64::MAX),
                ..Default::default()
            })
            .await
            .map_err(|e| consumer_error(&e))?;
        let messages = consumer.messages().await.map_err(|e| consumer_error(&e))?;
        let positions =
            config.positions.into_iter().map(|p| ((Arc::<str>::from(p.producer), p.incarnation), p.next)).collect();
        Ok(Subscriber {
            messages,
            lanes: HashMap::new(),
            ready: VecDeque::new(),
            outstanding: BTreeSet::new(),
            handled: BTreeMap::new(),
            seen: floor,
            positions,
            resume: config.resume,
            idle: BTreeSet::new(),
            lane_idle: config.lane_idle,
            stalled: None,
            initial_hole: false,
            max_ack_pending: config.max_ack_pending.max(1),
            gap_timeout: config.gap_timeout,
            stats: SubscriberStats::default(),
        })
    }

    /// What it has done so far.
    pub fn stats(&self) -> SubscriberStats {
        self.stats
    }

    /// How many producer streams it holds state for (see
    /// [`SubscriberConfig::lane_idle`]).
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// Evicts the lanes idle for `lane_idle` or longer at `now`.
    fn evict(&mut self, now: tokio::time::Instant) {
        while let Some((since, key)) = self.idle.first().cloned() {
            if now.checked_duration_since(since).is_none_or(|idle| idle < self.lane_idle) {
                return;
            }
            self.idle.pop_first();
            self.lanes.remove(&key);
            // A position the application gave at the start is behind what
            // the lane reached: it must not place the stream again.
            self.positions.remove(&key);
            self.stats.evicted += 1;
            tracing::debug!(producer = %key.0, incarnation = key.1, "egress nats subscriber: an idle producer stream evicted");
        }
    }

    /// Notes that `key`'s lane may have nothing held here any more.
    fn maybe_idle(&mut self, key: &Key) {
        if let Some(lane) = self.lanes.get_mut(key)
            && lane.live == 0
            && lane.buffer.is_empty()
            && lane.idle_since.is_none()
        {
            let now = tokio::time::Instant::now();
            lane.idle_since = Some(now);
            self.idle.insert((now, key.clone()));
        }
    }

    /// Notes that `key`'s lane holds something here again.
    fn busy(&mut self, key: &Key) {
        if let Some(lane) = self.lanes.get_mut(key)
            && let Some(since) = lane.idle_since.take()
        {
            self.idle.remove(&(since, key.clone()));
        }
    }

    /// The next record in its producer's order. It is the application's
    /// until [`Delivery::ack`]; while it is held, no other is handed out
    /// (the borrow says so).
    ///
    /// # Errors
    /// Reading from the broker failed ([`SubscribeError::Messages`]; call
    /// again to go on), or the stream ended.
    pub async fn next(&mut self) -> Result<Delivery<'_>, SubscribeError> {
        if let Some((message, stream_sequence)) = self.stalled.take() {
            self.sort(message, stream_sequence).await?;
        }
        loop {
            self.evict(tokio::time::Instant::now());
            if let Some(item) = self.ready.pop_front() {
                return Ok(Delivery { subscriber: self, item: Some(item) });
            }
            // The broker's unacknowledged messages (held here, or handled
            // above one held) at its limit: it sends nothing more, so the
            // oldest gap cannot fill.
            if self.outstanding.len() + self.handled.len() >= self.max_ack_pending && self.skip_oldest_gap() {
                continue;
            }
            let oldest = self.lanes.values().filter_map(|l| l.waiting_since).min();
            let next = match oldest {
                Some(since) => match tokio::time::timeout_at(since + self.gap_timeout, self.messages.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        self.skip_oldest_gap();
                        continue;
                    }
                },
                None => self.messages.next().await,
            };
            let message = match next {
                Some(Ok(message)) => message,
                Some(Err(e)) => return Err(SubscribeError::Messages(e.to_string())),
                None => return Err(SubscribeError::Ended),
            };
            self.take_in(message).await?;
        }
    }

    /// Sorts a message from the broker: a copy of one held here is
    /// ignored; a foreign one or a sequence seen before is handled at
    /// once; the next of its producer is queued; one above a gap waits.
    async fn take_in(&mut self, message: async_nats::jetstream::Message) -> Result<(), SubscribeError> {
        let Ok(info) = message.info() else {
            // Not a consumer's message (no reply subject to parse): it
            // cannot be acknowledged either.
            self.stats.foreign += 1;
            return Ok(());
        };
        let stream_sequence = info.stream_sequence;
        if stream_sequence <= self.seen {
            return Ok(());
        }
        // A hole in the stream sequences: messages discarded (or deleted)
        // before this subscriber read them. At the very start of a new
        // consumer (nothing read, nothing below its floor delivered by an
        // earlier one), it is the stream's first messages that are gone.
        let hole = stream_sequence - self.seen - 1;
        if hole > 0 && self.seen == 0 {
            self.initial_hole = true;
        }
        self.stats.discarded = self.stats.discarded.saturating_add(hole);
        self.seen = stream_sequence;
        self.outstanding.insert(stream_sequence);
        self.sort(message, stream_sequence).await
    }

    /// Sorts a message taken in (its stream sequence outstanding): see
    /// [`take_in`](Self::take_in).
    async fn sort(
        &mut self,
        mut message: async_nats::jetstream::Message,
        stream_sequence: u64,
    ) -> Result<(), SubscribeError> {
        let stamp = match message.headers.as_ref().map(Stamp::from_headers) {
            Some(Ok(stamp)) => stamp,
            Some(Err(e)) => {
                tracing::warn!(error = %e, stream_sequence, "egress nats subscriber: not an egress record; dropped");
                self.stats.foreign += 1;
                return self.handle(stream_sequence, message).await;
            }
            None => {
                tracing::warn!(stream_sequence, "egress nats subscriber: a message without headers; dropped");
                self.stats.foreign += 1;
                return self.handle(stream_sequence, message).await;
            }
        };
        if stamp.claim {
            // A takeover's claim: no record.
            self.stats.claims += 1;
            return self.handle(stream_sequence, message).await;
        }
        if stamp.sequence == u64::MAX {
            // No stream reaches it (a cell's counter would overflow first),
            // and a position past it cannot be said: a forged record.
            tracing::warn!(stream_sequence, "egress nats subscriber: a record at sequence 2^64 - 1; dropped");
            self.stats.foreign += 1;
            return self.handle(stream_sequence, message).await;
        }
        let key: Key = (Arc::from(stamp.producer.as_str()), stamp.incarnation);
        // What lies below a stream's first record read is taken as lost
        // only after the stream's first messages were discarded, and only
        // while no stream has been evicted (after that, a stream met again
        // may be one this subscriber held and delivered before).
        let lost_below = self.initial_hole && self.stats.evicted == 0;
        if !self.lanes.contains_key(&key) {
            let start = match self.positions.remove(&key) {
                Some(next) => next,
                None => {
                    // Parked while the record is asked (on a blocking
                    // thread): a `next` dropped meanwhile (a timeout around
                    // it) leaves the message to the next call, still
                    // outstanding, so nothing is lost.
                    self.stalled = Some((message, stream_sequence));
                    let asked = self.resumed(&key).await;
                    let Some((parked, _)) = self.stalled.take() else { return Ok(()) };
                    message = parked;
                    match asked {
                        // Nothing says where it starts: at this record (or
                        // at 0, when what lies below is taken as lost).
                        Ok(next) => next.unwrap_or(if lost_below { 0 } else { stamp.sequence }),
                        Err(e) => {
                            // Sorted again at the next `next`.
                            self.stalled = Some((message, stream_sequence));
                            return Err(e);
                        }
                    }
                }
            };
            self.lanes.insert(key.clone(), Lane::new(start));
        }
        self.busy(&key);
        let Some(lane) = self.lanes.get_mut(&key) else { return Ok(()) };
        let sequence = stamp.sequence;
        if sequence < lane.handed || lane.buffer.contains_key(&sequence) {
            self.stats.duplicates += 1;
            self.maybe_idle(&key);
            return self.handle(stream_sequence, message).await;
        }
        let payload = message.payload.clone();
        let mut item = Item { key, gap: None, stamp, payload, stream_sequence, message };
        if sequence > lane.handed && lane.handed == 0 && lane.buffer.is_empty() && lost_below {
            // A new stream whose first record read is above 0, after the
            // stream discarded messages: those below it cannot come any
            // more. Given up at once (not after `gap_timeout`).
            let gap = 0..sequence;
            tracing::warn!(?gap, producer = %item.stamp.producer, "egress nats subscriber: records discarded by the stream before they were read");
            self.stats.skipped = self.stats.skipped.saturating_add(sequence);
            item.gap = Some(gap);
            lane.handed = sequence;
        }
        if sequence > lane.handed {
            lane.buffer.insert(sequence, item);
            lane.waiting_since.get_or_insert_with(tokio::time::Instant::now);
            return Ok(());
        }
        lane.handed = sequence.saturating_add(1);
        lane.live += 1;
        self.ready.push_back(item);
        lane.release(&mut self.ready);
        Ok(())
    }

    /// Where the application's durable record says `key`'s stream resumes.
    async fn resumed(&self, key: &Key) -> Result<Option<u64>, SubscribeError> {
        let Some(resume) = self.resume.clone() else { return Ok(None) };
        let (producer, incarnation) = (key.0.clone(), Incarnation(key.1));
        match tokio::task::spawn_blocking(move || resume.resume(&producer, incarnation)).await {
            Ok(Ok(next)) => Ok(next),
            Ok(Err(e)) => Err(SubscribeError::Resume(e)),
            Err(e) => Err(SubscribeError::Resume(format!("the record panicked: {e}"))),
        }
    }

    /// Gives up the gap that has waited longest: its lane goes on from the
    /// lowest record it holds. Returns whether there was one.
    fn skip_oldest_gap(&mut self) -> bool {
        let Some(lane) = self.lanes.values_mut().filter(|l| l.waiting_since.is_some()).min_by_key(|l| l.waiting_since)
        else {
            return false;
        };
        let Some((&first, _)) = lane.buffer.first_key_value() else { return false };
        let gap = lane.handed..first;
        tracing::warn!(?gap, "egress nats subscriber: a gap did not fill; going on past it");
        self.stats.skipped = self.stats.skipped.saturating_add(gap.end - gap.start);
        if let Some(item) = lane.buffer.get_mut(&first) {
            item.gap = Some(gap);
        }
        lane.handed = first;
        lane.release(&mut self.ready);
        true
    }

    /// Marks a message handled, and acknowledges to the broker the highest
    /// handled one below every message still held.
    async fn handle(
        &mut self,
        stream_sequence: u64,
        message: async_nats::jetstream::Message,
    ) -> Result<(), SubscribeError> {
        self.outstanding.remove(&stream_sequence);
        self.handled.insert(stream_sequence, message);
        let floor = self.outstanding.first().copied().unwrap_or(u64::MAX);
        let Some(&highest) = self.handled.range(..floor).next_back().map(|(s, _)| s) else {
            return Ok(());
        };
        let rest = self.handled.split_off(&highest.saturating_add(1));
        let below = std::mem::replace(&mut self.handled, rest);
        if let Some((_, message)) = below.into_iter().next_back() {
            message.ack().await.map_err(|e| SubscribeError::Ack(e.to_string()))?;
        }
        Ok(())
    }
}

/// A record for the application: see [`Subscriber::next`].
pub struct Delivery<'a> {
    subscriber: &'a mut Subscriber,
    item: Option<Item>,
}

impl std::fmt::Debug for Delivery<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery").field("stamp", &self.item.as_ref().map(|i| &i.stamp)).finish_non_exhaustive()
    }
}

impl Delivery<'_> {
    fn item(&self) -> &Item {
        self.item.as_ref().expect("a delivery holds its item until acknowledged or dropped")
    }

    /// Its stamp: the producer, incarnation, sequence and generation.
    pub fn stamp(&self) -> &Stamp {
        &self.item().stamp
    }

    /// Its sequence in its producer's stream.
    pub fn sequence(&self) -> u64 {
        self.item().stamp.sequence
    }

    /// What it carries.
    pub fn content(&self) -> Content {
        let item = self.item();
        match item.stamp.dead {
            Some(reason) => Content::Skipped(reason),
            None => Content::Message(item.payload.clone()),
        }
    }

    /// The sequences of its producer given up right before it (a gap that
    /// did not fill within `gap_timeout`), if any.
    pub fn skipped(&self) -> Option<std::ops::Range<u64>> {
        self.item().gap.clone()
    }

    /// Its stream sequence in the JetStream stream.
    pub fn stream_sequence(&self) -> u64 {
        self.item().stream_sequence
    }

    /// Where its producer's stream resumes once it is processed: what the
    /// application stores with its effect (in the same transaction) and
    /// gives back in [`SubscriberConfig::positions`] after a restart.
    pub fn position(&self) -> Position {
        let stamp = &self.item().stamp;
        Position {
            producer: stamp.producer.clone(),
            incarnation: stamp.incarnation,
            next: stamp.sequence.saturating_add(1),
        }
    }

    /// The application processed it: the broker is told (cumulatively,
    /// once nothing before it is held).
    ///
    /// # Errors
    /// [`SubscribeError::Ack`]: the broker was not told; it sends the
    /// message again after `ack_wait`, and the copy is dropped.
    pub async fn ack(mut self) -> Result<(), SubscribeError> {
        let item = self.item.take().expect("a delivery holds its item until acknowledged or dropped");
        let sub = &mut *self.subscriber;
        sub.stats.delivered += 1;
        if let Some(lane) = sub.lanes.get_mut(&item.key) {
            lane.live = lane.live.saturating_sub(1);
        }
        sub.maybe_idle(&item.key);
        sub.handle(item.stream_sequence, item.message).await
    }
}

impl Drop for Delivery<'_> {
    fn drop(&mut self) {
        // Not acknowledged: it comes back first.
        if let Some(item) = self.item.take() {
            self.subscriber.ready.push_front(item);
        }
    }
}
