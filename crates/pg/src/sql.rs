//! How Meridian's keys live in PostgreSQL, and one transaction run through a connection.
//!
//! Every workload table (a key's first byte) is a table `tNNN (k bytea PRIMARY KEY, v bytea)`
//! holding the whole order-preserving key, so a scan is a range scan on the primary key (bytea
//! compares bytewise, as keys do). A procedure runs as in a shard's leader: piece by piece in
//! plan order, each reading its declared keys and scans (one query per table and per scan),
//! then running the same `run_piece` the protocols use (with its contract checks) over what it
//! read, then writing (one upsert and one delete per table). All pieces of one request run in
//! one `BEGIN ISOLATION LEVEL ... COMMIT`. Just before `COMMIT` a transaction takes a number
//! from a sequence: a later writer of a row waits for the earlier one's commit before it can
//! get there, so the numbers order conflicting writes as PostgreSQL applied them, which is
//! what the workloads' last-writer checks need of a commit timestamp.

use meridian_core::key::{Key, Value};
use meridian_core::txn::{
    Args, Partitioner, PieceOutput, PlanContext, ProcError, Procedure, ScanRange, ShardTarget,
    PIECES_MAX,
};
use meridian_core::{ShardId, Timestamp, TxnId};
use meridian_protocols::kit::exec::{run_piece, Overlay, Placement, ReadSource};
use meridian_storage::{Version, VersionState};
use std::collections::{BTreeMap, BTreeSet};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Statement};

/// The table holding keys of workload table `id`.
pub fn table_name(id: u8) -> String {
    format!("t{id:03}")
}

/// The sequence that orders commits.
pub const COMMIT_SEQUENCE: &str = "meridian_commit_seq";

/// `CREATE TABLE` for workload table `id`.
pub fn create_table_sql(id: u8) -> String {
    format!("CREATE TABLE IF NOT EXISTS {} (k bytea PRIMARY KEY, v bytea NOT NULL)", table_name(id))
}

/// The isolation level transactions run at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// `SERIALIZABLE` (PostgreSQL's serializable snapshot isolation).
    Serializable,
    /// `REPEATABLE READ` (snapshot isolation in PostgreSQL).
    RepeatableRead,
    /// `READ COMMITTED`.
    ReadCommitted,
}

impl Isolation {
    /// Parses `--pg-isolation`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "serializable" => Ok(Self::Serializable),
            "repeatable-read" => Ok(Self::RepeatableRead),
            "read-committed" => Ok(Self::ReadCommitted),
            other => Err(format!(
                "--pg-isolation '{other}': expected serializable, repeatable-read or read-committed"
            )),
        }
    }

    /// The flag's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Self::Serializable => "serializable",
            Self::RepeatableRead => "repeatable-read",
            Self::ReadCommitted => "read-committed",
        }
    }

    fn begin(self) -> &'static str {
        match self {
            Self::Serializable => "BEGIN ISOLATION LEVEL SERIALIZABLE",
            Self::RepeatableRead => "BEGIN ISOLATION LEVEL REPEATABLE READ",
            Self::ReadCommitted => "BEGIN ISOLATION LEVEL READ COMMITTED",
        }
    }
}

/// The table of a key (its first byte); the empty key has none.
fn table_of(key: &Key) -> Result<u8, ProcError> {
    key.table_id().ok_or_else(|| ProcError::Contract("a piece named the empty key".into()))
}

/// The per-table pieces of a scan: `(table, lower bound, upper bound)` in scan order. A range
/// may span tables (its keys compare bytewise, table byte first).
pub fn scan_parts(range: &ScanRange) -> Vec<(u8, Vec<u8>, Option<Vec<u8>>)> {
    if range.start >= range.end {
        return Vec::new();
    }
    let start = range.start.as_bytes();
    let end = range.end.as_bytes();
    let first = start.first().copied().unwrap_or(0);
    let Some(&last) = end.first() else { return Vec::new() };
    let mut parts: Vec<_> = (first..=last)
        .map(|t| {
            let lower = if t == first && !start.is_empty() { start.to_vec() } else { vec![t] };
            let upper = (t == last).then(|| end.to_vec());
            (t, lower, upper)
        })
        .filter(|(_, lower, upper)| upper.as_ref().is_none_or(|u| lower < u))
        .collect();
    if range.reverse {
        parts.reverse();
    }
    parts
}

/// Why an attempt did not commit.
#[derive(Debug)]
pub enum AttemptError {
    /// PostgreSQL aborted it for a conflict: retry (40001, 40P01).
    Conflict(meridian_core::txn::AbortCause),
    /// These workload tables do not exist yet: create them and retry.
    MissingTables(BTreeSet<u8>),
    /// The procedure cannot run (bad arguments, broken contract): not retried.
    Procedure(ProcError),
    /// Any other error before `COMMIT` was sent: it did not commit.
    Failed(String),
    /// `COMMIT` was sent and no answer came back: it may or may not have committed.
    Unknown(String),
}

/// What a committed or user-aborted attempt produced.
#[derive(Debug)]
pub enum Finished {
    /// Committed, with its place in the commit order and the pieces' outputs.
    Committed { ts: Timestamp, outputs: Vec<PieceOutput> },
    /// A piece asked to abort; everything was rolled back.
    UserAborted(String),
}

/// Keys and their new values, side by side (the two arrays of an upsert).
type KeysAndValues<'a> = (Vec<&'a [u8]>, Vec<&'a [u8]>);

/// Prepared statements of one connection, made on first use.
#[derive(Default)]
pub struct Statements {
    get: BTreeMap<u8, Statement>,
    scan: BTreeMap<(u8, bool, bool), Statement>,
    put: BTreeMap<u8, Statement>,
    delete: BTreeMap<u8, Statement>,
    next_ts: Option<Statement>,
}

/// What a piece read, served to `run_piece`.
struct Fetched {
    rows: BTreeMap<Key, Version>,
    scans: Vec<(ScanRange, Vec<(Key, Version)>)>,
}

impl ReadSource for Fetched {
    fn read(&self, key: &Key) -> Option<&Version> {
        self.rows.get(key)
    }

    fn scan(&self, range: &ScanRange) -> Vec<(Key, Version)> {
        self.scans
            .iter()
            .find(|(r, _)| r == range)
            .map(|(_, rows)| rows.clone())
            .unwrap_or_default()
    }
}

fn version(value: Value) -> Version {
    Version {
        ts: Timestamp::ZERO,
        value: Some(value),
        writer: TxnId::LOAD,
        state: VersionState::Committed,
    }
}

/// Maps a driver error: conflicts PostgreSQL asks to retry, or a failure.
fn classify(error: &tokio_postgres::Error) -> AttemptError {
    use meridian_core::txn::AbortCause;
    match error.code() {
        Some(code) if *code == SqlState::T_R_SERIALIZATION_FAILURE => {
            AttemptError::Conflict(AbortCause::Serialization)
        }
        Some(code) if *code == SqlState::T_R_DEADLOCK_DETECTED => {
            AttemptError::Conflict(AbortCause::Deadlock)
        }
        _ => AttemptError::Failed(error.to_string()),
    }
}

/// One connection's transactions.
pub struct Session<'a> {
    /// The connection.
    pub client: &'a Client,
    /// Its prepared statements.
    pub statements: &'a mut Statements,
    /// Tables known to exist.
    pub tables: &'a BTreeSet<u8>,
    /// The run's partitioner (pieces are checked against it as on a shard).
    pub partitioner: &'a Partitioner,
    /// The isolation level.
    pub isolation: Isolation,
}

impl Session<'_> {
    /// Runs one attempt of `procedure`: `BEGIN`, every piece, `COMMIT`. Rolls back whatever
    /// fails before the commit.
    pub async fn attempt(
        &mut self,
        procedure: &dyn Procedure,
        args: &Args,
    ) -> Result<Finished, AttemptError> {
        let plan = procedure
            .plan(args, PlanContext { partitioner: self.partitioner })
            .map_err(AttemptError::Procedure)?;
        if plan.len() > PIECES_MAX {
            return Err(AttemptError::Procedure(ProcError::Contract(format!(
                "{} pieces is over {PIECES_MAX}",
                plan.len()
            ))));
        }
        self.client.batch_execute(self.isolation.begin()).await.map_err(|e| classify(&e))?;
        let result = self.pieces(procedure, args, &plan).await;
        let outputs = match result {
            Ok(Ok(outputs)) => outputs,
            Ok(Err(why)) => {
                self.rollback().await?;
                return Ok(Finished::UserAborted(why));
            }
            Err(error) => {
                self.rollback().await?;
                return Err(error);
            }
        };
        let ts = match self.next_ts().await {
            Ok(ts) => ts,
            Err(error) => {
                self.rollback().await?;
                return Err(error);
            }
        };
        match self.client.batch_execute("COMMIT").await {
            Ok(()) => Ok(Finished::Committed { ts, outputs }),
            // PostgreSQL answered: the commit failed (serializable checks run at commit).
            Err(error) if error.as_db_error().is_some() => Err(classify(&error)),
            Err(error) => Err(AttemptError::Unknown(error.to_string())),
        }
    }

    async fn rollback(&mut self) -> Result<(), AttemptError> {
        self.client
            .batch_execute("ROLLBACK")
            .await
            .map_err(|e| AttemptError::Failed(format!("cannot roll back: {e}")))
    }

    /// Runs the pieces in plan order; `Ok(Err(why))` is a user abort.
    async fn pieces(
        &mut self,
        procedure: &dyn Procedure,
        args: &Args,
        plan: &[meridian_core::txn::PieceSpec],
    ) -> Result<Result<Vec<PieceOutput>, String>, AttemptError> {
        let mut outputs: Vec<PieceOutput> = Vec::with_capacity(plan.len());
        for (index, spec) in plan.iter().enumerate() {
            if spec.deps.iter().any(|&d| d as usize >= index) {
                return Err(AttemptError::Procedure(ProcError::Contract(format!(
                    "piece {index} depends on a later piece"
                ))));
            }
            let inputs: Vec<&PieceOutput> =
                spec.deps.iter().map(|&d| &outputs[d as usize]).collect();
            let piece = index as u32;
            let keys = procedure.keys(piece, args, &inputs).map_err(AttemptError::Procedure)?;
            let mut needed = BTreeSet::new();
            for key in keys.reads.iter().chain(&keys.writes) {
                needed.insert(table_of(key).map_err(AttemptError::Procedure)?);
            }
            for range in &keys.scans {
                needed.extend(scan_parts(range).into_iter().map(|(t, _, _)| t));
            }
            let missing: BTreeSet<u8> = needed.difference(self.tables).copied().collect();
            if !missing.is_empty() {
                return Err(AttemptError::MissingTables(missing));
            }
            let fetched = self.fetch(&keys.reads, &keys.scans).await?;
            let shard = match spec.target {
                ShardTarget::Shard(shard) => shard,
                ShardTarget::Any => ShardId(0),
            };
            let placement = Placement { shard, partitioner: self.partitioner };
            let run =
                run_piece(procedure, placement, (piece, args, &inputs), &fetched, &Overlay::new())
                    .map_err(AttemptError::Procedure)?;
            match run.effects {
                Ok(effects) => {
                    let mut writes: BTreeMap<Key, Option<Value>> = BTreeMap::new();
                    for write in effects.writes {
                        writes.insert(write.key, write.value);
                    }
                    self.write(writes).await?;
                    outputs.push(effects.output);
                }
                Err(abort) => return Ok(Err(abort.0)),
            }
        }
        Ok(Ok(outputs))
    }

    async fn fetch(&mut self, reads: &[Key], scans: &[ScanRange]) -> Result<Fetched, AttemptError> {
        let mut by_table: BTreeMap<u8, Vec<&[u8]>> = BTreeMap::new();
        for key in reads {
            by_table
                .entry(table_of(key).map_err(AttemptError::Procedure)?)
                .or_default()
                .push(key.as_bytes());
        }
        let mut rows = BTreeMap::new();
        for (table, keys) in by_table {
            let statement = self.get_statement(table).await?;
            for row in self.client.query(&statement, &[&keys]).await.map_err(|e| classify(&e))? {
                rows.insert(Key::from(row.get::<_, Vec<u8>>(0)), version(row.get(1)));
            }
        }
        let mut scanned = Vec::with_capacity(scans.len());
        for range in scans {
            let mut found = Vec::new();
            for (table, lower, upper) in scan_parts(range) {
                let left = i64::from(range.limit) - found.len() as i64;
                if left <= 0 {
                    break;
                }
                let statement = self.scan_statement(table, range.reverse, upper.is_some()).await?;
                let result = match &upper {
                    Some(upper) => self.client.query(&statement, &[&lower, upper, &left]).await,
                    None => self.client.query(&statement, &[&lower, &left]).await,
                };
                for row in result.map_err(|e| classify(&e))? {
                    found.push((Key::from(row.get::<_, Vec<u8>>(0)), version(row.get(1))));
                }
            }
            scanned.push((range.clone(), found));
        }
        Ok(Fetched { rows, scans: scanned })
    }

    async fn write(&mut self, writes: BTreeMap<Key, Option<Value>>) -> Result<(), AttemptError> {
        let mut puts: BTreeMap<u8, KeysAndValues<'_>> = BTreeMap::new();
        let mut deletes: BTreeMap<u8, Vec<&[u8]>> = BTreeMap::new();
        for (key, value) in &writes {
            let table = table_of(key).map_err(AttemptError::Procedure)?;
            match value {
                Some(value) => {
                    let entry = puts.entry(table).or_default();
                    entry.0.push(key.as_bytes());
                    entry.1.push(value);
                }
                None => deletes.entry(table).or_default().push(key.as_bytes()),
            }
        }
        for (table, (keys, values)) in puts {
            let statement = self.put_statement(table).await?;
            self.client.execute(&statement, &[&keys, &values]).await.map_err(|e| classify(&e))?;
        }
        for (table, keys) in deletes {
            let statement = self.delete_statement(table).await?;
            self.client.execute(&statement, &[&keys]).await.map_err(|e| classify(&e))?;
        }
        Ok(())
    }

    async fn next_ts(&mut self) -> Result<Timestamp, AttemptError> {
        if self.statements.next_ts.is_none() {
            let sql = format!("SELECT nextval('{COMMIT_SEQUENCE}')");
            self.statements.next_ts = Some(self.prepare(&sql).await?);
        }
        let statement = self.statements.next_ts.clone().expect("prepared above");
        let row = self.client.query_one(&statement, &[]).await.map_err(|e| classify(&e))?;
        let n: i64 = row.get(0);
        Ok(Timestamp(n.max(0) as u64))
    }

    async fn prepare(&self, sql: &str) -> Result<Statement, AttemptError> {
        self.client.prepare(sql).await.map_err(|e| classify(&e))
    }

    async fn get_statement(&mut self, table: u8) -> Result<Statement, AttemptError> {
        if let Some(s) = self.statements.get.get(&table) {
            return Ok(s.clone());
        }
        let sql = format!("SELECT k, v FROM {} WHERE k = ANY($1)", table_name(table));
        let statement = self.prepare(&sql).await?;
        self.statements.get.insert(table, statement.clone());
        Ok(statement)
    }

    async fn scan_statement(
        &mut self,
        table: u8,
        reverse: bool,
        bounded: bool,
    ) -> Result<Statement, AttemptError> {
        if let Some(s) = self.statements.scan.get(&(table, reverse, bounded)) {
            return Ok(s.clone());
        }
        let name = table_name(table);
        let order = if reverse { "DESC" } else { "ASC" };
        let sql = if bounded {
            format!("SELECT k, v FROM {name} WHERE k >= $1 AND k < $2 ORDER BY k {order} LIMIT $3")
        } else {
            format!("SELECT k, v FROM {name} WHERE k >= $1 ORDER BY k {order} LIMIT $2")
        };
        let statement = self.prepare(&sql).await?;
        self.statements.scan.insert((table, reverse, bounded), statement.clone());
        Ok(statement)
    }

    async fn put_statement(&mut self, table: u8) -> Result<Statement, AttemptError> {
        if let Some(s) = self.statements.put.get(&table) {
            return Ok(s.clone());
        }
        let sql = format!(
            "INSERT INTO {} (k, v) SELECT * FROM unnest($1::bytea[], $2::bytea[]) \
             ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
            table_name(table)
        );
        let statement = self.prepare(&sql).await?;
        self.statements.put.insert(table, statement.clone());
        Ok(statement)
    }

    async fn delete_statement(&mut self, table: u8) -> Result<Statement, AttemptError> {
        if let Some(s) = self.statements.delete.get(&table) {
            return Ok(s.clone());
        }
        let sql = format!("DELETE FROM {} WHERE k = ANY($1)", table_name(table));
        let statement = self.prepare(&sql).await?;
        self.statements.delete.insert(table, statement.clone());
        Ok(statement)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: &[u8], end: &[u8], reverse: bool) -> ScanRange {
        ScanRange {
            start: Key::from(start.to_vec()),
            end: Key::from(end.to_vec()),
            limit: 10,
            reverse,
        }
    }

    #[test]
    fn a_scan_inside_one_table_is_one_part() {
        let parts = scan_parts(&range(&[5, 1], &[5, 9], false));
        assert_eq!(parts, vec![(5, vec![5, 1], Some(vec![5, 9]))]);
    }

    #[test]
    fn a_scan_to_the_next_table_prefix_stays_in_its_table() {
        // [5, 1] .. [6]: everything of table 5 from [5, 1]; nothing of table 6.
        let parts = scan_parts(&range(&[5, 1], &[6], false));
        assert_eq!(parts, vec![(5, vec![5, 1], None)]);
    }

    #[test]
    fn scans_spanning_tables_visit_them_in_scan_order() {
        let parts = scan_parts(&range(&[3, 7], &[5, 2], true));
        let tables: Vec<u8> = parts.iter().map(|p| p.0).collect();
        assert_eq!(tables, vec![5, 4, 3]);
        assert_eq!(parts[0], (5, vec![5], Some(vec![5, 2])));
        assert_eq!(parts[1], (4, vec![4], None));
    }

    #[test]
    fn empty_and_inverted_scans_read_nothing() {
        assert!(scan_parts(&range(&[5, 2], &[5, 2], false)).is_empty());
        assert!(scan_parts(&range(&[5, 3], &[5, 2], false)).is_empty());
        assert!(scan_parts(&range(&[], &[], false)).is_empty());
    }

    #[test]
    fn isolation_levels_parse_and_name_themselves() {
        for level in [Isolation::Serializable, Isolation::RepeatableRead, Isolation::ReadCommitted]
        {
            assert_eq!(Isolation::parse(level.name()), Ok(level));
        }
        assert!(Isolation::parse("snapshot").unwrap_err().contains("repeatable-read"));
    }
}
