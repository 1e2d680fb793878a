//! Tiga's (and luigi's) messages: what coordinators, replicas and leaders send one another,
//! and the parts of a state transfer. Every field that comes from the wire is checked where
//! it is taken (the node), never trusted here.

use meridian_core::key::Key;
use meridian_core::txn::{PieceOutput, ProcError, TxnRequest};
use meridian_core::{NodeId, ShardId, Time, Timestamp, TxnId};
use serde::{Deserialize, Serialize};

/// A transaction as its coordinator sends it: everything a replica needs to order and run it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnBody {
    /// The transaction (the same on every resend).
    pub txn: TxnId,
    /// Its timestamp.
    pub ts: Timestamp,
    /// The coordinator's clock when it sent this copy (for the delay samples).
    pub sent_at: Time,
    /// The procedure and its arguments.
    pub request: TxnRequest,
    /// Where pieces of replicated tables run when no other piece places them.
    pub home: ShardId,
    /// Every transaction of the coordinator's incarnation with a lower sequence number is
    /// decided there, so none is sent again: replicas forget the replies they kept to answer
    /// those resends (at most the body's own sequence number counts).
    pub decided_below: u64,
}

/// One shard's result, from its leader.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShardResult {
    /// The shard's pieces ran: their outputs, by piece index.
    Ran(Vec<(u32, PieceOutput)>),
    /// A piece asked to abort.
    UserAbort(String),
    /// A piece broke its contract.
    Failed(ProcError),
    /// Not run: another shard's pieces aborted before this shard had the outputs it takes.
    Skipped,
}

/// Tiga's messages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum TigaMsg {
    /// Coordinator → every replica of every participant (also a leader's answer to
    /// [`TigaMsg::GetBody`], and to a follower's fetch).
    Txn(Box<TxnBody>),
    /// Replica → coordinator: released at `ts` with this log hash over its keys.
    Fast {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The transaction.
        txn: TxnId,
        /// The replying replica's shard.
        shard: ShardId,
        /// Where it was released.
        ts: Timestamp,
        /// The replica's log hash over the transaction's keys.
        hash: u64,
        /// How long the body took to arrive (the replica's clock minus the send time), where
        /// the replica received it from the coordinator and no earlier reply carried it.
        owd_ns: Option<u64>,
        /// The shard's result: leaders only.
        result: Option<ShardResult>,
    },
    /// Follower → coordinator: its log matches the leader's up to `txn` at `ts`.
    Slow {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The transaction.
        txn: TxnId,
        /// The follower's shard.
        shard: ShardId,
        /// The leader's timestamp for it.
        ts: Timestamp,
        /// As for a fast reply: a follower's first reply for a transaction carries the delay.
        /// A follower whose clock lags its leader's by more than the delay between them
        /// places every transaction by the leader's log before its own clock releases it, so
        /// it never replies fast: without this its coordinator would never learn the delay
        /// to it and would keep stamping with the initial estimate.
        owd_ns: Option<u64>,
    },
    /// Leader → participant leader: where `from` holds `txn`.
    Propose {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The transaction.
        txn: TxnId,
        /// Every participant shard.
        shards: Vec<ShardId>,
        /// The proposing shard.
        from: ShardId,
        /// Its timestamp there.
        ts: Timestamp,
        /// An answer to a proposal or confirmation for a transaction the sender had released
        /// already: not answered again (two released leaders would echo forever).
        answer: bool,
    },
    /// Leader → participant leader: `from` moved `txn` to the agreed timestamp.
    Confirm {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The transaction.
        txn: TxnId,
        /// Every participant shard.
        shards: Vec<ShardId>,
        /// The confirming shard.
        from: ShardId,
        /// As for a proposal.
        answer: bool,
    },
    /// Leader → participant leader: whether `from`'s pieces of `txn` ran without an abort.
    Vote {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The transaction.
        txn: TxnId,
        /// The voting shard.
        from: ShardId,
        /// The shard it is for.
        to: ShardId,
        /// No piece asked to abort.
        ok: bool,
        /// The outputs of the sender's pieces that the receiver's pieces take (with a yes).
        outputs: Vec<(u32, PieceOutput)>,
        /// The sender still waits for the receiver's vote.
        want_reply: bool,
    },
    /// A view change's new leader of `shard` → the leader of shard `to`: which multi-shard
    /// transactions on `shard` did you log above its old leader's last promise?
    Pull {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The asking shard.
        shard: ShardId,
        /// The shard asked.
        to: ShardId,
    },
    /// The answer to [`TigaMsg::Pull`]: the leader of `from` logged these on `shard`.
    Pulled {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The asking shard.
        shard: ShardId,
        /// The answering shard.
        from: ShardId,
        /// Transactions and where this leader logged them.
        entries: Vec<(TxnId, Timestamp)>,
    },
    /// A view change's new leader of `from` → participant leader: send me your vote on
    /// `txn` (with the outputs pieces of `from` take), if you have one. The new leader runs
    /// again what the old one ran, and a leader that decided `txn` sends nothing unasked.
    AskVote {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The transaction.
        txn: TxnId,
        /// The asking shard.
        from: ShardId,
        /// The shard asked.
        to: ShardId,
    },
    /// Leader → participant leader, answering its proposal: the leader of `from` never took
    /// `txn` and never will (its coordinator decided it, so no copy of it is taken here any
    /// more). No leader can release it without `from`'s proposal: the receiver drops it.
    Refused {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The transaction.
        txn: TxnId,
        /// The refusing shard.
        from: ShardId,
        /// The shard whose proposal it answers.
        to: ShardId,
    },
    /// Leader → peer leader: send me `txn`'s body (I heard a proposal for it only).
    GetBody {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The transaction.
        txn: TxnId,
    },
    /// Leader → follower: the leader's log from position `from`, and final outcomes of
    /// multi-shard transactions.
    Sync {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The shard.
        shard: ShardId,
        /// The position of the first entry.
        from: u64,
        /// Entries: transaction and timestamp.
        entries: Vec<(TxnId, Timestamp)>,
        /// Multi-shard transactions decided, with what followers need to execute them.
        outcomes: Vec<SyncOutcome>,
        /// The leader's commit-point: log positions below it are synced by `f + 1` replicas
        /// and survive any view change, so followers may execute them.
        commit: u64,
        /// The leader's log base: every follower executed the entries below it (or takes a
        /// state transfer). A follower keeps its entries from there on, which a view change
        /// gathers from the followers.
        base: u64,
    },
    /// Leader → coordinator (`luigi` only): every transaction of the coordinator on `shard`
    /// at or below `ts` is replicated to a majority, and every later one will be held above
    /// it ([`crate::luigi::streams`]).
    Watermark {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The shard.
        shard: ShardId,
        /// The coordinator's watermark there.
        ts: Timestamp,
    },
    /// Coordinator → one replica of each participant shard (`tiga-snapshot-reads=on`): a
    /// read-only transaction, to read at the body's timestamp once the replica's snapshot
    /// there is closed.
    SnapRead(Box<TxnBody>),
    /// Replica → coordinator: the shard's result of a snapshot read.
    SnapReply {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The transaction.
        txn: TxnId,
        /// The replica's shard.
        shard: ShardId,
        /// What its pieces returned.
        result: ShardResult,
        /// How long the read took to arrive (the replica's clock minus the send time): the
        /// coordinator's delay sample for choosing replicas.
        owd_ns: u64,
    },
    /// Leader → follower (snapshot reads): every transaction of the shard at or below `ts`
    /// is among the first `upto` entries of the log, and the leader takes no new one at or
    /// below `ts`.
    Closed {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The shard.
        shard: ShardId,
        /// The closed timestamp.
        ts: Timestamp,
        /// The log length when it closed.
        upto: u64,
    },
    /// Leader → the other shards' leaders: the leader of `shard` takes no new transaction at
    /// or below `ts`, and every one it released there is finished (executed, every vote in).
    /// A leader drops its record of a multi-shard outcome once every other shard's leader
    /// said so above the transaction's timestamp: none of them can ask for its vote again.
    PeerClosed {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The sender's shard.
        shard: ShardId,
        /// The promised closed timestamp.
        ts: Timestamp,
    },
    /// Follower → leader: this replica started without the shard's state (a restart; a
    /// process cannot tell a first start): send it, transfer `transfer` from part `next` on
    /// (transfer 0: a new one).
    Join {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The shard.
        shard: ShardId,
        /// The follower's start: a transfer is for one start of it only (a late part cut for
        /// an earlier start may lack what the leader has since dropped).
        start: Start,
        /// The transfer under way, or 0.
        transfer: u64,
        /// The first part wanted.
        next: u32,
        /// Its store holds writes no log vouches for (a deposed leader's): the image must
        /// carry every key, which replaces the store whole.
        whole: bool,
        /// The highest global view in which it held the shard's log ([`Hosted::member_view`]):
        /// a deposed leader chosen again leads on from its own state only when no other
        /// replica held the log after it led ([`view_change`]).
        member_view: u64,
    },
    /// Leader → rejoining follower: part `index` of the `total` of state transfer `transfer`.
    State {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The shard.
        shard: ShardId,
        /// The follower start it is for.
        start: Start,
        /// The transfer.
        transfer: u64,
        /// This part's place.
        index: u32,
        /// How many parts the transfer has.
        total: u32,
        /// What it carries.
        part: StatePart,
    },
    /// Follower → leader: how far it got.
    SyncAck {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The shard.
        shard: ShardId,
        /// The follower's start: a late acknowledgement of an earlier start speaks of a log
        /// the follower no longer holds.
        start: Start,
        /// Its sync-point.
        synced: u64,
        /// Log entries it executed.
        executed: u64,
        /// Bodies it lacks.
        fetch: Vec<TxnId>,
    },
    /// New leader at a view change → the shard's other replicas: send me your log from
    /// position `from` ([`TigaMsg::Report`]).
    Recover {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The shard.
        shard: ShardId,
        /// The new leader's sync-point: the synced entries below it are not needed.
        from: u64,
    },
    /// Replica → the new leader: its log as it stood when the view changed (its synced
    /// prefix from `base`, then what it vouched for past its sync-point), with the bodies and
    /// the outcomes it held for those entries.
    Report {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The shard.
        shard: ShardId,
        /// The position of `synced[0]`.
        base: u64,
        /// The synced prefix from `base`.
        synced: Vec<(TxnId, Timestamp)>,
        /// What it vouched for past its sync-point.
        unsynced: Vec<(TxnId, Timestamp)>,
        /// The bodies it holds of those entries.
        bodies: Vec<TxnBody>,
        /// The outcomes it heard of those entries.
        outcomes: Vec<SyncOutcome>,
    },
    /// Leader → follower: the leader dropped the bodies (and the inputs of the outcomes) of
    /// its log below `upto` ([`crate::Limits::follower_lag_max`]). A follower that executed
    /// less cannot go on from the log: it drops its log and takes a state transfer (as a
    /// restarted follower does).
    Behind {
        /// The sender's view ([`TigaMsg::view`]).
        view: u64,
        /// The shard.
        shard: ShardId,
        /// The log position below which the leader keeps nothing for followers.
        upto: u64,
    },
    /// The view manager's heartbeats, group log and views ([`manage`]): of no view.
    Manager(crate::tiga::manager::ManagerMsg),
}

/// One start of a follower replica: the node's incarnation and, within it, how many times its
/// leader sent it to a state transfer ([`TigaMsg::Behind`]). Starts are ordered: a late
/// message of an earlier start speaks of a log the follower no longer holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Start {
    /// The node's incarnation.
    pub incarnation: u64,
    /// State transfers its leader sent it to within the incarnation.
    pub rejoin: u32,
}

impl TigaMsg {
    /// The global view number a replica sent this message in; `None` for a transaction's
    /// body or snapshot read (from its coordinator, or passed on by a replica), which holds in
    /// any view. A node drops (and counts) a message of another view than its own: leaders,
    /// logs and agreements of one view mean nothing in the next.
    pub fn view(&self) -> Option<u64> {
        match self {
            Self::Txn(_) | Self::SnapRead(_) | Self::Manager(_) => None,
            Self::Fast { view, .. }
            | Self::Slow { view, .. }
            | Self::Propose { view, .. }
            | Self::Confirm { view, .. }
            | Self::Vote { view, .. }
            | Self::Refused { view, .. }
            | Self::GetBody { view, .. }
            | Self::Sync { view, .. }
            | Self::Watermark { view, .. }
            | Self::SnapReply { view, .. }
            | Self::Closed { view, .. }
            | Self::PeerClosed { view, .. }
            | Self::SyncAck { view, .. }
            | Self::Join { view, .. }
            | Self::State { view, .. }
            | Self::Recover { view, .. }
            | Self::Report { view, .. }
            | Self::AskVote { view, .. }
            | Self::Pull { view, .. }
            | Self::Pulled { view, .. }
            | Self::Behind { view, .. } => Some(*view),
        }
    }

    /// Sets the view a replica's message carries (none for a body or a snapshot read): for
    /// fuzzing and tests that forge messages of a node's own view.
    pub fn set_view(&mut self, to: u64) {
        match self {
            Self::Txn(_) | Self::SnapRead(_) | Self::Manager(_) => {}
            Self::Fast { view, .. }
            | Self::Slow { view, .. }
            | Self::Propose { view, .. }
            | Self::Confirm { view, .. }
            | Self::Vote { view, .. }
            | Self::Refused { view, .. }
            | Self::GetBody { view, .. }
            | Self::Sync { view, .. }
            | Self::Watermark { view, .. }
            | Self::SnapReply { view, .. }
            | Self::Closed { view, .. }
            | Self::PeerClosed { view, .. }
            | Self::SyncAck { view, .. }
            | Self::Join { view, .. }
            | Self::State { view, .. }
            | Self::Recover { view, .. }
            | Self::Report { view, .. }
            | Self::AskVote { view, .. }
            | Self::Pull { view, .. }
            | Self::Pulled { view, .. }
            | Self::Behind { view, .. } => *view = to,
        }
    }
}

/// A multi-shard transaction's final outcome, as a leader tells its followers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncOutcome {
    /// The transaction.
    pub txn: TxnId,
    /// Every participant voted yes: its writes apply.
    pub ok: bool,
    /// With a yes: the outputs of other shards' pieces that this shard's pieces took.
    pub inputs: Vec<(u32, PieceOutput)>,
}

/// One part of a state transfer: the leader's finished log prefix (every entry executed and
/// decided) from its base, the key hashes over the whole prefix, its store as it is, and what
/// it executed past the prefix. Part 0 is the head; entries, the transactions below the base
/// still known as logged, the coordinators' decided floors, hashes, rows and the entries ahead
/// follow in that order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StatePart {
    /// Which log entries the transfer lists, and the leader's log length.
    Head {
        /// The leader's log base: the entries listed start here (those below are dropped).
        base: u64,
        /// The length of the finished prefix.
        upto: u64,
        /// The leader's log length (the entries past the prefix come with its log).
        end: u64,
        /// Every key counts as released up to this: the highest release stamp of the replica
        /// that cut the image (at least every entry's timestamp in and below the prefix).
        floor: Timestamp,
        /// The rows carry every key of the store (they replace the store whole), not only
        /// those written since the load.
        whole: bool,
    },
    /// The next log entries, in log order (at most [`crate::tiga::log::SYNC_ENTRIES_MAX`]).
    Entries(Vec<(TxnId, Timestamp)>),
    /// Transactions logged below the base whose coordinators have not decided them: a resend
    /// may still come, and must find them logged (at most [`crate::tiga::log::SYNC_ENTRIES_MAX`]).
    Lingering(Vec<TxnId>),
    /// Per coordinator start, the sequence number below which it decided everything (at
    /// most [`crate::tiga::log::SYNC_ENTRIES_MAX`]): a body of one of those is a late copy.
    Decided(Vec<(NodeId, u64, u64)>),
    /// Key hashes over the prefix (at most [`super::STATE_HASHES_MAX`]).
    Hashes(Vec<(Key, u64)>),
    /// Keys written since the load with their committed versions, oldest first, as the
    /// leader's store holds them.
    Rows(Vec<(Key, Vec<StateVersion>)>),
    /// Entries past the prefix the leader executed: applied (`None`), or waiting for other
    /// shards' votes with these writes (at most [`crate::tiga::log::SYNC_ENTRIES_MAX`] entries).
    Ahead(Vec<AheadEntry>),
}

/// An entry past a transfer's prefix that the leader executed: applied (`None`), or waiting
/// for other shards' votes with these writes.
pub type AheadEntry = (TxnId, Option<Vec<(Key, Option<Vec<u8>>)>>);

/// A committed version, as a state transfer carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateVersion {
    /// Its timestamp.
    pub ts: Timestamp,
    /// Its writer.
    pub writer: TxnId,
    /// The value (`None`: deleted).
    pub value: Option<Vec<u8>>,
}

/// A sync message's position, entries, outcomes, commit-point and the leader's log base.
pub(super) type SyncParts = (u64, Vec<(TxnId, Timestamp)>, Vec<SyncOutcome>, u64, u64);

/// Piece outputs carried by one sync message's outcomes, about (more wait for the next).
pub const SYNC_INPUT_BYTES_MAX: usize = 4 << 20;
const _: () = assert!(SYNC_INPUT_BYTES_MAX < meridian_core::wire::FRAME_BYTES_MAX / 2);
