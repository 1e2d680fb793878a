//! The follower's part: taking the leader's log (entries, outcomes, commit-point), dropping
//! what it released that the leader's log will never list, and dropping its log to rejoin by a
//! state transfer when it falls too far behind.

use super::*;

/// What a replica keeps as a follower ([`Hosted::follow`]): how far it executed the leader's
/// log, the outcomes and outputs it heard or made, the leader's closed timestamps, the tail
/// it dropped, and a rejoin's state transfer. A follower promoted at a view change leads on
/// from what it executed here.
#[derive(Debug, Default)]
pub(super) struct FollowerState {
    /// Follower: the highest log base its leader sent: it drops no entry at or above it.
    pub(super) leader_base: usize,
    /// Synced entries executed here.
    pub(super) executed: usize,
    /// Final outcomes of multi-shard transactions heard from the leader, with the inputs
    /// their pieces take.
    pub(super) outcomes: BTreeMap<TxnId, (bool, Vec<(u32, PieceOutput)>)>,
    /// Tiga follower: per multi-shard entry it executed, the outputs of its pieces that
    /// other shards' pieces take (only where there are some), kept as long as its outcome: as
    /// a view change's new leader it answers the other leaders' votes with them.
    pub(super) fed: BTreeMap<TxnId, BTreeMap<ShardId, Vec<(u32, PieceOutput)>>>,
    /// Follower: the leader's closed timestamps with the log length each covers, oldest
    /// first (at most [`CLOSED_KEPT_MAX`]): a follower serves at the latest one whose log it
    /// executed, which may trail the latest heard while outcomes are awaited.
    pub(super) closed: VecDeque<(Timestamp, usize)>,
    /// Follower: the promise its tail was last cut at (see `drop_unlisted`).
    pub(super) tail_cut: Timestamp,
    /// Follower: transactions dropped from its tail whose bodies it keeps until their
    /// coordinators decided them (a restarted leader takes such a transaction again above its
    /// promise, and the log then lists it: the body spares a fetch). At most [`TAIL_MAX`].
    pub(super) unlisted: BTreeSet<TxnId>,
    /// Follower: it started without the shard's state and takes no part until the leader's
    /// transfer is in.
    pub(super) joining: Option<Joining>,
    /// Rejoined follower: entries past the transferred prefix that the leader had executed
    /// when it cut the image: applied (`None`: their writes came with it, skip them), or
    /// waiting for other shards' votes (their writes, to apply if the outcome is a yes).
    pub(super) ahead: BTreeMap<TxnId, Option<Overlay>>,
    /// Rejoined follower: the leader's log length when it cut the image; below it the store
    /// may hold versions above an entry still to execute (see [`debug_assert_newest`]).
    pub(super) rejoin_end: usize,
    /// Tiga follower: the shard's result of each entry it executed, until the entry's
    /// coordinator decided it (at most [`RESULTS_KEPT_MAX`]): promoted at a view change, it
    /// answers a coordinator still waiting on one as the leader would have.
    pub(super) results: BTreeMap<TxnId, (Timestamp, ShardResult)>,
}

impl TigaNode {
    pub(super) fn on_sync(
        &mut self,
        now: Time,
        from: NodeId,
        shard: ShardId,
        sync: SyncParts,
        out: &mut Outbox<TigaMsg>,
    ) {
        let (start, entries, outcomes, commit, base) = sync;
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        if host.replica.leads() || host.leader != from || host.follow.joining.is_some() {
            return;
        }
        // Messages may come out of order: the commit-point and the leader's base only rise.
        host.commit = host.commit.max(usize::try_from(commit).unwrap_or(usize::MAX));
        host.follow.leader_base =
            host.follow.leader_base.max(usize::try_from(base).unwrap_or(usize::MAX));
        if entries.len() > crate::tiga::log::SYNC_ENTRIES_MAX
            || outcomes.len() > OUTCOMES_WINDOW_MAX
        {
            return; // No honest leader sends more.
        }
        let Ok(start) = usize::try_from(start) else { return };
        // Bounded by the message: which of its entries the tail holds (journaled already).
        let in_tail: BTreeSet<TxnId> =
            entries.iter().map(|&(txn, _)| txn).filter(|&t| host.replica.in_tail(t)).collect();
        let before = host.replica.log_len();
        let bodies = &host.bodies;
        let keys_of = |txn| bodies.get(&txn).map(|k: &Known| k.part.log_keys());
        let actions = host.replica.on_sync(start, &entries, keys_of);
        let appended = host.replica.follower_entries(before, usize::MAX);
        // Bounded by the message; nearly always empty.
        let heard: Vec<TxnId> = appended
            .iter()
            .map(|&(t, _)| t)
            .filter(|t| host.follow.outcomes.contains_key(t))
            .collect();
        if !appended.is_empty() {
            // The entries this replica's acknowledgements and slow replies will vouch for,
            // with the bodies no record holds yet.
            let entries = appended
                .into_iter()
                .map(|(txn, ts)| {
                    let body = match in_tail.contains(&txn) {
                        true => None,
                        false => host.bodies.get(&txn).map(|k| (*k.body).clone()),
                    };
                    (txn, ts, body)
                })
                .collect();
            self.journal.write(&Record::Synced { shard, at: before as u64, entries });
            // An outcome heard before the leader listed its entry (a sync carries outcomes
            // past the entries it lists) is journaled again behind the listing: a checkpoint
            // since may have left it out, and a restart keeps outcomes of logged entries only.
            for txn in heard {
                if let Some((ok, inputs)) = host.follow.outcomes.get(&txn) {
                    let outcome = SyncOutcome { txn, ok: *ok, inputs: inputs.clone() };
                    self.journal.write(&Record::Outcome { shard, outcome });
                }
            }
        }
        for outcome in outcomes {
            // Kept for logged transactions only; an outcome of one executed already may come
            // again (a resend from a stale acknowledgement) and is pushed out first when the
            // map is full (the leader says again what is still needed).
            if host.replica.logged(outcome.txn) && outcome.inputs.len() <= PIECES_MAX {
                let SyncOutcome { txn, ok, ref inputs } = outcome;
                let fresh = host.follow.outcomes.get(&txn).is_none_or(|(was, _)| *was != ok);
                host.follow.outcomes.insert(txn, (ok, inputs.clone()));
                if fresh {
                    self.journal.write(&Record::Outcome { shard, outcome });
                }
                if host.follow.outcomes.len() > OUTCOMES_KEPT_MAX {
                    host.follow.outcomes.pop_first();
                }
            }
        }
        let fetching =
            actions.iter().any(|a| matches!(a, Action::Fetch { .. } | Action::Resend { .. }));
        self.act(now, shard, actions, None, out);
        self.drop_unlisted(shard, false);
        if !fetching {
            // Bodies asked for before and still missing are asked for again (the fetch or
            // its answer may have been lost).
            let host = self.hosted.get(&shard).expect("hosted");
            out.send(
                from,
                ack_msg(
                    (self.view.global, self.context.incarnation),
                    host,
                    host.replica.missing_bodies(FETCH_MAX),
                ),
            );
        }
    }

    /// Follower: the leader keeps nothing for followers below `upto`. A replica that executed
    /// less cannot go on from the log: it drops its log, held transactions and replies (a
    /// fresh one holds and vouches for nothing) and, under its next start, takes a state
    /// transfer as a restarted follower does. Its store stays: the transfer rewrites every key
    /// the leader wrote since the load, which covers every key this replica wrote.
    pub(super) fn on_behind(
        &mut self,
        from: NodeId,
        shard: ShardId,
        upto: u64,
        out: &mut Outbox<TigaMsg>,
    ) {
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        if host.replica.leads() || from != host.leader {
            self.counts.dropped_total += 1;
            return;
        }
        if host.follow.joining.is_some() {
            return; // Rejoining already.
        }
        if host.follow.executed as u64 >= upto {
            // Not behind: the leader had not heard how far this replica got (it sends no
            // log to a follower it thinks behind), so tell it.
            let view = (self.view.global, self.context.incarnation);
            out.send(host.leader, ack_msg(view, host, Vec::new()));
            return;
        }
        if self.drop_log_to_rejoin(shard, false, out) {
            self.counts.went_behind_total += 1;
        }
    }

    /// Follower: drops its log, held transactions, replies and what it kept of executed
    /// entries, and asks its leader for a state transfer under its next start (a fresh
    /// replica holds and vouches for nothing). Its store stays: the transfer rewrites every
    /// key the leader wrote since the load. With `stash` (a view change sends it to rejoin),
    /// what it dropped is kept until a transfer is installed, unless it was rejoining
    /// already. False (nothing done) when its starts ran out.
    pub(super) fn drop_log_to_rejoin(
        &mut self,
        shard: ShardId,
        stash: bool,
        out: &mut Outbox<TigaMsg>,
    ) -> bool {
        let detective = self.view.mode == Mode::Detective;
        let limits = replica_limits(self.context.topology.shards);
        let Some(host) = self.hosted.get_mut(&shard) else { return false };
        let Some(rejoins) = host.rejoins.checked_add(1) else { return false };
        host.rejoins = rejoins;
        let fresh = Replica::new(shard, false, limits).with_detective(detective);
        let mut dropped = Stashed::empty(fresh, host.follower_checkpointed);
        dropped.swap_with(host);
        // Kept with three replicas only: leading from it is sound there (see
        // `take_up_stash`); with more, a report would need to say which view its log was
        // led in.
        let three = self.context.topology.replicas == 3;
        if stash && three && host.follow.joining.is_none() && !host.retired {
            host.stashed = Some(Box::new(dropped));
        }
        host.follow.joining = Some(Joining::default());
        // A restart from here rejoins too: the journaled log is void.
        self.journal.write(&Record::Joining { shard });
        self.ask_state(shard, out);
        true
    }
    /// Tiga follower of `shard`: drops what it released itself at or below the latest
    /// closed timestamp its leader promised whose log its synced prefix covers. The leader
    /// lists every entry it will ever log at or below a promise within the log length it
    /// sent with it (anything arriving later is held above the promise), so such an entry is
    /// a copy the leader never took there: a coordinator that gave up or crashed before its
    /// leader's copy arrived. Kept, it would stay in this replica's key hashes for good, and
    /// every later fast reply on its keys would disagree with the leader's; and the tail
    /// would fill, after which this follower replies fast to nothing. Its body stays until
    /// the coordinator decided the transaction: the leader may still take it, above the
    /// promise (a restarted leader hearing a resend), and then its log lists it here.
    /// `sweep`: also let go of the bodies kept that are no longer needed (once per promise
    /// heard, not on every log message).
    pub(super) fn drop_unlisted(&mut self, shard: ShardId, sweep: bool) {
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        if host.replica.leads() || host.follow.joining.is_some() || !self.variant.every_replica() {
            return;
        }
        let synced = host.replica.log_len();
        // Promises grow with their log lengths: the latest one the prefix covers.
        let Some(&(through, _)) =
            host.follow.closed.iter().rev().find(|&&(_, upto)| upto <= synced)
        else {
            return;
        };
        // The tail is walked once per promise, not on every log message: what this follower
        // releases at or below a promise it cut at already goes at the next one.
        if through <= host.follow.tail_cut && !sweep {
            return;
        }
        host.follow.tail_cut = host.follow.tail_cut.max(through);
        let dropped = host.replica.drop_unlisted(through);
        if !dropped.is_empty() {
            self.journal.write(&Record::Unlisted { shard, through });
        }
        self.counts.tail_dropped_total += dropped.len() as u64;
        host.follow.unlisted.extend(dropped.into_iter().map(|(txn, _)| txn));
        if !sweep {
            return;
        }
        // Bounded by the set: listed since (its body is the log's now), or decided by its
        // coordinator and so never listed (nothing resends it), or past the bound (the log
        // fetches it should it list it after all).
        let floors = &self.decided_floors;
        let replica = &host.replica;
        let overflow = host.follow.unlisted.len().saturating_sub(TAIL_MAX);
        let mut gone = Vec::new();
        for (index, &txn) in host.follow.unlisted.iter().enumerate() {
            let listed = replica.logged(txn) || replica.wants_body(txn);
            if listed || index < overflow || is_decided(floors, txn) {
                gone.push((txn, listed));
            }
        }
        for (txn, listed) in gone {
            host.follow.unlisted.remove(&txn);
            if !listed && replica.held_at(txn).is_none() {
                host.bodies.remove(&txn);
            }
        }
    }
}
