//! The `occ` coordinator: runs each client request as a sequence of attempts.
//!
//! Per attempt the phases are `Executing` (waves of pieces) → `Preparing` → decided; or, for a
//! single-shard plan, `ExecuteCommit`; or, for a single prepare participant, `SinglePrepare`. A
//! one-round commit whose answer is lost moves to `Resolving`, where the coordinator asks the
//! participant with `Abort` until it learns whether the attempt committed.
//!
//! Invariants (asserted):
//! - a request has at most one running attempt, and a running attempt's request is in flight;
//! - the client is answered exactly once per request (the request leaves `requests` then);
//! - a commit is decided only with a yes vote from every participant.

use super::{
    Conflict, Decision, ExecFailure, OccMsg, PeerState, PieceCall, PieceRun, ScanCheck,
    TimerPurpose, Timers, VersionTag, Vote, WriteBuffer,
};
use crate::NodeContext;
use meridian_core::key::Key;
use meridian_core::node::{ClientRequest, HistoryEvent, Outbox};
use meridian_core::rng::{child_rng, uniform_f64, Rng};
use meridian_core::txn::{
    PieceOutput, PlanContext, ProcError, ShardTarget, TxnFailure, TxnOutcome, TxnResult, Write,
    PIECES_MAX,
};
use meridian_core::{NodeId, RequestId, ShardId, Time, Timestamp, TxnId};
use std::collections::{BTreeMap, BTreeSet};

/// Where an attempt stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Executing,
    ExecuteCommit(ShardId),
    Preparing,
    SinglePrepare(ShardId),
    Resolving(ShardId),
}

/// A request the client is waiting on.
struct RequestState {
    client: ClientRequest,
    retries: u32,
    attempt: Option<TxnId>,
}

/// One piece of the attempt's plan, resolved to a shard.
struct PieceSlot {
    shard: ShardId,
    deps: Vec<u32>,
    sent: bool,
    output: Option<PieceOutput>,
}

/// A running attempt.
struct Attempt {
    request: RequestId,
    pieces: Vec<PieceSlot>,
    reads: BTreeMap<ShardId, BTreeMap<Key, Option<VersionTag>>>,
    scans: BTreeMap<ShardId, Vec<ScanCheck>>,
    writes: BTreeMap<ShardId, WriteBuffer>,
    phase: Phase,
    /// When the current phase times out (checked by the coordinator tick).
    deadline: Time,
    waiting: BTreeSet<ShardId>,
    ts_max: Timestamp,
}

impl Attempt {
    fn shards_touched(&self) -> u32 {
        self.pieces.iter().map(|p| p.shard).collect::<BTreeSet<_>>().len() as u32
    }

    fn participants(&self) -> BTreeSet<ShardId> {
        let reads = self.reads.iter().filter(|(_, r)| !r.is_empty()).map(|(&s, _)| s);
        let scans = self.scans.iter().filter(|(_, r)| !r.is_empty()).map(|(&s, _)| s);
        let writes = self.writes.iter().filter(|(_, w)| !w.is_empty()).map(|(&s, _)| s);
        reads.chain(scans).chain(writes).collect()
    }

    /// The attempt's buffered writes on `shard`, in key order.
    fn writes_on(&self, shard: ShardId) -> Vec<Write> {
        self.writes.get(&shard).map_or_else(Vec::new, |w| {
            w.iter().map(|(key, value)| Write { key: key.clone(), value: value.clone() }).collect()
        })
    }

    /// The pieces' outputs; empty when any is missing (a one-round commit whose reply was lost).
    fn outputs(&self) -> Vec<PieceOutput> {
        self.pieces.iter().map(|p| p.output.clone()).collect::<Option<_>>().unwrap_or_default()
    }
}

/// A decision still being delivered.
struct Finishing {
    decision: Decision,
    unacked: BTreeSet<ShardId>,
    /// When the decision goes again to the shards that have not acknowledged it.
    retransmit_at: Time,
}

/// The coordinator of one node.
pub(super) struct Coordinator {
    context: NodeContext,
    rng: Rng,
    seq_next: u64,
    leaders: Vec<NodeId>,
    home_shard: ShardId,
    requests: BTreeMap<RequestId, RequestState>,
    attempts: BTreeMap<TxnId, Attempt>,
    finishing: BTreeMap<TxnId, Finishing>,
    /// Requests answered committed, and attempts retried (for metrics).
    committed_total: u64,
    retried_total: u64,
}

impl Coordinator {
    pub(super) fn new(context: NodeContext) -> Self {
        let topology = &context.topology;
        let leaders: Vec<NodeId> = (0..topology.shards)
            .map(|s| {
                topology.replica_node(ShardId(s), 0).expect("validated topology hosts replica 0")
            })
            .collect();
        let region = topology.region_of(context.id);
        let home_shard = (0..topology.shards)
            .map(ShardId)
            .find(|&s| topology.region_of(leaders[s.0 as usize]) == region)
            .unwrap_or(ShardId(0));
        let rng = child_rng(context.seed, "occ-coordinator", u64::from(context.id.0));
        Self {
            context,
            rng,
            seq_next: 0,
            leaders,
            home_shard,
            requests: BTreeMap::new(),
            attempts: BTreeMap::new(),
            finishing: BTreeMap::new(),
            committed_total: 0,
            retried_total: 0,
        }
    }

    /// Counters and gauges for metrics.
    pub(super) fn counters(&self) -> [(&'static str, u64); 5] {
        [
            ("occ_coordinator_requests", self.requests.len() as u64),
            ("occ_coordinator_attempts", self.attempts.len() as u64),
            ("occ_coordinator_finishing", self.finishing.len() as u64),
            ("occ_coordinator_committed_total", self.committed_total),
            ("occ_coordinator_retried_total", self.retried_total),
        ]
    }

    /// Interval of the coordinator tick: a quarter of the RPC timeout, so a phase times out at
    /// most a quarter late.
    pub(super) fn tick_ns(&self) -> u64 {
        (self.context.timing.rpc_timeout_ns / 4).max(meridian_core::time::NS_PER_MS)
    }

    #[cfg(test)]
    pub(super) fn registry(&self) -> std::sync::Arc<meridian_core::txn::Registry> {
        self.context.registry.clone()
    }

    #[cfg(test)]
    pub(super) fn set_registry(&mut self, registry: std::sync::Arc<meridian_core::txn::Registry>) {
        self.context.registry = registry;
    }

    /// True when no request, attempt or decision delivery is in progress.
    #[cfg(test)]
    pub(super) fn is_idle(&self) -> bool {
        self.requests.is_empty() && self.attempts.is_empty() && self.finishing.is_empty()
    }

    #[cfg(test)]
    pub(super) fn debug_state(&self) -> String {
        let attempts: Vec<String> = self
            .attempts
            .iter()
            .map(|(t, a)| format!("{t}:{:?} waiting {:?}", a.phase, a.waiting))
            .collect();
        let finishing: Vec<String> = self
            .finishing
            .iter()
            .map(|(t, f)| format!("{t}:{:?} {:?}", f.decision, f.unacked))
            .collect();
        let requests: Vec<String> = self
            .requests
            .iter()
            .map(|(r, s)| format!("{}:{:?}/{}", r.0, s.attempt, s.retries))
            .collect();
        format!("requests {requests:?}\n attempts {attempts:?}\n finishing {finishing:?}")
    }

    fn leader(&self, shard: ShardId) -> NodeId {
        self.leaders[shard.0 as usize]
    }

    /// `node` answered for `shard`: it leads the shard (only leaders answer).
    pub(super) fn note_leader(&mut self, shard: ShardId, node: NodeId) {
        let hosts = self
            .context
            .topology
            .nodes
            .get(node.0 as usize)
            .is_some_and(|info| info.replicas.iter().any(|slot| slot.shard == shard));
        if let (true, Some(leader)) = (hosts, self.leaders.get_mut(shard.0 as usize)) {
            *leader = node;
        }
    }

    /// `shard` did not answer in time: its leader may be down or deposed, so the next request
    /// goes to the next replica, which answers if it leads or forwards to the leader it knows.
    fn suspect(&mut self, shard: ShardId) {
        let topology = &self.context.topology;
        if topology.replicas <= 1 {
            return;
        }
        let current = self.leaders[shard.0 as usize];
        let slot = topology.nodes[current.0 as usize]
            .replicas
            .iter()
            .find(|s| s.shard == shard)
            .map_or(0, |s| s.replica);
        if let Some(next) = topology.replica_node(shard, (slot + 1) % topology.replicas) {
            self.leaders[shard.0 as usize] = next;
        }
    }

    pub(super) fn submit(&mut self, now: Time, request: ClientRequest, out: &mut Outbox<OccMsg>) {
        let id = request.id;
        if self.requests.contains_key(&id) {
            return; // A duplicate submit: the first one will be answered.
        }
        if self.requests.len() >= self.context.timing.requests_in_flight_max {
            let why = format!(
                "{} requests in flight is the maximum",
                self.context.timing.requests_in_flight_max
            );
            out.reply(id, TxnOutcome::failed(TxnFailure::Rejected(why)));
            return;
        }
        self.requests.insert(id, RequestState { client: request, retries: 0, attempt: None });
        self.start_attempt(now, id, out);
    }

    /// Plans the request and sends the first messages of a new attempt.
    fn start_attempt(&mut self, now: Time, request: RequestId, out: &mut Outbox<OccMsg>) {
        let pieces = match self.plan(request) {
            Ok(pieces) => pieces,
            Err(error) => {
                return self.complete(
                    request,
                    None,
                    TxnResult::Failed(TxnFailure::Procedure(error)),
                    None,
                    out,
                )
            }
        };
        // Ids follow the node's clock (in ns) so that a restarted coordinator, whose counter
        // starts again, never reuses an id its previous incarnation left in participants'
        // locks and decided caches (found by swarm seed 2; see the sim regression tests).
        let seq = self.seq_next.max(now);
        let txn = TxnId { origin: self.context.id, seq };
        self.seq_next = seq + 1;
        let state = self.requests.get_mut(&request).expect("request in flight");
        assert!(state.attempt.is_none(), "a request runs one attempt at a time");
        state.attempt = Some(txn);
        let (proc, args) = (state.client.txn.proc, state.client.txn.args.clone());
        let single_shard =
            pieces.iter().all(|p| p.shard == pieces[0].shard).then(|| pieces[0].shard);
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
        };
        if attempt.pieces.is_empty() {
            return self.complete(request, None, TxnResult::Committed, None, out);
        }
        if let Some(shard) = single_shard {
            attempt.phase = Phase::ExecuteCommit(shard);
            let want_sets = self.context.record_history;
            out.send(
                self.leader(shard),
                OccMsg::ExecuteCommit { txn, shard, proc, args, want_sets },
            );
        } else {
            self.dispatch(txn, &mut attempt, out);
        }
        self.attempts.insert(txn, attempt);
    }

    /// The request's plan with every piece bound to a shard.
    fn plan(&self, request: RequestId) -> Result<Vec<PieceSlot>, ProcError> {
        let txn = &self.requests[&request].client.txn;
        let procedure = self
            .context
            .registry
            .get(txn.proc)
            .ok_or_else(|| ProcError::BadArgs(format!("unknown procedure {}", txn.proc.0)))?;
        let plan =
            procedure.plan(&txn.args, PlanContext { partitioner: &self.context.partitioner })?;
        if plan.len() > PIECES_MAX {
            return Err(ProcError::Contract(format!("{} pieces is over {PIECES_MAX}", plan.len())));
        }
        // Pieces on replicated tables run next to the first bound piece, or on the home shard.
        let anchor = plan
            .iter()
            .find_map(|p| match p.target {
                ShardTarget::Shard(s) => Some(s),
                ShardTarget::Any => None,
            })
            .unwrap_or(self.home_shard);
        let mut pieces = Vec::with_capacity(plan.len());
        for (index, spec) in plan.into_iter().enumerate() {
            if spec.deps.iter().any(|&d| d as usize >= index) {
                return Err(ProcError::Contract(format!("piece {index} depends on a later piece")));
            }
            let shard = match spec.target {
                ShardTarget::Shard(s) if s.0 < self.context.topology.shards => s,
                ShardTarget::Shard(s) => {
                    return Err(ProcError::Contract(format!(
                        "piece {index} targets missing shard {}",
                        s.0
                    )))
                }
                ShardTarget::Any => anchor,
            };
            pieces.push(PieceSlot { shard, deps: spec.deps, sent: false, output: None });
        }
        Ok(pieces)
    }

    /// Sends every piece that is ready to a shard not already working for this attempt.
    fn dispatch(&mut self, txn: TxnId, attempt: &mut Attempt, out: &mut Outbox<OccMsg>) {
        let txn_request = &self.requests[&attempt.request].client.txn;
        let mut calls: BTreeMap<ShardId, Vec<PieceCall>> = BTreeMap::new();
        for index in 0..attempt.pieces.len() {
            let piece = &attempt.pieces[index];
            let ready = !piece.sent
                && piece.deps.iter().all(|&d| attempt.pieces[d as usize].output.is_some());
            if !ready || attempt.waiting.contains(&piece.shard) {
                continue;
            }
            let inputs = piece
                .deps
                .iter()
                .map(|&d| attempt.pieces[d as usize].output.clone().unwrap_or_default())
                .collect();
            calls.entry(piece.shard).or_default().push(PieceCall { piece: index as u32, inputs });
            attempt.pieces[index].sent = true;
        }
        for (shard, calls) in calls {
            let overlay = attempt.writes_on(shard);
            attempt.waiting.insert(shard);
            out.send(
                self.leader(shard),
                OccMsg::Execute {
                    txn,
                    shard,
                    proc: txn_request.proc,
                    args: txn_request.args.clone(),
                    calls,
                    overlay,
                },
            );
        }
        assert!(!attempt.waiting.is_empty(), "an unfinished plan always has a piece in progress");
    }

    pub(super) fn on_reply(
        &mut self,
        now: Time,
        from: NodeId,
        msg: OccMsg,
        timers: &mut Timers,
        out: &mut Outbox<OccMsg>,
    ) {
        if let OccMsg::Executed { shard, .. }
        | OccMsg::ExecutedCommit { shard, .. }
        | OccMsg::Prepared { shard, .. }
        | OccMsg::Finished { shard, .. } = &msg
        {
            self.note_leader(*shard, from);
        }
        match msg {
            OccMsg::Executed { txn, shard, result } => {
                self.on_executed(now, txn, shard, result, timers, out)
            }
            OccMsg::ExecutedCommit { txn, shard, result } => {
                self.on_executed_commit(now, txn, shard, result, timers, out)
            }
            OccMsg::Prepared { txn, shard, vote } => {
                self.on_prepared(now, txn, shard, vote, timers, out)
            }
            OccMsg::Finished { txn, shard, decision } => {
                self.on_finished(now, txn, shard, decision, timers, out)
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
        timers: &mut Timers,
        out: &mut Outbox<OccMsg>,
    ) {
        let Some(mut attempt) = self.attempts.remove(&txn) else { return };
        // A reply answers the wave now outstanding on its shard only if it carries a run for
        // every piece of that wave: a duplicated reply of an earlier wave does not. (Swarm seed
        // 18 hit this through a reused attempt id; the unit test
        // `a_duplicated_reply_of_an_earlier_wave_is_not_taken_for_the_next_wave` pins it.)
        let answers_wave = match &result {
            Ok(runs) => attempt.pieces.iter().enumerate().all(|(i, p)| {
                p.shard != shard
                    || !p.sent
                    || p.output.is_some()
                    || runs.iter().any(|r| r.piece as usize == i)
            }),
            Err(_) => true,
        };
        if attempt.phase != Phase::Executing || !answers_wave || !attempt.waiting.remove(&shard) {
            self.attempts.insert(txn, attempt); // Late or duplicate.
            return;
        }
        let runs = match result {
            Ok(runs) => runs,
            Err(ExecFailure::Procedure(error)) => {
                return self.complete(
                    attempt.request,
                    Some((txn, &attempt)),
                    TxnResult::Failed(TxnFailure::Procedure(error)),
                    None,
                    out,
                )
            }
            Err(ExecFailure::Conflict(_) | ExecFailure::Decided(_)) => {
                return self.retry(now, attempt, timers, out)
            }
        };
        for run in runs {
            let Some(slot) = attempt.pieces.get(run.piece as usize) else {
                continue;
            };
            if slot.shard != shard || !slot.sent || slot.output.is_some() {
                continue;
            }
            let reads = attempt.reads.entry(shard).or_default();
            for (key, seen) in run.reads {
                if *reads.entry(key).or_insert(seen) != seen {
                    // Two pieces saw different versions of one key: this attempt cannot commit.
                    return self.retry(now, attempt, timers, out);
                }
            }
            attempt.scans.entry(shard).or_default().extend(run.scans);
            match run.effects {
                Err(abort) => {
                    return self.complete(
                        attempt.request,
                        Some((txn, &attempt)),
                        TxnResult::UserAborted(abort.0),
                        None,
                        out,
                    )
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
                return self.complete(
                    attempt.request,
                    Some((txn, &attempt)),
                    TxnResult::Committed,
                    None,
                    out,
                );
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
        let one_phase = participants.len() == 1;
        for &shard in &participants {
            let reads = attempt
                .reads
                .get(&shard)
                .map(|r| r.iter().map(|(k, v)| (k.clone(), *v)).collect())
                .unwrap_or_default();
            let scans = attempt.scans.get(&shard).cloned().unwrap_or_default();
            let writes = attempt.writes_on(shard);
            out.send(
                self.leader(shard),
                OccMsg::Prepare {
                    txn,
                    shard,
                    reads,
                    scans,
                    writes,
                    one_phase,
                    participants: participants.iter().copied().collect(),
                },
            );
        }
        attempt.phase = match participants.first() {
            Some(&shard) if one_phase => Phase::SinglePrepare(shard),
            _ => Phase::Preparing,
        };
        assert!(!participants.is_empty(), "the caller commits attempts that touched nothing");
        attempt.waiting = participants;
    }

    fn on_prepared(
        &mut self,
        now: Time,
        txn: TxnId,
        shard: ShardId,
        vote: Vote,
        timers: &mut Timers,
        out: &mut Outbox<OccMsg>,
    ) {
        let Some(mut attempt) = self.attempts.remove(&txn) else { return };
        match (attempt.phase, vote) {
            (Phase::Preparing, Vote::Yes(ts)) if attempt.waiting.remove(&shard) => {
                attempt.ts_max = attempt.ts_max.max(ts);
                if attempt.waiting.is_empty() {
                    self.decide_commit(now, txn, attempt, out);
                } else {
                    self.attempts.insert(txn, attempt);
                }
            }
            (Phase::Preparing, Vote::No(_)) if attempt.waiting.contains(&shard) => {
                self.abort_prepared(now, txn, &attempt, out);
                self.retry(now, attempt, timers, out);
            }
            (Phase::SinglePrepare(s) | Phase::Resolving(s), Vote::Committed(ts)) if s == shard => {
                self.complete(
                    attempt.request,
                    Some((txn, &attempt)),
                    TxnResult::Committed,
                    Some(ts),
                    out,
                );
            }
            (Phase::SinglePrepare(s), Vote::No(_)) if s == shard => {
                self.retry(now, attempt, timers, out)
            }
            _ => {
                self.attempts.insert(txn, attempt); // Late or duplicate.
            }
        }
    }

    fn decide_commit(&mut self, now: Time, txn: TxnId, attempt: Attempt, out: &mut Outbox<OccMsg>) {
        let participants = attempt.participants();
        let ts = attempt.ts_max;
        if participants.is_empty() {
            return self.complete(
                attempt.request,
                Some((txn, &attempt)),
                TxnResult::Committed,
                None,
                out,
            );
        }
        assert!(ts > Timestamp::ZERO, "a commit decision has every participant's proposal");
        for &shard in &participants {
            out.send(self.leader(shard), OccMsg::Commit { txn, shard, ts });
        }
        let retransmit_at = now + self.context.timing.rpc_timeout_ns;
        let decision = Decision::Committed(ts);
        self.finishing.insert(txn, Finishing { decision, unacked: participants, retransmit_at });
        self.complete(attempt.request, Some((txn, &attempt)), TxnResult::Committed, Some(ts), out);
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
            out.send(self.leader(shard), OccMsg::Abort { txn, shard });
        }
        let retransmit_at = now + self.context.timing.rpc_timeout_ns;
        let decision = Decision::Aborted;
        self.finishing.insert(txn, Finishing { decision, unacked: participants, retransmit_at });
    }

    fn on_executed_commit(
        &mut self,
        now: Time,
        txn: TxnId,
        shard: ShardId,
        result: Result<(Vec<PieceRun>, Option<Timestamp>), ExecFailure>,
        timers: &mut Timers,
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
                // Read and write sets matter after a one-round commit only for the history.
                let keep_sets = self.context.record_history;
                for run in runs {
                    if keep_sets {
                        attempt.reads.entry(shard).or_default().extend(run.reads);
                    }
                    match run.effects {
                        Ok(effects) => {
                            if keep_sets {
                                let writes = attempt.writes.entry(shard).or_default();
                                writes.extend(effects.writes.into_iter().map(|w| (w.key, w.value)));
                            }
                            if let Some(slot) = attempt.pieces.get_mut(run.piece as usize) {
                                slot.output = Some(effects.output);
                            }
                        }
                        Err(abort) => user_abort = Some(abort.0),
                    }
                }
                match (commit, user_abort) {
                    (Some(ts), _) => {
                        self.complete(
                            attempt.request,
                            Some((txn, &attempt)),
                            TxnResult::Committed,
                            Some(ts),
                            out,
                        );
                    }
                    (None, Some(why)) => self.complete(
                        attempt.request,
                        Some((txn, &attempt)),
                        TxnResult::UserAborted(why),
                        None,
                        out,
                    ),
                    (None, None) => self.retry(now, attempt, timers, out),
                }
            }
            Err(ExecFailure::Decided(Decision::Committed(ts))) => {
                self.complete(
                    attempt.request,
                    Some((txn, &attempt)),
                    TxnResult::Committed,
                    Some(ts),
                    out,
                );
            }
            Err(ExecFailure::Procedure(error)) => self.complete(
                attempt.request,
                Some((txn, &attempt)),
                TxnResult::Failed(TxnFailure::Procedure(error)),
                None,
                out,
            ),
            Err(ExecFailure::Conflict(_) | ExecFailure::Decided(Decision::Aborted)) => {
                self.retry(now, attempt, timers, out)
            }
        }
    }

    fn on_finished(
        &mut self,
        now: Time,
        txn: TxnId,
        shard: ShardId,
        decision: Decision,
        timers: &mut Timers,
        out: &mut Outbox<OccMsg>,
    ) {
        if let Some(finishing) = self.finishing.get_mut(&txn) {
            finishing.unacked.remove(&shard);
            if finishing.unacked.is_empty() {
                self.finishing.remove(&txn);
            }
            return;
        }
        let Some(attempt) = self.attempts.remove(&txn) else {
            return;
        };
        match (attempt.phase, decision) {
            (
                Phase::Resolving(s) | Phase::SinglePrepare(s) | Phase::ExecuteCommit(s),
                Decision::Committed(ts),
            ) if s == shard => {
                // The outputs of a one-round commit whose reply was lost are gone; the commit is not.
                self.complete(
                    attempt.request,
                    Some((txn, &attempt)),
                    TxnResult::Committed,
                    Some(ts),
                    out,
                );
            }
            (Phase::Resolving(s), Decision::Aborted) if s == shard => {
                self.retry(now, attempt, timers, out)
            }
            _ => {
                self.attempts.insert(txn, attempt);
            }
        }
    }

    pub(super) fn on_timer(&mut self, now: Time, purpose: TimerPurpose, out: &mut Outbox<OccMsg>) {
        match purpose {
            TimerPurpose::Retry { request } => {
                if self.requests.get(&request).is_some_and(|r| r.attempt.is_none()) {
                    self.start_attempt(now, request, out);
                }
            }
            TimerPurpose::Gc | TimerPurpose::CoordinatorTick | TimerPurpose::RaftTick => {}
        }
    }

    /// A participant's answer to `Query` for an attempt whose votes were missing: prepared
    /// counts as a yes vote; refused means abort (safe: that shard will never prepare it);
    /// committed means the participants decided it without us.
    pub(super) fn on_state(
        &mut self,
        now: Time,
        txn: TxnId,
        shard: ShardId,
        state: PeerState,
        timers: &mut Timers,
        out: &mut Outbox<OccMsg>,
    ) {
        let Some(attempt) = self.attempts.get(&txn) else { return };
        if attempt.phase != Phase::Preparing || !attempt.waiting.contains(&shard) {
            return;
        }
        match state {
            PeerState::Prepared(ts) => {
                self.on_prepared(now, txn, shard, Vote::Yes(ts), timers, out);
            }
            PeerState::Decided(Decision::Aborted) => {
                self.on_prepared(now, txn, shard, Vote::No(Conflict::AlreadyAborted), timers, out);
            }
            PeerState::Decided(Decision::Committed(ts)) => {
                let attempt = self.attempts.remove(&txn).expect("checked above");
                let participants = attempt.participants();
                for &peer in &participants {
                    out.send(
                        self.leaders[peer.0 as usize],
                        OccMsg::Commit { txn, shard: peer, ts },
                    );
                }
                let retransmit_at = now + self.context.timing.rpc_timeout_ns;
                let decision = Decision::Committed(ts);
                self.finishing
                    .insert(txn, Finishing { decision, unacked: participants, retransmit_at });
                self.complete(
                    attempt.request,
                    Some((txn, &attempt)),
                    TxnResult::Committed,
                    Some(ts),
                    out,
                );
            }
        }
    }

    /// The coordinator's periodic check: phases past their deadline time out, and decisions
    /// not yet acknowledged go again. One timer for all attempts keeps the timer table as
    /// small as the node's work, however fast attempts finish.
    pub(super) fn on_tick(&mut self, now: Time, timers: &mut Timers, out: &mut Outbox<OccMsg>) {
        let due: Vec<TxnId> =
            self.attempts.iter().filter(|(_, a)| a.deadline <= now).map(|(&t, _)| t).collect();
        for txn in due {
            let Some(mut attempt) = self.attempts.remove(&txn) else { continue };
            match attempt.phase {
                // Execution keeps no state at participants: just start over.
                Phase::Executing => {
                    for &shard in &attempt.waiting {
                        self.suspect(shard);
                    }
                    self.retry(now, attempt, timers, out)
                }
                // Votes are missing. Aborting now could contradict participants that, all
                // prepared, commit on their own (see `Participant::try_terminate`); instead ask
                // the silent ones, which refuse the attempt if they have not prepared it.
                Phase::Preparing => {
                    for &shard in &attempt.waiting {
                        self.suspect(shard);
                        out.send(self.leaders[shard.0 as usize], OccMsg::Query { txn, shard });
                    }
                    attempt.deadline = now + self.context.timing.rpc_timeout_ns;
                    self.attempts.insert(txn, attempt);
                }
                // The outcome of a one-round commit is unknown: ask until it is known.
                Phase::ExecuteCommit(shard)
                | Phase::SinglePrepare(shard)
                | Phase::Resolving(shard) => {
                    attempt.phase = Phase::Resolving(shard);
                    attempt.deadline = now + self.context.timing.rpc_timeout_ns;
                    self.suspect(shard);
                    out.send(self.leader(shard), OccMsg::Abort { txn, shard });
                    self.attempts.insert(txn, attempt);
                }
            }
        }
        let rpc_timeout_ns = self.context.timing.rpc_timeout_ns;
        let overdue: BTreeSet<ShardId> = self
            .finishing
            .values()
            .filter(|f| f.retransmit_at <= now)
            .flat_map(|f| f.unacked.iter().copied())
            .collect();
        for shard in overdue {
            self.suspect(shard);
        }
        for (&txn, finishing) in self.finishing.iter_mut().filter(|(_, f)| f.retransmit_at <= now) {
            for &shard in &finishing.unacked {
                let msg = OccMsg::decision(txn, shard, finishing.decision);
                out.send(self.leaders[shard.0 as usize], msg);
            }
            finishing.retransmit_at = now + rpc_timeout_ns;
        }
    }

    /// Ends `attempt` without committing and schedules the next one after backoff.
    fn retry(
        &mut self,
        _now: Time,
        attempt: Attempt,
        timers: &mut Timers,
        out: &mut Outbox<OccMsg>,
    ) {
        let request = attempt.request;
        let Some(state) = self.requests.get_mut(&request) else {
            return;
        };
        state.attempt = None;
        state.retries += 1;
        self.retried_total += 1;
        if state.retries >= self.context.timing.attempts_max {
            return self.complete(
                request,
                None,
                TxnResult::Failed(TxnFailure::RetriesExhausted),
                None,
                out,
            );
        }
        let timing = &self.context.timing;
        let exponent = state.retries.min(20);
        let backoff =
            timing.backoff_ns_min.saturating_mul(1 << exponent).min(timing.backoff_ns_max);
        let jittered = (backoff as f64 * (0.5 + uniform_f64(&mut self.rng))) as u64;
        timers.set(TimerPurpose::Retry { request }, jittered.max(1), out);
    }

    /// Answers the client and forgets the request.
    fn complete(
        &mut self,
        request: RequestId,
        attempt: Option<(TxnId, &Attempt)>,
        result: TxnResult,
        commit_ts: Option<Timestamp>,
        out: &mut Outbox<OccMsg>,
    ) {
        let Some(state) = self.requests.remove(&request) else {
            return;
        };
        if result == TxnResult::Committed {
            self.committed_total += 1;
        }
        if let Some((txn, _)) = attempt {
            self.attempts.remove(&txn);
        }
        let committed = result == TxnResult::Committed;
        if self.context.record_history {
            if let Some((txn, attempt)) = attempt {
                if committed || matches!(result, TxnResult::UserAborted(_)) {
                    out.record(history_event(request, txn, attempt, committed));
                }
            }
        }
        let outputs = match (committed, attempt) {
            (true, Some((_, attempt))) => attempt.outputs(),
            _ => Vec::new(),
        };
        let shards_touched = attempt.map_or(0, |(_, a)| a.shards_touched());
        out.reply(
            request,
            TxnOutcome { result, outputs, commit_ts, retries: state.retries, shards_touched },
        );
    }
}

fn history_event(
    request: RequestId,
    txn: TxnId,
    attempt: &Attempt,
    committed: bool,
) -> HistoryEvent {
    let reads = attempt
        .reads
        .values()
        .flat_map(|r| r.iter().map(|(k, v)| (k.clone(), v.map(|t| t.writer))))
        .collect();
    let writes = attempt
        .writes
        .values()
        .flat_map(|w| w.iter().map(|(k, v)| (k.clone(), v.clone())))
        .collect();
    HistoryEvent { request, txn, committed, reads, writes }
}
