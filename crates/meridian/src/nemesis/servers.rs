//! The nemesis's server processes: one `meridian server` per replica node of the cluster file,
//! each with its data directory, metrics listener, log file and fault-control file under the
//! run's folder, started, killed (`SIGKILL`), paused (`SIGSTOP` / `SIGCONT`), told its faults
//! through its control file, and stopped (`SIGTERM`).

use meridian_core::NodeId;
use meridian_node::control::FaultControl;
use meridian_runtime::logstore::DiskFailure;
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longest a started server may take to listen.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(30);
/// The status a server exits with when its log cannot write or sync (the storage thread's).
pub const DISK_FAILURE_EXIT: i32 = 3;
/// Longest a server may take to stop on `SIGTERM` before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// One server process and the faults it acts out.
struct Server {
    node: NodeId,
    addr: SocketAddr,
    metrics: SocketAddr,
    child: Option<Child>,
    paused: bool,
    /// Cuts holding each outgoing link (faults may overlap).
    cuts: BTreeMap<NodeId, u32>,
    control: FaultControl,
}

/// The servers of one run.
pub struct Servers {
    exe: PathBuf,
    config: PathBuf,
    dir: PathBuf,
    log_level: String,
    servers: Vec<Server>,
}

impl Servers {
    /// The servers of `config` (nodes `nodes`, listening at `addrs`, metrics at `metrics`),
    /// none started, their files under `dir`.
    pub fn new(
        config: &Path,
        dir: &Path,
        log_level: &str,
        nodes: Vec<(NodeId, SocketAddr, SocketAddr)>,
    ) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
        let servers = nodes
            .into_iter()
            .map(|(node, addr, metrics)| Server {
                node,
                addr,
                metrics,
                child: None,
                paused: false,
                cuts: BTreeMap::new(),
                control: FaultControl::default(),
            })
            .collect();
        Ok(Self {
            exe,
            config: config.to_path_buf(),
            dir: dir.to_path_buf(),
            log_level: log_level.to_string(),
            servers,
        })
    }

    fn server(&mut self, node: NodeId) -> Result<&mut Server, String> {
        self.servers.iter_mut().find(|s| s.node == node).ok_or(format!("node {node} is no server"))
    }

    /// The servers' nodes.
    pub fn nodes(&self) -> Vec<NodeId> {
        self.servers.iter().map(|s| s.node).collect()
    }

    /// Each server's metrics listener.
    pub fn metrics(&self) -> Vec<(NodeId, SocketAddr)> {
        self.servers.iter().map(|s| (s.node, s.metrics)).collect()
    }

    /// `node`'s data directory.
    pub fn data_dir(&self, node: NodeId) -> PathBuf {
        self.dir.join(format!("data-{}", node.0))
    }

    fn control_path(&self, node: NodeId) -> PathBuf {
        self.dir.join(format!("control-{}", node.0))
    }

    /// Starts `node`'s server (its control file written first, so it starts with the faults
    /// in force) and waits until it listens.
    pub fn start(&mut self, node: NodeId) -> Result<(), String> {
        let control_path = self.control_path(node);
        let data_dir = self.data_dir(node);
        let log_path = self.dir.join(format!("node-{}.log", node.0));
        let (exe, config, level) = (self.exe.clone(), self.config.clone(), self.log_level.clone());
        let server = self.server(node)?;
        if server.child.is_some() {
            return Err(format!("node {node} already runs"));
        }
        server
            .control
            .write(&control_path)
            .map_err(|e| format!("{}: {e}", control_path.display()))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("{}: {e}", log_path.display()))?;
        let child = Command::new(exe)
            .args(["--log-level", &level, "server", "--node", &node.0.to_string(), "--config"])
            .arg(config)
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--durability", "fsync", "--metrics-addr", &server.metrics.to_string()])
            .arg("--fault-control")
            .arg(control_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start node {node}: {e}"))?;
        server.child = Some(child);
        server.paused = false;
        let addr = server.addr;
        let deadline = Instant::now() + LISTEN_TIMEOUT;
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Some(status) =
                self.server(node)?.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
            {
                self.server(node)?.child = None;
                return Err(format!(
                    "node {node} exited at start ({status}); see {}",
                    log_path.display()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "node {node} did not listen on {addr} within {LISTEN_TIMEOUT:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// `kill -9`: nothing of the server's shutdown runs.
    pub fn kill(&mut self, node: NodeId) -> Result<(), String> {
        let server = self.server(node)?;
        let mut child = server.child.take().ok_or(format!("node {node} is down already"))?;
        server.paused = false;
        child.kill().map_err(|e| format!("kill node {node}: {e}"))?;
        child.wait().map_err(|e| format!("wait for node {node}: {e}"))?;
        Ok(())
    }

    /// `SIGSTOP` (`stop`) or `SIGCONT`.
    pub fn pause(&mut self, node: NodeId, stop: bool) -> Result<(), String> {
        let server = self.server(node)?;
        let child = server.child.as_ref().ok_or(format!("node {node} is down"))?;
        let name = if stop { "STOP" } else { "CONT" };
        signal(child.id(), name)?;
        server.paused = stop;
        Ok(())
    }

    /// Adds (`cut`) or lifts one cut of the link from `from` to `to`, and tells `from`.
    pub fn cut(&mut self, from: NodeId, to: NodeId, cut: bool) -> Result<(), String> {
        let path = self.control_path(from);
        let server = self.server(from)?;
        let count = server.cuts.entry(to).or_insert(0);
        *count = if cut { *count + 1 } else { count.saturating_sub(1) };
        server.control.cut = server.cuts.iter().filter(|(_, n)| **n > 0).map(|(n, _)| *n).collect();
        server.control.write(&path).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Steps `node`'s clock.
    pub fn step_clock(&mut self, node: NodeId, step_ns: i64) -> Result<(), String> {
        let path = self.control_path(node);
        let server = self.server(node)?;
        server.control.clock_offset_ns = server.control.clock_offset_ns.saturating_add(step_ns);
        server.control.write(&path).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Sets `node`'s disk delay.
    pub fn slow_disk(&mut self, node: NodeId, delay_ns: u64) -> Result<(), String> {
        let path = self.control_path(node);
        let server = self.server(node)?;
        server.control.disk_delay_ns = delay_ns;
        server.control.write(&path).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Arms a failure of `node`'s disk: its next group commit fails and the server stops.
    pub fn fail_disk(&mut self, node: NodeId, failure: DiskFailure) -> Result<(), String> {
        let path = self.control_path(node);
        let server = self.server(node)?;
        server.control.disk_fail = Some(failure);
        server.control.write(&path).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Ends a disk failure: the server must have stopped on it with the storage thread's
    /// status ([`DISK_FAILURE_EXIT`]; one that never met it, with no group commit since, is
    /// killed), the failure is disarmed and the server started again. Says what it found.
    pub fn recover(&mut self, node: NodeId) -> Result<String, String> {
        let server = self.server(node)?;
        server.control.disk_fail = None;
        let mut child = server.child.take().ok_or(format!("node {node} is down already"))?;
        let found = match child.try_wait().map_err(|e| format!("wait for node {node}: {e}"))? {
            Some(status) if status.code() == Some(DISK_FAILURE_EXIT) => {
                format!("{node} had stopped on the failure ({status})")
            }
            Some(status) => {
                return Err(format!(
                    "node {node} exited with {status}, not the storage thread's status {DISK_FAILURE_EXIT}"
                ))
            }
            None => {
                let _ = child.kill();
                let _ = child.wait();
                format!("{node} never met the failure (no group commit); killed")
            }
        };
        self.start(node)?;
        Ok(format!("{found}; start {node}"))
    }

    /// Ends every fault: paused servers continue, down ones start, every control file is
    /// cleared. Returns what it did and what it could not do, one line each (a server that
    /// will not start is a finding, not a reason to stop healing the others).
    pub fn heal(&mut self) -> (Vec<String>, Vec<String>) {
        let (mut done, mut failed) = (Vec::new(), Vec::new());
        for node in self.nodes() {
            match self.heal_one(node, &mut done) {
                Ok(()) => {}
                Err(why) => failed.push(why),
            }
        }
        (done, failed)
    }

    fn heal_one(&mut self, node: NodeId, done: &mut Vec<String>) -> Result<(), String> {
        let path = self.control_path(node);
        if self.server(node)?.paused {
            self.pause(node, false)?;
            done.push(format!("continue {node}"));
        }
        let server = self.server(node)?;
        if server.control != FaultControl::default() {
            server.cuts.clear();
            server.control = FaultControl::default();
            server.control.write(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            done.push(format!("clear the faults of {node}"));
        }
        if self.server(node)?.child.is_none() {
            self.start(node)?;
            done.push(format!("start {node}"));
        }
        Ok(())
    }

    /// Stops every server with `SIGTERM` (killing one that takes longer than
    /// [`STOP_TIMEOUT`]); returns the nodes that had to be killed or exited with an error.
    pub fn stop_all(&mut self) -> Vec<String> {
        let mut trouble = Vec::new();
        for server in &mut self.servers {
            let Some(child) = server.child.as_ref() else { continue };
            if server.paused {
                let _ = signal(child.id(), "CONT");
                server.paused = false;
            }
            let _ = signal(child.id(), "TERM");
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        for server in &mut self.servers {
            let Some(mut child) = server.child.take() else { continue };
            loop {
                match child.try_wait() {
                    Ok(Some(status)) if status.success() => break,
                    Ok(Some(status)) => {
                        trouble.push(format!("node {} exited with {status}", server.node));
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        trouble
                            .push(format!("node {} did not stop on SIGTERM; killed", server.node));
                        break;
                    }
                }
            }
        }
        trouble
    }

    /// The servers that exited on their own (not by a fault), with their status.
    pub fn exited(&mut self) -> Vec<String> {
        let mut exited = Vec::new();
        for server in &mut self.servers {
            if let Some(status) = server.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                exited.push(format!("node {} exited with {status}", server.node));
                server.child = None;
            }
        }
        exited
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for server in &mut self.servers {
            if let Some(mut child) = server.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// `kill -NAME pid` ([`crate::clustercmd::signal`]), as a result.
fn signal(pid: u32, name: &str) -> Result<(), String> {
    crate::clustercmd::signal(pid, name).then_some(()).ok_or(format!("kill -{name} {pid} failed"))
}
