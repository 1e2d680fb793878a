//! Interactive transactions at the coordinator (`occ`, `2pl`, `2pc-mvto`).
//!
//! A session is one attempt whose steps come from its client instead of a plan: `Begin` opens
//! the attempt (its id, and its timestamp under `2pc-mvto`), each `Read` step is one wave of
//! the built-in [`SessionReads`] procedure on every shard it touches (so reads are validated,
//! locked or stamped exactly as a procedure's reads are), and `Commit` carries the client's
//! buffered writes into the same prepare and decision as any attempt. Nothing is retried: a
//! conflict ends the session `Aborted` with its cause, and the client decides what to do.
//!
//! Invariants:
//! - an open session has exactly one attempt, in `Executing` until its commit starts;
//! - a session has at most one step in progress, and every step is answered once;
//! - a session idle (no step in progress) for `Timing::session_lease_ns` is aborted and its
//!   execution locks released, so a vanished client holds nothing for longer; a step waits at
//!   most one RPC timeout for its shards.
//!
//! The piece index of a step's calls is the step's number, so a late duplicate reply of an
//! earlier step on the same shard is not taken for the current one.

use super::{Attempt, Coordinator, Ending, Phase};
use crate::engine::{ExecFailure, OccMsg, ShardRequest, TimerPurpose};
use crate::kit::exec::PieceCall;
use crate::kit::exec::PieceRun;
use crate::kit::timers::Timers;
use meridian_core::key::{Key, Value};
use meridian_core::node::{read_outputs, Outbox, SessionId, SessionOp, SessionRequest};
use meridian_core::txn::{
    AbortCause, CommitPath, Datum, ProcError, ProcId, ScanRange, SessionReads, ShardTarget,
    TxnFailure, TxnOutcome, TxnResult, Write, PIECES_MAX, PIECE_KEYS_MAX, SCAN_ROWS_MAX,
};
use meridian_core::{RequestId, ShardId, Time, Timestamp, TxnId};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Ended sessions remembered, so that a late step is told how its transaction ended.
const ENDED_REMEMBERED_MAX: usize = 4_096;
/// Times a read step is sent to a shard that stays silent (its reply may be lost while a
/// connection is re-established, or its leader may have moved) before the session is aborted.
const STEP_SENDS_MAX: u32 = 4;
/// Most keys read plus ranges scanned over a session's steps: what a prepare carries stays
/// bounded (and within what a participant accepts, with the writes).
const SESSION_READS_MAX: usize = 8 * PIECE_KEYS_MAX;
/// Most writes one commit may carry to one shard (`2pl` locks them in one piece).
const COMMIT_WRITES_PER_SHARD_MAX: usize = PIECE_KEYS_MAX;

const _: () = assert!(
    SESSION_READS_MAX + COMMIT_WRITES_PER_SHARD_MAX <= PIECES_MAX * PIECE_KEYS_MAX,
    "a session's prepare fits what a participant accepts"
);

/// How a session ends.
pub(super) enum End {
    /// Its attempt ended this way (committed, failed, or unknown).
    Finished(Ending),
    /// The protocol aborted it.
    Aborted(AbortCause),
}

/// A read step in progress.
struct ReadStep {
    request: RequestId,
    number: u32,
    /// Per shard asked: the indices of the keys it reads.
    keys_of: BTreeMap<ShardId, Vec<usize>>,
    scans: Vec<ScanRange>,
    values: Vec<Option<Value>>,
    rows: Vec<Vec<(Key, Value)>>,
    /// What each shard was asked (sent again to a silent one), and how often it was sent.
    requests: BTreeMap<ShardId, ShardRequest>,
    sends: u32,
    /// `2pl`: this step takes the exclusive locks of the commit's writes; the commit's
    /// prepare follows once every shard has granted them.
    commit: bool,
}

/// The step in progress.
enum Step {
    Read(ReadStep),
    Commit(RequestId),
}

struct Session {
    txn: TxnId,
    began_at: Time,
    steps: u32,
    step: Option<Step>,
    /// Keys read and ranges scanned so far (at most [`SESSION_READS_MAX`]).
    reads_total: usize,
}

/// The open sessions of one coordinator, at most `open_max`, and how the last ones ended.
pub(super) struct Sessions {
    open: BTreeMap<SessionId, Session>,
    open_max: usize,
    /// How each ended, and the cause when the protocol aborted it.
    ended: BTreeMap<SessionId, (String, Option<AbortCause>)>,
    ended_order: VecDeque<SessionId>,
}

impl Sessions {
    pub(super) fn new(open_max: usize) -> Self {
        Self {
            open: BTreeMap::new(),
            open_max,
            ended: BTreeMap::new(),
            ended_order: VecDeque::new(),
        }
    }

    fn remember(&mut self, session: SessionId, how: String, cause: Option<AbortCause>) {
        if self.ended_order.len() >= ENDED_REMEMBERED_MAX {
            if let Some(old) = self.ended_order.pop_front() {
                self.ended.remove(&old);
            }
        }
        self.ended.insert(session, (how, cause));
        self.ended_order.push_back(session);
    }

    /// The answer to a step of `session`, which is not open: aborted (with its cause) when
    /// the protocol aborted it, so that its client sees the abort however late it asks;
    /// refused otherwise, saying how it ended if that is remembered.
    fn not_open(&self, session: SessionId) -> TxnOutcome {
        match self.ended.get(&session) {
            Some((_, Some(cause))) => {
                let mut outcome = TxnOutcome::failed(TxnFailure::Aborted(*cause));
                outcome.aborts.add(*cause);
                outcome
            }
            Some((how, None)) => refused(format!("transaction {} is over: it {how}", session.0)),
            None => refused(format!("no open transaction {} here", session.0)),
        }
    }

    /// Open sessions (a gauge).
    pub(super) fn len(&self) -> usize {
        self.open.len()
    }
}

fn ok(outputs: Vec<Vec<Datum>>) -> TxnOutcome {
    TxnOutcome {
        result: TxnResult::Committed,
        outputs,
        ..TxnOutcome::failed(TxnFailure::RetriesExhausted)
    }
}

fn refused(why: String) -> TxnOutcome {
    TxnOutcome::failed(TxnFailure::Rejected(why))
}

fn bad_step(why: String) -> TxnOutcome {
    TxnOutcome::failed(TxnFailure::Procedure(ProcError::BadArgs(why)))
}

/// The execution of step `number` of attempt `txn` on `shard`: the built-in session reads
/// with `args`, numbered by the step, under the session's wound-wait priority and timestamp.
fn step_request(
    txn: TxnId,
    shard: ShardId,
    (priority, ts): (u64, Timestamp),
    number: u32,
    args: meridian_core::txn::Args,
) -> ShardRequest {
    ShardRequest::Execute {
        txn,
        shard,
        priority,
        ts,
        proc: ProcId::SESSION_READS,
        args,
        calls: vec![PieceCall { piece: number, inputs: Vec::new() }],
        overlay: Vec::new(),
    }
}

impl Coordinator {
    pub(in crate::engine) fn on_session(
        &mut self,
        now: Time,
        request: SessionRequest,
        _timers: &mut Timers<TimerPurpose>,
        out: &mut Outbox<OccMsg>,
    ) {
        let SessionRequest { id, session, op } = request;
        if let SessionOp::Begin = op {
            return self.begin_session(now, id, session, out);
        }
        let Some(open) = self.sessions.open.get(&session) else {
            return out.reply(id, self.sessions.not_open(session));
        };
        let txn = open.txn;
        let busy = match &open.step {
            Some(Step::Commit(_)) => Some("its commit is under way"),
            Some(Step::Read(_)) if !matches!(op, SessionOp::Abort) => {
                Some("a step of it is still running")
            }
            _ => None,
        };
        if let Some(why) = busy {
            return out.reply(id, refused(format!("transaction {}: {why}", session.0)));
        }
        match op {
            SessionOp::Begin => unreachable!("handled above"),
            SessionOp::Read { keys, scans } => {
                self.session_read(now, id, session, txn, keys, scans, out)
            }
            SessionOp::Commit { writes } => self.session_commit(now, id, session, txn, writes, out),
            SessionOp::Abort => {
                let Some(attempt) = self.attempts.remove(&txn) else {
                    return out.reply(id, self.sessions.not_open(session));
                };
                self.release_locks(txn, &attempt, out);
                if let Some(Session { step: Some(Step::Read(step)), .. }) =
                    self.sessions.open.get(&session)
                {
                    out.reply(step.request, refused("aborted by its client meanwhile".into()));
                }
                self.sessions.open.remove(&session);
                self.sessions.remember(session, "was aborted by its client".into(), None);
                out.reply(id, ok(Vec::new()));
            }
        }
    }

    fn begin_session(
        &mut self,
        now: Time,
        id: RequestId,
        session: SessionId,
        out: &mut Outbox<OccMsg>,
    ) {
        if self.sessions.open.contains_key(&session) || self.sessions.ended.contains_key(&session) {
            return out.reply(id, refused(format!("transaction {} already began", session.0)));
        }
        if self.sessions.open.len() >= self.sessions.open_max {
            let max = self.sessions.open_max;
            return out.reply(id, refused(format!("{max} open transactions is the maximum")));
        }
        let txn = self.ids.next_id();
        let ts = self.next_ts(now);
        let attempt = Attempt {
            request: id,
            pieces: Vec::new(),
            reads: BTreeMap::new(),
            scans: BTreeMap::new(),
            writes: BTreeMap::new(),
            phase: Phase::Executing,
            deadline: now.saturating_add(self.context.timing.session_lease_ns),
            waiting: BTreeSet::new(),
            ts_max: Timestamp::ZERO,
            probing: None,
            locked_at: BTreeSet::new(),
            ts,
            session: Some(session),
            epoch: self.epoch,
        };
        self.attempts.insert(txn, attempt);
        self.sessions
            .open
            .insert(session, Session { txn, began_at: now, steps: 0, step: None, reads_total: 0 });
        out.reply(id, ok(Vec::new()));
    }

    /// The shard a key is read on: its own, or (replicated tables) the coordinator's home.
    fn read_shard(&self, key: &Key) -> ShardId {
        match self.context.partitioner.target_of(key) {
            ShardTarget::Shard(shard) => shard,
            ShardTarget::Any => self.home_shard,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn session_read(
        &mut self,
        now: Time,
        id: RequestId,
        session: SessionId,
        txn: TxnId,
        keys: Vec<Key>,
        scans: Vec<ScanRange>,
        out: &mut Outbox<OccMsg>,
    ) {
        // A bad step is refused and changes nothing: the transaction stays open.
        if keys.len() > PIECE_KEYS_MAX || scans.len() > PIECE_KEYS_MAX {
            return out.reply(
                id,
                bad_step(format!("more than {PIECE_KEYS_MAX} keys or scans in one step")),
            );
        }
        if let Some(scan) = scans.iter().find(|s| s.start > s.end) {
            return out.reply(
                id,
                bad_step(format!(
                    "scan range reversed: start {:?} is after end {:?}",
                    scan.start, scan.end
                )),
            );
        }
        if let Some(scan) = scans.iter().find(|s| s.limit > SCAN_ROWS_MAX) {
            return out
                .reply(id, bad_step(format!("scan limit {} is over {SCAN_ROWS_MAX}", scan.limit)));
        }
        if keys.is_empty() && scans.is_empty() {
            return out.reply(id, ok(read_outputs(Vec::new(), Vec::new())));
        }
        let reads_total = self.sessions.open.get(&session).map_or(0, |o| o.reads_total);
        if reads_total + keys.len() + scans.len() > SESSION_READS_MAX {
            let why = format!("a transaction reads at most {SESSION_READS_MAX} keys and ranges");
            return out.reply(id, bad_step(why));
        }
        let Some(mut attempt) = self.attempts.remove(&txn) else {
            return out.reply(id, self.sessions.not_open(session));
        };
        let open = self.sessions.open.get_mut(&session).expect("an open session");
        open.steps += 1;
        open.reads_total += keys.len() + scans.len();
        let number = open.steps;
        let priority = if self.locking { open.began_at } else { 0 };
        let mut keys_of: BTreeMap<ShardId, Vec<usize>> = BTreeMap::new();
        for (index, key) in keys.iter().enumerate() {
            keys_of.entry(self.read_shard(key)).or_default().push(index);
        }
        // A range may hold keys of every shard.
        let mut shards: BTreeSet<ShardId> = keys_of.keys().copied().collect();
        if !scans.is_empty() {
            shards.extend((0..self.context.topology.shards).map(ShardId));
        }
        let mut requests = BTreeMap::new();
        for &shard in &shards {
            let shard_keys: Vec<Key> = keys_of
                .get(&shard)
                .map_or_else(Vec::new, |ix| ix.iter().map(|&i| keys[i].clone()).collect());
            let args = SessionReads::args(&shard_keys, &scans, &[]);
            let request = step_request(txn, shard, (priority, attempt.ts), number, args);
            self.send(shard, request.clone(), out);
            requests.insert(shard, request);
            attempt.waiting.insert(shard);
            if self.locking {
                attempt.locked_at.insert(shard);
            }
        }
        attempt.deadline = now + self.context.timing.rpc_timeout_ns;
        self.attempts.insert(txn, attempt);
        let step = ReadStep {
            request: id,
            number,
            keys_of,
            values: vec![None; keys.len()],
            rows: vec![Vec::new(); scans.len()],
            scans,
            requests,
            sends: 1,
            commit: false,
        };
        self.sessions.open.get_mut(&session).expect("an open session").step =
            Some(Step::Read(step));
    }

    /// A read step's shards stayed silent for an RPC timeout: ask the silent ones again (at
    /// their next replica if they have several), or abort after [`STEP_SENDS_MAX`] sends.
    /// Reads keep no state at the shards, and a `2pl` leader drops a duplicate execution of
    /// an attempt it already holds waiting, so asking again is safe.
    pub(super) fn on_session_step_timeout(
        &mut self,
        now: Time,
        txn: TxnId,
        mut attempt: Attempt,
        out: &mut Outbox<OccMsg>,
    ) {
        let session = attempt.session.expect("a session's attempt");
        let silent: Vec<ShardId> = attempt.waiting.iter().copied().collect();
        for &shard in &silent {
            self.leaders.suspect(shard);
        }
        let resend = match self.sessions.open.get_mut(&session) {
            Some(Session { step: Some(Step::Read(step)), .. }) if step.sends < STEP_SENDS_MAX => {
                step.sends += 1;
                silent.iter().filter_map(|s| step.requests.get(s).cloned()).collect()
            }
            _ => Vec::new(),
        };
        if resend.is_empty() {
            self.release_locks(txn, &attempt, out);
            let cause =
                if silent.is_empty() { AbortCause::LeaseExpired } else { AbortCause::Timeout };
            return self.end_session(session, End::Aborted(cause), out);
        }
        for request in resend {
            self.send(request.shard(), request, out);
        }
        attempt.deadline = now + self.context.timing.rpc_timeout_ns;
        self.attempts.insert(txn, attempt);
    }

    /// A shard answered a read step.
    pub(super) fn on_session_executed(
        &mut self,
        now: Time,
        txn: TxnId,
        mut attempt: Attempt,
        shard: ShardId,
        result: Result<Vec<PieceRun>, ExecFailure>,
        out: &mut Outbox<OccMsg>,
    ) {
        let session = attempt.session.expect("a session's attempt");
        let number = match self.sessions.open.get(&session) {
            Some(Session { step: Some(Step::Read(step)), .. }) => step.number,
            _ => 0,
        };
        let current = match &result {
            Ok(runs) => runs.len() == 1 && runs[0].piece == number,
            Err(_) => true,
        };
        if number == 0
            || attempt.phase != Phase::Executing
            || !current
            || !attempt.waiting.remove(&shard)
        {
            self.attempts.insert(txn, attempt); // Late or duplicate.
            return;
        }
        let run = match result {
            Ok(mut runs) => runs.pop().expect("one run"),
            Err(ExecFailure::Procedure(error)) => {
                self.release_locks(txn, &attempt, out);
                let ending = Ending::failed(TxnFailure::Procedure(error));
                return self.end_session(session, End::Finished(ending), out);
            }
            Err(ExecFailure::Conflict(conflict)) => {
                self.release_locks(txn, &attempt, out);
                let cause = self.note_conflict(conflict, now);
                return self.end_session(session, End::Aborted(cause), out);
            }
            Err(ExecFailure::Decided(_) | ExecFailure::Forgotten) => {
                self.release_locks(txn, &attempt, out);
                return self.end_session(session, End::Aborted(AbortCause::AlreadyAborted), out);
            }
        };
        if let Some(newest) = run.reads.iter().filter_map(|(_, seen)| *seen).map(|v| v.ts).max() {
            if self.mvto && newest.0 <= now.saturating_add(crate::kit::coord::TS_AHEAD_MAX_NS) {
                self.ts_floor = self.ts_floor.max(newest);
            }
        }
        let reads = attempt.reads.entry(shard).or_default();
        for (key, seen) in run.reads {
            if *reads.entry(key).or_insert(seen) != seen {
                // Two steps saw different versions of one key: it cannot commit.
                self.release_locks(txn, &attempt, out);
                return self.end_session(session, End::Aborted(AbortCause::Validation), out);
            }
        }
        attempt.scans.entry(shard).or_default().extend(run.scans);
        let parsed = run.effects.ok().and_then(|effects| {
            let [Datum::List(values), Datum::List(scans)] = effects.output.as_slice() else {
                return None;
            };
            meridian_core::node::parse_read_outputs(&[values.clone(), scans.clone()])
        });
        let (keys_here, scans_asked) = match self.sessions.open.get(&session) {
            Some(Session { step: Some(Step::Read(step)), .. }) => {
                (step.keys_of.get(&shard).map_or(0, Vec::len), step.scans.len())
            }
            _ => unreachable!("checked above"),
        };
        let Some((values, scans)) = parsed
            .filter(|(values, scans)| values.len() == keys_here && scans.len() == scans_asked)
        else {
            self.release_locks(txn, &attempt, out);
            let why = format!("shard {} answered a read step malformed", shard.0);
            let ending = Ending::failed(TxnFailure::Procedure(ProcError::Contract(why)));
            return self.end_session(session, End::Finished(ending), out);
        };
        let Some(Session { step: Some(Step::Read(step)), .. }) =
            self.sessions.open.get_mut(&session)
        else {
            unreachable!("checked above");
        };
        for (&index, value) in step.keys_of.get(&shard).into_iter().flatten().zip(values) {
            step.values[index] = value;
        }
        for (rows, found) in step.rows.iter_mut().zip(scans) {
            rows.extend(found);
        }
        if attempt.waiting.is_empty() {
            // Every shard answered: merge the scans and answer the client.
            let Some(Session { step: step @ Some(Step::Read(_)), .. }) =
                self.sessions.open.get_mut(&session)
            else {
                unreachable!("checked above");
            };
            let Some(Step::Read(step)) = step.take() else { unreachable!("matched above") };
            if step.commit {
                // The writes' locks are held: prepare.
                self.sessions.open.get_mut(&session).expect("an open session").step =
                    Some(Step::Commit(step.request));
                self.begin_prepare(txn, &mut attempt, out);
                attempt.deadline = now + self.context.timing.rpc_timeout_ns;
                self.attempts.insert(txn, attempt);
                return;
            }
            let ReadStep { request, scans, values, mut rows, .. } = step;
            for (range, rows) in scans.iter().zip(rows.iter_mut()) {
                rows.sort_by(|a, b| a.0.cmp(&b.0));
                // Tables replicated on every shard answer from every shard.
                rows.dedup_by(|a, b| a.0 == b.0);
                if range.reverse {
                    rows.reverse();
                }
                rows.truncate(range.limit as usize);
            }
            out.reply(request, ok(read_outputs(values, rows)));
            attempt.deadline = now.saturating_add(self.context.timing.session_lease_ns);
        }
        self.attempts.insert(txn, attempt);
    }

    #[allow(clippy::too_many_arguments)]
    fn session_commit(
        &mut self,
        now: Time,
        id: RequestId,
        session: SessionId,
        txn: TxnId,
        writes: Vec<Write>,
        out: &mut Outbox<OccMsg>,
    ) {
        if writes.len() > COMMIT_WRITES_PER_SHARD_MAX * self.context.topology.shards as usize {
            let why = format!("more than {COMMIT_WRITES_PER_SHARD_MAX} writes per shard");
            return out.reply(id, bad_step(why));
        }
        let mut by_shard: BTreeMap<ShardId, BTreeMap<Key, Option<Value>>> = BTreeMap::new();
        for write in writes {
            match self.context.partitioner.target_of(&write.key) {
                ShardTarget::Shard(shard) => {
                    by_shard.entry(shard).or_default().insert(write.key, write.value);
                }
                ShardTarget::Any => {
                    let why = format!(
                        "write to replicated table key {:?}: replicated tables are read-only",
                        write.key
                    );
                    return out.reply(
                        id,
                        TxnOutcome::failed(TxnFailure::Procedure(ProcError::Unsupported(why))),
                    );
                }
            }
        }
        if let Some((shard, _)) =
            by_shard.iter().find(|(_, w)| w.len() > COMMIT_WRITES_PER_SHARD_MAX)
        {
            let why = format!(
                "more than {COMMIT_WRITES_PER_SHARD_MAX} writes to shard {} in one commit",
                shard.0
            );
            return out.reply(id, bad_step(why));
        }
        let Some(mut attempt) = self.attempts.remove(&txn) else {
            return out.reply(id, self.sessions.not_open(session));
        };
        attempt.request = id;
        if self.locking && !by_shard.is_empty() {
            // `2pl` prepares only what it holds locks for: take the writes' exclusive locks
            // first, in one round to every shard written.
            let open = self.sessions.open.get_mut(&session).expect("an open session");
            open.steps += 1;
            let (number, priority) = (open.steps, open.began_at);
            let mut requests = BTreeMap::new();
            for (&shard, writes) in &by_shard {
                let keys: Vec<Key> = writes.keys().cloned().collect();
                let args = SessionReads::args(&[], &[], &keys);
                let request = step_request(txn, shard, (priority, attempt.ts), number, args);
                self.send(shard, request.clone(), out);
                requests.insert(shard, request);
                attempt.waiting.insert(shard);
                attempt.locked_at.insert(shard);
            }
            attempt.writes = by_shard;
            attempt.deadline = now + self.context.timing.rpc_timeout_ns;
            self.attempts.insert(txn, attempt);
            let step = ReadStep {
                request: id,
                number,
                keys_of: BTreeMap::new(),
                scans: Vec::new(),
                values: Vec::new(),
                rows: Vec::new(),
                requests,
                sends: 1,
                commit: true,
            };
            self.sessions.open.get_mut(&session).expect("an open session").step =
                Some(Step::Read(step));
            return;
        }
        attempt.writes = by_shard;
        self.sessions.open.get_mut(&session).expect("an open session").step =
            Some(Step::Commit(id));
        if attempt.participants().is_empty() {
            let ending = Ending::committed(None, CommitPath::Empty);
            return self.end_session(session, End::Finished(ending), out);
        }
        self.begin_prepare(txn, &mut attempt, out);
        attempt.deadline = now + self.context.timing.rpc_timeout_ns;
        self.attempts.insert(txn, attempt);
    }

    /// Ends `session` (its attempt already out of the attempt table) and answers the step in
    /// progress, if any.
    pub(super) fn end_session(&mut self, session: SessionId, end: End, out: &mut Outbox<OccMsg>) {
        let Some(open) = self.sessions.open.remove(&session) else { return };
        self.attempts.remove(&open.txn);
        let (outcome, how, cause) = match end {
            End::Finished(ending) => {
                let how = match &ending.result {
                    TxnResult::Committed => "committed".to_string(),
                    TxnResult::UserAborted(why) => format!("was aborted: {why}"),
                    TxnResult::Failed(failure) => format!("failed: {failure}"),
                };
                if ending.result == TxnResult::Committed {
                    self.committed_total += 1;
                }
                let outcome = TxnOutcome {
                    result: ending.result,
                    outputs: Vec::new(),
                    commit_ts: ending.commit_ts,
                    retries: 0,
                    aborts: Default::default(),
                    shards_touched: 0,
                    path: ending.path,
                    speculative_ns: None,
                };
                (outcome, how, None)
            }
            End::Aborted(cause) => {
                let mut outcome = TxnOutcome::failed(TxnFailure::Aborted(cause));
                outcome.aborts.add(cause);
                (outcome, format!("was aborted ({})", cause.name()), Some(cause))
            }
        };
        let request = match open.step {
            Some(Step::Read(step)) => Some(step.request),
            Some(Step::Commit(request)) => Some(request),
            None => None,
        };
        if let Some(request) = request {
            out.reply(request, outcome);
        }
        self.sessions.remember(session, how, cause);
    }
}
