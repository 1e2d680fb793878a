//! The node task and the cluster of tasks in one process.
//!
//! A node task owns its node and follows the driver contract: one entry point at a time, then
//! the outbox drained in order (sends, timers, persists, replies). Inbound messages are handled
//! in batches of at most [`INBOUND_BATCH_MAX`] before timers and client submissions get a turn,
//! so no source starves the others.
//!
//! Sending never waits: a message to a full queue (another node's inbox, a TCP writer to an
//! unreachable peer) is dropped and counted ([`Cluster::dropped_messages`]), as a lossy link
//! would drop it. A node task or the delay thread blocked on one full queue would otherwise
//! stall every link of the process.

use crate::clock::WallClock;
use crate::delay::DelayThread;
pub use crate::inbox::{ClientCall, Inbound};
use crate::logstore::{PersistJob, Storage};
use crate::metrics::{LinkSnapshot, MetricsHub, NodeSnapshot, METRICS_INTERVAL_NS};
use crate::tcp::{self, TcpConfig};
use hdrhistogram::Histogram;
use meridian_core::clock::{ClockModel, NodeClock};
use meridian_core::netmodel::{Jitter, LinkModel, LinkState, NetworkModel};
use meridian_core::node::{
    ClientDriver, ClientRequest, Effect, Node, Outbox, PersistToken, TimerId,
};
use meridian_core::rng::child_rng;
use meridian_core::time::NS_PER_US;
use meridian_core::topology::Topology;
use meridian_core::txn::{TxnFailure, TxnOutcome};
use meridian_core::wire::Envelope;
use meridian_core::NodeId;
use meridian_core::RequestId;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};

/// Messages a node's inbox holds before senders wait. Closed-loop load keeps far fewer in flight.
pub const INBOX_MESSAGES_MAX: usize = 1 << 16;
/// Inbound messages handled per loop pass before timers and submissions get a turn.
pub const INBOUND_BATCH_MAX: usize = 256;
/// Client submissions handled per loop pass.
pub const SUBMITS_PER_PASS_MAX: usize = 4_096;
/// Messages held for one in-process destination before they are handed over without waiting
/// for the end of the pass.
pub const HELD_MESSAGES_MAX: usize = 64;
/// Largest one-way delay recorded (µs); longer ones are clamped.
const DELAY_US_MAX: u64 = 60_000_000;

/// Most calls of a client library one node has in progress; beyond it a call is refused.
pub const CLIENT_CALLS_MAX: usize = 1 << 16;

/// A client library's way into one coordinator node of this process. Cloneable; calls from
/// several tasks run concurrently (each has its own request id).
#[derive(Clone)]
pub struct ClientHandle {
    submit: Arc<dyn Fn(ClientCall, oneshot::Sender<TxnOutcome>) -> bool + Send + Sync>,
}

impl std::fmt::Debug for ClientHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientHandle")
    }
}

impl ClientHandle {
    /// Hands `call` to the node and waits for its reply. An error when the node is gone or
    /// its inbox is full.
    pub async fn call(&self, call: ClientCall) -> Result<TxnOutcome, String> {
        let (tx, rx) = oneshot::channel();
        if !(self.submit)(call, tx) {
            return Err("the coordinator is stopped or overloaded".into());
        }
        rx.await.map_err(|_| "the coordinator stopped before it answered".to_string())
    }

    /// Hands `call` to the node without waiting for the reply (which is dropped). False when
    /// the node is gone or its inbox is full.
    pub fn send(&self, call: ClientCall) -> bool {
        let (tx, _rx) = oneshot::channel();
        (self.submit)(call, tx)
    }
}

/// A fault injected into one node task of this process (the real-time counterpart of the
/// simulator's faults; `meridian_core::fault` names them).
pub enum NodeFault<N> {
    /// The node stops: its state, timers and undelivered messages are gone, messages to it
    /// are dropped, its clients lose their requests in flight. Told on the channel, if any,
    /// once it has stopped.
    Crash(Option<oneshot::Sender<()>>),
    /// A crashed node comes back as `node` (built from what its log holds), persisting to
    /// `storage`.
    Restart {
        /// The node, built afresh.
        node: N,
        /// Its reopened log, if durable.
        storage: Option<Storage>,
    },
    /// The node's clock jumps by this many nanoseconds (forward when positive).
    ClockStep(i64),
}

/// Fault commands queued for one node task; the fault driver sends a handful per fault.
pub const NODE_FAULTS_QUEUED_MAX: usize = 64;

/// Which directed links of the process are cut (a partition injected in real time), as a
/// count of the cuts holding each link (faults may overlap). Checked on every send: one
/// relaxed atomic load.
#[derive(Debug)]
pub struct Cuts {
    nodes: usize,
    cut: Vec<AtomicU32>,
    /// Messages dropped because their link was cut.
    dropped: AtomicU64,
}

impl Cuts {
    fn new(nodes: usize) -> Self {
        Self {
            nodes,
            cut: (0..nodes * nodes).map(|_| AtomicU32::new(0)).collect(),
            dropped: AtomicU64::new(0),
        }
    }

    fn index(&self, from: NodeId, to: NodeId) -> Option<usize> {
        let (from, to) = (from.0 as usize, to.0 as usize);
        (from < self.nodes && to < self.nodes).then_some(from * self.nodes + to)
    }

    /// Adds a cut of the link from `from` to `to` (`cut`), or lifts one (the link carries
    /// messages again once no cut holds it).
    pub fn set(&self, from: NodeId, to: NodeId, cut: bool) {
        if let Some(index) = self.index(from, to) {
            let count = &self.cut[index];
            if cut {
                count.fetch_add(1, Ordering::Relaxed);
            } else {
                let _ =
                    count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            }
        }
    }

    fn is_cut(&self, from: NodeId, to: NodeId) -> bool {
        self.index(from, to).is_some_and(|index| self.cut[index].load(Ordering::Relaxed) > 0)
    }

    /// Messages dropped at a cut link so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Where messages to one destination go.
#[derive(Clone)]
enum Route<M> {
    Local(mpsc::Sender<Inbound<M>>),
    Remote(mpsc::Sender<Envelope<M>>),
}

impl<M: Send + 'static> Route<M> {
    /// Hands `msg` over without waiting; false (and counted in `dropped`) when the queue is
    /// full or gone.
    fn deliver(
        &self,
        from: NodeId,
        (sent_at_ns, hops): (u64, u16),
        msg: M,
        dropped: &AtomicU64,
    ) -> bool {
        let sent = match self {
            Self::Local(tx) => tx.try_send(Inbound::Msg { from, sent_at_ns, hops, msg }).is_ok(),
            Self::Remote(tx) => tx.try_send(Envelope { sent_at_ns, hops, msg }).is_ok(),
        };
        if !sent {
            dropped.fetch_add(1, Ordering::Relaxed);
        }
        sent
    }
}

/// One outgoing directed link.
struct LinkOut<M> {
    model: LinkModel,
    state: LinkState,
    route: Route<M>,
    /// True when the model injects delay: messages go through the delay thread.
    delayed: bool,
}

/// Measured one-way delays of one directed link, as the receiver saw them.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkDelays {
    /// Sender.
    pub from: NodeId,
    /// Receiver.
    pub to: NodeId,
    /// Messages measured.
    pub count: u64,
    /// Median measured one-way delay (µs).
    pub p50_us: u64,
    /// 99th percentile (µs).
    pub p99_us: u64,
    /// Largest (µs).
    pub max_us: u64,
    /// Configured median (µs): the link model's long-run median.
    pub configured_p50_us: u64,
    /// Median of the delays the link model drew for this link during the run (µs), after the
    /// FIFO clamp; known when the sender ran in this process. The emulation's own error is
    /// measured against this, because a slowly varying (`walk`) link wanders around its
    /// configured median for longer than a short run lasts.
    pub drawn_p50_us: Option<u64>,
}

/// What a node task hands back when stopped.
pub struct NodeResult<N> {
    /// The node id.
    pub id: NodeId,
    /// The node, with its final state.
    pub node: N,
    /// Delays measured on links into this node.
    pub delays: Vec<LinkDelays>,
    /// Median delay drawn from the link model per destination of this node's messages (µs).
    pub drawn_p50_us: BTreeMap<NodeId, u64>,
    /// False when the node was crashed (and not restarted) at the stop: `node` is then the
    /// state it had when it crashed.
    pub up: bool,
    /// Messages from other nodes it handled, over the whole run (what the simulator counts
    /// as deliveries).
    pub messages_received: u64,
}

/// Shared by every task of a cluster.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The layout.
    pub topology: Arc<Topology>,
    /// The link model.
    pub network: NetworkModel,
    /// The clock model.
    pub clock: ClockModel,
    /// Master seed (link jitter and clock draws).
    pub seed: u64,
    /// TCP settings when some nodes live in other processes.
    pub tcp: Option<TcpConfig>,
    /// Where node tasks publish metrics snapshots, when an endpoint serves them.
    pub metrics: Option<Arc<MetricsHub>>,
    /// The process's storage thread; `None` is memory durability (persists complete at once).
    pub storage: Option<Storage>,
    /// Storage threads of particular nodes, used instead of `storage` (an embedded cluster
    /// whose nodes crash and restart gives each node a log of its own, as a process has).
    pub node_storage: BTreeMap<NodeId, Storage>,
}

/// A node to run in this process: its id, the node, and (for a coordinator driven by clients in
/// this process) its client pool.
pub type LocalNode<N, C> = (NodeId, N, Option<Arc<Mutex<C>>>);

/// The node tasks of this process. Each node runs on its own thread with a single-threaded
/// tokio runtime, like one event loop per node: the operating system spreads nodes over cores,
/// whereas one shared multi-threaded runtime tends to run a sender and the receiver it wakes on
/// the same worker, leaving the other cores idle.
pub struct Cluster<N: Node> {
    inboxes: BTreeMap<NodeId, mpsc::Sender<Inbound<N::Msg>>>,
    results: Vec<oneshot::Receiver<NodeResult<N>>>,
    listeners: Vec<JoinHandle<()>>,
    dropped: Arc<AtomicU64>,
    /// The TCP links' counters, when the cluster spans processes.
    tcp_stats: Option<Arc<tcp::TcpStats>>,
    failures: Arc<NodeFailures>,
    faults: BTreeMap<NodeId, mpsc::Sender<NodeFault<N>>>,
    cuts: Arc<Cuts>,
}

/// Nodes of the process that panicked: their messages, and a notification for whoever waits.
#[derive(Debug, Default)]
pub struct NodeFailures {
    panics: Mutex<Vec<(NodeId, String)>>,
    notify: tokio::sync::Notify,
}

impl NodeFailures {
    fn record(&self, node: NodeId, message: String) {
        self.panics.lock().expect("failures lock").push((node, message));
        self.notify.notify_waiters();
        self.notify.notify_one();
    }

    /// `(node, panic message)` of every node that panicked so far.
    pub fn panics(&self) -> Vec<(NodeId, String)> {
        self.panics.lock().expect("failures lock").clone()
    }

    /// Waits until some node panics (at once if one already has).
    pub async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            if !self.panics().is_empty() {
                return;
            }
            notified.await;
        }
    }
}

impl<N: Node> Cluster<N> {
    /// Starts a task per local node. Nodes not listed are remote and need `config.tcp`.
    pub async fn start<C: ClientDriver + Send + 'static>(
        config: ClusterConfig,
        local: Vec<LocalNode<N, C>>,
    ) -> std::io::Result<Self> {
        let topology = config.topology.clone();
        let mut inboxes = BTreeMap::new();
        let mut receivers = BTreeMap::new();
        for (id, _, _) in &local {
            let (tx, rx) = mpsc::channel(INBOX_MESSAGES_MAX);
            inboxes.insert(*id, tx);
            receivers.insert(*id, rx);
        }
        let mut listeners = Vec::new();
        if let Some(tcp) = &config.tcp {
            for (&id, inbox) in &inboxes {
                listeners.push(tcp::listen::<N::Msg>(id, tcp.clone(), inbox.clone()).await?);
            }
        }
        let clock = WallClock::new();
        let delay = DelayThread::spawn()?;
        let dropped = Arc::new(AtomicU64::new(0));
        let cuts = Arc::new(Cuts::new(topology.nodes.len()));
        let mut faults = BTreeMap::new();
        let failures = Arc::new(NodeFailures::default());
        if let Some(hub) = &config.metrics {
            hub.add_process_counter("runtime_messages_dropped_total", dropped.clone());
            if let Some(tcp) = &config.tcp {
                hub.set_tcp_stats(tcp.stats.clone());
            }
        }
        let mut results = Vec::new();
        for (id, node, clients) in local {
            let links = build_links(id, &config, &inboxes)?;
            let skew =
                config.clock.draw(&mut child_rng(config.seed, "runtime-clock", u64::from(id.0)));
            let (fault_tx, fault_rx) = mpsc::channel(NODE_FAULTS_QUEUED_MAX);
            faults.insert(id, fault_tx);
            let task = NodeTask {
                id,
                node,
                up: true,
                life: 0,
                received: 0,
                inbox: receivers.remove(&id).expect("inbox built above"),
                faults: fault_rx,
                cuts: cuts.clone(),
                self_queue: VecDeque::new(),
                links,
                clock,
                skew,
                timers: BinaryHeap::new(),
                timer_seq: 0,
                hops: 0,
                clients,
                open_loop: false,
                pending_submits: VecDeque::new(),
                waiters: BTreeMap::new(),
                persisted: VecDeque::new(),
                persist_hops: BTreeMap::new(),
                storage: config.node_storage.get(&id).or(config.storage.as_ref()).cloned(),
                self_inbox: inboxes[&id].clone(),
                outbox: Outbox::new(),
                delays: BTreeMap::new(),
                drawn: BTreeMap::new(),
                network: config.network.clone(),
                topology: topology.clone(),
                delay: delay.clone(),
                metrics: config.metrics.clone(),
                dropped: dropped.clone(),
                held: (0..topology.nodes.len()).map(|_| Vec::new()).collect(),
                started_ns: clock.now_ns(),
                published_ns: 0,
            };
            let (done, result) = oneshot::channel();
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let failed = failures.clone();
            std::thread::Builder::new().name(format!("node-{}", id.0)).spawn(move || {
                // A panicking node (an assertion in protocol code) must fail the run with its
                // message, not leave the others waiting on a node that is gone.
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    runtime.block_on(task.run())
                }));
                match run {
                    Ok(result) => {
                        let _ = done.send(result);
                    }
                    Err(panic) => {
                        let message = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "a panic".into());
                        failed.record(id, message);
                    }
                }
            })?;
            results.push(result);
        }
        let tcp_stats = config.tcp.as_ref().map(|tcp| tcp.stats.clone());
        Ok(Self { inboxes, results, listeners, dropped, tcp_stats, failures, faults, cuts })
    }

    /// Hands `fault` to local node `node`'s task; false when the node is not local or its
    /// task is gone.
    pub async fn inject(&self, node: NodeId, fault: NodeFault<N>) -> bool {
        match self.faults.get(&node) {
            Some(tx) => tx.send(fault).await.is_ok(),
            None => false,
        }
    }

    /// The process's link cuts (`Cuts::set` cuts or restores a link at once).
    pub fn cuts(&self) -> Arc<Cuts> {
        self.cuts.clone()
    }

    /// The nodes of this process that panicked so far, and a way to wait for one.
    pub fn failures(&self) -> Arc<NodeFailures> {
        self.failures.clone()
    }

    /// Messages dropped so far because a queue was full (an inbox, a TCP writer) or a TCP
    /// writer shed its queue while its peer was unreachable.
    pub fn dropped_messages(&self) -> u64 {
        let shed = self.tcp_stats.as_ref().map_or(0, |s| s.dropped.load(Ordering::Relaxed));
        self.dropped.load(Ordering::Relaxed) + shed
    }

    /// A client library's handle on local node `node` (a coordinator), if it runs here.
    pub fn client(&self, node: NodeId) -> Option<ClientHandle> {
        let inbox = self.inboxes.get(&node)?.clone();
        let submit = move |call: ClientCall, reply: oneshot::Sender<TxnOutcome>| {
            inbox.try_send(Inbound::Client { call, reply }).is_ok()
        };
        Some(ClientHandle { submit: Arc::new(submit) })
    }

    /// Stops every local node and returns them with their measured delays.
    pub async fn stop(mut self) -> Vec<NodeResult<N>> {
        self.faults.clear();
        for inbox in self.inboxes.values() {
            let _ = inbox.send(Inbound::Stop).await;
        }
        for listener in &self.listeners {
            listener.abort();
        }
        let mut results = Vec::new();
        for result in self.results {
            if let Ok(result) = result.await {
                results.push(result);
            }
        }
        let drawn: BTreeMap<(NodeId, NodeId), u64> = results
            .iter()
            .flat_map(|r| r.drawn_p50_us.iter().map(|(&to, &us)| ((r.id, to), us)))
            .collect();
        for result in &mut results {
            for link in &mut result.delays {
                link.drawn_p50_us = drawn.get(&(link.from, link.to)).copied();
            }
        }
        results
    }
}

/// Adds one delay (ns) to the histogram of `peer`, in µs, clamped to [`DELAY_US_MAX`].
fn record_delay(histograms: &mut BTreeMap<NodeId, Histogram<u64>>, peer: NodeId, delay_ns: u64) {
    let histogram = histograms.entry(peer).or_insert_with(|| {
        Histogram::new_with_bounds(1, DELAY_US_MAX, 3).expect("valid histogram bounds")
    });
    let _ = histogram.record((delay_ns / NS_PER_US).clamp(1, DELAY_US_MAX));
}

/// Builds the outgoing links of `from`: a route per destination, marked delayed when the link
/// model injects delay. TCP never loses messages, so the model's loss is not applied here.
fn build_links<M: meridian_core::node::Message>(
    from: NodeId,
    config: &ClusterConfig,
    inboxes: &BTreeMap<NodeId, mpsc::Sender<Inbound<M>>>,
) -> std::io::Result<Vec<Option<LinkOut<M>>>> {
    let topology = &config.topology;
    let mut links = Vec::with_capacity(topology.nodes.len());
    for to in topology.node_ids() {
        let route = match (inboxes.get(&to), &config.tcp) {
            (Some(inbox), _) => Route::Local(inbox.clone()),
            (None, Some(tcp)) => Route::Remote(tcp::spawn_writer::<M>(from, to, tcp.clone())),
            (None, None) => {
                return Err(std::io::Error::other(format!(
                    "node {to} is not local and no TCP addresses are configured"
                )))
            }
        };
        let mut model = config
            .network
            .link(topology.region_of(from).0 as usize, topology.region_of(to).0 as usize);
        model.loss = 0.0;
        let delayed = model.delay_ns > 0 || model.jitter != Jitter::None;
        let state = LinkState::new(child_rng(
            config.seed,
            "runtime-link",
            (u64::from(from.0) << 32) | u64::from(to.0),
        ));
        links.push(Some(LinkOut { model, state, route, delayed }));
    }
    Ok(links)
}

struct NodeTask<N: Node, C> {
    id: NodeId,
    node: N,
    /// False while crashed.
    up: bool,
    /// Crashes so far: persist completions carry the life that asked for them.
    life: u64,
    /// Messages from other nodes handled so far (a plain count: only this task touches it).
    received: u64,
    inbox: mpsc::Receiver<Inbound<N::Msg>>,
    faults: mpsc::Receiver<NodeFault<N>>,
    cuts: Arc<Cuts>,
    /// Messages to itself, with the legs of the call that sent them.
    self_queue: VecDeque<(u16, N::Msg)>,
    links: Vec<Option<LinkOut<N::Msg>>>,
    clock: WallClock,
    skew: NodeClock,
    /// Timers by due time, with the wide-area legs of the call that set them.
    timers: BinaryHeap<Reverse<(Instant, u64, TimerId, u16)>>,
    timer_seq: u64,
    /// Wide-area legs on the causal chain of the call in progress (see `Envelope::hops`):
    /// what a send adds to, what a timer or persist carries, and what a reply reports.
    hops: u16,
    clients: Option<Arc<Mutex<C>>>,
    /// The clients offer open-loop load: they submit at their arrival times, not only on
    /// replies (looked at once, at the start, so a closed loop costs the loop nothing).
    open_loop: bool,
    pending_submits: VecDeque<ClientRequest>,
    /// Calls of client libraries in progress: where each reply goes.
    waiters: BTreeMap<RequestId, oneshot::Sender<TxnOutcome>>,
    /// Persists completed at once (memory durability), with the legs of the call that asked.
    persisted: VecDeque<(PersistToken, u16)>,
    /// Legs of the calls whose persists the storage thread is writing.
    persist_hops: BTreeMap<PersistToken, u16>,
    storage: Option<Storage>,
    /// This node's own inbox, for the storage thread's completions.
    self_inbox: mpsc::Sender<Inbound<N::Msg>>,
    outbox: Outbox<N::Msg>,
    delays: BTreeMap<NodeId, Histogram<u64>>,
    drawn: BTreeMap<NodeId, Histogram<u64>>,
    network: NetworkModel,
    topology: Arc<Topology>,
    delay: DelayThread,
    metrics: Option<Arc<MetricsHub>>,
    /// The process's count of messages dropped at full queues.
    dropped: Arc<AtomicU64>,
    /// Messages for in-process destinations held until the end of the pass, per node.
    held: Vec<Vec<(u64, u16, N::Msg)>>,
    started_ns: u64,
    published_ns: u64,
}

impl<N: Node, C: ClientDriver + Send + 'static> NodeTask<N, C> {
    fn node_now(&self) -> u64 {
        self.skew.read(self.clock.now_ns())
    }

    async fn run(mut self) -> NodeResult<N> {
        let now = self.node_now();
        self.outbox.begin_call(self.hops);
        self.node.on_start(now, &mut self.outbox);
        self.carry_out().await;
        if let Some(clients) = &self.clients {
            let mut clients = clients.lock().expect("client lock");
            let first = clients.start(self.clock.now_ns());
            self.open_loop = clients.next_arrival().is_some();
            self.pending_submits.extend(first.into_iter().map(|(_, request)| request));
        }
        'serve: loop {
            self.run_submits().await;
            while let Some((hops, msg)) = self.self_queue.pop_front() {
                let now = self.node_now();
                self.hops = hops;
                self.outbox.begin_call(self.hops);
                self.node.on_message(now, self.id, msg, &mut self.outbox);
                self.carry_out().await;
            }
            // Nothing waits in this node while it sleeps.
            self.flush_held();
            let next_timer = self.timers.peek().map(|Reverse((at, _, _, _))| *at);
            let next_arrival = self.next_arrival();
            tokio::select! {
                biased;
                Some(fault) = self.faults.recv() => {
                    if !self.on_fault(fault).await {
                        break 'serve;
                    }
                }
                inbound = self.inbox.recv() => {
                    // Handle a batch; take the next message only when it will be handled, so
                    // reaching the batch limit never drops one.
                    let mut next = inbound;
                    let mut handled = 0;
                    // Completions that arrive together (one group commit) are handed over
                    // together, so what they release leaves as one message per peer.
                    let mut persisted: Vec<PersistToken> = Vec::new();
                    loop {
                        if !matches!(next, Some(Inbound::Persisted { .. })) {
                            self.complete_persists(&mut persisted).await;
                        }
                        match next {
                            Some(Inbound::Msg { from, sent_at_ns, hops, msg }) => self.on_inbound(from, sent_at_ns, hops, msg).await,
                            Some(Inbound::Msgs { from, msgs }) => {
                                for (sent_at_ns, hops, msg) in msgs {
                                    self.on_inbound(from, sent_at_ns, hops, msg).await;
                                }
                            }
                            Some(Inbound::Persisted { token, life }) => {
                                if life == self.life {
                                    persisted.push(token);
                                }
                            }
                            Some(Inbound::Client { call, reply }) => self.on_client_call(call, reply).await,
                            Some(Inbound::Stop) | None => break 'serve,
                        }
                        handled += 1;
                        if handled == INBOUND_BATCH_MAX {
                            break;
                        }
                        match self.inbox.try_recv() {
                            Ok(message) => next = Some(message),
                            Err(_) => break,
                        }
                    }
                    self.complete_persists(&mut persisted).await;
                }
                () = sleep_until(next_timer.unwrap_or_else(Instant::now)), if next_timer.is_some() => {}
                () = sleep_until(next_arrival.unwrap_or_else(Instant::now)), if next_arrival.is_some() => {}
            }
            self.fire_due_timers().await;
            self.take_arrivals();
            self.maybe_publish();
        }
        let delays = self.delay_report();
        let drawn_p50_us =
            self.drawn.iter().map(|(&to, h)| (to, h.value_at_quantile(0.5))).collect();
        NodeResult {
            id: self.id,
            node: self.node,
            delays,
            drawn_p50_us,
            up: self.up,
            messages_received: self.received,
        }
    }

    /// Carries out a fault; false when the node was stopped while down.
    async fn on_fault(&mut self, fault: NodeFault<N>) -> bool {
        match fault {
            NodeFault::Crash(done) => {
                self.crash();
                if let Some(done) = done {
                    let _ = done.send(());
                }
                self.stay_down().await
            }
            NodeFault::ClockStep(step_ns) => {
                self.skew.offset_ns = self.skew.offset_ns.saturating_add(step_ns);
                true
            }
            NodeFault::Restart { .. } => true, // It is up: nothing to restart.
        }
    }

    /// Forgets everything a crashed process would lose: timers, queued work, messages not yet
    /// handed over, persists not yet acknowledged; calls in progress end indeterminate.
    fn crash(&mut self) {
        self.up = false;
        self.life += 1;
        self.timers.clear();
        self.self_queue.clear();
        self.pending_submits.clear();
        self.persisted.clear();
        self.persist_hops.clear();
        self.storage = None;
        for held in &mut self.held {
            held.clear();
        }
        for (_, waiter) in std::mem::take(&mut self.waiters) {
            let why = format!("coordinator {} crashed", self.id);
            let _ = waiter.send(TxnOutcome::failed(TxnFailure::Indeterminate(why)));
        }
        if let Some(clients) = &self.clients {
            clients.lock().expect("client lock").on_crash(self.id);
        }
    }

    /// While crashed: drops what arrives (messages, completions of the old log), refuses
    /// client calls, until a restart (true) or a stop (false).
    async fn stay_down(&mut self) -> bool {
        loop {
            tokio::select! {
                biased;
                Some(fault) = self.faults.recv() => match fault {
                    NodeFault::Restart { node, storage } => {
                        self.node = node;
                        self.storage = storage;
                        self.up = true;
                        let now = self.node_now();
                        self.hops = 0;
                        self.outbox.begin_call(self.hops);
                        self.node.on_start(now, &mut self.outbox);
                        self.carry_out().await;
                        if let Some(clients) = &self.clients {
                            let mut clients = clients.lock().expect("client lock");
                            let again = clients.on_restart(self.clock.now_ns(), self.id);
                            self.pending_submits.extend(again.into_iter().map(|(_, r)| r));
                        }
                        return true;
                    }
                    NodeFault::ClockStep(step_ns) => {
                        self.skew.offset_ns = self.skew.offset_ns.saturating_add(step_ns);
                    }
                    NodeFault::Crash(done) => {
                        if let Some(done) = done {
                            let _ = done.send(()); // Down already.
                        }
                    }
                },
                inbound = self.inbox.recv() => match inbound {
                    Some(Inbound::Stop) | None => return false,
                    Some(Inbound::Client { reply, .. }) => {
                        let why = format!("node {} is down", self.id);
                        let _ = reply.send(TxnOutcome::failed(TxnFailure::Rejected(why)));
                    }
                    Some(_) => {}
                },
            }
        }
    }

    /// When the open-loop clients' next arrival is due, as an instant.
    fn next_arrival(&self) -> Option<Instant> {
        if !self.open_loop {
            return None;
        }
        let at = self.clients.as_ref()?.lock().expect("client lock").next_arrival()?;
        let wait_ns = at.saturating_sub(self.clock.now_ns());
        Some(Instant::now() + std::time::Duration::from_nanos(wait_ns))
    }

    /// Queues the open-loop arrivals due by now.
    fn take_arrivals(&mut self) {
        if !self.open_loop {
            return;
        }
        if let Some(clients) = &self.clients {
            let due = clients.lock().expect("client lock").on_time(self.clock.now_ns());
            self.pending_submits.extend(due.into_iter().map(|(_, request)| request));
        }
    }

    /// Publishes a metrics snapshot when one is due.
    fn maybe_publish(&mut self) {
        let Some(hub) = &self.metrics else { return };
        let now = self.clock.now_ns();
        if now < self.published_ns + METRICS_INTERVAL_NS {
            return;
        }
        self.published_ns = now;
        let links = self
            .delays
            .iter()
            .map(|(&from, h)| {
                let snapshot = LinkSnapshot {
                    messages: h.len(),
                    p50_us: h.value_at_quantile(0.5),
                    p99_us: h.value_at_quantile(0.99),
                };
                (from, snapshot)
            })
            .collect();
        let snapshot = NodeSnapshot {
            links,
            counters: self.node.counters(),
            groups: self.node.groups(),
            uptime_s: (now - self.started_ns) as f64 / 1e9,
        };
        hub.publish(self.id, snapshot);
    }

    async fn on_inbound(&mut self, from: NodeId, sent_at_ns: u64, hops: u16, msg: N::Msg) {
        self.received += 1;
        record_delay(&mut self.delays, from, self.clock.now_ns().saturating_sub(sent_at_ns));
        let now = self.node_now();
        self.hops = hops;
        self.outbox.begin_call(self.hops);
        self.node.on_message(now, from, msg, &mut self.outbox);
        self.carry_out().await;
    }

    async fn fire_due_timers(&mut self) {
        let now_instant = Instant::now();
        while let Some(Reverse((at, _, timer, hops))) = self.timers.peek().copied() {
            if at > now_instant {
                break;
            }
            self.timers.pop();
            let now = self.node_now();
            self.hops = hops;
            self.outbox.begin_call(self.hops);
            self.node.on_timer(now, timer, &mut self.outbox);
            self.carry_out().await;
        }
    }

    async fn run_submits(&mut self) {
        for _ in 0..SUBMITS_PER_PASS_MAX {
            let Some(request) = self.pending_submits.pop_front() else { return };
            let now = self.node_now();
            self.hops = 0;
            self.outbox.begin_call(self.hops);
            self.node.submit(now, request, &mut self.outbox);
            self.carry_out().await;
        }
    }

    /// A client library's call: refused when too many are in progress or its id is taken.
    async fn on_client_call(&mut self, call: ClientCall, reply: oneshot::Sender<TxnOutcome>) {
        let id = call.id();
        if self.waiters.len() >= CLIENT_CALLS_MAX || self.waiters.contains_key(&id) {
            let why = format!("{CLIENT_CALLS_MAX} calls in progress, or request {} twice", id.0);
            let _ = reply.send(TxnOutcome::failed(TxnFailure::Rejected(why)));
            return;
        }
        self.waiters.insert(id, reply);
        let now = self.node_now();
        self.hops = 0;
        self.outbox.begin_call(self.hops);
        match call {
            ClientCall::Submit(request) => self.node.submit(now, request, &mut self.outbox),
            ClientCall::Session(request) => self.node.on_session(now, request, &mut self.outbox),
        }
        self.carry_out().await;
    }

    /// Hands the node the persist completions gathered so far, if any, as one batch.
    async fn complete_persists(&mut self, tokens: &mut Vec<PersistToken>) {
        if tokens.is_empty() {
            return;
        }
        let now = self.node_now();
        // What the batch releases waited for the longest chain among them.
        self.hops = tokens.iter().filter_map(|t| self.persist_hops.remove(t)).max().unwrap_or(0);
        self.outbox.begin_call(self.hops);
        self.node.on_persisted_batch(now, tokens, &mut self.outbox);
        tokens.clear();
        self.carry_out().await;
    }

    /// Carries out the outbox in order. Persists go to the storage thread, whose completions
    /// come back through the inbox in order; without one (memory durability) they complete at
    /// once, handed back after the effects before them.
    async fn carry_out(&mut self) {
        loop {
            let mut outbox = std::mem::take(&mut self.outbox);
            for effect in outbox.drain() {
                match effect {
                    Effect::Send { to, msg } => self.send(to, msg),
                    Effect::SetTimer { timer, after_ns } => {
                        let at = Instant::now()
                            + std::time::Duration::from_nanos(self.skew.true_duration(after_ns));
                        self.timer_seq += 1;
                        self.timers.push(Reverse((at, self.timer_seq, timer, self.hops)));
                    }
                    Effect::Persist { token, records, durability } => match &self.storage {
                        Some(storage) => {
                            self.persist_hops.insert(token, self.hops);
                            let (inbox, life) = (self.self_inbox.clone(), self.life);
                            storage.submit(PersistJob {
                                records,
                                durability,
                                done: Box::new(move || {
                                    let _ = inbox.blocking_send(Inbound::Persisted { token, life });
                                }),
                            });
                        }
                        None => self.persisted.push_back((token, self.hops)),
                    },
                    Effect::DependsOn { hops } => self.hops = hops,
                    Effect::Reply { request, outcome } => {
                        if let Some(waiter) = self.waiters.remove(&request) {
                            let _ = waiter.send(outcome);
                        } else if let Some(clients) = &self.clients {
                            let mut clients = clients.lock().expect("client lock");
                            clients.note_wan_hops(request, self.hops);
                            let next =
                                clients.on_reply(self.clock.now_ns(), self.id, request, &outcome);
                            self.pending_submits.extend(next.into_iter().map(|(_, r)| r));
                        }
                    }
                }
            }
            self.outbox = outbox;
            let Some((token, hops)) = self.persisted.pop_front() else { return };
            let now = self.node_now();
            self.hops = hops;
            self.outbox.begin_call(self.hops);
            self.node.on_persisted(now, token, &mut self.outbox);
        }
    }

    fn send(&mut self, to: NodeId, msg: N::Msg) {
        if to == self.id {
            self.self_queue.push_back((self.hops, msg));
            return;
        }
        if self.cuts.is_cut(self.id, to) {
            self.cuts.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let sent_at_ns = self.clock.now_ns();
        let wide = self.topology.region_of(self.id) != self.topology.region_of(to);
        let hops = self.hops.saturating_add(u16::from(wide));
        let Some(Some(link)) = self.links.get_mut(to.0 as usize) else { return };
        if !link.delayed {
            if let Route::Local(_) = link.route {
                // Held until the end of this pass (or until enough are held): one hand-over
                // and one wake-up for all of them. A wake-up per message cost the sender as
                // much as the protocol work of a transaction on busy in-process runs.
                let held = &mut self.held[to.0 as usize];
                held.push((sent_at_ns, hops, msg));
                if held.len() >= HELD_MESSAGES_MAX {
                    self.flush_to(to);
                }
                return;
            }
            link.route.deliver(self.id, (sent_at_ns, hops), msg, &self.dropped);
            return;
        }
        let deliver_ns = link.state.sample(&link.model, sent_at_ns).unwrap_or(sent_at_ns);
        record_delay(&mut self.drawn, to, deliver_ns.saturating_sub(sent_at_ns));
        let due = self.clock.instant_at(deliver_ns);
        let (route, from, dropped) = (link.route.clone(), self.id, self.dropped.clone());
        let delivery = Box::new(move || route.deliver(from, (sent_at_ns, hops), msg, &dropped));
        if !self.delay.schedule(due, delivery) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Hands over the messages held for `to`.
    fn flush_to(&mut self, to: NodeId) {
        let held = std::mem::take(&mut self.held[to.0 as usize]);
        if held.is_empty() {
            return;
        }
        let Some(Some(LinkOut { route: Route::Local(tx), .. })) = self.links.get(to.0 as usize)
        else {
            return;
        };
        let count = held.len() as u64;
        if tx.try_send(Inbound::Msgs { from: self.id, msgs: held }).is_err() {
            self.dropped.fetch_add(count, Ordering::Relaxed);
        }
    }

    /// Hands over every held message.
    fn flush_held(&mut self) {
        for index in 0..self.held.len() {
            if !self.held[index].is_empty() {
                self.flush_to(NodeId(index as u32));
            }
        }
    }

    fn delay_report(&self) -> Vec<LinkDelays> {
        self.delays
            .iter()
            .map(|(&from, histogram)| {
                let model = self.network.link(
                    self.topology.region_of(from).0 as usize,
                    self.topology.region_of(self.id).0 as usize,
                );
                LinkDelays {
                    from,
                    to: self.id,
                    count: histogram.len(),
                    p50_us: histogram.value_at_quantile(0.5),
                    p99_us: histogram.value_at_quantile(0.99),
                    max_us: histogram.max(),
                    configured_p50_us: model.median_ns() / NS_PER_US,
                    drawn_p50_us: None,
                }
            })
            .collect()
    }
}
