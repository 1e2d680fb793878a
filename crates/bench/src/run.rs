//! Running experiments: on the embedded in-process cluster, against server processes over TCP,
//! and the server side itself.

use crate::experiment::Experiment;
use crate::stats::{RunStats, Summary};
use crate::timeline::{FaultStarts, Timeline};
use indicatif::{ProgressBar, ProgressStyle};
use meridian_core::fault::FaultSchedule;
use meridian_core::node::ClientDriver;
use meridian_core::time::{NS_PER_MS, NS_PER_S};
use meridian_core::topology::Topology;
use meridian_core::{ConfigError, NodeId, ShardId, Time};
use meridian_node::cluster_file::ClusterFile;
use meridian_node::context::{
    contexts, file_contexts, load_in_parallel, open_storage, panics_of, runtime,
    tcp_cluster_config, BuildNode, ContextBase,
};
use meridian_protocols::{Protocol, ProtocolNode, ProtocolVisitor, Timing};
use meridian_runtime::clock::WallClock;
use meridian_runtime::incarnation;
use meridian_runtime::logstore::DurabilityMode;
use meridian_runtime::node_task::ClusterConfig;
use meridian_runtime::node_task::{Cuts, NodeFailures};
use meridian_runtime::{Cluster, LinkDelays};
use meridian_storage::MvccStore;
use meridian_workloads::clients::{ClientPool, Load, Offered};
use meridian_workloads::{CheckResult, InvariantCheck, Workload};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Set once Ctrl-C or SIGTERM arrived (after [`watch_signals`]): every run ends early and the
/// command stops after writing what finished.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// True once the process was asked to stop.
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Turns Ctrl-C and SIGTERM into [`interrupted`] for the rest of the process (one thread with
/// a small runtime of its own), so that runs stop at their next check and clean up what they
/// started (servers, data directories) instead of dying where they are. Call once, before the
/// first run; without it the signals keep their default action.
pub fn watch_signals() -> Result<(), ConfigError> {
    use tokio::signal::unix::{signal, SignalKind};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ConfigError::new(format!("cannot start the signal watcher: {e}")))?;
    // Installed here, before any run starts, so no signal falls between two runs.
    let (mut interrupt, mut terminate) = runtime
        .block_on(async {
            Ok::<_, std::io::Error>((
                signal(SignalKind::interrupt())?,
                signal(SignalKind::terminate())?,
            ))
        })
        .map_err(|e| ConfigError::new(format!("cannot install signal handlers: {e}")))?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            runtime.block_on(async {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
            });
            INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
            eprintln!(
                "stopping: finishing the current run's clean-up (send SIGKILL to stop at once)"
            );
        })
        .map_err(|e| ConfigError::new(format!("cannot start the signal watcher: {e}")))?;
    Ok(())
}

/// How often the harness drains completions.
const DRAIN_INTERVAL: Duration = Duration::from_millis(100);
/// Longest wait for outstanding requests after the clients stop.
const FINISH_WAIT_NS_MIN: u64 = 10 * NS_PER_S;

/// How long an embedded run settles before its store checks, on a network whose longest
/// one-way delay is `owd_ns_max`: as many RPC timeouts as the simulator drains, so that what
/// was decided is applied before the stores are read.
fn settle_ns(owd_ns_max: u64) -> u64 {
    meridian_sim::runner::DRAIN_TIMEOUTS * Timing::for_network(owd_ns_max).rpc_timeout_ns
}

/// A link's configured and measured one-way delay.
#[derive(Clone, Debug, Serialize)]
pub struct LinkReport {
    /// Sender node.
    pub from: u32,
    /// Receiver node.
    pub to: u32,
    /// Messages measured.
    pub messages: u64,
    /// Configured median (ms): the link model's long-run median.
    pub configured_ms_p50: f64,
    /// Median of the delays the link model drew during this run (ms), when the sender ran in
    /// this process. Differs from the configured median only by the model's own sampling (a
    /// `walk` link wanders slowly) and the FIFO clamp.
    pub drawn_ms_p50: Option<f64>,
    /// Measured median (ms).
    pub measured_ms_p50: f64,
    /// Measured 99th percentile (ms).
    pub measured_ms_p99: f64,
    /// Largest measured (ms).
    pub measured_ms_max: f64,
    /// The emulation's error: measured median minus the drawn median (or the configured one when
    /// the sender ran elsewhere), in ms.
    pub emulation_error_ms: f64,
    /// The emulation error is within 5% or 1 ms of the reference median.
    pub within_tolerance: bool,
    /// The measured median is within 5% or 1 ms of the configured median.
    pub within_tolerance_of_configured: bool,
}

impl From<&LinkDelays> for LinkReport {
    fn from(d: &LinkDelays) -> Self {
        let configured = d.configured_p50_us as f64 / 1e3;
        let measured = d.p50_us as f64 / 1e3;
        let drawn = d.drawn_p50_us.map(|us| us as f64 / 1e3);
        let reference = drawn.unwrap_or(configured);
        let within = |reference: f64| (measured - reference).abs() <= (reference * 0.05).max(1.0);
        Self {
            from: d.from.0,
            to: d.to.0,
            messages: d.count,
            configured_ms_p50: configured,
            drawn_ms_p50: drawn,
            measured_ms_p50: measured,
            measured_ms_p99: d.p99_us as f64 / 1e3,
            measured_ms_max: d.max_us as f64 / 1e3,
            emulation_error_ms: measured - reference,
            within_tolerance: within(reference),
            within_tolerance_of_configured: within(configured),
        }
    }
}

/// Everything a run produced.
#[derive(Clone, Debug, Serialize)]
pub struct RunOutput {
    /// Every parameter of the run.
    pub parameters: serde_json::Value,
    /// The measured numbers.
    pub summary: Summary,
    /// The first failure's reason, if any request failed.
    pub first_failure: Option<String>,
    /// Invariant verdicts.
    pub checks: Vec<CheckResult>,
    /// Why checks did not run, when they did not.
    pub checks_note: Option<String>,
    /// Seconds the bulk load of the embedded cluster's stores took, and the process's peak
    /// resident memory after it (MiB, where the platform tells).
    pub load: Option<LoadReport>,
    /// Per-link delays.
    pub links: Vec<LinkReport>,
    /// Nodes of this process that panicked, with the panic message: the run failed.
    pub node_panics: Vec<String>,
    /// Messages the runtime dropped because a queue was full (an inbox, a TCP writer to an
    /// unreachable or slow peer); the protocols' timeouts recover them.
    pub messages_dropped: u64,
    /// The protocol counters of the nodes this process ran (`Node::counters`), summed over
    /// the nodes, at the end of the run and over all of it (warm-up included): in a `tcp` run
    /// only the coordinators' own. Counters that stayed 0 are left out.
    pub protocol_counters: BTreeMap<String, u64>,
    /// The scheduled faults' actions as carried out, with their times.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub faults_applied: Vec<crate::faults::AppliedFault>,
    /// Messages dropped at links a fault had cut.
    pub messages_cut: u64,
    /// The recorded history (elle-cli JSON) for workloads that record one; written beside
    /// `stats.json` as `history.json`.
    #[serde(skip)]
    pub history_json: Option<String>,
}

impl RunOutput {
    /// Records the nodes' protocol counters, summed, and the summary's figures drawn from
    /// them.
    pub fn set_counters(&mut self, counters: BTreeMap<String, u64>) {
        self.summary.fast_quorum_ratio = crate::stats::fast_quorum_ratio(&counters);
        self.protocol_counters = counters;
    }
}

/// How long the bulk load took and how much memory it left in use.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct LoadReport {
    /// Wall seconds.
    pub seconds: f64,
    /// Peak resident set of the process after the load, MiB (Linux `VmHWM`).
    pub peak_rss_mib: Option<f64>,
}

/// The process's peak resident set size in MiB, from `/proc/self/status` (Linux only).
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

impl RunOutput {
    /// True when every check that ran passed.
    pub fn checks_passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }

    /// Why the run failed before any check: a node panicked, or nothing committed (a
    /// benchmark that measured nothing must not pass its checks vacuously).
    pub fn verdict(&self) -> Result<(), String> {
        if !self.node_panics.is_empty() {
            return Err(self.node_panics.join("; "));
        }
        if self.summary.committed == 0 {
            let why = self.first_failure.as_deref().unwrap_or("no request was answered");
            return Err(format!("no transaction committed in the measurement window ({why})"));
        }
        Ok(())
    }
}

/// Runs `experiment` on an in-process cluster.
pub fn run_embedded(experiment: &Experiment) -> Result<RunOutput, ConfigError> {
    experiment.validate()?;
    let workload: Arc<dyn Workload> =
        Arc::from(meridian_workloads::build(&experiment.workload, &experiment.workload_options)?);
    let topology = Arc::new(experiment.topology()?);
    let rt = runtime()?;
    experiment.protocol.visit(Embedded { rt: &rt, experiment, workload, topology })
}

/// An embedded run with the protocol type chosen at run time.
struct Embedded<'a> {
    rt: &'a tokio::runtime::Runtime,
    experiment: &'a Experiment,
    workload: Arc<dyn Workload>,
    topology: Arc<Topology>,
}

impl ProtocolVisitor for Embedded<'_> {
    type Output = Result<RunOutput, ConfigError>;
    fn visit<P: Protocol>(self) -> Self::Output {
        let Self { rt, experiment, workload, topology } = self;
        rt.block_on(embedded::<P::Node>(experiment, workload, topology, P::restore))
    }
}

/// One pool per coordinator; clients are dealt round the coordinators in contiguous blocks.
/// Each closed-loop client's outstanding requests are clients of their own (independent
/// request streams); an open loop's rate is shared among the pools by their clients.
fn client_pools(
    coordinators: &[NodeId],
    experiment: &Experiment,
    workload: &Arc<dyn Workload>,
    seed: u64,
) -> Vec<(NodeId, Arc<Mutex<ClientPool>>)> {
    let clients = experiment.clients * experiment.outstanding;
    let per = clients / coordinators.len() as u32;
    let extra = clients % coordinators.len() as u32;
    let mut first = 0;
    coordinators
        .iter()
        .enumerate()
        .map(|(index, &node)| {
            let count = per + u32::from((index as u32) < extra);
            let members =
                (first..first + count).map(|c| (node, workload.generator(c, seed))).collect();
            let load = match experiment.load {
                Load::Open { rate_per_s } => {
                    Load::Open { rate_per_s: rate_per_s * f64::from(count) / f64::from(clients) }
                }
                closed => closed,
            };
            let pool = if count == 0 {
                ClientPool::new(first, members) // No clients, no arrivals.
            } else {
                ClientPool::with_load(first, members, load, seed)
            };
            first += count;
            (node, Arc::new(Mutex::new(pool)))
        })
        .collect()
}

/// One embedded run: build and load the nodes (each with its own log when durable), start
/// them, drive the clients with the fault schedule beside them, settle, stop and check.
/// Kept as one piece because every step hands the next what it owns (the cluster, the pools,
/// the checker, the logs) and the order is the run's contract: split, it would pass them all
/// around and hide that order.
async fn embedded<N: ProtocolNode>(
    experiment: &Experiment,
    workload: Arc<dyn Workload>,
    topology: Arc<Topology>,
    build: BuildNode<N>,
) -> Result<RunOutput, ConfigError> {
    // Every node starts fresh (incarnation 0); a scheduled crash restarts it as the next.
    let schedule = experiment.fault_schedule(&topology)?;
    let context = contexts(ContextBase {
        topology: &topology,
        workload: &workload,
        network_owd_ns_max: experiment.network.owd_ns_max(),
        seed: experiment.seed,
        durable: experiment.durability != DurabilityMode::Memory,
        snapshot_interval_entries: experiment.snapshot_interval_entries,
        options: &experiment.protocol_options,
        incarnation: 0,
    });
    let coordinators = experiment.client_coordinators(&topology)?;
    let pools = client_pools(&coordinators, experiment, &workload, experiment.seed);
    // An embedded run starts from empty logs in a scratch directory of its own.
    // Each node logs to a directory of its own, as a server process does: replicas of one
    // shard write the same keys, and a crashed node reopens its own log alone.
    let data_dir = std::env::temp_dir().join(format!("meridian-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let mut nodes = Vec::new();
    let mut storages = BTreeMap::new();
    for id in topology.node_ids() {
        let (storage, durable) = open_storage(
            experiment.durability,
            experiment.log_store,
            Some(&crate::faults::node_dir(&data_dir, id)),
            &crate::faults::identity(id),
        )?;
        if let Some(storage) = storage {
            storages.insert(id, storage);
        }
        nodes.push((id, build(context(id), &durable).map_err(ConfigError::new)?));
    }
    let load_started = Instant::now();
    load_in_parallel(workload.as_ref(), nodes.iter_mut().map(|(_, node)| node));
    let load =
        LoadReport { seconds: load_started.elapsed().as_secs_f64(), peak_rss_mib: peak_rss_mib() };
    let local: Vec<_> = nodes
        .into_iter()
        .map(|(id, node)| {
            let pool = pools.iter().find(|(n, _)| *n == id).map(|(_, p)| p.clone());
            (id, node, pool)
        })
        .collect();
    let config = ClusterConfig {
        topology: topology.clone(),
        network: experiment.network.clone(),
        clock: experiment.clock,
        seed: experiment.seed,
        tcp: None,
        metrics: None,
        storage: None,
        node_storage: storages.clone(),
    };
    let cluster = Cluster::start(config, local)
        .await
        .map_err(|e| ConfigError::new(format!("cannot start the cluster: {e}")))?;
    let mut checker = workload.checker();
    // One process reads one clock; the clock model may skew the nodes' readings.
    let synced = experiment.clock.error_ns == 0 && experiment.clock.drift_ppm == 0.0;
    let guarantee = experiment.protocol.guarantee(&experiment.protocol_options);
    checker.expect_strict(guarantee.strict(synced));
    let failures = cluster.failures();
    let bounds = crate::stats::latency_bounds(
        experiment.protocol,
        &topology,
        &experiment.network,
        &experiment.protocol_options,
    );
    let started = Arc::new(FaultStarts::new(&schedule));
    let start = RunStart::now(&schedule, experiment, &started);
    let rebuild = Arc::new(crate::faults::Rebuild {
        topology: topology.clone(),
        workload: workload.clone(),
        network_owd_ns_max: experiment.network.owd_ns_max(),
        seed: experiment.seed,
        snapshot_interval_entries: experiment.snapshot_interval_entries,
        options: experiment.protocol_options.clone(),
        build,
        durability: experiment.durability,
        log_store: experiment.log_store,
        data_dir: data_dir.clone(),
    });
    let applied = Mutex::new(Vec::new());
    let registry = workload.registry();
    let stats = {
        let faults = crate::faults::carry_out(
            schedule.indexed_actions(&topology),
            (start.clock, start.start_ns),
            &cluster,
            storages,
            rebuild,
            (&applied, &started),
        );
        let driving =
            drive(experiment, &pools, checker.as_mut(), &failures, &registry, bounds, start);
        tokio::pin!(faults, driving);
        // The schedule runs beside the load; a run that ends early (a panic, an interrupt)
        // leaves the rest of it undone.
        let mut faults_done = schedule.is_empty();
        loop {
            tokio::select! {
                stats = &mut driving => break stats,
                () = &mut faults, if !faults_done => faults_done = true,
            }
        }
    };
    if checker.needs_stores() && failures.panics().is_empty() && !interrupted() {
        // A client hears a commit once it is decided, which may be before every participant
        // applied it (tiga's leaders apply a multi-shard transaction's writes once every
        // vote is in; a vote dropped at a full queue is sent again on the next pace). The
        // stores are checked once those have settled, as the simulator drains before its
        // checks.
        tokio::time::sleep(Duration::from_nanos(settle_ns(experiment.network.owd_ns_max()))).await;
    }
    let dropped = cluster.dropped_messages();
    let cut = cluster.cuts().dropped();
    let results = cluster.stop().await;
    let stores: Vec<(ShardId, &MvccStore)> = leader_stores(&topology, &results);
    let checks = checker.check(&stores);
    let links = results.iter().flat_map(|r| r.delays.iter()).map(LinkReport::from).collect();
    let mut out = output(experiment, "embedded", &workload, &stats, checks, None, links);
    note_offered(&mut out, &pools);
    out.set_counters(counters_total(results.iter().map(|r| r.node.counters())));
    let received: u64 = results.iter().map(|r| r.messages_received).sum();
    out.summary.deliveries_per_commit =
        (stats.committed_all > 0).then(|| received as f64 / stats.committed_all as f64);
    out.load = Some(load);
    out.messages_dropped = dropped;
    out.messages_cut = cut;
    out.faults_applied = applied.into_inner().unwrap_or_default();
    out.node_panics = panics_of(&failures);
    if experiment.durability != DurabilityMode::Memory {
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    out.history_json = checker.history_json();
    Ok(out)
}

fn leader_stores<'a, N: ProtocolNode>(
    topology: &Topology,
    results: &'a [meridian_runtime::NodeResult<N>],
) -> Vec<(ShardId, &'a MvccStore)> {
    (0..topology.shards)
        .filter_map(|s| {
            let shard = ShardId(s);
            // The live node that says it leads the shard (followers may lag), else the first
            // live replica (a crashed one's stores are as it left them).
            let named = results.iter().find(|r| r.up && r.node.leads(shard)).map(|r| r.id);
            let live = |&n: &meridian_core::NodeId| results.iter().any(|r| r.id == n && r.up);
            let first_live = || topology.shard_nodes(shard).into_iter().find(live);
            let leader = named.or_else(first_live)?;
            let result = results.iter().find(|r| r.id == leader)?;
            result.node.stores().into_iter().find(|(hosted, _)| *hosted == shard)
        })
        .collect()
}

/// When a run started (on its clock), and its timeline when it has scheduled faults.
struct RunStart {
    clock: WallClock,
    start_ns: u64,
    timeline: Option<Timeline>,
}

impl RunStart {
    /// Now, with a timeline of `experiment`'s whole run when `schedule` has faults (which
    /// take effect at the times `started` learns).
    fn now(schedule: &FaultSchedule, experiment: &Experiment, started: &Arc<FaultStarts>) -> Self {
        let faults = schedule.faults().iter().map(|f| (f.text.clone(), f.at_ns)).collect();
        Self::with_faults(faults, experiment, started)
    }

    /// Now, with a timeline when `faults` (each its line and planned start) are given.
    fn with_faults(
        faults: Vec<(String, Time)>,
        experiment: &Experiment,
        started: &Arc<FaultStarts>,
    ) -> Self {
        let clock = WallClock::new();
        let start_ns = clock.now_ns();
        let run_ns = ((experiment.warmup_s + experiment.duration_s) * 1e9) as u64;
        let timeline = (!faults.is_empty())
            .then(|| Timeline::with_faults(start_ns, run_ns, faults, started.clone()));
        Self { clock, start_ns, timeline }
    }
}

/// Runs the clients for warm-up plus duration, then stops them and waits for what is
/// outstanding. Stops early when a node panics: the run has failed. `bounds`: the protocol's
/// latency bound per coordinator ([`crate::stats::latency_bounds`]).
async fn drive(
    experiment: &Experiment,
    pools: &[(NodeId, Arc<Mutex<ClientPool>>)],
    checker: &mut dyn InvariantCheck,
    failures: &NodeFailures,
    registry: &meridian_core::txn::Registry,
    bounds: BTreeMap<NodeId, (String, u64)>,
    run: RunStart,
) -> RunStats {
    let RunStart { clock, start_ns: start, timeline } = run;
    let window_start = start + (experiment.warmup_s * 1e9) as u64;
    let window_end = window_start + (experiment.duration_s * 1e9) as u64;
    let mut stats = RunStats::new(window_start, window_end);
    stats.name_types(registry);
    stats.set_latency_bounds(experiment.shards, bounds);
    if let Some(timeline) = timeline {
        stats.set_timeline(timeline);
    }
    let mut cpu_at_window_start = None;
    let bar = progress_bar(experiment.warmup_s + experiment.duration_s, experiment.progress);
    let mut collect = |stats: &mut RunStats| {
        for (_, pool) in pools {
            let completions = pool.lock().expect("client lock").drain_completions();
            for completion in completions {
                stats.add(&completion, completion.wan_hops);
                meridian_workloads::observe_completion(checker, &completion);
            }
        }
    };
    while clock.now_ns() < window_end && failures.panics().is_empty() && !interrupted() {
        tokio::time::sleep(DRAIN_INTERVAL).await;
        if cpu_at_window_start.is_none() && clock.now_ns() >= window_start {
            cpu_at_window_start = Some(process_cpu_ns());
        }
        collect(&mut stats);
        let elapsed_s = (clock.now_ns() - start) as f64 / 1e9;
        bar.set_position((elapsed_s * 10.0) as u64);
        bar.set_message(format!("{} committed in window", stats.committed));
    }
    if let (Some(Some(start)), Some(end)) = (cpu_at_window_start, process_cpu_ns()) {
        stats.set_cpu_ns(end.saturating_sub(start));
    }
    if let Some(mib) = peak_rss_mib() {
        stats.set_peak_rss_mib(mib);
    }
    for (_, pool) in pools {
        pool.lock().expect("client lock").stop();
    }
    let owd_ns_max = experiment.network.owd_ns_max();
    let finish_deadline =
        clock.now_ns() + FINISH_WAIT_NS_MIN.max(8 * Timing::for_network(owd_ns_max).rpc_timeout_ns);
    while !pools.iter().all(|(_, p)| p.lock().expect("client lock").finished())
        && clock.now_ns() < finish_deadline
        && failures.panics().is_empty()
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
        collect(&mut stats);
    }
    collect(&mut stats);
    for (_, pool) in pools {
        for (client, request, txn, at) in pool.lock().expect("client lock").unanswered_requests() {
            checker.unanswered(client, request, &txn, at);
        }
    }
    // Clients hear a commit once it is decided; give the decisions time to reach participants.
    tokio::time::sleep(Duration::from_nanos(3 * owd_ns_max + 50 * NS_PER_MS)).await;
    bar.finish_and_clear();
    stats
}

/// CPU time (user and system, every thread) this process has used, from `/proc/self/stat`
/// (in clock ticks of 10 ms: Linux reports them at 100 per second); `None` elsewhere.
fn process_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces; the fields after it are separated by single spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks * 10_000_000)
}

/// The run's progress bar (hidden when `show` is false), in tenths of a second of `total_s`.
pub fn progress_bar(total_s: f64, show: bool) -> ProgressBar {
    let bar =
        if show { ProgressBar::new((total_s * 10.0).ceil() as u64) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {percent:>3}% {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

fn output(
    experiment: &Experiment,
    mode: &str,
    workload: &Arc<dyn Workload>,
    stats: &RunStats,
    checks: Vec<CheckResult>,
    checks_note: Option<String>,
    links: Vec<LinkReport>,
) -> RunOutput {
    let parameters = serde_json::json!({
        "mode": mode,
        "protocol": experiment.protocol.name(),
        "protocol_options": experiment
            .protocol_options
            .iter()
            .map(|(name, value)| (name.to_string(), serde_json::Value::String(value.to_string())))
            .collect::<serde_json::Map<_, _>>(),
        "workload": workload.describe(),
        "shards": experiment.shards,
        "replicas": experiment.replicas,
        "network": {
            "name": experiment.network.name,
            "regions": experiment.network.regions,
            "owd_ms_max": experiment.network.owd_ns_max() as f64 / 1e6,
        },
        "clock": experiment.clock.name,
        "durability": experiment.durability.name(),
        "log_store": experiment.log_store.name(),
        "load": experiment.load_description(),
        "clients": experiment.clients,
        "outstanding": experiment.outstanding,
        "server_regions": experiment.server_regions,
        "replica_placement": experiment.replica_placement.name(),
        "client_regions": experiment.client_regions,
        "rate_per_s": match experiment.load {
            Load::Open { rate_per_s } => serde_json::json!(rate_per_s),
            Load::Closed => serde_json::Value::Null,
        },
        "duration_s": experiment.duration_s,
        "warmup_s": experiment.warmup_s,
        "seed": experiment.seed,
        "faults": experiment.faults,
        "zipf_theta": experiment.workload_options.zipf_theta,
        "keys_per_shard": experiment.workload_options.keys_per_shard,
        "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "meridian_version": env!("CARGO_PKG_VERSION"),
        "provenance": crate::provenance::provenance(),
    });
    RunOutput {
        parameters,
        summary: stats.summary(),
        first_failure: stats.first_failure.clone(),
        checks,
        checks_note,
        load: None,
        links,
        messages_dropped: 0,
        node_panics: Vec::new(),
        protocol_counters: BTreeMap::new(),
        faults_applied: Vec::new(),
        messages_cut: 0,
        history_json: None,
    }
}

/// Open loop: the arrivals the pools drew and shed, in the parameters (`offered`).
fn note_offered(out: &mut RunOutput, pools: &[(NodeId, Arc<Mutex<ClientPool>>)]) {
    let mut total: Option<Offered> = None;
    for (_, pool) in pools {
        if let Some(o) = pool.lock().expect("client lock").offered() {
            let t = total.get_or_insert_with(Offered::default);
            t.arrived += o.arrived;
            t.shed += o.shed;
        }
    }
    if let Some(t) = total {
        out.parameters["offered"] = serde_json::json!({ "arrived": t.arrived, "shed": t.shed });
    }
}

/// Sums the protocol counters of several nodes by name, leaving out those that are 0.
pub fn counters_total(
    nodes: impl IntoIterator<Item = Vec<(&'static str, u64)>>,
) -> BTreeMap<String, u64> {
    let mut total = BTreeMap::new();
    for (name, value) in nodes.into_iter().flatten().filter(|&(_, v)| v > 0) {
        *total.entry(name.to_string()).or_default() += value;
    }
    total
}

/// Runs the clients of `experiment` in this process against the servers of a cluster file.
/// The file's coordinator nodes are hosted here; every other node must already be running.
pub fn run_cluster(file: &ClusterFile, experiment: &Experiment) -> Result<RunOutput, ConfigError> {
    let hooks = ClusterHooks {
        on_started: Box::new(|_| {}),
        faults: Vec::new(),
        fault_starts: Arc::new(FaultStarts::with_count(0)),
    };
    run_cluster_with(file, experiment, hooks).map(|(out, _)| out)
}

/// What a fault injector outside the harness needs of a run against server processes.
pub struct ClusterHooks {
    /// Told, once the coordinators run, the link cuts of this process (the injector cuts the
    /// coordinators' own links with them); the run starts then.
    pub on_started: Box<dyn FnOnce(Arc<Cuts>) + Send>,
    /// The injector's faults (line, planned start from the run's start), for the run's
    /// timeline and each fault's recovery figures; none: no timeline.
    pub faults: Vec<(String, Time)>,
    /// When each of them took effect, as the injector marks it (a slot per fault).
    pub fault_starts: Arc<FaultStarts>,
}

/// [`run_cluster`] with `hooks`, handing back the workload's checker with everything it
/// observed (a caller may check the servers' stores with it afterwards).
pub fn run_cluster_with(
    file: &ClusterFile,
    experiment: &Experiment,
    hooks: ClusterHooks,
) -> Result<(RunOutput, Box<dyn InvariantCheck>), ConfigError> {
    let workload: Arc<dyn Workload> =
        Arc::from(meridian_workloads::build(&file.workload, &file.workload_options)?);
    let topology = Arc::new(file.topology.clone());
    let coordinators = topology.coordinators();
    if let Some(node) =
        coordinators.iter().find(|n| !topology.nodes[n.0 as usize].replicas.is_empty())
    {
        return Err(ConfigError::new(format!(
            "node {node} both coordinates and hosts replicas; with --cluster, coordinators run in the bench process and must host none"
        )));
    }
    // The coordinators' certificates are read and checked before anything starts.
    let tls = meridian_node::tls::load(file, &coordinators)?;
    let rt = runtime()?;
    let run = (workload, topology, hooks, tls);
    file.protocol.visit(Remote { rt: &rt, file, experiment, run })
}

/// A run against server processes with the protocol type chosen at run time.
struct Remote<'a> {
    rt: &'a tokio::runtime::Runtime,
    file: &'a ClusterFile,
    experiment: &'a Experiment,
    run: RemoteRun,
}

/// What a run against server processes takes beside the file and the experiment: the
/// workload, the layout, the fault injector's hooks and the coordinators' TLS sessions.
type RemoteRun =
    (Arc<dyn Workload>, Arc<Topology>, ClusterHooks, Option<Arc<meridian_runtime::tls::Tls>>);

impl ProtocolVisitor for Remote<'_> {
    type Output = Result<(RunOutput, Box<dyn InvariantCheck>), ConfigError>;
    fn visit<P: Protocol>(self) -> Self::Output {
        let Self { rt, file, experiment, run } = self;
        rt.block_on(remote::<P::Node>(file, experiment, run, P::restore))
    }
}

async fn remote<N: ProtocolNode>(
    file: &ClusterFile,
    experiment: &Experiment,
    (workload, topology, hooks, tls): RemoteRun,
    build: BuildNode<N>,
) -> Result<(RunOutput, Box<dyn InvariantCheck>), ConfigError> {
    // Coordinators host no replicas: nothing of theirs is logged, and their incarnation comes
    // from the clock (see `meridian_runtime::incarnation`).
    let context = file_contexts(file, &topology, &workload, false, incarnation::from_clock());
    let coordinators = experiment.client_coordinators(&topology)?;
    let pools = client_pools(&coordinators, experiment, &workload, file.seed);
    let empty = BTreeMap::new();
    let mut local = Vec::new();
    for (id, pool) in &pools {
        local.push((
            *id,
            build(context(*id), &empty).map_err(ConfigError::new)?,
            Some(pool.clone()),
        ));
    }
    let config = tcp_cluster_config(file, &topology, &workload, tls);
    let cluster = Cluster::start(config, local)
        .await
        .map_err(|e| ConfigError::new(format!("cannot start the coordinators: {e}")))?;
    let ClusterHooks { on_started, faults, fault_starts } = hooks;
    on_started(cluster.cuts());
    let mut checker = workload.checker();
    // The servers may run on other machines, whose clocks are never exactly in step.
    checker.expect_strict(file.protocol.guarantee(&file.protocol_options).strict(false));
    let failures = cluster.failures();
    // The links' delays are the machines' own here: no configured bound to compare with.
    let bounds = BTreeMap::new();
    let start = RunStart::with_faults(faults, experiment, &fault_starts);
    let registry = workload.registry();
    let stats =
        drive(experiment, &pools, checker.as_mut(), &failures, &registry, bounds, start).await;
    let dropped = cluster.dropped_messages();
    let results = cluster.stop().await;
    let links = results.iter().flat_map(|r| r.delays.iter()).map(LinkReport::from).collect();
    // Checks of the recorded history need only what the clients saw; checks of the stores
    // cannot run here, because the stores live in the server processes.
    let (checks, note) = if checker.needs_stores() {
        let note = "the shard stores live in the server processes; store checks run in embedded and simulated runs";
        (Vec::new(), Some(note.to_string()))
    } else {
        (checker.check(&[]), None)
    };
    let mut out = output(experiment, "tcp", &workload, &stats, checks, note, links);
    note_offered(&mut out, &pools);
    out.set_counters(counters_total(results.iter().map(|r| r.node.counters())));
    out.messages_dropped = dropped;
    out.node_panics = panics_of(&failures);
    out.history_json = checker.history_json();
    Ok((out, checker))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::RunStats;

    fn output(committed: bool, panics: &[&str]) -> RunOutput {
        let mut stats = RunStats::new(0, 1_000_000_000);
        if committed {
            let completion = meridian_workloads::clients::Completion {
                client: 0,
                coordinator: NodeId(0),
                request: meridian_core::RequestId(1),
                txn: meridian_core::txn::TxnRequest {
                    proc: meridian_core::txn::ProcId(0),
                    args: vec![],
                },
                submitted_at: 10,
                completed_at: 20,
                outcome: meridian_core::txn::TxnOutcome {
                    result: meridian_core::txn::TxnResult::Committed,
                    ..meridian_core::txn::TxnOutcome::failed(
                        meridian_core::txn::TxnFailure::RetriesExhausted,
                    )
                },
                wan_hops: None,
            };
            stats.add(&completion, None);
        }
        RunOutput {
            parameters: serde_json::Value::Null,
            summary: stats.summary(),
            first_failure: None,
            checks: vec![CheckResult { name: "x".into(), passed: true, detail: String::new() }],
            checks_note: None,
            load: None,
            links: Vec::new(),
            node_panics: panics.iter().map(|p| p.to_string()).collect(),
            messages_dropped: 0,
            protocol_counters: BTreeMap::new(),
            faults_applied: Vec::new(),
            messages_cut: 0,
            history_json: None,
        }
    }

    #[test]
    fn a_run_with_a_panicked_node_or_no_commit_fails_whatever_its_checks_say() {
        assert_eq!(output(true, &[]).verdict(), Ok(()));
        let panicked = output(true, &["node n1 panicked: boom"]).verdict().unwrap_err();
        assert!(panicked.contains("boom"), "{panicked}");
        let idle = output(false, &[]).verdict().unwrap_err();
        assert!(idle.contains("no transaction committed"), "{idle}");
        assert!(output(false, &[]).checks_passed(), "the checks alone would have passed");
    }
}
