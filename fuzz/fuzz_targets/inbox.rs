//! Any bytes, read as operations of several producers on the receiver's
//! state machine (handshakes with hostile numbers, frames in and out of
//! order, takes, commits, give-backs, closes, time): nothing panics, and
//! after every step its bookkeeping agrees with what it holds, within its
//! bounds, and no ack covers a delivery given back.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    egress_ws::fuzz_inbox(data);
});
