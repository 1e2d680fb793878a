//! The coordinator: stamps and sends a client's transaction to every replica of its shards
//! (luigi: to the leaders), resends until decided, and decides on the replies: a super quorum
//! of matching fast replies per shard, or the leader's fast reply and `f` slow ones (luigi:
//! every leader's result once its replication watermark covers the agreed timestamp).

use super::*;

impl TigaNode {
    pub(super) fn start(&mut self, now: Time, client: ClientRequest, out: &mut Outbox<TigaMsg>) {
        let id = client.id;
        if self.requests.contains_key(&id) {
            return; // A duplicate submit: the first is answered.
        }
        let home = ShardId(self.context.id.0 % self.context.topology.shards);
        let shape = match shape_of(&self.context, &client.txn, home) {
            Ok(shape) => shape,
            Err(error) => {
                return out.reply(id, TxnOutcome::failed(TxnFailure::Procedure(error)));
            }
        };
        let read_only = || shape.parts.values().all(|p| p.writes.is_empty() && p.inputs.is_empty());
        if self.snapshot_reads && read_only() {
            return self.start_snapshot(now, client, &shape, home, out);
        }
        let txn = self.ids.next_id();
        let placement = self.placement(&shape.shards());
        let (ts, to) = match self.tracker.start(now, txn, &placement) {
            Ok(started) => started,
            Err(Refused::Busy) => {
                let why = "as many transactions in flight as this coordinator runs";
                return out.reply(id, TxnOutcome::failed(TxnFailure::Rejected(why.into())));
            }
            Err(refused) => {
                let why = format!("{refused:?}");
                return out.reply(id, TxnOutcome::failed(TxnFailure::Rejected(why)));
            }
        };
        let decided_below = self.decided_below();
        let body =
            TxnBody { txn, ts, sent_at: now, request: client.txn.clone(), home, decided_below };
        for &node in &to {
            out.send(node, TigaMsg::Txn(Box::new(body.clone())));
        }
        self.timers.set(Purpose::Resend(id, txn), self.context.timing.rpc_timeout_ns, out);
        self.by_txn.insert(txn, id);
        let flight = InFlight {
            client,
            txn,
            body,
            snapshot: false,
            shards: shape.shards(),
            to,
            results: BTreeMap::new(),
            pieces_total: shape.pieces_total,
            resends: 0,
        };
        self.requests.insert(id, flight);
    }

    /// The lowest sequence number of this coordinator's transactions still undecided (the
    /// next one's when none is): every lower one is decided and never sent again.
    pub(super) fn decided_below(&self) -> u64 {
        // Every id in flight here is this incarnation's (`self.ids`), so the first is the lowest.
        self.by_txn.keys().next().map_or(self.ids.next_seq(), |txn| txn.seq)
    }

    pub(super) fn resend(
        &mut self,
        now: Time,
        id: RequestId,
        txn: TxnId,
        out: &mut Outbox<TigaMsg>,
    ) {
        let decided_below = self.decided_below();
        let Some(flight) = self.requests.get_mut(&id) else { return };
        if flight.txn != txn {
            return;
        }
        flight.resends += 1;
        if flight.resends >= self.context.timing.attempts_max {
            let why = format!("undecided after {} sends", flight.resends);
            self.tracker.abandon(txn);
            self.awaiting.remove(&txn);
            self.by_txn.remove(&txn);
            let flight = self.requests.remove(&id).expect("just seen");
            return out.reply(flight.client.id, TxnOutcome::failed(TxnFailure::Indeterminate(why)));
        }
        self.counts.resends_total += 1;
        flight.body.sent_at = now;
        flight.body.decided_below = decided_below;
        if flight.snapshot {
            // To the leaders of the shards still silent: a leader closes its snapshot as
            // soon as what it released below the timestamp has run.
            let body = flight.body.clone();
            let silent: Vec<ShardId> =
                flight.shards.iter().copied().filter(|s| !flight.results.contains_key(s)).collect();
            self.timers.set(Purpose::Resend(id, txn), self.context.timing.rpc_timeout_ns, out);
            for shard in silent {
                if let Some(leader) = self.leader_of(shard) {
                    self.send_snapshot_read(now, leader, &body, out);
                }
            }
            return;
        }
        for &node in &flight.to {
            out.send(node, TigaMsg::Txn(Box::new(flight.body.clone())));
        }
        self.timers.set(Purpose::Resend(id, txn), self.context.timing.rpc_timeout_ns, out);
    }

    pub(super) fn on_decided(&mut self, committed: Committed, out: &mut Outbox<TigaMsg>) {
        let Some(id) = self.by_txn.remove(&committed.txn) else { return };
        let Some(flight) = self.requests.remove(&id) else { return };
        // Every shard committed at its leader's latest timestamp, whose result is the one
        // kept. A leader whose replies contradict each other (found by fuzzing with forged
        // replies; honest leaders never do) leaves no result to report: the outcome is
        // unknown, never another timestamp's result.
        if flight.results.values().any(|&(ts, _)| ts != committed.ts) {
            self.counts.contradicted_total += 1;
            let why = format!("{}: a leader's replies contradict the decision", committed.txn);
            let failure = TxnFailure::Indeterminate(why);
            return out.reply(flight.client.id, TxnOutcome::failed(failure));
        }
        let mut outcome = TxnOutcome {
            result: TxnResult::Committed,
            outputs: Vec::new(),
            commit_ts: None,
            retries: 0,
            aborts: AbortCounts::default(),
            shards_touched: flight.results.len() as u32,
            path: CommitPath::None,
            speculative_ns: None,
        };
        let mut outputs: Vec<Option<PieceOutput>> = vec![None; flight.pieces_total];
        for (_, result) in flight.results.values() {
            match result {
                ShardResult::Failed(error) => {
                    outcome.result = TxnResult::Failed(TxnFailure::Procedure(error.clone()));
                }
                ShardResult::UserAbort(why) if outcome.result == TxnResult::Committed => {
                    outcome.result = TxnResult::UserAborted(why.clone());
                }
                ShardResult::UserAbort(_) | ShardResult::Skipped => {}
                ShardResult::Ran(ran) => {
                    for (piece, output) in ran {
                        if let Some(slot) = outputs.get_mut(*piece as usize) {
                            *slot = Some(output.clone());
                        }
                    }
                }
            }
        }
        let skipped = flight.results.values().any(|(_, r)| matches!(r, ShardResult::Skipped));
        if skipped && outcome.result == TxnResult::Committed {
            // A shard skips only when another aborted, and that one's reason is the better
            // one; a leader that says it skipped when none aborted is wrong, and the commit
            // is not reported on its word.
            outcome.result = TxnResult::UserAborted("aborted on another shard".into());
        }
        if outcome.result == TxnResult::Committed {
            outcome.outputs = outputs.into_iter().map(Option::unwrap_or_default).collect();
            outcome.commit_ts = Some(committed.ts);
            // Luigi has no fast path: it commits once the leaders' logs are replicated.
            let fast = committed.fast && self.variant.every_replica();
            outcome.path = if flight.snapshot {
                CommitPath::Snapshot
            } else if fast {
                CommitPath::Fast
            } else {
                CommitPath::Slow
            };
            if flight.snapshot {
                self.counts.snapshot_reads_total += 1;
            } else if fast {
                self.counts.fast_total += 1;
            } else {
                self.counts.slow_total += 1;
            }
        }
        out.reply(flight.client.id, outcome);
    }

    pub(super) fn on_fast(
        &mut self,
        from: NodeId,
        reply: (TxnId, ShardId, Timestamp, u64),
        owd_ns: Option<u64>,
        result: Option<ShardResult>,
        out: &mut Outbox<TigaMsg>,
    ) {
        let (txn, shard, ts, hash) = reply;
        // A sample of the delay to `from` whether or not the transaction is decided: a
        // replica that replies only after the slow path committed is still one the next
        // timestamps must wait for.
        if let Some(owd_ns) = owd_ns {
            self.tracker.observe(from, owd_ns);
        }
        let Some(&id) = self.by_txn.get(&txn) else {
            // Decided already: on the slow path, the tracker counts a super quorum matching
            // after all.
            let _ = self.tracker.on_fast(from, txn, shard, ts, hash);
            return;
        };
        let from_leader = self.leader_of(shard) == Some(from);
        if from_leader && result.is_none() {
            return; // A leader's fast reply carries its shard's result: malformed.
        }
        if let Some(result) = result {
            if !from_leader {
                return; // Results come from the shard's leader only.
            }
            if let Some(flight) = self.requests.get_mut(&id) {
                if !flight.shards.contains(&shard) {
                    return; // Not a participant (found by fuzzing): no honest leader says so.
                }
                if flight.results.get(&shard).is_none_or(|&(had, _)| had <= ts) {
                    flight.results.insert(shard, (ts, result));
                }
            }
        }
        if let Some(decided) = self.tracker.on_fast(from, txn, shard, ts, hash) {
            if self.variant.every_replica() {
                self.on_decided(decided, out);
            } else {
                // Every leader answered at the agreed timestamp: committed once each
                // participant's watermark covers it.
                self.awaiting.insert(txn, decided);
                self.commit_covered(out);
            }
        }
    }

    /// Luigi coordinator: `shard`'s leader says this node's watermark there is `ts`.
    pub(super) fn on_watermark(
        &mut self,
        from: NodeId,
        shard: ShardId,
        ts: Timestamp,
        out: &mut Outbox<TigaMsg>,
    ) {
        if self.variant.every_replica() || !self.is_leader_node(shard, from) {
            self.counts.dropped_total += 1;
            return;
        }
        let mark = self.watermarks.entry(shard).or_insert(Timestamp::ZERO);
        if ts > *mark {
            *mark = ts;
            self.commit_covered(out);
        }
    }

    /// Luigi coordinator: commits every answered transaction that every participant's
    /// watermark covers. Bounded by the transactions in flight.
    pub(super) fn commit_covered(&mut self, out: &mut Outbox<TigaMsg>) {
        let covered: Vec<Committed> =
            self.awaiting.values().filter(|d| self.covered(d)).copied().collect();
        for decided in covered {
            self.awaiting.remove(&decided.txn);
            self.on_decided(decided, out);
        }
    }

    /// True when every participant of `decided` answered and its watermark here covers the
    /// agreed timestamp (or the transaction is gone: answered otherwise, dropped then).
    pub(super) fn covered(&self, decided: &Committed) -> bool {
        let flight = self.by_txn.get(&decided.txn).and_then(|id| self.requests.get(id));
        let Some(flight) = flight else { return true };
        flight.shards.iter().all(|shard| {
            let answered = flight.results.contains_key(shard);
            answered && self.watermarks.get(shard).is_some_and(|&mark| mark >= decided.ts)
        })
    }
}
