//! Hosting a replicated state machine on each shard's Raft group.
//!
//! A layered protocol keeps its per-shard logic in a [`StateMachine`] (occ's participant, a
//! 2PL lock manager, ...) and lets [`Hosts`] run it. For every shard a node hosts, `Hosts`
//! keeps the machine and, when shards are replicated or the driver is durable, the node's
//! member of the shard's replicated log. It:
//!
//! - **validates, then proposes** a command (or applies it at once when there is no log);
//!   every replica applies committed commands in log order, and only the leader answers, so a
//!   vote or an acknowledgement is durable on a quorum before anyone hears it. A command that
//!   fails validation is refused before it enters the log, and validated again when applied
//!   (a panic inside `apply` would repeat on every replica and every restart);
//! - **serves reads** on the leader once it is current (read-index under the leader's lease),
//!   queued per shard up to `reads_waiting_max`;
//! - **snapshots** every machine when its group asks, installs snapshots from a leader, and
//!   restores a restarted node from its snapshot and log before it serves anything;
//! - hands **leadership back** to replica 0 (where the topology places the leader) once it has
//!   caught up after a failover;
//! - **coalesces** the log messages of every group a node shares with another into one
//!   protocol message per destination per call ([`Hosts::flush`]);
//! - maps the driver's persist tokens to the groups' own.
//!
//! Commands replayed from a restarted node's own log are applied without answers (their
//! senders gave up or asked again).
//!
//! **Speculative hosting** ([`Hosts::restore_speculative`], for `mako` and `chain`): a
//! replicated shard's leader keeps a second machine, its *speculative* one, ahead of the
//! committed one. A command is proposed and, once the log has taken it, applied to the
//! speculative machine at once and answered from there; every replica (the leader's committed
//! twin included) applies it again, unanswered, once it commits. Reads are served from the
//! speculative machine without waiting. A new leader speculates only once it has applied every entry of earlier
//! terms (its term's first entry committed), so the speculative order is the log order. The
//! second machine exists from the start (bulk loads fill both, [`Hosts::machines_mut`]) and is
//! copied again (a full copy, as long as the state is big) only after a snapshot is installed
//! and when a leader loses its place, never when one takes it: a follower keeps it as a mirror
//! of its committed machine, applying every committed entry to both, so a new leader starts
//! speculating without a pause that would cost it its leadership (copying millions of keys
//! outlasts an election timeout). A leader that loses its place replaces its speculative
//! machine by a copy of its committed one, and with it whatever the log did not keep
//! ([`StateMachine::inherit`] carries its counters over). What the speculative answers
//! promise is the protocol's business (mako's watermarks; chain's last hop waiting for every
//! vote to be committed, [`Hosts::committed_mut`]); the host only keeps the two machines
//! apart.

use crate::{NodeContext, Replayed};
use meridian_core::node::{Durability, Outbox, PersistRecord, PersistToken};
use meridian_core::topology::Topology;
use meridian_core::{NodeId, ShardId};
use meridian_replication::raft::{RaftReplica, RaftTiming};
use meridian_replication::{Replica, ReplicaEffect, ReplicaMsg, Slot};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// The Raft messages of one group inside a protocol's coalesced message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RaftGroupMsgs {
    /// The shard (Raft group).
    pub shard: ShardId,
    /// The sender's slot in the group.
    pub from_slot: u32,
    /// The messages.
    pub msgs: Vec<ReplicaMsg>,
}

/// Most bytes of Raft messages in one coalesced message (unless one message alone is bigger):
/// well inside a wire frame, and above a snapshot chunk.
pub const RAFT_SEND_BYTES_MAX: usize = 4 << 20;
const _: () = assert!(RAFT_SEND_BYTES_MAX >= meridian_replication::raft::MSG_CHUNK_BYTES + 64);
const _: () = assert!(RAFT_SEND_BYTES_MAX < meridian_core::wire::FRAME_BYTES_MAX / 2);

/// Most persists of this node's groups outstanding at once (each group bounds its own; this
/// bounds the token table).
const PERSISTS_PENDING_MAX: usize = 1 << 20;

/// Per-shard protocol logic that a replicated log can run.
pub trait StateMachine {
    /// A state change, as the log carries it.
    type Command: Serialize + DeserializeOwned;
    /// The protocol's message type.
    type Msg;
    /// A read the leader serves from its state once current.
    type Read;
    /// A decoded snapshot image.
    type Image;

    /// Checks a command from its contents and the node's static configuration alone (the
    /// same answer on every replica, at any time). Called before proposing and again before
    /// applying.
    fn validate(&self, command: &Self::Command) -> Result<(), String>;
    /// Applies a valid command. `answer`: this replica leads and the command is not a replay,
    /// so it sends the replies. Must not panic on anything a valid command can carry.
    fn apply(&mut self, command: Self::Command, answer: bool, out: &mut Outbox<Self::Msg>);
    /// Serves a read on the leader.
    fn serve_read(&mut self, read: Self::Read, out: &mut Outbox<Self::Msg>);
    /// This replica started (`true`) or stopped leading: drop leader-only state.
    fn on_leadership(&mut self, _leads: bool) {}
    /// Speculative hosting: this fresh copy of the committed machine replaces `old`, the
    /// second machine; keep what is not replicated state (counters, which must not go back).
    fn inherit(&mut self, _old: Self)
    where
        Self: Sized,
    {
    }
    /// The replicated state, for a snapshot.
    fn image(&self) -> Vec<u8>;
    /// Decodes and checks an image; a bad one is an error, never a panic.
    /// (A method: what an image may hold can depend on how the machine was built.)
    fn decode_image(&self, context: &NodeContext, bytes: &[u8]) -> Result<Self::Image, String>;
    /// Replaces the replicated state by an image's.
    fn install(&mut self, image: Self::Image);
}

/// A member of a replicated log that [`Hosts`] can build.
pub trait HostedReplica: Replica + Sized {
    /// Member `slot` of `shard`'s group, rebuilt from what the node's disk holds.
    fn restore(
        context: &NodeContext,
        shard: ShardId,
        slot: Slot,
        durable: &BTreeMap<Vec<u8>, Vec<u8>>,
    ) -> Result<Self, String>;
}

impl HostedReplica for RaftReplica {
    fn restore(
        context: &NodeContext,
        shard: ShardId,
        slot: Slot,
        durable: &BTreeMap<Vec<u8>, Vec<u8>>,
    ) -> Result<Self, String> {
        // Election timeouts are drawn from the run's seed: random, yet reproducible.
        let mut timing = RaftTiming::standard(
            context.seed ^ (u64::from(context.id.0) << 48),
            context.timing.snapshot_interval_entries,
        );
        timing.snapshot_bytes_max = context.limits.snapshot_bytes_max;
        timing.snapshot_bytes_per_log_byte_max = context.timing.snapshot_bytes_per_log_byte_max;
        RaftReplica::restore(shard.0, slot, context.topology.replicas, timing, durable)
            .map_err(|e| e.0)
    }
}

/// Where a request for a shard should go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// This node leads the shard (or is its only replica): handle it here.
    Here,
    /// Forward to the leader this node knows.
    Forward(NodeId),
    /// Not hosted here, or no leader known: drop it (the sender's timeout resends).
    Drop,
}

struct Host<SM: StateMachine, R> {
    sm: SM,
    log: Option<R>,
    slot: Slot,
    /// The snapshot this replica restarted from, decoded when the node was built (so a bad
    /// one fails the start), installed when the group hands it over.
    restored_image: Option<(u64, SM::Image)>,
    /// Reads waiting for the leader's state to be current: the index each waits for (`None`
    /// until the leader has committed in its term) and the read. Oldest first.
    reads_waiting: VecDeque<(Option<u64>, SM::Read)>,
    /// Speculative hosting with a log: whether this host speculates at all.
    speculative: bool,
    /// The second machine of a speculating host: the leader's speculative one while
    /// `speculating`, otherwise a mirror of `sm` (`None` only before the node starts).
    spec: Option<SM>,
    /// This replica leads and answers from `spec`, ahead of `sm`.
    speculating: bool,
}

impl<SM: StateMachine, R: Replica> Host<SM, R> {
    fn leads(&self) -> bool {
        self.log.as_ref().is_none_or(|r| r.is_leader()) && (!self.speculative || self.speculating)
    }

    /// The machine requests are served from: a speculating leader's speculative one, else the
    /// committed one.
    fn active(&self) -> &SM {
        self.spec.as_ref().filter(|_| self.speculating).unwrap_or(&self.sm)
    }

    fn active_mut(&mut self) -> &mut SM {
        match self.spec.as_mut() {
            Some(spec) if self.speculating => spec,
            _ => &mut self.sm,
        }
    }

    /// The machine that is not active: a speculating leader's committed one, a follower's
    /// mirror.
    fn shadow_mut(&mut self) -> Option<&mut SM> {
        if self.speculating {
            Some(&mut self.sm)
        } else {
            self.spec.as_mut()
        }
    }

    /// A speculating host's leader starts speculating once every entry of earlier terms is
    /// applied (its term's first entry committed and applied): from a copy (`fork`) of the
    /// committed machine, so nothing it answers was decided against a state the log will not
    /// reach first.
    fn start_speculation(&mut self, fork: Option<fn(&SM) -> SM>) {
        let Some(fork) = fork.filter(|_| self.speculative && !self.speculating) else {
            return;
        };
        let Some(log) = self.log.as_ref().filter(|r| r.is_leader()) else { return };
        if log.read_index().is_some_and(|index| log.applied_index() >= index) {
            // The mirror has applied everything `sm` has: it is the copy.
            let spec = self.spec.get_or_insert_with(|| fork(&self.sm));
            spec.on_leadership(true);
            self.speculating = true;
        }
    }

    /// Makes the second machine a fresh copy of the committed one (node start, a snapshot
    /// installed, leadership lost).
    fn remirror(&mut self, fork: Option<fn(&SM) -> SM>) {
        if let Some(fork) = fork.filter(|_| self.speculative) {
            let mut copy = fork(&self.sm);
            if let Some(old) = self.spec.take() {
                copy.inherit(old);
            }
            self.spec = Some(copy);
            self.speculating = false;
        }
    }
}

/// The shard replicas one node hosts.
pub struct Hosts<SM: StateMachine, R = RaftReplica> {
    id: NodeId,
    context: NodeContext,
    topology: Arc<Topology>,
    hosts: BTreeMap<ShardId, Host<SM, R>>,
    /// Node persist token → (shard, the group's own token).
    persists: BTreeMap<u64, (ShardId, u64)>,
    persist_next: u64,
    /// True when the logs started empty (a first start, not a restart).
    fresh: bool,
    /// Log messages of this call, per destination, sent together by `flush`.
    outgoing: BTreeMap<NodeId, Vec<RaftGroupMsgs>>,
    wrap: fn(Vec<RaftGroupMsgs>) -> SM::Msg,
    reads_waiting_max: usize,
    /// Commands refused before proposing or skipped when applied, and reads dropped.
    refused_total: u64,
    skipped_total: u64,
    reads_dropped_total: u64,
    /// Speculative hosting: how a leader copies its committed machine.
    fork: Option<fn(&SM) -> SM>,
}

impl<SM: StateMachine, R: HostedReplica> Hosts<SM, R> {
    /// The replicas `context`'s node hosts, rebuilt from what its disk holds (`durable`):
    /// each machine from `make`, each log member from its records. A shard has a log when
    /// it is replicated or the driver is durable; otherwise its machine lives in memory
    /// alone. `wrap` turns a batch of log messages into the protocol's message.
    pub fn restore(
        context: &NodeContext,
        durable: &BTreeMap<Vec<u8>, Vec<u8>>,
        wrap: fn(Vec<RaftGroupMsgs>) -> SM::Msg,
        make: impl FnMut(ShardId) -> SM,
    ) -> Result<Self, String> {
        Self::restore_with(context, durable, wrap, make, None)
    }

    fn restore_with(
        context: &NodeContext,
        durable: &BTreeMap<Vec<u8>, Vec<u8>>,
        wrap: fn(Vec<RaftGroupMsgs>) -> SM::Msg,
        mut make: impl FnMut(ShardId) -> SM,
        fork: Option<fn(&SM) -> SM>,
    ) -> Result<Self, String> {
        let topology = context.topology.clone();
        let info = &topology.nodes[context.id.0 as usize];
        let mut hosts = BTreeMap::new();
        for slot in &info.replicas {
            let log = if topology.replicas > 1 || context.durable {
                Some(
                    R::restore(context, slot.shard, slot.replica, durable)
                        .map_err(|e| format!("node {}: {e}", context.id))?,
                )
            } else {
                None
            };
            let sm = make(slot.shard);
            let restored_image = match log.as_ref().and_then(|r| r.restored_snapshot()) {
                Some((index, data)) => {
                    let image = sm.decode_image(context, data).map_err(|e| {
                        format!(
                            "node {}: shard {} snapshot at {index}: {e}",
                            context.id, slot.shard
                        )
                    })?;
                    Some((index, image))
                }
                None => None,
            };
            let speculative = fork.is_some() && log.is_some();
            // The second machine starts as a copy of the empty one, so that bulk loads fill
            // both (`machines_mut`) and the node starts without copying what was loaded.
            let spec = fork.filter(|_| speculative).map(|fork| fork(&sm));
            let host = Host {
                sm,
                speculative,
                log,
                slot: slot.replica,
                restored_image,
                reads_waiting: VecDeque::new(),
                spec,
                speculating: false,
            };
            hosts.insert(slot.shard, host);
        }
        Ok(Self {
            id: context.id,
            context: context.clone(),
            topology,
            hosts,
            persists: BTreeMap::new(),
            persist_next: 0,
            fresh: durable.is_empty(),
            outgoing: BTreeMap::new(),
            wrap,
            reads_waiting_max: context.limits.reads_waiting_max,
            refused_total: 0,
            skipped_total: 0,
            reads_dropped_total: 0,
            fork,
        })
    }

    /// Numbers its persist tokens from `first` on, so that a node persisting for itself as
    /// well (tiga's journal beside its view manager's log) can tell the two apart.
    pub fn with_persist_tokens_from(mut self, first: u64) -> Self {
        debug_assert!(self.persists.is_empty(), "before the first persist");
        self.persist_next = first;
        self
    }

    /// [`Hosts::restore`] with speculative hosting (see the module comment): every replicated
    /// shard's leader answers from a speculative machine ahead of its log, which starts as
    /// `fork` of its committed machine (a copy of the replicated state).
    pub fn restore_speculative(
        context: &NodeContext,
        durable: &BTreeMap<Vec<u8>, Vec<u8>>,
        wrap: fn(Vec<RaftGroupMsgs>) -> SM::Msg,
        make: impl FnMut(ShardId) -> SM,
        fork: fn(&SM) -> SM,
    ) -> Result<Self, String> {
        Self::restore_with(context, durable, wrap, make, Some(fork))
    }
}

impl<SM: StateMachine, R: Replica> Hosts<SM, R> {
    /// True when this node hosts no shard.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// True when some hosted shard has a log (the node must tick it).
    pub fn has_logs(&self) -> bool {
        self.hosts.values().any(|h| h.log.is_some())
    }

    /// The shards hosted here.
    pub fn shards(&self) -> Vec<ShardId> {
        self.hosts.keys().copied().collect()
    }

    /// True when `shard` is hosted here with a log (its commands apply once committed, not
    /// when submitted).
    pub fn has_log(&self, shard: ShardId) -> bool {
        self.hosts.get(&shard).is_some_and(|h| h.log.is_some())
    }

    /// `shard`'s machine (a speculating leader's speculative one).
    pub fn get(&self, shard: ShardId) -> Option<&SM> {
        self.hosts.get(&shard).map(|h| h.active())
    }

    /// `shard`'s machine, writable (bulk loads, leader-only bookkeeping).
    pub fn get_mut(&mut self, shard: ShardId) -> Option<&mut SM> {
        self.hosts.get_mut(&shard).map(|h| h.active_mut())
    }

    /// Every hosted machine (speculating leaders': the speculative one) with whether this
    /// replica leads its shard.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (ShardId, &mut SM, bool)> {
        self.hosts.iter_mut().map(|(&shard, h)| {
            let leads = h.leads();
            (shard, h.active_mut(), leads)
        })
    }

    /// Every hosted machine (speculating leaders': the speculative one).
    pub fn iter(&self) -> impl Iterator<Item = (ShardId, &SM)> {
        self.hosts.iter().map(|(&shard, h)| (shard, h.active()))
    }

    /// Every machine, the second ones of speculating hosts included (bulk loads fill them
    /// all before the node starts).
    pub fn machines_mut(&mut self) -> impl Iterator<Item = (ShardId, &mut SM)> {
        self.hosts.iter_mut().flat_map(|(&shard, h)| {
            std::iter::once(&mut h.sm).chain(h.spec.as_mut()).map(move |sm| (shard, sm))
        })
    }

    /// Every machine, the second ones of speculating hosts included.
    pub fn machines(&self) -> impl Iterator<Item = (ShardId, &SM)> {
        self.hosts.iter().flat_map(|(&shard, h)| {
            std::iter::once(&h.sm).chain(h.spec.as_ref()).map(move |sm| (shard, sm))
        })
    }

    /// The second machines of speculating hosts that [`Hosts::iter_mut`] does not show
    /// (speculating leaders' committed ones, followers' mirrors), for housekeeping every copy
    /// needs (history collection).
    pub fn shadowed_mut(&mut self) -> impl Iterator<Item = (ShardId, &mut SM)> {
        self.hosts.iter_mut().filter_map(|(&shard, h)| h.shadow_mut().map(|sm| (shard, sm)))
    }

    /// `shard`'s committed machine: the one its log has applied (the same as [`Hosts::get`]
    /// except on a speculating leader).
    pub fn committed(&self, shard: ShardId) -> Option<&SM> {
        self.hosts.get(&shard).map(|h| &h.sm)
    }

    /// Every committed machine with whether this replica leads its shard, and the second
    /// machines of speculating hosts (speculating leaders' speculative ones, followers'
    /// mirrors) after them, marked `None`: for protocols that act on what their logs have
    /// committed and must drain every copy.
    pub fn committed_mut(&mut self) -> impl Iterator<Item = (ShardId, &mut SM, Option<bool>)> {
        self.hosts.iter_mut().flat_map(|(&shard, h)| {
            let leads = h.leads();
            std::iter::once((shard, &mut h.sm, Some(leads)))
                .chain(h.spec.as_mut().map(|spec| (shard, spec, None)))
        })
    }

    /// True when this replica acts for `shard`: its only replica, or the leader.
    pub fn leads(&self, shard: ShardId) -> bool {
        self.hosts.get(&shard).is_some_and(|h| h.leads())
    }

    /// Where a request for `shard` should go from here.
    pub fn route(&self, shard: ShardId) -> Route {
        let Some(host) = self.hosts.get(&shard) else { return Route::Drop };
        if host.leads() {
            return Route::Here;
        }
        let leader = host.log.as_ref().and_then(|r| r.leader());
        match leader.and_then(|slot| self.topology.replica_node(shard, slot)) {
            Some(node) if node != self.id => Route::Forward(node),
            _ => Route::Drop,
        }
    }

    /// At node start: a restarted replica installs its snapshot and replays its committed
    /// log before it serves anything; on a first start (or alone in its group) replica 0
    /// campaigns at once instead of waiting out an election timeout.
    pub fn on_start(&mut self, out: &mut Outbox<SM::Msg>) {
        for shard in self.shards() {
            let mut effects = Vec::new();
            if let Some(log) = self.hosts.get_mut(&shard).and_then(|h| h.log.as_mut()) {
                log.poll(&mut effects);
            }
            self.carry_out(shard, effects, out);
        }
        if self.fresh || self.topology.replicas == 1 {
            let leads: Vec<ShardId> =
                self.hosts.iter().filter(|(_, h)| h.slot == 0).map(|(&s, _)| s).collect();
            for shard in leads {
                let mut effects = Vec::new();
                if let Some(log) = self.hosts.get_mut(&shard).and_then(|h| h.log.as_mut()) {
                    log.campaign(&mut effects);
                }
                self.carry_out(shard, effects, out);
            }
        }
    }

    /// One log tick for every group; a leader that is not replica 0 hands leadership back
    /// once replica 0 has caught up.
    pub fn tick(&mut self, out: &mut Outbox<SM::Msg>) {
        for shard in self.shards() {
            let mut effects = Vec::new();
            let Some(log) = self.hosts.get_mut(&shard).and_then(|h| h.log.as_mut()) else {
                continue;
            };
            log.tick(&mut effects);
            if log.leader() != Some(0) && log.is_caught_up(0) {
                log.transfer_leader(0, &mut effects);
            }
            self.carry_out(shard, effects, out);
        }
    }

    /// Log messages from node `from`. Groups the sender does not hold the claimed slot of are
    /// dropped.
    pub fn on_raft(&mut self, from: NodeId, groups: Vec<RaftGroupMsgs>, out: &mut Outbox<SM::Msg>) {
        for RaftGroupMsgs { shard, from_slot, msgs } in groups {
            if self.topology.replica_node(shard, from_slot) != Some(from) {
                continue;
            }
            let Some(log) = self.hosts.get_mut(&shard).and_then(|h| h.log.as_mut()) else {
                continue;
            };
            let mut effects = Vec::new();
            log.on_message(from_slot, msgs, &mut effects);
            self.carry_out(shard, effects, out);
        }
    }

    /// A persist of one of the groups completed.
    pub fn on_persisted(&mut self, token: PersistToken, out: &mut Outbox<SM::Msg>) {
        let Some((shard, group_token)) = self.persists.remove(&token.0) else { return };
        let mut effects = Vec::new();
        if let Some(log) = self.hosts.get_mut(&shard).and_then(|h| h.log.as_mut()) {
            log.on_persisted(group_token, &mut effects);
        }
        self.carry_out(shard, effects, out);
    }

    /// Validates `command` and applies it to `shard` at once (no log) or proposes it (it is
    /// applied, and answered, once committed; a speculating leader applies and answers it on
    /// its speculative machine once the log has taken it). An invalid command is refused with
    /// the reason; a proposal the log drops (no longer leader, a transfer in progress, a
    /// leader not speculating yet) is left to the sender's timeout.
    pub fn submit(
        &mut self,
        shard: ShardId,
        command: SM::Command,
        out: &mut Outbox<SM::Msg>,
    ) -> Result<(), String> {
        let Some(host) = self.hosts.get_mut(&shard) else {
            return Err(format!("shard {shard} is not hosted here"));
        };
        if let Err(why) = host.sm.validate(&command) {
            self.refused_total += 1;
            return Err(why);
        }
        let Some(log) = host.log.as_mut() else {
            host.sm.apply(command, true, out);
            return Ok(());
        };
        if host.speculative && !host.speculating {
            return Ok(());
        }
        let bytes = postcard::to_allocvec(&command).expect("commands encode");
        let mut effects = Vec::new();
        let taken = log.propose(bytes, &mut effects).is_ok();
        if let Some(spec) = host.spec.as_mut().filter(|_| taken && host.speculating) {
            // Applied speculatively only once the log has it, so the speculative order is
            // the log's.
            spec.apply(command, true, out);
        }
        self.carry_out(shard, effects, out);
        Ok(())
    }

    /// Queues a read for `shard`'s leader; it is served once the leader's state is current.
    /// Beyond `reads_waiting_max` waiting, it is dropped (the sender's timeout resends).
    pub fn read(&mut self, shard: ShardId, read: SM::Read, out: &mut Outbox<SM::Msg>) {
        let Some(host) = self.hosts.get_mut(&shard) else { return };
        if host.reads_waiting.len() >= self.reads_waiting_max {
            self.reads_dropped_total += 1;
            return;
        }
        let read_index = host.log.as_ref().and_then(|r| r.read_index());
        host.reads_waiting.push_back((read_index, read));
        Self::serve_reads(host, out);
    }

    /// Serves the waiting reads whose index the replica has applied, in order (a speculating
    /// leader: at once, from its speculative machine). A replica that stopped leading drops
    /// them.
    fn serve_reads(host: &mut Host<SM, R>, out: &mut Outbox<SM::Msg>) {
        if host.speculative {
            let Some(spec) = host.spec.as_mut().filter(|_| host.speculating) else {
                host.reads_waiting.clear();
                return;
            };
            for (_, read) in host.reads_waiting.drain(..) {
                spec.serve_read(read, out);
            }
            return;
        }
        while let Some((waiting_for, _)) = host.reads_waiting.front_mut() {
            if let Some(log) = host.log.as_ref() {
                if !log.is_leader() {
                    host.reads_waiting.clear();
                    return;
                }
                if waiting_for.is_none() {
                    *waiting_for = log.read_index();
                }
                match *waiting_for {
                    Some(index) if log.applied_index() >= index => {}
                    _ => return,
                }
            }
            let Some((_, read)) = host.reads_waiting.pop_front() else { return };
            host.sm.serve_read(read, out);
        }
    }

    /// Sends the log messages this call produced: one message per destination, or several
    /// of at most [`RAFT_SEND_BYTES_MAX`] each when they are big (snapshot chunks), so that
    /// each fits a wire frame.
    pub fn flush(&mut self, out: &mut Outbox<SM::Msg>) {
        if self.outgoing.is_empty() {
            return;
        }
        for (node, groups) in std::mem::take(&mut self.outgoing) {
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
                        out.send(node, (self.wrap)(std::mem::take(&mut batch)));
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
                out.send(node, (self.wrap)(batch));
            }
        }
    }

    /// Installs the snapshots and applies every command the restored logs hold as committed,
    /// answering nobody: the state a restarted node reaches before it talks to anyone.
    pub fn replay_committed(&mut self) -> Replayed {
        let mut out = Outbox::new();
        let mut replayed = Replayed::default();
        for shard in self.shards() {
            let mut effects = Vec::new();
            if let Some(log) = self.hosts.get_mut(&shard).and_then(|h| h.log.as_mut()) {
                log.poll(&mut effects);
                replayed.log_index += log.applied_index();
            }
            for effect in &effects {
                match effect {
                    ReplicaEffect::Apply { .. } => replayed.commands += 1,
                    ReplicaEffect::Restore { .. } => replayed.snapshots += 1,
                    _ => {}
                }
            }
            self.carry_out(shard, effects, &mut out);
        }
        self.outgoing.clear();
        replayed
    }

    /// Each hosted replica's place in its shard's log (shards without a log left out).
    pub fn groups(&self) -> Vec<meridian_core::node::GroupStatus> {
        let logged =
            self.hosts.iter().filter_map(|(&shard, host)| Some((shard, host.log.as_ref()?)));
        logged
            .map(|(shard, log)| meridian_core::node::GroupStatus {
                shard,
                leader: log.is_leader(),
                applied_index: log.applied_index(),
            })
            .collect()
    }

    /// The hosting counters, summed over the shards (names shared by every protocol).
    pub fn counters(&self, into: &mut BTreeMap<&'static str, u64>) {
        for host in self.hosts.values() {
            if let Some(log) = &host.log {
                *into.entry("raft_groups_led").or_default() += u64::from(log.is_leader());
                *into.entry("raft_log_entries").or_default() += log.log_entries();
                let snapshots = log.snapshot_counts();
                *into.entry("raft_snapshots_taken_total").or_default() += snapshots.taken;
                *into.entry("raft_snapshots_received_total").or_default() += snapshots.received;
                *into.entry("raft_snapshots_restored_total").or_default() += snapshots.restored;
                *into.entry("raft_snapshots_refused_total").or_default() += snapshots.refused;
            }
            *into.entry("host_reads_waiting").or_default() += host.reads_waiting.len() as u64;
        }
        into.insert("host_commands_refused_total", self.refused_total);
        into.insert("host_commands_skipped_total", self.skipped_total);
        into.insert("host_reads_dropped_total", self.reads_dropped_total);
    }

    /// Carries out what `shard`'s log member asked for.
    fn carry_out(
        &mut self,
        shard: ShardId,
        effects: Vec<ReplicaEffect>,
        out: &mut Outbox<SM::Msg>,
    ) {
        for effect in effects {
            match effect {
                ReplicaEffect::Send { to, msgs } => {
                    let Some(host) = self.hosts.get(&shard) else { continue };
                    if let Some(node) = self.topology.replica_node(shard, to) {
                        let group = RaftGroupMsgs { shard, from_slot: host.slot, msgs };
                        self.outgoing.entry(node).or_default().push(group);
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
                        .map(|(key, value)| PersistRecord { key, value })
                        .collect();
                    let durability = if sync { Durability::Synced } else { Durability::Buffered };
                    out.persist(PersistToken(node_token), records, durability);
                }
                ReplicaEffect::Apply { index, command: bytes } => {
                    let Some(host) = self.hosts.get_mut(&shard) else { continue };
                    // Entries come from our own group, validated by its leader; one that does
                    // not decode or validate (a leader of another version) is skipped
                    // identically on every replica.
                    let Ok(command) = postcard::from_bytes::<SM::Command>(&bytes) else {
                        self.skipped_total += 1;
                        continue;
                    };
                    if host.sm.validate(&command).is_err() {
                        self.skipped_total += 1;
                        continue;
                    }
                    let replayed =
                        host.log.as_ref().is_some_and(|r| index <= r.restored_last_index());
                    // A speculating leader answered it from its speculative machine; a
                    // leader not speculating yet applies earlier terms' entries unanswered.
                    let answer = host.leads() && !host.speculative && !replayed;
                    if !host.speculating {
                        if let Some(mirror) = host.spec.as_mut() {
                            // Decoded once already: the same bytes decode the same way.
                            if let Ok(again) = postcard::from_bytes::<SM::Command>(&bytes) {
                                mirror.apply(again, false, out);
                            }
                        }
                    }
                    host.sm.apply(command, answer, out);
                }
                ReplicaEffect::Restore { index, data } => {
                    let Some(host) = self.hosts.get_mut(&shard) else { continue };
                    let image = match host.restored_image.take() {
                        Some((at, image)) if at == index => image,
                        // From the leader: it passed the sender check and the group's own
                        // checks, so an image that does not decode is a bug, not input.
                        _ => host.sm.decode_image(&self.context, &data).unwrap_or_else(|e| {
                            panic!("shard {shard}: snapshot at {index} from the leader: {e}")
                        }),
                    };
                    // Only followers and restarting replicas install snapshots.
                    host.sm.install(image);
                    if host.spec.is_some() {
                        host.remirror(self.fork);
                    }
                }
                ReplicaEffect::Leadership(leads) => {
                    if let Some(host) = self.hosts.get_mut(&shard) {
                        if !leads {
                            host.reads_waiting.clear();
                            // What the log did not keep goes with the speculative machine.
                            if host.speculating {
                                host.remirror(self.fork);
                            }
                        }
                        if !host.speculative || !leads {
                            host.sm.on_leadership(leads);
                        }
                    }
                }
            }
        }
        self.snapshot_if_due(shard, out);
        if let Some(host) = self.hosts.get_mut(&shard) {
            host.start_speculation(self.fork);
            if !host.reads_waiting.is_empty() {
                // A new leader's reads wait for its term's first commit, which applies no
                // command: so look after every pass, not only after applies.
                Self::serve_reads(host, out);
            }
        }
    }

    /// Snapshots `shard`'s machine once its group has applied enough since the last one.
    fn snapshot_if_due(&mut self, shard: ShardId, out: &mut Outbox<SM::Msg>) {
        let Some(host) = self.hosts.get_mut(&shard) else { return };
        let Some(log) = host.log.as_mut().filter(|r| r.snapshot_due()) else { return };
        let mut effects = Vec::new();
        log.take_snapshot(host.sm.image(), &mut effects);
        debug_assert!(effects.iter().all(|e| matches!(e, ReplicaEffect::Persist { .. })));
        self.carry_out(shard, effects, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Timing;
    use meridian_core::node::Effect;
    use meridian_core::time::NS_PER_MS;
    use meridian_core::txn::{PartitionRule, Partitioner, Registry};
    use std::collections::BTreeSet;

    /// A machine that records the commands it applied, in order.
    #[derive(Clone, Default)]
    struct Tally {
        applied: Vec<u64>,
    }

    #[derive(Debug)]
    enum TallyMsg {
        Raft(Vec<RaftGroupMsgs>),
        Ack(u64),
        Seen(Vec<u64>),
    }

    /// Where answers go.
    const CLIENT: NodeId = NodeId(1_000);

    impl StateMachine for Tally {
        type Command = u64;
        type Msg = TallyMsg;
        type Read = ();
        type Image = Vec<u64>;

        fn validate(&self, command: &u64) -> Result<(), String> {
            if *command == u64::MAX {
                Err("too big".into())
            } else {
                Ok(())
            }
        }

        fn apply(&mut self, command: u64, answer: bool, out: &mut Outbox<TallyMsg>) {
            self.applied.push(command);
            if answer {
                out.send(CLIENT, TallyMsg::Ack(command));
            }
        }

        fn serve_read(&mut self, _read: (), out: &mut Outbox<TallyMsg>) {
            out.send(CLIENT, TallyMsg::Seen(self.applied.clone()));
        }

        fn image(&self) -> Vec<u8> {
            postcard::to_allocvec(&self.applied).expect("encodes")
        }

        fn decode_image(&self, _context: &NodeContext, bytes: &[u8]) -> Result<Vec<u64>, String> {
            postcard::from_bytes(bytes).map_err(|e| e.to_string())
        }

        fn install(&mut self, image: Vec<u64>) {
            self.applied = image;
        }
    }

    const SHARD: ShardId = ShardId(0);

    /// One shard's three replicas, speculating, with a network that can isolate nodes.
    struct Cluster {
        hosts: BTreeMap<NodeId, Hosts<Tally>>,
        raft: VecDeque<(NodeId, NodeId, Vec<RaftGroupMsgs>)>,
        persists: VecDeque<(NodeId, PersistToken)>,
        isolated: BTreeSet<NodeId>,
        acks: Vec<u64>,
        seen: Vec<Vec<u64>>,
    }

    impl Cluster {
        fn new() -> Self {
            let topology = Arc::new(Topology::standard(vec!["r0".into()], 1, 3).unwrap());
            let partitioner =
                Partitioner::new(1, PartitionRule::LeadingInt { base: 0, per_shard: 10 }).unwrap();
            let mut hosts = BTreeMap::new();
            for node in topology.shard_nodes(SHARD) {
                let context = NodeContext::new(
                    node,
                    topology.clone(),
                    Arc::new(Registry::default()),
                    Arc::new(partitioner.clone()),
                    7,
                    Timing::for_network(NS_PER_MS),
                );
                let made = Hosts::restore_speculative(
                    &context,
                    &BTreeMap::new(),
                    TallyMsg::Raft,
                    |_| Tally::default(),
                    Tally::clone,
                );
                hosts.insert(node, made.unwrap());
            }
            let mut cluster = Self {
                hosts,
                raft: VecDeque::new(),
                persists: VecDeque::new(),
                isolated: BTreeSet::new(),
                acks: Vec::new(),
                seen: Vec::new(),
            };
            let nodes: Vec<NodeId> = cluster.hosts.keys().copied().collect();
            for node in nodes {
                cluster.call(node, |h, out| h.on_start(out));
            }
            cluster
        }

        /// Calls `f` on `node`'s hosts and collects what it produced.
        fn call(&mut self, node: NodeId, f: impl FnOnce(&mut Hosts<Tally>, &mut Outbox<TallyMsg>)) {
            let mut out = Outbox::new();
            let hosts = self.hosts.get_mut(&node).unwrap();
            f(hosts, &mut out);
            hosts.flush(&mut out);
            for effect in out.drain() {
                match effect {
                    Effect::Send { to, msg: TallyMsg::Raft(groups) } => {
                        self.raft.push_back((node, to, groups))
                    }
                    Effect::Send { msg: TallyMsg::Ack(c), .. } => self.acks.push(c),
                    Effect::Send { msg: TallyMsg::Seen(s), .. } => self.seen.push(s),
                    Effect::Persist { token, .. } => self.persists.push_back((node, token)),
                    Effect::SetTimer { .. } | Effect::Reply { .. } | Effect::DependsOn { .. } => {}
                }
            }
        }

        /// Delivers what is queued (messages across an isolation are lost) until quiet.
        fn settle(&mut self) {
            for _ in 0..100_000 {
                if let Some((node, token)) = self.persists.pop_front() {
                    self.call(node, |h, out| h.on_persisted(token, out));
                } else if let Some((from, to, groups)) = self.raft.pop_front() {
                    let cut = self.isolated.contains(&from) != self.isolated.contains(&to);
                    if !cut {
                        self.call(to, |h, out| h.on_raft(from, groups, out));
                    }
                } else {
                    return;
                }
            }
            panic!("the cluster did not settle");
        }

        /// `ticks` log ticks on every node, settling after each.
        fn tick(&mut self, ticks: usize) {
            for _ in 0..ticks {
                let nodes: Vec<NodeId> = self.hosts.keys().copied().collect();
                for node in nodes {
                    self.call(node, |h, out| h.tick(out));
                }
                self.settle();
            }
        }

        /// Ticks until a node among `among` leads (speculating); returns it.
        fn leader_among(&mut self, among: &[NodeId]) -> NodeId {
            for _ in 0..2_000 {
                if let Some(&node) = among.iter().find(|n| self.hosts[n].leads(SHARD)) {
                    return node;
                }
                self.tick(1);
            }
            panic!("no leader among {among:?}");
        }

        fn speculative(&self, node: NodeId) -> Vec<u64> {
            self.hosts[&node].get(SHARD).unwrap().applied.clone()
        }

        fn committed(&self, node: NodeId) -> Vec<u64> {
            self.hosts[&node].committed(SHARD).unwrap().applied.clone()
        }
    }

    /// A speculating leader answers a command and serves reads from it as soon as its log
    /// takes it, with its followers cut off; the committed machines (its own twin included)
    /// apply it only once it commits, and nobody answers it twice.
    #[test]
    fn a_speculating_leader_answers_before_its_log_commits() {
        let mut cluster = Cluster::new();
        let nodes: Vec<NodeId> = cluster.hosts.keys().copied().collect();
        let leader = cluster.leader_among(&nodes);
        cluster.isolated.insert(leader);
        for command in 1..=3 {
            cluster.call(leader, |h, out| h.submit(SHARD, command, out).unwrap());
        }
        cluster.call(leader, |h, out| h.read(SHARD, (), out));
        cluster.settle();
        assert_eq!(cluster.acks, vec![1, 2, 3]);
        assert_eq!(cluster.seen, vec![vec![1, 2, 3]]);
        assert_eq!(cluster.speculative(leader), vec![1, 2, 3]);
        assert!(cluster.committed(leader).is_empty());
        for &node in nodes.iter().filter(|&&n| n != leader) {
            assert!(cluster.committed(node).is_empty(), "node {node} applied uncommitted entries");
        }
        // An invalid command is refused before the log and the machines see it.
        let mut refused = None;
        cluster.call(leader, |h, out| refused = h.submit(SHARD, u64::MAX, out).err());
        assert!(refused.is_some());
        cluster.isolated.clear();
        cluster.tick(5);
        assert!(cluster.hosts[&leader].leads(SHARD), "the leader kept its place");
        for &node in &nodes {
            assert_eq!(cluster.committed(node), vec![1, 2, 3], "node {node}");
        }
        assert_eq!(cluster.speculative(leader), vec![1, 2, 3]);
        assert_eq!(cluster.acks, vec![1, 2, 3], "answered once, speculatively");
        // Followers keep their second machine as a mirror, ready for a leadership without a
        // copy.
        for &node in nodes.iter().filter(|&&n| n != leader) {
            let hosts = cluster.hosts.get_mut(&node).unwrap();
            let mirrors: Vec<Vec<u64>> =
                hosts.shadowed_mut().map(|(_, m)| m.applied.clone()).collect();
            assert_eq!(mirrors, vec![vec![1, 2, 3]], "node {node}");
        }
    }

    /// A leader cut off from its group keeps speculating, but its speculative commands die
    /// with its leadership: the new leader starts from the committed state (everything the
    /// old one committed, nothing it did not), and the old one, rejoining as a follower,
    /// drops its speculative machine and ends with the group's log.
    #[test]
    fn a_deposed_leader_drops_what_its_log_did_not_keep() {
        let mut cluster = Cluster::new();
        let nodes: Vec<NodeId> = cluster.hosts.keys().copied().collect();
        let old = cluster.leader_among(&nodes);
        cluster.call(old, |h, out| h.submit(SHARD, 1, out).unwrap());
        cluster.tick(3);
        assert!(nodes.iter().all(|&n| cluster.committed(n) == vec![1]));
        cluster.isolated.insert(old);
        cluster.call(old, |h, out| h.submit(SHARD, 2, out).unwrap());
        cluster.settle();
        assert_eq!(cluster.speculative(old), vec![1, 2]);
        let others: Vec<NodeId> = nodes.iter().copied().filter(|&n| n != old).collect();
        let new = cluster.leader_among(&others);
        assert_eq!(cluster.speculative(new), vec![1], "the new leader starts from its log");
        cluster.call(new, |h, out| h.submit(SHARD, 3, out).unwrap());
        cluster.isolated.clear();
        cluster.tick(20);
        // (The old leader, replica 0, may have taken leadership back since: then its
        // speculative machine is a fresh copy of the committed one.)
        for &node in &nodes {
            assert_eq!(cluster.committed(node), vec![1, 3], "node {node}");
        }
        assert_eq!(cluster.speculative(old), vec![1, 3], "its speculation went with its term");
        assert_eq!(cluster.acks, vec![1, 2, 3]);
    }
}
