//! Identifiers. All are small integers with a total order, so maps keyed by them iterate
//! deterministically.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A node: one event loop hosting shard replicas and/or a coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u32);

/// A partition of the key space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ShardId(pub u32);

/// A named place; nodes and clients sit in one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RegionId(pub u32);

/// A client's request to a coordinator. Unique per run; assigned by the client driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestId(pub u64);

/// One attempt of a transaction. A retry after an abort is a new attempt with a new id, so a
/// late message of an old attempt can never be mistaken for the new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TxnId {
    /// The coordinator node that created this attempt.
    pub origin: NodeId,
    /// The origin's incarnation: a number that grows with every start of the node (the
    /// driver hands it over, from the node's durable state), so ids never repeat across
    /// restarts whatever the clocks do.
    pub incarnation: u64,
    /// Unique per `(origin, incarnation)`: a counter from 0.
    pub seq: u64,
}

impl TxnId {
    /// The id used for data that no transaction wrote (initial load).
    pub const LOAD: Self = Self { origin: NodeId(u32::MAX), incarnation: 0, seq: 0 };
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}", self.0)
    }
}

impl fmt::Display for TxnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}.{}.{}", self.origin.0, self.incarnation, self.seq)
    }
}
