//! Unit tests of the tiga node: each drives one `TigaNode` by hand (messages, timers and
//! persist completions in, the outbox read back) to pin one rule of the node's contract.

use super::state::{install, state_image};
use super::*;
use meridian_core::topology::Topology;
use meridian_core::txn::Datum;

mod luigi_on_tiga;
mod messages;
mod replication;
mod restart;
mod transfer;
mod view_changes;

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
    node_of(id, Variant::TIGA).0
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
    let mut node = match variant.prefix {
        Prefix::Tiga => TigaNode::new(context).unwrap(),
        Prefix::Luigi => {
            let owd = crate::luigi::owd_settings(&context.options);
            crate::luigi::node(context, owd).unwrap()
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
    let (probe, _) = node_in(0, Variant::TIGA, 3);
    let leader = probe.leader_of(shard).unwrap();
    let topology = probe.context.topology.clone();
    let id = topology.shard_nodes(shard).into_iter().find(|&n| n != leader).unwrap();
    let (mut follower, _) = node_in(id.0, Variant::TIGA, 3);
    follower.hosted.get_mut(&shard).unwrap().follow.joining = Some(Joining::default());
    (follower, leader, id)
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
            (0, _) => {
                Ok(KeySet { reads: vec![counter.clone()], writes: vec![counter], scans: vec![] })
            }
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

/// `effects`, and what `node` sends once the journal records among them are durable.
fn when_durable(node: &mut TigaNode, mut effects: Vec<Effect<TigaMsg>>) -> Vec<Effect<TigaMsg>> {
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
