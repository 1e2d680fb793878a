//! `micro-tiga`: the Tiga study's MicroBench. Each transaction increments three counters, one
//! on each of three different shards (operation `i` on shard `i mod shards`, so with fewer than
//! three shards some share one), each a read-modify-write. Keys within a shard are chosen
//! uniformly or with Zipf skew (`--zipf`, the study sweeps 0.5–0.99); the study loads 1M keys
//! per shard (`--keys-per-shard 1000000`).
//!
//! Keys are `table 4 ‖ id:u64`, shard `id / keys_per_shard`; a counter is a `u64`
//! little-endian, absent meaning 0. Each piece outputs the values it wrote.
//!
//! Invariant (`tiga-counters`, on the final stores): every counter equals the number of
//! committed transactions that incremented it, plus at most the number of never-answered ones
//! (whose outcome is unknown) that did. A lost update, a doubled commit or a write of an aborted
//! transaction changes some counter.

use crate::dist::KeyDist;
use crate::{CheckResult, Completion, InvariantCheck, TxnGenerator, Workload, WorkloadOptions};
use meridian_core::hash::FixedHashMap;
use meridian_core::key::Key;
use meridian_core::rng::{child_rng, Rng};
use meridian_core::txn::{
    Args, Datum, KeySet, Partitioner, PieceEffects, PieceOutput, Plan, PlanContext, ProcError,
    ProcId, Procedure, Reads, Registry, TxnRequest, TxnResult, UserAbort, Write,
};
use meridian_core::{ConfigError, RequestId, ShardId};
use meridian_storage::MvccStore;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The table byte of counters.
pub const TIGA_TABLE: u8 = 4;
/// Increments per transaction.
pub const TIGA_OPS: usize = 3;
/// Draws spent looking for a key not yet in the transaction.
const DISTINCT_DRAWS_MAX: u32 = 100;

/// The key of counter `id`.
pub fn counter_key(id: u64) -> Key {
    Key::table(TIGA_TABLE).u64(id).build()
}

fn counter_of(value: Option<&[u8]>) -> Option<u64> {
    match value {
        None => Some(0),
        Some(v) => Some(u64::from_le_bytes(v.try_into().ok()?)),
    }
}

/// The workload.
#[derive(Debug)]
pub struct MicroTiga {
    shards: u32,
    keys_per_shard: u64,
    dist: KeyDist,
}

impl MicroTiga {
    /// Checks the options and builds the workload.
    pub fn new(options: &WorkloadOptions) -> Result<Self, ConfigError> {
        if options.shards == 0 {
            return Err(ConfigError::new("micro-tiga needs at least one shard"));
        }
        if options.keys_per_shard < TIGA_OPS as u64 {
            return Err(ConfigError::new(format!(
                "micro-tiga needs at least {TIGA_OPS} keys per shard, got {}",
                options.keys_per_shard
            )));
        }
        let dist = KeyDist::new(options.keys_per_shard, options.zipf_theta)?;
        Ok(Self { shards: options.shards, keys_per_shard: options.keys_per_shard, dist })
    }
}

impl Workload for MicroTiga {
    fn name(&self) -> &'static str {
        "micro-tiga"
    }

    fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "name": "micro-tiga",
            "increments_per_txn": TIGA_OPS,
            "keys_per_shard": self.keys_per_shard,
            "distribution": match &self.dist { KeyDist::Uniform { .. } => "uniform".to_string(), KeyDist::Zipf(z) => format!("zipf {}", z.theta()) },
        })
    }

    fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        registry.register(Arc::new(Increments { keys_per_shard: self.keys_per_shard }));
        registry
    }

    fn partitioner(&self) -> Partitioner {
        crate::leading_int_partitioner(self.shards, self.keys_per_shard)
    }

    fn load(&self, _shard: ShardId, _store: &mut MvccStore) {
        // Counters start absent, which reads as 0.
    }

    fn generator(&self, client: u32, seed: u64) -> Box<dyn TxnGenerator> {
        Box::new(TigaGenerator {
            rng: child_rng(seed, "tiga-client", u64::from(client)),
            shards: self.shards,
            keys_per_shard: self.keys_per_shard,
            dist: self.dist.clone(),
        })
    }

    fn checker(&self) -> Box<dyn InvariantCheck> {
        Box::new(TigaCheck::default())
    }
}

struct TigaGenerator {
    rng: Rng,
    shards: u32,
    keys_per_shard: u64,
    dist: KeyDist,
}

impl TxnGenerator for TigaGenerator {
    fn next(&mut self, _request: RequestId) -> TxnRequest {
        let mut ids: Vec<u64> = Vec::with_capacity(TIGA_OPS);
        for op in 0..TIGA_OPS as u64 {
            let base = (op % u64::from(self.shards)) * self.keys_per_shard;
            let mut id = base + self.dist.sample(&mut self.rng);
            let mut draws = 0;
            while ids.contains(&id) {
                draws += 1;
                id = if draws < DISTINCT_DRAWS_MAX {
                    base + self.dist.sample(&mut self.rng)
                } else {
                    base + (id + 1 - base) % self.keys_per_shard
                };
            }
            ids.push(id);
        }
        TxnRequest {
            proc: ProcId(0),
            args: vec![Datum::List(ids.into_iter().map(Datum::Uint).collect())],
        }
    }
}

fn parse(args: &Args) -> Result<Vec<u64>, ProcError> {
    match args.as_slice() {
        [Datum::List(ids)] if ids.len() == TIGA_OPS => ids
            .iter()
            .map(|d| {
                d.as_uint().ok_or_else(|| ProcError::BadArgs("counter ids are unsigned".into()))
            })
            .collect(),
        _ => Err(ProcError::BadArgs(format!("micro-tiga takes [[id; {TIGA_OPS}]]"))),
    }
}

/// Increments the counters in `args[0]`: a piece per shard touched.
#[derive(Debug)]
struct Increments {
    keys_per_shard: u64,
}

impl Increments {
    fn shards(&self, ids: &[u64]) -> Vec<u64> {
        crate::shards_of(ids.iter().copied(), self.keys_per_shard)
    }

    fn ids_on(&self, piece: u32, ids: &[u64]) -> Result<Vec<u64>, ProcError> {
        let shard = *self
            .shards(ids)
            .get(piece as usize)
            .ok_or_else(|| ProcError::BadArgs(format!("micro-tiga has no piece {piece}")))?;
        Ok(ids.iter().copied().filter(|id| id / self.keys_per_shard == shard).collect())
    }
}

impl Procedure for Increments {
    fn name(&self) -> &'static str {
        "micro-tiga"
    }

    fn plan(&self, args: &Args, context: PlanContext<'_>) -> Result<Plan, ProcError> {
        let ids = parse(args)?;
        crate::piece_per_shard(self.shards(&ids), context, "a counter")
    }

    fn keys(&self, piece: u32, args: &Args, _inputs: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let keys: Vec<Key> =
            self.ids_on(piece, &parse(args)?)?.into_iter().map(counter_key).collect();
        Ok(KeySet { reads: keys.clone(), writes: keys, scans: Vec::new() })
    }

    fn execute(
        &self,
        piece: u32,
        args: &Args,
        _inputs: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let ids = parse(args).and_then(|ids| self.ids_on(piece, &ids));
        let ids = ids.map_err(|e| UserAbort(e.to_string()))?;
        let mut effects = PieceEffects::default();
        for (id, value) in ids.into_iter().zip(&reads.values) {
            let next = counter_of(value.as_deref())
                .ok_or_else(|| UserAbort(format!("counter {id} is corrupt")))?
                .saturating_add(1);
            effects
                .writes
                .push(Write { key: counter_key(id), value: Some(next.to_le_bytes().to_vec()) });
            effects.output.push(Datum::Uint(next));
        }
        Ok(effects)
    }
}

/// Counts committed increments per counter (see the module documentation).
#[derive(Default)]
struct TigaCheck {
    // Updated per commit (hot); only the final check sorts it.
    expected: FixedHashMap<u64, u64>,
    /// Increments of requests never answered: each may or may not have committed.
    unknown: FixedHashMap<u64, u64>,
    committed: u64,
}

impl InvariantCheck for TigaCheck {
    fn observe(&mut self, completion: &Completion) {
        if completion.outcome.result != TxnResult::Committed {
            return;
        }
        let Ok(ids) = parse(&completion.txn.args) else { return };
        self.committed += 1;
        for id in ids {
            *self.expected.entry(id).or_default() += 1;
        }
    }

    fn unanswered(
        &mut self,
        _client: u32,
        _request: RequestId,
        txn: &TxnRequest,
        _at: meridian_core::Time,
    ) {
        let Ok(ids) = parse(&txn.args) else { return };
        for id in ids {
            *self.unknown.entry(id).or_default() += 1;
        }
    }

    fn check(&self, stores: &[(ShardId, &MvccStore)]) -> Vec<CheckResult> {
        let mut expected: BTreeMap<u64, u64> =
            self.expected.iter().map(|(&k, &v)| (k, v)).collect();
        let mut problems = Vec::new();
        let mut counters = 0u64;
        for (_, store) in stores {
            for (key, version) in store.latest_values() {
                counters += 1;
                let id = key.reader().u64().unwrap_or(u64::MAX);
                let found = counter_of(version.value.as_deref());
                let want = expected.remove(&id).unwrap_or(0);
                let maybe = self.unknown.get(&id).copied().unwrap_or(0);
                let ok = found.is_some_and(|f| f >= want && f <= want + maybe);
                if !ok && problems.len() < 5 {
                    problems.push(format!(
                        "counter {id} holds {found:?}: {want} increments committed, {maybe} unknown"
                    ));
                }
            }
        }
        let missing = expected.len();
        for (id, want) in expected.iter().take(5usize.saturating_sub(problems.len())) {
            problems.push(format!("counter {id} is missing, {want} increments committed"));
        }
        let passed = problems.is_empty();
        let detail = if passed {
            format!("{counters} counters hold exactly the increments of {} commits", self.committed)
        } else {
            format!("{} ({missing} counters missing)", problems.join("; "))
        };
        vec![CheckResult { name: "tiga-counters".into(), passed, detail }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{apply_serially, check_stores, completion, loaded_stores};

    #[test]
    fn three_increments_on_three_shards_and_the_check_counts_them() {
        let options = WorkloadOptions {
            shards: 3,
            keys_per_shard: 50,
            zipf_theta: Some(0.9),
            ops_max: None,
            distribution: None,
            region_groups: None,
            tpcc: Default::default(),
        };
        let w = MicroTiga::new(&options).unwrap();
        let partitioner = w.partitioner();
        let registry = w.registry();
        let mut stores = loaded_stores(&w, 3);
        let mut check = w.checker();
        let mut generator = w.generator(1, 2);
        for ts in 1..500u64 {
            let txn = generator.next(RequestId(ts));
            let procedure = registry.get(txn.proc).unwrap();
            let plan =
                procedure.plan(&txn.args, PlanContext { partitioner: &partitioner }).unwrap();
            assert_eq!(plan.len(), 3, "one piece on each of three shards");
            let outcome = apply_serially(&w, &mut stores, &txn, ts);
            assert_eq!(outcome.result, TxnResult::Committed);
            check.observe(&completion(ts, txn, outcome));
        }
        let result = check_stores(check.as_ref(), &stores);
        assert!(result.passed, "{}", result.detail);
        // A lost update: one counter falls back by one.
        let (key, version) =
            stores[1].latest_values().next().map(|(k, v)| (k.clone(), v.clone())).unwrap();
        let lower = counter_of(version.value.as_deref()).unwrap() - 1;
        stores[1].load(key, lower.to_le_bytes().to_vec());
        let result = check_stores(check.as_ref(), &stores);
        assert!(
            !result.passed && result.detail.contains("increments committed"),
            "{}",
            result.detail
        );
        // An increment of unknown outcome may or may not be there.
        let mut lenient = w.checker();
        let unknown = generator.next(RequestId(999));
        lenient.unanswered(1, RequestId(999), &unknown, 0);
        let mut fresh = loaded_stores(&w, 3);
        assert!(check_stores(lenient.as_ref(), &fresh).passed);
        apply_serially(&w, &mut fresh, &unknown, 1);
        assert!(check_stores(lenient.as_ref(), &fresh).passed);
    }
}
