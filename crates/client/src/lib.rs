//! The Meridian client library: one-shot and interactive transactions against a cluster of
//! `meridian server` processes.
//!
//! A [`Client`] runs one coordinator node of the cluster file in its own process (as
//! `meridian bench --cluster` does; the coordinator is the client-side engine of every
//! protocol here) and talks to the servers over the cluster's TCP protocol, with the same
//! `Hello` check of the cluster file and workload. Each client process needs a coordinator
//! node of its own in the file (the node listens on its address for the servers' replies).
//! A `Client` is a cheap handle: clone it into as many tasks as you like.
//!
//! Interactive transactions ([`Client::begin`], [`Transaction`]) run under `occ`, `2pl` and
//! `2pc-mvto`:
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
//! - **Time limits.** An operation unanswered within [`Options::timeout`] ends its
//!   transaction with [`Error::Timeout`], naming the shards it waited on and their servers
//!   (nothing applied; retryable), or, for a commit, [`Error::Unknown`] (it may have applied).
//! - **Retries.** [`Client::transact`] runs a transaction body again, after a bounded,
//!   growing pause, for as long as it fails with an error that [`Error::is_retryable`] says
//!   applied nothing ([`Options::retry`]).
//!
//! ```no_run
//! # async fn transfer(client: &meridian_client::Client) -> Result<(), meridian_client::Error> {
//! use meridian_client::Key;
//! let (from, to) = (Key::table(3).u64(1).build(), Key::table(3).u64(2).build());
//! let cents = |v: &Option<Vec<u8>>| i64::from_le_bytes(v.clone().unwrap()[..8].try_into().unwrap());
//! client
//!     .transact(|txn| {
//!         let (from, to) = (from.clone(), to.clone());
//!         Box::pin(async move {
//!             let balances = txn.get_many(&[from.clone(), to.clone()]).await?;
//!             txn.put(from, (cents(&balances[0]) - 100).to_le_bytes().to_vec())?;
//!             txn.put(to, (cents(&balances[1]) + 100).to_le_bytes().to_vec())?;
//!             Ok(())
//!         })
//!     })
//!     .await
//! # }
//! ```
#![deny(unsafe_code)]

mod error;
mod retry;
mod transaction;

pub use error::Error;
pub use meridian_core::key::{Key, Value};
pub use meridian_core::time::Timestamp;
pub use meridian_core::txn::{AbortCause, Args, Datum, TxnOutcome};
pub use retry::{Retry, TxnBody};
pub use transaction::Transaction;

use meridian_core::node::{ClientRequest, SessionId};
use meridian_core::txn::{Partitioner, Registry, TxnRequest};
use meridian_core::RequestId;
use meridian_node::cluster_file::ClusterFile;
use meridian_node::{start_client_node, ClientNode};
use meridian_runtime::node_task::{ClientCall, ClientHandle};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

/// The time limit of one operation when [`Options::timeout`] is left as it is.
pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// How a client connects and waits.
///
/// ```
/// use meridian_client::{Options, Retry};
/// use std::time::Duration;
/// let options = Options {
///     timeout: Some(Duration::from_secs(5)),
///     retry: Retry { attempts_max: 20, ..Retry::default() },
///     ..Options::default()
/// };
/// assert_eq!(options.node, None);
/// ```
#[derive(Clone, Debug)]
pub struct Options {
    /// The coordinator node of the cluster file to run (by default the first coordinator
    /// that hosts no replica).
    pub node: Option<u32>,
    /// How long an interactive transaction may stay idle before its coordinator aborts it
    /// (by default four RPC timeouts of the cluster's network).
    pub lease: Option<Duration>,
    /// How long one operation may go unanswered ([`TIMEOUT_DEFAULT`]; `None`: as long as
    /// the coordinator keeps trying).
    pub timeout: Option<Duration>,
    /// How [`Client::transact`] runs a transaction again.
    pub retry: Retry,
}

impl Default for Options {
    fn default() -> Self {
        Self { node: None, lease: None, timeout: Some(TIMEOUT_DEFAULT), retry: Retry::default() }
    }
}

/// A connection to a cluster: one coordinator node running in this process. Cloning it gives
/// another handle on the same node (for other tasks); the node stops at [`Client::close`] or
/// when the last handle is dropped.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    handle: ClientHandle,
    registry: Arc<Registry>,
    partitioner: Arc<Partitioner>,
    shard_servers: Vec<Vec<SocketAddr>>,
    protocol: &'static str,
    /// The node, until [`Client::close`] stops it.
    node: std::sync::Mutex<Option<ClientNode>>,
    next_request: AtomicU64,
    next_session: AtomicU64,
    timeout: Option<Duration>,
    retry: Retry,
}

impl Client {
    /// Connects with the cluster file at `config` and default [`Options`].
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), meridian_client::Error> {
    /// let client = meridian_client::Client::connect("cluster.toml").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(config: impl AsRef<Path>) -> Result<Self, Error> {
        Self::connect_with(config, Options::default()).await
    }

    /// Connects with the cluster file at `config`. Must run inside a tokio runtime. A bad
    /// file, node, lease, time limit or retry setting is refused before anything starts;
    /// then every server is sent this client's hello, and one that refuses it (another
    /// cluster file, workload or version), a port that is no Meridian server, or a shard
    /// with no server reachable is an [`Error::Config`] naming the node and address.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), meridian_client::Error> {
    /// use meridian_client::{Client, Options};
    /// let options = Options { node: Some(9), ..Options::default() };
    /// let client = Client::connect_with("cluster.toml", options).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_with(config: impl AsRef<Path>, options: Options) -> Result<Self, Error> {
        let lease_ns = match options.lease {
            Some(lease) if lease.is_zero() => {
                return Err(Error::config("the lease must be positive"))
            }
            Some(lease) => Some(u64::try_from(lease.as_nanos()).unwrap_or(u64::MAX)),
            None => None,
        };
        if options.timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::config("the operation time limit must be positive"));
        }
        options.retry.check().map_err(Error::config)?;
        let file = ClusterFile::load(config.as_ref())?;
        let node = start_client_node(&file, options.node, lease_ns).await?;
        // One clear line for servers of another cluster, a port that is no Meridian server,
        // or a shard with no server up, rather than timeouts later.
        if let Err(error) = meridian_node::probe_servers(&file, node.id).await {
            node.stop().await;
            return Err(error.into());
        }
        let inner = Inner {
            handle: node.handle.clone(),
            registry: node.registry.clone(),
            partitioner: node.partitioner.clone(),
            shard_servers: node.shard_servers.clone(),
            protocol: node.protocol.name(),
            node: std::sync::Mutex::new(Some(node)),
            next_request: AtomicU64::new(1),
            next_session: AtomicU64::new(1),
            timeout: options.timeout,
            retry: options.retry,
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The cluster's protocol.
    pub fn protocol(&self) -> &'static str {
        self.inner.protocol
    }

    fn shards(&self) -> u32 {
        self.inner.shard_servers.len() as u32
    }

    /// The servers of `shards`.
    fn servers_of(&self, shards: &[u32]) -> Vec<SocketAddr> {
        let of = |s: &u32| self.inner.shard_servers.get(*s as usize).into_iter().flatten();
        shards.iter().flat_map(of).copied().collect()
    }

    fn request_id(&self) -> RequestId {
        RequestId(self.inner.next_request.fetch_add(1, Ordering::Relaxed))
    }

    async fn call(&self, call: ClientCall) -> Result<TxnOutcome, Error> {
        self.inner.handle.call(call).await.map_err(Error::Closed)
    }

    fn send(&self, call: ClientCall) {
        self.inner.handle.send(call);
    }

    /// Runs the cluster workload's procedure `procedure` with `args` as one transaction
    /// (retried by the coordinator on conflicts) and returns its outcome.
    ///
    /// ```no_run
    /// # async fn example(client: &meridian_client::Client) -> Result<(), meridian_client::Error> {
    /// use meridian_client::Datum;
    /// let outcome = client.run("bank-transfer", vec![Datum::Uint(1), Datum::Uint(2), Datum::Int(5)]).await?;
    /// println!("{:?}", outcome.result);
    /// # Ok(()) }
    /// ```
    pub async fn run(&self, procedure: &str, args: Args) -> Result<TxnOutcome, Error> {
        let proc = self.inner.registry.find(procedure).ok_or_else(|| {
            Error::BadRequest(format!("the cluster's workload has no procedure {procedure:?}"))
        })?;
        let request = ClientRequest { id: self.request_id(), txn: TxnRequest { proc, args } };
        let call = self.call(ClientCall::Submit(request));
        match self.inner.timeout {
            None => call.await,
            Some(after) => tokio::time::timeout(after, call).await.unwrap_or_else(|_| {
                Err(Error::Unknown(format!(
                    "no answer to the procedure within {} ms: it may have applied",
                    after.as_millis()
                )))
            }),
        }
    }

    /// Begins an interactive transaction. It owns a handle on this client, so it may move
    /// into another task.
    ///
    /// ```no_run
    /// # async fn example(client: &meridian_client::Client) -> Result<(), meridian_client::Error> {
    /// let mut txn = client.begin().await?;
    /// let task = tokio::spawn(async move {
    ///     txn.put(meridian_client::text_key("k"), b"v".to_vec())?;
    ///     txn.commit().await
    /// });
    /// task.await.expect("the task ran")?;
    /// # Ok(()) }
    /// ```
    pub async fn begin(&self) -> Result<Transaction, Error> {
        let session = SessionId(self.inner.next_session.fetch_add(1, Ordering::Relaxed));
        Transaction::begin(self, session).await
    }

    /// Stops the local coordinator for every handle of this client; open transactions are
    /// abandoned (their locks expire with their lease).
    ///
    /// ```no_run
    /// # async fn example(client: meridian_client::Client) {
    /// client.close().await;
    /// # }
    /// ```
    pub async fn close(self) {
        let node = self.inner.node.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(node) = node {
            node.stop().await;
        }
    }
}
