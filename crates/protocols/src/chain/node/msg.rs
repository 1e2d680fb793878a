//! `chain`'s messages: an attempt shipped down its chain, acknowledgements, precommits,
//! durability notices, decisions and their deliveries (the flow is in [`super`]'s contract).
//! Everything here comes off the wire and is checked where a node takes it.

use super::*;

/// An attempt as it travels down its chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shipped {
    /// The attempt.
    pub txn: TxnId,
    /// Its timestamp (the coordinator's, hop 0).
    pub ts: Timestamp,
    /// The procedure and its arguments.
    pub request: TxnRequest,
    /// Where pieces of replicated tables run when no other piece places them.
    pub home: ShardId,
    /// The hop it is shipped to (from 1).
    pub hop: u32,
    /// The outputs of every piece before this hop's first.
    pub outputs: Vec<PieceOutput>,
}

/// How an attempt ended, as its decider delivers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Committed at the attempt's timestamp; the coordinator's copy carries every piece's
    /// output, the hops' copies none.
    Committed {
        /// Piece outputs, in plan order (coordinator only).
        outputs: Vec<PieceOutput>,
    },
    /// Aborted.
    Aborted(Why),
}

/// A decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// The attempt.
    pub txn: TxnId,
    /// Its timestamp.
    pub ts: Timestamp,
    /// The shards of its hops (a server of one remembers an abort even if the attempt never
    /// reached it, so a late copy is refused).
    pub shards: Vec<ShardId>,
    /// What was decided.
    pub outcome: Outcome,
}

/// `chain`'s messages.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ChainMsg {
    /// The attempt, shipped to its next hop.
    Txn(Box<Shipped>),
    /// Hop `hop` ran its pieces: to the hop before it.
    Ack {
        /// The attempt.
        txn: TxnId,
        /// The hop that ran.
        hop: u32,
    },
    /// Hop `hop` votes commit and hands the decision to hop `hop + 1`.
    Precommit {
        /// The attempt.
        txn: TxnId,
        /// The hop precommitting (0: the coordinator).
        hop: u32,
    },
    /// The decision, from the node that made it: for shard `to`, or (`None`) the
    /// coordinator's copy.
    Decision {
        /// Who it is for.
        to: Option<ShardId>,
        /// The decision.
        decision: Box<Decision>,
    },
    /// Overlapped replication: hop `hop`'s vote is in its shard's log, so no later leader of
    /// that shard aborts it. To the leader of the last hop's shard `last`, which commits only
    /// once every hop before it has sent this.
    Durable {
        /// The attempt.
        txn: TxnId,
        /// The hop whose vote is in its log (never the last).
        hop: u32,
        /// The shard of the attempt's last hop.
        last: ShardId,
    },
    /// The decision was applied by `shard` (`None`: by the coordinator): the decider may
    /// stop resending it there.
    Applied {
        /// The attempt.
        txn: TxnId,
        /// Who applied it.
        shard: Option<ShardId>,
    },
    /// A server refused an attempt it does not know at or below a timestamp whose decisions
    /// it may have forgotten: to the coordinator, whose retries start above `floor`.
    Stale {
        /// The attempt.
        txn: TxnId,
        /// The timestamp to exceed.
        floor: Timestamp,
    },
    /// Hop `hop - 2` (or, for the last hop, `hop - 1`) voted long ago and has no decision:
    /// hop `hop` aborts the attempt on its behalf unless it voted (the paper's query to hop
    /// `i + 2`).
    Inquire {
        /// The attempt.
        txn: TxnId,
        /// Its timestamp.
        ts: Timestamp,
        /// The shards of its hops, in chain order.
        shards: Vec<ShardId>,
        /// The hop asked.
        hop: u32,
    },
    /// A replica of `shard` that does not lead it got a message for it: the leader it knows.
    Leader {
        /// The shard.
        shard: ShardId,
        /// Its leader, as the replica knows it.
        leader: NodeId,
    },
    /// A message for `shard`'s leader from node `from`, relayed by a replica of `shard` that
    /// does not lead it (once: a relayed message is never relayed again).
    Relay {
        /// The node that sent it.
        from: NodeId,
        /// The shard it is for.
        shard: ShardId,
        /// The message.
        msg: Relayed,
    },
    /// The shards' log messages.
    Raft {
        /// Per group.
        groups: Vec<RaftGroupMsgs>,
    },
}

/// The messages a replica relays to its shard's leader.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Relayed {
    /// A `Txn`.
    Txn(Box<Shipped>),
    /// A `Precommit`.
    Precommit {
        /// The attempt.
        txn: TxnId,
        /// The hop precommitting.
        hop: u32,
    },
    /// A `Decision` for the shard.
    Decision(Box<Decision>),
}
