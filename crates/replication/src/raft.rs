//! [`RaftReplica`]: one member of one Raft group, over tikv/raft-rs's `RawNode`.
//!
//! Each pass over raft-rs's `Ready` sends what may go at once (a leader's appends), applies
//! the committed entries this replica already holds durably, appends new entries and the hard
//! state to the in-memory log raft-rs reads from, and asks the driver to persist the same
//! records. Messages raft-rs allows only after persistence (votes, append acknowledgements)
//! wait for that persist's `on_persisted`; persists complete in order.
//!
//! Durable layout (keys in the node's log store, big-endian so key order is log order):
//! `'R' ‖ group:u32 ‖ 0` → hard state; `'R' ‖ group:u32 ‖ 1 ‖ index:u64` → entry (protobuf);
//! `'R' ‖ group:u32 ‖ 2` → the latest snapshot (protobuf: index, term, members, state data).
//!
//! Snapshots bound the log. Once [`RaftTiming::snapshot_interval_entries`] entries have been
//! applied since the last one (and they hold at least a [`SNAPSHOT_BYTES_PER_LOG_BYTE_MAX`]th
//! of its bytes, so that encoding a large state stays cheap per entry), the driver hands
//! [`RaftReplica::take_snapshot`] its state machine's image at the applied index; the replica
//! persists it and, in the same atomic batch, deletes the durable entries it covers, then
//! drops from memory all but the last [`RaftTiming::kept_entries`] of them (so a follower
//! that lags a little is still sent entries, not the whole state). A follower that lags
//! further is sent the snapshot; it hands the image to its driver as
//! [`ReplicaEffect::Restore`] and replaces its log with it.
//! A restarted replica restores its snapshot the same way (its first effect), then replays
//! the committed entries after it: the state machine is rebuilt from snapshot + log.
//!
//! Messages go as `0 ‖ protobuf`; one bigger than [`MSG_CHUNK_BYTES`] (a snapshot) goes as
//! chunks, `1 ‖ id ‖ part ‖ parts ‖ bytes`, that the receiver reassembles (one message per
//! sender at a time; a newer id replaces an unfinished one, which raft-rs will send again).
//!
//! A snapshot message can be lost, and raft-rs then waits for it forever; a leader whose
//! follower has not acknowledged one within [`SNAPSHOT_RETRY_TICKS`] reports it failed, and
//! raft-rs sends it again.
//!
//! Determinism: raft-rs draws a randomized election timeout from `thread_rng` whenever a member
//! changes term, role or leader. This replica overrides that draw at once, before it can
//! matter, with one from its own seeded stream, so timeouts stay random (two members that
//! always timed out together would split every vote forever: swarm seed 206678 of
//! `list-append`) and runs stay reproducible.

use crate::{ProposeError, Replica, ReplicaEffect, ReplicaMsg, Slot};
use meridian_core::rng::{child_rng, uniform_u64, Rng};
use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Message, MessageType, Snapshot};
use raft::storage::MemStorage;
use raft::{
    Config, GetEntriesContext, ProgressState, RaftState, RawNode, SnapshotStatus, StateRole,
    Storage, StorageError,
};
use std::collections::{BTreeMap, VecDeque};

pub use crate::SnapshotCounts;

/// First byte of every replication key in the node's log store.
pub const KEY_PREFIX: u8 = b'R';
const KIND_HARD_STATE: u8 = 0;
const KIND_ENTRY: u8 = 1;
const KIND_SNAPSHOT: u8 = 2;
/// Most bytes of entries in one append message.
pub const MSG_BYTES_MAX: u64 = 1 << 20;
/// Most append messages in flight to one follower.
pub const INFLIGHT_MSGS_MAX: usize = 256;
/// Most persists that may be outstanding before the replica stops issuing new ones.
pub const PENDING_PERSISTS_MAX: usize = 1 << 16;
/// Ticks a leader waits for a follower to acknowledge a snapshot before sending it again
/// (more than an election timeout: a big snapshot takes a while to send and apply).
pub const SNAPSHOT_RETRY_TICKS: u64 = 40;
/// A message bigger than this (a snapshot) goes as chunks of this size, so that every piece
/// fits a wire frame; the receiver reassembles them.
pub const MSG_CHUNK_BYTES: usize = 2 << 20;
/// Default for [`RaftTiming::snapshot_bytes_max`]: the most bytes a chunked message (a
/// snapshot) may reassemble to. It bounds what one sending member can make a receiver buffer
/// (one message per sender and group), and so is also the largest snapshot a group takes.
pub const SNAPSHOT_BYTES_MAX: usize = 256 << 20;
/// The largest value [`RaftTiming::snapshot_bytes_max`] may take (a log batch's limit).
pub const SNAPSHOT_BYTES_MAX_LIMIT: usize = 1 << 30;
const _: () = assert!(MSG_BYTES_MAX as usize <= MSG_CHUNK_BYTES);
/// First byte of a [`ReplicaMsg`]: a whole raft-rs message follows, or one chunk of one.
const WIRE_WHOLE: u8 = 0;
const WIRE_CHUNK: u8 = 1;
/// A chunk's header after its first byte: message id (u64), part (u32), parts (u32).
const CHUNK_HEADER_BYTES: usize = 16;

/// Fewest entries between snapshots: a snapshot copies the whole state, so taking one per
/// handful of commands would cost more than the log it saves.
pub const SNAPSHOT_INTERVAL_ENTRIES_MIN: u64 = 8;
/// By default a snapshot is also not due before the entries applied since the last one hold
/// at least this fraction (one in this many) of its bytes: encoding the state then costs at most this
/// many bytes per byte of log, however large the state has grown. Without it a snapshot every
/// fixed number of entries costs more per entry as the state grows, and a long run slows
/// down with its length. The log kept in the meantime is bounded by the state's size.
pub const SNAPSHOT_BYTES_PER_LOG_BYTE_MAX: u64 = 4;

/// Timing and log bounds of one group's members (time in ticks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaftTiming {
    /// Ticks without a leader's word before a follower campaigns (the minimum; each timeout
    /// is drawn from `election_ticks..2 * election_ticks`).
    pub election_ticks: usize,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_ticks: usize,
    /// Seeds this member's election timeouts.
    pub seed: u64,
    /// Entries applied between snapshots.
    pub snapshot_interval_entries: u64,
    /// Largest snapshot this member takes or reassembles from a sender (at most
    /// [`SNAPSHOT_BYTES_MAX_LIMIT`]); every member of a group must agree on it.
    pub snapshot_bytes_max: usize,
    /// A snapshot also waits until the commands applied since the last one hold at least
    /// this fraction (one in this many) of its bytes ([`SNAPSHOT_BYTES_PER_LOG_BYTE_MAX`] by
    /// default); 0: the entry count alone decides (the simulator draws it per seed, so that
    /// swarms also take a snapshot every few entries whatever the state's size).
    pub snapshot_bytes_per_log_byte_max: u64,
}

impl RaftTiming {
    /// 10 election ticks, heartbeat every 2 (with a 25 ms tick, elections after 250–500 ms), a
    /// snapshot every `snapshot_interval_entries` applied entries.
    pub fn standard(seed: u64, snapshot_interval_entries: u64) -> Self {
        assert!(
            snapshot_interval_entries >= SNAPSHOT_INTERVAL_ENTRIES_MIN,
            "a snapshot every {snapshot_interval_entries} entries is below the minimum"
        );
        Self {
            election_ticks: 10,
            heartbeat_ticks: 2,
            seed,
            snapshot_interval_entries,
            snapshot_bytes_max: SNAPSHOT_BYTES_MAX,
            snapshot_bytes_per_log_byte_max: SNAPSHOT_BYTES_PER_LOG_BYTE_MAX,
        }
    }

    /// The most chunks a reassembled message may have.
    fn chunk_parts_max(&self) -> u32 {
        self.snapshot_bytes_max.min(SNAPSHOT_BYTES_MAX_LIMIT).div_ceil(MSG_CHUNK_BYTES) as u32
    }

    /// Entries kept in memory below a snapshot, so that a follower lagging by fewer is sent
    /// entries rather than the snapshot: an eighth of the interval.
    pub fn kept_entries(&self) -> u64 {
        self.snapshot_interval_entries / 8
    }
}

/// True when `durable` holds any record of `group`'s member (a hard state, an entry or a
/// snapshot): a member restarting without one has lost what it promised and must not vote
/// as if it never had.
pub fn has_records(durable: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>, group: u32) -> bool {
    let prefix = key_prefix(group);
    durable.range(prefix.clone()..).next().is_some_and(|(key, _)| key.starts_with(&prefix))
}

fn key_prefix(group: u32) -> Vec<u8> {
    let mut key = vec![KEY_PREFIX];
    key.extend_from_slice(&group.to_be_bytes());
    key
}

fn hard_state_key(group: u32) -> Vec<u8> {
    let mut key = key_prefix(group);
    key.push(KIND_HARD_STATE);
    key
}

fn snapshot_key(group: u32) -> Vec<u8> {
    let mut key = key_prefix(group);
    key.push(KIND_SNAPSHOT);
    key
}

fn entry_key(group: u32, index: u64) -> Vec<u8> {
    let mut key = key_prefix(group);
    key.push(KIND_ENTRY);
    key.extend_from_slice(&index.to_be_bytes());
    key
}

/// Why a replica could not be rebuilt from its durable records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreError(pub String);

impl std::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What raft-rs reads the log from: the in-memory entries and the latest snapshot (raft-rs's
/// `MemStorage` alone answers snapshot requests with metadata but no state).
struct LogStorage {
    mem: MemStorage,
    snapshot: Snapshot,
}

impl LogStorage {
    fn snapshot_index(&self) -> u64 {
        self.snapshot.get_metadata().index
    }
}

impl Storage for LogStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.mem.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.mem.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let meta = self.snapshot.get_metadata();
        if idx == meta.index && idx > 0 {
            return Ok(meta.term);
        }
        self.mem.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        self.mem.first_index()
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.mem.last_index()
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        // The log is only ever compacted below a snapshot this replica holds, so one exists
        // whenever raft-rs needs it; the request index is 0 unless a follower asked for more.
        if self.snapshot_index() > 0 && self.snapshot_index() >= request_index {
            Ok(self.snapshot.clone())
        } else {
            Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable))
        }
    }
}

/// A persist the driver has not completed yet.
#[derive(Debug)]
struct PendingPersist {
    /// The token the driver hands back.
    token: u64,
    /// The last ready number it covers (none for a snapshot of our own): readies with
    /// nothing to write that came after it are durable as soon as it is.
    number: Option<u64>,
    /// Messages raft-rs lets go only after these readies are durable.
    after: Vec<Message>,
}

/// One member of one Raft group.
pub struct RaftReplica {
    node: RawNode<LogStorage>,
    group: u32,
    /// The group's members (fixed: membership never changes here).
    conf_state: ConfState,
    /// Persists outstanding, oldest first.
    pending: VecDeque<PendingPersist>,
    /// Tokens for persists.
    token_next: u64,
    /// The durable entries are `durable_first_index..=durable_last_index` (none when first >
    /// last); everything below is covered by the durable snapshot.
    durable_first_index: u64,
    durable_last_index: u64,
    /// The last index of the log this replica was restored with.
    restored_last_index: u64,
    /// The highest index handed to the driver (applied, or restored from a snapshot).
    applied_index: u64,
    /// A snapshot restored from disk, handed to the driver with the first effects.
    restore_pending: Option<Snapshot>,
    /// The persist of a snapshot received from the leader, until it completes. Meanwhile
    /// raft-rs's applied index is still below the snapshot (it may only move once the snapshot
    /// is durable) while its log starts after it, and an election would read the entries in
    /// between: so no election starts until then.
    received_snapshot_persist: Option<u64>,
    leading: bool,
    /// Draws election timeouts.
    rng: Rng,
    timing: RaftTiming,
    /// Term, role and leader when the timeout was last drawn.
    drawn_for: (u64, StateRole, u64),
    /// Ticks so far, and when each follower the leader is sending a snapshot to started
    /// waiting for it (raft id → tick).
    ticks: u64,
    snapshot_sent_at: BTreeMap<u64, u64>,
    /// Snapshots taken here, received from a leader, and restored from disk (for metrics).
    snapshot_counts: SnapshotCounts,
    /// Ids for chunked messages sent.
    chunked_next: u64,
    /// The applied index at which an image was last refused as too big (0: never).
    snapshot_refused_at: u64,
    /// Bytes of the commands applied since the last snapshot (taken or installed), and the
    /// size of that snapshot's state (see [`SNAPSHOT_BYTES_PER_LOG_BYTE_MAX`]).
    applied_bytes_since_snapshot: u64,
    snapshot_bytes_last: u64,
    /// Chunked messages being reassembled, per sender.
    reassembly: BTreeMap<Slot, Reassembly>,
}

/// The chunks of one message received so far.
#[derive(Debug)]
struct Reassembly {
    id: u64,
    parts: u32,
    chunks: BTreeMap<u32, Vec<u8>>,
}

/// Splits an encoded raft-rs message into wire messages.
fn wire_messages(bytes: Vec<u8>, id: u64) -> Vec<ReplicaMsg> {
    if bytes.len() <= MSG_CHUNK_BYTES {
        let mut whole = Vec::with_capacity(1 + bytes.len());
        whole.push(WIRE_WHOLE);
        whole.extend_from_slice(&bytes);
        return vec![ReplicaMsg(whole)];
    }
    let parts = bytes.len().div_ceil(MSG_CHUNK_BYTES) as u32;
    bytes
        .chunks(MSG_CHUNK_BYTES)
        .enumerate()
        .map(|(part, chunk)| {
            let mut wire = Vec::with_capacity(1 + CHUNK_HEADER_BYTES + chunk.len());
            wire.push(WIRE_CHUNK);
            wire.extend_from_slice(&id.to_be_bytes());
            wire.extend_from_slice(&(part as u32).to_be_bytes());
            wire.extend_from_slice(&parts.to_be_bytes());
            wire.extend_from_slice(chunk);
            ReplicaMsg(wire)
        })
        .collect()
}

/// A restore error of group `group`.
fn group_error(group: u32, what: String) -> RestoreError {
    RestoreError(format!("group {group}: {what}"))
}

/// One group's durable records, as [`RaftReplica::restore`] reads them back.
struct Records {
    hard_state: Option<HardState>,
    snapshot: Option<Snapshot>,
    /// The log after the snapshot, without gaps.
    entries: Vec<Entry>,
}

impl Records {
    /// Reads group `group`'s records from `durable`: every one must decode, a snapshot must
    /// name the group's `members` (`conf_state`), and the entries must follow it without a
    /// gap.
    fn read(
        group: u32,
        members: u32,
        conf_state: &ConfState,
        durable: &BTreeMap<Vec<u8>, Vec<u8>>,
    ) -> Result<Self, RestoreError> {
        let mut entries = Vec::new();
        let prefix = key_prefix(group);
        let mut hard_state = None;
        let mut snapshot = None;
        let error = |what: String| group_error(group, what);
        for (key, value) in durable.range(prefix.clone()..) {
            if !key.starts_with(&prefix) {
                break;
            }
            match key.get(prefix.len()) {
                Some(&KIND_HARD_STATE) => {
                    hard_state = Some(
                        HardState::parse_from_bytes(value)
                            .map_err(|e| error(format!("hard state does not decode: {e}")))?,
                    );
                }
                Some(&KIND_ENTRY) => {
                    let entry = Entry::parse_from_bytes(value)
                        .map_err(|e| error(format!("log entry does not decode: {e}")))?;
                    entries.push(entry);
                }
                Some(&KIND_SNAPSHOT) => {
                    let snap = Snapshot::parse_from_bytes(value)
                        .map_err(|e| error(format!("snapshot does not decode: {e}")))?;
                    if snap.get_metadata().get_conf_state().voters != conf_state.voters {
                        return Err(error(format!(
                            "snapshot names members {:?}, the group has {members}",
                            snap.get_metadata().get_conf_state().voters
                        )));
                    }
                    snapshot = Some(snap);
                }
                _ => return Err(error(format!("unknown record {key:?}"))),
            }
        }
        let records = Self { hard_state, snapshot, entries };
        let snapshot_index = records.snapshot_index();
        for (i, entry) in records.entries.iter().enumerate() {
            let expected = snapshot_index + 1 + i as u64;
            if entry.index != expected {
                return Err(error(format!(
                    "log has a gap: entry {} where {expected} was expected (snapshot at \
                     {snapshot_index})",
                    entry.index
                )));
            }
        }
        Ok(records)
    }

    /// The snapshot's index (0: none).
    fn snapshot_index(&self) -> u64 {
        self.snapshot.as_ref().map_or(0, |s| s.get_metadata().index)
    }

    /// The last durable index: the last entry's, else the snapshot's.
    fn last_index(&self) -> u64 {
        self.entries.last().map_or(self.snapshot_index(), |e| e.index)
    }

    /// Raft-rs's storage holding the records, for group `group` of `conf_state`. The hard
    /// state may not commit past the log's end.
    fn storage(&self, group: u32, conf_state: &ConfState) -> Result<LogStorage, RestoreError> {
        let error = |what: String| group_error(group, what);
        let snapshot_index = self.snapshot_index();
        let durable_last_index = self.last_index();
        let mem = MemStorage::new_with_conf_state(conf_state.clone());
        let mut storage = LogStorage { mem, snapshot: Snapshot::default() };
        if let Some(snap) = &self.snapshot {
            storage.mem.wl().apply_snapshot(snap.clone()).map_err(|e| error(e.to_string()))?;
            storage.snapshot = snap.clone();
        }
        if let Some(mut hs) = self.hard_state.clone() {
            if hs.commit > durable_last_index {
                return Err(error(format!(
                    "hard state commits {} but the log ends at {durable_last_index}",
                    hs.commit
                )));
            }
            // A snapshot is of committed state; the hard state written before it may say less.
            hs.commit = hs.commit.max(snapshot_index);
            let snapshot_term = self.snapshot.as_ref().map_or(0, |s| s.get_metadata().term);
            if hs.term < snapshot_term {
                // Never the case when the snapshot was written after the hard state of its
                // term; kept safe anyway: a newer term, with no vote cast in it.
                hs.term = snapshot_term;
                hs.vote = 0;
            }
            storage.mem.wl().set_hardstate(hs);
        }
        storage.mem.wl().append(&self.entries).map_err(|e| error(e.to_string()))?;
        Ok(storage)
    }
}

/// Raft-rs's configuration for member `slot`, whose state machine has applied up to
/// `applied` (the restored snapshot's index).
fn raft_config(slot: Slot, timing: &RaftTiming, applied: u64) -> Config {
    Config {
        id: u64::from(slot) + 1,
        election_tick: timing.election_ticks,
        heartbeat_tick: timing.heartbeat_ticks,
        min_election_tick: timing.election_ticks,
        max_election_tick: 2 * timing.election_ticks,
        // The state machine lives in memory: it is rebuilt from the snapshot, then by
        // replaying the committed entries after it.
        applied,
        max_size_per_msg: MSG_BYTES_MAX,
        max_inflight_msgs: INFLIGHT_MSGS_MAX,
        check_quorum: true,
        pre_vote: true,
        ..Config::default()
    }
}

impl std::fmt::Debug for RaftReplica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftReplica")
            .field("group", &self.group)
            .field("id", &self.node.raft.id)
            .field("term", &self.node.raft.term)
            .field("role", &self.node.raft.state)
            .field("commit", &self.node.raft.raft_log.committed)
            .field("snapshot", &self.node.store().snapshot_index())
            .finish()
    }
}

impl RaftReplica {
    /// Member `slot` of group `group` with `members` members, rebuilt from `durable` (the
    /// node's log store: empty on first start).
    pub fn restore(
        group: u32,
        slot: Slot,
        members: u32,
        timing: RaftTiming,
        durable: &BTreeMap<Vec<u8>, Vec<u8>>,
    ) -> Result<Self, RestoreError> {
        assert!(slot < members, "slot {slot} of a {members}-member group");
        let voters: Vec<u64> = (1..=u64::from(members)).collect();
        let conf_state = ConfState::from((voters, Vec::new()));
        let error = |what: String| group_error(group, what);
        let records = Records::read(group, members, &conf_state, durable)?;
        let snapshot_index = records.snapshot_index();
        let durable_last_index = records.last_index();
        let storage = records.storage(group, &conf_state)?;
        let snapshot = records.snapshot;
        let config = raft_config(slot, &timing, snapshot_index);
        config.validate().map_err(|e| error(e.to_string()))?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let node = RawNode::new(&config, storage, &logger).map_err(|e| error(e.to_string()))?;
        let mut replica = Self {
            node,
            group,
            conf_state,
            pending: VecDeque::new(),
            token_next: 0,
            durable_first_index: snapshot_index + 1,
            durable_last_index,
            restored_last_index: durable_last_index,
            // Until the restored snapshot is handed over (with the first effects), the driver's
            // state is the initial one.
            applied_index: 0,
            restore_pending: snapshot,
            received_snapshot_persist: None,
            leading: false,
            rng: child_rng(
                timing.seed,
                "raft-election",
                (u64::from(group) << 32) | u64::from(slot),
            ),
            timing,
            drawn_for: (u64::MAX, StateRole::Follower, u64::MAX),
            ticks: 0,
            snapshot_sent_at: BTreeMap::new(),
            snapshot_counts: SnapshotCounts::default(),
            chunked_next: 0,
            snapshot_refused_at: 0,
            applied_bytes_since_snapshot: 0,
            snapshot_bytes_last: 0,
            reassembly: BTreeMap::new(),
        };
        replica.redraw_election_timeout();
        Ok(replica)
    }

    /// Replaces raft-rs's `thread_rng` draw with a seeded one whenever it drew anew.
    fn redraw_election_timeout(&mut self) {
        let raft = &self.node.raft;
        let now = (raft.term, raft.state, raft.leader_id);
        if now == self.drawn_for {
            return;
        }
        self.drawn_for = now;
        let election_ticks = self.timing.election_ticks;
        let ticks = election_ticks + uniform_u64(&mut self.rng, election_ticks as u64) as usize;
        self.node.raft.set_randomized_election_timeout(ticks);
    }

    /// The group (shard) this replica belongs to.
    pub fn group(&self) -> u32 {
        self.group
    }

    /// The current term.
    pub fn term(&self) -> u64 {
        self.node.raft.term
    }

    /// The highest index this replica knows committed.
    pub fn commit_index(&self) -> u64 {
        self.node.raft.raft_log.committed
    }

    /// The index of the latest snapshot this replica holds (0: none).
    pub fn snapshot_index(&self) -> u64 {
        self.node.store().snapshot_index()
    }

    fn send(&mut self, msgs: Vec<Message>, out: &mut Vec<ReplicaEffect>) {
        let mut by_slot: BTreeMap<Slot, Vec<ReplicaMsg>> = BTreeMap::new();
        for msg in msgs {
            let Some(slot) = msg.to.checked_sub(1) else { continue };
            let bytes = encode(&msg);
            if bytes.len() > MSG_CHUNK_BYTES {
                self.chunked_next += 1;
            }
            by_slot
                .entry(slot as Slot)
                .or_default()
                .extend(wire_messages(bytes, self.chunked_next));
        }
        for (to, msgs) in by_slot {
            out.push(ReplicaEffect::Send { to, msgs });
        }
    }

    fn apply(&mut self, entries: Vec<Entry>, out: &mut Vec<ReplicaEffect>) {
        let Some(last) = entries.last().map(|e| e.index) else { return };
        for entry in entries {
            debug_assert!(entry.index > self.applied_index, "entries apply in order, once");
            // A new leader's empty entry commits its term; membership never changes here.
            if entry.get_entry_type() == EntryType::EntryNormal && !entry.data.is_empty() {
                self.applied_bytes_since_snapshot += entry.data.len() as u64;
                out.push(ReplicaEffect::Apply { index: entry.index, command: entry.data.to_vec() });
            }
        }
        self.applied_index = last;
        self.node.advance_apply_to(last);
    }

    /// Hands `snapshot`'s state to the driver.
    fn restore_state(&mut self, snapshot: &Snapshot, out: &mut Vec<ReplicaEffect>) {
        let index = snapshot.get_metadata().index;
        assert!(
            index > self.applied_index,
            "group {}: a snapshot at {index} would move the state back from {}",
            self.group,
            self.applied_index,
        );
        self.applied_index = index;
        self.applied_bytes_since_snapshot = 0;
        self.snapshot_bytes_last = snapshot.get_data().len() as u64;
        out.push(ReplicaEffect::Restore { index, data: snapshot.get_data().to_vec() });
    }

    /// Queues a persist of `records` for the driver.
    fn push_persist(
        &mut self,
        number: Option<u64>,
        after: Vec<Message>,
        records: Vec<(Vec<u8>, Option<Vec<u8>>)>,
        sync: bool,
        out: &mut Vec<ReplicaEffect>,
    ) {
        assert!(self.pending.len() < PENDING_PERSISTS_MAX, "persists stopped completing");
        let token = self.token_next;
        self.token_next += 1;
        self.pending.push_back(PendingPersist { token, number, after });
        out.push(ReplicaEffect::Persist { token, records, sync });
    }

    /// Drains raft-rs's `Ready` until it has nothing more.
    fn handle_ready(&mut self, out: &mut Vec<ReplicaEffect>) {
        if let Some(snapshot) = self.restore_pending.take() {
            self.snapshot_counts.restored += 1;
            self.restore_state(&snapshot, out);
        }
        while self.node.has_ready() {
            let mut ready = self.node.ready();
            let number = ready.number();
            self.send(ready.take_messages(), out);
            let mut records = Vec::new();
            let got_snapshot = !ready.snapshot().is_empty();
            if got_snapshot {
                // A leader's snapshot replaces this follower's whole log.
                let snapshot = ready.snapshot().clone();
                let index = snapshot.get_metadata().index;
                for stale in self.durable_first_index..=self.durable_last_index {
                    records.push((entry_key(self.group, stale), None));
                }
                records.push((snapshot_key(self.group), Some(encode(&snapshot))));
                self.durable_first_index = index + 1;
                self.durable_last_index = index;
                let store = self.node.mut_store();
                store
                    .mem
                    .wl()
                    .apply_snapshot(snapshot.clone())
                    .expect("raft-rs hands newer snapshots");
                store.snapshot = snapshot.clone();
                self.snapshot_counts.received += 1;
                self.restore_state(&snapshot, out);
            }
            let committed = ready.take_committed_entries();
            self.apply(committed, out);
            let store = self.node.mut_store().mem.clone();
            if !ready.entries().is_empty() {
                let entries = ready.entries();
                store.wl().append(entries).expect("raft-rs hands appendable entries");
                for entry in entries {
                    records.push((entry_key(self.group, entry.index), Some(encode(entry))));
                }
                let last = entries.last().expect("non-empty").index;
                // A follower's log may be cut back by a new leader: drop the stale tail.
                for stale in last + 1..=self.durable_last_index {
                    records.push((entry_key(self.group, stale), None));
                }
                self.durable_last_index = last;
            }
            if let Some(hs) = ready.hs() {
                store.wl().set_hardstate(hs.clone());
                records.push((hard_state_key(self.group), Some(encode(hs))));
            }
            let sync = ready.must_sync();
            let after = ready.take_persisted_messages();
            self.node.advance_append_async(ready);
            match self.pending.back_mut() {
                None if records.is_empty() => {
                    self.node.on_persist_ready(number);
                    self.send(after, out);
                }
                // Nothing to write: durable once the persist before it is.
                Some(last) if records.is_empty() => {
                    last.number = Some(number);
                    last.after.extend(after);
                }
                _ => {
                    if got_snapshot {
                        self.received_snapshot_persist = Some(self.token_next);
                    }
                    self.push_persist(Some(number), after, records, sync, out)
                }
            }
        }
        self.redraw_election_timeout();
        let leading = self.node.raft.state == StateRole::Leader;
        if leading != self.leading {
            self.leading = leading;
            self.snapshot_sent_at.clear();
            out.push(ReplicaEffect::Leadership(leading));
        }
    }

    /// A leader reports a snapshot its follower has not acknowledged in time as failed, so
    /// raft-rs sends it again instead of waiting forever for a message that was lost.
    fn retry_lost_snapshots(&mut self) {
        if self.node.raft.state != StateRole::Leader {
            return;
        }
        let waiting: Vec<u64> = self
            .node
            .raft
            .prs()
            .iter()
            .filter(|(_, p)| p.state == ProgressState::Snapshot)
            .map(|(&id, _)| id)
            .collect();
        self.snapshot_sent_at.retain(|id, _| waiting.contains(id));
        for id in waiting {
            let since = *self.snapshot_sent_at.entry(id).or_insert(self.ticks);
            if self.ticks - since >= SNAPSHOT_RETRY_TICKS {
                self.snapshot_sent_at.remove(&id);
                self.node.report_snapshot(id, SnapshotStatus::Failure);
            }
        }
    }
}

impl RaftReplica {
    /// The raft-rs message a wire message from `from` completes, if any: a whole one, or the
    /// last missing chunk of one. Malformed wire messages are dropped.
    fn receive(&mut self, from: Slot, wire: Vec<u8>) -> Option<Vec<u8>> {
        match *wire.first()? {
            WIRE_WHOLE => Some(wire[1..].to_vec()),
            WIRE_CHUNK if wire.len() > 1 + CHUNK_HEADER_BYTES => {
                let field = |at: usize, len: usize| &wire[1 + at..1 + at + len];
                let id = u64::from_be_bytes(field(0, 8).try_into().ok()?);
                let part = u32::from_be_bytes(field(8, 4).try_into().ok()?);
                let parts = u32::from_be_bytes(field(12, 4).try_into().ok()?);
                if !(2..=self.timing.chunk_parts_max()).contains(&parts) || part >= parts {
                    return None;
                }
                let chunk = wire[1 + CHUNK_HEADER_BYTES..].to_vec();
                if chunk.len() > MSG_CHUNK_BYTES {
                    return None;
                }
                let entry = self.reassembly.entry(from).or_insert_with(|| Reassembly {
                    id,
                    parts,
                    chunks: BTreeMap::new(),
                });
                if entry.id != id || entry.parts != parts {
                    // Another message: the unfinished one is given up (raft-rs resends a
                    // snapshot that is not acknowledged). Ids are not compared: a restarted
                    // sender numbers from 1 again.
                    *entry = Reassembly { id, parts, chunks: BTreeMap::new() };
                }
                entry.chunks.insert(part, chunk);
                if entry.chunks.len() < parts as usize {
                    return None;
                }
                let done = self.reassembly.remove(&from)?;
                Some(done.chunks.into_values().flatten().collect())
            }
            _ => None,
        }
    }
}

fn encode(message: &impl protobuf::Message) -> Vec<u8> {
    message.write_to_bytes().expect("raft records encode")
}

impl Replica for RaftReplica {
    fn tick(&mut self, out: &mut Vec<ReplicaEffect>) {
        self.ticks += 1;
        if self.received_snapshot_persist.is_none() {
            self.node.tick();
        }
        self.retry_lost_snapshots();
        self.handle_ready(out);
    }

    fn on_message(&mut self, from: Slot, msgs: Vec<ReplicaMsg>, out: &mut Vec<ReplicaEffect>) {
        let id = self.node.raft.id;
        for ReplicaMsg(bytes) in msgs {
            let Some(bytes) = self.receive(from, bytes) else { continue };
            let Ok(msg) = Message::parse_from_bytes(&bytes) else { continue };
            // A message that lies about its ends is dropped, not stepped.
            if msg.from != u64::from(from) + 1 || msg.to != id {
                continue;
            }
            // A leader hand-over would start an election (see `received_snapshot_persist`).
            if self.received_snapshot_persist.is_some()
                && msg.get_msg_type() == MessageType::MsgTimeoutNow
            {
                continue;
            }
            let _ = self.node.step(msg);
        }
        self.handle_ready(out);
    }

    fn propose(
        &mut self,
        command: Vec<u8>,
        out: &mut Vec<ReplicaEffect>,
    ) -> Result<(), ProposeError> {
        if !self.is_leader() {
            return Err(ProposeError::NotLeader { leader: self.leader() });
        }
        assert!(!command.is_empty(), "an empty command is the leader's no-op");
        let result = self.node.propose(Vec::new(), command);
        self.handle_ready(out);
        result.map_err(|_| ProposeError::Dropped)
    }

    fn on_persisted(&mut self, token: u64, out: &mut Vec<ReplicaEffect>) {
        if self.pending.front().map(|p| p.token) != Some(token) {
            // Persists complete in order; anything else is a stale token (before a restart).
            return;
        }
        let done = self.pending.pop_front().expect("checked above");
        if self.received_snapshot_persist == Some(token) {
            self.received_snapshot_persist = None;
        }
        if let Some(number) = done.number {
            self.node.on_persist_ready(number);
            // A snapshot from the leader counts as applied for raft-rs once it is durable
            // (raft-rs reads the entries after its applied index; those before are gone).
            let log = &self.node.raft.raft_log;
            let applied = self.applied_index.min(log.persisted).min(log.committed);
            if applied > log.applied {
                self.node.advance_apply_to(applied);
            }
        }
        self.send(done.after, out);
        self.handle_ready(out);
    }

    fn is_leader(&self) -> bool {
        self.node.raft.state == StateRole::Leader
    }

    fn leader(&self) -> Option<Slot> {
        self.node.raft.leader_id.checked_sub(1).map(|slot| slot as Slot)
    }

    fn transfer_leader(&mut self, slot: Slot, out: &mut Vec<ReplicaEffect>) {
        self.node.transfer_leader(u64::from(slot) + 1);
        self.handle_ready(out);
    }

    /// The highest index whose command the driver has been handed (or that a snapshot it
    /// was handed covers).
    fn applied_index(&self) -> u64 {
        self.applied_index
    }

    /// Snapshots taken, received and restored so far.
    fn snapshot_counts(&self) -> SnapshotCounts {
        self.snapshot_counts
    }

    /// The index a read arriving now must wait for (read-index, served from the leader's
    /// lease): `None` unless this replica leads and has committed an entry of its own term
    /// (until then it may not know everything committed before it). A read is served once
    /// [`RaftReplica::applied_index`] reaches it. The lease: with check-quorum a leader that
    /// loses touch with a quorum steps down within an election timeout, and with pre-vote no
    /// follower that heard from it within its own timeout votes for another, so while it leads
    /// no other leader has committed anything.
    fn read_index(&self) -> Option<u64> {
        let raft = &self.node.raft;
        (raft.in_lease() && raft.commit_to_current_term()).then_some(raft.raft_log.committed)
    }

    /// True when enough entries have been applied since the last snapshot to take another:
    /// the interval's count, holding enough bytes for the state's size (see
    /// [`SNAPSHOT_BYTES_PER_LOG_BYTE_MAX`]).
    fn snapshot_due(&self) -> bool {
        self.applied_index
            >= self.snapshot_index().max(self.snapshot_refused_at)
                + self.timing.snapshot_interval_entries
            && (self.timing.snapshot_bytes_per_log_byte_max == 0
                || self
                    .applied_bytes_since_snapshot
                    .saturating_mul(self.timing.snapshot_bytes_per_log_byte_max)
                    >= self.snapshot_bytes_last)
    }

    /// Takes a snapshot at the applied index: `data` is the driver's state machine after
    /// applying every command it was handed. Persists it, deletes the durable entries it
    /// covers (atomically, in the same persist), and drops all but the last
    /// [`RaftTiming::kept_entries`] of them from memory.
    fn take_snapshot(&mut self, data: Vec<u8>, out: &mut Vec<ReplicaEffect>) {
        let index = self.applied_index;
        if index <= self.snapshot_index().max(self.snapshot_refused_at) {
            return;
        }
        // Taken or refused, the state was encoded: the next one waits for its share of log.
        self.applied_bytes_since_snapshot = 0;
        self.snapshot_bytes_last = data.len() as u64;
        if data.len() > self.timing.snapshot_bytes_max.min(SNAPSHOT_BYTES_MAX_LIMIT) {
            // No member would accept it: keep the log instead, and ask again an interval later
            // rather than encoding the state after every command.
            self.snapshot_refused_at = index;
            self.snapshot_counts.refused += 1;
            return;
        }
        // Applied entries are committed and durable here, and still in memory (the log is
        // only compacted below a snapshot, which is below the applied index).
        let term = self.node.store().term(index).expect("an applied entry is in the log");
        let mut snapshot = Snapshot::default();
        snapshot.set_data(data.into());
        let meta = snapshot.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(self.conf_state.clone());
        let mut records = Vec::new();
        records.push((snapshot_key(self.group), Some(encode(&snapshot))));
        let covered_last = index.min(self.durable_last_index);
        for stale in self.durable_first_index..=covered_last {
            records.push((entry_key(self.group, stale), None));
        }
        self.durable_first_index = self.durable_first_index.max(index + 1);
        self.snapshot_counts.taken += 1;
        let store = self.node.mut_store();
        store.snapshot = snapshot;
        let keep_from = index.saturating_sub(self.timing.kept_entries()).max(1);
        let _ = store.mem.wl().compact(keep_from);
        // No message waits for this persist, and nothing depends on it being synced: the
        // entries it deletes stay until it is durable, and a later sync makes it durable.
        self.push_persist(None, Vec::new(), records, false, out);
    }

    /// The snapshot this replica was restored from, until it is handed over: its index and
    /// the driver's image (so the driver can check the image before it starts).
    fn restored_snapshot(&self) -> Option<(u64, &[u8])> {
        self.restore_pending.as_ref().map(|s| (s.get_metadata().index, s.get_data()))
    }

    /// The last log index this replica held when it was restored (0 on a first start): the
    /// entries up to it are a replay.
    fn restored_last_index(&self) -> u64 {
        self.restored_last_index
    }

    /// Entries held in memory.
    fn log_entries(&self) -> u64 {
        let store = self.node.store();
        let (first, last) = (store.first_index().unwrap_or(1), store.last_index().unwrap_or(0));
        (last + 1).saturating_sub(first)
    }

    /// True when this replica leads and the member in `slot` has every entry this leader has
    /// and answered recently: handing leadership to it now costs no wait.
    fn is_caught_up(&self, slot: Slot) -> bool {
        let raft = &self.node.raft;
        if raft.state != StateRole::Leader || raft.lead_transferee.is_some() {
            return false;
        }
        let last = raft.raft_log.last_index();
        raft.prs().get(u64::from(slot) + 1).is_some_and(|p| p.recent_active && p.matched == last)
    }

    /// Hands out whatever raft-rs has ready (after a restore: the snapshot, then the committed
    /// entries of the log to replay), without a tick or a message.
    fn poll(&mut self, out: &mut Vec<ReplicaEffect>) {
        self.handle_ready(out);
    }

    /// Starts an election now (tests and leader hand-over).
    fn campaign(&mut self, out: &mut Vec<ReplicaEffect>) {
        if self.received_snapshot_persist.is_none() {
            let _ = self.node.campaign();
        }
        self.handle_ready(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica() -> RaftReplica {
        RaftReplica::restore(1, 0, 3, RaftTiming::standard(1, 64), &BTreeMap::new()).unwrap()
    }

    #[test]
    fn reads_wait_until_the_leader_has_committed_in_its_term() {
        let mut solo =
            RaftReplica::restore(1, 0, 1, RaftTiming::standard(1, 64), &BTreeMap::new()).unwrap();
        assert_eq!(solo.read_index(), None, "not leading");
        let mut out = Vec::new();
        solo.campaign(&mut out);
        assert!(solo.is_leader());
        // Its term's empty entry is not durable yet, so not committed: no reads.
        assert_eq!(solo.read_index(), None);
        settle(&mut solo, &mut out);
        let index = solo.read_index().expect("committed in its term");
        assert!(index >= 1 && solo.applied_index() >= index);
        // A member of a three-member group that has not won an election serves no reads.
        assert_eq!(replica().read_index(), None);
    }

    /// A solo member that leads, with every persist completed.
    fn solo_leader(timing: RaftTiming) -> RaftReplica {
        let mut solo = RaftReplica::restore(1, 0, 1, timing, &BTreeMap::new()).unwrap();
        let mut out = Vec::new();
        solo.campaign(&mut out);
        settle(&mut solo, &mut out);
        solo
    }

    /// Completes every persist `out` asks for, and the ones that follow from them.
    fn settle(replica: &mut RaftReplica, out: &mut Vec<ReplicaEffect>) {
        for _ in 0..16 {
            let tokens: Vec<u64> = out
                .drain(..)
                .filter_map(|e| match e {
                    ReplicaEffect::Persist { token, .. } => Some(token),
                    _ => None,
                })
                .collect();
            for token in tokens {
                replica.on_persisted(token, out);
            }
        }
    }

    /// Applies `count` commands of `bytes` bytes each.
    fn apply_commands(replica: &mut RaftReplica, count: usize, bytes: usize) {
        let mut out = Vec::new();
        for _ in 0..count {
            replica.propose(vec![7; bytes], &mut out).unwrap();
            settle(replica, &mut out);
        }
    }

    #[test]
    fn a_snapshot_waits_for_a_share_of_its_bytes_in_the_log_unless_told_not_to() {
        let mut timing = RaftTiming::standard(1, SNAPSHOT_INTERVAL_ENTRIES_MIN);
        let mut solo = solo_leader(timing);
        apply_commands(&mut solo, 8, 100);
        assert!(solo.snapshot_due(), "nothing encoded yet: the count alone");
        let mut out = Vec::new();
        solo.take_snapshot(vec![1; 8_000], &mut out);
        settle(&mut solo, &mut out);
        // 8,000 bytes of state wait for 2,000 bytes of log: 20 commands of 100, not 8.
        apply_commands(&mut solo, 19, 100);
        assert!(!solo.snapshot_due(), "1,900 bytes of log for 8,000 of state");
        apply_commands(&mut solo, 1, 100);
        assert!(solo.snapshot_due());
        // Off: the count alone decides, however large the state.
        timing.snapshot_bytes_per_log_byte_max = 0;
        let mut solo = solo_leader(timing);
        apply_commands(&mut solo, 8, 100);
        solo.take_snapshot(vec![1; 8_000], &mut out);
        settle(&mut solo, &mut out);
        apply_commands(&mut solo, 8, 100);
        assert!(solo.snapshot_due());
    }

    #[test]
    fn big_messages_go_in_chunks_and_reassemble_in_any_order() {
        let big: Vec<u8> = (0..5 * MSG_CHUNK_BYTES + 17).map(|i| (i % 251) as u8).collect();
        let mut wire = wire_messages(big.clone(), 7);
        assert_eq!(wire.len(), 6);
        assert!(wire.iter().all(|m| m.0.len() <= 1 + CHUNK_HEADER_BYTES + MSG_CHUNK_BYTES));
        wire.reverse();
        wire.insert(2, wire[0].clone()); // a duplicate
        let mut r = replica();
        let mut done = Vec::new();
        for ReplicaMsg(bytes) in wire {
            done.extend(r.receive(2, bytes));
        }
        assert_eq!(done, vec![big.clone()]);
        // A small message is whole; chunks of another message replace an unfinished one.
        assert_eq!(r.receive(1, wire_messages(vec![9; 10], 0)[0].0.clone()), Some(vec![9; 10]));
        let first = wire_messages(big.clone(), 8);
        let second = wire_messages(big.clone(), 1);
        assert_eq!(r.receive(2, first[0].0.clone()), None);
        let mut got = Vec::new();
        for ReplicaMsg(bytes) in second {
            got.extend(r.receive(2, bytes));
        }
        assert_eq!(got, vec![big]);
        // Malformed chunks are dropped, never panic.
        for bad in [vec![], vec![WIRE_CHUNK], vec![WIRE_CHUNK; 17], vec![7, 1, 2]] {
            assert_eq!(r.receive(0, bad), None);
        }
        // A message announcing more chunks than the receiver's snapshot limit is dropped
        // before anything is buffered.
        let mut timing = RaftTiming::standard(1, 64);
        timing.snapshot_bytes_max = 4 * MSG_CHUNK_BYTES;
        let mut small =
            RaftReplica::restore(1, 0, 3, timing, &BTreeMap::new()).expect("empty log restores");
        assert_eq!(small.receive(2, first[0].0.clone()), None);
        assert!(small.reassembly.is_empty(), "nothing buffered for an oversized message");
        let mut bad_part = first[1].0.clone();
        bad_part[9..13].copy_from_slice(&99u32.to_be_bytes());
        assert_eq!(r.receive(0, bad_part), None);
    }
}
