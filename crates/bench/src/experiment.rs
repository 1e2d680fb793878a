//! The settings of one benchmark run, checked before anything starts.

use meridian_core::clock::ClockModel;
use meridian_core::netmodel::NetworkModel;
use meridian_core::topology::{Topology, REPLICAS_MAX, SHARDS_MAX};
use meridian_core::ConfigError;
use meridian_protocols::{ProtocolKind, ProtocolOptions};
use meridian_workloads::WorkloadOptions;
use std::path::PathBuf;

/// Most closed-loop clients in one run.
pub const CLIENTS_MAX: u32 = 100_000;
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
    /// Closed-loop clients, spread over the coordinators.
    pub clients: u32,
    /// Measured seconds.
    pub duration_s: f64,
    /// Seconds discarded at the start.
    pub warmup_s: f64,
    /// Master seed.
    pub seed: u64,
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

/// Checks a snapshot interval (commands between snapshots).
pub fn check_snapshot_interval(entries: u64) -> Result<(), String> {
    let min = meridian_protocols::SNAPSHOT_INTERVAL_ENTRIES_MIN;
    if entries < min {
        return Err(format!("{entries} commands between snapshots; at least {min}"));
    }
    Ok(())
}

impl Experiment {
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
        self.protocol.check_topology(&topology)?;
        meridian_workloads::build(&self.workload, &self.workload_options)?;
        Ok(())
    }

    /// The standard layout over the network's regions.
    pub fn topology(&self) -> Result<Topology, ConfigError> {
        Topology::standard(self.network.regions.clone(), self.shards, self.replicas)
    }
}
