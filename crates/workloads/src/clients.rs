//! Closed-loop clients: each client has at most one request outstanding and submits the next as
//! soon as the previous one is answered (no think time). Both drivers use this pool, handing it
//! **true** time (virtual time in the simulator, wall time in the runtime), so latencies are
//! measured by a perfect clock whatever the nodes' skew.
//!
//! Request ids encode the client: `RequestId(client << 40 | counter)`, so a reply finds its
//! client without a lookup table. Completions queue up until the harness drains them; the queue
//! is bounded by [`COMPLETIONS_MAX`] (the oldest are dropped and counted if nobody drains).

use crate::TxnGenerator;
use meridian_core::node::{ClientDriver, ClientRequest};
use meridian_core::txn::{TxnOutcome, TxnRequest};
use meridian_core::{NodeId, RequestId, Time};
use std::collections::VecDeque;

/// Most completions held before the oldest are dropped.
pub const COMPLETIONS_MAX: usize = 1 << 20;
/// Bits of a request id that count a client's requests.
const COUNTER_BITS: u32 = 40;
/// The counter part of a request id.
pub const REQUEST_COUNTER_MASK: u64 = (1 << COUNTER_BITS) - 1;
/// Most clients one pool may hold (client numbers must fit above the counter bits).
pub const CLIENTS_MAX: u32 = 1 << 20;

const _: () = assert!(COUNTER_BITS + 20 <= 64);

/// The id of client `number`'s request number `counter` (the counter wraps at 2^40).
pub fn request_id(number: u32, counter: u64) -> RequestId {
    RequestId((u64::from(number) << COUNTER_BITS) | (counter & REQUEST_COUNTER_MASK))
}

/// One finished request.
#[derive(Clone, Debug)]
pub struct Completion {
    /// The client number (global across pools).
    pub client: u32,
    /// The coordinator that ran it.
    pub coordinator: NodeId,
    /// The request id.
    pub request: RequestId,
    /// What was asked.
    pub txn: TxnRequest,
    /// True time it was submitted.
    pub submitted_at: Time,
    /// True time the reply arrived.
    pub completed_at: Time,
    /// The reply.
    pub outcome: TxnOutcome,
}

struct Client {
    number: u32,
    coordinator: NodeId,
    generator: Box<dyn TxnGenerator>,
    counter: u64,
    outstanding: Option<(RequestId, Time, TxnRequest)>,
}

/// A pool of closed-loop clients.
pub struct ClosedLoopClients {
    clients: Vec<Client>,
    first_client: u32,
    stopped: bool,
    completions: VecDeque<Completion>,
    completions_dropped: u64,
    lost: u64,
    /// Requests whose coordinator crashed: (client, id, transaction, submitted at). Their
    /// outcome is unknown; histories record them as such.
    lost_requests: VecDeque<(u32, RequestId, TxnRequest, Time)>,
}

impl ClosedLoopClients {
    /// A pool of clients numbered `first_client..`, each bound to a coordinator with its own
    /// generator.
    pub fn new(first_client: u32, clients: Vec<(NodeId, Box<dyn TxnGenerator>)>) -> Self {
        assert!(first_client as usize + clients.len() <= CLIENTS_MAX as usize, "too many clients");
        let clients = clients
            .into_iter()
            .enumerate()
            .map(|(i, (coordinator, generator))| Client {
                number: first_client + i as u32,
                coordinator,
                generator,
                counter: 0,
                outstanding: None,
            })
            .collect();
        Self {
            clients,
            first_client,
            stopped: false,
            completions: VecDeque::new(),
            completions_dropped: 0,
            lost: 0,
            lost_requests: VecDeque::new(),
        }
    }

    /// Stops submitting; outstanding requests still complete.
    pub fn stop(&mut self) {
        self.stopped = true;
    }

    /// Takes the completions queued so far.
    pub fn drain_completions(&mut self) -> Vec<Completion> {
        self.completions.drain(..).collect()
    }

    /// Completions dropped because nobody drained them, and requests lost to crashes.
    pub fn dropped_and_lost(&self) -> (u64, u64) {
        (self.completions_dropped, self.lost)
    }

    /// The requests never answered: those lost with a crashed coordinator (the newest
    /// [`COMPLETIONS_MAX`]) and those outstanding now, as (client, id, transaction, submitted at).
    pub fn unanswered_requests(&self) -> Vec<(u32, RequestId, TxnRequest, Time)> {
        let outstanding = self.clients.iter().filter_map(|c| {
            let (id, at, txn) = c.outstanding.as_ref()?;
            Some((c.number, *id, txn.clone(), *at))
        });
        self.lost_requests.iter().cloned().chain(outstanding).collect()
    }

    /// Requests now outstanding.
    pub fn outstanding(&self) -> usize {
        self.clients.iter().filter(|c| c.outstanding.is_some()).count()
    }

    fn next_request(&mut self, index: usize, now: Time) -> Option<(NodeId, ClientRequest)> {
        if self.stopped {
            return None;
        }
        let client = &mut self.clients[index];
        debug_assert!(client.outstanding.is_none());
        let id = request_id(client.number, client.counter);
        client.counter = (client.counter + 1) & REQUEST_COUNTER_MASK;
        let txn = client.generator.next(id);
        client.outstanding = Some((id, now, txn.clone()));
        Some((client.coordinator, ClientRequest { id, txn }))
    }

    fn client_index(&self, request: RequestId) -> Option<usize> {
        let number = (request.0 >> COUNTER_BITS) as u32;
        let index = number.checked_sub(self.first_client)? as usize;
        (index < self.clients.len()).then_some(index)
    }
}

impl ClientDriver for ClosedLoopClients {
    fn start(&mut self, now: Time) -> Vec<(NodeId, ClientRequest)> {
        (0..self.clients.len()).filter_map(|i| self.next_request(i, now)).collect()
    }

    fn on_reply(
        &mut self,
        now: Time,
        node: NodeId,
        request: RequestId,
        outcome: &TxnOutcome,
    ) -> Vec<(NodeId, ClientRequest)> {
        let Some(index) = self.client_index(request) else {
            return Vec::new();
        };
        let client = &mut self.clients[index];
        // A reply for anything but the outstanding request (a duplicate) is ignored.
        let Some((id, submitted_at, _)) = &client.outstanding else {
            return Vec::new();
        };
        if *id != request || client.coordinator != node {
            return Vec::new();
        }
        let submitted_at = *submitted_at;
        let (_, _, txn) = client.outstanding.take().expect("checked above");
        client.generator.on_reply(request, outcome);
        if self.completions.len() >= COMPLETIONS_MAX {
            self.completions.pop_front();
            self.completions_dropped += 1;
        }
        self.completions.push_back(Completion {
            client: client.number,
            coordinator: node,
            request,
            txn,
            submitted_at,
            completed_at: now,
            outcome: outcome.clone(),
        });
        self.next_request(index, now).into_iter().collect()
    }

    fn on_crash(&mut self, node: NodeId) {
        for client in self.clients.iter_mut().filter(|c| c.coordinator == node) {
            if let Some((id, at, txn)) = client.outstanding.take() {
                self.lost += 1;
                if self.lost_requests.len() >= COMPLETIONS_MAX {
                    self.lost_requests.pop_front();
                }
                self.lost_requests.push_back((client.number, id, txn, at));
            }
        }
    }

    fn on_restart(&mut self, now: Time, node: NodeId) -> Vec<(NodeId, ClientRequest)> {
        let idle: Vec<usize> = (0..self.clients.len())
            .filter(|&i| {
                self.clients[i].coordinator == node && self.clients[i].outstanding.is_none()
            })
            .collect();
        idle.into_iter().filter_map(|i| self.next_request(i, now)).collect()
    }

    fn stop(&mut self) {
        ClosedLoopClients::stop(self);
    }

    fn finished(&self) -> bool {
        self.stopped && self.outstanding() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::txn::{ProcId, TxnResult};

    struct Counter;
    impl TxnGenerator for Counter {
        fn next(&mut self, request: RequestId) -> TxnRequest {
            TxnRequest { proc: ProcId(0), args: vec![meridian_core::txn::Datum::Uint(request.0)] }
        }
    }

    fn committed() -> TxnOutcome {
        TxnOutcome {
            result: TxnResult::Committed,
            outputs: vec![],
            commit_ts: None,
            retries: 0,
            shards_touched: 1,
            path: meridian_core::txn::CommitPath::None,
            aborts: Default::default(),
            speculative_ns: None,
        }
    }

    #[test]
    fn each_client_keeps_one_request_outstanding() {
        let mut pool = ClosedLoopClients::new(
            3,
            vec![(NodeId(0), Box::new(Counter)), (NodeId(1), Box::new(Counter))],
        );
        let first = pool.start(100);
        assert_eq!(first.len(), 2);
        assert_eq!(pool.outstanding(), 2);
        let (node, request) = &first[1];
        assert_eq!(*node, NodeId(1));
        // A reply from the wrong node or for an unknown request changes nothing.
        assert!(pool.on_reply(150, NodeId(0), request.id, &committed()).is_empty());
        assert!(pool.on_reply(150, NodeId(1), RequestId(12345), &committed()).is_empty());
        let next = pool.on_reply(200, NodeId(1), request.id, &committed());
        assert_eq!(next.len(), 1);
        assert_ne!(next[0].1.id, request.id);
        // The duplicate reply is ignored.
        assert!(pool.on_reply(210, NodeId(1), request.id, &committed()).is_empty());
        let done = pool.drain_completions();
        assert_eq!(done.len(), 1);
        assert_eq!((done[0].client, done[0].submitted_at, done[0].completed_at), (4, 100, 200));
        pool.stop();
        assert!(pool.on_reply(300, NodeId(1), next[0].1.id, &committed()).is_empty());
        assert!(!pool.finished());
        pool.on_crash(NodeId(0));
        assert!(pool.finished());
        assert_eq!(pool.dropped_and_lost(), (0, 1));
    }
}
