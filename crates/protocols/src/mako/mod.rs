//! `mako` (after Mako, OSDI'25): speculative OCC with two-phase commit whose replication runs
//! behind it; a transaction is reported committed once its timestamp is covered by every
//! shard's replicated watermark, and a leader failure discards the speculative commits above
//! the stable point of the failed epoch.
//!
//! It shares `occ`'s engine (`crate::occ`: the coordinator's waves of pieces, prepare with
//! read validation and locks, commit at the largest proposal, termination without a
//! coordinator, the forgetting rule) and differs in three places:
//!
//! - **Speculation** ([`crate::kit::host`]'s speculative hosting). A shard's Raft leader
//!   applies every command (prepare, decision, one-round commit) to a speculative copy of its
//!   state as soon as its log has taken it and answers from there, without waiting for the
//!   log to replicate it; every replica applies it again once committed. Execution reads the
//!   speculative state. So a multi-shard commit costs the WAN round trips of 2PC and no
//!   replication round on the way.
//! - **Durability by watermarks** ([`watermark`]). Proposals are Lamport timestamps (above
//!   the keys' versions, the shard's last timestamp and its clock), so a transaction that read
//!   a speculative write commits above it. Every few milliseconds (`mako-watermark-ms`) each
//!   leader logs a tick; applying it sets the shard's watermark to its candidate (one below
//!   the lowest prepared proposal, at most the last timestamp handed out). Leaders report the
//!   watermark of their *committed* state to every node; the coordinator answers the client
//!   only once the commit's timestamp is at or below every shard's watermark in the commit's
//!   epoch. The report's speculative latency is when the coordinator decided.
//! - **Epochs** (failover). Every attempt runs in the coordinator's epoch; a shard in another
//!   epoch, or whose epoch is closing, refuses it. Any leader change closes the epoch
//!   everywhere: the new leader logs [`Entry::EpochEnd`] before anything else, fixing its final
//!   watermark; leaders that hear of a closing epoch log theirs; once every final is known
//!   the stable point (their minimum) is logged with [`Entry::EpochStart`], which aborts every
//!   prepared attempt and discards every version above the stable point, on every replica.
//!   Nothing above it was ever reported durable, and coordinators retry those attempts (the
//!   client sees one commit, durable, or a failure).
//!
//! Costs of this implementation: a speculating leader keeps its committed state beside the
//! speculative one (twice the memory, each command applied twice), and a shard's GC keeps
//! history above the durable point, so a discard can fall back to it.

pub(crate) mod cc;
mod node;
pub mod watermark;

use crate::engine::{Family, OccNode, Style};
use crate::{Durable, NodeContext, OptionKind, OptionSpec, Protocol, Replayed};
use meridian_core::topology::Topology;
use meridian_core::{ConfigError, NodeId};
use std::sync::Arc;

/// The `mako` protocol.
pub struct Mako;

/// `mako-watermark-ms`: how often leaders tick their watermark and report it.
pub const OPTION_WATERMARK_MS: &str = "mako-watermark-ms";

impl Protocol for Mako {
    const NAME: &'static str = "mako";
    const SUMMARY: &'static str = "speculative OCC and 2PC, replicated behind the commit, \
                                   acknowledged once every shard's watermark covers it";
    const OPTIONS: &'static [OptionSpec] = &[OptionSpec {
        name: OPTION_WATERMARK_MS,
        help: "milliseconds between a leader's watermark ticks and reports (durable latency \
               grows by up to this much; shorter ticks cost log entries and messages)",
        kind: OptionKind::Number { min: 1.0, max: 1_000.0, default: 5.0 },
    }];
    type Node = OccNode;

    fn check_topology(topology: &Topology) -> Result<(), ConfigError> {
        crate::engine::check_topology(Self::NAME, topology)
    }

    fn may_crash(topology: &Topology, node: NodeId) -> bool {
        crate::engine::may_crash(topology, node)
    }

    fn restore(context: NodeContext, durable: &Durable) -> Result<OccNode, String> {
        OccNode::restore_as(context, durable, family())
    }

    fn replay_committed(node: &mut OccNode) -> Replayed {
        node.replay_committed()
    }
}

/// `mako` in the engine: validation on the leader's speculative state, inside epochs.
pub(crate) fn family() -> Family {
    Family {
        name: Mako::NAME,
        control: Arc::new(|_| Box::new(cc::Epochs::default())),
        style: Style {
            one_round: (crate::occ::OPTION_ONE_ROUND, crate::occ::Occ::OPTIONS),
            locks_at_execution: false,
            timestamps: false,
        },
        speculation: Some(node::View::boxed),
    }
}

pub use crate::engine::speculation::Entry;
