//! The engine's seam for a protocol whose shard leaders commit speculatively (`mako`): the
//! vocabulary its shards and nodes exchange (epochs and watermarks), and what the node and the
//! coordinator ask of it. A speculative commit is answered once the node's view of every
//! shard's watermark makes it durable; a failover closes the epoch and discards what was not.
//! The rules are the protocol's (`crate::mako`); the engine only carries them.

use super::participant::Participant;
use crate::kit::host::Hosts;
use meridian_core::topology::Topology;
use meridian_core::{NodeId, ShardId, Time, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A shard log entry of the speculative protocol's own, proposed by the shard's leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Entry {
    /// Raise the shard's watermark to its candidate, the clock counting as handed out.
    Tick {
        /// The leader's clock, or the highest watermark it heard in the epoch if that is
        /// later.
        now: u64,
    },
    /// Close `epoch` here: the shard's watermark becomes its final.
    EpochEnd {
        /// The epoch.
        epoch: u64,
    },
    /// Start `epoch` (the next one) at the closed epoch's stable point: prepared attempts
    /// abort and versions above `stable` are discarded.
    EpochStart {
        /// The epoch starting.
        epoch: u64,
        /// The stable point of the epoch before.
        stable: Timestamp,
        /// The leader's clock (the aborted attempts' decision time).
        now: u64,
    },
}

/// What a shard's leader tells every node, from its committed (replicated) state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The shard.
    pub shard: ShardId,
    /// Its epoch.
    pub epoch: u64,
    /// Its watermark in `epoch`.
    pub w: Timestamp,
    /// Its final for `epoch`, once the epoch's end is replicated (the epoch is closing).
    pub final_w: Option<Timestamp>,
    /// Stable points of the epochs it closed last (a bounded number), oldest first.
    pub stables: Vec<(u64, Timestamp)>,
}

/// What is known about a commit's durability.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Durable: report it committed.
    Durable,
    /// Discarded by a failover: it did not commit (retry it).
    Discarded,
    /// Not yet known.
    Pending,
    /// Its epoch's stable point is unknown here and can no longer be learned: unknown.
    Forgotten,
}

/// A node's view of durability, for its coordinator's parked commits.
pub(crate) trait Durability {
    /// The newest epoch the node knows (new attempts run in it).
    fn epoch(&self) -> u64;
    /// Whether a commit of `epoch` at `ts` is durable.
    fn verdict(&self, epoch: u64, ts: Timestamp) -> Verdict;
}

/// The node-level part of a speculative protocol.
pub(crate) trait Speculation: Send {
    /// How often [`Speculation::tick`] runs.
    fn interval_ns(&self) -> u64;

    /// The node's view of durability.
    fn durability(&self) -> &dyn Durability;

    /// The periodic work over the shards hosted here: the entry each shard this node leads
    /// logs next and the report of its committed state (with the causal chain the report
    /// covers, measurement only); and every copy here learns how far its history may be
    /// collected.
    #[allow(clippy::type_complexity)] // two plain lists
    fn tick(
        &mut self,
        hosts: &mut Hosts<Participant>,
        now: Time,
    ) -> (Vec<(ShardId, Entry)>, Vec<(Report, u16)>);

    /// A leader's participant new to its term: the entry it logs before it handles any
    /// request, if one is due.
    fn close_entry(&self, participant: &Participant) -> Option<Entry>;

    /// A shard leader's report from `from`; false when it is refused (malformed, or from a
    /// node that hosts no replica of the shard).
    fn on_report(&mut self, topology: &Topology, from: NodeId, report: &Report) -> bool;

    /// Counters of the node-level part.
    fn counters(&self, counters: &mut BTreeMap<&'static str, u64>);
}
