//! One-way delay estimates and the timestamps Tiga's coordinators stamp (Tiga §3.1).
//!
//! A server measures how long each request took to reach it (its clock at arrival minus the
//! coordinator's send time carried by the request; clocks are loosely synchronised, so a
//! sample can come out negative and is clamped at zero) and returns the figure in its reply.
//! The coordinator keeps the last [`OWD_WINDOW_MAX`] samples per replica and estimates that
//! replica's one-way delay as a configured percentile of them, capped.
//!
//! A transaction sent at `send` is stamped
//! `t = send + max over participant shards of (largest estimate in the shard's super quorum
//! closest to the coordinator) + headroom`: the time by which, in the common case, the
//! transaction has reached a super quorum of every participant shard, so that every replica
//! there can hold it until its clock passes `t` and release it in timestamp order.
//! The super quorum must contain the leader (the fast path needs the leader's reply), so the
//! closest one is the leader plus the followers with the smallest estimates.

use meridian_core::{NodeId, Time, Timestamp};
use std::collections::{BTreeMap, VecDeque};

/// Samples kept per replica (Tiga's code recomputes its percentile every 1,000 samples; here
/// the window slides by one sample, and a sorted copy kept beside it makes each estimate a
/// lookup).
pub const OWD_WINDOW_MAX: usize = 1_000;
/// Replicas one estimator tracks: a coordinator talks to every replica of the cluster, and a
/// sample from a node beyond this many is dropped.
pub const OWD_REPLICAS_MAX: usize = 4_096;

/// How estimates are made.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OwdSettings {
    /// The percentile of a replica's samples taken as its estimate, in `(0, 100]`.
    pub percentile: f64,
    /// No estimate exceeds this (a burst of slow samples must not stall every transaction).
    pub cap_ns: u64,
    /// The estimate of a replica with no samples yet.
    pub initial_ns: u64,
    /// Δ: added to every timestamp, for the variance the estimates miss.
    pub headroom_ns: u64,
}

impl OwdSettings {
    /// Checks the settings: a percentile in `(0, 100]` and an initial estimate within the cap.
    pub fn check(&self) -> Result<(), String> {
        if !(self.percentile > 0.0 && self.percentile <= 100.0) {
            return Err(format!("the OWD percentile must be in (0, 100], got {}", self.percentile));
        }
        if self.initial_ns > self.cap_ns {
            return Err(format!(
                "the initial OWD estimate ({} ns) is above the cap ({} ns)",
                self.initial_ns, self.cap_ns
            ));
        }
        Ok(())
    }
}

/// One replica's samples, in arrival order and sorted.
#[derive(Debug, Default)]
struct Window {
    samples: VecDeque<u64>,
    /// The same samples in ascending order: a sample in and the oldest out cost a binary
    /// search and a shift of at most [`OWD_WINDOW_MAX`] words, where sorting the window for
    /// every estimate after a change cost a sort per transaction per replica.
    sorted: Vec<u64>,
}

/// A coordinator's one-way delay estimates, per replica node.
#[derive(Debug)]
pub struct OwdEstimator {
    settings: OwdSettings,
    windows: BTreeMap<NodeId, Window>,
}

impl OwdEstimator {
    /// An estimator with no samples. The settings must have passed [`OwdSettings::check`].
    pub fn new(settings: OwdSettings) -> Self {
        assert!(settings.check().is_ok(), "unchecked OWD settings: {settings:?}");
        Self { settings, windows: BTreeMap::new() }
    }

    /// Records a sample from `replica`: `owd_ns`, what the replica measured for one request.
    pub fn observe(&mut self, replica: NodeId, owd_ns: u64) {
        if !self.windows.contains_key(&replica) && self.windows.len() >= OWD_REPLICAS_MAX {
            return;
        }
        let window = self.windows.entry(replica).or_default();
        if window.samples.len() == OWD_WINDOW_MAX {
            let oldest = window.samples.pop_front().expect("a full window");
            let at = window.sorted.binary_search(&oldest).expect("every sample is in both");
            window.sorted.remove(at);
        }
        window.samples.push_back(owd_ns);
        let at = window.sorted.partition_point(|&s| s <= owd_ns);
        window.sorted.insert(at, owd_ns);
        debug_assert_eq!(window.samples.len(), window.sorted.len());
    }

    /// The estimate for `replica`: the configured percentile of its samples (nearest rank),
    /// capped; the initial estimate when it has none.
    pub fn estimate_ns(&mut self, replica: NodeId) -> u64 {
        let settings = self.settings;
        let Some(window) = self.windows.get(&replica) else {
            return settings.initial_ns;
        };
        let sorted = &window.sorted;
        if sorted.is_empty() {
            return settings.initial_ns;
        }
        let rank = (settings.percentile / 100.0 * sorted.len() as f64).ceil() as usize;
        sorted[rank.clamp(1, sorted.len()) - 1].min(settings.cap_ns)
    }

    /// The largest estimate in the super quorum of `quorum` replicas closest to this
    /// coordinator that includes `leader`: the leader and the `quorum - 1` followers with the
    /// smallest estimates.
    pub fn super_quorum_owd_ns(
        &mut self,
        leader: NodeId,
        followers: &[NodeId],
        quorum: usize,
    ) -> u64 {
        assert!(quorum >= 1 && quorum <= followers.len() + 1, "a super quorum of {quorum}");
        let mut estimates: Vec<u64> = followers.iter().map(|&f| self.estimate_ns(f)).collect();
        estimates.sort_unstable();
        let nearest = estimates[..quorum - 1].iter().copied().max().unwrap_or(0);
        nearest.max(self.estimate_ns(leader))
    }

    /// The timestamp of a transaction sent at `send` to `shards` (each its leader and its
    /// followers): `send` + the largest super-quorum estimate over the shards + headroom.
    pub fn stamp(
        &mut self,
        send: Time,
        shards: &[(NodeId, Vec<NodeId>)],
        quorum: usize,
    ) -> Timestamp {
        let owd_ns = shards
            .iter()
            .map(|(leader, followers)| self.super_quorum_owd_ns(*leader, followers, quorum))
            .max()
            .unwrap_or(0);
        Timestamp(send.saturating_add(owd_ns).saturating_add(self.settings.headroom_ns))
    }
}

/// Tiga's default settings, for tests here and in the coordinator.
#[cfg(test)]
pub(super) fn test_settings() -> OwdSettings {
    use meridian_core::time::NS_PER_MS;
    OwdSettings {
        percentile: 50.0,
        cap_ns: 400 * NS_PER_MS,
        initial_ns: 100 * NS_PER_MS,
        headroom_ns: 10 * NS_PER_MS,
    }
}

#[cfg(test)]
mod tests {
    use super::test_settings as settings;
    use super::*;
    use meridian_core::time::NS_PER_MS;

    fn n(id: u32) -> NodeId {
        NodeId(id)
    }

    #[test]
    fn the_estimate_is_the_percentile_of_the_window_capped() {
        let mut owd = OwdEstimator::new(settings());
        assert_eq!(owd.estimate_ns(n(1)), 100 * NS_PER_MS, "no samples: the initial estimate");
        for ms in [30, 10, 20, 50, 40] {
            owd.observe(n(1), ms * NS_PER_MS);
        }
        assert_eq!(owd.estimate_ns(n(1)), 30 * NS_PER_MS, "the median of 10..50");
        let mut p90 = OwdEstimator::new(OwdSettings { percentile: 90.0, ..settings() });
        for ms in 1..=10 {
            p90.observe(n(1), ms * NS_PER_MS);
        }
        assert_eq!(p90.estimate_ns(n(1)), 9 * NS_PER_MS, "nearest rank: the 9th of 10");
        for _ in 0..OWD_WINDOW_MAX {
            owd.observe(n(1), 900 * NS_PER_MS);
        }
        assert_eq!(owd.estimate_ns(n(1)), 400 * NS_PER_MS, "capped");
    }

    #[test]
    fn the_window_slides() {
        let mut owd = OwdEstimator::new(settings());
        for _ in 0..OWD_WINDOW_MAX {
            owd.observe(n(1), 80 * NS_PER_MS);
        }
        assert_eq!(owd.estimate_ns(n(1)), 80 * NS_PER_MS);
        for _ in 0..=OWD_WINDOW_MAX / 2 {
            owd.observe(n(1), 20 * NS_PER_MS);
        }
        assert_eq!(owd.estimate_ns(n(1)), 20 * NS_PER_MS, "old samples left the window");
    }

    /// The sorted copy kept beside the window gives what sorting the window gives, through
    /// many slides, repeated samples and every percentile's nearest rank.
    #[test]
    fn the_kept_order_matches_a_sort_of_the_window() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            state >> 33
        };
        for percentile in [1.0, 50.0, 90.0, 99.9, 100.0] {
            let mut owd = OwdEstimator::new(OwdSettings { percentile, ..settings() });
            let mut window: VecDeque<u64> = VecDeque::new();
            for step in 0..3 * OWD_WINDOW_MAX {
                // Few distinct values, so equal samples enter and leave often.
                let sample = (next() % 40) * NS_PER_MS;
                owd.observe(n(1), sample);
                window.push_back(sample);
                if window.len() > OWD_WINDOW_MAX {
                    window.pop_front();
                }
                if step % 97 == 0 || step + 1 == 3 * OWD_WINDOW_MAX {
                    let mut sorted: Vec<u64> = window.iter().copied().collect();
                    sorted.sort_unstable();
                    let rank = (percentile / 100.0 * sorted.len() as f64).ceil() as usize;
                    let expected = sorted[rank.clamp(1, sorted.len()) - 1].min(settings().cap_ns);
                    assert_eq!(owd.estimate_ns(n(1)), expected, "p{percentile} at step {step}");
                }
            }
        }
    }

    /// Three replicas per shard (super quorum 3 of 3 when f = 1 is 1 + 1 + 1): with five
    /// (f = 2, super quorum 1 + 2 + 1 = 4) the farthest follower is left out.
    #[test]
    fn the_stamp_covers_the_closest_super_quorum_of_every_shard_plus_headroom() {
        let mut owd = OwdEstimator::new(settings());
        let delays = [(1, 5), (2, 60), (3, 70), (4, 80), (5, 300), (6, 20), (7, 25), (8, 30)];
        for (node, ms) in delays {
            owd.observe(n(node), ms * NS_PER_MS);
        }
        let shard_a = (n(1), vec![n(2), n(3), n(4), n(5)]);
        assert_eq!(owd.super_quorum_owd_ns(shard_a.0, &shard_a.1, 4), 80 * NS_PER_MS);
        let shard_b = (n(6), vec![n(7), n(8)]);
        let t = owd.stamp(1_000 * NS_PER_MS, &[shard_a.clone(), shard_b.clone()], 3);
        // Shard a's closest 3 (leader 5, followers 60 and 70): 70; shard b's: 30.
        assert_eq!(t, Timestamp((1_000 + 70 + 10) * NS_PER_MS));
        // The leader is always in the quorum, even when it is the farthest.
        let mut far_leader = OwdEstimator::new(settings());
        for (node, ms) in [(6, 260), (7, 25), (8, 30)] {
            far_leader.observe(n(node), ms * NS_PER_MS);
        }
        assert_eq!(far_leader.super_quorum_owd_ns(shard_b.0, &shard_b.1, 2), 260 * NS_PER_MS);
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(OwdSettings { percentile: 0.0, ..settings() }.check().is_err());
        assert!(OwdSettings { percentile: 100.5, ..settings() }.check().is_err());
        assert!(OwdSettings { percentile: f64::NAN, ..settings() }.check().is_err());
        assert!(OwdSettings { initial_ns: 500 * NS_PER_MS, ..settings() }.check().is_err());
        assert!(settings().check().is_ok());
    }
}
