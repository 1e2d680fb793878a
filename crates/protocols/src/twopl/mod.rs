//! `2pl`: strict two-phase locking at key granularity with two-phase commit across shards.
//!
//! It shares `occ`'s layered two-phase commit engine (`crate::occ`: the coordinator's waves of
//! pieces, prepare, decide, deliver; the participants' prepare and decision records in each
//! shard's Raft log, termination without a coordinator, the forgetting rule) and differs in
//! the concurrency control at the participant, which this module holds:
//!
//! - **Execution takes locks.** A shard leader runs a piece only once the attempt holds shared
//!   locks on the keys it reads, exclusive locks on the keys it may write (an upgrade when it
//!   read them first) and shared range locks on what it scans. Locks are held to the decision.
//! - **Conflicts** follow the policy (`2pl-policy`): `no-wait` refuses at once (the attempt
//!   aborts everywhere and retries after backoff); `wound-wait` lets an older attempt (by its
//!   request's first submission) wound younger holders that have not prepared (their locks are
//!   released and they abort) and wait for older ones; a younger attempt waits. Waits form no
//!   cycle: waiters queue oldest first and the oldest never waits for a younger one. A scan
//!   that meets an exclusive lock is refused under both policies (ranges have no queue).
//! - **Prepare** needs the attempt to still hold its locks at the leader; its record in the
//!   log then carries the read and write keys, so every replica holds the prepared attempt's
//!   locks and a new leader after a failover keeps them. Execution locks of attempts not yet
//!   prepared live only at the leader: a leader change drops them, and those attempts fail to
//!   prepare (their coordinator retries).
//! - **Lease**: locks of an attempt that has not been active for `LEASE_TIMEOUTS` RPC timeouts
//!   and has not prepared are released (its coordinator is gone or cut off), so a vanished
//!   client never holds locks forever.
//!
//! A single-shard transaction commits in one round as under `occ`: it runs and commits
//! atomically at its shard if no other attempt holds a conflicting lock (never waiting,
//! whatever the policy: it holds nothing while it would wait).

pub(crate) mod cc;
pub(crate) mod locking;

use crate::engine::{Family, OccNode, Style};
use crate::kit::locks::Policy;
use crate::{Durable, NodeContext, OptionKind, OptionSpec, Protocol, Replayed};
use meridian_core::topology::Topology;
use meridian_core::{ConfigError, NodeId};
use std::sync::Arc;

/// The `2pl` protocol.
pub struct TwoPl;

/// `2pl-policy`: what a lock conflict does.
pub const OPTION_POLICY: &str = "2pl-policy";

impl Protocol for TwoPl {
    const NAME: &'static str = "2pl";
    const SUMMARY: &'static str =
        "strict two-phase locking (no-wait or wound-wait) and 2PC across shards over Raft";
    const OPTIONS: &'static [OptionSpec] = &[OptionSpec {
        name: OPTION_POLICY,
        help: "on a lock conflict: no-wait refuses at once (the attempt retries); wound-wait \
               lets older attempts wound younger ones and younger ones wait",
        kind: OptionKind::Choice { values: &["no-wait", "wound-wait"], default: "no-wait" },
    }];
    const COMPARE: &'static [&'static [(&'static str, &'static str)]] =
        &[&[(OPTION_POLICY, "no-wait")], &[(OPTION_POLICY, "wound-wait")]];
    type Node = OccNode;

    fn check_topology(topology: &Topology) -> Result<(), ConfigError> {
        crate::engine::check_topology(Self::NAME, topology)
    }

    fn may_crash(topology: &Topology, node: NodeId) -> bool {
        crate::engine::may_crash(topology, node)
    }

    fn restore(context: NodeContext, durable: &Durable) -> Result<OccNode, String> {
        let policy = match context.options.choice(OPTION_POLICY, Self::OPTIONS) {
            "wound-wait" => Policy::WoundWait,
            _ => Policy::NoWait,
        };
        OccNode::restore_as(context, durable, family(policy))
    }

    fn replay_committed(node: &mut OccNode) -> Replayed {
        node.replay_committed()
    }
}

/// `2pl` in the engine: execution locks under `policy`.
pub(crate) fn family(policy: Policy) -> Family {
    Family {
        name: TwoPl::NAME,
        control: Arc::new(move |_| Box::new(cc::ExecutionLocks::new(policy))),
        style: Style {
            one_round: (crate::occ::OPTION_ONE_ROUND, crate::occ::Occ::OPTIONS),
            locks_at_execution: true,
            timestamps: false,
        },
        speculation: None,
    }
}
