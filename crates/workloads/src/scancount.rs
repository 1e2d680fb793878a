//! `scan-count`: scans under concurrency, the phantom check.
//!
//! Rows belong to groups; every group's rows live on its shard (`table 20 ‖ group ‖ id`), and
//! a count row for the group (`table 21 ‖ partner ‖ group`) lives on the *next* shard, so every
//! update crosses shards. An update scans its group's rows, inserts or deletes one row, and
//! writes the count the scan implies into the count row, blindly. Two updates of one group that
//! both scan before either commits write the same count, one of them wrong: only scan
//! validation (a scanned range that changed, or a prepared write into it, refuses the prepare)
//! keeps them apart. An audit reads a group's rows and its count together.
//!
//! Invariants:
//! - `scan-count` (final stores): every group's count row equals the number of its rows.
//! - `scan-count-audits` (what clients saw): every committed audit saw a count equal to the
//!   rows it scanned.

use crate::dist::KeyDist;
use crate::{CheckResult, Completion, InvariantCheck, TxnGenerator, Workload, WorkloadOptions};
use meridian_core::key::Key;
use meridian_core::rng::{child_rng, uniform_u64, Rng};
use meridian_core::txn::{
    Args, Datum, KeySet, PartitionRule, Partitioner, PieceEffects, PieceOutput, PieceSpec, Plan,
    PlanContext, ProcError, ProcId, Procedure, Reads, Registry, ScanRange, ShardTarget, TxnRequest,
    TxnResult, UserAbort, Write, SCAN_ROWS_MAX,
};
use meridian_core::{ConfigError, RequestId, ShardId};
use meridian_storage::MvccStore;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The table byte of rows.
pub const ROW_TABLE: u8 = 20;
/// The table byte of count rows.
pub const COUNT_TABLE: u8 = 21;
/// Rows every group starts with (ids `0..INITIAL_ROWS`).
pub const INITIAL_ROWS: u64 = 4;
/// Updates choose row ids in `0..ROW_IDS`, so groups stay near their initial size.
pub const ROW_IDS: u64 = 2 * INITIAL_ROWS;
/// Percent of transactions that are audits (the rest insert or delete, half each).
pub const AUDIT_PERCENT: u64 = 10;
/// Mismatches a check lists.
const SHOWN_MAX: usize = 5;

const UPDATE: ProcId = ProcId(0);
const AUDIT: ProcId = ProcId(1);

/// Where groups live: `per_shard` consecutive groups per shard.
#[derive(Clone, Copy, Debug)]
struct Layout {
    shards: u32,
    per_shard: u64,
}

impl Layout {
    fn groups(self) -> u64 {
        u64::from(self.shards) * self.per_shard
    }

    fn shard_of(self, group: u64) -> u32 {
        (group / self.per_shard) as u32
    }

    /// The group whose slot on the next shard holds `group`'s count row.
    fn partner(self, group: u64) -> u64 {
        (group + self.per_shard) % self.groups()
    }

    fn row(group: u64, id: u64) -> Key {
        Key::table(ROW_TABLE).u64(group).u64(id).build()
    }

    fn rows_of(group: u64) -> ScanRange {
        ScanRange {
            start: Key::table(ROW_TABLE).u64(group).build(),
            end: Key::table(ROW_TABLE).u64(group + 1).build(),
            limit: SCAN_ROWS_MAX,
            reverse: false,
        }
    }

    fn count(self, group: u64) -> Key {
        Key::table(COUNT_TABLE).u64(self.partner(group)).u64(group).build()
    }

    fn group_arg(self, datum: Option<&Datum>) -> Result<u64, ProcError> {
        match datum {
            Some(Datum::Uint(group)) if *group < self.groups() => Ok(*group),
            _ => Err(ProcError::BadArgs(format!("a group in 0..{}", self.groups()))),
        }
    }

    /// The plan of an update or audit of `group`: the rows' shard, then the count's.
    fn plan(self, group: u64, dependent: bool) -> Plan {
        let rows = ShardTarget::Shard(ShardId(self.shard_of(group)));
        let count = ShardTarget::Shard(ShardId(self.shard_of(self.partner(group))));
        let deps = if dependent { vec![0] } else { Vec::new() };
        vec![PieceSpec { target: rows, deps: Vec::new() }, PieceSpec { target: count, deps }]
    }
}

fn count_value(value: Option<&[u8]>) -> Option<i64> {
    Some(i64::from_le_bytes(value?.try_into().ok()?))
}

/// The workload.
#[derive(Debug)]
pub struct ScanCount {
    layout: Layout,
    dist: KeyDist,
}

impl ScanCount {
    /// Checks the options and builds the workload (`keys_per_shard` is groups per shard).
    pub fn new(options: &WorkloadOptions) -> Result<Self, ConfigError> {
        if options.shards == 0 || options.keys_per_shard == 0 {
            return Err(ConfigError::new("scan-count needs at least one shard and one group"));
        }
        let dist = KeyDist::new(options.keys_per_shard, options.zipf_theta)?;
        Ok(Self {
            layout: Layout { shards: options.shards, per_shard: options.keys_per_shard },
            dist,
        })
    }
}

impl Workload for ScanCount {
    fn name(&self) -> &'static str {
        "scan-count"
    }

    fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "name": "scan-count",
            "groups": self.layout.groups(),
            "initial_rows": INITIAL_ROWS,
            "row_ids": ROW_IDS,
            "audit_percent": AUDIT_PERCENT,
        })
    }

    fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        registry.register(Arc::new(Update { layout: self.layout }));
        registry.register(Arc::new(Audit { layout: self.layout }));
        registry
    }

    fn partitioner(&self) -> Partitioner {
        Partitioner::new(
            self.layout.shards,
            PartitionRule::LeadingInt { base: 0, per_shard: self.layout.per_shard },
        )
        .expect("checked in new")
    }

    fn load(&self, shard: ShardId, store: &mut MvccStore) {
        let first = u64::from(shard.0) * self.layout.per_shard;
        for slot in first..first + self.layout.per_shard {
            for id in 0..INITIAL_ROWS {
                store.load(Layout::row(slot, id), id.to_le_bytes().to_vec());
            }
            // The count of the group whose partner slot this is.
            let groups = self.layout.groups();
            let group = (slot + groups - self.layout.per_shard % groups) % groups;
            store.load(self.layout.count(group), (INITIAL_ROWS as i64).to_le_bytes().to_vec());
        }
    }

    fn generator(&self, client: u32, seed: u64) -> Box<dyn TxnGenerator> {
        Box::new(Generator {
            rng: child_rng(seed, "scan-count-client", u64::from(client)),
            layout: self.layout,
            dist: self.dist.clone(),
        })
    }

    fn checker(&self) -> Box<dyn InvariantCheck> {
        Box::new(Check { audits: 0, bad_audits: Vec::new(), bad_audit_count: 0 })
    }
}

struct Generator {
    rng: Rng,
    layout: Layout,
    dist: KeyDist,
}

impl TxnGenerator for Generator {
    fn next(&mut self, _request: RequestId) -> TxnRequest {
        let shard = uniform_u64(&mut self.rng, u64::from(self.layout.shards));
        let group = shard * self.layout.per_shard + self.dist.sample(&mut self.rng);
        if uniform_u64(&mut self.rng, 100) < AUDIT_PERCENT {
            return TxnRequest { proc: AUDIT, args: vec![Datum::Uint(group)] };
        }
        let id = uniform_u64(&mut self.rng, ROW_IDS);
        let op = uniform_u64(&mut self.rng, 2);
        TxnRequest {
            proc: UPDATE,
            args: vec![Datum::Uint(group), Datum::Uint(id), Datum::Uint(op)],
        }
    }
}

/// Inserts (`op` 0) or deletes (`op` 1) row `id` of `group` and writes the group's new count.
#[derive(Debug)]
struct Update {
    layout: Layout,
}

impl Update {
    fn parse(&self, args: &Args) -> Result<(u64, u64, bool), ProcError> {
        let group = self.layout.group_arg(args.first())?;
        match args.get(1..) {
            Some([Datum::Uint(id), Datum::Uint(op)]) if *id < ROW_IDS && *op < 2 => {
                Ok((group, *id, *op == 0))
            }
            _ => Err(ProcError::BadArgs(format!("update takes [group, id < {ROW_IDS}, op 0|1]"))),
        }
    }
}

impl Procedure for Update {
    fn name(&self) -> &'static str {
        "scan-count-update"
    }

    fn plan(&self, args: &Args, _: PlanContext<'_>) -> Result<Plan, ProcError> {
        let (group, _, _) = self.parse(args)?;
        Ok(self.layout.plan(group, true))
    }

    fn keys(&self, piece: u32, args: &Args, _: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let (group, id, _) = self.parse(args)?;
        match piece {
            0 => Ok(KeySet {
                reads: vec![Layout::row(group, id)],
                writes: vec![Layout::row(group, id)],
                scans: vec![Layout::rows_of(group)],
            }),
            1 => Ok(KeySet {
                reads: Vec::new(),
                writes: vec![self.layout.count(group)],
                scans: Vec::new(),
            }),
            _ => Err(ProcError::BadArgs(format!("update has no piece {piece}"))),
        }
    }

    fn execute(
        &self,
        piece: u32,
        args: &Args,
        inputs: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let (group, id, insert) = self.parse(args).map_err(|e| UserAbort(e.to_string()))?;
        let mut effects = PieceEffects::default();
        if piece == 0 {
            let rows = reads.scans.first().map_or(0, Vec::len) as i64;
            let present = reads.values.first().is_some_and(Option::is_some);
            let after = match (insert, present) {
                (true, false) => {
                    effects.writes.push(Write {
                        key: Layout::row(group, id),
                        value: Some(id.to_le_bytes().to_vec()),
                    });
                    rows + 1
                }
                (false, true) => {
                    effects.writes.push(Write { key: Layout::row(group, id), value: None });
                    rows - 1
                }
                _ => rows,
            };
            effects.output.push(Datum::Int(after));
            return Ok(effects);
        }
        let count = match inputs.first().and_then(|o| o.first()) {
            Some(Datum::Int(count)) => *count,
            _ => return Err(UserAbort("the count of piece 0 is missing".into())),
        };
        effects.writes.push(Write {
            key: self.layout.count(group),
            value: Some(count.to_le_bytes().to_vec()),
        });
        Ok(effects)
    }
}

/// Reads a group's rows and its count.
#[derive(Debug)]
struct Audit {
    layout: Layout,
}

impl Procedure for Audit {
    fn name(&self) -> &'static str {
        "scan-count-audit"
    }

    fn plan(&self, args: &Args, _: PlanContext<'_>) -> Result<Plan, ProcError> {
        let group = self.layout.group_arg(args.first())?;
        Ok(self.layout.plan(group, false))
    }

    fn keys(&self, piece: u32, args: &Args, _: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let group = self.layout.group_arg(args.first())?;
        match piece {
            0 => Ok(KeySet {
                reads: Vec::new(),
                writes: Vec::new(),
                scans: vec![Layout::rows_of(group)],
            }),
            1 => Ok(KeySet {
                reads: vec![self.layout.count(group)],
                writes: Vec::new(),
                scans: Vec::new(),
            }),
            _ => Err(ProcError::BadArgs(format!("audit has no piece {piece}"))),
        }
    }

    fn execute(
        &self,
        piece: u32,
        _args: &Args,
        _inputs: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let value = if piece == 0 {
            reads.scans.first().map_or(0, Vec::len) as i64
        } else {
            count_value(reads.values.first().copied().flatten()).unwrap_or(-1)
        };
        Ok(PieceEffects { writes: Vec::new(), output: vec![Datum::Int(value)] })
    }
}

/// The invariants (see the module documentation).
struct Check {
    audits: u64,
    bad_audits: Vec<String>,
    bad_audit_count: u64,
}

impl InvariantCheck for Check {
    fn observe(&mut self, completion: &Completion) {
        if completion.txn.proc != AUDIT || completion.outcome.result != TxnResult::Committed {
            return;
        }
        let seen: Vec<Option<i64>> =
            completion.outcome.outputs.iter().map(|o| o.first().and_then(Datum::as_int)).collect();
        // A commit whose reply lost its outputs tells nothing.
        let [Some(rows), Some(count)] = seen.as_slice() else { return };
        self.audits += 1;
        if rows != count {
            self.bad_audit_count += 1;
            if self.bad_audits.len() < SHOWN_MAX {
                self.bad_audits.push(format!(
                    "audit of {:?} saw {rows} rows and a count of {count}",
                    completion.txn.args
                ));
            }
        }
    }

    fn check(&self, stores: &[(ShardId, &MvccStore)]) -> Vec<CheckResult> {
        let mut rows: BTreeMap<u64, i64> = BTreeMap::new();
        let mut counts: BTreeMap<u64, i64> = BTreeMap::new();
        for (_, store) in stores {
            for (key, version) in store.latest_values() {
                let Some(value) = &version.value else { continue };
                let mut reader = key.reader();
                match key.table_id() {
                    Some(ROW_TABLE) => {
                        if let Ok(group) = reader.u64() {
                            *rows.entry(group).or_default() += 1;
                        }
                    }
                    Some(COUNT_TABLE) => {
                        let group = reader.u64().and_then(|_| reader.u64());
                        if let (Ok(group), Some(count)) = (group, count_value(Some(value))) {
                            counts.insert(group, count);
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut problems = Vec::new();
        let mut bad = 0;
        for (&group, &count) in &counts {
            let found = rows.get(&group).copied().unwrap_or(0);
            if found != count {
                bad += 1;
                if problems.len() < SHOWN_MAX {
                    problems.push(format!("group {group}: {found} rows, count says {count}"));
                }
            }
        }
        let total_rows: i64 = rows.values().sum();
        let stores_result = CheckResult {
            name: "scan-count".into(),
            passed: bad == 0 && !counts.is_empty(),
            detail: if bad == 0 {
                format!("{} groups hold {total_rows} rows, each as its count says", counts.len())
            } else {
                format!("{bad} groups off: {}", problems.join("; "))
            },
        };
        let audits = CheckResult {
            name: "scan-count-audits".into(),
            passed: self.bad_audit_count == 0,
            detail: if self.bad_audit_count == 0 {
                format!("{} committed audits saw counts equal to their scans", self.audits)
            } else {
                format!(
                    "{} of {} audits: {}",
                    self.bad_audit_count,
                    self.audits,
                    self.bad_audits.join("; ")
                )
            },
        };
        vec![stores_result, audits]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{apply_serially, completion, loaded_stores};

    fn workload() -> ScanCount {
        ScanCount::new(&WorkloadOptions {
            shards: 2,
            keys_per_shard: 3,
            ..WorkloadOptions::default()
        })
        .unwrap()
    }

    fn verdicts(check: &dyn InvariantCheck, stores: &[MvccStore]) -> Vec<(String, bool)> {
        let refs: Vec<(ShardId, &MvccStore)> =
            stores.iter().enumerate().map(|(i, s)| (ShardId(i as u32), s)).collect();
        check.check(&refs).into_iter().map(|c| (c.name, c.passed)).collect()
    }

    #[test]
    fn serial_updates_keep_every_count_and_a_phantom_breaks_one() {
        let w = workload();
        let mut stores = loaded_stores(&w, 2);
        let mut check = w.checker();
        let mut generator = w.generator(0, 7);
        for ts in 1..500 {
            let txn = generator.next(RequestId(ts));
            let outcome = apply_serially(&w, &mut stores, &txn, ts);
            assert_eq!(outcome.result, TxnResult::Committed);
            check.observe(&completion(ts, txn, outcome));
        }
        assert!(verdicts(check.as_ref(), &stores).iter().all(|(_, p)| *p));
        // Every update crosses shards: a group's count lives on the other shard.
        let plan = w
            .registry()
            .get(UPDATE)
            .unwrap()
            .plan(
                &vec![Datum::Uint(1), Datum::Uint(5), Datum::Uint(0)],
                PlanContext { partitioner: &w.partitioner() },
            )
            .unwrap();
        assert_ne!(plan[0].target, plan[1].target);
        // Two inserts that both scanned before either committed (a phantom scan validation
        // must catch): the second's count ignores the first's row.
        let group = 4;
        let stale = stores[1].scan(&Layout::rows_of(group), meridian_core::Timestamp::MAX).len();
        let layout = w.layout;
        let free: Vec<u64> = (0..ROW_IDS)
            .filter(|&id| {
                stores[1].get_at(&Layout::row(group, id), meridian_core::Timestamp::MAX).is_none()
            })
            .take(2)
            .collect();
        assert_eq!(free.len(), 2, "two free ids");
        for id in free {
            stores[1].load(Layout::row(group, id), vec![1]);
        }
        stores[0].load(layout.count(group), (stale as i64 + 1).to_le_bytes().to_vec());
        let found = verdicts(check.as_ref(), &stores);
        assert_eq!(found[0], ("scan-count".to_string(), false), "{found:?}");
    }

    #[test]
    fn an_audit_that_saw_a_count_and_rows_disagree_fails() {
        let w = workload();
        let mut check = w.checker();
        let audit = TxnRequest { proc: AUDIT, args: vec![Datum::Uint(0)] };
        let mut outcome = apply_serially(&w, &mut loaded_stores(&w, 2), &audit, 1);
        check.observe(&completion(1, audit.clone(), outcome.clone()));
        outcome.outputs[1] = vec![Datum::Int(9)];
        check.observe(&completion(2, audit, outcome));
        let found = verdicts(check.as_ref(), &loaded_stores(&w, 2));
        assert_eq!(found[1], ("scan-count-audits".to_string(), false), "{found:?}");
        assert!(found[0].1, "the stores are as loaded");
    }
}
