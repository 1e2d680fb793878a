//! A small `luigi` cluster (3 shards × 3 replicas, `smallbank`) running the shared script
//! ([`script`]): real transactions while arbitrary decoded `TigaMsg`s (watermarks included)
//! arrive at its nodes from any sender.
#![no_main]

#[path = "common/script.rs"]
mod script;

use libfuzzer_sys::fuzz_target;
use meridian_protocols::luigi::owd_settings;
use meridian_protocols::tiga::node::TigaNode;

fuzz_target!(|data: &[u8]| {
    let (nodes, workload) = script::cluster(3, |context| {
        let owd = owd_settings(&context.options);
        TigaNode::luigi(context, owd).expect("a node")
    });
    // Messages of another view are dropped first thing (a unit test covers that): forge
    // the node's own, so the fuzzer reaches what lies behind the check.
    script::run_script_with(data, nodes, workload.as_ref(), |node, msg| {
        msg.set_view(node.view_number())
    });
});
