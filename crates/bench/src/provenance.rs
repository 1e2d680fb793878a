//! Where a run's figures come from (the commit and the machine), recorded in every
//! `stats.json` the harness, `sim` and the PostgreSQL peer write.

/// Where a run's figures come from, for `stats.json`: the git commit of the working directory
/// (`-dirty` when it has uncommitted changes; `unknown` outside a checkout) and the machine
/// (host name, CPUs, CPU model, memory, kernel).
pub fn provenance() -> serde_json::Value {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = match (git(&["rev-parse", "HEAD"]), git(&["status", "--porcelain"])) {
        (Some(hash), Some(changes)) if !changes.is_empty() => format!("{hash}-dirty"),
        (Some(hash), _) => hash,
        (None, _) => "unknown".into(),
    };
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split(':').nth(1)))
        .map_or("unknown".to_string(), |m| m.trim().to_string());
    let memory_gib = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.split_whitespace().next()?.parse::<f64>().ok())
        .map(|kib| (kib / 1024.0 / 1024.0 * 10.0).round() / 10.0);
    serde_json::json!({
        "git_commit": commit,
        "machine": {
            "hostname": read("/proc/sys/kernel/hostname").trim(),
            "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "cpu_model": cpu_model,
            "memory_gib": memory_gib,
            "kernel": read("/proc/sys/kernel/osrelease").trim(),
        },
    })
}
