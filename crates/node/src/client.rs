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
    let tls = crate::tls::load(&file, &[id])?;
    let config = tcp_cluster_config(&file, &topology, &workload, tls);
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

/// How long [`probe_servers`] waits for each server.
pub const PROBE_WAIT: std::time::Duration = std::time::Duration::from_millis(700);

/// Checks, before a client starts work, that the servers of `file` are this cluster's: each
/// server is sent the hello coordinator `from` would send. One that closes the connection
/// refused it (another cluster file, workload or wire version); one that answers with bytes
/// before any request is not a Meridian server. Either is an error naming the node and its
/// address, as is a shard none of whose servers can be reached. Servers that cannot be
/// reached are otherwise tolerated (a replica may be down).
pub async fn probe_servers(file: &ClusterFile, from: NodeId) -> Result<(), ConfigError> {
    use meridian_core::wire::{Hello, WIRE_VERSION};
    let workload: Arc<dyn Workload> =
        Arc::from(meridian_workloads::build(&file.workload, &file.workload_options)?);
    let topology = Arc::new(file.topology.clone());
    let fingerprint = crate::context::fingerprint(file, &workload);
    let tls = crate::tls::load(file, &[from])?;
    let servers: Vec<NodeId> =
        topology.node_ids().filter(|n| !topology.nodes[n.0 as usize].replicas.is_empty()).collect();
    // Every server at once, each in its own task (the probes own what they use).
    let tasks: Vec<_> = servers
        .iter()
        .map(|&to| {
            let addr = file.addrs[to.0 as usize];
            let hello = Hello { version: WIRE_VERSION, cluster_fingerprint: fingerprint, from, to };
            tokio::spawn(probe_one(addr, to, hello, tls.clone()))
        })
        .collect();
    let mut reachable = BTreeMap::new();
    for (&to, task) in servers.iter().zip(tasks) {
        let answer = task.await.map_err(|e| ConfigError::new(format!("a probe failed: {e}")))?;
        reachable.insert(to, answer?);
    }
    for shard in 0..topology.shards {
        let nodes = topology.shard_nodes(meridian_core::ShardId(shard));
        if !nodes.iter().any(|n| reachable.get(n) == Some(&true)) {
            let addrs: Vec<String> =
                nodes.iter().map(|n| file.addrs[n.0 as usize].to_string()).collect();
            return Err(ConfigError::new(format!(
                "shard {shard} has no reachable server ({})",
                addrs.join(", ")
            )));
        }
    }
    Ok(())
}

/// One server's answer to `hello`: `Ok(true)` when it accepted it (it keeps quiet),
/// `Ok(false)` when it cannot be reached, an error when it refused it or is no Meridian
/// server.
async fn probe_one(
    addr: std::net::SocketAddr,
    to: NodeId,
    hello: meridian_core::wire::Hello,
    tls: Option<Arc<meridian_runtime::tls::Tls>>,
) -> Result<bool, ConfigError> {
    use meridian_core::wire::{encode_frame, WireFrame};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let connect = tokio::net::TcpStream::connect(addr);
    let Ok(Ok(stream)) = tokio::time::timeout(PROBE_WAIT, connect).await else {
        return Ok(false);
    };
    let mut stream: Box<dyn meridian_runtime::tcp::Stream> = match &tls {
        None => Box::new(stream),
        Some(tls) => {
            let connector = tls
                .connector(hello.from)
                .ok_or_else(|| ConfigError::new(format!("no TLS keys for node {}", hello.from)))?;
            let name =
                rustls::pki_types::ServerName::try_from(meridian_runtime::tls::node_name(to))
                    .map_err(|e| ConfigError::new(e.to_string()))?;
            match tokio::time::timeout(PROBE_WAIT, connector.connect(name, stream)).await {
                Ok(Ok(stream)) => Box::new(stream),
                Ok(Err(e)) => {
                    return Err(ConfigError::new(format!(
                        "node {} at {addr}: the TLS handshake failed: {e}",
                        to.0
                    )))
                }
                Err(_) => return Ok(false),
            }
        }
    };
    let mut frame = Vec::new();
    encode_frame(&WireFrame::<()>::Hello(hello), &mut frame)
        .map_err(|e| ConfigError::new(format!("cannot frame a hello: {e}")))?;
    if stream.write_all(&frame).await.is_err() || stream.flush().await.is_err() {
        return Ok(false);
    }
    let mut byte = [0u8; 1];
    match tokio::time::timeout(PROBE_WAIT, stream.read(&mut byte)).await {
        // Quiet: a Meridian server waits for requests after a hello it accepts.
        Err(_) => Ok(true),
        Ok(Ok(0)) | Ok(Err(_)) => Err(ConfigError::new(format!(
            "node {} at {addr} refused this client's hello: it runs another cluster file, \
             workload or wire version",
            to.0
        ))),
        Ok(Ok(_)) => Err(ConfigError::new(format!(
            "node {} at {addr} answered with bytes before any request: not a Meridian server",
            to.0
        ))),
    }
}
