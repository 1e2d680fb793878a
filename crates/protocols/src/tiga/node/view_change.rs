//! A view change at one node (Tiga §4, App. B), started by the view manager's word
//! ([`TigaNode::install_view`]).
//!
//! The node takes the new global view number at once, so every message of the old view is
//! dropped from then on (leaders' logs, agreements and replies of one view mean nothing in
//! the next). Its coordinator forgets the replies it collected (a commit counts replies of one
//! view only) and resends as usual. Then, per shard it hosts:
//!
//! - **Same leader** (told by the shard's local view number: a node that missed views may
//!   find the same node leading after others led in between, which is a change of leader;
//!   the leader then retires and waits as a deposed leader chosen again, below). Nothing
//!   else changes: the leader's log stands, its followers and the
//!   other leaders hear it again in the new view (everything it sends is repeated until
//!   acknowledged), and the replies its replicas kept to answer resends are answered in the
//!   new view (they speak of the same leader's log). Its agreements with a shard whose leader
//!   changed start again in the new view ([`Replica::restart_agreements`]).
//! - **This node leads now.** A replica still rejoining by a state transfer holds no log to
//!   lead with: it stays rejoining and tells the view manager, which moves the shard on;
//!   unless a view change sent it to rejoin and no transfer was installed since, in which
//!   case it takes up again the follower state it dropped then (kept for this,
//!   `Hosted::stashed`; its store is untouched until a transfer is installed) and leads as
//!   a follower chosen to lead does. The manager picks such a replica only when no other
//!   replica of the shard can lead. It freezes its own report ([`Replica::report`]: its synced
//!   prefix, what it vouched for past it), asks the shard's other replicas for theirs
//!   ([`TigaMsg::Recover`]) and every other shard's leader for the multi-shard transactions on
//!   this shard it logged above the old leader's last promise ([`TigaMsg::Pull`]), again until
//!   it leads. With `f + 1` reports (its own included) and every answer it rebuilds the log
//!   ([`rebuild_log`]), adds what the other leaders logged and the log lacks, takes it as
//!   leader ([`Replica::promote`]) and runs as leader every entry from what it executed as a
//!   follower on. A multi-shard entry whose outcome a report carries runs to that outcome
//!   (the other leaders may have dropped their records of it: the promise rule of
//!   `leader_closed` makes sure one of any `f + 1` replicas has it then); for the others it
//!   asks the other leaders for their votes ([`TigaMsg::AskVote`]). Bodies no report held
//!   are taken from the coordinators' resends. Its first step as leader ends with a
//!   checkpoint; until then a restart comes back as the follower it was, gathering again.
//! - **This node follows a new leader.** It freezes its report and answers the new leader's
//!   `Recover` from it, and rejoins the shard by a state transfer from the new leader (its
//!   log may differ from the rebuilt one past what it executed; what it executed is in the
//!   rebuilt log, so its store is a prefix of the new leader's).
//! - **This node led and no longer does.** (One chosen while it rejoined never led: it
//!   follows the new leader as above, and answers no `Recover`.) Its store may hold writes
//!   of entries the rebuilt log does not keep, and the initial load it would fall back to
//!   is not at hand here: it retires the replica (takes no part in the shard) and rejoins
//!   at once by a state transfer of every key, which replaces its store whole. It freezes
//!   its log first, all of it as synced (every follower's synced prefix is a prefix of it),
//!   with its decision records as outcomes, and answers the new leader's `Recover` from it:
//!   when the view manager deposed it for silence (a partition) and the other followers
//!   hold no log (one was rejoining), its report is what lets the new leader gather `f + 1`.
//!   Its leader state goes aside whole (`Hosted::deposed`) until a transfer is installed.
//! - **This node is chosen again while it keeps its deposed state.** It leads on from that
//!   state, as a leader that kept its shard across the view change, once every other
//!   replica said in this view (the `member_view` of its `Join`) that it held the shard's
//!   log in no view after the one this node led in. Why that is enough: a leader that led
//!   in a later view holds the log in it, and so does every follower it took on, so no one
//!   led the shard since, nothing committed that this node's log lacks, and no other leader
//!   agreed on anything with a leader of this shard but this node. A later view in any
//!   `Join` makes the kept state void. Meanwhile it does not tell the manager it cannot
//!   lead; elsewhere its kept state lets the manager pick it as a last resort. This is what
//!   a shard whose three replicas were all out at once (two came back empty, the leader
//!   was cut off and deposed) recovers by.
//!
//! **Luigi** changes views the same way. Its coordinators also reopen what waited for
//! watermarks (every result of the old view is void), forget the watermarks of a shard whose
//! leader changed and resend to the new leaders; its new leader counts every entry of the
//! rebuilt log as unreplicated in its watermarks until a majority of the new view holds it.
//! A body no report held is also fetched from the other leaders that pulled the entry in (a
//! luigi follower never saw a transaction its old leader had not logged, and a coordinator
//! that crashed resends nothing).
//!
//! **A change of agreement mode** (the manager picks the mode per view in `auto`) switches
//! every replica's detective flag at once: the mode decides only whether a leader runs a due
//! transaction before its agreement, and a speculative run already made is revoked or kept
//! by the agreement as before.
//!
//! Not handled yet: leading from dropped state with
//! more than three replicas; votes on entries whose outcomes the followers dropped before
//! the old leader's vote reached every other leader (docs/protocols/tiga.md).

use super::*;

/// Entries (synced or not) a report carries at most.
pub const REPORT_ENTRIES_MAX: usize = 1 << 15;
const _: () = assert!(REPORT_ENTRIES_MAX >= super::super::log::SYNC_ENTRIES_MAX);

/// A replica's log as it stood when its view changed, kept to report it.
#[derive(Debug)]
pub(super) struct Frozen {
    log: super::super::replica::LogReport,
    /// The bodies it held for the entries reported.
    bodies: BTreeMap<TxnId, Arc<TxnBody>>,
    /// The outcomes it heard for them.
    outcomes: BTreeMap<TxnId, (bool, Vec<(u32, PieceOutput)>)>,
}

/// A new leader gathering reports (and what the other shards' leaders logged on its shard).
#[derive(Debug, Default)]
pub(super) struct Recovering {
    /// Per replica node, its report.
    reports: BTreeMap<NodeId, Report>,
    /// Bodies of entries of the rebuilt log that no report held: taken from the
    /// coordinators' resends (an entry without a body on any live replica did not commit
    /// here, so its coordinator still resends it). At most [`REPORT_ENTRIES_MAX`].
    pub(super) wanted: BTreeSet<TxnId>,
    /// Per other shard, the multi-shard transactions on this one its leader logged above
    /// the old leader's last promise ([`TigaMsg::Pulled`]).
    pulled: BTreeMap<ShardId, Vec<(TxnId, Timestamp)>>,
}

/// A report's log as the wire carries it: the base, the synced prefix from it, and the
/// entries past the sync-point.
type ReportedEntries = (u64, Vec<(TxnId, Timestamp)>, Vec<(TxnId, Timestamp)>);

/// One replica's report as received (checked).
#[derive(Debug)]
struct Report {
    base: usize,
    synced: Vec<(TxnId, Timestamp)>,
    unsynced: Vec<(TxnId, Timestamp)>,
    bodies: Vec<Known>,
    outcomes: Vec<SyncOutcome>,
}

impl TigaNode {
    /// Takes the view manager's next view: a global view number above this node's, and a
    /// leader per shard. Errors (a stale or malformed view, luigi) change nothing. One piece:
    /// every check runs before any hosted replica changes, so that a refused view leaves no
    /// shard half moved.
    pub fn install_view(
        &mut self,
        now: Time,
        view: View,
        out: &mut Outbox<TigaMsg>,
    ) -> Result<(), String> {
        if view.global <= self.view.global {
            return Err(format!("view {} is not past {}", view.global, self.view.global));
        }
        if view.local.len() != self.context.topology.shards as usize || view.mode == Mode::Auto {
            return Err("a view of another shard count, or without a mode".into());
        }
        if !self.variant.may_detect() && view.mode == Mode::Detective {
            let name = self.variant.name;
            return Err(format!("{name}'s leaders agree before executing: no detective view"));
        }
        let me = self.context.id;
        let record = Record::View {
            global: view.global,
            local: view.local.clone(),
            detective: view.mode == Mode::Detective,
        };
        // Journaled before anything of the new view goes out: a restart starts in it.
        self.journal.write(&record);
        let old = std::mem::replace(&mut self.view, view);
        self.counts.views_installed_total += 1;
        if self.view.mode != old.mode {
            // A change of agreement mode: only whether a leader runs a due transaction before
            // its agreement changes (`Replica::set_detective`), so each replica switches at
            // once, kept states included; leaders in either mode agree alike.
            let detective = self.view.mode == Mode::Detective;
            for host in self.hosted.values_mut() {
                host.replica.set_detective(detective);
                if let Some(stashed) = &mut host.stashed {
                    stashed.replica.set_detective(detective);
                }
                if let Some(deposed) = &mut host.deposed {
                    deposed.led.replica.set_detective(detective);
                }
            }
            self.counts.mode_changes_total += 1;
        }
        // The coordinator: replies of the old view count for nothing now.
        let shards: Vec<ShardId> = (0..self.context.topology.shards).map(ShardId).collect();
        let placements = self.placement(&shards);
        self.tracker.new_view(&placements);
        let luigi = self.variant.leaders_only();
        for flight in self.requests.values_mut() {
            flight.results.clear();
            if luigi {
                // Resent to the shards' leaders of this view.
                let leaders =
                    flight.shards.iter().filter_map(|&s| leader_node(&self.context, &self.view, s));
                flight.to = leaders.collect();
            }
        }
        // The shards whose leader changed: agreements with them start again. Told by the
        // shard's local view number, not by its leader's node: a node that missed views may
        // find the same node leading after others led in between (a leader deposed and
        // chosen again, its follower still holding the log of before).
        let changed: BTreeSet<ShardId> = (0..self.context.topology.shards)
            .map(ShardId)
            .filter(|&s| old.local.get(s.0 as usize) != self.view.local.get(s.0 as usize))
            .collect();
        // Luigi's coordinator: what waited for watermarks waits for every leader's result
        // again (a new leader may run a resent transaction at another timestamp), and a
        // new leader's watermarks count from nothing. (An old leader's watermark spoke of
        // its own log: the rebuilt one holds every entry a majority had, but the new leader
        // may place a resent transaction below it.)
        for decided in std::mem::take(&mut self.awaiting).into_values() {
            let flight = self.by_txn.get(&decided.txn).and_then(|id| self.requests.get(id));
            if let Some(flight) = flight {
                let placement = self.placement(&flight.shards);
                self.tracker.reopen(decided.txn, decided.ts, &placement);
            }
        }
        for shard in &changed {
            self.watermarks.remove(shard);
        }
        for shard in self.hosted_shards.clone() {
            let was = leader_node(&self.context, &old, shard);
            let now_leader = leader_node(&self.context, &self.view, shard);
            let global = self.view.global;
            let host = self.hosted.get_mut(&shard).expect("hosted");
            if let Some(deposed) = &mut host.deposed {
                // What the other replicas said of their logs held in the view it was said in.
                deposed.cleared.clear();
            }
            if !changed.contains(&shard) {
                debug_assert_eq!(was, now_leader);
                // Its log stands, and so does every reply it sent of it: a resend is answered
                // in the new view.
                if host.follow.joining.is_none() && !host.retired && host.lead.recovering.is_none()
                {
                    host.member_view = global;
                }
                for answer in host.answers.values_mut() {
                    answer.set_view(global);
                }
                if was == Some(me) && !host.retired {
                    // Tiga's view change runs the agreements past the commit-point again:
                    // those with a new leader start over in this view.
                    let actions = host.replica.restart_agreements(&changed);
                    self.act(now, shard, actions, None, out);
                }
                continue;
            }
            let Some(now_leader) = now_leader else { continue };
            if host.lead.recovering.is_some() {
                // Still gathering when the view moved on: it asks again as the leader, or
                // follows the next one (its frozen report answers that one too).
                if now_leader == me {
                    self.ask_reports(shard, out);
                } else {
                    host.lead.recovering = None;
                    self.rejoin(shard, now_leader, out);
                }
                continue;
            }
            if was == Some(me) && host.follow.joining.is_none() {
                // Retired, it still answers the new leader's `Recover` with its log: the
                // other replicas may be too few to report without it. (One chosen while it
                // rejoined never led, holds no log to report, and rejoins below.)
                let frozen = freeze(host);
                self.retire(shard, old.global);
                let host = self.hosted.get_mut(&shard).expect("hosted");
                host.frozen = Some(Box::new(frozen));
                if now_leader == me {
                    // It missed the views that deposed it and chose it again: others may have
                    // led in between, so it waits, as a deposed leader chosen again, for
                    // every other replica's word before it leads on (below).
                    continue;
                }
                // It rejoins at once, by an image of every key that replaces its store.
                self.rejoin(shard, now_leader, out);
            } else if now_leader == me {
                if host.deposed.is_some() {
                    // A deposed leader leads on from the state it kept once every other
                    // replica said it held no log since (`Join`s, [`TigaNode::clear_deposed`]).
                    continue;
                }
                if host.follow.joining.is_some() && !self.take_up_stash(shard) {
                    // It holds no log to lead with, and says so in its heartbeats: the view
                    // manager moves the shard on, and it rejoins from the next leader. (It
                    // does not retire: its store holds nothing a rebuilt log could drop.)
                    continue;
                }
                let host = self.hosted.get_mut(&shard).expect("hosted");
                host.frozen = Some(Box::new(freeze(host)));
                host.lead.recovering = Some(Recovering::default());
                host.answers.clear();
                host.answer_order.clear();
                self.ask_reports(shard, out);
            } else {
                if host.follow.joining.is_none() && host.frozen.is_none() {
                    host.frozen = Some(Box::new(freeze(host)));
                }
                self.rejoin(shard, now_leader, out);
            }
        }
        Ok(())
    }

    /// New leader: asks the other leaders for their votes on the entries it runs again
    /// without an outcome and has not run yet (those it ran are dropped from the set).
    pub(super) fn ask_votes(&mut self, shard: ShardId, out: &mut Outbox<TigaMsg>) {
        let view = self.view.global;
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        let (queued, replica) = (&host.lead.queued, &host.replica);
        // Until it runs: queued, or held for the agreement that releases it (pulled in).
        host.lead.asking.retain(|txn| queued.contains_key(txn) || replica.held_at(*txn).is_some());
        for &txn in &host.lead.asking {
            let Some(k) = host.bodies.get(&txn) else { continue };
            for &peer in k.shards.iter().filter(|&&s| s != shard) {
                if let Some(node) = leader_node(&self.context, &self.view, peer) {
                    out.send(node, TigaMsg::AskVote { view, txn, from: shard, to: peer });
                }
            }
        }
    }

    /// A replica of `shard` this node led drops what it held as the leader and takes no part
    /// in the shard until a state transfer of every key has replaced its store (see the
    /// module's contract). The leader state goes aside whole ([`Hosted::deposed`]): should
    /// the node be chosen again before any other replica held the log, it leads on from it.
    /// `led_view`: the last view it led in.
    fn retire(&mut self, shard: ShardId, led_view: u64) {
        let detective = self.view.mode == Mode::Detective;
        let limits = replica_limits(self.context.topology.shards);
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        let replica = Replica::new(shard, false, limits).with_detective(detective);
        let mut blank = Hosted {
            retired: true,
            ..Hosted::new(shard, replica, host.leader, Vec::new(), host.keep_history)
        };
        blank.follow.joining = Some(Joining { timer_set: true, ..Joining::default() });
        let mut led = std::mem::replace(host, blank);
        // The store and what else belongs to the replica stay with it; everything it held
        // as the leader goes (a proposal record kept without its body once made a later
        // leadership's first checkpoint fail).
        led.swap_kept(host);
        led.frozen = None;
        led.lead.recovering = None;
        led.stashed = None;
        led.deposed = None;
        let cleared = BTreeSet::new();
        host.deposed = Some(Box::new(Deposed { led, led_view, cleared }));
        // A restart rejoins with a store loaded afresh, as a follower that lost its state.
        self.journal.write(&Record::Joining { shard });
        self.counts.retired_total += 1;
    }

    /// A deposed leader chosen to lead `shard` again hears from replica `from` (its `Join`)
    /// the last view in which that replica held the shard's log. Once every other replica
    /// said one no later than the view this node led in, no one led the shard since (a
    /// leader that led holds the log in its view, and so does every follower it took on),
    /// so nothing committed here that its own state lacks: it leads on from that state
    /// ([`TigaNode::resume_deposed`]). One that held the log later makes that state void: it
    /// is dropped, and the replica stays unable to lead until a transfer is installed.
    pub(super) fn clear_deposed(
        &mut self,
        now: Time,
        from: NodeId,
        shard: ShardId,
        member_view: u64,
        out: &mut Outbox<TigaMsg>,
    ) {
        let me = self.context.id;
        // Most `Join`s reach a leader that keeps no deposed state: nothing to clear.
        if self.hosted.get(&shard).is_none_or(|h| h.deposed.is_none())
            || leader_node(&self.context, &self.view, shard) != Some(me)
            || from == me
        {
            return;
        }
        let replicas = self.context.topology.shard_nodes(shard);
        if !replicas.contains(&from) {
            return;
        }
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        let Some(deposed) = &mut host.deposed else { return };
        if member_view > deposed.led_view {
            host.deposed = None;
            self.counts.deposed_void_total += 1;
            return;
        }
        deposed.cleared.insert(from);
        if replicas.iter().all(|n| *n == me || deposed.cleared.contains(n)) {
            self.resume_deposed(now, shard, out);
        }
    }

    /// A deposed leader takes up the leader state it kept (see [`TigaNode::clear_deposed`])
    /// and leads on in this view as a leader that kept its shard across a view change does:
    /// its log and replies stand, its agreements start again with every shard (their leaders
    /// started theirs with this shard again when it was deposed), and every other replica,
    /// rejoining, takes a state transfer from it. Luigi: its watermarks count from nothing,
    /// as a new leader's do. Its journal says it rejoins: the step ends with a checkpoint as
    /// the leader.
    fn resume_deposed(&mut self, now: Time, shard: ShardId, out: &mut Outbox<TigaMsg>) {
        let me = self.context.id;
        let global = self.view.global;
        let others: BTreeSet<ShardId> =
            (0..self.context.topology.shards).map(ShardId).filter(|&s| s != shard).collect();
        let fresh = self.variant.watermarks(self.context.topology.nodes.len());
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        let Some(deposed) = host.deposed.take() else { return };
        let mut led = deposed.led;
        // The store is as the leader left it: no transfer was installed since.
        led.swap_kept(host);
        *host = led;
        debug_assert!(host.replica.leads() && !host.retired && host.follow.joining.is_none());
        host.leader = me;
        host.member_view = global;
        let followers = std::mem::take(&mut host.lead.followers);
        lead_afresh(host, followers);
        host.lead.closed_sent = Timestamp::ZERO;
        for answer in host.answers.values_mut() {
            answer.set_view(global);
        }
        if let Some(watermarks) = fresh {
            count_afresh(host, watermarks, Vec::new());
        }
        let actions = host.replica.restart_agreements(&others);
        self.counts.views_resumed_total += 1;
        self.act(now, shard, actions, None, out);
        self.start_leading(now, shard, out);
    }

    /// A leader that took its shard at a view change starts: its pacing timer, a checkpoint
    /// as the leader at the end of the step (its journal holds a follower), then what it
    /// can execute, release and sync.
    fn start_leading(&mut self, now: Time, shard: ShardId, out: &mut Outbox<TigaMsg>) {
        if !self.pacing {
            self.pacing = true;
            self.timers.set(Purpose::Pace, self.pace_ns(), out);
        }
        self.checkpoint_wanted = true;
        self.execute_all(now, out);
        self.release(now, out);
        self.sync_followers(shard, false, out);
    }

    /// A restarted node that its journal's view makes the leader of `shard`, whose journal
    /// holds the follower it was (promoted and crashed before it checkpointed as the
    /// leader): it takes up the follower's state and gathers the reports again.
    pub(super) fn demote_to_gather(&mut self, shard: ShardId) {
        let me = self.context.id;
        if let Some(host) = self.demoted(shard) {
            host.leader = me;
            host.lead.recovering = Some(Recovering::default());
        }
    }

    /// A restarted node that its journal's view makes the leader of `shard`, whose journal
    /// says the replica was rejoining: it holds no log to lead with, so it starts as a
    /// rejoining follower (the manager, told it cannot lead, moves the shard on).
    pub(super) fn demote_to_rejoin(&mut self, shard: ShardId) {
        if let Some(host) = self.demoted(shard) {
            host.follow.joining = Some(Joining::default());
        }
    }

    /// A restarted node's replica of `shard`, set up as a leader by its view, made a follower
    /// that holds nothing yet (its journal says what it holds).
    fn demoted(&mut self, shard: ShardId) -> Option<&mut Hosted> {
        let detective = self.view.mode == Mode::Detective;
        let limits = replica_limits(self.context.topology.shards);
        let host = self.hosted.get_mut(&shard)?;
        host.replica = Replica::new(shard, false, limits).with_detective(detective);
        host.lead.followers.clear();
        host.lead.acks.clear();
        host.lead.sent_to.clear();
        host.lead.bodies_to.clear();
        host.lead.streams = None;
        Some(host)
    }

    /// When the node starts: a new leader restarted while gathering reports gathers them
    /// again, from its follower state as restored.
    pub(super) fn gather_after_restart(&mut self, out: &mut Outbox<TigaMsg>) {
        let gathering: Vec<ShardId> = self
            .hosted
            .values()
            .filter(|h| h.lead.recovering.is_some() && h.frozen.is_none())
            .map(|h| h.shard)
            .collect();
        for shard in gathering {
            let host = self.hosted.get_mut(&shard).expect("hosted");
            host.frozen = Some(Box::new(freeze(host)));
            self.ask_reports(shard, out);
        }
    }

    /// A follower whose shard has a new leader drops its log and takes the new leader's
    /// state (its frozen report stays, to answer the new leader).
    fn rejoin(&mut self, shard: ShardId, leader: NodeId, out: &mut Outbox<TigaMsg>) {
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        host.leader = leader;
        self.drop_log_to_rejoin(shard, true, out);
    }

    /// A replica told to lead while it rejoins: it takes up again the follower state it
    /// dropped when a view change sent it to rejoin, if it still holds it (no transfer was
    /// installed since, so its store is as that state left it), and can then gather reports
    /// as any follower chosen to lead does. The reports it answered meanwhile came from its
    /// frozen log, which is that state's. False when it holds none.
    ///
    /// Why this is sound with three replicas: a leader chosen after the one it froze under
    /// could commit nothing without a follower that installed its transfer, and the only
    /// other replica is the one this node would follow or the deposed one, which retired;
    /// so what committed is in the old log, which the reports it gathers rebuild.
    fn take_up_stash(&mut self, shard: ShardId) -> bool {
        let Some(host) = self.hosted.get_mut(&shard) else { return false };
        let Some(mut stashed) = host.stashed.take() else { return false };
        // Bodies that arrived while it rejoined are kept too (bounded as they were).
        for (txn, known) in std::mem::take(&mut host.bodies) {
            stashed.bodies.entry(txn).or_insert(known);
        }
        stashed.swap_with(host);
        host.follow.joining = None;
        self.counts.led_from_stash_total += 1;
        true
    }

    /// New leader: asks the shard's other replicas for their reports, and again after a
    /// request's timeout until it leads.
    fn ask_reports(&mut self, shard: ShardId, out: &mut Outbox<TigaMsg>) {
        let Some(host) = self.hosted.get(&shard) else { return };
        let Some(recovering) = &host.lead.recovering else { return };
        // From what it executed: the outcomes of the entries it has not run are wanted too.
        let from = host.follow.executed;
        let me = self.context.id;
        let view = self.view.global;
        for node in self.context.topology.shard_nodes(shard) {
            if node != me && !recovering.reports.contains_key(&node) {
                out.send(node, TigaMsg::Recover { view, shard, from: from as u64 });
            }
        }
        // The other shards' leaders: what they released with the old leader of this shard.
        let mut local = Vec::new();
        for other in (0..self.context.topology.shards).map(ShardId) {
            if other == shard || recovering.pulled.contains_key(&other) {
                continue;
            }
            match leader_node(&self.context, &self.view, other) {
                Some(node) if node == me => local.push(other),
                Some(node) => out.send(node, TigaMsg::Pull { view, shard, to: other }),
                None => {}
            }
        }
        for other in local {
            let entries = self.pull_answer(other, shard);
            if let Some(r) = self.hosted.get_mut(&shard).and_then(|h| h.lead.recovering.as_mut()) {
                r.pulled.insert(other, entries);
            }
        }
        self.timers.set(Purpose::Recover(shard), self.context.timing.rpc_timeout_ns, out);
    }

    /// The leader of `led`: the multi-shard transactions on `shard` it logged above the last
    /// promise it heard from `shard`'s old leader (below it, the old leader had finished them
    /// and `f` of its followers executed them: the rebuilt log holds them), whose bodies it
    /// holds. A new leader still gathering answers from its frozen report. At most
    /// [`REPORT_ENTRIES_MAX`], the latest.
    fn pull_answer(&self, led: ShardId, shard: ShardId) -> Vec<(TxnId, Timestamp)> {
        let Some(host) = self.hosted.get(&led) else { return Vec::new() };
        let above = self.peer_closed.get(&shard).copied().unwrap_or(Timestamp::ZERO);
        // The body says where it runs; once it is dropped (every follower executed the
        // entry), the decision record kept until every leader promised past it does.
        let on_shard = |txn: &TxnId| match host.bodies.get(txn) {
            Some(k) => k.shards.contains(&shard),
            None => host.lead.decided.get(txn).is_some_and(|d| d.others.contains(&shard)),
        };
        let mut entries: Vec<(TxnId, Timestamp)> = match &host.frozen {
            Some(frozen) => frozen
                .log
                .synced
                .iter()
                .chain(&frozen.log.unsynced)
                .filter(|(txn, ts)| *ts > above && on_shard(txn))
                .copied()
                .collect(),
            None if host.replica.leads() => host
                .replica
                .log_since(host.replica.log_base())
                .iter()
                .filter(|(txn, ts)| *ts > above && on_shard(txn))
                .copied()
                .collect(),
            None => Vec::new(),
        };
        if entries.len() > REPORT_ENTRIES_MAX {
            entries.drain(..entries.len() - REPORT_ENTRIES_MAX);
        }
        entries
    }

    /// A shard's leader: a new leader of `shard` asks what it logged there (see
    /// [`TigaNode::pull_answer`]).
    pub(super) fn on_pull(
        &mut self,
        from: NodeId,
        shard: ShardId,
        to: ShardId,
        out: &mut Outbox<TigaMsg>,
    ) {
        let leads_to = leader_node(&self.context, &self.view, to) == Some(self.context.id);
        if !self.is_leader_node(shard, from) || !leads_to || to == shard {
            self.counts.dropped_total += 1;
            return;
        }
        let entries = self.pull_answer(to, shard);
        out.send(from, TigaMsg::Pulled { view: self.view.global, shard, from: to, entries });
    }

    /// New leader: another shard's leader answered what it logged on this shard.
    pub(super) fn on_pulled(
        &mut self,
        now: Time,
        from: NodeId,
        (shard, other): (ShardId, ShardId),
        entries: Vec<(TxnId, Timestamp)>,
        out: &mut Outbox<TigaMsg>,
    ) {
        if !self.is_leader_node(other, from) || entries.len() > REPORT_ENTRIES_MAX {
            self.counts.dropped_total += 1;
            return;
        }
        let Some(host) = self.hosted.get_mut(&shard) else { return };
        let Some(recovering) = &mut host.lead.recovering else { return };
        recovering.pulled.entry(other).or_insert(entries);
        self.try_lead(now, shard, out);
    }

    /// The recover timer: asks again while still gathering.
    pub(super) fn on_recover_timer(
        &mut self,
        now: Time,
        shard: ShardId,
        out: &mut Outbox<TigaMsg>,
    ) {
        if self.hosted.get(&shard).is_some_and(|h| h.lead.recovering.is_some()) {
            self.ask_reports(shard, out);
            self.try_lead(now, shard, out);
        }
    }

    /// New leader: a body arrived for an entry the rebuilt log needs and no report held.
    /// True when it was wanted (it is kept, and the log is rebuilt again once all are in).
    pub(super) fn take_wanted_body(
        &mut self,
        now: Time,
        shard: ShardId,
        known: Known,
        out: &mut Outbox<TigaMsg>,
    ) -> bool {
        let Some(host) = self.hosted.get_mut(&shard) else { return false };
        let Some(recovering) = &mut host.lead.recovering else { return false };
        if !recovering.wanted.remove(&known.body.txn) {
            return false;
        }
        let done = recovering.wanted.is_empty();
        host.bodies.insert(known.body.txn, known);
        if done {
            self.try_lead(now, shard, out);
        }
        true
    }

    /// A replica: the new leader of `shard` asks for its report, from log position `from`.
    pub(super) fn on_recover(
        &mut self,
        from: NodeId,
        shard: ShardId,
        position: u64,
        out: &mut Outbox<TigaMsg>,
    ) {
        if !self.is_leader_node(shard, from) || from == self.context.id {
            self.counts.dropped_total += 1;
            return;
        }
        let Some(host) = self.hosted.get(&shard) else { return };
        let Some(frozen) = &host.frozen else {
            // Nothing to report (it held no log when the view changed): silence.
            return;
        };
        let position = usize::try_from(position).unwrap_or(usize::MAX);
        let log = &frozen.log;
        let skip = position.saturating_sub(log.base).min(log.synced.len());
        let synced = log.synced[skip..].to_vec();
        let unsynced = log.unsynced.clone();
        if synced.len() + unsynced.len() > REPORT_ENTRIES_MAX {
            self.counts.reports_oversized_total += 1;
            return;
        }
        let listed = synced.iter().chain(&unsynced);
        let bodies: Vec<TxnBody> = listed
            .clone()
            .filter_map(|(txn, _)| frozen.bodies.get(txn).map(|b| (**b).clone()))
            .collect();
        let outcomes: Vec<SyncOutcome> = listed
            .filter_map(|(txn, _)| {
                frozen.outcomes.get(txn).map(|(ok, inputs)| SyncOutcome {
                    txn: *txn,
                    ok: *ok,
                    inputs: inputs.clone(),
                })
            })
            .collect();
        let msg = TigaMsg::Report {
            view: self.view.global,
            shard,
            base: (log.base + skip) as u64,
            synced,
            unsynced,
            bodies,
            outcomes,
        };
        out.send(from, msg);
    }

    /// New leader: a replica's report. Checked whole (a replica of the shard, within the
    /// limits, every body one of this shard, outcomes only for entries it lists), or dropped.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_report(
        &mut self,
        now: Time,
        from: NodeId,
        shard: ShardId,
        (base, synced, unsynced): ReportedEntries,
        bodies: Vec<TxnBody>,
        outcomes: Vec<SyncOutcome>,
        out: &mut Outbox<TigaMsg>,
    ) {
        let replica_of = self.context.topology.shard_nodes(shard).contains(&from);
        let Some(host) = self.hosted.get(&shard) else { return };
        let gathering =
            host.lead.recovering.as_ref().is_some_and(|r| !r.reports.contains_key(&from));
        let entries = synced.len() + unsynced.len();
        if !replica_of
            || !gathering
            || from == self.context.id
            || entries > REPORT_ENTRIES_MAX
            || bodies.len() > entries
            || outcomes.len() > entries
        {
            self.counts.dropped_total += 1;
            return;
        }
        let Ok(base) = usize::try_from(base) else { return };
        let listed: BTreeSet<TxnId> = synced.iter().chain(&unsynced).map(|&(t, _)| t).collect();
        let mut known = Vec::with_capacity(bodies.len());
        for body in bodies {
            if !listed.contains(&body.txn) {
                self.counts.dropped_total += 1;
                return;
            }
            match journaled_known(&self.context, shard, body) {
                Ok(k) => known.push(k),
                Err(_) => {
                    self.counts.dropped_total += 1;
                    return;
                }
            }
        }
        if outcomes.iter().any(|o| !listed.contains(&o.txn) || o.inputs.len() > PIECES_MAX) {
            self.counts.dropped_total += 1;
            return;
        }
        let report = Report { base, synced, unsynced, bodies: known, outcomes };
        let host = self.hosted.get_mut(&shard).expect("checked");
        if let Some(recovering) = &mut host.lead.recovering {
            recovering.reports.insert(from, report);
        }
        self.try_lead(now, shard, out);
    }

    /// New leader: with `f + 1` reports, rebuilds the log and leads it. A merge that fails
    /// (reports that do not hold together, a gap no report fills) is counted, and the reports
    /// that came wait for more.
    fn try_lead(&mut self, now: Time, shard: ShardId, out: &mut Outbox<TigaMsg>) {
        let replicas = self.context.topology.replicas;
        let f = (replicas.max(1) as usize - 1) / 2;
        let Some(host) = self.hosted.get(&shard) else { return };
        let Some(recovering) = &host.lead.recovering else { return };
        let others = self.context.topology.shards as usize - 1;
        if recovering.reports.len() < f || recovering.pulled.len() < others {
            return;
        }
        match self.lead_rebuilt(now, shard, out) {
            Ok(()) => self.counts.views_led_total += 1,
            Err(_) => {
                self.counts.view_changes_failed_total += 1;
                self.fetch_wanted(shard, out);
            }
        }
    }

    /// New leader: asks the other shards' leaders that pulled in a transaction whose body
    /// no report held for it (its coordinator may have crashed and resend nothing; a luigi
    /// follower never held the body of a transaction its old leader had not logged). One
    /// this node holds for another shard it leads is taken from there; the rebuild is tried
    /// again on the next recover timer.
    fn fetch_wanted(&mut self, shard: ShardId, out: &mut Outbox<TigaMsg>) {
        let Some(recovering) = self.hosted.get(&shard).and_then(|h| h.lead.recovering.as_ref())
        else {
            return;
        };
        let me = self.context.id;
        let view = self.view.global;
        let mut local = Vec::new();
        for (&other, entries) in &recovering.pulled {
            let Some(node) = leader_node(&self.context, &self.view, other) else { continue };
            for &(txn, _) in entries.iter().filter(|(t, _)| recovering.wanted.contains(t)) {
                if node == me {
                    local.push((other, txn));
                } else {
                    out.send(node, TigaMsg::GetBody { view, txn });
                }
            }
        }
        for (other, txn) in local {
            let Some(k) = self.hosted.get(&other).and_then(|h| h.bodies.get(&txn)) else {
                continue;
            };
            let Ok(known) = journaled_known(&self.context, shard, (*k.body).clone()) else {
                continue;
            };
            let host = self.hosted.get_mut(&shard).expect("gathering");
            if let Some(recovering) = &mut host.lead.recovering {
                recovering.wanted.remove(&txn);
            }
            host.bodies.insert(txn, known);
        }
    }

    /// New leader of `shard`, with its reports in: rebuilds the shard's log from its own
    /// frozen log and `f` others' (what `f + 1` replicas synced stands), adds the multi-shard
    /// transactions the other leaders pulled in, gathers the bodies and outcomes it runs them
    /// with, and starts leading. One piece: every step reads the same borrowed reports, frozen
    /// log and bodies, and the steps must happen together or not at all (an error leaves the
    /// replica gathering, as before the call).
    fn lead_rebuilt(
        &mut self,
        now: Time,
        shard: ShardId,
        out: &mut Outbox<TigaMsg>,
    ) -> Result<(), String> {
        let me = self.context.id;
        let replicas = self.context.topology.replicas;
        let host = self.hosted.get_mut(&shard).expect("hosted");
        let frozen = host.frozen.as_ref().ok_or("no report of its own")?;
        let recovering = host.lead.recovering.as_ref().ok_or("not gathering")?;
        // Every body known: its own, then the reports'.
        let mut known: BTreeMap<TxnId, &Known> = BTreeMap::new();
        for report in recovering.reports.values() {
            for k in &report.bodies {
                known.entry(k.body.txn).or_insert(k);
            }
        }
        for (txn, k) in &host.bodies {
            known.insert(*txn, k);
        }
        let keys_of =
            |txn: &TxnId| known.get(txn).map(|k| (k.part.reads.clone(), k.part.writes.clone()));
        let reported = |(txn, ts): &(TxnId, Timestamp)| ReportedEntry {
            ts: *ts,
            txn: *txn,
            keys: keys_of(txn),
        };
        let own = ReportedLog {
            base: frozen.log.base,
            synced: frozen.log.synced.iter().map(reported).collect(),
            unsynced: frozen.log.unsynced.iter().map(reported).collect(),
        };
        let from = own.base + own.synced.len();
        let mut logs = vec![own];
        for report in recovering.reports.values() {
            logs.push(ReportedLog {
                base: report.base,
                synced: report.synced.iter().map(reported).collect(),
                unsynced: report.unsynced.iter().map(reported).collect(),
            });
        }
        let mut rebuilt = rebuild_log(replicas, &logs, from).map_err(|e| format!("{e:?}"))?;
        // Pulled in: a transaction another shard's leader released with the old leader of
        // this one, which the rebuilt log lacks, is added where that leader released it (the
        // highest such timestamp): it did not commit here, and the agreement that placed it
        // there placed it above every conflicting entry of the old leader's log.
        let mut pulled: BTreeMap<TxnId, Timestamp> = BTreeMap::new();
        for &(txn, ts) in recovering.pulled.values().flatten() {
            let at = pulled.entry(txn).or_insert(ts);
            *at = (*at).max(ts);
        }
        let in_rebuilt: BTreeSet<TxnId> =
            rebuilt.prefix.iter().chain(&rebuilt.added).map(|e| e.txn).collect();
        // What promotion keeps of its own log: the synced prefix and the transactions dropped
        // below it. Not the tail: an entry it released there on its own is not in the rebuilt
        // log unless the merge kept it, and a pulled transaction must not be skipped for it
        // (it would come back from its coordinator as a late arrival, at a later timestamp
        // than the other shards ran it at).
        let mut own_log: BTreeSet<TxnId> = frozen.log.synced.iter().map(|&(txn, _)| txn).collect();
        own_log.extend(host.replica.follower_lingering());
        for (txn, ts) in pulled {
            // A transaction its coordinator decided committed here too: it is in the rebuilt
            // log, or was executed and dropped below it (its body with it). Not when its body
            // is still here and no log holds it: the old leader may have run it only as a
            // detective speculation, held for its agreement, and reported no log entry for
            // it, while the coordinator committed it on the fast path (a faulty swarm stalled
            // on that: the other leader waited for this shard's vote for ever).
            let decided = is_decided(&self.decided_floors, txn);
            let dropped = decided && !host.bodies.contains_key(&txn);
            if in_rebuilt.contains(&txn) || own_log.contains(&txn) || dropped {
                continue;
            }
            rebuilt.added.push(ReportedEntry { ts, txn, keys: keys_of(&txn) });
        }
        rebuilt.added.sort_unstable_by_key(|e| (e.ts, e.txn));
        // The bodies of what it will run: its own synced entries it has not executed, the
        // rebuilt prefix, the added entries.
        let skip =
            host.follow.executed.saturating_sub(frozen.log.base).min(frozen.log.synced.len());
        let own_left = frozen.log.synced[skip..].iter().map(|&(txn, _)| txn);
        let needed: BTreeSet<TxnId> =
            rebuilt.prefix.iter().chain(&rebuilt.added).map(|e| e.txn).chain(own_left).collect();
        let missing: BTreeSet<TxnId> =
            needed.iter().filter(|t| !known.contains_key(t)).copied().collect();
        if !missing.is_empty() {
            let count = missing.len();
            if let Some(recovering) = &mut host.lead.recovering {
                recovering.wanted = missing.into_iter().take(REPORT_ENTRIES_MAX).collect();
            }
            return Err(format!("{count} bodies missing"));
        }
        let mut prefix = Vec::with_capacity(rebuilt.prefix.len());
        for entry in &rebuilt.prefix {
            let keys = entry.keys.clone().ok_or("a body of the rebuilt prefix is missing")?;
            prefix.push((entry.txn, entry.ts, keys));
        }
        let mut added = Vec::with_capacity(rebuilt.added.len());
        for entry in &rebuilt.added {
            let k = known.get(&entry.txn).ok_or("a body of an added entry is missing")?;
            added.push(incoming(entry.txn, entry.ts, &k.shards, &k.part));
        }
        // A multi-shard entry added here may have been decided by the other leaders with the
        // old leader's vote: they send theirs no more unless asked.
        let asked: Vec<TxnId> =
            added.iter().filter(|i| i.shards.len() > 1).map(|i| i.txn).collect();
        // The bodies it lacks, and the outcomes the reports carry.
        let new_bodies: Vec<Known> = needed
            .iter()
            .filter(|t| !host.bodies.contains_key(t))
            .filter_map(|t| known.get(t).map(|k| clone_known(k)))
            .collect();
        let mut outcomes: BTreeMap<TxnId, (bool, Vec<(u32, PieceOutput)>)> =
            frozen.outcomes.clone();
        for report in recovering.reports.values() {
            for o in &report.outcomes {
                outcomes.entry(o.txn).or_insert_with(|| (o.ok, o.inputs.clone()));
            }
        }
        for k in new_bodies {
            host.bodies.insert(k.body.txn, k);
        }
        let bodies = &host.bodies;
        let added_at: Vec<(TxnId, Timestamp)> = added.iter().map(|i| (i.txn, i.ts)).collect();
        let (actions, held) =
            host.replica.promote(prefix, added, |txn| bodies.get(&txn).map(|k| k.part.keys()))?;
        if let Some(watermarks) = self.variant.watermarks(self.context.topology.nodes.len()) {
            // Its watermarks count from nothing (the coordinators forgot the old leader's):
            // every entry of the rebuilt log and every added one is open until a majority of
            // the shard's replicas in this view holds it, and a new transaction of a worker
            // is held above every entry of that worker here.
            count_afresh(host, watermarks, added_at);
        }
        // The node's state as a leader of the rebuilt log.
        let followers: Vec<NodeId> =
            self.context.topology.shard_nodes(shard).into_iter().filter(|&n| n != me).collect();
        host.leader = me;
        host.member_view = self.view.global;
        lead_afresh(host, followers);
        host.lead.finished = host.follow.executed;
        host.lead.pruned = host.follow.executed;
        host.commit = host.follow.executed;
        if host.lead.streams.is_none() {
            host.lead.replicated = host.follow.executed;
        }
        host.lead.checkpointed = host.follow.executed;
        host.lead.promised = Timestamp::ZERO;
        host.lead.closed_sent = Timestamp::ZERO;
        host.follow.closed.clear();
        host.follow.unlisted.clear();
        host.follow.tail_cut = Timestamp::ZERO;
        host.frozen = None;
        host.lead.recovering = None;
        // Every entry from what it executed as a follower runs again as a leader's.
        let entries: Vec<(TxnId, Timestamp)> = whole_log(&host.replica)
            .into_iter()
            .skip(host.follow.executed.saturating_sub(host.replica.log_base()))
            .collect();
        for (txn, ts) in entries {
            let Some(k) = host.bodies.get(&txn) else {
                return Err(format!("{txn} is in the log without its body"));
            };
            let keys = k.part.keys();
            let hash = host.replica.hashes().reply_hash(&keys);
            host.lead.waits.enqueue((ts, txn), &k.part.reads, &k.part.writes);
            host.lead.queued.insert(txn, Queued { ts, hash, speculative: false });
            let others: Vec<ShardId> = k.shards.iter().copied().filter(|&s| s != shard).collect();
            if let Some((ok, inputs)) = outcomes.get(&txn) {
                // The old leader decided it: it runs to that outcome (see the contract).
                for other in others {
                    let vote = PeerVote { ok: *ok, outputs: inputs.clone() };
                    host.lead.early_votes.entry(txn).or_default().insert(other, vote);
                }
            } else if !others.is_empty() {
                // The other leaders may have decided it with the old leader's vote: asked.
                host.lead.asking.insert(txn);
            }
        }
        // The multi-shard entries it executed as a follower: the old leader decided them, and
        // its vote may not have reached every other leader before it failed (one still
        // waiting asks this one). Each gets the record the old leader kept: this shard's vote
        // is the outcome (with every vote a yes it was a yes; with a no somewhere, a no
        // decides the same), with the outputs its pieces gave. Settled: every follower that
        // stays takes a state transfer from here.
        let executed: Vec<(TxnId, Timestamp)> = whole_log(&host.replica)
            .into_iter()
            .take(host.follow.executed.saturating_sub(host.replica.log_base()))
            .collect();
        for (txn, ts) in executed {
            let Some(k) = host.bodies.get(&txn) else { continue };
            let Some(&(ok, _)) = outcomes.get(&txn).or_else(|| host.follow.outcomes.get(&txn))
            else {
                continue;
            };
            if k.shards.len() < 2 || host.lead.decided.contains_key(&txn) {
                continue;
            }
            let others: Vec<ShardId> = k.shards.iter().copied().filter(|&s| s != shard).collect();
            let feeds = host.follow.fed.remove(&txn).unwrap_or_default();
            let own = ok;
            let record =
                Decided { ts, settled: true, own, all: ok, inputs: Vec::new(), feeds, others };
            host.lead.decided.insert(txn, record);
            host.lead.settling.insert((ts, txn));
        }
        host.follow.outcomes.clear();
        host.follow.fed.clear();
        host.lead.asking.extend(asked);
        // What it executed as a follower and its coordinator may still wait on: answered as
        // the leader (the result is the old leader's: the same pieces over the same state).
        // Its hash matches no follower's fast reply; the followers' slow replies commit it.
        let view = self.view.global;
        for (txn, (ts, result)) in std::mem::take(&mut host.follow.results) {
            if host.replica.logged(txn) && !host.lead.queued.contains_key(&txn) {
                let msg = TigaMsg::Fast {
                    view,
                    txn,
                    shard,
                    ts,
                    hash: 0,
                    owd_ns: None,
                    result: Some(result),
                };
                reply(host, txn, msg, out);
            }
        }
        // What it held as a follower arrives again at a leader.
        let mut arrivals = Vec::new();
        for txn in held {
            if let Some(k) = host.bodies.get(&txn) {
                arrivals.push(incoming(txn, k.body.ts, &k.shards, &k.part));
            }
        }
        let mut more = Vec::new();
        for arriving in arrivals {
            if arriving.shards.len() > 1 {
                // Another leader may have agreed on it with the old leader and released it:
                // proposed again where it was held (its coordinator's timestamp, which no
                // agreement went below), the answer moves it to the agreed one.
                let (txn, ts) = (arriving.txn, arriving.ts);
                more.extend(host.replica.restore_proposal(arriving, ts));
                if let Some(streams) = &mut host.lead.streams {
                    streams.restore_held(txn, ts);
                }
            } else {
                more.extend(leader_arrive(host, arriving));
            }
        }
        self.act(now, shard, actions, None, out);
        self.act(now, shard, more, None, out);
        self.ask_votes(shard, out);
        // Its journal holds the follower it was: the step ends with a checkpoint as the
        // leader (until it is whole, a restart gathers the reports again).
        self.start_leading(now, shard, out);
        Ok(())
    }
}

/// A leader that took its shard at a view change: `followers` have acknowledged nothing,
/// been sent nothing, and have no transfer under way or installed.
fn lead_afresh(host: &mut Hosted, followers: Vec<NodeId>) {
    host.lead.acks = followers.iter().map(|&n| (n, (0, 0))).collect();
    host.lead.sent_to = followers.iter().map(|&n| (n, 0)).collect();
    host.lead.bodies_to = followers.iter().map(|&n| (n, 0)).collect();
    host.lead.followers = followers;
    host.lead.joined.clear();
    host.lead.transfers.clear();
}

/// Luigi: a leader that took its shard at a view change counts its watermarks from nothing:
/// every entry of its log (and each of `added`) is open until a majority of the shard's
/// replicas in this view holds it. `streams`: fresh watermarks.
fn count_afresh(
    host: &mut Hosted,
    mut streams: Box<dyn Watermarks>,
    added: Vec<(TxnId, Timestamp)>,
) {
    for (txn, ts) in whole_log(&host.replica).into_iter().chain(added) {
        streams.restore_held(txn, ts);
    }
    host.lead.streams = Some(streams);
    host.lead.replicated = host.replica.log_base();
}

/// A leader's whole log from its base, a window at a time (bounded by the log's length).
fn whole_log(replica: &Replica) -> Vec<(TxnId, Timestamp)> {
    let base = replica.log_base();
    let mut entries: Vec<(TxnId, Timestamp)> = Vec::new();
    loop {
        let window = replica.log_since(base + entries.len());
        if window.is_empty() {
            return entries;
        }
        entries.extend_from_slice(window);
    }
}

/// A copy of what the node knows of a transaction.
fn clone_known(k: &Known) -> Known {
    Known { body: k.body.clone(), owd_ns: k.owd_ns, part: k.part.clone(), shards: k.shards.clone() }
}

/// A replica's report of its log now, with the bodies and outcomes it holds for it.
pub(super) fn freeze(host: &Hosted) -> Frozen {
    let base = host.replica.log_base();
    let log = match host.replica.report() {
        Some(report) => report,
        // A deposed leader: its log is the shard's order (every follower's synced prefix is
        // a prefix of it, and every fast commit released here), all of it as synced.
        None if host.replica.leads() => {
            let mut synced = Vec::new();
            // Bounded by the log's length, a chunk at a time.
            while synced.len() < REPORT_ENTRIES_MAX {
                let chunk = host.replica.log_since(base + synced.len());
                if chunk.is_empty() {
                    break;
                }
                synced.extend_from_slice(chunk);
            }
            super::super::replica::LogReport { base, synced, unsynced: Vec::new() }
        }
        None => super::super::replica::LogReport { base, synced: Vec::new(), unsynced: Vec::new() },
    };
    let listed = log.synced.iter().chain(&log.unsynced);
    let bodies = listed
        .clone()
        .filter_map(|(txn, _)| host.bodies.get(txn).map(|k| (*txn, k.body.clone())))
        .collect();
    // A follower's outcomes as it heard them; a leader's from its decision records.
    let outcomes = listed
        .filter_map(|(txn, _)| match host.follow.outcomes.get(txn) {
            Some(o) => Some((*txn, o.clone())),
            None => host.lead.decided.get(txn).map(|d| (*txn, (d.all, d.inputs.clone()))),
        })
        .collect();
    Frozen { log, bodies, outcomes }
}
