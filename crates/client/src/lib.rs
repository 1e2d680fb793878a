//! The Meridian client library: one-shot and interactive transactions against a cluster of
//! `meridian server` processes.
//!
//! A [`Client`] runs one coordinator node of the cluster file in its own process (as
//! `meridian bench --cluster` does; the coordinator is the client-side engine of every
//! protocol here) and talks to the servers over the cluster's TCP protocol, with the same
//! `Hello` check of the cluster file and workload. Each client process needs a coordinator
//! node of its own in the file (the node listens on its address for the servers' replies).
//!
//! Interactive transactions ([`Client::begin`]) run under `occ`, `2pl` and `2pc-mvto`:
//!
//! - **Reads** go to the shards in one round per call: [`Transaction::get_many`] and a
//!   [`Transaction::scan`] reach every shard they touch together. Each read is validated,
//!   locked or stamped exactly as the protocol treats a procedure's reads.
//! - **Writes** ([`Transaction::put`], [`Transaction::delete`]) stay in the transaction until
//!   [`Transaction::commit`] carries them to the shards' prepare; reads and scans see them
//!   (read-your-writes) without asking anyone.
//! - **Ending.** `commit` commits atomically across shards, or fails with
//!   [`Error::Aborted`] (a conflict: nothing was applied, run the transaction again).
//!   Dropping an open transaction aborts it. An idle transaction is aborted by its
//!   coordinator after the lease ([`Options::lease`]), and under `2pl` a shard leader
//!   releases the locks of a transaction idle for four RPC timeouts (its client may be gone).
//!   Every operation after the end is refused with [`Error::Finished`].
//!
//! ```no_run
//! # async fn transfer(client: &meridian_client::Client) -> Result<(), meridian_client::Error> {
//! use meridian_client::Key;
//! let (from, to) = (Key::table(3).u64(1).build(), Key::table(3).u64(2).build());
//! loop {
//!     let mut txn = client.begin().await?;
//!     let balances = txn.get_many(&[from.clone(), to.clone()]).await?;
//!     let cents = |v: &Option<Vec<u8>>| i64::from_le_bytes(v.clone().unwrap()[..8].try_into().unwrap());
//!     txn.put(from.clone(), (cents(&balances[0]) - 100).to_le_bytes().to_vec())?;
//!     txn.put(to.clone(), (cents(&balances[1]) + 100).to_le_bytes().to_vec())?;
//!     match txn.commit().await {
//!         Err(e) if e.is_retryable() => continue, // a conflict: nothing applied
//!         other => return other.map(|_| ()),
//!     }
//! }
//! # }
//! ```
#![deny(unsafe_code)]

use meridian_core::node::{
    parse_read_outputs, ClientRequest, SessionId, SessionOp, SessionRequest,
};
use meridian_core::txn::{ScanRange, TxnFailure, TxnRequest, TxnResult, Write, SCAN_ROWS_MAX};
use meridian_core::RequestId;
use meridian_node::cluster_file::ClusterFile;
use meridian_node::{start_client_node, ClientNode};
use meridian_runtime::node_task::ClientCall;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use meridian_core::key::{Key, Value};
pub use meridian_core::time::Timestamp;
pub use meridian_core::txn::{AbortCause, Args, Datum, TxnOutcome};

/// The table of plain-text keys, shared with `meridian kv`: the text `name` is the key
/// `240 ‖ name` (its bytes, unescaped, so that text keys scan in text order).
pub const TEXT_TABLE: u8 = 240;

/// The key `meridian kv` means by the text `name` (`kv put alice 5` writes
/// `text_key("alice")`).
///
/// ```
/// use meridian_client::{text_key, Key, TEXT_TABLE};
/// assert_eq!(text_key("alice"), Key::from([&[TEXT_TABLE][..], b"alice"].concat()));
/// assert!(text_key("alice") < text_key("bob"));
/// ```
pub fn text_key(name: &str) -> Key {
    Key::from([&[TEXT_TABLE], name.as_bytes()].concat())
}

/// Why an operation did not succeed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The cluster file, node or options are wrong, or the coordinator could not start.
    Config(String),
    /// The protocol aborted the transaction (a conflict, a lease that ran out): nothing it
    /// wrote was applied, and it is over. Running it again may succeed.
    Aborted(AbortCause),
    /// The operation was refused and changed nothing (a reversed scan range, too many keys):
    /// the transaction is still open.
    BadRequest(String),
    /// The transaction is over (committed, aborted or failed) and takes no more operations.
    Finished(String),
    /// The coordinator refused the operation (busy, or the transaction is unknown there).
    Rejected(String),
    /// The transaction failed and did not commit; the text says why.
    Failed(String),
    /// Whether the commit took effect is unknown (a participant forgot the decision).
    Unknown(String),
    /// The local coordinator stopped.
    Closed(String),
}

impl Error {
    /// True when running the transaction again may succeed (it was aborted by a conflict).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Aborted(_))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(why) => write!(f, "{why}"),
            Self::Aborted(cause) => {
                write!(f, "transaction aborted ({}): nothing was applied", cause.name())
            }
            Self::BadRequest(why) => write!(f, "refused: {why}"),
            Self::Finished(why) => write!(f, "the transaction is over: {why}"),
            Self::Rejected(why) => write!(f, "rejected: {why}"),
            Self::Failed(why) => write!(f, "failed: {why}"),
            Self::Unknown(why) => write!(f, "outcome unknown: {why}"),
            Self::Closed(why) => write!(f, "client closed: {why}"),
        }
    }
}

impl std::error::Error for Error {}

/// How a client connects.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The coordinator node of the cluster file to run (by default the first coordinator
    /// that hosts no replica).
    pub node: Option<u32>,
    /// How long an interactive transaction may stay idle before its coordinator aborts it
    /// (by default four RPC timeouts of the cluster's network).
    pub lease: Option<Duration>,
}

/// A connection to a cluster: one coordinator node running in this process.
pub struct Client {
    node: ClientNode,
    next_request: AtomicU64,
    next_session: AtomicU64,
}

impl Client {
    /// Connects with the cluster file at `config` and default [`Options`].
    pub async fn connect(config: impl AsRef<Path>) -> Result<Self, Error> {
        Self::connect_with(config, Options::default()).await
    }

    /// Connects with the cluster file at `config`. Must run inside a tokio runtime.
    pub async fn connect_with(config: impl AsRef<Path>, options: Options) -> Result<Self, Error> {
        let file = ClusterFile::load(config.as_ref()).map_err(|e| Error::Config(e.to_string()))?;
        let lease_ns = match options.lease {
            Some(lease) if lease.is_zero() => {
                return Err(Error::Config("the lease must be positive".into()))
            }
            Some(lease) => Some(u64::try_from(lease.as_nanos()).unwrap_or(u64::MAX)),
            None => None,
        };
        let node = start_client_node(&file, options.node, lease_ns)
            .await
            .map_err(|e| Error::Config(e.to_string()))?;
        Ok(Self { node, next_request: AtomicU64::new(1), next_session: AtomicU64::new(1) })
    }

    /// The cluster's protocol.
    pub fn protocol(&self) -> &'static str {
        self.node.protocol.name()
    }

    fn request_id(&self) -> RequestId {
        RequestId(self.next_request.fetch_add(1, Ordering::Relaxed))
    }

    async fn call(&self, call: ClientCall) -> Result<TxnOutcome, Error> {
        self.node.handle.call(call).await.map_err(Error::Closed)
    }

    /// Runs the cluster workload's procedure `procedure` with `args` as one transaction
    /// (retried by the coordinator on conflicts) and returns its outcome.
    pub async fn run(&self, procedure: &str, args: Args) -> Result<TxnOutcome, Error> {
        let proc = self.node.registry.find(procedure).ok_or_else(|| {
            Error::BadRequest(format!("the cluster's workload has no procedure {procedure:?}"))
        })?;
        let request = ClientRequest { id: self.request_id(), txn: TxnRequest { proc, args } };
        self.call(ClientCall::Submit(request)).await
    }

    /// Begins an interactive transaction.
    pub async fn begin(&self) -> Result<Transaction<'_>, Error> {
        let session = SessionId(self.next_session.fetch_add(1, Ordering::Relaxed));
        let mut txn = Transaction { client: self, session, writes: BTreeMap::new(), over: None };
        txn.step(SessionOp::Begin).await?;
        Ok(txn)
    }

    /// Stops the local coordinator; open transactions are abandoned (their locks expire).
    pub async fn close(self) {
        self.node.stop().await;
    }
}

/// An interactive transaction. Dropping it while open aborts it.
pub struct Transaction<'c> {
    client: &'c Client,
    session: SessionId,
    /// Buffered writes (`None` deletes), sent with the commit.
    writes: BTreeMap<Key, Option<Value>>,
    /// How it ended, once it has.
    over: Option<String>,
}

impl Transaction<'_> {
    fn check_open(&self) -> Result<(), Error> {
        match &self.over {
            Some(how) => Err(Error::Finished(how.clone())),
            None => Ok(()),
        }
    }

    /// Sends one step and maps its reply; a failure that ends the transaction ends it here.
    async fn step(&mut self, op: SessionOp) -> Result<TxnOutcome, Error> {
        self.check_open()?;
        let request = SessionRequest { id: self.client.request_id(), session: self.session, op };
        let outcome = self.client.call(ClientCall::Session(request)).await?;
        match &outcome.result {
            TxnResult::Committed => Ok(outcome),
            TxnResult::UserAborted(why) => {
                self.over = Some(format!("aborted: {why}"));
                Err(Error::Failed(why.clone()))
            }
            TxnResult::Failed(TxnFailure::Aborted(cause)) => {
                self.over = Some(format!("aborted ({})", cause.name()));
                Err(Error::Aborted(*cause))
            }
            TxnResult::Failed(TxnFailure::Procedure(error)) => {
                Err(Error::BadRequest(error.to_string()))
            }
            TxnResult::Failed(TxnFailure::Rejected(why)) => Err(Error::Rejected(why.clone())),
            TxnResult::Failed(TxnFailure::Indeterminate(why)) => {
                self.over = Some(format!("outcome unknown: {why}"));
                Err(Error::Unknown(why.clone()))
            }
            TxnResult::Failed(failure @ TxnFailure::RetriesExhausted) => {
                self.over = Some(failure.to_string());
                Err(Error::Failed(failure.to_string()))
            }
        }
    }

    /// Reads `key` (its own writes first).
    pub async fn get(&mut self, key: &Key) -> Result<Option<Value>, Error> {
        let mut values = self.get_many(std::slice::from_ref(key)).await?;
        Ok(values.pop().flatten())
    }

    /// Reads `keys` in one round to every shard they live on (keys this transaction wrote are
    /// answered from its own writes).
    pub async fn get_many(&mut self, keys: &[Key]) -> Result<Vec<Option<Value>>, Error> {
        self.check_open()?;
        let mut values: Vec<Option<Value>> = Vec::with_capacity(keys.len());
        let mut remote: Vec<Key> = Vec::new();
        let mut remote_at: Vec<usize> = Vec::new();
        for (index, key) in keys.iter().enumerate() {
            match self.writes.get(key) {
                Some(own) => values.push(own.clone()),
                None => {
                    values.push(None);
                    remote.push(key.clone());
                    remote_at.push(index);
                }
            }
        }
        if remote.is_empty() {
            return Ok(values);
        }
        let outcome = self.step(SessionOp::Read { keys: remote, scans: Vec::new() }).await?;
        let (read, _) = parse_read_outputs(&outcome.outputs)
            .filter(|(read, _)| read.len() == remote_at.len())
            .ok_or_else(|| Error::Failed("the coordinator's answer is malformed".into()))?;
        for (index, value) in remote_at.into_iter().zip(read) {
            values[index] = value;
        }
        Ok(values)
    }

    /// The rows with keys in `[start, end)`, at most `limit`, in key order (newest first
    /// when `reverse`), with this transaction's own writes applied. A reversed range
    /// (`start > end`) or a limit over 10,000 is refused and changes nothing.
    pub async fn scan(
        &mut self,
        start: Key,
        end: Key,
        limit: u32,
        reverse: bool,
    ) -> Result<Vec<(Key, Value)>, Error> {
        self.check_open()?;
        if start > end {
            return Err(Error::BadRequest(format!(
                "scan range reversed: start {start:?} is after end {end:?}"
            )));
        }
        if limit > SCAN_ROWS_MAX {
            return Err(Error::BadRequest(format!("scan limit {limit} is over {SCAN_ROWS_MAX}")));
        }
        let own: Vec<(Key, Option<Value>)> = self
            .writes
            .range(start.clone()..end.clone())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        // Ask for enough rows that those this transaction deleted do not leave the answer
        // short.
        let deleted = own.iter().filter(|(_, v)| v.is_none()).count() as u32;
        let ask = limit.saturating_add(deleted).min(SCAN_ROWS_MAX);
        let range = ScanRange { start, end, limit: ask, reverse };
        let outcome = self.step(SessionOp::Read { keys: Vec::new(), scans: vec![range] }).await?;
        let (_, mut scans) = parse_read_outputs(&outcome.outputs)
            .filter(|(_, scans)| scans.len() == 1)
            .ok_or_else(|| Error::Failed("the coordinator's answer is malformed".into()))?;
        let mut rows: BTreeMap<Key, Value> = scans.pop().unwrap_or_default().into_iter().collect();
        for (key, value) in own {
            match value {
                Some(value) => rows.insert(key, value),
                None => rows.remove(&key),
            };
        }
        let rows: Vec<(Key, Value)> = if reverse {
            rows.into_iter().rev().take(limit as usize).collect()
        } else {
            rows.into_iter().take(limit as usize).collect()
        };
        Ok(rows)
    }

    /// Writes `value` under `key` when the transaction commits.
    pub fn put(&mut self, key: Key, value: Value) -> Result<(), Error> {
        self.check_open()?;
        self.writes.insert(key, Some(value));
        Ok(())
    }

    /// Deletes `key` when the transaction commits.
    pub fn delete(&mut self, key: Key) -> Result<(), Error> {
        self.check_open()?;
        self.writes.insert(key, None);
        Ok(())
    }

    /// Commits: every write applies atomically, or none does. Returns the commit timestamp
    /// (none for a transaction that read and wrote nothing).
    pub async fn commit(&mut self) -> Result<Option<Timestamp>, Error> {
        let writes = self
            .writes
            .iter()
            .map(|(key, value)| Write { key: key.clone(), value: value.clone() })
            .collect();
        let outcome = self.step(SessionOp::Commit { writes }).await;
        if let Err(Error::BadRequest(why) | Error::Rejected(why)) = &outcome {
            // The coordinator refused the commit before it started: the transaction is over
            // for this client (it is aborted, so that nothing is left holding locks).
            let why = why.clone();
            self.abort_quietly();
            self.over = Some(format!("its commit was refused: {why}"));
        }
        let outcome = outcome?;
        self.over = Some("it committed".into());
        Ok(outcome.commit_ts)
    }

    /// Aborts: nothing it wrote is applied, and what it holds is released.
    pub async fn abort(&mut self) -> Result<(), Error> {
        self.step(SessionOp::Abort).await?;
        self.over = Some("it was aborted".into());
        Ok(())
    }

    /// Asks the coordinator to abort without waiting (for `Drop`).
    fn abort_quietly(&mut self) {
        let request = SessionRequest {
            id: self.client.request_id(),
            session: self.session,
            op: SessionOp::Abort,
        };
        self.client.node.handle.send(ClientCall::Session(request));
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if self.over.is_none() {
            self.abort_quietly();
        }
    }
}
