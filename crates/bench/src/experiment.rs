//! The settings of one benchmark run, checked before anything starts.

use meridian_core::clock::ClockModel;
use meridian_core::fault::{FaultKind, FaultSchedule};
use meridian_core::netmodel::NetworkModel;
use meridian_core::time::NS_PER_S;
use meridian_core::topology::{region_ids, Topology, REPLICAS_MAX, SHARDS_MAX};
use meridian_core::ConfigError;
use meridian_core::{NodeId, RegionId};
use meridian_protocols::{ProtocolKind, ProtocolOptions};
use meridian_runtime::logstore::DurabilityMode;
use meridian_workloads::WorkloadOptions;
use std::path::PathBuf;

/// Most clients in one run (request streams: clients times outstanding requests each).
pub const CLIENTS_MAX: u32 = 100_000;
/// Most requests one closed-loop client keeps outstanding.
pub const OUTSTANDING_MAX: u32 = 1_024;
/// Longest run (one day).
pub const DURATION_S_MAX: f64 = 86_400.0;
/// Round trips of the slowest link an experiment file's window lasts at least.
pub const WINDOW_FLOOR_ROUND_TRIPS: f64 = 20.0;

/// One benchmark run.
#[derive(Clone, Debug)]
pub struct Experiment {
    /// The protocol.
    pub protocol: ProtocolKind,
    /// The protocol's options (validated for it).
    pub protocol_options: ProtocolOptions,
    /// Workload name.
    pub workload: String,
    /// Workload options (shards, keys, skew).
    pub workload_options: WorkloadOptions,
    /// Shards.
    pub shards: u32,
    /// Replicas per shard.
    pub replicas: u32,
    /// The link model (its regions are the cluster's regions).
    pub network: NetworkModel,
    /// The clock model.
    pub clock: ClockModel,
    /// Clients, spread over the coordinators: each keeps `outstanding` requests in flight
    /// (closed loop), or at most one (open loop: the cap on requests in flight).
    pub clients: u32,
    /// Closed loop: requests each client keeps outstanding (it runs that many independent
    /// request streams). 1 under an open loop.
    pub outstanding: u32,
    /// Closed or open loop.
    pub load: meridian_workloads::clients::Load,
    /// Regions that host replicas (empty: every region of the network).
    pub server_regions: Vec<String>,
    /// Where each shard's replicas go among the server regions.
    pub replica_placement: meridian_core::topology::Placement,
    /// Regions whose coordinators take clients (empty: every region).
    pub client_regions: Vec<String>,
    /// Measured seconds.
    pub duration_s: f64,
    /// Seconds discarded at the start.
    pub warmup_s: f64,
    /// Master seed.
    pub seed: u64,
    /// Scheduled faults, one line each (`meridian_core::fault`), times from the start of the
    /// run (warm-up included).
    pub faults: Vec<String>,
    /// Where `results/<timestamp>/` goes.
    pub out_dir: PathBuf,
    /// Show a progress bar.
    pub progress: bool,
    /// How durable the replicas' logs are (`memory` keeps them in memory only).
    pub durability: meridian_runtime::logstore::DurabilityMode,
    /// The durable store (with durability other than memory).
    pub log_store: meridian_runtime::logstore::LogStoreKind,
    /// Commands each replicated shard replica applies between snapshots.
    pub snapshot_interval_entries: u64,
}

pub use meridian_node::cluster_file::check_snapshot_interval;

/// What a run against the servers of a cluster file sets itself: the file sets the rest.
#[derive(Clone, Debug)]
pub struct ClusterLoad {
    /// Clients.
    pub clients: u32,
    /// Requests each closed-loop client keeps outstanding.
    pub outstanding: u32,
    /// Closed or open loop.
    pub load: meridian_workloads::clients::Load,
    /// Regions whose coordinators take clients (all when empty).
    pub client_regions: Vec<String>,
    /// Measured seconds.
    pub duration_s: f64,
    /// Seconds before the measurement.
    pub warmup_s: f64,
    /// Results folder.
    pub out_dir: PathBuf,
    /// Show a progress bar.
    pub progress: bool,
}

impl Experiment {
    /// The experiment of a run driving the servers of `file` (its protocol, workload, layout,
    /// network, clock, seed and log settings) with `load`. The servers' durability is theirs:
    /// this process logs nothing.
    pub fn for_cluster(file: &meridian_node::cluster_file::ClusterFile, load: ClusterLoad) -> Self {
        let ClusterLoad {
            clients,
            outstanding,
            load,
            client_regions,
            duration_s,
            warmup_s,
            out_dir,
            progress,
        } = load;
        Self {
            protocol: file.protocol,
            protocol_options: file.protocol_options.clone(),
            workload: file.workload.clone(),
            workload_options: file.workload_options.clone(),
            shards: file.topology.shards,
            replicas: file.topology.replicas,
            network: file.network.clone(),
            clock: file.clock,
            clients,
            outstanding,
            load,
            server_regions: Vec::new(),
            client_regions,
            replica_placement: meridian_core::topology::Placement::Spread,
            duration_s,
            warmup_s,
            seed: file.seed,
            faults: Vec::new(),
            out_dir,
            progress,
            durability: DurabilityMode::Memory,
            snapshot_interval_entries: file.snapshot_interval_entries,
            log_store: file.log_store,
        }
    }

    /// One line saying how the load was offered (reports and `stats.json` carry it).
    pub fn load_description(&self) -> String {
        self.load.describe(self.clients, self.outstanding)
    }

    /// Checks the numbers; names the bad one and what is accepted.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.shards == 0 || self.shards > SHARDS_MAX {
            return Err(ConfigError::new(format!(
                "--shards must be in 1..={SHARDS_MAX}, got {}",
                self.shards
            )));
        }
        if self.replicas == 0 || self.replicas > REPLICAS_MAX {
            return Err(ConfigError::new(format!(
                "--replicas must be in 1..={REPLICAS_MAX}, got {}",
                self.replicas
            )));
        }
        self.load.validate().map_err(|e| ConfigError::new(format!("--rate: {e}")))?;
        if self.outstanding == 0 || self.outstanding > OUTSTANDING_MAX {
            return Err(ConfigError::new(format!(
                "--outstanding must be in 1..={OUTSTANDING_MAX}, got {}",
                self.outstanding
            )));
        }
        if self.outstanding > 1 && self.load != meridian_workloads::clients::Load::Closed {
            return Err(ConfigError::new(
                "--outstanding applies to the closed loop; an open loop's cap on requests in flight is --clients",
            ));
        }
        if u64::from(self.clients) * u64::from(self.outstanding) > u64::from(CLIENTS_MAX) {
            return Err(ConfigError::new(format!(
                "--clients {} x --outstanding {} is over {CLIENTS_MAX} request streams",
                self.clients, self.outstanding
            )));
        }
        if self.clients == 0 || self.clients > CLIENTS_MAX {
            return Err(ConfigError::new(format!(
                "--clients must be in 1..={CLIENTS_MAX}, got {}",
                self.clients
            )));
        }
        let seconds_ok = |s: f64| s.is_finite() && (0.0..=DURATION_S_MAX).contains(&s);
        if !seconds_ok(self.duration_s) || self.duration_s == 0.0 {
            return Err(ConfigError::new(format!(
                "--duration must be in (0, {DURATION_S_MAX}] seconds, got {}",
                self.duration_s
            )));
        }
        if !seconds_ok(self.warmup_s) {
            return Err(ConfigError::new(format!(
                "--warmup must be in [0, {DURATION_S_MAX}] seconds, got {}",
                self.warmup_s
            )));
        }
        check_snapshot_interval(self.snapshot_interval_entries)
            .map_err(|e| ConfigError::new(format!("--snapshot-interval: {e}")))?;
        let topology = self.topology()?;
        self.fault_schedule(&topology)?;
        self.client_coordinators(&topology)?;
        self.protocol.check_topology(&topology)?;
        let workload = meridian_workloads::build(&self.workload, &self.workload_options)?;
        self.protocol.check_workload(&meridian_workloads::sample(workload.as_ref()), &topology)?;
        Ok(())
    }

    /// The standard layout over the network's regions, replicas in the server regions.
    pub fn topology(&self) -> Result<Topology, ConfigError> {
        let regions = &self.network.regions;
        let mut servers = region_ids(regions, &self.server_regions, "--server-regions")?;
        if servers.is_empty() {
            servers = (0..regions.len() as u32).map(RegionId).collect();
        }
        let placement = self.replica_placement;
        Topology::placed_with(regions.clone(), &servers, self.shards, self.replicas, placement)
    }

    /// The shortest measurement window an experiment file's run gets: 20 round trips of the
    /// network's slowest link, so that a short (`--quick`) run on a wide-area layout still
    /// sees commits whatever its protocol's round trips and start-up (a leader election, an
    /// epoch) cost.
    pub fn window_floor_s(&self) -> f64 {
        WINDOW_FLOOR_ROUND_TRIPS * 2.0 * self.network.owd_ns_max() as f64 / NS_PER_S as f64
    }

    /// Lengthens the window to [`Experiment::window_floor_s`] when it is shorter; returns the
    /// new length when it did.
    pub fn raise_window_to_floor(&mut self) -> Option<f64> {
        let floor_s = self.window_floor_s();
        (self.duration_s < floor_s).then(|| {
            self.duration_s = floor_s;
            floor_s
        })
    }

    /// The fault schedule, checked against `topology` and the run's length (warm-up
    /// included). A crash or a slow disk needs a log on disk: in memory durability a crashed
    /// node would come back empty, and there is no disk to slow.
    pub fn fault_schedule(&self, topology: &Topology) -> Result<FaultSchedule, ConfigError> {
        let run_ns = ((self.warmup_s + self.duration_s) * NS_PER_S as f64) as u64;
        let leaders = self.protocol.initial_leaders(topology, &self.protocol_options);
        let schedule = FaultSchedule::parse(&self.faults, topology, &leaders, run_ns)?;
        let needs_disk = schedule
            .faults()
            .iter()
            .find(|f| matches!(f.kind, FaultKind::Crash { .. } | FaultKind::Disk { .. }));
        if let (Some(fault), DurabilityMode::Memory) = (needs_disk, self.durability) {
            return Err(ConfigError::new(format!(
                "fault '{}' needs --durability buffered or fsync: with memory durability a \
                 crashed node would come back empty and there is no disk to slow",
                fault.text
            )));
        }
        Ok(schedule)
    }

    /// The coordinators that take clients in `topology`.
    pub fn client_coordinators(&self, topology: &Topology) -> Result<Vec<NodeId>, ConfigError> {
        let regions = region_ids(&topology.regions, &self.client_regions, "--client-regions")?;
        let coordinators = topology.coordinators_in(&regions);
        if coordinators.is_empty() {
            return Err(ConfigError::new("--client-regions: no coordinator runs there"));
        }
        Ok(coordinators)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_runtime::logstore::LogStoreKind;

    fn experiment(network: &str, duration_s: f64) -> Experiment {
        Experiment {
            protocol: ProtocolKind::Occ,
            protocol_options: ProtocolKind::Occ.options(&[]).unwrap(),
            workload: "micro-luigi".into(),
            workload_options: WorkloadOptions::default(),
            shards: 1,
            replicas: 3,
            network: NetworkModel::preset(network, 3).unwrap(),
            clock: ClockModel::preset("perfect").unwrap(),
            clients: 8,
            outstanding: 1,
            load: meridian_workloads::clients::Load::Closed,
            server_regions: Vec::new(),
            replica_placement: meridian_core::topology::Placement::Spread,
            client_regions: Vec::new(),
            duration_s,
            warmup_s: 1.0,
            seed: 1,
            faults: Vec::new(),
            out_dir: PathBuf::from("results"),
            progress: false,
            durability: DurabilityMode::Memory,
            log_store: LogStoreKind::File,
            snapshot_interval_entries: 50_000,
        }
    }

    #[test]
    fn a_short_window_on_a_wide_network_is_raised_to_twenty_round_trips() {
        let mut geo = experiment("geo", 2.0);
        let floor = geo.window_floor_s();
        let rtt_s = 2.0 * geo.network.owd_ns_max() as f64 / 1e9;
        assert!((floor - 20.0 * rtt_s).abs() < 1e-9 && floor > 2.0, "{floor}");
        assert_eq!(geo.raise_window_to_floor(), Some(floor));
        assert_eq!(geo.duration_s, floor);
        assert_eq!(geo.raise_window_to_floor(), None, "raised once");
        let mut metro = experiment("metro", 2.0);
        assert_eq!(metro.raise_window_to_floor(), None, "2 s is many metro round trips");
        assert_eq!(metro.duration_s, 2.0);
    }

    #[test]
    fn faults_are_checked_with_the_run() {
        let mut e = experiment("metro", 2.0);
        e.faults = vec!["crash leader=0 at=1s restart=2s".into()];
        let why = e.validate().unwrap_err().0;
        assert!(why.contains("needs --durability buffered or fsync"), "{why}");
        e.durability = DurabilityMode::Buffered;
        assert!(e.validate().is_ok());
        e.faults = vec!["crash leader=0 at=3s".into()];
        let why = e.validate().unwrap_err().0;
        assert!(why.contains("outside the run, which lasts 3s"), "{why}");
    }
}
