//! `2pl`'s concurrency control in the two-phase commit engine: execution locks at the shard
//! leader (the rules are in the module documentation of `crate::twopl`). Pieces run only
//! under their locks, a prepare is logged as refused when the attempt no longer holds them,
//! and every decision releases them. Prepare still validates and locks like `occ`'s, so the
//! replicated state never depends on the leader-only locks.

use super::locking::{Doom, Locking, Need, Released, Step};
use crate::engine::participant::{Concurrency, Core, Rules};
use crate::engine::{Conflict, ExecFailure, OccMsg, PrepareArgs, ShardRequest};
use crate::kit::exec::{self, Latest, PieceCall};
use crate::kit::locks::{Mode, Policy};
use meridian_core::key::Key;
use meridian_core::node::Outbox;
use meridian_core::txn::{Args, ProcError, ProcId, ScanRange, PIECES_MAX};
use meridian_core::{NodeId, Time, TxnId};
use std::collections::BTreeMap;

/// Execution locks of an attempt that has not prepared and has been idle this many RPC
/// timeouts are released: its coordinator has moved on or is gone. Longer than the
/// coordinator's own execution timeout, so a live coordinator gives up first.
const LEASE_TIMEOUTS: u64 = 4;
/// Executions one release may resume or refuse (each needs at least one waiter, and waiters
/// are bounded by the executions the leader accepted); a bound on the loop, not a limit hit in
/// practice.
const RELEASED_PER_CALL_MAX: usize = 1 << 20;

/// The leader's execution locks (leader-only: a new term starts without any, and attempts
/// that held some fail to prepare and retry).
pub(crate) struct ExecutionLocks {
    locking: Locking<ShardRequest>,
}

impl ExecutionLocks {
    /// Execution locks under the conflict `policy`.
    pub(crate) fn new(policy: Policy) -> Self {
        Self { locking: Locking::new(policy) }
    }

    /// Attempts holding execution locks plus keys locked.
    #[cfg(test)]
    pub(crate) fn held(&self) -> u64 {
        let (holders, _, keys) = self.locking.gauges();
        holders + keys
    }

    /// Runs the executions whose locks are now held and answers the refused ones. A run that
    /// meets a lock of a prepared attempt this leader never locked for (one a previous leader
    /// admitted) is refused, which may release more.
    fn answer_released(
        &mut self,
        core: &Core,
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
            let mut result = core.on_execute(txn, proc, &args, &calls, overlay);
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
                if core.locks.check_all(txn, reads, &scans, writes).is_err() {
                    self.locking.deny(txn, now, &mut released);
                    result = Err(ExecFailure::Conflict(Conflict::Locked));
                }
            }
            out.send(origin, OccMsg::Executed { txn, shard, result });
        }
    }
}

/// The vote or failure a doomed attempt gets.
fn conflict_of(doom: Doom) -> Conflict {
    match doom {
        Doom::Denied => Conflict::Locked,
        Doom::Wounded => Conflict::Wounded,
        Doom::Expired => Conflict::LeaseExpired,
    }
}

/// The locks an execution needs, strongest mode per key, keys in order (then ranges):
/// computed from the pieces' declared keys, checked like execution checks them.
fn needs_of(
    core: &Core,
    proc: ProcId,
    args: &Args,
    calls: &[PieceCall],
) -> Result<Vec<Need>, ExecFailure> {
    let procedure = core.procedure(proc)?;
    if calls.len() > PIECES_MAX {
        let why = format!("{} pieces is over {PIECES_MAX}", calls.len());
        return Err(ExecFailure::Procedure(ProcError::Contract(why)));
    }
    let mut keys: BTreeMap<Key, Mode> = BTreeMap::new();
    let mut ranges = Vec::new();
    for call in calls {
        let inputs: Vec<&meridian_core::txn::PieceOutput> = call.inputs.iter().collect();
        let set = procedure.keys(call.piece, args, &inputs).map_err(ExecFailure::Procedure)?;
        exec::check_keys(core.placement(), &set).map_err(ExecFailure::Procedure)?;
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

impl Concurrency for ExecutionLocks {
    fn rules(&self) -> Rules {
        Rules::default()
    }

    /// Takes the execution's locks (or waits, or is refused), then runs it.
    fn serve_execute(
        &mut self,
        core: &mut Core,
        now: Time,
        origin: NodeId,
        request: ShardRequest,
        out: &mut Outbox<OccMsg>,
    ) {
        let ShardRequest::Execute { txn, shard, priority, proc, ref args, ref calls, .. } = request
        else {
            return;
        };
        let refusal = core.undecided(txn).err().or_else(|| {
            let doom = self.locking.doom_of(txn);
            doom.map(|d| ExecFailure::Conflict(conflict_of(d)))
        });
        let needs = match refusal.map_or_else(|| needs_of(core, proc, args, calls), Err) {
            Ok(needs) => needs,
            Err(failure) => {
                out.send(origin, OccMsg::Executed { txn, shard, result: Err(failure) });
                return;
            }
        };
        if self.locking.is_waiting(txn) {
            // A duplicate of the execution waiting here, which answers when it runs.
            return;
        }
        if !self.locking.holds(txn)
            && self.locking.holder_count() >= core.context.limits.lock_holders_max
        {
            let result = Err(ExecFailure::Conflict(Conflict::Full));
            out.send(origin, OccMsg::Executed { txn, shard, result });
            return;
        }
        let mut released = Released::new();
        match self.locking.execute(txn, priority, origin, request, needs, now, &mut released) {
            Step::Run(run) => released.ready.insert(0, run),
            Step::Parked => {}
            Step::Denied => {
                let result = Err(ExecFailure::Conflict(Conflict::Locked));
                out.send(origin, OccMsg::Executed { txn, shard, result });
            }
        }
        self.answer_released(core, now, released, out);
    }

    /// Takes a one-round commit's locks before it is proposed, from a run of the plan over the
    /// current state (what the logged run will read and write, since the locks keep it
    /// unchanged). `None` also when there is nothing to lock against (no log, so it applies
    /// at once, and no execution locks), or when the attempt is known here already (the
    /// logged command answers a duplicate).
    fn admit_one_round(
        &mut self,
        core: &mut Core,
        now: Time,
        txn: TxnId,
        proc: ProcId,
        args: &Args,
        has_log: bool,
    ) -> Option<Conflict> {
        let locking = &mut self.locking;
        if !locking.holds(txn) && locking.holder_count() >= core.context.limits.lock_holders_max {
            return Some(Conflict::Full);
        }
        if (!has_log && locking.is_idle()) || locking.holds(txn) || !core.is_new(txn) {
            return None;
        }
        let procedure = core.procedure(proc).ok()?;
        // A failing plan needs no locks: the logged command reports the failure.
        let run = exec::run_plan(procedure.as_ref(), core.placement(), args, &Latest(&core.store))
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
        (!locking.lock_now(txn, &needs, now)).then_some(Conflict::Locked)
    }

    /// Refused when the attempt no longer holds the execution locks of what it read and
    /// writes here. Attempts prepared or decided here go to the log as they are (the log
    /// answers duplicates).
    fn may_prepare(&mut self, core: &mut Core, txn: TxnId, args: &PrepareArgs) -> Option<Conflict> {
        if !core.is_new(txn) {
            return None;
        }
        if let Some(doom) = self.locking.doom_of(txn) {
            return Some(conflict_of(doom));
        }
        let reads = args.reads.iter().map(|(k, _)| k);
        let writes = args.writes.iter().map(|w| &w.key);
        (!self.locking.start_prepare(txn, reads, writes)).then_some(Conflict::Locked)
    }

    /// The attempt's execution locks go, and the executions waiting for them run (or are
    /// refused) now.
    fn release(&mut self, core: &mut Core, now: Time, txn: TxnId, out: &mut Outbox<OccMsg>) {
        let mut released = Released::new();
        self.locking.release(txn, now, &mut released);
        self.answer_released(core, now, released, out);
    }

    /// If the attempt has not started to prepare here, its execution locks go at once (the
    /// abort's log entry records the refusal).
    fn abandon(&mut self, core: &mut Core, now: Time, txn: TxnId, out: &mut Outbox<OccMsg>) {
        let mut released = Released::new();
        self.locking.abandon(txn, now, &mut released);
        self.answer_released(core, now, released, out);
    }

    /// Leases run out.
    fn leader_tick(&mut self, core: &mut Core, now: Time, out: &mut Outbox<OccMsg>) {
        let rpc_ns = core.context.timing.rpc_timeout_ns;
        let mut released = Released::new();
        self.locking.expire(now, LEASE_TIMEOUTS * rpc_ns, &mut released);
        self.answer_released(core, now, released, out);
    }

    fn on_leadership(&mut self, _core: &mut Core, _leads: bool) {
        self.locking.clear();
    }

    fn install_image(
        &mut self,
        _core: &mut Core,
        _bytes: &[u8],
        _watermark: meridian_core::Timestamp,
    ) {
        self.locking.clear();
    }

    fn counters(&self, counters: &mut Vec<(&'static str, u64)>) {
        let l = &self.locking;
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
}
