//! CPU cost of one `occ` (or `2pl`) transaction in the protocol code alone (no runtime, no
//! threads): a coordinator and a one-shard participant exchange their messages by direct
//! calls, so this measures what the state machines do per transaction and makes a regression
//! in them (or in the store under them) visible without the noise of a loaded machine. The
//! end-to-end figure is `meridian bench --shards 1 --replicas 1 --regions 1 --network lan
//! --clients 64`, compared as interleaved rounds with `scripts/ab.sh`. `2pl_ycsb-a-4ops_1x1`
//! is the lock manager's hardest setting here (4-operation YCSB-A transactions under `2pl`
//! no-wait).
//!
//! `cargo bench -p meridian-protocols --bench occ_round`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use meridian_core::node::{ClientRequest, Effect, Node, Outbox, TimerId};
use meridian_core::topology::Topology;
use meridian_core::{NodeId, RequestId};
use meridian_protocols::engine::{OccMsg, OccNode};
use meridian_protocols::twopl::TwoPl;
use meridian_protocols::{NodeContext, Protocol, ProtocolNode, Timing};
use meridian_workloads::{Workload, WorkloadOptions};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

/// The binary's allocator (`crates/meridian`), so allocation costs what it costs there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Transactions per measured batch.
const BATCH: u64 = 1_000;
/// Virtual time between two transactions: about the rate the embedded benchmark reaches, so
/// the history the stores keep (a retention of time, pruned by the nodes' timers) is as long
/// as there.
const TXN_GAP_NS: u64 = 10_000;

struct Pair {
    nodes: Vec<OccNode>,
    generator: Box<dyn meridian_workloads::TxnGenerator>,
    request: u64,
    now: u64,
    queue: VecDeque<(NodeId, NodeId, OccMsg)>,
    /// Timers set, by due time (and the order they were set): fired as virtual time passes.
    timers: BinaryHeap<Reverse<(u64, u64, NodeId, TimerId)>>,
    timers_set: u64,
    out: Outbox<OccMsg>,
}

impl Pair {
    fn new(workload: &str, locking: bool, ops_max: Option<u32>) -> Self {
        let topology = Arc::new(Topology::standard(vec!["r0".into()], 1, 1).expect("valid"));
        let options =
            WorkloadOptions { shards: 1, keys_per_shard: 100_000, ops_max, ..Default::default() };
        let workload: Arc<dyn Workload> =
            Arc::from(meridian_workloads::build(workload, &options).expect("workload"));
        let registry = Arc::new(workload.registry());
        let partitioner = Arc::new(workload.partitioner());
        let mut nodes: Vec<OccNode> = topology
            .node_ids()
            .map(|id| {
                let context = NodeContext::new(
                    id,
                    topology.clone(),
                    registry.clone(),
                    partitioner.clone(),
                    1,
                    Timing::for_network(0),
                );
                if locking {
                    TwoPl::restore(context, &Default::default()).expect("an empty log restores")
                } else {
                    OccNode::new(context)
                }
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
            timers: BinaryHeap::new(),
            timers_set: 0,
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
            match effect {
                Effect::Send { to, msg } => self.queue.push_back((from, to, msg)),
                Effect::SetTimer { timer, after_ns } => {
                    self.timers_set += 1;
                    let due = self.now + after_ns;
                    self.timers.push(Reverse((due, self.timers_set, from, timer)));
                }
                _ => {}
            }
        }
    }

    /// Delivers every message queued, and what they cause.
    fn deliver(&mut self) {
        while let Some((from, to, msg)) = self.queue.pop_front() {
            self.nodes[to.0 as usize].on_message(self.now, from, msg, &mut self.out);
            self.drain(to);
        }
    }

    /// Runs one transaction from submission to the coordinator's reply, after the timers due
    /// by then (the participants' garbage collection among them).
    fn one(&mut self) {
        self.request += 1;
        self.now += TXN_GAP_NS;
        while let Some(&Reverse((due, _, node, timer))) = self.timers.peek() {
            if due > self.now {
                break;
            }
            self.timers.pop();
            self.nodes[node.0 as usize].on_timer(self.now, timer, &mut self.out);
            self.drain(node);
            self.deliver();
        }
        let txn = self.generator.next(RequestId(self.request));
        let coordinator = NodeId(1);
        let request = ClientRequest { id: RequestId(self.request), txn };
        self.nodes[1].submit(self.now, request, &mut self.out);
        self.drain(coordinator);
        self.deliver();
    }
}

fn occ_round(c: &mut Criterion) {
    let mut group = c.benchmark_group("occ_round");
    group.throughput(Throughput::Elements(BATCH));
    let cases = [
        ("micro-luigi_1x1", "micro-luigi", false, None),
        ("ycsb-a_1x1", "ycsb-a", false, None),
        ("2pl_ycsb-a-4ops_1x1", "ycsb-a", true, Some(4)),
    ];
    for (name, workload, locking, ops_max) in cases {
        let mut pair = Pair::new(workload, locking, ops_max);
        group.bench_function(name, |b| {
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
