//! A transaction's body arriving at a replica: checked against what the replica knows (its
//! view, the coordinator's decided floor, the sender's right to pass it on), derived into the
//! shard's part, and held for release.

use super::*;

impl TigaNode {
    /// A body arrived from `from`: its coordinator (tiga: to every replica; luigi: to the
    /// leaders), a peer leader answering a fetch, or this shard's leader (a follower's fetch;
    /// luigi: with its log). A body from anyone else is dropped (and counted): it would
    /// claim another coordinator's transaction, or plant a body under a real id. One piece:
    /// the checks (sender, view, decided floor, shard) run in order before anything is kept,
    /// and each later one relies on the earlier.
    pub(super) fn on_body(
        &mut self,
        now: Time,
        from: NodeId,
        body: TxnBody,
        out: &mut Outbox<TigaMsg>,
    ) {
        let Ok(shape) = shape_of(&self.context, &body.request, body.home) else {
            self.counts.dropped_total += 1;
            return; // Malformed: its coordinator would not have sent it.
        };
        let shards = shape.shards();
        // Luigi: a follower's leader relays the coordinator's body with its log, and with it
        // what the coordinator had decided when it sent it (the results kept for a view
        // change go by it).
        let me = self.context.id;
        let relayed = self.variant.leaders_only()
            && from != me
            && self.hosted.values().any(|h| h.leader == from);
        if from == body.txn.origin || relayed {
            for host in self.hosted.values_mut() {
                forget_decided_answers(host, body.txn, body.decided_below);
            }
            note_decided(&mut self.decided_floors, body.txn, body.decided_below);
        }
        let body = Arc::new(body);
        // A sample of the delay from the coordinator only where it sent this copy.
        let owd_ns = (from == body.txn.origin).then(|| now.saturating_sub(body.sent_at));
        let from_peer_leader = shards.iter().any(|&s| self.is_leader_node(s, from));
        let hosted_shards: Vec<ShardId> =
            shards.iter().copied().filter(|s| self.hosted.contains_key(s)).collect();
        let mut parts = shape.parts;
        for shard in hosted_shards {
            let part = parts.remove(&shard).expect("a participant");
            let coordinator = body.txn.origin;
            let host = self.hosted.get_mut(&shard).expect("filtered");
            let wanted =
                host.lead.recovering.as_ref().is_some_and(|r| r.wanted.contains(&body.txn));
            if wanted && (from == body.txn.origin || from_peer_leader) {
                // A new leader waits for this body to rebuild its log.
                let known = Known { body: body.clone(), owd_ns, part, shards: shards.clone() };
                self.take_wanted_body(now, shard, known, out);
                continue;
            }
            if host.follow.joining.is_some() || host.lead.recovering.is_some() {
                // Nothing is taken before the shard's state, or while its new leader gathers
                // the reports (the coordinator resends).
                continue;
            }
            let txn = body.txn;
            let trusted = if host.replica.leads() {
                from == coordinator || from_peer_leader
            } else {
                from == host.leader || (self.variant.every_replica() && from == coordinator)
            };
            if !trusted {
                self.counts.dropped_total += 1;
                continue;
            }
            if !host.replica.logged(txn)
                && !host.bodies.contains_key(&txn)
                && !host.replica.wants_body(txn)
                && is_decided(&self.decided_floors, txn)
            {
                // A late copy of a transaction its coordinator decided: a replica that has
                // dropped it from its log may no longer know it logged it, and must not take
                // it again (a follower's leader's log brings what it still needs). A leader
                // that never took it refuses it for good: another leader still holding it
                // hears so when it proposes ([`TigaMsg::Refused`]).
                self.counts.stale_bodies_total += 1;
                continue;
            }
            if host.replica.logged(txn) || host.bodies.contains_key(&txn) {
                // A resend: say again what was said (if anything yet), and for a follower
                // whose fetch this answers, take the body (only then: one that executed
                // and dropped it must not keep a copy again).
                let wanted = host.replica.wants_body(txn);
                if wanted && !host.bodies.contains_key(&txn) && host.bodies.len() < BODIES_MAX {
                    let keys = part.log_keys();
                    host.bodies.insert(
                        txn,
                        Known {
                            body: body.clone(),
                            owd_ns,
                            part: part.clone(),
                            shards: shards.clone(),
                        },
                    );
                    let actions = host.replica.on_body(txn, &keys);
                    let synced = actions.iter().any(|a| matches!(a, Action::SlowReply { .. }));
                    // A synced entry's body: journaled before the replies it lets go.
                    self.journal.write(&Record::Fetched { shard, body: (*body).clone() });
                    self.act(now, shard, actions, None, out);
                    if synced && self.variant.leaders_only() {
                        // A luigi leader counts replicas by their acknowledgements.
                        let host = &self.hosted[&shard];
                        out.send(
                            host.leader,
                            ack_msg((self.view.global, self.context.incarnation), host, Vec::new()),
                        );
                    }
                }
                let host = self.hosted.get_mut(&shard).expect("hosted");
                if let Some(answer) = host.answers.get(&txn) {
                    out.send(coordinator, refresh_owd(answer.clone(), owd_ns));
                }
                if let Some(streams) = &host.lead.streams {
                    // The coordinator may have missed its watermark too.
                    let ts = streams.watermark(coordinator);
                    out.send(coordinator, TigaMsg::Watermark { view: self.view.global, shard, ts });
                }
                if host.replica.leads() {
                    let actions = leader_arrive(host, incoming(txn, body.ts, &shards, &part));
                    self.act(now, shard, actions, None, out);
                }
                continue;
            }
            let no_stream =
                host.lead.streams.as_ref().is_some_and(|s| s.floor(coordinator).is_none());
            if host.bodies.len() >= BODIES_MAX || no_stream {
                // No room, or (luigi) a worker outside the cluster or with a full stream: the
                // body is not kept (the coordinator resends).
                self.counts.dropped_total += 1;
                continue;
            }
            if self.variant.leaders_only() && !host.replica.leads() {
                // A luigi follower executes what its leader's log lists, nothing else.
                let known = Known { body: body.clone(), owd_ns, part, shards: shards.clone() };
                host.bodies.insert(txn, known);
                continue;
            }
            let incoming = incoming(txn, body.ts, &shards, &part);
            host.bodies
                .insert(txn, Known { body: body.clone(), owd_ns, part, shards: shards.clone() });
            let actions = if host.replica.leads() {
                leader_arrive(host, incoming)
            } else {
                host.replica.arrive(incoming)
            };
            self.act(now, shard, actions, None, out);
        }
        self.release(now, out);
    }
}
