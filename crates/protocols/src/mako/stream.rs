//! A shard's replicated stream under `mako`: the state every replica of the shard derives from
//! the shard's Raft log, in the same order, with the same inputs.
//!
//! The leader proposes one entry per speculative commit, carrying the writes, the commit's
//! epoch and timestamp, the leader's watermark candidate and the global watermark it knows;
//! idle leaders propose ticks with the same two figures. Applying them:
//!
//! - a commit of the current, open epoch becomes **pending** (replicated, not yet durable);
//!   the shard's **watermark** becomes the largest candidate applied (every commit at or below
//!   it was proposed earlier, hence is applied by now);
//! - a global watermark makes the pending commits at or below it **durable**: their writes go
//!   into the store in timestamp order;
//! - `EpochEnd` freezes the epoch: its **final** is the watermark at that point of the log,
//!   which is at least anything a leader of this shard advertised (an advertised watermark is
//!   the candidate of an entry already applied); later commits of the epoch are refused;
//! - `EpochStart { stable }` makes the epoch's pending commits at or below the stable point
//!   durable, discards the rest, and opens the next epoch.
//!
//! Every input is checked (its epoch, the writes' count) before it changes anything: a stale
//! or malformed entry is counted and ignored, never a panic on every replica.

use super::watermark::EPOCHS_REMEMBERED;
use meridian_core::txn::Write;
use meridian_core::{Timestamp, TxnId};
use meridian_storage::{MvccStore, VersionState};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most writes one commit entry may carry on a shard.
pub const COMMIT_WRITES_MAX: usize = 4_096;

/// An entry of the stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum StreamEntry {
    /// A speculative commit.
    Commit {
        /// The attempt.
        txn: TxnId,
        /// The epoch it committed in.
        epoch: u64,
        /// Its commit timestamp.
        ts: Timestamp,
        /// Its writes on this shard.
        writes: Vec<Write>,
        /// The leader's watermark candidate when it proposed this entry.
        candidate: Timestamp,
        /// The global watermark the leader knew then.
        global: Timestamp,
    },
    /// The watermark figures of an idle leader.
    Tick {
        /// The epoch.
        epoch: u64,
        /// The leader's watermark candidate.
        candidate: Timestamp,
        /// The global watermark it knew.
        global: Timestamp,
    },
    /// The epoch closes here: its final watermark is the watermark at this point.
    EpochEnd {
        /// The epoch.
        epoch: u64,
    },
    /// The epoch closed at this stable point (the minimum of every shard's final).
    EpochStart {
        /// The epoch that closed.
        closed: u64,
        /// Its stable point.
        stable: Timestamp,
    },
}

/// Counters of what applying did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamCounts {
    /// Commits that became durable.
    pub durable: u64,
    /// Commits discarded by an epoch close.
    pub discarded: u64,
    /// Entries ignored: another epoch, a closed epoch, or malformed.
    pub refused: u64,
}

/// The replicated state of one shard's stream.
#[derive(Debug, Default)]
pub struct Stream {
    store: MvccStore,
    epoch: u64,
    closed: bool,
    watermark: Timestamp,
    global: Timestamp,
    pending: BTreeMap<(Timestamp, TxnId), Vec<Write>>,
    finals: BTreeMap<u64, Timestamp>,
    counts: StreamCounts,
}

impl Stream {
    /// An empty stream in epoch 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The durable store.
    pub fn store(&self) -> &MvccStore {
        &self.store
    }

    /// The durable store, writable (bulk loads).
    pub fn store_mut(&mut self) -> &mut MvccStore {
        &mut self.store
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// True once the current epoch's `EpochEnd` is applied.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The shard's watermark: what its leader may advertise.
    pub fn watermark(&self) -> Timestamp {
        self.watermark
    }

    /// This shard's final watermark of `epoch`, once closed here (the last
    /// [`EPOCHS_REMEMBERED`] epochs).
    pub fn final_of(&self, epoch: u64) -> Option<Timestamp> {
        self.finals.get(&epoch).copied()
    }

    /// Commits replicated and not yet durable.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// What applying did so far.
    pub fn counts(&self) -> StreamCounts {
        self.counts
    }

    /// Applies one entry. Returns false when it was ignored (counted).
    pub fn apply(&mut self, entry: StreamEntry) -> bool {
        match entry {
            StreamEntry::Commit { txn, epoch, ts, writes, candidate, global } => {
                if epoch != self.epoch || self.closed || writes.len() > COMMIT_WRITES_MAX {
                    self.counts.refused += 1;
                    return false;
                }
                if ts <= self.global {
                    // A commit at or below a global watermark already applied cannot exist
                    // (the watermark was below every prepared proposal): refuse, do not apply
                    // out of order.
                    self.counts.refused += 1;
                    return false;
                }
                self.pending.insert((ts, txn), writes);
                self.raise(candidate, global);
                true
            }
            StreamEntry::Tick { epoch, candidate, global } => {
                if epoch != self.epoch || self.closed {
                    self.counts.refused += 1;
                    return false;
                }
                self.raise(candidate, global);
                true
            }
            StreamEntry::EpochEnd { epoch } => {
                if epoch != self.epoch || self.closed {
                    self.counts.refused += 1;
                    return false;
                }
                self.close();
                true
            }
            StreamEntry::EpochStart { closed, stable } => {
                if closed != self.epoch {
                    self.counts.refused += 1;
                    return false;
                }
                if !self.closed {
                    self.close();
                }
                self.make_durable(stable);
                self.counts.discarded += self.pending.len() as u64;
                self.pending.clear();
                self.epoch += 1;
                self.closed = false;
                self.watermark = self.watermark.max(stable);
                self.global = stable;
                true
            }
        }
    }

    fn close(&mut self) {
        self.closed = true;
        self.finals.insert(self.epoch, self.watermark);
        while self.finals.len() > EPOCHS_REMEMBERED {
            self.finals.pop_first();
        }
    }

    fn raise(&mut self, candidate: Timestamp, global: Timestamp) {
        self.watermark = self.watermark.max(candidate);
        if global > self.global {
            self.global = global;
            self.make_durable(global);
        }
    }

    /// Moves the pending commits at or below `up_to` into the store, in timestamp order.
    fn make_durable(&mut self, up_to: Timestamp) {
        while let Some(entry) = self.pending.first_entry() {
            let (ts, txn) = *entry.key();
            if ts > up_to {
                break;
            }
            let writes = entry.remove();
            for write in writes {
                // A version already at this timestamp (a replayed entry) is left as it is.
                let _ = self.store.write(write.key, ts, write.value, txn, VersionState::Committed);
            }
            self.counts.durable += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::key::Key;
    use meridian_core::NodeId;

    fn txn(seq: u64) -> TxnId {
        TxnId { origin: NodeId(2), incarnation: 1, seq }
    }

    fn key(k: u64) -> Key {
        Key::table(1).u64(k).build()
    }

    fn commit(seq: u64, epoch: u64, ts: u64, candidate: u64, global: u64) -> StreamEntry {
        StreamEntry::Commit {
            txn: txn(seq),
            epoch,
            ts: Timestamp(ts),
            writes: vec![Write { key: key(1), value: Some(seq.to_be_bytes().to_vec()) }],
            candidate: Timestamp(candidate),
            global: Timestamp(global),
        }
    }

    fn value(stream: &Stream) -> Option<u64> {
        let version = stream.store().read_latest(&key(1))?;
        Some(u64::from_be_bytes(version.value.clone()?.try_into().ok()?))
    }

    #[test]
    fn commits_wait_for_the_global_watermark_and_land_in_timestamp_order() {
        let mut s = Stream::new();
        assert!(s.apply(commit(2, 0, 20, 15, 0)));
        assert!(s.apply(commit(1, 0, 10, 20, 0)));
        assert_eq!((s.pending_len(), s.watermark()), (2, Timestamp(20)));
        assert_eq!(value(&s), None, "nothing durable yet");
        assert!(s.apply(StreamEntry::Tick {
            epoch: 0,
            candidate: Timestamp(25),
            global: Timestamp(12)
        }));
        assert_eq!(value(&s), Some(1), "10 is durable, 20 is not");
        s.apply(StreamEntry::Tick { epoch: 0, candidate: Timestamp(25), global: Timestamp(20) });
        assert_eq!(value(&s), Some(2));
        assert_eq!(s.counts().durable, 2);
        assert!(!s.apply(commit(3, 0, 18, 30, 20)), "below a global watermark already applied");
    }

    #[test]
    fn an_epoch_close_keeps_the_stable_prefix_and_discards_the_rest() {
        let mut s = Stream::new();
        s.apply(commit(1, 0, 10, 10, 0));
        s.apply(commit(2, 0, 20, 20, 0));
        s.apply(commit(3, 0, 30, 25, 0));
        assert!(s.apply(StreamEntry::EpochEnd { epoch: 0 }));
        assert_eq!(s.final_of(0), Some(Timestamp(25)), "the watermark at the close");
        assert!(!s.apply(commit(4, 0, 40, 40, 0)), "no commit after the close");
        assert!(!s.apply(StreamEntry::EpochStart { closed: 1, stable: Timestamp(20) }));
        // Another shard's final was 20: the stable point.
        assert!(s.apply(StreamEntry::EpochStart { closed: 0, stable: Timestamp(20) }));
        assert_eq!(value(&s), Some(2));
        assert_eq!(s.counts(), StreamCounts { durable: 2, discarded: 1, refused: 2 });
        assert_eq!((s.epoch(), s.pending_len()), (1, 0));
        assert!(!s.apply(commit(5, 0, 50, 50, 0)), "the old epoch stays closed");
        assert!(s.apply(commit(5, 1, 50, 50, 20)));
    }

    #[test]
    fn a_start_without_its_end_closes_at_the_watermark_and_oversized_commits_are_refused() {
        let mut s = Stream::new();
        s.apply(commit(1, 0, 10, 12, 0));
        assert!(s.apply(StreamEntry::EpochStart { closed: 0, stable: Timestamp(10) }));
        assert_eq!(s.final_of(0), Some(Timestamp(12)));
        let writes = vec![Write { key: key(1), value: None }; COMMIT_WRITES_MAX + 1];
        let huge = StreamEntry::Commit {
            txn: txn(9),
            epoch: 1,
            ts: Timestamp(99),
            writes,
            candidate: Timestamp(99),
            global: Timestamp(10),
        };
        assert!(!s.apply(huge));
        assert_eq!(s.pending_len(), 0);
    }
}
