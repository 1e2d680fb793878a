//! A small `luigi` cluster (3 shards × 3 replicas, `smallbank`) running the shared script
//! ([`script`]): real transactions while arbitrary decoded `TigaMsg`s (watermarks included)
//! arrive at its nodes from any sender. One follower starts as restarted and rejoins by a
//! state transfer.
#![no_main]

#[path = "common/script.rs"]
mod script;

use libfuzzer_sys::fuzz_target;
use meridian_protocols::luigi::owd_settings;
use meridian_protocols::tiga::node::TigaNode;

fuzz_target!(|data: &[u8]| {
    let (nodes, workload) = script::cluster(3, |mut context| {
        // Node 1 (a follower) starts as if restarted: it rejoins by a state transfer.
        if context.id.0 == 1 {
            context.incarnation = 1;
        }
        let owd = owd_settings(&context.options);
        TigaNode::luigi(context, owd).expect("a node")
    });
    // Messages of another view are dropped first thing (a unit test covers that): forge
    // the node's own, so the fuzzer reaches what lies behind the check.
    script::run_script_with(data, nodes, workload.as_ref(), |node, msg| {
        msg.set_view(node.view_number())
    });
});
