//! The wire protocol: one frame per binary WebSocket message, strictly
//! decoded. The byte layout is specified in docs/protocol.md; this module is
//! its reference implementation.

use bytes::{BufMut, Bytes, BytesMut};
use egress_core::DeadReason;

/// The protocol version this crate speaks.
pub const VERSION: u16 = 2;

/// The four bytes every handshake starts with.
pub const MAGIC: [u8; 4] = *b"EGRS";

/// The longest producer id, in bytes of UTF-8.
pub const MAX_PRODUCER_ID: usize = 255;

/// The longest close reason, in bytes of UTF-8.
pub const MAX_REASON: usize = 1024;

/// The default limit on a data frame's payload.
pub const DEFAULT_MAX_PAYLOAD: usize = 1 << 20;

/// The smallest max-payload a welcome may advertise: a welcome below is a
/// protocol error of the receiver (a receiver that cannot take 1 KiB is
/// misconfigured or hostile, and must not make a producer hold back its
/// records), and [`Receiver::bind`](crate::Receiver::bind) refuses a
/// configuration below it.
pub const MIN_MAX_PAYLOAD: u32 = 1024;

/// Generations at or above this are refused (by a receiver in a handshake,
/// by a producer in a stale-generation close).
pub const GENERATION_LIMIT: u64 = 1 << 63;

/// How far the latest generation a receiver records for a producer id rises
/// per handshake (a handshake further up is admitted, but recorded this far
/// up only), and how far a producer jumps per stale-generation close. So a
/// squatter's handshake cannot put a producer id out of its producer's
/// reach, nor a receiver's close take a producer's generations away: each
/// step of either costs a round trip. A restart without a store jumps once,
/// by the receiver's latest; only a hostile peer needs more.
pub const MAX_GENERATION_JUMP: u64 = 1 << 32;

const HANDSHAKE: u8 = 0x01;
const WELCOME: u8 = 0x02;
const DATA: u8 = 0x03;
const ACK: u8 = 0x04;
const CLOSE: u8 = 0x05;
const TOMBSTONE: u8 = 0x06;

/// One frame of the protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Producer to receiver, first on every connection.
    Handshake {
        /// Who is sending: with the incarnation, the key of the receiver's
        /// state.
        producer: String,
        /// Which sequence space: a producer that starts over from sequence 0
        /// (a restart without a store) uses a new incarnation.
        incarnation: u128,
        /// The connection's generation; strictly higher than any earlier
        /// connection of this producer id.
        generation: u64,
        /// The lowest sequence the producer still holds: everything below
        /// was acknowledged. A receiver with no memory of the stream resumes
        /// it here.
        resume_from: u64,
    },
    /// Receiver to producer, the answer to a handshake.
    Welcome {
        /// The generation accepted.
        generation: u64,
        /// Every sequence below it was delivered to the application and
        /// acknowledged by it: an acknowledgement through `next - 1`.
        next: u64,
        /// Every sequence below it is held by the receiver, acknowledged or
        /// not (at least `next`): the producer need not send those again.
        received: u64,
        /// The receiver's terms.
        terms: Terms,
    },
    /// Producer to receiver: one envelope.
    Data {
        /// The generation of the connection it is sent on.
        generation: u64,
        /// Its place in the producer's stream.
        sequence: u64,
        /// How many times it has been sent, this time included.
        attempt: u32,
        /// The application's bytes.
        payload: Bytes,
    },
    /// Producer to receiver: the sequence is skipped, a dead letter. The
    /// receiver moves past it and tells its application of the gap.
    Tombstone {
        /// The generation of the connection it is sent on.
        generation: u64,
        /// The skipped sequence.
        sequence: u64,
        /// How many times this sequence has been sent, this time included.
        attempt: u32,
        /// Why the producer gave up on it.
        reason: DeadReason,
    },
    /// Receiver to producer: every sequence at or below `through` was
    /// delivered and acknowledged by the application.
    Ack {
        /// The generation of the connection.
        generation: u64,
        /// The cumulative watermark.
        through: u64,
    },
    /// Either side: why the connection ends.
    Close {
        /// What went wrong (see [`CloseCode`]).
        code: CloseCode,
        /// A number the code gives a meaning to (for `StaleGeneration`, the
        /// highest generation the receiver accepted; for `Version`, the
        /// version it speaks), else 0.
        detail: u64,
        /// Words for a log.
        reason: String,
    },
}

/// What a receiver promises and accepts, sent in its welcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Terms {
    /// The largest payload it accepts in a data frame: a producer fails a
    /// larger record as permanent rather than send it.
    pub max_payload: u32,
    /// It sends something (a frame or a WebSocket ping) at least this often
    /// while the connection is open, in milliseconds: a producer may declare
    /// it dead after a few of these without a word.
    pub keepalive_ms: u32,
}

/// Why a connection is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CloseCode {
    /// An orderly end (a shutdown).
    Normal,
    /// The peer sent something this side cannot decode or does not expect.
    Protocol,
    /// The peer speaks another version (`detail`: the version this side
    /// speaks).
    Version,
    /// A newer connection of the same producer replaced this one.
    Fenced,
    /// The connection's generation is not above the producer's latest
    /// (`detail`: that latest).
    StaleGeneration,
    /// The receiver asks the producer to connect again and resume from its
    /// welcome (the reference receiver does not send it).
    Retry,
    /// The receiver is at one of its bounds (the producers it holds);
    /// connect again after the backoff.
    Busy,
    /// Another code, kept as received.
    Other(u16),
}

impl CloseCode {
    /// The code on the wire.
    #[must_use]
    pub const fn to_u16(self) -> u16 {
        match self {
            CloseCode::Normal => 0,
            CloseCode::Protocol => 1,
            CloseCode::Version => 2,
            CloseCode::Fenced => 3,
            CloseCode::StaleGeneration => 4,
            CloseCode::Retry => 5,
            CloseCode::Busy => 6,
            CloseCode::Other(c) => c,
        }
    }

    /// The code for a number on the wire.
    #[must_use]
    pub const fn from_u16(c: u16) -> Self {
        match c {
            0 => CloseCode::Normal,
            1 => CloseCode::Protocol,
            2 => CloseCode::Version,
            3 => CloseCode::Fenced,
            4 => CloseCode::StaleGeneration,
            5 => CloseCode::Retry,
            6 => CloseCode::Busy,
            c => CloseCode::Other(c),
        }
    }
}

const fn reason_code(reason: DeadReason) -> u8 {
    match reason {
        DeadReason::Permanent => 1,
        DeadReason::Retries => 2,
        DeadReason::Replays => 3,
    }
}

const fn reason_of(code: u8) -> Option<DeadReason> {
    match code {
        1 => Some(DeadReason::Permanent),
        2 => Some(DeadReason::Retries),
        3 => Some(DeadReason::Replays),
        _ => None,
    }
}

/// Why bytes are not a frame. Decoding never panics and never allocates
/// more than the limits allow.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// No bytes at all.
    #[error("empty frame")]
    Empty,
    /// The first byte names no frame type.
    #[error("unknown frame type 0x{0:02x}")]
    UnknownType(u8),
    /// The frame ends before its fields do.
    #[error("truncated {frame} frame: {needed} more bytes needed")]
    Truncated {
        /// The frame type.
        frame: &'static str,
        /// How many bytes are missing.
        needed: usize,
    },
    /// Bytes follow the last field.
    #[error("{count} trailing bytes after a {frame} frame")]
    Trailing {
        /// The frame type.
        frame: &'static str,
        /// How many.
        count: usize,
    },
    /// A length field exceeds its limit.
    #[error("{field} of {len} bytes exceeds the limit of {limit}")]
    TooLong {
        /// Which field.
        field: &'static str,
        /// Its declared length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// A handshake that does not start with [`MAGIC`].
    #[error("not an egress handshake (bad magic)")]
    BadMagic,
    /// A handshake or welcome of another version.
    #[error("unsupported protocol version {0} (this side speaks {VERSION})")]
    Version(u16),
    /// A text field that is not UTF-8.
    #[error("{0} is not valid UTF-8")]
    Utf8(&'static str),
    /// A tombstone's reason code names no reason.
    #[error("unknown tombstone reason {0}")]
    UnknownReason(u8),
}

/// Limits applied when decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest payload accepted in a data frame.
    pub max_payload: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_payload: DEFAULT_MAX_PAYLOAD }
    }
}

impl Frame {
    /// The frame's bytes.
    #[must_use]
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        match self {
            Frame::Handshake { producer, incarnation, generation, resume_from } => {
                b.put_u8(HANDSHAKE);
                b.put_slice(&MAGIC);
                b.put_u16(VERSION);
                let id = truncate_utf8(producer, MAX_PRODUCER_ID);
                b.put_u8(u8::try_from(id.len()).unwrap_or(u8::MAX));
                b.put_slice(id.as_bytes());
                b.put_u128(*incarnation);
                b.put_u64(*generation);
                b.put_u64(*resume_from);
            }
            Frame::Welcome { generation, next, received, terms } => {
                b.put_u8(WELCOME);
                b.put_u16(VERSION);
                b.put_u64(*generation);
                b.put_u64(*next);
                b.put_u64(*received);
                b.put_u32(terms.max_payload);
                b.put_u32(terms.keepalive_ms);
            }
            Frame::Data { generation, sequence, attempt, payload } => {
                b.reserve(25 + payload.len());
                b.put_u8(DATA);
                b.put_u64(*generation);
                b.put_u64(*sequence);
                b.put_u32(*attempt);
                b.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
                b.put_slice(payload);
            }
            Frame::Tombstone { generation, sequence, attempt, reason } => {
                b.put_u8(TOMBSTONE);
                b.put_u64(*generation);
                b.put_u64(*sequence);
                b.put_u32(*attempt);
                b.put_u8(reason_code(*reason));
            }
            Frame::Ack { generation, through } => {
                b.put_u8(ACK);
                b.put_u64(*generation);
                b.put_u64(*through);
            }
            Frame::Close { code, detail, reason } => {
                b.put_u8(CLOSE);
                b.put_u16(code.to_u16());
                b.put_u64(*detail);
                let reason = truncate_utf8(reason, MAX_REASON);
                b.put_u16(u16::try_from(reason.len()).unwrap_or(u16::MAX));
                b.put_slice(reason.as_bytes());
            }
        }
        b.freeze()
    }

    /// Decodes one frame, strictly: every field present, nothing after the
    /// last, lengths within `limits`, text in UTF-8.
    ///
    /// # Errors
    /// A [`DecodeError`] saying what is wrong.
    pub fn decode(bytes: &Bytes, limits: Limits) -> Result<Frame, DecodeError> {
        let Some(&kind) = bytes.first() else { return Err(DecodeError::Empty) };
        let name = match kind {
            HANDSHAKE => "handshake",
            WELCOME => "welcome",
            DATA => "data",
            ACK => "ack",
            CLOSE => "close",
            TOMBSTONE => "tombstone",
            other => return Err(DecodeError::UnknownType(other)),
        };
        let mut r = Reader { bytes, at: 1, frame: name };
        let frame = match kind {
            HANDSHAKE => {
                if r.take(4)? != MAGIC {
                    return Err(DecodeError::BadMagic);
                }
                let version = r.u16()?;
                if version != VERSION {
                    return Err(DecodeError::Version(version));
                }
                let len = usize::from(r.u8()?);
                let producer = r.text(len, "producer id")?;
                Frame::Handshake { producer, incarnation: r.u128()?, generation: r.u64()?, resume_from: r.u64()? }
            }
            WELCOME => {
                let version = r.u16()?;
                if version != VERSION {
                    return Err(DecodeError::Version(version));
                }
                Frame::Welcome {
                    generation: r.u64()?,
                    next: r.u64()?,
                    received: r.u64()?,
                    terms: Terms { max_payload: r.u32()?, keepalive_ms: r.u32()? },
                }
            }
            DATA => {
                let generation = r.u64()?;
                let sequence = r.u64()?;
                let attempt = r.u32()?;
                let len = usize::try_from(r.u32()?).unwrap_or(usize::MAX);
                if len > limits.max_payload {
                    return Err(DecodeError::TooLong { field: "payload", len, limit: limits.max_payload });
                }
                let start = r.at;
                let slice = r.take(len)?;
                Frame::Data { generation, sequence, attempt, payload: bytes.slice(start..start + slice.len()) }
            }
            TOMBSTONE => {
                let (generation, sequence, attempt) = (r.u64()?, r.u64()?, r.u32()?);
                let code = r.u8()?;
                let reason = reason_of(code).ok_or(DecodeError::UnknownReason(code))?;
                Frame::Tombstone { generation, sequence, attempt, reason }
            }
            ACK => Frame::Ack { generation: r.u64()?, through: r.u64()? },
            _ => {
                let code = CloseCode::from_u16(r.u16()?);
                let detail = r.u64()?;
                let len = usize::from(r.u16()?);
                if len > MAX_REASON {
                    return Err(DecodeError::TooLong { field: "reason", len, limit: MAX_REASON });
                }
                Frame::Close { code, detail, reason: r.text(len, "reason")? }
            }
        };
        let rest = bytes.len() - r.at;
        if rest > 0 {
            return Err(DecodeError::Trailing { frame: name, count: rest });
        }
        Ok(frame)
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a char
/// boundary.
fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    frame: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            let needed = self.at.saturating_add(n).saturating_sub(self.bytes.len());
            return Err(DecodeError::Truncated { frame: self.frame, needed });
        };
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn u128(&mut self) -> Result<u128, DecodeError> {
        Ok(u128::from_be_bytes(self.array()?))
    }

    fn text(&mut self, len: usize, field: &'static str) -> Result<String, DecodeError> {
        let b = self.take(len)?;
        std::str::from_utf8(b).map(str::to_owned).map_err(|_| DecodeError::Utf8(field))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frames() -> impl Strategy<Value = Frame> {
        prop_oneof![
            ("[a-z0-9é-]{0,40}", any::<u128>(), any::<u64>(), any::<u64>()).prop_map(
                |(producer, incarnation, generation, resume_from)| Frame::Handshake {
                    producer,
                    incarnation,
                    generation,
                    resume_from
                }
            ),
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u32>(), any::<u32>()).prop_map(
                |(generation, next, received, max_payload, keepalive_ms)| Frame::Welcome {
                    generation,
                    next,
                    received,
                    terms: Terms { max_payload, keepalive_ms }
                }
            ),
            (any::<u64>(), any::<u64>(), any::<u32>(), proptest::collection::vec(any::<u8>(), 0..64)).prop_map(
                |(generation, sequence, attempt, p)| Frame::Data { generation, sequence, attempt, payload: p.into() }
            ),
            (any::<u64>(), any::<u64>(), any::<u32>(), prop::sample::select(DeadReason::ALL.to_vec())).prop_map(
                |(generation, sequence, attempt, reason)| Frame::Tombstone { generation, sequence, attempt, reason }
            ),
            (any::<u64>(), any::<u64>()).prop_map(|(generation, through)| Frame::Ack { generation, through }),
            (0u16..8, any::<u64>(), ".{0,30}").prop_map(|(c, detail, reason)| Frame::Close {
                code: CloseCode::from_u16(c),
                detail,
                reason
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn frames_round_trip(frame in frames()) {
            prop_assert_eq!(Frame::decode(&frame.encode(), Limits::default()), Ok(frame));
        }

        #[test]
        fn arbitrary_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let bytes = Bytes::from(bytes);
            if let Ok(frame) = Frame::decode(&bytes, Limits::default()) {
                // Whatever decodes re-encodes to the same bytes: one
                // encoding per frame.
                prop_assert_eq!(frame.encode(), bytes);
            }
        }

        #[test]
        fn every_truncation_and_extension_is_refused(frame in frames(), cut in any::<prop::sample::Index>(), extra in 1u8..) {
            let bytes = frame.encode();
            let at = cut.index(bytes.len());
            prop_assert!(Frame::decode(&bytes.slice(..at), Limits::default()).is_err());
            let mut longer = bytes.to_vec();
            longer.push(extra);
            let trailing = matches!(Frame::decode(&longer.into(), Limits::default()), Err(DecodeError::Trailing { .. }));
            prop_assert!(trailing);
        }
    }

    #[test]
    fn the_example_in_docs_protocol_md_holds() {
        let bytes = Frame::Ack { generation: 3, through: 41 }.encode();
        assert_eq!(&bytes[..], &[4, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0x29]);
    }

    #[test]
    fn limits_and_bad_fields_are_typed_errors() {
        let data = Frame::Data { generation: 1, sequence: 2, attempt: 1, payload: Bytes::from(vec![0; 100]) }.encode();
        assert_eq!(
            Frame::decode(&data, Limits { max_payload: 99 }),
            Err(DecodeError::TooLong { field: "payload", len: 100, limit: 99 })
        );
        // Exactly at the limit is accepted.
        assert!(Frame::decode(&data, Limits { max_payload: 100 }).is_ok());
        let mut hs =
            Frame::Handshake { producer: "p".into(), incarnation: 9, generation: 1, resume_from: 0 }.encode().to_vec();
        hs[1] = b'X';
        assert_eq!(Frame::decode(&hs.clone().into(), Limits::default()), Err(DecodeError::BadMagic));
        hs[1] = b'E';
        hs[6] = 1;
        assert_eq!(Frame::decode(&hs.into(), Limits::default()), Err(DecodeError::Version(1)));
        let bad_utf8 = Bytes::from(vec![CLOSE, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0xff, 0xfe]);
        assert_eq!(Frame::decode(&bad_utf8, Limits::default()), Err(DecodeError::Utf8("reason")));
        assert_eq!(Frame::decode(&Bytes::new(), Limits::default()), Err(DecodeError::Empty));
        assert_eq!(Frame::decode(&Bytes::from_static(&[0x7f]), Limits::default()), Err(DecodeError::UnknownType(0x7f)));
        let bad_reason = Bytes::from(vec![TOMBSTONE, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 9]);
        assert_eq!(Frame::decode(&bad_reason, Limits::default()), Err(DecodeError::UnknownReason(9)));
        // A huge declared payload is refused before anything is allocated.
        let huge =
            Bytes::from(vec![DATA, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(Frame::decode(&huge, Limits::default()), Err(DecodeError::TooLong { .. })));
        // A reason exactly at its limit is accepted; one byte more is not.
        let at_limit = Frame::Close { code: CloseCode::Normal, detail: 0, reason: "r".repeat(MAX_REASON) }.encode();
        assert!(Frame::decode(&at_limit, Limits::default()).is_ok());
        let mut over = at_limit.to_vec();
        over[11..13].copy_from_slice(&u16::try_from(MAX_REASON + 1).expect("small").to_be_bytes());
        over.push(b'r');
        assert!(matches!(Frame::decode(&over.into(), Limits::default()), Err(DecodeError::TooLong { .. })));
    }

    #[test]
    fn long_text_is_cut_on_a_char_boundary() {
        let id = "é".repeat(200); // 400 bytes
        let hs = Frame::Handshake { producer: id, incarnation: 0, generation: 1, resume_from: 0 }.encode();
        let Ok(Frame::Handshake { producer, .. }) = Frame::decode(&hs, Limits::default()) else {
            panic!("a truncated id still decodes")
        };
        assert_eq!(producer.len(), 254, "the longest whole-char prefix within 255 bytes");
        assert!(producer.chars().all(|c| c == 'é'));
    }
}
