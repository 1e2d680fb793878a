//! `2pc-mvto`'s concurrency control in the two-phase commit engine (the rules are in the
//! module documentation of `crate::mvto`): reads below the attempt's timestamp, prepares that
//! wait for the writers they read from, the replicated checks and stamps, pending versions as
//! write locks, and the deterministic GC watermark.

use super::order::{
    pending_of, taken_at, version_below, Below, ReadStamps, SoftStamps, StampsImage,
};
use crate::engine::participant::{Concurrency, Core, Prepared, Rules, TERMINATE_AFTER_TIMEOUTS};
use crate::engine::{Conflict, ExecFailure, OccMsg, PrepareArgs, ShardCommand, ShardRequest, Vote};
use crate::kit::coord::TS_AHEAD_MAX_NS;
use crate::kit::exec::{self, PieceCall, PieceRun, VersionTag};
use crate::kit::twopc::{Decision, Known};
use meridian_core::key::Key;
use meridian_core::node::Outbox;
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

/// What a `2pc-mvto` participant keeps beyond the engine's state.
pub(crate) struct TimestampOrder {
    /// Replicated: read stamps of prepared reads and scans.
    stamps: ReadStamps,
    /// Leader-only: stamps of reads served, not yet prepared (hints; kept only with
    /// `2pc-mvto-read-stamps=execution`).
    soft: Option<SoftStamps>,
    /// Leader-only: prepares waiting for a writer's decision, oldest first.
    waiting: Vec<Waiting>,
    /// The core's count of decisions when the waiting prepares were last looked at.
    scanned: u64,
    waits_total: u64,
    waits_expired_total: u64,
    cascaded_total: u64,
    too_old_total: u64,
}

impl TimestampOrder {
    /// At most `stamps_max` read stamps; `stamp_at_execution`: the leader also stamps the
    /// reads it serves (as hints).
    pub(crate) fn new(stamps_max: usize, stamp_at_execution: bool) -> Self {
        Self {
            stamps: ReadStamps::new(stamps_max),
            soft: stamp_at_execution.then(|| SoftStamps::new(stamps_max)),
            waiting: Vec::new(),
            scanned: 0,
            waits_total: 0,
            waits_expired_total: 0,
            cascaded_total: 0,
            too_old_total: 0,
        }
    }

    /// Leader state goes with the leadership (waiting prepares' coordinators time out and ask).
    fn clear_leader_state(&mut self) {
        if let Some(soft) = self.soft.as_mut() {
            soft.clear();
        }
        self.waiting.clear();
    }

    /// Checks a prepare at `args.ts` against the replicated state (the module rules).
    fn check(&self, core: &Core, txn: TxnId, args: &PrepareArgs) -> Result<(), Conflict> {
        let store = &core.store;
        let ts = args.ts;
        let watermark = store.gc_watermark();
        if ts <= watermark {
            return Err(Conflict::TooOld(watermark));
        }
        for (key, seen) in &args.reads {
            let chain = store.versions(key);
            if taken_at(chain, ts, txn) {
                return Err(Conflict::Stale);
            }
            let now = version_below(chain, ts);
            if VersionTag::of(now) != *seen {
                let writer_aborted = seen.is_some_and(|s| {
                    matches!(core.decided.get(s.writer), Known::Decided(Decision::Aborted))
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
            let rows = store.scan(&scan.range, below);
            let same = rows.len() == scan.rows.len()
                && rows.iter().zip(&scan.rows).all(|((k, v), (seen_key, seen))| {
                    k == seen_key && v.ts == seen.ts && v.writer == seen.writer
                });
            if !same {
                return Err(Conflict::Stale);
            }
            if pending_in(core, &scan.range, ts, txn) {
                return Err(Conflict::Locked);
            }
        }
        for write in &args.writes {
            let chain = store.versions(&write.key);
            if pending_of(chain).is_some_and(|v| v.writer != txn) {
                return Err(Conflict::Locked);
            }
            if let Some(newest) = chain.last() {
                if newest.ts >= ts {
                    return Err(Conflict::TooOld(newest.ts));
                }
            }
            let stamp = self.stamps.stamp_of(&write.key);
            if stamp >= ts {
                return Err(Conflict::TooOld(stamp));
            }
        }
        Ok(())
    }

    /// Records a refusal's cause in the counters.
    fn count_refusal(&mut self, conflict: Conflict) {
        match conflict {
            Conflict::Cascading => self.cascaded_total += 1,
            Conflict::TooOld(_) => self.too_old_total += 1,
            _ => {}
        }
    }

    /// Stamps the reads and scans of a prepare that passed its checks.
    fn stamp(&mut self, args: &PrepareArgs) {
        for (key, _) in &args.reads {
            self.stamps.note_read(key, args.ts);
        }
        for scan in &args.scans {
            self.stamps.note_scan(&scan.range, args.ts);
        }
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

/// The writer of a pending version `args` read (other than the attempt itself), if any: the
/// prepare must wait for its decision.
fn blocked_on(core: &Core, txn: TxnId, args: &PrepareArgs) -> Option<TxnId> {
    args.reads.iter().find_map(|(key, seen)| {
        let seen = (*seen)?;
        let pending = pending_of(core.store.versions(key))?;
        (pending.writer != txn && pending.writer == seen.writer && pending.ts == seen.ts)
            .then_some(pending.writer)
    })
}

/// Whether another prepared attempt below `ts` writes inside `range`.
fn pending_in(core: &Core, range: &ScanRange, ts: Timestamp, txn: TxnId) -> bool {
    core.prepared.iter().any(|(&other, p)| {
        other != txn
            && p.proposal < ts
            && p.writes.iter().any(|w| range.start <= w.key && w.key < range.end)
    })
}

/// An attempt's timestamp is set and not far beyond the leader's clock `now` (as logged).
fn check_ts(ts: Timestamp, now: Time) -> Result<(), String> {
    if ts == Timestamp::ZERO {
        return Err("a 2pc-mvto request without a timestamp".into());
    }
    let latest = now.saturating_add(TS_AHEAD_MAX_NS);
    if ts.0 > latest {
        return Err(format!(
            "timestamp {} is more than {} s ahead of the leader's clock",
            ts.0,
            TS_AHEAD_MAX_NS / meridian_core::time::NS_PER_S
        ));
    }
    Ok(())
}

impl Concurrency for TimestampOrder {
    fn rules(&self) -> Rules {
        Rules { pending_writes: true, keeps_history: true }
    }

    /// Runs `calls` at `ts` (the leader, outside the log); with read stamps at execution,
    /// stamps the reads as hints.
    fn serve_execute(
        &mut self,
        core: &mut Core,
        _now: Time,
        origin: NodeId,
        request: ShardRequest,
        out: &mut Outbox<OccMsg>,
    ) {
        let ShardRequest::Execute { txn, shard, ts, proc, args, calls, overlay, .. } = request
        else {
            return;
        };
        let result = self.execute(core, txn, ts, proc, &args, &calls, overlay);
        out.send(origin, OccMsg::Executed { txn, shard, result });
    }

    /// Holds a prepare back while it depends on an undecided writer. Attempts already
    /// prepared or decided go on (the log answers duplicates); a duplicate of a held prepare
    /// is dropped; with no room to hold it, it goes on refused (`Full`).
    fn hold_prepare(
        &mut self,
        core: &mut Core,
        now: Time,
        origin: NodeId,
        txn: TxnId,
        args: PrepareArgs,
    ) -> Option<(PrepareArgs, Option<Conflict>)> {
        if !core.is_new(txn) || blocked_on(core, txn, &args).is_none() {
            return Some((args, None));
        }
        if self.waiting.iter().any(|w| w.txn == txn) {
            return None;
        }
        if self.waiting.len() >= core.context.limits.dependents_waiting_max {
            return Some((args, Some(Conflict::Full)));
        }
        self.waits_total += 1;
        self.waiting.push(Waiting { origin, txn, args, since: now });
        None
    }

    /// No write below a read the leader served (the reader came first).
    fn may_prepare(&mut self, core: &mut Core, txn: TxnId, args: &PrepareArgs) -> Option<Conflict> {
        if !core.is_new(txn) {
            return None;
        }
        let soft = self.soft.as_ref()?;
        let stamp = args.writes.iter().map(|w| soft.stamp_of(&w.key)).max()?;
        // Strictly above: the attempt's own reads left stamps at its timestamp. (Another
        // attempt at the same timestamp slips past this hint; the replicated check holds.)
        (stamp > args.ts).then(|| {
            self.too_old_total += 1;
            Conflict::TooOld(stamp)
        })
    }

    /// Held prepares whose writers are all decided now (oldest first). Those of attempts
    /// decided meanwhile (their coordinator's query refused them) are dropped: they would
    /// only take room.
    fn take_unblocked(&mut self, core: &mut Core) -> Vec<(NodeId, TxnId, PrepareArgs)> {
        let fresh = core.remembered != self.scanned;
        self.scanned = core.remembered;
        if !fresh || self.waiting.is_empty() {
            return Vec::new();
        }
        let waiting = std::mem::take(&mut self.waiting);
        let live: Vec<Waiting> = waiting.into_iter().filter(|w| core.is_new(w.txn)).collect();
        let (blocked, ready): (Vec<Waiting>, Vec<Waiting>) =
            live.into_iter().partition(|w| blocked_on(core, w.txn, &w.args).is_some());
        self.waiting = blocked;
        ready.into_iter().map(|w| (w.origin, w.txn, w.args)).collect()
    }

    /// Drops held prepares older than a few RPC timeouts: their coordinators have asked (and
    /// refused them here) or moved on; a writer that is still undecided is being terminated.
    fn leader_tick(&mut self, core: &mut Core, now: Time, _out: &mut Outbox<OccMsg>) {
        let before =
            now.saturating_sub(TERMINATE_AFTER_TIMEOUTS * core.context.timing.rpc_timeout_ns);
        let held = self.waiting.len();
        self.waiting.retain(|w| w.since > before);
        self.waits_expired_total += (held - self.waiting.len()) as u64;
    }

    fn on_leadership(&mut self, _core: &mut Core, _leads: bool) {
        self.clear_leader_state();
    }

    /// The attempt's timestamp, in prepares and one-round commits.
    fn check(&self, _core: &Core, command: &ShardCommand) -> Result<(), String> {
        match command {
            ShardCommand::Prepare { args, now, .. } => check_ts(args.ts, *now),
            ShardCommand::ExecuteCommit { ts, now, .. } => check_ts(*ts, *now),
            _ => Ok(()),
        }
    }

    /// Raises the GC watermark from the leader's logged clock reading: keep the retention,
    /// never pass a prepared attempt's timestamp. Moved only here, in log order, so every
    /// replica keeps the same history and stamps.
    fn before_apply(&mut self, core: &mut Core, now: Option<Time>, _chain: u16) {
        let Some(now) = now else { return };
        let mut watermark = Timestamp(now.saturating_sub(core.context.timing.gc_retention_ns));
        if let Some(lowest) = core.lowest_proposal() {
            watermark = watermark.min(Timestamp(lowest.0.saturating_sub(1)));
        }
        core.store.set_gc_watermark(watermark);
        let watermark = core.store.gc_watermark();
        self.stamps.forget_below(watermark);
        if let Some(soft) = self.soft.as_mut() {
            soft.forget_below(watermark);
        }
    }

    /// Checks, stamps, and installs the writes as pending versions (or, one-phase, commits
    /// them at once).
    fn prepare(&mut self, core: &mut Core, now: Time, txn: TxnId, args: PrepareArgs) -> Vote {
        let refusal = if !core.decided.has_room(core.prepared.len()) {
            Err(Conflict::Full)
        } else {
            self.check(core, txn, &args)
        };
        if let Err(conflict) = refusal {
            self.count_refusal(conflict);
            core.remember(txn, Decision::Aborted, Vec::new(), now);
            return Vote::No(conflict);
        }
        self.stamp(&args);
        let ts = args.ts;
        if args.one_phase {
            core.install(txn, args.writes, ts);
            core.ts_last = core.ts_last.max(ts);
            core.remember(txn, Decision::Committed(ts), args.participants, now);
            return Vote::Committed(ts);
        }
        let write_keys: Vec<Key> = args.writes.iter().map(|w| w.key.clone()).collect();
        core.locks
            .try_all(txn, &[], &[], &write_keys)
            .expect("a key with no pending version has no prepared writer");
        core.install_as(txn, args.writes.iter().cloned(), ts, VersionState::Pending);
        let prepared = Prepared {
            reads: Vec::new(),
            scans: Vec::new(),
            writes: args.writes,
            proposal: ts,
            participants: args.participants,
            prepared_at: now,
        };
        core.prepared.insert(txn, prepared);
        Vote::Yes(ts)
    }

    /// Runs the plan at `ts` over the replicated state and commits it there if the prepare
    /// checks pass.
    fn execute_commit(
        &mut self,
        core: &mut Core,
        now: Time,
        txn: TxnId,
        ts: Timestamp,
        _epoch: u64,
        proc: ProcId,
        args: &Args,
    ) -> Result<(Vec<PieceRun>, Option<Timestamp>), ExecFailure> {
        core.undecided(txn)?;
        let procedure = core.procedure(proc)?;
        let run =
            exec::run_plan(procedure.as_ref(), core.placement(), args, &Below(&core.store, ts))
                .map_err(ExecFailure::Procedure)?;
        if run.user_abort.is_some() {
            core.remember(txn, Decision::Aborted, Vec::new(), now);
            return Ok((run.runs, None));
        }
        let prepare = PrepareArgs {
            reads: reads_of(&run.runs),
            scans: run.runs.iter().flat_map(|r| r.scans.iter().cloned()).collect(),
            writes: run.writes.into_iter().map(|(key, value)| Write { key, value }).collect(),
            one_phase: true,
            participants: vec![core.shard],
            ts,
            epoch: 0,
        };
        match self.prepare(core, now, txn, prepare) {
            Vote::Committed(ts) => Ok((run.runs, Some(ts))),
            Vote::No(conflict) => Err(ExecFailure::Conflict(conflict)),
            other => unreachable!("a one-phase prepare of an unseen attempt voted {other:?}"),
        }
    }

    /// The watermark moves in log order instead (`before_apply`).
    fn gc(&mut self, _core: &mut Core, _now: Time) {}

    fn counters(&self, counters: &mut Vec<(&'static str, u64)>) {
        counters.extend([
            ("mvto_read_stamps", self.stamps.len() as u64),
            ("mvto_read_stamps_evicted_total", self.stamps.evicted_total()),
            ("mvto_prepares_waiting", self.waiting.len() as u64),
            ("mvto_prepare_waits_total", self.waits_total),
            ("mvto_prepare_waits_expired_total", self.waits_expired_total),
            ("mvto_cascading_aborts_total", self.cascaded_total),
            ("mvto_too_old_total", self.too_old_total),
        ]);
    }

    /// The read stamps.
    fn image(&self) -> Vec<u8> {
        postcard::to_allocvec(&self.stamps.image()).expect("images encode")
    }

    fn check_image(&self, bytes: &[u8]) -> Result<(), String> {
        let stamps: StampsImage = postcard::from_bytes(bytes)
            .map_err(|e| format!("read stamps in a snapshot do not decode: {e}"))?;
        ReadStamps::check_image(&stamps, self.stamps.capacity())
    }

    fn install_image(&mut self, _core: &mut Core, bytes: &[u8], watermark: Timestamp) {
        let stamps: StampsImage = postcard::from_bytes(bytes).expect("checked at decode");
        self.stamps.install(stamps, watermark);
        self.clear_leader_state();
    }
}

impl TimestampOrder {
    /// Runs `calls` at `ts`; with read stamps at execution, stamps the reads as hints.
    #[allow(clippy::too_many_arguments)] // the request's fields
    fn execute(
        &mut self,
        core: &Core,
        txn: TxnId,
        ts: Timestamp,
        proc: ProcId,
        args: &Args,
        calls: &[PieceCall],
        overlay: Vec<Write>,
    ) -> Result<Vec<PieceRun>, ExecFailure> {
        core.undecided(txn)?;
        let watermark = core.store.gc_watermark();
        if ts <= watermark {
            self.too_old_total += 1;
            return Err(ExecFailure::Conflict(Conflict::TooOld(watermark)));
        }
        let procedure = core.procedure(proc)?;
        let overlay = overlay.into_iter().map(|w| (w.key, w.value)).collect();
        let source = Below(&core.store, ts);
        let runs =
            exec::run_calls(procedure.as_ref(), core.placement(), args, calls, &source, overlay)
                .map_err(ExecFailure::Procedure)?;
        if let Some(soft) = self.soft.as_mut() {
            for run in &runs {
                for (key, _) in &run.reads {
                    soft.note(key, ts);
                }
            }
        }
        Ok(runs)
    }
}
