//! Runs one seed of one protocol and workload in the simulator and reports the outcome: what
//! committed, the invariant checks, liveness, and the trace hash that identifies the schedule.
//! `meridian sim` and the scenario tests use it.

use crate::{Chaos, Fault, Sim, SimConfig, SimStats};
use meridian_core::clock::ClockModel;
use meridian_core::netmodel::NetworkModel;
use meridian_core::node::ClientDriver;
use meridian_core::time::NS_PER_MS;
use meridian_core::topology::Topology;
use meridian_core::txn::{CommitPath, TxnResult};
use meridian_core::{ConfigError, NodeId, RequestId, ShardId, Time};
use meridian_protocols::{
    Limits, NodeContext, Protocol, ProtocolKind, ProtocolNode, ProtocolOptions, ProtocolVisitor,
    Timing,
};
use meridian_storage::MvccStore;
use meridian_workloads::clients::{ClientPool, Completion, Load};
use meridian_workloads::{CheckResult, Workload};
use std::collections::BTreeMap;
use std::sync::Arc;

/// RPC timeouts of virtual time given to in-flight decisions after the last client is answered:
/// enough for participants whose coordinator crashed to notice (three quiet timeouts) and
/// decide with their peers before the stores are checked. (A run whose restarted nodes came
/// back with their clocks stepped back drains that much longer as well.)
pub const DRAIN_TIMEOUTS: u64 = 6;
/// Virtual time between checks of the clients' progress.
const STEP_NS: Time = 50 * NS_PER_MS;
/// Events between checks of the clients' progress (zero-delay links may not advance time).
const STEP_EVENTS_MAX: u64 = 20_000;

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimRunOptions {
    /// The protocol.
    pub protocol: ProtocolKind,
    /// The cluster layout.
    pub topology: Topology,
    /// The link model.
    pub network: NetworkModel,
    /// The clock model.
    pub clock: ClockModel,
    /// Closed-loop clients, spread over the coordinators.
    pub clients: u32,
    /// Requests to complete before the clients stop.
    pub txns: u64,
    /// Master seed.
    pub seed: u64,
    /// Scheduled faults.
    pub faults: Vec<(Time, Fault)>,
    /// Virtual time by which every request must be answered.
    pub time_limit_ns: Time,
    /// Network misbehaviour (swarms).
    pub chaos: Chaos,
    /// Latency of a synced persist; the simulator's default when `None`.
    pub disk_sync_ns: Option<Time>,
    /// Keep the workload's recorded history (elle-cli JSON) in the report.
    pub keep_history: bool,
    /// Keep a readable line for each of the last this many events (for replays of failures).
    pub trace_tail: usize,
    /// Crashes tied to messages (scenario tests).
    pub crash_triggers: Vec<crate::CrashTrigger>,
    /// Commands between snapshots of a replicated shard; `None` draws it from the seed (32,
    /// 128 or 512), far below a real run's, so runs of a few hundred transactions snapshot,
    /// send snapshots to lagging replicas and restart from them. (Each snapshot copies the
    /// rows written so far: at 16, TPC-C seeds ran 7 times slower.)
    pub snapshot_interval_entries: Option<u64>,
    /// Sends of one transaction before its coordinator gives up on it (reported
    /// indeterminate); `None` keeps the timing's default (1,000, which a run rarely reaches).
    pub attempts_max: Option<u32>,
    /// Bounds on what nodes keep; production values by default (swarms shrink them).
    pub limits: Limits,
    /// The protocol's options.
    pub protocol_options: ProtocolOptions,
    /// Most events one run may process; a run over it fails (a budget so that a seed that
    /// livelocks ends, and says so, instead of hanging its swarm). `None`: [`EVENTS_BASE`] plus
    /// [`EVENTS_PER_TXN`] per transaction.
    pub events_max: Option<u64>,
    /// How the clients offer load (closed loop by default).
    pub load: Load,
    /// Regions whose coordinators take the clients (empty: every region).
    pub client_regions: Vec<meridian_core::RegionId>,
    /// A restarted node's clock comes back this far behind.
    pub restart_clock_step_back_ns: u64,
    /// The durability oracle's power failure, if any ([`crate::PowerFailure`]).
    pub power_failure: Option<crate::PowerFailure>,
    /// Persist completions held back at random ([`crate::Buggify`]).
    pub buggify: crate::Buggify,
}

/// Event budget of one run, fixed part. A healthy seed takes 50 to 200 events per transaction
/// (3 shards × 3 replicas with faults); the budget is a hundred times that.
pub const EVENTS_BASE: u64 = 1_000_000;
/// Event budget of one run, per transaction.
pub const EVENTS_PER_TXN: u64 = 20_000;

impl SimRunOptions {
    /// Options for one seed with no faults.
    pub fn new(
        protocol: ProtocolKind,
        topology: Topology,
        network: NetworkModel,
        clock: ClockModel,
        seed: u64,
    ) -> Self {
        Self {
            protocol,
            topology,
            network,
            clock,
            clients: 8,
            txns: 200,
            seed,
            faults: Vec::new(),
            time_limit_ns: 3_600 * meridian_core::time::NS_PER_S,
            chaos: Chaos::default(),
            disk_sync_ns: None,
            keep_history: false,
            trace_tail: 0,
            crash_triggers: Vec::new(),
            snapshot_interval_entries: None,
            attempts_max: None,
            limits: Limits::default(),
            protocol_options: ProtocolOptions::default(),
            events_max: None,
            load: Load::Closed,
            client_regions: Vec::new(),
            restart_clock_step_back_ns: 0,
            power_failure: None,
            buggify: crate::Buggify::default(),
        }
    }
}

/// What happened.
#[derive(Clone, Debug)]
pub struct SimRunReport {
    /// The seed.
    pub seed: u64,
    /// Hash of the whole event trace.
    pub trace_hash: u64,
    /// Requests committed.
    pub committed: u64,
    /// Requests ended by a user abort.
    pub user_aborted: u64,
    /// Requests that failed.
    pub failed: u64,
    /// Conflict aborts retried.
    pub retries: u64,
    /// Committed requests that touched more than one shard.
    pub cross_shard: u64,
    /// Median and 99th-percentile latency in virtual ns.
    pub latency_ns_p50: u64,
    /// 99th percentile.
    pub latency_ns_p99: u64,
    /// Virtual time the run took.
    pub virtual_ns: Time,
    /// Every request was answered within the time limit.
    pub live: bool,
    /// Simulator counters.
    pub stats: SimStats,
    /// Invariant verdicts.
    pub checks: Vec<CheckResult>,
    /// The recorded history (elle-cli JSON), when asked for and the workload records one.
    pub history_json: Option<String>,
    /// The last events, when `trace_tail` asked for them.
    pub trace_tail: Vec<String>,
    /// Virtual completion time (since the start) of every committed request, in order.
    pub commit_times_ns: Vec<Time>,
    /// Each live node's protocol counters at the end.
    pub node_counters: BTreeMap<NodeId, Vec<(&'static str, u64)>>,
    /// Every completed request, in completion order, with the wide-area one-way hops on the
    /// causal chain that completed it (half of it is the wide-area round trips it waited for).
    pub completions: Vec<(Completion, u16)>,
    /// Committed requests by commit path.
    pub paths: BTreeMap<CommitPath, u64>,
    /// Requests whose outcome the protocol reported unknown.
    pub indeterminate: u64,
    /// The run stopped at its event budget.
    pub over_budget: bool,
}

impl SimRunReport {
    /// True when the run was live and every check passed.
    pub fn passed(&self) -> bool {
        self.live && self.checks.iter().all(|c| c.passed)
    }
}

/// Runs one seed.
pub fn run(
    options: &SimRunOptions,
    workload: Arc<dyn Workload>,
) -> Result<SimRunReport, ConfigError> {
    options.topology.validate()?;
    options.protocol.check_topology(&options.topology)?;
    options
        .protocol
        .check_workload(&meridian_workloads::sample(workload.as_ref()), &options.topology)?;
    if options.clients == 0 {
        return Err(ConfigError::new("clients must be at least 1"));
    }
    if options.network.regions.len() < options.topology.regions.len() {
        return Err(ConfigError::new("the network model has fewer regions than the topology"));
    }
    options.limits.validate()?;
    Ok(options.protocol.visit(RunSeed { options, workload }))
}

/// Runs one seed with the protocol type chosen at run time.
struct RunSeed<'a> {
    options: &'a SimRunOptions,
    workload: Arc<dyn Workload>,
}

impl ProtocolVisitor for RunSeed<'_> {
    type Output = SimRunReport;
    fn visit<P: Protocol>(self) -> SimRunReport {
        run_with::<P::Node>(self.options, self.workload, |context, disk| {
            // The simulated disk holds only what the node wrote; a log that does not restore
            // is a bug to stop at.
            P::restore(context, disk).unwrap_or_else(|e| panic!("restart failed: {e}"))
        })
    }
}

/// Builds a node from its context and what its disk holds.
type BuildNode<N> = fn(NodeContext, &BTreeMap<Vec<u8>, Vec<u8>>) -> N;

/// Builds the simulator for one seed, runs it until the clients finish (then drains), and
/// checks what it left. Kept as one piece: the setup, the step loop, the drain and the checks
/// share the sim, the checker, the report and the budget, and their order is what a seed's
/// trace hash means; split, they would pass all of that around and blur that order.
fn run_with<N: ProtocolNode>(
    options: &SimRunOptions,
    workload: Arc<dyn Workload>,
    build: BuildNode<N>,
) -> SimRunReport {
    let topology = Arc::new(options.topology.clone());
    let registry = Arc::new(workload.registry());
    let partitioner = Arc::new(workload.partitioner());
    let mut timing = Timing::for_network(options.network.owd_ns_max());
    timing.snapshot_interval_entries =
        options.snapshot_interval_entries.unwrap_or([32, 128, 512][(options.seed % 3) as usize]);
    // Half the seeds snapshot by entry count alone, whatever the state's size: swarms keep
    // taking snapshots every few entries (and installing them) there, while the others, and
    // long runs such as seed 1's, keep the cost of encoding the state per entry flat.
    if (options.seed / 3) % 2 == 1 {
        timing.snapshot_bytes_per_log_byte_max = 0;
    }
    timing.attempts_max = options.attempts_max.unwrap_or(timing.attempts_max);
    let timing_for_drain = timing.clone();
    let seed = options.seed;
    let factory_workload = workload.clone();
    let factory_topology = topology.clone();
    let (limits, protocol_options) = (options.limits, options.protocol_options.clone());
    let factory =
        Box::new(move |id: NodeId, incarnation: u64, disk: &BTreeMap<Vec<u8>, Vec<u8>>| {
            let mut context = NodeContext::new(
                id,
                factory_topology.clone(),
                registry.clone(),
                partitioner.clone(),
                seed,
                timing.clone(),
            );
            context.incarnation = incarnation;
            context.limits = limits;
            context.options = protocol_options.clone();
            // The initial data first, then the replicated log replays on top of it.
            let mut node = build(context, disk);
            for (shard, store) in node.stores_mut() {
                factory_workload.load(shard, store);
            }
            node
        });
    let mut coordinators = topology.coordinators_in(&options.client_regions);
    if coordinators.is_empty() {
        coordinators = topology.coordinators(); // Checked by the callers; never no clients.
    }
    let clients = ClientPool::with_load(
        0,
        (0..options.clients)
            .map(|c| (coordinators[c as usize % coordinators.len()], workload.generator(c, seed)))
            .collect(),
        options.load,
        seed,
    );
    let mut config = SimConfig::new(seed, options.network.clone(), options.clock);
    config.faults = options.faults.clone();
    config.chaos = options.chaos;
    config.trace_tail = options.trace_tail;
    config.crash_triggers = options.crash_triggers.clone();
    config.restart_clock_step_back_ns = options.restart_clock_step_back_ns;
    config.power_failure = options.power_failure.clone();
    config.buggify = options.buggify;
    if let Some(ns) = options.disk_sync_ns {
        config.disk_sync_ns = ns;
    }
    let mut sim = Sim::new(config, &topology, factory, clients);
    let mut checker = workload.checker();
    // Clocks are synchronized when perfect and never stepped back.
    let synced = options.clock.error_ns == 0
        && options.clock.drift_ppm == 0.0
        && options.restart_clock_step_back_ns == 0;
    checker.expect_strict(options.protocol.guarantee(&options.protocol_options).strict(synced));
    let mut report = SimRunReport {
        seed,
        trace_hash: 0,
        committed: 0,
        user_aborted: 0,
        failed: 0,
        retries: 0,
        cross_shard: 0,
        latency_ns_p50: 0,
        latency_ns_p99: 0,
        virtual_ns: 0,
        live: false,
        stats: SimStats::default(),
        checks: Vec::new(),
        history_json: None,
        trace_tail: Vec::new(),
        commit_times_ns: Vec::new(),
        node_counters: BTreeMap::new(),
        completions: Vec::new(),
        paths: BTreeMap::new(),
        indeterminate: 0,
        over_budget: false,
    };
    let mut hops_of: BTreeMap<RequestId, u16> = BTreeMap::new();
    let events_max = options
        .events_max
        .unwrap_or_else(|| EVENTS_BASE.saturating_add(EVENTS_PER_TXN.saturating_mul(options.txns)));
    let mut latencies = Vec::new();
    let mut completed = 0u64;
    let mut stopped = false;
    loop {
        let deadline = sim.elapsed_ns() + STEP_NS;
        let events_left = sim.run_until_or(deadline, STEP_EVENTS_MAX);
        hops_of.extend(sim.take_reply_hops());
        for completion in sim.clients_mut().drain_completions() {
            completed += 1;
            let latency = completion.completed_at - completion.submitted_at;
            latencies.push(latency);
            report.retries += u64::from(completion.outcome.retries);
            let hops = hops_of.remove(&completion.request).unwrap_or(0);
            match &completion.outcome.result {
                TxnResult::Committed => {
                    report.committed += 1;
                    *report.paths.entry(completion.outcome.path).or_default() += 1;
                    report
                        .commit_times_ns
                        .push(completion.completed_at.saturating_sub(crate::SIM_EPOCH_NS));
                    if completion.outcome.shards_touched > 1 {
                        report.cross_shard += 1;
                    }
                }
                TxnResult::UserAborted(_) => report.user_aborted += 1,
                TxnResult::Failed(meridian_core::txn::TxnFailure::Indeterminate(_)) => {
                    report.indeterminate += 1;
                    report.failed += 1;
                }
                TxnResult::Failed(_) => report.failed += 1,
            }
            meridian_workloads::observe_completion(checker.as_mut(), &completion);
            report.completions.push((completion, hops));
        }
        if !stopped && completed >= options.txns {
            sim.clients_mut().stop();
            stopped = true;
        }
        if sim.clients_mut().finished() {
            report.live = true;
            // Clients hear a commit as soon as it is decided; let the decisions reach every
            // participant before the stores are checked, counting from the last planned heal
            // or restart if that is still to come: a replica cut off or down until then
            // catches up only after it. (Virtual time, and so a faulty run's throughput,
            // includes that wait.)
            let last_recovery = options
                .faults
                .iter()
                .filter(|(_, fault)| {
                    matches!(
                        fault,
                        Fault::Heal
                            | Fault::Restart(_)
                            | Fault::Unblock(..)
                            | Fault::DiskDelay(_, 0)
                    )
                })
                .map(|&(at, _)| at)
                .max()
                .unwrap_or(0);
            let drain_from = sim.elapsed_ns().max(last_recovery);
            // A node restarted with its clock stepped back (once per crash) releases what it
            // holds that much later (a tiga leader holds a transaction until its clock passes
            // the timestamp), while its coordinator may have given up on it long before.
            let mut crashes: BTreeMap<NodeId, u64> = BTreeMap::new();
            for (_, fault) in &options.faults {
                if let Fault::Crash(node) = fault {
                    *crashes.entry(*node).or_default() += 1;
                }
            }
            let steps = crashes.values().copied().max().unwrap_or(0);
            // A clock stepped back by scheduled faults holds back the same way: the most any
            // one node was stepped back in all.
            let mut stepped_back: BTreeMap<NodeId, u64> = BTreeMap::new();
            for (_, fault) in &options.faults {
                if let Fault::ClockStep(node, step_ns) = fault {
                    if *step_ns < 0 {
                        *stepped_back.entry(*node).or_default() += step_ns.unsigned_abs();
                    }
                }
            }
            let stepped_back_ns = stepped_back.values().copied().max().unwrap_or(0);
            let clock_behind_ns = steps * options.restart_clock_step_back_ns + stepped_back_ns;
            let drain_until =
                drain_from + DRAIN_TIMEOUTS * timing_for_drain.rpc_timeout_ns + clock_behind_ns;
            let left = events_max.saturating_sub(sim.stats().events);
            sim.run_until_or(drain_until, left);
            report.over_budget = sim.stats().events >= events_max;
            break;
        }
        if sim.stats().events >= events_max {
            report.over_budget = true;
            break;
        }
        if !events_left || sim.elapsed_ns() >= options.time_limit_ns {
            break;
        }
    }
    latencies.sort_unstable();
    let quantile = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    report.latency_ns_p50 = quantile(0.5);
    report.latency_ns_p99 = quantile(0.99);
    report.virtual_ns = sim.elapsed_ns();
    report.trace_hash = sim.trace_hash();
    report.trace_tail = sim.trace_tail();
    report.stats = sim.stats().clone();
    if report.over_budget {
        report.checks.push(CheckResult {
            name: "event-budget".into(),
            passed: false,
            detail: format!(
                "stopped after {} events, the budget for {} transactions (a message storm or a \
                 livelock)",
                sim.stats().events,
                options.txns
            ),
        });
    }
    if !report.live {
        let why = if report.over_budget {
            format!(" (stopped at the budget of {events_max} events)")
        } else {
            String::new()
        };
        // The first few by name, to look for in a trace.
        let named: Vec<String> = sim
            .clients_mut()
            .unanswered_requests()
            .iter()
            .rev()
            .take(3)
            .map(|(client, request, _, at)| {
                let at_ms = at.saturating_sub(crate::SIM_EPOCH_NS) / NS_PER_MS;
                format!("client {client} request {} at {at_ms} ms", request.0)
            })
            .collect();
        report.checks.push(CheckResult {
            name: "liveness".into(),
            passed: false,
            detail: format!(
                "{} requests still outstanding after {} ms of virtual time{why} ({})",
                sim.clients_mut().outstanding(),
                report.virtual_ns / NS_PER_MS,
                named.join(", ")
            ),
        });
    }
    for (client, request, txn, submitted_at) in sim.clients_mut().unanswered_requests() {
        checker.unanswered(client, request, &txn, submitted_at);
    }
    for (index, node) in sim.nodes().iter().enumerate() {
        if let Some(node) = node {
            report.node_counters.insert(NodeId(index as u32), node.counters());
        }
    }
    let stores = leader_stores(&topology, sim.nodes());
    report.checks.extend(checker.check(&stores));
    if topology.replicas > 1 && report.live {
        report.checks.push(replicas_equal(&topology, sim.nodes()));
    }
    if options.keep_history {
        report.history_json = checker.history_json();
    }
    report
}

/// After the drain every live replica of a shard has applied the same log, so every live
/// replica's latest committed state equals that of the first live one.
fn replicas_equal<N: ProtocolNode>(topology: &Topology, nodes: &[Option<N>]) -> CheckResult {
    let mut problems = Vec::new();
    let mut compared = 0;
    for s in 0..topology.shards {
        let shard = ShardId(s);
        let store_of = |slot: u32| {
            let node = topology.replica_node(shard, slot)?;
            let hosted = nodes[node.0 as usize].as_ref()?.stores();
            hosted.into_iter().find(|(hs, _)| *hs == shard).map(|(_, store)| (node, store))
        };
        let mut live = (0..topology.replicas).filter_map(store_of);
        let Some((first_node, first)) = live.next() else { continue };
        for (node, other) in live {
            compared += 1;
            let a: Vec<_> = first.latest_values().map(|(k, v)| (k, &v.value, v.ts)).collect();
            let b: Vec<_> = other.latest_values().map(|(k, v)| (k, &v.value, v.ts)).collect();
            if a != b {
                let differing =
                    a.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
                problems.push(format!(
                    "shard {s}: n{} ({} keys) and n{} ({} keys) differ from key #{differing}",
                    first_node.0,
                    a.len(),
                    node.0,
                    b.len()
                ));
            }
        }
    }
    CheckResult {
        name: "replicas-equal".into(),
        passed: problems.is_empty(),
        detail: if problems.is_empty() {
            format!("{compared} live replicas equal their shard's first live replica")
        } else {
            problems.join("; ")
        },
    }
}

/// One store per shard: that of the first replica (in slot order) whose node is up. After the
/// drain every live replica has applied the whole log (`replicas-equal` checks it).
fn leader_stores<'a, N: ProtocolNode>(
    topology: &Topology,
    nodes: &'a [Option<N>],
) -> Vec<(ShardId, &'a MvccStore)> {
    (0..topology.shards)
        .filter_map(|s| {
            (0..topology.replicas).find_map(|slot| {
                let node = topology.replica_node(ShardId(s), slot)?;
                let hosted = nodes[node.0 as usize].as_ref()?.stores();
                hosted.into_iter().find(|(shard, _)| shard.0 == s)
            })
        })
        .collect()
}
