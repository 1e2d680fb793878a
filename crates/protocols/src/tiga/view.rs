//! Views and the view manager's decisions (Tiga §4, App. A–B).
//!
//! A **view** says who leads every shard and in which mode the leaders agree on timestamps:
//! a global view number, a local view number per shard (the shard's leader is replica
//! `l-view mod replicas`), and the mode. Messages carry the global view, and a replica drops
//! (and counts) any message of another view.
//!
//! The view manager (a small replicated service) hears heartbeats from every replica; a shard
//! whose leader has been silent for the detection timeout gets a new view. The new leaders are
//! chosen to sit together where possible: the region holding a live replica of the most
//! shards wins (the current leaders' region on a tie, then the lowest region id), and each
//! shard takes its live replica there, or else its lowest live replica. A shard whose leader
//! lives keeps it unless moving it is what co-locates the leaders. In `auto` mode the manager
//! picks preventive agreement when the leaders are within the co-location delay of each
//! other, detective otherwise, by the delays the server nodes measured between one another
//! ([`MeasuredDelays`]; by the regions for a pair not measured yet), and changes the mode of
//! a view whose leaders stay once the measured delays leave a band around that delay
//! ([`measured_mode_change`]).
//!
//! Everything here is a pure function of the view, the topology, what is alive and the
//! measured delays. Only the manager group's leader decides (members may have heard
//! different heartbeats); its proposal goes through the group's log, so every member
//! applies the same views.

use super::Mode;
use meridian_core::topology::Topology;
use meridian_core::{NodeId, RegionId, ShardId, Time};
use std::collections::{BTreeMap, BTreeSet};

/// Leaders whose largest one-way delay to each other is at most this agree before executing
/// (preventive mode) when the mode is `auto` (Tiga uses about 10 ms).
pub const COLOCATED_OWD_NS_MAX: u64 = 10 * meridian_core::time::NS_PER_MS;
/// A view whose leaders stay changes mode only past a band around the co-location delay:
/// preventive leaders turn detective once some two are further apart than this, detective
/// ones preventive once all are within [`COLOCATED_OWD_NS_MAX`], so delays that hover near
/// the threshold do not flip the mode back and forth (each flip is a view change).
pub const APART_OWD_NS_MIN: u64 = 2 * COLOCATED_OWD_NS_MAX;
const _: () = assert!(APART_OWD_NS_MIN > COLOCATED_OWD_NS_MAX);

/// Probe samples a node keeps per sender (the newest).
pub const PROBE_SAMPLES_MAX: usize = 16;
/// Samples a node needs from a sender before it reports a delay from it.
pub const PROBE_SAMPLES_MIN: usize = 3;
const _: () = assert!(PROBE_SAMPLES_MIN >= 1 && PROBE_SAMPLES_MIN <= PROBE_SAMPLES_MAX);

/// One-way delays a node measured from the other server nodes: each probe carries its
/// sender's clock at sending, and a sample is the receiver's clock at arrival minus it. Clocks
/// are loosely synchronised, so a sample includes the offset between the two clocks and may
/// be negative; it is kept signed, so that the two directions of a link, averaged, cancel the
/// offset ([`MeasuredDelays::between`]).
#[derive(Clone, Debug, Default)]
pub struct ProbeDelays {
    samples: BTreeMap<NodeId, std::collections::VecDeque<i64>>,
}

impl ProbeDelays {
    /// A probe `from` sent at `sent_at` (its clock) arrived at `now` (this node's clock). The
    /// caller checks that `from` is a server node: the map holds one entry per sender.
    pub fn observe(&mut self, from: NodeId, sent_at: Time, now: Time) {
        let samples = self.samples.entry(from).or_default();
        if samples.len() == PROBE_SAMPLES_MAX {
            samples.pop_front();
        }
        let offset = i128::from(now) - i128::from(sent_at);
        samples.push_back(offset.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64);
    }

    /// The median delay from every sender heard [`PROBE_SAMPLES_MIN`] times, for the
    /// heartbeat.
    pub fn report(&self) -> Vec<(NodeId, i64)> {
        self.samples
            .iter()
            .filter(|(_, s)| s.len() >= PROBE_SAMPLES_MIN)
            .map(|(&from, s)| {
                let mut sorted: Vec<i64> = s.iter().copied().collect();
                sorted.sort_unstable();
                (from, sorted[sorted.len() / 2])
            })
            .collect()
    }
}

/// What the manager heard of the delays between server nodes: per directed pair, keyed
/// (receiver, sender), the receiver's latest report (signed: it includes the clocks' offset).
#[derive(Clone, Debug, Default)]
pub struct MeasuredDelays {
    one_way: BTreeMap<(NodeId, NodeId), i64>,
}

impl MeasuredDelays {
    /// `receiver`'s report (its heartbeat's delays) replaces its previous one. The caller
    /// checks the nodes named.
    pub fn report(&mut self, receiver: NodeId, delays: &[(NodeId, i64)]) {
        let old: Vec<(NodeId, NodeId)> = self
            .one_way
            .range((receiver, NodeId(0))..=(receiver, NodeId(u32::MAX)))
            .map(|(&pair, _)| pair)
            .collect();
        for pair in old {
            self.one_way.remove(&pair);
        }
        for &(from, ns) in delays {
            if from != receiver {
                self.one_way.insert((receiver, from), ns);
            }
        }
    }

    /// The one-way delay between `a` and `b` once both directions were measured: their mean,
    /// in which the offset between the two clocks cancels (one direction alone says little
    /// where clocks are tens of milliseconds apart).
    pub fn between(&self, a: NodeId, b: NodeId) -> Option<u64> {
        let (&ab, &ba) = (self.one_way.get(&(b, a))?, self.one_way.get(&(a, b))?);
        let mean = (i128::from(ab) + i128::from(ba)) / 2;
        Some(mean.clamp(0, i128::from(u64::MAX)) as u64)
    }

    /// The delay between two nodes as the manager takes it: measured where it was, else by
    /// the topology's regions (none within one region, unbounded across two).
    pub fn or_regions(&self, topology: &Topology, a: NodeId, b: NodeId) -> u64 {
        self.between(a, b).unwrap_or_else(|| {
            if topology.region_of(a) == topology.region_of(b) {
                0
            } else {
                u64::MAX
            }
        })
    }
}

/// The mode a view whose `leaders` stay should change to, by the `measured` delays between
/// them: `None` while some two of them were not measured, or while the largest delay is
/// inside the band between [`COLOCATED_OWD_NS_MAX`] and [`APART_OWD_NS_MIN`], or when it says
/// `current` already.
pub fn measured_mode_change(
    leaders: &[NodeId],
    current: Mode,
    measured: &MeasuredDelays,
) -> Option<Mode> {
    let mut spread = 0;
    for (i, &a) in leaders.iter().enumerate() {
        for &b in &leaders[i + 1..] {
            if a != b {
                spread = spread.max(measured.between(a, b)?);
            }
        }
    }
    match current {
        Mode::Preventive if spread > APART_OWD_NS_MIN => Some(Mode::Detective),
        Mode::Detective if spread <= COLOCATED_OWD_NS_MAX => Some(Mode::Preventive),
        _ => None,
    }
}

/// Who leads every shard, and how leaders agree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// The global view number: grows with every view change.
    pub global: u64,
    /// Per shard, its local view number; the leader is replica `local % replicas`.
    pub local: Vec<u64>,
    /// The agreement mode of this view (never `Auto`).
    pub mode: Mode,
}

impl View {
    /// The first view: replica 0 leads every shard.
    pub fn initial(shards: u32, mode: Mode) -> Self {
        let mode = if mode == Mode::Auto { Mode::Preventive } else { mode };
        Self { global: 0, local: vec![0; shards as usize], mode }
    }

    /// The replica index leading `shard`.
    pub fn leader_slot(&self, shard: ShardId, replicas: u32) -> u32 {
        (self.local[shard.0 as usize] % u64::from(replicas.max(1))) as u32
    }

    /// The node leading each shard of `topology`, in shard order.
    pub fn leaders(&self, topology: &Topology) -> Vec<NodeId> {
        (0..topology.shards)
            .map(ShardId)
            .filter_map(|s| topology.replica_node(s, self.leader_slot(s, topology.replicas)))
            .collect()
    }
}

/// Heartbeats the manager has heard: each replica node's latest.
#[derive(Clone, Debug, Default)]
pub struct Heartbeats {
    last: BTreeMap<NodeId, Time>,
}

impl Heartbeats {
    /// `node` was heard from at `now` (the manager's clock).
    pub fn heard(&mut self, node: NodeId, now: Time) {
        let last = self.last.entry(node).or_insert(now);
        *last = (*last).max(now);
    }

    /// Nodes heard from within `timeout_ns` of `now`. A node never heard from counts as alive
    /// until `timeout_ns` after `started` (the manager's start), so a fresh manager does not
    /// depose everyone.
    pub fn alive(
        &self,
        nodes: &[NodeId],
        now: Time,
        started: Time,
        timeout_ns: u64,
    ) -> BTreeSet<NodeId> {
        nodes
            .iter()
            .copied()
            .filter(|n| {
                let last = self.last.get(n).copied().unwrap_or(started);
                now.saturating_sub(last) <= timeout_ns
            })
            .collect()
    }
}

/// The shards whose leader in `view` is not alive.
pub fn leaderless(view: &View, topology: &Topology, alive: &BTreeSet<NodeId>) -> Vec<ShardId> {
    leaderless_where(view, topology, &|_, n| alive.contains(&n))
}

/// The shards whose leader in `view` may not lead (`eligible(shard, node)` false: dead, or
/// unable to lead that shard).
pub fn leaderless_where(
    view: &View,
    topology: &Topology,
    eligible: &dyn Fn(ShardId, NodeId) -> bool,
) -> Vec<ShardId> {
    (0..topology.shards)
        .map(ShardId)
        .filter(|&s| {
            let slot = view.leader_slot(s, topology.replicas);
            topology.replica_node(s, slot).is_none_or(|n| !eligible(s, n))
        })
        .collect()
}

/// The view after `view` given who is `alive`; `None` when some shard has no live replica
/// (no view can serve it: wait). `configured`: the mode setting; `owd_ns` the measured one-way
/// delay between two nodes (used in `auto` mode).
pub fn next_view(
    view: &View,
    topology: &Topology,
    alive: &BTreeSet<NodeId>,
    configured: Mode,
    owd_ns: impl Fn(NodeId, NodeId) -> u64,
) -> Option<View> {
    next_view_where(view, topology, &|_, n| alive.contains(&n), configured, owd_ns)
}

/// [`next_view`] where a replica may lead its shard when `eligible(shard, node)`.
pub fn next_view_where(
    view: &View,
    topology: &Topology,
    eligible: &dyn Fn(ShardId, NodeId) -> bool,
    configured: Mode,
    owd_ns: impl Fn(NodeId, NodeId) -> u64,
) -> Option<View> {
    let replicas = topology.replicas.max(1);
    let shards: Vec<ShardId> = (0..topology.shards).map(ShardId).collect();
    // Per shard, its live replicas (slot and node).
    let live_slots: Vec<Vec<(u32, NodeId)>> = shards
        .iter()
        .map(|&s| {
            (0..replicas)
                .filter_map(|slot| topology.replica_node(s, slot).map(|n| (slot, n)))
                .filter(|&(_, n)| eligible(s, n))
                .collect()
        })
        .collect();
    if live_slots.iter().any(Vec::is_empty) {
        return None;
    }
    let region_of = |n: NodeId| topology.nodes[n.0 as usize].region;
    let current_regions: BTreeSet<RegionId> = shards
        .iter()
        .filter_map(|&s| topology.replica_node(s, view.leader_slot(s, replicas)))
        .map(region_of)
        .collect();
    // How many shards have a live replica in each region.
    let mut coverage: BTreeMap<RegionId, usize> = BTreeMap::new();
    for live in &live_slots {
        let regions: BTreeSet<RegionId> = live.iter().map(|&(_, n)| region_of(n)).collect();
        for r in regions {
            *coverage.entry(r).or_default() += 1;
        }
    }
    let home = coverage
        .iter()
        .max_by_key(|&(r, &count)| (count, current_regions.contains(r), std::cmp::Reverse(*r)))
        .map(|(&r, _)| r)?;
    let mut local = view.local.clone();
    let mut leaders = Vec::with_capacity(shards.len());
    for (&s, live) in shards.iter().zip(&live_slots) {
        let current = view.leader_slot(s, replicas);
        let keep = live.iter().find(|&&(slot, n)| slot == current && region_of(n) == home);
        let chosen = keep
            .or_else(|| live.iter().find(|&&(_, n)| region_of(n) == home))
            .or_else(|| live.iter().find(|&&(slot, _)| slot == current))
            .or(live.first())
            .copied()
            .expect("checked: every shard has a live replica");
        if chosen.0 != current {
            // The next local view number that names the chosen replica.
            let l = &mut local[s.0 as usize];
            let step = (u64::from(chosen.0) + u64::from(replicas) - u64::from(current))
                % u64::from(replicas);
            *l += step;
        }
        leaders.push(chosen.1);
    }
    let mode = mode_of(&leaders, configured, owd_ns);
    Some(View { global: view.global + 1, local, mode })
}

/// The agreement mode of a view whose shards are led by `leaders`: the `configured` one, or
/// for `auto` preventive when every two leaders are within [`COLOCATED_OWD_NS_MAX`] of each
/// other (`owd_ns`) and detective otherwise.
pub fn mode_of(
    leaders: &[NodeId],
    configured: Mode,
    owd_ns: impl Fn(NodeId, NodeId) -> u64,
) -> Mode {
    if configured != Mode::Auto {
        return configured;
    }
    let spread = leaders
        .iter()
        .flat_map(|&a| leaders.iter().map(move |&b| (a, b)))
        .filter(|(a, b)| a != b)
        .map(|(a, b)| owd_ns(a, b))
        .max()
        .unwrap_or(0);
    if spread <= COLOCATED_OWD_NS_MAX {
        Mode::Preventive
    } else {
        Mode::Detective
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::time::NS_PER_MS;
    use meridian_core::topology::{NodeInfo, ReplicaSlot};

    /// Two shards × three replicas; replica r of every shard in region r (nodes 0–5: shard 0
    /// replicas 0,1,2 are nodes 0,1,2; shard 1's are 3,4,5).
    fn topology() -> Topology {
        let mut nodes = Vec::new();
        for shard in 0..2 {
            for replica in 0..3 {
                nodes.push(NodeInfo {
                    region: RegionId(replica),
                    replicas: vec![ReplicaSlot { shard: ShardId(shard), replica }],
                    coordinator: true,
                });
            }
        }
        Topology {
            regions: vec!["a".into(), "b".into(), "c".into()],
            nodes,
            shards: 2,
            replicas: 3,
        }
    }

    fn all_but(dead: &[u32]) -> BTreeSet<NodeId> {
        (0..6).filter(|n| !dead.contains(n)).map(NodeId).collect()
    }

    /// One-way delay: 1 ms within a region, 50 ms across.
    fn owd(t: &Topology) -> impl Fn(NodeId, NodeId) -> u64 + '_ {
        move |a, b| {
            let same = t.nodes[a.0 as usize].region == t.nodes[b.0 as usize].region;
            if same {
                NS_PER_MS
            } else {
                50 * NS_PER_MS
            }
        }
    }

    #[test]
    fn a_dead_leader_moves_both_shards_to_a_region_where_both_have_a_replica() {
        let t = topology();
        let view = View::initial(2, Mode::Auto);
        assert_eq!(view.mode, Mode::Preventive);
        assert!(leaderless(&view, &t, &all_but(&[])).is_empty());
        let alive = all_but(&[0]);
        assert_eq!(leaderless(&view, &t, &alive), vec![ShardId(0)]);
        let next = next_view(&view, &t, &alive, Mode::Auto, owd(&t)).unwrap();
        assert_eq!(next.global, 1);
        // Region a lost shard 0's replica; regions b and c cover both: b (lowest) wins, and
        // shard 1's live leader moves there too, to stay co-located.
        assert_eq!((next.leader_slot(ShardId(0), 3), next.leader_slot(ShardId(1), 3)), (1, 1));
        assert_eq!(next.local, vec![1, 1]);
        assert_eq!(next.mode, Mode::Preventive);
    }

    #[test]
    fn leaders_that_cannot_sit_together_agree_detectively() {
        let t = topology();
        let view = View::initial(2, Mode::Auto);
        // Shard 0 lives only in region b, shard 1 only in region c.
        let alive: BTreeSet<NodeId> = [NodeId(1), NodeId(5)].into();
        let next = next_view(&view, &t, &alive, Mode::Auto, owd(&t)).unwrap();
        assert_eq!((next.leader_slot(ShardId(0), 3), next.leader_slot(ShardId(1), 3)), (1, 2));
        assert_eq!(next.mode, Mode::Detective);
        let fixed = next_view(&view, &t, &alive, Mode::Preventive, owd(&t)).unwrap();
        assert_eq!(fixed.mode, Mode::Preventive, "a configured mode stands");
    }

    #[test]
    fn local_views_only_grow_and_no_view_serves_a_dead_shard() {
        let t = topology();
        let mut view = View::initial(2, Mode::Preventive);
        view.local = vec![2, 5]; // leaders: slot 2 of both, region c
        let next = next_view(&view, &t, &all_but(&[2]), Mode::Preventive, owd(&t)).unwrap();
        // Shard 0's leader (node 2) died; regions a and b cover both shards, and neither holds
        // the current leaders: a wins; local views move forward to slot 0.
        assert_eq!(next.local, vec![3, 6]);
        assert_eq!(next.leader_slot(ShardId(0), 3), 0);
        assert_eq!(next_view(&view, &t, &all_but(&[0, 1, 2]), Mode::Preventive, owd(&t)), None);
    }

    #[test]
    fn heartbeats_decide_who_is_alive() {
        let mut beats = Heartbeats::default();
        beats.heard(NodeId(0), 100);
        beats.heard(NodeId(0), 50);
        beats.heard(NodeId(1), 10);
        let nodes = [NodeId(0), NodeId(1), NodeId(2)];
        assert_eq!(beats.alive(&nodes, 120, 0, 30), [NodeId(0)].into());
        assert_eq!(beats.alive(&nodes, 120, 100, 30), [NodeId(0), NodeId(2)].into(), "2 is new");
    }

    #[test]
    fn probes_report_the_median_of_recent_samples_once_there_are_enough() {
        let mut probes = ProbeDelays::default();
        let (a, b) = (NodeId(1), NodeId(2));
        probes.observe(a, 100, 130);
        probes.observe(a, 200, 210);
        assert_eq!(probes.report(), [], "two samples are too few");
        probes.observe(a, 300, 350);
        // A sample from a clock ahead of the receiver's is negative.
        for at in [500, 600, 700] {
            probes.observe(b, at, at - 100);
        }
        assert_eq!(probes.report(), [(a, 30), (b, -100)]);
        // Only the newest samples count: a slower link shows once they fill the window.
        for i in 0..PROBE_SAMPLES_MAX as u64 {
            probes.observe(a, i * 1_000, i * 1_000 + 900);
        }
        assert_eq!(probes.report(), [(a, 900), (b, -100)]);
    }

    #[test]
    fn measured_delays_cancel_clock_offsets_and_the_regions_stand_in_for_the_rest() {
        let t = Topology::standard(vec!["a".into(), "b".into(), "c".into()], 2, 3).unwrap();
        let mut measured = MeasuredDelays::default();
        let (a, b) = (NodeId(0), NodeId(1));
        // b's clock is 8 ms ahead of a's; the link takes 5 ms either way.
        let ms = |n: i64| n * NS_PER_MS as i64;
        measured.report(b, &[(a, ms(13))]);
        assert_eq!(measured.between(a, b), None, "one direction only");
        measured.report(a, &[(b, ms(-3))]);
        assert_eq!(measured.between(a, b), Some(5 * NS_PER_MS));
        assert_eq!(measured.between(b, a), Some(5 * NS_PER_MS));
        assert_eq!(measured.or_regions(&t, a, b), 5 * NS_PER_MS);
        // A new report replaces the receiver's old one whole.
        measured.report(a, &[]);
        assert_eq!(measured.between(a, b), None);
        // Unmeasured pairs: none within a region, unbounded across regions.
        let (c, d) = (NodeId(5), NodeId(4));
        assert_eq!(t.region_of(c), t.region_of(NodeId(0)), "shard 1's replica 2 sits in a");
        assert_ne!(t.region_of(c), t.region_of(d));
        assert_eq!(measured.or_regions(&t, NodeId(0), c), 0);
        assert_eq!(measured.or_regions(&t, c, d), u64::MAX);
    }

    #[test]
    fn a_mode_changes_only_past_the_band_and_only_with_every_pair_measured() {
        let leaders = [NodeId(0), NodeId(3), NodeId(6)];
        let mut measured = MeasuredDelays::default();
        let all = |measured: &mut MeasuredDelays, ms: u64| {
            for &to in &leaders {
                let from: Vec<(NodeId, i64)> = leaders
                    .iter()
                    .filter(|&&f| f != to)
                    .map(|&f| (f, (ms * NS_PER_MS) as i64))
                    .collect();
                measured.report(to, &from);
            }
        };
        measured.report(NodeId(3), &[(NodeId(0), 50 * NS_PER_MS as i64)]);
        let change = |m: &MeasuredDelays, current| measured_mode_change(&leaders, current, m);
        assert_eq!(change(&measured, Mode::Preventive), None, "some pairs not measured");
        all(&mut measured, 50);
        assert_eq!(change(&measured, Mode::Preventive), Some(Mode::Detective));
        assert_eq!(change(&measured, Mode::Detective), None, "already");
        // Inside the band neither mode moves.
        all(&mut measured, 15);
        assert_eq!(change(&measured, Mode::Preventive), None);
        assert_eq!(change(&measured, Mode::Detective), None);
        all(&mut measured, 2);
        assert_eq!(change(&measured, Mode::Detective), Some(Mode::Preventive));
        assert_eq!(change(&measured, Mode::Preventive), None);
        // One far pair is enough to be apart.
        let (far, near) = (60 * NS_PER_MS as i64, NS_PER_MS as i64);
        measured.report(NodeId(6), &[(NodeId(0), far), (NodeId(3), near)]);
        measured.report(NodeId(0), &[(NodeId(6), far), (NodeId(3), near)]);
        assert_eq!(change(&measured, Mode::Preventive), Some(Mode::Detective));
    }
}
