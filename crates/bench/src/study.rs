//! A results folder of one or more runs, and its report: `report.md` (a table with a row per
//! run, the setup, each run's details) and the plots of [`crate::plots`]. Everything is drawn
//! from the runs' `stats.json` files, so `meridian report DIR` regenerates it at any time and
//! `meridian report --compare A B` puts two folders side by side.
//!
//! A folder holds its runs as `DIR/stats.json` (a single run) and/or `DIR/runs/*/stats.json`
//! (a comparison or sweep, in name order).

use crate::run::RunOutput;
pub use crate::saved::{SavedCheck, SavedRun};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Most runs one report reads (a sweep beyond it is split into several folders).
pub const RUNS_MAX: usize = 10_000;

/// Writes one run's `stats.json` (and `history.json`) into `dir`, which must not exist yet.
pub fn write_run(dir: &Path, output: &RunOutput) -> std::io::Result<()> {
    if dir.exists() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} exists; results are never overwritten", dir.display()),
        ));
    }
    std::fs::create_dir_all(dir)?;
    let json = serde_json::to_string_pretty(output).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("stats.json"), json)?;
    if let Some(history) = &output.history_json {
        std::fs::write(dir.join("history.json"), history)?;
    }
    Ok(())
}

/// The runs of a results folder, in order.
pub fn load_runs(dir: &Path) -> Result<Vec<(PathBuf, SavedRun)>, String> {
    let mut paths = Vec::new();
    let single = dir.join("stats.json");
    if single.is_file() {
        paths.push(single);
    }
    let runs = dir.join("runs");
    if runs.is_dir() {
        let mut found: Vec<PathBuf> = std::fs::read_dir(&runs)
            .map_err(|e| format!("{}: {e}", runs.display()))?
            .filter_map(|entry| entry.ok().map(|e| e.path().join("stats.json")))
            .filter(|p| p.is_file())
            .collect();
        found.sort();
        paths.extend(found);
    }
    if paths.is_empty() {
        return Err(format!("{}: no stats.json, and no runs/*/stats.json", dir.display()));
    }
    if paths.len() > RUNS_MAX {
        return Err(format!(
            "{}: {} runs, at most {RUNS_MAX} per report",
            dir.display(),
            paths.len()
        ));
    }
    paths.into_iter().map(|p| SavedRun::load(&p).map(|r| (p, r))).collect()
}

/// The repetitions of one point (runs with the same label), and the one whose throughput is
/// the median, which stands for them in plots and sweep tables.
pub struct Repeated<'a> {
    /// Every repetition, in order.
    pub members: Vec<&'a SavedRun>,
    /// The repetition of median throughput (the lower median for an even count).
    pub median: &'a SavedRun,
}

impl Repeated<'_> {
    /// The checks of every repetition: the median's verdict, or the first failing one's.
    pub fn checks_verdict(&self) -> String {
        let failing = self.members.iter().position(|r| r.checks.iter().any(|c| !c.passed));
        match failing {
            Some(i) if self.members.len() > 1 => {
                format!("{} (repetition {})", self.members[i].checks_verdict(), i + 1)
            }
            Some(i) => self.members[i].checks_verdict(),
            None => self.median.checks_verdict(),
        }
    }

    /// "" for one run; "1,234 .. 1,456 over 3 runs" (the spread of throughput) otherwise.
    pub fn spread(&self) -> String {
        if self.members.len() < 2 {
            return String::new();
        }
        let tps = self.members.iter().map(|r| r.summary.throughput_txn_per_s);
        let (lo, hi) = tps.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
        format!("{lo:.1} .. {hi:.1} over {} runs", self.members.len())
    }
}

/// Groups the repetitions of each point (runs with a `repetition` parameter and the same
/// label), in first-appearance order; every other run stands alone.
pub fn repeated(runs: &[SavedRun]) -> Vec<Repeated<'_>> {
    let mut groups: Vec<(Option<String>, Vec<&SavedRun>)> = Vec::new();
    for run in runs {
        let key = run.parameters.get("repetition").map(|_| run.label());
        match groups.iter_mut().find(|(k, _)| key.is_some() && *k == key) {
            Some((_, members)) => members.push(run),
            None => groups.push((key, vec![run])),
        }
    }
    groups
        .into_iter()
        .map(|(_, members)| {
            let mut by_tps = members.clone();
            by_tps.sort_by(|a, b| {
                a.summary.throughput_txn_per_s.total_cmp(&b.summary.throughput_txn_per_s)
            });
            let median = by_tps[(by_tps.len() - 1) / 2];
            Repeated { members, median }
        })
        .collect()
}

/// The table of runs: a row per run (per point, with the median repetition's figures and the
/// spread of throughput when points were repeated).
pub fn runs_table(runs: &[SavedRun]) -> String {
    let mut text = String::new();
    let groups = repeated(runs);
    let width = runs.iter().map(|r| r.label().len()).max().unwrap_or(0).max(8);
    let _ = writeln!(
        text,
        "{:<width$} {:>11} {:>9} {:>9} {:>9} {:>8} {:>10}  checks",
        "run", "txn/s", "p50 ms", "p99 ms", "p99.9 ms", "abort %", "WRTT p50"
    );
    for group in &groups {
        let run = group.median;
        let s = &run.summary;
        let spread = group.spread();
        let _ = writeln!(
            text,
            "{:<width$} {:>11.1} {:>9.2} {:>9.2} {:>9.2} {:>8.2} {:>10}  {}{}",
            run.label(),
            s.throughput_txn_per_s,
            s.latency_ms_p50,
            s.latency_ms_p99,
            s.latency_ms_p999,
            s.abort_rate * 100.0,
            s.wrtt_p50.map_or("-".into(), |w| format!("{w}")),
            group.checks_verdict(),
            if spread.is_empty() { String::new() } else { format!("; txn/s {spread}") }
        );
    }
    text
}

/// Groups of runs that differ only in clients and network, in first-appearance order, named
/// by their title; a group in which two runs share a client count and a network (they differ
/// in something else the title does not show) is left out rather than mixed.
fn sweep_groups(runs: &[SavedRun]) -> Vec<(String, Vec<&SavedRun>)> {
    let mut groups: Vec<(String, Vec<&SavedRun>)> = Vec::new();
    for run in runs {
        let key = run.group();
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(run),
            None => groups.push((key, vec![run])),
        }
    }
    groups.retain(|(_, members)| {
        let cells: std::collections::BTreeSet<(u64, String)> =
            members.iter().map(|r| (r.clients(), r.network())).collect();
        members.len() > 1 && cells.len() == members.len()
    });
    let mut titled: Vec<(String, Vec<&SavedRun>)> = Vec::new();
    for (_, members) in groups {
        let mut title = members[0].group_title();
        if titled.iter().any(|(t, _)| *t == title) {
            title = format!("{title} (#{})", titled.len() + 1);
        }
        titled.push((title, members));
    }
    titled
}

/// The references' layout for a sweep: per group, rows = clients, columns = networks, cells
/// = throughput and median latency. Empty when no two runs differ only in those.
pub fn sweep_tables(runs: &[SavedRun]) -> String {
    let mut md = String::new();
    for (group, members) in sweep_groups(runs) {
        let mut networks: Vec<String> = Vec::new();
        for run in &members {
            if !networks.contains(&run.network()) {
                networks.push(run.network());
            }
        }
        let clients: std::collections::BTreeSet<u64> =
            members.iter().map(|r| r.clients()).collect();
        let _ = writeln!(md, "### {group}\n");
        let _ = writeln!(md, "| clients | {} |", networks.join(" | "));
        let _ = writeln!(md, "|---|{}", "---|".repeat(networks.len()));
        for count in clients {
            let cells: Vec<String> = networks
                .iter()
                .map(|net| {
                    members.iter().find(|r| r.clients() == count && r.network() == *net).map_or(
                        "-".into(),
                        |r| {
                            format!(
                                "{:.0} txn/s, p50 {:.1} ms",
                                r.summary.throughput_txn_per_s, r.summary.latency_ms_p50
                            )
                        },
                    )
                })
                .collect();
            let _ = writeln!(md, "| {count} | {} |", cells.join(" | "));
        }
        let _ = writeln!(md);
    }
    md
}

/// Lines across client counts, one per group and network: `(clients, txn/s)` and
/// `(txn/s, p50 ms)`. Empty when no group has two client counts on one network.
type Curves = Vec<(String, Vec<(f64, f64)>)>;
fn sweep_curves(runs: &[SavedRun]) -> (Curves, Curves) {
    let (mut by_clients, mut latency) = (Vec::new(), Vec::new());
    for (group, members) in sweep_groups(runs) {
        let mut networks: Vec<String> = members.iter().map(|r| r.network()).collect();
        networks.dedup();
        networks.sort();
        networks.dedup();
        for net in networks {
            let mut points: Vec<&SavedRun> =
                members.iter().copied().filter(|r| r.network() == net).collect();
            if points.len() < 2 {
                continue;
            }
            points.sort_by_key(|r| r.clients());
            let label = format!("{group}, {net}");
            by_clients.push((
                label.clone(),
                points
                    .iter()
                    .map(|r| (r.clients() as f64, r.summary.throughput_txn_per_s))
                    .collect(),
            ));
            latency.push((
                label,
                points
                    .iter()
                    .map(|r| (r.summary.throughput_txn_per_s, r.summary.latency_ms_p50))
                    .collect(),
            ));
        }
    }
    (by_clients, latency)
}

/// One line per sweep curve: its peak throughput and the median latency at its ankle
/// ([`crate::ankle`]), with the client counts where they fall.
fn peak_ankle_table(by_clients: &Curves, latency: &Curves) -> String {
    let mut md = String::from(
        "## Peak and ankle\n\nThe peak is the highest throughput of the sweep; the ankle is the last \
         point before the median latency climbs steeply (more than 25%, and by more than \
         throughput grows; docs/benchmarking.md, \"Peak and ankle\").\n\n\
         | sweep | peak txn/s | at clients | ankle p50 ms | at clients | txn/s there |\n\
         |---|---|---|---|---|---|\n",
    );
    for ((label, clients), (_, points)) in by_clients.iter().zip(latency) {
        let Some(pa) = crate::ankle::peak_and_ankle(points) else { continue };
        let _ = writeln!(
            md,
            "| {label} | {:.1} | {} | {:.2} | {} | {:.1} |",
            pa.peak_txn_per_s,
            clients[pa.peak].0,
            pa.ankle_p50_ms,
            clients[pa.ankle].0,
            pa.ankle_txn_per_s
        );
    }
    md.push('\n');
    md
}

/// Writes `report.md` and the plots into `dir` from `runs`. One piece (about 190 lines):
/// it is the report's outline, section after section in the order the reader meets them;
/// the sections that compute something (sweeps, faults, references) are helpers.
pub fn write_report(dir: &Path, all_runs: &[SavedRun]) -> Result<PathBuf, String> {
    let groups = repeated(all_runs);
    // Plots and sweep tables show each point once, by its median repetition.
    let runs: Vec<SavedRun> = groups.iter().map(|g| g.median.clone()).collect();
    let runs = runs.as_slice();
    let setups: std::collections::BTreeSet<String> = runs.iter().map(SavedRun::setup).collect();
    let title = match setups.len() {
        1 => setups.iter().next().cloned().unwrap_or_default(),
        n => format!("{n} setups"),
    };
    let bars: Vec<(String, f64)> =
        runs.iter().map(|r| (r.label(), r.summary.throughput_txn_per_s)).collect();
    crate::plots::throughput_bars(
        &dir.join("throughput"),
        &format!("Committed throughput: {title}"),
        &bars,
    )?;
    let cdfs: Vec<(String, Vec<(f64, f64)>)> = runs
        .iter()
        .filter(|r| !r.summary.latency_cdf_ms.is_empty())
        .map(|r| (r.label(), r.summary.latency_cdf_ms.clone()))
        .collect();
    crate::plots::latency_cdf(
        &dir.join("latency-cdf"),
        &format!("Commit latency: {title}"),
        &cdfs,
    )?;
    let series: Vec<(String, Vec<(f64, f64)>)> = runs
        .iter()
        .map(|r| {
            let points = r.summary.series.iter().map(|s| (f64::from(s.second), s.committed as f64));
            (r.label(), points.collect())
        })
        .collect();
    crate::plots::time_series(
        &dir.join("timeseries"),
        &format!("Throughput over time: {title}"),
        &series,
    )?;

    let (by_clients, latency_curves) = sweep_curves(runs);
    if !by_clients.is_empty() {
        let axes = ("clients", "committed txn/s");
        crate::plots::lines(
            &dir.join("throughput-vs-clients"),
            "Throughput against clients",
            axes,
            &by_clients,
        )?;
        let axes = ("committed txn/s", "p50 latency (ms)");
        crate::plots::lines(
            &dir.join("throughput-latency"),
            "Throughput and latency",
            axes,
            &latency_curves,
        )?;
    }
    let mut md = String::new();
    let _ = writeln!(md, "# Meridian benchmark report\n");
    let _ = writeln!(
        md,
        "{} run(s): {}.\n",
        runs.len(),
        setups.into_iter().collect::<Vec<_>>().join("; ")
    );
    let _ = writeln!(
        md,
        "| # | run | txn/s | p50 ms | p99 ms | p99.9 ms | mean ms | abort % | retries by cause | WRTT p50 | checks | repetitions |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (number, group) in groups.iter().enumerate() {
        let run = group.median;
        let s = &run.summary;
        let causes: Vec<String> = s.abort_causes.iter().map(|(c, n)| format!("{c} {n}")).collect();
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} |",
            number + 1,
            run.label(),
            s.throughput_txn_per_s,
            s.latency_ms_p50,
            s.latency_ms_p99,
            s.latency_ms_p999,
            s.latency_ms_mean,
            s.abort_rate * 100.0,
            if causes.is_empty() { "-".into() } else { causes.join(", ") },
            s.wrtt_p50.map_or("-".into(), |w| format!("{w}")),
            group.checks_verdict(),
            match group.spread() {
                spread if spread.is_empty() => "1".to_string(),
                spread => format!("median of {spread}"),
            }
        );
    }
    let _ = writeln!(
        md,
        "\n![committed throughput](throughput.png)\n\n![latency CDF](latency-cdf.png)\n\n![throughput over time](timeseries.png)\n"
    );
    md += &fault_section(dir, runs)?;
    md += &reference_section(dir, runs)?;
    let tables = sweep_tables(runs);
    if !tables.is_empty() {
        let _ = writeln!(md, "## The sweep: rows are clients, columns are networks\n\n{tables}");
    }
    if !by_clients.is_empty() {
        let _ = writeln!(
            md,
            "![throughput against clients](throughput-vs-clients.png)\n\n![throughput and latency](throughput-latency.png)\n"
        );
        md += &peak_ankle_table(&by_clients, &latency_curves);
    }
    let _ = writeln!(md, "## How to read it\n");
    let loads: std::collections::BTreeSet<&str> =
        all_runs.iter().filter_map(|r| r.parameters["load"].as_str()).collect();
    for load in &loads {
        let _ = writeln!(md, "- **load**: {load}.");
    }
    let _ = writeln!(
        md,
        "- **txn/s**: requests committed per second of the measurement window (warm-up \
         dropped).\n\
         - **latency**: from the client's submission (under an open loop, from the request's \
         arrival, however long it waited for a client) to its reply, retries included, of \
         committed requests; for protocols that acknowledge speculatively this is the durable \
         latency.\n\
         - **abort %**: retried attempts per attempt; **retries by cause** names why.\n\
         - **WRTT p50**: wide-area round trips on the critical path of the median commit, \
         counted by the simulator (`-` in real-time runs, which do not count them).\n\
         - **checks**: the workload's invariants after the run; a failed check means the \
         figures of that run are not to be trusted.\n"
    );
    for run in all_runs {
        let s = &run.summary;
        match run.parameters["repetition"].as_u64() {
            Some(k) => {
                let _ = writeln!(md, "## {} (repetition {k})\n", run.label());
            }
            None => {
                let _ = writeln!(md, "## {}\n", run.label());
            }
        }
        let _ = writeln!(md, "- setup: {}", run.setup());
        let _ = writeln!(md, "- {}", crate::report::paths_line(s));
        let _ = writeln!(
            md,
            "- window {:.1} s, {} committed, {} retried attempts, {} user aborts, {} failed",
            s.window_s, s.committed, s.retries, s.user_aborted, s.failed
        );
        if let Some(us) = s.cpu_us_per_txn {
            let _ = writeln!(md, "- CPU {us:.1} µs per committed transaction (this process)");
        }
        if let Some(per) = s.deliveries_per_commit {
            let _ = writeln!(md, "- {per:.1} messages delivered per commit (the whole run)");
        }
        if let Some(failure) = &run.first_failure {
            let _ = writeln!(md, "- first failure: {failure}");
        }
        if s.by_type.len() > 1 {
            let _ = writeln!(md, "\n| type | committed | retries | user aborts | failed | p50 ms | p99 ms | p99.9 ms | max ms |");
            let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
            for (name, t) in &s.by_type {
                let _ = writeln!(
                    md,
                    "| {name} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
                    t.committed,
                    t.retries,
                    t.user_aborted,
                    t.failed,
                    t.latency_ms_p50,
                    t.latency_ms_p99,
                    t.latency_ms_p999,
                    t.latency_ms_max
                );
            }
            let _ = writeln!(md);
        }
        for check in &run.checks {
            let verdict = if check.passed { "PASS" } else { "FAIL" };
            let _ = writeln!(md, "- check {} {verdict}: {}", check.name, check.detail);
        }
        let _ = writeln!(md);
    }
    let path = dir.join("report.md");
    std::fs::write(&path, md).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// The report's comparison with published figures, when the folder holds the reference file
/// its experiment came with (`reference.toml`); empty otherwise.
fn reference_section(dir: &Path, runs: &[SavedRun]) -> Result<String, String> {
    let path = dir.join(REFERENCE_FILE);
    if !path.is_file() {
        return Ok(String::new());
    }
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let reference = crate::reference::Reference::parse(&text, &path.display().to_string())?;
    Ok(crate::reference::section(&reference, runs))
}

/// The name a results folder keeps its experiment's reference file under.
pub const REFERENCE_FILE: &str = "reference.toml";

/// The report's section on runs with scheduled faults: their timeline plot (`faults.png`,
/// throughput and p99 in short buckets, the faults of the first such run marked) and, per run
/// and fault, the throughput before it, the first commit after it and the recovery to 90%.
/// Empty when no run had faults.
fn fault_section(dir: &Path, runs: &[SavedRun]) -> Result<String, String> {
    let timed: Vec<(&SavedRun, &crate::timeline::TimelineSummary)> =
        runs.iter().filter_map(|r| Some((r, r.summary.timeline.as_ref()?))).collect();
    let Some((_, first)) = timed.first() else { return Ok(String::new()) };
    let marks: Vec<(f64, String)> =
        first.faults.iter().enumerate().map(|(i, f)| (f.at_s, format!("{}", i + 1))).collect();
    let lines: Vec<(String, Vec<crate::timeline::TimelinePoint>)> =
        timed.iter().map(|(r, t)| (r.label(), t.points.clone())).collect();
    crate::plots::fault_timeline(
        &dir.join("faults"),
        "Runs with faults over time",
        &lines,
        &marks,
    )?;
    let mut md = String::from(
        "## Faults

",
    );
    let _ = writeln!(
        md,
        "Buckets of {:.0} ms; the first commit counts transactions submitted after the fault; \
         recovery is the end of the first 500 ms window back at 90% of the 5 s before the fault \
         (docs/benchmarking.md, \"Faults\").\n",
        first.bucket_ms
    );
    let _ =
        writeln!(md, "| run | # | fault | at s | txn/s before | first commit s | back to 90% s |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    for (run, timeline) in &timed {
        for (i, v) in timeline.faults.iter().enumerate() {
            let back = match (v.dipped, v.recovered_90_s) {
                (false, Some(_)) => "no dip".to_string(),
                (_, Some(s)) => format!("{s:.2}"),
                (_, None) if v.pre_fault_txn_per_s.is_none() => "-".to_string(),
                (_, None) => "never".to_string(),
            };
            let _ = writeln!(
                md,
                "| {} | {} | `{}` | {:.2} | {} | {} | {back} |",
                run.label(),
                i + 1,
                v.fault,
                v.at_s,
                v.pre_fault_txn_per_s.map_or("-".into(), |t| format!("{t:.0}")),
                show(v.first_commit_s),
            );
        }
    }
    let _ = writeln!(md, "\n![runs with faults over time](faults.png)\n");
    Ok(md)
}

/// Two folders' runs side by side, matched by label, with the ratio B / A.
pub fn compare(a: &[SavedRun], b: &[SavedRun]) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "{:<26} {:>11} {:>11} {:>7}   {:>8} {:>8} {:>7}   {:>8} {:>8} {:>7}",
        "run", "A txn/s", "B txn/s", "B/A", "A p50", "B p50", "B/A", "A p99", "B p99", "B/A"
    );
    let ratio = |x: f64, y: f64| if x > 0.0 { format!("{:.2}", y / x) } else { "-".into() };
    // Repeated points compare by their median repetitions.
    let a: Vec<&SavedRun> = repeated(a).iter().map(|g| g.median).collect();
    let b: Vec<&SavedRun> = repeated(b).iter().map(|g| g.median).collect();
    for run_a in a.iter().copied() {
        let label = run_a.label();
        let Some(run_b) = b.iter().find(|r| r.label() == label) else {
            let _ = writeln!(text, "{label:<26} (only in A)");
            continue;
        };
        let (x, y) = (&run_a.summary, &run_b.summary);
        let _ = writeln!(
            text,
            "{:<26} {:>11.1} {:>11.1} {:>7}   {:>8.2} {:>8.2} {:>7}   {:>8.2} {:>8.2} {:>7}",
            label,
            x.throughput_txn_per_s,
            y.throughput_txn_per_s,
            ratio(x.throughput_txn_per_s, y.throughput_txn_per_s),
            x.latency_ms_p50,
            y.latency_ms_p50,
            ratio(x.latency_ms_p50, y.latency_ms_p50),
            x.latency_ms_p99,
            y.latency_ms_p99,
            ratio(x.latency_ms_p99, y.latency_ms_p99),
        );
    }
    for run_b in b.iter().filter(|r| !a.iter().any(|x| x.label() == r.label())) {
        let _ = writeln!(text, "{:<26} (only in B)", run_b.label());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::RunStats;
    use meridian_core::txn::{CommitPath, ProcId, TxnOutcome, TxnRequest, TxnResult};
    use meridian_core::{NodeId, RequestId};
    use meridian_workloads::clients::Completion;
    use meridian_workloads::CheckResult;
    use std::collections::BTreeMap;

    /// A run of `protocol` whose `n` commits each took `latency_ms`.
    fn run(protocol: &str, policy: Option<&str>, n: u64, latency_ms: u64) -> RunOutput {
        let ms = 1_000_000;
        let mut stats = RunStats::new(0, 1_000 * ms);
        for i in 0..n {
            let done = 400 * ms + i * ms;
            let outcome = TxnOutcome {
                result: TxnResult::Committed,
                outputs: vec![],
                commit_ts: None,
                retries: 0,
                aborts: Default::default(),
                shards_touched: 1,
                path: CommitPath::OnePhase,
                speculative_ns: None,
            };
            let completion = Completion {
                client: 0,
                coordinator: NodeId(0),
                request: RequestId(i),
                txn: TxnRequest { proc: ProcId(0), args: vec![] },
                submitted_at: done - latency_ms * ms,
                completed_at: done,
                outcome,
                wan_hops: None,
            };
            stats.add(&completion, None);
        }
        let options: serde_json::Map<String, serde_json::Value> =
            policy.map(|p| ("2pl-policy".to_string(), p.into())).into_iter().collect();
        RunOutput {
            parameters: serde_json::json!({
                "protocol": protocol, "protocol_options": options, "workload": {"name": "bank"},
                "shards": 2, "replicas": 1, "network": {"name": "geo"}, "clients": 8,
            }),
            summary: stats.summary(),
            first_failure: None,
            checks: vec![],
            checks_note: None,
            load: None,
            links: vec![],
            node_panics: vec![],
            messages_dropped: 0,
            protocol_counters: BTreeMap::new(),
            faults_applied: Vec::new(),
            messages_cut: 0,
            history_json: None,
        }
    }

    #[test]
    fn a_folder_of_runs_reports_a_row_and_a_plot_per_run_and_compares() {
        let dir = std::env::temp_dir().join(format!("meridian-study-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write_run(&dir.join("runs/01-occ"), &run("occ", None, 400, 5)).unwrap();
        write_run(&dir.join("runs/02-2pl"), &run("2pl", Some("wound-wait"), 200, 10)).unwrap();
        assert!(
            write_run(&dir.join("runs/01-occ"), &run("occ", None, 1, 1)).is_err(),
            "never overwritten"
        );
        let runs: Vec<SavedRun> = load_runs(&dir).unwrap().into_iter().map(|(_, r)| r).collect();
        let labels: Vec<String> = runs.iter().map(SavedRun::label).collect();
        assert_eq!(labels, ["occ", "2pl 2pl-policy=wound-wait"]);
        let report = std::fs::read_to_string(write_report(&dir, &runs).unwrap()).unwrap();
        assert!(
            report.contains("| occ | 400.0 |")
                && report.contains("| 2pl 2pl-policy=wound-wait | 200.0 |"),
            "{report}"
        );
        for plot in ["throughput", "latency-cdf", "timeseries"] {
            assert!(
                dir.join(format!("{plot}.png")).is_file()
                    && dir.join(format!("{plot}.svg")).is_file()
            );
        }
        let table = runs_table(&runs);
        assert_eq!(table.lines().count(), 3, "{table}");
        // B is twice as fast with half the latency: ratios 2.00 and 0.50.
        let faster = [SavedRun::load(&dir.join("runs/01-occ/stats.json")).unwrap()];
        let mut b = faster.clone();
        b[0].summary.throughput_txn_per_s *= 2.0;
        b[0].summary.latency_ms_p50 /= 2.0;
        let side = compare(&faster, &b);
        assert!(side.contains("2.00") && side.contains("0.50"), "{side}");
        assert!(compare(&runs, &faster).contains("2pl 2pl-policy=wound-wait  (only in A)"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_sweep_is_laid_out_as_clients_by_network_with_its_curves() {
        let dir = std::env::temp_dir().join(format!("meridian-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut index = 0;
        for net in ["metro", "geo"] {
            for clients in [1u64, 4] {
                let mut output =
                    run("occ", None, 100 * clients, if net == "geo" { 300 } else { 5 });
                output.parameters["clients"] = clients.into();
                // As real runs describe their load: the client count again.
                output.parameters["load"] =
                    format!("closed loop: {clients} clients, 1 request outstanding each").into();
                output.parameters["network"]["name"] = net.into();
                index += 1;
                write_run(&dir.join(format!("runs/{index:03}")), &output).unwrap();
            }
        }
        let runs: Vec<SavedRun> = load_runs(&dir).unwrap().into_iter().map(|(_, r)| r).collect();
        let tables = sweep_tables(&runs);
        assert!(tables.contains("| clients | metro | geo |"), "{tables}");
        assert!(tables.contains("| 4 | 400 txn/s, p50 5.0 ms | 400 txn/s, p50 300."), "{tables}");
        let report = std::fs::read_to_string(write_report(&dir, &runs).unwrap()).unwrap();
        assert!(report.contains("rows are clients, columns are networks"));
        // One peak-and-ankle line per network: flat latency, so the ankle is the last run.
        assert!(report.contains("## Peak and ankle"), "{report}");
        assert!(report.contains(", metro | 400.0 | 4 | 5.00 | 4 | 400.0 |"), "{report}");
        assert!(dir.join("throughput-vs-clients.png").is_file());
        assert!(dir.join("throughput-latency.svg").is_file());
        // Runs that differ in the protocol are no sweep.
        assert!(sweep_tables(&runs[..1]).is_empty());
        // Two runs at the same clients and network that differ in a workload parameter are
        // not one sweep line.
        let mut other = runs[0].clone();
        other.parameters["workload"]["remote_item_pct"] = 20.into();
        assert!(sweep_tables(&[runs[0].clone(), other]).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn repetitions_show_the_median_and_the_spread() {
        let dir = std::env::temp_dir().join(format!("meridian-reps-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (k, n) in [(1u64, 100), (2, 300), (3, 200)] {
            let mut output = run("occ", None, n, 5);
            output.parameters["label"] = "occ".into();
            output.parameters["repetition"] = k.into();
            let passed = k != 2;
            output.checks = vec![CheckResult { name: "x".into(), passed, detail: String::new() }];
            write_run(&dir.join(format!("runs/00{k}")), &output).unwrap();
        }
        let runs: Vec<SavedRun> = load_runs(&dir).unwrap().into_iter().map(|(_, r)| r).collect();
        let groups = repeated(&runs);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].median.summary.committed, 200, "the median repetition");
        let table = runs_table(&runs);
        assert_eq!(table.lines().count(), 2, "one row for the point: {table}");
        assert!(
            table.contains("200.0") && table.contains("txn/s 100.0 .. 300.0 over 3 runs"),
            "{table}"
        );
        let report = std::fs::read_to_string(write_report(&dir, &runs).unwrap()).unwrap();
        assert!(report.contains("median of 100.0 .. 300.0 over 3 runs"), "{report}");
        assert!(table.contains("FAILED: x (repetition 2)"), "a failed repetition shows: {table}");
        assert!(report.contains("## occ (repetition 3)"), "every repetition's details are kept");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_empty_folder_is_an_error_naming_what_is_missing() {
        let dir = std::env::temp_dir().join(format!("meridian-study-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(load_runs(&dir).unwrap_err().contains("no stats.json"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
