//! Unit tests of the tiga node: each drives one `TigaNode` by hand (messages, timers and
//! persist completions in, the outbox read back) to pin one rule of the node's contract.

use super::state::{install, state_image};
use super::*;
use meridian_core::topology::Topology;
use meridian_core::txn::Datum;

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

/// A leader restarts from a journal holding its log: it runs the log again when it
/// starts (recording, not sending, its replies) and answers a resend from what it ran.
/// The same journal on a node that does not lead the shard refuses to start, as does one
/// that does not decode.
#[test]
fn a_leader_restarts_from_its_journal_and_a_journal_not_its_own_is_refused() {
    let mut coordinator = node(0);
    let mut out = Outbox::new();
    let bank = context_in(0, 3).1;
    let mut generator = bank.generator(0, 1);
    coordinator.submit(
        1_000,
        ClientRequest { id: RequestId(1), txn: generator.next(RequestId(1)) },
        &mut out,
    );
    let body = sent_body(&mut out).expect("a body went out");
    let shape = shape_of(&coordinator.context, &body.request, body.home).unwrap();
    let shard = *shape.parts.keys().next().unwrap();
    let leader = (0..9).find(|&n| node(n).leads(shard)).unwrap();
    let follower = (0..9).find(|&n| {
        let candidate = node(n);
        candidate.hosted.contains_key(&shard) && !candidate.leads(shard)
    });
    let mut journal: Journal<TigaMsg> = Journal::new(0..0);
    let ts = Timestamp(body.ts.0 + 5);
    journal.write(&Record::Logged { shard, ts, body: body.clone() });
    let (_, records) = journal.take_batch().unwrap();
    let durable: crate::Durable = records.into_iter().map(|r| (r.key, r.value.unwrap())).collect();
    let (shards, next) = super::super::journal::recover(&durable).unwrap();
    let restored =
        TigaNode::restored(context_in(follower.unwrap(), 3).0, shards.clone(), next.clone());
    assert!(restored.unwrap_err().contains("not led here"));
    let mut node = TigaNode::restored(context_in(leader, 3).0, shards, next).unwrap();
    for (shard, store) in node.stores_mut() {
        bank.load(shard, store);
    }
    let mut out = Outbox::new();
    node.on_start(2_000, &mut out);
    let counters = node.counters();
    let replayed = counters.iter().find(|(n, _)| *n == "tiga_replayed_total").unwrap().1;
    assert_eq!(replayed, 1);
    let sent_to_coordinator = out.drain().any(
        |e| matches!(e, Effect::Send { to, msg: TigaMsg::Fast { .. } } if to == body.txn.origin),
    );
    assert!(!sent_to_coordinator, "replayed replies are recorded, not sent");
    let host = &node.hosted[&shard];
    assert!(host.replica.logged(body.txn));
    let answered =
        host.answers.contains_key(&body.txn) || host.lead.pending.contains_key(&body.txn);
    assert!(answered, "the replay ran it");
    let mut garbage = durable.clone();
    garbage.insert(b"tiga/\0\0\0\0\0\0\0\x09".to_vec(), vec![0xff]);
    assert!(
        <crate::tiga::Tiga as crate::Protocol>::restore(context_in(leader, 3).0, &garbage).is_err()
    );
}

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
    let (shards, next) = super::super::journal::recover(&durable).unwrap();
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

#[test]
fn a_state_transfer_that_does_not_hold_together_changes_nothing() {
    use meridian_core::node::Effect;
    let shard = ShardId(0);
    let (mut follower, leader, id) = joining_follower(shard);
    let loaded = state(&follower);
    let key = follower.hosted[&shard].store.latest_values().next().unwrap().0.clone();
    let version = |ts: u64, value: u8| StateVersion {
        ts: Timestamp(ts),
        writer: txn(ts),
        value: Some(vec![value]),
    };
    let good = || {
        vec![
            StatePart::Head { base: 0, upto: 2, end: 3, floor: Timestamp(11), whole: false },
            StatePart::Entries(vec![(txn(10), Timestamp(10)), (txn(11), Timestamp(11))]),
            StatePart::Hashes(vec![(key.clone(), 5)]),
            StatePart::Rows(vec![(key.clone(), vec![version(10, 1), version(11, 2)])]),
            StatePart::Ahead(vec![(txn(12), None)]),
        ]
    };
    let mut out = Outbox::new();
    // Delivers the parts in `order` (by index).
    let deliver = |node: &mut TigaNode,
                   out: &mut Outbox<TigaMsg>,
                   (from, transfer, incarnation): (NodeId, u64, u64),
                   parts: Vec<StatePart>,
                   order: &[usize]| {
        let total = parts.len() as u32;
        for &index in order {
            let part = parts[index].clone();
            let index = index as u32;
            let start = start(incarnation);
            let msg = TigaMsg::State { view: VIEW, shard, start, transfer, index, total, part };
            node.on_message(1_000, from, msg, out);
        }
    };
    let send = |node: &mut TigaNode,
                out: &mut Outbox<TigaMsg>,
                sender: (NodeId, u64, u64),
                parts: Vec<StatePart>| {
        let order: Vec<usize> = (0..parts.len()).collect();
        deliver(node, out, sender, parts, &order);
    };
    let mut bad = good();
    bad[1] = StatePart::Entries(vec![(txn(10), Timestamp(10))]);
    send(&mut follower, &mut out, (leader, 1, 0), bad);
    let mut bad = good();
    bad[3] = StatePart::Rows(vec![(key.clone(), vec![version(11, 2), version(10, 1)])]);
    send(&mut follower, &mut out, (leader, 2, 0), bad);
    let mut bad = good();
    bad[1] = StatePart::Entries(vec![(txn(10), Timestamp(10)), (txn(10), Timestamp(11))]);
    send(&mut follower, &mut out, (leader, 3, 0), bad);
    // A base past the prefix's end; a transaction both listed and lingering below the base.
    let mut bad = good();
    bad[0] = StatePart::Head { base: 3, upto: 2, end: 3, floor: Timestamp(11), whole: false };
    send(&mut follower, &mut out, (leader, 3, 0), bad);
    let mut bad = good();
    bad.insert(2, StatePart::Lingering(vec![txn(11)]));
    send(&mut follower, &mut out, (leader, 3, 0), bad);
    send(&mut follower, &mut out, (id, 4, 0), good()); // Not from the leader.
    send(&mut follower, &mut out, (leader, 7, 1), good()); // For another start.
                                                           // Out of order: what comes early waits for a request that asks for it again.
    deliver(&mut follower, &mut out, (leader, 5, 0), good(), &[0, 2, 1, 4, 3]);
    let host = &follower.hosted[&shard];
    assert!(host.follow.joining.is_some(), "still joining");
    assert_eq!((host.replica.log_len(), host.follow.executed), (0, 0));
    assert_eq!(state(&follower), loaded, "the store as loaded");
    assert_eq!(follower.counts.rejoined_total, 0);
    let asked =
        out.drain().filter(|e| matches!(e, Effect::Send { msg: TigaMsg::Join { .. }, .. })).count();
    assert_eq!(asked, 0, "a transfer that did not hold together is asked for by the timer");
    let joining = follower.hosted[&shard].follow.joining.as_ref().unwrap();
    assert_eq!((joining.transfer, joining.parts.len()), (5, 2), "in order only: parts 0 and 1");
    send(&mut follower, &mut out, (leader, 6, 0), good());
    let host = &follower.hosted[&shard];
    assert!(host.follow.joining.is_none());
    assert_eq!((host.replica.log_len(), host.follow.executed), (2, 2));
    assert!(host.replica.logged(txn(11)) && host.follow.ahead.contains_key(&txn(12)));
    let value = host.store.read_latest(&key).and_then(|v| v.value.clone());
    assert_eq!(value, Some(vec![2]));
    assert_eq!(follower.counts.rejoined_total, 1);
    // The installed state is checkpointed before the acknowledgement goes.
    let effects = out.drain().collect::<Vec<_>>();
    assert!(!effects
        .iter()
        .any(|e| matches!(e, Effect::Send { msg: TigaMsg::SyncAck { .. }, .. })));
    let acked = when_durable(&mut follower, effects).into_iter().any(|e| {
        matches!(e, Effect::Send { to, msg: TigaMsg::SyncAck { synced: 2, executed: 2, .. } }
            if to == leader)
    });
    assert!(acked, "it tells the leader where to resume");
}

/// Mutated and random byte streams of tiga's frames never panic the connection reader.
#[test]
fn mutated_and_random_tiga_streams_never_panic_the_reader() {
    meridian_core::testing::check_message_streams(samples(), 12, 3_000, "tiga-connection-property");
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

/// A deposed leader's store may hold writes no log vouches for: it takes only an image
/// whose rows carry every key of the leader's store, and that image replaces its store
/// whole (a key only it wrote is gone, a key only it overwrote is back at the load's
/// value). An image of the keys written since the load is refused and changes nothing.
/// Installed, the replica takes part again and drops the report it froze.
#[test]
fn a_deposed_leaders_store_is_replaced_by_a_whole_image_only() {
    let shard = ShardId(0);
    let (probe, _) = node_in(0, Variant::TIGA, 3);
    let leader_id = probe.leader_of(shard).unwrap();
    let (mut leader, _) = node_in(leader_id.0, Variant::TIGA, 3);
    let deposed_id = leader.hosted[&shard].lead.followers[0];
    let (mut deposed, _) = node_in(deposed_id.0, Variant::TIGA, 3);
    let key = |k: u64| Key::table(0).u64(k).build();
    let value = |v: u8| vec![v];
    let written = |store: &mut MvccStore, k: u64, ts: u64, v: u8, writer: TxnId| {
        let state = VersionState::Committed;
        store.write(key(k), Timestamp(ts), Some(value(v)), writer, state).unwrap();
    };
    for node in [&mut leader, &mut deposed] {
        let store = &mut node.hosted.get_mut(&shard).unwrap().store;
        for k in 1..=3 {
            store.load(key(k), value(0));
        }
    }
    written(&mut leader.hosted.get_mut(&shard).unwrap().store, 1, 5, 1, txn(1));
    let host = deposed.hosted.get_mut(&shard).unwrap();
    written(&mut host.store, 2, 7, 2, txn(2));
    written(&mut host.store, 9, 8, 9, txn(3));
    host.retired = true;
    host.follow.joining = Some(Joining::default());
    host.frozen = Some(Box::new(view_change::freeze(host)));
    let floors = BTreeMap::new();
    let since_load = state_image(&leader.hosted[&shard], &floors, false).unwrap();
    let whole = state_image(&leader.hosted[&shard], &floors, true).unwrap();
    let rows = |parts: &[StatePart]| -> usize {
        parts.iter().map(|p| if let StatePart::Rows(r) = p { r.len() } else { 0 }).sum()
    };
    let keys = leader.hosted[&shard].store.key_count();
    assert!(keys >= 3);
    assert_eq!((rows(&since_load), rows(&whole)), (1, keys), "written since the load, all");
    let context = deposed.context.clone();
    let host = deposed.hosted.get_mut(&shard).unwrap();
    assert!(install(&context, host, since_load).is_err());
    assert!(host.retired && host.follow.joining.is_some());
    assert_eq!(host.store.read_latest(&key(9)).map(|v| v.ts), Some(Timestamp(8)));
    install(&context, host, whole).unwrap();
    assert!(!host.retired && host.follow.joining.is_none() && host.frozen.is_none());
    let latest = |store: &MvccStore, k: u64| store.read_latest(&key(k)).cloned();
    for k in [1, 2, 3, 9] {
        let (mine, theirs) = (latest(&host.store, k), latest(&leader.hosted[&shard].store, k));
        assert_eq!(mine, theirs, "key {k}");
    }
    assert_eq!(latest(&host.store, 2).unwrap().value, Some(value(0)), "back at the load");
    assert!(latest(&host.store, 9).is_none(), "a key only it wrote is gone");
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

/// A follower restarted from its journal takes up what it vouched for: its tail, the
/// entries its leader listed since, and the outcome of a multi-shard entry that it heard
/// while the entry was still in its tail, before a checkpoint and before the leader
/// listed it, also when it had dropped the entry from its tail at a leader's promise in
/// between (a checkpoint once kept only the outcomes of listed entries, and an outcome
/// already in memory was not journaled again: the restarted follower, which had
/// acknowledged executing the entry, waited for ever for an outcome its leader would not
/// send again). It runs the entry again and ends where it was, without a transfer.
#[test]
fn a_follower_restarts_from_its_journal_with_the_outcomes_it_heard_early() {
    // A multi-shard transfer from the coordinator at node 0.
    let mut coordinator = node(0);
    let bank = context_in(0, 3).1;
    let mut generator = bank.generator(0, 1);
    let mut body = None;
    for id in 1..200 {
        let mut out = Outbox::new();
        let request = ClientRequest { id: RequestId(id), txn: generator.next(RequestId(id)) };
        coordinator.submit(1_000, request, &mut out);
        let Some(sent) = sent_body(&mut out) else { continue };
        let shape = shape_of(&coordinator.context, &sent.request, sent.home).unwrap();
        if shape.parts.len() > 1 {
            body = Some(sent);
            break;
        }
    }
    let body = body.expect("a multi-shard transfer");
    let txn = body.txn;
    let shape = shape_of(&coordinator.context, &body.request, body.home).unwrap();
    let shard = *shape.parts.keys().next().unwrap();
    let (probe, _) = node_in(0, Variant::TIGA, 3);
    let leader = probe.leader_of(shard).unwrap();
    let id = probe.context.topology.shard_nodes(shard).into_iter().find(|&n| n != leader);
    for unlisted in [false, true] {
        let (mut follower, _) = node_in(id.unwrap().0, Variant::TIGA, 3);
        let mut disk = crate::Durable::new();
        let now = body.ts.0 + 1_000_000;
        let arrive = TigaMsg::Txn(Box::new(body.clone()));
        let sent = step(&mut follower, &mut disk, &|n, out| {
            n.on_message(now, txn.origin, arrive.clone(), out)
        });
        let fast = sent.iter().any(|(_, m)| matches!(m, TigaMsg::Fast { txn: t, .. } if *t == txn));
        assert!(fast, "released into the tail: {sent:?}");
        let ts = follower.hosted[&shard].replica.tail()[0].1;
        let outcome = SyncOutcome { txn, ok: true, inputs: Vec::new() };
        let sync = |entries: Vec<(TxnId, Timestamp)>| TigaMsg::Sync {
            view: VIEW,
            shard,
            from: 0,
            entries,
            outcomes: vec![outcome.clone()],
            commit: 0,
            base: 0,
        };
        // The outcome comes before the entry is listed; a checkpoint follows.
        step(&mut follower, &mut disk, &|n, out| n.on_message(now, leader, sync(Vec::new()), out));
        assert!(follower.hosted[&shard].follow.outcomes.contains_key(&txn));
        if unlisted {
            // The leader promises its log lists nothing more at or below the entry's
            // timestamp: the follower drops the entry from its tail (the leader will list it
            // later, at the same timestamp here for simplicity).
            let closed = TigaMsg::Closed { view: VIEW, shard, ts, upto: 0 };
            step(&mut follower, &mut disk, &|n, out| {
                n.on_message(now, leader, closed.clone(), out)
            });
            assert!(follower.hosted[&shard].replica.tail().is_empty(), "dropped");
        }
        follower.checkpoint_wanted = true;
        step(&mut follower, &mut disk, &|n, out| n.on_message(now, leader, sync(Vec::new()), out));
        assert_eq!(follower.counts.checkpoints_total, 1);
        // Listed and executed.
        step(&mut follower, &mut disk, &|n, out| {
            n.on_message(now, leader, sync(vec![(txn, ts)]), out)
        });
        let executed = follower.hosted[&shard].follow.executed;
        assert_eq!(executed, 1, "executed with the outcome heard early");
        let rows = |node: &TigaNode| {
            let store = &node.hosted[&shard].store;
            store_rows(store, store.written_keys()).collect::<Vec<_>>()
        };
        let before = rows(&follower);
        // The restart.
        let (shards, seqs) = super::super::journal::recover(&disk).unwrap();
        let mut context = context_in(follower.context.id.0, 3).0;
        context.incarnation = 1;
        let mut again = TigaNode::restored(context, shards, seqs).unwrap();
        for (shard, store) in again.stores_mut() {
            bank.load(shard, store);
        }
        step(&mut again, &mut disk, &|n, out| n.on_start(now, out));
        let host = &again.hosted[&shard];
        assert!(host.follow.joining.is_none(), "no state transfer");
        assert_eq!((host.follow.executed, host.replica.sync_point()), (1, 1));
        assert_eq!(rows(&again), before, "the store it had");
        assert_eq!(again.counts.followers_resumed_total, 1);
    }
}

/// The followers of a shard checkpoint at different entries of the cycle (a checkpoint
/// holds back a node's sends until it is durable: together they stalled both commit
/// paths), a cycle's `replicas`th apart, counting from the leader.
#[test]
fn followers_of_a_shard_checkpoint_at_different_entries() {
    let shard = ShardId(0);
    let (probe, _) = node_in(0, Variant::TIGA, 3);
    let leader = probe.leader_of(shard).unwrap();
    let mut offsets: Vec<usize> = probe
        .context
        .topology
        .shard_nodes(shard)
        .into_iter()
        .filter(|&n| n != leader)
        .map(|n| node_in(n.0, Variant::TIGA, 3).0.checkpoint_offset(shard, 300))
        .collect();
    offsets.sort_unstable();
    assert_eq!(offsets, [100, 200]);
    assert_eq!(node_in(leader.0, Variant::TIGA, 3).0.checkpoint_offset(shard, 300), 0);
}

/// A checkpoint due by its entry count also waits until the journal grew by a share of the
/// last checkpoint's bytes (one in `snapshot_bytes_per_log_byte_max`), unless that share is
/// 0 or a checkpoint was asked for.
#[test]
fn a_checkpoint_waits_for_a_share_of_its_bytes_in_the_journal_unless_told_not_to() {
    let shard = ShardId(0);
    let (probe, _) = node_in(0, Variant::TIGA, 3);
    let leader = probe.leader_of(shard).unwrap();
    let id = probe.context.topology.shard_nodes(shard).into_iter().find(|&n| n != leader);
    let (mut follower, _) = node_in(id.unwrap().0, Variant::TIGA, 3);
    follower.context.timing.snapshot_interval_entries = 10;
    follower.context.timing.snapshot_bytes_per_log_byte_max = 4;
    assert!(!follower.checkpoint_due(), "nothing executed yet");
    // Far past the cycle by count; the last checkpoint was 4,000 bytes, none journaled since.
    follower.hosted.get_mut(&shard).unwrap().follow.executed = 1_000;
    follower.counts.checkpoint_bytes_last = 4_000;
    assert!(!follower.checkpoint_due(), "the journal has not grown by a quarter of it");
    let record = Record::Promised { shard, ts: Timestamp(7) };
    while follower.journal.bytes_since_checkpoint() * 4 < 4_000 {
        assert!(!follower.checkpoint_due());
        follower.journal.write(&record);
    }
    assert!(follower.checkpoint_due(), "a quarter of its bytes journaled");
    // The share alone decides nothing: with the count not reached, no checkpoint.
    follower.hosted.get_mut(&shard).unwrap().follow.executed = 0;
    assert!(!follower.checkpoint_due());
    // Asked for (a transfer installed), or with the share off, the count decides alone.
    follower.hosted.get_mut(&shard).unwrap().follow.executed = 1_000;
    follower.counts.checkpoint_bytes_last = u64::MAX;
    assert!(!follower.checkpoint_due());
    follower.checkpoint_wanted = true;
    assert!(follower.checkpoint_due());
    follower.checkpoint_wanted = false;
    follower.context.timing.snapshot_bytes_per_log_byte_max = 0;
    assert!(follower.checkpoint_due());
    // A written checkpoint starts the count of journaled bytes again.
    // (Of the follower as it really is: nothing executed.)
    follower.context.timing.snapshot_bytes_per_log_byte_max = 4;
    follower.hosted.get_mut(&shard).unwrap().follow.executed = 0;
    follower.write_checkpoint();
    assert_eq!(follower.journal.bytes_since_checkpoint(), 0);
    assert!(follower.counts.checkpoint_bytes_last > 0);
    follower.hosted.get_mut(&shard).unwrap().follow.executed = 1_000;
    assert!(!follower.checkpoint_due());
}

/// A restarted leader's transfer ids start above every id its earlier starts gave: a
/// follower that had begun taking an image from the earlier start must not put its
/// parts together with the new start's (swarm seed 9935 of `bank` found that when ids
/// restarted at 1).
#[test]
fn a_restarted_leaders_transfer_ids_start_above_its_earlier_starts() {
    let shard = ShardId(0);
    let (probe, _) = node_in(0, Variant::TIGA, 3);
    let leader_id = probe.leader_of(shard).unwrap();
    let mut ids = Vec::new();
    for incarnation in [0, 1] {
        let (mut context, workload) = context_in(leader_id.0, 3);
        context.incarnation = incarnation;
        let mut leader = TigaNode::new(context).unwrap();
        for (shard, store) in leader.stores_mut() {
            workload.load(shard, store);
        }
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
        leader.on_message(1_000, follower, join, &mut out);
        ids.push(leader.hosted[&shard].lead.transfers[&follower].id);
    }
    assert!(ids[1] > ids[0] + u64::from(u32::MAX), "{ids:?}");
}

/// A transfer from a leader whose log no longer starts at 0: the follower's log counts
/// from the leader's base, the transactions below it that the leader listed still count
/// as logged (a resend finds them), the leader's decided floors are taken up (a late copy
/// of a body below one is dropped), and every key counts as released up to the floor.
#[test]
fn a_transfer_from_a_dropped_log_keeps_positions_and_what_was_logged() {
    let shard = ShardId(0);
    let (mut follower, leader, _) = joining_follower(shard);
    let parts = vec![
        StatePart::Head { base: 5, upto: 7, end: 7, floor: Timestamp(70), whole: false },
        StatePart::Entries(vec![(txn(60), Timestamp(60)), (txn(70), Timestamp(70))]),
        StatePart::Lingering(vec![txn(3)]),
        StatePart::Decided(vec![(NodeId(9), 1, 50)]),
    ];
    let total = parts.len() as u32;
    let mut out = Outbox::new();
    for (index, part) in parts.into_iter().enumerate() {
        let (start, index) = (start(0), index as u32);
        let msg = TigaMsg::State { view: VIEW, shard, start, transfer: 1, index, total, part };
        follower.on_message(1_000, leader, msg, &mut out);
    }
    let host = &follower.hosted[&shard];
    assert!(host.follow.joining.is_none(), "installed");
    assert_eq!((host.replica.log_base(), host.replica.log_len(), host.follow.executed), (5, 7, 7));
    assert!(host.replica.logged(txn(3)) && host.replica.logged(txn(70)));
    assert!(!host.replica.logged(txn(4)));
    assert!(is_decided(&follower.decided_floors, txn(49)));
    assert!(!is_decided(&follower.decided_floors, txn(50)));
}

/// A leader whose log starts past 0 never syncs a follower from below its base: a stale
/// acknowledgement (an old sync-point, overtaken) must not make it send nothing for good
/// (swarm seed 892 of `tpcc`: the follower missed the run's last entries).
#[test]
fn a_stale_acknowledgement_below_the_base_still_gets_the_log() {
    use meridian_core::node::Effect;
    let shard = ShardId(0);
    let (probe, _) = node_in(0, Variant::TIGA, 3);
    let (mut leader, _) = node_in(probe.leader_of(shard).unwrap().0, Variant::TIGA, 3);
    let key = Key::table(0).u64(1).build();
    let keys = [key];
    let log: Vec<(TxnId, Timestamp, &[Key], &[Key])> =
        (1..=6).map(|i| (txn(i), Timestamp(i * 10), &keys[..], &keys[..])).collect();
    let limits = replica_limits(3);
    let (mut replica, _) = Replica::recovered_leader(shard, limits, None, &log).unwrap();
    replica.truncate_leader_log(4);
    let host = leader.hosted.get_mut(&shard).unwrap();
    host.replica = replica;
    host.lead.finished = 6;
    host.lead.pruned = 4;
    let follower = host.lead.followers[0];
    // It executed 4 (past the base), but the latest acknowledgement says synced 1.
    host.lead.acks.insert(follower, (1, 4));
    host.lead.sent_to.insert(follower, 1);
    let mut out = Outbox::new();
    leader.sync_followers(shard, true, &mut out);
    let syncs: Vec<(u64, usize)> = out
        .drain()
        .filter_map(|e| match e {
            Effect::Send { to, msg: TigaMsg::Sync { from, entries, .. } } if to == follower => {
                Some((from, entries.len()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(syncs, [(4, 2)], "the entries from the base on");
}

/// A follower whose acknowledgement trails what its leader pruned is told so (with the
/// pruned position) and sent no log; it drops its log and asks for a transfer under its
/// next start (same incarnation, one more rejoin), which the leader serves, while a late
/// acknowledgement of the earlier start neither ends that transfer nor counts. Word of
/// being behind from anyone but the leader changes nothing; a follower that is not behind
/// (the leader had not heard how far it got) answers with its position instead.
#[test]
fn a_follower_too_far_behind_drops_its_log_and_rejoins_under_its_next_start() {
    use meridian_core::node::Effect;
    let shard = ShardId(0);
    let (probe, _) = node_in(0, Variant::TIGA, 3);
    let leader_id = probe.leader_of(shard).unwrap();
    let (mut leader, _) = node_in(leader_id.0, Variant::TIGA, 3);
    let follower_id = leader.hosted[&shard].lead.followers[0];
    let (mut follower, _) = node_in(follower_id.0, Variant::TIGA, 3);
    let other = leader.hosted[&shard].lead.followers[1];
    let first = follower_start(0, &follower.hosted[&shard]);
    assert_eq!(first, start(0));
    let ack = |start, executed| TigaMsg::SyncAck {
        view: VIEW,
        shard,
        start,
        synced: executed,
        executed,
        fetch: Vec::new(),
    };
    let sent = |out: &mut Outbox<TigaMsg>| -> Vec<(NodeId, TigaMsg)> {
        out.drain()
            .filter_map(|e| match e {
                Effect::Send { to, msg } => Some((to, msg)),
                _ => None,
            })
            .collect()
    };
    let mut out = Outbox::new();
    leader.on_message(1_000, follower_id, ack(first, 0), &mut out);
    assert_eq!(leader.counts.behind_total, 0, "nothing pruned: caught up");
    // (An acknowledgement counts at most the leader's log: none here, so the pruned
    // position is set by hand.)
    leader.hosted.get_mut(&shard).unwrap().lead.pruned = 20;
    leader.on_message(1_001, follower_id, ack(first, 9), &mut out);
    assert_eq!(leader.counts.behind_total, 1);
    let behind: Vec<TigaMsg> = sent(&mut out)
        .into_iter()
        .filter(|(to, m)| *to == follower_id && matches!(m, TigaMsg::Behind { .. }))
        .map(|(_, m)| m)
        .collect();
    assert_eq!(behind, [TigaMsg::Behind { view: VIEW, shard, upto: 20 }]);
    // No log goes to a follower behind, only the word again at each pace.
    leader.sync_followers(shard, true, &mut out);
    let to_follower: Vec<TigaMsg> =
        sent(&mut out).into_iter().filter(|(to, _)| *to == follower_id).map(|(_, m)| m).collect();
    assert_eq!(to_follower, behind);
    // A follower not behind says how far it got.
    let late = TigaMsg::Behind { view: VIEW, shard, upto: 0 };
    follower.on_message(1_002, leader_id, late, &mut out);
    let acks = sent(&mut out);
    assert!(matches!(acks.as_slice(), [(to, TigaMsg::SyncAck { .. })] if *to == leader_id));
    assert_eq!(follower.counts.went_behind_total, 0);
    // Only the leader's word counts.
    follower.on_message(1_002, other, behind[0].clone(), &mut out);
    assert_eq!((follower.counts.went_behind_total, follower.counts.dropped_total), (0, 1));
    assert!(follower.hosted[&shard].follow.joining.is_none());
    follower.on_message(1_003, leader_id, behind[0].clone(), &mut out);
    let host = &follower.hosted[&shard];
    assert!(
        host.follow.joining.is_some() && host.replica.log_len() == 0 && host.follow.executed == 0
    );
    let next = Start { incarnation: 0, rejoin: 1 };
    assert_eq!(follower_start(0, host), next);
    // It journals that it rejoins before it asks.
    let joins: Vec<TigaMsg> = when_durable(&mut follower, out.drain().collect())
        .into_iter()
        .filter_map(|e| match e {
            Effect::Send { to, msg } => Some((to, msg)),
            _ => None,
        })
        .filter(|(to, m)| *to == leader_id && matches!(m, TigaMsg::Join { .. }))
        .map(|(_, m)| m)
        .collect();
    assert!(
        matches!(joins.as_slice(), [TigaMsg::Join { start, transfer: 0, next: 0, .. }] if *start == next),
        "{joins:?}"
    );
    // A repeat while it rejoins changes nothing.
    follower.on_message(1_004, leader_id, behind[0].clone(), &mut out);
    assert_eq!(follower.counts.went_behind_total, 1);
    assert_eq!(follower_start(0, &follower.hosted[&shard]), next);
    // The leader cuts an image for the next start; the earlier start's late
    // acknowledgement neither ends the transfer nor draws another word.
    leader.on_message(1_005, follower_id, joins[0].clone(), &mut out);
    assert_eq!(leader.counts.transfers_total, 1);
    let words = leader.counts.behind_total;
    leader.on_message(1_006, follower_id, ack(first, 30), &mut out);
    let host = &leader.hosted[&shard];
    assert_eq!(host.lead.transfers[&follower_id].start, next, "the transfer goes on");
    assert_eq!(host.lead.acks[&follower_id].0, 0, "a joining start counts no log");
    assert_eq!(leader.counts.behind_total, words);
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

/// Luigi's coordinator at a view change: a transaction every leader answered
/// and that waits for its watermark starts over in the new view: resent to the new
/// leader, its old result and the old leader's watermark forgotten. The old leader's
/// word counts for nothing now (a reply of the new view from it either); the new
/// leader's result at another timestamp and its watermark commit the transaction.
#[test]
fn a_luigi_coordinator_starts_over_with_the_new_leader_at_a_view_change() {
    use meridian_core::node::Effect;
    let (mut coordinator, workload) = node_of(9, crate::luigi::VARIANT);
    let shard = ShardId(0);
    let mut generator = workload.generator(0, 0);
    let request = (0..1_000)
        .map(|i| generator.next(RequestId(i)))
        .find(|r| shape_of(&coordinator.context, r, shard).unwrap().shards() == [shard])
        .expect("a single-shard transfer on shard 0");
    let mut out = Outbox::new();
    coordinator.submit(1_000, ClientRequest { id: RequestId(1), txn: request }, &mut out);
    let old_leader = coordinator.leader_of(shard).unwrap();
    let txn = out
        .drain()
        .find_map(|e| match e {
            Effect::Send { to, msg: TigaMsg::Txn(body), .. } if to == old_leader => Some(body.txn),
            _ => None,
        })
        .expect("sent to the leader");
    let fast = |view: u64, ts: u64| TigaMsg::Fast {
        view,
        txn,
        shard,
        ts: Timestamp(ts),
        hash: 0,
        owd_ns: Some(1),
        result: Some(ShardResult::Ran(Vec::new())),
    };
    coordinator.on_message(2_000, old_leader, fast(VIEW, 500), &mut out);
    assert_eq!(coordinator.awaiting.len(), 1, "answered, waiting for the watermark");
    let mut next = coordinator.view.clone();
    next.global += 1;
    next.local[0] += 1;
    let new_leader = leader_node(&coordinator.context, &next, shard).unwrap();
    assert_ne!(new_leader, old_leader);
    coordinator.install_view(3_000, next.clone(), &mut out).unwrap();
    assert!(coordinator.awaiting.is_empty() && !coordinator.watermarks.contains_key(&shard));
    let flight = coordinator.requests.values().next().expect("still in flight");
    assert_eq!(flight.to, vec![new_leader], "resent to the new leader");
    // The old leader's watermark of the old view, and its reply in the new one: nothing.
    let old_mark = TigaMsg::Watermark { view: VIEW, shard, ts: Timestamp(10_000) };
    coordinator.on_message(4_000, old_leader, old_mark, &mut out);
    coordinator.on_message(4_000, old_leader, fast(next.global, 500), &mut out);
    let mark = TigaMsg::Watermark { view: next.global, shard, ts: Timestamp(10_000) };
    coordinator.on_message(4_000, old_leader, mark.clone(), &mut out);
    assert!(coordinator.awaiting.is_empty() && coordinator.watermarks.is_empty());
    assert_eq!(coordinator.requests.len(), 1);
    // The new leader ran the resend at 700 and covers it.
    coordinator.on_message(5_000, new_leader, fast(next.global, 700), &mut out);
    assert_eq!(coordinator.awaiting.len(), 1);
    coordinator.on_message(5_000, new_leader, mark, &mut out);
    assert!(coordinator.requests.is_empty(), "committed");
    let committed = out.drain().any(
        |e| matches!(e, Effect::Reply { outcome, .. } if outcome.result == TxnResult::Committed),
    );
    assert!(committed);
}

/// A view of the other agreement mode switches every replica of a tiga node at once (a
/// leader that kept its shard speculates from then on), kept states included, and is
/// journaled with its mode; luigi refuses a detective view and changes nothing.
#[test]
fn a_view_of_another_mode_switches_every_replica_and_luigi_refuses_detective() {
    let shard = ShardId(0);
    let probe = node(0);
    let leader = probe.leader_of(shard).unwrap();
    assert_eq!(probe.view.mode, Mode::Preventive);
    let mut next = probe.view.clone();
    next.global += 1;
    next.mode = Mode::Detective;
    let mut l = node(leader.0);
    assert!(!l.hosted[&shard].replica.detective());
    let mut out = Outbox::new();
    l.install_view(0, next.clone(), &mut out).unwrap();
    assert!(l.hosted.values().all(|h| h.replica.detective()));
    assert!(l.hosted[&shard].replica.leads(), "the same leader");
    assert!(l.counters().contains(&("tiga_mode_changes_total", 1)));
    let (_, records) = l.journal.take_batch().expect("journaled");
    let journaled = records.iter().any(|r| {
        let record = r.value.as_deref().and_then(|v| postcard::from_bytes(v).ok());
        matches!(record, Some(Record::View { detective: true, .. }))
    });
    assert!(journaled, "the view is journaled with its mode");
    // And back.
    let mut back = next.clone();
    back.global += 1;
    back.mode = Mode::Preventive;
    l.install_view(0, back, &mut out).unwrap();
    assert!(l.hosted.values().all(|h| !h.replica.detective()));
    let (mut luigi, _) = node_of(leader.0, crate::luigi::VARIANT);
    let before = luigi.view.clone();
    assert!(luigi.install_view(0, next, &mut out).is_err());
    assert_eq!(luigi.view, before);
}

#[test]
fn a_view_change_goes_forward_only_and_takes_reports_from_the_shards_replicas() {
    let control = |v: &View| Control::View {
        global: v.global,
        local: v.local.clone(),
        detective: v.mode == Mode::Detective,
    };
    let shard = ShardId(0);
    let probe = node(0);
    let view = probe.view.clone();
    let replicas = probe.context.topology.shard_nodes(shard);
    let old_leader = probe.leader_of(shard).unwrap();
    let mut next = view.clone();
    next.global += 1;
    next.local[0] += 1;
    let new_leader = leader_node(&probe.context, &next, shard).expect("a leader in the next view");
    assert_ne!(new_leader, old_leader);
    let other = *replicas.iter().find(|&&n| n != old_leader && n != new_leader).unwrap();
    let (mut leader, mut follower) = (node(new_leader.0), node(other.0));
    let mut out = Outbox::new();
    // Refused: not past the view, another shard count, no mode decided.
    let mut short = next.clone();
    short.local.pop();
    let mut undecided = next.clone();
    undecided.mode = Mode::Auto;
    for bad in [view.clone(), short, undecided] {
        assert!(leader.install_view(0, bad, &mut out).is_err());
    }
    assert_eq!(leader.view, view, "nothing changed");
    assert!(out.is_empty());
    // The new leader asks the others for reports.
    leader.install_view(0, next.clone(), &mut out).unwrap();
    let asked: Vec<NodeId> = out
        .drain()
        .filter_map(|e| match e {
            Effect::Send { to, msg: TigaMsg::Recover { shard: s, from: 0, .. }, .. }
                if s == shard =>
            {
                Some(to)
            }
            _ => None,
        })
        .collect();
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert!(asked.contains(&other) && asked.contains(&old_leader));
    assert!(leader.hosted[&shard].lead.recovering.is_some() && !leader.leads(shard));
    // The other follower rejoins, and answers the new leader only.
    follower.on_control(10, control(&next), &mut out);
    assert!(
        follower.hosted[&shard].follow.joining.is_some()
            && follower.hosted[&shard].frozen.is_some()
    );
    let effects = out.drain().collect();
    when_durable(&mut follower, effects);
    let recover = TigaMsg::Recover { view: next.global, shard, from: 0 };
    follower.on_message(11, NodeId(10), recover.clone(), &mut out);
    follower.on_message(11, old_leader, recover.clone(), &mut out);
    let effects = out.drain().collect();
    let sent = when_durable(&mut follower, effects)
        .iter()
        .filter(|e| matches!(e, Effect::Send { .. }))
        .count();
    assert_eq!(sent, 0, "a request from a node that does not lead the shard: silence");
    follower.on_message(11, new_leader, recover, &mut out);
    let effects = out.drain().collect();
    let reports: Vec<TigaMsg> = when_durable(&mut follower, effects)
        .into_iter()
        .filter_map(|e| match e {
            Effect::Send { to, msg, .. } if to == new_leader => Some(msg),
            _ => None,
        })
        .collect();
    assert!(matches!(reports[..], [TigaMsg::Report { .. }]), "{reports:?}");
    // The report from a stranger is dropped; the follower's is taken, and with f + 1 = 2
    // reports (its own included) the new leader leads the rebuilt (empty) log.
    let dropped = leader.counts.dropped_total;
    leader.on_message(12, NodeId(10), reports[0].clone(), &mut out);
    assert_eq!(leader.counts.dropped_total, dropped + 1);
    assert!(!leader.leads(shard));
    leader.on_message(12, other, reports[0].clone(), &mut out);
    assert!(!leader.leads(shard), "waits for the other shards' leaders");
    for peer in [ShardId(1), ShardId(2)] {
        let node = leader_node(&probe.context, &next, peer).unwrap();
        let pulled = TigaMsg::Pulled { view: next.global, shard, from: peer, entries: vec![] };
        // From a node that does not lead the shard: dropped.
        leader.on_message(12, NodeId(10), pulled.clone(), &mut out);
        leader.on_message(12, node, pulled, &mut out);
    }
    assert!(leader.leads(shard), "leads the rebuilt log");
    assert_eq!(leader.counts.views_led_total, 1);
    assert!(leader.hosted[&shard].lead.recovering.is_none());
    assert_eq!(leader.hosted[&shard].lead.followers.len(), 2);
    // A late copy of the report changes nothing.
    leader.on_message(13, other, reports[0].clone(), &mut out);
    assert_eq!(leader.counts.views_led_total, 1);
}

/// A follower a view change sends to rejoin keeps the state it dropped until a transfer
/// is in. Chosen to lead before that, it takes that state up again and gathers reports
/// like any follower chosen to lead (the stall of a shard whose other replicas hold no
/// log). A replica chosen while it rejoined without such state never led: it stays
/// rejoining, and when the view moves on it rejoins from the next leader instead of
/// retiring as a deposed leader would (its empty "log" must never count as a report).
#[test]
fn a_follower_sent_to_rejoin_can_lead_from_what_it_dropped_and_one_that_never_led_rejoins() {
    let shard = ShardId(0);
    let probe = node(0);
    let step = |v: &View| {
        let mut next = v.clone();
        next.global += 1;
        next.local[0] += 1;
        next
    };
    let (v1, v2) = (step(&probe.view), step(&step(&probe.view)));
    let (lead1, lead2) = (
        leader_node(&probe.context, &v1, shard).unwrap(),
        leader_node(&probe.context, &v2, shard).unwrap(),
    );
    let old_leader = probe.leader_of(shard).unwrap();
    assert!(lead1 != lead2 && lead2 != old_leader && lead1 != old_leader);
    let recovers = |node: &mut TigaNode, out: &mut Outbox<TigaMsg>| -> Vec<NodeId> {
        let effects = out.drain().collect();
        when_durable(node, effects)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Send { to, msg: TigaMsg::Recover { .. }, .. } => Some(to),
                _ => None,
            })
            .collect()
    };
    let mut out = Outbox::new();
    // Sent to rejoin from `lead1`: its log dropped, the state kept.
    let mut b = node(lead2.0);
    b.install_view(0, v1.clone(), &mut out).unwrap();
    assert!(recovers(&mut b, &mut out).is_empty());
    let host = &b.hosted[&shard];
    assert!(host.follow.joining.is_some() && host.stashed.is_some() && host.frozen.is_some());
    // Chosen to lead before any transfer: it takes the state up and asks for reports.
    b.install_view(0, v2.clone(), &mut out).unwrap();
    let asked = recovers(&mut b, &mut out);
    assert_eq!(asked.len(), 2, "{asked:?}");
    let host = &b.hosted[&shard];
    assert!(
        host.follow.joining.is_none() && host.stashed.is_none() && host.lead.recovering.is_some()
    );
    assert!(!host.retired);
    assert!(b.counters().contains(&("tiga_views_led_from_stash_total", 1)));
    // A replica rejoining since its restart holds no such state: chosen, it stays
    // rejoining; moved on from, it rejoins from the next leader and does not retire.
    let mut a = node(lead1.0);
    assert!(a.drop_log_to_rejoin(shard, false, &mut out));
    out.drain().for_each(drop);
    a.install_view(0, v1.clone(), &mut out).unwrap();
    assert!(recovers(&mut a, &mut out).is_empty(), "no log to lead with");
    assert!(a.hosted[&shard].follow.joining.is_some() && a.hosted[&shard].frozen.is_none());
    a.install_view(0, v2.clone(), &mut out).unwrap();
    let effects = out.drain().collect();
    let joins: Vec<NodeId> = when_durable(&mut a, effects)
        .into_iter()
        .filter_map(|e| match e {
            Effect::Send { to, msg: TigaMsg::Join { .. }, .. } => Some(to),
            _ => None,
        })
        .collect();
    let host = &a.hosted[&shard];
    assert!(!host.retired && host.follow.joining.is_some() && host.frozen.is_none());
    assert_eq!(joins, vec![lead2], "asks the next leader for its state");
    assert!(a.counters().contains(&("tiga_replicas_retired_total", 0)));
    // Nor does a report answer for it.
    a.on_message(1, lead2, TigaMsg::Recover { view: v2.global, shard, from: 0 }, &mut out);
    let effects = out.drain().collect();
    assert!(when_durable(&mut a, effects)
        .iter()
        .all(|e| !matches!(e, Effect::Send { msg: TigaMsg::Report { .. }, .. })));
}

/// A deposed leader keeps the state it led with. Chosen again while the other replicas
/// hold no log (both rejoining since before it was deposed), it does not lead at once,
/// nor say it cannot: it leads on from that state once every other replica's `Join`
/// says it held the log in no view after the one this node led in, with its store as it
/// left it, and answers the `Join` with a transfer. A `Join` from a replica that held the
/// log later makes the kept state void: the replica stays retired.
#[test]
fn a_deposed_leader_chosen_again_leads_on_once_no_replica_held_the_log_since() {
    let shard = ShardId(0);
    let probe = node(0);
    let step = |v: &View, by: u64| {
        let mut next = v.clone();
        next.global += 1;
        next.local[0] += by;
        next
    };
    let v0 = probe.view.clone();
    let leader = probe.leader_of(shard).unwrap();
    // Another leader, then this one again (three replicas: three steps come round).
    let (v1, v2) = (step(&v0, 1), step(&step(&v0, 1), 2));
    assert_ne!(leader_node(&probe.context, &v1, shard), Some(leader));
    assert_eq!(leader_node(&probe.context, &v2, shard), Some(leader));
    let others: Vec<NodeId> =
        probe.context.topology.shard_nodes(shard).into_iter().filter(|&n| n != leader).collect();
    let key = Key::table(0).u64(1).build();
    let join = |member_view| TigaMsg::Join {
        view: v2.global,
        shard,
        start: Start { incarnation: 1, rejoin: 1 },
        transfer: 0,
        next: 0,
        whole: false,
        member_view,
    };
    for void in [false, true] {
        let mut l = node(leader.0);
        let store = &mut l.hosted.get_mut(&shard).unwrap().store;
        store
            .write(key.clone(), Timestamp(5), Some(vec![7]), txn(1), VersionState::Committed)
            .unwrap();
        let mut out = Outbox::new();
        l.install_view(0, v1.clone(), &mut out).unwrap();
        let host = &l.hosted[&shard];
        assert!(host.retired && host.follow.joining.is_some() && host.deposed.is_some());
        assert_eq!(host.member_view, v0.global);
        l.install_view(0, v2.clone(), &mut out).unwrap();
        out.drain().for_each(drop);
        assert!(!l.hosted[&shard].replica.leads() && l.hosted[&shard].deposed.is_some());
        l.on_message(1, others[0], join(v0.global), &mut out);
        assert!(!l.hosted[&shard].replica.leads(), "one replica's word is not enough");
        let later = if void { v1.global } else { v0.global };
        l.on_message(2, others[1], join(later), &mut out);
        let effects = out.drain().collect();
        let states: Vec<NodeId> = when_durable(&mut l, effects)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Send { to, msg: TigaMsg::State { .. }, .. } => Some(to),
                _ => None,
            })
            .collect();
        let host = &l.hosted[&shard];
        if void {
            assert!(host.retired && host.follow.joining.is_some() && !host.replica.leads());
            assert!(host.deposed.is_none() && states.is_empty());
            assert!(l.counters().contains(&("tiga_deposed_states_void_total", 1)));
            continue;
        }
        assert!(host.replica.leads() && !host.retired && host.follow.joining.is_none());
        assert_eq!((host.leader, host.member_view), (leader, v2.global));
        assert_eq!(host.store.read_latest(&key).map(|v| v.ts), Some(Timestamp(5)));
        assert!(states.contains(&others[1]), "a transfer for the replica that asked");
        assert!(l.counters().contains(&("tiga_views_resumed_total", 1)));
    }
}

/// A node that its journal's view makes a shard's leader, whose journal holds the
/// follower it was (promoted at a view change, crashed before its first checkpoint as
/// the leader), restarts as that follower and gathers the reports again; without a view
/// in the journal the same records on a node leading the shard refuse to start.
#[test]
fn a_new_leader_restarted_before_its_checkpoint_gathers_the_reports_again() {
    use super::super::journal::{recover_with_view, Journal};
    let shard = ShardId(0);
    let probe = node(0);
    let mut next = probe.view.clone();
    next.global += 1;
    next.local[0] += 1;
    let new_leader = leader_node(&probe.context, &next, shard).unwrap();
    let disk = |with_view: bool| {
        let mut journal: Journal<()> = Journal::new(0..0);
        if with_view {
            let (global, local) = (next.global, next.local.clone());
            journal.write(&Record::View { global, local, detective: false });
        }
        journal.write(&Record::Unlisted { shard, through: Timestamp(5) });
        let (_, records) = journal.take_batch().unwrap();
        let disk: BTreeMap<Vec<u8>, Vec<u8>> =
            records.into_iter().map(|r| (r.key, r.value.unwrap())).collect();
        recover_with_view(&disk).unwrap()
    };
    let context = || {
        let mut context = context_in(new_leader.0, 3).0;
        context.incarnation = 1;
        context
    };
    let (shards, seqs, view) = disk(true);
    let mut node = TigaNode::restored_in_view(context(), shards, seqs, view).unwrap();
    assert_eq!(node.view, next);
    assert!(!node.leads(shard) && node.hosted[&shard].lead.recovering.is_some());
    let mut out = Outbox::new();
    node.on_start(0, &mut out);
    let asked = out
        .drain()
        .filter(|e| matches!(e, Effect::Send { msg: TigaMsg::Recover { .. }, .. }))
        .count();
    assert_eq!(asked, 2, "both other replicas are asked for their reports");
    // The same node in the starting view does not lead the shard: the follower's
    // records restore a follower. One that leads it in the starting view refuses them.
    let starting_leader = probe.leader_of(shard).unwrap();
    let (shards, seqs, _) = disk(false);
    let mut context = context_in(starting_leader.0, 3).0;
    context.incarnation = 1;
    assert!(TigaNode::restored_in_view(context, shards, seqs, None).is_err());
}

/// A replica chosen to lead while it rejoined (or a deposed leader chosen again, waiting
/// for the other replicas' word) that restarts finds its journal's view naming it the
/// leader and its journal saying it rejoins: it starts as a rejoining follower (it used
/// to refuse to start: the journal followed a shard the view has it lead).
#[test]
fn a_replica_chosen_to_lead_while_rejoining_restarts_rejoining() {
    use super::super::journal::{recover_with_view, Journal};
    let shard = ShardId(0);
    let probe = node(0);
    let mut next = probe.view.clone();
    next.global += 1;
    next.local[0] += 1;
    let chosen = leader_node(&probe.context, &next, shard).unwrap();
    let mut journal: Journal<()> = Journal::new(0..0);
    let (global, local) = (next.global, next.local.clone());
    journal.write(&Record::View { global, local, detective: false });
    journal.write(&Record::Joining { shard });
    let (_, records) = journal.take_batch().unwrap();
    let disk: BTreeMap<Vec<u8>, Vec<u8>> =
        records.into_iter().map(|r| (r.key, r.value.unwrap())).collect();
    let (shards, seqs, view) = recover_with_view(&disk).unwrap();
    let mut context = context_in(chosen.0, 3).0;
    context.incarnation = 1;
    let node = TigaNode::restored_in_view(context, shards, seqs, view).unwrap();
    let host = &node.hosted[&shard];
    assert!(!node.leads(shard) && host.follow.joining.is_some() && host.lead.recovering.is_none());
    assert!(host.lead.followers.is_empty() && host.lead.acks.is_empty());
}

/// A node that missed views (partitioned while the shard's leader changed and changed
/// back) tells a change of leader by the shard's local view number, not by its leader's
/// node: the leader that finds itself leading again does not lead on blindly (another
/// leader may have committed in between) but waits, as a deposed leader chosen again,
/// for every other replica's word; a follower that finds the same leader drops its log
/// and rejoins, saying the last view it held the log in.
#[test]
fn a_node_that_missed_views_tells_a_leader_change_by_the_local_view_number() {
    let shard = ShardId(0);
    let probe = node(0);
    let v0 = probe.view.clone();
    let leader = probe.leader_of(shard).unwrap();
    let mut skipped = v0.clone();
    skipped.global += 2;
    skipped.local[0] += 3;
    assert_eq!(leader_node(&probe.context, &skipped, shard), Some(leader));
    let mut l = node(leader.0);
    let mut out = Outbox::new();
    l.install_view(0, skipped.clone(), &mut out).unwrap();
    out.drain().for_each(drop);
    let host = &l.hosted[&shard];
    assert!(host.retired && host.deposed.is_some() && !host.replica.leads());
    let replicas = probe.context.topology.shard_nodes(shard);
    let follower = replicas.into_iter().find(|&n| n != leader).unwrap();
    let mut f = node(follower.0);
    f.install_view(0, skipped.clone(), &mut out).unwrap();
    let effects = out.drain().collect();
    let joins: Vec<(NodeId, u64)> = when_durable(&mut f, effects)
        .into_iter()
        .filter_map(|e| match e {
            Effect::Send { to, msg: TigaMsg::Join { member_view, .. }, .. } => {
                Some((to, member_view))
            }
            _ => None,
        })
        .collect();
    assert!(f.hosted[&shard].follow.joining.is_some());
    assert_eq!(joins, vec![(leader, v0.global)]);
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
