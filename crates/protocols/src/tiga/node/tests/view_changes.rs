//! View changes: mode switches, reports from the shard's replicas, rejoined followers and
//! deposed leaders chosen to lead, luigi coordinators starting over.

use super::*;

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
