//! Piece execution: runs a procedure's pieces on one shard over a read source, with the
//! attempt's own earlier writes laid over it (read-your-writes), and checks that each piece
//! kept its contract (keys on this shard, writes declared, replicated tables read-only).
//!
//! The read source is where a protocol reads from: the latest committed state (`occ`, 2PL
//! under its locks), or the state at a timestamp (MVTO, snapshot reads). Execution keeps no
//! state: what a piece read (with the versions seen, for validation) and what it wants to
//! write come back in a [`PieceRun`].

use meridian_core::key::{Key, Value};
use meridian_core::txn::{
    Args, KeySet, Partitioner, PieceEffects, PieceOutput, ProcError, Procedure, Reads, ScanRange,
    ShardTarget, UserAbort, PIECES_MAX, PIECE_KEYS_MAX, SCAN_ROWS_MAX,
};
use meridian_core::{ShardId, Timestamp, TxnId};
use meridian_storage::{MvccStore, Version};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The version a read saw: its timestamp and writer. `None` in a read set: the key was absent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionTag {
    /// Version timestamp.
    pub ts: Timestamp,
    /// The attempt that wrote it.
    pub writer: TxnId,
}

impl VersionTag {
    /// The tag of a version.
    pub fn of(version: Option<&Version>) -> Option<Self> {
        version.map(|v| Self { ts: v.ts, writer: v.writer })
    }
}

/// A scan and the rows it saw, for validation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanCheck {
    /// The range.
    pub range: ScanRange,
    /// Keys and versions seen, in scan order.
    pub rows: Vec<(Key, VersionTag)>,
}

/// One piece to run, with the outputs of its dependencies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PieceCall {
    /// Piece index in the plan.
    pub piece: u32,
    /// Outputs of `deps`, in order.
    pub inputs: Vec<PieceOutput>,
}

/// What running one piece produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PieceRun {
    /// Piece index.
    pub piece: u32,
    /// Keys read from the source and the versions seen (reads of the attempt's own writes
    /// are not listed: they need no validation).
    pub reads: Vec<(Key, Option<VersionTag>)>,
    /// Scans and the rows seen.
    pub scans: Vec<ScanCheck>,
    /// Writes and output, or the user abort.
    pub effects: Result<PieceEffects, UserAbort>,
}

/// Where pieces read from.
pub trait ReadSource {
    /// The version of `key` a read sees (a delete included), if any.
    fn read(&self, key: &Key) -> Option<&Version>;
    /// The rows a scan of `range` sees.
    fn scan(&self, range: &ScanRange) -> Vec<(Key, Version)>;
}

/// The latest committed state of a store.
pub struct Latest<'a>(pub &'a MvccStore);

impl ReadSource for Latest<'_> {
    fn read(&self, key: &Key) -> Option<&Version> {
        self.0.read_latest(key)
    }

    fn scan(&self, range: &ScanRange) -> Vec<(Key, Version)> {
        self.0.scan(range, Timestamp::MAX)
    }
}

/// The committed state of a store as of a timestamp.
pub struct AtTimestamp<'a>(pub &'a MvccStore, pub Timestamp);

impl ReadSource for AtTimestamp<'_> {
    fn read(&self, key: &Key) -> Option<&Version> {
        self.0.read_at(key, self.1)
    }

    fn scan(&self, range: &ScanRange) -> Vec<(Key, Version)> {
        self.0.scan(range, self.1)
    }
}

/// An attempt's own writes on one shard, by key (`None` deletes).
pub type Overlay = BTreeMap<Key, Option<Value>>;

/// The shard pieces run on and how keys map to shards.
#[derive(Clone, Copy)]
pub struct Placement<'a> {
    /// The shard executing.
    pub shard: ShardId,
    /// The run's partitioner.
    pub partitioner: &'a Partitioner,
}

/// Checks a piece's declared keys: bounded, on this shard (or a replicated table), and no
/// write to a replicated table.
pub fn check_keys(placement: Placement<'_>, keys: &KeySet) -> Result<(), ProcError> {
    let Placement { shard, partitioner } = placement;
    if keys.reads.len() + keys.writes.len() > PIECE_KEYS_MAX {
        return Err(ProcError::Contract(format!(
            "a piece touches more than {PIECE_KEYS_MAX} keys"
        )));
    }
    if keys.scans.len() > PIECE_KEYS_MAX {
        return Err(ProcError::Contract(format!(
            "a piece scans more than {PIECE_KEYS_MAX} ranges"
        )));
    }
    if let Some(key) = keys.reads.iter().chain(&keys.writes).find(|k| !partitioner.allows(shard, k))
    {
        return Err(ProcError::Contract(format!("key {key:?} does not live on shard {}", shard.0)));
    }
    if let Some(range) = keys.scans.iter().find(|r| r.limit > SCAN_ROWS_MAX) {
        return Err(ProcError::Contract(format!(
            "a scan of {} rows is over {SCAN_ROWS_MAX}",
            range.limit
        )));
    }
    if let Some(key) = keys.writes.iter().find(|k| partitioner.target_of(k) == ShardTarget::Any) {
        return Err(ProcError::Unsupported(format!(
            "write to replicated table key {key:?}: replicated tables are read-only"
        )));
    }
    Ok(())
}

/// Reads a piece's keys from `source` (through `overlay`), runs it, and checks that it wrote
/// only keys it declared.
pub fn run_piece(
    procedure: &dyn Procedure,
    placement: Placement<'_>,
    call: (u32, &Args, &[&PieceOutput]),
    source: &impl ReadSource,
    overlay: &Overlay,
) -> Result<PieceRun, ProcError> {
    let (piece, args, inputs) = call;
    let keys = procedure.keys(piece, args, inputs)?;
    check_keys(placement, &keys)?;
    let mut reads = Reads { values: Vec::with_capacity(keys.reads.len()), scans: Vec::new() };
    let mut read_tags = Vec::with_capacity(keys.reads.len());
    for key in &keys.reads {
        match overlay.get(key) {
            Some(own) => reads.values.push(own.as_deref()),
            None => {
                let version = source.read(key);
                reads.values.push(version.and_then(|v| v.value.as_deref()));
                read_tags.push((key.clone(), VersionTag::of(version)));
            }
        }
    }
    let mut scans = Vec::with_capacity(keys.scans.len());
    for range in &keys.scans {
        let rows = source.scan(range);
        scans.push(ScanCheck {
            range: range.clone(),
            rows: rows
                .iter()
                .map(|(k, v)| (k.clone(), VersionTag { ts: v.ts, writer: v.writer }))
                .collect(),
        });
        reads.scans.push(merge_overlay(rows, range, overlay));
    }
    let effects = procedure.execute(piece, args, inputs, &reads);
    if let Ok(PieceEffects { writes, .. }) = &effects {
        if let Some(bad) = writes.iter().find(|w| !keys.writes.contains(&w.key)) {
            return Err(ProcError::Contract(format!(
                "piece {piece} wrote undeclared key {:?}",
                bad.key
            )));
        }
    }
    Ok(PieceRun { piece, reads: read_tags, scans, effects })
}

/// Runs `calls` in order over `source` plus `overlay` (the attempt's earlier writes on this
/// shard, which later calls also see). Keeps no state.
pub fn run_calls(
    procedure: &dyn Procedure,
    placement: Placement<'_>,
    args: &Args,
    calls: &[PieceCall],
    source: &impl ReadSource,
    mut overlay: Overlay,
) -> Result<Vec<PieceRun>, ProcError> {
    if calls.len() > PIECES_MAX {
        return Err(ProcError::Contract(format!("{} pieces is over {PIECES_MAX}", calls.len())));
    }
    let mut runs = Vec::with_capacity(calls.len());
    for call in calls {
        let inputs: Vec<&PieceOutput> = call.inputs.iter().collect();
        let run = run_piece(procedure, placement, (call.piece, args, &inputs), source, &overlay)?;
        if let Ok(effects) = &run.effects {
            for write in &effects.writes {
                overlay.insert(write.key.clone(), write.value.clone());
            }
        }
        runs.push(run);
    }
    Ok(runs)
}

/// What running a whole single-shard plan produced.
#[derive(Debug)]
pub struct PlanRun {
    /// One run per piece, in plan order (up to a user abort). Their effects carry no writes:
    /// those are in `writes` (moved there, not copied: a value may be a kilobyte).
    pub runs: Vec<PieceRun>,
    /// The attempt's writes, by key.
    pub writes: Overlay,
    /// The piece that asked to abort, if one did.
    pub user_abort: Option<String>,
}

/// Plans `args` and runs every piece on this shard in plan order, each seeing the outputs of
/// its dependencies and the writes of the pieces before it. Every piece must target this
/// shard or a replicated table.
pub fn run_plan(
    procedure: &dyn Procedure,
    placement: Placement<'_>,
    args: &Args,
    source: &impl ReadSource,
) -> Result<PlanRun, ProcError> {
    let context = meridian_core::txn::PlanContext { partitioner: placement.partitioner };
    let plan = procedure.plan(args, context)?;
    if plan.len() > PIECES_MAX {
        return Err(ProcError::Contract(format!("{} pieces is over {PIECES_MAX}", plan.len())));
    }
    let mut overlay = Overlay::new();
    let mut outputs: Vec<PieceOutput> = Vec::with_capacity(plan.len());
    let mut runs = Vec::with_capacity(plan.len());
    for (index, spec) in plan.iter().enumerate() {
        if !matches!(spec.target, ShardTarget::Any)
            && spec.target != ShardTarget::Shard(placement.shard)
        {
            return Err(ProcError::Contract(format!(
                "piece {index} is not on shard {}",
                placement.shard.0
            )));
        }
        if spec.deps.iter().any(|&d| d as usize >= index) {
            return Err(ProcError::Contract(format!("piece {index} depends on a later piece")));
        }
        let inputs: Vec<&PieceOutput> = spec.deps.iter().map(|&d| &outputs[d as usize]).collect();
        let mut run =
            run_piece(procedure, placement, (index as u32, args, &inputs), source, &overlay)?;
        match &mut run.effects {
            Ok(effects) => {
                for write in std::mem::take(&mut effects.writes) {
                    overlay.insert(write.key, write.value);
                }
                outputs.push(effects.output.clone());
                runs.push(run);
            }
            Err(abort) => {
                let why = abort.0.clone();
                runs.push(run);
                return Ok(PlanRun { runs, writes: Overlay::new(), user_abort: Some(why) });
            }
        }
    }
    Ok(PlanRun { runs, writes: overlay, user_abort: None })
}

/// The rows a scan sees: the source's, with the attempt's own writes in the range applied.
pub fn merge_overlay(
    rows: Vec<(Key, Version)>,
    range: &ScanRange,
    overlay: &Overlay,
) -> Vec<(Key, Value)> {
    let in_range = |k: &Key| range.start <= *k && *k < range.end;
    if range.start >= range.end || !overlay.keys().any(in_range) {
        return rows.into_iter().filter_map(|(k, v)| v.value.map(|value| (k, value))).collect();
    }
    let mut merged: BTreeMap<Key, Value> =
        rows.into_iter().filter_map(|(k, v)| v.value.map(|value| (k, value))).collect();
    for (key, value) in overlay.range(range.start.clone()..range.end.clone()) {
        match value {
            Some(value) => merged.insert(key.clone(), value.clone()),
            None => merged.remove(key),
        };
    }
    let limit = range.limit as usize;
    if range.reverse {
        merged.into_iter().rev().take(limit).collect()
    } else {
        merged.into_iter().take(limit).collect()
    }
}
