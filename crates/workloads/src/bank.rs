//! `bank`: a closed economy (Jepsen's bank test, YCSB+T's closed economy workload). Accounts
//! start with [`INITIAL_BALANCE_CENTS`] each; 90% of transactions move 1 to
//! [`TRANSFER_CENTS_MAX`] cents between two distinct accounts (a user abort when the payer
//! cannot cover it: never retried, nothing written), 10% read [`AUDIT_ACCOUNTS`] accounts.
//! Accounts are chosen uniformly or with Zipf skew, over every shard, so most transfers with
//! several shards cross them.
//!
//! Keys are `table 3 ‖ account:u64`, shard `account / keys_per_shard`; a balance is an `i64`
//! (cents) little-endian. Money is integer cents throughout.
//!
//! Invariants, checked on the final stores:
//! - `bank-total`: every account exists, no balance is negative, and the balances sum to the
//!   initial total. A transfer applied on one side only, a lost update or a write of an aborted
//!   transfer breaks the sum.
//! - `bank-accounts`: every account holds its initial balance plus the transfers in and out
//!   that the clients saw commit, and plus some subset of the transfers whose outcome they never
//!   learned. A transfer applied twice, a lost one, or two transfers that both spent money only
//!   one of them could (write skew) conserve the total but break this.

use crate::dist::{KeyDist, ShardedKeys};
use crate::{CheckResult, Completion, InvariantCheck, TxnGenerator, Workload, WorkloadOptions};
use meridian_core::key::Key;
use meridian_core::rng::{child_rng, uniform_u64, Rng};
use meridian_core::txn::{
    Args, Datum, KeySet, Partitioner, PieceEffects, PieceOutput, PieceSpec, Plan, PlanContext,
    ProcError, ProcId, Procedure, Reads, Registry, ShardTarget, TxnRequest, TxnResult, UserAbort,
    Write,
};
use meridian_core::{ConfigError, RequestId, ShardId};
use meridian_storage::MvccStore;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The table byte of accounts.
pub const BANK_TABLE: u8 = 3;
/// Every account's opening balance (cents).
pub const INITIAL_BALANCE_CENTS: i64 = 10_000;
/// Largest transfer (cents).
pub const TRANSFER_CENTS_MAX: u64 = 500;
/// Accounts an audit reads.
pub const AUDIT_ACCOUNTS: usize = 4;
/// Percent of transactions that are transfers.
pub const TRANSFER_PERCENT: u64 = 90;

const TRANSFER: ProcId = ProcId(0);
const AUDIT: ProcId = ProcId(1);

/// The key of `account`.
pub fn account_key(account: u64) -> Key {
    Key::table(BANK_TABLE).u64(account).build()
}

fn balance_of(value: Option<&[u8]>) -> Option<i64> {
    let bytes: [u8; 8] = value?.try_into().ok()?;
    Some(i64::from_le_bytes(bytes))
}

/// The workload.
#[derive(Debug)]
pub struct Bank {
    keys: ShardedKeys,
}

impl Bank {
    /// Checks the options and builds the workload.
    pub fn new(options: &WorkloadOptions) -> Result<Self, ConfigError> {
        if options.shards == 0 {
            return Err(ConfigError::new("bank needs at least one shard"));
        }
        let accounts = u64::from(options.shards) * options.keys_per_shard;
        if accounts < AUDIT_ACCOUNTS as u64 {
            return Err(ConfigError::new(format!(
                "bank needs at least {AUDIT_ACCOUNTS} accounts in all, got {accounts}"
            )));
        }
        let dist = KeyDist::new(options.keys_per_shard, options.zipf_theta)?;
        Ok(Self {
            keys: ShardedKeys { shards: options.shards, per_shard: options.keys_per_shard, dist },
        })
    }

    fn accounts(&self) -> u64 {
        self.keys.items()
    }
}

impl Workload for Bank {
    fn name(&self) -> &'static str {
        "bank"
    }

    fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "name": "bank",
            "accounts": self.accounts(),
            "initial_balance_cents": INITIAL_BALANCE_CENTS,
            "transfer_percent": TRANSFER_PERCENT,
            "transfer_cents_max": TRANSFER_CENTS_MAX,
            "audit_accounts": AUDIT_ACCOUNTS,
            "distribution": match &self.keys.dist { KeyDist::Uniform { .. } => "uniform", KeyDist::Zipf(_) => "zipf" },
        })
    }

    fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        let per_shard = self.keys.per_shard;
        registry.register(Arc::new(Transfer { per_shard }));
        registry.register(Arc::new(Audit { per_shard }));
        registry
    }

    fn partitioner(&self) -> Partitioner {
        self.keys.partitioner()
    }

    fn load(&self, shard: ShardId, store: &mut MvccStore) {
        let first = u64::from(shard.0) * self.keys.per_shard;
        for account in first..first + self.keys.per_shard {
            store.load(account_key(account), INITIAL_BALANCE_CENTS.to_le_bytes().to_vec());
        }
    }

    fn generator(&self, client: u32, seed: u64) -> Box<dyn TxnGenerator> {
        Box::new(BankGenerator {
            rng: child_rng(seed, "bank-client", u64::from(client)),
            keys: self.keys.clone(),
        })
    }

    fn checker(&self) -> Box<dyn InvariantCheck> {
        Box::new(BankCheck {
            accounts: self.accounts(),
            committed: BTreeMap::new(),
            uncertain: BTreeMap::new(),
            transfers_committed: 0,
            observed: false,
        })
    }
}

struct BankGenerator {
    rng: Rng,
    keys: ShardedKeys,
}

impl TxnGenerator for BankGenerator {
    fn next(&mut self, _request: RequestId) -> TxnRequest {
        if uniform_u64(&mut self.rng, 100) < TRANSFER_PERCENT {
            let accounts = self.keys.distinct(&mut self.rng, 2);
            let cents = 1 + uniform_u64(&mut self.rng, TRANSFER_CENTS_MAX);
            TxnRequest {
                proc: TRANSFER,
                args: vec![Datum::Uint(accounts[0]), Datum::Uint(accounts[1]), Datum::Uint(cents)],
            }
        } else {
            let accounts = self.keys.distinct(&mut self.rng, AUDIT_ACCOUNTS);
            TxnRequest {
                proc: AUDIT,
                args: vec![Datum::List(accounts.into_iter().map(Datum::Uint).collect())],
            }
        }
    }
}

/// Moves `args[2]` cents from account `args[0]` to account `args[1]`: one piece per shard.
#[derive(Debug)]
struct Transfer {
    per_shard: u64,
}

impl Transfer {
    fn parse(args: &Args) -> Result<(u64, u64, i64), ProcError> {
        match args.as_slice() {
            [Datum::Uint(from), Datum::Uint(to), Datum::Uint(cents)]
                if from != to && *cents > 0 && *cents <= TRANSFER_CENTS_MAX =>
            {
                Ok((*from, *to, *cents as i64))
            }
            _ => Err(ProcError::BadArgs(format!(
                "transfer takes [from, to, cents] with distinct accounts and 1..={TRANSFER_CENTS_MAX} cents"
            ))),
        }
    }

    /// The accounts piece `piece` handles: both on one shard, or one each.
    fn accounts_of(&self, piece: u32, args: &Args) -> Result<Vec<u64>, ProcError> {
        let (from, to, _) = Self::parse(args)?;
        let same = from / self.per_shard == to / self.per_shard;
        match (piece, same) {
            (0, true) => Ok(vec![from, to]),
            (0, false) => Ok(vec![from]),
            (1, false) => Ok(vec![to]),
            _ => Err(ProcError::BadArgs(format!("transfer has no piece {piece}"))),
        }
    }
}

impl Procedure for Transfer {
    fn name(&self) -> &'static str {
        "bank-transfer"
    }

    fn plan(&self, args: &Args, context: PlanContext<'_>) -> Result<Plan, ProcError> {
        let (from, to, _) = Self::parse(args)?;
        let shards = context.partitioner.shards();
        let mut plan = Vec::new();
        for account in [from, to] {
            let shard = (account / self.per_shard) as u32;
            if shard >= shards {
                return Err(ProcError::BadArgs(format!("account {account} is beyond the cluster")));
            }
            let target = ShardTarget::Shard(ShardId(shard));
            if plan.iter().all(|p: &PieceSpec| p.target != target) {
                plan.push(PieceSpec { target, deps: Vec::new() });
            }
        }
        Ok(plan)
    }

    fn keys(&self, piece: u32, args: &Args, _inputs: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let keys: Vec<Key> = self.accounts_of(piece, args)?.into_iter().map(account_key).collect();
        Ok(KeySet { reads: keys.clone(), writes: keys, scans: Vec::new() })
    }

    fn execute(
        &self,
        piece: u32,
        args: &Args,
        _inputs: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let (from, _, cents) = Transfer::parse(args).map_err(|e| UserAbort(e.to_string()))?;
        let accounts = self.accounts_of(piece, args).map_err(|e| UserAbort(e.to_string()))?;
        let mut effects = PieceEffects::default();
        for (account, value) in accounts.into_iter().zip(&reads.values) {
            let balance = balance_of(value.as_deref())
                .ok_or_else(|| UserAbort(format!("account {account} is missing or corrupt")))?;
            let after = if account == from {
                if balance < cents {
                    return Err(UserAbort(format!(
                        "account {account} holds {balance} cents, cannot pay {cents}"
                    )));
                }
                balance - cents
            } else {
                balance + cents
            };
            effects.writes.push(Write {
                key: account_key(account),
                value: Some(after.to_le_bytes().to_vec()),
            });
            effects.output.push(Datum::Int(after));
        }
        Ok(effects)
    }
}

/// Reads the balances of the accounts in `args[0]`: one piece per shard.
#[derive(Debug)]
struct Audit {
    per_shard: u64,
}

impl Audit {
    fn accounts(args: &Args) -> Result<Vec<u64>, ProcError> {
        match args.as_slice() {
            [Datum::List(items)] if items.len() <= AUDIT_ACCOUNTS => items
                .iter()
                .map(|d| d.as_uint().ok_or_else(|| ProcError::BadArgs("accounts are ids".into())))
                .collect(),
            _ => Err(ProcError::BadArgs(format!("audit takes [[account; ≤ {AUDIT_ACCOUNTS}]]"))),
        }
    }

    fn shards(&self, accounts: &[u64]) -> Vec<u64> {
        crate::shards_of(accounts.iter().copied(), self.per_shard)
    }
}

impl Procedure for Audit {
    fn name(&self) -> &'static str {
        "bank-audit"
    }

    fn plan(&self, args: &Args, context: PlanContext<'_>) -> Result<Plan, ProcError> {
        let accounts = Self::accounts(args)?;
        crate::piece_per_shard(self.shards(&accounts), context, "an account")
    }

    fn keys(&self, piece: u32, args: &Args, _inputs: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let accounts = Self::accounts(args)?;
        let shard = *self
            .shards(&accounts)
            .get(piece as usize)
            .ok_or_else(|| ProcError::BadArgs(format!("audit has no piece {piece}")))?;
        let reads =
            accounts.into_iter().filter(|a| a / self.per_shard == shard).map(account_key).collect();
        Ok(KeySet { reads, writes: Vec::new(), scans: Vec::new() })
    }

    fn execute(
        &self,
        _piece: u32,
        _args: &Args,
        _inputs: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let output = reads
            .values
            .iter()
            .map(|v| balance_of(v.as_deref()).map_or(Datum::List(Vec::new()), Datum::Int))
            .collect();
        Ok(PieceEffects { writes: Vec::new(), output })
    }
}

/// Most transfers of unknown outcome per account whose subsets the per-account check tries;
/// an account with more is counted as not checked.
const UNCERTAIN_PER_ACCOUNT_MAX: usize = 64;

/// The closed-economy invariants (see the module documentation).
struct BankCheck {
    accounts: u64,
    /// Per account: the sum of the committed transfers in and out (cents).
    committed: BTreeMap<u64, i64>,
    /// Per account: the deltas of transfers whose outcome is unknown.
    uncertain: BTreeMap<u64, Vec<i64>>,
    transfers_committed: u64,
    /// True once any request was seen: a checker that saw none (an offline rebuild of a
    /// server's log) knows no transfers to compare with and skips `bank-accounts`.
    observed: bool,
}

impl BankCheck {
    fn note(&mut self, args: &Args, certain: bool) {
        let Ok((from, to, cents)) = Transfer::parse(args) else { return };
        for (account, delta) in [(from, -cents), (to, cents)] {
            if certain {
                *self.committed.entry(account).or_default() += delta;
            } else {
                self.uncertain.entry(account).or_default().push(delta);
            }
        }
    }

    /// The per-account check: each balance is the initial one, plus its committed transfers,
    /// plus a subset of its transfers of unknown outcome.
    fn check_accounts(&self, stores: &[(ShardId, &MvccStore)]) -> CheckResult {
        let mut problems = Vec::new();
        let (mut checked, mut too_uncertain) = (0u64, 0u64);
        for (_, store) in stores {
            for (key, version) in store.latest_values() {
                let Ok(account) = key.reader().u64() else { continue };
                let Some(balance) = balance_of(version.value.as_deref()) else { continue };
                let expected = INITIAL_BALANCE_CENTS + self.committed.get(&account).unwrap_or(&0);
                let off = balance - expected;
                let uncertain = self.uncertain.get(&account).map_or(&[][..], Vec::as_slice);
                if uncertain.len() > UNCERTAIN_PER_ACCOUNT_MAX {
                    too_uncertain += 1;
                    continue;
                }
                checked += 1;
                // Every sum a subset of the unknown transfers can make (bounded: at most 64
                // transfers of at most 500 cents).
                let mut reachable = std::collections::BTreeSet::from([0i64]);
                for delta in uncertain {
                    let shifted: Vec<i64> = reachable.iter().map(|s| s + delta).collect();
                    reachable.extend(shifted);
                }
                if !reachable.contains(&off) && problems.len() < 5 {
                    problems.push(format!(
                        "account {account} holds {balance} cents, {expected} expected from its \
                         committed transfers (off by {off}; {} of unknown outcome)",
                        uncertain.len()
                    ));
                }
            }
        }
        let passed = problems.is_empty();
        let detail = if passed {
            format!(
                "{checked} accounts match their {} committed transfers{}",
                self.transfers_committed,
                if too_uncertain > 0 {
                    format!("; {too_uncertain} not checked (too many unknown outcomes)")
                } else {
                    String::new()
                }
            )
        } else {
            problems.join("; ")
        };
        CheckResult { name: "bank-accounts".into(), passed, detail }
    }
}

impl InvariantCheck for BankCheck {
    fn observe(&mut self, completion: &Completion) {
        self.observed = true;
        if completion.txn.proc != TRANSFER {
            return;
        }
        match &completion.outcome.result {
            TxnResult::Committed => {
                self.transfers_committed += 1;
                self.note(&completion.txn.args, true);
            }
            result if !result.certainly_not_committed() => self.note(&completion.txn.args, false),
            _ => {}
        }
    }

    fn unanswered(
        &mut self,
        _client: u32,
        _request: RequestId,
        txn: &TxnRequest,
        _submitted_at: meridian_core::Time,
    ) {
        self.observed = true;
        if txn.proc == TRANSFER {
            self.note(&txn.args, false);
        }
    }

    fn check(&self, stores: &[(ShardId, &MvccStore)]) -> Vec<CheckResult> {
        let mut problems: Vec<String> = Vec::new();
        let (mut total, mut found) = (0i128, 0u64);
        for (shard, store) in stores {
            for (key, version) in store.latest_values() {
                found += 1;
                let account = key.reader().u64().unwrap_or(u64::MAX);
                match balance_of(version.value.as_deref()) {
                    Some(b) if b < 0 && problems.len() < 5 => {
                        problems.push(format!("account {account} is overdrawn: {b} cents"));
                        total += i128::from(b);
                    }
                    Some(b) => total += i128::from(b),
                    None => problems.push(format!(
                        "shard {}: account {account} holds no balance: {:?}",
                        shard.0, version.value
                    )),
                }
            }
        }
        let expected = i128::from(INITIAL_BALANCE_CENTS) * i128::from(self.accounts);
        if found != self.accounts {
            problems.push(format!("{found} accounts found, {} expected", self.accounts));
        }
        if total != expected {
            problems.push(format!(
                "the balances sum to {total} cents, not {expected} (off by {})",
                total - expected
            ));
        }
        let passed = problems.is_empty();
        let detail = if passed {
            format!("{found} accounts hold {total} cents, as loaded; none overdrawn")
        } else {
            problems.join("; ")
        };
        let total = CheckResult { name: "bank-total".into(), passed, detail };
        if self.observed {
            vec![total, self.check_accounts(stores)]
        } else {
            vec![total]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{apply_serially, check_stores, completion, loaded_stores};
    use meridian_core::time::Timestamp;
    use meridian_core::txn::TxnResult;

    fn bank() -> Bank {
        let options = WorkloadOptions {
            shards: 2,
            keys_per_shard: 10,
            zipf_theta: None,
            ops_max: None,
            distribution: None,
            region_groups: None,
            tpcc: Default::default(),
        };
        Bank::new(&options).unwrap()
    }

    #[test]
    fn transfers_conserve_money_and_overdrafts_abort() {
        let w = bank();
        let mut stores = loaded_stores(&w, 2);
        let mut generator = w.generator(0, 3);
        let (mut committed, mut aborted) = (0, 0);
        for ts in 1..2_000 {
            match apply_serially(&w, &mut stores, &generator.next(RequestId(ts)), ts).result {
                TxnResult::Committed => committed += 1,
                _ => aborted += 1,
            }
        }
        assert!(committed > 1_000, "{committed} committed");
        assert_eq!(committed + aborted, 1_999);
        let result = check_stores(w.checker().as_ref(), &stores);
        assert!(result.passed, "{}", result.detail);
        // An explicit overdraft aborts and writes nothing.
        let overdraft = TxnRequest {
            proc: TRANSFER,
            args: vec![Datum::Uint(0), Datum::Uint(15), Datum::Uint(TRANSFER_CENTS_MAX)],
        };
        let mut drained = loaded_stores(&w, 2);
        drained[0].load(account_key(0), 10i64.to_le_bytes().to_vec());
        let outcome = apply_serially(&w, &mut drained, &overdraft, 5);
        assert!(matches!(outcome.result, TxnResult::UserAborted(_)));
        assert_eq!(drained[0].versions(&account_key(0)).len(), 1, "nothing written");
        assert_eq!(
            drained[0].get_at(&account_key(0), Timestamp::MAX).unwrap(),
            &10i64.to_le_bytes()
        );
    }

    /// Every verdict of the checker on `stores`, by name.
    fn verdicts(check: &dyn InvariantCheck, stores: &[MvccStore]) -> Vec<(String, bool, String)> {
        let refs: Vec<(ShardId, &MvccStore)> =
            stores.iter().enumerate().map(|(i, s)| (ShardId(i as u32), s)).collect();
        check.check(&refs).into_iter().map(|c| (c.name, c.passed, c.detail)).collect()
    }

    #[test]
    fn per_account_checks_catch_a_transfer_applied_twice_that_conserves_money() {
        let w = bank();
        let mut stores = loaded_stores(&w, 2);
        let mut check = w.checker();
        let transfer = |from, to, cents| TxnRequest {
            proc: TRANSFER,
            args: vec![Datum::Uint(from), Datum::Uint(to), Datum::Uint(cents)],
        };
        let runs = [transfer(1, 12, 40), transfer(12, 3, 25), transfer(5, 6, 10)];
        for (ts, txn) in runs.iter().enumerate() {
            let outcome = apply_serially(&w, &mut stores, txn, ts as u64 + 1);
            check.observe(&completion(ts as u64 + 1, txn.clone(), outcome));
        }
        // A request whose outcome the client never learned may or may not have applied.
        check.unanswered(0, RequestId(99), &transfer(7, 8, 30), 0);
        let all_pass = verdicts(check.as_ref(), &stores);
        assert!(all_pass.iter().all(|(_, passed, _)| *passed), "{all_pass:?}");
        apply_serially(&w, &mut stores, &transfer(7, 8, 30), 10);
        assert!(verdicts(check.as_ref(), &stores).iter().all(|(_, p, _)| *p), "either is fine");
        // The committed transfer 1 -> 12 applied a second time: the total still holds.
        apply_serially(&w, &mut stores, &transfer(1, 12, 40), 11);
        let found = verdicts(check.as_ref(), &stores);
        let total = found.iter().find(|(n, ..)| n == "bank-total").unwrap();
        let accounts = found.iter().find(|(n, ..)| n == "bank-accounts").unwrap();
        assert!(total.1, "money is conserved: {total:?}");
        assert!(!accounts.1, "but account 1 lost 40 cents twice: {accounts:?}");
        assert!(accounts.2.contains("account 1 holds"), "{accounts:?}");
    }

    #[test]
    fn the_check_catches_a_half_applied_transfer_and_an_overdraft() {
        let w = bank();
        let mut stores = loaded_stores(&w, 2);
        // Only the paying side of a transfer landed.
        stores[0].load(account_key(3), (INITIAL_BALANCE_CENTS - 70).to_le_bytes().to_vec());
        let result = check_stores(w.checker().as_ref(), &stores);
        assert!(!result.passed);
        assert!(result.detail.contains("off by -70"), "{}", result.detail);
        let mut stores = loaded_stores(&w, 2);
        stores[1].load(account_key(12), (-5i64).to_le_bytes().to_vec());
        stores[1].load(account_key(13), (INITIAL_BALANCE_CENTS * 2 + 5).to_le_bytes().to_vec());
        let result = check_stores(w.checker().as_ref(), &stores);
        assert!(result.detail.contains("overdrawn"), "{}", result.detail);
        let options = WorkloadOptions {
            shards: 1,
            keys_per_shard: 2,
            zipf_theta: None,
            ops_max: None,
            distribution: None,
            region_groups: None,
            tpcc: Default::default(),
        };
        assert!(Bank::new(&options).unwrap_err().0.contains("at least 4 accounts"));
    }
}
