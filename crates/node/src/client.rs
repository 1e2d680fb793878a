//! A coordinator node of a cluster file run inside a client's process (`meridian-client`,
//! `meridian kv`): started, connected over TCP to the cluster's servers, and stopped.

use crate::cluster_file::ClusterFile;
use crate::context::{file_contexts, tcp_cluster_config, BuildNode};
use meridian_core::time::NS_PER_S;
use meridian_core::topology::Topology;
use meridian_core::{ConfigError, NodeId};
use meridian_protocols::{Protocol, ProtocolNode, ProtocolVisitor};
use meridian_runtime::incarnation;
use meridian_runtime::node_task::LocalNode;
use meridian_runtime::Cluster;
use meridian_workloads::clients::ClientPool;
use meridian_workloads::Workload;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A coordinator node of a cluster file running in this process for a client library
/// (`meridian-client`): its handle, the procedures it knows, and a way to stop it.
pub struct ClientNode {
    /// The node.
    pub id: NodeId,
    /// Calls into it.
    pub handle: meridian_runtime::node_task::ClientHandle,
    /// The cluster's procedures (the workload's), for one-shot transactions by name.
    pub registry: Arc<meridian_core::txn::Registry>,
    /// The cluster's protocol.
    pub protocol: meridian_protocols::ProtocolKind,
    /// Which shard holds a key.
    pub partitioner: Arc<meridian_core::txn::Partitioner>,
    /// Per shard, the addresses of its replicas' servers (to name them in errors).
    pub shard_servers: Vec<Vec<std::net::SocketAddr>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    stopped: tokio::task::JoinHandle<()>,
}

impl ClientNode {
    /// Stops the node (its connections close) and waits until it has.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.stopped).await;
    }
}

/// The longest session lease a client may ask for.
pub const SESSION_LEASE_NS_MAX: u64 = 3_600 * NS_PER_S;

/// Starts coordinator node `node` of `file` (the first coordinator that hosts no replica when
/// `None`) in this process, connected over TCP to the cluster's servers, for a client library.
/// `session_lease_ns` overrides how long an interactive transaction may stay idle. Must run
/// inside a tokio runtime. Two processes must not run the same coordinator node (each listens
/// on the node's address).
pub async fn start_client_node(
    file: &ClusterFile,
    node: Option<u32>,
    session_lease_ns: Option<u64>,
) -> Result<ClientNode, ConfigError> {
    let workload: Arc<dyn Workload> =
        Arc::from(meridian_workloads::build(&file.workload, &file.workload_options)?);
    let topology = Arc::new(file.topology.clone());
    let free = |n: &NodeId| topology.nodes[n.0 as usize].replicas.is_empty();
    let id = match node {
        Some(n) => {
            let id = NodeId(n);
            let ok = (n as usize) < topology.nodes.len()
                && topology.nodes[n as usize].coordinator
                && free(&id);
            if !ok {
                return Err(ConfigError::new(format!(
                    "--node {n}: not a coordinator node of the cluster file that hosts no replica"
                )));
            }
            id
        }
        None => topology.coordinators().into_iter().find(free).ok_or_else(|| {
            ConfigError::new("the cluster file has no coordinator node that hosts no replica")
        })?,
    };
    if session_lease_ns.is_some_and(|ns| ns == 0 || ns > SESSION_LEASE_NS_MAX) {
        return Err(ConfigError::new("the session lease must be in 1 ns ..= 1 hour"));
    }
    let start = StartClient { file: file.clone(), id, session_lease_ns, workload, topology };
    file.protocol.visit(start).await
}

/// [`start_client_node`] with the protocol type chosen at run time.
struct StartClient {
    file: ClusterFile,
    id: NodeId,
    session_lease_ns: Option<u64>,
    workload: Arc<dyn Workload>,
    topology: Arc<Topology>,
}

type StartFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<ClientNode, ConfigError>> + Send>>;

impl ProtocolVisitor for StartClient {
    type Output = StartFuture;
    fn visit<P: Protocol>(self) -> StartFuture {
        Box::pin(start_client::<P::Node>(self, P::restore))
    }
}

async fn start_client<N: ProtocolNode>(
    start: StartClient,
    build: BuildNode<N>,
) -> Result<ClientNode, ConfigError> {
    let StartClient { file, id, session_lease_ns, workload, topology } = start;
    // Like `bench --cluster`'s coordinators: nothing logged, incarnation from the clock.
    let mut context =
        file_contexts(&file, &topology, &workload, false, incarnation::from_clock())(id);
    if let Some(lease) = session_lease_ns {
        context.timing.session_lease_ns = lease;
    }
    let node = build(context, &BTreeMap::new()).map_err(ConfigError::new)?;
    let config = tcp_cluster_config(&file, &topology, &workload);
    let local: Vec<LocalNode<N, ClientPool>> = vec![(id, node, None)];
    let cluster = Cluster::start(config, local).await.map_err(|e| {
        ConfigError::new(format!("node {id}: cannot listen on {}: {e}", file.addrs[id.0 as usize]))
    })?;
    let handle = cluster.client(id).expect("the node runs here");
    let (stop, stopping) = tokio::sync::oneshot::channel::<()>();
    let stopped = tokio::spawn(async move {
        let _ = stopping.await;
        drop(cluster.stop().await);
    });
    let shard_servers = (0..topology.shards)
        .map(|s| {
            let nodes = topology.shard_nodes(meridian_core::ShardId(s));
            nodes.into_iter().map(|n| file.addrs[n.0 as usize]).collect()
        })
        .collect();
    Ok(ClientNode {
        id,
        handle,
        registry: Arc::new(workload.registry()),
        protocol: file.protocol,
        partitioner: Arc::new(workload.partitioner()),
        shard_servers,
        stop: Some(stop),
        stopped,
    })
}
