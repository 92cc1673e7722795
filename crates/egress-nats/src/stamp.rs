//! What each message carries besides its payload: the egress headers, and
//! their parsing (which a hostile or foreign message may fail).

use async_nats::HeaderMap;
use egress_core::DeadReason;

/// The header names.
pub mod headers {
    /// The producer id.
    pub const PRODUCER: &str = "Egress-Producer";
    /// The producer's incarnation: 32 lowercase hex digits.
    pub const INCARNATION: &str = "Egress-Incarnation";
    /// The egress sequence, decimal.
    pub const SEQUENCE: &str = "Egress-Sequence";
    /// The generation the message was published under, decimal.
    pub const GENERATION: &str = "Egress-Generation";
    /// Present on a tombstone (a dead letter's place in the stream): why.
    pub const DEAD: &str = "Egress-Dead";
    /// Present (`1`) on a takeover's claim: a message without a record
    /// that makes the publisher's owner the subject's (see
    /// [`Stamp::claim`](crate::Stamp::claim)).
    pub const CLAIM: &str = "Egress-Claim";
}

/// Who sent a message and where it goes in its producer's stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// The producer id.
    pub producer: String,
    /// The producer's incarnation (a restarted producer without a store
    /// draws a new one: a new stream of sequences).
    pub incarnation: u128,
    /// The egress sequence.
    pub sequence: u64,
    /// The generation it was published under; its owner part is
    /// [`owner_of`](crate::owner_of) it.
    pub generation: u64,
    /// A tombstone: the producer gave up on this sequence.
    pub dead: Option<DeadReason>,
    /// A takeover's claim, not a record: published once by a publisher
    /// taking the subject over, conditional on the last message it read,
    /// so that of two publishers taking over at once one owns the subject.
    /// Its `sequence` is the first the claimant will publish. Consumers
    /// skip it.
    pub claim: bool,
}

/// A message without valid egress headers.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("header {header}: {reason}")]
pub struct StampError {
    /// The header at fault.
    pub header: &'static str,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl Stamp {
    /// The message id the broker deduplicates by.
    pub fn message_id(&self) -> String {
        format!("{}:{:032x}:{}", self.producer, self.incarnation, self.sequence)
    }

    /// The headers of the message.
    pub fn to_headers(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        // A claim is no record: nothing to deduplicate (a claim sent again
        // must be refused or stored by its own condition).
        if !self.claim {
            h.insert(async_nats::header::NATS_MESSAGE_ID, self.message_id().as_str());
        }
        h.insert(headers::PRODUCER, self.producer.as_str());
        h.insert(headers::INCARNATION, format!("{:032x}", self.incarnation).as_str());
        h.insert(headers::SEQUENCE, self.sequence.to_string().as_str());
        h.insert(headers::GENERATION, self.generation.to_string().as_str());
        if let Some(reason) = self.dead {
            h.insert(headers::DEAD, dead_name(reason));
        }
        if self.claim {
            h.insert(headers::CLAIM, "1");
        }
        h
    }

    /// Reads the headers of a message.
    ///
    /// # Errors
    /// A header missing, or not what this crate writes.
    pub fn from_headers(h: &HeaderMap) -> Result<Stamp, StampError> {
        let get =
            |header: &'static str| h.get(header).map(|v| v.as_str()).ok_or(StampError { header, reason: "missing" });
        let number = |header: &'static str| -> Result<u64, StampError> {
            get(header)?.parse::<u64>().map_err(|_| StampError { header, reason: "not a decimal u64" })
        };
        let producer = get(headers::PRODUCER)?.to_owned();
        let incarnation = get(headers::INCARNATION)?;
        if incarnation.len() != 32 {
            return Err(StampError { header: headers::INCARNATION, reason: "not 32 hex digits" });
        }
        let incarnation = u128::from_str_radix(incarnation, 16)
            .map_err(|_| StampError { header: headers::INCARNATION, reason: "not 32 hex digits" })?;
        let dead = match h.get(headers::DEAD) {
            None => None,
            Some(v) => Some(
                DeadReason::ALL
                    .into_iter()
                    .find(|r| dead_name(*r) == v.as_str())
                    .ok_or(StampError { header: headers::DEAD, reason: "not a dead-letter reason" })?,
            ),
        };
        let claim = match h.get(headers::CLAIM).map(|v| v.as_str()) {
            None => false,
            Some("1") => true,
            Some(_) => return Err(StampError { header: headers::CLAIM, reason: "not 1" }),
        };
        Ok(Stamp {
            producer,
            incarnation,
            sequence: number(headers::SEQUENCE)?,
            generation: number(headers::GENERATION)?,
            dead,
            claim,
        })
    }
}

fn dead_name(reason: DeadReason) -> &'static str {
    match reason {
        DeadReason::Permanent => "permanent",
        DeadReason::Retries => "retries",
        DeadReason::Replays => "replays",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp() -> Stamp {
        Stamp {
            producer: "p-1".into(),
            incarnation: 0xabc,
            sequence: 42,
            generation: 7 << 32,
            dead: None,
            claim: false,
        }
    }

    #[test]
    fn a_stamp_goes_through_its_headers_and_names_its_message_id() {
        let deads = [None, Some(DeadReason::Permanent), Some(DeadReason::Retries), Some(DeadReason::Replays)];
        for (dead, claim) in deads.into_iter().flat_map(|d| [(d, false), (d, true)]) {
            let s = Stamp { dead, claim, ..stamp() };
            let h = s.to_headers();
            assert_eq!(Stamp::from_headers(&h), Ok(s.clone()));
            let id = (!claim).then(|| "p-1:00000000000000000000000000000abc:42".to_owned());
            assert_eq!(h.get(async_nats::header::NATS_MESSAGE_ID).map(|v| v.as_str().to_owned()), id);
        }
    }

    #[test]
    fn foreign_or_hostile_headers_are_typed_errors() {
        let with = |name: &str, value: &str| {
            let mut h = stamp().to_headers();
            h.insert(name, value);
            Stamp::from_headers(&h).map(|_| ()).map_err(|e| (e.header, e.reason))
        };
        assert_eq!(with(headers::SEQUENCE, "-1"), Err((headers::SEQUENCE, "not a decimal u64")));
        assert_eq!(with(headers::SEQUENCE, "18446744073709551616"), Err((headers::SEQUENCE, "not a decimal u64")));
        assert_eq!(with(headers::GENERATION, "x"), Err((headers::GENERATION, "not a decimal u64")));
        assert_eq!(with(headers::INCARNATION, "abc"), Err((headers::INCARNATION, "not 32 hex digits")));
        assert_eq!(with(headers::INCARNATION, &"g".repeat(32)), Err((headers::INCARNATION, "not 32 hex digits")));
        assert_eq!(with(headers::DEAD, "eaten"), Err((headers::DEAD, "not a dead-letter reason")));
        assert_eq!(with(headers::CLAIM, "yes"), Err((headers::CLAIM, "not 1")));
        assert_eq!(with(headers::SEQUENCE, "18446744073709551615"), Ok(()));
        let mut bare = HeaderMap::new();
        bare.insert(headers::PRODUCER, "p");
        assert_eq!(
            Stamp::from_headers(&bare).map_err(|e| (e.header, e.reason)),
            Err((headers::INCARNATION, "missing"))
        );
        assert_eq!(Stamp::from_headers(&HeaderMap::new()).map_err(|e| e.header), Err(headers::PRODUCER));
    }
}
