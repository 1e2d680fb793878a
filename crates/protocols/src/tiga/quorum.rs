//! Commit quorums of one Tiga shard and the log hashes its replicas vouch with (Tiga §3.4,
//! §3.7, App. D).
//!
//! A shard of `n = 2f + 1` replicas **fast-commits** a transaction when the coordinator holds
//! fast replies from a super quorum of `1 + f + ⌈f/2⌉` replicas that includes the leader and
//! agrees with the leader on the timestamp and the log hash. The super quorum (as in Fast
//! Paxos) is what lets a view change tell a committed order apart from one that was not: any
//! `f + 1` survivors include at least `⌈f/2⌉ + 1` of its members. It **slow-commits** on the
//! leader's fast reply plus slow replies (the follower's log matches the leader's up to the
//! entry) from `f` followers.
//!
//! **Log hashes.** A replica's fast reply carries a hash of its log as far as the
//! transaction's keys are concerned: per key, the XOR of a digest of every entry that touches
//! it (so transactions on other keys, which commute with this one, do not disturb it), and the
//! reply combines the hashes of the transaction's keys. Two replicas agree exactly when they
//! hold the same entries, at the same timestamps, on those keys (up to 64-bit collisions; the
//! replicas compute the hashes from their own logs, so a client cannot steer them). XOR makes
//! an entry removable: a revoked or repositioned entry is taken out by adding it again.

use meridian_core::key::Key;
use meridian_core::rng::splitmix64;
use meridian_core::{Timestamp, TxnId};
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

/// Replies needed for the fast path in a shard of `replicas` (= 2f + 1) replicas.
pub fn super_quorum(replicas: u32) -> usize {
    let f = (replicas.max(1) as usize - 1) / 2;
    1 + f + f.div_ceil(2)
}

/// Followers' slow replies needed, beside the leader's fast reply, for the slow path.
pub fn slow_followers(replicas: u32) -> usize {
    (replicas.max(1) as usize - 1) / 2
}

/// How a shard committed a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardPath {
    /// A super quorum of matching fast replies.
    Fast,
    /// The leader's fast reply and `f` followers' slow replies.
    Slow,
}

/// The replies one shard's replicas sent for one transaction, at its coordinator.
#[derive(Clone, Debug)]
pub struct ShardTally {
    replicas: u32,
    leader: u32,
    /// Per replica slot: the timestamp and hash of its latest fast reply.
    fast: BTreeMap<u32, (Timestamp, u64)>,
    /// Followers whose log matches the leader's up to this transaction, at this timestamp.
    slow: BTreeMap<u32, Timestamp>,
}

impl ShardTally {
    /// A tally for a shard of `replicas` replicas led by slot `leader`.
    pub fn new(replicas: u32, leader: u32) -> Self {
        assert!(leader < replicas, "leader slot {leader} of {replicas}");
        Self { replicas, leader, fast: BTreeMap::new(), slow: BTreeMap::new() }
    }

    /// Records a fast reply (a later one from the same replica replaces it). Replies from
    /// slots outside the shard are ignored, and so is a leader's reply below one it sent
    /// before: a leader only moves a transaction later (a detective leader answers where it
    /// ran speculatively, then where the leaders agreed), so a lower one is a stale copy.
    pub fn on_fast(&mut self, slot: u32, ts: Timestamp, hash: u64) {
        if slot >= self.replicas {
            return;
        }
        if slot == self.leader && self.fast.get(&slot).is_some_and(|&(had, _)| had > ts) {
            return;
        }
        self.fast.insert(slot, (ts, hash));
    }

    /// Records a follower's slow reply for the transaction at `ts`.
    pub fn on_slow(&mut self, slot: u32, ts: Timestamp) {
        if slot < self.replicas && slot != self.leader {
            self.slow.insert(slot, ts);
        }
    }

    /// The leader's timestamp, once its fast reply is in.
    pub fn leader_ts(&self) -> Option<Timestamp> {
        self.fast.get(&self.leader).map(|&(ts, _)| ts)
    }

    /// Whether the shard has committed the transaction, how, and at which timestamp.
    pub fn outcome(&self) -> Option<(ShardPath, Timestamp)> {
        let &(ts, hash) = self.fast.get(&self.leader)?;
        let matching = self.fast.values().filter(|&&reply| reply == (ts, hash)).count();
        if matching >= super_quorum(self.replicas) {
            return Some((ShardPath::Fast, ts));
        }
        let synced = self.slow.values().filter(|&&t| t == ts).count();
        (synced >= slow_followers(self.replicas)).then_some((ShardPath::Slow, ts))
    }
}

/// Per-key incremental hashes of one replica's log.
#[derive(Clone, Debug, Default)]
pub struct KeyHashes {
    per_key: BTreeMap<Key, u64>,
}

/// A digest of `value` with a fixed hasher (the same on every replica and every run).
fn digest(value: &impl Hash) -> u64 {
    let mut hasher = meridian_core::hash::FnvHasher::default();
    value.hash(&mut hasher);
    splitmix64(hasher.finish())
}

impl KeyHashes {
    /// Keys with a hash.
    pub fn len(&self) -> usize {
        self.per_key.len()
    }

    /// True when no entry was added.
    pub fn is_empty(&self) -> bool {
        self.per_key.is_empty()
    }

    /// Adds the entry `txn` at `ts` to each of `keys` (adding it again takes it out).
    pub fn toggle(&mut self, txn: TxnId, ts: Timestamp, keys: &[Key]) {
        let entry = digest(&(txn, ts));
        for_each_distinct(keys, |key| match self.per_key.get_mut(key) {
            // A key with a hash is looked up, not cloned: this runs on every release.
            Some(hash) => {
                *hash ^= entry;
                if *hash == 0 {
                    self.per_key.remove(key);
                }
            }
            None => {
                self.per_key.insert(key.clone(), entry);
            }
        });
    }

    /// Every key's hash, in key order (what a state transfer carries).
    pub fn pairs(&self) -> impl Iterator<Item = (&Key, u64)> {
        self.per_key.iter().map(|(key, &hash)| (key, hash))
    }

    /// The hashes `pairs` lists (a zero hash is no hash: it is left out).
    pub fn from_pairs(pairs: impl IntoIterator<Item = (Key, u64)>) -> Self {
        Self { per_key: pairs.into_iter().filter(|&(_, hash)| hash != 0).collect() }
    }

    /// The hash a fast reply for a transaction on `keys` carries.
    pub fn reply_hash(&self, keys: &[Key]) -> u64 {
        let mut acc = 0;
        for_each_distinct(keys, |key| {
            let hash = self.per_key.get(key).copied().unwrap_or(0);
            acc ^= splitmix64(digest(key) ^ hash);
        });
        acc
    }
}

/// Calls `f` once for each distinct key of `keys`. Callers pass a part's keys, sorted and
/// without repeats, which are walked as they are; anything else is sorted first.
fn for_each_distinct(keys: &[Key], f: impl FnMut(&Key)) {
    if keys.windows(2).all(|pair| pair[0] < pair[1]) {
        keys.iter().for_each(f);
    } else {
        keys.iter().collect::<BTreeSet<_>>().into_iter().for_each(f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::NodeId;

    fn txn(seq: u64) -> TxnId {
        TxnId { origin: NodeId(3), incarnation: 1, seq }
    }

    fn key(k: u64) -> Key {
        Key::table(1).u64(k).build()
    }

    #[test]
    fn quorum_sizes_follow_the_fault_count() {
        // (replicas, super quorum, slow followers): f = 0, 1, 2, 3.
        for (n, fast, slow) in [(1, 1, 0), (3, 3, 1), (5, 4, 2), (7, 6, 3)] {
            assert_eq!(super_quorum(n), fast, "super quorum of {n}");
            assert_eq!(slow_followers(n), slow, "slow followers of {n}");
        }
    }

    #[test]
    fn the_fast_path_needs_the_leader_and_a_matching_super_quorum() {
        let mut tally = ShardTally::new(5, 0);
        let t = Timestamp(100);
        for slot in 1..=4 {
            tally.on_fast(slot, t, 7);
        }
        assert_eq!(tally.outcome(), None, "four matching replies, but not the leader's");
        tally.on_fast(0, t, 8);
        assert_eq!(tally.outcome(), None, "the leader's hash differs from the others'");
        tally.on_fast(0, t, 7);
        assert_eq!(tally.outcome(), Some((ShardPath::Fast, t)));

        // A leader's reply below its earlier one is a stale copy (it only moves later).
        let mut moved = ShardTally::new(3, 0);
        moved.on_fast(0, Timestamp(120), 7);
        moved.on_fast(0, t, 7);
        moved.on_fast(1, t, 7);
        moved.on_fast(2, t, 7);
        assert_eq!(moved.outcome(), None, "the leader is at 120");
        assert_eq!(moved.leader_ts(), Some(Timestamp(120)));

        let mut split = ShardTally::new(5, 0);
        split.on_fast(0, t, 7);
        split.on_fast(1, t, 7);
        split.on_fast(2, t, 7);
        split.on_fast(3, Timestamp(101), 7);
        assert_eq!(split.outcome(), None, "three of five match: below the super quorum of 4");
    }

    #[test]
    fn the_slow_path_needs_the_leaders_fast_reply_and_f_synced_followers() {
        let mut tally = ShardTally::new(3, 1);
        let t = Timestamp(100);
        tally.on_slow(0, t);
        assert_eq!(tally.outcome(), None, "no leader reply yet");
        tally.on_fast(1, t, 5);
        assert_eq!(tally.outcome(), Some((ShardPath::Slow, t)));
        let mut stale = ShardTally::new(3, 1);
        stale.on_fast(1, t, 5);
        stale.on_slow(2, Timestamp(90));
        stale.on_slow(1, t);
        assert_eq!(
            stale.outcome(),
            None,
            "a follower synced at another timestamp; the leader's own slow reply does not count"
        );
    }

    #[test]
    fn key_hashes_agree_on_the_same_entries_and_ignore_other_keys() {
        let mut a = KeyHashes::default();
        let mut b = KeyHashes::default();
        // The same two entries on key 1, in either order; b also has an entry on key 2.
        a.toggle(txn(1), Timestamp(10), &[key(1)]);
        a.toggle(txn(2), Timestamp(20), &[key(1)]);
        b.toggle(txn(2), Timestamp(20), &[key(1)]);
        b.toggle(txn(9), Timestamp(15), &[key(2)]);
        b.toggle(txn(1), Timestamp(10), &[key(1)]);
        assert_eq!(a.reply_hash(&[key(1)]), b.reply_hash(&[key(1)]));
        assert_ne!(a.reply_hash(&[key(1), key(2)]), b.reply_hash(&[key(1), key(2)]));
        // The same transaction at another timestamp is another log.
        let mut c = KeyHashes::default();
        c.toggle(txn(1), Timestamp(11), &[key(1)]);
        c.toggle(txn(2), Timestamp(20), &[key(1)]);
        assert_ne!(a.reply_hash(&[key(1)]), c.reply_hash(&[key(1)]));
        // Taking an entry out and putting it at its agreed timestamp converges.
        c.toggle(txn(1), Timestamp(11), &[key(1)]);
        c.toggle(txn(1), Timestamp(10), &[key(1)]);
        assert_eq!(a.reply_hash(&[key(1)]), c.reply_hash(&[key(1)]));
        b.toggle(txn(9), Timestamp(15), &[key(2)]);
        assert_eq!(b.len(), 1, "a key whose entries all left has no hash");
    }
}
