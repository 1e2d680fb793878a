//! Multi-version timestamp ordering: the pieces `2pc-mvto`'s participant uses (see the module
//! above for the rules they implement).
//!
//! - [`Below`]: the read source of an attempt at timestamp `ts`: the newest version strictly
//!   below `ts`, pending versions included (a read of one makes the attempt depend on its
//!   writer).
//! - [`ReadStamps`]: the replicated read timestamps (per key and per scanned range) that a
//!   write must exceed, bounded: evicting stamps raises a floor that every write must exceed
//!   instead, so forgetting a stamp can refuse a write but never admit one it would have
//!   refused.

use crate::kit::exec::ReadSource;
use meridian_core::hash::FixedHashMap;
use meridian_core::key::Key;
use meridian_core::txn::ScanRange;
use meridian_core::Timestamp;
use meridian_storage::{MvccStore, Version, VersionState};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Scanned ranges whose stamps a shard keeps at once; beyond it the oldest goes into the floor.
pub(crate) const RANGE_STAMPS_MAX: usize = 1_024;
/// Key stamps at or below the watermark are swept out when it has moved this far since the
/// last sweep (they refuse nothing the watermark does not; the sweep walks every stamp).
const STAMP_SWEEP_NS: u64 = 100 * meridian_core::time::NS_PER_MS;
/// The newest version of a key's `chain` (committed or pending) strictly below `ts`.
pub(crate) fn version_below(chain: &[Version], ts: Timestamp) -> Option<&Version> {
    chain.iter().rev().find(|v| v.ts < ts)
}

/// True when `chain` has a version at exactly `ts` written by another attempt: a read at `ts`
/// cannot be ordered against it.
pub(crate) fn taken_at(chain: &[Version], ts: Timestamp, own: meridian_core::TxnId) -> bool {
    chain.iter().any(|v| v.ts == ts && v.writer != own)
}

/// The pending version of `chain`, if any (at most one: prepared writers exclude each other).
pub(crate) fn pending_of(chain: &[Version]) -> Option<&Version> {
    chain.iter().rev().find(|v| v.state == VersionState::Pending)
}

/// What an attempt at `ts` reads: the newest version below `ts`, pending ones included; scans
/// see committed rows below `ts` (a pending row in the range is checked at prepare).
pub(crate) struct Below<'a>(pub &'a MvccStore, pub Timestamp);

impl ReadSource for Below<'_> {
    fn read(&self, key: &Key) -> Option<&Version> {
        version_below(self.0.versions(key), self.1)
    }

    fn scan(&self, range: &ScanRange) -> Vec<(Key, Version)> {
        self.0.scan(range, Timestamp(self.1 .0.saturating_sub(1)))
    }
}

/// Whether `key` lies in `range`.
fn contains(range: &ScanRange, key: &Key) -> bool {
    range.start <= *key && *key < range.end
}

/// Read timestamps a write must exceed. Replicated: every replica records the same stamps in
/// the same order (at prepare), so every replica refuses the same writes. Key stamps sit in a
/// hash map (one lookup per read: this is on every prepare's path); when it is full they all
/// go into the floor at once, which only happens when more reads than the limit prepared
/// within one GC retention.
#[derive(Clone, Debug)]
pub(crate) struct ReadStamps {
    keys: FixedHashMap<Key, Timestamp>,
    ranges: Vec<(ScanRange, Timestamp)>,
    /// Every write must be above this: the largest stamp evicted for room.
    floor: Timestamp,
    keys_max: usize,
    evicted_total: u64,
    /// The watermark at the last sweep of `keys`.
    swept_at: Timestamp,
    /// The watermark now: stamps at or below it are dead (they refuse nothing the watermark
    /// does not), whether or not a sweep has removed them yet.
    watermark: Timestamp,
}

/// [`ReadStamps`] as a snapshot carries it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct StampsImage {
    keys: Vec<(Key, Timestamp)>,
    ranges: Vec<(ScanRange, Timestamp)>,
    floor: Timestamp,
    evicted_total: u64,
}

impl ReadStamps {
    /// Empty, keeping at most `keys_max` key stamps.
    pub(crate) fn new(keys_max: usize) -> Self {
        assert!(keys_max > 0, "the limit is validated");
        Self {
            keys: FixedHashMap::default(),
            ranges: Vec::new(),
            floor: Timestamp::ZERO,
            keys_max,
            evicted_total: 0,
            swept_at: Timestamp::ZERO,
            watermark: Timestamp::ZERO,
        }
    }

    /// A read of `key` at `ts` prepared: later writes of `key` must be above `ts`.
    pub(crate) fn note_read(&mut self, key: &Key, ts: Timestamp) {
        if ts <= self.floor {
            return;
        }
        if let Some(stamp) = self.keys.get_mut(key) {
            *stamp = (*stamp).max(ts);
            return;
        }
        if self.keys.len() >= self.keys_max {
            // Only live stamps count: when dead ones were swept differs between replicas (a
            // replica restored from a snapshot sweeps on its own schedule), and what is full
            // decides the floor, which decides votes.
            let watermark = self.watermark;
            self.keys.retain(|_, stamp| *stamp > watermark);
            self.swept_at = watermark;
        }
        if self.keys.len() >= self.keys_max {
            let highest = self.keys.values().copied().max().unwrap_or(Timestamp::ZERO);
            self.floor = self.floor.max(highest);
            self.evicted_total += self.keys.len() as u64;
            self.keys.clear();
            if ts <= self.floor {
                return;
            }
        }
        self.keys.insert(key.clone(), ts);
        debug_assert!(self.keys.len() <= self.keys_max);
    }

    /// A scan of `range` at `ts` prepared: later writes inside it must be above `ts`.
    pub(crate) fn note_scan(&mut self, range: &ScanRange, ts: Timestamp) {
        if ts <= self.floor {
            return;
        }
        if self.ranges.len() >= RANGE_STAMPS_MAX {
            let (index, _) = self
                .ranges
                .iter()
                .enumerate()
                .min_by_key(|(_, (_, stamp))| *stamp)
                .expect("full, so not empty");
            let (_, stamp) = self.ranges.swap_remove(index);
            self.floor = self.floor.max(stamp);
            self.evicted_total += 1;
        }
        self.ranges.push((range.clone(), ts));
    }

    /// The stamp a write of `key` must exceed.
    pub(crate) fn stamp_of(&self, key: &Key) -> Timestamp {
        let own = self.keys.get(key).copied().unwrap_or(Timestamp::ZERO);
        let ranged = self
            .ranges
            .iter()
            .filter(|(range, _)| contains(range, key))
            .map(|(_, stamp)| *stamp)
            .max()
            .unwrap_or(Timestamp::ZERO);
        self.floor.max(own).max(ranged)
    }

    /// Drops stamps at or below `watermark` (writes there are refused by the watermark
    /// anyway): ranges at once, keys when the watermark has moved [`STAMP_SWEEP_NS`] since the
    /// last sweep.
    pub(crate) fn forget_below(&mut self, watermark: Timestamp) {
        self.watermark = self.watermark.max(watermark);
        self.ranges.retain(|(_, stamp)| *stamp > watermark);
        if watermark.0 >= self.swept_at.0.saturating_add(STAMP_SWEEP_NS) {
            self.keys.retain(|_, stamp| *stamp > watermark);
            self.swept_at = watermark;
        }
    }

    /// Stamps held (keys and ranges).
    pub(crate) fn len(&self) -> usize {
        self.keys.len() + self.ranges.len()
    }

    /// Stamps evicted for room since the start.
    pub(crate) fn evicted_total(&self) -> u64 {
        self.evicted_total
    }

    /// The live stamps (dead ones differ between replicas by when they were swept).
    pub(crate) fn image(&self) -> StampsImage {
        let mut keys: Vec<(Key, Timestamp)> = self
            .keys
            .iter()
            .filter(|(_, &ts)| ts > self.watermark)
            .map(|(k, &ts)| (k.clone(), ts))
            .collect();
        keys.sort_unstable(); // Hash order is not an order to put in a snapshot.
        StampsImage {
            keys,
            ranges: self.ranges.clone(),
            floor: self.floor,
            evicted_total: self.evicted_total,
        }
    }

    /// Checks an image from a snapshot fits this shard's bounds.
    /// The most keys it stamps.
    pub(crate) fn capacity(&self) -> usize {
        self.keys_max
    }

    pub(crate) fn check_image(image: &StampsImage, keys_max: usize) -> Result<(), String> {
        if image.keys.len() > keys_max || image.ranges.len() > RANGE_STAMPS_MAX {
            return Err(format!(
                "snapshot holds {} key and {} range stamps, over {keys_max} and {RANGE_STAMPS_MAX}",
                image.keys.len(),
                image.ranges.len()
            ));
        }
        Ok(())
    }

    /// Installs a snapshot's stamps; the watermark comes with the snapshot's store.
    pub(crate) fn install(&mut self, image: StampsImage, watermark: Timestamp) {
        self.keys = image.keys.into_iter().collect();
        self.watermark = watermark;
        self.swept_at = watermark;
        self.ranges = image.ranges;
        self.floor = image.floor;
        self.evicted_total = image.evicted_total;
    }
}

/// Read timestamps the leader saw at execution, before any of them is prepared: a write below
/// one is refused at the leader (before it enters the log), so the writer aborts rather than
/// the reader that came first. Leader-only and a hint: forgetting one (a leader change, or the
/// map filling up) only moves the abort to the reader's prepare, which checks its reads.
#[derive(Clone, Debug, Default)]
pub(crate) struct SoftStamps {
    keys: BTreeMap<Key, Timestamp>,
    keys_max: usize,
}

impl SoftStamps {
    pub(crate) fn new(keys_max: usize) -> Self {
        Self { keys: BTreeMap::new(), keys_max }
    }

    pub(crate) fn note(&mut self, key: &Key, ts: Timestamp) {
        if self.keys.len() >= self.keys_max && !self.keys.contains_key(key) {
            // Cheaper than an eviction order, and safe: these are hints.
            self.keys.clear();
        }
        let stamp = self.keys.entry(key.clone()).or_insert(ts);
        *stamp = (*stamp).max(ts);
    }

    pub(crate) fn stamp_of(&self, key: &Key) -> Timestamp {
        self.keys.get(key).copied().unwrap_or(Timestamp::ZERO)
    }

    pub(crate) fn forget_below(&mut self, watermark: Timestamp) {
        self.keys.retain(|_, ts| *ts > watermark);
    }

    pub(crate) fn clear(&mut self) {
        self.keys.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: u64) -> Key {
        Key::table(1).u64(id).build()
    }

    fn range(start: u64, end: u64) -> ScanRange {
        ScanRange { start: key(start), end: key(end), limit: 10, reverse: false }
    }

    #[test]
    fn a_write_must_exceed_every_stamp_of_its_key_and_range() {
        let mut stamps = ReadStamps::new(8);
        stamps.note_read(&key(1), Timestamp(50));
        stamps.note_read(&key(1), Timestamp(40));
        stamps.note_scan(&range(10, 20), Timestamp(70));
        assert_eq!(stamps.stamp_of(&key(1)), Timestamp(50), "stamps only rise");
        assert_eq!(stamps.stamp_of(&key(15)), Timestamp(70));
        assert_eq!(stamps.stamp_of(&key(20)), Timestamp::ZERO, "ranges are half open");
        stamps.forget_below(Timestamp(60));
        assert_eq!(stamps.stamp_of(&key(1)), Timestamp(50), "key stamps wait for a sweep");
        assert_eq!(stamps.stamp_of(&key(15)), Timestamp(70));
        stamps.forget_below(Timestamp(STAMP_SWEEP_NS + 60));
        assert_eq!(stamps.stamp_of(&key(1)), Timestamp::ZERO);
        assert_eq!(stamps.len(), 0);
    }

    #[test]
    fn eviction_raises_the_floor_so_no_write_slips_under_a_forgotten_stamp() {
        let mut stamps = ReadStamps::new(2);
        stamps.note_read(&key(1), Timestamp(30));
        stamps.note_read(&key(2), Timestamp(10));
        stamps.note_read(&key(3), Timestamp(40)); // full: both go into the floor
        assert_eq!(stamps.len(), 1);
        assert_eq!(stamps.evicted_total(), 2);
        assert_eq!(stamps.stamp_of(&key(2)), Timestamp(30), "the floor covers its stamp");
        assert_eq!(stamps.stamp_of(&key(9)), Timestamp(30), "and refuses more than needed");
        assert_eq!(stamps.stamp_of(&key(1)), Timestamp(30));
        assert_eq!(stamps.stamp_of(&key(3)), Timestamp(40));
        stamps.note_read(&key(4), Timestamp(25));
        assert_eq!(stamps.len(), 1, "a stamp under the floor is already covered");
        let image = stamps.image();
        let mut copy = ReadStamps::new(2);
        copy.install(image, Timestamp::ZERO);
        for id in 0..5 {
            assert_eq!(copy.stamp_of(&key(id)), stamps.stamp_of(&key(id)));
        }
        assert!(ReadStamps::check_image(&stamps.image(), 0).is_err());
    }

    #[test]
    fn reads_below_a_timestamp_see_pending_versions_and_never_their_own_timestamp() {
        let mut store = MvccStore::new();
        store.load(key(1), b"a".to_vec());
        let writer =
            meridian_core::TxnId { origin: meridian_core::NodeId(0), incarnation: 0, seq: 1 };
        store
            .write(key(1), Timestamp(100), Some(b"b".to_vec()), writer, VersionState::Pending)
            .unwrap();
        let source = Below(&store, Timestamp(101));
        let seen = source.read(&key(1)).unwrap();
        assert_eq!((seen.ts, seen.state), (Timestamp(100), VersionState::Pending));
        assert_eq!(Below(&store, Timestamp(100)).read(&key(1)).unwrap().ts, Timestamp::ZERO);
        let chain = store.versions(&key(1));
        assert!(taken_at(chain, Timestamp(100), meridian_core::TxnId::LOAD));
        assert!(!taken_at(chain, Timestamp(100), writer));
        assert_eq!(pending_of(chain).map(|v| v.writer), Some(writer));
    }

    /// Whether the map is full, and so the floor, depends on live stamps only: two replicas
    /// that swept dead stamps at different times make the same decisions.
    #[test]
    fn dead_stamps_never_fill_the_map() {
        let mut swept = ReadStamps::new(2);
        let mut unswept = ReadStamps::new(2);
        for stamps in [&mut swept, &mut unswept] {
            stamps.note_read(&key(1), Timestamp(STAMP_SWEEP_NS + 10)); // dead past that
            stamps.note_read(&key(2), Timestamp(STAMP_SWEEP_NS + 50));
        }
        swept.forget_below(Timestamp(STAMP_SWEEP_NS + 20)); // a sweep: key 1 goes
        unswept.forget_below(Timestamp(STAMP_SWEEP_NS)); // a sweep: key 1 still lives
        unswept.forget_below(Timestamp(STAMP_SWEEP_NS + 20)); // too soon for another
        assert_eq!((swept.len(), unswept.len()), (1, 2));
        for stamps in [&mut swept, &mut unswept] {
            stamps.note_read(&key(3), Timestamp(STAMP_SWEEP_NS + 60));
            assert_eq!(stamps.stamp_of(&key(9)), Timestamp::ZERO, "no flush into the floor");
            assert_eq!(stamps.stamp_of(&key(3)), Timestamp(STAMP_SWEEP_NS + 60));
        }
        assert_eq!(swept.image().keys, unswept.image().keys);
    }
}
