//! The client pool both drivers use. Each client has at most one request outstanding, and the
//! pool offers load one of two ways ([`Load`]):
//!
//! - **closed loop**: a client submits its next request as soon as the previous one is
//!   answered (no think time);
//! - **open loop**: requests arrive as a Poisson process at a fixed rate, whatever the replies
//!   do; an arrival goes to an idle client, or waits in a bounded backlog until one is idle.
//!   Its latency is measured from its **arrival** (the intended start), not from when a
//!   client was free to send it, so the queueing an overloaded system causes shows in the
//!   latencies instead of hiding in a lower offered rate (coordinated omission). Arrivals
//!   beyond the backlog, or still waiting when the run stops, are counted as shed.
//!
//! The drivers hand the pool **true** time (virtual time in the simulator, wall time in the
//! runtime), so latencies are measured by a perfect clock whatever the nodes' skew.
//!
//! Request ids encode the client: `RequestId(client << 40 | counter)`, so a reply finds its
//! client without a lookup table. Completions queue up until the harness drains them; the queue
//! is bounded by [`COMPLETIONS_MAX`] (the oldest are dropped and counted if nobody drains).

use crate::TxnGenerator;
use meridian_core::node::{ClientDriver, ClientRequest};
use meridian_core::rng::{child_rng, uniform_f64, Rng};
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
/// Open loop: most arrivals waiting for an idle client; beyond it they are shed.
pub const BACKLOG_MAX: usize = 1 << 20;
/// Open loop: most arrivals one call of [`ClientDriver::on_time`] takes in (the rest are due at
/// once and come with the next call).
pub const ARRIVALS_PER_CALL_MAX: usize = 1 << 16;
/// Highest open-loop arrival rate, per second.
pub const RATE_PER_S_MAX: f64 = 1e8;

/// How a pool offers load.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Load {
    /// Each client submits again as soon as it is answered.
    Closed,
    /// Poisson arrivals at this many requests per second (over the pool).
    Open {
        /// Mean arrivals per second.
        rate_per_s: f64,
    },
}

impl Load {
    /// One line saying how `clients` clients (each with `outstanding` requests in flight under
    /// a closed loop) offer this load, for reports.
    pub fn describe(&self, clients: u32, outstanding: u32) -> String {
        match *self {
            Self::Closed => format!(
                "closed loop: {clients} clients, {outstanding} request{} outstanding each, no think time",
                if outstanding == 1 { "" } else { "s" }
            ),
            Self::Open { rate_per_s } => format!(
                "open loop: Poisson arrivals at {rate_per_s} txn/s, at most {clients} in flight; \
                 latency from each arrival"
            ),
        }
    }

    /// Checks the rate of an open loop.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            Self::Closed => Ok(()),
            Self::Open { rate_per_s } if rate_per_s > 0.0 && rate_per_s <= RATE_PER_S_MAX => Ok(()),
            Self::Open { rate_per_s } => Err(format!(
                "the open-loop rate must be in (0, {RATE_PER_S_MAX}] per second, got {rate_per_s}"
            )),
        }
    }
}

/// Open-loop arrivals: the next arrival's time and those waiting for an idle client.
struct Arrivals {
    rng: Rng,
    mean_gap_ns: f64,
    next_ns: Time,
    backlog: VecDeque<Time>,
    /// Clients with nothing outstanding, to take the next arrivals.
    idle: Vec<usize>,
    arrived: u64,
    shed: u64,
}

impl Arrivals {
    /// The gap to the next arrival: exponential with the mean gap.
    fn gap_ns(&mut self) -> Time {
        // 1 - u is in (0, 1], so the logarithm is finite.
        let u = 1.0 - uniform_f64(&mut self.rng);
        (-u.ln() * self.mean_gap_ns).round().max(1.0) as Time
    }
}

/// What an open-loop pool offered: arrivals so far and those shed (over the backlog, or not
/// started when the pool stopped).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offered {
    /// Arrivals drawn.
    pub arrived: u64,
    /// Arrivals never submitted.
    pub shed: u64,
}

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
    /// Wide-area one-way legs on the causal chain that completed it, when the driver counts
    /// them (the runtime does; the simulator reports its own).
    pub wan_hops: Option<u16>,
}

struct Client {
    number: u32,
    coordinator: NodeId,
    generator: Box<dyn TxnGenerator>,
    counter: u64,
    outstanding: Option<(RequestId, Time, TxnRequest)>,
}

/// A pool of clients offering closed- or open-loop load.
pub struct ClientPool {
    clients: Vec<Client>,
    /// Open loop only.
    arrivals: Option<Arrivals>,
    first_client: u32,
    stopped: bool,
    completions: VecDeque<Completion>,
    completions_dropped: u64,
    /// The legs the driver noted for the reply about to arrive.
    noted_hops: Option<(RequestId, u16)>,
    lost: u64,
    /// Requests whose coordinator crashed: (client, id, transaction, submitted at). Their
    /// outcome is unknown; histories record them as such.
    lost_requests: VecDeque<(u32, RequestId, TxnRequest, Time)>,
}

impl ClientPool {
    /// A closed-loop pool of clients numbered `first_client..`, each bound to a coordinator
    /// with its own generator.
    pub fn new(first_client: u32, clients: Vec<(NodeId, Box<dyn TxnGenerator>)>) -> Self {
        Self::with_load(first_client, clients, Load::Closed, 0)
    }

    /// A pool offering `load`; open-loop arrival times are drawn from `seed`. The rate must be
    /// valid ([`Load::validate`]).
    pub fn with_load(
        first_client: u32,
        clients: Vec<(NodeId, Box<dyn TxnGenerator>)>,
        load: Load,
        seed: u64,
    ) -> Self {
        assert!(first_client as usize + clients.len() <= CLIENTS_MAX as usize, "too many clients");
        let clients: Vec<Client> = clients
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
        let arrivals = match load {
            Load::Closed => None,
            Load::Open { rate_per_s } => {
                assert!(load.validate().is_ok(), "the rate was validated: {rate_per_s}");
                Some(Arrivals {
                    rng: child_rng(seed, "open-loop-arrivals", u64::from(first_client)),
                    mean_gap_ns: 1e9 / rate_per_s,
                    next_ns: 0,
                    backlog: VecDeque::new(),
                    idle: (0..clients.len()).rev().collect(),
                    arrived: 0,
                    shed: 0,
                })
            }
        };
        Self {
            clients,
            arrivals,
            first_client,
            stopped: false,
            completions: VecDeque::new(),
            completions_dropped: 0,
            noted_hops: None,
            lost: 0,
            lost_requests: VecDeque::new(),
        }
    }

    /// Stops submitting; outstanding requests still complete.
    pub fn stop(&mut self) {
        self.stopped = true;
        if let Some(a) = self.arrivals.as_mut() {
            a.shed += a.backlog.len() as u64;
            a.backlog.clear();
        }
    }

    /// Open loop: what was offered so far (`None` for a closed loop).
    pub fn offered(&self) -> Option<Offered> {
        self.arrivals.as_ref().map(|a| Offered { arrived: a.arrived, shed: a.shed })
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

    /// Client `index` submits its next request, counted from `intended` (now, or an
    /// open-loop arrival that waited).
    fn next_request(&mut self, index: usize, intended: Time) -> Option<(NodeId, ClientRequest)> {
        if self.stopped {
            return None;
        }
        let client = &mut self.clients[index];
        debug_assert!(client.outstanding.is_none());
        let id = request_id(client.number, client.counter);
        client.counter = (client.counter + 1) & REQUEST_COUNTER_MASK;
        let txn = client.generator.next(id);
        client.outstanding = Some((id, intended, txn.clone()));
        Some((client.coordinator, ClientRequest { id, txn }))
    }

    /// Client `index` has nothing outstanding: a closed loop sends its next request now; an
    /// open loop gives it the oldest waiting arrival, or marks it idle.
    fn on_idle(&mut self, index: usize, now: Time) -> Option<(NodeId, ClientRequest)> {
        let Some(arrivals) = self.arrivals.as_mut() else {
            return self.next_request(index, now);
        };
        match arrivals.backlog.pop_front() {
            Some(intended) => self.next_request(index, intended),
            None => {
                arrivals.idle.push(index);
                None
            }
        }
    }

    fn client_index(&self, request: RequestId) -> Option<usize> {
        let number = (request.0 >> COUNTER_BITS) as u32;
        let index = number.checked_sub(self.first_client)? as usize;
        (index < self.clients.len()).then_some(index)
    }
}

impl ClientDriver for ClientPool {
    fn start(&mut self, now: Time) -> Vec<(NodeId, ClientRequest)> {
        if let Some(arrivals) = self.arrivals.as_mut() {
            arrivals.next_ns = now + arrivals.gap_ns();
            return Vec::new();
        }
        (0..self.clients.len()).filter_map(|i| self.next_request(i, now)).collect()
    }

    fn next_arrival(&self) -> Option<Time> {
        self.arrivals.as_ref().filter(|_| !self.stopped).map(|a| a.next_ns)
    }

    fn on_time(&mut self, now: Time) -> Vec<(NodeId, ClientRequest)> {
        let mut submit = Vec::new();
        for _ in 0..ARRIVALS_PER_CALL_MAX {
            let Some(arrivals) = self.arrivals.as_mut().filter(|_| !self.stopped) else { break };
            if arrivals.next_ns > now {
                break;
            }
            let intended = arrivals.next_ns;
            arrivals.next_ns = intended + arrivals.gap_ns();
            arrivals.arrived += 1;
            match arrivals.idle.pop() {
                Some(index) => submit.extend(self.next_request(index, intended)),
                None if arrivals.backlog.len() < BACKLOG_MAX => {
                    arrivals.backlog.push_back(intended)
                }
                None => arrivals.shed += 1,
            }
        }
        submit
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
        let number = client.number;
        if self.completions.len() >= COMPLETIONS_MAX {
            self.completions.pop_front();
            self.completions_dropped += 1;
        }
        self.completions.push_back(Completion {
            client: number,
            coordinator: node,
            request,
            txn,
            submitted_at,
            completed_at: now,
            outcome: outcome.clone(),
            wan_hops: self.noted_hops.take().filter(|(r, _)| *r == request).map(|(_, h)| h),
        });
        self.on_idle(index, now).into_iter().collect()
    }

    fn note_wan_hops(&mut self, request: RequestId, hops: u16) {
        self.noted_hops = Some((request, hops));
    }

    fn on_crash(&mut self, node: NodeId) {
        for (index, client) in self.clients.iter_mut().enumerate() {
            if client.coordinator != node {
                continue;
            }
            if let Some((id, at, txn)) = client.outstanding.take() {
                self.lost += 1;
                if self.lost_requests.len() >= COMPLETIONS_MAX {
                    self.lost_requests.pop_front();
                }
                self.lost_requests.push_back((client.number, id, txn, at));
                // An open loop's client takes arrivals again (they go to the coordinator it
                // is bound to, and are lost while it is down).
                if let Some(arrivals) = self.arrivals.as_mut() {
                    arrivals.idle.push(index);
                }
            }
        }
    }

    fn on_restart(&mut self, now: Time, node: NodeId) -> Vec<(NodeId, ClientRequest)> {
        if self.arrivals.is_some() {
            return Vec::new(); // Arrivals keep coming whatever happens.
        }
        let idle: Vec<usize> = (0..self.clients.len())
            .filter(|&i| {
                self.clients[i].coordinator == node && self.clients[i].outstanding.is_none()
            })
            .collect();
        idle.into_iter().filter_map(|i| self.next_request(i, now)).collect()
    }

    fn stop(&mut self) {
        ClientPool::stop(self);
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
        let mut pool = ClientPool::new(
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

    #[test]
    fn an_open_loop_arrives_at_its_rate_and_counts_latency_from_the_arrival() {
        // One client, 1,000 arrivals per second, a service time far above the gap: arrivals
        // queue, and each completion's latency includes its wait for the client.
        let mut pool = ClientPool::with_load(
            0,
            vec![(NodeId(0), Box::new(Counter))],
            Load::Open { rate_per_s: 1_000.0 },
            7,
        );
        assert!(pool.start(0).is_empty(), "nothing is sent before the first arrival");
        let first_at = pool.next_arrival().unwrap();
        let sent = pool.on_time(first_at);
        assert_eq!(sent.len(), 1);
        // A second's worth of arrivals while the request is outstanding: they wait.
        let mut now = first_at;
        while now < first_at + 1_000_000_000 {
            now = pool.next_arrival().unwrap();
            assert!(pool.on_time(now).is_empty(), "one client, one request outstanding");
        }
        let offered = pool.offered().unwrap();
        assert!((900..1_100).contains(&offered.arrived), "about 1,000 arrivals: {offered:?}");
        // The reply releases the client, which takes the oldest waiting arrival at once.
        let next = pool.on_reply(now, NodeId(0), sent[0].1.id, &committed());
        assert_eq!(next.len(), 1);
        let next_reply = pool.on_reply(now + 5, NodeId(0), next[0].1.id, &committed());
        assert_eq!(next_reply.len(), 1, "another waiting arrival");
        let done = pool.drain_completions();
        assert_eq!(done[0].submitted_at, first_at);
        assert!(done[1].submitted_at > first_at && done[1].submitted_at < first_at + 10_000_000);
        assert!(
            done[1].completed_at - done[1].submitted_at > 900_000_000,
            "the second request waited nearly a second for the client, and its latency says so"
        );
        pool.stop();
        assert!(pool.next_arrival().is_none());
        let offered = pool.offered().unwrap();
        assert_eq!(offered.shed, offered.arrived - 3, "the backlog is shed at the stop");
        assert!(pool.on_reply(now + 9, NodeId(0), next_reply[0].1.id, &committed()).is_empty());
        assert!(pool.finished());
    }

    #[test]
    fn an_open_loop_with_idle_clients_sends_each_arrival_at_once() {
        let clients: Vec<(NodeId, Box<dyn TxnGenerator>)> =
            (0..4).map(|i| (NodeId(i), Box::new(Counter) as Box<dyn TxnGenerator>)).collect();
        let mut pool = ClientPool::with_load(0, clients, Load::Open { rate_per_s: 10.0 }, 1);
        pool.start(0);
        let mut sent = Vec::new();
        for _ in 0..4 {
            let at = pool.next_arrival().unwrap();
            sent.extend(pool.on_time(at).into_iter().map(|r| (at, r)));
        }
        assert_eq!(sent.len(), 4, "four idle clients take four arrivals");
        let coordinators: std::collections::BTreeSet<NodeId> =
            sent.iter().map(|(_, (n, _))| *n).collect();
        assert_eq!(coordinators.len(), 4);
        assert!(Load::Open { rate_per_s: 0.0 }.validate().is_err());
        assert!(Load::Open { rate_per_s: f64::NAN }.validate().is_err());
    }
}
