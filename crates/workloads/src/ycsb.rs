//! YCSB core workloads A–F (`ycsb-a` … `ycsb-f`), with YCSB's generators
//! ([`crate::ycsb_gen`]) and CoreWorkload's defaults: `recordcount` records (`--keys-per-shard`
//! × shards) of 10 fields of 100 bytes, keys `"user" + fnvhash64(keynum)` (hashed insert
//! order), reads of all fields, updates and read-modify-writes of one random field.
//!
//! | workload | read | update | insert | scan | read-modify-write | key choice |
//! |---|---|---|---|---|---|---|
//! | A | 0.50 | 0.50 | | | | zipfian |
//! | B | 0.95 | 0.05 | | | | zipfian |
//! | C | 1.00 | | | | | zipfian |
//! | D | 0.95 | | 0.05 | | | latest |
//! | E | | | 0.05 | 0.95 (1–100 records, uniform) | | zipfian |
//! | F | 0.50 | | | | 0.50 | zipfian |
//!
//! `--distribution` overrides the workload file's `requestdistribution` (zipfian, uniform,
//! latest, hotspot), as a YCSB properties file can. `zipfian` is YCSB's scrambled Zipfian; it redraws keys not yet inserted, as YCSB does. For
//! E the key space is sized `recordcount + recordcount / 10` (YCSB sizes it from the operation
//! count, which a closed-loop run by duration does not fix). `latest` follows the inserts the
//! clients of this process acknowledged (YCSB's acknowledged counter, shared by the clients).
//! Each transaction has `--ops-max` operations (default 1: YCSB's single-operation mode; more is
//! the transactional variant) on distinct records.
//!
//! Storage: a record is one key, `table 5 ‖ hash:u64`, whose value is its ten fields of 100
//! bytes in field order, as YCSB's key-value bindings store a record (RocksDB's serialises the
//! fields into one value). A read reads the record; an update or a read-modify-write reads it
//! and writes it back with one field replaced (what those bindings do: a store of whole values
//! has no partial write), so it locks and validates the whole record, as a row store's update
//! of a row would; an update of a record that is not there writes nothing and aborts the
//! transaction (YCSB's `NOT_FOUND`); an insert writes a whole record. Records are
//! range-partitioned by hash (shard `hash / ⌈2⁶³ / shards⌉`), so keys spread evenly and a scan
//! reads records in hash order; a scan stops at the end of its start record's shard. Each
//! field is tagged with the request that wrote it.
//!
//! Invariant (`ycsb-last-writer`, on the final stores): every field of every record holds the
//! value of its committed writer with the highest commit timestamp (or, for a field some
//! request of unknown outcome wrote, possibly that one's), the loaded value when nobody wrote
//! it, and every committed insert is present.

use crate::ycsb_gen::{fnvhash64, AcknowledgedCounter, Hotspot, ScrambledZipfian, SkewedLatest};
use crate::{CheckResult, Completion, InvariantCheck, TxnGenerator, Workload, WorkloadOptions};
use meridian_core::hash::FixedHashMap;
use meridian_core::key::Key;
use meridian_core::rng::{child_rng, uniform_f64, uniform_u64, Rng};
use meridian_core::txn::{
    Args, Datum, KeySet, Partitioner, PieceEffects, PieceOutput, Plan, PlanContext, ProcError,
    ProcId, Procedure, Reads, Registry, ScanRange, TxnOutcome, TxnRequest, TxnResult, UserAbort,
    Write,
};
use meridian_core::{ConfigError, RequestId, ShardId, Time, Timestamp};
use meridian_storage::MvccStore;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The table byte of YCSB fields.
pub const YCSB_TABLE: u8 = 5;
/// Fields per record.
pub const FIELD_COUNT: u64 = 10;
/// Bytes per field.
pub const FIELD_BYTES: usize = 100;
/// Longest scan (records), as workload E sets `maxscanlength`.
pub const SCAN_RECORDS_MAX: u64 = 100;
/// Largest `--ops-max` for YCSB.
pub const YCSB_OPS_LIMIT: u32 = 16;
/// Redraws of a key not yet inserted before falling back to a uniform inserted one.
const REDRAWS_MAX: u32 = 100;
/// The request tag of loaded values.
const LOADED: u64 = u64::MAX;

const READ: u64 = 0;
const UPDATE: u64 = 1;
const INSERT: u64 = 2;
const SCAN: u64 = 3;
const RMW: u64 = 4;

/// YCSB's request distributions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestDistribution {
    /// The scrambled Zipfian (θ = 0.99).
    Zipfian,
    /// Every inserted record alike.
    Uniform,
    /// The newest acknowledged inserts most.
    Latest,
    /// 80% of operations on the first 20% of the records.
    Hotspot,
}

impl RequestDistribution {
    /// Parses YCSB's name.
    pub fn parse(name: &str) -> Result<Self, ConfigError> {
        match name {
            "zipfian" => Ok(Self::Zipfian),
            "uniform" => Ok(Self::Uniform),
            "latest" => Ok(Self::Latest),
            "hotspot" => Ok(Self::Hotspot),
            other => Err(ConfigError::new(format!(
                "unknown request distribution '{other}'; accepted: zipfian, uniform, latest, hotspot"
            ))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Zipfian => "zipfian (scrambled)",
            Self::Uniform => "uniform",
            Self::Latest => "latest",
            Self::Hotspot => "hotspot (0.2 of the records, 0.8 of the operations)",
        }
    }
}

/// One workload's proportions: read, update, insert, scan, read-modify-write.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Mix {
    read: f64,
    update: f64,
    insert: f64,
    scan: f64,
    rmw: f64,
    latest: bool,
}

fn mix(name: &str) -> Option<Mix> {
    let m =
        |read, update, insert, scan, rmw, latest| Mix { read, update, insert, scan, rmw, latest };
    Some(match name {
        "ycsb-a" => m(0.5, 0.5, 0.0, 0.0, 0.0, false),
        "ycsb-b" => m(0.95, 0.05, 0.0, 0.0, 0.0, false),
        "ycsb-c" => m(1.0, 0.0, 0.0, 0.0, 0.0, false),
        "ycsb-d" => m(0.95, 0.0, 0.05, 0.0, 0.0, true),
        "ycsb-e" => m(0.0, 0.0, 0.05, 0.95, 0.0, false),
        "ycsb-f" => m(0.5, 0.0, 0.0, 0.0, 0.5, false),
        _ => return None,
    })
}

/// The key of the record whose key hash is `hash`.
pub fn record_key(hash: u64) -> Key {
    Key::table(YCSB_TABLE).u64(hash).build()
}

fn record_hash(keynum: u64) -> u64 {
    fnvhash64(keynum as i64) as u64
}

/// Bytes of a record's value.
const RECORD_BYTES: usize = FIELD_COUNT as usize * FIELD_BYTES;

/// Writes field `field`'s value into `slot` (`FIELD_BYTES` long): the writing request and the
/// record, then filler.
fn put_field(slot: &mut [u8], request: u64, keynum: u64, field: u64) {
    slot[..8].copy_from_slice(&request.to_le_bytes());
    slot[8..16].copy_from_slice(&keynum.to_le_bytes());
    slot[16..].fill(b'a' + (field as u8 % 26));
}

/// A whole record, every field written by `request`.
fn record_value(request: u64, keynum: u64) -> Vec<u8> {
    let mut value = vec![0; RECORD_BYTES];
    for (field, slot) in value.chunks_exact_mut(FIELD_BYTES).enumerate() {
        put_field(slot, request, keynum, field as u64);
    }
    value
}

/// `record` with field `field` rewritten by `request`; `None` when `record` is not a record
/// (a value of another length).
fn with_field(record: &[u8], request: u64, keynum: u64, field: u64) -> Option<Vec<u8>> {
    if record.len() != RECORD_BYTES {
        return None;
    }
    let mut value = record.to_vec();
    let at = field as usize * FIELD_BYTES;
    put_field(&mut value[at..at + FIELD_BYTES], request, keynum, field);
    Some(value)
}

/// The request that wrote each field of a stored record (`None` for a malformed one).
fn writers_of(record: &[u8]) -> impl Iterator<Item = Option<u64>> + '_ {
    let fields = if record.len() == RECORD_BYTES { FIELD_COUNT as usize } else { 0 };
    let malformed = (record.len() != RECORD_BYTES).then_some(None);
    record
        .chunks_exact(FIELD_BYTES)
        .take(fields)
        .map(|slot| slot[..8].try_into().ok().map(u64::from_le_bytes))
        .chain(malformed)
}

/// The workload.
#[derive(Debug)]
pub struct Ycsb {
    name: &'static str,
    mix: Mix,
    distribution: RequestDistribution,
    shards: u32,
    records: u64,
    hash_per_shard: u64,
    ops: u64,
    inserts: Arc<Mutex<AcknowledgedCounter>>,
}

impl Ycsb {
    /// Checks the options and builds workload `name` (`ycsb-a` … `ycsb-f`).
    pub fn new(name: &str, options: &WorkloadOptions) -> Result<Self, ConfigError> {
        let mix =
            mix(name).ok_or_else(|| ConfigError::new(format!("unknown YCSB workload '{name}'")))?;
        let name = crate::WORKLOADS.iter().find(|w| **w == name).copied().unwrap_or("ycsb");
        if options.shards == 0 {
            return Err(ConfigError::new(format!("{name} needs at least one shard")));
        }
        if options.zipf_theta.is_some() {
            return Err(ConfigError::new(format!(
                "{name} uses YCSB's own key distribution (zipfian θ = 0.99 or latest); --zipf does not apply"
            )));
        }
        let records = u64::from(options.shards) * options.keys_per_shard;
        let ops = options.ops_max.unwrap_or(1);
        if !(1..=YCSB_OPS_LIMIT).contains(&ops) || u64::from(ops) > records {
            return Err(ConfigError::new(format!(
                "--ops-max must be in 1..={YCSB_OPS_LIMIT} and at most the record count ({records}), got {ops}"
            )));
        }
        let distribution = match &options.distribution {
            Some(name) => RequestDistribution::parse(name)?,
            None if mix.latest => RequestDistribution::Latest,
            None => RequestDistribution::Zipfian,
        };
        Ok(Self {
            name,
            mix,
            distribution,
            shards: options.shards,
            records,
            hash_per_shard: (i64::MAX as u64 / u64::from(options.shards)) + 1,
            ops: u64::from(ops),
            inserts: Arc::new(Mutex::new(AcknowledgedCounter::new(records))),
        })
    }

    fn key_space(&self) -> u64 {
        if self.mix.insert > 0.0 && self.distribution != RequestDistribution::Latest {
            self.records + self.records / 10
        } else {
            self.records
        }
    }
}

impl Workload for Ycsb {
    fn name(&self) -> &'static str {
        self.name
    }

    fn describe(&self) -> serde_json::Value {
        let m = self.mix;
        serde_json::json!({
            "name": self.name,
            "recordcount": self.records,
            "fieldcount": FIELD_COUNT,
            "fieldlength": FIELD_BYTES,
            "proportions": {"read": m.read, "update": m.update, "insert": m.insert, "scan": m.scan, "readmodifywrite": m.rmw},
            "requestdistribution": self.distribution.name(),
            "maxscanlength": SCAN_RECORDS_MAX,
            "ops_per_txn": self.ops,
        })
    }

    fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        registry.register(Arc::new(YcsbTxn {
            hash_per_shard: self.hash_per_shard,
            shards: self.shards,
        }));
        registry
    }

    fn partitioner(&self) -> Partitioner {
        crate::leading_int_partitioner(self.shards, self.hash_per_shard)
    }

    fn load(&self, shard: ShardId, store: &mut MvccStore) {
        for keynum in 0..self.records {
            let hash = record_hash(keynum);
            if hash / self.hash_per_shard == u64::from(shard.0) {
                store.load(record_key(hash), record_value(LOADED, keynum));
            }
        }
    }

    fn generator(&self, client: u32, seed: u64) -> Box<dyn TxnGenerator> {
        let counter = self.inserts.lock().expect("insert counter");
        Box::new(YcsbGenerator {
            rng: child_rng(seed, "ycsb-client", u64::from(client)),
            mix: self.mix,
            distribution: self.distribution,
            hotspot: Hotspot::new(0, self.key_space() - 1, 0.2, 0.8).expect("valid fractions"),
            ops: self.ops,
            zipfian: ScrambledZipfian::new(0, self.key_space()).expect("records > 0"),
            latest: SkewedLatest::new(&counter).expect("records > 0"),
            inserts: self.inserts.clone(),
            pending: BTreeMap::new(),
        })
    }

    fn checker(&self) -> Box<dyn InvariantCheck> {
        Box::new(YcsbCheck::default())
    }
}

struct YcsbGenerator {
    rng: Rng,
    mix: Mix,
    distribution: RequestDistribution,
    hotspot: Hotspot,
    ops: u64,
    zipfian: ScrambledZipfian,
    latest: SkewedLatest,
    inserts: Arc<Mutex<AcknowledgedCounter>>,
    /// Insert ids of requests in flight, acknowledged when their reply arrives.
    pending: BTreeMap<RequestId, Vec<u64>>,
}

impl YcsbGenerator {
    /// A record already inserted: YCSB's `nextKeynum`.
    fn existing(&mut self, counter: &AcknowledgedCounter) -> u64 {
        let last = counter.last_value();
        for _ in 0..REDRAWS_MAX {
            let keynum = match self.distribution {
                RequestDistribution::Latest => return self.latest.next(&mut self.rng, counter),
                RequestDistribution::Uniform => return uniform_u64(&mut self.rng, last + 1),
                RequestDistribution::Zipfian => self.zipfian.next(&mut self.rng),
                RequestDistribution::Hotspot => self.hotspot.next(&mut self.rng),
            };
            if keynum <= last {
                return keynum;
            }
        }
        uniform_u64(&mut self.rng, last + 1)
    }
}

impl TxnGenerator for YcsbGenerator {
    fn next(&mut self, request: RequestId) -> TxnRequest {
        let inserts = self.inserts.clone();
        let mut counter = inserts.lock().expect("insert counter");
        let mut ops: Vec<Datum> = Vec::new();
        let mut used: Vec<u64> = Vec::new();
        let mut new_ids = Vec::new();
        for _ in 0..self.ops {
            let roll = uniform_f64(&mut self.rng);
            let m = self.mix;
            let kind = if roll < m.read {
                READ
            } else if roll < m.read + m.update {
                UPDATE
            } else if roll < m.read + m.update + m.insert {
                INSERT
            } else if roll < m.read + m.update + m.insert + m.scan {
                SCAN
            } else {
                RMW
            };
            let keynum = if kind == INSERT {
                let id = counter.next_id();
                new_ids.push(id);
                id
            } else {
                let mut keynum = self.existing(&counter);
                let mut draws = 0;
                while used.contains(&keynum) && draws < REDRAWS_MAX {
                    keynum = self.existing(&counter);
                    draws += 1;
                }
                if used.contains(&keynum) {
                    continue; // A tiny key space: run fewer operations rather than repeat one.
                }
                keynum
            };
            used.push(keynum);
            let extra = match kind {
                UPDATE | RMW => uniform_u64(&mut self.rng, FIELD_COUNT),
                SCAN => 1 + uniform_u64(&mut self.rng, SCAN_RECORDS_MAX),
                _ => 0,
            };
            ops.push(Datum::List(vec![Datum::Uint(kind), Datum::Uint(keynum), Datum::Uint(extra)]));
        }
        if !new_ids.is_empty() {
            self.pending.insert(request, new_ids);
        }
        TxnRequest { proc: ProcId(0), args: vec![Datum::List(ops), Datum::Uint(request.0)] }
    }

    fn on_reply(&mut self, request: RequestId, _outcome: &TxnOutcome) {
        // YCSB acknowledges an insert whatever its outcome (CoreWorkload's `finally`).
        if let Some(ids) = self.pending.remove(&request) {
            let mut counter = self.inserts.lock().expect("insert counter");
            for id in ids {
                let _ = counter.acknowledge(id);
            }
        }
    }
}

/// One operation: (kind, keynum, field or scan length).
type Op = (u64, u64, u64);

/// Parsed operations, at most [`YCSB_OPS_LIMIT`], held inline: the procedure parses its
/// arguments on every call (plan, keys and execute, at the coordinator and the shard), and a
/// heap allocation each time cost more than the parse.
#[derive(Clone, Copy, Debug)]
struct Ops {
    ops: [Op; YCSB_OPS_LIMIT as usize],
    len: usize,
}

impl Ops {
    const fn new() -> Self {
        Self { ops: [(0, 0, 0); YCSB_OPS_LIMIT as usize], len: 0 }
    }

    /// Appends `op`; the callers never pass more than the limit (checked where it comes in).
    fn push(&mut self, op: Op) {
        self.ops[self.len] = op;
        self.len += 1;
    }
}

impl std::ops::Deref for Ops {
    type Target = [Op];

    fn deref(&self) -> &[Op] {
        &self.ops[..self.len]
    }
}

fn parse(args: &Args) -> Result<(Ops, u64), ProcError> {
    let bad = || ProcError::BadArgs("ycsb takes [[[kind, keynum, extra]...], request]".into());
    let [Datum::List(ops), Datum::Uint(request)] = args.as_slice() else { return Err(bad()) };
    if ops.len() > YCSB_OPS_LIMIT as usize {
        return Err(ProcError::BadArgs(format!(
            "ycsb takes at most {YCSB_OPS_LIMIT} operations, got {}",
            ops.len()
        )));
    }
    let mut parsed = Ops::new();
    for op in ops {
        let Datum::List(parts) = op else { return Err(bad()) };
        match parts.as_slice() {
            [Datum::Uint(kind @ READ..=RMW), Datum::Uint(keynum), Datum::Uint(extra)] => {
                let extra_ok = match *kind {
                    UPDATE | RMW => *extra < FIELD_COUNT,
                    SCAN => (1..=SCAN_RECORDS_MAX).contains(extra),
                    _ => true,
                };
                if !extra_ok {
                    return Err(ProcError::BadArgs(format!(
                        "ycsb operation {kind} on record {keynum}: {extra} is out of range \
                         (fields 0..{FIELD_COUNT}, scans of 1..={SCAN_RECORDS_MAX} records)"
                    )));
                }
                parsed.push((*kind, *keynum, *extra));
            }
            _ => return Err(bad()),
        }
    }
    Ok((parsed, *request))
}

/// The one YCSB procedure: a piece per shard touched, operations in argument order.
#[derive(Debug)]
struct YcsbTxn {
    hash_per_shard: u64,
    shards: u32,
}

impl YcsbTxn {
    fn shard_of(&self, keynum: u64) -> u64 {
        (record_hash(keynum) / self.hash_per_shard).min(u64::from(self.shards) - 1)
    }

    /// The operations of piece `piece`: those on the `piece`-th of the shards the operations
    /// touch, in ascending order (as [`crate::shards_of`] orders them for the plan).
    fn on_piece(&self, piece: u32, ops: &Ops) -> Result<Ops, ProcError> {
        let mut shards = [0u64; YCSB_OPS_LIMIT as usize];
        let mut count = 0;
        for op in ops.iter() {
            let shard = self.shard_of(op.1);
            if !shards[..count].contains(&shard) {
                shards[count] = shard;
                count += 1;
            }
        }
        shards[..count].sort_unstable();
        let shard = *shards[..count]
            .get(piece as usize)
            .ok_or_else(|| ProcError::BadArgs(format!("no piece {piece}")))?;
        let mut here = Ops::new();
        for &op in ops.iter().filter(|op| self.shard_of(op.1) == shard) {
            here.push(op);
        }
        Ok(here)
    }

    fn scan_range(&self, keynum: u64, records: u64) -> ScanRange {
        let hash = record_hash(keynum);
        let shard = self.shard_of(keynum);
        let end = if shard + 1 >= u64::from(self.shards) {
            Key::table(YCSB_TABLE + 1).build()
        } else {
            record_key((shard + 1) * self.hash_per_shard)
        };
        ScanRange { start: record_key(hash), end, limit: records as u32, reverse: false }
    }
}

impl Procedure for YcsbTxn {
    fn name(&self) -> &'static str {
        "ycsb"
    }

    fn plan(&self, args: &Args, context: PlanContext<'_>) -> Result<Plan, ProcError> {
        let (ops, _) = parse(args)?;
        let shards = crate::shards_of(ops.iter().map(|op| self.shard_of(op.1)), 1);
        crate::piece_per_shard(shards, context, "a record")
    }

    fn keys(&self, piece: u32, args: &Args, _inputs: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let (ops, _) = parse(args)?;
        let mut keys = KeySet::default();
        for &(kind, keynum, extra) in self.on_piece(piece, &ops)?.iter() {
            let key = record_key(record_hash(keynum));
            match kind {
                READ | UPDATE | RMW => keys.reads.push(key.clone()),
                SCAN => keys.scans.push(self.scan_range(keynum, extra)),
                _ => {}
            }
            if matches!(kind, UPDATE | RMW | INSERT) && !keys.writes.contains(&key) {
                keys.writes.push(key);
            }
        }
        Ok(keys)
    }

    fn execute(
        &self,
        piece: u32,
        args: &Args,
        _inputs: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let (ops, request) = parse(args).map_err(|e| UserAbort(e.to_string()))?;
        let here = self.on_piece(piece, &ops).map_err(|e| UserAbort(e.to_string()))?;
        let mut effects = PieceEffects::default();
        let (mut read_at, mut scan_at) = (0usize, 0usize);
        for &(kind, keynum, extra) in here.iter() {
            let key = record_key(record_hash(keynum));
            // The record as this piece left it so far (an operation may name a record an
            // earlier one of the same piece wrote), else as read.
            let read = if matches!(kind, READ | UPDATE | RMW) {
                let stored = reads.values.get(read_at).copied().flatten();
                read_at += 1;
                match effects.writes.iter().find(|w| w.key == key) {
                    Some(own) => own.value.as_deref(),
                    None => stored,
                }
            } else {
                None
            };
            let value = match kind {
                READ => {
                    let fields = read.map_or(0, |r| r.len() / FIELD_BYTES);
                    effects.output.push(Datum::Uint(fields as u64));
                    continue;
                }
                SCAN => {
                    let rows = reads.scans.get(scan_at).map_or(0, Vec::len);
                    scan_at += 1;
                    effects.output.push(Datum::Uint(rows as u64));
                    continue;
                }
                UPDATE | RMW => {
                    let Some(record) = read else {
                        return Err(UserAbort(format!("record {keynum} not found")));
                    };
                    if kind == RMW {
                        effects.output.push(Datum::Uint((record.len() / FIELD_BYTES) as u64));
                    }
                    with_field(record, request, keynum, extra)
                        .ok_or_else(|| UserAbort(format!("record {keynum} is malformed")))?
                }
                _ => record_value(request, keynum),
            };
            match effects.writes.iter_mut().find(|w| w.key == key) {
                Some(own) => own.value = Some(value),
                None => effects.writes.push(Write { key, value: Some(value) }),
            }
        }
        Ok(effects)
    }
}

/// The last-writer invariant (see the module documentation).
#[derive(Default)]
struct YcsbCheck {
    // Per field (record key, field): (commit ts, request) of the newest committed writer.
    // Hot: hashed.
    last: FixedHashMap<Field, (Timestamp, u64)>,
    /// Per field key, other writers committed at its highest timestamp (a protocol may
    /// commit two writes of one key at one timestamp and order them by transaction id,
    /// which a completion does not carry): either writer's value passes. At most
    /// [`crate::micro::TIES_MAX`].
    tied: FixedHashMap<Field, Vec<u64>>,
    ties_total: u64,
    unknown: FixedHashMap<Field, Vec<u64>>,
    committed: u64,
}

/// A field: its record's key and its number.
type Field = (Key, u64);

fn writes_of(txn: &TxnRequest) -> Vec<(Field, u64)> {
    let Ok((ops, request)) = parse(&txn.args) else { return Vec::new() };
    let mut fields = Vec::new();
    for &(kind, keynum, extra) in ops.iter() {
        let key = record_key(record_hash(keynum));
        match kind {
            UPDATE | RMW => fields.push(((key, extra), request)),
            INSERT => fields.extend((0..FIELD_COUNT).map(|f| ((key.clone(), f), request))),
            _ => {}
        }
    }
    fields
}

impl InvariantCheck for YcsbCheck {
    fn observe(&mut self, completion: &Completion) {
        let (TxnResult::Committed, Some(ts)) =
            (&completion.outcome.result, completion.outcome.commit_ts)
        else {
            return;
        };
        self.committed += 1;
        for (key, request) in writes_of(&completion.txn) {
            let entry = self.last.entry(key.clone()).or_insert((Timestamp::ZERO, LOADED));
            if ts == entry.0 {
                self.ties_total += 1;
                let tied = self.tied.entry(key).or_default();
                if tied.len() < crate::micro::TIES_MAX {
                    tied.push(request);
                }
            } else if ts > entry.0 {
                *entry = (ts, request);
                self.tied.remove(&key);
            }
        }
    }

    fn unanswered(&mut self, _client: u32, _request: RequestId, txn: &TxnRequest, _at: Time) {
        for (key, request) in writes_of(txn) {
            self.unknown.entry(key).or_default().push(request);
        }
    }

    fn check(&self, stores: &[(ShardId, &MvccStore)]) -> Vec<CheckResult> {
        let mut problems = Vec::new();
        let mut expected: BTreeMap<&Field, u64> =
            self.last.iter().map(|(f, &(_, r))| (f, r)).collect();
        let mut fields = 0u64;
        for (_, store) in stores {
            for (key, version) in store.latest_values() {
                let record = version.value.as_deref().unwrap_or_default();
                for (number, found) in writers_of(record).enumerate() {
                    fields += 1;
                    let field = (key.clone(), number as u64);
                    let want = expected.remove(&field).unwrap_or(LOADED);
                    let among = |rs: Option<&Vec<u64>>| {
                        rs.is_some_and(|rs| found.is_some_and(|f| rs.contains(&f)))
                    };
                    let maybe = among(self.unknown.get(&field)) || among(self.tied.get(&field));
                    if found != Some(want) && !maybe && problems.len() < 5 {
                        problems.push(format!(
                            "field {number} of {key:?} holds the write of {found:?}, expected {want}"
                        ));
                    }
                }
            }
        }
        let missing = expected.len();
        if missing > 0 {
            problems.push(format!("{missing} committed field writes are missing"));
        }
        let passed = problems.is_empty();
        let detail = if passed {
            let ties = match self.ties_total {
                0 => String::new(),
                n => format!("; {n} writes tied at one timestamp: either writer's value passes"),
            };
            format!(
                "{fields} fields hold their last committed write ({} commits{ties})",
                self.committed
            )
        } else {
            problems.join("; ")
        };
        vec![CheckResult { name: "ycsb-last-writer".into(), passed, detail }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{apply_serially, check_stores, completion, loaded_stores};

    fn ycsb(name: &str, ops: Option<u32>) -> Ycsb {
        let options = WorkloadOptions {
            shards: 2,
            keys_per_shard: 100,
            zipf_theta: None,
            ops_max: ops,
            distribution: None,
            region_groups: None,
            tpcc: Default::default(),
        };
        Ycsb::new(name, &options).unwrap()
    }

    #[test]
    fn mixes_follow_the_workload_files_and_the_last_writer_check_holds() {
        for (name, kind, share) in [
            ("ycsb-a", UPDATE, 0.5),
            ("ycsb-b", READ, 0.95),
            ("ycsb-c", READ, 1.0),
            ("ycsb-d", INSERT, 0.05),
            ("ycsb-e", SCAN, 0.95),
            ("ycsb-f", RMW, 0.5),
        ] {
            let w = ycsb(name, None);
            let mut stores = loaded_stores(&w, 2);
            assert_eq!(stores.iter().map(|s| s.latest_values().count()).sum::<usize>(), 200);
            let mut generator = w.generator(0, 1);
            let mut check = w.checker();
            let mut counted = 0;
            for ts in 1..2_000u64 {
                let txn = generator.next(RequestId(ts));
                let (ops, _) = parse(&txn.args).unwrap();
                counted += ops.iter().filter(|op| op.0 == kind).count();
                let outcome = apply_serially(&w, &mut stores, &txn, ts);
                generator.on_reply(RequestId(ts), &outcome);
                check.observe(&completion(ts, txn, outcome));
            }
            let found = counted as f64 / 1_999.0;
            assert!((found - share).abs() < 0.03, "{name}: {found} vs {share}");
            let result = check_stores(check.as_ref(), &stores);
            assert!(result.passed, "{name}: {}", result.detail);
        }
    }

    #[test]
    fn latest_reads_inserted_records_and_the_check_catches_a_lost_update() {
        let w = ycsb("ycsb-d", Some(4));
        let mut stores = loaded_stores(&w, 2);
        let mut generator = w.generator(0, 2);
        let mut check = w.checker();
        for ts in 1..1_000u64 {
            let txn = generator.next(RequestId(ts));
            let outcome = apply_serially(&w, &mut stores, &txn, ts);
            // Reads find every field: latest never picks a record not yet inserted.
            for output in &outcome.outputs {
                assert!(output.iter().all(|d| *d == Datum::Uint(FIELD_COUNT)), "{output:?}");
            }
            generator.on_reply(RequestId(ts), &outcome);
            check.observe(&completion(ts, txn, outcome));
        }
        assert!(w.inserts.lock().unwrap().last_value() > 200, "records were inserted");
        assert!(check_stores(check.as_ref(), &stores).passed);
        // Put back the loaded value of a record a committed insert wrote.
        let (key, _) = stores[0]
            .latest_values()
            .find(|(_, v)| writers_of(v.value.as_ref().unwrap()).any(|w| w != Some(LOADED)))
            .map(|(k, v)| (k.clone(), v.clone()))
            .unwrap();
        stores[0].load(key, record_value(LOADED, 0));
        assert!(!check_stores(check.as_ref(), &stores).passed);
        let bad = WorkloadOptions {
            shards: 1,
            keys_per_shard: 10,
            zipf_theta: Some(0.5),
            ops_max: None,
            distribution: None,
            region_groups: None,
            tpcc: Default::default(),
        };
        assert!(Ycsb::new("ycsb-a", &bad).unwrap_err().0.contains("--zipf does not apply"));
    }

    /// Two updates of one field committed at one timestamp (a protocol orders them by
    /// transaction id, which a completion does not carry): the store may hold either write,
    /// and the check passes with either, saying so; a value no tied writer wrote still fails.
    #[test]
    fn the_last_writer_check_takes_either_of_two_writers_tied_at_a_timestamp() {
        let w = ycsb("ycsb-a", None);
        let mut generator = w.generator(0, 4);
        let update = (1..500u64)
            .map(|r| generator.next(RequestId(r)))
            .find(|t| parse(&t.args).is_ok_and(|(ops, _)| ops.len() == 1 && ops[0].0 == UPDATE))
            .expect("an update");
        // The same update as another request (its value names the request).
        let as_request = |request: u64| {
            let mut t = update.clone();
            t.args = vec![t.args[0].clone(), Datum::Uint(request)];
            t
        };
        let (a, b, c) = (as_request(1_001), as_request(1_002), as_request(1_003));
        // `stored` applied to the stores in order; `a` and `b` committed at timestamp 5 by
        // the protocol's account, `a` observed first.
        let run = |stored: &[&TxnRequest]| {
            let mut stores = loaded_stores(&w, 2);
            for (i, t) in stored.iter().enumerate() {
                apply_serially(&w, &mut stores, t, 10 + i as u64);
            }
            let mut check = w.checker();
            for (request, t) in [(1_001, &a), (1_002, &b)] {
                let outcome = apply_serially(&w, &mut loaded_stores(&w, 2), t, 5);
                check.observe(&completion(request, t.clone(), outcome));
            }
            check_stores(check.as_ref(), &stores)
        };
        assert!(run(&[&a]).passed);
        let either = run(&[&a, &b]);
        assert!(either.passed && either.detail.contains("tied"), "{}", either.detail);
        assert!(!run(&[&a, &b, &c]).passed, "a value no tied writer wrote");
    }

    fn ops_txn(request: u64, ops: &[(u64, u64, u64)]) -> TxnRequest {
        let ops = ops
            .iter()
            .map(|&(k, n, e)| Datum::List(vec![Datum::Uint(k), Datum::Uint(n), Datum::Uint(e)]))
            .collect();
        TxnRequest { proc: ProcId(0), args: vec![Datum::List(ops), Datum::Uint(request)] }
    }

    /// A record is one key: an update rewrites one field of it and keeps the others, two
    /// updates of one record in one transaction both land, and an update of a record that is
    /// not there writes nothing and aborts.
    #[test]
    fn updates_rewrite_one_field_of_the_record_and_a_missing_record_aborts() {
        let w = ycsb("ycsb-a", Some(4));
        let mut stores = loaded_stores(&w, 2);
        let txn = ops_txn(7, &[(UPDATE, 3, 2), (READ, 5, 0), (UPDATE, 3, 9)]);
        let outcome = apply_serially(&w, &mut stores, &txn, 10);
        assert_eq!(outcome.result, TxnResult::Committed);
        let key = record_key(record_hash(3));
        let shard = YcsbTxn { hash_per_shard: w.hash_per_shard, shards: 2 }.shard_of(3);
        let record = stores[shard as usize].get_at(&key, Timestamp::MAX).unwrap().clone();
        let writers: Vec<Option<u64>> = writers_of(&record).collect();
        let want: Vec<Option<u64>> =
            (0..FIELD_COUNT).map(|f| Some(if f == 2 || f == 9 { 7 } else { LOADED })).collect();
        assert_eq!(writers, want);
        let mut check = w.checker();
        check.observe(&completion(7, txn, outcome));
        assert!(check_stores(check.as_ref(), &stores).passed);

        // Record 250 was never loaded (200 records): the update aborts and writes nothing.
        let before: usize = stores.iter().map(|s| s.latest_values().count()).sum();
        let missing = ops_txn(8, &[(UPDATE, 3, 1), (UPDATE, 250, 0)]);
        let outcome = apply_serially(&w, &mut stores, &missing, 11);
        assert!(matches!(outcome.result, TxnResult::UserAborted(ref why) if why.contains("250")));
        assert_eq!(stores.iter().map(|s| s.latest_values().count()).sum::<usize>(), before);
        assert_eq!(stores[shard as usize].get_at(&key, Timestamp::MAX), Some(&record));
    }

    /// A field outside the record's ten, or a scan of no records, is refused when the
    /// arguments are parsed: no plan, no keys, nothing read or written.
    #[test]
    fn an_operation_outside_the_record_is_refused_with_its_reason() {
        let w = ycsb("ycsb-a", Some(4));
        let registry = w.registry();
        let partitioner = w.partitioner();
        for (op, names) in [
            ((UPDATE, 3, FIELD_COUNT), "10 is out of range"),
            ((RMW, 3, u64::MAX), "out of range"),
            ((SCAN, 3, 0), "scans of 1..="),
        ] {
            let txn = ops_txn(9, &[(READ, 1, 0), op]);
            let procedure = registry.get(txn.proc).expect("registered");
            let context = PlanContext { partitioner: &partitioner };
            match procedure.plan(&txn.args, context) {
                Err(ProcError::BadArgs(why)) => assert!(why.contains(names), "{why}"),
                other => panic!("{op:?} planned: {other:?}"),
            }
            match procedure.keys(0, &txn.args, &[]) {
                Err(ProcError::BadArgs(why)) => assert!(why.contains(names), "{why}"),
                other => panic!("{op:?} gave keys: {other:?}"),
            }
        }
    }

    /// The lost update a record layout invites: two committed updates of different fields of
    /// one record, the second computed from the record as it was before the first (what a
    /// protocol that let them run concurrently would store). The check names the lost field.
    #[test]
    fn the_check_catches_an_update_of_one_field_that_undid_another() {
        let w = ycsb("ycsb-a", None);
        let (first, second) = (ops_txn(1, &[(UPDATE, 4, 1)]), ops_txn(2, &[(UPDATE, 4, 6)]));
        let mut stale = loaded_stores(&w, 2);
        let mut stores = loaded_stores(&w, 2);
        let one = apply_serially(&w, &mut stores, &first, 10);
        let two = apply_serially(&w, &mut stale, &second, 20);
        let mut check = w.checker();
        check.observe(&completion(1, first, one));
        check.observe(&completion(2, second, two.clone()));
        assert!(!check_stores(check.as_ref(), &stale).passed, "field 1 lost its update");
        let serial = apply_serially(&w, &mut stores, &ops_txn(2, &[(UPDATE, 4, 6)]), 20);
        assert_eq!(serial.result, two.result);
        assert!(check_stores(check.as_ref(), &stores).passed);
        let detail = check_stores(check.as_ref(), &stale).detail;
        assert!(detail.contains("field 1 of"), "{detail}");
    }

    #[test]
    fn request_distributions_can_be_chosen_and_hotspot_concentrates() {
        let options = |d: &str| WorkloadOptions {
            shards: 2,
            keys_per_shard: 100,
            zipf_theta: None,
            ops_max: None,
            distribution: Some(d.into()),
            region_groups: None,
            tpcc: Default::default(),
        };
        let w = Ycsb::new("ycsb-c", &options("hotspot")).unwrap();
        let mut generator = w.generator(0, 3);
        let hot = (0..2_000u64)
            .filter(|&r| {
                let (ops, _) = parse(&generator.next(RequestId(r)).args).unwrap();
                ops[0].1 < 40
            })
            .count();
        assert!((1_450..1_750).contains(&hot), "80% on the first 20% of 200 records: {hot}");
        assert!(Ycsb::new("ycsb-a", &options("uniform")).is_ok());
        let err = Ycsb::new("ycsb-a", &options("pareto")).unwrap_err();
        assert!(err.0.contains("accepted: zipfian, uniform, latest, hotspot"), "{err}");
        assert!(crate::build("bank", &options("uniform")).is_err());
    }

    #[test]
    fn scans_stay_on_their_shard_and_return_whole_records() {
        let w = ycsb("ycsb-e", None);
        let txn = YcsbTxn { hash_per_shard: w.hash_per_shard, shards: 2 };
        let partitioner = w.partitioner();
        for keynum in 0..50 {
            let range = txn.scan_range(keynum, 7);
            assert_eq!(range.limit, 7);
            assert_eq!(partitioner.shard_of(&range.start).0 as u64, txn.shard_of(keynum));
            assert!(range.start < range.end);
        }
    }
}
