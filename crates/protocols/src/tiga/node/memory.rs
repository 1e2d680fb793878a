//! What a replica remembers for resends, and how it forgets: the replies kept to answer a
//! coordinator's resend, the coordinators' decided floors (below which a transaction is
//! known decided), and the bodies and outcome records it may drop. Each is bounded by a
//! named limit; forgetting never turns a decided transaction into an undecided one.

use super::*;

/// Leader: drops the bodies of log entries every follower executed (one still queued or
/// waiting for votes here stays: it is executed later), and of those finished here more than
/// `lag_max` entries ago whatever the followers acknowledged: a follower that far behind is
/// sent to a state transfer when it next acknowledges ([`TigaMsg::Behind`]), so a follower
/// down for good holds neither this memory nor, once [`BODIES_MAX`] is reached, the shard.
pub(super) fn prune_bodies(host: &mut Hosted, limits: &crate::Limits) {
    let lag_max = limits.follower_lag_max;
    let log_len = host.replica.log_len();
    let slowest = host.lead.acks.values().map(|&(_, e)| e).min().unwrap_or(log_len);
    let floor = slowest.max(host.lead.finished.saturating_sub(lag_max)).min(log_len);
    if floor <= host.lead.pruned {
        return;
    }
    // Bounded by the log: each entry is passed once over the run.
    let done: Vec<TxnId> = host
        .replica
        .log_since(host.lead.pruned)
        .iter()
        .take(floor - host.lead.pruned)
        .map(|&(txn, _)| txn)
        .collect();
    let pruned_upto = host.lead.pruned + done.len();
    for txn in done {
        if !host.lead.pending.contains_key(&txn) && !host.lead.queued.contains_key(&txn) {
            host.bodies.remove(&txn);
        }
        if let Some(decided) = host.lead.decided.get_mut(&txn) {
            // Every follower executed it, or will take a transfer.
            decided.inputs = Vec::new();
            if !decided.settled {
                decided.settled = true;
                host.lead.settling.insert((decided.ts, txn));
            }
        }
    }
    host.lead.pruned = pruned_upto;
    // The log below: every follower executed it, or takes a state transfer. Luigi's
    // replication watermarks walk the log from what is replicated: not past that.
    // Never past the finished prefix: the leader walks its log from there (a restarted leader
    // running its journal again may hear followers that executed further).
    let mut drop_upto = host.lead.pruned.min(host.lead.finished);
    if host.lead.streams.is_some() {
        drop_upto = drop_upto.min(host.lead.replicated);
    }
    if drop_upto >= host.replica.log_base() + limits.log_drop_min {
        // Bounded by the entries dropped.
        for (txn, ts) in host.replica.truncate_leader_log(drop_upto) {
            if host.lead.forgettable.len() < limits.forgettable_max {
                host.lead.forgettable.insert((ts, txn));
            } else {
                host.lead.forgettable_overflowed = true;
            }
        }
    }
}

/// Leader: stops knowing as logged the transactions below its log's base that its
/// coordinator decided and every other shard's leader promised a closed timestamp at or above
/// (`covered`: the least such promise). Nothing brings one here again: its coordinator resends
/// it no more; no other leader proposes it (each finished it) or votes on it again but as a
/// late copy, which is dropped; a late copy of its body is refused as stale (see `on_body`),
/// and a late proposal is answered with a refusal the proposer ignores (it released the
/// transaction). Bounded by [`crate::Limits::forgettable_max`].
pub(super) fn forget_decided(
    host: &mut Hosted,
    floors: &BTreeMap<(NodeId, u64), u64>,
    covered: Timestamp,
    forgettable_max: usize,
) {
    let upto = (covered, TxnId { origin: NodeId(u32::MAX), incarnation: u64::MAX, seq: u64::MAX });
    let decided: Vec<(Timestamp, TxnId)> = host
        .lead
        .forgettable
        .range(..=upto)
        .copied()
        .filter(|&(_, t)| is_decided(floors, t))
        .collect();
    for entry in decided {
        host.lead.forgettable.remove(&entry);
        host.replica.forget_logged(entry.1);
    }
    if host.lead.forgettable_overflowed && host.lead.forgettable.len() <= forgettable_max / 2 {
        // Room again (once per half of the set emptied): a pass over the logged set forgets
        // what went below the base meanwhile and qualifies now, and takes up the rest.
        let mut waiting = Vec::new();
        // Bounded by the transactions logged here.
        for (txn, ts) in host.replica.logged_below_base_at(|_| true) {
            if host.lead.forgettable.contains(&(ts, txn)) {
                continue;
            }
            if ts <= covered && is_decided(floors, txn) {
                host.replica.forget_logged(txn);
            } else {
                waiting.push((ts, txn));
            }
        }
        let room = forgettable_max - host.lead.forgettable.len();
        host.lead.forgettable_overflowed = waiting.len() > room;
        host.lead.forgettable.extend(waiting.into_iter().take(room));
    }
}

/// Notes that `txn`'s coordinator decided everything of its start below `decided_below`.
pub(super) fn note_decided(
    floors: &mut BTreeMap<(NodeId, u64), u64>,
    txn: TxnId,
    decided_below: u64,
) {
    // The transaction carrying it is not decided: nothing from it on.
    raise_floor(floors, (txn.origin, txn.incarnation), decided_below.min(txn.seq));
}

/// Raises the decided floor of coordinator start `start` to `below` (a start not tracked yet
/// is added while there is room).
pub(super) fn raise_floor(
    floors: &mut BTreeMap<(NodeId, u64), u64>,
    start: (NodeId, u64),
    below: u64,
) {
    if let Some(floor) = floors.get_mut(&start) {
        *floor = (*floor).max(below);
    } else if floors.len() < COORDINATORS_TRACKED_MAX && below > 0 {
        floors.insert(start, below);
    }
}

/// True when `txn`'s coordinator said it decided it.
pub(super) fn is_decided(floors: &BTreeMap<(NodeId, u64), u64>, txn: TxnId) -> bool {
    floors.get(&(txn.origin, txn.incarnation)).is_some_and(|&floor| txn.seq < floor)
}

/// A remembered reply sent again carries the delay of the copy it answers (none where that
/// copy came from elsewhere than the coordinator): one sample per copy.
pub(super) fn refresh_owd(msg: TigaMsg, owd: Option<u64>) -> TigaMsg {
    match msg {
        TigaMsg::Fast { view, txn, shard, ts, hash, result, .. } => {
            TigaMsg::Fast { view, txn, shard, ts, hash, owd_ns: owd, result }
        }
        TigaMsg::Slow { view, txn, shard, ts, .. } => {
            TigaMsg::Slow { view, txn, shard, ts, owd_ns: owd }
        }
        other => other,
    }
}

/// A follower's slow reply for `txn` at `ts` in global view `view`, with the delay its body
/// took to arrive if no earlier reply carried it (a sample counted twice would halve the
/// window the estimate spans).
pub(super) fn slow_reply(view: u64, host: &mut Hosted, txn: TxnId, ts: Timestamp) -> TigaMsg {
    let owd_ns = host.bodies.get_mut(&txn).and_then(|known| known.owd_ns.take());
    TigaMsg::Slow { view, txn, shard: host.shard, ts, owd_ns }
}

/// Sends `msg` to `txn`'s coordinator and remembers it (the last one sent) to repeat on a
/// resend, forgetting the oldest beyond the bound.
pub(super) fn reply(host: &mut Hosted, txn: TxnId, msg: TigaMsg, out: &mut Outbox<TigaMsg>) {
    if !host.quiet {
        out.send(txn.origin, msg.clone());
    }
    if host.answers.insert(txn, msg).is_none() {
        compact_answer_order(host);
        host.answer_order.push_back(txn);
        // The oldest reply goes, past the stale ids before it (bounded by the order's
        // length, which compaction keeps within twice the replies plus a margin).
        while host.answers.len() > ANSWERS_MAX {
            let Some(old) = host.answer_order.pop_front() else { break };
            host.answers.remove(&old);
        }
    }
}

/// Forgets the replies kept for transactions of `txn`'s coordinator incarnation below
/// `decided_below` (its coordinator decided them and sends them no more), at most up to
/// `txn` itself. Bounded by the replies forgotten.
pub(super) fn forget_decided_answers(host: &mut Hosted, txn: TxnId, decided_below: u64) {
    let below = TxnId { seq: decided_below.min(txn.seq), ..txn };
    let decided: Vec<TxnId> =
        host.answers.range(TxnId { seq: 0, ..txn }..below).map(|(&id, _)| id).collect();
    for id in decided {
        host.answers.remove(&id);
    }
    compact_answer_order(host);
    if !host.follow.results.is_empty() {
        let decided: Vec<TxnId> =
            host.follow.results.range(TxnId { seq: 0, ..txn }..below).map(|(&id, _)| id).collect();
        for id in decided {
            host.follow.results.remove(&id);
        }
    }
}

/// Drops from the eviction order the ids whose replies are gone (forgotten as decided), and
/// all but the last of an id pushed again, once it holds twice as many ids as replies plus
/// a margin: so it stays within a constant factor of the replies kept. Amortized constant
/// per reply.
pub(super) fn compact_answer_order(host: &mut Hosted) {
    const MARGIN: usize = 1 << 10;
    if host.answer_order.len() <= 2 * host.answers.len() + MARGIN {
        return;
    }
    host.answer_order = answer_order(host).into();
}
