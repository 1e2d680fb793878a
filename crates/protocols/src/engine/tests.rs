//! Unit tests of the OCC family's engine (`occ`, `2pl`, `2pc-mvto`, `mako`) through a tiny
//! in-test router: zero-delay delivery, timers fired in deadline order, and hooks to drop or
//! duplicate chosen messages.

use super::*;
use crate::Timing;
use meridian_core::node::Effect;
use meridian_core::time::NS_PER_MS;
use meridian_core::topology::Topology;
use meridian_core::txn::{
    AbortCause, Datum, KeySet, PartitionRule, Partitioner, PieceEffects, PieceOutput, PieceSpec,
    Plan, PlanContext, Procedure, Reads, Registry, ShardTarget, TxnFailure, TxnOutcome, TxnRequest,
    TxnResult, UserAbort,
};
use meridian_core::RequestId;
use std::collections::VecDeque;
use std::sync::Arc;

const KEYS_PER_SHARD: u64 = 100;

fn key(id: u64) -> Key {
    Key::table(1).u64(id).build()
}

fn shard_of(id: u64) -> ShardId {
    ShardId((id / KEYS_PER_SHARD) as u32)
}

fn as_u64(value: &Option<impl AsRef<[u8]>>) -> u64 {
    value.as_ref().map_or(0, |v| u64::from_le_bytes(v.as_ref()[..8].try_into().unwrap()))
}

/// Reads `args[0]` ids and writes `args[1]` (id, value) pairs; a piece per shard touched. A
/// value of `u64::MAX` asks for a user abort.
#[derive(Debug)]
struct ReadWrite;

fn rw_ids(args: &[Datum]) -> (Vec<u64>, Vec<(u64, u64)>) {
    let reads = args[0].as_list().unwrap().iter().filter_map(Datum::as_uint).collect();
    let writes = args[1]
        .as_list()
        .unwrap()
        .iter()
        .map(|pair| {
            let pair = pair.as_list().unwrap();
            (pair[0].as_uint().unwrap(), pair[1].as_uint().unwrap())
        })
        .collect();
    (reads, writes)
}

impl ReadWrite {
    fn shards(args: &[Datum]) -> Vec<ShardId> {
        let (reads, writes) = rw_ids(args);
        let mut shards: Vec<ShardId> =
            reads.iter().chain(writes.iter().map(|(id, _)| id)).map(|&id| shard_of(id)).collect();
        shards.sort_unstable();
        shards.dedup();
        shards
    }
}

impl Procedure for ReadWrite {
    fn name(&self) -> &'static str {
        "rw"
    }
    fn plan(&self, args: &Args, _: PlanContext<'_>) -> Result<Plan, ProcError> {
        Ok(Self::shards(args)
            .into_iter()
            .map(|s| PieceSpec { target: ShardTarget::Shard(s), deps: vec![] })
            .collect())
    }
    fn keys(&self, piece: u32, args: &Args, _: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        let shard = Self::shards(args)[piece as usize];
        let (reads, writes) = rw_ids(args);
        Ok(KeySet {
            reads: reads.into_iter().filter(|&id| shard_of(id) == shard).map(key).collect(),
            writes: writes
                .into_iter()
                .filter(|&(id, _)| shard_of(id) == shard)
                .map(|(id, _)| key(id))
                .collect(),
            scans: vec![],
        })
    }
    fn execute(
        &self,
        piece: u32,
        args: &Args,
        _: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let shard = Self::shards(args)[piece as usize];
        let (_, writes) = rw_ids(args);
        if writes.iter().any(|&(_, v)| v == u64::MAX) {
            return Err(UserAbort("asked to abort".into()));
        }
        Ok(PieceEffects {
            writes: writes
                .into_iter()
                .filter(|&(id, _)| shard_of(id) == shard)
                .map(|(id, v)| Write { key: key(id), value: Some(v.to_le_bytes().to_vec()) })
                .collect(),
            output: reads.values.iter().map(|v| Datum::Uint(as_u64(v))).collect(),
        })
    }
}

/// Piece 0 reads `args[0]`; piece 1 (on shard `args[1]`) reads the id piece 0 found and copies
/// its value to id `args[2]`. With `args[3]` and `args[4]`, piece 2 (on shard `args[3]`, in the
/// first wave) also reads id `args[4]`. Exercises dependent pieces.
#[derive(Debug)]
struct Chase;

impl Procedure for Chase {
    fn name(&self) -> &'static str {
        "chase"
    }
    fn plan(&self, args: &Args, _: PlanContext<'_>) -> Result<Plan, ProcError> {
        let first = shard_of(args[0].as_uint().unwrap());
        let second = ShardId(args[1].as_uint().unwrap() as u32);
        let mut plan = vec![
            PieceSpec { target: ShardTarget::Shard(first), deps: vec![] },
            PieceSpec { target: ShardTarget::Shard(second), deps: vec![0] },
        ];
        if let Some(extra) = args.get(3) {
            let shard = ShardId(extra.as_uint().unwrap() as u32);
            plan.push(PieceSpec { target: ShardTarget::Shard(shard), deps: vec![] });
        }
        Ok(plan)
    }
    fn keys(&self, piece: u32, args: &Args, inputs: &[&PieceOutput]) -> Result<KeySet, ProcError> {
        Ok(match piece {
            0 => KeySet { reads: vec![key(args[0].as_uint().unwrap())], ..KeySet::default() },
            2 => KeySet { reads: vec![key(args[4].as_uint().unwrap())], ..KeySet::default() },
            _ => {
                let pointer = inputs[0][0].as_uint().unwrap();
                KeySet {
                    reads: vec![key(pointer)],
                    writes: vec![key(args[2].as_uint().unwrap())],
                    scans: vec![],
                }
            }
        })
    }
    fn execute(
        &self,
        piece: u32,
        args: &Args,
        _: &[&PieceOutput],
        reads: &Reads,
    ) -> Result<PieceEffects, UserAbort> {
        let value = as_u64(&reads.values[0]);
        let writes = match piece {
            0 | 2 => vec![],
            _ => vec![Write {
                key: key(args[2].as_uint().unwrap()),
                value: Some(value.to_le_bytes().to_vec()),
            }],
        };
        Ok(PieceEffects { writes, output: vec![Datum::Uint(value)] })
    }
}

fn rw(reads: &[u64], writes: &[(u64, u64)]) -> TxnRequest {
    TxnRequest {
        proc: meridian_core::txn::ProcId(0),
        args: vec![
            Datum::List(reads.iter().map(|&id| Datum::Uint(id)).collect()),
            Datum::List(
                writes
                    .iter()
                    .map(|&(id, v)| Datum::List(vec![Datum::Uint(id), Datum::Uint(v)]))
                    .collect(),
            ),
        ],
    }
}

/// The protocols of the family, as the tests name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CcMode {
    /// `occ`.
    Validation,
    /// `2pl` under this policy.
    Locking(crate::kit::locks::Policy),
    /// `2pc-mvto`.
    Mvto,
    /// `mako`.
    Speculative,
}

/// The family description of the protocol `mode` names.
fn family_of(mode: CcMode) -> Family {
    match mode {
        CcMode::Validation => crate::occ::family(),
        CcMode::Locking(policy) => crate::twopl::family(policy),
        CcMode::Mvto => crate::mvto::family(),
        CcMode::Speculative => crate::mako::family(),
    }
}

/// `2pl`: attempts holding execution locks at `p`, plus keys locked (0 under the others).
fn exec_locks(p: &Participant) -> u64 {
    p.cc::<crate::twopl::cc::ExecutionLocks>().map_or(0, |l| l.held())
}

/// A participant of `shard` under `mode`.
fn new_participant(shard: ShardId, context: NodeContext, mode: CcMode) -> Participant {
    let cc = (family_of(mode).control)(&context);
    Participant::new(shard, context, cc)
}

type Filter = Box<dyn FnMut(NodeId, &OccMsg) -> Delivery>;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Delivery {
    Deliver,
    Drop,
    Duplicate,
}

struct Net {
    nodes: Vec<OccNode>,
    queue: VecDeque<(NodeId, NodeId, OccMsg)>,
    timers: Vec<(Time, NodeId, TimerId)>,
    replies: BTreeMap<RequestId, TxnOutcome>,
    now: Time,
    filter: Filter,
    delivered: u64,
}

const COORDINATOR: NodeId = NodeId(2);

impl Net {
    fn new() -> Self {
        Self::with_limits(crate::Limits::default())
    }

    fn with_limits(limits: crate::Limits) -> Self {
        Self::build(limits, CcMode::Validation)
    }

    /// A net whose participants lock at execution (`2pl`) under `policy`.
    fn locking(policy: crate::kit::locks::Policy) -> Self {
        Self::build(crate::Limits::default(), CcMode::Locking(policy))
    }

    fn build(limits: crate::Limits, mode: CcMode) -> Self {
        Self::build_with(limits, mode, crate::ProtocolOptions::default())
    }

    fn build_with(limits: crate::Limits, mode: CcMode, options: crate::ProtocolOptions) -> Self {
        let topology = Arc::new(Topology::standard(vec!["r0".into()], 2, 1).unwrap());
        let mut registry = Registry::default();
        registry.register(Arc::new(ReadWrite));
        registry.register(Arc::new(Chase));
        let partitioner =
            Partitioner::new(2, PartitionRule::LeadingInt { base: 0, per_shard: KEYS_PER_SHARD })
                .unwrap();
        let timing = Timing::for_network(NS_PER_MS);
        let nodes: Vec<OccNode> = topology
            .node_ids()
            .map(|id| {
                let mut context = NodeContext::new(
                    id,
                    topology.clone(),
                    Arc::new(registry.clone()),
                    Arc::new(partitioner.clone()),
                    1,
                    timing.clone(),
                );
                context.limits = limits;
                context.options = options.clone();
                OccNode::restore_as(context, &BTreeMap::new(), family_of(mode)).unwrap()
            })
            .collect();
        let mut net = Self {
            nodes,
            queue: VecDeque::new(),
            timers: Vec::new(),
            replies: BTreeMap::new(),
            now: 1_000 * NS_PER_MS,
            filter: Box::new(|_, _| Delivery::Deliver),
            delivered: 0,
        };
        for id in 0..net.nodes.len() {
            let mut out = Outbox::new();
            net.nodes[id].on_start(net.now, &mut out);
            net.drain(NodeId(id as u32), &mut out);
        }
        net
    }

    fn drain(&mut self, from: NodeId, out: &mut Outbox<OccMsg>) {
        for effect in out.drain() {
            match effect {
                Effect::Send { to, msg } => match (self.filter)(to, &msg) {
                    Delivery::Deliver => self.queue.push_back((from, to, msg)),
                    Delivery::Drop => {}
                    Delivery::Duplicate => {
                        self.queue.push_back((from, to, msg.clone()));
                        self.queue.push_back((from, to, msg));
                    }
                },
                Effect::SetTimer { timer, after_ns } => {
                    self.timers.push((self.now + after_ns, from, timer))
                }
                Effect::Reply { request, outcome } => {
                    assert!(
                        self.replies.insert(request, outcome).is_none(),
                        "request {request:?} answered twice"
                    );
                }
                Effect::Persist { .. } | Effect::DependsOn { .. } => {}
            }
        }
    }

    fn submit(&mut self, request: u64, txn: TxnRequest) {
        let mut out = Outbox::new();
        self.nodes[COORDINATOR.0 as usize].submit(
            self.now,
            ClientRequest { id: RequestId(request), txn },
            &mut out,
        );
        self.drain(COORDINATOR, &mut out);
    }

    /// Delivers one queued message; false when none is queued.
    fn step(&mut self) -> bool {
        let Some((from, to, msg)) = self.queue.pop_front() else {
            return false;
        };
        self.delivered += 1;
        let mut out = Outbox::new();
        self.nodes[to.0 as usize].on_message(self.now, from, msg, &mut out);
        self.drain(to, &mut out);
        true
    }

    /// Runs until no message is queued and `until` holds, firing timers when idle.
    fn run_until(&mut self, mut until: impl FnMut(&Self) -> bool) {
        for _ in 0..100_000 {
            if self.step() {
                continue;
            }
            if until(self) {
                return;
            }
            self.timers.sort_unstable();
            if self.timers.is_empty() {
                return;
            }
            let (at, node, timer) = self.timers.remove(0);
            self.now = self.now.max(at);
            let mut out = Outbox::new();
            self.nodes[node.0 as usize].on_timer(self.now, timer, &mut out);
            self.drain(node, &mut out);
        }
        for node in &self.nodes {
            for (shard, p) in node.hosts.iter() {
                eprintln!("shard {shard:?}: {}", p.debug_state());
            }
            if let Some(c) = &node.coordinator {
                eprintln!("coordinator: {}", c.debug_state());
            }
        }
        panic!("did not settle");
    }

    /// Runs until the coordinator has nothing in flight and nothing left to deliver.
    fn settle(&mut self) {
        self.run_until(|net| {
            net.nodes[COORDINATOR.0 as usize].coordinator.as_ref().is_some_and(|c| c.is_idle())
        });
    }

    fn answered(&mut self, requests: &[u64]) {
        self.run_until(|net| requests.iter().all(|r| net.replies.contains_key(&RequestId(*r))));
    }

    fn value(&self, id: u64) -> Option<u64> {
        let store = self.nodes[shard_of(id).0 as usize].hosts.get(shard_of(id)).unwrap().store();
        store
            .get_at(&key(id), Timestamp::MAX)
            .map(|v| u64::from_le_bytes(v[..8].try_into().unwrap()))
    }

    fn outcome(&self, request: u64) -> &TxnOutcome {
        let outcome = &self.replies[&RequestId(request)];
        assert_eq!(outcome.aborts.total(), u64::from(outcome.retries), "every retry has a cause");
        outcome
    }

    /// Every participant is idle: nothing prepared, nothing locked (execution locks included).
    fn assert_quiescent(&self) {
        for node in &self.nodes {
            for (_, p) in node.hosts.iter() {
                assert_eq!(
                    (p.prepared_count(), p.lock_count(), exec_locks(p)),
                    (0, 0, 0),
                    "participant left state behind"
                );
            }
        }
    }

    /// A counter summed over every node.
    fn counter(&self, name: &str) -> u64 {
        self.nodes
            .iter()
            .flat_map(|n| n.counters())
            .filter(|(n, _)| *n == name)
            .map(|(_, v)| v)
            .sum()
    }
}

#[test]
fn single_shard_transaction_commits_in_one_round_trip() {
    let mut net = Net::new();
    net.submit(1, rw(&[3], &[(5, 50), (6, 60)]));
    net.answered(&[1]);
    let outcome = net.outcome(1);
    assert_eq!(outcome.result, TxnResult::Committed);
    assert!(outcome.commit_ts.is_some());
    assert_eq!(outcome.shards_touched, 1);
    assert_eq!((net.value(5), net.value(6)), (Some(50), Some(60)));
    assert_eq!(net.delivered, 2, "ExecuteCommit and its reply");
}

#[test]
fn cross_shard_transaction_commits_on_both_shards() {
    let mut net = Net::new();
    net.submit(1, rw(&[], &[(5, 50), (105, 150)]));
    net.answered(&[1]);
    net.settle();
    assert_eq!(net.outcome(1).result, TxnResult::Committed);
    assert_eq!(net.outcome(1).shards_touched, 2);
    assert_eq!((net.value(5), net.value(105)), (Some(50), Some(150)));
    // Reads see the committed writes and the outputs reach the client.
    net.submit(2, rw(&[5, 105], &[]));
    net.answered(&[2]);
    assert_eq!(net.outcome(2).outputs, vec![vec![Datum::Uint(50)], vec![Datum::Uint(150)]]);
    net.assert_quiescent();
}

#[test]
fn dependent_pieces_run_in_waves() {
    let mut net = Net::new();
    net.submit(1, rw(&[], &[(7, 120), (120, 999)]));
    net.answered(&[1]);
    // Piece 0 reads id 7 on shard 0 (= 120); piece 1 on shard 1 reads id 120 and copies it to 130.
    net.submit(
        2,
        TxnRequest {
            proc: meridian_core::txn::ProcId(1),
            args: vec![Datum::Uint(7), Datum::Uint(1), Datum::Uint(130)],
        },
    );
    net.answered(&[2]);
    assert_eq!(net.outcome(2).result, TxnResult::Committed);
    assert_eq!(net.value(130), Some(999));
}

#[test]
fn a_duplicated_reply_of_an_earlier_wave_is_not_taken_for_the_next_wave() {
    // Waves: {piece 0 on shard 0, piece 2 on shard 1}, then {piece 1 on shard 0}. The reply of
    // shard 0's first wave is delivered twice; the copy arrives while the second wave is
    // outstanding on shard 0 and must not be taken for its answer.
    let mut net = Net::new();
    net.submit(1, rw(&[], &[(7, 8), (8, 999), (120, 5)]));
    net.answered(&[1]);
    net.filter = Box::new(|_, msg| match msg {
        OccMsg::Executed { shard: ShardId(0), .. } => Delivery::Duplicate,
        _ => Delivery::Deliver,
    });
    let args = [7, 0, 9, 1, 120].map(Datum::Uint).to_vec();
    net.submit(2, TxnRequest { proc: meridian_core::txn::ProcId(1), args });
    net.answered(&[2]);
    assert_eq!(net.outcome(2).result, TxnResult::Committed);
    assert_eq!(net.outcome(2).outputs.len(), 3);
    assert_eq!(net.value(9), Some(999));
    net.settle();
    net.assert_quiescent();
}

#[test]
fn user_abort_writes_nothing_and_is_not_retried() {
    let mut net = Net::new();
    net.submit(1, rw(&[], &[(5, 1), (105, u64::MAX)]));
    net.submit(2, rw(&[], &[(6, u64::MAX)]));
    net.answered(&[1, 2]);
    for request in [1, 2] {
        assert!(matches!(net.outcome(request).result, TxnResult::UserAborted(_)));
        assert_eq!(net.outcome(request).retries, 0);
    }
    assert_eq!((net.value(5), net.value(6)), (None, None));
    net.assert_quiescent();
}

/// The votes a participant sent in `out`, in order.
fn votes_in(out: &mut Outbox<OccMsg>) -> Vec<Vote> {
    out.drain()
        .filter_map(|e| match e {
            Effect::Send { msg: OccMsg::Prepared { vote, .. }, .. } => Some(vote),
            _ => None,
        })
        .collect()
}

#[test]
fn write_skew_is_prevented_across_shards() {
    // T1 reads x (shard 0) and writes y (shard 1); T2 reads y and writes x. Interleaving their
    // executions before either prepares must not let both commit with stale reads.
    let mut net = Net::new();
    net.submit(1, rw(&[], &[(5, 0), (105, 0)]));
    net.answered(&[1]);
    net.submit(2, rw(&[5], &[(105, 1)]));
    net.submit(3, rw(&[105], &[(5, 1)]));
    net.answered(&[2, 3]);
    net.settle();
    let (t2, t3) = (net.outcome(2), net.outcome(3));
    assert_eq!((&t2.result, &t3.result), (&TxnResult::Committed, &TxnResult::Committed));
    // Serializable: whichever committed second saw the other's write, so at most one retry-free
    // pair of stale reads exists; with both executed concurrently one must have retried.
    assert!(t2.retries + t3.retries >= 1, "one of them had to retry");
    for t in [t2, t3] {
        let conflicts = t.aborts.get(AbortCause::Validation) + t.aborts.get(AbortCause::LockDenied);
        assert_eq!(conflicts, t.retries, "occ aborts only on conflicts here: {:?}", t.aborts);
    }
    assert_eq!((net.value(5), net.value(105)), (Some(1), Some(1)));
    net.assert_quiescent();
}

#[test]
fn conflicting_increments_serialize() {
    // Ten concurrent read-modify-write transactions on the same cross-shard pair: each reads both
    // and writes both with a value one above what it read. Serializability forces a final 10.
    #[derive(Debug)]
    struct Increment;
    impl Procedure for Increment {
        fn name(&self) -> &'static str {
            "inc"
        }
        fn plan(&self, _: &Args, _: PlanContext<'_>) -> Result<Plan, ProcError> {
            Ok(vec![
                PieceSpec { target: ShardTarget::Shard(ShardId(0)), deps: vec![] },
                PieceSpec { target: ShardTarget::Shard(ShardId(1)), deps: vec![] },
            ])
        }
        fn keys(&self, piece: u32, _: &Args, _: &[&PieceOutput]) -> Result<KeySet, ProcError> {
            let id = if piece == 0 { 9 } else { 109 };
            Ok(KeySet { reads: vec![key(id)], writes: vec![key(id)], scans: vec![] })
        }
        fn execute(
            &self,
            piece: u32,
            _: &Args,
            _: &[&PieceOutput],
            reads: &Reads,
        ) -> Result<PieceEffects, UserAbort> {
            let id = if piece == 0 { 9 } else { 109 };
            let next = as_u64(&reads.values[0]) + 1;
            Ok(PieceEffects {
                writes: vec![Write { key: key(id), value: Some(next.to_le_bytes().to_vec()) }],
                output: vec![],
            })
        }
    }
    let mut net = Net::new();
    for node in &mut net.nodes {
        let mut registry = (*node.context.registry).clone();
        registry.register(Arc::new(Increment));
        node.set_registry(Arc::new(registry));
    }
    let requests: Vec<u64> = (1..=10).collect();
    for &r in &requests {
        net.submit(r, TxnRequest { proc: meridian_core::txn::ProcId(2), args: vec![] });
    }
    net.answered(&requests);
    net.settle();
    assert!(requests.iter().all(|&r| net.outcome(r).result == TxnResult::Committed));
    assert_eq!((net.value(9), net.value(109)), (Some(10), Some(10)));
    net.assert_quiescent();
}

#[test]
fn a_duplicated_one_round_commit_applies_once() {
    // The network delivers the single-shard ExecuteCommit twice: the second copy finds the
    // attempt decided and answers with that decision instead of running it again.
    let mut net = Net::new();
    net.filter = Box::new(|_, msg| match msg {
        OccMsg::Request(ShardRequest::ExecuteCommit { .. }) => Delivery::Duplicate,
        _ => Delivery::Deliver,
    });
    net.submit(1, rw(&[5], &[(5, 77)]));
    net.answered(&[1]);
    net.settle();
    assert_eq!(net.outcome(1).result, TxnResult::Committed);
    let versions = net.nodes[0].hosts.get(ShardId(0)).unwrap().store().versions(&key(5)).len();
    assert_eq!(versions, 1, "written once");
    net.assert_quiescent();
}

#[test]
fn lost_replies_never_commit_a_request_twice() {
    // Drop the first ExecutedCommit reply: the coordinator times out, asks with Abort, learns the
    // attempt committed, and answers once without re-running it.
    let mut net = Net::new();
    let mut dropped = false;
    net.filter = Box::new(move |_, msg| {
        if matches!(msg, OccMsg::ExecutedCommit { .. }) && !dropped {
            dropped = true;
            return Delivery::Drop;
        }
        Delivery::Deliver
    });
    net.submit(1, rw(&[5], &[(5, 77)]));
    net.answered(&[1]);
    assert_eq!(net.outcome(1).result, TxnResult::Committed);
    assert_eq!(net.outcome(1).retries, 0, "resolved, not retried");
    let versions = net.nodes[0].hosts.get(ShardId(0)).unwrap().store().versions(&key(5)).len();
    assert_eq!(versions, 1, "written once");
}

#[test]
fn lost_and_duplicated_protocol_messages_still_finish_cleanly() {
    let mut net = Net::new();
    // Seeded coin flips, not a fixed period: a periodic filter can line up with the message
    // pattern of a retry loop and starve one request forever.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    net.filter = Box::new(move |_, msg| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let roll = state % 10;
        match msg {
            OccMsg::Request(ShardRequest::Commit { .. }) | OccMsg::Prepared { .. } if roll < 2 => {
                Delivery::Drop
            }
            OccMsg::Request(ShardRequest::Abort { .. } | ShardRequest::Execute { .. })
            | OccMsg::Finished { .. }
                if roll < 5 =>
            {
                Delivery::Duplicate
            }
            _ => Delivery::Deliver,
        }
    });
    let requests: Vec<u64> = (1..=12).collect();
    for &r in &requests {
        net.submit(r, rw(&[r % 4, 100 + r % 3], &[(r % 4, r), (100 + (r + 1) % 3, r)]));
    }
    net.answered(&requests);
    net.settle();
    for &r in &requests {
        assert_eq!(
            net.outcome(r).result,
            TxnResult::Committed,
            "request {r}: {:?}",
            net.outcome(r)
        );
    }
    net.assert_quiescent();
}

#[test]
fn late_prepare_after_abort_is_refused() {
    let net = Net::new();
    let mut participant =
        new_participant(ShardId(0), net.nodes[0].context.clone(), CcMode::Validation);
    let txn = TxnId { origin: COORDINATOR, incarnation: 0, seq: 9 };
    assert_eq!(
        participant.on_decision(0, txn, Decision::Aborted),
        Some(PeerState::Decided(Decision::Aborted))
    );
    let vote = participant.on_prepare(
        0,
        txn,
        PrepareArgs {
            reads: vec![],
            scans: vec![],
            writes: vec![Write { key: key(1), value: None }],
            one_phase: false,
            participants: vec![ShardId(0), ShardId(1)],
            ts: Timestamp::ZERO,
            epoch: 0,
        },
    );
    assert_eq!(vote, Vote::No(Conflict::AlreadyAborted));
    assert_eq!((participant.prepared_count(), participant.lock_count()), (0, 0));
}

#[test]
fn prepared_readers_block_writers_and_prepared_writers_block_readers() {
    let net = Net::new();
    let context = net.nodes[0].context.clone();
    let mut participant = new_participant(ShardId(0), context, CcMode::Validation);
    let (t1, t2) = (
        TxnId { origin: COORDINATOR, incarnation: 0, seq: 1 },
        TxnId { origin: COORDINATOR, incarnation: 0, seq: 2 },
    );
    assert!(matches!(
        participant.on_prepare(
            10,
            t1,
            PrepareArgs {
                reads: vec![(key(1), None)],
                scans: vec![],
                writes: vec![],
                one_phase: false,
                participants: vec![ShardId(0), ShardId(1)],
                ts: Timestamp::ZERO,
                epoch: 0,
            }
        ),
        Vote::Yes(_)
    ));
    let blocked = participant.on_prepare(
        10,
        t2,
        PrepareArgs {
            reads: vec![],
            scans: vec![],
            writes: vec![Write { key: key(1), value: Some(vec![0; 8]) }],
            one_phase: false,
            participants: vec![ShardId(0), ShardId(1)],
            ts: Timestamp::ZERO,
            epoch: 0,
        },
    );
    assert_eq!(blocked, Vote::No(Conflict::Locked));
    let t3 = TxnId { origin: COORDINATOR, incarnation: 0, seq: 3 };
    assert!(matches!(
        participant.on_prepare(
            10,
            t3,
            PrepareArgs {
                reads: vec![],
                scans: vec![],
                writes: vec![Write { key: key(2), value: None }],
                one_phase: false,
                participants: vec![ShardId(0), ShardId(1)],
                ts: Timestamp::ZERO,
                epoch: 0,
            }
        ),
        Vote::Yes(_)
    ));
    let t4 = TxnId { origin: COORDINATOR, incarnation: 0, seq: 4 };
    assert_eq!(
        participant.on_prepare(
            10,
            t4,
            PrepareArgs {
                reads: vec![(key(2), None)],
                scans: vec![],
                writes: vec![],
                one_phase: false,
                participants: vec![ShardId(0), ShardId(1)],
                ts: Timestamp::ZERO,
                epoch: 0,
            }
        ),
        Vote::No(Conflict::Locked)
    );
    // A stale read is refused even with no lock held.
    participant.on_decision(10, t3, Decision::Committed(Timestamp(500)));
    let t5 = TxnId { origin: COORDINATOR, incarnation: 0, seq: 5 };
    assert_eq!(
        participant.on_prepare(
            10,
            t5,
            PrepareArgs {
                reads: vec![(key(2), None)],
                scans: vec![],
                writes: vec![],
                one_phase: false,
                participants: vec![ShardId(0), ShardId(1)],
                ts: Timestamp::ZERO,
                epoch: 0,
            }
        ),
        Vote::No(Conflict::Stale)
    );
    participant.on_decision(10, t1, Decision::Aborted);
    assert_eq!((participant.prepared_count(), participant.lock_count()), (0, 0));
}

#[test]
fn unknown_procedures_and_non_coordinators_get_clear_failures() {
    let mut net = Net::new();
    net.submit(1, TxnRequest { proc: meridian_core::txn::ProcId(77), args: vec![] });
    net.answered(&[1]);
    assert!(
        matches!(&net.outcome(1).result, TxnResult::Failed(TxnFailure::Procedure(ProcError::BadArgs(m))) if m.contains("unknown procedure"))
    );
    let mut out = Outbox::new();
    net.nodes[0].submit(0, ClientRequest { id: RequestId(2), txn: rw(&[], &[]) }, &mut out);
    assert!(
        matches!(out.drain().next(), Some(Effect::Reply { outcome, .. }) if matches!(outcome.result, TxnResult::Failed(TxnFailure::Rejected(_))))
    );
}

/// True for what a coordinator gone after sending its prepares would never hear: votes,
/// query answers and acknowledgements.
fn gone(to: NodeId, msg: &OccMsg) -> bool {
    to == COORDINATOR
        && matches!(msg, OccMsg::Prepared { .. } | OccMsg::State { .. } | OccMsg::Finished { .. })
}

/// Both participants prepared; the coordinator hears nothing more (as if it crashed). The
/// participants find each other prepared and commit on their own, at the same timestamp.
#[test]
fn participants_commit_an_attempt_all_of_them_prepared_when_the_coordinator_is_gone() {
    let mut net = Net::new();
    net.filter = Box::new(|to, msg| if gone(to, msg) { Delivery::Drop } else { Delivery::Deliver });
    net.submit(1, rw(&[5, 105], &[(5, 55), (105, 155)]));
    net.run_until(|net| net.value(5).is_some() && net.value(105).is_some());
    assert!(!net.replies.contains_key(&RequestId(1)), "the coordinator never heard");
    assert_eq!((net.value(5), net.value(105)), (Some(55), Some(155)));
    let ts = |shard: u32, id: u64| {
        net.nodes[shard as usize].hosts.get(ShardId(shard)).unwrap().store().versions(&key(id))[0]
            .ts
    };
    assert_eq!(ts(0, 5), ts(1, 105), "one commit timestamp on both shards");
    net.assert_quiescent();
}

/// One participant never saw the prepare. Asked by the other, it refuses the attempt for good,
/// so the prepared one aborts, and a late prepare is refused.
#[test]
fn participants_abort_an_attempt_one_of_them_never_prepared() {
    let mut net = Net::new();
    net.filter = Box::new(|to, msg| match msg {
        _ if gone(to, msg) => Delivery::Drop,
        OccMsg::Request(ShardRequest::Prepare { shard: ShardId(1), .. }) => Delivery::Drop,
        _ => Delivery::Deliver,
    });
    net.submit(1, rw(&[5, 105], &[(5, 55), (105, 155)]));
    net.run_until(|net| net.nodes[0].hosts.get(ShardId(0)).unwrap().prepared_count() == 1);
    net.run_until(|net| net.nodes[0].hosts.get(ShardId(0)).unwrap().prepared_count() == 0);
    assert_eq!((net.value(5), net.value(105)), (None, None), "nothing installed");
    net.assert_quiescent();
    let shard1 = net.nodes[1].hosts.get_mut(ShardId(1)).unwrap();
    let txn = TxnId { origin: COORDINATOR, incarnation: 0, seq: 0 };
    assert_eq!(shard1.on_query(0, txn), PeerState::Decided(Decision::Aborted));
}

/// A prepared attempt stays prepared even when its coordinator's low-water mark passes it (a
/// later attempt of the same coordinator was decided and evicted first): its commit installs,
/// and queries see it prepared, not forgotten. (Swarm seed 8 of the three-server scenario lost
/// committed writes before this was so.)
#[test]
fn a_prepared_attempt_is_never_taken_for_a_forgotten_one() {
    let net = Net::new();
    let mut context = net.nodes[0].context.clone();
    context.limits.decided_max = 2;
    let mut participant = new_participant(ShardId(0), context, CcMode::Validation);
    let txn = |seq| TxnId { origin: COORDINATOR, incarnation: 0, seq };
    let both = vec![ShardId(0), ShardId(1)];
    let prepare = |key_id: u64| PrepareArgs {
        reads: vec![],
        scans: vec![],
        writes: vec![Write { key: key(key_id), value: Some(7u64.to_le_bytes().to_vec()) }],
        one_phase: false,
        participants: both.clone(),
        ts: Timestamp::ZERO,
        epoch: 0,
    };
    assert!(matches!(participant.on_prepare(10, txn(1), prepare(1)), Vote::Yes(_)));
    // Later attempts of the same coordinator are refused and evicted.
    for seq in 2..=6 {
        participant.on_decision(10, txn(seq), Decision::Aborted);
    }
    assert!(matches!(participant.on_query(10, txn(1)), PeerState::Prepared(_)));
    assert!(matches!(participant.on_prepare(10, txn(1), prepare(1)), Vote::Yes(_)));
    let committed = Decision::Committed(Timestamp(1_000));
    assert_eq!(participant.on_decision(20, txn(1), committed), Some(PeerState::Decided(committed)));
    assert!(participant.store().get_at(&key(1), Timestamp::MAX).is_some(), "the commit installed");
    assert_eq!(participant.on_query(30, txn(2)), PeerState::Forgotten, "an evicted refusal");
}

/// The bounded version of the `wire_messages` fuzz target: mutated and random connection
/// streams through the real reader, decoding `OccMsg`, never panic (stable, in CI).
#[test]
fn mutated_and_random_connection_streams_never_panic_the_reader() {
    let txn = TxnId { origin: NodeId(1), incarnation: 3, seq: 9 };
    let msgs = vec![
        OccMsg::Request(ShardRequest::Execute {
            txn,
            shard: ShardId(0),
            priority: 7,
            ts: Timestamp::ZERO,
            proc: meridian_core::txn::ProcId(0),
            args: rw(&[1, 2], &[(3, 4)]).args,
            calls: vec![PieceCall { piece: 0, inputs: vec![vec![Datum::Uint(5)]] }],
            overlay: vec![Write { key: key(1), value: None }],
        }),
        OccMsg::Prepared { txn, shard: ShardId(1), vote: Vote::Yes(Timestamp(8)) },
        OccMsg::Forward {
            origin: NodeId(2),
            request: ShardRequest::Query { txn, shard: ShardId(0) },
        },
    ];
    meridian_core::testing::check_message_streams(msgs, 3, 5_000, "connection-property");
}

fn scan_of(first: u64, end: u64) -> meridian_core::txn::ScanRange {
    meridian_core::txn::ScanRange { start: key(first), end: key(end), limit: 100, reverse: false }
}

/// A prepare whose scan no longer matches (a row was inserted into the range since) votes no;
/// one whose scan is current votes yes, and then a write into its range is refused while it
/// is prepared (phantom protection in both directions).
#[test]
fn a_prepare_carrying_a_stale_scan_votes_no() {
    let net = Net::new();
    let mut participant =
        new_participant(ShardId(0), net.nodes[0].context.clone(), CcMode::Validation);
    let txn = |seq| TxnId { origin: COORDINATOR, incarnation: 0, seq };
    let both = vec![ShardId(0), ShardId(1)];
    let args = |scans, writes| PrepareArgs {
        reads: vec![],
        scans,
        writes,
        one_phase: false,
        participants: both.clone(),
        ts: Timestamp::ZERO,
        epoch: 0,
    };
    let empty = crate::kit::exec::ScanCheck { range: scan_of(10, 20), rows: vec![] };
    // A row appears in the range (another attempt commits an insert).
    let insert = vec![Write { key: key(15), value: Some(vec![1]) }];
    assert!(matches!(participant.on_prepare(5, txn(1), args(vec![], insert)), Vote::Yes(_)));
    participant.on_decision(5, txn(1), Decision::Committed(Timestamp(100)));
    assert_eq!(
        participant.on_prepare(6, txn(2), args(vec![empty.clone()], vec![])),
        Vote::No(Conflict::Stale),
        "the scan saw no row, the range now holds one"
    );
    let seen = participant.store().scan(&scan_of(10, 20), Timestamp::MAX);
    let current = crate::kit::exec::ScanCheck {
        range: scan_of(10, 20),
        rows: seen
            .iter()
            .map(|(k, v)| (k.clone(), VersionTag { ts: v.ts, writer: v.writer }))
            .collect(),
    };
    assert!(matches!(participant.on_prepare(7, txn(3), args(vec![current], vec![])), Vote::Yes(_)));
    let phantom = vec![Write { key: key(12), value: Some(vec![2]) }];
    assert_eq!(
        participant.on_prepare(8, txn(4), args(vec![], phantom)),
        Vote::No(Conflict::Locked),
        "an insert into a range a prepared attempt scanned"
    );
}

/// The commit timestamp rule: a participant proposes above its clock, its last commit and
/// every version of the keys it read or will write; the coordinator commits at the largest
/// proposal, and every participant installs at exactly that timestamp.
#[test]
fn commits_land_above_every_version_read_or_overwritten_at_one_timestamp_on_every_shard() {
    let mut net = Net::new();
    // A version far in the future on shard 1 (a fast clock wrote it).
    let future = Timestamp(1 << 50);
    let writer = TxnId { origin: COORDINATOR, incarnation: 0, seq: 77 };
    net.nodes[1]
        .stores_mut()
        .into_iter()
        .find(|(s, _)| *s == ShardId(1))
        .unwrap()
        .1
        .write(
            key(105),
            future,
            Some(9u64.to_le_bytes().to_vec()),
            writer,
            meridian_storage::VersionState::Committed,
        )
        .unwrap();
    net.submit(1, rw(&[5, 105], &[(5, 1), (105, 2)]));
    net.answered(&[1]);
    net.settle();
    let outcome = net.outcome(1).clone();
    assert_eq!(outcome.result, TxnResult::Committed);
    let ts = outcome.commit_ts.expect("a commit timestamp");
    assert!(ts > future, "{ts:?} must be above the version it overwrote");
    let installed = |shard: u32, id: u64| {
        let store = net.nodes[shard as usize].hosts.get(ShardId(shard)).unwrap().store();
        store.versions(&key(id)).last().unwrap().ts
    };
    assert_eq!((installed(0, 5), installed(1, 105)), (ts, ts));
    assert_eq!(outcome.path, meridian_core::txn::CommitPath::TwoPhase);
    // The next commit on shard 0 goes above this one, though shard 0's clock is far behind.
    net.submit(2, rw(&[], &[(6, 3)]));
    net.answered(&[2]);
    assert!(net.outcome(2).commit_ts.unwrap() > ts);
    assert_eq!(net.outcome(2).path, meridian_core::txn::CommitPath::OneRound);
}

/// A replicated shard's leader answers a prepare only once the prepare's log entry is
/// committed (durable on a quorum): with its followers cut off, the vote never leaves; once
/// they hear it, it does.
#[test]
fn a_replicated_leader_answers_only_after_the_log_entry_commits() {
    let topology = Arc::new(Topology::standard(vec!["r0".into()], 1, 3).unwrap());
    let mut registry = Registry::default();
    registry.register(Arc::new(ReadWrite));
    let partitioner =
        Partitioner::new(1, PartitionRule::LeadingInt { base: 0, per_shard: 1_000 }).unwrap();
    let mut nodes: Vec<OccNode> = topology
        .node_ids()
        .map(|id| {
            OccNode::new(NodeContext::new(
                id,
                topology.clone(),
                Arc::new(registry.clone()),
                Arc::new(partitioner.clone()),
                1,
                Timing::for_network(NS_PER_MS),
            ))
        })
        .collect();
    let leader = topology.replica_node(ShardId(0), 0).unwrap();
    let coordinator = topology.coordinators()[0];
    // Runs every node's effects to quiescence: messages (those `deliver` allows), persists
    // completed at once, timers fired in order. Returns the messages to the coordinator.
    let mut queue: VecDeque<(NodeId, NodeId, OccMsg)> = VecDeque::new();
    let mut persisted: VecDeque<(NodeId, PersistToken)> = VecDeque::new();
    let mut timers: Vec<(Time, NodeId, TimerId)> = Vec::new();
    let mut now: Time = 1_000 * NS_PER_MS;
    let drain = |from: NodeId,
                 out: &mut Outbox<OccMsg>,
                 queue: &mut VecDeque<(NodeId, NodeId, OccMsg)>,
                 persisted: &mut VecDeque<(NodeId, PersistToken)>,
                 timers: &mut Vec<(Time, NodeId, TimerId)>,
                 now: Time| {
        for effect in out.drain() {
            match effect {
                Effect::Send { to, msg } => queue.push_back((from, to, msg)),
                Effect::Persist { token, .. } => persisted.push_back((from, token)),
                Effect::SetTimer { timer, after_ns } => timers.push((now + after_ns, from, timer)),
                Effect::Reply { .. } | Effect::DependsOn { .. } => {}
            }
        }
    };
    for (i, node) in nodes.iter_mut().enumerate() {
        let mut out = Outbox::new();
        node.on_start(now, &mut out);
        drain(NodeId(i as u32), &mut out, &mut queue, &mut persisted, &mut timers, now);
    }
    let mut votes = Vec::new();
    // Runs until nothing is queued and no timer is due by `until`.
    let run = |nodes: &mut Vec<OccNode>,
               queue: &mut VecDeque<(NodeId, NodeId, OccMsg)>,
               persisted: &mut VecDeque<(NodeId, PersistToken)>,
               timers: &mut Vec<(Time, NodeId, TimerId)>,
               now: &mut Time,
               until: Time,
               followers_cut: bool,
               votes: &mut Vec<Vote>| {
        for _ in 0..20_000 {
            if let Some((node, token)) = persisted.pop_front() {
                let mut out = Outbox::new();
                nodes[node.0 as usize].on_persisted(*now, token, &mut out);
                drain(node, &mut out, queue, persisted, timers, *now);
                continue;
            }
            if let Some((from, to, msg)) = queue.pop_front() {
                if to == coordinator {
                    if let OccMsg::Prepared { vote, .. } = &msg {
                        votes.push(*vote);
                    }
                    continue;
                }
                let cut = followers_cut && from == leader && to != leader;
                if cut {
                    continue;
                }
                let mut out = Outbox::new();
                nodes[to.0 as usize].on_message(*now, from, msg, &mut out);
                drain(to, &mut out, queue, persisted, timers, *now);
                continue;
            }
            timers.sort_unstable();
            if timers.is_empty() || timers[0].0 > until {
                *now = until;
                return;
            }
            let (at, node, timer) = timers.remove(0);
            *now = (*now).max(at);
            let mut out = Outbox::new();
            nodes[node.0 as usize].on_timer(*now, timer, &mut out);
            drain(node, &mut out, queue, persisted, timers, *now);
        }
    };
    // Elect the leader (replica 0 campaigns at start).
    let until = now + 100 * NS_PER_MS;
    run(&mut nodes, &mut queue, &mut persisted, &mut timers, &mut now, until, false, &mut votes);
    assert!(nodes[leader.0 as usize].hosts.leads(ShardId(0)), "replica 0 leads");
    let prepare = ShardRequest::Prepare {
        txn: TxnId { origin: coordinator, incarnation: 0, seq: 1 },
        shard: ShardId(0),
        args: PrepareArgs {
            reads: vec![],
            scans: vec![],
            writes: vec![Write { key: key(3), value: Some(vec![1]) }],
            one_phase: false,
            participants: vec![ShardId(0)],
            ts: Timestamp::ZERO,
            epoch: 0,
        },
    };
    queue.push_back((coordinator, leader, OccMsg::Request(prepare)));
    // Cut for less than an election timeout (10 ticks of 25 ms): the leader stays leader.
    let until = now + 150 * NS_PER_MS;
    run(&mut nodes, &mut queue, &mut persisted, &mut timers, &mut now, until, true, &mut votes);
    assert!(nodes[leader.0 as usize].hosts.leads(ShardId(0)), "still the leader");
    assert!(votes.is_empty(), "the leader voted before its prepare was on a quorum: {votes:?}");
    // Raft sends what the cut dropped again with its next heartbeats.
    let until = now + 200 * NS_PER_MS;
    run(&mut nodes, &mut queue, &mut persisted, &mut timers, &mut now, until, false, &mut votes);
    assert!(matches!(votes.as_slice(), [Vote::Yes(_)]), "{votes:?}");
}

/// A one-round commit whose reply is lost, forgotten by its shard (a cache of two decisions)
/// before the coordinator asks with an abort: the answer is "forgotten", and the request is
/// reported unknown, never run again. (Answering the abort as applied made swarms with
/// shrunken caches commit transfers twice.)
#[test]
fn a_forgotten_one_round_commit_is_reported_unknown_not_retried() {
    let mut net = Net::with_limits(crate::Limits { decided_max: 2, ..crate::Limits::default() });
    let mut dropped = false;
    net.filter = Box::new(move |_, msg| {
        if matches!(msg, OccMsg::ExecutedCommit { .. }) && !dropped {
            dropped = true;
            return Delivery::Drop;
        }
        Delivery::Deliver
    });
    net.submit(1, rw(&[], &[(5, 77)]));
    for r in 2..=5 {
        net.submit(r, rw(&[], &[(10 + r, r)]));
    }
    net.answered(&[2, 3, 4, 5]);
    net.answered(&[1]);
    assert!(
        matches!(&net.outcome(1).result, TxnResult::Failed(TxnFailure::Indeterminate(_))),
        "{:?}",
        net.outcome(1)
    );
    let versions = net.nodes[0].hosts.get(ShardId(0)).unwrap().store().versions(&key(5)).len();
    assert_eq!(versions, 1, "written once, never again");
}

/// A prepare listing a key twice, or with keys of another shard, is refused before it enters
/// the shard's log, with a clear vote; the shard goes on serving. Applied anyway (as a log
/// entry written by another version's leader would be), it is skipped, never a panic. A
/// commit below the prepare's proposal is refused as a value.
#[test]
fn malformed_requests_cost_their_sender_the_request_never_the_shard() {
    let mut net = Net::new();
    let txn = TxnId { origin: COORDINATOR, incarnation: 0, seq: 42 };
    let both = vec![ShardId(0), ShardId(1)];
    let twice = PrepareArgs {
        reads: vec![],
        scans: vec![],
        writes: vec![
            Write { key: key(3), value: Some(vec![1]) },
            Write { key: key(3), value: Some(vec![2]) },
        ],
        one_phase: false,
        participants: both.clone(),
        ts: Timestamp::ZERO,
        epoch: 0,
    };
    let elsewhere =
        PrepareArgs { writes: vec![Write { key: key(150), value: None }], ..twice.clone() };
    for args in [twice.clone(), elsewhere] {
        let mut out = Outbox::new();
        let request = ShardRequest::Prepare { txn, shard: ShardId(0), args };
        net.nodes[0].on_message(net.now, COORDINATOR, OccMsg::Request(request), &mut out);
        assert_eq!(votes_in(&mut out), vec![Vote::No(Conflict::Invalid)]);
    }
    // As a log command, it fails validation and is never applied.
    let participant = net.nodes[0].hosts.get(ShardId(0)).unwrap();
    let command =
        ShardCommand::Prepare { reply_to: COORDINATOR, now: 1, txn, refused: None, args: twice };
    assert!(crate::kit::host::StateMachine::validate(participant, &command).is_err());
    // The shard serves the next request.
    net.submit(1, rw(&[3], &[(3, 9)]));
    net.answered(&[1]);
    assert_eq!(net.outcome(1).result, TxnResult::Committed);
    // A commit below the proposal is refused, counted, and leaves the attempt prepared.
    let mut participant =
        new_participant(ShardId(0), net.nodes[0].context.clone(), CcMode::Validation);
    let prepare = PrepareArgs {
        reads: vec![],
        scans: vec![],
        writes: vec![Write { key: key(4), value: Some(vec![1]) }],
        one_phase: false,
        participants: both,
        ts: Timestamp::ZERO,
        epoch: 0,
    };
    let Vote::Yes(proposal) = participant.on_prepare(1_000, txn, prepare) else { panic!() };
    let below = Decision::Committed(Timestamp(proposal.0 - 1));
    assert_eq!(participant.on_decision(1_000, txn, below), None);
    assert_eq!(participant.prepared_count(), 1, "still prepared");
    let at = Decision::Committed(proposal);
    assert_eq!(participant.on_decision(1_000, txn, at), Some(PeerState::Decided(at)));
}

// ---- `2pl`: the same engine with execution locks (`CcMode::Locking`). ----

use crate::kit::locks::Policy;

/// The attempt id the test coordinator gives its `seq`-th attempt.
fn attempt(seq: u64) -> TxnId {
    TxnId { origin: COORDINATOR, incarnation: 0, seq }
}

/// Moves the queued message matching `pick` to the front.
fn to_front(net: &mut Net, pick: impl Fn(&OccMsg) -> bool) {
    let at = net.queue.iter().position(|(_, _, m)| pick(m)).expect("message queued");
    let msg = net.queue.remove(at).unwrap();
    net.queue.push_front(msg);
}

fn execute_of(txn: TxnId, to: ShardId) -> impl Fn(&OccMsg) -> bool {
    move |m| {
        matches!(m, OccMsg::Request(ShardRequest::Execute { txn: t, shard, .. })
            if *t == txn && *shard == to)
    }
}

/// Under no-wait an execution that meets another attempt's lock is refused at once (occ would
/// run it and fail it at prepare); the refused request retries and both commit, in some order.
#[test]
fn twopl_no_wait_refuses_a_conflicting_execution_at_once() {
    let mut net = Net::locking(Policy::NoWait);
    net.submit(1, rw(&[5], &[(105, 1)]));
    net.submit(2, rw(&[105], &[(5, 2)]));
    net.answered(&[1, 2]);
    assert_eq!(net.outcome(1).result, TxnResult::Committed);
    assert_eq!(net.outcome(2).result, TxnResult::Committed);
    assert!(net.counter("twopl_lock_denied_total") >= 1, "the second execution was refused");
    let retries = u64::from(net.outcome(1).retries + net.outcome(2).retries);
    assert_eq!(retries, net.counter("occ_coordinator_retried_total"));
    // Serial: whichever committed second read the other's write.
    let (first, second) =
        if net.outcome(1).commit_ts < net.outcome(2).commit_ts { (1, 2) } else { (2, 1) };
    // Request 1 reads id 5 in its piece on shard 0; request 2 reads id 105 on shard 1.
    let read_by_second = match second {
        1 => &net.outcome(1).outputs[0],
        _ => &net.outcome(2).outputs[1],
    };
    assert_eq!(read_by_second, &vec![Datum::Uint(first)], "request {second} read {first}'s write");
    net.settle();
    net.assert_quiescent();
}

/// Submits T1 and, `gap_ns` later, T2, both writing ids 5 (shard 0) and 105 (shard 1), and
/// queues their executions crossed: T1 -> shard 0 and T2 -> shard 1 come first.
fn submit_crossed(net: &mut Net, gap_ns: u64) {
    net.submit(1, rw(&[], &[(5, 1), (105, 1)]));
    net.now += gap_ns;
    net.submit(2, rw(&[], &[(5, 2), (105, 2)]));
    to_front(net, execute_of(attempt(1), ShardId(1)));
    to_front(net, execute_of(attempt(0), ShardId(0)));
}

/// The deadlock-prone schedule: T1 locks 5 (shard 0) and T2 locks 105 (shard 1), then each asks
/// for the other's key. Under wound-wait the older T1 wounds T2 and commits without a retry;
/// T2 waits for T1 on shard 0, fails its prepare on shard 1 (wounded), and commits on retry.
#[test]
fn twopl_wound_wait_breaks_the_cycle_in_favour_of_the_older_attempt() {
    let mut net = Net::locking(Policy::WoundWait);
    submit_crossed(&mut net, NS_PER_MS); // T2 is younger.
    net.step();
    net.step();
    assert_eq!(net.counter("twopl_exec_holders"), 2);
    net.answered(&[1, 2]);
    assert_eq!(net.outcome(1).result, TxnResult::Committed);
    assert_eq!(net.outcome(1).retries, 0, "the older attempt never aborts");
    assert_eq!(net.outcome(2).result, TxnResult::Committed);
    assert!(net.outcome(2).retries >= 1, "the younger one was wounded");
    assert_eq!(net.counter("twopl_wounded_total"), 1);
    assert_eq!(net.outcome(2).aborts.get(AbortCause::Wounded), 1, "reported as wounded");
    assert_eq!(net.counter("twopl_lock_waits_total"), 1, "T2 waited for T1 on shard 0");
    assert!(net.outcome(1).commit_ts < net.outcome(2).commit_ts);
    assert_eq!((net.value(5), net.value(105)), (Some(2), Some(2)));
    net.settle();
    net.assert_quiescent();
}

/// The same schedule under no-wait: both crossed executions are refused and both retry; no
/// one waits and no one is wounded.
#[test]
fn twopl_no_wait_refuses_both_sides_of_the_cycle() {
    let mut net = Net::locking(Policy::NoWait);
    submit_crossed(&mut net, 0);
    net.answered(&[1, 2]);
    assert_eq!(net.counter("twopl_lock_denied_total"), 2);
    assert_eq!((net.counter("twopl_wounded_total"), net.counter("twopl_lock_waits_total")), (0, 0));
    assert!(net.outcome(1).retries >= 1 && net.outcome(2).retries >= 1);
    for request in [1, 2] {
        let aborts = net.outcome(request).aborts;
        assert!(aborts.get(AbortCause::LockDenied) >= 1, "{aborts:?}");
        assert_eq!(aborts.get(AbortCause::Wounded), 0);
    }
    assert_eq!(net.outcome(1).result, TxnResult::Committed);
    assert_eq!(net.outcome(2).result, TxnResult::Committed);
    net.settle();
    net.assert_quiescent();
}

/// The coordinator crashes between shards: shard 0 prepared, shard 1 only ran its piece (and
/// holds its execution lock). Shard 0 asks shard 1, which refuses the attempt for good and
/// releases the lock; shard 0 aborts. Nothing is half applied and no lock outlives the crash.
#[test]
fn twopl_a_coordinator_crash_between_prepares_aborts_everywhere_and_frees_every_lock() {
    let mut net = Net::locking(Policy::NoWait);
    net.filter = Box::new(|to, msg| match msg {
        _ if gone(to, msg) => Delivery::Drop,
        OccMsg::Request(ShardRequest::Prepare { shard: ShardId(1), .. }) => Delivery::Drop,
        OccMsg::Request(ShardRequest::Abort { .. } | ShardRequest::Query { .. })
            if to == COORDINATOR =>
        {
            Delivery::Drop
        }
        _ => Delivery::Deliver,
    });
    net.submit(1, rw(&[], &[(5, 55), (105, 155)]));
    net.run_until(|net| net.nodes[0].hosts.get(ShardId(0)).unwrap().prepared_count() == 1);
    assert!(exec_locks(net.nodes[1].hosts.get(ShardId(1)).unwrap()) > 0);
    net.run_until(|net| net.nodes[0].hosts.get(ShardId(0)).unwrap().prepared_count() == 0);
    net.run_until(|net| exec_locks(net.nodes[1].hosts.get(ShardId(1)).unwrap()) == 0);
    assert_eq!((net.value(5), net.value(105)), (None, None), "nothing installed");
    assert!(!net.replies.contains_key(&RequestId(1)), "the coordinator never heard");
    // A new transaction takes the keys at once.
    net.filter = Box::new(|_, _| Delivery::Deliver);
    net.submit(2, rw(&[], &[(5, 7), (105, 8)]));
    net.answered(&[2]);
    assert_eq!(net.outcome(2).result, TxnResult::Committed);
    assert_eq!((net.value(5), net.value(105)), (Some(7), Some(8)));
}

/// A coordinator that vanishes after execution (no prepare, no abort ever arrives) leaves
/// execution locks behind; the lease releases them and the attempt can no longer prepare.
#[test]
fn twopl_execution_locks_of_a_vanished_coordinator_expire_with_the_lease() {
    let mut net = Net::locking(Policy::NoWait);
    net.filter = Box::new(|to, msg| {
        if to == COORDINATOR || matches!(msg, OccMsg::Request(ShardRequest::Abort { .. })) {
            Delivery::Drop
        } else {
            Delivery::Deliver
        }
    });
    net.submit(1, rw(&[], &[(5, 55), (105, 155)]));
    net.run_until(|net| net.counter("twopl_exec_holders") == 2);
    net.run_until(|net| net.counter("twopl_lease_expired_total") == 2);
    assert_eq!(net.counter("twopl_exec_holders"), 0);
    // A late prepare of the expired attempt is refused, and the refusal is remembered.
    let args = PrepareArgs {
        reads: vec![],
        scans: vec![],
        writes: vec![Write { key: key(5), value: None }],
        one_phase: false,
        participants: vec![ShardId(0), ShardId(1)],
        ts: Timestamp::ZERO,
        epoch: 0,
    };
    let request = ShardRequest::Prepare { txn: attempt(0), shard: ShardId(0), args };
    let mut out = Outbox::new();
    net.nodes[0].on_message(net.now, NodeId(1), OccMsg::Request(request), &mut out);
    assert_eq!(votes_in(&mut out), vec![Vote::No(Conflict::LeaseExpired)]);
    let shard0 = net.nodes[0].hosts.get_mut(ShardId(0)).unwrap();
    assert_eq!(shard0.on_query(0, attempt(0)), PeerState::Decided(Decision::Aborted));
}

/// A one-round commit meets an execution lock of a cross-shard attempt: refused (never
/// waiting, whatever the policy), the refusal recorded, and the request retried after the
/// holder commits.
#[test]
fn twopl_a_one_round_commit_respects_execution_locks() {
    let mut net = Net::locking(Policy::WoundWait);
    net.filter = Box::new(|_, msg| {
        // Hold the cross-shard attempt's prepares back once (they are resent on timeout).
        if matches!(msg, OccMsg::Request(ShardRequest::Prepare { txn, .. }) if txn.seq == 0) {
            Delivery::Drop
        } else {
            Delivery::Deliver
        }
    });
    net.submit(1, rw(&[], &[(5, 1), (105, 1)]));
    net.run_until(|net| net.counter("twopl_exec_holders") == 2);
    net.submit(2, rw(&[5], &[(6, 2)]));
    net.run_until(|net| net.counter("twopl_lock_denied_total") == 1);
    net.filter = Box::new(|_, _| Delivery::Deliver);
    net.answered(&[1, 2]);
    assert_eq!(net.outcome(2).result, TxnResult::Committed);
    assert!(net.outcome(2).retries >= 1);
    net.settle();
    net.assert_quiescent();
}

/// With room for one lock holder per leader, a second attempt's execution is refused as
/// `Full` (not queued, not admitted) while the first holds its locks, and commits once it is
/// done.
#[test]
fn twopl_lock_holders_beyond_the_limit_are_refused_not_admitted() {
    let limits = crate::Limits { lock_holders_max: 1, ..crate::Limits::default() };
    let mut net = Net::build(limits, CcMode::Locking(Policy::WoundWait));
    net.submit(1, rw(&[], &[(5, 1), (105, 1)]));
    net.submit(2, rw(&[], &[(6, 2), (106, 2)]));
    net.step();
    net.step();
    assert_eq!(net.counter("twopl_exec_holders"), 2, "one holder on each shard");
    net.step();
    net.step();
    assert_eq!(net.counter("twopl_exec_holders"), 2, "the second attempt was not admitted");
    net.answered(&[1, 2]);
    assert_eq!(net.outcome(1).retries, 0);
    assert!(net.outcome(2).retries >= 1);
    assert_eq!((net.value(6), net.value(106)), (Some(2), Some(2)));
    net.settle();
    net.assert_quiescent();
}

// ---- 2pc-mvto -------------------------------------------------------------------------------

/// A `2pc-mvto` participant of shard 0 (keys 0..100) and attempt ids for it.
fn mvto_participant() -> Participant {
    let context = Net::new().nodes[0].context.clone();
    new_participant(ShardId(0), context, CcMode::Mvto)
}

/// A prepare at `ts` reading `reads` (id and the version seen) and writing `writes`.
fn mvto_args(
    ts: u64,
    reads: &[(u64, Option<VersionTag>)],
    writes: &[(u64, u64)],
    one_phase: bool,
) -> PrepareArgs {
    PrepareArgs {
        reads: reads.iter().map(|&(id, seen)| (key(id), seen)).collect(),
        scans: vec![],
        writes: writes
            .iter()
            .map(|&(id, v)| Write { key: key(id), value: Some(v.to_le_bytes().to_vec()) })
            .collect(),
        one_phase,
        participants: if one_phase { vec![ShardId(0)] } else { vec![ShardId(0), ShardId(1)] },
        ts: Timestamp(ts),
        epoch: 0,
    }
}

fn tag(ts: u64, writer: TxnId) -> Option<VersionTag> {
    Some(VersionTag { ts: Timestamp(ts), writer })
}

/// The value and writer a read of `id` at `ts` sees.
fn mvto_read(p: &Participant, id: u64, ts: u64) -> Option<(u64, TxnId)> {
    use crate::kit::exec::ReadSource;
    let source = crate::mvto::order::Below(p.store(), Timestamp(ts));
    source.read(&key(id)).map(|v| (as_u64(&v.value), v.writer))
}

#[test]
fn mvto_reads_see_the_newest_version_below_their_timestamp() {
    let mut p = mvto_participant();
    let (t1, t2) = (attempt(1), attempt(2));
    assert_eq!(
        p.on_prepare(0, t1, mvto_args(100, &[], &[(1, 10)], true)),
        Vote::Committed(Timestamp(100))
    );
    assert_eq!(
        p.on_prepare(0, t2, mvto_args(200, &[], &[(1, 20)], true)),
        Vote::Committed(Timestamp(200))
    );
    assert_eq!(mvto_read(&p, 1, 150), Some((10, t1)), "history below a newer commit");
    assert_eq!(mvto_read(&p, 1, 201), Some((20, t2)));
    assert_eq!(
        mvto_read(&p, 1, 100),
        None,
        "a version at the reader's own timestamp is not below it"
    );
    // A reader at 150 that saw t1's version still validates: t2's version is above it.
    let t3 = attempt(3);
    assert_eq!(
        p.on_prepare(0, t3, mvto_args(150, &[(1, tag(100, t1))], &[], true)),
        Vote::Committed(Timestamp(150))
    );
}

#[test]
fn mvto_writes_below_a_prepared_read_or_a_newer_version_are_too_old() {
    let mut p = mvto_participant();
    let (reader, writer) = (attempt(1), attempt(2));
    assert_eq!(
        p.on_prepare(0, reader, mvto_args(300, &[(1, None)], &[], false)),
        Vote::Yes(Timestamp(300))
    );
    assert_eq!(
        p.on_prepare(0, writer, mvto_args(250, &[], &[(1, 5)], false)),
        Vote::No(Conflict::TooOld(Timestamp(300))),
        "the prepared read at 300 stamped the key"
    );
    assert_eq!(
        p.on_prepare(0, attempt(3), mvto_args(350, &[], &[(1, 5)], true)),
        Vote::Committed(Timestamp(350))
    );
    assert_eq!(
        p.on_prepare(0, attempt(4), mvto_args(340, &[], &[(1, 6)], true)),
        Vote::No(Conflict::TooOld(Timestamp(350))),
        "versions are only added on top"
    );
    // The reader's decision changes none of this, and a refused attempt stays refused.
    p.on_decision(0, reader, Decision::Committed(Timestamp(300)));
    assert_eq!(
        p.on_prepare(0, writer, mvto_args(250, &[], &[(1, 5)], false)),
        Vote::No(Conflict::AlreadyAborted)
    );
    assert_eq!(p.prepared_count(), 0);
}

#[test]
fn mvto_a_prepare_that_read_a_pending_version_waits_for_its_writer() {
    for writer_commits in [true, false] {
        let mut p = mvto_participant();
        let (writer, reader) = (attempt(1), attempt(2));
        assert_eq!(
            p.on_prepare(0, writer, mvto_args(400, &[], &[(1, 7)], false)),
            Vote::Yes(Timestamp(400))
        );
        assert_eq!(mvto_read(&p, 1, 450), Some((7, writer)), "a pending version is read");
        let args = mvto_args(450, &[(1, tag(400, writer))], &[(2, 8)], false);
        assert!(p.hold_prepare(0, COORDINATOR, reader, args,).is_none(), "held for the writer");
        assert!(p.take_unblocked().is_empty());
        let decision =
            if writer_commits { Decision::Committed(Timestamp(400)) } else { Decision::Aborted };
        p.on_decision(0, writer, decision);
        let mut ready = p.take_unblocked();
        assert_eq!(ready.len(), 1, "the writer is decided: the prepare goes on");
        let (origin, txn, args) = ready.remove(0);
        assert_eq!((origin, txn), (COORDINATOR, reader));
        let vote = p.on_prepare(0, reader, args);
        if writer_commits {
            assert_eq!(vote, Vote::Yes(Timestamp(450)));
            assert_eq!(mvto_read(&p, 1, 500), Some((7, writer)));
        } else {
            assert_eq!(vote, Vote::No(Conflict::Cascading), "it read a write that never happened");
            assert_eq!(mvto_read(&p, 1, 500), None, "the aborted write is gone");
            assert_eq!(
                p.counters().iter().find(|c| c.0 == "mvto_cascading_aborts_total").unwrap().1,
                1
            );
        }
    }
}

#[test]
fn mvto_a_read_at_a_timestamp_another_attempt_wrote_at_is_refused() {
    // Two attempts with one timestamp (a coordinator whose clock stepped back across a
    // restart): the reader cannot be ordered against the writer, so it is refused.
    let mut p = mvto_participant();
    assert_eq!(
        p.on_prepare(0, attempt(1), mvto_args(500, &[], &[(1, 1)], true)),
        Vote::Committed(Timestamp(500))
    );
    assert_eq!(
        p.on_prepare(0, attempt(2), mvto_args(500, &[(1, None)], &[(2, 1)], true)),
        Vote::No(Conflict::Stale)
    );
}

#[test]
fn mvto_a_snapshot_carries_history_stamps_and_pending_versions() {
    use crate::kit::host::StateMachine;
    let mut p = mvto_participant();
    let context = Net::new().nodes[0].context.clone();
    p.on_prepare(0, attempt(1), mvto_args(100, &[], &[(1, 10)], true));
    p.on_prepare(0, attempt(2), mvto_args(200, &[], &[(1, 20)], true));
    p.on_prepare(0, attempt(3), mvto_args(300, &[(3, None)], &[], false));
    p.on_prepare(0, attempt(4), mvto_args(400, &[], &[(2, 40)], false));
    let mut copy = mvto_participant();
    // The copy's own prepared attempt (an older state) is replaced, its pending version too.
    copy.on_prepare(0, attempt(9), mvto_args(50, &[], &[(5, 1)], false));
    let image = p.decode_image(&context, &p.image()).unwrap();
    copy.install(image);
    for id in 1..=5 {
        for ts in [50, 101, 150, 201, 401] {
            assert_eq!(mvto_read(&copy, id, ts), mvto_read(&p, id, ts), "id {id} at {ts}");
        }
    }
    assert_eq!(copy.prepared_count(), 2);
    assert_eq!(
        copy.on_prepare(0, attempt(5), mvto_args(250, &[], &[(3, 1)], false)),
        Vote::No(Conflict::TooOld(Timestamp(300))),
        "the read stamp came along"
    );
    copy.on_decision(0, attempt(4), Decision::Committed(Timestamp(400)));
    assert_eq!(mvto_read(&copy, 2, 401), Some((40, attempt(4))), "the pending version committed");
}

/// Ten concurrent read-modify-write transactions under `2pc-mvto` (both read-stamp rules)
/// end at 10 on both shards, each committed at its attempt's timestamp (the coordinator's
/// slot in the low bits).
#[test]
fn mvto_conflicting_increments_serialize() {
    for stamps in ["prepare", "execution"] {
        let pairs = [(crate::mvto::OPTION_READ_STAMPS.to_string(), stamps.to_string())];
        let options = crate::ProtocolKind::Mvto.options(&pairs).expect("a valid option");
        let mut net = Net::build_with(crate::Limits::default(), CcMode::Mvto, options);
        let requests: Vec<u64> = (1..=10).collect();
        for &r in &requests {
            net.submit(r, rw(&[9, 109], &[(9, r), (109, r)]));
        }
        net.answered(&requests);
        net.settle();
        assert!(requests.iter().all(|&r| net.outcome(r).result == TxnResult::Committed));
        let ts: Vec<u64> = requests.iter().map(|&r| net.outcome(r).commit_ts.unwrap().0).collect();
        assert!(ts
            .iter()
            .all(|t| t % crate::kit::coord::TS_NODE_SLOTS == u64::from(COORDINATOR.0)));
        // In timestamp order, every request read what the one before it wrote (on both
        // shards), and the last one's writes remain.
        let mut order = requests.clone();
        order.sort_by_key(|&r| net.outcome(r).commit_ts);
        let mut before = 0;
        for &r in &order {
            let read = vec![Datum::Uint(before)];
            assert_eq!(net.outcome(r).outputs, vec![read.clone(), read], "{stamps}: request {r}");
            before = r;
        }
        assert_eq!((net.value(9), net.value(109)), (Some(before), Some(before)));
        net.assert_quiescent();
    }
}

/// A `2pc-mvto` request without a timestamp, or with one far beyond the leader's clock (which
/// would stop the shard's writes for good), is refused before it enters the log.
#[test]
fn mvto_timestamps_missing_or_far_ahead_are_refused_before_the_log() {
    use crate::kit::host::StateMachine;
    let p = mvto_participant();
    let now = 1_000 * NS_PER_MS;
    let prepare = |ts: u64| ShardCommand::Prepare {
        reply_to: COORDINATOR,
        now,
        txn: attempt(1),
        refused: None,
        args: mvto_args(ts, &[], &[(1, 1)], true),
    };
    assert!(p.validate(&prepare(now + 5 * NS_PER_MS)).is_ok());
    let ahead = crate::kit::coord::TS_AHEAD_MAX_NS;
    assert!(p.validate(&prepare(now + ahead + 1)).unwrap_err().contains("ahead of the leader"));
    assert!(p.validate(&prepare(u64::MAX)).is_err());
    assert!(p.validate(&prepare(0)).unwrap_err().contains("without a timestamp"));
    let one_round = ShardCommand::ExecuteCommit {
        reply_to: COORDINATOR,
        now,
        txn: attempt(2),
        refused: None,
        ts: Timestamp(u64::MAX),
        epoch: 0,
        proc: meridian_core::txn::ProcId(0),
        args: vec![],
    };
    assert!(p.validate(&one_round).is_err());
}

// Interactive transactions (sessions): `coordinator/session.rs`.

mod sessions {
    use super::*;
    use meridian_core::node::{parse_read_outputs, SessionId, SessionOp, SessionRequest};

    fn write(id: u64, value: u64) -> Write {
        Write { key: key(id), value: Some(value.to_le_bytes().to_vec()) }
    }

    fn read(ids: &[u64]) -> SessionOp {
        SessionOp::Read { keys: ids.iter().map(|&id| key(id)).collect(), scans: vec![] }
    }

    impl Net {
        /// Takes step `op` of session `session` as request `request` and runs until answered.
        fn session(&mut self, request: u64, session: u64, op: SessionOp) -> TxnOutcome {
            let mut out = Outbox::new();
            let step = SessionRequest { id: RequestId(request), session: SessionId(session), op };
            self.nodes[COORDINATOR.0 as usize].on_session(self.now, step, &mut out);
            self.drain(COORDINATOR, &mut out);
            self.answered(&[request]);
            self.replies[&RequestId(request)].clone()
        }

        /// The values a read step returned.
        fn read_values(&mut self, request: u64, session: u64, ids: &[u64]) -> Vec<Option<u64>> {
            let outcome = self.session(request, session, read(ids));
            assert_eq!(outcome.result, TxnResult::Committed, "{outcome:?}");
            let (values, _) = parse_read_outputs(&outcome.outputs).expect("read outputs");
            values.iter().map(|v| v.as_ref().map(|_| as_u64(v))).collect()
        }
    }

    fn aborted(outcome: &TxnOutcome) -> Option<AbortCause> {
        match outcome.result {
            TxnResult::Failed(TxnFailure::Aborted(cause)) => Some(cause),
            _ => None,
        }
    }

    fn refusal(outcome: &TxnOutcome) -> String {
        match &outcome.result {
            TxnResult::Failed(TxnFailure::Rejected(why)) => why.clone(),
            other => panic!("not a refusal: {other:?}"),
        }
    }

    #[test]
    fn a_session_reads_every_shard_in_one_round_and_commits_its_writes_atomically() {
        for mode in
            [CcMode::Validation, CcMode::Locking(crate::kit::locks::Policy::NoWait), CcMode::Mvto]
        {
            let mut net = Net::build(crate::Limits::default(), mode);
            net.submit(1, rw(&[], &[(5, 50), (105, 150)]));
            net.answered(&[1]);
            net.settle();
            assert_eq!(net.session(2, 7, SessionOp::Begin).result, TxnResult::Committed);
            let before = net.delivered;
            assert_eq!(net.read_values(3, 7, &[5, 105, 6]), vec![Some(50), Some(150), None]);
            assert_eq!(net.delivered - before, 4, "{mode:?}: one execution per shard, and replies");
            let commit = net.session(
                4,
                7,
                SessionOp::Commit { writes: vec![write(5, 40), write(105, 160)] },
            );
            assert_eq!(commit.result, TxnResult::Committed, "{mode:?}");
            assert!(commit.commit_ts.is_some());
            net.settle();
            assert_eq!((net.value(5), net.value(105)), (Some(40), Some(160)), "{mode:?}");
            // The session is over: a late step is told how it ended, and nothing changes.
            let late = net.session(5, 7, read(&[5]));
            assert!(refusal(&late).contains("is over: it committed"), "{late:?}");
            net.assert_quiescent();
        }
    }

    #[test]
    fn a_conflicting_session_aborts_with_its_cause_and_applies_nothing() {
        let mut net = Net::new();
        net.session(1, 1, SessionOp::Begin);
        assert_eq!(net.read_values(2, 1, &[5, 105]), vec![None, None]);
        // Another transaction overwrites what the session read.
        net.submit(3, rw(&[], &[(105, 7)]));
        net.answered(&[3]);
        net.run_until(|_| true);
        let commit =
            net.session(4, 1, SessionOp::Commit { writes: vec![write(5, 1), write(105, 1)] });
        assert_eq!(aborted(&commit), Some(AbortCause::Validation), "{commit:?}");
        net.settle();
        assert_eq!((net.value(5), net.value(105)), (None, Some(7)), "nothing of it applied");
        // However late its client asks, it hears the abort and its cause.
        let after = net.session(5, 1, SessionOp::Commit { writes: vec![] });
        assert_eq!(aborted(&after), Some(AbortCause::Validation), "{after:?}");
        net.assert_quiescent();
    }

    #[test]
    fn a_session_that_read_one_key_at_two_versions_cannot_commit() {
        let mut net = Net::new();
        net.session(1, 1, SessionOp::Begin);
        assert_eq!(net.read_values(2, 1, &[5]), vec![None]);
        net.submit(3, rw(&[], &[(5, 9)]));
        net.answered(&[3]);
        net.run_until(|_| true);
        let again = net.session(4, 1, read(&[5]));
        assert_eq!(aborted(&again), Some(AbortCause::Validation), "{again:?}");
        net.assert_quiescent();
    }

    #[test]
    fn an_idle_2pl_session_is_aborted_after_its_lease_and_its_locks_released() {
        let mut net = Net::locking(crate::kit::locks::Policy::NoWait);
        net.session(1, 1, SessionOp::Begin);
        assert_eq!(net.read_values(2, 1, &[5]), vec![None]);
        assert!(exec_locks(net.nodes[0].hosts.get(ShardId(0)).unwrap()) > 0);
        // A writer of the key is refused while the session holds its lock, and commits once
        // the lease has ended the session (the coordinator releases the lock).
        net.submit(3, rw(&[], &[(5, 9)]));
        net.answered(&[3]);
        assert_eq!(net.outcome(3).result, TxnResult::Committed);
        assert!(net.outcome(3).aborts.get(AbortCause::LockDenied) > 0, "it had to wait");
        net.settle();
        assert_eq!(net.value(5), Some(9));
        let late = net.session(4, 1, SessionOp::Commit { writes: vec![write(5, 1)] });
        assert_eq!(aborted(&late), Some(AbortCause::LeaseExpired), "{late:?}");
        assert_eq!(net.value(5), Some(9));
        net.assert_quiescent();
    }

    #[test]
    fn an_aborted_session_releases_its_2pl_locks_at_once() {
        let mut net = Net::locking(crate::kit::locks::Policy::NoWait);
        net.session(1, 1, SessionOp::Begin);
        net.read_values(2, 1, &[5, 105]);
        assert_eq!(net.session(3, 1, SessionOp::Abort).result, TxnResult::Committed);
        net.run_until(|_| true);
        net.assert_quiescent();
        net.submit(4, rw(&[], &[(5, 9)]));
        net.answered(&[4]);
        assert_eq!(net.outcome(4).retries, 0, "nothing held the lock any more");
    }

    #[test]
    fn bad_steps_are_refused_and_leave_the_session_open() {
        let mut net = Net::new();
        assert!(refusal(&net.session(1, 1, read(&[5]))).contains("no open transaction 1"));
        net.session(2, 1, SessionOp::Begin);
        assert!(refusal(&net.session(3, 1, SessionOp::Begin)).contains("already began"));
        let reversed = SessionOp::Read { keys: vec![], scans: vec![scan_of(50, 10)] };
        let outcome = net.session(4, 1, reversed);
        assert!(
            matches!(&outcome.result, TxnResult::Failed(TxnFailure::Procedure(ProcError::BadArgs(why))) if why.contains("reversed")),
            "{outcome:?}"
        );
        // Still open: a scan over both shards merges their rows in key order, up to the limit.
        net.submit(5, rw(&[], &[(3, 30), (104, 140), (2, 20)]));
        net.answered(&[5]);
        net.run_until(|_| true);
        let mut range = scan_of(0, 200);
        range.limit = 2;
        let outcome = net.session(6, 1, SessionOp::Read { keys: vec![], scans: vec![range] });
        let (_, rows) = parse_read_outputs(&outcome.outputs).expect("rows");
        let ids: Vec<Key> = rows[0].iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(ids, vec![key(2), key(3)]);
        let outcome = net.session(7, 1, SessionOp::Commit { writes: vec![write(4, 1)] });
        assert_eq!(outcome.result, TxnResult::Committed, "{outcome:?}");
        net.run_until(|_| true);
        assert_eq!(net.value(4), Some(1));
        net.assert_quiescent();
    }

    #[test]
    fn a_session_reads_a_bounded_number_of_keys_and_writes_a_bounded_number_per_shard() {
        let mut net = Net::new();
        net.session(1, 1, SessionOp::Begin);
        let step = |first: u64| SessionOp::Read {
            keys: (first..first + 4_096).map(|i| key(i % 200)).collect(),
            scans: vec![],
        };
        for request in 0..8 {
            let outcome = net.session(2 + request, 1, step(request));
            assert_eq!(outcome.result, TxnResult::Committed, "step {request}");
        }
        let over = net.session(20, 1, step(0));
        assert!(
            matches!(&over.result, TxnResult::Failed(TxnFailure::Procedure(ProcError::BadArgs(why))) if why.contains("at most")),
            "{over:?}"
        );
        let writes = (0..4_097).map(|i| Write { key: key(i % 100), value: None }).collect();
        let commit = net.session(21, 1, SessionOp::Commit { writes });
        assert_eq!(commit.result, TxnResult::Committed, "duplicate keys collapse to 100");
        net.session(22, 2, SessionOp::Begin);
        // Ids from 100 up all live on shard 1 (the last shard takes every id beyond it).
        let writes = (100..4_197).map(|i| Write { key: key(i), value: None }).collect();
        let commit = net.session(23, 2, SessionOp::Commit { writes });
        assert!(matches!(commit.result, TxnResult::Failed(TxnFailure::Procedure(_))), "{commit:?}");
    }

    /// Where one simulated client of `concurrent_sessions_keep_the_total_through_loss_and_duplication` stands.
    enum Transfer {
        Begin,
        Read,
        Commit,
    }

    /// One client: where it stands, its session, its request in flight, the two keys.
    struct Client {
        step: Transfer,
        session: u64,
        request: u64,
        pair: (u64, u64),
    }

    fn cents(value: &Option<Vec<u8>>) -> i64 {
        value.as_ref().map_or(0, |v| i64::from_le_bytes(v[..8].try_into().unwrap()))
    }

    /// Many interleaved interactive transfers (read two balances in one step, write both,
    /// commit; run again when aborted) over few keys on both shards, while a seeded filter
    /// drops and duplicates protocol messages, under every mode: every session ends, nothing
    /// is answered twice (the router asserts it), and the balances still sum to zero.
    #[test]
    fn concurrent_sessions_keep_the_total_through_loss_and_duplication() {
        for mode in [
            CcMode::Validation,
            CcMode::Locking(crate::kit::locks::Policy::NoWait),
            CcMode::Locking(crate::kit::locks::Policy::WoundWait),
            CcMode::Mvto,
        ] {
            let mut net = Net::build(crate::Limits::default(), mode);
            let mut state = 0x9e37_79b9_7f4a_7c15u64;
            let mut roll = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            };
            let mut filter_roll = roll; // A copy: the same coin flips, independent state.
            net.filter = Box::new(move |_, _| match filter_roll() % 20 {
                0 => Delivery::Drop,
                1 => Delivery::Duplicate,
                _ => Delivery::Deliver,
            });
            let keys = [1u64, 2, 3, 101, 102, 103];
            let clients = 6;
            let mut at: Vec<Client> = Vec::new();
            let mut next_request = 1_000u64;
            let mut next_session = 1u64;
            let (mut done, mut aborted) = (0, 0);
            let transfers_per_client = 8;
            let mut left = vec![transfers_per_client; clients];
            let send = |net: &mut Net, request: u64, session: u64, op: SessionOp| {
                let mut out = Outbox::new();
                let step =
                    SessionRequest { id: RequestId(request), session: SessionId(session), op };
                net.nodes[COORDINATOR.0 as usize].on_session(net.now, step, &mut out);
                net.drain(COORDINATOR, &mut out);
            };
            for _ in 0..clients {
                let pair = (keys[(roll() % 6) as usize], keys[(roll() % 6) as usize]);
                at.push(Client {
                    step: Transfer::Begin,
                    session: next_session,
                    request: next_request,
                    pair,
                });
                send(&mut net, next_request, next_session, SessionOp::Begin);
                next_session += 1;
                next_request += 1;
            }
            for _ in 0..2_000_000 {
                if left.iter().all(|&n| n == 0) {
                    break;
                }
                for (c, client) in at.iter_mut().enumerate() {
                    if left[c] == 0 {
                        continue;
                    }
                    let Some(outcome) = net.replies.remove(&RequestId(client.request)) else {
                        continue;
                    };
                    let ok = outcome.result == TxnResult::Committed;
                    let (a, b) = client.pair;
                    let (step, op) = match (&client.step, ok) {
                        (Transfer::Begin, true) => {
                            let keys = if a == b { vec![key(a)] } else { vec![key(a), key(b)] };
                            (Transfer::Read, SessionOp::Read { keys, scans: vec![] })
                        }
                        (Transfer::Read, true) => {
                            let (values, _) = parse_read_outputs(&outcome.outputs).unwrap();
                            let (va, vb) = (cents(&values[0]), cents(values.last().unwrap()));
                            let writes = if a == b {
                                vec![]
                            } else {
                                vec![
                                    Write {
                                        key: key(a),
                                        value: Some((va - 7).to_le_bytes().to_vec()),
                                    },
                                    Write {
                                        key: key(b),
                                        value: Some((vb + 7).to_le_bytes().to_vec()),
                                    },
                                ]
                            };
                            (Transfer::Commit, SessionOp::Commit { writes })
                        }
                        (Transfer::Commit, true) => {
                            done += 1;
                            left[c] -= 1;
                            (Transfer::Begin, SessionOp::Begin)
                        }
                        (_, false) => {
                            // Aborted (a conflict, a timeout after losses): a new session.
                            assert!(
                                matches!(outcome.result, TxnResult::Failed(TxnFailure::Aborted(_))),
                                "{mode:?}: {outcome:?}"
                            );
                            aborted += 1;
                            (Transfer::Begin, SessionOp::Begin)
                        }
                    };
                    if matches!(step, Transfer::Begin) {
                        if left[c] == 0 {
                            continue;
                        }
                        client.session = next_session;
                        next_session += 1;
                        client.pair = (keys[(roll() % 6) as usize], keys[(roll() % 6) as usize]);
                    }
                    client.step = step;
                    client.request = next_request;
                    next_request += 1;
                    send(&mut net, client.request, client.session, op);
                }
                if net.step() {
                    continue;
                }
                net.timers.sort_unstable();
                let (at_ns, node, timer) = net.timers.remove(0);
                net.now = net.now.max(at_ns);
                let mut out = Outbox::new();
                net.nodes[node.0 as usize].on_timer(net.now, timer, &mut out);
                net.drain(node, &mut out);
            }
            assert!(left.iter().all(|&n| n == 0), "{mode:?}: stuck with {left:?} left");
            net.filter = Box::new(|_, _| Delivery::Deliver);
            net.settle();
            let total: i64 = keys
                .iter()
                .map(|&id| {
                    let store =
                        net.nodes[shard_of(id).0 as usize].hosts.get(shard_of(id)).unwrap().store();
                    cents(&store.get_at(&key(id), Timestamp::MAX).cloned())
                })
                .sum();
            assert_eq!(total, 0, "{mode:?}: {done} transfers, {aborted} aborted");
            assert_eq!(done, clients * transfers_per_client as usize, "{mode:?}");
        }
    }

    #[test]
    fn a_lost_read_is_asked_again_and_a_dead_shard_ends_the_session() {
        let mut net = Net::new();
        net.session(1, 1, SessionOp::Begin);
        let mut lost = 0;
        net.filter = Box::new(move |_, msg| {
            if matches!(msg, OccMsg::Executed { .. }) && lost == 0 {
                lost += 1;
                return Delivery::Drop;
            }
            Delivery::Deliver
        });
        assert_eq!(net.read_values(2, 1, &[5]), vec![None]);
        net.filter =
            Box::new(|to, _| if to == NodeId(1) { Delivery::Drop } else { Delivery::Deliver });
        let outcome = net.session(3, 1, read(&[105]));
        assert_eq!(aborted(&outcome), Some(AbortCause::Timeout), "{outcome:?}");
    }
}

// ---- mako -----------------------------------------------------------------------------------

fn mako_args(epoch: u64, writes: &[(u64, u64)], one_phase: bool) -> PrepareArgs {
    PrepareArgs { epoch, ..mvto_args(0, &[], writes, one_phase) }
}

fn mako_value(p: &Participant, id: u64) -> Option<u64> {
    p.store().read_latest(&key(id)).map(|v| as_u64(&v.value))
}

/// A shard's watermark follows its ticks and stays below prepared proposals; closing the
/// epoch freezes it as the final and refuses the epoch's attempts; starting the next epoch
/// at a stable point below some commits aborts the prepared attempts and discards those
/// commits, and the shard goes on above everything it handed out.
#[test]
fn mako_an_epoch_start_aborts_prepared_attempts_and_discards_commits_above_the_stable_point() {
    use crate::mako::Entry;
    let mut p =
        new_participant(ShardId(0), Net::new().nodes[0].context.clone(), CcMode::Speculative);
    let report = |p: &Participant| p.mako_report(ShardId(0)).unwrap().0;
    let (t1, t2, t3) = (attempt(1), attempt(2), attempt(3));
    assert_eq!(
        p.on_prepare(1_000, t1, mako_args(0, &[(1, 10)], true)),
        Vote::Committed(Timestamp(1_000))
    );
    p.apply_mako(Entry::Tick { now: 1_000 });
    assert_eq!(report(&p).w, Timestamp(1_000));
    assert_eq!(
        p.on_prepare(2_000, t2, mako_args(0, &[(1, 20)], true)),
        Vote::Committed(Timestamp(2_000))
    );
    assert_eq!(
        p.on_prepare(3_000, t3, mako_args(0, &[(2, 30)], false)),
        Vote::Yes(Timestamp(3_000))
    );
    p.apply_mako(Entry::Tick { now: 4_000 });
    assert_eq!(report(&p).w, Timestamp(2_999), "held below the prepared proposal");
    p.apply_mako(Entry::EpochEnd { epoch: 0 });
    assert_eq!(report(&p).final_w, Some(Timestamp(2_999)));
    p.apply_mako(Entry::Tick { now: 5_000 });
    assert_eq!(report(&p).w, Timestamp(2_999), "frozen while closing");
    assert_eq!(
        p.on_prepare(5_000, attempt(4), mako_args(0, &[(3, 40)], true)),
        Vote::No(Conflict::Epoch),
        "the epoch is closing"
    );
    // Starts out of turn or above the final change nothing.
    p.apply_mako(Entry::EpochStart { epoch: 2, stable: Timestamp(1_000), now: 6_000 });
    p.apply_mako(Entry::EpochStart { epoch: 1, stable: Timestamp(3_000), now: 6_000 });
    assert_eq!(report(&p).epoch, 0);
    assert_eq!(mako_value(&p, 1), Some(20));
    // Another shard's final was 1,000: t2 (2,000) is discarded, t1 (1,000) stays, t3 aborts.
    p.apply_mako(Entry::EpochStart { epoch: 1, stable: Timestamp(1_000), now: 6_000 });
    assert_eq!(mako_value(&p, 1), Some(10));
    assert_eq!(p.prepared_count(), 0);
    assert_eq!(p.lock_count(), 0);
    assert_eq!(
        p.on_decision(6_000, t3, Decision::Committed(Timestamp(3_000))),
        Some(PeerState::Decided(Decision::Aborted)),
        "a late commit of an attempt the epoch start aborted stays aborted"
    );
    let started = report(&p);
    assert_eq!((started.epoch, started.w, started.final_w), (1, Timestamp(1_000), None));
    assert_eq!(started.stables, vec![(0, Timestamp(1_000))]);
    assert_eq!(
        p.on_prepare(7_000, attempt(5), mako_args(0, &[(3, 50)], true)),
        Vote::No(Conflict::Epoch),
        "an attempt of the closed epoch"
    );
    assert_eq!(
        p.on_prepare(3_500, attempt(6), mako_args(1, &[(1, 60)], true)),
        Vote::Committed(Timestamp(4_001)),
        "above everything handed out in the closed epoch, the clock notwithstanding"
    );
}

/// A copy's history is capped by its own epoch: one whose epoch is closing keeps everything
/// above the stable point its epoch start will discard to, even when the node already knows
/// a durable point far beyond it (the next epoch's watermarks); a copy in the newest epoch
/// may collect up to that durable point.
#[test]
fn mako_a_copy_behind_the_node_keeps_the_history_its_epoch_start_needs() {
    use crate::mako::watermark::{Report, Watermarks};
    use crate::mako::Entry;
    let context = Net::new().nodes[0].context.clone();
    let shards = context.topology.shards;
    let r = context.timing.gc_retention_ns;
    let mut p = new_participant(ShardId(0), context, CcMode::Speculative);
    let (s, t2, late) = (r + 1_000, r + 2_000, 3 * r);
    assert_eq!(
        p.on_prepare(s, attempt(1), mako_args(0, &[(1, 10)], true)),
        Vote::Committed(Timestamp(s))
    );
    assert_eq!(
        p.on_prepare(t2, attempt(2), mako_args(0, &[(1, 20)], true)),
        Vote::Committed(Timestamp(t2))
    );
    p.apply_mako(Entry::Tick { now: late });
    p.apply_mako(Entry::EpochEnd { epoch: 0 });
    // Every shard is already in epoch 1 (stable point `s`) with its watermark at `late`: the
    // node's durable point, far above `s`.
    let mut tracker = Watermarks::new(shards);
    for shard in 0..shards {
        let stables = vec![(0, Timestamp(s))];
        let report =
            Report { shard: ShardId(shard), epoch: 1, w: Timestamp(late), final_w: None, stables };
        assert!(tracker.on_report(&report));
    }
    assert_eq!(tracker.durable_floor(), Timestamp(late));
    let mut out = Outbox::new();
    p.set_gc_cap(&tracker);
    p.on_gc_tick(late, false, &mut out);
    assert_eq!(p.store().gc_watermark(), Timestamp(s), "capped at its epoch's stable point");
    p.apply_mako(Entry::EpochStart { epoch: 1, stable: Timestamp(s), now: late });
    assert_eq!(mako_value(&p, 1), Some(10), "the version it falls back to is still there");
    // Now in the newest epoch: its own retention rules, under the node's durable point.
    p.set_gc_cap(&tracker);
    p.on_gc_tick(late, false, &mut out);
    assert_eq!(p.store().gc_watermark(), Timestamp(late - r));
}

/// A leader whose clock is far behind the other shards' ticks at the highest watermark they
/// reported in its epoch (its clock when that is later), and proposes above it: the global
/// watermark is not held back by its clock's lag. Reports of another epoch do not count.
#[test]
fn mako_a_leader_with_its_clock_behind_ticks_at_the_highest_watermark_heard() {
    use crate::mako::watermark::{Report, Watermarks};
    use crate::mako::Entry;
    let context = Net::new().nodes[0].context.clone();
    let shards = context.topology.shards;
    assert!(shards >= 2, "the test needs another shard");
    let mut p = new_participant(ShardId(0), context, CcMode::Speculative);
    let mut tracker = Watermarks::new(shards);
    let ahead = 20_000_000_000;
    assert_eq!(p.mako_next(&tracker, 1_000), Some(Entry::Tick { now: 1_000 }), "nothing heard");
    let report = |w: u64| Report {
        shard: ShardId(1),
        epoch: 0,
        w: Timestamp(w),
        final_w: None,
        stables: vec![],
    };
    assert!(tracker.on_report(&report(ahead)));
    let tick = p.mako_next(&tracker, 1_000).expect("a tick");
    assert_eq!(tick, Entry::Tick { now: ahead });
    p.apply_mako(tick);
    assert_eq!(p.mako_report(ShardId(0)).unwrap().0.w, Timestamp(ahead));
    assert_eq!(
        p.on_prepare(2_000, attempt(1), mako_args(0, &[(1, 10)], true)),
        Vote::Committed(Timestamp(ahead + 1)),
        "proposals stay above the tick"
    );
    assert_eq!(
        p.mako_next(&tracker, ahead + 5_000),
        Some(Entry::Tick { now: ahead + 5_000 }),
        "a clock ahead of every report ticks at the clock"
    );
    // The tracker moves on to epoch 1 (stable point 0): this copy must close, not tick.
    let later = Report { epoch: 1, stables: vec![(0, Timestamp::ZERO)], ..report(2 * ahead) };
    assert!(tracker.on_report(&later));
    assert_eq!(p.mako_next(&tracker, 1_000), Some(Entry::EpochEnd { epoch: 0 }));
}

/// `occ` and `2pl` read only the newest version, so a tick collects every older one: the
/// watermark follows the newest commit, stays below a prepared attempt's proposal, and the
/// next write of a key leaves it one version older than the newest at most.
#[test]
fn latest_reading_shards_keep_no_history_below_the_newest_commit() {
    for mode in [CcMode::Validation, CcMode::Locking(crate::kit::locks::Policy::NoWait)] {
        let mut p = new_participant(ShardId(0), Net::new().nodes[0].context.clone(), mode);
        let mut out = Outbox::new();
        for seq in 1..=20 {
            let now = seq * 1_000;
            let vote = p.on_prepare(now, attempt(seq), mvto_args(0, &[], &[(1, seq)], true));
            assert_eq!(vote, Vote::Committed(Timestamp(now)), "{mode:?}");
            p.on_gc_tick(now, false, &mut out);
            // The newest and the one at the watermark are needed; lazy pruning keeps at most
            // twice that.
            assert!(p.store().versions(&key(1)).len() <= 4, "{mode:?}: old versions pruned");
        }
        assert_eq!(p.store().gc_watermark(), Timestamp(20_000), "{mode:?}: no retention");
        assert_eq!(mako_value(&p, 1), Some(20));
        // A prepared attempt holds the watermark below its proposal; its commit is accepted.
        let vote = p.on_prepare(21_000, attempt(21), mvto_args(0, &[], &[(2, 7)], false));
        assert_eq!(vote, Vote::Yes(Timestamp(21_000)), "{mode:?}");
        let vote = p.on_prepare(22_000, attempt(22), mvto_args(0, &[], &[(3, 8)], true));
        assert_eq!(vote, Vote::Committed(Timestamp(22_000)), "{mode:?}");
        p.on_gc_tick(22_000, false, &mut out);
        assert_eq!(p.store().gc_watermark(), Timestamp(20_999), "{mode:?}");
        let decided = p.on_decision(23_000, attempt(21), Decision::Committed(Timestamp(21_000)));
        assert_eq!(decided, Some(PeerState::Decided(Decision::Committed(Timestamp(21_000)))));
        assert_eq!(mako_value(&p, 2), Some(7), "{mode:?}");
    }
}
