//! Runs against a real PostgreSQL server started by the harness. Where PostgreSQL is not
//! installed these tests say loudly that they did not run (and fail when
//! `MERIDIAN_REQUIRE_PG` is set, as CI on this project's machines does).

use meridian_pg::sql::Isolation;
use meridian_pg::PgExperiment;
use meridian_runtime::logstore::DurabilityMode;
use meridian_workloads::WorkloadOptions;

fn postgres_here(test: &str) -> bool {
    match meridian_pg::server::find_bindir() {
        Ok(_) => true,
        Err(why) => {
            assert!(
                std::env::var_os("MERIDIAN_REQUIRE_PG").is_none(),
                "MERIDIAN_REQUIRE_PG is set but {why}"
            );
            eprintln!("\n*** {test} DID NOT RUN: {why} ***\n");
            false
        }
    }
}

fn experiment(workload: &str, keys_per_shard: u64, isolation: Isolation) -> PgExperiment {
    PgExperiment {
        workload: workload.into(),
        workload_options: WorkloadOptions {
            shards: 2,
            keys_per_shard,
            ..WorkloadOptions::default()
        },
        clients: 16,
        duration_s: 2.0,
        warmup_s: 0.0,
        seed: 7,
        progress: false,
        durability: DurabilityMode::Memory,
        isolation,
        url: None,
    }
}

/// The anomaly lines of a run's failed history check ("G2: 12 found", ...).
fn failed_history_check(output: &meridian_bench::run::RunOutput) -> String {
    let check =
        output.checks.iter().find(|c| c.name.starts_with("elle")).expect("a history check ran");
    assert!(!check.passed, "expected anomalies, got: {}", check.detail);
    check.detail.clone()
}

#[test]
fn serializable_runs_keep_every_invariant_and_a_strictly_serializable_history() {
    if !postgres_here("serializable_runs_keep_every_invariant") {
        return;
    }
    for (workload, keys) in [("bank", 20), ("list-append", 4)] {
        let output = meridian_pg::run(&experiment(workload, keys, Isolation::Serializable))
            .unwrap_or_else(|e| panic!("{workload}: {e}"));
        assert!(output.verdict().is_ok(), "{workload}: {:?}", output.verdict());
        assert!(output.summary.committed > 100, "{workload}: {:?}", output.summary);
        for check in &output.checks {
            assert!(check.passed, "{workload}: {} failed: {}", check.name, check.detail);
        }
        // Serialization failures were retried and counted by cause.
        let retried: u64 = output.summary.abort_causes.values().sum();
        assert_eq!(retried, output.summary.retries, "{:?}", output.summary.abort_causes);
        assert!(output
            .summary
            .abort_causes
            .keys()
            .all(|c| c == "serialization" || c == "deadlock"));
    }
}

#[test]
fn repeatable_read_lets_write_skew_through_and_the_checker_reports_it() {
    if !postgres_here("repeatable_read_lets_write_skew_through") {
        return;
    }
    let output = meridian_pg::run(&experiment("rw-register", 2, Isolation::RepeatableRead))
        .expect("the run itself succeeds");
    let detail = failed_history_check(&output);
    assert!(detail.contains("G2"), "{detail}");
}

#[test]
fn read_committed_loses_updates_and_the_checker_reports_it() {
    if !postgres_here("read_committed_loses_updates") {
        return;
    }
    let output = meridian_pg::run(&experiment("list-append", 2, Isolation::ReadCommitted))
        .expect("the run itself succeeds");
    failed_history_check(&output);
}

#[test]
fn tpcc_consistency_conditions_hold_on_the_database_after_a_run() {
    if !postgres_here("tpcc_consistency_conditions_hold") {
        return;
    }
    let mut e = experiment("tpcc", 1, Isolation::Serializable);
    e.workload_options.shards = 1;
    e.workload_options.tpcc =
        meridian_workloads::tpcc::TpccOptions::from_flags(Some(1), None, None, None, Some("small"))
            .expect("valid TPC-C flags");
    e.clients = 4;
    let output = meridian_pg::run(&e).expect("the run succeeds");
    assert!(output.summary.committed > 0);
    let cc: Vec<_> = output.checks.iter().filter(|c| c.name.contains("CC")).collect();
    assert!(cc.len() >= 10, "the consistency conditions ran: {:?}", output.checks);
    for check in &output.checks {
        assert!(check.passed, "{} failed: {}", check.name, check.detail);
    }
}

#[test]
fn an_unreachable_server_is_a_clear_error_and_nothing_runs() {
    let mut e = experiment("bank", 20, Isolation::Serializable);
    e.url = Some("host=127.0.0.1 port=1 user=meridian dbname=postgres connect_timeout=2".into());
    let error = meridian_pg::run(&e).expect_err("nothing listens on port 1").to_string();
    assert!(error.contains("cannot connect to --pg-url"), "{error}");
}

#[test]
fn a_started_server_leaves_nothing_behind() {
    if !postgres_here("a_started_server_leaves_nothing_behind") {
        return;
    }
    let settings =
        meridian_pg::server::Settings { max_connections: 10, durability: DurabilityMode::Fsync };
    let server = meridian_pg::server::TempServer::start(settings).expect("the server starts");
    let dir = server.base_dir().to_path_buf();
    assert!(dir.join("data").join("PG_VERSION").is_file());
    let pid_file = dir.join("data").join("postmaster.pid");
    let pid = std::fs::read_to_string(&pid_file).expect("a running server writes its pid");
    let pid = pid.lines().next().expect("the pid line").trim().to_string();
    drop(server);
    assert!(!dir.exists(), "{} removed", dir.display());
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "postgres {pid} stopped");
}
