//! An `AsyncEgressCell` over a tokio channel to a flaky peer.
//!
//! `cargo run --example cells_async`
//!
//! The peer loses some frames in transit and acknowledges only the
//! contiguous prefix it has, every few frames; connections also die now and
//! then. A supervisor watches the cell: when acknowledgements stop while
//! something is unacknowledged, it fences the connection (`reconnect` under
//! the next generation) and attaches a fresh one, whose first run replays
//! exactly what was unacknowledged. The peer drops the duplicates a replay
//! carries. Seeded: the same run every time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress::{AsyncContext, AsyncEgressCell, AsyncTransport, Delay, Envelope, Generation, Policy, SendError, Sequence};
use tokio::sync::mpsc;

/// One connection's sending half.
struct Connection(mpsc::UnboundedSender<Envelope<String>>);

impl AsyncTransport<String> for Connection {
    async fn send(&mut self, envelope: Envelope<String>) -> Result<(), SendError> {
        self.0.send(envelope).map_err(|_| SendError::transient("connection closed"))
    }
}

/// What the receiving application has, across connections.
#[derive(Default)]
struct Peer {
    delivered: Vec<String>,
    out_of_order: BTreeMap<u64, String>,
    duplicates: u64,
    lost_in_transit: u64,
    rng: u64,
}

impl Peer {
    fn chance(&mut self, percent: u64) -> bool {
        // xorshift64*: the peer's seeded dice.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % 100 < percent
    }
}

/// The peer's side of one connection: takes frames, acknowledges the
/// contiguous prefix every 8 frames, and sometimes hangs up.
async fn serve(
    peer: Arc<Mutex<Peer>>,
    mut frames: mpsc::UnboundedReceiver<Envelope<String>>,
    acks: mpsc::UnboundedSender<(Generation, Sequence)>,
) {
    let mut since_ack = 0;
    while let Some(e) = frames.recv().await {
        let ack = {
            let mut p = peer.lock().expect("peer");
            if p.chance(1) {
                return; // the connection dies
            }
            if p.chance(3) {
                p.lost_in_transit += 1;
                continue;
            }
            let next = p.delivered.len() as u64;
            let s = e.sequence.get();
            if s < next || p.out_of_order.contains_key(&s) {
                p.duplicates += 1;
            } else {
                p.out_of_order.insert(s, e.payload);
                loop {
                    let want = p.delivered.len() as u64;
                    let Some(payload) = p.out_of_order.remove(&want) else { break };
                    p.delivered.push(payload);
                }
            }
            since_ack += 1;
            let have = p.delivered.len() as u64;
            (since_ack >= 8 || frames.is_empty()) && have > 0
        };
        if ack {
            since_ack = 0;
            let through = peer.lock().expect("peer").delivered.len() as u64 - 1;
            let _ = acks.send((e.generation, Sequence(through)));
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    const MESSAGES: usize = 2_000;
    let cx = AsyncContext::new();
    let policy = Policy::builder().inflight_limit(32).retry_base(Delay(20)).retry_ceiling(Delay(200)).build()?;
    let cell: AsyncEgressCell<String> = AsyncEgressCell::new(&cx, policy);
    let peer = Arc::new(Mutex::new(Peer { rng: 0x5eed, ..Peer::default() }));
    let (ack_tx, mut ack_rx) = mpsc::unbounded_channel();

    let connect = |generation: Generation| {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(serve(peer.clone(), rx, ack_tx.clone()));
        let _ = cell.reconnect(generation);
        // Records whose retry budget ran out on the dead connection are dead
        // letters; this application gives them a fresh budget on the new one.
        for dead in cell.exhausted().get().iter() {
            let _ = cell.requeue(generation, dead.sequence);
        }
        cell.attach(Connection(tx))
    };
    let mut generation = Generation(0);
    let mut link = connect(generation);
    cell.enqueue_all((0..MESSAGES).map(|i| format!("message {i}")));

    let mut reconnects = 0;
    let mut acked = cell.acked_through().get();
    let mut progress = tokio::time::Instant::now();
    while acked.is_none_or(|a| a.get() + 1 < MESSAGES as u64) {
        tokio::select! {
            Some((g, through)) = ack_rx.recv() => {
                if g == link.generation() {
                    let _ = link.ack(through);
                }
            }
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        let now_acked = cell.acked_through().get();
        if now_acked != acked {
            acked = now_acked;
            progress = tokio::time::Instant::now();
        } else if progress.elapsed() > Duration::from_millis(100) {
            // Stalled with work outstanding: fence this connection, replay.
            generation = Generation(generation.get() + 1);
            reconnects += 1;
            link = connect(generation);
            progress = tokio::time::Instant::now();
        }
    }
    let p = peer.lock().expect("peer");
    let in_order = p.delivered.iter().enumerate().all(|(i, m)| *m == format!("message {i}"));
    println!(
        "delivered {} of {MESSAGES}, exactly once and in order: {}",
        p.delivered.len(),
        if in_order && p.delivered.len() == MESSAGES { "yes" } else { "NO" }
    );
    println!(
        "lost in transit {}, duplicates dropped by the peer {}, reconnects {reconnects}, final generation {}",
        p.lost_in_transit, p.duplicates, generation
    );
    assert!(in_order && p.delivered.len() == MESSAGES);
    assert_eq!(cell.pending_len().get() + cell.inflight_len().get() + cell.parked_len().get(), 0);
    Ok(())
}
