//! The simulated disk of one node. Writes land in a volatile layer (the page cache); a synced
//! persist moves everything written so far to the durable layer when it completes; a crash
//! throws the volatile layer away. Completions are FIFO, like a single write queue.

use meridian_core::node::PersistRecord;
use meridian_core::Time;
use std::collections::BTreeMap;

/// One node's disk.
#[derive(Debug, Default)]
pub struct SimDisk {
    durable: BTreeMap<Vec<u8>, Vec<u8>>,
    volatile: Vec<PersistRecord>,
    complete_at_last: Time,
}

impl SimDisk {
    /// Queues `records`; returns when the write completes (never before an earlier one).
    pub fn write(&mut self, records: Vec<PersistRecord>, ready_at: Time) -> Time {
        self.volatile.extend(records);
        self.complete_at_last = self.complete_at_last.max(ready_at);
        self.complete_at_last
    }

    /// Makes everything written so far durable.
    pub fn sync(&mut self) {
        for record in self.volatile.drain(..) {
            match record.value {
                Some(value) => self.durable.insert(record.key, value),
                None => self.durable.remove(&record.key),
            };
        }
    }

    /// Loses everything not yet synced.
    pub fn crash(&mut self) {
        self.volatile.clear();
    }

    /// What survives a crash.
    pub fn durable(&self) -> &BTreeMap<Vec<u8>, Vec<u8>> {
        &self.durable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: u8, value: Option<u8>) -> PersistRecord {
        PersistRecord { key: vec![key], value: value.map(|v| vec![v]) }
    }

    #[test]
    fn unsynced_writes_are_lost_on_crash_and_synced_ones_survive() {
        let mut disk = SimDisk::default();
        assert_eq!(disk.write(vec![record(1, Some(10))], 50), 50);
        disk.sync();
        assert_eq!(
            disk.write(vec![record(2, Some(20)), record(1, None)], 40),
            50,
            "completions stay FIFO"
        );
        disk.crash();
        assert_eq!(disk.durable().get(&vec![1]), Some(&vec![10]));
        assert_eq!(disk.durable().get(&vec![2]), None);
        disk.write(vec![record(2, Some(21)), record(1, None)], 60);
        disk.sync();
        assert_eq!(disk.durable().get(&vec![1]), None);
        assert_eq!(disk.durable().get(&vec![2]), Some(&vec![21]));
    }
}
