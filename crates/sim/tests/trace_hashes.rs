//! The behaviour guard: trace hashes of a fixed set of simulator runs, checked against the
//! table beside this file (`trace_hashes.tsv`).
//!
//! A trace hash covers every event of a run (each delivery, timer, fault and client step), so
//! a change that leaves every hash in the table as it was has changed no decision, no message
//! and no timing of any protocol on these runs. A restructuring must keep the table unchanged;
//! a change that alters behaviour on purpose regenerates it and says in its commit which rows
//! moved and why:
//!
//! ```text
//! MERIDIAN_TRACE_BLESS=1 cargo test --release -p meridian-sim --test trace_hashes
//! ```
//!
//! The table holds, for every protocol, [`SEEDS`] faulty seeds of `bank` and of `list-append`
//! on 3 shards × 3 replicas (the swarm's setting), plus fault-free runs on Tiga's setting, on
//! `geo` and of YCSB on `lan`. Every row is checked (about 45 s on two cores);
//! `MERIDIAN_TRACE_SEEDS=k` checks only the first k faulty seeds of each pair.

use meridian_core::clock::ClockModel;
use meridian_core::netmodel::NetworkModel;
use meridian_core::topology::{Placement, Topology};
use meridian_core::RegionId;
use meridian_protocols::ProtocolKind;
use meridian_sim::runner::{run, SimRunOptions};
use meridian_sim::swarm::seed_options;
use meridian_workloads::WorkloadOptions;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Faulty seeds per protocol and workload in the table.
const SEEDS: u64 = 20;
/// The first seed of every faulty pair.
const SEED_FIRST: u64 = 900_000;

/// One run of the table: its name (the row's key) and how to make it.
struct Case {
    name: String,
    /// Index of the seed among its pair's (fault-free runs count as 0).
    index: u64,
    options: SimRunOptions,
    workload: String,
    keys_per_shard: u64,
    zipf_theta: Option<f64>,
    ops_max: Option<u32>,
}

fn table_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("trace_hashes.tsv")
}

/// The swarm's faulty setting: 3 × 3 on `metro`, 8 clients, 100 transactions, 4 keys a shard.
fn faulty_cases(protocol: ProtocolKind) -> Vec<Case> {
    let regions: Vec<String> = (0..3).map(|i| format!("r{i}")).collect();
    let mut base = SimRunOptions::new(
        protocol,
        Topology::standard(regions, 3, 3).expect("valid topology"),
        NetworkModel::preset("metro", 3).expect("preset"),
        ClockModel::preset("perfect").expect("preset"),
        0,
    );
    base.clients = 8;
    base.txns = 100;
    let mut cases = Vec::new();
    for workload in ["bank", "list-append"] {
        for index in 0..SEEDS {
            let seed = SEED_FIRST + index;
            let (options, _) = seed_options(&base, seed, true);
            cases.push(Case {
                name: format!("{} {workload} metro-3x3-faults seed={seed}", protocol.name()),
                index,
                options,
                workload: workload.into(),
                keys_per_shard: 4,
                zipf_theta: None,
                ops_max: None,
            });
        }
    }
    cases
}

/// Tiga's setting (3 × 3 on `tiga-wan`, replicas in South Carolina, Finland and Brazil,
/// coordinators there and in Hong Kong, `micro-tiga` at Zipf 0.99, 24 clients) and `geo`
/// (3 × 3 in five regions, `micro-luigi`), fault-free, and 4-operation `ycsb-a` on 2 × 3 in
/// one `lan` region (the store's record layout).
fn setting_cases(protocol: ProtocolKind) -> Vec<Case> {
    let wan = NetworkModel::preset("tiga-wan", 4).expect("preset");
    let servers: Vec<RegionId> = ["south-carolina", "finland", "brazil"]
        .iter()
        .map(|name| {
            let at = wan.regions.iter().position(|r| r == name).expect("a tiga-wan region");
            RegionId(at as u32)
        })
        .collect();
    let topology = Topology::placed_with(wan.regions.clone(), &servers, 3, 3, Placement::default())
        .expect("valid topology");
    let clock = ClockModel::preset("perfect").expect("preset");
    let mut tiga = SimRunOptions::new(protocol, topology, wan, clock, 1);
    tiga.clients = 24;
    tiga.txns = 300;
    let geo_network = NetworkModel::preset("geo", 5).expect("preset");
    let geo_topology =
        Topology::standard(geo_network.regions.clone(), 3, 3).expect("valid topology");
    let mut geo = SimRunOptions::new(protocol, geo_topology, geo_network, clock, 1);
    geo.txns = 200;
    let lan_network = NetworkModel::preset("lan", 1).expect("preset");
    let lan_topology =
        Topology::standard(lan_network.regions.clone(), 2, 3).expect("valid topology");
    let mut lan = SimRunOptions::new(protocol, lan_topology, lan_network, clock, 1);
    lan.txns = 300;
    vec![
        Case {
            name: format!("{} micro-tiga tiga-wan-3x3 seed=1", protocol.name()),
            index: 0,
            options: tiga,
            workload: "micro-tiga".into(),
            keys_per_shard: 10_000,
            zipf_theta: Some(0.99),
            ops_max: None,
        },
        Case {
            name: format!("{} micro-luigi geo-3x3 seed=1", protocol.name()),
            index: 0,
            options: geo,
            workload: "micro-luigi".into(),
            keys_per_shard: 200,
            zipf_theta: Some(0.9),
            ops_max: None,
        },
        Case {
            name: format!("{} ycsb-a lan-2x3 seed=1", protocol.name()),
            index: 0,
            options: lan,
            workload: "ycsb-a".into(),
            keys_per_shard: 500,
            zipf_theta: None,
            ops_max: Some(4),
        },
    ]
}

/// The run's trace hash, or why it cannot run (a protocol that refuses a setting is a row
/// too: a refusal that changes is a behaviour change).
fn outcome(case: &Case) -> String {
    let options = WorkloadOptions {
        shards: case.options.topology.shards,
        keys_per_shard: case.keys_per_shard,
        zipf_theta: case.zipf_theta,
        ops_max: case.ops_max,
        ..WorkloadOptions::default()
    };
    let workload: Arc<dyn meridian_workloads::Workload> =
        match meridian_workloads::build(&case.workload, &options) {
            Ok(w) => Arc::from(w),
            Err(e) => return format!("refused: {e}"),
        };
    match run(&case.options, workload) {
        Ok(report) => format!("{:016x}", report.trace_hash),
        Err(e) => format!("refused: {e}"),
    }
}

fn read_table() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(table_path()).unwrap_or_default();
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let (name, hash) = line.split_once('\t').expect("a row is name TAB outcome");
            (name.to_string(), hash.to_string())
        })
        .collect()
}

/// Checks (or, blessing, records) `protocol`'s rows.
fn guard(protocol: ProtocolKind) {
    let bless = std::env::var_os("MERIDIAN_TRACE_BLESS").is_some();
    let checked =
        std::env::var("MERIDIAN_TRACE_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(SEEDS);
    let table = read_table();
    let mut cases = faulty_cases(protocol);
    cases.extend(setting_cases(protocol));
    let mut rows = Vec::new();
    let mut moved = Vec::new();
    for case in cases.iter().filter(|c| bless || c.index < checked) {
        let got = outcome(case);
        match table.get(&case.name) {
            Some(want) if *want == got => {}
            want => moved.push(format!("{}: table {want:?}, now {got}", case.name)),
        }
        rows.push((case.name.clone(), got));
    }
    if bless {
        bless_rows(protocol, rows);
        return;
    }
    assert!(
        moved.is_empty(),
        "{} of {} runs changed their trace (bless only a change meant to alter behaviour):\n{}",
        moved.len(),
        rows.len(),
        moved.join("\n")
    );
}

/// Replaces `protocol`'s rows in the table (the tests of all protocols may bless at once, so
/// the file is rewritten under a lock).
fn bless_rows(protocol: ProtocolKind, rows: Vec<(String, String)>) {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _held = LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut table = read_table();
    let prefix = format!("{} ", protocol.name());
    table.retain(|name, _| !name.starts_with(&prefix));
    table.extend(rows);
    let mut text = String::from(
        "# Trace hashes of fixed simulator runs (crates/sim/tests/trace_hashes.rs).\n\
         # Regenerate: MERIDIAN_TRACE_BLESS=1 cargo test --release -p meridian-sim --test trace_hashes\n",
    );
    for (name, outcome) in table {
        text += &format!("{name}\t{outcome}\n");
    }
    std::fs::write(table_path(), text).expect("the table is writable");
}

#[test]
fn occ_traces_are_unchanged() {
    guard(ProtocolKind::Occ);
}

#[test]
fn twopl_traces_are_unchanged() {
    guard(ProtocolKind::TwoPl);
}

#[test]
fn mvto_traces_are_unchanged() {
    guard(ProtocolKind::Mvto);
}

#[test]
fn mako_traces_are_unchanged() {
    guard(ProtocolKind::Mako);
}

#[test]
fn chain_traces_are_unchanged() {
    guard(ProtocolKind::Chain);
}

#[test]
fn tiga_traces_are_unchanged() {
    guard(ProtocolKind::Tiga);
}

#[test]
fn luigi_traces_are_unchanged() {
    guard(ProtocolKind::Luigi);
}

/// Every protocol has a test above, so a new protocol cannot escape the guard.
#[test]
fn every_protocol_is_guarded() {
    let guarded = [
        ProtocolKind::Occ,
        ProtocolKind::TwoPl,
        ProtocolKind::Mvto,
        ProtocolKind::Mako,
        ProtocolKind::Chain,
        ProtocolKind::Tiga,
        ProtocolKind::Luigi,
    ];
    for kind in ProtocolKind::ALL {
        assert!(guarded.contains(kind), "{} has no trace-hash guard", kind.name());
    }
}
