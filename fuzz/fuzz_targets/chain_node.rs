//! A small `chain` cluster (3 shards × 1 replica, `smallbank` with 4 accounts per shard, so
//! chains cross shards and collide) running the shared script ([`script`]): real transactions
//! while arbitrary decoded `ChainMsg`s arrive at its nodes from any sender.
#![no_main]

#[path = "common/script.rs"]
mod script;

use libfuzzer_sys::fuzz_target;
use meridian_core::time::NS_PER_MS;
use meridian_core::topology::Topology;
use meridian_protocols::chain::node::ChainNode;
use meridian_protocols::{NodeContext, ProtocolNode, Timing};
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    let options = meridian_workloads::WorkloadOptions {
        shards: 3,
        keys_per_shard: 4,
        ..meridian_workloads::WorkloadOptions::default()
    };
    let workload = meridian_workloads::build("smallbank", &options).expect("a workload");
    let regions = vec!["a".to_string(), "b".to_string(), "c".to_string()];
    let topology = Arc::new(Topology::standard(regions, 3, 1).expect("a topology"));
    let registry = Arc::new(workload.registry());
    let partitioner = Arc::new(workload.partitioner());
    let nodes: Vec<ChainNode> = topology
        .node_ids()
        .map(|id| {
            let timing = Timing::for_network(NS_PER_MS);
            let context = NodeContext::new(
                id,
                topology.clone(),
                registry.clone(),
                partitioner.clone(),
                1,
                timing,
            );
            let mut node = ChainNode::new(context);
            for (shard, store) in node.stores_mut() {
                workload.load(shard, store);
            }
            node
        })
        .collect();
    script::run_script(data, nodes, workload.as_ref());
});
