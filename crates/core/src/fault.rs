//! The fault vocabulary shared by the simulator and real-time runs.
//!
//! A fault schedule is a list of lines, one fault each, the same in `meridian sim --fault`,
//! `meridian bench --fault` and an experiment file's `faults = [...]`:
//!
//! ```text
//! crash     node=3 | leader=S  at=T [restart=T2]
//! isolate   node=3 | leader=S  at=T until=T2
//! partition regions=A,B|C      at=T until=T2
//! clock     node=3 | leader=S  at=T step=+50ms
//! disk      node=3 | leader=S  at=T until=T2 delay=20ms
//! ```
//!
//! Times are relative to the start of the run and carry a unit (`ns`, `us`, `ms`, `s`);
//! `leader=S` names the node that leads shard `S` when the run starts (the protocol says
//! which: replica 0, or for tiga and luigi the one their starting view names), which leads
//! while no earlier fault moved its leadership. A partition cuts every link between nodes of
//! different listed groups, both ways; regions not listed keep every link.
//!
//! [`FaultSchedule::parse`] checks a schedule against a layout and the run's length before
//! anything starts, and refuses (naming the line) an unknown fault or key, a node, shard or
//! region that does not exist, a time outside the run, two faults that contradict each other
//! (the same node crashed twice at once, the same disk slowed twice at once), and a crash the layout cannot survive by design: so many of a shard's
//! replicas down forever that the rest are no quorum. [`FaultSchedule::actions`] compiles it into timed primitive
//! [`FaultAction`]s, which every driver carries out the same way.

use crate::error::ConfigError;
use crate::ids::{NodeId, RegionId, ShardId};
use crate::time::{Time, NS_PER_MS, NS_PER_S, NS_PER_US};
use crate::topology::Topology;
use std::collections::BTreeMap;

/// Most faults one schedule may hold.
pub const FAULTS_MAX: usize = 64;
/// Longest fault line accepted.
pub const FAULT_LINE_CHARS_MAX: usize = 512;
/// Largest clock step or disk delay (an hour): beyond it a value is a typo, not a fault.
pub const FAULT_MAGNITUDE_NS_MAX: u64 = 3_600 * NS_PER_S;

/// One primitive step a driver carries out at a scheduled time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// The node stops; what it had not made durable is lost.
    Crash(NodeId),
    /// The node starts again from what its disk holds.
    Restart(NodeId),
    /// Messages from the first node to the second are dropped (one direction).
    Block(NodeId, NodeId),
    /// One block of that direction is lifted (the link is open once no block holds it).
    Unblock(NodeId, NodeId),
    /// The node's clock jumps by this many nanoseconds (forward when positive).
    ClockStep(NodeId, i64),
    /// The node's disk writes take this much longer (0 ends the slowdown): each persist in
    /// the simulator, each group commit (which may carry many persists) in real time.
    DiskDelay(NodeId, u64),
}

/// One action of a schedule, with the fault it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduledAction {
    /// When, relative to the start of the run.
    pub at_ns: Time,
    /// The fault's index in the schedule.
    pub fault: usize,
    /// True for an action that starts the fault's effect (a crash, a cut), false for one that
    /// ends it (a restart, a heal).
    pub starts: bool,
    /// What to do.
    pub action: FaultAction,
}

/// What one fault line does, resolved against the layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Crash a node, and restart it later if `restart_ns` is given.
    Crash {
        /// The node.
        node: NodeId,
        /// When it restarts (relative to the start of the run), if it does.
        restart_ns: Option<Time>,
    },
    /// Cut every link to and from a node (a link cut by two faults at once stays cut until
    /// both end).
    Isolate {
        /// The node.
        node: NodeId,
        /// When the links come back.
        until_ns: Time,
    },
    /// Cut every link between groups of regions.
    Partition {
        /// The groups (at least two, disjoint).
        groups: Vec<Vec<RegionId>>,
        /// When the links come back.
        until_ns: Time,
    },
    /// Step a node's clock.
    Clock {
        /// The node.
        node: NodeId,
        /// The step (forward when positive).
        step_ns: i64,
    },
    /// Slow a node's disk.
    Disk {
        /// The node.
        node: NodeId,
        /// When the disk is well again.
        until_ns: Time,
        /// Extra time every persist takes meanwhile.
        delay_ns: u64,
    },
}

/// One fault of a schedule: what, when, and the line it was written as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// When it starts, relative to the start of the run.
    pub at_ns: Time,
    /// What it does.
    pub kind: FaultKind,
    /// The line as written (for reports).
    pub text: String,
}

impl Fault {
    /// When its effect ends (`None`: never, or at once for a clock step).
    pub fn end_ns(&self) -> Option<Time> {
        match &self.kind {
            FaultKind::Crash { restart_ns, .. } => *restart_ns,
            FaultKind::Isolate { until_ns, .. }
            | FaultKind::Partition { until_ns, .. }
            | FaultKind::Disk { until_ns, .. } => Some(*until_ns),
            FaultKind::Clock { .. } => None,
        }
    }
}

/// A checked list of faults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultSchedule {
    faults: Vec<Fault>,
}

impl FaultSchedule {
    /// Parses and checks `lines` against `topology`, whose shards start led by `leaders` (by
    /// shard number: what `leader=S` names), for a run of `run_ns` (every time must fall
    /// inside it). An empty list is an empty schedule.
    pub fn parse(
        lines: &[String],
        topology: &Topology,
        leaders: &[NodeId],
        run_ns: Time,
    ) -> Result<Self, ConfigError> {
        Self::parse_at_most(lines, (topology, leaders), run_ns, (FAULTS_MAX, false))
    }

    /// [`Self::parse`] with a limit of its own on the number of faults (a long fault campaign
    /// on server processes, `meridian nemesis`, schedules more than one run of the simulator
    /// or the benchmark may) and, when `unsurvivable` is true, without refusing crashes the
    /// layout cannot survive by design (asked for explicitly, to see how it fails).
    pub fn parse_at_most(
        lines: &[String],
        (topology, leaders): (&Topology, &[NodeId]),
        run_ns: Time,
        (faults_max, unsurvivable): (usize, bool),
    ) -> Result<Self, ConfigError> {
        if lines.len() > faults_max {
            return Err(ConfigError::new(format!(
                "{} faults given; at most {faults_max} per run",
                lines.len()
            )));
        }
        let mut faults = Vec::with_capacity(lines.len());
        for line in lines {
            let fault = parse_line(line, (topology, leaders), run_ns)
                .map_err(|why| ConfigError::new(format!("fault '{}': {why}", line.trim())))?;
            faults.push(fault);
        }
        let schedule = Self { faults };
        schedule.check_conflicts()?;
        if !unsurvivable {
            schedule.check_survivable(topology)?;
        }
        Ok(schedule)
    }

    /// The faults, in the order given.
    pub fn faults(&self) -> &[Fault] {
        &self.faults
    }

    /// True when there is no fault.
    pub fn is_empty(&self) -> bool {
        self.faults.is_empty()
    }

    /// True when some fault crashes a node.
    pub fn crashes(&self) -> bool {
        self.faults.iter().any(|f| matches!(f.kind, FaultKind::Crash { .. }))
    }

    /// The primitive actions, by time (faults given at the same time keep their order; at
    /// one instant, an end comes before a start, so back-to-back faults do not overlap).
    pub fn actions(&self, topology: &Topology) -> Vec<(Time, FaultAction)> {
        self.indexed_actions(topology).into_iter().map(|a| (a.at_ns, a.action)).collect()
    }

    /// [`FaultSchedule::actions`], each with the fault it belongs to and whether it starts
    /// the fault's effect or ends it.
    pub fn indexed_actions(&self, topology: &Topology) -> Vec<ScheduledAction> {
        let mut actions: Vec<(Time, bool, usize, FaultAction)> = Vec::new();
        for (index, fault) in self.faults.iter().enumerate() {
            let at = fault.at_ns;
            let mut start = |action| actions.push((at, true, index, action));
            match &fault.kind {
                FaultKind::Crash { node, .. } => start(FaultAction::Crash(*node)),
                FaultKind::Clock { node, step_ns } => {
                    start(FaultAction::ClockStep(*node, *step_ns))
                }
                FaultKind::Disk { node, delay_ns, .. } => {
                    start(FaultAction::DiskDelay(*node, *delay_ns))
                }
                FaultKind::Isolate { .. } | FaultKind::Partition { .. } => {
                    for (from, to) in cut_links(&fault.kind, topology) {
                        start(FaultAction::Block(from, to));
                    }
                }
            }
            let Some(end) = fault.end_ns() else { continue };
            let mut finish = |action| actions.push((end, false, index, action));
            match &fault.kind {
                FaultKind::Crash { node, .. } => finish(FaultAction::Restart(*node)),
                FaultKind::Disk { node, .. } => finish(FaultAction::DiskDelay(*node, 0)),
                FaultKind::Isolate { .. } | FaultKind::Partition { .. } => {
                    for (from, to) in cut_links(&fault.kind, topology) {
                        finish(FaultAction::Unblock(from, to));
                    }
                }
                FaultKind::Clock { .. } => {}
            }
        }
        // Stable: by time, ends first, then in the order written.
        actions.sort_by_key(|&(at, is_start, index, _)| (at, is_start, index));
        actions
            .into_iter()
            .map(|(at_ns, starts, fault, action)| ScheduledAction { at_ns, fault, starts, action })
            .collect()
    }

    /// Two faults that cannot both hold: overlapping crashes of one node, overlapping
    /// slowdowns of one disk. (Overlapping cuts can: a link stays cut while any cut holds it.)
    fn check_conflicts(&self) -> Result<(), ConfigError> {
        for (i, a) in self.faults.iter().enumerate() {
            for b in &self.faults[i + 1..] {
                let (a_end, b_end) =
                    (a.end_ns().unwrap_or(Time::MAX), b.end_ns().unwrap_or(Time::MAX));
                let overlap = a.at_ns < b_end && b.at_ns < a_end;
                if !overlap {
                    continue;
                }
                let clash = match (&a.kind, &b.kind) {
                    (FaultKind::Crash { node: x, .. }, FaultKind::Crash { node: y, .. }) => {
                        (x == y).then(|| format!("node {x} would be crashed twice at once"))
                    }
                    (FaultKind::Disk { node: x, .. }, FaultKind::Disk { node: y, .. }) => {
                        (x == y).then(|| format!("node {x}'s disk would be slowed twice at once"))
                    }
                    // Cuts may overlap: a link stays cut while any cut holds it (drivers
                    // count them), so two nodes isolated at once is two isolations.
                    _ => None,
                };
                if let Some(why) = clash {
                    return Err(ConfigError::new(format!(
                        "faults '{}' and '{}' overlap: {why}",
                        a.text, b.text
                    )));
                }
            }
        }
        Ok(())
    }

    /// Refuses crashes that leave too few of some shard's replicas for a quorum (a strict
    /// majority) for good: the shard could never commit again, by design.
    fn check_survivable(&self, topology: &Topology) -> Result<(), ConfigError> {
        let mut down_forever: BTreeMap<ShardId, Vec<NodeId>> = BTreeMap::new();
        for fault in &self.faults {
            if let FaultKind::Crash { node, restart_ns: None } = fault.kind {
                for slot in &topology.nodes[node.0 as usize].replicas {
                    down_forever.entry(slot.shard).or_default().push(node);
                }
            }
        }
        for (shard, nodes) in down_forever {
            let replicas = topology.replicas as usize;
            // A quorum is a strict majority: d replicas down leave one only while 2d < n.
            if nodes.len() * 2 >= replicas {
                let named: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
                return Err(ConfigError::new(format!(
                    "crashing nodes {} without a restart leaves {} of shard {}'s {replicas} \
                     replicas down for good, too few left for a quorum: the shard could never \
                     commit again (give them restart=)",
                    named.join(", "),
                    nodes.len(),
                    shard.0
                )));
            }
        }
        Ok(())
    }
}

/// The directed links a cut (isolate or partition) drops, in order.
fn cut_links(kind: &FaultKind, topology: &Topology) -> Vec<(NodeId, NodeId)> {
    let mut links = Vec::new();
    match kind {
        FaultKind::Isolate { node, .. } => {
            for other in topology.node_ids().filter(|o| o != node) {
                links.push((*node, other));
                links.push((other, *node));
            }
        }
        FaultKind::Partition { groups, .. } => {
            let group_of = |node: NodeId| {
                let region = topology.region_of(node);
                groups.iter().position(|g| g.contains(&region))
            };
            for from in topology.node_ids() {
                for to in topology.node_ids() {
                    if let (Some(a), Some(b)) = (group_of(from), group_of(to)) {
                        if a != b {
                            links.push((from, to));
                        }
                    }
                }
            }
        }
        _ => {}
    }
    links
}

/// The `key=value` words of one fault line after its kind, each key once (also the words of
/// the fault lines a driver adds to this vocabulary, such as the nemesis's `pause`).
pub struct Words<'a> {
    pairs: BTreeMap<&'a str, &'a str>,
}

impl<'a> Words<'a> {
    /// Reads `words`, refusing a key not `accepted`, a word that is no `key=value` and a key
    /// given twice.
    pub fn parse(words: impl Iterator<Item = &'a str>, accepted: &[&str]) -> Result<Self, String> {
        let mut pairs = BTreeMap::new();
        for word in words {
            let (key, value) =
                word.split_once('=').ok_or_else(|| format!("'{word}' is not key=value"))?;
            if !accepted.contains(&key) {
                return Err(format!("unknown key '{key}'; accepted: {}", accepted.join(", ")));
            }
            if pairs.insert(key, value).is_some() {
                return Err(format!("'{key}' given twice"));
            }
        }
        Ok(Self { pairs })
    }

    /// The value of `key`, if given.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.pairs.get(key).copied()
    }

    /// The value of `key`, which must be given.
    pub fn need(&self, key: &str) -> Result<&'a str, String> {
        self.get(key).ok_or_else(|| format!("'{key}=' is missing"))
    }

    /// A time within the run.
    pub fn time(&self, key: &str, run_ns: Time) -> Result<Time, String> {
        let ns = parse_duration_ns(self.need(key)?).map_err(|e| format!("{key}: {e}"))?;
        if ns >= run_ns {
            return Err(format!(
                "{key}={} is outside the run, which lasts {}",
                self.need(key)?,
                show_ns(run_ns)
            ));
        }
        Ok(ns)
    }

    /// The node named by `node=N` or `leader=S` (exactly one of them).
    pub fn node(&self, (topology, leaders): (&Topology, &[NodeId])) -> Result<NodeId, String> {
        match (self.get("node"), self.get("leader")) {
            (Some(_), Some(_)) => Err("give node= or leader=, not both".into()),
            (None, None) => Err("'node=' (or 'leader=' a shard) is missing".into()),
            (Some(text), None) => {
                let id: u32 = text.parse().map_err(|_| format!("node '{text}' is not a number"))?;
                if id as usize >= topology.nodes.len() {
                    return Err(format!(
                        "node {id} does not exist; the layout has nodes 0 to {}",
                        topology.nodes.len() - 1
                    ));
                }
                Ok(NodeId(id))
            }
            (None, Some(text)) => {
                let shard: u32 =
                    text.parse().map_err(|_| format!("leader shard '{text}' is not a number"))?;
                if shard >= topology.shards {
                    return Err(format!(
                        "shard {shard} does not exist; the layout has shards 0 to {}",
                        topology.shards - 1
                    ));
                }
                leaders
                    .get(shard as usize)
                    .copied()
                    .ok_or_else(|| format!("shard {shard}'s leader is not known"))
            }
        }
    }
}

/// Parses one line.
fn parse_line(
    line: &str,
    (topology, leaders): (&Topology, &[NodeId]),
    run_ns: Time,
) -> Result<Fault, String> {
    let layout = (topology, leaders);
    if line.chars().count() > FAULT_LINE_CHARS_MAX {
        return Err(format!("longer than {FAULT_LINE_CHARS_MAX} characters"));
    }
    let mut words = line.split_whitespace();
    let kind = words.next().ok_or("empty; expected crash, isolate, partition, clock or disk")?;
    let accepted: &[&str] = match kind {
        "crash" => &["node", "leader", "at", "restart"],
        "isolate" => &["node", "leader", "at", "until"],
        "partition" => &["regions", "at", "until"],
        "clock" => &["node", "leader", "at", "step"],
        "disk" => &["node", "leader", "at", "until", "delay"],
        other => {
            return Err(format!(
                "unknown fault '{other}'; accepted: crash, isolate, partition, clock, disk"
            ))
        }
    };
    let w = Words::parse(words, accepted)?;
    let at_ns = w.time("at", run_ns)?;
    let until = |key: &str| -> Result<Time, String> {
        let end = w.time(key, run_ns)?;
        if end <= at_ns {
            return Err(format!("{key}={} is not after at={}", w.need(key)?, w.need("at")?));
        }
        Ok(end)
    };
    let kind = match kind {
        "crash" => {
            let restart_ns = match w.get("restart") {
                Some(_) => Some(until("restart")?),
                None => None,
            };
            FaultKind::Crash { node: w.node(layout)?, restart_ns }
        }
        "isolate" => FaultKind::Isolate { node: w.node(layout)?, until_ns: until("until")? },
        "partition" => FaultKind::Partition {
            groups: parse_groups(w.need("regions")?, topology)?,
            until_ns: until("until")?,
        },
        "clock" => {
            let text = w.need("step")?;
            let (negative, magnitude) = match text.strip_prefix('-') {
                Some(rest) => (true, rest),
                None => (false, text.strip_prefix('+').unwrap_or(text)),
            };
            let ns = parse_duration_ns(magnitude).map_err(|e| format!("step: {e}"))?;
            if ns == 0 {
                return Err("step=0 does nothing".into());
            }
            let ns = i64::try_from(ns).map_err(|_| "step: too large".to_string())?;
            FaultKind::Clock { node: w.node(layout)?, step_ns: if negative { -ns } else { ns } }
        }
        _ => {
            let delay_ns =
                parse_duration_ns(w.need("delay")?).map_err(|e| format!("delay: {e}"))?;
            if delay_ns == 0 {
                return Err("delay=0 does nothing".into());
            }
            FaultKind::Disk { node: w.node(layout)?, until_ns: until("until")?, delay_ns }
        }
    };
    Ok(Fault { at_ns, kind, text: line.split_whitespace().collect::<Vec<_>>().join(" ") })
}

/// `A,B|C`: groups of region names, at least two, disjoint.
fn parse_groups(text: &str, topology: &Topology) -> Result<Vec<Vec<RegionId>>, String> {
    let mut groups: Vec<Vec<RegionId>> = Vec::new();
    for group in text.split('|') {
        let mut regions = Vec::new();
        for name in group.split(',') {
            let index = topology.regions.iter().position(|r| r == name).ok_or_else(|| {
                format!(
                    "region '{name}' does not exist; the layout has {}",
                    topology.regions.join(", ")
                )
            })?;
            let region = RegionId(index as u32);
            if groups.iter().chain(std::iter::once(&regions)).any(|g| g.contains(&region)) {
                return Err(format!("region '{name}' is in two groups"));
            }
            regions.push(region);
        }
        groups.push(regions);
    }
    if groups.len() < 2 {
        return Err(format!("regions={text} names one group; separate the sides with '|'"));
    }
    Ok(groups)
}

/// Parses a duration with its unit: `250ms`, `1.5s`, `40us`, `900ns`.
pub fn parse_duration_ns(text: &str) -> Result<u64, String> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit {
        "ns" => 1,
        "us" => NS_PER_US,
        "ms" => NS_PER_MS,
        "s" => NS_PER_S,
        "" => return Err(format!("'{text}' has no unit; write it as 250ms, 1.5s, 40us or 900ns")),
        other => {
            return Err(format!("unknown unit '{other}' in '{text}'; accepted: ns, us, ms, s"))
        }
    };
    let value: f64 = number.parse().map_err(|_| format!("'{text}' is not a duration"))?;
    let ns = (value * scale as f64).round();
    if !ns.is_finite() || ns > FAULT_MAGNITUDE_NS_MAX as f64 {
        return Err(format!("'{text}' is longer than an hour"));
    }
    Ok(ns as u64)
}

/// A duration for messages: `10s`, `250ms`.
fn show_ns(ns: Time) -> String {
    if ns.is_multiple_of(NS_PER_S) {
        format!("{}s", ns / NS_PER_S)
    } else {
        format!("{}ms", ns as f64 / NS_PER_MS as f64)
    }
}

#[cfg(test)]
mod tests;
