//! `meridian cluster up|down|status --config FILE`: a local multi-process cluster.
//!
//! `up` starts one `meridian server` process per node of the file that hosts replicas
//! (coordinator nodes run inside `meridian bench --cluster`), records their process ids in the
//! state directory, and waits until each listens. `down` stops them by recorded process id
//! (SIGTERM, then SIGKILL after a grace period) and removes the record. `status` reports each
//! node: its process id, whether that process is alive and is a `meridian server`, and whether
//! its address accepts connections.
//!
//! The state directory is `.meridian-<file stem>` beside the cluster file unless `--state-dir`
//! says otherwise; it holds `pids` (one `node pid` line per server) and `node-<id>.log`.

use crate::{ClusterCmdArgs, ClusterOp, Failure};
use meridian_core::ConfigError;
use meridian_node::cluster_file::ClusterFile;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long `up` waits for every server to listen.
const START_WAIT_MAX: Duration = Duration::from_secs(30);
/// How long `down` waits after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Timeout of one reachability probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);
/// Lines a pid file may hold (one per node; nodes are bounded by the topology's limit).
const PID_LINES_MAX: usize = 4_096;

fn state_dir(args: &ClusterCmdArgs) -> PathBuf {
    if let Some(dir) = &args.state_dir {
        return dir.clone();
    }
    let stem =
        args.config.file_stem().map_or("cluster".into(), |s| s.to_string_lossy().into_owned());
    args.config.parent().unwrap_or(Path::new(".")).join(format!(".meridian-{stem}"))
}

/// `(node, pid)` pairs recorded by `up`; an empty list when there is no record.
fn read_pids(dir: &Path) -> Result<Vec<(u32, u32)>, ConfigError> {
    let path = dir.join("pids");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ConfigError::new(format!("{}: {e}", path.display()))),
    };
    let mut pids = Vec::new();
    for (n, line) in text.lines().enumerate().take(PID_LINES_MAX) {
        let bad =
            || ConfigError::new(format!("{} line {}: expected 'node pid'", path.display(), n + 1));
        let mut words = line.split_whitespace();
        let node = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
        let pid = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
        pids.push((node, pid));
    }
    Ok(pids)
}

/// True when `pid` is a live `meridian server` process (guards against reused ids).
fn is_our_server(pid: u32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let words: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let is_zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z'))
    });
    !is_zombie
        && words.first().is_some_and(|w| w.ends_with(b"meridian"))
        && words.iter().any(|w| *w == b"server")
}

fn reachable(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).is_ok()
}

fn signal(pid: u32, name: &str) -> bool {
    Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `meridian cluster ...`; servers started by `up` log at `log_level`.
pub fn cluster(args: &ClusterCmdArgs, log_level: &str) -> Result<(), Failure> {
    let file = ClusterFile::load(&args.config)?;
    let dir = state_dir(args);
    match args.op {
        ClusterOp::Up => up(args, log_level, &file, &dir),
        ClusterOp::Down => down(&dir),
        ClusterOp::Status => status(&file, &dir),
    }
}

fn servers(file: &ClusterFile) -> Vec<u32> {
    file.topology
        .node_ids()
        .filter(|n| !file.topology.nodes[n.0 as usize].replicas.is_empty())
        .map(|n| n.0)
        .collect()
}

fn up(
    args: &ClusterCmdArgs,
    log_level: &str,
    file: &ClusterFile,
    dir: &Path,
) -> Result<(), Failure> {
    let running: Vec<(u32, u32)> =
        read_pids(dir)?.into_iter().filter(|&(_, pid)| is_our_server(pid)).collect();
    if !running.is_empty() {
        return Err(ConfigError::new(format!(
            "the cluster is already up ({} servers running, recorded in {}); run `meridian cluster down` first",
            running.len(),
            dir.display()
        ))
        .into());
    }
    if let Some(busy) = servers(file).into_iter().find(|&n| reachable(file.addrs[n as usize])) {
        return Err(ConfigError::new(format!(
            "node {busy}'s address {} is already in use by another process",
            file.addrs[busy as usize]
        ))
        .into());
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| ConfigError::new(format!("cannot create {}: {e}", dir.display())))?;
    let exe = std::env::current_exe()
        .map_err(|e| Failure::Run(format!("cannot find this executable: {e}")))?;
    let mut children = Vec::new();
    let mut record = String::new();
    for node in servers(file) {
        let log_path = dir.join(format!("node-{node}.log"));
        let log = std::fs::File::create(&log_path)
            .map_err(|e| Failure::Run(format!("cannot create {}: {e}", log_path.display())))?;
        let err =
            log.try_clone().map_err(|e| Failure::Run(format!("cannot share the log: {e}")))?;
        // Each server keeps its log under the state directory; `up` after `down` (or after a
        // crash) restarts every server from its log.
        let data_dir = dir.join(format!("data-node-{node}"));
        let child = Command::new(&exe)
            .args(["--log-level", log_level, "server", "--node", &node.to_string(), "--config"])
            .arg(&args.config)
            .arg("--data-dir")
            .arg(&data_dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| Failure::Run(format!("cannot start node {node}: {e}")))?;
        record.push_str(&format!("{node} {}\n", child.id()));
        children.push((node, child));
    }
    std::fs::write(dir.join("pids"), &record).map_err(|e| {
        Failure::Run(format!("cannot record the process ids in {}: {e}", dir.display()))
    })?;
    let started = Instant::now();
    for (node, child) in &mut children {
        let (node, pid, addr) = (*node, child.id(), file.addrs[*node as usize]);
        while !reachable(addr) {
            // The handle, not /proc, says whether it exited: right after the fork /proc shows
            // this command's own command line until the server's exec.
            let exited = !matches!(child.try_wait(), Ok(None));
            if exited || started.elapsed() > START_WAIT_MAX {
                let _ = down(dir);
                return Err(Failure::Run(format!(
                    "node {node} (pid {pid}) did not start listening on {addr}; see {}",
                    dir.join(format!("node-{node}.log")).display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        say!("node {node} up: pid {pid}, listening on {addr}");
    }
    say!("cluster up: {} servers; state in {}", children.len(), dir.display());
    // The servers outlive this command: dropping the handles neither waits nor kills.
    drop(children);
    Ok(())
}

fn down(dir: &Path) -> Result<(), Failure> {
    let pids = read_pids(dir)?;
    if pids.is_empty() {
        say!("cluster down: nothing recorded in {}", dir.display());
        return Ok(());
    }
    for &(node, pid) in &pids {
        if is_our_server(pid) && !signal(pid, "TERM") {
            say!("node {node}: could not signal pid {pid}");
        }
    }
    let started = Instant::now();
    for &(node, pid) in &pids {
        while is_our_server(pid) && started.elapsed() < STOP_GRACE {
            std::thread::sleep(Duration::from_millis(50));
        }
        if is_our_server(pid) {
            signal(pid, "KILL");
            say!("node {node}: pid {pid} ignored SIGTERM for {STOP_GRACE:?}; killed");
        } else {
            say!("node {node}: pid {pid} stopped");
        }
    }
    std::fs::remove_file(dir.join("pids"))
        .map_err(|e| Failure::Run(format!("cannot remove {}: {e}", dir.join("pids").display())))?;
    say!("cluster down");
    Ok(())
}

fn status(file: &ClusterFile, dir: &Path) -> Result<(), Failure> {
    let pids = read_pids(dir)?;
    let mut healthy = 0;
    let servers = servers(file);
    for &node in &servers {
        let addr = file.addrs[node as usize];
        let pid = pids.iter().find(|(n, _)| *n == node).map(|&(_, p)| p);
        let alive = pid.is_some_and(is_our_server);
        let listening = reachable(addr);
        healthy += usize::from(alive && listening);
        say!(
            "node {node}  {addr:<21}  pid {:<8}  {}  {}",
            pid.map_or("-".to_string(), |p| p.to_string()),
            if alive { "running" } else { "not running" },
            if listening { "listening" } else { "not listening" }
        );
    }
    say!("{healthy}/{} servers up", servers.len());
    if healthy == servers.len() {
        Ok(())
    } else {
        Err(Failure::Run(format!(
            "{} of {} servers are down",
            servers.len() - healthy,
            servers.len()
        )))
    }
}
