//! When a speculative commit is durable, and what a failover discards.
//!
//! **Candidate.** A shard leader's watermark candidate is the largest timestamp below which
//! nothing more can commit on the shard: one below the smallest proposal of an attempt still
//! prepared (it may commit at or above its proposal), and at most the shard's last handed-out
//! timestamp (every later proposal is above it). A stream entry carries the candidate of its
//! proposal time; once the entry is replicated, every commit at or below that candidate is
//! replicated too (it was proposed earlier, and the log is a sequence), so the candidate of
//! the last replicated entry is the shard's **watermark**.
//!
//! **Durable.** A commit of epoch `e` at timestamp `t` is durable once `t` is at or below the
//! minimum of every shard's watermark in `e` (the **global watermark**). Watermarks only grow
//! within an epoch; a report from another epoch is ignored.
//!
//! **Epoch close.** When any shard's leader changes, epoch `e` closes: each shard freezes its
//! watermark in `e` and reports it as its **final**; the **stable point** `S_e` is the minimum
//! of all finals. A shard's final is at least every watermark it reported in `e`, so `S_e` is
//! at least every global watermark anyone computed in `e`: a commit once durable stays durable.
//! Commits of `e` above `S_e` are discarded: none of them was durable (that would have needed
//! every watermark, hence every final, at or above it).
//!
//! Bounded: stable points of the last [`EPOCHS_REMEMBERED`] epochs are kept; a question about
//! an older epoch is answered [`Verdict::Forgotten`], never durable or discarded.

use meridian_core::{ShardId, Timestamp, TxnId};
use std::collections::{BTreeMap, BTreeSet};

/// Closed epochs whose stable points are remembered.
pub const EPOCHS_REMEMBERED: usize = 1_024;

/// A shard leader's prepared attempts, for its watermark candidate.
#[derive(Clone, Debug, Default)]
pub struct Candidate {
    prepared: BTreeSet<(Timestamp, TxnId)>,
    by_txn: BTreeMap<TxnId, Timestamp>,
    ts_last: Timestamp,
}

impl Candidate {
    /// `txn` prepared with `proposal` (its proposal is also the latest handed out).
    pub fn prepared(&mut self, txn: TxnId, proposal: Timestamp) {
        if self.by_txn.insert(txn, proposal).is_none() {
            self.prepared.insert((proposal, txn));
        }
        self.handed_out(proposal);
    }

    /// A timestamp was handed out (a proposal, a commit applied here, the clock read for a
    /// tick): later proposals are above it.
    pub fn handed_out(&mut self, ts: Timestamp) {
        self.ts_last = self.ts_last.max(ts);
    }

    /// `txn` was decided here (committed or aborted): it no longer holds the candidate back.
    pub fn decided(&mut self, txn: TxnId) {
        if let Some(proposal) = self.by_txn.remove(&txn) {
            self.prepared.remove(&(proposal, txn));
        }
    }

    /// The candidate now.
    pub fn candidate(&self) -> Timestamp {
        match self.prepared.first() {
            Some(&(lowest, _)) => Timestamp(lowest.0.saturating_sub(1)).min(self.ts_last),
            None => self.ts_last,
        }
    }
}

/// What is known about a commit's durability.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Durable: report it committed.
    Durable,
    /// Discarded by a failover: report it aborted (or retry it).
    Discarded,
    /// Not yet known.
    Pending,
    /// Its epoch closed too long ago to remember the stable point: unknown.
    Forgotten,
}

/// One node's view of every shard's watermark and of the epochs.
#[derive(Clone, Debug)]
pub struct Watermarks {
    shards: u32,
    epoch: u64,
    /// Each shard's watermark in `epoch`.
    current: BTreeMap<ShardId, Timestamp>,
    /// The epoch being closed (`epoch`), with the finals heard so far.
    closing: Option<BTreeMap<ShardId, Timestamp>>,
    /// Stable points of closed epochs.
    stable: BTreeMap<u64, Timestamp>,
}

impl Watermarks {
    /// Watermarks of `shards` shards, starting in epoch 0 with nothing replicated.
    pub fn new(shards: u32) -> Self {
        assert!(shards >= 1, "watermarks of no shard");
        Self { shards, epoch: 0, current: BTreeMap::new(), closing: None, stable: BTreeMap::new() }
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// True while the current epoch is closing (commits of it are no longer accepted).
    pub fn is_closing(&self) -> bool {
        self.closing.is_some()
    }

    /// `shard`'s watermark in `epoch` is `w`. Ignored (false) for another epoch, while the
    /// epoch closes, or when lower than what is known.
    pub fn on_watermark(&mut self, epoch: u64, shard: ShardId, w: Timestamp) -> bool {
        if epoch != self.epoch || self.closing.is_some() || shard.0 >= self.shards {
            return false;
        }
        let known = self.current.entry(shard).or_insert(w);
        let raised = w >= *known;
        *known = (*known).max(w);
        raised
    }

    /// The global watermark of the current epoch: the minimum over every shard, once every
    /// shard has reported.
    pub fn global(&self) -> Option<Timestamp> {
        if self.current.len() < self.shards as usize {
            return None;
        }
        self.current.values().copied().min()
    }

    /// Epoch `epoch` is closing (a leader changed somewhere). True when that is news.
    pub fn begin_close(&mut self, epoch: u64) -> bool {
        if epoch != self.epoch || self.closing.is_some() {
            return false;
        }
        self.closing = Some(BTreeMap::new());
        true
    }

    /// `shard`'s final watermark for `epoch`. Returns the stable point once every shard's
    /// final is in; the caller then logs the start of the next epoch and calls
    /// [`Watermarks::start_next`].
    pub fn on_final(&mut self, epoch: u64, shard: ShardId, w: Timestamp) -> Option<Timestamp> {
        if epoch != self.epoch || shard.0 >= self.shards {
            return None;
        }
        let finals = self.closing.get_or_insert_with(BTreeMap::new);
        finals.entry(shard).or_insert(w);
        if finals.len() < self.shards as usize {
            return None;
        }
        finals.values().copied().min()
    }

    /// Epoch `epoch` closed at stable point `stable`; the next one starts with every shard's
    /// watermark at the stable point (everything of the closed epoch above it is gone).
    pub fn start_next(&mut self, epoch: u64, stable: Timestamp) {
        if epoch != self.epoch {
            return;
        }
        if let Some(global) = self.global() {
            debug_assert!(stable >= global, "a stable point below a global watermark seen");
        }
        self.stable.insert(epoch, stable);
        while self.stable.len() > EPOCHS_REMEMBERED {
            self.stable.pop_first();
        }
        self.epoch += 1;
        self.closing = None;
        self.current = (0..self.shards).map(|s| (ShardId(s), stable)).collect();
    }

    /// Whether a commit of `epoch` at `ts` is durable.
    pub fn verdict(&self, epoch: u64, ts: Timestamp) -> Verdict {
        if epoch > self.epoch {
            return Verdict::Pending;
        }
        if epoch == self.epoch {
            return match self.global() {
                Some(global) if ts <= global => Verdict::Durable,
                _ => Verdict::Pending,
            };
        }
        match self.stable.get(&epoch) {
            Some(&stable) if ts <= stable => Verdict::Durable,
            Some(_) => Verdict::Discarded,
            None => Verdict::Forgotten,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::NodeId;

    const A: ShardId = ShardId(0);
    const B: ShardId = ShardId(1);

    fn txn(seq: u64) -> TxnId {
        TxnId { origin: NodeId(4), incarnation: 1, seq }
    }

    #[test]
    fn the_candidate_stays_below_every_prepared_proposal() {
        let mut c = Candidate::default();
        c.handed_out(Timestamp(10));
        assert_eq!(c.candidate(), Timestamp(10));
        c.prepared(txn(1), Timestamp(20));
        c.prepared(txn(2), Timestamp(15));
        assert_eq!(c.candidate(), Timestamp(14));
        c.decided(txn(2));
        assert_eq!(c.candidate(), Timestamp(19));
        c.decided(txn(1));
        assert_eq!(c.candidate(), Timestamp(20), "the last handed out");
        c.decided(txn(1));
        assert_eq!(c.candidate(), Timestamp(20), "a second decision changes nothing");
    }

    #[test]
    fn a_commit_is_durable_once_every_shard_covers_it() {
        let mut w = Watermarks::new(2);
        assert_eq!(w.verdict(0, Timestamp(5)), Verdict::Pending);
        w.on_watermark(0, A, Timestamp(30));
        assert_eq!(w.verdict(0, Timestamp(5)), Verdict::Pending, "B has not reported");
        w.on_watermark(0, B, Timestamp(10));
        assert_eq!(w.verdict(0, Timestamp(10)), Verdict::Durable);
        assert_eq!(w.verdict(0, Timestamp(11)), Verdict::Pending);
        assert!(!w.on_watermark(0, B, Timestamp(5)), "watermarks never go back");
        assert!(!w.on_watermark(1, B, Timestamp(50)), "another epoch");
        assert_eq!(w.global(), Some(Timestamp(10)));
    }

    #[test]
    fn a_failover_keeps_what_was_durable_and_discards_the_rest() {
        let mut w = Watermarks::new(2);
        w.on_watermark(0, A, Timestamp(30));
        w.on_watermark(0, B, Timestamp(20));
        assert!(w.begin_close(0));
        assert!(!w.begin_close(0), "already closing");
        assert!(!w.on_watermark(0, B, Timestamp(40)), "frozen while closing");
        assert_eq!(w.on_final(0, A, Timestamp(35)), None);
        let stable = w.on_final(0, B, Timestamp(25)).unwrap();
        assert_eq!(stable, Timestamp(25));
        w.start_next(0, stable);
        assert_eq!(w.epoch(), 1);
        assert_eq!(w.verdict(0, Timestamp(20)), Verdict::Durable, "durable before: still");
        assert_eq!(w.verdict(0, Timestamp(25)), Verdict::Durable, "covered by the finals");
        assert_eq!(w.verdict(0, Timestamp(26)), Verdict::Discarded);
        assert_eq!(w.verdict(1, Timestamp(25)), Verdict::Durable, "the new epoch starts at S");
        assert_eq!(w.verdict(1, Timestamp(26)), Verdict::Pending);
        assert_eq!(w.on_final(0, A, Timestamp(99)), None, "a late final of a closed epoch");
    }

    #[test]
    fn old_epochs_are_forgotten_not_guessed() {
        let mut w = Watermarks::new(1);
        for epoch in 0..(EPOCHS_REMEMBERED as u64 + 2) {
            w.begin_close(epoch);
            let stable = w.on_final(epoch, A, Timestamp(epoch)).unwrap();
            w.start_next(epoch, stable);
        }
        assert_eq!(w.verdict(0, Timestamp(0)), Verdict::Forgotten);
        assert_eq!(w.verdict(EPOCHS_REMEMBERED as u64, Timestamp(0)), Verdict::Durable);
    }

    /// Random watermark reports, finals (each at least the shard's last reported watermark,
    /// as a shard's log guarantees) and failovers: a commit once seen durable is never later
    /// discarded, and every verdict about a closed epoch is final.
    #[test]
    fn durable_stays_durable_across_random_failovers() {
        use meridian_core::rng::{child_rng, uniform_u64};
        for seed in 0..300 {
            let mut rng = child_rng(seed, "mako-watermarks", 0);
            let shards = 1 + uniform_u64(&mut rng, 3) as u32;
            let mut w = Watermarks::new(shards);
            let mut truth: Vec<Timestamp> = vec![Timestamp::ZERO; shards as usize];
            let mut seen_durable: Vec<(u64, Timestamp)> = Vec::new();
            for _ in 0..200 {
                let shard = ShardId(uniform_u64(&mut rng, u64::from(shards)) as u32);
                match uniform_u64(&mut rng, 5) {
                    0..=2 => {
                        let s = shard.0 as usize;
                        truth[s] = Timestamp(truth[s].0 + uniform_u64(&mut rng, 10));
                        w.on_watermark(w.epoch(), shard, truth[s]);
                    }
                    3 => {
                        let epoch = w.epoch();
                        w.begin_close(epoch);
                        let mut stable = None;
                        for s in 0..shards {
                            let s_ts = &mut truth[s as usize];
                            *s_ts = Timestamp(s_ts.0 + uniform_u64(&mut rng, 3));
                            stable = w.on_final(epoch, ShardId(s), *s_ts);
                        }
                        let stable = stable.expect("every final in");
                        w.start_next(epoch, stable);
                        truth.iter_mut().for_each(|t| *t = (*t).max(stable));
                    }
                    _ => {
                        let ts = Timestamp(uniform_u64(&mut rng, 200));
                        if w.verdict(w.epoch(), ts) == Verdict::Durable {
                            seen_durable.push((w.epoch(), ts));
                        }
                    }
                }
                for &(epoch, ts) in &seen_durable {
                    let verdict = w.verdict(epoch, ts);
                    assert_eq!(verdict, Verdict::Durable, "seed {seed}: epoch {epoch} at {ts:?}");
                }
            }
        }
    }
}
