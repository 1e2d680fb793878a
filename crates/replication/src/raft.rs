//! [`RaftReplica`]: one member of one Raft group, over tikv/raft-rs's `RawNode`.
//!
//! Each pass over raft-rs's `Ready` sends what may go at once (a leader's appends), applies
//! the committed entries this replica already holds durably, appends new entries and the hard
//! state to the in-memory `MemStorage` raft-rs reads from, and asks the driver to persist the
//! same records. Messages raft-rs allows only after persistence (votes, append
//! acknowledgements) wait for that persist's `on_persisted`; persists complete in order.
//!
//! Durable layout (keys in the node's log store, big-endian so key order is log order):
//! `'R' ‖ group:u32 ‖ 0` → hard state; `'R' ‖ group:u32 ‖ 1 ‖ index:u64` → entry (protobuf).
//! A restarted replica rebuilds its storage from those records with `applied = 0`, so the
//! committed prefix is applied again from the start: the state machine is rebuilt by replay.
//!
//! In-memory compaction without snapshots: the leader knows how far every member's durable log
//! reaches; entries below that (less a margin) are never sent again, so the group may drop
//! them from memory. The leader proposes the point through the log and every member compacts
//! when it applies it ([`RaftReplica::compaction_point`], [`RaftReplica::compact`]). The
//! durable records stay whole (restart replays them), so memory stays bounded while the disk
//! log grows; snapshots would bound both.
//!
//! Determinism: raft-rs draws a randomized election timeout from `thread_rng` whenever a member
//! changes term, role or leader. This replica overrides that draw at once, before it can
//! matter, with one from its own seeded stream, so timeouts stay random (two members that
//! always timed out together would split every vote forever: swarm seed 206678 of
//! `list-append`) and runs stay reproducible.

use crate::{ProposeError, Replica, ReplicaEffect, ReplicaMsg, Slot};
use meridian_core::rng::{child_rng, uniform_u64, Rng};
use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Message};
use raft::storage::MemStorage;
use raft::{Config, RawNode, StateRole, Storage as _};
use std::collections::{BTreeMap, VecDeque};

/// First byte of every replication key in the node's log store.
pub const KEY_PREFIX: u8 = b'R';
const KIND_HARD_STATE: u8 = 0;
const KIND_ENTRY: u8 = 1;
/// Most bytes of entries in one append message.
pub const MSG_BYTES_MAX: u64 = 1 << 20;
/// Most append messages in flight to one follower.
pub const INFLIGHT_MSGS_MAX: usize = 256;
/// Entries kept below the lowest index every member holds, so a new leader's probes never
/// reach a compacted entry.
pub const COMPACT_MARGIN_ENTRIES: u64 = 1_024;
/// A compaction is worth proposing once this many entries can go.
pub const COMPACT_BATCH_ENTRIES: u64 = 8_192;
/// Most persists that may be outstanding before the replica stops issuing new ones.
pub const PENDING_PERSISTS_MAX: usize = 1 << 16;

/// Timing of one group's members, in ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaftTiming {
    /// Ticks without a leader's word before a follower campaigns (the minimum; each timeout
    /// is drawn from `election_ticks..2 * election_ticks`).
    pub election_ticks: usize,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_ticks: usize,
    /// Seeds this member's election timeouts.
    pub seed: u64,
}

impl RaftTiming {
    /// 10 election ticks, heartbeat every 2: with a 25 ms tick, elections after 250–500 ms.
    pub fn standard(seed: u64) -> Self {
        Self { election_ticks: 10, heartbeat_ticks: 2, seed }
    }
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

/// A persist the driver has not completed yet.
#[derive(Debug)]
struct PendingPersist {
    /// The token the driver hands back (the first ready number it covers).
    token: u64,
    /// The last ready number it covers: readies with nothing to write that came after it are
    /// durable as soon as it is.
    number: u64,
    /// Messages raft-rs lets go only after these readies are durable.
    after: Vec<Message>,
}

/// One member of one Raft group.
pub struct RaftReplica {
    node: RawNode<MemStorage>,
    group: u32,
    /// Persists outstanding, oldest first.
    pending: VecDeque<PendingPersist>,
    /// Highest log index the durable records hold.
    durable_last_index: u64,
    /// The last index of the log this replica was restored with.
    restored_last_index: u64,
    leading: bool,
    /// Draws election timeouts.
    rng: Rng,
    election_ticks: usize,
    /// Term, role and leader when the timeout was last drawn.
    drawn_for: (u64, StateRole, u64),
}

impl std::fmt::Debug for RaftReplica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftReplica")
            .field("group", &self.group)
            .field("id", &self.node.raft.id)
            .field("term", &self.node.raft.term)
            .field("role", &self.node.raft.state)
            .field("commit", &self.node.raft.raft_log.committed)
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
        let storage = MemStorage::new_with_conf_state(ConfState::from((voters, Vec::new())));
        let mut entries = Vec::new();
        let prefix = key_prefix(group);
        let mut hard_state = None;
        for (key, value) in durable.range(prefix.clone()..) {
            if !key.starts_with(&prefix) {
                break;
            }
            match key.get(prefix.len()) {
                Some(&KIND_HARD_STATE) => {
                    hard_state = Some(HardState::parse_from_bytes(value).map_err(|e| {
                        RestoreError(format!("group {group}: hard state does not decode: {e}"))
                    })?);
                }
                Some(&KIND_ENTRY) => {
                    let entry = Entry::parse_from_bytes(value).map_err(|e| {
                        RestoreError(format!("group {group}: log entry does not decode: {e}"))
                    })?;
                    entries.push(entry);
                }
                _ => return Err(RestoreError(format!("group {group}: unknown record {key:?}"))),
            }
        }
        for (i, entry) in entries.iter().enumerate() {
            if entry.index != i as u64 + 1 {
                return Err(RestoreError(format!(
                    "group {group}: log has a gap: entry {} where {} was expected",
                    entry.index,
                    i + 1
                )));
            }
        }
        let durable_last_index = entries.last().map_or(0, |e| e.index);
        if let Some(hs) = &hard_state {
            if hs.commit > durable_last_index {
                return Err(RestoreError(format!(
                    "group {group}: hard state commits {} but the log ends at {durable_last_index}",
                    hs.commit
                )));
            }
        }
        storage.wl().append(&entries).map_err(|e| RestoreError(format!("group {group}: {e}")))?;
        if let Some(hs) = hard_state {
            storage.wl().set_hardstate(hs);
        }
        let config = Config {
            id: u64::from(slot) + 1,
            election_tick: timing.election_ticks,
            heartbeat_tick: timing.heartbeat_ticks,
            min_election_tick: timing.election_ticks,
            max_election_tick: 2 * timing.election_ticks,
            // The state machine lives in memory: replay the whole committed log.
            applied: 0,
            max_size_per_msg: MSG_BYTES_MAX,
            max_inflight_msgs: INFLIGHT_MSGS_MAX,
            check_quorum: true,
            pre_vote: true,
            ..Config::default()
        };
        config.validate().map_err(|e| RestoreError(format!("group {group}: {e}")))?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let node = RawNode::new(&config, storage, &logger)
            .map_err(|e| RestoreError(format!("group {group}: {e}")))?;
        let mut replica = Self {
            node,
            group,
            pending: VecDeque::new(),
            durable_last_index,
            restored_last_index: durable_last_index,
            leading: false,
            rng: child_rng(
                timing.seed,
                "raft-election",
                (u64::from(group) << 32) | u64::from(slot),
            ),
            election_ticks: timing.election_ticks,
            drawn_for: (u64::MAX, StateRole::Follower, u64::MAX),
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
        let ticks =
            self.election_ticks + uniform_u64(&mut self.rng, self.election_ticks as u64) as usize;
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

    /// Where the group may compact its in-memory logs: below the lowest index every member holds
    /// durably and this leader has applied, less [`COMPACT_MARGIN_ENTRIES`]; `None` unless this
    /// replica leads and at least [`COMPACT_BATCH_ENTRIES`] entries would go.
    pub fn compaction_point(&self) -> Option<u64> {
        let raft = &self.node.raft;
        if raft.state != StateRole::Leader {
            return None;
        }
        let held = raft.prs().iter().map(|(_, p)| p.matched).min()?;
        let point = held.min(raft.raft_log.applied).saturating_sub(COMPACT_MARGIN_ENTRIES);
        let first = self.node.store().first_index().ok()?;
        (point >= first + COMPACT_BATCH_ENTRIES).then_some(point)
    }

    /// Drops in-memory entries below `below` (never past what this replica applied). Called when
    /// the leader's compaction point is applied from the log.
    pub fn compact(&mut self, below: u64) {
        let to = below.min(self.node.raft.raft_log.applied);
        if to <= self.durable_last_index {
            let _ = self.node.mut_store().wl().compact(to);
        }
    }

    /// The last log index this replica held when it was restored (0 on a first start): the
    /// entries up to it are a replay.
    pub fn restored_last_index(&self) -> u64 {
        self.restored_last_index
    }

    /// Entries held in memory.
    pub fn log_entries(&self) -> u64 {
        let store = self.node.store();
        let (first, last) = (store.first_index().unwrap_or(1), store.last_index().unwrap_or(0));
        (last + 1).saturating_sub(first)
    }

    /// True when this replica leads and the member in `slot` has every entry this leader has
    /// and answered recently: handing leadership to it now costs no wait.
    pub fn is_caught_up(&self, slot: Slot) -> bool {
        let raft = &self.node.raft;
        if raft.state != StateRole::Leader || raft.lead_transferee.is_some() {
            return false;
        }
        let last = raft.raft_log.last_index();
        raft.prs().get(u64::from(slot) + 1).is_some_and(|p| p.recent_active && p.matched == last)
    }

    /// Hands out whatever raft-rs has ready (after a restore: the committed entries of the
    /// log, to replay), without a tick or a message.
    pub fn poll(&mut self, out: &mut Vec<ReplicaEffect>) {
        self.handle_ready(out);
    }

    /// Starts an election now (tests and leader hand-over).
    pub fn campaign(&mut self, out: &mut Vec<ReplicaEffect>) {
        let _ = self.node.campaign();
        self.handle_ready(out);
    }

    fn send(&self, msgs: Vec<Message>, out: &mut Vec<ReplicaEffect>) {
        let mut by_slot: BTreeMap<Slot, Vec<ReplicaMsg>> = BTreeMap::new();
        for msg in msgs {
            let Some(slot) = msg.to.checked_sub(1) else { continue };
            let bytes = msg.write_to_bytes().expect("raft messages encode");
            by_slot.entry(slot as Slot).or_default().push(ReplicaMsg(bytes));
        }
        for (to, msgs) in by_slot {
            out.push(ReplicaEffect::Send { to, msgs });
        }
    }

    fn apply(&mut self, entries: Vec<Entry>, out: &mut Vec<ReplicaEffect>) {
        let Some(last) = entries.last().map(|e| e.index) else { return };
        for entry in entries {
            // A new leader's empty entry commits its term; membership never changes here.
            if entry.get_entry_type() == EntryType::EntryNormal && !entry.data.is_empty() {
                out.push(ReplicaEffect::Apply { index: entry.index, command: entry.data.to_vec() });
            }
        }
        self.node.advance_apply_to(last);
    }

    /// Drains raft-rs's `Ready` until it has nothing more.
    fn handle_ready(&mut self, out: &mut Vec<ReplicaEffect>) {
        while self.node.has_ready() {
            let mut ready = self.node.ready();
            let number = ready.number();
            self.send(ready.take_messages(), out);
            // Nothing compacts the log, so no snapshot is ever sent or received.
            debug_assert!(ready.snapshot().is_empty(), "snapshots are not produced");
            let committed = ready.take_committed_entries();
            self.apply(committed, out);
            let mut records = Vec::new();
            let storage = self.node.mut_store().clone();
            if !ready.entries().is_empty() {
                let entries = ready.entries();
                storage.wl().append(entries).expect("raft-rs hands appendable entries");
                for entry in entries {
                    let bytes = entry.write_to_bytes().expect("entries encode");
                    records.push((entry_key(self.group, entry.index), Some(bytes)));
                }
                let last = entries.last().expect("non-empty").index;
                // A follower's log may be cut back by a new leader: drop the stale tail.
                for stale in last + 1..=self.durable_last_index {
                    records.push((entry_key(self.group, stale), None));
                }
                self.durable_last_index = last;
            }
            if let Some(hs) = ready.hs() {
                storage.wl().set_hardstate(hs.clone());
                let bytes = hs.write_to_bytes().expect("hard state encodes");
                records.push((hard_state_key(self.group), Some(bytes)));
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
                    last.number = number;
                    last.after.extend(after);
                }
                _ => {
                    assert!(
                        self.pending.len() < PENDING_PERSISTS_MAX,
                        "persists stopped completing"
                    );
                    self.pending.push_back(PendingPersist { token: number, number, after });
                    out.push(ReplicaEffect::Persist { token: number, records, sync });
                }
            }
        }
        self.redraw_election_timeout();
        let leading = self.node.raft.state == StateRole::Leader;
        if leading != self.leading {
            self.leading = leading;
            out.push(ReplicaEffect::Leadership(leading));
        }
    }
}

impl Replica for RaftReplica {
    fn tick(&mut self, out: &mut Vec<ReplicaEffect>) {
        self.node.tick();
        self.handle_ready(out);
    }

    fn on_message(&mut self, from: Slot, msgs: Vec<ReplicaMsg>, out: &mut Vec<ReplicaEffect>) {
        let id = self.node.raft.id;
        for ReplicaMsg(bytes) in msgs {
            let Ok(msg) = Message::parse_from_bytes(&bytes) else { continue };
            // A message that lies about its ends is dropped, not stepped.
            if msg.from != u64::from(from) + 1 || msg.to != id {
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
        self.node.on_persist_ready(done.number);
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
}
