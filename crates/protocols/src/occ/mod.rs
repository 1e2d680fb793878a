//! `occ`: optimistic concurrency control with read validation (Silo-style) and two-phase commit
//! across shards (DESIGN §6).
//!
//! # Flow of one attempt
//!
//! 1. **Execute.** The coordinator (in the client's region) sends each shard the pieces that are
//!    ready (all their dependencies done). The participant runs them against its latest committed
//!    state without keeping any state and returns the versions it read and the writes it wants.
//!    Pieces run in waves until the plan is done.
//! 2. **Prepare.** Every shard that was read or written gets its read set (key and version read),
//!    scans (rows and versions seen) and writes. It votes yes only if every read and scan is
//!    still current and no other prepared transaction holds a conflicting lock; a yes holds
//!    read locks on the read keys and scanned ranges and write locks on the written keys until
//!    the decision. Read-only participants hold their read locks too: releasing them early lets
//!    two transactions with crossed read and write sets both commit (write skew).
//! 3. **Decide.** All yes → commit at the largest proposed timestamp (each proposal is above every
//!    version the participant's keys hold, so versions stay ordered); any no → abort and retry
//!    with exponential backoff as a new attempt. The client hears the outcome as soon as it is
//!    decided; `Commit`/`Abort` are retransmitted until every participant acknowledges.
//!
//! **The commit rule.** An attempt commits exactly when every participant has prepared it. The
//! coordinator never aborts an attempt whose votes are merely missing: it sends `Query` to the
//! silent participants, and a participant that has not prepared the attempt refuses it for good
//! (answers aborted), after which aborting is safe; one that has prepared counts as a yes. A
//! participant holding a prepared attempt whose coordinator went quiet (crashed, partitioned)
//! for `TERMINATE_AFTER_TIMEOUTS` RPC timeouts runs the same query against the other
//! participants: any decided → that decision; all prepared → commit at the largest proposal,
//! which is what the coordinator would have chosen. So a coordinator crash after its decision
//! never leaves a transaction half applied, and prepared locks never outlive a crashed
//! coordinator (found by the swarm, seed 31 of `bank`).
//!
//! Two shortcuts that keep the guarantees: when every piece lives on one shard the coordinator
//! sends `ExecuteCommit`, which runs and commits atomically at that shard (one round trip); when
//! only one shard participates in prepare it commits there at once (one-phase commit).
//!
//! # Failure handling
//!
//! Messages may be lost, duplicated or reordered. Every handler is idempotent; participants keep
//! a bounded cache of decided attempts, so a late `Prepare` after an `Abort` is refused and a
//! duplicate `Commit` is acknowledged again. An attempt whose outcome the coordinator cannot know
//! (a one-round commit that timed out) is resolved by asking with `Abort`: the participant either
//! aborts it for good or answers that it committed, so a request never commits twice.
//!
//! Coordinators keep no durable state; attempt ids follow the node's clock so that a restarted
//! coordinator never reuses one.
//!
//! # Replication
//!
//! With more than one replica per shard (or a durable driver), each hosted participant sits
//! behind a member of the shard's Raft group (`ShardHost`): every state change is a
//! `ShardCommand` in the log, applied by every replica in log order with the inputs the
//! leader logged (its clock reading included), and answered by the leader only once committed,
//! so a vote or an acknowledgement is durable on a quorum before anyone hears it. Reads for
//! execution come from the leader's state and are validated at prepare. A follower forwards
//! requests to the leader it knows; coordinators learn leaders from replies and try the next
//! replica after a timeout. The leader runs its shard's termination and hands leadership back
//! to replica 0 once it has caught up. Every replica snapshots its participant (the rows
//! transactions wrote, prepared attempts, remembered decisions) every
//! `Timing::snapshot_interval_entries` commands, which bounds its log on disk and in memory; a
//! replica too far behind, or restarting, installs a snapshot and replays the log after it.

mod coordinator;
mod participant;

use crate::{NodeContext, ProtocolNode};
use coordinator::Coordinator;
use meridian_core::key::{Key, Value};
use meridian_core::node::{ClientRequest, Node, Outbox, PersistToken, TimerId};
use meridian_core::txn::{
    Args, PieceEffects, PieceOutput, ProcError, ProcId, ScanRange, UserAbort, Write,
};
use meridian_core::{NodeId, ShardId, Time, Timestamp, TxnId};
use meridian_replication::raft::{RaftReplica, RaftTiming};
use meridian_replication::{Replica, ReplicaEffect, ReplicaMsg};
use meridian_storage::MvccStore;
use participant::{Participant, PrepareArgs};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// The version a read saw: its timestamp and writer. `None` in a read set means the key was
/// absent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionTag {
    /// Version timestamp.
    pub ts: Timestamp,
    /// The attempt that wrote it.
    pub writer: TxnId,
}

/// A scan and the rows it saw, for validation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanCheck {
    /// The range.
    pub range: ScanRange,
    /// Keys and versions seen, in scan order.
    pub rows: Vec<(Key, VersionTag)>,
}

/// One piece to run, with the outputs of its dependencies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PieceCall {
    /// Piece index in the plan.
    pub piece: u32,
    /// Outputs of `deps`, in order.
    pub inputs: Vec<PieceOutput>,
}

/// What running one piece produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PieceRun {
    /// Piece index.
    pub piece: u32,
    /// Keys read from the store and the versions seen (reads of the attempt's own writes are
    /// not listed: they need no validation).
    pub reads: Vec<(Key, Option<VersionTag>)>,
    /// Scans and the rows seen.
    pub scans: Vec<ScanCheck>,
    /// Writes and output, or the user abort.
    pub effects: Result<PieceEffects, UserAbort>,
}

/// Why a participant voted no or refused a one-round commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Conflict {
    /// A read or scan is no longer current.
    Stale,
    /// Another prepared attempt holds a conflicting lock.
    Locked,
    /// The attempt was already aborted here.
    AlreadyAborted,
}

/// A participant's answer to `Prepare`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Vote {
    /// Prepared; commit no earlier than this timestamp.
    Yes(Timestamp),
    /// One-phase prepare: committed at this timestamp.
    Committed(Timestamp),
    /// Cannot commit.
    No(Conflict),
}

/// What a participant knows about an attempt it was asked to finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// Committed at this timestamp.
    Committed(Timestamp),
    /// Aborted.
    Aborted,
}

/// Why execution failed at a participant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecFailure {
    /// The procedure is unknown, its arguments are bad, or it broke its contract.
    Procedure(ProcError),
    /// Conflicts with a prepared attempt (one-round commit only).
    Conflict(Conflict),
    /// This attempt was already decided here (a late or duplicate request).
    Decided(Decision),
}

/// Messages of the `occ` protocol.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum OccMsg {
    /// Coordinator → participant: run these pieces; keep nothing.
    Execute {
        /// The attempt.
        txn: TxnId,
        /// The shard asked.
        shard: ShardId,
        /// The procedure.
        proc: ProcId,
        /// Its arguments.
        args: Args,
        /// Pieces to run, in plan order.
        calls: Vec<PieceCall>,
        /// The attempt's earlier writes on this shard (read-your-writes).
        overlay: Vec<Write>,
    },
    /// Participant → coordinator: what the pieces did.
    Executed {
        /// The attempt.
        txn: TxnId,
        /// The shard.
        shard: ShardId,
        /// One run per call, or why none ran.
        result: Result<Vec<PieceRun>, ExecFailure>,
    },
    /// Coordinator → participant: run every piece (all on this shard) and commit atomically.
    ExecuteCommit {
        /// The attempt.
        txn: TxnId,
        /// The shard.
        shard: ShardId,
        /// The procedure.
        proc: ProcId,
        /// Its arguments.
        args: Args,
        /// Return the read and write sets (for the history); otherwise only outputs come back.
        want_sets: bool,
    },
    /// Participant → coordinator: the runs and the commit timestamp (or why not).
    ExecutedCommit {
        /// The attempt.
        txn: TxnId,
        /// The shard.
        shard: ShardId,
        /// Runs and commit timestamp; a user abort commits nothing and is reported in the runs.
        result: Result<(Vec<PieceRun>, Option<Timestamp>), ExecFailure>,
    },
    /// Coordinator → participant: validate and lock.
    Prepare {
        /// The attempt.
        txn: TxnId,
        /// The shard.
        shard: ShardId,
        /// Reads on this shard.
        reads: Vec<(Key, Option<VersionTag>)>,
        /// Scans on this shard.
        scans: Vec<ScanCheck>,
        /// Writes on this shard.
        writes: Vec<Write>,
        /// The only participant: commit at once if valid.
        one_phase: bool,
        /// Every participant of the attempt (for termination without the coordinator).
        participants: Vec<ShardId>,
    },
    /// Participant → coordinator: the vote.
    Prepared {
        /// The attempt.
        txn: TxnId,
        /// The shard.
        shard: ShardId,
        /// The vote.
        vote: Vote,
    },
    /// Coordinator → participant: install the writes at `ts` and release.
    Commit {
        /// The attempt.
        txn: TxnId,
        /// The shard.
        shard: ShardId,
        /// The commit timestamp.
        ts: Timestamp,
    },
    /// Coordinator → participant: release, and refuse this attempt from now on. Also asks the
    /// outcome of an attempt the coordinator lost track of.
    Abort {
        /// The attempt.
        txn: TxnId,
        /// The shard.
        shard: ShardId,
    },
    /// Participant → coordinator: the attempt is finished here, with this outcome.
    Finished {
        /// The attempt.
        txn: TxnId,
        /// The shard.
        shard: ShardId,
        /// What happened.
        decision: Decision,
    },
    /// Coordinator or participant → participant: where does this attempt stand here? A shard
    /// that has not prepared it refuses it from now on (answers aborted), so the asker's
    /// verdict cannot be overtaken by a late prepare.
    Query {
        /// The attempt.
        txn: TxnId,
        /// The shard asked.
        shard: ShardId,
    },
    /// The answer to `Query`.
    State {
        /// The attempt.
        txn: TxnId,
        /// The shard answering.
        shard: ShardId,
        /// Where it stands.
        state: PeerState,
    },
    /// Node → node: the Raft messages of every group the two share, from one call of the
    /// sender (one frame per destination per pass, however many groups a node runs).
    Raft {
        /// Per group: the shard, the sender's slot in it, the messages.
        groups: Vec<RaftGroupMsgs>,
    },
    /// A follower hands a request it received to the leader it knows; the leader answers
    /// `origin`. Never forwarded twice.
    Forward {
        /// Who sent the request.
        origin: NodeId,
        /// The request (`Execute`, `ExecuteCommit`, `Prepare`, `Commit`, `Abort`, `Query`).
        msg: Box<OccMsg>,
    },
}

/// The Raft messages of one group inside an [`OccMsg::Raft`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RaftGroupMsgs {
    /// The shard (Raft group).
    pub shard: ShardId,
    /// The sender's slot in the group.
    pub from_slot: u32,
    /// The messages.
    pub msgs: Vec<ReplicaMsg>,
}

impl OccMsg {
    /// The message that carries `decision` on `txn` to `shard`: `Commit` or `Abort`.
    fn decision(txn: TxnId, shard: ShardId, decision: Decision) -> Self {
        match decision {
            Decision::Committed(ts) => Self::Commit { txn, shard, ts },
            Decision::Aborted => Self::Abort { txn, shard },
        }
    }

    /// The shard a request to a participant is for.
    fn request_shard(&self) -> Option<ShardId> {
        match self {
            Self::Execute { shard, .. }
            | Self::ExecuteCommit { shard, .. }
            | Self::Prepare { shard, .. }
            | Self::Commit { shard, .. }
            | Self::Abort { shard, .. }
            | Self::Query { shard, .. } => Some(*shard),
            _ => None,
        }
    }
}

/// A state change of one shard's participant, as its Raft log carries it. Every replica
/// applies the same commands in the same order with the same inputs (the leader's clock
/// reading included), so every replica's participant reaches the same state; only the leader
/// answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum ShardCommand {
    Prepare {
        reply_to: NodeId,
        now: Time,
        txn: TxnId,
        reads: Vec<(Key, Option<VersionTag>)>,
        scans: Vec<ScanCheck>,
        writes: Vec<Write>,
        one_phase: bool,
        participants: Vec<ShardId>,
    },
    ExecuteCommit {
        reply_to: NodeId,
        now: Time,
        txn: TxnId,
        proc: ProcId,
        args: Args,
        want_sets: bool,
    },
    /// A decision from the coordinator (`reply_to`), or reached by this shard's termination
    /// (`peers` to tell).
    Decide {
        reply_to: Option<NodeId>,
        txn: TxnId,
        decision: Decision,
        peers: Vec<ShardId>,
    },
    Query {
        reply_to: NodeId,
        txn: TxnId,
    },
}

/// What [`OccNode::replay_committed`] rebuilt, summed over the node's shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Snapshots installed.
    pub snapshots: u64,
    /// Committed commands applied after them.
    pub commands: u64,
    /// The log index the state reached (summed over the node's groups).
    pub log_index: u64,
}

/// Where an attempt stands at one participant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerState {
    /// Prepared (voted yes) with this proposal; not decided.
    Prepared(Timestamp),
    /// Decided.
    Decided(Decision),
}

/// Purpose of a timer (the node keeps a table from `TimerId` to purpose).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TimerPurpose {
    /// Participant housekeeping: raise the GC watermark.
    Gc,
    /// Coordinator housekeeping: time out attempts, retransmit unacknowledged decisions.
    CoordinatorTick,
    /// Start the next attempt of a request after backoff.
    Retry { request: meridian_core::RequestId },
    /// Tick every Raft group hosted here.
    RaftTick,
}

/// How often participants raise their GC watermark.
const GC_INTERVAL_NS: u64 = 100 * meridian_core::time::NS_PER_MS;
/// Most timers pending at once per node.
const TIMERS_MAX: usize = 1 << 20;

/// Timer table shared by the coordinator and participants of one node.
#[derive(Debug, Default)]
struct Timers {
    next: u64,
    // Looked up once per timer; never iterated.
    pending: meridian_core::hash::FixedHashMap<TimerId, TimerPurpose>,
}

impl Timers {
    fn set(&mut self, purpose: TimerPurpose, after_ns: u64, out: &mut Outbox<OccMsg>) {
        // Timers are never cancelled, so stale ones accumulate only until they fire; the bound
        // protects against a bug that would set them in a loop.
        assert!(self.pending.len() < TIMERS_MAX, "timer table overflow");
        let id = TimerId(self.next);
        self.next += 1;
        self.pending.insert(id, purpose);
        out.set_timer(id, after_ns);
    }

    fn take(&mut self, id: TimerId) -> Option<TimerPurpose> {
        self.pending.remove(&id)
    }
}

/// One shard replica hosted by a node: the participant (the state machine) and, when shards
/// are replicated, its member of the shard's Raft group.
struct ShardHost {
    participant: Participant,
    raft: Option<RaftReplica>,
    /// This replica's slot in the shard's group.
    slot: u32,
    /// The snapshot this replica restarted from, decoded when the node was built (so a bad
    /// one fails the start with an error), installed when the group hands it over.
    restored_image: Option<(u64, participant::DecodedImage)>,
    /// Execution requests waiting for the leader's state to be current (read-index): the
    /// index each waits for (`None` until the leader has committed in its term), who asked,
    /// and the request. Oldest first; at most [`READS_WAITING_MAX`].
    reads_waiting: VecDeque<(Option<u64>, NodeId, OccMsg)>,
}

/// Execution requests one shard replica holds while its state catches up; more are dropped
/// (the coordinator's timeout resends).
const READS_WAITING_MAX: usize = 4_096;

impl ShardHost {
    /// True when this replica acts for the shard: the only replica, or the Raft leader.
    fn leads(&self) -> bool {
        self.raft.as_ref().is_none_or(|r| r.is_leader())
    }
}

/// Appends `command` to the shard's log. A refusal (no longer leader, a transfer in progress)
/// is left to the sender's timeout, which resends.
fn propose(raft: &mut RaftReplica, command: &ShardCommand, effects: &mut Vec<ReplicaEffect>) {
    let bytes = postcard::to_allocvec(command).expect("commands encode");
    let _ = raft.propose(bytes, effects);
}

/// Most bytes of Raft messages in one `OccMsg::Raft` (unless one message alone is bigger):
/// well inside a wire frame, and above a snapshot chunk.
const RAFT_SEND_BYTES_MAX: usize = 4 << 20;
const _: () = assert!(RAFT_SEND_BYTES_MAX >= meridian_replication::raft::MSG_CHUNK_BYTES + 64);
const _: () = assert!(RAFT_SEND_BYTES_MAX < meridian_core::wire::FRAME_BYTES_MAX / 2);

/// Most persists of this node's Raft groups outstanding at once (each group bounds its own;
/// this bounds the token table).
const PERSISTS_PENDING_MAX: usize = 1 << 20;

/// A node running `occ`: participants for the shards it hosts, and a coordinator if clients
/// submit here.
pub struct OccNode {
    id: NodeId,
    context: NodeContext,
    hosts: BTreeMap<ShardId, ShardHost>,
    coordinator: Option<Coordinator>,
    timers: Timers,
    /// Node persist token → (shard, the group's own token).
    persists: BTreeMap<u64, (ShardId, u64)>,
    persist_next: u64,
    /// True when the Raft groups started from an empty log (a first start, not a restart).
    fresh: bool,
    /// Raft messages of this call, per destination, sent together at its end.
    raft_outgoing: BTreeMap<NodeId, Vec<RaftGroupMsgs>>,
}

impl OccNode {
    /// Builds the node described by `context` on an empty disk.
    pub fn new(context: NodeContext) -> Self {
        Self::restore(context, &BTreeMap::new()).expect("an empty log always restores")
    }

    /// Builds the node described by `context` from what its disk holds (`durable`): each
    /// hosted Raft group rebuilds its log and replays the committed commands into the
    /// participant, whose store the caller has bulk-loaded with the initial data.
    pub fn restore(
        context: NodeContext,
        durable: &BTreeMap<Vec<u8>, Vec<u8>>,
    ) -> Result<Self, String> {
        let topology = context.topology.clone();
        let info = &topology.nodes[context.id.0 as usize];
        let mut hosts = BTreeMap::new();
        for slot in &info.replicas {
            // One replica and no durable log: the shard lives in memory, with no log at all.
            let raft = if topology.replicas > 1 || context.durable {
                // Election timeouts are drawn from the run's seed: random, yet reproducible.
                let replica = RaftReplica::restore(
                    slot.shard.0,
                    slot.replica,
                    topology.replicas,
                    RaftTiming::standard(
                        context.seed ^ (u64::from(context.id.0) << 48),
                        context.timing.snapshot_interval_entries,
                    ),
                    durable,
                )
                .map_err(|e| format!("node {}: {e}", context.id))?;
                Some(replica)
            } else {
                None
            };
            let restored_image = match raft.as_ref().and_then(|r| r.restored_snapshot()) {
                Some((index, data)) => {
                    let image = participant::DecodedImage::decode(data).map_err(|e| {
                        format!(
                            "node {}: shard {} snapshot at {index}: {e}",
                            context.id, slot.shard
                        )
                    })?;
                    Some((index, image))
                }
                None => None,
            };
            let participant = Participant::new(slot.shard, context.clone());
            let host = ShardHost {
                participant,
                raft,
                slot: slot.replica,
                restored_image,
                reads_waiting: VecDeque::new(),
            };
            hosts.insert(slot.shard, host);
        }
        let coordinator = info.coordinator.then(|| Coordinator::new(context.clone()));
        Ok(Self {
            id: context.id,
            context,
            hosts,
            coordinator,
            timers: Timers::default(),
            persists: BTreeMap::new(),
            persist_next: 0,
            fresh: durable.is_empty(),
            raft_outgoing: BTreeMap::new(),
        })
    }

    /// Installs the snapshots and applies every command the restored logs hold as committed,
    /// answering nobody: the state a restarted node reaches before it talks to anyone
    /// (`meridian verify` checks it).
    pub fn replay_committed(&mut self) -> Replayed {
        let mut out = Outbox::new();
        let mut replayed = Replayed::default();
        let shards: Vec<ShardId> = self.hosts.keys().copied().collect();
        for shard in shards {
            let mut effects = Vec::new();
            if let Some(raft) = self.hosts.get_mut(&shard).and_then(|h| h.raft.as_mut()) {
                raft.poll(&mut effects);
                replayed.log_index += raft.applied_index();
            }
            for effect in &effects {
                match effect {
                    ReplicaEffect::Apply { .. } => replayed.commands += 1,
                    ReplicaEffect::Restore { .. } => replayed.snapshots += 1,
                    _ => {}
                }
            }
            self.carry_out_replica(shard, effects, &mut out);
        }
        self.flush_raft(&mut out);
        replayed
    }

    /// Replaces the procedure registry everywhere in this node (tests register extra procedures).
    #[cfg(test)]
    fn set_registry(&mut self, registry: std::sync::Arc<meridian_core::txn::Registry>) {
        for host in self.hosts.values_mut() {
            host.participant.set_registry(registry.clone());
        }
        if let Some(c) = self.coordinator.as_mut() {
            c.set_registry(registry);
        }
    }

    /// A request for one of this node's shards, from `origin`. A follower forwards it to the
    /// leader it knows (once: `may_forward` is false for forwarded requests) and drops it when
    /// it knows none; the coordinator's timeouts resend.
    fn on_shard_request(
        &mut self,
        now: Time,
        origin: NodeId,
        msg: OccMsg,
        may_forward: bool,
        out: &mut Outbox<OccMsg>,
    ) {
        let Some(shard) = msg.request_shard() else { return };
        let Some(host) = self.hosts.get_mut(&shard) else { return };
        if !host.leads() {
            let leader = host.raft.as_ref().and_then(|r| r.leader());
            let node = leader.and_then(|slot| self.context.topology.replica_node(shard, slot));
            if let Some(node) = node.filter(|&n| may_forward && n != self.id) {
                out.send(node, OccMsg::Forward { origin, msg: Box::new(msg) });
            }
            return;
        }
        let command = match msg {
            execute @ OccMsg::Execute { .. } => {
                // Reads only, served from the leader's state once it is current (read-index
                // under the leader's lease); prepare validates them again.
                let read_index = host.raft.as_ref().and_then(|r| r.read_index());
                if host.reads_waiting.len() < READS_WAITING_MAX {
                    host.reads_waiting.push_back((read_index, origin, execute));
                }
                Self::serve_reads(host, out);
                return;
            }
            OccMsg::ExecuteCommit { txn, proc, args, want_sets, .. } => {
                ShardCommand::ExecuteCommit { reply_to: origin, now, txn, proc, args, want_sets }
            }
            OccMsg::Prepare { txn, reads, scans, writes, one_phase, participants, .. } => {
                ShardCommand::Prepare {
                    reply_to: origin,
                    now,
                    txn,
                    reads,
                    scans,
                    writes,
                    one_phase,
                    participants,
                }
            }
            OccMsg::Commit { txn, ts, .. } => ShardCommand::Decide {
                reply_to: Some(origin),
                txn,
                decision: Decision::Committed(ts),
                peers: Vec::new(),
            },
            OccMsg::Abort { txn, .. } => ShardCommand::Decide {
                reply_to: Some(origin),
                txn,
                decision: Decision::Aborted,
                peers: Vec::new(),
            },
            OccMsg::Query { txn, .. } => ShardCommand::Query { reply_to: origin, txn },
            _ => return,
        };
        self.run_command(shard, command, out);
    }

    /// Runs the execution requests whose read index the replica has applied, in order. A
    /// replica that stopped leading drops them: the coordinator's timeout finds the new leader.
    fn serve_reads(host: &mut ShardHost, out: &mut Outbox<OccMsg>) {
        while let Some((waiting_for, ..)) = host.reads_waiting.front_mut() {
            if let Some(raft) = host.raft.as_ref() {
                if !raft.is_leader() {
                    host.reads_waiting.clear();
                    return;
                }
                if waiting_for.is_none() {
                    *waiting_for = raft.read_index();
                }
                match *waiting_for {
                    Some(index) if raft.applied_index() >= index => {}
                    _ => return,
                }
            }
            let Some((_, origin, msg)) = host.reads_waiting.pop_front() else { return };
            let OccMsg::Execute { txn, shard, proc, args, calls, overlay } = msg else {
                unreachable!("only executions wait")
            };
            let result = host.participant.on_execute(txn, proc, &args, &calls, overlay);
            out.send(origin, OccMsg::Executed { txn, shard, result });
        }
    }

    /// Applies `command` to `shard` at once (unreplicated), or proposes it to the shard's log
    /// (it is applied, and answered, when committed).
    fn run_command(&mut self, shard: ShardId, command: ShardCommand, out: &mut Outbox<OccMsg>) {
        let Some(host) = self.hosts.get_mut(&shard) else { return };
        let Some(raft) = host.raft.as_mut() else {
            Self::apply(&self.context, shard, &mut host.participant, command, true, out);
            return;
        };
        let mut effects = Vec::new();
        propose(raft, &command, &mut effects);
        self.carry_out_replica(shard, effects, out);
    }

    /// Carries out what `shard`'s Raft member asked for.
    fn carry_out_replica(
        &mut self,
        shard: ShardId,
        effects: Vec<ReplicaEffect>,
        out: &mut Outbox<OccMsg>,
    ) {
        for effect in effects {
            match effect {
                ReplicaEffect::Send { to, msgs } => {
                    let Some(host) = self.hosts.get(&shard) else { continue };
                    debug_assert!(host.raft.is_some());
                    if let Some(node) = self.context.topology.replica_node(shard, to) {
                        let group = RaftGroupMsgs { shard, from_slot: host.slot, msgs };
                        self.raft_outgoing.entry(node).or_default().push(group);
                    }
                }
                ReplicaEffect::Persist { token, records, sync } => {
                    assert!(
                        self.persists.len() < PERSISTS_PENDING_MAX,
                        "persists stopped completing"
                    );
                    let node_token = self.persist_next;
                    self.persist_next += 1;
                    self.persists.insert(node_token, (shard, token));
                    let records = records
                        .into_iter()
                        .map(|(key, value)| meridian_core::node::PersistRecord { key, value })
                        .collect();
                    let durability = if sync {
                        meridian_core::node::Durability::Synced
                    } else {
                        meridian_core::node::Durability::Buffered
                    };
                    out.persist(PersistToken(node_token), records, durability);
                }
                ReplicaEffect::Apply { index, command } => {
                    let Some(host) = self.hosts.get_mut(&shard) else { continue };
                    // Entries come from our own group; one that does not decode is skipped
                    // identically on every replica.
                    let Ok(command) = postcard::from_bytes::<ShardCommand>(&command) else {
                        continue;
                    };
                    // Commands replayed from this node's own log after a restart are old: their
                    // senders have given up on them or asked again, so they get no answer.
                    let replayed =
                        host.raft.as_ref().is_some_and(|r| index <= r.restored_last_index());
                    let answer = host.leads() && !replayed;
                    Self::apply(&self.context, shard, &mut host.participant, command, answer, out);
                }
                ReplicaEffect::Restore { index, data } => {
                    let Some(host) = self.hosts.get_mut(&shard) else { continue };
                    let image = match host.restored_image.take() {
                        Some((at, image)) if at == index => image,
                        // From the leader: it passed the sender check and its group's checksums,
                        // so an image that does not decode is a bug, not input.
                        _ => participant::DecodedImage::decode(&data).unwrap_or_else(|e| {
                            panic!("shard {shard}: snapshot at {index} from the leader: {e}")
                        }),
                    };
                    host.participant.install_image(image);
                }
                ReplicaEffect::Leadership(_) => {}
            }
        }
        self.snapshot_if_due(shard, out);
        if let Some(host) = self.hosts.get_mut(&shard) {
            if !host.reads_waiting.is_empty() {
                Self::serve_reads(host, out);
            }
        }
    }

    /// Snapshots `shard`'s participant once its group has applied enough since the last one.
    fn snapshot_if_due(&mut self, shard: ShardId, out: &mut Outbox<OccMsg>) {
        let Some(host) = self.hosts.get_mut(&shard) else { return };
        let Some(raft) = host.raft.as_mut().filter(|r| r.snapshot_due()) else { return };
        let mut effects = Vec::new();
        raft.take_snapshot(host.participant.image(), &mut effects);
        debug_assert!(effects.iter().all(|e| matches!(e, ReplicaEffect::Persist { .. })));
        self.carry_out_replica(shard, effects, out);
    }

    /// Sends the Raft messages this call produced: one message per destination, or several
    /// of at most [`RAFT_SEND_BYTES_MAX`] each when they are big (snapshot chunks), so that
    /// each fits a wire frame.
    fn flush_raft(&mut self, out: &mut Outbox<OccMsg>) {
        for (node, groups) in std::mem::take(&mut self.raft_outgoing) {
            let mut batch: Vec<RaftGroupMsgs> = Vec::new();
            let mut bytes = 0;
            for RaftGroupMsgs { shard, from_slot, msgs } in groups {
                let mut part = RaftGroupMsgs { shard, from_slot, msgs: Vec::new() };
                for msg in msgs {
                    if bytes > 0 && bytes + msg.0.len() > RAFT_SEND_BYTES_MAX {
                        if !part.msgs.is_empty() {
                            let full = RaftGroupMsgs { shard, from_slot, msgs: Vec::new() };
                            batch.push(std::mem::replace(&mut part, full));
                        }
                        out.send(node, OccMsg::Raft { groups: std::mem::take(&mut batch) });
                        bytes = 0;
                    }
                    bytes += msg.0.len();
                    part.msgs.push(msg);
                }
                if !part.msgs.is_empty() {
                    batch.push(part);
                }
            }
            if !batch.is_empty() {
                out.send(node, OccMsg::Raft { groups: batch });
            }
        }
    }

    /// Applies one command to a participant; the leader (`answer`) sends the replies.
    fn apply(
        context: &NodeContext,
        shard: ShardId,
        participant: &mut Participant,
        command: ShardCommand,
        answer: bool,
        out: &mut Outbox<OccMsg>,
    ) {
        match command {
            ShardCommand::Prepare {
                reply_to,
                now,
                txn,
                reads,
                scans,
                writes,
                one_phase,
                participants,
            } => {
                let args = PrepareArgs { reads, scans, writes, one_phase, participants };
                let vote = participant.on_prepare(now, txn, args);
                if answer {
                    out.send(reply_to, OccMsg::Prepared { txn, shard, vote });
                }
            }
            ShardCommand::ExecuteCommit { reply_to, now, txn, proc, args, want_sets } => {
                let mut result = participant.on_execute_commit(now, txn, proc, &args);
                if !answer {
                    return;
                }
                if !want_sets {
                    // Dropped here, where they were allocated, rather than on the coordinator.
                    for run in result.iter_mut().flat_map(|(runs, _)| runs.iter_mut()) {
                        run.reads = Vec::new();
                        run.scans = Vec::new();
                        if let Ok(effects) = run.effects.as_mut() {
                            effects.writes = Vec::new();
                        }
                    }
                }
                out.send(reply_to, OccMsg::ExecutedCommit { txn, shard, result });
            }
            ShardCommand::Decide { reply_to, txn, decision, peers } => {
                let decision = participant.on_decision(txn, decision);
                if !peers.is_empty() {
                    participant.note_terminated();
                }
                if !answer {
                    return;
                }
                for peer in peers {
                    for node in participant::replicas_of(context, peer) {
                        out.send(node, OccMsg::decision(txn, peer, decision));
                    }
                }
                if let Some(to) = reply_to {
                    out.send(to, OccMsg::Finished { txn, shard, decision });
                }
            }
            ShardCommand::Query { reply_to, txn } => {
                let state = participant.on_query(txn);
                if answer {
                    out.send(reply_to, OccMsg::State { txn, shard, state });
                }
            }
        }
    }
}

/// The node's entry points; the `Node` methods call them and then send the Raft messages the
/// call produced, coalesced per destination.
impl OccNode {
    fn handle_start(&mut self, _now: Time, out: &mut Outbox<OccMsg>) {
        if !self.hosts.is_empty() {
            self.timers.set(TimerPurpose::Gc, GC_INTERVAL_NS, out);
        }
        if self.hosts.values().any(|h| h.raft.is_some()) {
            self.timers.set(TimerPurpose::RaftTick, self.context.timing.raft_tick_ns, out);
            // A restarted replica installs its snapshot and replays its committed log now,
            // before it serves anything.
            let shards: Vec<ShardId> = self.hosts.keys().copied().collect();
            for shard in shards {
                let mut effects = Vec::new();
                if let Some(raft) = self.hosts.get_mut(&shard).and_then(|h| h.raft.as_mut()) {
                    raft.poll(&mut effects);
                }
                self.carry_out_replica(shard, effects, out);
            }
            if self.fresh || self.context.topology.replicas == 1 {
                // Replica 0 sits where the topology puts each shard's leader: on a first
                // start it campaigns at once instead of waiting out an election timeout (and a
                // one-member group always does: it needs no one's vote).
                let leads: Vec<ShardId> =
                    self.hosts.iter().filter(|(_, h)| h.slot == 0).map(|(&s, _)| s).collect();
                for shard in leads {
                    let mut effects = Vec::new();
                    if let Some(raft) = self.hosts.get_mut(&shard).and_then(|h| h.raft.as_mut()) {
                        raft.campaign(&mut effects);
                    }
                    self.carry_out_replica(shard, effects, out);
                }
            }
        }
        if let Some(c) = &self.coordinator {
            self.timers.set(TimerPurpose::CoordinatorTick, c.tick_ns(), out);
        }
    }

    fn handle_message(&mut self, now: Time, from: NodeId, msg: OccMsg, out: &mut Outbox<OccMsg>) {
        match msg {
            OccMsg::Raft { groups } => {
                for RaftGroupMsgs { shard, from_slot, msgs } in groups {
                    // The sender must be the node holding that slot; anything else is dropped.
                    if self.context.topology.replica_node(shard, from_slot) != Some(from) {
                        continue;
                    }
                    let Some(raft) = self.hosts.get_mut(&shard).and_then(|h| h.raft.as_mut())
                    else {
                        continue;
                    };
                    let mut effects = Vec::new();
                    raft.on_message(from_slot, msgs, &mut effects);
                    self.carry_out_replica(shard, effects, out);
                }
            }
            OccMsg::Forward { origin, msg } => self.on_shard_request(now, origin, *msg, false, out),
            request @ (OccMsg::Execute { .. }
            | OccMsg::ExecuteCommit { .. }
            | OccMsg::Prepare { .. }
            | OccMsg::Commit { .. }
            | OccMsg::Abort { .. }
            | OccMsg::Query { .. }) => self.on_shard_request(now, from, request, true, out),
            OccMsg::State { txn, shard, state } => {
                // For whoever asked: a participant terminating the attempt, or the coordinator.
                let mut verdicts = Vec::new();
                for (&mine, host) in self.hosts.iter_mut() {
                    if let Some((decision, peers)) =
                        host.participant.on_peer_state(txn, shard, state)
                    {
                        verdicts.push((mine, decision, peers));
                    }
                }
                for (mine, decision, peers) in verdicts {
                    let command = ShardCommand::Decide { reply_to: None, txn, decision, peers };
                    self.run_command(mine, command, out);
                }
                if let Some(c) = self.coordinator.as_mut() {
                    c.note_leader(shard, from);
                    c.on_state(now, txn, shard, state, &mut self.timers, out);
                }
            }
            reply @ (OccMsg::Executed { .. }
            | OccMsg::ExecutedCommit { .. }
            | OccMsg::Prepared { .. }
            | OccMsg::Finished { .. }) => {
                if let Some(c) = self.coordinator.as_mut() {
                    c.on_reply(now, from, reply, &mut self.timers, out);
                }
            }
        }
    }

    fn handle_timer(&mut self, now: Time, timer: TimerId, out: &mut Outbox<OccMsg>) {
        match self.timers.take(timer) {
            Some(TimerPurpose::Gc) => {
                for host in self.hosts.values_mut() {
                    let leads = host.leads();
                    host.participant.on_gc_tick(now, leads, out);
                }
                self.timers.set(TimerPurpose::Gc, GC_INTERVAL_NS, out);
            }
            Some(TimerPurpose::RaftTick) => {
                let shards: Vec<ShardId> = self.hosts.keys().copied().collect();
                for shard in shards {
                    let mut effects = Vec::new();
                    let Some(host) = self.hosts.get_mut(&shard) else { continue };
                    if let Some(raft) = host.raft.as_mut() {
                        raft.tick(&mut effects);
                        // Replica 0 sits where the topology wants the shard led (beside the
                        // coordinators of its region): after a failover, hand leadership back
                        // once it has caught up.
                        if raft.leader() != Some(0) && raft.is_caught_up(0) {
                            raft.transfer_leader(0, &mut effects);
                        }
                    }
                    self.carry_out_replica(shard, effects, out);
                }
                self.timers.set(TimerPurpose::RaftTick, self.context.timing.raft_tick_ns, out);
            }
            Some(TimerPurpose::CoordinatorTick) => {
                if let Some(c) = self.coordinator.as_mut() {
                    c.on_tick(now, &mut self.timers, out);
                    self.timers.set(TimerPurpose::CoordinatorTick, c.tick_ns(), out);
                }
            }
            Some(purpose) => {
                if let Some(c) = self.coordinator.as_mut() {
                    c.on_timer(now, purpose, out);
                }
            }
            None => {}
        }
    }

    fn handle_persisted(&mut self, _now: Time, token: PersistToken, out: &mut Outbox<OccMsg>) {
        let Some((shard, group_token)) = self.persists.remove(&token.0) else { return };
        let mut effects = Vec::new();
        if let Some(raft) = self.hosts.get_mut(&shard).and_then(|h| h.raft.as_mut()) {
            raft.on_persisted(group_token, &mut effects);
        }
        self.carry_out_replica(shard, effects, out);
    }
}

impl Node for OccNode {
    type Msg = OccMsg;

    fn on_start(&mut self, now: Time, out: &mut Outbox<OccMsg>) {
        self.handle_start(now, out);
        self.flush_raft(out);
    }

    fn on_message(&mut self, now: Time, from: NodeId, msg: OccMsg, out: &mut Outbox<OccMsg>) {
        self.handle_message(now, from, msg, out);
        self.flush_raft(out);
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, out: &mut Outbox<OccMsg>) {
        self.handle_timer(now, timer, out);
        self.flush_raft(out);
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        // Summed over the shards hosted here.
        let mut counters: BTreeMap<&'static str, u64> = BTreeMap::new();
        for host in self.hosts.values() {
            for (name, value) in host.participant.counters() {
                *counters.entry(name).or_default() += value;
            }
            if let Some(raft) = &host.raft {
                *counters.entry("occ_raft_groups_led").or_default() += u64::from(raft.is_leader());
                *counters.entry("occ_raft_log_entries").or_default() += raft.log_entries();
                let snapshots = raft.snapshot_counts();
                *counters.entry("occ_raft_snapshots_taken").or_default() += snapshots.taken;
                *counters.entry("occ_raft_snapshots_received").or_default() += snapshots.received;
                *counters.entry("occ_raft_snapshots_restored").or_default() += snapshots.restored;
            }
        }
        if let Some(c) = &self.coordinator {
            counters.extend(c.counters());
        }
        counters.into_iter().collect()
    }

    fn on_persisted(&mut self, now: Time, token: PersistToken, out: &mut Outbox<OccMsg>) {
        self.handle_persisted(now, token, out);
        self.flush_raft(out);
    }

    fn on_persisted_batch(&mut self, now: Time, tokens: &[PersistToken], out: &mut Outbox<OccMsg>) {
        // The Raft messages the whole group commit releases leave together.
        for &token in tokens {
            self.handle_persisted(now, token, out);
        }
        self.flush_raft(out);
    }

    fn submit(&mut self, now: Time, request: ClientRequest, out: &mut Outbox<OccMsg>) {
        match self.coordinator.as_mut() {
            Some(c) => c.submit(now, request, out),
            None => out.reply(
                request.id,
                meridian_core::txn::TxnOutcome::failed(meridian_core::txn::TxnFailure::Rejected(
                    format!("node {} is not a coordinator", self.id),
                )),
            ),
        }
    }
}

impl ProtocolNode for OccNode {
    fn stores(&self) -> Vec<(ShardId, &MvccStore)> {
        self.hosts.iter().map(|(&shard, h)| (shard, h.participant.store())).collect()
    }

    fn stores_mut(&mut self) -> Vec<(ShardId, &mut MvccStore)> {
        self.hosts.iter_mut().map(|(&shard, h)| (shard, h.participant.store_mut())).collect()
    }
}

/// A write as the coordinator buffers it.
type WriteBuffer = BTreeMap<Key, Option<Value>>;

#[cfg(test)]
mod tests;
