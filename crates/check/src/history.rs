//! Histories in elle-cli's JSON format: parsing (with errors that name the line), pairing of
//! invocations with completions, and export.
//!
//! A history is a sequence of operations, each `{"index", "process", "type", "f", "value",
//! "time"}` with `type` one of `invoke`, `ok` (committed), `fail` (certainly not committed) or
//! `info` (unknown). `value` is a list of micro-operations: `["append", k, v]` and
//! `["r", k, [v...]]` for list-append, `["w", k, v]` and `["r", k, v]` for rw-register. Keys
//! are integers or strings; values are integers. The file is either a JSON array of operations
//! or one operation per line. Order in the file is real-time order.
//!
//! Every invocation is paired with the next completion of its process. A completion without an
//! invocation, a second invocation while one is open, or a completion whose micro-operations do
//! not match its invocation is rejected. An invocation never completed counts as `info`.
//!
//! Histories recorded by Jepsen carry more than client transactions: operations whose `process`
//! is not an integer (the nemesis, written `"nemesis"`) are skipped whatever their other fields
//! hold, and an `info` completion whose `value` is `null` (the client did not learn the outcome)
//! stands for its invocation's micro-operations with unknown results.

use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::fmt;

/// Operations a history may hold; larger inputs are refused rather than exhausting memory.
pub const OPS_MAX: usize = 20_000_000;
/// Micro-operations per transaction.
pub const MOPS_PER_TXN_MAX: usize = 10_000;

/// Which workload the history comes from; it decides how reads are interpreted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Model {
    /// Appends to lists; a read returns the whole list.
    ListAppend,
    /// Writes of unique values; a read returns one value or nothing.
    RwRegister,
}

impl Model {
    /// Parses a model name.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "list-append" => Ok(Self::ListAppend),
            "rw-register" => Ok(Self::RwRegister),
            other => {
                Err(format!("unknown history model '{other}'; accepted: list-append, rw-register"))
            }
        }
    }

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::ListAppend => "list-append",
            Self::RwRegister => "rw-register",
        }
    }
}

/// How an operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpType {
    /// The client asked.
    Invoke,
    /// Committed.
    Ok,
    /// Certainly not committed.
    Fail,
    /// Unknown: it may or may not have committed.
    Info,
}

impl OpType {
    fn parse(name: &str) -> Option<Self> {
        match name {
            "invoke" => Some(Self::Invoke),
            "ok" => Some(Self::Ok),
            "fail" => Some(Self::Fail),
            "info" => Some(Self::Info),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Invoke => "invoke",
            Self::Ok => "ok",
            Self::Fail => "fail",
            Self::Info => "info",
        }
    }
}

/// A key as written in the history: an integer or a string.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeyName {
    /// An integer key.
    Int(i64),
    /// A string key.
    Str(String),
}

impl fmt::Display for KeyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(i) => write!(f, "{i}"),
            Self::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// One micro-operation. Keys are indices into [`History::keys`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mop {
    /// Append `value` to the list at `key` (list-append).
    Append {
        /// Key index.
        key: u32,
        /// The unique element.
        value: i64,
    },
    /// Write `value` to `key` (rw-register).
    Write {
        /// Key index.
        key: u32,
        /// The unique value.
        value: i64,
    },
    /// Read the list at `key`; `None` when not known (in an invocation).
    ReadList {
        /// Key index.
        key: u32,
        /// The list read.
        list: Option<Vec<i64>>,
    },
    /// Read the register at `key`; the outer `None` when not known (in an invocation), the
    /// inner `None` for the initial, never-written state.
    ReadRegister {
        /// Key index.
        key: u32,
        /// The value read.
        value: Option<Option<i64>>,
    },
}

impl Mop {
    /// The key index.
    pub fn key(&self) -> u32 {
        match self {
            Self::Append { key, .. }
            | Self::Write { key, .. }
            | Self::ReadList { key, .. }
            | Self::ReadRegister { key, .. } => *key,
        }
    }

    fn same_shape(&self, other: &Mop) -> bool {
        match (self, other) {
            (Self::Append { key: a, value: x }, Self::Append { key: b, value: y })
            | (Self::Write { key: a, value: x }, Self::Write { key: b, value: y }) => {
                a == b && x == y
            }
            (Self::ReadList { key: a, .. }, Self::ReadList { key: b, .. })
            | (Self::ReadRegister { key: a, .. }, Self::ReadRegister { key: b, .. }) => a == b,
            _ => false,
        }
    }
}

/// One operation as it appears in the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    /// The `index` field (or the position when absent).
    pub index: u64,
    /// The client process.
    pub process: u64,
    /// Invocation or completion kind.
    pub kind: OpType,
    /// Time in nanoseconds, when recorded.
    pub time_ns: Option<u64>,
    /// Micro-operations.
    pub mops: Vec<Mop>,
}

/// Final status of a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Committed.
    Ok,
    /// Not committed.
    Fail,
    /// Unknown.
    Info,
}

/// An invocation paired with its completion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Txn {
    /// The client process.
    pub process: u64,
    /// `index` of the invocation.
    pub invoke_index: u64,
    /// Position of the invocation in the history (real-time order).
    pub invoke_pos: usize,
    /// Position of the completion; `None` for a transaction never completed.
    pub complete_pos: Option<usize>,
    /// Time of the invocation, when recorded.
    pub invoke_time: Option<u64>,
    /// Time of the completion, when recorded.
    pub complete_time: Option<u64>,
    /// How it ended.
    pub status: Status,
    /// The completion's micro-operations for `ok`, the invocation's otherwise.
    pub mops: Vec<Mop>,
}

/// A parsed history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// Operations in real-time order.
    pub ops: Vec<Op>,
    /// Key names, by index.
    pub keys: Vec<KeyName>,
}

/// Why a history was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryError {
    /// 1-based line in the input, when known.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for HistoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.message),
            None => write!(f, "{}", self.message),
        }
    }
}

impl std::error::Error for HistoryError {}

fn error(line: Option<usize>, message: impl Into<String>) -> HistoryError {
    HistoryError { line, message: message.into() }
}

/// Builds a history in memory (for recorders and tests).
#[derive(Debug, Default)]
pub struct HistoryBuilder {
    history: History,
    key_index: BTreeMap<KeyName, u32>,
}

impl HistoryBuilder {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// The index of `name`, adding it when new.
    pub fn key(&mut self, name: KeyName) -> u32 {
        if let Some(&k) = self.key_index.get(&name) {
            return k;
        }
        let k = u32::try_from(self.history.keys.len()).expect("fewer than 2^32 keys");
        self.history.keys.push(name.clone());
        self.key_index.insert(name, k);
        k
    }

    /// Appends an operation; `index` is its position.
    pub fn push(&mut self, process: u64, kind: OpType, time_ns: Option<u64>, mops: Vec<Mop>) {
        let index = self.history.ops.len() as u64;
        self.history.ops.push(Op { index, process, kind, time_ns, mops });
    }

    /// The history built.
    pub fn finish(self) -> History {
        self.history
    }
}

impl History {
    /// Parses elle-cli JSON: an array of operations or one operation per line.
    pub fn parse(text: &str, model: Model) -> Result<Self, HistoryError> {
        let mut builder = HistoryBuilder::new();
        // Per process, the position of its last invocation (for value-less info completions).
        let mut open: BTreeMap<u64, usize> = BTreeMap::new();
        let trimmed = text.trim_start();
        if trimmed.starts_with('[') {
            // Parse the array as a stream of values so errors carry the line.
            let values: Vec<Json> = serde_json::from_str(text).map_err(|e| {
                error(Some(e.line()), format!("not a JSON array of operations: {e}"))
            })?;
            if values.len() > OPS_MAX {
                return Err(error(None, format!("more than {OPS_MAX} operations")));
            }
            let lines = op_lines(text, values.len());
            for (position, value) in values.iter().enumerate() {
                parse_op(&mut builder, &mut open, value, model, position)
                    .map_err(|m| error(lines.get(position).copied(), m))?;
            }
        } else {
            for (line_no, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() {
                    continue;
                }
                if builder.history.ops.len() >= OPS_MAX {
                    return Err(error(
                        Some(line_no + 1),
                        format!("more than {OPS_MAX} operations"),
                    ));
                }
                let value: Json = serde_json::from_str(line.trim_end_matches(','))
                    .map_err(|e| error(Some(line_no + 1), format!("not a JSON operation: {e}")))?;
                let position = builder.history.ops.len();
                parse_op(&mut builder, &mut open, &value, model, position)
                    .map_err(|m| error(Some(line_no + 1), m))?;
            }
        }
        let history = builder.finish();
        history.transactions()?;
        Ok(history)
    }

    /// Pairs invocations with completions, in invocation order.
    pub fn transactions(&self) -> Result<Vec<Txn>, HistoryError> {
        let mut txns: Vec<Txn> = Vec::new();
        let mut open: BTreeMap<u64, usize> = BTreeMap::new();
        for (pos, op) in self.ops.iter().enumerate() {
            let at =
                |m: String| error(None, format!("operation {} (index {}): {m}", pos, op.index));
            if op.kind == OpType::Invoke {
                if let Some(&t) = open.get(&op.process) {
                    return Err(at(format!(
                        "process {} invokes again while its invocation at index {} is open",
                        op.process, txns[t].invoke_index
                    )));
                }
                open.insert(op.process, txns.len());
                txns.push(Txn {
                    process: op.process,
                    invoke_index: op.index,
                    invoke_pos: pos,
                    complete_pos: None,
                    invoke_time: op.time_ns,
                    complete_time: None,
                    status: Status::Info,
                    mops: op.mops.clone(),
                });
                continue;
            }
            let Some(t) = open.remove(&op.process) else {
                return Err(at(format!(
                    "'{}' for process {} has no open invocation (an unknown transaction)",
                    op.kind.name(),
                    op.process
                )));
            };
            let txn = &mut txns[t];
            if txn.mops.len() != op.mops.len()
                || !txn.mops.iter().zip(&op.mops).all(|(a, b)| a.same_shape(b))
            {
                return Err(at(format!(
                    "completion does not match its invocation at index {}",
                    txn.invoke_index
                )));
            }
            txn.complete_pos = Some(pos);
            txn.complete_time = op.time_ns;
            txn.status = match op.kind {
                OpType::Ok => Status::Ok,
                OpType::Fail => Status::Fail,
                _ => Status::Info,
            };
            if op.kind == OpType::Ok {
                for mop in &op.mops {
                    let unknown = matches!(
                        mop,
                        Mop::ReadList { list: None, .. } | Mop::ReadRegister { value: None, .. }
                    );
                    if unknown {
                        return Err(at("a committed read has no value".into()));
                    }
                }
                txn.mops = op.mops.clone();
            }
        }
        Ok(txns)
    }

    /// Writes the history as elle-cli JSON: an array with one operation per line.
    pub fn to_json(&self) -> String {
        let mut out = String::from("[");
        for (i, op) in self.ops.iter().enumerate() {
            out.push_str(if i == 0 { "\n" } else { ",\n" });
            let mops: Vec<Json> = op.mops.iter().map(|m| self.mop_json(m)).collect();
            let mut object = serde_json::Map::new();
            object.insert("index".into(), op.index.into());
            object.insert("process".into(), op.process.into());
            object.insert("type".into(), op.kind.name().into());
            object.insert("f".into(), "txn".into());
            object.insert("value".into(), Json::Array(mops));
            if let Some(t) = op.time_ns {
                object.insert("time".into(), t.into());
            }
            out.push_str(&Json::Object(object).to_string());
        }
        out.push_str("\n]\n");
        out
    }

    fn key_json(&self, key: u32) -> Json {
        match &self.keys[key as usize] {
            KeyName::Int(i) => (*i).into(),
            KeyName::Str(s) => s.clone().into(),
        }
    }

    fn mop_json(&self, mop: &Mop) -> Json {
        let (f, key, value) = match mop {
            Mop::Append { key, value } => ("append", *key, Json::from(*value)),
            Mop::Write { key, value } => ("w", *key, Json::from(*value)),
            Mop::ReadList { key, list } => {
                ("r", *key, list.as_ref().map_or(Json::Null, |l| Json::from(l.clone())))
            }
            Mop::ReadRegister { key, value } => {
                ("r", *key, value.flatten().map_or(Json::Null, Json::from))
            }
        };
        Json::Array(vec![f.into(), self.key_json(key), value])
    }
}

/// The 1-based line on which each of the first `count` top-level array elements starts. Exact
/// for files written one operation per line; otherwise an approximation good enough to point at.
fn op_lines(text: &str, count: usize) -> Vec<usize> {
    let mut lines = Vec::with_capacity(count);
    let (mut depth, mut line, mut in_string, mut escaped) = (0usize, 1usize, false, false);
    for c in text.chars() {
        if c == '\n' {
            line += 1;
        }
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '[' | '{' => {
                if depth == 1 {
                    lines.push(line);
                }
                depth += 1;
            }
            ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    lines
}

/// Parses one operation into `builder`, or skips it when it is not a client's (its `process`
/// is not a number). `open` maps each process to the position of its last invocation.
fn parse_op(
    builder: &mut HistoryBuilder,
    open: &mut BTreeMap<u64, usize>,
    value: &Json,
    model: Model,
    position: usize,
) -> Result<(), String> {
    let object = value.as_object().ok_or("an operation must be a JSON object")?;
    let process = match object.get("process") {
        None => return Err("missing \"process\"".into()),
        Some(Json::Number(n)) => n.as_u64().ok_or("\"process\" must be a non-negative integer")?,
        // The nemesis (or another non-client process): not part of any transaction.
        Some(_) => return Ok(()),
    };
    let kind_name = object.get("type").and_then(Json::as_str).ok_or("missing \"type\"")?;
    let kind = OpType::parse(kind_name)
        .ok_or_else(|| format!("unknown type '{kind_name}'; accepted: invoke, ok, fail, info"))?;
    let index = match object.get("index") {
        None => position as u64,
        Some(i) => i.as_u64().ok_or("\"index\" must be a non-negative integer")?,
    };
    let time_ns = match object.get("time") {
        None | Some(Json::Null) => None,
        Some(t) => Some(t.as_u64().ok_or("\"time\" must be a non-negative integer")?),
    };
    if let Some(f) = object.get("f") {
        if f.as_str() != Some("txn") {
            return Err(format!("\"f\" must be \"txn\", found {f}"));
        }
    }
    let at = builder.history.ops.len();
    if kind == OpType::Info && object.get("value").is_none_or(Json::is_null) {
        // Outcome unknown and nothing reported: the invocation's micro-operations (reads
        // unknown). Without an open invocation the pairing refuses the completion later.
        let mops = open
            .remove(&process)
            .map_or_else(Vec::new, |invoked| builder.history.ops[invoked].mops.clone());
        builder.history.ops.push(Op { index, process, kind, time_ns, mops });
        return Ok(());
    }
    let raw = object.get("value").and_then(Json::as_array).ok_or("\"value\" must be a list")?;
    if raw.len() > MOPS_PER_TXN_MAX {
        return Err(format!("more than {MOPS_PER_TXN_MAX} micro-operations"));
    }
    let mut mops = Vec::with_capacity(raw.len());
    for (i, m) in raw.iter().enumerate() {
        mops.push(parse_mop(builder, m, model).map_err(|e| format!("micro-operation {i}: {e}"))?);
    }
    if kind == OpType::Invoke {
        open.insert(process, at);
    } else {
        open.remove(&process);
    }
    builder.history.ops.push(Op { index, process, kind, time_ns, mops });
    Ok(())
}

fn parse_mop(builder: &mut HistoryBuilder, value: &Json, model: Model) -> Result<Mop, String> {
    let parts = value.as_array().filter(|p| p.len() == 3).ok_or("expected [f, key, value]")?;
    let f = parts[0].as_str().ok_or("f must be a string")?;
    let key_name = match &parts[1] {
        Json::Number(n) => KeyName::Int(n.as_i64().ok_or("integer keys must fit in 64 bits")?),
        Json::String(s) => KeyName::Str(s.clone()),
        _ => return Err("a key must be an integer or a string".into()),
    };
    let key = builder.key(key_name);
    let int = |v: &Json| v.as_i64().ok_or_else(|| format!("expected an integer, found {v}"));
    match (model, f) {
        (Model::ListAppend, "append") => Ok(Mop::Append { key, value: int(&parts[2])? }),
        (Model::ListAppend, "r") => {
            let list = match &parts[2] {
                Json::Null => None,
                Json::Array(items) => Some(items.iter().map(int).collect::<Result<_, _>>()?),
                other => return Err(format!("a list read returns a list or null, found {other}")),
            };
            Ok(Mop::ReadList { key, list })
        }
        (Model::RwRegister, "w") => Ok(Mop::Write { key, value: int(&parts[2])? }),
        (Model::RwRegister, "r") => {
            let value = match &parts[2] {
                Json::Null => Some(None),
                v => Some(Some(int(v)?)),
            };
            Ok(Mop::ReadRegister { key, value })
        }
        (Model::ListAppend, other) => {
            Err(format!("unknown micro-operation '{other}' for list-append; accepted: append, r"))
        }
        (Model::RwRegister, other) => {
            Err(format!("unknown micro-operation '{other}' for rw-register; accepted: w, r"))
        }
    }
}
