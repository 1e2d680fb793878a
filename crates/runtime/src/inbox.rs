//! What arrives in a node task's inbox ([`Inbound`]): messages from the network or from
//! nodes of this process, persist completions, client calls, and the stop. Its own module so
//! that the senders (the TCP layer, the storage thread, client handles) and the node task
//! meet at this type without depending on each other.

use meridian_core::node::{ClientRequest, PersistToken, SessionRequest};
use meridian_core::txn::TxnOutcome;
use meridian_core::{NodeId, RequestId};
use tokio::sync::oneshot;

/// What arrives in a node's inbox.
#[derive(Debug)]
pub enum Inbound<M> {
    /// A message from another node, with the sender's wall-clock send time.
    Msg {
        /// Sender.
        from: NodeId,
        /// Sender's send time (ns since the Unix epoch).
        sent_at_ns: u64,
        /// Wide-area legs on the causal chain that led to it, its own included.
        hops: u16,
        /// The message.
        msg: M,
    },
    /// Messages from another node of this process, in the order it sent them: what it sent
    /// to this node during one pass of its loop, handed over together so that the receiver
    /// is woken once for them, not once per message.
    Msgs {
        /// Sender.
        from: NodeId,
        /// Send times (ns since the Unix epoch), wide-area legs, and messages.
        msgs: Vec<(u64, u16, M)>,
    },
    /// The storage thread made this persist durable.
    Persisted {
        /// The node's token.
        token: PersistToken,
        /// The life of the node that asked (its crash count): a completion of a node that
        /// crashed since is dropped, since the restarted node numbers its tokens afresh.
        life: u64,
    },
    /// A call from a client library in this process (not a pool of the benchmark): run it
    /// and send the reply back on `reply`.
    Client {
        /// What to run.
        call: ClientCall,
        /// Where the reply goes.
        reply: oneshot::Sender<TxnOutcome>,
    },
    /// Finish and hand the node back.
    Stop,
}

/// What a client library asks a coordinator node of this process to do.
#[derive(Debug)]
pub enum ClientCall {
    /// Run a transaction (a registered procedure).
    Submit(ClientRequest),
    /// Take a step of an interactive transaction.
    Session(SessionRequest),
}

impl ClientCall {
    pub(crate) fn id(&self) -> RequestId {
        match self {
            Self::Submit(request) => request.id,
            Self::Session(request) => request.id,
        }
    }
}
