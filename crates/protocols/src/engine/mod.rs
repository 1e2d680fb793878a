//! The two-phase commit engine of the OCC family (`occ`, `2pl`, `2pc-mvto`, `mako`), built on
//! the protocol kit: coordinators that run a transaction's pieces in waves, prepare and decide;
//! participants that hold each shard's state in its Raft log. How a protocol keeps
//! transactions apart is its [`participant::Concurrency`] value and its [`Style`] (see
//! [`Family`]); this module names none of them. The flow below is `occ`'s, the family's base
//! (docs/protocols/occ.md); the others' differences are in their own modules.
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
//!    decided; `Commit`/`Abort` go again, paced, until every participant acknowledges, and the
//!    coordinator then tells the participants the commit is settled (they may forget it).
//!
//! **The commit rule.** An attempt commits exactly when every participant has prepared it. The
//! coordinator never aborts an attempt whose votes are merely missing: it sends `Query` to the
//! silent participants, and a participant that has not prepared the attempt refuses it for good
//! (answers aborted), after which aborting is safe; one that has prepared counts as a yes. A
//! participant holding a prepared attempt whose coordinator went quiet (crashed, partitioned)
//! for a few RPC timeouts asks the other participants' leaders, paced by the RPC timeout: any
//! decided → that decision; all prepared → commit at the largest proposal, which is what the
//! coordinator would have chosen. So a coordinator crash after its decision never leaves a
//! transaction half applied, and prepared locks never outlive a crashed coordinator.
//!
//! Two shortcuts that keep the guarantees: when every piece lives on one shard the coordinator
//! sends `ExecuteCommit`, which runs and commits atomically at that shard (one round trip;
//! option `occ-one-round`); when only one shard participates in prepare it commits there at
//! once (one-phase commit).
//!
//! # Failure handling
//!
//! Messages may be lost, duplicated or reordered. Every handler is idempotent; participants
//! remember decided attempts (`kit::twopc`: commits until settled, then a bounded number, and
//! "forgotten" is never mistaken for "aborted"), so a late `Prepare` after an `Abort` is
//! refused and a duplicate `Commit` is acknowledged again. An attempt whose outcome the
//! coordinator cannot know (a one-round commit that timed out) is resolved by asking with
//! `Abort`: the participant either aborts it for good or answers that it committed, so a
//! request never commits twice. Attempt ids carry the coordinator's incarnation, so a
//! restarted coordinator never reuses one.
//!
//! Requests are checked before they enter a shard's log (keys on the shard, no key twice, a
//! sound participant list); a malformed one costs its sender the request, never the shard.
//!
//! # Replication
//!
//! Each hosted participant runs on the kit's hosting ([`crate::kit::host`]): with more than
//! one replica per shard (or a durable driver) every state change is a [`ShardCommand`] in the
//! shard's Raft log, applied by every replica with the inputs the leader logged (its clock
//! reading included) and answered by the leader once committed. Reads for execution come from
//! the leader's state (read-index) and are validated at prepare. A follower forwards requests to
//! the leader it knows; coordinators learn leaders from replies and try the next replica after
//! a timeout.

mod coordinator;
pub(crate) mod participant;
pub mod speculation;

use crate::kit::exec::{PieceCall, PieceRun, ScanCheck, VersionTag};
use crate::kit::host::{Hosts, RaftGroupMsgs, Route};
use crate::kit::timers::Timers;
use crate::kit::twopc::{Concluded, Decision, PeerState};
use crate::{Durable, NodeContext, OptionSpec, ProtocolNode, Replayed};
use coordinator::Coordinator;
use meridian_core::key::Key;
use meridian_core::node::{ClientRequest, Node, Outbox, PersistToken, TimerId};
use meridian_core::topology::Topology;
use meridian_core::txn::{Args, ProcError, ProcId, Write};
use meridian_core::{ConfigError, NodeId, RequestId, ShardId, Time, Timestamp, TxnId};
use meridian_storage::MvccStore;
use participant::{Concurrency, Participant};
use serde::{Deserialize, Serialize};
use speculation::{Entry, Report, Speculation};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Why a participant voted no or refused a one-round commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Conflict {
    /// A read or scan is no longer current.
    Stale,
    /// Another prepared attempt holds a conflicting lock (`occ`); a lock was refused at
    /// execution, or is no longer held at prepare (`2pl`).
    Locked,
    /// An older attempt wounded this one (`2pl` wound-wait).
    Wounded,
    /// Its execution locks were released after it was idle for the lease (`2pl`).
    LeaseExpired,
    /// Its timestamp is not above a version, a read stamp or the GC watermark of a key it
    /// touches (`2pc-mvto`); carries that timestamp, so the retry starts above it.
    TooOld(Timestamp),
    /// It read a pending version whose writer aborted (`2pc-mvto`).
    Cascading,
    /// The attempt was already aborted here.
    AlreadyAborted,
    /// The shard holds as many undecided and unsettled attempts as it may: try again later.
    Full,
    /// The request is malformed (refused before it entered the log).
    Invalid,
    /// It runs in another epoch than the shard's, or the shard's epoch is closing (`mako`).
    Epoch,
}

/// A participant's answer to `Prepare`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Vote {
    /// Prepared; commit no earlier than this timestamp.
    Yes(Timestamp),
    /// Committed at this timestamp (one-phase prepare, or decided by the participants).
    Committed(Timestamp),
    /// Cannot commit.
    No(Conflict),
    /// Decided here once and forgotten since: the outcome is not known here.
    Forgotten,
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
    /// This attempt was decided here and forgotten since.
    Forgotten,
}

/// What a `Prepare` asks of one participant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrepareArgs {
    /// Reads on this shard and the versions seen.
    pub reads: Vec<(Key, Option<VersionTag>)>,
    /// Scans on this shard and the rows seen.
    pub scans: Vec<ScanCheck>,
    /// Writes on this shard.
    pub writes: Vec<Write>,
    /// The only participant: commit at once if valid.
    pub one_phase: bool,
    /// Every participant of the attempt, in shard order (for termination without the
    /// coordinator).
    pub participants: Vec<ShardId>,
    /// The attempt's timestamp (`2pc-mvto`: its reads were at it and it commits at it; zero
    /// under the other protocols).
    pub ts: Timestamp,
    /// The epoch the attempt runs in (`mako`: a shard in another epoch refuses it; zero under
    /// the other protocols).
    pub epoch: u64,
}

/// A request to one shard's participant. Not recursive: a forwarded request wraps one of
/// these, never a message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ShardRequest {
    /// Run these pieces; keep nothing.
    Execute {
        /// The attempt.
        txn: TxnId,
        /// The shard asked.
        shard: ShardId,
        /// The request's age for wound-wait (`2pl`): the coordinator's clock when the request
        /// arrived (smaller is older; attempt ids break ties).
        priority: u64,
        /// The attempt's timestamp: reads see the newest version below it (`2pc-mvto`; zero
        /// under the other protocols).
        ts: Timestamp,
        /// The procedure.
        proc: ProcId,
        /// Its arguments.
        args: Args,
        /// Pieces to run, in plan order.
        calls: Vec<PieceCall>,
        /// The attempt's earlier writes on this shard (read-your-writes).
        overlay: Vec<Write>,
    },
    /// Run every piece (all on this shard) and commit atomically.
    ExecuteCommit {
        /// The attempt.
        txn: TxnId,
        /// The shard.
        shard: ShardId,
        /// The attempt's timestamp (`2pc-mvto`; zero under the other protocols).
        ts: Timestamp,
        /// The attempt's epoch (`mako`; zero under the other protocols).
        epoch: u64,
        /// The procedure.
        proc: ProcId,
        /// Its arguments.
        args: Args,
    },
    /// Validate and lock.
    Prepare {
        /// The attempt.
        txn: TxnId,
        /// The shard.
        shard: ShardId,
        /// What to validate, lock and later write.
        args: PrepareArgs,
    },
    /// Install the writes at `ts` and release.
    Commit {
        /// The attempt.
        txn: TxnId,
        /// The shard.
        shard: ShardId,
        /// The commit timestamp.
        ts: Timestamp,
    },
    /// Release, and refuse this attempt from now on. Also asks the outcome of an attempt the
    /// coordinator lost track of.
    Abort {
        /// The attempt.
        txn: TxnId,
        /// The shard.
        shard: ShardId,
    },
    /// Where does this attempt stand here? A shard that never saw it refuses it from now on
    /// (answers aborted), so the asker's verdict cannot be overtaken by a late prepare.
    Query {
        /// The attempt.
        txn: TxnId,
        /// The shard asked.
        shard: ShardId,
    },
    /// Every participant of these committed attempts has their decision: forget them when
    /// room is needed.
    Settle {
        /// The shard.
        shard: ShardId,
        /// The attempts.
        txns: Vec<TxnId>,
    },
}

impl ShardRequest {
    /// The request that carries `decision` on `txn` to `shard`: `Commit` or `Abort`.
    fn decision(txn: TxnId, shard: ShardId, decision: Decision) -> Self {
        match decision {
            Decision::Committed(ts) => Self::Commit { txn, shard, ts },
            Decision::Aborted => Self::Abort { txn, shard },
        }
    }

    /// The shard it is for.
    fn shard(&self) -> ShardId {
        match self {
            Self::Execute { shard, .. }
            | Self::ExecuteCommit { shard, .. }
            | Self::Prepare { shard, .. }
            | Self::Commit { shard, .. }
            | Self::Abort { shard, .. }
            | Self::Query { shard, .. }
            | Self::Settle { shard, .. } => *shard,
        }
    }
}

/// Messages of the `occ` protocol.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum OccMsg {
    /// To a participant (from a coordinator or another participant).
    Request(ShardRequest),
    /// A follower hands a request it received to the leader it knows; the leader answers
    /// `origin`. Never forwarded twice.
    Forward {
        /// Who sent the request.
        origin: NodeId,
        /// The request.
        request: ShardRequest,
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
    /// Participant → coordinator: the outputs and the commit timestamp (or why not).
    ExecutedCommit {
        /// The attempt.
        txn: TxnId,
        /// The shard.
        shard: ShardId,
        /// Runs (outputs only) and commit timestamp; a user abort commits nothing.
        result: Result<(Vec<PieceRun>, Option<Timestamp>), ExecFailure>,
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
    /// Participant → whoever sent a decision: the attempt is finished here, with this outcome
    /// (`Decided`), or was decided and forgotten (`Forgotten`: applied then, outcome unknown).
    Finished {
        /// The attempt.
        txn: TxnId,
        /// The shard.
        shard: ShardId,
        /// Where it stands (never `Prepared`).
        state: PeerState,
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
    /// sender (one message per destination per call, however many groups a node runs).
    Raft {
        /// Per group: the shard, the sender's slot in it, the messages.
        groups: Vec<RaftGroupMsgs>,
    },
    /// Shard leader → every node (`mako`): its replicated watermark and epoch.
    Watermark(Report),
}

/// A state change of one shard's participant, as its Raft log carries it. Every replica
/// applies the same commands in the same order with the same inputs (the leader's clock
/// reading included), so every replica's participant reaches the same state; only the leader
/// answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ShardCommand {
    /// A prepare from `reply_to`.
    Prepare {
        /// Who asked.
        reply_to: NodeId,
        /// The leader's clock.
        now: Time,
        /// The attempt.
        txn: TxnId,
        /// Refused by the leader before it entered the log (`2pl`: the attempt no longer holds
        /// its execution locks); applying it records the refusal, so a duplicate prepare
        /// cannot prepare the attempt later.
        refused: Option<Conflict>,
        /// What to validate and lock.
        args: PrepareArgs,
    },
    /// A one-round commit from `reply_to`.
    ExecuteCommit {
        /// Who asked.
        reply_to: NodeId,
        /// The leader's clock.
        now: Time,
        /// The attempt.
        txn: TxnId,
        /// Refused by the leader before it entered the log (`2pl`: a conflicting execution
        /// lock); applying it records the refusal, so a duplicate of the request cannot commit
        /// the attempt after its coordinator moved on.
        refused: Option<Conflict>,
        /// The attempt's timestamp (`2pc-mvto`; zero under the other protocols).
        ts: Timestamp,
        /// The attempt's epoch (`mako`; zero under the other protocols).
        epoch: u64,
        /// The procedure.
        proc: ProcId,
        /// Its arguments.
        args: Args,
    },
    /// A decision from `reply_to`, or reached by this shard's termination (`tell`: the peers
    /// to inform).
    Decide {
        /// Who to acknowledge.
        reply_to: Option<NodeId>,
        /// The leader's clock.
        now: Time,
        /// The attempt.
        txn: TxnId,
        /// The decision.
        decision: Decision,
        /// Peers to tell (termination only).
        tell: Vec<ShardId>,
    },
    /// A query from `reply_to`.
    Query {
        /// Who asked.
        reply_to: NodeId,
        /// The leader's clock.
        now: Time,
        /// The attempt.
        txn: TxnId,
    },
    /// Commits every participant has: they may be forgotten.
    Settle {
        /// The attempts.
        txns: Vec<TxnId>,
    },
    /// A speculative protocol's watermark tick or epoch change, proposed by the shard's
    /// leader (`mako`).
    Speculation(Entry),
}

/// Purpose of a timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TimerPurpose {
    /// Participant housekeeping: GC watermark, inquiries.
    Gc,
    /// Coordinator housekeeping: time out attempts, deliver decisions.
    CoordinatorTick,
    /// Start the next attempt of a request after backoff.
    Retry { request: RequestId },
    /// Tick every Raft group hosted here.
    RaftTick,
    /// A speculative protocol's periodic work: tick the watermarks, move epochs, report.
    Speculation,
}

/// How often participants raise their GC watermark and look after their inquiries.
const GC_INTERVAL_NS: u64 = 100 * meridian_core::time::NS_PER_MS;

/// Makes a participant's concurrency control from the node's context.
pub(crate) type MakeControl = Arc<dyn Fn(&NodeContext) -> Box<dyn Concurrency> + Send + Sync>;

/// Makes a speculative protocol's node-level part from the node's context.
pub(crate) type MakeSpeculation = fn(&NodeContext) -> Box<dyn Speculation>;

/// What a protocol of the family gives the engine: its name, the concurrency control of its
/// participants, and how its coordinators run attempts.
#[derive(Clone)]
pub(crate) struct Family {
    /// The protocol's name, for messages.
    pub(crate) name: &'static str,
    /// Makes one participant's concurrency control.
    pub(crate) control: MakeControl,
    /// Makes the node-level part of a protocol whose leaders commit speculatively (its
    /// leaders' participants then run on the hosting's speculative copies).
    pub(crate) speculation: Option<MakeSpeculation>,
    /// How coordinators run attempts.
    pub(crate) style: Style,
}

/// How a protocol's coordinators run attempts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Style {
    /// The option that turns one-round commits of single-shard transactions on or off, and
    /// the protocol's options (where its default is).
    pub(crate) one_round: (&'static str, &'static [OptionSpec]),
    /// Participants lock at execution: executions carry the request's age, and an attempt
    /// that ends before prepare tells the shards that ran its pieces.
    pub(crate) locks_at_execution: bool,
    /// Attempts carry timestamps, read and commit at them.
    pub(crate) timestamps: bool,
}

/// Replicated shards need an odd replica count (a Raft group each); `name` names the
/// protocol in the error.
pub(crate) fn check_topology(name: &str, topology: &Topology) -> Result<(), ConfigError> {
    if topology.replicas != 1 && topology.replicas.is_multiple_of(2) {
        return Err(ConfigError::new(format!(
            "{name} replicates each shard with Raft, which needs an odd replica count (got {})",
            topology.replicas
        )));
    }
    Ok(())
}

/// With replicated shards every node may crash (its log is durable and its group has other
/// members); unreplicated shards keep their data only in memory in the simulator, so only
/// coordinators that host no replica may.
pub(crate) fn may_crash(topology: &Topology, node: NodeId) -> bool {
    topology.replicas >= 3 || topology.nodes[node.0 as usize].replicas.is_empty()
}

/// A node running `occ` (or `2pl`): participants for the shards it hosts, and a coordinator if
/// clients submit here.
pub struct OccNode {
    id: NodeId,
    context: NodeContext,
    hosts: Hosts<Participant>,
    coordinator: Option<Coordinator>,
    timers: Timers<TimerPurpose>,
    /// A speculative protocol's node-level part.
    speculation: Option<Box<dyn Speculation>>,
    /// The protocol's name.
    name: &'static str,
}

impl OccNode {
    /// Builds the node of the protocol `family` describes from what its disk holds
    /// (`durable`): each hosted Raft group rebuilds its log, and replays it into the participant
    /// (whose store the caller has bulk-loaded with the initial data) when the node starts.
    pub(crate) fn restore_as(
        context: NodeContext,
        durable: &Durable,
        family: Family,
    ) -> Result<Self, String> {
        let shard_context = context.clone();
        let control = family.control.clone();
        let make = |shard| Participant::new(shard, shard_context.clone(), control(&context));
        let wrap = |groups| OccMsg::Raft { groups };
        let speculative = family.speculation.is_some();
        let hosts = if speculative {
            Hosts::restore_speculative(&context, durable, wrap, make, Participant::fork)?
        } else {
            Hosts::restore(&context, durable, wrap, make)?
        };
        let info = &context.topology.nodes[context.id.0 as usize];
        let coordinator =
            info.coordinator.then(|| Coordinator::new(context.clone(), family.style, speculative));
        let speculation = family.speculation.map(|make| make(&context));
        let name = family.name;
        Ok(Self {
            id: context.id,
            context,
            hosts,
            coordinator,
            timers: Timers::default(),
            speculation,
            name,
        })
    }

    /// Installs the snapshots and applies every command the restored logs hold as committed,
    /// answering nobody (`meridian verify` checks the result).
    pub fn replay_committed(&mut self) -> Replayed {
        self.hosts.replay_committed()
    }

    /// Replaces the procedure registry everywhere in this node (tests register extra procedures).
    #[cfg(test)]
    fn set_registry(&mut self, registry: std::sync::Arc<meridian_core::txn::Registry>) {
        for (_, participant, _) in self.hosts.iter_mut() {
            participant.set_registry(registry.clone());
        }
        if let Some(c) = self.coordinator.as_mut() {
            c.set_registry(registry);
        }
    }

    /// A request for one of this node's shards, from `origin`. A follower forwards it to the
    /// leader it knows (once: `may_forward` is false for forwarded requests) and drops it when
    /// it knows none; the sender's timeouts resend.
    fn on_shard_request(
        &mut self,
        now: Time,
        origin: NodeId,
        request: ShardRequest,
        may_forward: bool,
        out: &mut Outbox<OccMsg>,
    ) {
        let shard = request.shard();
        match self.hosts.route(shard) {
            Route::Here => {}
            Route::Forward(leader) if may_forward => {
                out.send(leader, OccMsg::Forward { origin, request });
                return;
            }
            Route::Forward(_) | Route::Drop => return,
        }
        self.close_epoch_if_new(shard, out);
        let command = match request {
            execute @ ShardRequest::Execute { .. } => {
                // Served from the leader's state once it is current (read-index under the
                // leader's lease); prepare validates the reads again.
                self.hosts.read(shard, (origin, now, execute), out);
                return;
            }
            ShardRequest::ExecuteCommit { txn, ts, epoch, proc, args, .. } => {
                // Under locking the leader takes the commit's locks first (or records why not).
                let window = self.hosts.has_log(shard);
                let refused = self
                    .hosts
                    .get_mut(shard)
                    .and_then(|p| p.lock_one_round(now, txn, proc, &args, window));
                ShardCommand::ExecuteCommit {
                    reply_to: origin,
                    now,
                    txn,
                    refused,
                    ts,
                    epoch,
                    proc,
                    args,
                }
            }
            ShardRequest::Prepare { txn, args, .. } => {
                // Under `2pc-mvto` a prepare that read a pending version waits here for its
                // writer's decision (it comes back through `resume_waiting`).
                let Some((args, held)) =
                    self.hosts.get_mut(shard).and_then(|p| p.hold_prepare(now, origin, txn, args))
                else {
                    return;
                };
                // Under locking the attempt must still hold its execution locks here; under
                // `2pc-mvto` its writes must be above the reads the leader served.
                let refused = held
                    .or_else(|| self.hosts.get_mut(shard).and_then(|p| p.may_prepare(txn, &args)));
                ShardCommand::Prepare { reply_to: origin, now, txn, refused, args }
            }
            ShardRequest::Commit { txn, ts, .. } => ShardCommand::Decide {
                reply_to: Some(origin),
                now,
                txn,
                decision: Decision::Committed(ts),
                tell: Vec::new(),
            },
            ShardRequest::Abort { txn, .. } => {
                if let Some(participant) = self.hosts.get_mut(shard) {
                    participant.abandon_exec(now, txn, out);
                }
                ShardCommand::Decide {
                    reply_to: Some(origin),
                    now,
                    txn,
                    decision: Decision::Aborted,
                    tell: Vec::new(),
                }
            }
            ShardRequest::Query { txn, .. } => ShardCommand::Query { reply_to: origin, now, txn },
            ShardRequest::Settle { txns, .. } => ShardCommand::Settle { txns },
        };
        // Which answer a refusal gets (built only if the command is refused).
        let refusal = match &command {
            ShardCommand::Prepare { txn, .. } => Some((*txn, true)),
            ShardCommand::ExecuteCommit { txn, .. } => Some((*txn, false)),
            _ => None,
        };
        if let Err(why) = self.hosts.submit(shard, command, out) {
            // Refused before it entered the log: the sender hears why (requests that expect no
            // answer are dropped and counted), and execution locks taken for it go.
            if let (Some((txn, _)), Some(participant)) = (refusal, self.hosts.get_mut(shard)) {
                participant.release_exec(now, txn, out);
            }
            match refusal {
                Some((txn, true)) => {
                    let vote = Vote::No(Conflict::Invalid);
                    out.send(origin, OccMsg::Prepared { txn, shard, vote });
                }
                Some((txn, false)) => {
                    let result = Err(ExecFailure::Procedure(ProcError::Contract(why)));
                    out.send(origin, OccMsg::ExecutedCommit { txn, shard, result });
                }
                None => {}
            }
        }
    }

    /// A speculative protocol's periodic work (see [`Speculation::tick`]): the entries go
    /// through the shards' logs, the reports to every node and to this one.
    fn speculation_tick(&mut self, now: Time, out: &mut Outbox<OccMsg>) {
        let Some(speculation) = self.speculation.as_mut() else { return };
        let (entries, reports) = speculation.tick(&mut self.hosts, now);
        for (shard, entry) in entries {
            // Built from the participant's own state: always valid.
            let _ = self.hosts.submit(shard, ShardCommand::Speculation(entry), out);
        }
        for (report, chain) in reports {
            // The report waits on the commits its watermark covers (measurement only).
            for node in self.context.topology.node_ids() {
                if node != self.id {
                    out.send_after(node, OccMsg::Watermark(report.clone()), chain);
                }
            }
            self.on_report(now, self.id, report, chain, out);
        }
    }

    /// A leader new to its term closes the epoch before it handles any request (the tick
    /// would, an interval later; requests in between would only prepare attempts bound to be
    /// discarded).
    fn close_epoch_if_new(&mut self, shard: ShardId, out: &mut Outbox<OccMsg>) {
        let Some(speculation) = self.speculation.as_ref() else { return };
        let Some(entry) = self.hosts.get(shard).and_then(|p| speculation.close_entry(p)) else {
            return;
        };
        // Built from the participant's own state: always valid.
        let _ = self.hosts.submit(shard, ShardCommand::Speculation(entry), out);
    }

    /// A shard leader's report; once believed, the coordinator looks at the commits it holds
    /// back.
    fn on_report(
        &mut self,
        now: Time,
        from: NodeId,
        report: Report,
        report_chain: u16,
        out: &mut Outbox<OccMsg>,
    ) {
        let Some(speculation) = self.speculation.as_mut() else { return };
        if !speculation.on_report(&self.context.topology, from, &report) {
            return;
        }
        if let Some(c) = self.coordinator.as_mut() {
            let view = speculation.durability();
            c.on_watermarks(now, view, report_chain, &mut self.timers, out);
        }
    }

    /// `2pc-mvto`: prepares held back for a writer's decision whose writers are now decided go
    /// on (they may wait again, for another writer).
    fn resume_waiting(&mut self, now: Time, out: &mut Outbox<OccMsg>) {
        let mut ready = Vec::new();
        for (shard, participant, _) in self.hosts.iter_mut() {
            ready.extend(participant.take_unblocked().into_iter().map(|w| (shard, w)));
        }
        for (shard, (origin, txn, args)) in ready {
            let request = ShardRequest::Prepare { txn, shard, args };
            self.on_shard_request(now, origin, request, false, out);
        }
    }

    /// What a participant's inquiry concluded: put a decision or settlement through the
    /// shard's log, or tell a peer that never heard the decision.
    fn on_concluded(
        &mut self,
        now: Time,
        shard: ShardId,
        txn: TxnId,
        concluded: Concluded,
        out: &mut Outbox<OccMsg>,
    ) {
        let command = match concluded {
            Concluded::Decided(decision) => {
                let tell =
                    self.hosts.get(shard).map(|p| p.participants_of(txn)).unwrap_or_default();
                ShardCommand::Decide { reply_to: None, now, txn, decision, tell }
            }
            Concluded::Settled => ShardCommand::Settle { txns: vec![txn] },
            Concluded::Tell(peer, decision) => {
                if let Some(participant) = self.hosts.get(shard) {
                    let request = ShardRequest::decision(txn, peer, decision);
                    out.send(participant.leader_of(peer), OccMsg::Request(request));
                }
                return;
            }
        };
        // Built from this participant's own state: always valid.
        let _ = self.hosts.submit(shard, command, out);
    }
}

/// The node's entry points; the `Node` methods call them and then send the Raft messages the
/// call produced, coalesced per destination.
impl OccNode {
    fn handle_start(&mut self, _now: Time, out: &mut Outbox<OccMsg>) {
        if !self.hosts.is_empty() {
            self.timers.set(TimerPurpose::Gc, GC_INTERVAL_NS, out);
        }
        if self.hosts.has_logs() {
            self.timers.set(TimerPurpose::RaftTick, self.context.timing.raft_tick_ns, out);
            self.hosts.on_start(out);
        }
        if let Some(c) = &self.coordinator {
            self.timers.set(TimerPurpose::CoordinatorTick, c.tick_ns(), out);
        }
        if let Some(speculation) = &self.speculation {
            self.timers.set(TimerPurpose::Speculation, speculation.interval_ns(), out);
        }
    }

    fn handle_message(&mut self, now: Time, from: NodeId, msg: OccMsg, out: &mut Outbox<OccMsg>) {
        match msg {
            OccMsg::Raft { groups } => self.hosts.on_raft(from, groups, out),
            OccMsg::Watermark(report) => self.on_report(now, from, report, 0, out),
            OccMsg::Request(request) => self.on_shard_request(now, from, request, true, out),
            OccMsg::Forward { origin, request } => {
                // Only a node hosting a replica of the shard forwards to its leader.
                let hosts =
                    self.context.topology.nodes.get(from.0 as usize).is_some_and(|n| {
                        n.replicas.iter().any(|slot| slot.shard == request.shard())
                    });
                if hosts && (origin.0 as usize) < self.context.topology.nodes.len() {
                    self.on_shard_request(now, origin, request, false, out)
                }
            }
            OccMsg::State { txn, shard, state } => {
                // For whoever asked: a participant inquiring about the attempt, or the
                // coordinator.
                let mut concluded = Vec::new();
                for (mine, participant, _) in self.hosts.iter_mut() {
                    if let Some(c) = participant.on_peer_state(from, txn, shard, state) {
                        concluded.push((mine, c));
                    }
                }
                for (mine, c) in concluded {
                    self.on_concluded(now, mine, txn, c, out);
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
                for (_, participant, leads) in self.hosts.iter_mut() {
                    participant.on_gc_tick(now, leads, out);
                }
                // `mako` leaders' committed copies collect their history too.
                for (_, participant) in self.hosts.shadowed_mut() {
                    participant.on_gc_tick(now, false, out);
                }
                self.timers.set(TimerPurpose::Gc, GC_INTERVAL_NS, out);
            }
            Some(TimerPurpose::Speculation) => {
                self.speculation_tick(now, out);
                if let Some(speculation) = &self.speculation {
                    self.timers.set(TimerPurpose::Speculation, speculation.interval_ns(), out);
                }
            }
            Some(TimerPurpose::RaftTick) => {
                self.hosts.tick(out);
                self.timers.set(TimerPurpose::RaftTick, self.context.timing.raft_tick_ns, out);
            }
            Some(TimerPurpose::CoordinatorTick) => {
                if let Some(c) = self.coordinator.as_mut() {
                    c.on_tick(now, &mut self.timers, out);
                    self.timers.set(TimerPurpose::CoordinatorTick, c.tick_ns(), out);
                }
            }
            Some(TimerPurpose::Retry { request }) => {
                if let Some(c) = self.coordinator.as_mut() {
                    c.on_retry_timer(now, request, out);
                }
            }
            None => {}
        }
    }
}

impl Node for OccNode {
    type Msg = OccMsg;

    fn on_start(&mut self, now: Time, out: &mut Outbox<OccMsg>) {
        self.handle_start(now, out);
        self.hosts.flush(out);
    }

    fn on_message(&mut self, now: Time, from: NodeId, msg: OccMsg, out: &mut Outbox<OccMsg>) {
        self.handle_message(now, from, msg, out);
        self.resume_waiting(now, out);
        self.hosts.flush(out);
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, out: &mut Outbox<OccMsg>) {
        self.handle_timer(now, timer, out);
        self.resume_waiting(now, out);
        self.hosts.flush(out);
    }

    fn on_persisted(&mut self, now: Time, token: PersistToken, out: &mut Outbox<OccMsg>) {
        self.hosts.on_persisted(token, out);
        self.resume_waiting(now, out);
        self.hosts.flush(out);
    }

    fn on_persisted_batch(&mut self, now: Time, tokens: &[PersistToken], out: &mut Outbox<OccMsg>) {
        // The Raft messages the whole group commit releases leave together.
        for &token in tokens {
            self.hosts.on_persisted(token, out);
        }
        self.resume_waiting(now, out);
        self.hosts.flush(out);
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

    fn on_session(
        &mut self,
        now: Time,
        request: meridian_core::node::SessionRequest,
        out: &mut Outbox<OccMsg>,
    ) {
        if self.speculation.is_some() {
            let why = format!("interactive transactions are not supported under {}", self.name);
            let failure = meridian_core::txn::TxnFailure::Rejected(why);
            return out.reply(request.id, meridian_core::txn::TxnOutcome::failed(failure));
        }
        match self.coordinator.as_mut() {
            Some(c) => c.on_session(now, request, &mut self.timers, out),
            None => out.reply(
                request.id,
                meridian_core::txn::TxnOutcome::failed(meridian_core::txn::TxnFailure::Rejected(
                    format!("node {} is not a coordinator", self.id),
                )),
            ),
        }
    }

    fn groups(&self) -> Vec<meridian_core::node::GroupStatus> {
        self.hosts.groups()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        // Summed over the shards hosted here.
        let mut counters: BTreeMap<&'static str, u64> = BTreeMap::new();
        for (_, participant) in self.hosts.iter() {
            for (name, value) in participant.counters() {
                *counters.entry(name).or_default() += value;
            }
        }
        self.hosts.counters(&mut counters);
        if let Some(c) = &self.coordinator {
            counters.extend(c.counters());
        }
        if let Some(speculation) = &self.speculation {
            speculation.counters(&mut counters);
        }
        counters.into_iter().collect()
    }
}

impl ProtocolNode for OccNode {
    fn stores(&self) -> Vec<(ShardId, &MvccStore)> {
        self.hosts.iter().map(|(shard, p)| (shard, p.store())).collect()
    }

    /// Every copy's store: `mako`'s second copies are loaded too.
    fn stores_mut(&mut self) -> Vec<(ShardId, &mut MvccStore)> {
        self.hosts.machines_mut().map(|(shard, p)| (shard, p.store_mut())).collect()
    }
}

#[cfg(test)]
mod tests;
