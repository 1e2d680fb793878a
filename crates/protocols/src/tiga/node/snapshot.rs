//! Snapshot reads (`tiga-snapshot-reads=on`): a read-only transaction is served at a closed
//! timestamp by the closest replica of each shard, without entering any log. Serializable,
//! not strict: the closed timestamp may trail the latest commit.

use super::*;

impl TigaNode {
    /// Starts a snapshot read: a timestamp a little behind this coordinator's clock (two
    /// paces, so that the followers' closed timestamps have usually passed it), sent to the
    /// closest replica of each participant shard.
    pub(super) fn start_snapshot(
        &mut self,
        now: Time,
        client: ClientRequest,
        shape: &Shape,
        home: ShardId,
        out: &mut Outbox<TigaMsg>,
    ) {
        let id = client.id;
        if self.requests.len() >= self.context.limits.requests_in_flight_max {
            let why = "as many transactions in flight as this coordinator runs";
            return out.reply(id, TxnOutcome::failed(TxnFailure::Rejected(why.into())));
        }
        let txn = self.ids.next_id();
        let shards = shape.shards();
        let mut to = Vec::with_capacity(shards.len());
        let topology = self.context.topology.clone();
        let here = topology.region_of(self.context.id);
        for &shard in &shards {
            // By delay estimate (replies carry samples); before any, a replica in this
            // region first.
            let closest = topology
                .shard_nodes(shard)
                .into_iter()
                .min_by_key(|&n| (self.tracker.estimate_ns(n), topology.region_of(n) != here, n.0));
            to.extend(closest);
        }
        // Never 0: the initial load sits there, and nothing is ever closed below it.
        let ts = Timestamp(now.saturating_sub(2 * self.pace_ns()).max(1));
        let decided_below = self.decided_below();
        let body =
            TxnBody { txn, ts, sent_at: now, request: client.txn.clone(), home, decided_below };
        self.timers.set(Purpose::Resend(id, txn), self.context.timing.rpc_timeout_ns, out);
        self.by_txn.insert(txn, id);
        let flight = InFlight {
            client,
            txn,
            body: body.clone(),
            snapshot: true,
            shards,
            to: to.clone(),
            results: BTreeMap::new(),
            pieces_total: shape.pieces_total,
            resends: 0,
        };
        self.requests.insert(id, flight);
        for node in to {
            self.send_snapshot_read(now, node, &body, out);
        }
    }

    /// Sends a snapshot read to `node` (handled at once when it is this node).
    pub(super) fn send_snapshot_read(
        &mut self,
        now: Time,
        node: NodeId,
        body: &TxnBody,
        out: &mut Outbox<TigaMsg>,
    ) {
        if node == self.context.id {
            self.on_snapshot_read(now, node, body.clone(), out);
        } else {
            out.send(node, TigaMsg::SnapRead(Box::new(body.clone())));
        }
    }

    /// A shard's answer to a snapshot read from one of its replicas.
    pub(super) fn on_snapshot_reply(
        &mut self,
        from: NodeId,
        (txn, shard, result): (TxnId, ShardId, ShardResult),
        out: &mut Outbox<TigaMsg>,
    ) {
        let Some(&id) = self.by_txn.get(&txn) else { return };
        let Some(flight) = self.requests.get_mut(&id) else { return };
        let replica = shard.0 < self.context.topology.shards
            && self.context.topology.shard_nodes(shard).contains(&from);
        if !flight.snapshot || !flight.shards.contains(&shard) || !replica {
            self.counts.dropped_total += 1;
            return;
        }
        flight.results.entry(shard).or_insert((flight.body.ts, result));
        if flight.shards.iter().all(|s| flight.results.contains_key(s)) {
            let ts = flight.body.ts;
            self.on_decided(Committed { txn, ts, fast: false }, out);
        }
    }

    /// A snapshot read from its coordinator: kept (bounded) until this replica's snapshot at
    /// its timestamp is closed, then answered.
    pub(super) fn on_snapshot_read(
        &mut self,
        now: Time,
        from: NodeId,
        body: TxnBody,
        out: &mut Outbox<TigaMsg>,
    ) {
        let Ok(shape) = shape_of(&self.context, &body.request, body.home) else {
            self.counts.dropped_total += 1;
            return;
        };
        // A timestamp past the clock by more than an RPC timeout would wait here for long
        // (skewed clocks, or a hostile sender): refused; the coordinator resends.
        let far = body.ts.0 > now.saturating_add(self.context.timing.rpc_timeout_ns);
        if !self.snapshot_reads || from != body.txn.origin || far {
            self.counts.dropped_total += 1;
            return;
        }
        let shards = shape.shards();
        let owd_ns = now.saturating_sub(body.sent_at);
        let body = Arc::new(body);
        let key = (body.ts, body.txn);
        for (&shard, part) in &shape.parts {
            let Some(host) = self.hosted.get_mut(&shard) else { continue };
            let read_only = part.writes.is_empty() && part.inputs.is_empty();
            if !read_only || host.snapshots.len() >= SNAPSHOTS_WAITING_MAX {
                self.counts.dropped_total += 1;
                continue;
            }
            let known = Known {
                body: body.clone(),
                owd_ns: Some(owd_ns),
                part: part.clone(),
                shards: shards.clone(),
            };
            host.snapshots.entry(key).or_insert(known);
        }
        self.serve_snapshots(now, out);
    }

    /// Answers the snapshot reads whose timestamp is closed here: at a leader, everything it
    /// released at or below it has run and it takes nothing new there (it promises so); at a
    /// follower, the leader said so and this replica executed the log that far.
    pub(super) fn serve_snapshots(&mut self, now: Time, out: &mut Outbox<TigaMsg>) {
        let me = self.context.id;
        let mut local = Vec::new();
        for host in self.hosted.values_mut() {
            if host.snapshots.is_empty() {
                continue;
            }
            let closed = if host.replica.leads() {
                leader_closed(host, now)
            } else {
                // The latest closed timestamp whose log this follower has executed; older
                // ones it supersedes go (the pairs come in order, log lengths growing).
                let executed = host.follow.executed;
                while host.follow.closed.get(1).is_some_and(|&(_, upto)| upto <= executed) {
                    host.follow.closed.pop_front();
                }
                match host.follow.closed.front() {
                    Some(&(ts, upto)) if upto <= executed => ts,
                    _ => continue,
                }
            };
            // Bounded by the waiting reads (at most SNAPSHOTS_WAITING_MAX).
            while let Some(entry) = host.snapshots.first_entry() {
                let (ts, txn) = *entry.key();
                if ts > closed {
                    break;
                }
                let known = entry.remove();
                if host.replica.leads() && ts > host.lead.promised {
                    host.lead.promised = ts;
                    self.journal.write(&Record::Promised { shard: host.shard, ts });
                }
                let (_, result) = run_part(&self.context, host.shard, &host.store, &known, ts, &[]);
                self.counts.snapshot_served_total += 1;
                let shard = host.shard;
                if txn.origin == me {
                    local.push((txn, shard, result));
                } else {
                    let owd_ns = known.owd_ns.unwrap_or(0);
                    out.send(
                        txn.origin,
                        TigaMsg::SnapReply { view: self.view.global, txn, shard, result, owd_ns },
                    );
                }
            }
        }
        for reply in local {
            self.on_snapshot_reply(me, reply, out);
        }
    }
}
