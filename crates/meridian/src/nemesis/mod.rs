//! `meridian nemesis`: a cluster of real server processes under a seeded schedule of faults
//! while a checking workload runs through coordinators in this process; then everything is
//! healed, the servers settle and stop, and what clients saw and what the servers' data
//! directories hold are checked. The order of a run:
//!
//! 1. the layout: a cluster file given, or 3 shards × 3 replicas generated on loopback
//!    (replica `i` of every shard in region `ri`, the coordinators in a region of their own),
//!    written with the run's files under `--out`;
//! 2. the schedule: `--fault` lines, or drawn from the seed for the kinds of `--faults`
//!    ([`schedule`]), checked before anything starts;
//! 3. the servers start (`fsync` durability, each with a fault-control file);
//! 4. the load runs for `--duration` seconds while a thread carries out the schedule: crash
//!    (`SIGKILL`, then a start on the same data directory), pause (`SIGSTOP`/`SIGCONT`),
//!    partition and isolate (links cut by the runtime's link layer at each sender: the
//!    servers' through their control files, the coordinators' here), clock steps and slow
//!    disks (control files);
//! 5. heal, settle (every shard's replicas at the same applied index, where the protocol
//!    reports one), stop with `SIGTERM`;
//! 6. check ([`verdict`]): the history for the protocol's guarantee, lost acknowledged
//!    writes, replicas equal, the workload's store checks on every replica.
//!
//! Exit status: 0 when nothing was lost and no anomaly found, 1 otherwise, 2 for bad input
//! (nothing started).

mod schedule;
mod servers;
mod verdict;

#[cfg(test)]
mod tests;

use crate::clustercmd::{groups_of, scrape};
use crate::Failure;
use clap::Args;
use meridian_bench::experiment::ClusterLoad;
use meridian_bench::run::{run_cluster_with, ClusterHooks, RunOutput};
use meridian_bench::timeline::FaultStarts;
use meridian_bench::Experiment;
use meridian_core::topology::Topology;
use meridian_core::{ConfigError, NodeId};
use meridian_node::cluster_file::ClusterFile;
use meridian_protocols::ProtocolKind;
use meridian_runtime::node_task::Cuts;
use meridian_workloads::clients::Load;
use schedule::{Plan, Step, Timed};
use servers::Servers;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The workloads whose runs the nemesis can check.
const CHECKING_WORKLOADS: [&str; 3] = ["list-append", "rw-register", "bank"];
/// Longest the servers may take to settle after the heal.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);
/// Coordinators of a generated layout.
const COORDINATORS: u32 = 2;
/// Keys per shard of a generated layout: few, so that transactions contend.
const KEYS_PER_SHARD: u64 = 8;
/// Where a generated layout's certificates go in the run's folder.
const CERTS_DIR: &str = "certs";
/// Days they are valid.
const CERT_DAYS: u32 = 30;
/// Largest layout generated (servers started on this machine).
const GENERATED_NODES_MAX: u32 = 64;

/// `meridian nemesis`'s flags.
#[derive(Args)]
pub struct NemesisArgs {
    /// Run the servers of this cluster file (its coordinator nodes run in this process and
    /// must host no replicas) instead of a generated layout.
    #[arg(long, conflicts_with_all = ["protocol", "shards", "replicas", "workload"])]
    config: Option<PathBuf>,
    /// The protocol of a generated layout.
    #[arg(long, required_unless_present = "config")]
    protocol: Option<String>,
    /// Shards of a generated layout.
    #[arg(long, default_value_t = 3)]
    shards: u32,
    /// Replicas per shard of a generated layout.
    #[arg(long, default_value_t = 3)]
    replicas: u32,
    /// The checking workload of a generated layout: list-append, rw-register or bank.
    #[arg(long, default_value = "list-append")]
    workload: String,
    /// Seconds of load, faults included (the last 6 without faults).
    #[arg(long, default_value_t = 30)]
    duration: u64,
    /// The seed the schedule is drawn from.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The fault kinds to draw: crash, pause, partition, clock, disk.
    #[arg(long, default_value = "crash,pause,partition,clock,disk")]
    faults: String,
    /// A fault line instead of a drawn schedule (repeatable): the lines of `bench --fault`
    /// (crash, isolate, partition, clock, disk) and `pause node=N|leader=S at=T until=T2`.
    #[arg(long = "fault", conflicts_with = "faults")]
    fault: Vec<String>,
    /// Accept `--fault` crashes the layout cannot survive by design (a shard's majority down
    /// for good), to see how the cluster fails; refused otherwise.
    #[arg(long)]
    allow_unsurvivable: bool,
    /// Closed-loop clients, one request in flight each.
    #[arg(long, default_value_t = 16)]
    clients: u32,
    /// Mutual TLS between the generated layout's nodes (a test CA and a certificate per node
    /// are made in the run's folder); without it the layout says `insecure = true`.
    #[arg(long, conflicts_with = "config")]
    tls: bool,
    /// Where the run's folder (cluster file, data directories, logs, report) is made.
    #[arg(long, default_value = "results")]
    out: PathBuf,
}

/// Runs `meridian nemesis`; servers log at `log_level`.
pub fn nemesis(args: &NemesisArgs, log_level: &str) -> Result<(), Failure> {
    if args.duration < schedule::DURATION_S_MIN {
        return Err(ConfigError::new(format!(
            "--duration {}: at least {} s (faults start after {} s and stop {} s before the end)",
            args.duration,
            schedule::DURATION_S_MIN,
            schedule::FIRST_FAULT_S,
            schedule::QUIET_TAIL_S
        ))
        .into());
    }
    if args.clients == 0 {
        return Err(ConfigError::new("--clients must be at least 1").into());
    }
    let kinds = schedule::parse_kinds(&args.faults)?;
    // Everything is checked before the folder is made or a server started.
    let (file_text, name) = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ConfigError::new(format!("{}: {e}", path.display())))?;
            (text, path.file_stem().map_or("cluster".into(), |s| s.to_string_lossy().into_owned()))
        }
        None => {
            let protocol = args.protocol.as_deref().unwrap_or_default();
            (generated_layout(args, protocol)?, format!("nemesis-{protocol}-seed{}", args.seed))
        }
    };
    let base = args.config.as_deref().and_then(Path::parent);
    let file = ClusterFile::parse("cluster file", &file_text, base)?;
    if !CHECKING_WORKLOADS.contains(&file.workload.as_str()) {
        return Err(ConfigError::new(format!(
            "workload '{}': the nemesis checks {} only",
            file.workload,
            CHECKING_WORKLOADS.join(", ")
        ))
        .into());
    }
    let topology = &file.topology;
    if topology.coordinators().iter().any(|n| !topology.nodes[n.0 as usize].replicas.is_empty()) {
        return Err(ConfigError::new(
            "a coordinator node hosts replicas: the nemesis runs coordinators in its own process",
        )
        .into());
    }
    if args.config.is_some() {
        // Every node's certificate is checked before anything starts (a generated layout's
        // are made below).
        let nodes: Vec<NodeId> = topology.node_ids().collect();
        meridian_node::tls::load(&file, &nodes)?;
    }
    let leaders = file.protocol.initial_leaders(topology, &file.protocol_options);
    let lines = if args.fault.is_empty() {
        schedule::draw(&kinds, topology, args.duration, args.seed)
    } else {
        args.fault.clone()
    };
    let run_ns = schedule::run_ns(args.duration);
    let plan = Plan::parse(&lines, (topology, &leaders), run_ns, args.allow_unsurvivable)?;
    let experiment = experiment(&file, args)?;
    let folder = crate::new_folder(&args.out, &name);
    std::fs::create_dir_all(&folder)
        .map_err(|e| ConfigError::new(format!("{}: {e}", folder.display())))?;
    // A given file is used where it is (its relative paths, a network matrix or
    // certificates, resolve beside it); a generated one is written into the run's folder.
    let config = match &args.config {
        Some(path) => path.clone(),
        None => {
            let config = folder.join("cluster.toml");
            std::fs::write(&config, &file_text)
                .map_err(|e| ConfigError::new(format!("{}: {e}", config.display())))?;
            if args.tls {
                let nodes: Vec<NodeId> = topology.node_ids().collect();
                crate::certcmd::write_all(&folder.join(CERTS_DIR), &nodes, CERT_DAYS)?;
            }
            config
        }
    };
    let file = ClusterFile::load(&config)?;
    let taken: Vec<u16> = file.addrs.iter().map(SocketAddr::port).collect();
    let ports = free_ports(topology.nodes.len(), &taken)?;
    let server_nodes: Vec<(NodeId, SocketAddr, SocketAddr)> = topology
        .node_ids()
        .filter(|n| !topology.nodes[n.0 as usize].replicas.is_empty())
        .map(|n| {
            let metrics = file.metrics_addrs.get(n.0 as usize).copied().flatten();
            let metrics = metrics.unwrap_or_else(|| ([127, 0, 0, 1], ports[n.0 as usize]).into());
            (n, file.addrs[n.0 as usize], metrics)
        })
        .collect();
    let mut report = Report::new(&folder);
    report.line(&header(&file, args, &folder));
    report.line(&format!("schedule ({} faults):", plan.lines.len()));
    for line in &plan.lines {
        report.line(&format!("  {line}"));
    }
    let mut servers =
        Servers::new(&config, &folder, log_level, server_nodes).map_err(Failure::Run)?;
    for node in servers.nodes() {
        servers.start(node).map_err(Failure::Run)?;
    }
    let outcome = run(&file, &experiment, &plan, servers)?;
    report.finish(&file, args, &plan, outcome)
}

/// What the load, the faults and the checks left.
struct Outcome {
    run: RunOutput,
    applied: Vec<Applied>,
    exited: Vec<String>,
    healed: Vec<String>,
    settled: String,
    stopped: Vec<String>,
    verdict: verdict::Verdict,
}

/// One step as carried out.
struct Applied {
    planned_ms: u64,
    applied_ms: u64,
    fault: usize,
    starts: bool,
    what: String,
    error: Option<String>,
}

/// The load with the faults, then heal, settle, stop and check.
fn run(
    file: &ClusterFile,
    experiment: &Experiment,
    plan: &Plan,
    servers: Servers,
) -> Result<Outcome, Failure> {
    let steps = plan.steps(&file.topology);
    // Each fault's line and planned start, for the run's timeline and recovery figures.
    let faults: Vec<(String, u64)> = plan
        .lines
        .iter()
        .enumerate()
        .map(|(i, line)| {
            let at = steps.iter().find(|s| s.fault == i && s.starts).map_or(0, |s| s.at_ns);
            (line.clone(), at)
        })
        .collect();
    let fault_starts = Arc::new(FaultStarts::with_count(faults.len()));
    let coordinators: Vec<NodeId> = file.topology.coordinators();
    let (cuts_tx, cuts_rx) = std::sync::mpsc::channel::<Arc<Cuts>>();
    let marks = fault_starts.clone();
    let injector =
        std::thread::spawn(move || inject(steps, servers, (&coordinators, &marks), &cuts_rx));
    let hooks = ClusterHooks {
        on_started: Box::new(move |cuts: Arc<Cuts>| {
            let _ = cuts_tx.send(cuts);
        }),
        faults,
        fault_starts,
    };
    let ran = run_cluster_with(file, experiment, hooks);
    let (mut servers, applied) =
        injector.join().map_err(|_| Failure::Run("the fault injector panicked".into()))?;
    let (run, checker) = ran?;
    let mut exited = servers.exited();
    let (healed, unhealed) = servers.heal();
    exited.extend(unhealed.into_iter().map(|why| format!("heal: {why}")));
    let settled = settle(&servers.metrics());
    let stopped = servers.stop_all();
    let dirs: Vec<(NodeId, PathBuf)> =
        servers.nodes().into_iter().map(|n| (n, servers.data_dir(n))).collect();
    // A data directory that does not rebuild is a finding: reported, not a reason to stop.
    let verdict = verdict::judge(file, &dirs, checker.as_ref()).unwrap_or_else(|e| {
        verdict::Verdict { unequal: vec![format!("rebuild: {e}")], ..Default::default() }
    });
    Ok(Outcome { run, applied, exited, healed, settled, stopped, verdict })
}

/// Carries out `steps` from the moment the coordinators run, marking when each fault took
/// effect in `marks`; returns the servers and what was done.
fn inject(
    steps: Vec<Timed>,
    mut servers: Servers,
    (coordinators, marks): (&[NodeId], &FaultStarts),
    cuts: &std::sync::mpsc::Receiver<Arc<Cuts>>,
) -> (Servers, Vec<Applied>) {
    let mut applied = Vec::new();
    // No cuts: the run never started (its error is reported by the load's side).
    let Ok(cuts) = cuts.recv() else { return (servers, applied) };
    let start = Instant::now();
    for Timed { at_ns, fault, starts, step } in steps {
        let due = start + Duration::from_nanos(at_ns);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let (what, result) = match step {
            Step::Kill(node) => (format!("kill -9 {node}"), servers.kill(node)),
            Step::Start(node) => (format!("start {node}"), servers.start(node)),
            Step::Stop(node) => (format!("SIGSTOP {node}"), servers.pause(node, true)),
            Step::Continue(node) => (format!("SIGCONT {node}"), servers.pause(node, false)),
            Step::Cut(from, to, cut) => {
                let verb = if cut { "cut" } else { "restore" };
                let what = format!("{verb} {from} -> {to}");
                if coordinators.contains(&from) {
                    cuts.set(from, to, cut);
                    (what, Ok(()))
                } else {
                    (what, servers.cut(from, to, cut))
                }
            }
            Step::Clock(node, step_ns) => (
                format!("clock {node} {:+} ms", step_ns / 1_000_000),
                servers.step_clock(node, step_ns),
            ),
            Step::Disk(node, delay_ns) => (
                format!("disk {node} +{} ms", delay_ns / 1_000_000),
                servers.slow_disk(node, delay_ns),
            ),
            Step::FailDisk(node, failure) => (
                format!("arm a failing disk ({}) on {node}", failure.name()),
                servers.fail_disk(node, failure),
            ),
            Step::Recover(node) => match servers.recover(node) {
                Ok(found) => (found, Ok(())),
                Err(why) => (format!("recover {node}"), Err(why)),
            },
        };
        if starts && result.is_ok() {
            marks.mark(fault, start.elapsed().as_nanos() as u64);
        }
        applied.push(Applied {
            planned_ms: schedule::ms(at_ns),
            applied_ms: start.elapsed().as_millis() as u64,
            fault,
            starts,
            what,
            error: result.err(),
        });
    }
    (servers, applied)
}

/// Waits (up to [`SETTLE_TIMEOUT`]) until every replica has applied as far as its shard's
/// most advanced replica had when the wait began: everything the load left is everywhere.
/// (Some protocols keep appending entries of their own, watermarks or heartbeats, so equal
/// indexes at one instant are not the test.) Says how it went.
fn settle(metrics: &[(NodeId, SocketAddr)]) -> String {
    let start = Instant::now();
    let mut targets: Option<BTreeMap<u32, u64>> = None;
    let mut last = String::new();
    while start.elapsed() < SETTLE_TIMEOUT {
        let mut by_shard: BTreeMap<u32, Vec<(NodeId, u64)>> = BTreeMap::new();
        let mut unreachable = Vec::new();
        for (node, addr) in metrics {
            match scrape(*addr) {
                Some(page) => {
                    for group in groups_of(&page) {
                        by_shard.entry(group.shard).or_default().push((*node, group.applied));
                    }
                }
                None => unreachable.push(node.to_string()),
            }
        }
        if by_shard.is_empty() && unreachable.is_empty() {
            // The protocol reports no applied index: give the replicas a moment.
            std::thread::sleep(Duration::from_secs(2));
            return "no applied index reported; waited 2 s".into();
        }
        if !unreachable.is_empty() {
            last = format!("metrics unreachable from {}", unreachable.join(", "));
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        let targets = targets.get_or_insert_with(|| {
            by_shard
                .iter()
                .map(|(s, v)| (*s, v.iter().map(|(_, a)| *a).max().unwrap_or(0)))
                .collect()
        });
        let behind: Vec<String> = by_shard
            .iter()
            .filter_map(|(s, v)| {
                let target = targets.get(s).copied().unwrap_or(0);
                let late: Vec<String> = v
                    .iter()
                    .filter(|(_, a)| *a < target)
                    .map(|(n, a)| format!("{n} {a}"))
                    .collect();
                (!late.is_empty()).then(|| format!("shard {s} to {target}: {}", late.join(", ")))
            })
            .collect();
        if behind.is_empty() {
            return format!(
                "every replica applied as far as its shard had at the end of the load after {:.1} s",
                start.elapsed().as_secs_f64()
            );
        }
        last = behind.join("; ");
        std::thread::sleep(Duration::from_millis(200));
    }
    format!("not settled after {} s: {last}", SETTLE_TIMEOUT.as_secs())
}

/// The run's experiment: closed-loop clients on the file's coordinators, no warm-up.
fn experiment(file: &ClusterFile, args: &NemesisArgs) -> Result<Experiment, ConfigError> {
    let experiment = Experiment::for_cluster(
        file,
        ClusterLoad {
            clients: args.clients,
            outstanding: 1,
            load: Load::Closed,
            client_regions: Vec::new(),
            duration_s: args.duration as f64,
            warmup_s: 0.0,
            out_dir: args.out.clone(),
            progress: false,
        },
    );
    experiment.validate()?;
    Ok(experiment)
}

/// The cluster file of a generated layout on loopback.
fn generated_layout(args: &NemesisArgs, protocol: &str) -> Result<String, ConfigError> {
    ProtocolKind::parse(protocol)?;
    let (shards, replicas) = (args.shards, args.replicas);
    let servers =
        shards.checked_mul(replicas).filter(|n| *n >= 1 && n + COORDINATORS <= GENERATED_NODES_MAX);
    let Some(servers) = servers else {
        return Err(ConfigError::new(format!(
            "--shards {shards} --replicas {replicas}: between 1 and {} servers on this machine",
            GENERATED_NODES_MAX - COORDINATORS
        )));
    };
    if !CHECKING_WORKLOADS.contains(&args.workload.as_str()) {
        return Err(ConfigError::new(format!(
            "--workload {}: the nemesis checks {} only",
            args.workload,
            CHECKING_WORKLOADS.join(", ")
        )));
    }
    // A listening port per node and a metrics port per server.
    let ports = free_ports((2 * servers + COORDINATORS) as usize, &[])?;
    let security = if args.tls {
        format!("tls_ca = \"{CERTS_DIR}/ca.pem\"")
    } else {
        "insecure = true".to_string()
    };
    let mut text = format!(
        "protocol = \"{protocol}\"\nworkload = \"{}\"\nshards = {shards}\nreplicas = {replicas}\n\
         network = \"lan\"\n{security}\nregions = {}\nkeys_per_shard = {KEYS_PER_SHARD}\nseed = {}\n\
         snapshot_interval = 256\n",
        args.workload,
        replicas + 1,
        args.seed
    );
    // With TLS, each node's certificate and key (made in the run's folder before it starts).
    let keys = |node: u32| {
        if args.tls {
            format!(
                "tls_cert = \"{CERTS_DIR}/node-{node}.pem\"\ntls_key = \"{CERTS_DIR}/node-{node}.key\"\n"
            )
        } else {
            String::new()
        }
    };
    let mut node = 0;
    for shard in 0..shards {
        for replica in 0..replicas {
            let _ = write!(
                text,
                "\n[[node]]\nid = {node}\nregion = \"r{replica}\"\naddr = \"127.0.0.1:{}\"\nreplicas = [[{shard}, {replica}]]\nmetrics_addr = \"127.0.0.1:{}\"\n{}",
                ports[node as usize],
                ports[(servers + COORDINATORS + node) as usize],
                keys(node)
            );
            node += 1;
        }
    }
    for _ in 0..COORDINATORS {
        let _ = write!(
            text,
            "\n[[node]]\nid = {node}\nregion = \"r{replicas}\"\naddr = \"127.0.0.1:{}\"\ncoordinator = true\n{}",
            ports[node as usize],
            keys(node)
        );
        node += 1;
    }
    Ok(text)
}

/// `count` loopback ports free now, below Linux's ephemeral range (a port handed out for `:0`
/// may be handed out again as the source port of a server's outgoing connection).
fn free_ports(count: usize, taken: &[u16]) -> Result<Vec<u16>, ConfigError> {
    let start = 20_000 + (std::process::id() % 500) * 24;
    let mut ports = Vec::with_capacity(count);
    for offset in 0..12_000u32 {
        if ports.len() == count {
            break;
        }
        let port = (20_000 + (start - 20_000 + offset) % 12_000) as u16;
        if !taken.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
        }
    }
    (ports.len() == count)
        .then_some(ports)
        .ok_or_else(|| ConfigError::new("no free loopback ports in 20000..32000"))
}

fn header(file: &ClusterFile, args: &NemesisArgs, folder: &Path) -> String {
    let t: &Topology = &file.topology;
    format!(
        "nemesis: {} {} {} x {}, {} s, seed {}, {} clients; {}; partitions by the runtime's link layer (each sender drops); files in {}",
        file.protocol.name(),
        file.workload,
        t.shards,
        t.replicas,
        args.duration,
        args.seed,
        args.clients,
        match file.security {
            meridian_node::cluster_file::Security::Insecure => "plain TCP (insecure = true)",
            meridian_node::cluster_file::Security::Tls { .. } => "mutual TLS",
        },
        folder.display()
    )
}

/// The report: printed as it grows and kept in `report.txt`.
struct Report {
    path: PathBuf,
    text: String,
}

impl Report {
    fn new(folder: &Path) -> Self {
        Self { path: folder.join("report.txt"), text: String::new() }
    }

    fn line(&mut self, line: &str) {
        say!("{line}");
        self.text += line;
        self.text.push('\n');
    }

    /// The outcome's lines, the files, and the verdict.
    fn finish(
        mut self,
        file: &ClusterFile,
        args: &NemesisArgs,
        plan: &Plan,
        outcome: Outcome,
    ) -> Result<(), Failure> {
        let Outcome { run, applied, exited, healed, settled, stopped, verdict } = outcome;
        self.applied(plan, &applied);
        self.recovery(&run);
        let s = &run.summary;
        self.line(&format!(
            "operations: acknowledged {}, failed {}, indeterminate {} ({:.0} txn/s over {:.1} s)",
            s.committed,
            s.failed + s.user_aborted,
            s.indeterminate,
            s.throughput_txn_per_s,
            s.window_s
        ));
        if !healed.is_empty() {
            self.line(&format!("healed: {}", healed.join(", ")));
        }
        self.line(&format!("settle: {settled}"));
        let rebuilt: Vec<String> =
            verdict.rebuilt.iter().map(|(n, i)| format!("{n} {i}")).collect();
        self.line(&format!("rebuilt from data directories (log index): {}", rebuilt.join(", ")));
        let mut anomalies = self.checks(&run, &verdict);
        for why in exited.iter().chain(&stopped).chain(&run.node_panics) {
            anomalies.push(why.clone());
        }
        if let Err(why) = run.verdict() {
            anomalies.push(why);
        }
        match &verdict.lost {
            Some(lost) => {
                self.line(&format!("lost {}", lost.len()));
                for item in lost.iter().take(10) {
                    self.line(&format!("  lost: {item}"));
                }
            }
            None => self.line(&format!("lost n/a ({} cannot tell a lost write from an overwritten one; its store checks judge)", file.workload)),
        }
        if anomalies.is_empty() {
            self.line("anomalies: none");
        } else {
            self.line(&format!("anomalies: {}", anomalies.len()));
            for anomaly in &anomalies {
                self.line(&format!("  {anomaly}"));
            }
        }
        self.line(&format!("REPRODUCE: {}", reproduce(args)));
        if let Some(history) = &run.history_json {
            let _ = std::fs::write(self.path.with_file_name("history.json"), history);
        }
        let _ = std::fs::write(&self.path, &self.text);
        let lost = verdict.lost.as_ref().map_or(0, Vec::len);
        if lost > 0 || !anomalies.is_empty() || !verdict.passed() {
            return Err(Failure::Run(format!(
                "{lost} acknowledged writes lost, {} anomalies",
                anomalies.len()
            )));
        }
        Ok(())
    }

    /// One line per fault's start and end (a partition is many link cuts), then the count of
    /// faults injected by kind.
    fn applied(&mut self, plan: &Plan, applied: &[Applied]) {
        let mut injected: BTreeMap<&str, u64> = BTreeMap::new();
        self.line("applied:");
        let mut i = 0;
        while i < applied.len() {
            let first = &applied[i];
            let same = applied[i..]
                .iter()
                .take_while(|a| a.fault == first.fault && a.starts == first.starts)
                .count();
            let group = &applied[i..i + same];
            let errors: Vec<&str> = group.iter().filter_map(|a| a.error.as_deref()).collect();
            if first.starts && errors.is_empty() {
                *injected.entry(plan.kind_of(first.fault)).or_default() += 1;
            }
            let what = if same == 1 {
                first.what.clone()
            } else {
                format!("{} and {} more", first.what, same - 1)
            };
            let failed = if errors.is_empty() {
                String::new()
            } else {
                format!("  FAILED: {}", errors.join("; "))
            };
            self.line(&format!(
                "  {:>6} ms (planned {:>6}) {} '{}': {what}{failed}",
                first.applied_ms,
                first.planned_ms,
                if first.starts { "start" } else { "end" },
                plan.lines.get(first.fault).map_or("?", String::as_str),
            ));
            i += same;
        }
        let kinds: Vec<String> = injected.iter().map(|(k, n)| format!("{k} {n}")).collect();
        self.line(&format!(
            "faults injected: {}",
            if kinds.is_empty() { "none".into() } else { kinds.join(", ") }
        ));
    }

    /// How long after each fault a transaction submitted after it first committed; the
    /// longest of these is the run's worst unavailability.
    fn recovery(&mut self, run: &RunOutput) {
        let Some(timeline) = &run.summary.timeline else { return };
        let measured: Vec<(f64, &str)> = timeline
            .faults
            .iter()
            .filter_map(|f| f.first_commit_s.map(|s| (s, f.fault.as_str())))
            .collect();
        let never = timeline.faults.iter().filter(|f| f.first_commit_s.is_none()).count();
        let Some((worst, line)) =
            measured.iter().copied().reduce(|a, b| if b.0 > a.0 { b } else { a })
        else {
            return;
        };
        let mut sorted: Vec<f64> = measured.iter().map(|(s, _)| *s).collect();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        let unmeasured = if never > 0 {
            format!("; {never} with none before the run ended")
        } else {
            String::new()
        };
        self.line(&format!(
            "recovery: first commit after a fault took effect: median {median:.2} s, longest {worst:.2} s after '{line}'{unmeasured}"
        ));
    }

    /// The check lines; returns the anomalies they found.
    fn checks(&mut self, run: &RunOutput, verdict: &verdict::Verdict) -> Vec<String> {
        let mut anomalies: Vec<String> = Vec::new();
        for check in &run.checks {
            self.line(&format!("history {}: {} {}", check.name, pass(check.passed), check.detail));
            if !check.passed {
                anomalies.push(format!("history {}: {}", check.name, check.detail));
            }
        }
        // The run's note that store checks cannot run against servers does not hold here:
        // they run below, on the rebuilt data.
        if let Some(note) = run.checks_note.as_ref().filter(|_| verdict.checks.is_empty()) {
            self.line(&format!("history: {note}"));
        }
        for (replica, check) in &verdict.checks {
            self.line(&format!(
                "store replica {replica} {}: {} {}",
                check.name,
                pass(check.passed),
                check.detail
            ));
            if !check.passed {
                anomalies.push(format!("replica {replica} {}: {}", check.name, check.detail));
            }
        }
        if verdict.unequal.is_empty() {
            self.line("replicas: every shard's replicas hold the same state");
        }
        for unequal in &verdict.unequal {
            self.line(&format!("replicas: {unequal}"));
            anomalies.push(unequal.clone());
        }
        for (node, behind) in &verdict.lagging {
            self.line(&format!(
                "replica {node} lacks {behind} acknowledged writes its shard's other replicas hold"
            ));
        }
        anomalies
    }
}

fn pass(passed: bool) -> &'static str {
    if passed {
        "PASS"
    } else {
        "FAIL"
    }
}

/// The command line that runs the same schedule again.
fn reproduce(args: &NemesisArgs) -> String {
    let mut words = vec!["meridian nemesis".to_string()];
    match &args.config {
        Some(path) => words.push(format!("--config {}", path.display())),
        None => words.push(format!(
            "--protocol {} --workload {} --shards {} --replicas {}",
            args.protocol.as_deref().unwrap_or_default(),
            args.workload,
            args.shards,
            args.replicas
        )),
    }
    words.push(format!(
        "--duration {} --seed {} --clients {}",
        args.duration, args.seed, args.clients
    ));
    if args.tls {
        words.push("--tls".into());
    }
    if args.allow_unsurvivable {
        words.push("--allow-unsurvivable".into());
    }
    if args.fault.is_empty() {
        words.push(format!("--faults {}", args.faults));
    } else {
        words.extend(args.fault.iter().map(|f| format!("--fault '{f}'")));
    }
    words.join(" ")
}
