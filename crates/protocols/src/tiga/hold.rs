//! A Tiga server's hold queue (Tiga §3.2–3.3): transactions wait here, ordered by timestamp,
//! until the server's clock passes their timestamp; then they are released in timestamp order.
//!
//! **Arrival check.** The server remembers, per key, the timestamp of the last released
//! transaction that read it and of the last that wrote it. A transaction may enter only if its
//! timestamp is above those of every released transaction it conflicts with (a write conflicts
//! with reads and writes of the key, a read with writes); otherwise releasing it would break
//! timestamp order. A leader then *bumps* it just above the largest such timestamp; a follower
//! does not (its answer must match the leader's, so it waits for the leader's log instead) and
//! the caller is told the transaction is late.
//!
//! **Release.** Walking the queue in timestamp order up to the clock, an entry is released when
//! it is *ready* (in preventive mode, once its shard leaders agreed on its timestamp) and no
//! earlier entry that is still held conflicts with it. Entries that do not conflict pass a
//! held one, so one slow agreement does not stall unrelated keys.
//!
//! **Bounds.** At most `held_max` entries wait ([`Arrival::Full`] otherwise); the per-key
//! release stamps are forgotten, oldest first, once more than `keys_max` keys have one, and a
//! key without a stamp counts as released at the highest forgotten stamp (the floor). That is
//! conservative: a transaction may be bumped or found late more often, never released out of
//! order.
//!
//! Invariants (asserted): releases leave in timestamp order per key (entries with equal
//! timestamps in transaction-id order: the log's order is the pair). An arriving entry must be
//! strictly above the stamps it conflicts with, since a stamp does not say which transaction
//! id it belonged to.

use meridian_core::key::Key;
use meridian_core::{Time, Timestamp, TxnId};
use std::collections::{BTreeMap, BTreeSet};

/// What happened to an arriving transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Held at its own timestamp.
    Held(Timestamp),
    /// Held at a later timestamp than it came with (leaders only).
    Bumped(Timestamp),
    /// Not held: a conflicting transaction with this timestamp or later was already released
    /// (followers; the leader's log decides its place).
    Late(Timestamp),
    /// Already held (a duplicate): nothing changed; its current timestamp.
    Duplicate(Timestamp),
    /// The queue holds `held_max` entries.
    Full,
}

/// One held transaction.
#[derive(Clone, Debug)]
struct Held<T> {
    reads: Vec<Key>,
    writes: Vec<Key>,
    /// Digests of `reads` and `writes`: the release walk compares these (a collision only
    /// holds an entry back a little longer, never lets one pass).
    read_digests: Vec<u64>,
    write_digests: Vec<u64>,
    ready: bool,
    payload: T,
}

/// Entries the release walk picked, by (timestamp, transaction).
type Picked = Vec<(Timestamp, TxnId)>;

/// A key's digest for the release walk (a fixed hasher: the same on every run).
fn digest(key: &Key) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = meridian_core::hash::FnvHasher::default();
    key.hash(&mut hasher);
    hasher.finish()
}

/// Records a release at `ts` of a transaction reading `reads` and writing `writes` in the
/// queue's per-key stamps (a function of the two maps, so a caller may hold a queue entry).
fn stamp(
    last_read: &mut BTreeMap<Key, Timestamp>,
    last_write: &mut BTreeMap<Key, Timestamp>,
    ts: Timestamp,
    reads: &[Key],
    writes: &[Key],
) {
    for (stamps, keys) in [(last_read, reads), (last_write, writes)] {
        for key in keys {
            // Looked up first: a key already stamped is not cloned (this runs on every release).
            match stamps.get_mut(key) {
                Some(stamp) => *stamp = (*stamp).max(ts),
                None => {
                    stamps.insert(key.clone(), ts);
                }
            }
        }
    }
}

/// Release stamps as a checkpoint keeps them: the last released read and write per key, and
/// the floor below which forgotten stamps lie.
pub type Stamps = (Vec<(Key, Timestamp)>, Vec<(Key, Timestamp)>, Timestamp);

/// A transaction arriving at the queue.
#[derive(Clone, Debug)]
pub struct Arriving<T> {
    /// The transaction.
    pub txn: TxnId,
    /// The timestamp its coordinator gave it.
    pub ts: Timestamp,
    /// Keys it reads on this shard.
    pub reads: Vec<Key>,
    /// Keys it writes on this shard.
    pub writes: Vec<Key>,
    /// What the caller holds with it.
    pub payload: T,
}

/// A released transaction.
#[derive(Clone, Debug, PartialEq)]
pub struct Released<T> {
    /// The transaction.
    pub txn: TxnId,
    /// The timestamp it was released at.
    pub ts: Timestamp,
    /// The keys it writes.
    pub writes: Vec<Key>,
    /// What the caller held with it.
    pub payload: T,
}

/// The hold queue of one replica of one shard.
#[derive(Debug)]
pub struct HoldQueue<T> {
    queue: BTreeMap<(Timestamp, TxnId), Held<T>>,
    at: BTreeMap<TxnId, Timestamp>,
    last_read: BTreeMap<Key, Timestamp>,
    last_write: BTreeMap<Key, Timestamp>,
    /// Stamps at or below this were forgotten: a key without one counts as released here.
    floor: Timestamp,
    /// A restarted leader's re-held proposals: an arrival touching one of these keys at or
    /// below its timestamp counts as late (see [`HoldQueue::restore`]). Arrivals only: the
    /// release order is checked against real stamps.
    reserved: BTreeMap<Key, Timestamp>,
    held_max: usize,
    keys_max: usize,
    /// The last [`HoldQueue::release`] walked every due entry and found none to release: until
    /// the queue changes or the clock reaches this (the next entry it did not walk), another
    /// walk would find none either. (The walk runs on every event and covers every due entry,
    /// those waiting for agreement included.)
    idle_until: Option<Timestamp>,
}

impl<T> HoldQueue<T> {
    /// An empty queue holding at most `held_max` entries and release stamps for about
    /// `keys_max` keys.
    pub fn new(held_max: usize, keys_max: usize) -> Self {
        assert!(held_max >= 1 && keys_max >= 1, "a hold queue needs room");
        Self {
            queue: BTreeMap::new(),
            at: BTreeMap::new(),
            last_read: BTreeMap::new(),
            last_write: BTreeMap::new(),
            floor: Timestamp::ZERO,
            reserved: BTreeMap::new(),
            held_max,
            keys_max,
            idle_until: None,
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The earliest timestamp held later than `now`: when the next entry comes due.
    pub fn next_due_after(&self, now: Time) -> Option<Timestamp> {
        let first = TxnId { origin: meridian_core::NodeId(0), incarnation: 0, seq: 0 };
        let after = (Timestamp(now.checked_add(1)?), first);
        self.queue.range(after..).next().map(|(&(ts, _), _)| ts)
    }

    /// The earliest timestamp held, if any.
    pub fn earliest(&self) -> Option<Timestamp> {
        self.queue.keys().next().map(|&(ts, _)| ts)
    }

    /// Where `txn` is held, if it is.
    pub fn timestamp_of(&self, txn: TxnId) -> Option<Timestamp> {
        self.at.get(&txn).copied()
    }

    /// The highest stamp of a released transaction that conflicts with reading `reads` and
    /// writing `writes`, counting forgotten stamps as the floor.
    pub fn released_conflict(&self, reads: &[Key], writes: &[Key]) -> Timestamp {
        let reserved = reads.iter().chain(writes).filter_map(|k| self.reserved.get(k)).max();
        let reserved = reserved.copied().unwrap_or(Timestamp::ZERO);
        self.remembered_conflict(reads, writes).max(self.floor).max(reserved)
    }

    /// A restarted leader: records a release at `ts` found in its journal (the stamps its
    /// log left), keeping the bound on remembered stamps.
    pub fn stamp_released(&mut self, ts: Timestamp, reads: &[Key], writes: &[Key]) {
        stamp(&mut self.last_read, &mut self.last_write, ts, reads, writes);
        if self.last_read.len() + self.last_write.len() > self.keys_max {
            self.forget_oldest_stamps();
        }
    }

    /// A restarted leader: holds a transaction it had proposed `ts` for before it crashed,
    /// exactly there and not ready (its agreement decides), whatever the stamps say: it was
    /// held there or moved later, and its peers kept that proposal. Its keys are reserved at
    /// `ts`, so nothing that arrives now lands below it on them: a detective leader may have
    /// answered with a run at `ts` that must stand. False when the queue is full or it is
    /// held already.
    pub fn restore(&mut self, arriving: Arriving<T>) -> bool {
        if self.at.contains_key(&arriving.txn) || self.queue.len() >= self.held_max {
            return false;
        }
        for key in arriving.reads.iter().chain(&arriving.writes) {
            let at = self.reserved.entry(key.clone()).or_insert(arriving.ts);
            *at = (*at).max(arriving.ts);
        }
        self.insert(arriving, false);
        true
    }

    /// The same over the stamps still remembered (the floor left out): what the release order
    /// is checked against, since the floor may rise past entries admitted before it rose.
    fn remembered_conflict(&self, reads: &[Key], writes: &[Key]) -> Timestamp {
        let stamp = |map: &BTreeMap<Key, Timestamp>, key: &Key| {
            map.get(key).copied().unwrap_or(Timestamp::ZERO)
        };
        let after_writes = reads.iter().chain(writes).map(|k| stamp(&self.last_write, k));
        let after_reads = writes.iter().map(|k| stamp(&self.last_read, k));
        after_writes.chain(after_reads).max().unwrap_or(Timestamp::ZERO)
    }

    /// The release stamps remembered (reads, writes) and the floor below which forgotten ones
    /// lie: what a leader's checkpoint keeps.
    pub fn stamps(&self) -> Stamps {
        let list =
            |map: &BTreeMap<Key, Timestamp>| map.iter().map(|(k, &t)| (k.clone(), t)).collect();
        (list(&self.last_read), list(&self.last_write), self.floor)
    }

    /// A leader restarted from a checkpoint: takes up the stamps [`HoldQueue::stamps`] gave
    /// (raising, never lowering, what is here), keeping the bound on remembered stamps.
    pub fn restore_stamps(
        &mut self,
        reads: Vec<(Key, Timestamp)>,
        writes: Vec<(Key, Timestamp)>,
        floor: Timestamp,
    ) {
        self.floor = self.floor.max(floor);
        for (map, stamps) in [(&mut self.last_read, reads), (&mut self.last_write, writes)] {
            for (key, ts) in stamps {
                let stamp = map.entry(key).or_insert(ts);
                *stamp = (*stamp).max(ts);
            }
        }
        if self.last_read.len() + self.last_write.len() > self.keys_max {
            self.forget_oldest_stamps();
        }
    }

    /// Counts every key as released up to `ts` at least: a replica that rejoined by a state
    /// transfer forgot the stamps of what it did not run itself.
    pub fn raise_floor(&mut self, ts: Timestamp) {
        self.floor = self.floor.max(ts);
    }

    /// A transaction arrives. `bump`: this replica leads and moves a late transaction past the
    /// conflicts instead of refusing it. `ready`: it may be released once its time comes
    /// (otherwise [`HoldQueue::set_ready`] later).
    pub fn arrive(&mut self, arriving: Arriving<T>, bump: bool, ready: bool) -> Arrival {
        let Arriving { txn, ts, reads, writes, payload } = arriving;
        if let Some(&held) = self.at.get(&txn) {
            return Arrival::Duplicate(held);
        }
        if self.queue.len() >= self.held_max {
            return Arrival::Full;
        }
        let conflict = self.released_conflict(&reads, &writes);
        let (at, arrival) = if ts > conflict {
            (ts, Arrival::Held(ts))
        } else if bump {
            let bumped = Timestamp(conflict.0.saturating_add(1));
            (bumped, Arrival::Bumped(bumped))
        } else {
            return Arrival::Late(conflict);
        };
        self.insert(Arriving { txn, ts: at, reads, writes, payload }, ready);
        arrival
    }

    /// Holds `arriving` at its timestamp, whatever the stamps say (the callers checked).
    fn insert(&mut self, arriving: Arriving<T>, ready: bool) {
        let Arriving { txn, ts, reads, writes, payload } = arriving;
        self.at.insert(txn, ts);
        let read_digests = reads.iter().map(digest).collect();
        let write_digests = writes.iter().map(digest).collect();
        let held = Held { reads, writes, read_digests, write_digests, ready, payload };
        self.queue.insert((ts, txn), held);
        self.idle_until = None;
    }

    /// Marks `txn` ready (or not) for release. False when it is not held.
    pub fn set_ready(&mut self, txn: TxnId, ready: bool) -> bool {
        let Some(&at) = self.at.get(&txn) else { return false };
        let held = self.queue.get_mut(&(at, txn)).expect("`at` and `queue` agree");
        held.ready = ready;
        self.idle_until = None;
        true
    }

    /// Moves `txn` to a later timestamp (the leaders agreed on a larger one). False when it is
    /// not held or `ts` is not later than where it is.
    pub fn reposition(&mut self, txn: TxnId, ts: Timestamp) -> bool {
        let Some(&at) = self.at.get(&txn) else { return false };
        if ts <= at {
            return false;
        }
        let held = self.queue.remove(&(at, txn)).expect("`at` and `queue` agree");
        self.at.insert(txn, ts);
        self.queue.insert((ts, txn), held);
        self.idle_until = None;
        true
    }

    /// Takes `txn` out without releasing it (its coordinator gave up, a view change).
    pub fn remove(&mut self, txn: TxnId) -> Option<T> {
        let at = self.at.remove(&txn)?;
        self.idle_until = None;
        self.queue.remove(&(at, txn)).map(|held| held.payload)
    }

    /// A follower's leader logged a transaction touching `keys` (read or written) and
    /// writing `writes` at `(ts, txn)`: drops the held entries below it that conflict with
    /// it (the leader's log holds conflicting entries in timestamp order, so it will not hold
    /// them there), and returns them. Bounded by the entries held below `ts`.
    pub fn drop_conflicting_below(
        &mut self,
        ts: Timestamp,
        txn: TxnId,
        keys: &[Key],
        writes: &[Key],
    ) -> Vec<TxnId> {
        let conflicts = |held: &Held<T>| {
            writes.iter().any(|k| held.reads.contains(k) || held.writes.contains(k))
                || keys.iter().any(|k| held.writes.contains(k))
        };
        let below: Vec<(Timestamp, TxnId)> = self
            .queue
            .range(..(ts, txn))
            .filter(|(_, held)| conflicts(held))
            .map(|(&at, _)| at)
            .collect();
        for &(at, gone) in &below {
            self.queue.remove(&(at, gone));
            self.at.remove(&gone);
            self.idle_until = None;
        }
        below.into_iter().map(|(_, gone)| gone).collect()
    }

    /// Takes every held entry out, in timestamp order, keeping the stamps.
    pub fn drain(&mut self) -> Vec<(TxnId, T)> {
        self.at.clear();
        self.reserved.clear();
        self.idle_until = None;
        std::mem::take(&mut self.queue).into_iter().map(|((_, txn), h)| (txn, h.payload)).collect()
    }

    /// Every key counts as released up to this: the floor and the largest stamp. Goes over
    /// every stamp.
    pub fn ts_high(&self) -> Timestamp {
        let stamps = self.last_read.values().chain(self.last_write.values());
        stamps.copied().fold(self.floor, Timestamp::max)
    }

    /// [`HoldQueue::remove`], with the keys it writes.
    pub fn remove_writing(&mut self, txn: TxnId) -> Option<(Vec<Key>, T)> {
        let at = self.at.remove(&txn)?;
        self.idle_until = None;
        self.queue.remove(&(at, txn)).map(|held| (held.writes, held.payload))
    }

    /// What `txn` is held with, if it is.
    pub fn payload(&self, txn: TxnId) -> Option<&T> {
        let at = self.at.get(&txn)?;
        self.queue.get(&(*at, txn)).map(|held| &held.payload)
    }

    /// Detective mode: [`HoldQueue::release`], and also the entries that would be released
    /// now if they were ready (due, not ready, no earlier held entry conflicting), in
    /// timestamp order, none that `done` says was taken already; at most `max` of both
    /// together. Those stay held (and keep holding conflicting later entries back), but
    /// their keys are stamped as if released: a conflicting transaction arriving later is
    /// found late (bumped at a leader), so what runs at the entry's timestamp now is what
    /// will run there if the timestamp holds.
    pub fn release_speculating(
        &mut self,
        now: Time,
        max: usize,
        done: impl Fn(TxnId) -> bool,
    ) -> (Vec<Released<T>>, Vec<(TxnId, Timestamp)>) {
        let (due, speculate) = self.pick_due(now, max, Some(&done));
        let released = self.take_released(due);
        for at in &speculate {
            let held = &self.queue[at];
            stamp(&mut self.last_read, &mut self.last_write, at.0, &held.reads, &held.writes);
        }
        if self.last_read.len() + self.last_write.len() > self.keys_max {
            self.forget_oldest_stamps();
        }
        (released, speculate.into_iter().map(|(ts, txn)| (txn, ts)).collect())
    }

    /// The due entries (timestamp at or below `now`) that no earlier held entry conflicts
    /// with, in timestamp order, at most `max` of them: the ready ones to release, and with
    /// `speculate`, the others it does not say are done (they stay held). Bounded by the queue
    /// (at most `held_max` entries). One walk serves both, since it runs on every event.
    fn pick_due(
        &self,
        now: Time,
        max: usize,
        speculate: Option<&dyn Fn(TxnId) -> bool>,
    ) -> (Picked, Picked) {
        let mut blocked_reads: BTreeSet<u64> = BTreeSet::new();
        let mut blocked_writes: BTreeSet<u64> = BTreeSet::new();
        let (mut due, mut speculative) = (Vec::new(), Vec::new());
        for ((ts, txn), held) in self.queue.iter().take_while(|((ts, _), _)| ts.0 <= now) {
            if due.len() + speculative.len() >= max {
                break;
            }
            let crosses = held.write_digests.iter().any(|k| blocked_reads.contains(k))
                || (held.read_digests.iter().chain(&held.write_digests))
                    .any(|k| blocked_writes.contains(k));
            if held.ready && !crosses {
                due.push((*ts, *txn));
                continue;
            }
            if !held.ready && !crosses && speculate.is_some_and(|done| !done(*txn)) {
                speculative.push((*ts, *txn));
            }
            blocked_reads.extend(&held.read_digests);
            blocked_writes.extend(&held.write_digests);
        }
        (due, speculative)
    }

    /// Releases, in timestamp order, every ready entry with a timestamp at or below `now`
    /// that no earlier held entry conflicts with, at most `max` of them.
    pub fn release(&mut self, now: Time, max: usize) -> Vec<Released<T>> {
        if self.idle_until.is_some_and(|until| now < until.0) {
            debug_assert!(self.pick_due(now, max, None).0.is_empty(), "idle, yet one is due");
            return Vec::new();
        }
        let (due, _) = self.pick_due(now, max, None);
        if due.is_empty() {
            self.idle_until = Some(self.next_due_after(now).unwrap_or(Timestamp::MAX));
        }
        self.take_released(due)
    }

    /// Takes `due` out of the queue, stamping their keys.
    fn take_released(&mut self, due: Picked) -> Vec<Released<T>> {
        let released: Vec<Released<T>> = due
            .into_iter()
            .map(|(ts, txn)| {
                let held = self.queue.remove(&(ts, txn)).expect("just seen");
                self.at.remove(&txn);
                self.idle_until = None;
                // Equal timestamps of one batch leave in transaction-id order (the queue's).
                debug_assert!(
                    ts >= self.remembered_conflict(&held.reads, &held.writes),
                    "{txn} released at {ts:?} after a conflicting later release"
                );
                stamp(&mut self.last_read, &mut self.last_write, ts, &held.reads, &held.writes);
                Released { txn, ts, writes: held.writes, payload: held.payload }
            })
            .collect();
        if self.last_read.len() + self.last_write.len() > self.keys_max {
            self.forget_oldest_stamps();
        }
        released
    }

    /// Forgets the older half of the release stamps and raises the floor to the newest stamp
    /// forgotten (amortised: each sweep halves what it walks).
    fn forget_oldest_stamps(&mut self) {
        let mut stamps: Vec<Timestamp> =
            self.last_read.values().chain(self.last_write.values()).copied().collect();
        let middle = stamps.len() / 2;
        let (_, &mut cutoff, _) = stamps.select_nth_unstable(middle);
        self.last_read.retain(|_, ts| *ts > cutoff);
        self.last_write.retain(|_, ts| *ts > cutoff);
        self.floor = self.floor.max(cutoff);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::NodeId;

    fn txn(seq: u64) -> TxnId {
        TxnId { origin: NodeId(9), incarnation: 1, seq }
    }

    fn key(k: u64) -> Key {
        Key::table(1).u64(k).build()
    }

    /// Transaction `seq` (its payload too) at `ts`.
    fn a(seq: u64, ts: u64, reads: Vec<Key>, writes: Vec<Key>) -> Arriving<u64> {
        Arriving { txn: txn(seq), ts: Timestamp(ts), reads, writes, payload: seq }
    }

    fn ids(released: &[Released<u64>]) -> Vec<u64> {
        released.iter().map(|r| r.payload).collect()
    }

    #[test]
    fn entries_wait_for_the_clock_and_leave_in_timestamp_order() {
        let mut q = HoldQueue::new(16, 64);
        assert_eq!(
            q.arrive(a(1, 30, vec![key(1)], vec![]), false, true),
            Arrival::Held(Timestamp(30))
        );
        assert_eq!(
            q.arrive(a(2, 10, vec![], vec![key(1)]), false, true),
            Arrival::Held(Timestamp(10))
        );
        assert_eq!(
            q.arrive(a(2, 10, vec![], vec![key(1)]), false, true),
            Arrival::Duplicate(Timestamp(10))
        );
        assert!(q.release(9, 16).is_empty(), "the clock has not reached either");
        assert_eq!(ids(&q.release(30, 16)), vec![2, 1]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_late_transaction_is_bumped_by_a_leader_and_refused_by_a_follower() {
        let mut leader = HoldQueue::new(16, 64);
        let mut follower = HoldQueue::new(16, 64);
        for q in [&mut leader, &mut follower] {
            q.arrive(a(1, 50, vec![], vec![key(1)]), false, true);
            assert_eq!(q.release(50, 16).len(), 1);
        }
        // A read of the written key at 40 would read the past: a leader moves it to 51.
        assert_eq!(
            leader.arrive(a(2, 40, vec![key(1)], vec![]), true, true),
            Arrival::Bumped(Timestamp(51))
        );
        assert_eq!(
            follower.arrive(a(2, 40, vec![key(1)], vec![]), false, true),
            Arrival::Late(Timestamp(50))
        );
        // Another key does not conflict.
        assert_eq!(
            follower.arrive(a(3, 40, vec![key(2)], vec![]), false, true),
            Arrival::Held(Timestamp(40))
        );
        // Reads do not conflict with reads; a write after a released read must be later.
        follower.release(40, 16);
        assert_eq!(
            follower.arrive(a(4, 20, vec![key(2)], vec![]), false, true),
            Arrival::Held(Timestamp(20))
        );
        assert_eq!(
            follower.arrive(a(5, 20, vec![], vec![key(2)]), false, true),
            Arrival::Late(Timestamp(40))
        );
    }

    /// A walk that releases nothing is not repeated until the queue changes or the clock
    /// reaches an entry it did not walk; every change counts.
    #[test]
    fn an_idle_walk_is_skipped_only_while_nothing_it_saw_changed() {
        let mut q = HoldQueue::new(16, 64);
        q.arrive(a(1, 10, vec![], vec![key(1)]), false, false);
        q.arrive(a(2, 20, vec![key(1)], vec![]), false, true);
        assert!(q.release(25, 16).is_empty(), "1 waits for its agreement, 2 behind it");
        assert_eq!(q.idle_until, Some(Timestamp::MAX));
        assert!(q.release(1_000, 16).is_empty());
        assert!(q.set_ready(txn(1), true));
        assert_eq!(ids(&q.release(25, 16)), vec![1, 2], "readiness counts");
        q.arrive(a(3, 50, vec![], vec![key(2)]), false, true);
        q.arrive(a(4, 40, vec![], vec![key(2)]), false, false);
        assert!(q.release(45, 16).is_empty());
        assert_eq!(q.idle_until, Some(Timestamp(50)), "3 was not walked");
        assert!(q.release(49, 16).is_empty());
        assert!(q.release(60, 16).is_empty(), "3 is due, behind 4");
        assert_eq!(q.remove(txn(4)), Some(4));
        assert_eq!(ids(&q.release(60, 16)), vec![3], "a removal counts");
        q.arrive(a(5, 70, vec![], vec![key(3)]), false, false);
        assert!(q.release(80, 16).is_empty());
        assert!(q.reposition(txn(5), Timestamp(90)));
        q.arrive(a(6, 75, vec![key(3)], vec![]), false, true);
        assert_eq!(ids(&q.release(80, 16)), vec![6], "a move and an arrival count");
    }

    #[test]
    fn a_held_entry_that_is_not_ready_blocks_only_conflicting_later_ones() {
        let mut q = HoldQueue::new(16, 64);
        q.arrive(a(1, 10, vec![], vec![key(1)]), false, false);
        q.arrive(a(2, 20, vec![key(1)], vec![]), false, true);
        q.arrive(a(3, 30, vec![key(2)], vec![key(3)]), false, true);
        assert_eq!(ids(&q.release(100, 16)), vec![3], "2 reads what 1 writes; 3 is unrelated");
        assert!(q.set_ready(txn(1), true));
        assert_eq!(ids(&q.release(100, 16)), vec![1, 2]);
    }

    #[test]
    fn equal_timestamps_leave_in_transaction_order_and_close_the_key_behind_them() {
        let mut q = HoldQueue::new(16, 64);
        q.arrive(a(2, 50, vec![], vec![key(1)]), false, true);
        q.arrive(a(1, 50, vec![key(1)], vec![]), false, true);
        assert_eq!(ids(&q.release(50, 16)), vec![1, 2]);
        let late = q.arrive(a(3, 50, vec![key(1)], vec![]), false, true);
        assert_eq!(late, Arrival::Late(Timestamp(50)));
    }

    /// Random arrivals (leaders bump, followers refuse), readiness, repositions and clock
    /// steps: per key, writes leave in increasing timestamp order and no read leaves below a
    /// write already released on its key, nor a write below a released read; nothing leaves
    /// before the clock reaches it, and every ready entry leaves once the clock passes all.
    #[test]
    fn random_schedules_release_in_timestamp_order_per_key() {
        use meridian_core::rng::{child_rng, uniform_u64};
        for seed in 0..200 {
            let mut rng = child_rng(seed, "hold-queue", 0);
            let bump = seed % 2 == 0;
            let mut q = HoldQueue::new(8, 6);
            let mut now = 0u64;
            let mut last_write: BTreeMap<Key, Timestamp> = BTreeMap::new();
            let mut last_read: BTreeMap<Key, Timestamp> = BTreeMap::new();
            let mut held: Vec<u64> = Vec::new();
            for step in 0..300u64 {
                match uniform_u64(&mut rng, 4) {
                    0 | 1 => {
                        let ts = now + uniform_u64(&mut rng, 40);
                        let k = |rng: &mut _| key(uniform_u64(rng, 5));
                        let (reads, writes) = (vec![k(&mut rng)], vec![k(&mut rng)]);
                        let ready = uniform_u64(&mut rng, 3) > 0;
                        let arrival = q.arrive(a(step, ts, reads, writes), bump, ready);
                        if matches!(arrival, Arrival::Held(_) | Arrival::Bumped(_)) {
                            held.push(step);
                        }
                        assert!(bump || !matches!(arrival, Arrival::Bumped(_)));
                    }
                    2 => {
                        if let Some(&seq) = held.get(uniform_u64(&mut rng, 8) as usize) {
                            q.set_ready(txn(seq), true);
                            let later = Timestamp(now + 40 + uniform_u64(&mut rng, 20));
                            if uniform_u64(&mut rng, 2) == 0 {
                                q.reposition(txn(seq), later);
                            }
                        }
                    }
                    _ => now += uniform_u64(&mut rng, 15),
                }
                let before = q.queue.clone();
                for released in q.release(now, 16) {
                    assert!(released.ts.0 <= now, "seed {seed}: left before its time");
                    held.retain(|&s| s != released.payload);
                    let entry = &before[&(released.ts, released.txn)];
                    for k in &entry.writes {
                        let w = last_write.get(k).copied().unwrap_or(Timestamp::ZERO);
                        let r = last_read.get(k).copied().unwrap_or(Timestamp::ZERO);
                        assert!(released.ts >= w && released.ts >= r, "seed {seed}: write order");
                        last_write.insert(k.clone(), released.ts);
                    }
                    for k in &entry.reads {
                        let w = last_write.get(k).copied().unwrap_or(Timestamp::ZERO);
                        assert!(released.ts >= w, "seed {seed}: a read below a released write");
                        let r = last_read.entry(k.clone()).or_insert(released.ts);
                        *r = (*r).max(released.ts);
                    }
                }
            }
            for &seq in &held {
                q.set_ready(txn(seq), true);
            }
            q.release(u64::MAX, usize::MAX);
            assert!(q.is_empty(), "seed {seed}: everything ready leaves");
        }
    }

    #[test]
    fn repositioning_moves_an_entry_later_and_never_earlier() {
        let mut q = HoldQueue::new(16, 64);
        q.arrive(a(1, 10, vec![], vec![key(1)]), false, true);
        q.arrive(a(2, 20, vec![], vec![key(1)]), false, true);
        assert!(!q.reposition(txn(1), Timestamp(5)));
        assert!(q.reposition(txn(1), Timestamp(25)));
        assert_eq!(q.timestamp_of(txn(1)), Some(Timestamp(25)));
        assert_eq!(ids(&q.release(100, 16)), vec![2, 1]);
        assert_eq!(q.remove(txn(1)), None, "released already");
    }

    #[test]
    fn the_queue_is_bounded_and_forgotten_stamps_stay_conservative() {
        let mut q = HoldQueue::new(2, 4);
        q.arrive(a(1, 10, vec![], vec![key(1)]), false, true);
        q.arrive(a(2, 20, vec![], vec![key(2)]), false, true);
        assert_eq!(q.arrive(a(3, 30, vec![], vec![key(3)]), false, true), Arrival::Full);
        q.release(20, 16);
        for k in 3..8 {
            q.arrive(a(k, 10 * k, vec![], vec![key(k)]), false, true);
            q.release(10 * k, 16);
        }
        assert!(q.last_read.len() + q.last_write.len() <= 4, "stamps forgotten");
        // Key 1's stamp (10) was forgotten, and the floor stands in for it: a write to key 1
        // at 15 is late even though only 10 was released there.
        assert!(q.floor >= Timestamp(20));
        assert!(matches!(q.arrive(a(9, 15, vec![], vec![key(1)]), false, true), Arrival::Late(_)));
    }

    #[test]
    fn speculation_takes_due_unready_entries_once_and_stamps_their_keys() {
        let mut q = HoldQueue::new(16, 64);
        // 1 (not ready) writes key 1 at 10; 2 (not ready) reads key 1 at 20, behind it;
        // 3 (not ready) on key 2 at 30; 4 (ready) on key 3 at 15.
        q.arrive(a(1, 10, vec![], vec![key(1)]), true, false);
        q.arrive(a(2, 20, vec![key(1)], vec![]), true, false);
        q.arrive(a(3, 30, vec![], vec![key(2)]), true, false);
        q.arrive(a(4, 15, vec![], vec![key(3)]), true, true);
        assert_eq!(ids(&q.release(25, 8)), vec![4]);
        let (released, taken) = q.release_speculating(25, 8, |_| false);
        assert!(released.is_empty());
        assert_eq!(taken, vec![(txn(1), Timestamp(10))], "2 waits behind 1; 3 is not due");
        assert_eq!(q.len(), 3, "speculated entries stay held");
        assert_eq!(q.payload(txn(1)), Some(&1));
        // A conflicting late arrival below the speculated timestamp is bumped past it.
        assert_eq!(
            q.arrive(a(5, 5, vec![key(1)], vec![]), true, true),
            Arrival::Bumped(Timestamp(11))
        );
        // Taken once: `done` skips it; the entry behind it still waits.
        assert_eq!(q.release_speculating(25, 8, |t| t == txn(1)), (Vec::new(), Vec::new()));
        // 1 becomes ready and leaves at its timestamp, and 5 (a reader, as 2 is) after it; 2
        // then speculates.
        q.set_ready(txn(1), true);
        assert_eq!(ids(&q.release(25, 8)), vec![1, 5]);
        let (released, taken) = q.release_speculating(25, 8, |_| false);
        assert!(released.is_empty());
        assert_eq!(taken, vec![(txn(2), Timestamp(20))]);
        let (_, taken) = q.release_speculating(40, 1, |t| t == txn(2));
        assert_eq!(taken, vec![(txn(3), Timestamp(30))]);
        // One walk releases what is ready and takes what is not: 6 (ready, another key) and
        // 7 (not ready) at 50.
        q.arrive(a(6, 50, vec![], vec![key(6)]), true, true);
        q.arrive(a(7, 50, vec![], vec![key(7)]), true, false);
        let (released, taken) = q.release_speculating(50, 8, |t| t != txn(7));
        assert_eq!(ids(&released), vec![6]);
        assert_eq!(taken, vec![(txn(7), Timestamp(50))]);
    }
}
