//! One server of `chain`: the only replica of one shard, running the states (pieces) of the
//! chains that pass through it under multi-version timestamp ordering, and remembering what it
//! did for each transaction until the decision comes.
//!
//! Concurrency control (every attempt carries its coordinator's timestamp `ts`):
//! - a read sees the attempt's own version at `ts`, else the newest version strictly below
//!   `ts`, pending ones included; reading another attempt's pending version makes this one
//!   depend on it (it may not precommit here until that writer committed, and aborts with it:
//!   a cascading abort). Every read stamps its key at `ts` when it runs (the textbook rule:
//!   there is no separate prepare in a chain).
//! - a write of key `k` at `ts` is refused when another attempt holds a pending version of
//!   `k` (`lock-denied`: pending versions are MVTO's write locks), when `k` has a version
//!   above `ts` or a read stamp above `ts` (`timestamp-too-old`); otherwise it becomes a
//!   pending version at `ts`.
//! - a scan sees, per key of its range, the attempt's own version at `ts`, else the newest
//!   committed version below `ts`; it stamps its whole range at `ts` (a write inside it below
//!   `ts` is refused, `timestamp-too-old`), and is refused (`lock-denied`) when another
//!   attempt holds a pending version below `ts` among the keys it examined: a scan does not
//!   wait for a writer as a read does.
//! - below the garbage-collection watermark history is gone: an attempt at or below it is
//!   refused (`timestamp-too-old`).
//!
//! Dependencies only point from larger to smaller timestamps (a read at `ts` sees nothing at
//! or above it but its own writes), so waits cannot form a cycle.
//!
//! This module decides nothing about commit: [`crate::chain::node`] runs the pipelined commit
//! and calls [`Server::commit`] or [`Server::abort`] with the decision.

use crate::kit::exec::{run_piece, Overlay, Placement, ReadSource, ScanCheck};
use crate::mvto::order::ReadStamps;
use meridian_core::key::Key;
use meridian_core::txn::{
    AbortCause, PieceOutput, ProcError, Procedure, ScanRange, TxnRequest, PIECES_MAX,
};
use meridian_core::{NodeId, ShardId, Timestamp, TxnId};
use meridian_storage::{MvccStore, Version, VersionState};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Range;

/// Why an attempt aborted, as the hop that decided it says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Why {
    /// A conflict (or a timeout, or no room): retried. `seen` is the largest timestamp the
    /// refusal names (a version or stamp above the attempt's), so a retry starts above it.
    Conflict {
        /// The cause reports count.
        cause: AbortCause,
        /// A timestamp the retry must exceed (zero when none).
        seen: Timestamp,
    },
    /// A piece asked to abort: not retried.
    User(String),
    /// A piece broke its contract, or the protocol cannot run it: not retried.
    Procedure(ProcError),
}

impl Why {
    /// A conflict naming no timestamp a retry must exceed (a timeout, a cascading abort).
    pub fn conflict(cause: AbortCause) -> Self {
        Self::Conflict { cause, seen: Timestamp::ZERO }
    }
}

/// One hop of a chain: consecutive pieces on one shard (adjacent states on one server are one
/// logical state). Its messages go to the shard's leader.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hop {
    /// Where its pieces run.
    pub shard: ShardId,
    /// Its pieces, in plan order.
    pub pieces: Range<u32>,
}

/// What a hop of an attempt did here and which of its commit messages it has.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HopState {
    /// The hop after it acknowledged (it ran): the wide-area legs on that message's chain.
    /// The leader's alone (not replicated: a new leader waits for what it needs afresh, or
    /// times out).
    #[serde(skip)]
    pub acked: Option<u16>,
    /// The hop before it precommitted, with the wide-area legs on that message's chain. The
    /// leader's alone, as `acked`.
    #[serde(skip)]
    pub precommit: Option<u16>,
    /// This hop voted (the last hop: decided), in the log this copy of the machine applied:
    /// once that is the committed log, it may no longer abort on its own. Under serial
    /// replication the precommit leaves only after; under overlapped replication it leaves
    /// from the speculative copy, and the last hop waits for this hop's `Durable`.
    pub precommitted: bool,
}

/// An attempt this server ran states of and has no decision for yet.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    /// Its timestamp.
    pub ts: Timestamp,
    /// The coordinator (hop 0).
    pub client: NodeId,
    /// Its hops, in chain order (hop `h` of the messages is `hops[h - 1]`).
    pub hops: Vec<Hop>,
    /// The hops it ran here, by hop number.
    pub ran: BTreeMap<u32, HopState>,
    /// Keys it holds pending versions of here.
    pub written: BTreeSet<Key>,
    /// Undecided writers whose pending versions it read here.
    pub waits_on: BTreeSet<TxnId>,
    /// The outputs of every piece up to the last hop it ran here.
    pub outputs: Vec<PieceOutput>,
}

/// How an attempt ended here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ended {
    /// Committed.
    Committed,
    /// Aborted, or refused before it arrived.
    Aborted,
}

/// Reads of an attempt at `ts`: its own version at `ts`, else the newest version below `ts`.
struct View<'a> {
    store: &'a MvccStore,
    ts: Timestamp,
    own: TxnId,
}

impl ReadSource for View<'_> {
    fn read(&self, key: &Key) -> Option<&Version> {
        let own = (self.ts, self.own);
        self.store
            .versions(key)
            .iter()
            .rev()
            .find(|v| v.ts < own.0 || (v.ts == own.0 && v.writer == own.1))
    }

    /// The rows of `range` the attempt sees: per key its own version at `ts`, else the newest
    /// committed one below `ts` (deletes skipped), at most `range.limit`. Another attempt's
    /// pending version below `ts` is not seen here: [`Server::run_hop`] aborts a scan that
    /// passes one (see [`pending_under`]).
    fn scan(&self, range: &ScanRange) -> Vec<(Key, Version)> {
        let own = (self.ts, self.own);
        let visible = |key: &Key| {
            let version = self.store.versions(key).iter().rev().find(|v| {
                (v.ts == own.0 && v.writer == own.1)
                    || (v.ts < own.0 && v.state == VersionState::Committed)
            })?;
            version.value.is_some().then(|| (key.clone(), version.clone()))
        };
        let keys = self.store.keys_in(&range.start, &range.end);
        let limit = range.limit as usize;
        if range.reverse {
            keys.rev().filter_map(visible).take(limit).collect()
        } else {
            keys.filter_map(visible).take(limit).collect()
        }
    }
}

/// A shard's server.
#[derive(Clone, Debug)]
pub struct Server {
    /// Its shard.
    pub shard: ShardId,
    /// Its data.
    pub store: MvccStore,
    stamps: ReadStamps,
    /// Attempts with states run here and no decision yet.
    pub records: BTreeMap<TxnId, Record>,
    /// For each undecided writer, the attempts that read its pending versions here.
    readers_of: BTreeMap<TxnId, BTreeSet<TxnId>>,
    /// Decisions remembered (so duplicates and late messages are recognised), oldest first.
    ended: BTreeMap<TxnId, Ended>,
    ended_order: VecDeque<(TxnId, Timestamp)>,
    ended_max: usize,
    records_max: usize,
    /// Per coordinator node, the largest timestamp among its attempts' forgotten decisions:
    /// an unknown attempt of that coordinator at or below it may be one of them, so it is
    /// never run. (Per coordinator, because its timestamps increase: another coordinator's
    /// attempts are not held back by it.) At most one entry per node.
    forgotten_below: BTreeMap<NodeId, Timestamp>,
    /// Per coordinator node, the newest incarnation whose attempts ran here and the largest
    /// timestamp among them (see [`Server::admit_ts`]). At most one entry per node.
    origins: BTreeMap<NodeId, (u64, Timestamp)>,
}

/// The timestamp of another attempt's pending version below `ts` among the keys a scan of
/// `scan.range` examined (up to its last row when it stopped at its limit, the whole range
/// otherwise), if there is one: the scan would read a different set of rows if that writer
/// committed, so it cannot run until the writer is decided.
fn pending_under(
    store: &MvccStore,
    scan: &ScanCheck,
    ts: Timestamp,
    own: TxnId,
) -> Option<Timestamp> {
    let range = &scan.range;
    let full = scan.rows.len() >= range.limit as usize;
    let last = scan.rows.last().map(|(key, _)| key).filter(|_| full);
    let pending = |key: &Key| {
        store
            .versions(key)
            .iter()
            .find(|v| v.state == VersionState::Pending && v.writer != own && v.ts < ts)
            .map(|v| v.ts)
    };
    let keys = store.keys_in(&range.start, &range.end);
    match (last, range.reverse) {
        (None, _) => keys.filter_map(pending).next(),
        (Some(last), false) => keys.take_while(|k| *k <= last).filter_map(pending).next(),
        (Some(last), true) => keys.rev().take_while(|k| *k >= last).filter_map(pending).next(),
    }
}

/// What running a hop did.
#[derive(Debug)]
pub enum HopRun {
    /// The hop's pieces ran; its new outputs were appended to the record's.
    Ran,
    /// The attempt must abort (nothing it wrote here stays once [`Server::abort`] runs).
    Abort(Why),
}

impl Server {
    /// A server with an empty store, remembering at most `ended_max` decisions and holding at
    /// most `records_max` undecided attempts.
    pub fn new(
        shard: ShardId,
        read_stamps_max: usize,
        ended_max: usize,
        records_max: usize,
    ) -> Self {
        assert!(ended_max > 0 && records_max > 0, "limits are validated");
        Self {
            shard,
            store: MvccStore::new(),
            stamps: ReadStamps::new(read_stamps_max),
            records: BTreeMap::new(),
            readers_of: BTreeMap::new(),
            ended: BTreeMap::new(),
            ended_order: VecDeque::new(),
            ended_max,
            records_max,
            forgotten_below: BTreeMap::new(),
            origins: BTreeMap::new(),
        }
    }

    /// Admits a new attempt's timestamp, or names the timestamp it must exceed. Timestamps are
    /// unique within one incarnation of a coordinator (increasing, the node in the low bits),
    /// but a restarted coordinator, its clock stepped back, could reuse one of its previous
    /// incarnation's, and two attempts at one timestamp cannot be ordered (each would read
    /// below the other's writes). So a newer incarnation's attempt must be above every
    /// timestamp of the older ones that ran here, and an older incarnation's attempt arriving
    /// after a newer one's is refused.
    pub fn admit_ts(&mut self, txn: TxnId, ts: Timestamp) -> Result<(), Timestamp> {
        match self.origins.get_mut(&txn.origin) {
            None => {
                self.origins.insert(txn.origin, (txn.incarnation, ts));
                Ok(())
            }
            Some((incarnation, highest)) if txn.incarnation == *incarnation => {
                *highest = (*highest).max(ts);
                Ok(())
            }
            Some((incarnation, highest)) if txn.incarnation > *incarnation && ts > *highest => {
                *incarnation = txn.incarnation;
                *highest = ts;
                Ok(())
            }
            Some((_, highest)) => Err(*highest),
        }
    }

    /// How the attempt ended here, if this server still remembers.
    pub fn ended(&self, txn: TxnId) -> Option<Ended> {
        self.ended.get(&txn).copied()
    }

    /// True when attempt `txn` at `ts`, which this server does not know, may be one whose
    /// decision it forgot.
    pub fn maybe_forgotten(&self, txn: TxnId, ts: Timestamp) -> bool {
        ts <= self.forgotten_below(txn.origin)
    }

    /// The timestamp an unknown attempt of coordinator `origin` must exceed to run here.
    pub fn forgotten_below(&self, origin: NodeId) -> Timestamp {
        self.forgotten_below.get(&origin).copied().unwrap_or(Timestamp::ZERO)
    }

    /// True when another undecided attempt cannot be taken.
    pub fn full(&self) -> bool {
        self.records.len() >= self.records_max
    }

    /// Runs hop `hop` (its pieces `hops[hop - 1].pieces`) of attempt `txn` at `ts`, with the
    /// outputs of every earlier piece in `outputs`. Creates the record on the attempt's first
    /// hop here. The caller checked that the hop is this shard's and has not run here.
    #[allow(clippy::too_many_arguments)]
    pub fn run_hop(
        &mut self,
        procedure: &dyn Procedure,
        partitioner: &meridian_core::txn::Partitioner,
        (txn, ts, client): (TxnId, Timestamp, NodeId),
        request: &TxnRequest,
        hops: &[Hop],
        hop: u32,
        outputs: Vec<PieceOutput>,
    ) -> HopRun {
        let pieces = hops[hop as usize - 1].pieces.clone();
        debug_assert_eq!(hops[hop as usize - 1].shard, self.shard);
        let record = self.records.entry(txn).or_insert_with(|| Record {
            ts,
            client,
            hops: hops.to_vec(),
            ran: BTreeMap::new(),
            written: BTreeSet::new(),
            waits_on: BTreeSet::new(),
            outputs: Vec::new(),
        });
        debug_assert!(!record.ran.contains_key(&hop));
        record.ran.insert(hop, HopState::default());
        if outputs.len() != pieces.start as usize {
            return HopRun::Abort(Why::Procedure(ProcError::Contract(format!(
                "hop {hop} arrived with {} outputs, its first piece is {}",
                outputs.len(),
                pieces.start
            ))));
        }
        record.outputs = outputs;
        let watermark = self.store.gc_watermark();
        if ts <= watermark {
            let seen = watermark;
            return HopRun::Abort(Why::Conflict { cause: AbortCause::TimestampTooOld, seen });
        }
        let plan =
            match procedure.plan(&request.args, meridian_core::txn::PlanContext { partitioner }) {
                Ok(plan) if plan.len() <= PIECES_MAX => plan,
                Ok(plan) => {
                    let why = format!("{} pieces is over {PIECES_MAX}", plan.len());
                    return HopRun::Abort(Why::Procedure(ProcError::Contract(why)));
                }
                Err(error) => return HopRun::Abort(Why::Procedure(error)),
            };
        let placement = Placement { shard: self.shard, partitioner };
        for piece in pieces {
            let Some(spec) = plan.get(piece as usize) else {
                let why = format!("piece {piece} is not in the plan");
                return HopRun::Abort(Why::Procedure(ProcError::Contract(why)));
            };
            let record = self.records.get(&txn).expect("created above");
            let inputs: Vec<&PieceOutput> =
                spec.deps.iter().filter_map(|&d| record.outputs.get(d as usize)).collect();
            if inputs.len() != spec.deps.len() {
                let why = format!("piece {piece} depends on a later piece");
                return HopRun::Abort(Why::Procedure(ProcError::Contract(why)));
            }
            let view = View { store: &self.store, ts, own: txn };
            let run = match run_piece(
                procedure,
                placement,
                (piece, &request.args, &inputs),
                &view,
                &Overlay::new(),
            ) {
                Ok(run) => run,
                Err(error) => return HopRun::Abort(Why::Procedure(error)),
            };
            // Scans: refused past another attempt's pending version (a phantom, or a row it
            // may delete), then stamped over the whole range so no write lands below them.
            for scan in &run.scans {
                if let Some(seen) = pending_under(&self.store, scan, ts, txn) {
                    return HopRun::Abort(Why::Conflict { cause: AbortCause::LockDenied, seen });
                }
                self.stamps.note_scan(&scan.range, ts);
            }
            // Reads: stamp each key, and depend on the writers of pending versions read.
            for (key, tag) in &run.reads {
                self.stamps.note_read(key, ts);
                let Some(tag) = tag else { continue };
                if tag.writer == txn {
                    continue;
                }
                let pending = self.store.versions(key).iter().any(|v| {
                    v.ts == tag.ts && v.writer == tag.writer && v.state == VersionState::Pending
                });
                if pending {
                    self.readers_of.entry(tag.writer).or_default().insert(txn);
                    let record = self.records.get_mut(&txn).expect("created above");
                    record.waits_on.insert(tag.writer);
                }
            }
            let effects = match run.effects {
                Ok(effects) => effects,
                Err(abort) => return HopRun::Abort(Why::User(abort.0)),
            };
            for write in effects.writes {
                if let Err(why) = self.write(txn, ts, write.key, write.value) {
                    return HopRun::Abort(why);
                }
            }
            let record = self.records.get_mut(&txn).expect("created above");
            record.outputs.push(effects.output);
        }
        HopRun::Ran
    }

    /// Writes `key` as a pending version of `txn` at `ts`, or says why not.
    fn write(
        &mut self,
        txn: TxnId,
        ts: Timestamp,
        key: Key,
        value: Option<meridian_core::key::Value>,
    ) -> Result<(), Why> {
        let chain = self.store.versions(&key);
        if let Some(other) =
            chain.iter().find(|v| v.state == VersionState::Pending && v.writer != txn)
        {
            return Err(Why::Conflict { cause: AbortCause::LockDenied, seen: other.ts });
        }
        if let Some(newer) = chain.iter().rev().find(|v| v.ts > ts) {
            return Err(Why::Conflict { cause: AbortCause::TimestampTooOld, seen: newer.ts });
        }
        let stamp = self.stamps.stamp_of(&key);
        if stamp > ts {
            return Err(Why::Conflict { cause: AbortCause::TimestampTooOld, seen: stamp });
        }
        // Its own earlier write of the key (an earlier hop here) is replaced.
        if chain.iter().any(|v| v.ts == ts && v.writer == txn) {
            self.store.revoke(&key, txn);
        }
        if self.store.write(key.clone(), ts, value, txn, VersionState::Pending).is_err() {
            let seen = self.store.gc_watermark();
            return Err(Why::Conflict { cause: AbortCause::TimestampTooOld, seen });
        }
        self.records.get_mut(&txn).expect("the writer has a record").written.insert(key);
        Ok(())
    }

    /// Commits `txn` here: its pending versions become visible; the attempts that read them
    /// wait on it no more. Returns those attempts (they may precommit now).
    pub fn commit(&mut self, txn: TxnId) -> Vec<TxnId> {
        let Some(record) = self.records.remove(&txn) else {
            self.remember(txn, Timestamp::ZERO, Ended::Committed);
            return Vec::new();
        };
        for key in &record.written {
            let committed = self.store.commit(key, txn);
            debug_assert!(committed, "a pending version of every written key");
        }
        self.forget_waits(txn, &record);
        self.remember(txn, record.ts, Ended::Committed);
        let readers = self.readers_of.remove(&txn).unwrap_or_default();
        let mut freed = Vec::new();
        for reader in readers {
            if let Some(r) = self.records.get_mut(&reader) {
                r.waits_on.remove(&txn);
                if r.waits_on.is_empty() {
                    freed.push(reader);
                }
            }
        }
        freed
    }

    /// Aborts `txn` here (at `ts`, for an attempt that may never have arrived): its pending
    /// versions go; a late copy of it will be refused. Returns the attempts that read its
    /// pending versions: they must abort too (cascading).
    pub fn abort(&mut self, txn: TxnId, ts: Timestamp) -> Vec<TxnId> {
        let record = self.records.remove(&txn);
        let ts = record.as_ref().map_or(ts, |r| r.ts);
        if let Some(record) = &record {
            for key in &record.written {
                self.store.revoke(key, txn);
            }
            self.forget_waits(txn, record);
        }
        self.remember(txn, ts, Ended::Aborted);
        let readers = self.readers_of.remove(&txn).unwrap_or_default();
        readers.into_iter().filter(|r| self.records.contains_key(r)).collect()
    }

    fn forget_waits(&mut self, txn: TxnId, record: &Record) {
        for writer in &record.waits_on {
            if let Some(readers) = self.readers_of.get_mut(writer) {
                readers.remove(&txn);
                if readers.is_empty() {
                    self.readers_of.remove(writer);
                }
            }
        }
    }

    fn remember(&mut self, txn: TxnId, ts: Timestamp, ended: Ended) {
        if self.ended.insert(txn, ended).is_some() {
            return;
        }
        self.ended_order.push_back((txn, ts));
        while self.ended_order.len() > self.ended_max {
            let (old, old_ts) = self.ended_order.pop_front().expect("over the limit, so not empty");
            self.ended.remove(&old);
            let floor = self.forgotten_below.entry(old.origin).or_insert(Timestamp::ZERO);
            *floor = (*floor).max(old_ts);
        }
        debug_assert_eq!(self.ended.len(), self.ended_order.len());
    }

    /// Raises the garbage-collection watermark to `watermark`, kept below every undecided
    /// attempt here (their later hops still read at their timestamps).
    pub fn collect_below(&mut self, watermark: Timestamp) {
        let oldest = self.records.values().map(|r| r.ts).min().unwrap_or(Timestamp(u64::MAX));
        let watermark = watermark.min(Timestamp(oldest.0.saturating_sub(1)));
        if watermark > self.store.gc_watermark() {
            self.store.set_gc_watermark(watermark);
            self.stamps.forget_below(watermark);
        }
    }

    /// Undecided attempts here (a gauge).
    pub fn open(&self) -> usize {
        self.records.len()
    }

    /// The replicated state, for a snapshot: every version of the keys written since the
    /// load (pending ones too: their attempts are undecided), the read stamps, the undecided
    /// attempts and the decisions remembered.
    pub fn image(&self) -> ServerImage {
        let rows = self
            .store
            .written_keys()
            .map(|key| {
                let versions = self.store.versions(key);
                let versions = versions
                    .iter()
                    .map(|v| (v.ts, v.writer, v.value.clone(), v.state == VersionState::Pending))
                    .collect();
                (key.clone(), versions)
            })
            .collect();
        ServerImage {
            rows,
            watermark: self.store.gc_watermark(),
            stamps: self.stamps.image(),
            records: self.records.iter().map(|(&t, r)| (t, r.clone())).collect(),
            ended: self.ended_order.iter().map(|&(t, ts)| (t, ts, self.ended[&t])).collect(),
            forgotten_below: self.forgotten_below.iter().map(|(&n, &ts)| (n, ts)).collect(),
            origins: self.origins.iter().map(|(&n, &(i, ts))| (n, i, ts)).collect(),
        }
    }

    /// Replaces the replicated state by a checked image's (the rows go over the store as it
    /// is: the initial load, or an older state of the same log).
    pub fn install(&mut self, image: ServerImage) {
        self.store.forget_writes();
        for (key, versions) in image.rows {
            let versions = versions
                .into_iter()
                .map(|(ts, writer, value, pending)| Version {
                    ts,
                    value,
                    writer,
                    state: if pending { VersionState::Pending } else { VersionState::Committed },
                })
                .collect();
            self.store.restore_chain(key, versions);
        }
        self.store.set_gc_watermark(image.watermark);
        self.stamps.install(image.stamps, image.watermark);
        self.readers_of.clear();
        self.records = image.records.into_iter().collect();
        for (&reader, record) in &self.records {
            for &writer in &record.waits_on {
                self.readers_of.entry(writer).or_default().insert(reader);
            }
        }
        self.ended = image.ended.iter().map(|&(t, _, e)| (t, e)).collect();
        self.ended_order = image.ended.into_iter().map(|(t, ts, _)| (t, ts)).collect();
        self.forgotten_below = image.forgotten_below.into_iter().collect();
        self.origins = image.origins.into_iter().map(|(n, i, ts)| (n, (i, ts))).collect();
    }
}

/// A version in an image: timestamp, writer, value, pending.
type ImageVersion = (Timestamp, TxnId, Option<meridian_core::key::Value>, bool);

/// A server's replicated state (see [`Server::image`]).
#[derive(Debug, Serialize, Deserialize)]
pub struct ServerImage {
    rows: Vec<(Key, Vec<ImageVersion>)>,
    watermark: Timestamp,
    stamps: crate::mvto::order::StampsImage,
    records: Vec<(TxnId, Record)>,
    ended: Vec<(TxnId, Timestamp, Ended)>,
    forgotten_below: Vec<(NodeId, Timestamp)>,
    origins: Vec<(NodeId, u64, Timestamp)>,
}

impl ServerImage {
    /// Checks a decoded image against the limits a server keeps to, and that what it holds
    /// hangs together (versions in timestamp order, every pending version an undecided
    /// attempt's, hop lists no longer than a plan), so installing it cannot break an
    /// invariant.
    pub fn check(&self, limits: &crate::Limits) -> Result<(), String> {
        if self.records.len() > limits.lock_holders_max || self.ended.len() > limits.decided_max {
            return Err(format!(
                "snapshot holds {} undecided attempts and {} decisions, over {} and {}",
                self.records.len(),
                self.ended.len(),
                limits.lock_holders_max,
                limits.decided_max
            ));
        }
        ReadStamps::check_image(&self.stamps, limits.read_stamps_max)?;
        let records: BTreeMap<TxnId, &Record> = self.records.iter().map(|(t, r)| (*t, r)).collect();
        for (key, versions) in &self.rows {
            if versions.windows(2).any(|w| w[0].0 >= w[1].0) {
                return Err("snapshot versions of a key are not in timestamp order".into());
            }
            for &(ts, writer, _, pending) in versions {
                let held =
                    records.get(&writer).is_some_and(|r| r.ts == ts && r.written.contains(key));
                if pending != held {
                    return Err(format!(
                        "snapshot version of {writer} at {} is inconsistent",
                        ts.0
                    ));
                }
            }
        }
        for record in records.values() {
            if record.hops.len() > PIECES_MAX || record.outputs.len() > PIECES_MAX {
                return Err("snapshot attempt has more hops or outputs than a plan".into());
            }
            if record.ran.keys().any(|&h| h == 0 || h as usize > record.hops.len()) {
                return Err("snapshot attempt ran a hop outside its chain".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::txn::{
        Args, Datum, KeySet, PartitionRule, Partitioner, PieceEffects, PieceSpec, Plan,
        PlanContext, ProcId, Reads, ShardTarget, UserAbort, Write,
    };

    /// One piece on shard 0: reads the ids of `args[0]`, writes `args[1]` = [(id, value)]; a
    /// value of `u64::MAX` asks for a user abort; `args[2]`, when given, = [start, end, limit]
    /// scans those ids. Its output is what it read, then how many rows the scan found.
    #[derive(Debug)]
    struct Rw;

    fn key(id: u64) -> Key {
        Key::table(1).u64(id).build()
    }

    fn ids(args: &Args) -> (Vec<u64>, Vec<(u64, u64)>) {
        let reads = args[0].as_list().unwrap().iter().filter_map(Datum::as_uint).collect();
        let writes = args[1]
            .as_list()
            .unwrap()
            .iter()
            .map(|p| {
                let p = p.as_list().unwrap();
                (p[0].as_uint().unwrap(), p[1].as_uint().unwrap())
            })
            .collect();
        (reads, writes)
    }

    impl Procedure for Rw {
        fn name(&self) -> &'static str {
            "rw"
        }
        fn plan(&self, _: &Args, _: PlanContext<'_>) -> Result<Plan, ProcError> {
            Ok(vec![PieceSpec { target: ShardTarget::Shard(ShardId(0)), deps: vec![] }])
        }
        fn keys(&self, _: u32, args: &Args, _: &[&PieceOutput]) -> Result<KeySet, ProcError> {
            let (reads, writes) = ids(args);
            Ok(KeySet {
                reads: reads.into_iter().map(key).collect(),
                writes: writes.into_iter().map(|(id, _)| key(id)).collect(),
                scans: scan_of(args).into_iter().collect(),
            })
        }
        fn execute(
            &self,
            _: u32,
            args: &Args,
            _: &[&PieceOutput],
            reads: &Reads,
        ) -> Result<PieceEffects, UserAbort> {
            let (_, writes) = ids(args);
            if writes.iter().any(|&(_, v)| v == u64::MAX) {
                return Err(UserAbort("asked".into()));
            }
            let read = |v: &Option<&[u8]>| {
                Datum::Uint(
                    v.as_ref().map_or(0, |b| u64::from_le_bytes(b[..8].try_into().unwrap())),
                )
            };
            let mut output: Vec<Datum> = reads.values.iter().map(read).collect();
            output.extend(reads.scans.iter().map(|rows| Datum::Uint(rows.len() as u64)));
            Ok(PieceEffects {
                writes: writes
                    .into_iter()
                    .map(|(id, v)| Write { key: key(id), value: Some(v.to_le_bytes().to_vec()) })
                    .collect(),
                output,
            })
        }
    }

    fn scan_of(args: &Args) -> Option<ScanRange> {
        let bounds: Vec<u64> = args.get(2)?.as_list()?.iter().filter_map(Datum::as_uint).collect();
        let &[start, end, limit] = bounds.as_slice() else { return None };
        Some(ScanRange { start: key(start), end: key(end), limit: limit as u32, reverse: false })
    }

    fn txn(seq: u64) -> TxnId {
        TxnId { origin: NodeId(1), incarnation: 0, seq }
    }

    struct Bench {
        server: Server,
        partitioner: Partitioner,
    }

    impl Bench {
        fn new() -> Self {
            Self::limited(64)
        }

        fn limited(ended_max: usize) -> Self {
            let mut server = Server::new(ShardId(0), 64, ended_max, 64);
            for id in 0..4 {
                server.store.load(key(id), 0u64.to_le_bytes().to_vec());
            }
            Self { server, partitioner: Partitioner::new(1, PartitionRule::Hash).unwrap() }
        }

        /// Runs hop 1 of attempt `seq` at `ts`: reads `reads`, writes `writes`.
        fn run(&mut self, seq: u64, ts: u64, reads: &[u64], writes: &[(u64, u64)]) -> HopRun {
            self.run_hop(seq, ts, 1, reads, writes)
        }

        fn run_hop(
            &mut self,
            seq: u64,
            ts: u64,
            hop: u32,
            reads: &[u64],
            writes: &[(u64, u64)],
        ) -> HopRun {
            let args = vec![
                Datum::List(reads.iter().map(|&r| Datum::Uint(r)).collect()),
                Datum::List(
                    writes
                        .iter()
                        .map(|&(k, v)| Datum::List(vec![Datum::Uint(k), Datum::Uint(v)]))
                        .collect(),
                ),
            ];
            self.run_args(seq, ts, hop, args)
        }

        fn run_args(&mut self, seq: u64, ts: u64, hop: u32, args: Args) -> HopRun {
            let request = TxnRequest { proc: ProcId(0), args };
            let hop_of = Hop { shard: ShardId(0), pieces: 0..1 };
            // Hop `hop` runs the one piece; earlier hops (none here) would be elsewhere.
            let mut hops = vec![Hop { shard: ShardId(1), pieces: 0..0 }; hop as usize - 1];
            hops.push(hop_of);
            self.server.run_hop(
                &Rw,
                &self.partitioner,
                (txn(seq), Timestamp(ts), NodeId(1)),
                &request,
                &hops,
                hop,
                Vec::new(),
            )
        }

        /// Runs hop `hop` of attempt `seq` at `ts`: writes `writes`, scans ids `[start, end)`
        /// up to `limit` rows.
        fn scan(
            &mut self,
            (seq, ts, hop): (u64, u64, u32),
            writes: &[(u64, u64)],
            (start, end, limit): (u64, u64, u64),
        ) -> HopRun {
            let bounds = [start, end, limit].map(Datum::Uint).to_vec();
            let args = vec![
                Datum::List(Vec::new()),
                Datum::List(
                    writes
                        .iter()
                        .map(|&(k, v)| Datum::List(vec![Datum::Uint(k), Datum::Uint(v)]))
                        .collect(),
                ),
                Datum::List(bounds),
            ];
            self.run_args(seq, ts, hop, args)
        }

        fn outputs(&self, seq: u64) -> Vec<PieceOutput> {
            self.server.records[&txn(seq)].outputs.clone()
        }
    }

    fn refused(run: HopRun) -> AbortCause {
        match run {
            HopRun::Abort(Why::Conflict { cause, .. }) => cause,
            other => panic!("expected a conflict, got {other:?}"),
        }
    }

    /// A scan sees the committed rows below its timestamp and its own pending writes, stamps
    /// its range against writes below it, and is refused past another attempt's pending
    /// version below it among the rows it examined (not beyond the row its limit stopped at).
    #[test]
    fn a_scan_reads_below_its_timestamp_stamps_its_range_and_waits_for_no_writer() {
        let mut bench = Bench::new();
        let found = |bench: &Bench, seq| bench.outputs(seq)[0].last().cloned();
        // Keys 0..4 are loaded.
        assert!(matches!(bench.scan((1, 100, 1), &[], (0, 10, 10)), HopRun::Ran));
        assert_eq!(found(&bench, 1), Some(Datum::Uint(4)));
        // Below the scan, inside its range: refused; above it: a pending version.
        assert_eq!(refused(bench.run(2, 50, &[], &[(6, 1)])), AbortCause::TimestampTooOld);
        bench.server.abort(txn(2), Timestamp(50));
        assert!(matches!(bench.run(3, 150, &[], &[(7, 1)]), HopRun::Ran));
        // A scan above that pending version may not run past it; one below does not see it.
        assert_eq!(refused(bench.scan((4, 200, 1), &[], (0, 10, 10))), AbortCause::LockDenied);
        bench.server.abort(txn(4), Timestamp(200));
        assert!(matches!(bench.scan((5, 120, 1), &[], (0, 10, 10)), HopRun::Ran));
        assert_eq!(found(&bench, 5), Some(Datum::Uint(4)));
        // Its own writes of an earlier hop are rows too.
        bench.server.commit(txn(3));
        assert!(matches!(bench.run(6, 300, &[], &[(9, 1)]), HopRun::Ran));
        assert!(matches!(bench.scan((6, 300, 2), &[], (0, 10, 10)), HopRun::Ran));
        assert_eq!(found(&bench, 6), Some(Datum::Uint(6)), "0..4, 7 committed, its own 9");
        // Another writer's pending version past where the limit stopped does not matter.
        assert!(matches!(bench.scan((7, 400, 1), &[], (0, 10, 2)), HopRun::Ran));
        assert_eq!(found(&bench, 7), Some(Datum::Uint(2)));
        assert_eq!(refused(bench.scan((8, 400, 1), &[], (0, 10, 10))), AbortCause::LockDenied);
    }

    #[test]
    fn a_write_below_a_newer_read_is_refused_and_one_above_it_is_taken() {
        let mut bench = Bench::new();
        assert!(matches!(bench.run(1, 100, &[0], &[]), HopRun::Ran));
        assert_eq!(refused(bench.run(2, 50, &[], &[(0, 7)])), AbortCause::TimestampTooOld);
        bench.server.abort(txn(2), Timestamp(50));
        assert!(matches!(bench.run(3, 150, &[], &[(0, 7)]), HopRun::Ran));
    }

    #[test]
    fn a_second_writer_of_a_pending_key_is_denied_and_a_newer_version_refuses_older_writers() {
        let mut bench = Bench::new();
        assert!(matches!(bench.run(1, 100, &[], &[(1, 5)]), HopRun::Ran));
        assert_eq!(refused(bench.run(2, 200, &[], &[(1, 6)])), AbortCause::LockDenied);
        bench.server.abort(txn(2), Timestamp(200));
        bench.server.commit(txn(1));
        assert_eq!(refused(bench.run(3, 90, &[], &[(1, 6)])), AbortCause::TimestampTooOld);
    }

    #[test]
    fn reading_a_pending_version_waits_for_its_writer_and_aborts_with_it() {
        let mut bench = Bench::new();
        assert!(matches!(bench.run(1, 100, &[], &[(2, 9)]), HopRun::Ran));
        assert!(matches!(bench.run(2, 200, &[2], &[]), HopRun::Ran));
        assert_eq!(bench.outputs(2), vec![vec![Datum::Uint(9)]], "it read the pending value");
        assert!(bench.server.records[&txn(2)].waits_on.contains(&txn(1)));
        // A reader below the pending version does not see it, and does not wait.
        assert!(matches!(bench.run(3, 50, &[2], &[]), HopRun::Ran));
        assert_eq!(bench.outputs(3), vec![vec![Datum::Uint(0)]]);
        assert!(bench.server.records[&txn(3)].waits_on.is_empty());
        assert_eq!(bench.server.abort(txn(1), Timestamp(100)), vec![txn(2)], "cascade");
        assert!(bench.server.store.versions(&key(2)).iter().all(|v| v.writer != txn(1)));

        let mut bench = Bench::new();
        assert!(matches!(bench.run(1, 100, &[], &[(2, 9)]), HopRun::Ran));
        assert!(matches!(bench.run(2, 200, &[2], &[]), HopRun::Ran));
        assert_eq!(bench.server.commit(txn(1)), vec![txn(2)], "freed");
        assert!(bench.server.records[&txn(2)].waits_on.is_empty());
    }

    #[test]
    fn a_later_hop_on_the_same_shard_reads_the_attempts_own_write() {
        let mut bench = Bench::new();
        assert!(matches!(bench.run_hop(1, 100, 1, &[], &[(3, 4)]), HopRun::Ran));
        assert!(matches!(bench.run_hop(1, 100, 3, &[3], &[(3, 8)]), HopRun::Ran));
        assert_eq!(bench.outputs(1), vec![vec![Datum::Uint(4)]]);
        assert!(bench.server.records[&txn(1)].waits_on.is_empty(), "no wait on itself");
        bench.server.commit(txn(1));
        let newest = bench.server.store.read_latest(&key(3)).unwrap();
        assert_eq!(newest.value, Some(8u64.to_le_bytes().to_vec()), "the later write won");
    }

    #[test]
    fn below_the_collection_watermark_an_attempt_is_refused() {
        let mut bench = Bench::new();
        bench.server.collect_below(Timestamp(1_000));
        assert_eq!(refused(bench.run(1, 900, &[0], &[])), AbortCause::TimestampTooOld);
        assert!(matches!(bench.run(2, 1_100, &[0], &[]), HopRun::Ran));
        // An undecided attempt holds the watermark below its timestamp.
        bench.server.collect_below(Timestamp(5_000));
        assert!(bench.server.store.gc_watermark() < Timestamp(1_100));
    }

    #[test]
    fn a_restarted_coordinator_may_not_reuse_its_previous_incarnations_timestamps() {
        let mut bench = Bench::new();
        let at = |incarnation: u64, seq: u64| TxnId { origin: NodeId(1), incarnation, seq };
        assert_eq!(bench.server.admit_ts(at(0, 0), Timestamp(500)), Ok(()));
        assert_eq!(bench.server.admit_ts(at(0, 1), Timestamp(300)), Ok(()), "same incarnation");
        assert_eq!(bench.server.admit_ts(at(1, 0), Timestamp(500)), Err(Timestamp(500)));
        assert_eq!(bench.server.admit_ts(at(1, 1), Timestamp(501)), Ok(()));
        assert_eq!(bench.server.admit_ts(at(0, 2), Timestamp(900)), Err(Timestamp(501)), "older");
        let other = TxnId { origin: NodeId(2), incarnation: 0, seq: 0 };
        assert_eq!(bench.server.admit_ts(other, Timestamp(10)), Ok(()), "per coordinator");
    }

    #[test]
    fn a_user_abort_is_reported_as_such_and_forgotten_decisions_raise_the_floor() {
        let mut bench = Bench::limited(2);
        assert!(matches!(bench.run(1, 100, &[], &[(0, u64::MAX)]), HopRun::Abort(Why::User(_))));
        bench.server.abort(txn(1), Timestamp(100));
        assert_eq!(bench.server.ended(txn(1)), Some(Ended::Aborted));
        assert!(!bench.server.maybe_forgotten(txn(4), Timestamp(100)));
        bench.server.abort(txn(2), Timestamp(300));
        bench.server.abort(txn(3), Timestamp(200));
        assert_eq!(bench.server.ended(txn(1)), None, "forgotten beyond the limit");
        assert!(bench.server.maybe_forgotten(txn(4), Timestamp(100)));
        assert!(!bench.server.maybe_forgotten(txn(4), Timestamp(101)));
        let elsewhere = TxnId { origin: NodeId(5), incarnation: 0, seq: 0 };
        assert!(!bench.server.maybe_forgotten(elsewhere, Timestamp(50)), "per coordinator");
    }
}
