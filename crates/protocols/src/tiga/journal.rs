//! A tiga (or luigi) node's durable journal: what a leader must find again after a crash to
//! go on leading its shard in the same view (leaders are fixed until the view change
//! exists), what a follower vouched for, and the rule that nothing a node sends runs ahead
//! of it.
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
//! - `Withdrawn`: a proposal dropped because another participant's leader refused the
//!   transaction (see [`super::node::TigaMsg::Refused`]); a restarted leader does not hold it
//!   again.
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
//! in its journal.
//!
//! **Followers** write what their replies vouch for: `Released` (a tail entry, with its body
//! and the fast reply's hash), `Synced` (the leader's entries taken, each with its body
//! unless a `Released` record holds it or it is not here yet), `Fetched` (such a body once
//! here), `Outcome` (a multi-shard outcome heard), `Unlisted` (tail entries dropped at a
//! leader's promise) and `Joining` (the log dropped for a state transfer: a restart rejoins).
//! A checkpoint holds a followed shard as `Image` parts (its executed prefix in a state
//! transfer's format) followed by the ordinary records of its live log; [`recover`] returns
//! them per shard as a [`FollowerRecovered`], in order.
//!
//! **Checkpoints** ([`Checkpoint`]). Every `snapshot_interval_entries` log entries a leader
//! finished or a follower executed (and after a follower installs a state transfer) a node
//! writes its whole journaled state (`Begin`, per shard its parts, the live ordinary
//! records, `End`) into the step's persist, which then deletes every earlier record. A
//! persist becomes durable whole with both drivers, and [`recover`] starts from the last
//! checkpoint that has its `End`, so the journal holds one checkpoint and what followed it,
//! and a restart runs only that.
//!
//! Records are keyed `tiga/` ‖ sequence number (big-endian), so the driver's ordered map
//! returns them in the order written.

use super::node::{StatePart, StateVersion, SyncOutcome, TigaMsg, TxnBody};
use meridian_core::key::Key;
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// A part of a checkpoint ([`Checkpoint`]).
    Checkpoint(Checkpoint),
    /// The leader of `shard` dropped the transaction it had proposed, `txn`: another
    /// participant's leader refused it (never took it, and never will), so no leader can
    /// release it. A restarted leader does not hold it again: what it released on those keys
    /// since may lie above the proposal.
    Withdrawn {
        /// The shard.
        shard: ShardId,
        /// The transaction.
        txn: TxnId,
    },
    /// A follower of `shard` released `body`'s transaction into its unsynced tail at `ts`;
    /// its fast reply (with `hash`, when one went out) vouches for it.
    Released {
        /// The shard.
        shard: ShardId,
        /// Its timestamp here.
        ts: Timestamp,
        /// The fast reply's hash (a checkpoint's copy may lack it: no reply is kept then).
        hash: Option<u64>,
        /// The transaction.
        body: TxnBody,
    },
    /// A follower of `shard` took its leader's log entries from position `at` on, each with
    /// its body unless a `Released` record holds it already or it is not here yet (a
    /// `Fetched` record follows once it is).
    Synced {
        /// The shard.
        shard: ShardId,
        /// The position of the first entry.
        at: u64,
        /// Transactions, timestamps and bodies (at most [`super::log::SYNC_ENTRIES_MAX`]).
        entries: Vec<SyncedEntry>,
    },
    /// A follower of `shard` received the body of a synced entry it lacked.
    Fetched {
        /// The shard.
        shard: ShardId,
        /// The transaction.
        body: TxnBody,
    },
    /// A follower of `shard` heard a multi-shard transaction's outcome from its leader.
    Outcome {
        /// The shard.
        shard: ShardId,
        /// The outcome.
        outcome: SyncOutcome,
    },
    /// A follower of `shard` dropped the tail entries it released at or below `through` (its
    /// leader's log will never list them there).
    Unlisted {
        /// The shard.
        shard: ShardId,
        /// The leader's promise.
        through: Timestamp,
    },
    /// A follower of `shard` dropped its log for a state transfer: what it journaled of the
    /// shard before is void, and a restart rejoins.
    Joining {
        /// The shard.
        shard: ShardId,
    },
    /// A part of a follower's image of its executed prefix, in a checkpoint (the format of a
    /// state transfer, whose checks it passes on a restart).
    Image {
        /// The shard.
        shard: ShardId,
        /// The part.
        part: StatePart,
    },
    /// The node installed this view (a view change); every checkpoint repeats the latest. A
    /// restart starts in it.
    View {
        /// The global view number.
        global: u64,
        /// Per shard, its local view number.
        local: Vec<u64>,
        /// Detective agreement.
        detective: bool,
    },
}

/// The latest view a journal holds: global number, local numbers, detective.
pub type JournaledView = (u64, Vec<u64>, bool);

/// What a journal holds: per shard what was journaled of it, the sequence numbers present,
/// and the latest view installed.
pub type Journaled = (BTreeMap<ShardId, Recovered>, Seqs, Option<JournaledView>);

/// A synced entry as a follower journals it: the transaction, its timestamp, and its body
/// where the record is the one to hold it.
pub type SyncedEntry = (TxnId, Timestamp, Option<TxnBody>);

/// What a follower journaled of one shard, in the order written (see [`FollowerRecovered`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FollowerEvent {
    /// Released into the tail at a timestamp, with the fast reply's hash.
    Released(Timestamp, Option<u64>, TxnBody),
    /// The leader's entries from a position on.
    Synced(u64, Vec<SyncedEntry>),
    /// A fetched body.
    Fetched(TxnBody),
    /// A multi-shard outcome.
    Outcome(SyncOutcome),
    /// Tail entries at or below the timestamp dropped.
    Unlisted(Timestamp),
}

/// What a follower finds in its journal for one shard: the image of its executed prefix
/// (from the last checkpoint; none: the shard's initial state at position 0) and what it
/// journaled since, to run again in order; or that it was rejoining.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FollowerRecovered {
    /// It had dropped its log for a state transfer: it rejoins.
    pub joining: bool,
    /// The executed prefix's image ([`StatePart`]s, head first), if a checkpoint wrote one.
    pub image: Vec<StatePart>,
    /// The records after it, in order.
    pub events: Vec<FollowerEvent>,
}

/// A checkpoint: the node's whole journaled state at one step, written as one persist that
/// also deletes every record before it. It opens with `Begin`, closes with `End` naming the
/// same sequence number, and between them holds, per shard the node leads, a `Head` and the
/// other parts of that shard, then the ordinary records still live (the votes heard on
/// transactions not decided yet, the open proposals, the promise and the watermarks told).
/// Recovery starts from the last checkpoint that has its `End`; what comes before it is
/// superseded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Checkpoint {
    /// A checkpoint starts; `seq` is this record's own sequence number.
    Begin {
        /// Its sequence number.
        seq: u64,
    },
    /// A shard's log position and release stamps: entries below `base` are executed and
    /// decided, and only their effects (the parts below) remain.
    Head {
        /// The shard.
        shard: ShardId,
        /// The first log position the checkpoint lists as an entry.
        base: u64,
        /// The timestamp of the entry below `base`.
        base_ts: Timestamp,
        /// The hold queue's floor: a key without a stamp counts as released here.
        stamp_floor: Timestamp,
    },
    /// Transactions logged below `base`, at their timestamps (at most [`LIST_MAX`]).
    InLog {
        /// The shard.
        shard: ShardId,
        /// Transactions and timestamps.
        logged: Vec<(TxnId, Timestamp)>,
    },
    /// Per-key release stamps (at most [`LIST_MAX`] of each).
    Stamps {
        /// The shard.
        shard: ShardId,
        /// The last released read per key.
        reads: Vec<(Key, Timestamp)>,
        /// The last released write per key.
        writes: Vec<(Key, Timestamp)>,
    },
    /// Key hashes over the whole log (at most [`LIST_MAX`]).
    Hashes {
        /// The shard.
        shard: ShardId,
        /// Per key, its hash.
        pairs: Vec<(Key, u64)>,
    },
    /// Keys written since the load with their committed versions, oldest first (about
    /// [`super::node::STATE_ROW_BYTES_MAX`] bytes).
    Rows {
        /// The shard.
        shard: ShardId,
        /// Keys and versions.
        rows: Vec<(Key, Vec<StateVersion>)>,
    },
    /// The next log entry from `base` on, in log order.
    Entry {
        /// The shard.
        shard: ShardId,
        /// The transaction.
        txn: TxnId,
        /// Its log timestamp.
        ts: Timestamp,
        /// Its body (`None` for a finished entry whose body the leader dropped).
        body: Option<TxnBody>,
        /// How far the leader got with it.
        state: EntryState,
    },
    /// Replies kept to answer resends, oldest first (at most [`LIST_MAX`]).
    Answers {
        /// The shard.
        shard: ShardId,
        /// Transactions and the reply last sent.
        answers: Vec<(TxnId, TigaMsg)>,
    },
    /// Multi-shard transactions decided here (at most [`LIST_MAX`]).
    Decided {
        /// The shard.
        shard: ShardId,
        /// Per transaction: this shard's vote, the outcome, and the inputs followers take.
        decided: Vec<(TxnId, DecidedRecord)>,
    },
    /// Per coordinator start (node, incarnation), the sequence number below which it decided
    /// everything (at most [`LIST_MAX`]): a leader that forgot a single-shard transaction
    /// below the base refuses its late copies by them, after a restart too.
    Floors {
        /// The shard.
        shard: ShardId,
        /// Coordinator, incarnation, floor.
        floors: Vec<(NodeId, u64, u64)>,
    },
    /// The checkpoint that began at `seq` is whole.
    End {
        /// The `Begin`'s sequence number.
        seq: u64,
    },
}

/// How far a leader got with a log entry of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryState {
    /// Released, not executed: it runs after the restart. `hash`: its fast reply's hash.
    Queued {
        /// The fast reply's hash.
        hash: u64,
    },
    /// Executed, waiting for other shards' votes.
    Pending(Box<PendingRecord>),
    /// Executed and finished: its writes, if any, are in the checkpoint's rows.
    Done,
}

/// A multi-shard transaction executed here and waiting for votes, as a checkpoint keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingRecord {
    /// Its writes, applied once every vote is a yes.
    pub writes: Vec<(Key, Option<Vec<u8>>)>,
    /// The keys it holds as a writer until it finishes.
    pub write_keys: Vec<Key>,
    /// This shard's vote.
    pub own_ok: bool,
    /// The votes heard so far.
    pub votes: Vec<(ShardId, bool)>,
    /// The other participant shards.
    pub others: Vec<ShardId>,
    /// Per other shard, the outputs sent with this shard's vote.
    pub feeds: Vec<(ShardId, Vec<(u32, PieceOutput)>)>,
    /// The other shards' outputs its pieces took.
    pub inputs: Vec<(u32, PieceOutput)>,
}

/// A multi-shard transaction's outcome, as a checkpoint keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecidedRecord {
    /// Its timestamp.
    pub ts: Timestamp,
    /// Every follower executed it: the record waits only for the other leaders' promises.
    pub settled: bool,
    /// This shard's vote.
    pub own: bool,
    /// Every shard voted yes.
    pub all: bool,
    /// The other shards' outputs the pieces here took (for followers).
    pub inputs: Vec<(u32, PieceOutput)>,
    /// Per other shard, the outputs of pieces here that its pieces take (sent with the
    /// vote; a view change's new leader there may ask again).
    pub feeds: Vec<(ShardId, Vec<(u32, PieceOutput)>)>,
    /// The other participant shards (a view change's new leader of one asks which of its
    /// transactions this leader logged, after the body is gone).
    pub others: Vec<ShardId>,
}

/// Items per list part of a checkpoint.
pub const LIST_MAX: usize = 4_096;

/// What a checkpoint holds for one shard.
#[derive(Clone, Debug, Default)]
pub struct ShardCheckpoint {
    /// Entries below it are represented by the rest.
    pub base: u64,
    /// The timestamp of the entry below `base`.
    pub base_ts: Timestamp,
    /// The hold queue's floor.
    pub stamp_floor: Timestamp,
    /// Transactions logged below `base`.
    pub in_log: Vec<(TxnId, Timestamp)>,
    /// Release stamps of reads and writes.
    pub reads: Vec<(Key, Timestamp)>,
    /// Release stamps of writes.
    pub writes: Vec<(Key, Timestamp)>,
    /// Key hashes over the whole log.
    pub hashes: Vec<(Key, u64)>,
    /// The store's rows written since the load.
    pub rows: Vec<(Key, Vec<StateVersion>)>,
    /// The log from `base` on.
    pub entries: Vec<(TxnId, Timestamp, Option<TxnBody>, EntryState)>,
    /// Replies kept, oldest first.
    pub answers: Vec<(TxnId, TigaMsg)>,
    /// Outcomes decided here.
    pub decided: Vec<(TxnId, DecidedRecord)>,
    /// The coordinators' decided floors.
    pub floors: Vec<(NodeId, u64, u64)>,
}

/// The votes a leader heard on one transaction: per voting shard, its vote and the outputs
/// it passed.
pub type VotesHeard = BTreeMap<ShardId, (bool, Vec<(u32, PieceOutput)>)>;

/// What one shard's leader finds in its journal.
#[derive(Clone, Debug, Default)]
pub struct Recovered {
    /// The last whole checkpoint's state of the shard, if the journal has one.
    pub checkpoint: Option<ShardCheckpoint>,
    /// The log after the checkpoint (or from the start), in order, with the bodies.
    pub log: Vec<(Timestamp, TxnBody)>,
    /// Proposals for transactions not in the log: the last proposal made for each.
    pub proposals: BTreeMap<TxnId, (Timestamp, TxnBody)>,
    /// Votes heard, per transaction and voting shard (the first of each).
    pub votes: BTreeMap<TxnId, VotesHeard>,
    /// The highest closed timestamp promised.
    pub promised: Timestamp,
    /// Luigi: per worker, the highest watermark told.
    pub told: BTreeMap<NodeId, Timestamp>,
    /// What this node journaled as the shard's follower (nothing else is then).
    pub follower: Option<FollowerRecovered>,
}

impl Recovered {
    /// True when the journal holds something of the shard's leader.
    pub fn leads(&self) -> bool {
        self.checkpoint.is_some()
            || !self.log.is_empty()
            || !self.proposals.is_empty()
            || !self.votes.is_empty()
            || self.promised > Timestamp::ZERO
            || !self.told.is_empty()
    }
}

/// The sequence numbers a journal holds: records `oldest..next` may be present.
pub type Seqs = std::ops::Range<u64>;

/// Reads the journal out of the driver's durable map: per shard, what its leader wrote since
/// the last whole checkpoint (and the checkpoint), and the sequence numbers present. A record
/// that does not decode, a log that lists one transaction twice, a checkpoint part outside a
/// checkpoint or one cut short with records after it is an error (a disk that is not this
/// protocol's, or damaged): the node refuses to start rather than lead from a log it cannot
/// trust. A checkpoint cut short at the end of the journal (a persist is written whole by
/// both drivers, so only a damaged disk does that) is ignored: what precedes it stands.
pub fn recover(
    durable: &BTreeMap<Vec<u8>, Vec<u8>>,
) -> Result<(BTreeMap<ShardId, Recovered>, Seqs), String> {
    recover_with_view(durable).map(|(shards, seqs, _)| (shards, seqs))
}

/// [`recover`], and the latest view the journal holds ([`Record::View`]). One piece: a single
/// pass over the records in the order written, an arm of a line or two per kind of record.
pub fn recover_with_view(durable: &BTreeMap<Vec<u8>, Vec<u8>>) -> Result<Journaled, String> {
    let mut view: Option<JournaledView> = None;
    let mut shards: BTreeMap<ShardId, Recovered> = BTreeMap::new();
    // A checkpoint being read: its Begin's sequence number and what it holds so far.
    let mut open: Option<(u64, BTreeMap<ShardId, Recovered>)> = None;
    let mut oldest = None;
    let mut next = 0u64;
    // Only keys under the prefix: bounded by the map.
    for (key, value) in durable.range(KEY_PREFIX.to_vec()..) {
        let Some(seq) = key.strip_prefix(KEY_PREFIX) else { break };
        let seq: [u8; 8] =
            seq.try_into().map_err(|_| format!("tiga journal: a key of {} bytes", key.len()))?;
        let seq = u64::from_be_bytes(seq);
        let record: Record = postcard::from_bytes(value)
            .map_err(|e| format!("tiga journal: record {seq} does not decode: {e}"))?;
        oldest.get_or_insert(seq);
        next = seq + 1;
        let in_checkpoint = open.is_some();
        let target = match &mut open {
            Some((_, tentative)) => tentative,
            None => &mut shards,
        };
        match record {
            Record::Logged { shard, ts, body } => {
                let recovered = target.entry(shard).or_default();
                recovered.proposals.remove(&body.txn);
                recovered.log.push((ts, body));
            }
            Record::Proposed { shard, ts, body } => {
                let recovered = target.entry(shard).or_default();
                recovered.proposals.insert(body.txn, (ts, body));
            }
            Record::Vote { shard, txn, from, ok, outputs } => {
                let votes = target.entry(shard).or_default().votes.entry(txn).or_default();
                votes.entry(from).or_insert((ok, outputs));
            }
            Record::Withdrawn { shard, txn } => {
                target.entry(shard).or_default().proposals.remove(&txn);
            }
            Record::Promised { shard, ts } => {
                let recovered = target.entry(shard).or_default();
                recovered.promised = recovered.promised.max(ts);
            }
            Record::Told { shard, worker, ts } => {
                let told = target.entry(shard).or_default().told.entry(worker).or_default();
                *told = (*told).max(ts);
            }
            Record::Joining { shard } => {
                // Whatever it journaled of the shard before, as a follower or a deposed
                // leader, is void.
                let follower = FollowerRecovered { joining: true, ..Default::default() };
                let recovered = Recovered { follower: Some(follower), ..Default::default() };
                target.insert(shard, recovered);
            }
            Record::View { global, local, detective } => {
                if view.as_ref().is_some_and(|(had, ..)| *had > global) {
                    return Err(format!("tiga journal: record {seq} goes back a view"));
                }
                view = Some((global, local, detective));
            }
            Record::Image { shard, part } => {
                if !in_checkpoint {
                    return Err(format!("tiga journal: record {seq} is a checkpoint's, alone"));
                }
                let follower = target.entry(shard).or_default().follower.get_or_insert_default();
                if follower.joining || !follower.events.is_empty() {
                    return Err(format!("tiga journal: record {seq}: an image after its records"));
                }
                follower.image.push(part);
            }
            Record::Released { shard, ts, hash, body } => {
                follower_event(target, shard, FollowerEvent::Released(ts, hash, body));
            }
            Record::Synced { shard, at, entries } => {
                let named_alike = |(txn, _, body): &(TxnId, _, Option<TxnBody>)| {
                    body.as_ref().is_none_or(|b| b.txn == *txn)
                };
                if entries.len() > super::log::SYNC_ENTRIES_MAX || !entries.iter().all(named_alike)
                {
                    return Err(format!(
                        "tiga journal: record {seq}: a sync that does not hold together"
                    ));
                }
                follower_event(target, shard, FollowerEvent::Synced(at, entries));
            }
            Record::Fetched { shard, body } => {
                follower_event(target, shard, FollowerEvent::Fetched(body));
            }
            Record::Outcome { shard, outcome } => {
                follower_event(target, shard, FollowerEvent::Outcome(outcome));
            }
            Record::Unlisted { shard, through } => {
                follower_event(target, shard, FollowerEvent::Unlisted(through));
            }
            Record::Checkpoint(Checkpoint::Begin { seq: begun }) => {
                if open.is_some() || begun != seq {
                    return Err(format!("tiga journal: record {seq} begins a checkpoint amiss"));
                }
                open = Some((seq, BTreeMap::new()));
            }
            Record::Checkpoint(Checkpoint::End { seq: begun }) => match open.take() {
                Some((at, tentative)) if at == begun => shards = tentative,
                _ => return Err(format!("tiga journal: record {seq} ends no checkpoint")),
            },
            Record::Checkpoint(part) => match &mut open {
                Some((_, tentative)) => take_part(tentative, part)
                    .map_err(|e| format!("tiga journal: record {seq}: {e}"))?,
                None => return Err(format!("tiga journal: record {seq} is a checkpoint's, alone")),
            },
        }
    }
    if let Some((at, tentative)) = open {
        // Cut short: nothing may follow it.
        if tentative.values().any(|r| !r.log.is_empty()) {
            return Err(format!("tiga journal: the checkpoint at {at} is cut short"));
        }
    }
    settle_shards(&mut shards)?;
    Ok((shards, oldest.unwrap_or(next)..next, view))
}

/// The last pass over a read journal, per shard: a promotion cut short leaves the follower it
/// was, a log listing a transaction twice is an error, and a proposal whose transaction was
/// logged since is settled by the log.
fn settle_shards(shards: &mut BTreeMap<ShardId, Recovered>) -> Result<(), String> {
    for (shard, recovered) in shards.iter_mut() {
        if recovered.follower.is_some() && recovered.leads() {
            // A follower promoted at a view change writes a whole checkpoint as a leader
            // before anything else counts; leader records after its follower records without
            // one are of a promotion cut short: it restarts as the follower it was (and
            // gathers the reports again: [`super::node`]).
            let follower = recovered.follower.take();
            *recovered = Recovered { follower, ..Default::default() };
        }
        let mut seen = std::collections::BTreeSet::new();
        let checkpointed = recovered.checkpoint.iter().flat_map(|c| {
            let below = c.in_log.iter().map(|&(txn, _)| txn);
            below.chain(c.entries.iter().map(|(txn, ..)| *txn))
        });
        for txn in checkpointed.chain(recovered.log.iter().map(|(_, body)| body.txn)) {
            if !seen.insert(txn) {
                return Err(format!("tiga journal: {shard:?}'s log lists {txn} twice"));
            }
        }
        // A proposal whose transaction was logged since is settled by the log (a proposal
        // record written after the entry's, as an answer, is not a new one).
        recovered.proposals.retain(|txn, _| !seen.contains(txn));
    }
    Ok(())
}

/// Adds a follower's record of `shard` (ignored once it was rejoining: a restart rejoins).
fn follower_event(shards: &mut BTreeMap<ShardId, Recovered>, shard: ShardId, event: FollowerEvent) {
    let follower = shards.entry(shard).or_default().follower.get_or_insert_default();
    if !follower.joining {
        follower.events.push(event);
    }
}

/// Takes one checkpoint part (not `Begin` or `End`) into the checkpoint being read.
fn take_part(shards: &mut BTreeMap<ShardId, Recovered>, part: Checkpoint) -> Result<(), String> {
    fn checkpoint(
        shards: &mut BTreeMap<ShardId, Recovered>,
        shard: ShardId,
    ) -> Result<&mut ShardCheckpoint, &'static str> {
        shards.get_mut(&shard).and_then(|r| r.checkpoint.as_mut()).ok_or("a part before its head")
    }
    match part {
        Checkpoint::Begin { .. } | Checkpoint::End { .. } => {
            debug_assert!(false, "handled by the caller");
        }
        Checkpoint::Head { shard, base, base_ts, stamp_floor } => {
            let recovered = shards.entry(shard).or_default();
            if recovered.checkpoint.is_some() {
                return Err("a second head".into());
            }
            let head = ShardCheckpoint { base, base_ts, stamp_floor, ..Default::default() };
            recovered.checkpoint = Some(head);
        }
        Checkpoint::InLog { shard, logged } if logged.len() <= LIST_MAX => {
            checkpoint(shards, shard)?.in_log.extend(logged);
        }
        Checkpoint::Stamps { shard, reads, writes }
            if reads.len() <= LIST_MAX && writes.len() <= LIST_MAX =>
        {
            let c = checkpoint(shards, shard)?;
            c.reads.extend(reads);
            c.writes.extend(writes);
        }
        Checkpoint::Hashes { shard, pairs } if pairs.len() <= LIST_MAX => {
            checkpoint(shards, shard)?.hashes.extend(pairs);
        }
        Checkpoint::Rows { shard, rows } => {
            let in_order = |chain: &[StateVersion]| {
                !chain.is_empty() && chain.windows(2).all(|w| w[0].ts < w[1].ts)
            };
            if rows.iter().any(|(_, chain)| !in_order(chain)) {
                return Err("a key's versions out of timestamp order".into());
            }
            checkpoint(shards, shard)?.rows.extend(rows);
        }
        Checkpoint::Entry { shard, txn, ts, body, state } => {
            if body.as_ref().is_some_and(|b| b.txn != txn)
                || (body.is_none() && state != EntryState::Done)
            {
                return Err(format!("the entry of {txn} does not hold together"));
            }
            checkpoint(shards, shard)?.entries.push((txn, ts, body, state));
        }
        Checkpoint::Answers { shard, answers } if answers.len() <= LIST_MAX => {
            checkpoint(shards, shard)?.answers.extend(answers);
        }
        Checkpoint::Decided { shard, decided } if decided.len() <= LIST_MAX => {
            checkpoint(shards, shard)?.decided.extend(decided);
        }
        Checkpoint::Floors { shard, floors } if floors.len() <= LIST_MAX => {
            checkpoint(shards, shard)?.floors.extend(floors);
        }
        _ => return Err("an oversized part".into()),
    }
    Ok(())
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
    /// Records below this are deleted (or superseded by a checkpoint and deleted with it).
    oldest_seq: u64,
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
    /// Bytes of the records written (their values).
    pub bytes_total: u64,
    /// `bytes_total` when the last checkpoint ended.
    bytes_at_checkpoint: u64,
}

impl<M> Journal<M> {
    /// A journal holding records `seqs` (the next written is `seqs.end`).
    pub fn new(seqs: Seqs) -> Self {
        Self {
            oldest_seq: seqs.start,
            next_seq: seqs.end,
            records: Vec::new(),
            issued: 0,
            done: 0,
            deferred: VecDeque::new(),
            dropped_total: 0,
            records_total: 0,
            bytes_total: 0,
            bytes_at_checkpoint: 0,
        }
    }

    /// Queues `record` for the step in progress.
    pub fn write(&mut self, record: &Record) {
        let mut key = KEY_PREFIX.to_vec();
        key.extend_from_slice(&self.next_seq.to_be_bytes());
        self.next_seq += 1;
        let value = postcard::to_allocvec(record).expect("records encode");
        let value_len = value.len() as u64;
        self.records.push(PersistRecord { key, value: Some(value) });
        self.records_total += 1;
        self.bytes_total += value_len;
    }

    /// Records the journal holds (written, not deleted).
    pub fn live(&self) -> u64 {
        self.next_seq - self.oldest_seq
    }

    /// Starts a checkpoint in the step in progress: its `Begin` record. The caller writes the
    /// parts and the live records, then calls [`Journal::end_checkpoint`] with the result.
    pub fn begin_checkpoint(&mut self) -> u64 {
        let seq = self.next_seq;
        self.write(&Record::Checkpoint(Checkpoint::Begin { seq }));
        seq
    }

    /// Ends the checkpoint begun at `seq`, and deletes every record before it (in the same
    /// persist, after the `End`: a persist becomes durable whole, and recovery starts at the
    /// last whole checkpoint anyway). Bounded by the records written since the last one.
    pub fn end_checkpoint(&mut self, seq: u64) {
        debug_assert!(seq >= self.oldest_seq && seq < self.next_seq, "a checkpoint begun here");
        self.write(&Record::Checkpoint(Checkpoint::End { seq }));
        for old in self.oldest_seq..seq {
            let mut key = KEY_PREFIX.to_vec();
            key.extend_from_slice(&old.to_be_bytes());
            self.records.push(PersistRecord { key, value: None });
        }
        self.oldest_seq = seq;
        self.bytes_at_checkpoint = self.bytes_total;
    }

    /// Bytes of the records written since the last checkpoint ended (since the node started,
    /// before its first).
    pub fn bytes_since_checkpoint(&self) -> u64 {
        self.bytes_total - self.bytes_at_checkpoint
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
        let mut journal = Journal::new(0..0);
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
        assert_eq!(next, 0..8);
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
        let mut journal = Journal::new(0..0);
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

    /// A whole checkpoint supersedes every record before it (the persist that wrote it
    /// deletes them), and what follows it is taken on top; a checkpoint cut short at the
    /// end is ignored; a part outside a checkpoint, an `End` of no checkpoint or a `Logged`
    /// after a cut checkpoint refuses to start.
    #[test]
    fn a_checkpoint_supersedes_what_came_before_it() {
        let s = ShardId(0);
        let mut journal = Journal::new(0..0);
        journal.write(&Record::Logged { shard: s, ts: Timestamp(1), body: body(1) });
        journal.write(&Record::Promised { shard: s, ts: Timestamp(9) });
        let mut durable = map(&mut journal);
        let begin = journal.begin_checkpoint();
        let head = Checkpoint::Head {
            shard: s,
            base: 1,
            base_ts: Timestamp(1),
            stamp_floor: Timestamp(0),
        };
        journal.write(&Record::Checkpoint(head));
        let logged = vec![(body(1).txn, Timestamp(1))];
        journal.write(&Record::Checkpoint(Checkpoint::InLog { shard: s, logged }));
        journal.write(&Record::Promised { shard: s, ts: Timestamp(7) });
        journal.end_checkpoint(begin);
        journal.write(&Record::Logged { shard: s, ts: Timestamp(2), body: body(2) });
        let (_, records) = journal.take_batch().expect("records");
        let deleted: Vec<&PersistRecord> = records.iter().filter(|r| r.value.is_none()).collect();
        assert_eq!(deleted.len(), 2, "the two records before the checkpoint go");
        for record in records {
            match record.value {
                Some(value) => durable.insert(record.key, value),
                None => durable.remove(&record.key),
            };
        }
        assert_eq!(journal.live(), 6);
        let (shards, seqs) = recover(&durable).expect("recovers");
        assert_eq!(seqs, 2..8);
        let r = &shards[&s];
        let checkpoint = r.checkpoint.as_ref().expect("a checkpoint");
        assert_eq!((checkpoint.base, checkpoint.in_log.len()), (1, 1));
        assert_eq!(r.log, vec![(Timestamp(2), body(2))], "only what came after it");
        assert_eq!(r.promised, Timestamp(7), "the checkpoint's promise, not the one before it");
        // The same records without the deletes: the checkpoint still decides.
        let mut kept = durable.clone();
        kept.insert(
            [KEY_PREFIX, &0u64.to_be_bytes()].concat(),
            postcard::to_allocvec(&Record::Logged { shard: s, ts: Timestamp(1), body: body(1) })
                .unwrap(),
        );
        assert_eq!(recover(&kept).expect("recovers").0[&s].log.len(), 1);
        // Cut short before its End: ignored, what came before stands.
        let end_key = [KEY_PREFIX, &6u64.to_be_bytes()].concat();
        let after_key = [KEY_PREFIX, &7u64.to_be_bytes()].concat();
        let mut cut = kept.clone();
        cut.remove(&end_key);
        cut.remove(&after_key);
        let (shards, _) = recover(&cut).expect("recovers");
        assert!(shards[&s].checkpoint.is_none());
        assert_eq!(shards[&s].log, vec![(Timestamp(1), body(1))]);
        // ...unless an entry follows it.
        let mut cut_then_logged = kept.clone();
        cut_then_logged.remove(&end_key);
        assert!(recover(&cut_then_logged).unwrap_err().contains("cut short"));
        // A part alone, and an End of no checkpoint.
        let mut alone = BTreeMap::new();
        let part = Record::Checkpoint(Checkpoint::InLog { shard: s, logged: Vec::new() });
        alone.insert(
            [KEY_PREFIX, &0u64.to_be_bytes()].concat(),
            postcard::to_allocvec(&part).unwrap(),
        );
        assert!(recover(&alone).unwrap_err().contains("alone"));
        let mut end = BTreeMap::new();
        let record = Record::Checkpoint(Checkpoint::End { seq: 0 });
        end.insert(
            [KEY_PREFIX, &0u64.to_be_bytes()].concat(),
            postcard::to_allocvec(&record).unwrap(),
        );
        assert!(recover(&end).unwrap_err().contains("ends no checkpoint"));
        // An entry both below the base and after the checkpoint.
        let mut twice = durable.clone();
        let again = Record::Logged { shard: s, ts: Timestamp(3), body: body(1) };
        twice.insert(
            [KEY_PREFIX, &7u64.to_be_bytes()].concat(),
            postcard::to_allocvec(&again).unwrap(),
        );
        assert!(recover(&twice).unwrap_err().contains("twice"));
    }

    /// View changes in the journal: the latest view is read back (one going back is
    /// refused); a `Joining` voids what came before it of its shard, a deposed leader's
    /// records too; a leader's records after a follower's without a checkpoint (a promotion
    /// cut short before its checkpoint) leave the follower.
    #[test]
    fn views_are_read_back_and_a_promotion_cut_short_leaves_the_follower() {
        let (s, t) = (ShardId(0), ShardId(1));
        let mut journal = Journal::new(0..0);
        let view = |global| Record::View { global, local: vec![global, 0], detective: false };
        journal.write(&view(2));
        // Shard 0: led, then deposed (its replica retired: a restart rejoins).
        journal.write(&Record::Logged { shard: s, ts: Timestamp(1), body: body(1) });
        journal.write(&Record::Joining { shard: s });
        // Shard 1: followed, then promoted, cut short before its checkpoint.
        journal.write(&Record::Outcome {
            shard: t,
            outcome: super::super::node::SyncOutcome {
                txn: body(2).txn,
                ok: true,
                inputs: Vec::new(),
            },
        });
        journal.write(&Record::Proposed { shard: t, ts: Timestamp(30), body: body(3) });
        journal.write(&view(3));
        let durable = map(&mut journal);
        let (shards, _, view_read) = recover_with_view(&durable).expect("recovers");
        assert_eq!(view_read, Some((3, vec![3, 0], false)));
        let deposed = &shards[&s];
        assert!(deposed.follower.as_ref().is_some_and(|f| f.joining), "rejoins");
        assert!(!deposed.leads() && deposed.log.is_empty(), "its leader records are void");
        let promoted = &shards[&t];
        assert!(!promoted.leads(), "the follower it was");
        assert_eq!(promoted.follower.as_ref().map(|f| f.events.len()), Some(1));
        // `recover` reads the same journal, without the view.
        assert_eq!(recover(&durable).expect("recovers").0.len(), 2);
        // A view going back is a journal that is not this node's.
        let mut back = Journal::new(0..0);
        back.write(&view(3));
        back.write(&view(2));
        let durable = map(&mut back);
        assert!(recover_with_view(&durable).unwrap_err().contains("goes back a view"));
    }

    #[test]
    fn sends_wait_for_every_record_issued_before_them() {
        let mut journal: Journal<u32> = Journal::new(0..0);
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
