//! Reports: the table printed after a run and `results/<timestamp>/stats.json`.

use crate::run::RunOutput;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// `YYYY-MM-DDTHH-MM-SSZ` for a Unix time (seconds), safe in file names.
pub fn utc_stamp(unix_s: u64) -> String {
    let days = (unix_s / 86_400) as i64;
    let secs = unix_s % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}-{:02}-{:02}Z",
        secs / 3_600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Writes `stats.json` into a new `out_dir/<timestamp>/` and returns that folder.
pub fn write_results(out_dir: &Path, output: &RunOutput) -> std::io::Result<PathBuf> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut folder = out_dir.join(utc_stamp(now));
    let mut suffix = 1;
    while folder.exists() {
        suffix += 1;
        folder = out_dir.join(format!("{}-{suffix}", utc_stamp(now)));
    }
    std::fs::create_dir_all(&folder)?;
    let json = serde_json::to_string_pretty(output).map_err(std::io::Error::other)?;
    std::fs::write(folder.join("stats.json"), json)?;
    if let Some(history) = &output.history_json {
        std::fs::write(folder.join("history.json"), history)?;
    }
    Ok(folder)
}

/// The table shown after a run.
pub fn table(output: &RunOutput) -> String {
    let p = &output.parameters;
    let s = &output.summary;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "{:<9} {:<12} {:>6} {:<16} {:>7} {:>12} {:>9} {:>9} {:>8} {:>12}",
        "protocol",
        "workload",
        "S x R",
        "network",
        "clients",
        "txn/s",
        "p50 ms",
        "p99 ms",
        "abort %",
        "cross-shard %"
    );
    let _ = writeln!(
        text,
        "{:<9} {:<12} {:>6} {:<16} {:>7} {:>12.1} {:>9.2} {:>9.2} {:>8.2} {:>12.1}",
        p["protocol"].as_str().unwrap_or("?"),
        p["workload"]["name"].as_str().unwrap_or("?"),
        format!("{}x{}", p["shards"], p["replicas"]),
        p["network"]["name"].as_str().unwrap_or("?"),
        p["clients"],
        s.throughput_txn_per_s,
        s.latency_ms_p50,
        s.latency_ms_p99,
        s.abort_rate * 100.0,
        s.cross_shard_fraction * 100.0,
    );
    let _ = writeln!(
        text,
        "window {:.1} s, {} committed, {} retried attempts, {} user aborts, {} failed; p90 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
        s.window_s, s.committed, s.retries, s.user_aborted, s.failed, s.latency_ms_p90, s.latency_ms_p999, s.latency_ms_max
    );
    if let Some(load) = p["load"].as_str() {
        let offered = match (p["offered"]["arrived"].as_u64(), p["offered"]["shed"].as_u64()) {
            (Some(arrived), Some(shed)) => format!("; {arrived} arrivals, {shed} shed"),
            _ => String::new(),
        };
        let _ = writeln!(text, "load: {load}{offered}");
    }
    if !s.commit_paths.is_empty() {
        let _ = writeln!(text, "{}", paths_line(s));
    }
    if let Some(line) = lock_wait_line(&output.protocol_counters) {
        let _ = writeln!(text, "{line}");
    }
    if let Some(line) = types_line(s) {
        let _ = writeln!(text, "{line}");
    }
    if let Some(per) = s.deliveries_per_commit {
        let _ =
            writeln!(text, "messages: {per:.1} delivered per commit (the whole run, every node)");
    }
    if let Some(us) = s.cpu_us_per_txn {
        let rss = s.peak_rss_mib.map_or(String::new(), |m| format!("; peak RSS {m:.0} MiB"));
        let _ = writeln!(
            text,
            "CPU {us:.1} us per committed transaction (this process, every thread){rss}"
        );
    }
    if output.messages_dropped > 0 {
        let _ = writeln!(
            text,
            "{} messages dropped at full queues (inboxes, TCP writers); timeouts resent them",
            output.messages_dropped
        );
    }
    if let Some(load) = &output.load {
        let rss =
            load.peak_rss_mib.map_or(String::new(), |m| format!(", peak RSS {m:.0} MiB after it"));
        let _ = writeln!(text, "load {:.2} s{rss}", load.seconds);
    }
    if let Some(failure) = &output.first_failure {
        let _ = writeln!(text, "first failure: {failure}");
    }
    for line in fault_lines(output) {
        let _ = writeln!(text, "{line}");
    }
    let delayed: Vec<_> =
        output.links.iter().filter(|l| l.configured_ms_p50 > 0.0 && l.messages > 0).collect();
    if !delayed.is_empty() {
        let worst = delayed
            .iter()
            .max_by(|a, b| a.emulation_error_ms.abs().total_cmp(&b.emulation_error_ms.abs()))
            .expect("non-empty");
        let ok = delayed.iter().filter(|l| l.within_tolerance).count();
        let ok_configured = delayed.iter().filter(|l| l.within_tolerance_of_configured).count();
        let _ = writeln!(
            text,
            "links: emulation within 5% or 1 ms on {ok}/{n} delayed links (worst n{}->n{}: drew {:.2} ms, measured {:.2} ms); measured median within 5% or 1 ms of the configured one on {ok_configured}/{n}",
            worst.from,
            worst.to,
            worst.drawn_ms_p50.unwrap_or(worst.configured_ms_p50),
            worst.measured_ms_p50,
            n = delayed.len(),
        );
    }
    for check in &output.checks {
        let _ = writeln!(
            text,
            "check {:<20} {}  {}",
            check.name,
            if check.passed { "PASS" } else { "FAIL" },
            check.detail
        );
    }
    if let Some(note) = &output.checks_note {
        let _ = writeln!(text, "checks: not run ({note})");
    }
    text
}

/// One line per scheduled fault: when it was carried out and what it did to the run, then
/// the actions that failed and the messages cut links dropped.
pub fn fault_lines(output: &RunOutput) -> Vec<String> {
    let mut lines = Vec::new();
    let Some(timeline) = &output.summary.timeline else { return lines };
    let seconds =
        |s: Option<f64>, never: &str| s.map_or(never.to_string(), |s| format!("{s:.2} s"));
    for v in &timeline.faults {
        let pre = v.pre_fault_txn_per_s.map_or("n/a".into(), |t| format!("{t:.0} txn/s"));
        let recovery = match (v.dipped, v.recovered_90_s) {
            (false, Some(_)) => "no dip below 90%".to_string(),
            (_, Some(s)) => format!("back to 90% after {s:.2} s"),
            (_, None) if v.pre_fault_txn_per_s.is_none() => "too early to judge recovery".into(),
            (_, None) => "not back to 90% within the run".into(),
        };
        lines.push(format!(
            "fault at {:.2} s '{}': before {pre}; first commit of a later transaction {}; {recovery}",
            v.at_s,
            v.fault,
            seconds(v.first_commit_s, "never"),
        ));
    }
    for action in output.faults_applied.iter().filter(|a| a.error.is_some()) {
        let why = action.error.as_deref().unwrap_or_default();
        lines.push(format!(
            "fault action '{}' at {:.2} s failed: {why}",
            action.action, action.applied_s
        ));
    }
    if output.messages_cut > 0 {
        lines.push(format!("{} messages dropped at cut links", output.messages_cut));
    }
    lines
}

/// "commit paths: ...; wide-area round trips p50 ... (mean ...)".
pub fn paths_line(s: &crate::stats::Summary) -> String {
    let paths: Vec<String> = s.commit_paths.iter().map(|(p, n)| format!("{p} {n}")).collect();
    let mut line = format!(
        "commit paths: {}",
        if paths.is_empty() { "none".into() } else { paths.join(", ") }
    );
    if let Some(ratio) = s.fast_path_ratio {
        line += &format!("; fast path {:.1}%", ratio * 100.0);
        if let Some(quorum) = s.fast_quorum_ratio {
            line += &format!(" (super quorums matched for {:.1}% of the run)", quorum * 100.0);
        }
    }
    if let (Some(p50), Some(mean)) = (s.wrtt_p50, s.wrtt_mean) {
        line += &format!("; wide-area round trips per commit p50 {p50} (mean {mean:.2})");
    }
    if let Some(worst) = s.p50_over_bound {
        let regions: Vec<String> = s
            .p50_over_bound_by_region
            .iter()
            .map(|(region, ratio)| {
                let bound = s.latency_bound_ms_by_region.get(region).copied().unwrap_or(0.0);
                format!("{region} {ratio:.3} of {bound:.1} ms")
            })
            .collect();
        line += &format!("; p50 over bound {worst:.3} ({})", regions.join(", "));
    }
    if let (Some(p50), Some(p99)) = (s.speculative_latency_ms_p50, s.speculative_latency_ms_p99) {
        line += &format!("; speculative latency p50 {p50:.2} ms p99 {p99:.2} ms");
    }
    if s.indeterminate > 0 {
        line += &format!("; {} outcomes unknown", s.indeterminate);
    }
    if !s.abort_causes.is_empty() {
        let causes: Vec<String> = s.abort_causes.iter().map(|(c, n)| format!("{c} {n}")).collect();
        line += &format!("; retries by cause: {}", causes.join(", "));
    }
    line
}

/// "by type: new-order 4512 committed, p50 1.20 ms, p99 3.40 ms; ..." when a workload has
/// several transaction types.
pub fn types_line(s: &crate::stats::Summary) -> Option<String> {
    (s.by_type.len() > 1).then(|| {
        let types: Vec<String> = s
            .by_type
            .iter()
            .map(|(name, t)| {
                format!(
                    "{name} {} committed, p50 {:.2} ms, p99 {:.2} ms",
                    t.committed, t.latency_ms_p50, t.latency_ms_p99
                )
            })
            .collect();
        format!("by type: {}", types.join("; "))
    })
}

/// "lock waits: N, mean M ms" for protocols that count lock waits (counters ending in
/// `lock_waits_total` and `lock_wait_ns_total`), summed over the nodes.
pub fn lock_wait_line(counters: &std::collections::BTreeMap<String, u64>) -> Option<String> {
    let sum = |suffix: &str| -> u64 {
        counters.iter().filter(|(name, _)| name.ends_with(suffix)).map(|(_, v)| *v).sum()
    };
    let waits = sum("lock_waits_total");
    (waits > 0).then(|| {
        let mean_ms = sum("lock_wait_ns_total") as f64 / waits as f64 / 1e6;
        format!("lock waits: {waits}, mean {mean_ms:.3} ms (whole run, warm-up included)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_waits_are_summed_over_protocol_counters_and_averaged() {
        let mut counters = std::collections::BTreeMap::new();
        assert_eq!(lock_wait_line(&counters), None, "no protocol counted a wait");
        counters.insert("twopl_lock_waits_total".to_string(), 4);
        counters.insert("twopl_lock_wait_ns_total".to_string(), 6_000_000);
        counters.insert("occ_coordinator_retried_total".to_string(), 9);
        let line = lock_wait_line(&counters).expect("waits were counted");
        assert!(line.starts_with("lock waits: 4, mean 1.500 ms"), "{line}");
    }

    #[test]
    fn stamps_are_utc_calendar_dates() {
        assert_eq!(utc_stamp(0), "1970-01-01T00-00-00Z");
        assert_eq!(utc_stamp(951_782_400), "2000-02-29T00-00-00Z");
        assert_eq!(utc_stamp(1_795_350_896), "2026-11-22T12-34-56Z");
    }
}
