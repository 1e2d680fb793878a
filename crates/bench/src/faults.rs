//! Faults in real time on an embedded cluster: carries out a checked fault schedule
//! (`meridian_core::fault`) while the load runs, with the same primitive actions the
//! simulator applies.
//!
//! - crash: the node's task forgets its state, timers and queued messages and drops what
//!   arrives (completions of its log included: each carries the life of the node that asked);
//! - restart: the node's log (a directory of its own) is closed once everything queued before
//!   the crash is written, as the page cache of a killed process would still reach the disk,
//!   then reopened; the node is rebuilt from it (its stores loaded with the initial data
//!   first, as a server starts) with the next incarnation, and started;
//! - block / unblock: the runtime's link layer drops messages of a cut link at the sender;
//! - clock step: the node's clock offset jumps;
//! - disk delay: every later group commit of the node's log takes that much longer.
//!
//! Each action is logged with the time it was carried out, for `stats.json`.

use crate::timeline::FaultStarts;
use meridian_core::fault::{FaultAction, ScheduledAction};
use meridian_core::topology::Topology;
use meridian_core::{NodeId, Time};
use meridian_node::context::{contexts, load_in_parallel, open_storage, BuildNode, ContextBase};
use meridian_protocols::{ProtocolNode, ProtocolOptions};
use meridian_runtime::clock::WallClock;
use meridian_runtime::logstore::{DurabilityMode, LogStoreKind, Storage};
use meridian_runtime::node_task::{Cluster, NodeFault};
use meridian_workloads::Workload;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// One action as carried out.
#[derive(Clone, Debug, Serialize)]
pub struct AppliedFault {
    /// When the schedule asked for it (seconds from the start of the run).
    pub planned_s: f64,
    /// When it was carried out.
    pub applied_s: f64,
    /// What (`crash n3`, `block n1 -> n4`, ...).
    pub action: String,
    /// Why it could not be carried out, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What rebuilding a crashed node takes: the settings its first build had.
pub struct Rebuild<N> {
    /// The layout.
    pub topology: Arc<Topology>,
    /// The workload (procedures, partitioner, initial data).
    pub workload: Arc<dyn Workload>,
    /// Largest one-way delay of the network (the nodes' timing follows it).
    pub network_owd_ns_max: u64,
    /// Master seed.
    pub seed: u64,
    /// Commands between snapshots.
    pub snapshot_interval_entries: u64,
    /// Protocol options.
    pub options: ProtocolOptions,
    /// The protocol's constructor.
    pub build: BuildNode<N>,
    /// The logs' durability and kind.
    pub durability: DurabilityMode,
    /// The logs' store.
    pub log_store: LogStoreKind,
    /// The folder holding one log directory per node.
    pub data_dir: PathBuf,
}

impl<N: ProtocolNode> Rebuild<N> {
    /// The log directory of `node`.
    pub fn node_dir(&self, node: NodeId) -> PathBuf {
        node_dir(&self.data_dir, node)
    }

    /// Closes `old` (what was queued is written), reopens the node's log and builds the node
    /// from it as incarnation `incarnation`. Blocking: file reads and the initial data load.
    fn node(&self, node: NodeId, incarnation: u64, old: &Storage) -> Result<(N, Storage), String> {
        old.close();
        let (storage, durable) = open_storage(
            self.durability,
            self.log_store,
            Some(&self.node_dir(node)),
            &identity(node),
        )
        .map_err(|e| e.to_string())?;
        let storage = storage.ok_or("a crashed node needs a log on disk")?;
        let context = contexts(ContextBase {
            topology: &self.topology,
            workload: &self.workload,
            network_owd_ns_max: self.network_owd_ns_max,
            seed: self.seed,
            durable: true,
            snapshot_interval_entries: self.snapshot_interval_entries,
            options: &self.options,
            incarnation,
        });
        let mut fresh = (self.build)(context(node), &durable)?;
        load_in_parallel(self.workload.as_ref(), std::iter::once(&mut fresh));
        Ok((fresh, storage))
    }
}

/// The log directory of `node` under `data_dir`.
pub fn node_dir(data_dir: &std::path::Path, node: NodeId) -> PathBuf {
    data_dir.join(format!("node-{}", node.0))
}

/// The identity written into `node`'s log directory.
pub fn identity(node: NodeId) -> String {
    format!("embedded benchmark node {}", node.0)
}

/// Carries out `actions` (times from `start_ns` on `clock`) on `cluster`, logging each into
/// `applied` and, when a fault's first action has taken effect (a crashed node has stopped),
/// that time into `started`. `storages`: each node's log, if durable. Returns when every
/// action is done.
pub async fn carry_out<N: ProtocolNode>(
    actions: Vec<ScheduledAction>,
    (clock, start_ns): (WallClock, Time),
    cluster: &Cluster<N>,
    mut storages: BTreeMap<NodeId, Storage>,
    rebuild: Arc<Rebuild<N>>,
    (applied, started): (&Mutex<Vec<AppliedFault>>, &FaultStarts),
) {
    let cuts = cluster.cuts();
    let mut incarnations: BTreeMap<NodeId, u64> = BTreeMap::new();
    let mut disk_delays: BTreeMap<NodeId, u64> = BTreeMap::new();
    for ScheduledAction { at_ns: at, fault, starts, action } in actions {
        let due = tokio::time::Instant::from_std(clock.instant_at(start_ns + at));
        tokio::time::sleep_until(due).await;
        let mut error = None;
        let described = match action {
            FaultAction::Crash(node) => {
                let (done, stopped) = tokio::sync::oneshot::channel();
                if !cluster.inject(node, NodeFault::Crash(Some(done))).await
                    || stopped.await.is_err()
                {
                    error = Some(format!("node {node} does not run here"));
                }
                format!("crash {node}")
            }
            FaultAction::Restart(node) => {
                let incarnation = incarnations.entry(node).or_insert(0);
                *incarnation += 1;
                match storages.get(&node).cloned() {
                    None => error = Some("no log to restart from".into()),
                    Some(old) => {
                        let (rebuild, incarnation) = (rebuild.clone(), *incarnation);
                        let built = tokio::task::spawn_blocking(move || {
                            rebuild.node(node, incarnation, &old)
                        })
                        .await
                        .map_err(|e| format!("the rebuild stopped: {e}"))
                        .and_then(|r| r);
                        match built {
                            Ok((fresh, storage)) => {
                                storage.set_delay_ns(disk_delays.get(&node).copied().unwrap_or(0));
                                storages.insert(node, storage.clone());
                                let restart =
                                    NodeFault::Restart { node: fresh, storage: Some(storage) };
                                if !cluster.inject(node, restart).await {
                                    error = Some(format!("node {node} does not run here"));
                                }
                            }
                            Err(why) => error = Some(why),
                        }
                    }
                }
                format!("restart {node}")
            }
            FaultAction::Block(from, to) => {
                cuts.set(from, to, true);
                format!("block {from} -> {to}")
            }
            FaultAction::Unblock(from, to) => {
                cuts.set(from, to, false);
                format!("unblock {from} -> {to}")
            }
            FaultAction::ClockStep(node, step_ns) => {
                if !cluster.inject(node, NodeFault::ClockStep(step_ns)).await {
                    error = Some(format!("node {node} does not run here"));
                }
                format!("clock {node} {step_ns:+} ns")
            }
            FaultAction::DiskDelay(node, delay_ns) => {
                disk_delays.insert(node, delay_ns);
                match storages.get(&node) {
                    Some(storage) => storage.set_delay_ns(delay_ns),
                    None => error = Some(format!("node {node} has no log to slow")),
                }
                format!("disk {node} +{delay_ns} ns per commit")
            }
        };
        let seconds = |ns: u64| ns as f64 / 1e9;
        let applied_ns = clock.now_ns().saturating_sub(start_ns);
        if starts && error.is_none() {
            started.mark(fault, applied_ns);
        }
        applied.lock().expect("fault log lock").push(AppliedFault {
            planned_s: seconds(at),
            applied_s: seconds(applied_ns),
            action: described,
            error,
        });
    }
}
