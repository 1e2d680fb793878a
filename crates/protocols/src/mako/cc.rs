//! `mako`'s concurrency control in the two-phase commit engine: `occ`'s validation on the
//! leader's speculative state, inside epochs. The shard's epoch and watermark are part of its
//! replicated state (see the module documentation of `crate::mako`). Every replica applies the
//! same ticks and epoch changes in log order, so a speculating leader and its followers agree
//! on them; the node reads the committed state's for reports and the speculative state's for
//! what to log next.

use super::watermark::{candidate, Report, Watermarks, STABLES_REPORTED};
use super::Entry;
use crate::engine::participant::{Concurrency, Core, Participant, Rules};
use crate::engine::{Conflict, ExecFailure, PrepareArgs, Vote};
use crate::kit::exec::PieceRun;
use crate::kit::twopc::Decision;
use meridian_core::txn::{Args, ProcId};
use meridian_core::{ShardId, Time, Timestamp, TxnId};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// A shard's epoch and watermark.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct MakoState {
    /// The shard's epoch.
    epoch: u64,
    /// Set once the end of `epoch` is applied (the epoch is closing): the shard's final.
    final_w: Option<Timestamp>,
    /// The shard's watermark in `epoch`: the candidate at its last tick.
    w: Timestamp,
    /// Stable points of the epochs this shard closed last, oldest first.
    stables: VecDeque<(u64, Timestamp)>,
    epochs_started: u64,
    discarded_versions: u64,
    aborted_at_start: u64,
    /// Entries that did not apply (a duplicate end, a start out of turn).
    entries_ignored: u64,
    /// Leader-only: this leader has not yet closed an epoch since it took over (its
    /// predecessor's speculative state may be lost), so it must before anything else.
    #[serde(skip)]
    must_close: bool,
    /// Measurement only, this replica's own (not replicated, not in images): the longest
    /// causal chain (wide-area legs) among the calls that applied commands since the last
    /// tick that covered everything applied, and that chain as of the last tick, which its
    /// reports pass on.
    #[serde(skip)]
    chain_since_tick: u16,
    #[serde(skip)]
    chain_covered: u16,
}

impl MakoState {
    /// Checks an image's part (from a snapshot): a bad one is an error.
    fn check(&self) -> Result<(), String> {
        if self.stables.len() > STABLES_REPORTED {
            return Err(format!(
                "{} stable points (at most {STABLES_REPORTED})",
                self.stables.len()
            ));
        }
        if self.final_w.is_some_and(|f| f < self.w) {
            return Err("a final below the watermark".into());
        }
        Ok(())
    }
}

/// `mako`'s part of a participant: the shard's epoch and watermark, and how far this copy's
/// history may be collected.
#[derive(Default)]
pub(crate) struct Epochs {
    state: MakoState,
    /// The node's durable point; the GC watermark stays at or below it (local).
    gc_cap: Option<Timestamp>,
}

impl Epochs {
    /// Why an attempt of `epoch` may not prepare or commit here: another epoch, or this one
    /// is closing.
    fn refusal(&self, epoch: u64) -> Option<Conflict> {
        let m = &self.state;
        (epoch != m.epoch || m.final_w.is_some()).then_some(Conflict::Epoch)
    }

    /// Applies a tick or an epoch change.
    fn apply(&mut self, core: &mut Core, entry: Entry) {
        let lowest = core.lowest_proposal();
        let m = &mut self.state;
        match entry {
            Entry::Tick { now } => {
                if m.final_w.is_some() {
                    return; // Frozen at its final.
                }
                core.ts_last = core.ts_last.max(Timestamp(now));
                let c = candidate(core.ts_last, lowest);
                debug_assert!(c >= m.w, "the watermark went back from {:?} to {c:?}", m.w);
                m.w = m.w.max(c);
                // A prepared attempt holds the watermark below commits applied after it:
                // their chains stay for the tick that covers them.
                m.chain_covered = m.chain_since_tick;
                if lowest.is_none() {
                    m.chain_since_tick = 0;
                }
            }
            Entry::EpochEnd { epoch } => {
                if epoch != m.epoch || m.final_w.is_some() {
                    m.entries_ignored += 1;
                    return;
                }
                m.final_w = Some(m.w);
                m.must_close = false;
            }
            Entry::EpochStart { epoch, stable, now } => {
                let in_turn =
                    epoch == m.epoch + 1 && m.final_w.is_some_and(|final_w| stable <= final_w);
                if !in_turn {
                    m.entries_ignored += 1;
                    return;
                }
                m.epoch = epoch;
                m.final_w = None;
                m.w = stable;
                m.stables.push_back((epoch - 1, stable));
                if m.stables.len() > STABLES_REPORTED {
                    m.stables.pop_front();
                }
                m.epochs_started += 1;
                // Every prepared attempt aborts: its vote belongs to the closed epoch (its
                // coordinator's commit, if any, is above the stable point and discarded).
                let txns: Vec<TxnId> = core.prepared.keys().copied().collect();
                let aborted = txns.len() as u64;
                for txn in txns {
                    core.on_decision(now, txn, Decision::Aborted);
                }
                assert!(
                    core.store.gc_watermark() <= stable,
                    "history above stable point {stable:?} was collected"
                );
                let removed = core.store.discard_above(stable);
                let m = &mut self.state;
                m.discarded_versions += removed;
                m.aborted_at_start += aborted;
            }
        }
    }
}

impl Concurrency for Epochs {
    /// History stays: a discard falls back to an older version.
    fn rules(&self) -> Rules {
        Rules { pending_writes: false, keeps_history: true }
    }

    fn fork(&self) -> Option<Box<dyn Concurrency>> {
        Some(Box::new(Epochs { state: self.state.clone(), gc_cap: self.gc_cap }))
    }

    /// A new term of this leader (its speculative state is fresh).
    fn on_leadership(&mut self, _core: &mut Core, leads: bool) {
        if leads {
            self.state.must_close = true;
        }
    }

    /// Its ticks and epoch changes.
    fn has_entries(&self) -> bool {
        true
    }

    /// A command is applied in a call at the end of a causal chain of `chain` wide-area legs
    /// (measurement only; the tick that covers it passes it on).
    fn before_apply(&mut self, _core: &mut Core, _now: Option<Time>, chain: u16) {
        let m = &mut self.state;
        m.chain_since_tick = m.chain_since_tick.max(chain);
    }

    fn prepare(&mut self, core: &mut Core, now: Time, txn: TxnId, args: PrepareArgs) -> Vote {
        let refused = self.refusal(args.epoch);
        core.prepare_validated(now, txn, args, refused)
    }

    fn execute_commit(
        &mut self,
        core: &mut Core,
        now: Time,
        txn: TxnId,
        _ts: Timestamp,
        epoch: u64,
        proc: ProcId,
        args: &Args,
    ) -> Result<(Vec<PieceRun>, Option<Timestamp>), ExecFailure> {
        core.execute_commit_validated(now, txn, self.refusal(epoch), proc, args)
    }

    fn apply_entry(&mut self, core: &mut Core, entry: Entry) {
        self.apply(core, entry);
    }

    /// Keeps `gc_retention_ns` of history, and everything a discard may fall back to.
    fn gc(&mut self, core: &mut Core, _now: Time) {
        let retention = core.context.timing.gc_retention_ns;
        core.raise_watermark(retention, Some(self.gc_cap.unwrap_or(Timestamp::ZERO)));
    }

    fn counters(&self, counters: &mut Vec<(&'static str, u64)>) {
        let m = &self.state;
        counters.extend([
            ("mako_epoch", m.epoch),
            ("mako_epochs_started_total", m.epochs_started),
            ("mako_discarded_versions_total", m.discarded_versions),
            ("mako_aborted_at_epoch_start_total", m.aborted_at_start),
            ("mako_entries_ignored_total", m.entries_ignored),
        ]);
    }

    fn image(&self) -> Vec<u8> {
        postcard::to_allocvec(&self.state).expect("images encode")
    }

    fn check_image(&self, bytes: &[u8]) -> Result<(), String> {
        let state: MakoState = postcard::from_bytes(bytes)
            .map_err(|e| format!("the epoch state in a snapshot does not decode: {e}"))?;
        state.check()
    }

    /// Versions of the old state that the image's discarded must go; the image holds every
    /// version of the keys written since the load.
    fn before_install(&mut self, core: &mut Core) {
        core.store.forget_writes();
    }

    fn install_image(&mut self, _core: &mut Core, bytes: &[u8], _watermark: Timestamp) {
        self.state = postcard::from_bytes(bytes).expect("checked at decode");
    }
}

/// `mako`'s entry points on a participant, for the node (`None`, or nothing done, under the
/// other protocols).
impl Participant {
    /// Applies a tick or an epoch change (the log applies them through the engine).
    #[cfg(test)]
    pub(crate) fn apply_mako(&mut self, entry: Entry) {
        if let Some((epochs, core)) = self.cc_mut::<Epochs>() {
            epochs.apply(core, entry);
        }
    }

    /// On the leader's speculative state: the entry to log next. The end of the epoch when
    /// this leader is new or another shard closed it; the next epoch's start once its stable
    /// point is known; otherwise a tick, at the clock or at the highest watermark another
    /// shard reported in the epoch, whichever is later. `None` while waiting for finals.
    pub(crate) fn mako_next(&self, tracker: &Watermarks, now: Time) -> Option<Entry> {
        let m = &self.cc::<Epochs>()?.state;
        if m.final_w.is_some() {
            let stable = tracker.stable(m.epoch)?;
            return Some(Entry::EpochStart { epoch: m.epoch + 1, stable, now });
        }
        if m.must_close || tracker.is_closing(m.epoch) || tracker.epoch() > m.epoch {
            return Some(Entry::EpochEnd { epoch: m.epoch });
        }
        // The clock, or the highest watermark heard in this epoch when the clock is behind
        // it (a leader restarted with its clock set back would otherwise keep the global
        // watermark, and every commit's reply, behind by the clock's lag).
        let heard = if tracker.epoch() == m.epoch { tracker.highest() } else { None };
        Some(Entry::Tick { now: heard.map_or(now, |h| now.max(h.0)) })
    }

    /// On a leader's speculative state: the end of the epoch when this leader has not closed
    /// one since it took over.
    pub(crate) fn mako_close_entry(&self) -> Option<Entry> {
        let m = &self.cc::<Epochs>()?.state;
        (m.must_close && m.final_w.is_none()).then_some(Entry::EpochEnd { epoch: m.epoch })
    }

    /// On the committed state: what the shard's leader reports, and the causal chain of the
    /// commands its watermark covers (measurement only).
    pub(crate) fn mako_report(&self, shard: ShardId) -> Option<(Report, u16)> {
        let m = &self.cc::<Epochs>()?.state;
        let report = Report {
            shard,
            epoch: m.epoch,
            w: m.w,
            final_w: m.final_w,
            stables: m.stables.iter().copied().collect(),
        };
        Some((report, m.chain_covered))
    }

    /// How far this copy's history may be collected, from its own epoch: never above the
    /// stable point its next epoch start will discard to (a discard falls back to the newest
    /// version at or below it). In the node's newest epoch, open here, that is the durable
    /// point the node knows (every later stable point is at least it); a copy that is behind
    /// (its epoch closing, or older than the node's) gets its epoch's stable point once
    /// known, else the one its last epoch start used.
    pub(crate) fn set_gc_cap(&mut self, tracker: &Watermarks) {
        let Some((epochs, _)) = self.cc_mut::<Epochs>() else { return };
        let m = &epochs.state;
        let current = m.epoch == tracker.epoch() && m.final_w.is_none();
        let cap = if current {
            tracker.durable_floor()
        } else {
            tracker
                .stable(m.epoch)
                .or_else(|| m.stables.back().map(|&(_, s)| s))
                .unwrap_or(Timestamp::ZERO)
        };
        epochs.gc_cap = Some(cap);
    }
}
