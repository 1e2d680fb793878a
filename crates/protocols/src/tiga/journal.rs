//! A tiga (or luigi) leader's durable journal: what a leader must find again after a crash
//! to go on leading its shard in the same view (leaders are fixed until the view change
//! exists), and the rule that nothing it sends runs ahead of it.
//!
//! **What is written** ([`Record`], one persist per node step, group-committed by the
//! driver):
//! - `Logged`: an entry appended to the leader's log (transaction, timestamp, body). The log
//!   is the shard's order; the store, the key hashes, the replies and the votes all follow
//!   from it and from the votes below, so they are rebuilt by running it again.
//! - `Proposed`: a timestamp the leader proposed to the other leaders of a multi-shard
//!   transaction (with its body). Peers keep the first proposal they hear from a shard, so a
//!   restarted leader must propose the same timestamp again, not a new one.
//! - `Vote`: another leader's vote (and the outputs its pieces pass here). A restarted leader
//!   runs its log again and needs the same votes and inputs to reach the same outcomes; a
//!   peer that decided since would answer without its outputs.
//! - `Promised`: a closed timestamp promised to snapshot reads or followers (nothing new may
//!   land at or below it).
//! - `Told` (luigi): a watermark told to a worker: a restarted luigi leader holds the
//!   worker's new transactions above it, and counts its log entries above it unreplicated
//!   until its followers' acknowledgements say otherwise.
//!
//! **Sends wait for the disk.** Every message a node sends waits until every record issued
//! before it is durable ([`Journal::defer`], flushed by [`Journal::persisted`]). So a fast
//! reply, a vote, a log synchronisation or a proposal never speaks of anything a crash can
//! take back: whatever a coordinator, a follower or another leader heard from this leader is
//! in its journal. Followers journal nothing: their logs are rebuilt from the leader (a
//! restarted follower rejoins by a state transfer), which is sound while leaders are fixed.
//! The view change will need followers' logs durable too.
//!
//! Records are keyed `tiga/` ‖ sequence number (big-endian), so the driver's ordered map
//! returns them in the order written. Nothing is deleted: there are no checkpoints yet, so
//! the journal grows with the run and a restart replays all of it.

use super::node::TxnBody;
use meridian_core::node::PersistRecord;
use meridian_core::txn::PieceOutput;
use meridian_core::NodeId;
use meridian_core::{ShardId, Timestamp, TxnId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// The key prefix of every journal record.
pub const KEY_PREFIX: &[u8] = b"tiga/";

/// Sends held back while records are not yet durable; beyond it a send is dropped and
/// counted (every tiga message is repeated by its sender until answered).
pub const DEFERRED_SENDS_MAX: usize = 1 << 16;

/// One journal record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    /// The leader of `shard` appended `body`'s transaction to its log at `ts`.
    Logged {
        /// The shard.
        shard: ShardId,
        /// The log entry's timestamp.
        ts: Timestamp,
        /// The transaction.
        body: TxnBody,
    },
    /// The leader of `shard` proposed `ts` for `body`'s transaction.
    Proposed {
        /// The shard.
        shard: ShardId,
        /// The proposal.
        ts: Timestamp,
        /// The transaction.
        body: TxnBody,
    },
    /// The leader of `shard` heard the vote of `from`'s leader on `txn`.
    Vote {
        /// The shard.
        shard: ShardId,
        /// The transaction.
        txn: TxnId,
        /// The voting shard.
        from: ShardId,
        /// Its pieces ran without an abort.
        ok: bool,
        /// Outputs of its pieces that pieces of `shard` take.
        outputs: Vec<(u32, PieceOutput)>,
    },
    /// The leader of `shard` promised `ts` closed.
    Promised {
        /// The shard.
        shard: ShardId,
        /// The closed timestamp.
        ts: Timestamp,
    },
    /// Luigi: the leader of `shard` told `worker` its watermark is `ts` (everything of the
    /// worker's at or below it is replicated, and nothing new lands there).
    Told {
        /// The shard.
        shard: ShardId,
        /// The worker (a coordinator node).
        worker: NodeId,
        /// The watermark.
        ts: Timestamp,
    },
}

/// The votes a leader heard on one transaction: per voting shard, its vote and the outputs
/// it passed.
pub type VotesHeard = BTreeMap<ShardId, (bool, Vec<(u32, PieceOutput)>)>;

/// What one shard's leader finds in its journal.
#[derive(Clone, Debug, Default)]
pub struct Recovered {
    /// The log, in order, with the bodies.
    pub log: Vec<(Timestamp, TxnBody)>,
    /// Proposals for transactions not in the log: the last proposal made for each.
    pub proposals: BTreeMap<TxnId, (Timestamp, TxnBody)>,
    /// Votes heard, per transaction and voting shard (the first of each).
    pub votes: BTreeMap<TxnId, VotesHeard>,
    /// The highest closed timestamp promised.
    pub promised: Timestamp,
    /// Luigi: per worker, the highest watermark told.
    pub told: BTreeMap<NodeId, Timestamp>,
}

/// Reads the journal out of the driver's durable map: per shard, what its leader wrote, and
/// the next sequence number. A record that does not decode, or a log that lists one
/// transaction twice, is an error (a disk that is not this protocol's, or damaged): the
/// node refuses to start rather than lead from a log it cannot trust.
pub fn recover(
    durable: &BTreeMap<Vec<u8>, Vec<u8>>,
) -> Result<(BTreeMap<ShardId, Recovered>, u64), String> {
    let mut shards: BTreeMap<ShardId, Recovered> = BTreeMap::new();
    let mut next = 0u64;
    // Only keys under the prefix: bounded by the map.
    for (key, value) in durable.range(KEY_PREFIX.to_vec()..) {
        let Some(seq) = key.strip_prefix(KEY_PREFIX) else { break };
        let seq: [u8; 8] =
            seq.try_into().map_err(|_| format!("tiga journal: a key of {} bytes", key.len()))?;
        let seq = u64::from_be_bytes(seq);
        let record: Record = postcard::from_bytes(value)
            .map_err(|e| format!("tiga journal: record {seq} does not decode: {e}"))?;
        next = seq + 1;
        match record {
            Record::Logged { shard, ts, body } => {
                let recovered = shards.entry(shard).or_default();
                recovered.proposals.remove(&body.txn);
                recovered.log.push((ts, body));
            }
            Record::Proposed { shard, ts, body } => {
                let recovered = shards.entry(shard).or_default();
                recovered.proposals.insert(body.txn, (ts, body));
            }
            Record::Vote { shard, txn, from, ok, outputs } => {
                let votes = shards.entry(shard).or_default().votes.entry(txn).or_default();
                votes.entry(from).or_insert((ok, outputs));
            }
            Record::Promised { shard, ts } => {
                let recovered = shards.entry(shard).or_default();
                recovered.promised = recovered.promised.max(ts);
            }
            Record::Told { shard, worker, ts } => {
                let told = shards.entry(shard).or_default().told.entry(worker).or_default();
                *told = (*told).max(ts);
            }
        }
    }
    for (shard, recovered) in &mut shards {
        let mut seen = std::collections::BTreeSet::new();
        for (_, body) in &recovered.log {
            if !seen.insert(body.txn) {
                return Err(format!("tiga journal: {shard:?}'s log lists {} twice", body.txn));
            }
        }
        // A proposal whose transaction was logged since is settled by the log (a proposal
        // record written after the entry's, as an answer, is not a new one).
        recovered.proposals.retain(|txn, _| !seen.contains(txn));
    }
    Ok((shards, next))
}

/// A send held back until the records before it are durable.
#[derive(Debug)]
struct Deferred<M> {
    /// The persist it waits for.
    token: u64,
    /// The causal chain of wide-area legs it was sent on (measurement only).
    hops: u16,
    to: NodeId,
    msg: M,
}

/// The journal's writer: records of the step in progress, and sends waiting for the disk.
#[derive(Debug)]
pub struct Journal<M> {
    next_seq: u64,
    records: Vec<PersistRecord>,
    /// The last persist token issued, and the last completed.
    issued: u64,
    done: u64,
    deferred: VecDeque<Deferred<M>>,
    /// Sends dropped for want of room.
    pub dropped_total: u64,
    /// Records written.
    pub records_total: u64,
}

impl<M> Journal<M> {
    /// A journal whose next record is `next_seq`.
    pub fn new(next_seq: u64) -> Self {
        Self {
            next_seq,
            records: Vec::new(),
            issued: 0,
            done: 0,
            deferred: VecDeque::new(),
            dropped_total: 0,
            records_total: 0,
        }
    }

    /// Queues `record` for the step in progress.
    pub fn write(&mut self, record: &Record) {
        let mut key = KEY_PREFIX.to_vec();
        key.extend_from_slice(&self.next_seq.to_be_bytes());
        self.next_seq += 1;
        let value = postcard::to_allocvec(record).expect("records encode");
        self.records.push(PersistRecord { key, value: Some(value) });
        self.records_total += 1;
    }

    /// Ends a step: its records, if any, as one persist request under a fresh token.
    pub fn take_batch(&mut self) -> Option<(u64, Vec<PersistRecord>)> {
        if self.records.is_empty() {
            return None;
        }
        self.issued += 1;
        Some((self.issued, std::mem::take(&mut self.records)))
    }

    /// True while some record issued is not durable yet: sends must wait.
    pub fn waiting(&self) -> bool {
        self.done < self.issued
    }

    /// Holds `msg` back until every record issued so far is durable.
    pub fn defer(&mut self, hops: u16, to: NodeId, msg: M) {
        if self.deferred.len() >= DEFERRED_SENDS_MAX {
            self.dropped_total += 1;
            return;
        }
        self.deferred.push_back(Deferred { token: self.issued, hops, to, msg });
    }

    /// The persist `token` completed (completions come in order): the sends it held back,
    /// with their causal chains.
    pub fn persisted(&mut self, token: u64) -> Vec<(u16, NodeId, M)> {
        debug_assert!(token > self.done && token <= self.issued, "persists complete in order");
        self.done = self.done.max(token);
        let mut ready = Vec::new();
        while self.deferred.front().is_some_and(|d| d.token <= self.done) {
            let d = self.deferred.pop_front().expect("just seen");
            ready.push((d.hops, d.to, d.msg));
        }
        ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::txn::TxnRequest;

    fn body(seq: u64) -> TxnBody {
        TxnBody {
            txn: TxnId { origin: NodeId(3), incarnation: 0, seq },
            ts: Timestamp(seq * 10),
            sent_at: 0,
            request: TxnRequest { proc: meridian_core::txn::ProcId(1), args: Vec::new() },
            home: ShardId(0),
            decided_below: 0,
        }
    }

    fn map(journal: &mut Journal<()>) -> BTreeMap<Vec<u8>, Vec<u8>> {
        let (_, records) = journal.take_batch().expect("records");
        records.into_iter().map(|r| (r.key, r.value.expect("put"))).collect()
    }

    #[test]
    fn the_journal_reads_back_what_was_written_in_order() {
        let mut journal = Journal::new(0);
        let s = ShardId(1);
        journal.write(&Record::Proposed { shard: s, ts: Timestamp(7), body: body(1) });
        journal.write(&Record::Proposed { shard: s, ts: Timestamp(8), body: body(2) });
        journal.write(&Record::Logged { shard: s, ts: Timestamp(9), body: body(1) });
        journal.write(&Record::Vote {
            shard: s,
            txn: body(1).txn,
            from: ShardId(0),
            ok: true,
            outputs: Vec::new(),
        });
        journal.write(&Record::Promised { shard: s, ts: Timestamp(5) });
        journal.write(&Record::Promised { shard: s, ts: Timestamp(4) });
        journal.write(&Record::Told { shard: s, worker: NodeId(2), ts: Timestamp(6) });
        journal.write(&Record::Told { shard: s, worker: NodeId(2), ts: Timestamp(3) });
        let durable = map(&mut journal);
        let (shards, next) = recover(&durable).expect("recovers");
        assert_eq!(next, 8);
        let r = &shards[&s];
        assert_eq!(r.log, vec![(Timestamp(9), body(1))]);
        // The logged transaction's proposal is settled; the other stays.
        assert_eq!(r.proposals.keys().copied().collect::<Vec<_>>(), vec![body(2).txn]);
        assert!(r.votes[&body(1).txn][&ShardId(0)].0);
        assert_eq!(r.promised, Timestamp(5));
        assert_eq!(r.told[&NodeId(2)], Timestamp(6));
        // Other keys of the map are not the journal's.
        let mut other = durable.clone();
        other.insert(b"raft/0".to_vec(), vec![1, 2, 3]);
        other.insert(b"u".to_vec(), vec![1]);
        assert_eq!(recover(&other).expect("recovers").0[&s].log.len(), 1);
    }

    #[test]
    fn a_damaged_journal_refuses_to_start() {
        let mut journal = Journal::new(0);
        let s = ShardId(0);
        journal.write(&Record::Logged { shard: s, ts: Timestamp(1), body: body(1) });
        journal.write(&Record::Logged { shard: s, ts: Timestamp(2), body: body(1) });
        let twice = map(&mut journal);
        assert!(recover(&twice).unwrap_err().contains("twice"));
        let mut garbage = BTreeMap::new();
        garbage.insert([KEY_PREFIX, &0u64.to_be_bytes()].concat(), vec![0xff; 3]);
        assert!(recover(&garbage).unwrap_err().contains("does not decode"));
        let mut short = BTreeMap::new();
        short.insert([KEY_PREFIX, &[1u8, 2]].concat(), vec![0]);
        assert!(recover(&short).unwrap_err().contains("bytes"));
    }

    #[test]
    fn sends_wait_for_every_record_issued_before_them() {
        let mut journal: Journal<u32> = Journal::new(0);
        assert!(!journal.waiting());
        journal.write(&Record::Promised { shard: ShardId(0), ts: Timestamp(1) });
        let (t1, _) = journal.take_batch().expect("one record");
        assert!(journal.waiting());
        journal.defer(0, NodeId(1), 1);
        journal.write(&Record::Promised { shard: ShardId(0), ts: Timestamp(2) });
        let (t2, _) = journal.take_batch().expect("one record");
        journal.defer(2, NodeId(2), 2);
        assert!(journal.take_batch().is_none(), "no records, no persist");
        assert_eq!(journal.persisted(t1), vec![(0, NodeId(1), 1)]);
        assert!(journal.waiting());
        assert_eq!(journal.persisted(t2), vec![(2, NodeId(2), 2)]);
        assert!(!journal.waiting());
    }
}
