//! The leader's part: carrying out its replica's actions, agreeing on multi-shard timestamps
//! with the other participant leaders (proposals, confirmations, refusals), syncing its log to
//! the followers and taking their acknowledgements, and promising closed timestamps.

use super::*;

/// What a replica keeps as its shard's leader ([`Hosted::lead`]): its queues of released,
/// pending and decided transactions, its agreements with the other leaders, what it sent to
/// and heard from each follower, its promises, its state transfers, its journal's checkpoint
/// position and, as a new leader, the reports it gathers. Empty while the replica follows
/// (a follower promoted at a view change fills it afresh: `view_change`'s `lead_afresh`).
#[derive(Debug, Default)]
pub(super) struct LeaderState {
    /// Released transactions not executed yet (and, in detective mode, due ones to run
    /// speculatively).
    pub(super) queued: BTreeMap<TxnId, Queued>,
    /// Detective mode: what ran speculatively, by transaction.
    pub(super) speculations: BTreeMap<TxnId, Speculation>,
    /// Which of them may execute now.
    pub(super) waits: Waits,
    /// Pending transactions whose votes are all in.
    pub(super) complete: BTreeSet<TxnId>,
    pub(super) pending: BTreeMap<TxnId, Pending>,
    pub(super) early_votes: BTreeMap<TxnId, BTreeMap<ShardId, PeerVote>>,
    /// Multi-shard transactions decided here.
    pub(super) decided: BTreeMap<TxnId, Decided>,
    /// The settled ones, by timestamp: each goes once every other shard's leader promised a
    /// closed timestamp at or above it.
    pub(super) settling: BTreeSet<(Timestamp, TxnId)>,
    /// Decided since the last sync went out.
    pub(super) fresh_outcomes: Vec<SyncOutcome>,
    /// Per follower node: its sync-point and executed count, as acknowledged.
    pub(super) acks: BTreeMap<NodeId, (usize, usize)>,
    /// Per follower node: the next log position to send.
    pub(super) sent_to: BTreeMap<NodeId, usize>,
    /// Luigi, per follower node: the log position from which bodies have not gone out yet
    /// (each body goes once; a lost one is fetched).
    pub(super) bodies_to: BTreeMap<NodeId, usize>,
    /// Bodies below this log position were dropped (every follower executed them).
    pub(super) pruned: usize,
    /// The followers' nodes (leaders only).
    pub(super) followers: Vec<NodeId>,
    /// `luigi` leaders: the per-worker watermarks ([`Variant::watermarks`]).
    pub(super) streams: Option<Box<dyn Watermarks>>,
    /// `luigi` leaders: log positions below this are replicated to a majority (and told to
    /// the streams).
    pub(super) replicated: usize,
    /// Leader: the closed timestamp promised (to a read or to the followers): arrivals at or
    /// below it are held above it.
    pub(super) promised: Timestamp,
    /// Leader: the closed timestamp last sent to the followers.
    pub(super) closed_sent: Timestamp,
    /// Leader: log positions below this are executed and decided (applied or dropped).
    pub(super) finished: usize,
    /// Leader: state transfers under way, per follower node.
    pub(super) transfers: BTreeMap<NodeId, Transfer>,
    /// Leader: per follower node, the latest start of it that installed a transfer.
    pub(super) joined: BTreeMap<NodeId, Start>,
    /// Transactions whose proposal is journaled and which are not logged yet, with the
    /// timestamp proposed (a checkpoint writes them again).
    pub(super) journaled: BTreeMap<TxnId, Timestamp>,
    /// Leader: the log position of the last checkpoint (see [`checkpoint_records`]).
    pub(super) checkpointed: usize,
    /// Leader: transactions below the log's base still known as logged, at their
    /// timestamps, to forget once their coordinators decided them and every other shard's
    /// leader promised past them (at most [`crate::Limits::forgettable_max`]; past it, they
    /// stay known until there is room again: memory, never safety).
    pub(super) forgettable: BTreeSet<(Timestamp, TxnId)>,
    /// Leader: some transaction went below the log's base while `forgettable` was full: once
    /// it has room again it is filled from the logged set.
    pub(super) forgettable_overflowed: bool,
    /// New leader: the reports gathered so far.
    pub(super) recovering: Option<Recovering>,
    /// New leader: multi-shard entries it runs again without an outcome, whose votes it asks
    /// the other leaders for until it has run them ([`TigaMsg::AskVote`]).
    pub(super) asking: BTreeSet<TxnId>,
}

impl TigaNode {
    /// Leader: moves the promised closed timestamp up to what is closed now and tells the
    /// followers, with the log length that covers it: they serve snapshot reads at it, and
    /// (tiga) drop what they released at or below it that the log does not list.
    pub(super) fn close_for_followers(
        &mut self,
        now: Time,
        shard: ShardId,
        out: &mut Outbox<TigaMsg>,
    ) {
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        let wanted = self.snapshot_reads || self.variant.every_replica();
        if !wanted || !host.replica.leads() || host.lead.followers.is_empty() {
            return;
        }
        self.promise_closed(now, shard);
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        if host.lead.promised > host.lead.closed_sent {
            host.lead.closed_sent = host.lead.promised;
            let upto = host.replica.log_len() as u64;
            for &follower in &host.lead.followers {
                out.send(
                    follower,
                    TigaMsg::Closed { view: self.view.global, shard, ts: host.lead.promised, upto },
                );
            }
        }
    }

    /// Leader: raises the closed timestamp it promises (journaled before anything that
    /// follows from it goes out) to what is closed here, at most a pace back: reads ask for
    /// two paces back, and promising more would bump late arrivals for nothing.
    pub(super) fn promise_closed(&mut self, now: Time, shard: ShardId) {
        let cap = Timestamp(now.saturating_sub(self.pace_ns()));
        let Some(host) = self.hosted.get_mut(&shard).filter(|h| h.replica.leads()) else {
            return;
        };
        let promised = host.lead.promised.max(leader_closed(host, now).min(cap));
        if promised > host.lead.promised {
            host.lead.promised = promised;
            self.journal.write(&Record::Promised { shard, ts: promised });
        }
    }

    /// Leader (of a cluster of several shards): promises a closed timestamp and tells the
    /// other shards' leaders, then drops the settled outcome records every other leader's
    /// promise covers ([`TigaMsg::PeerClosed`]).
    pub(super) fn close_for_peers(&mut self, now: Time, shard: ShardId, out: &mut Outbox<TigaMsg>) {
        let shards = self.context.topology.shards;
        if shards < 2 || !self.hosted.get(&shard).is_some_and(|h| h.replica.leads()) {
            return;
        }
        self.promise_closed(now, shard);
        let promised = self.hosted[&shard].lead.promised;
        self.peer_closed.insert(shard, promised);
        let me = self.context.id;
        // Bounded by the cluster's shards.
        for peer in (0..shards).map(ShardId).filter(|&s| s != shard) {
            let Some(node) = leader_node(&self.context, &self.view, peer) else { continue };
            if node != me {
                let msg = TigaMsg::PeerClosed { view: self.view.global, shard, ts: promised };
                out.send(node, msg);
            }
        }
        let covered = self.peers_promised(shard);
        let host = self.hosted.get_mut(&shard).expect("led here");
        // Bounded by the records settled.
        while let Some(&(ts, txn)) = host.lead.settling.first() {
            if ts > covered {
                break;
            }
            host.lead.settling.pop_first();
            host.lead.decided.remove(&txn);
        }
    }

    /// The least closed timestamp the other shards' leaders promised this leader of `shard`
    /// (each finished every transaction at or below it); the end of time in a cluster of one
    /// shard.
    pub(super) fn peers_promised(&self, shard: ShardId) -> Timestamp {
        // Bounded by the cluster's shards.
        (0..self.context.topology.shards)
            .map(ShardId)
            .filter(|&s| s != shard)
            .map(|s| self.peer_closed.get(&s).copied().unwrap_or(Timestamp::ZERO))
            .min()
            .unwrap_or(Timestamp::MAX)
    }

    /// Carries out a replica's actions. `peer`: set when they answer another leader's
    /// proposal or confirmation. One piece: one match over the replica's action kinds, each
    /// arm short; splitting it would only scatter the dispatch.
    pub(super) fn act(
        &mut self,
        now: Time,
        shard: ShardId,
        actions: Vec<Action>,
        peer: Option<PeerCall<'_>>,
        out: &mut Outbox<TigaMsg>,
    ) {
        for action in actions {
            let Some(host) = self.hosted.get_mut(&shard) else { return };
            match action {
                Action::Propose { txn, ts, to } => {
                    // A leader's first proposal is its only one (peers keep the first they
                    // hear): journaled once, before it goes out.
                    if let Some(known) = host.bodies.get(&txn) {
                        let first = !host.lead.journaled.contains_key(&txn);
                        if host.replica.held_at(txn).is_some() && first {
                            host.lead.journaled.insert(txn, ts);
                            let body = (*known.body).clone();
                            self.journal.write(&Record::Proposed { shard, ts, body });
                        }
                    }
                    self.tell_leaders(now, shard, (txn, Some(ts)), to, peer, out);
                }
                Action::Confirm { txn, to } => {
                    self.tell_leaders(now, shard, (txn, None), to, peer, out);
                }
                Action::Execute { txn, ts } => {
                    let Some(known) = host.bodies.get(&txn) else {
                        debug_assert!(false, "{txn} released without its body");
                        continue;
                    };
                    host.lead.waits.enqueue((ts, txn), &known.part.reads, &known.part.writes);
                    if !host.quiet {
                        let body = (*known.body).clone();
                        self.journal.write(&Record::Logged { shard, ts, body });
                    }
                    host.lead.journaled.remove(&txn);
                    host.lead.queued.insert(txn, Queued { ts, hash: 0, speculative: false });
                }
                Action::Speculate { txn, ts, hash } => {
                    let Some(known) = host.bodies.get(&txn) else {
                        debug_assert!(false, "{txn} held without its body");
                        continue;
                    };
                    if !known.part.inputs.is_empty() {
                        // It takes other shards' outputs, which come with their votes, after
                        // the agreement: it runs once released.
                        continue;
                    }
                    host.lead.waits.enqueue((ts, txn), &known.part.reads, &known.part.writes);
                    host.lead.queued.insert(txn, Queued { ts, hash, speculative: true });
                }
                Action::Revoke { txn, ts } => {
                    let ran = host.lead.speculations.remove(&txn).is_some();
                    let waiting = host.lead.queued.get(&txn).is_some_and(|q| q.speculative);
                    if waiting {
                        host.lead.queued.remove(&txn);
                    }
                    if let (true, Some(known)) = (ran || waiting, host.bodies.get(&txn)) {
                        let part = &known.part;
                        host.lead.waits.withdraw((ts, txn), &part.reads, &part.writes);
                    }
                    if ran {
                        self.counts.revoked_total += 1;
                    }
                }
                Action::FastReply { txn, ts, hash } => {
                    if host.replica.leads() {
                        // Sent once the transaction has executed (with its result).
                        if let Some(queued) = host.lead.queued.get_mut(&txn) {
                            queued.hash = hash;
                        }
                        continue;
                    }
                    let Some(known) = host.bodies.get_mut(&txn) else { continue };
                    let owd_ns = known.owd_ns.take();
                    if !host.quiet {
                        // What this reply vouches for is durable before it goes.
                        let body = (*known.body).clone();
                        self.journal.write(&Record::Released { shard, ts, hash: Some(hash), body });
                    }
                    let msg = TigaMsg::Fast {
                        view: self.view.global,
                        txn,
                        shard,
                        ts,
                        hash,
                        owd_ns,
                        result: None,
                    };
                    reply(host, txn, msg, out);
                }
                Action::SlowReply { .. } if self.variant.leaders_only() => {
                    // Luigi followers answer their leader only (acknowledgements).
                }
                Action::SlowReply { txn, ts } => {
                    let msg = slow_reply(self.view.global, host, txn, ts);
                    reply(host, txn, msg, out);
                }
                Action::Superseded { dropped } => {
                    // As if dropped at a promise: the body stays until its coordinator
                    // decided it (see `drop_unlisted`). A restart drops them again, running
                    // the records of the entries that superseded them.
                    self.counts.tail_superseded_total += dropped.len() as u64;
                    host.follow.unlisted.extend(dropped.into_iter().map(|(txn, _)| txn));
                }
                Action::Fetch { txns } => {
                    let msg = TigaMsg::SyncAck {
                        view: self.view.global,
                        shard,
                        start: follower_start(self.context.incarnation, host),
                        synced: host.replica.sync_point() as u64,
                        executed: host.follow.executed as u64,
                        fetch: txns,
                    };
                    out.send(host.leader, msg);
                }
                Action::Resend { .. } => {
                    // The sync-point, not the listed prefix: the leader counts acknowledged
                    // positions as held here (luigi's watermarks), and entries past the
                    // sync-point may lack their bodies. Resending from there is harmless.
                    out.send(
                        host.leader,
                        ack_msg((self.view.global, self.context.incarnation), host, Vec::new()),
                    );
                }
            }
        }
        self.execute_all(now, out);
    }

    /// Sends `shard`'s proposal (`Some` timestamp) or confirmation for `txn` to the leaders of
    /// `to`. The participants come from the body, or from the peer's message for a
    /// transaction whose body is gone here.
    pub(super) fn tell_leaders(
        &mut self,
        now: Time,
        shard: ShardId,
        (txn, proposed): (TxnId, Option<Timestamp>),
        to: Vec<ShardId>,
        peer: Option<PeerCall<'_>>,
        out: &mut Outbox<TigaMsg>,
    ) {
        let known = self.hosted.get(&shard).and_then(|h| h.bodies.get(&txn)).map(|k| &k.shards);
        let Some(shards) = known.cloned().or_else(|| peer.map(|p| p.shards.to_vec())) else {
            return;
        };
        let answer = peer.is_some_and(|p| p.answer);
        for leader in to {
            let shards = shards.clone();
            let msg = match proposed {
                Some(ts) => TigaMsg::Propose {
                    view: self.view.global,
                    txn,
                    shards,
                    from: shard,
                    ts,
                    answer,
                },
                None => {
                    TigaMsg::Confirm { view: self.view.global, txn, shards, from: shard, answer }
                }
            };
            self.send_to_leader(now, leader, msg, out);
        }
    }

    /// Sends `msg` to the leader of `shard`; one for this very node (it leads both shards)
    /// is handled at once.
    pub(super) fn send_to_leader(
        &mut self,
        now: Time,
        shard: ShardId,
        msg: TigaMsg,
        out: &mut Outbox<TigaMsg>,
    ) {
        let Some(node) = self.leader_of(shard) else { return };
        if node == self.context.id {
            self.on_peer(now, node, msg, out);
        } else {
            out.send(node, msg);
        }
    }

    /// Leader: sends followers the log entries they have not been sent (or, when `again`,
    /// everything past what they acknowledged), with the outcomes they need.
    pub(super) fn sync_followers(
        &mut self,
        shard: ShardId,
        again: bool,
        out: &mut Outbox<TigaMsg>,
    ) {
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        if !host.replica.leads() {
            return;
        }
        let log_len = host.replica.log_len();
        let fresh = std::mem::take(&mut host.lead.fresh_outcomes);
        // With `f` above 1 a follower's own sync-point does not make an entry survive a view
        // change: it executes up to the commit-point, which the leader tells it.
        let f = slow_followers(self.context.topology.replicas);
        let commit = commit_point(host, self.context.topology.replicas);
        let news = f > 1 && commit > host.commit;
        for &follower in &host.lead.followers {
            let (synced, executed) = host.lead.acks[&follower];
            if executed < host.lead.pruned {
                // What it would execute next is gone here (bodies, and the inputs of the
                // outcomes): nothing from the log, only word to take a state transfer, once a
                // pace.
                if again {
                    out.send(follower, behind_msg(self.view.global, host));
                    self.counts.behind_total += 1;
                }
                continue;
            }
            let behind = f > 1 && again && executed < commit.min(synced);
            // Never from below the log's base: the follower holds what lies below (it executed
            // past the base), and a stale acknowledgement must not make the leader send
            // nothing for good (swarm seeds 892 and 480223 of `tpcc`).
            let next = if again { synced } else { host.lead.sent_to[&follower] };
            let next = next.max(host.replica.log_base());
            let mut outcomes = if again { window_outcomes(host, executed) } else { fresh.clone() };
            outcomes.truncate(OUTCOMES_WINDOW_MAX);
            // What does not fit goes with a later resend (the follower waits for it).
            let mut bytes = 0usize;
            let fit = outcomes
                .iter()
                .take_while(|o| {
                    bytes += outputs_bytes(&o.inputs);
                    bytes <= SYNC_INPUT_BYTES_MAX
                })
                .count();
            outcomes.truncate(fit.max(1));
            let entries = host.replica.log_since(next).to_vec();
            if entries.is_empty() && outcomes.is_empty() && !news && !behind {
                continue;
            }
            if host.lead.streams.is_some() {
                // Luigi: the coordinator sent the leader alone; the bodies go with the log,
                // once each (a lost one is fetched).
                let first = host.lead.bodies_to[&follower];
                let fresh = entries.iter().enumerate().filter(|(i, _)| next + i >= first);
                for (_, (txn, _)) in fresh {
                    if let Some(known) = host.bodies.get(txn) {
                        out.send(follower, TigaMsg::Txn(Box::new((*known.body).clone())));
                    }
                }
                host.lead.bodies_to.insert(follower, first.max(next + entries.len()));
            }
            let sent_end = next + entries.len();
            host.lead
                .sent_to
                .insert(follower, sent_end.max(host.lead.sent_to[&follower]).min(log_len));
            let msg = TigaMsg::Sync {
                view: self.view.global,
                shard,
                from: next as u64,
                entries,
                outcomes,
                commit: commit as u64,
                base: host.replica.log_base() as u64,
            };
            out.send(follower, msg);
        }
        host.commit = commit;
    }

    pub(super) fn on_peer(
        &mut self,
        now: Time,
        from: NodeId,
        msg: TigaMsg,
        out: &mut Outbox<TigaMsg>,
    ) {
        match msg {
            TigaMsg::Propose { txn, shards, from: peer, ts, answer, .. } => {
                self.on_agreement(now, from, (txn, peer, Some(ts)), &shards, answer, out);
            }
            TigaMsg::Confirm { txn, shards, from: peer, answer, .. } => {
                self.on_agreement(now, from, (txn, peer, None), &shards, answer, out);
            }
            TigaMsg::Vote { txn, from: peer, to, ok, outputs, want_reply, .. } => {
                if !self.is_leader_node(peer, from) || outputs.len() > PIECES_MAX {
                    return;
                }
                let Some(host) = self.hosted.get_mut(&to) else { return };
                if !host.replica.leads() {
                    return;
                }
                if let Some(decided) = host.lead.decided.get(&txn) {
                    if want_reply {
                        // With the outputs its pieces take from here (a new leader there runs
                        // the transaction again after a view change).
                        let outputs = decided.feeds.get(&peer).cloned().unwrap_or_default();
                        let ok = decided.own;
                        let reply = TigaMsg::Vote {
                            view: self.view.global,
                            txn,
                            from: to,
                            to: peer,
                            ok,
                            outputs,
                            want_reply: false,
                        };
                        out.send(from, reply);
                    }
                    return;
                }
                // A restarted leader must hear the same votes, with the same outputs, to reach
                // the same outcomes: journaled before anything that follows from them is sent.
                let mut journal_vote = |outputs: &Vec<(u32, PieceOutput)>| {
                    let outputs = outputs.clone();
                    self.journal.write(&Record::Vote { shard: to, txn, from: peer, ok, outputs });
                };
                if finished_here(host, txn) {
                    // Finished, its record dropped: every other leader promised a closed
                    // timestamp above it, so this is a late copy (its sender has the vote).
                    return;
                }
                let known = host.replica.logged(txn) || host.bodies.contains_key(&txn);
                if !known && is_decided(&self.decided_floors, txn) {
                    // Finished and forgotten here, or refused: a late copy (a leader that
                    // voted had this one's proposal, so it took the transaction).
                    self.counts.stale_votes_total += 1;
                    return;
                }
                if let Some(pending) = host.lead.pending.get(&txn) {
                    if want_reply {
                        // The sender lacks this shard's vote (the first copy was lost).
                        let reply = vote_msg(self.view.global, txn, to, peer, pending, false);
                        out.send(from, reply);
                    }
                    if !pending.votes.contains_key(&peer) {
                        journal_vote(&outputs);
                    }
                    record_vote(host, txn, peer, ok);
                } else if host.lead.early_votes.len() < EARLY_VOTES_MAX
                    || host.lead.early_votes.contains_key(&txn)
                    || host.bodies.contains_key(&txn)
                {
                    // Beyond the cap only for transactions known here (bodies are bounded):
                    // one that waits for the outputs this vote carries must get them.
                    if !host.lead.early_votes.get(&txn).is_some_and(|v| v.contains_key(&peer)) {
                        journal_vote(&outputs);
                    }
                    deliver_vote(host, txn, peer, PeerVote { ok, outputs });
                }
                self.execute_all(now, out);
            }
            TigaMsg::AskVote { txn, from: peer, to, .. } => {
                if !self.is_leader_node(peer, from) {
                    self.counts.dropped_total += 1;
                    return;
                }
                let Some(host) = self.hosted.get(&to).filter(|h| h.replica.leads()) else { return };
                let view = self.view.global;
                let reply = if let Some(decided) = host.lead.decided.get(&txn) {
                    let outputs = decided.feeds.get(&peer).cloned().unwrap_or_default();
                    let ok = decided.own;
                    TigaMsg::Vote { view, txn, from: to, to: peer, ok, outputs, want_reply: false }
                } else if let Some(pending) = host.lead.pending.get(&txn) {
                    vote_msg(view, txn, to, peer, pending, false)
                } else {
                    return; // Not run here yet: its vote goes out when it runs.
                };
                out.send(from, reply);
            }
            TigaMsg::Refused { txn, from: peer, to, .. } => {
                if !self.is_leader_node(peer, from) {
                    self.counts.dropped_total += 1;
                    return;
                }
                self.on_refused(now, txn, peer, to, out);
            }
            TigaMsg::GetBody { txn, .. } => {
                let body =
                    self.hosted.values().find_map(|h| h.bodies.get(&txn)).map(|k| k.body.clone());
                if let Some(body) = body {
                    out.send(from, TigaMsg::Txn(Box::new((*body).clone())));
                }
            }
            _ => {}
        }
    }

    /// Another leader's proposal (`Some` timestamp) or confirmation for `txn`, from its shard
    /// `peer`. `answer`: the sender had released `txn` and answers ours; a leader that
    /// released it too does not answer back.
    pub(super) fn on_agreement(
        &mut self,
        now: Time,
        from: NodeId,
        (txn, peer, proposed): (TxnId, ShardId, Option<Timestamp>),
        shards: &[ShardId],
        answer: bool,
        out: &mut Outbox<TigaMsg>,
    ) {
        if !self.is_leader_node(peer, from) {
            return;
        }
        let here: Vec<ShardId> =
            shards.iter().copied().filter(|s| self.hosted.contains_key(s)).collect();
        for shard in here {
            let host = self.hosted.get_mut(&shard).expect("hosted");
            if !host.replica.leads() {
                continue;
            }
            let logged = host.replica.logged(txn);
            if logged && answer {
                continue;
            }
            if !logged && !host.bodies.contains_key(&txn) && is_decided(&self.decided_floors, txn) {
                // Its coordinator decided it and this leader holds no copy: it never took it
                // (and refuses every copy from now on), or took it, finished it and forgot
                // it (then every other leader finished it too and ignores this). Either way
                // nothing is opened or fetched for it, and a proposer still holding it
                // drops it.
                host.replica.forget(txn);
                if proposed.is_some() {
                    self.counts.refused_sent_total += 1;
                    let view = self.view.global;
                    out.send(from, TigaMsg::Refused { view, txn, from: shard, to: peer });
                }
                continue;
            }
            let actions = match proposed {
                Some(ts) => {
                    let unknown = !host.bodies.contains_key(&txn) && !logged;
                    let mut actions = host.replica.on_proposal(peer, txn, shards, ts);
                    if unknown {
                        let after = self.pace_ns();
                        self.timers.set(Purpose::FetchBody(shard, txn, from), after, out);
                    } else if !logged && host.replica.held_at(txn).is_none() {
                        // Its arrival was refused here (a full queue or stream, no room to
                        // agree) while another leader holds it and keeps proposing: take it
                        // now, or that leader (and, in luigi, its worker's watermark) waits
                        // for good once the coordinator stops resending.
                        let known = &host.bodies[&txn];
                        let again = incoming(txn, known.body.ts, &known.shards, &known.part);
                        actions.extend(leader_arrive(host, again));
                    }
                    actions
                }
                None => host.replica.on_confirm(peer, txn, shards),
            };
            let call = PeerCall { shards, answer: logged };
            self.act(now, shard, actions, Some(call), out);
        }
        self.release(now, out);
    }

    /// The leader of `peer` refused `txn`, which this leader of `shard` proposed: if it holds
    /// it still (not released; no leader can release it now), it drops it, and its journal
    /// says so.
    pub(super) fn on_refused(
        &mut self,
        now: Time,
        txn: TxnId,
        peer: ShardId,
        shard: ShardId,
        out: &mut Outbox<TigaMsg>,
    ) {
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        if !host.replica.leads() {
            return;
        }
        let Some(actions) = host.replica.refused(peer, txn) else { return };
        // A speculative run is revoked while its body is still here.
        self.act(now, shard, actions, None, out);
        let host = self.hosted.get_mut(&shard).expect("hosted");
        host.bodies.remove(&txn);
        host.lead.early_votes.remove(&txn);
        if let Some(streams) = &mut host.lead.streams {
            streams.dropped(txn);
        }
        if host.lead.journaled.remove(&txn).is_some() {
            self.journal.write(&Record::Withdrawn { shard, txn });
        }
        self.counts.refused_total += 1;
        self.release(now, out);
    }

    /// True when `node` leads `shard` in the current view.
    pub(super) fn is_leader_node(&self, shard: ShardId, node: NodeId) -> bool {
        shard.0 < self.context.topology.shards && self.leader_of(shard) == Some(node)
    }

    /// Luigi leader: tells the streams which log entries a majority of the shard's replicas
    /// now holds (the leader's own log and its followers' acknowledged sync-points), and
    /// sends each worker whose watermark rose its new watermark.
    pub(super) fn advance_replicated(&mut self, shard: ShardId, out: &mut Outbox<TigaMsg>) {
        let me = self.context.id;
        let replicas = self.context.topology.replicas;
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        let Some(streams) = &mut host.lead.streams else { return };
        let mut points: Vec<usize> = host.lead.acks.values().map(|&(synced, _)| synced).collect();
        points.push(host.replica.log_len());
        let point = crate::tiga::log::commit_point(&points, replicas);
        // Bounded by the log (a window of SYNC_ENTRIES_MAX entries per round).
        while host.lead.replicated < point {
            let window = host.replica.log_since(host.lead.replicated);
            let take = window.len().min(point - host.lead.replicated);
            debug_assert!(take > 0, "the log holds the commit-point's entries");
            if take == 0 {
                break;
            }
            for &(txn, ts) in &window[..take] {
                streams.replicated(txn, ts);
            }
            host.lead.replicated += take;
        }
        let raised = streams.take_raised();
        // A restarted leader holds new transactions above what it told (and tells nothing
        // lower): written before the watermarks go out.
        for &(worker, ts) in &raised {
            self.journal.write(&Record::Told { shard, worker, ts });
        }
        for (worker, ts) in raised {
            if worker == me {
                self.on_watermark(me, shard, ts, out);
            } else {
                out.send(worker, TigaMsg::Watermark { view: self.view.global, shard, ts });
            }
        }
    }

    pub(super) fn on_sync_ack(
        &mut self,
        from: NodeId,
        (shard, start): (ShardId, Start),
        synced: u64,
        executed: u64,
        fetch: Vec<TxnId>,
        out: &mut Outbox<TigaMsg>,
    ) {
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        // A late acknowledgement of a follower's earlier start speaks of a log it no longer
        // holds; one of the start being sent a transfer says the image is installed.
        if let Some(transfer) = host.lead.transfers.get(&from) {
            if start < transfer.start {
                return;
            }
            // The start being sent a transfer installed it; a later start restarted from its
            // journal and needs none.
            host.lead.transfers.remove(&from);
            host.lead.joined.insert(from, start);
        } else if host.lead.joined.get(&from).is_some_and(|&joined| start < joined) {
            return;
        }
        let Some(ack) = host.lead.acks.get_mut(&from) else { return };
        let log_len = host.replica.log_len();
        let (synced, executed) =
            (synced.min(log_len as u64) as usize, executed.min(log_len as u64) as usize);
        // Acknowledgements may arrive out of order; a resend request moves `sent_to` back.
        ack.0 = synced;
        ack.1 = ack.1.max(executed);
        if ack.1 < host.lead.pruned {
            // The follower trailed by more than the leader keeps bodies for: what it would
            // execute next is gone here. It takes a state transfer instead.
            out.send(from, behind_msg(self.view.global, host));
            self.counts.behind_total += 1;
            return;
        }
        if synced < host.lead.sent_to[&from] && fetch.is_empty() && synced < log_len {
            host.lead.sent_to.insert(from, synced);
        } else if synced > host.lead.sent_to[&from] {
            // A leader that restarted knows nothing sent: the log goes on from what the
            // follower holds, not from the start.
            host.lead.sent_to.insert(from, synced);
        }
        for txn in fetch.into_iter().take(crate::tiga::log::SYNC_ENTRIES_MAX) {
            if let Some(known) = host.bodies.get(&txn) {
                out.send(from, TigaMsg::Txn(Box::new((*known.body).clone())));
            }
        }
        prune_bodies(host, &self.context.limits);
        // With `f` above 1 followers execute only below the commit-point: tell them as soon
        // as an acknowledgement moves it, not at the next release or pace.
        let replicas = self.context.topology.replicas;
        if slow_followers(self.context.topology.replicas) > 1
            && commit_point(host, replicas) > host.commit
        {
            self.sync_followers(shard, false, out);
        }
        self.advance_replicated(shard, out);
    }
}
