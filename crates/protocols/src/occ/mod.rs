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
//! Replication seam: this module runs one replica per shard. The replication issue puts each
//! participant's prepare and decision records through the shard's Raft log (see
//! `Participant::on_prepare` and `Participant::on_decision`) before votes and acks are sent.

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
use meridian_storage::MvccStore;
use participant::{Participant, PrepareArgs};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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

/// A node running `occ`: participants for the shards it hosts, and a coordinator if clients
/// submit here.
pub struct OccNode {
    id: NodeId,
    participants: BTreeMap<ShardId, Participant>,
    coordinator: Option<Coordinator>,
    timers: Timers,
}

impl OccNode {
    /// Builds the node described by `context`.
    pub fn new(context: NodeContext) -> Self {
        let info = &context.topology.nodes[context.id.0 as usize];
        let participants = info
            .replicas
            .iter()
            .map(|slot| (slot.shard, Participant::new(slot.shard, context.clone())))
            .collect();
        let coordinator = info.coordinator.then(|| Coordinator::new(context.clone()));
        Self { id: context.id, participants, coordinator, timers: Timers::default() }
    }

    /// Replaces the procedure registry everywhere in this node (tests register extra procedures).
    #[cfg(test)]
    fn set_registry(&mut self, registry: std::sync::Arc<meridian_core::txn::Registry>) {
        for participant in self.participants.values_mut() {
            participant.set_registry(registry.clone());
        }
        if let Some(c) = self.coordinator.as_mut() {
            c.set_registry(registry);
        }
    }

    /// The participant for `shard`, if hosted here.
    fn participant(&mut self, shard: ShardId) -> Option<&mut Participant> {
        self.participants.get_mut(&shard)
    }
}

impl Node for OccNode {
    type Msg = OccMsg;

    fn on_start(&mut self, _now: Time, out: &mut Outbox<OccMsg>) {
        if !self.participants.is_empty() {
            self.timers.set(TimerPurpose::Gc, GC_INTERVAL_NS, out);
        }
        if let Some(c) = &self.coordinator {
            self.timers.set(TimerPurpose::CoordinatorTick, c.tick_ns(), out);
        }
    }

    fn on_message(&mut self, now: Time, from: NodeId, msg: OccMsg, out: &mut Outbox<OccMsg>) {
        match msg {
            OccMsg::Execute { txn, shard, proc, args, calls, overlay } => {
                if let Some(p) = self.participant(shard) {
                    let result = p.on_execute(txn, proc, &args, &calls, overlay);
                    out.send(from, OccMsg::Executed { txn, shard, result });
                }
            }
            OccMsg::ExecuteCommit { txn, shard, proc, args, want_sets } => {
                if let Some(p) = self.participant(shard) {
                    let mut result = p.on_execute_commit(now, txn, proc, &args);
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
                    out.send(from, OccMsg::ExecutedCommit { txn, shard, result });
                }
            }
            OccMsg::Prepare { txn, shard, reads, scans, writes, one_phase, participants } => {
                if let Some(p) = self.participant(shard) {
                    let vote = p.on_prepare(
                        now,
                        txn,
                        PrepareArgs { reads, scans, writes, one_phase, participants },
                    );
                    out.send(from, OccMsg::Prepared { txn, shard, vote });
                }
            }
            OccMsg::Commit { txn, shard, ts } => {
                if let Some(p) = self.participant(shard) {
                    let decision = p.on_decision(txn, Decision::Committed(ts));
                    out.send(from, OccMsg::Finished { txn, shard, decision });
                }
            }
            OccMsg::Abort { txn, shard } => {
                if let Some(p) = self.participant(shard) {
                    let decision = p.on_decision(txn, Decision::Aborted);
                    out.send(from, OccMsg::Finished { txn, shard, decision });
                }
            }
            OccMsg::Query { txn, shard } => {
                if let Some(p) = self.participant(shard) {
                    let state = p.on_query(txn);
                    out.send(from, OccMsg::State { txn, shard, state });
                }
            }
            OccMsg::State { txn, shard, state } => {
                // For whoever asked: a participant terminating the attempt, or the coordinator.
                for participant in self.participants.values_mut() {
                    participant.on_peer_state(txn, shard, state, out);
                }
                if let Some(c) = self.coordinator.as_mut() {
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

    fn on_timer(&mut self, now: Time, timer: TimerId, out: &mut Outbox<OccMsg>) {
        match self.timers.take(timer) {
            Some(TimerPurpose::Gc) => {
                for participant in self.participants.values_mut() {
                    participant.on_gc_tick(now, out);
                }
                self.timers.set(TimerPurpose::Gc, GC_INTERVAL_NS, out);
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

    fn counters(&self) -> Vec<(&'static str, u64)> {
        // Summed over the shards hosted here.
        let mut counters: BTreeMap<&'static str, u64> = BTreeMap::new();
        for participant in self.participants.values() {
            for (name, value) in participant.counters() {
                *counters.entry(name).or_default() += value;
            }
        }
        if let Some(c) = &self.coordinator {
            counters.extend(c.counters());
        }
        counters.into_iter().collect()
    }

    fn on_persisted(&mut self, _now: Time, _token: PersistToken, _out: &mut Outbox<OccMsg>) {
        // Nothing is persisted until the replication issue adds the log.
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
        self.participants.iter().map(|(&shard, p)| (shard, p.store())).collect()
    }

    fn stores_mut(&mut self) -> Vec<(ShardId, &mut MvccStore)> {
        self.participants.iter_mut().map(|(&shard, p)| (shard, p.store_mut())).collect()
    }
}

/// A write as the coordinator buffers it.
type WriteBuffer = BTreeMap<Key, Option<Value>>;

#[cfg(test)]
mod tests;
