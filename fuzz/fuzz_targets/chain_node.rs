//! A small `chain` cluster (3 shards × 3 replicas, each shard's server on its Raft log, and 3
//! coordinators; `smallbank` with 4 accounts per shard, so chains cross shards and collide)
//! running the shared script
//! ([`script`]): real transactions while arbitrary decoded `ChainMsg`s arrive at its nodes
//! from any sender.
#![no_main]

#[path = "common/script.rs"]
mod script;

use libfuzzer_sys::fuzz_target;
use meridian_protocols::chain::node::ChainNode;

fuzz_target!(|data: &[u8]| {
    let (nodes, workload) = script::cluster(3, ChainNode::new);
    script::run_script(data, nodes, workload.as_ref());
});
