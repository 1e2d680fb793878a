//! Meridian replication (DESIGN §3.2): a sans-IO [`Replica`] trait for one replica of one
//! shard's replicated log, and [`raft::RaftReplica`], its implementation over tikv/raft-rs.
//!
//! A layered protocol keeps one replica per (shard, replica slot) it hosts, proposes commands
//! on the leader, and applies what the log commits, in log order, on every replica. A command
//! is committed once a quorum of the group has it durably; the replica reports it as
//! [`ReplicaEffect::Apply`] only then, so a protocol that answers after applying answers only
//! for durable decisions.
//!
//! The contract with the driver, as for nodes (`meridian_core::node`): no clock, no I/O, no
//! unseeded randomness. Time is `tick()` counts; messages and persistence go out as effects;
//! persistence completes through `on_persisted(token)`, in the order the persists were asked.
//! Messages that raft-rs allows only after persistence (votes, a follower's append
//! acknowledgements) are held until then. Snapshots bound the log: the driver hands the
//! replica an image of its state machine when asked (`snapshot_due`), and restores one when
//! told ([`ReplicaEffect::Restore`]).
#![deny(unsafe_code)]

pub mod raft;

use serde::{Deserialize, Serialize};

/// A replica's place in its group: 0-based slot (raft ids are `slot + 1`).
pub type Slot = u32;

/// One message between two replicas of a group, encoded by the replication layer (opaque to
/// the protocol that carries it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaMsg(pub Vec<u8>);

/// What a replica wants its driver (the protocol node) to do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicaEffect {
    /// Send these messages (one pass's worth, coalesced) to the replica in `to`.
    Send {
        /// Destination slot.
        to: Slot,
        /// The messages.
        msgs: Vec<ReplicaMsg>,
    },
    /// Write `records` durably (sync when `sync`), then call `on_persisted(token)`.
    Persist {
        /// Handed back when done.
        token: u64,
        /// Key-value records: put, or delete when the value is `None`.
        records: Vec<(Vec<u8>, Option<Vec<u8>>)>,
        /// True when the records must reach the device (a vote or log entries).
        sync: bool,
    },
    /// A command committed at `index`: apply it to the state machine, in index order.
    Apply {
        /// Log index.
        index: u64,
        /// The command as proposed.
        command: Vec<u8>,
    },
    /// Replace the state machine with a snapshot's image of it at `index` (a snapshot from
    /// the leader, or the one this replica restarted from); commands after it follow as
    /// `Apply`.
    Restore {
        /// The last log index the image covers.
        index: u64,
        /// The image, as the driver produced it for the snapshot.
        data: Vec<u8>,
    },
    /// This replica became leader (`true`) or stopped being leader (`false`).
    Leadership(bool),
}

/// Why a proposal was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProposeError {
    /// Only the leader proposes; the hint names the leader this replica knows of.
    NotLeader {
        /// The leader's slot, if known.
        leader: Option<Slot>,
    },
    /// The proposal was dropped (a leader transfer in progress, or too many uncommitted).
    Dropped,
}

/// One replica of one shard's log.
pub trait Replica {
    /// One logical tick of time passed (elections and heartbeats count ticks).
    fn tick(&mut self, out: &mut Vec<ReplicaEffect>);
    /// Messages from the replica in slot `from` arrived. Malformed ones are dropped.
    fn on_message(&mut self, from: Slot, msgs: Vec<ReplicaMsg>, out: &mut Vec<ReplicaEffect>);
    /// Appends `command` to the log if this replica leads.
    fn propose(
        &mut self,
        command: Vec<u8>,
        out: &mut Vec<ReplicaEffect>,
    ) -> Result<(), ProposeError>;
    /// The persist with `token` completed.
    fn on_persisted(&mut self, token: u64, out: &mut Vec<ReplicaEffect>);
    /// True when this replica leads its group now.
    fn is_leader(&self) -> bool;
    /// The leader this replica knows of.
    fn leader(&self) -> Option<Slot>;
    /// Asks the group to hand leadership to `slot` (after a leader restart, or to move it).
    fn transfer_leader(&mut self, slot: Slot, out: &mut Vec<ReplicaEffect>);
}
