//! Execution: a leader runs a transaction's part on its shard at the agreed timestamp, trades
//! votes (and the piece outputs other shards take) with the other participant leaders, and
//! applies or drops the writes once every vote is in; a follower runs its synced log in order
//! at the leader's timestamps with the outcomes the leader sent.

use super::*;

/// Follower: executes the synced log in order at the leader's timestamps, as far as bodies
/// and the outcomes of multi-shard transactions allow. True when it executed any.
pub(super) fn follower_execute(
    context: &NodeContext,
    host: &mut Hosted,
    floors: &BTreeMap<(NodeId, u64), u64>,
) -> bool {
    let start = host.follow.executed;
    let synced_len = host.replica.sync_point();
    // An entry this follower and its leader synced survives a view change when `f + 1` is
    // two; otherwise only below the leader's commit-point.
    let upto = if slow_followers(context.topology.replicas) > 1 {
        synced_len.min(host.commit)
    } else {
        synced_len
    };
    // Bounded by the synced prefix.
    while host.follow.executed < upto {
        let Some((txn, ts)) = host.replica.synced_entry(host.follow.executed) else {
            debug_assert!(false, "a follower drops only what it executed");
            break;
        };
        if let Some(writes) = host.follow.ahead.get(&txn) {
            // The leader had executed it when it cut this replica's state transfer.
            if let Some(writes) = writes {
                let Some((ok, _)) = host.follow.outcomes.get(&txn) else { break };
                if *ok {
                    let writes = writes.clone();
                    apply(host, txn, ts, &writes);
                }
            }
            host.follow.ahead.remove(&txn);
            host.follow.executed += 1;
            continue;
        }
        let Some(known) = host.bodies.get(&txn) else { break };
        let none = (true, Vec::new());
        let (ok, inputs) = if known.shards.len() > 1 {
            match host.follow.outcomes.get(&txn) {
                Some(outcome) => outcome,
                None => break, // The leader has not told the outcome yet.
            }
        } else {
            &none
        };
        if *ok && host.follow.executed >= host.follow.rejoin_end {
            debug_assert_newest(&host.store, &known.part, ts, txn);
        }
        let multi = known.shards.len() > 1;
        let mut feeds = BTreeMap::new();
        let result = if *ok {
            let (writes, result) = run_part(context, host.shard, &host.store, known, ts, inputs);
            if multi {
                feeds = feed_outputs(&known.part, &result);
            }
            // A multi-shard transaction that committed ran here too: the leader ran the same
            // pieces over the same state and inputs (a single-shard one may abort here).
            debug_assert!(
                known.shards.len() == 1 || matches!(result, ShardResult::Ran(_)),
                "{txn}: {result:?}"
            );
            if matches!(result, ShardResult::Ran(_)) {
                apply(host, txn, ts, &writes);
            }
            result
        } else {
            ShardResult::Skipped
        };
        if feeds.values().any(|outputs| !outputs.is_empty()) {
            host.follow.fed.insert(txn, feeds);
        }
        // Kept for a view change that promotes this follower: its coordinator may still
        // wait for the shard's result.
        if host.follow.results.len() < RESULTS_KEPT_MAX && !is_decided(floors, txn) {
            host.follow.results.insert(txn, (ts, result));
        }
        // Its body and outcome stay until every replica executed it (the leader's base
        // passes it): a view change's new leader that has not may need them (see
        // `leader_closed`).
        host.follow.executed += 1;
    }
    host.follow.executed > start
}

/// Debug builds: no key `part` declares has a version above `ts`: a follower runs its log in
/// order, so it reads the newest version of every key (what [`apply`]'s pruning relies on).
/// Not below the end of a state transfer's log: its store may hold the versions of entries
/// the leader had applied before an earlier entry that only reads below them.
pub(super) fn debug_assert_newest(store: &MvccStore, part: &Part, ts: Timestamp, txn: TxnId) {
    if cfg!(debug_assertions) {
        for key in part.reads.iter().chain(&part.writes) {
            let newest = store.versions(key).last().map(|v| v.ts);
            debug_assert!(
                newest.is_none_or(|newest| newest <= ts),
                "{txn} runs at {ts:?}, below {key:?}'s newest version at {newest:?}"
            );
        }
    }
}

/// Runs the shard's pieces of `known` at `ts` on `store`, with `remote` the outputs of other
/// shards' pieces they take: its writes and the shard's result. A piece that reads or writes
/// a key the part did not declare from the arguments breaks the one-shot contract (the hold
/// queue ordered the transaction by the declared keys) and fails, unless it is guarded.
pub(super) fn run_part(
    context: &NodeContext,
    shard: ShardId,
    store: &MvccStore,
    known: &Known,
    ts: Timestamp,
    remote: &[(u32, PieceOutput)],
) -> (Overlay, ShardResult) {
    let Some(procedure) = context.registry.get(known.body.request.proc) else {
        let error = ProcError::BadArgs("unknown procedure".into());
        return (Overlay::new(), ShardResult::Failed(error));
    };
    let part = &known.part;
    let placement = Placement { shard, partitioner: &context.partitioner };
    let source = AtTimestamp(store, ts);
    let mut overlay = Overlay::new();
    let mut ran: Vec<(u32, PieceOutput)> = Vec::with_capacity(part.pieces.len());
    let contract = |why: String| (Overlay::new(), ShardResult::Failed(ProcError::Contract(why)));
    // Bounded by the plan (at most PIECES_MAX pieces).
    for (&piece, deps) in part.pieces.iter().zip(&part.deps) {
        let mut inputs = Vec::with_capacity(deps.len());
        for dep in deps {
            let found = ran.iter().chain(remote).find(|(p, _)| p == dep);
            match found {
                Some((_, output)) => inputs.push(output),
                None => return contract(format!("piece {piece} lacks piece {dep}'s output")),
            }
        }
        let call = (piece, &known.body.request.args, &inputs[..]);
        match run_piece(procedure.as_ref(), placement, call, &source, &overlay) {
            Err(error) => return (Overlay::new(), ShardResult::Failed(error)),
            Ok(run) => {
                // A guarded piece's keys came from its inputs (`run_piece` checked that it
                // wrote only those, on this shard); the guard ordered it.
                let guarded = part.guarded.binary_search(&piece).is_ok();
                let undeclared =
                    run.reads.iter().map(|(key, _)| key).find(|k| !guarded && !part.declares(k));
                if let Some(key) = undeclared {
                    return contract(format!(
                        "piece {piece} read {key:?}, a key its arguments did not name"
                    ));
                }
                if !run.scans.is_empty() {
                    return contract(format!("piece {piece} scanned with its inputs"));
                }
                match run.effects {
                    Err(abort) => return (Overlay::new(), ShardResult::UserAbort(abort.0)),
                    Ok(effects) => {
                        for write in effects.writes {
                            if !guarded && part.writes.binary_search(&write.key).is_err() {
                                return contract(format!(
                                    "piece {piece} wrote {:?}, a key its arguments did not name",
                                    write.key
                                ));
                            }
                            overlay.insert(write.key, write.value);
                        }
                        ran.push((piece, effects.output));
                    }
                }
            }
        }
    }
    (overlay, ShardResult::Ran(ran))
}

/// The outputs of other shards' pieces that `part` takes, each from the vote of the shard
/// that runs the piece; `None` while one is missing.
pub(super) fn gather_inputs(
    part: &Part,
    votes: Option<&BTreeMap<ShardId, PeerVote>>,
) -> Option<Vec<(u32, PieceOutput)>> {
    if part.inputs.is_empty() {
        return Some(Vec::new());
    }
    let votes = votes?;
    part.inputs
        .iter()
        .map(|&(piece, source)| {
            let vote = votes.get(&source).filter(|v| v.ok)?;
            vote.outputs.iter().find(|(p, _)| *p == piece).cloned()
        })
        .collect()
}

/// Per other shard, the outputs of pieces here that its pieces take (none unless they ran).
pub(super) fn feed_outputs(
    part: &Part,
    result: &ShardResult,
) -> BTreeMap<ShardId, Vec<(u32, PieceOutput)>> {
    let ShardResult::Ran(ran) = result else { return BTreeMap::new() };
    part.feeds
        .iter()
        .map(|(&shard, pieces)| {
            let outputs = ran.iter().filter(|(p, _)| pieces.contains(p)).cloned().collect();
            (shard, outputs)
        })
        .collect()
}

/// This shard's vote on a pending transaction, for the leader of `peer`.
pub(super) fn vote_msg(
    view: u64,
    txn: TxnId,
    shard: ShardId,
    peer: ShardId,
    pending: &Pending,
    want_reply: bool,
) -> TigaMsg {
    let outputs = pending.feeds.get(&peer).cloned().unwrap_or_default();
    TigaMsg::Vote { view, txn, from: shard, to: peer, ok: pending.own_ok, outputs, want_reply }
}

/// Takes another leader's vote: recorded on a pending transaction, kept (with the outputs it
/// carries) for one not executed here yet, ignored for one decided.
pub(super) fn deliver_vote(host: &mut Hosted, txn: TxnId, from: ShardId, vote: PeerVote) {
    if host.lead.pending.contains_key(&txn) {
        record_vote(host, txn, from, vote.ok);
    } else if !host.lead.decided.contains_key(&txn) && !finished_here(host, txn) {
        host.lead.early_votes.entry(txn).or_default().insert(from, vote);
        if let Some(queued) = host.lead.queued.get(&txn) {
            // It may have waited for these outputs, or may skip its pieces now.
            host.lead.waits.wake((queued.ts, txn));
        }
    }
}

/// Leader: `txn` is in the log and finished here (executed, and decided if it spans shards):
/// a vote for it changes nothing, even once its outcome record is gone.
pub(super) fn finished_here(host: &Hosted, txn: TxnId) -> bool {
    host.replica.leads()
        && host.replica.logged(txn)
        && !host.lead.queued.contains_key(&txn)
        && !host.lead.pending.contains_key(&txn)
}

/// About how many bytes `outputs` take on the wire.
pub(super) fn outputs_bytes(outputs: &[(u32, PieceOutput)]) -> usize {
    fn datum_bytes(datum: &Datum) -> usize {
        match datum {
            Datum::Int(_) | Datum::Uint(_) => 9,
            Datum::Bytes(bytes) => 5 + bytes.len(),
            // Decoded data nests only as deep as the decoder allows.
            Datum::List(items) => 5 + items.iter().map(datum_bytes).sum::<usize>(),
        }
    }
    outputs.iter().map(|(_, output)| 5 + output.iter().map(datum_bytes).sum::<usize>()).sum()
}

/// Applies `txn`'s writes at `ts`, then drops the versions of the written keys that no read
/// can see any more (unless the replica keeps history for snapshot reads, which read below
/// the newest version). A transaction released later reads a key above its newest version (a
/// late one is bumped past it, a conflicting one waits its turn), and a follower runs its log
/// in order, so only a leader's queued readers read below it: each written key keeps its
/// newest version at or below the first queued reader's timestamp, and everything newer.
pub(super) fn apply(host: &mut Hosted, txn: TxnId, ts: Timestamp, writes: &Overlay) {
    let store = &mut host.store;
    let leads = host.replica.leads();
    for (key, value) in writes {
        match store.write(key.clone(), ts, value.clone(), txn, VersionState::Committed) {
            Ok(()) => {}
            // Two conflicting transactions at one timestamp run in id order (the hold queue's
            // order, on every replica): the later one's version replaces the earlier's.
            Err(StoreError::DuplicateTimestamp { .. }) => {
                let replaced = store.replace_at(key, ts, value.clone(), txn);
                assert!(replaced, "{txn}: the version of {key:?} at {ts:?} is committed");
            }
            Err(error) => panic!("{txn} writes {key:?} at {ts:?}: {error}"),
        }
        // A key written behind a guard is pruned like any other: a guarded reader of it is a
        // writer of the guard, which any later writer of the key also writes and so waits
        // for (`Procedure::guard`'s promise).
        if !host.keep_history {
            let first_reader = host.lead.waits.first_reader(key).filter(|_| leads);
            store.prune_key(key, first_reader.map_or(Timestamp::MAX, |(ts, _)| ts));
        }
    }
}

pub(super) fn record_vote(host: &mut Hosted, txn: TxnId, from: ShardId, ok: bool) {
    if let Some(pending) = host.lead.pending.get_mut(&txn) {
        if pending.others.contains(&from) {
            pending.votes.insert(from, ok);
            if pending.others.iter().all(|s| pending.votes.contains_key(s)) {
                host.lead.complete.insert(txn);
            }
        }
    }
}

/// Applies or drops the writes of every pending transaction whose votes are all in. True when
/// one finished.
pub(super) fn finish_ready(host: &mut Hosted) -> bool {
    let ready = std::mem::take(&mut host.lead.complete);
    for &txn in &ready {
        let Some(pending) = host.lead.pending.remove(&txn) else { continue };
        let all = pending.own_ok && pending.votes.values().all(|&ok| ok);
        if all {
            apply(host, txn, pending.ts, &pending.writes);
        }
        host.lead.waits.finished((pending.ts, txn), &pending.write_keys);
        let inputs = if all { pending.inputs } else { Vec::new() };
        if host.lead.followers.is_empty() {
            host.bodies.remove(&txn); // Every peer had it: each proposed before the release.
        } else {
            host.lead.fresh_outcomes.push(SyncOutcome { txn, ok: all, inputs: inputs.clone() });
        }
        let (ts, own, feeds, others) = (pending.ts, pending.own_ok, pending.feeds, pending.others);
        let decided = Decided { ts, settled: false, own, all, inputs, feeds, others };
        host.lead.decided.insert(txn, decided);
    }
    !ready.is_empty()
}

/// The decided outcomes of multi-shard entries from log position `from` (a bounded window).
pub(super) fn window_outcomes(host: &Hosted, from: usize) -> Vec<SyncOutcome> {
    host.replica
        .log_since(from)
        .iter()
        .take(OUTCOMES_WINDOW_MAX)
        .filter_map(|&(txn, _)| {
            let decided = host.lead.decided.get(&txn)?;
            Some(SyncOutcome { txn, ok: decided.all, inputs: decided.inputs.clone() })
        })
        .collect()
}

impl TigaNode {
    /// Executes what every hosted replica can: leaders their released transactions, followers
    /// their synced log; votes between shards led here pass in place.
    pub(super) fn execute_all(&mut self, now: Time, out: &mut Outbox<TigaMsg>) {
        // Each round executes or finishes at least one transaction, or stops.
        loop {
            let mut progressed = false;
            for index in 0..self.hosted_shards.len() {
                progressed |= self.execute(self.hosted_shards[index], out);
            }
            if !progressed {
                break;
            }
        }
        // What a follower executed is no longer needed in its log.
        let drop_min = self.context.limits.log_drop_min;
        for host in self.hosted.values_mut() {
            // Nor what another follower has not executed yet: the leader's base says what
            // every follower did (a view change gathers the rest from the followers).
            let upto = host.follow.executed.min(host.follow.leader_base);
            let due = upto >= host.replica.log_base() + drop_min;
            if due && !host.replica.leads() && host.follow.joining.is_none() {
                let base = host.replica.log_base();
                for (txn, _) in host.replica.follower_entries(base, upto) {
                    host.follow.outcomes.remove(&txn);
                    host.follow.fed.remove(&txn);
                    host.bodies.remove(&txn);
                }
                let floors = &self.decided_floors;
                host.replica.truncate_follower_log(upto, |t| is_decided(floors, t));
            }
        }
        if self.snapshot_reads {
            self.serve_snapshots(now, out);
        }
    }

    /// Leader: executes released transactions that no earlier unfinished one blocks, and
    /// applies those whose votes are all in. Follower: executes its synced log. True when
    /// anything was done. One piece: a single pass over the queue holds the shard's borrow
    /// and its wait table, and the order it runs and applies in is the protocol's order.
    pub(super) fn execute(&mut self, shard: ShardId, out: &mut Outbox<TigaMsg>) -> bool {
        let me = self.context.id;
        let Some(host) = self.hosted.get_mut(&shard) else { return false };
        if !host.replica.leads() {
            return follower_execute(&self.context, host, &self.decided_floors);
        }
        let mut progressed = finish_ready(host);
        let mut local = Vec::new();
        // Candidates come in (timestamp, id) order; running or finishing one may make others
        // candidates (see `waits`). Bounded by the released transactions.
        while let Some(at) = host.lead.waits.next_candidate() {
            let (ts, txn) = at;
            let Some(queued) = host.lead.queued.get(&txn) else { continue }; // Ran already.
            debug_assert_eq!(queued.ts, ts, "{txn} queued at one timestamp");
            let Some(known) = host.bodies.get(&txn) else {
                debug_assert!(false, "{txn} queued without its body");
                continue;
            };
            let part = &known.part;
            if host.lead.waits.blocked(at, &part.reads, &part.writes) {
                continue; // What it waits for wakes it.
            }
            if queued.speculative {
                // Detective mode: run it where it is held and answer with the result; the
                // writes wait aside, and it keeps its keys (as a writer) until released.
                let hash = queued.hash;
                host.lead.queued.remove(&txn);
                progressed = true;
                let (writes, result) = run_part(&self.context, shard, &host.store, known, ts, &[]);
                host.lead.waits.ran(at, &part.reads);
                let owd_ns = known.owd_ns;
                let msg = TigaMsg::Fast {
                    view: self.view.global,
                    txn,
                    shard,
                    ts,
                    hash,
                    owd_ns,
                    result: Some(result.clone()),
                };
                reply(host, txn, msg, out);
                host.lead.speculations.insert(txn, Speculation { ts, hash, writes, result });
                self.counts.speculated_total += 1;
                continue;
            }
            let early = host.lead.early_votes.get(&txn);
            // A participant voted no: the transaction aborts, and pieces here are not run
            // (they may lack the outputs they take). Votes of other shards count for nothing.
            let refused = early.is_some_and(|votes| {
                votes.iter().any(|(s, v)| !v.ok && *s != shard && known.shards.contains(s))
            });
            let inputs = if refused { Some(Vec::new()) } else { gather_inputs(part, early) };
            // Missing inputs: the vote bringing them wakes it.
            let Some(inputs) = inputs else { continue };
            // Followers get the inputs with the outcome, in one sync message: bounded.
            let oversized = outputs_bytes(&inputs) > SYNC_INPUT_BYTES_MAX;
            let hash = queued.hash;
            host.lead.queued.remove(&txn);
            progressed = true;
            // Released where it ran speculatively: what ran stands (a speculation at another
            // timestamp was revoked before the release), unless a participant voted no
            // meanwhile: then, as in preventive mode, the shard skips.
            let kept = host.lead.speculations.remove(&txn);
            debug_assert!(kept.as_ref().is_none_or(|k| k.ts == ts), "{txn} kept off its place");
            let kept = kept.filter(|k| k.ts == ts && !refused);
            // Its fast reply went out when it ran; again only if the log's hash changed since.
            let answered = kept.as_ref().is_some_and(|k| k.hash == hash);
            let (writes, result) = if let Some(kept) = kept {
                self.counts.speculations_kept_total += 1;
                (kept.writes, kept.result)
            } else if refused {
                (Overlay::new(), ShardResult::Skipped)
            } else if oversized {
                let why = format!("inputs from other shards over {SYNC_INPUT_BYTES_MAX} bytes");
                (Overlay::new(), ShardResult::Failed(ProcError::Contract(why)))
            } else {
                run_part(&self.context, shard, &host.store, known, ts, &inputs)
            };
            host.lead.waits.ran(at, &part.reads);
            let feeds = feed_outputs(part, &result);
            let others: Vec<ShardId> =
                known.shards.iter().copied().filter(|&s| s != shard).collect();
            let owd_ns = known.owd_ns;
            let own_ok = matches!(result, ShardResult::Ran(_));
            // Writes that apply now (one shard) or never (an abort here) hold nobody back; a
            // multi-shard transaction's writes hold their keys until the votes are in.
            let write_keys = if own_ok && !others.is_empty() {
                part.writes.clone()
            } else {
                host.lead.waits.finished(at, &part.writes);
                Vec::new()
            };
            if !answered {
                let msg = TigaMsg::Fast {
                    view: self.view.global,
                    txn,
                    shard,
                    ts,
                    hash,
                    owd_ns,
                    result: Some(result),
                };
                reply(host, txn, msg, out);
            }
            if others.is_empty() {
                if own_ok {
                    apply(host, txn, ts, &writes);
                }
                if host.lead.followers.is_empty() {
                    host.bodies.remove(&txn);
                }
                continue;
            }
            // Multi-shard: the writes wait for the other leaders' votes.
            let votes: BTreeMap<ShardId, bool> = host
                .lead
                .early_votes
                .remove(&txn)
                .unwrap_or_default()
                .into_iter()
                .filter(|(s, _)| others.contains(s))
                .map(|(s, vote)| (s, vote.ok))
                .collect();
            for &peer in &others {
                let Some(node) = leader_node(&self.context, &self.view, peer) else { continue };
                let outputs = feeds.get(&peer).cloned().unwrap_or_default();
                if node == me {
                    local.push((peer, txn, shard, PeerVote { ok: own_ok, outputs }));
                } else {
                    let want_reply = !votes.contains_key(&peer);
                    let to = peer;
                    out.send(
                        node,
                        TigaMsg::Vote {
                            view: self.view.global,
                            txn,
                            from: shard,
                            to,
                            ok: own_ok,
                            outputs,
                            want_reply,
                        },
                    );
                }
            }
            if others.iter().all(|s| votes.contains_key(s)) {
                host.lead.complete.insert(txn);
            }
            let inputs = if own_ok { inputs } else { Vec::new() };
            let pending = Pending { ts, writes, write_keys, own_ok, votes, others, feeds, inputs };
            host.lead.pending.insert(txn, pending);
            self.counts.votes_waited_total += 1;
            progressed |= finish_ready(host);
        }
        advance_finished(host);
        // Votes for shards this node leads too pass in place (they wake what they unblock).
        for (to, txn, from, vote) in local {
            if let Some(host) = self.hosted.get_mut(&to) {
                // Not capped: bounded by the transactions this node holds.
                deliver_vote(host, txn, from, vote);
            }
        }
        progressed
    }

    /// Releases what is due on every hosted replica, and arranges the next release.
    pub(super) fn release(&mut self, now: Time, out: &mut Outbox<TigaMsg>) {
        for index in 0..self.hosted_shards.len() {
            let shard = self.hosted_shards[index];
            let actions = self.hosted.get_mut(&shard).expect("hosted").replica.tick(now);
            let released = !actions.is_empty();
            self.act(now, shard, actions, None, out);
            if released {
                self.sync_followers(shard, false, out);
                self.advance_replicated(shard, out);
            }
        }
        let next = self.hosted.values().filter_map(|h| h.replica.next_due_after(now)).min();
        // A replica that stopped at its bound per call may have more due already: come back
        // at once rather than wait for the next message (there may be none).
        let capped = self.hosted.values().any(|h| h.replica.capped());
        let next = if capped { Some(Timestamp(now + 1)) } else { next };
        if let Some(due) = next {
            if self.release_at.is_none_or(|at| at <= now || due.0 < at) {
                self.release_at = Some(due.0);
                self.timers.set(Purpose::Release, due.0 - now, out);
            }
        }
    }
}
