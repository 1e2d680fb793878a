//! Meridian's deterministic discrete-event simulator (docs/architecture.md, "Drivers").
//!
//! [`Sim`] drives sans-IO nodes in virtual time. Events sit in one queue ordered by
//! `(time, sequence)`; the sequence number breaks ties in insertion order, so nothing depends on
//! heap internals. All randomness comes from one master seed: each directed link and each node
//! clock has its own child stream. Messages travel through the link model (delay, jitter, loss,
//! FIFO per link), node clocks follow the clock model, persists go through a disk model that loses
//! unsynced writes on a crash, and scheduled faults crash, restart and partition nodes.
//!
//! Every processed event is folded into a trace hash (time, kind, nodes, and the message bytes),
//! so one seed run twice must give the same hash: the determinism test checks it.
//!
//! Clients (a [`ClientDriver`]) sit beside their coordinator with no delay and see true
//! (virtual) time; nodes see their own skewed clock.
#![deny(unsafe_code)]

pub mod disk;
pub mod runner;
pub mod swarm;

use disk::SimDisk;
use meridian_core::clock::{ClockModel, NodeClock};
use meridian_core::fault::FaultAction;
use meridian_core::netmodel::{LinkState, NetworkModel};
use meridian_core::node::{
    ClientDriver, ClientRequest, Effect, Node, Outbox, PersistToken, TimerId,
};
use meridian_core::rng::{child_rng, fnv1a, uniform_f64, uniform_u64, Rng, FNV_OFFSET};
use meridian_core::time::{NS_PER_MS, NS_PER_S};
use meridian_core::topology::Topology;
use meridian_core::{NodeId, RequestId, Time};
use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

/// Virtual time at which a simulation starts. Far from zero so that clocks with negative offsets
/// never read below zero.
pub const SIM_EPOCH_NS: Time = 1_000 * NS_PER_S;
/// Most events queued at once; a run that exceeds it is a bug (a message storm).
pub const EVENTS_QUEUED_MAX: usize = 1 << 24;

/// A fault the simulator applies at a scheduled time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The node stops; its unsynced writes are lost.
    Crash(NodeId),
    /// The node starts again from what its disk holds.
    Restart(NodeId),
    /// Messages from the first node to the second are dropped (one direction).
    Block(NodeId, NodeId),
    /// Every block is lifted.
    Heal,
    /// The node (if up) takes a control service's word.
    Control(NodeId, meridian_core::node::Control),
    /// One block of one direction is lifted (the link is open once no block holds it).
    Unblock(NodeId, NodeId),
    /// The node's clock jumps by this many nanoseconds (forward when positive).
    ClockStep(NodeId, i64),
    /// Every persist of the node takes this much longer (0 ends the slowdown).
    DiskDelay(NodeId, u64),
}

impl From<FaultAction> for Fault {
    fn from(action: FaultAction) -> Self {
        match action {
            FaultAction::Crash(node) => Self::Crash(node),
            FaultAction::Restart(node) => Self::Restart(node),
            FaultAction::Block(from, to) => Self::Block(from, to),
            FaultAction::Unblock(from, to) => Self::Unblock(from, to),
            FaultAction::ClockStep(node, step_ns) => Self::ClockStep(node, step_ns),
            FaultAction::DiskDelay(node, delay_ns) => Self::DiskDelay(node, delay_ns),
        }
    }
}

/// Simulator settings.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Master seed.
    pub seed: u64,
    /// The link model.
    pub network: NetworkModel,
    /// The clock model.
    pub clock: ClockModel,
    /// Latency of a synced persist.
    pub disk_sync_ns: u64,
    /// Latency of a buffered persist.
    pub disk_buffered_ns: u64,
    /// Faults and when (relative to the start) they happen.
    pub faults: Vec<(Time, Fault)>,
    /// Network misbehaviour beyond the link model, for swarms.
    pub chaos: Chaos,
    /// Keep a readable line for each of the last this many events (0: none; at most
    /// [`TRACE_TAIL_MAX`]). Costs a `Debug` format per event, so only for replays.
    pub trace_tail: usize,
    /// Crashes tied to a message rather than a time, each fired once (scenario tests:
    /// "the leader crashes while preparing").
    pub crash_triggers: Vec<CrashTrigger>,
    /// A restarted node's clock comes back this much behind where it was (a clock stepped
    /// back across a restart): correctness must not depend on clocks moving forward.
    pub restart_clock_step_back_ns: u64,
    /// The durability oracle's power failure, if any.
    pub power_failure: Option<PowerFailure>,
    /// Persist completions held back at random, to widen the windows between a write and its
    /// durability.
    pub buggify: Buggify,
}

/// The durability oracle: right after the `after_commits`-th reply that acknowledges a commit
/// reaches its client, every node of `nodes` loses power at once (the rest of the replying
/// call is lost with it; unsynced writes are gone), and each starts again `restart_after_ns`
/// later from what its disk holds. Whatever the client was told committed must stay
/// committed: the history and store checks judge the rest of the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PowerFailure {
    /// Which acknowledgement (1 is the first).
    pub after_commits: u64,
    /// The nodes that lose power.
    pub nodes: Vec<NodeId>,
    /// How long they stay down.
    pub restart_after_ns: Time,
}

/// BUGGIFY-style fault points that widen the windows in which a commit could outrun its
/// durability: each persist completes, with `persist_delay_probability`, up to
/// `persist_delay_ns_max` later than the disk would have it (on a stream of its own).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Buggify {
    /// Chance that one persist is held back.
    pub persist_delay_probability: f64,
    /// Longest hold.
    pub persist_delay_ns_max: Time,
}

/// Where a [`CrashTrigger`] looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TriggerPoint {
    /// The node crashes right after handling a matching message, before any effect of that
    /// call is carried out (nothing it sent or persisted in that call happens).
    Receive,
    /// The node crashes when it is about to send a matching message: that message and the
    /// rest of the call's effects are lost.
    Send,
}

/// Crash `node` at the first matching message, and restart it `restart_after_ns` later.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrashTrigger {
    /// The node.
    pub node: NodeId,
    /// Receive or send.
    pub on: TriggerPoint,
    /// Text the message's `Debug` rendering contains.
    pub contains: String,
    /// Not before this time (relative to the start).
    pub after_ns: Time,
    /// Restart this long after the crash.
    pub restart_after_ns: Time,
}

/// Most event lines a trace tail keeps.
pub const TRACE_TAIL_MAX: usize = 10_000;
/// Longest rendering of one message in a trace line.
const TRACE_MSG_CHARS_MAX: usize = 200;

/// Network misbehaviour applied to every message sent before `until_ns` (relative to the
/// start), on top of the link model; after it the network behaves (the healing phase).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Chaos {
    /// Extra probability that a message is lost.
    pub loss: f64,
    /// Probability that a message is delivered twice (the copy at an independently drawn time).
    pub duplicate: f64,
    /// Probability that a message skips the link's FIFO order: it is delivered after an extra
    /// delay of up to [`REORDER_DELAY_NS_MAX`], overtaken by later messages.
    pub reorder: f64,
    /// End of the misbehaviour, relative to the start.
    pub until_ns: Time,
}

/// Most extra delay a reordered message gets.
pub const REORDER_DELAY_NS_MAX: Time = 200 * NS_PER_MS;

impl SimConfig {
    /// Defaults for `network` and `clock`: 1 ms synced persists, 20 µs buffered, no faults.
    pub fn new(seed: u64, network: NetworkModel, clock: ClockModel) -> Self {
        Self {
            seed,
            network,
            clock,
            disk_sync_ns: NS_PER_MS,
            disk_buffered_ns: 20_000,
            faults: Vec::new(),
            chaos: Chaos::default(),
            trace_tail: 0,
            crash_triggers: Vec::new(),
            restart_clock_step_back_ns: 0,
            power_failure: None,
            buggify: Buggify::default(),
        }
    }
}

/// Counters of one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Events processed.
    pub events: u64,
    /// Messages delivered to a live node.
    pub deliveries: u64,
    /// Messages the link model lost.
    pub lost: u64,
    /// Messages dropped by a partition.
    pub blocked: u64,
    /// Messages or timers dropped because their node had crashed.
    pub dropped_crashed: u64,
    /// Timers fired.
    pub timers: u64,
    /// Persists completed.
    pub persists: u64,
    /// Messages delivered out of FIFO order on purpose (chaos).
    pub reordered: u64,
    /// Crash triggers that fired.
    pub triggered: u64,
    /// Messages delivered twice on purpose (chaos).
    pub duplicated: u64,
    /// Power failures of the durability oracle.
    pub power_failures: u64,
    /// Persists held back by [`Buggify`].
    pub persists_held: u64,
}

/// Wide-area one-way hops on the causal chain that led to an event: a message that crosses
/// regions adds one to the count of the call that sent it; timers and persist completions
/// carry the count of the call that asked for them. A reply's count is the number of
/// wide-area legs its transaction waited for, in turn, on the path that completed it.
type Hops = u16;

enum EventKind<M> {
    Deliver {
        from: NodeId,
        to: NodeId,
        msg: M,
        hops: Hops,
    },
    Timer {
        node: NodeId,
        timer: TimerId,
        incarnation: u32,
        hops: Hops,
    },
    Persisted {
        node: NodeId,
        token: PersistToken,
        incarnation: u32,
        sync: bool,
        hops: Hops,
    },
    Submit {
        node: NodeId,
        request: ClientRequest,
    },
    /// The clients' next open-loop arrival is due (stale unless it is the one armed).
    ClientWake {
        at: Time,
    },
    Fault(Fault),
}

struct Event<M> {
    at: Time,
    seq: u64,
    kind: EventKind<M>,
}

impl<M> PartialEq for Event<M> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<M> Eq for Event<M> {}
impl<M> PartialOrd for Event<M> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<M> Ord for Event<M> {
    /// Reversed so the max-heap pops the earliest event.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// Builds a node at start or restart from its id, its incarnation (0 at the first start, then
/// one more per crash) and what its disk holds.
pub type NodeFactory<N> = Box<dyn FnMut(NodeId, u64, &BTreeMap<Vec<u8>, Vec<u8>>) -> N>;

/// The simulator.
pub struct Sim<N: Node, C: ClientDriver> {
    now: Time,
    seq: u64,
    queue: BinaryHeap<Event<N::Msg>>,
    nodes: Vec<Option<N>>,
    incarnations: Vec<u32>,
    clocks: Vec<NodeClock>,
    regions: Vec<usize>,
    network: NetworkModel,
    links: BTreeMap<(u32, u32), LinkState>,
    /// Blocked links and how many blocks hold each (scheduled cuts may overlap).
    blocked: BTreeMap<(NodeId, NodeId), u32>,
    disks: Vec<SimDisk>,
    /// Extra latency of every persist per node (a slow disk).
    disk_delays_ns: Vec<u64>,
    factory: NodeFactory<N>,
    clients: C,
    config: SimConfig,
    trace_hash: u64,
    stats: SimStats,
    outbox: Outbox<N::Msg>,
    /// The hop count of the event being processed.
    hops: Hops,
    /// Replies with the hop count of the call that sent them, until taken.
    reply_hops: Vec<(RequestId, Hops)>,
    scratch: Vec<u8>,
    chaos_rng: Rng,
    tail: VecDeque<String>,
    /// The clients' armed wake-up (open loop), if any.
    client_wake: Option<Time>,
    /// Replies that acknowledged a commit so far.
    commits_acked: u64,
    /// [`Buggify`]'s draws.
    buggify_rng: Rng,
}

impl<N: Node, C: ClientDriver> Sim<N, C> {
    /// Builds every node of `topology` with `factory`, starts them and the clients.
    pub fn new(
        config: SimConfig,
        topology: &Topology,
        mut factory: NodeFactory<N>,
        clients: C,
    ) -> Self {
        let node_count = topology.nodes.len();
        let mut clock_rng = child_rng(config.seed, "sim-clocks", 0);
        let clocks = (0..node_count).map(|_| config.clock.draw(&mut clock_rng)).collect();
        let regions = topology.nodes.iter().map(|n| n.region.0 as usize).collect();
        let disks: Vec<SimDisk> = (0..node_count).map(|_| SimDisk::default()).collect();
        let nodes = (0..node_count)
            .map(|i| Some(factory(NodeId(i as u32), 0, disks[i].durable())))
            .collect();
        let mut sim = Self {
            now: SIM_EPOCH_NS,
            seq: 0,
            queue: BinaryHeap::new(),
            nodes,
            incarnations: vec![0; node_count],
            clocks,
            regions,
            network: config.network.clone(),
            links: BTreeMap::new(),
            blocked: BTreeMap::new(),
            disks,
            disk_delays_ns: vec![0; node_count],
            factory,
            clients,
            trace_hash: FNV_OFFSET,
            stats: SimStats::default(),
            outbox: Outbox::new(),
            hops: 0,
            reply_hops: Vec::new(),
            scratch: Vec::new(),
            chaos_rng: child_rng(config.seed, "sim-chaos", 0),
            commits_acked: 0,
            buggify_rng: child_rng(config.seed, "sim-buggify", 0),
            tail: VecDeque::new(),
            client_wake: None,
            config,
        };
        for (at, fault) in sim.config.faults.clone() {
            sim.schedule(SIM_EPOCH_NS + at, EventKind::Fault(fault));
        }
        for id in 0..node_count {
            let node = NodeId(id as u32);
            let now = sim.node_now(node);
            if let Some(n) = sim.nodes[id].as_mut() {
                sim.outbox.begin_call(sim.hops);
                n.on_start(now, &mut sim.outbox);
            }
            sim.carry_out(node);
        }
        let start = sim.clients.start(sim.now);
        sim.submit_all(start);
        sim
    }

    fn schedule(&mut self, at: Time, kind: EventKind<N::Msg>) {
        assert!(
            self.queue.len() < EVENTS_QUEUED_MAX,
            "event queue overflow at {} events",
            self.queue.len()
        );
        self.seq += 1;
        self.queue.push(Event { at, seq: self.seq, kind });
    }

    fn node_now(&self, node: NodeId) -> Time {
        self.clocks[node.0 as usize].read(self.now)
    }

    fn submit_all(&mut self, requests: Vec<(NodeId, ClientRequest)>) {
        for (node, request) in requests {
            self.schedule(self.now, EventKind::Submit { node, request });
        }
        // Every call into the clients ends here: arm their next arrival if it moved earlier.
        if let Some(at) = self.clients.next_arrival() {
            if self.client_wake.is_none_or(|armed| at < armed) {
                self.client_wake = Some(at);
                self.schedule(at.max(self.now), EventKind::ClientWake { at });
            }
        }
    }

    /// Virtual time now.
    pub fn now(&self) -> Time {
        self.now
    }

    /// Virtual time elapsed since the start.
    pub fn elapsed_ns(&self) -> Time {
        self.now - SIM_EPOCH_NS
    }

    /// The trace hash so far.
    pub fn trace_hash(&self) -> u64 {
        self.trace_hash
    }

    /// Counters so far.
    pub fn stats(&self) -> &SimStats {
        &self.stats
    }

    /// The clients.
    pub fn clients_mut(&mut self) -> &mut C {
        &mut self.clients
    }

    /// The nodes (`None` for a crashed one).
    pub fn nodes(&self) -> &[Option<N>] {
        &self.nodes
    }

    /// The replies sent since the last call, with the wide-area one-way hops on the causal
    /// chain that produced each.
    pub fn take_reply_hops(&mut self) -> Vec<(RequestId, u16)> {
        std::mem::take(&mut self.reply_hops)
    }

    /// True when no event is queued.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty()
    }

    /// Processes every event due at or before `deadline` (elapsed virtual ns); returns false
    /// when the queue ran dry first.
    pub fn run_until(&mut self, deadline: Time) -> bool {
        self.run_until_or(deadline, u64::MAX)
    }

    /// Like [`Self::run_until`], but also returns after `events_max` events, leaving virtual
    /// time at the last event processed. With zero-delay links virtual time may not advance
    /// for a long while; the caller still gets control back to check its progress.
    pub fn run_until_or(&mut self, deadline: Time, events_max: u64) -> bool {
        let deadline = SIM_EPOCH_NS + deadline;
        for _ in 0..events_max {
            match self.queue.peek() {
                Some(event) if event.at <= deadline => {}
                Some(_) => {
                    self.now = deadline;
                    return true;
                }
                None => return false,
            }
            let event = self.queue.pop().expect("peeked");
            debug_assert!(event.at >= self.now, "time never goes back");
            self.now = event.at;
            self.stats.events += 1;
            self.process(event.kind);
        }
        true
    }

    fn hash(&mut self, tag: u8, a: u32, b: u64) {
        let mut h = fnv1a(self.trace_hash, &self.now.to_le_bytes());
        h = fnv1a(h, &[tag]);
        h = fnv1a(h, &a.to_le_bytes());
        self.trace_hash = fnv1a(h, &b.to_le_bytes());
    }

    /// The last events processed, oldest first (when `trace_tail` is on).
    pub fn trace_tail(&self) -> Vec<String> {
        self.tail.iter().cloned().collect()
    }

    fn trace(&mut self, kind: &EventKind<N::Msg>) {
        let keep = self.config.trace_tail.min(TRACE_TAIL_MAX);
        if keep == 0 {
            return;
        }
        let at_ms = (self.now - SIM_EPOCH_NS) as f64 / 1e6;
        let what = match kind {
            EventKind::Deliver { from, to, msg, .. } => {
                let mut text = format!("{msg:?}");
                if text.len() > TRACE_MSG_CHARS_MAX {
                    let cut = (0..=TRACE_MSG_CHARS_MAX).rev().find(|&i| text.is_char_boundary(i));
                    text.truncate(cut.unwrap_or(0));
                    text.push('…');
                }
                format!("deliver n{} -> n{}: {text}", from.0, to.0)
            }
            EventKind::Timer { node, timer, .. } => format!("timer n{} #{}", node.0, timer.0),
            EventKind::Persisted { node, token, .. } => {
                format!("persisted n{} #{}", node.0, token.0)
            }
            EventKind::Submit { node, request } => {
                format!("submit n{} request {}", node.0, request.id.0)
            }
            EventKind::ClientWake { at } => format!("clients wake for {at}"),
            EventKind::Fault(fault) => format!("fault {fault:?}"),
        };
        if self.tail.len() == keep {
            self.tail.pop_front();
        }
        self.tail.push_back(format!("{at_ms:>12.3} ms  {what}"));
    }

    fn process(&mut self, kind: EventKind<N::Msg>) {
        self.trace(&kind);
        match kind {
            EventKind::Deliver { from, to, msg, hops } => {
                self.hops = hops;
                self.scratch.clear();
                let bytes = postcard::to_extend(&msg, std::mem::take(&mut self.scratch))
                    .unwrap_or_default();
                let digest = fnv1a(FNV_OFFSET, &bytes);
                self.scratch = bytes;
                self.hash(1, (from.0 << 16) | to.0, digest);
                let now = self.node_now(to);
                let trigger = self.trigger_index(to, TriggerPoint::Receive, &msg);
                match self.nodes[to.0 as usize].as_mut() {
                    Some(node) => {
                        self.stats.deliveries += 1;
                        self.outbox.begin_call(self.hops);
                        node.on_message(now, from, msg, &mut self.outbox);
                        match trigger {
                            Some(index) => {
                                self.outbox.drain().for_each(drop);
                                self.fire_trigger(index);
                            }
                            None => self.carry_out(to),
                        }
                    }
                    None => self.stats.dropped_crashed += 1,
                }
            }
            EventKind::Timer { node, timer, incarnation, hops } => {
                self.hops = hops;
                self.hash(2, node.0, timer.0);
                let now = self.node_now(node);
                match self.nodes[node.0 as usize].as_mut() {
                    Some(n) if self.incarnations[node.0 as usize] == incarnation => {
                        self.stats.timers += 1;
                        self.outbox.begin_call(self.hops);
                        n.on_timer(now, timer, &mut self.outbox);
                        self.carry_out(node);
                    }
                    _ => self.stats.dropped_crashed += 1,
                }
            }
            EventKind::Persisted { node, token, incarnation, sync, hops } => {
                self.hops = hops;
                self.hash(3, node.0, token.0);
                if self.incarnations[node.0 as usize] != incarnation {
                    return; // The write died with the crash.
                }
                if sync {
                    self.disks[node.0 as usize].sync();
                }
                let now = self.node_now(node);
                if let Some(n) = self.nodes[node.0 as usize].as_mut() {
                    self.stats.persists += 1;
                    self.outbox.begin_call(self.hops);
                    n.on_persisted(now, token, &mut self.outbox);
                    self.carry_out(node);
                }
            }
            EventKind::Submit { node, request } => {
                self.hops = 0;
                self.hash(4, node.0, request.id.0);
                let now = self.node_now(node);
                match self.nodes[node.0 as usize].as_mut() {
                    Some(n) => {
                        self.outbox.begin_call(self.hops);
                        n.submit(now, request, &mut self.outbox);
                        self.carry_out(node);
                    }
                    None => self.clients.on_crash(node),
                }
            }
            EventKind::ClientWake { at } => {
                if self.client_wake != Some(at) {
                    return; // Superseded by an earlier arrival.
                }
                self.client_wake = None;
                self.hops = 0;
                self.hash(9, 0, at);
                let requests = self.clients.on_time(self.now);
                self.submit_all(requests);
            }
            EventKind::Fault(fault) => {
                self.hops = 0;
                self.apply(fault)
            }
        }
    }

    fn apply(&mut self, fault: Fault) {
        match fault {
            Fault::Crash(node) => {
                self.hash(5, node.0, 0);
                let index = node.0 as usize;
                if self.nodes[index].take().is_some() {
                    self.incarnations[index] += 1;
                    self.disks[index].crash();
                    self.clients.on_crash(node);
                }
            }
            Fault::Restart(node) => {
                self.hash(6, node.0, 0);
                let index = node.0 as usize;
                if self.nodes[index].is_none() {
                    let step =
                        i64::try_from(self.config.restart_clock_step_back_ns).unwrap_or(i64::MAX);
                    let clock = &mut self.clocks[index];
                    clock.offset_ns = clock.offset_ns.saturating_sub(step);
                    let incarnation = u64::from(self.incarnations[index]);
                    let mut fresh = (self.factory)(node, incarnation, self.disks[index].durable());
                    let now = self.node_now(node);
                    self.outbox.begin_call(self.hops);
                    fresh.on_start(now, &mut self.outbox);
                    self.nodes[index] = Some(fresh);
                    self.carry_out(node);
                    let requests = self.clients.on_restart(self.now, node);
                    self.submit_all(requests);
                }
            }
            Fault::Block(from, to) => {
                self.hash(7, from.0, u64::from(to.0));
                *self.blocked.entry((from, to)).or_default() += 1;
            }
            Fault::Heal => {
                self.hash(8, 0, 0);
                self.blocked.clear();
            }
            Fault::Control(node, control) => {
                self.hash(10, node.0, 0);
                let now = self.node_now(node);
                if let Some(n) = self.nodes[node.0 as usize].as_mut() {
                    self.outbox.begin_call(self.hops);
                    n.on_control(now, control, &mut self.outbox);
                    self.carry_out(node);
                }
            }
            Fault::Unblock(from, to) => {
                self.hash(11, from.0, u64::from(to.0));
                if let Some(count) = self.blocked.get_mut(&(from, to)) {
                    *count -= 1;
                    if *count == 0 {
                        self.blocked.remove(&(from, to));
                    }
                }
            }
            Fault::ClockStep(node, step_ns) => {
                self.hash(12, node.0, step_ns as u64);
                let clock = &mut self.clocks[node.0 as usize];
                clock.offset_ns = clock.offset_ns.saturating_add(step_ns);
            }
            Fault::DiskDelay(node, delay_ns) => {
                self.hash(13, node.0, delay_ns);
                self.disk_delays_ns[node.0 as usize] = delay_ns;
            }
        }
    }

    /// The first unfired crash trigger for `node` at `point` that `msg` matches.
    fn trigger_index(&self, node: NodeId, point: TriggerPoint, msg: &N::Msg) -> Option<usize> {
        let elapsed = self.elapsed_ns();
        let mut candidates = self
            .config
            .crash_triggers
            .iter()
            .enumerate()
            .filter(|(_, t)| t.node == node && t.on == point && elapsed >= t.after_ns)
            .peekable();
        candidates.peek()?;
        // Rendering costs; only nodes with a pending trigger pay it.
        let text = format!("{msg:?}");
        candidates.find(|(_, t)| text.contains(&t.contains)).map(|(i, _)| i)
    }

    /// Crashes the trigger's node now and schedules its restart; the trigger is spent.
    fn fire_trigger(&mut self, index: usize) {
        let trigger = self.config.crash_triggers.remove(index);
        self.stats.triggered += 1;
        self.apply(Fault::Crash(trigger.node));
        self.schedule(
            self.now + trigger.restart_after_ns,
            EventKind::Fault(Fault::Restart(trigger.node)),
        );
    }

    /// How much longer one persist takes under [`Buggify`] (draws only when it is on, so runs
    /// without it keep their traces).
    fn buggify_hold(&mut self) -> Time {
        let buggify = self.config.buggify;
        if buggify.persist_delay_probability <= 0.0 || buggify.persist_delay_ns_max == 0 {
            return 0;
        }
        if uniform_f64(&mut self.buggify_rng) >= buggify.persist_delay_probability {
            return 0;
        }
        self.stats.persists_held += 1;
        uniform_u64(&mut self.buggify_rng, buggify.persist_delay_ns_max)
    }

    /// Counts a committed reply; true when it is the one the power failure waits for.
    fn power_failure_due(&mut self) -> bool {
        self.commits_acked += 1;
        self.config.power_failure.as_ref().is_some_and(|p| p.after_commits == self.commits_acked)
    }

    /// Every node of the power failure crashes now and is scheduled to start again.
    fn power_failure(&mut self) {
        let Some(failure) = self.config.power_failure.clone() else { return };
        self.stats.power_failures += 1;
        for &node in &failure.nodes {
            self.apply(Fault::Crash(node));
        }
        for &node in &failure.nodes {
            let at = self.now + failure.restart_after_ns;
            self.schedule(at, EventKind::Fault(Fault::Restart(node)));
        }
    }

    /// Carries out the effects `node` just emitted, in order.
    fn carry_out(&mut self, node: NodeId) {
        // The outbox is swapped out so effects can be carried out while `self` is borrowed; its
        // buffer is reused across calls.
        let mut outbox = std::mem::take(&mut self.outbox);
        let mut effects = outbox.drain();
        while let Some(effect) = effects.next() {
            match effect {
                Effect::Send { to, msg } => {
                    if let Some(index) = self.trigger_index(node, TriggerPoint::Send, &msg) {
                        effects.by_ref().for_each(drop);
                        self.fire_trigger(index);
                        break;
                    }
                    self.send(node, to, msg)
                }
                Effect::SetTimer { timer, after_ns } => {
                    let after = self.clocks[node.0 as usize].true_duration(after_ns);
                    let incarnation = self.incarnations[node.0 as usize];
                    let hops = self.hops;
                    self.schedule(
                        self.now + after,
                        EventKind::Timer { node, timer, incarnation, hops },
                    );
                }
                Effect::Persist { token, records, durability } => {
                    let sync = durability == meridian_core::node::Durability::Synced;
                    let latency =
                        if sync { self.config.disk_sync_ns } else { self.config.disk_buffered_ns };
                    let latency =
                        latency + self.disk_delays_ns[node.0 as usize] + self.buggify_hold();
                    let at = self.disks[node.0 as usize].write(records, self.now + latency);
                    let incarnation = self.incarnations[node.0 as usize];
                    let hops = self.hops;
                    self.schedule(
                        at,
                        EventKind::Persisted { node, token, incarnation, sync, hops },
                    );
                }
                Effect::DependsOn { hops } => self.hops = hops,
                Effect::Reply { request, outcome } => {
                    self.reply_hops.push((request, self.hops));
                    let next = self.clients.on_reply(self.now, node, request, &outcome);
                    self.submit_all(next);
                    if outcome.result == meridian_core::txn::TxnResult::Committed
                        && self.power_failure_due()
                    {
                        effects.by_ref().for_each(drop);
                        self.power_failure();
                        break;
                    }
                }
            }
        }
        drop(effects);
        self.outbox = outbox;
    }

    fn send(&mut self, from: NodeId, to: NodeId, msg: N::Msg) {
        if self.blocked.contains_key(&(from, to)) {
            self.stats.blocked += 1;
            return;
        }
        let model = self.network.link(self.regions[from.0 as usize], self.regions[to.0 as usize]);
        let seed = self.config.seed;
        let link = self.links.entry((from.0, to.0)).or_insert_with(|| {
            LinkState::new(child_rng(seed, "sim-link", (u64::from(from.0) << 32) | u64::from(to.0)))
        });
        let Some(at) = link.sample(&model, self.now) else {
            self.stats.lost += 1;
            return;
        };
        let wide = self.regions[from.0 as usize] != self.regions[to.0 as usize];
        let hops = self.hops.saturating_add(Hops::from(wide));
        let chaos = self.config.chaos;
        if self.now >= SIM_EPOCH_NS + chaos.until_ns {
            self.schedule(at, EventKind::Deliver { from, to, msg, hops });
            return;
        }
        let rng = &mut self.chaos_rng;
        if chaos.loss > 0.0 && uniform_f64(rng) < chaos.loss {
            self.stats.lost += 1;
            return;
        }
        let mut at = at;
        if chaos.reorder > 0.0 && uniform_f64(rng) < chaos.reorder {
            at += uniform_u64(rng, REORDER_DELAY_NS_MAX);
            self.stats.reordered += 1;
        }
        if chaos.duplicate > 0.0 && uniform_f64(rng) < chaos.duplicate {
            let copy_at = at + uniform_u64(rng, REORDER_DELAY_NS_MAX);
            self.stats.duplicated += 1;
            self.schedule(copy_at, EventKind::Deliver { from, to, msg: msg.clone(), hops });
        }
        self.schedule(at, EventKind::Deliver { from, to, msg, hops });
    }
}

#[cfg(test)]
mod tests;
