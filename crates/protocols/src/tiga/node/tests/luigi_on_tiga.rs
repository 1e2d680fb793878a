//! Luigi on tiga's node: watermarks from the leaders and a restarted leader's unreplicated log.

use super::*;

/// A luigi leader that restarted counts the entries of its log above the watermark it
/// had told as unreplicated: a new transaction of the same worker, held above them, does
/// not raise the watermark past them before the followers acknowledge.
#[test]
fn a_restarted_luigi_leader_tells_no_watermark_over_its_unreplicated_log() {
    let (mut coordinator, bank) = node_of(0, crate::luigi::VARIANT);
    let mut generator = bank.generator(0, 1);
    // Two single-shard transfers of this coordinator on one shard, the second stamped
    // later: the first is logged (never acknowledged), the second arrives anew.
    let mut bodies: Vec<TxnBody> = Vec::new();
    let mut shard = None;
    for id in 1..200u64 {
        let mut out = Outbox::new();
        let request = ClientRequest { id: RequestId(id), txn: generator.next(RequestId(id)) };
        coordinator.submit(id * 1_000_000, request, &mut out);
        let body = sent_body(&mut out).expect("a body went out");
        let shards = shape_of(&coordinator.context, &body.request, body.home).unwrap().shards();
        if shards.len() == 1 && shard.is_none_or(|s| s == shards[0]) {
            shard = Some(shards[0]);
            bodies.push(body);
            if bodies.len() == 2 {
                break;
            }
        }
    }
    assert_eq!(bodies.len(), 2, "bank draws single-shard transfers");
    let shard = shard.expect("found");
    let leader = (0..9).find(|&n| node_of(n, crate::luigi::VARIANT).0.leads(shard)).unwrap();
    let mut journal: Journal<TigaMsg> = Journal::new(0..0);
    let logged_ts = bodies[0].ts;
    let worker = bodies[0].txn.origin;
    let told = Timestamp(logged_ts.0 - 10);
    journal.write(&Record::Told { shard, worker, ts: told });
    journal.write(&Record::Logged { shard, ts: logged_ts, body: bodies[0].clone() });
    let (_, records) = journal.take_batch().unwrap();
    let durable: crate::Durable = records.into_iter().map(|r| (r.key, r.value.unwrap())).collect();
    let (shards, next) = crate::tiga::journal::recover(&durable).unwrap();
    let (context, _) = context_in(leader, 3);
    let owd = crate::luigi::owd_settings(&context.options);
    let mut node = crate::luigi::restored(context, owd, shards, next, None).unwrap();
    for (shard, store) in node.stores_mut() {
        bank.load(shard, store);
    }
    let mut out = Outbox::new();
    // Late enough that the new transaction is due as it arrives.
    let now = 10 * meridian_core::time::NS_PER_S;
    node.on_start(now, &mut out);
    node.on_message(now, worker, TigaMsg::Txn(Box::new(bodies[1].clone())), &mut out);
    // Whatever waited for the journal goes out once it is durable.
    let effects = when_durable(&mut node, out.drain().collect());
    let told_again = effects.iter().filter_map(|e| match e {
        Effect::Send { msg: TigaMsg::Watermark { ts, .. }, to, .. } if *to == worker => Some(*ts),
        _ => None,
    });
    let told_again: Vec<Timestamp> = told_again.collect();
    // The new one is held and released (open), so the watermark rises to just below the
    // unreplicated entry, and no further.
    assert_eq!(told_again, vec![Timestamp(logged_ts.0 - 1)]);
}

/// A luigi coordinator takes a watermark only from the shard's leader (a stranger's is
/// dropped and counted), and a watermark only rises; a luigi leader takes no transaction
/// from a worker outside the cluster (its watermark vector has no slot for one) and
/// holds a worker's next transaction above what its watermark promised.
#[test]
fn luigi_watermarks_come_from_leaders_and_streams_cover_the_cluster_only() {
    let (mut coordinator, _) = node_of(9, crate::luigi::VARIANT);
    let mut out = Outbox::new();
    let leader_of_1 = coordinator.leader_of(ShardId(1)).unwrap();
    let mark = TigaMsg::Watermark { view: VIEW, shard: ShardId(1), ts: Timestamp(50) };
    coordinator.on_message(1, NodeId(10), mark.clone(), &mut out);
    assert!(coordinator.watermarks.is_empty(), "a stranger's watermark");
    assert_eq!(coordinator.counts.dropped_total, 1);
    coordinator.on_message(2, leader_of_1, mark, &mut out);
    let lower = TigaMsg::Watermark { view: VIEW, shard: ShardId(1), ts: Timestamp(40) };
    coordinator.on_message(3, leader_of_1, lower, &mut out);
    assert_eq!(coordinator.watermarks.get(&ShardId(1)), Some(&Timestamp(50)));
    // A tiga node takes no watermark at all.
    let mut tiga = node(9);
    let mark = TigaMsg::Watermark { view: VIEW, shard: ShardId(1), ts: Timestamp(50) };
    tiga.on_message(4, leader_of_1, mark, &mut out);
    assert!(tiga.watermarks.is_empty());

    let (mut leader, workload) = node_of(0, crate::luigi::VARIANT);
    assert!(leader.hosted[&ShardId(0)].replica.leads());
    let nodes = leader.context.topology.nodes.len();
    // One stream per node of the cluster, none beyond.
    let streams = leader.hosted[&ShardId(0)].lead.streams.as_ref().unwrap();
    assert!(streams.floor(NodeId(nodes as u32 - 1)).is_some());
    assert!(streams.floor(NodeId(nodes as u32)).is_none());
    // A one-shard transfer on shard 0 (bank's accounts spread over the shards).
    let mut generator = workload.generator(0, 0);
    let single = (0..1_000)
        .map(|i| generator.next(RequestId(i)))
        .find(|r| {
            let shape = shape_of(&leader.context, r, ShardId(0)).unwrap();
            shape.shards() == [ShardId(0)]
        })
        .expect("a single-shard transfer");
    let body = |origin: u32, seq: u64, ts: u64| TxnBody {
        txn: TxnId { origin: NodeId(origin), incarnation: 1, seq },
        ts: Timestamp(ts),
        sent_at: 0,
        request: single.clone(),
        home: ShardId(0),
        decided_below: 0,
    };
    let outside = body(nodes as u32 + 5, 1, 1_000);
    leader.on_message(10, NodeId(10), TigaMsg::Txn(Box::new(outside)), &mut out);
    assert_eq!(leader.hosted[&ShardId(0)].replica.held(), 0, "a worker outside the cluster");
    // Worker 10's first transaction is held at its stamp and released (one shard), its
    // second, stamped lower, is held above the first's timestamp.
    leader.on_message(11, NodeId(10), TigaMsg::Txn(Box::new(body(10, 1, 500))), &mut out);
    leader.on_message(12, NodeId(10), TigaMsg::Txn(Box::new(body(10, 2, 300))), &mut out);
    let host = &leader.hosted[&ShardId(0)];
    let second = TxnId { origin: NodeId(10), incarnation: 1, seq: 2 };
    assert_eq!(host.replica.held_at(second), Some(Timestamp(501)));
    assert_eq!(host.lead.streams.as_ref().unwrap().watermark(NodeId(10)), Timestamp(499));
    // A body claiming worker 10's transaction from anyone but worker 10 (or a peer
    // leader) is not taken: it could push the worker's frontier to the end of time.
    let bodies = host.bodies.len();
    let forged = body(10, 3, u64::MAX);
    leader.on_message(13, NodeId(11), TigaMsg::Txn(Box::new(forged)), &mut out);
    assert_eq!(leader.hosted[&ShardId(0)].bodies.len(), bodies, "a forged body");
    // A luigi follower takes bodies from its leader only.
    let follower_id = leader.context.topology.replica_node(ShardId(0), 1).unwrap();
    let (mut follower, _) = node_of(follower_id.0, crate::luigi::VARIANT);
    let host = &follower.hosted[&ShardId(0)];
    assert!(!host.replica.leads());
    let its_leader = host.leader;
    follower.on_message(14, NodeId(10), TigaMsg::Txn(Box::new(body(10, 4, 600))), &mut out);
    assert!(follower.hosted[&ShardId(0)].bodies.is_empty(), "a body from its coordinator");
    follower.on_message(15, its_leader, TigaMsg::Txn(Box::new(body(10, 4, 600))), &mut out);
    assert_eq!(follower.hosted[&ShardId(0)].bodies.len(), 1, "a body from its leader");
    assert_eq!(follower.hosted[&ShardId(0)].replica.held(), 0, "kept, not held");
}
