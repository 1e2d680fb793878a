//! Test helpers shared by the workloads' unit tests: a serial executor that runs a
//! transaction's pieces straight against per-shard stores (dependencies in plan order, writes
//! installed only when every piece ran; a piece reads the earlier pieces' writes to its keys,
//! scans see the stores only; pieces on replicated tables run on shard 0), loading and
//! checking helpers.

use crate::{Completion, InvariantCheck, Workload};
use meridian_core::key::{Key, Value};
use meridian_core::time::Timestamp;
use meridian_core::txn::{
    PieceOutput, PlanContext, Reads, ShardTarget, TxnOutcome, TxnRequest, TxnResult,
};
use meridian_core::{NodeId, RequestId, ShardId, TxnId};
use meridian_storage::{MvccStore, VersionState};
use std::collections::BTreeMap;

/// One store per shard, bulk-loaded by `workload`.
pub(crate) fn loaded_stores(workload: &dyn Workload, shards: u32) -> Vec<MvccStore> {
    (0..shards)
        .map(|s| {
            let mut store = MvccStore::new();
            workload.load(ShardId(s), &mut store);
            store
        })
        .collect()
}

/// Runs `txn` as a serial database would, committing at `ts`; a user abort writes nothing.
pub(crate) fn apply_serially(
    workload: &dyn Workload,
    stores: &mut [MvccStore],
    txn: &TxnRequest,
    ts: u64,
) -> TxnOutcome {
    let registry = workload.registry();
    let partitioner = workload.partitioner();
    let procedure = registry.get(txn.proc).expect("a registered procedure");
    let plan = procedure.plan(&txn.args, PlanContext { partitioner: &partitioner }).expect("plans");
    let mut outputs: Vec<PieceOutput> = Vec::new();
    let mut writes = Vec::new();
    let mut pending: BTreeMap<(ShardId, Key), Option<Value>> = BTreeMap::new();
    for (piece, spec) in plan.iter().enumerate() {
        let shard = match spec.target {
            ShardTarget::Shard(shard) => shard,
            ShardTarget::Any => ShardId(0),
        };
        let inputs: Vec<&PieceOutput> = spec.deps.iter().map(|&d| &outputs[d as usize]).collect();
        let keys = procedure.keys(piece as u32, &txn.args, &inputs).expect("keys");
        let store = &stores[shard.0 as usize];
        let values = keys
            .reads
            .iter()
            .map(|k| match pending.get(&(shard, k.clone())) {
                Some(own) => own.as_deref(),
                None => store.get_at(k, Timestamp::MAX).map(Vec::as_slice),
            })
            .collect();
        let scans = keys
            .scans
            .iter()
            .map(|range| {
                let rows = store.scan(range, Timestamp::MAX);
                rows.into_iter().filter_map(|(k, v)| v.value.map(|value| (k, value))).collect()
            })
            .collect();
        let reads = Reads { values, scans };
        match procedure.execute(piece as u32, &txn.args, &inputs, &reads) {
            Ok(effects) => {
                for w in &effects.writes {
                    pending.insert((shard, w.key.clone()), w.value.clone());
                }
                writes.push((shard, effects.writes));
                outputs.push(effects.output);
            }
            Err(abort) => {
                return TxnOutcome {
                    result: TxnResult::UserAborted(abort.0),
                    outputs: Vec::new(),
                    commit_ts: None,
                    retries: 0,
                    shards_touched: 0,
                    path: meridian_core::txn::CommitPath::None,
                    aborts: Default::default(),
                    speculative_ns: None,
                }
            }
        }
    }
    let writer = TxnId { origin: NodeId(0), incarnation: 0, seq: ts };
    for (shard, batch) in writes {
        for w in batch {
            stores[shard.0 as usize]
                .write(w.key, Timestamp(ts), w.value, writer, VersionState::Committed)
                .expect("serial commits go up in timestamp");
        }
    }
    TxnOutcome {
        result: TxnResult::Committed,
        outputs,
        commit_ts: Some(Timestamp(ts)),
        retries: 0,
        shards_touched: plan.len() as u32,
        path: meridian_core::txn::CommitPath::None,
        aborts: Default::default(),
        speculative_ns: None,
    }
}

/// A completion of `txn` as request `request` with `outcome`, for `InvariantCheck::observe`.
pub(crate) fn completion(request: u64, txn: TxnRequest, outcome: TxnOutcome) -> Completion {
    Completion {
        client: 0,
        coordinator: NodeId(0),
        request: RequestId(request),
        txn,
        submitted_at: 10 * request,
        completed_at: 10 * request + 5,
        outcome,
        wan_hops: None,
    }
}

/// The first check's verdict on `stores` (one per shard, in order).
pub(crate) fn check_stores(check: &dyn InvariantCheck, stores: &[MvccStore]) -> crate::CheckResult {
    let refs: Vec<(ShardId, &MvccStore)> =
        stores.iter().enumerate().map(|(i, s)| (ShardId(i as u32), s)).collect();
    check.check(&refs).remove(0)
}
