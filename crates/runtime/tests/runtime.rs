//! Runtime tests: in-process delivery under bursts, OCC end to end over TCP on loopback, and
//! hostile frames on a live connection.

use meridian_core::clock::ClockModel;
use meridian_core::netmodel::NetworkModel;
use meridian_core::node::{ClientDriver, ClientRequest, Node, Outbox, PersistToken, TimerId};
use meridian_core::topology::Topology;
use meridian_core::txn::TxnResult;
use meridian_core::{NodeId, Time};
use meridian_protocols::engine::OccNode;
use meridian_protocols::{NodeContext, ProtocolNode, Timing};
use meridian_runtime::node_task::ClusterConfig;
use meridian_runtime::tcp::TcpConfig;
use meridian_runtime::Cluster;
use meridian_workloads::clients::ClientPool;
use meridian_workloads::WorkloadOptions;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Node 0 sends `BURST` numbered messages to node 1 from `on_start`; node 1 counts and sums.
struct Burst {
    id: NodeId,
    received: u64,
    sum: u64,
}

const BURST: u64 = 10_000;

impl Node for Burst {
    type Msg = u64;
    fn on_start(&mut self, _: Time, out: &mut Outbox<u64>) {
        if self.id == NodeId(0) {
            for i in 0..BURST {
                out.send(NodeId(1), i);
            }
        }
    }
    fn on_message(&mut self, _: Time, _: NodeId, msg: u64, _: &mut Outbox<u64>) {
        self.received += 1;
        self.sum += msg;
    }
    fn on_timer(&mut self, _: Time, _: TimerId, _: &mut Outbox<u64>) {}
    fn on_persisted(&mut self, _: Time, _: PersistToken, _: &mut Outbox<u64>) {}
    fn submit(&mut self, _: Time, _: ClientRequest, _: &mut Outbox<u64>) {}
}

fn two_node_topology() -> Arc<Topology> {
    Arc::new(Topology::standard(vec!["r0".into()], 1, 1).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_larger_than_the_inbound_batch_arrives_whole() {
    // Regression: a node task dropped the message it had taken after a full batch of 256.
    let config = ClusterConfig {
        topology: two_node_topology(),
        network: NetworkModel::preset("lan", 1).unwrap(),
        clock: ClockModel::preset("perfect").unwrap(),
        seed: 1,
        tcp: None,
        metrics: None,
        storage: None,
        node_storage: Default::default(),
    };
    let nodes = (0..2)
        .map(|i| {
            (
                NodeId(i),
                Burst { id: NodeId(i), received: 0, sum: 0 },
                None::<Arc<Mutex<ClientPool>>>,
            )
        })
        .collect();
    let cluster = Cluster::start(config, nodes).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let results = cluster.stop().await;
    let receiver = results.iter().find(|r| r.id == NodeId(1)).unwrap();
    assert_eq!(receiver.node.received, BURST);
    assert_eq!(receiver.node.sum, BURST * (BURST - 1) / 2);
}

/// A node that panics on the message it is told to: the cluster reports the panic with its
/// message (a benchmark fails on it) and stopping does not wait for the dead node.
struct Fragile {
    id: NodeId,
    panic_on: u64,
}

impl Node for Fragile {
    type Msg = u64;
    fn on_start(&mut self, _: Time, out: &mut Outbox<u64>) {
        if self.id == NodeId(0) {
            for i in 0..100 {
                out.send(NodeId(1), i);
            }
        }
    }
    fn on_message(&mut self, _: Time, _: NodeId, msg: u64, _: &mut Outbox<u64>) {
        assert!(msg != self.panic_on, "invariant broken at message {msg}");
    }
    fn on_timer(&mut self, _: Time, _: TimerId, _: &mut Outbox<u64>) {}
    fn on_persisted(&mut self, _: Time, _: PersistToken, _: &mut Outbox<u64>) {}
    fn submit(&mut self, _: Time, _: ClientRequest, _: &mut Outbox<u64>) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_node_is_reported_with_its_message() {
    let config = ClusterConfig {
        topology: two_node_topology(),
        network: NetworkModel::preset("lan", 1).unwrap(),
        clock: ClockModel::preset("perfect").unwrap(),
        seed: 1,
        tcp: None,
        metrics: None,
        storage: None,
        node_storage: Default::default(),
    };
    let nodes = (0..2)
        .map(|i| {
            (NodeId(i), Fragile { id: NodeId(i), panic_on: 42 }, None::<Arc<Mutex<ClientPool>>>)
        })
        .collect();
    let cluster = Cluster::start(config, nodes).await.unwrap();
    let failures = cluster.failures();
    tokio::time::timeout(Duration::from_secs(10), failures.wait()).await.expect("reported");
    let panics = failures.panics();
    assert_eq!(panics.len(), 1);
    assert_eq!(panics[0].0, NodeId(1));
    assert!(panics[0].1.contains("invariant broken at message 42"), "{panics:?}");
    let results = cluster.stop().await;
    assert_eq!(results.iter().map(|r| r.id).collect::<Vec<_>>(), vec![NodeId(0)]);
}

/// Node 0 floods an unreachable peer in another process (nothing listens at its address)
/// with more messages than the connection's queue holds: the surplus is dropped and counted,
/// and node 0 goes on serving. (A writer that stopped draining used to block the sender, and
/// with it the node and every delayed link of the process.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_peer_never_stalls_the_sender() {
    let addrs = free_addrs(2);
    let config = ClusterConfig {
        topology: two_node_topology(),
        network: NetworkModel::preset("lan", 1).unwrap(),
        clock: ClockModel::preset("perfect").unwrap(),
        seed: 1,
        tcp: Some(TcpConfig::new(addrs, 7)),
        metrics: None,
        storage: None,
        node_storage: Default::default(),
    };
    struct Flood;
    impl Node for Flood {
        type Msg = u64;
        fn on_start(&mut self, _: Time, out: &mut Outbox<u64>) {
            for i in 0..(meridian_runtime::tcp::WRITER_MESSAGES_MAX as u64 * 2) {
                out.send(NodeId(1), i);
            }
        }
        fn on_message(&mut self, _: Time, _: NodeId, _: u64, _: &mut Outbox<u64>) {}
        fn on_timer(&mut self, _: Time, _: TimerId, _: &mut Outbox<u64>) {}
        fn on_persisted(&mut self, _: Time, _: PersistToken, _: &mut Outbox<u64>) {}
        fn submit(&mut self, _: Time, _: ClientRequest, _: &mut Outbox<u64>) {}
    }
    let nodes = vec![(NodeId(0), Flood, None::<Arc<Mutex<ClientPool>>>)];
    let cluster = Cluster::start(config, nodes).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(cluster.dropped_messages() > 0, "the surplus was dropped and counted");
    let stopped = tokio::time::timeout(Duration::from_secs(10), cluster.stop()).await;
    assert_eq!(stopped.expect("the node still serves (it stops when asked)").len(), 1);
}

fn free_addrs(count: usize) -> Vec<SocketAddr> {
    let listeners: Vec<std::net::TcpListener> =
        (0..count).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    listeners.iter().map(|l| l.local_addr().unwrap()).collect()
}

struct OccSetup {
    topology: Arc<Topology>,
    workload: Arc<dyn meridian_workloads::Workload>,
    tcp: TcpConfig,
}

impl OccSetup {
    fn new() -> Self {
        let topology = two_node_topology();
        let workload: Arc<dyn meridian_workloads::Workload> = Arc::from(
            meridian_workloads::build(
                "micro-luigi",
                &WorkloadOptions {
                    shards: 1,
                    keys_per_shard: 1_000,
                    zipf_theta: Some(0.9),
                    ops_max: None,
                    distribution: None,
                    region_groups: None,
                    tpcc: Default::default(),
                },
            )
            .unwrap(),
        );
        let tcp = TcpConfig::new(free_addrs(2), 42);
        Self { topology, workload, tcp }
    }

    fn node(&self, id: NodeId) -> OccNode {
        OccNode::new(NodeContext::new(
            id,
            self.topology.clone(),
            Arc::new(self.workload.registry()),
            Arc::new(self.workload.partitioner()),
            3,
            Timing::for_network(0),
        ))
    }

    fn config(&self) -> ClusterConfig {
        ClusterConfig {
            topology: self.topology.clone(),
            network: NetworkModel::preset("metro", 1).unwrap(),
            clock: ClockModel::preset("chrony").unwrap(),
            seed: 3,
            tcp: Some(self.tcp.clone()),
            metrics: None,
            node_storage: Default::default(),
            storage: None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn occ_commits_over_tcp_on_loopback_and_bad_frames_close_only_their_connection() {
    let setup = OccSetup::new();
    // The server process's side: node 0 hosts shard 0.
    let server = Cluster::start(
        setup.config(),
        vec![(NodeId(0), setup.node(NodeId(0)), None::<Arc<Mutex<ClientPool>>>)],
    )
    .await
    .unwrap();
    // A hostile peer: an oversized length prefix, then garbage after a valid-looking length.
    for garbage in [vec![0xFF, 0xFF, 0xFF, 0xFF, 1, 2, 3], vec![0, 0, 0, 3, 0xEE, 0xEE, 0xEE]] {
        let mut stream = tokio::net::TcpStream::connect(setup.tcp.addrs[0]).await.unwrap();
        stream.write_all(&garbage).await.unwrap();
        let mut buffer = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer))
            .await
            .expect("server closes the connection");
        assert!(matches!(read, Ok(0) | Err(_)), "the connection must be closed");
    }
    // The benchmark process's side: node 1 coordinates 8 clients.
    let generators = (0..8).map(|c| (NodeId(1), setup.workload.generator(c, 3))).collect();
    let pool = Arc::new(Mutex::new(ClientPool::new(0, generators)));
    let client_side = Cluster::start(
        setup.config(),
        vec![(NodeId(1), setup.node(NodeId(1)), Some(pool.clone()))],
    )
    .await
    .unwrap();
    let mut completions = Vec::new();
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        completions.extend(pool.lock().unwrap().drain_completions());
        if completions.len() >= 300 {
            break;
        }
    }
    pool.lock().unwrap().stop();
    for _ in 0..200 {
        if pool.lock().unwrap().finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    completions.extend(pool.lock().unwrap().drain_completions());
    assert!(pool.lock().unwrap().finished(), "every request was answered");
    assert!(completions.len() >= 300, "only {} completions", completions.len());
    assert!(completions.iter().all(|c| c.outcome.result == TxnResult::Committed));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let coordinator = client_side.stop().await;
    let servers = server.stop().await;
    // Every commit the clients saw is in the server's store (the last-writer invariant).
    let mut check = setup.workload.checker();
    for completion in &completions {
        check.observe(completion);
    }
    let verdicts = check.check(&servers[0].node.stores());
    assert!(verdicts.iter().all(|v| v.passed), "{verdicts:?}");
    // Both directions measured their delays over TCP: metro is 0.5 ms inside a region.
    let links: Vec<_> = coordinator.iter().chain(&servers).flat_map(|r| r.delays.clone()).collect();
    assert_eq!(links.len(), 2);
    assert!(links.iter().all(|l| l.count > 0 && l.configured_p50_us == 500));
}
