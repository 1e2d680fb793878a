//! The execution locks of one `2pl` shard leader: the lock table of the attempts running
//! pieces here, the executions waiting for a lock under wound-wait, and the attempts doomed by
//! a refusal, a wound or an expired lease. Leader-only state: it is not replicated, and a
//! leader change drops it (see the module documentation of `twopl`).
//!
//! Invariants (asserted in debug builds): an attempt waits for at most one execution at a
//! time; a waiting attempt is listed as executing; a doomed attempt holds no lock here.

use crate::kit::locks::{Acquire, Granted, LockTable, Mode, Policy};
use meridian_core::key::Key;
use meridian_core::txn::ScanRange;
use meridian_core::{NodeId, Time, TxnId};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// A lock an execution needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// A key in a mode.
    Key(Key, Mode),
    /// A shared lock on a scanned range.
    Range(ScanRange),
}

/// Why an attempt can no longer commit here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Doom {
    /// A lock it asked for was refused.
    Denied,
    /// An older attempt wounded it.
    Wounded,
    /// It was idle longer than the lease.
    Expired,
}

/// What asking for an execution's locks gave.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step<R> {
    /// Every lock is held: run it.
    Run(R),
    /// It waits (wound-wait); it comes back from a later release as ready.
    Parked,
    /// Refused: the attempt is doomed here and its locks are released.
    Denied,
}

/// Executions a release made runnable, and waiting executions of doomed attempts (to be
/// answered with the reason).
pub(crate) struct Released<R> {
    pub(crate) ready: Vec<(NodeId, R)>,
    pub(crate) refused: Vec<(NodeId, R, Doom)>,
}

impl<R> Released<R> {
    pub(crate) fn new() -> Self {
        Self { ready: Vec::new(), refused: Vec::new() }
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.ready.is_empty() && self.refused.is_empty()
    }
}

/// An attempt holding execution locks here.
#[derive(Debug)]
struct Holder {
    priority: u64,
    last_active: Time,
    /// Its prepare (or one-round commit) is on its way into the log: it may no longer be
    /// wounded, and its lease does not run.
    committing: bool,
}

/// An execution waiting for a lock.
#[derive(Debug)]
struct Parked<R> {
    origin: NodeId,
    request: R,
    needs: Vec<Need>,
    /// Index of the first need not yet granted.
    next: usize,
}

/// Most doomed attempts remembered (forgotten in arrival order beyond it; a forgotten one
/// still fails its prepare, which checks that the locks are held).
pub(crate) const DOOMED_MAX: usize = 1 << 16;

/// Execution locks of one leader.
#[derive(Debug)]
pub(crate) struct Locking<R> {
    policy: Policy,
    table: LockTable,
    executing: BTreeMap<TxnId, Holder>,
    parked: BTreeMap<TxnId, Parked<R>>,
    doomed: BTreeMap<TxnId, Doom>,
    doomed_order: VecDeque<TxnId>,
    /// Counters: refusals, wounds inflicted, waits, leases expired, and the time executions
    /// spent waiting for locks.
    pub(crate) denied_total: u64,
    pub(crate) wounded_total: u64,
    pub(crate) waits_total: u64,
    pub(crate) expired_total: u64,
    pub(crate) wait_ns_total: u64,
    /// When each parked execution started waiting.
    parked_at: BTreeMap<TxnId, Time>,
}

impl<R> Locking<R> {
    pub(crate) fn new(policy: Policy) -> Self {
        Self {
            policy,
            table: LockTable::new(),
            executing: BTreeMap::new(),
            parked: BTreeMap::new(),
            doomed: BTreeMap::new(),
            doomed_order: VecDeque::new(),
            denied_total: 0,
            wounded_total: 0,
            waits_total: 0,
            expired_total: 0,
            wait_ns_total: 0,
            parked_at: BTreeMap::new(),
        }
    }

    /// Why `txn` cannot commit here, if it was refused, wounded or expired.
    pub(crate) fn doom_of(&self, txn: TxnId) -> Option<Doom> {
        self.doomed.get(&txn).copied()
    }

    /// True when `txn` holds (or waits for) execution locks here.
    pub(crate) fn holds(&self, txn: TxnId) -> bool {
        self.executing.contains_key(&txn)
    }

    /// True when an execution of `txn` waits for a lock here.
    pub(crate) fn is_waiting(&self, txn: TxnId) -> bool {
        self.parked.contains_key(&txn)
    }

    /// Attempts holding (or waiting for) execution locks here.
    pub(crate) fn holder_count(&self) -> usize {
        self.executing.len()
    }

    /// True when no attempt holds or waits for execution locks here.
    pub(crate) fn is_idle(&self) -> bool {
        self.executing.is_empty()
    }

    /// Attempts holding execution locks, executions waiting, and keys locked.
    pub(crate) fn gauges(&self) -> (u64, u64, u64) {
        (self.executing.len() as u64, self.parked.len() as u64, self.table.locked_keys() as u64)
    }

    fn doom(&mut self, txn: TxnId, why: Doom) {
        if self.doomed.insert(txn, why).is_none() {
            self.doomed_order.push_back(txn);
            while self.doomed_order.len() > DOOMED_MAX {
                if let Some(old) = self.doomed_order.pop_front() {
                    self.doomed.remove(&old);
                }
            }
        }
    }

    /// Asks for the locks `needs` lists for `txn`'s execution `request` from `origin`, under
    /// the policy. Wounds free executions of other attempts, which come back in `released`.
    /// The caller drops executions of an attempt already waiting here (duplicates: the
    /// coordinator has one execution per shard in flight).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn execute(
        &mut self,
        txn: TxnId,
        priority: u64,
        origin: NodeId,
        request: R,
        needs: Vec<Need>,
        now: Time,
        released: &mut Released<R>,
    ) -> Step<(NodeId, R)> {
        debug_assert!(!self.parked.contains_key(&txn), "{txn} executes while waiting");
        let holder = self.executing.entry(txn).or_insert(Holder {
            priority,
            last_active: now,
            committing: false,
        });
        holder.last_active = now;
        let parked = Parked { origin, request, needs, next: 0 };
        self.advance(txn, parked, now, released)
    }

    /// Takes `needs` for a one-round commit at once, never waiting or wounding whatever the
    /// policy (it holds nothing while it would wait). False, with nothing held, on a conflict.
    pub(crate) fn lock_now(&mut self, txn: TxnId, needs: &[Need], now: Time) -> bool {
        debug_assert!(!self.executing.contains_key(&txn), "{txn} commits in one round twice");
        for need in needs {
            let answer = match need {
                Need::Key(key, mode) => self.table.acquire(txn, 0, key, *mode, Policy::NoWait),
                Need::Range(range) => self.table.acquire_range(txn, 0, range, Policy::NoWait),
            };
            if answer != Acquire::Granted {
                self.denied_total += 1;
                let granted = self.table.release_all(txn);
                debug_assert!(granted.is_empty(), "no-wait requests never queue");
                return false;
            }
        }
        self.executing.insert(txn, Holder { priority: 0, last_active: now, committing: true });
        true
    }

    /// Takes `parked`'s locks from where it stopped; wounds, waits or is refused as the policy
    /// says.
    fn advance(
        &mut self,
        txn: TxnId,
        mut parked: Parked<R>,
        now: Time,
        released: &mut Released<R>,
    ) -> Step<(NodeId, R)> {
        let priority = self.executing.get(&txn).map_or(0, |h| h.priority);
        while parked.next < parked.needs.len() {
            let answer = match &parked.needs[parked.next] {
                Need::Key(key, mode) => self.table.acquire(txn, priority, key, *mode, self.policy),
                Need::Range(range) => self.table.acquire_range(txn, priority, range, self.policy),
            };
            match answer {
                Acquire::Granted => parked.next += 1,
                Acquire::Denied(_) => {
                    self.denied_total += 1;
                    self.release_doomed(txn, Doom::Denied, now, released);
                    return Step::Denied;
                }
                Acquire::Wait { wound } => {
                    let mut wounded_any = false;
                    for victim in wound {
                        if self.executing.get(&victim).is_some_and(|h| !h.committing) {
                            wounded_any = true;
                            self.wounded_total += 1;
                            self.release_doomed(victim, Doom::Wounded, now, released);
                        }
                    }
                    match &parked.needs[parked.next] {
                        // Ranges have no queue: ask again once the wounded are gone, or give
                        // up when only committing (unwoundable) writers stand in the way.
                        Need::Range(_) if wounded_any => continue,
                        Need::Range(_) => {
                            self.denied_total += 1;
                            self.release_doomed(txn, Doom::Denied, now, released);
                            return Step::Denied;
                        }
                        // The wounds may have granted this very lock (it was first in line).
                        Need::Key(key, mode) if self.table.holds_key(txn, key, *mode) => {
                            parked.next += 1;
                        }
                        Need::Key(..) => {
                            self.waits_total += 1;
                            self.parked_at.insert(txn, now);
                            self.parked.insert(txn, parked);
                            return Step::Parked;
                        }
                    }
                }
            }
        }
        Step::Run((parked.origin, parked.request))
    }

    /// Releases everything `txn` holds or waits for here and dooms it.
    fn release_doomed(&mut self, txn: TxnId, why: Doom, now: Time, released: &mut Released<R>) {
        self.doom(txn, why);
        self.forget(txn, now, why, released);
    }

    /// Drops `txn`'s holder and waiting execution (answered as refused for `why`), releases
    /// its locks and continues the executions that unblocks.
    fn forget(&mut self, txn: TxnId, now: Time, why: Doom, released: &mut Released<R>) {
        self.executing.remove(&txn);
        self.parked_at.remove(&txn);
        if let Some(parked) = self.parked.remove(&txn) {
            released.refused.push((parked.origin, parked.request, why));
        }
        let granted = self.table.release_all(txn);
        self.resume(granted, now, released);
    }

    /// Continues the executions that `granted` (from a release) unblocked.
    fn resume(&mut self, granted: Vec<Granted>, now: Time, released: &mut Released<R>) {
        let waiters: BTreeSet<TxnId> = granted.into_iter().map(|g| g.txn).collect();
        for txn in waiters {
            let Some(mut parked) = self.parked.remove(&txn) else { continue };
            if let Some(since) = self.parked_at.remove(&txn) {
                self.wait_ns_total += now.saturating_sub(since);
            }
            if let Some(holder) = self.executing.get_mut(&txn) {
                holder.last_active = now;
            }
            parked.next += 1; // The lock it waited for is the one granted.
            if let Step::Run(run) = self.advance(txn, parked, now, released) {
                released.ready.push(run);
            }
        }
    }

    /// `txn` was decided (or refused a prepare) here: its execution locks go, and the
    /// executions waiting for them continue.
    pub(crate) fn release(&mut self, txn: TxnId, now: Time, released: &mut Released<R>) {
        if self.executing.contains_key(&txn) {
            self.forget(txn, now, Doom::Denied, released);
        }
    }

    /// `txn`'s coordinator gave it up before it prepared (its abort is on its way into the
    /// log): release its locks now rather than a log round later, and refuse it from now on.
    /// An attempt already committing keeps its locks until the log decides.
    pub(crate) fn abandon(&mut self, txn: TxnId, now: Time, released: &mut Released<R>) {
        if self.executing.get(&txn).is_some_and(|h| !h.committing) {
            self.release_doomed(txn, Doom::Denied, now, released);
        }
    }

    /// `txn` found a conflict outside this table (a prepared attempt a previous leader
    /// admitted): refuse it as if its lock were denied.
    pub(crate) fn deny(&mut self, txn: TxnId, now: Time, released: &mut Released<R>) {
        self.denied_total += 1;
        self.release_doomed(txn, Doom::Denied, now, released);
    }

    /// `txn` is about to prepare: true when it holds the keys of `reads` (shared) and `writes`
    /// (exclusive) here and was not refused, wounded or expired; from now on it cannot be
    /// wounded.
    pub(crate) fn start_prepare<'a>(
        &mut self,
        txn: TxnId,
        reads: impl IntoIterator<Item = &'a Key>,
        writes: impl IntoIterator<Item = &'a Key>,
    ) -> bool {
        if self.doomed.contains_key(&txn) || self.parked.contains_key(&txn) {
            return false;
        }
        if !self.table.holds_all(txn, reads, writes) {
            return false;
        }
        match self.executing.get_mut(&txn) {
            Some(holder) => {
                holder.committing = true;
                true
            }
            None => false,
        }
    }

    /// Releases the locks of attempts idle for `lease_ns` (not waiting, not committing):
    /// their coordinator is gone or cut off.
    pub(crate) fn expire(&mut self, now: Time, lease_ns: u64, released: &mut Released<R>) {
        let idle: Vec<TxnId> = self
            .executing
            .iter()
            .filter(|(txn, h)| {
                !h.committing
                    && !self.parked.contains_key(txn)
                    && now.saturating_sub(h.last_active) >= lease_ns
            })
            .map(|(&t, _)| t)
            .collect();
        for txn in idle {
            self.expired_total += 1;
            self.release_doomed(txn, Doom::Expired, now, released);
        }
    }

    /// This replica started or stopped leading: execution locks and waits are void.
    pub(crate) fn clear(&mut self) {
        self.table = LockTable::new();
        self.executing.clear();
        self.parked.clear();
        self.parked_at.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(seq: u64) -> TxnId {
        TxnId { origin: NodeId(0), incarnation: 0, seq }
    }

    fn k(s: &str) -> Key {
        Key::from(s.as_bytes().to_vec())
    }

    fn x(key: &str) -> Need {
        Need::Key(k(key), Mode::Exclusive)
    }

    #[test]
    fn no_wait_denies_and_dooms_the_requester() {
        let mut l: Locking<u32> = Locking::new(Policy::NoWait);
        let mut r = Released::new();
        assert_eq!(
            l.execute(t(1), 1, NodeId(0), 1, vec![x("a")], 0, &mut r),
            Step::Run((NodeId(0), 1))
        );
        assert_eq!(l.execute(t(2), 2, NodeId(0), 2, vec![x("b"), x("a")], 0, &mut r), Step::Denied);
        assert_eq!(l.doom_of(t(2)), Some(Doom::Denied));
        // The denied attempt's other lock was released: a third takes "b".
        assert_eq!(
            l.execute(t(3), 3, NodeId(0), 3, vec![x("b")], 0, &mut r),
            Step::Run((NodeId(0), 3))
        );
        assert!(r.is_empty());
        assert!(!l.start_prepare(t(2), [], [&k("b")]));
        assert!(l.start_prepare(t(1), [], [&k("a")]));
    }

    #[test]
    fn wound_wait_wounds_younger_and_older_waits_are_resumed() {
        let mut l: Locking<u32> = Locking::new(Policy::WoundWait);
        let mut r = Released::new();
        // Younger (priority 5) holds "a"; older (priority 1) wounds it and runs.
        assert!(matches!(l.execute(t(5), 5, NodeId(0), 5, vec![x("a")], 0, &mut r), Step::Run(_)));
        assert!(matches!(l.execute(t(1), 1, NodeId(0), 1, vec![x("a")], 10, &mut r), Step::Run(_)));
        assert_eq!(l.doom_of(t(5)), Some(Doom::Wounded));
        // A younger one now waits for the older one, and runs when it is released.
        assert_eq!(l.execute(t(7), 7, NodeId(1), 7, vec![x("a")], 20, &mut r), Step::Parked);
        assert!(!l.start_prepare(t(7), [], [&k("a")]), "a waiting attempt cannot prepare");
        l.release(t(1), 50, &mut r);
        assert_eq!(r.ready, vec![(NodeId(1), 7)]);
        assert_eq!(l.wait_ns_total, 30);
        assert!(l.start_prepare(t(7), [], [&k("a")]));
    }

    #[test]
    fn committing_attempts_are_not_wounded_and_leases_expire_idle_ones() {
        let mut l: Locking<u32> = Locking::new(Policy::WoundWait);
        let mut r = Released::new();
        assert!(matches!(l.execute(t(5), 5, NodeId(0), 5, vec![x("a")], 0, &mut r), Step::Run(_)));
        assert!(l.start_prepare(t(5), [], [&k("a")]));
        // An older attempt may not wound a preparing one: it waits.
        assert_eq!(l.execute(t(1), 1, NodeId(0), 1, vec![x("a")], 0, &mut r), Step::Parked);
        assert_eq!(l.doom_of(t(5)), None);
        // Leases skip committing and waiting attempts; an idle one expires.
        assert!(matches!(l.execute(t(9), 9, NodeId(0), 9, vec![x("z")], 0, &mut r), Step::Run(_)));
        l.expire(1_000, 500, &mut r);
        assert_eq!(l.doom_of(t(9)), Some(Doom::Expired));
        assert_eq!(l.doom_of(t(1)), None);
        assert_eq!(l.doom_of(t(5)), None);
        assert_eq!(l.expired_total, 1);
    }

    #[test]
    fn one_round_commits_never_wait() {
        let mut l: Locking<u32> = Locking::new(Policy::WoundWait);
        let mut r = Released::new();
        assert!(matches!(l.execute(t(5), 5, NodeId(0), 5, vec![x("a")], 0, &mut r), Step::Run(_)));
        assert!(!l.lock_now(t(1), &[x("b"), x("a")], 0));
        assert!(l.lock_now(t(2), &[x("b")], 0), "the refused one released b");
        assert_eq!(l.gauges().1, 0);
    }
}
