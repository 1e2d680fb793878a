//! The `tiga_node` cluster in detective mode with its leaders apart (`tiga-leaders=spread`):
//! leaders run transactions before their agreement settles and revoke what moved, while
//! arbitrary decoded `TigaMsg`s arrive at its nodes from any sender.
#![no_main]

#[path = "common/script.rs"]
mod script;

use libfuzzer_sys::fuzz_target;
use meridian_protocols::tiga::node::TigaNode;
use meridian_protocols::ProtocolKind;

fuzz_target!(|data: &[u8]| {
    let (nodes, workload) = script::cluster(3, |mut context| {
        let given = [("tiga-leaders", "spread"), ("tiga-mode", "detective")]
            .map(|(k, v)| (k.to_string(), v.to_string()));
        context.options = ProtocolKind::Tiga.options(&given).expect("tiga's options");
        TigaNode::new(context).expect("a node")
    });
    // Messages of another view are dropped first thing (a unit test covers that): forge
    // the node's own, so the fuzzer reaches what lies behind the check.
    script::run_script_with(data, nodes, workload.as_ref(), |node, msg| {
        msg.set_view(node.view_number())
    });
});
