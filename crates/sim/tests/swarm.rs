//! The bounded swarm the test suite runs (docs/design.md, "Correctness"): faulty seeds of every
//! protocol on the checking workloads, each checked for strict serializability, liveness after
//! healing and the workload's invariants. The long swarm is `meridian sim --seeds A..B --faults`;
//! set `MERIDIAN_SWARM_SEEDS` to run more seeds here.

use meridian_core::clock::ClockModel;
use meridian_core::netmodel::NetworkModel;
use meridian_core::topology::Topology;
use meridian_protocols::ProtocolKind;
use meridian_sim::runner::{run, SimRunOptions};
use meridian_sim::swarm::seed_options;
use meridian_workloads::WorkloadOptions;
use std::sync::Arc;

/// Seeds per protocol and workload by default: 25 swarms of 120 seeds take about five minutes
/// of the CI's budget on two cores; the long swarms run outside it (docs/correctness.md).
const SEEDS_DEFAULT: u64 = 120;

fn swarm(protocol: ProtocolKind, workload: &str, first_seed: u64) {
    swarm_with(protocol, workload, first_seed, WorkloadOptions::default(), "", 1)
}

/// A `2pl` swarm under `policy` with `replicas` per shard.
fn twopl_swarm(policy: &str, workload: &str, first_seed: u64, replicas: u32) {
    let option = format!("2pl-policy={policy}");
    let flags = format!(" --protocol-option {option}");
    swarm_full(
        ProtocolKind::TwoPl,
        &[option],
        workload,
        first_seed,
        WorkloadOptions::default(),
        &flags,
        replicas,
    )
}

/// A swarm of `workload` built with `options` (shards and keys per shard set here); `flags`
/// are the extra `meridian sim` flags that rebuild those options in the REPRODUCE line.
fn swarm_with(
    protocol: ProtocolKind,
    workload: &str,
    first_seed: u64,
    options: WorkloadOptions,
    flags: &str,
    replicas: u32,
) {
    swarm_full(protocol, &[], workload, first_seed, options, flags, replicas)
}

/// [`swarm_with`] with protocol options (`name=value`).
fn swarm_full(
    protocol: ProtocolKind,
    protocol_options: &[String],
    workload: &str,
    first_seed: u64,
    options: WorkloadOptions,
    flags: &str,
    replicas: u32,
) {
    let seeds = std::env::var("MERIDIAN_SWARM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEEDS_DEFAULT);
    let regions: Vec<String> = (0..3).map(|i| format!("r{i}")).collect();
    let shards = 3;
    let mut base = SimRunOptions::new(
        protocol,
        Topology::standard(regions, shards, replicas).expect("valid topology"),
        NetworkModel::preset("metro", 3).expect("preset"),
        ClockModel::preset("perfect").expect("preset"),
        0,
    );
    base.clients = 8;
    base.txns = 100;
    let pairs: Vec<(String, String)> = protocol_options
        .iter()
        .map(|text| meridian_protocols::options::parse_pair(text).expect("name=value"))
        .collect();
    base.protocol_options = protocol.options(&pairs).expect("valid protocol options");
    let workload: Arc<dyn meridian_workloads::Workload> = Arc::from(
        meridian_workloads::build(
            workload,
            &WorkloadOptions { shards, keys_per_shard: 4, ..options },
        )
        .expect("workload"),
    );
    let mut failures = Vec::new();
    for seed in first_seed..first_seed + seeds {
        let (options, plan) = seed_options(&base, seed, true);
        let report = run(&options, workload.clone()).expect("valid options");
        if !report.passed() {
            failures.push(format!(
                "seed {seed} ({}): {:?}\nREPRODUCE: meridian sim --protocol {} --workload {} \
                 --shards 3 --replicas {replicas} --clients 8 --txns 100 --network metro \
                 --keys-per-shard 4{flags} --faults --seed {seed}",
                plan.unwrap_or_default(),
                report.checks.iter().filter(|c| !c.passed).collect::<Vec<_>>(),
                protocol.name(),
                workload.name(),
            ));
        }
    }
    assert!(failures.is_empty(), "{} seeds failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn occ_list_append_swarm() {
    swarm(ProtocolKind::Occ, "list-append", 10_000);
}

#[test]
fn occ_rw_register_swarm() {
    swarm(ProtocolKind::Occ, "rw-register", 20_000);
}

#[test]
fn occ_bank_swarm() {
    swarm(ProtocolKind::Occ, "bank", 30_000);
}

#[test]
fn occ_smallbank_swarm() {
    swarm(ProtocolKind::Occ, "smallbank", 50_000);
}

#[test]
fn occ_ycsb_d_swarm() {
    swarm(ProtocolKind::Occ, "ycsb-d", 60_000);
}

#[test]
fn occ_ycsb_e_swarm() {
    swarm(ProtocolKind::Occ, "ycsb-e", 70_000);
}

#[test]
fn occ_micro_tiga_swarm() {
    swarm(ProtocolKind::Occ, "micro-tiga", 40_000);
}

#[test]
fn occ_tpcc_swarm() {
    let small = meridian_workloads::tpcc::TpccOptions {
        scale: meridian_workloads::tpcc::load::SMALL,
        ..Default::default()
    };
    let options = WorkloadOptions { tpcc: small, ..WorkloadOptions::default() };
    swarm_with(ProtocolKind::Occ, "tpcc", 80_000, options, " --tpcc-scale small", 1);
}

/// occ over Raft, 3 shards × 3 replicas: any node may crash (losing unsynced log writes) and
/// restart from its log.
#[test]
fn occ_replicated_bank_swarm() {
    swarm_with(ProtocolKind::Occ, "bank", 90_000, WorkloadOptions::default(), "", 3);
}

#[test]
fn occ_replicated_list_append_swarm() {
    swarm_with(ProtocolKind::Occ, "list-append", 100_000, WorkloadOptions::default(), "", 3);
}

/// Cross-shard scans while others insert into the scanned ranges (the phantom check).
#[test]
fn occ_scan_count_swarm() {
    swarm(ProtocolKind::Occ, "scan-count", 110_000);
}

/// Replicated shards with a phantom check.
#[test]
fn occ_replicated_scan_count_swarm() {
    swarm_with(ProtocolKind::Occ, "scan-count", 120_000, WorkloadOptions::default(), "", 3);
}

/// `2pl` under both policies: cross-shard transactions over few keys (locks conflict often),
/// phantoms, and replicated shards whose leaders crash (execution locks are lost with them).
#[test]
fn twopl_no_wait_swarm() {
    twopl_swarm("no-wait", "list-append", 130_000, 1);
    twopl_swarm("no-wait", "bank", 140_000, 1);
}

#[test]
fn twopl_wound_wait_swarm() {
    twopl_swarm("wound-wait", "list-append", 150_000, 1);
    twopl_swarm("wound-wait", "scan-count", 160_000, 1);
}

#[test]
fn twopl_replicated_swarm() {
    twopl_swarm("wound-wait", "bank", 170_000, 3);
    twopl_swarm("no-wait", "list-append", 180_000, 3);
}

/// `2pc-mvto`: cross-shard read-modify-writes over few keys (cascading aborts, timestamp
/// refusals), phantoms, and replicated shards whose leaders crash (held prepares and read
/// hints are lost with them). Seeds whose plan skews or steps back clocks are checked for
/// serializability, the rest for strict serializability (`Guarantee::StrictWithSyncedClocks`).
#[test]
fn mvto_swarm() {
    swarm(ProtocolKind::Mvto, "list-append", 190_000);
    swarm(ProtocolKind::Mvto, "bank", 200_000);
}

#[test]
fn mvto_replicated_swarm() {
    swarm_with(ProtocolKind::Mvto, "list-append", 210_000, WorkloadOptions::default(), "", 3);
    swarm_with(ProtocolKind::Mvto, "scan-count", 220_000, WorkloadOptions::default(), "", 3);
}

/// `mako`: replicated shards whose leaders crash or are cut off (epochs close, speculative
/// commits above the stable point are discarded and retried; only durable acknowledgements
/// reach the history), and unreplicated shards (no speculation, no epochs).
#[test]
fn mako_replicated_swarm() {
    swarm_with(ProtocolKind::Mako, "list-append", 230_000, WorkloadOptions::default(), "", 3);
    swarm_with(ProtocolKind::Mako, "bank", 240_000, WorkloadOptions::default(), "", 3);
}

#[test]
fn mako_swarm() {
    swarm(ProtocolKind::Mako, "list-append", 250_000);
}

#[test]
fn tiga_swarm() {
    for (workload, first_seed) in
        [("list-append", 260_000), ("bank", 270_000), ("rw-register", 280_000)]
    {
        swarm(ProtocolKind::Tiga, workload, first_seed);
    }
}

/// 3 shards × 3 replicas: coordinators and followers crash and restart (a follower comes back
/// empty and rejoins by a state transfer from its leader); leaders are fixed for a run.
#[test]
fn tiga_replicated_swarm() {
    for (workload, first_seed) in [
        ("list-append", 290_000),
        ("bank", 300_000),
        ("micro-tiga", 310_000),
        ("smallbank", 320_000),
    ] {
        swarm_with(ProtocolKind::Tiga, workload, first_seed, WorkloadOptions::default(), "", 3);
    }
    swarm_with(ProtocolKind::Tiga, "tpcc", 470_000, paper_compat(), PAPER_COMPAT_FLAGS, 3);
}

/// TPC-C's NewOrder only (its order rows keyed by the number the district row hands out,
/// guarded by that row), at the small scale.
fn paper_compat() -> WorkloadOptions {
    let tpcc = meridian_workloads::tpcc::TpccOptions {
        mode: meridian_workloads::tpcc::Mode::PaperCompat,
        scale: meridian_workloads::tpcc::load::SMALL,
        ..Default::default()
    };
    WorkloadOptions { tpcc, ..WorkloadOptions::default() }
}

/// The `meridian sim` flags of [`paper_compat`].
const PAPER_COMPAT_FLAGS: &str = " --tpcc-mode paper-compat --tpcc-scale small";

#[test]
fn luigi_swarm() {
    for (workload, first_seed) in [("list-append", 410_000), ("bank", 420_000)] {
        swarm(ProtocolKind::Luigi, workload, first_seed);
    }
}

/// As [`tiga_replicated_swarm`], for luigi.
#[test]
fn luigi_replicated_swarm() {
    for (workload, first_seed) in
        [("list-append", 430_000), ("bank", 440_000), ("smallbank", 450_000)]
    {
        swarm_with(ProtocolKind::Luigi, workload, first_seed, WorkloadOptions::default(), "", 3);
    }
    swarm_with(ProtocolKind::Luigi, "tpcc", 480_000, paper_compat(), PAPER_COMPAT_FLAGS, 3);
}

#[test]
fn chain_swarm() {
    for (workload, first_seed) in [
        ("list-append", 330_000),
        ("bank", 340_000),
        ("rw-register", 350_000),
        ("crossstitch-order-status", 360_000),
        ("scan-count", 375_000),
    ] {
        swarm(ProtocolKind::Chain, workload, first_seed);
    }
    let short = WorkloadOptions { ops_max: Some(4), ..WorkloadOptions::default() };
    swarm_with(ProtocolKind::Chain, "crossstitch-synthetic", 370_000, short, " --ops-max 4", 1);
}

#[test]
fn chain_replicated_swarm() {
    // Two workloads here (the Raft logs make each seed slower); the long swarms cover more.
    for (workload, first_seed) in [("list-append", 380_000), ("bank", 390_000)] {
        swarm_with(ProtocolKind::Chain, workload, first_seed, WorkloadOptions::default(), "", 3);
    }
    // The default is overlapped replication; serial too.
    let serial = ["chain-replication=serial".to_string()];
    let (options, flags) =
        (WorkloadOptions::default(), " --protocol-option chain-replication=serial");
    swarm_full(ProtocolKind::Chain, &serial, "bank", 395_000, options, flags, 3);
}
