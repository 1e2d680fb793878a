//! A lock table: shared and exclusive locks on keys, shared locks on key ranges (a scan's
//! phantom protection), and two conflict policies.
//!
//! - **No-wait**: a request that conflicts is denied at once; the caller aborts.
//! - **Wound-wait**: every transaction has a priority (smaller is older; equal priorities are
//!   ordered by transaction id, so the order is total and no two transactions tie). A request that
//!   conflicts with a younger holder *wounds* it (the caller must abort the holders named,
//!   which releases their locks) and waits; one that conflicts only with older holders waits.
//!   Waiters queue oldest first, so an older transaction never waits behind a younger one and
//!   no cycle of waits can form.
//!
//! `occ` takes its prepare locks all at once with [`LockTable::try_all`] (no-wait); 2PL takes
//! them one by one with [`LockTable::acquire`].
//!
//! Invariants (asserted in debug builds): a key has at most one exclusive holder, and never
//! an exclusive holder together with shared holders other than itself; every lock is listed
//! under its holder and the other way round.

use meridian_core::key::Key;
use meridian_core::txn::ScanRange;
use meridian_core::TxnId;
use std::collections::{BTreeMap, BTreeSet};

/// A lock's strength.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    /// Readers share it.
    Shared,
    /// One writer holds it alone.
    Exclusive,
}

/// What to do on a conflict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Deny at once.
    NoWait,
    /// Older transactions wound younger holders; younger ones wait.
    WoundWait,
}

/// The answer to a lock request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// Held now.
    Granted,
    /// Refused (no-wait): this transaction holds a conflicting lock.
    Denied(TxnId),
    /// Queued (wound-wait); the caller must abort the transactions in `wound` (younger
    /// holders), and will be granted the lock by a later [`LockTable::release_all`].
    Wait {
        /// Younger conflicting holders to abort.
        wound: Vec<TxnId>,
    },
}

/// A queued request that a release granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Granted {
    /// The waiting transaction.
    pub txn: TxnId,
    /// The key.
    pub key: Key,
    /// The mode it asked for.
    pub mode: Mode,
}

/// The largest transaction id: bounds range lookups by start key.
const TXN_LAST: TxnId =
    TxnId { origin: meridian_core::NodeId(u32::MAX), incarnation: u64::MAX, seq: u64::MAX };

#[derive(Clone, Debug, Default)]
struct KeyLock {
    exclusive: Option<TxnId>,
    shared: Vec<TxnId>,
    /// Waiting requests, oldest priority first.
    waiters: Vec<(u64, TxnId, Mode)>,
}

impl KeyLock {
    fn is_free(&self) -> bool {
        self.exclusive.is_none() && self.shared.is_empty() && self.waiters.is_empty()
    }

    /// The first holder `txn` in `mode` conflicts with (no allocation: the prepare path).
    fn first_conflict(&self, txn: TxnId, mode: Mode) -> Option<TxnId> {
        if let Some(w) = self.exclusive.filter(|&h| h != txn) {
            return Some(w);
        }
        match mode {
            Mode::Exclusive => self.shared.iter().copied().find(|&h| h != txn),
            Mode::Shared => None,
        }
    }

    /// The holders `txn` in `mode` conflicts with.
    fn conflicts(&self, txn: TxnId, mode: Mode) -> Vec<TxnId> {
        let mut with: Vec<TxnId> = self.exclusive.iter().copied().filter(|&h| h != txn).collect();
        if mode == Mode::Exclusive {
            with.extend(self.shared.iter().copied().filter(|&h| h != txn));
        }
        with
    }
}

#[derive(Clone, Debug, Default)]
struct Held {
    priority: u64,
    keys: BTreeSet<Key>,
    ranges: Vec<ScanRange>,
    /// The key it waits for, if any.
    waiting: Option<Key>,
}

/// Locks of one shard replica.
#[derive(Clone, Debug, Default)]
pub struct LockTable {
    keys: BTreeMap<Key, KeyLock>,
    /// Shared range locks: (start, holder) → end.
    ranges: BTreeMap<(Key, TxnId), Key>,
    held: BTreeMap<TxnId, Held>,
}

impl LockTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keys with a lock or a waiter.
    pub fn locked_keys(&self) -> usize {
        self.keys.len()
    }

    /// Transactions holding or waiting for a lock.
    pub fn holders(&self) -> usize {
        self.held.len()
    }

    /// True when `txn` holds or waits for any lock.
    pub fn holds_any(&self, txn: TxnId) -> bool {
        self.held.contains_key(&txn)
    }

    /// Range holders other than `txn` whose range contains `key`.
    fn range_conflicts(&self, txn: TxnId, key: &Key) -> Vec<TxnId> {
        if self.ranges.is_empty() {
            return Vec::new();
        }
        self.ranges
            .range(..=(key.clone(), TXN_LAST))
            .filter(|((start, holder), end)| *holder != txn && start <= key && key < *end)
            .map(|((_, holder), _)| *holder)
            .collect()
    }

    /// Exclusive holders other than `txn` of keys inside `range`.
    fn writers_in(&self, txn: TxnId, range: &ScanRange) -> Vec<TxnId> {
        if range.start >= range.end {
            return Vec::new();
        }
        self.keys
            .range(range.start.clone()..range.end.clone())
            .filter_map(|(_, lock)| lock.exclusive.filter(|&w| w != txn))
            .collect()
    }

    /// True when `txn` holds `key` in `mode` (or stronger).
    pub fn holds_key(&self, txn: TxnId, key: &Key, mode: Mode) -> bool {
        self.keys.get(key).is_some_and(|lock| {
            lock.exclusive == Some(txn) || (mode == Mode::Shared && lock.shared.contains(&txn))
        })
    }

    /// True when `txn` holds the keys of `reads` (shared or exclusive) and `writes` (exclusive).
    pub fn holds_all<'a>(
        &self,
        txn: TxnId,
        reads: impl IntoIterator<Item = &'a Key>,
        writes: impl IntoIterator<Item = &'a Key>,
    ) -> bool {
        reads.into_iter().all(|k| self.holds_key(txn, k, Mode::Shared))
            && writes.into_iter().all(|k| self.holds_key(txn, k, Mode::Exclusive))
    }

    /// Checks that `txn` could take shared locks on `reads` and `scans` and exclusive locks on
    /// `writes` now, without waiting; the first conflicting holder otherwise.
    pub fn check_all<'a>(
        &self,
        txn: TxnId,
        reads: impl IntoIterator<Item = &'a Key>,
        scans: &[ScanRange],
        writes: impl IntoIterator<Item = &'a Key> + Clone,
    ) -> Result<(), TxnId> {
        for key in reads {
            if let Some(h) = self.keys.get(key).and_then(|l| l.first_conflict(txn, Mode::Shared)) {
                return Err(h);
            }
        }
        for range in scans {
            if let Some(&h) = self.writers_in(txn, range).first() {
                return Err(h);
            }
        }
        for key in writes {
            if let Some(h) = self.keys.get(key).and_then(|l| l.first_conflict(txn, Mode::Exclusive))
            {
                return Err(h);
            }
            if !self.ranges.is_empty() {
                if let Some(&h) = self.range_conflicts(txn, key).first() {
                    return Err(h);
                }
            }
        }
        Ok(())
    }

    /// Takes all the locks at once if none conflicts (no-wait), or none of them.
    pub fn try_all(
        &mut self,
        txn: TxnId,
        reads: &[Key],
        scans: &[ScanRange],
        writes: &[Key],
    ) -> Result<(), TxnId> {
        self.check_all(txn, reads, scans, writes)?;
        for key in reads {
            self.grant(txn, 0, key.clone(), Mode::Shared);
        }
        for key in writes {
            self.grant(txn, 0, key.clone(), Mode::Exclusive);
        }
        for range in scans {
            self.grant_range(txn, 0, range);
        }
        self.debug_check();
        Ok(())
    }

    /// Asks for one lock under `policy`; `priority` orders transactions for wound-wait
    /// (smaller is older; the same value for every request of one transaction).
    pub fn acquire(
        &mut self,
        txn: TxnId,
        priority: u64,
        key: &Key,
        mode: Mode,
        policy: Policy,
    ) -> Acquire {
        assert!(
            self.held.get(&txn).is_none_or(|h| h.waiting.is_none()),
            "{txn} asks for a lock while waiting for another"
        );
        let mut with = self.keys.get(key).map(|l| l.conflicts(txn, mode)).unwrap_or_default();
        if mode == Mode::Exclusive {
            with.extend(self.range_conflicts(txn, key));
        }
        // Waiters ahead of it (older) also keep it waiting, so it never overtakes them.
        let queued_older = self
            .keys
            .get(key)
            .is_some_and(|l| l.waiters.iter().any(|&(p, w, _)| (p, w) < (priority, txn)));
        if with.is_empty() && !queued_older {
            self.grant(txn, priority, key.clone(), mode);
            self.debug_check();
            return Acquire::Granted;
        }
        match policy {
            Policy::NoWait => Acquire::Denied(with.first().copied().unwrap_or(txn)),
            Policy::WoundWait => {
                with.sort_unstable();
                with.dedup();
                let wound =
                    with.into_iter().filter(|&h| self.is_younger(h, priority, txn)).collect();
                let lock = self.keys.entry(key.clone()).or_default();
                let at = lock.waiters.partition_point(|&(p, w, _)| (p, w) <= (priority, txn));
                lock.waiters.insert(at, (priority, txn, mode));
                let held = self.held.entry(txn).or_default();
                held.priority = priority;
                held.waiting = Some(key.clone());
                Acquire::Wait { wound }
            }
        }
    }

    /// Takes a shared lock on `range` under `policy` (no waiting queue for ranges: a
    /// wound-wait request wounds younger writers in the range and is otherwise denied).
    pub fn acquire_range(
        &mut self,
        txn: TxnId,
        priority: u64,
        range: &ScanRange,
        policy: Policy,
    ) -> Acquire {
        let writers = self.writers_in(txn, range);
        if writers.is_empty() {
            self.grant_range(txn, priority, range);
            return Acquire::Granted;
        }
        match policy {
            Policy::WoundWait => {
                let wound: Vec<TxnId> =
                    writers.into_iter().filter(|&h| self.is_younger(h, priority, txn)).collect();
                if wound.is_empty() {
                    Acquire::Denied(self.writers_in(txn, range)[0])
                } else {
                    Acquire::Wait { wound }
                }
            }
            Policy::NoWait => Acquire::Denied(writers[0]),
        }
    }

    /// True when holder `h` is younger than `txn` of `priority`: (priority, id) is larger.
    fn is_younger(&self, h: TxnId, priority: u64, txn: TxnId) -> bool {
        self.held.get(&h).is_some_and(|held| (held.priority, h) > (priority, txn))
    }

    fn grant(&mut self, txn: TxnId, priority: u64, key: Key, mode: Mode) {
        let lock = self.keys.entry(key.clone()).or_default();
        match mode {
            Mode::Shared => {
                if lock.exclusive != Some(txn) && !lock.shared.contains(&txn) {
                    lock.shared.push(txn);
                }
            }
            Mode::Exclusive => {
                lock.shared.retain(|&s| s != txn); // An upgrade.
                lock.exclusive = Some(txn);
            }
        }
        let held = self.held.entry(txn).or_default();
        held.priority = priority;
        held.keys.insert(key);
    }

    fn grant_range(&mut self, txn: TxnId, priority: u64, range: &ScanRange) {
        if range.start >= range.end {
            return;
        }
        self.ranges.insert((range.start.clone(), txn), range.end.clone());
        let held = self.held.entry(txn).or_default();
        held.priority = priority;
        held.ranges.push(range.clone());
    }

    /// Releases everything `txn` holds and withdraws what it waits for; returns the waiting
    /// requests this grants, in the order granted.
    pub fn release_all(&mut self, txn: TxnId) -> Vec<Granted> {
        let Some(held) = self.held.remove(&txn) else { return Vec::new() };
        for range in &held.ranges {
            self.ranges.remove(&(range.start.clone(), txn));
        }
        let mut touched: Vec<Key> = held.keys.into_iter().collect();
        if let Some(key) = held.waiting {
            if let Some(lock) = self.keys.get_mut(&key) {
                lock.waiters.retain(|&(_, w, _)| w != txn);
            }
            touched.push(key);
        }
        let mut granted = Vec::new();
        for key in touched {
            let Some(lock) = self.keys.get_mut(&key) else { continue };
            if lock.exclusive == Some(txn) {
                lock.exclusive = None;
            }
            lock.shared.retain(|&s| s != txn);
            // Grant waiters from the front while they fit.
            while let Some(&(priority, waiter, mode)) = lock.waiters.first() {
                if lock.first_conflict(waiter, mode).is_some() {
                    break;
                }
                lock.waiters.remove(0);
                match mode {
                    Mode::Shared => {
                        if !lock.shared.contains(&waiter) {
                            lock.shared.push(waiter)
                        }
                    }
                    Mode::Exclusive => {
                        lock.shared.retain(|&s| s != waiter);
                        lock.exclusive = Some(waiter);
                    }
                }
                let held = self.held.entry(waiter).or_default();
                held.priority = priority;
                held.waiting = None;
                held.keys.insert(key.clone());
                granted.push(Granted { txn: waiter, key: key.clone(), mode });
            }
            if lock.is_free() {
                self.keys.remove(&key);
            }
        }
        // A range writer conflict is not queued: waiters on keys only.
        self.debug_check();
        granted
    }

    fn debug_check(&self) {
        if cfg!(debug_assertions) && self.keys.len() < 4_096 {
            for (key, lock) in &self.keys {
                if let Some(w) = lock.exclusive {
                    assert!(lock.shared.iter().all(|&s| s == w), "{key:?}: writer and readers");
                    assert!(self.held.get(&w).is_some_and(|h| h.keys.contains(key)));
                }
                for s in &lock.shared {
                    assert!(self.held.get(s).is_some_and(|h| h.keys.contains(key)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::NodeId;

    fn t(seq: u64) -> TxnId {
        TxnId { origin: NodeId(0), incarnation: 0, seq }
    }

    fn k(id: u64) -> Key {
        Key::table(1).u64(id).build()
    }

    fn range(a: u64, b: u64) -> ScanRange {
        ScanRange { start: k(a), end: k(b), limit: 100, reverse: false }
    }

    #[test]
    fn no_wait_shares_reads_and_denies_conflicts() {
        let mut locks = LockTable::new();
        assert_eq!(locks.acquire(t(1), 1, &k(1), Mode::Shared, Policy::NoWait), Acquire::Granted);
        assert_eq!(locks.acquire(t(2), 2, &k(1), Mode::Shared, Policy::NoWait), Acquire::Granted);
        assert_eq!(
            locks.acquire(t(3), 3, &k(1), Mode::Exclusive, Policy::NoWait),
            Acquire::Denied(t(1))
        );
        // An upgrade needs every other reader gone.
        assert_eq!(
            locks.acquire(t(1), 1, &k(1), Mode::Exclusive, Policy::NoWait),
            Acquire::Denied(t(2))
        );
        assert!(locks.release_all(t(2)).is_empty());
        assert_eq!(
            locks.acquire(t(1), 1, &k(1), Mode::Exclusive, Policy::NoWait),
            Acquire::Granted
        );
        assert_eq!(
            locks.acquire(t(2), 2, &k(1), Mode::Shared, Policy::NoWait),
            Acquire::Denied(t(1))
        );
        locks.release_all(t(1));
        assert_eq!(locks.locked_keys(), 0);
        assert_eq!(locks.holders(), 0);
    }

    #[test]
    fn try_all_is_all_or_nothing_and_ranges_guard_phantoms() {
        let mut locks = LockTable::new();
        locks.try_all(t(1), &[k(1)], &[range(10, 20)], &[k(2)]).unwrap();
        assert_eq!(locks.try_all(t(2), &[k(3)], &[], &[k(1)]), Err(t(1)), "reader holds k1");
        assert_eq!(locks.locked_keys(), 2, "nothing of the refused attempt was taken");
        assert_eq!(
            locks.try_all(t(2), &[], &[], &[k(15)]),
            Err(t(1)),
            "a write into a scanned range"
        );
        assert_eq!(locks.try_all(t(2), &[], &[range(0, 5)], &[]), Err(t(1)), "a scan over a write");
        locks.try_all(t(2), &[k(1)], &[range(30, 40)], &[k(25)]).unwrap();
        locks.release_all(t(1));
        locks.try_all(t(3), &[], &[], &[k(15)]).unwrap();
        locks.release_all(t(2));
        locks.release_all(t(3));
        assert_eq!((locks.locked_keys(), locks.holders()), (0, 0));
    }

    #[test]
    fn wound_wait_wounds_younger_holders_and_queues_oldest_first() {
        let mut locks = LockTable::new();
        let (old, mid, young) = (t(1), t(2), t(3));
        assert_eq!(
            locks.acquire(mid, 20, &k(1), Mode::Exclusive, Policy::WoundWait),
            Acquire::Granted
        );
        // Younger waits; older wounds the younger holder and waits for it to abort.
        assert_eq!(
            locks.acquire(young, 30, &k(1), Mode::Exclusive, Policy::WoundWait),
            Acquire::Wait { wound: vec![] }
        );
        assert_eq!(
            locks.acquire(old, 10, &k(1), Mode::Shared, Policy::WoundWait),
            Acquire::Wait { wound: vec![mid] }
        );
        // The wounded holder aborts: the oldest waiter gets the lock first, not the earlier one.
        let granted = locks.release_all(mid);
        assert_eq!(granted, vec![Granted { txn: old, key: k(1), mode: Mode::Shared }]);
        let granted = locks.release_all(old);
        assert_eq!(granted, vec![Granted { txn: young, key: k(1), mode: Mode::Exclusive }]);
        // A withdrawn waiter leaves no trace.
        assert_eq!(
            locks.acquire(mid, 20, &k(1), Mode::Shared, Policy::WoundWait),
            Acquire::Wait { wound: vec![young] }
        );
        assert!(locks.release_all(mid).is_empty());
        locks.release_all(young);
        assert_eq!((locks.locked_keys(), locks.holders()), (0, 0));
    }

    #[test]
    fn wound_wait_never_lets_an_older_transaction_wait_behind_a_younger_waiter() {
        // Deadlock-prone schedule: two transactions lock one key each, then want the other's.
        let mut locks = LockTable::new();
        let (old, young) = (t(1), t(2));
        assert_eq!(
            locks.acquire(old, 1, &k(1), Mode::Exclusive, Policy::WoundWait),
            Acquire::Granted
        );
        assert_eq!(
            locks.acquire(young, 2, &k(2), Mode::Exclusive, Policy::WoundWait),
            Acquire::Granted
        );
        assert_eq!(
            locks.acquire(young, 2, &k(1), Mode::Exclusive, Policy::WoundWait),
            Acquire::Wait { wound: vec![] }
        );
        // The older one wounds the younger instead of waiting for it: no cycle.
        assert_eq!(
            locks.acquire(old, 1, &k(2), Mode::Exclusive, Policy::WoundWait),
            Acquire::Wait { wound: vec![young] }
        );
        let granted = locks.release_all(young);
        assert_eq!(granted, vec![Granted { txn: old, key: k(2), mode: Mode::Exclusive }]);
    }
}
