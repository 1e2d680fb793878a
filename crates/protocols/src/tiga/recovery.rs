//! Rebuilding a shard's log at a view change (Tiga §4, App. B), from the logs of `f + 1`
//! replicas of the shard (the new leader's included).
//!
//! 1. Take the synced prefix as far as any replica synced it: every entry there was confirmed
//!    by the old leader's log synchronisation, so it may have committed on the slow path.
//!    Synced prefixes are prefixes of one log (the old leader's), so the reports agree
//!    position by position; each starts at its replica's base (what it dropped below, every
//!    follower had executed), and together they must cover the positions the new leader
//!    lacks.
//! 2. Add the later entries that appear, with the same timestamp, in at least `⌈f/2⌉ + 1` of
//!    the logs, in timestamp order. A transaction fast-committed on a super quorum of
//!    `1 + f + ⌈f/2⌉` replicas is in at least `⌈f/2⌉ + 1` of any `f + 1` logs, so none is lost;
//!    and no transaction can reach that count at two different timestamps.
//!
//! **Order is per key.** A leader's log is in timestamp order only among *conflicting*
//! entries (two that share a key one of them writes; see [`super::log`]): a transaction
//! bumped past its keys' last release lands in the log after entries on other keys with
//! larger timestamps. An entry of step 2 can have committed at its timestamp only if no
//! synced entry that conflicts with it lies above it (had the old leader logged it there, it
//! would have come before that entry, inside the prefix), so such an entry is dropped. A
//! follower keeps its reported entries consistent with its own synced prefix as it goes
//! (an entry joining the prefix supersedes the conflicting tail entries below it, and
//! nothing is held or released below a conflicting synced entry: [`super::replica`]), so
//! here only the prefix past the sync-points of an entry's reporters needs checking, and
//! its keys must be known there ([`RecoveryError::KeysUnknown`] otherwise). Entries added
//! in step 2 follow the prefix in `(timestamp, id)` order, which keeps every conflicting pair
//! in order.
//!
//! Re-running leader agreement for the entries of step 2 (they may be multi-shard) is the
//! caller's part. Not called yet: the view change that will call it is not built.

use meridian_core::key::Key;
use meridian_core::{Timestamp, TxnId};
use std::collections::{BTreeMap, BTreeSet};

/// The keys an entry's part reads, and those it writes.
pub type EntryKeys = (Vec<Key>, Vec<Key>);

/// One entry of a replica's log as it reports it: the transaction, its timestamp there, and
/// the keys of its part on this shard, when the replica holds them (a synced entry taken by
/// a state transfer comes without its body).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportedEntry {
    /// Its timestamp in this log.
    pub ts: Timestamp,
    /// The transaction.
    pub txn: TxnId,
    /// Keys it reads and keys it writes here, if known.
    pub keys: Option<EntryKeys>,
}

impl ReportedEntry {
    fn order(&self) -> (Timestamp, TxnId) {
        (self.ts, self.txn)
    }
}

/// One replica's log as it reports it at a view change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportedLog {
    /// The position of `synced[0]` (the replica dropped the entries below it).
    pub base: usize,
    /// The synced prefix from `base` to the replica's sync-point.
    pub synced: Vec<ReportedEntry>,
    /// The entries it vouched for past its sync-point: those its leader listed (in log
    /// order), then those it released itself (in timestamp order). Keys known.
    pub unsynced: Vec<ReportedEntry>,
}

impl ReportedLog {
    fn sync_point(&self) -> usize {
        self.base + self.synced.len()
    }
}

/// The new log: the synced prefix from the position asked for, then the entries added.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rebuilt {
    /// The prefix's entries from the position asked for to the largest sync-point.
    pub prefix: Vec<ReportedEntry>,
    /// The entries of step 2, in `(timestamp, id)` order.
    pub added: Vec<ReportedEntry>,
}

/// Why logs could not be merged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryError {
    /// Fewer than `f + 1` logs.
    TooFew { have: usize, need: usize },
    /// A log disagrees with another on a synced position, lists a transaction twice, or
    /// holds two conflicting entries out of timestamp order.
    Malformed(usize),
    /// No log holds the synced entry at this position (every one dropped it, or none
    /// reached it), which the new log needs.
    Gap(usize),
    /// The synced entry at this position must be checked against an entry to add, and no
    /// log knows its keys.
    KeysUnknown(usize),
}

/// Per key, the largest `(timestamp, id)` among the entries seen that write it and among
/// those that read it.
#[derive(Default)]
struct KeyMarks {
    written: BTreeMap<Key, (Timestamp, TxnId)>,
    read: BTreeMap<Key, (Timestamp, TxnId)>,
}

impl KeyMarks {
    /// True when an entry seen conflicts with one at `at` on `keys` and lies at or above it.
    fn above(&self, at: (Timestamp, TxnId), (reads, writes): &EntryKeys) -> bool {
        let over = |map: &BTreeMap<Key, (Timestamp, TxnId)>, key: &Key| {
            map.get(key).is_some_and(|&mark| mark >= at)
        };
        writes.iter().any(|k| over(&self.written, k) || over(&self.read, k))
            || reads.iter().any(|k| over(&self.written, k))
    }

    fn note(&mut self, at: (Timestamp, TxnId), (reads, writes): &EntryKeys) {
        for (map, keys) in [(&mut self.written, writes), (&mut self.read, reads)] {
            for key in keys {
                let mark = map.entry(key.clone()).or_insert(at);
                *mark = (*mark).max(at);
            }
        }
    }
}

/// True when every pair of conflicting entries of `entries` whose keys are known is in
/// `(timestamp, id)` order.
fn ordered_per_key<'a>(entries: impl Iterator<Item = &'a ReportedEntry>) -> bool {
    let mut marks = KeyMarks::default();
    for entry in entries {
        let Some(keys) = &entry.keys else { continue };
        if marks.above(entry.order(), keys) {
            return false;
        }
        marks.note(entry.order(), keys);
    }
    true
}

/// Merges the logs of at least `f + 1` replicas of a shard of `replicas` (`2f + 1`) into the
/// new log, whose prefix is wanted from position `from` on (what the new leader lacks).
pub fn rebuild_log(
    replicas: u32,
    logs: &[ReportedLog],
    from: usize,
) -> Result<Rebuilt, RecoveryError> {
    let f = (replicas.max(1) as usize - 1) / 2;
    if logs.len() < f + 1 {
        return Err(RecoveryError::TooFew { have: logs.len(), need: f + 1 });
    }
    // Step 1: the synced prefix, position by position.
    let mut prefix: BTreeMap<usize, &ReportedEntry> = BTreeMap::new();
    for (i, log) in logs.iter().enumerate() {
        if log.unsynced.iter().any(|e| e.keys.is_none())
            || !ordered_per_key(log.synced.iter().chain(&log.unsynced))
        {
            return Err(RecoveryError::Malformed(i));
        }
        for (position, entry) in (log.base..).zip(&log.synced) {
            let held = prefix.entry(position).or_insert(entry);
            if held.order() != entry.order() {
                return Err(RecoveryError::Malformed(i));
            }
            if held.keys.is_none() {
                *held = entry; // Another log may know its keys.
            }
        }
    }
    let end = logs.iter().map(ReportedLog::sync_point).max().expect("at least one log");
    // Wanted: what the new leader lacks, and what step 2 checks its entries against.
    let least = logs.iter().map(ReportedLog::sync_point).min().expect("at least one log");
    if let Some(gap) = (from.min(least)..end).find(|p| !prefix.contains_key(p)) {
        return Err(RecoveryError::Gap(gap));
    }
    let mut present: BTreeSet<TxnId> = BTreeSet::new();
    if !prefix.values().all(|e| present.insert(e.txn)) {
        let twice = logs.iter().position(|l| {
            let mut seen = BTreeSet::new();
            !l.synced.iter().all(|e| seen.insert(e.txn))
        });
        return Err(RecoveryError::Malformed(twice.unwrap_or(0)));
    }

    // Step 2: every entry of any log beyond the prefix, counted once per log at each
    // timestamp, with the logs that hold it there.
    let mut counts: BTreeMap<(Timestamp, TxnId), (Vec<usize>, &ReportedEntry)> = BTreeMap::new();
    for (i, log) in logs.iter().enumerate() {
        let distinct: BTreeMap<(Timestamp, TxnId), &ReportedEntry> =
            log.unsynced.iter().map(|e| (e.order(), e)).collect();
        for (at, entry) in distinct {
            if !present.contains(&at.1) {
                counts.entry(at).or_insert((Vec::new(), entry)).0.push(i);
            }
        }
    }
    // Per log, the prefix past its sync-point, which its own entries were not kept
    // consistent with: built when first needed (`None`: a key is unknown there).
    let mut past: BTreeMap<usize, Result<KeyMarks, usize>> = BTreeMap::new();
    let threshold = f.div_ceil(2) + 1;
    let mut added = Vec::new();
    // In (timestamp, id) order, so the entries added keep conflicting pairs in order.
    for (at, (holders, entry)) in counts {
        if holders.len() < threshold {
            continue;
        }
        let nearest = *holders.iter().max_by_key(|&&i| logs[i].sync_point()).expect("held");
        let marks = past.entry(nearest).or_insert_with(|| {
            let mut marks = KeyMarks::default();
            for (&position, e) in prefix.range(logs[nearest].sync_point()..) {
                marks.note(e.order(), e.keys.as_ref().ok_or(position)?);
            }
            Ok(marks)
        });
        let marks = marks.as_ref().map_err(|&position| RecoveryError::KeysUnknown(position))?;
        let keys = entry.keys.as_ref().expect("checked: unsynced entries carry keys");
        if !marks.above(at, keys) && present.insert(at.1) {
            added.push(entry.clone());
        }
    }
    let prefix = prefix.range(from..).map(|(_, e)| (*e).clone()).collect();
    Ok(Rebuilt { prefix, added })
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
        ReportedEntry { ts: Timestamp(ts), txn: t(seq), keys: Some((Vec::new(), vec![key(k)])) }
    }

    /// An entry at `ts` of transaction `seq` reading key `k`.
    fn r(ts: u64, seq: u64, k: u64) -> ReportedEntry {
        ReportedEntry { ts: Timestamp(ts), txn: t(seq), keys: Some((vec![key(k)], Vec::new())) }
    }

    /// A log from position 0 whose first `synced` entries are synced.
    fn log(entries: &[ReportedEntry], synced: usize) -> ReportedLog {
        ReportedLog {
            base: 0,
            synced: entries[..synced].to_vec(),
            unsynced: entries[synced..].to_vec(),
        }
    }

    fn seqs(entries: &[ReportedEntry]) -> Vec<u64> {
        entries.iter().map(|e| e.txn.seq).collect()
    }

    /// The whole rebuilt log from position 0.
    fn whole(replicas: u32, logs: &[ReportedLog]) -> Vec<u64> {
        let rebuilt = rebuild_log(replicas, logs, 0).unwrap();
        [seqs(&rebuilt.prefix), seqs(&rebuilt.added)].concat()
    }

    #[test]
    fn the_synced_prefix_is_copied_and_later_entries_need_a_majority_of_a_super_quorum() {
        // f = 2 (five replicas), three logs; the threshold is ⌈2/2⌉ + 1 = 2. One key.
        let logs = [
            log(&[w(10, 1, 0), w(20, 2, 0), w(30, 3, 0), w(40, 4, 0)], 2),
            log(&[w(10, 1, 0), w(20, 2, 0), w(30, 3, 0), w(50, 5, 0)], 1),
            log(&[w(10, 1, 0), w(35, 6, 0), w(50, 5, 0)], 1),
        ];
        // 1 and 2 synced; 3 in two logs; 5 in two; 4 and 6 in one each.
        assert_eq!(whole(5, &logs), vec![1, 2, 3, 5]);
    }

    #[test]
    fn an_entry_below_a_conflicting_synced_entry_is_not_added_after_it() {
        // f = 1: two followers hold 9 at 15, which the leader bumped to 25 and synced.
        let logs = [
            log(&[w(10, 1, 0), w(25, 9, 0)], 2),
            log(&[w(10, 1, 0), w(15, 9, 0)], 1),
            log(&[w(15, 9, 0)], 0),
        ];
        let rebuilt = rebuild_log(3, &logs, 0).unwrap();
        assert_eq!(rebuilt.prefix, vec![w(10, 1, 0), w(25, 9, 0)]);
        assert!(rebuilt.added.is_empty(), "9 is in the prefix already");
        let behind = [log(&[w(10, 1, 0), w(20, 2, 0)], 2), log(&[w(15, 9, 0)], 0)];
        let behind = [behind[0].clone(), behind[1].clone(), behind[1].clone()];
        assert_eq!(whole(3, &behind), vec![1, 2], "9 at 15 sits below the synced 20 on its key");
    }

    /// The gap the timestamp-wide rule had: the leader logged 2 (key 1, at 20) after 1 (key 0,
    /// at 50), since they do not conflict; two followers hold 2 at 20 and nothing in the
    /// prefix conflicts with it, so 2 (maybe fast-committed) is kept. A reader of key 0 at 30
    /// is below 1's write there and is dropped.
    #[test]
    fn an_entry_below_synced_entries_on_other_keys_is_kept() {
        let later = log(&[w(20, 2, 1), r(30, 3, 0)], 0);
        let logs = [log(&[w(50, 1, 0)], 1), later.clone(), later];
        assert_eq!(whole(3, &logs), vec![1, 2]);
        // Readers do not conflict with readers: a read of key 0 below a synced read is kept.
        let reads = [log(&[r(50, 1, 0)], 1), log(&[r(50, 1, 0), r(30, 3, 0)], 1)];
        let reads = [reads[0].clone(), reads[1].clone(), log(&[r(30, 3, 0)], 0)];
        assert_eq!(whole(3, &reads), vec![1, 3]);
    }

    #[test]
    fn a_transaction_at_two_timestamps_counts_per_timestamp() {
        // f = 1: threshold 2 of 2 logs.
        let logs = [log(&[w(10, 1, 0), w(30, 7, 1)], 1), log(&[w(10, 1, 0), w(25, 7, 1)], 1)];
        assert_eq!(whole(3, &logs), vec![1], "7 agreed on no timestamp");
    }

    /// Each replica dropped what every follower executed, from its own base; the prefix is
    /// pieced together by position, from where the new leader wants it. Only the prefix past
    /// the sync-points of an entry's reporters is checked against it, and there its keys
    /// must be known.
    #[test]
    fn prefixes_from_different_bases_are_pieced_together_by_position() {
        let at = |base: usize, synced: &[ReportedEntry], unsynced: &[ReportedEntry]| ReportedLog {
            base,
            synced: synced.to_vec(),
            unsynced: unsynced.to_vec(),
        };
        // Positions 3.. : 4 at 40, 5 at 50, 6 at 60 (keys 0, 1, 0).
        let ahead = at(4, &[w(50, 5, 1), w(60, 6, 0)], &[]);
        let behind = at(3, &[w(40, 4, 0)], &[w(55, 7, 2), r(45, 8, 0)]);
        let rebuilt = rebuild_log(3, &[ahead.clone(), behind.clone()], 3);
        // 7 and 8 are in one log of the two: not added.
        assert_eq!(seqs(&rebuilt.unwrap().prefix), vec![4, 5, 6]);
        let rebuilt = rebuild_log(3, &[ahead.clone(), behind.clone()], 5).unwrap();
        assert_eq!(seqs(&rebuilt.prefix), vec![6], "from where it is wanted");
        assert_eq!(rebuild_log(3, &[ahead.clone(), ahead.clone()], 3), Err(RecoveryError::Gap(3)));
        // A position two logs disagree on.
        let wrong = at(4, &[w(50, 9, 1)], &[]);
        assert_eq!(rebuild_log(3, &[ahead.clone(), wrong], 4), Err(RecoveryError::Malformed(1)));
        // f = 2: two of three logs hold 7 at 55 and 8 at 45; each is checked against the
        // prefix past the nearer sync-point (6 at 60, writing key 0): 7 (key 2) is kept, 8
        // (reading key 0 below 6) dropped.
        let both = at(4, &[w(50, 5, 1)], &[w(55, 7, 2), r(45, 8, 0)]);
        let behind = at(3, &[w(40, 4, 0), w(50, 5, 1)], &[w(55, 7, 2), r(45, 8, 0)]);
        let logs = [ahead.clone(), both.clone(), behind.clone()];
        let rebuilt = rebuild_log(5, &logs, 4).unwrap();
        assert_eq!((seqs(&rebuilt.prefix), seqs(&rebuilt.added)), (vec![5, 6], vec![7]));
        // Without 6's keys the check cannot be made.
        let keyless = at(4, &[w(50, 5, 1), ReportedEntry { keys: None, ..w(60, 6, 0) }], &[]);
        assert_eq!(
            rebuild_log(5, &[keyless.clone(), both.clone(), behind.clone()], 4),
            Err(RecoveryError::KeysUnknown(5))
        );
        // Unless a log reaching past it holds the entry itself (a log's own entries are kept
        // consistent with its own prefix): then nothing is left to check.
        let holder = at(4, &[w(50, 5, 1), ReportedEntry { keys: None, ..w(60, 6, 0) }], &[]);
        let holder = ReportedLog { unsynced: vec![w(55, 7, 2)], ..holder };
        let seven = at(4, &[w(50, 5, 1)], &[w(55, 7, 2)]);
        let rebuilt = rebuild_log(5, &[holder, seven.clone(), seven], 4).unwrap();
        assert_eq!(seqs(&rebuilt.added), vec![7]);
    }

    #[test]
    fn too_few_or_malformed_logs_are_errors() {
        assert_eq!(
            rebuild_log(5, &[log(&[], 0), log(&[], 0)], 0),
            Err(RecoveryError::TooFew { have: 2, need: 3 })
        );
        // Conflicting entries out of order (a write below a read of its key) are malformed;
        // entries on different keys out of timestamp order are not.
        assert_eq!(
            rebuild_log(3, &[log(&[], 0), log(&[r(5, 1, 0), w(4, 2, 0)], 0)], 0),
            Err(RecoveryError::Malformed(1))
        );
        assert!(rebuild_log(3, &[log(&[], 0), log(&[w(5, 1, 0), w(4, 2, 1)], 0)], 0).is_ok());
        // A synced transaction twice, or an unsynced entry without its keys.
        assert_eq!(
            rebuild_log(3, &[log(&[], 0), log(&[w(5, 1, 0), w(6, 1, 1)], 2)], 0),
            Err(RecoveryError::Malformed(1))
        );
        let keyless = ReportedEntry { keys: None, ..w(5, 1, 0) };
        assert_eq!(
            rebuild_log(3, &[log(&[keyless], 0), log(&[], 0)], 0),
            Err(RecoveryError::Malformed(0))
        );
    }
}
