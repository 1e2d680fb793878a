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

impl Experiment {
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

    /// The fault schedule, checked against `topology` and the run's length (warm-up
    /// included). A crash or a slow disk needs a log on disk: in memory durability a crashed
    /// node would come back empty, and there is no disk to slow.
    pub fn fault_schedule(&self, topology: &Topology) -> Result<FaultSchedule, ConfigError> {
        let run_ns = ((self.warmup_s + self.duration_s) * NS_PER_S as f64) as u64;
        let schedule = FaultSchedule::parse(&self.faults, topology, run_ns)?;
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
