//! Rebuilding a shard's log at a view change (Tiga §4, App. B), from the logs of `f + 1`
//! replicas of the shard (the new leader's included).
//!
//! 1. Copy the log of the replica with the largest sync-point, up to that sync-point: every
//!    entry there was confirmed by the old leader's log synchronisation, so it may have
//!    committed on the slow path.
//! 2. Add the later entries that appear, with the same timestamp, in at least `⌈f/2⌉ + 1` of
//!    the logs, in timestamp order. A transaction fast-committed on a super quorum of
//!    `1 + f + ⌈f/2⌉` replicas is in at least `⌈f/2⌉ + 1` of any `f + 1` logs, so none is lost;
//!    and no transaction can reach that count at two different timestamps.
//!
//! **Order is per key.** A leader's log is in timestamp order only among *conflicting*
//! entries (two that share a key one of them writes; see [`super::log`]): a transaction
//! bumped past its keys' last release lands in the log after entries on other keys with
//! larger timestamps. So a log is malformed only when two conflicting entries are out of
//! `(timestamp, id)` order, and an entry of step 2 is dropped only when an entry of the
//! synced prefix that conflicts with it lies above it: had the old leader logged it at that
//! timestamp, it would have come before that entry, inside the prefix, so it was never the
//! leader's at that timestamp and cannot have committed there. An entry below prefix entries
//! it does not conflict with is kept (the prefix's last timestamp says nothing about it).
//! Entries added in step 2 follow the prefix in `(timestamp, id)` order, which keeps every
//! conflicting pair in order (each is above every prefix entry it conflicts with).
//!
//! Re-running leader agreement for the entries of step 2 (they may be multi-shard) is the
//! caller's part. Not called yet: the view change that will call it is not built.

use meridian_core::key::Key;
use meridian_core::{Timestamp, TxnId};
use std::collections::{BTreeMap, BTreeSet};

/// One entry of a replica's log as it reports it: the transaction, its timestamp there, and
/// the keys of its part on this shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportedEntry {
    /// Its timestamp in this log.
    pub ts: Timestamp,
    /// The transaction.
    pub txn: TxnId,
    /// Keys it reads here.
    pub reads: Vec<Key>,
    /// Keys it writes here.
    pub writes: Vec<Key>,
}

impl ReportedEntry {
    fn order(&self) -> (Timestamp, TxnId) {
        (self.ts, self.txn)
    }
}

/// One replica's log as it reports it at a view change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportedLog {
    /// Entries in log order (conflicting ones in timestamp order).
    pub entries: Vec<ReportedEntry>,
    /// How many of the first entries match the old leader's log.
    pub sync_point: usize,
}

/// Why logs could not be merged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryError {
    /// Fewer than `f + 1` logs.
    TooFew { have: usize, need: usize },
    /// A log's sync-point lies past its end, or two of its conflicting entries are out of
    /// timestamp order.
    Malformed(usize),
}

/// Per key, the largest `(timestamp, id)` among the entries seen that write it and among
/// those that read it.
#[derive(Default)]
struct KeyMarks {
    written: BTreeMap<Key, (Timestamp, TxnId)>,
    read: BTreeMap<Key, (Timestamp, TxnId)>,
}

impl KeyMarks {
    /// True when an entry seen conflicts with `entry` and lies at or above it.
    fn above(&self, entry: &ReportedEntry) -> bool {
        let at = entry.order();
        let over = |map: &BTreeMap<Key, (Timestamp, TxnId)>, key: &Key| {
            map.get(key).is_some_and(|&mark| mark >= at)
        };
        entry.writes.iter().any(|k| over(&self.written, k) || over(&self.read, k))
            || entry.reads.iter().any(|k| over(&self.written, k))
    }

    fn note(&mut self, entry: &ReportedEntry) {
        let at = entry.order();
        for (map, keys) in [(&mut self.written, &entry.writes), (&mut self.read, &entry.reads)] {
            for key in keys {
                let mark = map.entry(key.clone()).or_insert(at);
                *mark = (*mark).max(at);
            }
        }
    }
}

/// True when every pair of conflicting entries of `entries` is in `(timestamp, id)` order.
fn ordered_per_key(entries: &[ReportedEntry]) -> bool {
    let mut marks = KeyMarks::default();
    for entry in entries {
        if marks.above(entry) {
            return false;
        }
        marks.note(entry);
    }
    true
}

/// Merges the logs of at least `f + 1` replicas of a shard of `2f + 1` into the new log.
pub fn rebuild_log(
    replicas: u32,
    logs: &[ReportedLog],
) -> Result<Vec<ReportedEntry>, RecoveryError> {
    let f = (replicas.max(1) as usize - 1) / 2;
    if logs.len() < f + 1 {
        return Err(RecoveryError::TooFew { have: logs.len(), need: f + 1 });
    }
    for (i, log) in logs.iter().enumerate() {
        if log.sync_point > log.entries.len() || !ordered_per_key(&log.entries) {
            return Err(RecoveryError::Malformed(i));
        }
    }
    let base = logs.iter().max_by_key(|l| l.sync_point).expect("at least one log");
    let mut rebuilt: Vec<ReportedEntry> = base.entries[..base.sync_point].to_vec();
    let mut present: BTreeSet<TxnId> = rebuilt.iter().map(|e| e.txn).collect();
    let mut prefix = KeyMarks::default();
    for entry in &rebuilt {
        prefix.note(entry);
    }

    // Every entry of any log, beyond what was copied, counted once per log, with its keys as
    // the first log naming it at that timestamp reports them.
    let mut counts: BTreeMap<(Timestamp, TxnId), (usize, &ReportedEntry)> = BTreeMap::new();
    for log in logs {
        let distinct: BTreeMap<(Timestamp, TxnId), &ReportedEntry> =
            log.entries.iter().map(|e| (e.order(), e)).collect();
        for (at, entry) in distinct {
            if !present.contains(&at.1) {
                counts.entry(at).or_insert((0, entry)).0 += 1;
            }
        }
    }
    let threshold = f.div_ceil(2) + 1;
    // In (timestamp, id) order, so the entries added keep conflicting pairs in order.
    for ((_, txn), (count, entry)) in counts {
        if count >= threshold && !prefix.above(entry) && present.insert(txn) {
            rebuilt.push(entry.clone());
        }
    }
    Ok(rebuilt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::NodeId;

    fn t(seq: u64) -> TxnId {
        TxnId { origin: NodeId(1), incarnation: 1, seq }
    }

    fn key(id: u64) -> Key {
        Key::table(1).u64(id).build()
    }

    /// An entry at `ts` of transaction `seq` writing key `k`.
    fn w(ts: u64, seq: u64, k: u64) -> ReportedEntry {
        ReportedEntry { ts: Timestamp(ts), txn: t(seq), reads: Vec::new(), writes: vec![key(k)] }
    }

    /// An entry at `ts` of transaction `seq` reading key `k`.
    fn r(ts: u64, seq: u64, k: u64) -> ReportedEntry {
        ReportedEntry { ts: Timestamp(ts), txn: t(seq), reads: vec![key(k)], writes: Vec::new() }
    }

    fn log(entries: &[ReportedEntry], sync_point: usize) -> ReportedLog {
        ReportedLog { entries: entries.to_vec(), sync_point }
    }

    fn seqs(rebuilt: &[ReportedEntry]) -> Vec<u64> {
        rebuilt.iter().map(|e| e.txn.seq).collect()
    }

    #[test]
    fn the_synced_prefix_is_copied_and_later_entries_need_a_majority_of_a_super_quorum() {
        // f = 2 (five replicas), three logs; the threshold is ⌈2/2⌉ + 1 = 2. One key.
        let logs = [
            log(&[w(10, 1, 0), w(20, 2, 0), w(30, 3, 0), w(40, 4, 0)], 2),
            log(&[w(10, 1, 0), w(20, 2, 0), w(30, 3, 0), w(50, 5, 0)], 1),
            log(&[w(10, 1, 0), w(35, 6, 0), w(50, 5, 0)], 1),
        ];
        let rebuilt = rebuild_log(5, &logs).unwrap();
        // 1 and 2 synced; 3 in two logs; 5 in two; 4 and 6 in one each.
        assert_eq!(seqs(&rebuilt), vec![1, 2, 3, 5]);
    }

    #[test]
    fn an_entry_below_a_conflicting_synced_entry_is_not_added_after_it() {
        // f = 1: two followers hold 9 at 15, which the leader bumped to 25 and synced.
        let logs = [
            log(&[w(10, 1, 0), w(25, 9, 0)], 2),
            log(&[w(10, 1, 0), w(15, 9, 0)], 1),
            log(&[w(15, 9, 0)], 0),
        ];
        let rebuilt = rebuild_log(3, &logs).unwrap();
        assert_eq!(rebuilt, vec![w(10, 1, 0), w(25, 9, 0)]);
        let behind = [log(&[w(10, 1, 0), w(20, 2, 0)], 2), log(&[w(15, 9, 0)], 0), log(&[], 0)];
        let behind = [behind[0].clone(), behind[1].clone(), behind[1].clone()];
        let rebuilt = rebuild_log(3, &behind).unwrap();
        assert_eq!(seqs(&rebuilt), vec![1, 2], "9 at 15 sits below the synced 20 on its key");
    }

    /// The gap the timestamp-wide rule had: the leader logged 2 (key 1, at 20) after 1 (key 0,
    /// at 50), since they do not conflict; two followers hold 2 at 20 and nothing in the
    /// prefix conflicts with it, so 2 (maybe fast-committed) is kept. A reader of key 0 at 30
    /// is below 1's write there and is dropped.
    #[test]
    fn an_entry_below_synced_entries_on_other_keys_is_kept() {
        let later = log(&[w(20, 2, 1), r(30, 3, 0)], 0);
        let logs = [log(&[w(50, 1, 0)], 1), later.clone(), later];
        let rebuilt = rebuild_log(3, &logs).unwrap();
        assert_eq!(seqs(&rebuilt), vec![1, 2]);
        // Readers do not conflict with readers: a read of key 0 below a synced read is kept.
        let reads = [log(&[r(50, 1, 0)], 1), log(&[r(50, 1, 0), r(30, 3, 0)], 1)];
        let reads = [reads[0].clone(), reads[1].clone(), log(&[r(30, 3, 0)], 0)];
        assert_eq!(seqs(&rebuild_log(3, &reads).unwrap()), vec![1, 3]);
    }

    #[test]
    fn a_transaction_at_two_timestamps_counts_per_timestamp() {
        // f = 1: threshold 2 of 2 logs.
        let logs = [log(&[w(10, 1, 0), w(30, 7, 1)], 1), log(&[w(10, 1, 0), w(25, 7, 1)], 1)];
        let rebuilt = rebuild_log(3, &logs).unwrap();
        assert_eq!(rebuilt, vec![w(10, 1, 0)], "7 agreed on no timestamp");
    }

    #[test]
    fn too_few_or_malformed_logs_are_errors() {
        assert_eq!(
            rebuild_log(5, &[log(&[], 0), log(&[], 0)]),
            Err(RecoveryError::TooFew { have: 2, need: 3 })
        );
        assert_eq!(
            rebuild_log(3, &[log(&[w(1, 1, 0)], 2), log(&[], 0)]),
            Err(RecoveryError::Malformed(0))
        );
        // Conflicting entries out of order (a write below a read of its key) are malformed;
        // entries on different keys out of timestamp order are not.
        assert_eq!(
            rebuild_log(3, &[log(&[], 0), log(&[r(5, 1, 0), w(4, 2, 0)], 0)]),
            Err(RecoveryError::Malformed(1))
        );
        assert!(rebuild_log(3, &[log(&[], 0), log(&[w(5, 1, 0), w(4, 2, 1)], 0)]).is_ok());
    }
}
