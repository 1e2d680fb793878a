//! `chain`: CrossStitch's chained transactions with pipelined commit (PLC). A transaction is
//! a chain of states (a procedure's pieces, in plan order; consecutive pieces on one shard
//! form one hop, the paper's logical state), and the coordinator ships it to the server of the
//! first hop, which runs its pieces and ships it, with their outputs, to the next: keys may
//! depend on anything read earlier, and states in one region run back to back, crossing the
//! wide area once per change of region rather than once per read. The commit protocol runs
//! alongside ([`node`]): acknowledgements flow back one hop, precommits forward, and the last
//! hop decides; there is no central coordinator. Concurrency control is multi-version
//! timestamp ordering with the coordinator's timestamp and cascading aborts ([`server`]).
//!
//! **Guarantee.** Histories are serializable in timestamp order whatever the clocks do, and
//! strictly serializable while coordinator clocks are synchronized (as `2pc-mvto`).
//!
//! **Replication.** Each shard's server is a state machine on the shard's Raft group
//! ([`machine`], hosted by the kit): running a hop, a hop's vote, aborts and decisions are log
//! entries, so a failed server's state lives on in its shard's other replicas (the role of the
//! paper's key replicas and transaction replicas) and a new leader carries on. With
//! `chain-replication=overlapped` (the default) a hop's leader acknowledges, ships on and
//! precommits ahead of its log, and the last hop commits only once every earlier hop's vote
//! is in its shard's log (`Durable`); with `serial` each entry is in the log before anyone
//! hears of it. Decisions are delivered only once in the deciding shard's log, either way.

pub mod machine;
pub mod node;
pub mod server;

use crate::{Durable, Guarantee, NodeContext, Protocol, Replayed};
use meridian_core::topology::Topology;
use meridian_core::{ConfigError, NodeId};

/// `chain-replication`: whether a hop's leader waits for its log before it goes on.
pub const OPTION_REPLICATION: &str = "chain-replication";

/// The options of `chain`.
pub const OPTIONS: &[crate::OptionSpec] = &[crate::OptionSpec {
    name: OPTION_REPLICATION,
    help: "overlapped: a hop's leader ships the attempt on and sends its precommit at once, \
           ahead of its log, and the last hop commits only once every hop's vote is in its \
           shard's log (CrossStitch's replication off the chain's path); serial: each hop's \
           run and vote are in its shard's log before the next hop hears of them",
    kind: crate::OptionKind::Choice { values: &["overlapped", "serial"], default: "overlapped" },
}];

/// The `chain` protocol.
pub struct Chain;

impl Protocol for Chain {
    const NAME: &'static str = "chain";
    const SUMMARY: &'static str = "CrossStitch: transactions shipped hop by hop down a chain of \
                                   states, pipelined commit, multi-version timestamp ordering";
    const OPTIONS: &'static [crate::OptionSpec] = OPTIONS;
    const GUARANTEE: Guarantee = Guarantee::StrictWithSyncedClocks;
    type Node = node::ChainNode;

    fn check_topology(topology: &Topology) -> Result<(), ConfigError> {
        if topology.replicas != 1 && topology.replicas.is_multiple_of(2) {
            return Err(ConfigError::new(format!(
                "chain replicates each shard's server with Raft, which needs an odd replica \
                 count (got {})",
                topology.replicas
            )));
        }
        Ok(())
    }

    /// With replicated shards every node may crash (its log is durable and its group has
    /// other members); an unreplicated server keeps its shard only in memory in the
    /// simulator, so only nodes that host no replica may.
    fn may_crash(topology: &Topology, node: NodeId) -> bool {
        topology.replicas >= 3 || topology.nodes[node.0 as usize].replicas.is_empty()
    }

    /// A sample of the workload's transactions (from two clients) must plan.
    fn check_workload(
        workload: &meridian_core::txn::WorkloadSample,
        topology: &Topology,
    ) -> Result<(), ConfigError> {
        crate::check_sampled_requests("chain", workload, topology, check_request)
    }

    fn restore(context: NodeContext, durable: &Durable) -> Result<node::ChainNode, String> {
        node::ChainNode::restore(context, durable)
    }

    fn replay_committed(node: &mut node::ChainNode) -> Replayed {
        node.replay_committed()
    }
}

/// Checks that `chain` can run `request`: it plans.
pub fn check_request(
    context: &NodeContext,
    request: &meridian_core::txn::TxnRequest,
) -> Result<(), meridian_core::txn::ProcError> {
    crate::kit::coord::bind_plan(context, request, meridian_core::ShardId(0)).map(|_| ())
}
