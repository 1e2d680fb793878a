//! CPU cost of one `occ` transaction in the protocol code alone (no runtime, no threads): a
//! coordinator and a one-shard participant exchange their messages by direct calls, so this
//! measures what the state machines do per transaction and makes a regression in them (or in
//! the store under them) visible without the noise of a loaded machine. The end-to-end
//! figure is `meridian bench --shards 1 --replicas 1 --regions 1 --network lan --clients 64`,
//! compared as interleaved rounds with `scripts/ab.sh`.
//!
//! `cargo bench -p meridian-protocols --bench occ_round`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use meridian_core::node::{ClientRequest, Effect, Node, Outbox};
use meridian_core::topology::Topology;
use meridian_core::{NodeId, RequestId};
use meridian_protocols::occ::{OccMsg, OccNode};
use meridian_protocols::{NodeContext, ProtocolNode, Timing};
use meridian_workloads::{Workload, WorkloadOptions};
use std::collections::VecDeque;
use std::sync::Arc;

/// Transactions per measured batch.
const BATCH: u64 = 1_000;

struct Pair {
    nodes: Vec<OccNode>,
    generator: Box<dyn meridian_workloads::TxnGenerator>,
    request: u64,
    now: u64,
    queue: VecDeque<(NodeId, NodeId, OccMsg)>,
    out: Outbox<OccMsg>,
}

impl Pair {
    fn new(workload: &str) -> Self {
        let topology = Arc::new(Topology::standard(vec!["r0".into()], 1, 1).expect("valid"));
        let options = WorkloadOptions { shards: 1, keys_per_shard: 100_000, ..Default::default() };
        let workload: Arc<dyn Workload> =
            Arc::from(meridian_workloads::build(workload, &options).expect("workload"));
        let registry = Arc::new(workload.registry());
        let partitioner = Arc::new(workload.partitioner());
        let mut nodes: Vec<OccNode> = topology
            .node_ids()
            .map(|id| {
                OccNode::new(NodeContext::new(
                    id,
                    topology.clone(),
                    registry.clone(),
                    partitioner.clone(),
                    1,
                    Timing::for_network(0),
                ))
            })
            .collect();
        for node in &mut nodes {
            for (shard, store) in node.stores_mut() {
                workload.load(shard, store);
            }
        }
        let mut pair = Self {
            nodes,
            generator: workload.generator(0, 1),
            request: 0,
            now: 1_000_000_000,
            queue: VecDeque::new(),
            out: Outbox::new(),
        };
        for id in 0..pair.nodes.len() {
            pair.nodes[id].on_start(pair.now, &mut pair.out);
            pair.drain(NodeId(id as u32));
        }
        pair
    }

    fn drain(&mut self, from: NodeId) {
        for effect in self.out.drain() {
            if let Effect::Send { to, msg } = effect {
                self.queue.push_back((from, to, msg));
            }
        }
    }

    /// Runs one transaction from submission to the coordinator's reply.
    fn one(&mut self) {
        self.request += 1;
        self.now += 1_000;
        let txn = self.generator.next(RequestId(self.request));
        let coordinator = NodeId(1);
        let request = ClientRequest { id: RequestId(self.request), txn };
        self.nodes[1].submit(self.now, request, &mut self.out);
        self.drain(coordinator);
        while let Some((from, to, msg)) = self.queue.pop_front() {
            self.nodes[to.0 as usize].on_message(self.now, from, msg, &mut self.out);
            self.drain(to);
        }
    }
}

fn occ_round(c: &mut Criterion) {
    let mut group = c.benchmark_group("occ_round");
    group.throughput(Throughput::Elements(BATCH));
    for workload in ["micro-luigi", "ycsb-a"] {
        let mut pair = Pair::new(workload);
        group.bench_function(format!("{workload}_1x1"), |b| {
            b.iter(|| {
                for _ in 0..BATCH {
                    pair.one();
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, occ_round);
criterion_main!(benches);
