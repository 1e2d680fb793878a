//! A Tiga coordinator's bookkeeping for its transactions in flight (Tiga §3.1, §3.4), sans-IO:
//! it stamps each transaction from its one-way delay estimates ([`super::owd`]), names every
//! replica of every participant shard to send it to, learns a delay sample from every reply,
//! tallies each shard's replies ([`ShardTally`]) and decides once every participant shard has
//! committed it at one timestamp: on the fast path when every shard did so with a super quorum
//! of matching fast replies, on the slow path otherwise. Sending, retrying and answering the
//! client are the node's.
//!
//! Replies are matched to replica slots through the placement given at the start, so a reply
//! from a node that holds no replica of the shard counts for nothing. Leaders' fast replies
//! carry the agreed timestamp; a shard whose leader answered at another timestamp than the
//! others' holds the decision back (it cannot happen when the leaders agree, and deciding then
//! would commit the transaction at two timestamps).
//!
//! A transaction decided on the slow path stays watched (at most `open_max` of them, oldest
//! forgotten first) for fast replies still coming: when every shard's super quorum matches
//! after all, it is counted ([`Tracker::fast_after_slow_total`]). A slow path that wins the
//! race against a fast quorum that would have matched says nothing against the fast path;
//! one whose fast quorum never matched does.
//!
//! Bounded: at most `open_max` transactions in flight ([`Refused::Busy`] beyond).

use super::owd::{OwdEstimator, OwdSettings};
use super::quorum::{super_quorum, ShardPath, ShardTally};
use meridian_core::{NodeId, ShardId, Time, Timestamp, TxnId};
use std::collections::{BTreeMap, VecDeque};

/// Where one participant shard's replicas are, in the current view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardPlacement {
    /// The shard.
    pub shard: ShardId,
    /// Its replicas' nodes, by replica slot.
    pub replicas: Vec<NodeId>,
    /// The slot of its leader.
    pub leader_slot: u32,
}

/// Why a transaction could not start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// `open_max` transactions are in flight.
    Busy,
    /// The transaction is already in flight.
    Duplicate,
    /// A placement without shards, without replicas, or with the leader outside them.
    BadPlacement(String),
}

/// A decided transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Committed {
    /// The transaction.
    pub txn: TxnId,
    /// The timestamp every participant shard committed it at.
    pub ts: Timestamp,
    /// True when every shard committed it on the fast path.
    pub fast: bool,
}

/// One transaction in flight.
#[derive(Debug)]
struct Open {
    stamped: Timestamp,
    /// Per shard: its replicas by slot, and their replies.
    shards: BTreeMap<ShardId, (Vec<NodeId>, ShardTally)>,
}

/// A coordinator's transactions in flight.
#[derive(Debug)]
pub struct Tracker {
    owd: OwdEstimator,
    open: BTreeMap<TxnId, Open>,
    open_max: usize,
    /// Decided on the slow path, still hearing fast replies; in decision order.
    watched: BTreeMap<TxnId, Open>,
    watch_order: VecDeque<TxnId>,
    fast_after_slow_total: u64,
}

impl Tracker {
    /// A tracker with the given delay settings (checked) and room for `open_max` transactions.
    pub fn new(settings: OwdSettings, open_max: usize) -> Self {
        assert!(open_max >= 1, "a coordinator needs room");
        Self {
            owd: OwdEstimator::new(settings),
            open: BTreeMap::new(),
            open_max,
            watched: BTreeMap::new(),
            watch_order: VecDeque::new(),
            fast_after_slow_total: 0,
        }
    }

    /// Slow-path decisions whose every shard's fast replies matched in a super quorum after
    /// all (the slow quorum answered first).
    pub fn fast_after_slow_total(&self) -> u64 {
        self.fast_after_slow_total
    }

    /// Transactions in flight.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// True when none is in flight.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// The timestamp `txn` was stamped with, while in flight.
    pub fn stamped(&self, txn: TxnId) -> Option<Timestamp> {
        self.open.get(&txn).map(|o| o.stamped)
    }

    /// Starts `txn`, sent at `now` to the shards `placement` lists: its timestamp, and every
    /// replica to send it to.
    pub fn start(
        &mut self,
        now: Time,
        txn: TxnId,
        placement: &[ShardPlacement],
    ) -> Result<(Timestamp, Vec<NodeId>), Refused> {
        if self.open.contains_key(&txn) {
            return Err(Refused::Duplicate);
        }
        if self.open.len() >= self.open_max {
            return Err(Refused::Busy);
        }
        check_placement(placement)?;
        // Every shard has the same replica count here (one topology), so one quorum size.
        let replicas = placement[0].replicas.len() as u32;
        let quorum = super_quorum(replicas);
        let shards: Vec<(NodeId, Vec<NodeId>)> = placement
            .iter()
            .map(|p| {
                let leader = p.replicas[p.leader_slot as usize];
                let followers = p.replicas.iter().copied().filter(|&n| n != leader).collect();
                (leader, followers)
            })
            .collect();
        let ts = self.owd.stamp(now, &shards, quorum);
        let open = Open {
            stamped: ts,
            shards: placement
                .iter()
                .map(|p| {
                    let tally = ShardTally::new(p.replicas.len() as u32, p.leader_slot);
                    (p.shard, (p.replicas.clone(), tally))
                })
                .collect(),
        };
        let to = placement.iter().flat_map(|p| p.replicas.iter().copied()).collect();
        self.open.insert(txn, open);
        Ok((ts, to))
    }

    /// The current one-way delay estimate to `node`.
    pub fn estimate_ns(&mut self, node: NodeId) -> u64 {
        self.owd.estimate_ns(node)
    }

    /// A reply carried a one-way delay sample: how long a request of this coordinator took
    /// to reach `from`.
    pub fn observe(&mut self, from: NodeId, owd_ns: u64) {
        self.owd.observe(from, owd_ns);
    }

    /// A fast reply from `from` for `txn` on `shard`: released at `ts` with log hash `hash`.
    pub fn on_fast(
        &mut self,
        from: NodeId,
        txn: TxnId,
        shard: ShardId,
        ts: Timestamp,
        hash: u64,
    ) -> Option<Committed> {
        if let Some(open) = self.watched.get_mut(&txn) {
            let (replicas, tally) = open.shards.get_mut(&shard)?;
            let slot = replicas.iter().position(|&n| n == from)?;
            tally.on_fast(slot as u32, ts, hash);
            if decide(txn, open).is_some_and(|d| d.fast) {
                self.watched.remove(&txn);
                self.fast_after_slow_total += 1;
            }
            return None; // Decided already.
        }
        self.record(from, txn, shard, |tally, slot| tally.on_fast(slot, ts, hash))
    }

    /// A slow reply from follower `from`: its log matches the leader's up to `txn` at `ts`.
    pub fn on_slow(
        &mut self,
        from: NodeId,
        txn: TxnId,
        shard: ShardId,
        ts: Timestamp,
    ) -> Option<Committed> {
        self.record(from, txn, shard, |tally, slot| tally.on_slow(slot, ts))
    }

    /// The view changed: every shard is now placed as `placements` say (for tiga the same
    /// replicas with another leader slot; for luigi, which hears the leader only, the new
    /// leader). The replies collected so far are of the old view and count for nothing (a
    /// commit counts replies of one view only); what was decided on the slow path stops
    /// being watched.
    pub fn new_view(&mut self, placements: &[ShardPlacement]) {
        let by_shard: BTreeMap<ShardId, &ShardPlacement> =
            placements.iter().map(|p| (p.shard, p)).collect();
        for open in self.open.values_mut() {
            for (shard, (replicas, tally)) in open.shards.iter_mut() {
                if let Some(placement) = by_shard.get(shard) {
                    replicas.clone_from(&placement.replicas);
                    *tally = ShardTally::new(replicas.len() as u32, placement.leader_slot);
                } else {
                    *tally = ShardTally::new(replicas.len() as u32, 0);
                }
            }
        }
        self.watched.clear();
        self.watch_order.clear();
    }

    /// Luigi: `txn`, decided at `ts` and waiting for watermarks when the view changed, is
    /// in flight again on the shards `placement` lists (its replies are collected afresh,
    /// in the new view). Nothing when it is in flight already.
    pub fn reopen(&mut self, txn: TxnId, ts: Timestamp, placement: &[ShardPlacement]) {
        if self.open.contains_key(&txn) || check_placement(placement).is_err() {
            return;
        }
        let shards = placement
            .iter()
            .map(|p| {
                let tally = ShardTally::new(p.replicas.len() as u32, p.leader_slot);
                (p.shard, (p.replicas.clone(), tally))
            })
            .collect();
        self.open.insert(txn, Open { stamped: ts, shards });
    }

    /// Gives up on `txn` (the node retries it afresh, or answers its client).
    pub fn abandon(&mut self, txn: TxnId) -> bool {
        self.open.remove(&txn).is_some()
    }

    fn record(
        &mut self,
        from: NodeId,
        txn: TxnId,
        shard: ShardId,
        note: impl FnOnce(&mut ShardTally, u32),
    ) -> Option<Committed> {
        let open = self.open.get_mut(&txn)?;
        let (replicas, tally) = open.shards.get_mut(&shard)?;
        let slot = replicas.iter().position(|&n| n == from)? as u32;
        note(tally, slot);
        let decided = decide(txn, open)?;
        let open = self.open.remove(&txn).expect("just seen");
        if !decided.fast {
            // Bounded: the oldest watched is forgotten first (ids of ones that matched may
            // linger in the order; they are skipped).
            while self.watched.len() >= self.open_max {
                let Some(oldest) = self.watch_order.pop_front() else { break };
                self.watched.remove(&oldest);
            }
            self.watched.insert(txn, open);
            self.watch_order.push_back(txn);
            if self.watch_order.len() > 2 * self.open_max {
                self.watch_order.retain(|t| self.watched.contains_key(t));
            }
        }
        Some(decided)
    }
}

/// The decision on `open`, once every shard committed it at one timestamp.
fn decide(txn: TxnId, open: &Open) -> Option<Committed> {
    let mut ts = None;
    let mut fast = true;
    for (_, tally) in open.shards.values() {
        let (path, at) = tally.outcome()?;
        if *ts.get_or_insert(at) != at {
            return None; // Leaders at different timestamps: not agreed (yet).
        }
        fast &= path == ShardPath::Fast;
    }
    Some(Committed { txn, ts: ts?, fast })
}

fn check_placement(placement: &[ShardPlacement]) -> Result<(), Refused> {
    let bad = |why: String| Err(Refused::BadPlacement(why));
    let Some(first) = placement.first() else { return bad("no shard".into()) };
    for p in placement {
        if p.replicas.is_empty() || p.replicas.len() != first.replicas.len() {
            return bad(format!("shard {} has {} replicas", p.shard.0, p.replicas.len()));
        }
        if p.leader_slot as usize >= p.replicas.len() {
            return bad(format!("shard {} led by slot {}", p.shard.0, p.leader_slot));
        }
        let distinct: std::collections::BTreeSet<NodeId> = p.replicas.iter().copied().collect();
        if distinct.len() != p.replicas.len() {
            return bad(format!("shard {} names a node twice", p.shard.0));
        }
    }
    let mut shards: Vec<ShardId> = placement.iter().map(|p| p.shard).collect();
    shards.sort_unstable();
    shards.dedup();
    if shards.len() != placement.len() {
        return bad("a shard listed twice".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::owd::test_settings as settings;
    use super::*;
    use meridian_core::time::NS_PER_MS;

    fn txn(seq: u64) -> TxnId {
        TxnId { origin: NodeId(20), incarnation: 1, seq }
    }

    /// Shard `s` on nodes 3s, 3s + 1, 3s + 2, led by slot 0.
    fn placement(shards: u32) -> Vec<ShardPlacement> {
        (0..shards)
            .map(|s| ShardPlacement {
                shard: ShardId(s),
                replicas: (0..3).map(|r| NodeId(3 * s + r)).collect(),
                leader_slot: 0,
            })
            .collect()
    }

    #[test]
    fn a_transaction_is_stamped_from_the_closest_super_quorums_and_sent_to_every_replica() {
        let mut t = Tracker::new(settings(), 8);
        // Shard 0's replicas 5, 20, 40 ms away; shard 1's 30, 10, 90 ms away.
        for (node, ms) in [(0, 5), (1, 20), (2, 40), (3, 30), (4, 10), (5, 90)] {
            t.observe(NodeId(node), ms * NS_PER_MS);
        }
        let (ts, to) = t.start(1_000 * NS_PER_MS, txn(1), &placement(2)).unwrap();
        // With 3 replicas the super quorum is all three: the farthest is 90 ms.
        assert_eq!(ts, Timestamp((1_000 + 90 + 10) * NS_PER_MS));
        assert_eq!(to, (0..6).map(NodeId).collect::<Vec<_>>());
        assert_eq!(t.stamped(txn(1)), Some(ts));
        assert_eq!(t.start(0, txn(1), &placement(2)), Err(Refused::Duplicate));
    }

    #[test]
    fn matching_fast_replies_from_every_shard_commit_on_the_fast_path() {
        let mut t = Tracker::new(settings(), 8);
        let (ts, _) = t.start(0, txn(1), &placement(2)).unwrap();
        let mut decided = Vec::new();
        for node in 0..6 {
            let shard = ShardId(node / 3);
            decided.extend(t.on_fast(NodeId(node), txn(1), shard, ts, 77 + u64::from(node / 3)));
        }
        assert_eq!(decided, [Committed { txn: txn(1), ts, fast: true }]);
        assert!(t.is_empty(), "decided transactions leave");
        assert_eq!(t.on_fast(NodeId(0), txn(1), ShardId(0), ts, 77), None, "late replies: none");
    }

    /// Luigi: a transaction decided by its leaders' answers and reopened at a view change is
    /// decided again by the new leaders only; a tiga view change moves the leader slot and
    /// keeps the replicas.
    #[test]
    fn a_view_change_places_open_and_reopened_transactions_anew() {
        let mut t = Tracker::new(settings(), 8);
        let leaders = |leader: u32| {
            vec![ShardPlacement {
                shard: ShardId(0),
                replicas: vec![NodeId(leader)],
                leader_slot: 0,
            }]
        };
        let (ts, _) = t.start(0, txn(1), &leaders(0)).unwrap();
        let decided = t.on_fast(NodeId(0), txn(1), ShardId(0), ts, 0);
        assert_eq!(decided, Some(Committed { txn: txn(1), ts, fast: true }));
        t.reopen(txn(1), ts, &leaders(1));
        t.reopen(txn(1), ts, &leaders(2));
        assert_eq!(t.len(), 1, "reopened once");
        assert_eq!(t.on_fast(NodeId(0), txn(1), ShardId(0), ts, 0), None, "the old leader");
        let moved = Timestamp(ts.0 + 9);
        let decided = t.on_fast(NodeId(1), txn(1), ShardId(0), moved, 0);
        assert_eq!(decided, Some(Committed { txn: txn(1), ts: moved, fast: true }));
        // Tiga: the same replicas, led by slot 1 now; the old leader's reply is a follower's
        // slow reply, which with the new leader's fast one commits on the slow path.
        let (ts, _) = t.start(0, txn(2), &placement(1)).unwrap();
        let mut moved = placement(1);
        moved[0].leader_slot = 1;
        t.new_view(&moved);
        let later = Timestamp(ts.0 + 3);
        assert_eq!(t.on_fast(NodeId(1), txn(2), ShardId(0), later, 5), None);
        let decided = t.on_slow(NodeId(0), txn(2), ShardId(0), later);
        assert_eq!(decided, Some(Committed { txn: txn(2), ts: later, fast: false }));
    }

    #[test]
    fn a_mismatched_follower_leaves_the_shard_to_the_slow_path() {
        let mut t = Tracker::new(settings(), 8);
        let (ts, _) = t.start(0, txn(1), &placement(1)).unwrap();
        let moved = Timestamp(ts.0 + 5);
        assert_eq!(t.on_fast(NodeId(0), txn(1), ShardId(0), moved, 9), None, "the leader bumped");
        assert_eq!(t.on_fast(NodeId(1), txn(1), ShardId(0), ts, 4), None, "a follower did not");
        assert_eq!(t.on_fast(NodeId(2), txn(1), ShardId(0), ts, 4), None);
        // A follower synced to the leader's log at the leader's timestamp: f = 1 slow reply.
        assert_eq!(t.on_slow(NodeId(1), txn(1), ShardId(0), ts), None, "not the leader's time");
        let decided = t.on_slow(NodeId(2), txn(1), ShardId(0), moved);
        assert_eq!(decided, Some(Committed { txn: txn(1), ts: moved, fast: false }));
    }

    /// The slow quorum may answer before the fast one: the transaction is decided on the
    /// slow path, and the fast replies still coming are counted when they match after all.
    #[test]
    fn a_fast_quorum_matching_after_a_slow_decision_is_counted() {
        let mut t = Tracker::new(settings(), 2);
        let (ts, _) = t.start(0, txn(1), &placement(1)).unwrap();
        assert_eq!(t.on_fast(NodeId(0), txn(1), ShardId(0), ts, 4), None, "the leader");
        let decided = t.on_slow(NodeId(1), txn(1), ShardId(0), ts);
        assert_eq!(decided, Some(Committed { txn: txn(1), ts, fast: false }));
        assert!(t.is_empty());
        assert_eq!(t.on_fast(NodeId(1), txn(1), ShardId(0), ts, 4), None, "decided already");
        assert_eq!(t.fast_after_slow_total(), 0, "two of three");
        assert_eq!(t.on_fast(NodeId(2), txn(1), ShardId(0), ts, 4), None);
        assert_eq!(t.fast_after_slow_total(), 1, "the super quorum matched after all");
        assert_eq!(t.on_fast(NodeId(2), txn(1), ShardId(0), ts, 4), None);
        assert_eq!(t.fast_after_slow_total(), 1, "counted once");
        // A mismatched hash never counts; and watching is bounded (room for 2 here).
        for seq in 2..6 {
            let (ts, _) = t.start(0, txn(seq), &placement(1)).unwrap();
            t.on_fast(NodeId(0), txn(seq), ShardId(0), ts, 4);
            assert!(t.on_slow(NodeId(1), txn(seq), ShardId(0), ts).is_some());
            t.on_fast(NodeId(1), txn(seq), ShardId(0), ts, 5);
            t.on_fast(NodeId(2), txn(seq), ShardId(0), ts, 4);
        }
        assert_eq!(t.fast_after_slow_total(), 1);
        assert!(t.watched.len() <= 2 && t.watch_order.len() <= 4);
        // The oldest were forgotten: a matching reply for txn 2 now counts for nothing.
        t.on_fast(NodeId(1), txn(2), ShardId(0), Timestamp(0), 4);
        assert!(!t.watched.contains_key(&txn(2)));
        assert_eq!(t.fast_after_slow_total(), 1);
    }

    #[test]
    fn shards_committed_at_different_timestamps_decide_nothing() {
        let mut t = Tracker::new(settings(), 8);
        let (ts, _) = t.start(0, txn(1), &placement(2)).unwrap();
        let later = Timestamp(ts.0 + 1);
        for node in 0..3 {
            assert_eq!(t.on_fast(NodeId(node), txn(1), ShardId(0), ts, 1), None);
        }
        for node in 3..6 {
            assert_eq!(t.on_fast(NodeId(node), txn(1), ShardId(1), later, 2), None);
        }
        assert_eq!(t.len(), 1, "held back: the leaders did not agree");
        // Shard 0's replicas move to the agreed timestamp (a later reply replaces one).
        let mut decided = None;
        for node in 0..3 {
            decided = decided.or(t.on_fast(NodeId(node), txn(1), ShardId(0), later, 3));
        }
        assert_eq!(decided, Some(Committed { txn: txn(1), ts: later, fast: true }));
    }

    #[test]
    fn strangers_and_bad_placements_count_for_nothing() {
        let mut t = Tracker::new(settings(), 1);
        let (ts, _) = t.start(0, txn(1), &placement(1)).unwrap();
        // Nodes 3..6 hold no replica of shard 0; shard 7 is not a participant.
        for node in 3..6 {
            assert_eq!(t.on_fast(NodeId(node), txn(1), ShardId(0), ts, 1), None);
        }
        assert_eq!(t.on_fast(NodeId(0), txn(1), ShardId(7), ts, 1), None);
        assert_eq!(t.on_fast(NodeId(0), txn(2), ShardId(0), ts, 1), None, "unknown transaction");
        assert_eq!(t.start(0, txn(2), &placement(1)), Err(Refused::Busy));
        assert!(t.abandon(txn(1)));
        let mut bad = placement(2);
        bad[1].leader_slot = 3;
        assert!(matches!(t.start(0, txn(2), &bad), Err(Refused::BadPlacement(_))));
        bad[1] = bad[0].clone();
        assert!(matches!(t.start(0, txn(2), &bad), Err(Refused::BadPlacement(_))));
        assert!(matches!(t.start(0, txn(2), &[]), Err(Refused::BadPlacement(_))));
        let mut twice = placement(1);
        twice[0].replicas[1] = twice[0].replicas[0];
        assert!(matches!(t.start(0, txn(2), &twice), Err(Refused::BadPlacement(_))));
        assert!(t.is_empty());
    }
}
