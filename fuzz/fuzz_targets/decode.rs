//! Any bytes: decoding never panics, and whatever decodes re-encodes to the
//! same bytes (one encoding per frame).
#![no_main]

use bytes::Bytes;
use egress_ws::protocol::{Frame, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let bytes = Bytes::copy_from_slice(data);
    if let Ok(frame) = Frame::decode(&bytes, Limits { max_payload: 4_096 }) {
        assert_eq!(frame.encode(), bytes);
    }
});
