//! The transaction model shared by every protocol (docs/architecture.md, "Transaction model").
//!
//! A [`Procedure`] is registered, deterministic code known to every node by its [`ProcId`]. For
//! given arguments it has a [`Plan`]: a list of pieces, each bound to one shard (or to any shard,
//! for tables replicated on every shard) and each naming the earlier pieces whose outputs it
//! needs. A piece declares the keys it reads, writes and scans ([`KeySet`]) from the arguments
//! and those outputs, then turns the values read into writes and an output, or asks for a user
//! abort. Protocols run the same pieces in their own way; a protocol that cannot run a plan says
//! why with [`ProcError::Unsupported`].
//!
//! Contract for procedure authors (checked by protocols, which fail the transaction otherwise):
//! - `plan` lists pieces in dependency order: a piece depends only on pieces before it.
//! - Every key of a piece belongs to the piece's shard under the run's [`Partitioner`], or to a
//!   replicated table (reads only: replicated tables are read-only while transactions run).
//! - `execute` writes only keys its `keys` declared as writes, and is a pure function of its
//!   inputs.

use crate::error::ConfigError;
use crate::ids::ShardId;
use crate::key::{Key, Value};
use crate::rng::{fnv1a, FNV_OFFSET};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

/// Most pieces one plan may have.
pub const PIECES_MAX: usize = 64;
/// Most keys one piece may read plus write.
pub const PIECE_KEYS_MAX: usize = 4_096;
/// Most rows one scan may return.
pub const SCAN_ROWS_MAX: u32 = 10_000;

/// Deepest nesting of [`Datum::List`]s a decoder accepts (a list of lists of scalars is depth
/// 2). Decoding is recursive, so without a bound one hostile frame of nested lists would
/// overflow the stack of the task decoding it.
pub const DATUM_DEPTH_MAX: u32 = 4;

/// An argument or output value. Its `Deserialize` refuses nesting deeper than
/// [`DATUM_DEPTH_MAX`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Datum {
    /// A signed integer (money in cents, counts).
    Int(i64),
    /// An unsigned integer (ids).
    Uint(u64),
    /// Raw bytes (keys, strings, values).
    Bytes(Vec<u8>),
    /// A list of data.
    List(Vec<Datum>),
}

impl Datum {
    /// The unsigned integer, if this is one.
    pub fn as_uint(&self) -> Option<u64> {
        match self {
            Self::Uint(v) => Some(*v),
            _ => None,
        }
    }

    /// The signed integer, if this is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Self::Int(v) => Some(*v),
            _ => None,
        }
    }

    /// The bytes, if this is a byte string.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Self::Bytes(v) => Some(v),
            _ => None,
        }
    }

    /// The list, if this is one.
    pub fn as_list(&self) -> Option<&[Datum]> {
        match self {
            Self::List(v) => Some(v),
            _ => None,
        }
    }
}

/// Bounded-depth decoding of [`Datum`]: the same encoding serde's derive gives (variant index
/// or name, then the content), with the list depth counted on the way down.
mod datum_serde {
    use super::{Datum, DATUM_DEPTH_MAX};
    use serde::de::{self, DeserializeSeed, EnumAccess, SeqAccess, VariantAccess, Visitor};
    use serde::{Deserialize, Deserializer};
    use std::fmt;

    const VARIANTS: &[&str] = &["Int", "Uint", "Bytes", "List"];

    enum Variant {
        Int,
        Uint,
        Bytes,
        List,
    }

    impl<'de> Deserialize<'de> for Variant {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct VariantVisitor;
            impl Visitor<'_> for VariantVisitor {
                type Value = Variant;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a Datum variant")
                }
                fn visit_u64<E: de::Error>(self, index: u64) -> Result<Variant, E> {
                    match index {
                        0 => Ok(Variant::Int),
                        1 => Ok(Variant::Uint),
                        2 => Ok(Variant::Bytes),
                        3 => Ok(Variant::List),
                        _ => Err(E::invalid_value(de::Unexpected::Unsigned(index), &self)),
                    }
                }
                fn visit_str<E: de::Error>(self, name: &str) -> Result<Variant, E> {
                    match name {
                        "Int" => Ok(Variant::Int),
                        "Uint" => Ok(Variant::Uint),
                        "Bytes" => Ok(Variant::Bytes),
                        "List" => Ok(Variant::List),
                        _ => Err(E::unknown_variant(name, VARIANTS)),
                    }
                }
            }
            deserializer.deserialize_identifier(VariantVisitor)
        }
    }

    /// A datum at list depth `depth`.
    struct DatumSeed {
        depth: u32,
    }

    impl<'de> DeserializeSeed<'de> for DatumSeed {
        type Value = Datum;
        fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Datum, D::Error> {
            deserializer.deserialize_enum("Datum", VARIANTS, self)
        }
    }

    impl<'de> Visitor<'de> for DatumSeed {
        type Value = Datum;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a Datum")
        }
        fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Datum, A::Error> {
            let (variant, content) = data.variant::<Variant>()?;
            match variant {
                Variant::Int => content.newtype_variant().map(Datum::Int),
                Variant::Uint => content.newtype_variant().map(Datum::Uint),
                Variant::Bytes => content.newtype_variant().map(Datum::Bytes),
                Variant::List if self.depth >= DATUM_DEPTH_MAX => Err(de::Error::custom(
                    format_args!("lists nested deeper than {DATUM_DEPTH_MAX}"),
                )),
                Variant::List => content
                    .newtype_variant_seed(ListSeed { depth: self.depth + 1 })
                    .map(Datum::List),
            }
        }
    }

    /// The items of a list at depth `depth`.
    struct ListSeed {
        depth: u32,
    }

    impl<'de> DeserializeSeed<'de> for ListSeed {
        type Value = Vec<Datum>;
        fn deserialize<D: Deserializer<'de>>(
            self,
            deserializer: D,
        ) -> Result<Vec<Datum>, D::Error> {
            deserializer.deserialize_seq(self)
        }
    }

    impl<'de> Visitor<'de> for ListSeed {
        type Value = Vec<Datum>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of Datum")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Datum>, A::Error> {
            // The announced length is not trusted for the allocation: a short frame may claim
            // any count.
            let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
            while let Some(item) = seq.next_element_seed(DatumSeed { depth: self.depth })? {
                items.push(item);
            }
            Ok(items)
        }
    }

    impl<'de> Deserialize<'de> for Datum {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            DatumSeed { depth: 0 }.deserialize(deserializer)
        }
    }
}

/// The arguments of one transaction.
pub type Args = Vec<Datum>;
/// The output of one piece.
pub type PieceOutput = Vec<Datum>;

/// Registered procedure number: its index in the [`Registry`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ProcId(pub u32);

impl ProcId {
    /// The built-in procedure of interactive transactions' reads ([`SessionReads`]), known to
    /// every registry without being registered.
    pub const SESSION_READS: ProcId = ProcId(u32::MAX);
}

/// The reads of one interactive-transaction step on one shard, as a procedure, so that every
/// protocol serves them through the same execution path (and validation, locks or read
/// timestamps) as any piece. One piece; `args[0]` lists the keys read (bytes), `args[1]` the
/// scans (each `[start, end, limit, reverse]`), `args[2]` keys declared as written (so that
/// `2pl` takes their exclusive locks before a commit; the piece writes nothing itself). Its output is `[values, scans]` in the shape
/// of [`crate::node::read_outputs`]. Never planned: coordinators build its calls directly,
/// with the step's number as the piece index (so a late reply of an earlier step is told
/// apart).
#[derive(Debug)]
pub struct SessionReads;

static SESSION_READS: std::sync::LazyLock<Arc<dyn Procedure>> =
    std::sync::LazyLock::new(|| Arc::new(SessionReads));

impl SessionReads {
    /// The arguments that read `keys`, scan `scans` and lock `writes` for writing.
    pub fn args(keys: &[Key], scans: &[ScanRange], writes: &[Key]) -> Args {
        let list = |keys: &[Key]| {
            Datum::List(keys.iter().map(|k| Datum::Bytes(k.as_bytes().to_vec())).collect())
        };
        let scans = scans
            .iter()
            .map(|r| {
                Datum::List(vec![
                    Datum::Bytes(r.start.as_bytes().to_vec()),
                    Datum::Bytes(r.end.as_bytes().to_vec()),
                    Datum::Uint(u64::from(r.limit)),
                    Datum::Uint(u64::from(r.reverse)),
                ])
            })
            .collect();
        vec![list(keys), Datum::List(scans), list(writes)]
    }

    #[allow(clippy::type_complexity)]
    fn parse(args: &Args) -> Result<(Vec<Key>, Vec<ScanRange>, Vec<Key>), ProcError> {
        let bad = |what: &str| ProcError::BadArgs(format!("session reads: {what}"));
        let [keys, scans, writes] = args.as_slice() else {
            return Err(bad("three arguments expected"));
        };
        let keys_of = |list: &Datum| {
            list.as_list()
                .ok_or_else(|| bad("keys are not a list"))?
                .iter()
                .map(|k| {
                    k.as_bytes()
                        .map(|b| Key::from(b.to_vec()))
                        .ok_or_else(|| bad("a key is not bytes"))
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let (keys, writes) = (keys_of(keys)?, keys_of(writes)?);
        let scans = scans
            .as_list()
            .ok_or_else(|| bad("scans are not a list"))?
            .iter()
            .map(|scan| match scan.as_list() {
                Some([start, end, limit, reverse]) => {
                    let start =
                        Key::from(start.as_bytes().ok_or_else(|| bad("scan start"))?.to_vec());
                    let end = Key::from(end.as_bytes().ok_or_else(|| bad("scan end"))?.to_vec());
                    let limit = limit
                        .as_uint()
                        .and_then(|l| u32::try_from(l).ok())
                        .ok_or_else(|| bad("scan limit"))?;
                    if start > end {
                        return Err(bad("a scan's range is reversed (start after end)"));
                    }
                    Ok(ScanRange { start, end, limit, reverse: reverse.as_uint() == Some(1) })
                }
                _ => Err(bad("a scan is not [start, end, limit, reverse]")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((keys, scans, writes))
    }
}

impl Procedure for SessionReads {
    fn name(&self) -> &'static str {
        "session-reads"
    }

    fn plan(&self, _args: &Args, _context: PlanContext<'_>) -> Result<Plan, ProcError> {
        Err(ProcError::Unsupported(
            "session reads are steps of an interactive transaction, not a procedure to run".into(),
        ))
    }

    /// Any piece index is this one piece: coordinators number a session's steps with it.
    fn keys(
        &self,
        _piece: u32,
        args: &Args,
        _inputs: &[&PieceOutput],
    ) -> Result<KeySet, ProcError> {
        let (reads, scans, writes) = Self::parse(args)?;
        Ok(KeySet { reads, writes, scans })
    }

    fn execute(
        &self,
        _piece: u32,
        _args: &Args,
        _inputs: &[&PieceOutput],
        reads: &Reads<'_>,
    ) -> Result<PieceEffects, UserAbort> {
        // `[values, scans]`, each as one list (the coordinator merges shards' answers).
        let values = reads.values.iter().map(|v| v.map(<[u8]>::to_vec)).collect();
        let output =
            read_outputs(values, reads.scans.clone()).into_iter().map(Datum::List).collect();
        Ok(PieceEffects { writes: Vec::new(), output })
    }
}

/// What a client asks a coordinator to run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnRequest {
    /// The procedure.
    pub proc: ProcId,
    /// Its arguments.
    pub args: Args,
}

/// Where a piece runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ShardTarget {
    /// On this shard.
    Shard(ShardId),
    /// On any shard: the piece only reads tables replicated on every shard.
    Any,
}

/// One piece of a plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PieceSpec {
    /// Where it runs.
    pub target: ShardTarget,
    /// Earlier pieces whose outputs it needs, in the order `keys` and `execute` receive them.
    pub deps: Vec<u32>,
}

/// The pieces of one transaction, in dependency order.
pub type Plan = Vec<PieceSpec>;

/// True when no piece needs another piece's output: every key is known from the arguments.
pub fn is_one_shot(plan: &Plan) -> bool {
    plan.iter().all(|piece| piece.deps.is_empty())
}

/// A half-open key range `[start, end)` read in key order, at most `limit` rows.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ScanRange {
    /// First key included.
    pub start: Key,
    /// First key excluded.
    pub end: Key,
    /// Most rows returned.
    pub limit: u32,
    /// Newest first when true.
    pub reverse: bool,
}

/// The keys a piece touches.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeySet {
    /// Keys read; their values reach `execute` in this order.
    pub reads: Vec<Key>,
    /// Keys the piece may write.
    pub writes: Vec<Key>,
    /// Ranges scanned; their rows reach `execute` in this order.
    pub scans: Vec<ScanRange>,
}

/// What a piece read. Point reads borrow the values where they lie (the store, or the
/// attempt's own earlier writes): a piece often only looks at part of a value, and copying a
/// kilobyte record per read was the largest cost of running a piece.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reads<'a> {
    /// One entry per `KeySet::reads` key; `None` when absent.
    pub values: Vec<Option<&'a [u8]>>,
    /// One entry per `KeySet::scans` range: the rows found.
    pub scans: Vec<Vec<(Key, Value)>>,
}

/// One write: a new value, or a delete when `value` is `None`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Write {
    /// The key.
    pub key: Key,
    /// The new value; `None` deletes.
    pub value: Option<Value>,
}

/// What a piece produced.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PieceEffects {
    /// Writes, each to a declared write key.
    pub writes: Vec<Write>,
    /// Output for later pieces and for the client.
    pub output: PieceOutput,
}

/// A piece asked to abort the transaction. An outcome, never retried.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserAbort(pub String);

/// Why a procedure could not be planned or run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProcError {
    /// The arguments do not fit the procedure.
    BadArgs(String),
    /// This protocol cannot run this procedure; the text says why and what to do instead.
    Unsupported(String),
    /// The procedure broke its contract (a key on the wrong shard, an undeclared write).
    Contract(String),
}

impl fmt::Display for ProcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadArgs(m) => write!(f, "bad arguments: {m}"),
            Self::Unsupported(m) => write!(f, "unsupported: {m}"),
            Self::Contract(m) => write!(f, "procedure contract broken: {m}"),
        }
    }
}

/// Context for planning: how many shards and how keys map to them.
#[derive(Clone, Copy, Debug)]
pub struct PlanContext<'a> {
    /// The run's partitioner.
    pub partitioner: &'a Partitioner,
}

/// Registered transaction code. Implementations must be deterministic.
pub trait Procedure: Send + Sync + fmt::Debug {
    /// The registered name.
    fn name(&self) -> &'static str;
    /// The pieces for these arguments.
    fn plan(&self, args: &Args, context: PlanContext<'_>) -> Result<Plan, ProcError>;
    /// The keys piece `piece` touches, given the outputs of its `deps` in order.
    fn keys(&self, piece: u32, args: &Args, inputs: &[&PieceOutput]) -> Result<KeySet, ProcError>;
    /// Runs piece `piece` over what it read.
    fn execute(
        &self,
        piece: u32,
        args: &Args,
        inputs: &[&PieceOutput],
        reads: &Reads<'_>,
    ) -> Result<PieceEffects, UserAbort>;
    /// For a piece whose keys need its inputs (an order row keyed by the order number the
    /// district row handed out): keys known from the arguments, on the piece's shard, that a
    /// protocol ordering transactions by their keys before running them (tiga, luigi) treats
    /// the transaction as writing, in place of the piece's own keys. The promise, over the
    /// transactions such a protocol can run (no scans; every key known from the arguments or
    /// guarded): one that writes a key this piece may touch, with any inputs, also writes one
    /// of these keys, and one that reads such a key reads or writes one of them. Writers of
    /// the piece's keys are then ordered among themselves through the guard, and each reader
    /// after every earlier writer, as they would be on the keys themselves. `None` (the
    /// default): no such keys, and those protocols refuse the piece.
    fn guard(&self, _piece: u32, _args: &Args) -> Option<Vec<Key>> {
        None
    }
}

/// The procedures of a run, identical on every node. Its fingerprint lets two processes check
/// that they agree before exchanging transactions.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    procs: Vec<Arc<dyn Procedure>>,
}

impl Registry {
    /// Registers a procedure and returns its id.
    pub fn register(&mut self, procedure: Arc<dyn Procedure>) -> ProcId {
        let id = ProcId(u32::try_from(self.procs.len()).expect("fewer than 2^32 procedures"));
        self.procs.push(procedure);
        id
    }

    /// The procedure with this id ([`ProcId::SESSION_READS`] is built in everywhere).
    pub fn get(&self, id: ProcId) -> Option<&Arc<dyn Procedure>> {
        if id == ProcId::SESSION_READS {
            return Some(&SESSION_READS);
        }
        self.procs.get(id.0 as usize)
    }

    /// The id of the procedure with this name.
    pub fn find(&self, name: &str) -> Option<ProcId> {
        self.procs.iter().position(|p| p.name() == name).map(|i| ProcId(i as u32))
    }

    /// How many procedures are registered.
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// True when none is registered.
    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// A hash of the registered names in order.
    pub fn fingerprint(&self) -> u64 {
        self.procs.iter().fold(FNV_OFFSET, |hash, p| fnv1a(fnv1a(hash, p.name().as_bytes()), &[0]))
    }
}

/// How keys map to shards.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PartitionRule {
    /// FNV-1a of the whole key, modulo the shard count.
    Hash,
    /// By the first component after the table byte, read as a big-endian `u64`:
    /// `shard = (value - base) / per_shard`, clamped to the last shard. TPC-C's by-warehouse
    /// placement is `base = 1, per_shard = warehouses per shard`.
    LeadingInt {
        /// The value that maps to the start of shard 0.
        base: u64,
        /// How many consecutive values each shard holds.
        per_shard: u64,
    },
}

/// Maps keys to shards; tables listed as replicated are present on every shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partitioner {
    shards: u32,
    rule: PartitionRule,
    replicated_tables: BTreeSet<u8>,
}

impl Partitioner {
    /// A partitioner over `shards` shards.
    pub fn new(shards: u32, rule: PartitionRule) -> Result<Self, ConfigError> {
        if shards == 0 {
            return Err(ConfigError::new("shards must be at least 1"));
        }
        if let PartitionRule::LeadingInt { per_shard: 0, .. } = rule {
            return Err(ConfigError::new("per_shard must be at least 1"));
        }
        Ok(Self { shards, rule, replicated_tables: BTreeSet::new() })
    }

    /// Marks `table` as replicated on every shard.
    pub fn with_replicated_table(mut self, table: u8) -> Self {
        self.replicated_tables.insert(table);
        self
    }

    /// The number of shards.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// Where `key` lives.
    pub fn target_of(&self, key: &Key) -> ShardTarget {
        match key.table_id() {
            Some(table) if self.replicated_tables.contains(&table) => ShardTarget::Any,
            _ => ShardTarget::Shard(self.shard_of(key)),
        }
    }

    /// The shard holding `key`, ignoring replication of its table.
    pub fn shard_of(&self, key: &Key) -> ShardId {
        let shard = match self.rule {
            PartitionRule::Hash => fnv1a(FNV_OFFSET, key.as_bytes()) % u64::from(self.shards),
            PartitionRule::LeadingInt { base, per_shard } => match key.reader().u64() {
                Ok(value) => {
                    (value.saturating_sub(base) / per_shard).min(u64::from(self.shards) - 1)
                }
                // Keys too short for the rule fall back to hashing, so every key has a home.
                Err(_) => fnv1a(FNV_OFFSET, key.as_bytes()) % u64::from(self.shards),
            },
        };
        ShardId(shard as u32)
    }

    /// True when `key` may be touched by a piece on `shard`.
    pub fn allows(&self, shard: ShardId, key: &Key) -> bool {
        match self.target_of(key) {
            ShardTarget::Any => true,
            ShardTarget::Shard(home) => home == shard,
        }
    }
}

/// How one client request ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnResult {
    /// Committed durably (as durably as the protocol and mode promise).
    Committed,
    /// A piece asked to abort. Not retried.
    UserAborted(String),
    /// Did not commit and will not: the reason says why.
    Failed(TxnFailure),
}

/// Why a request failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnFailure {
    /// The procedure cannot run under this protocol, or broke its contract.
    Procedure(ProcError),
    /// Aborted by conflicts more often than the retry limit allows.
    RetriesExhausted,
    /// The node is not a coordinator, or has too many transactions in flight.
    Rejected(String),
    /// The outcome is unknown: the transaction may or may not have committed (a participant
    /// decided it and has forgotten it since, while the coordinator could not learn which).
    /// Never retried: retrying could commit it twice.
    Indeterminate(String),
    /// An interactive transaction was aborted by the protocol for this cause (it is over and
    /// did not commit; its client may run it again). One-shot requests are retried instead.
    Aborted(AbortCause),
}

impl fmt::Display for TxnFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Procedure(error) => write!(f, "{error}"),
            Self::RetriesExhausted => f.write_str("aborted by conflicts more often than allowed"),
            Self::Rejected(why) => write!(f, "rejected: {why}"),
            Self::Indeterminate(why) => write!(f, "outcome unknown: {why}"),
            Self::Aborted(cause) => write!(f, "aborted ({})", cause.name()),
        }
    }
}

impl TxnResult {
    /// True when the request certainly did not commit (a user abort or a failure other than
    /// an unknown outcome).
    pub fn certainly_not_committed(&self) -> bool {
        match self {
            Self::Committed => false,
            Self::UserAborted(_) => true,
            Self::Failed(failure) => !matches!(failure, TxnFailure::Indeterminate(_)),
        }
    }
}

/// How a committed transaction committed, as its protocol names it (reports count each).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum CommitPath {
    /// Not committed, or the protocol does not say.
    #[default]
    None,
    /// Nothing to read or write: committed without messages.
    Empty,
    /// Executed and committed at one shard in one round (`occ`'s single-shard shortcut).
    OneRound,
    /// Validated and committed at the only participant (one-phase commit).
    OnePhase,
    /// Two-phase commit across participants.
    TwoPhase,
    /// A fast path: one round with a super quorum of matching replies (Tiga).
    Fast,
    /// A slow path: the fast path failed and a second round was needed.
    Slow,
    /// Down a chain of hops, each voting as it passes the decision on (CrossStitch's
    /// pipelined commit).
    Chain,
    /// A read-only transaction served from a timestamped snapshot (tiga's snapshot reads:
    /// serializable, not strict).
    Snapshot,
}

impl CommitPath {
    /// The name reports use.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Empty => "empty",
            Self::OneRound => "one-round",
            Self::OnePhase => "one-phase",
            Self::TwoPhase => "two-phase",
            Self::Fast => "fast",
            Self::Slow => "slow",
            Self::Chain => "chain",
            Self::Snapshot => "snapshot",
        }
    }
}

/// Why an attempt was aborted and retried. Protocols map their own refusals onto these, so
/// that reports can compare protocols cause by cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AbortCause {
    /// A read or scan was no longer current at validation, or two pieces saw different
    /// versions of one key (`occ`).
    Validation,
    /// A conflicting lock was held: a prepared attempt's (`occ`), or any other attempt's
    /// under `2pl` no-wait.
    LockDenied,
    /// An older attempt wounded this one (`2pl` wound-wait).
    Wounded,
    /// Its locks were released after it stayed idle for the lease (`2pl`).
    LeaseExpired,
    /// A newer transaction had already read or written past its timestamp (timestamp
    /// ordering).
    TimestampTooOld,
    /// It read a version whose writer aborted (multi-version timestamp ordering).
    Cascading,
    /// A participant had no room for another undecided attempt.
    Busy,
    /// A participant or the coordinator gave up waiting for an answer.
    Timeout,
    /// A participant had already aborted the attempt (termination decided first).
    AlreadyAborted,
    /// A database peer reported a serialization failure (PostgreSQL's SQLSTATE 40001).
    Serialization,
    /// A database peer broke a deadlock by aborting this transaction (SQLSTATE 40P01).
    Deadlock,
    /// A participant refused it because the epoch changed under it (`mako`: a leader changed
    /// somewhere, and attempts of the closing epoch prepare no more).
    EpochChanged,
    /// Its speculative commit was discarded by a failover before it became durable (`mako`);
    /// the client never heard of it.
    Discarded,
}

impl AbortCause {
    /// Every cause, in report order.
    pub const ALL: [Self; 13] = [
        Self::Validation,
        Self::LockDenied,
        Self::Wounded,
        Self::LeaseExpired,
        Self::TimestampTooOld,
        Self::Cascading,
        Self::Busy,
        Self::Timeout,
        Self::AlreadyAborted,
        Self::Serialization,
        Self::Deadlock,
        Self::EpochChanged,
        Self::Discarded,
    ];

    /// The name reports use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Validation => "validation",
            Self::LockDenied => "lock-denied",
            Self::Wounded => "wounded",
            Self::LeaseExpired => "lease-expired",
            Self::TimestampTooOld => "timestamp-too-old",
            Self::Cascading => "cascading",
            Self::Busy => "busy",
            Self::Timeout => "timeout",
            Self::AlreadyAborted => "already-aborted",
            Self::Serialization => "serialization",
            Self::Deadlock => "deadlock",
            Self::EpochChanged => "epoch-changed",
            Self::Discarded => "discarded",
        }
    }
}

/// Aborted attempts of one request, counted by cause (`AbortCause::ALL` order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbortCounts([u32; AbortCause::ALL.len()]);

impl AbortCounts {
    /// Counts one more abort of `cause`.
    pub fn add(&mut self, cause: AbortCause) {
        let slot = &mut self.0[cause as usize];
        *slot = slot.saturating_add(1);
    }

    /// Aborts of `cause`.
    pub fn get(self, cause: AbortCause) -> u32 {
        self.0[cause as usize]
    }

    /// Aborts of every cause.
    pub fn total(self) -> u64 {
        self.0.iter().map(|&n| u64::from(n)).sum()
    }

    /// The causes with at least one abort, with their counts.
    pub fn nonzero(self) -> impl Iterator<Item = (AbortCause, u32)> {
        AbortCause::ALL.into_iter().map(move |c| (c, self.get(c))).filter(|&(_, n)| n > 0)
    }
}

/// The reply to one client request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnOutcome {
    /// How it ended.
    pub result: TxnResult,
    /// Outputs of the pieces, in plan order. Empty unless committed, and also empty for a
    /// commit whose outputs the coordinator no longer has (an `occ` one-round commit whose
    /// reply was lost and whose outcome it had to ask for).
    pub outputs: Vec<PieceOutput>,
    /// The commit timestamp, when committed.
    pub commit_ts: Option<crate::time::Timestamp>,
    /// Attempts aborted by conflicts (or timeouts) before the last one.
    pub retries: u32,
    /// The same attempts by cause (their total is `retries`).
    pub aborts: AbortCounts,
    /// Shards the final attempt touched.
    pub shards_touched: u32,
    /// How it committed.
    pub path: CommitPath,
    /// For protocols that acknowledge speculatively: nanoseconds (coordinator clock) from the
    /// submission to the speculative commit. The reply itself is always the durable outcome.
    pub speculative_ns: Option<u64>,
}

impl TxnOutcome {
    /// A failure before any attempt ran.
    pub fn failed(failure: TxnFailure) -> Self {
        Self {
            result: TxnResult::Failed(failure),
            outputs: Vec::new(),
            commit_ts: None,
            retries: 0,
            aborts: AbortCounts::default(),
            shards_touched: 0,
            path: CommitPath::None,
            speculative_ns: None,
        }
    }
}

/// What a protocol sees of a workload before a run, to check that it can run the workload's
/// transactions: its procedures, how its keys map to shards, and a sample of the requests its
/// clients would submit (protocols depend on this, not on the workloads crate).
#[derive(Clone, Debug)]
pub struct WorkloadSample {
    /// The workload's name, for errors.
    pub name: String,
    /// Its procedures.
    pub registry: Arc<Registry>,
    /// How its keys map to shards.
    pub partitioner: Arc<Partitioner>,
    /// Requests its clients would submit first.
    pub requests: Vec<TxnRequest>,
}

/// The outputs of a `Read` step: `outputs[0]` has one datum per key read (an empty list when
/// absent, a one-item list holding the value's bytes when present), `outputs[1]` one datum
/// per scan (a list of `[key, value]` pairs in scan order).
pub fn read_outputs(values: Vec<Option<Value>>, rows: Vec<Vec<(Key, Value)>>) -> Vec<PieceOutput> {
    let values = values
        .into_iter()
        .map(|v| Datum::List(v.map(Datum::Bytes).into_iter().collect()))
        .collect();
    let rows = rows
        .into_iter()
        .map(|scan| {
            Datum::List(
                scan.into_iter()
                    .map(|(k, v)| Datum::List(vec![Datum::Bytes(k.into_bytes()), Datum::Bytes(v)]))
                    .collect(),
            )
        })
        .collect();
    vec![values, rows]
}

/// What a reply built by [`read_outputs`] holds: the values, then the rows of each scan.
/// `None` when the outputs do not have that shape.
#[allow(clippy::type_complexity)]
pub fn parse_read_outputs(
    outputs: &[PieceOutput],
) -> Option<(Vec<Option<Value>>, Vec<Vec<(Key, Value)>>)> {
    let [values, scans] = outputs else { return None };
    let values = values
        .iter()
        .map(|d| match d.as_list()? {
            [] => Some(None),
            [v] => Some(Some(v.as_bytes()?.to_vec())),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    let scans = scans
        .iter()
        .map(|scan| {
            scan.as_list()?
                .iter()
                .map(|row| match row.as_list()? {
                    [k, v] => Some((Key::from(k.as_bytes()?.to_vec()), v.as_bytes()?.to_vec())),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
        })
        .collect::<Option<Vec<_>>>()?;
    Some((values, scans))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_int_partitioner_places_ranges() {
        let p = Partitioner::new(2, PartitionRule::LeadingInt { base: 1, per_shard: 10 }).unwrap();
        let key = |w: u64| Key::table(5).u64(w).u64(3).build();
        assert_eq!(p.shard_of(&key(1)), ShardId(0));
        assert_eq!(p.shard_of(&key(10)), ShardId(0));
        assert_eq!(p.shard_of(&key(11)), ShardId(1));
        assert_eq!(p.shard_of(&key(500)), ShardId(1), "clamped to the last shard");
        let p = p.with_replicated_table(9);
        assert_eq!(p.target_of(&Key::table(9).u64(11).build()), ShardTarget::Any);
        assert!(p.allows(ShardId(0), &Key::table(9).u64(11).build()));
        assert!(!p.allows(ShardId(0), &key(11)));
    }

    #[test]
    fn hash_partitioner_spreads_keys() {
        let p = Partitioner::new(4, PartitionRule::Hash).unwrap();
        let mut counts = [0u32; 4];
        for i in 0..4_000u64 {
            counts[p.shard_of(&Key::table(1).u64(i).build()).0 as usize] += 1;
        }
        for count in counts {
            assert!((800..1_200).contains(&count), "{counts:?}");
        }
    }

    #[test]
    fn datum_decodes_as_derived_and_refuses_deep_nesting() {
        let nested = Datum::List(vec![
            Datum::Int(-3),
            Datum::List(vec![Datum::Uint(7), Datum::Bytes(vec![1, 2])]),
        ]);
        let bytes = postcard::to_allocvec(&nested).unwrap();
        assert_eq!(postcard::from_bytes::<Datum>(&bytes).unwrap(), nested);
        let mut deep = Datum::Uint(1);
        for _ in 0..DATUM_DEPTH_MAX {
            deep = Datum::List(vec![deep]);
        }
        let bytes = postcard::to_allocvec(&deep).unwrap();
        assert_eq!(postcard::from_bytes::<Datum>(&bytes).unwrap(), deep);
        let deeper = postcard::to_allocvec(&Datum::List(vec![deep])).unwrap();
        assert!(postcard::from_bytes::<Datum>(&deeper).is_err());
        // The shape of the reported crash: a list announcing one item, nested 200,000 deep.
        let hostile: Vec<u8> = std::iter::repeat_n([3u8, 1], 200_000).flatten().collect();
        assert!(postcard::from_bytes::<Datum>(&hostile).is_err());
    }

    #[test]
    fn abort_counts_index_every_cause_by_its_position() {
        let mut counts = AbortCounts::default();
        for (i, cause) in AbortCause::ALL.into_iter().enumerate() {
            assert_eq!(cause as usize, i, "ALL is in declaration order");
            for _ in 0..=i {
                counts.add(cause);
            }
        }
        assert_eq!(counts.get(AbortCause::Validation), 1);
        assert_eq!(counts.get(AbortCause::AlreadyAborted), 9);
        assert_eq!(counts.get(AbortCause::Deadlock), 11);
        assert_eq!(counts.get(AbortCause::Discarded), 13);
        assert_eq!(counts.total(), 91);
        let names: Vec<_> = counts.nonzero().map(|(c, _)| c.name()).collect();
        assert_eq!(names.len(), 13);
        assert_eq!(AbortCounts::default().nonzero().count(), 0);
    }

    #[test]
    fn zero_shards_is_rejected() {
        assert!(Partitioner::new(0, PartitionRule::Hash).is_err());
        assert!(Partitioner::new(1, PartitionRule::LeadingInt { base: 0, per_shard: 0 }).is_err());
    }
}
