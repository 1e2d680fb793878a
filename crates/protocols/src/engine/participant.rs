//! The participant of one shard in the two-phase commit engine: executes pieces, prepares,
//! applies decisions. It is the [`StateMachine`] the kit's hosting runs on the shard's log.
//!
//! The participant is two parts. [`Core`] is what every protocol of the family shares: the
//! store, the prepared attempts and their lock table, the decided cache, inquiries among
//! participants, the counters, and the request checks. How transactions are kept apart is a
//! [`Concurrency`] value the protocol supplies (`occ`'s read validation, `2pl`'s execution
//! locks, `2pc-mvto`'s timestamp ordering, `mako`'s epochs), called at the few points where
//! the protocols differ: serving an execution, admitting a request at the leader, preparing,
//! committing in one round, raising the GC watermark, a leader's tick, a change of leader, and
//! its part of the snapshot image. This module names none of them.
//!
//! Invariants (asserted):
//! - a key has at most one prepared writer, and a prepared writer excludes other prepared
//!   readers of the key (and vice versa): the lock table's invariants;
//! - every lock belongs to an attempt in `prepared`, and every prepared attempt's locks exist;
//! - a commit installs versions above every version the key held at prepare (the proposal
//!   rule), so the store accepts them.
//!
//! Input is checked before it can reach an assertion: [`Participant::validate`] refuses a
//! command whose contents are malformed (keys off the shard, a key listed twice, a bad
//! participant list, and whatever the concurrency control refuses), and state-dependent
//! nonsense (a commit below the proposal) is refused as a value and counted.

use super::speculation::Entry;
use super::{Conflict, ExecFailure, OccMsg, PrepareArgs, ShardCommand, ShardRequest, Vote};
use crate::kit::coord::LeaderCache;
use crate::kit::exec::{self, Latest, PieceCall, PieceRun, Placement, ScanCheck, VersionTag};
use crate::kit::host::StateMachine;
use crate::kit::locks::LockTable;
use crate::kit::twopc::{
    Asking, Concluded, DecidedCache, DecidedImage, Decision, Inquiries, Known, PeerState,
    SETTLE_BATCH_MAX,
};
use crate::NodeContext;
use meridian_core::key::{Key, Value};
use meridian_core::node::Outbox;
use meridian_core::txn::{
    Args, ProcError, ProcId, Procedure, ScanRange, ShardTarget, Write, PIECES_MAX, PIECE_KEYS_MAX,
    SCAN_ROWS_MAX,
};
use meridian_core::{NodeId, ShardId, Time, Timestamp, TxnId};
use meridian_storage::{MvccStore, Version, VersionState};
use serde::{Deserialize, Serialize};
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A prepared attempt whose coordinator has been quiet this many RPC timeouts is decided with
/// the other participants. Longer than the coordinator's own timeout, so a live coordinator
/// usually decides first (either way the outcome is the same).
pub(crate) const TERMINATE_AFTER_TIMEOUTS: u64 = 3;
/// A commit still unsettled this many RPC timeouts after it was decided here is settled by
/// asking its peers (its coordinator's announcement was lost, or the coordinator is gone).
const SETTLE_AFTER_TIMEOUTS: u64 = 8;
/// Prepared attempts and unsettled commits whose inquiry one GC tick may start.
const INQUIRIES_PER_TICK_MAX: usize = 1_024;
/// Most keys (reads plus writes) and scans one prepare may carry: a plan's worth.
const PREPARE_KEYS_MAX: usize = PIECES_MAX * PIECE_KEYS_MAX;

/// A prepared attempt: what it locked and will write.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Prepared {
    pub(crate) reads: Vec<Key>,
    pub(crate) scans: Vec<ScanRange>,
    pub(crate) writes: Vec<Write>,
    pub(crate) proposal: Timestamp,
    /// Every participant of the attempt.
    pub(crate) participants: Vec<ShardId>,
    /// When it prepared here (the leader's clock, as logged).
    pub(crate) prepared_at: Time,
}

/// A participant's replicated state as a snapshot carries it. The store part holds only the
/// keys transactions wrote, each with its newest committed version (deletes included): every
/// replica bulk-loads the same initial data, so the initial load plus these rows is the store
/// of a protocol that reads only the newest version. Where reads see history
/// ([`Rules::keeps_history`]) the rows are every committed version of those keys (oldest
/// first per key). Pending versions and locks follow from `prepared`. `cc` is the concurrency
/// control's own replicated state, in its own encoding. Leader-only state (inquiries, the
/// peers' leaders) is not carried.
#[derive(Serialize, Deserialize)]
pub(crate) struct Image {
    rows: Vec<(Key, Timestamp, TxnId, Option<Value>)>,
    prepared: Vec<(TxnId, Prepared)>,
    decided: DecidedImage,
    ts_last: Timestamp,
    counts: Counts,
    watermark: Timestamp,
    cc: Vec<u8>,
}

/// Monotonic counters, replicated with the state.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
struct Counts {
    committed: u64,
    aborted: u64,
    terminated: u64,
    refused_malformed: u64,
}

/// What a concurrency control needs of the replicated state the engine keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rules {
    /// A prepared attempt's writes are pending versions in the store at its proposal, so its
    /// commit lands exactly there and its decision commits or revokes them.
    pub(crate) pending_writes: bool,
    /// Reads see older versions: images carry every committed version of a written key.
    pub(crate) keeps_history: bool,
}

/// The state every concurrency control of the family shares, and the steps they share.
pub(crate) struct Core {
    pub(crate) shard: ShardId,
    pub(crate) context: NodeContext,
    pub(crate) store: MvccStore,
    /// Locks of the prepared attempts (replicated: they follow from `prepared`).
    pub(crate) locks: LockTable,
    pub(crate) prepared: BTreeMap<TxnId, Prepared>,
    pub(crate) decided: DecidedCache,
    pub(crate) ts_last: Timestamp,
    counts: Counts,
    rules: Rules,
    /// Decisions and refusals recorded so far (local; a control that holds requests back
    /// until a decision compares it with what it saw last).
    pub(crate) remembered: u64,
    /// Leader-only: attempts being decided or settled with the peers, and where they lead.
    inquiries: Inquiries,
    peers: LeaderCache,
}

impl Core {
    fn new(shard: ShardId, context: NodeContext, rules: Rules) -> Self {
        Self {
            shard,
            store: MvccStore::new(),
            locks: LockTable::new(),
            prepared: BTreeMap::new(),
            decided: DecidedCache::new(context.limits.decided_max),
            ts_last: Timestamp::ZERO,
            counts: Counts::default(),
            rules,
            remembered: 0,
            inquiries: Inquiries::new(context.limits.inquiries_max),
            peers: LeaderCache::new(context.topology.clone()),
            context,
        }
    }

    /// A copy of the replicated state with fresh leader-only state.
    fn fork(&self) -> Self {
        Self {
            shard: self.shard,
            context: self.context.clone(),
            store: self.store.clone(),
            locks: self.locks.clone(),
            prepared: self.prepared.clone(),
            decided: self.decided.clone(),
            ts_last: self.ts_last,
            counts: self.counts,
            rules: self.rules,
            remembered: 0,
            inquiries: Inquiries::new(self.context.limits.inquiries_max),
            peers: LeaderCache::new(self.context.topology.clone()),
        }
    }

    pub(crate) fn procedure(&self, proc: ProcId) -> Result<Arc<dyn Procedure>, ExecFailure> {
        self.context.registry.get(proc).cloned().ok_or_else(|| {
            ExecFailure::Procedure(ProcError::BadArgs(format!("unknown procedure {}", proc.0)))
        })
    }

    pub(crate) fn placement(&self) -> Placement<'_> {
        Placement { shard: self.shard, partitioner: &self.context.partitioner }
    }

    /// What this shard knows of `txn` beyond its prepared attempts. An attempt prepared here
    /// is never "forgotten": the low-water mark of its coordinator may have passed it (a later
    /// attempt of the same coordinator decided and evicted first), so callers look at
    /// `prepared` first.
    pub(crate) fn known(&self, txn: TxnId) -> Known {
        debug_assert!(!self.prepared.contains_key(&txn), "callers check prepared first");
        self.decided.get(txn)
    }

    /// Whether `txn` is neither prepared nor known here (a request the log will answer as new).
    pub(crate) fn is_new(&self, txn: TxnId) -> bool {
        !self.prepared.contains_key(&txn) && matches!(self.decided.get(txn), Known::Unseen)
    }

    /// Refuses requests for attempts already prepared or decided (or decided and forgotten).
    pub(crate) fn undecided(&self, txn: TxnId) -> Result<(), ExecFailure> {
        if self.prepared.contains_key(&txn) {
            return Err(ExecFailure::Conflict(Conflict::Locked));
        }
        match self.known(txn) {
            Known::Decided(decision) => Err(ExecFailure::Decided(decision)),
            Known::Forgotten => Err(ExecFailure::Forgotten),
            Known::Unseen => Ok(()),
        }
    }

    /// Runs `calls` against the latest committed state plus `overlay` (the attempt's own
    /// earlier writes). Keeps no state: served by the leader outside the log.
    pub(crate) fn on_execute(
        &self,
        txn: TxnId,
        proc: ProcId,
        args: &Args,
        calls: &[PieceCall],
        overlay: Vec<Write>,
    ) -> Result<Vec<PieceRun>, ExecFailure> {
        self.undecided(txn)?;
        let procedure = self.procedure(proc)?;
        let overlay = overlay.into_iter().map(|w| (w.key, w.value)).collect();
        exec::run_calls(
            procedure.as_ref(),
            self.placement(),
            args,
            calls,
            &Latest(&self.store),
            overlay,
        )
        .map_err(ExecFailure::Procedure)
    }

    /// Runs every piece of a single-shard attempt and commits it at once if nothing it
    /// touches is locked by a prepared attempt. `refused`: the concurrency control's reason
    /// to refuse it, checked once the attempt is known to be new.
    pub(crate) fn execute_commit_validated(
        &mut self,
        now: Time,
        txn: TxnId,
        refused: Option<Conflict>,
        proc: ProcId,
        args: &Args,
    ) -> Result<(Vec<PieceRun>, Option<Timestamp>), ExecFailure> {
        self.undecided(txn)?;
        if let Some(conflict) = refused {
            self.remember(txn, Decision::Aborted, Vec::new(), now);
            return Err(ExecFailure::Conflict(conflict));
        }
        let procedure = self.procedure(proc)?;
        let run = exec::run_plan(procedure.as_ref(), self.placement(), args, &Latest(&self.store))
            .map_err(ExecFailure::Procedure)?;
        if run.user_abort.is_some() {
            // Nothing is written; remembered so that a duplicate gets the same answer.
            self.remember(txn, Decision::Aborted, Vec::new(), now);
            return Ok((run.runs, None));
        }
        let reads: Vec<&Key> =
            run.runs.iter().flat_map(|r| r.reads.iter().map(|(k, _)| k)).collect();
        let scans: Vec<ScanRange> =
            run.runs.iter().flat_map(|r| r.scans.iter().map(|s| s.range.clone())).collect();
        let refusal = if !self.decided.has_room(self.prepared.len()) {
            Some(Conflict::Full)
        } else if self
            .locks
            .check_all(txn, reads.iter().copied(), &scans, run.writes.keys())
            .is_err()
        {
            Some(Conflict::Locked)
        } else {
            None
        };
        if let Some(conflict) = refusal {
            // Remember the refusal: a duplicate of this request arriving after the coordinator
            // moved on to a new attempt must not commit it (found by swarm seed 116).
            self.remember(txn, Decision::Aborted, Vec::new(), now);
            return Err(ExecFailure::Conflict(conflict));
        }
        let ts = self.propose(now, reads.into_iter().chain(run.writes.keys()));
        self.install(txn, run.writes.into_iter().map(|(key, value)| Write { key, value }), ts);
        self.remember(txn, Decision::Committed(ts), Vec::new(), now);
        Ok((run.runs, Some(ts)))
    }

    /// Validates and locks a new attempt; with `one_phase`, commits at once. `refused`: the
    /// concurrency control's reason to refuse it.
    pub(crate) fn prepare_validated(
        &mut self,
        now: Time,
        txn: TxnId,
        request: PrepareArgs,
        refused: Option<Conflict>,
    ) -> Vote {
        if let Some(conflict) = refused {
            self.remember(txn, Decision::Aborted, Vec::new(), now);
            return Vote::No(conflict);
        }
        let PrepareArgs { reads, scans, writes, one_phase, participants, ts: _, epoch: _ } =
            request;
        let scan_ranges: Vec<ScanRange> = scans.iter().map(|s| s.range.clone()).collect();
        let read_keys: Vec<Key> = reads.iter().map(|(k, _)| k.clone()).collect();
        let write_keys: Vec<Key> = writes.iter().map(|w| w.key.clone()).collect();
        let refusal = if !self.decided.has_room(self.prepared.len()) {
            Err(Conflict::Full)
        } else {
            self.validate_reads(&reads, &scans).and_then(|()| {
                let locked = if one_phase {
                    self.locks.check_all(txn, &read_keys, &scan_ranges, &write_keys)
                } else {
                    self.locks.try_all(txn, &read_keys, &scan_ranges, &write_keys)
                };
                locked.map_err(|_| Conflict::Locked)
            })
        };
        if let Err(conflict) = refusal {
            // Remember the refusal so the coordinator's abort and a duplicate prepare agree; a
            // one-phase prepare duplicated past the refusal would otherwise commit an attempt
            // the coordinator already retried (found by swarm seed 116).
            self.remember(txn, Decision::Aborted, Vec::new(), now);
            return Vote::No(conflict);
        }
        let proposal = self.propose(now, read_keys.iter().chain(&write_keys));
        if one_phase {
            self.install(txn, writes, proposal);
            self.remember(txn, Decision::Committed(proposal), participants, now);
            return Vote::Committed(proposal);
        }
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
    fn validate_reads(
        &self,
        reads: &[(Key, Option<VersionTag>)],
        scans: &[ScanCheck],
    ) -> Result<(), Conflict> {
        for (key, seen) in reads {
            if VersionTag::of(self.store.read_latest(key)) != *seen {
                return Err(Conflict::Stale);
            }
        }
        for scan in scans {
            let now = self.store.scan(&scan.range, Timestamp::MAX);
            let same = now.len() == scan.rows.len()
                && now.iter().zip(&scan.rows).all(|((k, v), (seen_key, seen))| {
                    k == seen_key && v.ts == seen.ts && v.writer == seen.writer
                });
            if !same {
                return Err(Conflict::Stale);
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

    /// Applies a decision; returns what this shard now knows about the attempt, or `None`
    /// when the decision is refused as malformed (a commit below the proposal, or, with
    /// pending writes, anywhere but at it).
    pub(crate) fn on_decision(
        &mut self,
        now: Time,
        txn: TxnId,
        decision: Decision,
    ) -> Option<PeerState> {
        if !self.prepared.contains_key(&txn) {
            match self.known(txn) {
                Known::Decided(known) => return Some(PeerState::Decided(known)),
                // Decided and forgotten: whatever it was, it was applied then. The answer says
                // "forgotten", not the decision asked for: an abort is also how a coordinator
                // asks for an outcome it lost, and "aborted" would make it run the request again.
                Known::Forgotten => return Some(PeerState::Forgotten),
                Known::Unseen => {}
            }
        }
        let Some(prepared) = self.prepared.get(&txn) else {
            // Never prepared here: an abort leaves a tombstone so a late prepare is refused. A
            // commit cannot reach a shard that did not vote yes, so treat it as already done.
            if decision == Decision::Aborted {
                self.remember(txn, Decision::Aborted, Vec::new(), now);
            }
            return Some(PeerState::Decided(decision));
        };
        if let Decision::Committed(ts) = decision {
            // With pending writes every participant proposed the attempt's own timestamp, and
            // its pending versions sit there.
            if ts < prepared.proposal || (self.rules.pending_writes && ts != prepared.proposal) {
                self.counts.refused_malformed += 1;
                return None;
            }
        }
        let prepared = self.prepared.remove(&txn).expect("checked above");
        self.locks.release_all(txn);
        self.inquiries.close(txn);
        if self.rules.pending_writes {
            for write in &prepared.writes {
                let done = match decision {
                    Decision::Committed(_) => self.store.commit(&write.key, txn),
                    Decision::Aborted => self.store.revoke(&write.key, txn),
                };
                assert!(done, "a prepared attempt's writes are pending versions");
            }
            if let Decision::Committed(ts) = decision {
                self.ts_last = self.ts_last.max(ts);
            }
        } else if let Decision::Committed(ts) = decision {
            self.install(txn, prepared.writes, ts);
            self.ts_last = self.ts_last.max(ts);
        }
        self.remember(txn, decision, prepared.participants, now);
        Some(PeerState::Decided(decision))
    }

    pub(crate) fn install(
        &mut self,
        txn: TxnId,
        writes: impl IntoIterator<Item = Write>,
        ts: Timestamp,
    ) {
        self.install_as(txn, writes, ts, VersionState::Committed);
    }

    /// Writes `writes` at `ts` as versions in `state` (pending: a prepare under
    /// [`Rules::pending_writes`]). The caller has checked that `ts` is above every version of
    /// the keys and the watermark. Takes the writes by value: callers that are done with
    /// theirs hand them over, so a value is not copied on its way into the store.
    pub(crate) fn install_as(
        &mut self,
        txn: TxnId,
        writes: impl IntoIterator<Item = Write>,
        ts: Timestamp,
        state: VersionState,
    ) {
        for Write { key, value } in writes {
            if let Err(error) = self.store.write(key, ts, value, txn, state) {
                panic!("{state:?} write of {txn} at {} refused by the store: {error}", ts.0);
            }
        }
    }

    pub(crate) fn remember(
        &mut self,
        txn: TxnId,
        decision: Decision,
        participants: Vec<ShardId>,
        now: Time,
    ) {
        // Only the peers matter for settling; an attempt of this shard alone keeps none (and
        // allocates nothing: most commits are single-shard).
        let participants =
            if participants.iter().all(|&s| s == self.shard) { Vec::new() } else { participants };
        self.remembered += 1;
        if self.decided.remember(txn, decision, participants, now) {
            match decision {
                Decision::Committed(_) => self.counts.committed += 1,
                Decision::Aborted => self.counts.aborted += 1,
            }
        }
    }

    /// Where `txn` stands here. An attempt this shard never saw is refused from now on, so
    /// whoever asked may decide without it.
    fn on_query(&mut self, now: Time, txn: TxnId) -> PeerState {
        if let Some(prepared) = self.prepared.get(&txn) {
            return PeerState::Prepared(prepared.proposal);
        }
        match self.known(txn) {
            Known::Decided(decision) => return PeerState::Decided(decision),
            Known::Forgotten => return PeerState::Forgotten,
            Known::Unseen => {}
        }
        self.remember(txn, Decision::Aborted, Vec::new(), now);
        PeerState::Decided(Decision::Aborted)
    }

    /// Raises the GC watermark to `retention` below the last commit, never past a prepared
    /// attempt's proposal (its commit will write at or above it) nor above `cap`.
    pub(crate) fn raise_watermark(&mut self, retention: u64, cap: Option<Timestamp>) {
        let mut watermark = Timestamp(self.ts_last.0.saturating_sub(retention));
        if let Some(lowest) = self.lowest_proposal() {
            watermark = watermark.min(Timestamp(lowest.0.saturating_sub(1)));
        }
        if let Some(cap) = cap {
            watermark = watermark.min(cap);
        }
        self.store.set_gc_watermark(watermark);
    }

    /// The lowest proposal of the attempts prepared here.
    pub(crate) fn lowest_proposal(&self) -> Option<Timestamp> {
        self.prepared.values().map(|p| p.proposal).min()
    }

    /// A leader's inquiries: starts them (prepared attempts whose coordinator has been quiet
    /// too long, commits unsettled too long) and sends the queries due.
    fn inquire(&mut self, now: Time, out: &mut Outbox<OccMsg>) {
        let rpc_ns = self.context.timing.rpc_timeout_ns;
        let quiet_before = now.saturating_sub(TERMINATE_AFTER_TIMEOUTS * rpc_ns);
        let stale: Vec<(TxnId, Vec<ShardId>)> = self
            .prepared
            .iter()
            .filter(|(txn, p)| p.prepared_at <= quiet_before && !self.inquiries.contains(**txn))
            .take(INQUIRIES_PER_TICK_MAX)
            .map(|(&txn, p)| (txn, self.peers_of(&p.participants)))
            .collect();
        for (txn, peers) in stale {
            self.inquiries.open(txn, Asking::Terminate, peers, now);
        }
        let unsettled_before = now.saturating_sub(SETTLE_AFTER_TIMEOUTS * rpc_ns);
        for (txn, participants) in
            self.decided.unsettled_before(unsettled_before, INQUIRIES_PER_TICK_MAX)
        {
            // Only commits with other participants are kept unsettled.
            let peers = self.peers_of(&participants);
            if let Known::Decided(decision) = self.decided.get(txn) {
                self.inquiries.open(txn, Asking::Settle(decision), peers, now);
            }
        }
        for (txn, peer, again) in self.inquiries.due(now, rpc_ns) {
            if again {
                self.peers.suspect(peer);
            }
            let request = ShardRequest::Query { txn, shard: peer };
            out.send(self.peers.leader(peer), OccMsg::Request(request));
        }
    }

    /// The participants other than this shard.
    fn peers_of(&self, participants: &[ShardId]) -> Vec<ShardId> {
        participants.iter().copied().filter(|&s| s != self.shard).collect()
    }

    /// A prepare the leader refused: recorded as aborted (unless the log already decided it).
    fn refuse_prepare(&mut self, now: Time, txn: TxnId, conflict: Conflict) -> Vote {
        if let Some(prepared) = self.prepared.get(&txn) {
            return Vote::Yes(prepared.proposal);
        }
        match self.known(txn) {
            Known::Decided(Decision::Aborted) => Vote::No(conflict),
            Known::Decided(Decision::Committed(ts)) => Vote::Committed(ts),
            Known::Forgotten => Vote::Forgotten,
            Known::Unseen => {
                self.remember(txn, Decision::Aborted, Vec::new(), now);
                Vote::No(conflict)
            }
        }
    }

    /// A one-round commit the leader refused: recorded as aborted.
    fn refuse_one_round(
        &mut self,
        now: Time,
        txn: TxnId,
        conflict: Conflict,
    ) -> Result<(Vec<PieceRun>, Option<Timestamp>), ExecFailure> {
        self.undecided(txn)?;
        self.remember(txn, Decision::Aborted, Vec::new(), now);
        Err(ExecFailure::Conflict(conflict))
    }

    /// Checks a command's contents (see the module documentation); the concurrency control
    /// checks its own part after.
    fn check_command(&self, command: &ShardCommand) -> Result<(), String> {
        let topology = &self.context.topology;
        let txn = match command {
            ShardCommand::Prepare { txn, .. }
            | ShardCommand::ExecuteCommit { txn, .. }
            | ShardCommand::Decide { txn, .. }
            | ShardCommand::Query { txn, .. } => Some(*txn),
            ShardCommand::Settle { txns } => {
                if txns.len() > SETTLE_BATCH_MAX {
                    return Err(format!(
                        "settle of {} attempts is over {SETTLE_BATCH_MAX}",
                        txns.len()
                    ));
                }
                None
            }
            ShardCommand::Speculation(_) => None,
        };
        if let Some(txn) = txn {
            if txn.origin.0 as usize >= topology.nodes.len() {
                return Err(format!("attempt {txn} comes from no node of the cluster"));
            }
        }
        match command {
            ShardCommand::Prepare { args, .. } => self.check_prepare(args),
            ShardCommand::Decide { decision, tell, .. } => {
                if *decision == Decision::Committed(Timestamp::ZERO) {
                    return Err("a commit at timestamp 0".into());
                }
                check_shards(tell, topology.shards, false)?;
                if tell.contains(&self.shard) {
                    return Err("a decision tells its own shard".into());
                }
                Ok(())
            }
            ShardCommand::ExecuteCommit { .. }
            | ShardCommand::Query { .. }
            | ShardCommand::Settle { .. }
            | ShardCommand::Speculation(_) => Ok(()),
        }
    }

    fn check_prepare(&self, args: &PrepareArgs) -> Result<(), String> {
        let partitioner = &self.context.partitioner;
        if args.reads.len() + args.writes.len() > PREPARE_KEYS_MAX
            || args.scans.len() > PREPARE_KEYS_MAX
        {
            return Err(format!("a prepare of more than {PREPARE_KEYS_MAX} keys"));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (key, _) in &args.reads {
            if !partitioner.allows(self.shard, key) {
                return Err(format!("read key {key:?} is not on shard {}", self.shard));
            }
            if !seen.insert(key) {
                return Err(format!("read key {key:?} is listed twice"));
            }
        }
        let mut written = std::collections::BTreeSet::new();
        for write in &args.writes {
            if partitioner.target_of(&write.key) != ShardTarget::Shard(self.shard) {
                return Err(format!("write key {:?} is not on shard {}", write.key, self.shard));
            }
            if !written.insert(&write.key) {
                return Err(format!("write key {:?} is listed twice", write.key));
            }
        }
        for scan in &args.scans {
            if scan.range.limit > SCAN_ROWS_MAX || scan.rows.len() > scan.range.limit as usize {
                return Err(format!("a scan of {} rows over its limit", scan.rows.len()));
            }
        }
        check_shards(&args.participants, self.context.topology.shards, true)?;
        if !args.participants.contains(&self.shard) {
            return Err(format!("shard {} is not among the participants", self.shard));
        }
        if args.one_phase && args.participants.len() != 1 {
            return Err("a one-phase prepare with several participants".into());
        }
        Ok(())
    }
}

/// Checks a list of shards: existing, strictly increasing, and non-empty when `non_empty`.
fn check_shards(shards: &[ShardId], count: u32, non_empty: bool) -> Result<(), String> {
    if non_empty && shards.is_empty() {
        return Err("no participants".into());
    }
    if shards.iter().any(|s| s.0 >= count) || shards.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("shards {shards:?} are not distinct existing shards in order"));
    }
    Ok(())
}

/// A concurrency control as [`Any`], so that the protocol's own code can reach its type.
/// Implemented for the controls only: a blanket over every `Any` would also cover the
/// `Box` holding one, and a call on the box would downcast the box.
pub(crate) trait AsAny: Any {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: Concurrency> AsAny for T {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// How one protocol of the family keeps transactions apart: the engine calls it where the
/// protocols differ, handing it the shared [`Core`]. Every method but [`Concurrency::rules`]
/// has a default: `occ`'s behaviour, which executes against the newest committed state
/// without keeping anything, validates reads and locks at prepare, and keeps no history below
/// the last commit.
pub(crate) trait Concurrency: AsAny + Send {
    /// What the replicated state must do for this control.
    fn rules(&self) -> Rules;

    /// A copy with fresh leader-only state, for a speculating leader's second machine; `None`
    /// for a control that does not speculate.
    fn fork(&self) -> Option<Box<dyn Concurrency>> {
        None
    }

    /// The leader serves an execution (`request` is an `Execute`) outside the log, answering
    /// `origin` now or later.
    fn serve_execute(
        &mut self,
        core: &mut Core,
        _now: Time,
        origin: NodeId,
        request: ShardRequest,
        out: &mut Outbox<OccMsg>,
    ) {
        let ShardRequest::Execute { txn, shard, proc, args, calls, overlay, .. } = request else {
            return;
        };
        let result = core.on_execute(txn, proc, &args, &calls, overlay);
        out.send(origin, OccMsg::Executed { txn, shard, result });
    }

    /// The leader, before a one-round commit enters the log: why it must be refused, if it
    /// must (`has_log`: the command waits for its log entry rather than applying at once).
    fn admit_one_round(
        &mut self,
        _core: &mut Core,
        _now: Time,
        _txn: TxnId,
        _proc: ProcId,
        _args: &Args,
        _has_log: bool,
    ) -> Option<Conflict> {
        None
    }

    /// The leader, before a prepare enters the log: `None` holds it back (it comes back from
    /// [`Concurrency::take_unblocked`]); otherwise it goes on, with the refusal to log if
    /// there is one.
    fn hold_prepare(
        &mut self,
        _core: &mut Core,
        _now: Time,
        _origin: NodeId,
        _txn: TxnId,
        args: PrepareArgs,
    ) -> Option<(PrepareArgs, Option<Conflict>)> {
        Some((args, None))
    }

    /// The leader: why a prepare that is not held back must be refused, if it must.
    fn may_prepare(
        &mut self,
        _core: &mut Core,
        _txn: TxnId,
        _args: &PrepareArgs,
    ) -> Option<Conflict> {
        None
    }

    /// Held prepares that may go on now, oldest first: who sent each, the attempt, its
    /// arguments.
    fn take_unblocked(&mut self, _core: &mut Core) -> Vec<(NodeId, TxnId, PrepareArgs)> {
        Vec::new()
    }

    /// `txn` is decided or refused here: leader-only state it held goes.
    fn release(&mut self, _core: &mut Core, _now: Time, _txn: TxnId, _out: &mut Outbox<OccMsg>) {}

    /// The leader received an abort for `txn`, before it enters the log.
    fn abandon(&mut self, _core: &mut Core, _now: Time, _txn: TxnId, _out: &mut Outbox<OccMsg>) {}

    /// A leader's periodic work, before its inquiries.
    fn leader_tick(&mut self, _core: &mut Core, _now: Time, _out: &mut Outbox<OccMsg>) {}

    /// This replica starts or stops leading its shard (inquiries are already dropped).
    fn on_leadership(&mut self, _core: &mut Core, _leads: bool) {}

    /// Checks the control's part of a command (after the shared checks).
    fn check(&self, _core: &Core, _command: &ShardCommand) -> Result<(), String> {
        Ok(())
    }

    /// Whether the control has log entries of its own ([`Concurrency::apply_entry`]); a log
    /// of a control without them refuses any.
    fn has_entries(&self) -> bool {
        false
    }

    /// Before a command applies: its logged clock reading, if it carries one, and the causal
    /// chain of the call applying it.
    fn before_apply(&mut self, _core: &mut Core, _now: Option<Time>, _chain: u16) {}

    /// A prepare in the log of an attempt neither prepared nor decided here.
    fn prepare(&mut self, core: &mut Core, now: Time, txn: TxnId, args: PrepareArgs) -> Vote {
        core.prepare_validated(now, txn, args, None)
    }

    /// A one-round commit in the log, not refused by the leader.
    #[allow(clippy::too_many_arguments)] // the command's fields, as logged
    fn execute_commit(
        &mut self,
        core: &mut Core,
        now: Time,
        txn: TxnId,
        _ts: Timestamp,
        _epoch: u64,
        proc: ProcId,
        args: &Args,
    ) -> Result<(Vec<PieceRun>, Option<Timestamp>), ExecFailure> {
        core.execute_commit_validated(now, txn, None, proc, args)
    }

    /// An entry of the control's own in the log (validated by [`Concurrency::check`]).
    fn apply_entry(&mut self, _core: &mut Core, _entry: Entry) {}

    /// The periodic GC tick, on every copy: raise the store's GC watermark. By default to the
    /// last commit: reads see only the newest version (execution, validation, scans and
    /// snapshot images alike), so history below it serves no reader (keeping a retention's
    /// worth held a second of overwritten values, hundreds of megabytes of YCSB records at full
    /// speed). Every later write is above `ts_last`.
    fn gc(&mut self, core: &mut Core, _now: Time) {
        core.raise_watermark(0, None);
    }

    /// Counters and gauges of the control's own.
    fn counters(&self, _counters: &mut Vec<(&'static str, u64)>) {}

    /// The control's replicated state, for a snapshot image.
    fn image(&self) -> Vec<u8> {
        Vec::new()
    }

    /// Checks the control's part of an image (a bad one is an error).
    fn check_image(&self, bytes: &[u8]) -> Result<(), String> {
        match bytes.is_empty() {
            true => Ok(()),
            false => Err(format!("{} bytes of state this protocol does not keep", bytes.len())),
        }
    }

    /// Replaces the control's replicated state by an image's (checked), after the engine's
    /// own part is installed; `watermark` is the image's GC watermark.
    fn install_image(&mut self, _core: &mut Core, _bytes: &[u8], _watermark: Timestamp) {}

    /// Before an image's rows go over the store.
    fn before_install(&mut self, _core: &mut Core) {}
}

/// The participant of one shard: the shared core and the protocol's concurrency control.
pub(crate) struct Participant {
    pub(crate) core: Core,
    pub(crate) cc: Box<dyn Concurrency>,
}

impl Participant {
    pub(super) fn new(shard: ShardId, context: NodeContext, cc: Box<dyn Concurrency>) -> Self {
        Self { core: Core::new(shard, context, cc.rules()), cc }
    }

    /// A copy of the replicated state with fresh leader-only state: a speculating leader's
    /// speculative machine.
    pub(super) fn fork(&self) -> Self {
        let cc = self.cc.fork().expect("only a speculating protocol's participants are forked");
        Self { core: self.core.fork(), cc }
    }

    /// The concurrency control, as its own type (`None` under another protocol).
    pub(crate) fn cc<T: Concurrency>(&self) -> Option<&T> {
        self.cc.as_any().downcast_ref()
    }

    /// [`Participant::cc`], mutably, with the core beside it.
    pub(crate) fn cc_mut<T: Concurrency>(&mut self) -> Option<(&mut T, &mut Core)> {
        let cc = self.cc.as_any_mut().downcast_mut()?;
        Some((cc, &mut self.core))
    }

    pub(super) fn store(&self) -> &MvccStore {
        &self.core.store
    }

    pub(super) fn store_mut(&mut self) -> &mut MvccStore {
        &mut self.core.store
    }

    /// A prepare in the log: duplicates and decided attempts get their answer here, new ones
    /// go to the concurrency control.
    pub(super) fn on_prepare(&mut self, now: Time, txn: TxnId, request: PrepareArgs) -> Vote {
        if let Some(prepared) = self.core.prepared.get(&txn) {
            return Vote::Yes(prepared.proposal); // A duplicate prepare.
        }
        match self.core.known(txn) {
            Known::Decided(Decision::Aborted) => return Vote::No(Conflict::AlreadyAborted),
            Known::Decided(Decision::Committed(ts)) => return Vote::Committed(ts),
            Known::Forgotten => return Vote::Forgotten,
            Known::Unseen => {}
        }
        self.cc.prepare(&mut self.core, now, txn, request)
    }

    /// Applies a decision (see [`Core::on_decision`]).
    #[cfg(test)]
    pub(super) fn on_decision(
        &mut self,
        now: Time,
        txn: TxnId,
        decision: Decision,
    ) -> Option<PeerState> {
        self.core.on_decision(now, txn, decision)
    }

    /// Where `txn` stands here (see [`Core::on_query`]).
    #[cfg(test)]
    pub(super) fn on_query(&mut self, now: Time, txn: TxnId) -> PeerState {
        self.core.on_query(now, txn)
    }

    /// Raises the GC watermark (the concurrency control's rule). Then, when this replica
    /// leads, does the control's periodic work and the inquiries among participants.
    pub(super) fn on_gc_tick(&mut self, now: Time, leads: bool, out: &mut Outbox<OccMsg>) {
        self.cc.gc(&mut self.core, now);
        if !leads {
            self.core.inquiries.clear();
            return;
        }
        self.cc.leader_tick(&mut self.core, now, out);
        self.core.inquire(now, out);
    }

    /// A peer's answer to one of this participant's inquiries, from `from` (which leads
    /// `peer`). Returns what to do: a decision or settlement to put through the log, or a
    /// decision to tell a peer that never heard it.
    pub(super) fn on_peer_state(
        &mut self,
        from: NodeId,
        txn: TxnId,
        peer: ShardId,
        state: PeerState,
    ) -> Option<Concluded> {
        let core = &mut self.core;
        if !core.inquiries.contains(txn) {
            return None;
        }
        core.peers.note(peer, from);
        let own = core.prepared.get(&txn).map(|p| p.proposal);
        core.inquiries.on_state(txn, peer, state, own)
    }

    /// The node this participant believes leads `peer`.
    pub(super) fn leader_of(&self, peer: ShardId) -> NodeId {
        self.core.peers.leader(peer)
    }

    /// The peers to tell a decision this participant reached by termination.
    pub(super) fn participants_of(&self, txn: TxnId) -> Vec<ShardId> {
        let core = &self.core;
        core.prepared.get(&txn).map(|p| core.peers_of(&p.participants)).unwrap_or_default()
    }

    /// The leader, before a one-round commit enters the log (see
    /// [`Concurrency::admit_one_round`]).
    pub(super) fn lock_one_round(
        &mut self,
        now: Time,
        txn: TxnId,
        proc: ProcId,
        args: &Args,
        has_log: bool,
    ) -> Option<Conflict> {
        self.cc.admit_one_round(&mut self.core, now, txn, proc, args, has_log)
    }

    /// The leader, before a prepare enters the log (see [`Concurrency::hold_prepare`]).
    pub(super) fn hold_prepare(
        &mut self,
        now: Time,
        origin: NodeId,
        txn: TxnId,
        args: PrepareArgs,
    ) -> Option<(PrepareArgs, Option<Conflict>)> {
        self.cc.hold_prepare(&mut self.core, now, origin, txn, args)
    }

    /// The leader: why a prepare must be refused (see [`Concurrency::may_prepare`]).
    pub(super) fn may_prepare(&mut self, txn: TxnId, args: &PrepareArgs) -> Option<Conflict> {
        self.cc.may_prepare(&mut self.core, txn, args)
    }

    /// Held prepares that may go on now (see [`Concurrency::take_unblocked`]).
    pub(super) fn take_unblocked(&mut self) -> Vec<(NodeId, TxnId, PrepareArgs)> {
        self.cc.take_unblocked(&mut self.core)
    }

    /// `txn` is decided or refused here (see [`Concurrency::release`]).
    pub(super) fn release_exec(&mut self, now: Time, txn: TxnId, out: &mut Outbox<OccMsg>) {
        self.cc.release(&mut self.core, now, txn, out);
    }

    /// The leader received an abort for `txn` (see [`Concurrency::abandon`]).
    pub(super) fn abandon_exec(&mut self, now: Time, txn: TxnId, out: &mut Outbox<OccMsg>) {
        self.cc.abandon(&mut self.core, now, txn, out);
    }

    /// Counters and gauges for metrics.
    pub(super) fn counters(&self) -> Vec<(&'static str, u64)> {
        let core = &self.core;
        let mut counters = vec![
            ("occ_participant_prepared", core.prepared.len() as u64),
            ("occ_participant_locked_keys", core.locks.locked_keys() as u64),
            ("occ_participant_inquiries", core.inquiries.len() as u64),
            ("occ_participant_decided", core.decided.len() as u64),
            ("occ_participant_unsettled", core.decided.unsettled_count() as u64),
            ("occ_participant_decided_evicted_total", core.decided.evicted_total()),
            ("occ_participant_committed_total", core.counts.committed),
            ("occ_participant_aborted_total", core.counts.aborted),
            ("occ_participant_terminated_total", core.counts.terminated),
            ("occ_participant_refused_malformed_total", core.counts.refused_malformed),
        ];
        self.cc.counters(&mut counters);
        counters
    }
}

impl StateMachine for Participant {
    type Command = ShardCommand;
    type Msg = OccMsg;
    /// The asker, the leader's clock when it asked, and the request.
    type Read = (NodeId, Time, ShardRequest);
    type Image = Image;

    fn validate(&self, command: &ShardCommand) -> Result<(), String> {
        self.core.check_command(command)?;
        if matches!(command, ShardCommand::Speculation(_)) && !self.cc.has_entries() {
            return Err("an entry of another protocol in this log".into());
        }
        self.cc.check(&self.core, command)
    }

    fn apply(&mut self, command: ShardCommand, answer: bool, out: &mut Outbox<OccMsg>) {
        let shard = self.core.shard;
        let logged_now = match &command {
            ShardCommand::Prepare { now, .. }
            | ShardCommand::ExecuteCommit { now, .. }
            | ShardCommand::Decide { now, .. }
            | ShardCommand::Query { now, .. } => Some(*now),
            ShardCommand::Settle { .. } | ShardCommand::Speculation(_) => None,
        };
        self.cc.before_apply(&mut self.core, logged_now, out.chain());
        match command {
            ShardCommand::Prepare { reply_to, now, txn, refused, args } => {
                let vote = match refused {
                    Some(conflict) => self.core.refuse_prepare(now, txn, conflict),
                    None => self.on_prepare(now, txn, args),
                };
                if !matches!(vote, Vote::Yes(_)) {
                    self.release_exec(now, txn, out);
                }
                if answer {
                    out.send(reply_to, OccMsg::Prepared { txn, shard, vote });
                }
            }
            ShardCommand::ExecuteCommit { reply_to, now, txn, refused, ts, epoch, proc, args } => {
                let mut result = match refused {
                    Some(conflict) => self.core.refuse_one_round(now, txn, conflict),
                    None => {
                        self.cc.execute_commit(&mut self.core, now, txn, ts, epoch, proc, &args)
                    }
                };
                self.release_exec(now, txn, out);
                if !answer {
                    return;
                }
                // The coordinator needs only the outputs of a one-round commit.
                for run in result.iter_mut().flat_map(|(runs, _)| runs.iter_mut()) {
                    run.reads = Vec::new();
                    run.scans = Vec::new();
                    if let Ok(effects) = run.effects.as_mut() {
                        effects.writes = Vec::new();
                    }
                }
                out.send(reply_to, OccMsg::ExecutedCommit { txn, shard, result });
            }
            ShardCommand::Decide { reply_to, now, txn, decision, tell } => {
                let Some(state) = self.core.on_decision(now, txn, decision) else { return };
                self.release_exec(now, txn, out);
                if !tell.is_empty() {
                    self.core.counts.terminated += 1;
                }
                if !answer {
                    return;
                }
                let told = match state {
                    PeerState::Decided(known) => known,
                    _ => decision,
                };
                for peer in tell {
                    out.send(
                        self.core.peers.leader(peer),
                        OccMsg::Request(ShardRequest::decision(txn, peer, told)),
                    );
                }
                if let Some(to) = reply_to {
                    out.send(to, OccMsg::Finished { txn, shard, state });
                }
            }
            ShardCommand::Query { reply_to, now, txn } => {
                let state = self.core.on_query(now, txn);
                if !matches!(state, PeerState::Prepared(_)) {
                    self.release_exec(now, txn, out);
                }
                if answer {
                    out.send(reply_to, OccMsg::State { txn, shard, state });
                }
            }
            ShardCommand::Settle { txns } => {
                for txn in txns {
                    self.core.decided.settle(txn);
                    self.core.inquiries.close(txn);
                }
            }
            ShardCommand::Speculation(entry) => self.cc.apply_entry(&mut self.core, entry),
        }
    }

    fn serve_read(&mut self, (origin, now, request): Self::Read, out: &mut Outbox<OccMsg>) {
        self.cc.serve_execute(&mut self.core, now, origin, request, out);
    }

    fn on_leadership(&mut self, leads: bool) {
        self.core.inquiries.clear();
        self.cc.on_leadership(&mut self.core, leads);
    }

    /// Encoded from borrows (postcard writes `&T` as `T`), so nothing is copied but the bytes.
    fn image(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct ImageRef<'a> {
            rows: Vec<(&'a Key, Timestamp, TxnId, &'a Option<Value>)>,
            prepared: Vec<(TxnId, &'a Prepared)>,
            decided: DecidedImage,
            ts_last: Timestamp,
            counts: Counts,
            watermark: Timestamp,
            cc: Vec<u8>,
        }
        let core = &self.core;
        let rows = match core.rules.keeps_history {
            false => core
                .store
                .written_since_load()
                .map(|(k, v)| (k, v.ts, v.writer, &v.value))
                .collect(),
            // Reads see history: every committed version of the written keys.
            true => core
                .store
                .written_since_load()
                .flat_map(|(k, _)| {
                    core.store
                        .versions(k)
                        .iter()
                        .filter(|v| v.state == VersionState::Committed)
                        .map(move |v| (k, v.ts, v.writer, &v.value))
                })
                .collect(),
        };
        let image = ImageRef {
            rows,
            prepared: core.prepared.iter().map(|(&txn, p)| (txn, p)).collect(),
            decided: core.decided.image(),
            ts_last: core.ts_last,
            counts: core.counts,
            watermark: core.store.gc_watermark(),
            cc: self.cc.image(),
        };
        postcard::to_allocvec(&image).expect("images encode")
    }

    fn decode_image(&self, _context: &NodeContext, bytes: &[u8]) -> Result<Image, String> {
        let image: Image = postcard::from_bytes(bytes)
            .map_err(|e| format!("snapshot image does not decode: {e}"))?;
        image.decided.check(self.core.context.limits.decided_max)?;
        self.cc.check_image(&image.cc)?;
        if image.rows.windows(2).any(|w| w[0].0 == w[1].0 && w[0].1 >= w[1].1) {
            return Err("snapshot versions of a key are not in timestamp order".into());
        }
        Ok(image)
    }

    /// The rows go over the store as it is (the initial load, or an older state of the same
    /// log); everything else is replaced.
    fn install(&mut self, image: Image) {
        let core = &mut self.core;
        // Pending versions of the attempts prepared before belong to the old state.
        for (txn, prepared) in std::mem::take(&mut core.prepared) {
            for write in prepared.writes.iter().filter(|_| core.rules.pending_writes) {
                core.store.revoke(&write.key, txn);
            }
        }
        self.cc.before_install(core);
        let mut rows = image.rows.into_iter().peekable();
        while let Some((key, ts, writer, value)) = rows.next() {
            let mut chain = vec![Version { ts, value, writer, state: VersionState::Committed }];
            while let Some((_, ts, writer, value)) = rows.next_if(|(next, ..)| *next == key) {
                chain.push(Version { ts, value, writer, state: VersionState::Committed });
            }
            core.store.restore_chain(key, chain);
        }
        core.store.set_gc_watermark(image.watermark);
        core.locks = LockTable::new();
        for (txn, prepared) in image.prepared {
            let writes: Vec<Key> = prepared.writes.iter().map(|w| w.key.clone()).collect();
            core.locks
                .try_all(txn, &prepared.reads, &prepared.scans, &writes)
                .expect("the prepared attempts of one state never conflict");
            if core.rules.pending_writes {
                let writes = prepared.writes.iter().cloned();
                core.install_as(txn, writes, prepared.proposal, VersionState::Pending);
            }
            core.prepared.insert(txn, prepared);
        }
        core.decided.install(image.decided);
        core.ts_last = image.ts_last;
        core.counts = image.counts;
        core.inquiries.clear();
        self.cc.install_image(core, &image.cc, image.watermark);
    }
}

#[cfg(test)]
impl Participant {
    pub(super) fn prepared_count(&self) -> usize {
        self.core.prepared.len()
    }

    pub(super) fn lock_count(&self) -> usize {
        self.core.locks.locked_keys()
    }

    pub(super) fn set_registry(&mut self, registry: Arc<meridian_core::txn::Registry>) {
        self.core.context.registry = registry;
    }

    pub(super) fn debug_state(&self) -> String {
        format!(
            "prepared {:?} locks {}",
            self.core.prepared.keys().collect::<Vec<_>>(),
            self.core.locks.locked_keys()
        )
    }
}
