//! Pacing: the periodic step of a leading node. For each shard it leads, `pace` resends the
//! votes other leaders still miss, repeats its open agreements, syncs followers that fell
//! behind, prunes the bodies every replica executed, promises closed timestamps and forgets
//! decided multi-shard transactions; then it executes what became ready. (Coordinator
//! resends, the view manager's heartbeats and state-transfer requests run on timers of their
//! own.)

use super::*;

impl TigaNode {
    pub(super) fn pace_ns(&self) -> u64 {
        (self.context.timing.rpc_timeout_ns / 8).max(meridian_core::time::NS_PER_MS)
    }

    pub(super) fn pace(&mut self, now: Time, out: &mut Outbox<TigaMsg>) {
        for index in 0..self.hosted_shards.len() {
            let shard = self.hosted_shards[index];
            let host = self.hosted.get_mut(&shard).expect("hosted");
            self.counts.bodies_high = self.counts.bodies_high.max(host.bodies.len() as u64);
            if !host.replica.leads() {
                continue;
            }
            // Votes still missing.
            let mut votes = Vec::new();
            for (&txn, pending) in &host.lead.pending {
                for &peer in pending.others.iter().filter(|p| !pending.votes.contains_key(p)) {
                    votes.push((peer, vote_msg(self.view.global, txn, shard, peer, pending, true)));
                }
            }
            for (peer, msg) in votes {
                if let Some(node) = leader_node(&self.context, &self.view, peer) {
                    if node != self.context.id {
                        out.send(node, msg);
                    }
                }
            }
            // A new leader's entries run again: the votes it needs are asked for again.
            if !host.lead.asking.is_empty() {
                self.ask_votes(shard, out);
            }
            let host = self.hosted.get_mut(&shard).expect("hosted");
            // Agreements this leader proposed in and still waits on.
            let actions = host.replica.repeat_open(AGREEMENTS_REPEATED_MAX);
            self.act(now, shard, actions, None, out);
            let lagging = {
                let host = &self.hosted[&shard];
                let log_len = host.replica.log_len();
                host.lead.acks.values().any(|&(s, e)| s < log_len || e < log_len)
            };
            if lagging {
                self.sync_followers(shard, true, out);
            }
            // With every follower silent no acknowledgement prunes: the lag limit still does.
            let host = self.hosted.get_mut(&shard).expect("hosted");
            prune_bodies(host, &self.context.limits);
            self.close_for_followers(now, shard, out);
            self.close_for_peers(now, shard, out);
            let covered = self.peers_promised(shard);
            let host = self.hosted.get_mut(&shard).expect("hosted");
            forget_decided(
                host,
                &self.decided_floors,
                covered,
                self.context.limits.forgettable_max,
            );
        }
        self.execute_all(now, out);
    }
}
