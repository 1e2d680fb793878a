//! Restarts from the journal and checkpoints: leaders and followers take up what they
//! journaled, checkpoints come when due and are staggered, transfer ids survive restarts.

use super::*;

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
    let (shards, next) = crate::tiga::journal::recover(&durable).unwrap();
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
        let (shards, seqs) = crate::tiga::journal::recover(&disk).unwrap();
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

/// A node that its journal's view makes a shard's leader, whose journal holds the
/// follower it was (promoted at a view change, crashed before its first checkpoint as
/// the leader), restarts as that follower and gathers the reports again; without a view
/// in the journal the same records on a node leading the shard refuse to start.
#[test]
fn a_new_leader_restarted_before_its_checkpoint_gathers_the_reports_again() {
    use crate::tiga::journal::{recover_with_view, Journal};
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
    use crate::tiga::journal::{recover_with_view, Journal};
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
