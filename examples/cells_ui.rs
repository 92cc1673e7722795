//! An `EgressCell` on a `Context`, shaped like a UI loop: a chat screen with
//! one status line per message ("sending...", "sent", "retrying in 200 ms",
//! "failed - tap to retry"), all derived from the cell's readers.
//!
//! `cargo run --example cells_ui`
//!
//! The "network" is simulated and the clock is manual, so the run is the
//! same every time: a send fails transiently (backoff, then the retry timer),
//! one message is refused permanently (a dead letter the user requeues), and
//! the connection drops once (reconnect, replay under the next generation).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use egress::{
    CellOptions, Context, Delay, EgressCell, Envelope, FailureKind, Generation, ManualClock, Policy, SendError,
    Sequence, Transport,
};

/// The simulated connection: what was sent and not yet acknowledged by the
/// peer, and the failures to inject, by sequence.
#[derive(Default)]
struct Wire {
    in_flight: VecDeque<Envelope<String>>,
    fail: Vec<(u64, FailureKind)>,
}

struct Link(Rc<RefCell<Wire>>);

impl Transport<String> for Link {
    fn send(&mut self, envelope: Envelope<String>) -> Result<(), SendError> {
        let mut wire = self.0.borrow_mut();
        if let Some(i) = wire.fail.iter().position(|(s, _)| *s == envelope.sequence.get()) {
            let (_, kind) = wire.fail.remove(i);
            return Err(SendError::new(kind, "simulated"));
        }
        println!("    wire: {} ({}) \"{}\"", envelope.sequence, envelope.attempt, envelope.payload);
        wire.in_flight.push_back(envelope);
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cx = Context::new();
    let clock = ManualClock::new();
    let policy = Policy::builder()
        .inflight_limit(3)
        .retry_budget(3)
        .retry_base(Delay(200))
        .retry_ceiling(Delay(2_000))
        .build()?;
    let cell: EgressCell<String> =
        EgressCell::with_options(&cx, policy, CellOptions::new().generation(Generation(1)).clock(clock.clone()));

    // The UI: one status line per message, derived from the readers.
    let screen = cx.computed({
        let cell = cell.clone();
        move || {
            let mut lines: Vec<(u64, String)> = Vec::new();
            let acked = cell.acked_through().get();
            for e in cell.pending().get().iter() {
                lines.push((e.sequence.get(), format!("{:<14} sending...", e.payload)));
            }
            for e in cell.inflight().get().iter() {
                lines.push((e.sequence.get(), format!("{:<14} sent, waiting for the peer", e.payload)));
            }
            for p in cell.parked().get().iter() {
                let wait = p.due.get().saturating_sub(cell.now().get());
                lines.push((p.sequence.get(), format!("{:<14} retrying in {wait} ms", p.payload)));
            }
            for e in cell.exhausted().get().iter() {
                lines.push((e.sequence.get(), format!("{:<14} failed - tap to retry", e.payload)));
            }
            lines.sort();
            let mut out: Vec<String> = lines.into_iter().map(|(s, l)| format!("  #{s} {l}")).collect();
            if let Some(a) = acked {
                out.insert(0, format!("  (delivered through {a})"));
            }
            out.join("\n")
        }
    });
    let badge = cx.computed({
        let (pending, inflight) = (cell.pending_len().clone(), cell.inflight_len().clone());
        move || pending.get() + inflight.get() > 0
    });
    let redraws = Rc::new(RefCell::new(0));
    let _ui = cx.effect({
        let (screen, redraws) = (screen.clone(), redraws.clone());
        move || {
            *redraws.borrow_mut() += 1;
            println!("  ---- screen ----\n{}", screen.get());
        }
    });
    let _badge = cx.effect({
        let badge = badge.clone();
        move || println!("  [badge: {}]", if badge.get() { "sending" } else { "all sent" })
    });

    let wire = Rc::new(RefCell::new(Wire::default()));
    wire.borrow_mut().fail = vec![(1, FailureKind::Transient), (3, FailureKind::Permanent)];
    let mut link = cell.attach(Link(wire.clone()));

    // The peer acknowledges what reached it, cumulatively.
    let peer_acks = |link: &egress::Attachment<String, egress::reactive::Local>, upto: usize| {
        let mut last = None;
        for _ in 0..upto {
            if let Some(e) = wire.borrow_mut().in_flight.pop_front() {
                last = Some(e.sequence);
            }
        }
        if let Some(s) = last {
            println!("> the peer acknowledges through {s}");
            let _ = link.ack(s);
        }
    };

    println!("> the user sends four messages (one batch: one redraw, one sending pass)");
    cx.batch(|| {
        for text in ["hello", "are you there?", "lunch at noon", "bring the file"] {
            cell.enqueue(text.to_string());
        }
    });
    peer_acks(&link, 1);

    println!("> 200 ms later: the retry timer fires");
    clock.advance(Delay(200));
    let due = cell.handle_timeout(cell.now());
    println!("  due again: {due:?}");

    println!("> the connection drops before the peer acknowledges; reconnect");
    cell.reconnect(Generation(2));
    wire.borrow_mut().in_flight.clear();
    link = cell.attach(Link(wire.clone()));
    peer_acks(&link, 3);

    println!("> the user taps \"retry\" on the failed message");
    let dead = cell.exhausted().get()[0].sequence;
    let _ = cell.requeue(link.generation(), dead);
    peer_acks(&link, 3);

    assert_eq!(cell.acked_through().get(), Some(Sequence(3)));
    assert!(!badge.get());
    println!(
        "done: every message delivered; {} redraws, {} attachment runs on the live connection",
        redraws.borrow(),
        link.runs()
    );
    Ok(())
}
