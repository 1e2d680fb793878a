//! Meridian workloads: registered procedures, transaction generators, bulk loaders, invariant
//! checks, and the closed-loop client pool both drivers use.
//!
//! A [`Workload`] bundles everything a run needs to know about one workload. Generators and the
//! client pool are sans-IO and seeded: the same seed gives the same transactions.
#![deny(unsafe_code)]

pub mod bank;
pub mod clients;
pub mod crossstitch;
pub mod crossstitch_tpcc;
pub mod dist;
pub mod elle;
pub mod micro;
pub mod registry;
pub mod retwis;
pub mod scancount;
pub mod smallbank;
#[cfg(test)]
mod testkit;
pub mod tiga;
pub mod tpcc;
pub mod tpcc_gen;
pub mod ycsb;
pub mod ycsb_gen;

pub use clients::Completion;
use meridian_core::txn::{Partitioner, Registry, TxnRequest};
use meridian_core::{RequestId, ShardId, Time};
use meridian_storage::MvccStore;
pub use registry::build;
use serde::Serialize;

/// The workload names `--workload` accepts.
pub const WORKLOADS: [&str; 18] = [
    "micro-luigi",
    "micro-tiga",
    "bank",
    "smallbank",
    "retwis",
    "list-append",
    "rw-register",
    "ycsb-a",
    "ycsb-b",
    "ycsb-c",
    "ycsb-d",
    "ycsb-e",
    "ycsb-f",
    "tpcc",
    "scan-count",
    "crossstitch-synthetic",
    "crossstitch-order-status",
    "crossstitch-stock-level",
];

/// Produces one client's transactions.
pub trait TxnGenerator: Send {
    /// The next transaction; `request` is unique per run (writes may embed it to be unique).
    fn next(&mut self, request: RequestId) -> TxnRequest;
    /// The reply to `request` arrived (before the next `next`). YCSB acknowledges inserts here.
    fn on_reply(&mut self, _request: RequestId, _outcome: &meridian_core::txn::TxnOutcome) {}
}

/// One invariant's verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    /// The invariant's name.
    pub name: String,
    /// True when it holds.
    pub passed: bool,
    /// What was found (counts when it holds; the first violations when it does not).
    pub detail: String,
}

/// Checks a workload's invariants: sees every completed request, then the final stores.
pub trait InvariantCheck: Send {
    /// A request completed.
    fn observe(&mut self, completion: &Completion);
    /// A request submitted at `submitted_at` (true time) by `client` that was never answered:
    /// it may or may not have committed. Told once, after the run, before [`Self::check`].
    fn unanswered(
        &mut self,
        _client: u32,
        _request: RequestId,
        _txn: &TxnRequest,
        _submitted_at: Time,
    ) {
    }
    /// Checks the final state of every shard (one store per shard, e.g. its leader's).
    fn check(&self, stores: &[(ShardId, &MvccStore)]) -> Vec<CheckResult>;
    /// True when [`Self::check`] needs the final stores; false when it checks only what the
    /// clients saw (so it can run against a cluster of other processes).
    fn needs_stores(&self) -> bool {
        true
    }
    /// The recorded history in elle-cli JSON, for workloads that record one.
    fn history_json(&self) -> Option<String> {
        None
    }
    /// Whether the run's histories must be strictly serializable (the default) or only
    /// serializable: a protocol that orders by clock timestamps promises strictness only while
    /// clocks are synchronized (`meridian_protocols::Guarantee`). Checks of recorded histories
    /// follow it; invariants of the final state hold either way.
    fn expect_strict(&mut self, _strict: bool) {}
    /// The writes of acknowledged commits that `stores` (one store per shard given; writes to
    /// shards not given are not judged) do not hold, described one each, for a workload whose
    /// writes stay visible once made (an append stays in its list); `None` when the workload
    /// cannot tell (a later write hides an earlier one) or did not record every acknowledged
    /// write.
    fn acknowledged_missing(&self, _stores: &[(ShardId, &MvccStore)]) -> Option<Vec<String>> {
        None
    }
}

/// Hands a completion to `checker`: a request whose outcome the protocol reported unknown
/// (`Indeterminate`: it may or may not have committed) counts as never answered, which every
/// check already allows for; anything else is observed.
pub fn observe_completion(checker: &mut dyn InvariantCheck, completion: &Completion) {
    if completion.outcome.result.certainly_not_committed()
        || completion.outcome.result == meridian_core::txn::TxnResult::Committed
    {
        checker.observe(completion);
    } else {
        checker.unanswered(
            completion.client,
            completion.request,
            &completion.txn,
            completion.submitted_at,
        );
    }
}

/// Everything a run needs to know about a workload.
pub trait Workload: Send + Sync {
    /// Its name.
    fn name(&self) -> &'static str;
    /// Its parameters, for reports.
    fn describe(&self) -> serde_json::Value;
    /// Its procedures (identical on every node).
    fn registry(&self) -> Registry;
    /// How its keys map to shards.
    fn partitioner(&self) -> Partitioner;
    /// Bulk-loads the initial data of `shard` straight into a store.
    fn load(&self, shard: ShardId, store: &mut MvccStore);
    /// A generator for client number `client`, seeded from the run seed.
    fn generator(&self, client: u32, seed: u64) -> Box<dyn TxnGenerator>;
    /// A fresh invariant checker.
    fn checker(&self) -> Box<dyn InvariantCheck>;
}

/// Clients whose transactions [`sample`] takes.
pub const SAMPLE_CLIENTS: u32 = 2;
/// Transactions it takes from each.
pub const SAMPLE_TXNS: u64 = 200;

/// The first [`SAMPLE_TXNS`] transactions of [`SAMPLE_CLIENTS`] clients (run seed 0), with
/// the workload's procedures and partitioning: what a protocol checks before a run that it
/// can run the workload's transactions.
pub fn sample(workload: &dyn Workload) -> meridian_core::txn::WorkloadSample {
    let mut requests = Vec::with_capacity((u64::from(SAMPLE_CLIENTS) * SAMPLE_TXNS) as usize);
    for client in 0..SAMPLE_CLIENTS {
        let mut generator = workload.generator(client, 0);
        for request in 0..SAMPLE_TXNS {
            requests.push(generator.next(meridian_core::RequestId(request)));
        }
    }
    meridian_core::txn::WorkloadSample {
        name: workload.name().to_string(),
        registry: std::sync::Arc::new(workload.registry()),
        partitioner: std::sync::Arc::new(workload.partitioner()),
        requests,
    }
}

/// Options shared by the workloads (unused ones are ignored by a workload).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadOptions {
    /// Number of shards.
    pub shards: u32,
    /// Keys per shard (micro).
    pub keys_per_shard: u64,
    /// Zipf skew; `None` for uniform key choice.
    pub zipf_theta: Option<f64>,
    /// Most micro-operations per transaction (`list-append`, `rw-register`); their default
    /// when `None`.
    pub ops_max: Option<u32>,
    /// YCSB's `requestdistribution` (zipfian, uniform, latest, hotspot); the workload file's
    /// when `None`. Other workloads refuse it.
    pub distribution: Option<String>,
    /// `crossstitch-synthetic`: order each transaction's operations so that those on shards
    /// in one of `G` groups (shard `s` in group `s mod G`: one region each in the standard
    /// layout over `G` server regions) come together, the first group drawn per transaction;
    /// `None` keeps operation `i` on shard `i mod shards`. Other workloads refuse it.
    pub region_groups: Option<u32>,
    /// TPC-C's settings (warehouses per shard, remote percentages, mode, scale).
    pub tpcc: tpcc::TpccOptions,
}

impl Default for WorkloadOptions {
    fn default() -> Self {
        Self {
            shards: 2,
            keys_per_shard: 100_000,
            zipf_theta: None,
            ops_max: None,
            distribution: None,
            region_groups: None,
            tpcc: tpcc::TpccOptions::default(),
        }
    }
}

/// Places item `id` (a key's leading integer) on shard `id / per_shard`.
pub(crate) fn leading_int_partitioner(
    shards: u32,
    per_shard: u64,
) -> meridian_core::txn::Partitioner {
    use meridian_core::txn::{PartitionRule, Partitioner};
    Partitioner::new(shards, PartitionRule::LeadingInt { base: 0, per_shard })
        .expect("workloads check shards and keys per shard before building")
}

/// The shards holding `ids` when item `id` lives on shard `id / per_shard`, ascending, each
/// once. Plans with a piece per shard run piece `i` on the `i`-th of them.
pub(crate) fn shards_of(ids: impl IntoIterator<Item = u64>, per_shard: u64) -> Vec<u64> {
    let mut shards: Vec<u64> = ids.into_iter().map(|id| id / per_shard).collect();
    shards.sort_unstable();
    shards.dedup();
    shards
}

/// A plan of one independent piece per shard in `shards`; `what` names the items in the
/// error for a shard beyond the cluster.
pub(crate) fn piece_per_shard(
    shards: Vec<u64>,
    context: meridian_core::txn::PlanContext<'_>,
    what: &str,
) -> Result<meridian_core::txn::Plan, meridian_core::txn::ProcError> {
    use meridian_core::txn::{PieceSpec, ProcError, ShardTarget};
    let limit = u64::from(context.partitioner.shards());
    if let Some(bad) = shards.iter().find(|&&s| s >= limit) {
        return Err(ProcError::BadArgs(format!("{what} on shard {bad}, beyond the cluster")));
    }
    Ok(shards
        .into_iter()
        .map(|s| PieceSpec { target: ShardTarget::Shard(ShardId(s as u32)), deps: Vec::new() })
        .collect())
}
