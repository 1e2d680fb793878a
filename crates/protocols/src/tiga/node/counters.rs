//! The node's counters, exported under the protocol's prefix (`tiga_` or `luigi_`): each
//! counter is named once, without its prefix, and [`prefixed`] makes both names at compile
//! time (the metrics interface takes `&'static str`). A counter only one variant has (tiga's
//! fast path and speculation, luigi's watermarks) is listed with that variant alone.

use super::{Hosted, Prefix, TigaNode};

/// What a node counts as it goes (events; gauges are read off its state when exported).
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub(super) fast_total: u64,
    pub(super) slow_total: u64,
    pub(super) resends_total: u64,
    pub(super) dropped_total: u64,
    pub(super) votes_waited_total: u64,
    pub(super) snapshot_reads_total: u64,
    pub(super) snapshot_served_total: u64,
    /// Detective mode: speculative runs, those that stood, and those revoked.
    pub(super) speculated_total: u64,
    pub(super) speculations_kept_total: u64,
    pub(super) revoked_total: u64,
    /// Messages of another view than this node's, dropped.
    pub(super) stale_view_total: u64,
    /// Decisions whose leaders' results were of another timestamp (reported unknown).
    pub(super) contradicted_total: u64,
    /// Leaders: state transfers cut for rejoining followers.
    pub(super) transfers_total: u64,
    /// Followers: state transfers installed.
    pub(super) rejoined_total: u64,
    /// Restarted leaders: log entries run again from the journal, and proposals held again.
    pub(super) replayed_total: u64,
    pub(super) restored_proposals_total: u64,
    /// Leaders: followers told they trail by more than the leader keeps bodies for.
    pub(super) behind_total: u64,
    /// Followers: logs dropped on such word, for a state transfer.
    pub(super) went_behind_total: u64,
    /// The most transaction bodies one hosted replica kept, as seen at each pace.
    pub(super) bodies_high: u64,
    /// Late copies of bodies of transactions their coordinators decided, dropped.
    pub(super) stale_bodies_total: u64,
    /// Leaders: late votes on transactions forgotten (or refused) here, dropped.
    pub(super) stale_votes_total: u64,
    /// Leaders: proposals answered with a refusal, and proposals dropped on one.
    pub(super) refused_sent_total: u64,
    pub(super) refused_total: u64,
    /// Followers: transactions released here that the leader's log will never list at
    /// their timestamp, dropped.
    pub(super) tail_dropped_total: u64,
    /// Followers: transactions released here that a conflicting entry above them in the
    /// synced prefix superseded (the leader's log will not hold them there either).
    pub(super) tail_superseded_total: u64,
    /// Leaders: journal checkpoints written, and restarts that started from one.
    pub(super) checkpoints_total: u64,
    pub(super) resumed_from_checkpoint_total: u64,
    /// Followers restarted from their journals (not by a state transfer).
    pub(super) followers_resumed_total: u64,
    /// Checkpoints put off because a follower's image could not be cut.
    pub(super) checkpoints_put_off_total: u64,
    /// The bytes of the last checkpoint written.
    pub(super) checkpoint_bytes_last: u64,
    /// Views installed, replicas retired by one, logs rebuilt and led, merges that failed,
    /// and reports over the limit not sent.
    pub(super) views_installed_total: u64,
    pub(super) views_refused_total: u64,
    pub(super) retired_total: u64,
    pub(super) views_led_total: u64,
    /// New leaders that took up the state they had dropped to rejoin (see
    /// [`Hosted::stashed`]).
    pub(super) led_from_stash_total: u64,
    /// Deposed leaders that led on from the state they kept (see [`Hosted::deposed`]), and
    /// those whose kept state a replica that held the log later made void.
    pub(super) views_resumed_total: u64,
    pub(super) deposed_void_total: u64,
    /// Views installed with another agreement mode than the one before.
    pub(super) mode_changes_total: u64,
    pub(super) view_changes_failed_total: u64,
    pub(super) reports_oversized_total: u64,
}

/// `[(name, value), ...]` with every name prefixed by the variant's protocol name.
macro_rules! prefixed {
    ($variant:expr, [$(($name:literal, $value:expr)),* $(,)?]) => {
        match $variant.prefix {
            Prefix::Tiga => vec![$((concat!("tiga_", $name), $value)),*],
            Prefix::Luigi => vec![$((concat!("luigi_", $name), $value)),*],
        }
    };
}
pub(super) use prefixed;

impl TigaNode {
    /// Every counter and gauge, named for the variant.
    pub(super) fn named_counters(&self) -> Vec<(&'static str, u64)> {
        let hosted = || self.hosted.values();
        let sum = |f: &dyn Fn(&Hosted) -> u64| hosted().map(f).sum::<u64>();
        let dropped = sum(&|h| h.replica.dropped_total());
        let unexecuted = sum(&|h| {
            if h.replica.leads() {
                0
            } else {
                (h.replica.log_len() - h.follow.executed) as u64
            }
        });
        let c = &self.counts;
        let mut named = prefixed!(
            self.variant,
            [
                ("resends_total", c.resends_total),
                ("dropped_total", c.dropped_total + dropped),
                ("vote_waits_total", c.votes_waited_total),
                ("held", sum(&|h| h.replica.held() as u64)),
                ("unexecuted", unexecuted),
                ("queued", sum(&|h| (h.lead.queued.len() + h.lead.pending.len()) as u64)),
                ("in_flight", self.requests.len() as u64),
                ("store_versions", sum(&|h| h.store.version_count())),
                ("store_keys", sum(&|h| h.store.key_count() as u64)),
                ("answers_kept", sum(&|h| h.answers.len() as u64)),
                // Log entries held (past what every replica executed), followers' dropped
                // transactions still known as logged, and what still grows with the run: the
                // leaders' sets of logged transactions (one per entry) and multi-shard outcomes.
                ("log_entries", sum(&|h| (h.replica.log_len() - h.replica.log_base()) as u64)),
                ("log_lingering", sum(&|h| h.replica.lingering() as u64)),
                ("stale_bodies_total", c.stale_bodies_total),
                ("stale_votes_total", c.stale_votes_total),
                ("refusals_sent_total", c.refused_sent_total),
                ("refused_total", c.refused_total),
                ("decided_kept", sum(&|h| h.lead.decided.len() as u64)),
                ("logged_kept", sum(&|h| h.replica.logged_count() as u64)),
                ("stale_view_total", c.stale_view_total),
                ("contradicted_total", c.contradicted_total),
                ("state_transfers_total", c.transfers_total),
                ("rejoined_total", c.rejoined_total),
                ("journal_records_total", self.journal.records_total),
                ("journal_sends_dropped_total", self.journal.dropped_total),
                ("journal_live_records", self.journal.live()),
                ("checkpoints_total", c.checkpoints_total),
                ("resumed_from_checkpoint_total", c.resumed_from_checkpoint_total),
                ("followers_resumed_total", c.followers_resumed_total),
                ("checkpoints_put_off_total", c.checkpoints_put_off_total),
                ("checkpoint_bytes_last", c.checkpoint_bytes_last),
                ("journal_bytes_total", self.journal.bytes_total),
                ("replayed_total", c.replayed_total),
                ("restored_proposals_total", c.restored_proposals_total),
                ("followers_behind_total", c.behind_total),
                ("went_behind_total", c.went_behind_total),
                ("bodies_high_water", c.bodies_high),
                ("views_installed_total", c.views_installed_total),
                ("views_refused_total", c.views_refused_total),
                ("views_led_total", c.views_led_total),
                ("views_led_from_stash_total", c.led_from_stash_total),
                ("views_resumed_total", c.views_resumed_total),
                ("deposed_states_void_total", c.deposed_void_total),
                ("view_changes_failed_total", c.view_changes_failed_total),
                ("replicas_retired_total", c.retired_total),
                ("reports_oversized_total", c.reports_oversized_total),
            ]
        );
        match self.variant.prefix {
            Prefix::Tiga => named.extend([
                ("tiga_fast_commits_total", c.fast_total),
                ("tiga_slow_commits_total", c.slow_total),
                ("tiga_fast_quorum_after_slow_total", self.tracker.fast_after_slow_total()),
                ("tiga_snapshot_reads_total", c.snapshot_reads_total),
                ("tiga_snapshots_served_total", c.snapshot_served_total),
                ("tiga_speculated_total", c.speculated_total),
                ("tiga_speculations_kept_total", c.speculations_kept_total),
                ("tiga_revoked_total", c.revoked_total),
                ("tiga_speculations", sum(&|h| h.lead.speculations.len() as u64)),
                ("tiga_tail_dropped_total", c.tail_dropped_total),
                ("tiga_tail_superseded_total", c.tail_superseded_total),
                ("tiga_tail_entries", sum(&|h| h.replica.tail_len() as u64)),
                ("tiga_unlisted_kept", sum(&|h| h.follow.unlisted.len() as u64)),
                ("tiga_mode_changes_total", c.mode_changes_total),
            ]),
            Prefix::Luigi => {
                let open = hosted().filter_map(|h| h.lead.streams.as_ref()).map(|s| s.open());
                named.extend([
                    ("luigi_commits_total", c.slow_total),
                    ("luigi_awaiting_watermark", self.awaiting.len() as u64),
                    ("luigi_unreplicated", open.sum::<usize>() as u64),
                ]);
            }
        }
        named.extend(self.manager_counters());
        named
    }
}
