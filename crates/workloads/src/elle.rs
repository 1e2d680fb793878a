//! `list-append` and `rw-register`: the checking workloads (Elle's, docs/design.md, "Correctness").
//! Each transaction has 1 to `ops_max` ([`ELLE_OPS_MAX`] by default) micro-operations on distinct
//! keys spread over every shard, half reads. In `list-append` the others append a unique element to
//! the key's list (a read-modify-write; a read returns the whole list); in `rw-register` they
//! blindly write a unique value. The element or value is the request id, unique per run.
//!
//! Keys are `table 2 ‖ id:u64`, shard `id / keys_per_shard`; a small key count gives
//! contention. A list is stored as its elements, `u64` little-endian each; a register as one
//! `u64`. Piece `i` runs on the `i`-th shard touched and outputs, for each of its reads in
//! argument order, the list (`Datum::List` of `Uint`) or the value (`Uint`, or an empty list for
//! the initial state).
//!
//! Invariant (`elle-<kind>`): the client-observed history (invocation and completion in true
//! time, the values read) is checked for strict serializability by `meridian-check`; requests
//! never answered count as unknown (`info`). The history is also kept for export.

use crate::clients::REQUEST_COUNTER_MASK;
use crate::dist::{KeyDist, ShardedKeys};
use crate::{CheckResult, Completion, InvariantCheck, TxnGenerator, Workload, WorkloadOptions};
use meridian_check::history::{History, HistoryBuilder, KeyName, Mop, OpType};
use meridian_check::{check, Consistency};
use meridian_core::key::Key;
use meridian_core::rng::{child_rng, uniform_u64, Rng};
use meridian_core::txn::{
    Args, Datum, KeySet, Partitioner, PieceEffects, PieceOutput, Plan, PlanContext, ProcError,
    ProcId, Procedure, Reads, Registry, TxnRequest, TxnResult, UserAbort, Write,
};
use meridian_core::{ConfigError, RequestId, ShardId, Time};
use meridian_storage::MvccStore;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The table byte of checking keys.
pub const ELLE_TABLE: u8 = 2;
/// Most micro-operations per transaction by default.
pub const ELLE_OPS_MAX: u64 = 4;
/// Largest `ops_max` accepted.
pub const ELLE_OPS_LIMIT: u32 = 64;
/// Most elements a list may hold; an append beyond it is a user abort (keeps values bounded).
pub const LIST_ELEMENTS_MAX: usize = 100_000;
/// Most operations a recorded history keeps; later ones are counted, not recorded, and the
/// check says so.
pub const HISTORY_OPS_MAX: usize = 4_000_000;

const READ: u64 = 0;
const WRITE: u64 = 1;

/// Which checking workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Appends to lists.
    ListAppend,
    /// Blind writes of unique values.
    RwRegister,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::ListAppend => "list-append",
            Self::RwRegister => "rw-register",
        }
    }

    fn model(self) -> meridian_check::history::Model {
        match self {
            Self::ListAppend => meridian_check::history::Model::ListAppend,
            Self::RwRegister => meridian_check::history::Model::RwRegister,
        }
    }
}

/// The key of item `id`.
pub fn elle_key(id: u64) -> Key {
    Key::table(ELLE_TABLE).u64(id).build()
}

/// The workload.
#[derive(Debug)]
pub struct ElleWorkload {
    kind: Kind,
    ops_max: u64,
    keys: ShardedKeys,
}

impl ElleWorkload {
    /// Checks the options and builds the workload.
    pub fn new(kind: Kind, options: &WorkloadOptions) -> Result<Self, ConfigError> {
        if options.shards == 0 {
            return Err(ConfigError::new(format!("{} needs at least one shard", kind.name())));
        }
        if options.keys_per_shard == 0 {
            return Err(ConfigError::new(format!(
                "{} needs at least one key per shard",
                kind.name()
            )));
        }
        let ops_max = options.ops_max.unwrap_or(ELLE_OPS_MAX as u32);
        if !(1..=ELLE_OPS_LIMIT).contains(&ops_max) {
            return Err(ConfigError::new(format!(
                "--ops-max must be in 1..={ELLE_OPS_LIMIT}, got {ops_max}"
            )));
        }
        let dist = KeyDist::new(options.keys_per_shard, options.zipf_theta)?;
        Ok(Self {
            kind,
            ops_max: u64::from(ops_max),
            keys: ShardedKeys { shards: options.shards, per_shard: options.keys_per_shard, dist },
        })
    }
}

impl Workload for ElleWorkload {
    fn name(&self) -> &'static str {
        self.kind.name()
    }

    fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.kind.name(),
            "ops_per_txn": format!("1..={}", self.ops_max),
            "read_fraction": 0.5,
            "keys_per_shard": self.keys.per_shard,
            "distribution": match &self.keys.dist { KeyDist::Uniform { .. } => "uniform", KeyDist::Zipf(_) => "zipf" },
            "checked_as": "strict-serializable",
        })
    }

    fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        registry
            .register(Arc::new(ElleTxn { kind: self.kind, keys_per_shard: self.keys.per_shard }));
        registry
    }

    fn partitioner(&self) -> Partitioner {
        self.keys.partitioner()
    }

    fn load(&self, _shard: ShardId, _store: &mut MvccStore) {
        // Every list starts empty and every register unwritten: keys start absent.
    }

    fn generator(&self, client: u32, seed: u64) -> Box<dyn TxnGenerator> {
        Box::new(ElleGenerator {
            ops_max: self.ops_max,
            rng: child_rng(seed, "elle-client", u64::from(client)),
            keys: self.keys.clone(),
        })
    }

    fn checker(&self) -> Box<dyn InvariantCheck> {
        Box::new(ElleCheck::new(self.kind, self.keys.per_shard))
    }
}

struct ElleGenerator {
    ops_max: u64,
    rng: Rng,
    keys: ShardedKeys,
}

impl TxnGenerator for ElleGenerator {
    fn next(&mut self, request: RequestId) -> TxnRequest {
        let ops = (1 + uniform_u64(&mut self.rng, self.ops_max)).min(self.keys.items());
        let mut ids: Vec<u64> = Vec::new();
        let mut mops = Vec::new();
        for _ in 0..ops {
            let id = self.keys.draw_not_in(&mut self.rng, &ids);
            ids.push(id);
            let kind = uniform_u64(&mut self.rng, 2);
            mops.push(Datum::List(vec![Datum::Uint(kind), Datum::Uint(id)]));
        }
        TxnRequest { proc: ProcId(0), args: vec![Datum::List(mops), Datum::Uint(request.0)] }
    }
}

/// Parsed arguments: (kind, id) per micro-operation, and the request id.
fn parse(args: &Args) -> Result<(Vec<(u64, u64)>, u64), ProcError> {
    let bad = || ProcError::BadArgs("elle takes [[[kind, id]...], request]".into());
    let [Datum::List(mops), Datum::Uint(request)] = args.as_slice() else { return Err(bad()) };
    let mut parsed = Vec::with_capacity(mops.len());
    for mop in mops {
        match mop {
            Datum::List(pair) => match pair.as_slice() {
                [Datum::Uint(kind @ (READ | WRITE)), Datum::Uint(id)] => parsed.push((*kind, *id)),
                _ => return Err(bad()),
            },
            _ => return Err(bad()),
        }
    }
    Ok((parsed, *request))
}

#[derive(Debug)]
struct ElleTxn {
    kind: Kind,
    keys_per_shard: u64,
}

impl ElleTxn {
    fn shards(&self, mops: &[(u64, u64)]) -> Vec<u64> {
        crate::shards_of(mops.iter().map(|(_, id)| *id), self.keys_per_shard)
    }

    fn on_piece(&self, piece: u32, mops: &[(u64, u64)]) -> Result<Vec<(u64, u64)>, ProcError> {
        let shard = *self
            .shards(mops)
            .get(piece as usize)
            .ok_or_else(|| ProcError::BadArgs(format!("no piece {piece}")))?;
        Ok(mops.iter().copied().filter(|(_, id)| id / self.keys_per_shard == shard).collect())
    }
}

fn decode_list(value: Option<&[u8]>) -> Vec<u64> {
    value
        .map(|v| {
            v.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
        })
        .unwrap_or_default()
}

impl Procedure for ElleTxn {
    fn name(&self) -> &'static str {
        self.kind.name()
    }

    fn plan(&self, args: &Args, context: PlanContext<'_>) -> Result<Plan, ProcError> {
        let (mops, _) = parse(args)?;
        crate::piece_per_shard(self.shards(&mops), context, "an elle key")
    }

    fn keys(&self, piece: u32, args: &Args, _inputs: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let (mops, _) = parse(args)?;
        let here = self.on_piece(piece, &mops)?;
        // An append reads the list it extends; a register write is blind.
        let reads = here
            .iter()
            .filter(|(kind, _)| *kind == READ || self.kind == Kind::ListAppend)
            .map(|(_, id)| elle_key(*id))
            .collect();
        let writes =
            here.iter().filter(|(kind, _)| *kind == WRITE).map(|(_, id)| elle_key(*id)).collect();
        Ok(KeySet { reads, writes, scans: Vec::new() })
    }

    fn execute(
        &self,
        piece: u32,
        args: &Args,
        _inputs: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let (mops, request) = parse(args).map_err(|e| UserAbort(e.to_string()))?;
        let here = self.on_piece(piece, &mops).map_err(|e| UserAbort(e.to_string()))?;
        let mut values = reads.values.iter();
        let mut effects = PieceEffects::default();
        for (kind, id) in here {
            let read = if kind == READ || self.kind == Kind::ListAppend {
                values.next().ok_or_else(|| UserAbort("fewer reads than declared".into()))?
            } else {
                &None
            };
            match (self.kind, kind) {
                (Kind::ListAppend, READ) => effects.output.push(Datum::List(
                    decode_list(read.as_deref()).into_iter().map(Datum::Uint).collect(),
                )),
                (Kind::ListAppend, _) => {
                    let mut list = read.map(<[u8]>::to_vec).unwrap_or_default();
                    if list.len() / 8 >= LIST_ELEMENTS_MAX {
                        return Err(UserAbort(format!("list {id} is full")));
                    }
                    list.extend_from_slice(&request.to_le_bytes());
                    effects.writes.push(Write { key: elle_key(id), value: Some(list) });
                }
                (Kind::RwRegister, READ) => {
                    effects.output.push(match decode_list(read.as_deref()).first() {
                        Some(&v) => Datum::Uint(v),
                        None => Datum::List(Vec::new()),
                    })
                }
                (Kind::RwRegister, _) => effects
                    .writes
                    .push(Write { key: elle_key(id), value: Some(request.to_le_bytes().to_vec()) }),
            }
        }
        Ok(effects)
    }
}

/// Records the client-observed history and checks it (see the module documentation).
struct ElleCheck {
    kind: Kind,
    keys_per_shard: u64,
    /// (time, order among the client's events, client, type, mops); sorted at the end.
    events: Vec<(Time, u64, u64, OpType, Vec<RecordedMop>)>,
    dropped: u64,
    malformed: u64,
    /// Check for strict serializability (else serializability).
    strict: bool,
    /// The appends of acknowledged commits (key, element), up to [`HISTORY_OPS_MAX`].
    acknowledged: Vec<(u64, u64)>,
    /// Acknowledged appends beyond that.
    acknowledged_dropped: u64,
}

#[derive(Clone, Debug)]
enum RecordedMop {
    Append(u64, u64),
    Write(u64, u64),
    ReadList(u64, Option<Vec<u64>>),
    ReadRegister(u64, Option<Option<u64>>),
}

impl ElleCheck {
    fn new(kind: Kind, keys_per_shard: u64) -> Self {
        Self {
            kind,
            keys_per_shard,
            events: Vec::new(),
            dropped: 0,
            malformed: 0,
            strict: true,
            acknowledged: Vec::new(),
            acknowledged_dropped: 0,
        }
    }

    fn invocation(&self, mops: &[(u64, u64)], request: u64) -> Vec<RecordedMop> {
        mops.iter()
            .map(|&(kind, id)| match (self.kind, kind) {
                (Kind::ListAppend, READ) => RecordedMop::ReadList(id, None),
                (Kind::ListAppend, _) => RecordedMop::Append(id, request),
                (Kind::RwRegister, READ) => RecordedMop::ReadRegister(id, None),
                (Kind::RwRegister, _) => RecordedMop::Write(id, request),
            })
            .collect()
    }

    /// The completion's micro-operations: each read takes the next output of its shard's piece.
    fn completion(
        &self,
        mops: &[(u64, u64)],
        request: u64,
        outputs: &[PieceOutput],
    ) -> Option<Vec<RecordedMop>> {
        let shards = crate::shards_of(mops.iter().map(|(_, id)| *id), self.keys_per_shard);
        let mut next = vec![0usize; shards.len()];
        let mut recorded = self.invocation(mops, request);
        for (mop, &(kind, id)) in recorded.iter_mut().zip(mops) {
            if kind != READ {
                continue;
            }
            let piece = shards.binary_search(&(id / self.keys_per_shard)).ok()?;
            let datum = outputs.get(piece)?.get(next[piece])?;
            next[piece] += 1;
            *mop = match (self.kind, datum) {
                (Kind::ListAppend, Datum::List(items)) => RecordedMop::ReadList(
                    id,
                    Some(items.iter().map(Datum::as_uint).collect::<Option<Vec<_>>>()?),
                ),
                (Kind::RwRegister, Datum::Uint(v)) => RecordedMop::ReadRegister(id, Some(Some(*v))),
                (Kind::RwRegister, Datum::List(empty)) if empty.is_empty() => {
                    RecordedMop::ReadRegister(id, Some(None))
                }
                _ => return None,
            };
        }
        Some(recorded)
    }

    fn record(
        &mut self,
        time: Time,
        order: u64,
        process: u64,
        kind: OpType,
        mops: Vec<RecordedMop>,
    ) {
        if self.events.len() >= HISTORY_OPS_MAX {
            self.dropped += 1;
            return;
        }
        self.events.push((time, order, process, kind, mops));
    }

    fn history(&self) -> History {
        let mut events: Vec<_> = self.events.iter().collect();
        // Time order, each client's events in its own order. Equal times say nothing about
        // real-time order: the checker orders two transactions only when one completed strictly
        // before the other was invoked.
        events.sort_by_key(|(time, order, client, _, _)| (*time, *client, *order));
        let mut builder = HistoryBuilder::new();
        // A client whose request was never answered goes on as a new process (the Jepsen
        // convention), so its open invocation stays unknown: process = epoch << 32 | client.
        let mut epochs: BTreeMap<u64, (u64, bool)> = BTreeMap::new();
        for (time, _, client, kind, mops) in events {
            let (epoch, open) = epochs.entry(*client).or_insert((0, false));
            if *kind == OpType::Invoke {
                if *open {
                    *epoch += 1;
                }
                *open = true;
            } else {
                *open = false;
            }
            let process = (*epoch << 32) | *client;
            let mops = mops
                .iter()
                .map(|m| match m {
                    RecordedMop::Append(k, v) => {
                        Mop::Append { key: builder.key(KeyName::Int(*k as i64)), value: *v as i64 }
                    }
                    RecordedMop::Write(k, v) => {
                        Mop::Write { key: builder.key(KeyName::Int(*k as i64)), value: *v as i64 }
                    }
                    RecordedMop::ReadList(k, list) => Mop::ReadList {
                        key: builder.key(KeyName::Int(*k as i64)),
                        list: list.as_ref().map(|l| l.iter().map(|&e| e as i64).collect()),
                    },
                    RecordedMop::ReadRegister(k, value) => Mop::ReadRegister {
                        key: builder.key(KeyName::Int(*k as i64)),
                        value: value.map(|v| v.map(|x| x as i64)),
                    },
                })
                .collect();
            builder.push(process, *kind, Some(*time), mops);
        }
        builder.finish()
    }
}

/// A client's events in order: its `n`-th request's invocation, then its completion.
fn client_order(request: u64, completion: bool) -> u64 {
    2 * (request & REQUEST_COUNTER_MASK) + u64::from(completion)
}

impl InvariantCheck for ElleCheck {
    fn observe(&mut self, completion: &Completion) {
        let Ok((mops, request)) = parse(&completion.txn.args) else {
            self.malformed += 1;
            return;
        };
        let process = u64::from(completion.client);
        let invoked = self.invocation(&mops, request);
        if completion.outcome.result == TxnResult::Committed && self.kind == Kind::ListAppend {
            for &(_, id) in mops.iter().filter(|(kind, _)| *kind != READ) {
                if self.acknowledged.len() < HISTORY_OPS_MAX {
                    self.acknowledged.push((id, request));
                } else {
                    self.acknowledged_dropped += 1;
                }
            }
        }
        let (kind, completed) = match &completion.outcome.result {
            // Committed, but the reads were lost with the reply: its writes count, its reads
            // are unknown, which is what `info` says.
            TxnResult::Committed if completion.outcome.outputs.is_empty() => {
                (OpType::Info, invoked.clone())
            }
            TxnResult::Committed => {
                match self.completion(&mops, request, &completion.outcome.outputs) {
                    Some(done) => (OpType::Ok, done),
                    None => {
                        self.malformed += 1;
                        return;
                    }
                }
            }
            result if !result.certainly_not_committed() => (OpType::Info, invoked.clone()),
            TxnResult::UserAborted(_) | TxnResult::Failed(_) => (OpType::Fail, invoked.clone()),
        };
        let (first, then) = (client_order(request, false), client_order(request, true));
        self.record(completion.submitted_at, first, process, OpType::Invoke, invoked);
        self.record(completion.completed_at, then, process, kind, completed);
    }

    fn unanswered(
        &mut self,
        client: u32,
        _request: RequestId,
        txn: &TxnRequest,
        submitted_at: Time,
    ) {
        let Ok((mops, request)) = parse(&txn.args) else { return };
        let invoked = self.invocation(&mops, request);
        let order = client_order(request, false);
        self.record(submitted_at, order, u64::from(client), OpType::Invoke, invoked);
    }

    fn check(&self, _stores: &[(ShardId, &MvccStore)]) -> Vec<CheckResult> {
        let name = format!("elle-{}", self.kind.name());
        if self.malformed > 0 || self.dropped > 0 {
            return vec![CheckResult {
                name,
                passed: false,
                detail: format!(
                    "history incomplete: {} completions could not be read back, {} operations beyond the {HISTORY_OPS_MAX} recorded",
                    self.malformed, self.dropped
                ),
            }];
        }
        let history = self.history();
        let consistency =
            if self.strict { Consistency::StrictSerializable } else { Consistency::Serializable };
        let (passed, detail) = match check(&history, self.kind.model(), consistency) {
            Ok((report, _)) if report.valid => (
                true,
                format!(
                    "{}: {} committed, {} failed, {} unknown; {} ww, {} wr, {} rw, {} realtime edges; no anomaly",
                    consistency.name(), report.txns[0], report.txns[1], report.txns[2],
                    report.edges[0], report.edges[1], report.edges[2], report.edges[3]
                ),
            ),
            Ok((report, txns)) => {
                let text = report.render(&history, &txns);
                (false, text.lines().take(12).collect::<Vec<_>>().join(" | "))
            }
            Err(e) => (false, format!("recorded history refused: {e}")),
        };
        vec![CheckResult { name, passed, detail }]
    }

    fn needs_stores(&self) -> bool {
        false
    }

    fn expect_strict(&mut self, strict: bool) {
        self.strict = strict;
    }

    fn history_json(&self) -> Option<String> {
        Some(self.history().to_json())
    }

    fn acknowledged_missing(&self, stores: &[(ShardId, &MvccStore)]) -> Option<Vec<String>> {
        if self.kind != Kind::ListAppend || self.acknowledged_dropped > 0 {
            return None;
        }
        let mut lists: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        let mut missing = Vec::new();
        for &(id, element) in &self.acknowledged {
            let shard = ShardId((id / self.keys_per_shard) as u32);
            let Some((_, store)) = stores.iter().find(|(s, _)| *s == shard) else { continue };
            let list = lists.entry(id).or_insert_with(|| {
                let latest = store.read_latest(&elle_key(id));
                decode_list(latest.and_then(|v| v.value.as_deref()))
            });
            if !list.contains(&element) {
                missing.push(format!("key {id} element {element}"));
            }
        }
        Some(missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::txn::TxnOutcome;
    use meridian_core::NodeId;

    fn workload(kind: Kind) -> ElleWorkload {
        ElleWorkload::new(
            kind,
            &WorkloadOptions {
                shards: 2,
                keys_per_shard: 3,
                zipf_theta: None,
                ops_max: None,
                distribution: None,
                region_groups: None,
                tpcc: Default::default(),
            },
        )
        .expect("valid")
    }

    /// What a serial run leaves: the checker that saw it, its requests and the final store.
    type SerialRun = (Box<dyn InvariantCheck>, Vec<TxnRequest>, BTreeMap<Key, Vec<u8>>);

    /// Runs transactions one after another against in-memory maps, as a serial database would.
    fn serial_run(kind: Kind, txns: u64) -> SerialRun {
        let w = workload(kind);
        let registry = w.registry();
        let partitioner = w.partitioner();
        let mut generator = w.generator(0, 9);
        let mut store: BTreeMap<Key, Vec<u8>> = Default::default();
        let mut check = w.checker();
        let mut all = Vec::new();
        for r in 0..txns {
            let txn = generator.next(RequestId(r));
            let procedure = registry.get(txn.proc).expect("registered");
            let plan =
                procedure.plan(&txn.args, PlanContext { partitioner: &partitioner }).unwrap();
            let mut outputs = Vec::new();
            for piece in 0..plan.len() as u32 {
                let keys = procedure.keys(piece, &txn.args, &[]).unwrap();
                let reads = Reads {
                    values: keys.reads.iter().map(|k| store.get(k).map(Vec::as_slice)).collect(),
                    scans: Vec::new(),
                };
                let effects = procedure.execute(piece, &txn.args, &[], &reads).unwrap();
                for write in effects.writes {
                    store.insert(write.key, write.value.unwrap());
                }
                outputs.push(effects.output);
            }
            check.observe(&Completion {
                client: (r % 3) as u32,
                coordinator: NodeId(0),
                request: RequestId(r),
                txn: txn.clone(),
                submitted_at: 10 * r,
                completed_at: 10 * r + 5,
                outcome: TxnOutcome {
                    result: TxnResult::Committed,
                    outputs,
                    commit_ts: None,
                    retries: 0,
                    shards_touched: plan.len() as u32,
                    path: meridian_core::txn::CommitPath::None,
                    aborts: Default::default(),
                    speculative_ns: None,
                },
                wan_hops: None,
            });
            all.push(txn);
        }
        (check, all, store)
    }

    #[test]
    fn a_serial_execution_passes_and_exports_a_parsable_history() {
        for kind in [Kind::ListAppend, Kind::RwRegister] {
            let (check, _, _) = serial_run(kind, 300);
            let results = check.check(&[]);
            assert!(results[0].passed, "{kind:?}: {}", results[0].detail);
            let json = check.history_json().expect("recorded");
            let parsed = History::parse(&json, kind.model()).expect("export parses");
            assert_eq!(parsed.ops.len(), 600);
        }
    }

    #[test]
    fn a_lost_append_is_caught() {
        // Replay the serial run, but report one committed append's reads as if another
        // transaction's append had vanished: drop the last element of every read of one key.
        let w = workload(Kind::ListAppend);
        let (check, txns, _) = serial_run(Kind::ListAppend, 200);
        let mut tampered = w.checker();
        let json = check.history_json().unwrap();
        let history = History::parse(&json, Kind::ListAppend.model()).unwrap();
        // Feed the history back with every read of key 0 truncated by one element when long.
        for (i, txn) in txns.iter().enumerate() {
            let complete = history.ops.iter().filter(|op| op.kind == OpType::Ok).nth(i).unwrap();
            let (mops, _) = parse(&txn.args).unwrap();
            let mut outputs: Vec<PieceOutput> = vec![Vec::new(); 2];
            let shards: Vec<u64> = {
                let mut s: Vec<u64> = mops.iter().map(|(_, id)| id / 3).collect();
                s.sort_unstable();
                s.dedup();
                s
            };
            for (mop, &(kind, id)) in complete.mops.iter().zip(&mops) {
                if kind != READ {
                    continue;
                }
                let Mop::ReadList { list: Some(list), .. } = mop else { panic!("a read") };
                let mut list: Vec<u64> = list.iter().map(|&e| e as u64).collect();
                if id == 0 && list.len() >= 2 {
                    list.remove(list.len() - 2);
                }
                let piece = shards.binary_search(&(id / 3)).unwrap();
                outputs[piece].push(Datum::List(list.into_iter().map(Datum::Uint).collect()));
            }
            outputs.truncate(shards.len());
            tampered.observe(&Completion {
                client: 0,
                coordinator: NodeId(0),
                request: RequestId(i as u64),
                txn: txn.clone(),
                submitted_at: 10 * i as u64,
                completed_at: 10 * i as u64 + 5,
                outcome: TxnOutcome {
                    result: TxnResult::Committed,
                    outputs,
                    commit_ts: None,
                    retries: 0,
                    shards_touched: 1,
                    path: meridian_core::txn::CommitPath::None,
                    aborts: Default::default(),
                    speculative_ns: None,
                },
                wan_hops: None,
            });
        }
        let results = tampered.check(&[]);
        assert!(!results[0].passed, "a read that skips an element must fail the check");
    }

    #[test]
    fn an_acknowledged_append_missing_from_the_final_store_is_named() {
        let (check, _, finished) = serial_run(Kind::ListAppend, 200);
        let stores_of = |map: &BTreeMap<Key, Vec<u8>>| {
            let mut stores = vec![(ShardId(0), MvccStore::new()), (ShardId(1), MvccStore::new())];
            for (key, value) in map {
                let id = u64::from_be_bytes(key.as_bytes()[1..9].try_into().unwrap());
                stores[(id / 3) as usize].1.load(key.clone(), value.clone());
            }
            stores
        };
        let whole = stores_of(&finished);
        let borrowed: Vec<(ShardId, &MvccStore)> = whole.iter().map(|(s, m)| (*s, m)).collect();
        assert_eq!(check.acknowledged_missing(&borrowed), Some(Vec::new()));
        // Drop the last element of key 4's list: that append was acknowledged, and is gone.
        let mut lossy = finished.clone();
        let list = lossy.get_mut(&elle_key(4)).expect("key 4 was appended to");
        let last = u64::from_le_bytes(list[list.len() - 8..].try_into().unwrap());
        list.truncate(list.len() - 8);
        let lossy = stores_of(&lossy);
        let borrowed: Vec<(ShardId, &MvccStore)> = lossy.iter().map(|(s, m)| (*s, m)).collect();
        let missing = check.acknowledged_missing(&borrowed).expect("list-append can tell");
        assert_eq!(missing, [format!("key 4 element {last}")]);
        // A register's later write hides an earlier one: it cannot tell.
        let (register, _, _) = serial_run(Kind::RwRegister, 50);
        assert_eq!(register.acknowledged_missing(&borrowed), None);
    }
}
