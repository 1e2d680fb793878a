//! A server process: one node of a cluster file, its log opened from its data directory, its
//! stores loaded, serving until a signal (or a panic of the node); and the offline rebuild of a
//! stopped server's data directory (`meridian verify`).

use crate::cluster_file::ClusterFile;
use crate::context::{
    file_contexts, load_in_parallel, open_storage, panics_of, runtime, tcp_cluster_config,
    BuildNode, Durable,
};
use meridian_core::topology::Topology;
use meridian_core::{ConfigError, NodeId};
use meridian_protocols::{NodeContext, Protocol, ProtocolNode, ProtocolVisitor, Replayed};
use meridian_runtime::incarnation;
use meridian_runtime::logstore::{DurabilityMode, LogStore, Storage};
use meridian_runtime::metrics::{self, MetricsHub};
use meridian_runtime::node_task::LocalNode;
use meridian_runtime::Cluster;
use meridian_workloads::clients::ClientPool;
use meridian_workloads::{CheckResult, Workload};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Why a server stopped other than by a signal.
#[derive(Debug)]
pub enum ServeError {
    /// Bad configuration or a resource it could not get; nothing was served.
    Config(ConfigError),
    /// The node panicked (the message says where); the process must not go on serving.
    NodeFailed(String),
}

impl From<ConfigError> for ServeError {
    fn from(error: ConfigError) -> Self {
        Self::Config(error)
    }
}

/// Runs node `node` of a cluster file until the process is interrupted; with `metrics_addr`,
/// serves Prometheus metrics at `http://ADDR/metrics`.
pub fn run_server(
    file: &ClusterFile,
    node: u32,
    metrics_addr: Option<std::net::SocketAddr>,
    durability: DurabilityMode,
    data_dir: Option<&Path>,
) -> Result<(), ServeError> {
    let id = NodeId(node);
    check_node(file, node)?;
    if file.topology.nodes[node as usize].replicas.is_empty() {
        return Err(ConfigError::new(format!(
            "--node {node}: a coordinator node (it hosts no replica): it runs inside \
             `bench --cluster`, `kv` or a client, not as a server"
        ))
        .into());
    }
    // A port in use is refused before the data directory is created or its log opened: the
    // listener is bound here once and let go, and the runtime binds it again when it starts.
    let addr = file.addrs[node as usize];
    std::net::TcpListener::bind(addr)
        .map_err(|e| ConfigError::new(format!("node {node}: cannot listen on {addr}: {e}")))?;
    if let Some(metrics) = metrics_addr {
        std::net::TcpListener::bind(metrics).map_err(|e| {
            ConfigError::new(format!("--metrics-addr {metrics}: cannot listen: {e}"))
        })?;
    }
    let workload: Arc<dyn Workload> =
        Arc::from(meridian_workloads::build(&file.workload, &file.workload_options)?);
    let topology = Arc::new(file.topology.clone());
    // What a data directory belongs to: the layout, protocol and workload, and the node.
    let (storage, durable) =
        open_storage(durability, file.log_store, data_dir, &data_identity(file, node))?;
    let incarnation = match data_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .map_err(|e| ConfigError::new(format!("{}: {e}", dir.display())))?;
            incarnation::next_in(dir).map_err(ConfigError::new)?
        }
        None => incarnation::from_clock(),
    };
    let rt = runtime()?;
    let server = Server { id, storage, durable: &durable, metrics_addr, incarnation };
    file.protocol.visit(Serve { rt: &rt, file, workload, topology, server })
}

/// A server process with the protocol type chosen at run time.
struct Serve<'a> {
    rt: &'a tokio::runtime::Runtime,
    file: &'a ClusterFile,
    workload: Arc<dyn Workload>,
    topology: Arc<Topology>,
    server: Server<'a>,
}

impl ProtocolVisitor for Serve<'_> {
    type Output = Result<(), ServeError>;
    fn visit<P: Protocol>(self) -> Self::Output {
        let Self { rt, file, workload, topology, server } = self;
        rt.block_on(serve::<P::Node>(file, workload, topology, P::restore, server))
    }
}

/// `node` is a node of `file`.
fn check_node(file: &ClusterFile, node: u32) -> Result<(), ConfigError> {
    let nodes = file.topology.nodes.len();
    if node as usize >= nodes {
        return Err(ConfigError::new(format!(
            "--node {node}: the cluster file has nodes 0 to {}",
            nodes.saturating_sub(1)
        )));
    }
    Ok(())
}

/// The identity of node `node`'s data directory in the cluster of `file`.
fn data_identity(file: &ClusterFile, node: u32) -> String {
    format!(
        "meridian {} {} {}x{} over {} nodes; node {node}",
        file.protocol.name(),
        file.workload,
        file.topology.shards,
        file.topology.replicas,
        file.topology.nodes.len()
    )
}

/// Rebuilds node `node` offline from its data directory, as a restart would (initial data,
/// then its snapshots and every command its log holds as committed after them), and runs the
/// workload's checks that need only the stores. Returns the checks and what was rebuilt. Cross-shard
/// invariants need every shard: with several shards, only a node's own shards are checked.
pub fn verify_data_dir(
    file: &ClusterFile,
    node: u32,
    dir: &Path,
) -> Result<(Vec<CheckResult>, Replayed), ConfigError> {
    check_node(file, node)?;
    let recovered = LogStore::read(file.log_store, dir, &data_identity(file, node))
        .map_err(ConfigError::new)?;
    let workload: Arc<dyn Workload> =
        Arc::from(meridian_workloads::build(&file.workload, &file.workload_options)?);
    let topology = Arc::new(file.topology.clone());
    let context = file_contexts(file, &topology, &workload, true, 0)(NodeId(node));
    file.protocol.visit(Verify { context, records: &recovered.records, workload })
}

/// An offline rebuild with the protocol type chosen at run time.
struct Verify<'a> {
    context: NodeContext,
    records: &'a Durable,
    workload: Arc<dyn Workload>,
}

impl ProtocolVisitor for Verify<'_> {
    type Output = Result<(Vec<CheckResult>, Replayed), ConfigError>;
    fn visit<P: Protocol>(self) -> Self::Output {
        let mut built = P::restore(self.context, self.records).map_err(ConfigError::new)?;
        load_in_parallel(self.workload.as_ref(), std::iter::once(&mut built));
        let replayed = P::replay_committed(&mut built);
        let checker = self.workload.checker();
        Ok((checker.check(&built.stores()), replayed))
    }
}

/// What one server process runs with.
struct Server<'a> {
    id: NodeId,
    storage: Option<Storage>,
    durable: &'a BTreeMap<Vec<u8>, Vec<u8>>,
    metrics_addr: Option<std::net::SocketAddr>,
    incarnation: u64,
}

async fn serve<N: ProtocolNode>(
    file: &ClusterFile,
    workload: Arc<dyn Workload>,
    topology: Arc<Topology>,
    build: BuildNode<N>,
    server: Server<'_>,
) -> Result<(), ServeError> {
    let Server { id, storage, durable, metrics_addr, incarnation } = server;
    let context = file_contexts(file, &topology, &workload, storage.is_some(), incarnation);
    // The initial data first; the log replays on top of it once the node runs.
    let mut node = build(context(id), durable).map_err(ConfigError::new)?;
    load_in_parallel(workload.as_ref(), std::iter::once(&mut node));
    let mut config = tcp_cluster_config(file, &topology, &workload);
    config.storage = storage;
    let mut metrics_task = None;
    if let Some(addr) = metrics_addr {
        let hub = Arc::new(MetricsHub::default());
        metrics_task =
            Some(metrics::serve(addr, hub.clone()).await.map_err(|e| {
                ConfigError::new(format!("--metrics-addr {addr}: cannot listen: {e}"))
            })?);
        tracing::info!(node = %id, %addr, "metrics at /metrics");
        config.metrics = Some(hub);
    }
    let local: Vec<LocalNode<N, ClientPool>> = vec![(id, node, None)];
    let cluster = Cluster::start(config, local).await.map_err(|e| {
        ConfigError::new(format!("node {id}: cannot listen on {}: {e}", file.addrs[id.0 as usize]))
    })?;
    tracing::info!(node = %id, addr = %file.addrs[id.0 as usize], "serving");
    // Stop on Ctrl-C (SIGINT) or SIGTERM (what `meridian cluster down` and most supervisors
    // send), or fail when the node panics.
    let failures = cluster.failures();
    let failed = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => false,
                    _ = terminate.recv() => false,
                    () = failures.wait() => true,
                }
            }
            Err(_) => tokio::select! {
                _ = tokio::signal::ctrl_c() => false,
                () = failures.wait() => true,
            },
        }
    }
    .await;
    if failed {
        return Err(ServeError::NodeFailed(panics_of(&failures).join("; ")));
    }
    tracing::info!(node = %id, "stopping");
    if let Some(task) = metrics_task {
        task.abort();
    }
    drop(cluster.stop().await);
    Ok(())
}
