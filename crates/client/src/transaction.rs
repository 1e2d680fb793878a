//! An interactive transaction: reads in rounds, buffered writes, commit or abort. It owns a
//! handle on its [`Client`], so it may move into a spawned task.

use crate::{Client, Error};
use meridian_core::key::{Key, Value};
use meridian_core::node::{parse_read_outputs, SessionId, SessionOp, SessionRequest};
use meridian_core::time::Timestamp;
use meridian_core::txn::{ScanRange, TxnFailure, TxnOutcome, TxnResult, Write, SCAN_ROWS_MAX};
use meridian_runtime::node_task::ClientCall;
use std::collections::{BTreeMap, BTreeSet};

/// An interactive transaction. Dropping it while open aborts it.
///
/// ```no_run
/// # async fn example(client: &meridian_client::Client) -> Result<(), meridian_client::Error> {
/// use meridian_client::text_key;
/// let mut txn = client.begin().await?;
/// let seen = txn.get(&text_key("visits")).await?;
/// let visits = seen.map_or(0, |v| u64::from_le_bytes(v[..8].try_into().unwrap())) + 1;
/// txn.put(text_key("visits"), visits.to_le_bytes().to_vec())?;
/// txn.commit().await?;
/// # Ok(()) }
/// ```
pub struct Transaction {
    client: Client,
    session: SessionId,
    /// Buffered writes (`None` deletes), sent with the commit.
    writes: BTreeMap<Key, Option<Value>>,
    /// The shards read so far (named when an operation goes unanswered).
    read_shards: BTreeSet<u32>,
    /// How it ended, once it has.
    over: Option<String>,
}

/// The shards a scan may read: all of them (a range may span any).
const EVERY_SHARD: Option<&[Key]> = None;

impl Transaction {
    /// Begins a transaction of `client` (its first step, answered by the coordinator).
    pub(crate) async fn begin(client: &Client, session: SessionId) -> Result<Self, Error> {
        let mut txn = Transaction {
            client: client.clone(),
            session,
            writes: BTreeMap::new(),
            read_shards: BTreeSet::new(),
            over: None,
        };
        txn.step(SessionOp::Begin, "begin", Some(&[])).await?;
        Ok(txn)
    }

    /// True once it committed, aborted or failed.
    pub fn is_over(&self) -> bool {
        self.over.is_some()
    }

    fn check_open(&self) -> Result<(), Error> {
        match &self.over {
            Some(how) => Err(Error::Finished(how.clone())),
            None => Ok(()),
        }
    }

    /// Sends one step and maps its reply; a failure that ends the transaction ends it here.
    /// `keys`: those the step reads or writes (`None`: any shard), to name the shards an
    /// unanswered step waited on.
    async fn step(
        &mut self,
        op: SessionOp,
        operation: &'static str,
        keys: Option<&[Key]>,
    ) -> Result<TxnOutcome, Error> {
        self.check_open()?;
        let committing = matches!(op, SessionOp::Commit { .. });
        let request = SessionRequest { id: self.client.request_id(), session: self.session, op };
        let call = self.client.call(ClientCall::Session(request));
        let outcome = match self.client.inner.timeout {
            None => call.await?,
            Some(after) => match tokio::time::timeout(after, call).await {
                Ok(outcome) => outcome?,
                Err(_) => {
                    // Over for this client; the coordinator is told to let go of it.
                    self.abort_quietly();
                    let shards = self.shards_of(keys);
                    if committing {
                        self.over = Some("its commit went unanswered".into());
                        return Err(Error::Unknown(format!(
                            "no answer to the commit within {} ms: it may have applied",
                            after.as_millis()
                        )));
                    }
                    self.over = Some(format!("its {operation} went unanswered"));
                    let servers = self.client.servers_of(&shards);
                    return Err(Error::Timeout { operation, after, shards, servers });
                }
            },
        };
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

    /// The shards `keys` live on, with those read before (`None`: every shard).
    fn shards_of(&self, keys: Option<&[Key]>) -> Vec<u32> {
        let Some(keys) = keys else { return (0..self.client.shards()).collect() };
        let mut shards = self.read_shards.clone();
        shards.extend(keys.iter().map(|k| self.client.inner.partitioner.shard_of(k).0));
        shards.into_iter().collect()
    }

    /// Reads `key` (its own writes first).
    ///
    /// ```no_run
    /// # async fn example(txn: &mut meridian_client::Transaction) -> Result<(), meridian_client::Error> {
    /// let balance = txn.get(&meridian_client::Key::table(3).u64(7).build()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn get(&mut self, key: &Key) -> Result<Option<Value>, Error> {
        let mut values = self.get_many(std::slice::from_ref(key)).await?;
        Ok(values.pop().flatten())
    }

    /// Reads `keys` in one round to every shard they live on (keys this transaction wrote are
    /// answered from its own writes).
    ///
    /// ```no_run
    /// # async fn example(txn: &mut meridian_client::Transaction) -> Result<(), meridian_client::Error> {
    /// use meridian_client::text_key;
    /// let values = txn.get_many(&[text_key("alice"), text_key("bob")]).await?;
    /// assert_eq!(values.len(), 2);
    /// # Ok(()) }
    /// ```
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
        let shards = self.shards_of(Some(&remote));
        let op = SessionOp::Read { keys: remote.clone(), scans: Vec::new() };
        let outcome = self.step(op, "a read", Some(&remote)).await?;
        self.read_shards.extend(shards);
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
    ///
    /// ```no_run
    /// # async fn example(txn: &mut meridian_client::Transaction) -> Result<(), meridian_client::Error> {
    /// use meridian_client::text_key;
    /// for (key, value) in txn.scan(text_key("a"), text_key("b"), 10, false).await? {
    ///     println!("{key:?} = {value:?}");
    /// }
    /// # Ok(()) }
    /// ```
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
        let op = SessionOp::Read { keys: Vec::new(), scans: vec![range] };
        let outcome = self.step(op, "a scan", EVERY_SHARD).await?;
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
    ///
    /// ```no_run
    /// # fn example(txn: &mut meridian_client::Transaction) -> Result<(), meridian_client::Error> {
    /// txn.put(meridian_client::text_key("alice"), b"hello".to_vec())?;
    /// # Ok(()) }
    /// ```
    pub fn put(&mut self, key: Key, value: Value) -> Result<(), Error> {
        self.check_open()?;
        self.writes.insert(key, Some(value));
        Ok(())
    }

    /// Deletes `key` when the transaction commits.
    ///
    /// ```no_run
    /// # fn example(txn: &mut meridian_client::Transaction) -> Result<(), meridian_client::Error> {
    /// txn.delete(meridian_client::text_key("alice"))?;
    /// # Ok(()) }
    /// ```
    pub fn delete(&mut self, key: Key) -> Result<(), Error> {
        self.check_open()?;
        self.writes.insert(key, None);
        Ok(())
    }

    /// Commits: every write applies atomically, or none does. Returns the commit timestamp
    /// (none for a transaction that read and wrote nothing).
    ///
    /// ```no_run
    /// # async fn example(mut txn: meridian_client::Transaction) -> Result<(), meridian_client::Error> {
    /// match txn.commit().await {
    ///     Ok(ts) => println!("committed at {ts:?}"),
    ///     Err(e) if e.is_retryable() => println!("nothing applied, run it again: {e}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn commit(&mut self) -> Result<Option<Timestamp>, Error> {
        let keys: Vec<Key> = self.writes.keys().cloned().collect();
        let writes = self
            .writes
            .iter()
            .map(|(key, value)| Write { key: key.clone(), value: value.clone() })
            .collect();
        let outcome = self.step(SessionOp::Commit { writes }, "the commit", Some(&keys)).await;
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
    ///
    /// ```no_run
    /// # async fn example(mut txn: meridian_client::Transaction) -> Result<(), meridian_client::Error> {
    /// txn.abort().await?;
    /// assert!(txn.is_over());
    /// # Ok(()) }
    /// ```
    pub async fn abort(&mut self) -> Result<(), Error> {
        self.step(SessionOp::Abort, "the abort", Some(&[])).await?;
        self.over = Some("it was aborted".into());
        Ok(())
    }

    /// Asks the coordinator to abort without waiting (for `Drop`, and an unanswered step).
    fn abort_quietly(&mut self) {
        let request = SessionRequest {
            id: self.client.request_id(),
            session: self.session,
            op: SessionOp::Abort,
        };
        self.client.send(ClientCall::Session(request));
    }
}

impl Drop for Transaction {
    fn drop(&mut self) {
        if self.over.is_none() {
            self.abort_quietly();
        }
    }
}
