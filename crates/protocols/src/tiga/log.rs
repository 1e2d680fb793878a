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
//! only what the leader has not listed yet (it may still come; once the leader's promise
//! says its log will never list an entry at its timestamp, [`FollowerLog::drop_unlisted`]
//! drops it).
//!
//! The **sync-point** is the length of the prefix whose bodies the follower holds; each entry
//! passing it earns the coordinator a slow reply. The **commit-point** is the largest position
//! that `f + 1` replicas (the leader counted, at its log's length) have synced: entries below
//! it survive any view change, so followers execute up to it and may checkpoint there.
//!
//! Bounded: a sync message carries at most [`SYNC_ENTRIES_MAX`] entries; the tail holds at most
//! `tail_max` transactions (a follower that releases more than that without hearing from its
//! leader stops replying fast and waits; the caller decides).
//!
//! **Positions count from a base.** A follower drops the synced entries it executed
//! ([`FollowerLog::truncate`]); positions stay absolute. Whether a dropped transaction is in
//! the log is still known while it may be asked about again: a transaction leaves the set of
//! logged ones only once the caller says nothing can bring it here again (its coordinator
//! decided it), and until then it *lingers* there.

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
    /// The position of `prefix[0]`: entries below it were executed and dropped.
    base: usize,
    prefix: Vec<(TxnId, Timestamp)>,
    /// Every transaction of the prefix, and dropped ones that linger.
    in_prefix: BTreeSet<TxnId>,
    /// Dropped entries' transactions still in `in_prefix` (their coordinators may ask again).
    lingering: BTreeSet<TxnId>,
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
            base: 0,
            prefix: Vec::new(),
            in_prefix: BTreeSet::new(),
            lingering: BTreeSet::new(),
            tail: BTreeMap::new(),
            missing: BTreeSet::new(),
            sync_point: 0,
            tail_max,
        }
    }

    /// A log whose synced prefix is `prefix` from position `base` on, with no body missing
    /// and an empty tail: a follower that rejoined by a state transfer, which brought the
    /// state those entries (and the ones below `base`) produced. `lingering`: transactions
    /// below `base` still to be known as logged. `None` when a transaction is listed twice.
    pub fn with_prefix(
        base: usize,
        prefix: Vec<(TxnId, Timestamp)>,
        lingering: Vec<TxnId>,
        tail_max: usize,
    ) -> Option<Self> {
        let lingering: BTreeSet<TxnId> = lingering.into_iter().collect();
        let mut in_prefix = lingering.clone();
        in_prefix.extend(prefix.iter().map(|&(txn, _)| txn));
        if in_prefix.len() != prefix.len() + lingering.len() {
            return None;
        }
        let sync_point = base + prefix.len();
        Some(Self {
            base,
            prefix,
            in_prefix,
            lingering,
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

    /// The prefix's length (entries dropped below the base included).
    pub fn len(&self) -> usize {
        self.base + self.prefix.len()
    }

    /// True when the prefix holds nothing, dropped or not.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The position of the first entry still held.
    pub fn base(&self) -> usize {
        self.base
    }

    /// The entries from position `from` (at least the base) to the prefix's end.
    pub fn since(&self, from: usize) -> &[(TxnId, Timestamp)] {
        let start = from.clamp(self.base, self.len()) - self.base;
        &self.prefix[start..]
    }

    /// The entry at `position`, if it is held.
    pub fn entry(&self, position: usize) -> Option<(TxnId, Timestamp)> {
        position.checked_sub(self.base).and_then(|i| self.prefix.get(i)).copied()
    }

    /// Drops the entries below `upto` (at most the sync-point). A dropped transaction stays
    /// known as logged (lingers) unless `forgotten` says nothing can bring it here again.
    /// Returns how many entries were dropped.
    pub fn truncate(&mut self, upto: usize, forgotten: impl Fn(TxnId) -> bool) -> usize {
        let upto = upto.min(self.sync_point);
        if upto <= self.base {
            return 0;
        }
        let dropped = upto - self.base;
        // Bounded by the entries dropped.
        for (txn, _) in self.prefix.drain(..dropped) {
            if forgotten(txn) {
                self.in_prefix.remove(&txn);
            } else {
                self.lingering.insert(txn);
            }
        }
        self.base = upto;
        dropped
    }

    /// Forgets the lingering transactions `forgotten` says nothing can bring here again.
    pub fn forget_lingering(&mut self, forgotten: impl Fn(TxnId) -> bool) {
        let gone: Vec<TxnId> = self.lingering.iter().copied().filter(|&t| forgotten(t)).collect();
        for txn in gone {
            self.lingering.remove(&txn);
            self.in_prefix.remove(&txn);
        }
    }

    /// The transactions dropped below the base that still count as logged.
    pub fn lingering_txns(&self) -> impl Iterator<Item = TxnId> + '_ {
        self.lingering.iter().copied()
    }

    /// The timestamp `txn` was released at here, if it sits in the tail.
    pub fn tail_ts(&self, txn: TxnId) -> Option<Timestamp> {
        self.tail.get(&txn).copied()
    }

    /// Dropped transactions still known as logged.
    pub fn lingering(&self) -> usize {
        self.lingering.len()
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

    /// Drops from the tail every transaction released here at or below `listed_through`: the
    /// caller knows that the leader's log lists, inside this replica's prefix already, every
    /// entry it will ever hold at or below that timestamp, so these are not in it there
    /// (a coordinator's copy the leader never received; the leader may still take one later,
    /// above, and then the log lists it). Returns what was dropped.
    pub fn drop_unlisted(&mut self, listed_through: Timestamp) -> Vec<(TxnId, Timestamp)> {
        let mut dropped = Vec::new();
        // Bounded by the tail (`tail_max`).
        self.tail.retain(|&txn, &mut ts| {
            let unlisted = ts <= listed_through;
            if unlisted {
                dropped.push((txn, ts));
            }
            !unlisted
        });
        dropped
    }

    /// Takes `txn` out of the tail (an entry the leader's log will not hold at its
    /// timestamp); returns that timestamp, or `None` when it is not in the tail.
    pub fn unrelease(&mut self, txn: TxnId) -> Option<Timestamp> {
        self.tail.remove(&txn)
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
        if from > self.len() {
            synced.resend_from = Some(self.len());
            return synced;
        }
        let already = self.len() - from;
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
        while let Some((txn, _)) = self.entry(self.sync_point) {
            if self.missing.contains(&txn) {
                break;
            }
            self.sync_point += 1;
        }
        self.prefix[start - self.base..self.sync_point - self.base].to_vec()
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
    fn the_tail_drops_what_the_leader_listed_through_without_it() {
        let mut log = FollowerLog::new(8);
        for (seq, ts) in [(1, 10), (2, 20), (3, 30)] {
            assert!(log.release(t(seq), Timestamp(ts)));
        }
        log.on_sync(0, &[e(2, 25)], |_| true);
        assert_eq!(log.tail_len(), 2, "2 left the tail: the leader listed it (retimed)");
        assert_eq!(log.drop_unlisted(Timestamp(9)), vec![], "nothing that low");
        assert_eq!(log.drop_unlisted(Timestamp(10)), vec![e(1, 10)], "at the bound, dropped");
        assert_eq!(log.tail_len(), 1);
        assert!(!log.contains(t(1)), "dropped: not logged here");
        assert!(log.release(t(1), Timestamp(40)), "released again later, it is taken");
        assert_eq!(log.drop_unlisted(Timestamp(35)), vec![e(3, 30)]);
        assert_eq!(log.tail_len(), 1, "the one above the bound stays");
        assert_eq!(log.len(), 1, "the prefix is untouched");
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
    fn dropped_entries_keep_their_positions_and_undecided_ones_stay_known() {
        let mut log = FollowerLog::new(16);
        log.on_sync(0, &[e(1, 10), e(2, 20), e(3, 30), e(4, 40)], |txn| txn != t(4));
        assert_eq!(log.sync_point(), 3);
        // Only up to the sync-point; 2's coordinator has not decided it.
        assert_eq!(log.truncate(9, |txn| txn != t(2)), 3);
        assert_eq!((log.base(), log.len(), log.sync_point()), (3, 4, 3));
        assert_eq!(log.entry(2), None, "dropped");
        assert_eq!(log.entry(3), Some(e(4, 40)));
        assert_eq!(log.since(0), &[e(4, 40)]);
        assert!(!log.contains(t(1)) && log.contains(t(2)), "2 lingers");
        assert_eq!(log.lingering(), 1);
        assert!(!log.release(t(2), Timestamp(25)), "a resend of 2 finds it logged");
        // A repeated sync from below the base changes nothing; one past the end asks again.
        assert_eq!(log.on_sync(1, &[e(2, 20), e(3, 30), e(4, 40)], |_| true), Synced::default());
        assert_eq!(log.on_sync(9, &[e(9, 90)], |_| true).resend_from, Some(4));
        assert_eq!(log.on_body(t(4)), vec![e(4, 40)]);
        assert_eq!(log.truncate(2, |_| true), 0, "never back");
        log.forget_lingering(|_| true);
        assert!(!log.contains(t(2)) && log.lingering() == 0);
        // A log that starts at a base, with what lingers below it.
        let log = FollowerLog::with_prefix(5, vec![e(6, 60)], vec![t(2)], 16).unwrap();
        assert_eq!((log.base(), log.len(), log.sync_point()), (5, 6, 6));
        assert!(log.contains(t(2)) && log.contains(t(6)));
        assert!(FollowerLog::with_prefix(5, vec![e(6, 60)], vec![t(6)], 16).is_none());
    }

    #[test]
    fn the_commit_point_is_what_f_plus_one_replicas_synced() {
        assert_eq!(commit_point(&[10, 7, 3], 3), 7, "f = 1: the second largest");
        assert_eq!(commit_point(&[10, 7, 3, 9, 1], 5), 7, "f = 2: the third largest");
        assert_eq!(commit_point(&[10], 3), 0, "one replica known of the two needed");
        assert_eq!(commit_point(&[4], 1), 4, "an unreplicated shard");
    }
}
