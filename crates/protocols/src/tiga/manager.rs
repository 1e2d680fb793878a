//! The view manager's replicated state (Tiga §4): the current [`View`], changed only through
//! the manager group's log so that every member holds the same one. The group's leader keeps
//! the heartbeats (outside the replicated state) and, when a shard's leader has gone silent,
//! proposes the next view ([`next_install`]); every member applies the installs in log order,
//! and the leader announces each new view to every node.
//!
//! A command is checked twice, as the kit's hosting does for every machine: before it enters
//! the log, from its contents alone (a view for this topology's shard count, a mode that is
//! preventive or detective), and when applied, against the state (the next global view
//! number, no shard's local view number lower than now). An install that fails the second
//! check (a stale proposal of a deposed manager leader) is skipped and counted, never applied.
//!
//! **Hosting.** The group runs on the kit's hosting ([`crate::kit::host::Hosts`]) as the one
//! "shard" of a topology of its own ([`manager_topology`]): the cluster's nodes and regions,
//! with replica `i` of group 0 on the `i`-th member. Its Raft records are those of group 0 in
//! the node's durable map, so a node that also hosts shard logs keeps the manager's records
//! apart (its own persist tokens and key space); Tiga's shards do not run Raft.
//!
//! The node that drives it (heartbeats, detection, proposing [`next_install`] on the group's
//! leader, announcing views) is `super::node::manage`; the members are chosen by
//! [`manager_members`].

use super::view::{leaderless_where, measured_mode_change, next_view_where, MeasuredDelays, View};
use super::Mode;
use crate::kit::host::StateMachine;
use crate::NodeContext;
use meridian_core::node::Outbox;
use meridian_core::topology::Topology;
use meridian_core::{NodeId, ShardId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// A view as the log and the wire carry it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewRecord {
    /// The global view number.
    pub global: u64,
    /// Per shard, its local view number.
    pub local: Vec<u64>,
    /// True for detective agreement, false for preventive.
    pub detective: bool,
}

impl ViewRecord {
    /// The record of `view` (whose mode is never `Auto`).
    pub fn of(view: &View) -> Self {
        debug_assert!(view.mode != Mode::Auto, "a view's mode is decided");
        Self {
            global: view.global,
            local: view.local.clone(),
            detective: view.mode == Mode::Detective,
        }
    }

    /// The view it records.
    pub fn view(&self) -> View {
        let mode = if self.detective { Mode::Detective } else { Mode::Preventive };
        View { global: self.global, local: self.local.clone(), mode }
    }

    /// Checks it against the topology's shard count.
    pub fn check(&self, shards: u32) -> Result<(), String> {
        if self.local.len() != shards as usize {
            return Err(format!("a view of {} shards in a cluster of {shards}", self.local.len()));
        }
        Ok(())
    }
}

/// A change of the manager's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ManagerCommand {
    /// Install the next view.
    Install(ViewRecord),
}

/// What the manager's members and the nodes send each other (inside
/// [`super::node::TigaMsg::Manager`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ManagerMsg {
    /// Member → node: the current view (an announcement, or the answer to a heartbeat that
    /// carried an older one).
    View(ViewRecord),
    /// Between members: the group's log messages.
    Raft(Vec<crate::kit::host::RaftGroupMsgs>),
    /// Node → every member: alive, in global view `view`.
    Heartbeat {
        /// The sender's global view number.
        view: u64,
        /// The shards it hosts a replica of but could not lead (rejoining by a state
        /// transfer, or retired): at most one per shard.
        unable: Vec<ShardId>,
        /// Of those, the shards it rejoins at a view change that it could still lead from
        /// the log it held before (see the node's view change): the manager picks one only
        /// as a last resort, when no other live replica of the shard can lead.
        stashed: Vec<ShardId>,
        /// The sender's incarnation and its heartbeat's number in it: a member takes a
        /// node's heartbeats in this order only (a late copy must not undo a newer one).
        beat: (u64, u64),
        /// The one-way delays the sender measured from other server nodes' probes (the
        /// median of its recent samples per sender, ns; signed, as they include the offset
        /// between the two nodes' clocks), by increasing node id: at most one per node.
        delays: Vec<(NodeId, i64)>,
    },
    /// Server node → every other server node, once per detection timeout: the sender's clock
    /// at sending, from which the receiver measures the delay between them.
    Probe {
        /// The sender's clock when it sent the probe.
        sent_at: meridian_core::Time,
    },
}

/// The members of the manager group of `topology` (whose shards start in `view`): `replicas`
/// server nodes (`2f + 1`, so the group survives as many failures as a shard; nodes that
/// host no replica, a remote region's coordinators, take no part), one per region while
/// regions last, preferring nodes that lead no shard in `view` (a leader's crash then costs
/// the group no member), then the lowest node id. Member 0 is the group's preferred leader.
pub fn manager_members(topology: &Topology, view: &View) -> Vec<NodeId> {
    let leaders: BTreeSet<NodeId> = view.leaders(topology).into_iter().collect();
    let mut candidates: Vec<NodeId> = server_nodes(topology);
    candidates.sort_by_key(|n| (leaders.contains(n), n.0));
    let count = (topology.replicas as usize).min(candidates.len());
    let mut members: Vec<NodeId> = Vec::with_capacity(count);
    let mut regions = BTreeSet::new();
    // First one per region, then anyone left, each pass in the candidates' order.
    for &node in &candidates {
        if members.len() < count && regions.insert(topology.region_of(node)) {
            members.push(node);
        }
    }
    for &node in &candidates {
        if members.len() < count && !members.contains(&node) {
            members.push(node);
        }
    }
    members
}

/// The nodes that host a replica: those that send heartbeats and may lead.
pub fn server_nodes(topology: &Topology) -> Vec<NodeId> {
    topology.node_ids().filter(|n| !topology.nodes[n.0 as usize].replicas.is_empty()).collect()
}

/// The topology the manager group is hosted by: `topology`'s nodes and regions, one group
/// (shard 0) whose replica `i` is `members[i]`. `members` must be distinct nodes of
/// `topology`, at least one.
pub fn manager_topology(topology: &Topology, members: &[NodeId]) -> Result<Topology, String> {
    let distinct: BTreeSet<NodeId> = members.iter().copied().collect();
    if members.is_empty() || distinct.len() != members.len() {
        return Err(format!("manager members {members:?}: distinct nodes, at least one"));
    }
    let mut nodes: Vec<meridian_core::topology::NodeInfo> = topology
        .nodes
        .iter()
        .map(|n| meridian_core::topology::NodeInfo { replicas: Vec::new(), ..n.clone() })
        .collect();
    for (slot, member) in members.iter().enumerate() {
        let Some(node) = nodes.get_mut(member.0 as usize) else {
            return Err(format!("manager member {member} is not in the cluster"));
        };
        node.replicas.push(meridian_core::topology::ReplicaSlot {
            shard: meridian_core::ShardId(0),
            replica: slot as u32,
        });
    }
    Ok(Topology {
        regions: topology.regions.clone(),
        nodes,
        shards: 1,
        replicas: members.len() as u32,
    })
}

/// The manager's replicated state on one member of its group.
#[derive(Debug)]
pub struct ManagerMachine {
    shards: u32,
    /// Every node, to announce views to.
    nodes: Vec<NodeId>,
    view: View,
    /// Installs skipped when applied (out of turn).
    skipped_total: u64,
}

impl ManagerMachine {
    /// The manager of `topology`, whose nodes start in `view`.
    pub fn new(topology: &Topology, view: View) -> Self {
        debug_assert_eq!(view.local.len(), topology.shards as usize);
        Self {
            shards: topology.shards,
            nodes: topology.node_ids().collect(),
            view,
            skipped_total: 0,
        }
    }

    /// The current view.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// Installs skipped as out of turn.
    pub fn skipped_total(&self) -> u64 {
        self.skipped_total
    }

    fn in_turn(&self, next: &View) -> bool {
        self.view.global.checked_add(1) == Some(next.global)
            && next.local.iter().zip(&self.view.local).all(|(new, old)| new >= old)
    }
}

impl StateMachine for ManagerMachine {
    type Command = ManagerCommand;
    type Msg = ManagerMsg;
    /// A node asking for the current view.
    type Read = NodeId;
    type Image = ViewRecord;

    fn validate(&self, command: &ManagerCommand) -> Result<(), String> {
        let ManagerCommand::Install(record) = command;
        record.check(self.shards)
    }

    fn apply(&mut self, command: ManagerCommand, answer: bool, out: &mut Outbox<ManagerMsg>) {
        let ManagerCommand::Install(record) = command;
        let next = record.view();
        if record.check(self.shards).is_err() || !self.in_turn(&next) {
            self.skipped_total += 1;
            return;
        }
        self.view = next;
        if answer {
            for &node in &self.nodes {
                out.send(node, ManagerMsg::View(record.clone()));
            }
        }
    }

    fn serve_read(&mut self, node: NodeId, out: &mut Outbox<ManagerMsg>) {
        out.send(node, ManagerMsg::View(ViewRecord::of(&self.view)));
    }

    fn image(&self) -> Vec<u8> {
        postcard::to_allocvec(&ViewRecord::of(&self.view)).expect("a view serializes")
    }

    fn decode_image(&self, _context: &NodeContext, bytes: &[u8]) -> Result<ViewRecord, String> {
        let record: ViewRecord =
            postcard::from_bytes(bytes).map_err(|e| format!("view manager image: {e}"))?;
        // Against the cluster's shard count: the group runs in a topology of its own (one
        // shard), which `_context` describes.
        record.check(self.shards)?;
        Ok(record)
    }

    fn install(&mut self, image: ViewRecord) {
        self.view = image.view();
    }
}

/// What the manager group's leader proposes when some shard's leader is not `alive`: the
/// next view ([`next_view`]) for the shards whose leader is dead, or nothing while every
/// leader lives or while some shard has no live replica. `configured`: the mode setting;
/// `owd_ns`: measured one-way delays.
///
/// A live leader keeps its shard even where [`next_view`] would move it to sit with the
/// others: a deposed live leader retires its replica until its node restarts (its store may
/// hold writes the rebuilt log drops), so moving it would cost its shard a replica, and
/// with three replicas every fast path.
///
/// `eligible(shard, node)`: the node is alive and able to lead the shard (a replica that
/// holds no log, rejoining or retired, is not: it would only retire again).
pub fn next_install(
    view: &View,
    topology: &Topology,
    eligible: &dyn Fn(ShardId, NodeId) -> bool,
    configured: Mode,
    owd_ns: impl Fn(NodeId, NodeId) -> u64,
) -> Option<ManagerCommand> {
    let dead: BTreeSet<ShardId> = leaderless_where(view, topology, eligible).into_iter().collect();
    if dead.is_empty() {
        return None;
    }
    let mut next = next_view_where(view, topology, eligible, configured, &owd_ns)?;
    for shard in (0..topology.shards).map(ShardId).filter(|s| !dead.contains(s)) {
        next.local[shard.0 as usize] = view.local[shard.0 as usize];
    }
    // The mode of the leaders the view has, not of those it would have had moving every one.
    next.mode = super::view::mode_of(&next.leaders(topology), configured, owd_ns);
    Some(ManagerCommand::Install(ViewRecord::of(&next)))
}

/// What the manager group's leader proposes when every shard's leader may lead on and the
/// mode is `auto` (`configured`): the same leaders in the other agreement mode, when the
/// delays `measured` between them call for it ([`measured_mode_change`]); otherwise nothing.
/// A view's mode is decided from the regions where a delay was not measured yet; this is
/// where measurements correct it, and where a change of the network shows.
pub fn next_mode_install(
    view: &View,
    topology: &Topology,
    eligible: &dyn Fn(ShardId, NodeId) -> bool,
    configured: Mode,
    measured: &MeasuredDelays,
) -> Option<ManagerCommand> {
    if configured != Mode::Auto || !leaderless_where(view, topology, eligible).is_empty() {
        return None;
    }
    let mode = measured_mode_change(&view.leaders(topology), view.mode, measured)?;
    let next = View { global: view.global.checked_add(1)?, local: view.local.clone(), mode };
    Some(ManagerCommand::Install(ViewRecord::of(&next)))
}

/// What the manager's leader heard the nodes say in their heartbeats: per node, the global
/// view it spoke in and the shards it could not lead; and of those, the shards it could lead
/// as a last resort (it rejoins, but kept the log it held).
#[derive(Clone, Copy, Debug)]
pub struct Said<'a> {
    /// Per node: the global view of its latest heartbeat, the shards it could not lead.
    pub unable: &'a BTreeMap<NodeId, (u64, Vec<ShardId>)>,
    /// Per node: the shards of those it could lead as a last resort.
    pub stashed: &'a BTreeMap<NodeId, Vec<ShardId>>,
}

/// True when `node` may lead `shard` in the view after `view`, or keep leading it: it is
/// `alive`, and it did not say it could not, or it is the shard's leader in `view` and said
/// so only in an older view (chosen as it finished rejoining, it said "unable" a moment
/// before and leads now), or it can lead as a last resort and no other live replica of the
/// shard can (without it, the shard would wait for good: every other replica rejoins
/// without a log or is a retired deposed leader).
pub fn may_lead(
    view: &View,
    topology: &Topology,
    alive: &BTreeSet<NodeId>,
    said: Said<'_>,
    (shard, node): (ShardId, NodeId),
) -> bool {
    let able = |node: NodeId| {
        let leads = topology.replica_node(shard, view.leader_slot(shard, topology.replicas));
        alive.contains(&node)
            && said.unable.get(&node).is_none_or(|(said_in, unable)| {
                !unable.contains(&shard) || (leads == Some(node) && *said_in < view.global)
            })
    };
    if able(node) {
        return true;
    }
    alive.contains(&node)
        && said.stashed.get(&node).is_some_and(|s| s.contains(&shard))
        && !topology.shard_nodes(shard).into_iter().any(able)
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::time::NS_PER_MS;
    use meridian_core::RegionId;

    fn topology() -> Topology {
        Topology::standard(vec!["a".into(), "b".into(), "c".into()], 2, 3).unwrap()
    }

    fn owd(_: NodeId, _: NodeId) -> u64 {
        NS_PER_MS
    }

    fn context(t: &Topology) -> NodeContext {
        let workload = meridian_workloads::build(
            "bank",
            &meridian_workloads::WorkloadOptions { shards: t.shards, ..Default::default() },
        )
        .unwrap();
        NodeContext::new(
            NodeId(0),
            std::sync::Arc::new(t.clone()),
            std::sync::Arc::new(workload.registry()),
            std::sync::Arc::new(workload.partitioner()),
            7,
            crate::Timing::for_network(NS_PER_MS),
        )
    }

    #[test]
    fn a_snapshot_of_the_manager_group_restores_in_the_groups_own_topology() {
        // The group's members restore its snapshot with the group's context (a topology of
        // one shard); a view of the cluster's two shards must decode there. Found by the
        // nemesis: a server restarted after the group's first snapshot (64 installs) refused
        // to start ("a view of 3 shards in a cluster of 1").
        let t = topology();
        let machine = ManagerMachine::new(&t, View::initial(t.shards, Mode::Preventive));
        let group = Topology::standard(vec!["a".into()], 1, 3).unwrap();
        let group_context = context(&group);
        let image = machine.image();
        let record = machine.decode_image(&group_context, &image).unwrap();
        assert_eq!(record.local.len(), t.shards as usize);
        // A view of another shard count is still refused.
        let other = ManagerMachine::new(&group, View::initial(1, Mode::Preventive));
        assert!(machine.decode_image(&group_context, &other.image()).is_err());
    }

    #[test]
    fn measured_delays_change_the_mode_of_a_view_whose_leaders_all_stay() {
        let t = topology();
        let view = View::initial(t.shards, Mode::Preventive);
        let everyone = |_: ShardId, _: NodeId| true;
        let leaders: Vec<NodeId> =
            (0..t.shards).map(|s| t.replica_node(ShardId(s), 0).unwrap()).collect();
        let mut measured = MeasuredDelays::default();
        assert_eq!(next_mode_install(&view, &t, &everyone, Mode::Auto, &measured), None);
        // The two leaders measured 40 ms apart.
        let far = 40 * NS_PER_MS as i64;
        measured.report(leaders[0], &[(leaders[1], far)]);
        measured.report(leaders[1], &[(leaders[0], far)]);
        let install = next_mode_install(&view, &t, &everyone, Mode::Auto, &measured).unwrap();
        let ManagerCommand::Install(record) = &install;
        assert_eq!(record.global, view.global + 1);
        assert_eq!(record.local, view.local, "every leader stays");
        assert!(record.detective);
        // It applies in turn like any install.
        let mut machine = ManagerMachine::new(&t, view.clone());
        machine.apply(install.clone(), false, &mut Outbox::new());
        assert_eq!(machine.view().mode, Mode::Detective);
        // A configured mode stays; so does the mode while a leader must be replaced (that
        // view decides the mode itself).
        for configured in [Mode::Preventive, Mode::Detective] {
            assert_eq!(next_mode_install(&view, &t, &everyone, configured, &measured), None);
        }
        let leader_dead = |_: ShardId, n: NodeId| n != leaders[0];
        assert_eq!(next_mode_install(&view, &t, &leader_dead, Mode::Auto, &measured), None);
        // And a view change the leaders' delays take part in.
        let install =
            next_install(&view, &t, &leader_dead, Mode::Auto, |a, b| measured.or_regions(&t, a, b))
                .unwrap();
        let ManagerCommand::Install(record) = install;
        assert_ne!(record.local, view.local);
        let next = record.view();
        let new_leaders: Vec<NodeId> = (0..t.shards)
            .map(|s| t.replica_node(ShardId(s), next.leader_slot(ShardId(s), 3)).unwrap())
            .collect();
        // The pair measured goes by its delay, any other by the regions.
        let apart = measured.or_regions(&t, new_leaders[0], new_leaders[1]) > 10 * NS_PER_MS;
        assert_eq!(record.detective, apart, "{new_leaders:?}");
    }

    #[test]
    fn a_dead_leader_gets_the_next_view_and_every_member_installs_it_alike() {
        let t = topology();
        let mut members: Vec<ManagerMachine> = (0..3)
            .map(|_| ManagerMachine::new(&t, View::initial(t.shards, Mode::Preventive)))
            .collect();
        let everyone: BTreeSet<NodeId> = t.node_ids().collect();
        let view = members[0].view().clone();
        assert_eq!(
            next_install(&view, &t, &|_, n| everyone.contains(&n), Mode::Preventive, owd),
            None
        );
        let leader0 = t.replica_node(ShardId(0), view.leader_slot(ShardId(0), 3)).unwrap();
        let mut alive = everyone.clone();
        alive.remove(&leader0);
        let install =
            next_install(&view, &t, &|_, n| alive.contains(&n), Mode::Preventive, owd).unwrap();
        assert_eq!(members[0].validate(&install), Ok(()));
        let mut out = Outbox::new();
        for (i, m) in members.iter_mut().enumerate() {
            m.apply(install.clone(), i == 0, &mut out);
        }
        let next = members[0].view().clone();
        assert_eq!(next.global, 1);
        assert_ne!(t.replica_node(ShardId(0), next.leader_slot(ShardId(0), 3)), Some(leader0));
        assert!(members.iter().all(|m| *m.view() == next), "one view on every member");
        // Only the answering member announced it, to every node.
        assert_eq!(out.len(), t.nodes.len());
        // The same install again, or an older one, is out of turn: skipped.
        let mut quiet = Outbox::new();
        members[1].apply(install, true, &mut quiet);
        assert_eq!(members[1].skipped_total(), 1);
        assert!(quiet.is_empty());
        assert_eq!(*members[1].view(), next);
    }

    #[test]
    fn members_sit_in_distinct_regions_away_from_the_leaders() {
        let regions = vec!["a".into(), "b".into(), "c".into(), "remote".into()];
        let servers = [RegionId(0), RegionId(1), RegionId(2)];
        let t = Topology::placed(regions, &servers, 3, 3).unwrap();
        let view = crate::tiga::node::initial_view(&t).unwrap();
        let members = manager_members(&t, &view);
        assert_eq!(members.len(), 3);
        let regions: BTreeSet<RegionId> = members.iter().map(|&n| t.region_of(n)).collect();
        assert_eq!(regions.len(), 3, "{members:?}: one per server region");
        let leaders: BTreeSet<NodeId> = (0..3)
            .map(|s| t.replica_node(ShardId(s), view.leader_slot(ShardId(s), 3)).unwrap())
            .collect();
        // The leaders sit together in one region: its member must be one of them, the
        // others are not.
        let leading = members.iter().filter(|n| leaders.contains(n)).count();
        assert_eq!(leading, 1, "{members:?} against leaders {leaders:?}");
        assert!(members.iter().all(|n| !t.nodes[n.0 as usize].replicas.is_empty()));
        assert_eq!(members, manager_members(&t, &view), "the same choice every time");
        // One replica per shard: a group of one.
        let single = Topology::standard(vec!["a".into()], 2, 1).unwrap();
        let view = View::initial(2, Mode::Preventive);
        assert_eq!(manager_members(&single, &view).len(), 1);
    }

    /// Only shards whose leader is dead or says it cannot lead move, never onto a replica
    /// that cannot lead; live leaders stay where they are.
    #[test]
    fn only_dead_or_unable_leaders_move() {
        let t = topology();
        let view = View::initial(t.shards, Mode::Preventive);
        let leader = |s: u32| t.replica_node(ShardId(s), view.leader_slot(ShardId(s), 3)).unwrap();
        let local = |c: ManagerCommand| {
            let ManagerCommand::Install(record) = c;
            record.local
        };
        // Shard 0's leader is dead: shard 1 keeps its live leader, wherever it sits.
        let dead = leader(0);
        let moved =
            local(next_install(&view, &t, &|_, n| n != dead, Mode::Preventive, owd).unwrap());
        assert_ne!(moved[0], view.local[0]);
        assert_eq!(moved[1], view.local[1]);
        // Shard 1's leader lives but cannot lead, nor can its replica 1: replica 2 leads.
        let unable = [leader(1), t.replica_node(ShardId(1), 1).unwrap()];
        let eligible = |s: ShardId, n: NodeId| !(s == ShardId(1) && unable.contains(&n));
        let moved = local(next_install(&view, &t, &eligible, Mode::Preventive, owd).unwrap());
        assert_eq!(moved[0], view.local[0]);
        assert_eq!(moved[1] % 3, 2);
        // No replica of shard 1 could lead: no view serves it, nothing is proposed.
        let none = |s: ShardId, _: NodeId| s != ShardId(1);
        assert_eq!(next_install(&view, &t, &none, Mode::Preventive, owd), None);
    }

    /// A leader's "unable" of an older view is not held against it; a replica that kept its
    /// log while rejoining leads only when no other live replica of the shard can.
    #[test]
    fn a_stale_unable_deposes_no_one_and_a_stashed_replica_is_the_last_resort() {
        let t = topology();
        let mut view = View::initial(t.shards, Mode::Preventive);
        view.global = 5;
        let shard = ShardId(1);
        let nodes = t.shard_nodes(shard);
        let leader = t.replica_node(shard, view.leader_slot(shard, 3)).unwrap();
        let others: Vec<NodeId> = nodes.iter().copied().filter(|&n| n != leader).collect();
        let alive: BTreeSet<NodeId> = t.node_ids().collect();
        let mut unable = BTreeMap::new();
        let mut stashed = BTreeMap::new();
        let may = |unable: &BTreeMap<_, _>, stashed: &BTreeMap<_, _>, node| {
            may_lead(&view, &t, &alive, Said { unable, stashed }, (shard, node))
        };
        // The leader said "unable" in view 4: it may go on leading view 5. Said in view 5, it
        // may not.
        unable.insert(leader, (4, vec![shard]));
        assert!(may(&unable, &stashed, leader));
        unable.insert(leader, (5, vec![shard]));
        assert!(!may(&unable, &stashed, leader));
        // A follower's "unable" holds whatever view it was said in.
        unable.insert(others[0], (4, vec![shard]));
        assert!(!may(&unable, &stashed, others[0]));
        assert!(may(&unable, &stashed, others[1]));
        // Kept its log while rejoining: not while another replica can lead...
        stashed.insert(others[0], vec![shard]);
        assert!(!may(&unable, &stashed, others[0]));
        // ...but once none can.
        unable.insert(others[1], (5, vec![shard]));
        assert!(may(&unable, &stashed, others[0]));
        assert!(!may(&unable, &stashed, others[1]));
        // A dead one never.
        let mut dead = alive.clone();
        dead.remove(&others[0]);
        let said = Said { unable: &unable, stashed: &stashed };
        assert!(!may_lead(&view, &t, &dead, said, (shard, others[0])));
        // Other shards are not touched by what was said of this one.
        assert!(may(&unable, &stashed, t.replica_node(ShardId(0), 0).unwrap()));
    }

    #[test]
    fn installs_that_do_not_fit_are_refused_or_skipped() {
        let t = topology();
        let mut m = ManagerMachine::new(&t, View::initial(t.shards, Mode::Detective));
        let wrong_shards = ManagerCommand::Install(ViewRecord {
            global: 1,
            local: vec![1, 0, 0],
            detective: true,
        });
        assert!(m.validate(&wrong_shards).unwrap_err().contains("3 shards"));
        let mut out = Outbox::new();
        m.apply(wrong_shards, true, &mut out);
        let install = |global, local: Vec<u64>| {
            ManagerCommand::Install(ViewRecord { global, local, detective: false })
        };
        m.apply(install(2, vec![1, 0]), true, &mut out);
        assert_eq!(m.view().global, 0, "a global view number cannot be skipped");
        m.apply(install(1, vec![1, 1]), true, &mut out);
        assert_eq!(m.view().global, 1, "the next view applies");
        assert_eq!(m.view().mode, Mode::Preventive);
        m.apply(install(2, vec![0, 1]), true, &mut out);
        assert_eq!(m.view().global, 1, "a local view number never goes back");
        assert_eq!(m.skipped_total(), 3);
        assert_eq!(out.len(), t.nodes.len(), "only the applied view was announced");
    }

    /// Three members host the group through the kit's hosting; the leader's install reaches
    /// every member's state, and the leader announces it.
    #[test]
    fn the_manager_group_runs_on_the_kits_hosting() {
        use crate::kit::host::Hosts;
        use meridian_core::node::Effect;
        use std::collections::{BTreeMap, VecDeque};
        let cluster = topology();
        let members = [NodeId(1), NodeId(3), NodeId(5)];
        let group = std::sync::Arc::new(manager_topology(&cluster, &members).unwrap());
        assert!(group.validate().is_ok());
        let mut hosts: BTreeMap<NodeId, Hosts<ManagerMachine>> = BTreeMap::new();
        for &node in &members {
            let mut ctx = context(&group);
            ctx.id = node;
            let made = Hosts::restore(&ctx, &BTreeMap::new(), ManagerMsg::Raft, |_| {
                ManagerMachine::new(&cluster, View::initial(cluster.shards, Mode::Preventive))
            });
            hosts.insert(node, made.unwrap());
        }
        let mut queue: VecDeque<(NodeId, NodeId, ManagerMsg)> = VecDeque::new();
        let mut announced = Vec::new();
        let mut run = |hosts: &mut BTreeMap<NodeId, Hosts<ManagerMachine>>,
                       node: NodeId,
                       f: &mut dyn FnMut(&mut Hosts<ManagerMachine>, &mut Outbox<ManagerMsg>),
                       queue: &mut VecDeque<(NodeId, NodeId, ManagerMsg)>| {
            let mut out = Outbox::new();
            let h = hosts.get_mut(&node).unwrap();
            f(h, &mut out);
            h.flush(&mut out);
            for effect in out.drain() {
                match effect {
                    Effect::Send { to, msg: ManagerMsg::View(v) } => announced.push((to, v)),
                    Effect::Send { to, msg } => queue.push_back((node, to, msg)),
                    Effect::Persist { token, .. } => {
                        h.on_persisted(token, &mut Outbox::new());
                    }
                    _ => {}
                }
            }
        };
        for &node in &members {
            run(&mut hosts, node, &mut |h, out| h.on_start(out), &mut queue);
        }
        let install =
            ManagerCommand::Install(ViewRecord { global: 1, local: vec![1, 0], detective: false });
        let mut submitted = false;
        for _ in 0..500 {
            while let Some((from, to, msg)) = queue.pop_front() {
                if let ManagerMsg::Raft(groups) = msg {
                    run(
                        &mut hosts,
                        to,
                        &mut |h, out| h.on_raft(from, groups.clone(), out),
                        &mut queue,
                    );
                }
            }
            let leader = members.iter().copied().find(|n| hosts[n].leads(ShardId(0)));
            if let (Some(leader), false) = (leader, submitted) {
                let command = install.clone();
                run(
                    &mut hosts,
                    leader,
                    &mut |h, out| h.submit(ShardId(0), command.clone(), out).unwrap(),
                    &mut queue,
                );
                submitted = true;
            }
            if members.iter().all(|n| hosts[n].get(ShardId(0)).unwrap().view().global == 1) {
                break;
            }
            for &node in &members {
                run(&mut hosts, node, &mut |h, out| h.tick(out), &mut queue);
            }
        }
        assert!(submitted, "a leader was elected");
        for n in &members {
            assert_eq!(hosts[n].get(ShardId(0)).unwrap().view().local, [1, 0], "member {n}");
        }
        assert_eq!(announced.len(), cluster.nodes.len(), "announced once to every node");
        assert!(manager_topology(&cluster, &[NodeId(1), NodeId(1)]).is_err());
        assert!(manager_topology(&cluster, &[NodeId(99)]).is_err());
    }

    #[test]
    fn images_carry_the_view_and_bad_ones_are_errors() {
        let t = topology();
        let ctx = context(&t);
        let mut m = ManagerMachine::new(&t, View::initial(t.shards, Mode::Preventive));
        let record = ViewRecord { global: 1, local: vec![1, 0], detective: true };
        let mut out = Outbox::new();
        m.apply(ManagerCommand::Install(record.clone()), false, &mut out);
        let image = m.image();
        let fresh_for_decode = ManagerMachine::new(&t, View::initial(t.shards, Mode::Preventive));
        let decoded = fresh_for_decode.decode_image(&ctx, &image).unwrap();
        let mut fresh = ManagerMachine::new(&t, View::initial(t.shards, Mode::Preventive));
        fresh.install(decoded);
        assert_eq!(fresh.view(), m.view());
        assert_eq!(fresh.view().mode, Mode::Detective);
        // A view at the largest number is the last: nothing follows it, nothing wraps.
        let last = ViewRecord { global: u64::MAX, local: vec![0, 0], detective: false };
        fresh.install(last);
        fresh.apply(
            ManagerCommand::Install(ViewRecord { global: 0, local: vec![1, 1], detective: false }),
            true,
            &mut out,
        );
        assert_eq!(fresh.view().global, u64::MAX);
        assert_eq!(fresh.skipped_total(), 1);
        let three = ViewRecord { global: 1, local: vec![1, 0, 0], detective: false };
        let bad = postcard::to_allocvec(&three).unwrap();
        assert!(fresh_for_decode.decode_image(&ctx, &bad).is_err());
        assert!(fresh_for_decode.decode_image(&ctx, &[0xff, 0xff, 0xff]).is_err());
        fresh.serve_read(NodeId(4), &mut out);
        assert_eq!(out.len(), 1);
    }
}
