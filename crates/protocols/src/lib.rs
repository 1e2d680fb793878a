//! Meridian protocols: one module per distributed-transaction protocol, each a sans-IO state
//! machine implementing [`meridian_core::node::Node`], built on the shared machinery of
//! [`kit`].
//!
//! A protocol is a type implementing [`Protocol`]: its name, options, the topologies it runs
//! on, which nodes may crash without losing acknowledged data, and how a node is rebuilt from
//! its durable state. The simulator, the runtime, `bench` and `verify` reach protocols only
//! through [`ProtocolKind::visit`] ([`kind`], the one place that lists them): adding a protocol
//! is one module and one line in the `protocols!` invocation there.
#![deny(unsafe_code)]

pub mod chain;
pub mod engine;
pub mod kind;
pub mod kit;
pub mod luigi;
pub mod mako;
pub mod mvto;
pub mod occ;
pub mod options;
pub mod tiga;
pub mod twopl;

pub use kind::{ProtocolInfo, ProtocolKind, ProtocolVisitor, PROTOCOLS};
use meridian_core::node::Node;
use meridian_core::time::NS_PER_MS;
use meridian_core::topology::Topology;
use meridian_core::txn::{Partitioner, ProcError, Registry, WorkloadSample};
use meridian_core::{ConfigError, NodeId, ShardId};
use meridian_storage::MvccStore;
pub use options::{OptionKind, OptionSpec, OptionValue, ProtocolOptions};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a node's disk holds when it (re)starts: the log store's records.
pub type Durable = BTreeMap<Vec<u8>, Vec<u8>>;

/// A protocol: everything the drivers need to know about it beyond its node type.
pub trait Protocol: 'static {
    /// The name `--protocol` takes.
    const NAME: &'static str;
    /// One line for `--help` and reports.
    const SUMMARY: &'static str;
    /// The options it accepts (each name starts with the protocol's name).
    const OPTIONS: &'static [OptionSpec];
    /// The option settings a comparison of every protocol runs it with, one run each (the
    /// defaults only, unless an option changes what the protocol is, like 2PL's policy).
    const COMPARE: &'static [&'static [(&'static str, &'static str)]] = &[&[]];
    /// What its committed histories promise.
    const GUARANTEE: Guarantee = Guarantee::Strict;
    /// What its committed histories promise when run with `options` (an option may weaken
    /// it: tiga's snapshot reads). [`Protocol::GUARANTEE`] by default.
    fn guarantee(_options: &ProtocolOptions) -> Guarantee {
        Self::GUARANTEE
    }
    /// Its node.
    type Node: ProtocolNode;

    /// Checks that the protocol can run on `topology` (replica counts, placement).
    fn check_topology(topology: &Topology) -> Result<(), ConfigError>;
    /// True when `node` may crash (losing what it had not synced) without the protocol losing
    /// acknowledged data, so swarms may crash it.
    fn may_crash(topology: &Topology, node: NodeId) -> bool;
    /// Checks that the protocol can run `workload`'s transactions on `topology`; the error
    /// says why not and what to do instead. By default every workload runs.
    fn check_workload(_workload: &WorkloadSample, _topology: &Topology) -> Result<(), ConfigError> {
        Ok(())
    }
    /// The commit latency the protocol's design promises on its common path for a request
    /// coordinated in `region` that touches every shard, where it states one (tiga: the
    /// round trip to the farthest member of each shard's closest super quorum, plus the
    /// headroom), from the configured median delays; reports divide the median by it
    /// (`p50_over_bound`). `None` by default.
    fn latency_bound_ns(
        _topology: &Topology,
        _network: &meridian_core::netmodel::NetworkModel,
        _options: &ProtocolOptions,
        _region: meridian_core::RegionId,
    ) -> Option<u64> {
        None
    }
    /// The node that leads `shard` when a run starts, with `options` (fault schedules name
    /// it as `leader=S`). Replica 0 by default.
    fn initial_leader(
        topology: &Topology,
        _options: &ProtocolOptions,
        shard: ShardId,
    ) -> Option<NodeId> {
        topology.replica_node(shard, 0)
    }
    /// Builds the node of `context` from what its disk holds (empty on a first start). The
    /// caller bulk-loads the stores afterwards; the node replays its logs when started.
    fn restore(context: NodeContext, durable: &Durable) -> Result<Self::Node, String>;
    /// Brings a restored node to the state it would reach before talking to anyone (snapshot
    /// and committed log applied), for offline checks (`meridian verify`).
    fn replay_committed(node: &mut Self::Node) -> Replayed;
}

/// Runs `check` over `workload`'s sample of transactions on `topology`, for a protocol that
/// runs only some shapes of transaction; the error names the protocol, the workload and what
/// `check` refused.
pub(crate) fn check_sampled_requests(
    protocol: &str,
    workload: &WorkloadSample,
    topology: &Topology,
    check: fn(&NodeContext, &meridian_core::txn::TxnRequest) -> Result<(), ProcError>,
) -> Result<(), ConfigError> {
    let context = NodeContext::new(
        NodeId(0),
        Arc::new(topology.clone()),
        workload.registry.clone(),
        workload.partitioner.clone(),
        0,
        Timing::for_network(NS_PER_MS),
    );
    for txn in &workload.requests {
        check(&context, txn).map_err(|e| {
            ConfigError::new(format!("{protocol} cannot run {}: {e}", workload.name))
        })?;
    }
    Ok(())
}

/// The consistency a protocol's committed histories promise, so checks ask for no more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guarantee {
    /// Strictly serializable, whatever the clocks do.
    Strict,
    /// Serializable only (tiga's snapshot reads return a consistent but possibly stale
    /// state).
    Serializable,
    /// Serializable; strictly serializable too while coordinator clocks are synchronized
    /// (timestamp orders taken from clocks).
    StrictWithSyncedClocks,
}

impl Guarantee {
    /// Whether histories are strictly serializable when clocks are `synced` (perfect, and never
    /// stepped back).
    pub fn strict(self, synced: bool) -> bool {
        match self {
            Self::Strict => true,
            Self::Serializable => false,
            Self::StrictWithSyncedClocks => synced,
        }
    }
}

/// What [`Protocol::replay_committed`] rebuilt, summed over the node's shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Snapshots installed.
    pub snapshots: u64,
    /// Committed commands applied after them.
    pub commands: u64,
    /// The log index the state reached (summed over the node's groups).
    pub log_index: u64,
}

/// Timeouts every protocol node takes. Derived from the network model so that timeouts exceed
/// the slowest round trip.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    /// How long a coordinator waits for a reply before acting (abort, retransmit); also the
    /// pace of repeated queries and deliveries.
    pub rpc_timeout_ns: u64,
    /// First retry backoff after a conflict abort; doubles per retry up to the maximum.
    pub backoff_ns_min: u64,
    /// Largest retry backoff.
    pub backoff_ns_max: u64,
    /// Attempts per request before it fails with `RetriesExhausted`.
    pub attempts_max: u32,
    /// How much timestamp history (ns) stores keep below the newest commit.
    pub gc_retention_ns: u64,
    /// One Raft tick: heartbeats every 2, elections after 10–20 (replicated shards only).
    pub raft_tick_ns: u64,
    /// Commands each shard replica applies between snapshots of its state (replicated or
    /// durable shards only).
    pub snapshot_interval_entries: u64,
    /// A snapshot (and a tiga or luigi journal checkpoint) also waits for commands (journal
    /// records) holding one in this many of its bytes (0: the count alone decides; see
    /// `meridian_replication::raft::SNAPSHOT_BYTES_PER_LOG_BYTE_MAX`).
    pub snapshot_bytes_per_log_byte_max: u64,
    /// How long an interactive transaction may stay idle (no step in progress) before its
    /// coordinator aborts it and releases what it holds.
    pub session_lease_ns: u64,
}

impl Timing {
    /// Timing for a network whose slowest one-way delay is `owd_ns_max`.
    pub fn for_network(owd_ns_max: u64) -> Self {
        Self {
            rpc_timeout_ns: 4 * owd_ns_max + 200 * NS_PER_MS,
            backoff_ns_min: NS_PER_MS / 10,
            backoff_ns_max: 2 * owd_ns_max + 10 * NS_PER_MS,
            attempts_max: 1_000,
            // A `2pc-mvto` attempt reads at its timestamp and prepares after its last wave of
            // pieces: one that runs longer than the retention is refused below the GC
            // watermark on every retry, a livelock (the `crossstitch-3dc` preset hit it: ten
            // dependent operations at round trips of up to 546 ms). Keep a plan's worth of the
            // slowest round trips, and at least a second.
            gc_retention_ns: (2 * owd_ns_max * meridian_core::txn::PIECES_MAX as u64)
                .max(1_000 * NS_PER_MS),
            // Elections wait 10–20 ticks: 5–10 slowest one-way delays (2.5–5 round trips), and
            // at least 250 ms, because a vote needs a synced write at the candidate and at each
            // voter first (a slow disk syncs in 50 ms). Shorter, and a candidate times out
            // before its votes arrive, again and again (swarm seed 1 of `bank`, 3 replicas).
            raft_tick_ns: (owd_ns_max / 2).max(25 * NS_PER_MS),
            snapshot_interval_entries: SNAPSHOT_INTERVAL_ENTRIES,
            snapshot_bytes_per_log_byte_max:
                meridian_replication::raft::SNAPSHOT_BYTES_PER_LOG_BYTE_MAX,
            // Shorter than a `2pl` shard leader keeps an idle attempt's execution locks (four
            // RPC timeouts from its last execution), by more than the reply's way back, so a
            // live coordinator's lease ends first.
            session_lease_ns: 3 * (4 * owd_ns_max + 200 * NS_PER_MS),
        }
    }
}

/// Commands between snapshots by default. A snapshot copies every row written since the load;
/// at this interval a 2x3 `lan` bench snapshots each shard every few seconds, and a restart
/// replays at most this many commands after its snapshot.
pub const SNAPSHOT_INTERVAL_ENTRIES: u64 = 50_000;
/// The fewest commands between snapshots a run may ask for.
pub const SNAPSHOT_INTERVAL_ENTRIES_MIN: u64 =
    meridian_replication::raft::SNAPSHOT_INTERVAL_ENTRIES_MIN;

/// The bounds on what a node keeps. Production values by default; the simulator shrinks them
/// so that swarms reach them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Decisions a participant remembers (commits stay until settled; see `kit::twopc`).
    pub decided_max: usize,
    /// Reads a shard leader queues while its state catches up.
    pub reads_waiting_max: usize,
    /// Decisions a coordinator delivers at once; at the limit it takes no new requests.
    pub deliveries_max: usize,
    /// Attempts a participant leader asks its peers about at once (terminations, settling).
    pub inquiries_max: usize,
    /// Requests one coordinator runs at once; beyond this it rejects.
    pub requests_in_flight_max: usize,
    /// The largest snapshot a replica takes or accepts from a sender.
    pub snapshot_bytes_max: usize,
    /// Attempts a `2pl` shard leader lets hold execution locks at once; beyond it, executions
    /// of new attempts are refused (`Full`) until some finish or their lease runs out.
    pub lock_holders_max: usize,
    /// `2pc-mvto`: read stamps a shard keeps (beyond it the oldest raise a floor every write
    /// must exceed) and the leader's read hints.
    pub read_stamps_max: usize,
    /// `2pc-mvto`: prepares a shard leader holds back until the writers whose pending versions
    /// they read are decided; beyond it a prepare is refused (`Full`).
    pub dependents_waiting_max: usize,
    /// `tiga`, `luigi`: log entries a follower may trail its leader's finished prefix by before
    /// the leader drops the transaction bodies the follower would need and sends it to a state
    /// transfer (a follower down for good must not hold its leader's memory, or stall the
    /// shard once the leader's bodies are full).
    pub follower_lag_max: usize,
    /// `tiga`, `luigi`: log entries a replica drops at a time, at least (the entries every
    /// replica executed; fewer per drop cost more per entry).
    pub log_drop_min: usize,
    /// `tiga`, `luigi`: transactions below a leader's log base it waits to forget at once
    /// (their coordinators have not decided them, or other leaders not promised past them,
    /// yet); past it, the rest stay known as logged until it has room again.
    pub forgettable_max: usize,
}

/// [`Limits::forgettable_max`] by default.
pub const FORGETTABLE_MAX: usize = 1 << 16;
/// [`Limits::log_drop_min`] by default.
pub const LOG_DROP_MIN: usize = 1 << 10;
/// [`Limits::follower_lag_max`] by default.
pub const FOLLOWER_LAG_MAX: usize = 1 << 16;
/// The largest [`Limits::follower_lag_max`] a run may ask for.
pub const FOLLOWER_LAG_MAX_LIMIT: usize = 1 << 17;
const _: () = assert!(FOLLOWER_LAG_MAX <= FOLLOWER_LAG_MAX_LIMIT);

impl Default for Limits {
    fn default() -> Self {
        Self {
            decided_max: 1 << 20,
            reads_waiting_max: 4_096,
            deliveries_max: 1 << 16,
            inquiries_max: 4_096,
            requests_in_flight_max: 1 << 16,
            snapshot_bytes_max: meridian_replication::raft::SNAPSHOT_BYTES_MAX,
            lock_holders_max: 1 << 16,
            read_stamps_max: 1 << 20,
            dependents_waiting_max: 4_096,
            follower_lag_max: FOLLOWER_LAG_MAX,
            log_drop_min: LOG_DROP_MIN,
            forgettable_max: FORGETTABLE_MAX,
        }
    }
}

impl Limits {
    /// Checks the limits fit together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("decided_max", self.decided_max),
            ("reads_waiting_max", self.reads_waiting_max),
            ("deliveries_max", self.deliveries_max),
            ("inquiries_max", self.inquiries_max),
            ("requests_in_flight_max", self.requests_in_flight_max),
            ("lock_holders_max", self.lock_holders_max),
            ("read_stamps_max", self.read_stamps_max),
            ("dependents_waiting_max", self.dependents_waiting_max),
            ("follower_lag_max", self.follower_lag_max),
            ("log_drop_min", self.log_drop_min),
            ("forgettable_max", self.forgettable_max),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(ConfigError::new(format!("{name} must be at least 1")));
        }
        if self.follower_lag_max > FOLLOWER_LAG_MAX_LIMIT {
            return Err(ConfigError::new(format!(
                "follower_lag_max must be at most {FOLLOWER_LAG_MAX_LIMIT}"
            )));
        }
        let largest = meridian_replication::raft::SNAPSHOT_BYTES_MAX_LIMIT;
        if self.snapshot_bytes_max < meridian_replication::raft::MSG_CHUNK_BYTES
            || self.snapshot_bytes_max > largest
        {
            return Err(ConfigError::new(format!(
                "snapshot_bytes_max must be between {} and {largest}",
                meridian_replication::raft::MSG_CHUNK_BYTES
            )));
        }
        Ok(())
    }
}

/// What every node is built from.
#[derive(Clone, Debug)]
pub struct NodeContext {
    /// This node.
    pub id: NodeId,
    /// The node's incarnation: grows with every start of the node (from its durable state,
    /// or the driver), so attempt ids never repeat across restarts.
    pub incarnation: u64,
    /// The cluster layout.
    pub topology: Arc<Topology>,
    /// The procedures.
    pub registry: Arc<Registry>,
    /// Where keys live.
    pub partitioner: Arc<Partitioner>,
    /// The run's master seed (the node derives its own stream).
    pub seed: u64,
    /// Timeouts.
    pub timing: Timing,
    /// Bounds on what the node keeps.
    pub limits: Limits,
    /// The protocol's options.
    pub options: ProtocolOptions,
    /// The driver persists to a durable log: even a single replica per shard then runs its
    /// log (a one-member Raft group), so a restart loses nothing.
    pub durable: bool,
}

impl NodeContext {
    /// A context with the default limits and options, incarnation 0 and no durable log (tests
    /// and simple drivers; set the fields to change them).
    pub fn new(
        id: NodeId,
        topology: Arc<Topology>,
        registry: Arc<Registry>,
        partitioner: Arc<Partitioner>,
        seed: u64,
        timing: Timing,
    ) -> Self {
        Self {
            id,
            incarnation: 0,
            topology,
            registry,
            partitioner,
            seed,
            timing,
            limits: Limits::default(),
            options: ProtocolOptions::default(),
            durable: false,
        }
    }
}

/// What the harness needs from any protocol node beyond the state-machine contract.
pub trait ProtocolNode: Node {
    /// The stores of the shard replicas this node hosts.
    fn stores(&self) -> Vec<(ShardId, &MvccStore)>;
    /// Every store to bulk-load before the run starts (a protocol keeping two copies of a
    /// replica lists both).
    fn stores_mut(&mut self) -> Vec<(ShardId, &mut MvccStore)>;
    /// True when this node's replica of `shard` leads it and so holds every commit
    /// acknowledged (followers may lag behind it); end-of-run checks read a leader's store
    /// when a protocol names one. By default none is named, and checks read replica 0 once
    /// the shard has settled.
    fn leads(&self, _shard: ShardId) -> bool {
        false
    }
}
