//! A Tiga replica's log and its synchronisation with the leader's (Tiga §3.7, App. E).
//!
//! The leader appends transactions in the order it releases them, at the agreed timestamps:
//! in timestamp order among conflicting ones, but not overall (a transaction from a
//! coordinator whose clock is behind, touching keys nothing released above it, is released
//! at its own timestamp after later ones), and sends followers its entries: position,
//! transaction, timestamp. A follower's log is the **synced prefix**, which equals the
//! leader's log entry for entry, and an **unsynced tail** of transactions it released on its
//! own and the leader has not yet listed. Synchronisation extends the prefix with the leader's entries: an entry the
//! follower released at another timestamp takes the leader's (*retimed*), one it never
//! received is fetched (the follower needs the body to execute it later), and the tail keeps
//! only what the leader has not listed yet (it may still come, or be dropped by a later view
//! change).
//!
//! The **sync-point** is the length of the prefix whose bodies the follower holds; each entry
//! passing it earns the coordinator a slow reply. The **commit-point** is the largest position
//! that `f + 1` replicas (the leader counted, at its log's length) have synced: entries below
//! it survive any view change, so followers execute up to it and may checkpoint there.
//!
//! Bounded: a sync message carries at most [`SYNC_ENTRIES_MAX`] entries; the tail holds at most
//! `tail_max` transactions (a follower that releases more than that without hearing from its
//! leader stops replying fast and waits; the caller decides).

use meridian_core::{Timestamp, TxnId};
use std::collections::{BTreeMap, BTreeSet};

/// Most entries one synchronisation message carries.
pub const SYNC_ENTRIES_MAX: usize = 4_096;

/// What a synchronisation message did to a follower's log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Synced {
    /// Entries that joined the synced prefix and whose bodies are here: slow replies to send.
    pub newly_synced: Vec<(TxnId, Timestamp)>,
    /// Entries released here at another timestamp: the leader's timestamp replaced it.
    pub retimed: Vec<(TxnId, Timestamp, Timestamp)>,
    /// Entries whose bodies this replica lacks: fetch them.
    pub fetch: Vec<TxnId>,
    /// The message started past the prefix's end: ask the leader again from here.
    pub resend_from: Option<usize>,
}

/// A follower's view of the shard's log.
#[derive(Clone, Debug)]
pub struct FollowerLog {
    prefix: Vec<(TxnId, Timestamp)>,
    in_prefix: BTreeSet<TxnId>,
    tail: BTreeMap<TxnId, Timestamp>,
    /// Prefix entries whose bodies are missing.
    missing: BTreeSet<TxnId>,
    sync_point: usize,
    tail_max: usize,
}

impl FollowerLog {
    /// An empty log whose unsynced tail holds at most `tail_max` transactions.
    pub fn new(tail_max: usize) -> Self {
        Self {
            prefix: Vec::new(),
            in_prefix: BTreeSet::new(),
            tail: BTreeMap::new(),
            missing: BTreeSet::new(),
            sync_point: 0,
            tail_max,
        }
    }

    /// A log whose synced prefix is `prefix`, with no body missing and an empty tail: a
    /// follower that rejoined by a state transfer, which brought the state those entries
    /// produced. `None` when the prefix lists a transaction twice.
    pub fn with_prefix(prefix: Vec<(TxnId, Timestamp)>, tail_max: usize) -> Option<Self> {
        let in_prefix: BTreeSet<TxnId> = prefix.iter().map(|&(txn, _)| txn).collect();
        if in_prefix.len() != prefix.len() {
            return None;
        }
        let sync_point = prefix.len();
        Some(Self {
            prefix,
            in_prefix,
            tail: BTreeMap::new(),
            missing: BTreeSet::new(),
            sync_point,
            tail_max,
        })
    }

    /// The synced prefix's length with every body here.
    pub fn sync_point(&self) -> usize {
        self.sync_point
    }

    /// The synced prefix.
    pub fn prefix(&self) -> &[(TxnId, Timestamp)] {
        &self.prefix
    }

    /// True when `txn` is in this log (released here or listed by the leader).
    pub fn contains(&self, txn: TxnId) -> bool {
        self.in_prefix.contains(&txn) || self.tail.contains_key(&txn)
    }

    /// Prefix entries whose bodies are still missing (fetches may be lost: ask again).
    pub fn missing(&self) -> impl Iterator<Item = TxnId> + '_ {
        self.missing.iter().copied()
    }

    /// Transactions released here that the leader has not listed yet.
    pub fn tail_len(&self) -> usize {
        self.tail.len()
    }

    /// This replica released `txn` at `ts` on its own. False when the tail is full (nothing
    /// changed) or the transaction is already logged.
    pub fn release(&mut self, txn: TxnId, ts: Timestamp) -> bool {
        if self.in_prefix.contains(&txn) || self.tail.contains_key(&txn) {
            return false;
        }
        if self.tail.len() >= self.tail_max {
            return false;
        }
        self.tail.insert(txn, ts);
        true
    }

    /// The leader's entries from position `from` on. `has_body`: whether this replica holds
    /// the transaction's body (it received the transaction).
    pub fn on_sync(
        &mut self,
        from: usize,
        entries: &[(TxnId, Timestamp)],
        has_body: impl Fn(TxnId) -> bool,
    ) -> Synced {
        let mut synced = Synced::default();
        if from > self.prefix.len() {
            synced.resend_from = Some(self.prefix.len());
            return synced;
        }
        let already = self.prefix.len() - from;
        for &(txn, ts) in entries.iter().take(SYNC_ENTRIES_MAX).skip(already) {
            if !self.in_prefix.insert(txn) {
                continue; // A leader lists a transaction once; a duplicate is ignored.
            }
            if let Some(own) = self.tail.remove(&txn) {
                if own != ts {
                    synced.retimed.push((txn, own, ts));
                }
            }
            if !has_body(txn) {
                self.missing.insert(txn);
                synced.fetch.push(txn);
            }
            self.prefix.push((txn, ts));
        }
        synced.newly_synced = self.advance_sync_point();
        synced
    }

    /// The body of a fetched transaction arrived. Returns the entries that joined the synced
    /// part (slow replies to send).
    pub fn on_body(&mut self, txn: TxnId) -> Vec<(TxnId, Timestamp)> {
        if !self.missing.remove(&txn) {
            return Vec::new();
        }
        self.advance_sync_point()
    }

    fn advance_sync_point(&mut self) -> Vec<(TxnId, Timestamp)> {
        let start = self.sync_point;
        while let Some(&(txn, _)) = self.prefix.get(self.sync_point) {
            if self.missing.contains(&txn) {
                break;
            }
            self.sync_point += 1;
        }
        self.prefix[start..self.sync_point].to_vec()
    }
}

/// The commit-point: the largest position that `f + 1` of the shard's replicas have synced,
/// given every replica's sync-point (the leader's is its log's length). Zero when fewer than
/// `f + 1` are known.
pub fn commit_point(sync_points: &[usize], replicas: u32) -> usize {
    let f = (replicas.max(1) as usize - 1) / 2;
    let mut sorted = sync_points.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    sorted.get(f).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::NodeId;

    fn t(seq: u64) -> TxnId {
        TxnId { origin: NodeId(1), incarnation: 1, seq }
    }

    fn e(seq: u64, ts: u64) -> (TxnId, Timestamp) {
        (t(seq), Timestamp(ts))
    }

    #[test]
    fn sync_extends_the_prefix_retimes_and_keeps_the_unlisted_tail() {
        let mut log = FollowerLog::new(16);
        assert!(log.release(t(1), Timestamp(10)));
        assert!(log.release(t(2), Timestamp(20)));
        assert!(log.release(t(3), Timestamp(30)));
        // The leader released 2 at 25 (it bumped it) and has not released 3 yet.
        let synced = log.on_sync(0, &[e(1, 10), e(2, 25)], |_| true);
        assert_eq!(synced.newly_synced, vec![e(1, 10), e(2, 25)]);
        assert_eq!(synced.retimed, vec![(t(2), Timestamp(20), Timestamp(25))]);
        assert_eq!(log.sync_point(), 2);
        assert_eq!(log.tail_len(), 1, "3 waits for the leader");
        // A repeated message changes nothing; an overlapping one adds only what is new.
        assert_eq!(log.on_sync(0, &[e(1, 10), e(2, 25)], |_| true), Synced::default());
        let synced = log.on_sync(1, &[e(2, 25), e(3, 30)], |_| true);
        assert_eq!(synced.newly_synced, vec![e(3, 30)]);
        assert_eq!(log.tail_len(), 0);
        assert!(!log.release(t(3), Timestamp(30)), "already logged");
    }

    #[test]
    fn a_missing_body_holds_the_sync_point_until_fetched() {
        let mut log = FollowerLog::new(16);
        let synced = log.on_sync(0, &[e(1, 10), e(2, 20), e(3, 30)], |txn| txn != t(2));
        assert_eq!(synced.fetch, vec![t(2)]);
        assert_eq!(synced.newly_synced, vec![e(1, 10)]);
        assert_eq!(log.sync_point(), 1);
        assert_eq!(log.on_body(t(2)), vec![e(2, 20), e(3, 30)]);
        assert_eq!(log.sync_point(), 3);
        assert!(log.on_body(t(2)).is_empty(), "a second copy changes nothing");
    }

    #[test]
    fn a_gap_asks_for_a_resend_and_the_tail_is_bounded() {
        let mut log = FollowerLog::new(1);
        let synced = log.on_sync(2, &[e(3, 30)], |_| true);
        assert_eq!(synced.resend_from, Some(0));
        assert_eq!(log.sync_point(), 0);
        assert!(log.release(t(1), Timestamp(10)));
        assert!(!log.release(t(2), Timestamp(20)), "the tail is full");
    }

    #[test]
    fn the_commit_point_is_what_f_plus_one_replicas_synced() {
        assert_eq!(commit_point(&[10, 7, 3], 3), 7, "f = 1: the second largest");
        assert_eq!(commit_point(&[10, 7, 3, 9, 1], 5), 7, "f = 2: the third largest");
        assert_eq!(commit_point(&[10], 3), 0, "one replica known of the two needed");
        assert_eq!(commit_point(&[4], 1), 4, "an unreplicated shard");
    }
}
