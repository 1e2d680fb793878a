//! Luigi: the leaders-only variant of Tiga, from a course project's fork of Mako, built as
//! its authors meant it and with the bugs they and we found fixed.
//!
//! A coordinator stamps each one-shot transaction with `send time + the largest one-way delay
//! to a participant leader + Δ` and sends it to the **leaders only**. A leader holds it until
//! its clock passes the timestamp (nanoseconds throughout: the published code compares a
//! millisecond stamp against a microsecond clock and never waits), agrees on the timestamp
//! with the other participant leaders before executing (Tiga's preventive mode, the three
//! cases), executes at the agreed timestamp and answers the coordinator with the shard's
//! result, then replicates its log to its followers, bodies included (followers execute the
//! log in order, as tiga's do).
//!
//! **Commit gated on replication, with watermarks.** Each leader keeps a watermark per worker
//! (per coordinator node: the vector is sized to the cluster's nodes, not to one worker as in
//! the published server) and sends a coordinator its watermark whenever it rises
//! ([`streams`]). The coordinator reports a transaction committed once every participant
//! leader's result is in and every participant's watermark covers the **agreed** timestamp
//! (the published code checks the proposed one, and its watermark path is never called).
//! One ordered log per shard carries every worker's entries, and watermarks are derived from
//! it per worker: followers must replay conflicting transactions in the leader's order, which
//! one log gives; Luigi's per-worker replication threads exist for parallelism on its
//! multi-threaded servers, which a sans-IO node does not have.
//!
//! Everything else is tiga's ([`crate::tiga::node`], which takes luigi's [`VARIANT`]):
//! the hold queue with per-key read and write stamps (the published code hashes keys to 32
//! bits and does not tell reads from writes), the agreement, votes for cross-shard user
//! aborts, resends with the same transaction id and at-most-once execution.
//!
//! A leader journals as tiga's do, and the watermarks it tells as well; a restarted one leads
//! on from its journal (see [`crate::tiga::journal`]), and a follower from its own journal as
//! tiga's do (one with nothing journaled rejoins by tiga's state transfer).
//!
//! **Leader failover** is tiga's view change through tiga's view manager, hosted in the
//! nodes (`luigi-view-manager`, `luigi-detect-ms`): a follower rebuilds the shard's log from
//! a majority's reports (an entry a watermark covered is on a majority, so in one of any
//! `f + 1` reports) and leads it with watermarks that count from nothing: every entry of the
//! rebuilt log is unreplicated until a majority of the new view holds it. Coordinators
//! forget the old leader's watermark and every result of the old view, reopen what waited
//! for a watermark, and resend to the new leaders; followers keep the results of what they
//! executed so that a promoted one answers for them.

pub mod streams;

use std::collections::BTreeMap;
use streams::Streams;

use crate::tiga;
use crate::tiga::journal::{JournaledView, Recovered, Seqs};
use crate::tiga::node::{self, Dispatch, ManagerSettings, Prefix, TigaNode, Variant};
use crate::tiga::owd::OwdSettings;
use crate::tiga::view::View;
use crate::{
    Durable, Guarantee, NodeContext, OptionKind, OptionSpec, Protocol, ProtocolOptions, Replayed,
};
use meridian_core::topology::Topology;
use meridian_core::{ConfigError, NodeId, ShardId};

/// `luigi-headroom-ms`: Δ, added to every timestamp.
pub const OPTION_HEADROOM_MS: &str = "luigi-headroom-ms";
/// `luigi-owd-percentile`: the percentile of the delay samples taken as the estimate.
pub const OPTION_OWD_PERCENTILE: &str = "luigi-owd-percentile";
/// `luigi-view-manager`: whether the nodes host the view manager (tiga's).
pub const OPTION_VIEW_MANAGER: &str = "luigi-view-manager";
/// `luigi-detect-ms`: how long a shard leader may stay silent before the view manager
/// replaces it.
pub const OPTION_DETECT_MS: &str = "luigi-detect-ms";

/// Luigi's options.
pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: OPTION_HEADROOM_MS,
        help: "Δ in milliseconds, added to every timestamp (Luigi's default: 10)",
        kind: OptionKind::Number { min: 0.0, max: 1_000.0, default: 10.0 },
    },
    OptionSpec {
        name: OPTION_OWD_PERCENTILE,
        help: "the percentile of each leader's recent one-way delays taken as its estimate",
        kind: OptionKind::Number { min: 1.0, max: 100.0, default: 50.0 },
    },
    OptionSpec {
        name: OPTION_VIEW_MANAGER,
        help: "on: 2f + 1 server nodes host the view manager (a Raft group), which replaces a \
               shard leader silent for luigi-detect-ms by the next view; off: views change \
               only when a test's scenario gives one (one replica per shard has no manager \
               either way)",
        kind: OptionKind::Choice { values: &["on", "off"], default: "on" },
    },
    OptionSpec { name: OPTION_DETECT_MS, ..tiga::DETECT_MS_OPTION },
];

/// How a luigi coordinator stamps, from `options` (parsed against [`OPTIONS`], so in range).
pub fn owd_settings(options: &ProtocolOptions) -> OwdSettings {
    tiga::owd_settings(
        options.number(OPTION_HEADROOM_MS, OPTIONS),
        options.number(OPTION_OWD_PERCENTILE, OPTIONS),
    )
}

/// The view manager's settings from `options` (parsed against [`OPTIONS`]): hosted or not,
/// its detection timeout, and preventive views (Luigi's leaders always agree before
/// executing).
fn manager_settings(options: &ProtocolOptions) -> ManagerSettings {
    let on = options.choice(OPTION_VIEW_MANAGER, OPTIONS) == "on";
    let detect_ms = options.number(OPTION_DETECT_MS, OPTIONS);
    let detect_ns = (detect_ms * meridian_core::time::NS_PER_MS as f64) as u64;
    ManagerSettings { on, detect_ns, mode: tiga::Mode::Preventive }
}

/// Luigi's starting view: leaders together where the layout allows, preventive.
fn starting_view(topology: &Topology, _options: &ProtocolOptions) -> Result<View, String> {
    node::initial_view(topology)
}

/// How luigi departs from tiga on tiga's node: transactions go to the shard leaders only,
/// whose per-worker watermarks ([`streams`]) commit them.
pub const VARIANT: Variant = Variant {
    name: "luigi",
    prefix: Prefix::Luigi,
    dispatch: Dispatch::LeadersOnly { watermarks: Streams::boxed },
    manager: manager_settings,
    starting_view,
};

/// A luigi node of `context`, stamping with `owd`, in its starting view.
pub fn node(context: NodeContext, owd: OwdSettings) -> Result<TigaNode, String> {
    TigaNode::of(context, VARIANT, owd, false)
}

/// A luigi node of `context` (stamping with `owd`) that restarted with `shards` found in its
/// journal, in the view the journal holds or, without one, its starting view.
pub fn restored(
    context: NodeContext,
    owd: OwdSettings,
    shards: BTreeMap<ShardId, Recovered>,
    seqs: Seqs,
    view: Option<JournaledView>,
) -> Result<TigaNode, String> {
    TigaNode::restored_as(context, VARIANT, owd, false, shards, seqs, view)
}

/// The `luigi` protocol.
pub struct Luigi;

impl Protocol for Luigi {
    const NAME: &'static str = "luigi";
    const SUMMARY: &'static str =
        "Luigi: tiga's timestamp ordering through the shard leaders only, agreement before \
         execution, commit once per-worker replication watermarks cover the agreed timestamp";
    const OPTIONS: &'static [OptionSpec] = OPTIONS;
    /// As tiga: serializable in (agreed timestamp, id) order whatever the clocks do, strict
    /// while they are synchronized.
    const GUARANTEE: Guarantee = Guarantee::StrictWithSyncedClocks;
    type Node = TigaNode;

    fn check_topology(topology: &Topology) -> Result<(), ConfigError> {
        tiga::check_replicas("luigi", topology)
    }

    /// Any node, as for tiga: leaders and followers restart from their journals.
    fn may_crash(_topology: &Topology, _node: NodeId) -> bool {
        true
    }

    /// The same one-shot transactions as tiga.
    fn check_workload(
        workload: &meridian_core::txn::WorkloadSample,
        topology: &Topology,
    ) -> Result<(), ConfigError> {
        crate::check_sampled_requests("luigi", workload, topology, node::check_request)
    }

    fn initial_leader(
        topology: &Topology,
        _options: &ProtocolOptions,
        shard: ShardId,
    ) -> Option<NodeId> {
        let view = node::initial_view(topology).ok()?;
        topology.replica_node(shard, view.leader_slot(shard, topology.replicas))
    }

    /// Per participant shard: the round trip to its leader, plus Δ, plus the round trip from
    /// the leader to the follower that completes a majority (the watermark waits for it);
    /// the largest over the shards. The leaders' agreement overlaps the hold when the
    /// leaders sit together (the view puts them together where the layout allows) and is
    /// left out.
    fn latency_bound_ns(
        topology: &Topology,
        network: &meridian_core::netmodel::NetworkModel,
        options: &ProtocolOptions,
        region: meridian_core::RegionId,
    ) -> Option<u64> {
        let view = node::initial_view(topology).ok()?;
        let region_of = |node: NodeId| Some(topology.nodes.get(node.0 as usize)?.region.0 as usize);
        let rtt = |from: usize, to: usize| {
            network.link(from, to).median_ns() + network.link(to, from).median_ns()
        };
        let f = (topology.replicas as usize - 1) / 2;
        let mut bound = 0;
        for shard in 0..topology.shards {
            let shard = ShardId(shard);
            let leader =
                topology.replica_node(shard, view.leader_slot(shard, topology.replicas))?;
            let at = region_of(leader)?;
            let mut followers: Vec<u64> = topology
                .shard_nodes(shard)
                .into_iter()
                .filter(|&n| n != leader)
                .map(|n| region_of(n).map(|r| rtt(at, r)))
                .collect::<Option<_>>()?;
            followers.sort_unstable();
            let replication = if f == 0 { 0 } else { followers.get(f - 1).copied()? };
            bound = bound.max(rtt(region.0 as usize, at) + replication);
        }
        Some(bound + owd_settings(options).headroom_ns)
    }

    /// As tiga's: a leader leads on from its journal (with the watermarks it told), a
    /// follower takes up its own (a luigi follower journals its synced entries and outcomes),
    /// in the view the journal holds; a member of the view manager's group takes up its own.
    fn restore(context: NodeContext, durable: &Durable) -> Result<TigaNode, String> {
        let (shards, next_seq, view) = tiga::journal::recover_with_view(durable)?;
        let owd = owd_settings(&context.options);
        let mut node = restored(context, owd, shards, next_seq, view)?;
        node.host_manager(durable)?;
        Ok(node)
    }

    fn replay_committed(node: &mut TigaNode) -> Replayed {
        node.replay_journal()
    }
}
