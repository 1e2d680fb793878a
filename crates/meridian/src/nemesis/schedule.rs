//! The nemesis's fault schedule: the fault lines of `meridian_core::fault` (crash, isolate,
//! partition, clock, disk) plus two only real processes can suffer,
//!
//! ```text
//! pause     node=3 | leader=S at=T until=T2
//! disk-fail node=3 | leader=S at=T what=fsync|full|torn restart=T2
//! ```
//!
//! (`pause`: `SIGSTOP`, then `SIGCONT`: the process keeps its state and its sockets and wakes
//! up behind the times; `disk-fail`: the server's next group commit meets a failing `fsync`, a
//! full disk or a torn write, the server stops on it, and is started again at `restart`),
//! either given line by line (`--fault`) or drawn from the seed for the fault kinds asked
//! for. [`Plan::steps`] compiles a schedule into timed [`Step`]s on server processes.

use meridian_core::fault::{FaultAction, FaultSchedule, Words};
use meridian_core::rng::{child_rng, uniform_u64, Rng};
use meridian_core::time::{Time, NS_PER_MS, NS_PER_S};
use meridian_core::topology::Topology;
use meridian_core::{ConfigError, NodeId, ShardId};
use meridian_runtime::logstore::DiskFailure;
use std::collections::BTreeSet;

/// Most faults one nemesis run schedules (a 600 s run draws about 270); each costs a few
/// steps and a line of the report.
pub const FAULTS_MAX: usize = 2_048;
/// The fault kinds `--faults` accepts.
pub const KINDS: [&str; 5] = ["crash", "pause", "partition", "clock", "disk"];
/// Seconds before the first drawn fault: the cluster elects its leaders and warms up.
pub const FIRST_FAULT_S: u64 = 1;
/// Seconds with no fault at the end of a run, so that every shard has its leader back and
/// the clients' last requests finish before the checks (longer than every protocol's failure
/// detection and election).
pub const QUIET_TAIL_S: u64 = 6;
/// Shortest run the nemesis accepts.
pub const DURATION_S_MIN: u64 = FIRST_FAULT_S + QUIET_TAIL_S + 3;
/// Longest a drawn fault lasts.
const FAULT_MS_MAX: u64 = 2_500;
/// Shortest a drawn fault lasts.
const FAULT_MS_MIN: u64 = 400;

/// A fault only a real process can suffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessFault {
    /// Pause, or which disk failure.
    pub kind: ProcessFaultKind,
    /// The server.
    pub node: NodeId,
    /// When it starts.
    pub at_ns: Time,
    /// When it ends: the server continues, or starts again.
    pub until_ns: Time,
    /// The line.
    pub text: String,
}

/// What a [`ProcessFault`] does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessFaultKind {
    /// `SIGSTOP` until `SIGCONT`.
    Pause,
    /// The disk fails the next group commit; the server stops, and starts again at the end.
    DiskFail(DiskFailure),
}

/// One primitive step on the server processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `kill -9`.
    Kill(NodeId),
    /// Start the server again on its data directory.
    Start(NodeId),
    /// `SIGSTOP`.
    Stop(NodeId),
    /// `SIGCONT`.
    Continue(NodeId),
    /// Cut (true) or restore one cut of (false) the link from the first node to the second.
    Cut(NodeId, NodeId, bool),
    /// Step the node's clock.
    Clock(NodeId, i64),
    /// Set the node's disk delay per group commit.
    Disk(NodeId, u64),
    /// Arm a failure of the node's disk.
    FailDisk(NodeId, DiskFailure),
    /// Disarm it, and start the server again (it stopped on the failure, or is killed if the
    /// failure never struck).
    Recover(NodeId),
}

/// A step at its time, with the fault it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timed {
    /// When, from the start of the load.
    pub at_ns: Time,
    /// The fault's index in [`Plan::lines`].
    pub fault: usize,
    /// True when the step starts the fault's effect.
    pub starts: bool,
    /// What.
    pub step: Step,
}

/// A checked schedule.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The lines, in the order given or drawn (the core faults first, then the process
    /// faults).
    pub lines: Vec<String>,
    core: FaultSchedule,
    process: Vec<ProcessFault>,
}

impl Plan {
    /// Checks `lines` against the layout (faults land on servers only) and the run's length;
    /// a crash the layout cannot survive by design is refused unless `unsurvivable`.
    pub fn parse(
        lines: &[String],
        (topology, leaders): (&Topology, &[NodeId]),
        run_ns: Time,
        unsurvivable: bool,
    ) -> Result<Self, ConfigError> {
        let is_process =
            |l: &String| matches!(l.split_whitespace().next(), Some("pause") | Some("disk-fail"));
        let (process_lines, core_lines): (Vec<String>, Vec<String>) =
            lines.iter().cloned().partition(is_process);
        if lines.len() > FAULTS_MAX {
            return Err(ConfigError::new(format!(
                "{} faults given; at most {FAULTS_MAX} per run",
                lines.len()
            )));
        }
        let limits = (FAULTS_MAX, unsurvivable);
        let core = FaultSchedule::parse_at_most(&core_lines, (topology, leaders), run_ns, limits)?;
        let mut process = Vec::new();
        for line in &process_lines {
            let fault = parse_process_fault(line, topology, leaders, run_ns)
                .map_err(|why| ConfigError::new(format!("fault '{}': {why}", line.trim())))?;
            process.push(fault);
        }
        let lines = core_lines.into_iter().chain(process_lines).collect();
        let plan = Self { lines, core, process };
        plan.check_servers(topology)?;
        plan.check_process_faults()?;
        Ok(plan)
    }

    /// A fault on a coordinator would hit this process: refused.
    fn check_servers(&self, topology: &Topology) -> Result<(), ConfigError> {
        let on_coordinator = |node: NodeId| topology.nodes[node.0 as usize].replicas.is_empty();
        for fault in self.core.faults() {
            use meridian_core::fault::FaultKind as K;
            let node = match &fault.kind {
                K::Crash { node, .. }
                | K::Isolate { node, .. }
                | K::Clock { node, .. }
                | K::Disk { node, .. } => Some(*node),
                K::Partition { .. } => None,
            };
            if let Some(node) = node.filter(|n| on_coordinator(*n)) {
                return Err(ConfigError::new(format!(
                    "fault '{}': node {node} is a coordinator, which runs inside the nemesis \
                     process; faults go to servers",
                    fault.text
                )));
            }
        }
        if let Some(pause) = self.process.iter().find(|p| on_coordinator(p.node)) {
            return Err(ConfigError::new(format!(
                "fault '{}': node {} is a coordinator, which runs inside the nemesis process; \
                 faults go to servers",
                pause.text, pause.node
            )));
        }
        Ok(())
    }

    /// A process fault may not overlap another or a crash of the same node.
    fn check_process_faults(&self) -> Result<(), ConfigError> {
        for (i, fault) in self.process.iter().enumerate() {
            let overlaps = |at: Time, end: Time| at < fault.until_ns && fault.at_ns < end;
            let other = self.process[i + 1..]
                .iter()
                .find(|p| p.node == fault.node && overlaps(p.at_ns, p.until_ns))
                .map(|p| p.text.clone());
            let crash = self.core.faults().iter().find_map(|f| match f.kind {
                meridian_core::fault::FaultKind::Crash { node, restart_ns }
                    if node == fault.node && overlaps(f.at_ns, restart_ns.unwrap_or(Time::MAX)) =>
                {
                    Some(f.text.clone())
                }
                _ => None,
            });
            if let Some(other) = other.or(crash) {
                return Err(ConfigError::new(format!(
                    "faults '{}' and '{other}' overlap on node {}",
                    fault.text, fault.node
                )));
            }
        }
        Ok(())
    }

    /// The schedule as timed steps, by time (ends before starts at the same time).
    pub fn steps(&self, topology: &Topology) -> Vec<Timed> {
        let mut steps: Vec<Timed> = self
            .core
            .indexed_actions(topology)
            .into_iter()
            .map(|a| Timed {
                at_ns: a.at_ns,
                fault: a.fault,
                starts: a.starts,
                step: match a.action {
                    FaultAction::Crash(node) => Step::Kill(node),
                    FaultAction::Restart(node) => Step::Start(node),
                    FaultAction::Block(from, to) => Step::Cut(from, to, true),
                    FaultAction::Unblock(from, to) => Step::Cut(from, to, false),
                    FaultAction::ClockStep(node, step_ns) => Step::Clock(node, step_ns),
                    FaultAction::DiskDelay(node, delay_ns) => Step::Disk(node, delay_ns),
                },
            })
            .collect();
        let first = self.core.faults().len();
        for (i, process) in self.process.iter().enumerate() {
            let fault = first + i;
            let node = process.node;
            let (start, end) = match process.kind {
                ProcessFaultKind::Pause => (Step::Stop(node), Step::Continue(node)),
                ProcessFaultKind::DiskFail(failure) => {
                    (Step::FailDisk(node, failure), Step::Recover(node))
                }
            };
            steps.push(Timed { at_ns: process.at_ns, fault, starts: true, step: start });
            steps.push(Timed { at_ns: process.until_ns, fault, starts: false, step: end });
        }
        steps.sort_by_key(|s| (s.at_ns, s.starts, s.fault));
        steps
    }

    /// The kind of fault `index` (its line's first word).
    pub fn kind_of(&self, index: usize) -> &str {
        self.lines.get(index).and_then(|l| l.split_whitespace().next()).unwrap_or("?")
    }
}

fn parse_process_fault(
    line: &str,
    topology: &Topology,
    leaders: &[NodeId],
    run_ns: Time,
) -> Result<ProcessFault, String> {
    let mut words = line.split_whitespace();
    let name = words.next().unwrap_or_default();
    let (end_key, accepted): (&str, &[&str]) = match name {
        "pause" => ("until", &["node", "leader", "at", "until"]),
        _ => ("restart", &["node", "leader", "at", "what", "restart"]),
    };
    let w = Words::parse(words, accepted)?;
    let node = w.node((topology, leaders))?;
    let at_ns = w.time("at", run_ns)?;
    let until_ns = w.time(end_key, run_ns)?;
    if until_ns <= at_ns {
        return Err(format!("{end_key}= is not after at="));
    }
    let kind = match name {
        "pause" => ProcessFaultKind::Pause,
        _ => {
            let what = w.get("what").ok_or("'what=' (fsync, full or torn) is missing")?;
            ProcessFaultKind::DiskFail(DiskFailure::parse(what)?)
        }
    };
    Ok(ProcessFault { kind, node, at_ns, until_ns, text: line.trim().to_string() })
}

/// Parses `--faults crash,pause,...` into the kinds, in [`KINDS`] order.
pub fn parse_kinds(text: &str) -> Result<Vec<&'static str>, ConfigError> {
    let mut kinds = BTreeSet::new();
    for word in text.split(',').map(str::trim) {
        let kind = KINDS.iter().find(|k| **k == word).ok_or_else(|| {
            ConfigError::new(format!(
                "--faults: unknown fault '{word}'; accepted: {}",
                KINDS.join(", ")
            ))
        })?;
        kinds.insert(KINDS.iter().position(|k| k == kind).unwrap_or(0));
    }
    Ok(kinds.into_iter().map(|i| KINDS[i]).collect())
}

/// Draws a schedule from `seed`: faults one after another from [`FIRST_FAULT_S`] until
/// [`QUIET_TAIL_S`] before the end, each of a kind in `kinds`, most on a shard's starting
/// leader. Crashes sometimes take a majority of a shard down for a while (restarted); clock
/// steps stay within a few milliseconds or go far beyond (hundreds), and step back at the
/// fault's end; partitions split the replicas' regions majority/minority, or bridge them
/// (two cut apart, one reaching both), or isolate one server; a disk is either slowed or
/// fails one group commit (a failing `fsync`, a full disk, a torn write), its server stopping
/// on it and starting again.
pub fn draw(kinds: &[&str], topology: &Topology, duration_s: u64, seed: u64) -> Vec<String> {
    let mut rng = child_rng(seed, "nemesis schedule", 0);
    let servers: Vec<NodeId> =
        topology.node_ids().filter(|n| !topology.nodes[n.0 as usize].replicas.is_empty()).collect();
    // The regions that host replicas, in order.
    let mut regions: Vec<usize> =
        servers.iter().map(|n| topology.region_of(*n).0 as usize).collect();
    regions.sort_unstable();
    regions.dedup();
    let end_ms = (duration_s - QUIET_TAIL_S) * 1_000;
    let mut t_ms = FIRST_FAULT_S * 1_000;
    let mut lines = Vec::new();
    // A majority crash adds up to a majority of lines at once.
    let lines_max = FAULTS_MAX - topology.replicas as usize;
    while t_ms + FAULT_MS_MIN < end_ms && lines.len() <= lines_max {
        let length_ms =
            (FAULT_MS_MIN + uniform_u64(&mut rng, FAULT_MS_MAX - FAULT_MS_MIN)).min(end_ms - t_ms);
        let until_ms = t_ms + length_ms;
        let kind = kinds[uniform_u64(&mut rng, kinds.len() as u64) as usize];
        let shard = uniform_u64(&mut rng, u64::from(topology.shards)) as u32;
        let target = |rng: &mut Rng| -> String {
            if uniform_u64(rng, 10) < 6 {
                format!("leader={shard}")
            } else {
                format!("node={}", servers[uniform_u64(rng, servers.len() as u64) as usize].0)
            }
        };
        let when = format!("at={t_ms}ms");
        match kind {
            "crash" if topology.replicas >= 3 && uniform_u64(&mut rng, 5) == 0 => {
                // A majority of one shard down for a while: it stops committing, then
                // recovers once they are back.
                let majority = topology.replicas as usize / 2 + 1;
                for replica in replicas_of(topology, ShardId(shard)).into_iter().take(majority) {
                    lines.push(format!("crash node={} {when} restart={until_ms}ms", replica.0));
                }
            }
            "crash" => {
                lines.push(format!("crash {} {when} restart={until_ms}ms", target(&mut rng)))
            }
            "pause" => lines.push(format!("pause {} {when} until={until_ms}ms", target(&mut rng))),
            "partition" if regions.len() >= 3 && uniform_u64(&mut rng, 3) > 0 => {
                let name = |i: usize| topology.regions[regions[i]].clone();
                let lone = uniform_u64(&mut rng, regions.len() as u64) as usize;
                let rest: Vec<String> =
                    (0..regions.len()).filter(|i| *i != lone).map(name).collect();
                let groups = if uniform_u64(&mut rng, 2) == 0 {
                    format!("{}|{}", rest.join(","), name(lone))
                } else {
                    // A bridge: the lone region reaches both sides, the sides not each other.
                    format!("{}|{}", rest[0], rest[1..].join(","))
                };
                lines.push(format!("partition regions={groups} {when} until={until_ms}ms"));
            }
            "partition" => {
                lines.push(format!("isolate {} {when} until={until_ms}ms", target(&mut rng)))
            }
            "clock" => {
                let node = servers[uniform_u64(&mut rng, servers.len() as u64) as usize].0;
                let step_ms = if uniform_u64(&mut rng, 2) == 0 {
                    1 + uniform_u64(&mut rng, 5)
                } else {
                    100 + uniform_u64(&mut rng, 400)
                } as i64;
                let step_ms = if uniform_u64(&mut rng, 2) == 0 { step_ms } else { -step_ms };
                lines.push(format!("clock node={node} {when} step={step_ms:+}ms"));
                lines.push(format!("clock node={node} at={until_ms}ms step={:+}ms", -step_ms));
            }
            "disk" if uniform_u64(&mut rng, 2) == 0 => {
                let what = ["fsync", "full", "torn"][uniform_u64(&mut rng, 3) as usize];
                lines.push(format!(
                    "disk-fail {} {when} what={what} restart={until_ms}ms",
                    target(&mut rng)
                ));
            }
            _ => {
                let delay_ms = 5 + uniform_u64(&mut rng, 46);
                lines.push(format!(
                    "disk {} {when} until={until_ms}ms delay={delay_ms}ms",
                    target(&mut rng)
                ));
            }
        }
        t_ms = until_ms + 200 + uniform_u64(&mut rng, 800);
    }
    debug_assert!(t_ms + FAULT_MS_MIN >= end_ms || lines.len() > lines_max);
    debug_assert!(lines.len() <= FAULTS_MAX);
    lines
}

/// The servers hosting `shard`, by replica.
fn replicas_of(topology: &Topology, shard: ShardId) -> Vec<NodeId> {
    let mut hosts: Vec<(u32, NodeId)> = topology
        .node_ids()
        .flat_map(|n| {
            topology.nodes[n.0 as usize]
                .replicas
                .iter()
                .filter(|slot| slot.shard == shard)
                .map(move |slot| (slot.replica, n))
        })
        .collect();
    hosts.sort_unstable();
    hosts.into_iter().map(|(_, n)| n).collect()
}

/// Nanoseconds in a run of `duration_s` seconds.
pub fn run_ns(duration_s: u64) -> Time {
    duration_s * NS_PER_S
}

/// Milliseconds, for printing a time of the schedule.
pub fn ms(ns: Time) -> u64 {
    ns / NS_PER_MS
}
