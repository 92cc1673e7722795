//! The seeded randomness of this crate: the sender's backoff jitter, the
//! receiver's injected acknowledgement faults and the chaos proxy's kill
//! schedule, each reproducible from its seed: egress-reactive's xorshift64
//! generator (one implementation, shared with the NATS publisher and the
//! demo).

pub(crate) use egress_reactive::Xorshift;
