//! Meridian replication (docs/protocols/kit.md): a sans-IO [`Replica`] trait for one replica of one
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
    /// Starts an election now (a first start of the preferred replica, or a one-member group).
    fn campaign(&mut self, out: &mut Vec<ReplicaEffect>);
    /// Hands out whatever is ready without a tick or a message (after a restore: the snapshot,
    /// then the committed log to replay).
    fn poll(&mut self, out: &mut Vec<ReplicaEffect>);
    /// The highest index whose command the driver has been handed (or that a snapshot it was
    /// handed covers).
    fn applied_index(&self) -> u64;
    /// The index a read arriving now must wait for before it is served from this replica's
    /// state (read-index under the leader's lease); `None` when it may not serve reads yet.
    fn read_index(&self) -> Option<u64>;
    /// True when the driver should hand over an image of its state for a snapshot.
    fn snapshot_due(&self) -> bool;
    /// Takes a snapshot with `data`, the driver's image of its state at the applied index.
    fn take_snapshot(&mut self, data: Vec<u8>, out: &mut Vec<ReplicaEffect>);
    /// The snapshot this replica was restored from, until handed over: index and image.
    fn restored_snapshot(&self) -> Option<(u64, &[u8])>;
    /// The last log index held when restored: entries up to it are a replay.
    fn restored_last_index(&self) -> u64;
    /// Log entries held in memory.
    fn log_entries(&self) -> u64;
    /// True when this replica leads and `slot` has every entry and answered recently.
    fn is_caught_up(&self, slot: Slot) -> bool;
    /// Snapshots taken, received and restored so far.
    fn snapshot_counts(&self) -> SnapshotCounts;
}

/// How many snapshots a replica has dealt with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotCounts {
    /// Taken of its own state.
    pub taken: u64,
    /// Received from a leader and installed.
    pub received: u64,
    /// Restored from disk at start.
    pub restored: u64,
    /// Images not taken because they exceeded the largest snapshot a member accepts.
    pub refused: u64,
}
