//! `retwis`: TAPIR's Retwis benchmark (a Twitter clone's transactions over a key-value store).
//!
//! | transaction | % | gets | puts |
//! |---|---|---|---|
//! | AddUser | 5 | 1 | 3 (the key read and two more) |
//! | Follow/Unfollow | 15 | 2 | 2 (read-modify-write of both) |
//! | PostTweet | 30 | 3 | 5 (read-modify-write of 3, blind puts of 2) |
//! | GetTimeline | 50 | 1–10 (uniform) | 0 |
//!
//! Keys (`--keys-per-shard` × shards of them, loaded before the run) are chosen uniformly or
//! with Zipf skew over every shard, distinct within a transaction and sorted before use, as
//! TAPIR's client does. The value written is the key's name, as in TAPIR. Keys are
//! `table 8 ‖ id:u64`, shard `id / keys_per_shard`; a key's name is `key<id>`.
//!
//! Invariant (`retwis-keys`, on the final stores): every loaded key is present and holds its own
//! name. Retwis writes carry no information beyond that, so this catches lost keys, torn or
//! foreign values, not lost updates (the history workloads do that).

use crate::dist::{KeyDist, ShardedKeys};
use crate::{CheckResult, Completion, InvariantCheck, TxnGenerator, Workload, WorkloadOptions};
use meridian_core::key::Key;
use meridian_core::rng::{child_rng, uniform_u64, Rng};
use meridian_core::txn::{
    Args, Datum, KeySet, Partitioner, PieceEffects, PieceOutput, Plan, PlanContext, ProcError,
    ProcId, Procedure, Reads, Registry, TxnRequest, UserAbort, Write,
};
use meridian_core::{ConfigError, RequestId, ShardId};
use meridian_storage::MvccStore;
use std::sync::Arc;

/// The table byte of Retwis keys.
pub const RETWIS_TABLE: u8 = 8;
/// Transaction weights (percent): AddUser, Follow/Unfollow, PostTweet, GetTimeline.
pub const WEIGHTS: [u64; 4] = [5, 15, 30, 50];
/// Most keys GetTimeline reads.
pub const TIMELINE_GETS_MAX: u64 = 10;
/// Keys a transaction may touch at most (PostTweet: 3 read-modify-writes + 2 puts).
pub const KEYS_PER_TXN_MAX: usize = 10;

const _: () = assert!(TIMELINE_GETS_MAX as usize <= KEYS_PER_TXN_MAX);

/// The key of item `id`.
pub fn retwis_key(id: u64) -> Key {
    Key::table(RETWIS_TABLE).u64(id).build()
}

/// The name of item `id`, which is also the value written to it.
pub fn retwis_name(id: u64) -> Vec<u8> {
    format!("key{id}").into_bytes()
}

/// The workload.
#[derive(Debug)]
pub struct Retwis {
    keys: ShardedKeys,
}

impl Retwis {
    /// Checks the options and builds the workload.
    pub fn new(options: &WorkloadOptions) -> Result<Self, ConfigError> {
        if options.shards == 0 {
            return Err(ConfigError::new("retwis needs at least one shard"));
        }
        let keys = u64::from(options.shards) * options.keys_per_shard;
        if keys < KEYS_PER_TXN_MAX as u64 {
            return Err(ConfigError::new(format!(
                "retwis needs at least {KEYS_PER_TXN_MAX} keys in all, got {keys}"
            )));
        }
        let dist = KeyDist::new(options.keys_per_shard, options.zipf_theta)?;
        Ok(Self {
            keys: ShardedKeys { shards: options.shards, per_shard: options.keys_per_shard, dist },
        })
    }
}

impl Workload for Retwis {
    fn name(&self) -> &'static str {
        "retwis"
    }

    fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "name": "retwis",
            "keys": self.keys.items(),
            "mix_percent": {"add_user": 5, "follow": 15, "post_tweet": 30, "get_timeline": 50},
            "distribution": match &self.keys.dist { KeyDist::Uniform { .. } => "uniform", KeyDist::Zipf(_) => "zipf" },
        })
    }

    fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        registry.register(Arc::new(RetwisTxn { per_shard: self.keys.per_shard }));
        registry
    }

    fn partitioner(&self) -> Partitioner {
        self.keys.partitioner()
    }

    fn load(&self, shard: ShardId, store: &mut MvccStore) {
        let first = u64::from(shard.0) * self.keys.per_shard;
        for id in first..first + self.keys.per_shard {
            store.load(retwis_key(id), retwis_name(id));
        }
    }

    fn generator(&self, client: u32, seed: u64) -> Box<dyn TxnGenerator> {
        Box::new(RetwisGenerator {
            rng: child_rng(seed, "retwis-client", u64::from(client)),
            keys: self.keys.clone(),
        })
    }

    fn checker(&self) -> Box<dyn InvariantCheck> {
        Box::new(RetwisCheck { keys: self.keys.items() })
    }
}

struct RetwisGenerator {
    rng: Rng,
    keys: ShardedKeys,
}

impl RetwisGenerator {
    /// `count` distinct keys, sorted.
    fn keys(&mut self, count: usize) -> Vec<u64> {
        let mut keys = self.keys.distinct(&mut self.rng, count);
        keys.sort_unstable();
        keys
    }
}

impl TxnGenerator for RetwisGenerator {
    fn next(&mut self, _request: RequestId) -> TxnRequest {
        let roll = uniform_u64(&mut self.rng, 100);
        // (gets, read-modify-writes, blind puts) as key lists: the first `gets` keys are read,
        // the first `rmw` of those are also written, and `puts` more keys are only written.
        let (gets, rmw, puts) = if roll < WEIGHTS[0] {
            (1, 1, 2)
        } else if roll < WEIGHTS[0] + WEIGHTS[1] {
            (2, 2, 0)
        } else if roll < WEIGHTS[0] + WEIGHTS[1] + WEIGHTS[2] {
            (3, 3, 2)
        } else {
            (1 + uniform_u64(&mut self.rng, TIMELINE_GETS_MAX) as usize, 0, 0)
        };
        let keys = self.keys(gets + puts);
        let (read, write_only) = keys.split_at(gets);
        TxnRequest {
            proc: ProcId(0),
            args: vec![
                Datum::List(read.iter().map(|&id| Datum::Uint(id)).collect()),
                Datum::Uint(rmw as u64),
                Datum::List(write_only.iter().map(|&id| Datum::Uint(id)).collect()),
            ],
        }
    }
}

/// Reads, read-modify-writes and puts, one piece per shard.
#[derive(Debug)]
struct RetwisTxn {
    per_shard: u64,
}

/// (keys read, how many of them are also written, keys only written).
type RetwisArgs = (Vec<u64>, usize, Vec<u64>);

fn parse(args: &Args) -> Result<RetwisArgs, ProcError> {
    let bad = || ProcError::BadArgs("retwis takes [[read ids], rmw count, [put ids]]".into());
    let [Datum::List(read), Datum::Uint(rmw), Datum::List(put)] = args.as_slice() else {
        return Err(bad());
    };
    let ids = |list: &[Datum]| list.iter().map(Datum::as_uint).collect::<Option<Vec<u64>>>();
    let (read, put) = (ids(read).ok_or_else(bad)?, ids(put).ok_or_else(bad)?);
    if *rmw as usize > read.len() || read.len() + put.len() > KEYS_PER_TXN_MAX {
        return Err(bad());
    }
    Ok((read, *rmw as usize, put))
}

impl RetwisTxn {
    fn all(&self, (read, _, put): &RetwisArgs) -> Vec<u64> {
        read.iter().chain(put).copied().collect()
    }
}

impl Procedure for RetwisTxn {
    fn name(&self) -> &'static str {
        "retwis"
    }

    fn plan(&self, args: &Args, context: PlanContext<'_>) -> Result<Plan, ProcError> {
        let parsed = parse(args)?;
        crate::piece_per_shard(
            crate::shards_of(self.all(&parsed), self.per_shard),
            context,
            "a key",
        )
    }

    fn keys(&self, piece: u32, args: &Args, _inputs: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let (read, rmw, put) = parse(args)?;
        let shards = crate::shards_of(self.all(&(read.clone(), rmw, put.clone())), self.per_shard);
        let shard = *shards
            .get(piece as usize)
            .ok_or_else(|| ProcError::BadArgs(format!("no piece {piece}")))?;
        let here = |id: &&u64| **id / self.per_shard == shard;
        Ok(KeySet {
            reads: read.iter().filter(here).map(|&id| retwis_key(id)).collect(),
            writes: read[..rmw].iter().chain(&put).filter(here).map(|&id| retwis_key(id)).collect(),
            scans: Vec::new(),
        })
    }

    fn execute(
        &self,
        piece: u32,
        args: &Args,
        inputs: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let keys = self.keys(piece, args, inputs).map_err(|e| UserAbort(e.to_string()))?;
        let found = reads.values.iter().filter(|v| v.is_some()).count() as u64;
        let writes = keys
            .writes
            .into_iter()
            .map(|key| {
                let id = key.reader().u64().unwrap_or_default();
                Write { key, value: Some(retwis_name(id)) }
            })
            .collect();
        Ok(PieceEffects { writes, output: vec![Datum::Uint(found)] })
    }
}

/// Every loaded key holds its own name.
struct RetwisCheck {
    keys: u64,
}

impl InvariantCheck for RetwisCheck {
    fn observe(&mut self, _completion: &Completion) {}

    fn check(&self, stores: &[(ShardId, &MvccStore)]) -> Vec<CheckResult> {
        let mut problems = Vec::new();
        let mut found = 0u64;
        for (_, store) in stores {
            for (key, version) in store.latest_values() {
                found += 1;
                let id = key.reader().u64().unwrap_or(u64::MAX);
                if version.value.as_deref() != Some(retwis_name(id).as_slice())
                    && problems.len() < 5
                {
                    problems.push(format!("key {id} holds {:?}", version.value));
                }
            }
        }
        if found != self.keys {
            problems.push(format!("{found} keys found, {} loaded", self.keys));
        }
        let passed = problems.is_empty();
        let detail = if passed {
            format!("{found} keys present, each holding its name")
        } else {
            problems.join("; ")
        };
        vec![CheckResult { name: "retwis-keys".into(), passed, detail }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{apply_serially, check_stores, loaded_stores};
    use meridian_core::txn::TxnResult;

    #[test]
    fn the_mix_and_shapes_follow_tapir_and_the_check_catches_a_torn_value() {
        let options = WorkloadOptions {
            shards: 2,
            keys_per_shard: 50,
            zipf_theta: Some(0.8),
            ops_max: None,
            distribution: None,
            region_groups: None,
            tpcc: Default::default(),
        };
        let w = Retwis::new(&options).unwrap();
        let mut stores = loaded_stores(&w, 2);
        let mut generator = w.generator(0, 4);
        let mut read_only = 0;
        for ts in 1..2_000u64 {
            let txn = generator.next(RequestId(ts));
            let (read, rmw, put) = parse(&txn.args).unwrap();
            let mut all: Vec<u64> = read.iter().chain(&put).copied().collect();
            assert!(read.windows(2).all(|p| p[0] < p[1]), "sorted, distinct");
            all.sort_unstable();
            all.dedup();
            assert_eq!(all.len(), read.len() + put.len());
            assert!(matches!(
                (read.len(), rmw, put.len()),
                (1, 1, 2) | (2, 2, 0) | (3, 3, 2) | (1..=10, 0, 0)
            ));
            if rmw == 0 {
                read_only += 1;
            }
            assert_eq!(apply_serially(&w, &mut stores, &txn, ts).result, TxnResult::Committed);
        }
        let share = f64::from(read_only) / 1_999.0;
        assert!((share - 0.5).abs() < 0.04, "GetTimeline share {share}");
        assert!(check_stores(w.checker().as_ref(), &stores).passed);
        stores[1].load(retwis_key(60), b"key6".to_vec());
        assert!(!check_stores(w.checker().as_ref(), &stores).passed);
        let few = WorkloadOptions {
            shards: 1,
            keys_per_shard: 5,
            zipf_theta: None,
            ops_max: None,
            distribution: None,
            region_groups: None,
            tpcc: Default::default(),
        };
        assert!(Retwis::new(&few).unwrap_err().0.contains("at least 10 keys"));
    }
}
