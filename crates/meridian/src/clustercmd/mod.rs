//! `meridian cluster up|down|restart|status --config FILE [--node N]`: a local multi-process
//! cluster.
//!
//! A server is found by what listens on its node's address ([`procs`]), not only by the
//! process id recorded when it was started: a server restarted by hand is the node's server,
//! and a recorded id that went stale names nothing. `up` starts every server of the file (one
//! per node that hosts replicas; coordinator nodes run inside `bench --cluster`, `kv` or a
//! client) that is not running, leaves running ones alone, and waits until each listens.
//! `down` stops the servers that listen on the nodes' addresses, and any recorded one still
//! alive (SIGTERM, then SIGKILL after a grace period). `restart --node N` is `down` then `up`
//! of one node. `status` reports each server: address, process, data directory and, where
//! the file gives the node a `metrics_addr` (which `up` serves), how long it has run and
//! how many of its shards' groups it leads. `--node N` limits `up`, `down` and `status` to
//! one node.
//!
//! The state directory is `.meridian-<file stem>` beside the cluster file unless `--state-dir`
//! says otherwise; it holds `pids` (one `node pid` line per server started here),
//! `node-<id>.log`, and each server's data directory `data-node-<id>`.

mod procs;

use crate::{ClusterCmdArgs, ClusterOp, Failure};
use meridian_core::ConfigError;
use meridian_node::cluster_file::ClusterFile;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long `up` waits for every server to listen.
const START_WAIT_MAX: Duration = Duration::from_secs(30);
/// How long `down` waits after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Timeout of one reachability probe or metrics read.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);
/// Lines a pid file may hold (one per node; nodes are bounded by the topology's limit).
const PID_LINES_MAX: usize = 4_096;
/// Bytes of a metrics page read at most.
const METRICS_BYTES_MAX: u64 = 4 << 20;

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

fn write_pids(dir: &Path, pids: &[(u32, u32)]) -> Result<(), Failure> {
    let path = dir.join("pids");
    if pids.is_empty() {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Failure::Run(format!("cannot remove {}: {e}", path.display())))
            }
            _ => Ok(()),
        };
    }
    let text: String = pids.iter().map(|(node, pid)| format!("{node} {pid}\n")).collect();
    std::fs::write(&path, text).map_err(|e| {
        Failure::Run(format!("cannot record the process ids in {}: {e}", path.display()))
    })
}

fn reachable(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).is_ok()
}

/// Sends signal `name` to `pid` with `kill`; true when it was delivered.
pub(crate) fn signal(pid: u32, name: &str) -> bool {
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
    let all = servers(&file);
    let nodes = match args.node {
        None if args.op == ClusterOp::Restart => {
            return Err(ConfigError::new("restart needs --node N").into())
        }
        None => all,
        Some(node) if all.contains(&node) => vec![node],
        Some(node) => {
            return Err(ConfigError::new(format!(
                "--node {node}: not a server node of the file (servers: {})",
                all.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            ))
            .into())
        }
    };
    let cluster = Cluster { file: &file, dir: &dir, config: &args.config, log_level };
    match args.op {
        ClusterOp::Up => cluster.up(&nodes),
        ClusterOp::Down => cluster.down(&nodes),
        ClusterOp::Restart => {
            cluster.down(&nodes)?;
            cluster.up(&nodes)
        }
        ClusterOp::Status => cluster.status(&nodes),
    }
}

/// The nodes of `file` that run as servers (those hosting replicas).
fn servers(file: &ClusterFile) -> Vec<u32> {
    file.topology
        .node_ids()
        .filter(|n| !file.topology.nodes[n.0 as usize].replicas.is_empty())
        .map(|n| n.0)
        .collect()
}

/// One `cluster` command's view of the cluster.
struct Cluster<'a> {
    file: &'a ClusterFile,
    dir: &'a Path,
    config: &'a Path,
    log_level: &'a str,
}

/// What runs as node `node`'s server.
enum Running {
    /// A `meridian server` listens on its address.
    Server(procs::ServerProc),
    /// Something else does (another program, or a process of another user).
    Other(Option<u32>),
    /// Nothing listens there.
    Nothing,
}

impl Cluster<'_> {
    fn addr(&self, node: u32) -> SocketAddr {
        self.file.addrs[node as usize]
    }

    fn running(&self, node: u32) -> Running {
        let addr = self.addr(node);
        match procs::listener(addr) {
            Some(pid) => match procs::server(pid) {
                Some(server) => Running::Server(server),
                None => Running::Other(Some(pid)),
            },
            None if reachable(addr) => Running::Other(None),
            None => Running::Nothing,
        }
    }

    fn up(&self, nodes: &[u32]) -> Result<(), Failure> {
        let mut to_start = Vec::new();
        for &node in nodes {
            match self.running(node) {
                Running::Server(server) => {
                    say!(
                        "node {node} already up: pid {}, listening on {}",
                        server.pid,
                        self.addr(node)
                    )
                }
                Running::Other(pid) => {
                    let who =
                        pid.map_or("another user's process".to_string(), |p| format!("pid {p}"));
                    return Err(ConfigError::new(format!(
                        "node {node}'s address {} is in use by {who}, which is not a meridian server",
                        self.addr(node)
                    ))
                    .into());
                }
                Running::Nothing => to_start.push(node),
            }
        }
        std::fs::create_dir_all(self.dir)
            .map_err(|e| ConfigError::new(format!("cannot create {}: {e}", self.dir.display())))?;
        let mut children = Vec::new();
        for &node in &to_start {
            children.push((node, self.start(node)?));
        }
        let mut recorded: Vec<(u32, u32)> =
            read_pids(self.dir)?.into_iter().filter(|(n, _)| !to_start.contains(n)).collect();
        recorded.extend(children.iter().map(|(node, child)| (*node, child.id())));
        recorded.sort_unstable();
        write_pids(self.dir, &recorded)?;
        let started = Instant::now();
        for (node, child) in &mut children {
            let (node, pid, addr) = (*node, child.id(), self.addr(*node));
            while !reachable(addr) {
                // The handle, not /proc, says whether it exited: right after the fork /proc
                // shows this command's own command line until the server's exec.
                let exited = !matches!(child.try_wait(), Ok(None));
                if exited || started.elapsed() > START_WAIT_MAX {
                    let _ = self.down(&to_start);
                    return Err(Failure::Run(format!(
                        "node {node} (pid {pid}) did not start listening on {addr}; see {}",
                        self.dir.join(format!("node-{node}.log")).display()
                    )));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            say!("node {node} up: pid {pid}, listening on {addr}");
        }
        let running = nodes.len() - to_start.len();
        say!(
            "cluster up: {} servers ({} started, {running} already running); state in {}",
            nodes.len(),
            to_start.len(),
            self.dir.display()
        );
        // The servers outlive this command: dropping the handles neither waits nor kills.
        drop(children);
        Ok(())
    }

    /// Starts node `node`'s server on its data directory under the state directory (a
    /// restart takes up what it logged), its output into `node-<id>.log` (appended).
    fn start(&self, node: u32) -> Result<Child, Failure> {
        let exe = std::env::current_exe()
            .map_err(|e| Failure::Run(format!("cannot find this executable: {e}")))?;
        let log_path = self.dir.join(format!("node-{node}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| Failure::Run(format!("cannot open {}: {e}", log_path.display())))?;
        let err =
            log.try_clone().map_err(|e| Failure::Run(format!("cannot share the log: {e}")))?;
        let data_dir = self.dir.join(format!("data-node-{node}"));
        Command::new(exe)
            .args([
                "--log-level",
                self.log_level,
                "server",
                "--node",
                &node.to_string(),
                "--config",
            ])
            .arg(self.config)
            .arg("--data-dir")
            .arg(&data_dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| Failure::Run(format!("cannot start node {node}: {e}")))
    }

    fn down(&self, nodes: &[u32]) -> Result<(), Failure> {
        let recorded = read_pids(self.dir)?;
        // Every server to stop: the one listening on the node's address, and a recorded one
        // still alive (starting, or stuck before it listens).
        let mut stopping: Vec<(u32, u32)> = Vec::new();
        for &node in nodes {
            if let Running::Server(server) = self.running(node) {
                stopping.push((node, server.pid));
            }
            // A recorded id counts only while it is still the server `up` started (the same
            // data directory): an id the system gave to another process since is left alone.
            let ours = self.dir.join(format!("data-node-{node}"));
            for &(_, pid) in recorded.iter().filter(|(n, _)| *n == node) {
                let same = procs::server(pid).is_some_and(|s| s.data_dir.as_ref() == Some(&ours));
                if same && !stopping.contains(&(node, pid)) {
                    stopping.push((node, pid));
                }
            }
        }
        for &(node, pid) in &stopping {
            if !signal(pid, "TERM") {
                say!("node {node}: could not signal pid {pid}");
            }
        }
        let started = Instant::now();
        for &(node, pid) in &stopping {
            while procs::server(pid).is_some() && started.elapsed() < STOP_GRACE {
                std::thread::sleep(Duration::from_millis(50));
            }
            if procs::server(pid).is_some() {
                signal(pid, "KILL");
                say!("node {node}: pid {pid} ignored SIGTERM for {STOP_GRACE:?}; killed");
            } else {
                say!("node {node}: pid {pid} stopped");
            }
        }
        let kept: Vec<(u32, u32)> =
            recorded.into_iter().filter(|(n, _)| !nodes.contains(n)).collect();
        write_pids(self.dir, &kept)?;
        match stopping.len() {
            0 => say!("cluster down: no server of {} node(s) was running", nodes.len()),
            n => say!("cluster down: {n} server(s) stopped"),
        }
        Ok(())
    }

    fn status(&self, nodes: &[u32]) -> Result<(), Failure> {
        // Each server's state and metrics page first: a follower's lag is its shard leader's
        // applied index less its own, and the leader may be any node.
        let seen: Vec<(u32, Running, Option<String>)> = nodes
            .iter()
            .map(|&node| {
                let running = self.running(node);
                let page = match (&running, self.file.metrics_addrs[node as usize]) {
                    (Running::Server(_), Some(metrics)) => scrape(metrics),
                    _ => None,
                };
                (node, running, page)
            })
            .collect();
        let groups: Vec<(u32, Vec<Group>)> = seen
            .iter()
            .map(|(node, _, page)| (*node, page.as_deref().map_or_else(Vec::new, groups_of)))
            .collect();
        let leader_applied = |shard: u32| {
            groups
                .iter()
                .flat_map(|(_, g)| g)
                .filter(|g| g.shard == shard && g.leader)
                .map(|g| g.applied)
                .max()
        };
        let mut healthy = 0;
        for ((node, running, page), (_, own)) in seen.iter().zip(&groups) {
            let (node, addr) = (*node, self.addr(*node));
            let line = match running {
                Running::Server(server) => {
                    healthy += 1;
                    let data = server
                        .data_dir
                        .as_ref()
                        .map_or("memory".to_string(), |d| d.display().to_string());
                    let metrics = match (self.file.metrics_addrs[node as usize], page) {
                        (None, _) => String::new(),
                        (Some(m), None) => format!("  metrics {m} unreachable"),
                        (Some(m), Some(page)) => format!("  {}", metrics_summary(m, page)),
                    };
                    let roles: Vec<String> = own
                        .iter()
                        .map(|g| match (g.leader, leader_applied(g.shard)) {
                            (true, _) => format!("shard {} leader, applied {}", g.shard, g.applied),
                            (false, Some(lead)) => format!(
                                "shard {} follower, applied {}, lag {}",
                                g.shard,
                                g.applied,
                                lead.saturating_sub(g.applied)
                            ),
                            (false, None) => {
                                format!("shard {} follower, applied {}", g.shard, g.applied)
                            }
                        })
                        .collect();
                    let roles = if roles.is_empty() {
                        String::new()
                    } else {
                        format!("\n          {}", roles.join("; "))
                    };
                    format!("up    pid {:<8} data {data}{metrics}{roles}", server.pid)
                }
                Running::Other(pid) => format!(
                    "down  (its address is taken by {}, not a meridian server)",
                    pid.map_or("another user's process".into(), |p| format!("pid {p}"))
                ),
                Running::Nothing => "down".to_string(),
            };
            say!("node {node}  {addr:<21}  {line}");
        }
        say!("{healthy}/{} servers up", nodes.len());
        if healthy == nodes.len() {
            Ok(())
        } else {
            Err(Failure::Run(format!(
                "{} of {} servers are down",
                nodes.len() - healthy,
                nodes.len()
            )))
        }
    }
}

/// One replica's place in its shard's log, as its server's metrics say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Group {
    pub(crate) shard: u32,
    pub(crate) leader: bool,
    pub(crate) applied: u64,
}

/// The `meridian_group_*` lines of a metrics page, per shard.
pub(crate) fn groups_of(page: &str) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for line in page.lines() {
        let (name, rest) = match line.split_once('{') {
            Some(split) => split,
            None => continue,
        };
        let (labels, value) = match rest.rsplit_once("} ") {
            Some(split) => split,
            None => continue,
        };
        let shard = labels
            .split(',')
            .find_map(|l| l.strip_prefix("shard=\""))
            .and_then(|v| v.trim_end_matches('"').parse::<u32>().ok());
        let (Some(shard), Ok(value)) = (shard, value.trim().parse::<u64>()) else { continue };
        let at = match groups.iter().position(|g| g.shard == shard) {
            Some(at) => at,
            None => {
                groups.push(Group { shard, leader: false, applied: 0 });
                groups.len() - 1
            }
        };
        match name {
            "meridian_group_leader" => groups[at].leader = value == 1,
            "meridian_group_applied_index" => groups[at].applied = value,
            _ => {}
        }
    }
    groups.sort_unstable_by_key(|g| g.shard);
    groups
}

/// What a server's metrics page says of it: how long it has run, the groups it leads and
/// its log entries (Raft-hosted protocols).
fn metrics_summary(addr: SocketAddr, page: &str) -> String {
    let value = |name: &str| {
        page.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .reduce(f64::max)
    };
    let mut parts = vec![format!("metrics {addr}")];
    if let Some(up) = value("meridian_uptime_seconds") {
        parts.push(format!("up {up:.0} s"));
    }
    if let Some(led) = value("meridian_raft_groups_led") {
        parts.push(format!("leads {led:.0} group(s)"));
    }
    if let Some(entries) = value("meridian_raft_log_entries") {
        parts.push(format!("{entries:.0} log entries"));
    }
    parts.join(", ")
}

/// `GET /metrics` from `addr`, bounded in time and size.
pub(crate) fn scrape(addr: SocketAddr) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).ok()?;
    stream.set_read_timeout(Some(PROBE_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(PROBE_TIMEOUT)).ok()?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut body = Vec::new();
    stream.take(METRICS_BYTES_MAX).read_to_end(&mut body).ok()?;
    let text = String::from_utf8_lossy(&body).into_owned();
    let (head, page) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then(|| page.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_lines_of_a_metrics_page_parse_per_shard() {
        let page = "# TYPE meridian_group_leader gauge\n\
                    meridian_group_leader{node=\"0\",shard=\"1\"} 1\n\
                    meridian_group_applied_index{node=\"0\",shard=\"1\"} 42\n\
                    meridian_group_leader{node=\"0\",shard=\"0\"} 0\n\
                    meridian_group_applied_index{node=\"0\",shard=\"0\"} 7\n\
                    meridian_uptime_seconds{node=\"0\"} 3.5\n\
                    meridian_group_leader{node=\"0\",shard=\"x\"} 1\n";
        assert_eq!(
            groups_of(page),
            [
                Group { shard: 0, leader: false, applied: 7 },
                Group { shard: 1, leader: true, applied: 42 }
            ]
        );
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(metrics_summary(addr, page), "metrics 127.0.0.1:9, up 4 s");
        assert!(groups_of("garbage {\n}").is_empty());
    }
}
