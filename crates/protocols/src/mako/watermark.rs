//! When a speculative commit is durable, and what a failover discards.
//!
//! **Candidate.** A shard's watermark candidate is the largest timestamp below which nothing
//! more can commit on the shard: one below the smallest proposal of an attempt still prepared
//! (it may commit at or above its proposal), and at most the shard's last handed-out
//! timestamp (every later proposal is above it). The shard's log carries ticks; applying a
//! tick sets the shard's watermark to the candidate then. Once the tick is replicated, every
//! commit at or below its candidate is replicated too (it was applied earlier, and the log is
//! a sequence), so the watermark of the shard's committed state is what it may advertise.
//!
//! **Durable.** A commit of epoch `e` at timestamp `t` is durable once `t` is at or below the
//! minimum of every shard's watermark in `e` (the **global watermark**). Watermarks only grow
//! within an epoch.
//!
//! **Epoch close.** When any shard's leader changes, epoch `e` closes: each shard logs the end
//! of `e`, freezing its watermark as its **final**; the **stable point** `S_e` is the minimum
//! of all finals. A shard's final is at least every watermark it reported in `e`, so `S_e` is
//! at least every global watermark anyone computed in `e`: a commit once durable stays durable.
//! Commits of `e` above `S_e` are discarded: none of them was durable (that would have needed
//! every watermark, hence every final, at or above it). Epoch `e + 1` starts with every
//! shard's watermark at `S_e`.
//!
//! [`Watermarks`] is one node's view, built from the shard leaders' [`Report`]s, which may
//! arrive late, twice or out of order, and may skip epochs (a node cut off for a while):
//! each report carries the stable points of the sender's last closed epochs. Bounded: stable
//! points of the last [`EPOCHS_REMEMBERED`] epochs are kept; a question about an epoch whose
//! stable point is not known and can no longer be learned is answered
//! [`Verdict::Forgotten`], never durable or discarded.

use crate::engine::speculation::Durability;
use meridian_core::{ShardId, Timestamp};
use std::collections::BTreeMap;

/// Closed epochs whose stable points a node remembers.
pub const EPOCHS_REMEMBERED: usize = 1_024;
/// Closed epochs whose stable points a shard keeps and reports.
pub const STABLES_REPORTED: usize = 8;
const _: () = assert!(STABLES_REPORTED <= EPOCHS_REMEMBERED);

/// A shard's watermark candidate: one below the lowest prepared proposal, at most the last
/// timestamp handed out.
pub fn candidate(ts_last: Timestamp, lowest_prepared: Option<Timestamp>) -> Timestamp {
    match lowest_prepared {
        Some(lowest) => Timestamp(lowest.0.saturating_sub(1)).min(ts_last),
        None => ts_last,
    }
}

pub use crate::engine::speculation::{Report, Verdict};

/// One node's view of every shard's watermark and of the epochs.
#[derive(Clone, Debug)]
pub struct Watermarks {
    shards: u32,
    /// The newest epoch heard of.
    epoch: u64,
    /// Each shard's watermark in `epoch` (its final once it has one).
    current: BTreeMap<ShardId, Timestamp>,
    /// Finals of `epoch` heard so far.
    finals: BTreeMap<ShardId, Timestamp>,
    /// Stable points of closed epochs.
    stable: BTreeMap<u64, Timestamp>,
}

impl Watermarks {
    /// Watermarks of `shards` shards, starting in epoch 0 with nothing replicated.
    pub fn new(shards: u32) -> Self {
        assert!(shards >= 1, "watermarks of no shard");
        Self {
            shards,
            epoch: 0,
            current: BTreeMap::new(),
            finals: BTreeMap::new(),
            stable: BTreeMap::new(),
        }
    }

    /// The newest epoch heard of.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// True once some shard has closed `epoch` (or a later epoch is known).
    pub fn is_closing(&self, epoch: u64) -> bool {
        epoch < self.epoch || (epoch == self.epoch && !self.finals.is_empty())
    }

    /// The stable point of `epoch`, once known.
    pub fn stable(&self, epoch: u64) -> Option<Timestamp> {
        self.stable.get(&epoch).copied()
    }

    /// Takes in a shard leader's report; false when it is malformed and ignored. A shard's
    /// report is well formed when: the shard exists; its stable points (at most
    /// [`STABLES_REPORTED`]) are of consecutive epochs, never decreasing, the last one of the
    /// epoch before the report's (a shard past epoch 0 has started each epoch at one); its
    /// watermark is at least that stable point and its final at least its watermark. Honest
    /// shards always report so, and a report that is not cannot move this view to an epoch
    /// whose stable points it does not also carry (which would stall every leader, waiting
    /// for a stable point nobody has).
    pub fn on_report(&mut self, report: &Report) -> bool {
        let stables = &report.stables;
        let chained =
            stables.windows(2).all(|w| w[0].0.checked_add(1) == Some(w[1].0) && w[0].1 <= w[1].1);
        let bridged = match stables.last() {
            None => report.epoch == 0,
            Some(&(last, stable)) => {
                last.checked_add(1) == Some(report.epoch) && report.w >= stable
            }
        };
        let well_formed = report.shard.0 < self.shards
            && stables.len() <= STABLES_REPORTED
            && chained
            && bridged
            && report.final_w.is_none_or(|f| f >= report.w);
        if !well_formed {
            return false;
        }
        for &(epoch, stable) in &report.stables {
            self.learn_stable(epoch, stable);
        }
        if report.epoch > self.epoch {
            // Epochs were skipped here: the watermarks of the new one are unknown until each
            // shard reports in it.
            self.epoch = report.epoch;
            self.current.clear();
            self.finals.clear();
        }
        if report.epoch == self.epoch {
            let w = report.final_w.unwrap_or(report.w);
            let known = self.current.entry(report.shard).or_insert(w);
            *known = (*known).max(w);
            if let Some(final_w) = report.final_w {
                self.finals.entry(report.shard).or_insert(final_w);
                if self.finals.len() == self.shards as usize {
                    let stable = self.finals.values().copied().min().expect("every final");
                    self.learn_stable(self.epoch, stable);
                }
            }
        }
        true
    }

    /// Epoch `epoch` closed at `stable`; a later epoch then starts here if it had not.
    fn learn_stable(&mut self, epoch: u64, stable: Timestamp) {
        if epoch.saturating_add(EPOCHS_REMEMBERED as u64) < self.epoch {
            return; // Too old to keep.
        }
        self.stable.entry(epoch).or_insert(stable);
        while self.stable.len() > EPOCHS_REMEMBERED {
            self.stable.pop_first();
        }
        if epoch >= self.epoch {
            self.epoch = epoch.saturating_add(1);
            self.finals.clear();
            self.current = (0..self.shards).map(|s| (ShardId(s), stable)).collect();
        }
    }

    /// The global watermark of the newest epoch: the minimum over every shard, once every
    /// shard has reported in it.
    pub fn global(&self) -> Option<Timestamp> {
        if self.current.len() < self.shards as usize {
            return None;
        }
        self.current.values().copied().min()
    }

    /// The highest watermark any shard reported in the newest epoch: a leader whose clock is
    /// behind ticks at least this far, so its shard does not hold every commit's durability
    /// back by its clock's lag (a hybrid clock; ticking higher is always safe, since every
    /// later proposal on the shard is above what it handed out).
    pub fn highest(&self) -> Option<Timestamp> {
        self.current.values().copied().max()
    }

    /// A timestamp at or below which every commit known here is durable for good (history
    /// below it may be collected): the global watermark of the newest epoch, or the newest
    /// stable point.
    pub fn durable_floor(&self) -> Timestamp {
        let stable = self.stable.last_key_value().map_or(Timestamp::ZERO, |(_, &s)| s);
        self.global().map_or(stable, |g| g.max(stable))
    }

    /// Whether a commit of `epoch` at `ts` is durable.
    pub fn verdict(&self, epoch: u64, ts: Timestamp) -> Verdict {
        if let Some(&stable) = self.stable.get(&epoch) {
            return if ts <= stable { Verdict::Durable } else { Verdict::Discarded };
        }
        if epoch > self.epoch {
            return Verdict::Pending;
        }
        if epoch == self.epoch {
            return match self.global() {
                Some(global) if ts <= global => Verdict::Durable,
                _ => Verdict::Pending,
            };
        }
        // Closed, stable point unknown: a later report may still carry it (a shard one epoch
        // behind the newest reports the stable points of the eight before its own), unless
        // every shard has closed too many epochs since.
        if epoch.saturating_add(STABLES_REPORTED as u64 + 1) < self.epoch
            || self.stable.first_key_value().is_some_and(|(&oldest, _)| {
                epoch < oldest && self.stable.len() >= EPOCHS_REMEMBERED
            })
        {
            Verdict::Forgotten
        } else {
            Verdict::Pending
        }
    }
}

impl Durability for Watermarks {
    fn epoch(&self) -> u64 {
        Watermarks::epoch(self)
    }

    fn verdict(&self, epoch: u64, ts: Timestamp) -> Verdict {
        Watermarks::verdict(self, epoch, ts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: ShardId = ShardId(0);
    const B: ShardId = ShardId(1);

    fn report(shard: ShardId, epoch: u64, w: u64, final_w: Option<u64>) -> Report {
        Report { shard, epoch, w: Timestamp(w), final_w: final_w.map(Timestamp), stables: vec![] }
    }

    #[test]
    fn the_candidate_stays_below_every_prepared_proposal() {
        assert_eq!(candidate(Timestamp(10), None), Timestamp(10));
        assert_eq!(candidate(Timestamp(30), Some(Timestamp(15))), Timestamp(14));
        assert_eq!(candidate(Timestamp(10), Some(Timestamp(20))), Timestamp(10));
        assert_eq!(candidate(Timestamp(10), Some(Timestamp(0))), Timestamp(0));
    }

    #[test]
    fn a_commit_is_durable_once_every_shard_covers_it() {
        let mut w = Watermarks::new(2);
        assert_eq!(w.verdict(0, Timestamp(5)), Verdict::Pending);
        w.on_report(&report(A, 0, 30, None));
        assert_eq!(w.verdict(0, Timestamp(5)), Verdict::Pending, "B has not reported");
        w.on_report(&report(B, 0, 10, None));
        assert_eq!(w.verdict(0, Timestamp(10)), Verdict::Durable);
        assert_eq!(w.verdict(0, Timestamp(11)), Verdict::Pending);
        w.on_report(&report(B, 0, 5, None));
        assert_eq!(w.global(), Some(Timestamp(10)), "a late report does not lower it");
        assert_eq!(w.verdict(1, Timestamp(1)), Verdict::Pending, "a later epoch");
        assert!(!w.on_report(&report(ShardId(2), 0, 50, None)), "no such shard");
        assert!(!w.on_report(&report(A, 0, 50, Some(40))), "a final below the watermark");
        assert_eq!(w.durable_floor(), Timestamp(10));
    }

    #[test]
    fn a_failover_keeps_what_was_durable_and_discards_the_rest() {
        let mut w = Watermarks::new(2);
        w.on_report(&report(A, 0, 30, None));
        w.on_report(&report(B, 0, 20, None));
        assert!(!w.is_closing(0));
        w.on_report(&report(A, 0, 30, Some(35)));
        assert!(w.is_closing(0));
        assert_eq!(w.stable(0), None);
        w.on_report(&report(B, 0, 20, Some(25)));
        assert_eq!(w.stable(0), Some(Timestamp(25)));
        assert_eq!(w.epoch(), 1);
        assert_eq!(w.verdict(0, Timestamp(20)), Verdict::Durable, "durable before: still");
        assert_eq!(w.verdict(0, Timestamp(25)), Verdict::Durable, "covered by the finals");
        assert_eq!(w.verdict(0, Timestamp(26)), Verdict::Discarded);
        assert_eq!(w.verdict(1, Timestamp(25)), Verdict::Durable, "the new epoch starts at S");
        assert_eq!(w.verdict(1, Timestamp(26)), Verdict::Pending);
        w.on_report(&report(A, 0, 30, Some(99)));
        assert_eq!(w.stable(0), Some(Timestamp(25)), "a late final of a closed epoch");
        assert_eq!(w.durable_floor(), Timestamp(25));
    }

    /// A node that missed epochs learns their stable points from later reports; until then
    /// their commits are pending, and once too many epochs passed, forgotten. Reports that
    /// do not chain their stable points up to their own epoch are refused.
    #[test]
    fn skipped_epochs_are_learned_late_or_forgotten_never_guessed() {
        let stables = |from: u64, to: u64| -> Vec<(u64, Timestamp)> {
            (from..to).map(|e| (e, Timestamp(10 * (e + 1)))).collect()
        };
        let mut w = Watermarks::new(1);
        let mut late = report(A, 3, 50, None);
        late.stables = stables(1, 3);
        assert!(w.on_report(&late));
        assert_eq!(w.epoch(), 3);
        assert_eq!(w.verdict(2, Timestamp(31)), Verdict::Discarded);
        assert_eq!(w.verdict(1, Timestamp(20)), Verdict::Durable);
        assert_eq!(w.verdict(0, Timestamp(5)), Verdict::Pending, "may still be reported");
        assert_eq!(w.verdict(3, Timestamp(50)), Verdict::Durable);
        late.stables = stables(0, 3);
        assert!(w.on_report(&late));
        assert_eq!(w.verdict(0, Timestamp(5)), Verdict::Durable);
        let mut far = report(A, 14, 200, None);
        far.stables = stables(6, 14);
        assert!(w.on_report(&far));
        assert_eq!(w.verdict(4, Timestamp(45)), Verdict::Forgotten);
        assert_eq!(w.verdict(0, Timestamp(5)), Verdict::Durable, "still remembered");
        // Refused: a jump without the stable points that bridge it, a gap in the chain, a
        // stable point going back, a watermark below the last stable point, too many.
        let before = w.epoch();
        let mut bad = report(A, 20, 500, None);
        assert!(!w.on_report(&bad));
        bad.stables = vec![(17, Timestamp(300)), (19, Timestamp(310))];
        assert!(!w.on_report(&bad));
        bad.stables = vec![(18, Timestamp(300)), (19, Timestamp(290))];
        assert!(!w.on_report(&bad));
        bad.stables = vec![(19, Timestamp(600))];
        assert!(!w.on_report(&bad));
        bad.stables = stables(11, 20);
        assert!(!w.on_report(&bad), "more than {STABLES_REPORTED}");
        let mut overflow = report(A, 0, 0, None);
        overflow.stables = vec![(u64::MAX, Timestamp(1))];
        assert!(!w.on_report(&overflow));
        assert_eq!(w.epoch(), before, "nothing moved");
    }

    /// Random watermark reports, finals (each at least the shard's last reported watermark,
    /// as a shard's log guarantees), failovers, and reports lost, repeated or out of date: a
    /// commit once seen durable is never later discarded, and two nodes hearing different
    /// subsets never disagree on a closed epoch.
    #[test]
    fn durable_stays_durable_across_random_failovers() {
        use meridian_core::rng::{child_rng, uniform_u64};
        for seed in 0..300 {
            let mut rng = child_rng(seed, "mako-watermarks", 0);
            let shards = 1 + uniform_u64(&mut rng, 3) as u32;
            let mut nodes = [Watermarks::new(shards), Watermarks::new(shards)];
            // The shards' own state: epoch, watermark, final, stable points.
            let mut epoch = 0;
            let mut truth: Vec<Timestamp> = vec![Timestamp::ZERO; shards as usize];
            let mut finals: Vec<Option<Timestamp>> = vec![None; shards as usize];
            let mut stables: Vec<(u64, Timestamp)> = Vec::new();
            let mut sent: Vec<Report> = Vec::new();
            let mut seen_durable: Vec<(u64, Timestamp)> = Vec::new();
            for _ in 0..300 {
                let s = uniform_u64(&mut rng, u64::from(shards)) as usize;
                match uniform_u64(&mut rng, 6) {
                    0 | 1 if finals[s].is_none() => {
                        truth[s] = Timestamp(truth[s].0 + uniform_u64(&mut rng, 10));
                    }
                    2 if finals[s].is_none() => finals[s] = Some(truth[s]),
                    _ => {}
                }
                if finals.iter().all(Option::is_some) {
                    let stable = finals.iter().flatten().copied().min().unwrap();
                    stables.push((epoch, stable));
                    if stables.len() > STABLES_REPORTED {
                        stables.remove(0);
                    }
                    epoch += 1;
                    truth.iter_mut().for_each(|t| *t = (*t).max(stable));
                    finals.iter_mut().for_each(|f| *f = None);
                }
                let fresh = Report {
                    shard: ShardId(s as u32),
                    epoch,
                    w: truth[s],
                    final_w: finals[s],
                    stables: stables.clone(),
                };
                sent.push(fresh);
                // Each node hears a random earlier report (or none).
                for node in nodes.iter_mut() {
                    if uniform_u64(&mut rng, 4) > 0 {
                        let pick = uniform_u64(&mut rng, sent.len() as u64) as usize;
                        let pick =
                            if uniform_u64(&mut rng, 2) == 0 { sent.len() - 1 } else { pick };
                        node.on_report(&sent[pick]);
                    }
                    let ts = Timestamp(uniform_u64(&mut rng, 300));
                    if node.verdict(node.epoch(), ts) == Verdict::Durable {
                        seen_durable.push((node.epoch(), ts));
                    }
                }
                for node in &nodes {
                    for &(e, ts) in &seen_durable {
                        let verdict = node.verdict(e, ts);
                        assert!(
                            matches!(
                                verdict,
                                Verdict::Durable | Verdict::Pending | Verdict::Forgotten
                            ),
                            "seed {seed}: epoch {e} at {ts:?} was durable, now {verdict:?}"
                        );
                    }
                    for &(e, stable) in &stables {
                        assert!(node.stable(e).is_none_or(|s| s == stable), "seed {seed}");
                    }
                }
            }
        }
    }
}
