//! The `tiga` protocol node: a coordinator for the transactions clients submit here, and the
//! replicas of the shards this node hosts, each driven by [`super::replica::Replica`]. The
//! same node runs `luigi` ([`crate::luigi`]), chosen by a [`Variant`] value (the one seam
//! between them, [`variant`]): coordinators send to the leaders only, followers learn
//! transactions from the leader's log alone, and a commit waits for the leaders' per-worker
//! replication watermarks instead of a quorum of replies.
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

mod body;
mod checkpoint;
mod coordinate;
mod counters;
mod execute;
mod follower;
mod leader;
mod manage;
mod memory;
mod msg;
mod pacing;
mod part;
mod snapshot;
mod state;
mod variant;
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
use crate::{NodeContext, ProtocolNode};
use checkpoint::{advance_finished, answer_order, journaled_known};
use counters::Counts;
use execute::window_outcomes;
use execute::{deliver_vote, finished_here, outputs_bytes, record_vote, run_part, vote_msg};
use follower::FollowerState;
use leader::LeaderState;
use memory::{
    forget_decided, forget_decided_answers, is_decided, note_decided, prune_bodies, raise_floor,
    refresh_owd, reply, slow_reply,
};
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
use msg::SyncParts;
pub use msg::*;
pub use part::check_request;
use part::{shape_of, Part, Shape};
use state::{committed_version, image_parts, install_without_rows, store_rows};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
pub use variant::{Dispatch, MakeWatermarks, ManagerSettings, Prefix, Variant, Watermarks};
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
    /// Leader: the commit-point last sent to the followers. Follower: the highest heard.
    commit: usize,
    /// The leader's node.
    leader: NodeId,
    /// Snapshot reads waiting for their timestamp to close here, by (timestamp, id).
    snapshots: BTreeMap<(Timestamp, TxnId), Known>,
    /// Snapshot reads are on: the store keeps every version (see [`apply`]).
    keep_history: bool,
    /// Leader: the last transfer id given.
    transfer_seq: u64,
    /// Follower: state transfers the leader sent this replica to since the node started
    /// ([`TigaMsg::Behind`]).
    rejoins: u32,
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
    /// Its log as it stood at a view change that gave the shard a new leader, kept to report
    /// it to the new leader ([`view_change`]).
    frozen: Option<Box<Frozen>>,
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
    /// What it keeps as its shard's leader (empty while it follows).
    lead: LeaderState,
    /// What it keeps as a follower of the shard's leader.
    follow: FollowerState,
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
            commit: 0,
            leader,
            snapshots: BTreeMap::new(),
            keep_history,
            transfer_seq: 0,
            rejoins: 0,
            restore_rows: Vec::new(),
            quiet: false,
            restore_events: Vec::new(),
            follower_checkpointed: 0,
            frozen: None,
            retired: false,
            stashed: None,
            deposed: None,
            member_view: 0,
            lead: LeaderState { followers, ..LeaderState::default() },
            follow: FollowerState::default(),
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
    commit: usize,
    follower_checkpointed: usize,
    /// Its follower state but for `joining` (the rejoin stays with the replica).
    follow: FollowerState,
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
            commit: 0,
            follower_checkpointed,
            follow: FollowerState::default(),
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
        swap(&mut self.commit, &mut host.commit);
        swap(&mut self.follower_checkpointed, &mut host.follower_checkpointed);
        swap(&mut self.follow, &mut host.follow);
        // The rejoin under way is the replica's, not the dropped state's.
        swap(&mut self.follow.joining, &mut host.follow.joining);
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
        Self::of(context, Variant::TIGA, settings.owd, settings.snapshot_reads)
    }

    /// A node of `context` running `variant`, stamping with `owd`, in the variant's
    /// starting view.
    pub fn of(
        context: NodeContext,
        variant: Variant,
        owd: OwdSettings,
        snapshot_reads: bool,
    ) -> Result<Self, String> {
        let view = (variant.starting_view)(&context.topology, &context.options)?;
        Self::build(context, variant, view, owd, snapshot_reads)
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
        let settings = TigaSettings::from_options(&context.options);
        let (owd, snapshot_reads) = (settings.owd, settings.snapshot_reads);
        Self::restored_as(context, Variant::TIGA, owd, snapshot_reads, shards, seqs, view)
    }

    /// A node of `context` running `variant` (see [`TigaNode::of`]) that restarted with
    /// `shards` found in its journal, in the view the journal holds or, without one, the
    /// variant's starting view.
    pub fn restored_as(
        context: NodeContext,
        variant: Variant,
        owd: OwdSettings,
        snapshot_reads: bool,
        shards: BTreeMap<ShardId, Recovered>,
        seqs: Seqs,
        view: Option<super::journal::JournaledView>,
    ) -> Result<Self, String> {
        let mut node = match view {
            None => Self::of(context, variant, owd, snapshot_reads)?,
            Some((global, local, detective)) => {
                let name = variant.name;
                if local.len() != context.topology.shards as usize {
                    return Err(format!("the {name} journal's view has {} shards", local.len()));
                }
                if detective && !variant.may_detect() {
                    return Err(format!(
                        "the {name} journal's view is detective, but {name}'s leaders agree \
                         before executing"
                    ));
                }
                let mode = if detective { Mode::Detective } else { Mode::Preventive };
                let view = View { global, local, mode };
                let mut node = Self::build(context, variant, view, owd, snapshot_reads)?;
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

    fn build(
        context: NodeContext,
        variant: Variant,
        view: View,
        owd: OwdSettings,
        snapshot_reads: bool,
    ) -> Result<Self, String> {
        let topology = &context.topology;
        let detective = view.mode == Mode::Detective;
        debug_assert!(
            !detective || variant.may_detect(),
            "{} agrees before executing",
            variant.name
        );
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
            let mut host = Hosted {
                // Ids grow across the leader's starts too: a restarted leader's first image
                // must not take the id of one its previous start had begun to send (a
                // follower would mix the parts of the two).
                transfer_seq: (context.incarnation & 0xFFFF_FFFF) << 32,
                // A restart in a journaled view may have vouched in it.
                member_view: view.global,
                ..Hosted::new(shard, replica, leader, Vec::new(), snapshot_reads)
            };
            host.lead = LeaderState {
                acks: followers.iter().map(|&n| (n, (0, 0))).collect(),
                sent_to: followers.iter().map(|&n| (n, 0)).collect(),
                bodies_to: followers.iter().map(|&n| (n, 0)).collect(),
                streams: if leads { variant.watermarks(topology.nodes.len()) } else { None },
                followers,
                ..LeaderState::default()
            };
            // A follower of a node started before may have vouched for entries it no
            // longer holds: it takes the leader's state before anything else.
            host.follow.joining = (!leads && context.incarnation > 0).then(Joining::default);
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
        if self.variant.leaders_only() {
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

    // ----- coordinator -------------------------------------------------------------------

    // ----- replicas ----------------------------------------------------------------------
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
        if host.lead.promised > Timestamp::ZERO {
            // Snapshot reads: nothing new at or below a closed timestamp.
            incoming.ts = incoming.ts.max(Timestamp(host.lead.promised.0.saturating_add(1)));
        }
        if let Some(streams) = &host.lead.streams {
            let Some(floor) = streams.floor(txn.origin) else { return Vec::new() };
            incoming.ts = incoming.ts.max(floor);
        }
    }
    let actions = host.replica.arrive(incoming);
    let held = host.replica.held_at(txn);
    debug_assert!(
        held.is_none_or(|ts| ts > host.lead.promised),
        "{txn} held at or below the promise"
    );
    if let (Some(streams), Some(held)) = (&mut host.lead.streams, held) {
        streams.held(txn, held);
    }
    actions
}

/// A leader's commit-point ([`super::log::commit_point`]: the leader at its log's length,
/// each follower at its acknowledged sync-point), never below what it said before.
fn commit_point(host: &Hosted, replicas: u32) -> usize {
    let mut synced: Vec<usize> = host.lead.acks.values().map(|&(s, _)| s).collect();
    synced.push(host.replica.log_len());
    super::log::commit_point(&synced, replicas).max(host.commit)
}

/// Leader: word to a follower that executed less than what the leader keeps for followers.
fn behind_msg(view: u64, host: &Hosted) -> TigaMsg {
    TigaMsg::Behind { view, shard: host.shard, upto: host.lead.pruned as u64 }
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
        executed: host.follow.executed as u64,
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
    for ts in
        host.lead.queued.values().map(|q| q.ts).chain(host.lead.pending.values().map(|p| p.ts))
    {
        closed = closed.min(below(ts));
    }
    // A view change's new leader is a former follower: it takes the outcome of a
    // multi-shard entry from a replica that executed it, since the other leaders drop their
    // records once every leader promised past it. So the promise stays below every
    // multi-shard entry that fewer than `f` followers executed: any `f + 1` of the other
    // replicas then include one that did. Bounded by a sync message's entries; past them
    // (followers far behind, or not heard since a restart) it does not rise.
    let f = host.lead.followers.len() / 2;
    if f > 0 {
        let mut executed: Vec<usize> = host
            .lead
            .followers
            .iter()
            .map(|n| host.lead.acks.get(n).map_or(0, |&(_, e)| e))
            .collect();
        executed.sort_unstable_by(|a, b| b.cmp(a));
        let from = executed[f - 1].max(host.replica.log_base());
        let window = host.replica.log_since(from);
        if from + window.len() < host.replica.log_len() {
            return host.lead.promised;
        }
        // A body pruned already counts as multi-shard: the promise waits.
        let multi = |txn: &TxnId| host.bodies.get(txn).is_none_or(|k| k.shards.len() > 1);
        for &(_, ts) in window.iter().filter(|(txn, _)| multi(txn)) {
            closed = closed.min(below(ts));
        }
    }
    // Below the promise only while a restarted leader runs again what it had finished
    // before its crash (new arrivals are held above it: see `leader_arrive`).
    closed.max(host.lead.promised)
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
            self.hosted.values().filter(|h| h.follow.joining.is_some()).map(|h| h.shard).collect();
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
                if host.replica.leads() || host.leader != from || host.follow.joining.is_some() {
                    self.counts.dropped_total += 1;
                    return;
                }
                let Ok(upto) = usize::try_from(upto) else { return };
                let last = host.follow.closed.back().copied().unwrap_or((Timestamp::ZERO, 0));
                if ts > last.0 && upto >= last.1 {
                    host.follow.closed.push_back((ts, upto));
                    if host.follow.closed.len() > CLOSED_KEPT_MAX {
                        host.follow.closed.pop_front();
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
                if let Some(joining) =
                    self.hosted.get_mut(&shard).and_then(|h| h.follow.joining.as_mut())
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

    /// A leader's finished prefix of its log, a follower's executed one (a retired or
    /// rejoining replica holds no log: left out).
    fn groups(&self) -> Vec<meridian_core::node::GroupStatus> {
        let holding = self.hosted.values().filter(|h| !h.retired && h.follow.joining.is_none());
        holding
            .map(|h| {
                let leader = h.replica.leads();
                let applied = if leader { h.lead.finished } else { h.follow.executed };
                meridian_core::node::GroupStatus {
                    shard: h.shard,
                    leader,
                    applied_index: applied as u64,
                }
            })
            .collect()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        self.named_counters()
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
mod tests;
