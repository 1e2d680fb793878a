//! A `chain` node: the coordinator of its clients' requests (hop 0 of their chains) and the
//! server of the shards it hosts, running CrossStitch's pipelined commit (PLC) beside the
//! chain.
//!
//! Messages of one attempt, hop `h` being `hops[h - 1]` and hop 0 the coordinator:
//! - `Txn` ships the attempt (procedure, arguments, timestamp, the outputs of every piece so
//!   far) to hop `h`, which runs its pieces and answers `Ack` to hop `h - 1`, then ships the
//!   attempt on to hop `h + 1`. Every node derives the whole hop list from the procedure and
//!   its arguments, so an acknowledgement names the hop after it implicitly.
//! - A hop sends `Precommit` to the next one once it has the previous hop's precommit (the
//!   coordinator's, for hop 1, sent on hop 1's acknowledgement), the next hop's
//!   acknowledgement, and no read of an undecided writer's version here. Once it has sent it,
//!   it votes commit and may no longer abort on its own: the decision belongs to the hops
//!   after it.
//! - The last hop, with the previous precommit, commits: it is the final coordinator.
//! - A hop that has not precommitted may abort at any time (a conflict, a user abort, a
//!   writer it read aborting, or a timeout waiting for the messages above); so may the
//!   coordinator before it precommitted. Whoever decides (the last hop's commit, or an
//!   abort) delivers the `Decision` to the coordinator and every other hop, resending until
//!   each answers `Applied`: this is the paper's commit message, forward-abort and abort to
//!   the previous hops in one reliable delivery.
//!
//! Without replicas (one per shard, what `chain` runs on today) a server cannot fail without
//! losing its data, so the recovery paths that need replicas (queries to hop `h + 2`, the
//! transaction replicas of the final coordinator's Paxos commit, notifications from key
//! replicas) are not built yet; message loss, delay and duplication are handled by the
//! timeouts and the delivery above, and coordinators may crash (a hop waiting for their
//! precommit times out and aborts).

use super::server::{Hop, HopRun, Server, Why};
use crate::kit::coord::{backoff_ns, bind_plan, AttemptIds, LeaderCache, RequestTable};
use crate::kit::timers::Timers;
use crate::mvto::order::{attempt_ts, TS_AHEAD_MAX_NS};
use crate::{NodeContext, ProtocolNode};
use meridian_core::node::{ClientRequest, Node, Outbox, PersistToken, TimerId};
use meridian_core::rng::{child_rng, Rng};
use meridian_core::txn::{
    CommitPath, PieceOutput, ProcError, TxnFailure, TxnOutcome, TxnRequest, TxnResult,
};
use meridian_core::{NodeId, RequestId, ShardId, Time, Timestamp, TxnId};
use meridian_storage::MvccStore;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// An attempt as it travels down its chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shipped {
    /// The attempt.
    pub txn: TxnId,
    /// Its timestamp (the coordinator's, hop 0).
    pub ts: Timestamp,
    /// The procedure and its arguments.
    pub request: TxnRequest,
    /// Where pieces of replicated tables run when no other piece places them.
    pub home: ShardId,
    /// The hop it is shipped to (from 1).
    pub hop: u32,
    /// The outputs of every piece before this hop's first.
    pub outputs: Vec<PieceOutput>,
}

/// How an attempt ended, as its decider delivers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Committed at the attempt's timestamp; the coordinator's copy carries every piece's
    /// output, the hops' copies none.
    Committed {
        /// Piece outputs, in plan order (coordinator only).
        outputs: Vec<PieceOutput>,
    },
    /// Aborted.
    Aborted(Why),
}

/// A decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// The attempt.
    pub txn: TxnId,
    /// Its timestamp.
    pub ts: Timestamp,
    /// The shards of its hops (a server of one remembers an abort even if the attempt never
    /// reached it, so a late copy is refused).
    pub shards: Vec<ShardId>,
    /// What was decided.
    pub outcome: Outcome,
}

/// `chain`'s messages.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChainMsg {
    /// The attempt, shipped to its next hop.
    Txn(Box<Shipped>),
    /// Hop `hop` ran its pieces: to the hop before it.
    Ack {
        /// The attempt.
        txn: TxnId,
        /// The hop that ran.
        hop: u32,
    },
    /// Hop `hop` votes commit and hands the decision to hop `hop + 1`.
    Precommit {
        /// The attempt.
        txn: TxnId,
        /// The hop precommitting (0: the coordinator).
        hop: u32,
    },
    /// The decision, from the hop (or coordinator) that made it.
    Decision(Box<Decision>),
    /// The decision was applied here: the decider may stop resending it.
    Applied {
        /// The attempt.
        txn: TxnId,
    },
    /// A server refused an attempt it does not know at or below a timestamp whose decisions
    /// it may have forgotten: to the coordinator, whose retries start above `floor`.
    Stale {
        /// The attempt.
        txn: TxnId,
        /// The timestamp to exceed.
        floor: Timestamp,
    },
}

/// What a timer was for.
#[derive(Debug)]
enum Purpose {
    /// The coordinator waits for hop 1's acknowledgement.
    AckTimeout(TxnId),
    /// A request's next attempt.
    Retry(RequestId),
    /// A hop that ran waits for what it needs to precommit.
    HopTimeout(ShardId, TxnId, u32),
    /// Resend undelivered decisions, collect garbage.
    Pace,
}

/// What a decision released, done after it (see [`ChainNode::drain`]).
#[derive(Debug)]
enum Work {
    /// An attempt on this shard waits on no writer any more: it may precommit.
    Freed(ShardId, TxnId),
    /// An attempt on this shard read a version whose writer aborted: it aborts too.
    Cascade(ShardId, TxnId),
}

/// A coordinator's attempt.
#[derive(Debug)]
struct Attempt {
    request: RequestId,
    ts: Timestamp,
    hops: Vec<Hop>,
    /// It precommitted (sent hop 1 its vote): only the chain decides now.
    precommitted: bool,
}

/// A decision being delivered.
#[derive(Debug)]
struct Delivery {
    /// The hops' copy.
    decision: Decision,
    /// The coordinator's copy, when it still waits for it.
    client: Option<(NodeId, Decision)>,
    /// The nodes that have not answered `Applied`.
    to: BTreeSet<NodeId>,
    sent_at: Time,
}

#[derive(Debug, Default)]
struct Counts {
    hops_run_total: u64,
    commits_total: u64,
    aborts_decided_total: u64,
    cascading_total: u64,
    timeouts_total: u64,
    resent_total: u64,
    stale_total: u64,
    refused_total: u64,
}

/// The hops of `request`'s chain: its plan bound to shards (replicated-table pieces on
/// `home` unless placed by another piece), consecutive pieces on one shard grouped into one
/// hop.
pub fn hops_of(
    context: &NodeContext,
    request: &TxnRequest,
    home: ShardId,
) -> Result<Vec<Hop>, ProcError> {
    let pieces = bind_plan(context, request, home)?;
    let mut hops: Vec<Hop> = Vec::new();
    for (index, piece) in pieces.iter().enumerate() {
        let index = index as u32;
        match hops.last_mut() {
            Some(last) if last.shard == piece.shard => last.pieces.end = index + 1,
            _ => {
                let node = context.topology.replica_node(piece.shard, 0).ok_or_else(|| {
                    ProcError::Contract(format!("no server for shard {}", piece.shard.0))
                })?;
                hops.push(Hop { shard: piece.shard, node, pieces: index..index + 1 });
            }
        }
    }
    Ok(hops)
}

/// A `chain` node.
#[derive(Debug)]
pub struct ChainNode {
    context: NodeContext,
    servers: BTreeMap<ShardId, Server>,
    requests: RequestTable,
    attempts: BTreeMap<TxnId, Attempt>,
    ids: AttemptIds,
    /// Every attempt's timestamp is above this (the last one, and what refusals named).
    ts_floor: Timestamp,
    home: ShardId,
    rng: Rng,
    deliveries: BTreeMap<TxnId, Delivery>,
    work: std::collections::VecDeque<Work>,
    timers: Timers<Purpose>,
    counts: Counts,
}

impl ChainNode {
    /// A node of `context` with empty stores.
    pub fn new(context: NodeContext) -> Self {
        let me = &context.topology.nodes[context.id.0 as usize];
        let limits = context.limits;
        let servers = me
            .replicas
            .iter()
            .map(|slot| {
                let server = Server::new(
                    slot.shard,
                    limits.read_stamps_max,
                    limits.decided_max,
                    limits.lock_holders_max,
                );
                (slot.shard, server)
            })
            .collect();
        let home = LeaderCache::new(context.topology.clone()).home_shard(context.id);
        Self {
            servers,
            requests: RequestTable::new(limits.requests_in_flight_max),
            attempts: BTreeMap::new(),
            ids: AttemptIds::new(context.id, context.incarnation),
            ts_floor: Timestamp::ZERO,
            home,
            rng: child_rng(context.seed, "chain-node", u64::from(context.id.0)),
            deliveries: BTreeMap::new(),
            work: std::collections::VecDeque::new(),
            timers: Timers::default(),
            counts: Counts::default(),
            context,
        }
    }

    fn pace_ns(&self) -> u64 {
        (self.context.timing.rpc_timeout_ns / 4).max(meridian_core::time::NS_PER_MS)
    }

    /// How long a hop that ran waits for what it needs to precommit before it aborts.
    fn hop_timeout_ns(&self) -> u64 {
        2 * self.context.timing.rpc_timeout_ns
    }

    // ----- coordinator -------------------------------------------------------------------

    fn start(&mut self, now: Time, id: RequestId, out: &mut Outbox<ChainMsg>) {
        let Some(request) = self.requests.get(id) else { return };
        let call = request.client.txn.clone();
        let hops = match hops_of(&self.context, &call, self.home) {
            Ok(hops) => hops,
            Err(error) => {
                return self.answer(id, TxnResult::Failed(TxnFailure::Procedure(error)), None, out)
            }
        };
        if hops.is_empty() {
            let ts = attempt_ts(now, self.ts_floor, self.context.id);
            self.ts_floor = ts;
            return self.answer(
                id,
                TxnResult::Committed,
                Some((ts, Vec::new(), 0, CommitPath::Empty)),
                out,
            );
        }
        let txn = self.ids.next_id();
        let ts = attempt_ts(now, self.ts_floor, self.context.id);
        self.ts_floor = ts;
        let first = hops[0].node;
        let shipped =
            Shipped { txn, ts, request: call, home: self.home, hop: 1, outputs: Vec::new() };
        out.send(first, ChainMsg::Txn(Box::new(shipped)));
        self.attempts.insert(txn, Attempt { request: id, ts, hops, precommitted: false });
        if let Some(request) = self.requests.get_mut(id) {
            request.attempt = Some(txn);
        }
        self.timers.set(Purpose::AckTimeout(txn), self.context.timing.rpc_timeout_ns, out);
    }

    fn answer(
        &mut self,
        id: RequestId,
        result: TxnResult,
        commit: Option<(Timestamp, Vec<PieceOutput>, u32, CommitPath)>,
        out: &mut Outbox<ChainMsg>,
    ) {
        let Some(request) = self.requests.finish(id) else { return };
        let (commit_ts, outputs, shards_touched, path) = match commit {
            Some((ts, outputs, shards, path)) => (Some(ts), outputs, shards, path),
            None => (None, Vec::new(), 0, CommitPath::None),
        };
        out.reply(
            id,
            TxnOutcome {
                result,
                outputs,
                commit_ts,
                retries: request.retries,
                aborts: request.aborts,
                shards_touched,
                path,
                speculative_ns: None,
            },
        );
    }

    fn on_client_ack(&mut self, from: NodeId, txn: TxnId, out: &mut Outbox<ChainMsg>) {
        let Some(attempt) = self.attempts.get_mut(&txn) else { return };
        if attempt.precommitted || attempt.hops[0].node != from {
            return;
        }
        attempt.precommitted = true;
        out.send(from, ChainMsg::Precommit { txn, hop: 0 });
    }

    fn on_ack_timeout(&mut self, now: Time, txn: TxnId, out: &mut Outbox<ChainMsg>) {
        let Some(attempt) = self.attempts.get(&txn) else { return };
        if attempt.precommitted {
            return;
        }
        self.counts.timeouts_total += 1;
        let (ts, shards) = (attempt.ts, attempt.hops.iter().map(|h| h.shard).collect());
        let nodes: BTreeSet<NodeId> = attempt.hops.iter().map(|h| h.node).collect();
        let why =
            Why::Conflict { cause: meridian_core::txn::AbortCause::Timeout, seen: Timestamp::ZERO };
        let decision = Decision { txn, ts, shards, outcome: Outcome::Aborted(why) };
        self.apply(now, &decision, None, out);
        self.deliver(now, decision, None, nodes, 0, out);
    }

    /// The coordinator's part of a decision for one of its attempts.
    fn client_outcome(&mut self, now: Time, decision: &Decision, out: &mut Outbox<ChainMsg>) {
        let Some(attempt) = self.attempts.remove(&decision.txn) else { return };
        let id = attempt.request;
        let shards = attempt.hops.iter().map(|h| h.shard).collect::<BTreeSet<_>>().len() as u32;
        match &decision.outcome {
            Outcome::Committed { outputs } => {
                let commit = (attempt.ts, outputs.clone(), shards, CommitPath::Chain);
                self.answer(id, TxnResult::Committed, Some(commit), out);
            }
            Outcome::Aborted(Why::User(why)) => {
                self.answer(id, TxnResult::UserAborted(why.clone()), None, out)
            }
            Outcome::Aborted(Why::Procedure(error)) => {
                let failure = TxnFailure::Procedure(error.clone());
                self.answer(id, TxnResult::Failed(failure), None, out)
            }
            Outcome::Aborted(Why::Conflict { cause, seen }) => {
                self.raise_floor(now, *seen);
                let attempts_max = self.context.timing.attempts_max;
                let Some(request) = self.requests.get_mut(id) else { return };
                request.retries += 1;
                request.aborts.add(*cause);
                request.attempt = None;
                if request.retries >= attempts_max {
                    return self.answer(
                        id,
                        TxnResult::Failed(TxnFailure::RetriesExhausted),
                        None,
                        out,
                    );
                }
                let timing = &self.context.timing;
                let wait = backoff_ns(
                    &mut self.rng,
                    timing.backoff_ns_min,
                    timing.backoff_ns_max,
                    request.retries,
                );
                self.timers.set(Purpose::Retry(id), wait, out);
            }
        }
    }

    /// Later attempts start above `seen` (a timestamp a server refused for), unless it is so
    /// far beyond this coordinator's clock that servers would refuse every attempt above it:
    /// a refusal naming one is not believed.
    fn raise_floor(&mut self, now: Time, seen: Timestamp) {
        if seen.0 <= now.saturating_add(TS_AHEAD_MAX_NS / 2) {
            self.ts_floor = self.ts_floor.max(seen);
        }
    }

    fn on_retry(&mut self, now: Time, id: RequestId, out: &mut Outbox<ChainMsg>) {
        let Some(request) = self.requests.get(id) else { return };
        if request.attempt.is_some() {
            return;
        }
        if self.deliveries.len() >= self.context.limits.deliveries_max {
            // Room first: every attempt may end in a decision to deliver.
            let wait = self.pace_ns();
            self.timers.set(Purpose::Retry(id), wait, out);
            return;
        }
        self.start(now, id, out);
    }

    // ----- servers -----------------------------------------------------------------------

    fn on_txn(&mut self, now: Time, from: NodeId, shipped: Shipped, out: &mut Outbox<ChainMsg>) {
        let client = shipped.txn.origin;
        let topology = &self.context.topology;
        if !topology.nodes.get(client.0 as usize).is_some_and(|n| n.coordinator) {
            return self.refuse(); // Attempts come from coordinators.
        }
        let hops = match hops_of(&self.context, &shipped.request, shipped.home) {
            Ok(hops) if shipped.home.0 < self.context.topology.shards => hops,
            _ => return self.refuse(), // A coordinator checked it: this copy is not genuine.
        };
        let hop = shipped.hop;
        if hop == 0 || hop as usize > hops.len() {
            return self.refuse();
        }
        let here = &hops[hop as usize - 1];
        let previous = if hop == 1 { client } else { hops[hop as usize - 2].node };
        if here.node != self.context.id
            || from != previous
            || shipped.outputs.len() != here.pieces.start as usize
        {
            return self.refuse();
        }
        let shard = here.shard;
        let Some(server) = self.servers.get(&shard) else { return self.refuse() };
        let txn = shipped.txn;
        if server.ended(txn).is_some() {
            return; // Decided (or refused) already: a late or duplicated copy.
        }
        if let Some(record) = server.records.get(&txn) {
            if record.ts != shipped.ts || record.hops != hops {
                return self.refuse(); // Not a copy of the attempt this server runs.
            }
            if record.ran.contains_key(&hop) {
                // A duplicate: the acknowledgement may have been lost with the first copy.
                out.send(from, ChainMsg::Ack { txn, hop });
                return;
            }
        } else {
            if server.maybe_forgotten(txn, shipped.ts) {
                self.counts.stale_total += 1;
                let floor = server.forgotten_below(client);
                out.send(client, ChainMsg::Stale { txn, floor });
                return;
            }
            if shipped.ts.0 > now.saturating_add(TS_AHEAD_MAX_NS) {
                return self.refuse(); // A coordinator clock that far ahead is broken.
            }
            if server.full() || self.deliveries.len() >= self.context.limits.deliveries_max {
                // No room: the hop before times out and aborts.
                self.counts.refused_total += 1;
                return;
            }
            let server = self.servers.get_mut(&shard).expect("checked above");
            if let Err(floor) = server.admit_ts(txn, shipped.ts) {
                self.counts.stale_total += 1;
                out.send(client, ChainMsg::Stale { txn, floor });
                return;
            }
        }
        let procedure = match self.context.registry.get(shipped.request.proc) {
            Some(procedure) => procedure.clone(),
            None => return self.refuse(),
        };
        let server = self.servers.get_mut(&shard).expect("checked above");
        self.counts.hops_run_total += 1;
        let run = server.run_hop(
            procedure.as_ref(),
            &self.context.partitioner,
            (txn, shipped.ts, client),
            &shipped.request,
            &hops,
            hop,
            shipped.outputs,
        );
        match run {
            HopRun::Abort(why) => self.decide_abort(now, shard, txn, why, out),
            HopRun::Ran => {
                out.send(from, ChainMsg::Ack { txn, hop });
                if let Some(next) = hops.get(hop as usize) {
                    let record = &self.servers[&shard].records[&txn];
                    let shipped = Shipped {
                        txn,
                        ts: record.ts,
                        request: shipped.request,
                        home: shipped.home,
                        hop: hop + 1,
                        outputs: record.outputs.clone(),
                    };
                    out.send(next.node, ChainMsg::Txn(Box::new(shipped)));
                }
                self.timers.set(Purpose::HopTimeout(shard, txn, hop), self.hop_timeout_ns(), out);
                self.try_precommit(now, shard, txn, hop, out);
            }
        }
    }

    fn refuse(&mut self) {
        self.counts.refused_total += 1;
    }

    /// The server of this node holding a record of `txn` whose hop `hop` it ran.
    fn server_of(&self, txn: TxnId, hop: u32) -> Option<ShardId> {
        self.servers
            .iter()
            .find(|(_, s)| s.records.get(&txn).is_some_and(|r| r.ran.contains_key(&hop)))
            .map(|(&shard, _)| shard)
    }

    fn on_ack(
        &mut self,
        now: Time,
        from: NodeId,
        txn: TxnId,
        hop: u32,
        out: &mut Outbox<ChainMsg>,
    ) {
        if hop == 1 && txn.origin == self.context.id {
            return self.on_client_ack(from, txn, out);
        }
        let Some(before) = hop.checked_sub(1).filter(|&h| h > 0) else { return };
        let Some(shard) = self.server_of(txn, before) else { return };
        let chain = out.chain();
        let server = self.servers.get_mut(&shard).expect("found above");
        let record = server.records.get_mut(&txn).expect("found above");
        if record.hops.get(hop as usize - 1).is_none_or(|h| h.node != from) {
            return self.refuse();
        }
        let state = record.ran.get_mut(&before).expect("found above");
        if state.acked.is_none() {
            state.acked = Some(chain);
        }
        self.try_precommit(now, shard, txn, before, out);
    }

    fn on_precommit(
        &mut self,
        now: Time,
        from: NodeId,
        txn: TxnId,
        hop: u32,
        out: &mut Outbox<ChainMsg>,
    ) {
        let Some(next) = hop.checked_add(1) else { return };
        let Some(shard) = self.server_of(txn, next) else { return };
        let chain = out.chain();
        let server = self.servers.get_mut(&shard).expect("found above");
        let record = server.records.get_mut(&txn).expect("found above");
        let sender = match hop.checked_sub(1) {
            None => Some(txn.origin),
            Some(before) => record.hops.get(before as usize).map(|h| h.node),
        };
        if sender != Some(from) {
            return self.refuse();
        }
        let state = record.ran.get_mut(&next).expect("found above");
        if state.precommit.is_none() {
            state.precommit = Some(chain);
        }
        self.try_precommit(now, shard, txn, next, out);
    }

    /// Precommits hop `hop` of `txn` (or, the last hop, commits) once it has what it needs.
    fn try_precommit(
        &mut self,
        now: Time,
        shard: ShardId,
        txn: TxnId,
        hop: u32,
        out: &mut Outbox<ChainMsg>,
    ) {
        let server = self.servers.get_mut(&shard).expect("a hosted shard");
        let Some(record) = server.records.get_mut(&txn) else { return };
        let last = hop as usize == record.hops.len();
        let free = record.waits_on.is_empty();
        let Some(state) = record.ran.get_mut(&hop) else { return };
        if state.precommitted {
            return;
        }
        let (Some(before), after) = (state.precommit, state.acked) else { return };
        if !free || (!last && after.is_none()) {
            return;
        }
        state.precommitted = true;
        let chain = before.max(after.unwrap_or(0));
        if last {
            return self.decide_commit(now, shard, txn, chain, out);
        }
        let next = record.hops[hop as usize].node;
        out.send_after(next, ChainMsg::Precommit { txn, hop }, chain);
    }

    fn decide_commit(
        &mut self,
        now: Time,
        shard: ShardId,
        txn: TxnId,
        chain: u16,
        out: &mut Outbox<ChainMsg>,
    ) {
        let record = &self.servers[&shard].records[&txn];
        let (ts, client, outputs) = (record.ts, record.client, record.outputs.clone());
        let shards = record.hops.iter().map(|h| h.shard).collect();
        let nodes: BTreeSet<NodeId> = record.hops.iter().map(|h| h.node).collect();
        self.counts.commits_total += 1;
        let decision =
            Decision { txn, ts, shards, outcome: Outcome::Committed { outputs: Vec::new() } };
        let for_client = Decision { outcome: Outcome::Committed { outputs }, ..decision.clone() };
        self.apply(now, &decision, Some(&for_client), out);
        self.deliver(now, decision, Some((client, for_client)), nodes, chain, out);
    }

    /// Hop of `txn` on `shard` (not precommitted) aborts it and delivers the decision.
    fn decide_abort(
        &mut self,
        now: Time,
        shard: ShardId,
        txn: TxnId,
        why: Why,
        out: &mut Outbox<ChainMsg>,
    ) {
        let Some(record) = self.servers[&shard].records.get(&txn) else { return };
        debug_assert!(
            record.ran.values().any(|s| !s.precommitted),
            "only a hop that has not precommitted may abort"
        );
        let (ts, client) = (record.ts, record.client);
        let shards = record.hops.iter().map(|h| h.shard).collect();
        let nodes: BTreeSet<NodeId> = record.hops.iter().map(|h| h.node).collect();
        self.counts.aborts_decided_total += 1;
        let decision = Decision { txn, ts, shards, outcome: Outcome::Aborted(why) };
        let for_client = decision.clone();
        self.apply(now, &decision, None, out);
        self.deliver(now, decision, Some((client, for_client)), nodes, 0, out);
    }

    /// Sends `decision` to every node in `to` but this one (and the coordinator's copy), after
    /// a causal chain of `chain` wide-area legs, and keeps resending until each has applied
    /// it.
    fn deliver(
        &mut self,
        now: Time,
        decision: Decision,
        client: Option<(NodeId, Decision)>,
        mut to: BTreeSet<NodeId>,
        chain: u16,
        out: &mut Outbox<ChainMsg>,
    ) {
        let me = self.context.id;
        let client = client.filter(|(node, _)| *node != me);
        if let Some((node, copy)) = &client {
            to.remove(node);
            out.send_after(*node, ChainMsg::Decision(Box::new(copy.clone())), chain);
        }
        to.remove(&me);
        for &node in &to {
            out.send_after(node, ChainMsg::Decision(Box::new(decision.clone())), chain);
        }
        if let Some((node, _)) = &client {
            to.insert(*node);
        }
        if !to.is_empty() {
            let txn = decision.txn;
            self.deliveries.insert(txn, Delivery { decision, client, to, sent_at: now });
        }
    }

    /// Applies a decision at this node: its servers, and its coordinator if the attempt is
    /// its own (with `client_copy`, the coordinator's copy, when this node decided). What it
    /// releases (readers freed to precommit, readers that must abort with an aborted writer)
    /// is queued as work, done by [`ChainNode::drain`] so that cascades loop, not recurse.
    fn apply(
        &mut self,
        now: Time,
        decision: &Decision,
        client_copy: Option<&Decision>,
        out: &mut Outbox<ChainMsg>,
    ) {
        let txn = decision.txn;
        for (&shard, server) in self.servers.iter_mut() {
            let known = server.records.contains_key(&txn);
            match &decision.outcome {
                Outcome::Committed { .. } => {
                    if known {
                        debug_assert!(
                            server.records[&txn].ran.values().all(|s| s.precommitted),
                            "a commit needs every hop's vote"
                        );
                        let freed = server.commit(txn);
                        self.work.extend(freed.into_iter().map(|t| Work::Freed(shard, t)));
                    }
                }
                Outcome::Aborted(_) => {
                    if known || (decision.shards.contains(&shard) && server.ended(txn).is_none()) {
                        let readers = server.abort(txn, decision.ts);
                        self.work.extend(readers.into_iter().map(|t| Work::Cascade(shard, t)));
                    }
                }
            }
        }
        if txn.origin == self.context.id {
            self.client_outcome(now, client_copy.unwrap_or(decision), out);
        }
    }

    /// Does the queued work until none is left.
    fn drain(&mut self, now: Time, out: &mut Outbox<ChainMsg>) {
        while let Some(work) = self.work.pop_front() {
            match work {
                Work::Freed(shard, reader) => {
                    let hops: Vec<u32> = self.servers[&shard]
                        .records
                        .get(&reader)
                        .map(|r| r.ran.keys().copied().collect())
                        .unwrap_or_default();
                    for hop in hops {
                        self.try_precommit(now, shard, reader, hop, out);
                    }
                }
                Work::Cascade(shard, reader) => {
                    if self.servers[&shard].records.contains_key(&reader) {
                        self.counts.cascading_total += 1;
                        let why = Why::Conflict {
                            cause: meridian_core::txn::AbortCause::Cascading,
                            seen: Timestamp::ZERO,
                        };
                        self.decide_abort(now, shard, reader, why, out);
                    }
                }
            }
        }
    }

    /// True when `from` may have made `decision`: for an attempt a server here ran, the last
    /// hop (a commit) or any hop or the coordinator (an abort); for an attempt of this
    /// coordinator, its hops; otherwise (an abort of an attempt this node never saw) its
    /// coordinator or a server of one of its shards.
    fn decided_by(&self, from: NodeId, decision: &Decision) -> bool {
        let txn = decision.txn;
        let hops = self
            .servers
            .values()
            .find_map(|s| s.records.get(&txn).map(|r| &r.hops))
            .or_else(|| self.attempts.get(&txn).map(|a| &a.hops));
        let aborted = matches!(decision.outcome, Outcome::Aborted(_));
        match hops {
            Some(hops) => {
                let last = hops.last().is_some_and(|h| h.node == from);
                last || (aborted && (from == txn.origin || hops.iter().any(|h| h.node == from)))
            }
            None => {
                let topology = &self.context.topology;
                let coordinator = topology.nodes.get(txn.origin.0 as usize);
                let server_of = |shard: &ShardId| topology.replica_node(*shard, 0) == Some(from);
                coordinator.is_some_and(|n| n.coordinator)
                    && (from == txn.origin || decision.shards.iter().any(server_of))
            }
        }
    }

    fn dispatch(&mut self, now: Time, from: NodeId, msg: ChainMsg, out: &mut Outbox<ChainMsg>) {
        match msg {
            ChainMsg::Txn(shipped) => self.on_txn(now, from, *shipped, out),
            ChainMsg::Ack { txn, hop } => self.on_ack(now, from, txn, hop, out),
            ChainMsg::Precommit { txn, hop } => self.on_precommit(now, from, txn, hop, out),
            ChainMsg::Decision(decision) => self.on_decision(now, from, *decision, out),
            ChainMsg::Applied { txn } => self.on_applied(from, txn),
            ChainMsg::Stale { txn, floor } => {
                let Some(attempt) = self.attempts.get(&txn) else { return };
                if attempt.hops.iter().any(|h| h.node == from) {
                    self.raise_floor(now, floor);
                }
            }
        }
    }

    fn fire(&mut self, now: Time, timer: TimerId, out: &mut Outbox<ChainMsg>) {
        let Some(purpose) = self.timers.take(timer) else { return };
        match purpose {
            Purpose::AckTimeout(txn) => self.on_ack_timeout(now, txn, out),
            Purpose::Retry(id) => self.on_retry(now, id, out),
            Purpose::HopTimeout(shard, txn, hop) => {
                self.on_hop_timeout(now, (shard, txn, hop), out)
            }
            Purpose::Pace => {
                self.pace(now, out);
                self.timers.set(Purpose::Pace, self.pace_ns(), out);
            }
        }
    }

    fn on_decision(
        &mut self,
        now: Time,
        from: NodeId,
        decision: Decision,
        out: &mut Outbox<ChainMsg>,
    ) {
        if !self.decided_by(from, &decision) {
            return self.refuse();
        }
        self.apply(now, &decision, None, out);
        out.send(from, ChainMsg::Applied { txn: decision.txn });
    }

    fn on_applied(&mut self, from: NodeId, txn: TxnId) {
        let Some(delivery) = self.deliveries.get_mut(&txn) else { return };
        delivery.to.remove(&from);
        if delivery.client.as_ref().is_some_and(|(node, _)| *node == from) {
            delivery.client = None;
        }
        if delivery.to.is_empty() {
            self.deliveries.remove(&txn);
        }
    }

    fn on_hop_timeout(
        &mut self,
        now: Time,
        (shard, txn, hop): (ShardId, TxnId, u32),
        out: &mut Outbox<ChainMsg>,
    ) {
        let Some(server) = self.servers.get(&shard) else { return };
        let Some(record) = server.records.get(&txn) else { return };
        if record.ran.get(&hop).is_none_or(|s| s.precommitted) {
            return;
        }
        self.counts.timeouts_total += 1;
        let why =
            Why::Conflict { cause: meridian_core::txn::AbortCause::Timeout, seen: Timestamp::ZERO };
        self.decide_abort(now, shard, txn, why, out);
    }

    fn pace(&mut self, now: Time, out: &mut Outbox<ChainMsg>) {
        let resend_ns = self.context.timing.rpc_timeout_ns;
        for delivery in self.deliveries.values_mut() {
            if now.saturating_sub(delivery.sent_at) < resend_ns {
                continue;
            }
            delivery.sent_at = now;
            for &node in &delivery.to {
                let copy = match &delivery.client {
                    Some((client, copy)) if *client == node => copy.clone(),
                    _ => delivery.decision.clone(),
                };
                self.counts.resent_total += 1;
                out.send(node, ChainMsg::Decision(Box::new(copy)));
            }
        }
        let retention = self.context.timing.gc_retention_ns;
        let watermark = Timestamp(now.saturating_sub(retention));
        for server in self.servers.values_mut() {
            server.collect_below(watermark);
        }
    }
}

impl Node for ChainNode {
    type Msg = ChainMsg;

    fn on_start(&mut self, _now: Time, out: &mut Outbox<ChainMsg>) {
        self.timers.set(Purpose::Pace, self.pace_ns(), out);
    }

    fn on_message(&mut self, now: Time, from: NodeId, msg: ChainMsg, out: &mut Outbox<ChainMsg>) {
        self.dispatch(now, from, msg, out);
        self.drain(now, out);
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, out: &mut Outbox<ChainMsg>) {
        self.fire(now, timer, out);
        self.drain(now, out);
    }

    fn on_persisted(&mut self, _now: Time, _token: PersistToken, _out: &mut Outbox<ChainMsg>) {}

    fn submit(&mut self, now: Time, request: ClientRequest, out: &mut Outbox<ChainMsg>) {
        let busy = (!self.context.topology.nodes[self.context.id.0 as usize].coordinator)
            .then(|| "this node is not a coordinator".to_string());
        let Some(id) = self.requests.admit(now, request, busy, out) else { return };
        // Through the retry path: it waits for room to deliver another decision.
        self.on_retry(now, id, out);
        self.drain(now, out);
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let open: usize = self.servers.values().map(Server::open).sum();
        vec![
            ("chain_hops_run_total", self.counts.hops_run_total),
            ("chain_commits_total", self.counts.commits_total),
            ("chain_aborts_decided_total", self.counts.aborts_decided_total),
            ("chain_cascading_aborts_total", self.counts.cascading_total),
            ("chain_timeouts_total", self.counts.timeouts_total),
            ("chain_decisions_resent_total", self.counts.resent_total),
            ("chain_stale_refusals_total", self.counts.stale_total),
            ("chain_refused_total", self.counts.refused_total),
            ("chain_open_attempts", open as u64),
            ("chain_deliveries", self.deliveries.len() as u64),
        ]
    }
}

impl ProtocolNode for ChainNode {
    fn leads(&self, shard: ShardId) -> bool {
        self.servers.contains_key(&shard)
    }

    fn stores(&self) -> Vec<(ShardId, &MvccStore)> {
        self.servers.iter().map(|(&s, server)| (s, &server.store)).collect()
    }

    fn stores_mut(&mut self) -> Vec<(ShardId, &mut MvccStore)> {
        self.servers.iter_mut().map(|(&s, server)| (s, &mut server.store)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::node::Effect;
    use meridian_core::topology::Topology;
    use std::sync::Arc;

    /// Node `id` of 3 shards × 1 replica in 3 regions (nodes 0–2 servers, 3–5 coordinators),
    /// running bank with 2 accounts per shard (every transfer crosses shards or stays on one).
    fn node(id: u32) -> ChainNode {
        let options = meridian_workloads::WorkloadOptions {
            shards: 3,
            keys_per_shard: 8,
            ..meridian_workloads::WorkloadOptions::default()
        };
        let workload = meridian_workloads::build("bank", &options).unwrap();
        let topology = Topology::standard(vec!["a".into(), "b".into(), "c".into()], 3, 1).unwrap();
        let context = NodeContext::new(
            NodeId(id),
            Arc::new(topology),
            Arc::new(workload.registry()),
            Arc::new(workload.partitioner()),
            7,
            crate::Timing::for_network(meridian_core::time::NS_PER_MS),
        );
        let mut node = ChainNode::new(context);
        for (shard, store) in node.stores_mut() {
            workload.load(shard, store);
        }
        node
    }

    fn sends(out: &mut Outbox<ChainMsg>) -> Vec<(NodeId, ChainMsg)> {
        out.drain()
            .filter_map(|e| match e {
                Effect::Send { to, msg } => Some((to, msg)),
                _ => None,
            })
            .collect()
    }

    /// The first transfer coordinator 3 ships, and where to.
    fn shipped() -> (NodeId, Shipped) {
        let options = meridian_workloads::WorkloadOptions {
            shards: 3,
            keys_per_shard: 8,
            ..meridian_workloads::WorkloadOptions::default()
        };
        let workload = meridian_workloads::build("bank", &options).unwrap();
        let mut generator = workload.generator(0, 1);
        let mut coordinator = node(3);
        let mut out = Outbox::new();
        coordinator.submit(
            10,
            ClientRequest { id: RequestId(1), txn: generator.next(RequestId(1)) },
            &mut out,
        );
        let (to, msg) = sends(&mut out).into_iter().next().expect("the attempt is shipped");
        let ChainMsg::Txn(shipped) = msg else { panic!("{msg:?}") };
        (to, *shipped)
    }

    fn image(node: &ChainNode) -> Vec<(ShardId, u64, usize)> {
        node.servers.iter().map(|(&s, v)| (s, v.store.version_count(), v.open())).collect()
    }

    /// Copies of an attempt from the wrong sender, for a hop that does not exist or is not
    /// this node's, and acknowledgements, precommits and decisions nobody asked for change
    /// nothing at a server and are never answered but by `Applied`.
    #[test]
    fn hostile_messages_change_nothing() {
        let (first, body) = shipped();
        let mut server = node(first.0);
        let before = image(&server);
        let mut out = Outbox::new();
        let coordinator = body.txn.origin;
        let wrong = NodeId((coordinator.0 + 1) % 6);
        server.on_message(10, wrong, ChainMsg::Txn(Box::new(body.clone())), &mut out);
        for hop in [0, 2, 7, u32::MAX] {
            let copy = Shipped { hop, ..body.clone() };
            server.on_message(10, coordinator, ChainMsg::Txn(Box::new(copy)), &mut out);
        }
        let home = Shipped { home: ShardId(99), ..body.clone() };
        server.on_message(10, coordinator, ChainMsg::Txn(Box::new(home)), &mut out);
        let outputs = Shipped { outputs: vec![vec![]], ..body.clone() };
        server.on_message(10, coordinator, ChainMsg::Txn(Box::new(outputs)), &mut out);
        let far = Shipped { ts: Timestamp(u64::MAX), ..body.clone() };
        server.on_message(10, coordinator, ChainMsg::Txn(Box::new(far)), &mut out);
        for hop in [0, 1, 2, u32::MAX] {
            server.on_message(10, wrong, ChainMsg::Ack { txn: body.txn, hop }, &mut out);
            server.on_message(10, wrong, ChainMsg::Precommit { txn: body.txn, hop }, &mut out);
        }
        server.on_message(
            10,
            wrong,
            ChainMsg::Stale { txn: body.txn, floor: Timestamp(9) },
            &mut out,
        );
        let decision = Decision {
            txn: body.txn,
            ts: body.ts,
            shards: vec![ShardId(42)],
            outcome: Outcome::Committed { outputs: Vec::new() },
        };
        server.on_message(10, wrong, ChainMsg::Decision(Box::new(decision)), &mut out);
        let answers = sends(&mut out);
        assert!(
            answers.iter().all(|(_, m)| matches!(m, ChainMsg::Applied { .. })),
            "only an Applied: {answers:?}"
        );
        assert_eq!(
            image(&server).iter().map(|i| i.1).collect::<Vec<_>>(),
            before.iter().map(|i| i.1).collect::<Vec<_>>()
        );
        assert_eq!(server.servers.values().map(Server::open).sum::<usize>(), 0);
    }

    /// The genuine copy runs: the server acknowledges to the coordinator and ships the attempt
    /// on (or, for a single-hop transfer, waits for the coordinator's precommit); a duplicate
    /// is acknowledged again and not run twice.
    #[test]
    fn a_genuine_copy_runs_once_and_is_acknowledged() {
        let (first, body) = shipped();
        let mut server = node(first.0);
        let mut out = Outbox::new();
        let coordinator = body.txn.origin;
        server.on_message(10, coordinator, ChainMsg::Txn(Box::new(body.clone())), &mut out);
        let answers = sends(&mut out);
        assert!(
            answers.contains(&(coordinator, ChainMsg::Ack { txn: body.txn, hop: 1 })),
            "{answers:?}"
        );
        assert_eq!(server.counts.hops_run_total, 1);
        server.on_message(11, coordinator, ChainMsg::Txn(Box::new(body.clone())), &mut out);
        let answers = sends(&mut out);
        assert_eq!(answers, vec![(coordinator, ChainMsg::Ack { txn: body.txn, hop: 1 })]);
        assert_eq!(server.counts.hops_run_total, 1, "not run twice");
    }

    /// Decisions from nodes that could not have made them change nothing; a second copy of a
    /// running attempt with another timestamp is refused; a precommit naming a hop beyond the
    /// chain is ignored.
    #[test]
    fn decisions_and_copies_from_the_wrong_places_are_refused() {
        let (first, body) = shipped();
        let mut server = node(first.0);
        let mut out = Outbox::new();
        let coordinator = body.txn.origin;
        server.on_message(10, coordinator, ChainMsg::Txn(Box::new(body.clone())), &mut out);
        out.drain();
        let hops =
            server.servers.values().find_map(|s| s.records.get(&body.txn)).unwrap().hops.clone();
        let stranger = (0..6)
            .map(NodeId)
            .find(|n| *n != coordinator && hops.iter().all(|h| h.node != *n))
            .unwrap();
        let decide = |outcome| Decision { txn: body.txn, ts: body.ts, shards: vec![], outcome };
        let commit = decide(Outcome::Committed { outputs: Vec::new() });
        let abort = decide(Outcome::Aborted(Why::User("no".into())));
        for (from, decision) in
            [(stranger, commit.clone()), (stranger, abort), (coordinator, commit)]
        {
            if hops.last().unwrap().node == from {
                continue; // The last hop may commit.
            }
            server.on_message(11, from, ChainMsg::Decision(Box::new(decision)), &mut out);
        }
        let later = Shipped { ts: Timestamp(body.ts.0 + 1), ..body.clone() };
        server.on_message(12, coordinator, ChainMsg::Txn(Box::new(later)), &mut out);
        for hop in [5, 64, u32::MAX - 1] {
            server.on_message(13, stranger, ChainMsg::Precommit { txn: body.txn, hop }, &mut out);
        }
        assert!(sends(&mut out).is_empty(), "nothing answered");
        let record = server.servers.values().find_map(|s| s.records.get(&body.txn));
        assert!(record.is_some_and(|r| r.ts == body.ts), "still running, unchanged");
    }

    /// A coordinator that also serves the last hop of its own attempt answers with every
    /// piece's output (the copy the hops get carries none).
    #[test]
    fn a_coordinator_serving_the_last_hop_answers_with_the_outputs() {
        use meridian_core::topology::{NodeInfo, ReplicaSlot};
        let options = meridian_workloads::WorkloadOptions {
            shards: 2,
            keys_per_shard: 10,
            ..meridian_workloads::WorkloadOptions::default()
        };
        let workload = meridian_workloads::build("micro-luigi", &options).unwrap();
        let slot = |shard| vec![ReplicaSlot { shard: ShardId(shard), replica: 0 }];
        let topology = Topology {
            regions: vec!["a".into()],
            nodes: vec![
                NodeInfo {
                    region: meridian_core::RegionId(0),
                    replicas: slot(0),
                    coordinator: false,
                },
                NodeInfo {
                    region: meridian_core::RegionId(0),
                    replicas: slot(1),
                    coordinator: true,
                },
            ],
            shards: 2,
            replicas: 1,
        };
        let topology = Arc::new(topology);
        let mut nodes: Vec<ChainNode> = (0..2)
            .map(|id| {
                let context = NodeContext::new(
                    NodeId(id),
                    topology.clone(),
                    Arc::new(workload.registry()),
                    Arc::new(workload.partitioner()),
                    7,
                    crate::Timing::for_network(meridian_core::time::NS_PER_MS),
                );
                let mut node = ChainNode::new(context);
                for (shard, store) in node.stores_mut() {
                    workload.load(shard, store);
                }
                node
            })
            .collect();
        let mut generator = workload.generator(0, 1);
        let txn = generator.next(RequestId(1));
        let pieces = hops_of(&nodes[1].context, &txn, ShardId(1)).unwrap();
        assert_eq!(pieces.last().unwrap().node, NodeId(1), "micro-luigi ends on shard 1");
        let mut out = Outbox::new();
        nodes[1].submit(10, ClientRequest { id: RequestId(1), txn }, &mut out);
        let mut mail: std::collections::VecDeque<(NodeId, NodeId, ChainMsg)> =
            sends(&mut out).into_iter().map(|(to, m)| (NodeId(1), to, m)).collect();
        let mut replies = Vec::new();
        for _ in 0..1_000 {
            let Some((from, to, msg)) = mail.pop_front() else { break };
            let mut out = Outbox::new();
            nodes[to.0 as usize].on_message(11, from, msg, &mut out);
            for effect in out.drain() {
                match effect {
                    Effect::Send { to: next, msg } => mail.push_back((to, next, msg)),
                    Effect::Reply { outcome, .. } => replies.push(outcome),
                    _ => {}
                }
            }
        }
        assert_eq!(replies.len(), 1, "answered once");
        assert_eq!(replies[0].result, TxnResult::Committed);
        let plan_len = pieces.last().unwrap().pieces.end as usize;
        assert_eq!(replies[0].outputs.len(), plan_len, "every piece's output");
    }

    /// A server's `Stale` raises the coordinator's timestamp floor, unless it names a
    /// timestamp so far ahead that every attempt above it would be refused.
    #[test]
    fn a_stale_floor_far_beyond_the_clock_is_not_believed() {
        let options = meridian_workloads::WorkloadOptions {
            shards: 3,
            keys_per_shard: 8,
            ..meridian_workloads::WorkloadOptions::default()
        };
        let workload = meridian_workloads::build("bank", &options).unwrap();
        let mut generator = workload.generator(0, 1);
        let mut coordinator = node(3);
        let mut out = Outbox::new();
        let request = ClientRequest { id: RequestId(1), txn: generator.next(RequestId(1)) };
        coordinator.submit(10, request, &mut out);
        let (first, msg) = sends(&mut out).into_iter().next().unwrap();
        let ChainMsg::Txn(body) = msg else { panic!("{msg:?}") };
        let floor = coordinator.ts_floor;
        let far = Timestamp(u64::MAX - 1);
        coordinator.on_message(11, first, ChainMsg::Stale { txn: body.txn, floor: far }, &mut out);
        assert_eq!(coordinator.ts_floor, floor, "not believed");
        let near = Timestamp(floor.0 + 1_000_000);
        coordinator.on_message(12, first, ChainMsg::Stale { txn: body.txn, floor: near }, &mut out);
        assert_eq!(coordinator.ts_floor, near);
    }

    fn samples() -> Vec<ChainMsg> {
        let (_, body) = shipped();
        let txn = body.txn;
        vec![
            ChainMsg::Txn(Box::new(body.clone())),
            ChainMsg::Ack { txn, hop: 1 },
            ChainMsg::Precommit { txn, hop: 0 },
            ChainMsg::Decision(Box::new(Decision {
                txn,
                ts: body.ts,
                shards: vec![ShardId(0)],
                outcome: Outcome::Aborted(Why::Conflict {
                    cause: meridian_core::txn::AbortCause::Cascading,
                    seen: Timestamp(3),
                }),
            })),
            ChainMsg::Applied { txn },
            ChainMsg::Stale { txn, floor: Timestamp(4) },
        ]
    }

    /// Mutated and random byte streams of chain's frames never panic the connection reader.
    #[test]
    fn mutated_and_random_chain_streams_never_panic_the_reader() {
        meridian_core::testing::check_message_streams(
            samples(),
            6,
            3_000,
            "chain-connection-property",
        );
    }
}
