//! Messages from outside checked before they change anything: replies, hostile or mutated
//! input, messages of another view, the view manager's messages, and replies kept for resends.

use super::*;

/// Found by the `tiga_node` fuzz target: a reply naming a shard that does not exist, for
/// a transaction in flight, indexed the view out of bounds. It is ignored now.
#[test]
fn a_reply_naming_a_shard_that_does_not_exist_is_ignored() {
    let mut coordinator = node(0);
    let mut out = Outbox::new();
    let options = meridian_workloads::WorkloadOptions {
        shards: 3,
        keys_per_shard: 8,
        ..meridian_workloads::WorkloadOptions::default()
    };
    let bank = meridian_workloads::build("bank", &options).unwrap();
    let txn_request = bank.generator(0, 1).next(RequestId(1));
    let request = ClientRequest { id: RequestId(1), txn: txn_request };
    coordinator.submit(1_000, request, &mut out);
    let sent = out.drain().find_map(|e| match e {
        meridian_core::node::Effect::Send { msg: TigaMsg::Txn(body), .. } => Some(body.txn),
        _ => None,
    });
    let txn = sent.expect("the body went out");
    for shard in [ShardId(3), ShardId(10_777), ShardId(u32::MAX)] {
        let reply = TigaMsg::Fast {
            view: VIEW,
            txn,
            shard,
            ts: Timestamp(5),
            hash: 0,
            owd_ns: Some(1),
            result: Some(ShardResult::Ran(Vec::new())),
        };
        coordinator.on_message(2_000, NodeId(1), reply, &mut out);
        let slow = TigaMsg::Slow { view: VIEW, txn, shard, ts: Timestamp(5), owd_ns: None };
        coordinator.on_message(2_000, NodeId(1), slow, &mut out);
    }
    assert_eq!(coordinator.requests.len(), 1, "still in flight, nothing decided");
}

/// A detective leader answers where it ran speculatively and, when the timestamp moved,
/// again where the leaders agreed; a reordered copy of the earlier answer must not
/// replace the later one at the coordinator, neither in the tally nor as the result.
#[test]
fn a_stale_leader_reply_never_replaces_its_latest() {
    use meridian_core::node::Effect;
    let mut coordinator = node(9);
    let mut out = Outbox::new();
    let (_, bank) = node_of(0, Variant::TIGA);
    let mut requests = bank.generator(0, 1);
    let topology = coordinator.context.topology.clone();
    // A transfer across shards.
    let (txn, shards) = (1..100)
        .find_map(|seq| {
            let request = ClientRequest { id: RequestId(seq), txn: requests.next(RequestId(seq)) };
            coordinator.submit(1_000, request, &mut out);
            let to: BTreeSet<NodeId> = out
                .drain()
                .filter_map(|e| match e {
                    Effect::Send { to, msg: TigaMsg::Txn(_) } => Some(to),
                    _ => None,
                })
                .collect();
            let shards: Vec<ShardId> = (0..3)
                .map(ShardId)
                .filter(|&s| topology.shard_nodes(s).iter().any(|n| to.contains(n)))
                .collect();
            let txn = coordinator.requests.get(&RequestId(seq)).map(|f| f.txn)?;
            (shards.len() > 1).then_some((txn, shards))
        })
        .expect("a cross-shard transfer");
    let fast = |ts: u64, result: Option<ShardResult>, shard| TigaMsg::Fast {
        view: VIEW,
        txn,
        shard,
        ts: Timestamp(ts),
        hash: 0,
        owd_ns: Some(1),
        result,
    };
    // A result for a shard the transaction does not touch is no participant's: ignored
    // (fuzzing found it kept, and the decision then reported with it).
    let outsider = (0..3).map(ShardId).find(|s| !shards.contains(s));
    if let Some(outsider) = outsider {
        let leader = coordinator.leader_of(outsider).unwrap();
        let stray = Some(ShardResult::UserAbort("not a participant".into()));
        coordinator.on_message(2_000, leader, fast(100, stray, outsider), &mut out);
    }
    for &shard in &shards {
        let leader = coordinator.leader_of(shard).unwrap();
        let ran = Some(ShardResult::Ran(Vec::new()));
        coordinator.on_message(2_000, leader, fast(200, ran, shard), &mut out);
        let stale = Some(ShardResult::UserAbort("ran at 100".into()));
        coordinator.on_message(2_000, leader, fast(100, stale, shard), &mut out);
        // A leader's reply without its result is malformed: ignored.
        coordinator.on_message(2_000, leader, fast(300, None, shard), &mut out);
        for follower in topology.shard_nodes(shard).into_iter().filter(|&n| n != leader) {
            coordinator.on_message(2_000, follower, fast(200, None, shard), &mut out);
        }
    }
    let outcome = out.drain().find_map(|e| match e {
        Effect::Reply { outcome, .. } => Some(outcome),
        _ => None,
    });
    let outcome = outcome.expect("decided");
    assert_eq!(outcome.result, TxnResult::Committed);
    assert_eq!(outcome.commit_ts, Some(Timestamp(200)));
    assert_eq!(outcome.path, CommitPath::Fast);
    assert!(outsider.is_some(), "a transfer touches two of the three shards");
}

/// End-of-run checks read the store of the node that says it leads a shard: exactly one
/// per shard, the first view's leader.
#[test]
fn exactly_the_views_leader_says_it_leads_each_shard() {
    let nodes: Vec<TigaNode> = (0..9).map(node).collect();
    for shard in (0..3).map(ShardId) {
        let leaders: Vec<NodeId> =
            nodes.iter().filter(|n| n.leads(shard)).map(|n| n.context.id).collect();
        assert_eq!(leaders.len(), 1, "{shard:?}: {leaders:?}");
        assert_eq!(Some(leaders[0]), nodes[0].leader_of(shard));
    }
}

/// Mutated and random byte streams of tiga's frames never panic the connection reader.
#[test]
fn mutated_and_random_tiga_streams_never_panic_the_reader() {
    meridian_core::testing::check_message_streams(samples(), 12, 3_000, "tiga-connection-property");
}

/// A piece whose keys need its input runs only where its procedure names keys on its
/// shard guarding them; the transaction is then ordered as writing those keys.
#[test]
fn a_piece_keyed_by_its_input_runs_only_behind_a_guard_on_its_shard() {
    use meridian_core::txn::{PartitionRule, Partitioner, Registry, TxnRequest};
    let mut registry = Registry::default();
    let proc = registry.register(Arc::new(Numbered));
    let rule = PartitionRule::LeadingInt { base: 0, per_shard: 100 };
    let topology = Topology::standard(vec!["a".into()], 2, 1).unwrap();
    let context = NodeContext::new(
        NodeId(0),
        Arc::new(topology),
        Arc::new(registry),
        Arc::new(Partitioner::new(2, rule).unwrap()),
        7,
        crate::Timing::for_network(meridian_core::time::NS_PER_MS),
    );
    let request = |guard: u64| TxnRequest { proc, args: vec![Datum::Uint(guard)] };
    let refused = check_request(&context, &request(0)).unwrap_err();
    assert!(matches!(refused, ProcError::Unsupported(_)), "{refused}");
    assert!(refused.to_string().contains("names no keys guarding them"), "{refused}");
    for stray in [2, 3] {
        let broken = check_request(&context, &request(stray)).unwrap_err();
        assert!(broken.to_string().contains("keys on its shard 0"), "{broken}");
    }
    let shape = shape_of(&context, &request(1), ShardId(0)).unwrap();
    let part = &shape.parts[&ShardId(0)];
    assert_eq!(part.guarded, [1]);
    assert_eq!(part.writes, [numbered_key(0)], "the guard stands for the piece's keys");
    assert!(!part.declares(&numbered_key(1)));
}

/// Messages from the wrong senders, bodies that do not decode into a transaction, and
/// shards outside the cluster change nothing at a leader and never panic it.
#[test]
fn hostile_messages_change_nothing() {
    // Node 0 hosts replica 0 of shard 0; the view puts every leader in region "a", where
    // replica 0 of shard 0 sits.
    let mut leader = node(0);
    assert!(leader.hosted[&ShardId(0)].replica.leads());
    let before = state(&leader);
    let mut out = Outbox::new();
    let stranger = NodeId(10);
    let bad_body = TxnBody {
        txn: txn(2),
        ts: Timestamp(5),
        sent_at: 1,
        request: TxnRequest { proc: meridian_core::txn::ProcId(77), args: vec![Datum::Uint(9); 9] },
        home: ShardId(0),
        decided_below: 0,
    };
    let garbage = TxnBody {
        request: TxnRequest {
            proc: meridian_core::txn::ProcId(0),
            args: vec![Datum::Bytes(vec![0xff; 40])],
        },
        ..bad_body.clone()
    };
    let hostile = [
        TigaMsg::Txn(Box::new(bad_body)),
        TigaMsg::Txn(Box::new(garbage)),
        TigaMsg::Propose {
            view: VIEW,
            txn: txn(3),
            shards: vec![ShardId(0), ShardId(200)],
            from: ShardId(200),
            ts: Timestamp(9),
            answer: false,
        },
        TigaMsg::Vote {
            view: VIEW,
            txn: txn(3),
            from: ShardId(1),
            to: ShardId(0),
            ok: false,
            outputs: vec![(7, Vec::new()); PIECES_MAX + 1],
            want_reply: true,
        },
        TigaMsg::Sync {
            view: VIEW,
            shard: ShardId(0),
            from: 0,
            entries: vec![(txn(4), Timestamp(1))],
            commit: 0,
            base: 0,
            outcomes: vec![SyncOutcome {
                txn: txn(4),
                ok: true,
                inputs: vec![(0, vec![Datum::Bytes(vec![1; 3])])],
            }],
        },
        TigaMsg::SyncAck {
            view: VIEW,
            shard: ShardId(0),
            start: Start::default(),
            synced: u64::MAX,
            executed: u64::MAX,
            fetch: vec![txn(4)],
        },
        TigaMsg::GetBody { view: VIEW, txn: txn(5) },
        TigaMsg::Slow {
            view: VIEW,
            txn: txn(6),
            shard: ShardId(2),
            ts: Timestamp(1),
            owd_ns: None,
        },
        // A promise for another shard from a node that does not lead it, one for the
        // shard this node leads, and one for a shard that does not exist.
        TigaMsg::PeerClosed { view: VIEW, shard: ShardId(1), ts: Timestamp::MAX },
        TigaMsg::PeerClosed { view: VIEW, shard: ShardId(0), ts: Timestamp::MAX },
        TigaMsg::PeerClosed { view: VIEW, shard: ShardId(200), ts: Timestamp::MAX },
        // Refusals from a node that leads no shard named, and naming shards that do not
        // exist.
        TigaMsg::Refused { view: VIEW, txn: txn(7), from: ShardId(1), to: ShardId(0) },
        TigaMsg::Refused { view: VIEW, txn: txn(7), from: ShardId(300), to: ShardId(0) },
        TigaMsg::Refused { view: VIEW, txn: txn(7), from: ShardId(1), to: ShardId(300) },
        // View change: a report nobody asked for, from a node of no replica of the
        // shard; a request for a report, and one for a vote, from a node that leads
        // nothing.
        TigaMsg::Report {
            view: VIEW,
            shard: ShardId(0),
            base: 0,
            synced: vec![(txn(8), Timestamp(1))],
            unsynced: Vec::new(),
            bodies: Vec::new(),
            outcomes: Vec::new(),
        },
        TigaMsg::Recover { view: VIEW, shard: ShardId(0), from: 0 },
        TigaMsg::AskVote { view: VIEW, txn: txn(3), from: ShardId(1), to: ShardId(0) },
        TigaMsg::Pull { view: VIEW, shard: ShardId(1), to: ShardId(0) },
        TigaMsg::Pulled {
            view: VIEW,
            shard: ShardId(0),
            from: ShardId(1),
            entries: vec![(txn(3), Timestamp(4))],
        },
    ];
    for (i, msg) in hostile.into_iter().enumerate() {
        leader.on_message(1_000 + i as u64, stranger, msg, &mut out);
    }
    leader.on_timer(1_000_000_000, TimerId(999), &mut out);
    assert_eq!(state(&leader), before, "nothing written");
    let host = &leader.hosted[&ShardId(0)];
    assert_eq!(host.replica.held(), 0);
    assert!(
        host.bodies.is_empty() && host.lead.early_votes.is_empty() && host.lead.pending.is_empty()
    );
    assert!(leader.peer_closed.is_empty(), "no promise taken from a stranger");
    let sends = out.drain().filter(|e| matches!(e, meridian_core::node::Effect::Send { .. }));
    assert_eq!(sends.count(), 0, "nothing answered to a stranger");
}

/// The delay samples a follower's replies carry: its first reply for a transaction
/// carries how long the coordinator's copy took to arrive, a reply repeated for a resend
/// carries the resent copy's delay, and a copy that came from elsewhere than the
/// coordinator (a peer answering a fetch) carries none.
#[test]
fn a_followers_replies_carry_one_delay_sample_per_copy_from_the_coordinator() {
    let mut coordinator = node(0);
    let bank = context_in(0, 3).1;
    let mut generator = bank.generator(0, 1);
    let mut out = Outbox::new();
    let request = ClientRequest { id: RequestId(1), txn: generator.next(RequestId(1)) };
    coordinator.submit(1_000, request, &mut out);
    let body = sent_body(&mut out).expect("a body went out");
    let txn = body.txn;
    let shape = shape_of(&coordinator.context, &body.request, body.home).unwrap();
    let shard = *shape.parts.keys().next().unwrap();
    let (probe, _) = node_in(0, Variant::TIGA, 3);
    let leader = probe.leader_of(shard).unwrap();
    let id = probe.context.topology.shard_nodes(shard).into_iter().find(|&n| n != leader);
    // Delivers `body` from `from` at `now`, completes the persists, returns the delays
    // the replies to the coordinator carried.
    let deliver = |node: &mut TigaNode, from: NodeId, now: Time| {
        let arrive = TigaMsg::Txn(Box::new(body.clone()));
        let mut disk = crate::Durable::new();
        let sent = step(node, &mut disk, &|n, out| n.on_message(now, from, arrive.clone(), out));
        let delays = sent.into_iter().filter(|(to, _)| *to == txn.origin);
        delays
            .filter_map(|(_, msg)| match msg {
                TigaMsg::Fast { owd_ns, .. } | TigaMsg::Slow { owd_ns, .. } => Some(owd_ns),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let (mut follower, _) = node_in(id.unwrap().0, Variant::TIGA, 3);
    let now = body.ts.0 + 1_000_000;
    assert_eq!(deliver(&mut follower, txn.origin, now), [Some(now - body.sent_at)]);
    let later = now + 7_000_000;
    let resent = deliver(&mut follower, txn.origin, later);
    assert_eq!(resent, [Some(later - body.sent_at)], "the resent copy's own delay");
    // The same body from the shard's leader (a fetch answered): no sample.
    let (mut other, _) = node_in(id.unwrap().0, Variant::TIGA, 3);
    assert_eq!(deliver(&mut other, leader, now), [None]);
}

/// Every replica's message carries its sender's view; a node drops and counts one of
/// another view, earlier or later, before looking at it. A coordinator's body holds in
/// any view.
#[test]
fn messages_of_another_view_are_dropped_and_counted() {
    let shard = ShardId(0);
    let leader = node(0).leader_of(shard).unwrap();
    let replicas = node(0).context.topology.shard_nodes(shard);
    let follower_id = replicas.into_iter().find(|&n| n != leader).unwrap();
    let mut follower = node(follower_id.0);
    assert_eq!(follower.view.global, VIEW);
    let sync = |view| TigaMsg::Sync {
        view,
        shard,
        from: 0,
        entries: vec![(txn(1), Timestamp(5))],
        commit: 0,
        base: 0,
        outcomes: Vec::new(),
    };
    let mut out = Outbox::new();
    for view in [VIEW - 1, VIEW + 1, u64::MAX] {
        follower.on_message(10, leader, sync(view), &mut out);
    }
    assert_eq!(follower.counts.stale_view_total, 3);
    assert!(follower.counters().contains(&("tiga_stale_view_total", 3)));
    assert_eq!(follower.hosted[&shard].replica.log_len(), 0, "no stale entry logged");
    assert!(out.is_empty(), "nothing answered");
    follower.on_message(10, leader, sync(VIEW), &mut out);
    assert_eq!(follower.hosted[&shard].replica.log_len(), 1, "the view's own sync is taken");
    assert_eq!(follower.counts.stale_view_total, 3);
    assert!(samples()
        .iter()
        .all(|m| m.view().is_none() == matches!(m, TigaMsg::Txn(_) | TigaMsg::SnapRead(_))));
}

/// A view change at a node: a view not past the node's, of another shard count, or
/// changing the agreement mode is refused and changes nothing. In the next view, the
/// follower that leads shard 0 now asks its shard's other replicas for their reports,
/// takes a report from a replica of the shard only (never twice, never from a stranger),
/// and leads the rebuilt log once it holds `f + 1`; the other follower rejoins (its log
/// frozen for the report) and answers the new leader's request, no one else's.
/// The view manager's messages are taken only from where they may come: a view from a
/// member of the manager's group, of the cluster's shard count and past the node's own;
/// a heartbeat at a member, from a node of the cluster, naming only shards the sender
/// hosts. Anything else changes nothing and is counted.
#[test]
fn manager_messages_are_taken_only_from_members_and_checked() {
    use crate::tiga::manager::{manager_members, ManagerMsg, ViewRecord};
    let counter = |n: &TigaNode, name: &str| {
        n.counters().into_iter().find(|(k, _)| *k == name).map_or(0, |(_, v)| v)
    };
    let probe = node(0);
    let members = manager_members(&probe.context.topology, &probe.view);
    assert_eq!(members.len(), 3);
    let outsider = (0..9).map(NodeId).find(|n| !members.contains(n)).unwrap();
    let receiver = (0..9).map(NodeId).find(|n| !members.contains(n) && *n != outsider);
    let mut n = node(receiver.unwrap().0);
    n.host_manager(&BTreeMap::new()).unwrap();
    let mut next = ViewRecord::of(&n.view);
    next.global += 1;
    next.local[1] += 1;
    let mut out = Outbox::new();
    let mut send = |n: &mut TigaNode, from: NodeId, msg: ManagerMsg| {
        n.on_message(0, from, TigaMsg::Manager(msg), &mut out);
    };
    send(&mut n, outsider, ManagerMsg::View(next.clone()));
    let mut short = next.clone();
    short.local.pop();
    send(&mut n, members[0], ManagerMsg::View(short));
    assert_eq!(n.view_number(), VIEW, "nothing installed");
    assert_eq!(counter(&n, "tiga_manager_foreign_total"), 2);
    // A heartbeat at a node outside the group.
    let beat = (0, 1);
    let (stashed, delays) = (Vec::new(), Vec::new());
    send(
        &mut n,
        outsider,
        ManagerMsg::Heartbeat { view: VIEW, unable: Vec::new(), stashed, beat, delays },
    );
    assert_eq!(counter(&n, "tiga_manager_foreign_total"), 3);
    // The member's view is taken.
    send(&mut n, members[1], ManagerMsg::View(next.clone()));
    assert_eq!(n.view_number(), VIEW + 1);
    assert_eq!(counter(&n, "tiga_views_installed_total"), 1);
    send(&mut n, members[1], ManagerMsg::View(next));
    assert_eq!(counter(&n, "tiga_views_installed_total"), 1, "a repeat is ignored");
    assert_eq!(counter(&n, "tiga_views_refused_total"), 0);
    // At a member: a heartbeat naming a shard its sender hosts no replica of.
    let mut m = node(members[0].0);
    m.host_manager(&BTreeMap::new()).unwrap();
    let sender = outsider;
    let hosted: Vec<ShardId> = (0..3)
        .map(ShardId)
        .filter(|&s| m.context.topology.shard_nodes(s).contains(&sender))
        .collect();
    let foreign = (0..3).map(ShardId).find(|s| !hosted.contains(s)).unwrap();
    let mut out = Outbox::new();
    let beat_with = |unable, stashed, count| {
        let beat = (0, count);
        let delays = Vec::new();
        TigaMsg::Manager(ManagerMsg::Heartbeat { view: VIEW, unable, stashed, beat, delays })
    };
    let beat = |unable, count| beat_with(unable, Vec::new(), count);
    m.on_message(0, sender, beat(vec![foreign], 1), &mut out);
    m.on_message(0, NodeId(99), beat(Vec::new(), 1), &mut out);
    // A shard it could lead as a last resort is one it says it cannot lead otherwise.
    m.on_message(0, sender, beat_with(Vec::new(), vec![hosted[0]], 1), &mut out);
    assert_eq!(counter(&m, "tiga_manager_foreign_total"), 3);
    m.on_message(0, sender, beat(hosted.clone(), 2), &mut out);
    assert_eq!(counter(&m, "tiga_manager_foreign_total"), 3, "a well-formed heartbeat");
    let unable = |m: &TigaNode| m.manager.as_ref().unwrap().unable_of(sender);
    assert_eq!(unable(&m), hosted);
    // A late copy of an older heartbeat changes nothing; a newer one does.
    m.on_message(0, sender, beat(Vec::new(), 1), &mut out);
    assert_eq!(unable(&m), hosted);
    m.on_message(0, sender, beat(Vec::new(), 3), &mut out);
    assert!(unable(&m).is_empty());
    // Measured delays name server nodes only, at most one entry per server; probes come
    // from other server nodes only. None of these changes anything.
    let reporting = |delays: Vec<(NodeId, i64)>, count| {
        let (unable, stashed, beat) = (Vec::new(), Vec::new(), (0, count));
        TigaMsg::Manager(ManagerMsg::Heartbeat { view: VIEW, unable, stashed, beat, delays })
    };
    let probe = || TigaMsg::Manager(ManagerMsg::Probe { sent_at: 0 });
    m.on_message(0, sender, reporting(vec![(NodeId(99), 5)], 4), &mut out);
    // Two entries for one node (within the count of servers), then more entries than
    // there are servers.
    m.on_message(0, sender, reporting(vec![(members[1], 5), (members[1], 6)], 5), &mut out);
    let flood = (0..10).map(|i| (NodeId(i % 9), 5)).collect();
    m.on_message(0, sender, reporting(flood, 5), &mut out);
    m.on_message(0, NodeId(99), probe(), &mut out);
    m.on_message(0, members[0], probe(), &mut out);
    assert_eq!(counter(&m, "tiga_manager_foreign_total"), 8);
    let between = |m: &TigaNode, a, b| m.manager.as_ref().unwrap().measured_between(a, b);
    assert_eq!(between(&m, members[1], sender), None);
    // Well-formed reports: the delay from members[1] to the sender as the sender saw it,
    // and back.
    m.on_message(0, sender, reporting(vec![(members[1], 7_000)], 6), &mut out);
    let back = TigaMsg::Manager(ManagerMsg::Heartbeat {
        view: VIEW,
        unable: Vec::new(),
        stashed: Vec::new(),
        beat: (0, 1),
        delays: vec![(sender, 3_000)],
    });
    m.on_message(0, members[1], back, &mut out);
    assert_eq!(between(&m, members[1], sender), Some(5_000));
    assert_eq!(counter(&m, "tiga_manager_foreign_total"), 8);
    // A probe from a server is a sample at the receiver (it reports from three on).
    for at in [10, 20, 30] {
        m.on_message(
            at + 4_000,
            sender,
            TigaMsg::Manager(ManagerMsg::Probe { sent_at: at }),
            &mut out,
        );
    }
    assert_eq!(m.manager.as_ref().unwrap().probe_report(), vec![(sender, 4_000)]);
    assert_eq!(counter(&m, "tiga_manager_foreign_total"), 8);
    assert!(m.manager.as_ref().unwrap().is_member());
    // A member restarted without its group's records (nothing kept across restarts)
    // sits the group out: with its votes forgotten it could elect a second leader.
    let (mut context, _) = context_in(members[0].0, 3);
    context.incarnation = 1;
    let mut amnesiac = TigaNode::new(context).unwrap();
    amnesiac.host_manager(&BTreeMap::new()).unwrap();
    assert!(!amnesiac.manager.as_ref().unwrap().is_member());
}

/// A replica forgets the replies it kept for a coordinator's decided transactions (those
/// below the floor its bodies carry), never one at or above the body's own sequence
/// number, nor another incarnation's, nor on a floor sent by anyone but the coordinator.
#[test]
fn replies_kept_for_resends_go_once_their_coordinator_decided() {
    let (mut replica, workload) = node_of(0, Variant::TIGA);
    let id = |incarnation: u64, seq: u64| TxnId { origin: NodeId(10), incarnation, seq };
    let kept = [id(1, 0), id(1, 1), id(1, 2), id(1, 6), id(1, 7), id(1, 9), id(2, 0)];
    let host = replica.hosted.get_mut(&ShardId(0)).unwrap();
    for &txn in &kept {
        let slow =
            TigaMsg::Slow { view: VIEW, txn, shard: ShardId(0), ts: Timestamp(1), owd_ns: None };
        reply(host, txn, slow, &mut Outbox::new());
    }
    let mut generator = workload.generator(0, 0);
    let single = (0..1_000)
        .map(|i| generator.next(RequestId(i)))
        .find(|r| shape_of(&replica.context, r, ShardId(0)).unwrap().shards() == [ShardId(0)])
        .expect("a single-shard transfer");
    let body = |seq: u64, decided_below: u64| TxnBody {
        txn: id(1, seq),
        ts: Timestamp(5_000), // Held: no reply of its own.
        sent_at: 0,
        request: single.clone(),
        home: ShardId(0),
        decided_below,
    };
    let answered = |replica: &TigaNode| -> Vec<TxnId> {
        replica.hosted[&ShardId(0)].answers.keys().copied().collect()
    };
    let mut out = Outbox::new();
    let from_peer = TigaMsg::Txn(Box::new(body(8, 8)));
    replica.on_message(600, NodeId(11), from_peer, &mut out);
    assert_eq!(answered(&replica), kept, "a floor from another node counts for nothing");
    replica.on_message(600, NodeId(10), TigaMsg::Txn(Box::new(body(8, 2))), &mut out);
    assert_eq!(answered(&replica), [id(1, 2), id(1, 6), id(1, 7), id(1, 9), id(2, 0)]);
    replica.on_message(600, NodeId(10), TigaMsg::Txn(Box::new(body(7, 1_000))), &mut out);
    let left = answered(&replica);
    assert!(left.contains(&id(1, 7)), "not the body's own: {left:?}");
    assert!(!left.contains(&id(1, 6)) && left.contains(&id(1, 9)) && left.contains(&id(2, 0)));
    // The eviction order keeps up: thousands of replies forgotten as decided leave it
    // within a constant factor of what is kept.
    let host = replica.hosted.get_mut(&ShardId(0)).unwrap();
    for seq in 100..5_100 {
        let txn = id(1, seq);
        let slow =
            TigaMsg::Slow { view: VIEW, txn, shard: ShardId(0), ts: Timestamp(1), owd_ns: None };
        reply(host, txn, slow, &mut Outbox::new());
        forget_decided_answers(host, id(1, seq + 1), seq + 1);
    }
    let kept: Vec<TxnId> = host.answers.keys().copied().collect();
    assert_eq!(kept, [id(2, 0)], "every one of incarnation 1 decided");
    assert!(host.answer_order.len() <= 2 * host.answers.len() + 1_025);
    let ordered: BTreeSet<TxnId> = host.answer_order.iter().copied().collect();
    assert!(host.answers.keys().all(|txn| ordered.contains(txn)), "every reply evictable");
}

/// A leader asked to agree on a transaction its coordinator decided, of which it holds
/// no copy, refuses it for good (no body fetched, no agreement opened, every later copy
/// dropped), and the proposer, which holds it, drops it and journals that; a refusal from
/// a node that does not lead the refusing shard changes nothing.
#[test]
fn a_leader_refuses_what_its_coordinator_decided_without_it_and_the_proposer_drops_it() {
    for variant in [Variant::TIGA, crate::luigi::VARIANT] {
        let (mut a, workload) = node_of(0, variant);
        let leader_b = a.leader_of(ShardId(1)).unwrap();
        let mut b = node_of(leader_b.0, variant).0;
        assert!(b.hosted[&ShardId(1)].replica.leads());
        let coordinator = NodeId(10);
        let id = |seq: u64| TxnId { origin: coordinator, incarnation: 1, seq };
        let mut generator = workload.generator(0, 0);
        let shards_of = |r: &TxnRequest| shape_of(&a.context, r, ShardId(0)).unwrap().shards();
        let mut requests = (0..1_000).map(|i| generator.next(RequestId(i)));
        let across = requests.find(|r| shards_of(r) == [ShardId(0), ShardId(1)]).unwrap();
        let body = |seq: u64, request: &TxnRequest, decided_below: u64| TxnBody {
            txn: id(seq),
            ts: Timestamp(5_000), // Held: its time has not come.
            sent_at: 0,
            request: request.clone(),
            home: ShardId(0),
            decided_below,
        };
        let mut out = Outbox::new();
        // A holds transaction 1 and proposes it to B once its journal holds the proposal.
        a.on_message(10, coordinator, TigaMsg::Txn(Box::new(body(1, &across, 0))), &mut out);
        let proposal = when_durable(&mut a, out.drain().collect())
            .into_iter()
            .find_map(|e| match e {
                Effect::Send { to, msg: msg @ TigaMsg::Propose { .. } } if to == leader_b => {
                    Some(msg)
                }
                _ => None,
            })
            .expect("a proposal to B's leader");
        assert!(a.hosted[&ShardId(0)].replica.held_at(id(1)).is_some());
        // B never got it; its coordinator's next body says it decided it.
        let later = body(4, &across, 2);
        b.on_message(20, coordinator, TigaMsg::Txn(Box::new(later)), &mut out);
        when_durable(&mut b, out.drain().collect());
        b.on_message(30, NodeId(0), proposal, &mut out);
        let sent: Vec<TigaMsg> = when_durable(&mut b, out.drain().collect())
            .into_iter()
            .filter_map(|e| match e {
                Effect::Send { to: NodeId(0), msg } => Some(msg),
                _ => None,
            })
            .collect();
        let refusal = TigaMsg::Refused { view: VIEW, txn: id(1), from: ShardId(1), to: ShardId(0) };
        assert_eq!(sent, std::slice::from_ref(&refusal), "{variant:?}: refused, nothing fetched");
        assert_eq!(b.counts.refused_sent_total, 1);
        b.timer(1_000_000_000, TimerId(u64::MAX), &mut out); // No timer of its own.
        assert!(out
            .drain()
            .all(|e| !matches!(e, Effect::Send { msg: TigaMsg::GetBody { .. }, .. })));
        // A late copy of the body is dropped for good.
        let late = TigaMsg::Txn(Box::new(body(1, &across, 0)));
        b.on_message(40, coordinator, late, &mut out);
        assert!(b.hosted[&ShardId(1)].replica.held_at(id(1)).is_none());
        assert!(!b.hosted[&ShardId(1)].bodies.contains_key(&id(1)));
        assert_eq!(b.counts.stale_bodies_total, 1);
        // At A: a refusal from a node that does not lead B changes nothing.
        let stranger = NodeId(leader_b.0 + 1);
        a.on_message(50, stranger, refusal.clone(), &mut out);
        let host = &a.hosted[&ShardId(0)];
        assert!(host.replica.held_at(id(1)).is_some(), "{variant:?}: a stranger's word");
        assert!(host.lead.journaled.contains_key(&id(1)));
        // From B's leader: the transaction goes, body, proposal and all.
        let records = a.journal.records_total;
        a.on_message(60, leader_b, refusal, &mut out);
        let host = &a.hosted[&ShardId(0)];
        assert!(host.replica.held_at(id(1)).is_none(), "{variant:?}: dropped");
        assert!(!host.bodies.contains_key(&id(1)) && !host.lead.journaled.contains_key(&id(1)));
        assert_eq!(a.counts.refused_total, 1);
        assert_eq!(a.journal.records_total, records + 1, "{variant:?}: withdrawn");
        if let Some(streams) = &host.lead.streams {
            assert_eq!(streams.open(), 0, "no longer holds its worker's watermark back");
        }
    }
}
