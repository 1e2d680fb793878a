//! Coordinator machinery: attempt ids, the leader cache, the table of client requests with
//! retry backoff, and a transaction's plan bound to shards and run in waves of pieces.
//!
//! A coordinator runs each client request as a sequence of attempts; every attempt has a new
//! [`TxnId`] from [`AttemptIds`]. Ids carry the node's incarnation (handed in by the driver,
//! growing with every start), so a restarted coordinator never reuses one, whatever its clock.

use super::exec::PieceCall;
use crate::NodeContext;
use meridian_core::node::{ClientRequest, Outbox};
use meridian_core::rng::{uniform_f64, Rng};
use meridian_core::topology::{Topology, NODES_MAX};
use meridian_core::txn::{
    AbortCounts, PieceOutput, PlanContext, ProcError, ShardTarget, TxnFailure, TxnOutcome,
    TxnRequest, PIECES_MAX,
};
use meridian_core::{NodeId, RequestId, ShardId, Time, Timestamp, TxnId};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Hands out attempt ids: `(node, incarnation, counter)`.
#[derive(Debug)]
pub struct AttemptIds {
    origin: NodeId,
    incarnation: u64,
    next: u64,
}

impl AttemptIds {
    /// Ids of `origin` in `incarnation`.
    pub fn new(origin: NodeId, incarnation: u64) -> Self {
        Self { origin, incarnation, next: 0 }
    }

    /// The sequence number the next id will have.
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// A fresh id.
    pub fn next_id(&mut self) -> TxnId {
        let id = TxnId { origin: self.origin, incarnation: self.incarnation, seq: self.next };
        self.next += 1;
        id
    }
}

/// Which node a coordinator believes leads each shard. Starts at replica 0 (where the
/// topology places each shard's leader); learns from answers (only leaders answer) and moves
/// to the next replica when a shard stays silent.
#[derive(Debug)]
pub struct LeaderCache {
    topology: Arc<Topology>,
    leaders: Vec<NodeId>,
}

impl LeaderCache {
    /// Replica 0 of every shard.
    pub fn new(topology: Arc<Topology>) -> Self {
        let leaders = (0..topology.shards)
            .map(|s| {
                topology.replica_node(ShardId(s), 0).expect("validated topology hosts replica 0")
            })
            .collect();
        Self { topology, leaders }
    }

    /// The node to send `shard`'s requests to.
    pub fn leader(&self, shard: ShardId) -> NodeId {
        self.leaders[shard.0 as usize]
    }

    /// `node` answered for `shard`: it leads the shard. Ignored unless `node` hosts it.
    pub fn note(&mut self, shard: ShardId, node: NodeId) {
        let hosts = self
            .topology
            .nodes
            .get(node.0 as usize)
            .is_some_and(|info| info.replicas.iter().any(|slot| slot.shard == shard));
        if let (true, Some(leader)) = (hosts, self.leaders.get_mut(shard.0 as usize)) {
            *leader = node;
        }
    }

    /// `shard` did not answer in time: try its next replica, which answers if it leads or
    /// forwards to the leader it knows.
    pub fn suspect(&mut self, shard: ShardId) {
        let topology = &self.topology;
        if topology.replicas <= 1 {
            return;
        }
        let current = self.leaders[shard.0 as usize];
        let slot = topology.nodes[current.0 as usize]
            .replicas
            .iter()
            .find(|s| s.shard == shard)
            .map_or(0, |s| s.replica);
        if let Some(next) = topology.replica_node(shard, (slot + 1) % topology.replicas) {
            self.leaders[shard.0 as usize] = next;
        }
    }

    /// The shard whose replica 0 sits in `node`'s region (where pieces of replicated tables
    /// run when nothing else places them), or shard 0.
    pub fn home_shard(&self, node: NodeId) -> ShardId {
        let region = self.topology.region_of(node);
        (0..self.topology.shards)
            .map(ShardId)
            .find(|&s| {
                self.topology
                    .replica_node(s, 0)
                    .is_some_and(|n| self.topology.region_of(n) == region)
            })
            .unwrap_or(ShardId(0))
    }
}

/// A request the client is waiting on.
#[derive(Debug)]
pub struct Request {
    /// What the client asked.
    pub client: ClientRequest,
    /// Attempts aborted so far.
    pub retries: u32,
    /// The same attempts by cause.
    pub aborts: AbortCounts,
    /// The running attempt.
    pub attempt: Option<TxnId>,
    /// When it was submitted (the coordinator's clock).
    pub submitted_at: u64,
}

/// The requests in flight at one coordinator, at most `requests_max`.
#[derive(Debug)]
pub struct RequestTable {
    requests: BTreeMap<RequestId, Request>,
    requests_max: usize,
}

impl RequestTable {
    /// An empty table.
    pub fn new(requests_max: usize) -> Self {
        Self { requests: BTreeMap::new(), requests_max }
    }

    /// Takes a new request. A duplicate submit is ignored (the first will be answered: `None`
    /// returned); over the limit, or when `busy` says why the coordinator takes no new work,
    /// the client is answered `Rejected` at once.
    pub fn admit<M>(
        &mut self,
        now: u64,
        request: ClientRequest,
        busy: Option<String>,
        out: &mut Outbox<M>,
    ) -> Option<RequestId> {
        let id = request.id;
        if self.requests.contains_key(&id) {
            return None;
        }
        let refusal = busy.or_else(|| {
            (self.requests.len() >= self.requests_max)
                .then(|| format!("{} requests in flight is the maximum", self.requests_max))
        });
        if let Some(why) = refusal {
            out.reply(id, TxnOutcome::failed(TxnFailure::Rejected(why)));
            return None;
        }
        self.requests.insert(
            id,
            Request {
                client: request,
                retries: 0,
                aborts: AbortCounts::default(),
                attempt: None,
                submitted_at: now,
            },
        );
        Some(id)
    }

    /// The request, if in flight.
    pub fn get(&self, id: RequestId) -> Option<&Request> {
        self.requests.get(&id)
    }

    /// The request, writable.
    pub fn get_mut(&mut self, id: RequestId) -> Option<&mut Request> {
        self.requests.get_mut(&id)
    }

    /// Removes a request (it is being answered).
    pub fn finish(&mut self, id: RequestId) -> Option<Request> {
        self.requests.remove(&id)
    }

    /// Requests in flight.
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// True when none.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// Every request in flight (tests and debugging).
    pub fn iter(&self) -> impl Iterator<Item = (&RequestId, &Request)> {
        self.requests.iter()
    }
}

/// Exponential backoff with jitter: the `retries`-th retry waits `min · 2^retries` (at most
/// `max`) times a uniform factor in [0.5, 1.5).
pub fn backoff_ns(rng: &mut Rng, min_ns: u64, max_ns: u64, retries: u32) -> u64 {
    let exponent = retries.min(20);
    let backoff = min_ns.saturating_mul(1 << exponent).min(max_ns);
    ((backoff as f64 * (0.5 + uniform_f64(rng))) as u64).max(1)
}

/// One piece of an attempt's plan, bound to a shard.
#[derive(Clone, Debug)]
pub struct PieceSlot {
    /// Where it runs.
    pub shard: ShardId,
    /// Earlier pieces whose outputs it needs.
    pub deps: Vec<u32>,
    /// Sent for execution.
    pub sent: bool,
    /// Its output, once run.
    pub output: Option<PieceOutput>,
}

/// A transaction's plan with every piece bound to a shard: pieces of replicated tables run
/// beside the first bound piece (or on `home`). Checks the procedure's contract: pieces in
/// dependency order, on existing shards, at most [`PIECES_MAX`].
pub fn bind_plan(
    context: &NodeContext,
    txn: &TxnRequest,
    home: ShardId,
) -> Result<Vec<PieceSlot>, ProcError> {
    let procedure = context
        .registry
        .get(txn.proc)
        .ok_or_else(|| ProcError::BadArgs(format!("unknown procedure {}", txn.proc.0)))?;
    let plan = procedure.plan(&txn.args, PlanContext { partitioner: &context.partitioner })?;
    if plan.len() > PIECES_MAX {
        return Err(ProcError::Contract(format!("{} pieces is over {PIECES_MAX}", plan.len())));
    }
    let anchor = plan
        .iter()
        .find_map(|p| match p.target {
            ShardTarget::Shard(s) => Some(s),
            ShardTarget::Any => None,
        })
        .unwrap_or(home);
    let mut pieces = Vec::with_capacity(plan.len());
    for (index, spec) in plan.into_iter().enumerate() {
        if spec.deps.iter().any(|&d| d as usize >= index) {
            return Err(ProcError::Contract(format!("piece {index} depends on a later piece")));
        }
        let shard = match spec.target {
            ShardTarget::Shard(s) if s.0 < context.topology.shards => s,
            ShardTarget::Shard(s) => {
                return Err(ProcError::Contract(format!(
                    "piece {index} targets missing shard {}",
                    s.0
                )))
            }
            ShardTarget::Any => anchor,
        };
        pieces.push(PieceSlot { shard, deps: spec.deps, sent: false, output: None });
    }
    Ok(pieces)
}

/// The shard every piece runs on, when there is only one.
pub fn single_shard(pieces: &[PieceSlot]) -> Option<ShardId> {
    let first = pieces.first()?.shard;
    pieces.iter().all(|p| p.shard == first).then_some(first)
}

/// Shards the pieces run on.
pub fn shards_of(pieces: &[PieceSlot]) -> BTreeSet<ShardId> {
    pieces.iter().map(|p| p.shard).collect()
}

/// The next wave: every piece whose dependencies have run and that is not sent yet, grouped by
/// shard, skipping shards in `busy` (one request per shard at a time). Marks them sent.
pub fn next_wave(
    pieces: &mut [PieceSlot],
    busy: &BTreeSet<ShardId>,
) -> BTreeMap<ShardId, Vec<PieceCall>> {
    let mut calls: BTreeMap<ShardId, Vec<PieceCall>> = BTreeMap::new();
    for index in 0..pieces.len() {
        let piece = &pieces[index];
        let ready = !piece.sent && piece.deps.iter().all(|&d| pieces[d as usize].output.is_some());
        if !ready || busy.contains(&piece.shard) {
            continue;
        }
        let inputs = piece
            .deps
            .iter()
            .map(|&d| pieces[d as usize].output.clone().unwrap_or_default())
            .collect();
        calls.entry(piece.shard).or_default().push(PieceCall { piece: index as u32, inputs });
        pieces[index].sent = true;
    }
    calls
}

/// True when a reply from `shard` carrying runs of `ran` answers the wave outstanding there:
/// it has a run for every piece sent to that shard and not yet answered. A duplicated reply of
/// an earlier wave does not.
pub fn answers_wave(pieces: &[PieceSlot], shard: ShardId, ran: &[u32]) -> bool {
    pieces.iter().enumerate().all(|(i, p)| {
        p.shard != shard || !p.sent || p.output.is_some() || ran.contains(&(i as u32))
    })
}

/// The pieces' outputs in plan order; empty when any is missing.
pub fn outputs(pieces: &[PieceSlot]) -> Vec<PieceOutput> {
    pieces.iter().map(|p| p.output.clone()).collect::<Option<_>>().unwrap_or_default()
}

/// Attempt timestamps are multiples of this plus the coordinator's node index, so two
/// coordinators never pick the same one.
pub(crate) const TS_NODE_SLOTS: u64 = NODES_MAX as u64;
const _: () = assert!(TS_NODE_SLOTS.is_power_of_two() && TS_NODE_SLOTS >= NODES_MAX as u64);

/// Furthest an attempt's timestamp may be ahead of the leader's clock: a coordinator clock
/// that far ahead is broken, and a timestamp near the end of time would stop the shard's
/// writes for good (every later write must be above it).
pub(crate) const TS_AHEAD_MAX_NS: u64 = 3_600 * meridian_core::time::NS_PER_S;

/// The timestamp of a new attempt at coordinator `node`: above `floor` (the coordinator's last
/// attempt timestamp and the newest version or stamp it was refused for), at or above its clock
/// `now`, and `node` modulo [`TS_NODE_SLOTS`].
pub(crate) fn attempt_ts(now: Time, floor: Timestamp, node: NodeId) -> Timestamp {
    debug_assert!(u64::from(node.0) < TS_NODE_SLOTS);
    let base = now.max(floor.0.saturating_add(1));
    let ts = (base / TS_NODE_SLOTS).saturating_add(1).saturating_mul(TS_NODE_SLOTS);
    let ts = Timestamp(ts.saturating_add(u64::from(node.0)));
    debug_assert!(ts > floor);
    ts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(shard: u32, deps: &[u32]) -> PieceSlot {
        PieceSlot { shard: ShardId(shard), deps: deps.to_vec(), sent: false, output: None }
    }

    #[test]
    fn waves_follow_dependencies_and_one_request_per_shard() {
        let mut pieces = vec![slot(0, &[]), slot(1, &[]), slot(1, &[0]), slot(0, &[1, 2])];
        let wave = next_wave(&mut pieces, &BTreeSet::new());
        assert_eq!(wave.keys().copied().collect::<Vec<_>>(), vec![ShardId(0), ShardId(1)]);
        assert_eq!(wave[&ShardId(1)].len(), 1, "piece 2 waits for piece 0");
        assert!(next_wave(&mut pieces, &BTreeSet::new()).is_empty(), "nothing else is ready");
        assert!(!answers_wave(&pieces, ShardId(1), &[]), "a reply without piece 1");
        assert!(answers_wave(&pieces, ShardId(1), &[1]));
        pieces[0].output = Some(vec![]);
        pieces[1].output = Some(vec![]);
        let busy: BTreeSet<ShardId> = [ShardId(1)].into();
        assert!(next_wave(&mut pieces, &busy).is_empty(), "shard 1 is busy");
        let wave = next_wave(&mut pieces, &BTreeSet::new());
        assert_eq!(wave[&ShardId(1)][0].piece, 2);
        assert_eq!(wave[&ShardId(1)][0].inputs.len(), 1);
        assert!(outputs(&pieces).is_empty(), "pieces 2 and 3 have no output yet");
        assert_eq!(single_shard(&pieces), None);
        assert_eq!(shards_of(&pieces).len(), 2);
    }

    #[test]
    fn attempt_ids_never_repeat_across_incarnations() {
        let mut first = AttemptIds::new(NodeId(3), 0);
        let mut second = AttemptIds::new(NodeId(3), 1);
        let a: BTreeSet<TxnId> = (0..100).map(|_| first.next_id()).collect();
        let b: BTreeSet<TxnId> = (0..100).map(|_| second.next_id()).collect();
        assert_eq!(a.len() + b.len(), 200);
        assert!(a.is_disjoint(&b));
    }

    #[test]
    fn backoff_doubles_up_to_the_maximum_with_jitter() {
        let mut rng = meridian_core::rng::child_rng(1, "backoff-test", 0);
        for retries in 0..30 {
            let ns = backoff_ns(&mut rng, 100, 10_000, retries);
            let base = (100u64 << retries.min(20)).min(10_000);
            assert!(ns >= base / 2 && ns < base * 3 / 2 + 1, "{retries}: {ns}");
        }
    }
    #[test]
    fn attempt_timestamps_are_unique_per_node_and_increase() {
        let a = attempt_ts(5_000, Timestamp::ZERO, NodeId(3));
        let b = attempt_ts(5_000, Timestamp::ZERO, NodeId(4));
        assert_ne!(a, b);
        assert_eq!(a.0 % TS_NODE_SLOTS, 3);
        assert!(a.0 >= 5_000);
        let next = attempt_ts(5_000, a, NodeId(3));
        assert!(next > a, "same clock reading, later attempt");
        let bumped = attempt_ts(5_000, Timestamp(1_000_000), NodeId(3));
        assert!(bumped > Timestamp(1_000_000), "a floor above the clock wins");
    }
}
