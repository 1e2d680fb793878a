//! The `tiga` protocol node: a coordinator for the transactions clients submit here, and the
//! replicas of the shards this node hosts, each driven by [`super::replica::Replica`]. The
//! same node runs `luigi` ([`Variant::Luigi`], [`crate::luigi`]): coordinators send to the
//! leaders only, followers learn transactions from the leader's log alone, and a commit waits
//! for the leaders' per-worker replication watermarks instead of a quorum of replies.
//!
//! # One transaction
//!
//! 1. The coordinator binds the procedure's plan to shards and checks that it is one-shot in
//!    the strong sense a replica's arrival check needs (every piece's keys known from the
//!    arguments, or standing behind guard keys its procedure names; no scans), stamps it
//!    ([`super::coordinator::Tracker`]) and sends the body (procedure, arguments, timestamp,
//!    send time) to every replica of every participant shard.
//! 2. Each replica derives the shard's pieces and keys from the body itself (nothing in the
//!    message is trusted beyond the arguments), holds the transaction and releases it in
//!    timestamp order; leaders of multi-shard transactions agree on the timestamp first
//!    (preventive mode). A follower replies fast at release; a leader executes the shard's
//!    pieces on its store at the timestamp and replies fast with the shard's result. A
//!    detective leader runs a multi-shard transaction once it is due and only the agreement
//!    holds it, replies with that result and keeps it aside (a speculation): it stands if
//!    the transaction is released there, and is dropped ([`Action::Revoke`]) if the agreed
//!    timestamp is later, where the transaction runs again.
//! 3. Followers learn the leader's log (position, transaction, timestamp) and reply slow for
//!    every entry they synced; the coordinator commits on a super quorum of matching fast
//!    replies per shard, or the leader's fast reply plus `f` slow replies.
//!
//! # User aborts across shards
//!
//! A piece may ask to abort (a bank transfer from an account without the money), and a
//! one-shot transaction's other shards cannot see that. A leader that executed a
//! multi-shard transaction therefore keeps its writes aside and sends its **vote** (did its
//! pieces run without an abort) to the other participant leaders; the writes are applied once
//! every vote is in and all said yes, and dropped otherwise. The leaders sit together in
//! preventive mode, so this costs a local round trip, and only later transactions touching a
//! key the transaction writes wait for it (transactions release in timestamp order among
//! conflicting ones on every shard, so these waits cannot form a cycle). The coordinator
//! learns each shard's result from its leader's fast reply and reports a user abort if any
//! shard aborted. The same votes carry the outputs of pieces that other shards' pieces take
//! as values (each input is taken only from the vote of the shard that runs its piece).
//! Followers execute their synced log in order at the leader's timestamps, taking each
//! multi-shard transaction's final outcome, and the inputs its pieces took, from the leader
//! (sent with the log), so every replica reaches the leader's state. They execute only below
//! the commit-point (what `f + 1` replicas synced, which a view change keeps): with `f` = 1
//! that is their own sync-point; otherwise the leader sends it with its log.
//!
//! # Failures handled, and not yet
//!
//! Messages may be lost, duplicated or reordered: coordinators resend the body with the same
//! transaction id and timestamp until decided, and a replica answers a repeat from what it
//! recorded (execution is at most once); leaders repeat proposals and votes, and a leader
//! that hears a proposal for a transaction it never received fetches the body from the
//! proposer; followers acknowledge their sync-point and the leader resends what they lack.
//!
//! Every replica's message but a transaction's body carries the global view it was sent in
//! ([`TigaMsg::view`]); a node drops and counts any of another view before looking at it. A
//! body (from its coordinator, or a replica passing it on) holds in any view.
//!
//! A tiga leader journals its log entries, first proposals, the votes it hears and its
//! closed-timestamp promises ([`super::journal`]), and every send waits until the records
//! issued before it are durable (`TigaNode::step`); a restarted leader takes them up
//! ([`TigaNode::restored`]), runs its log again and leads on in the same view. A follower
//! journals what it vouches for (its tail releases, the synced entries with their bodies, the
//! outcomes it hears; a checkpoint holds an image of its executed prefix), and a restarted
//! follower installs that image and runs the rest again.
//!
//! A follower that starts again without its shard in a journal (incarnation above zero, in
//! memory) lost its log and store: it takes no part in its shard until its leader's state
//! transfer is in ([`StatePart`]: the leader's finished log prefix, its key hashes over it,
//! its store, and what it executed past the prefix), then catches up on the log past it like
//! any follower.
//!
//! **View changes** (module `view_change`): a node takes the view manager's next view
//! ([`TigaNode::install_view`]; the manager is hosted in the nodes, module `manage`, or a
//! test's scenario gives the view), a new leader rebuilds its shard's log from `f + 1`
//! replicas' reports, pulls in what the other leaders logged on its shard, and leads it, and
//! the other followers rejoin by a state transfer. Luigi's is the same, with its leader's
//! watermarks counted afresh and its coordinators resending to the new leaders.
//!
//! # Memory a run does not grow
//!
//! Stores keep only the versions a read can still see (`apply`; every version with
//! snapshot reads on). Replies kept to answer resends go once their coordinator has decided
//! the transaction: each body carries the coordinator's `decided_below`, and a replica that
//! gets a coordinator's own copy forgets its replies below it (at most [`ANSWERS_MAX`] stay
//! in any case). Bodies go once every replica executed them, or once they are more than
//! [`crate::Limits::follower_lag_max`] entries behind the leader's finished prefix: a follower
//! that far behind is told so ([`TigaMsg::Behind`]) and rejoins by a state transfer under its
//! next [`Start`] (at most [`BODIES_MAX`] in any case). Log entries go once every replica
//! executed them ([`crate::Limits::log_drop_min`] at a time; positions count from a base). A
//! follower still knows a dropped transaction as logged until its coordinator decided it
//! (bodies carry `decided_below`; [`TigaNode`] keeps each coordinator start's floor), and
//! drops a late copy of a body it no longer knows past that floor. A leader forgets one below
//! its log's base once its coordinator decided it and every other shard's leader promised a
//! closed timestamp past it ([`TigaMsg::PeerClosed`]); from then on it drops late bodies and
//! votes and answers a late proposal with [`TigaMsg::Refused`], as it does for a transaction
//! its coordinator decided before it ever got it (the proposer, still holding that one,
//! drops it). Outcome records go once the followers executed the transaction and the other
//! leaders promised past it.

mod manage;
mod view_change;

use super::coordinator::{Committed, Refused, ShardPlacement, Tracker};
use super::journal::{FollowerEvent, FollowerRecovered, Journal, Record, Recovered, Seqs};
use super::owd::OwdSettings;
use super::quorum::slow_followers;
use super::recovery::{rebuild_log, ReportedEntry, ReportedLog};
use super::replica::{Action, CheckpointedLog, Incoming, Replica, ReplicaLimits};
use super::view::{next_view, View};
use super::waits::Waits;
use super::{check_one_shot, Mode, TigaSettings};
use crate::kit::coord::{bind_plan, AttemptIds};
use crate::kit::exec::{run_piece, AtTimestamp, Overlay, Placement};
use crate::kit::timers::Timers;
use crate::luigi::streams::Streams;
use crate::{NodeContext, ProtocolNode};
use meridian_core::key::Key;
use meridian_core::node::{
    ClientRequest, Control, Durability, Effect, Node, Outbox, PersistToken, TimerId,
};
use meridian_core::topology::Topology;
use meridian_core::txn::{
    AbortCounts, CommitPath, Datum, KeySet, PieceOutput, ProcError, ShardTarget, TxnFailure,
    TxnOutcome, TxnRequest, TxnResult, PIECES_MAX,
};
use meridian_core::{NodeId, RequestId, ShardId, Time, Timestamp, TxnId};
use meridian_storage::{MvccStore, StoreError, Version, VersionState};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
pub use view_change::REPORT_ENTRIES_MAX;
use view_change::{Frozen, Recovering};

/// Transactions held per replica at most.
pub const HELD_MAX: usize = 1 << 16;
/// Keys with a release stamp per replica (about).
pub const STAMPED_KEYS_MAX: usize = 1 << 20;
/// A follower's released transactions not yet listed by its leader.
pub const TAIL_MAX: usize = 1 << 14;
/// Agreements a leader keeps open at once.
pub const AGREEMENTS_MAX: usize = 1 << 14;
/// Missing bodies a follower asks for again per acknowledgement.
pub const FETCH_MAX: usize = 256;
/// Open agreements a leader repeats its messages for per pace.
pub const AGREEMENTS_REPEATED_MAX: usize = 1 << 10;
/// Releases per call.
pub const RELEASE_MAX: usize = 1 << 12;
/// Transaction bodies a replica keeps (held, released and not yet executed everywhere). At
/// the limit it takes no new arrivals; their coordinators resend.
pub const BODIES_MAX: usize = 1 << 18;
/// Replies a replica remembers to answer a coordinator's resend (oldest forgotten first; a
/// forgotten one is not answered, and the coordinator finally reports the outcome unknown).
pub const ANSWERS_MAX: usize = 1 << 18;
/// Votes for transactions not executed here yet, kept per leader.
pub const EARLY_VOTES_MAX: usize = 1 << 14;
/// Outcomes of multi-shard transactions a follower keeps before executing them.
pub const OUTCOMES_KEPT_MAX: usize = 1 << 16;
/// Multi-shard outcomes one sync message carries when the leader resends.
pub const OUTCOMES_WINDOW_MAX: usize = 1 << 10;
/// Snapshot reads a replica keeps waiting, per hosted shard, for their snapshot to close
/// (more are dropped; the coordinator resends to the leader).
pub const SNAPSHOTS_WAITING_MAX: usize = 1 << 12;
/// Closed timestamps a follower keeps from its leader (the oldest go first).
pub const CLOSED_KEPT_MAX: usize = 64;
/// Results a tiga follower keeps of entries it executed whose coordinators have not decided
/// them yet; past it, new ones are not kept (a coordinator waiting on one after a view change
/// reports its outcome unknown: memory, never safety).
pub const RESULTS_KEPT_MAX: usize = 1 << 16;
const _: () = assert!(HELD_MAX <= BODIES_MAX && TAIL_MAX <= BODIES_MAX);
// A leader keeps the bodies of what it holds and of its log past the slowest follower, or
// past the lag limit: both fit, so a lagging follower alone never fills its bodies.
const _: () = assert!(HELD_MAX + crate::FOLLOWER_LAG_MAX_LIMIT < BODIES_MAX);
/// Bytes one part of a state transfer carries in its rows, about (keys, values and
/// [`STATE_VERSION_BYTES`] per version; at least one row goes in each part).
pub const STATE_ROW_BYTES_MAX: usize = 1 << 18;
/// What a version costs in a transfer's part beyond its value (timestamp, writer).
const STATE_VERSION_BYTES: usize = 32;
/// Key hashes one part of a state transfer carries.
pub const STATE_HASHES_MAX: usize = 1 << 12;
/// Parts one state transfer may have: a follower refuses a larger one.
pub const STATE_PARTS_MAX: u32 = 1 << 20;
/// Parts a leader sends per request of a rejoining follower (it asks for the next ones when
/// these are in).
pub const STATE_WINDOW: u32 = 8;
const _: () = assert!(STATE_ROW_BYTES_MAX < meridian_core::wire::FRAME_BYTES_MAX / 4);
const _: () = assert!(STATE_WINDOW >= 1 && STATE_WINDOW < STATE_PARTS_MAX);

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
    Manager(super::manager::ManagerMsg),
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
    /// The next log entries, in log order (at most [`super::log::SYNC_ENTRIES_MAX`]).
    Entries(Vec<(TxnId, Timestamp)>),
    /// Transactions logged below the base whose coordinators have not decided them: a resend
    /// may still come, and must find them logged (at most [`super::log::SYNC_ENTRIES_MAX`]).
    Lingering(Vec<TxnId>),
    /// Per coordinator start, the sequence number below which it decided everything (at
    /// most [`super::log::SYNC_ENTRIES_MAX`]): a body of one of those is a late copy.
    Decided(Vec<(NodeId, u64, u64)>),
    /// Key hashes over the prefix (at most [`STATE_HASHES_MAX`]).
    Hashes(Vec<(Key, u64)>),
    /// Keys written since the load with their committed versions, oldest first, as the
    /// leader's store holds them.
    Rows(Vec<(Key, Vec<StateVersion>)>),
    /// Entries past the prefix the leader executed: applied (`None`), or waiting for other
    /// shards' votes with these writes (at most [`super::log::SYNC_ENTRIES_MAX`] entries).
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
type SyncParts = (u64, Vec<(TxnId, Timestamp)>, Vec<SyncOutcome>, u64, u64);

/// Piece outputs carried by one sync message's outcomes, about (more wait for the next).
pub const SYNC_INPUT_BYTES_MAX: usize = 4 << 20;
const _: () = assert!(SYNC_INPUT_BYTES_MAX < meridian_core::wire::FRAME_BYTES_MAX / 2);

/// A transaction's part on one shard, derived from its body.
#[derive(Clone, Debug)]
struct Part {
    /// The shard's pieces, in plan order.
    pieces: Vec<u32>,
    /// Per piece of `pieces`, the pieces whose outputs it takes (the plan's dependencies).
    deps: Vec<Vec<u32>>,
    /// Sorted.
    reads: Vec<Key>,
    /// Sorted. Holds the guards of `guarded` pieces.
    writes: Vec<Key>,
    /// Pieces whose keys need their inputs, ordered by the keys their procedure names as
    /// guards ([`meridian_core::txn::Procedure::guard`]) instead: they may touch keys not
    /// declared here. Sorted.
    guarded: Vec<u32>,
    /// Pieces of other shards whose outputs these pieces take, with the shard each runs on:
    /// that shard's leader's vote carries it, and the part runs once all are in. Sorted.
    inputs: Vec<(u32, ShardId)>,
    /// Per other shard, the pieces here whose outputs its pieces take. Sorted.
    feeds: BTreeMap<ShardId, Vec<u32>>,
}

impl Part {
    fn keys(&self) -> Vec<Key> {
        let mut keys = self.reads.clone();
        keys.extend(self.writes.iter().cloned());
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// Its keys as a follower's log takes them ([`super::replica::PartKeys`]).
    fn log_keys(&self) -> super::replica::PartKeys {
        (self.keys(), self.writes.clone())
    }

    /// True when the part declared `key` (read or written).
    fn declares(&self, key: &Key) -> bool {
        self.reads.binary_search(key).is_ok() || self.writes.binary_search(key).is_ok()
    }
}

/// A one-shot transaction's shape: per participant shard its pieces and keys.
#[derive(Clone, Debug)]
struct Shape {
    parts: BTreeMap<ShardId, Part>,
    pieces_total: usize,
}

impl Shape {
    fn shards(&self) -> Vec<ShardId> {
        self.parts.keys().copied().collect()
    }
}

/// Binds `request`'s plan and checks that tiga can run it: every piece's keys known from the
/// arguments alone (a piece may take other pieces' outputs as values), or, for a piece whose
/// keys need its inputs, guard keys on its shard that stand for them
/// ([`meridian_core::txn::Procedure::guard`]); no scans, and no shards whose pieces wait for
/// each other's outputs in a cycle.
fn shape_of(
    context: &NodeContext,
    request: &TxnRequest,
    home: ShardId,
) -> Result<Shape, ProcError> {
    let pieces = bind_plan(context, request, home)?;
    check_one_shot(&pieces)
        .map_err(|why| ProcError::Unsupported(format!("tiga and luigi: {why}")))?;
    let procedure = context.registry.get(request.proc).expect("bind_plan found it");
    let mut parts: BTreeMap<ShardId, Part> = BTreeMap::new();
    for (index, piece) in pieces.iter().enumerate() {
        // Keys from the arguments alone (the execution checks that the keys it uses are
        // these). A piece whose keys need its inputs cannot say them: it runs only where its
        // procedure names guard keys, which stand for them here.
        let mut guarded = false;
        let keys = match procedure.keys(index as u32, &request.args, &[]) {
            Ok(keys) => keys,
            Err(error) if !piece.deps.is_empty() => {
                let Some(guard) = procedure.guard(index as u32, &request.args) else {
                    return Err(ProcError::Unsupported(format!(
                        "tiga and luigi need one-shot transactions whose keys are known from \
                         the arguments: the keys of piece {index} need the output of piece {} \
                         ({error}) and its procedure names no keys guarding them; choose \
                         another protocol",
                        piece.deps[0]
                    )));
                };
                let target = ShardTarget::Shard(piece.shard);
                let stray = guard.iter().find(|k| context.partitioner.target_of(k) != target);
                if guard.is_empty() || stray.is_some() {
                    return Err(ProcError::Contract(format!(
                        "the guard of piece {index} must be keys on its shard {}: {guard:?}",
                        piece.shard.0
                    )));
                }
                guarded = true;
                KeySet { reads: Vec::new(), writes: guard, scans: Vec::new() }
            }
            Err(error) => return Err(error),
        };
        if !keys.scans.is_empty() {
            return Err(ProcError::Unsupported(format!(
                "tiga and luigi order transactions by the keys they touch and do not run \
                 range scans (piece {index} scans); choose another protocol"
            )));
        }
        let part = parts.entry(piece.shard).or_insert_with(|| Part {
            pieces: Vec::new(),
            deps: Vec::new(),
            reads: Vec::new(),
            writes: Vec::new(),
            guarded: Vec::new(),
            inputs: Vec::new(),
            feeds: BTreeMap::new(),
        });
        if guarded {
            part.guarded.push(index as u32);
        }
        part.pieces.push(index as u32);
        part.deps.push(piece.deps.clone());
        for (into, keys) in [(&mut part.reads, keys.reads), (&mut part.writes, keys.writes)] {
            if into.is_empty() {
                *into = keys; // The common case, one piece per shard: no copy.
            } else {
                into.extend(keys);
            }
        }
    }
    if parts.is_empty() {
        return Err(ProcError::BadArgs("a transaction without pieces".into()));
    }
    // Bounded by the plan (at most PIECES_MAX pieces, each with its dependencies).
    for piece in &pieces {
        for &dep in &piece.deps {
            let source = pieces[dep as usize].shard; // check_one_shot checked the index.
            if source != piece.shard {
                parts.get_mut(&piece.shard).expect("bound").inputs.push((dep, source));
                let feeds = &mut parts.get_mut(&source).expect("bound").feeds;
                feeds.entry(piece.shard).or_default().push(dep);
            }
        }
    }
    for part in parts.values_mut() {
        for keys in [&mut part.reads, &mut part.writes] {
            keys.sort_unstable();
            keys.dedup();
        }
        part.inputs.sort_unstable();
        part.inputs.dedup();
        for fed in part.feeds.values_mut() {
            fed.sort_unstable();
            fed.dedup();
        }
    }
    Ok(Shape { parts, pieces_total: pieces.len() })
}

/// Checks that tiga can run `request` (bound with shard 0 as home): the error says why not.
pub fn check_request(context: &NodeContext, request: &TxnRequest) -> Result<(), ProcError> {
    shape_of(context, request, ShardId(0)).map(|_| ())
}

/// What a replica knows of one transaction.
#[derive(Debug)]
struct Known {
    body: Arc<TxnBody>,
    /// How long the copy its coordinator sent took to arrive, until a reply carried it (a
    /// follower's first reply takes it; a leader's only reply reads it); none for a body
    /// that came from elsewhere (a peer, the journal, a view change).
    owd_ns: Option<u64>,
    part: Part,
    shards: Vec<ShardId>,
}

/// A released transaction waiting at a leader to execute.
#[derive(Debug)]
struct Queued {
    ts: Timestamp,
    /// The fast reply's hash (known at release).
    hash: u64,
    /// Detective mode: not released, only due, to run speculatively at `ts`.
    speculative: bool,
}

/// What a detective leader ran speculatively for a held transaction: kept aside until the
/// transaction is released where it ran (it stands) or its timestamp moves (it goes).
#[derive(Debug)]
struct Speculation {
    ts: Timestamp,
    /// The fast reply's hash it went out with.
    hash: u64,
    writes: Overlay,
    result: ShardResult,
}

/// A multi-shard transaction a leader executed, waiting for the other leaders' votes.
#[derive(Debug)]
struct Pending {
    ts: Timestamp,
    writes: Overlay,
    /// The keys its part may write (held against later transactions until it finishes).
    write_keys: Vec<Key>,
    own_ok: bool,
    votes: BTreeMap<ShardId, bool>,
    others: Vec<ShardId>,
    /// Per other shard, the outputs of pieces here that its pieces take (sent with the vote).
    feeds: BTreeMap<ShardId, Vec<(u32, PieceOutput)>>,
    /// The other shards' outputs the pieces here took (passed on to followers).
    inputs: Vec<(u32, PieceOutput)>,
}

/// Another leader's vote, heard before this leader executed the transaction.
#[derive(Clone, Debug)]
struct PeerVote {
    ok: bool,
    /// Outputs of its pieces that pieces here take.
    outputs: Vec<(u32, PieceOutput)>,
}

/// A multi-shard transaction a leader decided.
#[derive(Debug)]
struct Decided {
    /// Its timestamp.
    ts: Timestamp,
    /// Every follower executed it (or was sent to a state transfer): only the other leaders
    /// may still need the record ([`TigaMsg::PeerClosed`]).
    settled: bool,
    /// This shard's vote.
    own: bool,
    /// Every shard voted yes.
    all: bool,
    /// With `all`: the other shards' outputs the pieces here took.
    inputs: Vec<(u32, PieceOutput)>,
    /// Per other shard, the outputs of pieces here that its pieces take: a view change's new
    /// leader there runs the transaction again and asks for them ([`TigaMsg::AskVote`]).
    feeds: BTreeMap<ShardId, Vec<(u32, PieceOutput)>>,
    /// The other participant shards: a view change's new leader of one asks which of its
    /// transactions this leader logged ([`TigaMsg::Pull`]), and the body may be gone by then.
    others: Vec<ShardId>,
}

/// A follower's state transfer under way: the parts in so far, in order.
#[derive(Debug, Default)]
struct Joining {
    /// The transfer (0 until its first part arrives).
    transfer: u64,
    /// Its part count (0 until the first part arrives).
    total: u32,
    parts: Vec<StatePart>,
    /// A timer to ask again is set (one at a time).
    timer_set: bool,
}

/// A leader's state transfer to one follower: the image, cut once, sent part by part.
#[derive(Debug)]
struct Transfer {
    id: u64,
    /// The follower's start that asked for it.
    start: Start,
    parts: Vec<StatePart>,
}

/// One hosted replica and what the node keeps for it.
#[derive(Debug)]
struct Hosted {
    shard: ShardId,
    replica: Replica,
    store: MvccStore,
    bodies: BTreeMap<TxnId, Known>,
    /// The last reply sent per transaction, to repeat on a resend.
    answers: BTreeMap<TxnId, TigaMsg>,
    answer_order: VecDeque<TxnId>,
    // Leader.
    /// Released transactions not executed yet (and, in detective mode, due ones to run
    /// speculatively).
    queued: BTreeMap<TxnId, Queued>,
    /// Detective mode: what ran speculatively, by transaction.
    speculations: BTreeMap<TxnId, Speculation>,
    /// Which of them may execute now.
    waits: Waits,
    /// Pending transactions whose votes are all in.
    complete: BTreeSet<TxnId>,
    pending: BTreeMap<TxnId, Pending>,
    early_votes: BTreeMap<TxnId, BTreeMap<ShardId, PeerVote>>,
    /// Multi-shard transactions decided here.
    decided: BTreeMap<TxnId, Decided>,
    /// The settled ones, by timestamp: each goes once every other shard's leader promised a
    /// closed timestamp at or above it.
    settling: BTreeSet<(Timestamp, TxnId)>,
    /// Decided since the last sync went out.
    fresh_outcomes: Vec<SyncOutcome>,
    /// Per follower node: its sync-point and executed count, as acknowledged.
    acks: BTreeMap<NodeId, (usize, usize)>,
    /// Per follower node: the next log position to send.
    sent_to: BTreeMap<NodeId, usize>,
    /// Luigi, per follower node: the log position from which bodies have not gone out yet
    /// (each body goes once; a lost one is fetched).
    bodies_to: BTreeMap<NodeId, usize>,
    /// Bodies below this log position were dropped (every follower executed them).
    pruned: usize,
    /// Leader: the commit-point last sent to the followers. Follower: the highest heard.
    commit: usize,
    /// Follower: the highest log base its leader sent: it drops no entry at or above it.
    leader_base: usize,
    // Follower.
    /// Synced entries executed here.
    executed: usize,
    /// Final outcomes of multi-shard transactions heard from the leader, with the inputs
    /// their pieces take.
    outcomes: BTreeMap<TxnId, (bool, Vec<(u32, PieceOutput)>)>,
    /// Tiga follower: per multi-shard entry it executed, the outputs of its pieces that
    /// other shards' pieces take (only where there are some), kept as long as its outcome: as
    /// a view change's new leader it answers the other leaders' votes with them.
    fed: BTreeMap<TxnId, BTreeMap<ShardId, Vec<(u32, PieceOutput)>>>,
    /// The leader's node.
    leader: NodeId,
    /// The followers' nodes (leaders only).
    followers: Vec<NodeId>,
    /// `luigi` leaders: the per-worker watermarks.
    streams: Option<Streams>,
    /// `luigi` leaders: log positions below this are replicated to a majority (and told to
    /// the streams).
    replicated: usize,
    // Snapshot reads.
    /// Leader: the closed timestamp promised (to a read or to the followers): arrivals at or
    /// below it are held above it.
    promised: Timestamp,
    /// Leader: the closed timestamp last sent to the followers.
    closed_sent: Timestamp,
    /// Follower: the leader's closed timestamps with the log length each covers, oldest
    /// first (at most [`CLOSED_KEPT_MAX`]): a follower serves at the latest one whose log it
    /// executed, which may trail the latest heard while outcomes are awaited.
    closed: VecDeque<(Timestamp, usize)>,
    /// Follower: the promise its tail was last cut at (see `drop_unlisted`).
    tail_cut: Timestamp,
    /// Follower: transactions dropped from its tail whose bodies it keeps until their
    /// coordinators decided them (a restarted leader takes such a transaction again above its
    /// promise, and the log then lists it: the body spares a fetch). At most [`TAIL_MAX`].
    unlisted: BTreeSet<TxnId>,
    /// Snapshot reads waiting for their timestamp to close here, by (timestamp, id).
    snapshots: BTreeMap<(Timestamp, TxnId), Known>,
    /// Snapshot reads are on: the store keeps every version (see [`apply`]).
    keep_history: bool,
    // State transfers.
    /// Follower: it started without the shard's state and takes no part until the leader's
    /// transfer is in.
    joining: Option<Joining>,
    /// Leader: log positions below this are executed and decided (applied or dropped).
    finished: usize,
    /// Rejoined follower: entries past the transferred prefix that the leader had executed
    /// when it cut the image: applied (`None`: their writes came with it, skip them), or
    /// waiting for other shards' votes (their writes, to apply if the outcome is a yes).
    ahead: BTreeMap<TxnId, Option<Overlay>>,
    /// Rejoined follower: the leader's log length when it cut the image; below it the store
    /// may hold versions above an entry still to execute (see [`debug_assert_newest`]).
    rejoin_end: usize,
    /// Leader: state transfers under way, per follower node.
    transfers: BTreeMap<NodeId, Transfer>,
    /// Leader: the last transfer id given.
    transfer_seq: u64,
    /// Leader: per follower node, the latest start of it that installed a transfer.
    joined: BTreeMap<NodeId, Start>,
    /// Follower: state transfers the leader sent this replica to since the node started
    /// ([`TigaMsg::Behind`]).
    rejoins: u32,
    // Journal (tiga leaders).
    /// Transactions whose proposal is journaled and which are not logged yet, with the
    /// timestamp proposed (a checkpoint writes them again).
    journaled: BTreeMap<TxnId, Timestamp>,
    /// Leader: the log position of the last checkpoint (see [`checkpoint_records`]).
    checkpointed: usize,
    /// Leader: transactions below the log's base still known as logged, at their
    /// timestamps, to forget once their coordinators decided them and every other shard's
    /// leader promised past them (at most [`crate::Limits::forgettable_max`]; past it, they
    /// stay known until there is room again: memory, never safety).
    forgettable: BTreeSet<(Timestamp, TxnId)>,
    /// Leader: some transaction went below the log's base while `forgettable` was full: once
    /// it has room again it is filled from the logged set.
    forgettable_overflowed: bool,
    /// A leader restarted from a checkpoint: the store's rows it holds, applied over the
    /// initial load when the node starts.
    restore_rows: Vec<(Key, Vec<StateVersion>)>,
    /// Replaying the journal: replies are recorded (to answer resends), not sent.
    quiet: bool,
    /// A follower restarted from its journal: what it journaled after its image, to run
    /// again (quietly) once the store is loaded.
    restore_events: Vec<Restored>,
    /// Follower: its executed count at its last checkpoint.
    follower_checkpointed: usize,
    // View changes.
    /// Its log as it stood at a view change that gave the shard a new leader, kept to report
    /// it to the new leader ([`view_change`]).
    frozen: Option<Box<Frozen>>,
    /// New leader: the reports gathered so far.
    recovering: Option<Recovering>,
    /// New leader: multi-shard entries it runs again without an outcome, whose votes it asks
    /// the other leaders for until it has run them ([`TigaMsg::AskVote`]).
    asking: BTreeSet<TxnId>,
    /// Tiga follower: the shard's result of each entry it executed, until the entry's
    /// coordinator decided it (at most [`RESULTS_KEPT_MAX`]): promoted at a view change, it
    /// answers a coordinator still waiting on one as the leader would have.
    results: BTreeMap<TxnId, (Timestamp, ShardResult)>,
    /// The replica takes no part in the shard any more (a deposed leader: [`view_change`]).
    retired: bool,
    /// Follower rejoining at a view change: the state it dropped to rejoin, kept until a
    /// transfer is installed (its store is untouched until then). Chosen to lead before
    /// that, it takes this state up again and gathers reports as a follower would
    /// ([`view_change`]).
    stashed: Option<Box<Stashed>>,
    /// A deposed leader: the leader state it held when it retired, kept until a transfer is
    /// installed (its store is untouched until then). Chosen to lead again, it takes this
    /// state up once every other replica said it held no log in a later view
    /// ([`view_change`]).
    deposed: Option<Box<Deposed>>,
    /// The highest global view in which this replica held the shard's log (led it, or
    /// followed its leader with a log): it vouched for nothing in a later view. A restart
    /// takes its journal's view (an upper bound: the view is journaled before anything of it
    /// goes out).
    member_view: u64,
}

/// A deposed leader's state as it stood when it retired (see [`Hosted::deposed`]).
#[derive(Debug)]
struct Deposed {
    /// The leader's replica as it was, but for the store (which the rejoining replica
    /// keeps, [`Hosted::swap_kept`]).
    led: Hosted,
    /// The last global view it led in.
    led_view: u64,
    /// Its shard's other replicas that said, in this node's current view, that they held no
    /// log in a view after `led_view` (with every one of them it leads again).
    cleared: BTreeSet<NodeId>,
}

impl Hosted {
    /// A replica of `shard` led by `leader` (`followers`: those it leads, when it is the
    /// leader), holding nothing yet, in no view.
    fn new(
        shard: ShardId,
        replica: Replica,
        leader: NodeId,
        followers: Vec<NodeId>,
        keep_history: bool,
    ) -> Self {
        Self {
            shard,
            replica,
            store: MvccStore::new(),
            bodies: BTreeMap::new(),
            answers: BTreeMap::new(),
            answer_order: VecDeque::new(),
            queued: BTreeMap::new(),
            speculations: BTreeMap::new(),
            waits: Waits::default(),
            complete: BTreeSet::new(),
            pending: BTreeMap::new(),
            early_votes: BTreeMap::new(),
            decided: BTreeMap::new(),
            settling: BTreeSet::new(),
            fresh_outcomes: Vec::new(),
            acks: BTreeMap::new(),
            sent_to: BTreeMap::new(),
            bodies_to: BTreeMap::new(),
            pruned: 0,
            commit: 0,
            leader_base: 0,
            executed: 0,
            outcomes: BTreeMap::new(),
            fed: BTreeMap::new(),
            leader,
            followers,
            streams: None,
            replicated: 0,
            promised: Timestamp::ZERO,
            closed_sent: Timestamp::ZERO,
            closed: VecDeque::new(),
            unlisted: BTreeSet::new(),
            tail_cut: Timestamp::ZERO,
            snapshots: BTreeMap::new(),
            keep_history,
            joining: None,
            finished: 0,
            ahead: BTreeMap::new(),
            rejoin_end: 0,
            transfers: BTreeMap::new(),
            transfer_seq: 0,
            joined: BTreeMap::new(),
            rejoins: 0,
            journaled: BTreeMap::new(),
            checkpointed: 0,
            forgettable: BTreeSet::new(),
            forgettable_overflowed: false,
            restore_rows: Vec::new(),
            quiet: false,
            restore_events: Vec::new(),
            follower_checkpointed: 0,
            frozen: None,
            recovering: None,
            asking: BTreeSet::new(),
            results: BTreeMap::new(),
            retired: false,
            stashed: None,
            deposed: None,
            member_view: 0,
        }
    }

    /// Exchanges with `other` what belongs to the replica rather than to its role, which a
    /// deposed leader keeps while it rejoins and takes back if it leads again: the store
    /// (untouched until a transfer is installed), the snapshot reads waiting here, the
    /// transfer ids given and taken, its journal restoration, its follower checkpoint and the
    /// view it last held the log in.
    fn swap_kept(&mut self, other: &mut Hosted) {
        use std::mem::swap;
        swap(&mut self.store, &mut other.store);
        swap(&mut self.snapshots, &mut other.snapshots);
        swap(&mut self.keep_history, &mut other.keep_history);
        swap(&mut self.transfer_seq, &mut other.transfer_seq);
        swap(&mut self.rejoins, &mut other.rejoins);
        swap(&mut self.restore_rows, &mut other.restore_rows);
        swap(&mut self.restore_events, &mut other.restore_events);
        swap(&mut self.quiet, &mut other.quiet);
        swap(&mut self.follower_checkpointed, &mut other.follower_checkpointed);
        swap(&mut self.member_view, &mut other.member_view);
    }
}

/// A follower's state as it stood when a view change sent it to rejoin by a state transfer
/// (see [`Hosted::stashed`]): its log and what it kept of the entries it executed.
#[derive(Debug)]
struct Stashed {
    replica: Replica,
    bodies: BTreeMap<TxnId, Known>,
    answers: BTreeMap<TxnId, TigaMsg>,
    answer_order: VecDeque<TxnId>,
    outcomes: BTreeMap<TxnId, (bool, Vec<(u32, PieceOutput)>)>,
    fed: BTreeMap<TxnId, BTreeMap<ShardId, Vec<(u32, PieceOutput)>>>,
    results: BTreeMap<TxnId, (Timestamp, ShardResult)>,
    closed: VecDeque<(Timestamp, usize)>,
    unlisted: BTreeSet<TxnId>,
    tail_cut: Timestamp,
    ahead: BTreeMap<TxnId, Option<Overlay>>,
    executed: usize,
    commit: usize,
    leader_base: usize,
    rejoin_end: usize,
    follower_checkpointed: usize,
}

impl Stashed {
    /// A follower that holds nothing yet: `replica`, empty maps, positions at zero, and the
    /// executed count of its last checkpoint `follower_checkpointed` (which a drop keeps).
    fn empty(replica: Replica, follower_checkpointed: usize) -> Self {
        Self {
            replica,
            bodies: BTreeMap::new(),
            answers: BTreeMap::new(),
            answer_order: VecDeque::new(),
            outcomes: BTreeMap::new(),
            fed: BTreeMap::new(),
            results: BTreeMap::new(),
            closed: VecDeque::new(),
            unlisted: BTreeSet::new(),
            tail_cut: Timestamp::ZERO,
            ahead: BTreeMap::new(),
            executed: 0,
            commit: 0,
            leader_base: 0,
            rejoin_end: 0,
            follower_checkpointed,
        }
    }

    /// Exchanges this state with `host`'s: one way drops a follower's log (into an empty
    /// one), the other takes a dropped one up again.
    fn swap_with(&mut self, host: &mut Hosted) {
        use std::mem::swap;
        swap(&mut self.replica, &mut host.replica);
        swap(&mut self.bodies, &mut host.bodies);
        swap(&mut self.answers, &mut host.answers);
        swap(&mut self.answer_order, &mut host.answer_order);
        swap(&mut self.outcomes, &mut host.outcomes);
        swap(&mut self.fed, &mut host.fed);
        swap(&mut self.results, &mut host.results);
        swap(&mut self.closed, &mut host.closed);
        swap(&mut self.unlisted, &mut host.unlisted);
        swap(&mut self.tail_cut, &mut host.tail_cut);
        swap(&mut self.ahead, &mut host.ahead);
        swap(&mut self.executed, &mut host.executed);
        swap(&mut self.commit, &mut host.commit);
        swap(&mut self.leader_base, &mut host.leader_base);
        swap(&mut self.rejoin_end, &mut host.rejoin_end);
        swap(&mut self.follower_checkpointed, &mut host.follower_checkpointed);
    }
}

/// A follower's journal record, its bodies read back ([`super::journal::FollowerEvent`]).
#[derive(Debug)]
enum Restored {
    Released(Timestamp, Option<u64>, Known),
    Synced(usize, Vec<(TxnId, Timestamp, Option<Known>)>),
    Fetched(Known),
    Outcome(SyncOutcome),
    Unlisted(Timestamp),
}

/// What a replica's actions answer: another leader's message naming `shards`; `answer` when
/// this replica had released the transaction already (what it sends is an answer).
#[derive(Clone, Copy, Debug)]
struct PeerCall<'a> {
    shards: &'a [ShardId],
    answer: bool,
}

/// Timer purposes.
#[derive(Clone, Copy, Debug)]
enum Purpose {
    /// The next held transaction comes due.
    Release,
    /// Resend a transaction still undecided.
    Resend(RequestId, TxnId),
    /// Leaders: resend what followers and peers lack.
    Pace,
    /// A proposal came for a transaction not received here: fetch it if still missing.
    FetchBody(ShardId, TxnId, NodeId),
    /// A rejoining follower asks for the rest of its state transfer.
    Join(ShardId),
    /// A new leader asks again for the reports it lacks.
    Recover(ShardId),
    /// The view manager's tick: its group log, heartbeats, detection ([`manage`]).
    Manage,
}

/// A request in flight at this coordinator.
#[derive(Debug)]
struct InFlight {
    client: ClientRequest,
    txn: TxnId,
    body: TxnBody,
    /// A snapshot read (sent to one replica per shard, decided when each answered).
    snapshot: bool,
    /// The participant shards.
    shards: Vec<ShardId>,
    to: Vec<NodeId>,
    /// Per shard, its leader's result and the timestamp it was for (a snapshot read's: the
    /// read's). A detective leader answers where it ran speculatively and, if the timestamp
    /// moved, again where it agreed; a result for an earlier timestamp than one in hand is a
    /// stale copy.
    results: BTreeMap<ShardId, (Timestamp, ShardResult)>,
    pieces_total: usize,
    resends: u32,
}

/// Counters.
#[derive(Debug, Default)]
struct Counts {
    fast_total: u64,
    slow_total: u64,
    resends_total: u64,
    dropped_total: u64,
    votes_waited_total: u64,
    snapshot_reads_total: u64,
    snapshot_served_total: u64,
    /// Detective mode: speculative runs, those that stood, and those revoked.
    speculated_total: u64,
    speculations_kept_total: u64,
    revoked_total: u64,
    /// Messages of another view than this node's, dropped.
    stale_view_total: u64,
    /// Decisions whose leaders' results were of another timestamp (reported unknown).
    contradicted_total: u64,
    /// Leaders: state transfers cut for rejoining followers.
    transfers_total: u64,
    /// Followers: state transfers installed.
    rejoined_total: u64,
    /// Restarted leaders: log entries run again from the journal, and proposals held again.
    replayed_total: u64,
    restored_proposals_total: u64,
    /// Leaders: followers told they trail by more than the leader keeps bodies for.
    behind_total: u64,
    /// Followers: logs dropped on such word, for a state transfer.
    went_behind_total: u64,
    /// The most transaction bodies one hosted replica kept, as seen at each pace.
    bodies_high: u64,
    /// Late copies of bodies of transactions their coordinators decided, dropped.
    stale_bodies_total: u64,
    /// Leaders: late votes on transactions forgotten (or refused) here, dropped.
    stale_votes_total: u64,
    /// Leaders: proposals answered with a refusal, and proposals dropped on one.
    refused_sent_total: u64,
    refused_total: u64,
    /// Followers: transactions released here that the leader's log will never list at
    /// their timestamp, dropped.
    tail_dropped_total: u64,
    /// Followers: transactions released here that a conflicting entry above them in the
    /// synced prefix superseded (the leader's log will not hold them there either).
    tail_superseded_total: u64,
    /// Leaders: journal checkpoints written, and restarts that started from one.
    checkpoints_total: u64,
    resumed_from_checkpoint_total: u64,
    /// Followers restarted from their journals (not by a state transfer).
    followers_resumed_total: u64,
    /// Checkpoints put off because a follower's image could not be cut.
    checkpoints_put_off_total: u64,
    /// The bytes of the last checkpoint written.
    checkpoint_bytes_last: u64,
    /// Views installed, replicas retired by one, logs rebuilt and led, merges that failed,
    /// and reports over the limit not sent.
    views_installed_total: u64,
    views_refused_total: u64,
    retired_total: u64,
    views_led_total: u64,
    /// New leaders that took up the state they had dropped to rejoin (see
    /// [`Hosted::stashed`]).
    led_from_stash_total: u64,
    /// Deposed leaders that led on from the state they kept (see [`Hosted::deposed`]), and
    /// those whose kept state a replica that held the log later made void.
    views_resumed_total: u64,
    deposed_void_total: u64,
    /// Views installed with another agreement mode than the one before.
    mode_changes_total: u64,
    view_changes_failed_total: u64,
    reports_oversized_total: u64,
}

/// Which protocol a node runs: the two share everything but dispatch and the commit rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Tiga: every replica gets the transaction; a super quorum of matching fast replies, or
    /// the leader and `f` synced followers, commit it.
    Tiga,
    /// Luigi: the leaders only get it; followers learn it from the leader's log; the
    /// coordinator commits once every leader's result is in and its watermark covers the
    /// agreed timestamp ([`crate::luigi`]).
    Luigi,
}

/// A tiga (or luigi) node.
#[derive(Debug)]
pub struct TigaNode {
    context: NodeContext,
    variant: Variant,
    /// `tiga-snapshot-reads=on`.
    snapshot_reads: bool,
    /// `luigi` coordinators: per shard, this node's watermark there.
    watermarks: BTreeMap<ShardId, Timestamp>,
    /// `luigi` coordinators: transactions every leader answered, waiting for watermarks.
    awaiting: BTreeMap<TxnId, Committed>,
    view: View,
    hosted: BTreeMap<ShardId, Hosted>,
    /// The keys of `hosted`, which never change: walked on every step without collecting them.
    hosted_shards: Vec<ShardId>,
    tracker: Tracker,
    ids: AttemptIds,
    requests: BTreeMap<RequestId, InFlight>,
    by_txn: BTreeMap<TxnId, RequestId>,
    timers: Timers<Purpose>,
    release_at: Option<Time>,
    counts: Counts,
    /// The leaders' journal, and the sends waiting for it ([`super::journal`]).
    journal: Journal<TigaMsg>,
    /// A restarted leader's proposals held again, to send when it starts.
    restored: Vec<(ShardId, Vec<Action>)>,
    /// The delay settings the node was built with.
    owd: OwdSettings,
    /// The outbox a step writes into before its sends are held back for the journal.
    scratch: Outbox<TigaMsg>,
    /// Per coordinator start (node, incarnation), the sequence number below which it decided
    /// every transaction, as its own bodies said (at most [`COORDINATORS_TRACKED_MAX`]).
    decided_floors: BTreeMap<(NodeId, u64), u64>,
    /// Per shard, the closed timestamp its leader promised ([`TigaMsg::PeerClosed`]); this
    /// node's own led shards included.
    peer_closed: BTreeMap<ShardId, Timestamp>,
    /// A follower installed a state transfer: the step ends with a checkpoint.
    checkpoint_wanted: bool,
    /// The pace timer runs (it does once the node leads a shard).
    pacing: bool,
    /// The node restarted in a view its journal held (it installed one at a view change).
    view_journaled: bool,
    /// This node's part in the view manager, where the cluster has one ([`manage`]).
    manager: Option<Box<manage::Managing>>,
}

/// Coordinator starts whose decided floors a node keeps; past it, new ones are not tracked
/// (their transactions stay known as logged: memory, never safety).
pub const COORDINATORS_TRACKED_MAX: usize = 1 << 12;

impl TigaNode {
    /// A tiga node of `context` (in memory: a durable driver is refused by the caller).
    pub fn new(context: NodeContext) -> Result<Self, String> {
        let settings = TigaSettings::from_options(&context.options);
        let view = starting_view(&context.topology, &settings)?;
        Self::build(context, Variant::Tiga, view, settings.owd, settings.snapshot_reads)
    }

    /// A tiga node of `context` that restarted with `shards` found in its journal (whose
    /// next record is `next_seq`): see [`super::journal`].
    pub fn restored(
        context: NodeContext,
        shards: BTreeMap<ShardId, Recovered>,
        seqs: Seqs,
    ) -> Result<Self, String> {
        Self::restored_in_view(context, shards, seqs, None)
    }

    /// [`TigaNode::restored`], in the view its journal holds (one it installed at a view
    /// change, [`super::journal::Record::View`]) or, without one, the starting view.
    pub fn restored_in_view(
        context: NodeContext,
        shards: BTreeMap<ShardId, Recovered>,
        seqs: Seqs,
        view: Option<super::journal::JournaledView>,
    ) -> Result<Self, String> {
        let mut node = match view {
            None => Self::new(context)?,
            Some((global, local, detective)) => {
                if local.len() != context.topology.shards as usize {
                    return Err(format!("the tiga journal's view has {} shards", local.len()));
                }
                let settings = TigaSettings::from_options(&context.options);
                let mode = if detective { Mode::Detective } else { Mode::Preventive };
                let view = View { global, local, mode };
                let mut node = Self::build(
                    context,
                    Variant::Tiga,
                    view,
                    settings.owd,
                    settings.snapshot_reads,
                )?;
                node.view_journaled = true;
                node
            }
        };
        node.resume(shards, seqs)?;
        Ok(node)
    }

    /// A luigi node of `context` (stamping with `owd`) that restarted with `shards` found in
    /// its journal.
    pub fn luigi_restored(
        context: NodeContext,
        owd: OwdSettings,
        shards: BTreeMap<ShardId, Recovered>,
        seqs: Seqs,
    ) -> Result<Self, String> {
        Self::luigi_restored_in_view(context, owd, shards, seqs, None)
    }

    /// [`TigaNode::luigi_restored`], in the view its journal holds (or the starting view).
    pub fn luigi_restored_in_view(
        context: NodeContext,
        owd: OwdSettings,
        shards: BTreeMap<ShardId, Recovered>,
        seqs: Seqs,
        view: Option<super::journal::JournaledView>,
    ) -> Result<Self, String> {
        let mut node = match view {
            None => Self::luigi(context, owd)?,
            Some((global, local, detective)) => {
                if local.len() != context.topology.shards as usize || detective {
                    return Err(format!(
                        "the luigi journal's view has {} shards or detective mode",
                        local.len()
                    ));
                }
                let view = View { global, local, mode: Mode::Preventive };
                let mut node = Self::build(context, Variant::Luigi, view, owd, false)?;
                node.view_journaled = true;
                node
            }
        };
        node.resume(shards, seqs)?;
        Ok(node)
    }

    /// Offline (`meridian verify`): runs what [`TigaNode::restored`] took up from the journal
    /// (what the node does first when it starts), dropping what it would send. Counts the
    /// log entries taken up as commands.
    pub fn replay_journal(&mut self) -> crate::Replayed {
        let mut out = Outbox::new();
        let leaders = self.hosted.values().filter(|h| h.quiet);
        let end: u64 = leaders.map(|h| h.replica.log_len() as u64).sum();
        // The entries run again: those after the checkpoint, if there is one.
        let entries = self.counts.replayed_total;
        let snapshots = self.counts.resumed_from_checkpoint_total;
        let followers = self.hosted.values().any(|h| !h.restore_events.is_empty());
        if end > 0 || !self.restored.is_empty() || followers {
            self.replay(0, &mut out);
        }
        crate::Replayed { snapshots, commands: entries, log_index: end }
    }

    /// The global view number this node is in.
    pub fn view_number(&self) -> u64 {
        self.view.global
    }

    /// A luigi node of `context`, stamping with `owd`.
    pub fn luigi(context: NodeContext, owd: OwdSettings) -> Result<Self, String> {
        let view = initial_view(&context.topology)?;
        Self::build(context, Variant::Luigi, view, owd, false)
    }

    fn build(
        context: NodeContext,
        variant: Variant,
        view: View,
        owd: OwdSettings,
        snapshot_reads: bool,
    ) -> Result<Self, String> {
        let topology = &context.topology;
        let detective = view.mode == Mode::Detective;
        debug_assert!(!detective || variant == Variant::Tiga, "luigi agrees before executing");
        let limits = replica_limits(topology.shards);
        let mut hosted = BTreeMap::new();
        for slot in &topology.nodes[context.id.0 as usize].replicas {
            let shard = slot.shard;
            let leader_slot = view.leader_slot(shard, topology.replicas);
            let leader = topology.replica_node(shard, leader_slot).ok_or("no leader node")?;
            let leads = leader == context.id;
            let followers = if leads {
                topology.shard_nodes(shard).into_iter().filter(|&n| n != leader).collect()
            } else {
                Vec::new()
            };
            let replica = Replica::new(shard, leads, limits).with_detective(detective);
            let host = Hosted {
                acks: followers.iter().map(|&n| (n, (0, 0))).collect(),
                sent_to: followers.iter().map(|&n| (n, 0)).collect(),
                bodies_to: followers.iter().map(|&n| (n, 0)).collect(),
                streams: (leads && variant == Variant::Luigi)
                    .then(|| Streams::new(topology.nodes.len())),
                // A follower of a node started before may have vouched for entries it no
                // longer holds: it takes the leader's state before anything else.
                joining: (!leads && context.incarnation > 0).then(Joining::default),
                // Ids grow across the leader's starts too: a restarted leader's first image
                // must not take the id of one its previous start had begun to send (a
                // follower would mix the parts of the two).
                transfer_seq: (context.incarnation & 0xFFFF_FFFF) << 32,
                // A restart in a journaled view may have vouched in it.
                member_view: view.global,
                ..Hosted::new(shard, replica, leader, followers, snapshot_reads)
            };
            hosted.insert(shard, host);
        }
        let open_max = context.limits.requests_in_flight_max;
        Ok(Self {
            variant,
            snapshot_reads,
            watermarks: BTreeMap::new(),
            awaiting: BTreeMap::new(),
            tracker: Tracker::new(owd, open_max),
            owd,
            ids: AttemptIds::new(context.id, context.incarnation),
            view,
            hosted_shards: hosted.keys().copied().collect(),
            hosted,
            requests: BTreeMap::new(),
            by_txn: BTreeMap::new(),
            timers: Timers::default(),
            release_at: None,
            counts: Counts::default(),
            journal: Journal::new(0..0),
            restored: Vec::new(),
            scratch: Outbox::new(),
            decided_floors: BTreeMap::new(),
            peer_closed: BTreeMap::new(),
            checkpoint_wanted: false,
            pacing: false,
            view_journaled: false,
            manager: None,
            context,
        })
    }

    /// The node leading `shard` in the current view.
    fn leader_of(&self, shard: ShardId) -> Option<NodeId> {
        leader_node(&self.context, &self.view, shard)
    }

    /// Where to send a transaction on `shards`: every replica (tiga), or the leader (luigi).
    fn placement(&self, shards: &[ShardId]) -> Vec<ShardPlacement> {
        let topology = &self.context.topology;
        if self.variant == Variant::Luigi {
            return shards
                .iter()
                .filter_map(|&shard| {
                    let leader = self.leader_of(shard)?;
                    Some(ShardPlacement { shard, replicas: vec![leader], leader_slot: 0 })
                })
                .collect();
        }
        shards
            .iter()
            .map(|&shard| ShardPlacement {
                shard,
                replicas: (0..topology.replicas)
                    .filter_map(|slot| topology.replica_node(shard, slot))
                    .collect(),
                leader_slot: self.view.leader_slot(shard, topology.replicas),
            })
            .collect()
    }

    fn pace_ns(&self) -> u64 {
        (self.context.timing.rpc_timeout_ns / 8).max(meridian_core::time::NS_PER_MS)
    }

    // ----- coordinator -------------------------------------------------------------------

    fn start(&mut self, now: Time, client: ClientRequest, out: &mut Outbox<TigaMsg>) {
        let id = client.id;
        if self.requests.contains_key(&id) {
            return; // A duplicate submit: the first is answered.
        }
        let home = ShardId(self.context.id.0 % self.context.topology.shards);
        let shape = match shape_of(&self.context, &client.txn, home) {
            Ok(shape) => shape,
            Err(error) => {
                return out.reply(id, TxnOutcome::failed(TxnFailure::Procedure(error)));
            }
        };
        let read_only = || shape.parts.values().all(|p| p.writes.is_empty() && p.inputs.is_empty());
        if self.snapshot_reads && read_only() {
            return self.start_snapshot(now, client, &shape, home, out);
        }
        let txn = self.ids.next_id();
        let placement = self.placement(&shape.shards());
        let (ts, to) = match self.tracker.start(now, txn, &placement) {
            Ok(started) => started,
            Err(Refused::Busy) => {
                let why = "as many transactions in flight as this coordinator runs";
                return out.reply(id, TxnOutcome::failed(TxnFailure::Rejected(why.into())));
            }
            Err(refused) => {
                let why = format!("{refused:?}");
                return out.reply(id, TxnOutcome::failed(TxnFailure::Rejected(why)));
            }
        };
        let decided_below = self.decided_below();
        let body =
            TxnBody { txn, ts, sent_at: now, request: client.txn.clone(), home, decided_below };
        for &node in &to {
            out.send(node, TigaMsg::Txn(Box::new(body.clone())));
        }
        self.timers.set(Purpose::Resend(id, txn), self.context.timing.rpc_timeout_ns, out);
        self.by_txn.insert(txn, id);
        let flight = InFlight {
            client,
            txn,
            body,
            snapshot: false,
            shards: shape.shards(),
            to,
            results: BTreeMap::new(),
            pieces_total: shape.pieces_total,
            resends: 0,
        };
        self.requests.insert(id, flight);
    }

    /// Starts a snapshot read: a timestamp a little behind this coordinator's clock (two
    /// paces, so that the followers' closed timestamps have usually passed it), sent to the
    /// closest replica of each participant shard.
    fn start_snapshot(
        &mut self,
        now: Time,
        client: ClientRequest,
        shape: &Shape,
        home: ShardId,
        out: &mut Outbox<TigaMsg>,
    ) {
        let id = client.id;
        if self.requests.len() >= self.context.limits.requests_in_flight_max {
            let why = "as many transactions in flight as this coordinator runs";
            return out.reply(id, TxnOutcome::failed(TxnFailure::Rejected(why.into())));
        }
        let txn = self.ids.next_id();
        let shards = shape.shards();
        let mut to = Vec::with_capacity(shards.len());
        let topology = self.context.topology.clone();
        let here = topology.region_of(self.context.id);
        for &shard in &shards {
            // By delay estimate (replies carry samples); before any, a replica in this
            // region first.
            let closest = topology
                .shard_nodes(shard)
                .into_iter()
                .min_by_key(|&n| (self.tracker.estimate_ns(n), topology.region_of(n) != here, n.0));
            to.extend(closest);
        }
        // Never 0: the initial load sits there, and nothing is ever closed below it.
        let ts = Timestamp(now.saturating_sub(2 * self.pace_ns()).max(1));
        let decided_below = self.decided_below();
        let body =
            TxnBody { txn, ts, sent_at: now, request: client.txn.clone(), home, decided_below };
        self.timers.set(Purpose::Resend(id, txn), self.context.timing.rpc_timeout_ns, out);
        self.by_txn.insert(txn, id);
        let flight = InFlight {
            client,
            txn,
            body: body.clone(),
            snapshot: true,
            shards,
            to: to.clone(),
            results: BTreeMap::new(),
            pieces_total: shape.pieces_total,
            resends: 0,
        };
        self.requests.insert(id, flight);
        for node in to {
            self.send_snapshot_read(now, node, &body, out);
        }
    }

    /// Sends a snapshot read to `node` (handled at once when it is this node).
    fn send_snapshot_read(
        &mut self,
        now: Time,
        node: NodeId,
        body: &TxnBody,
        out: &mut Outbox<TigaMsg>,
    ) {
        if node == self.context.id {
            self.on_snapshot_read(now, node, body.clone(), out);
        } else {
            out.send(node, TigaMsg::SnapRead(Box::new(body.clone())));
        }
    }

    /// A shard's answer to a snapshot read from one of its replicas.
    fn on_snapshot_reply(
        &mut self,
        from: NodeId,
        (txn, shard, result): (TxnId, ShardId, ShardResult),
        out: &mut Outbox<TigaMsg>,
    ) {
        let Some(&id) = self.by_txn.get(&txn) else { return };
        let Some(flight) = self.requests.get_mut(&id) else { return };
        let replica = shard.0 < self.context.topology.shards
            && self.context.topology.shard_nodes(shard).contains(&from);
        if !flight.snapshot || !flight.shards.contains(&shard) || !replica {
            self.counts.dropped_total += 1;
            return;
        }
        flight.results.entry(shard).or_insert((flight.body.ts, result));
        if flight.shards.iter().all(|s| flight.results.contains_key(s)) {
            let ts = flight.body.ts;
            self.on_decided(Committed { txn, ts, fast: false }, out);
        }
    }

    /// The lowest sequence number of this coordinator's transactions still undecided (the
    /// next one's when none is): every lower one is decided and never sent again.
    fn decided_below(&self) -> u64 {
        // Every id in flight here is this incarnation's (`self.ids`), so the first is the lowest.
        self.by_txn.keys().next().map_or(self.ids.next_seq(), |txn| txn.seq)
    }

    fn resend(&mut self, now: Time, id: RequestId, txn: TxnId, out: &mut Outbox<TigaMsg>) {
        let decided_below = self.decided_below();
        let Some(flight) = self.requests.get_mut(&id) else { return };
        if flight.txn != txn {
            return;
        }
        flight.resends += 1;
        if flight.resends >= self.context.timing.attempts_max {
            let why = format!("undecided after {} sends", flight.resends);
            self.tracker.abandon(txn);
            self.awaiting.remove(&txn);
            self.by_txn.remove(&txn);
            let flight = self.requests.remove(&id).expect("just seen");
            return out.reply(flight.client.id, TxnOutcome::failed(TxnFailure::Indeterminate(why)));
        }
        self.counts.resends_total += 1;
        flight.body.sent_at = now;
        flight.body.decided_below = decided_below;
        if flight.snapshot {
            // To the leaders of the shards still silent: a leader closes its snapshot as
            // soon as what it released below the timestamp has run.
            let body = flight.body.clone();
            let silent: Vec<ShardId> =
                flight.shards.iter().copied().filter(|s| !flight.results.contains_key(s)).collect();
            self.timers.set(Purpose::Resend(id, txn), self.context.timing.rpc_timeout_ns, out);
            for shard in silent {
                if let Some(leader) = self.leader_of(shard) {
                    self.send_snapshot_read(now, leader, &body, out);
                }
            }
            return;
        }
        for &node in &flight.to {
            out.send(node, TigaMsg::Txn(Box::new(flight.body.clone())));
        }
        self.timers.set(Purpose::Resend(id, txn), self.context.timing.rpc_timeout_ns, out);
    }

    fn on_decided(&mut self, committed: Committed, out: &mut Outbox<TigaMsg>) {
        let Some(id) = self.by_txn.remove(&committed.txn) else { return };
        let Some(flight) = self.requests.remove(&id) else { return };
        // Every shard committed at its leader's latest timestamp, whose result is the one
        // kept. A leader whose replies contradict each other (found by fuzzing with forged
        // replies; honest leaders never do) leaves no result to report: the outcome is
        // unknown, never another timestamp's result.
        if flight.results.values().any(|&(ts, _)| ts != committed.ts) {
            self.counts.contradicted_total += 1;
            let why = format!("{}: a leader's replies contradict the decision", committed.txn);
            let failure = TxnFailure::Indeterminate(why);
            return out.reply(flight.client.id, TxnOutcome::failed(failure));
        }
        let mut outcome = TxnOutcome {
            result: TxnResult::Committed,
            outputs: Vec::new(),
            commit_ts: None,
            retries: 0,
            aborts: AbortCounts::default(),
            shards_touched: flight.results.len() as u32,
            path: CommitPath::None,
            speculative_ns: None,
        };
        let mut outputs: Vec<Option<PieceOutput>> = vec![None; flight.pieces_total];
        for (_, result) in flight.results.values() {
            match result {
                ShardResult::Failed(error) => {
                    outcome.result = TxnResult::Failed(TxnFailure::Procedure(error.clone()));
                }
                ShardResult::UserAbort(why) if outcome.result == TxnResult::Committed => {
                    outcome.result = TxnResult::UserAborted(why.clone());
                }
                ShardResult::UserAbort(_) | ShardResult::Skipped => {}
                ShardResult::Ran(ran) => {
                    for (piece, output) in ran {
                        if let Some(slot) = outputs.get_mut(*piece as usize) {
                            *slot = Some(output.clone());
                        }
                    }
                }
            }
        }
        let skipped = flight.results.values().any(|(_, r)| matches!(r, ShardResult::Skipped));
        if skipped && outcome.result == TxnResult::Committed {
            // A shard skips only when another aborted, and that one's reason is the better
            // one; a leader that says it skipped when none aborted is wrong, and the commit
            // is not reported on its word.
            outcome.result = TxnResult::UserAborted("aborted on another shard".into());
        }
        if outcome.result == TxnResult::Committed {
            outcome.outputs = outputs.into_iter().map(Option::unwrap_or_default).collect();
            outcome.commit_ts = Some(committed.ts);
            // Luigi has no fast path: it commits once the leaders' logs are replicated.
            let fast = committed.fast && self.variant == Variant::Tiga;
            outcome.path = if flight.snapshot {
                CommitPath::Snapshot
            } else if fast {
                CommitPath::Fast
            } else {
                CommitPath::Slow
            };
            if flight.snapshot {
                self.counts.snapshot_reads_total += 1;
            } else if fast {
                self.counts.fast_total += 1;
            } else {
                self.counts.slow_total += 1;
            }
        }
        out.reply(flight.client.id, outcome);
    }

    fn on_fast(
        &mut self,
        from: NodeId,
        reply: (TxnId, ShardId, Timestamp, u64),
        owd_ns: Option<u64>,
        result: Option<ShardResult>,
        out: &mut Outbox<TigaMsg>,
    ) {
        let (txn, shard, ts, hash) = reply;
        // A sample of the delay to `from` whether or not the transaction is decided: a
        // replica that replies only after the slow path committed is still one the next
        // timestamps must wait for.
        if let Some(owd_ns) = owd_ns {
            self.tracker.observe(from, owd_ns);
        }
        let Some(&id) = self.by_txn.get(&txn) else {
            // Decided already: on the slow path, the tracker counts a super quorum matching
            // after all.
            let _ = self.tracker.on_fast(from, txn, shard, ts, hash);
            return;
        };
        let from_leader = self.leader_of(shard) == Some(from);
        if from_leader && result.is_none() {
            return; // A leader's fast reply carries its shard's result: malformed.
        }
        if let Some(result) = result {
            if !from_leader {
                return; // Results come from the shard's leader only.
            }
            if let Some(flight) = self.requests.get_mut(&id) {
                if !flight.shards.contains(&shard) {
                    return; // Not a participant (found by fuzzing): no honest leader says so.
                }
                if flight.results.get(&shard).is_none_or(|&(had, _)| had <= ts) {
                    flight.results.insert(shard, (ts, result));
                }
            }
        }
        if let Some(decided) = self.tracker.on_fast(from, txn, shard, ts, hash) {
            match self.variant {
                Variant::Tiga => self.on_decided(decided, out),
                Variant::Luigi => {
                    // Every leader answered at the agreed timestamp: committed once each
                    // participant's watermark covers it.
                    self.awaiting.insert(txn, decided);
                    self.commit_covered(out);
                }
            }
        }
    }

    /// Luigi coordinator: `shard`'s leader says this node's watermark there is `ts`.
    fn on_watermark(
        &mut self,
        from: NodeId,
        shard: ShardId,
        ts: Timestamp,
        out: &mut Outbox<TigaMsg>,
    ) {
        if self.variant != Variant::Luigi || !self.is_leader_node(shard, from) {
            self.counts.dropped_total += 1;
            return;
        }
        let mark = self.watermarks.entry(shard).or_insert(Timestamp::ZERO);
        if ts > *mark {
            *mark = ts;
            self.commit_covered(out);
        }
    }

    /// Luigi coordinator: commits every answered transaction that every participant's
    /// watermark covers. Bounded by the transactions in flight.
    fn commit_covered(&mut self, out: &mut Outbox<TigaMsg>) {
        let covered: Vec<Committed> =
            self.awaiting.values().filter(|d| self.covered(d)).copied().collect();
        for decided in covered {
            self.awaiting.remove(&decided.txn);
            self.on_decided(decided, out);
        }
    }

    /// True when every participant of `decided` answered and its watermark here covers the
    /// agreed timestamp (or the transaction is gone: answered otherwise, dropped then).
    fn covered(&self, decided: &Committed) -> bool {
        let flight = self.by_txn.get(&decided.txn).and_then(|id| self.requests.get(id));
        let Some(flight) = flight else { return true };
        flight.shards.iter().all(|shard| {
            let answered = flight.results.contains_key(shard);
            answered && self.watermarks.get(shard).is_some_and(|&mark| mark >= decided.ts)
        })
    }

    // ----- replicas ----------------------------------------------------------------------

    /// A body arrived from `from`: its coordinator (tiga: to every replica; luigi: to the
    /// leaders), a peer leader answering a fetch, or this shard's leader (a follower's fetch;
    /// luigi: with its log). A body from anyone else is dropped (and counted): it would
    /// claim another coordinator's transaction, or plant a body under a real id.
    fn on_body(&mut self, now: Time, from: NodeId, body: TxnBody, out: &mut Outbox<TigaMsg>) {
        let Ok(shape) = shape_of(&self.context, &body.request, body.home) else {
            self.counts.dropped_total += 1;
            return; // Malformed: its coordinator would not have sent it.
        };
        let shards = shape.shards();
        // Luigi: a follower's leader relays the coordinator's body with its log, and with it
        // what the coordinator had decided when it sent it (the results kept for a view
        // change go by it).
        let me = self.context.id;
        let relayed = self.variant == Variant::Luigi
            && from != me
            && self.hosted.values().any(|h| h.leader == from);
        if from == body.txn.origin || relayed {
            for host in self.hosted.values_mut() {
                forget_decided_answers(host, body.txn, body.decided_below);
            }
            note_decided(&mut self.decided_floors, body.txn, body.decided_below);
        }
        let body = Arc::new(body);
        // A sample of the delay from the coordinator only where it sent this copy.
        let owd_ns = (from == body.txn.origin).then(|| now.saturating_sub(body.sent_at));
        let from_peer_leader = shards.iter().any(|&s| self.is_leader_node(s, from));
        let hosted_shards: Vec<ShardId> =
            shards.iter().copied().filter(|s| self.hosted.contains_key(s)).collect();
        let mut parts = shape.parts;
        for shard in hosted_shards {
            let part = parts.remove(&shard).expect("a participant");
            let coordinator = body.txn.origin;
            let host = self.hosted.get_mut(&shard).expect("filtered");
            let wanted = host.recovering.as_ref().is_some_and(|r| r.wanted.contains(&body.txn));
            if wanted && (from == body.txn.origin || from_peer_leader) {
                // A new leader waits for this body to rebuild its log.
                let known = Known { body: body.clone(), owd_ns, part, shards: shards.clone() };
                self.take_wanted_body(now, shard, known, out);
                continue;
            }
            if host.joining.is_some() || host.recovering.is_some() {
                // Nothing is taken before the shard's state, or while its new leader gathers
                // the reports (the coordinator resends).
                continue;
            }
            let txn = body.txn;
            let trusted = if host.replica.leads() {
                from == coordinator || from_peer_leader
            } else {
                from == host.leader || (self.variant == Variant::Tiga && from == coordinator)
            };
            if !trusted {
                self.counts.dropped_total += 1;
                continue;
            }
            if !host.replica.logged(txn)
                && !host.bodies.contains_key(&txn)
                && !host.replica.wants_body(txn)
                && is_decided(&self.decided_floors, txn)
            {
                // A late copy of a transaction its coordinator decided: a replica that has
                // dropped it from its log may no longer know it logged it, and must not take
                // it again (a follower's leader's log brings what it still needs). A leader
                // that never took it refuses it for good: another leader still holding it
                // hears so when it proposes ([`TigaMsg::Refused`]).
                self.counts.stale_bodies_total += 1;
                continue;
            }
            if host.replica.logged(txn) || host.bodies.contains_key(&txn) {
                // A resend: say again what was said (if anything yet), and for a follower
                // whose fetch this answers, take the body (only then: one that executed
                // and dropped it must not keep a copy again).
                let wanted = host.replica.wants_body(txn);
                if wanted && !host.bodies.contains_key(&txn) && host.bodies.len() < BODIES_MAX {
                    let keys = part.log_keys();
                    host.bodies.insert(
                        txn,
                        Known {
                            body: body.clone(),
                            owd_ns,
                            part: part.clone(),
                            shards: shards.clone(),
                        },
                    );
                    let actions = host.replica.on_body(txn, &keys);
                    let synced = actions.iter().any(|a| matches!(a, Action::SlowReply { .. }));
                    // A synced entry's body: journaled before the replies it lets go.
                    self.journal.write(&Record::Fetched { shard, body: (*body).clone() });
                    self.act(now, shard, actions, None, out);
                    if synced && self.variant == Variant::Luigi {
                        // A luigi leader counts replicas by their acknowledgements.
                        let host = &self.hosted[&shard];
                        out.send(
                            host.leader,
                            ack_msg((self.view.global, self.context.incarnation), host, Vec::new()),
                        );
                    }
                }
                let host = self.hosted.get_mut(&shard).expect("hosted");
                if let Some(answer) = host.answers.get(&txn) {
                    out.send(coordinator, refresh_owd(answer.clone(), owd_ns));
                }
                if let Some(streams) = &host.streams {
                    // The coordinator may have missed its watermark too.
                    let ts = streams.watermark(coordinator);
                    out.send(coordinator, TigaMsg::Watermark { view: self.view.global, shard, ts });
                }
                if host.replica.leads() {
                    let actions = leader_arrive(host, incoming(txn, body.ts, &shards, &part));
                    self.act(now, shard, actions, None, out);
                }
                continue;
            }
            let no_stream = host.streams.as_ref().is_some_and(|s| s.floor(coordinator).is_none());
            if host.bodies.len() >= BODIES_MAX || no_stream {
                // No room, or (luigi) a worker outside the cluster or with a full stream: the
                // body is not kept (the coordinator resends).
                self.counts.dropped_total += 1;
                continue;
            }
            if self.variant == Variant::Luigi && !host.replica.leads() {
                // A luigi follower executes what its leader's log lists, nothing else.
                let known = Known { body: body.clone(), owd_ns, part, shards: shards.clone() };
                host.bodies.insert(txn, known);
                continue;
            }
            let incoming = incoming(txn, body.ts, &shards, &part);
            host.bodies
                .insert(txn, Known { body: body.clone(), owd_ns, part, shards: shards.clone() });
            let actions = if host.replica.leads() {
                leader_arrive(host, incoming)
            } else {
                host.replica.arrive(incoming)
            };
            self.act(now, shard, actions, None, out);
        }
        self.release(now, out);
    }

    /// A snapshot read from its coordinator: kept (bounded) until this replica's snapshot at
    /// its timestamp is closed, then answered.
    fn on_snapshot_read(
        &mut self,
        now: Time,
        from: NodeId,
        body: TxnBody,
        out: &mut Outbox<TigaMsg>,
    ) {
        let Ok(shape) = shape_of(&self.context, &body.request, body.home) else {
            self.counts.dropped_total += 1;
            return;
        };
        // A timestamp past the clock by more than an RPC timeout would wait here for long
        // (skewed clocks, or a hostile sender): refused; the coordinator resends.
        let far = body.ts.0 > now.saturating_add(self.context.timing.rpc_timeout_ns);
        if !self.snapshot_reads || from != body.txn.origin || far {
            self.counts.dropped_total += 1;
            return;
        }
        let shards = shape.shards();
        let owd_ns = now.saturating_sub(body.sent_at);
        let body = Arc::new(body);
        let key = (body.ts, body.txn);
        for (&shard, part) in &shape.parts {
            let Some(host) = self.hosted.get_mut(&shard) else { continue };
            let read_only = part.writes.is_empty() && part.inputs.is_empty();
            if !read_only || host.snapshots.len() >= SNAPSHOTS_WAITING_MAX {
                self.counts.dropped_total += 1;
                continue;
            }
            let known = Known {
                body: body.clone(),
                owd_ns: Some(owd_ns),
                part: part.clone(),
                shards: shards.clone(),
            };
            host.snapshots.entry(key).or_insert(known);
        }
        self.serve_snapshots(now, out);
    }

    /// Answers the snapshot reads whose timestamp is closed here: at a leader, everything it
    /// released at or below it has run and it takes nothing new there (it promises so); at a
    /// follower, the leader said so and this replica executed the log that far.
    fn serve_snapshots(&mut self, now: Time, out: &mut Outbox<TigaMsg>) {
        let me = self.context.id;
        let mut local = Vec::new();
        for host in self.hosted.values_mut() {
            if host.snapshots.is_empty() {
                continue;
            }
            let closed = if host.replica.leads() {
                leader_closed(host, now)
            } else {
                // The latest closed timestamp whose log this follower has executed; older
                // ones it supersedes go (the pairs come in order, log lengths growing).
                let executed = host.executed;
                while host.closed.get(1).is_some_and(|&(_, upto)| upto <= executed) {
                    host.closed.pop_front();
                }
                match host.closed.front() {
                    Some(&(ts, upto)) if upto <= executed => ts,
                    _ => continue,
                }
            };
            // Bounded by the waiting reads (at most SNAPSHOTS_WAITING_MAX).
            while let Some(entry) = host.snapshots.first_entry() {
                let (ts, txn) = *entry.key();
                if ts > closed {
                    break;
                }
                let known = entry.remove();
                if host.replica.leads() && ts > host.promised {
                    host.promised = ts;
                    self.journal.write(&Record::Promised { shard: host.shard, ts });
                }
                let (_, result) = run_part(&self.context, host.shard, &host.store, &known, ts, &[]);
                self.counts.snapshot_served_total += 1;
                let shard = host.shard;
                if txn.origin == me {
                    local.push((txn, shard, result));
                } else {
                    let owd_ns = known.owd_ns.unwrap_or(0);
                    out.send(
                        txn.origin,
                        TigaMsg::SnapReply { view: self.view.global, txn, shard, result, owd_ns },
                    );
                }
            }
        }
        for reply in local {
            self.on_snapshot_reply(me, reply, out);
        }
    }

    /// Leader: moves the promised closed timestamp up to what is closed now and tells the
    /// followers, with the log length that covers it: they serve snapshot reads at it, and
    /// (tiga) drop what they released at or below it that the log does not list.
    fn close_for_followers(&mut self, now: Time, shard: ShardId, out: &mut Outbox<TigaMsg>) {
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        let wanted = self.snapshot_reads || self.variant == Variant::Tiga;
        if !wanted || !host.replica.leads() || host.followers.is_empty() {
            return;
        }
        self.promise_closed(now, shard);
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        if host.promised > host.closed_sent {
            host.closed_sent = host.promised;
            let upto = host.replica.log_len() as u64;
            for &follower in &host.followers {
                out.send(
                    follower,
                    TigaMsg::Closed { view: self.view.global, shard, ts: host.promised, upto },
                );
            }
        }
    }

    /// Leader: raises the closed timestamp it promises (journaled before anything that
    /// follows from it goes out) to what is closed here, at most a pace back: reads ask for
    /// two paces back, and promising more would bump late arrivals for nothing.
    fn promise_closed(&mut self, now: Time, shard: ShardId) {
        let cap = Timestamp(now.saturating_sub(self.pace_ns()));
        let Some(host) = self.hosted.get_mut(&shard).filter(|h| h.replica.leads()) else {
            return;
        };
        let promised = host.promised.max(leader_closed(host, now).min(cap));
        if promised > host.promised {
            host.promised = promised;
            self.journal.write(&Record::Promised { shard, ts: promised });
        }
    }

    /// Leader (of a cluster of several shards): promises a closed timestamp and tells the
    /// other shards' leaders, then drops the settled outcome records every other leader's
    /// promise covers ([`TigaMsg::PeerClosed`]).
    fn close_for_peers(&mut self, now: Time, shard: ShardId, out: &mut Outbox<TigaMsg>) {
        let shards = self.context.topology.shards;
        if shards < 2 || !self.hosted.get(&shard).is_some_and(|h| h.replica.leads()) {
            return;
        }
        self.promise_closed(now, shard);
        let promised = self.hosted[&shard].promised;
        self.peer_closed.insert(shard, promised);
        let me = self.context.id;
        // Bounded by the cluster's shards.
        for peer in (0..shards).map(ShardId).filter(|&s| s != shard) {
            let Some(node) = leader_node(&self.context, &self.view, peer) else { continue };
            if node != me {
                let msg = TigaMsg::PeerClosed { view: self.view.global, shard, ts: promised };
                out.send(node, msg);
            }
        }
        let covered = self.peers_promised(shard);
        let host = self.hosted.get_mut(&shard).expect("led here");
        // Bounded by the records settled.
        while let Some(&(ts, txn)) = host.settling.first() {
            if ts > covered {
                break;
            }
            host.settling.pop_first();
            host.decided.remove(&txn);
        }
    }

    /// The least closed timestamp the other shards' leaders promised this leader of `shard`
    /// (each finished every transaction at or below it); the end of time in a cluster of one
    /// shard.
    fn peers_promised(&self, shard: ShardId) -> Timestamp {
        // Bounded by the cluster's shards.
        (0..self.context.topology.shards)
            .map(ShardId)
            .filter(|&s| s != shard)
            .map(|s| self.peer_closed.get(&s).copied().unwrap_or(Timestamp::ZERO))
            .min()
            .unwrap_or(Timestamp::MAX)
    }

    /// Carries out a replica's actions. `peer`: set when they answer another leader's
    /// proposal or confirmation.
    fn act(
        &mut self,
        now: Time,
        shard: ShardId,
        actions: Vec<Action>,
        peer: Option<PeerCall<'_>>,
        out: &mut Outbox<TigaMsg>,
    ) {
        for action in actions {
            let Some(host) = self.hosted.get_mut(&shard) else { return };
            match action {
                Action::Propose { txn, ts, to } => {
                    // A leader's first proposal is its only one (peers keep the first they
                    // hear): journaled once, before it goes out.
                    if let Some(known) = host.bodies.get(&txn) {
                        let first = !host.journaled.contains_key(&txn);
                        if host.replica.held_at(txn).is_some() && first {
                            host.journaled.insert(txn, ts);
                            let body = (*known.body).clone();
                            self.journal.write(&Record::Proposed { shard, ts, body });
                        }
                    }
                    self.tell_leaders(now, shard, (txn, Some(ts)), to, peer, out);
                }
                Action::Confirm { txn, to } => {
                    self.tell_leaders(now, shard, (txn, None), to, peer, out);
                }
                Action::Execute { txn, ts } => {
                    let Some(known) = host.bodies.get(&txn) else {
                        debug_assert!(false, "{txn} released without its body");
                        continue;
                    };
                    host.waits.enqueue((ts, txn), &known.part.reads, &known.part.writes);
                    if !host.quiet {
                        let body = (*known.body).clone();
                        self.journal.write(&Record::Logged { shard, ts, body });
                    }
                    host.journaled.remove(&txn);
                    host.queued.insert(txn, Queued { ts, hash: 0, speculative: false });
                }
                Action::Speculate { txn, ts, hash } => {
                    let Some(known) = host.bodies.get(&txn) else {
                        debug_assert!(false, "{txn} held without its body");
                        continue;
                    };
                    if !known.part.inputs.is_empty() {
                        // It takes other shards' outputs, which come with their votes, after
                        // the agreement: it runs once released.
                        continue;
                    }
                    host.waits.enqueue((ts, txn), &known.part.reads, &known.part.writes);
                    host.queued.insert(txn, Queued { ts, hash, speculative: true });
                }
                Action::Revoke { txn, ts } => {
                    let ran = host.speculations.remove(&txn).is_some();
                    let waiting = host.queued.get(&txn).is_some_and(|q| q.speculative);
                    if waiting {
                        host.queued.remove(&txn);
                    }
                    if let (true, Some(known)) = (ran || waiting, host.bodies.get(&txn)) {
                        let part = &known.part;
                        host.waits.withdraw((ts, txn), &part.reads, &part.writes);
                    }
                    if ran {
                        self.counts.revoked_total += 1;
                    }
                }
                Action::FastReply { txn, ts, hash } => {
                    if host.replica.leads() {
                        // Sent once the transaction has executed (with its result).
                        if let Some(queued) = host.queued.get_mut(&txn) {
                            queued.hash = hash;
                        }
                        continue;
                    }
                    let Some(known) = host.bodies.get_mut(&txn) else { continue };
                    let owd_ns = known.owd_ns.take();
                    if !host.quiet {
                        // What this reply vouches for is durable before it goes.
                        let body = (*known.body).clone();
                        self.journal.write(&Record::Released { shard, ts, hash: Some(hash), body });
                    }
                    let msg = TigaMsg::Fast {
                        view: self.view.global,
                        txn,
                        shard,
                        ts,
                        hash,
                        owd_ns,
                        result: None,
                    };
                    reply(host, txn, msg, out);
                }
                Action::SlowReply { .. } if self.variant == Variant::Luigi => {
                    // Luigi followers answer their leader only (acknowledgements).
                }
                Action::SlowReply { txn, ts } => {
                    let msg = slow_reply(self.view.global, host, txn, ts);
                    reply(host, txn, msg, out);
                }
                Action::Superseded { dropped } => {
                    // As if dropped at a promise: the body stays until its coordinator
                    // decided it (see `drop_unlisted`). A restart drops them again, running
                    // the records of the entries that superseded them.
                    self.counts.tail_superseded_total += dropped.len() as u64;
                    host.unlisted.extend(dropped.into_iter().map(|(txn, _)| txn));
                }
                Action::Fetch { txns } => {
                    let msg = TigaMsg::SyncAck {
                        view: self.view.global,
                        shard,
                        start: follower_start(self.context.incarnation, host),
                        synced: host.replica.sync_point() as u64,
                        executed: host.executed as u64,
                        fetch: txns,
                    };
                    out.send(host.leader, msg);
                }
                Action::Resend { .. } => {
                    // The sync-point, not the listed prefix: the leader counts acknowledged
                    // positions as held here (luigi's watermarks), and entries past the
                    // sync-point may lack their bodies. Resending from there is harmless.
                    out.send(
                        host.leader,
                        ack_msg((self.view.global, self.context.incarnation), host, Vec::new()),
                    );
                }
            }
        }
        self.execute_all(now, out);
    }

    /// Sends `shard`'s proposal (`Some` timestamp) or confirmation for `txn` to the leaders of
    /// `to`. The participants come from the body, or from the peer's message for a
    /// transaction whose body is gone here.
    fn tell_leaders(
        &mut self,
        now: Time,
        shard: ShardId,
        (txn, proposed): (TxnId, Option<Timestamp>),
        to: Vec<ShardId>,
        peer: Option<PeerCall<'_>>,
        out: &mut Outbox<TigaMsg>,
    ) {
        let known = self.hosted.get(&shard).and_then(|h| h.bodies.get(&txn)).map(|k| &k.shards);
        let Some(shards) = known.cloned().or_else(|| peer.map(|p| p.shards.to_vec())) else {
            return;
        };
        let answer = peer.is_some_and(|p| p.answer);
        for leader in to {
            let shards = shards.clone();
            let msg = match proposed {
                Some(ts) => TigaMsg::Propose {
                    view: self.view.global,
                    txn,
                    shards,
                    from: shard,
                    ts,
                    answer,
                },
                None => {
                    TigaMsg::Confirm { view: self.view.global, txn, shards, from: shard, answer }
                }
            };
            self.send_to_leader(now, leader, msg, out);
        }
    }

    /// Sends `msg` to the leader of `shard`; one for this very node (it leads both shards)
    /// is handled at once.
    fn send_to_leader(
        &mut self,
        now: Time,
        shard: ShardId,
        msg: TigaMsg,
        out: &mut Outbox<TigaMsg>,
    ) {
        let Some(node) = self.leader_of(shard) else { return };
        if node == self.context.id {
            self.on_peer(now, node, msg, out);
        } else {
            out.send(node, msg);
        }
    }

    /// Executes what every hosted replica can: leaders their released transactions, followers
    /// their synced log; votes between shards led here pass in place.
    fn execute_all(&mut self, now: Time, out: &mut Outbox<TigaMsg>) {
        // Each round executes or finishes at least one transaction, or stops.
        loop {
            let mut progressed = false;
            for index in 0..self.hosted_shards.len() {
                progressed |= self.execute(self.hosted_shards[index], out);
            }
            if !progressed {
                break;
            }
        }
        // What a follower executed is no longer needed in its log.
        let drop_min = self.context.limits.log_drop_min;
        for host in self.hosted.values_mut() {
            // Nor what another follower has not executed yet: the leader's base says what
            // every follower did (a view change gathers the rest from the followers).
            let upto = host.executed.min(host.leader_base);
            let due = upto >= host.replica.log_base() + drop_min;
            if due && !host.replica.leads() && host.joining.is_none() {
                let base = host.replica.log_base();
                for (txn, _) in host.replica.follower_entries(base, upto) {
                    host.outcomes.remove(&txn);
                    host.fed.remove(&txn);
                    host.bodies.remove(&txn);
                }
                let floors = &self.decided_floors;
                host.replica.truncate_follower_log(upto, |t| is_decided(floors, t));
            }
        }
        if self.snapshot_reads {
            self.serve_snapshots(now, out);
        }
    }

    /// Leader: executes released transactions that no earlier unfinished one blocks, and
    /// applies those whose votes are all in. Follower: executes its synced log. True when
    /// anything was done.
    fn execute(&mut self, shard: ShardId, out: &mut Outbox<TigaMsg>) -> bool {
        let me = self.context.id;
        let Some(host) = self.hosted.get_mut(&shard) else { return false };
        if !host.replica.leads() {
            return follower_execute(&self.context, host, &self.decided_floors);
        }
        let mut progressed = finish_ready(host);
        let mut local = Vec::new();
        // Candidates come in (timestamp, id) order; running or finishing one may make others
        // candidates (see `waits`). Bounded by the released transactions.
        while let Some(at) = host.waits.next_candidate() {
            let (ts, txn) = at;
            let Some(queued) = host.queued.get(&txn) else { continue }; // Ran already.
            debug_assert_eq!(queued.ts, ts, "{txn} queued at one timestamp");
            let Some(known) = host.bodies.get(&txn) else {
                debug_assert!(false, "{txn} queued without its body");
                continue;
            };
            let part = &known.part;
            if host.waits.blocked(at, &part.reads, &part.writes) {
                continue; // What it waits for wakes it.
            }
            if queued.speculative {
                // Detective mode: run it where it is held and answer with the result; the
                // writes wait aside, and it keeps its keys (as a writer) until released.
                let hash = queued.hash;
                host.queued.remove(&txn);
                progressed = true;
                let (writes, result) = run_part(&self.context, shard, &host.store, known, ts, &[]);
                host.waits.ran(at, &part.reads);
                let owd_ns = known.owd_ns;
                let msg = TigaMsg::Fast {
                    view: self.view.global,
                    txn,
                    shard,
                    ts,
                    hash,
                    owd_ns,
                    result: Some(result.clone()),
                };
                reply(host, txn, msg, out);
                host.speculations.insert(txn, Speculation { ts, hash, writes, result });
                self.counts.speculated_total += 1;
                continue;
            }
            let early = host.early_votes.get(&txn);
            // A participant voted no: the transaction aborts, and pieces here are not run
            // (they may lack the outputs they take). Votes of other shards count for nothing.
            let refused = early.is_some_and(|votes| {
                votes.iter().any(|(s, v)| !v.ok && *s != shard && known.shards.contains(s))
            });
            let inputs = if refused { Some(Vec::new()) } else { gather_inputs(part, early) };
            // Missing inputs: the vote bringing them wakes it.
            let Some(inputs) = inputs else { continue };
            // Followers get the inputs with the outcome, in one sync message: bounded.
            let oversized = outputs_bytes(&inputs) > SYNC_INPUT_BYTES_MAX;
            let hash = queued.hash;
            host.queued.remove(&txn);
            progressed = true;
            // Released where it ran speculatively: what ran stands (a speculation at another
            // timestamp was revoked before the release), unless a participant voted no
            // meanwhile: then, as in preventive mode, the shard skips.
            let kept = host.speculations.remove(&txn);
            debug_assert!(kept.as_ref().is_none_or(|k| k.ts == ts), "{txn} kept off its place");
            let kept = kept.filter(|k| k.ts == ts && !refused);
            // Its fast reply went out when it ran; again only if the log's hash changed since.
            let answered = kept.as_ref().is_some_and(|k| k.hash == hash);
            let (writes, result) = if let Some(kept) = kept {
                self.counts.speculations_kept_total += 1;
                (kept.writes, kept.result)
            } else if refused {
                (Overlay::new(), ShardResult::Skipped)
            } else if oversized {
                let why = format!("inputs from other shards over {SYNC_INPUT_BYTES_MAX} bytes");
                (Overlay::new(), ShardResult::Failed(ProcError::Contract(why)))
            } else {
                run_part(&self.context, shard, &host.store, known, ts, &inputs)
            };
            host.waits.ran(at, &part.reads);
            let feeds = feed_outputs(part, &result);
            let others: Vec<ShardId> =
                known.shards.iter().copied().filter(|&s| s != shard).collect();
            let owd_ns = known.owd_ns;
            let own_ok = matches!(result, ShardResult::Ran(_));
            // Writes that apply now (one shard) or never (an abort here) hold nobody back; a
            // multi-shard transaction's writes hold their keys until the votes are in.
            let write_keys = if own_ok && !others.is_empty() {
                part.writes.clone()
            } else {
                host.waits.finished(at, &part.writes);
                Vec::new()
            };
            if !answered {
                let msg = TigaMsg::Fast {
                    view: self.view.global,
                    txn,
                    shard,
                    ts,
                    hash,
                    owd_ns,
                    result: Some(result),
                };
                reply(host, txn, msg, out);
            }
            if others.is_empty() {
                if own_ok {
                    apply(host, txn, ts, &writes);
                }
                if host.followers.is_empty() {
                    host.bodies.remove(&txn);
                }
                continue;
            }
            // Multi-shard: the writes wait for the other leaders' votes.
            let votes: BTreeMap<ShardId, bool> = host
                .early_votes
                .remove(&txn)
                .unwrap_or_default()
                .into_iter()
                .filter(|(s, _)| others.contains(s))
                .map(|(s, vote)| (s, vote.ok))
                .collect();
            for &peer in &others {
                let Some(node) = leader_node(&self.context, &self.view, peer) else { continue };
                let outputs = feeds.get(&peer).cloned().unwrap_or_default();
                if node == me {
                    local.push((peer, txn, shard, PeerVote { ok: own_ok, outputs }));
                } else {
                    let want_reply = !votes.contains_key(&peer);
                    let to = peer;
                    out.send(
                        node,
                        TigaMsg::Vote {
                            view: self.view.global,
                            txn,
                            from: shard,
                            to,
                            ok: own_ok,
                            outputs,
                            want_reply,
                        },
                    );
                }
            }
            if others.iter().all(|s| votes.contains_key(s)) {
                host.complete.insert(txn);
            }
            let inputs = if own_ok { inputs } else { Vec::new() };
            let pending = Pending { ts, writes, write_keys, own_ok, votes, others, feeds, inputs };
            host.pending.insert(txn, pending);
            self.counts.votes_waited_total += 1;
            progressed |= finish_ready(host);
        }
        advance_finished(host);
        // Votes for shards this node leads too pass in place (they wake what they unblock).
        for (to, txn, from, vote) in local {
            if let Some(host) = self.hosted.get_mut(&to) {
                // Not capped: bounded by the transactions this node holds.
                deliver_vote(host, txn, from, vote);
            }
        }
        progressed
    }

    /// Releases what is due on every hosted replica, and arranges the next release.
    fn release(&mut self, now: Time, out: &mut Outbox<TigaMsg>) {
        for index in 0..self.hosted_shards.len() {
            let shard = self.hosted_shards[index];
            let actions = self.hosted.get_mut(&shard).expect("hosted").replica.tick(now);
            let released = !actions.is_empty();
            self.act(now, shard, actions, None, out);
            if released {
                self.sync_followers(shard, false, out);
                self.advance_replicated(shard, out);
            }
        }
        let next = self.hosted.values().filter_map(|h| h.replica.next_due_after(now)).min();
        // A replica that stopped at its bound per call may have more due already: come back
        // at once rather than wait for the next message (there may be none).
        let capped = self.hosted.values().any(|h| h.replica.capped());
        let next = if capped { Some(Timestamp(now + 1)) } else { next };
        if let Some(due) = next {
            if self.release_at.is_none_or(|at| at <= now || due.0 < at) {
                self.release_at = Some(due.0);
                self.timers.set(Purpose::Release, due.0 - now, out);
            }
        }
    }

    /// Leader: sends followers the log entries they have not been sent (or, when `again`,
    /// everything past what they acknowledged), with the outcomes they need.
    fn sync_followers(&mut self, shard: ShardId, again: bool, out: &mut Outbox<TigaMsg>) {
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        if !host.replica.leads() {
            return;
        }
        let log_len = host.replica.log_len();
        let fresh = std::mem::take(&mut host.fresh_outcomes);
        // With `f` above 1 a follower's own sync-point does not make an entry survive a view
        // change: it executes up to the commit-point, which the leader tells it.
        let f = slow_followers(self.context.topology.replicas);
        let commit = commit_point(host, self.context.topology.replicas);
        let news = f > 1 && commit > host.commit;
        for &follower in &host.followers {
            let (synced, executed) = host.acks[&follower];
            if executed < host.pruned {
                // What it would execute next is gone here (bodies, and the inputs of the
                // outcomes): nothing from the log, only word to take a state transfer, once a
                // pace.
                if again {
                    out.send(follower, behind_msg(self.view.global, host));
                    self.counts.behind_total += 1;
                }
                continue;
            }
            let behind = f > 1 && again && executed < commit.min(synced);
            // Never from below the log's base: the follower holds what lies below (it executed
            // past the base), and a stale acknowledgement must not make the leader send
            // nothing for good (swarm seeds 892 and 480223 of `tpcc`).
            let next = if again { synced } else { host.sent_to[&follower] };
            let next = next.max(host.replica.log_base());
            let mut outcomes = if again { window_outcomes(host, executed) } else { fresh.clone() };
            outcomes.truncate(OUTCOMES_WINDOW_MAX);
            // What does not fit goes with a later resend (the follower waits for it).
            let mut bytes = 0usize;
            let fit = outcomes
                .iter()
                .take_while(|o| {
                    bytes += outputs_bytes(&o.inputs);
                    bytes <= SYNC_INPUT_BYTES_MAX
                })
                .count();
            outcomes.truncate(fit.max(1));
            let entries = host.replica.log_since(next).to_vec();
            if entries.is_empty() && outcomes.is_empty() && !news && !behind {
                continue;
            }
            if host.streams.is_some() {
                // Luigi: the coordinator sent the leader alone; the bodies go with the log,
                // once each (a lost one is fetched).
                let first = host.bodies_to[&follower];
                let fresh = entries.iter().enumerate().filter(|(i, _)| next + i >= first);
                for (_, (txn, _)) in fresh {
                    if let Some(known) = host.bodies.get(txn) {
                        out.send(follower, TigaMsg::Txn(Box::new((*known.body).clone())));
                    }
                }
                host.bodies_to.insert(follower, first.max(next + entries.len()));
            }
            let sent_end = next + entries.len();
            host.sent_to.insert(follower, sent_end.max(host.sent_to[&follower]).min(log_len));
            let msg = TigaMsg::Sync {
                view: self.view.global,
                shard,
                from: next as u64,
                entries,
                outcomes,
                commit: commit as u64,
                base: host.replica.log_base() as u64,
            };
            out.send(follower, msg);
        }
        host.commit = commit;
    }

    fn on_peer(&mut self, now: Time, from: NodeId, msg: TigaMsg, out: &mut Outbox<TigaMsg>) {
        match msg {
            TigaMsg::Propose { txn, shards, from: peer, ts, answer, .. } => {
                self.on_agreement(now, from, (txn, peer, Some(ts)), &shards, answer, out);
            }
            TigaMsg::Confirm { txn, shards, from: peer, answer, .. } => {
                self.on_agreement(now, from, (txn, peer, None), &shards, answer, out);
            }
            TigaMsg::Vote { txn, from: peer, to, ok, outputs, want_reply, .. } => {
                if !self.is_leader_node(peer, from) || outputs.len() > PIECES_MAX {
                    return;
                }
                let Some(host) = self.hosted.get_mut(&to) else { return };
                if !host.replica.leads() {
                    return;
                }
                if let Some(decided) = host.decided.get(&txn) {
                    if want_reply {
                        // With the outputs its pieces take from here (a new leader there runs
                        // the transaction again after a view change).
                        let outputs = decided.feeds.get(&peer).cloned().unwrap_or_default();
                        let ok = decided.own;
                        let reply = TigaMsg::Vote {
                            view: self.view.global,
                            txn,
                            from: to,
                            to: peer,
                            ok,
                            outputs,
                            want_reply: false,
                        };
                        out.send(from, reply);
                    }
                    return;
                }
                // A restarted leader must hear the same votes, with the same outputs, to reach
                // the same outcomes: journaled before anything that follows from them is sent.
                let mut journal_vote = |outputs: &Vec<(u32, PieceOutput)>| {
                    let outputs = outputs.clone();
                    self.journal.write(&Record::Vote { shard: to, txn, from: peer, ok, outputs });
                };
                if finished_here(host, txn) {
                    // Finished, its record dropped: every other leader promised a closed
                    // timestamp above it, so this is a late copy (its sender has the vote).
                    return;
                }
                let known = host.replica.logged(txn) || host.bodies.contains_key(&txn);
                if !known && is_decided(&self.decided_floors, txn) {
                    // Finished and forgotten here, or refused: a late copy (a leader that
                    // voted had this one's proposal, so it took the transaction).
                    self.counts.stale_votes_total += 1;
                    return;
                }
                if let Some(pending) = host.pending.get(&txn) {
                    if want_reply {
                        // The sender lacks this shard's vote (the first copy was lost).
                        let reply = vote_msg(self.view.global, txn, to, peer, pending, false);
                        out.send(from, reply);
                    }
                    if !pending.votes.contains_key(&peer) {
                        journal_vote(&outputs);
                    }
                    record_vote(host, txn, peer, ok);
                } else if host.early_votes.len() < EARLY_VOTES_MAX
                    || host.early_votes.contains_key(&txn)
                    || host.bodies.contains_key(&txn)
                {
                    // Beyond the cap only for transactions known here (bodies are bounded):
                    // one that waits for the outputs this vote carries must get them.
                    if !host.early_votes.get(&txn).is_some_and(|v| v.contains_key(&peer)) {
                        journal_vote(&outputs);
                    }
                    deliver_vote(host, txn, peer, PeerVote { ok, outputs });
                }
                self.execute_all(now, out);
            }
            TigaMsg::AskVote { txn, from: peer, to, .. } => {
                if !self.is_leader_node(peer, from) {
                    self.counts.dropped_total += 1;
                    return;
                }
                let Some(host) = self.hosted.get(&to).filter(|h| h.replica.leads()) else { return };
                let view = self.view.global;
                let reply = if let Some(decided) = host.decided.get(&txn) {
                    let outputs = decided.feeds.get(&peer).cloned().unwrap_or_default();
                    let ok = decided.own;
                    TigaMsg::Vote { view, txn, from: to, to: peer, ok, outputs, want_reply: false }
                } else if let Some(pending) = host.pending.get(&txn) {
                    vote_msg(view, txn, to, peer, pending, false)
                } else {
                    return; // Not run here yet: its vote goes out when it runs.
                };
                out.send(from, reply);
            }
            TigaMsg::Refused { txn, from: peer, to, .. } => {
                if !self.is_leader_node(peer, from) {
                    self.counts.dropped_total += 1;
                    return;
                }
                self.on_refused(now, txn, peer, to, out);
            }
            TigaMsg::GetBody { txn, .. } => {
                let body =
                    self.hosted.values().find_map(|h| h.bodies.get(&txn)).map(|k| k.body.clone());
                if let Some(body) = body {
                    out.send(from, TigaMsg::Txn(Box::new((*body).clone())));
                }
            }
            _ => {}
        }
    }

    /// Another leader's proposal (`Some` timestamp) or confirmation for `txn`, from its shard
    /// `peer`. `answer`: the sender had released `txn` and answers ours; a leader that
    /// released it too does not answer back.
    fn on_agreement(
        &mut self,
        now: Time,
        from: NodeId,
        (txn, peer, proposed): (TxnId, ShardId, Option<Timestamp>),
        shards: &[ShardId],
        answer: bool,
        out: &mut Outbox<TigaMsg>,
    ) {
        if !self.is_leader_node(peer, from) {
            return;
        }
        let here: Vec<ShardId> =
            shards.iter().copied().filter(|s| self.hosted.contains_key(s)).collect();
        for shard in here {
            let host = self.hosted.get_mut(&shard).expect("hosted");
            if !host.replica.leads() {
                continue;
            }
            let logged = host.replica.logged(txn);
            if logged && answer {
                continue;
            }
            if !logged && !host.bodies.contains_key(&txn) && is_decided(&self.decided_floors, txn) {
                // Its coordinator decided it and this leader holds no copy: it never took it
                // (and refuses every copy from now on), or took it, finished it and forgot
                // it (then every other leader finished it too and ignores this). Either way
                // nothing is opened or fetched for it, and a proposer still holding it
                // drops it.
                host.replica.forget(txn);
                if proposed.is_some() {
                    self.counts.refused_sent_total += 1;
                    let view = self.view.global;
                    out.send(from, TigaMsg::Refused { view, txn, from: shard, to: peer });
                }
                continue;
            }
            let actions = match proposed {
                Some(ts) => {
                    let unknown = !host.bodies.contains_key(&txn) && !logged;
                    let mut actions = host.replica.on_proposal(peer, txn, shards, ts);
                    if unknown {
                        let after = self.pace_ns();
                        self.timers.set(Purpose::FetchBody(shard, txn, from), after, out);
                    } else if !logged && host.replica.held_at(txn).is_none() {
                        // Its arrival was refused here (a full queue or stream, no room to
                        // agree) while another leader holds it and keeps proposing: take it
                        // now, or that leader (and, in luigi, its worker's watermark) waits
                        // for good once the coordinator stops resending.
                        let known = &host.bodies[&txn];
                        let again = incoming(txn, known.body.ts, &known.shards, &known.part);
                        actions.extend(leader_arrive(host, again));
                    }
                    actions
                }
                None => host.replica.on_confirm(peer, txn, shards),
            };
            let call = PeerCall { shards, answer: logged };
            self.act(now, shard, actions, Some(call), out);
        }
        self.release(now, out);
    }

    /// The leader of `peer` refused `txn`, which this leader of `shard` proposed: if it holds
    /// it still (not released; no leader can release it now), it drops it, and its journal
    /// says so.
    fn on_refused(
        &mut self,
        now: Time,
        txn: TxnId,
        peer: ShardId,
        shard: ShardId,
        out: &mut Outbox<TigaMsg>,
    ) {
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        if !host.replica.leads() {
            return;
        }
        let Some(actions) = host.replica.refused(peer, txn) else { return };
        // A speculative run is revoked while its body is still here.
        self.act(now, shard, actions, None, out);
        let host = self.hosted.get_mut(&shard).expect("hosted");
        host.bodies.remove(&txn);
        host.early_votes.remove(&txn);
        if let Some(streams) = &mut host.streams {
            streams.dropped(txn);
        }
        if host.journaled.remove(&txn).is_some() {
            self.journal.write(&Record::Withdrawn { shard, txn });
        }
        self.counts.refused_total += 1;
        self.release(now, out);
    }

    /// Tiga follower of `shard`: drops what it released itself at or below the latest
    /// closed timestamp its leader promised whose log its synced prefix covers. The leader
    /// lists every entry it will ever log at or below a promise within the log length it
    /// sent with it (anything arriving later is held above the promise), so such an entry is
    /// a copy the leader never took there: a coordinator that gave up or crashed before its
    /// leader's copy arrived. Kept, it would stay in this replica's key hashes for good, and
    /// every later fast reply on its keys would disagree with the leader's; and the tail
    /// would fill, after which this follower replies fast to nothing. Its body stays until
    /// the coordinator decided the transaction: the leader may still take it, above the
    /// promise (a restarted leader hearing a resend), and then its log lists it here.
    /// `sweep`: also let go of the bodies kept that are no longer needed (once per promise
    /// heard, not on every log message).
    fn drop_unlisted(&mut self, shard: ShardId, sweep: bool) {
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        if host.replica.leads() || host.joining.is_some() || self.variant != Variant::Tiga {
            return;
        }
        let synced = host.replica.log_len();
        // Promises grow with their log lengths: the latest one the prefix covers.
        let Some(&(through, _)) = host.closed.iter().rev().find(|&&(_, upto)| upto <= synced)
        else {
            return;
        };
        // The tail is walked once per promise, not on every log message: what this follower
        // releases at or below a promise it cut at already goes at the next one.
        if through <= host.tail_cut && !sweep {
            return;
        }
        host.tail_cut = host.tail_cut.max(through);
        let dropped = host.replica.drop_unlisted(through);
        if !dropped.is_empty() {
            self.journal.write(&Record::Unlisted { shard, through });
        }
        self.counts.tail_dropped_total += dropped.len() as u64;
        host.unlisted.extend(dropped.into_iter().map(|(txn, _)| txn));
        if !sweep {
            return;
        }
        // Bounded by the set: listed since (its body is the log's now), or decided by its
        // coordinator and so never listed (nothing resends it), or past the bound (the log
        // fetches it should it list it after all).
        let floors = &self.decided_floors;
        let replica = &host.replica;
        let overflow = host.unlisted.len().saturating_sub(TAIL_MAX);
        let mut gone = Vec::new();
        for (index, &txn) in host.unlisted.iter().enumerate() {
            let listed = replica.logged(txn) || replica.wants_body(txn);
            if listed || index < overflow || is_decided(floors, txn) {
                gone.push((txn, listed));
            }
        }
        for (txn, listed) in gone {
            host.unlisted.remove(&txn);
            if !listed && replica.held_at(txn).is_none() {
                host.bodies.remove(&txn);
            }
        }
    }

    /// True when `node` leads `shard` in the current view.
    fn is_leader_node(&self, shard: ShardId, node: NodeId) -> bool {
        shard.0 < self.context.topology.shards && self.leader_of(shard) == Some(node)
    }

    fn on_sync(
        &mut self,
        now: Time,
        from: NodeId,
        shard: ShardId,
        sync: SyncParts,
        out: &mut Outbox<TigaMsg>,
    ) {
        let (start, entries, outcomes, commit, base) = sync;
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        if host.replica.leads() || host.leader != from || host.joining.is_some() {
            return;
        }
        // Messages may come out of order: the commit-point and the leader's base only rise.
        host.commit = host.commit.max(usize::try_from(commit).unwrap_or(usize::MAX));
        host.leader_base = host.leader_base.max(usize::try_from(base).unwrap_or(usize::MAX));
        if entries.len() > super::log::SYNC_ENTRIES_MAX || outcomes.len() > OUTCOMES_WINDOW_MAX {
            return; // No honest leader sends more.
        }
        let Ok(start) = usize::try_from(start) else { return };
        // Bounded by the message: which of its entries the tail holds (journaled already).
        let in_tail: BTreeSet<TxnId> =
            entries.iter().map(|&(txn, _)| txn).filter(|&t| host.replica.in_tail(t)).collect();
        let before = host.replica.log_len();
        let bodies = &host.bodies;
        let keys_of = |txn| bodies.get(&txn).map(|k: &Known| k.part.log_keys());
        let actions = host.replica.on_sync(start, &entries, keys_of);
        let appended = host.replica.follower_entries(before, usize::MAX);
        // Bounded by the message; nearly always empty.
        let heard: Vec<TxnId> =
            appended.iter().map(|&(t, _)| t).filter(|t| host.outcomes.contains_key(t)).collect();
        if !appended.is_empty() {
            // The entries this replica's acknowledgements and slow replies will vouch for,
            // with the bodies no record holds yet.
            let entries = appended
                .into_iter()
                .map(|(txn, ts)| {
                    let body = match in_tail.contains(&txn) {
                        true => None,
                        false => host.bodies.get(&txn).map(|k| (*k.body).clone()),
                    };
                    (txn, ts, body)
                })
                .collect();
            self.journal.write(&Record::Synced { shard, at: before as u64, entries });
            // An outcome heard before the leader listed its entry (a sync carries outcomes
            // past the entries it lists) is journaled again behind the listing: a checkpoint
            // since may have left it out, and a restart keeps outcomes of logged entries only.
            for txn in heard {
                if let Some((ok, inputs)) = host.outcomes.get(&txn) {
                    let outcome = SyncOutcome { txn, ok: *ok, inputs: inputs.clone() };
                    self.journal.write(&Record::Outcome { shard, outcome });
                }
            }
        }
        for outcome in outcomes {
            // Kept for logged transactions only; an outcome of one executed already may come
            // again (a resend from a stale acknowledgement) and is pushed out first when the
            // map is full (the leader says again what is still needed).
            if host.replica.logged(outcome.txn) && outcome.inputs.len() <= PIECES_MAX {
                let SyncOutcome { txn, ok, ref inputs } = outcome;
                let fresh = host.outcomes.get(&txn).is_none_or(|(was, _)| *was != ok);
                host.outcomes.insert(txn, (ok, inputs.clone()));
                if fresh {
                    self.journal.write(&Record::Outcome { shard, outcome });
                }
                if host.outcomes.len() > OUTCOMES_KEPT_MAX {
                    host.outcomes.pop_first();
                }
            }
        }
        let fetching =
            actions.iter().any(|a| matches!(a, Action::Fetch { .. } | Action::Resend { .. }));
        self.act(now, shard, actions, None, out);
        self.drop_unlisted(shard, false);
        if !fetching {
            // Bodies asked for before and still missing are asked for again (the fetch or
            // its answer may have been lost).
            let host = self.hosted.get(&shard).expect("hosted");
            out.send(
                from,
                ack_msg(
                    (self.view.global, self.context.incarnation),
                    host,
                    host.replica.missing_bodies(FETCH_MAX),
                ),
            );
        }
    }

    /// Luigi leader: tells the streams which log entries a majority of the shard's replicas
    /// now holds (the leader's own log and its followers' acknowledged sync-points), and
    /// sends each worker whose watermark rose its new watermark.
    fn advance_replicated(&mut self, shard: ShardId, out: &mut Outbox<TigaMsg>) {
        let me = self.context.id;
        let replicas = self.context.topology.replicas;
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        let Some(streams) = &mut host.streams else { return };
        let mut points: Vec<usize> = host.acks.values().map(|&(synced, _)| synced).collect();
        points.push(host.replica.log_len());
        let point = super::log::commit_point(&points, replicas);
        // Bounded by the log (a window of SYNC_ENTRIES_MAX entries per round).
        while host.replicated < point {
            let window = host.replica.log_since(host.replicated);
            let take = window.len().min(point - host.replicated);
            debug_assert!(take > 0, "the log holds the commit-point's entries");
            if take == 0 {
                break;
            }
            for &(txn, ts) in &window[..take] {
                streams.replicated(txn, ts);
            }
            host.replicated += take;
        }
        let raised = streams.take_raised();
        // A restarted leader holds new transactions above what it told (and tells nothing
        // lower): written before the watermarks go out.
        for &(worker, ts) in &raised {
            self.journal.write(&Record::Told { shard, worker, ts });
        }
        for (worker, ts) in raised {
            if worker == me {
                self.on_watermark(me, shard, ts, out);
            } else {
                out.send(worker, TigaMsg::Watermark { view: self.view.global, shard, ts });
            }
        }
    }

    fn on_sync_ack(
        &mut self,
        from: NodeId,
        (shard, start): (ShardId, Start),
        synced: u64,
        executed: u64,
        fetch: Vec<TxnId>,
        out: &mut Outbox<TigaMsg>,
    ) {
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        // A late acknowledgement of a follower's earlier start speaks of a log it no longer
        // holds; one of the start being sent a transfer says the image is installed.
        if let Some(transfer) = host.transfers.get(&from) {
            if start < transfer.start {
                return;
            }
            // The start being sent a transfer installed it; a later start restarted from its
            // journal and needs none.
            host.transfers.remove(&from);
            host.joined.insert(from, start);
        } else if host.joined.get(&from).is_some_and(|&joined| start < joined) {
            return;
        }
        let Some(ack) = host.acks.get_mut(&from) else { return };
        let log_len = host.replica.log_len();
        let (synced, executed) =
            (synced.min(log_len as u64) as usize, executed.min(log_len as u64) as usize);
        // Acknowledgements may arrive out of order; a resend request moves `sent_to` back.
        ack.0 = synced;
        ack.1 = ack.1.max(executed);
        if ack.1 < host.pruned {
            // The follower trailed by more than the leader keeps bodies for: what it would
            // execute next is gone here. It takes a state transfer instead.
            out.send(from, behind_msg(self.view.global, host));
            self.counts.behind_total += 1;
            return;
        }
        if synced < host.sent_to[&from] && fetch.is_empty() && synced < log_len {
            host.sent_to.insert(from, synced);
        } else if synced > host.sent_to[&from] {
            // A leader that restarted knows nothing sent: the log goes on from what the
            // follower holds, not from the start.
            host.sent_to.insert(from, synced);
        }
        for txn in fetch.into_iter().take(super::log::SYNC_ENTRIES_MAX) {
            if let Some(known) = host.bodies.get(&txn) {
                out.send(from, TigaMsg::Txn(Box::new((*known.body).clone())));
            }
        }
        prune_bodies(host, &self.context.limits);
        // With `f` above 1 followers execute only below the commit-point: tell them as soon
        // as an acknowledgement moves it, not at the next release or pace.
        let replicas = self.context.topology.replicas;
        if slow_followers(self.context.topology.replicas) > 1
            && commit_point(host, replicas) > host.commit
        {
            self.sync_followers(shard, false, out);
        }
        self.advance_replicated(shard, out);
    }

    /// Rejoining follower: asks the leader for its state transfer (from the next part it
    /// lacks), and asks again later if nothing comes.
    fn ask_state(&mut self, shard: ShardId, out: &mut Outbox<TigaMsg>) {
        let Some(host) = self.hosted.get(&shard) else { return };
        let Some(joining) = &host.joining else { return };
        let next = joining.parts.len() as u32;
        let msg = TigaMsg::Join {
            view: self.view.global,
            shard,
            start: follower_start(self.context.incarnation, host),
            transfer: joining.transfer,
            next,
            whole: host.retired,
            member_view: host.member_view,
        };
        out.send(host.leader, msg);
        if !joining.timer_set {
            // A window of parts may take a while on a slow link: ask again only after a
            // request's timeout.
            self.timers.set(Purpose::Join(shard), self.context.timing.rpc_timeout_ns, out);
            if let Some(joining) = self.hosted.get_mut(&shard).and_then(|h| h.joining.as_mut()) {
                joining.timer_set = true;
            }
        }
    }

    /// Leader: a follower asks for the shard's state. The first request of a start of the
    /// follower cuts an image, and every later one of that start is answered from it: the
    /// parts from `next` on (from the first when it names another transfer), a window at a
    /// time. Once the follower holds the image it acknowledges the prefix, and the log past
    /// it (bodies and outcomes) goes to it again.
    fn on_join(
        &mut self,
        from: NodeId,
        (shard, start): (ShardId, Start),
        (transfer, next): (u64, u32),
        whole: bool,
        out: &mut Outbox<TigaMsg>,
    ) {
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        if !host.replica.leads() || !host.followers.contains(&from) {
            self.counts.dropped_total += 1;
            return;
        }
        // Starts are ordered: a request of a start that has its state already, or of one
        // older than the latest heard, is a late copy.
        let joined = host.joined.get(&from).copied();
        let latest = joined.max(host.transfers.get(&from).map(|t| t.start));
        if joined == Some(start) || latest.is_some_and(|latest| start < latest) {
            return;
        }
        // One image per start of the follower, whatever its requests say: a request that
        // crossed the first parts on the way (transfer 0, or an older id) gets the same image
        // from its start, never a new one (a new cut per request restarted the transfer for
        // ever once requests came faster than the image's parts).
        let existing = host.transfers.get(&from).filter(|t| t.start == start);
        let next = if let Some(existing) = existing {
            if existing.id == transfer {
                next
            } else {
                0
            }
        } else {
            // Not cut while a body past the finished prefix is missing here (the hashes need
            // its keys): the follower asks again.
            let Some(parts) = state_image(host, &self.decided_floors, whole) else { return };
            host.transfer_seq += 1;
            let id = host.transfer_seq;
            let upto = host.finished;
            host.transfers.insert(from, Transfer { id, start, parts });
            // A joining follower holds no log: it counts for nothing in the commit-point or
            // luigi's replication watermarks until it acknowledges the image. Its executed
            // count stays (a late copy of an old request cuts an image it never takes): that
            // count, at most the finished prefix, keeps the bodies past the prefix here.
            // Luigi: the bodies past the prefix go again with the log.
            if let Some(ack) = host.acks.get_mut(&from) {
                ack.0 = 0;
            }
            let bodies_to = host.bodies_to.get(&from).copied().unwrap_or(upto);
            host.bodies_to.insert(from, bodies_to.min(upto));
            self.counts.transfers_total += 1;
            0
        };
        let transfer = &host.transfers[&from];
        let total = transfer.parts.len() as u32;
        for index in next..next.saturating_add(STATE_WINDOW).min(total) {
            let msg = TigaMsg::State {
                view: self.view.global,
                shard,
                start,
                transfer: transfer.id,
                index,
                total,
                part: transfer.parts[index as usize].clone(),
            };
            out.send(from, msg);
        }
    }

    /// Rejoining follower: a part of the leader's state transfer. Parts are taken in order
    /// (others wait for a later request); once all are in, the state is checked and installed,
    /// or dropped whole if it does not hold together (a new transfer is asked for).
    fn on_state(
        &mut self,
        now: Time,
        from: NodeId,
        shard: ShardId,
        (transfer, index, total): (u64, u32, u32),
        part: StatePart,
        out: &mut Outbox<TigaMsg>,
    ) {
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        let Some(joining) = &mut host.joining else { return };
        if from != host.leader || total == 0 || total > STATE_PARTS_MAX || index >= total {
            self.counts.dropped_total += 1;
            return;
        }
        if index == 0 && (joining.parts.is_empty() || transfer > joining.transfer) {
            // The first part picks the transfer; a newer one replaces it (the leader cut a new
            // image: a late acknowledgement from this node's previous start ended the first).
            joining.transfer = transfer;
            joining.total = total;
            joining.parts.clear();
        }
        if transfer != joining.transfer || total != joining.total {
            return;
        }
        if index as usize != joining.parts.len() {
            return; // Out of order or repeated: asked for again.
        }
        joining.parts.push(part);
        if joining.parts.len() < total as usize {
            if joining.parts.len() % STATE_WINDOW as usize == 0 {
                self.ask_state(shard, out);
            }
            return;
        }
        let parts = std::mem::take(&mut joining.parts);
        match install(&self.context, host, parts) {
            Ok(floors) => {
                self.counts.rejoined_total += 1;
                host.member_view = self.view.global;
                // The installed state is what this replica vouches for from now on.
                self.checkpoint_wanted = true;
                // Bounded by the part limits of the transfer.
                for (node, incarnation, floor) in floors {
                    raise_floor(&mut self.decided_floors, (node, incarnation), floor);
                }
                // The acknowledgement tells the leader where to resume the log.
                out.send(
                    host.leader,
                    ack_msg((self.view.global, self.context.incarnation), host, Vec::new()),
                );
                if self.variant == Variant::Tiga {
                    // Its log now matches the leader's through the image: a coordinator still
                    // waiting on an entry there may count it (after a view change, the new
                    // leader's followers hold no other log to vouch with). The latest
                    // entries only, those their coordinators have not decided.
                    let (view, end) = (self.view.global, host.replica.sync_point());
                    let from = end.saturating_sub(super::log::SYNC_ENTRIES_MAX);
                    let floors = &self.decided_floors;
                    for (txn, ts) in host.replica.follower_entries(from, end) {
                        if !is_decided(floors, txn) {
                            let msg = slow_reply(view, host, txn, ts);
                            reply(host, txn, msg, out);
                        }
                    }
                }
                self.execute_all(now, out);
            }
            Err(_) => {
                // Dropped whole; the pending timer asks anew (not at once: a leader that keeps
                // sending a broken image must not set off a storm).
                self.counts.dropped_total += 1;
                host.joining = Some(Joining { timer_set: true, ..Joining::default() });
            }
        }
    }

    /// Follower: the leader keeps nothing for followers below `upto`. A replica that executed
    /// less cannot go on from the log: it drops its log, held transactions and replies (a
    /// fresh one holds and vouches for nothing) and, under its next start, takes a state
    /// transfer as a restarted follower does. Its store stays: the transfer rewrites every key
    /// the leader wrote since the load, which covers every key this replica wrote.
    fn on_behind(&mut self, from: NodeId, shard: ShardId, upto: u64, out: &mut Outbox<TigaMsg>) {
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        if host.replica.leads() || from != host.leader {
            self.counts.dropped_total += 1;
            return;
        }
        if host.joining.is_some() {
            return; // Rejoining already.
        }
        if host.executed as u64 >= upto {
            // Not behind: the leader had not heard how far this replica got (it sends no
            // log to a follower it thinks behind), so tell it.
            let view = (self.view.global, self.context.incarnation);
            out.send(host.leader, ack_msg(view, host, Vec::new()));
            return;
        }
        if self.drop_log_to_rejoin(shard, false, out) {
            self.counts.went_behind_total += 1;
        }
    }

    /// Follower: drops its log, held transactions, replies and what it kept of executed
    /// entries, and asks its leader for a state transfer under its next start (a fresh
    /// replica holds and vouches for nothing). Its store stays: the transfer rewrites every
    /// key the leader wrote since the load. With `stash` (a view change sends it to rejoin),
    /// what it dropped is kept until a transfer is installed, unless it was rejoining
    /// already. False (nothing done) when its starts ran out.
    fn drop_log_to_rejoin(
        &mut self,
        shard: ShardId,
        stash: bool,
        out: &mut Outbox<TigaMsg>,
    ) -> bool {
        let detective = self.view.mode == Mode::Detective;
        let limits = replica_limits(self.context.topology.shards);
        let Some(host) = self.hosted.get_mut(&shard) else { return false };
        let Some(rejoins) = host.rejoins.checked_add(1) else { return false };
        host.rejoins = rejoins;
        let fresh = Replica::new(shard, false, limits).with_detective(detective);
        let mut dropped = Stashed::empty(fresh, host.follower_checkpointed);
        dropped.swap_with(host);
        // Kept with three replicas only: leading from it is sound there (see
        // `take_up_stash`); with more, a report would need to say which view its log was
        // led in.
        let three = self.context.topology.replicas == 3;
        if stash && three && host.joining.is_none() && !host.retired {
            host.stashed = Some(Box::new(dropped));
        }
        host.joining = Some(Joining::default());
        // A restart from here rejoins too: the journaled log is void.
        self.journal.write(&Record::Joining { shard });
        self.ask_state(shard, out);
        true
    }

    fn pace(&mut self, now: Time, out: &mut Outbox<TigaMsg>) {
        for index in 0..self.hosted_shards.len() {
            let shard = self.hosted_shards[index];
            let host = self.hosted.get_mut(&shard).expect("hosted");
            self.counts.bodies_high = self.counts.bodies_high.max(host.bodies.len() as u64);
            if !host.replica.leads() {
                continue;
            }
            // Votes still missing.
            let mut votes = Vec::new();
            for (&txn, pending) in &host.pending {
                for &peer in pending.others.iter().filter(|p| !pending.votes.contains_key(p)) {
                    votes.push((peer, vote_msg(self.view.global, txn, shard, peer, pending, true)));
                }
            }
            for (peer, msg) in votes {
                if let Some(node) = leader_node(&self.context, &self.view, peer) {
                    if node != self.context.id {
                        out.send(node, msg);
                    }
                }
            }
            // A new leader's entries run again: the votes it needs are asked for again.
            if !host.asking.is_empty() {
                self.ask_votes(shard, out);
            }
            let host = self.hosted.get_mut(&shard).expect("hosted");
            // Agreements this leader proposed in and still waits on.
            let actions = host.replica.repeat_open(AGREEMENTS_REPEATED_MAX);
            self.act(now, shard, actions, None, out);
            let lagging = {
                let host = &self.hosted[&shard];
                let log_len = host.replica.log_len();
                host.acks.values().any(|&(s, e)| s < log_len || e < log_len)
            };
            if lagging {
                self.sync_followers(shard, true, out);
            }
            // With every follower silent no acknowledgement prunes: the lag limit still does.
            let host = self.hosted.get_mut(&shard).expect("hosted");
            prune_bodies(host, &self.context.limits);
            self.close_for_followers(now, shard, out);
            self.close_for_peers(now, shard, out);
            let covered = self.peers_promised(shard);
            let host = self.hosted.get_mut(&shard).expect("hosted");
            forget_decided(
                host,
                &self.decided_floors,
                covered,
                self.context.limits.forgettable_max,
            );
        }
        self.execute_all(now, out);
    }
}

/// The view a run starts in (fixed for the run until view changes are built): leaders sit
/// together where the topology allows, as the view manager chooses with every node alive,
/// and agree before executing (luigi's, and tiga's by default).
pub fn initial_view(topology: &Topology) -> Result<View, String> {
    let everyone: BTreeSet<NodeId> = topology.node_ids().collect();
    let first = View::initial(topology.shards, Mode::Preventive);
    next_view(&first, topology, &everyone, Mode::Preventive, |_, _| 0)
        .ok_or_else(|| "a shard has no replica".into())
}

/// Tiga's starting view under `settings`: leaders together ([`initial_view`]) or replica 0
/// of every shard leading (`tiga-leaders=spread`); the mode as set, or for `auto`
/// preventive when every leader is in one region and detective otherwise (leaders in
/// different regions would wait a wide-area delay for each other before executing).
pub fn starting_view(topology: &Topology, settings: &TigaSettings) -> Result<View, String> {
    let mut view = if settings.spread_leaders {
        View::initial(topology.shards, Mode::Preventive)
    } else {
        initial_view(topology)?
    };
    let mut regions = BTreeSet::new();
    for shard in 0..topology.shards {
        let shard = ShardId(shard);
        let slot = view.leader_slot(shard, topology.replicas);
        let leader = topology.replica_node(shard, slot).ok_or("a shard has no replica")?;
        regions.insert(topology.region_of(leader));
    }
    view.mode = match settings.mode {
        Mode::Auto if regions.len() > 1 => Mode::Detective,
        Mode::Auto => Mode::Preventive,
        mode => mode,
    };
    Ok(view)
}

/// The node leading `shard` in `view`.
/// `None` for a shard that does not exist (messages name shards; any may be hostile).
fn leader_node(context: &NodeContext, view: &View, shard: ShardId) -> Option<NodeId> {
    let topology = &context.topology;
    if shard.0 >= topology.shards {
        return None;
    }
    topology.replica_node(shard, view.leader_slot(shard, topology.replicas))
}

fn incoming(txn: TxnId, ts: Timestamp, shards: &[ShardId], part: &Part) -> Incoming {
    Incoming {
        txn,
        ts,
        shards: shards.to_vec(),
        reads: part.reads.clone(),
        writes: part.writes.clone(),
    }
}

/// A transaction arrives at a leader. A luigi leader holds it above everything its worker's
/// watermark here may have promised, and opens it in the worker's stream; a worker outside
/// the cluster or with a full stream is not taken (its coordinator resends).
fn leader_arrive(host: &mut Hosted, mut incoming: Incoming) -> Vec<Action> {
    let txn = incoming.txn;
    if host.replica.held_at(txn).is_none() && !host.replica.logged(txn) {
        if host.promised > Timestamp::ZERO {
            // Snapshot reads: nothing new at or below a closed timestamp.
            incoming.ts = incoming.ts.max(Timestamp(host.promised.0.saturating_add(1)));
        }
        if let Some(streams) = &host.streams {
            let Some(floor) = streams.floor(txn.origin) else { return Vec::new() };
            incoming.ts = incoming.ts.max(floor);
        }
    }
    let actions = host.replica.arrive(incoming);
    let held = host.replica.held_at(txn);
    debug_assert!(held.is_none_or(|ts| ts > host.promised), "{txn} held at or below the promise");
    if let (Some(streams), Some(held)) = (&mut host.streams, held) {
        streams.held(txn, held);
    }
    actions
}

/// A leader's commit-point ([`super::log::commit_point`]: the leader at its log's length,
/// each follower at its acknowledged sync-point), never below what it said before.
fn commit_point(host: &Hosted, replicas: u32) -> usize {
    let mut synced: Vec<usize> = host.acks.values().map(|&(s, _)| s).collect();
    synced.push(host.replica.log_len());
    super::log::commit_point(&synced, replicas).max(host.commit)
}

/// Leader: drops the bodies of log entries every follower executed (one still queued or
/// waiting for votes here stays: it is executed later), and of those finished here more than
/// `lag_max` entries ago whatever the followers acknowledged: a follower that far behind is
/// sent to a state transfer when it next acknowledges ([`TigaMsg::Behind`]), so a follower
/// down for good holds neither this memory nor, once [`BODIES_MAX`] is reached, the shard.
fn prune_bodies(host: &mut Hosted, limits: &crate::Limits) {
    let lag_max = limits.follower_lag_max;
    let log_len = host.replica.log_len();
    let slowest = host.acks.values().map(|&(_, e)| e).min().unwrap_or(log_len);
    let floor = slowest.max(host.finished.saturating_sub(lag_max)).min(log_len);
    if floor <= host.pruned {
        return;
    }
    // Bounded by the log: each entry is passed once over the run.
    let done: Vec<TxnId> = host
        .replica
        .log_since(host.pruned)
        .iter()
        .take(floor - host.pruned)
        .map(|&(txn, _)| txn)
        .collect();
    let pruned_upto = host.pruned + done.len();
    for txn in done {
        if !host.pending.contains_key(&txn) && !host.queued.contains_key(&txn) {
            host.bodies.remove(&txn);
        }
        if let Some(decided) = host.decided.get_mut(&txn) {
            // Every follower executed it, or will take a transfer.
            decided.inputs = Vec::new();
            if !decided.settled {
                decided.settled = true;
                host.settling.insert((decided.ts, txn));
            }
        }
    }
    host.pruned = pruned_upto;
    // The log below: every follower executed it, or takes a state transfer. Luigi's
    // replication watermarks walk the log from what is replicated: not past that.
    // Never past the finished prefix: the leader walks its log from there (a restarted leader
    // running its journal again may hear followers that executed further).
    let mut drop_upto = host.pruned.min(host.finished);
    if host.streams.is_some() {
        drop_upto = drop_upto.min(host.replicated);
    }
    if drop_upto >= host.replica.log_base() + limits.log_drop_min {
        // Bounded by the entries dropped.
        for (txn, ts) in host.replica.truncate_leader_log(drop_upto) {
            if host.forgettable.len() < limits.forgettable_max {
                host.forgettable.insert((ts, txn));
            } else {
                host.forgettable_overflowed = true;
            }
        }
    }
}

/// Leader: stops knowing as logged the transactions below its log's base that its
/// coordinator decided and every other shard's leader promised a closed timestamp at or above
/// (`covered`: the least such promise). Nothing brings one here again: its coordinator resends
/// it no more; no other leader proposes it (each finished it) or votes on it again but as a
/// late copy, which is dropped; a late copy of its body is refused as stale (see `on_body`),
/// and a late proposal is answered with a refusal the proposer ignores (it released the
/// transaction). Bounded by [`crate::Limits::forgettable_max`].
fn forget_decided(
    host: &mut Hosted,
    floors: &BTreeMap<(NodeId, u64), u64>,
    covered: Timestamp,
    forgettable_max: usize,
) {
    let upto = (covered, TxnId { origin: NodeId(u32::MAX), incarnation: u64::MAX, seq: u64::MAX });
    let decided: Vec<(Timestamp, TxnId)> =
        host.forgettable.range(..=upto).copied().filter(|&(_, t)| is_decided(floors, t)).collect();
    for entry in decided {
        host.forgettable.remove(&entry);
        host.replica.forget_logged(entry.1);
    }
    if host.forgettable_overflowed && host.forgettable.len() <= forgettable_max / 2 {
        // Room again (once per half of the set emptied): a pass over the logged set forgets
        // what went below the base meanwhile and qualifies now, and takes up the rest.
        let mut waiting = Vec::new();
        // Bounded by the transactions logged here.
        for (txn, ts) in host.replica.logged_below_base_at(|_| true) {
            if host.forgettable.contains(&(ts, txn)) {
                continue;
            }
            if ts <= covered && is_decided(floors, txn) {
                host.replica.forget_logged(txn);
            } else {
                waiting.push((ts, txn));
            }
        }
        let room = forgettable_max - host.forgettable.len();
        host.forgettable_overflowed = waiting.len() > room;
        host.forgettable.extend(waiting.into_iter().take(room));
    }
}

/// Notes that `txn`'s coordinator decided everything of its start below `decided_below`.
fn note_decided(floors: &mut BTreeMap<(NodeId, u64), u64>, txn: TxnId, decided_below: u64) {
    // The transaction carrying it is not decided: nothing from it on.
    raise_floor(floors, (txn.origin, txn.incarnation), decided_below.min(txn.seq));
}

/// Raises the decided floor of coordinator start `start` to `below` (a start not tracked yet
/// is added while there is room).
fn raise_floor(floors: &mut BTreeMap<(NodeId, u64), u64>, start: (NodeId, u64), below: u64) {
    if let Some(floor) = floors.get_mut(&start) {
        *floor = (*floor).max(below);
    } else if floors.len() < COORDINATORS_TRACKED_MAX && below > 0 {
        floors.insert(start, below);
    }
}

/// True when `txn`'s coordinator said it decided it.
fn is_decided(floors: &BTreeMap<(NodeId, u64), u64>, txn: TxnId) -> bool {
    floors.get(&(txn.origin, txn.incarnation)).is_some_and(|&floor| txn.seq < floor)
}

/// Leader: word to a follower that executed less than what the leader keeps for followers.
fn behind_msg(view: u64, host: &Hosted) -> TigaMsg {
    TigaMsg::Behind { view, shard: host.shard, upto: host.pruned as u64 }
}

/// This start of a follower replica: the node's incarnation and the state transfers its
/// leader sent it to since.
fn follower_start(incarnation: u64, host: &Hosted) -> Start {
    Start { incarnation, rejoin: host.rejoins }
}

/// A follower's acknowledgement: its sync-point and executed count, and bodies it lacks.
fn ack_msg((view, incarnation): (u64, u64), host: &Hosted, fetch: Vec<TxnId>) -> TigaMsg {
    TigaMsg::SyncAck {
        view,
        shard: host.shard,
        start: follower_start(incarnation, host),
        synced: host.replica.sync_point() as u64,
        executed: host.executed as u64,
        fetch,
    }
}

/// A leader's closed timestamp: below the clock, below everything it holds, below every
/// released transaction that has not finished (run, and with its votes in), and below every
/// multi-shard entry fewer than `f` followers executed; never below what it promised
/// (everything past the promise was held above it).
fn leader_closed(host: &Hosted, now: Time) -> Timestamp {
    let below = |ts: Timestamp| Timestamp(ts.0.saturating_sub(1));
    let mut closed = Timestamp(now);
    if let Some(held) = host.replica.earliest_held() {
        closed = closed.min(below(held));
    }
    // Bounded by the released transactions not finished.
    for ts in host.queued.values().map(|q| q.ts).chain(host.pending.values().map(|p| p.ts)) {
        closed = closed.min(below(ts));
    }
    // A view change's new leader is a former follower: it takes the outcome of a
    // multi-shard entry from a replica that executed it, since the other leaders drop their
    // records once every leader promised past it. So the promise stays below every
    // multi-shard entry that fewer than `f` followers executed: any `f + 1` of the other
    // replicas then include one that did. Bounded by a sync message's entries; past them
    // (followers far behind, or not heard since a restart) it does not rise.
    let f = host.followers.len() / 2;
    if f > 0 {
        let mut executed: Vec<usize> =
            host.followers.iter().map(|n| host.acks.get(n).map_or(0, |&(_, e)| e)).collect();
        executed.sort_unstable_by(|a, b| b.cmp(a));
        let from = executed[f - 1].max(host.replica.log_base());
        let window = host.replica.log_since(from);
        if from + window.len() < host.replica.log_len() {
            return host.promised;
        }
        // A body pruned already counts as multi-shard: the promise waits.
        let multi = |txn: &TxnId| host.bodies.get(txn).is_none_or(|k| k.shards.len() > 1);
        for &(_, ts) in window.iter().filter(|(txn, _)| multi(txn)) {
            closed = closed.min(below(ts));
        }
    }
    // Below the promise only while a restarted leader runs again what it had finished
    // before its crash (new arrivals are held above it: see `leader_arrive`).
    closed.max(host.promised)
}

/// A remembered reply sent again carries the delay of the copy it answers (none where that
/// copy came from elsewhere than the coordinator): one sample per copy.
fn refresh_owd(msg: TigaMsg, owd: Option<u64>) -> TigaMsg {
    match msg {
        TigaMsg::Fast { view, txn, shard, ts, hash, result, .. } => {
            TigaMsg::Fast { view, txn, shard, ts, hash, owd_ns: owd, result }
        }
        TigaMsg::Slow { view, txn, shard, ts, .. } => {
            TigaMsg::Slow { view, txn, shard, ts, owd_ns: owd }
        }
        other => other,
    }
}

/// A follower's slow reply for `txn` at `ts` in global view `view`, with the delay its body
/// took to arrive if no earlier reply carried it (a sample counted twice would halve the
/// window the estimate spans).
fn slow_reply(view: u64, host: &mut Hosted, txn: TxnId, ts: Timestamp) -> TigaMsg {
    let owd_ns = host.bodies.get_mut(&txn).and_then(|known| known.owd_ns.take());
    TigaMsg::Slow { view, txn, shard: host.shard, ts, owd_ns }
}

/// Sends `msg` to `txn`'s coordinator and remembers it (the last one sent) to repeat on a
/// resend, forgetting the oldest beyond the bound.
fn reply(host: &mut Hosted, txn: TxnId, msg: TigaMsg, out: &mut Outbox<TigaMsg>) {
    if !host.quiet {
        out.send(txn.origin, msg.clone());
    }
    if host.answers.insert(txn, msg).is_none() {
        compact_answer_order(host);
        host.answer_order.push_back(txn);
        // The oldest reply goes, past the stale ids before it (bounded by the order's
        // length, which compaction keeps within twice the replies plus a margin).
        while host.answers.len() > ANSWERS_MAX {
            let Some(old) = host.answer_order.pop_front() else { break };
            host.answers.remove(&old);
        }
    }
}

/// Forgets the replies kept for transactions of `txn`'s coordinator incarnation below
/// `decided_below` (its coordinator decided them and sends them no more), at most up to
/// `txn` itself. Bounded by the replies forgotten.
fn forget_decided_answers(host: &mut Hosted, txn: TxnId, decided_below: u64) {
    let below = TxnId { seq: decided_below.min(txn.seq), ..txn };
    let decided: Vec<TxnId> =
        host.answers.range(TxnId { seq: 0, ..txn }..below).map(|(&id, _)| id).collect();
    for id in decided {
        host.answers.remove(&id);
    }
    compact_answer_order(host);
    if !host.results.is_empty() {
        let decided: Vec<TxnId> =
            host.results.range(TxnId { seq: 0, ..txn }..below).map(|(&id, _)| id).collect();
        for id in decided {
            host.results.remove(&id);
        }
    }
}

/// Drops from the eviction order the ids whose replies are gone (forgotten as decided), and
/// all but the last of an id pushed again, once it holds twice as many ids as replies plus
/// a margin: so it stays within a constant factor of the replies kept. Amortized constant
/// per reply.
fn compact_answer_order(host: &mut Hosted) {
    const MARGIN: usize = 1 << 10;
    if host.answer_order.len() <= 2 * host.answers.len() + MARGIN {
        return;
    }
    host.answer_order = answer_order(host).into();
}

/// Follower: executes the synced log in order at the leader's timestamps, as far as bodies
/// and the outcomes of multi-shard transactions allow. True when it executed any.
fn follower_execute(
    context: &NodeContext,
    host: &mut Hosted,
    floors: &BTreeMap<(NodeId, u64), u64>,
) -> bool {
    let start = host.executed;
    let synced_len = host.replica.sync_point();
    // An entry this follower and its leader synced survives a view change when `f + 1` is
    // two; otherwise only below the leader's commit-point.
    let upto = if slow_followers(context.topology.replicas) > 1 {
        synced_len.min(host.commit)
    } else {
        synced_len
    };
    // Bounded by the synced prefix.
    while host.executed < upto {
        let Some((txn, ts)) = host.replica.synced_entry(host.executed) else {
            debug_assert!(false, "a follower drops only what it executed");
            break;
        };
        if let Some(writes) = host.ahead.get(&txn) {
            // The leader had executed it when it cut this replica's state transfer.
            if let Some(writes) = writes {
                let Some((ok, _)) = host.outcomes.get(&txn) else { break };
                if *ok {
                    let writes = writes.clone();
                    apply(host, txn, ts, &writes);
                }
            }
            host.ahead.remove(&txn);
            host.executed += 1;
            continue;
        }
        let Some(known) = host.bodies.get(&txn) else { break };
        let none = (true, Vec::new());
        let (ok, inputs) = if known.shards.len() > 1 {
            match host.outcomes.get(&txn) {
                Some(outcome) => outcome,
                None => break, // The leader has not told the outcome yet.
            }
        } else {
            &none
        };
        if *ok && host.executed >= host.rejoin_end {
            debug_assert_newest(&host.store, &known.part, ts, txn);
        }
        let multi = known.shards.len() > 1;
        let mut feeds = BTreeMap::new();
        let result = if *ok {
            let (writes, result) = run_part(context, host.shard, &host.store, known, ts, inputs);
            if multi {
                feeds = feed_outputs(&known.part, &result);
            }
            // A multi-shard transaction that committed ran here too: the leader ran the same
            // pieces over the same state and inputs (a single-shard one may abort here).
            debug_assert!(
                known.shards.len() == 1 || matches!(result, ShardResult::Ran(_)),
                "{txn}: {result:?}"
            );
            if matches!(result, ShardResult::Ran(_)) {
                apply(host, txn, ts, &writes);
            }
            result
        } else {
            ShardResult::Skipped
        };
        if feeds.values().any(|outputs| !outputs.is_empty()) {
            host.fed.insert(txn, feeds);
        }
        // Kept for a view change that promotes this follower: its coordinator may still
        // wait for the shard's result.
        if host.results.len() < RESULTS_KEPT_MAX && !is_decided(floors, txn) {
            host.results.insert(txn, (ts, result));
        }
        // Its body and outcome stay until every replica executed it (the leader's base
        // passes it): a view change's new leader that has not may need them (see
        // `leader_closed`).
        host.executed += 1;
    }
    host.executed > start
}

/// What a replica of `shard` knows of a transaction whose body it finds in its journal;
/// an error when the body does not run here (a journal that is not this cluster's).
fn journaled_known(context: &NodeContext, shard: ShardId, body: TxnBody) -> Result<Known, String> {
    let shape = shape_of(context, &body.request, body.home)
        .map_err(|e| format!("the tiga journal holds {} that does not run: {e}", body.txn))?;
    let part =
        shape.parts.get(&shard).cloned().ok_or_else(|| {
            format!("the tiga journal holds {} with nothing on {shard:?}", body.txn)
        })?;
    Ok(Known { body: Arc::new(body), owd_ns: None, part, shards: shape.shards() })
}

/// A replica's bounds in a cluster of `shards_total` shards.
fn replica_limits(shards_total: u32) -> ReplicaLimits {
    ReplicaLimits {
        held_max: HELD_MAX,
        keys_max: STAMPED_KEYS_MAX,
        tail_max: TAIL_MAX,
        agreements_max: AGREEMENTS_MAX,
        release_max: RELEASE_MAX,
        shards_total,
    }
}

/// Leader: moves the finished prefix past every log entry executed and decided.
/// A restarted leader takes up the entries its checkpoint lists past its base: those queued
/// queue again, those waiting for votes wait again (holding their write keys), and finished
/// ones keep their bodies where the checkpoint had them.
fn restore_checkpointed(
    host: &mut Hosted,
    entries: Vec<(TxnId, Timestamp, Option<Known>, super::journal::EntryState)>,
) -> Result<(), String> {
    use super::journal::EntryState;
    // Bounded by the checkpoint's entries.
    for (txn, ts, known, state) in entries {
        let at = (ts, txn);
        match (state, known) {
            (EntryState::Done, known) => {
                if let Some(known) = known {
                    host.bodies.insert(txn, known);
                }
            }
            (EntryState::Queued { hash }, Some(known)) => {
                host.waits.enqueue(at, &known.part.reads, &known.part.writes);
                host.queued.insert(txn, Queued { ts, hash, speculative: false });
                host.bodies.insert(txn, known);
            }
            (EntryState::Pending(p), Some(known)) => {
                let others: BTreeSet<ShardId> = p.others.iter().copied().collect();
                if others.len() != p.others.len()
                    || others.contains(&host.shard)
                    || p.votes.iter().any(|(s, _)| !others.contains(s))
                    || p.write_keys.iter().any(|k| !known.part.writes.contains(k))
                {
                    return Err(format!("the tiga checkpoint's {txn} does not hold together"));
                }
                host.waits.enqueue(at, &known.part.reads, &p.write_keys);
                host.waits.ran(at, &known.part.reads);
                let votes: BTreeMap<ShardId, bool> = p.votes.into_iter().collect();
                if p.others.iter().all(|s| votes.contains_key(s)) {
                    host.complete.insert(txn);
                }
                let pending = Pending {
                    ts,
                    writes: p.writes.into_iter().collect(),
                    write_keys: p.write_keys,
                    own_ok: p.own_ok,
                    votes,
                    others: p.others,
                    feeds: p.feeds.into_iter().collect(),
                    inputs: p.inputs,
                };
                host.pending.insert(txn, pending);
                host.bodies.insert(txn, known);
            }
            (_, None) => return Err(format!("the tiga checkpoint lacks {txn}'s body")),
        }
    }
    Ok(())
}

/// The transactions whose replies are kept, oldest first (each once, where it was last
/// pushed): the order in which a checkpoint lists them and the replies are evicted.
fn answer_order(host: &Hosted) -> Vec<TxnId> {
    let mut seen = BTreeSet::new();
    let mut order: Vec<TxnId> = Vec::with_capacity(host.answers.len());
    // Bounded by the order's length.
    for &txn in host.answer_order.iter().rev() {
        if host.answers.contains_key(&txn) && seen.insert(txn) {
            order.push(txn);
        }
    }
    order.reverse();
    order
}

/// Whether an image's head says its rows replace the store whole.
fn head_whole(part: &StatePart) -> Option<bool> {
    match part {
        StatePart::Head { whole, .. } => Some(*whole),
        _ => None,
    }
}

/// `keys` (those written since the load, or every key) with their committed versions,
/// oldest first, in batches of about [`STATE_ROW_BYTES_MAX`] bytes: the store as a state
/// transfer or a checkpoint carries it. Lazy, and bounded by the keys given.
fn store_rows<'a>(
    store: &'a MvccStore,
    mut keys: impl Iterator<Item = &'a Key> + 'a,
) -> impl Iterator<Item = Vec<(Key, Vec<StateVersion>)>> + 'a {
    std::iter::from_fn(move || {
        let mut rows = Vec::new();
        let mut bytes = 0;
        while bytes < STATE_ROW_BYTES_MAX {
            let Some(key) = keys.next() else { break };
            let chain: Vec<StateVersion> = store
                .versions(key)
                .iter()
                .filter(|v| v.state == VersionState::Committed)
                .map(|v| StateVersion { ts: v.ts, writer: v.writer, value: v.value.clone() })
                .collect();
            if chain.is_empty() {
                continue;
            }
            let values: usize = chain
                .iter()
                .map(|v| STATE_VERSION_BYTES + v.value.as_ref().map_or(0, Vec::len))
                .sum();
            bytes += key.len() + values;
            rows.push((key.clone(), chain));
        }
        (!rows.is_empty()).then_some(rows)
    })
}

/// A committed version of a state transfer or a checkpoint, for the store.
fn committed_version(v: StateVersion) -> Version {
    Version { ts: v.ts, value: v.value, writer: v.writer, state: VersionState::Committed }
}

/// Leader: the log position a checkpoint is cut at: the finished prefix (for luigi, no
/// further than what is replicated, since its watermarks walk the log from there).
fn checkpoint_base(host: &Hosted) -> usize {
    let base = match host.streams {
        Some(_) => host.finished.min(host.replicated),
        None => host.finished,
    };
    base.max(host.replica.log_base())
}

/// Leader: the records of a checkpoint of this shard ([`super::journal::Checkpoint`]): its
/// log from [`checkpoint_base`] on with how far each entry got, the transactions logged below
/// it, the key hashes and release stamps, the store's rows written since the load, the
/// replies kept, the outcomes decided, and the live ordinary records (votes heard on
/// transactions not executed yet, open proposals, the promise, luigi's watermarks told).
/// Restarting from it gives the leader the state it had (what restarted from the whole
/// journal would have rebuilt), less the bodies of entries below the base.
fn checkpoint_records(host: &Hosted, floors: &BTreeMap<(NodeId, u64), u64>) -> Option<Vec<Record>> {
    use super::journal::{Checkpoint as Part, DecidedRecord, EntryState, PendingRecord, LIST_MAX};
    let shard = host.shard;
    let base = checkpoint_base(host);
    let log = host.replica.checkpoint_log(base)?;
    let stamp_floor = log.stamps.2;
    let mut records = vec![Record::Checkpoint(Part::Head {
        shard,
        base: base as u64,
        base_ts: log.base_ts,
        stamp_floor,
    })];
    let part = |p: Part| Record::Checkpoint(p);
    records.extend(
        log.below.chunks(LIST_MAX).map(|c| part(Part::InLog { shard, logged: c.to_vec() })),
    );
    let (reads, writes, _) = &log.stamps;
    for c in reads.chunks(LIST_MAX) {
        records.push(part(Part::Stamps { shard, reads: c.to_vec(), writes: Vec::new() }));
    }
    for c in writes.chunks(LIST_MAX) {
        records.push(part(Part::Stamps { shard, reads: Vec::new(), writes: c.to_vec() }));
    }
    records.extend(
        log.hashes.chunks(LIST_MAX).map(|c| part(Part::Hashes { shard, pairs: c.to_vec() })),
    );
    let rows = store_rows(&host.store, host.store.written_keys());
    records.extend(rows.map(|rows| part(Part::Rows { shard, rows })));
    // Bounded by the log past the base.
    for &(txn, ts) in &log.entries {
        let body = host.bodies.get(&txn).map(|k| (*k.body).clone());
        let state = if let Some(queued) = host.queued.get(&txn) {
            EntryState::Queued { hash: queued.hash }
        } else if let Some(p) = host.pending.get(&txn) {
            EntryState::Pending(Box::new(PendingRecord {
                writes: p.writes.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                write_keys: p.write_keys.clone(),
                own_ok: p.own_ok,
                votes: p.votes.iter().map(|(&s, &ok)| (s, ok)).collect(),
                others: p.others.clone(),
                feeds: p.feeds.iter().map(|(&s, f)| (s, f.clone())).collect(),
                inputs: p.inputs.clone(),
            }))
        } else {
            EntryState::Done
        };
        debug_assert!(body.is_some() || state == EntryState::Done, "{txn} unfinished, no body");
        records.push(part(Part::Entry { shard, txn, ts, body, state }));
    }
    let answers: Vec<(TxnId, TigaMsg)> =
        answer_order(host).into_iter().map(|txn| (txn, host.answers[&txn].clone())).collect();
    records.extend(
        answers.chunks(LIST_MAX).map(|c| part(Part::Answers { shard, answers: c.to_vec() })),
    );
    let decided: Vec<(TxnId, DecidedRecord)> = host
        .decided
        .iter()
        .map(|(&txn, d)| {
            let (ts, settled, own, all, inputs) = (d.ts, d.settled, d.own, d.all, d.inputs.clone());
            let feeds = d.feeds.iter().map(|(s, o)| (*s, o.clone())).collect();
            let others = d.others.clone();
            (txn, DecidedRecord { ts, settled, own, all, inputs, feeds, others })
        })
        .collect();
    records.extend(
        decided.chunks(LIST_MAX).map(|c| part(Part::Decided { shard, decided: c.to_vec() })),
    );
    let floors: Vec<(NodeId, u64, u64)> = floors.iter().map(|(&(n, i), &f)| (n, i, f)).collect();
    records
        .extend(floors.chunks(LIST_MAX).map(|c| part(Part::Floors { shard, floors: c.to_vec() })));
    // The live ordinary records.
    for (&txn, votes) in &host.early_votes {
        for (&from, vote) in votes {
            let (ok, outputs) = (vote.ok, vote.outputs.clone());
            records.push(Record::Vote { shard, txn, from, ok, outputs });
        }
    }
    for (&txn, &ts) in &host.journaled {
        match host.bodies.get(&txn) {
            Some(known) => {
                records.push(Record::Proposed { shard, ts, body: (*known.body).clone() })
            }
            None => debug_assert!(false, "{txn} proposed without its body"),
        }
    }
    if host.promised > Timestamp::ZERO {
        records.push(Record::Promised { shard, ts: host.promised });
    }
    if let Some(streams) = &host.streams {
        for (worker, ts) in streams.told() {
            records.push(Record::Told { shard, worker, ts });
        }
    }
    Some(records)
}

fn advance_finished(host: &mut Hosted) {
    if !host.replica.leads() {
        return;
    }
    // Each round takes a whole window or stops: bounded by the log.
    loop {
        let window = host.replica.log_since(host.finished);
        let done = window
            .iter()
            .take_while(|(txn, _)| {
                !host.queued.contains_key(txn) && !host.pending.contains_key(txn)
            })
            .count();
        if done == 0 {
            break;
        }
        host.finished += done;
        if done < window.len() {
            break;
        }
    }
}

/// Leader: the state a rejoining follower takes ([`StatePart`]).
///
/// The store goes as it is, with the entries past the finished prefix that it already
/// reflects (applied: the follower skips them) and those executed but waiting for votes (their
/// writes: the follower applies them on a yes); the rest the follower executes from the log,
/// in log order. That reproduces the leader's state because conflicting entries sit in log
/// order and timestamp order alike: an entry applied past the prefix had no unfinished earlier
/// writer of its keys, so whatever still runs on those keys comes after it, or only reads
/// below it (and the leader keeps the versions a queued reader needs, see [`apply`]). `None`
/// while a body of an entry past the prefix is missing here (the hashes need its keys).
/// `floors`: the coordinators' decided floors known here; the transactions logged below the
/// base that they do not cover go along, so the follower still knows them as logged.
fn state_image(
    host: &Hosted,
    floors: &BTreeMap<(NodeId, u64), u64>,
    whole: bool,
) -> Option<Vec<StatePart>> {
    let upto = host.finished;
    let mut hashes = host.replica.hashes().clone();
    let mut ahead: Vec<AheadEntry> = Vec::new();
    let mut position = upto;
    // Bounded by the log past the finished prefix, a window at a time.
    loop {
        let window = host.replica.log_since(position);
        if window.is_empty() {
            break;
        }
        for &(txn, ts) in window {
            hashes.toggle(txn, ts, &host.bodies.get(&txn)?.part.keys());
            if let Some(pending) = host.pending.get(&txn) {
                let writes = pending.writes.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                ahead.push((txn, Some(writes)));
            } else if !host.queued.contains_key(&txn) {
                ahead.push((txn, None));
            }
        }
        position += window.len();
    }
    let end = position as u64;
    let base = host.replica.log_base();
    debug_assert!(base <= upto, "the log is dropped below the finished prefix only");
    let floor = host.replica.ts_high();
    let head = StatePart::Head { base: base as u64, upto: upto as u64, end, floor, whole };
    // Bounded by the transactions logged here (every one goes by; only the undecided stay).
    let lingering = host.replica.logged_below_base(|t| !is_decided(floors, t));
    let prefix = host.replica.log_prefix(upto);
    Some(image_parts(head, prefix, &lingering, floors, &hashes, &host.store, &ahead))
}

/// An image's parts, in the order [`install`] takes them: `head`, the prefix's entries, the
/// transactions below its base that still count as logged, the coordinators' decided
/// floors, the key hashes, the store's rows written since the load, and the entries ahead.
fn image_parts(
    head: StatePart,
    prefix: &[(TxnId, Timestamp)],
    lingering: &[TxnId],
    floors: &BTreeMap<(NodeId, u64), u64>,
    hashes: &super::quorum::KeyHashes,
    store: &MvccStore,
    ahead: &[AheadEntry],
) -> Vec<StatePart> {
    let max = super::log::SYNC_ENTRIES_MAX;
    let mut parts = vec![head];
    parts.extend(prefix.chunks(max).map(|c| StatePart::Entries(c.to_vec())));
    parts.extend(lingering.chunks(max).map(|c| StatePart::Lingering(c.to_vec())));
    let floors: Vec<(NodeId, u64, u64)> = floors.iter().map(|(&(n, i), &f)| (n, i, f)).collect();
    parts.extend(floors.chunks(max).map(|c| StatePart::Decided(c.to_vec())));
    let pairs: Vec<(Key, u64)> = hashes.pairs().map(|(key, hash)| (key.clone(), hash)).collect();
    parts.extend(pairs.chunks(STATE_HASHES_MAX).map(|c| StatePart::Hashes(c.to_vec())));
    let whole = matches!(head_whole(&parts[0]), Some(true));
    let keys: Box<dyn Iterator<Item = &Key>> =
        if whole { Box::new(store.keys()) } else { Box::new(store.written_keys()) };
    parts.extend(store_rows(store, keys).map(StatePart::Rows));
    parts.extend(ahead.chunks(max).map(|c| StatePart::Ahead(c.to_vec())));
    parts
}

/// Rejoining follower: checks the transfer's `parts` and, if they hold together, makes them
/// this replica's state: the prefix as its synced log (executed), the leader's hashes, its
/// versions over the store as loaded, and the entries ahead. Nothing changes on an error.
/// Returns the coordinators' decided floors the leader sent, for the node to take up.
fn install(
    context: &NodeContext,
    host: &mut Hosted,
    parts: Vec<StatePart>,
) -> Result<Vec<(NodeId, u64, u64)>, String> {
    // A deposed leader's store holds writes no log vouches for: only an image of every key
    // replaces it.
    let whole = parts.first().and_then(head_whole) == Some(true);
    if host.retired && !whole {
        return Err("a deposed leader's store is replaced by a whole image only".into());
    }
    let (floors, rows) = install_without_rows(context, host, parts)?;
    if whole {
        host.store = MvccStore::new();
        host.retired = false;
    }
    for (key, chain) in rows {
        let versions = chain.into_iter().map(committed_version).collect();
        host.store.restore_chain(key, versions);
    }
    Ok(floors)
}

/// What installing an image leaves to the caller: the coordinators' decided floors it
/// carried, and the store's rows to put over the store as loaded.
type Installed = (Vec<(NodeId, u64, u64)>, Vec<(Key, Vec<StateVersion>)>);

/// [`install`], but the image's rows are returned, not put in the store (a restarted node's
/// store is loaded after the journal is read).
fn install_without_rows(
    context: &NodeContext,
    host: &mut Hosted,
    parts: Vec<StatePart>,
) -> Result<Installed, String> {
    let mut parts = parts.into_iter();
    let Some(StatePart::Head { base, upto, end, floor, .. }) = parts.next() else {
        return Err("a state transfer starts with its head".into());
    };
    let (mut entries, mut pairs, mut rows) = (Vec::new(), Vec::new(), Vec::new());
    let (mut lingering, mut floors) = (Vec::new(), Vec::new());
    let mut ahead: Vec<AheadEntry> = Vec::new();
    let max = super::log::SYNC_ENTRIES_MAX;
    for part in parts {
        match part {
            StatePart::Head { .. } => return Err("a second head".into()),
            StatePart::Entries(more) if more.len() <= max => entries.extend(more),
            StatePart::Lingering(more) if more.len() <= max => lingering.extend(more),
            StatePart::Decided(more) if more.len() <= max => floors.extend(more),
            StatePart::Hashes(more) if more.len() <= STATE_HASHES_MAX => pairs.extend(more),
            StatePart::Rows(more) => rows.extend(more),
            StatePart::Ahead(more) if more.len() <= max => ahead.extend(more),
            _ => return Err("an oversized part".into()),
        }
    }
    let listed = upto.checked_sub(base);
    if listed != Some(entries.len() as u64) || end < upto || ahead.len() as u64 > end - upto {
        return Err(format!(
            "{} entries for a prefix of {base}..{upto}, {} ahead of it in a log of {end}",
            entries.len(),
            ahead.len()
        ));
    }
    let base = usize::try_from(base).map_err(|_| "a base past this machine's positions")?;
    let in_order =
        |chain: &[StateVersion]| !chain.is_empty() && chain.windows(2).all(|w| w[0].ts < w[1].ts);
    if rows.iter().any(|(_, chain)| !in_order(chain)) {
        return Err("a key's versions out of timestamp order".into());
    }
    let hashes = super::quorum::KeyHashes::from_pairs(pairs);
    let limits = replica_limits(context.topology.shards);
    let replica = Replica::rejoined(host.shard, limits, (base, entries, lingering), hashes, floor)
        .ok_or("the prefix lists a transaction twice")?;
    let ahead: BTreeMap<TxnId, Option<Overlay>> =
        ahead.into_iter().map(|(txn, writes)| (txn, writes.map(Overlay::from_iter))).collect();
    if ahead.keys().any(|&txn| replica.logged(txn)) {
        return Err("an entry both in the prefix and ahead of it".into());
    }
    let executed = replica.log_len();
    host.replica = replica;
    host.executed = executed;
    host.commit = executed;
    host.ahead = ahead;
    host.rejoin_end = usize::try_from(end).unwrap_or(usize::MAX);
    host.bodies.clear();
    host.outcomes.clear();
    host.fed.clear();
    host.closed.clear();
    host.unlisted.clear();
    host.tail_cut = Timestamp::ZERO;
    host.joining = None;
    host.stashed = None;
    host.deposed = None;
    // What it reported at the view change that sent it here is not what it holds now.
    host.frozen = None;
    host.follower_checkpointed = executed;
    Ok((floors, rows))
}

/// Follower: the records of a checkpoint of this shard: the image of its executed prefix (a
/// state transfer's parts: the prefix, what lingers below its base, the coordinators' decided
/// floors, the key hashes over the prefix alone, the store's rows written since the load, and
/// the entries ahead of it that a transfer brought), then its synced entries past the prefix
/// with their bodies, the outcomes heard, and its tail. A restart installs the image as a
/// transfer is installed and runs the rest as the records they are. A rejoining follower's
/// checkpoint says so, and nothing else. `None` while a synced entry's body that its hashes
/// hold is missing (the next step checkpoints instead).
fn follower_checkpoint_records(
    host: &Hosted,
    floors: &BTreeMap<(NodeId, u64), u64>,
) -> Option<Vec<Record>> {
    let shard = host.shard;
    if host.joining.is_some() {
        return Some(vec![Record::Joining { shard }]);
    }
    let max = super::log::SYNC_ENTRIES_MAX;
    let executed = host.executed;
    let base = host.replica.log_base();
    debug_assert!(base <= executed, "a follower drops only what it executed");
    let bodies = &host.bodies;
    let hashes =
        host.replica.hashes_below(executed, |txn| bodies.get(&txn).map(|k| k.part.keys()))?;
    let prefix = host.replica.follower_entries(base, executed);
    let floor = host.replica.ts_high();
    let end = host.rejoin_end.max(executed) as u64;
    let head =
        StatePart::Head { base: base as u64, upto: executed as u64, end, floor, whole: false };
    let lingering = host.replica.follower_lingering();
    let ahead: Vec<AheadEntry> = host
        .ahead
        .iter()
        .map(|(&txn, writes)| {
            let writes = writes.as_ref().map(|w| w.iter().map(|(k, v)| (k.clone(), v.clone())));
            (txn, writes.map(Iterator::collect))
        })
        .collect();
    let parts = image_parts(head, &prefix, &lingering, floors, &hashes, &host.store, &ahead);
    let mut records: Vec<Record> =
        parts.into_iter().map(|part| Record::Image { shard, part }).collect();
    // Bounded by the synced prefix past the executed one.
    let rest = host.replica.follower_entries(executed, usize::MAX);
    for (index, chunk) in rest.chunks(max).enumerate() {
        let entries = chunk
            .iter()
            .map(|&(txn, ts)| (txn, ts, bodies.get(&txn).map(|k| (*k.body).clone())))
            .collect();
        let at = (executed + index * max) as u64;
        records.push(Record::Synced { shard, at, entries });
    }
    // Bounded by the tail.
    let tail = host.replica.tail();
    for &(txn, ts) in &tail {
        let Some(known) = bodies.get(&txn) else {
            debug_assert!(false, "{txn} in the tail without its body");
            return None;
        };
        let hash = match host.answers.get(&txn) {
            Some(&TigaMsg::Fast { ts: said, hash, .. }) if said == ts => Some(hash),
            _ => None,
        };
        records.push(Record::Released { shard, ts, hash, body: (*known.body).clone() });
    }
    // Then (a restart keeps the outcomes of logged entries only) the outcomes of those
    // entries and of the tail's: a leader's sync may carry the outcome of an entry past the
    // entries it lists, which this replica released already. Others linger, of entries
    // executed already.
    for txn in rest.iter().chain(&tail).map(|&(txn, _)| txn) {
        if let Some((ok, inputs)) = host.outcomes.get(&txn) {
            let outcome = SyncOutcome { txn, ok: *ok, inputs: inputs.clone() };
            records.push(Record::Outcome { shard, outcome });
        }
    }
    Some(records)
}

/// Debug builds: no key `part` declares has a version above `ts`: a follower runs its log in
/// order, so it reads the newest version of every key (what [`apply`]'s pruning relies on).
/// Not below the end of a state transfer's log: its store may hold the versions of entries
/// the leader had applied before an earlier entry that only reads below them.
fn debug_assert_newest(store: &MvccStore, part: &Part, ts: Timestamp, txn: TxnId) {
    if cfg!(debug_assertions) {
        for key in part.reads.iter().chain(&part.writes) {
            let newest = store.versions(key).last().map(|v| v.ts);
            debug_assert!(
                newest.is_none_or(|newest| newest <= ts),
                "{txn} runs at {ts:?}, below {key:?}'s newest version at {newest:?}"
            );
        }
    }
}

/// Runs the shard's pieces of `known` at `ts` on `store`, with `remote` the outputs of other
/// shards' pieces they take: its writes and the shard's result. A piece that reads or writes
/// a key the part did not declare from the arguments breaks the one-shot contract (the hold
/// queue ordered the transaction by the declared keys) and fails, unless it is guarded.
fn run_part(
    context: &NodeContext,
    shard: ShardId,
    store: &MvccStore,
    known: &Known,
    ts: Timestamp,
    remote: &[(u32, PieceOutput)],
) -> (Overlay, ShardResult) {
    let Some(procedure) = context.registry.get(known.body.request.proc) else {
        let error = ProcError::BadArgs("unknown procedure".into());
        return (Overlay::new(), ShardResult::Failed(error));
    };
    let part = &known.part;
    let placement = Placement { shard, partitioner: &context.partitioner };
    let source = AtTimestamp(store, ts);
    let mut overlay = Overlay::new();
    let mut ran: Vec<(u32, PieceOutput)> = Vec::with_capacity(part.pieces.len());
    let contract = |why: String| (Overlay::new(), ShardResult::Failed(ProcError::Contract(why)));
    // Bounded by the plan (at most PIECES_MAX pieces).
    for (&piece, deps) in part.pieces.iter().zip(&part.deps) {
        let mut inputs = Vec::with_capacity(deps.len());
        for dep in deps {
            let found = ran.iter().chain(remote).find(|(p, _)| p == dep);
            match found {
                Some((_, output)) => inputs.push(output),
                None => return contract(format!("piece {piece} lacks piece {dep}'s output")),
            }
        }
        let call = (piece, &known.body.request.args, &inputs[..]);
        match run_piece(procedure.as_ref(), placement, call, &source, &overlay) {
            Err(error) => return (Overlay::new(), ShardResult::Failed(error)),
            Ok(run) => {
                // A guarded piece's keys came from its inputs (`run_piece` checked that it
                // wrote only those, on this shard); the guard ordered it.
                let guarded = part.guarded.binary_search(&piece).is_ok();
                let undeclared =
                    run.reads.iter().map(|(key, _)| key).find(|k| !guarded && !part.declares(k));
                if let Some(key) = undeclared {
                    return contract(format!(
                        "piece {piece} read {key:?}, a key its arguments did not name"
                    ));
                }
                if !run.scans.is_empty() {
                    return contract(format!("piece {piece} scanned with its inputs"));
                }
                match run.effects {
                    Err(abort) => return (Overlay::new(), ShardResult::UserAbort(abort.0)),
                    Ok(effects) => {
                        for write in effects.writes {
                            if !guarded && part.writes.binary_search(&write.key).is_err() {
                                return contract(format!(
                                    "piece {piece} wrote {:?}, a key its arguments did not name",
                                    write.key
                                ));
                            }
                            overlay.insert(write.key, write.value);
                        }
                        ran.push((piece, effects.output));
                    }
                }
            }
        }
    }
    (overlay, ShardResult::Ran(ran))
}

/// The outputs of other shards' pieces that `part` takes, each from the vote of the shard
/// that runs the piece; `None` while one is missing.
fn gather_inputs(
    part: &Part,
    votes: Option<&BTreeMap<ShardId, PeerVote>>,
) -> Option<Vec<(u32, PieceOutput)>> {
    if part.inputs.is_empty() {
        return Some(Vec::new());
    }
    let votes = votes?;
    part.inputs
        .iter()
        .map(|&(piece, source)| {
            let vote = votes.get(&source).filter(|v| v.ok)?;
            vote.outputs.iter().find(|(p, _)| *p == piece).cloned()
        })
        .collect()
}

/// Per other shard, the outputs of pieces here that its pieces take (none unless they ran).
fn feed_outputs(part: &Part, result: &ShardResult) -> BTreeMap<ShardId, Vec<(u32, PieceOutput)>> {
    let ShardResult::Ran(ran) = result else { return BTreeMap::new() };
    part.feeds
        .iter()
        .map(|(&shard, pieces)| {
            let outputs = ran.iter().filter(|(p, _)| pieces.contains(p)).cloned().collect();
            (shard, outputs)
        })
        .collect()
}

/// This shard's vote on a pending transaction, for the leader of `peer`.
fn vote_msg(
    view: u64,
    txn: TxnId,
    shard: ShardId,
    peer: ShardId,
    pending: &Pending,
    want_reply: bool,
) -> TigaMsg {
    let outputs = pending.feeds.get(&peer).cloned().unwrap_or_default();
    TigaMsg::Vote { view, txn, from: shard, to: peer, ok: pending.own_ok, outputs, want_reply }
}

/// Takes another leader's vote: recorded on a pending transaction, kept (with the outputs it
/// carries) for one not executed here yet, ignored for one decided.
fn deliver_vote(host: &mut Hosted, txn: TxnId, from: ShardId, vote: PeerVote) {
    if host.pending.contains_key(&txn) {
        record_vote(host, txn, from, vote.ok);
    } else if !host.decided.contains_key(&txn) && !finished_here(host, txn) {
        host.early_votes.entry(txn).or_default().insert(from, vote);
        if let Some(queued) = host.queued.get(&txn) {
            // It may have waited for these outputs, or may skip its pieces now.
            host.waits.wake((queued.ts, txn));
        }
    }
}

/// Leader: `txn` is in the log and finished here (executed, and decided if it spans shards):
/// a vote for it changes nothing, even once its outcome record is gone.
fn finished_here(host: &Hosted, txn: TxnId) -> bool {
    host.replica.leads()
        && host.replica.logged(txn)
        && !host.queued.contains_key(&txn)
        && !host.pending.contains_key(&txn)
}

/// About how many bytes `outputs` take on the wire.
fn outputs_bytes(outputs: &[(u32, PieceOutput)]) -> usize {
    fn datum_bytes(datum: &Datum) -> usize {
        match datum {
            Datum::Int(_) | Datum::Uint(_) => 9,
            Datum::Bytes(bytes) => 5 + bytes.len(),
            // Decoded data nests only as deep as the decoder allows.
            Datum::List(items) => 5 + items.iter().map(datum_bytes).sum::<usize>(),
        }
    }
    outputs.iter().map(|(_, output)| 5 + output.iter().map(datum_bytes).sum::<usize>()).sum()
}

/// Applies `txn`'s writes at `ts`, then drops the versions of the written keys that no read
/// can see any more (unless the replica keeps history for snapshot reads, which read below
/// the newest version). A transaction released later reads a key above its newest version (a
/// late one is bumped past it, a conflicting one waits its turn), and a follower runs its log
/// in order, so only a leader's queued readers read below it: each written key keeps its
/// newest version at or below the first queued reader's timestamp, and everything newer.
fn apply(host: &mut Hosted, txn: TxnId, ts: Timestamp, writes: &Overlay) {
    let store = &mut host.store;
    let leads = host.replica.leads();
    for (key, value) in writes {
        match store.write(key.clone(), ts, value.clone(), txn, VersionState::Committed) {
            Ok(()) => {}
            // Two conflicting transactions at one timestamp run in id order (the hold queue's
            // order, on every replica): the later one's version replaces the earlier's.
            Err(StoreError::DuplicateTimestamp { .. }) => {
                let replaced = store.replace_at(key, ts, value.clone(), txn);
                assert!(replaced, "{txn}: the version of {key:?} at {ts:?} is committed");
            }
            Err(error) => panic!("{txn} writes {key:?} at {ts:?}: {error}"),
        }
        // A key written behind a guard is pruned like any other: a guarded reader of it is a
        // writer of the guard, which any later writer of the key also writes and so waits
        // for (`Procedure::guard`'s promise).
        if !host.keep_history {
            let first_reader = host.waits.first_reader(key).filter(|_| leads);
            store.prune_key(key, first_reader.map_or(Timestamp::MAX, |(ts, _)| ts));
        }
    }
}

fn record_vote(host: &mut Hosted, txn: TxnId, from: ShardId, ok: bool) {
    if let Some(pending) = host.pending.get_mut(&txn) {
        if pending.others.contains(&from) {
            pending.votes.insert(from, ok);
            if pending.others.iter().all(|s| pending.votes.contains_key(s)) {
                host.complete.insert(txn);
            }
        }
    }
}

/// Applies or drops the writes of every pending transaction whose votes are all in. True when
/// one finished.
fn finish_ready(host: &mut Hosted) -> bool {
    let ready = std::mem::take(&mut host.complete);
    for &txn in &ready {
        let Some(pending) = host.pending.remove(&txn) else { continue };
        let all = pending.own_ok && pending.votes.values().all(|&ok| ok);
        if all {
            apply(host, txn, pending.ts, &pending.writes);
        }
        host.waits.finished((pending.ts, txn), &pending.write_keys);
        let inputs = if all { pending.inputs } else { Vec::new() };
        if host.followers.is_empty() {
            host.bodies.remove(&txn); // Every peer had it: each proposed before the release.
        } else {
            host.fresh_outcomes.push(SyncOutcome { txn, ok: all, inputs: inputs.clone() });
        }
        let (ts, own, feeds, others) = (pending.ts, pending.own_ok, pending.feeds, pending.others);
        let decided = Decided { ts, settled: false, own, all, inputs, feeds, others };
        host.decided.insert(txn, decided);
    }
    !ready.is_empty()
}

/// The decided outcomes of multi-shard entries from log position `from` (a bounded window).
fn window_outcomes(host: &Hosted, from: usize) -> Vec<SyncOutcome> {
    host.replica
        .log_since(from)
        .iter()
        .take(OUTCOMES_WINDOW_MAX)
        .filter_map(|&(txn, _)| {
            let decided = host.decided.get(&txn)?;
            Some(SyncOutcome { txn, ok: decided.all, inputs: decided.inputs.clone() })
        })
        .collect()
}

impl TigaNode {
    /// Runs one step of the node into a scratch outbox, then passes its effects on: the
    /// step's journal records as one persist, and its sends held back while any record issued
    /// is not durable yet ([`super::journal`]). Tiga and luigi nodes alike.
    fn step(&mut self, out: &mut Outbox<TigaMsg>, f: impl FnOnce(&mut Self, &mut Outbox<TigaMsg>)) {
        let mut inner = std::mem::take(&mut self.scratch);
        inner.begin_call(out.chain());
        f(self, &mut inner);
        if self.checkpoint_due() {
            self.write_checkpoint();
        }
        let journal = &mut self.journal;
        if let Some((token, records)) = journal.take_batch() {
            out.persist(PersistToken(token), records, Durability::Synced);
        }
        let mut hops = out.chain();
        // Bounded by what the step emitted.
        for effect in inner.drain() {
            match effect {
                Effect::Send { to, msg } if journal.waiting() => journal.defer(hops, to, msg),
                Effect::Send { to, msg } => out.send_after(to, msg, hops),
                Effect::SetTimer { timer, after_ns } => out.set_timer(timer, after_ns),
                Effect::Reply { request, outcome } => out.reply_after(request, outcome, hops),
                Effect::DependsOn { hops: chain } => hops = chain,
                Effect::Persist { .. } => debug_assert!(false, "tiga persists by its journal"),
            }
        }
        self.scratch = inner;
        self.flush_manager(out);
    }

    /// True when a leader here finished [`crate::Timing::snapshot_interval_entries`] log
    /// entries since its last checkpoint (never while a restarted leader runs its journal
    /// again).
    fn checkpoint_due(&self) -> bool {
        let every = usize::try_from(self.context.timing.snapshot_interval_entries)
            .unwrap_or(usize::MAX)
            .max(1);
        let mut due = self.checkpoint_wanted;
        for host in self.hosted.values() {
            if host.quiet || host.recovering.is_some() {
                // Not while a new leader gathers reports: its journal holds the follower it
                // was until it leads (then a checkpoint is due at once).
                return false;
            }
            due |= match host.replica.leads() {
                true => checkpoint_base(host) >= host.checkpointed.saturating_add(every),
                false => {
                    // Past the next multiple of `every`, shifted by this follower's offset.
                    let offset = self.checkpoint_offset(host.shard, every);
                    let cycle = host.follower_checkpointed.saturating_add(offset) / every;
                    host.executed.saturating_add(offset) / every > cycle
                }
            };
        }
        due
    }

    /// Where a follower of `shard` checkpoints in a cycle of `every` executed entries: its
    /// replica's distance from the leader's, in `replicas`ths of the cycle. A checkpoint holds
    /// back a node's sends until it is durable, and the followers of a shard execute at the
    /// same pace: checkpointing at the same entry, they stalled both commit paths of the shard
    /// at once (docs/measurements.md); staggered, the leader and the other followers commit
    /// on.
    fn checkpoint_offset(&self, shard: ShardId, every: usize) -> usize {
        let replicas = self.context.topology.replicas.max(1);
        let slot = self.context.topology.nodes[self.context.id.0 as usize]
            .replicas
            .iter()
            .find(|s| s.shard == shard)
            .map_or(0, |s| s.replica);
        let leader = self.view.leader_slot(shard, replicas);
        let distance = (slot + replicas - leader) % replicas;
        every / replicas as usize * distance as usize
    }

    /// Writes a checkpoint of every shard led here into the step's persist, and deletes the
    /// journal's records before it ([`super::journal::Checkpoint`]).
    fn write_checkpoint(&mut self) {
        // Every follower's part first: one whose hashes need a body still missing puts the
        // checkpoint off (it deletes every record before it, its shard's too).
        let mut followed = Vec::new();
        for host in self.hosted.values().filter(|h| !h.replica.leads()) {
            match follower_checkpoint_records(host, &self.decided_floors) {
                Some(records) => followed.push((host.shard, records)),
                None => {
                    // Every synced entry's body is here until it is executed or fetched.
                    debug_assert!(false, "{:?}: a synced entry lacks its body", host.shard);
                    self.counts.checkpoints_put_off_total += 1;
                    return;
                }
            }
        }
        self.checkpoint_wanted = false;
        let bytes_before = self.journal.bytes_total;
        let begin = self.journal.begin_checkpoint();
        let mut written = Vec::new();
        // The view, which a restart starts in (the records before the checkpoint go).
        let view = Record::View {
            global: self.view.global,
            local: self.view.local.clone(),
            detective: self.view.mode == Mode::Detective,
        };
        self.journal.write(&view);
        if cfg!(debug_assertions) {
            written.push(view);
        }
        for (shard, records) in followed {
            // Bounded by the shard's state: the records of one checkpoint.
            for record in &records {
                self.journal.write(record);
            }
            let host = self.hosted.get_mut(&shard).expect("hosted");
            host.follower_checkpointed = host.executed;
            if cfg!(debug_assertions) {
                written.extend(records);
            }
        }
        for host in self.hosted.values_mut().filter(|h| h.replica.leads()) {
            let Some(records) = checkpoint_records(host, &self.decided_floors) else {
                debug_assert!(false, "a leader checkpoints its own log");
                continue;
            };
            // Bounded by the shard's state: the records of one checkpoint.
            for record in &records {
                self.journal.write(record);
            }
            host.checkpointed = checkpoint_base(host);
            if cfg!(debug_assertions) {
                written.extend(records);
            }
        }
        self.journal.end_checkpoint(begin);
        self.counts.checkpoints_total += 1;
        self.counts.checkpoint_bytes_last = self.journal.bytes_total - bytes_before;
        if cfg!(debug_assertions) {
            self.debug_check_checkpoint(written);
        }
    }

    /// Debug builds: a leader restarted from the checkpoint `records` takes up exactly the
    /// state of every shard it leads that the checkpoint was cut from (the log, what was
    /// logged below it, hashes, release stamps, the entries queued and waiting for votes,
    /// replies kept, outcomes, votes heard, open proposals, the promise); only the bodies of
    /// finished entries it no longer needs may be missing.
    fn debug_check_checkpoint(&self, records: Vec<Record>) {
        use super::journal::Checkpoint as Part;
        let framed = std::iter::once(Record::Checkpoint(Part::Begin { seq: 0 }))
            .chain(records)
            .chain(std::iter::once(Record::Checkpoint(Part::End { seq: 0 })));
        let durable: BTreeMap<Vec<u8>, Vec<u8>> = framed
            .enumerate()
            .map(|(seq, record)| {
                let key = [super::journal::KEY_PREFIX, &(seq as u64).to_be_bytes()].concat();
                (key, postcard::to_allocvec(&record).expect("records encode"))
            })
            .collect();
        let (shards, seqs) = super::journal::recover(&durable).expect("a checkpoint recovers");
        let context = self.context.clone();
        let (variant, view) = (self.variant, self.view.clone());
        let mut again = Self::build(context, variant, view, self.owd, self.snapshot_reads)
            .expect("the node builds again");
        again.resume(shards, seqs).expect("a checkpoint resumes");
        assert_eq!(again.decided_floors, self.decided_floors, "the coordinators' floors");
        for (&shard, host) in self.hosted.iter().filter(|(_, h)| !h.replica.leads()) {
            again.restore_follower(shard);
            let restored = &again.hosted[&shard];
            let summary = |h: &Hosted| {
                let log = h.replica.follower_entries(h.executed, usize::MAX);
                let hashes: Vec<_> = h.replica.hashes().pairs().collect();
                let tail = h.replica.tail();
                let outcomes: Vec<_> =
                    log.iter().chain(&tail).filter_map(|(txn, _)| h.outcomes.get(txn)).collect();
                format!(
                    "{:?} {:?} {} {} {log:?} {:?} {hashes:?} {:?} {:?}",
                    h.joining.is_some(),
                    h.executed,
                    h.replica.sync_point(),
                    h.replica.log_len(),
                    h.replica.tail(),
                    outcomes,
                    h.ahead,
                )
            };
            assert_eq!(summary(host), summary(restored), "{shard:?}: the follower's log");
        }
        for (shard, host) in self.hosted.iter().filter(|(_, h)| h.replica.leads()) {
            let restored = &again.hosted[shard];
            let base = host.checkpointed;
            let log = |h: &Hosted| {
                let mut log = h.replica.checkpoint_log(base).expect("a leader's log");
                log.below.sort_unstable();
                format!("{log:?}")
            };
            assert_eq!(log(host), log(restored), "{shard:?}: the log");
            let summary = |h: &Hosted| {
                let queued: Vec<_> = h
                    .queued
                    .iter()
                    .filter(|(_, q)| !q.speculative)
                    .map(|(t, q)| (*t, q.ts, q.hash))
                    .collect();
                format!(
                    "{queued:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
                    h.pending,
                    h.complete,
                    h.answers,
                    answer_order(h),
                    (&h.decided, &h.settling),
                    h.early_votes,
                    h.journaled,
                    h.promised,
                )
            };
            assert_eq!(summary(host), summary(restored), "{shard:?}: the entries and records");
            assert_eq!(restored.finished, base, "{shard:?}: finished up to the base");
        }
    }

    /// A restarted node takes up what its journal holds (before the stores are loaded; the
    /// log runs again when the node starts): per shard it leads, the log with its bodies,
    /// hashes and release stamps, the votes heard, the promised closed timestamp, and the
    /// proposals still open, held again where they were proposed. Errors when the journal
    /// speaks of a shard this node does not lead or of a transaction it cannot read.
    fn resume(&mut self, shards: BTreeMap<ShardId, Recovered>, seqs: Seqs) -> Result<(), String> {
        self.journal = Journal::new(seqs);
        let limits = replica_limits(self.context.topology.shards);
        let detective = self.view.mode == Mode::Detective;
        for (shard, mut recovered) in shards {
            if let Some(followed) = recovered.follower.take() {
                if self.hosted.get(&shard).is_some_and(|h| h.replica.leads()) {
                    if followed.joining {
                        // Chosen to lead while it rejoined (or as a deposed leader waiting to
                        // lead on from the state it kept, which a restart loses): it holds no
                        // log, rejoins, and says it cannot lead.
                        self.demote_to_rejoin(shard);
                    } else if self.view_journaled {
                        // Promoted at a view change and restarted before its first checkpoint
                        // as the leader: the follower it was gathers the reports again.
                        self.demote_to_gather(shard);
                    }
                }
                self.resume_follower(shard, followed)?;
                continue;
            }
            let Some(host) = self.hosted.get_mut(&shard).filter(|h| h.replica.leads()) else {
                return Err(format!("the tiga journal speaks of {shard:?}, not led here"));
            };
            let context = &self.context;
            let known =
                |ts: Timestamp, body: TxnBody| -> Result<(TxnId, Timestamp, Known), String> {
                    let txn = body.txn;
                    Ok((txn, ts, journaled_known(context, shard, body)?))
                };
            // The checkpoint's state, if the journal has one.
            let mut start = None;
            let mut checkpointed = Vec::new();
            let mut rest = None;
            if let Some(c) = recovered.checkpoint {
                let base = usize::try_from(c.base)
                    .map_err(|_| "the tiga checkpoint's base is past this machine's positions")?;
                for (txn, ts, body, state) in c.entries {
                    let known = body.map(|b| known(ts, b)).transpose()?.map(|(_, _, k)| k);
                    checkpointed.push((txn, ts, known, state));
                }
                // Those below the base are forgotten once decided and promised past, as
                // before the restart.
                let forgettable_max = self.context.limits.forgettable_max;
                let below = c.in_log.iter().map(|&(txn, ts)| (ts, txn)).take(forgettable_max);
                host.forgettable = below.collect();
                host.forgettable_overflowed = c.in_log.len() > forgettable_max;
                start = Some(CheckpointedLog {
                    base,
                    base_ts: c.base_ts,
                    below: c.in_log,
                    entries: checkpointed.iter().map(|&(txn, ts, ..)| (txn, ts)).collect(),
                    hashes: c.hashes,
                    stamps: (c.reads, c.writes, c.stamp_floor),
                });
                for &(node, incarnation, below) in &c.floors {
                    raise_floor(&mut self.decided_floors, (node, incarnation), below);
                }
                rest = Some((base, c.rows, c.answers, c.decided));
            }
            let log: Vec<(TxnId, Timestamp, Known)> = recovered
                .log
                .into_iter()
                .map(|(ts, body)| known(ts, body))
                .collect::<Result<_, _>>()?;
            let entries: Vec<(TxnId, Timestamp, &[Key], &[Key])> = log
                .iter()
                .map(|(txn, ts, k)| (*txn, *ts, &k.part.reads[..], &k.part.writes[..]))
                .collect();
            let (replica, hashes) = Replica::recovered_leader(shard, limits, start, &entries)
                .ok_or_else(|| {
                    format!("the tiga journal lists a transaction twice on {shard:?}")
                })?;
            host.replica = replica.with_detective(detective);
            if let Some((base, rows, answers, decided)) = rest {
                self.counts.resumed_from_checkpoint_total += 1;
                restore_checkpointed(host, checkpointed)?;
                host.finished = base;
                host.pruned = base;
                host.checkpointed = base;
                host.replicated = base;
                host.restore_rows = rows;
                for (txn, msg) in answers {
                    if host.answers.insert(txn, msg).is_none() {
                        host.answer_order.push_back(txn);
                    }
                }
                for (txn, d) in decided {
                    if d.settled {
                        host.settling.insert((d.ts, txn));
                    }
                    let others: BTreeSet<ShardId> = d.others.iter().copied().collect();
                    let shards_total = self.context.topology.shards;
                    if others.len() != d.others.len()
                        || others.contains(&host.shard)
                        || others.iter().any(|s| s.0 >= shards_total)
                    {
                        return Err(format!("the tiga checkpoint's {txn} names bad shards"));
                    }
                    let (ts, settled, own, all, inputs) = (d.ts, d.settled, d.own, d.all, d.inputs);
                    let feeds = d.feeds.into_iter().take(PIECES_MAX).collect();
                    let others = d.others;
                    let decided = Decided { ts, settled, own, all, inputs, feeds, others };
                    host.decided.insert(txn, decided);
                }
            }
            self.counts.replayed_total += log.len() as u64;
            for ((txn, ts, known), hash) in log.into_iter().zip(hashes) {
                host.waits.enqueue((ts, txn), &known.part.reads, &known.part.writes);
                host.queued.insert(txn, Queued { ts, hash, speculative: false });
                host.bodies.insert(txn, known);
            }
            for (txn, votes) in recovered.votes {
                for (from, (ok, outputs)) in votes {
                    deliver_vote(host, txn, from, PeerVote { ok, outputs });
                }
            }
            host.promised = recovered.promised;
            host.closed_sent = recovered.promised;
            if let Some(streams) = &mut host.streams {
                // Luigi: nothing is told below what was told, and every entry above it
                // counts as unreplicated until the followers' acknowledgements come.
                for (&worker, &ts) in &recovered.told {
                    streams.restore_told(worker, ts);
                }
                for &(txn, ts) in host.replica.log_prefix(usize::MAX) {
                    streams.restore_open(txn, ts);
                }
            }
            for (txn, (ts, body)) in recovered.proposals {
                let (_, _, known) = known(ts, body)?;
                let arriving = incoming(txn, ts, &known.shards, &known.part);
                host.bodies.insert(txn, known);
                host.journaled.insert(txn, ts);
                let actions = host.replica.restore_proposal(arriving, ts);
                if let Some(streams) = &mut host.streams {
                    streams.restore_held(txn, ts);
                }
                self.counts.restored_proposals_total += 1;
                self.restored.push((shard, actions));
            }
            host.quiet = true;
        }
        Ok(())
    }

    /// A restarted follower takes up what its journal holds of `shard`: the image of its
    /// executed prefix, installed as a state transfer is (its rows wait for the store's
    /// load), and the records after it, read back here and run when the node starts. One
    /// that was rejoining rejoins. Errors when the shard is led here, or when the image or a
    /// body does not hold together.
    fn resume_follower(
        &mut self,
        shard: ShardId,
        followed: FollowerRecovered,
    ) -> Result<(), String> {
        let context = &self.context;
        let Some(host) = self.hosted.get_mut(&shard).filter(|h| !h.replica.leads()) else {
            return Err(format!("the tiga journal follows {shard:?}, not followed here"));
        };
        if followed.joining {
            // It rejoins, as a follower restarted without a journal does.
            host.joining = Some(Joining::default());
            return Ok(());
        }
        host.joining = None;
        if !followed.image.is_empty() {
            let (floors, rows) = install_without_rows(context, host, followed.image)
                .map_err(|e| format!("the tiga journal's image of {shard:?}: {e}"))?;
            for (node, incarnation, floor) in floors {
                raise_floor(&mut self.decided_floors, (node, incarnation), floor);
            }
            host.restore_rows = rows;
        }
        let known = |body: TxnBody| journaled_known(context, shard, body);
        let mut events = Vec::with_capacity(followed.events.len());
        // Bounded by the journal.
        for event in followed.events {
            events.push(match event {
                FollowerEvent::Released(ts, hash, body) => {
                    Restored::Released(ts, hash, known(body)?)
                }
                FollowerEvent::Synced(at, entries) => {
                    let at = usize::try_from(at).map_err(|_| "a position past this machine's")?;
                    let entries = entries
                        .into_iter()
                        .map(|(txn, ts, body)| Ok((txn, ts, body.map(known).transpose()?)))
                        .collect::<Result<_, String>>()?;
                    Restored::Synced(at, entries)
                }
                FollowerEvent::Fetched(body) => Restored::Fetched(known(body)?),
                FollowerEvent::Outcome(outcome) => Restored::Outcome(outcome),
                FollowerEvent::Unlisted(through) => Restored::Unlisted(through),
            });
        }
        host.restore_events = events;
        host.quiet = true;
        self.counts.followers_resumed_total += 1;
        Ok(())
    }

    /// A restarted follower runs what it journaled after its image (quietly: the replies
    /// are kept to answer resends), as it did the first time.
    fn restore_follower(&mut self, shard: ShardId) {
        let (view, variant) = (self.view.global, self.variant);
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        let mut scratch = Outbox::new();
        // Bounded by the journal.
        for event in std::mem::take(&mut host.restore_events) {
            let mut slow = Vec::new();
            match event {
                Restored::Released(ts, hash, known) => {
                    let txn = known.body.txn;
                    let keys = known.part.log_keys();
                    host.bodies.insert(txn, known);
                    if host.replica.restore_released(txn, ts, keys) {
                        if let Some(hash) = hash {
                            let msg = TigaMsg::Fast {
                                view,
                                txn,
                                shard,
                                ts,
                                hash,
                                owd_ns: None,
                                result: None,
                            };
                            reply(host, txn, msg, &mut scratch);
                        }
                    }
                }
                Restored::Synced(at, entries) => {
                    let mut listed = Vec::with_capacity(entries.len());
                    for (txn, ts, known) in entries {
                        if let Some(known) = known {
                            host.bodies.entry(txn).or_insert(known);
                        }
                        listed.push((txn, ts));
                    }
                    let bodies = &host.bodies;
                    let keys_of = |txn| bodies.get(&txn).map(|k: &Known| k.part.log_keys());
                    slow = host.replica.on_sync(at, &listed, keys_of);
                }
                Restored::Fetched(known) => {
                    let txn = known.body.txn;
                    if host.replica.wants_body(txn) {
                        let keys = known.part.log_keys();
                        host.bodies.insert(txn, known);
                        slow = host.replica.on_body(txn, &keys);
                    }
                }
                Restored::Outcome(SyncOutcome { txn, ok, inputs }) => {
                    if host.replica.logged(txn) {
                        host.outcomes.insert(txn, (ok, inputs));
                    }
                }
                Restored::Unlisted(through) => {
                    host.tail_cut = host.tail_cut.max(through);
                    let dropped = host.replica.drop_unlisted(through);
                    host.unlisted.extend(dropped.into_iter().map(|(txn, _)| txn));
                }
            }
            for action in slow {
                match (action, variant) {
                    // Luigi followers answer their leader only (acknowledgements).
                    (Action::SlowReply { txn, ts }, Variant::Tiga) => {
                        let msg = slow_reply(view, host, txn, ts);
                        reply(host, txn, msg, &mut scratch);
                    }
                    (Action::Superseded { dropped }, _) => {
                        host.unlisted.extend(dropped.into_iter().map(|(txn, _)| txn));
                    }
                    _ => {}
                }
            }
        }
        debug_assert!(scratch.drain().next().is_none(), "a quiet replica sends nothing");
    }

    /// A restarted leader runs its journaled log again (replies recorded to answer resends,
    /// not sent; votes sent, as peers may wait for them), and proposes again what it had
    /// proposed. A restarted follower runs its journal's records again.
    fn replay(&mut self, now: Time, out: &mut Outbox<TigaMsg>) {
        // A checkpoint's rows go over the initial load, before anything runs.
        for host in self.hosted.values_mut() {
            for (key, chain) in std::mem::take(&mut host.restore_rows) {
                let versions = chain.into_iter().map(committed_version).collect();
                host.store.restore_chain(key, versions);
            }
        }
        for shard in self.hosted_shards.clone() {
            if self.hosted.get(&shard).is_some_and(|h| !h.replica.leads() && h.quiet) {
                self.restore_follower(shard);
            }
        }
        for (shard, actions) in std::mem::take(&mut self.restored) {
            self.act(now, shard, actions, None, out);
        }
        self.execute_all(now, out);
        for host in self.hosted.values_mut().filter(|h| h.quiet) {
            host.quiet = false;
        }
        self.release(now, out);
    }
}

impl TigaNode {
    fn started(&mut self, now: Time, out: &mut Outbox<TigaMsg>) {
        if !self.restored.is_empty() || self.hosted.values().any(|h| h.quiet) {
            self.replay(now, out);
        }
        // Leaders pace resends of votes and of the log (followers' share).
        if self.hosted.values().any(|h| h.replica.leads()) {
            self.pacing = true;
            self.timers.set(Purpose::Pace, self.pace_ns(), out);
        }
        let joining: Vec<ShardId> =
            self.hosted.values().filter(|h| h.joining.is_some()).map(|h| h.shard).collect();
        for shard in joining {
            self.ask_state(shard, out);
        }
        self.gather_after_restart(out);
        self.manager_started(now, out);
    }

    fn handle(&mut self, now: Time, from: NodeId, msg: TigaMsg, out: &mut Outbox<TigaMsg>) {
        if msg.view().is_some_and(|view| view != self.view.global) {
            self.counts.stale_view_total += 1;
            return;
        }
        match msg {
            TigaMsg::Txn(body) => self.on_body(now, from, *body, out),
            TigaMsg::Fast { txn, shard, ts, hash, owd_ns, result, .. } => {
                self.on_fast(from, (txn, shard, ts, hash), owd_ns, result, out);
            }
            TigaMsg::Slow { txn, shard, ts, owd_ns, .. } => {
                if let Some(owd_ns) = owd_ns {
                    self.tracker.observe(from, owd_ns);
                }
                if let Some(decided) = self.tracker.on_slow(from, txn, shard, ts) {
                    self.on_decided(decided, out);
                }
            }
            TigaMsg::Sync { shard, from: start, entries, outcomes, commit, base, .. } => {
                self.on_sync(now, from, shard, (start, entries, outcomes, commit, base), out);
            }
            TigaMsg::SyncAck { shard, start, synced, executed, fetch, .. } => {
                self.on_sync_ack(from, (shard, start), synced, executed, fetch, out);
            }
            TigaMsg::Watermark { shard, ts, .. } => self.on_watermark(from, shard, ts, out),
            TigaMsg::SnapRead(body) => self.on_snapshot_read(now, from, *body, out),
            TigaMsg::SnapReply { txn, shard, result, owd_ns, .. } => {
                self.tracker.observe(from, owd_ns);
                self.on_snapshot_reply(from, (txn, shard, result), out);
            }
            TigaMsg::Join { shard, start, transfer, next, whole, member_view, .. } => {
                self.clear_deposed(now, from, shard, member_view, out);
                self.on_join(from, (shard, start), (transfer, next), whole, out);
            }
            TigaMsg::State { shard, start, transfer, index, total, part, .. } => {
                let Some(host) = self.hosted.get(&shard) else { return };
                if start != follower_start(self.context.incarnation, host) {
                    return; // Cut for an earlier start of this replica.
                }
                self.on_state(now, from, shard, (transfer, index, total), part, out);
            }
            TigaMsg::Behind { shard, upto, .. } => self.on_behind(from, shard, upto, out),
            TigaMsg::Pull { shard, to, .. } => self.on_pull(from, shard, to, out),
            TigaMsg::Manager(msg) => self.on_manager(now, from, msg, out),
            TigaMsg::Pulled { shard, from: other, entries, .. } => {
                self.on_pulled(now, from, (shard, other), entries, out);
            }
            TigaMsg::Recover { shard, from: position, .. } => {
                self.on_recover(from, shard, position, out);
            }
            TigaMsg::Report { shard, base, synced, unsynced, bodies, outcomes, .. } => {
                let log = (base, synced, unsynced);
                self.on_report(now, from, shard, log, bodies, outcomes, out);
            }
            TigaMsg::Closed { shard, ts, upto, .. } => {
                let Some(host) = self.hosted.get_mut(&shard) else { return };
                if host.replica.leads() || host.leader != from || host.joining.is_some() {
                    self.counts.dropped_total += 1;
                    return;
                }
                let Ok(upto) = usize::try_from(upto) else { return };
                let last = host.closed.back().copied().unwrap_or((Timestamp::ZERO, 0));
                if ts > last.0 && upto >= last.1 {
                    host.closed.push_back((ts, upto));
                    if host.closed.len() > CLOSED_KEPT_MAX {
                        host.closed.pop_front();
                    }
                }
                self.drop_unlisted(shard, true);
                self.serve_snapshots(now, out);
            }
            TigaMsg::PeerClosed { shard, ts, .. } => {
                let leads_here = self.hosted.get(&shard).is_some_and(|h| h.replica.leads());
                if shard.0 >= self.context.topology.shards
                    || leads_here
                    || !self.is_leader_node(shard, from)
                {
                    self.counts.dropped_total += 1;
                    return;
                }
                let closed = self.peer_closed.entry(shard).or_insert(ts);
                *closed = (*closed).max(ts);
            }
            peer => self.on_peer(now, from, peer, out),
        }
    }

    fn timer(&mut self, now: Time, timer: TimerId, out: &mut Outbox<TigaMsg>) {
        let Some(purpose) = self.timers.take(timer) else { return };
        match purpose {
            Purpose::Release => {
                if self.release_at.is_some_and(|at| at <= now) {
                    self.release_at = None;
                }
                self.release(now, out);
            }
            Purpose::Resend(id, txn) => self.resend(now, id, txn, out),
            Purpose::Pace => {
                self.pace(now, out);
                self.timers.set(Purpose::Pace, self.pace_ns(), out);
            }
            Purpose::Join(shard) => {
                if let Some(joining) = self.hosted.get_mut(&shard).and_then(|h| h.joining.as_mut())
                {
                    joining.timer_set = false;
                    self.ask_state(shard, out);
                }
            }
            Purpose::Recover(shard) => self.on_recover_timer(now, shard, out),
            Purpose::Manage => self.manager_timer(now, out),
            Purpose::FetchBody(shard, txn, proposer) => {
                let Some(host) = self.hosted.get(&shard) else { return };
                let missing = !host.bodies.contains_key(&txn) && !host.replica.logged(txn);
                // One its coordinator decided since is refused, not fetched.
                if missing && !is_decided(&self.decided_floors, txn) {
                    out.send(proposer, TigaMsg::GetBody { view: self.view.global, txn });
                }
            }
        }
    }
}

impl Node for TigaNode {
    type Msg = TigaMsg;

    fn on_start(&mut self, now: Time, out: &mut Outbox<TigaMsg>) {
        self.step(out, |node, out| node.started(now, out));
    }

    fn on_message(&mut self, now: Time, from: NodeId, msg: TigaMsg, out: &mut Outbox<TigaMsg>) {
        self.step(out, |node, out| node.handle(now, from, msg, out));
    }

    fn on_timer(&mut self, now: Time, timer: TimerId, out: &mut Outbox<TigaMsg>) {
        self.step(out, |node, out| node.timer(now, timer, out));
    }

    fn on_persisted(&mut self, _now: Time, token: PersistToken, out: &mut Outbox<TigaMsg>) {
        if token.0 >= manage::MANAGER_TOKENS_FROM {
            self.manager_persisted(token);
            self.flush_manager(out);
            return;
        }
        for (hops, to, msg) in self.journal.persisted(token.0) {
            out.send_after(to, msg, hops);
        }
    }

    fn submit(&mut self, now: Time, request: ClientRequest, out: &mut Outbox<TigaMsg>) {
        self.step(out, |node, out| node.start(now, request, out));
    }

    fn on_control(&mut self, now: Time, control: Control, out: &mut Outbox<TigaMsg>) {
        let Control::View { global, local, detective } = control;
        let mode = if detective { Mode::Detective } else { Mode::Preventive };
        let view = View { global, local, mode };
        self.step(out, |node, out| {
            if node.install_view(now, view, out).is_err() {
                node.counts.views_refused_total += 1;
            }
        });
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let held = self.hosted.values().map(|h| h.replica.held() as u64).sum();
        let dropped: u64 = self.hosted.values().map(|h| h.replica.dropped_total()).sum();
        let unexecuted = self
            .hosted
            .values()
            .filter(|h| !h.replica.leads())
            .map(|h| (h.replica.log_len() - h.executed) as u64)
            .sum();
        let queued = self.hosted.values().map(|h| (h.queued.len() + h.pending.len()) as u64).sum();
        let versions = self.hosted.values().map(|h| h.store.version_count()).sum();
        let keys = self.hosted.values().map(|h| h.store.key_count() as u64).sum();
        let answers = self.hosted.values().map(|h| h.answers.len() as u64).sum();
        // Log entries held (past what every replica executed), followers' dropped
        // transactions still known as logged, and what still grows with the run: the
        // leaders' sets of logged transactions (one per entry) and multi-shard outcomes.
        let held_entries = |h: &Hosted| (h.replica.log_len() - h.replica.log_base()) as u64;
        let log_entries = self.hosted.values().map(held_entries).sum();
        let lingering = self.hosted.values().map(|h| h.replica.lingering() as u64).sum();
        let decided = self.hosted.values().map(|h| h.decided.len() as u64).sum();
        let logged = self.hosted.values().map(|h| h.replica.logged_count() as u64).sum();
        if self.variant == Variant::Luigi {
            let open = self.hosted.values().filter_map(|h| h.streams.as_ref()).map(|s| s.open());
            return [
                ("luigi_commits_total", self.counts.slow_total),
                ("luigi_resends_total", self.counts.resends_total),
                ("luigi_dropped_total", self.counts.dropped_total + dropped),
                ("luigi_vote_waits_total", self.counts.votes_waited_total),
                ("luigi_held", held),
                ("luigi_unexecuted", unexecuted),
                ("luigi_queued", queued),
                ("luigi_in_flight", self.requests.len() as u64),
                ("luigi_awaiting_watermark", self.awaiting.len() as u64),
                ("luigi_unreplicated", open.sum::<usize>() as u64),
                ("luigi_store_versions", versions),
                ("luigi_store_keys", keys),
                ("luigi_answers_kept", answers),
                ("luigi_log_entries", log_entries),
                ("luigi_log_lingering", lingering),
                ("luigi_stale_bodies_total", self.counts.stale_bodies_total),
                ("luigi_stale_votes_total", self.counts.stale_votes_total),
                ("luigi_refusals_sent_total", self.counts.refused_sent_total),
                ("luigi_refused_total", self.counts.refused_total),
                ("luigi_decided_kept", decided),
                ("luigi_logged_kept", logged),
                ("luigi_stale_view_total", self.counts.stale_view_total),
                ("luigi_contradicted_total", self.counts.contradicted_total),
                ("luigi_state_transfers_total", self.counts.transfers_total),
                ("luigi_rejoined_total", self.counts.rejoined_total),
                ("luigi_journal_records_total", self.journal.records_total),
                ("luigi_journal_sends_dropped_total", self.journal.dropped_total),
                ("luigi_journal_live_records", self.journal.live()),
                ("luigi_checkpoints_total", self.counts.checkpoints_total),
                ("luigi_resumed_from_checkpoint_total", self.counts.resumed_from_checkpoint_total),
                ("luigi_followers_resumed_total", self.counts.followers_resumed_total),
                ("luigi_checkpoints_put_off_total", self.counts.checkpoints_put_off_total),
                ("luigi_checkpoint_bytes_last", self.counts.checkpoint_bytes_last),
                ("luigi_journal_bytes_total", self.journal.bytes_total),
                ("luigi_replayed_total", self.counts.replayed_total),
                ("luigi_restored_proposals_total", self.counts.restored_proposals_total),
                ("luigi_followers_behind_total", self.counts.behind_total),
                ("luigi_went_behind_total", self.counts.went_behind_total),
                ("luigi_bodies_high_water", self.counts.bodies_high),
                ("luigi_views_installed_total", self.counts.views_installed_total),
                ("luigi_views_refused_total", self.counts.views_refused_total),
                ("luigi_views_led_total", self.counts.views_led_total),
                ("luigi_views_led_from_stash_total", self.counts.led_from_stash_total),
                ("luigi_views_resumed_total", self.counts.views_resumed_total),
                ("luigi_deposed_states_void_total", self.counts.deposed_void_total),
                ("luigi_view_changes_failed_total", self.counts.view_changes_failed_total),
                ("luigi_replicas_retired_total", self.counts.retired_total),
                ("luigi_reports_oversized_total", self.counts.reports_oversized_total),
            ]
            .into_iter()
            .chain(self.manager_counters())
            .collect();
        }
        vec![
            ("tiga_fast_commits_total", self.counts.fast_total),
            ("tiga_slow_commits_total", self.counts.slow_total),
            ("tiga_resends_total", self.counts.resends_total),
            ("tiga_dropped_total", self.counts.dropped_total + dropped),
            ("tiga_vote_waits_total", self.counts.votes_waited_total),
            ("tiga_held", held),
            ("tiga_unexecuted", unexecuted),
            ("tiga_queued", queued),
            ("tiga_in_flight", self.requests.len() as u64),
            ("tiga_fast_quorum_after_slow_total", self.tracker.fast_after_slow_total()),
            ("tiga_snapshot_reads_total", self.counts.snapshot_reads_total),
            ("tiga_snapshots_served_total", self.counts.snapshot_served_total),
            ("tiga_speculated_total", self.counts.speculated_total),
            ("tiga_speculations_kept_total", self.counts.speculations_kept_total),
            ("tiga_revoked_total", self.counts.revoked_total),
            ("tiga_speculations", self.hosted.values().map(|h| h.speculations.len() as u64).sum()),
            ("tiga_store_versions", versions),
            ("tiga_store_keys", keys),
            ("tiga_answers_kept", answers),
            ("tiga_log_entries", log_entries),
            ("tiga_log_lingering", lingering),
            ("tiga_stale_bodies_total", self.counts.stale_bodies_total),
            ("tiga_stale_votes_total", self.counts.stale_votes_total),
            ("tiga_refusals_sent_total", self.counts.refused_sent_total),
            ("tiga_refused_total", self.counts.refused_total),
            ("tiga_decided_kept", decided),
            ("tiga_logged_kept", logged),
            ("tiga_stale_view_total", self.counts.stale_view_total),
            ("tiga_contradicted_total", self.counts.contradicted_total),
            ("tiga_state_transfers_total", self.counts.transfers_total),
            ("tiga_rejoined_total", self.counts.rejoined_total),
            ("tiga_journal_records_total", self.journal.records_total),
            ("tiga_journal_sends_dropped_total", self.journal.dropped_total),
            ("tiga_journal_live_records", self.journal.live()),
            ("tiga_checkpoints_total", self.counts.checkpoints_total),
            ("tiga_resumed_from_checkpoint_total", self.counts.resumed_from_checkpoint_total),
            ("tiga_followers_resumed_total", self.counts.followers_resumed_total),
            ("tiga_checkpoints_put_off_total", self.counts.checkpoints_put_off_total),
            ("tiga_checkpoint_bytes_last", self.counts.checkpoint_bytes_last),
            ("tiga_journal_bytes_total", self.journal.bytes_total),
            ("tiga_replayed_total", self.counts.replayed_total),
            ("tiga_restored_proposals_total", self.counts.restored_proposals_total),
            ("tiga_followers_behind_total", self.counts.behind_total),
            ("tiga_went_behind_total", self.counts.went_behind_total),
            ("tiga_bodies_high_water", self.counts.bodies_high),
            ("tiga_tail_dropped_total", self.counts.tail_dropped_total),
            ("tiga_tail_superseded_total", self.counts.tail_superseded_total),
            ("tiga_tail_entries", self.hosted.values().map(|h| h.replica.tail_len() as u64).sum()),
            ("tiga_unlisted_kept", self.hosted.values().map(|h| h.unlisted.len() as u64).sum()),
            ("tiga_views_installed_total", self.counts.views_installed_total),
            ("tiga_views_refused_total", self.counts.views_refused_total),
            ("tiga_views_led_total", self.counts.views_led_total),
            ("tiga_views_led_from_stash_total", self.counts.led_from_stash_total),
            ("tiga_views_resumed_total", self.counts.views_resumed_total),
            ("tiga_deposed_states_void_total", self.counts.deposed_void_total),
            ("tiga_mode_changes_total", self.counts.mode_changes_total),
            ("tiga_view_changes_failed_total", self.counts.view_changes_failed_total),
            ("tiga_replicas_retired_total", self.counts.retired_total),
            ("tiga_reports_oversized_total", self.counts.reports_oversized_total),
        ]
        .into_iter()
        .chain(self.manager_counters())
        .collect()
    }
}

impl ProtocolNode for TigaNode {
    /// Followers execute the leader's log behind it.
    fn leads(&self, shard: ShardId) -> bool {
        self.hosted.get(&shard).is_some_and(|h| h.replica.leads())
    }

    /// A retired replica's store is no replica's any more (it may hold writes the rebuilt
    /// log dropped): left out until the node restarts.
    fn stores(&self) -> Vec<(ShardId, &MvccStore)> {
        self.hosted.iter().filter(|(_, h)| !h.retired).map(|(&s, h)| (s, &h.store)).collect()
    }

    fn stores_mut(&mut self) -> Vec<(ShardId, &mut MvccStore)> {
        self.hosted.iter_mut().map(|(&s, h)| (s, &mut h.store)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::topology::Topology;
    use meridian_core::txn::Datum;

    fn start(incarnation: u64) -> Start {
        Start { incarnation, rejoin: 0 }
    }

    fn txn(seq: u64) -> TxnId {
        TxnId { origin: NodeId(9), incarnation: 1, seq }
    }

    /// The global view number a run starts in ([`initial_view`] moves one past
    /// [`View::initial`]).
    const VIEW: u64 = 1;

    /// Node `id` of 3 shards × 3 replicas in 3 regions (nodes 0–8 replicas, 9–11
    /// coordinators), running bank.
    fn node(id: u32) -> TigaNode {
        node_of(id, Variant::Tiga).0
    }

    /// Node `id` of a 3 × 3 cluster running bank, as `variant`, with its workload.
    fn node_of(id: u32, variant: Variant) -> (TigaNode, Box<dyn meridian_workloads::Workload>) {
        node_in(id, variant, 3)
    }

    /// Node `id` of 3 shards × `replicas` in 3 regions running bank, as `variant`.
    fn node_in(
        id: u32,
        variant: Variant,
        replicas: u32,
    ) -> (TigaNode, Box<dyn meridian_workloads::Workload>) {
        let (context, workload) = context_in(id, replicas);
        let mut node = match variant {
            Variant::Tiga => TigaNode::new(context).unwrap(),
            Variant::Luigi => {
                let owd = crate::luigi::owd_settings(&context.options);
                TigaNode::luigi(context, owd).unwrap()
            }
        };
        for (shard, store) in node.stores_mut() {
            workload.load(shard, store);
        }
        (node, workload)
    }

    /// The context of node `id` of 3 shards × `replicas` in 3 regions running bank.
    fn context_in(id: u32, replicas: u32) -> (NodeContext, Box<dyn meridian_workloads::Workload>) {
        let options = meridian_workloads::WorkloadOptions {
            shards: 3,
            keys_per_shard: 8,
            ..meridian_workloads::WorkloadOptions::default()
        };
        let workload = meridian_workloads::build("bank", &options).unwrap();
        let regions = vec!["a".into(), "b".into(), "c".into()];
        let topology = Topology::standard(regions, 3, replicas).unwrap();
        let context = NodeContext::new(
            NodeId(id),
            Arc::new(topology),
            Arc::new(workload.registry()),
            Arc::new(workload.partitioner()),
            7,
            crate::Timing::for_network(meridian_core::time::NS_PER_MS),
        );
        (context, workload)
    }

    /// A leader restarts from a journal holding its log: it runs the log again when it
    /// starts (recording, not sending, its replies) and answers a resend from what it ran.
    /// The same journal on a node that does not lead the shard refuses to start, as does one
    /// that does not decode.
    #[test]
    fn a_leader_restarts_from_its_journal_and_a_journal_not_its_own_is_refused() {
        let mut coordinator = node(0);
        let mut out = Outbox::new();
        let bank = context_in(0, 3).1;
        let mut generator = bank.generator(0, 1);
        coordinator.submit(
            1_000,
            ClientRequest { id: RequestId(1), txn: generator.next(RequestId(1)) },
            &mut out,
        );
        let body = sent_body(&mut out).expect("a body went out");
        let shape = shape_of(&coordinator.context, &body.request, body.home).unwrap();
        let shard = *shape.parts.keys().next().unwrap();
        let leader = (0..9).find(|&n| node(n).leads(shard)).unwrap();
        let follower = (0..9).find(|&n| {
            let candidate = node(n);
            candidate.hosted.contains_key(&shard) && !candidate.leads(shard)
        });
        let mut journal: Journal<TigaMsg> = Journal::new(0..0);
        let ts = Timestamp(body.ts.0 + 5);
        journal.write(&Record::Logged { shard, ts, body: body.clone() });
        let (_, records) = journal.take_batch().unwrap();
        let durable: crate::Durable =
            records.into_iter().map(|r| (r.key, r.value.unwrap())).collect();
        let (shards, next) = super::super::journal::recover(&durable).unwrap();
        let restored =
            TigaNode::restored(context_in(follower.unwrap(), 3).0, shards.clone(), next.clone());
        assert!(restored.unwrap_err().contains("not led here"));
        let mut node = TigaNode::restored(context_in(leader, 3).0, shards, next).unwrap();
        for (shard, store) in node.stores_mut() {
            bank.load(shard, store);
        }
        let mut out = Outbox::new();
        node.on_start(2_000, &mut out);
        let counters = node.counters();
        let replayed = counters.iter().find(|(n, _)| *n == "tiga_replayed_total").unwrap().1;
        assert_eq!(replayed, 1);
        let sent_to_coordinator = out.drain().any(|e| {
            matches!(e, Effect::Send { to, msg: TigaMsg::Fast { .. } } if to == body.txn.origin)
        });
        assert!(!sent_to_coordinator, "replayed replies are recorded, not sent");
        let host = &node.hosted[&shard];
        assert!(host.replica.logged(body.txn));
        let answered = host.answers.contains_key(&body.txn) || host.pending.contains_key(&body.txn);
        assert!(answered, "the replay ran it");
        let mut garbage = durable.clone();
        garbage.insert(b"tiga/\0\0\0\0\0\0\0\x09".to_vec(), vec![0xff]);
        assert!(<crate::tiga::Tiga as crate::Protocol>::restore(context_in(leader, 3).0, &garbage)
            .is_err());
    }

    /// A luigi leader that restarted counts the entries of its log above the watermark it
    /// had told as unreplicated: a new transaction of the same worker, held above them, does
    /// not raise the watermark past them before the followers acknowledge.
    #[test]
    fn a_restarted_luigi_leader_tells_no_watermark_over_its_unreplicated_log() {
        let (mut coordinator, bank) = node_of(0, Variant::Luigi);
        let mut generator = bank.generator(0, 1);
        // Two single-shard transfers of this coordinator on one shard, the second stamped
        // later: the first is logged (never acknowledged), the second arrives anew.
        let mut bodies: Vec<TxnBody> = Vec::new();
        let mut shard = None;
        for id in 1..200u64 {
            let mut out = Outbox::new();
            let request = ClientRequest { id: RequestId(id), txn: generator.next(RequestId(id)) };
            coordinator.submit(id * 1_000_000, request, &mut out);
            let body = sent_body(&mut out).expect("a body went out");
            let shards = shape_of(&coordinator.context, &body.request, body.home).unwrap().shards();
            if shards.len() == 1 && shard.is_none_or(|s| s == shards[0]) {
                shard = Some(shards[0]);
                bodies.push(body);
                if bodies.len() == 2 {
                    break;
                }
            }
        }
        assert_eq!(bodies.len(), 2, "bank draws single-shard transfers");
        let shard = shard.expect("found");
        let leader = (0..9).find(|&n| node_of(n, Variant::Luigi).0.leads(shard)).unwrap();
        let mut journal: Journal<TigaMsg> = Journal::new(0..0);
        let logged_ts = bodies[0].ts;
        let worker = bodies[0].txn.origin;
        let told = Timestamp(logged_ts.0 - 10);
        journal.write(&Record::Told { shard, worker, ts: told });
        journal.write(&Record::Logged { shard, ts: logged_ts, body: bodies[0].clone() });
        let (_, records) = journal.take_batch().unwrap();
        let durable: crate::Durable =
            records.into_iter().map(|r| (r.key, r.value.unwrap())).collect();
        let (shards, next) = super::super::journal::recover(&durable).unwrap();
        let (context, _) = context_in(leader, 3);
        let owd = crate::luigi::owd_settings(&context.options);
        let mut node = TigaNode::luigi_restored(context, owd, shards, next).unwrap();
        for (shard, store) in node.stores_mut() {
            bank.load(shard, store);
        }
        let mut out = Outbox::new();
        // Late enough that the new transaction is due as it arrives.
        let now = 10 * meridian_core::time::NS_PER_S;
        node.on_start(now, &mut out);
        node.on_message(now, worker, TigaMsg::Txn(Box::new(bodies[1].clone())), &mut out);
        // Whatever waited for the journal goes out once it is durable.
        let effects = when_durable(&mut node, out.drain().collect());
        let told_again = effects.iter().filter_map(|e| match e {
            Effect::Send { msg: TigaMsg::Watermark { ts, .. }, to, .. } if *to == worker => {
                Some(*ts)
            }
            _ => None,
        });
        let told_again: Vec<Timestamp> = told_again.collect();
        // The new one is held and released (open), so the watermark rises to just below the
        // unreplicated entry, and no further.
        assert_eq!(told_again, vec![Timestamp(logged_ts.0 - 1)]);
    }

    /// Found by the `tiga_node` fuzz target: a reply naming a shard that does not exist, for
    /// a transaction in flight, indexed the view out of bounds. It is ignored now.
    #[test]
    fn a_reply_naming_a_shard_that_does_not_exist_is_ignored() {
        let mut coordinator = node(0);
        let mut out = Outbox::new();
        let options = meridian_workloads::WorkloadOptions {
            shards: 3,
            keys_per_shard: 8,
            ..meridian_workloads::WorkloadOptions::default()
        };
        let bank = meridian_workloads::build("bank", &options).unwrap();
        let txn_request = bank.generator(0, 1).next(RequestId(1));
        let request = ClientRequest { id: RequestId(1), txn: txn_request };
        coordinator.submit(1_000, request, &mut out);
        let sent = out.drain().find_map(|e| match e {
            meridian_core::node::Effect::Send { msg: TigaMsg::Txn(body), .. } => Some(body.txn),
            _ => None,
        });
        let txn = sent.expect("the body went out");
        for shard in [ShardId(3), ShardId(10_777), ShardId(u32::MAX)] {
            let reply = TigaMsg::Fast {
                view: VIEW,
                txn,
                shard,
                ts: Timestamp(5),
                hash: 0,
                owd_ns: Some(1),
                result: Some(ShardResult::Ran(Vec::new())),
            };
            coordinator.on_message(2_000, NodeId(1), reply, &mut out);
            let slow = TigaMsg::Slow { view: VIEW, txn, shard, ts: Timestamp(5), owd_ns: None };
            coordinator.on_message(2_000, NodeId(1), slow, &mut out);
        }
        assert_eq!(coordinator.requests.len(), 1, "still in flight, nothing decided");
    }

    /// A detective leader answers where it ran speculatively and, when the timestamp moved,
    /// again where the leaders agreed; a reordered copy of the earlier answer must not
    /// replace the later one at the coordinator, neither in the tally nor as the result.
    #[test]
    fn a_stale_leader_reply_never_replaces_its_latest() {
        use meridian_core::node::Effect;
        let mut coordinator = node(9);
        let mut out = Outbox::new();
        let (_, bank) = node_of(0, Variant::Tiga);
        let mut requests = bank.generator(0, 1);
        let topology = coordinator.context.topology.clone();
        // A transfer across shards.
        let (txn, shards) = (1..100)
            .find_map(|seq| {
                let request =
                    ClientRequest { id: RequestId(seq), txn: requests.next(RequestId(seq)) };
                coordinator.submit(1_000, request, &mut out);
                let to: BTreeSet<NodeId> = out
                    .drain()
                    .filter_map(|e| match e {
                        Effect::Send { to, msg: TigaMsg::Txn(_) } => Some(to),
                        _ => None,
                    })
                    .collect();
                let shards: Vec<ShardId> = (0..3)
                    .map(ShardId)
                    .filter(|&s| topology.shard_nodes(s).iter().any(|n| to.contains(n)))
                    .collect();
                let txn = coordinator.requests.get(&RequestId(seq)).map(|f| f.txn)?;
                (shards.len() > 1).then_some((txn, shards))
            })
            .expect("a cross-shard transfer");
        let fast = |ts: u64, result: Option<ShardResult>, shard| TigaMsg::Fast {
            view: VIEW,
            txn,
            shard,
            ts: Timestamp(ts),
            hash: 0,
            owd_ns: Some(1),
            result,
        };
        // A result for a shard the transaction does not touch is no participant's: ignored
        // (fuzzing found it kept, and the decision then reported with it).
        let outsider = (0..3).map(ShardId).find(|s| !shards.contains(s));
        if let Some(outsider) = outsider {
            let leader = coordinator.leader_of(outsider).unwrap();
            let stray = Some(ShardResult::UserAbort("not a participant".into()));
            coordinator.on_message(2_000, leader, fast(100, stray, outsider), &mut out);
        }
        for &shard in &shards {
            let leader = coordinator.leader_of(shard).unwrap();
            let ran = Some(ShardResult::Ran(Vec::new()));
            coordinator.on_message(2_000, leader, fast(200, ran, shard), &mut out);
            let stale = Some(ShardResult::UserAbort("ran at 100".into()));
            coordinator.on_message(2_000, leader, fast(100, stale, shard), &mut out);
            // A leader's reply without its result is malformed: ignored.
            coordinator.on_message(2_000, leader, fast(300, None, shard), &mut out);
            for follower in topology.shard_nodes(shard).into_iter().filter(|&n| n != leader) {
                coordinator.on_message(2_000, follower, fast(200, None, shard), &mut out);
            }
        }
        let outcome = out.drain().find_map(|e| match e {
            Effect::Reply { outcome, .. } => Some(outcome),
            _ => None,
        });
        let outcome = outcome.expect("decided");
        assert_eq!(outcome.result, TxnResult::Committed);
        assert_eq!(outcome.commit_ts, Some(Timestamp(200)));
        assert_eq!(outcome.path, CommitPath::Fast);
        assert!(outsider.is_some(), "a transfer touches two of the three shards");
    }

    /// End-of-run checks read the store of the node that says it leads a shard: exactly one
    /// per shard, the first view's leader.
    #[test]
    fn exactly_the_views_leader_says_it_leads_each_shard() {
        let nodes: Vec<TigaNode> = (0..9).map(node).collect();
        for shard in (0..3).map(ShardId) {
            let leaders: Vec<NodeId> =
                nodes.iter().filter(|n| n.leads(shard)).map(|n| n.context.id).collect();
            assert_eq!(leaders.len(), 1, "{shard:?}: {leaders:?}");
            assert_eq!(Some(leaders[0]), nodes[0].leader_of(shard));
        }
    }

    fn samples() -> Vec<TigaMsg> {
        let body = TxnBody {
            txn: txn(1),
            ts: Timestamp(5),
            sent_at: 1,
            request: TxnRequest {
                proc: meridian_core::txn::ProcId(0),
                args: vec![Datum::Uint(1), Datum::Int(-2)],
            },
            home: ShardId(0),
            decided_below: 0,
        };
        vec![
            TigaMsg::Txn(Box::new(body)),
            TigaMsg::Refused { view: VIEW, txn: txn(2), from: ShardId(1), to: ShardId(0) },
            TigaMsg::Fast {
                view: VIEW,
                txn: txn(1),
                shard: ShardId(0),
                ts: Timestamp(5),
                hash: 7,
                owd_ns: Some(3),
                result: Some(ShardResult::UserAbort("no".into())),
            },
            TigaMsg::Propose {
                view: VIEW,
                txn: txn(1),
                shards: vec![ShardId(0), ShardId(1)],
                from: ShardId(1),
                ts: Timestamp(5),
                answer: false,
            },
            TigaMsg::Vote {
                view: VIEW,
                txn: txn(1),
                from: ShardId(1),
                to: ShardId(0),
                ok: true,
                outputs: vec![(0, vec![Datum::Int(5)])],
                want_reply: true,
            },
            TigaMsg::Sync {
                view: VIEW,
                shard: ShardId(0),
                from: 0,
                entries: vec![(txn(1), Timestamp(5))],
                commit: 0,
                base: 0,
                outcomes: vec![SyncOutcome { txn: txn(1), ok: false, inputs: Vec::new() }],
            },
            TigaMsg::SyncAck {
                view: VIEW,
                shard: ShardId(0),
                start: Start::default(),
                synced: 1,
                executed: 1,
                fetch: vec![txn(1)],
            },
            TigaMsg::Watermark { view: VIEW, shard: ShardId(2), ts: Timestamp(9) },
            TigaMsg::SnapReply {
                view: VIEW,
                txn: txn(1),
                shard: ShardId(1),
                result: ShardResult::Ran(vec![(0, vec![Datum::Uint(3)])]),
                owd_ns: 4,
            },
            TigaMsg::Closed { view: VIEW, shard: ShardId(0), ts: Timestamp(8), upto: 4 },
            TigaMsg::PeerClosed { view: VIEW, shard: ShardId(2), ts: Timestamp(8) },
            TigaMsg::Behind { view: VIEW, shard: ShardId(1), upto: 17 },
            TigaMsg::Join {
                view: VIEW,
                shard: ShardId(0),
                start: start(2),
                transfer: 3,
                next: 1,
                whole: false,
                member_view: 0,
            },
            TigaMsg::State {
                view: VIEW,
                shard: ShardId(0),
                start: start(2),
                transfer: 3,
                index: 1,
                total: 3,
                part: StatePart::Rows(vec![(
                    Key::table(0).u64(1).build(),
                    vec![StateVersion { ts: Timestamp(4), writer: txn(1), value: Some(vec![7]) }],
                )]),
            },
            TigaMsg::State {
                view: VIEW,
                shard: ShardId(0),
                start: start(2),
                transfer: 3,
                index: 2,
                total: 3,
                part: StatePart::Ahead(vec![(txn(2), None), (txn(3), Some(Vec::new()))]),
            },
            TigaMsg::Recover { view: VIEW, shard: ShardId(0), from: 3 },
            TigaMsg::Report {
                view: VIEW,
                shard: ShardId(0),
                base: 2,
                synced: vec![(txn(1), Timestamp(5))],
                unsynced: vec![(txn(2), Timestamp(6))],
                bodies: Vec::new(),
                outcomes: vec![SyncOutcome { txn: txn(1), ok: true, inputs: Vec::new() }],
            },
            TigaMsg::AskVote { view: VIEW, txn: txn(1), from: ShardId(1), to: ShardId(0) },
            TigaMsg::Pull { view: VIEW, shard: ShardId(0), to: ShardId(1) },
            TigaMsg::Pulled {
                view: VIEW,
                shard: ShardId(0),
                from: ShardId(1),
                entries: vec![(txn(1), Timestamp(4))],
            },
        ]
    }

    /// A rejoining follower takes its leader's state transfer only whole and consistent:
    /// parts from another node, for another start of it, of another transfer or out of order
    /// are not taken, and a transfer whose parts do not hold together (an entry count that is
    /// not the prefix's, a key's versions out of order, a transaction listed twice) changes
    /// nothing and is dropped whole, for the retry timer to ask anew. A good one becomes its
    /// synced, executed log and its store.
    /// A follower of `shard` that restarted and waits for its leader's state transfer, the
    /// leader's node, and its own.
    fn joining_follower(shard: ShardId) -> (TigaNode, NodeId, NodeId) {
        let (probe, _) = node_in(0, Variant::Tiga, 3);
        let leader = probe.leader_of(shard).unwrap();
        let topology = probe.context.topology.clone();
        let id = topology.shard_nodes(shard).into_iter().find(|&n| n != leader).unwrap();
        let (mut follower, _) = node_in(id.0, Variant::Tiga, 3);
        follower.hosted.get_mut(&shard).unwrap().joining = Some(Joining::default());
        (follower, leader, id)
    }

    #[test]
    fn a_state_transfer_that_does_not_hold_together_changes_nothing() {
        use meridian_core::node::Effect;
        let shard = ShardId(0);
        let (mut follower, leader, id) = joining_follower(shard);
        let loaded = state(&follower);
        let key = follower.hosted[&shard].store.latest_values().next().unwrap().0.clone();
        let version = |ts: u64, value: u8| StateVersion {
            ts: Timestamp(ts),
            writer: txn(ts),
            value: Some(vec![value]),
        };
        let good = || {
            vec![
                StatePart::Head { base: 0, upto: 2, end: 3, floor: Timestamp(11), whole: false },
                StatePart::Entries(vec![(txn(10), Timestamp(10)), (txn(11), Timestamp(11))]),
                StatePart::Hashes(vec![(key.clone(), 5)]),
                StatePart::Rows(vec![(key.clone(), vec![version(10, 1), version(11, 2)])]),
                StatePart::Ahead(vec![(txn(12), None)]),
            ]
        };
        let mut out = Outbox::new();
        // Delivers the parts in `order` (by index).
        let deliver = |node: &mut TigaNode,
                       out: &mut Outbox<TigaMsg>,
                       (from, transfer, incarnation): (NodeId, u64, u64),
                       parts: Vec<StatePart>,
                       order: &[usize]| {
            let total = parts.len() as u32;
            for &index in order {
                let part = parts[index].clone();
                let index = index as u32;
                let start = start(incarnation);
                let msg = TigaMsg::State { view: VIEW, shard, start, transfer, index, total, part };
                node.on_message(1_000, from, msg, out);
            }
        };
        let send = |node: &mut TigaNode,
                    out: &mut Outbox<TigaMsg>,
                    sender: (NodeId, u64, u64),
                    parts: Vec<StatePart>| {
            let order: Vec<usize> = (0..parts.len()).collect();
            deliver(node, out, sender, parts, &order);
        };
        let mut bad = good();
        bad[1] = StatePart::Entries(vec![(txn(10), Timestamp(10))]);
        send(&mut follower, &mut out, (leader, 1, 0), bad);
        let mut bad = good();
        bad[3] = StatePart::Rows(vec![(key.clone(), vec![version(11, 2), version(10, 1)])]);
        send(&mut follower, &mut out, (leader, 2, 0), bad);
        let mut bad = good();
        bad[1] = StatePart::Entries(vec![(txn(10), Timestamp(10)), (txn(10), Timestamp(11))]);
        send(&mut follower, &mut out, (leader, 3, 0), bad);
        // A base past the prefix's end; a transaction both listed and lingering below the base.
        let mut bad = good();
        bad[0] = StatePart::Head { base: 3, upto: 2, end: 3, floor: Timestamp(11), whole: false };
        send(&mut follower, &mut out, (leader, 3, 0), bad);
        let mut bad = good();
        bad.insert(2, StatePart::Lingering(vec![txn(11)]));
        send(&mut follower, &mut out, (leader, 3, 0), bad);
        send(&mut follower, &mut out, (id, 4, 0), good()); // Not from the leader.
        send(&mut follower, &mut out, (leader, 7, 1), good()); // For another start.
                                                               // Out of order: what comes early waits for a request that asks for it again.
        deliver(&mut follower, &mut out, (leader, 5, 0), good(), &[0, 2, 1, 4, 3]);
        let host = &follower.hosted[&shard];
        assert!(host.joining.is_some(), "still joining");
        assert_eq!((host.replica.log_len(), host.executed), (0, 0));
        assert_eq!(state(&follower), loaded, "the store as loaded");
        assert_eq!(follower.counts.rejoined_total, 0);
        let asked = out
            .drain()
            .filter(|e| matches!(e, Effect::Send { msg: TigaMsg::Join { .. }, .. }))
            .count();
        assert_eq!(asked, 0, "a transfer that did not hold together is asked for by the timer");
        let joining = follower.hosted[&shard].joining.as_ref().unwrap();
        assert_eq!((joining.transfer, joining.parts.len()), (5, 2), "in order only: parts 0 and 1");
        send(&mut follower, &mut out, (leader, 6, 0), good());
        let host = &follower.hosted[&shard];
        assert!(host.joining.is_none());
        assert_eq!((host.replica.log_len(), host.executed), (2, 2));
        assert!(host.replica.logged(txn(11)) && host.ahead.contains_key(&txn(12)));
        let value = host.store.read_latest(&key).and_then(|v| v.value.clone());
        assert_eq!(value, Some(vec![2]));
        assert_eq!(follower.counts.rejoined_total, 1);
        // The installed state is checkpointed before the acknowledgement goes.
        let effects = out.drain().collect::<Vec<_>>();
        assert!(!effects
            .iter()
            .any(|e| matches!(e, Effect::Send { msg: TigaMsg::SyncAck { .. }, .. })));
        let acked = when_durable(&mut follower, effects).into_iter().any(|e| {
            matches!(e, Effect::Send { to, msg: TigaMsg::SyncAck { synced: 2, executed: 2, .. } }
                if to == leader)
        });
        assert!(acked, "it tells the leader where to resume");
    }

    /// Mutated and random byte streams of tiga's frames never panic the connection reader.
    #[test]
    fn mutated_and_random_tiga_streams_never_panic_the_reader() {
        meridian_core::testing::check_message_streams(
            samples(),
            12,
            3_000,
            "tiga-connection-property",
        );
    }

    /// A store's latest values, per hosted shard.
    type Image = Vec<(ShardId, Vec<(Key, Option<Vec<u8>>)>)>;

    fn state(node: &TigaNode) -> Image {
        node.stores()
            .into_iter()
            .map(|(s, store)| {
                (s, store.latest_values().map(|(k, v)| (k.clone(), v.value.clone())).collect())
            })
            .collect()
    }

    /// Piece 0 takes a number from a counter row on shard 0; piece 1 writes the row keyed by
    /// it, so its keys need its input. `args[0]` picks the guard piece 1's procedure names:
    /// 0 none, 1 the counter, 2 a key on shard 1, 3 no keys.
    #[derive(Debug)]
    struct Numbered;

    /// Ids below 100 live on shard 0, the rest on shard 1.
    fn numbered_key(id: u64) -> Key {
        Key::table(1).u64(id).build()
    }

    impl meridian_core::txn::Procedure for Numbered {
        fn name(&self) -> &'static str {
            "numbered"
        }
        fn plan(
            &self,
            _: &meridian_core::txn::Args,
            _: meridian_core::txn::PlanContext<'_>,
        ) -> Result<meridian_core::txn::Plan, ProcError> {
            let on0 = ShardTarget::Shard(ShardId(0));
            Ok(vec![
                meridian_core::txn::PieceSpec { target: on0, deps: vec![] },
                meridian_core::txn::PieceSpec { target: on0, deps: vec![0] },
            ])
        }
        fn keys(
            &self,
            piece: u32,
            _: &meridian_core::txn::Args,
            inputs: &[&PieceOutput],
        ) -> Result<KeySet, ProcError> {
            let counter = numbered_key(0);
            match (piece, inputs.first()) {
                (0, _) => Ok(KeySet {
                    reads: vec![counter.clone()],
                    writes: vec![counter],
                    scans: vec![],
                }),
                (1, Some(output)) => {
                    let n = output.first().and_then(Datum::as_uint).unwrap_or(0);
                    Ok(KeySet { reads: vec![], writes: vec![numbered_key(1 + n)], scans: vec![] })
                }
                _ => Err(ProcError::BadArgs("piece 1 needs piece 0's number".into())),
            }
        }
        fn execute(
            &self,
            _: u32,
            _: &meridian_core::txn::Args,
            _: &[&PieceOutput],
            _: &meridian_core::txn::Reads,
        ) -> Result<meridian_core::txn::PieceEffects, meridian_core::txn::UserAbort> {
            Ok(meridian_core::txn::PieceEffects::default())
        }
        fn guard(&self, piece: u32, args: &meridian_core::txn::Args) -> Option<Vec<Key>> {
            let choice = args.first().and_then(Datum::as_uint).unwrap_or(0);
            match (piece, choice) {
                (1, 1) => Some(vec![numbered_key(0)]),
                (1, 2) => Some(vec![numbered_key(150)]),
                (1, 3) => Some(vec![]),
                _ => None,
            }
        }
    }

    /// A piece whose keys need its input runs only where its procedure names keys on its
    /// shard guarding them; the transaction is then ordered as writing those keys.
    #[test]
    fn a_piece_keyed_by_its_input_runs_only_behind_a_guard_on_its_shard() {
        use meridian_core::txn::{PartitionRule, Partitioner, Registry, TxnRequest};
        let mut registry = Registry::default();
        let proc = registry.register(Arc::new(Numbered));
        let rule = PartitionRule::LeadingInt { base: 0, per_shard: 100 };
        let topology = Topology::standard(vec!["a".into()], 2, 1).unwrap();
        let context = NodeContext::new(
            NodeId(0),
            Arc::new(topology),
            Arc::new(registry),
            Arc::new(Partitioner::new(2, rule).unwrap()),
            7,
            crate::Timing::for_network(meridian_core::time::NS_PER_MS),
        );
        let request = |guard: u64| TxnRequest { proc, args: vec![Datum::Uint(guard)] };
        let refused = check_request(&context, &request(0)).unwrap_err();
        assert!(matches!(refused, ProcError::Unsupported(_)), "{refused}");
        assert!(refused.to_string().contains("names no keys guarding them"), "{refused}");
        for stray in [2, 3] {
            let broken = check_request(&context, &request(stray)).unwrap_err();
            assert!(broken.to_string().contains("keys on its shard 0"), "{broken}");
        }
        let shape = shape_of(&context, &request(1), ShardId(0)).unwrap();
        let part = &shape.parts[&ShardId(0)];
        assert_eq!(part.guarded, [1]);
        assert_eq!(part.writes, [numbered_key(0)], "the guard stands for the piece's keys");
        assert!(!part.declares(&numbered_key(1)));
    }

    /// Messages from the wrong senders, bodies that do not decode into a transaction, and
    /// shards outside the cluster change nothing at a leader and never panic it.
    #[test]
    fn hostile_messages_change_nothing() {
        // Node 0 hosts replica 0 of shard 0; the view puts every leader in region "a", where
        // replica 0 of shard 0 sits.
        let mut leader = node(0);
        assert!(leader.hosted[&ShardId(0)].replica.leads());
        let before = state(&leader);
        let mut out = Outbox::new();
        let stranger = NodeId(10);
        let bad_body = TxnBody {
            txn: txn(2),
            ts: Timestamp(5),
            sent_at: 1,
            request: TxnRequest {
                proc: meridian_core::txn::ProcId(77),
                args: vec![Datum::Uint(9); 9],
            },
            home: ShardId(0),
            decided_below: 0,
        };
        let garbage = TxnBody {
            request: TxnRequest {
                proc: meridian_core::txn::ProcId(0),
                args: vec![Datum::Bytes(vec![0xff; 40])],
            },
            ..bad_body.clone()
        };
        let hostile = [
            TigaMsg::Txn(Box::new(bad_body)),
            TigaMsg::Txn(Box::new(garbage)),
            TigaMsg::Propose {
                view: VIEW,
                txn: txn(3),
                shards: vec![ShardId(0), ShardId(200)],
                from: ShardId(200),
                ts: Timestamp(9),
                answer: false,
            },
            TigaMsg::Vote {
                view: VIEW,
                txn: txn(3),
                from: ShardId(1),
                to: ShardId(0),
                ok: false,
                outputs: vec![(7, Vec::new()); PIECES_MAX + 1],
                want_reply: true,
            },
            TigaMsg::Sync {
                view: VIEW,
                shard: ShardId(0),
                from: 0,
                entries: vec![(txn(4), Timestamp(1))],
                commit: 0,
                base: 0,
                outcomes: vec![SyncOutcome {
                    txn: txn(4),
                    ok: true,
                    inputs: vec![(0, vec![Datum::Bytes(vec![1; 3])])],
                }],
            },
            TigaMsg::SyncAck {
                view: VIEW,
                shard: ShardId(0),
                start: Start::default(),
                synced: u64::MAX,
                executed: u64::MAX,
                fetch: vec![txn(4)],
            },
            TigaMsg::GetBody { view: VIEW, txn: txn(5) },
            TigaMsg::Slow {
                view: VIEW,
                txn: txn(6),
                shard: ShardId(2),
                ts: Timestamp(1),
                owd_ns: None,
            },
            // A promise for another shard from a node that does not lead it, one for the
            // shard this node leads, and one for a shard that does not exist.
            TigaMsg::PeerClosed { view: VIEW, shard: ShardId(1), ts: Timestamp::MAX },
            TigaMsg::PeerClosed { view: VIEW, shard: ShardId(0), ts: Timestamp::MAX },
            TigaMsg::PeerClosed { view: VIEW, shard: ShardId(200), ts: Timestamp::MAX },
            // Refusals from a node that leads no shard named, and naming shards that do not
            // exist.
            TigaMsg::Refused { view: VIEW, txn: txn(7), from: ShardId(1), to: ShardId(0) },
            TigaMsg::Refused { view: VIEW, txn: txn(7), from: ShardId(300), to: ShardId(0) },
            TigaMsg::Refused { view: VIEW, txn: txn(7), from: ShardId(1), to: ShardId(300) },
            // View change: a report nobody asked for, from a node of no replica of the
            // shard; a request for a report, and one for a vote, from a node that leads
            // nothing.
            TigaMsg::Report {
                view: VIEW,
                shard: ShardId(0),
                base: 0,
                synced: vec![(txn(8), Timestamp(1))],
                unsynced: Vec::new(),
                bodies: Vec::new(),
                outcomes: Vec::new(),
            },
            TigaMsg::Recover { view: VIEW, shard: ShardId(0), from: 0 },
            TigaMsg::AskVote { view: VIEW, txn: txn(3), from: ShardId(1), to: ShardId(0) },
            TigaMsg::Pull { view: VIEW, shard: ShardId(1), to: ShardId(0) },
            TigaMsg::Pulled {
                view: VIEW,
                shard: ShardId(0),
                from: ShardId(1),
                entries: vec![(txn(3), Timestamp(4))],
            },
        ];
        for (i, msg) in hostile.into_iter().enumerate() {
            leader.on_message(1_000 + i as u64, stranger, msg, &mut out);
        }
        leader.on_timer(1_000_000_000, TimerId(999), &mut out);
        assert_eq!(state(&leader), before, "nothing written");
        let host = &leader.hosted[&ShardId(0)];
        assert_eq!(host.replica.held(), 0);
        assert!(host.bodies.is_empty() && host.early_votes.is_empty() && host.pending.is_empty());
        assert!(leader.peer_closed.is_empty(), "no promise taken from a stranger");
        let sends = out.drain().filter(|e| matches!(e, meridian_core::node::Effect::Send { .. }));
        assert_eq!(sends.count(), 0, "nothing answered to a stranger");
    }

    /// With five replicas (`f` = 2) an entry a follower and its leader synced may still be
    /// lost in a view change, so a follower executes its synced log only below the commit-point
    /// its leader tells it; with three, its own sync-point is enough.
    #[test]
    fn followers_execute_below_the_commit_point() {
        use meridian_core::node::Effect;
        let shard = ShardId(0);
        for replicas in [5, 3] {
            let (probe, bank) = node_in(0, Variant::Tiga, replicas);
            let leader = probe.leader_of(shard).unwrap();
            let topology = probe.context.topology.clone();
            let follower_id = topology.shard_nodes(shard).into_iter().find(|&n| n != leader);
            let (mut follower, _) = node_in(follower_id.unwrap().0, Variant::Tiga, replicas);
            let coordinator_id = topology.nodes.len() as u32 - 1;
            let (mut coordinator, _) = node_in(coordinator_id, Variant::Tiga, replicas);
            // Two transfers within shard 0, sent to the follower by their coordinator.
            let mut requests = bank.generator(0, 1);
            let mut out = Outbox::new();
            let mut bodies = Vec::new();
            for seq in 1..200 {
                let request =
                    ClientRequest { id: RequestId(seq), txn: requests.next(RequestId(seq)) };
                coordinator.submit(1_000, request, &mut out);
                let sent: Vec<(NodeId, TxnBody)> = out
                    .drain()
                    .filter_map(|e| match e {
                        Effect::Send { to, msg: TigaMsg::Txn(body) } => Some((to, *body)),
                        _ => None,
                    })
                    .collect();
                let only_shard_0 = sent.iter().all(|(to, _)| {
                    topology.nodes[to.0 as usize].replicas.iter().any(|r| r.shard == shard)
                });
                if only_shard_0 && bodies.len() < 2 {
                    bodies.push(sent[0].1.clone());
                }
            }
            assert_eq!(bodies.len(), 2, "two single-shard transfers");
            let coordinator_node = NodeId(coordinator_id);
            for body in &bodies {
                follower.on_message(
                    1_000,
                    coordinator_node,
                    TigaMsg::Txn(Box::new(body.clone())),
                    &mut out,
                );
            }
            let entries: Vec<(TxnId, Timestamp)> = bodies.iter().map(|b| (b.txn, b.ts)).collect();
            let sync = |commit| TigaMsg::Sync {
                base: 0,
                view: VIEW,
                shard,
                from: 0,
                entries: entries.clone(),
                commit,
                outcomes: Vec::new(),
            };
            follower.on_message(1_001, leader, sync(0), &mut out);
            let host = &follower.hosted[&shard];
            assert_eq!(host.replica.sync_point(), 2, "{replicas} replicas: both synced");
            let expected = if replicas == 5 { 0 } else { 2 };
            assert_eq!(host.executed, expected, "{replicas} replicas, commit-point 0");
            follower.on_message(1_002, leader, sync(1), &mut out);
            let expected = if replicas == 5 { 1 } else { 2 };
            assert_eq!(follower.hosted[&shard].executed, expected, "{replicas}: commit-point 1");
            follower.on_message(1_003, leader, sync(0), &mut out);
            assert_eq!(follower.hosted[&shard].executed, expected, "the commit-point only rises");
            follower.on_message(1_004, leader, sync(2), &mut out);
            assert_eq!(follower.hosted[&shard].executed, 2);
        }
    }

    /// A leader takes a follower's acknowledgements only from its latest start: while it sends
    /// a transfer to a start, an acknowledgement of another start (a late copy from before
    /// the restart, whose log the follower no longer holds) neither counts nor ends the
    /// transfer; one of the joining start ends it; a late copy of a request of a start that
    /// has joined, or of an earlier one, cuts no new image; a new start gets one.
    #[test]
    fn a_late_acknowledgement_of_a_previous_start_counts_for_nothing() {
        let shard = ShardId(0);
        let (probe, _) = node_in(0, Variant::Tiga, 3);
        let leader_id = probe.leader_of(shard).unwrap();
        let (mut leader, _) = node_in(leader_id.0, Variant::Tiga, 3);
        let follower = leader.hosted[&shard].followers[0];
        let mut out = Outbox::new();
        let join = TigaMsg::Join {
            view: VIEW,
            shard,
            start: start(2),
            transfer: 0,
            next: 0,
            whole: false,
            member_view: 0,
        };
        leader.on_message(1_000, follower, join.clone(), &mut out);
        assert_eq!(leader.counts.transfers_total, 1);
        let ack = |incarnation| TigaMsg::SyncAck {
            view: VIEW,
            shard,
            start: start(incarnation),
            synced: 0,
            executed: 0,
            fetch: Vec::new(),
        };
        leader.on_message(1_001, follower, ack(1), &mut out);
        assert!(leader.hosted[&shard].transfers.contains_key(&follower), "the transfer goes on");
        leader.on_message(1_002, follower, join.clone(), &mut out);
        assert_eq!(leader.counts.transfers_total, 1, "one image per start");
        leader.on_message(1_003, follower, ack(2), &mut out);
        let host = &leader.hosted[&shard];
        assert!(!host.transfers.contains_key(&follower), "installed: done");
        assert_eq!(host.joined[&follower], start(2));
        leader.on_message(1_004, follower, join, &mut out);
        assert_eq!(leader.counts.transfers_total, 1, "a late request of a start that joined");
        let older = TigaMsg::Join {
            view: VIEW,
            shard,
            start: start(1),
            transfer: 0,
            next: 0,
            whole: false,
            member_view: 0,
        };
        leader.on_message(1_005, follower, older, &mut out);
        assert_eq!(leader.counts.transfers_total, 1, "a late request of an earlier start");
        assert!(!leader.hosted[&shard].transfers.contains_key(&follower));
        let newer = TigaMsg::Join {
            view: VIEW,
            shard,
            start: start(3),
            transfer: 0,
            next: 0,
            whole: false,
            member_view: 0,
        };
        leader.on_message(1_006, follower, newer, &mut out);
        assert_eq!(leader.counts.transfers_total, 2, "a new start gets a new image");
        // The follower restarted again, from its journal: the acknowledgement of that later
        // start ends the transfer it no longer waits for, and counts.
        leader.on_message(1_007, follower, ack(4), &mut out);
        let host = &leader.hosted[&shard];
        assert!(!host.transfers.contains_key(&follower), "a later start needs no image");
        assert_eq!(host.joined[&follower], start(4));
    }

    /// A deposed leader's store may hold writes no log vouches for: it takes only an image
    /// whose rows carry every key of the leader's store, and that image replaces its store
    /// whole (a key only it wrote is gone, a key only it overwrote is back at the load's
    /// value). An image of the keys written since the load is refused and changes nothing.
    /// Installed, the replica takes part again and drops the report it froze.
    #[test]
    fn a_deposed_leaders_store_is_replaced_by_a_whole_image_only() {
        let shard = ShardId(0);
        let (probe, _) = node_in(0, Variant::Tiga, 3);
        let leader_id = probe.leader_of(shard).unwrap();
        let (mut leader, _) = node_in(leader_id.0, Variant::Tiga, 3);
        let deposed_id = leader.hosted[&shard].followers[0];
        let (mut deposed, _) = node_in(deposed_id.0, Variant::Tiga, 3);
        let key = |k: u64| Key::table(0).u64(k).build();
        let value = |v: u8| vec![v];
        let written = |store: &mut MvccStore, k: u64, ts: u64, v: u8, writer: TxnId| {
            let state = VersionState::Committed;
            store.write(key(k), Timestamp(ts), Some(value(v)), writer, state).unwrap();
        };
        for node in [&mut leader, &mut deposed] {
            let store = &mut node.hosted.get_mut(&shard).unwrap().store;
            for k in 1..=3 {
                store.load(key(k), value(0));
            }
        }
        written(&mut leader.hosted.get_mut(&shard).unwrap().store, 1, 5, 1, txn(1));
        let host = deposed.hosted.get_mut(&shard).unwrap();
        written(&mut host.store, 2, 7, 2, txn(2));
        written(&mut host.store, 9, 8, 9, txn(3));
        host.retired = true;
        host.joining = Some(Joining::default());
        host.frozen = Some(Box::new(view_change::freeze(host)));
        let floors = BTreeMap::new();
        let since_load = state_image(&leader.hosted[&shard], &floors, false).unwrap();
        let whole = state_image(&leader.hosted[&shard], &floors, true).unwrap();
        let rows = |parts: &[StatePart]| -> usize {
            parts.iter().map(|p| if let StatePart::Rows(r) = p { r.len() } else { 0 }).sum()
        };
        let keys = leader.hosted[&shard].store.key_count();
        assert!(keys >= 3);
        assert_eq!((rows(&since_load), rows(&whole)), (1, keys), "written since the load, all");
        let context = deposed.context.clone();
        let host = deposed.hosted.get_mut(&shard).unwrap();
        assert!(install(&context, host, since_load).is_err());
        assert!(host.retired && host.joining.is_some());
        assert_eq!(host.store.read_latest(&key(9)).map(|v| v.ts), Some(Timestamp(8)));
        install(&context, host, whole).unwrap();
        assert!(!host.retired && host.joining.is_none() && host.frozen.is_none());
        let latest = |store: &MvccStore, k: u64| store.read_latest(&key(k)).cloned();
        for k in [1, 2, 3, 9] {
            let (mine, theirs) = (latest(&host.store, k), latest(&leader.hosted[&shard].store, k));
            assert_eq!(mine, theirs, "key {k}");
        }
        assert_eq!(latest(&host.store, 2).unwrap().value, Some(value(0)), "back at the load");
        assert!(latest(&host.store, 9).is_none(), "a key only it wrote is gone");
    }

    /// The first transaction body among what `out` holds (draining it).
    fn sent_body(out: &mut Outbox<TigaMsg>) -> Option<TxnBody> {
        out.drain().find_map(|e| match e {
            Effect::Send { msg: TigaMsg::Txn(body), .. } => Some(*body),
            _ => None,
        })
    }

    type Step<'a> = &'a dyn Fn(&mut TigaNode, &mut Outbox<TigaMsg>);

    /// Runs `f` on a node, makes its persists durable in `disk` and returns what it sent.
    fn step(node: &mut TigaNode, disk: &mut crate::Durable, f: Step<'_>) -> Vec<(NodeId, TigaMsg)> {
        let mut out = Outbox::new();
        f(node, &mut out);
        let mut sent = Vec::new();
        let mut effects: VecDeque<Effect<TigaMsg>> = out.drain().collect();
        while let Some(effect) = effects.pop_front() {
            match effect {
                Effect::Persist { token, records, .. } => {
                    for r in records {
                        match r.value {
                            Some(value) => disk.insert(r.key, value),
                            None => disk.remove(&r.key),
                        };
                    }
                    let mut out = Outbox::new();
                    node.on_persisted(0, token, &mut out);
                    effects.extend(out.drain());
                }
                Effect::Send { to, msg } => sent.push((to, msg)),
                _ => {}
            }
        }
        sent
    }

    /// The delay samples a follower's replies carry: its first reply for a transaction
    /// carries how long the coordinator's copy took to arrive, a reply repeated for a resend
    /// carries the resent copy's delay, and a copy that came from elsewhere than the
    /// coordinator (a peer answering a fetch) carries none.
    #[test]
    fn a_followers_replies_carry_one_delay_sample_per_copy_from_the_coordinator() {
        let mut coordinator = node(0);
        let bank = context_in(0, 3).1;
        let mut generator = bank.generator(0, 1);
        let mut out = Outbox::new();
        let request = ClientRequest { id: RequestId(1), txn: generator.next(RequestId(1)) };
        coordinator.submit(1_000, request, &mut out);
        let body = sent_body(&mut out).expect("a body went out");
        let txn = body.txn;
        let shape = shape_of(&coordinator.context, &body.request, body.home).unwrap();
        let shard = *shape.parts.keys().next().unwrap();
        let (probe, _) = node_in(0, Variant::Tiga, 3);
        let leader = probe.leader_of(shard).unwrap();
        let id = probe.context.topology.shard_nodes(shard).into_iter().find(|&n| n != leader);
        // Delivers `body` from `from` at `now`, completes the persists, returns the delays
        // the replies to the coordinator carried.
        let deliver = |node: &mut TigaNode, from: NodeId, now: Time| {
            let arrive = TigaMsg::Txn(Box::new(body.clone()));
            let mut disk = crate::Durable::new();
            let sent =
                step(node, &mut disk, &|n, out| n.on_message(now, from, arrive.clone(), out));
            let delays = sent.into_iter().filter(|(to, _)| *to == txn.origin);
            delays
                .filter_map(|(_, msg)| match msg {
                    TigaMsg::Fast { owd_ns, .. } | TigaMsg::Slow { owd_ns, .. } => Some(owd_ns),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        let (mut follower, _) = node_in(id.unwrap().0, Variant::Tiga, 3);
        let now = body.ts.0 + 1_000_000;
        assert_eq!(deliver(&mut follower, txn.origin, now), [Some(now - body.sent_at)]);
        let later = now + 7_000_000;
        let resent = deliver(&mut follower, txn.origin, later);
        assert_eq!(resent, [Some(later - body.sent_at)], "the resent copy's own delay");
        // The same body from the shard's leader (a fetch answered): no sample.
        let (mut other, _) = node_in(id.unwrap().0, Variant::Tiga, 3);
        assert_eq!(deliver(&mut other, leader, now), [None]);
    }

    /// A follower restarted from its journal takes up what it vouched for: its tail, the
    /// entries its leader listed since, and the outcome of a multi-shard entry that it heard
    /// while the entry was still in its tail, before a checkpoint and before the leader
    /// listed it, also when it had dropped the entry from its tail at a leader's promise in
    /// between (a checkpoint once kept only the outcomes of listed entries, and an outcome
    /// already in memory was not journaled again: the restarted follower, which had
    /// acknowledged executing the entry, waited for ever for an outcome its leader would not
    /// send again). It runs the entry again and ends where it was, without a transfer.
    #[test]
    fn a_follower_restarts_from_its_journal_with_the_outcomes_it_heard_early() {
        // A multi-shard transfer from the coordinator at node 0.
        let mut coordinator = node(0);
        let bank = context_in(0, 3).1;
        let mut generator = bank.generator(0, 1);
        let mut body = None;
        for id in 1..200 {
            let mut out = Outbox::new();
            let request = ClientRequest { id: RequestId(id), txn: generator.next(RequestId(id)) };
            coordinator.submit(1_000, request, &mut out);
            let Some(sent) = sent_body(&mut out) else { continue };
            let shape = shape_of(&coordinator.context, &sent.request, sent.home).unwrap();
            if shape.parts.len() > 1 {
                body = Some(sent);
                break;
            }
        }
        let body = body.expect("a multi-shard transfer");
        let txn = body.txn;
        let shape = shape_of(&coordinator.context, &body.request, body.home).unwrap();
        let shard = *shape.parts.keys().next().unwrap();
        let (probe, _) = node_in(0, Variant::Tiga, 3);
        let leader = probe.leader_of(shard).unwrap();
        let id = probe.context.topology.shard_nodes(shard).into_iter().find(|&n| n != leader);
        for unlisted in [false, true] {
            let (mut follower, _) = node_in(id.unwrap().0, Variant::Tiga, 3);
            let mut disk = crate::Durable::new();
            let now = body.ts.0 + 1_000_000;
            let arrive = TigaMsg::Txn(Box::new(body.clone()));
            let sent = step(&mut follower, &mut disk, &|n, out| {
                n.on_message(now, txn.origin, arrive.clone(), out)
            });
            let fast =
                sent.iter().any(|(_, m)| matches!(m, TigaMsg::Fast { txn: t, .. } if *t == txn));
            assert!(fast, "released into the tail: {sent:?}");
            let ts = follower.hosted[&shard].replica.tail()[0].1;
            let outcome = SyncOutcome { txn, ok: true, inputs: Vec::new() };
            let sync = |entries: Vec<(TxnId, Timestamp)>| TigaMsg::Sync {
                view: VIEW,
                shard,
                from: 0,
                entries,
                outcomes: vec![outcome.clone()],
                commit: 0,
                base: 0,
            };
            // The outcome comes before the entry is listed; a checkpoint follows.
            step(&mut follower, &mut disk, &|n, out| {
                n.on_message(now, leader, sync(Vec::new()), out)
            });
            assert!(follower.hosted[&shard].outcomes.contains_key(&txn));
            if unlisted {
                // The leader promises its log lists nothing more at or below the entry's
                // timestamp: the follower drops the entry from its tail (the leader will list it
                // later, at the same timestamp here for simplicity).
                let closed = TigaMsg::Closed { view: VIEW, shard, ts, upto: 0 };
                step(&mut follower, &mut disk, &|n, out| {
                    n.on_message(now, leader, closed.clone(), out)
                });
                assert!(follower.hosted[&shard].replica.tail().is_empty(), "dropped");
            }
            follower.checkpoint_wanted = true;
            step(&mut follower, &mut disk, &|n, out| {
                n.on_message(now, leader, sync(Vec::new()), out)
            });
            assert_eq!(follower.counts.checkpoints_total, 1);
            // Listed and executed.
            step(&mut follower, &mut disk, &|n, out| {
                n.on_message(now, leader, sync(vec![(txn, ts)]), out)
            });
            let executed = follower.hosted[&shard].executed;
            assert_eq!(executed, 1, "executed with the outcome heard early");
            let rows = |node: &TigaNode| {
                let store = &node.hosted[&shard].store;
                store_rows(store, store.written_keys()).collect::<Vec<_>>()
            };
            let before = rows(&follower);
            // The restart.
            let (shards, seqs) = super::super::journal::recover(&disk).unwrap();
            let mut context = context_in(follower.context.id.0, 3).0;
            context.incarnation = 1;
            let mut again = TigaNode::restored(context, shards, seqs).unwrap();
            for (shard, store) in again.stores_mut() {
                bank.load(shard, store);
            }
            step(&mut again, &mut disk, &|n, out| n.on_start(now, out));
            let host = &again.hosted[&shard];
            assert!(host.joining.is_none(), "no state transfer");
            assert_eq!((host.executed, host.replica.sync_point()), (1, 1));
            assert_eq!(rows(&again), before, "the store it had");
            assert_eq!(again.counts.followers_resumed_total, 1);
        }
    }

    /// The followers of a shard checkpoint at different entries of the cycle (a checkpoint
    /// holds back a node's sends until it is durable: together they stalled both commit
    /// paths), a cycle's `replicas`th apart, counting from the leader.
    #[test]
    fn followers_of_a_shard_checkpoint_at_different_entries() {
        let shard = ShardId(0);
        let (probe, _) = node_in(0, Variant::Tiga, 3);
        let leader = probe.leader_of(shard).unwrap();
        let mut offsets: Vec<usize> = probe
            .context
            .topology
            .shard_nodes(shard)
            .into_iter()
            .filter(|&n| n != leader)
            .map(|n| node_in(n.0, Variant::Tiga, 3).0.checkpoint_offset(shard, 300))
            .collect();
        offsets.sort_unstable();
        assert_eq!(offsets, [100, 200]);
        assert_eq!(node_in(leader.0, Variant::Tiga, 3).0.checkpoint_offset(shard, 300), 0);
    }

    /// A restarted leader's transfer ids start above every id its earlier starts gave: a
    /// follower that had begun taking an image from the earlier start must not put its
    /// parts together with the new start's (swarm seed 9935 of `bank` found that when ids
    /// restarted at 1).
    #[test]
    fn a_restarted_leaders_transfer_ids_start_above_its_earlier_starts() {
        let shard = ShardId(0);
        let (probe, _) = node_in(0, Variant::Tiga, 3);
        let leader_id = probe.leader_of(shard).unwrap();
        let mut ids = Vec::new();
        for incarnation in [0, 1] {
            let (mut context, workload) = context_in(leader_id.0, 3);
            context.incarnation = incarnation;
            let mut leader = TigaNode::new(context).unwrap();
            for (shard, store) in leader.stores_mut() {
                workload.load(shard, store);
            }
            let follower = leader.hosted[&shard].followers[0];
            let mut out = Outbox::new();
            let join = TigaMsg::Join {
                view: VIEW,
                shard,
                start: start(2),
                transfer: 0,
                next: 0,
                whole: false,
                member_view: 0,
            };
            leader.on_message(1_000, follower, join, &mut out);
            ids.push(leader.hosted[&shard].transfers[&follower].id);
        }
        assert!(ids[1] > ids[0] + u64::from(u32::MAX), "{ids:?}");
    }

    /// A transfer from a leader whose log no longer starts at 0: the follower's log counts
    /// from the leader's base, the transactions below it that the leader listed still count
    /// as logged (a resend finds them), the leader's decided floors are taken up (a late copy
    /// of a body below one is dropped), and every key counts as released up to the floor.
    #[test]
    fn a_transfer_from_a_dropped_log_keeps_positions_and_what_was_logged() {
        let shard = ShardId(0);
        let (mut follower, leader, _) = joining_follower(shard);
        let parts = vec![
            StatePart::Head { base: 5, upto: 7, end: 7, floor: Timestamp(70), whole: false },
            StatePart::Entries(vec![(txn(60), Timestamp(60)), (txn(70), Timestamp(70))]),
            StatePart::Lingering(vec![txn(3)]),
            StatePart::Decided(vec![(NodeId(9), 1, 50)]),
        ];
        let total = parts.len() as u32;
        let mut out = Outbox::new();
        for (index, part) in parts.into_iter().enumerate() {
            let (start, index) = (start(0), index as u32);
            let msg = TigaMsg::State { view: VIEW, shard, start, transfer: 1, index, total, part };
            follower.on_message(1_000, leader, msg, &mut out);
        }
        let host = &follower.hosted[&shard];
        assert!(host.joining.is_none(), "installed");
        assert_eq!((host.replica.log_base(), host.replica.log_len(), host.executed), (5, 7, 7));
        assert!(host.replica.logged(txn(3)) && host.replica.logged(txn(70)));
        assert!(!host.replica.logged(txn(4)));
        assert!(is_decided(&follower.decided_floors, txn(49)));
        assert!(!is_decided(&follower.decided_floors, txn(50)));
    }

    /// A leader whose log starts past 0 never syncs a follower from below its base: a stale
    /// acknowledgement (an old sync-point, overtaken) must not make it send nothing for good
    /// (swarm seed 892 of `tpcc`: the follower missed the run's last entries).
    #[test]
    fn a_stale_acknowledgement_below_the_base_still_gets_the_log() {
        use meridian_core::node::Effect;
        let shard = ShardId(0);
        let (probe, _) = node_in(0, Variant::Tiga, 3);
        let (mut leader, _) = node_in(probe.leader_of(shard).unwrap().0, Variant::Tiga, 3);
        let key = Key::table(0).u64(1).build();
        let keys = [key];
        let log: Vec<(TxnId, Timestamp, &[Key], &[Key])> =
            (1..=6).map(|i| (txn(i), Timestamp(i * 10), &keys[..], &keys[..])).collect();
        let limits = replica_limits(3);
        let (mut replica, _) = Replica::recovered_leader(shard, limits, None, &log).unwrap();
        replica.truncate_leader_log(4);
        let host = leader.hosted.get_mut(&shard).unwrap();
        host.replica = replica;
        host.finished = 6;
        host.pruned = 4;
        let follower = host.followers[0];
        // It executed 4 (past the base), but the latest acknowledgement says synced 1.
        host.acks.insert(follower, (1, 4));
        host.sent_to.insert(follower, 1);
        let mut out = Outbox::new();
        leader.sync_followers(shard, true, &mut out);
        let syncs: Vec<(u64, usize)> = out
            .drain()
            .filter_map(|e| match e {
                Effect::Send { to, msg: TigaMsg::Sync { from, entries, .. } } if to == follower => {
                    Some((from, entries.len()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(syncs, [(4, 2)], "the entries from the base on");
    }

    /// A follower whose acknowledgement trails what its leader pruned is told so (with the
    /// pruned position) and sent no log; it drops its log and asks for a transfer under its
    /// next start (same incarnation, one more rejoin), which the leader serves, while a late
    /// acknowledgement of the earlier start neither ends that transfer nor counts. Word of
    /// being behind from anyone but the leader changes nothing; a follower that is not behind
    /// (the leader had not heard how far it got) answers with its position instead.
    #[test]
    fn a_follower_too_far_behind_drops_its_log_and_rejoins_under_its_next_start() {
        use meridian_core::node::Effect;
        let shard = ShardId(0);
        let (probe, _) = node_in(0, Variant::Tiga, 3);
        let leader_id = probe.leader_of(shard).unwrap();
        let (mut leader, _) = node_in(leader_id.0, Variant::Tiga, 3);
        let follower_id = leader.hosted[&shard].followers[0];
        let (mut follower, _) = node_in(follower_id.0, Variant::Tiga, 3);
        let other = leader.hosted[&shard].followers[1];
        let first = follower_start(0, &follower.hosted[&shard]);
        assert_eq!(first, start(0));
        let ack = |start, executed| TigaMsg::SyncAck {
            view: VIEW,
            shard,
            start,
            synced: executed,
            executed,
            fetch: Vec::new(),
        };
        let sent = |out: &mut Outbox<TigaMsg>| -> Vec<(NodeId, TigaMsg)> {
            out.drain()
                .filter_map(|e| match e {
                    Effect::Send { to, msg } => Some((to, msg)),
                    _ => None,
                })
                .collect()
        };
        let mut out = Outbox::new();
        leader.on_message(1_000, follower_id, ack(first, 0), &mut out);
        assert_eq!(leader.counts.behind_total, 0, "nothing pruned: caught up");
        // (An acknowledgement counts at most the leader's log: none here, so the pruned
        // position is set by hand.)
        leader.hosted.get_mut(&shard).unwrap().pruned = 20;
        leader.on_message(1_001, follower_id, ack(first, 9), &mut out);
        assert_eq!(leader.counts.behind_total, 1);
        let behind: Vec<TigaMsg> = sent(&mut out)
            .into_iter()
            .filter(|(to, m)| *to == follower_id && matches!(m, TigaMsg::Behind { .. }))
            .map(|(_, m)| m)
            .collect();
        assert_eq!(behind, [TigaMsg::Behind { view: VIEW, shard, upto: 20 }]);
        // No log goes to a follower behind, only the word again at each pace.
        leader.sync_followers(shard, true, &mut out);
        let to_follower: Vec<TigaMsg> = sent(&mut out)
            .into_iter()
            .filter(|(to, _)| *to == follower_id)
            .map(|(_, m)| m)
            .collect();
        assert_eq!(to_follower, behind);
        // A follower not behind says how far it got.
        let late = TigaMsg::Behind { view: VIEW, shard, upto: 0 };
        follower.on_message(1_002, leader_id, late, &mut out);
        let acks = sent(&mut out);
        assert!(matches!(acks.as_slice(), [(to, TigaMsg::SyncAck { .. })] if *to == leader_id));
        assert_eq!(follower.counts.went_behind_total, 0);
        // Only the leader's word counts.
        follower.on_message(1_002, other, behind[0].clone(), &mut out);
        assert_eq!((follower.counts.went_behind_total, follower.counts.dropped_total), (0, 1));
        assert!(follower.hosted[&shard].joining.is_none());
        follower.on_message(1_003, leader_id, behind[0].clone(), &mut out);
        let host = &follower.hosted[&shard];
        assert!(host.joining.is_some() && host.replica.log_len() == 0 && host.executed == 0);
        let next = Start { incarnation: 0, rejoin: 1 };
        assert_eq!(follower_start(0, host), next);
        // It journals that it rejoins before it asks.
        let joins: Vec<TigaMsg> = when_durable(&mut follower, out.drain().collect())
            .into_iter()
            .filter_map(|e| match e {
                Effect::Send { to, msg } => Some((to, msg)),
                _ => None,
            })
            .filter(|(to, m)| *to == leader_id && matches!(m, TigaMsg::Join { .. }))
            .map(|(_, m)| m)
            .collect();
        assert!(
            matches!(joins.as_slice(), [TigaMsg::Join { start, transfer: 0, next: 0, .. }] if *start == next),
            "{joins:?}"
        );
        // A repeat while it rejoins changes nothing.
        follower.on_message(1_004, leader_id, behind[0].clone(), &mut out);
        assert_eq!(follower.counts.went_behind_total, 1);
        assert_eq!(follower_start(0, &follower.hosted[&shard]), next);
        // The leader cuts an image for the next start; the earlier start's late
        // acknowledgement neither ends the transfer nor draws another word.
        leader.on_message(1_005, follower_id, joins[0].clone(), &mut out);
        assert_eq!(leader.counts.transfers_total, 1);
        let words = leader.counts.behind_total;
        leader.on_message(1_006, follower_id, ack(first, 30), &mut out);
        let host = &leader.hosted[&shard];
        assert_eq!(host.transfers[&follower_id].start, next, "the transfer goes on");
        assert_eq!(host.acks[&follower_id].0, 0, "a joining start counts no log");
        assert_eq!(leader.counts.behind_total, words);
    }

    /// Every replica's message carries its sender's view; a node drops and counts one of
    /// another view, earlier or later, before looking at it. A coordinator's body holds in
    /// any view.
    #[test]
    fn messages_of_another_view_are_dropped_and_counted() {
        let shard = ShardId(0);
        let leader = node(0).leader_of(shard).unwrap();
        let replicas = node(0).context.topology.shard_nodes(shard);
        let follower_id = replicas.into_iter().find(|&n| n != leader).unwrap();
        let mut follower = node(follower_id.0);
        assert_eq!(follower.view.global, VIEW);
        let sync = |view| TigaMsg::Sync {
            view,
            shard,
            from: 0,
            entries: vec![(txn(1), Timestamp(5))],
            commit: 0,
            base: 0,
            outcomes: Vec::new(),
        };
        let mut out = Outbox::new();
        for view in [VIEW - 1, VIEW + 1, u64::MAX] {
            follower.on_message(10, leader, sync(view), &mut out);
        }
        assert_eq!(follower.counts.stale_view_total, 3);
        assert!(follower.counters().contains(&("tiga_stale_view_total", 3)));
        assert_eq!(follower.hosted[&shard].replica.log_len(), 0, "no stale entry logged");
        assert!(out.is_empty(), "nothing answered");
        follower.on_message(10, leader, sync(VIEW), &mut out);
        assert_eq!(follower.hosted[&shard].replica.log_len(), 1, "the view's own sync is taken");
        assert_eq!(follower.counts.stale_view_total, 3);
        assert!(samples()
            .iter()
            .all(|m| m.view().is_none() == matches!(m, TigaMsg::Txn(_) | TigaMsg::SnapRead(_))));
    }

    /// A view change at a node: a view not past the node's, of another shard count, or
    /// changing the agreement mode is refused and changes nothing. In the next view, the
    /// follower that leads shard 0 now asks its shard's other replicas for their reports,
    /// takes a report from a replica of the shard only (never twice, never from a stranger),
    /// and leads the rebuilt log once it holds `f + 1`; the other follower rejoins (its log
    /// frozen for the report) and answers the new leader's request, no one else's.
    /// The view manager's messages are taken only from where they may come: a view from a
    /// member of the manager's group, of the cluster's shard count and past the node's own;
    /// a heartbeat at a member, from a node of the cluster, naming only shards the sender
    /// hosts. Anything else changes nothing and is counted.
    #[test]
    fn manager_messages_are_taken_only_from_members_and_checked() {
        use crate::tiga::manager::{manager_members, ManagerMsg, ViewRecord};
        let counter = |n: &TigaNode, name: &str| {
            n.counters().into_iter().find(|(k, _)| *k == name).map_or(0, |(_, v)| v)
        };
        let probe = node(0);
        let members = manager_members(&probe.context.topology, &probe.view);
        assert_eq!(members.len(), 3);
        let outsider = (0..9).map(NodeId).find(|n| !members.contains(n)).unwrap();
        let receiver = (0..9).map(NodeId).find(|n| !members.contains(n) && *n != outsider);
        let mut n = node(receiver.unwrap().0);
        n.host_manager(&BTreeMap::new()).unwrap();
        let mut next = ViewRecord::of(&n.view);
        next.global += 1;
        next.local[1] += 1;
        let mut out = Outbox::new();
        let mut send = |n: &mut TigaNode, from: NodeId, msg: ManagerMsg| {
            n.on_message(0, from, TigaMsg::Manager(msg), &mut out);
        };
        send(&mut n, outsider, ManagerMsg::View(next.clone()));
        let mut short = next.clone();
        short.local.pop();
        send(&mut n, members[0], ManagerMsg::View(short));
        assert_eq!(n.view_number(), VIEW, "nothing installed");
        assert_eq!(counter(&n, "tiga_manager_foreign_total"), 2);
        // A heartbeat at a node outside the group.
        let beat = (0, 1);
        let (stashed, delays) = (Vec::new(), Vec::new());
        send(
            &mut n,
            outsider,
            ManagerMsg::Heartbeat { view: VIEW, unable: Vec::new(), stashed, beat, delays },
        );
        assert_eq!(counter(&n, "tiga_manager_foreign_total"), 3);
        // The member's view is taken.
        send(&mut n, members[1], ManagerMsg::View(next.clone()));
        assert_eq!(n.view_number(), VIEW + 1);
        assert_eq!(counter(&n, "tiga_views_installed_total"), 1);
        send(&mut n, members[1], ManagerMsg::View(next));
        assert_eq!(counter(&n, "tiga_views_installed_total"), 1, "a repeat is ignored");
        assert_eq!(counter(&n, "tiga_views_refused_total"), 0);
        // At a member: a heartbeat naming a shard its sender hosts no replica of.
        let mut m = node(members[0].0);
        m.host_manager(&BTreeMap::new()).unwrap();
        let sender = outsider;
        let hosted: Vec<ShardId> = (0..3)
            .map(ShardId)
            .filter(|&s| m.context.topology.shard_nodes(s).contains(&sender))
            .collect();
        let foreign = (0..3).map(ShardId).find(|s| !hosted.contains(s)).unwrap();
        let mut out = Outbox::new();
        let beat_with = |unable, stashed, count| {
            let beat = (0, count);
            let delays = Vec::new();
            TigaMsg::Manager(ManagerMsg::Heartbeat { view: VIEW, unable, stashed, beat, delays })
        };
        let beat = |unable, count| beat_with(unable, Vec::new(), count);
        m.on_message(0, sender, beat(vec![foreign], 1), &mut out);
        m.on_message(0, NodeId(99), beat(Vec::new(), 1), &mut out);
        // A shard it could lead as a last resort is one it says it cannot lead otherwise.
        m.on_message(0, sender, beat_with(Vec::new(), vec![hosted[0]], 1), &mut out);
        assert_eq!(counter(&m, "tiga_manager_foreign_total"), 3);
        m.on_message(0, sender, beat(hosted.clone(), 2), &mut out);
        assert_eq!(counter(&m, "tiga_manager_foreign_total"), 3, "a well-formed heartbeat");
        let unable = |m: &TigaNode| m.manager.as_ref().unwrap().unable_of(sender);
        assert_eq!(unable(&m), hosted);
        // A late copy of an older heartbeat changes nothing; a newer one does.
        m.on_message(0, sender, beat(Vec::new(), 1), &mut out);
        assert_eq!(unable(&m), hosted);
        m.on_message(0, sender, beat(Vec::new(), 3), &mut out);
        assert!(unable(&m).is_empty());
        // Measured delays name server nodes only, at most one entry per server; probes come
        // from other server nodes only. None of these changes anything.
        let reporting = |delays: Vec<(NodeId, i64)>, count| {
            let (unable, stashed, beat) = (Vec::new(), Vec::new(), (0, count));
            TigaMsg::Manager(ManagerMsg::Heartbeat { view: VIEW, unable, stashed, beat, delays })
        };
        let probe = || TigaMsg::Manager(ManagerMsg::Probe { sent_at: 0 });
        m.on_message(0, sender, reporting(vec![(NodeId(99), 5)], 4), &mut out);
        // Two entries for one node (within the count of servers), then more entries than
        // there are servers.
        m.on_message(0, sender, reporting(vec![(members[1], 5), (members[1], 6)], 5), &mut out);
        let flood = (0..10).map(|i| (NodeId(i % 9), 5)).collect();
        m.on_message(0, sender, reporting(flood, 5), &mut out);
        m.on_message(0, NodeId(99), probe(), &mut out);
        m.on_message(0, members[0], probe(), &mut out);
        assert_eq!(counter(&m, "tiga_manager_foreign_total"), 8);
        let between = |m: &TigaNode, a, b| m.manager.as_ref().unwrap().measured_between(a, b);
        assert_eq!(between(&m, members[1], sender), None);
        // Well-formed reports: the delay from members[1] to the sender as the sender saw it,
        // and back.
        m.on_message(0, sender, reporting(vec![(members[1], 7_000)], 6), &mut out);
        let back = TigaMsg::Manager(ManagerMsg::Heartbeat {
            view: VIEW,
            unable: Vec::new(),
            stashed: Vec::new(),
            beat: (0, 1),
            delays: vec![(sender, 3_000)],
        });
        m.on_message(0, members[1], back, &mut out);
        assert_eq!(between(&m, members[1], sender), Some(5_000));
        assert_eq!(counter(&m, "tiga_manager_foreign_total"), 8);
        // A probe from a server is a sample at the receiver (it reports from three on).
        for at in [10, 20, 30] {
            m.on_message(
                at + 4_000,
                sender,
                TigaMsg::Manager(ManagerMsg::Probe { sent_at: at }),
                &mut out,
            );
        }
        assert_eq!(m.manager.as_ref().unwrap().probe_report(), vec![(sender, 4_000)]);
        assert_eq!(counter(&m, "tiga_manager_foreign_total"), 8);
        assert!(m.manager.as_ref().unwrap().is_member());
        // A member restarted without its group's records (nothing kept across restarts)
        // sits the group out: with its votes forgotten it could elect a second leader.
        let (mut context, _) = context_in(members[0].0, 3);
        context.incarnation = 1;
        let mut amnesiac = TigaNode::new(context).unwrap();
        amnesiac.host_manager(&BTreeMap::new()).unwrap();
        assert!(!amnesiac.manager.as_ref().unwrap().is_member());
    }

    /// Luigi's coordinator at a view change (issue 13): a transaction every leader answered
    /// and that waits for its watermark starts over in the new view: resent to the new
    /// leader, its old result and the old leader's watermark forgotten. The old leader's
    /// word counts for nothing now (a reply of the new view from it either); the new
    /// leader's result at another timestamp and its watermark commit the transaction.
    #[test]
    fn a_luigi_coordinator_starts_over_with_the_new_leader_at_a_view_change() {
        use meridian_core::node::Effect;
        let (mut coordinator, workload) = node_of(9, Variant::Luigi);
        let shard = ShardId(0);
        let mut generator = workload.generator(0, 0);
        let request = (0..1_000)
            .map(|i| generator.next(RequestId(i)))
            .find(|r| shape_of(&coordinator.context, r, shard).unwrap().shards() == [shard])
            .expect("a single-shard transfer on shard 0");
        let mut out = Outbox::new();
        coordinator.submit(1_000, ClientRequest { id: RequestId(1), txn: request }, &mut out);
        let old_leader = coordinator.leader_of(shard).unwrap();
        let txn = out
            .drain()
            .find_map(|e| match e {
                Effect::Send { to, msg: TigaMsg::Txn(body), .. } if to == old_leader => {
                    Some(body.txn)
                }
                _ => None,
            })
            .expect("sent to the leader");
        let fast = |view: u64, ts: u64| TigaMsg::Fast {
            view,
            txn,
            shard,
            ts: Timestamp(ts),
            hash: 0,
            owd_ns: Some(1),
            result: Some(ShardResult::Ran(Vec::new())),
        };
        coordinator.on_message(2_000, old_leader, fast(VIEW, 500), &mut out);
        assert_eq!(coordinator.awaiting.len(), 1, "answered, waiting for the watermark");
        let mut next = coordinator.view.clone();
        next.global += 1;
        next.local[0] += 1;
        let new_leader = leader_node(&coordinator.context, &next, shard).unwrap();
        assert_ne!(new_leader, old_leader);
        coordinator.install_view(3_000, next.clone(), &mut out).unwrap();
        assert!(coordinator.awaiting.is_empty() && !coordinator.watermarks.contains_key(&shard));
        let flight = coordinator.requests.values().next().expect("still in flight");
        assert_eq!(flight.to, vec![new_leader], "resent to the new leader");
        // The old leader's watermark of the old view, and its reply in the new one: nothing.
        let old_mark = TigaMsg::Watermark { view: VIEW, shard, ts: Timestamp(10_000) };
        coordinator.on_message(4_000, old_leader, old_mark, &mut out);
        coordinator.on_message(4_000, old_leader, fast(next.global, 500), &mut out);
        let mark = TigaMsg::Watermark { view: next.global, shard, ts: Timestamp(10_000) };
        coordinator.on_message(4_000, old_leader, mark.clone(), &mut out);
        assert!(coordinator.awaiting.is_empty() && coordinator.watermarks.is_empty());
        assert_eq!(coordinator.requests.len(), 1);
        // The new leader ran the resend at 700 and covers it.
        coordinator.on_message(5_000, new_leader, fast(next.global, 700), &mut out);
        assert_eq!(coordinator.awaiting.len(), 1);
        coordinator.on_message(5_000, new_leader, mark, &mut out);
        assert!(coordinator.requests.is_empty(), "committed");
        let committed = out.drain().any(|e| {
            matches!(e, Effect::Reply { outcome, .. } if outcome.result == TxnResult::Committed)
        });
        assert!(committed);
    }

    /// A view of the other agreement mode switches every replica of a tiga node at once (a
    /// leader that kept its shard speculates from then on), kept states included, and is
    /// journaled with its mode; luigi refuses a detective view and changes nothing.
    #[test]
    fn a_view_of_another_mode_switches_every_replica_and_luigi_refuses_detective() {
        let shard = ShardId(0);
        let probe = node(0);
        let leader = probe.leader_of(shard).unwrap();
        assert_eq!(probe.view.mode, Mode::Preventive);
        let mut next = probe.view.clone();
        next.global += 1;
        next.mode = Mode::Detective;
        let mut l = node(leader.0);
        assert!(!l.hosted[&shard].replica.detective());
        let mut out = Outbox::new();
        l.install_view(0, next.clone(), &mut out).unwrap();
        assert!(l.hosted.values().all(|h| h.replica.detective()));
        assert!(l.hosted[&shard].replica.leads(), "the same leader");
        assert!(l.counters().contains(&("tiga_mode_changes_total", 1)));
        let (_, records) = l.journal.take_batch().expect("journaled");
        let journaled = records.iter().any(|r| {
            let record = r.value.as_deref().and_then(|v| postcard::from_bytes(v).ok());
            matches!(record, Some(Record::View { detective: true, .. }))
        });
        assert!(journaled, "the view is journaled with its mode");
        // And back.
        let mut back = next.clone();
        back.global += 1;
        back.mode = Mode::Preventive;
        l.install_view(0, back, &mut out).unwrap();
        assert!(l.hosted.values().all(|h| !h.replica.detective()));
        let (mut luigi, _) = node_of(leader.0, Variant::Luigi);
        let before = luigi.view.clone();
        assert!(luigi.install_view(0, next, &mut out).is_err());
        assert_eq!(luigi.view, before);
    }

    #[test]
    fn a_view_change_goes_forward_only_and_takes_reports_from_the_shards_replicas() {
        let control = |v: &View| Control::View {
            global: v.global,
            local: v.local.clone(),
            detective: v.mode == Mode::Detective,
        };
        let shard = ShardId(0);
        let probe = node(0);
        let view = probe.view.clone();
        let replicas = probe.context.topology.shard_nodes(shard);
        let old_leader = probe.leader_of(shard).unwrap();
        let mut next = view.clone();
        next.global += 1;
        next.local[0] += 1;
        let new_leader =
            leader_node(&probe.context, &next, shard).expect("a leader in the next view");
        assert_ne!(new_leader, old_leader);
        let other = *replicas.iter().find(|&&n| n != old_leader && n != new_leader).unwrap();
        let (mut leader, mut follower) = (node(new_leader.0), node(other.0));
        let mut out = Outbox::new();
        // Refused: not past the view, another shard count, no mode decided.
        let mut short = next.clone();
        short.local.pop();
        let mut undecided = next.clone();
        undecided.mode = Mode::Auto;
        for bad in [view.clone(), short, undecided] {
            assert!(leader.install_view(0, bad, &mut out).is_err());
        }
        assert_eq!(leader.view, view, "nothing changed");
        assert!(out.is_empty());
        // The new leader asks the others for reports.
        leader.install_view(0, next.clone(), &mut out).unwrap();
        let asked: Vec<NodeId> =
            out.drain()
                .filter_map(|e| match e {
                    Effect::Send {
                        to, msg: TigaMsg::Recover { shard: s, from: 0, .. }, ..
                    } if s == shard => Some(to),
                    _ => None,
                })
                .collect();
        assert_eq!(asked.len(), 2, "{asked:?}");
        assert!(asked.contains(&other) && asked.contains(&old_leader));
        assert!(leader.hosted[&shard].recovering.is_some() && !leader.leads(shard));
        // The other follower rejoins, and answers the new leader only.
        follower.on_control(10, control(&next), &mut out);
        assert!(
            follower.hosted[&shard].joining.is_some() && follower.hosted[&shard].frozen.is_some()
        );
        let effects = out.drain().collect();
        when_durable(&mut follower, effects);
        let recover = TigaMsg::Recover { view: next.global, shard, from: 0 };
        follower.on_message(11, NodeId(10), recover.clone(), &mut out);
        follower.on_message(11, old_leader, recover.clone(), &mut out);
        let effects = out.drain().collect();
        let sent = when_durable(&mut follower, effects)
            .iter()
            .filter(|e| matches!(e, Effect::Send { .. }))
            .count();
        assert_eq!(sent, 0, "a request from a node that does not lead the shard: silence");
        follower.on_message(11, new_leader, recover, &mut out);
        let effects = out.drain().collect();
        let reports: Vec<TigaMsg> = when_durable(&mut follower, effects)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Send { to, msg, .. } if to == new_leader => Some(msg),
                _ => None,
            })
            .collect();
        assert!(matches!(reports[..], [TigaMsg::Report { .. }]), "{reports:?}");
        // The report from a stranger is dropped; the follower's is taken, and with f + 1 = 2
        // reports (its own included) the new leader leads the rebuilt (empty) log.
        let dropped = leader.counts.dropped_total;
        leader.on_message(12, NodeId(10), reports[0].clone(), &mut out);
        assert_eq!(leader.counts.dropped_total, dropped + 1);
        assert!(!leader.leads(shard));
        leader.on_message(12, other, reports[0].clone(), &mut out);
        assert!(!leader.leads(shard), "waits for the other shards' leaders");
        for peer in [ShardId(1), ShardId(2)] {
            let node = leader_node(&probe.context, &next, peer).unwrap();
            let pulled = TigaMsg::Pulled { view: next.global, shard, from: peer, entries: vec![] };
            // From a node that does not lead the shard: dropped.
            leader.on_message(12, NodeId(10), pulled.clone(), &mut out);
            leader.on_message(12, node, pulled, &mut out);
        }
        assert!(leader.leads(shard), "leads the rebuilt log");
        assert_eq!(leader.counts.views_led_total, 1);
        assert!(leader.hosted[&shard].recovering.is_none());
        assert_eq!(leader.hosted[&shard].followers.len(), 2);
        // A late copy of the report changes nothing.
        leader.on_message(13, other, reports[0].clone(), &mut out);
        assert_eq!(leader.counts.views_led_total, 1);
    }

    /// A follower a view change sends to rejoin keeps the state it dropped until a transfer
    /// is in. Chosen to lead before that, it takes that state up again and gathers reports
    /// like any follower chosen to lead (the stall of a shard whose other replicas hold no
    /// log). A replica chosen while it rejoined without such state never led: it stays
    /// rejoining, and when the view moves on it rejoins from the next leader instead of
    /// retiring as a deposed leader would (its empty "log" must never count as a report).
    #[test]
    fn a_follower_sent_to_rejoin_can_lead_from_what_it_dropped_and_one_that_never_led_rejoins() {
        let shard = ShardId(0);
        let probe = node(0);
        let step = |v: &View| {
            let mut next = v.clone();
            next.global += 1;
            next.local[0] += 1;
            next
        };
        let (v1, v2) = (step(&probe.view), step(&step(&probe.view)));
        let (lead1, lead2) = (
            leader_node(&probe.context, &v1, shard).unwrap(),
            leader_node(&probe.context, &v2, shard).unwrap(),
        );
        let old_leader = probe.leader_of(shard).unwrap();
        assert!(lead1 != lead2 && lead2 != old_leader && lead1 != old_leader);
        let recovers = |node: &mut TigaNode, out: &mut Outbox<TigaMsg>| -> Vec<NodeId> {
            let effects = out.drain().collect();
            when_durable(node, effects)
                .into_iter()
                .filter_map(|e| match e {
                    Effect::Send { to, msg: TigaMsg::Recover { .. }, .. } => Some(to),
                    _ => None,
                })
                .collect()
        };
        let mut out = Outbox::new();
        // Sent to rejoin from `lead1`: its log dropped, the state kept.
        let mut b = node(lead2.0);
        b.install_view(0, v1.clone(), &mut out).unwrap();
        assert!(recovers(&mut b, &mut out).is_empty());
        let host = &b.hosted[&shard];
        assert!(host.joining.is_some() && host.stashed.is_some() && host.frozen.is_some());
        // Chosen to lead before any transfer: it takes the state up and asks for reports.
        b.install_view(0, v2.clone(), &mut out).unwrap();
        let asked = recovers(&mut b, &mut out);
        assert_eq!(asked.len(), 2, "{asked:?}");
        let host = &b.hosted[&shard];
        assert!(host.joining.is_none() && host.stashed.is_none() && host.recovering.is_some());
        assert!(!host.retired);
        assert!(b.counters().contains(&("tiga_views_led_from_stash_total", 1)));
        // A replica rejoining since its restart holds no such state: chosen, it stays
        // rejoining; moved on from, it rejoins from the next leader and does not retire.
        let mut a = node(lead1.0);
        assert!(a.drop_log_to_rejoin(shard, false, &mut out));
        out.drain().for_each(drop);
        a.install_view(0, v1.clone(), &mut out).unwrap();
        assert!(recovers(&mut a, &mut out).is_empty(), "no log to lead with");
        assert!(a.hosted[&shard].joining.is_some() && a.hosted[&shard].frozen.is_none());
        a.install_view(0, v2.clone(), &mut out).unwrap();
        let effects = out.drain().collect();
        let joins: Vec<NodeId> = when_durable(&mut a, effects)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Send { to, msg: TigaMsg::Join { .. }, .. } => Some(to),
                _ => None,
            })
            .collect();
        let host = &a.hosted[&shard];
        assert!(!host.retired && host.joining.is_some() && host.frozen.is_none());
        assert_eq!(joins, vec![lead2], "asks the next leader for its state");
        assert!(a.counters().contains(&("tiga_replicas_retired_total", 0)));
        // Nor does a report answer for it.
        a.on_message(1, lead2, TigaMsg::Recover { view: v2.global, shard, from: 0 }, &mut out);
        let effects = out.drain().collect();
        assert!(when_durable(&mut a, effects)
            .iter()
            .all(|e| !matches!(e, Effect::Send { msg: TigaMsg::Report { .. }, .. })));
    }

    /// A deposed leader keeps the state it led with. Chosen again while the other replicas
    /// hold no log (both rejoining since before it was deposed), it does not lead at once,
    /// nor say it cannot: it leads on from that state once every other replica's `Join`
    /// says it held the log in no view after the one this node led in, with its store as it
    /// left it, and answers the `Join` with a transfer. A `Join` from a replica that held the
    /// log later makes the kept state void: the replica stays retired.
    #[test]
    fn a_deposed_leader_chosen_again_leads_on_once_no_replica_held_the_log_since() {
        let shard = ShardId(0);
        let probe = node(0);
        let step = |v: &View, by: u64| {
            let mut next = v.clone();
            next.global += 1;
            next.local[0] += by;
            next
        };
        let v0 = probe.view.clone();
        let leader = probe.leader_of(shard).unwrap();
        // Another leader, then this one again (three replicas: three steps come round).
        let (v1, v2) = (step(&v0, 1), step(&step(&v0, 1), 2));
        assert_ne!(leader_node(&probe.context, &v1, shard), Some(leader));
        assert_eq!(leader_node(&probe.context, &v2, shard), Some(leader));
        let others: Vec<NodeId> = probe
            .context
            .topology
            .shard_nodes(shard)
            .into_iter()
            .filter(|&n| n != leader)
            .collect();
        let key = Key::table(0).u64(1).build();
        let join = |member_view| TigaMsg::Join {
            view: v2.global,
            shard,
            start: Start { incarnation: 1, rejoin: 1 },
            transfer: 0,
            next: 0,
            whole: false,
            member_view,
        };
        for void in [false, true] {
            let mut l = node(leader.0);
            let store = &mut l.hosted.get_mut(&shard).unwrap().store;
            store
                .write(key.clone(), Timestamp(5), Some(vec![7]), txn(1), VersionState::Committed)
                .unwrap();
            let mut out = Outbox::new();
            l.install_view(0, v1.clone(), &mut out).unwrap();
            let host = &l.hosted[&shard];
            assert!(host.retired && host.joining.is_some() && host.deposed.is_some());
            assert_eq!(host.member_view, v0.global);
            l.install_view(0, v2.clone(), &mut out).unwrap();
            out.drain().for_each(drop);
            assert!(!l.hosted[&shard].replica.leads() && l.hosted[&shard].deposed.is_some());
            l.on_message(1, others[0], join(v0.global), &mut out);
            assert!(!l.hosted[&shard].replica.leads(), "one replica's word is not enough");
            let later = if void { v1.global } else { v0.global };
            l.on_message(2, others[1], join(later), &mut out);
            let effects = out.drain().collect();
            let states: Vec<NodeId> = when_durable(&mut l, effects)
                .into_iter()
                .filter_map(|e| match e {
                    Effect::Send { to, msg: TigaMsg::State { .. }, .. } => Some(to),
                    _ => None,
                })
                .collect();
            let host = &l.hosted[&shard];
            if void {
                assert!(host.retired && host.joining.is_some() && !host.replica.leads());
                assert!(host.deposed.is_none() && states.is_empty());
                assert!(l.counters().contains(&("tiga_deposed_states_void_total", 1)));
                continue;
            }
            assert!(host.replica.leads() && !host.retired && host.joining.is_none());
            assert_eq!((host.leader, host.member_view), (leader, v2.global));
            assert_eq!(host.store.read_latest(&key).map(|v| v.ts), Some(Timestamp(5)));
            assert!(states.contains(&others[1]), "a transfer for the replica that asked");
            assert!(l.counters().contains(&("tiga_views_resumed_total", 1)));
        }
    }

    /// A node that its journal's view makes a shard's leader, whose journal holds the
    /// follower it was (promoted at a view change, crashed before its first checkpoint as
    /// the leader), restarts as that follower and gathers the reports again; without a view
    /// in the journal the same records on a node leading the shard refuse to start.
    #[test]
    fn a_new_leader_restarted_before_its_checkpoint_gathers_the_reports_again() {
        use super::super::journal::{recover_with_view, Journal};
        let shard = ShardId(0);
        let probe = node(0);
        let mut next = probe.view.clone();
        next.global += 1;
        next.local[0] += 1;
        let new_leader = leader_node(&probe.context, &next, shard).unwrap();
        let disk = |with_view: bool| {
            let mut journal: Journal<()> = Journal::new(0..0);
            if with_view {
                let (global, local) = (next.global, next.local.clone());
                journal.write(&Record::View { global, local, detective: false });
            }
            journal.write(&Record::Unlisted { shard, through: Timestamp(5) });
            let (_, records) = journal.take_batch().unwrap();
            let disk: BTreeMap<Vec<u8>, Vec<u8>> =
                records.into_iter().map(|r| (r.key, r.value.unwrap())).collect();
            recover_with_view(&disk).unwrap()
        };
        let context = || {
            let mut context = context_in(new_leader.0, 3).0;
            context.incarnation = 1;
            context
        };
        let (shards, seqs, view) = disk(true);
        let mut node = TigaNode::restored_in_view(context(), shards, seqs, view).unwrap();
        assert_eq!(node.view, next);
        assert!(!node.leads(shard) && node.hosted[&shard].recovering.is_some());
        let mut out = Outbox::new();
        node.on_start(0, &mut out);
        let asked = out
            .drain()
            .filter(|e| matches!(e, Effect::Send { msg: TigaMsg::Recover { .. }, .. }))
            .count();
        assert_eq!(asked, 2, "both other replicas are asked for their reports");
        // The same node in the starting view does not lead the shard: the follower's
        // records restore a follower. One that leads it in the starting view refuses them.
        let starting_leader = probe.leader_of(shard).unwrap();
        let (shards, seqs, _) = disk(false);
        let mut context = context_in(starting_leader.0, 3).0;
        context.incarnation = 1;
        assert!(TigaNode::restored_in_view(context, shards, seqs, None).is_err());
    }

    /// A replica chosen to lead while it rejoined (or a deposed leader chosen again, waiting
    /// for the other replicas' word) that restarts finds its journal's view naming it the
    /// leader and its journal saying it rejoins: it starts as a rejoining follower (it used
    /// to refuse to start: the journal followed a shard the view has it lead).
    #[test]
    fn a_replica_chosen_to_lead_while_rejoining_restarts_rejoining() {
        use super::super::journal::{recover_with_view, Journal};
        let shard = ShardId(0);
        let probe = node(0);
        let mut next = probe.view.clone();
        next.global += 1;
        next.local[0] += 1;
        let chosen = leader_node(&probe.context, &next, shard).unwrap();
        let mut journal: Journal<()> = Journal::new(0..0);
        let (global, local) = (next.global, next.local.clone());
        journal.write(&Record::View { global, local, detective: false });
        journal.write(&Record::Joining { shard });
        let (_, records) = journal.take_batch().unwrap();
        let disk: BTreeMap<Vec<u8>, Vec<u8>> =
            records.into_iter().map(|r| (r.key, r.value.unwrap())).collect();
        let (shards, seqs, view) = recover_with_view(&disk).unwrap();
        let mut context = context_in(chosen.0, 3).0;
        context.incarnation = 1;
        let node = TigaNode::restored_in_view(context, shards, seqs, view).unwrap();
        let host = &node.hosted[&shard];
        assert!(!node.leads(shard) && host.joining.is_some() && host.recovering.is_none());
        assert!(host.followers.is_empty() && host.acks.is_empty());
    }

    /// A node that missed views (partitioned while the shard's leader changed and changed
    /// back) tells a change of leader by the shard's local view number, not by its leader's
    /// node: the leader that finds itself leading again does not lead on blindly (another
    /// leader may have committed in between) but waits, as a deposed leader chosen again,
    /// for every other replica's word; a follower that finds the same leader drops its log
    /// and rejoins, saying the last view it held the log in.
    #[test]
    fn a_node_that_missed_views_tells_a_leader_change_by_the_local_view_number() {
        let shard = ShardId(0);
        let probe = node(0);
        let v0 = probe.view.clone();
        let leader = probe.leader_of(shard).unwrap();
        let mut skipped = v0.clone();
        skipped.global += 2;
        skipped.local[0] += 3;
        assert_eq!(leader_node(&probe.context, &skipped, shard), Some(leader));
        let mut l = node(leader.0);
        let mut out = Outbox::new();
        l.install_view(0, skipped.clone(), &mut out).unwrap();
        out.drain().for_each(drop);
        let host = &l.hosted[&shard];
        assert!(host.retired && host.deposed.is_some() && !host.replica.leads());
        let replicas = probe.context.topology.shard_nodes(shard);
        let follower = replicas.into_iter().find(|&n| n != leader).unwrap();
        let mut f = node(follower.0);
        f.install_view(0, skipped.clone(), &mut out).unwrap();
        let effects = out.drain().collect();
        let joins: Vec<(NodeId, u64)> = when_durable(&mut f, effects)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Send { to, msg: TigaMsg::Join { member_view, .. }, .. } => {
                    Some((to, member_view))
                }
                _ => None,
            })
            .collect();
        assert!(f.hosted[&shard].joining.is_some());
        assert_eq!(joins, vec![(leader, v0.global)]);
    }

    /// Snapshot reads: a leader's closed timestamp stays below the clock, below what it
    /// holds and below every released transaction not finished, and never falls below what
    /// it promised; an arrival at or below the promise is held above it.
    #[test]
    fn a_leader_closes_below_what_it_holds_and_what_has_not_finished() {
        let (mut leader, workload) = node_of(0, Variant::Tiga);
        let host = leader.hosted.get_mut(&ShardId(0)).unwrap();
        assert_eq!(leader_closed(host, 1_000), Timestamp(1_000));
        host.queued.insert(txn(1), Queued { ts: Timestamp(400), hash: 0, speculative: false });
        assert_eq!(leader_closed(host, 1_000), Timestamp(399), "a released one not run yet");
        host.queued.clear();
        host.promised = Timestamp(700);
        assert_eq!(leader_closed(host, 650), Timestamp(700), "never below the promise");
        let mut generator = workload.generator(0, 0);
        let single = (0..1_000)
            .map(|i| generator.next(RequestId(i)))
            .find(|r| shape_of(&leader.context, r, ShardId(0)).unwrap().shards() == [ShardId(0)])
            .expect("a single-shard transfer");
        let late = TxnBody {
            txn: TxnId { origin: NodeId(10), incarnation: 1, seq: 1 },
            ts: Timestamp(500),
            sent_at: 0,
            request: single,
            home: ShardId(0),
            decided_below: 0,
        };
        let mut out = Outbox::new();
        leader.on_message(600, NodeId(10), TigaMsg::Txn(Box::new(late.clone())), &mut out);
        let host = &leader.hosted[&ShardId(0)];
        assert_eq!(host.replica.held_at(late.txn), Some(Timestamp(701)), "held above the promise");
        assert_eq!(leader_closed(host, 1_000), Timestamp(700), "and below it again");
    }

    /// A leader's promise stays below every multi-shard entry fewer than `f` followers
    /// executed (a new leader after a failover takes its outcome from one that did); a
    /// single-shard entry does not hold it back, and one whose body is gone counts as
    /// multi-shard.
    #[test]
    fn a_leader_promises_past_a_multi_shard_entry_once_f_followers_executed_it() {
        let shard = ShardId(0);
        let (probe, workload) = node_of(0, Variant::Tiga);
        let (mut leader, _) = node_in(probe.leader_of(shard).unwrap().0, Variant::Tiga, 3);
        let mut generator = workload.generator(0, 0);
        let shards_of = |r: &TxnRequest| shape_of(&leader.context, r, shard).unwrap().shards();
        let requests: Vec<TxnRequest> = (0..1_000).map(|i| generator.next(RequestId(i))).collect();
        let single = requests.iter().find(|r| shards_of(r) == [shard]).expect("one shard");
        let multi = requests.iter().find(|r| shards_of(r).len() > 1 && shards_of(r)[0] == shard);
        let body = |seq: u64, ts: u64, request: &TxnRequest| TxnBody {
            txn: txn(seq),
            ts: Timestamp(ts),
            sent_at: 0,
            request: request.clone(),
            home: shard,
            decided_below: 0,
        };
        let bodies = [body(1, 300, single), body(2, 400, multi.expect("a transfer across"))];
        let knowns: Vec<Known> = bodies
            .iter()
            .map(|b| journaled_known(&leader.context, shard, b.clone()).unwrap())
            .collect();
        let log: Vec<(TxnId, Timestamp, &[Key], &[Key])> = knowns
            .iter()
            .map(|k| (k.body.txn, k.body.ts, &k.part.reads[..], &k.part.writes[..]))
            .collect();
        let (replica, _) = Replica::recovered_leader(shard, replica_limits(3), None, &log).unwrap();
        let host = leader.hosted.get_mut(&shard).unwrap();
        host.replica = replica;
        for known in knowns {
            host.bodies.insert(known.body.txn, known);
        }
        let follower = host.followers[0];
        assert_eq!(leader_closed(host, 1_000), Timestamp(399), "no follower executed 2");
        host.acks.insert(follower, (2, 1));
        assert_eq!(leader_closed(host, 1_000), Timestamp(399), "nor past 1");
        host.acks.insert(follower, (2, 2));
        assert_eq!(leader_closed(host, 1_000), Timestamp(1_000), "f = 1 follower did");
        // Bodies dropped (pruned): both count as multi-shard.
        host.acks.insert(follower, (2, 0));
        host.bodies.clear();
        assert_eq!(leader_closed(host, 1_000), Timestamp(299));
    }

    /// A replica forgets the replies it kept for a coordinator's decided transactions (those
    /// below the floor its bodies carry), never one at or above the body's own sequence
    /// number, nor another incarnation's, nor on a floor sent by anyone but the coordinator.
    #[test]
    fn replies_kept_for_resends_go_once_their_coordinator_decided() {
        let (mut replica, workload) = node_of(0, Variant::Tiga);
        let id = |incarnation: u64, seq: u64| TxnId { origin: NodeId(10), incarnation, seq };
        let kept = [id(1, 0), id(1, 1), id(1, 2), id(1, 6), id(1, 7), id(1, 9), id(2, 0)];
        let host = replica.hosted.get_mut(&ShardId(0)).unwrap();
        for &txn in &kept {
            let slow = TigaMsg::Slow {
                view: VIEW,
                txn,
                shard: ShardId(0),
                ts: Timestamp(1),
                owd_ns: None,
            };
            reply(host, txn, slow, &mut Outbox::new());
        }
        let mut generator = workload.generator(0, 0);
        let single = (0..1_000)
            .map(|i| generator.next(RequestId(i)))
            .find(|r| shape_of(&replica.context, r, ShardId(0)).unwrap().shards() == [ShardId(0)])
            .expect("a single-shard transfer");
        let body = |seq: u64, decided_below: u64| TxnBody {
            txn: id(1, seq),
            ts: Timestamp(5_000), // Held: no reply of its own.
            sent_at: 0,
            request: single.clone(),
            home: ShardId(0),
            decided_below,
        };
        let answered = |replica: &TigaNode| -> Vec<TxnId> {
            replica.hosted[&ShardId(0)].answers.keys().copied().collect()
        };
        let mut out = Outbox::new();
        let from_peer = TigaMsg::Txn(Box::new(body(8, 8)));
        replica.on_message(600, NodeId(11), from_peer, &mut out);
        assert_eq!(answered(&replica), kept, "a floor from another node counts for nothing");
        replica.on_message(600, NodeId(10), TigaMsg::Txn(Box::new(body(8, 2))), &mut out);
        assert_eq!(answered(&replica), [id(1, 2), id(1, 6), id(1, 7), id(1, 9), id(2, 0)]);
        replica.on_message(600, NodeId(10), TigaMsg::Txn(Box::new(body(7, 1_000))), &mut out);
        let left = answered(&replica);
        assert!(left.contains(&id(1, 7)), "not the body's own: {left:?}");
        assert!(!left.contains(&id(1, 6)) && left.contains(&id(1, 9)) && left.contains(&id(2, 0)));
        // The eviction order keeps up: thousands of replies forgotten as decided leave it
        // within a constant factor of what is kept.
        let host = replica.hosted.get_mut(&ShardId(0)).unwrap();
        for seq in 100..5_100 {
            let txn = id(1, seq);
            let slow = TigaMsg::Slow {
                view: VIEW,
                txn,
                shard: ShardId(0),
                ts: Timestamp(1),
                owd_ns: None,
            };
            reply(host, txn, slow, &mut Outbox::new());
            forget_decided_answers(host, id(1, seq + 1), seq + 1);
        }
        let kept: Vec<TxnId> = host.answers.keys().copied().collect();
        assert_eq!(kept, [id(2, 0)], "every one of incarnation 1 decided");
        assert!(host.answer_order.len() <= 2 * host.answers.len() + 1_025);
        let ordered: BTreeSet<TxnId> = host.answer_order.iter().copied().collect();
        assert!(host.answers.keys().all(|txn| ordered.contains(txn)), "every reply evictable");
    }

    /// `effects`, and what `node` sends once the journal records among them are durable.
    fn when_durable(
        node: &mut TigaNode,
        mut effects: Vec<Effect<TigaMsg>>,
    ) -> Vec<Effect<TigaMsg>> {
        let tokens: Vec<PersistToken> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::Persist { token, .. } => Some(*token),
                _ => None,
            })
            .collect();
        for token in tokens {
            let mut out = Outbox::new();
            node.on_persisted(0, token, &mut out);
            effects.extend(out.drain());
        }
        effects
    }

    /// A leader asked to agree on a transaction its coordinator decided, of which it holds
    /// no copy, refuses it for good (no body fetched, no agreement opened, every later copy
    /// dropped), and the proposer, which holds it, drops it and journals that; a refusal from
    /// a node that does not lead the refusing shard changes nothing.
    #[test]
    fn a_leader_refuses_what_its_coordinator_decided_without_it_and_the_proposer_drops_it() {
        for variant in [Variant::Tiga, Variant::Luigi] {
            let (mut a, workload) = node_of(0, variant);
            let leader_b = a.leader_of(ShardId(1)).unwrap();
            let mut b = node_of(leader_b.0, variant).0;
            assert!(b.hosted[&ShardId(1)].replica.leads());
            let coordinator = NodeId(10);
            let id = |seq: u64| TxnId { origin: coordinator, incarnation: 1, seq };
            let mut generator = workload.generator(0, 0);
            let shards_of = |r: &TxnRequest| shape_of(&a.context, r, ShardId(0)).unwrap().shards();
            let mut requests = (0..1_000).map(|i| generator.next(RequestId(i)));
            let across = requests.find(|r| shards_of(r) == [ShardId(0), ShardId(1)]).unwrap();
            let body = |seq: u64, request: &TxnRequest, decided_below: u64| TxnBody {
                txn: id(seq),
                ts: Timestamp(5_000), // Held: its time has not come.
                sent_at: 0,
                request: request.clone(),
                home: ShardId(0),
                decided_below,
            };
            let mut out = Outbox::new();
            // A holds transaction 1 and proposes it to B once its journal holds the proposal.
            a.on_message(10, coordinator, TigaMsg::Txn(Box::new(body(1, &across, 0))), &mut out);
            let proposal = when_durable(&mut a, out.drain().collect())
                .into_iter()
                .find_map(|e| match e {
                    Effect::Send { to, msg: msg @ TigaMsg::Propose { .. } } if to == leader_b => {
                        Some(msg)
                    }
                    _ => None,
                })
                .expect("a proposal to B's leader");
            assert!(a.hosted[&ShardId(0)].replica.held_at(id(1)).is_some());
            // B never got it; its coordinator's next body says it decided it.
            let later = body(4, &across, 2);
            b.on_message(20, coordinator, TigaMsg::Txn(Box::new(later)), &mut out);
            when_durable(&mut b, out.drain().collect());
            b.on_message(30, NodeId(0), proposal, &mut out);
            let sent: Vec<TigaMsg> = when_durable(&mut b, out.drain().collect())
                .into_iter()
                .filter_map(|e| match e {
                    Effect::Send { to: NodeId(0), msg } => Some(msg),
                    _ => None,
                })
                .collect();
            let refusal =
                TigaMsg::Refused { view: VIEW, txn: id(1), from: ShardId(1), to: ShardId(0) };
            assert_eq!(
                sent,
                std::slice::from_ref(&refusal),
                "{variant:?}: refused, nothing fetched"
            );
            assert_eq!(b.counts.refused_sent_total, 1);
            b.timer(1_000_000_000, TimerId(u64::MAX), &mut out); // No timer of its own.
            assert!(out
                .drain()
                .all(|e| !matches!(e, Effect::Send { msg: TigaMsg::GetBody { .. }, .. })));
            // A late copy of the body is dropped for good.
            let late = TigaMsg::Txn(Box::new(body(1, &across, 0)));
            b.on_message(40, coordinator, late, &mut out);
            assert!(b.hosted[&ShardId(1)].replica.held_at(id(1)).is_none());
            assert!(!b.hosted[&ShardId(1)].bodies.contains_key(&id(1)));
            assert_eq!(b.counts.stale_bodies_total, 1);
            // At A: a refusal from a node that does not lead B changes nothing.
            let stranger = NodeId(leader_b.0 + 1);
            a.on_message(50, stranger, refusal.clone(), &mut out);
            let host = &a.hosted[&ShardId(0)];
            assert!(host.replica.held_at(id(1)).is_some(), "{variant:?}: a stranger's word");
            assert!(host.journaled.contains_key(&id(1)));
            // From B's leader: the transaction goes, body, proposal and all.
            let records = a.journal.records_total;
            a.on_message(60, leader_b, refusal, &mut out);
            let host = &a.hosted[&ShardId(0)];
            assert!(host.replica.held_at(id(1)).is_none(), "{variant:?}: dropped");
            assert!(!host.bodies.contains_key(&id(1)) && !host.journaled.contains_key(&id(1)));
            assert_eq!(a.counts.refused_total, 1);
            assert_eq!(a.journal.records_total, records + 1, "{variant:?}: withdrawn");
            if let Some(streams) = &host.streams {
                assert_eq!(streams.open(), 0, "no longer holds its worker's watermark back");
            }
        }
    }

    /// A luigi coordinator takes a watermark only from the shard's leader (a stranger's is
    /// dropped and counted), and a watermark only rises; a luigi leader takes no transaction
    /// from a worker outside the cluster (its watermark vector has no slot for one) and
    /// holds a worker's next transaction above what its watermark promised.
    #[test]
    fn luigi_watermarks_come_from_leaders_and_streams_cover_the_cluster_only() {
        let (mut coordinator, _) = node_of(9, Variant::Luigi);
        let mut out = Outbox::new();
        let leader_of_1 = coordinator.leader_of(ShardId(1)).unwrap();
        let mark = TigaMsg::Watermark { view: VIEW, shard: ShardId(1), ts: Timestamp(50) };
        coordinator.on_message(1, NodeId(10), mark.clone(), &mut out);
        assert!(coordinator.watermarks.is_empty(), "a stranger's watermark");
        assert_eq!(coordinator.counts.dropped_total, 1);
        coordinator.on_message(2, leader_of_1, mark, &mut out);
        let lower = TigaMsg::Watermark { view: VIEW, shard: ShardId(1), ts: Timestamp(40) };
        coordinator.on_message(3, leader_of_1, lower, &mut out);
        assert_eq!(coordinator.watermarks.get(&ShardId(1)), Some(&Timestamp(50)));
        // A tiga node takes no watermark at all.
        let mut tiga = node(9);
        let mark = TigaMsg::Watermark { view: VIEW, shard: ShardId(1), ts: Timestamp(50) };
        tiga.on_message(4, leader_of_1, mark, &mut out);
        assert!(tiga.watermarks.is_empty());

        let (mut leader, workload) = node_of(0, Variant::Luigi);
        assert!(leader.hosted[&ShardId(0)].replica.leads());
        let nodes = leader.context.topology.nodes.len();
        assert_eq!(leader.hosted[&ShardId(0)].streams.as_ref().unwrap().workers(), nodes);
        // A one-shard transfer on shard 0 (bank's accounts spread over the shards).
        let mut generator = workload.generator(0, 0);
        let single = (0..1_000)
            .map(|i| generator.next(RequestId(i)))
            .find(|r| {
                let shape = shape_of(&leader.context, r, ShardId(0)).unwrap();
                shape.shards() == [ShardId(0)]
            })
            .expect("a single-shard transfer");
        let body = |origin: u32, seq: u64, ts: u64| TxnBody {
            txn: TxnId { origin: NodeId(origin), incarnation: 1, seq },
            ts: Timestamp(ts),
            sent_at: 0,
            request: single.clone(),
            home: ShardId(0),
            decided_below: 0,
        };
        let outside = body(nodes as u32 + 5, 1, 1_000);
        leader.on_message(10, NodeId(10), TigaMsg::Txn(Box::new(outside)), &mut out);
        assert_eq!(leader.hosted[&ShardId(0)].replica.held(), 0, "a worker outside the cluster");
        // Worker 10's first transaction is held at its stamp and released (one shard), its
        // second, stamped lower, is held above the first's timestamp.
        leader.on_message(11, NodeId(10), TigaMsg::Txn(Box::new(body(10, 1, 500))), &mut out);
        leader.on_message(12, NodeId(10), TigaMsg::Txn(Box::new(body(10, 2, 300))), &mut out);
        let host = &leader.hosted[&ShardId(0)];
        let second = TxnId { origin: NodeId(10), incarnation: 1, seq: 2 };
        assert_eq!(host.replica.held_at(second), Some(Timestamp(501)));
        assert_eq!(host.streams.as_ref().unwrap().watermark(NodeId(10)), Timestamp(499));
        // A body claiming worker 10's transaction from anyone but worker 10 (or a peer
        // leader) is not taken: it could push the worker's frontier to the end of time.
        let bodies = host.bodies.len();
        let forged = body(10, 3, u64::MAX);
        leader.on_message(13, NodeId(11), TigaMsg::Txn(Box::new(forged)), &mut out);
        assert_eq!(leader.hosted[&ShardId(0)].bodies.len(), bodies, "a forged body");
        // A luigi follower takes bodies from its leader only.
        let follower_id = leader.context.topology.replica_node(ShardId(0), 1).unwrap();
        let (mut follower, _) = node_of(follower_id.0, Variant::Luigi);
        let host = &follower.hosted[&ShardId(0)];
        assert!(!host.replica.leads());
        let its_leader = host.leader;
        follower.on_message(14, NodeId(10), TigaMsg::Txn(Box::new(body(10, 4, 600))), &mut out);
        assert!(follower.hosted[&ShardId(0)].bodies.is_empty(), "a body from its coordinator");
        follower.on_message(15, its_leader, TigaMsg::Txn(Box::new(body(10, 4, 600))), &mut out);
        assert_eq!(follower.hosted[&ShardId(0)].bodies.len(), 1, "a body from its leader");
        assert_eq!(follower.hosted[&ShardId(0)].replica.held(), 0, "kept, not held");
    }
}
