//! The leader's log at its followers: execution below the commit point, acknowledgements of an
//! earlier start, closed timestamps and promises.

use super::*;

/// With five replicas (`f` = 2) an entry a follower and its leader synced may still be
/// lost in a view change, so a follower executes its synced log only below the commit-point
/// its leader tells it; with three, its own sync-point is enough.
#[test]
fn followers_execute_below_the_commit_point() {
    use meridian_core::node::Effect;
    let shard = ShardId(0);
    for replicas in [5, 3] {
        let (probe, bank) = node_in(0, Variant::TIGA, replicas);
        let leader = probe.leader_of(shard).unwrap();
        let topology = probe.context.topology.clone();
        let follower_id = topology.shard_nodes(shard).into_iter().find(|&n| n != leader);
        let (mut follower, _) = node_in(follower_id.unwrap().0, Variant::TIGA, replicas);
        let coordinator_id = topology.nodes.len() as u32 - 1;
        let (mut coordinator, _) = node_in(coordinator_id, Variant::TIGA, replicas);
        // Two transfers within shard 0, sent to the follower by their coordinator.
        let mut requests = bank.generator(0, 1);
        let mut out = Outbox::new();
        let mut bodies = Vec::new();
        for seq in 1..200 {
            let request = ClientRequest { id: RequestId(seq), txn: requests.next(RequestId(seq)) };
            coordinator.submit(1_000, request, &mut out);
            let sent: Vec<(NodeId, TxnBody)> = out
                .drain()
                .filter_map(|e| match e {
                    Effect::Send { to, msg: TigaMsg::Txn(body) } => Some((to, *body)),
                    _ => None,
                })
                .collect();
            let only_shard_0 = sent.iter().all(|(to, _)| {
                topology.nodes[to.0 as usize].replicas.iter().any(|r| r.shard == shard)
            });
            if only_shard_0 && bodies.len() < 2 {
                bodies.push(sent[0].1.clone());
            }
        }
        assert_eq!(bodies.len(), 2, "two single-shard transfers");
        let coordinator_node = NodeId(coordinator_id);
        for body in &bodies {
            follower.on_message(
                1_000,
                coordinator_node,
                TigaMsg::Txn(Box::new(body.clone())),
                &mut out,
            );
        }
        let entries: Vec<(TxnId, Timestamp)> = bodies.iter().map(|b| (b.txn, b.ts)).collect();
        let sync = |commit| TigaMsg::Sync {
            base: 0,
            view: VIEW,
            shard,
            from: 0,
            entries: entries.clone(),
            commit,
            outcomes: Vec::new(),
        };
        follower.on_message(1_001, leader, sync(0), &mut out);
        let host = &follower.hosted[&shard];
        assert_eq!(host.replica.sync_point(), 2, "{replicas} replicas: both synced");
        let expected = if replicas == 5 { 0 } else { 2 };
        assert_eq!(host.follow.executed, expected, "{replicas} replicas, commit-point 0");
        follower.on_message(1_002, leader, sync(1), &mut out);
        let expected = if replicas == 5 { 1 } else { 2 };
        assert_eq!(follower.hosted[&shard].follow.executed, expected, "{replicas}: commit-point 1");
        follower.on_message(1_003, leader, sync(0), &mut out);
        assert_eq!(
            follower.hosted[&shard].follow.executed, expected,
            "the commit-point only rises"
        );
        follower.on_message(1_004, leader, sync(2), &mut out);
        assert_eq!(follower.hosted[&shard].follow.executed, 2);
    }
}

/// A leader takes a follower's acknowledgements only from its latest start: while it sends
/// a transfer to a start, an acknowledgement of another start (a late copy from before
/// the restart, whose log the follower no longer holds) neither counts nor ends the
/// transfer; one of the joining start ends it; a late copy of a request of a start that
/// has joined, or of an earlier one, cuts no new image; a new start gets one.
#[test]
fn a_late_acknowledgement_of_a_previous_start_counts_for_nothing() {
    let shard = ShardId(0);
    let (probe, _) = node_in(0, Variant::TIGA, 3);
    let leader_id = probe.leader_of(shard).unwrap();
    let (mut leader, _) = node_in(leader_id.0, Variant::TIGA, 3);
    let follower = leader.hosted[&shard].lead.followers[0];
    let mut out = Outbox::new();
    let join = TigaMsg::Join {
        view: VIEW,
        shard,
        start: start(2),
        transfer: 0,
        next: 0,
        whole: false,
        member_view: 0,
    };
    leader.on_message(1_000, follower, join.clone(), &mut out);
    assert_eq!(leader.counts.transfers_total, 1);
    let ack = |incarnation| TigaMsg::SyncAck {
        view: VIEW,
        shard,
        start: start(incarnation),
        synced: 0,
        executed: 0,
        fetch: Vec::new(),
    };
    leader.on_message(1_001, follower, ack(1), &mut out);
    assert!(leader.hosted[&shard].lead.transfers.contains_key(&follower), "the transfer goes on");
    leader.on_message(1_002, follower, join.clone(), &mut out);
    assert_eq!(leader.counts.transfers_total, 1, "one image per start");
    leader.on_message(1_003, follower, ack(2), &mut out);
    let host = &leader.hosted[&shard];
    assert!(!host.lead.transfers.contains_key(&follower), "installed: done");
    assert_eq!(host.lead.joined[&follower], start(2));
    leader.on_message(1_004, follower, join, &mut out);
    assert_eq!(leader.counts.transfers_total, 1, "a late request of a start that joined");
    let older = TigaMsg::Join {
        view: VIEW,
        shard,
        start: start(1),
        transfer: 0,
        next: 0,
        whole: false,
        member_view: 0,
    };
    leader.on_message(1_005, follower, older, &mut out);
    assert_eq!(leader.counts.transfers_total, 1, "a late request of an earlier start");
    assert!(!leader.hosted[&shard].lead.transfers.contains_key(&follower));
    let newer = TigaMsg::Join {
        view: VIEW,
        shard,
        start: start(3),
        transfer: 0,
        next: 0,
        whole: false,
        member_view: 0,
    };
    leader.on_message(1_006, follower, newer, &mut out);
    assert_eq!(leader.counts.transfers_total, 2, "a new start gets a new image");
    // The follower restarted again, from its journal: the acknowledgement of that later
    // start ends the transfer it no longer waits for, and counts.
    leader.on_message(1_007, follower, ack(4), &mut out);
    let host = &leader.hosted[&shard];
    assert!(!host.lead.transfers.contains_key(&follower), "a later start needs no image");
    assert_eq!(host.lead.joined[&follower], start(4));
}

/// Snapshot reads: a leader's closed timestamp stays below the clock, below what it
/// holds and below every released transaction not finished, and never falls below what
/// it promised; an arrival at or below the promise is held above it.
#[test]
fn a_leader_closes_below_what_it_holds_and_what_has_not_finished() {
    let (mut leader, workload) = node_of(0, Variant::TIGA);
    let host = leader.hosted.get_mut(&ShardId(0)).unwrap();
    assert_eq!(leader_closed(host, 1_000), Timestamp(1_000));
    host.lead.queued.insert(txn(1), Queued { ts: Timestamp(400), hash: 0, speculative: false });
    assert_eq!(leader_closed(host, 1_000), Timestamp(399), "a released one not run yet");
    host.lead.queued.clear();
    host.lead.promised = Timestamp(700);
    assert_eq!(leader_closed(host, 650), Timestamp(700), "never below the promise");
    let mut generator = workload.generator(0, 0);
    let single = (0..1_000)
        .map(|i| generator.next(RequestId(i)))
        .find(|r| shape_of(&leader.context, r, ShardId(0)).unwrap().shards() == [ShardId(0)])
        .expect("a single-shard transfer");
    let late = TxnBody {
        txn: TxnId { origin: NodeId(10), incarnation: 1, seq: 1 },
        ts: Timestamp(500),
        sent_at: 0,
        request: single,
        home: ShardId(0),
        decided_below: 0,
    };
    let mut out = Outbox::new();
    leader.on_message(600, NodeId(10), TigaMsg::Txn(Box::new(late.clone())), &mut out);
    let host = &leader.hosted[&ShardId(0)];
    assert_eq!(host.replica.held_at(late.txn), Some(Timestamp(701)), "held above the promise");
    assert_eq!(leader_closed(host, 1_000), Timestamp(700), "and below it again");
}

/// A leader's promise stays below every multi-shard entry fewer than `f` followers
/// executed (a new leader after a failover takes its outcome from one that did); a
/// single-shard entry does not hold it back, and one whose body is gone counts as
/// multi-shard.
#[test]
fn a_leader_promises_past_a_multi_shard_entry_once_f_followers_executed_it() {
    let shard = ShardId(0);
    let (probe, workload) = node_of(0, Variant::TIGA);
    let (mut leader, _) = node_in(probe.leader_of(shard).unwrap().0, Variant::TIGA, 3);
    let mut generator = workload.generator(0, 0);
    let shards_of = |r: &TxnRequest| shape_of(&leader.context, r, shard).unwrap().shards();
    let requests: Vec<TxnRequest> = (0..1_000).map(|i| generator.next(RequestId(i))).collect();
    let single = requests.iter().find(|r| shards_of(r) == [shard]).expect("one shard");
    let multi = requests.iter().find(|r| shards_of(r).len() > 1 && shards_of(r)[0] == shard);
    let body = |seq: u64, ts: u64, request: &TxnRequest| TxnBody {
        txn: txn(seq),
        ts: Timestamp(ts),
        sent_at: 0,
        request: request.clone(),
        home: shard,
        decided_below: 0,
    };
    let bodies = [body(1, 300, single), body(2, 400, multi.expect("a transfer across"))];
    let knowns: Vec<Known> = bodies
        .iter()
        .map(|b| journaled_known(&leader.context, shard, b.clone()).unwrap())
        .collect();
    let log: Vec<(TxnId, Timestamp, &[Key], &[Key])> = knowns
        .iter()
        .map(|k| (k.body.txn, k.body.ts, &k.part.reads[..], &k.part.writes[..]))
        .collect();
    let (replica, _) = Replica::recovered_leader(shard, replica_limits(3), None, &log).unwrap();
    let host = leader.hosted.get_mut(&shard).unwrap();
    host.replica = replica;
    for known in knowns {
        host.bodies.insert(known.body.txn, known);
    }
    let follower = host.lead.followers[0];
    assert_eq!(leader_closed(host, 1_000), Timestamp(399), "no follower executed 2");
    host.lead.acks.insert(follower, (2, 1));
    assert_eq!(leader_closed(host, 1_000), Timestamp(399), "nor past 1");
    host.lead.acks.insert(follower, (2, 2));
    assert_eq!(leader_closed(host, 1_000), Timestamp(1_000), "f = 1 follower did");
    // Bodies dropped (pruned): both count as multi-shard.
    host.lead.acks.insert(follower, (2, 0));
    host.bodies.clear();
    assert_eq!(leader_closed(host, 1_000), Timestamp(299));
}
