//! The `meridian` binary end to end: bad input, a short embedded benchmark, a simulation, and a
//! server process driven over TCP on loopback.

mod common;

use common::{committed_in, free_port, http_get, meridian, wait_for_port};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn run(args: &[&str]) -> Output {
    meridian().args(args).output().expect("the binary runs")
}

/// Runs `meridian` with the whitespace-separated `words` followed by `more`.
fn run_words(words: &str, more: &[&str]) -> Output {
    let mut args: Vec<&str> = words.split_whitespace().collect();
    args.extend_from_slice(more);
    run(&args)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("meridian-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn bad_input_is_one_line_exit_2_and_starts_nothing() {
    let out_dir = scratch("bad");
    let out = out_dir.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["bench", "--protocol", "paxos", "--out", out],
            "unknown protocol 'paxos'; accepted: occ",
        ),
        (
            &["bench", "--workload", "tpcx", "--out", out],
            "unknown workload 'tpcx'; accepted: micro-luigi, micro-tiga, bank, smallbank, retwis, list-append, rw-register, ycsb-a",
        ),
        (&["bench", "--network", "moon", "--out", out], "unknown network preset 'moon'"),
        (&["bench", "--clock", "sundial", "--out", out], "unknown clock preset 'sundial'"),
        (&["bench", "--shards", "0", "--out", out], "--shards must be at least 1"),
        (&["bench", "--replicas", "0", "--out", out], "--replicas must be in 1..=9"),
        (&["bench", "--replicas", "2", "--out", out], "--replicas 2 is even"),
        (&["bench", "--zipf", "1.5", "--out", out], "--zipf must be in (0, 1)"),
        (
            &["bench", "--network", "tiga-wan", "--regions", "2", "--out", out],
            "--regions applies to the uniform presets only",
        ),
        (
            &["bench", "--network", "/nonexistent/m.toml", "--out", out],
            "network file /nonexistent/m.toml",
        ),
        (
            &["bench", "--cluster", "/nonexistent/c.toml", "--shards", "2", "--out", out],
            "--shards contradicts --cluster",
        ),
        (&["bench", "--duration", "0", "--out", out], "--duration must be in"),
        (
            &["bench", "--replica-placement", "near", "--out", out],
            "--replica-placement: 'near' is not spread or local",
        ),
        (&["sim", "--replica-placement", "nearby"], "'nearby' is not spread or local"),
        (&["sim", "--txns", "0"], "--txns must be at least 1"),
        (&["sim", "--seeds", "5..5"], "--seeds takes A..B"),
        (
            &["sim", "--workload", "bank", "--shards", "1", "--keys-per-shard", "2"],
            "bank needs at least 4 accounts in all, got 2",
        ),
        (&["sim", "--workload", "list-append", "--ops-max", "0"], "--ops-max must be in 1..=64"),
        (&["sim", "--distribution", "uniform"], "--distribution applies to the YCSB workloads"),
        (
            &["sim", "--workload", "ycsb-b", "--distribution", "pareto"],
            "unknown request distribution 'pareto'",
        ),
        (
            &["sim", "--workload", "micro-tiga", "--keys-per-shard", "2"],
            "micro-tiga needs at least 3 keys per shard, got 2",
        ),
        (&["sim", "--seeds", "0..3", "--seed", "1"], "--seed and --seeds contradict"),
        (&["sim", "--jobs", "2"], "--jobs applies to swarms"),
        (&["check", "/nonexistent/h.json"], "cannot read /nonexistent/h.json"),
        (&["check", "--model", "bank", "/nonexistent/h.json"], "unknown history model 'bank'"),
        (&["server", "--config", "/nonexistent/c.toml", "--node", "0"], "/nonexistent/c.toml"),
        (
            &["server", "--config", "/nonexistent/c.toml", "--node", "0", "--durability", "disk"],
            "unknown durability 'disk'",
        ),
        (&["bench", "--durability", "paper", "--out", out], "unknown durability 'paper'"),
        (&["bench", "--load", "open", "--out", out], "--load open needs --rate"),
        (&["bench", "--rate", "100", "--out", out], "--rate applies to --load open"),
        (&["bench", "--load", "burst", "--out", out], "--load must be closed or open"),
        (&["bench", "--load", "open", "--rate", "0", "--out", out], "the open-loop rate must be in"),
        (
            &["bench", "--load", "open", "--rate", "10", "--outstanding", "2", "--out", out],
            "--outstanding applies to the closed loop",
        ),
        (&["sim", "--clients", "2000000"], "--clients times --outstanding must be in 1..=100000"),
        (&["sim", "--outstanding", "0"], "--outstanding must be in 1..=1024"),
        (&["sim", "--server-regions", "mars"], "--server-regions: no region 'mars' in this network"),
        (&["bench", "--client-regions", "r0,r0", "--out", out], "region 'r0' is named twice"),
        (
            &["bench", "--protocol", "postgres", "--load", "open", "--rate", "10", "--out", out],
            "--protocol postgres runs a closed loop",
        ),
        (
            &["bench", "--protocol-option", "tiga-headroom-ms=5", "--out", out],
            "option 'tiga-headroom-ms' does not apply to protocol occ; its options: occ-one-round",
        ),
        (
            &["sim", "--protocol-option", "occ-one-round=maybe"],
            "option 'occ-one-round' = 'maybe' is not accepted; accepted: on, off",
        ),
        (&["sim", "--protocol-option", "occ-one-round"], "is not name=value"),
        (&["bench", "--pg-url", "host=x", "--out", out], "--pg-url applies to --protocol postgres only"),
        (
            &["bench", "--protocol", "postgres", "--pg-isolation", "snapshot", "--out", out],
            "--pg-isolation 'snapshot': expected serializable, repeatable-read or read-committed",
        ),
        (
            &["bench", "--protocol", "postgres", "--replicas", "3", "--out", out],
            "--replicas other than 1 does not apply to --protocol postgres",
        ),
        (
            &["bench", "--protocol", "postgres", "--pg-url", "host=127.0.0.1 port=1 connect_timeout=2", "--out", out],
            "cannot connect to --pg-url",
        ),
        (
            &["bench", "--fault", "crash node=99 at=1s", "--out", out],
            "fault 'crash node=99 at=1s': node 99 does not exist; the layout has nodes 0 to",
        ),
        (
            &["bench", "--fault", "crash leader=0 at=1s restart=2s", "--out", out],
            "needs --durability buffered or fsync",
        ),
        (
            &["bench", "--duration", "2", "--warmup", "1", "--fault", "isolate node=0 at=5s until=6s", "--out", out],
            "at=5s is outside the run, which lasts 3s",
        ),
        (
            &["bench", "--fault", "clock node=0 at=1s step=1ms", "--fault", "explode node=0 at=1s", "--out", out],
            "unknown fault 'explode'",
        ),
        (
            &["bench", "--protocol", "postgres", "--fault", "clock node=0 at=1s step=1ms", "--out", out],
            "--fault does not apply to --protocol postgres",
        ),
        (
            &["sim", "--faults", "--fault", "clock node=0 at=1s step=1ms"],
            "--faults draws a schedule from each seed; --fault gives one",
        ),
        (
            &["sim", "--fault", "partition regions=r0|mars at=1s until=2s"],
            "region 'mars' does not exist",
        ),
    ];
    for (args, expected) in cases {
        let output = run(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: expected '{expected}' in {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: one line, got {stderr}");
    }
    assert!(std::fs::read_dir(&out_dir).unwrap().next().is_none(), "bad input wrote results");
    // Without PostgreSQL installed (here: pointed at a directory without it).
    let output = meridian()
        .args(["bench", "--protocol", "postgres", "--duration", "1", "--out", out])
        .env("MERIDIAN_PG_BINDIR", &out_dir)
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("has no postgres and initdb programs"), "{stderr}");
    assert!(std::fs::read_dir(&out_dir).unwrap().next().is_none(), "bad input wrote results");
    // clap's own parse errors exit 2 as well.
    assert_eq!(run(&["bench", "--shards", "two"]).status.code(), Some(2));
}

/// A leader crashed and restarted in real time: the run records the actions with their
/// times, times the recovery, plots it, and its store checks pass.
#[test]
fn a_bench_with_a_leader_crash_times_its_recovery_and_passes_its_checks() {
    let out_dir = scratch("crash");
    let output = run_words(
        "bench --protocol occ --workload bank --shards 1 --replicas 3 --network lan --clients 8 --duration 4 --warmup 1 --durability buffered --quiet --out",
        &[
            out_dir.to_str().unwrap(),
            "--fault",
            "crash leader=0 at=2s restart=3s",
            "--fault",
            "isolate node=1 at=3.5s until=4s",
            "--fault",
            "disk node=2 at=1.5s until=2.5s delay=5ms",
        ],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        stdout.contains("fault at 2.00 s 'crash leader=0 at=2s restart=3s': before"),
        "{stdout}"
    );
    assert!(stdout.contains("check bank-total           PASS"), "{stdout}");
    let run_dir = std::fs::read_dir(&out_dir).unwrap().next().unwrap().unwrap().path();
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("stats.json")).unwrap())
            .unwrap();
    assert_eq!(stats["parameters"]["faults"][0], "crash leader=0 at=2s restart=3s");
    let applied = stats["faults_applied"].as_array().unwrap();
    let actions: Vec<&str> = applied.iter().map(|a| a["action"].as_str().unwrap()).collect();
    assert_eq!(
        actions[..3],
        ["disk n2 +5000000 ns per commit", "crash n0", "disk n2 +0 ns per commit"]
    );
    assert_eq!(actions[3], "restart n0", "{applied:?}");
    assert!(actions.contains(&"block n1 -> n0") && actions.contains(&"unblock n0 -> n1"));
    assert!(stats["messages_cut"].as_u64().unwrap() > 0, "the isolated node's links dropped");
    assert!(applied.iter().all(|a| a.get("error").is_none()), "{applied:?}");
    assert!(applied[1]["applied_s"].as_f64().unwrap() >= 2.0);
    let timeline = &stats["summary"]["timeline"];
    assert_eq!(timeline["bucket_ms"], 100.0);
    assert_eq!(timeline["points"].as_array().unwrap().len(), 50, "5 s in 100 ms buckets");
    assert_eq!(timeline["faults"].as_array().unwrap().len(), 3);
    let verdict = &timeline["faults"][0];
    // The shard's only leader is down: nothing submitted after the crash commits before a
    // new leader is elected.
    let first = verdict["first_commit_s"].as_f64().expect("commits resumed");
    assert!(first > 0.01, "{verdict}");
    assert!(verdict["pre_fault_txn_per_s"].as_f64().unwrap() > 0.0, "{verdict}");
    let report = std::fs::read_to_string(run_dir.join("report.md")).unwrap();
    assert!(report.contains("## Faults"), "{report}");
    assert!(run_dir.join("faults.png").is_file());
}

/// An open-loop run says so in its table and its `stats.json`, with what was offered.
#[test]
fn an_open_loop_bench_reports_its_load_and_what_it_offered() {
    let out_dir = scratch("open");
    let output = run_words(
        "bench --protocol 2pc-mvto --workload bank --network lan --regions 2 --server-regions r0 --client-regions r1 --shards 2 --clients 4 --load open --rate 400 --duration 0.8 --warmup 0.2 --quiet --out",
        &[out_dir.to_str().unwrap()],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        stdout.contains("load: open loop: Poisson arrivals at 400 txn/s, at most 4"),
        "{stdout}"
    );
    let run_dir = std::fs::read_dir(&out_dir).unwrap().next().unwrap().unwrap().path();
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("stats.json")).unwrap())
            .unwrap();
    let p = &stats["parameters"];
    assert_eq!(p["rate_per_s"], 400.0);
    assert_eq!(
        (p["server_regions"][0].as_str(), p["client_regions"][0].as_str()),
        (Some("r0"), Some("r1"))
    );
    let arrived = p["offered"]["arrived"].as_u64().unwrap();
    assert!((200..=600).contains(&arrived), "about 400 arrivals in a second: {arrived}");
    let committed = stats["summary"]["committed"].as_u64().unwrap();
    assert!(committed > 0 && committed < arrived, "{committed} of {arrived}");
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// `sim --out` writes tiga's and luigi's median over their stated bounds per coordinator
/// region (Tiga's setting: 3 × 3 on `tiga-wan`, coordinators in the four regions) and prints
/// it, with luigi's fast-path ratio (none: 0) and its two wide-area round trips; a protocol
/// that states no bound writes `null`.
#[test]
fn sim_writes_the_median_over_the_latency_bound_of_tiga_and_luigi() {
    for protocol in ["tiga", "luigi", "occ"] {
        let out_dir = scratch(&format!("bound-{protocol}"));
        let output = run_words(
            "sim --workload micro-tiga --shards 3 --replicas 3 --network tiga-wan \
             --server-regions south-carolina,finland,brazil --keys-per-shard 100000 --zipf 0.99 \
             --clients 12 --seed 1 --txns 300 --protocol",
            &[protocol, "--out", out_dir.to_str().unwrap()],
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
        let run_dir = std::fs::read_dir(&out_dir).unwrap().next().unwrap().unwrap().path();
        let stats: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run_dir.join("stats.json")).unwrap())
                .unwrap();
        let summary = &stats["summary"];
        if protocol == "occ" {
            assert!(summary["p50_over_bound"].is_null(), "{summary}");
            assert!(!stdout.contains("p50 over bound"), "{stdout}");
            continue;
        }
        assert!(stdout.contains("p50 over bound"), "{stdout}");
        let bounds = summary["latency_bound_ms_by_region"].as_object().unwrap();
        assert_eq!(bounds.len(), 4, "a bound per coordinator region: {summary}");
        // Hong Kong holds no replica: its bound is the longest.
        let hk = bounds["hong-kong"].as_f64().unwrap();
        assert!(bounds.values().all(|b| b.as_f64().unwrap() <= hk), "{summary}");
        let worst = summary["p50_over_bound"].as_f64().unwrap();
        let by_region = summary["p50_over_bound_by_region"].as_object().unwrap();
        let largest = by_region.values().map(|r| r.as_f64().unwrap()).fold(0.0, f64::max);
        assert_eq!(worst, largest, "{summary}");
        assert!((0.5..1.2).contains(&worst), "{summary}");
        if protocol == "luigi" {
            assert_eq!(summary["fast_path_ratio"].as_f64(), Some(0.0), "{summary}");
            assert_eq!(summary["wrtt_p50"].as_f64(), Some(2.0), "{summary}");
        }
        let _ = std::fs::remove_dir_all(&out_dir);
    }
}

#[test]
fn a_short_embedded_bench_writes_stats_and_passes_its_checks() {
    let out_dir = scratch("bench");
    let output = run_words(
        "bench --network metro --regions 2 --shards 2 --clients 8 --duration 1 --warmup 0.2 --quiet --keys-per-shard 1000 --out",
        &[out_dir.to_str().unwrap()],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("check micro-last-writer    PASS"), "{stdout}");
    assert!(stdout.contains(" delivered per commit (the whole run, every node)"), "{stdout}");
    let run_dir = std::fs::read_dir(&out_dir).unwrap().next().unwrap().unwrap().path();
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("stats.json")).unwrap())
            .unwrap();
    assert_eq!(stats["parameters"]["protocol"], "occ");
    assert_eq!(stats["parameters"]["network"]["name"], "metro");
    assert!(stats["summary"]["committed"].as_u64().unwrap() > 0);
    assert_eq!(
        stats["summary"]["cross_shard_fraction"], 1.0,
        "micro-luigi on 2 shards is all cross-shard"
    );
    // Counted from the messages each commit waited for, as the simulator counts them: a wave
    // of reads and the prepare, each a round trip to the other region's shard.
    assert_eq!(stats["summary"]["wrtt_p50"], 2.0, "{}", stats["summary"]);
    // occ on 2 x 1: a commit reads at both shards and prepares and decides at both: at least
    // six messages each, and far fewer than a hundred.
    let per = stats["summary"]["deliveries_per_commit"].as_f64().unwrap();
    assert!((6.0..100.0).contains(&per), "{per}");
    assert!(!stats["links"].as_array().unwrap().is_empty());
    assert!(!stats["summary"]["latency_histogram_us"].as_array().unwrap().is_empty());
    let provenance = &stats["parameters"]["provenance"];
    assert!(provenance["machine"]["cpus"].as_u64().unwrap() > 0, "{provenance}");
    assert!(provenance["git_commit"].as_str().is_some(), "{provenance}");
    let report = std::fs::read_to_string(run_dir.join("report.md")).unwrap();
    assert!(report.contains("| occ occ-one-round=on |"), "{report}");
    assert!(run_dir.join("latency-cdf.png").is_file());
}

#[test]
fn all_protocols_run_into_one_folder_whose_report_regenerates_and_compares() {
    let out_dir = scratch("compare");
    let output = run_words(
        "bench --all-protocols --network lan --regions 1 --shards 2 --clients 8 --duration 0.6 --warmup 0.2 --quiet --keys-per-shard 1000 --out",
        &[out_dir.to_str().unwrap()],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let folder = std::fs::read_dir(&out_dir).unwrap().next().unwrap().unwrap().path();
    let runs = std::fs::read_dir(folder.join("runs")).unwrap().count();
    // On `lan` with one replica PostgreSQL joins, where it is installed.
    let postgres = !stdout.contains("postgres left out");
    assert_eq!(
        runs,
        8 + usize::from(postgres),
        "occ, both 2pl policies, 2pc-mvto, mako, tiga, luigi, chain (and postgres): {stdout}"
    );
    let report = std::fs::read_to_string(folder.join("report.md")).unwrap();
    assert_eq!(report.contains("| 9 | postgres |"), postgres, "{report}");
    for label in [
        "| 1 | occ |",
        "| 2 | 2pl-no-wait |",
        "| 3 | 2pl-wound-wait |",
        "| 4 | 2pc-mvto |",
        "| 5 | mako |",
        "| 6 | tiga |",
        "| 7 | luigi |",
        "| 8 | chain |",
    ] {
        assert!(report.contains(label), "{label} in {report}");
        let name = label.rsplit(" | ").next().unwrap().trim_end_matches(" |");
        assert!(stdout.contains(name), "{stdout}");
    }
    for plot in ["throughput.png", "latency-cdf.png", "timeseries.svg"] {
        assert!(folder.join(plot).is_file(), "{plot}");
    }
    // The report regenerates from the stats alone.
    std::fs::remove_file(folder.join("report.md")).unwrap();
    let again = run(&["report", folder.to_str().unwrap()]);
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    assert!(folder.join("report.md").is_file());
    // A folder compared with itself: every ratio is 1.00.
    let side = run(&["report", "--compare", folder.to_str().unwrap(), folder.to_str().unwrap()]);
    let side = String::from_utf8_lossy(&side.stdout);
    // Rows are `name  A  B  B/A` three times over; a latency may itself read 1.00, so
    // only the ratio columns are looked at.
    let rows: Vec<Vec<&str>> = side
        .lines()
        .filter(|line| {
            !line.starts_with("A:") && !line.starts_with("B:") && !line.starts_with("run ")
        })
        .map(|line| line.split_whitespace().collect())
        .filter(|words: &Vec<&str>| !words.is_empty())
        .collect();
    assert_eq!(rows.len(), runs, "{side}");
    for words in &rows {
        assert_eq!(words.len(), 10, "{side}");
        for ratio in [words[3], words[6], words[9]] {
            assert_eq!(ratio, "1.00", "{side}");
        }
    }
    // A folder without runs is bad input.
    let empty = run(&["report", out_dir.join("nothing").to_str().unwrap()]);
    assert_eq!(empty.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn an_experiment_file_sweeps_into_one_folder_and_bad_files_start_nothing() {
    let out_dir = scratch("experiment");
    let file = out_dir.join("sweep.toml");
    std::fs::write(
        &file,
        "name = \"tiny\"\nprotocol = [\"occ\", \"2pl\"]\nclients = [2, 4]\nworkload = \"bank\"\n\
         network = \"lan\"\nregions = 1\nshards = 2\nkeys_per_shard = 100\nduration = 0.5\nwarmup = 0.1\nquiet = true\n",
    )
    .unwrap();
    // Published figures beside the file: its report compares them with its runs.
    let reference = out_dir.join("sweep.reference.toml");
    std::fs::write(
        &reference,
        "source = \"a made-up study, table 1\"\n\
         [[cell]]\nprotocol = \"occ\"\nclients = 2\nthroughput_txn_per_s = 1000\n\
         [[cell]]\nprotocol = \"occ\"\nclients = 4\nthroughput_txn_per_s = 2000\nlatency_ms_mean = 1\n",
    )
    .unwrap();
    let results = out_dir.join("results");
    let args =
        ["bench", "--experiment", file.to_str().unwrap(), "--out", results.to_str().unwrap()];
    let output = run(&args);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("[4/4] clients=4 protocol=2pl (ETA"), "{stdout}");
    let folder = std::fs::read_dir(&results).unwrap().next().unwrap().unwrap().path();
    assert!(folder.to_string_lossy().ends_with("-tiny"), "{}", folder.display());
    assert_eq!(std::fs::read_dir(folder.join("runs")).unwrap().count(), 4);
    let report = std::fs::read_to_string(folder.join("report.md")).unwrap();
    assert!(report.contains("| clients=2 protocol=occ |"), "{report}");
    // Each protocol's client sweep is summed up by its peak and ankle.
    assert!(report.contains("## Peak and ankle"), "{report}");
    assert_eq!(report.matches(", lan | ").count(), 2, "one line per protocol: {report}");
    assert!(report.contains("Source: a made-up study, table 1."), "{report}");
    assert!(
        report.contains("| clients=2 protocol=occ | throughput_txn_per_s | 1000.0 |"),
        "{report}"
    );
    assert!(report.contains("| protocol=occ | 2 → 4 | 2.00 |"), "{report}");
    assert!(folder.join("reference.toml").is_file(), "kept for `meridian report`");
    // The command line overrides the file: one client count, so two runs.
    let mut fewer = args.to_vec();
    fewer.extend(["--clients", "3"]);
    let output = run(&fewer);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stdout).contains("[2/2] protocol=2pl"));
    // Bad files: one line, exit 2, nothing run or written.
    std::fs::remove_dir_all(&results).unwrap();
    std::fs::write(
        &reference,
        "source = \"s\"\n[[cell]]\nclients = 16\nthroughput_txn_per_s = 1\n",
    )
    .unwrap();
    let output = run(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("reference cell 'clients=16' matches no run"), "{stderr}");
    assert!(!results.exists(), "nothing written");
    std::fs::remove_file(&reference).unwrap();
    for (text, expected) in [
        ("workload = \"bank\"\nclinets = 4\n", "sweep.toml:2: unknown key 'clinets'"),
        ("clients = []\n", "sweep.toml:1: 'clients' is an empty list"),
        ("shards = [1, 0]\n", "run 'shards=0': --shards must be at least 1"),
        ("fault = []\n", "sweep.toml:1: 'fault' must be a fault line or a non-empty list"),
        (
            "fault = [\"crash node=0 at=9s\"]\nduration = 1\n",
            "fault 'crash node=0 at=9s': at=9s is outside the run",
        ),
    ] {
        std::fs::write(&file, text).unwrap();
        let output = run(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{text}: {stderr}");
        assert!(stderr.contains(expected), "{text}: expected '{expected}' in {stderr}");
        assert!(!results.exists(), "{text}: nothing written");
    }
    // Presets: unknown names are listed; --quick needs an experiment or a preset.
    let output = run(&["bench", "--preset", "nope", "--out", results.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("unknown preset 'nope'; presets: luigi-micro"), "{stderr}");
    assert_eq!(
        run(&["bench", "--quick", "--out", results.to_str().unwrap()]).status.code(),
        Some(2)
    );
    assert!(!results.exists());
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn sim_prints_a_reproducible_trace_hash() {
    let args =
        ["sim", "--seed", "9", "--txns", "300", "--network", "metro", "--keys-per-shard", "500"];
    let first = run(&args);
    let second = run(&args);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let hash = |o: &Output| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find(|l| l.starts_with("trace hash"))
            .map(String::from)
    };
    assert!(hash(&first).is_some());
    assert_eq!(hash(&first), hash(&second));
}

/// A schedule given with `--fault` runs in the simulator with the same words as in `bench`:
/// every kind of fault, the run still passes its checks, and the faults change the trace.
#[test]
fn sim_runs_a_fault_schedule_given_as_flags() {
    let base = [
        "sim",
        "--seed",
        "4",
        "--txns",
        "300",
        "--network",
        "metro",
        "--replicas",
        "3",
        "--workload",
        "bank",
        "--keys-per-shard",
        "500",
    ];
    let faults = [
        "--fault",
        "crash leader=0 at=200ms restart=900ms",
        "--fault",
        "isolate leader=1 at=300ms until=1s",
        "--fault",
        "partition regions=r0|r1 at=1100ms until=1300ms",
        "--fault",
        "clock node=2 at=300ms step=-5ms",
        "--fault",
        "disk node=4 at=100ms until=2s delay=20ms",
    ];
    let with: Vec<&str> = base.iter().chain(faults.iter()).copied().collect();
    let faulty = run(&with);
    let calm = run(&base);
    let stdout = String::from_utf8_lossy(&faulty.stdout);
    assert!(faulty.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&faulty.stderr));
    assert!(stdout.contains("faults: crash leader=0 at=200ms restart=900ms; isolate"), "{stdout}");
    let hash = |o: &Output| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find(|l| l.starts_with("trace hash"))
            .map(String::from)
    };
    assert!(hash(&faulty).is_some() && hash(&calm).is_some());
    assert_ne!(hash(&faulty), hash(&calm), "the schedule changed what ran");
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn cluster_file(dir: &Path, server_port: u16, client_port: u16) -> PathBuf {
    let text = format!(
        r#"
protocol = "occ"
workload = "micro-luigi"
shards = 1
replicas = 1
network = "lan"
insecure = true
keys_per_shard = 10000

[[node]]
id = 0
region = "r0"
addr = "127.0.0.1:{server_port}"
replicas = [[0, 0]]

[[node]]
id = 1
region = "r0"
addr = "127.0.0.1:{client_port}"
coordinator = true
"#
    );
    let path = dir.join("cluster.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `server` refuses, with one line and exit 2, a node outside the file (naming the nodes it
/// has), a coordinator node (which runs inside `bench --cluster`, `kv` or a client), and a
/// port in use, and in every case creates no data directory; its log carries no colour codes
/// when stderr is not a terminal.
#[test]
fn a_server_that_cannot_serve_is_refused_before_it_touches_its_data_directory() {
    let dir = scratch("server-refusals");
    let (server_port, client_port) = (free_port(), free_port());
    let file = cluster_file(&dir, server_port, client_port);
    let config = file.to_str().unwrap();
    let data = dir.join("data");
    let data_dir = data.to_str().unwrap();
    for (node, says) in [("2", "the cluster file has nodes 0 to 1"), ("1", "a coordinator node")] {
        let out = run(&["server", "--config", config, "--node", node, "--data-dir", data_dir]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--node {node}: {stderr}");
        assert!(stderr.contains(says), "--node {node}: {stderr}");
        assert!(!data.exists(), "--node {node} created the data directory");
    }
    let taken = std::net::TcpListener::bind(("127.0.0.1", server_port)).unwrap();
    let out = run(&["server", "--config", config, "--node", "0", "--data-dir", data_dir]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cannot listen on"), "{stderr}");
    assert!(!data.exists(), "a port in use created the data directory");
    drop(taken);
    // Served, its log (stderr, a pipe here) is plain text.
    let mut child = meridian()
        .args(["server", "--config", config, "--node", "0", "--data-dir", data_dir])
        .args(["--log-level", "info"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_port(server_port);
    // The line after the listener is bound.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(log.contains("serving"), "{log}");
    assert!(!log.contains('\u{1b}'), "colour codes in a piped log: {log:?}");
}

/// `tiga` (in either mode, set in the cluster file) and `luigi` run as a durable server
/// process (their leaders journal their logs) driven over TCP, tiga commits on its fast path
/// and luigi on its only (slow) path.
#[test]
fn tiga_and_luigi_run_as_durable_server_processes() {
    let detective = "\n[protocol_options]\ntiga-mode = \"detective\"\n";
    for (protocol, path, extra) in [
        ("tiga", "fast path 100.0%", ""),
        ("tiga", "fast path 100.0%", detective),
        ("luigi", "fast path 0.0%", ""),
    ] {
        runs_as_a_server_process(protocol, path, extra);
    }
}

fn runs_as_a_server_process(protocol: &str, path: &str, extra: &str) {
    let dir = scratch(&format!("{protocol}-{}-tcp", extra.len()));
    let (server_port, client_port) = (free_port(), free_port());
    let file = cluster_file(&dir, server_port, client_port);
    let text =
        std::fs::read_to_string(&file).unwrap().replace("\"occ\"", &format!("\"{protocol}\""));
    std::fs::write(&file, text + extra).unwrap();
    let mut server = meridian();
    server.args(["server", "--config", file.to_str().unwrap(), "--node", "0"]);
    server.arg("--data-dir").arg(dir.join("data"));
    let child = server.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_for_port(server_port);
    let _server = Server(child);
    let results = dir.join("results");
    let output = run_words(
        "bench --clients 8 --duration 1 --warmup 0.2 --quiet --cluster",
        &[file.to_str().unwrap(), "--out", results.to_str().unwrap()],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(committed_in(&stdout) > 100, "{stdout}");
    assert!(stdout.contains(path), "{protocol}: {path} expected: {stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `chain` runs as server processes, one per shard, each shipping transactions to the other
/// over TCP (`micro-luigi` on 2 shards: every transaction has a hop on each), and a durable
/// server is refused with the reason.
#[test]
fn chain_runs_as_durable_server_processes_that_restart_from_their_logs() {
    let dir = scratch("chain-tcp");
    let ports = [free_port(), free_port(), free_port()];
    let text = format!(
        r#"
protocol = "chain"
workload = "micro-luigi"
shards = 2
replicas = 1
network = "lan"
insecure = true
keys_per_shard = 10000

[[node]]
id = 0
region = "r0"
addr = "127.0.0.1:{}"
replicas = [[0, 0]]

[[node]]
id = 1
region = "r0"
addr = "127.0.0.1:{}"
replicas = [[1, 0]]

[[node]]
id = 2
region = "r0"
addr = "127.0.0.1:{}"
coordinator = true
"#,
        ports[0], ports[1], ports[2]
    );
    let file = dir.join("cluster.toml");
    std::fs::write(&file, text).unwrap();
    // Durable servers (fsync, the server default): each shard a one-member log on disk.
    let start = |node: &str| {
        let child = meridian()
            .args(["server", "--config", file.to_str().unwrap(), "--node", node, "--data-dir"])
            .arg(dir.join(format!("data-{node}")))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Server(child)
    };
    let bench = |round: &str| {
        let results = dir.join(format!("results-{round}"));
        let output = run_words(
            "bench --clients 8 --duration 1 --warmup 0.2 --quiet --cluster",
            &[file.to_str().unwrap(), "--out", results.to_str().unwrap()],
        );
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
        assert!(committed_in(&stdout) > 100, "{stdout}");
        assert!(stdout.contains("commit paths: chain"), "{stdout}");
    };
    let servers = vec![start("0"), start("1")];
    wait_for_port(ports[0]);
    wait_for_port(ports[1]);
    bench("first");
    // kill -9 both servers and restart them from their data directories: they replay their
    // logs (undecided attempts, decisions still to deliver) and serve again.
    drop(servers);
    let servers = vec![start("0"), start("1")];
    wait_for_port(ports[0]);
    wait_for_port(ports[1]);
    bench("after-restart");
    drop(servers);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_drives_a_server_process_over_tcp() {
    let dir = scratch("tcp");
    let (server_port, client_port, metrics_port) = (free_port(), free_port(), free_port());
    let file = cluster_file(&dir, server_port, client_port);
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let start_server = || {
        let child = meridian()
            .args(["server", "--config", file.to_str().unwrap(), "--node", "0"])
            .args(["--metrics-addr", &metrics_addr])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for_port(server_port);
        Server(child)
    };
    let server = start_server();
    let results = dir.join("results");
    let output = run_words(
        "bench --clients 8 --duration 2 --warmup 0.2 --quiet --cluster",
        &[file.to_str().unwrap(), "--out", results.to_str().unwrap()],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("checks: not run"), "{stdout}");
    // Any commit will do: each waits for an fsync, and on a loaded CI machine a window of a
    // few seconds has seen as few as 8 (p50 813 ms). What is checked is that they went over
    // TCP, are counted by the server, and come back after a kill -9.
    let committed = committed_in(&stdout);
    assert!(committed > 0, "{stdout}");
    // The server's metrics count what it received and committed (published once a second).
    std::thread::sleep(Duration::from_millis(1_200));
    let metrics = http_get(&metrics_addr, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(
        metrics.contains("meridian_messages_received_total{node=\"0\",from=\"1\"}"),
        "{metrics}"
    );
    let committed_here = metrics
        .lines()
        .find_map(|l| l.strip_prefix("meridian_occ_participant_committed_total{node=\"0\"} "))
        .and_then(|n| n.parse::<u64>().ok())
        .expect("a committed counter");
    assert!(committed_here >= committed, "{committed_here} < {committed}");
    assert!(http_get(&metrics_addr, "/").starts_with("HTTP/1.1 404"));
    // kill -9 and restart from the data directory: the single replica's log (fsync, the
    // server default) replays every commit, so the participant counts them all again.
    drop(server);
    let _server = start_server();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let metrics = http_get(&metrics_addr, "/metrics");
        let replayed = metrics
            .lines()
            .find_map(|l| l.strip_prefix("meridian_occ_participant_committed_total{node=\"0\"} "))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        if replayed >= committed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after the restart only {replayed} of {committed} commits"
        );
    }
}

#[test]
fn a_faulty_swarm_in_worker_processes_passes_and_names_its_seeds() {
    let output = run_words(
        "sim --workload list-append --shards 3 --network metro --keys-per-shard 4 --txns 60",
        &["--seeds", "100..106", "--faults", "--jobs", "2"],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("SWARM seeds 100..106 in 2 processes: 6 passed, 0 failed"), "{stdout}");
}

#[test]
fn a_recorded_history_checks_and_a_broken_one_is_refused_with_its_line() {
    let dir = scratch("check");
    let history = dir.join("h.json");
    let output = run_words(
        "sim --workload list-append --shards 2 --network metro --keys-per-shard 4 --txns 200",
        &["--history", history.to_str().unwrap()],
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stdout));
    let output = run(&["check", history.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(stdout.starts_with("VALID (strict-serializable)"), "{stdout}");
    // Truncate the file inside its third line: a parse error naming the line, exit 2.
    let text = std::fs::read_to_string(&history).unwrap();
    let cut: usize = text.lines().take(2).map(|l| l.len() + 1).sum::<usize>() + 10;
    std::fs::write(&history, &text[..cut]).unwrap();
    let output = run(&["check", history.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("line 3"), "{stderr}");
    // An anomaly: exit 1 and the class named.
    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        "{\"process\":0,\"type\":\"invoke\",\"value\":[[\"append\",1,1]]}\n\
         {\"process\":0,\"type\":\"fail\",\"value\":[[\"append\",1,1]]}\n\
         {\"process\":1,\"type\":\"invoke\",\"value\":[[\"r\",1,null]]}\n\
         {\"process\":1,\"type\":\"ok\",\"value\":[[\"r\",1,[1]]]}\n",
    )
    .unwrap();
    let output = run(&["check", bad.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("G1a: 1 found"), "{stdout}");
}

#[test]
fn a_failing_run_prints_the_last_events_of_its_replay_and_trace_prints_on_demand() {
    // One virtual second is too short for geo round trips: the liveness check fails.
    let output = run(&["sim", "--network", "geo", "--txns", "500", "--time-limit-s", "1"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("check liveness"), "{stdout}");
    assert!(stdout.contains("last 40 events:"), "{stdout}");
    assert!(stdout.contains("deliver n"), "{stdout}");
    assert!(stdout.contains("REPRODUCE: meridian sim"), "{stdout}");
    let output = run(&["sim", "--network", "metro", "--txns", "50", "--trace", "5"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(stdout.contains("last 5 events:"), "{stdout}");
}

/// `cluster` manages servers by what listens on their addresses: `up` starts only what is
/// not running, a server killed and restarted by hand is found, `restart --node` brings one
/// back on its data, `down` stops whatever serves the nodes (the hand-started one too), and
/// `status` shows each server's process, data directory and metrics.
#[test]
fn cluster_up_status_restart_down_manage_the_servers_that_listen() {
    let dir = scratch("cluster");
    let (a, b, c, m) = (free_port(), free_port(), free_port(), free_port());
    let file = dir.join("c.toml");
    std::fs::write(
        &file,
        format!(
            "protocol = \"occ\"\nworkload = \"bank\"\nshards = 2\nreplicas = 1\nnetwork = \"lan\"\ninsecure = true\n\
             keys_per_shard = 100\n\
             [[node]]\nid = 0\nregion = \"r0\"\naddr = \"127.0.0.1:{a}\"\nreplicas = [[0, 0]]\n\
             metrics_addr = \"127.0.0.1:{m}\"\n\
             [[node]]\nid = 1\nregion = \"r0\"\naddr = \"127.0.0.1:{b}\"\nreplicas = [[1, 0]]\n\
             [[node]]\nid = 2\nregion = \"r0\"\naddr = \"127.0.0.1:{c}\"\ncoordinator = true\n"
        ),
    )
    .unwrap();
    let config = file.to_str().unwrap();
    let cluster = |words: &[&str]| {
        let mut args = vec!["cluster"];
        args.extend_from_slice(words);
        args.extend_from_slice(&["--config", config]);
        let out = run(&args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let (code, text) = cluster(&["up"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("cluster up: 2 servers (2 started, 0 already running)"), "{text}");
    let (code, text) = cluster(&["status"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("2/2 servers up"), "{text}");
    assert!(text.contains("data-node-0"), "the data directory: {text}");
    assert!(text.contains(&format!("metrics 127.0.0.1:{m}, up ")), "{text}");
    // A second `up` starts nothing and says so.
    let (code, text) = cluster(&["up"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("0 started, 2 already running"), "{text}");
    // The cluster serves a benchmark.
    let out = dir.join("results");
    let bench = run_words(
        "bench --clients 4 --duration 1 --warmup 0.2 --quiet --out",
        &[out.to_str().unwrap(), "--cluster", config],
    );
    assert!(bench.status.success(), "{}", String::from_utf8_lossy(&bench.stderr));
    // Node 0's group, from its metrics (published about once a second).
    std::thread::sleep(std::time::Duration::from_millis(1_200));
    let (_, text) = cluster(&["status", "--node", "0"]);
    assert!(text.contains("shard 0 leader, applied "), "{text}");
    assert!(text.contains("1/1 servers up"), "{text}");
    // Node 1 killed: status says so; `up` starts it alone, on its data.
    let pid_of = |text: &str, node: u32| -> u32 {
        let line = text.lines().find(|l| l.starts_with(&format!("node {node} "))).unwrap();
        line.split("pid ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap()
    };
    let (_, text) = cluster(&["status"]);
    let killed = pid_of(&text, 1);
    assert!(Command::new("kill").args(["-9", &killed.to_string()]).status().unwrap().success());
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (code, text) = cluster(&["status"]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("1/2 servers up"), "{text}");
    let (code, text) = cluster(&["up"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("(1 started, 1 already running)"), "{text}");
    // Node 0 restarted by hand (as the docs once said): status and down find it anyway.
    let (_, text) = cluster(&["restart", "--node", "0"]);
    assert!(text.contains("cluster up: 1 servers (1 started"), "{text}");
    let (_, text) = cluster(&["down", "--node", "0"]);
    assert!(text.contains("1 server(s) stopped"), "{text}");
    let data0 = dir.join(".meridian-c").join("data-node-0");
    let mut by_hand = meridian()
        .args(["server", "--config", config, "--node", "0", "--data-dir"])
        .arg(&data0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_port(a);
    let (code, text) = cluster(&["status"]);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(pid_of(&text, 0), by_hand.id(), "{text}");
    let (code, text) = cluster(&["down"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("2 server(s) stopped"), "{text}");
    let _ = by_hand.wait();
    let (code, text) = cluster(&["status"]);
    assert_eq!(code, Some(1));
    assert!(text.contains("0/2 servers up"), "{text}");
    // Bad requests change nothing.
    assert_eq!(cluster(&["restart"]).0, Some(2));
    assert_eq!(cluster(&["up", "--node", "2"]).0, Some(2), "a coordinator node is no server");
    assert_eq!(run(&["cluster", "up", "--config", "/nonexistent/c.toml"]).status.code(), Some(2));
}

/// Writes `frames` on a fresh connection to `addr` and reads until the server closes it (or
/// two seconds pass): true when the server closed it.
fn send_and_see_closed(addr: &str, bytes: &[u8]) -> bool {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("server listens");
    let _ = stream.write_all(bytes);
    stream.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut sink = [0u8; 64];
    matches!(stream.read(&mut sink), Ok(0) | Err(_))
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut bytes = (payload.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

#[test]
fn hostile_frames_close_their_connection_and_the_server_serves_on() {
    use meridian_core::wire::{encode_frame, Hello, WireFrame, WIRE_VERSION};
    let dir = scratch("hostile");
    let (server_port, client_port, metrics_port) = (free_port(), free_port(), free_port());
    let file = cluster_file(&dir, server_port, client_port);
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let child = meridian()
        .args(["server", "--config", file.to_str().unwrap(), "--node", "0"])
        .args(["--metrics-addr", &metrics_addr, "--durability", "memory"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _server = Server(child);
    wait_for_port(server_port);
    let addr = format!("127.0.0.1:{server_port}");
    let parsed = meridian_node::cluster_file::ClusterFile::load(&file).unwrap();
    let workload: std::sync::Arc<dyn meridian_workloads::Workload> = std::sync::Arc::from(
        meridian_workloads::build(&parsed.workload, &parsed.workload_options).unwrap(),
    );
    let hello = |fingerprint| {
        let mut bytes = Vec::new();
        let hello = Hello {
            version: WIRE_VERSION,
            cluster_fingerprint: fingerprint,
            from: meridian_core::NodeId(1),
            to: meridian_core::NodeId(0),
        };
        encode_frame(&WireFrame::<()>::Hello(hello), &mut bytes).unwrap();
        bytes
    };
    let good_hello = hello(meridian_node::context::fingerprint(&parsed, &workload));
    let nested = |prefix: &[u8]| {
        let mut payload = prefix.to_vec();
        payload.extend(std::iter::repeat_n([3u8, 1], 200_000).flatten());
        frame(&payload)
    };
    let mut attacks: Vec<(&str, Vec<u8>)> = vec![
        // The reported crash: a batch of 200,000 nested forwards, before any hello.
        (
            "nested before hello",
            frame(&[[1u8, 1, 0].as_slice(), &[12, 0].repeat(200_000)].concat()),
        ),
        ("wrong fingerprint", hello(7)),
        ("length over the maximum", u32::MAX.to_be_bytes().to_vec()),
    ];
    // After a good hello: an Execute whose arguments nest lists 200,000 deep (batch of one,
    // send time 0, Request, Execute, txn 1.0.0, shard 0, proc 0, one argument).
    let mut deep = good_hello.clone();
    deep.extend(nested(&[1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 1]));
    attacks.push(("nested arguments", deep));
    // A batch announcing four billion envelopes in a few bytes.
    let mut counts = good_hello.clone();
    counts.extend(frame(&[1, 0xff, 0xff, 0xff, 0xff, 0x0f, 0]));
    attacks.push(("oversized count", counts));
    let mut rng = meridian_core::rng::child_rng(3, "hostile-frames", 0);
    for _ in 0..20 {
        let len = 1 + meridian_core::rng::uniform_u64(&mut rng, 300) as usize;
        let payload: Vec<u8> =
            (0..len).map(|_| meridian_core::rng::uniform_u64(&mut rng, 256) as u8).collect();
        let mut bytes = good_hello.clone();
        bytes.extend(frame(&payload));
        attacks.push(("random payload after hello", bytes));
    }
    let attacks_count = attacks.len() as u64;
    for (what, bytes) in &attacks {
        // A random payload may happen to decode as a valid batch; the rest must be refused.
        let closed = send_and_see_closed(&addr, bytes);
        assert!(closed || what.starts_with("random"), "{what}: connection left open");
    }
    // The server is up and serves the next client.
    let results = dir.join("results");
    let output = run_words(
        "bench --clients 4 --duration 1 --warmup 0.2 --quiet --cluster",
        &[file.to_str().unwrap(), "--out", results.to_str().unwrap()],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(committed_in(&stdout) > 10, "{stdout}");
    let metrics = http_get(&metrics_addr, "/metrics");
    let rejected = metrics
        .lines()
        .find_map(|l| l.strip_prefix("meridian_tcp_connections_rejected_total "))
        .and_then(|n| n.parse::<u64>().ok())
        .expect("a rejected-connections counter");
    assert!(rejected >= attacks_count - 20, "{rejected} of {attacks_count} counted\n{metrics}");
}

/// A TLS cluster file's certificates are checked before a server listens or makes its data
/// directory: a missing key, an expired certificate and another node's certificate are one
/// line and exit status 2; `meridian cert` refuses to overwrite a CA.
#[test]
fn tls_files_are_checked_before_a_server_starts() {
    let dir = std::env::temp_dir().join(format!("meridian-cli-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ports: Vec<u16> = (0..2).map(|_| common::free_port()).collect();
    let file = dir.join("cluster.toml");
    let text = |certs: &str, node0_cert: &str| {
        format!(
            "protocol = \"occ\"\nworkload = \"bank\"\nshards = 1\nreplicas = 1\nnetwork = \"lan\"\n\
             tls_ca = \"{certs}/ca.pem\"\n\
             [[node]]\nid = 0\nregion = \"r0\"\naddr = \"127.0.0.1:{}\"\nreplicas = [[0, 0]]\n\
             tls_cert = \"{certs}/{node0_cert}.pem\"\ntls_key = \"{certs}/{node0_cert}.key\"\n\
             [[node]]\nid = 1\nregion = \"r0\"\naddr = \"127.0.0.1:{}\"\ncoordinator = true\n\
             tls_cert = \"{certs}/node-1.pem\"\ntls_key = \"{certs}/node-1.key\"\n",
            ports[0], ports[1]
        )
    };
    let serve = |data: &str| {
        meridian()
            .args(["server", "--node", "0", "--config"])
            .arg(&file)
            .arg("--data-dir")
            .arg(dir.join(data))
            .output()
            .unwrap()
    };
    // Missing files.
    std::fs::write(&file, text("certs", "node-0")).unwrap();
    let out = serve("data-missing");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("tls_ca") && stderr.contains("ca.pem"), "{stderr}");
    assert!(!dir.join("data-missing").exists(), "nothing made");
    // Certificates made; another node's certificate for node 0 is refused.
    let made = meridian().args(["cert", "--config"]).arg(&file).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    assert!(String::from_utf8_lossy(&made.stdout).contains("tls_ca = \"certs/ca.pem\""));
    let again = meridian().args(["cert", "--config"]).arg(&file).output().unwrap();
    assert_eq!(again.status.code(), Some(2), "a CA is never overwritten");
    std::fs::write(&file, text("certs", "node-1")).unwrap();
    let out = serve("data-other");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("node n0's certificate"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(!dir.join("data-other").exists());
    // Expired certificates (made valid for 0 days).
    let expired = dir.join("old");
    let made = meridian()
        .args(["cert", "--days", "0", "--config"])
        .arg(&file)
        .arg("--out")
        .arg(&expired)
        .output()
        .unwrap();
    assert!(made.status.success());
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    std::fs::write(&file, text("old", "node-0")).unwrap();
    let out = serve("data-expired");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("expired"), "{stderr}");
    assert!(!dir.join("data-expired").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
