//! Meridian protocols: one module per distributed-transaction protocol, each a sans-IO state
//! machine implementing [`meridian_core::node::Node`].
//!
//! Every protocol node is built from the same [`NodeContext`], and exposes its shard stores
//! through [`ProtocolNode`] so the harness can bulk-load data before a run and check invariants
//! after it. Which protocol runs is chosen by [`ProtocolKind`].
#![deny(unsafe_code)]

pub mod occ;

use meridian_core::error::unknown_name;
use meridian_core::node::Node;
use meridian_core::time::NS_PER_MS;
use meridian_core::topology::Topology;
use meridian_core::txn::{Partitioner, Registry};
use meridian_core::{ConfigError, NodeId, ShardId};
use meridian_storage::MvccStore;
use std::sync::Arc;

/// Protocol names `--protocol` accepts.
pub const PROTOCOLS: [&str; 1] = ["occ"];

/// A selectable protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtocolKind {
    /// OCC with read validation and 2PC across shards.
    Occ,
}

impl ProtocolKind {
    /// Parses a `--protocol` value.
    pub fn parse(name: &str) -> Result<Self, ConfigError> {
        match name {
            "occ" => Ok(Self::Occ),
            other => Err(unknown_name("protocol", other, &PROTOCOLS)),
        }
    }

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Occ => "occ",
        }
    }

    /// Checks that this protocol can run on `topology`: one replica per shard (in memory) or
    /// an odd number (a Raft group per shard).
    pub fn check_topology(self, topology: &Topology) -> Result<(), ConfigError> {
        match self {
            Self::Occ if topology.replicas != 1 && topology.replicas.is_multiple_of(2) => {
                Err(ConfigError::new(format!(
                    "occ replicates each shard with Raft, which needs an odd replica count (got {})",
                    topology.replicas
                )))
            }
            Self::Occ => Ok(()),
        }
    }

    /// True when `node` may crash (losing everything it had not synced) without the protocol
    /// losing acknowledged data, so swarms may crash it. With replicated shards every node
    /// qualifies (its log is durable and its group has other members); unreplicated `occ`
    /// keeps shard data only in memory, so only coordinators that host no replica do.
    pub fn may_crash(self, topology: &Topology, node: NodeId) -> bool {
        match self {
            Self::Occ => {
                topology.replicas >= 3 || topology.nodes[node.0 as usize].replicas.is_empty()
            }
        }
    }
}

/// Timeouts and limits every protocol node takes. Derived from the network model so that
/// timeouts exceed the slowest round trip.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    /// How long a coordinator waits for a reply before acting (abort, retransmit).
    pub rpc_timeout_ns: u64,
    /// First retry backoff after a conflict abort; doubles per retry up to the maximum.
    pub backoff_ns_min: u64,
    /// Largest retry backoff.
    pub backoff_ns_max: u64,
    /// Attempts per request before it fails with `RetriesExhausted`.
    pub attempts_max: u32,
    /// Requests one coordinator runs at once; beyond this it rejects.
    pub requests_in_flight_max: usize,
    /// How much timestamp history (ns) stores keep below the newest commit.
    pub gc_retention_ns: u64,
    /// One Raft tick: heartbeats every 2, elections after 10–20 (replicated shards only).
    pub raft_tick_ns: u64,
    /// Commands each shard replica applies between snapshots of its state (replicated or
    /// durable shards only).
    pub snapshot_interval_entries: u64,
}

impl Timing {
    /// Timing for a network whose slowest one-way delay is `owd_ns_max`.
    pub fn for_network(owd_ns_max: u64) -> Self {
        Self {
            rpc_timeout_ns: 4 * owd_ns_max + 200 * NS_PER_MS,
            backoff_ns_min: NS_PER_MS / 10,
            backoff_ns_max: 2 * owd_ns_max + 10 * NS_PER_MS,
            attempts_max: 1_000,
            requests_in_flight_max: 1 << 16,
            gc_retention_ns: 1_000 * NS_PER_MS,
            // Elections wait 10–20 ticks: 5–10 slowest one-way delays (2.5–5 round trips), and
            // at least 250 ms, because a vote needs a synced write at the candidate and at each
            // voter first (a slow disk syncs in 50 ms). Shorter, and a candidate times out
            // before its votes arrive, again and again (swarm seed 1 of `bank`, 3 replicas).
            raft_tick_ns: (owd_ns_max / 2).max(25 * NS_PER_MS),
            snapshot_interval_entries: SNAPSHOT_INTERVAL_ENTRIES,
        }
    }
}

/// Commands between snapshots by default. A snapshot copies every row written since the load;
/// at this interval a 2x3 `lan` bench snapshots each shard every few seconds, and a restart
/// replays at most this many commands after its snapshot.
pub const SNAPSHOT_INTERVAL_ENTRIES: u64 = 50_000;
/// The fewest commands between snapshots a run may ask for.
pub const SNAPSHOT_INTERVAL_ENTRIES_MIN: u64 =
    meridian_replication::raft::SNAPSHOT_INTERVAL_ENTRIES_MIN;

/// What every node is built from.
#[derive(Clone, Debug)]
pub struct NodeContext {
    /// This node.
    pub id: NodeId,
    /// The cluster layout.
    pub topology: Arc<Topology>,
    /// The procedures.
    pub registry: Arc<Registry>,
    /// Where keys live.
    pub partitioner: Arc<Partitioner>,
    /// The run's master seed (the node derives its own stream).
    pub seed: u64,
    /// Timeouts and limits.
    pub timing: Timing,
    /// Emit `Record` effects for the history checker.
    pub record_history: bool,
    /// The driver persists to a durable log: even a single replica per shard then runs its
    /// log (a one-member Raft group), so a restart loses nothing.
    pub durable: bool,
}

/// What the harness needs from any protocol node beyond the state-machine contract.
pub trait ProtocolNode: Node {
    /// The stores of the shard replicas this node hosts.
    fn stores(&self) -> Vec<(ShardId, &MvccStore)>;
    /// The same, writable, for bulk loading before the run starts.
    fn stores_mut(&mut self) -> Vec<(ShardId, &mut MvccStore)>;
}
