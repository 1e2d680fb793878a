//! A Raft group under a randomized, deterministic schedule: message loss, duplication and
//! reordering, partitions, crashes that lose unfinished persists, and restarts from what was
//! durable. Members take snapshots every few entries, so lagging and restarted members are
//! brought up to date by snapshot too. Checks state-machine safety (one command per index,
//! applied in order, snapshots equal to the log they cover) and that every command a leader
//! applied survives: after healing, every replica holds it.

use meridian_core::rng::{child_rng, uniform_u64, Rng};
use meridian_replication::raft::{RaftReplica, RaftTiming};
use meridian_replication::{Replica, ReplicaEffect, ReplicaMsg, Slot};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

type Records = Vec<(Vec<u8>, Option<Vec<u8>>)>;

struct Member {
    replica: Option<RaftReplica>,
    durable: BTreeMap<Vec<u8>, Vec<u8>>,
    persists: VecDeque<(u64, Records)>,
    /// The state machine: every command applied, by index (restored from snapshots).
    state: BTreeMap<u64, Vec<u8>>,
}

/// Snapshot image of a member's state: `index:u64 LE ‖ len:u32 LE ‖ command`, repeated.
fn encode_state(state: &BTreeMap<u64, Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for (index, command) in state {
        out.extend_from_slice(&index.to_le_bytes());
        out.extend_from_slice(&(command.len() as u32).to_le_bytes());
        out.extend_from_slice(command);
    }
    out
}

fn decode_state(mut bytes: &[u8]) -> BTreeMap<u64, Vec<u8>> {
    let mut state = BTreeMap::new();
    while !bytes.is_empty() {
        let index = u64::from_le_bytes(bytes[..8].try_into().unwrap());
        let len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
        state.insert(index, bytes[12..12 + len].to_vec());
        bytes = &bytes[12 + len..];
    }
    state
}

struct Group {
    members: Vec<Member>,
    wire: Vec<(Slot, Slot, Vec<ReplicaMsg>)>,
    cut: BTreeSet<(Slot, Slot)>,
    rng: Rng,
    /// What each index committed to (from any replica's Apply).
    log: BTreeMap<u64, Vec<u8>>,
    /// Commands a leader applied: acknowledged to a client in a real protocol.
    acknowledged: BTreeSet<Vec<u8>>,
    proposals: u64,
    /// Entries between snapshots.
    interval: u64,
    /// Snapshots restored (from a leader or from disk).
    restores: u64,
}

const MEMBERS: u32 = 3;

impl Group {
    fn new(seed: u64) -> Self {
        let rng = child_rng(seed, "raft-group", 0);
        let interval = 8 * (1 + seed % 5);
        let members = (0..MEMBERS)
            .map(|slot| {
                let timing = RaftTiming::standard(seed * 31 + u64::from(slot), interval);
                Member {
                    replica: Some(
                        RaftReplica::restore(7, slot, MEMBERS, timing, &BTreeMap::new()).unwrap(),
                    ),
                    durable: BTreeMap::new(),
                    persists: VecDeque::new(),
                    state: BTreeMap::new(),
                }
            })
            .collect();
        Self {
            members,
            wire: Vec::new(),
            cut: BTreeSet::new(),
            rng,
            log: BTreeMap::new(),
            acknowledged: BTreeSet::new(),
            proposals: 0,
            interval,
            restores: 0,
        }
    }

    fn carry_out(&mut self, slot: Slot, effects: Vec<ReplicaEffect>) {
        for effect in effects {
            match effect {
                ReplicaEffect::Send { to, msgs } => self.wire.push((slot, to, msgs)),
                ReplicaEffect::Persist { token, records, .. } => {
                    self.members[slot as usize].persists.push_back((token, records))
                }
                ReplicaEffect::Restore { index, data } => {
                    let member = &mut self.members[slot as usize];
                    if let Some((&last, _)) = member.state.last_key_value() {
                        assert!(index > last, "slot {slot} restored {index} over {last}");
                    }
                    member.state = decode_state(&data);
                    self.restores += 1;
                    for (i, command) in &member.state {
                        assert!(*i <= index, "a snapshot at {index} holds entry {i}");
                        match self.log.get(i) {
                            Some(other) => assert_eq!(other, command, "snapshot differs at {i}"),
                            None => {
                                self.log.insert(*i, command.clone());
                            }
                        }
                    }
                }
                ReplicaEffect::Apply { index, command } => {
                    let member = &mut self.members[slot as usize];
                    if let Some((&last, _)) = member.state.last_key_value() {
                        assert!(index > last, "slot {slot} applied {index} after {last}");
                    }
                    member.state.insert(index, command.clone());
                    let leader = member.replica.as_ref().is_some_and(|r| r.is_leader());
                    match self.log.get(&index) {
                        Some(other) => {
                            assert_eq!(other, &command, "index {index} applied two commands")
                        }
                        None => {
                            self.log.insert(index, command.clone());
                        }
                    }
                    if leader {
                        self.acknowledged.insert(command);
                    }
                }
                ReplicaEffect::Leadership(_) => {}
            }
        }
    }

    fn with(&mut self, slot: Slot, f: impl FnOnce(&mut RaftReplica, &mut Vec<ReplicaEffect>)) {
        let mut out = Vec::new();
        if let Some(replica) = self.members[slot as usize].replica.as_mut() {
            f(replica, &mut out);
        }
        self.carry_out(slot, out);
        // As a protocol does: snapshot once enough has been applied since the last one.
        let member = &mut self.members[slot as usize];
        let Some(replica) = member.replica.as_mut() else { return };
        if replica.snapshot_due() {
            let mut out = Vec::new();
            let upto = replica.applied_index();
            let image: BTreeMap<u64, Vec<u8>> =
                member.state.range(..=upto).map(|(i, c)| (*i, c.clone())).collect();
            replica.take_snapshot(encode_state(&image), &mut out);
            self.carry_out(slot, out);
        }
    }

    fn step(&mut self, faults: bool) {
        self.step_with(faults, true)
    }

    fn step_with(&mut self, faults: bool, propose: bool) {
        let slot = uniform_u64(&mut self.rng, u64::from(MEMBERS)) as Slot;
        match uniform_u64(&mut self.rng, 100) {
            0..=29 => self.with(slot, |r, out| r.tick(out)),
            30..=64 if !self.wire.is_empty() => {
                let pick = uniform_u64(&mut self.rng, self.wire.len() as u64) as usize;
                let (from, to, msgs) =
                    if faults { self.wire.swap_remove(pick) } else { self.wire.remove(0) };
                let roll = uniform_u64(&mut self.rng, 100);
                if faults && (roll < 5 || self.cut.contains(&(from, to))) {
                    return; // lost
                }
                if faults && roll < 10 {
                    self.wire.push((from, to, msgs.clone())); // duplicated
                }
                self.with(to, |r, out| r.on_message(from, msgs, out));
            }
            65..=84 => {
                let member = &mut self.members[slot as usize];
                // One sync makes everything queued durable, completed in order.
                let queued: Vec<(u64, Records)> = if member.replica.is_some() {
                    member.persists.drain(..).collect()
                } else {
                    Vec::new()
                };
                for (token, records) in queued {
                    let member = &mut self.members[slot as usize];
                    for (key, value) in records {
                        match value {
                            Some(value) => member.durable.insert(key, value),
                            None => member.durable.remove(&key),
                        };
                    }
                    self.with(slot, |r, out| r.on_persisted(token, out));
                }
            }
            85..=92 if propose => {
                self.proposals += 1;
                let command = format!("cmd-{}", self.proposals).into_bytes();
                self.with(slot, |r, out| {
                    let _ = r.propose(command, out);
                });
            }
            93 if faults => {
                // Crash: unfinished persists and the state machine are lost.
                let member = &mut self.members[slot as usize];
                member.replica = None;
                member.persists.clear();
                member.state.clear();
            }
            94..=97 if faults && self.members[slot as usize].replica.is_none() => {
                let timing =
                    RaftTiming::standard(uniform_u64(&mut self.rng, u64::MAX), self.interval);
                let member = &mut self.members[slot as usize];
                member.replica =
                    Some(RaftReplica::restore(7, slot, MEMBERS, timing, &member.durable).unwrap());
            }
            98 if faults => {
                let to = uniform_u64(&mut self.rng, u64::from(MEMBERS)) as Slot;
                self.cut.insert((slot, to));
            }
            99 => self.cut.clear(),
            _ => {}
        }
    }

    /// Every member up, no faults, until all apply the same log.
    fn heal(&mut self) {
        self.cut.clear();
        for slot in 0..MEMBERS {
            if self.members[slot as usize].replica.is_none() {
                let member = &mut self.members[slot as usize];
                member.replica = Some(
                    RaftReplica::restore(
                        7,
                        slot,
                        MEMBERS,
                        RaftTiming::standard(u64::from(slot) + 1_000, self.interval),
                        &member.durable,
                    )
                    .unwrap(),
                );
            }
        }
        for _ in 0..200_000 {
            self.step_with(false, false);
        }
    }
}

/// Runs one seed; returns how many snapshots members restored.
fn run(seed: u64) -> u64 {
    let mut group = Group::new(seed);
    for _ in 0..20_000 {
        group.step(true);
    }
    group.heal();
    let applied: BTreeSet<Vec<u8>> = group.log.values().cloned().collect();
    for command in &group.acknowledged {
        assert!(applied.contains(command), "seed {seed}: acknowledged {command:?} lost");
    }
    for (slot, member) in group.members.iter().enumerate() {
        let missing: Vec<_> = group.log.keys().filter(|i| !member.state.contains_key(i)).collect();
        assert!(missing.is_empty(), "seed {seed}: slot {slot} never applied {missing:?}");
        assert_eq!(member.state, group.log, "seed {seed}: slot {slot} differs from the log");
    }
    assert!(
        group.acknowledged.len() > 10,
        "seed {seed}: only {} commands committed",
        group.acknowledged.len()
    );
    group.restores
}

#[test]
fn raft_groups_keep_every_acknowledged_command_through_faults() {
    // MERIDIAN_RAFT_SEEDS runs more (200 seeds take about 7 s in a debug build).
    let seeds =
        std::env::var("MERIDIAN_RAFT_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(50);
    let mut restores = 0;
    for seed in 0..seeds {
        restores += run(seed);
    }
    // Snapshots are exercised: lagging and restarted members were restored from them.
    assert!(restores > seeds, "only {restores} snapshot restores over {seeds} seeds");
}

#[test]
fn a_group_elects_a_leader_and_replicates_without_faults() {
    let mut group = Group::new(99);
    for _ in 0..5_000 {
        group.step(false);
    }
    let leaders = group.members.iter().filter(|m| m.replica.as_ref().unwrap().is_leader()).count();
    assert_eq!(leaders, 1);
    let applied = group.members.iter().map(|m| m.state.len()).collect::<Vec<_>>();
    assert!(
        group.acknowledged.len() > 50,
        "{} acknowledged, {} proposed, applied {applied:?}",
        group.acknowledged.len(),
        group.proposals
    );
}
