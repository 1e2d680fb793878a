use super::*;

fn layout() -> Topology {
    // 3 shards x 3 replicas over regions a, b, c: nodes 0..8 host replicas, 9..11 coordinate.
    Topology::standard(vec!["a".into(), "b".into(), "c".into()], 3, 3).unwrap()
}

/// Replica 0 of every shard leads.
fn replica_zero(topology: &Topology) -> Vec<NodeId> {
    (0..topology.shards).map(|s| topology.replica_node(ShardId(s), 0).unwrap()).collect()
}

fn parse(lines: &[&str]) -> Result<FaultSchedule, String> {
    let lines: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
    FaultSchedule::parse(&lines, &layout(), &replica_zero(&layout()), 30 * NS_PER_S)
        .map_err(|e| e.0)
}

fn refused(lines: &[&str], fragment: &str) {
    let why = parse(lines).expect_err("must be refused");
    assert!(why.contains(fragment), "'{why}' does not say '{fragment}'");
}

#[test]
fn durations_need_a_unit_and_take_decimals() {
    assert_eq!(parse_duration_ns("250ms"), Ok(250 * NS_PER_MS));
    assert_eq!(parse_duration_ns("1.5s"), Ok(1_500 * NS_PER_MS));
    assert_eq!(parse_duration_ns("40us"), Ok(40 * NS_PER_US));
    assert_eq!(parse_duration_ns("900ns"), Ok(900));
    assert!(parse_duration_ns("10").unwrap_err().contains("no unit"));
    assert!(parse_duration_ns("10m").unwrap_err().contains("unknown unit"));
    assert!(parse_duration_ns("1.2.3s").unwrap_err().contains("not a duration"));
    assert!(parse_duration_ns("2h").is_err());
    assert!(parse_duration_ns("7200s").unwrap_err().contains("longer than an hour"));
}

#[test]
fn a_crash_with_restart_compiles_to_crash_then_restart() {
    let s = parse(&["crash node=3 at=10s restart=15s"]).unwrap();
    assert!(s.crashes());
    assert_eq!(
        s.actions(&layout()),
        vec![
            (10 * NS_PER_S, FaultAction::Crash(NodeId(3))),
            (15 * NS_PER_S, FaultAction::Restart(NodeId(3)))
        ]
    );
}

#[test]
fn leader_names_the_node_the_protocol_starts_leading() {
    let topology = layout();
    let s = parse(&["crash leader=2 at=1s restart=2s"]).unwrap();
    let expected = topology.replica_node(ShardId(2), 0).unwrap();
    assert_eq!(s.actions(&topology)[0], (NS_PER_S, FaultAction::Crash(expected)));
    // Leaders elsewhere (tiga's together in one region): leader=S follows them.
    let leaders: Vec<NodeId> =
        (0..3).map(|s| topology.replica_node(ShardId(s), 2).unwrap()).collect();
    let lines = vec!["crash leader=2 at=1s restart=2s".to_string()];
    let moved = FaultSchedule::parse(&lines, &topology, &leaders, 30 * NS_PER_S).unwrap();
    assert_eq!(moved.actions(&topology)[0], (NS_PER_S, FaultAction::Crash(leaders[2])));
}

#[test]
fn isolate_cuts_both_directions_of_every_link_and_restores_them() {
    let topology = layout();
    let s = parse(&["isolate node=0 at=1s until=2s"]).unwrap();
    let actions = s.actions(&topology);
    let others = topology.nodes.len() - 1;
    let blocks = actions.iter().filter(|(_, a)| matches!(a, FaultAction::Block(..))).count();
    let unblocks = actions.iter().filter(|(_, a)| matches!(a, FaultAction::Unblock(..))).count();
    assert_eq!((blocks, unblocks), (2 * others, 2 * others));
    assert!(actions.iter().all(|(at, a)| match a {
        FaultAction::Block(f, t) => *at == NS_PER_S && (f.0 == 0) != (t.0 == 0),
        FaultAction::Unblock(..) => *at == 2 * NS_PER_S,
        _ => false,
    }));
}

#[test]
fn a_partition_cuts_only_links_between_listed_groups() {
    let topology = layout();
    let s = parse(&["partition regions=a|b at=1s until=3s"]).unwrap();
    let region = |n: NodeId| topology.regions[topology.region_of(n).0 as usize].clone();
    for (_, action) in s.actions(&topology) {
        if let FaultAction::Block(f, t) = action {
            let pair = (region(f), region(t));
            assert!(pair == ("a".into(), "b".into()) || pair == ("b".into(), "a".into()));
        }
    }
    assert!(!s.actions(&topology).is_empty());
}

#[test]
fn clock_steps_take_a_sign_and_disk_slowdowns_end() {
    let s =
        parse(&["clock node=1 at=2s step=-50ms", "disk node=4 at=1s until=5s delay=20ms"]).unwrap();
    let actions = s.actions(&layout());
    assert_eq!(
        actions,
        vec![
            (NS_PER_S, FaultAction::DiskDelay(NodeId(4), 20 * NS_PER_MS)),
            (2 * NS_PER_S, FaultAction::ClockStep(NodeId(1), -50 * NS_PER_MS as i64)),
            (5 * NS_PER_S, FaultAction::DiskDelay(NodeId(4), 0)),
        ]
    );
    let forward = parse(&["clock node=1 at=2s step=+5ms"]).unwrap();
    assert_eq!(
        forward.actions(&layout()),
        vec![(2 * NS_PER_S, FaultAction::ClockStep(NodeId(1), 5 * NS_PER_MS as i64))]
    );
}

#[test]
fn back_to_back_faults_on_one_node_end_before_they_start_again() {
    let s = parse(&["crash node=2 at=1s restart=2s", "crash node=2 at=2s restart=3s"]).unwrap();
    let actions = s.actions(&layout());
    assert_eq!(actions[1], (2 * NS_PER_S, FaultAction::Restart(NodeId(2))));
    assert_eq!(actions[2], (2 * NS_PER_S, FaultAction::Crash(NodeId(2))));
}

#[test]
fn bad_faults_are_refused_with_their_reason() {
    refused(&["explode node=1 at=1s"], "unknown fault 'explode'");
    refused(&[""], "empty");
    refused(&["crash node=1"], "'at=' is missing");
    refused(&["crash at=1s"], "'node=' (or 'leader=' a shard) is missing");
    refused(&["crash node=1 leader=0 at=1s"], "not both");
    refused(&["crash node=12 at=1s"], "node 12 does not exist; the layout has nodes 0 to 11");
    refused(&["crash leader=3 at=1s restart=2s"], "shard 3 does not exist");
    refused(&["crash node=x at=1s"], "not a number");
    refused(&["crash node=1 at=1s at=2s"], "'at' given twice");
    refused(&["crash node=1 at=1s until=2s"], "unknown key 'until'");
    refused(&["crash node=1 at 1s"], "'at' is not key=value");
    refused(&["crash node=1 at=30s"], "outside the run");
    refused(&["crash node=1 at=5s restart=31s"], "outside the run");
    refused(&["crash node=1 at=5s restart=5s"], "is not after at=5s");
    refused(&["isolate node=1 at=5s until=4s"], "is not after");
    refused(&["isolate node=1 at=5s"], "'until=' is missing");
    refused(&["partition regions=a,b at=1s until=2s"], "names one group");
    refused(&["partition regions=a|z at=1s until=2s"], "region 'z' does not exist");
    refused(&["partition regions=a|a,b at=1s until=2s"], "in two groups");
    refused(&["clock node=1 at=1s step=0ms"], "does nothing");
    refused(&["clock node=1 at=1s step=5"], "no unit");
    refused(&["disk node=1 at=1s until=2s delay=0s"], "does nothing");
    refused(&[&format!("crash node=1 at=1s {}", "x".repeat(600))], "longer than");
    let many: Vec<String> =
        (0..=FAULTS_MAX).map(|_| "clock node=1 at=1s step=1ms".into()).collect();
    let many: Vec<&str> = many.iter().map(|s| s.as_str()).collect();
    refused(&many, "at most 64");
}

#[test]
fn contradictory_and_unsurvivable_schedules_are_refused() {
    refused(
        &["crash node=1 at=1s restart=5s", "crash node=1 at=4s restart=6s"],
        "crashed twice at once",
    );
    refused(&["crash node=1 at=1s", "crash node=1 at=4s restart=6s"], "crashed twice at once");
    // Overlapping cuts are two cuts: each blocks its links and lifts them at its own end.
    let both = parse(&["isolate node=1 at=1s until=5s", "isolate node=2 at=2s until=3s"]).unwrap();
    let shared = |a: &FaultAction| {
        matches!(
            a,
            FaultAction::Block(NodeId(1), NodeId(2)) | FaultAction::Unblock(NodeId(1), NodeId(2))
        )
    };
    let on_shared: Vec<(Time, FaultAction)> =
        both.actions(&layout()).into_iter().filter(|(_, a)| shared(a)).collect();
    assert_eq!(
        on_shared,
        vec![
            (NS_PER_S, FaultAction::Block(NodeId(1), NodeId(2))),
            (2 * NS_PER_S, FaultAction::Block(NodeId(1), NodeId(2))),
            (3 * NS_PER_S, FaultAction::Unblock(NodeId(1), NodeId(2))),
            (5 * NS_PER_S, FaultAction::Unblock(NodeId(1), NodeId(2))),
        ]
    );
    refused(
        &["disk node=1 at=1s until=5s delay=1ms", "disk node=1 at=2s until=3s delay=2ms"],
        "slowed twice at once",
    );
    let topology = layout();
    let shard0 = topology.shard_nodes(ShardId(0));
    let a = format!("crash node={} at=1s", shard0[1].0);
    let b = format!("crash node={} at=2s", shard0[2].0);
    refused(&[&a, &b], "too few left for a quorum");
    // One of two replicas down for good leaves no quorum either.
    let two = Topology::standard(vec!["a".into()], 1, 2).unwrap();
    let lines = vec!["crash node=1 at=1s".to_string()];
    let why = FaultSchedule::parse(&lines, &two, &replica_zero(&two), 30 * NS_PER_S).unwrap_err();
    assert!(why.0.contains("1 of shard 0's 2 replicas"), "{why}");
    // One replica of three down for good is survivable; so are all three for a while.
    assert!(parse(&[&a]).is_ok());
    let all: Vec<String> =
        shard0.iter().map(|n| format!("crash node={} at=1s restart=3s", n.0)).collect();
    let all: Vec<&str> = all.iter().map(|s| s.as_str()).collect();
    assert!(parse(&all).is_ok());
    // Faults on different nodes or at different times do not clash.
    assert!(parse(&["crash node=1 at=1s restart=2s", "crash node=1 at=3s restart=4s"]).is_ok());
    assert!(parse(&["isolate node=1 at=1s until=2s", "isolate node=2 at=3s until=4s"]).is_ok());
}

#[test]
fn random_mutations_of_good_lines_never_panic() {
    let good = "partition regions=a,b|c at=1.5s until=2500ms";
    let mut rng = crate::rng::child_rng(3, "fault-parse", 0);
    for _ in 0..5_000 {
        let bytes = crate::testing::mutate(&mut rng, good.as_bytes(), b"=|,.ms0-9 +-", 4);
        let _ = parse(&[&String::from_utf8_lossy(&bytes)]);
    }
}
