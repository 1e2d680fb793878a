//! The `occ` coordinator: runs each client request as a sequence of attempts.
//!
//! Per attempt the phases are `Executing` (waves of pieces) → `Preparing` → decided; or, for a
//! single-shard plan, `ExecuteCommit`; or, for a single prepare participant, `SinglePrepare`. A
//! one-round commit whose answer is lost moves to `Resolving`, where the coordinator asks the
//! participant with `Abort` until it learns whether the attempt committed.
//!
//! A participant may answer that it decided an attempt and has forgotten it since (see
//! `kit::twopc`). During execution that means the attempt can be retried (nothing was
//! prepared for it). For a one-round or one-phase commit the outcome is then unknown, and the
//! client is told so (`Indeterminate`) rather than risk committing twice. During prepare the
//! coordinator asks every participant until one knows the decision (a prepared participant
//! decides with its peers) or all have forgotten it (unknown).
//!
//! Under `mako` a decided commit is not answered at once: it is *parked* until the node's view
//! of the watermarks says it is durable (answered, with its speculative latency) or discarded
//! by a failover (its request retried); see `crate::mako`.
//!
//! Invariants (asserted):
//! - a request has at most one running attempt, and a running attempt's request is in flight;
//! - the client is answered exactly once per request (the request leaves the table then);
//! - a commit is decided only with a yes vote from every participant.

use super::speculation::{Durability, Verdict};
use super::{Conflict, ExecFailure, OccMsg, PrepareArgs, ShardRequest, Style, TimerPurpose, Vote};
use crate::kit::coord::{self, AttemptIds, LeaderCache, PieceSlot, RequestTable, TS_AHEAD_MAX_NS};
use crate::kit::exec::{PieceRun, ScanCheck, VersionTag};
use crate::kit::timers::Timers;
use crate::kit::twopc::{Decision, Delivery, PeerState};
use crate::NodeContext;
use meridian_core::key::{Key, Value};
use meridian_core::node::{ClientRequest, Outbox};
use meridian_core::rng::{child_rng, Rng};
use meridian_core::txn::{
    AbortCause, CommitPath, ProcError, TxnFailure, TxnOutcome, TxnResult, Write,
};
use meridian_core::{NodeId, RequestId, ShardId, Time, Timestamp, TxnId};
use std::collections::{BTreeMap, BTreeSet};

mod session;

/// Where an attempt stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Executing,
    ExecuteCommit(ShardId),
    Preparing,
    SinglePrepare(ShardId),
    Resolving(ShardId),
}

/// A running attempt.
struct Attempt {
    request: RequestId,
    pieces: Vec<PieceSlot>,
    reads: BTreeMap<ShardId, BTreeMap<Key, Option<VersionTag>>>,
    scans: BTreeMap<ShardId, Vec<ScanCheck>>,
    writes: BTreeMap<ShardId, BTreeMap<Key, Option<Value>>>,
    phase: Phase,
    /// When the current phase times out (checked by the coordinator tick).
    deadline: Time,
    waiting: BTreeSet<ShardId>,
    ts_max: Timestamp,
    /// While preparing, after a participant said it forgot the attempt: this round's answers
    /// from every participant.
    probing: Option<BTreeMap<ShardId, PeerState>>,
    /// `2pl`: shards that ran pieces for it, which may hold execution locks for it until they
    /// hear a decision (empty under `occ`).
    locked_at: BTreeSet<ShardId>,
    /// `2pc-mvto`: its timestamp (zero under the other protocols).
    ts: Timestamp,
    /// The interactive transaction it runs, if any (its steps come from the client; it is
    /// never retried).
    session: Option<meridian_core::node::SessionId>,
    /// `mako`: the epoch it runs in (zero under the other protocols).
    epoch: u64,
}

impl Attempt {
    /// The shards that prepare it: those it read, scanned or writes, and under `2pl` every
    /// shard holding its execution locks (prepare and the decision release them).
    fn participants(&self) -> BTreeSet<ShardId> {
        let reads = self.reads.iter().filter(|(_, r)| !r.is_empty()).map(|(&s, _)| s);
        let scans = self.scans.iter().filter(|(_, r)| !r.is_empty()).map(|(&s, _)| s);
        let writes = self.writes.iter().filter(|(_, w)| !w.is_empty()).map(|(&s, _)| s);
        reads.chain(scans).chain(writes).chain(self.locked_at.iter().copied()).collect()
    }

    /// The attempt's buffered writes on `shard`, in key order.
    fn writes_on(&self, shard: ShardId) -> Vec<Write> {
        self.writes.get(&shard).map_or_else(Vec::new, |w| {
            w.iter().map(|(key, value)| Write { key: key.clone(), value: value.clone() }).collect()
        })
    }
}

/// How an attempt ended, for the client.
struct Ending {
    result: TxnResult,
    commit_ts: Option<Timestamp>,
    path: CommitPath,
}

impl Ending {
    fn committed(ts: Option<Timestamp>, path: CommitPath) -> Self {
        Self { result: TxnResult::Committed, commit_ts: ts, path }
    }

    fn failed(failure: TxnFailure) -> Self {
        Self { result: TxnResult::Failed(failure), commit_ts: None, path: CommitPath::None }
    }

    fn indeterminate(txn: TxnId, shard: ShardId) -> Self {
        Self::failed(TxnFailure::Indeterminate(format!(
            "shard {} decided {txn} and has forgotten it since",
            shard.0
        )))
    }
}

/// `mako`: a commit decided speculatively, waiting to become durable before the client hears.
struct Parked {
    request: RequestId,
    epoch: u64,
    ts: Timestamp,
    path: CommitPath,
    outputs: Vec<meridian_core::txn::PieceOutput>,
    shards_touched: u32,
    decided_at: Time,
    /// Wide-area legs on the causal chain that decided it (measurement only).
    decided_chain: u16,
}

/// The coordinator of one node.
pub(super) struct Coordinator {
    context: NodeContext,
    rng: Rng,
    ids: AttemptIds,
    leaders: LeaderCache,
    home_shard: ShardId,
    requests: RequestTable,
    attempts: BTreeMap<TxnId, Attempt>,
    delivery: Delivery,
    /// New requests waiting for deliveries to drop below their bound, oldest first.
    held: std::collections::VecDeque<RequestId>,
    /// Single-shard plans execute and commit in one round (`occ-one-round`).
    one_round: bool,
    /// `2pl`: participants lock at execution; executions carry the request's age, and an
    /// attempt that ends before prepare tells the shards that ran its pieces.
    locking: bool,
    /// `2pc-mvto`: attempts carry timestamps, each above `ts_floor`: the last one given, and
    /// the newest version or stamp seen or refused for. `ts_offset_ns` is added to the clock:
    /// how far behind the shards' clocks a refusal showed this one to be (a clock that lags
    /// more than the GC retention would otherwise be refused below the watermark for ever).
    mvto: bool,
    ts_floor: Timestamp,
    ts_offset_ns: u64,
    /// Open interactive transactions.
    sessions: session::Sessions,
    /// `mako`: commits are reported once durable; attempts run in `epoch`, the newest this
    /// node knows; `parked` holds the commits waiting to become durable (bounded by the
    /// requests in flight: one attempt per request).
    speculative: bool,
    epoch: u64,
    parked: BTreeMap<TxnId, Parked>,
    discarded_total: u64,
    /// The clock of the call being handled (when a parked commit was decided).
    now: Time,
    /// Requests answered committed, attempts retried, outcomes reported unknown.
    committed_total: u64,
    retried_total: u64,
    indeterminate_total: u64,
}

impl Coordinator {
    /// A coordinator running attempts in `style`; `speculative`: its protocol's leaders commit
    /// speculatively (commits are answered once durable, attempts run in epochs).
    pub(super) fn new(context: NodeContext, style: Style, speculative: bool) -> Self {
        let leaders = LeaderCache::new(context.topology.clone());
        let home_shard = leaders.home_shard(context.id);
        let rng = child_rng(context.seed, "occ-coordinator", u64::from(context.id.0));
        Self {
            rng,
            ids: AttemptIds::new(context.id, context.incarnation),
            leaders,
            home_shard,
            requests: RequestTable::new(context.limits.requests_in_flight_max),
            attempts: BTreeMap::new(),
            delivery: Delivery::new(context.limits.deliveries_max),
            held: std::collections::VecDeque::new(),
            one_round: context.options.choice(style.one_round.0, style.one_round.1) == "on",
            locking: style.locks_at_execution,
            mvto: style.timestamps,
            ts_floor: Timestamp::ZERO,
            ts_offset_ns: 0,
            sessions: session::Sessions::new(context.limits.requests_in_flight_max),
            speculative,
            epoch: 0,
            parked: BTreeMap::new(),
            discarded_total: 0,
            now: 0,
            committed_total: 0,
            retried_total: 0,
            indeterminate_total: 0,
            context,
        }
    }

    /// Counters and gauges for metrics.
    pub(super) fn counters(&self) -> [(&'static str, u64); 9] {
        [
            ("mako_coordinator_parked", self.parked.len() as u64),
            ("mako_coordinator_discarded_total", self.discarded_total),
            ("occ_coordinator_sessions", self.sessions.len() as u64),
            ("occ_coordinator_requests", self.requests.len() as u64),
            ("occ_coordinator_attempts", self.attempts.len() as u64),
            ("occ_coordinator_delivering", self.delivery.len() as u64),
            ("occ_coordinator_committed_total", self.committed_total),
            ("occ_coordinator_retried_total", self.retried_total),
            ("occ_coordinator_indeterminate_total", self.indeterminate_total),
        ]
    }

    /// Interval of the coordinator tick: a quarter of the RPC timeout, so a phase times out at
    /// most a quarter late.
    pub(super) fn tick_ns(&self) -> u64 {
        (self.context.timing.rpc_timeout_ns / 4).max(meridian_core::time::NS_PER_MS)
    }

    #[cfg(test)]
    pub(super) fn set_registry(&mut self, registry: std::sync::Arc<meridian_core::txn::Registry>) {
        self.context.registry = registry;
    }

    /// True when no request, attempt or decision delivery is in progress.
    #[cfg(test)]
    pub(super) fn is_idle(&self) -> bool {
        self.requests.is_empty() && self.attempts.is_empty() && self.delivery.is_empty()
    }

    #[cfg(test)]
    pub(super) fn debug_state(&self) -> String {
        let attempts: Vec<String> = self
            .attempts
            .iter()
            .map(|(t, a)| format!("{t}:{:?} waiting {:?}", a.phase, a.waiting))
            .collect();
        let requests: Vec<String> = self
            .requests
            .iter()
            .map(|(r, s)| format!("{}:{:?}/{}", r.0, s.attempt, s.retries))
            .collect();
        format!(
            "requests {requests:?}\n attempts {attempts:?}\n delivering {}",
            self.delivery.len()
        )
    }

    fn send(&self, shard: ShardId, request: ShardRequest, out: &mut Outbox<OccMsg>) {
        out.send(self.leaders.leader(shard), OccMsg::Request(request));
    }

    /// `node` answered for `shard`: it leads the shard (only leaders answer).
    pub(super) fn note_leader(&mut self, shard: ShardId, node: NodeId) {
        self.leaders.note(shard, node);
    }

    pub(super) fn submit(&mut self, now: Time, request: ClientRequest, out: &mut Outbox<OccMsg>) {
        self.now = now;
        let Some(id) = self.requests.admit(now, request, None, out) else { return };
        if self.delivery.is_full() {
            // Decisions in delivery are at their bound: new requests wait (bounded by the
            // requests in flight) until deliveries complete, rather than being turned away.
            self.held.push_back(id);
        } else {
            self.start_attempt(now, id, out);
        }
    }

    /// Starts the requests held back while deliveries were at their bound, as room allows.
    fn start_held(&mut self, now: Time, out: &mut Outbox<OccMsg>) {
        while !self.delivery.is_full() {
            let Some(id) = self.held.pop_front() else { return };
            if self.requests.get(id).is_some_and(|r| r.attempt.is_none()) {
                self.start_attempt(now, id, out);
            }
        }
    }

    /// Plans the request and sends the first messages of a new attempt.
    fn start_attempt(&mut self, now: Time, request: RequestId, out: &mut Outbox<OccMsg>) {
        let state = self.requests.get(request).expect("request in flight");
        let (proc, args) = (state.client.txn.proc, state.client.txn.args.clone());
        let pieces = match coord::bind_plan(&self.context, &state.client.txn, self.home_shard) {
            Ok(pieces) => pieces,
            Err(error) => {
                return self.complete(
                    request,
                    None,
                    Ending::failed(TxnFailure::Procedure(error)),
                    out,
                )
            }
        };
        let txn = self.ids.next_id();
        let ts = self.next_ts(now);
        let state = self.requests.get_mut(request).expect("request in flight");
        assert!(state.attempt.is_none(), "a request runs one attempt at a time");
        state.attempt = Some(txn);
        let single_shard = coord::single_shard(&pieces);
        let mut attempt = Attempt {
            request,
            pieces,
            reads: BTreeMap::new(),
            scans: BTreeMap::new(),
            writes: BTreeMap::new(),
            phase: Phase::Executing,
            deadline: now + self.context.timing.rpc_timeout_ns,
            waiting: BTreeSet::new(),
            ts_max: Timestamp::ZERO,
            probing: None,
            locked_at: BTreeSet::new(),
            ts,
            session: None,
            epoch: self.epoch,
        };
        if attempt.pieces.is_empty() {
            return self.complete(request, None, Ending::committed(None, CommitPath::Empty), out);
        }
        match single_shard {
            Some(shard) if self.one_round => {
                attempt.phase = Phase::ExecuteCommit(shard);
                let epoch = attempt.epoch;
                let request = ShardRequest::ExecuteCommit { txn, shard, ts, epoch, proc, args };
                self.send(shard, request, out);
            }
            _ => self.dispatch(txn, &mut attempt, out),
        }
        self.attempts.insert(txn, attempt);
    }

    /// A new attempt's timestamp under `2pc-mvto` (zero under the other protocols): above
    /// every one given before and every version seen or refused for.
    fn next_ts(&mut self, now: Time) -> Timestamp {
        if !self.mvto {
            return Timestamp::ZERO;
        }
        let clock = now.saturating_add(self.ts_offset_ns);
        self.ts_floor = crate::kit::coord::attempt_ts(clock, self.ts_floor, self.context.id);
        self.ts_floor
    }

    /// Sends every piece that is ready to a shard not already working for this attempt.
    fn dispatch(&mut self, txn: TxnId, attempt: &mut Attempt, out: &mut Outbox<OccMsg>) {
        let state = self.requests.get(attempt.request).expect("request in flight");
        let txn_request = &state.client.txn;
        let priority = if self.locking { state.submitted_at } else { 0 };
        let wave = coord::next_wave(&mut attempt.pieces, &attempt.waiting);
        for (shard, calls) in wave {
            let overlay = attempt.writes_on(shard);
            attempt.waiting.insert(shard);
            if self.locking {
                attempt.locked_at.insert(shard);
            }
            let request = ShardRequest::Execute {
                txn,
                shard,
                priority,
                ts: attempt.ts,
                proc: txn_request.proc,
                args: txn_request.args.clone(),
                calls,
                overlay,
            };
            out.send(self.leaders.leader(shard), OccMsg::Request(request));
        }
        assert!(!attempt.waiting.is_empty(), "an unfinished plan always has a piece in progress");
    }

    pub(super) fn on_reply(
        &mut self,
        now: Time,
        from: NodeId,
        msg: OccMsg,
        timers: &mut Timers<TimerPurpose>,
        out: &mut Outbox<OccMsg>,
    ) {
        self.now = now;
        match msg {
            OccMsg::Executed { txn, shard, result } => {
                self.note_leader(shard, from);
                self.on_executed(now, txn, shard, result, timers, out)
            }
            OccMsg::ExecutedCommit { txn, shard, result } => {
                self.note_leader(shard, from);
                self.on_executed_commit(now, txn, shard, result, timers, out)
            }
            OccMsg::Prepared { txn, shard, vote } => {
                self.note_leader(shard, from);
                self.on_prepared(now, txn, shard, vote, timers, out)
            }
            OccMsg::Finished { txn, shard, state } => {
                self.note_leader(shard, from);
                self.on_finished(now, txn, shard, state, timers, out)
            }
            _ => {}
        }
    }

    fn on_executed(
        &mut self,
        now: Time,
        txn: TxnId,
        shard: ShardId,
        result: Result<Vec<PieceRun>, ExecFailure>,
        timers: &mut Timers<TimerPurpose>,
        out: &mut Outbox<OccMsg>,
    ) {
        let Some(mut attempt) = self.attempts.remove(&txn) else { return };
        if attempt.session.is_some() {
            return self.on_session_executed(now, txn, attempt, shard, result, out);
        }
        // A reply answers the wave now outstanding on its shard only if it carries a run for
        // every piece of that wave: a duplicated reply of an earlier wave does not. (Swarm seed
        // 18 hit this through a reused attempt id; the unit test
        // `a_duplicated_reply_of_an_earlier_wave_is_not_taken_for_the_next_wave` pins it.)
        let answers_wave = match &result {
            Ok(runs) => {
                let ran: Vec<u32> = runs.iter().map(|r| r.piece).collect();
                coord::answers_wave(&attempt.pieces, shard, &ran)
            }
            Err(_) => true,
        };
        if attempt.phase != Phase::Executing || !answers_wave || !attempt.waiting.remove(&shard) {
            self.attempts.insert(txn, attempt); // Late or duplicate.
            return;
        }
        let runs = match result {
            Ok(runs) => runs,
            Err(ExecFailure::Procedure(error)) => {
                let ending = Ending::failed(TxnFailure::Procedure(error));
                self.release_locks(txn, &attempt, out);
                return self.complete(attempt.request, Some((txn, &attempt)), ending, out);
            }
            // Nothing was prepared for this attempt, so nothing can have committed it.
            Err(ExecFailure::Conflict(conflict)) => {
                self.release_locks(txn, &attempt, out);
                let cause = self.note_conflict(conflict, now);
                return self.retry(attempt, cause, timers, out);
            }
            Err(ExecFailure::Decided(_) | ExecFailure::Forgotten) => {
                self.release_locks(txn, &attempt, out);
                return self.retry(attempt, AbortCause::AlreadyAborted, timers, out);
            }
        };
        for run in runs {
            let Some(slot) = attempt.pieces.get(run.piece as usize) else {
                continue;
            };
            if slot.shard != shard || !slot.sent || slot.output.is_some() {
                continue;
            }
            if let Some(newest) = run.reads.iter().filter_map(|(_, seen)| *seen).map(|v| v.ts).max()
            {
                if self.mvto && newest.0 <= now.saturating_add(TS_AHEAD_MAX_NS) {
                    self.ts_floor = self.ts_floor.max(newest);
                }
            }
            let reads = attempt.reads.entry(shard).or_default();
            for (key, seen) in run.reads {
                if *reads.entry(key).or_insert(seen) != seen {
                    // Two pieces saw different versions of one key: this attempt cannot commit.
                    self.release_locks(txn, &attempt, out);
                    return self.retry(attempt, AbortCause::Validation, timers, out);
                }
            }
            attempt.scans.entry(shard).or_default().extend(run.scans);
            match run.effects {
                Err(abort) => {
                    let ending = Ending {
                        result: TxnResult::UserAborted(abort.0),
                        commit_ts: None,
                        path: CommitPath::None,
                    };
                    self.release_locks(txn, &attempt, out);
                    return self.complete(attempt.request, Some((txn, &attempt)), ending, out);
                }
                Ok(effects) => {
                    let writes = attempt.writes.entry(shard).or_default();
                    for write in effects.writes {
                        writes.insert(write.key, write.value);
                    }
                    attempt.pieces[run.piece as usize].output = Some(effects.output);
                }
            }
        }
        if attempt.pieces.iter().all(|p| p.output.is_some()) {
            if attempt.participants().is_empty() {
                // Nothing read or written: nothing to validate or install.
                let ending = Ending::committed(None, CommitPath::Empty);
                return self.complete(attempt.request, Some((txn, &attempt)), ending, out);
            }
            self.begin_prepare(txn, &mut attempt, out);
        } else {
            self.dispatch(txn, &mut attempt, out);
        }
        attempt.deadline = now + self.context.timing.rpc_timeout_ns;
        self.attempts.insert(txn, attempt);
    }

    fn begin_prepare(&mut self, txn: TxnId, attempt: &mut Attempt, out: &mut Outbox<OccMsg>) {
        let participants = attempt.participants();
        assert!(!participants.is_empty(), "the caller commits attempts that touched nothing");
        let one_phase = participants.len() == 1;
        for &shard in &participants {
            let reads = attempt
                .reads
                .get(&shard)
                .map(|r| r.iter().map(|(k, v)| (k.clone(), *v)).collect())
                .unwrap_or_default();
            let scans = attempt.scans.get(&shard).cloned().unwrap_or_default();
            let writes = attempt.writes_on(shard);
            let args = PrepareArgs {
                reads,
                scans,
                writes,
                one_phase,
                participants: participants.iter().copied().collect(),
                ts: attempt.ts,
                epoch: attempt.epoch,
            };
            self.send(shard, ShardRequest::Prepare { txn, shard, args }, out);
        }
        attempt.phase = match participants.first() {
            Some(&shard) if one_phase => Phase::SinglePrepare(shard),
            _ => Phase::Preparing,
        };
        attempt.waiting = participants;
    }

    fn on_prepared(
        &mut self,
        now: Time,
        txn: TxnId,
        shard: ShardId,
        vote: Vote,
        timers: &mut Timers<TimerPurpose>,
        out: &mut Outbox<OccMsg>,
    ) {
        let Some(mut attempt) = self.attempts.remove(&txn) else { return };
        if attempt.phase == Phase::Preparing && !attempt.participants().contains(&shard) {
            self.attempts.insert(txn, attempt); // Not a participant's vote.
            return;
        }
        match (attempt.phase, vote) {
            (Phase::Preparing, Vote::Yes(ts)) if attempt.waiting.remove(&shard) => {
                attempt.ts_max = attempt.ts_max.max(ts);
                if attempt.waiting.is_empty() && attempt.probing.is_none() {
                    self.decide_commit(now, txn, attempt, out);
                } else {
                    self.attempts.insert(txn, attempt);
                }
            }
            (Phase::Preparing, Vote::No(Conflict::Invalid)) => {
                let error = ProcError::Contract(format!(
                    "shard {} refused the prepare as malformed",
                    shard.0
                ));
                self.abort_prepared(now, txn, &attempt, out);
                self.complete(
                    attempt.request,
                    Some((txn, &attempt)),
                    Ending::failed(TxnFailure::Procedure(error)),
                    out,
                );
            }
            // A refusal: that shard never prepared it, so aborting is safe.
            (Phase::Preparing, Vote::No(conflict)) => {
                self.abort_prepared(now, txn, &attempt, out);
                let cause = self.note_conflict(conflict, now);
                self.retry(attempt, cause, timers, out);
            }
            (Phase::Preparing, Vote::Forgotten) => {
                self.start_probing(now, txn, &mut attempt, out);
                self.attempts.insert(txn, attempt);
            }
            (Phase::Preparing, Vote::Committed(ts)) => {
                // Decided by the participants without us (termination): adopt it.
                self.adopt_commit(now, txn, attempt, ts, out);
            }
            (Phase::SinglePrepare(s) | Phase::Resolving(s), Vote::Committed(ts)) if s == shard => {
                let ending = Ending::committed(Some(ts), CommitPath::OnePhase);
                self.complete(attempt.request, Some((txn, &attempt)), ending, out);
            }
            (Phase::SinglePrepare(s), Vote::No(Conflict::Invalid)) if s == shard => {
                let error =
                    ProcError::Contract(format!("shard {} refused the prepare as malformed", s.0));
                self.complete(
                    attempt.request,
                    Some((txn, &attempt)),
                    Ending::failed(TxnFailure::Procedure(error)),
                    out,
                );
            }
            (Phase::SinglePrepare(s), Vote::No(conflict)) if s == shard => {
                let cause = self.note_conflict(conflict, now);
                self.retry(attempt, cause, timers, out)
            }
            (Phase::SinglePrepare(s) | Phase::Resolving(s), Vote::Forgotten) if s == shard => {
                self.indeterminate(txn, attempt, s, out)
            }
            _ => {
                self.attempts.insert(txn, attempt); // Late or duplicate.
            }
        }
    }

    /// A participant forgot a preparing attempt: ask every participant until one knows.
    fn start_probing(
        &mut self,
        now: Time,
        txn: TxnId,
        attempt: &mut Attempt,
        out: &mut Outbox<OccMsg>,
    ) {
        attempt.probing = Some(BTreeMap::new());
        for shard in attempt.participants() {
            self.send(shard, ShardRequest::Query { txn, shard }, out);
        }
        attempt.deadline = now + self.context.timing.rpc_timeout_ns;
    }

    fn decide_commit(&mut self, now: Time, txn: TxnId, attempt: Attempt, out: &mut Outbox<OccMsg>) {
        let ts = attempt.ts_max;
        assert!(ts > Timestamp::ZERO, "a commit decision has every participant's proposal");
        self.adopt_commit(now, txn, attempt, ts, out);
    }

    /// Delivers a commit at `ts` to every participant and answers the client.
    fn adopt_commit(
        &mut self,
        now: Time,
        txn: TxnId,
        attempt: Attempt,
        ts: Timestamp,
        out: &mut Outbox<OccMsg>,
    ) {
        let participants = attempt.participants();
        for &shard in &participants {
            self.send(shard, ShardRequest::Commit { txn, shard, ts }, out);
        }
        let interval = self.context.timing.rpc_timeout_ns;
        self.delivery.start(
            txn,
            Decision::Committed(ts),
            participants.into_iter().collect(),
            now,
            interval,
        );
        let ending = Ending::committed(Some(ts), CommitPath::TwoPhase);
        self.complete(attempt.request, Some((txn, &attempt)), ending, out);
    }

    /// `2pl`: an attempt that ends before prepare tells the shards that ran its pieces, so
    /// they release its execution locks now (a lost abort leaves them to the lease). Under
    /// `occ` there is nobody to tell.
    fn release_locks(&self, txn: TxnId, attempt: &Attempt, out: &mut Outbox<OccMsg>) {
        for &shard in &attempt.locked_at {
            self.send(shard, ShardRequest::Abort { txn, shard }, out);
        }
    }

    fn abort_prepared(
        &mut self,
        now: Time,
        txn: TxnId,
        attempt: &Attempt,
        out: &mut Outbox<OccMsg>,
    ) {
        let participants = attempt.participants();
        for &shard in &participants {
            self.send(shard, ShardRequest::Abort { txn, shard }, out);
        }
        let interval = self.context.timing.rpc_timeout_ns;
        self.delivery.start(
            txn,
            Decision::Aborted,
            participants.into_iter().collect(),
            now,
            interval,
        );
    }

    fn on_executed_commit(
        &mut self,
        now: Time,
        txn: TxnId,
        shard: ShardId,
        result: Result<(Vec<PieceRun>, Option<Timestamp>), ExecFailure>,
        timers: &mut Timers<TimerPurpose>,
        out: &mut Outbox<OccMsg>,
    ) {
        let Some(mut attempt) = self.attempts.remove(&txn) else { return };
        if !matches!(attempt.phase, Phase::ExecuteCommit(s) | Phase::Resolving(s) if s == shard) {
            self.attempts.insert(txn, attempt);
            return;
        }
        match result {
            Ok((runs, commit)) => {
                let mut user_abort = None;
                for run in runs {
                    match run.effects {
                        Ok(effects) => {
                            if let Some(slot) = attempt.pieces.get_mut(run.piece as usize) {
                                slot.output = Some(effects.output);
                            }
                        }
                        Err(abort) => user_abort = Some(abort.0),
                    }
                }
                match (commit, user_abort) {
                    (Some(ts), _) => {
                        let ending = Ending::committed(Some(ts), CommitPath::OneRound);
                        self.complete(attempt.request, Some((txn, &attempt)), ending, out);
                    }
                    (None, Some(why)) => {
                        let ending = Ending {
                            result: TxnResult::UserAborted(why),
                            commit_ts: None,
                            path: CommitPath::None,
                        };
                        self.complete(attempt.request, Some((txn, &attempt)), ending, out)
                    }
                    // Unreachable today: a run without a commit carries a user abort.
                    (None, None) => self.retry(attempt, AbortCause::AlreadyAborted, timers, out),
                }
            }
            Err(ExecFailure::Decided(Decision::Committed(ts))) => {
                let ending = Ending::committed(Some(ts), CommitPath::OneRound);
                self.complete(attempt.request, Some((txn, &attempt)), ending, out);
            }
            Err(ExecFailure::Procedure(error)) => {
                let ending = Ending::failed(TxnFailure::Procedure(error));
                self.complete(attempt.request, Some((txn, &attempt)), ending, out)
            }
            Err(ExecFailure::Forgotten) => self.indeterminate(txn, attempt, shard, out),
            Err(ExecFailure::Conflict(conflict)) => {
                let cause = self.note_conflict(conflict, now);
                self.retry(attempt, cause, timers, out)
            }
            Err(ExecFailure::Decided(Decision::Aborted)) => {
                self.retry(attempt, AbortCause::AlreadyAborted, timers, out)
            }
        }
    }

    fn on_finished(
        &mut self,
        _now: Time,
        txn: TxnId,
        shard: ShardId,
        state: PeerState,
        timers: &mut Timers<TimerPurpose>,
        out: &mut Outbox<OccMsg>,
    ) {
        if self.delivery.on_ack(txn, shard) {
            self.start_held(_now, out);
            return;
        }
        let Some(attempt) = self.attempts.remove(&txn) else {
            return;
        };
        match (attempt.phase, state) {
            // An abort sent to learn a lost one-round outcome: the participant decided it and
            // has forgotten which way. Retrying could commit it twice.
            (Phase::Resolving(s), PeerState::Forgotten) if s == shard => {
                self.indeterminate(txn, attempt, s, out)
            }
            (
                Phase::Resolving(s) | Phase::SinglePrepare(s) | Phase::ExecuteCommit(s),
                PeerState::Decided(Decision::Committed(ts)),
            ) if s == shard => {
                // The outputs of a one-round commit whose reply was lost are gone; the commit is not.
                let path = match attempt.phase {
                    Phase::SinglePrepare(_) => CommitPath::OnePhase,
                    _ => CommitPath::OneRound,
                };
                let ending = Ending::committed(Some(ts), path);
                self.complete(attempt.request, Some((txn, &attempt)), ending, out);
            }
            (Phase::Resolving(s), PeerState::Decided(Decision::Aborted)) if s == shard => {
                self.retry(attempt, AbortCause::AlreadyAborted, timers, out)
            }
            _ => {
                self.attempts.insert(txn, attempt);
            }
        }
    }

    pub(super) fn on_retry_timer(
        &mut self,
        now: Time,
        request: RequestId,
        out: &mut Outbox<OccMsg>,
    ) {
        self.now = now;
        if self.requests.get(request).is_some_and(|r| r.attempt.is_none()) {
            self.start_attempt(now, request, out);
        }
    }

    /// A participant's answer to `Query` for an attempt whose votes were missing (or that a
    /// participant forgot): prepared counts as a yes vote; refused means abort (safe: that
    /// shard will never prepare it); committed means the participants decided it without us.
    pub(super) fn on_state(
        &mut self,
        now: Time,
        txn: TxnId,
        shard: ShardId,
        state: PeerState,
        timers: &mut Timers<TimerPurpose>,
        out: &mut Outbox<OccMsg>,
    ) {
        self.now = now;
        let Some(mut attempt) = self.attempts.remove(&txn) else { return };
        if attempt.phase != Phase::Preparing {
            self.attempts.insert(txn, attempt);
            return;
        }
        let participants = attempt.participants();
        if let Some(answers) = attempt.probing.as_mut() {
            match state {
                PeerState::Decided(Decision::Committed(ts)) => {
                    return self.adopt_commit(now, txn, attempt, ts, out)
                }
                PeerState::Decided(Decision::Aborted) => {
                    self.abort_prepared(now, txn, &attempt, out);
                    return self.retry(attempt, AbortCause::AlreadyAborted, timers, out);
                }
                PeerState::Prepared(_) | PeerState::Forgotten => {
                    answers.insert(shard, state);
                }
            }
            let all_forgot =
                participants.iter().all(|s| matches!(answers.get(s), Some(PeerState::Forgotten)));
            if all_forgot {
                return self.indeterminate(txn, attempt, shard, out);
            }
            self.attempts.insert(txn, attempt);
            return;
        }
        if !attempt.waiting.contains(&shard) {
            self.attempts.insert(txn, attempt);
            return;
        }
        self.attempts.insert(txn, attempt);
        match state {
            PeerState::Prepared(ts) => {
                self.on_prepared(now, txn, shard, Vote::Yes(ts), timers, out)
            }
            PeerState::Decided(Decision::Aborted) => {
                self.on_prepared(now, txn, shard, Vote::No(Conflict::AlreadyAborted), timers, out)
            }
            PeerState::Decided(Decision::Committed(ts)) => {
                self.on_prepared(now, txn, shard, Vote::Committed(ts), timers, out)
            }
            PeerState::Forgotten => self.on_prepared(now, txn, shard, Vote::Forgotten, timers, out),
        }
    }

    /// The coordinator's periodic check: phases past their deadline time out, decisions not
    /// yet acknowledged go again, and settled commits are announced. One timer for all
    /// attempts keeps the timer table as small as the node's work.
    pub(super) fn on_tick(
        &mut self,
        now: Time,
        timers: &mut Timers<TimerPurpose>,
        out: &mut Outbox<OccMsg>,
    ) {
        self.now = now;
        let rpc_timeout_ns = self.context.timing.rpc_timeout_ns;
        let due: Vec<TxnId> =
            self.attempts.iter().filter(|(_, a)| a.deadline <= now).map(|(&t, _)| t).collect();
        for txn in due {
            let Some(mut attempt) = self.attempts.remove(&txn) else { continue };
            match attempt.phase {
                // A step of an interactive transaction took too long, or its client has been
                // idle past the lease: it ends, aborted.
                Phase::Executing if attempt.session.is_some() => {
                    self.on_session_step_timeout(now, txn, attempt, out);
                }
                // Execution keeps no state at participants (but execution locks under `2pl`,
                // released by an abort): start over.
                Phase::Executing => {
                    for &shard in &attempt.waiting {
                        self.leaders.suspect(shard);
                    }
                    self.release_locks(txn, &attempt, out);
                    self.retry(attempt, AbortCause::Timeout, timers, out)
                }
                Phase::Preparing if attempt.probing.is_some() => {
                    for shard in attempt.participants() {
                        self.leaders.suspect(shard);
                    }
                    self.start_probing(now, txn, &mut attempt, out);
                    self.attempts.insert(txn, attempt);
                }
                // Votes are missing. Aborting now could contradict participants that, all
                // prepared, commit on their own; instead ask the silent ones, which refuse the
                // attempt if they have not prepared it.
                Phase::Preparing => {
                    for &shard in &attempt.waiting {
                        self.leaders.suspect(shard);
                        self.send(shard, ShardRequest::Query { txn, shard }, out);
                    }
                    attempt.deadline = now + rpc_timeout_ns;
                    self.attempts.insert(txn, attempt);
                }
                // The outcome of a one-round commit is unknown: ask until it is known.
                Phase::ExecuteCommit(shard)
                | Phase::SinglePrepare(shard)
                | Phase::Resolving(shard) => {
                    attempt.phase = Phase::Resolving(shard);
                    attempt.deadline = now + rpc_timeout_ns;
                    self.leaders.suspect(shard);
                    self.send(shard, ShardRequest::Abort { txn, shard }, out);
                    self.attempts.insert(txn, attempt);
                }
            }
        }
        let resend = self.delivery.due(now, rpc_timeout_ns);
        let silent: BTreeSet<ShardId> = resend.iter().map(|(_, s, _)| *s).collect();
        for shard in silent {
            self.leaders.suspect(shard);
        }
        for (txn, shard, decision) in resend {
            self.send(shard, ShardRequest::decision(txn, shard, decision), out);
        }
        for (shard, txns) in self.delivery.take_settled() {
            self.send(shard, ShardRequest::Settle { shard, txns }, out);
        }
        self.start_held(now, out);
    }

    /// The outcome of `txn` cannot be known: tell the client so (never retry: it may have
    /// committed).
    fn indeterminate(
        &mut self,
        txn: TxnId,
        attempt: Attempt,
        shard: ShardId,
        out: &mut Outbox<OccMsg>,
    ) {
        self.indeterminate_total += 1;
        self.complete(
            attempt.request,
            Some((txn, &attempt)),
            Ending::indeterminate(txn, shard),
            out,
        );
    }

    /// Ends `attempt`, aborted for `cause`, without committing and schedules the next one
    /// after backoff.
    fn retry(
        &mut self,
        attempt: Attempt,
        cause: AbortCause,
        timers: &mut Timers<TimerPurpose>,
        out: &mut Outbox<OccMsg>,
    ) {
        if let Some(session) = attempt.session {
            // An interactive transaction is not retried: its client decides.
            self.retried_total += 1;
            return self.end_session(session, session::End::Aborted(cause), out);
        }
        self.retry_request(attempt.request, cause, timers, out);
    }

    /// Counts an abort of `request`'s attempt and schedules the next one after backoff (or
    /// gives up past the retry limit).
    fn retry_request(
        &mut self,
        request: RequestId,
        cause: AbortCause,
        timers: &mut Timers<TimerPurpose>,
        out: &mut Outbox<OccMsg>,
    ) {
        let Some(state) = self.requests.get_mut(request) else {
            return;
        };
        state.attempt = None;
        state.retries += 1;
        state.aborts.add(cause);
        self.retried_total += 1;
        // `mako`: attempts a failover refused or discarded are not the request's conflicts and
        // do not use up its attempts (an epoch stays closed while a shard has no leader).
        let failover =
            state.aborts.get(AbortCause::EpochChanged) + state.aborts.get(AbortCause::Discarded);
        if state.retries - failover >= self.context.timing.attempts_max {
            return self.complete(request, None, Ending::failed(TxnFailure::RetriesExhausted), out);
        }
        let timing = &self.context.timing;
        let retries = state.retries;
        let backoff =
            coord::backoff_ns(&mut self.rng, timing.backoff_ns_min, timing.backoff_ns_max, retries);
        timers.set(TimerPurpose::Retry { request }, backoff, out);
    }

    /// Answers the client and forgets the request.
    fn complete(
        &mut self,
        request: RequestId,
        attempt: Option<(TxnId, &Attempt)>,
        ending: Ending,
        out: &mut Outbox<OccMsg>,
    ) {
        if let Some((txn, Attempt { session: Some(session), .. })) = attempt {
            self.attempts.remove(&txn);
            return self.end_session(*session, session::End::Finished(ending), out);
        }
        if let Some((txn, _)) = attempt {
            self.attempts.remove(&txn);
        }
        let committed = ending.result == TxnResult::Committed;
        let (outputs, shards_touched) = match attempt {
            Some((_, a)) => (
                if committed { coord::outputs(&a.pieces) } else { Vec::new() },
                coord::shards_of(&a.pieces).len() as u32,
            ),
            None => (Vec::new(), 0),
        };
        if let (true, Some(ts), Some((txn, a))) = (self.speculative, ending.commit_ts, attempt) {
            if committed && self.requests.get(request).is_some() {
                // `mako`: speculative until every shard's watermark covers it.
                let parked = Parked {
                    request,
                    epoch: a.epoch,
                    ts,
                    path: ending.path,
                    outputs,
                    shards_touched,
                    decided_at: self.now,
                    decided_chain: out.chain(),
                };
                self.parked.insert(txn, parked);
                return;
            }
        }
        self.answer(request, ending, outputs, shards_touched, None, out);
    }

    /// Replies to `request` and forgets it; `speculative_at`: when a `mako` commit was
    /// decided, for its speculative latency, and the causal chain it was decided on.
    fn answer(
        &mut self,
        request: RequestId,
        ending: Ending,
        outputs: Vec<meridian_core::txn::PieceOutput>,
        shards_touched: u32,
        speculative_at: Option<(Time, u16)>,
        out: &mut Outbox<OccMsg>,
    ) {
        let Some(state) = self.requests.finish(request) else {
            return;
        };
        if ending.result == TxnResult::Committed {
            self.committed_total += 1;
        }
        let outcome = TxnOutcome {
            result: ending.result,
            outputs,
            commit_ts: ending.commit_ts,
            retries: state.retries,
            aborts: state.aborts,
            shards_touched,
            path: ending.path,
            speculative_ns: speculative_at.map(|(at, _)| at.saturating_sub(state.submitted_at)),
        };
        // A durable `mako` commit waited on both its decision and the reports.
        out.reply_after(request, outcome, speculative_at.map_or(0, |(_, chain)| chain));
    }

    /// `mako`: the watermarks moved. Parked commits now durable are answered (with their
    /// speculative latency), those a failover discarded are retried, and new attempts run in
    /// the newest epoch. `report_chain`: the causal chain of the report that moved them, when
    /// it is longer than this call's (one from this node).
    pub(super) fn on_watermarks(
        &mut self,
        now: Time,
        view: &dyn Durability,
        report_chain: u16,
        timers: &mut Timers<TimerPurpose>,
        out: &mut Outbox<OccMsg>,
    ) {
        self.now = now;
        self.epoch = view.epoch();
        let settled: Vec<(TxnId, Verdict)> = self
            .parked
            .iter()
            .map(|(&txn, p)| (txn, view.verdict(p.epoch, p.ts)))
            .filter(|(_, verdict)| *verdict != Verdict::Pending)
            .collect();
        for (txn, verdict) in settled {
            let parked = self.parked.remove(&txn).expect("listed above");
            match verdict {
                Verdict::Durable => self.answer(
                    parked.request,
                    Ending::committed(Some(parked.ts), parked.path),
                    parked.outputs,
                    parked.shards_touched,
                    Some((parked.decided_at, parked.decided_chain.max(report_chain))),
                    out,
                ),
                Verdict::Discarded => {
                    self.discarded_total += 1;
                    self.retry_request(parked.request, AbortCause::Discarded, timers, out);
                }
                Verdict::Forgotten => {
                    self.indeterminate_total += 1;
                    let why = format!(
                        "{txn} committed speculatively in epoch {}, whose stable point is no \
                         longer known here",
                        parked.epoch
                    );
                    let ending = Ending::failed(TxnFailure::Indeterminate(why));
                    let touched = parked.shards_touched;
                    self.answer(parked.request, ending, Vec::new(), touched, None, out);
                }
                Verdict::Pending => unreachable!("filtered above"),
            }
        }
    }
}

/// The cause a report counts for a participant's refusal.
impl Coordinator {
    /// The abort cause of a refusal; a timestamp refusal also raises the floor of the next
    /// attempt's timestamp above what refused it (a timestamp absurdly far ahead is not
    /// believed). A refusal beyond this clock `now` (more than timestamp rounding explains)
    /// shows the clock lags the shards': the offset then puts it ahead of what refused it by
    /// an RPC timeout, since a watermark keeps moving while the retry travels. Synchronized
    /// clocks never get an offset, so their timestamps stay in real-time order.
    fn note_conflict(&mut self, conflict: Conflict, now: Time) -> AbortCause {
        if let Conflict::TooOld(ts) = conflict {
            if ts.0 <= now.saturating_add(TS_AHEAD_MAX_NS) {
                self.ts_floor = self.ts_floor.max(ts);
                let rounding = 2 * crate::kit::coord::TS_NODE_SLOTS;
                if ts.0 > now.saturating_add(rounding) {
                    let ahead = ts.0 - now + self.context.timing.rpc_timeout_ns;
                    self.ts_offset_ns = self.ts_offset_ns.max(ahead);
                }
            }
        }
        cause_of(conflict)
    }
}

fn cause_of(conflict: Conflict) -> AbortCause {
    match conflict {
        Conflict::Stale => AbortCause::Validation,
        Conflict::Locked => AbortCause::LockDenied,
        Conflict::Wounded => AbortCause::Wounded,
        Conflict::LeaseExpired => AbortCause::LeaseExpired,
        Conflict::TooOld(_) => AbortCause::TimestampTooOld,
        Conflict::Cascading => AbortCause::Cascading,
        Conflict::AlreadyAborted => AbortCause::AlreadyAborted,
        Conflict::Full => AbortCause::Busy,
        // Answered before a retry is considered; counted for completeness.
        Conflict::Invalid => AbortCause::Validation,
        Conflict::Epoch => AbortCause::EpochChanged,
    }
}
