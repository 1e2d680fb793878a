//! The participant's `2pc-mvto` concurrency control (the rules are in `crate::mvto`): reads
//! below the attempt's timestamp, prepares that wait for the writers they read from, the
//! replicated checks and stamps, pending versions as write locks, and the deterministic GC
//! watermark.

use super::{Participant, Prepared, TERMINATE_AFTER_TIMEOUTS};
use crate::kit::exec::{self, PieceCall, PieceRun, VersionTag};
use crate::kit::twopc::{Decision, Known};
use crate::mvto::order::{pending_of, taken_at, version_below, Below, ReadStamps, SoftStamps};
use crate::occ::{Conflict, ExecFailure, PrepareArgs, Vote};
use meridian_core::key::Key;
use meridian_core::txn::{Args, ProcId, ScanRange, Write};
use meridian_core::{NodeId, Time, Timestamp, TxnId};
use meridian_storage::VersionState;
use std::collections::BTreeMap;

/// A prepare held back at the leader until the writers it read from are decided.
struct Waiting {
    origin: NodeId,
    txn: TxnId,
    args: PrepareArgs,
    since: Time,
}

/// What a `2pc-mvto` participant keeps beyond `occ`'s state.
pub(in crate::occ) struct MvtoState {
    /// Replicated: read stamps of prepared reads and scans.
    pub(super) stamps: ReadStamps,
    /// Leader-only: stamps of reads served, not yet prepared (hints; kept only with
    /// `2pc-mvto-read-stamps=execution`).
    soft: Option<SoftStamps>,
    /// Leader-only: prepares waiting for a writer's decision, oldest first.
    waiting: Vec<Waiting>,
    /// A decision applied since the waiting prepares were last looked at.
    decided_since_scan: bool,
    waits_total: u64,
    waits_expired_total: u64,
    cascaded_total: u64,
    too_old_total: u64,
}

impl MvtoState {
    pub(in crate::occ) fn new(stamps_max: usize, stamp_at_execution: bool) -> Self {
        Self {
            stamps: ReadStamps::new(stamps_max),
            soft: stamp_at_execution.then(|| SoftStamps::new(stamps_max)),
            waiting: Vec::new(),
            decided_since_scan: false,
            waits_total: 0,
            waits_expired_total: 0,
            cascaded_total: 0,
            too_old_total: 0,
        }
    }

    /// Leader state goes with the leadership (waiting prepares' coordinators time out and ask).
    pub(super) fn clear_leader_state(&mut self) {
        if let Some(soft) = self.soft.as_mut() {
            soft.clear();
        }
        self.waiting.clear();
    }

    /// A decision or refusal was recorded: the held prepares are looked at again.
    pub(super) fn note_decided(&mut self) {
        self.decided_since_scan = true;
    }

    pub(super) fn counters(&self) -> [(&'static str, u64); 7] {
        [
            ("mvto_read_stamps", self.stamps.len() as u64),
            ("mvto_read_stamps_evicted_total", self.stamps.evicted_total()),
            ("mvto_prepares_waiting", self.waiting.len() as u64),
            ("mvto_prepare_waits_total", self.waits_total),
            ("mvto_prepare_waits_expired_total", self.waits_expired_total),
            ("mvto_cascading_aborts_total", self.cascaded_total),
            ("mvto_too_old_total", self.too_old_total),
        ]
    }
}

/// The reads of `runs`, one per key (pieces of one shard reading a key see one version).
fn reads_of(runs: &[PieceRun]) -> Vec<(Key, Option<VersionTag>)> {
    let mut reads: BTreeMap<Key, Option<VersionTag>> = BTreeMap::new();
    for run in runs {
        for (key, seen) in &run.reads {
            reads.entry(key.clone()).or_insert(*seen);
        }
    }
    reads.into_iter().collect()
}

impl Participant {
    fn mvto_mut(&mut self) -> &mut MvtoState {
        self.mvto.as_mut().expect("called under 2pc-mvto only")
    }

    /// Runs `calls` at `ts` (the leader, outside the log); with read stamps at execution, stamps
    /// the reads as hints.
    pub(super) fn execute_mvto(
        &mut self,
        txn: TxnId,
        ts: Timestamp,
        proc: ProcId,
        args: &Args,
        calls: &[PieceCall],
        overlay: Vec<Write>,
    ) -> Result<Vec<PieceRun>, ExecFailure> {
        self.undecided(txn)?;
        let watermark = self.store.gc_watermark();
        if ts <= watermark {
            self.mvto_mut().too_old_total += 1;
            return Err(ExecFailure::Conflict(Conflict::TooOld(watermark)));
        }
        let procedure = self.procedure(proc)?;
        let overlay = overlay.into_iter().map(|w| (w.key, w.value)).collect();
        let source = Below(&self.store, ts);
        let runs =
            exec::run_calls(procedure.as_ref(), self.placement(), args, calls, &source, overlay)
                .map_err(ExecFailure::Procedure)?;
        if let Some(soft) = self.mvto.as_mut().and_then(|m| m.soft.as_mut()) {
            for run in &runs {
                for (key, _) in &run.reads {
                    soft.note(key, ts);
                }
            }
        }
        Ok(runs)
    }

    /// The writer of a pending version `args` read (other than the attempt itself), if any:
    /// the prepare must wait for its decision.
    fn blocked_on(&self, txn: TxnId, args: &PrepareArgs) -> Option<TxnId> {
        args.reads.iter().find_map(|(key, seen)| {
            let seen = (*seen)?;
            let pending = pending_of(self.store.versions(key))?;
            (pending.writer != txn && pending.writer == seen.writer && pending.ts == seen.ts)
                .then_some(pending.writer)
        })
    }

    /// The leader, before a prepare enters the log: holds it back while it depends on an
    /// undecided writer (returns `None`; it comes back from [`Participant::take_unblocked`]),
    /// and otherwise hands it on, with the refusal to log if there is one. Attempts already
    /// prepared or decided go on (the log answers duplicates); a duplicate of a held prepare
    /// is dropped; with no room to hold it, it goes on refused (`Full`).
    pub(in crate::occ) fn hold_prepare(
        &mut self,
        now: Time,
        origin: NodeId,
        txn: TxnId,
        args: PrepareArgs,
    ) -> Option<(PrepareArgs, Option<Conflict>)> {
        let Some(mvto) = self.mvto.as_ref() else { return Some((args, None)) };
        if self.prepared.contains_key(&txn) || !matches!(self.decided.get(txn), Known::Unseen) {
            return Some((args, None));
        }
        if self.blocked_on(txn, &args).is_none() {
            return Some((args, None));
        }
        if mvto.waiting.iter().any(|w| w.txn == txn) {
            return None;
        }
        if mvto.waiting.len() >= self.context.limits.dependents_waiting_max {
            return Some((args, Some(Conflict::Full)));
        }
        let mvto = self.mvto_mut();
        mvto.waits_total += 1;
        mvto.waiting.push(Waiting { origin, txn, args, since: now });
        None
    }

    /// `2pc-mvto`: why the leader refuses a prepare before it enters the log, if it does: no
    /// write below a read the leader served (the reader came first).
    pub(super) fn may_prepare_mvto(&mut self, txn: TxnId, args: &PrepareArgs) -> Option<Conflict> {
        if self.prepared.contains_key(&txn) || !matches!(self.decided.get(txn), Known::Unseen) {
            return None;
        }
        let mvto = self.mvto.as_mut()?;
        let soft = mvto.soft.as_ref()?;
        let stamp = args.writes.iter().map(|w| soft.stamp_of(&w.key)).max()?;
        // Strictly above: the attempt's own reads left stamps at its timestamp. (Another
        // attempt at the same timestamp slips past this hint; the replicated check holds.)
        (stamp > args.ts).then(|| {
            mvto.too_old_total += 1;
            Conflict::TooOld(stamp)
        })
    }

    /// Held prepares whose writers are all decided now, to go on (oldest first). Those of
    /// attempts decided meanwhile (their coordinator's query refused them) are dropped: they
    /// would only take room.
    pub(in crate::occ) fn take_unblocked(&mut self) -> Vec<(NodeId, TxnId, PrepareArgs)> {
        let Some(mvto) = self.mvto.as_mut() else { return Vec::new() };
        if !std::mem::take(&mut mvto.decided_since_scan) || mvto.waiting.is_empty() {
            return Vec::new();
        }
        let waiting = std::mem::take(&mut mvto.waiting);
        let live: Vec<Waiting> = waiting
            .into_iter()
            .filter(|w| {
                !self.prepared.contains_key(&w.txn)
                    && matches!(self.decided.get(w.txn), Known::Unseen)
            })
            .collect();
        let (blocked, ready): (Vec<Waiting>, Vec<Waiting>) =
            live.into_iter().partition(|w| self.blocked_on(w.txn, &w.args).is_some());
        self.mvto_mut().waiting = blocked;
        ready.into_iter().map(|w| (w.origin, w.txn, w.args)).collect()
    }

    /// Drops held prepares older than a few RPC timeouts: their coordinators have asked (and
    /// refused them here) or moved on; a writer that is still undecided is being terminated.
    pub(super) fn expire_waiting(&mut self, now: Time) {
        let Some(mvto) = self.mvto.as_mut() else { return };
        let before =
            now.saturating_sub(TERMINATE_AFTER_TIMEOUTS * self.context.timing.rpc_timeout_ns);
        let held = mvto.waiting.len();
        mvto.waiting.retain(|w| w.since > before);
        mvto.waits_expired_total += (held - mvto.waiting.len()) as u64;
    }

    /// Raises the GC watermark from the leader's logged clock reading: keep the retention,
    /// never pass a prepared attempt's timestamp. Moved only here, in log order, so every
    /// replica keeps the same history and stamps.
    pub(super) fn advance_watermark(&mut self, now: Time) {
        if self.mvto.is_none() {
            return;
        }
        let mut watermark = Timestamp(now.saturating_sub(self.context.timing.gc_retention_ns));
        if let Some(lowest) = self.prepared.values().map(|p| p.proposal).min() {
            watermark = watermark.min(Timestamp(lowest.0.saturating_sub(1)));
        }
        self.store.set_gc_watermark(watermark);
        let watermark = self.store.gc_watermark();
        let mvto = self.mvto_mut();
        mvto.stamps.forget_below(watermark);
        if let Some(soft) = mvto.soft.as_mut() {
            soft.forget_below(watermark);
        }
    }

    /// Checks a prepare at `args.ts` against the replicated state (the module rules).
    fn check_mvto(&self, txn: TxnId, args: &PrepareArgs) -> Result<(), Conflict> {
        let ts = args.ts;
        let watermark = self.store.gc_watermark();
        if ts <= watermark {
            return Err(Conflict::TooOld(watermark));
        }
        for (key, seen) in &args.reads {
            let chain = self.store.versions(key);
            if taken_at(chain, ts, txn) {
                return Err(Conflict::Stale);
            }
            let now = version_below(chain, ts);
            if VersionTag::of(now) != *seen {
                let writer_aborted = seen.is_some_and(|s| {
                    matches!(self.decided.get(s.writer), Known::Decided(Decision::Aborted))
                });
                return Err(if writer_aborted { Conflict::Cascading } else { Conflict::Stale });
            }
            if now.is_some_and(|v| v.state == VersionState::Pending && v.writer != txn) {
                // Its writer is undecided: the leader holds such prepares back, but one can
                // still arrive here (a new leader, or no room to hold it).
                return Err(Conflict::Locked);
            }
        }
        let below = Timestamp(ts.0.saturating_sub(1));
        for scan in &args.scans {
            let rows = self.store.scan(&scan.range, below);
            let same = rows.len() == scan.rows.len()
                && rows.iter().zip(&scan.rows).all(|((k, v), (seen_key, seen))| {
                    k == seen_key && v.ts == seen.ts && v.writer == seen.writer
                });
            if !same {
                return Err(Conflict::Stale);
            }
            if self.pending_in(&scan.range, ts, txn) {
                return Err(Conflict::Locked);
            }
        }
        let stamps = &self.mvto.as_ref().expect("2pc-mvto").stamps;
        for write in &args.writes {
            let chain = self.store.versions(&write.key);
            if pending_of(chain).is_some_and(|v| v.writer != txn) {
                return Err(Conflict::Locked);
            }
            if let Some(newest) = chain.last() {
                if newest.ts >= ts {
                    return Err(Conflict::TooOld(newest.ts));
                }
            }
            let stamp = stamps.stamp_of(&write.key);
            if stamp >= ts {
                return Err(Conflict::TooOld(stamp));
            }
        }
        Ok(())
    }

    /// Whether another prepared attempt below `ts` writes inside `range`.
    fn pending_in(&self, range: &ScanRange, ts: Timestamp, txn: TxnId) -> bool {
        self.prepared.iter().any(|(&other, p)| {
            other != txn
                && p.proposal < ts
                && p.writes.iter().any(|w| range.start <= w.key && w.key < range.end)
        })
    }

    /// Records a refusal's cause in the counters.
    fn count_refusal(&mut self, conflict: Conflict) {
        let mvto = self.mvto_mut();
        match conflict {
            Conflict::Cascading => mvto.cascaded_total += 1,
            Conflict::TooOld(_) => mvto.too_old_total += 1,
            _ => {}
        }
    }

    /// Stamps the reads and scans of a prepare that passed its checks.
    fn stamp(&mut self, args: &PrepareArgs) {
        let stamps = &mut self.mvto_mut().stamps;
        for (key, _) in &args.reads {
            stamps.note_read(key, args.ts);
        }
        for scan in &args.scans {
            stamps.note_scan(&scan.range, args.ts);
        }
    }

    /// A prepare in the log (neither a duplicate nor decided here): checks, stamps, and
    /// installs the writes as pending versions (or, one-phase, commits them at once).
    pub(super) fn prepare_mvto(&mut self, now: Time, txn: TxnId, args: PrepareArgs) -> Vote {
        let refusal = if !self.decided.has_room(self.prepared.len()) {
            Err(Conflict::Full)
        } else {
            self.check_mvto(txn, &args)
        };
        if let Err(conflict) = refusal {
            self.count_refusal(conflict);
            self.remember(txn, Decision::Aborted, Vec::new(), now);
            return Vote::No(conflict);
        }
        self.stamp(&args);
        let ts = args.ts;
        if args.one_phase {
            self.install(txn, args.writes, ts);
            self.ts_last = self.ts_last.max(ts);
            self.remember(txn, Decision::Committed(ts), args.participants, now);
            return Vote::Committed(ts);
        }
        let write_keys: Vec<Key> = args.writes.iter().map(|w| w.key.clone()).collect();
        self.locks
            .try_all(txn, &[], &[], &write_keys)
            .expect("a key with no pending version has no prepared writer");
        self.install_as(txn, args.writes.iter().cloned(), ts, VersionState::Pending);
        let prepared = Prepared {
            reads: Vec::new(),
            scans: Vec::new(),
            writes: args.writes,
            proposal: ts,
            participants: args.participants,
            prepared_at: now,
        };
        self.prepared.insert(txn, prepared);
        Vote::Yes(ts)
    }

    /// A one-round commit in the log: runs the plan at `ts` over the replicated state and
    /// commits it there if the prepare checks pass.
    pub(super) fn execute_commit_mvto(
        &mut self,
        now: Time,
        txn: TxnId,
        ts: Timestamp,
        proc: ProcId,
        args: &Args,
    ) -> Result<(Vec<PieceRun>, Option<Timestamp>), ExecFailure> {
        self.undecided(txn)?;
        let procedure = self.procedure(proc)?;
        let run =
            exec::run_plan(procedure.as_ref(), self.placement(), args, &Below(&self.store, ts))
                .map_err(ExecFailure::Procedure)?;
        if run.user_abort.is_some() {
            self.remember(txn, Decision::Aborted, Vec::new(), now);
            return Ok((run.runs, None));
        }
        let prepare = PrepareArgs {
            reads: reads_of(&run.runs),
            scans: run.runs.iter().flat_map(|r| r.scans.iter().cloned()).collect(),
            writes: run.writes.into_iter().map(|(key, value)| Write { key, value }).collect(),
            one_phase: true,
            participants: vec![self.shard],
            ts,
            epoch: 0,
        };
        match self.prepare_mvto(now, txn, prepare) {
            Vote::Committed(ts) => Ok((run.runs, Some(ts))),
            Vote::No(conflict) => Err(ExecFailure::Conflict(conflict)),
            other => unreachable!("a one-phase prepare of an unseen attempt voted {other:?}"),
        }
    }

    /// Applies a decision to a prepared attempt's pending versions.
    pub(super) fn decide_mvto(&mut self, txn: TxnId, prepared: &Prepared, decision: Decision) {
        for write in &prepared.writes {
            let done = match decision {
                Decision::Committed(_) => self.store.commit(&write.key, txn),
                Decision::Aborted => self.store.revoke(&write.key, txn),
            };
            assert!(done, "a prepared 2pc-mvto attempt's writes are pending versions");
        }
        self.mvto_mut().decided_since_scan = true;
    }
}
