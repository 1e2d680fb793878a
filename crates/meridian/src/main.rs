//! `meridian`: compare distributed-transaction protocols (`bench`), hunt for bugs in the
//! deterministic simulator (`sim`), and run nodes of a real cluster (`server`).
//!
//! Exit codes: 0 success; 1 a run finished but an invariant check failed; 2 bad input (nothing
//! was started).

use clap::{Args, Parser, Subcommand};
use meridian_bench::run::{run_cluster, run_embedded};
use meridian_bench::Experiment;
use meridian_bench::{report, study};
use meridian_core::clock::ClockModel;
use meridian_core::netmodel::NetworkModel;
use meridian_core::topology::Placement;
use meridian_core::ConfigError;
use meridian_node::cluster_file::{load_network, ClusterFile};
use meridian_node::run_server;
use meridian_protocols::ProtocolKind;
use meridian_runtime::logstore::{DurabilityMode, LogStoreKind};
use meridian_workloads::clients::Load;
use meridian_workloads::WorkloadOptions;
use std::path::PathBuf;

/// `println!` that ignores a closed stdout (`meridian sim --seeds 0..9 | head`): the command
/// goes on and exits with its own status instead of panicking on a broken pipe.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `print!` with the same behaviour as [`say!`].
macro_rules! say_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

mod certcmd;
mod clustercmd;
mod experiment_file;
mod kvcmd;
mod nemesis;
mod presets;
mod simcmd;
use std::process::ExitCode;

/// mimalloc instead of the system allocator: messages are allocated on one worker thread and
/// freed on another, which glibc malloc handles poorly (about a quarter of the embedded
/// benchmark's time went to it).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay`'s place in mimalloc's `mi_option_e` in the version Cargo.lock pins
/// (libmimalloc-sys 0.1.49, mimalloc v3; its Rust binding names no constant for it).
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

unsafe extern "C" {
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}

/// Keeps the memory mimalloc frees instead of handing it back to the kernel after its default
/// 10 ms, unless `MIMALLOC_PURGE_DELAY` is set. A node's messages and versions are freed in
/// bursts and allocated again at once, so purged pages were faulted in and zeroed again: a
/// seventh of the embedded Tiga benchmark's CPU went to those page faults, and keeping the
/// memory made it 13% faster (docs/notebook/2026-11-29.md). The price is that a process's
/// resident memory stays at its high-water mark.
fn keep_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: `mi_option_set` only stores a value in mimalloc's option table, which mimalloc
    // reads when it decides whether to purge; it is called before any other thread exists.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, -1) }
}

#[derive(Parser)]
#[command(
    name = "meridian",
    version,
    about = "Geo-distributed transactional KV store and protocol testbed"
)]
struct Cli {
    /// Log level for servers and diagnostics (error, warn, info, debug, trace).
    #[arg(long, global = true, default_value = "warn")]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a benchmark: an embedded in-process cluster by default, or `--cluster FILE`.
    Bench(BenchArgs),
    /// Run one seed in the deterministic simulator and print the outcome and trace hash, or a
    /// swarm of seeds (`--seeds A..B`), with faults drawn from each seed (`--faults`).
    Sim(SimArgs),
    /// Check a recorded history for serializability anomalies.
    Check(CheckArgs),
    /// Start, stop or inspect a local multi-process cluster (one `server` per replica node).
    Cluster(ClusterCmdArgs),
    /// Run one node of the cluster described by a cluster file until interrupted.
    Server(ServerArgs),
    /// Rebuild a stopped server's state from its data directory, as a restart would, and run
    /// the workload's store checks on it.
    Verify(VerifyArgs),
    /// Regenerate a results folder's report.md and plots from its stats.json files, or put
    /// two folders side by side (`--compare A B`).
    Report(ReportArgs),
    /// Run an interactive transaction against a running cluster: `kv --config FILE txn
    /// "get a; put a 1; commit"` (or statements on standard input, one per line).
    Kv(kvcmd::KvArgs),
    /// Start a cluster of server processes, run a checking workload through it while a seeded
    /// schedule of faults (crash, pause, partition, clock, disk) hits the processes, then heal
    /// and check that no acknowledged commit was lost and no anomaly appeared.
    Nemesis(nemesis::NemesisArgs),
    /// Make a test CA and a certificate per node of a cluster file, for mutual TLS.
    Cert(certcmd::CertArgs),
}

#[derive(Args)]
struct ReportArgs {
    /// The results folder (holding stats.json or runs/*/stats.json).
    #[arg(required_unless_present = "compare")]
    dir: Option<PathBuf>,
    /// Two results folders: their runs side by side, matched by name, with ratios B / A.
    #[arg(long, num_args = 2, value_names = ["A", "B"], conflicts_with = "dir")]
    compare: Vec<PathBuf>,
}

fn report_cmd(args: &ReportArgs) -> Result<(), Failure> {
    let load = |dir: &PathBuf| -> Result<Vec<study::SavedRun>, Failure> {
        let runs = study::load_runs(dir).map_err(ConfigError::new)?;
        Ok(runs.into_iter().map(|(_, r)| r).collect())
    };
    if let [a, b] = args.compare.as_slice() {
        say!("A: {}\nB: {}", a.display(), b.display());
        say_raw!("{}", study::compare(&load(a)?, &load(b)?));
        return Ok(());
    }
    let dir = args.dir.as_ref().ok_or_else(|| ConfigError::new("give a results folder"))?;
    let runs = load(dir)?;
    say_raw!("{}", study::runs_table(&runs));
    let path = study::write_report(dir, &runs)
        .map_err(|e| Failure::Run(format!("cannot write the report: {e}")))?;
    say!("report: {}", path.display());
    Ok(())
}

#[derive(Args)]
struct VerifyArgs {
    /// The cluster file.
    #[arg(long)]
    config: PathBuf,
    /// The node whose data directory this is.
    #[arg(long)]
    node: u32,
    /// The data directory (of a stopped server).
    #[arg(long)]
    data_dir: PathBuf,
}

/// Flags shared by `bench` and `sim` that describe the cluster and workload.
#[derive(Args, Clone)]
pub(crate) struct ClusterArgs {
    /// Protocol: occ, 2pl, 2pc-mvto, mako, tiga, luigi, chain (`docs/protocols/` describes
    /// each); `bench` also takes postgres (a PostgreSQL server runs the transactions;
    /// `docs/postgres.md`).
    #[arg(long)]
    protocol: Option<String>,
    /// Workload: micro-luigi, micro-tiga, bank, smallbank, retwis, ycsb-a..f, tpcc, list-append,
    /// rw-register, scan-count.
    #[arg(long)]
    workload: Option<String>,
    /// Number of shards.
    #[arg(long)]
    shards: Option<u32>,
    /// Replicas per shard.
    #[arg(long)]
    replicas: Option<u32>,
    /// Regions for the uniform network presets (lan, metro, continent, cross-continent, geo).
    #[arg(long)]
    regions: Option<usize>,
    /// Network preset (lan, metro, continent, cross-continent, geo, tiga-wan, crossstitch-1/2/3)
    /// or a matrix file (path ending in .toml).
    #[arg(long)]
    network: Option<String>,
    /// Clock preset: perfect, chrony, ntp, bad.
    #[arg(long)]
    clock: Option<String>,
    /// Keys per shard (micro workloads).
    #[arg(long)]
    keys_per_shard: Option<u64>,
    /// Zipf skew in (0, 1); uniform key choice when absent.
    #[arg(long)]
    zipf: Option<f64>,
    /// Most operations per transaction (list-append, rw-register: 1..=64, default 4; YCSB:
    /// operations per transaction, 1..=16, default 1).
    #[arg(long)]
    ops_max: Option<u32>,
    /// YCSB's request distribution: zipfian, uniform, latest or hotspot (default: the
    /// workload's).
    #[arg(long)]
    distribution: Option<String>,
    /// crossstitch-synthetic: order each transaction's operations so that those on shards of
    /// one region come together, for the standard layout over G server regions (shard s in
    /// region s mod G); the default alternates shards operation by operation.
    #[arg(long)]
    region_groups: Option<u32>,
    /// TPC-C: warehouses on each shard (default 1).
    #[arg(long)]
    warehouses_per_shard: Option<u64>,
    /// TPC-C: percent of order lines supplied by another warehouse (default 1, the spec's).
    #[arg(long)]
    remote_item_pct: Option<u64>,
    /// TPC-C: percent of payments for another warehouse's customer (default 15, the spec's).
    #[arg(long)]
    remote_payment_pct: Option<u64>,
    /// TPC-C: spec (the five transactions, 1% rollback) or paper-compat (NewOrder only, no
    /// rollback).
    #[arg(long)]
    tpcc_mode: Option<String>,
    /// TPC-C: spec (the specification's table sizes) or small (a hundredth of the customers
    /// and items; for simulation).
    #[arg(long)]
    tpcc_scale: Option<String>,
    /// Clients, spread over the coordinators (under an open loop: the most requests in flight).
    #[arg(long)]
    clients: Option<u32>,
    /// How clients offer load: closed (each submits again when answered) or open (Poisson
    /// arrivals at --rate, latency counted from each arrival).
    #[arg(long)]
    load: Option<String>,
    /// Open loop: mean arrivals per second, over all clients.
    #[arg(long)]
    rate: Option<f64>,
    /// Closed loop: requests each client keeps outstanding (default 1).
    #[arg(long)]
    outstanding: Option<u32>,
    /// Regions that host replicas, comma-separated (default: every region of the network);
    /// the others hold coordinators only.
    #[arg(long, value_delimiter = ',')]
    server_regions: Vec<String>,
    /// Regions whose coordinators take the clients, comma-separated (default: every region).
    #[arg(long, value_delimiter = ',')]
    client_regions: Vec<String>,
    /// Where a shard's replicas go: `spread` (replica r of shard s in server region s + r,
    /// the default) or `local` (every replica of shard s in server region s, beside its
    /// leader).
    #[arg(long)]
    replica_placement: Option<String>,
    /// Master seed.
    #[arg(long)]
    seed: Option<u64>,
    /// A protocol option, NAME=VALUE (repeatable); see `docs/protocols/` for each protocol's
    /// options. `occ-one-round=on|off`, `2pl-policy=no-wait|wound-wait`, `2pc-mvto-read-stamps=prepare|execution`, `2pc-mvto-one-round=on|off`, `chain-replication=overlapped|serial`.
    #[arg(long = "protocol-option", value_name = "NAME=VALUE")]
    protocol_option: Vec<String>,
    /// A scheduled fault (repeatable), times from the start of the run: `crash node=N|leader=S
    /// at=T [restart=T2]`, `isolate node=N at=T until=T2`, `partition regions=A,B|C at=T
    /// until=T2`, `clock node=N at=T step=+50ms`, `disk node=N at=T until=T2 delay=20ms`
    /// (docs/benchmarking.md, "Faults").
    #[arg(long = "fault", value_name = "FAULT")]
    fault: Vec<String>,
}

#[derive(Args, Clone)]
struct BenchArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Measured seconds.
    #[arg(long, default_value_t = 50.0)]
    duration: f64,
    /// Warm-up seconds, discarded.
    #[arg(long, default_value_t = 5.0)]
    warmup: f64,
    /// Folder for results/<timestamp>/stats.json.
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// Drive the servers of this cluster file (started with `meridian server`) instead of an
    /// embedded cluster. The layout, protocol and workload come from the file.
    #[arg(long = "cluster")]
    cluster_file: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Embedded runs: memory (logs in memory only), buffered (written to a scratch log file,
    /// never synced) or fsync (synced once per group commit). Default memory.
    #[arg(long)]
    durability: Option<String>,
    /// Embedded runs: commands each replicated (or durable) shard replica applies between
    /// snapshots of its state. Default 50000; a cluster file sets its own
    /// (`snapshot_interval`).
    #[arg(long = "snapshot-interval")]
    snapshot_interval: Option<u64>,
    /// Embedded runs with durability: the durable store, file (default) or fjall. A cluster
    /// file sets its own (`log_store`).
    #[arg(long = "log-store")]
    log_store: Option<String>,
    /// With --protocol postgres: the server to use (a URL or key=value string); without it
    /// the harness starts a server of its own and removes it afterwards.
    #[arg(long = "pg-url")]
    pg_url: Option<String>,
    /// With --protocol postgres: serializable (default), repeatable-read or read-committed.
    #[arg(long = "pg-isolation")]
    pg_isolation: Option<String>,
    /// Run every protocol (each 2PL policy too) one after another with the other flags, into
    /// one results folder with a report; `meridian bench` with no arguments does this on the
    /// default setup in about two minutes.
    #[arg(long = "all-protocols")]
    all_protocols: bool,
    /// Run the experiment file's runs (every key a bench flag; lists are swept; see
    /// docs/benchmarking.md) into one results folder with a report. Flags given here
    /// override the file.
    #[arg(long, conflicts_with = "preset")]
    experiment: Option<PathBuf>,
    /// Run a built-in experiment reproducing a reference study: luigi-micro, luigi-tpcc,
    /// luigi-cross-shard, tiga-micro, tiga-tpcc, tpcc-new-order, single-node,
    /// crossstitch-latency, crossstitch-3dc, failover (the files under experiments/).
    #[arg(long)]
    preset: Option<String>,
    /// With --experiment or --preset: the file's short version (its [quick] table).
    #[arg(long)]
    quick: bool,
}

#[derive(Args)]
pub(crate) struct SimArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Requests to complete before the clients stop (default 2000 for one seed, 200 per seed
    /// for a swarm).
    #[arg(long)]
    txns: Option<u64>,
    /// Virtual seconds by which every request must be answered.
    #[arg(long, default_value_t = simcmd::TIME_LIMIT_S_DEFAULT)]
    time_limit_s: u64,
    /// Sends of one transaction before its coordinator gives up and reports it indeterminate
    /// (default: the timing's, 1,000): a small value has swarms reach what follows a
    /// coordinator giving up.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    attempts_max: Option<u32>,
    /// Run a swarm over the seeds A..B (B excluded) instead of one `--seed`.
    #[arg(long)]
    seeds: Option<String>,
    /// Draw a fault schedule from each seed: partitions, crashes and restarts, loss,
    /// duplication, reordering, clock skew, slow disks; then a healing phase.
    #[arg(long)]
    faults: bool,
    /// The durability oracle: persist completions held back at random, and, right after one
    /// acknowledged commit drawn from the seed, every node that may crash loses power at once
    /// and restarts from its disk; the acknowledged commit must survive.
    #[arg(long)]
    durability_oracle: bool,
    /// Worker processes for a swarm (default: the number of cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Write the recorded history (elle-cli JSON) of a single-seed run here.
    #[arg(long)]
    history: Option<PathBuf>,
    /// Print the last N events of a single-seed run (a failing run prints its last 40).
    #[arg(long)]
    trace: Option<usize>,
    /// Write the single-seed run's `stats.json` (the shape `bench` writes, with virtual time)
    /// into a new `DIR/<timestamp>/`.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// What `meridian cluster` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ClusterOp {
    /// Start every server of the file that is not running, and wait until each listens.
    Up,
    /// Stop the servers listening on the nodes' addresses (SIGTERM, then SIGKILL).
    Down,
    /// Stop one node's server (--node) and start it again on its data directory.
    Restart,
    /// Report each server: address, process, data directory, metrics.
    Status,
}

#[derive(Args)]
pub(crate) struct ClusterCmdArgs {
    /// up, down or status.
    #[arg(value_enum)]
    op: ClusterOp,
    /// The cluster file.
    #[arg(long)]
    config: PathBuf,
    /// Where process ids, server logs and data go (default: .meridian-<file stem> beside the
    /// file).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Only this node's server (required by restart).
    #[arg(long)]
    node: Option<u32>,
}

#[derive(Args)]
pub(crate) struct CheckArgs {
    /// The history file (elle-cli JSON: an array of operations or one per line).
    history: PathBuf,
    /// History model: list-append or rw-register.
    #[arg(long, default_value = "list-append")]
    model: String,
    /// Consistency model: serializable or strict-serializable.
    #[arg(long, default_value = "strict-serializable")]
    consistency: String,
}

#[derive(Args)]
struct ServerArgs {
    /// The cluster file.
    #[arg(long)]
    config: PathBuf,
    /// This node's id in the file.
    #[arg(long)]
    node: u32,
    /// Serve Prometheus metrics at http://ADDR/metrics (for example 127.0.0.1:9100).
    #[arg(long)]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Where this node keeps its log (created if missing; refused if it belongs to another
    /// cluster or node). Required unless --durability memory.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// fsync (default: a commit is on disk before it counts), buffered (written, not synced:
    /// survives a process crash, not a power loss) or memory (nothing survives a restart).
    #[arg(long, default_value = "fsync")]
    durability: String,
    /// Act out the faults this file states (link cuts, clock offset, disk delay), re-read
    /// every 50 ms: how `meridian nemesis` injects faults into running servers.
    #[arg(long)]
    fault_control: Option<PathBuf>,
}

/// Resolved cluster settings with the defaults applied.
pub(crate) struct Resolved {
    protocol: ProtocolKind,
    protocol_options: meridian_protocols::ProtocolOptions,
    workload: String,
    workload_options: WorkloadOptions,
    shards: u32,
    replicas: u32,
    network: NetworkModel,
    clock: ClockModel,
    clients: u32,
    load: Load,
    outstanding: u32,
    server_regions: Vec<String>,
    client_regions: Vec<String>,
    replica_placement: Placement,
    seed: u64,
    /// `--fault` lines, checked once the layout and the run's length are known.
    faults: Vec<String>,
}

impl ClusterArgs {
    /// The load flags: closed or open loop, and requests outstanding per client.
    fn load(&self) -> Result<(Load, u32), ConfigError> {
        let load = match (self.load.as_deref().unwrap_or("closed"), self.rate) {
            ("closed", None) => Load::Closed,
            ("closed", Some(_)) => {
                return Err(ConfigError::new("--rate applies to --load open"));
            }
            ("open", Some(rate_per_s)) => Load::Open { rate_per_s },
            ("open", None) => {
                return Err(ConfigError::new("--load open needs --rate (arrivals per second)"));
            }
            (other, _) => {
                return Err(ConfigError::new(format!(
                    "--load must be closed or open, got '{other}'"
                )));
            }
        };
        load.validate().map_err(|e| ConfigError::new(format!("--rate: {e}")))?;
        let outstanding = self.outstanding.unwrap_or(1);
        let most = meridian_bench::experiment::OUTSTANDING_MAX;
        if outstanding == 0 || outstanding > most {
            return Err(ConfigError::new(format!(
                "--outstanding must be in 1..={most}, got {outstanding}"
            )));
        }
        if outstanding > 1 && load != Load::Closed {
            return Err(ConfigError::new(
                "--outstanding applies to the closed loop; an open loop's cap on requests in flight is --clients",
            ));
        }
        if let Some(clients) = self.clients {
            let streams = u64::from(clients) * u64::from(outstanding);
            let most = meridian_bench::experiment::CLIENTS_MAX;
            if clients == 0 || streams > u64::from(most) {
                return Err(ConfigError::new(format!(
                    "--clients times --outstanding must be in 1..={most}, got {clients} x {outstanding}"
                )));
            }
        }
        Ok((load, outstanding))
    }

    fn resolve(&self, default_clients: u32) -> Result<Resolved, ConfigError> {
        let protocol = ProtocolKind::parse(self.protocol.as_deref().unwrap_or("occ"))?;
        let pairs = self
            .protocol_option
            .iter()
            .map(|text| meridian_protocols::options::parse_pair(text))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ConfigError::new(format!("--protocol-option: {e}")))?;
        let protocol_options = protocol.options(&pairs)?;
        let network_spec = self.network.as_deref().unwrap_or("geo");
        let named = NetworkModel::preset_has_named_regions(network_spec)
            || network_spec.ends_with(".toml")
            || network_spec.contains('/');
        if named && self.regions.is_some() {
            return Err(ConfigError::new(format!("--regions applies to the uniform presets only; '{network_spec}' names its own regions")));
        }
        let network = load_network(network_spec, self.regions.unwrap_or(3), None)?;
        let clock = ClockModel::preset(self.clock.as_deref().unwrap_or("perfect"))?;
        let shards = self.shards.unwrap_or(2);
        if shards == 0 {
            return Err(ConfigError::new("--shards must be at least 1"));
        }
        if let Some(replicas) = self.replicas.filter(|r| *r > 0 && r.is_multiple_of(2)) {
            return Err(ConfigError::new(format!(
                "--replicas {replicas} is even: it tolerates no more failed replicas than {} would, and a split can leave no majority; use an odd count",
                replicas - 1
            )));
        }
        if let Some(theta) = self.zipf {
            if !(theta > 0.0 && theta < 1.0) {
                return Err(ConfigError::new(format!("--zipf must be in (0, 1), got {theta}")));
            }
        }
        let workload_options = WorkloadOptions {
            shards,
            keys_per_shard: self.keys_per_shard.unwrap_or(100_000),
            zipf_theta: self.zipf,
            ops_max: self.ops_max,
            distribution: self.distribution.clone(),
            region_groups: self.region_groups,
            tpcc: meridian_workloads::tpcc::TpccOptions::from_flags(
                self.warehouses_per_shard,
                self.remote_item_pct,
                self.remote_payment_pct,
                self.tpcc_mode.as_deref(),
                self.tpcc_scale.as_deref(),
            )?,
        };
        Ok(Resolved {
            protocol,
            protocol_options,
            workload: self.workload.clone().unwrap_or_else(|| "micro-luigi".into()),
            workload_options,
            shards,
            replicas: self.replicas.unwrap_or(1),
            network,
            clock,
            clients: self.clients.unwrap_or(default_clients),
            load: self.load()?.0,
            outstanding: self.load()?.1,
            server_regions: self.server_regions.clone(),
            client_regions: self.client_regions.clone(),
            replica_placement: match &self.replica_placement {
                Some(text) => Placement::parse(text)?,
                None => Placement::Spread,
            },
            seed: self.seed.unwrap_or(1),
            faults: self.fault.clone(),
        })
    }

    /// Flags that a cluster file fixes and so must not be given with `--cluster`.
    fn fixed_by_file(&self) -> Option<&'static str> {
        [
            (self.protocol.is_some(), "--protocol"),
            (self.workload.is_some(), "--workload"),
            (self.shards.is_some(), "--shards"),
            (self.replicas.is_some(), "--replicas"),
            (self.regions.is_some(), "--regions"),
            (self.network.is_some(), "--network"),
            (self.clock.is_some(), "--clock"),
            (self.keys_per_shard.is_some(), "--keys-per-shard"),
            (self.zipf.is_some(), "--zipf"),
            (self.ops_max.is_some(), "--ops-max"),
            (self.distribution.is_some(), "--distribution"),
            (self.region_groups.is_some(), "--region-groups"),
            (self.warehouses_per_shard.is_some(), "--warehouses-per-shard"),
            (self.remote_item_pct.is_some(), "--remote-item-pct"),
            (self.remote_payment_pct.is_some(), "--remote-payment-pct"),
            (self.tpcc_mode.is_some(), "--tpcc-mode"),
            (self.tpcc_scale.is_some(), "--tpcc-scale"),
            (self.seed.is_some(), "--seed"),
            (!self.server_regions.is_empty(), "--server-regions"),
            (self.replica_placement.is_some(), "--replica-placement"),
            (!self.protocol_option.is_empty(), "--protocol-option"),
            (!self.fault.is_empty(), "--fault (faults in --cluster runs are not built yet)"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }
}

/// Why the command stopped.
pub(crate) enum Failure {
    /// Bad input; nothing started.
    Input(ConfigError),
    /// A run finished but something failed.
    Run(String),
}

impl From<ConfigError> for Failure {
    fn from(error: ConfigError) -> Self {
        Self::Input(error)
    }
}

/// The embedded run that `args` and the resolved cluster settings describe.
fn embedded_experiment(
    args: &BenchArgs,
    r: Resolved,
    duration_s: f64,
    warmup_s: f64,
) -> Result<Experiment, ConfigError> {
    let experiment = Experiment {
        protocol: r.protocol,
        protocol_options: r.protocol_options,
        workload: r.workload,
        workload_options: r.workload_options,
        shards: r.shards,
        replicas: r.replicas,
        network: r.network,
        clock: r.clock,
        clients: r.clients,
        outstanding: r.outstanding,
        load: r.load,
        server_regions: r.server_regions,
        client_regions: r.client_regions,
        replica_placement: r.replica_placement,
        duration_s,
        warmup_s,
        seed: r.seed,
        faults: r.faults,
        out_dir: args.out.clone(),
        progress: !args.quiet,
        durability: DurabilityMode::parse(args.durability.as_deref().unwrap_or("memory"))
            .map_err(ConfigError::new)?,
        snapshot_interval_entries: args
            .snapshot_interval
            .unwrap_or(meridian_protocols::SNAPSHOT_INTERVAL_ENTRIES),
        log_store: LogStoreKind::parse(args.log_store.as_deref().unwrap_or("file"))
            .map_err(|e| ConfigError::new(format!("--log-store: {e}")))?,
    };
    experiment.validate()?;
    Ok(experiment)
}

/// `--protocol-option` pairs, `(name, value)`.
type OptionPairs = Vec<(String, String)>;

/// Seconds of warm-up and of measurement per protocol when `meridian bench` runs with no
/// arguments: the whole comparison takes about three minutes with eight runs.
const COMPARE_WARMUP_S: f64 = 3.0;
const COMPARE_TOTAL_S: f64 = 150.0;
/// Replicas per shard of the comparison `meridian bench` runs with no arguments.
const COMPARE_REPLICAS: u32 = 3;

/// Whether `kind` can run the workload `args` name on their layout (its replica count, too).
fn check_workload_of(args: &BenchArgs, kind: ProtocolKind) -> Result<(), ConfigError> {
    let mut probe = args.clone();
    probe.cluster.protocol = Some(kind.name().to_string());
    let run = probe.cluster.resolve(1)?;
    let workload = meridian_workloads::build(&run.workload, &run.workload_options)?;
    let topology = meridian_core::topology::Topology::standard(
        run.network.regions.clone(),
        run.shards,
        run.replicas,
    )?;
    kind.check_topology(&topology)?;
    kind.check_workload(&meridian_workloads::sample(workload.as_ref()), &topology)
}

/// `bench --all-protocols` (and `bench` with no arguments): every protocol, with each option
/// setting it is compared under, one after another on the same cluster and workload, into one
/// results folder with a report.
fn bench_all(given: &BenchArgs, default_clients: u32, bare: bool) -> Result<(), Failure> {
    let mut args = given.clone();
    if bare {
        // Replicated, so that what tiga and luigi gain by fusing ordering with replication
        // shows; 2 x 3 on `geo` is the Luigi study's 2-shard 3-replica setting.
        args.cluster.replicas = Some(COMPARE_REPLICAS);
    }
    let args = &args;
    let refused = [
        (args.cluster.protocol.is_some(), "--protocol"),
        (!args.cluster.protocol_option.is_empty(), "--protocol-option"),
        (args.cluster_file.is_some(), "--cluster"),
        (args.pg_url.is_some() || args.pg_isolation.is_some(), "--pg-url/--pg-isolation"),
    ];
    if let Some((_, flag)) = refused.iter().find(|(given, _)| *given) {
        return Err(ConfigError::new(format!(
            "{flag} contradicts --all-protocols, which runs every protocol"
        ))
        .into());
    }
    // (label, protocol name, its option settings)
    let mut runs: Vec<(String, String, OptionPairs)> = Vec::new();
    for &kind in ProtocolKind::ALL {
        let info = kind.info();
        // A protocol that cannot run the workload (tiga: one-shot transactions only) or the
        // layout (chain: one replica per shard) is left out, and says why.
        if let Err(why) = check_workload_of(args, kind) {
            say!("{} left out: {why}", info.name);
            continue;
        }
        for set in info.compare {
            let pairs: Vec<(String, String)> =
                set.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
            let label = std::iter::once(info.name.to_string())
                .chain(set.iter().map(|(_, v)| v.to_string()))
                .collect::<Vec<_>>()
                .join("-");
            runs.push((label, info.name.to_string(), pairs));
        }
    }
    // PostgreSQL joins where it can run: one node, no emulated distance.
    let lan = args.cluster.network.as_deref() == Some("lan");
    if lan && args.cluster.replicas.unwrap_or(1) == 1 {
        let postgres_ok = meridian_pg::server::find_bindir().and_then(|_| {
            let mut pg = args.clone();
            pg.cluster.protocol = Some("postgres".into());
            postgres_experiment(&pg, default_clients).map(|_| ()).map_err(|e| e.to_string())
        });
        match postgres_ok {
            Ok(()) => runs.push(("postgres".into(), "postgres".into(), Vec::new())),
            Err(why) => say!("postgres left out: {why}"),
        }
    }
    let (duration_s, warmup_s) = if bare {
        // At least 5 s each, however many protocols there come to be.
        ((COMPARE_TOTAL_S / runs.len() as f64 - COMPARE_WARMUP_S).max(5.0), COMPARE_WARMUP_S)
    } else {
        (args.duration, args.warmup)
    };
    // Every run is checked before any starts.
    let mut plans = Vec::with_capacity(runs.len());
    for (label, protocol, pairs) in &runs {
        let mut run_args = args.clone();
        run_args.cluster.protocol = Some(protocol.clone());
        run_args.cluster.protocol_option = pairs.iter().map(|(n, v)| format!("{n}={v}")).collect();
        (run_args.duration, run_args.warmup) = (duration_s, warmup_s);
        plans.push((label, plan_run(&run_args, default_clients)?));
    }
    let folder = new_folder(&args.out, "compare");
    let mut saved = Vec::with_capacity(runs.len());
    let mut failures = Vec::new();
    for (index, (label, plan)) in plans.iter().enumerate() {
        if meridian_bench::run::interrupted() {
            failures.push(format!("interrupted before {label}"));
            break;
        }
        say!(
            "[{}/{}] {label}: {warmup_s:.1} s warm-up, {duration_s:.1} s measured",
            index + 1,
            runs.len(),
        );
        let mut output = match execute(plan) {
            Ok(output) => output,
            Err(error) => {
                failures.push(format!("{label}: {error}"));
                say!("  failed: {error}");
                continue;
            }
        };
        if meridian_bench::run::interrupted() {
            // Cut short: its figures would understate the window. Not kept.
            failures.push(format!("interrupted during {label} (not kept)"));
            break;
        }
        output.parameters["label"] = serde_json::Value::String(label.to_string());
        if let Some(why) = keep_run(&folder, index, label, &output, &mut saved)? {
            failures.push(format!("{label}: {why}"));
        }
    }
    write_series_report(&folder, &saved)?;
    if !failures.is_empty() {
        return Err(Failure::Run(failures.join("; ")));
    }
    Ok(())
}

/// Writes a finished run of a series into `folder/runs/` and adds it to `saved`; returns why
/// the run failed (a node panic, no commit, a failed check), if it did.
fn keep_run(
    folder: &std::path::Path,
    index: usize,
    label: &str,
    output: &meridian_bench::run::RunOutput,
    saved: &mut Vec<study::SavedRun>,
) -> Result<Option<String>, Failure> {
    let failed = match output.verdict() {
        Err(why) => Some(why),
        Ok(()) if !output.checks_passed() => Some("an invariant check failed".to_string()),
        Ok(()) => None,
    };
    let dir = folder.join("runs").join(run_dir_name(index, label));
    study::write_run(&dir, output)
        .map_err(|e| Failure::Run(format!("cannot write results: {e}")))?;
    saved.push(study::SavedRun::load(&dir.join("stats.json")).map_err(Failure::Run)?);
    Ok(failed)
}

/// Prints the table of a series' finished runs and writes its report (nothing when none
/// finished).
fn write_series_report(folder: &std::path::Path, saved: &[study::SavedRun]) -> Result<(), Failure> {
    if !saved.is_empty() {
        say_raw!("{}", study::runs_table(saved));
        let report = study::write_report(folder, saved)
            .map_err(|e| Failure::Run(format!("cannot write the report: {e}")))?;
        say!("report: {}", report.display());
    }
    Ok(())
}

/// A run, checked and ready to start.
enum Planned {
    /// `--protocol postgres`.
    Postgres(meridian_pg::PgExperiment),
    /// `--cluster FILE`: clients here, servers elsewhere.
    Cluster(Box<ClusterFile>, Experiment),
    /// The embedded cluster.
    Embedded(Experiment),
}

/// Checks the flags of one run and says what it will run; nothing starts.
fn plan_run(args: &BenchArgs, default_clients: u32) -> Result<Planned, ConfigError> {
    let postgres = args.cluster.protocol.as_deref() == Some("postgres");
    if !postgres {
        if let Some(flag) =
            [(args.pg_url.is_some(), "--pg-url"), (args.pg_isolation.is_some(), "--pg-isolation")]
                .into_iter()
                .find_map(|(given, flag)| given.then_some(flag))
        {
            return Err(ConfigError::new(format!("{flag} applies to --protocol postgres only")));
        }
    }
    Ok(match &args.cluster_file {
        _ if postgres => Planned::Postgres(postgres_experiment(args, default_clients)?),
        Some(path) => {
            if args.durability.is_some() {
                return Err(ConfigError::new(
                    "--durability contradicts --cluster: each server sets its own",
                ));
            }
            if args.log_store.is_some() {
                return Err(ConfigError::new(
                    "--log-store contradicts --cluster: the cluster file sets it (log_store)",
                ));
            }
            if args.snapshot_interval.is_some() {
                return Err(ConfigError::new(
                    "--snapshot-interval contradicts --cluster: the cluster file sets it \
                     (snapshot_interval)",
                ));
            }
            if let Some(flag) = args.cluster.fixed_by_file() {
                return Err(ConfigError::new(format!(
                    "{flag} contradicts --cluster: the cluster file sets it"
                )));
            }
            let file = ClusterFile::load(path)?;
            let (load, outstanding) = args.cluster.load()?;
            let experiment = Experiment::for_cluster(
                &file,
                meridian_bench::experiment::ClusterLoad {
                    clients: args.cluster.clients.unwrap_or(default_clients),
                    outstanding,
                    load,
                    client_regions: args.cluster.client_regions.clone(),
                    duration_s: args.duration,
                    warmup_s: args.warmup,
                    out_dir: args.out.clone(),
                    progress: !args.quiet,
                },
            );
            validate_times(&experiment)?;
            experiment.validate()?;
            Planned::Cluster(Box::new(file), experiment)
        }
        None => {
            let r = args.cluster.resolve(default_clients)?;
            Planned::Embedded(embedded_experiment(args, r, args.duration, args.warmup)?)
        }
    })
}

/// Runs a planned run.
fn execute(planned: &Planned) -> Result<meridian_bench::run::RunOutput, ConfigError> {
    match planned {
        Planned::Postgres(experiment) => meridian_pg::run(experiment),
        Planned::Cluster(file, experiment) => run_cluster(file, experiment),
        Planned::Embedded(experiment) => run_embedded(experiment),
    }
}

/// A new results folder `out/<UTC time>-<name>` (with a suffix if that exists).
fn new_folder(out: &std::path::Path, name: &str) -> PathBuf {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let stamp = report::utc_stamp(now);
    let mut folder = out.join(format!("{stamp}-{name}"));
    for suffix in 2.. {
        if !folder.exists() {
            break;
        }
        folder = out.join(format!("{stamp}-{name}-{suffix}"));
    }
    folder
}

/// A run's folder name: its number and label, safe in file names.
fn run_dir_name(index: usize, label: &str) -> String {
    let safe: String = label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || ".=,-".contains(c) { c } else { '_' })
        .take(80)
        .collect();
    format!("{:05}-{safe}", index + 1)
}

/// `(name for messages, file text, its reference file's name and text if any)`.
type ExperimentSource<'a> = (&'a str, &'a str, Option<(String, String)>);

/// Checks a reference file against the full grid of the experiment file `text` (whatever
/// `--quick` or the command line narrows it to), naming the first cell off the grid.
fn check_reference(
    source: &str,
    text: &str,
    (name, reference): &(String, String),
) -> Result<(), ConfigError> {
    let parsed =
        meridian_bench::reference::Reference::parse(reference, name).map_err(ConfigError::new)?;
    let full = experiment_file::parse(text, source, &Default::default(), false, None)
        .map_err(ConfigError::new)?;
    let grid: Vec<Vec<String>> = full.points.iter().map(|p| p.args.clone()).collect();
    parsed.check_grid(&grid).map_err(|e| ConfigError::new(format!("{name}: {e}")))
}

/// `bench --experiment FILE`: every run of the file, each checked before any starts
/// ([`plan_experiment`]), then run and kept one by one (the per-run work lives in `execute`
/// and `keep_run`), and the series report written over the runs kept.
fn bench_experiment(
    args: &BenchArgs,
    (source, text, reference): ExperimentSource<'_>,
    default_clients: u32,
) -> Result<(), Failure> {
    if args.all_protocols || args.cluster_file.is_some() {
        return Err(ConfigError::new(
            "--experiment runs the file's points; --all-protocols and --cluster belong in it or on their own",
        )
        .into());
    }
    let cli = own_flags();
    let given = experiment_file::keys_given(&cli);
    let file =
        experiment_file::parse(text, source, &given, args.quick, args.cluster.protocol.as_deref())
            .map_err(ConfigError::new)?;
    if let Some(reference) = &reference {
        check_reference(source, text, reference)?;
    }
    let planned = plan_experiment(source, &file, &cli, default_clients)?;
    let folder = new_folder(&args.out, &file.name);
    if let Some((_, reference)) = &reference {
        std::fs::create_dir_all(&folder)
            .and_then(|()| std::fs::write(folder.join(study::REFERENCE_FILE), reference))
            .map_err(|e| Failure::Run(format!("cannot write {}: {e}", folder.display())))?;
    }
    let total_s: f64 = planned.iter().map(|(_, _, seconds, _)| seconds).sum();
    let started = std::time::Instant::now();
    let (mut saved, mut failures) = (Vec::new(), Vec::new());
    let mut planned_done_s = 0.0;
    for (index, (point, repetition, seconds, plan)) in planned.iter().enumerate() {
        if meridian_bench::run::interrupted() {
            failures.push(format!("interrupted before run {}", index + 1));
            break;
        }
        let label = match repetition {
            Some(k) => format!("{} #{k}", point.label),
            None => point.label.clone(),
        };
        // Remaining planned time, stretched by how much longer than planned the runs so far
        // took (loads, stops).
        let stretch = if planned_done_s > 0.0 {
            started.elapsed().as_secs_f64() / planned_done_s
        } else {
            1.0
        };
        let eta_s = (total_s - planned_done_s) * stretch.max(1.0);
        say!(
            "[{}/{}] {label} (ETA {}:{:02})",
            index + 1,
            planned.len(),
            (eta_s / 60.0) as u64,
            (eta_s % 60.0) as u64
        );
        planned_done_s += seconds;
        let mut output = match execute(plan) {
            Ok(output) => output,
            Err(error) => {
                failures.push(format!("run {} '{label}': {error}", index + 1));
                say!("  failed: {error}");
                continue;
            }
        };
        if meridian_bench::run::interrupted() {
            // Cut short: its figures would understate the window. Not kept.
            failures.push(format!("interrupted during run {} '{label}' (not kept)", index + 1));
            break;
        }
        output.parameters["label"] = serde_json::Value::String(point.label.clone());
        if let Some(k) = repetition {
            output.parameters["repetition"] = (*k).into();
        }
        if let Some(why) = keep_run(&folder, index, &label, &output, &mut saved)? {
            failures.push(format!("run {} '{label}': {why}", index + 1));
        }
    }
    write_series_report(&folder, &saved)?;
    if !failures.is_empty() {
        return Err(Failure::Run(format!(
            "{} of {} runs failed (the others' results are kept): {}",
            failures.len(),
            planned.len(),
            failures.join("; ")
        )));
    }
    Ok(())
}

/// This command line's own flags (all but `--experiment FILE`, `--preset NAME` and
/// `--quick`), which override the experiment file's keys.
fn own_flags() -> Vec<String> {
    let mut cli: Vec<String> = Vec::new();
    let mut words = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .skip_while(|a| a != "bench")
        .skip(1);
    while let Some(word) = words.next() {
        match word.as_str() {
            "--experiment" | "--preset" => {
                words.next();
            }
            "--quick" => {}
            w if w.starts_with("--experiment=") || w.starts_with("--preset=") => {}
            _ => cli.push(word),
        }
    }
    cli
}

/// One planned run of an experiment file: its point, its repetition (from 1, when the file
/// repeats its runs), its planned seconds (warm-up included) and its plan.
type PlannedRun<'a> = (&'a experiment_file::Point, Option<u64>, f64, Planned);

/// Plans every run of `file` (each point `file.repetitions` times, with the command line's
/// own flags `cli` after the point's), so that a bad one fails before any starts.
fn plan_experiment<'a>(
    source: &str,
    file: &'a experiment_file::ExperimentFile,
    cli: &[String],
    default_clients: u32,
) -> Result<Vec<PlannedRun<'a>>, Failure> {
    let mut planned = Vec::with_capacity(file.points.len());
    for point in &file.points {
        let argv = ["meridian", "bench"]
            .into_iter()
            .map(String::from)
            .chain(point.args.clone())
            .chain(cli.to_vec());
        let bad = |why: String| ConfigError::new(format!("{source}: run '{}': {why}", point.label));
        let parsed = Cli::try_parse_from(argv).map_err(|e| {
            bad(e
                .render()
                .to_string()
                .lines()
                .next()
                .unwrap_or("bad flags")
                .trim_start_matches("error: ")
                .to_string())
        })?;
        let Command::Bench(run_args) = parsed.command else {
            return Err(bad("not a bench run".into()).into());
        };
        for repetition in 0..file.repetitions {
            let mut rep_args = run_args.clone();
            if file.repetitions > 1 && rep_args.cluster_file.is_none() {
                // Repetitions differ in their seed: seed, seed + 1, ...
                rep_args.cluster.seed =
                    Some(run_args.cluster.seed.unwrap_or(1).wrapping_add(repetition));
            }
            let mut plan = plan_run(&rep_args, default_clients).map_err(|e| bad(e.to_string()))?;
            if let Planned::Embedded(experiment) = &mut plan {
                if let Some(floor_s) = experiment.raise_window_to_floor() {
                    say!(
                        "{}: window raised to {floor_s:.1} s, 20 round trips of the slowest link",
                        point.label
                    );
                    rep_args.duration = floor_s;
                }
            }
            let repeated = (file.repetitions > 1).then_some(repetition + 1);
            planned.push((point, repeated, rep_args.duration + rep_args.warmup, plan));
        }
    }
    Ok(planned)
}

fn bench(args: &BenchArgs) -> Result<(), Failure> {
    let default_clients = 96;
    meridian_bench::run::watch_signals()?;
    // `meridian bench` alone is the main job: compare every protocol.
    let bare = std::env::args_os().count() <= 2;
    if let Some(path) = &args.experiment {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(format!("{}: {e}", path.display())))?;
        // FILE.toml's published figures, if any, are FILE.reference.toml beside it.
        let beside = path.with_extension("reference.toml");
        let reference = match std::fs::read_to_string(&beside) {
            Ok(r) => Some((beside.display().to_string(), r)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(ConfigError::new(format!("{}: {e}", beside.display())).into()),
        };
        return bench_experiment(
            args,
            (&path.display().to_string(), &text, reference),
            default_clients,
        );
    }
    if let Some(name) = &args.preset {
        let text = presets::preset(name).map_err(ConfigError::new)?;
        let source = format!("preset {name}");
        let reference =
            presets::reference(name).map(|r| (format!("{source} reference"), r.to_string()));
        return bench_experiment(args, (&source, text, reference), default_clients);
    }
    if args.quick {
        return Err(ConfigError::new("--quick applies to --experiment or --preset").into());
    }
    if args.all_protocols || bare {
        return bench_all(args, default_clients, bare);
    }
    let output = execute(&plan_run(args, default_clients)?)?;
    if meridian_bench::run::interrupted() {
        return Err(Failure::Run("interrupted; nothing written".into()));
    }
    say_raw!("{}", report::table(&output));
    let folder = report::write_results(&args.out, &output)
        .map_err(|e| Failure::Run(format!("cannot write results: {e}")))?;
    say!("results: {}", folder.join("stats.json").display());
    let saved = study::SavedRun::load(&folder.join("stats.json")).map_err(Failure::Run)?;
    study::write_report(&folder, &[saved])
        .map_err(|e| Failure::Run(format!("cannot write the report: {e}")))?;
    if let Err(why) = output.verdict() {
        return Err(Failure::Run(why));
    }
    if !output.checks_passed() {
        let failed: Vec<&str> =
            output.checks.iter().filter(|c| !c.passed).map(|c| c.name.as_str()).collect();
        return Err(Failure::Run(format!("invariant check failed: {}", failed.join(", "))));
    }
    Ok(())
}

/// The run `bench --protocol postgres` asks for: the workload flags as for any protocol, and
/// none of the flags that describe Meridian's own cluster.
fn postgres_experiment(
    args: &BenchArgs,
    default_clients: u32,
) -> Result<meridian_pg::PgExperiment, ConfigError> {
    let c = &args.cluster;
    let refused = [
        (args.cluster_file.is_some(), "--cluster"),
        (c.replicas.is_some_and(|r| r != 1), "--replicas other than 1"),
        (c.regions.is_some_and(|r| r != 1), "--regions other than 1"),
        (c.network.as_deref().is_some_and(|n| n != "lan"), "--network other than lan"),
        (c.clock.is_some(), "--clock"),
        (!c.protocol_option.is_empty(), "--protocol-option (use --pg-isolation)"),
        (!c.fault.is_empty(), "--fault"),
        (args.snapshot_interval.is_some(), "--snapshot-interval"),
        (args.log_store.is_some(), "--log-store"),
    ];
    if let Some((_, flag)) = refused.iter().find(|(given, _)| *given) {
        return Err(ConfigError::new(format!(
            "{flag} does not apply to --protocol postgres: one PostgreSQL server over loopback runs every transaction"
        )));
    }
    // The workload flags resolve as for any protocol; the protocol and network named here
    // only satisfy the resolver (nothing of Meridian's cluster runs).
    let mut cluster = c.clone();
    cluster.protocol = None;
    cluster.network = Some("lan".into());
    cluster.regions = None;
    let r = cluster.resolve(default_clients)?;
    if r.load != Load::Closed || r.outstanding != 1 {
        return Err(ConfigError::new(
            "--protocol postgres runs a closed loop with one request per client (one connection each); \
             --load open and --outstanding are for Meridian's protocols",
        ));
    }
    let experiment = meridian_pg::PgExperiment {
        workload: r.workload,
        workload_options: r.workload_options,
        clients: r.clients,
        duration_s: args.duration,
        warmup_s: args.warmup,
        seed: r.seed,
        progress: !args.quiet,
        durability: DurabilityMode::parse(args.durability.as_deref().unwrap_or("memory"))
            .map_err(ConfigError::new)?,
        isolation: meridian_pg::sql::Isolation::parse(
            args.pg_isolation.as_deref().unwrap_or("serializable"),
        )
        .map_err(ConfigError::new)?,
        url: args.pg_url.clone(),
    };
    check_times(args.duration, args.warmup)?;
    if experiment.clients == 0 || experiment.clients > meridian_pg::CLIENTS_MAX {
        return Err(ConfigError::new(format!(
            "--clients must be in 1..={} with --protocol postgres (one connection each), got {}",
            meridian_pg::CLIENTS_MAX,
            experiment.clients
        )));
    }
    Ok(experiment)
}

/// `--duration` positive, `--warmup` zero or more.
fn check_times(duration_s: f64, warmup_s: f64) -> Result<(), ConfigError> {
    if !(duration_s.is_finite() && duration_s > 0.0) {
        return Err(ConfigError::new(format!("--duration must be positive, got {duration_s}")));
    }
    if !(warmup_s.is_finite() && warmup_s >= 0.0) {
        return Err(ConfigError::new(format!("--warmup must be zero or more, got {warmup_s}")));
    }
    Ok(())
}

fn validate_times(experiment: &Experiment) -> Result<(), ConfigError> {
    check_times(experiment.duration_s, experiment.warmup_s)?;
    if experiment.clients == 0 {
        return Err(ConfigError::new("--clients must be at least 1"));
    }
    Ok(())
}

fn verify(args: &VerifyArgs) -> Result<(), Failure> {
    let file = ClusterFile::load(&args.config)?;
    let (checks, replayed) = meridian_node::verify_data_dir(&file, args.node, &args.data_dir)?;
    say!(
        "node {}: rebuilt to log index {} from {}: {} snapshots installed, then {} committed \
         commands replayed",
        args.node,
        replayed.log_index,
        args.data_dir.display(),
        replayed.snapshots,
        replayed.commands
    );
    for check in &checks {
        say!(
            "check {:<20} {}  {}",
            check.name,
            if check.passed { "PASS" } else { "FAIL" },
            check.detail
        );
    }
    if checks.iter().all(|c| c.passed) {
        Ok(())
    } else {
        Err(Failure::Run("a check failed on the replayed state".into()))
    }
}

fn server(args: &ServerArgs) -> Result<(), Failure> {
    let durability = DurabilityMode::parse(&args.durability).map_err(ConfigError::new)?;
    let file = ClusterFile::load(&args.config)?;
    // The file's metrics address for the node unless the flag gives one.
    let metrics_addr =
        args.metrics_addr.or_else(|| file.metrics_addrs.get(args.node as usize).copied().flatten());
    let settings = meridian_node::ServerSettings {
        node: args.node,
        metrics_addr,
        durability,
        data_dir: args.data_dir.as_deref(),
        fault_control: args.fault_control.as_deref(),
    };
    match run_server(&file, &settings) {
        Ok(()) => Ok(()),
        Err(meridian_node::ServeError::Config(error)) => Err(error.into()),
        Err(meridian_node::ServeError::NodeFailed(why)) => Err(Failure::Run(why)),
    }
}

fn main() -> ExitCode {
    keep_freed_memory();
    let cli = Cli::parse();
    let level = match cli.log_level.parse::<tracing::Level>() {
        Ok(level) => level,
        Err(_) => {
            eprintln!(
                "error: unknown --log-level '{}'; accepted: error, warn, info, debug, trace",
                cli.log_level
            );
            return ExitCode::from(2);
        }
    };
    // Colour codes only for a terminal: a log file or a pipe gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
    let result = match &cli.command {
        Command::Bench(args) => bench(args),
        Command::Sim(args) => simcmd::sim(args),
        Command::Check(args) => simcmd::check_history(args),
        Command::Cluster(args) => clustercmd::cluster(args, &cli.log_level),
        Command::Server(args) => server(args),
        Command::Verify(args) => verify(args),
        Command::Report(args) => report_cmd(args),
        Command::Kv(args) => kvcmd::kv(args),
        Command::Nemesis(args) => nemesis::nemesis(args, &cli.log_level),
        Command::Cert(args) => certcmd::cert(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Input(error)) => {
            eprintln!("error: {error}");
            ExitCode::from(2)
        }
        Err(Failure::Run(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(1)
        }
    }
}
