//! The view manager hosted in the nodes (Tiga §4): detecting a dead shard leader and telling
//! every node the next view.
//!
//! The manager's state ([`ManagerMachine`]: the current view) lives on a Raft group of
//! `2f + 1` server nodes ([`manager_members`]), run by the kit's hosting as the one group of
//! a topology of its own ([`manager_topology`]); its records sit under the group's Raft keys,
//! apart from the tiga journal, and its persist tokens count from [`MANAGER_TOKENS_FROM`].
//!
//! - Every node sends a **heartbeat** (its global view number) to every member each
//!   [`BEATS_PER_TIMEOUT`]th of the detection timeout (in whole Raft ticks). Heartbeats bypass the journal's hold: they speak of liveness
//!   only.
//! - Heartbeats are numbered (incarnation, count); a member takes a node's heartbeats in
//!   that order only, so a late copy never undoes what a newer one said.
//! - A heartbeat also names the shards whose replica on the node could not lead (rejoining
//!   by a state transfer, or retired: it holds no log); the manager does not pick one, and
//!   replaces a leader that says so in the current view (said in an older one, it may be
//!   stale: a replica chosen as it finished rejoining leads). Of those, it names the ones
//!   it rejoins at a view change but could lead from the state it dropped
//!   ([`TigaNode::install_view`]): the manager picks such a replica only as a last resort,
//!   when no other live replica of the shard can lead ([`may_lead`]).
//! - The group's **leader** keeps the heartbeats it hears. Once a shard leader of the
//!   manager's view has been silent for the detection timeout (`tiga-detect-ms`, counted
//!   from when this member took the group's lead, so a fresh leader deposes no one early),
//!   it proposes the next view ([`next_install`]); with `auto` its mode comes from the delays
//!   measured between its leaders. While every leader may lead on, it proposes a view that
//!   only changes the mode when those delays call for it ([`next_mode_install`]). A proposal
//!   not applied within another timeout is made again; a stale one (of a deposed group
//!   leader) is skipped when applied.
//! - Once per detection timeout every server node sends every other one a **probe** carrying
//!   its clock; the receiver keeps the last few samples per sender and its heartbeats report
//!   their medians, from which the group's leader takes the delay between two nodes
//!   ([`crate::tiga::view::MeasuredDelays`]).
//! - Every member applies installs in log order and takes each applied view itself at its
//!   next tick; the leader **announces** each to every node, and answers a heartbeat that carries an older view with the current one (an
//!   announcement lost, or a node that restarted in the view its journal held).
//! - A node takes a view only from a member, only a well-formed one, and only one past its
//!   own ([`TigaNode::install_view`]); anything else is dropped and counted.
//!
//! A member that restarts without its group's records (`--durability memory`) lost its
//! Raft votes and log, so it does not rejoin the group: it only sends heartbeats, and the
//! group goes on with the members that kept their state (it tolerates one such member with
//! three).
//!
//! Everything here is driven by the node's calls and its clock as given: no I/O, no time
//! read.

use super::*;
use crate::kit::host::Hosts;
use crate::tiga::manager::{
    manager_members, manager_topology, may_lead, next_install, next_mode_install, server_nodes,
    ManagerMachine, ManagerMsg, Said, ViewRecord,
};
use crate::tiga::view::{Heartbeats, MeasuredDelays, ProbeDelays};
use crate::Durable;

/// The manager's persist tokens start here; the journal's count from 0 and never reach it.
pub const MANAGER_TOKENS_FROM: u64 = 1 << 62;

/// Installs the manager's group applies between snapshots of its state (one view each: the
/// log stays short, and the shards' checkpoint interval, which tests shrink to one entry, is
/// not the group's).
pub const MANAGER_SNAPSHOT_INTERVAL_ENTRIES: u64 = 64;
const _: () = assert!(MANAGER_SNAPSHOT_INTERVAL_ENTRIES >= crate::SNAPSHOT_INTERVAL_ENTRIES_MIN);

/// Heartbeats per detection timeout: a node is deposed only after this many in a row were
/// lost or late.
pub const BEATS_PER_TIMEOUT: u64 = 5;

/// One node's part in the view manager.
pub(super) struct Managing {
    /// The group's members, member 0 first.
    members: Vec<NodeId>,
    /// The server nodes (whose silence counts).
    servers: Vec<NodeId>,
    /// This node's member of the group, if it is one.
    host: Option<Hosts<ManagerMachine>>,
    /// What this member heard (kept on every member; only the group's leader acts on it).
    heartbeats: Heartbeats,
    /// Per node, the shards its latest heartbeat said it could not lead, and the global view
    /// it said so in.
    unable: BTreeMap<NodeId, (u64, Vec<ShardId>)>,
    /// Per node, the shards of those it could lead as a last resort (its heartbeat's
    /// `stashed`).
    stashed: BTreeMap<NodeId, Vec<ShardId>>,
    /// Per node, the number (incarnation, count) of its latest heartbeat taken.
    beats: BTreeMap<NodeId, (u64, u64)>,
    /// This node's heartbeats sent in this incarnation.
    beats_sent: u64,
    /// The delays this node measured from the other server nodes' probes.
    probes: ProbeDelays,
    /// The delays between server nodes their heartbeats reported (kept on every member;
    /// the group's leader decides `auto` modes by them).
    measured: MeasuredDelays,
    /// The global number of the starting view.
    start_global: u64,
    /// When this member last took the group's lead (none while it does not lead).
    leading_since: Option<Time>,
    /// The global number of the group's current view and when this member first saw it.
    view_seen: (u64, Time),
    /// The install last proposed: its global view number and when.
    proposed: Option<(u64, Time)>,
    /// The group's effects, passed on to the node's outbox after every call.
    out: Outbox<ManagerMsg>,
    detect_ns: u64,
    /// The agreement mode as configured: `auto` lets each new view pick it from where its
    /// leaders sit.
    mode: Mode,
    tick_ns: u64,
    /// Raft ticks between heartbeats.
    ticks_per_beat: u64,
    ticks: u64,
    proposed_total: u64,
    /// Of those, views that only change the agreement mode.
    mode_proposed_total: u64,
    views_sent_total: u64,
    foreign_total: u64,
}

impl std::fmt::Debug for Managing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Managing")
            .field("members", &self.members)
            .field("member", &self.host.is_some())
            .field("leading_since", &self.leading_since)
            .field("proposed", &self.proposed)
            .finish_non_exhaustive()
    }
}

impl Managing {
    /// True when this node hosts its member of the group (tests).
    #[cfg(test)]
    pub(super) fn is_member(&self) -> bool {
        self.host.is_some()
    }

    /// The delay between two server nodes as the heartbeats reported it (tests).
    #[cfg(test)]
    pub(super) fn measured_between(&self, a: NodeId, b: NodeId) -> Option<u64> {
        self.measured.between(a, b)
    }

    /// What this node's next heartbeat reports of the probes it received (tests).
    #[cfg(test)]
    pub(super) fn probe_report(&self) -> Vec<(NodeId, i64)> {
        self.probes.report()
    }

    /// The shards `node`'s latest heartbeat said it could not lead (tests).
    #[cfg(test)]
    pub(super) fn unable_of(&self, node: NodeId) -> Vec<ShardId> {
        self.unable.get(&node).map(|(_, u)| u.clone()).unwrap_or_default()
    }
}

impl TigaNode {
    /// Hosts this node's part in the view manager when the cluster has one (`2f + 1 >= 3`
    /// replicas and `tiga-view-manager=on`, or luigi's `luigi-view-manager=on`): a member
    /// rebuilds its group member from `durable`. Luigi's views stay preventive.
    pub(crate) fn host_manager(&mut self, durable: &Durable) -> Result<(), String> {
        let topology = self.context.topology.clone();
        let options = &self.context.options;
        let ManagerSettings { on, detect_ns, mode } = (self.variant.manager)(options);
        if !on || topology.replicas < 3 {
            return Ok(());
        }
        // The members are chosen from the starting view, which every node computes alike
        // (a restarted node may be in a later one).
        let start = (self.variant.starting_view)(&topology, options)?;
        let members = manager_members(&topology, &start);
        // A member that restarts without its group's records (a driver keeping nothing
        // across restarts) lost its votes and its log: as a voter again it could elect a
        // second leader in a term or trip its peers' log checks. It sits the group out
        // (heartbeats only); the others keep a majority with state.
        let amnesiac =
            self.context.incarnation > 0 && !meridian_replication::raft::has_records(durable, 0);
        let host = if members.contains(&self.context.id) && !amnesiac {
            let group = Arc::new(manager_topology(&topology, &members)?);
            let mut context = self.context.clone();
            context.topology = group;
            context.timing.snapshot_interval_entries = MANAGER_SNAPSHOT_INTERVAL_ENTRIES;
            let host = Hosts::restore(&context, durable, ManagerMsg::Raft, |_| {
                ManagerMachine::new(&topology, start.clone())
            })?;
            Some(host.with_persist_tokens_from(MANAGER_TOKENS_FROM))
        } else {
            None
        };
        let tick_ns = self.context.timing.raft_tick_ns.max(1);
        self.manager = Some(Box::new(Managing {
            members,
            servers: server_nodes(&topology),
            host,
            heartbeats: Heartbeats::default(),
            unable: BTreeMap::new(),
            stashed: BTreeMap::new(),
            beats: BTreeMap::new(),
            beats_sent: 0,
            probes: ProbeDelays::default(),
            measured: MeasuredDelays::default(),
            start_global: start.global,
            leading_since: None,
            view_seen: (start.global, 0),
            proposed: None,
            out: Outbox::new(),
            detect_ns,
            mode,
            tick_ns,
            ticks_per_beat: (detect_ns / BEATS_PER_TIMEOUT / tick_ns).max(1),
            ticks: 0,
            proposed_total: 0,
            mode_proposed_total: 0,
            views_sent_total: 0,
            foreign_total: 0,
        }));
        Ok(())
    }

    /// At start: the member replays its group log, and the node starts beating.
    pub(super) fn manager_started(&mut self, now: Time, out: &mut Outbox<TigaMsg>) {
        let Some(m) = self.manager.as_mut() else { return };
        if let Some(host) = m.host.as_mut() {
            host.on_start(&mut m.out);
            host.flush(&mut m.out);
        }
        self.timers.set(Purpose::Manage, m.tick_ns, out);
        self.manager_tick(now, true, out);
    }

    /// The manager's timer: a Raft tick, a heartbeat every few, and on the group's leader
    /// the check for dead shard leaders.
    pub(super) fn manager_timer(&mut self, now: Time, out: &mut Outbox<TigaMsg>) {
        let Some(m) = self.manager.as_mut() else { return };
        if let Some(host) = m.host.as_mut() {
            host.tick(&mut m.out);
            host.flush(&mut m.out);
        }
        m.ticks += 1;
        let beat = m.ticks.is_multiple_of(m.ticks_per_beat);
        self.timers.set(Purpose::Manage, m.tick_ns, out);
        self.manager_tick(now, beat, out);
    }

    fn manager_tick(&mut self, now: Time, beat: bool, out: &mut Outbox<TigaMsg>) {
        // A member installs what its group applied (committed views) itself: its own
        // announcement may be lost like any message.
        let applied = self
            .manager
            .as_ref()
            .and_then(|m| m.host.as_ref())
            .and_then(|h| h.get(ShardId(0)))
            .map(|sm| sm.view().clone())
            .filter(|v| v.global > self.view.global);
        if let Some(view) = applied {
            if self.install_view(now, view, out).is_err() {
                self.counts.views_refused_total += 1;
            }
        }
        let me = self.context.id;
        let view = self.view.global;
        let incarnation = self.context.incarnation;
        let hosted = &self.hosted;
        let (context, view_now) = (&self.context, &self.view);
        let Some(m) = self.manager.as_mut() else { return };
        if beat {
            // A replica that holds no log cannot lead its shard: the manager must not pick it.
            // A deposed leader chosen again waits for the other replicas' word before it
            // leads on from the state it kept (`clear_deposed`): it is not unable meanwhile.
            let leads = |h: &Hosted| leader_node(context, view_now, h.shard) == Some(me);
            let waits = |h: &Hosted| h.deposed.is_some() && leads(h);
            let unable: Vec<ShardId> = hosted
                .values()
                .filter(|h| (h.retired || h.follow.joining.is_some()) && !waits(h))
                .map(|h| h.shard)
                .collect();
            // Kept state to lead from, as a last resort.
            let kept = |h: &Hosted| h.stashed.is_some() || h.deposed.is_some();
            let stashed: Vec<ShardId> = hosted
                .values()
                .filter(|h| h.follow.joining.is_some() && kept(h) && !waits(h))
                .map(|h| h.shard)
                .collect();
            m.beats_sent += 1;
            let beat = (incarnation, m.beats_sent);
            let delays = m.probes.report();
            for &member in &m.members {
                if member == me {
                    m.heartbeats.heard(me, now);
                    m.unable.insert(me, (view, unable.clone()));
                    m.stashed.insert(me, stashed.clone());
                    m.measured.report(me, &delays);
                } else {
                    let (unable, stashed, delays) =
                        (unable.clone(), stashed.clone(), delays.clone());
                    let heartbeat = ManagerMsg::Heartbeat { view, unable, stashed, beat, delays };
                    m.out.send(member, heartbeat);
                }
            }
            // Once per detection timeout, the server nodes probe one another for the delays
            // between them (`auto` decides a view's mode by them).
            if (m.beats_sent - 1).is_multiple_of(BEATS_PER_TIMEOUT) && m.servers.contains(&me) {
                for &server in m.servers.iter().filter(|&&s| s != me) {
                    m.out.send(server, ManagerMsg::Probe { sent_at: now });
                }
            }
        }
        let Some(host) = m.host.as_mut() else { return };
        if !host.leads(ShardId(0)) {
            m.leading_since = None;
            return;
        }
        let since = *m.leading_since.get_or_insert(now);
        let machine = host.get(ShardId(0)).expect("the member hosts the group");
        let current = machine.view().clone();
        if m.view_seen.0 != current.global {
            m.view_seen = (current.global, now);
        }
        let alive = m.heartbeats.alive(&m.servers, now, since, m.detect_ns);
        let said = Said { unable: &m.unable, stashed: &m.stashed };
        let topology = &self.context.topology;
        let eligible = |shard: ShardId, node: NodeId| {
            may_lead(&current, topology, &alive, said, (shard, node))
        };
        // In `auto` mode the next view's leaders agree before executing when they are
        // within the co-location delay of one another and detect afterwards when they are
        // not, by the delays the nodes measured (by the regions where none was measured
        // yet). While every leader lives and can lead, a view only changes the mode, when
        // the measured delays call for it; nothing while some shard has no replica to lead.
        let measured = &m.measured;
        let apart = |a: NodeId, b: NodeId| measured.or_regions(topology, a, b);
        let mode_only;
        let install = match next_install(&current, topology, &eligible, m.mode, apart) {
            Some(install) => {
                mode_only = false;
                install
            }
            None => {
                // A fresh group leader waits a detection timeout first, as for a deposition
                // (the heartbeats it holds may be older than the view), and every view stands
                // for a detection timeout before its mode changes: each change is a view
                // change, which costs the coordinators the replies they were collecting.
                let settled = now.saturating_sub(since.max(m.view_seen.1)) >= m.detect_ns;
                let next = next_mode_install(&current, topology, &eligible, m.mode, measured);
                let Some(install) = next.filter(|_| settled) else { return };
                mode_only = true;
                install
            }
        };
        let again = m.proposed.is_none_or(|(global, at)| {
            global != current.global + 1 || now.saturating_sub(at) >= m.detect_ns
        });
        if again && host.submit(ShardId(0), install, &mut m.out).is_ok() {
            host.flush(&mut m.out);
            m.proposed = Some((current.global + 1, now));
            m.proposed_total += 1;
            m.mode_proposed_total += u64::from(mode_only);
        }
    }

    /// A message of the view manager's. `out` is the step's outbox (a view installed here
    /// sends under the journal's rules).
    pub(super) fn on_manager(
        &mut self,
        now: Time,
        from: NodeId,
        msg: ManagerMsg,
        out: &mut Outbox<TigaMsg>,
    ) {
        let Some(m) = self.manager.as_mut() else {
            self.counts.dropped_total += 1;
            return;
        };
        match msg {
            ManagerMsg::Raft(groups) => match m.host.as_mut() {
                Some(host) => {
                    host.on_raft(from, groups, &mut m.out);
                    host.flush(&mut m.out);
                }
                None => m.foreign_total += 1,
            },
            ManagerMsg::Heartbeat { view, unable, stashed, beat, delays } => {
                let Some(host) = m.host.as_ref() else {
                    m.foreign_total += 1;
                    return;
                };
                let topology = &self.context.topology;
                let hosts = |s: &ShardId| topology.shard_nodes(*s).contains(&from);
                let server = |n: &NodeId| m.servers.contains(n);
                if from.0 as usize >= topology.nodes.len()
                    || unable.len() > topology.shards as usize
                    || !unable.iter().all(hosts)
                    || !stashed.iter().all(|s| unable.contains(s))
                    || delays.len() > m.servers.len()
                    || !delays.iter().all(|(n, _)| server(n))
                    || !delays.windows(2).all(|w| w[0].0 < w[1].0)
                {
                    m.foreign_total += 1;
                    return;
                }
                if m.beats.get(&from).is_some_and(|&last| last >= beat) {
                    return; // A late or repeated copy: what it says is out of date.
                }
                m.beats.insert(from, beat);
                m.heartbeats.heard(from, now);
                m.unable.insert(from, (view, unable));
                m.stashed.insert(from, stashed);
                if m.servers.contains(&from) {
                    m.measured.report(from, &delays);
                }
                if !host.leads(ShardId(0)) {
                    return;
                }
                let current = host.get(ShardId(0)).expect("the member hosts the group").view();
                if view < current.global {
                    m.out.send(from, ManagerMsg::View(ViewRecord::of(current)));
                }
            }
            ManagerMsg::Probe { sent_at } => {
                if from == self.context.id || !m.servers.contains(&from) {
                    m.foreign_total += 1;
                    return;
                }
                m.probes.observe(from, sent_at, now);
            }
            ManagerMsg::View(record) => {
                let shards = self.context.topology.shards;
                if !m.members.contains(&from) || record.check(shards).is_err() {
                    m.foreign_total += 1;
                    return;
                }
                if record.global <= self.view.global {
                    return; // Installed already (an announcement and an answer both came).
                }
                if self.install_view(now, record.view(), out).is_err() {
                    self.counts.views_refused_total += 1;
                }
            }
        }
    }

    /// A persist of the manager's group log completed (`token` at or above
    /// [`MANAGER_TOKENS_FROM`]).
    pub(super) fn manager_persisted(&mut self, token: PersistToken) {
        let Some(m) = self.manager.as_mut() else { return };
        if let Some(host) = m.host.as_mut() {
            host.on_persisted(token, &mut m.out);
            host.flush(&mut m.out);
        }
    }

    /// Passes the manager's effects on to the node's outbox, outside the journal's hold (the
    /// group's log keeps its own order of persists and sends).
    pub(super) fn flush_manager(&mut self, out: &mut Outbox<TigaMsg>) {
        let Some(m) = self.manager.as_mut() else { return };
        for effect in m.out.drain() {
            match effect {
                Effect::Send { to, msg } => {
                    if let ManagerMsg::View(_) = &msg {
                        m.views_sent_total += 1;
                    }
                    out.send(to, TigaMsg::Manager(msg));
                }
                Effect::Persist { token, records, durability } => {
                    debug_assert!(token.0 >= MANAGER_TOKENS_FROM);
                    out.persist(token, records, durability);
                }
                Effect::SetTimer { .. } | Effect::Reply { .. } | Effect::DependsOn { .. } => {
                    debug_assert!(false, "the manager group sets no timer and answers no client");
                }
            }
        }
    }

    /// The manager's counters (zero where the node takes no part).
    pub(super) fn manager_counters(&self) -> Vec<(&'static str, u64)> {
        let m = self.manager.as_deref();
        let host = m.and_then(|m| m.host.as_ref());
        let leads = host.is_some_and(|h| h.leads(ShardId(0)));
        // Views the group applied since the start (summed over a cluster: members × views).
        let applied = host
            .and_then(|h| h.get(ShardId(0)))
            .zip(m)
            .map_or(0, |(sm, m)| sm.view().global.saturating_sub(m.start_global));
        super::counters::prefixed!(
            self.variant,
            [
                ("manager_leads", u64::from(leads)),
                ("manager_views_applied_total", applied),
                ("manager_proposed_total", m.map_or(0, |m| m.proposed_total)),
                ("manager_mode_proposed_total", m.map_or(0, |m| m.mode_proposed_total)),
                ("manager_views_sent_total", m.map_or(0, |m| m.views_sent_total)),
                ("manager_foreign_total", m.map_or(0, |m| m.foreign_total)),
            ]
        )
    }
}
