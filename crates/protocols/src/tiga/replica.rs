//! One replica of one Tiga shard, from a transaction's arrival to its replies (Tiga §3.2–3.7),
//! as a sans-IO core for the protocol node to drive: it composes the hold queue
//! ([`super::hold`]), the leaders' timestamp agreement ([`super::agree`]), the log and its
//! synchronisation ([`super::log`]) and the per-key hashes ([`super::quorum`]), and says what
//! to do as [`Action`]s. Running a procedure on the store and sending messages are the node's.
//!
//! - **Arrival.** The leader holds a transaction at its timestamp or bumps it past released
//!   conflicts; a follower holds it or, when late, leaves its place to the leader's log.
//! - **Agreement** (preventive mode, multi-shard transactions, leaders only). The leader
//!   proposes where it holds the transaction; proposals and confirmations that arrive first
//!   are kept. Once every proposal is in: case 1 releases, case 2 waits for the confirmations
//!   of the smaller proposers, case 3 moves the transaction to the agreed timestamp and
//!   confirms. Until then the entry is held *not ready*, so conflicting later transactions wait
//!   behind it (that is what keeps the order across shards).
//! - **Release** (when the clock passes an entry): the leader appends it to its log, adds it
//!   to the key hashes and is told to execute it, then to reply fast; a follower adds it to its
//!   unsynced tail and the hashes and replies fast.
//! - **Synchronisation** (followers): the leader's log entries join the synced prefix; an entry
//!   released here at another timestamp is retimed (its hash contribution moves with it), one
//!   still held here leaves the hold queue for the leader's place, one never received is
//!   fetched; each entry reaching the sync-point earns a slow reply.
//!
//! Bounds: the hold queue's (`held_max`, `keys_max`), the follower's tail (`tail_max`), open
//! agreements (`agreements_max`: proposals beyond it are dropped; a coordinator's retry of a
//! held transaction makes its leader say its proposal and confirmation again, and a leader
//! answers a proposal for a transaction it released with its timestamp and a confirmation;
//! an agreement for a transaction that never arrives stays until the node calls
//! [`Replica::forget`]), releases per tick (`release_max`). Messages naming shards outside
//! the cluster or not from another participant are dropped before they open anything.
//!
//! At most once: a transaction in this replica's log (released, or listed by the leader) is
//! never held or released again; a retry of it arrives to nothing (the node answers from what
//! it recorded).
//!
//! **Detective mode** ([`Replica::with_detective`], leaders): a multi-shard transaction that
//! is due and held only by its agreement is run speculatively once ([`Action::Speculate`]);
//! it stays held, its keys stamped as if released (a conflicting arrival below it is bumped
//! past it). If the agreement moves it, [`Action::Revoke`] comes before the confirmation;
//! otherwise it is released where it ran and what ran stands.
//!
//! **View change** (the parts a replica plays; the nodes do not drive them yet): a follower
//! reports its log ([`Replica::report`]); one promoted to lead the new view takes the log
//! rebuilt from `f + 1` reports ([`Replica::promote`]). For the merge to need no keys of
//! entries a follower dropped, a follower keeps its tail consistent with its synced prefix:
//! an entry joining the prefix supersedes the conflicting tail entries below it, and counts
//! as released on its keys (nothing conflicting is then held or released below it).

use super::agree::{Agreement, Verdict};
use super::hold::{Arrival, Arriving, HoldQueue, Stamps};
use super::log::{FollowerLog, SYNC_ENTRIES_MAX};
use super::quorum::KeyHashes;
use meridian_core::key::Key;
use meridian_core::{ShardId, Time, Timestamp, TxnId};
use std::collections::{BTreeMap, BTreeSet};

/// What arrives at a replica: the part of a transaction that orders it on this shard.
#[derive(Clone, Debug)]
pub struct Incoming {
    /// The transaction.
    pub txn: TxnId,
    /// The timestamp its coordinator stamped.
    pub ts: Timestamp,
    /// Every participant shard (this one included).
    pub shards: Vec<ShardId>,
    /// Keys it reads on this shard.
    pub reads: Vec<Key>,
    /// Keys it writes on this shard.
    pub writes: Vec<Key>,
}

/// What the replica asks its node to do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Leader: send this shard's proposal for `txn` to the leaders of `to`.
    Propose {
        /// The transaction.
        txn: TxnId,
        /// Where this leader holds it.
        ts: Timestamp,
        /// The other participant shards.
        to: Vec<ShardId>,
    },
    /// Leader: tell the leaders of `to` that this shard moved `txn` to the agreed timestamp.
    Confirm {
        /// The transaction.
        txn: TxnId,
        /// The other participant shards.
        to: Vec<ShardId>,
    },
    /// Leader: `txn` was released at `ts`: run its pieces on the store at `ts` now, before
    /// the fast reply that follows.
    Execute {
        /// The transaction.
        txn: TxnId,
        /// Its timestamp on this shard (the agreed one).
        ts: Timestamp,
    },
    /// Leader, detective mode: `txn` is due at `ts` and only its agreement holds it: run its
    /// pieces there now and reply fast with the result, keeping the writes aside. It stays
    /// held; if the agreed timestamp is `ts`, it is released there ([`Action::Execute`]) and
    /// what ran stands, otherwise [`Action::Revoke`] comes first.
    Speculate {
        /// The transaction.
        txn: TxnId,
        /// Where it is held (this leader's proposal).
        ts: Timestamp,
        /// The hash this replica's log will have over its keys once it is released there.
        hash: u64,
    },
    /// Leader, detective mode: the leaders agreed on a later timestamp than `ts`, where `txn`
    /// ran speculatively: drop what ran; it runs again when released at the agreed one.
    Revoke {
        /// The transaction.
        txn: TxnId,
        /// Where it ran.
        ts: Timestamp,
    },
    /// Reply fast to `txn`'s coordinator: released at `ts`, with this log hash over its keys.
    FastReply {
        /// The transaction.
        txn: TxnId,
        /// Where it was released.
        ts: Timestamp,
        /// The hash of this replica's log over the transaction's keys.
        hash: u64,
    },
    /// Follower: the leader's log holds `txn` at `ts` and this replica's synced prefix reached
    /// it: reply slow to its coordinator.
    SlowReply {
        /// The transaction.
        txn: TxnId,
        /// The leader's timestamp for it.
        ts: Timestamp,
    },
    /// Follower: these tail entries were superseded by a conflicting synced entry above
    /// them (see [`Replica::on_sync`]) and left the tail: the leader's log will not hold
    /// them at these timestamps.
    Superseded {
        /// The transactions, each with the timestamp it was released at here.
        dropped: Vec<(TxnId, Timestamp)>,
    },
    /// Follower: ask the leader for these transactions' bodies.
    Fetch {
        /// The transactions.
        txns: Vec<TxnId>,
    },
    /// Follower: ask the leader to send its log again from position `from`.
    Resend {
        /// The first position wanted.
        from: usize,
    },
}

/// A replica's bounds.
#[derive(Clone, Copy, Debug)]
pub struct ReplicaLimits {
    /// Transactions held at most.
    pub held_max: usize,
    /// Keys with a release stamp (about).
    pub keys_max: usize,
    /// A follower's released transactions not yet listed by its leader.
    pub tail_max: usize,
    /// Agreements open at once at a leader.
    pub agreements_max: usize,
    /// Releases per tick.
    pub release_max: usize,
    /// The cluster's shard count: a message naming a shard at or above it is dropped.
    pub shards_total: u32,
}

/// A leader's log as a checkpoint keeps it ([`Replica::checkpoint_log`]).
#[derive(Clone, Debug, Default)]
pub struct CheckpointedLog {
    /// The position of the first entry kept.
    pub base: usize,
    /// The timestamp of the entry below `base`.
    pub base_ts: Timestamp,
    /// Transactions logged below `base`, at their timestamps.
    pub below: Vec<(TxnId, Timestamp)>,
    /// The entries from `base` on.
    pub entries: Vec<(TxnId, Timestamp)>,
    /// Key hashes over the whole log.
    pub hashes: Vec<(Key, u64)>,
    /// Release stamps: reads, writes, and the floor of forgotten ones.
    pub stamps: Stamps,
}

/// What a leader or follower keeps beyond the shared parts.
#[derive(Debug)]
enum Role {
    Leader {
        /// The shard's log: released transactions in release order, at their timestamps,
        /// from position `base` on (those below were dropped: every follower executed them).
        log: Vec<(TxnId, Timestamp)>,
        /// The position of `log[0]`.
        base: usize,
        /// The timestamp of the last entry dropped (below `base`).
        base_ts: Timestamp,
        /// The transactions in `log`, at their timestamps: released once, never again (a
        /// retry or a late proposal finds them here).
        in_log: BTreeMap<TxnId, Timestamp>,
        /// Multi-shard transactions whose timestamp the leaders have not settled.
        agreements: BTreeMap<TxnId, Agreement>,
        /// Detective mode: held transactions run speculatively, and where.
        speculated: BTreeMap<TxnId, Timestamp>,
    },
    Follower {
        log: FollowerLog,
        /// Keys of released transactions the leader has not listed yet (for retiming).
        tail_keys: BTreeMap<TxnId, Vec<Key>>,
        /// The tail by key: per key, the tail entries touching it, each with whether it
        /// writes the key (see [`Replica::on_sync`]: a synced entry supersedes the
        /// conflicting tail entries below it).
        tail_marks: TailMarks,
        /// Synced entries whose bodies were fetched: where they go in the hashes.
        fetching: BTreeMap<TxnId, Timestamp>,
    },
}

/// One replica of one shard.
#[derive(Debug)]
pub struct Replica {
    shard: ShardId,
    limits: ReplicaLimits,
    /// Held transactions, with every key they touch here (for the hashes).
    hold: HoldQueue<Vec<Key>>,
    hashes: KeyHashes,
    role: Role,
    /// Proposals and confirmations refused for want of room.
    dropped_total: u64,
    /// Detective mode (leaders): multi-shard transactions run before their agreement settles.
    detective: bool,
    /// Follower: held transactions dropped because a conflicting entry above them joined
    /// the synced prefix.
    late_dropped_total: u64,
    /// The last tick stopped at `release_max`: more may be due now.
    capped: bool,
}

/// What a follower reports of its log at a view change (see [`super::recovery`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogReport {
    /// The position of `synced[0]`: the entries below were dropped (every follower had
    /// executed them).
    pub base: usize,
    /// The synced prefix from `base` to the sync-point.
    pub synced: Vec<(TxnId, Timestamp)>,
    /// What it vouched for past the sync-point: the entries its leader listed there whose
    /// bodies are here (in log order), then its tail (in `(timestamp, id)` order).
    pub unsynced: Vec<(TxnId, Timestamp)>,
}

/// The tail by key: `(key, timestamp, id)` of every tail entry on every key it touches, and
/// whether it writes the key. One map, so a release inserts an entry per key and allocates
/// nothing else.
type TailMarks = BTreeMap<(Key, Timestamp, TxnId), bool>;

/// The least transaction id (a range bound).
const TXN_MIN: TxnId = TxnId { origin: meridian_core::NodeId(0), incarnation: 0, seq: 0 };

/// A part's keys as a follower's log needs them: every key it touches (sorted, each once),
/// and the keys it writes (sorted).
pub type PartKeys = (Vec<Key>, Vec<Key>);

/// Enters a tail entry in the marks.
fn mark_tail(marks: &mut TailMarks, txn: TxnId, ts: Timestamp, keys: &[Key], writes: &[Key]) {
    for key in keys {
        marks.insert((key.clone(), ts, txn), writes.binary_search(key).is_ok());
    }
}

/// Takes a tail entry out of the marks; returns the keys it writes.
fn unmark_tail(marks: &mut TailMarks, txn: TxnId, ts: Timestamp, keys: &[Key]) -> Vec<Key> {
    let mut writes = Vec::new();
    for key in keys {
        if marks.remove(&(key.clone(), ts, txn)) == Some(true) {
            writes.push(key.clone());
        }
    }
    writes
}

/// Every key a part reads or writes, sorted, each once: what the hold queue keeps with a
/// transaction and the key hashes walk as it is.
fn part_keys(reads: &[Key], writes: &[Key]) -> Vec<Key> {
    let mut keys = Vec::with_capacity(reads.len() + writes.len());
    keys.extend_from_slice(reads);
    keys.extend_from_slice(writes);
    keys.sort_unstable();
    keys.dedup();
    keys
}

impl Replica {
    /// A replica of `shard`, leading it or not.
    pub fn new(shard: ShardId, leader: bool, limits: ReplicaLimits) -> Self {
        assert!(limits.release_max >= 1 && limits.agreements_max >= 1, "a replica needs room");
        let role = if leader {
            Role::Leader {
                log: Vec::new(),
                base: 0,
                base_ts: Timestamp::ZERO,
                in_log: BTreeMap::new(),
                agreements: BTreeMap::new(),
                speculated: BTreeMap::new(),
            }
        } else {
            Role::Follower {
                log: FollowerLog::new(limits.tail_max),
                tail_keys: BTreeMap::new(),
                tail_marks: BTreeMap::new(),
                fetching: BTreeMap::new(),
            }
        };
        Self {
            shard,
            limits,
            hold: HoldQueue::new(limits.held_max, limits.keys_max),
            hashes: KeyHashes::default(),
            role,
            dropped_total: 0,
            late_dropped_total: 0,
            detective: false,
            capped: false,
        }
    }

    /// A follower of `shard` that rejoined by a state transfer: its synced prefix is
    /// `prefix` from position `base` on (the state those entries, and the ones below `base`,
    /// produced came with it), `lingering` the transactions below `base` still to be known
    /// as logged, its key hashes `hashes` (the leader's over the whole prefix), and every key
    /// counts as released up to `floor`, the timestamp of the prefix's last entry. `None` when a
    /// transaction is listed twice.
    pub fn rejoined(
        shard: ShardId,
        limits: ReplicaLimits,
        (base, prefix, lingering): (usize, Vec<(TxnId, Timestamp)>, Vec<TxnId>),
        hashes: KeyHashes,
        floor: Timestamp,
    ) -> Option<Self> {
        let log = FollowerLog::with_prefix(base, prefix, lingering, limits.tail_max)?;
        let mut replica = Self::new(shard, false, limits);
        replica.role = Role::Follower {
            log,
            tail_keys: BTreeMap::new(),
            tail_marks: BTreeMap::new(),
            fetching: BTreeMap::new(),
        };
        replica.hashes = hashes;
        replica.hold.raise_floor(floor);
        Some(replica)
    }

    /// A leader of `shard` that restarted from a checkpoint of its journal: its log from
    /// `start.base` on (`start.entries`), the transactions logged below it, its key hashes over
    /// the whole log and its release stamps, as they were when the checkpoint was written.
    /// `None` when a transaction is listed twice.
    pub fn checkpointed_leader(
        shard: ShardId,
        limits: ReplicaLimits,
        start: CheckpointedLog,
    ) -> Option<Self> {
        let mut replica = Self::new(shard, true, limits);
        let Role::Leader { log, base, base_ts, in_log, .. } = &mut replica.role else {
            unreachable!("built a leader")
        };
        *base = start.base;
        *base_ts = start.base_ts;
        for &(txn, ts) in start.below.iter().chain(&start.entries) {
            if in_log.insert(txn, ts).is_some() {
                return None;
            }
        }
        *log = start.entries;
        replica.hashes = super::quorum::KeyHashes::from_pairs(start.hashes);
        let (reads, writes, floor) = start.stamps;
        replica.hold.restore_stamps(reads, writes, floor);
        Some(replica)
    }

    /// A leader of `shard` that restarted and found `log` in its journal (transaction,
    /// timestamp, the keys it reads and writes here, in log order), after its checkpoint's
    /// state `start` if it has one: the log, its key hashes and its release stamps as they
    /// were. Returns, per entry, the hash its fast reply carried. `None` when a transaction
    /// is listed twice.
    pub fn recovered_leader(
        shard: ShardId,
        limits: ReplicaLimits,
        start: Option<CheckpointedLog>,
        log: &[(TxnId, Timestamp, &[Key], &[Key])],
    ) -> Option<(Self, Vec<u64>)> {
        let mut replica = match start {
            Some(start) => Self::checkpointed_leader(shard, limits, start)?,
            None => Self::new(shard, true, limits),
        };
        let mut hashes = Vec::with_capacity(log.len());
        let Role::Leader { log: entries, in_log, .. } = &mut replica.role else {
            unreachable!("built a leader")
        };
        for &(txn, ts, reads, writes) in log {
            if in_log.insert(txn, ts).is_some() {
                return None;
            }
            entries.push((txn, ts));
            replica.hold.stamp_released(ts, reads, writes);
            let keys = part_keys(reads, writes);
            replica.hashes.toggle(txn, ts, &keys);
            hashes.push(replica.hashes.reply_hash(&keys));
        }
        Some((replica, hashes))
    }

    /// A follower of the old view becomes the leader of the new one (Tiga App. B), with the
    /// log a view change rebuilt ([`super::recovery::rebuild_log`]): its own synced prefix,
    /// then `prefix` (the entries from its sync-point on, each with the keys it reads and
    /// writes), all as released entries; then `added` (each entry of the rebuilt log's second
    /// step, held again at its timestamp and released in order; a multi-shard one is
    /// proposed to the other leaders first, which answer with where they released it). What
    /// it listed past its sync-point and its tail are dropped (the rebuilt log holds what of
    /// them may have committed).
    ///
    /// Every key counts as released up to the highest stamp it had (what it released or
    /// synced, see [`Replica::ts_high`]), so a later arrival goes above every entry of the
    /// log, whatever of it this replica dropped. Returns the actions for the added entries
    /// and the transactions it held, which it held as a follower: the caller holds them again
    /// as a leader (bumped where late). `keys_of` gives the keys of an entry listed here
    /// past the sync-point (its body is here). An error (a transaction listed twice, an
    /// added one not of this shard or already in the log, more added than the hold queue or
    /// the open agreements take, a body missing) changes nothing.
    pub fn promote(
        &mut self,
        prefix: Vec<(TxnId, Timestamp, super::recovery::EntryKeys)>,
        added: Vec<Incoming>,
        keys_of: impl Fn(TxnId) -> Option<Vec<Key>>,
    ) -> Result<(Vec<Action>, Vec<TxnId>), String> {
        let Role::Follower { log, .. } = &self.role else {
            return Err("a leader is promoted again".into());
        };
        let (base, sync_point) = (log.base(), log.sync_point());
        let synced = &log.since(base)[..sync_point - base];
        let mut in_log: BTreeMap<TxnId, Timestamp> = synced.iter().copied().collect();
        // Dropped below the base, still known as logged: their timestamps are gone, and a
        // proposal for one (long executed everywhere) is answered below any other.
        in_log.extend(log.lingering_txns().map(|txn| (txn, Timestamp::ZERO)));
        if in_log.len() != synced.len() + log.lingering() {
            return Err("the synced prefix lists a transaction twice".into());
        }
        for &(txn, ts, _) in &prefix {
            if in_log.insert(txn, ts).is_some() {
                return Err(format!("{txn} is in the rebuilt prefix twice"));
            }
        }
        let mut participants = BTreeSet::new();
        for incoming in &added {
            if in_log.contains_key(&incoming.txn) || !incoming.shards.contains(&self.shard) {
                return Err(format!("{} cannot be added to shard {}", incoming.txn, self.shard));
            }
            participants.extend(incoming.shards.iter().copied());
        }
        if participants.iter().any(|s| s.0 >= self.limits.shards_total) {
            return Err("an added transaction names a shard outside the cluster".into());
        }
        let multi = added.iter().filter(|i| i.shards.len() > 1).count();
        if added.len() > self.limits.held_max || multi > self.limits.agreements_max {
            return Err(format!("{} entries to add, {multi} of them to agree on", added.len()));
        }
        let synced = synced.to_vec();
        // The hashes over the synced prefix alone (the tail and what was listed past the
        // sync-point out), then the rebuilt prefix's entries.
        let mut hashes = self
            .hashes_below(sync_point, keys_of)
            .ok_or("an entry listed past the sync-point without its body")?;
        let mut entries = synced;
        let floor = self.hold.ts_high();
        let held = self.hold.drain().into_iter().map(|(txn, _)| txn).collect();
        let mut hold = HoldQueue::new(self.limits.held_max, self.limits.keys_max);
        hold.raise_floor(floor);
        for (txn, ts, (reads, writes)) in prefix {
            hashes.toggle(txn, ts, &part_keys(&reads, &writes));
            hold.stamp_released(ts, &reads, &writes);
            entries.push((txn, ts));
        }
        self.hold = hold;
        self.hashes = hashes;
        self.role = Role::Leader {
            log: entries,
            base,
            base_ts: floor,
            in_log,
            agreements: BTreeMap::new(),
            speculated: BTreeMap::new(),
        };
        let mut actions = Vec::new();
        for incoming in added {
            if incoming.shards.len() > 1 {
                let ts = incoming.ts;
                actions.extend(self.restore_proposal(incoming, ts));
                continue;
            }
            let Incoming { txn, ts, reads, writes, .. } = incoming;
            let payload = part_keys(&reads, &writes);
            if self.hold.restore(Arriving { txn, ts, reads, writes, payload }) {
                self.hold.set_ready(txn, true);
            }
        }
        Ok((actions, held))
    }

    /// A restarted leader: holds `incoming` at `proposed`, the timestamp it proposed before
    /// it crashed (see [`HoldQueue::restore`]), and proposes it again. Nothing for a
    /// transaction logged or held already, or with no room.
    pub fn restore_proposal(&mut self, incoming: Incoming, proposed: Timestamp) -> Vec<Action> {
        let Incoming { txn, mut shards, reads, writes, .. } = incoming;
        shards.sort_unstable();
        shards.dedup();
        if !self.leads() || self.logged(txn) || shards.len() < 2 || !shards.contains(&self.shard) {
            return Vec::new();
        }
        let keys = part_keys(&reads, &writes);
        let arriving = Arriving { txn, ts: proposed, reads, writes, payload: keys };
        if !self.hold.restore(arriving) {
            return Vec::new();
        }
        let me = self.shard;
        let Some(agreement) = self.agreement(txn, &shards) else {
            self.hold.remove(txn);
            return Vec::new();
        };
        agreement.propose(proposed);
        let to = shards.iter().copied().filter(|&s| s != me).collect();
        let mut actions = vec![Action::Propose { txn, ts: proposed, to }];
        self.settle(txn, &mut actions);
        actions
    }

    /// This replica's key hashes (over its whole log: a leader's, released or not executed).
    pub fn hashes(&self) -> &KeyHashes {
        &self.hashes
    }

    /// Leader: its log from its base up to `upto` (what a state transfer lists). Empty at a
    /// follower.
    pub fn log_prefix(&self, upto: usize) -> &[(TxnId, Timestamp)] {
        match &self.role {
            Role::Leader { log, base, .. } => &log[..upto.saturating_sub(*base).min(log.len())],
            Role::Follower { .. } => &[],
        }
    }

    /// The position of the first log entry still held (the leader's, or the follower's
    /// prefix's).
    pub fn log_base(&self) -> usize {
        match &self.role {
            Role::Leader { base, .. } => *base,
            Role::Follower { log, .. } => log.base(),
        }
    }

    /// Leader: drops the log entries below `upto` (every follower executed them), and returns
    /// them. Whether a transaction is logged stays known (a resend or a repeated proposal is
    /// answered) until [`Replica::forget_logged`].
    pub fn truncate_leader_log(&mut self, upto: usize) -> Vec<(TxnId, Timestamp)> {
        if let Role::Leader { log, base, base_ts, .. } = &mut self.role {
            let upto = upto.min(*base + log.len());
            if upto > *base {
                *base_ts = log[upto - *base - 1].1;
                let dropped = log.drain(..upto - *base).collect();
                *base = upto;
                return dropped;
            }
        }
        Vec::new()
    }

    /// Leader: stops knowing `txn` as logged. Only for a transaction below the log's base
    /// that nothing can bring here again (the caller's rule: its coordinator decided it and
    /// every other leader promised a closed timestamp past it, and the node refuses its late
    /// copies). False when it is not known as logged.
    pub fn forget_logged(&mut self, txn: TxnId) -> bool {
        let Role::Leader { log, in_log, .. } = &mut self.role else { return false };
        debug_assert!(log.iter().all(|&(t, _)| t != txn), "{txn} is still in the log");
        in_log.remove(&txn).is_some()
    }

    /// Leader: the transactions known as logged (in the log or below its base).
    pub fn logged_count(&self) -> usize {
        match &self.role {
            Role::Leader { in_log, .. } => in_log.len(),
            Role::Follower { .. } => 0,
        }
    }

    /// Leader: the timestamp of the entry just below `position` (at least the base; `ZERO`
    /// for position 0).
    pub fn log_ts_before(&self, position: usize) -> Timestamp {
        match &self.role {
            Role::Leader { log, base, base_ts, .. } => match position.checked_sub(*base + 1) {
                Some(i) => log.get(i).map_or(*base_ts, |&(_, ts)| ts),
                None => *base_ts,
            },
            Role::Follower { .. } => Timestamp::ZERO,
        }
    }

    /// Leader: what a checkpoint of its log at `position` keeps of this replica: the
    /// transactions logged below `position`, the entries from it on, the key hashes and the
    /// release stamps. Goes over every transaction logged.
    pub fn checkpoint_log(&self, position: usize) -> Option<CheckpointedLog> {
        let Role::Leader { log, base, in_log, .. } = &self.role else { return None };
        let start = position.checked_sub(*base)?;
        let entries = log.get(start..)?.to_vec();
        let after: BTreeSet<TxnId> = entries.iter().map(|&(txn, _)| txn).collect();
        let below = in_log.iter().filter(|(t, _)| !after.contains(t)).map(|(&t, &ts)| (t, ts));
        Some(CheckpointedLog {
            base: position,
            base_ts: self.log_ts_before(position),
            below: below.collect(),
            entries,
            hashes: self.hashes.pairs().map(|(key, hash)| (key.clone(), hash)).collect(),
            stamps: self.hold.stamps(),
        })
    }

    /// Leader: the transactions logged below the base (dropped entries) that `keep` picks,
    /// in id order. Goes over every transaction logged.
    pub fn logged_below_base(&self, keep: impl Fn(TxnId) -> bool) -> Vec<TxnId> {
        self.logged_below_base_at(keep).into_iter().map(|(txn, _)| txn).collect()
    }

    /// [`Replica::logged_below_base`], with each one's timestamp.
    pub fn logged_below_base_at(&self, keep: impl Fn(TxnId) -> bool) -> Vec<(TxnId, Timestamp)> {
        let Role::Leader { log, in_log, .. } = &self.role else { return Vec::new() };
        let held: BTreeSet<TxnId> = log.iter().map(|&(txn, _)| txn).collect();
        let below = in_log.iter().filter(|&(t, _)| !held.contains(t) && keep(*t));
        below.map(|(&txn, &ts)| (txn, ts)).collect()
    }

    /// Follower: drops the synced entries below `upto` (executed here); a dropped transaction
    /// stays known as logged unless `forgotten` says nothing can bring it here again, and
    /// lingering ones that now qualify are forgotten too. Returns the entries dropped.
    pub fn truncate_follower_log(
        &mut self,
        upto: usize,
        forgotten: impl Fn(TxnId) -> bool,
    ) -> usize {
        match &mut self.role {
            Role::Leader { .. } => 0,
            Role::Follower { log, .. } => {
                log.forget_lingering(&forgotten);
                log.truncate(upto, &forgotten)
            }
        }
    }

    /// Follower: dropped transactions still known as logged (their coordinators had not
    /// decided them). Zero at a leader.
    pub fn lingering(&self) -> usize {
        match &self.role {
            Role::Leader { .. } => 0,
            Role::Follower { log, .. } => log.lingering(),
        }
    }

    /// The same replica in detective mode (`on`): a leader runs a multi-shard transaction as
    /// soon as it is due and only its agreement holds it ([`Action::Speculate`]).
    pub fn with_detective(mut self, on: bool) -> Self {
        self.detective = on;
        self
    }

    /// Switches detective mode `on` or off (a view change of agreement mode). Only whether a
    /// due transaction runs before its agreement changes: what ran speculatively already is
    /// still revoked if its agreement moves it, or released where it ran.
    pub fn set_detective(&mut self, on: bool) {
        self.detective = on;
    }

    /// True in detective mode.
    pub fn detective(&self) -> bool {
        self.detective
    }

    /// Held transactions a detective leader ran speculatively.
    pub fn speculated(&self) -> usize {
        match &self.role {
            Role::Leader { speculated, .. } => speculated.len(),
            Role::Follower { .. } => 0,
        }
    }

    /// True when this replica leads its shard.
    pub fn leads(&self) -> bool {
        matches!(self.role, Role::Leader { .. })
    }

    /// Where `txn` is held, if it is.
    pub fn held_at(&self, txn: TxnId) -> Option<Timestamp> {
        self.hold.timestamp_of(txn)
    }

    /// The earliest timestamp held here, if any.
    pub fn earliest_held(&self) -> Option<Timestamp> {
        self.hold.earliest()
    }

    /// Transactions held.
    pub fn held(&self) -> usize {
        self.hold.len()
    }

    /// True when the last [`Replica::tick`] stopped at its bound (`release_max`): call it
    /// again soon, since what is left may already be due and no later timestamp says so.
    pub fn capped(&self) -> bool {
        self.capped
    }

    /// Proposals and confirmations dropped for want of room.
    pub fn dropped_total(&self) -> u64 {
        self.dropped_total
    }

    /// Follower: held transactions dropped because a conflicting entry above them joined the
    /// synced prefix (see [`Replica::on_sync`]).
    pub fn late_dropped_total(&self) -> u64 {
        self.late_dropped_total
    }

    /// Every key counts as released up to this here (see [`HoldQueue::ts_high`]): what a
    /// state transfer or checkpoint cut from this replica gives as its floor.
    pub fn ts_high(&self) -> Timestamp {
        self.hold.ts_high()
    }

    /// The leader's log from position `from` on, at most [`SYNC_ENTRIES_MAX`] entries: what a
    /// synchronisation message carries. Empty at a follower.
    /// Empty as well for a position below the base (those entries are dropped).
    pub fn log_since(&self, from: usize) -> &[(TxnId, Timestamp)] {
        match &self.role {
            Role::Leader { log, base, .. } => {
                let Some(start) = from.checked_sub(*base) else { return &[] };
                let start = start.min(log.len());
                &log[start..(start + SYNC_ENTRIES_MAX).min(log.len())]
            }
            Role::Follower { .. } => &[],
        }
    }

    /// The length of the leader's log, or the follower's sync-point.
    pub fn sync_point(&self) -> usize {
        match &self.role {
            Role::Leader { log, base, .. } => base + log.len(),
            Role::Follower { log, .. } => log.sync_point(),
        }
    }

    /// The earliest held timestamp later than `now`: when [`Replica::tick`] next has work.
    pub fn next_due_after(&self, now: Time) -> Option<Timestamp> {
        self.hold.next_due_after(now)
    }

    /// Follower: the synced entry at `position`, if it is below the sync-point (its body is
    /// here) and still held. `None` at a leader.
    pub fn synced_entry(&self, position: usize) -> Option<(TxnId, Timestamp)> {
        match &self.role {
            Role::Leader { .. } => None,
            Role::Follower { log, .. } if position < log.sync_point() => log.entry(position),
            Role::Follower { .. } => None,
        }
    }

    /// Follower: up to `max` listed transactions whose bodies it still lacks. Empty at a
    /// leader.
    pub fn missing_bodies(&self, max: usize) -> Vec<TxnId> {
        match &self.role {
            Role::Leader { .. } => Vec::new(),
            Role::Follower { log, .. } => log.missing().take(max).collect(),
        }
    }

    /// True when `txn` is in this replica's log (leader: released here; follower: released
    /// here or listed by the leader).
    pub fn logged(&self, txn: TxnId) -> bool {
        match &self.role {
            Role::Leader { in_log, .. } => in_log.contains_key(&txn),
            Role::Follower { log, .. } => log.contains(txn),
        }
    }

    /// The log's length: the leader's, or the follower's synced prefix (bodies or not).
    pub fn log_len(&self) -> usize {
        match &self.role {
            Role::Leader { log, base, .. } => base + log.len(),
            Role::Follower { log, .. } => log.len(),
        }
    }

    /// A transaction arrives (from its coordinator; a duplicate changes nothing).
    pub fn arrive(&mut self, incoming: Incoming) -> Vec<Action> {
        let Incoming { txn, ts, mut shards, reads, writes } = incoming;
        shards.sort_unstable();
        shards.dedup();
        let outside = shards.iter().any(|s| s.0 >= self.limits.shards_total);
        if !shards.contains(&self.shard) || outside {
            return Vec::new(); // Not a participant, or shards that do not exist: malformed.
        }
        let multi = shards.len() > 1;
        let keys = part_keys(&reads, &writes);
        match &self.role {
            Role::Leader { in_log, .. } if in_log.contains_key(&txn) => {
                return Vec::new(); // Released here once already: a retry executes nothing.
            }
            // Listed by the leader already: if its body was being fetched, this is it.
            Role::Follower { log, .. } if log.contains(txn) => {
                return self.on_body(txn, &(keys, writes));
            }
            _ => {}
        }
        let arriving = Arriving { txn, ts, reads, writes, payload: keys };
        let leads = self.leads();
        // A leader releases a multi-shard transaction only once its leaders agreed.
        let arrival = self.hold.arrive(arriving, leads, !(leads && multi));
        let held_at = match arrival {
            Arrival::Held(at) | Arrival::Bumped(at) => at,
            // A retry of a transaction still held at a leader: what this leader said for it
            // may have been lost, so it says it again.
            Arrival::Duplicate(_) if leads && multi => return self.repeat(txn),
            // A follower that is late leaves the place to the leader's log; a duplicate or a
            // full queue changes nothing (the coordinator retries).
            Arrival::Late(_) | Arrival::Duplicate(_) | Arrival::Full => return Vec::new(),
        };
        let mut actions = Vec::new();
        if leads && multi {
            let me = self.shard;
            let Some(agreement) = self.agreement(txn, &shards) else {
                // No room to agree: give the place back; the coordinator retries.
                self.hold.remove(txn);
                return actions;
            };
            agreement.propose(held_at);
            let to = shards.iter().copied().filter(|&s| s != me).collect();
            actions.push(Action::Propose { txn, ts: held_at, to });
            self.settle(txn, &mut actions);
        }
        actions
    }

    /// Another leader's proposal for `txn` (leaders only; ignored elsewhere).
    pub fn on_proposal(
        &mut self,
        from: ShardId,
        txn: TxnId,
        shards: &[ShardId],
        ts: Timestamp,
    ) -> Vec<Action> {
        self.on_peer(from, txn, shards, |agreement| agreement.on_proposal(from, ts))
    }

    /// Another leader moved `txn` to the agreed timestamp (leaders only).
    pub fn on_confirm(&mut self, from: ShardId, txn: TxnId, shards: &[ShardId]) -> Vec<Action> {
        self.on_peer(from, txn, shards, |agreement| agreement.on_confirm(from))
    }

    /// A message from participant leader `from`, recorded by `record` (false: dropped). One
    /// for a transaction this leader released already is answered with what it decided there
    /// (the sender may have missed it): its timestamp as a proposal, and a confirmation.
    fn on_peer(
        &mut self,
        from: ShardId,
        txn: TxnId,
        shards: &[ShardId],
        record: impl FnOnce(&mut Agreement) -> bool,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let Role::Leader { in_log, .. } = &self.role else { return actions };
        if from == self.shard || !shards.contains(&from) || !shards.contains(&self.shard) {
            return actions; // Not from another participant: dropped before it opens anything.
        }
        if shards.iter().any(|s| s.0 >= self.limits.shards_total) {
            return actions;
        }
        if let Some(&ts) = in_log.get(&txn) {
            actions.push(Action::Propose { txn, ts, to: vec![from] });
            actions.push(Action::Confirm { txn, to: vec![from] });
            return actions;
        }
        let Some(agreement) = self.agreement(txn, shards) else { return actions };
        if record(agreement) {
            self.settle(txn, &mut actions);
        }
        actions
    }

    /// Leader: the proposals (and confirmations) of every agreement this leader has proposed
    /// in and not yet released, again, at most `max` agreements' worth: paced resends, so a
    /// lost message cannot hold a transaction forever when its coordinator is gone.
    pub fn repeat_open(&mut self, max: usize) -> Vec<Action> {
        let Role::Leader { agreements, .. } = &self.role else { return Vec::new() };
        let open: Vec<TxnId> = agreements
            .iter()
            .filter(|(_, a)| a.own().is_some())
            .map(|(&txn, _)| txn)
            .take(max)
            .collect();
        open.into_iter().flat_map(|txn| self.repeat(txn)).collect()
    }

    /// Leader, after a view change that gave the shards in `changed` new leaders: every open
    /// agreement with one of them starts again ([`Agreement::restart`]) at the position this
    /// leader holds its transaction at, which waits (not ready) for the new agreement, and is
    /// proposed again to every participant. Bounded by the open agreements
    /// (`agreements_max`).
    pub fn restart_agreements(&mut self, changed: &BTreeSet<ShardId>) -> Vec<Action> {
        let me = self.shard;
        let Role::Leader { agreements, .. } = &mut self.role else { return Vec::new() };
        let mut actions = Vec::new();
        for (&txn, agreement) in agreements.iter_mut() {
            if !agreement.participants().any(|s| changed.contains(&s)) {
                continue;
            }
            let held_at = self.hold.timestamp_of(txn);
            if let Some(ts) = agreement.restart(held_at) {
                self.hold.set_ready(txn, false);
                let to = agreement_shards(agreement, me);
                actions.push(Action::Propose { txn, ts, to });
            }
        }
        actions
    }

    /// A leader's messages for a held multi-shard transaction, again: its proposal, and its
    /// confirmation if it moved the transaction.
    fn repeat(&mut self, txn: TxnId) -> Vec<Action> {
        let me = self.shard;
        let Role::Leader { agreements, .. } = &self.role else { return Vec::new() };
        let Some(agreement) = agreements.get(&txn) else { return Vec::new() };
        let Some(ts) = agreement.own() else { return Vec::new() };
        let to = agreement_shards(agreement, me);
        let mut actions = vec![Action::Propose { txn, ts, to: to.clone() }];
        if agreement.moved() {
            actions.push(Action::Confirm { txn, to });
        }
        actions
    }

    /// The agreement on `txn` among `shards`, opened if needed; `None` when this shard is not
    /// among them or no room is left.
    fn agreement(&mut self, txn: TxnId, shards: &[ShardId]) -> Option<&mut Agreement> {
        let me = self.shard;
        let Role::Leader { agreements, in_log, .. } = &mut self.role else { return None };
        if !agreements.contains_key(&txn) {
            let participants: BTreeSet<ShardId> = shards.iter().copied().collect();
            if !participants.contains(&me) || participants.len() < 2 || in_log.contains_key(&txn) {
                return None;
            }
            if agreements.len() >= self.limits.agreements_max {
                self.dropped_total += 1;
                return None;
            }
            agreements.insert(txn, Agreement::new(me, participants));
        }
        agreements.get_mut(&txn)
    }

    /// Acts on the agreement's verdict for a transaction held here.
    fn settle(&mut self, txn: TxnId, actions: &mut Vec<Action>) {
        if self.hold.timestamp_of(txn).is_none() {
            return; // Not here yet: the proposals wait for it.
        }
        let me = self.shard;
        let Role::Leader { agreements, speculated, .. } = &mut self.role else { return };
        let Some(agreement) = agreements.get_mut(&txn) else { return };
        match agreement.verdict() {
            Verdict::Waiting | Verdict::AwaitConfirms(_) => {}
            Verdict::Reposition(agreed) => {
                if let Some(ts) = speculated.remove(&txn) {
                    actions.push(Action::Revoke { txn, ts });
                }
                let moved = self.hold.reposition(txn, agreed);
                debug_assert!(moved, "{txn} held below the agreed {agreed:?}");
                agreement.repositioned();
                let to = agreement_shards(agreement, me);
                actions.push(Action::Confirm { txn, to });
                let released = agreement.verdict();
                debug_assert_eq!(released, Verdict::Release(agreed));
                self.hold.set_ready(txn, true);
            }
            Verdict::Release(agreed) => {
                debug_assert_eq!(self.hold.timestamp_of(txn), Some(agreed));
                self.hold.set_ready(txn, true);
            }
        }
    }

    /// Forgets `txn` (its coordinator gave up on it, or a proposal came for a transaction
    /// that never arrives): its held entry and its agreement go. A released transaction
    /// stays in the log.
    /// False (nothing forgotten) for a transaction this leader has proposed: another shard
    /// may have released it at the agreed timestamp already, so it stays until released here
    /// (a view change settles it otherwise).
    pub fn forget(&mut self, txn: TxnId) -> bool {
        if let Role::Leader { agreements, .. } = &mut self.role {
            if agreements.get(&txn).is_some_and(|a| a.own().is_some()) {
                return false;
            }
            agreements.remove(&txn);
        }
        self.hold.remove(txn);
        true
    }

    /// Leader: the leader of `from` refused `txn` (it never took it and never will: its
    /// coordinator decided it without that shard). A transaction held here and not released
    /// can then never be agreed on: it goes, with its agreement, and a speculative run is
    /// revoked ([`Action::Revoke`]). `None` (nothing changes) for a transaction logged here
    /// or not held, or when `from` is not a participant or had proposed (it took the
    /// transaction, so this is not its word on it).
    pub fn refused(&mut self, from: ShardId, txn: TxnId) -> Option<Vec<Action>> {
        let Role::Leader { agreements, speculated, in_log, .. } = &mut self.role else {
            return None;
        };
        if in_log.contains_key(&txn) || self.hold.timestamp_of(txn).is_none() {
            return None;
        }
        let agreement = agreements.get(&txn)?;
        if from == self.shard || !agreement.participants().any(|s| s == from) {
            return None;
        }
        if agreement.heard(from) {
            return None;
        }
        agreements.remove(&txn);
        let mut actions = Vec::new();
        if let Some(ts) = speculated.remove(&txn) {
            actions.push(Action::Revoke { txn, ts });
        }
        self.hold.remove(txn);
        Some(actions)
    }

    /// The clock reads `now`: releases what is due, in timestamp order.
    pub fn tick(&mut self, now: Time) -> Vec<Action> {
        let mut actions = Vec::new();
        let max = self.limits.release_max;
        let (released, speculate) = match &self.role {
            Role::Leader { speculated, agreements, .. } if self.detective => {
                // Run each once; one outbid already will move (running it where it is would
                // only be revoked).
                let done = |t| {
                    speculated.contains_key(&t) || agreements.get(&t).is_some_and(|a| a.outbid())
                };
                self.hold.release_speculating(now, max, done)
            }
            _ => (self.hold.release(now, max), Vec::new()),
        };
        self.capped = released.len() + speculate.len() >= max;
        for released in released {
            let (txn, ts, keys) = (released.txn, released.ts, released.payload);
            let writes = released.writes;
            match &mut self.role {
                Role::Leader { log, in_log, agreements, speculated, .. } => {
                    agreements.remove(&txn);
                    let ran = speculated.remove(&txn);
                    // A revocation took it out when its timestamp moved.
                    assert!(ran.is_none_or(|at| at == ts), "{txn} released off its speculation");
                    let first = in_log.insert(txn, ts).is_none();
                    assert!(first, "{txn} released twice");
                    log.push((txn, ts));
                    actions.push(Action::Execute { txn, ts });
                }
                Role::Follower { log, tail_keys, tail_marks, .. } => {
                    if !log.release(txn, ts) {
                        // The tail is full (the leader is silent): no fast reply; the
                        // leader's log will place it.
                        continue;
                    }
                    mark_tail(tail_marks, txn, ts, &keys, &writes);
                    tail_keys.insert(txn, keys.clone());
                }
            }
            self.hashes.toggle(txn, ts, &keys);
            actions.push(Action::FastReply { txn, ts, hash: self.hashes.reply_hash(&keys) });
        }
        // Detective leaders: what only its agreement holds runs now.
        for (txn, ts) in speculate {
            let keys = self.hold.payload(txn).expect("held").clone();
            // The hash once released there: the entry in, then out again (XOR).
            self.hashes.toggle(txn, ts, &keys);
            let hash = self.hashes.reply_hash(&keys);
            self.hashes.toggle(txn, ts, &keys);
            if let Role::Leader { speculated, .. } = &mut self.role {
                speculated.insert(txn, ts);
            }
            actions.push(Action::Speculate { txn, ts, hash });
        }
        actions
    }

    /// Follower: the leader's log from position `from`. `keys_of`: the keys of a transaction
    /// whose body this replica holds outside the hold queue (one it found late, or fetched),
    /// if it does.
    ///
    /// An entry joining the synced prefix **supersedes** every tail entry below it in
    /// `(timestamp, id)` order that it conflicts with ([`Action::Superseded`]): the leader's
    /// log holds conflicting entries in that order, and the tail entry is not in the prefix
    /// before it, so the log will never hold it at its timestamp here (if it lists it, it is
    /// later, where a retimed entry would go). It leaves the tail and the hashes, so the
    /// tail this replica would report at a view change agrees with its synced prefix,
    /// whatever of the prefix it has dropped since.
    pub fn on_sync(
        &mut self,
        from: usize,
        entries: &[(TxnId, Timestamp)],
        keys_of: impl Fn(TxnId) -> Option<PartKeys>,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let Role::Follower { log, tail_keys, tail_marks, fetching } = &mut self.role else {
            return actions;
        };
        let hold = &mut self.hold;
        let before = log.len();
        let synced = {
            let known = |txn: TxnId| {
                tail_keys.contains_key(&txn)
                    || hold.timestamp_of(txn).is_some()
                    || keys_of(txn).is_some()
            };
            log.on_sync(from, entries, known)
        };
        let mut own_ts: BTreeMap<TxnId, Timestamp> = BTreeMap::new();
        for &(txn, own, leader_ts) in &synced.retimed {
            if let Some(keys) = tail_keys.get(&txn) {
                self.hashes.toggle(txn, own, keys);
                self.hashes.toggle(txn, leader_ts, keys);
                own_ts.insert(txn, own);
            }
        }
        // Bounded by the message (at most SYNC_ENTRIES_MAX entries joined). Every entry
        // listed leaves the tail before any supersedes: the log took them out of its tail.
        let mut joined = Vec::new();
        for &(txn, ts) in log.since(before) {
            // `released`: released here at this timestamp, so stamped there already, and
            // nothing conflicting is held below it (the release order saw to that).
            let (keys, writes, released) = if let Some(keys) = tail_keys.remove(&txn) {
                // Released here: hashed already (moved above if retimed).
                let own = own_ts.get(&txn).copied().unwrap_or(ts);
                let writes = unmark_tail(tail_marks, txn, own, &keys);
                (keys, writes, own == ts)
            } else if let Some((writes, keys)) = hold.remove_writing(txn) {
                self.hashes.toggle(txn, ts, &keys);
                (keys, writes, false)
            } else if let Some((keys, writes)) = keys_of(txn) {
                self.hashes.toggle(txn, ts, &keys);
                (keys, writes, false)
            } else {
                fetching.insert(txn, ts);
                continue;
            };
            joined.push((txn, ts, keys, writes, released));
        }
        let mut superseded = Vec::new();
        for (txn, ts, keys, writes, released) in joined {
            let tail = Tail { log, keys: tail_keys, marks: tail_marks, hashes: &mut self.hashes };
            superseded.extend(tail.supersede(txn, ts, &keys, &writes));
            if !released {
                self.late_dropped_total += settle_synced(hold, txn, ts, &keys, &writes);
            }
        }
        if !superseded.is_empty() {
            actions.push(Action::Superseded { dropped: superseded });
        }
        let slow = synced.newly_synced.into_iter().map(|(txn, ts)| Action::SlowReply { txn, ts });
        actions.extend(slow);
        if !synced.fetch.is_empty() {
            actions.push(Action::Fetch { txns: synced.fetch });
        }
        if let Some(from) = synced.resend_from {
            actions.push(Action::Resend { from });
        }
        actions
    }

    /// Follower: transactions released here that the leader has not listed yet (0 at a
    /// leader).
    pub fn tail_len(&self) -> usize {
        match &self.role {
            Role::Leader { .. } => 0,
            Role::Follower { log, .. } => log.tail_len(),
        }
    }

    /// Follower: drops the transactions it released at or below `listed_through` that the
    /// leader's log does not list, given that its synced prefix holds every entry the leader
    /// will ever log at or below it (see [`FollowerLog::drop_unlisted`]), and takes each out
    /// of its key hashes again, so the keys' later fast replies match the leader's. Returns
    /// what was dropped (nothing at a leader).
    pub fn drop_unlisted(&mut self, listed_through: Timestamp) -> Vec<(TxnId, Timestamp)> {
        let Role::Follower { log, tail_keys, tail_marks, .. } = &mut self.role else {
            return Vec::new();
        };
        let dropped = log.drop_unlisted(listed_through);
        for &(txn, ts) in &dropped {
            let keys = tail_keys.remove(&txn).expect("a tail entry's keys are kept");
            unmark_tail(tail_marks, txn, ts, &keys);
            self.hashes.toggle(txn, ts, &keys);
        }
        dropped
    }

    /// Follower: its log as a view change gathers it ([`LogReport`]). No tail entry lies
    /// below a conflicting entry listed here (see [`Replica::on_sync`]), so the report is
    /// in timestamp order among conflicting entries. `None` at a leader.
    pub fn report(&self) -> Option<LogReport> {
        let Role::Follower { log, fetching, .. } = &self.role else { return None };
        let sync_point = log.sync_point();
        let listed = log.since(log.base());
        let (synced, past) = listed.split_at(sync_point - log.base());
        let mut unsynced: Vec<(TxnId, Timestamp)> =
            past.iter().filter(|(txn, _)| !fetching.contains_key(txn)).copied().collect();
        let mut tail = self.tail();
        tail.sort_unstable_by_key(|&(txn, ts)| (ts, txn));
        unsynced.extend(tail);
        Some(LogReport { base: log.base(), synced: synced.to_vec(), unsynced })
    }

    /// Follower: true when `txn` sits in the unsynced tail (released here, not listed yet).
    pub fn in_tail(&self, txn: TxnId) -> bool {
        match &self.role {
            Role::Leader { .. } => false,
            Role::Follower { tail_keys, .. } => tail_keys.contains_key(&txn),
        }
    }

    /// Follower: the unsynced tail, in id order, with each entry's timestamp. Empty at a
    /// leader.
    pub fn tail(&self) -> Vec<(TxnId, Timestamp)> {
        match &self.role {
            Role::Leader { .. } => Vec::new(),
            Role::Follower { log, tail_keys, .. } => {
                tail_keys.keys().filter_map(|&txn| log.tail_ts(txn).map(|ts| (txn, ts))).collect()
            }
        }
    }

    /// Follower: the synced prefix's entries from `from` (at least the base) up to `upto`.
    /// Empty at a leader.
    pub fn follower_entries(&self, from: usize, upto: usize) -> Vec<(TxnId, Timestamp)> {
        match &self.role {
            Role::Leader { .. } => Vec::new(),
            Role::Follower { log, .. } => {
                let since = log.since(from);
                let from = from.max(log.base());
                since[..upto.saturating_sub(from).min(since.len())].to_vec()
            }
        }
    }

    /// Follower: the transactions dropped below the base that still count as logged. Empty
    /// at a leader.
    pub fn follower_lingering(&self) -> Vec<TxnId> {
        match &self.role {
            Role::Leader { .. } => Vec::new(),
            Role::Follower { log, .. } => log.lingering_txns().collect(),
        }
    }

    /// Follower: the key hashes over the synced prefix below `position` alone, as a
    /// journal's image of the executed prefix lists them: the tail's entries and the synced
    /// ones from `position` on are taken out again (they come back as the journal's later
    /// records run). `keys_of` gives a synced entry's keys; `None` when one with its keys in
    /// the hashes has no body here.
    pub fn hashes_below(
        &self,
        position: usize,
        keys_of: impl Fn(TxnId) -> Option<Vec<Key>>,
    ) -> Option<KeyHashes> {
        let Role::Follower { log, tail_keys, fetching, .. } = &self.role else { return None };
        let mut hashes = self.hashes.clone();
        // Bounded by the tail and the synced entries past `position`.
        for (&txn, keys) in tail_keys {
            hashes.toggle(txn, log.tail_ts(txn)?, keys);
        }
        for &(txn, ts) in log.since(position) {
            if !fetching.contains_key(&txn) {
                hashes.toggle(txn, ts, &keys_of(txn)?);
            }
        }
        Some(hashes)
    }

    /// Follower restarting from its journal: `txn` was released here at `ts` on `keys`
    /// and sits in the tail again, in the hashes. False when it is logged already or the
    /// tail is full (nothing changed).
    pub fn restore_released(&mut self, txn: TxnId, ts: Timestamp, keys: PartKeys) -> bool {
        let Role::Follower { log, tail_keys, tail_marks, .. } = &mut self.role else {
            return false;
        };
        if !log.release(txn, ts) {
            return false;
        }
        let (keys, writes) = keys;
        self.hashes.toggle(txn, ts, &keys);
        mark_tail(tail_marks, txn, ts, &keys, &writes);
        self.hold.stamp_released(ts, &keys, &writes);
        tail_keys.insert(txn, keys);
        true
    }

    /// Follower: true when `txn` is listed by the leader and its body is awaited here.
    pub fn wants_body(&self, txn: TxnId) -> bool {
        match &self.role {
            Role::Leader { .. } => false,
            Role::Follower { fetching, .. } => fetching.contains_key(&txn),
        }
    }

    /// Follower: the body of a fetched transaction arrived, touching `keys` here. It
    /// supersedes the tail entries below it that it conflicts with (see
    /// [`Replica::on_sync`]).
    pub fn on_body(&mut self, txn: TxnId, keys: &PartKeys) -> Vec<Action> {
        let Role::Follower { log, fetching, tail_keys, tail_marks } = &mut self.role else {
            return Vec::new();
        };
        let Some(ts) = fetching.remove(&txn) else { return Vec::new() };
        let (keys, writes) = keys;
        self.hashes.toggle(txn, ts, keys);
        let mut actions = Vec::new();
        let tail = Tail { log, keys: tail_keys, marks: tail_marks, hashes: &mut self.hashes };
        let dropped = tail.supersede(txn, ts, keys, writes);
        self.late_dropped_total += settle_synced(&mut self.hold, txn, ts, keys, writes);
        if !dropped.is_empty() {
            actions.push(Action::Superseded { dropped });
        }
        let slow = log.on_body(txn).into_iter().map(|(txn, ts)| Action::SlowReply { txn, ts });
        actions.extend(slow);
        actions
    }
}

/// Follower: `txn`, touching `keys` and writing `writes`, joined the synced prefix at `ts`:
/// its keys count as released there (a later arrival below it on them is late here, as at
/// the leader), and the held entries below it that it conflicts with go (they will not be
/// released below it). Returns how many went.
fn settle_synced(
    hold: &mut HoldQueue<Vec<Key>>,
    txn: TxnId,
    ts: Timestamp,
    keys: &[Key],
    writes: &[Key],
) -> u64 {
    // Its written keys are stamped as read too: the same conflicts, and no list to build.
    hold.stamp_released(ts, keys, writes);
    hold.drop_conflicting_below(ts, txn, keys, writes).len() as u64
}

/// A follower's tail and what indexes it, borrowed together.
struct Tail<'a> {
    log: &'a mut FollowerLog,
    keys: &'a mut BTreeMap<TxnId, Vec<Key>>,
    marks: &'a mut TailMarks,
    hashes: &'a mut KeyHashes,
}

impl Tail<'_> {
    /// `txn`, touching `keys` and writing `writes`, joined the synced prefix at `ts`: drops
    /// every tail entry below it in `(timestamp, id)` order that conflicts with it, and
    /// returns them. Bounded by the tail entries on its keys.
    fn supersede(
        self,
        txn: TxnId,
        ts: Timestamp,
        keys: &[Key],
        writes: &[Key],
    ) -> Vec<(TxnId, Timestamp)> {
        let mut below: BTreeSet<(Timestamp, TxnId)> = BTreeSet::new();
        for key in keys {
            let writing = writes.binary_search(key).is_ok();
            let range = (key.clone(), Timestamp::ZERO, TXN_MIN)..(key.clone(), ts, txn);
            let conflicting = self.marks.range(range).filter(|&(_, &w)| writing || w);
            below.extend(conflicting.map(|(&(_, at, gone), _)| (at, gone)));
        }
        let mut dropped = Vec::with_capacity(below.len());
        for (at, gone) in below {
            let removed = self.log.unrelease(gone);
            debug_assert_eq!(removed, Some(at), "{gone} marked in the tail at {at:?}");
            let keys = self.keys.remove(&gone).expect("a tail entry's keys are kept");
            unmark_tail(self.marks, gone, at, &keys);
            self.hashes.toggle(gone, at, &keys);
            dropped.push((gone, at));
        }
        dropped
    }
}

/// The participants of `agreement` other than `me`.
fn agreement_shards(agreement: &Agreement, me: ShardId) -> Vec<ShardId> {
    agreement.participants().filter(|&s| s != me).collect()
}

#[cfg(test)]
mod tests;
