//! `meridian sim` (one seed, or a swarm of seeds in worker processes, with or without fault
//! plans) and `meridian check` (a recorded history through the checker).

use crate::{CheckArgs, ClusterArgs, Failure, Resolved, SimArgs};
use meridian_check::history::{History, Model};
use meridian_check::Consistency;
use meridian_core::fault::FaultSchedule;
use meridian_core::time::NS_PER_S;
use meridian_core::topology::{region_ids, Topology};
use meridian_core::ConfigError;
use meridian_sim::runner::{run as run_sim, SimRunOptions, SimRunReport};
use meridian_sim::swarm;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

/// Events of a failing seed's trace printed after it (replayed with tracing on).
const FAILURE_TRACE_EVENTS: usize = 40;

/// Largest history file `meridian check` reads.
const HISTORY_BYTES_MAX: u64 = 4 << 30;
/// Most seeds one swarm may run.
const SWARM_SEEDS_MAX: u64 = 100_000_000;
/// `--time-limit-s` when not given (keep equal to the flag's default in main.rs).
pub(crate) const TIME_LIMIT_S_DEFAULT: u64 = 3_600;
/// Most worker processes.
const JOBS_MAX: usize = 256;

/// One seed's setup: the options, and the fault plan's description when faulty.
fn seed_options(
    r: &Resolved,
    args: &SimArgs,
    topology: &Topology,
    seed: u64,
    txns: u64,
    schedule: &FaultSchedule,
) -> (SimRunOptions, Option<String>) {
    let mut base =
        SimRunOptions::new(r.protocol, topology.clone(), r.network.clone(), r.clock, seed);
    base.clients = r.clients * r.outstanding;
    base.client_regions =
        region_ids(&topology.regions, &r.client_regions, "--client-regions").unwrap_or_default();
    base.load = r.load;
    base.txns = txns;
    base.protocol_options = r.protocol_options.clone();
    base.time_limit_ns = args.time_limit_s.saturating_mul(NS_PER_S);
    base.attempts_max = args.attempts_max;
    let (mut options, mut plan) = swarm::seed_options(&base, seed, args.faults);
    if !schedule.is_empty() {
        // A schedule given with --fault replaces the drawn plan (the two are refused together).
        options.faults =
            schedule.actions(topology).into_iter().map(|(at, a)| (at, a.into())).collect();
        let lines: Vec<&str> = schedule.faults().iter().map(|f| f.text.as_str()).collect();
        plan = Some(lines.join("; "));
    }
    if args.durability_oracle {
        let (with_oracle, text) = swarm::with_durability_oracle(options);
        options = with_oracle;
        plan = Some(plan.map_or(text.clone(), |plan| format!("{plan}; {text}")));
    }
    (options, plan)
}

/// The command line that replays `seed`.
fn reproduce(c: &ClusterArgs, args: &SimArgs, r: &Resolved, seed: u64, txns: u64) -> String {
    let mut line = format!(
        "meridian sim --protocol {} --workload {} --shards {} --replicas {} --clients {} --txns {txns}",
        r.protocol.name(),
        r.workload,
        r.shards,
        r.replicas,
        r.clients
    );
    if let Some(n) = &c.network {
        line += &format!(" --network {n}");
    }
    if let Some(load) = &c.load {
        line += &format!(" --load {load}");
    }
    if let Some(rate) = c.rate {
        line += &format!(" --rate {rate}");
    }
    if let Some(k) = c.outstanding {
        line += &format!(" --outstanding {k}");
    }
    if !c.server_regions.is_empty() {
        line += &format!(" --server-regions {}", c.server_regions.join(","));
    }
    if !c.client_regions.is_empty() {
        line += &format!(" --client-regions {}", c.client_regions.join(","));
    }
    if let Some(placement) = &c.replica_placement {
        line += &format!(" --replica-placement {placement}");
    }
    if let Some(n) = c.regions {
        line += &format!(" --regions {n}");
    }
    if let Some(clock) = &c.clock {
        line += &format!(" --clock {clock}");
    }
    if let Some(k) = c.keys_per_shard {
        line += &format!(" --keys-per-shard {k}");
    }
    if let Some(z) = c.zipf {
        line += &format!(" --zipf {z}");
    }
    if let Some(k) = c.ops_max {
        line += &format!(" --ops-max {k}");
    }
    if let Some(d) = &c.distribution {
        line += &format!(" --distribution {d}");
    }
    if let Some(g) = c.region_groups {
        line += &format!(" --region-groups {g}");
    }
    if let Some(n) = c.warehouses_per_shard {
        line += &format!(" --warehouses-per-shard {n}");
    }
    if let Some(p) = c.remote_item_pct {
        line += &format!(" --remote-item-pct {p}");
    }
    if let Some(p) = c.remote_payment_pct {
        line += &format!(" --remote-payment-pct {p}");
    }
    if let Some(m) = &c.tpcc_mode {
        line += &format!(" --tpcc-mode {m}");
    }
    if let Some(s) = &c.tpcc_scale {
        line += &format!(" --tpcc-scale {s}");
    }
    for option in &c.protocol_option {
        line += &format!(" --protocol-option {option}");
    }
    if args.time_limit_s != TIME_LIMIT_S_DEFAULT {
        line += &format!(" --time-limit-s {}", args.time_limit_s);
    }
    if let Some(n) = args.attempts_max {
        line += &format!(" --attempts-max {n}");
    }
    if args.faults {
        line += " --faults";
    }
    if args.durability_oracle {
        line += " --durability-oracle";
    }
    for fault in &c.fault {
        line += &format!(" --fault '{fault}'");
    }
    line + &format!(" --seed {seed}")
}

/// Replays a failed seed with its event tail kept, and prints the tail. The replay must give
/// the same trace hash; a different one is reported (it would mean non-determinism).
fn print_failure_trace(
    options: &SimRunOptions,
    report: &SimRunReport,
    workload: Arc<dyn meridian_workloads::Workload>,
) {
    let mut replay = options.clone();
    replay.trace_tail = FAILURE_TRACE_EVENTS;
    match run_sim(&replay, workload) {
        Ok(again) if again.trace_hash == report.trace_hash => {
            say!("  last {} events:", again.trace_tail.len());
            for line in &again.trace_tail {
                say!("    {line}");
            }
        }
        Ok(again) => say!(
            "  replay diverged: trace hash {:016x} instead of {:016x} (non-determinism)",
            again.trace_hash,
            report.trace_hash
        ),
        Err(e) => say!("  replay failed: {e}"),
    }
}

fn print_checks(report: &SimRunReport) {
    for check in &report.checks {
        say!(
            "check {:<20} {}  {}",
            check.name,
            if check.passed { "PASS" } else { "FAIL" },
            check.detail
        );
    }
}

fn parse_seeds(text: &str) -> Result<(u64, u64), ConfigError> {
    let bad = || ConfigError::new(format!("--seeds takes A..B (B excluded, A < B), got '{text}'"));
    let (a, b) = text.split_once("..").ok_or_else(bad)?;
    let (a, b): (u64, u64) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
    if a >= b {
        return Err(bad());
    }
    if b - a > SWARM_SEEDS_MAX {
        return Err(ConfigError::new(format!("--seeds covers more than {SWARM_SEEDS_MAX} seeds")));
    }
    Ok((a, b))
}

/// The `--fault` schedule, checked against the layout, the time limit and what the protocol
/// may lose: the simulator loses what a crashed node had not synced, so a crash of a node the
/// protocol cannot lose (an unreplicated shard's) would fail its checks for the schedule's
/// sake.
fn fault_schedule(
    args: &SimArgs,
    r: &Resolved,
    topology: &Topology,
) -> Result<FaultSchedule, ConfigError> {
    if args.faults && !r.faults.is_empty() {
        return Err(ConfigError::new(
            "--faults draws a schedule from each seed; --fault gives one: choose one of them",
        ));
    }
    let leaders = r.protocol.initial_leaders(topology, &r.protocol_options);
    let time_limit_ns = args.time_limit_s.saturating_mul(NS_PER_S);
    let schedule = FaultSchedule::parse(&r.faults, topology, &leaders, time_limit_ns)?;
    for fault in schedule.faults() {
        if let meridian_core::fault::FaultKind::Crash { node, .. } = fault.kind {
            if !r.protocol.may_crash(topology, node) {
                return Err(ConfigError::new(format!(
                    "fault '{}': {} may lose acknowledged data when node {node} crashes on this \
                     layout (it would lose what it had not synced); crash a replica of a \
                     replicated shard",
                    fault.text,
                    r.protocol.name()
                )));
            }
        }
    }
    Ok(schedule)
}

/// `meridian sim`. One piece (about 140 lines): the command's sequence (resolve, check,
/// then a swarm or one seed with its printed report), whose steps share the resolved
/// settings; the seed options, the fault schedule and the report pieces live in helpers.
pub fn sim(args: &SimArgs) -> Result<(), Failure> {
    let r = args.cluster.resolve(if args.seeds.is_some() { 8 } else { 24 })?;
    let regions = &r.network.regions;
    let mut servers = region_ids(regions, &r.server_regions, "--server-regions")?;
    if servers.is_empty() {
        servers = (0..regions.len() as u32).map(meridian_core::RegionId).collect();
    }
    let topology = Topology::placed_with(
        regions.clone(),
        &servers,
        r.shards,
        r.replicas,
        r.replica_placement,
    )?;
    let client_regions = region_ids(regions, &r.client_regions, "--client-regions")?;
    if topology.coordinators_in(&client_regions).is_empty() {
        return Err(ConfigError::new("--client-regions: no coordinator runs there").into());
    }
    let workload: Arc<dyn meridian_workloads::Workload> =
        Arc::from(meridian_workloads::build(&r.workload, &r.workload_options)?);
    let schedule = fault_schedule(args, &r, &topology)?;
    if let Some(seeds) = &args.seeds {
        if args.cluster.seed.is_some() {
            return Err(ConfigError::new("--seed and --seeds contradict each other").into());
        }
        if args.history.is_some() {
            return Err(
                ConfigError::new("--history records one seed; it cannot go with --seeds").into()
            );
        }
        if args.out.is_some() {
            return Err(ConfigError::new(
                "--out writes one seed's statistics; it cannot go with --seeds",
            )
            .into());
        }
        let range = parse_seeds(seeds)?;
        let jobs = args.jobs.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        });
        if jobs == 0 || jobs > JOBS_MAX {
            return Err(ConfigError::new(format!("--jobs must be in 1..={JOBS_MAX}")).into());
        }
        let txns = args.txns.unwrap_or(200);
        if txns == 0 {
            return Err(ConfigError::new("--txns must be at least 1").into());
        }
        // Fail fast on a bad layout before any worker starts.
        r.protocol.check_topology(&topology)?;
        r.protocol.check_workload(&meridian_workloads::sample(workload.as_ref()), &topology)?;
        return if jobs == 1 {
            swarm_worker(args, &r, (&topology, &schedule), workload, range, txns)
        } else {
            swarm_parent(range, jobs)
        };
    }
    if args.jobs.is_some() {
        return Err(ConfigError::new("--jobs applies to swarms (--seeds A..B)").into());
    }
    let txns = args.txns.unwrap_or(2_000);
    if txns == 0 {
        return Err(ConfigError::new("--txns must be at least 1").into());
    }
    let (mut options, plan) = seed_options(&r, args, &topology, r.seed, txns, &schedule);
    options.keep_history = args.history.is_some();
    options.trace_tail = args.trace.unwrap_or(0);
    if let Some(plan) = &plan {
        say!("faults: {plan}");
    }
    let started = Instant::now();
    let report = run_sim(&options, workload.clone())?;
    let wall_s = started.elapsed().as_secs_f64();
    say!(
        "seed {}: {} committed, {} user aborts, {} failed, {} retries, {} cross-shard; latency p50 {:.1} ms p99 {:.1} ms (virtual)",
        report.seed,
        report.committed,
        report.user_aborted,
        report.failed,
        report.retries,
        report.cross_shard,
        report.latency_ns_p50 as f64 / 1e6,
        report.latency_ns_p99 as f64 / 1e6,
    );
    let s = &report.stats;
    say!(
        "virtual {:.2} s, wall {:.2} s, {} deliveries ({:.1} per commit, {:.0} per wall second), {} lost, {} blocked, {} duplicated, {} reordered, {} events",
        report.virtual_ns as f64 / 1e9,
        wall_s,
        s.deliveries,
        s.deliveries as f64 / report.committed.max(1) as f64,
        s.deliveries as f64 / wall_s.max(1e-9),
        s.lost,
        s.blocked,
        s.duplicated,
        s.reordered,
        s.events,
    );
    let output = sim_output(&r, &options, &report, &workload.registry());
    say!("{}", meridian_bench::report::paths_line(&output.summary));
    if let Some(line) = meridian_bench::report::lock_wait_line(&output.protocol_counters) {
        say!("{line}");
    }
    print_checks(&report);
    say!("trace hash {:016x}", report.trace_hash);
    if let Some(dir) = &args.out {
        let folder = meridian_bench::report::write_results(dir, &output)
            .map_err(|e| Failure::Run(format!("cannot write results: {e}")))?;
        say!("results: {}", folder.join("stats.json").display());
    }
    if !report.trace_tail.is_empty() {
        say!("last {} events:", report.trace_tail.len());
        for line in &report.trace_tail {
            say!("  {line}");
        }
    }
    if let Some(path) = &args.history {
        match &report.history_json {
            Some(json) => std::fs::write(path, json).map_err(|e| {
                Failure::Run(format!("cannot write the history to {}: {e}", path.display()))
            })?,
            None => {
                return Err(Failure::Run(format!(
                    "workload {} records no history; use list-append or rw-register",
                    r.workload
                )))
            }
        }
        say!("history: {}", path.display());
    }
    if !report.passed() {
        if report.trace_tail.is_empty() {
            print_failure_trace(&options, &report, workload);
        }
        say!("REPRODUCE: {}", reproduce(&args.cluster, args, &r, report.seed, txns));
        return Err(Failure::Run("the run failed a check".into()));
    }
    Ok(())
}

/// The run as `bench` reports one: the statistics of every request over the virtual time the
/// run took, with the wide-area round trips the simulator counted.
fn sim_output(
    r: &Resolved,
    options: &SimRunOptions,
    report: &SimRunReport,
    registry: &meridian_core::txn::Registry,
) -> meridian_bench::run::RunOutput {
    let start = meridian_sim::SIM_EPOCH_NS;
    let mut stats = meridian_bench::stats::RunStats::new(start, start + report.virtual_ns.max(1));
    stats.name_types(registry);
    stats.set_latency_bounds(
        options.topology.shards,
        meridian_bench::stats::latency_bounds(
            options.protocol,
            &options.topology,
            &options.network,
            &options.protocol_options,
        ),
    );
    for (completion, hops) in &report.completions {
        stats.add(completion, Some(*hops));
    }
    let parameters = serde_json::json!({
        "mode": "simulated",
        "protocol": r.protocol.name(),
        "protocol_options": r
            .protocol_options
            .iter()
            .map(|(name, value)| (name.to_string(), serde_json::Value::String(value.to_string())))
            .collect::<serde_json::Map<_, _>>(),
        "workload": { "name": r.workload },
        "shards": r.shards,
        "replicas": r.replicas,
        "network": {
            "name": r.network.name,
            "regions": r.network.regions,
            "owd_ms_max": r.network.owd_ns_max() as f64 / 1e6,
        },
        "clock": r.clock.name,
        "load": r.load.describe(r.clients, r.outstanding),
        "server_regions": r.server_regions,
        "replica_placement": r.replica_placement.name(),
        "client_regions": r.client_regions,
        "clients": r.clients,
        "txns": options.txns,
        "seed": report.seed,
        "virtual_s": report.virtual_ns as f64 / 1e9,
        "trace_hash": format!("{:016x}", report.trace_hash),
        "meridian_version": env!("CARGO_PKG_VERSION"),
        "provenance": meridian_bench::provenance::provenance(),
    });
    let mut summary = stats.summary();
    summary.deliveries_per_commit =
        (report.committed > 0).then(|| report.stats.deliveries as f64 / report.committed as f64);
    let mut output = meridian_bench::run::RunOutput {
        parameters,
        summary,
        first_failure: stats.first_failure.clone(),
        checks: report.checks.clone(),
        checks_note: None,
        load: None,
        links: Vec::new(),
        messages_dropped: 0,
        node_panics: Vec::new(),
        protocol_counters: std::collections::BTreeMap::new(),
        faults_applied: Vec::new(),
        messages_cut: 0,
        history_json: report.history_json.clone(),
    };
    output
        .set_counters(meridian_bench::run::counters_total(report.node_counters.values().cloned()));
    output
}

/// Runs seeds in this process and prints one line per failure and a summary line.
fn swarm_worker(
    args: &SimArgs,
    r: &Resolved,
    (topology, schedule): (&Topology, &FaultSchedule),
    workload: Arc<dyn meridian_workloads::Workload>,
    (first, end): (u64, u64),
    txns: u64,
) -> Result<(), Failure> {
    let started = Instant::now();
    let mut failed = Vec::new();
    for seed in first..end {
        let (options, plan) = seed_options(r, args, topology, seed, txns, schedule);
        // A panic in a node (an assertion, or raft-rs refusing a log that lost entries) fails
        // this seed and the swarm goes on.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_sim(&options, workload.clone())
        }));
        let report = match outcome {
            Ok(report) => report?,
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("a panic");
                say!("FAIL seed {seed}: panic: {message}");
                say!("  faults: {}", plan.as_deref().unwrap_or("none"));
                say!("REPRODUCE: {}", reproduce(&args.cluster, args, r, seed, txns));
                failed.push(seed);
                continue;
            }
        };
        if !report.passed() {
            let reasons: Vec<String> = report
                .checks
                .iter()
                .filter(|c| !c.passed)
                .map(|c| format!("{}: {}", c.name, c.detail))
                .collect();
            say!("FAIL seed {seed}: {}", reasons.join("; "));
            say!("  faults: {}", plan.as_deref().unwrap_or("none"));
            say!("  trace hash {:016x}", report.trace_hash);
            print_failure_trace(&options, &report, workload.clone());
            say!("REPRODUCE: {}", reproduce(&args.cluster, args, r, seed, txns));
            failed.push(seed);
        }
    }
    let wall_s = started.elapsed().as_secs_f64();
    let seeds = end - first;
    say!(
        "SWARM {} seeds {first}..{end}: {} passed, {} failed in {:.1} s ({:.0} seeds per minute)",
        r.protocol.name(),
        seeds - failed.len() as u64,
        failed.len(),
        wall_s,
        seeds as f64 * 60.0 / wall_s.max(1e-9)
    );
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Failure::Run(format!("{} seeds failed", failed.len())))
    }
}

/// Splits the seeds over `jobs` worker processes (this binary with `--jobs 1`), relays their
/// failure lines and sums their results.
fn swarm_parent((first, end): (u64, u64), jobs: usize) -> Result<(), Failure> {
    let exe = std::env::current_exe()
        .map_err(|e| Failure::Run(format!("cannot find this executable: {e}")))?;
    // The worker gets this command line with its own seed range and one job.
    let mut base: Vec<String> = Vec::new();
    let mut given = std::env::args().skip(1);
    while let Some(arg) = given.next() {
        match arg.as_str() {
            "--seeds" | "--jobs" => {
                given.next();
            }
            a if a.starts_with("--seeds=") || a.starts_with("--jobs=") => {}
            _ => base.push(arg),
        }
    }
    let started = Instant::now();
    let seeds = end - first;
    let jobs = (jobs as u64).min(seeds);
    let mut children = Vec::new();
    for j in 0..jobs {
        let a = first + seeds * j / jobs;
        let b = first + seeds * (j + 1) / jobs;
        let child = Command::new(&exe)
            .args(&base)
            .args(["--seeds", &format!("{a}..{b}"), "--jobs", "1"])
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| Failure::Run(format!("cannot start a swarm worker: {e}")))?;
        children.push(child);
    }
    let mut failed = 0u64;
    let mut broken = 0u64;
    for mut child in children {
        let stdout = child.stdout.take().expect("piped");
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("SWARM ") {
                continue;
            }
            if line.starts_with("FAIL seed ") {
                failed += 1;
            }
            say!("{line}");
        }
        let status =
            child.wait().map_err(|e| Failure::Run(format!("a swarm worker vanished: {e}")))?;
        if !status.success() && status.code() != Some(1) {
            broken += 1;
        }
    }
    let wall_s = started.elapsed().as_secs_f64();
    say!(
        "SWARM seeds {first}..{end} in {jobs} processes: {} passed, {failed} failed in {:.1} s ({:.0} seeds per minute)",
        seeds - failed,
        wall_s,
        seeds as f64 * 60.0 / wall_s.max(1e-9)
    );
    if broken > 0 {
        return Err(Failure::Run(format!("{broken} swarm workers exited abnormally")));
    }
    if failed > 0 {
        return Err(Failure::Run(format!("{failed} seeds failed")));
    }
    Ok(())
}

/// `meridian check HISTORY`.
pub fn check_history(args: &CheckArgs) -> Result<(), Failure> {
    let model = Model::parse(&args.model).map_err(ConfigError::new)?;
    let consistency = Consistency::parse(&args.consistency).map_err(ConfigError::new)?;
    let path = &args.history;
    let size = std::fs::metadata(path)
        .map_err(|e| ConfigError::new(format!("cannot read {}: {e}", path.display())))?
        .len();
    if size > HISTORY_BYTES_MAX {
        return Err(ConfigError::new(format!(
            "{} is larger than {HISTORY_BYTES_MAX} bytes",
            path.display()
        ))
        .into());
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(format!("cannot read {}: {e}", path.display())))?;
    let started = Instant::now();
    let history = History::parse(&text, model)
        .map_err(|e| ConfigError::new(format!("{}: {e}", path.display())))?;
    let parsed_s = started.elapsed().as_secs_f64();
    let (report, txns) = meridian_check::check(&history, model, consistency)
        .map_err(|e| ConfigError::new(format!("{}: {e}", path.display())))?;
    say_raw!("{}", report.render(&history, &txns));
    say!(
        "{} operations, {} transactions; parsed in {:.2} s, checked in {:.2} s",
        history.ops.len(),
        txns.len(),
        parsed_s,
        started.elapsed().as_secs_f64() - parsed_s
    );
    if report.valid {
        Ok(())
    } else {
        Err(Failure::Run(format!("the history is not {}", consistency.name())))
    }
}
