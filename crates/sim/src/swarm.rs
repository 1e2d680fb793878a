//! Fault plans for simulation swarms: everything a faulty run does differently, drawn from its
//! seed, so `meridian sim --seed N --faults` replays exactly what `--seeds A..B --faults` ran.
//!
//! A plan has a **fault phase** (from the start to `window_ns`): partitions of each kind
//! (isolate one node, split one region from the rest, cut one direction between two nodes),
//! crashes and restarts of the nodes the protocol allows to crash, extra message loss,
//! duplication and reordering, a clock model up to `bad`, and a disk latency. At the end of the
//! window every partition heals, every crashed node restarts and the network behaves: the
//! **healing phase**, in which every pending request must finish (liveness).

use crate::runner::SimRunOptions;
use crate::{Chaos, Fault};
use meridian_core::clock::ClockModel;
use meridian_core::rng::{child_rng, uniform_u64, Rng};
use meridian_core::time::NS_PER_MS;
use meridian_core::topology::Topology;
use meridian_core::{NodeId, Time};
use meridian_protocols::Limits;
use std::fmt::Write as _;

/// Most partition episodes in one plan.
pub const PARTITIONS_MAX: u64 = 3;
/// Most crash episodes in one plan.
pub const CRASHES_MAX: u64 = 2;

/// What a faulty run does.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultPlan {
    /// Scheduled faults (relative times).
    pub faults: Vec<(Time, Fault)>,
    /// Network misbehaviour during the fault phase.
    pub chaos: Chaos,
    /// The clock model.
    pub clock: ClockModel,
    /// The clock preset's name.
    pub clock_name: &'static str,
    /// Latency of a synced persist.
    pub disk_sync_ns: Time,
    /// End of the fault phase.
    pub window_ns: Time,
    /// A restarted node's clock comes back this far behind (0: as it was).
    pub restart_clock_step_back_ns: Time,
    /// Shrunken bounds on what nodes keep (decided attempts, deliveries, inquiries, waiting
    /// reads), so that swarms reach them; `None` keeps the production values.
    pub limits: Option<Limits>,
    /// One line that says all of the above.
    pub description: String,
}

fn pick<T: Copy>(rng: &mut Rng, items: &[T]) -> T {
    items[uniform_u64(rng, items.len() as u64) as usize]
}

impl SimRunOptions {
    /// Applies a swarm fault plan.
    pub fn with_plan(mut self, plan: &FaultPlan) -> Self {
        self.faults = plan.faults.clone();
        self.chaos = plan.chaos;
        self.clock = plan.clock;
        self.disk_sync_ns = Some(plan.disk_sync_ns);
        self.restart_clock_step_back_ns = plan.restart_clock_step_back_ns;
        if let Some(limits) = plan.limits {
            self.limits = limits;
        }
        self
    }
}

impl FaultPlan {
    /// Draws the plan of `seed` for `topology`, crashing only nodes `may_crash` allows, with
    /// faults inside the first `window_ns` of the run.
    ///
    /// One piece on purpose: the sequence of draws from the seed's streams is what a seed
    /// means (every recorded swarm seed, regression test and trace-table row depends on it),
    /// and reading it top to bottom in one place is how a change is kept from reordering it.
    /// New kinds of fault draw from a stream of their own, below.
    pub fn draw(
        seed: u64,
        topology: &Topology,
        may_crash: &dyn Fn(NodeId) -> bool,
        window_ns: Time,
    ) -> Self {
        let mut rng = child_rng(seed, "swarm-plan", 0);
        let rng = &mut rng;
        let mut text = String::new();
        let chaos = Chaos {
            loss: pick(rng, &[0.0, 0.0, 0.01, 0.05]),
            duplicate: pick(rng, &[0.0, 0.01, 0.05]),
            reorder: pick(rng, &[0.0, 0.02, 0.1]),
            until_ns: window_ns,
        };
        let _ = write!(
            text,
            "loss {}%, duplicate {}%, reorder {}% for {} ms",
            chaos.loss * 100.0,
            chaos.duplicate * 100.0,
            chaos.reorder * 100.0,
            window_ns / NS_PER_MS
        );
        let clock_name = pick(rng, &["perfect", "chrony", "ntp", "bad"]);
        let clock = ClockModel::preset(clock_name).expect("a known preset");
        let disk_sync_ns = pick(rng, &[NS_PER_MS, 10 * NS_PER_MS, 50 * NS_PER_MS]);
        let _ = write!(text, "; clock {clock_name}; disk sync {} ms", disk_sync_ns / NS_PER_MS);
        let nodes: Vec<NodeId> = topology.node_ids().collect();
        let mut faults = Vec::new();
        // Partition episodes, one after another inside the window, each ended by a heal.
        let episodes = uniform_u64(rng, PARTITIONS_MAX + 1);
        let slot = window_ns / (episodes + 1).max(1);
        for e in 0..episodes {
            let start = e * slot + uniform_u64(rng, slot / 2 + 1);
            let end = start + 1 + uniform_u64(rng, slot / 2);
            let mut blocks = Vec::new();
            match uniform_u64(rng, 3) {
                0 => {
                    let victim = pick(rng, &nodes);
                    for &other in nodes.iter().filter(|&&n| n != victim) {
                        blocks.push((victim, other));
                        blocks.push((other, victim));
                    }
                    let _ = write!(text, "; isolate n{}", victim.0);
                }
                1 => {
                    let region = uniform_u64(rng, topology.regions.len() as u64) as u32;
                    let inside: Vec<NodeId> = nodes
                        .iter()
                        .copied()
                        .filter(|&n| topology.region_of(n).0 == region)
                        .collect();
                    for &a in &inside {
                        for &b in nodes.iter().filter(|n| !inside.contains(n)) {
                            blocks.push((a, b));
                            blocks.push((b, a));
                        }
                    }
                    let _ = write!(text, "; split region {}", topology.regions[region as usize]);
                }
                _ => {
                    let a = pick(rng, &nodes);
                    let b = pick(rng, &nodes);
                    if a != b {
                        blocks.push((a, b));
                    }
                    let _ = write!(text, "; cut n{} -> n{}", a.0, b.0);
                }
            }
            let _ = write!(text, " {}..{} ms", start / NS_PER_MS, end / NS_PER_MS);
            faults.extend(blocks.into_iter().map(|(a, b)| (start, Fault::Block(a, b))));
            faults.push((end, Fault::Heal));
        }
        // Crash episodes among the nodes allowed to crash.
        let crashable: Vec<NodeId> = nodes.iter().copied().filter(|&n| may_crash(n)).collect();
        if !crashable.is_empty() {
            for _ in 0..uniform_u64(rng, CRASHES_MAX + 1) {
                let node = pick(rng, &crashable);
                let at = uniform_u64(rng, window_ns / 2 + 1);
                let back = at + 1 + uniform_u64(rng, window_ns / 2);
                faults.push((at, Fault::Crash(node)));
                faults.push((back, Fault::Restart(node)));
                let _ =
                    write!(text, "; crash n{} {}..{} ms", node.0, at / NS_PER_MS, back / NS_PER_MS);
            }
        }
        // The healing phase begins: everything heals and every node runs.
        faults.push((window_ns, Fault::Heal));
        for &n in &nodes {
            faults.push((window_ns, Fault::Restart(n)));
        }
        faults.sort_by_key(|(at, _)| *at);
        // Drawn from a stream of their own, so the plans above stay what they were.
        let mut extra = child_rng(seed, "swarm-plan-limits", 0);
        let extra = &mut extra;
        let restart_clock_step_back_ns = pick(extra, &[0, 0, 100 * NS_PER_MS, 10_000 * NS_PER_MS]);
        if restart_clock_step_back_ns > 0 {
            let _ = write!(
                text,
                "; restarted clocks {} ms back",
                restart_clock_step_back_ns / NS_PER_MS
            );
        }
        let limits = (uniform_u64(extra, 3) == 0).then(|| Limits {
            decided_max: pick(extra, &[4, 16, 64]),
            deliveries_max: pick(extra, &[4, 64]),
            inquiries_max: pick(extra, &[2, 64]),
            reads_waiting_max: pick(extra, &[2, 64]),
            lock_holders_max: pick(extra, &[2, 64]),
            ..Limits::default()
        });
        // Limits added later come from a stream of their own, so earlier seeds keep their plans.
        let limits = limits.map(|l| {
            let mut later = child_rng(seed, "swarm-plan-limits-2", 0);
            Limits {
                read_stamps_max: pick(&mut later, &[2, 64]),
                dependents_waiting_max: pick(&mut later, &[1, 64]),
                ..l
            }
        });
        let limits = limits.map(|l| {
            let mut later = child_rng(seed, "swarm-plan-limits-3", 0);
            let follower_lag_max = pick(&mut later, &[4, 64]);
            Limits { follower_lag_max, log_drop_min: pick(&mut later, &[1, 16]), ..l }
        });
        let limits = limits.map(|l| {
            let mut later = child_rng(seed, "swarm-plan-limits-4", 0);
            Limits { forgettable_max: pick(&mut later, &[2, 64]), ..l }
        });
        // A long partition: one node cut off from every other for most of the fault phase, so
        // that prepared attempts outlive many decisions elsewhere (with shrunken limits, their
        // peers forget all else meanwhile).
        if uniform_u64(extra, 4) == 0 {
            let victim = pick(extra, &nodes);
            let (start, end) = (window_ns / 10, window_ns * 9 / 10);
            // Other episodes' heals lift every block: cut the victim off again right after each.
            let heals: Vec<Time> = faults
                .iter()
                .filter(|(at, f)| *f == Fault::Heal && (start..end).contains(at))
                .map(|(at, _)| *at)
                .collect();
            for at in std::iter::once(start).chain(heals) {
                for &other in nodes.iter().filter(|&&n| n != victim) {
                    faults.push((at, Fault::Block(victim, other)));
                    faults.push((at, Fault::Block(other, victim)));
                }
            }
            faults.push((end, Fault::Heal));
            faults.sort_by_key(|(at, _)| *at);
            let _ = write!(
                text,
                "; long isolation of n{} {}..{} ms",
                victim.0,
                start / NS_PER_MS,
                end / NS_PER_MS
            );
        }
        if let Some(l) = &limits {
            let _ = write!(
                text,
                "; limits decided {} deliveries {} inquiries {} reads {} lock holders {} read stamps {} dependents {} follower lag {} log drop {} forgettable {}",
                l.decided_max,
                l.deliveries_max,
                l.inquiries_max,
                l.reads_waiting_max,
                l.lock_holders_max,
                l.read_stamps_max,
                l.dependents_waiting_max,
                l.follower_lag_max,
                l.log_drop_min,
                l.forgettable_max
            );
        }
        Self {
            faults,
            chaos,
            clock,
            clock_name,
            disk_sync_ns,
            window_ns,
            restart_clock_step_back_ns,
            limits,
            description: text,
        }
    }
}

/// Shortest fault phase.
pub const FAULT_WINDOW_NS_MIN: Time = 200 * NS_PER_MS;

/// The options of one swarm seed: `base` with the seed set and, with `faults`, the seed's fault
/// plan applied; the plan's description comes back too. The fault phase covers most of the time
/// the run would take without faults (a transaction needs a few wide-area round trips).
pub fn seed_options(
    base: &SimRunOptions,
    seed: u64,
    faults: bool,
) -> (SimRunOptions, Option<String>) {
    let mut options = base.clone();
    options.seed = seed;
    if !faults {
        return (options, None);
    }
    let txn_ns = 6 * options.network.owd_ns_max() + 2 * NS_PER_MS;
    let window_ns = (txn_ns * options.txns / u64::from(options.clients.max(1)) * 3 / 5)
        .max(FAULT_WINDOW_NS_MIN);
    let (protocol, topology) = (options.protocol, options.topology.clone());
    let may_crash = |n| protocol.may_crash(&topology, n);
    let plan = FaultPlan::draw(seed, &topology, &may_crash, window_ns);
    (options.with_plan(&plan), Some(plan.description))
}

/// Holds of a persist completion BUGGIFY draws from (ms).
const BUGGIFY_HOLD_MS: [u64; 3] = [5, 20, 100];
/// Chances that one persist is held.
const BUGGIFY_PROBABILITY: [f64; 3] = [0.1, 0.3, 0.6];
/// How long the durability oracle's power failure lasts (ms).
const POWER_FAILURE_MS: [u64; 3] = [10, 100, 500];

/// Adds the durability oracle to one seed's options, drawn from a stream of its own (the seed's
/// fault plan stays what it was): BUGGIFY holds back persist completions at random, and right
/// after one acknowledged commit (in the first half of the run) every node the protocol may
/// crash loses power at once and restarts from its disk. Returns the options and a line that
/// says what was drawn.
pub fn with_durability_oracle(mut options: SimRunOptions) -> (SimRunOptions, String) {
    let mut rng = child_rng(options.seed, "swarm-durability-oracle", 0);
    let rng = &mut rng;
    let after_commits = 1 + uniform_u64(rng, (options.txns / 2).max(1));
    let restart_after_ns = pick(rng, &POWER_FAILURE_MS) * NS_PER_MS;
    let (protocol, topology) = (options.protocol, &options.topology);
    let nodes: Vec<NodeId> =
        topology.node_ids().filter(|&n| protocol.may_crash(topology, n)).collect();
    let buggify = crate::Buggify {
        persist_delay_probability: pick(rng, &BUGGIFY_PROBABILITY),
        persist_delay_ns_max: pick(rng, &BUGGIFY_HOLD_MS) * NS_PER_MS,
    };
    let text = format!(
        "oracle: power failure of {} nodes after commit {after_commits} for {} ms; {}% of persists held up to {} ms",
        nodes.len(),
        restart_after_ns / NS_PER_MS,
        buggify.persist_delay_probability * 100.0,
        buggify.persist_delay_ns_max / NS_PER_MS
    );
    options.power_failure = (!nodes.is_empty()).then_some(crate::PowerFailure {
        after_commits,
        nodes,
        restart_after_ns,
    });
    options.buggify = buggify;
    (options, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_deterministic_and_heal_at_the_end_of_the_window() {
        let topology =
            Topology::standard(vec!["a".into(), "b".into(), "c".into()], 3, 1).expect("valid");
        let coordinators = topology.coordinators();
        let may_crash = |n: NodeId| coordinators.contains(&n);
        let window = 1_000 * NS_PER_MS;
        let mut kinds = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let plan = FaultPlan::draw(seed, &topology, &may_crash, window);
            assert_eq!(plan, FaultPlan::draw(seed, &topology, &may_crash, window));
            assert!(plan.faults.iter().all(|(at, _)| *at <= window));
            for (_, fault) in &plan.faults {
                if let Fault::Crash(n) = fault {
                    assert!(coordinators.contains(n), "only allowed nodes crash");
                }
                kinds.insert(match fault {
                    Fault::Crash(_) => "crash",
                    Fault::Restart(_) => "restart",
                    Fault::Block(..) => "block",
                    Fault::Heal => "heal",
                    Fault::Control(..) => "control",
                    Fault::Unblock(..) | Fault::ClockStep(..) | Fault::DiskDelay(..) => {
                        "scheduled only"
                    }
                });
            }
            let last_heal = plan.faults.iter().rposition(|(_, f)| *f == Fault::Heal).unwrap();
            assert!(plan.faults[last_heal..].iter().all(|(at, _)| *at == window));
        }
        assert_eq!(kinds.len(), 4, "crash, restart, block and heal all occur");
    }

    #[test]
    fn the_durability_oracle_is_the_seeds_own_and_leaves_its_fault_plan_alone() {
        let topology =
            Topology::standard(vec!["a".into(), "b".into(), "c".into()], 3, 3).expect("valid");
        let base = SimRunOptions::new(
            meridian_protocols::ProtocolKind::parse("occ").unwrap(),
            topology,
            meridian_core::netmodel::NetworkModel::preset("metro", 3).unwrap(),
            meridian_core::clock::ClockModel::preset("perfect").unwrap(),
            0,
        );
        for seed in 0..50 {
            let (options, plan) = seed_options(&base, seed, true);
            let (oracle, text) = with_durability_oracle(options.clone());
            assert_eq!(oracle.faults, options.faults, "the fault plan stays");
            let again = with_durability_oracle(options.clone());
            assert_eq!(oracle.power_failure, again.0.power_failure, "seeded");
            assert_eq!(text, again.1);
            let failure = oracle.power_failure.expect("every node of 3 x 3 occ may crash");
            assert!((1..=options.txns / 2).contains(&failure.after_commits), "{text}");
            assert_eq!(failure.nodes.len(), options.topology.nodes.len());
            assert!(plan.is_some() && text.starts_with("oracle: power failure"));
        }
    }
}
