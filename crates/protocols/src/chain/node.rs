//! A `chain` node: the coordinator of its clients' requests (hop 0 of their chains) and a
//! replica of the shards it hosts, whose servers run on the shards' logs
//! ([`super::machine`]). It runs CrossStitch's pipelined commit (PLC) beside the chain.
//!
//! Messages of one attempt, hop `h` being `hops[h - 1]` and hop 0 the coordinator; a hop's
//! messages go to its shard's leader (a replica that does not lead answers with the leader it
//! knows, and the sender's timeout or resend does the rest):
//! - `Txn` ships the attempt (procedure, arguments, timestamp, the outputs of every piece so
//!   far) to hop `h`, which runs its pieces (through its log) and answers `Ack` to hop
//!   `h - 1`, then ships the attempt on to hop `h + 1`. Every node derives the whole hop list
//!   from the procedure and its arguments, so an acknowledgement names the hop after it
//!   implicitly.
//! - A hop votes once it has the previous hop's precommit (the coordinator's, for hop 1, sent
//!   on hop 1's acknowledgement), the next hop's acknowledgement, and no read of an undecided
//!   writer's version here; it sends `Precommit` to the next hop (overlapped replication: at
//!   once; serial: once the vote is in its log) and may no longer abort on its own once the
//!   vote is in its log: the decision belongs to the hops after it.
//! - Overlapped replication: when a hop's vote is in its log, its leader sends `Durable` to
//!   the last hop's shard.
//! - The last hop, with the previous precommit (overlapped: and a `Durable` from every hop
//!   before it), votes commit: it is the final coordinator, and its log (its shard's
//!   replicas) holds the decision before anyone hears it.
//! - A hop that has not voted may abort at any time (a conflict, a user abort, a writer it
//!   read aborting, or a timeout waiting for the messages above; a new leader waits afresh
//!   for every hop that has not voted); so may the coordinator before it precommitted.
//!   Whoever decides (the last hop's commit, or an abort) delivers the `Decision` to the
//!   coordinator and to every other hop's shard, resending until each answers `Applied` (a
//!   shard once its log applied it): the paper's commit message, forward-abort and abort to
//!   the previous hops in one reliable delivery. A shard's undelivered decisions are in its
//!   log, so a new leader goes on delivering them.
//!
//! Failures: a hop's leader failing is its shard's log failing over (a majority of its
//! replicas alive keeps it going, with every vote and decision its log holds; what it ran
//! ahead of its log is lost, and the attempts involved abort, since the last hop never hears
//! that the lost vote is durable); a coordinator failing leaves hop 1 waiting for its
//! precommit, which times out and aborts. A voted hop with no decision asks hop `h + 2` (or
//! the last hop), whose log aborts the attempt on its behalf if that hop has not voted.

mod msg;
pub use msg::*;

use super::machine::{serves, ChainMachine, Command, Event, Settled, Undelivered};
use super::server::{Hop, Why};
use crate::kit::coord::{attempt_ts, TS_AHEAD_MAX_NS};
use crate::kit::coord::{backoff_ns, bind_plan, AttemptIds, LeaderCache, RequestTable};
use crate::kit::host::{Hosts, RaftGroupMsgs, Route};
use crate::kit::timers::Timers;
use crate::{Durable, NodeContext, ProtocolNode};
use meridian_core::node::{ClientRequest, Node, Outbox, PersistToken, TimerId};
use meridian_core::rng::{child_rng, Rng};
use meridian_core::txn::{
    CommitPath, PieceOutput, ProcError, TxnFailure, TxnOutcome, TxnRequest, TxnResult,
};
use meridian_core::{NodeId, RequestId, ShardId, Time, Timestamp, TxnId};
use meridian_storage::MvccStore;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// What a timer was for.
#[derive(Debug)]
enum Purpose {
    /// The coordinator waits for hop 1's acknowledgement.
    AckTimeout(TxnId),
    /// A request's next attempt.
    Retry(RequestId),
    /// A hop that ran waits for what it needs to vote.
    HopTimeout(ShardId, TxnId, u32),
    /// A hop of this shard (`None`: this coordinator's hop 0) that voted has no decision yet:
    /// ask hop `hop + 2`.
    Inquire(Option<ShardId>, TxnId, u32),
    /// Resend undelivered decisions, forget delivered ones, collect garbage.
    Pace,
    /// The logs' clock.
    RaftTick,
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

/// A decision being delivered, by the leader of the shard that made it (or the coordinator).
#[derive(Debug)]
struct Delivery {
    /// The shard that decided (`None`: this coordinator).
    by: Option<ShardId>,
    /// The hops' copy.
    decision: Decision,
    /// The coordinator's copy.
    client: Decision,
    /// Who has not answered `Applied`: shards, and `None` for the coordinator.
    to: BTreeSet<Option<ShardId>>,
    sent_at: Time,
}

/// Overlapped replication: what the last hop's leader heard of an attempt's earlier votes.
#[derive(Debug)]
struct Durables {
    /// Per hop whose vote is in its log, the node that said so.
    hops: BTreeMap<u32, NodeId>,
    /// Wide-area legs on the longest causal chain among those messages.
    chain: u16,
    /// When the first came (an attempt never seen here is forgotten after a while).
    since: Time,
}

#[derive(Debug, Default)]
struct Counts {
    timeouts_total: u64,
    resent_total: u64,
    stale_total: u64,
    refused_total: u64,
    redirected_total: u64,
    inquiries_total: u64,
    durable_sent_total: u64,
    durable_dropped_total: u64,
    /// Overlapped replication: decisions of the shards led here, once committed.
    settled_commits_total: u64,
    settled_aborts_total: u64,
}

/// Whether a last hop's leader keeps another `Durable`, holding `held` = (one for the same
/// attempt already, entries in all) of at most `budget` entries: attempts not seen there yet
/// (a `Durable` may overtake its attempt) take at most half, so made-up ones cannot crowd out
/// the attempts running there.
fn durable_room(known: bool, (same, len): (bool, usize), budget: usize) -> bool {
    same || len < if known { budget } else { budget / 2 }
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
            _ => hops.push(Hop { shard: piece.shard, pieces: index..index + 1 }),
        }
    }
    Ok(hops)
}

/// A `chain` node.
pub struct ChainNode {
    context: NodeContext,
    hosts: Hosts<ChainMachine>,
    leaders: LeaderCache,
    requests: RequestTable,
    attempts: BTreeMap<TxnId, Attempt>,
    ids: AttemptIds,
    /// Every attempt's timestamp is above this (the last one, and what refusals named).
    ts_floor: Timestamp,
    home: ShardId,
    rng: Rng,
    /// Decisions being delivered, by attempt and deciding shard (`None`: this coordinator).
    deliveries: BTreeMap<(TxnId, Option<ShardId>), Delivery>,
    /// Per shard this node leads, decisions applied everywhere, to forget in its log: kept
    /// (and proposed again at each pace) until the log has forgotten them, since a proposal
    /// may be dropped (a leadership transfer in progress).
    delivered: BTreeMap<ShardId, BTreeSet<TxnId>>,
    timers: Timers<Purpose>,
    /// The hops of the shards this node leads with a timer armed: `(shard, attempt, hop,
    /// voted)`, a `HopTimeout` before the vote, an `Inquire` after. At most one entry per
    /// timer.
    watched: BTreeSet<(ShardId, TxnId, u32, bool)>,
    /// `chain-replication=overlapped` on replicated (or durable) shards: leaders run hops
    /// ahead of their logs (speculative hosting), and decisions wait on [`Settled`] events.
    overlapped: bool,
    /// Overlapped replication, for the last hops this node leads: per (shard, attempt), the
    /// votes of earlier hops known to be in their logs. At most `lock_holders_max` entries
    /// (more are dropped: their hops send again).
    durables: BTreeMap<(ShardId, TxnId), Durables>,
    counts: Counts,
}

impl std::fmt::Debug for ChainNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChainNode").field("id", &self.context.id).finish_non_exhaustive()
    }
}

impl ChainNode {
    /// A node of `context` with empty stores and logs.
    pub fn new(context: NodeContext) -> Self {
        Self::restore(context, &Durable::new()).expect("empty logs restore")
    }

    /// A node of `context` rebuilt from its durable logs.
    pub fn restore(context: NodeContext, durable: &Durable) -> Result<Self, String> {
        let shard_context = context.clone();
        let spec = <super::Chain as crate::Protocol>::OPTIONS;
        let logged = context.topology.replicas > 1 || context.durable;
        let overlapped =
            logged && context.options.choice(super::OPTION_REPLICATION, spec) == "overlapped";
        let make = |shard| {
            let machine = ChainMachine::new(shard, shard_context.clone());
            if overlapped {
                machine.settling()
            } else {
                machine
            }
        };
        let wrap = |groups| ChainMsg::Raft { groups };
        let hosts = if overlapped {
            Hosts::restore_speculative(&context, durable, wrap, make, ChainMachine::fork)?
        } else {
            Hosts::restore(&context, durable, wrap, make)?
        };
        let limits = context.limits;
        let leaders = LeaderCache::new(context.topology.clone());
        let home = leaders.home_shard(context.id);
        Ok(Self {
            hosts,
            leaders,
            requests: RequestTable::new(limits.requests_in_flight_max),
            attempts: BTreeMap::new(),
            ids: AttemptIds::new(context.id, context.incarnation),
            ts_floor: Timestamp::ZERO,
            home,
            rng: child_rng(context.seed, "chain-node", u64::from(context.id.0)),
            deliveries: BTreeMap::new(),
            delivered: BTreeMap::new(),
            timers: Timers::default(),
            watched: BTreeSet::new(),
            overlapped,
            durables: BTreeMap::new(),
            counts: Counts::default(),
            context,
        })
    }

    /// Applies what the logs restored hold, answering nobody (a restarted node).
    pub fn replay_committed(&mut self) -> crate::Replayed {
        let replayed = self.hosts.replay_committed();
        for (_, machine, _) in self.hosts.iter_mut() {
            machine.take_events();
        }
        for (_, machine, _) in self.hosts.committed_mut() {
            machine.take_settled();
        }
        replayed
    }

    fn pace_ns(&self) -> u64 {
        (self.context.timing.rpc_timeout_ns / 4).max(meridian_core::time::NS_PER_MS)
    }

    /// How long a hop that ran waits for what it needs to vote before it aborts.
    fn hop_timeout_ns(&self) -> u64 {
        2 * self.context.timing.rpc_timeout_ns
    }

    /// How long a hop that voted waits for the decision before it asks the hop two after it
    /// (and again after as long, while none comes): longer than a hop waits to vote, so an
    /// attempt that is merely slow is decided by its own hops first.
    fn inquire_ns(&self) -> u64 {
        2 * self.hop_timeout_ns()
    }

    /// Asks hop `hop + 2` of `txn` about it, for this node's hop `hop` (on `shard`; `None`:
    /// the coordinator), which voted and has no decision; and asks again later.
    fn on_inquire(
        &mut self,
        now: Time,
        (shard, txn, hop): (Option<ShardId>, TxnId, u32),
        out: &mut Outbox<ChainMsg>,
    ) {
        let (ts, shards) = match shard {
            None => match self.attempts.get(&txn) {
                Some(a) if a.precommitted => (a.ts, a.hops.iter().map(|h| h.shard).collect()),
                _ => return,
            },
            Some(shard) => {
                if !self.hosts.leads(shard) {
                    return; // Its new leader asks.
                }
                let record = self.hosts.get(shard).and_then(|m| m.server.records.get(&txn));
                match record {
                    Some(r) if r.ran.get(&hop).is_some_and(|s| s.precommitted) => {
                        (r.ts, r.hops.iter().map(|h| h.shard).collect::<Vec<_>>())
                    }
                    _ => return, // Decided.
                }
            }
        };
        // The hop two after; with overlapped replication, when there is none, the last hop:
        // what it ran may have been lost with its leader, so nothing there would end it.
        let asked = match hop as usize + 2 <= shards.len() {
            true => hop + 2,
            false if self.overlapped && (hop as usize) < shards.len() => hop + 1,
            false => return, // No hop two after: the last hop's log holds the decision.
        };
        let target = shards[asked as usize - 1];
        self.counts.inquiries_total += 1;
        let msg = ChainMsg::Inquire { txn, ts, shards, hop: asked };
        self.send_to_shard(now, target, msg, 0, out);
        match shard {
            Some(shard) => self.watch(shard, txn, hop, true, out),
            None => self.timers.set(Purpose::Inquire(None, txn, 0), self.inquire_ns(), out),
        }
    }

    /// Arms the timer hop `hop` of `txn` on `shard` (led here) needs, unless armed: before
    /// its vote the timeout that aborts it, after it the inquiry to the hop two after (when
    /// there is one; under overlapped replication, else to the last hop).
    fn watch(
        &mut self,
        shard: ShardId,
        txn: TxnId,
        hop: u32,
        voted: bool,
        out: &mut Outbox<ChainMsg>,
    ) {
        if !self.watched.insert((shard, txn, hop, voted)) {
            return;
        }
        let (purpose, wait) = match voted {
            false => (Purpose::HopTimeout(shard, txn, hop), self.hop_timeout_ns()),
            true => (Purpose::Inquire(Some(shard), txn, hop), self.inquire_ns()),
        };
        self.timers.set(purpose, wait, out);
    }

    /// Makes sure the shards this node leads deliver every decision they made, watch every
    /// hop they ran and propose the votes their hops can make: a new leader may apply entries
    /// of earlier terms after it took over, a restarted one replays its own log without
    /// answering (no event starts those), and a vote's proposal may have been dropped. A
    /// leader that just took over (`took_over`) also sends again the precommits of the hops
    /// that voted (its predecessor may have stepped down before sending them).
    fn reconcile(&mut self, now: Time, took_over: bool, out: &mut Outbox<ChainMsg>) {
        let mut hops = Vec::new();
        let mut precommits = Vec::new();
        let mut undelivered = Vec::new();
        let mut durable = Vec::new();
        for (shard, machine) in self.hosts.iter() {
            if !self.hosts.leads(shard) {
                continue;
            }
            let committed = self.hosts.committed(shard).unwrap_or(machine);
            if self.overlapped {
                // Not for attempts younger than a pace: the first copy is still on its way.
                let young = Timestamp(now.saturating_sub(self.pace_ns()));
                durable.extend(Self::durable_votes(committed, young));
            }
            for (&txn, record) in &machine.server.records {
                for (&hop, state) in &record.ran {
                    let voted = state.precommitted;
                    let next = record.hops.get(hop as usize).map(|h| h.shard);
                    let askable = record.hops.len() >= hop as usize + 2
                        || (self.overlapped && record.hops.len() > hop as usize);
                    if !voted || askable {
                        hops.push((shard, txn, hop, voted));
                    }
                    if let Some(next) = next.filter(|_| voted && took_over) {
                        precommits.push((next, txn, hop));
                    }
                }
            }
            let forgetting = self.delivered.get(&shard);
            // Only what the log holds is delivered (the same machine without speculation).
            for (&txn, u) in &committed.undelivered {
                let busy = self.deliveries.contains_key(&(txn, Some(shard)))
                    || forgetting.is_some_and(|f| f.contains(&txn));
                if !busy {
                    undelivered.push((shard, u.clone()));
                }
            }
        }
        for (shard, txn, hop, voted) in hops {
            self.watch(shard, txn, hop, voted, out);
            if !voted {
                self.try_vote(shard, txn, hop, out);
            }
        }
        for (next, txn, hop) in precommits {
            self.send_to_shard(now, next, ChainMsg::Precommit { txn, hop }, 0, out);
        }
        for (shard, Undelivered { decision, client, chain }) in undelivered {
            self.deliver(now, Some(shard), decision, client, chain, out);
        }
        // Again at every pace until the decision comes: one may have been lost, or the last
        // hop's leader changed and forgot them.
        for (txn, hop, last) in durable {
            self.counts.durable_sent_total += 1;
            self.send_to_shard(now, last, ChainMsg::Durable { txn, hop, last }, 0, out);
        }
    }

    /// Overlapped replication: the hops (not the last) of undecided attempts whose votes
    /// `committed` (a shard's committed machine) holds, with their last hops' shards; only
    /// attempts stamped below `young` (by their coordinators' clocks: a throttle, not a rule).
    fn durable_votes(committed: &ChainMachine, young: Timestamp) -> Vec<(TxnId, u32, ShardId)> {
        let mut votes = Vec::new();
        for (&txn, record) in committed.server.records.iter().filter(|(_, r)| r.ts < young) {
            let Some(last) = record.hops.last() else { continue };
            for (&hop, state) in &record.ran {
                if state.precommitted && (hop as usize) < record.hops.len() {
                    votes.push((txn, hop, last.shard));
                }
            }
        }
        votes
    }

    /// Overlapped replication: hop `hop` of `txn` says its vote is in its log (node `from`,
    /// a replica of that hop's shard); kept by the leader of the last hop's shard `last`.
    fn on_durable(
        &mut self,
        now: Time,
        from: NodeId,
        (txn, hop, last): (TxnId, u32, ShardId),
        out: &mut Outbox<ChainMsg>,
    ) {
        let topology = self.context.topology.clone();
        let server_node =
            topology.nodes.get(from.0 as usize).is_some_and(|n| !n.replicas.is_empty());
        let hops_max = meridian_core::txn::PIECES_MAX as u32;
        let bounded = last.0 < topology.shards && hop > 0 && hop < hops_max;
        if !self.overlapped || !bounded || !server_node {
            return self.refuse();
        }
        if !self.here(last, from, None, out) {
            return; // The hop sends it again, to the leader it was told.
        }
        let Some(machine) = self.hosts.get(last) else { return };
        if machine.server.ended(txn).is_some() {
            return; // Decided here.
        }
        let record = machine.server.records.get(&txn);
        let known = record.is_some();
        if let Some(record) = record {
            let fits = record.hops.last().is_some_and(|h| h.shard == last)
                && (hop as usize) < record.hops.len()
                && serves(&topology, from, record.hops[hop as usize - 1].shard);
            if !fits {
                return self.refuse();
            }
        }
        let key = (last, txn);
        let held = (self.durables.contains_key(&key), self.durables.len());
        if !durable_room(known, held, self.context.limits.lock_holders_max) {
            self.counts.durable_dropped_total += 1;
            return; // Its hop sends it again at its next pace.
        }
        let chain = out.chain();
        let entry = self.durables.entry(key).or_insert_with(|| Durables {
            hops: BTreeMap::new(),
            chain: 0,
            since: now,
        });
        entry.hops.insert(hop, from);
        entry.chain = entry.chain.max(chain);
        let Some(hops) = record.map(|r| r.hops.len() as u32) else {
            return; // The attempt has not reached the last hop yet.
        };
        self.try_vote(last, txn, hops, out);
    }

    fn on_inquiry(
        &mut self,
        from: NodeId,
        (txn, ts, shards): (TxnId, Timestamp, Vec<ShardId>),
        hop: u32,
        out: &mut Outbox<ChainMsg>,
    ) {
        let Some(&shard) = hop.checked_sub(1).and_then(|h| shards.get(h as usize)) else {
            return self.refuse();
        };
        if !self.here(shard, from, None, out) {
            return; // The inquirer asks again, of the leader it was told.
        }
        let command = Command::Inquire { from, txn, ts, shards, hop };
        if self.hosts.submit(shard, command, out).is_err() {
            self.refuse();
        }
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
        let first = hops[0].shard;
        let shipped =
            Shipped { txn, ts, request: call, home: self.home, hop: 1, outputs: Vec::new() };
        self.attempts.insert(txn, Attempt { request: id, ts, hops, precommitted: false });
        if let Some(request) = self.requests.get_mut(id) {
            request.attempt = Some(txn);
        }
        self.timers.set(Purpose::AckTimeout(txn), self.context.timing.rpc_timeout_ns, out);
        self.send_to_shard(now, first, ChainMsg::Txn(Box::new(shipped)), 0, out);
    }

    /// Sends `msg` to `shard`'s leader after `chain` wide-area legs; a shard this node leads
    /// handles it here at once.
    fn send_to_shard(
        &mut self,
        now: Time,
        shard: ShardId,
        msg: ChainMsg,
        chain: u16,
        out: &mut Outbox<ChainMsg>,
    ) {
        if shard.0 >= self.context.topology.shards {
            return self.refuse(); // Checked where it came from: not reached.
        }
        let leader = match self.hosts.route(shard) {
            Route::Here => self.context.id,
            Route::Forward(leader) => leader,
            Route::Drop => self.leaders.leader(shard),
        };
        self.post(now, leader, msg, chain, out);
    }

    /// Sends `msg` to `to` after `chain` wide-area legs, or handles it here when `to` is this
    /// node.
    fn post(
        &mut self,
        now: Time,
        to: NodeId,
        msg: ChainMsg,
        chain: u16,
        out: &mut Outbox<ChainMsg>,
    ) {
        let me = self.context.id;
        if to == me {
            self.dispatch(now, me, msg, out);
        } else {
            out.send_after(to, msg, chain);
        }
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

    fn on_client_ack(&mut self, now: Time, from: NodeId, txn: TxnId, out: &mut Outbox<ChainMsg>) {
        let Some(attempt) = self.attempts.get_mut(&txn) else { return };
        if attempt.precommitted || !serves(&self.context.topology, from, attempt.hops[0].shard) {
            return;
        }
        attempt.precommitted = true;
        self.post(now, from, ChainMsg::Precommit { txn, hop: 0 }, 0, out);
        self.timers.set(Purpose::Inquire(None, txn, 0), self.inquire_ns(), out);
    }

    fn on_ack_timeout(&mut self, now: Time, txn: TxnId, out: &mut Outbox<ChainMsg>) {
        let Some(attempt) = self.attempts.get(&txn) else { return };
        if attempt.precommitted {
            return;
        }
        self.counts.timeouts_total += 1;
        let (ts, shards) = (attempt.ts, attempt.hops.iter().map(|h| h.shard).collect());
        let why = Why::conflict(meridian_core::txn::AbortCause::Timeout);
        let decision = Decision { txn, ts, shards, outcome: Outcome::Aborted(why) };
        self.deliver(now, None, decision.clone(), decision, 0, out);
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

    /// A decision for one of this coordinator's attempts (the coordinator's copy).
    fn on_client_decision(
        &mut self,
        now: Time,
        from: NodeId,
        decision: Decision,
        out: &mut Outbox<ChainMsg>,
    ) {
        let txn = decision.txn;
        if txn.origin != self.context.id {
            return self.refuse();
        }
        let topology = &self.context.topology;
        let aborted = matches!(decision.outcome, Outcome::Aborted(_));
        let genuine = match self.attempts.get(&txn) {
            Some(attempt) => {
                let last = attempt.hops.last().is_some_and(|h| serves(topology, from, h.shard));
                last || (aborted && attempt.hops.iter().any(|h| serves(topology, from, h.shard)))
            }
            // Applied already (or from an earlier incarnation): only its acknowledgement.
            None => decision.shards.iter().any(|&s| serves(topology, from, s)),
        };
        if !genuine {
            return self.refuse();
        }
        self.client_outcome(now, &decision, out);
        self.post(now, from, ChainMsg::Applied { txn, shard: None }, 0, out);
    }

    // ----- servers -----------------------------------------------------------------------

    /// Where a message for `shard` goes from here: `true` to handle it at this node (it
    /// leads); otherwise it is relayed to the leader this node knows (unless it was relayed
    /// already: `relay` is `None`), and the sender is told that leader.
    fn here(
        &mut self,
        shard: ShardId,
        from: NodeId,
        relay: Option<Relayed>,
        out: &mut Outbox<ChainMsg>,
    ) -> bool {
        match self.hosts.route(shard) {
            Route::Here => true,
            Route::Forward(leader) => {
                self.counts.redirected_total += 1;
                if from != self.context.id {
                    out.send(from, ChainMsg::Leader { shard, leader });
                }
                if let Some(msg) = relay {
                    out.send(leader, ChainMsg::Relay { from, shard, msg });
                }
                false
            }
            Route::Drop => {
                self.refuse();
                false
            }
        }
    }

    fn on_txn(
        &mut self,
        now: Time,
        from: NodeId,
        shipped: Shipped,
        relayed_for: Option<ShardId>,
        out: &mut Outbox<ChainMsg>,
    ) {
        let shard = match hops_of(&self.context, &shipped.request, shipped.home) {
            Ok(hops) => match shipped.hop.checked_sub(1).and_then(|h| hops.get(h as usize)) {
                Some(hop) => hop.shard,
                None => return self.refuse(),
            },
            Err(_) => return self.refuse(), // A coordinator checked it: this copy is not genuine.
        };
        if relayed_for.is_some_and(|s| s != shard) {
            return self.refuse();
        }
        let relay = relayed_for.is_none().then(|| Relayed::Txn(Box::new(shipped.clone())));
        if !self.here(shard, from, relay, out) {
            return;
        }
        if shipped.ts.0 > now.saturating_add(TS_AHEAD_MAX_NS) {
            return self.refuse(); // A coordinator clock that far ahead is broken.
        }
        let command = Command::Run { from, shipped: Box::new(shipped) };
        if self.hosts.submit(shard, command, out).is_err() {
            self.refuse();
        }
    }

    fn refuse(&mut self) {
        self.counts.refused_total += 1;
    }

    /// The shard this node leads holding a record of `txn` whose hop `hop` ran, with that
    /// record's hops.
    fn led_record(&self, txn: TxnId, hop: u32) -> Option<(ShardId, Vec<Hop>)> {
        self.hosts.iter().filter(|(shard, _)| self.hosts.leads(*shard)).find_map(|(shard, m)| {
            let record = m.server.records.get(&txn)?;
            record.ran.contains_key(&hop).then(|| (shard, record.hops.clone()))
        })
    }

    fn on_ack(
        &mut self,
        now: Time,
        from: NodeId,
        txn: TxnId,
        hop: u32,
        out: &mut Outbox<ChainMsg>,
    ) {
        if hop == 1 && txn.origin == self.context.id && self.attempts.contains_key(&txn) {
            return self.on_client_ack(now, from, txn, out);
        }
        let Some(before) = hop.checked_sub(1).filter(|&h| h > 0) else { return };
        let Some((shard, hops)) = self.led_record(txn, before) else { return };
        let chain = out.chain();
        if hops.get(hop as usize - 1).is_none_or(|h| !serves(&self.context.topology, from, h.shard))
        {
            return self.refuse();
        }
        self.with_hop(shard, txn, before, |state| {
            state.acked.get_or_insert(chain);
        });
        self.try_vote(shard, txn, before, out);
    }

    fn on_precommit(
        &mut self,
        from: NodeId,
        txn: TxnId,
        hop: u32,
        relayed_for: Option<ShardId>,
        out: &mut Outbox<ChainMsg>,
    ) {
        let Some(next) = hop.checked_add(1) else { return };
        let Some((shard, hops)) = self.led_record(txn, next) else {
            // A replica that does not lead relays it, if it knows the hop.
            let shard = self.hosts.iter().find_map(|(shard, m)| {
                let record = m.server.records.get(&txn)?;
                record.ran.contains_key(&next).then_some(shard)
            });
            if let Some(shard) = shard.filter(|_| relayed_for.is_none()) {
                self.here(shard, from, Some(Relayed::Precommit { txn, hop }), out);
            }
            return;
        };
        if relayed_for.is_some_and(|s| s != shard) {
            return self.refuse();
        }
        let chain = out.chain();
        let genuine = match hop.checked_sub(1) {
            None => from == txn.origin,
            Some(before) => hops
                .get(before as usize)
                .is_some_and(|h| serves(&self.context.topology, from, h.shard)),
        };
        if !genuine {
            return self.refuse();
        }
        self.with_hop(shard, txn, next, |state| {
            state.precommit.get_or_insert(chain);
        });
        self.try_vote(shard, txn, next, out);
    }

    fn with_hop(
        &mut self,
        shard: ShardId,
        txn: TxnId,
        hop: u32,
        f: impl FnOnce(&mut super::server::HopState),
    ) {
        let state = self
            .hosts
            .get_mut(shard)
            .and_then(|m| m.server.records.get_mut(&txn))
            .and_then(|r| r.ran.get_mut(&hop));
        if let Some(state) = state {
            f(state);
        }
    }

    /// Proposes hop `hop` of `txn`'s vote (the last hop's: the commit) once it has what it
    /// needs. Proposing twice is harmless: the log applies one vote.
    fn try_vote(&mut self, shard: ShardId, txn: TxnId, hop: u32, out: &mut Outbox<ChainMsg>) {
        if !self.hosts.leads(shard) {
            return;
        }
        let Some(record) = self.hosts.get(shard).and_then(|m| m.server.records.get(&txn)) else {
            return;
        };
        let last = hop as usize == record.hops.len();
        let free = record.waits_on.is_empty();
        let Some(state) = record.ran.get(&hop) else { return };
        if state.precommitted {
            return;
        }
        let (Some(before), after) = (state.precommit, state.acked) else { return };
        if !free || (!last && after.is_none()) {
            return;
        }
        let mut chain = before.max(after.unwrap_or(0));
        if last && self.overlapped && record.hops.len() > 1 {
            // The commit waits until every earlier hop's vote is in its shard's log: then no
            // leader of theirs aborts, whatever failed while they ran ahead of their logs.
            let Some(durables) = self.durables.get(&(shard, txn)) else { return };
            let topology = &self.context.topology;
            let every = record.hops[..record.hops.len() - 1].iter().enumerate().all(|(i, h)| {
                durables.hops.get(&(i as u32 + 1)).is_some_and(|&n| serves(topology, n, h.shard))
            });
            if !every {
                return;
            }
            chain = chain.max(durables.chain);
        }
        let _ = self.hosts.submit(shard, Command::Vote { txn, hop, chain }, out);
    }

    /// Starts delivering a decision made here (by `by`'s leader, or by this coordinator):
    /// to the coordinator (its copy `client`) and every hop's shard but `by`.
    fn deliver(
        &mut self,
        now: Time,
        by: Option<ShardId>,
        decision: Decision,
        client: Decision,
        chain: u16,
        out: &mut Outbox<ChainMsg>,
    ) {
        let txn = decision.txn;
        if self.deliveries.contains_key(&(txn, by)) {
            return; // Delivering already (a new leader's second look).
        }
        let mut to: BTreeSet<Option<ShardId>> =
            decision.shards.iter().copied().filter(|&s| Some(s) != by).map(Some).collect();
        if txn.origin == self.context.id {
            self.client_outcome(now, &client, out);
        } else if by.is_some() {
            to.insert(None);
        }
        if to.is_empty() {
            return self.delivered_by(by, txn);
        }
        self.deliveries
            .insert((txn, by), Delivery { by, decision, client, to: to.clone(), sent_at: now });
        for target in to {
            self.send_decision(now, (txn, by), target, chain, out);
        }
    }

    fn send_decision(
        &mut self,
        now: Time,
        key: (TxnId, Option<ShardId>),
        target: Option<ShardId>,
        chain: u16,
        out: &mut Outbox<ChainMsg>,
    ) {
        let Some(delivery) = self.deliveries.get(&key) else { return };
        match target {
            None => {
                let decision = Box::new(delivery.client.clone());
                self.post(now, key.0.origin, ChainMsg::Decision { to: None, decision }, chain, out);
            }
            Some(shard) => {
                let decision = Box::new(delivery.decision.clone());
                let msg = ChainMsg::Decision { to: Some(shard), decision };
                self.send_to_shard(now, shard, msg, chain, out);
            }
        }
    }

    /// Every node that needed `txn`'s decision applied it: a shard's leader forgets it in
    /// its log (batched, at the next pace).
    fn delivered_by(&mut self, by: Option<ShardId>, txn: TxnId) {
        if let Some(shard) = by {
            self.delivered.entry(shard).or_default().insert(txn);
        }
    }

    fn on_decision(
        &mut self,
        now: Time,
        from: NodeId,
        (to, decision): (Option<ShardId>, Decision),
        relayed: bool,
        out: &mut Outbox<ChainMsg>,
    ) {
        let Some(shard) = to else { return self.on_client_decision(now, from, decision, out) };
        let relay = (!relayed).then(|| Relayed::Decision(Box::new(decision.clone())));
        if !self.here(shard, from, relay, out) {
            return;
        }
        let command = Command::Decide { from, decision: Box::new(decision) };
        if self.hosts.submit(shard, command, out).is_err() {
            self.refuse();
        }
    }

    /// `shard` (`None`: the coordinator) applied `txn`'s decision: every delivery of it
    /// (its deciding shard's, and the coordinator's if it gave up too) may stop sending there.
    fn on_applied(&mut self, from: NodeId, txn: TxnId, shard: Option<ShardId>) {
        let genuine = match shard {
            None => from == txn.origin,
            Some(shard) => serves(&self.context.topology, from, shard),
        };
        if !genuine {
            return;
        }
        let keys: Vec<(TxnId, Option<ShardId>)> = self
            .deliveries
            .range((txn, None)..)
            .take_while(|(k, _)| k.0 == txn)
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            let Some(delivery) = self.deliveries.get_mut(&key) else { continue };
            delivery.to.remove(&shard);
            if delivery.to.is_empty() {
                self.deliveries.remove(&key);
                self.delivered_by(key.1, txn);
            }
        }
    }

    fn on_hop_timeout(
        &mut self,
        (shard, txn, hop): (ShardId, TxnId, u32),
        out: &mut Outbox<ChainMsg>,
    ) {
        if !self.hosts.leads(shard) {
            return;
        }
        let waiting = self
            .hosts
            .get(shard)
            .and_then(|m| m.server.records.get(&txn))
            .and_then(|r| r.ran.get(&hop))
            .is_some_and(|s| !s.precommitted);
        if waiting {
            self.counts.timeouts_total += 1;
            let _ = self.hosts.submit(shard, Command::Abort { txn, hop }, out);
            // Again later, should the log have dropped the proposal.
            self.watch(shard, txn, hop, false, out);
        }
    }

    fn pace(&mut self, now: Time, out: &mut Outbox<ChainMsg>) {
        let resend_ns = self.context.timing.rpc_timeout_ns;
        // A decider that no longer leads its shard hands the delivery to the new leader
        // (it is in the shard's log).
        let hosts = &self.hosts;
        self.deliveries.retain(|_, d| d.by.is_none_or(|shard| hosts.leads(shard)));
        type Due = Vec<((TxnId, Option<ShardId>), Vec<Option<ShardId>>)>;
        let due: Due = self
            .deliveries
            .iter_mut()
            .filter(|(_, d)| now.saturating_sub(d.sent_at) >= resend_ns)
            .map(|(&key, d)| {
                d.sent_at = now;
                (key, d.to.iter().copied().collect())
            })
            .collect();
        for (key, targets) in due {
            for target in targets {
                self.counts.resent_total += 1;
                if let Some(shard) = target.filter(|s| s.0 < self.context.topology.shards) {
                    // No answer from the leader believed: try another replica.
                    self.leaders.suspect(shard);
                }
                self.send_decision(now, key, target, 0, out);
            }
        }
        self.reconcile(now, false, out);
        // The new leader of a shard this node no longer leads delivers them again, and
        // forgets them.
        let hosts = &self.hosts;
        self.delivered.retain(|&shard, txns| {
            let undelivered = hosts.committed(shard).map(|m| &m.undelivered);
            txns.retain(|txn| undelivered.is_some_and(|u| u.contains_key(txn)));
            hosts.leads(shard) && !txns.is_empty()
        });
        let batches: Vec<(ShardId, Vec<TxnId>)> = self
            .delivered
            .iter()
            .map(|(&shard, txns)| {
                (shard, txns.iter().take(super::machine::DELIVERED_BATCH_MAX).copied().collect())
            })
            .collect();
        for (shard, txns) in batches {
            let _ = self.hosts.submit(shard, Command::Delivered { txns }, out);
        }
        // What the last hops heard of attempts decided since, or never seen here.
        let forget_ns = self.inquire_ns();
        let hosts = &self.hosts;
        self.durables.retain(|&(shard, txn), d| {
            let Some(machine) = hosts.get(shard).filter(|_| hosts.leads(shard)) else {
                return false;
            };
            let known = machine.server.records.contains_key(&txn);
            machine.server.ended(txn).is_none()
                && (known || now.saturating_sub(d.since) < forget_ns)
        });
        let retention = self.context.timing.gc_retention_ns;
        let watermark = Timestamp(now.saturating_sub(retention));
        for shard in self.hosts.shards() {
            let behind = self.hosts.get(shard).is_some_and(|m| {
                m.server.store.gc_watermark().0.saturating_add(resend_ns) < watermark.0
            });
            if behind && self.hosts.leads(shard) {
                let _ = self.hosts.submit(shard, Command::Collect { watermark }, out);
            }
        }
    }

    /// Carries out what the machines' applies asked of the leader, until none is left (each
    /// event may submit commands, applied at once without a log).
    fn events(&mut self, now: Time, out: &mut Outbox<ChainMsg>) {
        loop {
            let mut batch = Vec::new();
            for (shard, machine, _) in self.hosts.iter_mut() {
                batch.extend(machine.take_events().into_iter().map(|e| (shard, e)));
            }
            let mut settled = Vec::new();
            if self.overlapped {
                // The committed machines of the shards led here; every other copy's are
                // dropped.
                for (shard, machine, leads) in self.hosts.committed_mut() {
                    let events = machine.take_settled();
                    if leads == Some(true) {
                        settled.extend(events.into_iter().map(|e| (shard, e)));
                    }
                }
            }
            if batch.is_empty() && settled.is_empty() {
                return;
            }
            for (shard, event) in batch {
                self.on_event(now, shard, event, out);
            }
            for (shard, event) in settled {
                self.on_settled(now, shard, event, out);
            }
        }
    }

    /// Overlapped replication: what the log of `shard` (led here) has committed.
    fn on_settled(
        &mut self,
        now: Time,
        shard: ShardId,
        event: Settled,
        out: &mut Outbox<ChainMsg>,
    ) {
        match event {
            Settled::Voted { txn, hop } => {
                let last = self
                    .hosts
                    .committed(shard)
                    .and_then(|m| m.server.records.get(&txn))
                    .filter(|r| (hop as usize) < r.hops.len())
                    .and_then(|r| r.hops.last())
                    .map(|h| h.shard);
                if let Some(last) = last {
                    self.counts.durable_sent_total += 1;
                    self.send_to_shard(now, last, ChainMsg::Durable { txn, hop, last }, 0, out);
                }
            }
            Settled::Decided { txn, committed } => {
                match committed {
                    true => self.counts.settled_commits_total += 1,
                    false => self.counts.settled_aborts_total += 1,
                }
                self.durables.remove(&(shard, txn));
                self.on_event(now, shard, Event::Decided { txn }, out);
            }
            Settled::Applied { to, txn } => {
                self.durables.remove(&(shard, txn));
                self.on_event(now, shard, Event::Applied { to, txn }, out);
            }
        }
    }

    fn on_event(&mut self, now: Time, shard: ShardId, event: Event, out: &mut Outbox<ChainMsg>) {
        match event {
            Event::Ran { from, txn, hop, request, home } => {
                self.post(now, from, ChainMsg::Ack { txn, hop }, 0, out);
                let Some(record) = self.hosts.get(shard).and_then(|m| m.server.records.get(&txn))
                else {
                    return; // Decided meanwhile (a cascade, here at once).
                };
                if let Some(next) = record.hops.get(hop as usize) {
                    let next = next.shard;
                    let shipped = Shipped {
                        txn,
                        ts: record.ts,
                        request: *request,
                        home,
                        hop: hop + 1,
                        outputs: record.outputs.clone(),
                    };
                    self.send_to_shard(now, next, ChainMsg::Txn(Box::new(shipped)), 0, out);
                }
                self.watch(shard, txn, hop, false, out);
                self.try_vote(shard, txn, hop, out);
            }
            Event::Ack { to, txn, hop } => self.post(now, to, ChainMsg::Ack { txn, hop }, 0, out),
            Event::Stale { to, txn, floor } => {
                self.counts.stale_total += 1;
                self.post(now, to, ChainMsg::Stale { txn, floor }, 0, out);
            }
            Event::Voted { txn, hop, chain } => {
                let next = self
                    .hosts
                    .get(shard)
                    .and_then(|m| m.server.records.get(&txn))
                    .and_then(|r| r.hops.get(hop as usize))
                    .map(|h| h.shard);
                if let Some(next) = next {
                    self.send_to_shard(now, next, ChainMsg::Precommit { txn, hop }, chain, out);
                    self.watch(shard, txn, hop, true, out);
                }
            }
            Event::Decided { txn } => {
                let Some(Undelivered { decision, client, chain }) =
                    self.hosts.committed(shard).and_then(|m| m.undelivered.get(&txn)).cloned()
                else {
                    return;
                };
                self.deliver(now, Some(shard), decision, client, chain, out);
            }
            Event::Applied { to, txn } => {
                self.post(now, to, ChainMsg::Applied { txn, shard: Some(shard) }, 0, out)
            }
            Event::Freed { txn } => {
                let hops: Vec<u32> = self
                    .hosts
                    .get(shard)
                    .and_then(|m| m.server.records.get(&txn))
                    .map(|r| r.ran.keys().copied().collect())
                    .unwrap_or_default();
                for hop in hops {
                    self.try_vote(shard, txn, hop, out);
                }
            }
            // Hops that have not voted wait afresh, those that voted ask later; undelivered
            // decisions go out again.
            Event::Leads => self.reconcile(now, true, out),
        }
    }

    fn on_stale(&mut self, now: Time, from: NodeId, txn: TxnId, floor: Timestamp) {
        let Some(attempt) = self.attempts.get(&txn) else { return };
        let topology = &self.context.topology;
        if attempt.hops.iter().any(|h| serves(topology, from, h.shard)) {
            self.raise_floor(now, floor);
        }
    }

    fn dispatch(&mut self, now: Time, from: NodeId, msg: ChainMsg, out: &mut Outbox<ChainMsg>) {
        match msg {
            ChainMsg::Txn(shipped) => self.on_txn(now, from, *shipped, None, out),
            ChainMsg::Ack { txn, hop } => self.on_ack(now, from, txn, hop, out),
            ChainMsg::Precommit { txn, hop } => self.on_precommit(from, txn, hop, None, out),
            ChainMsg::Decision { to, decision } => {
                self.on_decision(now, from, (to, *decision), false, out)
            }
            ChainMsg::Relay { from: sender, shard, msg } => {
                // Only a replica of the shard relays, and only to it.
                let topology = &self.context.topology;
                if from == self.context.id
                    || !serves(topology, from, shard)
                    || sender.0 as usize >= topology.nodes.len()
                {
                    return self.refuse();
                }
                match msg {
                    Relayed::Txn(shipped) => self.on_txn(now, sender, *shipped, Some(shard), out),
                    Relayed::Precommit { txn, hop } => {
                        self.on_precommit(sender, txn, hop, Some(shard), out)
                    }
                    Relayed::Decision(decision) => {
                        self.on_decision(now, sender, (Some(shard), *decision), true, out)
                    }
                }
            }
            ChainMsg::Applied { txn, shard } => self.on_applied(from, txn, shard),
            ChainMsg::Durable { txn, hop, last } => {
                self.on_durable(now, from, (txn, hop, last), out)
            }
            ChainMsg::Stale { txn, floor } => self.on_stale(now, from, txn, floor),
            ChainMsg::Inquire { txn, ts, shards, hop } => {
                self.on_inquiry(from, (txn, ts, shards), hop, out)
            }
            ChainMsg::Leader { shard, leader } => {
                if shard.0 < self.context.topology.shards
                    && serves(&self.context.topology, from, shard)
                {
                    self.leaders.note(shard, leader);
                }
            }
            ChainMsg::Raft { groups } => self.hosts.on_raft(from, groups, out),
        }
    }

    fn fire(&mut self, now: Time, timer: TimerId, out: &mut Outbox<ChainMsg>) {
        let Some(purpose) = self.timers.take(timer) else { return };
        match purpose {
            Purpose::AckTimeout(txn) => self.on_ack_timeout(now, txn, out),
            Purpose::Retry(id) => self.on_retry(now, id, out),
            Purpose::HopTimeout(shard, txn, hop) => {
                self.watched.remove(&(shard, txn, hop, false));
                self.on_hop_timeout((shard, txn, hop), out)
            }
            Purpose::Inquire(shard, txn, hop) => {
                if let Some(shard) = shard {
                    self.watched.remove(&(shard, txn, hop, true));
                }
                self.on_inquire(now, (shard, txn, hop), out)
            }
            Purpose::Pace => {
                self.pace(now, out);
                self.timers.set(Purpose::Pace, self.pace_ns(), out);
            }
            Purpose::RaftTick => {
                self.hosts.tick(out);
                self.timers.set(Purpose::RaftTick, self.context.timing.raft_tick_ns, out);
            }
        }
    }

    /// Ends every call: the leader's events, then the logs' messages.
    fn settle(&mut self, now: Time, out: &mut Outbox<ChainMsg>) {
        self.events(now, out);
        self.hosts.flush(out);
    }
}

impl Node for ChainNode {
    type Msg = ChainMsg;

    fn on_start(&mut self, now: Time, out: &mut Outbox<ChainMsg>) {
        self.timers.set(Purpose::Pace, self.pace_ns(), out);
        if self.hosts.has_logs() {
            self.timers.set(Purpose::RaftTick, self.context.timing.raft_tick_ns, out);
            self.hosts.on_start(out);
        }
        self.settle(now, out);
    }

    fn on_message(&mut self, now: Time, from: NodeId, msg: ChainMsg, out: &mut Outbox<ChainMsg>) {
        self.dispatch(now, from, msg, out);
        self.settle(now, out);
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, out: &mut Outbox<ChainMsg>) {
        self.fire(now, timer, out);
        self.settle(now, out);
    }

    fn on_persisted(&mut self, now: Time, token: PersistToken, out: &mut Outbox<ChainMsg>) {
        self.hosts.on_persisted(token, out);
        self.settle(now, out);
    }

    fn on_persisted_batch(
        &mut self,
        now: Time,
        tokens: &[PersistToken],
        out: &mut Outbox<ChainMsg>,
    ) {
        // The log messages the whole group commit releases leave together.
        for &token in tokens {
            self.hosts.on_persisted(token, out);
        }
        self.settle(now, out);
    }

    fn submit(&mut self, now: Time, request: ClientRequest, out: &mut Outbox<ChainMsg>) {
        let busy = (!self.context.topology.nodes[self.context.id.0 as usize].coordinator)
            .then(|| "this node is not a coordinator".to_string());
        let Some(id) = self.requests.admit(now, request, busy, out) else { return };
        // Through the retry path: it waits for room to deliver another decision.
        self.on_retry(now, id, out);
        self.settle(now, out);
    }

    fn groups(&self) -> Vec<meridian_core::node::GroupStatus> {
        self.hosts.groups()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut machines = super::machine::MachineCounts::default();
        let mut open = 0;
        let mut undelivered = 0;
        // What a leader answered, from every copy: a speculating host's counts move with its
        // speculative machine (a follower's mirror keeps them while it does not lead), and
        // its committed one, which answers nothing, counts none of these.
        for (_, machine) in self.hosts.machines() {
            let c = machine.counts;
            machines.hops_run += c.hops_run;
            machines.commits += c.commits;
            machines.aborts += c.aborts;
            machines.cascading += c.cascading;
            machines.inquired += c.inquired;
            machines.refused += c.refused;
        }
        // Gauges, from the machine each host serves.
        for (_, machine) in self.hosts.iter() {
            open += machine.server.open();
            undelivered += machine.undelivered.len();
        }
        let mut counters = vec![
            ("chain_hops_run_total", machines.hops_run),
            ("chain_commits_total", machines.commits + self.counts.settled_commits_total),
            ("chain_aborts_decided_total", machines.aborts + self.counts.settled_aborts_total),
            ("chain_cascading_aborts_total", machines.cascading),
            ("chain_timeouts_total", self.counts.timeouts_total),
            ("chain_inquiries_total", self.counts.inquiries_total),
            ("chain_durable_notices_total", self.counts.durable_sent_total),
            ("chain_durable_notices_dropped_total", self.counts.durable_dropped_total),
            ("chain_inquiry_aborts_total", machines.inquired),
            ("chain_decisions_resent_total", self.counts.resent_total),
            ("chain_stale_refusals_total", self.counts.stale_total),
            ("chain_refused_total", self.counts.refused_total + machines.refused),
            ("chain_redirected_total", self.counts.redirected_total),
            ("chain_open_attempts", open as u64),
            ("chain_undelivered_decisions", undelivered as u64),
            ("chain_deliveries", self.deliveries.len() as u64),
        ];
        let mut hosting = BTreeMap::new();
        self.hosts.counters(&mut hosting);
        counters.extend(hosting);
        counters
    }
}

impl ProtocolNode for ChainNode {
    fn leads(&self, shard: ShardId) -> bool {
        self.hosts.leads(shard)
    }

    fn stores(&self) -> Vec<(ShardId, &MvccStore)> {
        self.hosts.iter().map(|(shard, m)| (shard, &m.server.store)).collect()
    }

    fn stores_mut(&mut self) -> Vec<(ShardId, &mut MvccStore)> {
        self.hosts.machines_mut().map(|(shard, m)| (shard, &mut m.server.store)).collect()
    }
}

#[cfg(test)]
mod tests;
