//! `crossstitch-order-status` and `crossstitch-stock-level`: the CrossStitch study's two
//! TPC-C-like transactions (§5.3), chains of dependent reads over one warehouse.
//!
//! - **Order status**: read the customer (its last order), then that order (its line count),
//!   then every line of it: three dependent reads.
//! - **Stock level**, reduced as the study reduced it: read the district (its last order),
//!   then that order, then its first line (an item), then that item's stock: four dependent
//!   reads.
//!
//! Ten districts; district `d` (its customers, orders and lines) lives on shard `d mod S`,
//! stock by item on shard `item mod S`, and the lines of a district's orders name only items
//! of its own shard, so every piece's shard is known when the transaction is planned (the
//! study kept a transaction's operations in one datacenter the same way). Every row is a
//! fixed function of its ids, loaded once and never written: a coordinator that runs pieces in
//! dependency order pays one round trip per read plus the commit (3 + 1 and 4 + 1 with the
//! client away from the data, the study's worst case).
//!
//! Invariant (`crossstitch-reads`): every committed transaction's answer equals the one the
//! loaded rows give (a wrong, missing or stale read shows).

use crate::{CheckResult, Completion, InvariantCheck, TxnGenerator, Workload, WorkloadOptions};
use meridian_core::key::Key;
use meridian_core::rng::{child_rng, uniform_u64, Rng};
use meridian_core::txn::{
    Args, Datum, KeySet, PartitionRule, Partitioner, PieceEffects, PieceOutput, PieceSpec, Plan,
    PlanContext, ProcError, ProcId, Procedure, Reads, Registry, ShardTarget, TxnRequest, TxnResult,
    UserAbort,
};
use meridian_core::{ConfigError, RequestId, ShardId};
use meridian_storage::MvccStore;
use std::sync::Arc;

/// Districts of the one warehouse.
pub const DISTRICTS: u64 = 10;
/// Customers (and orders: one each) per district.
pub const CUSTOMERS: u64 = 300;
/// Items in stock.
pub const ITEMS: u64 = 10_000;
const LINES_MIN: u64 = 5;
const LINES_SPREAD: u64 = 11;

const DISTRICT_TABLE: u8 = 23;
const CUSTOMER_TABLE: u8 = 24;
const ORDER_TABLE: u8 = 25;
const LINE_TABLE: u8 = 26;
const STOCK_TABLE: u8 = 27;

/// Which of the two transactions a workload runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `crossstitch-order-status`.
    OrderStatus,
    /// `crossstitch-stock-level`.
    StockLevel,
}

/// The rows, as functions of their ids and the shard count.
#[derive(Clone, Copy, Debug)]
struct Rows {
    shards: u64,
}

impl Rows {
    fn home(self, district: u64) -> u64 {
        district % self.shards
    }
    fn district_key(self, d: u64) -> Key {
        Key::table(DISTRICT_TABLE).u64(self.home(d)).u64(d).build()
    }
    fn customer_key(self, d: u64, c: u64) -> Key {
        Key::table(CUSTOMER_TABLE).u64(self.home(d)).u64(d).u64(c).build()
    }
    fn order_key(self, d: u64, o: u64) -> Key {
        Key::table(ORDER_TABLE).u64(self.home(d)).u64(d).u64(o).build()
    }
    fn line_key(self, d: u64, o: u64, l: u64) -> Key {
        Key::table(LINE_TABLE).u64(self.home(d)).u64(d).u64(o).u64(l).build()
    }
    fn stock_key(self, item: u64) -> Key {
        Key::table(STOCK_TABLE).u64(item % self.shards).u64(item).build()
    }
    /// The district's last order.
    fn last_order(self, d: u64) -> u64 {
        (d * 7 + 13) % CUSTOMERS
    }
    /// A customer's last order is its own number.
    fn customer_order(self, c: u64) -> u64 {
        c
    }
    fn lines(self, d: u64, o: u64) -> u64 {
        LINES_MIN + (d * 31 + o * 17) % LINES_SPREAD
    }
    /// The item of a line: one stocked on the district's shard.
    fn item(self, d: u64, o: u64, l: u64) -> u64 {
        self.home(d) + self.shards * ((d * 131 + o * 29 + l * 7) % (ITEMS / self.shards))
    }
    fn amount(self, d: u64, o: u64, l: u64) -> u64 {
        (d * 7 + o * 3 + l) % 10_000
    }
    fn quantity(self, item: u64) -> u64 {
        10 + (item * 37) % 91
    }
    /// What an order-status of customer `c` of district `d` answers: its order's total plus
    /// the sum of its lines' items (so a wrong line read shows).
    fn order_status(self, d: u64, c: u64) -> u64 {
        let o = self.customer_order(c);
        (1..=self.lines(d, o)).map(|l| self.amount(d, o, l) + self.item(d, o, l)).sum()
    }
    /// What a stock-level of district `d` answers: 1 when the item of the first line of its
    /// last order is below `threshold`.
    fn stock_level(self, d: u64, threshold: u64) -> u64 {
        let item = self.item(d, self.last_order(d), 1);
        u64::from(self.quantity(item) < threshold)
    }
}

fn uint(value: u64) -> Vec<u8> {
    value.to_le_bytes().to_vec()
}

fn read_uint(reads: &Reads, index: usize) -> Result<u64, UserAbort> {
    reads
        .values
        .get(index)
        .and_then(Option::as_ref)
        .and_then(|v| v.get(..8))
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or_else(|| UserAbort(format!("row {index} of the piece is missing")))
}

fn input(inputs: &[&PieceOutput], at: usize) -> Result<u64, ProcError> {
    inputs
        .first()
        .and_then(|o| o.get(at))
        .and_then(Datum::as_uint)
        .ok_or_else(|| ProcError::BadArgs("the previous piece's output is missing".into()))
}

/// The workload.
#[derive(Debug)]
pub struct CrossStitchTpcc {
    kind: Kind,
    rows: Rows,
}

impl CrossStitchTpcc {
    /// Builds the workload.
    pub fn new(kind: Kind, options: &WorkloadOptions) -> Result<Self, ConfigError> {
        if options.shards == 0 || u64::from(options.shards) > DISTRICTS {
            return Err(ConfigError::new(format!(
                "the CrossStitch TPC-C-like workloads spread {DISTRICTS} districts: 1..={DISTRICTS} shards, got {}",
                options.shards
            )));
        }
        Ok(Self { kind, rows: Rows { shards: u64::from(options.shards) } })
    }
}

impl Workload for CrossStitchTpcc {
    fn name(&self) -> &'static str {
        match self.kind {
            Kind::OrderStatus => "crossstitch-order-status",
            Kind::StockLevel => "crossstitch-stock-level",
        }
    }

    fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name(),
            "districts": DISTRICTS,
            "customers_per_district": CUSTOMERS,
            "items": ITEMS,
            "dependent_reads": match self.kind { Kind::OrderStatus => 3, Kind::StockLevel => 4 },
        })
    }

    fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        registry.register(Arc::new(OrderStatus { rows: self.rows }));
        registry.register(Arc::new(StockLevel { rows: self.rows }));
        registry
    }

    fn partitioner(&self) -> Partitioner {
        // Every key leads with its shard.
        Partitioner::new(
            self.rows.shards as u32,
            PartitionRule::LeadingInt { base: 0, per_shard: 1 },
        )
        .expect("1..=10 shards")
    }

    fn load(&self, shard: ShardId, store: &mut MvccStore) {
        let rows = self.rows;
        let s = u64::from(shard.0);
        for d in (0..DISTRICTS).filter(|&d| rows.home(d) == s) {
            store.load(rows.district_key(d), uint(rows.last_order(d)));
            for c in 0..CUSTOMERS {
                store.load(rows.customer_key(d, c), uint(rows.customer_order(c)));
                let o = c;
                store.load(rows.order_key(d, o), uint(rows.lines(d, o)));
                for l in 1..=rows.lines(d, o) {
                    store.load(rows.line_key(d, o, l), uint(rows.item(d, o, l)));
                }
            }
        }
        for item in (0..ITEMS).filter(|&i| i % rows.shards == s) {
            store.load(rows.stock_key(item), uint(rows.quantity(item)));
        }
    }

    fn generator(&self, client: u32, seed: u64) -> Box<dyn TxnGenerator> {
        Box::new(Generator {
            kind: self.kind,
            rng: child_rng(seed, "crossstitch-tpcc", u64::from(client)),
        })
    }

    fn checker(&self) -> Box<dyn InvariantCheck> {
        Box::new(ReadsCheck { rows: self.rows, committed: 0, checked: 0, wrong: Vec::new() })
    }
}

struct Generator {
    kind: Kind,
    rng: Rng,
}

impl TxnGenerator for Generator {
    fn next(&mut self, _request: RequestId) -> TxnRequest {
        let d = uniform_u64(&mut self.rng, DISTRICTS);
        match self.kind {
            Kind::OrderStatus => TxnRequest {
                proc: ProcId(0),
                args: vec![Datum::Uint(d), Datum::Uint(uniform_u64(&mut self.rng, CUSTOMERS))],
            },
            Kind::StockLevel => TxnRequest {
                proc: ProcId(1),
                args: vec![Datum::Uint(d), Datum::Uint(10 + uniform_u64(&mut self.rng, 11))],
            },
        }
    }
}

fn two_args(args: &Args, second_max: u64) -> Result<(u64, u64), ProcError> {
    match args.as_slice() {
        [Datum::Uint(d), Datum::Uint(x)] if *d < DISTRICTS && *x < second_max => Ok((*d, *x)),
        _ => Err(ProcError::BadArgs(format!(
            "takes [district < {DISTRICTS}, a number < {second_max}]"
        ))),
    }
}

fn chain_plan(home: u64, pieces: u32) -> Plan {
    (0..pieces)
        .map(|i| PieceSpec {
            target: ShardTarget::Shard(ShardId(home as u32)),
            deps: if i == 0 { Vec::new() } else { vec![i - 1] },
        })
        .collect()
}

/// Customer, then its order, then the order's lines.
#[derive(Debug)]
struct OrderStatus {
    rows: Rows,
}

impl Procedure for OrderStatus {
    fn name(&self) -> &'static str {
        "crossstitch-order-status"
    }
    fn plan(&self, args: &Args, _context: PlanContext<'_>) -> Result<Plan, ProcError> {
        let (d, _) = two_args(args, CUSTOMERS)?;
        Ok(chain_plan(self.rows.home(d), 3))
    }
    fn keys(&self, piece: u32, args: &Args, inputs: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let (d, c) = two_args(args, CUSTOMERS)?;
        let reads = match piece {
            0 => vec![self.rows.customer_key(d, c)],
            1 => vec![self.rows.order_key(d, input(inputs, 0)? % CUSTOMERS)],
            2 => {
                let (lines, o) = (input(inputs, 0)?, input(inputs, 1)? % CUSTOMERS);
                (1..=lines.min(LINES_MIN + LINES_SPREAD))
                    .map(|l| self.rows.line_key(d, o, l))
                    .collect()
            }
            _ => return Err(ProcError::BadArgs(format!("no piece {piece}"))),
        };
        Ok(KeySet { reads, ..KeySet::default() })
    }
    fn execute(
        &self,
        piece: u32,
        args: &Args,
        inputs: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let (d, _) = two_args(args, CUSTOMERS).map_err(|e| UserAbort(e.to_string()))?;
        let output = match piece {
            0 => vec![Datum::Uint(read_uint(reads, 0)?)],
            1 => {
                let o = input(inputs, 0).map_err(|e| UserAbort(e.to_string()))? % CUSTOMERS;
                vec![Datum::Uint(read_uint(reads, 0)?), Datum::Uint(o)]
            }
            _ => {
                let o = input(inputs, 1).map_err(|e| UserAbort(e.to_string()))? % CUSTOMERS;
                // Wrapping: a hostile row may hold anything (the checker compares the same sum).
                let mut total = 0u64;
                for l in 0..reads.values.len() {
                    let line =
                        read_uint(reads, l)?.wrapping_add(self.rows.amount(d, o, l as u64 + 1));
                    total = total.wrapping_add(line);
                }
                vec![Datum::Uint(total)]
            }
        };
        Ok(PieceEffects { writes: Vec::new(), output })
    }
}

/// District, then its last order, then the order's first line, then that item's stock.
#[derive(Debug)]
struct StockLevel {
    rows: Rows,
}

impl Procedure for StockLevel {
    fn name(&self) -> &'static str {
        "crossstitch-stock-level"
    }
    fn plan(&self, args: &Args, _context: PlanContext<'_>) -> Result<Plan, ProcError> {
        let (d, _) = two_args(args, 1_000)?;
        Ok(chain_plan(self.rows.home(d), 4))
    }
    fn keys(&self, piece: u32, args: &Args, inputs: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let (d, _) = two_args(args, 1_000)?;
        let read = match piece {
            0 => self.rows.district_key(d),
            1 => self.rows.order_key(d, input(inputs, 0)? % CUSTOMERS),
            2 => self.rows.line_key(d, input(inputs, 1)? % CUSTOMERS, 1),
            3 => self.rows.stock_key(input(inputs, 0)? % ITEMS),
            _ => return Err(ProcError::BadArgs(format!("no piece {piece}"))),
        };
        Ok(KeySet { reads: vec![read], ..KeySet::default() })
    }
    fn execute(
        &self,
        piece: u32,
        args: &Args,
        inputs: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let (_, threshold) = two_args(args, 1_000).map_err(|e| UserAbort(e.to_string()))?;
        let value = read_uint(reads, 0)?;
        let output = match piece {
            1 => {
                let o = input(inputs, 0).map_err(|e| UserAbort(e.to_string()))? % CUSTOMERS;
                vec![Datum::Uint(value), Datum::Uint(o)]
            }
            3 => vec![Datum::Uint(u64::from(value < threshold))],
            _ => vec![Datum::Uint(value)],
        };
        Ok(PieceEffects { writes: Vec::new(), output })
    }
}

/// Every committed answer equals the loaded rows' (see the module documentation).
struct ReadsCheck {
    rows: Rows,
    committed: u64,
    checked: u64,
    wrong: Vec<String>,
}

impl InvariantCheck for ReadsCheck {
    fn observe(&mut self, completion: &Completion) {
        if completion.outcome.result != TxnResult::Committed {
            return;
        }
        self.committed += 1;
        let answer =
            completion.outcome.outputs.last().and_then(|o| o.first()).and_then(Datum::as_uint);
        let Some(answer) = answer else { return }; // Outputs lost with a resolved reply.
        let expected = match (completion.txn.proc, two_args(&completion.txn.args, 1_000)) {
            (ProcId(0), Ok((d, c))) => self.rows.order_status(d, c),
            (ProcId(1), Ok((d, t))) => self.rows.stock_level(d, t),
            _ => return,
        };
        self.checked += 1;
        if answer != expected && self.wrong.len() < 5 {
            self.wrong.push(format!(
                "request {}: answered {answer}, the rows give {expected}",
                completion.request.0
            ));
        }
    }

    fn check(&self, _stores: &[(ShardId, &MvccStore)]) -> Vec<CheckResult> {
        let passed = self.wrong.is_empty();
        let detail = if passed {
            format!(
                "{} of {} committed answers checked against the rows",
                self.checked, self.committed
            )
        } else {
            format!("wrong answers: {}", self.wrong.join("; "))
        };
        vec![CheckResult { name: "crossstitch-reads".into(), passed, detail }]
    }

    fn needs_stores(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::txn::TxnOutcome;
    use meridian_core::NodeId;

    fn run_locally(w: &CrossStitchTpcc, txn: &TxnRequest) -> u64 {
        let mut stores: Vec<MvccStore> = (0..w.rows.shards).map(|_| MvccStore::new()).collect();
        for (s, store) in stores.iter_mut().enumerate() {
            w.load(ShardId(s as u32), store);
        }
        let partitioner = w.partitioner();
        let registry = w.registry();
        let procedure = registry.get(txn.proc).unwrap();
        let plan = procedure.plan(&txn.args, PlanContext { partitioner: &partitioner }).unwrap();
        let mut outputs: Vec<PieceOutput> = Vec::new();
        for (i, piece) in plan.iter().enumerate() {
            let ShardTarget::Shard(shard) = piece.target else { panic!("bound") };
            let inputs: Vec<&PieceOutput> =
                piece.deps.iter().map(|&d| &outputs[d as usize]).collect();
            let keys = procedure.keys(i as u32, &txn.args, &inputs).unwrap();
            assert!(
                keys.reads.iter().all(|k| partitioner.shard_of(k) == shard),
                "piece {i} on its shard"
            );
            let reads = Reads {
                values: keys
                    .reads
                    .iter()
                    .map(|k| {
                        stores[shard.0 as usize].read_latest(k).and_then(|v| v.value.as_deref())
                    })
                    .collect(),
                scans: vec![],
            };
            let effects = procedure.execute(i as u32, &txn.args, &inputs, &reads).unwrap();
            outputs.push(effects.output);
        }
        outputs.last().unwrap()[0].as_uint().unwrap()
    }

    #[test]
    fn chains_read_what_the_rows_give_and_the_check_catches_a_wrong_answer() {
        for (kind, pieces) in [(Kind::OrderStatus, 3), (Kind::StockLevel, 4)] {
            let options = WorkloadOptions { shards: 2, ..WorkloadOptions::default() };
            let w = CrossStitchTpcc::new(kind, &options).unwrap();
            let mut generator = w.generator(0, 3);
            let mut check = w.checker();
            for request in 0..40 {
                let txn = generator.next(RequestId(request));
                let plan = w
                    .registry()
                    .get(txn.proc)
                    .unwrap()
                    .plan(&txn.args, PlanContext { partitioner: &w.partitioner() })
                    .unwrap();
                assert_eq!(plan.len(), pieces);
                let answer = run_locally(&w, &txn);
                let outcome = TxnOutcome {
                    result: TxnResult::Committed,
                    outputs: vec![vec![Datum::Uint(answer)]],
                    ..TxnOutcome::failed(meridian_core::txn::TxnFailure::RetriesExhausted)
                };
                let completion = Completion {
                    client: 0,
                    coordinator: NodeId(0),
                    request: RequestId(request),
                    txn,
                    submitted_at: 0,
                    completed_at: 1,
                    outcome,
                    wan_hops: None,
                };
                check.observe(&completion);
            }
            assert!(check.check(&[])[0].passed, "{:?}", check.check(&[]));
            let txn = generator.next(RequestId(99));
            let outcome = TxnOutcome {
                result: TxnResult::Committed,
                outputs: vec![vec![Datum::Uint(run_locally(&w, &txn) + 1)]],
                ..TxnOutcome::failed(meridian_core::txn::TxnFailure::RetriesExhausted)
            };
            check.observe(&Completion {
                client: 0,
                coordinator: NodeId(0),
                request: RequestId(99),
                txn,
                submitted_at: 0,
                completed_at: 1,
                outcome,
                wan_hops: None,
            });
            assert!(!check.check(&[])[0].passed);
        }
        assert!(CrossStitchTpcc::new(
            Kind::OrderStatus,
            &WorkloadOptions { shards: 11, ..WorkloadOptions::default() }
        )
        .is_err());
    }
}
