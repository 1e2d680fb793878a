//! `smallbank`: BenchBase's SmallBank. Each customer has a savings and a checking balance,
//! opening at 10,000–50,000 cents each (drawn per customer from a fixed hash, so loading needs
//! no seed). Six transactions with BenchBase's weights; money is integer cents:
//!
//! | transaction | weight | effect |
//! |---|---|---|
//! | Amalgamate(c0, c1) | 15 | move all of c0's savings and checking into c1's checking; zero c0 |
//! | Balance(c) | 15 | read savings + checking |
//! | DepositChecking(c) | 15 | checking += 130 |
//! | SendPayment(c0, c1) | 25 | move 500 from c0's checking to c1's; user abort if c0 has less |
//! | TransactSavings(c) | 15 | savings −= 2,020; user abort if that would go negative |
//! | WriteCheck(c) | 15 | if savings + checking < 500: checking −= 600 (penalty), else −= 500 |
//!
//! Customers are drawn uniformly (BenchBase's default) or with Zipf skew over every shard.
//! Amalgamate's second piece depends on the first (it credits what the first moved), so it runs
//! in two waves.
//!
//! Keys: `table 6 ‖ customer` (savings) and `table 7 ‖ customer` (checking), shard
//! `customer / keys_per_shard`; balances are `i64` cents little-endian.
//!
//! Invariant (`smallbank-money`, on the final stores): the balances sum to the loaded total plus
//! the deposits, minus the savings withdrawals and the checks written, of the committed
//! transactions (each reports the amount it moved); transactions of unknown outcome widen the
//! allowed range by what they could have moved. Amalgamate and SendPayment conserve money.

use crate::dist::{KeyDist, ShardedKeys};
use crate::{CheckResult, Completion, InvariantCheck, TxnGenerator, Workload, WorkloadOptions};
use meridian_core::key::Key;
use meridian_core::rng::{child_rng, fnv1a, uniform_u64, Rng, FNV_OFFSET};
use meridian_core::txn::{
    Args, Datum, KeySet, Partitioner, PieceEffects, PieceOutput, PieceSpec, Plan, PlanContext,
    ProcError, ProcId, Procedure, Reads, Registry, ShardTarget, TxnRequest, TxnResult, UserAbort,
    Write,
};
use meridian_core::{ConfigError, RequestId, ShardId, Time};
use meridian_storage::MvccStore;
use std::sync::Arc;

/// Table byte of savings balances.
pub const SAVINGS_TABLE: u8 = 6;
/// Table byte of checking balances.
pub const CHECKING_TABLE: u8 = 7;
/// Lowest opening balance (cents).
pub const OPENING_CENTS_MIN: i64 = 10_000;
/// Highest opening balance (cents).
pub const OPENING_CENTS_MAX: i64 = 50_000;
/// DepositChecking's amount (cents).
pub const DEPOSIT_CENTS: i64 = 130;
/// SendPayment's and WriteCheck's amount (cents).
pub const PAYMENT_CENTS: i64 = 500;
/// TransactSavings' withdrawal (cents).
pub const SAVINGS_WITHDRAWAL_CENTS: i64 = 2_020;
/// WriteCheck's overdraft penalty (cents).
pub const OVERDRAFT_PENALTY_CENTS: i64 = 100;
/// Transaction weights, in the order of [`Kind`].
pub const WEIGHTS: [u64; 6] = [15, 15, 15, 25, 15, 15];

const _: () = assert!(OPENING_CENTS_MIN <= OPENING_CENTS_MAX);

/// The six transactions, in registry order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Amalgamate,
    Balance,
    DepositChecking,
    SendPayment,
    TransactSavings,
    WriteCheck,
}

const KINDS: [Kind; 6] = [
    Kind::Amalgamate,
    Kind::Balance,
    Kind::DepositChecking,
    Kind::SendPayment,
    Kind::TransactSavings,
    Kind::WriteCheck,
];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Amalgamate => "smallbank-amalgamate",
            Self::Balance => "smallbank-balance",
            Self::DepositChecking => "smallbank-deposit-checking",
            Self::SendPayment => "smallbank-send-payment",
            Self::TransactSavings => "smallbank-transact-savings",
            Self::WriteCheck => "smallbank-write-check",
        }
    }

    fn customers(self) -> usize {
        match self {
            Self::Amalgamate | Self::SendPayment => 2,
            _ => 1,
        }
    }

    /// The range of money a committed transaction of this kind adds to the total.
    fn delta_range(self) -> (i64, i64) {
        match self {
            Self::DepositChecking => (DEPOSIT_CENTS, DEPOSIT_CENTS),
            Self::TransactSavings => (-SAVINGS_WITHDRAWAL_CENTS, -SAVINGS_WITHDRAWAL_CENTS),
            Self::WriteCheck => (-(PAYMENT_CENTS + OVERDRAFT_PENALTY_CENTS), -PAYMENT_CENTS),
            _ => (0, 0),
        }
    }
}

fn savings_key(customer: u64) -> Key {
    Key::table(SAVINGS_TABLE).u64(customer).build()
}

fn checking_key(customer: u64) -> Key {
    Key::table(CHECKING_TABLE).u64(customer).build()
}

/// The opening balance of `customer`'s account in `table`: uniform in the opening range, from
/// a fixed hash.
fn opening_cents(table: u8, customer: u64) -> i64 {
    let h = fnv1a(fnv1a(FNV_OFFSET, &[table]), &customer.to_le_bytes());
    OPENING_CENTS_MIN + (h % (OPENING_CENTS_MAX - OPENING_CENTS_MIN + 1) as u64) as i64
}

fn cents(value: Option<&[u8]>) -> Result<i64, UserAbort> {
    let bytes: [u8; 8] = value
        .and_then(|v| v.try_into().ok())
        .ok_or_else(|| UserAbort("missing or corrupt balance".into()))?;
    Ok(i64::from_le_bytes(bytes))
}

fn write(key: Key, cents: i64) -> Write {
    Write { key, value: Some(cents.to_le_bytes().to_vec()) }
}

/// The workload.
#[derive(Debug)]
pub struct SmallBank {
    keys: ShardedKeys,
}

impl SmallBank {
    /// Checks the options and builds the workload.
    pub fn new(options: &WorkloadOptions) -> Result<Self, ConfigError> {
        if options.shards == 0 {
            return Err(ConfigError::new("smallbank needs at least one shard"));
        }
        let customers = u64::from(options.shards) * options.keys_per_shard;
        if customers < 2 {
            return Err(ConfigError::new(format!(
                "smallbank needs at least 2 customers in all, got {customers}"
            )));
        }
        let dist = KeyDist::new(options.keys_per_shard, options.zipf_theta)?;
        Ok(Self {
            keys: ShardedKeys { shards: options.shards, per_shard: options.keys_per_shard, dist },
        })
    }

    fn customers(&self) -> u64 {
        self.keys.items()
    }
}

impl Workload for SmallBank {
    fn name(&self) -> &'static str {
        "smallbank"
    }

    fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "name": "smallbank",
            "customers": self.customers(),
            "weights": {"amalgamate": 15, "balance": 15, "deposit_checking": 15, "send_payment": 25, "transact_savings": 15, "write_check": 15},
            "opening_cents": [OPENING_CENTS_MIN, OPENING_CENTS_MAX],
            "distribution": match &self.keys.dist { KeyDist::Uniform { .. } => "uniform", KeyDist::Zipf(_) => "zipf" },
        })
    }

    fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        for kind in KINDS {
            registry.register(Arc::new(SmallBankTxn { kind, per_shard: self.keys.per_shard }));
        }
        registry
    }

    fn partitioner(&self) -> Partitioner {
        self.keys.partitioner()
    }

    fn load(&self, shard: ShardId, store: &mut MvccStore) {
        let first = u64::from(shard.0) * self.keys.per_shard;
        for customer in first..first + self.keys.per_shard {
            let savings = opening_cents(SAVINGS_TABLE, customer);
            store.load(savings_key(customer), savings.to_le_bytes().to_vec());
            let checking = opening_cents(CHECKING_TABLE, customer);
            store.load(checking_key(customer), checking.to_le_bytes().to_vec());
        }
    }

    fn generator(&self, client: u32, seed: u64) -> Box<dyn TxnGenerator> {
        Box::new(SmallBankGenerator {
            rng: child_rng(seed, "smallbank-client", u64::from(client)),
            keys: self.keys.clone(),
        })
    }

    fn checker(&self) -> Box<dyn InvariantCheck> {
        let opening = (0..self.customers())
            .map(|c| i128::from(opening_cents(SAVINGS_TABLE, c) + opening_cents(CHECKING_TABLE, c)))
            .sum();
        Box::new(MoneyCheck { customers: self.customers(), expected: opening, slack: (0, 0) })
    }
}

struct SmallBankGenerator {
    rng: Rng,
    keys: ShardedKeys,
}

impl TxnGenerator for SmallBankGenerator {
    fn next(&mut self, _request: RequestId) -> TxnRequest {
        let mut roll = uniform_u64(&mut self.rng, WEIGHTS.iter().sum());
        let mut index = 0;
        while roll >= WEIGHTS[index] {
            roll -= WEIGHTS[index];
            index += 1;
        }
        let kind = KINDS[index];
        let customers = self.keys.distinct(&mut self.rng, kind.customers());
        TxnRequest {
            proc: ProcId(index as u32),
            args: customers.into_iter().map(Datum::Uint).collect(),
        }
    }
}

/// One SmallBank transaction kind.
#[derive(Debug)]
struct SmallBankTxn {
    kind: Kind,
    per_shard: u64,
}

impl SmallBankTxn {
    fn customers(&self, args: &Args) -> Result<Vec<u64>, ProcError> {
        let ids: Option<Vec<u64>> = args.iter().map(Datum::as_uint).collect();
        match ids {
            Some(ids)
                if ids.len() == self.kind.customers() && (ids.len() < 2 || ids[0] != ids[1]) =>
            {
                Ok(ids)
            }
            _ => Err(ProcError::BadArgs(format!(
                "{} takes {} distinct customer ids",
                self.kind.name(),
                self.kind.customers()
            ))),
        }
    }

    fn shard_of(&self, customer: u64) -> ShardId {
        ShardId((customer / self.per_shard) as u32)
    }
}

impl Procedure for SmallBankTxn {
    fn name(&self) -> &'static str {
        self.kind.name()
    }

    fn plan(&self, args: &Args, context: PlanContext<'_>) -> Result<Plan, ProcError> {
        let customers = self.customers(args)?;
        if customers.iter().any(|&c| self.shard_of(c).0 >= context.partitioner.shards()) {
            return Err(ProcError::BadArgs("a customer is beyond the cluster".into()));
        }
        let piece = |c: u64, deps: Vec<u32>| PieceSpec {
            target: ShardTarget::Shard(self.shard_of(c)),
            deps,
        };
        Ok(match self.kind {
            // The credit needs to know how much the debit moved.
            Kind::Amalgamate => vec![piece(customers[0], vec![]), piece(customers[1], vec![0])],
            Kind::SendPayment => vec![piece(customers[0], vec![]), piece(customers[1], vec![])],
            _ => vec![piece(customers[0], vec![])],
        })
    }

    fn keys(&self, piece: u32, args: &Args, _inputs: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let customers = self.customers(args)?;
        let c = *customers.get(piece as usize).ok_or_else(|| {
            ProcError::BadArgs(format!("{} has no piece {piece}", self.kind.name()))
        })?;
        let (reads, writes) = match (self.kind, piece) {
            (Kind::Amalgamate, 0) | (Kind::WriteCheck, _) => {
                let both = vec![savings_key(c), checking_key(c)];
                let writes = if self.kind == Kind::WriteCheck {
                    vec![checking_key(c)]
                } else {
                    both.clone()
                };
                (both, writes)
            }
            (Kind::Balance, _) => (vec![savings_key(c), checking_key(c)], vec![]),
            (Kind::TransactSavings, _) => (vec![savings_key(c)], vec![savings_key(c)]),
            _ => (vec![checking_key(c)], vec![checking_key(c)]),
        };
        Ok(KeySet { reads, writes, scans: Vec::new() })
    }

    fn execute(
        &self,
        piece: u32,
        args: &Args,
        inputs: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let customers = self.customers(args).map_err(|e| UserAbort(e.to_string()))?;
        let c = customers[piece as usize];
        let value = |i: usize| cents(reads.values.get(i).copied().flatten());
        let mut effects = PieceEffects::default();
        // Every piece outputs the money it added to the total (negative when it took some).
        let added = match (self.kind, piece) {
            (Kind::Amalgamate, 0) => {
                let total = value(0)? + value(1)?;
                effects.writes = vec![write(savings_key(c), 0), write(checking_key(c), 0)];
                effects.output.push(Datum::Int(total));
                -total
            }
            (Kind::Amalgamate, _) => {
                let moved = match inputs.first().and_then(|o| o.first()) {
                    Some(Datum::Int(moved)) => *moved,
                    _ => return Err(UserAbort("amalgamate's credit lost its input".into())),
                };
                effects.writes = vec![write(checking_key(c), value(0)? + moved)];
                moved
            }
            (Kind::Balance, _) => {
                effects.output.push(Datum::Int(value(0)? + value(1)?));
                0
            }
            (Kind::DepositChecking, _) => {
                effects.writes = vec![write(checking_key(c), value(0)? + DEPOSIT_CENTS)];
                DEPOSIT_CENTS
            }
            (Kind::SendPayment, 0) => {
                let balance = value(0)?;
                if balance < PAYMENT_CENTS {
                    return Err(UserAbort(format!("customer {c} has {balance} cents in checking")));
                }
                effects.writes = vec![write(checking_key(c), balance - PAYMENT_CENTS)];
                -PAYMENT_CENTS
            }
            (Kind::SendPayment, _) => {
                effects.writes = vec![write(checking_key(c), value(0)? + PAYMENT_CENTS)];
                PAYMENT_CENTS
            }
            (Kind::TransactSavings, _) => {
                let after = value(0)? - SAVINGS_WITHDRAWAL_CENTS;
                if after < 0 {
                    return Err(UserAbort(format!(
                        "customer {c} would owe {after} cents in savings"
                    )));
                }
                effects.writes = vec![write(savings_key(c), after)];
                -SAVINGS_WITHDRAWAL_CENTS
            }
            (Kind::WriteCheck, _) => {
                let (savings, checking) = (value(0)?, value(1)?);
                let debit = if savings + checking < PAYMENT_CENTS {
                    PAYMENT_CENTS + OVERDRAFT_PENALTY_CENTS
                } else {
                    PAYMENT_CENTS
                };
                effects.writes = vec![write(checking_key(c), checking - debit)];
                -debit
            }
        };
        effects.output.push(Datum::Int(added));
        Ok(effects)
    }
}

/// The money invariant (see the module documentation).
struct MoneyCheck {
    customers: u64,
    expected: i128,
    /// What transactions of unknown outcome could have added: (lowest, highest).
    slack: (i128, i128),
}

impl InvariantCheck for MoneyCheck {
    fn observe(&mut self, completion: &Completion) {
        if completion.outcome.result != TxnResult::Committed {
            return;
        }
        if completion.outcome.outputs.is_empty() {
            // Committed, but what it moved is unknown (its reply was lost): bound it.
            self.unanswered(0, completion.request, &completion.txn, completion.submitted_at);
            return;
        }
        // The last output of every piece is the money that piece added.
        for output in &completion.outcome.outputs {
            if let Some(Datum::Int(added)) = output.last() {
                self.expected += i128::from(*added);
            }
        }
    }

    fn unanswered(&mut self, _client: u32, _request: RequestId, txn: &TxnRequest, _at: Time) {
        let Some(&kind) = KINDS.get(txn.proc.0 as usize) else { return };
        let (low, high) = kind.delta_range();
        self.slack.0 += i128::from(low.min(0));
        self.slack.1 += i128::from(high.max(0));
    }

    fn check(&self, stores: &[(ShardId, &MvccStore)]) -> Vec<CheckResult> {
        let mut total = 0i128;
        let mut balances = 0u64;
        let mut problems = Vec::new();
        for (_, store) in stores {
            for (key, version) in store.latest_values() {
                balances += 1;
                match cents(version.value.as_deref()) {
                    Ok(c) => total += i128::from(c),
                    Err(_) if problems.len() < 5 => {
                        problems.push(format!("{key:?} holds no balance"))
                    }
                    Err(_) => {}
                }
            }
        }
        if balances != 2 * self.customers {
            problems.push(format!("{balances} balances found, {} expected", 2 * self.customers));
        }
        let (low, high) = (self.expected + self.slack.0, self.expected + self.slack.1);
        if total < low || total > high {
            problems.push(format!(
                "the balances sum to {total} cents; the committed transactions account for {} (allowed {low}..={high})",
                self.expected
            ));
        }
        let passed = problems.is_empty();
        let detail = if passed {
            format!("{balances} balances sum to {total} cents, as the committed transactions account for")
        } else {
            problems.join("; ")
        };
        vec![CheckResult { name: "smallbank-money".into(), passed, detail }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::loaded_stores;
    use crate::testkit::{apply_serially as apply, check_stores as run_check, completion};
    use meridian_core::time::Timestamp;

    fn smallbank() -> SmallBank {
        SmallBank::new(&WorkloadOptions {
            shards: 2,
            keys_per_shard: 6,
            zipf_theta: None,
            ops_max: None,
            distribution: None,
            region_groups: None,
            tpcc: Default::default(),
        })
        .unwrap()
    }

    #[test]
    fn every_transaction_keeps_the_books_and_the_check_catches_a_lost_debit() {
        let w = smallbank();
        let mut stores = loaded_stores(&w, 2);
        let mut check = w.checker();
        let mut generator = w.generator(0, 5);
        let mut seen = [0u32; 6];
        let mut aborted = 0;
        for ts in 1..3_000u64 {
            let txn = generator.next(RequestId(ts));
            seen[txn.proc.0 as usize] += 1;
            let outcome = apply(&w, &mut stores, &txn, ts);
            if outcome.result != TxnResult::Committed {
                aborted += 1;
            }
            check.observe(&completion(ts, txn, outcome));
        }
        // The mix follows the weights (25% SendPayment, 15% each of the others).
        let send = f64::from(seen[3]) / 2_999.0;
        assert!((send - 0.25).abs() < 0.03, "send payment share {send}");
        assert!(
            aborted > 0,
            "amalgamate empties accounts, so later payments and withdrawals abort"
        );
        let result = run_check(check.as_ref(), &stores);
        assert!(result.passed, "{}", result.detail);
        // Undo one check's debit on a checking account: the books no longer balance.
        let key = checking_key(3);
        let current = cents(stores[0].get_at(&key, Timestamp::MAX).map(Vec::as_slice)).unwrap();
        stores[0].load(key, (current + PAYMENT_CENTS).to_le_bytes().to_vec());
        let result = run_check(check.as_ref(), &stores);
        assert!(!result.passed && result.detail.contains("allowed"), "{}", result.detail);
    }

    #[test]
    fn overdrafts_and_write_check_penalties_follow_the_rules() {
        let w = smallbank();
        let mut stores = loaded_stores(&w, 2);
        stores[0].load(savings_key(1), 100i64.to_le_bytes().to_vec());
        stores[0].load(checking_key(1), 200i64.to_le_bytes().to_vec());
        let txn = |proc: u32, ids: &[u64]| TxnRequest {
            proc: ProcId(proc),
            args: ids.iter().map(|&i| Datum::Uint(i)).collect(),
        };
        // TransactSavings would go negative; SendPayment lacks funds: user aborts.
        assert!(matches!(
            apply(&w, &mut stores, &txn(4, &[1]), 1).result,
            TxnResult::UserAborted(_)
        ));
        assert!(matches!(
            apply(&w, &mut stores, &txn(3, &[1, 7]), 2).result,
            TxnResult::UserAborted(_)
        ));
        // WriteCheck with 300 cents in all: 500 plus the 100 penalty.
        apply(&w, &mut stores, &txn(5, &[1]), 3);
        assert_eq!(
            cents(stores[0].get_at(&checking_key(1), Timestamp::MAX).map(Vec::as_slice)).unwrap(),
            200 - 600
        );
        // Amalgamate across shards moves everything into the other customer's checking.
        let before =
            cents(stores[1].get_at(&checking_key(7), Timestamp::MAX).map(Vec::as_slice)).unwrap();
        apply(&w, &mut stores, &txn(0, &[1, 7]), 4);
        assert_eq!(
            cents(stores[1].get_at(&checking_key(7), Timestamp::MAX).map(Vec::as_slice)).unwrap(),
            before + 100 - 400
        );
        assert_eq!(
            cents(stores[0].get_at(&savings_key(1), Timestamp::MAX).map(Vec::as_slice)).unwrap(),
            0
        );
        let bad = SmallBank::new(&WorkloadOptions {
            shards: 1,
            keys_per_shard: 1,
            zipf_theta: None,
            ops_max: None,
            distribution: None,
            region_groups: None,
            tpcc: Default::default(),
        });
        assert!(bad.unwrap_err().0.contains("at least 2 customers"));
    }
}
