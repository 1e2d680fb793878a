//! `occ`: optimistic concurrency control with read validation (Silo-style) and two-phase
//! commit across shards (docs/protocols/occ.md), on the family's engine ([`crate::engine`],
//! whose module documentation walks through an attempt).
//!
//! Execution reads the newest committed state at the shard leader and keeps nothing; prepare
//! validates every read and scan and locks them with the writes until the decision; commits
//! land above every version their keys hold. Single-shard transactions execute and commit in
//! one round trip (option `occ-one-round`).

mod validation;

use crate::engine::{self, Family, OccNode, Style};
use crate::{Durable, NodeContext, OptionKind, OptionSpec, Protocol, Replayed};
use meridian_core::topology::Topology;
use meridian_core::{ConfigError, NodeId};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The `occ` protocol.
pub struct Occ;

/// `occ` in the engine: validation at prepare.
pub(crate) fn family() -> Family {
    Family {
        name: Occ::NAME,
        control: Arc::new(|_| Box::new(validation::Validation)),
        style: Style {
            one_round: (OPTION_ONE_ROUND, Occ::OPTIONS),
            locks_at_execution: false,
            timestamps: false,
        },
        speculation: None,
    }
}

/// `occ-one-round`: single-shard transactions execute and commit in one round trip.
pub const OPTION_ONE_ROUND: &str = "occ-one-round";

impl Protocol for Occ {
    const NAME: &'static str = "occ";
    const SUMMARY: &'static str =
        "OCC with read validation and 2PC across shards, each shard a Raft group";
    const OPTIONS: &'static [OptionSpec] = &[OptionSpec {
        name: OPTION_ONE_ROUND,
        help: "single-shard transactions execute and commit at their shard in one round trip \
               (off: execute, then a one-phase prepare)",
        kind: OptionKind::Choice { values: &["on", "off"], default: "on" },
    }];
    type Node = OccNode;

    /// One replica per shard (in memory) or an odd number (a Raft group per shard).
    fn check_topology(topology: &Topology) -> Result<(), ConfigError> {
        engine::check_topology(Self::NAME, topology)
    }

    fn may_crash(topology: &Topology, node: NodeId) -> bool {
        engine::may_crash(topology, node)
    }

    fn restore(context: NodeContext, durable: &Durable) -> Result<OccNode, String> {
        OccNode::restore_as(context, durable, family())
    }

    fn replay_committed(node: &mut OccNode) -> Replayed {
        node.replay_committed()
    }
}

/// `occ`'s nodes, built directly (tests and benchmarks that run `occ` alone).
impl OccNode {
    /// Builds an `occ` node described by `context` on an empty disk.
    pub fn new(context: NodeContext) -> Self {
        Self::restore(context, &BTreeMap::new()).expect("an empty log always restores")
    }

    /// Builds an `occ` node described by `context` from what its disk holds (`durable`).
    pub fn restore(context: NodeContext, durable: &Durable) -> Result<Self, String> {
        Self::restore_as(context, durable, family())
    }
}
