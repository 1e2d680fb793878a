//! Unit tests of the chain node, each driving nodes by hand through one rule of the flow.

use super::*;
use meridian_core::node::Effect;
use meridian_core::topology::Topology;
use std::sync::Arc;

/// Node `id` of 3 shards × 1 replica in 3 regions (nodes 0–2 servers, 3–5 coordinators),
/// running bank with 2 accounts per shard (every transfer crosses shards or stays on one).
fn node(id: u32) -> ChainNode {
    let options = meridian_workloads::WorkloadOptions {
        shards: 3,
        keys_per_shard: 8,
        ..meridian_workloads::WorkloadOptions::default()
    };
    let workload = meridian_workloads::build("bank", &options).unwrap();
    let topology = Topology::standard(vec!["a".into(), "b".into(), "c".into()], 3, 1).unwrap();
    let context = NodeContext::new(
        NodeId(id),
        Arc::new(topology),
        Arc::new(workload.registry()),
        Arc::new(workload.partitioner()),
        7,
        crate::Timing::for_network(meridian_core::time::NS_PER_MS),
    );
    let mut node = ChainNode::new(context);
    for (shard, store) in node.stores_mut() {
        workload.load(shard, store);
    }
    node
}

fn sends(out: &mut Outbox<ChainMsg>) -> Vec<(NodeId, ChainMsg)> {
    out.drain()
        .filter_map(|e| match e {
            Effect::Send { to, msg } => Some((to, msg)),
            _ => None,
        })
        .collect()
}

/// The first transfer coordinator 3 ships, and where to.
fn shipped() -> (NodeId, Shipped) {
    let options = meridian_workloads::WorkloadOptions {
        shards: 3,
        keys_per_shard: 8,
        ..meridian_workloads::WorkloadOptions::default()
    };
    let workload = meridian_workloads::build("bank", &options).unwrap();
    let mut generator = workload.generator(0, 1);
    let mut coordinator = node(3);
    let mut out = Outbox::new();
    coordinator.submit(
        10,
        ClientRequest { id: RequestId(1), txn: generator.next(RequestId(1)) },
        &mut out,
    );
    let (to, msg) = sends(&mut out).into_iter().next().expect("the attempt is shipped");
    let ChainMsg::Txn(shipped) = msg else { panic!("{msg:?}") };
    (to, *shipped)
}

fn image(node: &ChainNode) -> Vec<(ShardId, u64, usize)> {
    node.hosts.iter().map(|(s, m)| (s, m.server.store.version_count(), m.server.open())).collect()
}

/// Copies of an attempt from the wrong sender, for a hop that does not exist or is not
/// this node's, and acknowledgements, precommits and decisions nobody asked for change
/// nothing at a server and are never answered but by `Applied`.
#[test]
fn hostile_messages_change_nothing() {
    let (first, body) = shipped();
    let mut server = node(first.0);
    let before = image(&server);
    let mut out = Outbox::new();
    let coordinator = body.txn.origin;
    let wrong = NodeId((coordinator.0 + 1) % 6);
    server.on_message(10, wrong, ChainMsg::Txn(Box::new(body.clone())), &mut out);
    for hop in [0, 2, 7, u32::MAX] {
        let copy = Shipped { hop, ..body.clone() };
        server.on_message(10, coordinator, ChainMsg::Txn(Box::new(copy)), &mut out);
    }
    let home = Shipped { home: ShardId(99), ..body.clone() };
    server.on_message(10, coordinator, ChainMsg::Txn(Box::new(home)), &mut out);
    let outputs = Shipped { outputs: vec![vec![]], ..body.clone() };
    server.on_message(10, coordinator, ChainMsg::Txn(Box::new(outputs)), &mut out);
    let far = Shipped { ts: Timestamp(u64::MAX), ..body.clone() };
    server.on_message(10, coordinator, ChainMsg::Txn(Box::new(far)), &mut out);
    for hop in [0, 1, 2, u32::MAX] {
        server.on_message(10, wrong, ChainMsg::Ack { txn: body.txn, hop }, &mut out);
        server.on_message(10, wrong, ChainMsg::Precommit { txn: body.txn, hop }, &mut out);
    }
    server.on_message(10, wrong, ChainMsg::Stale { txn: body.txn, floor: Timestamp(9) }, &mut out);
    let decision = Decision {
        txn: body.txn,
        ts: body.ts,
        shards: vec![ShardId(42)],
        outcome: Outcome::Committed { outputs: Vec::new() },
    };
    let to = Some(ShardId(first.0));
    server.on_message(10, wrong, ChainMsg::Decision { to, decision: Box::new(decision) }, &mut out);
    // Inquiries naming a shard that does not exist, or about an attempt of a node that
    // coordinates nothing, or from a node that serves no hop before the one asked.
    let here = ShardId(first.0);
    let stranger = TxnId { origin: first, ..body.txn };
    for (from, txn, shards) in [
        (coordinator, body.txn, vec![ShardId(0), here, ShardId(9_999)]),
        (first, stranger, vec![here, here]),
        (wrong, body.txn, vec![ShardId(0), ShardId(1), here]),
    ] {
        let hop = shards.iter().rposition(|&s| s == here).unwrap() as u32 + 1;
        let inquiry = ChainMsg::Inquire { txn, ts: body.ts, shards, hop };
        server.on_message(10, from, inquiry, &mut out);
    }
    let answers = sends(&mut out);
    assert!(
        answers.iter().all(|(_, m)| matches!(m, ChainMsg::Applied { .. })),
        "only an Applied: {answers:?}"
    );
    assert_eq!(
        image(&server).iter().map(|i| i.1).collect::<Vec<_>>(),
        before.iter().map(|i| i.1).collect::<Vec<_>>()
    );
    assert_eq!(server.hosts.iter().map(|(_, m)| m.server.open()).sum::<usize>(), 0);
    assert!(server.hosts.iter().all(|(_, m)| m.undelivered.is_empty()), "nothing decided");
}

/// The genuine copy runs: the server acknowledges to the coordinator and ships the attempt
/// on (or, for a single-hop transfer, waits for the coordinator's precommit); a duplicate
/// is acknowledged again and not run twice.
#[test]
fn a_genuine_copy_runs_once_and_is_acknowledged() {
    let (first, body) = shipped();
    let mut server = node(first.0);
    let mut out = Outbox::new();
    let coordinator = body.txn.origin;
    server.on_message(10, coordinator, ChainMsg::Txn(Box::new(body.clone())), &mut out);
    let answers = sends(&mut out);
    assert!(
        answers.contains(&(coordinator, ChainMsg::Ack { txn: body.txn, hop: 1 })),
        "{answers:?}"
    );
    let hops_run = |n: &ChainNode| n.hosts.iter().map(|(_, m)| m.counts.hops_run).sum::<u64>();
    assert_eq!(hops_run(&server), 1);
    server.on_message(11, coordinator, ChainMsg::Txn(Box::new(body.clone())), &mut out);
    let answers = sends(&mut out);
    assert_eq!(answers, vec![(coordinator, ChainMsg::Ack { txn: body.txn, hop: 1 })]);
    assert_eq!(hops_run(&server), 1, "not run twice");
}

/// Decisions from nodes that could not have made them change nothing; a second copy of a
/// running attempt with another timestamp is refused; a precommit naming a hop beyond the
/// chain is ignored.
#[test]
fn decisions_and_copies_from_the_wrong_places_are_refused() {
    let (first, body) = shipped();
    let mut server = node(first.0);
    let mut out = Outbox::new();
    let coordinator = body.txn.origin;
    server.on_message(10, coordinator, ChainMsg::Txn(Box::new(body.clone())), &mut out);
    out.drain();
    let record_of = |n: &ChainNode| {
        n.hosts
            .iter()
            .find_map(|(_, m)| m.server.records.get(&body.txn).map(|r| (r.ts, r.hops.clone())))
    };
    let hops = record_of(&server).unwrap().1;
    let topology = server.context.topology.clone();
    let stranger = (0..6)
        .map(NodeId)
        .find(|n| *n != coordinator && hops.iter().all(|h| !serves(&topology, *n, h.shard)))
        .unwrap();
    let decide = |outcome| Decision { txn: body.txn, ts: body.ts, shards: vec![], outcome };
    let commit = decide(Outcome::Committed { outputs: Vec::new() });
    let abort = decide(Outcome::Aborted(Why::User("no".into())));
    for (from, decision) in [(stranger, commit.clone()), (stranger, abort), (coordinator, commit)] {
        if serves(&topology, from, hops.last().unwrap().shard) {
            continue; // The last hop may commit.
        }
        let to = Some(hops[0].shard);
        let msg = ChainMsg::Decision { to, decision: Box::new(decision) };
        server.on_message(11, from, msg, &mut out);
    }
    let later = Shipped { ts: Timestamp(body.ts.0 + 1), ..body.clone() };
    server.on_message(12, coordinator, ChainMsg::Txn(Box::new(later)), &mut out);
    for hop in [5, 64, u32::MAX - 1] {
        server.on_message(13, stranger, ChainMsg::Precommit { txn: body.txn, hop }, &mut out);
    }
    assert!(sends(&mut out).is_empty(), "nothing answered");
    assert_eq!(record_of(&server).map(|r| r.0), Some(body.ts), "still running, unchanged");
}

/// A coordinator that also serves the last hop of its own attempt answers with every
/// piece's output (the copy the hops get carries none).
#[test]
fn a_coordinator_serving_the_last_hop_answers_with_the_outputs() {
    use meridian_core::topology::{NodeInfo, ReplicaSlot};
    let options = meridian_workloads::WorkloadOptions {
        shards: 2,
        keys_per_shard: 10,
        ..meridian_workloads::WorkloadOptions::default()
    };
    let workload = meridian_workloads::build("micro-luigi", &options).unwrap();
    let slot = |shard| vec![ReplicaSlot { shard: ShardId(shard), replica: 0 }];
    let topology = Topology {
        regions: vec!["a".into()],
        nodes: vec![
            NodeInfo { region: meridian_core::RegionId(0), replicas: slot(0), coordinator: false },
            NodeInfo { region: meridian_core::RegionId(0), replicas: slot(1), coordinator: true },
        ],
        shards: 2,
        replicas: 1,
    };
    let topology = Arc::new(topology);
    let mut nodes: Vec<ChainNode> = (0..2)
        .map(|id| {
            let context = NodeContext::new(
                NodeId(id),
                topology.clone(),
                Arc::new(workload.registry()),
                Arc::new(workload.partitioner()),
                7,
                crate::Timing::for_network(meridian_core::time::NS_PER_MS),
            );
            let mut node = ChainNode::new(context);
            for (shard, store) in node.stores_mut() {
                workload.load(shard, store);
            }
            node
        })
        .collect();
    let mut generator = workload.generator(0, 1);
    let txn = generator.next(RequestId(1));
    let pieces = hops_of(&nodes[1].context, &txn, ShardId(1)).unwrap();
    assert_eq!(pieces.last().unwrap().shard, ShardId(1), "micro-luigi ends on shard 1");
    let mut out = Outbox::new();
    nodes[1].submit(10, ClientRequest { id: RequestId(1), txn }, &mut out);
    let mut mail: std::collections::VecDeque<(NodeId, NodeId, ChainMsg)> =
        sends(&mut out).into_iter().map(|(to, m)| (NodeId(1), to, m)).collect();
    let mut replies = Vec::new();
    for _ in 0..1_000 {
        let Some((from, to, msg)) = mail.pop_front() else { break };
        let mut out = Outbox::new();
        nodes[to.0 as usize].on_message(11, from, msg, &mut out);
        for effect in out.drain() {
            match effect {
                Effect::Send { to: next, msg } => mail.push_back((to, next, msg)),
                Effect::Reply { outcome, .. } => replies.push(outcome),
                _ => {}
            }
        }
    }
    assert_eq!(replies.len(), 1, "answered once");
    assert_eq!(replies[0].result, TxnResult::Committed);
    let plan_len = pieces.last().unwrap().pieces.end as usize;
    assert_eq!(replies[0].outputs.len(), plan_len, "every piece's output");
}

/// A server's `Stale` raises the coordinator's timestamp floor, unless it names a
/// timestamp so far ahead that every attempt above it would be refused.
#[test]
fn a_stale_floor_far_beyond_the_clock_is_not_believed() {
    let options = meridian_workloads::WorkloadOptions {
        shards: 3,
        keys_per_shard: 8,
        ..meridian_workloads::WorkloadOptions::default()
    };
    let workload = meridian_workloads::build("bank", &options).unwrap();
    let mut generator = workload.generator(0, 1);
    let mut coordinator = node(3);
    let mut out = Outbox::new();
    let request = ClientRequest { id: RequestId(1), txn: generator.next(RequestId(1)) };
    coordinator.submit(10, request, &mut out);
    let (first, msg) = sends(&mut out).into_iter().next().unwrap();
    let ChainMsg::Txn(body) = msg else { panic!("{msg:?}") };
    let floor = coordinator.ts_floor;
    let far = Timestamp(u64::MAX - 1);
    coordinator.on_message(11, first, ChainMsg::Stale { txn: body.txn, floor: far }, &mut out);
    assert_eq!(coordinator.ts_floor, floor, "not believed");
    let near = Timestamp(floor.0 + 1_000_000);
    coordinator.on_message(12, first, ChainMsg::Stale { txn: body.txn, floor: near }, &mut out);
    assert_eq!(coordinator.ts_floor, near);
}

/// A last hop keeps `Durable`s for the attempts it runs up to the budget, and for unseen
/// ones up to half of it; an attempt that has an entry adds hops whatever the count.
#[test]
fn durables_for_unseen_attempts_take_at_most_half_the_room() {
    assert!(durable_room(false, (false, 49), 100));
    assert!(!durable_room(false, (false, 50), 100), "unseen: half");
    assert!(durable_room(true, (false, 99), 100));
    assert!(!durable_room(true, (false, 100), 100), "seen: the whole budget");
    assert!(durable_room(false, (true, 100), 100), "another hop of a held attempt");
}

fn samples() -> Vec<ChainMsg> {
    let (_, body) = shipped();
    let txn = body.txn;
    vec![
        ChainMsg::Txn(Box::new(body.clone())),
        ChainMsg::Ack { txn, hop: 1 },
        ChainMsg::Precommit { txn, hop: 0 },
        ChainMsg::Decision {
            to: Some(ShardId(1)),
            decision: Box::new(Decision {
                txn,
                ts: body.ts,
                shards: vec![ShardId(0)],
                outcome: Outcome::Aborted(Why::Conflict {
                    cause: meridian_core::txn::AbortCause::Cascading,
                    seen: Timestamp(3),
                }),
            }),
        },
        ChainMsg::Applied { txn, shard: None },
        ChainMsg::Stale { txn, floor: Timestamp(4) },
        ChainMsg::Leader { shard: ShardId(2), leader: NodeId(5) },
        ChainMsg::Inquire { txn, ts: body.ts, shards: vec![ShardId(0), ShardId(2)], hop: 2 },
        ChainMsg::Durable { txn, hop: 1, last: ShardId(2) },
    ]
}

/// Mutated and random byte streams of chain's frames never panic the connection reader.
#[test]
fn mutated_and_random_chain_streams_never_panic_the_reader() {
    meridian_core::testing::check_message_streams(samples(), 6, 3_000, "chain-connection-property");
}
