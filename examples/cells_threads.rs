//! A `ThreadSafeEgressCell` fed by producer threads: four sensors enqueue
//! readings concurrently, one attachment sends them over a channel to a
//! collector thread, which acknowledges cumulatively; the main thread
//! watches the backlog through the cell's counts.
//!
//! `cargo run --example cells_threads`

use std::sync::mpsc;
use std::thread;

use egress::{
    Delay, Envelope, Generation, Policy, SendError, Sequence, ThreadSafeContext, ThreadSafeEgressCell, Transport,
};

/// Sends each envelope to the collector thread.
struct ToCollector(mpsc::Sender<Envelope<String>>);

impl Transport<String> for ToCollector {
    fn send(&mut self, envelope: Envelope<String>) -> Result<(), SendError> {
        self.0.send(envelope).map_err(|_| SendError::transient("the collector is gone"))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const SENSORS: u32 = 4;
    const READINGS: u32 = 2_500;
    let cx = ThreadSafeContext::new();
    let policy = Policy::builder().inflight_limit(64).retry_base(Delay(10)).build()?;
    let cell: ThreadSafeEgressCell<String> = ThreadSafeEgressCell::new(&cx, policy);

    // The dashboard: an effect over "is there a backlog?", which re-runs only
    // when the answer changes (the count's equality cut-off reaches it).
    let busy = cx.computed({
        let (pending, inflight) = (cell.pending_len().clone(), cell.inflight_len().clone());
        move || pending.get() + inflight.get() > 0
    });
    let _dashboard = cx.effect({
        let busy = busy.clone();
        move || println!("dashboard: {}", if busy.get() { "sending" } else { "idle" })
    });

    let (to_collector, wire) = mpsc::channel::<Envelope<String>>();
    let (acks, acked) = mpsc::channel::<(Generation, Sequence)>();
    let collector = thread::spawn(move || {
        let mut received = Vec::new();
        for envelope in wire {
            received.push(envelope.payload);
            // Acknowledge every 16th, and whenever the wire runs dry.
            if received.len() % 16 == 0 || envelope.sequence.get() + 1 == u64::from(SENSORS * READINGS) {
                let _ = acks.send((envelope.generation, envelope.sequence));
            }
        }
        received
    });
    let link = cell.attach(ToCollector(to_collector));

    thread::scope(|s| {
        for sensor in 0..SENSORS {
            let cell = cell.clone();
            s.spawn(move || {
                for i in 0..READINGS {
                    cell.enqueue(format!("sensor {sensor} reading {i}"));
                }
            });
        }
        // Acks come back on this thread while the sensors produce.
        let total = u64::from(SENSORS * READINGS);
        for (generation, through) in acked.iter() {
            let _ = cell.ack(generation, through);
            if through.get() + 1 == total {
                break;
            }
        }
    });
    println!(
        "backlog: {} pending, {} in flight; delivered through {}; the attachment ran {} times",
        cell.pending_len().get(),
        cell.inflight_len().get(),
        cell.acked_through().get().map_or_else(|| "nothing".into(), |s| s.to_string()),
        link.runs()
    );
    drop(link); // closes the channel: the collector finishes
    let received = collector.join().map_err(|_| "the collector panicked")?;
    let mut per_sensor = [0u32; SENSORS as usize];
    for r in &received {
        let sensor: usize = r["sensor ".len()..].split(' ').next().and_then(|s| s.parse().ok()).unwrap_or(0);
        per_sensor[sensor] += 1;
    }
    println!("collector: {} readings, per sensor {per_sensor:?}", received.len());
    assert_eq!(received.len() as u32, SENSORS * READINGS);
    Ok(())
}
