//! The `occ` participant of one shard: executes pieces, validates and locks at prepare,
//! applies decisions. It is the [`StateMachine`] the kit's hosting runs on the shard's log.
//!
//! Invariants (asserted):
//! - a key has at most one prepared writer, and a prepared writer excludes other prepared
//!   readers of the key (and vice versa): the lock table's invariants;
//! - every lock belongs to an attempt in `prepared`, and every prepared attempt's locks exist;
//! - a commit installs versions above every version the key held at prepare (the proposal
//!   rule), so the store accepts them.
//!
//! Under `2pc-mvto` ([`CcMode::Mvto`], the `mvto` submodule) reads see versions below the
//! attempt's timestamp, prepared writes are pending versions in the store, prepared reads
//! leave read stamps instead of locks, and the GC watermark moves only in log order.
//!
//! Under `2pl` ([`CcMode::Locking`]) the leader also keeps execution locks (see
//! `crate::twopl`): pieces run only under their locks, a prepare is logged as refused when the
//! attempt no longer holds them, and every decision releases them. The replicated state and
//! the validation at prepare are the same in both modes, so replicas never depend on the
//! leader-only locks.
//!
//! Input is checked before it can reach an assertion: [`Participant::validate`] refuses a
//! command whose contents are malformed (keys off the shard, a key listed twice, a bad
//! participant list), and state-dependent nonsense (a commit below the proposal) is refused
//! as a value and counted.

mod mako;
mod mvto;

use super::{CcMode, Conflict, ExecFailure, OccMsg, PrepareArgs, ShardCommand, ShardRequest, Vote};
use crate::kit::coord::LeaderCache;
use crate::kit::exec::{self, Latest, PieceCall, PieceRun, Placement, ScanCheck, VersionTag};
use crate::kit::host::StateMachine;
use crate::kit::locks::{LockTable, Mode};
use crate::kit::twopc::{
    Asking, Concluded, DecidedCache, DecidedImage, Decision, Inquiries, Known, PeerState,
    SETTLE_BATCH_MAX,
};
use crate::twopl::locking::{Doom, Locking, Need, Released, Step};
use crate::NodeContext;
use meridian_core::key::{Key, Value};
use meridian_core::node::Outbox;
use meridian_core::txn::{
    Args, ProcError, ProcId, Procedure, ScanRange, ShardTarget, Write, PIECES_MAX, PIECE_KEYS_MAX,
    SCAN_ROWS_MAX,
};
use meridian_core::{ShardId, Time, Timestamp, TxnId};
use meridian_storage::{MvccStore, Version, VersionState};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A prepared attempt whose coordinator has been quiet this many RPC timeouts is decided with
/// the other participants. Longer than the coordinator's own timeout, so a live coordinator
/// usually decides first (either way the outcome is the same).
const TERMINATE_AFTER_TIMEOUTS: u64 = 3;
/// A commit still unsettled this many RPC timeouts after it was decided here is settled by
/// asking its peers (its coordinator's announcement was lost, or the coordinator is gone).
const SETTLE_AFTER_TIMEOUTS: u64 = 8;
/// Prepared attempts and unsettled commits whose inquiry one GC tick may start.
const INQUIRIES_PER_TICK_MAX: usize = 1_024;
/// Most keys (reads plus writes) and scans one prepare may carry: a plan's worth.
const PREPARE_KEYS_MAX: usize = PIECES_MAX * PIECE_KEYS_MAX;
/// Under `2pl`, execution locks of an attempt that has not prepared and has been idle this
/// many RPC timeouts are released: its coordinator has moved on or is gone. Longer than the
/// coordinator's own execution timeout, so a live coordinator gives up first.
const LEASE_TIMEOUTS: u64 = 4;
/// Executions one release may resume or refuse (each needs at least one waiter, and waiters
/// are bounded by the executions the leader accepted); a bound on the loop, not a limit hit in
/// practice.
const RELEASED_PER_CALL_MAX: usize = 1 << 20;

/// A prepared attempt: what it locked and will write.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Prepared {
    reads: Vec<Key>,
    scans: Vec<ScanRange>,
    writes: Vec<Write>,
    proposal: Timestamp,
    /// Every participant of the attempt.
    participants: Vec<ShardId>,
    /// When it prepared here (the leader's clock, as logged).
    prepared_at: Time,
}

/// A participant's replicated state as a snapshot carries it. The store part holds only the
/// keys transactions wrote, each with its newest committed version (deletes included): every
/// replica bulk-loads the same initial data, and `occ` reads only the newest version, so the
/// initial load plus these rows is the store. Under `2pc-mvto`, which reads history, the rows
/// are every committed version of those keys (oldest first per key), and the watermark and
/// read stamps come too; pending versions follow from `prepared`. Locks follow from
/// `prepared`. Leader-only state (inquiries, the peers' leaders) is not carried.
#[derive(Serialize, Deserialize)]
pub(super) struct Image {
    rows: Vec<(Key, Timestamp, TxnId, Option<Value>)>,
    prepared: Vec<(TxnId, Prepared)>,
    decided: DecidedImage,
    ts_last: Timestamp,
    counts: Counts,
    watermark: Timestamp,
    stamps: Option<crate::mvto::order::StampsImage>,
    mako: Option<mako::MakoState>,
}

/// Monotonic counters, replicated with the state.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
struct Counts {
    committed: u64,
    aborted: u64,
    terminated: u64,
    refused_malformed: u64,
}

/// The participant of one shard.
pub(super) struct Participant {
    shard: ShardId,
    context: NodeContext,
    store: MvccStore,
    locks: LockTable,
    prepared: BTreeMap<TxnId, Prepared>,
    decided: DecidedCache,
    ts_last: Timestamp,
    counts: Counts,
    /// Leader-only: attempts being decided or settled with the peers, and where they lead.
    inquiries: Inquiries,
    peers: LeaderCache,
    /// Leader-only, `2pl`: execution locks.
    locking: Option<Locking<ShardRequest>>,
    /// `2pc-mvto`: read stamps, held prepares.
    mvto: Option<mvto::MvtoState>,
    /// `mako`: the shard's epoch and watermark (replicated).
    mako: Option<mako::MakoState>,
    /// `mako`: the node's durable point; the GC watermark stays at or below it (local).
    gc_cap: Option<Timestamp>,
}

/// The vote or failure a doomed attempt gets.
fn conflict_of(doom: Doom) -> Conflict {
    match doom {
        Doom::Denied => Conflict::Locked,
        Doom::Wounded => Conflict::Wounded,
        Doom::Expired => Conflict::LeaseExpired,
    }
}

impl Participant {
    pub(super) fn new(shard: ShardId, context: NodeContext, mode: CcMode) -> Self {
        Self {
            locking: match mode {
                CcMode::Validation | CcMode::Mvto | CcMode::Speculative => None,
                CcMode::Locking(policy) => Some(Locking::new(policy)),
            },
            mvto: (mode == CcMode::Mvto).then(|| {
                let at = context.options.choice(
                    crate::mvto::OPTION_READ_STAMPS,
                    <crate::mvto::Mvto as crate::Protocol>::OPTIONS,
                );
                mvto::MvtoState::new(context.limits.read_stamps_max, at == "execution")
            }),
            shard,
            store: MvccStore::new(),
            locks: LockTable::new(),
            prepared: BTreeMap::new(),
            decided: DecidedCache::new(context.limits.decided_max),
            ts_last: Timestamp::ZERO,
            counts: Counts::default(),
            inquiries: Inquiries::new(context.limits.inquiries_max),
            peers: LeaderCache::new(context.topology.clone()),
            mako: (mode == CcMode::Speculative).then(mako::MakoState::default),
            gc_cap: None,
            context,
        }
    }

    /// A copy of the replicated state with fresh leader-only state: a speculating leader's
    /// speculative machine (`mako`; the other protocols do not speculate).
    pub(super) fn fork(&self) -> Self {
        assert!(
            self.mvto.is_none() && self.locking.is_none(),
            "only mako's participants are forked"
        );
        Self {
            shard: self.shard,
            context: self.context.clone(),
            store: self.store.clone(),
            locks: self.locks.clone(),
            prepared: self.prepared.clone(),
            decided: self.decided.clone(),
            ts_last: self.ts_last,
            counts: self.counts,
            inquiries: Inquiries::new(self.context.limits.inquiries_max),
            peers: LeaderCache::new(self.context.topology.clone()),
            locking: None,
            mvto: None,
            mako: self.mako.clone(),
            gc_cap: self.gc_cap,
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

    fn placement(&self) -> Placement<'_> {
        Placement { shard: self.shard, partitioner: &self.context.partitioner }
    }

    /// What this shard knows of `txn` beyond its prepared attempts. An attempt prepared here
    /// is never "forgotten": the low-water mark of its coordinator may have passed it (a later
    /// attempt of the same coordinator decided and evicted first), so callers look at
    /// `prepared` first.
    fn known(&self, txn: TxnId) -> Known {
        debug_assert!(!self.prepared.contains_key(&txn), "callers check prepared first");
        self.decided.get(txn)
    }

    /// Refuses requests for attempts already prepared or decided (or decided and forgotten).
    fn undecided(&self, txn: TxnId) -> Result<(), ExecFailure> {
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
    pub(super) fn on_execute(
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
    /// touches is locked by a prepared attempt.
    fn on_execute_commit(
        &mut self,
        now: Time,
        txn: TxnId,
        epoch: u64,
        proc: ProcId,
        args: &Args,
    ) -> Result<(Vec<PieceRun>, Option<Timestamp>), ExecFailure> {
        self.undecided(txn)?;
        if let Some(conflict) = self.mako_refusal(epoch) {
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

    /// Validates and locks; with `one_phase`, commits at once.
    pub(super) fn on_prepare(&mut self, now: Time, txn: TxnId, request: PrepareArgs) -> Vote {
        if let Some(prepared) = self.prepared.get(&txn) {
            return Vote::Yes(prepared.proposal); // A duplicate prepare.
        }
        match self.known(txn) {
            Known::Decided(Decision::Aborted) => return Vote::No(Conflict::AlreadyAborted),
            Known::Decided(Decision::Committed(ts)) => return Vote::Committed(ts),
            Known::Forgotten => return Vote::Forgotten,
            Known::Unseen => {}
        }
        if self.mvto.is_some() {
            return self.prepare_mvto(now, txn, request);
        }
        if let Some(conflict) = self.mako_refusal(request.epoch) {
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
    /// when the decision is refused as malformed (a commit below the proposal).
    pub(super) fn on_decision(
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
            // Under `2pc-mvto` every participant proposes the attempt's timestamp, and its
            // pending versions sit there.
            if ts < prepared.proposal || (self.mvto.is_some() && ts != prepared.proposal) {
                self.counts.refused_malformed += 1;
                return None;
            }
        }
        let prepared = self.prepared.remove(&txn).expect("checked above");
        self.locks.release_all(txn);
        self.inquiries.close(txn);
        if self.mvto.is_some() {
            self.decide_mvto(txn, &prepared, decision);
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

    fn install(&mut self, txn: TxnId, writes: impl IntoIterator<Item = Write>, ts: Timestamp) {
        self.install_as(txn, writes, ts, VersionState::Committed);
    }

    /// Writes `writes` at `ts` as versions in `state` (pending: a `2pc-mvto` prepare). The
    /// caller has checked that `ts` is above every version of the keys and the watermark.
    /// Takes the writes by value: callers that are done with theirs hand them over, so a
    /// value is not copied on its way into the store.
    fn install_as(
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

    fn remember(&mut self, txn: TxnId, decision: Decision, participants: Vec<ShardId>, now: Time) {
        // Only the peers matter for settling; an attempt of this shard alone keeps none (and
        // allocates nothing: most commits are single-shard).
        let participants =
            if participants.iter().all(|&s| s == self.shard) { Vec::new() } else { participants };
        if let Some(m) = self.mvto.as_mut() {
            m.note_decided(); // Held prepares of this attempt, or waiting on it, move on.
        }
        if self.decided.remember(txn, decision, participants, now) {
            match decision {
                Decision::Committed(_) => self.counts.committed += 1,
                Decision::Aborted => self.counts.aborted += 1,
            }
        }
    }

    /// Where `txn` stands here. An attempt this shard never saw is refused from now on, so
    /// whoever asked may decide without it.
    pub(super) fn on_query(&mut self, now: Time, txn: TxnId) -> PeerState {
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

    /// Raises the GC watermark: never past a prepared attempt's proposal (its commit will
    /// write at or above it), and under `mako` keeping `gc_retention_ns` of history. Then,
    /// when this replica leads, starts inquiries (prepared attempts whose coordinator has been
    /// quiet too long, commits unsettled too long) and sends the queries due.
    pub(super) fn on_gc_tick(&mut self, now: Time, leads: bool, out: &mut Outbox<OccMsg>) {
        // Under `2pc-mvto` the watermark moves in log order instead (`advance_watermark`).
        if self.mvto.is_none() {
            // `occ` and `2pl` read only the newest committed version (execution, validation,
            // scans and snapshot images alike), so history below it serves no reader: keeping
            // a retention's worth held a second of overwritten values (hundreds of megabytes
            // of YCSB records at full speed). Every later write is above `ts_last`.
            let retention = match self.mako {
                Some(_) => self.context.timing.gc_retention_ns,
                None => 0,
            };
            let mut watermark = Timestamp(self.ts_last.0.saturating_sub(retention));
            if let Some(lowest) = self.prepared.values().map(|p| p.proposal).min() {
                watermark = watermark.min(Timestamp(lowest.0.saturating_sub(1)));
            }
            if self.mako.is_some() {
                // `mako` keeps everything a discard may fall back to.
                watermark = watermark.min(self.gc_cap.unwrap_or(Timestamp::ZERO));
            }
            self.store.set_gc_watermark(watermark);
        }
        if !leads {
            self.inquiries.clear();
            return;
        }
        self.expire_waiting(now);
        let rpc_ns = self.context.timing.rpc_timeout_ns;
        if let Some(locking) = self.locking.as_mut() {
            let mut released = Released::new();
            locking.expire(now, LEASE_TIMEOUTS * rpc_ns, &mut released);
            self.answer_released(now, released, out);
        }
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

    /// A peer's answer to one of this participant's inquiries, from `from` (which leads
    /// `peer`). Returns what to do: a decision or settlement to put through the log, or a
    /// decision to tell a peer that never heard it.
    pub(super) fn on_peer_state(
        &mut self,
        from: meridian_core::NodeId,
        txn: TxnId,
        peer: ShardId,
        state: PeerState,
    ) -> Option<Concluded> {
        if !self.inquiries.contains(txn) {
            return None;
        }
        self.peers.note(peer, from);
        let own = self.prepared.get(&txn).map(|p| p.proposal);
        self.inquiries.on_state(txn, peer, state, own)
    }

    /// The node this participant believes leads `peer`.
    pub(super) fn leader_of(&self, peer: ShardId) -> meridian_core::NodeId {
        self.peers.leader(peer)
    }

    /// The peers to tell a decision this participant reached by termination.
    pub(super) fn participants_of(&self, txn: TxnId) -> Vec<ShardId> {
        self.prepared.get(&txn).map(|p| self.peers_of(&p.participants)).unwrap_or_default()
    }

    /// `2pl`: takes a one-round commit's locks at the leader before it is proposed, from a run
    /// of the plan over the current state (what the logged run will read and write, since the
    /// locks keep it unchanged). Returns why it is refused, if it is; `None` also when there
    /// is nothing to lock against (no log, so it applies at once, and no execution locks), or
    /// when the attempt is known here already (the logged command answers a duplicate).
    pub(super) fn lock_one_round(
        &mut self,
        now: Time,
        txn: TxnId,
        proc: ProcId,
        args: &Args,
        has_log: bool,
    ) -> Option<Conflict> {
        let locking = self.locking.as_ref()?;
        if !locking.holds(txn) && locking.holder_count() >= self.context.limits.lock_holders_max {
            return Some(Conflict::Full);
        }
        if (!has_log && locking.is_idle())
            || locking.holds(txn)
            || self.prepared.contains_key(&txn)
            || !matches!(self.decided.get(txn), Known::Unseen)
        {
            return None;
        }
        let procedure = self.procedure(proc).ok()?;
        // A failing plan needs no locks: the logged command reports the failure.
        let run = exec::run_plan(procedure.as_ref(), self.placement(), args, &Latest(&self.store))
            .ok()?;
        let mut keys: BTreeMap<Key, Mode> = BTreeMap::new();
        let mut ranges = Vec::new();
        for piece in &run.runs {
            for (key, _) in &piece.reads {
                keys.entry(key.clone()).or_insert(Mode::Shared);
            }
            ranges.extend(piece.scans.iter().map(|s| Need::Range(s.range.clone())));
        }
        for key in run.writes.keys() {
            keys.insert(key.clone(), Mode::Exclusive);
        }
        let needs: Vec<Need> =
            keys.into_iter().map(|(k, m)| Need::Key(k, m)).chain(ranges).collect();
        let locking = self.locking.as_mut()?;
        (!locking.lock_now(txn, &needs, now)).then_some(Conflict::Locked)
    }

    /// `2pl`: why a prepare for `txn` must be refused at the leader (it no longer holds the
    /// execution locks of what it read and writes here), if it must. Attempts prepared or
    /// decided here go to the log as they are (the log answers duplicates).
    pub(super) fn may_prepare(&mut self, txn: TxnId, args: &PrepareArgs) -> Option<Conflict> {
        if self.mvto.is_some() {
            return self.may_prepare_mvto(txn, args);
        }
        let locking = self.locking.as_mut()?;
        if self.prepared.contains_key(&txn) || !matches!(self.decided.get(txn), Known::Unseen) {
            return None;
        }
        if let Some(doom) = locking.doom_of(txn) {
            return Some(conflict_of(doom));
        }
        let reads = args.reads.iter().map(|(k, _)| k);
        let writes = args.writes.iter().map(|w| &w.key);
        (!locking.start_prepare(txn, reads, writes)).then_some(Conflict::Locked)
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

    /// `2pl`: `txn` is decided or refused here: its execution locks go, and the executions
    /// waiting for them run (or are refused) now.
    pub(super) fn release_exec(&mut self, now: Time, txn: TxnId, out: &mut Outbox<OccMsg>) {
        let Some(locking) = self.locking.as_mut() else { return };
        let mut released = Released::new();
        locking.release(txn, now, &mut released);
        self.answer_released(now, released, out);
    }

    /// `2pl`: the leader received an abort for `txn`: if it has not started to prepare here,
    /// its execution locks go at once (the abort's log entry records the refusal).
    pub(super) fn abandon_exec(&mut self, now: Time, txn: TxnId, out: &mut Outbox<OccMsg>) {
        let Some(locking) = self.locking.as_mut() else { return };
        let mut released = Released::new();
        locking.abandon(txn, now, &mut released);
        self.answer_released(now, released, out);
    }

    /// `2pl`: the locks an execution needs, strongest mode per key, keys in order (then
    /// ranges): computed from the pieces' declared keys, checked like execution checks them.
    fn needs_of(
        &self,
        proc: ProcId,
        args: &Args,
        calls: &[PieceCall],
    ) -> Result<Vec<Need>, ExecFailure> {
        let procedure = self.procedure(proc)?;
        if calls.len() > PIECES_MAX {
            let why = format!("{} pieces is over {PIECES_MAX}", calls.len());
            return Err(ExecFailure::Procedure(ProcError::Contract(why)));
        }
        let mut keys: BTreeMap<Key, Mode> = BTreeMap::new();
        let mut ranges = Vec::new();
        for call in calls {
            let inputs: Vec<&meridian_core::txn::PieceOutput> = call.inputs.iter().collect();
            let set = procedure.keys(call.piece, args, &inputs).map_err(ExecFailure::Procedure)?;
            exec::check_keys(self.placement(), &set).map_err(ExecFailure::Procedure)?;
            for key in set.reads {
                keys.entry(key).or_insert(Mode::Shared);
            }
            for key in set.writes {
                keys.insert(key, Mode::Exclusive);
            }
            ranges.extend(set.scans.into_iter().map(Need::Range));
        }
        Ok(keys.into_iter().map(|(k, m)| Need::Key(k, m)).chain(ranges).collect())
    }

    /// `2pl`: an execution at the leader: takes its locks (or waits, or is refused), then runs.
    fn execute_locked(
        &mut self,
        now: Time,
        origin: meridian_core::NodeId,
        request: ShardRequest,
        out: &mut Outbox<OccMsg>,
    ) {
        let ShardRequest::Execute { txn, shard, priority, proc, ref args, ref calls, .. } = request
        else {
            return;
        };
        let refusal = self.undecided(txn).err().or_else(|| {
            let doom = self.locking.as_ref().and_then(|l| l.doom_of(txn));
            doom.map(|d| ExecFailure::Conflict(conflict_of(d)))
        });
        let needs = match refusal.map_or_else(|| self.needs_of(proc, args, calls), Err) {
            Ok(needs) => needs,
            Err(failure) => {
                out.send(origin, OccMsg::Executed { txn, shard, result: Err(failure) });
                return;
            }
        };
        let Some(locking) = self.locking.as_mut() else { return };
        if locking.is_waiting(txn) {
            // A duplicate of the execution waiting here, which answers when it runs.
            return;
        }
        if !locking.holds(txn) && locking.holder_count() >= self.context.limits.lock_holders_max {
            let result = Err(ExecFailure::Conflict(Conflict::Full));
            out.send(origin, OccMsg::Executed { txn, shard, result });
            return;
        }
        let mut released = Released::new();
        match locking.execute(txn, priority, origin, request, needs, now, &mut released) {
            Step::Run(run) => released.ready.insert(0, run),
            Step::Parked => {}
            Step::Denied => {
                let result = Err(ExecFailure::Conflict(Conflict::Locked));
                out.send(origin, OccMsg::Executed { txn, shard, result });
            }
        }
        self.answer_released(now, released, out);
    }

    /// `2pl`: runs the executions whose locks are now held and answers the refused ones. A run
    /// that meets a lock of a prepared attempt this leader never locked for (one a previous
    /// leader admitted) is refused, which may release more.
    fn answer_released(
        &mut self,
        now: Time,
        mut released: Released<ShardRequest>,
        out: &mut Outbox<OccMsg>,
    ) {
        for _ in 0..RELEASED_PER_CALL_MAX {
            if let Some((origin, request, doom)) = released.refused.pop() {
                if let ShardRequest::Execute { txn, shard, .. } = request {
                    let result = Err(ExecFailure::Conflict(conflict_of(doom)));
                    out.send(origin, OccMsg::Executed { txn, shard, result });
                }
                continue;
            }
            if released.ready.is_empty() {
                return;
            }
            let (origin, request) = released.ready.remove(0);
            let ShardRequest::Execute { txn, shard, proc, args, calls, overlay, .. } = request
            else {
                continue;
            };
            let mut result = self.on_execute(txn, proc, &args, &calls, overlay);
            if let Ok(runs) = &result {
                let reads: Vec<&Key> =
                    runs.iter().flat_map(|r| r.reads.iter().map(|(k, _)| k)).collect();
                let scans: Vec<ScanRange> =
                    runs.iter().flat_map(|r| r.scans.iter().map(|s| s.range.clone())).collect();
                let writes: Vec<&Key> = runs
                    .iter()
                    .filter_map(|r| r.effects.as_ref().ok())
                    .flat_map(|e| e.writes.iter().map(|w| &w.key))
                    .collect();
                if self.locks.check_all(txn, reads, &scans, writes).is_err() {
                    if let Some(locking) = self.locking.as_mut() {
                        locking.deny(txn, now, &mut released);
                    }
                    result = Err(ExecFailure::Conflict(Conflict::Locked));
                }
            }
            out.send(origin, OccMsg::Executed { txn, shard, result });
        }
    }

    /// Counters and gauges for metrics.
    pub(super) fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut counters = vec![
            ("occ_participant_prepared", self.prepared.len() as u64),
            ("occ_participant_locked_keys", self.locks.locked_keys() as u64),
            ("occ_participant_inquiries", self.inquiries.len() as u64),
            ("occ_participant_decided", self.decided.len() as u64),
            ("occ_participant_unsettled", self.decided.unsettled_count() as u64),
            ("occ_participant_decided_evicted_total", self.decided.evicted_total()),
            ("occ_participant_committed_total", self.counts.committed),
            ("occ_participant_aborted_total", self.counts.aborted),
            ("occ_participant_terminated_total", self.counts.terminated),
            ("occ_participant_refused_malformed_total", self.counts.refused_malformed),
        ];
        if let Some(m) = &self.mvto {
            counters.extend(m.counters());
        }
        counters.extend(self.mako_counters());
        if let Some(l) = &self.locking {
            let (holders, waiting, keys) = l.gauges();
            counters.extend([
                ("twopl_exec_holders", holders),
                ("twopl_exec_waiting", waiting),
                ("twopl_exec_locked_keys", keys),
                ("twopl_lock_denied_total", l.denied_total),
                ("twopl_wounded_total", l.wounded_total),
                ("twopl_lock_waits_total", l.waits_total),
                ("twopl_lock_wait_ns_total", l.wait_ns_total),
                ("twopl_lease_expired_total", l.expired_total),
            ]);
        }
        counters
    }

    /// Checks a command's contents (see the module documentation).
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
            ShardCommand::Mako(_) => {
                if self.mako.is_none() {
                    return Err("a mako entry in another protocol's log".into());
                }
                None
            }
        };
        if let Some(txn) = txn {
            if txn.origin.0 as usize >= topology.nodes.len() {
                return Err(format!("attempt {txn} comes from no node of the cluster"));
            }
        }
        match command {
            ShardCommand::Prepare { args, now, .. } => {
                self.check_prepare(args)?;
                self.check_ts(args.ts, *now)
            }
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
            ShardCommand::ExecuteCommit { ts, now, .. } => self.check_ts(*ts, *now),
            ShardCommand::Query { .. } => Ok(()),
            ShardCommand::Settle { .. } => Ok(()),
            ShardCommand::Mako(_) => Ok(()),
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

    /// `2pc-mvto`: an attempt's timestamp is set and not far beyond the leader's clock `now`
    /// (as logged). Other protocols carry none.
    fn check_ts(&self, ts: Timestamp, now: Time) -> Result<(), String> {
        if self.mvto.is_none() {
            return Ok(());
        }
        if ts == Timestamp::ZERO {
            return Err("a 2pc-mvto request without a timestamp".into());
        }
        let latest = now.saturating_add(crate::mvto::order::TS_AHEAD_MAX_NS);
        if ts.0 > latest {
            return Err(format!(
                "timestamp {} is more than {} s ahead of the leader's clock",
                ts.0,
                crate::mvto::order::TS_AHEAD_MAX_NS / meridian_core::time::NS_PER_S
            ));
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

impl StateMachine for Participant {
    type Command = ShardCommand;
    type Msg = OccMsg;
    /// The asker, the leader's clock when it asked, and the request.
    type Read = (meridian_core::NodeId, Time, ShardRequest);
    type Image = Image;

    fn validate(&self, command: &ShardCommand) -> Result<(), String> {
        self.check_command(command)
    }

    fn apply(&mut self, command: ShardCommand, answer: bool, out: &mut Outbox<OccMsg>) {
        let shard = self.shard;
        self.mako_note_chain(out.chain());
        match &command {
            ShardCommand::Prepare { now, .. }
            | ShardCommand::ExecuteCommit { now, .. }
            | ShardCommand::Decide { now, .. }
            | ShardCommand::Query { now, .. } => self.advance_watermark(*now),
            ShardCommand::Settle { .. } | ShardCommand::Mako(_) => {}
        }
        match command {
            ShardCommand::Prepare { reply_to, now, txn, refused, args } => {
                let vote = match refused {
                    Some(conflict) => self.refuse_prepare(now, txn, conflict),
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
                    Some(conflict) => self.refuse_one_round(now, txn, conflict),
                    None if self.mvto.is_some() => {
                        self.execute_commit_mvto(now, txn, ts, proc, &args)
                    }
                    None => self.on_execute_commit(now, txn, epoch, proc, &args),
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
                let Some(state) = self.on_decision(now, txn, decision) else { return };
                self.release_exec(now, txn, out);
                if !tell.is_empty() {
                    self.counts.terminated += 1;
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
                        self.peers.leader(peer),
                        OccMsg::Request(ShardRequest::decision(txn, peer, told)),
                    );
                }
                if let Some(to) = reply_to {
                    out.send(to, OccMsg::Finished { txn, shard, state });
                }
            }
            ShardCommand::Query { reply_to, now, txn } => {
                let state = self.on_query(now, txn);
                if !matches!(state, PeerState::Prepared(_)) {
                    self.release_exec(now, txn, out);
                }
                if answer {
                    out.send(reply_to, OccMsg::State { txn, shard, state });
                }
            }
            ShardCommand::Settle { txns } => {
                for txn in txns {
                    self.decided.settle(txn);
                    self.inquiries.close(txn);
                }
            }
            ShardCommand::Mako(entry) => self.apply_mako(entry),
        }
    }

    fn serve_read(&mut self, (origin, now, request): Self::Read, out: &mut Outbox<OccMsg>) {
        if self.locking.is_some() {
            return self.execute_locked(now, origin, request, out);
        }
        let ShardRequest::Execute { txn, shard, ts, proc, args, calls, overlay, .. } = request
        else {
            return;
        };
        let result = match self.mvto {
            Some(_) => self.execute_mvto(txn, ts, proc, &args, &calls, overlay),
            None => self.on_execute(txn, proc, &args, &calls, overlay),
        };
        out.send(origin, OccMsg::Executed { txn, shard, result });
    }

    fn on_leadership(&mut self, leads: bool) {
        if leads {
            self.mako_on_leadership();
        }
        self.inquiries.clear();
        if let Some(m) = self.mvto.as_mut() {
            m.clear_leader_state();
        }
        // Execution locks are the leader's alone: a new term starts without any (attempts
        // that held some fail to prepare and retry).
        if let Some(locking) = self.locking.as_mut() {
            locking.clear();
        }
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
            stamps: Option<crate::mvto::order::StampsImage>,
            mako: &'a Option<mako::MakoState>,
        }
        // Under `mako` every version too: a discard may fall back to an older one.
        let history = self.mvto.is_some() || self.mako.is_some();
        let rows = match history {
            false => self
                .store
                .written_since_load()
                .map(|(k, v)| (k, v.ts, v.writer, &v.value))
                .collect(),
            // Reads see history: every committed version of the written keys.
            true => self
                .store
                .written_since_load()
                .flat_map(|(k, _)| {
                    self.store
                        .versions(k)
                        .iter()
                        .filter(|v| v.state == VersionState::Committed)
                        .map(move |v| (k, v.ts, v.writer, &v.value))
                })
                .collect(),
        };
        let image = ImageRef {
            rows,
            prepared: self.prepared.iter().map(|(&txn, p)| (txn, p)).collect(),
            decided: self.decided.image(),
            ts_last: self.ts_last,
            counts: self.counts,
            watermark: self.store.gc_watermark(),
            stamps: self.mvto.as_ref().map(|m| m.stamps.image()),
            mako: &self.mako,
        };
        postcard::to_allocvec(&image).expect("images encode")
    }

    fn decode_image(context: &NodeContext, bytes: &[u8]) -> Result<Image, String> {
        let image: Image = postcard::from_bytes(bytes)
            .map_err(|e| format!("snapshot image does not decode: {e}"))?;
        image.decided.check(context.limits.decided_max)?;
        if let Some(stamps) = &image.stamps {
            crate::mvto::order::ReadStamps::check_image(stamps, context.limits.read_stamps_max)?;
        }
        if let Some(m) = &image.mako {
            m.check()?;
        }
        if image.rows.windows(2).any(|w| w[0].0 == w[1].0 && w[0].1 >= w[1].1) {
            return Err("snapshot versions of a key are not in timestamp order".into());
        }
        Ok(image)
    }

    /// The rows go over the store as it is (the initial load, or an older state of the same
    /// log); everything else is replaced.
    fn install(&mut self, image: Image) {
        // Pending versions of the attempts prepared before belong to the old state.
        for (txn, prepared) in std::mem::take(&mut self.prepared) {
            for write in prepared.writes.iter().filter(|_| self.mvto.is_some()) {
                self.store.revoke(&write.key, txn);
            }
        }
        if self.mako.is_some() {
            // Versions of the old state that the image's discarded must go; the image holds
            // every version of the keys written since the load.
            self.store.forget_writes();
        }
        let mut rows = image.rows.into_iter().peekable();
        while let Some((key, ts, writer, value)) = rows.next() {
            let mut chain = vec![Version { ts, value, writer, state: VersionState::Committed }];
            while let Some((_, ts, writer, value)) = rows.next_if(|(next, ..)| *next == key) {
                chain.push(Version { ts, value, writer, state: VersionState::Committed });
            }
            self.store.restore_chain(key, chain);
        }
        self.store.set_gc_watermark(image.watermark);
        self.locks = LockTable::new();
        for (txn, prepared) in image.prepared {
            let writes: Vec<Key> = prepared.writes.iter().map(|w| w.key.clone()).collect();
            self.locks
                .try_all(txn, &prepared.reads, &prepared.scans, &writes)
                .expect("the prepared attempts of one state never conflict");
            if self.mvto.is_some() {
                let writes = prepared.writes.iter().cloned();
                self.install_as(txn, writes, prepared.proposal, VersionState::Pending);
            }
            self.prepared.insert(txn, prepared);
        }
        if let (Some(m), Some(stamps)) = (self.mvto.as_mut(), image.stamps) {
            m.stamps.install(stamps, image.watermark);
            m.clear_leader_state();
        }
        self.decided.install(image.decided);
        self.ts_last = image.ts_last;
        self.counts = image.counts;
        if self.mako.is_some() {
            self.mako = image.mako;
        }
        self.inquiries.clear();
        if let Some(locking) = self.locking.as_mut() {
            locking.clear();
        }
    }
}

#[cfg(test)]
impl Participant {
    pub(super) fn prepared_count(&self) -> usize {
        self.prepared.len()
    }

    pub(super) fn lock_count(&self) -> usize {
        self.locks.locked_keys()
    }

    /// `2pl`: attempts holding execution locks plus keys locked.
    pub(super) fn exec_lock_count(&self) -> u64 {
        self.locking.as_ref().map_or(0, |l| {
            let (holders, _, keys) = l.gauges();
            holders + keys
        })
    }

    pub(super) fn set_registry(&mut self, registry: Arc<meridian_core::txn::Registry>) {
        self.context.registry = registry;
    }

    pub(super) fn debug_state(&self) -> String {
        format!(
            "prepared {:?} locks {}",
            self.prepared.keys().collect::<Vec<_>>(),
            self.locks.locked_keys()
        )
    }
}
