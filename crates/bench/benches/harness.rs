//! What the harness itself costs per recorded transaction, with a no-op protocol: a pool of
//! closed-loop clients (the workload's generator picks each transaction), a "coordinator" that
//! answers every request at once as committed, and the statistics and invariant checker that
//! every completion goes through. Nothing of a protocol, the runtime or the network runs, so
//! this is the ceiling the harness puts on any protocol's throughput (target: at least 1M
//! recorded transactions per second on one core).
//!
//! `cargo bench -p meridian-bench --bench harness`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use meridian_bench::stats::RunStats;
use meridian_core::node::ClientDriver;
use meridian_core::txn::{CommitPath, TxnOutcome, TxnResult};
use meridian_core::NodeId;
use meridian_core::Timestamp;
use meridian_workloads::clients::ClientPool;
use meridian_workloads::{InvariantCheck, WorkloadOptions};

/// Transactions per measured batch.
const BATCH: u64 = 10_000;
const CLIENTS: u32 = 64;

struct Harness {
    pool: ClientPool,
    stats: RunStats,
    checker: Box<dyn InvariantCheck>,
    pending: Vec<(NodeId, meridian_core::node::ClientRequest)>,
    now: u64,
}

impl Harness {
    fn new(workload: &str) -> Self {
        let options = WorkloadOptions { shards: 2, keys_per_shard: 100_000, ..Default::default() };
        let workload = meridian_workloads::build(workload, &options).expect("workload");
        let clients = (0..CLIENTS).map(|c| (NodeId(0), workload.generator(c, 1))).collect();
        let mut pool = ClientPool::new(0, clients);
        let pending = pool.start(0);
        let mut stats = RunStats::new(0, u64::MAX / 2);
        stats.name_types(&workload.registry());
        Self { pool, stats, checker: workload.checker(), pending, now: 0 }
    }

    /// Answers one outstanding request as committed and records every completion.
    fn one(&mut self) {
        let (node, request) = self.pending.pop().expect("a closed loop always has a request");
        self.now += 1_000;
        let outcome = TxnOutcome {
            result: TxnResult::Committed,
            outputs: Vec::new(),
            commit_ts: Some(Timestamp(self.now)),
            retries: 0,
            aborts: Default::default(),
            shards_touched: 1,
            path: CommitPath::OneRound,
            speculative_ns: None,
        };
        let next = self.pool.on_reply(self.now + 500, node, request.id, &outcome);
        self.pending.extend(next);
        for completion in self.pool.drain_completions() {
            self.stats.add(&completion, None);
            meridian_workloads::observe_completion(self.checker.as_mut(), &completion);
        }
    }
}

fn harness(c: &mut Criterion) {
    let mut group = c.benchmark_group("harness");
    group.throughput(Throughput::Elements(BATCH));
    for workload in ["micro-luigi", "ycsb-a", "tpcc"] {
        let mut harness = Harness::new(workload);
        group.bench_function(workload, |b| {
            b.iter(|| {
                for _ in 0..BATCH {
                    harness.one();
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, harness);
criterion_main!(benches);
