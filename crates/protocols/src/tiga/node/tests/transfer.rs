//! State transfers and rejoins: an image that does not hold together changes nothing, a deposed
//! leader's store is replaced whole, a follower too far behind rejoins.

use super::*;

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
