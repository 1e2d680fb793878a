//! `crossstitch-synthetic`: the synthetic workload of the CrossStitch study (§5.2): a
//! transaction is a sequence of dependent key operations, 80% reads and 20% writes (ten
//! operations: eight reads and two writes at positions drawn per transaction), on keys chosen
//! uniformly, with 1 KB values.
//!
//! Operation `i` runs on shard `i mod shards` (so with shards spread over two regions half the
//! operations of every transaction are remote, as in the study's two-datacenter runs; with
//! `--region-groups G` the operations are then ordered so that those on shards of one group,
//! shard `s` in group `s mod G`, come together, the first group drawn per transaction: the
//! study's ordering of a transaction's operations by datacenter, for the standard layout over
//! `G` server regions), and
//! each depends on the one before: its piece needs the previous piece's output (a running
//! digest of everything read so far), and a write's value carries that digest. Coordinators
//! that run pieces in dependency order (`occ`, `2pl`, `2pc-mvto`) therefore take one round
//! trip per remote operation, plus the commit: the "traditional" system of the study. The
//! study also ordered each transaction's local operations first, which matters to a protocol
//! that ships the transaction from server to server, not to these.
//!
//! Keys are `table 22 ‖ id:u64`, shard `id / keys_per_shard`. A written value is
//! `request:u64le ‖ id:u64le ‖ digest:u64le`, padded to [`VALUE_BYTES`].
//!
//! Invariant (`crossstitch-last-writer`, the `micro-last-writer` check): every key holds the
//! value of the committed transaction with the highest commit timestamp among those that wrote
//! it, and keys nobody committed a write to are absent.

use crate::dist::KeyDist;
use crate::micro::{micro_value, MicroCheck};
use crate::{InvariantCheck, TxnGenerator, Workload, WorkloadOptions};
use meridian_core::key::Key;
use meridian_core::rng::{child_rng, fnv1a, uniform_u64, Rng, FNV_OFFSET};
use meridian_core::txn::{
    Args, Datum, KeySet, Partitioner, PieceEffects, PieceOutput, PieceSpec, Plan, PlanContext,
    ProcError, Procedure, Reads, Registry, ShardTarget, TxnRequest, UserAbort, Write,
};
use meridian_core::{ConfigError, RequestId, ShardId};
use meridian_storage::MvccStore;
use std::sync::Arc;

/// The table byte of the workload's keys.
pub const CHAIN_TABLE: u8 = 22;
/// Operations per transaction by default (the study's).
pub const CHAIN_OPS: u32 = 10;
/// Most operations per transaction (a plan's pieces).
pub const CHAIN_OPS_MAX: u32 = 64;
/// Bytes of every written value (the study's 1 KB).
pub const VALUE_BYTES: usize = 1_024;
/// Percent of operations that read.
pub const READ_PERCENT: u32 = 80;

const _: () = assert!(CHAIN_OPS <= CHAIN_OPS_MAX);
const _: () = assert!(CHAIN_OPS_MAX as usize <= meridian_core::txn::PIECES_MAX);
const _: () = assert!(VALUE_BYTES >= 24, "the writer's request, the id and the digest");

/// The key of item `id`.
pub fn chain_key(id: u64) -> Key {
    Key::table(CHAIN_TABLE).u64(id).build()
}

/// The value request `request` writes to item `id` after reading what `digest` sums up.
pub fn chain_value(request: u64, id: u64, digest: u64) -> Vec<u8> {
    let mut value = micro_value(request, id);
    value.extend_from_slice(&digest.to_le_bytes());
    value.resize(VALUE_BYTES, b'x');
    value
}

/// The workload.
#[derive(Debug)]
pub struct Synthetic {
    shards: u32,
    keys_per_shard: u64,
    ops: u32,
    dist: KeyDist,
    groups: Option<u32>,
}

impl Synthetic {
    /// Checks the options and builds the workload (`ops_max` sets the operations per
    /// transaction).
    pub fn new(options: &WorkloadOptions) -> Result<Self, ConfigError> {
        let ops = options.ops_max.unwrap_or(CHAIN_OPS);
        if !(1..=CHAIN_OPS_MAX).contains(&ops) {
            return Err(ConfigError::new(format!(
                "crossstitch-synthetic takes 1..={CHAIN_OPS_MAX} operations per transaction, got {ops}"
            )));
        }
        if options.shards == 0 {
            return Err(ConfigError::new("crossstitch-synthetic needs at least one shard"));
        }
        if options.keys_per_shard < u64::from(ops) {
            return Err(ConfigError::new(format!(
                "crossstitch-synthetic needs at least {ops} keys per shard, got {}",
                options.keys_per_shard
            )));
        }
        if let Some(groups) = options.region_groups {
            if !(1..=options.shards).contains(&groups) {
                return Err(ConfigError::new(format!(
                    "--region-groups must be in 1..={} (the shards), got {groups}",
                    options.shards
                )));
            }
        }
        let dist = KeyDist::new(options.keys_per_shard, options.zipf_theta)?;
        Ok(Self {
            shards: options.shards,
            keys_per_shard: options.keys_per_shard,
            ops,
            dist,
            groups: options.region_groups,
        })
    }
}

impl Workload for Synthetic {
    fn name(&self) -> &'static str {
        "crossstitch-synthetic"
    }

    fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "name": "crossstitch-synthetic",
            "ops_per_txn": self.ops,
            "read_percent": READ_PERCENT,
            "value_bytes": VALUE_BYTES,
            "keys_per_shard": self.keys_per_shard,
            "distribution": match &self.dist { KeyDist::Uniform { .. } => "uniform", KeyDist::Zipf(_) => "zipf" },
        })
    }

    fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        registry.register(Arc::new(ChainTxn { keys_per_shard: self.keys_per_shard }));
        registry
    }

    fn partitioner(&self) -> Partitioner {
        crate::leading_int_partitioner(self.shards, self.keys_per_shard)
    }

    fn load(&self, _shard: ShardId, _store: &mut MvccStore) {
        // Keys start absent: a read of an absent key is a valid read of the initial state.
    }

    fn generator(&self, client: u32, seed: u64) -> Box<dyn TxnGenerator> {
        Box::new(ChainGenerator {
            rng: child_rng(seed, "crossstitch-client", u64::from(client)),
            shards: self.shards,
            keys_per_shard: self.keys_per_shard,
            ops: self.ops,
            dist: self.dist.clone(),
            groups: self.groups,
        })
    }

    fn checker(&self) -> Box<dyn InvariantCheck> {
        Box::new(MicroCheck::new("crossstitch-last-writer", chain_writes))
    }
}

struct ChainGenerator {
    rng: Rng,
    shards: u32,
    keys_per_shard: u64,
    ops: u32,
    dist: KeyDist,
    groups: Option<u32>,
}

impl TxnGenerator for ChainGenerator {
    fn next(&mut self, request: RequestId) -> TxnRequest {
        let ops = self.ops as usize;
        let mut ids =
            self.dist.distinct_over_shards(&mut self.rng, self.shards, self.keys_per_shard, ops);
        if let Some(groups) = self.groups.map(u64::from) {
            // The operations of each group together, starting from a group drawn here.
            let first = uniform_u64(&mut self.rng, groups);
            let per_shard = self.keys_per_shard;
            ids.sort_by_key(|&id| ((id / per_shard) % groups + groups - first) % groups);
        }
        // Exactly a fifth of the operations write (at least one), at positions drawn here.
        let writes = ((ops as u32 * (100 - READ_PERCENT)).div_ceil(100)).max(1) as usize;
        let mut is_write = vec![false; ops];
        let mut placed = 0;
        while placed < writes.min(ops) {
            let at = uniform_u64(&mut self.rng, ops as u64) as usize;
            if !is_write[at] {
                is_write[at] = true;
                placed += 1;
            }
        }
        let ops_list = ids
            .iter()
            .zip(&is_write)
            .map(|(&id, &w)| Datum::List(vec![Datum::Uint(id), Datum::Uint(u64::from(w))]))
            .collect();
        TxnRequest {
            proc: meridian_core::txn::ProcId(0),
            args: vec![Datum::List(ops_list), Datum::Uint(request.0)],
        }
    }
}

/// The one procedure: piece `i` is operation `i`, depending on piece `i - 1`.
#[derive(Debug)]
struct ChainTxn {
    keys_per_shard: u64,
}

/// Operations `(id, writes)` and the request.
fn parse(args: &Args) -> Result<(Vec<(u64, bool)>, u64), ProcError> {
    let bad = || ProcError::BadArgs("crossstitch-synthetic takes [[id, write]...], request".into());
    let [Datum::List(ops), Datum::Uint(request)] = args.as_slice() else { return Err(bad()) };
    if ops.is_empty() || ops.len() > CHAIN_OPS_MAX as usize {
        return Err(ProcError::BadArgs(format!(
            "1..={CHAIN_OPS_MAX} operations, got {}",
            ops.len()
        )));
    }
    let ops = ops
        .iter()
        .map(|op| match op.as_list() {
            Some([Datum::Uint(id), Datum::Uint(w)]) if *w <= 1 => Ok((*id, *w == 1)),
            _ => Err(bad()),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((ops, *request))
}

fn chain_writes(args: &Args) -> Option<(u64, Vec<u64>)> {
    let (ops, request) = parse(args).ok()?;
    Some((request, ops.into_iter().filter(|&(_, w)| w).map(|(id, _)| id).collect()))
}

impl Procedure for ChainTxn {
    fn name(&self) -> &'static str {
        "crossstitch-chain"
    }

    fn plan(&self, args: &Args, context: PlanContext<'_>) -> Result<Plan, ProcError> {
        let (ops, _) = parse(args)?;
        let shards = u64::from(context.partitioner.shards());
        ops.iter()
            .enumerate()
            .map(|(i, &(id, _))| {
                let shard = id / self.keys_per_shard;
                if shard >= shards {
                    return Err(ProcError::BadArgs(format!("item {id} is beyond the cluster")));
                }
                let deps = if i == 0 { Vec::new() } else { vec![i as u32 - 1] };
                Ok(PieceSpec { target: ShardTarget::Shard(ShardId(shard as u32)), deps })
            })
            .collect()
    }

    fn keys(&self, piece: u32, args: &Args, _inputs: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let (ops, _) = parse(args)?;
        let &(id, write) = ops
            .get(piece as usize)
            .ok_or_else(|| ProcError::BadArgs(format!("no piece {piece}")))?;
        Ok(if write {
            KeySet { writes: vec![chain_key(id)], ..KeySet::default() }
        } else {
            KeySet { reads: vec![chain_key(id)], ..KeySet::default() }
        })
    }

    fn execute(
        &self,
        piece: u32,
        args: &Args,
        inputs: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let (ops, request) = parse(args).map_err(|e| UserAbort(e.to_string()))?;
        let &(id, write) =
            ops.get(piece as usize).ok_or_else(|| UserAbort(format!("no piece {piece}")))?;
        let before = inputs.first().and_then(|o| o.first()).and_then(Datum::as_uint);
        let mut digest = before.unwrap_or(FNV_OFFSET);
        if write {
            let value = chain_value(request, id, digest);
            let writes = vec![Write { key: chain_key(id), value: Some(value) }];
            return Ok(PieceEffects { writes, output: vec![Datum::Uint(digest)] });
        }
        let read = reads.values.first().and_then(Option::as_ref);
        digest = fnv1a(digest, read.map_or(&[][..], |v| &v[..v.len().min(24)]));
        Ok(PieceEffects { writes: Vec::new(), output: vec![Datum::Uint(digest)] })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Completion;
    use meridian_core::txn::{TxnOutcome, TxnResult};
    use meridian_core::{NodeId, Timestamp, TxnId};
    use meridian_storage::VersionState;

    fn workload(shards: u32) -> Synthetic {
        let options =
            WorkloadOptions { shards, keys_per_shard: 1_000, ..WorkloadOptions::default() };
        Synthetic::new(&options).unwrap()
    }

    #[test]
    fn transactions_are_chains_of_dependent_operations_alternating_over_the_shards() {
        let w = workload(2);
        let partitioner = w.partitioner();
        let mut generator = w.generator(3, 7);
        let registry = w.registry();
        let procedure = registry.get(meridian_core::txn::ProcId(0)).unwrap();
        for request in 0..50 {
            let txn = generator.next(RequestId(request));
            let (ops, _) = parse(&txn.args).unwrap();
            assert_eq!(ops.len(), CHAIN_OPS as usize);
            assert_eq!(ops.iter().filter(|&&(_, w)| w).count(), 2, "80% reads");
            let plan =
                procedure.plan(&txn.args, PlanContext { partitioner: &partitioner }).unwrap();
            for (i, piece) in plan.iter().enumerate() {
                assert_eq!(piece.target, ShardTarget::Shard(ShardId(i as u32 % 2)));
                assert_eq!(piece.deps, if i == 0 { vec![] } else { vec![i as u32 - 1] });
            }
        }
        assert!(Synthetic::new(&WorkloadOptions {
            ops_max: Some(65),
            ..WorkloadOptions::default()
        })
        .is_err());
        assert!(Synthetic::new(&WorkloadOptions {
            keys_per_shard: 3,
            ..WorkloadOptions::default()
        })
        .is_err());
    }

    /// With region groups, a transaction visits each group once (the shards of group `g` are
    /// those `s` with `s mod G = g`), starting from either group; bad counts are refused.
    #[test]
    fn region_groups_bring_each_groups_operations_together() {
        let options = WorkloadOptions {
            shards: 8,
            keys_per_shard: 1_000,
            region_groups: Some(2),
            ..WorkloadOptions::default()
        };
        let w = Synthetic::new(&options).unwrap();
        let partitioner = w.partitioner();
        let registry = w.registry();
        let procedure = registry.get(meridian_core::txn::ProcId(0)).unwrap();
        let mut generator = w.generator(0, 3);
        let mut firsts = [0; 2];
        for request in 0..40 {
            let txn = generator.next(RequestId(request));
            let plan =
                procedure.plan(&txn.args, PlanContext { partitioner: &partitioner }).unwrap();
            let groups: Vec<u32> = plan
                .iter()
                .map(|p| match p.target {
                    ShardTarget::Shard(s) => s.0 % 2,
                    ShardTarget::Any => panic!("every operation has a shard"),
                })
                .collect();
            assert_eq!(groups.len(), CHAIN_OPS as usize);
            let changes = groups.windows(2).filter(|w| w[0] != w[1]).count();
            assert_eq!(changes, 1, "{groups:?}");
            firsts[groups[0] as usize] += 1;
        }
        assert!(firsts.iter().all(|&n| n > 0), "either group first: {firsts:?}");
        for bad in [0, 9] {
            let options = WorkloadOptions { region_groups: Some(bad), ..options.clone() };
            assert!(Synthetic::new(&options).is_err(), "{bad}");
        }
        let other = WorkloadOptions { region_groups: Some(2), ..WorkloadOptions::default() };
        assert!(crate::build("bank", &other).is_err(), "other workloads refuse it");
    }

    #[test]
    fn a_write_carries_the_digest_of_what_was_read_before_it() {
        let w = workload(1);
        let registry = w.registry();
        let procedure = registry.get(meridian_core::txn::ProcId(0)).unwrap();
        let args = vec![
            Datum::List(vec![
                Datum::List(vec![Datum::Uint(1), Datum::Uint(0)]),
                Datum::List(vec![Datum::Uint(2), Datum::Uint(1)]),
            ]),
            Datum::Uint(9),
        ];
        let run = |seen: Option<Vec<u8>>| {
            let reads = Reads { values: vec![seen.as_deref()], scans: vec![] };
            let first = procedure.execute(0, &args, &[], &reads).unwrap();
            let none = Reads::default();
            let second = procedure.execute(1, &args, &[&first.output], &none).unwrap();
            second.writes[0].value.clone().unwrap()
        };
        let (a, b) = (run(None), run(Some(chain_value(4, 1, 0))));
        assert_eq!(a.len(), VALUE_BYTES);
        assert!(a.starts_with(&micro_value(9, 2)));
        assert_ne!(a, b, "the write depends on the value read before it");
    }

    #[test]
    fn the_last_writer_check_catches_a_lost_write() {
        let w = workload(1);
        let mut generator = w.generator(0, 1);
        let txn = generator.next(RequestId(5));
        let (ops, _) = parse(&txn.args).unwrap();
        let mut check = w.checker();
        let outcome = TxnOutcome {
            result: TxnResult::Committed,
            commit_ts: Some(Timestamp(10)),
            ..TxnOutcome::failed(meridian_core::txn::TxnFailure::RetriesExhausted)
        };
        check.observe(&Completion {
            client: 0,
            coordinator: NodeId(0),
            request: RequestId(5),
            txn,
            submitted_at: 0,
            completed_at: 1,
            outcome,
            wan_hops: None,
        });
        let writer = TxnId { origin: NodeId(0), incarnation: 0, seq: 1 };
        let written: Vec<u64> = ops.iter().filter(|&&(_, w)| w).map(|&(id, _)| id).collect();
        let mut store = MvccStore::new();
        for &id in &written {
            store
                .write(
                    chain_key(id),
                    Timestamp(10),
                    Some(chain_value(5, id, 3)),
                    writer,
                    VersionState::Committed,
                )
                .unwrap();
        }
        assert!(check.check(&[(ShardId(0), &store)])[0].passed);
        let mut lost = MvccStore::new();
        let value = Some(chain_value(5, written[0], 3));
        lost.write(chain_key(written[0]), Timestamp(10), value, writer, VersionState::Committed)
            .unwrap();
        let result = &check.check(&[(ShardId(0), &lost)])[0];
        assert!(!result.passed && result.detail.contains("missing"), "{}", result.detail);
    }
}
