//! A server process: one node of a cluster file, its log opened from its data directory, its
//! stores loaded, serving until a signal (or a panic of the node); and the offline rebuild of a
//! stopped server's data directory (`meridian verify`).

use crate::cluster_file::ClusterFile;
use crate::context::{
    file_contexts, load_in_parallel, open_storage, panics_of, runtime, tcp_cluster_config,
    BuildNode, Durable,
};
use crate::control::{Applied, ControlChange, FaultControl, CONTROL_BYTES_MAX, CONTROL_POLL_MS};
use meridian_core::topology::Topology;
use meridian_core::{ConfigError, NodeId, ShardId};
use meridian_protocols::{NodeContext, Protocol, ProtocolNode, ProtocolVisitor, Replayed};
use meridian_runtime::incarnation;
use meridian_runtime::logstore::{DurabilityMode, LogStore, Storage};
use meridian_runtime::metrics::{self, MetricsHub};
use meridian_runtime::node_task::{LocalNode, NodeFault};
use meridian_runtime::Cluster;
use meridian_storage::MvccStore;
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

/// How one server process runs.
#[derive(Clone, Debug)]
pub struct ServerSettings<'a> {
    /// Its node in the cluster file.
    pub node: u32,
    /// Where it serves Prometheus metrics (`http://ADDR/metrics`), if anywhere.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// What its log promises.
    pub durability: DurabilityMode,
    /// Its data directory (required unless the durability is `memory`).
    pub data_dir: Option<&'a Path>,
    /// A fault-control file it acts out (see [`crate::control`]); for fault injection only.
    pub fault_control: Option<&'a Path>,
}

/// Runs a node of a cluster file as `settings` say until the process is interrupted.
pub fn run_server(file: &ClusterFile, settings: &ServerSettings<'_>) -> Result<(), ServeError> {
    let ServerSettings { node, metrics_addr, durability, data_dir, fault_control } = *settings;
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
    // Certificates are read and checked before the data directory is touched.
    let tls = crate::tls::load(file, &[id])?;
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
    let server =
        Server { id, storage, durable: &durable, metrics_addr, incarnation, fault_control, tls };
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
    let workload: Arc<dyn Workload> =
        Arc::from(meridian_workloads::build(&file.workload, &file.workload_options)?);
    let mut checks = Vec::new();
    let replayed = rebuild_data_dir(file, node, dir, &mut |stores| {
        checks = workload.checker().check(stores);
    })?;
    Ok((checks, replayed))
}

/// What [`rebuild_data_dir`] shows the rebuilt stores to.
pub type InspectStores<'a> = dyn FnMut(&[(ShardId, &MvccStore)]) + 'a;

/// Rebuilds node `node` offline from its data directory as [`verify_data_dir`] does and shows
/// `inspect` its stores (one per shard replica it hosts). Returns what was rebuilt.
pub fn rebuild_data_dir(
    file: &ClusterFile,
    node: u32,
    dir: &Path,
    inspect: &mut InspectStores<'_>,
) -> Result<Replayed, ConfigError> {
    check_node(file, node)?;
    let recovered = LogStore::read(file.log_store, dir, &data_identity(file, node))
        .map_err(ConfigError::new)?;
    let workload: Arc<dyn Workload> =
        Arc::from(meridian_workloads::build(&file.workload, &file.workload_options)?);
    let topology = Arc::new(file.topology.clone());
    let context = file_contexts(file, &topology, &workload, true, 0)(NodeId(node));
    file.protocol.visit(Rebuild { context, records: &recovered.records, workload, inspect })
}

/// An offline rebuild with the protocol type chosen at run time.
struct Rebuild<'a, 'b> {
    context: NodeContext,
    records: &'a Durable,
    workload: Arc<dyn Workload>,
    inspect: &'a mut InspectStores<'b>,
}

impl ProtocolVisitor for Rebuild<'_, '_> {
    type Output = Result<Replayed, ConfigError>;
    fn visit<P: Protocol>(self) -> Self::Output {
        let mut built = P::restore(self.context, self.records).map_err(ConfigError::new)?;
        load_in_parallel(self.workload.as_ref(), std::iter::once(&mut built));
        let replayed = P::replay_committed(&mut built);
        (self.inspect)(&built.stores());
        Ok(replayed)
    }
}

/// What one server process runs with.
struct Server<'a> {
    id: NodeId,
    storage: Option<Storage>,
    durable: &'a BTreeMap<Vec<u8>, Vec<u8>>,
    metrics_addr: Option<std::net::SocketAddr>,
    incarnation: u64,
    fault_control: Option<&'a Path>,
    tls: Option<Arc<meridian_runtime::tls::Tls>>,
}

async fn serve<N: ProtocolNode>(
    file: &ClusterFile,
    workload: Arc<dyn Workload>,
    topology: Arc<Topology>,
    build: BuildNode<N>,
    server: Server<'_>,
) -> Result<(), ServeError> {
    let Server { id, storage, durable, metrics_addr, incarnation, fault_control, tls } = server;
    let context = file_contexts(file, &topology, &workload, storage.is_some(), incarnation);
    // The initial data first; the log replays on top of it once the node runs.
    let mut node = build(context(id), durable).map_err(ConfigError::new)?;
    load_in_parallel(workload.as_ref(), std::iter::once(&mut node));
    let mut config = tcp_cluster_config(file, &topology, &workload, tls);
    config.storage = storage.clone();
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
    // send), or fail when the node panics; meanwhile act out the fault-control file, if any.
    let failures = cluster.failures();
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let mut control = fault_control.map(|path| ControlReader::new(path, id));
    let mut poll = tokio::time::interval(std::time::Duration::from_millis(CONTROL_POLL_MS));
    let failed = loop {
        let terminated = async {
            match terminate.as_mut() {
                Some(signal) => signal.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break false,
            _ = terminated => break false,
            () = failures.wait() => break true,
            _ = poll.tick(), if control.is_some() => {
                if let Some(reader) = control.as_mut() {
                    reader.act_out(&cluster, storage.as_ref(), topology.nodes.len()).await;
                }
            }
        }
    };
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

/// Reads a server's fault-control file and carries out what changed since the last read.
struct ControlReader<'a> {
    path: &'a Path,
    id: NodeId,
    applied: Applied,
    /// The last text read, so that an unchanged file costs one read and no parse.
    last: Option<String>,
}

impl<'a> ControlReader<'a> {
    fn new(path: &'a Path, id: NodeId) -> Self {
        Self { path, id, applied: Applied::default(), last: None }
    }

    async fn act_out<N: ProtocolNode>(
        &mut self,
        cluster: &Cluster<N>,
        storage: Option<&Storage>,
        nodes: usize,
    ) {
        // A missing file is no fault; the injector may not have written it yet.
        let text = read_bounded(self.path).unwrap_or_default();
        if self.last.as_deref() == Some(text.as_str()) {
            return;
        }
        let parsed = FaultControl::parse(&text, nodes);
        self.last = Some(text);
        let next = match parsed {
            Ok(next) => next,
            Err(why) => {
                tracing::warn!(file = %self.path.display(), "fault control refused: {why}");
                return;
            }
        };
        let cuts = cluster.cuts();
        for change in self.applied.changes_to(next) {
            tracing::info!(node = %self.id, ?change, "fault control");
            match change {
                ControlChange::Cut(peer, cut) => cuts.set(self.id, peer, cut),
                ControlChange::ClockStep(step_ns) => {
                    cluster.inject(self.id, NodeFault::ClockStep(step_ns)).await;
                }
                ControlChange::DiskDelay(delay_ns) => {
                    if let Some(storage) = storage {
                        storage.set_delay_ns(delay_ns);
                    }
                }
                ControlChange::DiskFail(failure) => {
                    if let Some(storage) = storage {
                        storage.inject_failure(failure);
                    }
                }
            }
        }
    }
}

/// The file's text if it is no longer than a control file may be.
fn read_bounded(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    let file = std::fs::File::open(path).ok()?;
    file.take(CONTROL_BYTES_MAX as u64 + 1).read_to_string(&mut text).ok()?;
    Some(text)
}
