//! One shard's `chain` server as a replicated state machine, hosted on the shard's Raft group
//! by the kit ([`crate::kit::host`]): every change to an attempt's state here is a command in
//! the shard's log, applied by every replica in log order, so a new leader carries on from the
//! state its log holds:
//!
//! - **running a hop** ([`Command::Run`]): its pending versions and read stamps survive the
//!   leader (the role of the paper's key replicas, which run each put and notify the next
//!   hop);
//! - **a hop's vote** ([`Command::Vote`]): once in the log, no later leader of the shard aborts
//!   the hop; the last hop's vote is the commit decision (the role of the final coordinator's
//!   Paxos commit with transaction replicas);
//! - **an abort** ([`Command::Abort`], a timeout) and **a decision delivered** by another
//!   node ([`Command::Decide`]), with the cascading aborts they cause;
//! - **the decisions this shard made** and has not yet delivered everywhere, so a new leader
//!   delivers them ([`Command::Delivered`] forgets them), and the garbage-collection
//!   watermark ([`Command::Collect`]).
//!
//! When the leader may tell others depends on `chain-replication`. **Serial:** it answers
//! once the command has committed, so whatever a hop tells another node (an acknowledgement,
//! the copy shipped on, a precommit, a decision) is held by a quorum first. **Overlapped:** it
//! answers from a speculative copy of the machine as soon as its log has taken the command
//! (acknowledgements, copies shipped on, precommits go out ahead of the log), and what must
//! not be undone waits for the committed copy's [`Settled`] events: a vote in the log
//! (`Durable` to the last hop), a decision to deliver, a delivered decision applied.
//!
//! Applying reads no clock and draws no randomness (the watermark travels in its command; the
//! checks that need the time, such as a timestamp too far ahead, are the leader's before it
//! proposes). What only the leader needs to do after an apply (acknowledge, ship on, send a
//! precommit, deliver under serial replication, arm a timeout) is queued as [`Event`]s for the
//! node ([`ChainMachine::take_events`]). Without replicas and without a durable log a command
//! is applied at once, the same code, serially.

use super::node::{hops_of, Decision, Outcome, Shipped};
use super::server::{Hop, HopRun, Server, ServerImage, Why};
use crate::kit::host::StateMachine;
use crate::NodeContext;
use meridian_core::node::Outbox;
use meridian_core::topology::Topology;
use meridian_core::txn::{AbortCause, TxnRequest, PIECES_MAX};
use meridian_core::{NodeId, ShardId, Timestamp, TxnId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// Most attempts one [`Command::Delivered`] forgets.
pub const DELIVERED_BATCH_MAX: usize = 1024;

/// A state change of one shard's server, as its log carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Run hop `shipped.hop` of an attempt, shipped by node `from`.
    Run {
        /// The node that shipped it (the hop before's leader, or the coordinator).
        from: NodeId,
        /// The attempt.
        shipped: Box<Shipped>,
    },
    /// Hop `hop` of `txn` votes commit (the last hop: commits), after a causal chain of
    /// `chain` wide-area legs.
    Vote {
        /// The attempt.
        txn: TxnId,
        /// Its hop here.
        hop: u32,
        /// Wide-area legs so far.
        chain: u16,
    },
    /// Hop `hop` of `txn`, which has not voted, gave up waiting: the attempt aborts.
    Abort {
        /// The attempt.
        txn: TxnId,
        /// Its hop here.
        hop: u32,
    },
    /// A decision, delivered by node `from`.
    Decide {
        /// The node that delivered it.
        from: NodeId,
        /// The decision (the hops' copy).
        decision: Box<Decision>,
    },
    /// These decisions of this shard were applied everywhere: forget them.
    Delivered {
        /// The attempts.
        txns: Vec<TxnId>,
    },
    /// Hop `hop - 2` of `txn` (0: its coordinator), node `from`, voted long ago and has no
    /// decision: if hop `hop` (this shard's) has not voted, or the attempt never reached it,
    /// it aborts here on that hop's behalf (the paper's query to hop `i + 2`). With overlapped
    /// replication the hop before the last asks the last hop itself (and a one-hop attempt's
    /// coordinator asks hop 1): a run ahead of its log may have been lost with its leader,
    /// leaving nothing there to time out.
    Inquire {
        /// The inquiring node.
        from: NodeId,
        /// The attempt.
        txn: TxnId,
        /// Its timestamp.
        ts: Timestamp,
        /// The shards of its hops, in chain order.
        shards: Vec<ShardId>,
        /// The hop asked about (this shard's).
        hop: u32,
    },
    /// Raise the garbage-collection watermark (kept below every undecided attempt).
    Collect {
        /// The watermark the leader's clock gives.
        watermark: Timestamp,
    },
}

/// A decision this shard made, kept until every node that needs it has applied it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Undelivered {
    /// The hops' copy.
    pub decision: Decision,
    /// The coordinator's copy (a commit's carries every piece's output).
    pub client: Decision,
    /// Wide-area legs on the decision's causal chain.
    pub chain: u16,
}

/// What the leader does after an apply; the node carries it out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Hop `hop` of `txn` ran here: acknowledge to `from`, ship the attempt on, wait for what
    /// the hop needs to vote.
    Ran {
        /// The node that shipped it.
        from: NodeId,
        /// The attempt.
        txn: TxnId,
        /// The hop.
        hop: u32,
        /// The procedure and its arguments, to ship on.
        request: Box<TxnRequest>,
        /// The attempt's home shard, to ship on.
        home: ShardId,
    },
    /// A duplicate copy of a hop that ran: acknowledge it again.
    Ack {
        /// The node that shipped it.
        to: NodeId,
        /// The attempt.
        txn: TxnId,
        /// The hop.
        hop: u32,
    },
    /// An attempt refused for its timestamp: the coordinator's retries start above `floor`.
    Stale {
        /// The coordinator.
        to: NodeId,
        /// The attempt.
        txn: TxnId,
        /// The timestamp to exceed.
        floor: Timestamp,
    },
    /// Hop `hop` (not the last) voted: send the precommit on.
    Voted {
        /// The attempt.
        txn: TxnId,
        /// The hop.
        hop: u32,
        /// Wide-area legs so far.
        chain: u16,
    },
    /// This shard decided `txn`: deliver it.
    Decided {
        /// The attempt.
        txn: TxnId,
    },
    /// A decision node `to` delivered was applied here.
    Applied {
        /// The node that delivered it.
        to: NodeId,
        /// The attempt.
        txn: TxnId,
    },
    /// `txn` waits on no writer here any more: it may vote.
    Freed {
        /// The attempt.
        txn: TxnId,
    },
    /// This replica leads now: wait again for every hop that has not voted, deliver every
    /// undelivered decision.
    Leads,
}

/// What a command did once it is in the committed log (see [`ChainMachine::settles`]):
/// queued by every copy of the machine; the node acts on the leader's committed copy's and
/// drops the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Hop `hop` (not the last) of `txn` voted, and the vote is in the log: tell the last hop.
    Voted {
        /// The attempt.
        txn: TxnId,
        /// The hop.
        hop: u32,
    },
    /// This shard decided `txn`, and the decision is in the log: deliver it.
    Decided {
        /// The attempt.
        txn: TxnId,
        /// A commit (else an abort), for the counters.
        committed: bool,
    },
    /// A decision node `to` delivered was applied here, and is in the log.
    Applied {
        /// The node that delivered it.
        to: NodeId,
        /// The attempt.
        txn: TxnId,
    },
}

/// Counts of what the leader did (a follower's applies are not counted twice). Under
/// overlapped replication the speculative machine counts hops run, cascades and inquiries
/// (work done, kept across a re-mirror by `inherit`), and the node counts decisions once
/// committed ([`Settled::Decided`]): a speculative decision its log lost is not counted.
#[derive(Clone, Copy, Debug, Default)]
pub struct MachineCounts {
    /// Hops run.
    pub hops_run: u64,
    /// Commits decided (last hops).
    pub commits: u64,
    /// Aborts decided here (conflicts, timeouts, cascades).
    pub aborts: u64,
    /// Of those, cascading aborts.
    pub cascading: u64,
    /// Of those, aborts on an inquiring hop's behalf.
    pub inquired: u64,
    /// Commands refused when applied (not genuine, or no room).
    pub refused: u64,
}

/// One shard's `chain` server on its log.
#[derive(Debug)]
pub struct ChainMachine {
    context: NodeContext,
    /// The MVTO server.
    pub server: Server,
    /// The decisions this shard made that are not known to be applied everywhere.
    pub undelivered: BTreeMap<TxnId, Undelivered>,
    events: Vec<Event>,
    /// Overlapped replication: the leader answers from a speculative copy of this machine,
    /// ahead of its log, and whatever must not be undone (a vote the last hop counts on, a
    /// decision, an applied decision) is told only once committed, as [`Settled`] events of
    /// the committed copy instead of [`Event`]s.
    settles: bool,
    settled: Vec<Settled>,
    /// What the leader did.
    pub counts: MachineCounts,
}

/// True when node `node` hosts a replica of `shard`.
pub fn serves(topology: &Topology, node: NodeId, shard: ShardId) -> bool {
    topology.nodes.get(node.0 as usize).is_some_and(|n| n.replicas.iter().any(|r| r.shard == shard))
}

impl ChainMachine {
    /// `shard`'s server on node `context`, with an empty store.
    pub fn new(shard: ShardId, context: NodeContext) -> Self {
        let limits = context.limits;
        let server =
            Server::new(shard, limits.read_stamps_max, limits.decided_max, limits.lock_holders_max);
        Self {
            context,
            server,
            undelivered: BTreeMap::new(),
            events: Vec::new(),
            settles: false,
            settled: Vec::new(),
            counts: MachineCounts::default(),
        }
    }

    /// Counts a command refused when applied: by every replica, or under overlapped
    /// replication only where answered (so the copies of one replica count it once).
    fn refuse(&mut self, answer: bool) {
        if answer || !self.settles {
            self.counts.refused += 1;
        }
    }

    /// The machine of overlapped replication (see the field `settles`).
    pub fn settling(mut self) -> Self {
        self.settles = true;
        self
    }

    /// A copy of the replicated state, with nothing queued (speculative hosting's fork).
    pub fn fork(&self) -> Self {
        Self {
            context: self.context.clone(),
            server: self.server.clone(),
            undelivered: self.undelivered.clone(),
            events: Vec::new(),
            settles: self.settles,
            settled: Vec::new(),
            counts: MachineCounts::default(),
        }
    }

    /// The events queued since the last call.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// The settled events queued since the last call.
    pub fn take_settled(&mut self) -> Vec<Settled> {
        std::mem::take(&mut self.settled)
    }

    /// `txn` was decided here (`committed`, or aborted): with overlapped replication,
    /// settled (every copy queues it: the node keeps, and counts, the leader's committed
    /// one's), else an event and a count when answering.
    fn decided(&mut self, txn: TxnId, committed: bool, answer: bool) {
        if self.settles {
            self.settled.push(Settled::Decided { txn, committed });
        } else if answer {
            self.events.push(Event::Decided { txn });
            match committed {
                true => self.counts.commits += 1,
                false => self.counts.aborts += 1,
            }
        }
    }

    /// True when another undecided attempt cannot be taken (no room for it, or for the
    /// decision it may end in).
    pub fn full(&self) -> bool {
        self.server.full() || self.undelivered.len() >= self.context.limits.deliveries_max
    }

    /// The hops of a shipped attempt, when the copy is one a genuine sender could have sent
    /// (`from` shipped it) and its hop is this shard's.
    pub fn check_run(&self, from: NodeId, shipped: &Shipped) -> Result<Vec<Hop>, String> {
        let topology = &self.context.topology;
        let origin = shipped.txn.origin;
        if !topology.nodes.get(origin.0 as usize).is_some_and(|n| n.coordinator) {
            return Err("attempts come from coordinators".into());
        }
        if shipped.home.0 >= topology.shards {
            return Err("no such home shard".into());
        }
        let hops = hops_of(&self.context, &shipped.request, shipped.home)
            .map_err(|e| format!("the attempt does not plan: {e}"))?;
        let hop = shipped.hop;
        let Some(here) = hop.checked_sub(1).and_then(|h| hops.get(h as usize)) else {
            return Err(format!("hop {hop} is not in a chain of {}", hops.len()));
        };
        if here.shard != self.server.shard || shipped.outputs.len() != here.pieces.start as usize {
            return Err("the hop is not this shard's, or its outputs do not fit".into());
        }
        let genuine = match hop {
            1 => from == origin,
            _ => serves(topology, from, hops[hop as usize - 2].shard),
        };
        if !genuine {
            return Err("shipped by a node that does not serve the hop before".into());
        }
        Ok(hops)
    }

    fn run(&mut self, from: NodeId, shipped: Shipped, answer: bool) {
        let Ok(hops) = self.check_run(from, &shipped) else {
            self.refuse(answer);
            return;
        };
        let (txn, hop, client) = (shipped.txn, shipped.hop, shipped.txn.origin);
        let server = &mut self.server;
        if server.ended(txn).is_some() {
            return; // Decided (or refused) already: a late or duplicated copy.
        }
        if let Some(record) = server.records.get(&txn) {
            if record.ts != shipped.ts || record.hops != hops {
                self.refuse(answer); // Not a copy of the attempt this server runs.
                return;
            }
            if record.ran.contains_key(&hop) {
                // A duplicate: the acknowledgement may have been lost with the first copy.
                if answer {
                    self.events.push(Event::Ack { to: from, txn, hop });
                }
                return;
            }
        } else {
            if server.maybe_forgotten(txn, shipped.ts) {
                let floor = server.forgotten_below(client);
                if answer {
                    self.events.push(Event::Stale { to: client, txn, floor });
                }
                return;
            }
            if self.full() {
                // No room: the hop before times out and aborts.
                self.refuse(answer);
                return;
            }
            if let Err(floor) = self.server.admit_ts(txn, shipped.ts) {
                if answer {
                    self.events.push(Event::Stale { to: client, txn, floor });
                }
                return;
            }
        }
        let Some(procedure) = self.context.registry.get(shipped.request.proc).cloned() else {
            self.refuse(answer);
            return;
        };
        if answer {
            self.counts.hops_run += 1;
        }
        let Shipped { ts, request, home, outputs, .. } = shipped;
        let run = self.server.run_hop(
            procedure.as_ref(),
            &self.context.partitioner,
            (txn, ts, client),
            &request,
            &hops,
            hop,
            outputs,
        );
        match run {
            HopRun::Abort(why) => self.abort(txn, why, answer),
            HopRun::Ran if answer => {
                let request = Box::new(request);
                self.events.push(Event::Ran { from, txn, hop, request, home });
            }
            HopRun::Ran => {}
        }
    }

    fn vote(&mut self, txn: TxnId, hop: u32, chain: u16, answer: bool) {
        let Some(record) = self.server.records.get_mut(&txn) else { return };
        let last = hop as usize == record.hops.len();
        let free = record.waits_on.is_empty();
        let Some(state) = record.ran.get_mut(&hop) else { return };
        if state.precommitted || !free {
            return; // Voted already, or a later hop here read an undecided writer since.
        }
        state.precommitted = true;
        if !last {
            if answer {
                self.events.push(Event::Voted { txn, hop, chain });
            }
            if self.settles {
                self.settled.push(Settled::Voted { txn, hop });
            }
            return;
        }
        // The last hop's vote is the commit.
        let record = &self.server.records[&txn];
        debug_assert!(record.ran.values().all(|s| s.precommitted), "a commit needs every vote");
        let (ts, outputs) = (record.ts, record.outputs.clone());
        let shards = record.hops.iter().map(|h| h.shard).collect();
        let decision =
            Decision { txn, ts, shards, outcome: Outcome::Committed { outputs: Vec::new() } };
        let client = Decision { outcome: Outcome::Committed { outputs }, ..decision.clone() };
        let freed = self.server.commit(txn);
        self.undelivered.insert(txn, Undelivered { decision, client, chain });
        self.decided(txn, true, answer);
        if answer {
            self.events.extend(freed.into_iter().map(|txn| Event::Freed { txn }));
        }
    }

    /// Aborts `txn` (a hop here has not voted) and, looping, every attempt that read its
    /// pending versions here (cascading); each becomes a decision of this shard to deliver.
    fn abort(&mut self, txn: TxnId, why: Why, answer: bool) {
        self.abort_all(VecDeque::from([(txn, why)]), None, answer)
    }

    /// Aborts the attempts in `work`, and (looping) every attempt that read their pending
    /// versions here; each becomes a decision of this shard to deliver. Hop `unran` of the
    /// first (not run here yet: an inquiry), when given, may abort it even if every hop that
    /// ran here voted.
    fn abort_all(&mut self, mut work: VecDeque<(TxnId, Why)>, unran: Option<u32>, answer: bool) {
        let first = work.front().map(|(txn, _)| *txn);
        while let Some((txn, why)) = work.pop_front() {
            let Some(record) = self.server.records.get(&txn) else { continue };
            debug_assert!(
                record.ran.values().any(|s| !s.precommitted)
                    || (Some(txn) == first && unran.is_some_and(|h| !record.ran.contains_key(&h))),
                "only a hop that has not voted may abort"
            );
            let ts = record.ts;
            let shards = record.hops.iter().map(|h| h.shard).collect();
            let decision = Decision { txn, ts, shards, outcome: Outcome::Aborted(why) };
            let readers = self.server.abort(txn, ts);
            self.cascade(readers, &mut work, answer);
            let client = decision.clone();
            self.undelivered.insert(txn, Undelivered { decision, client, chain: 0 });
            self.decided(txn, false, answer);
        }
    }

    /// Queues the `readers` of an aborted writer's pending versions to abort with it.
    fn cascade(&mut self, readers: Vec<TxnId>, work: &mut VecDeque<(TxnId, Why)>, answer: bool) {
        if answer {
            self.counts.cascading += readers.len() as u64;
        }
        work.extend(readers.into_iter().map(|r| (r, Why::conflict(AbortCause::Cascading))));
    }

    /// True when `from` may have made `decision`: for an attempt this server ran, a server
    /// of the last hop (a commit) or of any hop, or the coordinator (an abort); otherwise (an
    /// abort of an attempt this server never saw) its coordinator or a server of one of its
    /// shards.
    pub fn decided_by(&self, from: NodeId, decision: &Decision) -> bool {
        let topology = &self.context.topology;
        let txn = decision.txn;
        let aborted = matches!(decision.outcome, Outcome::Aborted(_));
        match self.server.records.get(&txn).map(|r| &r.hops) {
            Some(hops) => {
                let last = hops.last().is_some_and(|h| serves(topology, from, h.shard));
                last || (aborted
                    && (from == txn.origin || hops.iter().any(|h| serves(topology, from, h.shard))))
            }
            None => {
                let coordinator = topology.nodes.get(txn.origin.0 as usize);
                coordinator.is_some_and(|n| n.coordinator)
                    && (from == txn.origin
                        || decision.shards.iter().any(|&s| serves(topology, from, s)))
            }
        }
    }

    /// An inquiry from hop `hop - 2`, or for the last hop from hop `hop - 1` (see
    /// [`Command::Inquire`]); validated: `hop` is this shard's hop of `shards`.
    fn inquire(
        &mut self,
        from: NodeId,
        (txn, ts, shards): (TxnId, Timestamp, Vec<ShardId>),
        hop: u32,
        answer: bool,
    ) {
        let topology = &self.context.topology;
        if !topology.nodes.get(txn.origin.0 as usize).is_some_and(|n| n.coordinator) {
            self.refuse(answer); // Attempts come from coordinators.
            return;
        }
        // The hop two before, or (the last hop) the one before.
        let last = hop as usize == shards.len();
        let askers = [hop.checked_sub(2), hop.checked_sub(1).filter(|_| last)];
        let genuine = askers.into_iter().flatten().any(|asking| match asking {
            0 => from == txn.origin,
            asking => shards.get(asking as usize - 1).is_some_and(|&s| serves(topology, from, s)),
        });
        if !genuine {
            self.refuse(answer);
            return;
        }
        let why = Why::conflict(AbortCause::Timeout);
        if let Some(record) = self.server.records.get(&txn) {
            let same =
                record.ts == ts && record.hops.iter().map(|h| h.shard).eq(shards.iter().copied());
            if !same {
                self.refuse(answer);
                return;
            }
            if record.ran.get(&hop).is_some_and(|s| s.precommitted) {
                return; // It progressed past this hop: the decision lies beyond.
            }
            // Not voted, or never arrived here (though an earlier hop of the attempt did, and
            // voted): the hop before it cannot have voted without this hop's acknowledgement,
            // which would follow its run in this log. Aborted, a late copy is refused.
            if answer {
                self.counts.inquired += 1;
            }
            return self.abort_all(VecDeque::from([(txn, why)]), Some(hop), answer);
        }
        if self.server.ended(txn).is_some() || self.server.maybe_forgotten(txn, ts) || self.full() {
            return; // Decided here (its decision reaches the inquirer), or no room to decide.
        }
        // It never arrived here: abort it (a copy still on its way is refused) and deliver.
        self.server.abort(txn, ts);
        let decision = Decision { txn, ts, shards, outcome: Outcome::Aborted(why) };
        let client = decision.clone();
        self.undelivered.insert(txn, Undelivered { decision, client, chain: 0 });
        self.decided(txn, false, answer);
        if answer {
            self.counts.inquired += 1;
        }
    }

    fn decide(&mut self, from: NodeId, decision: Decision, answer: bool) {
        if !self.decided_by(from, &decision) {
            self.refuse(answer);
            return;
        }
        let txn = decision.txn;
        let known = self.server.records.contains_key(&txn);
        match &decision.outcome {
            Outcome::Committed { .. } => {
                if known {
                    debug_assert!(
                        self.server.records[&txn].ran.values().all(|s| s.precommitted),
                        "a commit needs every hop's vote"
                    );
                    let freed = self.server.commit(txn);
                    if answer {
                        self.events.extend(freed.into_iter().map(|txn| Event::Freed { txn }));
                    }
                }
            }
            Outcome::Aborted(_) => {
                let shard = self.server.shard;
                if known {
                    // Its readers here abort with it.
                    let readers = self.server.abort(txn, decision.ts);
                    let mut work = VecDeque::new();
                    self.cascade(readers, &mut work, answer);
                    self.abort_all(work, None, answer);
                } else if decision.shards.contains(&shard) && self.server.ended(txn).is_none() {
                    // Never arrived here: remember it, so a late copy is refused.
                    self.server.abort(txn, decision.ts);
                }
            }
        }
        if self.settles {
            self.settled.push(Settled::Applied { to: from, txn });
        } else if answer {
            self.events.push(Event::Applied { to: from, txn });
        }
    }
}

/// A snapshot image: the server's state and the undelivered decisions.
#[derive(Debug, Serialize, Deserialize)]
pub struct Image {
    server: ServerImage,
    undelivered: Vec<(TxnId, Undelivered)>,
}

impl StateMachine for ChainMachine {
    type Command = Command;
    type Msg = super::node::ChainMsg;
    type Read = ();
    type Image = Image;

    fn validate(&self, command: &Command) -> Result<(), String> {
        match command {
            // The static checks; the hop list is checked when applied (`check_run`: planning
            // the procedure once per hop, not twice).
            Command::Run { shipped, .. } => {
                let topology = &self.context.topology;
                let origin = shipped.txn.origin;
                if !topology.nodes.get(origin.0 as usize).is_some_and(|n| n.coordinator) {
                    return Err("attempts come from coordinators".into());
                }
                if shipped.home.0 >= topology.shards || shipped.hop == 0 {
                    return Err("no such home shard, or hop 0".into());
                }
                if shipped.outputs.len() > PIECES_MAX {
                    return Err(format!("{} outputs", shipped.outputs.len()));
                }
                Ok(())
            }
            Command::Vote { hop, .. } | Command::Abort { hop, .. } if *hop == 0 => {
                Err("hop 0 is the coordinator's".into())
            }
            Command::Decide { decision, .. }
                if decision.shards.len() > PIECES_MAX
                    || decision.shards.iter().any(|s| s.0 >= self.context.topology.shards) =>
            {
                Err(format!("a decision for shards {:?}", decision.shards))
            }
            Command::Decide { decision, .. } => match &decision.outcome {
                Outcome::Committed { outputs } if !outputs.is_empty() => {
                    Err("a hop's copy of a commit carries no outputs".into())
                }
                _ => Ok(()),
            },
            Command::Inquire { shards, hop, .. } => {
                let mine = hop.checked_sub(1).and_then(|h| shards.get(h as usize));
                let askable = *hop >= 2 || (*hop == 1 && shards.len() == 1);
                if !askable || shards.len() > PIECES_MAX || mine != Some(&self.server.shard) {
                    return Err(format!("an inquiry about hop {hop} is not for this shard"));
                }
                if shards.iter().any(|s| s.0 >= self.context.topology.shards) {
                    return Err(format!("an inquiry naming shards {shards:?}"));
                }
                Ok(())
            }
            Command::Delivered { txns } if txns.len() > DELIVERED_BATCH_MAX => {
                Err(format!("{} attempts delivered in one command", txns.len()))
            }
            _ => Ok(()),
        }
    }

    fn apply(&mut self, command: Command, answer: bool, _out: &mut Outbox<Self::Msg>) {
        match command {
            Command::Run { from, shipped } => self.run(from, *shipped, answer),
            Command::Vote { txn, hop, chain } => self.vote(txn, hop, chain, answer),
            Command::Abort { txn, hop } => {
                let waiting = self
                    .server
                    .records
                    .get(&txn)
                    .and_then(|r| r.ran.get(&hop))
                    .is_some_and(|s| !s.precommitted);
                if waiting {
                    let why = Why::conflict(AbortCause::Timeout);
                    self.abort(txn, why, answer);
                }
            }
            Command::Decide { from, decision } => self.decide(from, *decision, answer),
            Command::Delivered { txns } => {
                for txn in txns {
                    self.undelivered.remove(&txn);
                }
            }
            Command::Inquire { from, txn, ts, shards, hop } => {
                self.inquire(from, (txn, ts, shards), hop, answer)
            }
            Command::Collect { watermark } => self.server.collect_below(watermark),
        }
    }

    fn serve_read(&mut self, _read: (), _out: &mut Outbox<Self::Msg>) {}

    fn inherit(&mut self, old: Self) {
        self.counts = old.counts;
    }

    fn on_leadership(&mut self, leads: bool) {
        self.events.clear();
        if leads {
            self.events.push(Event::Leads);
        }
    }

    fn image(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct ImageRef<'a> {
            server: ServerImage,
            undelivered: Vec<(&'a TxnId, &'a Undelivered)>,
        }
        let image = ImageRef {
            server: self.server.image(),
            undelivered: self.undelivered.iter().collect(),
        };
        postcard::to_allocvec(&image).expect("images encode")
    }

    fn decode_image(&self, context: &NodeContext, bytes: &[u8]) -> Result<Image, String> {
        let image: Image = postcard::from_bytes(bytes)
            .map_err(|e| format!("snapshot image does not decode: {e}"))?;
        image.server.check(&context.limits)?;
        let undelivered_max = context.limits.deliveries_max + context.limits.lock_holders_max;
        if image.undelivered.len() > undelivered_max {
            return Err(format!(
                "snapshot holds {} undelivered decisions, over {undelivered_max}",
                image.undelivered.len()
            ));
        }
        Ok(image)
    }

    fn install(&mut self, image: Image) {
        self.server.install(image.server);
        self.undelivered = image.undelivered.into_iter().collect();
        self.events.clear();
        self.settled.clear();
    }
}
