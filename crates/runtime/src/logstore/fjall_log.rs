//! The durable log store on fjall (the stack's LSM key-value store): the same key-value
//! records as the log file ([`super`]), in one keyspace of one fjall database per
//! process, `DIR/fjall`. A group commit is one write batch, then one `persist(SyncData)` in
//! `fsync` mode: fjall's keyspaces share one journal, so one sync covers the batch.
//!
//! Recovery is fjall's: its journal is checksummed and a torn tail is dropped when the
//! database opens, but fjall does not say how many bytes it dropped, and what it does with
//! corruption in the middle of its journal is its own policy. The log file keeps exact control
//! of both (discard and report a torn tail with its size, refuse corruption in the middle), which is why it stays the default.

use super::Recovered;
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use meridian_core::node::PersistRecord;
use std::path::Path;

/// Name of the keyspace holding the records.
const KEYSPACE: &str = "raft";
/// The database's folder inside the data directory.
pub const FOLDER: &str = "fjall";

/// One process's fjall database and its records keyspace.
pub struct FjallLog {
    db: Database,
    records: Keyspace,
}

fn fjall_error(dir: &Path, what: &str, e: fjall::Error) -> String {
    format!("{}: {what}: {e}", dir.join(FOLDER).display())
}

impl FjallLog {
    /// Opens (or creates) the database in `dir` and reads every live record. The caller has
    /// checked the directory's identity.
    pub fn open(dir: &Path) -> Result<(Self, Recovered), String> {
        let db = Database::builder(dir.join(FOLDER))
            .open()
            .map_err(|e| fjall_error(dir, "cannot open the fjall database", e))?;
        let records = db
            .keyspace(KEYSPACE, KeyspaceCreateOptions::default)
            .map_err(|e| fjall_error(dir, "cannot open its keyspace", e))?;
        let mut recovered = Recovered::default();
        for guard in records.iter() {
            let (key, value) =
                guard.into_inner().map_err(|e| fjall_error(dir, "cannot read a record", e))?;
            recovered.records.insert(key.to_vec(), value.to_vec());
        }
        Ok((Self { db, records }, recovered))
    }

    /// Writes one batch atomically (to the operating system's buffers).
    pub fn append(&mut self, records: &[PersistRecord]) -> Result<(), String> {
        let mut batch = self.db.batch();
        for record in records {
            match &record.value {
                Some(value) => batch.insert(&self.records, record.key.clone(), value.clone()),
                None => batch.remove(&self.records, record.key.clone()),
            }
        }
        batch.commit().map_err(|e| format!("fjall write failed: {e}"))
    }

    /// Makes everything written durable.
    pub fn sync(&mut self) -> Result<(), String> {
        self.db.persist(PersistMode::SyncData).map_err(|e| format!("fjall sync failed: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_a_reopen_with_deletes_applied() {
        let dir = std::env::temp_dir().join(format!("meridian-fjall-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let record =
            |k: u8, v: Option<u8>| PersistRecord { key: vec![k], value: v.map(|v| vec![v; 4]) };
        {
            let (mut log, recovered) = FjallLog::open(&dir).unwrap();
            assert!(recovered.records.is_empty());
            log.append(&[record(1, Some(1)), record(2, Some(2))]).unwrap();
            log.append(&[record(1, None), record(3, Some(3))]).unwrap();
            log.sync().unwrap();
        }
        let (_, recovered) = FjallLog::open(&dir).unwrap();
        let keys: Vec<Vec<u8>> = recovered.records.keys().cloned().collect();
        assert_eq!(keys, vec![vec![2], vec![3]]);
        assert_eq!(recovered.records[&vec![3]], vec![3; 4]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
