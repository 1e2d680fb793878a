//! `micro-luigi`: the Luigi study's microbenchmark. Each transaction has 10 operations, half of
//! them reads and half blind writes, on distinct keys spread over every shard: operation `i`
//! goes to shard `i mod shards`, so with 2 shards every transaction is cross-shard. Keys within
//! a shard are chosen uniformly or with Zipf skew.
//!
//! Keys are `table 1 ‖ id:u64`, shard `id / keys_per_shard`. A written value is
//! `request:u64le ‖ id:u64le`, unique per (request, key), so a read names its writer.
//!
//! Invariant (`micro-last-writer`): after the run, every key holds the value of the committed
//! transaction with the highest commit timestamp among those that wrote it, and keys nobody
//! committed a write to are absent. It catches lost writes, writes of aborted transactions and
//! commit timestamps out of order with the installed versions. Two writers committed at one
//! timestamp (tiga and luigi order such conflicting transactions by id, which replies do not
//! carry) are a tie: the key may hold either's value, and the report counts the ties.

use crate::dist::KeyDist;
use crate::{CheckResult, Completion, InvariantCheck, TxnGenerator, Workload, WorkloadOptions};
use meridian_core::hash::FixedHashMap;
use meridian_core::key::Key;
use meridian_core::rng::{child_rng, Rng};
use meridian_core::txn::{
    Args, Datum, KeySet, Partitioner, PieceEffects, PieceOutput, PieceSpec, Plan, PlanContext,
    ProcError, Procedure, Reads, Registry, ShardTarget, TxnRequest, TxnResult, UserAbort, Write,
};
use meridian_core::{ConfigError, RequestId, ShardId, Timestamp};
use meridian_storage::MvccStore;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The table byte of micro keys.
pub const MICRO_TABLE: u8 = 1;
/// Operations per transaction.
pub const MICRO_OPS: usize = 10;
/// Reads per transaction (the rest are writes).
pub const MICRO_READS: usize = 5;

const _: () = assert!(MICRO_READS <= MICRO_OPS);

/// The key of micro item `id`.
pub fn micro_key(id: u64) -> Key {
    Key::table(MICRO_TABLE).u64(id).build()
}

/// The value request `request` writes to item `id`.
pub fn micro_value(request: u64, id: u64) -> Vec<u8> {
    let mut value = Vec::with_capacity(16);
    value.extend_from_slice(&request.to_le_bytes());
    value.extend_from_slice(&id.to_le_bytes());
    value
}

/// The workload.
#[derive(Debug)]
pub struct MicroLuigi {
    shards: u32,
    keys_per_shard: u64,
    dist: KeyDist,
}

impl MicroLuigi {
    /// Checks the options and builds the workload.
    pub fn new(options: &WorkloadOptions) -> Result<Self, ConfigError> {
        if options.shards == 0 {
            return Err(ConfigError::new("micro-luigi needs at least one shard"));
        }
        if options.keys_per_shard < MICRO_OPS as u64 {
            return Err(ConfigError::new(format!(
                "micro-luigi needs at least {MICRO_OPS} keys per shard, got {}",
                options.keys_per_shard
            )));
        }
        let dist = KeyDist::new(options.keys_per_shard, options.zipf_theta)?;
        Ok(Self { shards: options.shards, keys_per_shard: options.keys_per_shard, dist })
    }
}

impl Workload for MicroLuigi {
    fn name(&self) -> &'static str {
        "micro-luigi"
    }

    fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "name": "micro-luigi",
            "ops_per_txn": MICRO_OPS,
            "reads_per_txn": MICRO_READS,
            "keys_per_shard": self.keys_per_shard,
            "distribution": match &self.dist { KeyDist::Uniform { .. } => "uniform".to_string(), KeyDist::Zipf(_) => "zipf".to_string() },
        })
    }

    fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        registry.register(Arc::new(MicroTxn { keys_per_shard: self.keys_per_shard }));
        registry
    }

    fn partitioner(&self) -> Partitioner {
        crate::leading_int_partitioner(self.shards, self.keys_per_shard)
    }

    fn load(&self, _shard: ShardId, _store: &mut MvccStore) {
        // Keys start absent: a read of an absent key is a valid read of the initial state.
    }

    fn generator(&self, client: u32, seed: u64) -> Box<dyn TxnGenerator> {
        Box::new(MicroGenerator {
            rng: child_rng(seed, "micro-client", u64::from(client)),
            shards: self.shards,
            keys_per_shard: self.keys_per_shard,
            dist: self.dist.clone(),
        })
    }

    fn checker(&self) -> Box<dyn InvariantCheck> {
        Box::new(MicroCheck::new("micro-last-writer", micro_writes))
    }
}

/// Generates micro transactions for one client.
struct MicroGenerator {
    rng: Rng,
    shards: u32,
    keys_per_shard: u64,
    dist: KeyDist,
}

impl TxnGenerator for MicroGenerator {
    fn next(&mut self, request: RequestId) -> TxnRequest {
        let ids = self.dist.distinct_over_shards(
            &mut self.rng,
            self.shards,
            self.keys_per_shard,
            MICRO_OPS,
        );
        let (reads, writes) = ids.split_at(MICRO_READS);
        TxnRequest {
            proc: meridian_core::txn::ProcId(0),
            args: vec![
                Datum::List(reads.iter().map(|&id| Datum::Uint(id)).collect()),
                Datum::List(writes.iter().map(|&id| Datum::Uint(id)).collect()),
                Datum::Uint(request.0),
            ],
        }
    }
}

/// The one micro procedure: a piece per shard touched.
#[derive(Debug)]
struct MicroTxn {
    keys_per_shard: u64,
}

struct MicroArgs<'a> {
    reads: &'a [Datum],
    writes: &'a [Datum],
    request: u64,
}

fn parse(args: &Args) -> Result<MicroArgs<'_>, ProcError> {
    match args.as_slice() {
        [Datum::List(reads), Datum::List(writes), Datum::Uint(request)] => {
            if reads.iter().chain(writes).any(|d| d.as_uint().is_none()) {
                return Err(ProcError::BadArgs("micro ids must be unsigned integers".into()));
            }
            Ok(MicroArgs { reads, writes, request: *request })
        }
        _ => Err(ProcError::BadArgs("micro takes [reads list, writes list, request]".into())),
    }
}

impl MicroTxn {
    fn shard_of(&self, id: u64) -> u32 {
        (id / self.keys_per_shard) as u32
    }

    /// The shards touched, in order: piece `i` is the `i`-th of them.
    fn shards(&self, args: &MicroArgs<'_>) -> Vec<u32> {
        let mut shards: Vec<u32> = args
            .reads
            .iter()
            .chain(args.writes)
            .filter_map(Datum::as_uint)
            .map(|id| self.shard_of(id))
            .collect();
        shards.sort_unstable();
        shards.dedup();
        shards
    }

    fn ids_on<'a>(&self, list: &'a [Datum], shard: u32) -> impl Iterator<Item = u64> + 'a {
        let keys_per_shard = self.keys_per_shard;
        list.iter()
            .filter_map(Datum::as_uint)
            .filter(move |&id| (id / keys_per_shard) as u32 == shard)
    }

    fn piece_shard(&self, piece: u32, args: &MicroArgs<'_>) -> Result<u32, ProcError> {
        self.shards(args)
            .get(piece as usize)
            .copied()
            .ok_or_else(|| ProcError::BadArgs(format!("no piece {piece}")))
    }
}

impl Procedure for MicroTxn {
    fn name(&self) -> &'static str {
        "micro"
    }

    fn plan(&self, args: &Args, context: PlanContext<'_>) -> Result<Plan, ProcError> {
        let args = parse(args)?;
        let shards = self.shards(&args);
        if let Some(&bad) = shards.iter().find(|&&s| s >= context.partitioner.shards()) {
            return Err(ProcError::BadArgs(format!("micro id on shard {bad}, beyond the cluster")));
        }
        Ok(shards
            .into_iter()
            .map(|s| PieceSpec { target: ShardTarget::Shard(ShardId(s)), deps: Vec::new() })
            .collect())
    }

    fn keys(&self, piece: u32, args: &Args, _inputs: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let args = parse(args)?;
        let shard = self.piece_shard(piece, &args)?;
        Ok(KeySet {
            reads: self.ids_on(args.reads, shard).map(micro_key).collect(),
            writes: self.ids_on(args.writes, shard).map(micro_key).collect(),
            scans: Vec::new(),
        })
    }

    fn execute(
        &self,
        piece: u32,
        args: &Args,
        _inputs: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let args = parse(args).map_err(|e| UserAbort(e.to_string()))?;
        let shard = self.piece_shard(piece, &args).map_err(|e| UserAbort(e.to_string()))?;
        let writes = self
            .ids_on(args.writes, shard)
            .map(|id| Write { key: micro_key(id), value: Some(micro_value(args.request, id)) })
            .collect();
        let found = reads.values.iter().filter(|v| v.is_some()).count() as u64;
        Ok(PieceEffects { writes, output: vec![Datum::Uint(found)] })
    }
}

/// The request and the items a transaction's arguments write, for [`MicroCheck`].
pub type WritesOf = fn(&Args) -> Option<(u64, Vec<u64>)>;

fn micro_writes(args: &Args) -> Option<(u64, Vec<u64>)> {
    let args = parse(args).ok()?;
    Some((args.request, args.writes.iter().filter_map(Datum::as_uint).collect()))
}

/// Writers tied at an item's highest timestamp that [`MicroCheck`] remembers; beyond it a
/// further tied writer's value is reported as unexpected.
pub const TIES_MAX: usize = 16;

/// The last-writer invariant (see the module documentation), for any workload whose keys are
/// `table ‖ id:u64` and whose written values start with [`micro_value`] of their writer.
#[derive(Debug)]
pub struct MicroCheck {
    name: &'static str,
    writes_of: WritesOf,
    // Looked up per commit (hot); only the final report sorts it.
    last: FixedHashMap<u64, (Timestamp, u64)>,
    committed: u64,
    /// Per item, other writers committed at its highest timestamp (at most [`TIES_MAX`]).
    tied: FixedHashMap<u64, Vec<u64>>,
    ties_total: u64,
    /// Items written by requests of unknown outcome, and those requests: any of them may hold
    /// the item's latest value.
    unknown: FixedHashMap<u64, Vec<u64>>,
}

impl MicroCheck {
    /// A check named `name` reading what each transaction writes with `writes_of`.
    pub fn new(name: &'static str, writes_of: WritesOf) -> Self {
        Self {
            name,
            writes_of,
            last: FixedHashMap::default(),
            committed: 0,
            tied: FixedHashMap::default(),
            ties_total: 0,
            unknown: FixedHashMap::default(),
        }
    }
}

impl InvariantCheck for MicroCheck {
    fn observe(&mut self, completion: &Completion) {
        let (txn, outcome) = (&completion.txn, &completion.outcome);
        let (TxnResult::Committed, Some(ts)) = (&outcome.result, outcome.commit_ts) else {
            return;
        };
        let Some((request, writes)) = (self.writes_of)(&txn.args) else { return };
        self.committed += 1;
        for id in writes {
            let entry = self.last.entry(id).or_insert((Timestamp::ZERO, u64::MAX));
            if ts == entry.0 {
                self.ties_total += 1;
                let tied = self.tied.entry(id).or_default();
                if tied.len() < TIES_MAX {
                    tied.push(request);
                }
            }
            if ts > entry.0 {
                *entry = (ts, request);
                self.tied.remove(&id);
            }
        }
    }

    fn unanswered(
        &mut self,
        _client: u32,
        _request: RequestId,
        txn: &TxnRequest,
        _submitted_at: meridian_core::Time,
    ) {
        let Some((request, writes)) = (self.writes_of)(&txn.args) else { return };
        for id in writes {
            self.unknown.entry(id).or_default().push(request);
        }
    }

    fn check(&self, stores: &[(ShardId, &MvccStore)]) -> Vec<CheckResult> {
        let mut problems: Vec<String> = Vec::new();
        let mut keys_checked = 0u64;
        let mut expected_keys: BTreeMap<u64, (Timestamp, u64)> =
            self.last.iter().map(|(&k, &v)| (k, v)).collect();
        for (shard, store) in stores {
            for (key, version) in store.latest_values() {
                let mut reader = key.reader();
                let Ok(id) = reader.u64() else {
                    problems.push(format!("shard {}: undecodable key {key:?}", shard.0));
                    continue;
                };
                keys_checked += 1;
                let value = version.value.as_deref().unwrap_or_default();
                let unknown_writer = self
                    .unknown
                    .get(&id)
                    .is_some_and(|rs| rs.iter().any(|&r| value.starts_with(&micro_value(r, id))));
                let tied_writer = self
                    .tied
                    .get(&id)
                    .is_some_and(|rs| rs.iter().any(|&r| value.starts_with(&micro_value(r, id))));
                match expected_keys.remove(&id) {
                    _ if unknown_writer || tied_writer => {}
                    Some((_, request)) if value.starts_with(&micro_value(request, id)) => {}
                    Some((ts, request)) => problems.push(format!(
                        "item {id}: holds {value:?}, expected the write of request {request} (commit ts {})",
                        ts.0
                    )),
                    None => problems.push(format!("item {id}: holds {value:?} but no committed transaction wrote it")),
                }
            }
        }
        for (id, (_, request)) in expected_keys.iter().take(5) {
            problems.push(format!("item {id}: committed write of request {request} is missing"));
        }
        let missing = expected_keys.len();
        let passed = problems.is_empty();
        let detail = if passed {
            let ties = match self.ties_total {
                0 => String::new(),
                n => format!(" ({n} writes tied at one timestamp: either writer's value passes)"),
            };
            format!(
                "{keys_checked} keys hold the last committed write of {} commits{ties}",
                self.committed
            )
        } else {
            format!(
                "{} problems ({missing} writes missing); first: {}",
                problems.len() + missing.saturating_sub(5),
                problems[..problems.len().min(5)].join("; ")
            )
        };
        vec![CheckResult { name: self.name.into(), passed, detail }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::txn::TxnOutcome;
    use meridian_core::{NodeId, TxnId};
    use meridian_storage::VersionState;

    fn workload(shards: u32) -> MicroLuigi {
        MicroLuigi::new(&WorkloadOptions {
            shards,
            keys_per_shard: 1_000,
            zipf_theta: Some(0.9),
            ops_max: None,
            distribution: None,
            region_groups: None,
            tpcc: Default::default(),
        })
        .unwrap()
    }

    #[test]
    fn transactions_touch_every_shard_with_distinct_keys() {
        let w = workload(2);
        let mut generator = w.generator(0, 7);
        let registry = w.registry();
        let partitioner = w.partitioner();
        for request in 0..500 {
            let txn = generator.next(RequestId(request));
            let args = parse(&txn.args).unwrap();
            assert_eq!(
                (args.reads.len(), args.writes.len()),
                (MICRO_READS, MICRO_OPS - MICRO_READS)
            );
            let mut ids: Vec<u64> =
                args.reads.iter().chain(args.writes).filter_map(Datum::as_uint).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), MICRO_OPS, "distinct keys");
            let procedure = registry.get(txn.proc).unwrap();
            let plan =
                procedure.plan(&txn.args, PlanContext { partitioner: &partitioner }).unwrap();
            assert_eq!(plan.len(), 2, "every transaction touches both shards");
            for (piece, spec) in plan.iter().enumerate() {
                let keys = procedure.keys(piece as u32, &txn.args, &[]).unwrap();
                let ShardTarget::Shard(shard) = spec.target else {
                    panic!("micro pieces are bound")
                };
                assert!(keys
                    .reads
                    .iter()
                    .chain(&keys.writes)
                    .all(|k| partitioner.allows(shard, k)));
            }
        }
    }

    #[test]
    fn generators_are_deterministic_per_seed_and_client() {
        let w = workload(2);
        let draw = |client, seed| {
            (0..20).map(|r| w.generator(client, seed).next(RequestId(r))).collect::<Vec<_>>()
        };
        assert_eq!(draw(1, 5), draw(1, 5));
        assert_ne!(draw(1, 5), draw(2, 5));
    }

    #[test]
    fn last_writer_check_passes_on_a_correct_store_and_fails_on_corruption() {
        let w = workload(1);
        let mut check = w.checker();
        let mut store = MvccStore::new();
        let txn = |request: u64, writes: &[u64]| TxnRequest {
            proc: meridian_core::txn::ProcId(0),
            args: vec![
                Datum::List(vec![]),
                Datum::List(writes.iter().map(|&i| Datum::Uint(i)).collect()),
                Datum::Uint(request),
            ],
        };
        let commit = |ts| TxnOutcome {
            result: TxnResult::Committed,
            outputs: vec![],
            commit_ts: Some(Timestamp(ts)),
            retries: 0,
            shards_touched: 1,
            path: meridian_core::txn::CommitPath::None,
            aborts: Default::default(),
            speculative_ns: None,
        };
        // Request 2 commits after request 1 in timestamp order although it completes first.
        let done = |txn: TxnRequest, outcome: TxnOutcome| Completion {
            client: 0,
            coordinator: NodeId(0),
            request: RequestId(0),
            txn,
            submitted_at: 0,
            completed_at: 0,
            outcome,
            wan_hops: None,
        };
        check.observe(&done(txn(2, &[5, 6]), commit(20)));
        check.observe(&done(txn(1, &[5]), commit(10)));
        check.observe(&done(
            txn(3, &[7]),
            TxnOutcome::failed(meridian_core::txn::TxnFailure::RetriesExhausted),
        ));
        let writer = TxnId { origin: NodeId(0), incarnation: 0, seq: 1 };
        for (id, request, ts) in [(5, 1, 10), (5, 2, 20), (6, 2, 20)] {
            store
                .write(
                    micro_key(id),
                    Timestamp(ts),
                    Some(micro_value(request, id)),
                    writer,
                    VersionState::Committed,
                )
                .unwrap();
        }
        let results = check.check(&[(ShardId(0), &store)]);
        assert!(results[0].passed, "{:?}", results);
        // A lost write: the newest version of item 6 disappears.
        let mut lost = MvccStore::new();
        lost.write(
            micro_key(5),
            Timestamp(20),
            Some(micro_value(2, 5)),
            writer,
            VersionState::Committed,
        )
        .unwrap();
        let results = check.check(&[(ShardId(0), &lost)]);
        assert!(!results[0].passed && results[0].detail.contains("item 6"), "{:?}", results);
        // An aborted write visible: item 7 was written by a failed request.
        store
            .write(
                micro_key(7),
                Timestamp(30),
                Some(micro_value(3, 7)),
                writer,
                VersionState::Committed,
            )
            .unwrap();
        let results = check.check(&[(ShardId(0), &store)]);
        assert!(!results[0].passed && results[0].detail.contains("item 7"), "{:?}", results);
        // Had request 3 never been answered (its coordinator crashed), its write may stand.
        check.unanswered(0, RequestId(3), &txn(3, &[7]), 0);
        let results = check.check(&[(ShardId(0), &store)]);
        assert!(results[0].passed, "{:?}", results);
        // Requests 4 and 5 both commit item 8 at timestamp 40 (tiga orders them by id): the
        // item may hold either's write, not an older one's.
        check.observe(&done(txn(4, &[8]), commit(40)));
        check.observe(&done(txn(5, &[8]), commit(40)));
        check.observe(&done(txn(6, &[8]), commit(35)));
        for (request, passes) in [(4, true), (5, true), (6, false)] {
            let mut tied = MvccStore::new();
            for (id, request, ts) in [(5, 2, 20), (6, 2, 20), (7, 3, 30), (8, request, 40)] {
                let value = Some(micro_value(request, id));
                tied.write(micro_key(id), Timestamp(ts), value, writer, VersionState::Committed)
                    .unwrap();
            }
            let results = check.check(&[(ShardId(0), &tied)]);
            assert_eq!(results[0].passed, passes, "request {request}: {results:?}");
            if passes {
                assert!(results[0].detail.contains("1 writes tied"), "{results:?}");
            }
        }
    }
}
