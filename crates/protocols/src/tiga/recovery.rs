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
//! Re-running leader agreement for the entries of step 2 (they may be multi-shard) is the
//! caller's part.
//!
//! **Known gap, for the view change that will call it:** it takes each log to be in
//! timestamp order, and a leader's log is in timestamp order only among conflicting entries
//! (see [`super::log`]): a real log can be refused as malformed, and "below the synced
//! prefix" must become a per-key notion before this merge is used.

use meridian_core::{Timestamp, TxnId};
use std::collections::{BTreeMap, BTreeSet};

/// One replica's log as it reports it at a view change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportedLog {
    /// Entries in log order (timestamp order).
    pub entries: Vec<(Timestamp, TxnId)>,
    /// How many of the first entries match the old leader's log.
    pub sync_point: usize,
}

/// Why logs could not be merged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryError {
    /// Fewer than `f + 1` logs.
    TooFew { have: usize, need: usize },
    /// A log's sync-point lies past its end, or its entries are out of timestamp order.
    Malformed(usize),
}

/// Merges the logs of at least `f + 1` replicas of a shard of `2f + 1` into the new log.
pub fn rebuild_log(
    replicas: u32,
    logs: &[ReportedLog],
) -> Result<Vec<(Timestamp, TxnId)>, RecoveryError> {
    let f = (replicas.max(1) as usize - 1) / 2;
    if logs.len() < f + 1 {
        return Err(RecoveryError::TooFew { have: logs.len(), need: f + 1 });
    }
    for (i, log) in logs.iter().enumerate() {
        let ordered = log.entries.windows(2).all(|w| w[0] < w[1]);
        if log.sync_point > log.entries.len() || !ordered {
            return Err(RecoveryError::Malformed(i));
        }
    }
    let base = logs.iter().max_by_key(|l| l.sync_point).expect("at least one log");
    let mut rebuilt: Vec<(Timestamp, TxnId)> = base.entries[..base.sync_point].to_vec();
    let mut present: BTreeSet<TxnId> = rebuilt.iter().map(|&(_, txn)| txn).collect();
    let last = rebuilt.last().map(|&(ts, _)| ts);

    // Every entry of any log, beyond what was copied, counted once per log.
    let mut counts: BTreeMap<(Timestamp, TxnId), usize> = BTreeMap::new();
    for log in logs {
        let distinct: BTreeSet<(Timestamp, TxnId)> = log.entries.iter().copied().collect();
        for entry in distinct {
            if !present.contains(&entry.1) {
                *counts.entry(entry).or_default() += 1;
            }
        }
    }
    let threshold = f.div_ceil(2) + 1;
    // An entry below the end of the synced prefix and not in it never committed: a
    // fast-committed one was in the old leader's log at that timestamp, so log
    // synchronisation put it in the prefix. (Followers may hold such an entry at a timestamp
    // the leader bumped.)
    for ((ts, txn), count) in counts {
        if count >= threshold && last.is_none_or(|l| ts > l) && present.insert(txn) {
            rebuilt.push((ts, txn));
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

    fn log(entries: &[(u64, u64)], sync_point: usize) -> ReportedLog {
        ReportedLog {
            entries: entries.iter().map(|&(ts, s)| (Timestamp(ts), t(s))).collect(),
            sync_point,
        }
    }

    #[test]
    fn the_synced_prefix_is_copied_and_later_entries_need_a_majority_of_a_super_quorum() {
        // f = 2 (five replicas), three logs; the threshold is ⌈2/2⌉ + 1 = 2.
        let logs = [
            log(&[(10, 1), (20, 2), (30, 3), (40, 4)], 2),
            log(&[(10, 1), (20, 2), (30, 3), (50, 5)], 1),
            log(&[(10, 1), (35, 6), (50, 5)], 1),
        ];
        let rebuilt = rebuild_log(5, &logs).unwrap();
        let seqs: Vec<u64> = rebuilt.iter().map(|(_, txn)| txn.seq).collect();
        // 1 and 2 synced; 3 in two logs; 5 in two; 4 and 6 in one each.
        assert_eq!(seqs, vec![1, 2, 3, 5]);
    }

    #[test]
    fn an_entry_below_the_synced_prefix_is_not_added_after_it() {
        // f = 1: two followers hold 9 at 15, which the leader bumped to 25 and synced.
        let logs = [log(&[(10, 1), (25, 9)], 2), log(&[(10, 1), (15, 9)], 1), log(&[(15, 9)], 0)];
        let rebuilt = rebuild_log(3, &logs).unwrap();
        assert_eq!(rebuilt, vec![(Timestamp(10), t(1)), (Timestamp(25), t(9))]);
        let behind = [log(&[(10, 1), (20, 2)], 2), log(&[(15, 9)], 0), log(&[(15, 9)], 0)];
        let rebuilt = rebuild_log(3, &behind).unwrap();
        assert_eq!(rebuilt.len(), 2, "9 at 15 sits below the synced 20: it never committed");
    }

    #[test]
    fn a_transaction_at_two_timestamps_counts_per_timestamp() {
        // f = 1: threshold 2 of 2 logs.
        let logs = [log(&[(10, 1), (30, 7)], 1), log(&[(10, 1), (25, 7)], 1)];
        let rebuilt = rebuild_log(3, &logs).unwrap();
        assert_eq!(rebuilt, vec![(Timestamp(10), t(1))], "7 agreed on no timestamp");
    }

    #[test]
    fn too_few_or_malformed_logs_are_errors() {
        assert_eq!(
            rebuild_log(5, &[log(&[], 0), log(&[], 0)]),
            Err(RecoveryError::TooFew { have: 2, need: 3 })
        );
        assert_eq!(
            rebuild_log(3, &[log(&[(1, 1)], 2), log(&[], 0)]),
            Err(RecoveryError::Malformed(0))
        );
        assert_eq!(
            rebuild_log(3, &[log(&[], 0), log(&[(5, 1), (4, 2)], 0)]),
            Err(RecoveryError::Malformed(1))
        );
    }
}
