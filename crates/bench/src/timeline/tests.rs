use super::*;
use meridian_core::topology::Topology;
use meridian_core::txn::{ProcId, TxnFailure, TxnOutcome, TxnRequest};
use meridian_core::{NodeId, RequestId};

const START: Time = 1_000 * NS_PER_S;

fn completion(submitted_ns: Time, completed_ns: Time, committed: bool) -> Completion {
    let result = if committed {
        TxnResult::Committed
    } else {
        TxnResult::Failed(TxnFailure::RetriesExhausted)
    };
    Completion {
        client: 0,
        coordinator: NodeId(0),
        request: RequestId(0),
        txn: TxnRequest { proc: ProcId(0), args: vec![] },
        submitted_at: START + submitted_ns,
        completed_at: START + completed_ns,
        outcome: TxnOutcome {
            result,
            outputs: vec![],
            commit_ts: None,
            retries: 0,
            shards_touched: 1,
            path: meridian_core::txn::CommitPath::None,
            aborts: Default::default(),
            speculative_ns: None,
        },
        wan_hops: None,
    }
}

fn schedule(lines: &[&str], run_ns: Time) -> FaultSchedule {
    let topology = Topology::standard(vec!["a".into()], 1, 3).unwrap();
    let lines: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
    let leaders = [topology.replica_node(meridian_core::ShardId(0), 0).unwrap()];
    FaultSchedule::parse(&lines, &topology, &leaders, run_ns).unwrap()
}

/// A timeline whose faults took effect when planned.
fn timeline(run_ns: Time, faults: &FaultSchedule) -> Timeline {
    let started = Arc::new(FaultStarts::new(faults));
    for (index, fault) in faults.faults().iter().enumerate() {
        started.mark(index, fault.at_ns);
    }
    Timeline::new(START, run_ns, faults, started)
}

/// `rate` commits per second, evenly spread, from `from_ms` to `to_ms`, each taking
/// `latency_ms`.
fn load(timeline: &mut Timeline, from_ms: u64, to_ms: u64, rate: u64, latency_ms: u64) {
    let step_ns = NS_PER_S / rate;
    let mut at = from_ms * NS_PER_MS;
    while at < to_ms * NS_PER_MS {
        let done = at + latency_ms * NS_PER_MS;
        timeline.add(&completion(at, done, true));
        at += step_ns;
    }
}

#[test]
fn latency_classes_are_exact_below_eight_and_within_six_percent_above() {
    for us in 1..8 {
        assert_eq!(class_value_us(class_of(us)), us as f64);
    }
    for us in [8u64, 9, 15, 16, 100, 1_000, 12_345, 1_000_000, 600_000_000] {
        let value = class_value_us(class_of(us));
        assert!((value - us as f64).abs() / us as f64 <= 0.0625, "{us} µs -> {value}");
    }
    assert!(class_of(u64::MAX) < LATENCY_CLASSES);
    let mut last = 0;
    for us in 1..100_000u64 {
        assert!(class_of(us) >= last, "classes grow with the latency");
        last = class_of(us);
    }
}

#[test]
fn buckets_count_commits_and_their_p99() {
    let run_ns = 2 * NS_PER_S;
    let mut t = timeline(run_ns, &FaultSchedule::default());
    // 100 commits in the first bucket: 98 at 10 ms, 2 at 200 ms.
    for i in 0..100u64 {
        let latency_ms = if i < 98 { 10 } else { 200 };
        t.add(&completion(i * NS_PER_MS / 2, i * NS_PER_MS / 2 + latency_ms * NS_PER_MS, true));
    }
    t.add(&completion(0, 150 * NS_PER_MS, false)); // failures do not count
    t.add(&completion(0, 3 * NS_PER_S, true)); // after the run
    let s = t.summary();
    assert_eq!(s.bucket_ms, 100.0);
    assert_eq!(s.points.len(), 20);
    let counted: f64 = s.points.iter().map(|p| p.throughput_txn_per_s * 0.1).sum();
    assert!((counted - 100.0).abs() < 1e-6, "{counted}");
    let with_slow = s.points.iter().find(|p| p.latency_ms_p99.is_some_and(|v| v > 150.0));
    assert!(with_slow.is_some(), "the 200 ms commits set some bucket's p99: {:?}", s.points);
    assert!(s.points[19].latency_ms_p99.is_none());
}

#[test]
fn a_dip_and_its_recovery_are_timed_from_the_fault() {
    let run_ns = 20 * NS_PER_S;
    let faults = schedule(&["crash node=0 at=8s restart=10s"], run_ns);
    let mut t = timeline(run_ns, &faults);
    load(&mut t, 0, 8_000, 1_000, 5); // 1,000 txn/s before the fault
    load(&mut t, 11_000, 20_000, 1_000, 5); // nothing from 8 s to 11 s, then back
    let s = t.summary();
    let v = &s.faults[0];
    assert_eq!(v.at_s, 8.0);
    let pre = v.pre_fault_txn_per_s.unwrap();
    assert!((pre - 1_000.0).abs() < 20.0, "{pre}");
    assert!(v.dipped);
    // The first transaction submitted after the fault was submitted at 11 s, done 5 ms later.
    assert!((v.first_commit_s.unwrap() - 3.005).abs() < 1e-6, "{:?}", v.first_commit_s);
    // Back to 90% in the window 11.0..11.5 s: 3.5 s after the fault.
    assert!((v.recovered_90_s.unwrap() - 3.5).abs() < 1e-6, "{:?}", v.recovered_90_s);
}

#[test]
fn no_dip_is_zero_and_no_recovery_is_absent() {
    let run_ns = 20 * NS_PER_S;
    let faults =
        schedule(&["clock node=0 at=8s step=+1ms", "isolate node=1 at=12s until=13s"], run_ns);
    let mut t = timeline(run_ns, &faults);
    load(&mut t, 0, 12_000, 1_000, 5); // steady until 12 s, then nothing for good
    let s = t.summary();
    assert!(!s.faults[0].dipped);
    assert_eq!(s.faults[0].recovered_90_s, Some(0.0), "{:?}", s.faults[0]);
    assert!(s.faults[1].dipped);
    assert_eq!(s.faults[1].recovered_90_s, None, "never back within the run");
    assert_eq!(s.faults[1].first_commit_s, None, "nothing submitted after it committed");
}

#[test]
fn a_fault_too_early_to_measure_before_has_no_recovery_figure() {
    let run_ns = 10 * NS_PER_S;
    let faults = schedule(&["crash node=0 at=500ms restart=2s"], run_ns);
    let mut t = timeline(run_ns, &faults);
    load(&mut t, 0, 10_000, 100, 5);
    let v = &t.summary().faults[0];
    assert_eq!(v.pre_fault_txn_per_s, None, "less than 1 s before it");
    assert_eq!(v.recovered_90_s, None);
    assert!(v.first_commit_s.is_some());
}

#[test]
fn a_long_run_gets_wider_buckets_within_the_bound() {
    let run_ns = 3 * 3_600 * NS_PER_S;
    let t = timeline(run_ns, &FaultSchedule::default());
    let s = t.summary();
    assert!(s.points.len() <= TIMELINE_BUCKETS_MAX);
    assert!(s.bucket_ms > 100.0);
}

#[test]
fn the_first_commit_counts_from_when_the_fault_took_effect() {
    let run_ns = 10 * NS_PER_S;
    let faults = schedule(&["crash node=0 at=4s restart=6s"], run_ns);
    let started = Arc::new(FaultStarts::new(&faults));
    let mut t = Timeline::new(START, run_ns, &faults, started.clone());
    // Not yet in effect: a commit submitted after the planned time does not count.
    t.add(&completion(4_001 * NS_PER_MS, 4_002 * NS_PER_MS, true));
    started.mark(0, 4_010 * NS_PER_MS);
    started.mark(0, 9 * NS_PER_S); // the first mark stands
    t.add(&completion(4_005 * NS_PER_MS, 4_020 * NS_PER_MS, true)); // submitted before it
    t.add(&completion(4_300 * NS_PER_MS, 4_500 * NS_PER_MS, true));
    let first = t.summary().faults[0].first_commit_s.unwrap();
    assert!((first - 0.49).abs() < 1e-9, "{first}");
}

#[test]
fn a_fault_without_a_whole_window_after_it_is_not_judged() {
    let run_ns = 10 * NS_PER_S;
    let faults = schedule(&["clock node=0 at=9800ms step=+1ms"], run_ns);
    let mut t = timeline(run_ns, &faults);
    load(&mut t, 0, 10_000, 100, 5);
    let v = &t.summary().faults[0];
    assert!(v.pre_fault_txn_per_s.is_some());
    assert_eq!((v.dipped, v.recovered_90_s), (false, None), "{v:?}");
}

#[test]
fn a_short_last_bucket_is_a_rate_over_its_own_width() {
    // 1,050 ms: the last bucket is 50 ms long and holds 5 commits: 100 txn/s, not 50.
    let run_ns = 1_050 * NS_PER_MS;
    let mut t = timeline(run_ns, &FaultSchedule::default());
    load(&mut t, 0, 1_050, 100, 1);
    let points = t.summary().points;
    assert_eq!(points.len(), 11);
    assert!((points[10].throughput_txn_per_s - 100.0).abs() < 1e-6, "{:?}", points[10]);
}
