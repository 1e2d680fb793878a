//! Scenario tests on the simulator with fixed seeds.

use crate::runner::{run, SimRunOptions, SimRunReport};
use crate::Fault;
use meridian_core::clock::ClockModel;
use meridian_core::netmodel::{Jitter, LinkModel, NetworkModel};
use meridian_core::time::{NS_PER_MS, NS_PER_S};
use meridian_core::topology::Topology;
use meridian_core::NodeId;
use meridian_protocols::ProtocolKind;
use meridian_workloads::WorkloadOptions;
use std::sync::Arc;

fn regions(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("r{i}")).collect()
}

fn options(seed: u64, network: &str, shards: u32, txns: u64) -> SimRunOptions {
    let mut options = SimRunOptions::new(
        ProtocolKind::Occ,
        Topology::standard(regions(3), shards, 1).unwrap(),
        NetworkModel::preset(network, 3).unwrap(),
        ClockModel::preset("ntp").unwrap(),
        seed,
    );
    options.clients = 12;
    options.txns = txns;
    options.time_limit_ns = 600 * NS_PER_S;
    options
}

fn micro_keys(
    shards: u32,
    keys_per_shard: u64,
    theta: Option<f64>,
) -> Arc<dyn meridian_workloads::Workload> {
    Arc::from(
        meridian_workloads::build(
            "micro-luigi",
            &WorkloadOptions {
                shards,
                keys_per_shard,
                zipf_theta: theta,
                ops_max: None,
                distribution: None,
                region_groups: None,
                tpcc: Default::default(),
            },
        )
        .unwrap(),
    )
}

fn micro(shards: u32, theta: Option<f64>) -> Arc<dyn meridian_workloads::Workload> {
    micro_keys(shards, 200, theta)
}

fn assert_passed(report: &SimRunReport) {
    assert!(report.passed(), "seed {} failed: {:?}", report.seed, report.checks);
}

#[test]
fn same_seed_same_trace_and_different_seed_different_trace() {
    let a = run(&options(7, "metro", 2, 300), micro(2, Some(0.9))).unwrap();
    let b = run(&options(7, "metro", 2, 300), micro(2, Some(0.9))).unwrap();
    let c = run(&options(8, "metro", 2, 300), micro(2, Some(0.9))).unwrap();
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(
        (a.committed, a.retries, a.stats.clone()),
        (b.committed, b.retries, b.stats.clone())
    );
    assert_ne!(a.trace_hash, c.trace_hash);
    assert_passed(&a);
    assert_passed(&c);
}

#[test]
fn micro_luigi_on_two_shards_is_all_cross_shard_and_serializable_under_contention() {
    for seed in 1..=5 {
        let report = run(&options(seed, "metro", 2, 400), micro(2, Some(0.99))).unwrap();
        assert_passed(&report);
        assert!(report.committed >= 400);
        assert_eq!(
            report.cross_shard, report.committed,
            "two shards: every transaction spans both"
        );
        assert!(report.retries > 0, "Zipf 0.99 on 200 keys per shard must cause conflicts");
    }
}

#[test]
fn geo_latency_is_two_wide_area_round_trips_for_cross_shard_commits() {
    // Shard 0 in r0, shard 1 in r1, coordinators in every region; 150 ms one-way. Execute and
    // prepare each need a round trip to the remote shard: 2 WRTT ≈ 600 ms.
    let report = run(&options(3, "geo", 2, 200), micro_keys(2, 100_000, None)).unwrap();
    assert_passed(&report);
    assert_eq!(report.retries, 0, "100k keys per shard: no conflicts expected");
    let p50_ms = report.latency_ns_p50 / NS_PER_MS;
    assert!((560..=700).contains(&p50_ms), "p50 {p50_ms} ms");
}

#[test]
fn a_partitioned_coordinator_recovers_after_heal() {
    let mut opts = options(11, "metro", 2, 300);
    // Node 2 is the first coordinator (after the two servers). Cut it off from shard 1 both ways.
    let (coordinator, server) = (NodeId(2), NodeId(1));
    opts.faults = vec![
        (200 * NS_PER_MS, Fault::Block(coordinator, server)),
        (200 * NS_PER_MS, Fault::Block(server, coordinator)),
        (3 * NS_PER_S, Fault::Heal),
    ];
    let report = run(&opts, micro(2, None)).unwrap();
    assert_passed(&report);
    assert!(report.stats.blocked > 0);
    assert!(report.retries > 0, "blocked attempts time out and retry");
}

#[test]
fn lossy_links_slow_commits_down_but_break_nothing() {
    let mut opts = options(5, "metro", 2, 300);
    let lossy = LinkModel {
        delay_ns: 2 * NS_PER_MS,
        jitter: Jitter::Uniform { half_width_ns: NS_PER_MS },
        loss: 0.05,
    };
    opts.network = NetworkModel::uniform("lossy", regions(3), lossy, lossy);
    let report = run(&opts, micro(2, Some(0.5))).unwrap();
    assert_passed(&report);
    assert!(report.stats.lost > 0);
}

#[test]
fn a_crashed_coordinator_loses_its_requests_and_others_go_on() {
    let mut opts = options(13, "metro", 2, 300);
    opts.faults =
        vec![(300 * NS_PER_MS, Fault::Crash(NodeId(3))), (NS_PER_S, Fault::Restart(NodeId(3)))];
    let report = run(&opts, micro(2, None)).unwrap();
    // Prepared attempts of the crashed coordinator are settled by the participants (the
    // termination protocol); the run must stay live.
    assert!(report.live, "{:?}", report.checks);
    assert!(report.stats.dropped_crashed > 0 || report.committed > 0);
}

#[test]
fn crashing_an_unreplicated_shard_loses_writes_and_the_check_says_so() {
    // With one replica per shard, occ keeps shard data in memory only: a crashed server
    // restarts empty. The last-writer invariant must notice the lost writes. This shows the
    // check can fail (with 3 replicas the same crash loses nothing: see below).
    let mut opts = options(17, "metro", 2, 300);
    opts.faults = vec![
        (500 * NS_PER_MS, Fault::Crash(NodeId(0))),
        (600 * NS_PER_MS, Fault::Restart(NodeId(0))),
    ];
    let report = run(&opts, micro(2, None)).unwrap();
    let check = report.checks.iter().find(|c| c.name == "micro-last-writer").unwrap();
    assert!(!check.passed, "lost writes went unnoticed: {}", check.detail);
}

/// Every node of `options`' layout loses power right after the `after`-th acknowledged commit.
fn power_failure_after(options: &mut SimRunOptions, after: u64) {
    options.power_failure = Some(crate::PowerFailure {
        after_commits: after,
        nodes: options.topology.node_ids().collect(),
        restart_after_ns: 100 * NS_PER_MS,
    });
}

#[test]
fn a_power_failure_loses_what_only_memory_held_and_the_checks_say_so() {
    // Unreplicated occ keeps shard data in memory in the simulator: the durability oracle's
    // power failure right after the 100th acknowledged commit loses acknowledged writes, and
    // the checks must notice (the oracle can fail).
    let mut opts = options(17, "metro", 2, 300);
    power_failure_after(&mut opts, 100);
    let report = run(&opts, micro(2, None)).unwrap();
    assert_eq!(report.stats.power_failures, 1);
    let check = report.checks.iter().find(|c| c.name == "micro-last-writer").unwrap();
    assert!(!check.passed, "lost writes went unnoticed: {}", check.detail);
}

#[test]
fn replicated_occ_keeps_every_acknowledged_commit_through_a_power_failure_and_held_persists() {
    let mut opts = replicated(23, "metro");
    power_failure_after(&mut opts, 120);
    opts.buggify =
        crate::Buggify { persist_delay_probability: 0.3, persist_delay_ns_max: 20 * NS_PER_MS };
    let report = run(&opts, micro(2, Some(0.9))).unwrap();
    assert_replicated_run_passed(&report);
    assert_eq!(report.stats.power_failures, 1, "exactly once");
    assert!(report.stats.persists_held > 0, "BUGGIFY held some persists");
}

#[test]
fn bad_options_are_refused() {
    let mut opts = options(1, "lan", 2, 10);
    opts.topology = Topology::standard(regions(3), 2, 2).unwrap();
    let err = run(&opts, micro(2, None)).err().unwrap();
    assert!(err.0.contains("odd replica count"), "{err}");
    let mut opts = options(1, "lan", 2, 10);
    opts.clients = 0;
    assert!(run(&opts, micro(2, None)).is_err());
}

/// The swarm setup the bugs below were found with: `workload` on 3 shards × 1 replica with
/// `keys_per_shard` keys each, `metro`, 8 clients, 200 transactions, the seed's fault plan.
fn swarm_seed(workload: &str, keys_per_shard: u64, seed: u64) -> SimRunReport {
    let mut base = options(seed, "metro", 3, 200);
    base.clients = 8;
    let (opts, _) = crate::swarm::seed_options(&base, seed, true);
    let options = WorkloadOptions {
        shards: 3,
        keys_per_shard,
        zipf_theta: None,
        ops_max: None,
        distribution: None,
        region_groups: None,
        tpcc: Default::default(),
    };
    run(&opts, Arc::from(meridian_workloads::build(workload, &options).unwrap())).unwrap()
}

#[test]
fn seed_2_a_restarted_coordinator_never_reuses_a_transaction_id() {
    // The restarted coordinator numbered attempts from 0 again; participants took the new
    // attempts for old ones (their locks, their decisions): G2 cycles in the history.
    let report = swarm_seed("list-append", 4, 2);
    assert_passed(&report);
    assert!(report.checks.iter().any(|c| c.name == "elle-list-append" && c.passed));
}

#[test]
fn seed_116_a_refused_one_round_commit_stays_refused() {
    // A duplicated one-round commit request, delivered after the coordinator had retried, was
    // committed too: the same append appeared twice in a list.
    assert_passed(&swarm_seed("list-append", 4, 116));
}

#[test]
fn seed_31_a_coordinator_crash_after_its_commit_decision_leaves_no_half_transfer() {
    // The coordinator decided a transfer, one shard's commit message was lost, and the
    // coordinator crashed: the other shard stayed prepared forever and the money was off by the
    // transfer. Participants now settle such attempts among themselves.
    let report = swarm_seed("bank", 5, 31);
    assert_passed(&report);
    assert!(report.checks.iter().any(|c| c.name == "bank-total" && c.passed));
}

/// A participant stays prepared through a long partition from its coordinators while its peers
/// commit, and decide (and, with a cache of four decisions, would forget) many more attempts.
/// When it asks them, a peer that committed the attempt must still say so: a forgotten commit
/// answered as "aborted" installs half a transfer. (With the old rule, evict the oldest
/// decision and refuse what is not remembered, this schedule lost money.)
#[test]
fn a_commit_is_never_forgotten_while_a_participant_still_needs_it() {
    let mut opts = options(5, "metro", 3, 600);
    opts.limits.decided_max = 4;
    let (p0, p1) = (replica(&opts, 0, 0), replica(&opts, 1, 0));
    for c in opts.topology.coordinators() {
        opts.faults.push((300 * NS_PER_MS, Fault::Block(c, p1)));
    }
    opts.faults.push((6 * NS_PER_S, Fault::Heal));
    let workload = WorkloadOptions { shards: 3, keys_per_shard: 8, ..WorkloadOptions::default() };
    let report =
        run(&opts, Arc::from(meridian_workloads::build("bank", &workload).unwrap())).unwrap();
    assert_passed(&report);
    assert!(report.checks.iter().any(|c| c.name == "bank-total" && c.passed));
    assert!(counter(&report, p1, "occ_participant_terminated_total") > 0, "p1 decided with peers");
    assert!(counter(&report, p0, "occ_participant_decided_evicted_total") > 0, "p0 forgot some");
}

/// A coordinator restarts with its clock ten seconds back: its attempt ids still never repeat
/// (they carry its incarnation), so nothing a participant remembers is mistaken for new.
#[test]
fn a_coordinator_restarted_with_its_clock_stepped_back_reuses_no_attempt_id() {
    let mut opts = options(12, "metro", 3, 600);
    let coordinator = opts.topology.coordinators()[0];
    opts.faults = vec![
        (400 * NS_PER_MS, Fault::Crash(coordinator)),
        (500 * NS_PER_MS, Fault::Restart(coordinator)),
        (900 * NS_PER_MS, Fault::Crash(coordinator)),
        (1_000 * NS_PER_MS, Fault::Restart(coordinator)),
    ];
    opts.restart_clock_step_back_ns = 10 * NS_PER_S;
    let report = run(&opts, micro(3, Some(0.9))).unwrap();
    assert_passed(&report);
}

// ---------------------------------------------------------------------------------------------
// occ over Raft: 2 shards × 3 replicas. Every scenario must stay live, lose no acknowledged
// write (`micro-last-writer` checks every key against its committed writers), and end with
// every replica of a shard equal (`replicas-equal`).

fn replicated(seed: u64, network: &str) -> SimRunOptions {
    let mut options = options(seed, network, 2, 300);
    options.topology = Topology::standard(regions(3), 2, 3).unwrap();
    options
}

/// The node holding replica `slot` of `shard`.
fn replica(options: &SimRunOptions, shard: u32, slot: u32) -> NodeId {
    options.topology.replica_node(meridian_core::ShardId(shard), slot).unwrap()
}

fn crash_on(node: NodeId, on: crate::TriggerPoint, contains: &str) -> crate::CrashTrigger {
    crate::CrashTrigger {
        node,
        on,
        contains: contains.into(),
        after_ns: 300 * NS_PER_MS,
        restart_after_ns: NS_PER_S,
    }
}

fn assert_replicated_run_passed(report: &SimRunReport) {
    assert_passed(report);
    assert!(report.live);
    assert!(report.committed >= 300, "{} committed", report.committed);
    let equal = report.checks.iter().find(|c| c.name == "replicas-equal").expect("checked");
    assert!(equal.passed, "{equal:?}");
}

#[test]
fn replicated_occ_commits_and_keeps_replicas_equal() {
    let report = run(&replicated(21, "metro"), micro(2, Some(0.9))).unwrap();
    assert_replicated_run_passed(&report);
    assert!(report.stats.persists > 0, "the log is persisted");
}

#[test]
fn a_shard_leader_crashing_during_prepare_loses_nothing() {
    let mut opts = replicated(22, "metro");
    opts.crash_triggers =
        vec![crash_on(replica(&opts, 0, 0), crate::TriggerPoint::Receive, "Prepare {")];
    let report = run(&opts, micro(2, None)).unwrap();
    assert_eq!(report.stats.triggered, 1, "the leader crashed holding a prepare");
    assert_replicated_run_passed(&report);
}

#[test]
fn a_shard_leader_crashing_during_commit_loses_nothing() {
    let mut opts = replicated(23, "metro");
    opts.crash_triggers =
        vec![crash_on(replica(&opts, 1, 0), crate::TriggerPoint::Receive, "Commit {")];
    let report = run(&opts, micro(2, None)).unwrap();
    assert_eq!(report.stats.triggered, 1);
    assert_replicated_run_passed(&report);
}

#[test]
fn a_shard_leader_crashing_after_its_vote_committed_but_before_sending_it_loses_nothing() {
    // The prepare is in the log on a quorum; the vote never leaves. The next leader has it.
    let mut opts = replicated(24, "metro");
    opts.crash_triggers =
        vec![crash_on(replica(&opts, 0, 0), crate::TriggerPoint::Send, "Prepared {")];
    let report = run(&opts, micro(2, None)).unwrap();
    assert_eq!(report.stats.triggered, 1);
    assert_replicated_run_passed(&report);
}

#[test]
fn a_partitioned_shard_leader_is_replaced_and_nothing_is_lost() {
    let mut opts = replicated(25, "metro");
    let leader = replica(&opts, 0, 0);
    let others: Vec<NodeId> =
        (0..opts.topology.nodes.len() as u32).map(NodeId).filter(|&n| n != leader).collect();
    for &other in &others {
        opts.faults.push((300 * NS_PER_MS, Fault::Block(leader, other)));
        opts.faults.push((300 * NS_PER_MS, Fault::Block(other, leader)));
    }
    opts.faults.push((3 * NS_PER_S, Fault::Heal));
    let report = run(&opts, micro(2, None)).unwrap();
    assert!(report.stats.blocked > 0);
    assert_replicated_run_passed(&report);
}

#[test]
fn crashing_a_minority_of_every_shard_at_once_loses_nothing() {
    for slot in [0, 1] {
        let mut opts = replicated(26 + u64::from(slot), "metro");
        for shard in 0..2 {
            let node = replica(&opts, shard, slot);
            opts.faults.push((400 * NS_PER_MS, Fault::Crash(node)));
            opts.faults.push((2 * NS_PER_S, Fault::Restart(node)));
        }
        let report = run(&opts, micro(2, None)).unwrap();
        assert!(report.stats.dropped_crashed > 0, "slot {slot}: the crashes cost messages");
        assert_replicated_run_passed(&report);
    }
}

/// The replicated swarm setup: `workload` on 3 shards × 3 replicas, otherwise as `swarm_seed`.
fn replicated_swarm_seed(workload: &str, keys_per_shard: u64, seed: u64) -> SimRunReport {
    let mut base = options(seed, "metro", 3, 200);
    base.topology = Topology::standard(regions(3), 3, 3).unwrap();
    base.clients = 8;
    let (opts, _) = crate::swarm::seed_options(&base, seed, true);
    let options = WorkloadOptions { shards: 3, keys_per_shard, ..WorkloadOptions::default() };
    run(&opts, Arc::from(meridian_workloads::build(workload, &options).unwrap())).unwrap()
}

#[test]
fn seed_206678_members_with_equal_election_timeouts_still_elect_a_leader() {
    // Election timeouts were pinned per member: two followers with the same timeout
    // campaigned together forever, splitting the vote, and the member with the longer log was
    // reset by their vote requests before it could campaign. Timeouts are now redrawn from
    // the seed on every term, role or leader change.
    let report = replicated_swarm_seed("list-append", 16, 206_678);
    assert_passed(&report);
    assert!(report.live);
}

#[test]
fn seed_1_of_bank_elections_outlast_slow_disk_syncs() {
    // With 50 ms disk syncs a vote needs 100 ms of syncs; a 100 ms election timeout expired
    // first, every time. Elections now wait at least 250 ms.
    let report = replicated_swarm_seed("bank", 16, 1);
    assert_passed(&report);
    assert!(report.live);
}

/// The longest stretch without a commit that starts after `from_ns`.
fn longest_commit_gap_after(report: &SimRunReport, from_ns: u64) -> u64 {
    let mut previous = from_ns;
    let mut gap = 0;
    for &at in report.commit_times_ns.iter().filter(|&&at| at >= from_ns) {
        gap = gap.max(at - previous);
        previous = at;
    }
    gap
}

#[test]
fn a_shard_serves_commits_again_within_two_election_timeouts_of_losing_its_leader() {
    // Every micro-luigi transaction touches both shards, so a shard without a leader stops all
    // commits: the longest gap after the crash is the failover time. Election timeouts are
    // 10–20 Raft ticks of 25 ms here (metro), so two of them are at most 1 s.
    let mut opts = replicated(31, "metro");
    opts.txns = 2_000;
    let crash_at = NS_PER_S;
    let leader = replica(&opts, 0, 0);
    opts.faults = vec![(crash_at, Fault::Crash(leader)), (20 * NS_PER_S, Fault::Restart(leader))];
    let report = run(&opts, micro(2, None)).unwrap();
    assert_replicated_run_passed(&report);
    let gap_ms = longest_commit_gap_after(&report, crash_at) / NS_PER_MS;
    let election_ms_max = 20 * 25;
    eprintln!("failover: longest commit gap after the leader crash {gap_ms} ms");
    assert!(gap_ms <= 2 * election_ms_max, "commits stopped for {gap_ms} ms");
    assert!(
        gap_ms >= 250,
        "the gap ({gap_ms} ms) is shorter than any election: no failover measured"
    );
}

#[test]
fn leadership_returns_to_the_preferred_replica_after_it_restarts() {
    let mut opts = replicated(32, "metro");
    opts.txns = 1_500;
    let preferred = replica(&opts, 0, 0);
    opts.faults =
        vec![(NS_PER_S, Fault::Crash(preferred)), (2 * NS_PER_S, Fault::Restart(preferred))];
    let report = run(&opts, micro(2, None)).unwrap();
    assert_replicated_run_passed(&report);
    let led = |node: NodeId| counter(&report, node, "raft_groups_led");
    assert_eq!(led(preferred), 1, "replica 0 of shard 0 leads it again");
    assert_eq!(led(replica(&opts, 0, 1)) + led(replica(&opts, 0, 2)), 0);
}

fn counter(report: &SimRunReport, node: NodeId, name: &str) -> u64 {
    report.node_counters[&node].iter().find(|(n, _)| *n == name).map_or(0, |c| c.1)
}

#[test]
fn snapshots_bound_the_raft_logs_during_a_long_run() {
    // About two log entries per transaction per shard: 10,000 transactions would hold about
    // 20,000 entries per replica without snapshots.
    let mut opts = replicated(33, "metro");
    opts.txns = 10_000;
    opts.clients = 32;
    opts.snapshot_interval_entries = Some(1_024);
    let report = run(&opts, micro(2, None)).unwrap();
    assert_replicated_run_passed(&report);
    for &node in report.node_counters.keys() {
        let entries = counter(&report, node, "raft_log_entries");
        // The interval, the entries kept below a snapshot, and what is not applied yet.
        assert!(entries < 2_000, "node {node}: {entries} entries in memory");
    }
    let leader = replica(&opts, 0, 0);
    assert!(counter(&report, leader, "raft_snapshots_taken_total") >= 10);
}

#[test]
fn a_replica_that_missed_more_than_the_log_holds_catches_up_from_a_snapshot() {
    // Replica 2 of shard 0 is down while the shard runs through many snapshot intervals; when
    // it returns, the entries it lacks are gone from every log, so the leader sends its
    // snapshot. It must install it, replay what follows, and end equal to the others.
    let mut opts = replicated(35, "metro");
    opts.txns = 1_500;
    opts.snapshot_interval_entries = Some(16);
    let lagging = replica(&opts, 0, 2);
    opts.faults =
        vec![(NS_PER_S / 2, Fault::Crash(lagging)), (2 * NS_PER_S, Fault::Restart(lagging))];
    let report = run(&opts, micro(2, None)).unwrap();
    assert_replicated_run_passed(&report);
    assert_eq!(
        counter(&report, lagging, "raft_snapshots_restored_total"),
        1,
        "it restarted from its own"
    );
    assert!(counter(&report, lagging, "raft_snapshots_received_total") >= 1, "it was sent one");
}

#[test]
fn the_whole_cluster_restarts_from_snapshots_and_loses_nothing() {
    // Every server crashes at once (unsynced writes lost) and comes back: each shard replica
    // rebuilds from its snapshot and the log after it; acknowledged writes must all be there.
    let mut opts = replicated(36, "metro");
    opts.txns = 1_000;
    opts.snapshot_interval_entries = Some(32);
    let servers: Vec<NodeId> = (0..opts.topology.nodes.len() as u32)
        .map(NodeId)
        .filter(|&n| !opts.topology.nodes[n.0 as usize].replicas.is_empty())
        .collect();
    for &node in &servers {
        opts.faults.push((2 * NS_PER_S, Fault::Crash(node)));
        opts.faults.push((3 * NS_PER_S, Fault::Restart(node)));
    }
    let report = run(&opts, micro(2, None)).unwrap();
    assert_replicated_run_passed(&report);
    let restored: u64 =
        servers.iter().map(|&n| counter(&report, n, "raft_snapshots_restored_total")).sum();
    assert_eq!(restored, servers.len() as u64, "every replica restarted from a snapshot");
}

/// Three servers, each hosting a replica of both shards (replica `(shard + server) % 3`, so
/// each leads one shard at most), and one coordinator per region: the usual shape of a real
/// cluster, where one node runs several Raft groups.
fn three_servers_two_shards() -> Topology {
    use meridian_core::topology::{NodeInfo, ReplicaSlot};
    use meridian_core::{RegionId, ShardId};
    let mut nodes: Vec<NodeInfo> = (0..3u32)
        .map(|server| NodeInfo {
            region: RegionId(server),
            replicas: (0..2u32)
                .map(|shard| ReplicaSlot { shard: ShardId(shard), replica: (shard + server) % 3 })
                .collect(),
            coordinator: false,
        })
        .collect();
    nodes.extend((0..3).map(|r| NodeInfo {
        region: RegionId(r),
        replicas: Vec::new(),
        coordinator: true,
    }));
    let topology = Topology { regions: regions(3), nodes, shards: 2, replicas: 3 };
    topology.validate().unwrap();
    topology
}

#[test]
fn nodes_hosting_several_raft_groups_survive_the_crash_of_one_of_them() {
    let mut opts = replicated(34, "metro");
    opts.topology = three_servers_two_shards();
    // Server 0 holds replica 0 (the leader) of shard 0 and replica 1 of shard 1.
    opts.faults =
        vec![(NS_PER_S / 2, Fault::Crash(NodeId(0))), (2 * NS_PER_S, Fault::Restart(NodeId(0)))];
    let report = run(&opts, micro(2, None)).unwrap();
    assert!(report.stats.dropped_crashed > 0);
    assert_replicated_run_passed(&report);
    for seed in 0..40 {
        let mut base = replicated(seed, "metro");
        base.topology = three_servers_two_shards();
        base.txns = 150;
        let (faulty, plan) = crate::swarm::seed_options(&base, seed, true);
        let report = run(&faulty, micro(2, None)).unwrap();
        assert!(report.passed(), "seed {seed} ({plan:?}): {:?}", report.checks);
    }
}

/// A seed that needs more events than its budget stops there and fails, naming the budget,
/// instead of running on (a planted replication bug once made a 25-second swarm run past
/// ten minutes).
#[test]
fn a_run_over_its_event_budget_fails_instead_of_running_on() {
    let mut opts = options(3, "metro", 2, 2_000);
    opts.events_max = Some(5_000);
    let report = run(&opts, micro(2, None)).unwrap();
    assert!(report.over_budget);
    assert!(!report.passed());
    let budget = report.checks.iter().find(|c| c.name == "event-budget").expect("named");
    assert!(
        budget.detail.contains("5000") || budget.detail.contains("stopped after"),
        "{budget:?}"
    );
    assert!(report.stats.events <= 5_000 + 20_000, "stopped near the budget");
}

/// An open loop offers its rate whatever the replies do: below capacity it commits about the
/// rate with the closed loop's latency; far above it (12 clients cannot keep up) the arrivals
/// queue, and the latency counted from each arrival shows the queueing. Same seed, same trace.
#[test]
fn an_open_loop_offers_its_rate_and_its_latency_counts_the_queueing() {
    use meridian_workloads::clients::Load;
    // 1,500 requests: the run's tail after the last arrival (the healing wait) is small beside it.
    let open = |rate_per_s: f64| {
        let mut o = options(5, "metro", 2, 1_500);
        o.load = Load::Open { rate_per_s };
        o
    };
    let light = run(&open(100.0), micro_keys(2, 100_000, None)).unwrap();
    assert_passed(&light);
    let seconds = light.virtual_ns as f64 / 1e9;
    let rate = light.committed as f64 / seconds;
    assert!(
        (80.0..=120.0).contains(&rate),
        "offered 100/s, committed {rate:.1}/s over {seconds:.1} s"
    );
    let closed = run(&options(5, "metro", 2, 400), micro_keys(2, 100_000, None)).unwrap();
    let ratio = light.latency_ns_p50 as f64 / closed.latency_ns_p50 as f64;
    assert!((0.8..=1.25).contains(&ratio), "unloaded p50 {ratio:.2}x the closed loop's");
    let heavy = run(&open(1_000_000.0), micro_keys(2, 100_000, None)).unwrap();
    assert_passed(&heavy);
    assert!(
        heavy.latency_ns_p99 > 10 * closed.latency_ns_p99,
        "overloaded p99 {} ms against {} ms unloaded: the backlog's wait must count",
        heavy.latency_ns_p99 / NS_PER_MS,
        closed.latency_ns_p99 / NS_PER_MS
    );
    let again = run(&open(100.0), micro_keys(2, 100_000, None)).unwrap();
    assert_eq!(again.trace_hash, light.trace_hash);
}

/// Tiga's placement: servers in three regions of `tiga-wan`, a fourth (Hong Kong) with
/// coordinators only. Clients there pay its wide-area distance on every round trip that
/// clients in a server region do not.
#[test]
fn clients_in_a_coordinator_only_region_pay_its_distance() {
    use meridian_core::RegionId;
    let network = NetworkModel::preset("tiga-wan", 4).unwrap();
    let servers = [RegionId(0), RegionId(1), RegionId(2)];
    let topology = Topology::placed(network.regions.clone(), &servers, 3, 3).unwrap();
    assert!(topology.nodes.iter().all(|n| n.replicas.is_empty() || n.region != RegionId(3)));
    let run_from = |region: u32| {
        let mut o = SimRunOptions::new(
            ProtocolKind::Occ,
            topology.clone(),
            network.clone(),
            ClockModel::preset("perfect").unwrap(),
            2,
        );
        o.clients = 12;
        o.txns = 300;
        o.client_regions = vec![RegionId(region)];
        let report = run(&o, micro_keys(3, 100_000, None)).unwrap();
        assert_passed(&report);
        report.latency_ns_p50 / NS_PER_MS
    };
    let (near, far) = (run_from(0), run_from(3));
    assert!(far > near + 200, "p50 {far} ms from Hong Kong against {near} ms from South Carolina");
}

/// Wide-area round trips per commit of every baseline on Tiga's placement (`tiga-wan`, three
/// server regions and Hong Kong, coordinators in all four), three-shard read-modify-write
/// transactions, against the counts docs/protocols/README.md gives: a wave of reads and the prepare
/// (2), plus the prepare's replication round when each shard's replicas span regions (3);
/// `mako` adds to its speculative count the decision's trip to the leaders, the replication
/// of the log that covers it and the watermark report's trip back (3 and 4).
#[test]
fn every_baseline_commits_in_its_designed_wide_area_round_trips() {
    for (protocol, unreplicated, replicated) in [
        (ProtocolKind::Occ, 2, 3),
        (ProtocolKind::TwoPl, 2, 3),
        (ProtocolKind::Mvto, 2, 3),
        (ProtocolKind::Mako, 3, 4),
    ] {
        for (replicas, wrtt) in [(1, unreplicated), (3, replicated)] {
            let o = tiga_wan(protocol, replicas, 200);
            let options = WorkloadOptions { shards: 3, ..WorkloadOptions::default() };
            let workload = Arc::from(meridian_workloads::build("micro-tiga", &options).unwrap());
            let report = run(&o, workload).unwrap();
            assert_passed(&report);
            let hops = median_hops(&report);
            assert_eq!(hops, 2 * wrtt, "{protocol:?} with {replicas} replicas");
        }
    }
}

/// `chain` on the same setting (one replica per shard; the pieces of `micro-tiga` run on
/// shards 0, 1, 2, in South Carolina, Finland and Brazil): the attempt goes out to hop 1,
/// hop 1's acknowledgement comes back, the coordinator's precommit goes out, the precommits
/// run on down the chain (hop 1 to 2, 2 to 3; the acknowledgements they wait for came earlier)
/// and the last hop's decision comes back. From a coordinator beside hop 1 (South Carolina)
/// the first three legs stay local: 5 wide-area legs; beside the last hop (Brazil) the
/// decision's does: 5; from Finland and Hong Kong every leg but none: 6. The same with 3
/// replicas per shard placed beside their leaders (`Placement::Local`: each hop's log
/// replicates within its region), with overlapped replication or serial. Spread over the
/// regions, overlapped replication adds 4 legs wherever the coordinator sits: the vote of the
/// hop before the last reaches a quorum of its shard (a wide-area round trip) before the last
/// hop hears it is durable, and the last hop's commit does the same. Serial replication adds
/// legs at every hop (each run and each vote replicated before the chain goes on): at least
/// 4 more again on these three-hop chains.
#[test]
fn chain_commits_in_its_designed_wide_area_legs_from_each_coordinator_region() {
    use meridian_core::topology::Placement;
    let medians = |replicas, placement, replication: &str| {
        let mut o = tiga_wan_placed(ProtocolKind::Chain, replicas, placement, 300);
        let given = [("chain-replication".to_string(), replication.to_string())];
        o.protocol_options = ProtocolKind::Chain.options(&given).unwrap();
        let options = WorkloadOptions { shards: 3, ..WorkloadOptions::default() };
        let workload = Arc::from(meridian_workloads::build("micro-tiga", &options).unwrap());
        let report = run(&o, workload).unwrap();
        assert_passed(&report);
        (0..4)
            .map(|region| {
                let mut hops: Vec<u16> = report
                    .completions
                    .iter()
                    .filter(|(c, _)| o.topology.region_of(c.coordinator).0 == region)
                    .map(|(_, h)| *h)
                    .collect();
                assert!(!hops.is_empty(), "region {region} coordinated");
                hops.sort_unstable();
                hops[hops.len() / 2]
            })
            .collect::<Vec<u16>>()
    };
    let alone = vec![5, 6, 5, 6];
    assert_eq!(medians(1, Placement::Spread, "overlapped"), alone);
    for replication in ["overlapped", "serial"] {
        assert_eq!(medians(3, Placement::Local, replication), alone, "local, {replication}");
    }
    let overlapped = medians(3, Placement::Spread, "overlapped");
    let serial = medians(3, Placement::Spread, "serial");
    assert_eq!(overlapped, vec![9, 10, 9, 10], "4 legs more than without replicas");
    assert!(serial.iter().zip(&overlapped).all(|(&s, &o)| s >= o + 4), "{serial:?}");
}

/// Tiga's evaluation setting: 3 shards × `replicas` on `tiga-wan` with the servers in the first
/// three regions and coordinators in all four, perfect clocks, 12 clients, seed 1.
fn tiga_wan(protocol: ProtocolKind, replicas: u32, txns: u64) -> SimRunOptions {
    tiga_wan_placed(protocol, replicas, meridian_core::topology::Placement::Spread, txns)
}

/// [`tiga_wan`] with each shard's replicas placed by `placement`.
fn tiga_wan_placed(
    protocol: ProtocolKind,
    replicas: u32,
    placement: meridian_core::topology::Placement,
    txns: u64,
) -> SimRunOptions {
    use meridian_core::RegionId;
    let network = NetworkModel::preset("tiga-wan", 4).unwrap();
    let servers = [RegionId(0), RegionId(1), RegionId(2)];
    let regions = network.regions.clone();
    let topology = Topology::placed_with(regions, &servers, 3, replicas, placement).unwrap();
    let mut o =
        SimRunOptions::new(protocol, topology, network, ClockModel::preset("perfect").unwrap(), 1);
    o.clients = 12;
    o.txns = txns;
    o.time_limit_ns = 600 * NS_PER_S;
    o
}

/// The wide-area one-way legs on the critical path of the median commit (the upper median).
fn median_hops(report: &SimRunReport) -> u16 {
    let mut hops: Vec<u16> = report.completions.iter().map(|(_, h)| *h).collect();
    hops.sort_unstable();
    hops[hops.len() / 2]
}

// ---------------------------------------------------------------------------------------------
// 2pc-mvto over Raft: the same guarantees as occ's scenarios (live, no acknowledged write lost,
// replicas equal), on schedules that reach its own state: prepares held for a writer, read
// stamps and history carried by snapshots, timestamps from a clock stepped back.

fn mvto_replicated(seed: u64) -> SimRunOptions {
    let mut options = replicated(seed, "metro");
    options.protocol = ProtocolKind::Mvto;
    options.clients = 24;
    options
}

/// The leader of shard 0 crashes when it receives a prepare, under contention (Zipf 0.99 on
/// 50 keys per shard: prepares wait for the writers they read from). The prepares it held
/// are gone with it; their coordinators' queries refuse them at the next leader.
/// Transactions that last longer than a second (ten dependent operations, most of them half a
/// second away) commit under `2pc-mvto`: the GC watermark keeps a plan's worth of the slowest
/// round trips. With one second of history every such attempt was refused below the
/// watermark at its prepare, retry after retry (the `crossstitch-3dc` preset committed nothing).
#[test]
fn mvto_transactions_longer_than_a_second_commit_without_retries() {
    let mut opts = SimRunOptions::new(
        ProtocolKind::Mvto,
        Topology::standard(vec!["brisbane".into(), "shanghai".into(), "paris".into()], 9, 1)
            .unwrap(),
        NetworkModel::preset("crossstitch-3", 3).unwrap(),
        ClockModel::preset("perfect").unwrap(),
        5,
    );
    opts.clients = 6;
    opts.txns = 24;
    opts.time_limit_ns = 600 * NS_PER_S;
    let options =
        WorkloadOptions { shards: 9, keys_per_shard: 10_000, ..WorkloadOptions::default() };
    let workload = Arc::from(meridian_workloads::build("crossstitch-synthetic", &options).unwrap());
    let report = run(&opts, workload).unwrap();
    assert_passed(&report);
    assert_eq!(report.retries, 0);
    assert!(report.latency_ns_p50 > 2 * NS_PER_S, "p50 {} ms", report.latency_ns_p50 / NS_PER_MS);
}

/// The CrossStitch worst case (its Fig. 12) for the "traditional" system: with the clients and
/// their coordinators in a third datacenter, a transaction of k dependent reads relayed by the
/// coordinator takes k wide-area round trips plus one for the commit: order status 3 + 1,
/// stock level 4 + 1 (`occ` and `2pc-mvto` with their `-one-round=off`). Meridian's
/// single-shard shortcut (on by default) ships the whole chain to its shard instead: one round
/// trip. `chain` takes the study's 2: the transaction out, the first hop's acknowledgement
/// back, the coordinator's precommit out, the decision back.
#[test]
fn dependent_reads_from_a_remote_client_cost_a_round_trip_each_plus_the_commit() {
    for (name, reads) in [("crossstitch-order-status", 3), ("crossstitch-stock-level", 4)] {
        for (protocol, one_round, wrtt) in [
            (ProtocolKind::Occ, "off", reads + 1),
            (ProtocolKind::Occ, "on", 1),
            (ProtocolKind::Mvto, "off", reads + 1),
            (ProtocolKind::Mvto, "on", 1),
            (ProtocolKind::Chain, "", 2),
        ] {
            let regions = vec!["dc-a".to_string(), "dc-b".into(), "clients".into()];
            let servers = [meridian_core::RegionId(0), meridian_core::RegionId(1)];
            let mut opts = SimRunOptions::new(
                protocol,
                Topology::placed(regions, &servers, 4, 1).unwrap(),
                NetworkModel::preset("crossstitch-remote-client", 3).unwrap(),
                ClockModel::preset("perfect").unwrap(),
                9,
            );
            if !one_round.is_empty() {
                let option = format!("{}-one-round", protocol.name());
                let given = [(option, one_round.to_string())];
                opts.protocol_options = protocol.options(&given).unwrap();
            }
            opts.client_regions = vec![meridian_core::RegionId(2)];
            opts.clients = 4;
            opts.txns = 40;
            let options = WorkloadOptions { shards: 4, ..WorkloadOptions::default() };
            let workload = Arc::from(meridian_workloads::build(name, &options).unwrap());
            let report = run(&opts, workload).unwrap();
            assert_passed(&report);
            let mut hops: Vec<u16> = report.completions.iter().map(|(_, h)| *h).collect();
            hops.sort_unstable();
            let p50 = hops[hops.len() / 2];
            assert_eq!(p50, 2 * wrtt, "{name} under {protocol:?} {one_round}: {hops:?}");
        }
    }
}

#[test]
fn mvto_a_shard_leader_crashing_while_prepares_wait_for_writers_loses_nothing() {
    let mut opts = mvto_replicated(41);
    let leader = replica(&opts, 0, 0);
    opts.crash_triggers = vec![crash_on(leader, crate::TriggerPoint::Receive, "Prepare {")];
    let report = run(&opts, micro_keys(2, 50, Some(0.99))).unwrap();
    assert_eq!(report.stats.triggered, 1);
    assert_replicated_run_passed(&report);
    let waits: u64 = (0..opts.topology.nodes.len() as u32)
        .map(|n| counter(&report, NodeId(n), "mvto_prepare_waits_total"))
        .sum();
    assert!(waits > 0, "some prepare waited for a writer");
}

/// A follower misses many snapshot intervals and catches up from a snapshot, then leads: the
/// run stays live and ends with equal replicas. (What the image carries, history and read
/// stamps, is checked by the participant's unit test
/// `mvto_a_snapshot_carries_history_stamps_and_pending_versions`: this schedule passes even
/// without them, as no later decision happened to depend on them.)
#[test]
fn mvto_a_replica_restored_from_a_snapshot_stays_equal_to_the_others() {
    let mut opts = mvto_replicated(42);
    opts.txns = 1_000;
    opts.snapshot_interval_entries = Some(16);
    let lagging = replica(&opts, 0, 2);
    opts.faults =
        vec![(NS_PER_S / 2, Fault::Crash(lagging)), (2 * NS_PER_S, Fault::Restart(lagging))];
    // It then leads: the old leader crashes after the follower caught up.
    let leader = replica(&opts, 0, 0);
    opts.faults.push((4 * NS_PER_S, Fault::Crash(leader)));
    opts.faults.push((5 * NS_PER_S, Fault::Restart(leader)));
    let report = run(&opts, micro_keys(2, 200, Some(0.9))).unwrap();
    assert_replicated_run_passed(&report);
    assert!(counter(&report, lagging, "raft_snapshots_received_total") >= 1);
}

/// A coordinator restarts with its clock ten seconds back: its timestamps fall below what it
/// wrote before, its first attempts are refused as too old, and the refusals carry it above
/// them. Checked as serializable (a stepped-back clock voids strictness for timestamp order).
#[test]
fn mvto_a_coordinator_whose_clock_stepped_back_catches_up_through_its_refusals() {
    // 3,000 requests: the run goes on for seconds after the restart, past the GC retention,
    // so the lagging clock's timestamps fall below the moving watermark, not only below
    // versions.
    let mut opts = options(43, "metro", 3, 3_000);
    opts.protocol = ProtocolKind::Mvto;
    opts.clock = ClockModel::preset("perfect").unwrap();
    let coordinator = opts.topology.coordinators()[0];
    opts.faults = vec![
        (400 * NS_PER_MS, Fault::Crash(coordinator)),
        (500 * NS_PER_MS, Fault::Restart(coordinator)),
    ];
    opts.restart_clock_step_back_ns = 10 * NS_PER_S;
    let report = run(&opts, micro(3, Some(0.9))).unwrap();
    assert_passed(&report);
    assert!(report.live);
    assert!(counter(&report, coordinator, "occ_coordinator_retried_total") > 0);
    // Without the clock offset its requests were refused below the watermark until they ran
    // out of attempts (4 failed on this seed).
    assert_eq!(report.failed, 0, "every request of the lagging coordinator got through");
}

// ---- mako -----------------------------------------------------------------------------------

fn bank(shards: u32, keys_per_shard: u64) -> Arc<dyn meridian_workloads::Workload> {
    let options = WorkloadOptions { shards, keys_per_shard, ..WorkloadOptions::default() };
    Arc::from(meridian_workloads::build("bank", &options).unwrap())
}

fn total(report: &SimRunReport, name: &str) -> u64 {
    report.node_counters.keys().map(|&node| counter(report, node, name)).sum()
}

/// `mako` on `geo`, 2 shards × 3 replicas in three regions: shard 0's leader crashes while
/// its newest speculative commits are a wide-area round trip from being replicated. The
/// failover closes the epoch; commits above its stable point are discarded on every replica
/// and retried; none of them had been acknowledged (bank's balances match exactly the
/// transfers the clients heard committed, and every replica of a shard is equal); and each
/// acknowledged commit reports its speculative latency beside its (longer) durable one.
#[test]
fn mako_a_leader_crash_discards_speculative_commits_and_none_was_acknowledged() {
    let mut opts = replicated(51, "geo");
    opts.protocol = ProtocolKind::Mako;
    opts.txns = 600;
    let leader = replica(&opts, 0, 0);
    opts.faults =
        vec![(4 * NS_PER_S, Fault::Crash(leader)), (8 * NS_PER_S, Fault::Restart(leader))];
    let report = run(&opts, bank(2, 50)).unwrap();
    assert_replicated_run_passed(&report);
    let discarded = total(&report, "mako_coordinator_discarded_total");
    let versions = total(&report, "mako_discarded_versions_total");
    eprintln!("mako leader crash: {discarded} speculative commits discarded, {versions} versions");
    assert!(discarded > 0, "the crash cost speculative commits");
    assert!(versions > 0, "replicas rolled their versions back");
    let committed: Vec<_> = report
        .completions
        .iter()
        .filter(|(c, _)| c.outcome.result == meridian_core::txn::TxnResult::Committed)
        .collect();
    assert!(!committed.is_empty());
    let cross_shard_spec = committed.iter().filter(|(c, _)| c.outcome.shards_touched > 1);
    for (c, _) in cross_shard_spec {
        let speculative = c.outcome.speculative_ns.expect("a mako commit reports it");
        let durable = c.completed_at - c.submitted_at;
        assert!(speculative < durable, "{speculative} ns speculative, {durable} ns durable");
    }
}

/// `mako`: shard 1 loses its majority for longer than the GC retention while shard 0 goes
/// on (its commits park: shard 1's watermark stands still), and one follower of shard 0 is
/// cut off meanwhile. When shard 1 comes back the epoch closes at a stable point far behind
/// shard 0's clock; the parked commits above it are discarded and retried, the follower
/// catches up through the epoch start, and the run ends live with equal replicas and balances
/// matching the acknowledged transfers. (The GC cap that keeps a lagging copy's history is
/// tested directly at the participant.)
#[test]
fn mako_a_long_outage_of_one_shard_and_a_lagging_follower_lose_nothing() {
    let mut opts = replicated(52, "metro");
    opts.protocol = ProtocolKind::Mako;
    opts.txns = 3_000;
    let (a, b) = (replica(&opts, 1, 1), replica(&opts, 1, 2));
    let lagging = replica(&opts, 0, 2);
    let others: Vec<NodeId> =
        (0..opts.topology.nodes.len() as u32).map(NodeId).filter(|&n| n != lagging).collect();
    opts.faults = vec![(NS_PER_S, Fault::Crash(a)), (NS_PER_S, Fault::Crash(b))];
    for &other in &others {
        opts.faults.push((NS_PER_S, Fault::Block(lagging, other)));
        opts.faults.push((NS_PER_S, Fault::Block(other, lagging)));
    }
    opts.faults.push((4 * NS_PER_S, Fault::Restart(a)));
    opts.faults.push((4 * NS_PER_S, Fault::Restart(b)));
    opts.faults.push((7 * NS_PER_S, Fault::Heal));
    let report = run(&opts, bank(2, 50)).unwrap();
    assert_replicated_run_passed(&report);
    assert!(total(&report, "mako_epochs_started_total") >= 6, "epochs changed");
}

// ---------------------------------------------------------------------------------------------
// tiga: timestamp-ordered one-shot transactions (fixed leaders; no view change yet).

fn tiga(seed: u64, shards: u32, replicas: u32, network: &str) -> SimRunOptions {
    let mut o = options(seed, network, shards, 400);
    o.protocol = ProtocolKind::Tiga;
    o.topology = Topology::standard(regions(3), shards, replicas).unwrap();
    o.clock = ClockModel::preset("perfect").unwrap();
    o
}

fn workload(name: &str, shards: u32, keys_per_shard: u64) -> Arc<dyn meridian_workloads::Workload> {
    let options = WorkloadOptions { shards, keys_per_shard, ..WorkloadOptions::default() };
    Arc::from(meridian_workloads::build(name, &options).unwrap())
}

/// Tiga's setting (3 shards × 3 replicas on `tiga-wan`, coordinators in all four regions):
/// most commits take the fast path, and the median commit takes one wide-area round trip,
/// with replicas or without.
#[test]
fn tiga_commits_in_one_wide_area_round_trip_mostly_on_the_fast_path() {
    for replicas in [1, 3] {
        let o = tiga_wan(ProtocolKind::Tiga, replicas, 300);
        let report = run(&o, workload("micro-tiga", 3, 100_000)).unwrap();
        assert_passed(&report);
        let fast = report.paths.get(&meridian_core::txn::CommitPath::Fast).copied().unwrap_or(0);
        assert!(fast * 3 >= report.committed, "{replicas} replicas: {:?}", report.paths);
        assert_eq!(median_hops(&report), 2, "{replicas} replicas: one round trip");
    }
}

/// A transfer whose payer (on one shard) cannot cover it aborts on the payee's shard too: the
/// leaders exchange their pieces' votes before applying writes. Two accounts per shard drain
/// often; money is conserved and every account matches the transfers the clients saw commit.
#[test]
fn tiga_user_aborts_on_one_shard_write_nothing_on_the_others() {
    for replicas in [1, 3] {
        let mut o = tiga(3, 2, replicas, "metro");
        o.txns = 3_000;
        let report = run(&o, workload("bank", 2, 2)).unwrap();
        assert_passed(&report);
        assert!(report.user_aborted > 20, "{} user aborts", report.user_aborted);
        assert!(report.cross_shard > 1_000, "{} cross-shard", report.cross_shard);
    }
}

/// SmallBank's Amalgamate credits one shard with what its debit took on another: the
/// debiting shard's leader sends its piece's output with its vote, the crediting leader runs
/// its piece once that is in and passes the value on to its followers with the outcome.
/// Money is conserved (the workload's invariant), replicas end equal, and fault seeds pass.
#[test]
fn tiga_passes_piece_outputs_between_shards() {
    for replicas in [1, 3] {
        let mut o = tiga(5, 3, replicas, "metro");
        o.txns = 2_000;
        let bank = workload("smallbank", 3, 50);
        let registry = bank.registry();
        let report = run(&o, bank).unwrap();
        assert_passed(&report);
        let amalgamated = report
            .completions
            .iter()
            .filter(|(done, _)| {
                let name = registry.get(done.txn.proc).map(|p| p.name());
                name == Some("smallbank-amalgamate")
                    && done.outcome.result == meridian_core::txn::TxnResult::Committed
                    && done.outcome.shards_touched > 1
            })
            .count();
        assert!(amalgamated > 50, "{replicas} replicas: {amalgamated} amalgamated across shards");
        for seed in 1..=4 {
            let (opts, _) =
                crate::swarm::seed_options(&tiga(seed, 3, replicas, "metro"), seed, true);
            assert_passed(&run(&opts, workload("smallbank", 3, 8)).unwrap());
        }
    }
}

/// Lost, duplicated and reordered messages, crashed and isolated coordinators, clocks stepped
/// back: the faulty swarm's first seeds pass on list-append and bank, with and without
/// replicas (the histories serializable, strictly where clocks are synchronized).
#[test]
fn tiga_passes_faulty_swarm_seeds() {
    passes_faulty_swarm_seeds(ProtocolKind::Tiga, &[("list-append", 16), ("bank", 4)]);
}

/// Tiga's setting (`tiga-wan`, 3 × 3, `micro-tiga`: every transaction on every shard): the
/// leader of shard 0 crashes under load and restarts 500 ms later. No commit completes while
/// it is down for longer than a wide-area round trip (every transaction needs it), commits
/// resume soon after it restarts (its journal's log runs again, then it proposes what it
/// had proposed), and the fast path comes back.
#[test]
fn tiga_commits_resume_soon_after_a_leader_restarts_on_tigas_setting() {
    let mut o = tiga_wan(ProtocolKind::Tiga, 3, 3_000);
    let leader = tiga_leader(&o, 0);
    let (crash, back) = (2 * NS_PER_S, 2 * NS_PER_S + 500 * NS_PER_MS);
    o.faults.push((crash, Fault::Crash(leader)));
    o.faults.push((back, Fault::Restart(leader)));
    let report = run(&o, workload("micro-tiga", 3, 100_000)).unwrap();
    assert_passed(&report);
    // Commits only: a crashed coordinator's clients hear of their lost requests too.
    let committed = report
        .completions
        .iter()
        .filter(|(c, _)| matches!(c.outcome.result, meridian_core::txn::TxnResult::Committed))
        .map(|(c, _)| c);
    let mut done: Vec<meridian_core::Time> = committed.map(|c| c.completed_at).collect();
    done.sort_unstable();
    // The longest time without a commit, and where it ended.
    let (gap, ended) = done.windows(2).map(|w| (w[1] - w[0], w[1])).max().expect("commits");
    let start = done[0].min(report.completions.iter().map(|(c, _)| c.submitted_at).min().unwrap());
    eprintln!(
        "longest stall {} ms, ended {} ms after the start (crash at {} ms, restart at {} ms)",
        gap / NS_PER_MS,
        (ended - start) / NS_PER_MS,
        crash / NS_PER_MS,
        back / NS_PER_MS
    );
    // Transactions already answered by the leader finish after the crash; none after a
    // round trip or so, and the first after the restart (the sim's clock starts at `start`).
    assert!(gap >= 300 * NS_PER_MS, "the shard stopped while its leader was down");
    assert!(ended - start >= back, "no commit without shard 0's leader");
    assert!(ended - start < back + NS_PER_S, "commits resumed within a second of the restart");
    let fast = report.paths.get(&meridian_core::txn::CommitPath::Fast).copied().unwrap_or(0);
    assert!(fast > 1_000, "{:?}", report.paths);
    // The leader restarted from its journal: entries run again, or a checkpoint taken up.
    let restarted = total(&report, "tiga_replayed_total")
        + total(&report, "tiga_resumed_from_checkpoint_total");
    assert!(restarted > 0);
}

/// A view change: shard 0's leader crashes for good under load and the view
/// manager's next view (given here by the scenario, at every live node) moves its shard to
/// another replica. The new leader gathers its followers' reports, rebuilds the log and leads
/// it; the other follower rejoins by a state transfer and vouches for the image's entries;
/// commits resume, nothing acknowledged is lost (the workload's invariant holds over exactly
/// what committed) and every live replica ends equal to its leader. Run on `micro-tiga` and
/// on `bank` (user aborts across shards: outcomes that must survive the change), over
/// several seeds, and once with messages lost, duplicated and reordered through the change.
#[test]
fn tiga_a_new_leader_rebuilds_the_log_after_its_leader_crashes_for_good() {
    for (name, keys, seed, chaos) in [
        ("micro-tiga", 1_000, 1, false),
        ("micro-tiga", 1_000, 2, true),
        ("bank", 8, 3, false),
        ("bank", 8, 4, true),
    ] {
        let (report, change) = view_change_run(ProtocolKind::Tiga, name, keys, seed, chaos);
        let label = format!("{name} seed {seed}");
        assert_passed(&report);
        assert_eq!(total(&report, "tiga_views_refused_total"), 0, "{label}");
        assert!(total(&report, "tiga_views_led_total") >= 1, "{label}: the new leader led");
        assert!(total(&report, "tiga_rejoined_total") >= 1, "{label}: a follower rejoined");
        let committed: Vec<meridian_core::Time> = report
            .completions
            .iter()
            .filter(|(c, _)| matches!(c.outcome.result, meridian_core::txn::TxnResult::Committed))
            .map(|(c, _)| c.completed_at)
            .collect();
        let start = report.completions.iter().map(|(c, _)| c.submitted_at).min().unwrap();
        let first_after = committed.iter().filter(|&&t| t - start > change).min().copied();
        let resumed_ms = first_after.map(|t| (t - start - change) / NS_PER_MS);
        let after = committed.iter().filter(|&&t| t - start > change + NS_PER_S).count();
        eprintln!(
            "{label}: committed {} ({after} over a second after the view change, the first \
             {resumed_ms:?} ms after it), unknown {}",
            report.committed, report.indeterminate
        );
        assert!(after > 100, "{label}: commits resumed after the view change");
    }
}

/// The view manager hosted in the nodes: shard 0's leader crashes for good under
/// load at 2 s and nothing else is told. The manager's group (three server nodes, one of
/// them on the crashed node's region) misses its heartbeats for `tiga-detect-ms` (1.5 s),
/// installs the next view through its log and announces it; every live node takes it and the
/// new leader rebuilds the log. With 3 replicas a super quorum needs all three, so commits
/// resume on the slow path; with 5, the shard is back to fast-path commits (4 of 5 match).
/// Checked: every live node took the view from the manager (none refused), commits resumed
/// within 5 s of the crash (fast ones with 5 replicas), and the histories and replicas check.
/// The leaders sat together, so `auto` ran preventive; with three replicas the new view's
/// leaders do not, and every live node switches to detective mode with it.
#[test]
fn tiga_the_view_manager_replaces_a_leader_that_crashed() {
    for (name, keys, seed, chaos, replicas) in [
        ("micro-tiga", 1_000, 1, false, 3),
        ("bank", 8, 2, true, 3),
        ("micro-tiga", 1_000, 3, false, 5),
    ] {
        let (report, crash) =
            managed_crash_run(ProtocolKind::Tiga, (name, keys), seed, chaos, replicas);
        let label = format!("{name} seed {seed}, {replicas} replicas");
        assert_passed(&report);
        assert!(report.live, "{label}: every request answered");
        assert_eq!(total(&report, "tiga_views_refused_total"), 0, "{label}");
        assert!(total(&report, "tiga_manager_proposed_total") >= 1, "{label}: proposed");
        assert!(total(&report, "tiga_views_led_total") >= 1, "{label}: the new leader led");
        let live_nodes = report.node_counters.len() as u64;
        assert_eq!(
            total(&report, "tiga_views_installed_total"),
            live_nodes,
            "{label}: every live node took one view"
        );
        let start = report.completions.iter().map(|(c, _)| c.submitted_at).min().unwrap();
        let first_after = |fast: bool| {
            report
                .completions
                .iter()
                .filter(|(c, _)| {
                    matches!(c.outcome.result, meridian_core::txn::TxnResult::Committed)
                })
                .filter(|(c, _)| !fast || c.outcome.path == meridian_core::txn::CommitPath::Fast)
                .filter(|(c, _)| c.submitted_at - start > crash)
                .map(|(c, _)| (c.completed_at - start - crash) / NS_PER_MS)
                .min()
        };
        let (resumed, fast) = (first_after(false), first_after(true));
        // The median latency of the commits submitted once the new view settled (4 s after
        // the crash): the mode the view picked shows there.
        let mut settled: Vec<u64> = report
            .completions
            .iter()
            .filter(|(c, _)| matches!(c.outcome.result, meridian_core::txn::TxnResult::Committed))
            .filter(|(c, _)| c.submitted_at - start > crash + 4 * NS_PER_S)
            .map(|(c, _)| (c.completed_at - c.submitted_at) / NS_PER_MS)
            .collect();
        settled.sort_unstable();
        let settled_p50 = settled.get(settled.len() / 2);
        eprintln!(
            "{label}: committed {}, the first commit submitted after the crash {resumed:?} ms \
             after it, the first fast one {fast:?} ms; p50 {settled_p50:?} ms of {} commits \
             submitted from 4 s after it",
            report.committed,
            settled.len()
        );
        assert!(resumed.is_some_and(|ms| ms < 5_000), "{label}: commits resumed within 5 s");
        if replicas == 5 {
            assert!(fast.is_some_and(|ms| ms < 5_000), "{label}: fast path back within 5 s");
        }
        // The leaders sat together (`auto`: preventive). With three replicas the crashed
        // one's shard is led from another region now, so the view is detective and every
        // live node switched; with five, a second replica in the leaders' region takes over
        // and the mode stays.
        let (changes, speculated) =
            (total(&report, "tiga_mode_changes_total"), total(&report, "tiga_speculated_total"));
        if replicas == 3 {
            assert_eq!(changes, live_nodes, "{label}: detective");
            assert!(speculated >= 1, "{label}: leaders speculate");
        } else {
            assert_eq!((changes, speculated), (0, 0), "{label}: still preventive");
        }
    }
}

/// Luigi's leader failover, through the scenario's view and through the view
/// manager hosted in its nodes: shard 0's leader crashes for good under load at 2 s; a
/// follower rebuilds the shard's log from a majority's reports (every entry a watermark
/// covered is on a majority, so in one of any two reports), leads it with watermarks that
/// count from nothing (its coordinators forgot the old leader's), and answers the
/// transactions it had executed as a follower. Checked: commits resume within 5 s of the
/// crash, every request is answered, nothing acknowledged is lost (the invariants hold over
/// exactly what committed) and the live replicas end equal.
#[test]
fn luigi_a_new_leader_takes_over_after_its_leader_crashes_for_good() {
    let start_of = |report: &SimRunReport| {
        report.completions.iter().map(|(c, _)| c.submitted_at).min().unwrap()
    };
    let resumed_after = |report: &SimRunReport, at: u64| {
        let start = start_of(report);
        report
            .completions
            .iter()
            .filter(|(c, _)| matches!(c.outcome.result, meridian_core::txn::TxnResult::Committed))
            .filter(|(c, _)| c.submitted_at - start > at)
            .map(|(c, _)| (c.completed_at - start - at) / NS_PER_MS)
            .min()
    };
    for (name, keys, seed, chaos) in
        [("micro-tiga", 1_000, 1, false), ("bank", 8, 2, true), ("smallbank", 8, 3, false)]
    {
        let label = format!("{name} seed {seed}");
        let (report, change) = view_change_run(ProtocolKind::Luigi, name, keys, seed, chaos);
        assert_passed(&report);
        assert!(report.live, "{label}: every request answered");
        assert_eq!(total(&report, "luigi_views_refused_total"), 0, "{label}");
        assert!(total(&report, "luigi_views_led_total") >= 1, "{label}: the new leader led");
        let resumed = resumed_after(&report, change);
        eprintln!(
            "{label}, scenario: committed {}, resumed {resumed:?} ms after the view change",
            report.committed
        );
        assert!(resumed.is_some_and(|ms| ms < 5_000), "{label}: commits resumed");

        let (report, crash) = managed_crash_run(ProtocolKind::Luigi, (name, keys), seed, chaos, 3);
        assert_passed(&report);
        assert!(report.live, "{label}: every request answered");
        assert!(total(&report, "luigi_manager_proposed_total") >= 1, "{label}: proposed");
        assert!(total(&report, "luigi_views_led_total") >= 1, "{label}: the new leader led");
        let live_nodes = report.node_counters.len() as u64;
        assert_eq!(total(&report, "luigi_views_installed_total"), live_nodes, "{label}");
        let resumed = resumed_after(&report, crash);
        eprintln!(
            "{label}, manager: committed {}, resumed {resumed:?} ms after the crash",
            report.committed
        );
        assert!(resumed.is_some_and(|ms| ms < 5_000), "{label}: commits resumed within 5 s");
    }
}

/// Seeds the faulty swarm found once the view manager acted in it (`tiga-detect-ms=100`, so
/// the swarm's partitions and crashes depose leaders; 3 × 3 on `metro`), each fixed since:
///
/// - 40042 (`bank`, `smallbank`): shard 2's leader was isolated long enough to be deposed
///   while one of its followers was still rejoining by a state transfer after a crash, so
///   the new leader had only its own report and asked the rejoining one forever. A deposed
///   leader now answers `Recover` from its frozen log before it retires.
/// - 41233 (`bank`): the manager chose a replica that had just restarted and was rejoining
///   (no log to lead with); it retired, and its shard had no leader for good. Heartbeats now
///   name the shards a node could not lead, and the manager picks only among the others
///   (and replaces a leader that says so).
/// - 41887 (`bank`): the manager's leader lost its own announcement (5% loss) and stayed in
///   the old view, a follower that never executed again. A member now takes every view its
///   group applied itself.
/// - 43572 (`bank`): a late copy of a restarted follower's heartbeat from before its crash
///   said it could lead; the manager made it leader while it was rejoining, it retired, and
///   with the deposed leader retired too its shard had no replica with a log. Heartbeats are
///   now numbered, and a member takes a node's newest only.
#[test]
fn tiga_view_manager_seeds_found_by_the_swarm() {
    // 41233 no longer changes views: its manager member n2 crashes before it synced any
    // record of the group, and a member restarted without its records now sits the group
    // out (`has_records`), so the other two elect too late to depose the isolated leader.
    // It stays as a faulty seed that must pass; the rule it found is unit-tested
    // (`only_dead_or_unable_leaders_move`) and 43572 exercises it.
    for (name, seed, changes) in [
        ("bank", 40042, true),
        ("smallbank", 40042, true),
        ("bank", 41233, false),
        ("bank", 41887, true),
        ("bank", 43572, true),
    ] {
        let mut base = tiga(seed, 3, 3, "metro");
        base.protocol_options = tiga_options(&[("tiga-detect-ms", "100")]);
        base.txns = 100;
        base.clients = 8;
        let (opts, _) = crate::swarm::seed_options(&base, seed, true);
        let report = run(&opts, workload(name, 3, 4)).unwrap();
        assert_passed(&report);
        if changes {
            let proposed = total(&report, "tiga_manager_proposed_total");
            assert!(proposed >= 1, "{name} {seed}: a view change");
        }
    }
}

/// Faulty swarm seeds whose plans take two of a shard's three replicas out at once (a crash
/// and a long isolation, or two crashes), beyond the fault budget of one; each stalled for
/// good before (tiga and luigi alike) and must now recover once the faults end:
/// - 50039: the leader is isolated, a follower crashes and comes back rejoining; the manager
///   chooses the rejoining one, and the other follower, sent to rejoin from it, is chosen
///   next. That one now leads from the state it dropped (no transfer had come), and the
///   first, chosen while rejoining, no longer retires when the view moves on (it never led;
///   it reported an empty log as if it held one).
/// - 50488: the manager deposed a new leader for an "unable" it had said in the view before,
///   while it still rejoined; a leader's "unable" now counts only when said in the current
///   view, and a replica that kept its state while rejoining is chosen as a last resort.
/// - 45894, 46909, 47816: earlier seeds of the same stall.
/// - 64932 (luigi, `rw-register`): a deposed leader that had rejoined by a whole transfer was
///   chosen to lead again and panicked at its first checkpoint: it still held the proposal
///   records of its first leadership, without their bodies. Retiring now drops every
///   leader-only record.
#[test]
fn shards_that_lost_two_replicas_at_once_recover_when_the_faults_end() {
    let cases = [
        (ProtocolKind::Tiga, "bank", 50039),
        (ProtocolKind::Tiga, "bank", 50488),
        (ProtocolKind::Tiga, "bank", 45894),
        (ProtocolKind::Tiga, "smallbank", 46909),
        (ProtocolKind::Tiga, "bank", 47816),
        (ProtocolKind::Luigi, "bank", 50039),
        (ProtocolKind::Luigi, "smallbank", 50488),
        (ProtocolKind::Luigi, "rw-register", 64932),
    ];
    for (protocol, name, seed) in cases {
        let prefix = protocol.name();
        let report = faulty_swarm_seed(protocol, name, seed);
        assert!(total(&report, &format!("{prefix}_views_installed_total")) >= 1, "{prefix} {seed}");
        if seed == 50039 {
            let stash = total(&report, &format!("{prefix}_views_led_from_stash_total"));
            assert!(stash >= 1, "{prefix} {name} {seed}: led from the state it dropped");
        }
    }
}

/// One seed of the faulty swarms with the view manager acting (`P-detect-ms=100`, metro,
/// 3 × 3, 100 transactions from 8 clients, 4 keys per shard), checked to have passed.
fn faulty_swarm_seed(protocol: ProtocolKind, name: &str, seed: u64) -> SimRunReport {
    faulty_swarm_seed_with(protocol, name, seed, &[])
}

/// [`faulty_swarm_seed`] with more protocol options.
fn faulty_swarm_seed_with(
    protocol: ProtocolKind,
    name: &str,
    seed: u64,
    more: &[(&str, &str)],
) -> SimRunReport {
    let mut base = tiga(seed, 3, 3, "metro");
    base.protocol = protocol;
    let detect = format!("{}-detect-ms", protocol.name());
    let mut given = vec![(detect.as_str(), "100")];
    given.extend_from_slice(more);
    base.protocol_options = protocol_options(protocol, &given);
    base.txns = 100;
    base.clients = 8;
    let (opts, _) = crate::swarm::seed_options(&base, seed, true);
    let report = run(&opts, workload(name, 3, 4)).unwrap();
    assert_passed(&report);
    report
}

/// A transaction that the old leader of a shard ran only as a detective speculation (held
/// for its agreement, so its log, as it reported it after a restart, had no entry for it) and
/// that its coordinator committed on the fast path. At the view change the new leader's
/// rebuilt log lacked it and another shard's leader pulled it in, but the new leader skipped
/// it as decided by its coordinator (as if executed here and dropped), though its body was
/// still here and it had never run: the other leader waited for its vote for ever and the
/// clients stalled. Faulty swarm seed 73833 in configured detective mode; it passed before
/// the probes of the measured mode changed the message order, and stalled after.
#[test]
fn a_pulled_transaction_decided_elsewhere_but_never_run_here_is_run_by_the_new_leader() {
    let report =
        faulty_swarm_seed_with(ProtocolKind::Tiga, "bank", 73833, &[("tiga-mode", "detective")]);
    assert!(report.live, "every request answered");
    assert!(total(&report, "tiga_views_installed_total") > 0, "a view change happened");
}

/// Fault plans that take all three replicas of one shard out: two crash before their
/// journals hold anything and come back empty, and the leader is cut off long enough to be
/// deposed. Its kept leader state is then the shard's only log; chosen again, it leads on
/// from it once both other replicas said (in their `Join`s) that they held the log in no
/// later view. Each seed stalled for good before, in every workload (the faulty swarms'
/// last failures, 3 of 10,000 seeds).
#[test]
fn shards_whose_three_replicas_were_all_out_recover_from_the_deposed_leaders_state() {
    let cases = [
        (ProtocolKind::Tiga, "bank", 62026),
        (ProtocolKind::Tiga, "list-append", 66191),
        (ProtocolKind::Tiga, "smallbank", 67566),
        (ProtocolKind::Luigi, "bank", 62026),
        (ProtocolKind::Luigi, "rw-register", 66191),
        (ProtocolKind::Luigi, "list-append", 67566),
    ];
    for (protocol, name, seed) in cases {
        let prefix = protocol.name();
        let report = faulty_swarm_seed(protocol, name, seed);
        let resumed = total(&report, &format!("{prefix}_views_resumed_total"));
        assert!(resumed >= 1, "{prefix} {name} {seed}: led on from the kept state");
    }
}

/// A live leader cut off from everyone (at 2 s, for 2.5 s) is deposed by the view manager
/// (tiga and luigi, Tiga's setting, 1,500 transactions). It rejoins its shard as soon as it
/// hears the new view, by a state transfer of every key that replaces its store (which may
/// hold writes the rebuilt log dropped), not only after a restart. So when the shard's other
/// follower then crashes for good (at 9 s), the new leader and the deposed one still form a
/// majority and commits go on: every request is answered, nothing acknowledged is lost, and
/// the deposed replica's store ends equal to the others'. (Before, it took no part until a
/// restart and the shard stalled.) The first run, without the second crash, tells which
/// replica the manager chose; the second crashes the other.
#[test]
fn a_deposed_live_leader_rejoins_at_once_and_its_shard_survives_losing_another_replica() {
    for protocol in [ProtocolKind::Tiga, ProtocolKind::Luigi] {
        let prefix = protocol.name();
        let mut o = tiga_wan(protocol, 3, 1_500);
        o.seed = 5;
        let deposed = tiga_leader(&o, 0);
        let (cut, heal) = (2 * NS_PER_S, 4 * NS_PER_S + NS_PER_S / 2);
        for other in o.topology.node_ids().filter(|&n| n != deposed) {
            o.faults.push((cut, Fault::Block(deposed, other)));
            o.faults.push((cut, Fault::Block(other, deposed)));
        }
        o.faults.push((heal, Fault::Heal));
        let first = run(&o, workload("bank", 3, 8)).unwrap();
        assert_passed(&first);
        assert!(counter(&first, deposed, &format!("{prefix}_replicas_retired_total")) >= 1);
        assert!(counter(&first, deposed, &format!("{prefix}_rejoined_total")) >= 1, "{prefix}");
        let led = |n: &NodeId| counter(&first, *n, &format!("{prefix}_views_led_total")) >= 1;
        let replicas = o.topology.shard_nodes(meridian_core::ShardId(0));
        let new_leader = *replicas.iter().find(|n| led(n)).expect("a follower led");
        let other = *replicas.iter().find(|&&n| n != deposed && n != new_leader).unwrap();
        let crash = 9 * NS_PER_S;
        o.faults.push((crash, Fault::Crash(other)));
        let report = run(&o, workload("bank", 3, 8)).unwrap();
        assert_passed(&report);
        assert!(report.live, "{prefix}: every request answered");
        let start = report.completions.iter().map(|(c, _)| c.submitted_at).min().unwrap();
        let after = report
            .completions
            .iter()
            .filter(|(c, _)| matches!(c.outcome.result, meridian_core::txn::TxnResult::Committed))
            .filter(|(c, _)| c.submitted_at - start > crash)
            .count();
        assert!(after > 0, "{prefix}: commits after the second loss");
    }
}

/// Tiga's setting with `replicas` per shard, 1,500 transactions and shard 0's leader crashing
/// for good at 2 s, the clients away from its region (its coordinator goes with it); returns
/// the options, the crashing leader and the crash's time from the start.
fn leader_crash(protocol: ProtocolKind, replicas: u32, seed: u64) -> (SimRunOptions, NodeId, u64) {
    let mut o = tiga_wan(protocol, replicas, 1_500);
    o.seed = seed;
    let topology = o.topology.clone();
    let leader = tiga_leader(&o, 0);
    let region = topology.region_of(leader);
    o.client_regions = (0..topology.regions.len())
        .map(|r| meridian_core::RegionId(r as _))
        .filter(|&r| r != region)
        .collect();
    let crash = 2 * NS_PER_S;
    o.faults.push((crash, Fault::Crash(leader)));
    (o, leader, crash)
}

/// Runs `name` on Tiga's setting with `replicas` per shard and shard 0's leader crashing for
/// good at 2 s, the view manager on; returns the report and the crash's time from the start.
fn managed_crash_run(
    protocol: ProtocolKind,
    (name, keys): (&str, u64),
    seed: u64,
    chaos: bool,
    replicas: u32,
) -> (SimRunReport, u64) {
    let (mut o, _, crash) = leader_crash(protocol, replicas, seed);
    if chaos {
        o.chaos = crate::Chaos {
            loss: 0.05,
            duplicate: 0.05,
            reorder: 0.05,
            until_ns: crash + 4 * NS_PER_S,
        };
    }
    (run(&o, workload(name, 3, keys)).unwrap(), crash)
}

/// Seeds of the scenario above that a hunt over it found failing, each fixed since (odd seeds
/// calm, even ones with message chaos, as the hunt below runs them):
///
/// - `micro-tiga` 17: a cross-shard transaction the other leaders had agreed on with the old
///   leader sat in the new leader's own tail; it skipped pulling it in for that, though
///   promotion keeps no tail, so the coordinator's resend came as a late arrival and landed
///   at a later timestamp than on the other shards (never decided).
/// - `micro-tiga` 28: the other leaders had dropped the transaction's body (every follower
///   executed it), so their answer to the pull left it out; they now tell its shards from
///   the decision record.
/// - `bank` 198: an unchanged leader kept the deposed leader's proposal and ignored the new
///   leader's; the two proposed to each other forever. Agreements with a shard whose leader
///   changed now start again in the new view.
/// - `micro-tiga` 194: a peer waited for shard 0's vote on a transaction the new leader had
///   executed as a follower, and the new leader held no record to answer from (every client
///   stalled behind it). It now takes one over for each such entry.
/// - `smallbank` 352: a transaction pulled in (the rebuild had not kept it) waited for the
///   other shard's vote and outputs, which that leader had sent to the old leader only. The
///   new leader now asks for the votes of every multi-shard entry it adds.
#[test]
fn tiga_view_change_seeds_found_by_the_hunt() {
    for (name, keys, seed) in [
        ("micro-tiga", 1_000, 17),
        ("micro-tiga", 1_000, 28),
        ("bank", 8, 198),
        ("micro-tiga", 1_000, 194),
        ("smallbank", 8, 352),
    ] {
        let (report, _) = view_change_run(ProtocolKind::Tiga, name, keys, seed, seed % 2 == 0);
        assert!(report.live, "{name} seed {seed}: every request answered");
        assert_passed(&report);
    }
}

/// The hunt over the view-change scenario: `MERIDIAN_VIEW_CHANGE_SEEDS` (`A..B`, default
/// `10..50`) × `bank`, `micro-tiga`, `smallbank`, even seeds with message chaos, for tiga
/// or, with `MERIDIAN_VIEW_CHANGE_PROTOCOL=luigi`, luigi. Long: run it
/// on purpose, in release (`cargo test -p meridian-sim --release -- --ignored
/// tiga_view_change_hunt`); it names every failing run, then fails.
#[test]
#[ignore]
fn tiga_view_change_hunt() {
    let range = std::env::var("MERIDIAN_VIEW_CHANGE_SEEDS").unwrap_or_else(|_| "10..50".into());
    let (from, to) = range.split_once("..").expect("seeds as A..B");
    let seeds = from.parse::<u64>().expect("a seed")..to.parse::<u64>().expect("a seed");
    let protocol = match std::env::var("MERIDIAN_VIEW_CHANGE_PROTOCOL").as_deref() {
        Ok("luigi") => ProtocolKind::Luigi,
        _ => ProtocolKind::Tiga,
    };
    let mut failed = Vec::new();
    for (name, keys) in [("bank", 8), ("micro-tiga", 1_000), ("smallbank", 8)] {
        for seed in seeds.clone() {
            let (report, _) = view_change_run(protocol, name, keys, seed, seed % 2 == 0);
            let bad: Vec<&str> =
                report.checks.iter().filter(|c| !c.passed).map(|c| c.name.as_str()).collect();
            if !bad.is_empty() {
                eprintln!("{name} seed {seed}: {bad:?}");
                failed.push(format!("{name} {seed}"));
            }
        }
    }
    assert!(failed.is_empty(), "failing runs: {failed:?}");
}

/// Runs `name` on Tiga's setting with shard 0's leader crashing for good at 2 s and the next
/// view installed at every live node 300 ms later; returns the report and the view change's
/// time from the start.
fn view_change_run(
    protocol: ProtocolKind,
    name: &str,
    keys: u64,
    seed: u64,
    chaos: bool,
) -> (SimRunReport, u64) {
    use meridian_core::node::Control;
    let (mut o, leader, crash) = leader_crash(protocol, 3, seed);
    // The scenario is the view manager here.
    o.protocol_options = match protocol {
        ProtocolKind::Luigi => protocol_options(protocol, &[("luigi-view-manager", "off")]),
        _ => tiga_options(&[("tiga-view-manager", "off")]),
    };
    let topology = o.topology.clone();
    let view = meridian_protocols::tiga::node::initial_view(&topology).unwrap();
    let change = crash + 300 * NS_PER_MS;
    if chaos {
        o.chaos = crate::Chaos {
            loss: 0.05,
            duplicate: 0.05,
            reorder: 0.05,
            until_ns: change + NS_PER_S,
        };
    }
    // Every shard whose leader sat on the crashed node moves to its next replica; the others
    // keep theirs.
    let mut local = view.local.clone();
    for (shard, local) in local.iter_mut().enumerate() {
        let slot = view.leader_slot(meridian_core::ShardId(shard as u32), topology.replicas);
        if replica(&o, shard as u32, slot) == leader {
            *local += 1;
        }
    }
    let control = Control::View { global: view.global + 1, local, detective: false };
    for node in topology.node_ids().filter(|&n| n != leader) {
        o.faults.push((change, Fault::Control(node, control.clone())));
    }
    (run(&o, workload(name, 3, keys)).unwrap(), change)
}

/// Found by the swarm once leaders could crash (seed 9935 of `bank` on 3 × 3): a follower
/// began a state transfer from its leader, the leader crashed and restarted from its journal,
/// and the restarted leader's first image took the id of the one its previous start had
/// begun to send (ids restarted at 1). The follower put the parts of the two images together
/// and diverged (the money was off by 24 cents). Transfer ids now grow across starts (the
/// unit test `a_restarted_leaders_transfer_ids_start_above_its_earlier_starts`). Followers
/// restart from their journals now, so the seed no longer sends one to a transfer; it stays
/// as a swarm seed that must pass.
#[test]
fn seed_9935_a_restarted_leader_never_reuses_a_state_transfer_id() {
    let base = tiga(9935, 3, 3, "metro");
    let (opts, _) = crate::swarm::seed_options(&base, 9935, true);
    let report = run(&opts, workload("bank", 3, 4)).unwrap();
    assert_passed(&report);
}

/// A run's logs stay short: a leader drops the entries every follower executed and a
/// follower those it executed, at least `log_drop_min` (1,024) at a time, and a tiga follower forgets
/// a dropped transaction once its coordinator said it decided it (a luigi follower hears no
/// coordinator and keeps knowing them). A follower that restarts late in the run takes up its
/// journal (its checkpoint's image of a log that no longer starts at 0, and what followed) and
/// ends equal to its leader; the history is strictly serializable.
#[test]
fn tiga_and_luigi_logs_hold_only_what_is_not_executed_everywhere() {
    for protocol in [ProtocolKind::Tiga, ProtocolKind::Luigi] {
        let prefix = if protocol == ProtocolKind::Tiga { "tiga" } else { "luigi" };
        let mut o = tiga(37, 2, 3, "metro");
        o.protocol = protocol;
        o.txns = 6_000;
        let leader = tiga_leader(&o, 0);
        let follower = (0..3).map(|slot| replica(&o, 0, slot)).find(|&n| n != leader).unwrap();
        o.faults.push((2_000 * NS_PER_MS, Fault::Crash(follower)));
        o.faults.push((2_100 * NS_PER_MS, Fault::Restart(follower)));
        let report = run(&o, workload("list-append", 2, 16)).unwrap();
        assert_passed(&report);
        assert!(report.committed >= 6_000, "{protocol:?}: {} committed", report.committed);
        let sum = |name: &str| total(&report, &format!("{prefix}_{name}"));
        // Every commit leaves an entry on three replicas of each shard it touches.
        let held = sum("log_entries");
        assert!(held * 2 < report.committed * 3, "{protocol:?}: {held} entries held");
        let node = |name: &str| counter(&report, follower, &format!("{prefix}_{name}"));
        assert_eq!(node("followers_resumed_total"), 1, "{protocol:?}: resumed from its journal");
        assert_eq!(node("rejoined_total"), 0, "{protocol:?}: no state transfer");
        assert!(node("checkpoints_total") > 0, "{protocol:?}: from a checkpoint");
        let equal = report.checks.iter().find(|c| c.name == "replicas-equal").unwrap();
        assert!(equal.passed && equal.detail.starts_with('4'), "{}", equal.detail);
        if protocol == ProtocolKind::Tiga {
            let lingering = sum("log_lingering");
            assert!(lingering * 10 < report.committed, "{lingering} linger");
        }
        // A leader's outcome record of a multi-shard transaction goes once its followers
        // executed it and the other shard's leader promised a closed timestamp above it.
        let (decided, waited) = (sum("decided_kept"), sum("vote_waits_total"));
        assert!(waited > 1_000, "{protocol:?}: {waited} multi-shard executions");
        assert!(decided * 20 < waited, "{protocol:?}: {decided} outcome records kept");
    }
}

/// A leader forgets the transactions below its log's base once their coordinators decided
/// them and (for a multi-shard one) every other leader promised past them, and refuses their
/// late copies: with every message duplicated at 5% (the copy at an independent time) and
/// logs dropped an entry at a time, a copy that arrives after its transaction was forgotten
/// would run it twice, and the history checks would fail. One shard (every transaction
/// single-shard), and three (most of them multi-shard: late proposals and votes too); one
/// seed of each waits to forget at most 2 at a time.
#[test]
fn tiga_and_luigi_leaders_forget_decided_transactions_and_refuse_late_copies() {
    for (protocol, shards) in [
        (ProtocolKind::Tiga, 1),
        (ProtocolKind::Luigi, 1),
        (ProtocolKind::Tiga, 3),
        (ProtocolKind::Luigi, 3),
    ] {
        let prefix = if protocol == ProtocolKind::Tiga { "tiga" } else { "luigi" };
        for seed in 0..3 {
            let mut o = tiga(40 + seed, shards, 3, "metro");
            o.protocol = protocol;
            o.txns = 3_000;
            o.limits.log_drop_min = 1;
            // The last seed waits to forget at most 2 at a time: the rest are taken up from
            // the logged set whenever there is room again.
            if seed == 2 {
                o.limits.forgettable_max = 2;
            }
            o.chaos =
                crate::Chaos { loss: 0.0, duplicate: 0.05, reorder: 0.05, until_ns: 60 * NS_PER_S };
            let report = run(&o, workload("list-append", shards, 16)).unwrap();
            assert_passed(&report);
            assert!(report.committed >= 3_000, "{protocol:?}: {} committed", report.committed);
            let sum = |name: &str| total(&report, &format!("{prefix}_{name}"));
            // Each commit was logged once per shard it touched.
            let logged = sum("logged_kept");
            assert!(logged * 4 < report.committed, "{protocol:?}: {logged} still known as logged");
            if shards > 1 {
                assert!(sum("vote_waits_total") > 1_000, "{protocol:?}: multi-shard ones");
            }
            // Refusals answer late copies here (no coordinator gives up): none drops anything.
            assert_eq!(sum("refused_total"), 0, "{protocol:?}: a live transaction dropped");
            eprintln!(
                "{protocol:?} {shards} shards seed {seed}: {logged} known as logged, {} stale \
                 bodies and {} stale votes dropped, {} refusals",
                sum("stale_bodies_total"),
                sum("stale_votes_total"),
                sum("refusals_sent_total"),
            );
        }
    }
}

/// A coordinator gives up on transactions the leader of shard 1 never received (its link
/// from every coordinator, and from shard 0's leader, is cut for two seconds), while shard
/// 0's leader holds them, proposing. Once the coordinators' links heal, shard 1's leader
/// learns from their next bodies that they decided those, and refuses them when shard 0's
/// leader proposes again; shard 0's leader drops them, and what they held back on its keys
/// runs. Every transaction is decided, the history is strictly serializable, and no leader
/// holds anything at the end: for tiga and luigi, in detective mode (a speculative run of a
/// dropped transaction is revoked), and under message loss, duplication and reordering.
#[test]
fn tiga_and_luigi_leaders_drop_what_another_leader_refused() {
    let cases = [
        (ProtocolKind::Tiga, "preventive", false),
        (ProtocolKind::Luigi, "preventive", false),
        (ProtocolKind::Tiga, "detective", false),
        (ProtocolKind::Tiga, "preventive", true),
        (ProtocolKind::Luigi, "preventive", true),
    ];
    for (protocol, mode, chaos) in cases {
        let prefix = if protocol == ProtocolKind::Tiga { "tiga" } else { "luigi" };
        let mut o = tiga(44, 2, 1, "metro");
        o.protocol = protocol;
        o.txns = 600;
        o.attempts_max = Some(3);
        if protocol == ProtocolKind::Tiga {
            o.protocol_options = tiga_options(&[("tiga-mode", mode)]);
        }
        if chaos {
            o.chaos =
                crate::Chaos { loss: 0.01, duplicate: 0.02, reorder: 0.05, until_ns: 4 * NS_PER_S };
        }
        let (zero, one) = (tiga_leader(&o, 0), tiga_leader(&o, 1));
        for coordinator in o.topology.coordinators() {
            o.faults.push((500 * NS_PER_MS, Fault::Block(coordinator, one)));
        }
        o.faults.push((500 * NS_PER_MS, Fault::Block(zero, one)));
        // The coordinators' links come back a second before shard 0's leader's: shard 1's
        // leader hears their next bodies before another proposal (otherwise it fetches what
        // it hears proposed, and takes it, as long as it does not know it decided).
        o.faults.push((2_500 * NS_PER_MS, Fault::Heal));
        o.faults.push((2_500 * NS_PER_MS, Fault::Block(zero, one)));
        o.faults.push((3_500 * NS_PER_MS, Fault::Heal));
        let report = run(&o, workload("list-append", 2, 8)).unwrap();
        assert_passed(&report);
        let sum = |name: &str| total(&report, &format!("{prefix}_{name}"));
        let (refused, dropped) = (sum("refusals_sent_total"), sum("refused_total"));
        let case = format!("{protocol:?} {mode}{}", if chaos { " under chaos" } else { "" });
        eprintln!(
            "{case}: {} committed, {} indeterminate, {refused} refusals, {dropped} dropped, {} \
             speculative runs revoked",
            report.committed,
            report.indeterminate,
            sum("revoked_total")
        );
        assert!(report.indeterminate > 0, "{case}: coordinators gave up");
        assert!(dropped > 0 && refused >= dropped, "{case}: {refused} / {dropped}");
        assert_eq!(counter(&report, one, &format!("{prefix}_refused_total")), 0);
        assert_eq!(sum("held"), 0, "{case}: nothing held for good");
        if mode == "detective" {
            assert!(sum("revoked_total") > 0, "{case}: a speculative run revoked");
            assert_eq!(sum("speculations"), 0, "{case}: speculations left over");
        }
    }
}

/// Coordinators cut off from a shard's leader, but not from its followers, give up after 3
/// sends: the followers release what only they received, and their leader never lists it.
/// Each follower drops those entries once its leader's promise (sent every pace with the log
/// length that covers it) says the log will never list them there; kept, they stayed in the
/// followers' key hashes and unsynced tails for good, and fast replies on their keys
/// disagreed with the leader's for the rest of the run.
#[test]
fn tiga_followers_drop_what_their_leader_will_never_list() {
    for shards in [1, 2] {
        let mut o = tiga(45, shards, 3, "metro");
        o.txns = 800;
        o.attempts_max = Some(3);
        let leader = tiga_leader(&o, 0);
        for coordinator in o.topology.coordinators() {
            o.faults.push((500 * NS_PER_MS, Fault::Block(coordinator, leader)));
        }
        o.faults.push((2_000 * NS_PER_MS, Fault::Heal));
        let report = run(&o, workload("list-append", shards, 8)).unwrap();
        assert_passed(&report);
        let dropped = total(&report, "tiga_tail_dropped_total");
        let left = total(&report, "tiga_tail_entries");
        let fast = total(&report, "tiga_fast_commits_total");
        eprintln!(
            "{shards} shard(s): {} committed, {} indeterminate, {dropped} dropped from tails, \
             {left} left, {fast} fast commits",
            report.committed, report.indeterminate
        );
        assert!(report.indeterminate > 0, "coordinators gave up");
        assert!(dropped > 0, "followers dropped what their leader never took");
        assert_eq!(left, 0, "no tail entry left at the end");
        let kept = total(&report, "tiga_unlisted_kept");
        assert_eq!(kept, 0, "bodies kept only until their coordinators decided them");
        // Kept, the entries left followers disagreeing on their keys: 332 of 820 commits
        // were fast on one shard (against 800 of 812 with them dropped).
        assert!(fast * 10 >= report.committed * 8, "{fast} of {} fast", report.committed);
    }
}

/// Swarm seed 502 of `bank` under luigi (3 × 3): a leader restarts (its clock 100 ms back)
/// holding again a transaction it had proposed, at its first proposal. Its worker's
/// watermark had been told at that very timestamp (the hold had moved above it), so the
/// restarted leader did not count the transaction as unreplicated, and the watermark could
/// pass it before it was replicated (a debug build stopped at the stream's assertion when a
/// resend came). A restored proposal is now open in its stream whatever was told.
#[test]
fn seed_502_a_restarted_luigi_leader_counts_its_restored_proposals_unreplicated() {
    let mut base = tiga(502, 3, 3, "metro");
    base.protocol = ProtocolKind::Luigi;
    (base.clients, base.txns) = (8, 100);
    let (opts, _) = crate::swarm::seed_options(&base, 502, true);
    let report = run(&opts, workload("bank", 3, 4)).unwrap();
    assert_passed(&report);
    assert!(total(&report, "luigi_restored_proposals_total") >= 1, "a proposal was restored");
}

/// Swarm seed 365 of `smallbank` under luigi (3 × 3, a follower lag limit of 4): while the
/// follower limit was first built, a leader dropped the inputs of its outcomes with the
/// bodies past the limit but still sent its log and those outcomes to a follower behind it,
/// which ran pieces without the outputs they take from other shards and diverged (money off
/// by 782.70). A leader now sends such a follower nothing but word to take a transfer.
#[test]
fn seed_365_a_follower_behind_its_leaders_limit_gets_no_outcomes_without_inputs() {
    let mut base = tiga(365, 3, 3, "metro");
    base.protocol = ProtocolKind::Luigi;
    let (opts, _) = crate::swarm::seed_options(&base, 365, true);
    assert_eq!(opts.limits.follower_lag_max, 4, "the plan's limit");
    let report = run(&opts, workload("smallbank", 3, 4)).unwrap();
    assert_passed(&report);
    assert!(total(&report, "luigi_went_behind_total") >= 1, "a follower fell behind");
}

/// The faulty swarm's seeds 1 to 6 of `workloads` (name, keys per shard) on 3 shards of
/// `protocol` (tiga's options otherwise), with 1 and 3 replicas, all pass.
fn passes_faulty_swarm_seeds(protocol: ProtocolKind, workloads: &[(&str, u64)]) {
    for seed in 1..=6 {
        for replicas in [1, 3] {
            for &(name, keys) in workloads {
                let mut base = tiga(seed, 3, replicas, "metro");
                base.protocol = protocol;
                let (opts, _) = crate::swarm::seed_options(&base, seed, true);
                let report = run(&opts, workload(name, 3, keys)).unwrap();
                assert_passed(&report);
            }
        }
    }
}

/// Without snapshot reads a tiga or luigi replica keeps about one version per key: a key's
/// older versions go once no queued transaction can read them (at the end of a run, none),
/// so a long run does not grow its stores. With snapshot reads on, every version stays.
/// Either way, replicas keep replies for resends only of transactions their coordinators
/// have not decided (and those decided since each coordinator's last body to the replica).
#[test]
fn tiga_and_luigi_stores_keep_only_the_versions_reads_can_see() {
    let counter = |report: &crate::runner::SimRunReport, name: &str| -> u64 {
        let values = report.node_counters.values().flatten();
        values.filter(|(n, _)| n.ends_with(name)).map(|(_, v)| v).sum()
    };
    let given = [(meridian_protocols::tiga::OPTION_SNAPSHOT_READS.to_string(), "on".to_string())];
    for (protocol, snapshot_reads) in
        [(ProtocolKind::Tiga, false), (ProtocolKind::Luigi, false), (ProtocolKind::Tiga, true)]
    {
        let mut o = tiga(3, 3, 3, "metro");
        o.protocol = protocol;
        if snapshot_reads {
            o.protocol_options = protocol.options(&given).unwrap();
        }
        o.txns = 2_000;
        let report = run(&o, workload("bank", 3, 8)).unwrap();
        assert_passed(&report);
        let (versions, keys) =
            (counter(&report, "_store_versions"), counter(&report, "_store_keys"));
        let label = format!("{protocol:?}, snapshot reads {snapshot_reads}");
        let answers = counter(&report, "_answers_kept");
        eprintln!("{label}: {versions} versions, {keys} keys, {answers} answers kept");
        assert!(answers < o.txns / 10, "{label}: {answers} replies kept after {} txns", o.txns);
        assert!(keys > 0, "{label}");
        if snapshot_reads {
            assert!(versions > 10 * keys, "{label}: {versions} versions of {keys} keys");
        } else {
            assert!(versions * 10 <= keys * 11, "{label}: {versions} versions of {keys} keys");
        }
    }
}

/// `tiga-snapshot-reads=on`: a read-only transaction reads a closed snapshot at the closest
/// replica of each shard (a leader closes a timestamp once everything it released at or
/// below it has run, and holds later arrivals above it; a follower serves once its leader
/// said so and it executed that far). Read-only transactions of list-append and
/// rw-register take that path, and the histories, checked for serializability (the
/// guarantee with snapshot reads), pass with and without replicas, faults included.
#[test]
fn tiga_snapshot_reads_are_serializable() {
    let given = [(meridian_protocols::tiga::OPTION_SNAPSHOT_READS.to_string(), "on".to_string())];
    let snapshot_on = ProtocolKind::Tiga.options(&given).unwrap();
    assert_eq!(
        ProtocolKind::Tiga.guarantee(&snapshot_on),
        meridian_protocols::Guarantee::Serializable
    );
    for replicas in [1, 3] {
        for (name, keys) in [("list-append", 16), ("rw-register", 16)] {
            let mut o = tiga(19, 3, replicas, "metro");
            o.protocol_options = snapshot_on.clone();
            o.txns = 1_500;
            let report = run(&o, workload(name, 3, keys)).unwrap();
            assert_passed(&report);
            // Shard 0's followers hear nothing from their leader for a second: their log
            // stops, they must not serve reads past it (the coordinators' resends go to the
            // leader), and the other shards go on.
            let mut cut = o.clone();
            let leader = tiga_leader(&cut, 0);
            for slot in 0..replicas {
                let node = replica(&cut, 0, slot);
                if node != leader {
                    cut.faults.push((300 * NS_PER_MS, Fault::Block(leader, node)));
                }
            }
            cut.faults.push((1_300 * NS_PER_MS, Fault::Heal));
            assert_passed(&run(&cut, workload(name, 3, keys)).unwrap());
            let snapshots =
                report.paths.get(&meridian_core::txn::CommitPath::Snapshot).copied().unwrap_or(0);
            assert!(snapshots > 100, "{name} {replicas}: {:?}", report.paths);
            for seed in 1..=3 {
                let (opts, _) = crate::swarm::seed_options(&o, seed, true);
                assert_passed(&run(&opts, workload(name, 3, keys)).unwrap());
            }
        }
    }
}

/// Tiga's options `given` by name.
fn tiga_options(given: &[(&str, &str)]) -> meridian_protocols::ProtocolOptions {
    protocol_options(ProtocolKind::Tiga, given)
}

/// `protocol`'s options `given` by name.
fn protocol_options(
    protocol: ProtocolKind,
    given: &[(&str, &str)],
) -> meridian_protocols::ProtocolOptions {
    let given: Vec<(String, String)> =
        given.iter().map(|&(k, v)| (k.to_string(), v.to_string())).collect();
    protocol.options(&given).unwrap()
}

/// Tiga's setting with each shard's leader in another region (`tiga-leaders=spread`, Tiga's
/// §5.5): agreeing before executing (preventive) puts a wide-area delay between the leaders
/// on the critical path of many commits (2.26 one-way legs per commit on average here);
/// detective mode (what `auto` picks for leaders apart) runs a transaction as soon as it is
/// due, answers, and agrees meanwhile (1.79 legs; one round trip at the median).
/// Speculative runs stand when the agreement keeps their timestamp, and none is left over.
#[test]
fn tiga_detective_mode_commits_in_one_round_trip_with_its_leaders_apart() {
    let mut hops = Vec::new();
    for mode in ["preventive", "auto"] {
        let mut o = tiga_wan(ProtocolKind::Tiga, 3, 400);
        o.protocol_options = tiga_options(&[("tiga-leaders", "spread"), ("tiga-mode", mode)]);
        let report = run(&o, workload("micro-tiga", 3, 100_000)).unwrap();
        assert_passed(&report);
        let (ran, kept) = (
            total(&report, "tiga_speculated_total"),
            total(&report, "tiga_speculations_kept_total"),
        );
        if mode == "auto" {
            assert!(kept > 300 && kept <= ran, "{ran} speculative runs, {kept} kept");
        } else {
            assert_eq!(ran, 0, "a preventive leader never runs before agreeing");
        }
        assert_eq!(total(&report, "tiga_speculations"), 0, "{mode}: speculations left over");
        let legs: u64 = report.completions.iter().map(|(_, h)| u64::from(*h)).sum();
        hops.push((median_hops(&report), legs as f64 / report.completions.len() as f64));
    }
    let [(_, preventive), (median, detective)] = hops[..] else { unreachable!() };
    assert_eq!(median, 2, "detective: one round trip at the median");
    assert!(detective + 0.3 < preventive, "mean one-way legs: {preventive} then {detective}");
}

/// Clocks further apart than the network's delays (`metro`, 2 ms one way, with `chrony`
/// clocks, ±5 ms): a follower whose clock lags its leader's by more than the delay between
/// them receives the leader's log before its clock releases a transaction, places it there and
/// never replies fast, only slow. Its coordinator must still learn the delay to it: the slow
/// reply carries the body's arrival delay, and a fast reply that comes after the transaction
/// was decided still counts as a sample. Before, such a follower kept the initial estimate
/// (100 ms), so every timestamp was 110 ms out and the median commit took 115 ms; now the
/// median is about a fifth of that.
#[test]
fn tiga_coordinators_learn_the_delay_to_followers_that_only_reply_slow() {
    let mut o = replicated(23, "metro");
    o.topology = Topology::standard(regions(3), 3, 3).unwrap();
    o.protocol = ProtocolKind::Tiga;
    o.clock = ClockModel::preset("chrony").unwrap();
    o.txns = 600;
    let report = run(&o, workload("micro-tiga", 3, 1_000)).unwrap();
    assert_passed(&report);
    let initial = meridian_protocols::tiga::OWD_INITIAL_NS;
    eprintln!(
        "metro, chrony: p50 {} ms, {} slow commits of {}",
        report.latency_ns_p50 / NS_PER_MS,
        report.paths.get(&meridian_core::txn::CommitPath::Slow).copied().unwrap_or(0),
        report.committed
    );
    assert!(
        report.latency_ns_p50 < initial / 2,
        "p50 {} ms: a coordinator still stamps with the initial estimate",
        report.latency_ns_p50 / NS_PER_MS
    );
}

/// `auto` decides the agreement mode by the delays the nodes measure between the leaders, not
/// by their regions alone: on `metro` (2 ms between regions, `ntp` clocks) with each shard's
/// leader in another region, the starting view is detective (by the regions); once the
/// server nodes have probed one another, the view manager installs a view that only turns the
/// mode preventive, and every node switches. On Tiga's setting the leaders apart measure
/// 50–100 ms from one another and the mode stays detective.
#[test]
fn tiga_auto_mode_follows_the_measured_delays_between_the_leaders() {
    for (network, switched) in [("metro", true), ("tiga-wan", false)] {
        let mut o = if network == "metro" {
            let mut o = replicated(23, "metro");
            o.topology = Topology::standard(regions(3), 3, 3).unwrap();
            o.txns = 600;
            o
        } else {
            tiga_wan(ProtocolKind::Tiga, 3, 600)
        };
        o.protocol = ProtocolKind::Tiga;
        o.protocol_options = tiga_options(&[("tiga-leaders", "spread"), ("tiga-detect-ms", "100")]);
        let report = run(&o, workload("micro-tiga", 3, 1_000)).unwrap();
        assert_passed(&report);
        assert!(report.live, "{network}: every request answered");
        let nodes = report.node_counters.len() as u64;
        let (proposed, changes, installed) = (
            total(&report, "tiga_manager_mode_proposed_total"),
            total(&report, "tiga_mode_changes_total"),
            total(&report, "tiga_views_installed_total"),
        );
        eprintln!(
            "{network}: {proposed} mode views proposed, {changes} switches on {nodes} nodes in {} ms",
            report.virtual_ns / NS_PER_MS
        );
        if switched {
            assert_eq!(proposed, 1, "{network}: one change of mode");
            assert_eq!(changes, nodes, "{network}: every node switched once");
            assert_eq!(installed, nodes, "{network}: that was the only view");
            assert_eq!(total(&report, "tiga_views_led_total"), 0, "{network}: no leader moved");
        } else {
            assert_eq!((proposed, changes, installed), (0, 0, 0), "{network}: the mode stays");
        }
        eprintln!(
            "{network}: p50 {} ms, p99 {} ms, {} speculative runs",
            report.latency_ns_p50 / NS_PER_MS,
            report.latency_ns_p99 / NS_PER_MS,
            total(&report, "tiga_speculated_total")
        );
    }
}

/// Detective rollback: on Tiga's wide-area setting with the leaders apart and four hot keys
/// per shard, leaders often run a transaction at their own timestamp and then learn that
/// another leader holds it later; what ran is revoked (its writes were aside) and it runs
/// again at the agreed timestamp. The history stays strictly serializable and the replicas
/// equal; faulty swarm seeds pass too.
#[test]
fn tiga_detective_leaders_revoke_what_moved_and_stay_strictly_serializable() {
    let detective = tiga_options(&[("tiga-leaders", "spread"), ("tiga-mode", "detective")]);
    let mut o = tiga_wan(ProtocolKind::Tiga, 3, 1_000);
    o.seed = 19;
    o.protocol_options = detective.clone();
    let report = run(&o, workload("list-append", 3, 4)).unwrap();
    assert_passed(&report);
    let revoked = total(&report, "tiga_revoked_total");
    let kept = total(&report, "tiga_speculations_kept_total");
    assert!(revoked >= 3 && kept > 100, "{revoked} revoked, {kept} kept");
    assert_eq!(total(&report, "tiga_speculations"), 0);
    for seed in 1..=6 {
        for replicas in [1, 3] {
            for (name, keys) in [("list-append", 16), ("bank", 4)] {
                let mut base = tiga(seed, 3, replicas, "metro");
                base.protocol_options = detective.clone();
                let (opts, _) = crate::swarm::seed_options(&base, seed, true);
                assert_passed(&run(&opts, workload(name, 3, keys)).unwrap());
            }
        }
    }
    // Swarm seed 5294 (8 clients, 200 transactions, reordered messages): a copy of a
    // leader's speculative reply, revoked since, reached the coordinator after the reply
    // for the agreed timestamp and its result was reported (a G2 cycle). A coordinator now
    // keeps the result of the leader's latest timestamp.
    let mut base = tiga(5294, 3, 3, "metro");
    base.protocol_options = detective;
    (base.clients, base.txns) = (8, 200);
    let (opts, _) = crate::swarm::seed_options(&base, 5294, true);
    assert_passed(&run(&opts, workload("list-append", 3, 16)).unwrap());
}

/// TPC-C in paper-compat mode (NewOrder only): the last piece writes rows keyed by the order
/// number piece 0 takes from the district row, which guards them. Tiga and luigi run it,
/// with replicas and remote order lines, and the TPC-C consistency conditions (every
/// district's numbers without gaps or repeats, order lines matching their orders, stock
/// bookkeeping) hold on every replica.
#[test]
fn tiga_and_luigi_run_tpcc_new_orders_keyed_by_their_district() {
    let tpcc = meridian_workloads::tpcc::TpccOptions {
        mode: meridian_workloads::tpcc::Mode::PaperCompat,
        scale: meridian_workloads::tpcc::load::SMALL,
        ..Default::default()
    };
    let options = WorkloadOptions { shards: 3, tpcc, ..WorkloadOptions::default() };
    let new_orders: Arc<dyn meridian_workloads::Workload> =
        Arc::from(meridian_workloads::build("tpcc", &options).unwrap());
    for protocol in [ProtocolKind::Tiga, ProtocolKind::Luigi] {
        let mut o = tiga(3, 3, 3, "metro");
        o.protocol = protocol;
        o.txns = 600;
        let report = run(&o, new_orders.clone()).unwrap();
        assert_passed(&report);
        assert!(report.committed >= o.txns, "{protocol:?}: {} committed", report.committed);
        assert_eq!((report.user_aborted, report.failed), (0, 0), "{protocol:?}");
        assert!(report.cross_shard > 0, "{protocol:?}: remote order lines");
        let checked: Vec<&str> = report.checks.iter().map(|c| c.name.as_str()).collect();
        for name in ["tpcc CC2", "tpcc CC3", "tpcc CC6", "replicas-equal"] {
            assert!(checked.iter().any(|c| c.starts_with(name)), "{protocol:?}: {checked:?}");
        }
    }
}

/// Tiga runs one-shot transactions whose keys the arguments give; anything else is refused
/// before the run starts, naming why.
#[test]
fn tiga_refuses_workloads_that_are_not_one_shot() {
    for (name, why) in [
        ("tpcc", "range scans"),
        ("crossstitch-order-status", "need the output of piece"),
        ("ycsb-e", "range scans"),
    ] {
        let error = run(&tiga(1, 2, 1, "metro"), workload(name, 2, 100)).unwrap_err();
        assert!(error.0.contains(&format!("tiga cannot run {name}")), "{error}");
        assert!(error.0.contains(why), "{name}: {error}");
    }
}

// ---------------------------------------------------------------------------------------------
// luigi: tiga through the leaders only, committed once replication watermarks cover it.

fn luigi(seed: u64, shards: u32, replicas: u32, network: &str) -> SimRunOptions {
    let mut o = tiga(seed, shards, replicas, network);
    o.protocol = ProtocolKind::Luigi;
    o
}

/// The node leading `shard` (tiga's and luigi's leaders are fixed for a run).
/// The leader of `shard`: replica 0 with `tiga-leaders=spread`, the view's choice otherwise.
fn tiga_leader_in(options: &SimRunOptions, shard: u32, spread: bool) -> NodeId {
    if spread {
        replica(options, shard, 0)
    } else {
        tiga_leader(options, shard)
    }
}

fn tiga_leader(options: &SimRunOptions, shard: u32) -> NodeId {
    let topology = &options.topology;
    let view = meridian_protocols::tiga::node::initial_view(topology).unwrap();
    let slot = view.leader_slot(meridian_core::ShardId(shard), topology.replicas);
    replica(options, shard, slot)
}

/// On Tiga's setting luigi has no fast path: the coordinator sends the leaders the
/// transaction (half a round trip), the leaders agree and execute and, with 3 replicas, the
/// leader's log reaches a follower in another region and its acknowledgement comes back (a
/// round trip) before the watermark goes back with the result (half): 2 wide-area round
/// trips at the median. Without replicas the median counts 1, as tiga's does on this
/// setting. Every commit is labelled slow.
#[test]
fn luigi_commits_in_two_wide_area_round_trips_without_a_fast_path() {
    for (replicas, hops) in [(1, 2), (3, 4)] {
        let o = tiga_wan(ProtocolKind::Luigi, replicas, 300);
        let report = run(&o, workload("micro-tiga", 3, 100_000)).unwrap();
        assert_passed(&report);
        let slow = report.paths.get(&meridian_core::txn::CommitPath::Slow).copied();
        assert_eq!(slow, Some(report.committed), "{replicas} replicas: {:?}", report.paths);
        assert_eq!(median_hops(&report), hops, "{replicas} replicas");
    }
}

/// Commit is gated on replication (the published Luigi code answers the client as soon as
/// the leaders executed): while the leader is cut off from both its followers, nothing
/// commits; once healed, the watermarks catch up and commits go on. The replicas end equal
/// and the history is strictly serializable. The same when the leader crashes and restarts
/// from its journal during the cut: the entries of its log above what it had told count as
/// unreplicated again, so no watermark covers them before its followers say so.
#[test]
fn luigi_commits_nothing_while_its_leader_cannot_replicate() {
    for restarted in [false, true] {
        commits_nothing_while_the_leader_cannot_replicate(restarted);
    }
}

fn commits_nothing_while_the_leader_cannot_replicate(restarted: bool) {
    // With the restart: 2 shards and `micro-luigi` (every transaction on both), so that the
    // coordinators on shard 1's nodes still reach shard 0's cut-off leader.
    let shards = if restarted { 2 } else { 1 };
    let mut o = luigi(11, shards, 3, "metro");
    o.txns = 1_500;
    let leader = tiga_leader(&o, 0);
    let cut = (500 * NS_PER_MS, 1_500 * NS_PER_MS);
    if restarted {
        // Down and back during the cut: its log holds entries it ran but never replicated,
        // and new transactions keep coming (an open loop), whose hold could raise a
        // watermark past those entries if the restarted leader took them for replicated.
        o.faults.push((cut.0 + 200 * NS_PER_MS, Fault::Crash(leader)));
        o.faults.push((cut.0 + 300 * NS_PER_MS, Fault::Restart(leader)));
        o.load = meridian_workloads::clients::Load::Open { rate_per_s: 1_000.0 };
    }
    for slot in 0..3 {
        let node = replica(&o, 0, slot);
        if node != leader {
            o.faults.push((cut.0, Fault::Block(leader, node)));
            o.faults.push((cut.0, Fault::Block(node, leader)));
        }
    }
    o.faults.push((cut.1, Fault::Heal));
    // (An open loop's history is not recorded across a coordinator's crash: `micro-luigi`'s
    // checks read the stores.)
    let name = if restarted { "micro-luigi" } else { "list-append" };
    let report = run(&o, workload(name, shards, 16)).unwrap();
    assert_passed(&report);
    let committed_at = |from: u64, to: u64| {
        report
            .completions
            .iter()
            .filter(|(c, _)| c.outcome.result == meridian_core::txn::TxnResult::Committed)
            .filter(|(c, _)| (from..to).contains(&(c.completed_at - crate::SIM_EPOCH_NS)))
            .count()
    };
    // Replicated before the cut and told a little later: a few milliseconds of grace.
    let during = committed_at(cut.0 + 50 * NS_PER_MS, cut.1);
    assert_eq!(during, 0, "restarted {restarted}: commits while the leader could not replicate");
    let (before, after) = (committed_at(0, cut.0), committed_at(cut.1, u64::MAX));
    assert!(before > 20 && after > 100, "{before} commits before the cut, {after} after");
}

/// A follower of shard 0 crashes for good and one of shard 1 is cut off for a second, then
/// healed: tiga goes on committing on its slow path (its fast quorum needs all three
/// replicas) and luigi on the remaining majority; the cut-off follower catches up (replicas
/// equal), and the history is strictly serializable.
#[test]
fn tiga_and_luigi_ride_out_a_crashed_and_a_partitioned_follower() {
    for protocol in [ProtocolKind::Tiga, ProtocolKind::Luigi] {
        let mut o = tiga(13, 2, 3, "metro");
        o.protocol = protocol;
        o.txns = 3_000;
        let followers = |o: &SimRunOptions, shard| {
            let leader = tiga_leader(o, shard);
            (0..3).map(|slot| replica(o, shard, slot)).filter(|&n| n != leader).collect::<Vec<_>>()
        };
        let (crashed, cut) = (followers(&o, 0)[0], followers(&o, 1)[1]);
        o.faults.push((300 * NS_PER_MS, Fault::Crash(crashed)));
        isolate(&mut o, cut, 500 * NS_PER_MS);
        o.faults.push((1_500 * NS_PER_MS, Fault::Heal));
        let report = run(&o, workload("list-append", 2, 16)).unwrap();
        assert_passed(&report);
        assert!(report.committed >= 3_000, "{protocol:?}: {} committed", report.committed);
        assert!(report.stats.blocked > 0, "{protocol:?}: the cut cost messages");
        if protocol == ProtocolKind::Tiga {
            let slow = report.paths.get(&meridian_core::txn::CommitPath::Slow).copied();
            assert!(slow.unwrap_or(0) > 1_000, "{:?}", report.paths);
        }
    }
}

/// Followers of every shard crash and restart under load, twice for shard 0's: each takes up
/// its journal (the image of its executed prefix its last checkpoint wrote, if any, and the
/// entries, tail, outcomes and bodies it journaled since), needs no state transfer, catches
/// up on the log and ends equal to its leader (`replicas-equal`); the history is strictly
/// serializable.
#[test]
fn tiga_and_luigi_followers_restart_from_their_journals() {
    for protocol in [ProtocolKind::Tiga, ProtocolKind::Luigi] {
        let mut o = tiga(29, 3, 3, "metro");
        o.protocol = protocol;
        o.txns = 2_000;
        let follower = |o: &SimRunOptions, shard| {
            let leader = tiga_leader(o, shard);
            (0..3).map(|slot| replica(o, shard, slot)).find(|&n| n != leader).unwrap()
        };
        let first = follower(&o, 0);
        o.faults.push((200 * NS_PER_MS, Fault::Crash(first)));
        o.faults.push((260 * NS_PER_MS, Fault::Restart(first)));
        o.faults.push((700 * NS_PER_MS, Fault::Crash(first)));
        o.faults.push((720 * NS_PER_MS, Fault::Restart(first)));
        for shard in [1, 2] {
            let node = follower(&o, shard);
            o.faults.push((400 * NS_PER_MS, Fault::Crash(node)));
            o.faults.push((500 * NS_PER_MS, Fault::Restart(node)));
        }
        let report = run(&o, workload("list-append", 3, 16)).unwrap();
        assert_passed(&report);
        assert!(report.committed >= 2_000, "{protocol:?}: {} committed", report.committed);
        let prefix = if protocol == ProtocolKind::Tiga { "tiga" } else { "luigi" };
        let counter =
            |node: NodeId, name: &str| counter(&report, node, &format!("{prefix}_{name}"));
        assert_eq!(counter(first, "followers_resumed_total"), 1, "{protocol:?}: the second start");
        for shard in [1, 2] {
            let node = follower(&o, shard);
            assert_eq!(counter(node, "followers_resumed_total"), 1, "{protocol:?}: shard {shard}");
        }
        for shard in 0..3 {
            let node = follower(&o, shard);
            assert_eq!(counter(node, "rejoined_total"), 0, "{protocol:?}: shard {shard}");
        }
        let equal = report.checks.iter().find(|c| c.name == "replicas-equal").unwrap();
        assert!(equal.passed && equal.detail.starts_with('6'), "{}", equal.detail);
    }
}

/// A follower of shard 0 is cut off for most of a run: its leader keeps the transaction
/// bodies of at most `follower_lag_max` finished entries past it (not the whole run's, which
/// would fill the leader's bodies and stall the shard on a follower down for good), and when
/// the follower is back and acknowledges a log that far behind, the leader sends it to a
/// state transfer; it drops its log, rejoins and ends equal to its leader. Run again with the
/// default limit, the leader keeps every body the follower has not executed. On `smallbank`
/// (pieces take other shards' outputs) the same: the leader sends no log to a follower that
/// far behind, whose outcomes would lack the inputs it dropped with the bodies.
#[test]
fn tiga_and_luigi_leaders_keep_no_more_for_a_lagging_follower_than_its_limit() {
    for protocol in [ProtocolKind::Tiga, ProtocolKind::Luigi] {
        let prefix = if protocol == ProtocolKind::Tiga { "tiga" } else { "luigi" };
        let mut high_water = Vec::new();
        let cases = [
            ("list-append", 16),
            ("list-append", meridian_protocols::FOLLOWER_LAG_MAX),
            ("smallbank", 16),
        ];
        for (name, lag_max) in cases {
            let mut o = tiga(31, 2, 3, "metro");
            o.protocol = protocol;
            o.txns = 2_000;
            o.limits.follower_lag_max = lag_max;
            let leader = tiga_leader(&o, 0);
            let cut = (0..3).map(|slot| replica(&o, 0, slot)).find(|&n| n != leader).unwrap();
            isolate(&mut o, cut, 200 * NS_PER_MS);
            o.faults.push((1_200 * NS_PER_MS, Fault::Heal));
            let report = run(&o, workload(name, 2, 16)).unwrap();
            assert_passed(&report);
            // (SmallBank's user aborts are not commits.)
            assert!(report.committed >= 1_400, "{protocol:?}: {} committed", report.committed);
            let counter = |node: NodeId, name: &str| {
                let name = format!("{prefix}_{name}");
                report.node_counters[&node].iter().find(|(n, _)| *n == name).map_or(0, |&(_, v)| v)
            };
            let equal = report.checks.iter().find(|c| c.name == "replicas-equal").unwrap();
            assert!(equal.passed, "{protocol:?}: {}", equal.detail);
            let behind =
                (counter(leader, "followers_behind_total"), counter(cut, "went_behind_total"));
            if lag_max == 16 {
                assert!(behind.0 >= 1 && behind.1 >= 1, "{protocol:?}: {behind:?}");
                assert!(counter(cut, "rejoined_total") >= 1, "{protocol:?}: rejoined");
            } else {
                assert_eq!(behind, (0, 0), "{protocol:?}: the follower caught up on the log");
            }
            high_water.push(counter(leader, "bodies_high_water"));
        }
        // With the limit the leader kept its in-flight transactions and 16 entries; without
        // it, everything committed while the follower was away.
        assert!(high_water[0] * 4 < high_water[1], "{protocol:?}: {high_water:?}");
        assert!(high_water[2] * 4 < high_water[1], "{protocol:?}: {high_water:?}");
    }
}

/// Tiga leaders crash and restart under load: each finds its log, the votes it heard, its
/// open proposals and its closed-timestamp promise in its journal, runs the log again and
/// leads on in the same view (its shard waits meanwhile). Nothing a leader said survives
/// only in its memory: every send waits for the journal records before it. With leaders
/// together (preventive) and apart (detective, a leader may have answered with a run that
/// must stand), on `bank` (votes between shards) and `list-append`, and with one replica per
/// shard, where the leader is all there is: no acknowledged commit is lost (the checkers),
/// and the replicas end equal. Luigi's leaders the same (their journal also holds the
/// watermarks they told). Each case runs twice: once with the journal whole, once with a
/// checkpoint every 16 finished entries, where a restarted leader starts from its last
/// checkpoint and its journal holds a fraction of the records.
#[test]
fn tiga_leaders_restart_from_their_journal_and_lose_nothing() {
    use ProtocolKind::{Luigi, Tiga};
    let cases = [
        (Tiga, 3, false, "bank"),
        (Tiga, 3, true, "bank"),
        (Tiga, 3, false, "list-append"),
        (Tiga, 3, false, "smallbank"),
        (Tiga, 1, false, "bank"),
        (Luigi, 3, false, "bank"),
        (Luigi, 3, false, "list-append"),
        (Luigi, 1, false, "list-append"),
    ];
    for (protocol, replicas, spread, name) in cases {
        let mut live_whole = 0;
        for checkpoints in [false, true] {
            let mut o = tiga(31, 3, replicas, "metro");
            o.protocol = protocol;
            o.txns = 1_500;
            o.snapshot_interval_entries = Some(if checkpoints { 16 } else { u64::MAX });
            if spread {
                o.protocol_options = tiga_options(&[("tiga-leaders", "spread")]);
            }
            let leader = |o: &SimRunOptions, shard| tiga_leader_in(o, shard, spread);
            let (first, second) = (leader(&o, 0), leader(&o, 1));
            o.faults.push((200 * NS_PER_MS, Fault::Crash(first)));
            o.faults.push((320 * NS_PER_MS, Fault::Restart(first)));
            o.faults.push((500 * NS_PER_MS, Fault::Crash(second)));
            o.faults.push((505 * NS_PER_MS, Fault::Restart(second)));
            o.faults.push((900 * NS_PER_MS, Fault::Crash(first)));
            o.faults.push((1_000 * NS_PER_MS, Fault::Restart(first)));
            let report = run(&o, workload(name, 3, 8)).unwrap();
            let case = format!(
            "{protocol:?}, {replicas} replicas, spread {spread}, {name}, checkpoints {checkpoints}"
        );
            assert_passed(&report);
            assert!(report.committed >= 1_000, "{case}: {} committed", report.committed);
            let prefix = if protocol == Tiga { "tiga" } else { "luigi" };
            let counter = |node: NodeId, name: &str| {
                let name = format!("{prefix}_{name}");
                report.node_counters[&node].iter().find(|(n, _)| *n == name).map_or(0, |&(_, v)| v)
            };
            for node in [first, second] {
                let restored = counter(node, "replayed_total")
                    + counter(node, "resumed_from_checkpoint_total");
                assert!(restored > 0, "{case}: {node:?} took up nothing");
            }
            let dropped = format!("{prefix}_journal_sends_dropped_total");
            assert_eq!(total(&report, &dropped), 0, "{case}");
            let live = total(&report, &format!("{prefix}_journal_live_records"));
            if checkpoints {
                assert!(counter(first, "resumed_from_checkpoint_total") > 0, "{case}");
                assert!(total(&report, &format!("{prefix}_checkpoints_total")) > 10, "{case}");
                assert!(live * 4 < live_whole, "{case}: {live} records live, {live_whole} without");
            } else {
                live_whole = live;
            }
        }
    }
}

/// Leaders that checkpoint after every one to seven finished entries crash and restart at
/// seeded times, while messages are lost, duplicated and reordered: each restart starts from
/// a checkpoint cut mid-flight (entries queued, waiting for votes, kept replies, open
/// proposals), and the histories and replicas still check out. `MERIDIAN_CHECKPOINT_SEEDS`
/// sets the seeds per case (3 by default; the swarm's own plans reach a leader restart from
/// a checkpoint in about one seed in a hundred).
#[test]
fn tiga_and_luigi_leaders_restart_from_checkpoints_cut_mid_flight() {
    use ProtocolKind::{Luigi, Tiga};
    let seeds: u64 =
        std::env::var("MERIDIAN_CHECKPOINT_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let cases = [
        (Tiga, 3, false, "bank"),
        (Tiga, 3, true, "smallbank"),
        (Tiga, 1, false, "list-append"),
        (Luigi, 3, false, "smallbank"),
        (Luigi, 1, false, "bank"),
    ];
    for seed in 0..seeds {
        for (protocol, replicas, spread, name) in cases {
            let mut o = tiga(1_000 + seed, 3, replicas, "metro");
            o.protocol = protocol;
            o.txns = 400;
            o.snapshot_interval_entries = Some(1 + seed % 7);
            o.chaos = crate::Chaos {
                loss: 0.01,
                duplicate: 0.01,
                reorder: 0.1,
                until_ns: 800 * NS_PER_MS,
            };
            if spread {
                o.protocol_options = tiga_options(&[("tiga-leaders", "spread")]);
            }
            let leader = |o: &SimRunOptions, shard| tiga_leader_in(o, shard, spread);
            let mut rng = meridian_core::rng::child_rng(seed, "checkpoint-restarts", 0);
            for round in 0..4u64 {
                let node = leader(&o, (round % 3) as u32);
                let at = (100 + round * 200 + meridian_core::rng::uniform_u64(&mut rng, 150))
                    * NS_PER_MS;
                let down = (1 + meridian_core::rng::uniform_u64(&mut rng, 60)) * NS_PER_MS;
                o.faults.push((at, Fault::Crash(node)));
                o.faults.push((at + down, Fault::Restart(node)));
            }
            o.faults.sort_by_key(|(at, _)| *at);
            let report = run(&o, workload(name, 3, 8)).unwrap();
            let case = format!("seed {seed}, {protocol:?}, {replicas} replicas, {name}");
            assert_passed(&report);
            assert!(report.committed >= 200, "{case}: {} committed", report.committed);
            let prefix = if protocol == Tiga { "tiga" } else { "luigi" };
            let resumed = total(&report, &format!("{prefix}_resumed_from_checkpoint_total"));
            assert!(resumed > 0, "{case}: no restart from a checkpoint");
        }
    }
}

/// Cuts `node` off from every other node from `at` on (until a heal).
fn isolate(o: &mut SimRunOptions, node: NodeId, at: meridian_core::Time) {
    for other in (0..o.topology.nodes.len() as u32).map(NodeId).filter(|&n| n != node) {
        o.faults.push((at, Fault::Block(node, other)));
        o.faults.push((at, Fault::Block(other, node)));
    }
}

/// A follower cut off until well after the clients finished (as a swarm seed's long
/// isolation can be on `tiga-wan`, whose fault window scales with its delays): the run's
/// drain starts at the last planned fault, so the follower is healed and catches up before
/// `replicas-equal` compares it (the check failed while the drain began when the clients
/// finished).
#[test]
fn the_drain_waits_for_the_last_heal_before_replicas_are_compared() {
    let mut o = tiga(23, 1, 3, "metro");
    o.txns = 200;
    let leader = tiga_leader(&o, 0);
    let follower = (0..3).map(|slot| replica(&o, 0, slot)).find(|&n| n != leader).unwrap();
    isolate(&mut o, follower, 100 * NS_PER_MS);
    o.faults.push((30 * NS_PER_S, Fault::Heal));
    let report = run(&o, workload("list-append", 1, 16)).unwrap();
    assert_passed(&report);
    let finished = report.completions.iter().map(|(c, _)| c.completed_at).max().unwrap();
    assert!(finished - crate::SIM_EPOCH_NS < 30 * NS_PER_S, "the clients finished before");
}

/// Clocks `bad` (60 ms offsets, 50 ppm drift): timestamps land out of real-time order, so
/// the histories are checked for serializability only (tiga's and luigi's guarantee without
/// synchronized clocks), and they pass, with and without replicas.
#[test]
fn tiga_and_luigi_stay_serializable_under_bad_clocks() {
    for protocol in [ProtocolKind::Tiga, ProtocolKind::Luigi] {
        for replicas in [1, 3] {
            let mut o = tiga(17, 3, replicas, "metro");
            o.protocol = protocol;
            o.clock = ClockModel::preset("bad").unwrap();
            o.txns = 1_000;
            let report = run(&o, workload("list-append", 3, 16)).unwrap();
            assert_passed(&report);
            assert!(report.committed >= 1_000, "{protocol:?} {replicas}: {}", report.committed);
        }
    }
}

/// The faulty swarm's first seeds, with and without replicas: lost, duplicated and
/// reordered messages, crashed and isolated coordinators, clocks stepped back.
#[test]
fn luigi_passes_faulty_swarm_seeds() {
    let workloads = [("list-append", 16), ("bank", 4), ("smallbank", 8)];
    passes_faulty_swarm_seeds(ProtocolKind::Luigi, &workloads);
}

/// Luigi runs what tiga runs and refuses the rest before the run starts, naming why.
#[test]
fn luigi_refuses_workloads_that_are_not_one_shot() {
    for (name, why) in
        [("crossstitch-stock-level", "need the output of piece"), ("ycsb-e", "range scans")]
    {
        let error = run(&luigi(1, 2, 1, "metro"), workload(name, 2, 100)).unwrap_err();
        assert!(error.0.contains(&format!("luigi cannot run {name}")), "{error}");
        assert!(error.0.contains(why), "{name}: {error}");
    }
}

fn chain_options(seed: u64, shards: u32, txns: u64) -> SimRunOptions {
    let mut opts = options(seed, "metro", shards, txns);
    opts.protocol = ProtocolKind::Chain;
    opts.clock = ClockModel::preset("perfect").unwrap();
    opts
}

fn open_chain_attempts(report: &SimRunReport) -> u64 {
    report.node_counters.keys().map(|&n| counter(report, n, "chain_open_attempts")).sum()
}

fn chain_total(report: &SimRunReport, name: &str) -> u64 {
    report.node_counters.keys().map(|&n| counter(report, n, name)).sum()
}

/// Hot keys on three shards: attempts read each other's pending versions, some of those
/// writers abort and take their readers with them, and every history stays strictly
/// serializable with nothing left undecided at the end.
#[test]
fn chain_cascades_aborts_to_readers_of_aborted_writes_and_stays_serializable() {
    let opts = chain_options(3, 3, 600);
    let report = run(&opts, micro_keys(3, 10, Some(0.99))).unwrap();
    assert_passed(&report);
    assert!(report.live);
    assert!(report.committed >= 600, "{} committed", report.committed);
    assert!(chain_total(&report, "chain_cascading_aborts_total") > 0, "no cascading abort");
    assert_eq!(open_chain_attempts(&report), 0, "every attempt decided everywhere");
    assert_eq!(report.paths.get(&meridian_core::txn::CommitPath::Chain), Some(&report.committed));
}

/// A coordinator crashes right as it ships an attempt's precommit to the first hop: the hops
/// that ran it time out waiting for that vote, abort it and release what it wrote; the other
/// coordinators' attempts go on.
#[test]
fn chain_a_coordinator_crashing_before_its_precommit_leaves_nothing_pending() {
    let mut opts = chain_options(5, 2, 300);
    let coordinator = opts.topology.coordinators()[0];
    opts.crash_triggers = vec![crash_on(coordinator, crate::TriggerPoint::Send, "Precommit {")];
    let report = run(&opts, micro_keys(2, 1_000, None)).unwrap();
    assert_eq!(report.stats.triggered, 1);
    assert_passed(&report);
    assert!(report.live);
    assert!(
        chain_total(&report, "chain_timeouts_total") > 0,
        "a hop timed out: {:?}",
        report.node_counters
    );
    assert_eq!(open_chain_attempts(&report), 0, "the orphaned attempt was aborted");
}

/// Lost and duplicated messages: acknowledgements, precommits and decisions go missing, hops
/// time out and abort, deciders resend their decisions until applied; nothing breaks.
#[test]
fn chain_survives_lossy_links_and_settles_every_decision() {
    let mut opts = chain_options(7, 3, 400);
    let lossy = LinkModel {
        delay_ns: 2 * NS_PER_MS,
        jitter: Jitter::Uniform { half_width_ns: NS_PER_MS },
        loss: 0.05,
    };
    opts.network = NetworkModel::uniform("lossy", regions(3), lossy, lossy);
    let report = run(&opts, micro_keys(3, 20, Some(0.5))).unwrap();
    assert_passed(&report);
    assert!(report.live);
    assert!(report.stats.lost > 0);
    assert!(chain_total(&report, "chain_decisions_resent_total") > 0, "a decision was resent");
    assert_eq!(open_chain_attempts(&report), 0);
}

/// `chain` refuses an even replica count, saying why (its logs are Raft groups).
#[test]
fn chain_refuses_even_replica_counts() {
    let even = Topology::standard(regions(3), 2, 2).unwrap();
    let error = ProtocolKind::Chain.check_topology(&even).unwrap_err().0;
    assert!(error.contains("odd replica count"), "{error}");
    let odd = Topology::standard(regions(3), 2, 3).unwrap();
    assert!(ProtocolKind::Chain.check_topology(&odd).is_ok());
}

/// Scans under `chain`: `scan-count` on few keys (an update scans its group's rows, inserts or
/// deletes one, and writes the count it implies; an audit reads both), on one replica per shard
/// and on three (overlapped replication, a shard leader crashing). Letting a scan run past
/// another attempt's pending version breaks both checks (seed 41); the range stamp is pinned
/// by the server's unit test, since this workload's count rows order its writers anyway.
#[test]
fn chain_runs_scans_and_they_see_exactly_the_rows_below_their_timestamp() {
    let scans = |shards| {
        let options = WorkloadOptions { shards, keys_per_shard: 8, ..WorkloadOptions::default() };
        Arc::from(meridian_workloads::build("scan-count", &options).unwrap())
    };
    for seed in [41, 43, 44] {
        let report = run(&chain_options(seed, 2, 400), scans(2)).unwrap();
        assert_passed(&report);
        assert!(report.live);
        assert!(report.committed >= 400, "{} committed", report.committed);
    }
    let mut opts = chain_replicated(42);
    let leader = replica(&opts, 1, 0);
    opts.faults.push((500 * NS_PER_MS, Fault::Crash(leader)));
    opts.faults.push((3 * NS_PER_S, Fault::Restart(leader)));
    let report = run(&opts, scans(3)).unwrap();
    assert_chain_settled(&report);
}

// `chain` on 3 shards × 3 replicas: the failure cases of CrossStitch's liveness argument
// (§4.1). Each run must stay live and strictly serializable, end with nothing undecided and
// nothing undelivered anywhere, and with every replica of a shard equal.

fn chain_replicated(seed: u64) -> SimRunOptions {
    let mut opts = chain_options(seed, 3, 300);
    opts.topology = Topology::standard(regions(3), 3, 3).unwrap();
    opts
}

fn assert_chain_settled(report: &SimRunReport) {
    assert_replicated_run_passed(report);
    assert_eq!(open_chain_attempts(report), 0, "every attempt decided on every replica");
    assert_eq!(chain_total(report, "chain_undelivered_decisions"), 0, "every decision delivered");
}

/// An intermediate server fails after running its hop and before its vote: the hop's
/// shard fails over, the new leader waits afresh for the hop's messages, times out and
/// aborts (the hop had not precommitted, so it may); nothing it wrote stays.
#[test]
fn chain_an_intermediate_server_failing_before_its_precommit_aborts_cleanly() {
    let mut opts = chain_replicated(31);
    let leader = replica(&opts, 1, 0);
    opts.crash_triggers = vec![crash_on(leader, crate::TriggerPoint::Send, "Ack {")];
    let report = run(&opts, micro_keys(3, 1_000, None)).unwrap();
    assert_eq!(report.stats.triggered, 1);
    assert_chain_settled(&report);
}

/// An intermediate server fails right as it sends its precommit (the vote is in its log):
/// the next hop times out waiting for it and aborts, or the new leader's state carries the
/// vote; either way every replica agrees and nothing is left pending.
#[test]
fn chain_an_intermediate_server_failing_after_its_precommit_loses_no_vote() {
    let mut opts = chain_replicated(32);
    let leader = replica(&opts, 1, 0);
    opts.crash_triggers = vec![crash_on(leader, crate::TriggerPoint::Send, "Precommit {")];
    let report = run(&opts, micro_keys(3, 1_000, None)).unwrap();
    assert_eq!(report.stats.triggered, 1);
    assert_chain_settled(&report);
}

/// The end server (the final coordinator) fails as it delivers a decision: the decision is
/// in its shard's log (the transaction replicas' role), so the new leader delivers it.
#[test]
fn chain_the_end_server_failing_while_delivering_its_decision_loses_nothing() {
    let mut opts = chain_replicated(33);
    let leader = replica(&opts, 2, 0);
    opts.crash_triggers = vec![crash_on(leader, crate::TriggerPoint::Send, "Decision {")];
    let report = run(&opts, micro_keys(3, 1_000, None)).unwrap();
    assert_eq!(report.stats.triggered, 1);
    assert_chain_settled(&report);
}

/// A whole shard goes down (its leader as it ships an attempt on, after acknowledging it, and
/// one follower): the hop before it voted and waits, and the hop after it never got the
/// attempt, so nobody after the vote has a timer running. The voted hop asks the hop two after
/// it (the paper's query to hop `i + 2`), which aborts the attempt on its behalf, releasing
/// what it holds long before the shard comes back.
#[test]
fn chain_a_hop_whose_next_shard_is_down_asks_the_hop_after_and_is_released() {
    let mut opts = chain_replicated(35);
    let leader = replica(&opts, 1, 0);
    let follower = replica(&opts, 1, 1);
    let mut trigger = crash_on(leader, crate::TriggerPoint::Send, "Txn(");
    trigger.restart_after_ns = 6 * NS_PER_S;
    opts.crash_triggers = vec![trigger];
    opts.faults.push((200 * NS_PER_MS, Fault::Crash(follower)));
    opts.faults.push((7 * NS_PER_S, Fault::Restart(follower)));
    let report = run(&opts, micro_keys(3, 1_000, None)).unwrap();
    assert_eq!(report.stats.triggered, 1);
    assert!(chain_total(&report, "chain_inquiries_total") > 0, "{:?}", report.node_counters);
    assert!(chain_total(&report, "chain_inquiry_aborts_total") > 0, "{:?}", report.node_counters);
    assert_chain_settled(&report);
}

/// A transaction replica (a follower of a shard's log) fails: its shard commits on the
/// other two and the replica catches up when it restarts.
#[test]
fn chain_a_transaction_replica_failing_changes_nothing() {
    let mut opts = chain_replicated(34);
    let follower = replica(&opts, 2, 1);
    opts.crash_triggers = vec![crash_on(follower, crate::TriggerPoint::Receive, "Raft {")];
    let report = run(&opts, micro_keys(3, 1_000, None)).unwrap();
    assert_eq!(report.stats.triggered, 1);
    assert_chain_settled(&report);
}

/// Overlapped replication (the default): shard 0's leader is cut off from its followers for
/// 300 ms and then crashes, so every hop it ran and every vote it made in that time (shipped
/// on, acknowledged and precommitted ahead of its log) is lost. The last hops of those
/// attempts never hear that the votes are in shard 0's log, so none commits while shard 0's
/// new leader aborts (seed 8 committed half a transfer when the last hop did not wait); and
/// attempts whose last hop was shard 0 itself, now unknown there, are ended by the inquiry
/// of the hop before it (seed 1 left a request waiting forever when only the hop two after
/// was asked).
#[test]
fn chain_a_leader_cut_off_from_its_followers_loses_its_runs_ahead_of_the_log_and_nothing_commits_half(
) {
    for seed in [1, 8] {
        let mut opts = chain_replicated(seed);
        let leader = replica(&opts, 0, 0);
        let (a, b) = (replica(&opts, 0, 1), replica(&opts, 0, 2));
        opts.faults.push((NS_PER_S, Fault::Block(leader, a)));
        opts.faults.push((NS_PER_S, Fault::Block(leader, b)));
        opts.faults.push((NS_PER_S + 300 * NS_PER_MS, Fault::Crash(leader)));
        opts.faults.push((NS_PER_S + 300 * NS_PER_MS, Fault::Heal));
        opts.faults.push((3 * NS_PER_S, Fault::Restart(leader)));
        let report = run(&opts, bank(3, 8)).unwrap();
        assert_chain_settled(&report);
        assert!(chain_total(&report, "chain_durable_notices_total") > 0, "seed {seed}");
    }
}
