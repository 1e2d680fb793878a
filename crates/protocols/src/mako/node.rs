//! `mako` at the node: what a node knows of every shard's watermark and of the epochs, and its
//! leaders' periodic ticks (the engine's speculation seam, `crate::engine::speculation`).

use super::watermark::{Report, Watermarks};
use super::{Entry, Mako, OPTION_WATERMARK_MS};
use crate::engine::participant::Participant;
use crate::engine::speculation::{Durability, Speculation};
use crate::kit::host::Hosts;
use crate::{NodeContext, Protocol};
use meridian_core::topology::Topology;
use meridian_core::{NodeId, ShardId, Time};
use std::collections::BTreeMap;

/// A node's view of the watermarks, and how often its leaders tick.
pub(super) struct View {
    tracker: Watermarks,
    interval_ns: u64,
    /// Reports ignored as malformed or from a node that hosts no replica of the shard.
    reports_refused_total: u64,
}

impl View {
    /// The view of the node `context` describes, ticking as its options say.
    pub(super) fn boxed(context: &NodeContext) -> Box<dyn Speculation> {
        let ms = context.options.number(OPTION_WATERMARK_MS, Mako::OPTIONS);
        Box::new(View {
            tracker: Watermarks::new(context.topology.shards),
            interval_ns: (ms * meridian_core::time::NS_PER_MS as f64) as u64,
            reports_refused_total: 0,
        })
    }
}

impl Speculation for View {
    fn interval_ns(&self) -> u64 {
        self.interval_ns
    }

    fn durability(&self) -> &dyn Durability {
        &self.tracker
    }

    /// Each shard this node leads logs its next entry (a tick, or an epoch's end or start,
    /// from its speculative state) and reports its committed watermark; every machine here
    /// learns how far history may be collected.
    fn tick(
        &mut self,
        hosts: &mut Hosts<Participant>,
        now: Time,
    ) -> (Vec<(ShardId, Entry)>, Vec<(Report, u16)>) {
        let mut entries = Vec::new();
        let mut reports = Vec::new();
        for shard in hosts.shards() {
            if !hosts.leads(shard) {
                continue;
            }
            if let Some(entry) = hosts.get(shard).and_then(|p| p.mako_next(&self.tracker, now)) {
                entries.push((shard, entry));
            }
            if let Some(report) = hosts.committed(shard).and_then(|p| p.mako_report(shard)) {
                reports.push(report);
            }
        }
        for (_, participant) in hosts.machines_mut() {
            participant.set_gc_cap(&self.tracker);
        }
        (entries, reports)
    }

    fn close_entry(&self, participant: &Participant) -> Option<Entry> {
        participant.mako_close_entry()
    }

    /// Believed only from a node hosting a replica of the shard (its committed state is the
    /// group's).
    fn on_report(&mut self, topology: &Topology, from: NodeId, report: &Report) -> bool {
        let hosts = topology
            .nodes
            .get(from.0 as usize)
            .is_some_and(|n| n.replicas.iter().any(|slot| slot.shard == report.shard));
        if !hosts || !self.tracker.on_report(report) {
            self.reports_refused_total += 1;
            return false;
        }
        true
    }

    fn counters(&self, counters: &mut BTreeMap<&'static str, u64>) {
        counters.insert("mako_node_epoch", self.tracker.epoch());
        counters.insert("mako_reports_refused_total", self.reports_refused_total);
    }
}
