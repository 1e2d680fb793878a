//! The seam between tiga and a protocol built on its node (luigi, [`crate::luigi`]): a
//! [`Variant`] value, chosen once when the node is built, says every way the node departs
//! from tiga. The node's code asks it questions by behaviour ([`Variant::every_replica`],
//! [`Variant::leaders_only`], [`Variant::may_detect`]), never by protocol name, and what
//! only the other protocol has (luigi's per-worker watermarks, its view-manager options)
//! comes in through it as a [`Watermarks`] maker and settings functions, so `tiga` imports
//! nothing of `luigi`.
//!
//! One choice drives the rest ([`Dispatch`]): whether a coordinator sends a transaction to
//! every replica of a shard (tiga: followers answer the coordinator, a super quorum of fast
//! replies commits, followers drop the tail a promise leaves out) or to the shard's leader
//! only (luigi: the leader relays bodies with its log, followers acknowledge to it, and the
//! coordinator commits once every leader's result is in and that leader's watermark covers
//! the agreed timestamp). Executing before the leaders agree (detective mode) needs every
//! replica's fast reply, so only the first may run it.

use super::TigaSettings;
use crate::tiga::view::View;
use crate::tiga::Mode;
use crate::ProtocolOptions;
use meridian_core::topology::Topology;
use meridian_core::{NodeId, Timestamp, TxnId};

/// A leader's per-worker replication watermarks (luigi's commit rule): which of each
/// worker's transactions are held here, which are replicated to a majority, and the
/// timestamp at or below which all of one worker's are. Implemented by
/// [`crate::luigi::streams::Streams`].
pub trait Watermarks: std::fmt::Debug + Send {
    /// The timestamp above which a new transaction of `worker` must be held here (`None`:
    /// a worker outside the cluster, or one whose stream is full: refuse it).
    fn floor(&self, worker: NodeId) -> Option<Timestamp>;
    /// `txn` is held here at `ts` (or its timestamp rose to `ts`).
    fn held(&mut self, txn: TxnId, ts: Timestamp);
    /// `txn`'s entry, at `ts`, is on a majority of the shard's replicas.
    fn replicated(&mut self, txn: TxnId, ts: Timestamp);
    /// `txn` left without an entry.
    fn dropped(&mut self, txn: TxnId);
    /// A restart: the watermark it told `worker` before.
    fn restore_told(&mut self, worker: NodeId, ts: Timestamp);
    /// A restart: `txn` was open (held, not replicated) at `ts`.
    fn restore_open(&mut self, txn: TxnId, ts: Timestamp);
    /// A restart or a new leader: `txn` is in the log at `ts`, not known replicated.
    fn restore_held(&mut self, txn: TxnId, ts: Timestamp);
    /// `worker`'s watermark now.
    fn watermark(&self, worker: NodeId) -> Timestamp;
    /// The watermarks that rose since last asked, to tell their workers.
    fn take_raised(&mut self) -> Vec<(NodeId, Timestamp)>;
    /// Every watermark told so far (a checkpoint keeps them).
    fn told(&self) -> Vec<(NodeId, Timestamp)>;
    /// Transactions held and not replicated, over every worker.
    fn open(&self) -> usize;
}

/// Makes a leader's watermarks for a cluster of `nodes` nodes (one worker each).
pub type MakeWatermarks = fn(nodes: usize) -> Box<dyn Watermarks>;

/// Where a coordinator sends a transaction, and so how it commits.
#[derive(Clone, Copy, Debug)]
pub enum Dispatch {
    /// To every replica of each shard (tiga).
    EveryReplica,
    /// To each shard's leader only (luigi); its leaders keep the watermarks made here.
    LeadersOnly { watermarks: MakeWatermarks },
}

/// The counters' prefix. The metrics interface takes `&'static str`, so each prefix is
/// spelled out once at compile time ([`super::counters::prefixed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefix {
    Tiga,
    Luigi,
}

/// The view manager's settings for a node: hosted at all, how long a leader may stay
/// silent, and the mode it starts views in.
#[derive(Clone, Copy, Debug)]
pub struct ManagerSettings {
    pub on: bool,
    pub detect_ns: u64,
    pub mode: Mode,
}

/// What a protocol built on tiga's node chooses.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    /// The protocol's name, for its errors.
    pub name: &'static str,
    pub prefix: Prefix,
    pub dispatch: Dispatch,
    /// The view manager's settings, from the protocol's options (parsed, so in range).
    pub manager: fn(&ProtocolOptions) -> ManagerSettings,
    /// The view a run starts in: every node computes it alike, and the view manager's
    /// members are chosen from it.
    pub starting_view: fn(&Topology, &ProtocolOptions) -> Result<View, String>,
}

impl Variant {
    /// Tiga itself.
    pub const TIGA: Variant = Variant {
        name: "tiga",
        prefix: Prefix::Tiga,
        dispatch: Dispatch::EveryReplica,
        manager: tiga_manager,
        starting_view: tiga_starting_view,
    };

    /// Every replica gets each transaction from its coordinator and answers it.
    pub fn every_replica(&self) -> bool {
        matches!(self.dispatch, Dispatch::EveryReplica)
    }

    /// Only the leaders get transactions; followers learn them from their leader's log and
    /// answer only their leader.
    pub fn leaders_only(&self) -> bool {
        !self.every_replica()
    }

    /// Views may be detective (execute before the leaders agree): only with every replica's
    /// fast reply to commit on.
    pub fn may_detect(&self) -> bool {
        self.every_replica()
    }

    /// A leader's watermarks, where the variant keeps any.
    pub fn watermarks(&self, nodes: usize) -> Option<Box<dyn Watermarks>> {
        match self.dispatch {
            Dispatch::EveryReplica => None,
            Dispatch::LeadersOnly { watermarks } => Some(watermarks(nodes)),
        }
    }
}

fn tiga_manager(options: &ProtocolOptions) -> ManagerSettings {
    let settings = TigaSettings::from_options(options);
    ManagerSettings {
        on: settings.view_manager,
        detect_ns: settings.detect_ns,
        mode: settings.mode,
    }
}

fn tiga_starting_view(topology: &Topology, options: &ProtocolOptions) -> Result<View, String> {
    super::starting_view(topology, &TigaSettings::from_options(options))
}
