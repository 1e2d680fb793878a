//! What every node of a process is built from: its context (topology, procedures, timing,
//! options), its log opened from a data directory, its stores bulk-loaded, and the runtime
//! settings that connect it to the other processes of a cluster file. Shared by the servers,
//! the client nodes and the benchmark's runs.

use crate::cluster_file::ClusterFile;
use meridian_core::topology::Topology;
use meridian_core::{ConfigError, NodeId, ShardId};
use meridian_protocols::{NodeContext, ProtocolNode, ProtocolOptions, Timing};
use meridian_runtime::logstore::{DurabilityMode, LogStore, LogStoreKind, Storage};
use meridian_runtime::node_task::{ClusterConfig, NodeFailures};
use meridian_runtime::tcp::TcpConfig;
use meridian_storage::MvccStore;
use meridian_workloads::Workload;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

pub fn runtime() -> Result<tokio::runtime::Runtime, ConfigError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| ConfigError::new(format!("cannot start the tokio runtime: {e}")))
}

/// What every node of one run shares.
pub struct ContextBase<'a> {
    pub topology: &'a Arc<Topology>,
    pub workload: &'a Arc<dyn Workload>,
    pub network_owd_ns_max: u64,
    pub seed: u64,
    pub durable: bool,
    pub snapshot_interval_entries: u64,
    pub options: &'a ProtocolOptions,
    pub incarnation: u64,
}

pub fn contexts(base: ContextBase<'_>) -> impl Fn(NodeId) -> NodeContext {
    let registry = Arc::new(base.workload.registry());
    let partitioner = Arc::new(base.workload.partitioner());
    let topology = base.topology.clone();
    let mut timing = Timing::for_network(base.network_owd_ns_max);
    timing.snapshot_interval_entries = base.snapshot_interval_entries;
    let (seed, durable, incarnation) = (base.seed, base.durable, base.incarnation);
    let options = base.options.clone();
    move |id| {
        let mut context = NodeContext::new(
            id,
            topology.clone(),
            registry.clone(),
            partitioner.clone(),
            seed,
            timing.clone(),
        );
        context.durable = durable;
        context.incarnation = incarnation;
        context.options = options.clone();
        context
    }
}

/// What a log holds: its live key-value records.
pub type Durable = BTreeMap<Vec<u8>, Vec<u8>>;

/// Builds a node from its context and what its log holds.
pub type BuildNode<N> = fn(NodeContext, &BTreeMap<Vec<u8>, Vec<u8>>) -> Result<N, String>;

/// Opens the log in `dir` for `identity` and starts the storage thread, or `None` for memory
/// durability. Reports a discarded torn tail.
pub fn open_storage(
    mode: DurabilityMode,
    kind: LogStoreKind,
    dir: Option<&Path>,
    identity: &str,
) -> Result<(Option<Storage>, Durable), ConfigError> {
    if mode == DurabilityMode::Memory {
        return Ok((None, BTreeMap::new()));
    }
    let dir = dir.ok_or_else(|| {
        ConfigError::new(format!("--durability {} needs --data-dir", mode.name()))
    })?;
    let (log, recovered) = LogStore::open(kind, dir, identity).map_err(ConfigError::new)?;
    if recovered.torn_bytes_discarded > 0 {
        tracing::warn!(
            dir = %dir.display(),
            bytes = recovered.torn_bytes_discarded,
            "discarded a torn write at the end of the log"
        );
    }
    tracing::info!(
        dir = %dir.display(),
        store = kind.name(),
        records = recovered.records.len(),
        "log opened"
    );
    Ok((Some(Storage::start(log, mode)), recovered.records))
}

/// Bulk-loads every store of `nodes`, one thread per store (a 20-warehouse TPC-C is ~10M rows;
/// loading shards side by side divides the wait by the cores).
pub fn load_in_parallel<'a, N: ProtocolNode + 'a>(
    workload: &dyn Workload,
    nodes: impl Iterator<Item = &'a mut N>,
) {
    let stores: Vec<(ShardId, &mut MvccStore)> = nodes.flat_map(|node| node.stores_mut()).collect();
    std::thread::scope(|scope| {
        for (shard, store) in stores {
            scope.spawn(move || workload.load(shard, store));
        }
    });
}

/// "node n3 panicked: ..." for every node of the process that panicked.
pub fn panics_of(failures: &NodeFailures) -> Vec<String> {
    failures
        .panics()
        .into_iter()
        .map(|(node, why)| format!("node {node} panicked: {why}"))
        .collect()
}

/// What both ends of every connection must agree on: the cluster file and the procedures.
pub fn fingerprint(file: &ClusterFile, workload: &Arc<dyn Workload>) -> u64 {
    file.text_hash ^ workload.registry().fingerprint().rotate_left(17)
}

/// The runtime settings of a process that is part of the cluster in `file`.
pub fn tcp_cluster_config(
    file: &ClusterFile,
    topology: &Arc<Topology>,
    workload: &Arc<dyn Workload>,
    tls: Option<Arc<meridian_runtime::tls::Tls>>,
) -> ClusterConfig {
    let mut tcp = TcpConfig::new(file.addrs.clone(), fingerprint(file, workload));
    tcp.tls = tls;
    ClusterConfig {
        topology: topology.clone(),
        network: file.network.clone(),
        clock: file.clock,
        seed: file.seed,
        tcp: Some(tcp),
        metrics: None,
        storage: None,
        node_storage: BTreeMap::new(),
    }
}

/// [`contexts`] for the nodes of a cluster file.
pub fn file_contexts(
    file: &ClusterFile,
    topology: &Arc<Topology>,
    workload: &Arc<dyn Workload>,
    durable: bool,
    incarnation: u64,
) -> impl Fn(NodeId) -> NodeContext {
    contexts(ContextBase {
        topology,
        workload,
        network_owd_ns_max: file.network.owd_ns_max(),
        seed: file.seed,
        durable,
        snapshot_interval_entries: file.snapshot_interval_entries,
        options: &file.protocol_options,
        incarnation,
    })
}
