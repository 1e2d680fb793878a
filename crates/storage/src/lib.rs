//! Meridian storage: the in-memory MVCC store every replica owns (docs/architecture.md, "Store").
//!
//! The store is an ordered map from key to a short version chain, sorted by timestamp. A
//! version is `Committed` (visible to reads) or `Pending` (written but revocable: Tiga's
//! detective mode and MVTO write before they know the outcome). Reads at a timestamp see the
//! newest committed version at or below it; a version whose value is `None` is a delete.
//!
//! Invariants (asserted):
//! - per key, timestamps are strictly increasing along the chain;
//! - garbage collection below watermark `w` keeps, per key, the newest committed version at or
//!   below `w` and everything above `w`, so every read at `ts >= w` returns what it did before.
//!
//! Layout: version chains live in a hash map with a fixed hasher (point reads and writes are
//! the hot path: one lookup each), and the keys also sit in a `BTreeSet` for scans and ordered
//! iteration. Nothing iterates the hash map, so the store is deterministic. Durability is the
//! log store's job.
#![deny(unsafe_code)]

use meridian_core::hash::FixedHashMap;
use meridian_core::key::{Key, Value};
use meridian_core::txn::ScanRange;
use meridian_core::{Timestamp, TxnId};
use std::collections::BTreeSet;
use std::fmt;
use std::ops::Bound;

/// Whether a version is visible.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VersionState {
    /// Visible to reads.
    Committed,
    /// Written by a transaction whose outcome is unknown; revocable.
    Pending,
}

/// One version of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// Its position in the key's history.
    pub ts: Timestamp,
    /// The value; `None` is a delete.
    pub value: Option<Value>,
    /// The transaction attempt that wrote it.
    pub writer: TxnId,
    /// Committed or pending.
    pub state: VersionState,
}

/// Why a write was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// A version with this timestamp already exists for the key.
    DuplicateTimestamp {
        /// The key.
        key: Key,
        /// The timestamp.
        ts: Timestamp,
    },
    /// The write is at or below the garbage-collection watermark, where history is gone.
    BelowWatermark {
        /// The key.
        key: Key,
        /// The timestamp.
        ts: Timestamp,
    },
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DuplicateTimestamp { key, ts } => {
                write!(f, "{key:?} already has a version at {}", ts.0)
            }
            Self::BelowWatermark { key, ts } => {
                write!(f, "write to {key:?} at {} is below the GC watermark", ts.0)
            }
        }
    }
}

impl std::error::Error for StoreError {}

/// The multi-version store of one replica.
#[derive(Clone, Debug, Default)]
pub struct MvccStore {
    map: FixedHashMap<Key, Vec<Version>>,
    order: BTreeSet<Key>,
    /// Keys a transaction has written since their bulk load (a superset of those whose newest
    /// version a transaction wrote), so a snapshot walks these rather than every key.
    written: BTreeSet<Key>,
    gc_watermark: Timestamp,
    versions: u64,
}

impl MvccStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Loads an initial value (committed at `Timestamp::ZERO` by `TxnId::LOAD`), replacing any
    /// history of the key. For bulk loading before transactions run.
    pub fn load(&mut self, key: Key, value: Value) {
        let version = Version {
            ts: Timestamp::ZERO,
            value: Some(value),
            writer: TxnId::LOAD,
            state: VersionState::Committed,
        };
        self.written.remove(&key);
        match self.map.insert(key.clone(), vec![version]) {
            Some(old) => self.versions -= old.len() as u64,
            None => {
                self.order.insert(key);
            }
        }
        self.versions += 1;
    }

    /// Every version of `key`, oldest first.
    pub fn versions(&self, key: &Key) -> &[Version] {
        self.map.get(key).map_or(&[], Vec::as_slice)
    }

    /// The newest committed version at or below `ts` (a delete included).
    pub fn read_at(&self, key: &Key, ts: Timestamp) -> Option<&Version> {
        Self::visible(self.versions(key), ts)
    }

    /// The newest committed version (a delete included).
    pub fn read_latest(&self, key: &Key) -> Option<&Version> {
        self.read_at(key, Timestamp::MAX)
    }

    /// The value visible at `ts`, `None` when absent or deleted.
    pub fn get_at(&self, key: &Key, ts: Timestamp) -> Option<&Value> {
        self.read_at(key, ts).and_then(|v| v.value.as_ref())
    }

    fn visible(chain: &[Version], ts: Timestamp) -> Option<&Version> {
        // Chains of hot keys are long (a retention's worth of versions): find the versions at
        // or below `ts` by binary search unless every one is (a read of the latest state).
        let end = match chain.last() {
            Some(last) if last.ts <= ts => chain.len(),
            _ => chain.partition_point(|v| v.ts <= ts),
        };
        chain[..end].iter().rev().find(|v| v.state == VersionState::Committed)
    }

    /// Adds a version. Fails if the key already has a version at `ts` or `ts` is at or below the
    /// GC watermark (its history there is gone). Prunes the key's old versions below the
    /// watermark as it goes (once half its chain can go), so chains stay short without a
    /// full sweep.
    pub fn write(
        &mut self,
        key: Key,
        ts: Timestamp,
        value: Option<Value>,
        writer: TxnId,
        state: VersionState,
    ) -> Result<(), StoreError> {
        if ts <= self.gc_watermark && self.gc_watermark > Timestamp::ZERO {
            return Err(StoreError::BelowWatermark { key, ts });
        }
        let watermark = self.gc_watermark;
        let chain = match self.map.get_mut(&key) {
            Some(chain) => chain,
            None => {
                self.order.insert(key.clone());
                self.map.entry(key.clone()).or_default()
            }
        };
        // A key enters `written` with its first version a transaction wrote: a chain that
        // already holds one has its key there (versions other than the load's come in only
        // here and through `restore_latest`, both of which add it, and pruning keeps the
        // newest version). Looking the key up in the ordered set on every write cost the 1x1
        // benchmark a quarter of its throughput.
        if writer != TxnId::LOAD && chain.iter().all(|v| v.writer == TxnId::LOAD) {
            self.written.insert(key.clone());
        }
        if chain.binary_search_by(|v| v.ts.cmp(&ts)).is_ok() {
            return Err(StoreError::DuplicateTimestamp { key, ts });
        }
        let position = chain.partition_point(|v| v.ts < ts);
        chain.insert(position, Version { ts, value, writer, state });
        self.versions += 1;
        let removed = Self::prune_chain(chain, watermark, true);
        self.versions -= removed;
        debug_assert!(chain.windows(2).all(|w| w[0].ts < w[1].ts));
        Ok(())
    }

    /// Replaces the committed version of `key` at exactly `ts` with `value` by `writer`, for
    /// protocols that order transactions by (timestamp, id) and so may commit two writers of
    /// one key at one timestamp, the later in order replacing the earlier (every reader of
    /// the earlier ran before). False (nothing changed) when there is no such version.
    pub fn replace_at(
        &mut self,
        key: &Key,
        ts: Timestamp,
        value: Option<Value>,
        writer: TxnId,
    ) -> bool {
        let Some(chain) = self.map.get_mut(key) else { return false };
        let Ok(index) = chain.binary_search_by(|v| v.ts.cmp(&ts)) else { return false };
        let version = &mut chain[index];
        if version.state != VersionState::Committed {
            return false;
        }
        version.value = value;
        version.writer = writer;
        true
    }

    /// Marks `writer`'s pending version of `key` committed. False when there is none.
    pub fn commit(&mut self, key: &Key, writer: TxnId) -> bool {
        let Some(chain) = self.map.get_mut(key) else {
            return false;
        };
        // Pending versions are recent: look from the newest end.
        match chain
            .iter_mut()
            .rev()
            .find(|v| v.writer == writer && v.state == VersionState::Pending)
        {
            Some(version) => {
                version.state = VersionState::Committed;
                true
            }
            None => false,
        }
    }

    /// Removes `writer`'s pending version of `key`. False when there is none.
    pub fn revoke(&mut self, key: &Key, writer: TxnId) -> bool {
        let Some(chain) = self.map.get_mut(key) else {
            return false;
        };
        let Some(index) =
            chain.iter().rposition(|v| v.writer == writer && v.state == VersionState::Pending)
        else {
            return false;
        };
        chain.remove(index);
        self.versions -= 1;
        if chain.is_empty() {
            self.map.remove(key);
            self.order.remove(key);
        }
        true
    }

    /// Committed rows visible at `ts` in `range`, skipping deletes, at most `range.limit`.
    pub fn scan(&self, range: &ScanRange, ts: Timestamp) -> Vec<(Key, Version)> {
        let bounds = (Bound::Included(&range.start), Bound::Excluded(&range.end));
        if range.start >= range.end {
            return Vec::new();
        }
        let limit = range.limit as usize;
        let visible = |key: &Key| {
            let chain = self.map.get(key)?;
            Self::visible(chain, ts).filter(|v| v.value.is_some()).map(|v| (key.clone(), v.clone()))
        };
        if range.reverse {
            self.order.range::<Key, _>(bounds).rev().filter_map(visible).take(limit).collect()
        } else {
            self.order.range::<Key, _>(bounds).filter_map(visible).take(limit).collect()
        }
    }

    /// Raises the GC watermark (never lowers it). Chains are pruned as keys are written; call
    /// [`MvccStore::gc`] to sweep everything now.
    pub fn set_gc_watermark(&mut self, watermark: Timestamp) {
        self.gc_watermark = self.gc_watermark.max(watermark);
    }

    /// The current GC watermark.
    pub fn gc_watermark(&self) -> Timestamp {
        self.gc_watermark
    }

    /// Raises the watermark to `watermark` and prunes every key. Returns versions removed.
    pub fn gc(&mut self, watermark: Timestamp) -> u64 {
        self.set_gc_watermark(watermark);
        let watermark = self.gc_watermark;
        let mut removed = 0;
        let map = &mut self.map;
        // Walk in key order (not hash order) so the sweep is the same in every process.
        self.order.retain(|key| {
            let Some(chain) = map.get_mut(key) else { return false };
            removed += Self::prune_chain(chain, watermark, false);
            // A key whose only version is an old delete is gone for every reader.
            let dead = chain.len() == 1
                && chain[0].value.is_none()
                && chain[0].ts <= watermark
                && chain[0].state == VersionState::Committed;
            if dead {
                removed += 1;
                map.remove(key);
            }
            !dead
        });
        self.versions -= removed;
        removed
    }

    /// Drops `key`'s committed versions older than its newest committed version at or below
    /// `watermark`, for a caller that never again reads `key` below that version (tiga: a
    /// read comes after the key's newest write, or is one of the queued reads the watermark
    /// covers). Unlike the store's watermark it refuses no later write. Returns versions
    /// removed.
    pub fn prune_key(&mut self, key: &Key, watermark: Timestamp) -> u64 {
        let Some(chain) = self.map.get_mut(key) else { return 0 };
        let removed = Self::prune_chain(chain, watermark, false);
        self.versions -= removed;
        removed
    }

    /// Drops committed versions older than the newest committed one at or below `watermark`;
    /// with `lazy`, only once at least half of the chain can go.
    ///
    /// A hot key keeps a retention's worth of versions (a second of commits: thousands under
    /// Zipf), and every write to it prunes (lazily), so the work here must not grow with the
    /// chain: the boundary is found by binary search, and compacting only when half the
    /// chain goes makes moving the survivors cost O(1) per write amortised (leaving at most
    /// twice the versions the watermark needs).
    fn prune_chain(chain: &mut Vec<Version>, watermark: Timestamp, lazy: bool) -> u64 {
        let above = chain.partition_point(|v| v.ts <= watermark);
        let Some(keep_from) =
            chain[..above].iter().rposition(|v| v.state == VersionState::Committed)
        else {
            return 0;
        };
        if keep_from == 0 || (lazy && keep_from * 2 < chain.len()) {
            return 0;
        }
        if chain[..keep_from].iter().all(|v| v.state == VersionState::Committed) {
            chain.drain(..keep_from);
            return keep_from as u64;
        }
        let before = chain.len();
        let mut index = 0;
        chain.retain(|v| {
            let keep = index >= keep_from || v.state == VersionState::Pending;
            index += 1;
            keep
        });
        (before - chain.len()) as u64
    }

    /// Removes every version above `cutoff` (a failover discarding speculative commits:
    /// `mako`), leaving each key as it was at `cutoff`. Only keys transactions wrote can hold
    /// such versions (loads are at zero). The caller keeps the GC watermark at or below
    /// `cutoff`, so the version each key falls back to is still there. Returns versions
    /// removed.
    pub fn discard_above(&mut self, cutoff: Timestamp) -> u64 {
        debug_assert!(self.gc_watermark <= cutoff, "history below the cutoff was collected");
        self.truncate_writes(cutoff)
    }

    /// Removes every version transactions wrote, leaving the bulk load (before a snapshot
    /// that carries every version of the written keys is installed over an older state).
    pub fn forget_writes(&mut self) -> u64 {
        self.truncate_writes(Timestamp::ZERO)
    }

    fn truncate_writes(&mut self, cutoff: Timestamp) -> u64 {
        let mut removed = 0;
        let (map, order) = (&mut self.map, &mut self.order);
        self.written.retain(|key| {
            let Some(chain) = map.get_mut(key) else { return false };
            let keep = chain.partition_point(|v| v.ts <= cutoff);
            removed += (chain.len() - keep) as u64;
            chain.truncate(keep);
            if chain.is_empty() {
                map.remove(key);
                order.remove(key);
                return false;
            }
            // Still written since its load unless only the load's version is left.
            chain.iter().any(|v| v.writer != TxnId::LOAD)
        });
        self.versions -= removed;
        removed
    }

    /// Number of keys with at least one version.
    pub fn key_count(&self) -> usize {
        self.map.len()
    }

    /// Number of versions held.
    pub fn version_count(&self) -> u64 {
        self.versions
    }

    /// Every key with a version (pending ones and deletes included), in key order: what a
    /// snapshot that replaces a store whole must carry.
    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.order.iter()
    }

    /// Every key with a version in `[start, end)` (pending ones and deletes included), in key
    /// order; nothing for an empty or inverted range. For protocols that read at a view of
    /// their own (pending versions of one writer over committed ones).
    pub fn keys_in<'a>(
        &'a self,
        start: &Key,
        end: &Key,
    ) -> impl DoubleEndedIterator<Item = &'a Key> + 'a {
        let end = if start < end { end.clone() } else { start.clone() };
        let bounds = (Bound::Included(start.clone()), Bound::Excluded(end));
        self.order.range::<Key, _>(bounds)
    }

    /// Keys in `[start, end)` with their newest committed values (deletes skipped), in key
    /// order. Unbounded, unlike [`MvccStore::scan`]: for checks over a whole table.
    pub fn latest_range<'a>(
        &'a self,
        start: &Key,
        end: &Key,
    ) -> impl Iterator<Item = (&'a Key, &'a Version)> + 'a {
        // An empty or inverted range reads nothing (`BTreeSet::range` would panic on it).
        let end = if start < end { end.clone() } else { start.clone() };
        let bounds = (Bound::Included(start.clone()), Bound::Excluded(end));
        self.order.range::<Key, _>(bounds).filter_map(|k| {
            let chain = self.map.get(k)?;
            Self::visible(chain, Timestamp::MAX).filter(|v| v.value.is_some()).map(|v| (k, v))
        })
    }

    /// Every key whose newest committed version a transaction wrote (not the bulk load), with
    /// that version, deletes included, in key order: what a snapshot of the store must carry
    /// on top of the deterministic initial load. Walks only the keys transactions wrote. (A
    /// full [`MvccStore::gc`] sweep forgets keys whose only version is an old delete; a
    /// store that is snapshotted must not be swept, or the delete would be lost.)
    pub fn written_since_load(&self) -> impl Iterator<Item = (&Key, &Version)> {
        self.written.iter().filter_map(|k| {
            let version = Self::visible(self.map.get(k)?, Timestamp::MAX)?;
            (version.writer != TxnId::LOAD).then_some((k, version))
        })
    }

    /// Every key a transaction wrote a version of since its load (pending versions
    /// included), in key order: what a snapshot of a store holding undecided writes must
    /// carry (with every version of each) on top of the initial load.
    pub fn written_keys(&self) -> impl Iterator<Item = &Key> {
        self.written.iter().filter(|k| self.map.contains_key(*k))
    }

    /// Replaces `key`'s history by one committed version (restoring a snapshot).
    pub fn restore_latest(&mut self, key: Key, ts: Timestamp, writer: TxnId, value: Option<Value>) {
        let version = Version { ts, value, writer, state: VersionState::Committed };
        if writer == TxnId::LOAD {
            self.written.remove(&key);
        } else {
            self.written.insert(key.clone());
        }
        match self.map.insert(key.clone(), vec![version]) {
            Some(old) => self.versions -= old.len() as u64,
            None => {
                self.order.insert(key);
            }
        }
        self.versions += 1;
    }

    /// Replaces `key`'s history by `versions` (committed, oldest first, timestamps strictly
    /// increasing), whatever the watermark: restoring a snapshot of a store whose reads at
    /// older timestamps must see what the source saw (`2pc-mvto`).
    pub fn restore_chain(&mut self, key: Key, versions: Vec<Version>) {
        debug_assert!(versions.windows(2).all(|w| w[0].ts < w[1].ts));
        if versions.is_empty() {
            return;
        }
        if versions.iter().all(|v| v.writer == TxnId::LOAD) {
            self.written.remove(&key);
        } else {
            self.written.insert(key.clone());
        }
        self.versions += versions.len() as u64;
        match self.map.insert(key.clone(), versions) {
            Some(old) => self.versions -= old.len() as u64,
            None => {
                self.order.insert(key);
            }
        }
    }

    /// Every key with its newest committed value (deletes skipped), in key order.
    pub fn latest_values(&self) -> impl Iterator<Item = (&Key, &Version)> {
        self.order.iter().filter_map(|k| {
            let chain = self.map.get(k)?;
            Self::visible(chain, Timestamp::MAX).filter(|v| v.value.is_some()).map(|v| (k, v))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::NodeId;

    fn txn(seq: u64) -> TxnId {
        TxnId { origin: NodeId(0), incarnation: 0, seq }
    }

    fn key(i: u64) -> Key {
        Key::table(1).u64(i).build()
    }

    fn put(store: &mut MvccStore, k: u64, ts: u64, value: &str, seq: u64) {
        store
            .write(
                key(k),
                Timestamp(ts),
                Some(value.as_bytes().to_vec()),
                txn(seq),
                VersionState::Committed,
            )
            .unwrap();
    }

    /// Discarding above a cutoff leaves every key as it was at the cutoff: later versions go,
    /// a key created above it disappears (from scans too), loads and older versions stay, and
    /// the next write above the cutoff is accepted.
    #[test]
    fn discard_above_returns_every_key_to_its_state_at_the_cutoff() {
        let mut store = MvccStore::new();
        store.load(key(1), b"loaded".to_vec());
        store.load(key(2), b"loaded".to_vec());
        put(&mut store, 1, 10, "a", 1);
        put(&mut store, 1, 30, "b", 2);
        put(&mut store, 2, 40, "c", 3);
        put(&mut store, 3, 50, "new", 4);
        store.set_gc_watermark(Timestamp(20));
        let before = store.version_count();
        assert_eq!(store.discard_above(Timestamp(25)), 3);
        assert_eq!(store.version_count(), before - 3);
        assert_eq!(store.get_at(&key(1), Timestamp::MAX), Some(&b"a".to_vec()));
        assert_eq!(store.get_at(&key(2), Timestamp::MAX), Some(&b"loaded".to_vec()));
        assert_eq!(store.read_latest(&key(3)), None);
        assert_eq!(store.key_count(), 2);
        let all = ScanRange { start: key(0), end: key(100), limit: 100, reverse: false };
        assert_eq!(store.scan(&all, Timestamp::MAX).len(), 2);
        // Key 2 is back to its load alone; key 1 still carries a transaction's write.
        let written: Vec<Key> = store.written_since_load().map(|(k, _)| k.clone()).collect();
        assert_eq!(written, vec![key(1)]);
        put(&mut store, 1, 26, "d", 5);
        assert_eq!(store.get_at(&key(1), Timestamp::MAX), Some(&b"d".to_vec()));
        assert_eq!(store.discard_above(Timestamp(26)), 0);
    }

    /// A second writer at one timestamp replaces the first's committed version in place; a
    /// pending version or a missing timestamp is left alone.
    #[test]
    fn replace_at_swaps_the_committed_version_at_exactly_that_timestamp() {
        let mut store = MvccStore::new();
        put(&mut store, 1, 10, "a", 1);
        put(&mut store, 1, 20, "b", 2);
        assert!(store.replace_at(&key(1), Timestamp(10), Some(b"c".to_vec()), txn(3)));
        assert_eq!(store.get_at(&key(1), Timestamp(15)), Some(&b"c".to_vec()));
        assert_eq!(store.read_at(&key(1), Timestamp(15)).unwrap().writer, txn(3));
        assert_eq!(store.version_count(), 2);
        assert!(!store.replace_at(&key(1), Timestamp(15), None, txn(4)), "no version at 15");
        assert!(!store.replace_at(&key(2), Timestamp(10), None, txn(4)), "no such key");
        let pending = store.write(key(1), Timestamp(30), None, txn(5), VersionState::Pending);
        assert!(pending.is_ok());
        assert!(!store.replace_at(&key(1), Timestamp(30), None, txn(6)), "pending stays");
    }

    #[test]
    fn written_since_load_and_restore_latest_carry_the_latest_state() {
        let mut store = MvccStore::new();
        store.load(key(1), b"loaded".to_vec());
        store.load(key(2), b"loaded".to_vec());
        store.load(key(3), b"loaded".to_vec());
        put(&mut store, 2, 10, "a", 1);
        put(&mut store, 2, 20, "b", 2);
        store.write(key(3), Timestamp(15), None, txn(3), VersionState::Committed).unwrap();
        put(&mut store, 4, 12, "new", 4);
        let written: Vec<(Key, Timestamp, Option<Value>)> =
            store.written_since_load().map(|(k, v)| (k.clone(), v.ts, v.value.clone())).collect();
        assert_eq!(
            written,
            vec![
                (key(2), Timestamp(20), Some(b"b".to_vec())),
                (key(3), Timestamp(15), None),
                (key(4), Timestamp(12), Some(b"new".to_vec())),
            ]
        );
        // The initial load plus what was written gives the same latest state.
        let mut copy = MvccStore::new();
        for k in 1..=3 {
            copy.load(key(k), b"loaded".to_vec());
        }
        for (k, v) in store.written_since_load() {
            copy.restore_latest(k.clone(), v.ts, v.writer, v.value.clone());
        }
        let latest = |s: &MvccStore| -> Vec<(Key, Version)> {
            s.latest_values().map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        assert_eq!(latest(&copy), latest(&store));
        assert_eq!(copy.read_latest(&key(3)).map(|v| v.ts), Some(Timestamp(15)));
        assert_eq!(copy.version_count(), 4);
    }

    #[test]
    fn reads_see_the_newest_committed_version_at_or_below_ts() {
        let mut store = MvccStore::new();
        store.load(key(1), b"v0".to_vec());
        put(&mut store, 1, 10, "v10", 1);
        put(&mut store, 1, 20, "v20", 2);
        assert_eq!(store.get_at(&key(1), Timestamp(5)), Some(&b"v0".to_vec()));
        assert_eq!(store.get_at(&key(1), Timestamp(10)), Some(&b"v10".to_vec()));
        assert_eq!(store.get_at(&key(1), Timestamp(19)), Some(&b"v10".to_vec()));
        assert_eq!(store.read_latest(&key(1)).unwrap().writer, txn(2));
        assert_eq!(store.get_at(&key(2), Timestamp::MAX), None);
        // Out-of-order insertion keeps the chain sorted.
        put(&mut store, 1, 15, "v15", 3);
        assert_eq!(store.get_at(&key(1), Timestamp(16)), Some(&b"v15".to_vec()));
        let err =
            store.write(key(1), Timestamp(15), None, txn(4), VersionState::Committed).unwrap_err();
        assert!(matches!(err, StoreError::DuplicateTimestamp { .. }));
    }

    #[test]
    fn deletes_hide_values() {
        let mut store = MvccStore::new();
        put(&mut store, 1, 10, "a", 1);
        store.write(key(1), Timestamp(20), None, txn(2), VersionState::Committed).unwrap();
        assert_eq!(store.get_at(&key(1), Timestamp(15)), Some(&b"a".to_vec()));
        assert_eq!(store.get_at(&key(1), Timestamp(25)), None);
        assert!(store.read_at(&key(1), Timestamp(25)).unwrap().value.is_none());
    }

    #[test]
    fn pending_versions_are_invisible_until_committed_and_revocable() {
        let mut store = MvccStore::new();
        put(&mut store, 1, 10, "a", 1);
        store
            .write(key(1), Timestamp(20), Some(b"b".to_vec()), txn(2), VersionState::Pending)
            .unwrap();
        assert_eq!(store.get_at(&key(1), Timestamp::MAX), Some(&b"a".to_vec()));
        assert!(store.commit(&key(1), txn(2)));
        assert_eq!(store.get_at(&key(1), Timestamp::MAX), Some(&b"b".to_vec()));
        store
            .write(key(1), Timestamp(30), Some(b"c".to_vec()), txn(3), VersionState::Pending)
            .unwrap();
        assert!(store.revoke(&key(1), txn(3)));
        assert!(!store.revoke(&key(1), txn(3)), "revoking twice finds nothing");
        assert!(!store.commit(&key(1), txn(3)));
        assert_eq!(store.versions(&key(1)).len(), 2);
        assert_eq!(store.get_at(&key(1), Timestamp::MAX), Some(&b"b".to_vec()));
    }

    #[test]
    fn scans_respect_range_limit_direction_and_snapshot() {
        let mut store = MvccStore::new();
        for i in 0..10 {
            put(&mut store, i, 10 + i, "x", i);
        }
        store.write(key(3), Timestamp(100), None, txn(99), VersionState::Committed).unwrap();
        let range = |limit, reverse| ScanRange { start: key(2), end: key(8), limit, reverse };
        let rows = |r: &ScanRange, ts| {
            store.scan(r, Timestamp(ts)).into_iter().map(|(k, _)| k).collect::<Vec<_>>()
        };
        assert_eq!(rows(&range(100, false), 200), vec![key(2), key(4), key(5), key(6), key(7)]);
        assert_eq!(rows(&range(100, false), 14), vec![key(2), key(3), key(4)], "snapshot at 14");
        assert_eq!(rows(&range(2, true), 200), vec![key(7), key(6)]);
        let empty = ScanRange { start: key(5), end: key(5), limit: 10, reverse: false };
        assert!(store.scan(&empty, Timestamp::MAX).is_empty());
    }

    #[test]
    fn gc_keeps_every_read_at_or_above_the_watermark() {
        let mut store = MvccStore::new();
        for ts in 1..=10 {
            put(&mut store, 1, ts * 10, &format!("v{ts}"), ts);
        }
        store.write(key(2), Timestamp(5), None, txn(50), VersionState::Committed).unwrap();
        store
            .write(key(1), Timestamp(200), Some(b"p".to_vec()), txn(60), VersionState::Pending)
            .unwrap();
        let before: Vec<_> =
            (55..=120).map(|ts| store.get_at(&key(1), Timestamp(ts)).cloned()).collect();
        let removed = store.gc(Timestamp(55));
        assert_eq!(removed, 4 + 1, "v1..v4 of key 1 and the dead delete of key 2");
        let after: Vec<_> =
            (55..=120).map(|ts| store.get_at(&key(1), Timestamp(ts)).cloned()).collect();
        assert_eq!(before, after);
        assert_eq!(store.key_count(), 1);
        assert_eq!(store.version_count(), 7, "v5..v10 and the pending version");
        assert!(matches!(
            store.write(key(1), Timestamp(50), None, txn(70), VersionState::Committed),
            Err(StoreError::BelowWatermark { .. })
        ));
    }

    /// Pruning one key keeps every read of it at or above the mark, touches no other key,
    /// keeps pending versions, and refuses no later write (unlike the store's watermark).
    #[test]
    fn pruning_one_key_keeps_its_reads_at_or_above_the_mark_and_refuses_nothing() {
        let mut store = MvccStore::new();
        store.load(key(1), b"load".to_vec());
        for ts in 1..=5 {
            put(&mut store, 1, ts * 10, &format!("v{ts}"), ts);
            put(&mut store, 2, ts * 10, &format!("w{ts}"), 10 + ts);
        }
        store
            .write(key(1), Timestamp(25), Some(b"p".to_vec()), txn(30), VersionState::Pending)
            .unwrap();
        let before: Vec<_> =
            (40..=60).map(|ts| store.get_at(&key(1), Timestamp(ts)).cloned()).collect();
        assert_eq!(store.prune_key(&key(1), Timestamp(45)), 4, "the load and v1..v3");
        let after: Vec<_> =
            (40..=60).map(|ts| store.get_at(&key(1), Timestamp(ts)).cloned()).collect();
        assert_eq!(before, after);
        let kept: Vec<u64> = store.versions(&key(1)).iter().map(|v| v.ts.0).collect();
        assert_eq!(kept, [25, 40, 50], "the pending version stays");
        assert_eq!(store.versions(&key(2)).len(), 5, "other keys untouched");
        assert_eq!(store.version_count(), 3 + 5);
        assert_eq!(store.prune_key(&key(9), Timestamp(45)), 0, "an unknown key");
        put(&mut store, 1, 30, "late", 40);
        assert_eq!(store.get_at(&key(1), Timestamp(30)), Some(&b"late".to_vec()));
    }

    #[test]
    fn writes_prune_old_versions_incrementally() {
        let mut store = MvccStore::new();
        store.set_gc_watermark(Timestamp(1_000));
        for ts in 1..=100 {
            put(&mut store, 1, 1_000 + ts, "v", ts);
        }
        store.set_gc_watermark(Timestamp(1_090));
        put(&mut store, 1, 1_101, "v", 101);
        assert_eq!(store.versions(&key(1)).len(), 12, "1090..=1101");
        assert_eq!(store.version_count(), 12);
    }

    /// A hot key under a moving watermark: writes compact its chain only once half of it can
    /// go, so it never holds more than twice the versions the watermark needs, and reads at
    /// or above the watermark (and of the latest state) are what they would be unpruned.
    #[test]
    fn writes_under_a_moving_watermark_keep_at_most_twice_what_the_watermark_needs() {
        let mut store = MvccStore::new();
        let mut unpruned = MvccStore::new();
        store.load(key(1), b"load".to_vec());
        unpruned.load(key(1), b"load".to_vec());
        let retention = 50;
        for ts in 1..=2_000u64 {
            let watermark = Timestamp(ts.saturating_sub(retention));
            store.set_gc_watermark(watermark);
            put(&mut store, 1, ts, &format!("v{ts}"), ts);
            put(&mut unpruned, 1, ts, &format!("v{ts}"), ts);
            let needed = store.versions(&key(1)).iter().filter(|v| v.ts >= watermark).count() + 1;
            let held = store.versions(&key(1)).len();
            assert!(held <= 2 * needed, "{held} versions held, {needed} needed at {ts}");
            for read in [watermark.0, ts - ts % 7, ts, u64::MAX] {
                let read = Timestamp(read.max(watermark.0));
                assert_eq!(store.get_at(&key(1), read), unpruned.get_at(&key(1), read));
            }
        }
        assert!(store.version_count() < 2 * (retention + 1));
        assert_eq!(store.version_count(), store.versions(&key(1)).len() as u64);
        // An explicit sweep prunes whatever the watermark allows.
        let watermark = store.gc_watermark();
        store.gc(watermark);
        assert_eq!(store.versions(&key(1)).len() as u64, retention + 1);
    }

    #[test]
    fn a_restored_chain_reads_like_its_source_at_every_timestamp() {
        let mut source = MvccStore::new();
        source.load(key(1), b"load".to_vec());
        for ts in [10, 20, 30] {
            put(&mut source, 1, ts, "v", ts);
        }
        source.set_gc_watermark(Timestamp(25));
        let chain: Vec<Version> = source.versions(&key(1)).to_vec();
        let mut restored = MvccStore::new();
        restored.load(key(1), b"load".to_vec());
        restored.load(key(2), b"other".to_vec());
        restored.set_gc_watermark(Timestamp(25));
        restored.restore_chain(key(1), chain);
        for ts in 0..40 {
            assert_eq!(
                restored.read_at(&key(1), Timestamp(ts)),
                source.read_at(&key(1), Timestamp(ts))
            );
        }
        assert_eq!(restored.version_count(), source.version_count() + 1, "key 2's load");
        assert_eq!(restored.written_since_load().count(), 1);
    }
}
