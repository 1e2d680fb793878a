//! The state-machine contract (docs/architecture.md, "The node contract").
//!
//! Every protocol node is a deterministic state machine implementing [`Node`]. It never reads a
//! clock, draws OS randomness, sleeps, spawns, or touches a file or socket. Everything it needs
//! from the world is handed in; everything it wants done is appended to an [`Outbox`] as an
//! [`Effect`]. Two drivers run nodes: the simulator (`meridian-sim`, virtual time) and the runtime
//! (`meridian-runtime`, tokio). Both obey the rules below, so a node behaves the same under both.
//!
//! # What a driver does
//!
//! 1. **Construct** the node with its id, the [`crate::topology::Topology`], its configuration
//!    and a seeded [`crate::rng::Rng`] (the node's only source of randomness).
//! 2. Call [`Node::on_start`] once, before any other call.
//! 3. Call exactly one entry point at a time, never concurrently:
//!    - [`Node::on_message`] when a message from another node arrives. Per directed link,
//!      messages arrive in the order they were sent unless the link model or a fault says
//!      otherwise (loss, duplication and reordering are legal; protocols must tolerate them).
//!    - [`Node::on_timer`] when a timer set with [`Effect::SetTimer`] expires. Timers are never
//!      cancelled: a node ignores a timer whose purpose has passed. A timer fires at or after its
//!      deadline by the node's own clock, never before.
//!    - [`Node::on_persisted`] when the records of an [`Effect::Persist`] are durable to the degree
//!      it asked for. Completions arrive in the order the persists were issued.
//!    - [`Node::submit`] when a client hands this node a transaction. A node that cannot
//!      coordinate answers with a `Rejected` reply.
//!    - [`Node::on_session`] when a client takes a step of an interactive transaction
//!      (begin, reads, commit, abort). A protocol without interactive transactions answers
//!      `Rejected`.
//!
//!    `now` is always the node's own clock reading (true time plus the node's skew from the
//!    clock model). Readings passed to one node never decrease.
//! 4. **After every call, drain the outbox in order** and carry out each effect:
//!    - `Send`: deliver to `to` through the link model (delay, jitter, loss).
//!    - `SetTimer`: arrange one `on_timer(timer)` no earlier than `after_ns` from now.
//!    - `Persist`: write the records to the node's log store; call `on_persisted(token)` when
//!      done. A node that must not send something before its data is durable emits that send
//!      from `on_persisted`, not before.
//!    - `Reply`: hand the outcome to the client that submitted `request`.
//!    - `DependsOn`: the effects after it, up to the next such marker or the end of the
//!      call, carry its count of wide-area legs (see below); a driver that does not count
//!      them ignores it. A marker never outlives its call.
//!
//!    Drivers that count wide-area legs (docs/design.md, "Measurement") hand each
//!    call the count of the chain that triggered it ([`Outbox::begin_call`]) and stamp the
//!    call's effects with it. A node whose effect waits on state an earlier call left (a
//!    report that covers commits applied before) raises the count for that effect with
//!    [`Outbox::send_after`] or [`Outbox::reply_after`]. The count is a measurement: a node
//!    reads it with [`Outbox::chain`] only to pass it on, never to decide anything.
//! 5. **Crash** drops the node value and every effect not yet carried out; unsynced persisted
//!    records are lost. **Restart** constructs a fresh node and hands it what was durable.
//!
//! # What a node promises
//!
//! - Determinism: the same sequence of calls with the same arguments produces the same effects.
//!   Protocol state lives in ordered maps (or maps with a fixed hasher), never in collections whose
//!   iteration order depends on a per-process random seed.
//! - Boundedness: every queue it keeps has a named maximum; beyond it, it refuses work
//!   (`Rejected`) rather than growing.
//! - Input from other nodes or clients that makes no sense is dropped or answered with an error;
//!   it never panics the node. Assertions guard the node's own invariants only.

use crate::ids::{NodeId, RequestId};
use crate::key::Key;
use crate::time::Time;
pub use crate::txn::{parse_read_outputs, read_outputs};
use crate::txn::{ScanRange, TxnFailure, TxnOutcome, TxnRequest, Write};
use serde::{Deserialize, Serialize};
use std::fmt::Debug;

/// A node-chosen timer tag. Its meaning is private to the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TimerId(pub u64);

/// A node-chosen tag for one persist request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PersistToken(pub u64);

/// A record for the node's log store: put `value` under `key`, or delete `key` when `None`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersistRecord {
    /// Store key (e.g. `shard ‖ log index`, big-endian).
    pub key: Vec<u8>,
    /// New value, or `None` to delete.
    pub value: Option<Vec<u8>>,
}

/// How durable a persist must be before `on_persisted` is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Durability {
    /// Handed to the operating system; lost if the machine (not the process) crashes. The
    /// simulator treats it as lost on a node crash.
    Buffered,
    /// Synced to the device.
    Synced,
}

/// A client request as a coordinator receives it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientRequest {
    /// Unique per run; the reply names it.
    pub id: RequestId,
    /// What to run.
    pub txn: TxnRequest,
}

/// Names one interactive transaction at its coordinator. The client chooses it; it must be
/// unique among the coordinator's sessions (the client library draws it like a request id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SessionId(pub u64);

/// One step of an interactive transaction. Writes stay with the client (which answers its own
/// reads of them) until `Commit` carries them, so a step is a read round or the end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionOp {
    /// Start the transaction (the coordinator picks its attempt id and timestamp).
    Begin,
    /// Read these keys and scan these ranges, all in one round: the reads overlap.
    Read {
        /// Point reads.
        keys: Vec<Key>,
        /// Range scans (`start <= end`; rows merged over every shard, at most `limit`).
        scans: Vec<ScanRange>,
    },
    /// Commit with these writes (`None` deletes).
    Commit {
        /// The client's buffered writes, one per key.
        writes: Vec<Write>,
    },
    /// Abort: release whatever the transaction holds.
    Abort,
}

/// A step of interactive transaction `session`; the reply names `id`. A reply's result is
/// `Committed` when the step succeeded (for `Begin` and `Read` the transaction stays open),
/// and `Failed` otherwise: [`TxnFailure::Aborted`] when the protocol aborted the transaction
/// (it is over; the client may run it again), `Rejected` or `Procedure` when the step itself
/// was refused. A `Read`'s outputs are [`read_outputs`]'s shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRequest {
    /// Unique per run, like a client request's.
    pub id: RequestId,
    /// The transaction.
    pub session: SessionId,
    /// The step.
    pub op: SessionOp,
}

/// Something a node wants its driver to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect<M> {
    /// Send `msg` to node `to`.
    Send {
        /// Destination node.
        to: NodeId,
        /// The message.
        msg: M,
    },
    /// Call `on_timer(timer)` after `after_ns` of the node's clock.
    SetTimer {
        /// The tag handed back.
        timer: TimerId,
        /// Delay in nanoseconds.
        after_ns: u64,
    },
    /// Make `records` durable, then call `on_persisted(token)`.
    Persist {
        /// The tag handed back.
        token: PersistToken,
        /// What to write, in order.
        records: Vec<PersistRecord>,
        /// How durable.
        durability: Durability,
    },
    /// Answer a client.
    Reply {
        /// The request being answered.
        request: RequestId,
        /// Its outcome.
        outcome: TxnOutcome,
    },
    /// The effects after this one, up to the next marker or the end of the call, carry a
    /// causal chain of `hops` wide-area legs (the call's own again after a raised effect).
    /// Measurement only.
    DependsOn {
        /// Wide-area one-way legs.
        hops: u16,
    },
}

/// The effects of one call, in the order the node emitted them.
#[derive(Debug)]
pub struct Outbox<M> {
    effects: Vec<Effect<M>>,
    /// Wide-area legs on the causal chain of the call in progress, as the driver counts them.
    chain: u16,
}

impl<M> Default for Outbox<M> {
    fn default() -> Self {
        Self { effects: Vec::new(), chain: 0 }
    }
}

impl<M> Outbox<M> {
    /// An empty outbox.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues a message.
    pub fn send(&mut self, to: NodeId, msg: M) {
        self.effects.push(Effect::Send { to, msg });
    }

    /// Queues a timer.
    pub fn set_timer(&mut self, timer: TimerId, after_ns: u64) {
        self.effects.push(Effect::SetTimer { timer, after_ns });
    }

    /// Queues a persist request.
    pub fn persist(
        &mut self,
        token: PersistToken,
        records: Vec<PersistRecord>,
        durability: Durability,
    ) {
        self.effects.push(Effect::Persist { token, records, durability });
    }

    /// Queues a client reply.
    pub fn reply(&mut self, request: RequestId, outcome: TxnOutcome) {
        self.effects.push(Effect::Reply { request, outcome });
    }

    /// Driver: a call begins whose trigger came at the end of a causal chain of `hops`
    /// wide-area legs (0 where the driver does not count them).
    pub fn begin_call(&mut self, hops: u16) {
        self.chain = hops;
    }

    /// The wide-area legs on the causal chain of the call in progress. Measurement only: a
    /// node keeps it to pass on with [`Outbox::send_after`] or [`Outbox::reply_after`].
    pub fn chain(&self) -> u16 {
        self.chain
    }

    /// Queues a message that waits on a causal chain of `hops` legs as well as on this call.
    pub fn send_after(&mut self, to: NodeId, msg: M, hops: u16) {
        if hops <= self.chain {
            return self.send(to, msg);
        }
        self.depends_on(hops);
        self.send(to, msg);
        self.depends_on(self.chain);
    }

    /// Queues a client reply that waits on a causal chain of `hops` legs as well as on this
    /// call.
    pub fn reply_after(&mut self, request: RequestId, outcome: TxnOutcome, hops: u16) {
        if hops <= self.chain {
            return self.reply(request, outcome);
        }
        self.depends_on(hops);
        self.reply(request, outcome);
        self.depends_on(self.chain);
    }

    fn depends_on(&mut self, hops: u16) {
        // Consecutive markers: only the last one counts.
        if let Some(Effect::DependsOn { hops: last }) = self.effects.last_mut() {
            *last = hops;
        } else {
            self.effects.push(Effect::DependsOn { hops });
        }
    }

    /// Takes the queued effects in order, leaving the outbox empty (its buffer is kept).
    pub fn drain(&mut self) -> std::vec::Drain<'_, Effect<M>> {
        self.effects.drain(..)
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.effects.is_empty()
    }

    /// How many effects are queued.
    pub fn len(&self) -> usize {
        self.effects.len()
    }
}

/// The bound on protocol messages: cloneable (the simulator may duplicate them), printable for
/// traces, and serializable for TCP and for the trace hash.
pub trait Message: Clone + Debug + Serialize + for<'de> Deserialize<'de> + Send + 'static {}
impl<T> Message for T where T: Clone + Debug + Serialize + for<'de> Deserialize<'de> + Send + 'static
{}

/// A control service's word to a node, outside the protocol's messages (the simulator's
/// scenarios give it at a scheduled time; a service hosted in the nodes will give it there).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Control {
    /// A view manager's next view: the global view number, per shard its local view number
    /// (its leader is replica `local % replicas`), and whether leaders agree detectively.
    View {
        /// The global view number.
        global: u64,
        /// Per shard, its local view number.
        local: Vec<u64>,
        /// Detective agreement (else preventive).
        detective: bool,
    },
}

/// A protocol node. See the module documentation for the contract.
pub trait Node: Send + 'static {
    /// The protocol's message type.
    type Msg: Message;

    /// Called once before anything else.
    fn on_start(&mut self, now: Time, out: &mut Outbox<Self::Msg>);
    /// A message from `from` arrived.
    fn on_message(&mut self, now: Time, from: NodeId, msg: Self::Msg, out: &mut Outbox<Self::Msg>);
    /// A timer set earlier expired.
    fn on_timer(&mut self, now: Time, timer: TimerId, out: &mut Outbox<Self::Msg>);
    /// A persist request completed.
    fn on_persisted(&mut self, now: Time, token: PersistToken, out: &mut Outbox<Self::Msg>);
    /// Several persist requests completed, in this order (one group commit's worth). A node
    /// may override this to coalesce what the completions release; by default, one by one.
    fn on_persisted_batch(
        &mut self,
        now: Time,
        tokens: &[PersistToken],
        out: &mut Outbox<Self::Msg>,
    ) {
        for &token in tokens {
            self.on_persisted(now, token, out);
        }
    }
    /// A client submitted a transaction.
    fn submit(&mut self, now: Time, request: ClientRequest, out: &mut Outbox<Self::Msg>);
    /// A client took a step of an interactive transaction. By default: refused.
    fn on_session(&mut self, _now: Time, request: SessionRequest, out: &mut Outbox<Self::Msg>) {
        let why = "this protocol does not run interactive transactions (occ, 2pl and 2pc-mvto do)";
        out.reply(request.id, TxnOutcome::failed(TxnFailure::Rejected(why.into())));
    }
    /// A control service's word ([`Control`]). By default ignored: a protocol without
    /// views has nothing to take from it.
    fn on_control(&mut self, _now: Time, _control: Control, _out: &mut Outbox<Self::Msg>) {}
    /// The protocol's counters (names ending in `_total`, monotonic) and gauges, for metrics.
    /// Read between calls, never during one; must not change the node.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
    /// Where each replica hosted here stands in its shard's replication, for status pages
    /// (by default none: a protocol without replicated shards). Read between calls, never
    /// during one; must not change the node.
    fn groups(&self) -> Vec<GroupStatus> {
        Vec::new()
    }
}

/// One hosted replica's place in its shard's replication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupStatus {
    /// Its shard.
    pub shard: crate::ids::ShardId,
    /// It leads the shard.
    pub leader: bool,
    /// Entries of the shard's log it has applied (a follower trails its leader by the
    /// difference).
    pub applied_index: u64,
}

/// Supplies client requests to coordinators and consumes their replies. Both drivers use the same
/// implementation (a closed-loop client pool), so clients behave the same in simulation and in
/// real runs. Sans-IO like nodes: times are handed in.
pub trait ClientDriver {
    /// Requests to submit at the start: `(coordinator, request)`.
    fn start(&mut self, now: Time) -> Vec<(NodeId, ClientRequest)>;
    /// A reply arrived from coordinator `node`; returns requests to submit now.
    fn on_reply(
        &mut self,
        now: Time,
        node: NodeId,
        request: RequestId,
        outcome: &TxnOutcome,
    ) -> Vec<(NodeId, ClientRequest)>;
    /// The reply to `request` that comes next came at the end of a causal chain of `hops`
    /// wide-area one-way legs (drivers that count them call this just before `on_reply`).
    fn note_wan_hops(&mut self, _request: RequestId, _hops: u16) {}
    /// Coordinator `node` crashed: its outstanding requests will never be answered.
    fn on_crash(&mut self, node: NodeId);
    /// Coordinator `node` restarted; returns requests to submit now.
    fn on_restart(&mut self, now: Time, node: NodeId) -> Vec<(NodeId, ClientRequest)>;
    /// Submit nothing more; outstanding requests still complete.
    fn stop(&mut self);
    /// True when the clients submit no more and nothing is outstanding.
    fn finished(&self) -> bool;
    /// When (true time) the clients next want to submit on their own rather than in answer to
    /// a reply: an open-loop arrival. Drivers call [`ClientDriver::on_time`] then.
    fn next_arrival(&self) -> Option<Time> {
        None
    }
    /// True time reached `now`: the requests due by then.
    fn on_time(&mut self, _now: Time) -> Vec<(NodeId, ClientRequest)> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A raised chain covers only the effect it was asked for, and never lowers the call's.
    #[test]
    fn a_raised_chain_covers_its_effect_only() {
        let mut out: Outbox<u8> = Outbox::new();
        out.begin_call(3);
        out.send(NodeId(1), 1);
        out.send_after(NodeId(1), 2, 7);
        out.reply_after(RequestId(9), TxnOutcome::failed(TxnFailure::RetriesExhausted), 1);
        out.send(NodeId(1), 3);
        let mut hops = out.chain();
        let mut seen = Vec::new();
        for effect in out.drain() {
            match effect {
                Effect::DependsOn { hops: h } => hops = h,
                Effect::Send { msg, .. } => seen.push((u16::from(msg), hops)),
                Effect::Reply { .. } => seen.push((0, hops)),
                _ => unreachable!(),
            }
        }
        assert_eq!(seen, [(1, 3), (2, 7), (0, 3), (3, 3)]);
    }
}
