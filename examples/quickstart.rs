//! A guided tour of the delivery state machine: a sender that loses a
//! connection halfway and replays exactly what was not acknowledged.
//!
//! `cargo run --example quickstart`
//!
//! A simulated peer acknowledges cumulatively, fails one send transiently,
//! and the connection drops once; the core fences the old generation and the
//! replay delivers every message, in order, exactly once to the receiving
//! side (which drops the duplicate sequences a replay may carry).

use egress::{
    AckOutcome, ClaimOutcome, Delay, EgressCore, FailOutcome, FailureKind, Generation, JitterSample, Policy, Sequence,
    Time,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let policy =
        Policy::builder().inflight_limit(4).retry_budget(3).retry_base(Delay(50)).retry_ceiling(Delay(400)).build()?;
    let mut core = EgressCore::new(policy);
    let total = 12u64;
    let _ = core.enqueue_all((0..total).map(|i| format!("message {i}")));
    println!("queued {} messages, window {}", core.pending_len(), core.policy().inflight_limit());

    let mut now = Time(0);
    let mut delivered: Vec<Sequence> = Vec::new();
    let mut generation = core.generation();
    let mut round = 0;
    while core.acked_through().is_none_or(|a| a.get() + 1 < total) {
        round += 1;
        // Claim what the window allows; "send" it.
        let mut sent = Vec::new();
        while let ClaimOutcome::Claimed(envelope) = core.claim(generation).outcome {
            println!("  {generation} send {} ({}): {}", envelope.sequence, envelope.attempt, envelope.payload);
            sent.push(envelope.sequence);
        }
        // The peer's answers.
        for &sequence in &sent {
            if sequence == Sequence(5) && round == 2 {
                let failed = core.fail(generation, sequence, FailureKind::Transient, now, JitterSample::ZERO);
                if let FailOutcome::Retrying(retry) = failed.outcome {
                    println!("  {sequence} failed; retrying in {} ticks", retry.backoff.get());
                }
                continue;
            }
            if round == 3 {
                // The connection dies before these are acknowledged.
                continue;
            }
            if !delivered.contains(&sequence) {
                delivered.push(sequence);
            }
        }
        if round == 3 {
            generation = Generation(generation.get() + 1);
            let replay = core.reconnect(generation);
            println!("  connection lost; reconnect -> {:?}", replay.outcome);
            continue;
        }
        // Cumulative ack: through the longest delivered prefix.
        delivered.sort();
        let prefix = delivered.iter().enumerate().take_while(|(i, s)| s.get() == *i as u64).count();
        if prefix > 0 {
            let ack = core.ack(generation, Sequence(prefix as u64 - 1));
            if let AckOutcome::Advanced { through } = ack.outcome {
                println!("  ack through {through}; in flight {}, pending {}", core.inflight_len(), core.pending_len());
            }
        }
        // Advance the clock to the next retry, if one is waiting.
        if let Some(due) = core.poll_timeout() {
            now = due;
            let scheduled = core.handle_timeout(now).outcome;
            println!("  {now}: retry due for {scheduled:?}");
        }
    }
    println!(
        "delivered {} of {total}; acked through {:?}; pending {}, in flight {}, parked {}",
        delivered.len(),
        core.acked_through().map(Sequence::get),
        core.pending_len(),
        core.inflight_len(),
        core.parked_len()
    );
    assert_eq!(delivered.len() as u64, total, "every message is delivered");
    Ok(())
}
