//! The nemesis's schedule and verdict without processes: drawn schedules parse and replay,
//! bad lines are refused before anything starts, losses and unequal replicas are found.

use super::schedule::{self, Plan, Step};
use super::*;
use meridian_core::key::Key;
use meridian_core::ShardId;
use meridian_storage::MvccStore;

fn args(protocol: &str) -> NemesisArgs {
    NemesisArgs {
        config: None,
        protocol: Some(protocol.into()),
        shards: 3,
        replicas: 3,
        workload: "list-append".into(),
        duration: 30,
        seed: 1,
        faults: schedule::KINDS.join(","),
        fault: Vec::new(),
        clients: 4,
        tls: false,
        allow_unsurvivable: false,
        out: PathBuf::from("unused"),
    }
}

fn layout(protocol: &str) -> ClusterFile {
    let text = generated_layout(&args(protocol), protocol).unwrap();
    ClusterFile::parse("generated", &text, None).unwrap()
}

fn plan(file: &ClusterFile, lines: &[&str]) -> Result<Plan, ConfigError> {
    let leaders = file.protocol.initial_leaders(&file.topology, &file.protocol_options);
    let lines: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    Plan::parse(&lines, (&file.topology, &leaders), schedule::run_ns(30), false)
}

#[test]
fn a_drawn_schedule_is_the_seeds_own_parses_and_leaves_a_quiet_tail() {
    for protocol in ["occ", "tiga"] {
        let file = layout(protocol);
        let kinds = schedule::parse_kinds("crash,pause,partition,clock,disk").unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..40 {
            let lines = schedule::draw(&kinds, &file.topology, 30, seed);
            assert_eq!(lines, schedule::draw(&kinds, &file.topology, 30, seed), "seeded");
            let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
            let plan =
                plan(&file, &refs).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{lines:#?}"));
            let steps = plan.steps(&file.topology);
            assert!(steps.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
            let last = steps.last().expect("a 30 s run draws faults").at_ns;
            assert!(last <= schedule::run_ns(30 - schedule::QUIET_TAIL_S), "seed {seed}");
            seen.extend(lines.iter().map(|l| l.split_whitespace().next().unwrap().to_string()));
        }
        for kind in ["crash", "pause", "partition", "isolate", "clock", "disk", "disk-fail"] {
            assert!(seen.contains(kind), "{protocol}: no {kind} in 40 seeds: {seen:?}");
        }
    }
    // A long campaign schedules far more faults than a benchmark run may.
    let file = layout("occ");
    let kinds = schedule::parse_kinds("crash,partition").unwrap();
    let lines = schedule::draw(&kinds, &file.topology, 600, 3);
    assert!(lines.len() > 200, "{} faults in 600 s", lines.len());
    let leaders = file.protocol.initial_leaders(&file.topology, &file.protocol_options);
    Plan::parse(&lines, (&file.topology, &leaders), schedule::run_ns(600), false).unwrap();
    let kinds = schedule::parse_kinds("pause").unwrap();
    let lines = schedule::draw(&kinds, &layout("occ").topology, 30, 7);
    assert!(lines.iter().all(|l| l.starts_with("pause ")), "{lines:?}");
}

#[test]
fn pauses_and_partitions_compile_into_steps_on_the_right_processes() {
    let file = layout("occ");
    let plan = plan(
        &file,
        &[
            "disk-fail node=6 at=1s what=torn restart=2s",
            "pause leader=1 at=2s until=3s",
            "isolate node=4 at=1s until=1500ms",
            "crash node=5 at=4s restart=5s",
        ],
    )
    .unwrap();
    let steps = plan.steps(&file.topology);
    let leader = file.protocol.initial_leaders(&file.topology, &file.protocol_options)[1];
    assert!(steps.iter().any(|s| s.step == Step::Stop(leader) && s.at_ns == 2_000_000_000));
    assert!(steps.iter().any(|s| s.step == Step::Continue(leader) && !s.starts));
    // Isolating node 4 cuts both directions of its every link, the coordinators' included.
    let cuts = steps.iter().filter(|s| matches!(s.step, Step::Cut(_, _, true))).count();
    assert_eq!(cuts, 2 * (file.topology.nodes.len() - 1));
    assert!(steps.iter().any(|s| s.step == Step::Cut(NodeId(9), NodeId(4), true)));
    assert!(steps.iter().any(|s| s.step == Step::Kill(NodeId(5))));
    assert!(steps.iter().any(|s| s.step == Step::Start(NodeId(5))));
    let torn = meridian_runtime::logstore::DiskFailure::Torn;
    assert!(steps.iter().any(|s| s.step == Step::FailDisk(NodeId(6), torn) && s.starts));
    assert!(steps.iter().any(|s| s.step == Step::Recover(NodeId(6)) && !s.starts));
    // The core faults first, then the process faults, each in the order given.
    assert_eq!(plan.kind_of(0), "isolate");
    assert_eq!(plan.kind_of(2), "disk-fail");
    assert_eq!(plan.kind_of(3), "pause");
}

#[test]
fn a_bad_schedule_is_refused_with_the_line_that_is_wrong() {
    let file = layout("occ");
    for (line, says) in [
        ("crash node=42 at=1s restart=2s", "node 42 does not exist"),
        ("pause node=42 at=1s until=2s", "node 42 does not exist"),
        ("pause node=9 at=1s until=2s", "coordinator"),
        ("disk node=10 at=1s until=2s delay=5ms", "coordinator"),
        ("pause node=1 at=2s until=1s", "not after"),
        ("pause node=1 at=1s", "'until=' is missing"),
        ("pause node=1 at=1s until=40s", "outside the run"),
        ("pause node=1 at=1s until=2s when=now", "unknown key 'when'"),
        ("meteor node=1 at=1s", "unknown fault 'meteor'"),
        ("disk-fail node=1 at=1s restart=2s", "'what=' (fsync, full or torn) is missing"),
        ("disk-fail node=1 at=1s what=melt restart=2s", "unknown disk failure 'melt'"),
        ("disk-fail node=1 at=1s what=torn", "'restart=' is missing"),
        ("disk-fail node=1 at=1s what=torn until=2s", "unknown key 'until'"),
        ("pause node=1 at=1s until=2s what=torn", "unknown key 'what'"),
    ] {
        let error = plan(&file, &[line]).unwrap_err().to_string();
        assert!(error.contains(says), "{line}: {error}");
    }
    // Two of a shard's three replicas down for good leave no quorum: refused.
    let error = plan(&file, &["crash node=0 at=1s", "crash node=1 at=1s"]).unwrap_err().to_string();
    assert!(error.contains("too few left for a quorum"), "{error}");
    // Asked for explicitly, it is accepted.
    let leaders = file.protocol.initial_leaders(&file.topology, &file.protocol_options);
    let lines = ["crash node=0 at=1s".to_string(), "crash node=1 at=1s".to_string()];
    let topology = (&file.topology, leaders.as_slice());
    Plan::parse(&lines, topology, schedule::run_ns(30), true).expect("allowed when asked");
    let error = plan(&file, &["pause node=1 at=1s until=3s", "crash node=1 at=2s restart=4s"])
        .unwrap_err()
        .to_string();
    assert!(error.contains("overlap on node n1"), "{error}");
    let lines = ["pause node=1 at=1s until=3s", "disk-fail node=1 at=2s what=fsync restart=4s"];
    let error = plan(&file, &lines).unwrap_err().to_string();
    assert!(error.contains("overlap on node n1"), "{error}");
    let error = schedule::parse_kinds("crash,flood").unwrap_err().to_string();
    assert!(error.contains("unknown fault 'flood'"), "{error}");
}

/// A checker whose acknowledged writes are keys 1 and 2 of shard 0: a store lacks one when
/// it lacks the key.
struct TwoWrites;

impl meridian_workloads::InvariantCheck for TwoWrites {
    fn observe(&mut self, _: &meridian_workloads::clients::Completion) {}
    fn check(&self, _: &[(ShardId, &MvccStore)]) -> Vec<meridian_workloads::CheckResult> {
        Vec::new()
    }
    fn acknowledged_missing(&self, stores: &[(ShardId, &MvccStore)]) -> Option<Vec<String>> {
        let mut missing = Vec::new();
        for (_, store) in stores.iter().filter(|(s, _)| *s == ShardId(0)) {
            for key in [1u8, 2] {
                if store.read_latest(&Key::from(vec![key])).is_none() {
                    missing.push(format!("key {key}"));
                }
            }
        }
        Some(missing)
    }
}

#[test]
fn a_write_missing_from_every_replica_is_lost_and_from_some_is_lag() {
    let store = |keys: &[u8]| {
        let mut store = MvccStore::new();
        for key in keys {
            store.load(Key::from(vec![*key]), vec![1]);
        }
        store
    };
    // Key 1 is on replica 0 only; key 2 on none.
    let stores: BTreeMap<(ShardId, u32), (NodeId, MvccStore)> = [
        ((ShardId(0), 0), (NodeId(0), store(&[1]))),
        ((ShardId(0), 1), (NodeId(1), store(&[]))),
        ((ShardId(0), 2), (NodeId(2), store(&[]))),
    ]
    .into_iter()
    .collect();
    let mut lagging = BTreeMap::new();
    let lost = verdict::lost(&stores, &TwoWrites, &mut lagging).unwrap();
    assert_eq!(lost, ["key 2"]);
    assert_eq!(lagging, [(NodeId(1), 1), (NodeId(2), 1)].into_iter().collect());
}

#[test]
fn replicas_that_differ_are_named_with_the_first_difference() {
    let image = |pairs: &[(u8, u8)]| -> BTreeMap<Key, Vec<u8>> {
        pairs.iter().map(|(k, v)| (Key::from(vec![*k]), vec![*v])).collect()
    };
    let images = [
        ((ShardId(0), 0), (NodeId(0), image(&[(1, 1), (2, 2)]))),
        ((ShardId(0), 1), (NodeId(1), image(&[(1, 1), (2, 2)]))),
        ((ShardId(1), 0), (NodeId(2), image(&[(3, 3)]))),
        ((ShardId(1), 1), (NodeId(3), image(&[(3, 4)]))),
    ]
    .into_iter()
    .collect();
    let found = verdict::unequal(&images, 2, 2);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("shard s1: n2 and n3 differ at 1 of 1 keys"), "{found:?}");
    let missing = verdict::unequal(&images, 2, 3);
    assert!(missing.iter().any(|f| f.contains("replica 2 was not rebuilt")), "{missing:?}");
}
