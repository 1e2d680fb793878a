//! The `occ` participant of one shard: executes pieces, validates and locks at prepare, applies
//! decisions.
//!
//! Invariants (asserted):
//! - a key has at most one prepared writer, and a prepared writer excludes other prepared
//!   readers of the key (and vice versa);
//! - every lock belongs to an attempt in `prepared`, and every prepared attempt's locks exist;
//! - a commit installs versions above every version the key held at prepare (the proposal rule),
//!   so the store accepts them.

use super::{
    Conflict, Decision, ExecFailure, OccMsg, PeerState, PieceCall, PieceRun, ScanCheck, VersionTag,
    Vote,
};
use crate::NodeContext;
use meridian_core::hash::FixedHashMap;
use meridian_core::key::Key;
use meridian_core::node::Outbox;
use meridian_core::txn::{
    Args, KeySet, PieceEffects, PieceOutput, PlanContext, ProcError, ProcId, Procedure, Reads,
    ScanRange, Write, PIECES_MAX, PIECE_KEYS_MAX,
};
use meridian_core::{ShardId, Time, Timestamp, TxnId};
use meridian_storage::{MvccStore, Version, VersionState};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// A participant's replicated state as a Raft snapshot carries it. The store part holds only
/// the keys transactions wrote, each with its newest committed version (deletes included):
/// every replica bulk-loads the same initial data, and `occ` reads only the newest version,
/// so the initial load plus these rows is the store. Locks follow from `prepared`. Leader-only
/// state (terminations in progress) is not replicated and not carried.
#[derive(Serialize, Deserialize)]
struct Image {
    rows: Vec<(Key, Timestamp, TxnId, Option<meridian_core::key::Value>)>,
    prepared: Vec<(TxnId, Prepared)>,
    /// Oldest first (the eviction order).
    decided: Vec<(TxnId, Decision)>,
    ts_last: Timestamp,
    committed_total: u64,
    aborted_total: u64,
    terminated_total: u64,
}

/// A snapshot image, decoded and checked, ready to install.
pub(super) struct DecodedImage(Image);

impl DecodedImage {
    /// Decodes an image; a bad one is an error, never a panic.
    pub(super) fn decode(bytes: &[u8]) -> Result<Self, String> {
        let image: Image = postcard::from_bytes(bytes)
            .map_err(|e| format!("snapshot image does not decode: {e}"))?;
        if image.decided.len() > DECIDED_MAX {
            return Err(format!(
                "snapshot image remembers {} decisions, more than {DECIDED_MAX}",
                image.decided.len()
            ));
        }
        Ok(Self(image))
    }
}

/// Decided attempts remembered per shard, to refuse late prepares and re-acknowledge decisions.
const DECIDED_MAX: usize = 1 << 20;
/// A prepared attempt whose coordinator has been quiet this many RPC timeouts is decided with
/// the other participants. Longer than the coordinator's own timeout, so a live coordinator
/// usually decides first (either way the outcome is the same).
const TERMINATE_AFTER_TIMEOUTS: u64 = 3;
/// Prepared attempts whose termination one GC tick starts or continues.
const TERMINATIONS_PER_TICK_MAX: usize = 1_024;

/// Every node hosting a replica of `shard`. A participant's rare messages to its peers
/// (termination queries and decisions) go to all of them: only the leader acts, the others
/// forward, so no leader knowledge is needed.
pub(super) fn replicas_of(context: &NodeContext, shard: ShardId) -> Vec<meridian_core::NodeId> {
    (0..context.topology.replicas)
        .filter_map(|slot| context.topology.replica_node(shard, slot))
        .collect()
}

/// Locks one key holds.
#[derive(Debug, Default)]
struct KeyLock {
    writer: Option<TxnId>,
    readers: Vec<TxnId>,
}

/// A prepared attempt: what it locked and will write.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Prepared {
    reads: Vec<Key>,
    scans: Vec<ScanRange>,
    writes: Vec<Write>,
    proposal: Timestamp,
    /// Every participant of the attempt.
    participants: Vec<ShardId>,
    /// When it prepared here (this node's clock).
    prepared_at: Time,
}

/// What a `Prepare` asks of one participant.
pub(super) struct PrepareArgs {
    /// Reads on this shard and the versions seen.
    pub(super) reads: Vec<(Key, Option<VersionTag>)>,
    /// Scans on this shard and the rows seen.
    pub(super) scans: Vec<ScanCheck>,
    /// Writes on this shard.
    pub(super) writes: Vec<Write>,
    /// The only participant: commit at once if valid.
    pub(super) one_phase: bool,
    /// Every participant of the attempt.
    pub(super) participants: Vec<ShardId>,
}

/// A prepared attempt whose coordinator went quiet, being decided with the other participants.
#[derive(Debug, Default)]
struct Termination {
    /// Answers so far, by shard.
    states: BTreeMap<ShardId, PeerState>,
}

/// The participant of one shard.
pub(super) struct Participant {
    shard: ShardId,
    context: NodeContext,
    store: MvccStore,
    locks: BTreeMap<Key, KeyLock>,
    prepared: BTreeMap<TxnId, Prepared>,
    // Hash map for O(1) lookups on the hot path; eviction order lives in `decided_order`.
    decided: FixedHashMap<TxnId, Decision>,
    decided_order: VecDeque<TxnId>,
    ts_last: Timestamp,
    terminating: BTreeMap<TxnId, Termination>,
    /// Attempts committed here (for metrics).
    committed_total: u64,
    /// Attempts refused or aborted here.
    aborted_total: u64,
    /// Attempts this participant decided with its peers.
    terminated_total: u64,
}

fn tag(version: Option<&Version>) -> Option<VersionTag> {
    version.map(|v| VersionTag { ts: v.ts, writer: v.writer })
}

impl Participant {
    pub(super) fn new(shard: ShardId, context: NodeContext) -> Self {
        Self {
            shard,
            context,
            store: MvccStore::new(),
            locks: BTreeMap::new(),
            prepared: BTreeMap::new(),
            decided: FixedHashMap::default(),
            decided_order: VecDeque::new(),
            ts_last: Timestamp::ZERO,
            terminating: BTreeMap::new(),
            committed_total: 0,
            aborted_total: 0,
            terminated_total: 0,
        }
    }

    /// This participant's replicated state (see [`Image`]), for a snapshot. Encoded from
    /// borrows (postcard writes `&T` as `T`), so nothing is copied but the bytes.
    pub(super) fn image(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct ImageRef<'a> {
            rows: Vec<(&'a Key, Timestamp, TxnId, &'a Option<meridian_core::key::Value>)>,
            prepared: Vec<(TxnId, &'a Prepared)>,
            decided: Vec<(TxnId, Decision)>,
            ts_last: Timestamp,
            committed_total: u64,
            aborted_total: u64,
            terminated_total: u64,
        }
        let image = ImageRef {
            rows: self
                .store
                .written_since_load()
                .map(|(k, v)| (k, v.ts, v.writer, &v.value))
                .collect(),
            prepared: self.prepared.iter().map(|(&txn, p)| (txn, p)).collect(),
            decided: self.decided_order.iter().map(|txn| (*txn, self.decided[txn])).collect(),
            ts_last: self.ts_last,
            committed_total: self.committed_total,
            aborted_total: self.aborted_total,
            terminated_total: self.terminated_total,
        };
        postcard::to_allocvec(&image).expect("images encode")
    }

    /// Replaces the replicated state by a snapshot's: the rows go over the store as it is
    /// (the initial load, or an older state of the same log), everything else is replaced.
    pub(super) fn install_image(&mut self, DecodedImage(image): DecodedImage) {
        for (key, ts, writer, value) in image.rows {
            self.store.restore_latest(key, ts, writer, value);
        }
        self.locks.clear();
        self.prepared.clear();
        for (txn, prepared) in image.prepared {
            self.lock(txn, &prepared.reads, &prepared.writes);
            self.prepared.insert(txn, prepared);
        }
        self.decided.clear();
        self.decided_order.clear();
        for (txn, decision) in image.decided {
            self.decided.insert(txn, decision);
            self.decided_order.push_back(txn);
        }
        self.ts_last = image.ts_last;
        self.terminating.clear();
        self.committed_total = image.committed_total;
        self.aborted_total = image.aborted_total;
        self.terminated_total = image.terminated_total;
    }

    /// Takes `txn`'s locks: shared on `reads`, exclusive on `writes`.
    fn lock(&mut self, txn: TxnId, reads: &[Key], writes: &[Write]) {
        for key in reads {
            self.locks.entry(key.clone()).or_default().readers.push(txn);
        }
        for write in writes {
            let lock = self.locks.entry(write.key.clone()).or_default();
            assert!(lock.writer.is_none(), "two prepared writers on {:?}", write.key);
            lock.writer = Some(txn);
        }
    }

    pub(super) fn store(&self) -> &MvccStore {
        &self.store
    }

    pub(super) fn store_mut(&mut self) -> &mut MvccStore {
        &mut self.store
    }

    fn procedure(&self, proc: ProcId) -> Result<Arc<dyn Procedure>, ExecFailure> {
        self.context.registry.get(proc).cloned().ok_or_else(|| {
            ExecFailure::Procedure(ProcError::BadArgs(format!("unknown procedure {}", proc.0)))
        })
    }

    /// Runs `calls` in order against the latest committed state plus `overlay` (the attempt's
    /// own earlier writes, which later calls also see). Keeps no state.
    pub(super) fn on_execute(
        &self,
        txn: TxnId,
        proc: ProcId,
        args: &Args,
        calls: &[PieceCall],
        overlay: Vec<Write>,
    ) -> Result<Vec<PieceRun>, ExecFailure> {
        if let Some(&decision) = self.decided.get(&txn) {
            return Err(ExecFailure::Decided(decision));
        }
        if calls.len() > PIECES_MAX {
            return Err(ExecFailure::Procedure(ProcError::Contract(format!(
                "{} pieces is over {PIECES_MAX}",
                calls.len()
            ))));
        }
        let procedure = self.procedure(proc)?;
        let mut overlay: BTreeMap<Key, Option<Vec<u8>>> =
            overlay.into_iter().map(|w| (w.key, w.value)).collect();
        let mut runs = Vec::with_capacity(calls.len());
        for call in calls {
            let inputs: Vec<&PieceOutput> = call.inputs.iter().collect();
            let run = self.run_piece(procedure.as_ref(), call.piece, args, &inputs, &overlay)?;
            if let Ok(effects) = &run.effects {
                for write in &effects.writes {
                    overlay.insert(write.key.clone(), write.value.clone());
                }
            }
            runs.push(run);
        }
        Ok(runs)
    }

    /// Reads a piece's keys, runs it, and checks it kept its contract.
    fn run_piece(
        &self,
        procedure: &dyn Procedure,
        piece: u32,
        args: &Args,
        inputs: &[&PieceOutput],
        overlay: &BTreeMap<Key, Option<Vec<u8>>>,
    ) -> Result<PieceRun, ExecFailure> {
        let keys = procedure.keys(piece, args, inputs).map_err(ExecFailure::Procedure)?;
        self.check_keys(&keys).map_err(ExecFailure::Procedure)?;
        let mut reads = Reads::default();
        let mut read_tags = Vec::with_capacity(keys.reads.len());
        for key in &keys.reads {
            match overlay.get(key) {
                Some(own) => reads.values.push(own.clone()),
                None => {
                    let version = self.store.read_latest(key);
                    reads.values.push(version.and_then(|v| v.value.clone()));
                    read_tags.push((key.clone(), tag(version)));
                }
            }
        }
        let mut scans = Vec::with_capacity(keys.scans.len());
        for range in &keys.scans {
            let rows = self.store.scan(range, Timestamp::MAX);
            scans.push(ScanCheck {
                range: range.clone(),
                rows: rows
                    .iter()
                    .map(|(k, v)| (k.clone(), VersionTag { ts: v.ts, writer: v.writer }))
                    .collect(),
            });
            reads.scans.push(merge_overlay(rows, range, overlay));
        }
        let effects = procedure.execute(piece, args, inputs, &reads);
        if let Ok(PieceEffects { writes, .. }) = &effects {
            if let Some(bad) = writes.iter().find(|w| !keys.writes.contains(&w.key)) {
                return Err(ExecFailure::Procedure(ProcError::Contract(format!(
                    "piece {piece} wrote undeclared key {:?}",
                    bad.key
                ))));
            }
        }
        Ok(PieceRun { piece, reads: read_tags, scans, effects })
    }

    fn check_keys(&self, keys: &KeySet) -> Result<(), ProcError> {
        let partitioner = &self.context.partitioner;
        if keys.reads.len() + keys.writes.len() > PIECE_KEYS_MAX {
            return Err(ProcError::Contract(format!(
                "a piece touches more than {PIECE_KEYS_MAX} keys"
            )));
        }
        if let Some(key) =
            keys.reads.iter().chain(&keys.writes).find(|k| !partitioner.allows(self.shard, k))
        {
            return Err(ProcError::Contract(format!(
                "key {key:?} does not live on shard {}",
                self.shard.0
            )));
        }
        if let Some(key) = keys
            .writes
            .iter()
            .find(|k| partitioner.target_of(k) == meridian_core::txn::ShardTarget::Any)
        {
            return Err(ProcError::Unsupported(format!(
                "write to replicated table key {key:?}: replicated tables are read-only"
            )));
        }
        Ok(())
    }

    /// Runs every piece of a single-shard attempt and commits it at once if nothing it touches is
    /// locked by a prepared attempt.
    pub(super) fn on_execute_commit(
        &mut self,
        now: Time,
        txn: TxnId,
        proc: ProcId,
        args: &Args,
    ) -> Result<(Vec<PieceRun>, Option<Timestamp>), ExecFailure> {
        if let Some(&decision) = self.decided.get(&txn) {
            return Err(ExecFailure::Decided(decision));
        }
        let procedure = self.procedure(proc)?;
        let plan = procedure
            .plan(args, PlanContext { partitioner: &self.context.partitioner })
            .map_err(ExecFailure::Procedure)?;
        if plan.len() > PIECES_MAX {
            return Err(ExecFailure::Procedure(ProcError::Contract(format!(
                "{} pieces is over {PIECES_MAX}",
                plan.len()
            ))));
        }
        let mut overlay = BTreeMap::new();
        let mut outputs: Vec<PieceOutput> = Vec::with_capacity(plan.len());
        let mut runs = Vec::with_capacity(plan.len());
        for (index, spec) in plan.iter().enumerate() {
            let inputs: Vec<&PieceOutput> =
                spec.deps.iter().filter_map(|&d| outputs.get(d as usize)).collect();
            if inputs.len() != spec.deps.len() {
                return Err(ExecFailure::Procedure(ProcError::Contract(format!(
                    "piece {index} depends on a later piece"
                ))));
            }
            let run = self.run_piece(procedure.as_ref(), index as u32, args, &inputs, &overlay)?;
            match &run.effects {
                Ok(effects) => {
                    for write in &effects.writes {
                        overlay.insert(write.key.clone(), write.value.clone());
                    }
                    outputs.push(effects.output.clone());
                    runs.push(run);
                }
                Err(_) => {
                    // A user abort: nothing is written; remember it so a duplicate gets the same answer.
                    runs.push(run);
                    self.remember(txn, Decision::Aborted);
                    return Ok((runs, None));
                }
            }
        }
        let reads: Vec<Key> =
            runs.iter().flat_map(|r| r.reads.iter().map(|(k, _)| k.clone())).collect();
        let scans: Vec<ScanRange> =
            runs.iter().flat_map(|r| r.scans.iter().map(|s| s.range.clone())).collect();
        let writes: Vec<Write> =
            overlay.into_iter().map(|(key, value)| Write { key, value }).collect();
        if let Err(conflict) = self.check_locks(txn, &reads, &scans, &writes) {
            // Remember the refusal: a duplicate of this request arriving after the coordinator
            // moved on to a new attempt must not commit it (found by swarm seed 116).
            self.remember(txn, Decision::Aborted);
            return Err(ExecFailure::Conflict(conflict));
        }
        let ts = self.propose(now, reads.iter().chain(writes.iter().map(|w| &w.key)));
        self.install(txn, &writes, ts);
        self.remember(txn, Decision::Committed(ts));
        Ok((runs, Some(ts)))
    }

    /// Validates and locks; with `one_phase`, commits at once.
    pub(super) fn on_prepare(&mut self, now: Time, txn: TxnId, request: PrepareArgs) -> Vote {
        let PrepareArgs { reads, scans, writes, one_phase, participants } = request;
        match self.decided.get(&txn) {
            Some(Decision::Aborted) => return Vote::No(Conflict::AlreadyAborted),
            Some(&Decision::Committed(ts)) => return Vote::Committed(ts),
            None => {}
        }
        if let Some(prepared) = self.prepared.get(&txn) {
            return Vote::Yes(prepared.proposal); // A duplicate prepare.
        }
        let scan_ranges: Vec<ScanRange> = scans.iter().map(|s| s.range.clone()).collect();
        let read_keys: Vec<Key> = reads.iter().map(|(k, _)| k.clone()).collect();
        if let Err(conflict) = self
            .validate(&reads, &scans)
            .and_then(|()| self.check_locks(txn, &read_keys, &scan_ranges, &writes))
        {
            // Remember the refusal so the coordinator's abort and a duplicate prepare agree; a
            // one-phase prepare duplicated past the refusal would otherwise commit an attempt
            // the coordinator already retried (found by swarm seed 116).
            self.remember(txn, Decision::Aborted);
            return Vote::No(conflict);
        }
        let proposal = self.propose(now, read_keys.iter().chain(writes.iter().map(|w| &w.key)));
        if one_phase {
            self.install(txn, &writes, proposal);
            self.remember(txn, Decision::Committed(proposal));
            return Vote::Committed(proposal);
        }
        // Replication seam: the prepare record goes through the shard's log here, and the vote
        // is sent once it is durable on a quorum.
        self.lock(txn, &read_keys, &writes);
        let prepared = Prepared {
            reads: read_keys,
            scans: scan_ranges,
            writes,
            proposal,
            participants,
            prepared_at: now,
        };
        self.prepared.insert(txn, prepared);
        Vote::Yes(proposal)
    }

    /// Checks that reads and scans still see the latest committed versions.
    fn validate(
        &self,
        reads: &[(Key, Option<VersionTag>)],
        scans: &[ScanCheck],
    ) -> Result<(), Conflict> {
        for (key, seen) in reads {
            if tag(self.store.read_latest(key)) != *seen {
                return Err(Conflict::Stale);
            }
        }
        for scan in scans {
            let now: Vec<(Key, VersionTag)> = self
                .store
                .scan(&scan.range, Timestamp::MAX)
                .into_iter()
                .map(|(k, v)| (k, VersionTag { ts: v.ts, writer: v.writer }))
                .collect();
            if now != scan.rows {
                return Err(Conflict::Stale);
            }
        }
        Ok(())
    }

    /// Checks that no other prepared attempt holds a lock conflicting with these accesses.
    fn check_locks(
        &self,
        txn: TxnId,
        reads: &[Key],
        scans: &[ScanRange],
        writes: &[Write],
    ) -> Result<(), Conflict> {
        let other_writer = |lock: &KeyLock| lock.writer.is_some_and(|w| w != txn);
        if reads.iter().filter_map(|k| self.locks.get(k)).any(other_writer) {
            return Err(Conflict::Locked);
        }
        for range in scans {
            if range.start < range.end
                && self
                    .locks
                    .range(range.start.clone()..range.end.clone())
                    .any(|(_, l)| other_writer(l))
            {
                return Err(Conflict::Locked);
            }
        }
        for write in writes {
            if let Some(lock) = self.locks.get(&write.key) {
                if other_writer(lock) || lock.readers.iter().any(|&r| r != txn) {
                    return Err(Conflict::Locked);
                }
            }
            let in_scan =
                |p: &Prepared| p.scans.iter().any(|r| r.start <= write.key && write.key < r.end);
            if self.prepared.iter().any(|(&other, p)| other != txn && in_scan(p)) {
                return Err(Conflict::Locked);
            }
        }
        Ok(())
    }

    /// A commit timestamp above the clock, the last commit, and every version of `keys`.
    fn propose<'a>(&mut self, now: Time, keys: impl Iterator<Item = &'a Key>) -> Timestamp {
        let mut ts = Timestamp(now).max(self.ts_last.next());
        for key in keys {
            if let Some(last) = self.store.versions(key).last() {
                ts = ts.max(last.ts.next());
            }
        }
        self.ts_last = ts;
        ts
    }

    /// Applies a decision; returns what this shard now knows about the attempt.
    pub(super) fn on_decision(&mut self, txn: TxnId, decision: Decision) -> Decision {
        if let Some(&known) = self.decided.get(&txn) {
            return known; // Duplicate, or an abort-query for an attempt already decided.
        }
        let Some(prepared) = self.prepared.remove(&txn) else {
            // Never prepared here: an abort leaves a tombstone so a late prepare is refused. A
            // commit cannot reach a shard that did not vote yes, so treat it as already done.
            if decision == Decision::Aborted {
                self.remember(txn, Decision::Aborted);
            }
            return decision;
        };
        self.release(txn, &prepared);
        self.terminating.remove(&txn);
        // Replication seam: the decision record goes through the shard's log before the ack.
        if let Decision::Committed(ts) = decision {
            assert!(ts >= prepared.proposal, "commit below the proposal");
            self.install(txn, &prepared.writes, ts);
            self.ts_last = self.ts_last.max(ts);
        }
        self.remember(txn, decision);
        decision
    }

    fn release(&mut self, txn: TxnId, prepared: &Prepared) {
        for key in prepared.reads.iter().chain(prepared.writes.iter().map(|w| &w.key)) {
            let Some(lock) = self.locks.get_mut(key) else {
                continue;
            };
            lock.readers.retain(|&r| r != txn);
            if lock.writer == Some(txn) {
                lock.writer = None;
            }
            if lock.writer.is_none() && lock.readers.is_empty() {
                self.locks.remove(key);
            }
        }
    }

    fn install(&mut self, txn: TxnId, writes: &[Write], ts: Timestamp) {
        for write in writes {
            if let Err(error) = self.store.write(
                write.key.clone(),
                ts,
                write.value.clone(),
                txn,
                VersionState::Committed,
            ) {
                panic!("occ commit of {txn} at {} refused by the store: {error}", ts.0);
            }
        }
    }

    fn remember(&mut self, txn: TxnId, decision: Decision) {
        if self.decided.insert(txn, decision).is_none() {
            self.decided_order.push_back(txn);
            match decision {
                Decision::Committed(_) => self.committed_total += 1,
                Decision::Aborted => self.aborted_total += 1,
            }
        }
        while self.decided_order.len() > DECIDED_MAX {
            if let Some(old) = self.decided_order.pop_front() {
                self.decided.remove(&old);
            }
        }
    }

    /// Raises the GC watermark: keep `gc_retention_ns` of history, and never pass a prepared
    /// attempt's proposal (its commit will write at or above it). Then, when `terminate` (this
    /// replica leads its shard), starts or continues the termination of prepared attempts whose
    /// coordinator has been quiet too long.
    pub(super) fn on_gc_tick(&mut self, now: Time, terminate: bool, out: &mut Outbox<OccMsg>) {
        let mut watermark =
            Timestamp(self.ts_last.0.saturating_sub(self.context.timing.gc_retention_ns));
        if let Some(lowest) = self.prepared.values().map(|p| p.proposal).min() {
            watermark = watermark.min(Timestamp(lowest.0.saturating_sub(1)));
        }
        self.store.set_gc_watermark(watermark);
        if !terminate {
            self.terminating.clear();
            return;
        }
        let quiet_ns = TERMINATE_AFTER_TIMEOUTS * self.context.timing.rpc_timeout_ns;
        let stale = self
            .prepared
            .iter()
            .filter(|(_, p)| now.saturating_sub(p.prepared_at) >= quiet_ns)
            .take(TERMINATIONS_PER_TICK_MAX);
        for (&txn, prepared) in stale {
            let termination = self.terminating.entry(txn).or_default();
            for &shard in prepared.participants.iter().filter(|&&s| s != self.shard) {
                if !termination.states.contains_key(&shard) {
                    for node in replicas_of(&self.context, shard) {
                        out.send(node, OccMsg::Query { txn, shard });
                    }
                }
            }
        }
    }

    /// Where `txn` stands here. An attempt this shard has not prepared is refused from now on,
    /// so whoever asked may decide without it.
    pub(super) fn on_query(&mut self, txn: TxnId) -> PeerState {
        if let Some(&decision) = self.decided.get(&txn) {
            return PeerState::Decided(decision);
        }
        if let Some(prepared) = self.prepared.get(&txn) {
            return PeerState::Prepared(prepared.proposal);
        }
        self.remember(txn, Decision::Aborted);
        PeerState::Decided(Decision::Aborted)
    }

    /// A peer's answer for an attempt this participant is terminating. Returns the decision
    /// once the answers allow one, with the peers to tell; the caller puts it through the
    /// shard's log ([`Participant::on_decision`] applies it) and informs the peers.
    pub(super) fn on_peer_state(
        &mut self,
        txn: TxnId,
        shard: ShardId,
        state: PeerState,
    ) -> Option<(Decision, Vec<ShardId>)> {
        let termination = self.terminating.get_mut(&txn)?;
        termination.states.insert(shard, state);
        let verdict = self.termination_verdict(txn)?;
        // Decided: stop asking; a lost decision restarts the termination on a later tick.
        self.terminating.remove(&txn);
        Some(verdict)
    }

    /// The decision the answers allow: a peer that decided settles it; all prepared means the
    /// coordinator could only have committed (at the largest proposal).
    fn termination_verdict(&self, txn: TxnId) -> Option<(Decision, Vec<ShardId>)> {
        let (termination, prepared) = (self.terminating.get(&txn)?, self.prepared.get(&txn)?);
        let mut decided = None;
        let mut ts_max = prepared.proposal;
        let mut all_prepared = true;
        for &shard in prepared.participants.iter().filter(|&&s| s != self.shard) {
            match termination.states.get(&shard) {
                Some(PeerState::Decided(d)) => decided = Some(*d),
                Some(PeerState::Prepared(p)) => ts_max = ts_max.max(*p),
                None => all_prepared = false,
            }
        }
        let decision = match decided {
            Some(d) => d,
            None if all_prepared => Decision::Committed(ts_max),
            None => return None,
        };
        let peers = prepared.participants.iter().copied().filter(|&s| s != self.shard).collect();
        Some((decision, peers))
    }

    /// Counts an attempt this participant decided with its peers.
    pub(super) fn note_terminated(&mut self) {
        self.terminated_total += 1;
    }

    /// Counters and gauges for metrics.
    pub(super) fn counters(&self) -> [(&'static str, u64); 6] {
        [
            ("occ_participant_prepared", self.prepared.len() as u64),
            ("occ_participant_locked_keys", self.locks.len() as u64),
            ("occ_participant_terminating", self.terminating.len() as u64),
            ("occ_participant_committed_total", self.committed_total),
            ("occ_participant_aborted_total", self.aborted_total),
            ("occ_participant_terminated_total", self.terminated_total),
        ]
    }

    /// The context this participant was built from (tests build more from it).
    #[cfg(test)]
    pub(super) fn context_for_tests(&self) -> NodeContext {
        self.context.clone()
    }

    #[cfg(test)]
    pub(super) fn registry(&self) -> Arc<meridian_core::txn::Registry> {
        self.context.registry.clone()
    }

    #[cfg(test)]
    pub(super) fn set_registry(&mut self, registry: Arc<meridian_core::txn::Registry>) {
        self.context.registry = registry;
    }

    #[cfg(test)]
    pub(super) fn debug_state(&self) -> String {
        format!("prepared {:?} locks {:?}", self.prepared.keys().collect::<Vec<_>>(), self.locks)
    }

    /// Prepared attempts (for tests and invariants).
    #[cfg(test)]
    pub(super) fn prepared_count(&self) -> usize {
        self.prepared.len()
    }

    /// Keys locked (for tests and invariants).
    #[cfg(test)]
    pub(super) fn lock_count(&self) -> usize {
        self.locks.len()
    }
}

/// The rows a scan sees: the store's, with the attempt's own writes in the range applied.
fn merge_overlay(
    rows: Vec<(Key, Version)>,
    range: &ScanRange,
    overlay: &BTreeMap<Key, Option<Vec<u8>>>,
) -> Vec<(Key, Vec<u8>)> {
    let mut merged: BTreeMap<Key, Vec<u8>> =
        rows.into_iter().filter_map(|(k, v)| v.value.map(|value| (k, value))).collect();
    if range.start < range.end {
        for (key, value) in overlay.range(range.start.clone()..range.end.clone()) {
            match value {
                Some(value) => merged.insert(key.clone(), value.clone()),
                None => merged.remove(key),
            };
        }
    }
    let limit = range.limit as usize;
    if range.reverse {
        merged.into_iter().rev().take(limit).collect()
    } else {
        merged.into_iter().take(limit).collect()
    }
}
