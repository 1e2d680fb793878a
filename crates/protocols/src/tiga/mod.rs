//! Tiga (SOSP'25): timestamp-ordered transactions that commit in one wide-area round trip in
//! the common case. A coordinator stamps each one-shot transaction with a future timestamp
//! (send time + the one-way delay to the farthest replica of each participant shard's closest
//! super quorum + headroom) and sends it to every replica of every participant shard; each
//! replica holds it until its clock passes the timestamp and releases transactions in
//! timestamp order; a super quorum of matching replies per shard commits it.
//!
//! **Status: runnable, without failover.** `--protocol tiga` runs in the simulator, the
//! embedded benchmark and server processes ([`node`]): stamping from measured delays, hold and
//! release in timestamp order, the leaders' agreement before execution (preventive mode) or
//! beside a speculative execution revoked if the timestamp moves (detective mode), execution
//! at the agreed timestamp, the fast path and the slow path (log synchronisation,
//! followers executing the leader's log), cross-shard user aborts (leaders exchange their
//! pieces' votes, and the outputs other shards' pieces take, before applying writes), resends
//! with the same transaction id and at-most-once execution. The parts stand on their own
//! modules, each tested: the one-way delay estimator and the timestamp rule ([`owd`]), a
//! server's hold queue ([`hold`]), the shard commit quorums and per-key log hashes
//! ([`quorum`]), the agreement's three cases ([`agree`]), a follower's log synchronisation
//! ([`log`]), one replica's sequencing core ([`replica`]), a leader's execution order
//! ([`waits`]), a coordinator's bookkeeping ([`coordinator`]), the view manager's decisions
//! ([`view`]) and replicated state ([`manager`]), and the view change's log merge
//! ([`recovery`]). `luigi` ([`crate::luigi`]) runs on the same node as a variant. Read-only
//! transactions may read a closed snapshot at one replica per shard
//! ([`OPTION_SNAPSHOT_READS`]). A leader journals what it must find again after a crash
//! ([`journal`]) and a restarted one leads on from it; a follower that restarts rejoins by a
//! state transfer from its leader. Leaders start co-located by the view manager's rule (or
//! spread with `tiga-leaders=spread`); with three or more replicas the view manager replaces
//! a crashed leader by a view change (docs/protocols/tiga.md, "The view change").

pub mod agree;
pub mod coordinator;
pub mod hold;
pub mod journal;
pub mod log;
pub mod manager;
pub mod node;
pub mod owd;
pub mod quorum;
pub mod recovery;
pub mod replica;
pub mod view;
pub mod waits;

use crate::kit::coord::PieceSlot;
use crate::{
    Durable, Guarantee, NodeContext, OptionKind, OptionSpec, Protocol, ProtocolOptions, Replayed,
};
use meridian_core::time::NS_PER_MS;
use meridian_core::topology::Topology;
use meridian_core::{ConfigError, NodeId, ShardId};
use owd::OwdSettings;
use std::collections::{BTreeMap, BTreeSet};

/// `tiga-headroom-ms`: Δ, added to every timestamp.
pub const OPTION_HEADROOM_MS: &str = "tiga-headroom-ms";
/// `tiga-owd-percentile`: the percentile of the delay samples taken as the estimate.
pub const OPTION_OWD_PERCENTILE: &str = "tiga-owd-percentile";
/// `tiga-mode`: when shard leaders agree on a timestamp.
pub const OPTION_MODE: &str = "tiga-mode";
/// `tiga-snapshot-reads`: read-only transactions read a timestamped snapshot at one replica
/// per shard.
pub const OPTION_SNAPSHOT_READS: &str = "tiga-snapshot-reads";
/// `tiga-leaders`: where the shards' leaders sit at the start.
pub const OPTION_LEADERS: &str = "tiga-leaders";
/// `tiga-view-manager`: whether the nodes host the view manager.
pub const OPTION_VIEW_MANAGER: &str = "tiga-view-manager";
/// `tiga-detect-ms`: how long a shard leader may stay silent before the view manager
/// replaces it.
pub const OPTION_DETECT_MS: &str = "tiga-detect-ms";

/// No one-way delay estimate exceeds this (Tiga's scripts cap theirs at 400 ms).
pub const OWD_CAP_NS: u64 = 400 * NS_PER_MS;
/// The estimate for a replica not heard from yet.
pub const OWD_INITIAL_NS: u64 = 100 * NS_PER_MS;
const _: () = assert!(OWD_INITIAL_NS <= OWD_CAP_NS);

/// Tiga's options.
pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: OPTION_HEADROOM_MS,
        help: "Δ in milliseconds, added to every timestamp for the delay variance the \
               estimates miss",
        kind: OptionKind::Number { min: 0.0, max: 1_000.0, default: 10.0 },
    },
    OptionSpec {
        name: OPTION_OWD_PERCENTILE,
        help: "the percentile of each replica's recent one-way delays taken as its estimate",
        kind: OptionKind::Number { min: 1.0, max: 100.0, default: 50.0 },
    },
    OptionSpec {
        name: OPTION_MODE,
        help: "preventive: leaders agree on a timestamp before executing (cheap when they sit \
               together); detective: a leader executes a multi-shard transaction when it comes \
               due and answers at once, agreeing meanwhile, and runs it again if the agreed \
               timestamp moved (one wide-area round trip when leaders sit apart); auto: \
               preventive when every shard's leader is in one region, detective otherwise \
               (decided again at every view change)",
        kind: OptionKind::Choice { values: &["auto", "preventive", "detective"], default: "auto" },
    },
    OptionSpec {
        name: OPTION_LEADERS,
        help: "together: the shards' leaders sit in one region where the layout allows (the \
               view manager's choice); spread: replica 0 of every shard leads (the standard \
               layout puts replica 0 of shard s in region s: Tiga's setting with its leaders \
               apart)",
        kind: OptionKind::Choice { values: &["together", "spread"], default: "together" },
    },
    OptionSpec {
        name: OPTION_SNAPSHOT_READS,
        help: "on: a read-only transaction reads a timestamped snapshot at the closest replica \
               of each shard, without holding or agreeing (serializable, not strictly: the \
               snapshot may be a little stale); off: it runs like any other",
        kind: OptionKind::Choice { values: &["off", "on"], default: "off" },
    },
    OptionSpec {
        name: OPTION_VIEW_MANAGER,
        help: "on: 2f + 1 server nodes host the view manager (a Raft group), which replaces a \
               shard leader silent for tiga-detect-ms by the next view; off: views change only \
               when a test's scenario gives one (one replica per shard has no manager either \
               way)",
        kind: OptionKind::Choice { values: &["on", "off"], default: "on" },
    },
    DETECT_MS_OPTION,
];

/// `tiga-detect-ms`, and (renamed) luigi's `luigi-detect-ms`.
pub(crate) const DETECT_MS_OPTION: OptionSpec = OptionSpec {
    name: OPTION_DETECT_MS,
    help: "how long, in milliseconds, a shard leader may go unheard before the view manager \
           replaces it (heartbeats go five times as often)",
    kind: OptionKind::Number { min: 100.0, max: 600_000.0, default: 1_500.0 },
};

/// The `tiga` protocol.
pub struct Tiga;

impl Protocol for Tiga {
    const NAME: &'static str = "tiga";
    const SUMMARY: &'static str =
        "timestamp-ordered one-shot transactions, consensus and concurrency control fused \
         (Tiga): one wide-area round trip on the fast path";
    const OPTIONS: &'static [OptionSpec] = OPTIONS;
    /// Transactions serialize in (agreed timestamp, id) order on every shard whatever the
    /// clocks do. Real-time order follows only while clocks are synchronized: a coordinator
    /// whose clock is behind stamps a transaction below one that already committed, and a
    /// replica releases it first unless they conflict directly.
    const GUARANTEE: Guarantee = Guarantee::StrictWithSyncedClocks;
    type Node = node::TigaNode;

    /// Snapshot reads see a consistent cut at a timestamp that may trail real time: the
    /// histories are serializable, not strictly.
    fn guarantee(options: &ProtocolOptions) -> Guarantee {
        if TigaSettings::from_options(options).snapshot_reads {
            Guarantee::Serializable
        } else {
            Self::GUARANTEE
        }
    }

    fn check_topology(topology: &Topology) -> Result<(), ConfigError> {
        check_replicas("tiga", topology)
    }

    /// Any node: a leader restarts from its journal and leads on (its shard waits meanwhile),
    /// a follower takes up its own journal.
    fn may_crash(_topology: &Topology, _node: NodeId) -> bool {
        true
    }

    /// Tiga runs one-shot transactions whose keys the arguments give: a sample of the
    /// workload's transactions (from two clients) must all have that shape.
    fn check_workload(
        workload: &meridian_core::txn::WorkloadSample,
        topology: &Topology,
    ) -> Result<(), ConfigError> {
        crate::check_sampled_requests("tiga", workload, topology, node::check_request)
    }

    fn initial_leader(
        topology: &Topology,
        options: &ProtocolOptions,
        shard: ShardId,
    ) -> Option<NodeId> {
        let view = node::starting_view(topology, &TigaSettings::from_options(options)).ok()?;
        topology.replica_node(shard, view.leader_slot(shard, topology.replicas))
    }

    /// Per shard, the closest super quorum (by configured median round trip from `region`)
    /// that includes the view's leader; the bound is the largest round trip to a member of
    /// any of them, plus the headroom Δ: a coordinator stamps `send + farthest member's
    /// delay + Δ`, the members release at the stamp and the farthest reply takes its delay
    /// back.
    fn latency_bound_ns(
        topology: &Topology,
        network: &meridian_core::netmodel::NetworkModel,
        options: &ProtocolOptions,
        region: meridian_core::RegionId,
    ) -> Option<u64> {
        let view = node::starting_view(topology, &TigaSettings::from_options(options)).ok()?;
        let quorum = quorum::super_quorum(topology.replicas);
        let rtt = |node: NodeId| {
            let there = topology.nodes.get(node.0 as usize)?.region.0 as usize;
            let here = region.0 as usize;
            let (out, back) = (network.link(here, there), network.link(there, here));
            Some(out.median_ns() + back.median_ns())
        };
        let mut bound = 0;
        for shard in 0..topology.shards {
            let shard = ShardId(shard);
            let leader =
                topology.replica_node(shard, view.leader_slot(shard, topology.replicas))?;
            let mut others: Vec<u64> = topology
                .shard_nodes(shard)
                .into_iter()
                .filter(|&n| n != leader)
                .map(rtt)
                .collect::<Option<_>>()?;
            others.sort_unstable();
            let farthest = others.iter().take(quorum - 1).copied().chain([rtt(leader)?]).max()?;
            bound = bound.max(farthest);
        }
        Some(bound + TigaSettings::from_options(options).owd.headroom_ns)
    }

    /// A leader finds its log, the votes it heard, its open proposals and its closed-timestamp
    /// promise in its journal and leads on in the same view ([`journal`]); a follower finds
    /// the image of its executed prefix and the log it journaled after it (one with nothing
    /// journaled of its shard rejoins by a state transfer).
    fn restore(context: NodeContext, durable: &Durable) -> Result<node::TigaNode, String> {
        let (shards, seqs, view) = journal::recover_with_view(durable)?;
        let mut node = node::TigaNode::restored_in_view(context, shards, seqs, view)?;
        node.host_manager(durable)?;
        Ok(node)
    }

    /// A leader runs its journaled log ([`node::TigaNode::replay_journal`]); a follower runs
    /// what it journaled after its image.
    fn replay_committed(node: &mut node::TigaNode) -> Replayed {
        node.replay_journal()
    }
}

/// Tiga and luigi run on one replica per shard, or `2f + 1`.
pub(crate) fn check_replicas(protocol: &str, topology: &Topology) -> Result<(), ConfigError> {
    if topology.replicas.is_multiple_of(2) {
        return Err(ConfigError::new(format!(
            "{protocol} needs 2f + 1 replicas per shard (got {})",
            topology.replicas
        )));
    }
    Ok(())
}

/// When shard leaders agree on a multi-shard transaction's timestamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Chosen by the view manager from the measured delay between leaders.
    Auto,
    /// Agree, then execute: no rollback (leaders close together).
    Preventive,
    /// Execute, agree, and revoke the execution if the timestamp moved.
    Detective,
}

/// Tiga's settings, from its options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TigaSettings {
    /// How coordinators estimate delays and stamp transactions.
    pub owd: OwdSettings,
    /// The agreement mode.
    pub mode: Mode,
    /// Read-only transactions read a timestamped snapshot.
    pub snapshot_reads: bool,
    /// `tiga-leaders=spread`: replica 0 of every shard leads.
    pub spread_leaders: bool,
    /// `tiga-view-manager=on`.
    pub view_manager: bool,
    /// `tiga-detect-ms`, in nanoseconds.
    pub detect_ns: u64,
}

impl TigaSettings {
    /// The settings `options` (parsed against [`OPTIONS`], so in range) give.
    pub fn from_options(options: &ProtocolOptions) -> Self {
        let owd = owd_settings(
            options.number(OPTION_HEADROOM_MS, OPTIONS),
            options.number(OPTION_OWD_PERCENTILE, OPTIONS),
        );
        let mode = match options.choice(OPTION_MODE, OPTIONS) {
            "preventive" => Mode::Preventive,
            "detective" => Mode::Detective,
            _ => Mode::Auto,
        };
        let snapshot_reads = options.choice(OPTION_SNAPSHOT_READS, OPTIONS) == "on";
        let spread_leaders = options.choice(OPTION_LEADERS, OPTIONS) == "spread";
        let view_manager = options.choice(OPTION_VIEW_MANAGER, OPTIONS) == "on";
        let detect_ns = (options.number(OPTION_DETECT_MS, OPTIONS) * NS_PER_MS as f64) as u64;
        Self { owd, mode, snapshot_reads, spread_leaders, view_manager, detect_ns }
    }
}

/// How a tiga or luigi coordinator stamps, given Δ in milliseconds and the percentile of its
/// delay samples (both from options whose ranges keep the settings valid).
pub(crate) fn owd_settings(headroom_ms: f64, percentile: f64) -> OwdSettings {
    let owd = OwdSettings {
        percentile,
        cap_ns: OWD_CAP_NS,
        initial_ns: OWD_INITIAL_NS,
        headroom_ns: (headroom_ms * NS_PER_MS as f64).round() as u64,
    };
    debug_assert!(owd.check().is_ok(), "the option ranges keep the settings valid");
    owd
}

/// Tiga (and Luigi) run one-shot transactions: every shard's pieces run in one step on each
/// replica of the shard. A piece may take the output of a piece on another shard (the shard's
/// leader sends it with its vote, and the leader passes it on to its followers with the
/// outcome), as long as no shard's pieces wait, directly or through other shards, for its own:
/// the shards feeding each other must form no cycle. Names the piece that closes the first
/// cycle (pieces come in dependency order, so the first cycle is found at its last edge).
pub fn check_one_shot(pieces: &[PieceSlot]) -> Result<(), String> {
    // Edges between shards: `feeds[a]` holds the shards taking an output of a piece on `a`.
    let mut feeds: BTreeMap<ShardId, BTreeSet<ShardId>> = BTreeMap::new();
    for (index, piece) in pieces.iter().enumerate() {
        for &dep in &piece.deps {
            let Some(source) = pieces.get(dep as usize) else {
                return Err(format!("piece {index} depends on piece {dep}, which does not exist"));
            };
            let (from, to) = (source.shard, piece.shard);
            if from == to || feeds.get(&from).is_some_and(|next| next.contains(&to)) {
                continue;
            }
            if reaches(&feeds, to, from) {
                return Err(format!(
                    "piece {index} (shard {}) depends on the output of piece {dep} (shard {}), \
                     which waits for shard {}'s own pieces: the shards' pieces depend on each \
                     other in a cycle, not a one-shot transaction",
                    to.0, from.0, to.0
                ));
            }
            feeds.entry(from).or_default().insert(to);
        }
    }
    Ok(())
}

/// True when `to` is reachable from `from` along `feeds`. Bounded by the shards of one plan.
fn reaches(feeds: &BTreeMap<ShardId, BTreeSet<ShardId>>, from: ShardId, to: ShardId) -> bool {
    let mut seen = BTreeSet::from([from]);
    let mut stack = vec![from];
    while let Some(shard) = stack.pop() {
        if shard == to {
            return true;
        }
        for &next in feeds.get(&shard).into_iter().flatten() {
            if seen.insert(next) {
                stack.push(next);
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::ShardId;

    fn piece(shard: u32, deps: &[u32]) -> PieceSlot {
        PieceSlot { shard: ShardId(shard), deps: deps.to_vec(), sent: false, output: None }
    }

    /// Which workloads tiga runs (200 transactions of each from two clients, 3 shards): those
    /// whose keys the arguments give and whose shards do not feed each other in a cycle.
    /// SmallBank passes a value between shards (Amalgamate's credit takes what its debit
    /// moved); TPC-C's NewOrder keys its order rows by the number the district row hands out,
    /// guarded by that row, so paper-compat runs, while spec mode's other procedures scan, as
    /// do scan-count and YCSB-E; the CrossStitch chains' keys come from reads.
    #[test]
    fn the_workloads_tiga_runs_are_the_expected_ones() {
        use meridian_workloads::tpcc::{Mode as TpccMode, TpccOptions};
        let mut refused = Vec::new();
        let paper_compat = TpccOptions { mode: TpccMode::PaperCompat, ..TpccOptions::default() };
        let runs = meridian_workloads::WORKLOADS
            .iter()
            .map(|&name| (name, name, TpccOptions::default()))
            .chain([("tpcc paper-compat", "tpcc", paper_compat)]);
        for (label, name, tpcc) in runs {
            let options = meridian_workloads::WorkloadOptions {
                shards: 3,
                keys_per_shard: 64,
                tpcc,
                ..meridian_workloads::WorkloadOptions::default()
            };
            let workload = meridian_workloads::build(name, &options).unwrap();
            let topology =
                meridian_core::topology::Topology::standard(vec!["r".into()], 3, 1).unwrap();
            if let Err(why) =
                Tiga::check_workload(&meridian_workloads::sample(workload.as_ref()), &topology)
            {
                assert!(why.to_string().contains("piece"), "{label}: {why}");
                refused.push(label);
            }
        }
        assert_eq!(
            refused,
            [
                "ycsb-e",
                "tpcc",
                "scan-count",
                "crossstitch-synthetic",
                "crossstitch-order-status",
                "crossstitch-stock-level",
            ],
            "workloads tiga refuses"
        );
    }

    /// The bound is the round trip to the farthest member of each shard's closest super
    /// quorum (the leader included) plus Δ: with 3 replicas the quorum is all of them, with
    /// 5 it leaves out the farthest follower.
    #[test]
    fn the_latency_bound_takes_the_closest_super_quorum_and_the_headroom() {
        use meridian_core::netmodel::NetworkModel;
        use meridian_core::RegionId;
        // Five regions on a line, 10 ms apart one way (region i to j: 10·|i − j| ms).
        let regions: Vec<String> = (0..5).map(|i| format!("r{i}")).collect();
        let mut toml = String::from("regions = [\"r0\", \"r1\", \"r2\", \"r3\", \"r4\"]\n");
        for i in 0..5u64 {
            for j in i + 1..5 {
                let ms = 10 * (j - i);
                toml += &format!("[[link]]\nfrom = \"r{i}\"\nto = \"r{j}\"\ndelay_ms = {ms}\n");
            }
        }
        let network = NetworkModel::from_toml("line", &toml).unwrap();
        let options = parse(&[(OPTION_HEADROOM_MS, "7")]).unwrap();
        let bound = |topology: &Topology, region: u32| {
            Tiga::latency_bound_ns(topology, &network, &options, RegionId(region)).unwrap()
                / NS_PER_MS
        };
        let servers3 = [RegionId(0), RegionId(1), RegionId(2)];
        let three = Topology::placed(regions.clone(), &servers3, 2, 3).unwrap();
        let leader_region = |t: &Topology| {
            let view = node::initial_view(t).unwrap();
            let leader = t.replica_node(ShardId(0), view.leader_slot(ShardId(0), t.replicas));
            t.region_of(leader.unwrap()).0
        };
        // All three replicas: from r4 the farthest is r0, 40 ms each way.
        assert_eq!(bound(&three, 4), 80 + 7);
        assert_eq!(bound(&three, 1), 20 + 7);
        // Five replicas, quorum 4: from r0 the farthest follower (r4) is left out unless it
        // leads.
        let servers5: Vec<RegionId> = (0..5).map(RegionId).collect();
        let five = Topology::placed(regions, &servers5, 2, 5).unwrap();
        let leader = u64::from(leader_region(&five));
        assert_eq!(bound(&five, 0), 2 * 10 * leader.max(3) + 7, "leader in r{leader}");
    }

    #[test]
    fn shards_feeding_each_other_in_a_cycle_are_refused() {
        // Shard 1 takes shard 0's output, and so does shard 2 from shard 1: a chain runs.
        assert!(check_one_shot(&[piece(0, &[]), piece(1, &[0]), piece(2, &[1])]).is_ok());
        assert!(check_one_shot(&[piece(0, &[]), piece(1, &[]), piece(0, &[0])]).is_ok());
        // 0 → 1 → 0 through pieces.
        let why = check_one_shot(&[piece(0, &[]), piece(1, &[0]), piece(0, &[1])]).unwrap_err();
        assert!(
            why.starts_with("piece 2 (shard 0) depends on the output of piece 1 (shard 1)"),
            "{why}"
        );
        // 0 → 1 and 1 → 0 between independent pieces: each shard runs its pieces in one step,
        // so the shards would still wait for each other.
        let plan = [piece(0, &[]), piece(1, &[0]), piece(1, &[]), piece(0, &[2])];
        let why = check_one_shot(&plan).unwrap_err();
        assert!(why.starts_with("piece 3 (shard 0)"), "{why}");
        // A longer cycle: 0 → 1 → 2 → 0.
        let plan = [piece(0, &[]), piece(1, &[0]), piece(2, &[1]), piece(0, &[2])];
        assert!(check_one_shot(&plan).is_err());
        assert!(check_one_shot(&[piece(0, &[5])]).is_err());
    }

    fn parse(given: &[(&str, &str)]) -> Result<ProtocolOptions, meridian_core::ConfigError> {
        let given: Vec<(String, String)> =
            given.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        ProtocolOptions::parse("tiga", OPTIONS, &given)
    }

    #[test]
    fn the_defaults_are_tigas() {
        let settings = TigaSettings::from_options(&parse(&[]).unwrap());
        assert_eq!(settings.owd.headroom_ns, 10 * NS_PER_MS);
        assert_eq!(settings.owd.percentile, 50.0);
        assert_eq!(settings.mode, Mode::Auto);
        let set = parse(&[(OPTION_HEADROOM_MS, "2.5"), (OPTION_MODE, "preventive")]).unwrap();
        let settings = TigaSettings::from_options(&set);
        assert_eq!(settings.owd.headroom_ns, 2_500_000);
        assert_eq!(settings.mode, Mode::Preventive);
        assert!(!settings.spread_leaders);
    }

    /// `auto` agrees before executing when the leaders sit together and detects afterwards
    /// when they sit apart; a mode set by hand is kept.
    #[test]
    fn auto_mode_follows_where_the_leaders_sit() {
        let topology = meridian_core::topology::Topology::standard(
            vec!["a".into(), "b".into(), "c".into()],
            3,
            3,
        )
        .unwrap();
        let view = |given: &[(&str, &str)]| {
            node::starting_view(&topology, &TigaSettings::from_options(&parse(given).unwrap()))
                .unwrap()
        };
        let leader_regions = |v: &view::View| -> BTreeSet<u32> {
            (0..3)
                .map(|s| {
                    let shard = ShardId(s);
                    let n = topology.replica_node(shard, v.leader_slot(shard, 3)).unwrap();
                    topology.region_of(n).0
                })
                .collect()
        };
        let together = view(&[]);
        assert_eq!(together.mode, Mode::Preventive);
        assert_eq!(leader_regions(&together).len(), 1);
        let spread = view(&[(OPTION_LEADERS, "spread")]);
        assert_eq!(spread.mode, Mode::Detective);
        assert_eq!(leader_regions(&spread).len(), 3);
        let forced = view(&[(OPTION_LEADERS, "spread"), (OPTION_MODE, "preventive")]);
        assert_eq!(forced.mode, Mode::Preventive);
        assert_eq!(view(&[(OPTION_MODE, "detective")]).mode, Mode::Detective);
    }

    /// `leader=S` in a fault schedule names the node the protocol says starts leading shard
    /// `S`: with the leaders together that is not replica 0 of every shard, and a built node
    /// agrees it leads.
    #[test]
    fn the_initial_leaders_are_the_nodes_that_lead_when_built() {
        use crate::{ProtocolKind, ProtocolNode, Timing};
        use meridian_core::txn::{PartitionRule, Partitioner, Registry};
        let topology = std::sync::Arc::new(
            meridian_core::topology::Topology::standard(
                vec!["a".into(), "b".into(), "c".into()],
                3,
                3,
            )
            .unwrap(),
        );
        let partitioner =
            Partitioner::new(3, PartitionRule::LeadingInt { base: 0, per_shard: 10 }).unwrap();
        for (kind, given) in [
            (ProtocolKind::Tiga, vec![]),
            (ProtocolKind::Tiga, vec![(OPTION_LEADERS, "spread")]),
            (ProtocolKind::Luigi, vec![]),
        ] {
            let options = if kind == ProtocolKind::Tiga {
                parse(&given).unwrap()
            } else {
                kind.options(&[]).unwrap()
            };
            let leaders = kind.initial_leaders(&topology, &options);
            let zero: Vec<_> =
                (0..3).map(|s| topology.replica_node(ShardId(s), 0).unwrap()).collect();
            assert_eq!(leaders != zero, given.is_empty(), "{kind:?} {given:?}: {leaders:?}");
            for node in topology.node_ids() {
                let mut context = NodeContext::new(
                    node,
                    topology.clone(),
                    std::sync::Arc::new(Registry::default()),
                    std::sync::Arc::new(partitioner.clone()),
                    7,
                    Timing::for_network(NS_PER_MS),
                );
                context.options = options.clone();
                let built = match kind {
                    ProtocolKind::Tiga => Tiga::restore(context, &BTreeMap::new()),
                    _ => crate::luigi::Luigi::restore(context, &BTreeMap::new()),
                }
                .unwrap();
                for shard in 0..3 {
                    let leads = built.leads(ShardId(shard));
                    assert_eq!(leads, leaders[shard as usize] == node, "{kind:?} n{node} s{shard}");
                }
            }
        }
    }

    #[test]
    fn out_of_range_settings_are_refused_naming_the_option() {
        for (name, value) in [
            (OPTION_HEADROOM_MS, "-1"),
            (OPTION_HEADROOM_MS, "5000"),
            (OPTION_OWD_PERCENTILE, "0"),
            (OPTION_OWD_PERCENTILE, "101"),
            (OPTION_MODE, "eager"),
            (OPTION_LEADERS, "apart"),
        ] {
            let error = parse(&[(name, value)]).unwrap_err().to_string();
            assert!(error.contains(name), "{name}={value}: {error}");
        }
    }
}
