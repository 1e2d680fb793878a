//! Which released transactions a leader may execute now (Tiga §3: a leader executes
//! transactions in timestamp order among conflicting ones).
//!
//! A released transaction runs once no earlier (timestamp, id) transaction that writes one of
//! its keys is unfinished (queued, or executed and waiting for other shards' votes), and, if
//! it writes a key, no earlier transaction at the same timestamp still has to read that key (a
//! read sees versions at its own timestamp). Every wait points to an earlier transaction, so
//! waits cannot form a cycle.
//!
//! The sets are kept across calls and updated per event, so a leader checks only the
//! transactions an event may have unblocked (its *candidates*), in (timestamp, id) order,
//! instead of rescanning everything waiting: under a hot key thousands wait, and a rescan per
//! message made execution quadratic.

use meridian_core::key::Key;
use meridian_core::{Timestamp, TxnId};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

/// A transaction's place in the order.
pub type At = (Timestamp, TxnId);

/// The unfinished writers and waiting readers of every key, and the candidates to check.
#[derive(Debug, Default)]
pub struct Waits {
    /// Per key, the unfinished transactions that write it (queued, or executed and waiting).
    writers: BTreeMap<Key, BTreeSet<At>>,
    /// Per key, the queued transactions that read it.
    readers: BTreeMap<Key, BTreeSet<At>>,
    /// Queued transactions an event may have unblocked.
    candidates: BTreeSet<At>,
}

impl Waits {
    /// A released transaction reading `reads` and writing `writes` queues; it is a candidate.
    pub fn enqueue(&mut self, at: At, reads: &[Key], writes: &[Key]) {
        for key in writes {
            self.writers.entry(key.clone()).or_default().insert(at);
        }
        for key in reads {
            self.readers.entry(key.clone()).or_default().insert(at);
        }
        self.candidates.insert(at);
    }

    /// Makes `at` a candidate again (something it waited for besides keys came in).
    pub fn wake(&mut self, at: At) {
        self.candidates.insert(at);
    }

    /// The next candidate in (timestamp, id) order.
    pub fn next_candidate(&mut self) -> Option<At> {
        self.candidates.pop_first()
    }

    /// The earliest queued transaction that reads `key` (it reads below newer versions).
    pub fn first_reader(&self, key: &Key) -> Option<At> {
        self.readers.get(key).and_then(|set| set.first().copied())
    }

    /// True while candidates remain.
    pub fn has_candidates(&self) -> bool {
        !self.candidates.is_empty()
    }

    /// True when `at` must still wait for another transaction on one of its keys.
    pub fn blocked(&self, at: At, reads: &[Key], writes: &[Key]) -> bool {
        let earlier_writer = |key: &Key| {
            self.writers.get(key).and_then(|set| set.first()).is_some_and(|&first| first < at)
        };
        // The latest reader before `at` is at `at`'s timestamp: it has not read yet.
        let earlier_reader_same_ts = |key: &Key| {
            self.readers
                .get(key)
                .and_then(|set| set.range(..at).next_back())
                .is_some_and(|&(ts, _)| ts == at.0)
        };
        reads.iter().chain(writes).any(earlier_writer) || writes.iter().any(earlier_reader_same_ts)
    }

    /// `at` executed: its reads are done. The first writer of each key it read becomes a
    /// candidate (it may have waited for this read at its timestamp).
    pub fn ran(&mut self, at: At, reads: &[Key]) {
        for key in reads {
            if let Some(set) = self.readers.get_mut(key) {
                set.remove(&at);
                if set.is_empty() {
                    self.readers.remove(key);
                }
            }
            if let Some(&first) = self.writers.get(key).and_then(|set| set.first()) {
                if first != at {
                    self.candidates.insert(first);
                }
            }
        }
    }

    /// `at`'s writes were applied or dropped: the next writer of each key and the readers
    /// before it become candidates.
    pub fn finished(&mut self, at: At, writes: &[Key]) {
        for key in writes {
            let Some(set) = self.writers.get_mut(key) else { continue };
            set.remove(&at);
            let next = set.first().copied();
            if set.is_empty() {
                self.writers.remove(key);
            }
            if let Some(next) = next {
                self.candidates.insert(next);
            }
            // Bounded by the readers this write held back (those after it, before the next
            // writer; earlier readers never waited for it), each woken once for it.
            let after = (Bound::Excluded(at), Bound::Unbounded);
            for &reader in self.readers.get(key).into_iter().flat_map(|set| set.range(after)) {
                if next.is_some_and(|next| reader >= next) {
                    break;
                }
                self.candidates.insert(reader);
            }
        }
    }

    /// `at` leaves without its writes (a detective leader revoked what it ran there): as
    /// [`Waits::ran`] and [`Waits::finished`], and it is no candidate any more.
    pub fn withdraw(&mut self, at: At, reads: &[Key], writes: &[Key]) {
        self.ran(at, reads);
        self.finished(at, writes);
        self.candidates.remove(&at);
    }

    /// Keys with a waiting writer or reader (for the counters).
    pub fn keys_waited_on(&self) -> usize {
        self.writers.len() + self.readers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::NodeId;

    fn at(ts: u64, seq: u64) -> At {
        (Timestamp(ts), TxnId { origin: NodeId(0), incarnation: 0, seq })
    }

    fn key(k: u8) -> Key {
        Key::table(1).u64(u64::from(k)).build()
    }

    fn drain(waits: &mut Waits) -> Vec<At> {
        std::iter::from_fn(|| waits.next_candidate()).collect()
    }

    #[test]
    fn a_later_transaction_waits_for_an_earlier_writer_of_its_keys_until_it_finishes() {
        let mut w = Waits::default();
        let (a, b, c) = (at(10, 1), at(20, 2), at(30, 3));
        w.enqueue(a, &[], &[key(1)]);
        w.enqueue(b, &[key(1)], &[]);
        w.enqueue(c, &[key(2)], &[key(2)]);
        assert_eq!(drain(&mut w), [a, b, c]);
        assert!(!w.blocked(a, &[], &[key(1)]));
        assert!(w.blocked(b, &[key(1)], &[]), "reads a key an earlier transaction writes");
        assert!(!w.blocked(c, &[key(2)], &[key(2)]), "another key");
        w.ran(a, &[]);
        assert!(w.blocked(b, &[key(1)], &[]), "executed, its writes wait for votes");
        w.finished(a, &[key(1)]);
        assert_eq!(drain(&mut w), [b], "the reader it held back");
        assert!(!w.blocked(b, &[key(1)], &[]));
        // An earlier transaction is never blocked by a later writer.
        w.enqueue(at(40, 4), &[], &[key(3)]);
        assert!(!w.blocked(at(5, 5), &[key(3)], &[]));
    }

    #[test]
    fn a_writer_waits_for_an_earlier_reader_at_its_own_timestamp_only() {
        let mut w = Waits::default();
        let (reader, writer, later) = (at(10, 1), at(10, 2), at(20, 3));
        w.enqueue(reader, &[key(1)], &[]);
        w.enqueue(writer, &[], &[key(1)]);
        assert!(w.blocked(writer, &[], &[key(1)]), "the reader at 10 would see its version");
        assert!(!w.blocked(reader, &[key(1)], &[]));
        drain(&mut w);
        w.ran(reader, &[key(1)]);
        assert_eq!(drain(&mut w), [writer], "woken by the read");
        assert!(!w.blocked(writer, &[], &[key(1)]));
        // A reader at an earlier timestamp does not hold a writer back.
        w.enqueue(at(15, 4), &[key(2)], &[]);
        assert!(!w.blocked(later, &[], &[key(2)]));
    }

    /// A writer never held back an earlier reader, so its finish does not wake one (a hot
    /// key's early readers waiting on something else would be re-checked per write).
    #[test]
    fn finishing_does_not_wake_readers_earlier_than_the_writer() {
        let mut w = Waits::default();
        let (early_reader, writer, late_reader) = (at(5, 1), at(10, 2), at(20, 3));
        w.enqueue(early_reader, &[key(1)], &[]);
        w.enqueue(writer, &[], &[key(1)]);
        w.enqueue(late_reader, &[key(1)], &[]);
        drain(&mut w);
        w.ran(writer, &[]);
        w.finished(writer, &[key(1)]);
        assert_eq!(drain(&mut w), [late_reader]);
    }

    #[test]
    fn finishing_wakes_the_next_writer_and_the_readers_before_it_only() {
        let mut w = Waits::default();
        let ats: Vec<At> = (1..=5).map(|i| at(i * 10, i)).collect();
        w.enqueue(ats[0], &[], &[key(1)]);
        w.enqueue(ats[1], &[key(1)], &[]);
        w.enqueue(ats[2], &[], &[key(1)]);
        w.enqueue(ats[3], &[key(1)], &[]);
        drain(&mut w);
        w.ran(ats[0], &[]);
        w.finished(ats[0], &[key(1)]);
        assert_eq!(drain(&mut w), [ats[1], ats[2]], "the reader before the next writer, and it");
        assert!(!w.blocked(ats[2], &[], &[key(1)]), "a reader at another timestamp");
        assert!(w.blocked(ats[3], &[key(1)], &[]));
        assert!(w.keys_waited_on() > 0);
        w.ran(ats[1], &[key(1)]);
        assert_eq!(drain(&mut w), [ats[2]], "the first writer, after a read of its key");
        w.ran(ats[2], &[]);
        w.finished(ats[2], &[key(1)]);
        assert_eq!(drain(&mut w), [ats[3]]);
        w.ran(ats[3], &[key(1)]);
        assert_eq!(w.keys_waited_on(), 0, "nothing left behind");
    }
}
