//! Two-phase commit machinery shared by the layered protocols: what a participant remembers
//! of decided attempts, how participants decide among themselves when a coordinator goes
//! quiet, and how a coordinator delivers a decision until every participant has it.
//!
//! # The decided cache and the forgetting rule
//!
//! A participant remembers every attempt it decided (committed, aborted, or refused so that a
//! late prepare cannot commit it) in a [`DecidedCache`] of at most `decided_max` entries.
//! Forgetting must never turn into a wrong answer. Two rules make sure of it:
//!
//! - **Commits are kept until settled**: a commit with other participants is *settled* once
//!   every participant of the attempt is known to have applied it (the coordinator says so after collecting every
//!   acknowledgement, or a participant finds it out by asking its peers). Only aborts and
//!   settled commits are evicted. So a participant still prepared on an attempt that some
//!   peer committed always finds that peer remembering the commit.
//! - **Forgotten is not aborted**: when an entry is evicted, the participant raises a
//!   low-water mark for the entry's coordinator incarnation. Asked about an attempt at or
//!   below the mark that it no longer holds, it answers [`Known::Forgotten`] ("unknown"),
//!   never "aborted", and never refuses it as if it were new.
//!
//! Together: a prepared participant that hears "forgotten" from a peer knows the peer decided
//! an abort (a commit it would still hold, since this participant has not applied it), while a
//! coordinator that hears it for an attempt it has not decided reports the outcome as unknown.
//!
//! To keep commits until settled within a bound, a participant refuses new prepares once its
//! unsettled commits and prepared attempts reach `decided_max` (see
//! [`DecidedCache::has_room`]).

use meridian_core::hash::FixedHashMap;
use meridian_core::{NodeId, ShardId, Time, Timestamp, TxnId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// What a participant decided about an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// Committed at this timestamp.
    Committed(Timestamp),
    /// Aborted.
    Aborted,
}

/// Where an attempt stands at one participant, as it answers a query.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerState {
    /// Prepared (voted yes) with this proposal; not decided.
    Prepared(Timestamp),
    /// Decided.
    Decided(Decision),
    /// Decided once and forgotten since (see the module documentation).
    Forgotten,
}

/// What the cache knows about an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Known {
    /// Decided, and remembered.
    Decided(Decision),
    /// At or below its coordinator's low-water mark and not held: decided once, forgotten.
    Forgotten,
    /// Never decided here.
    Unseen,
}

/// An unsettled commit: the attempt's participants (to ask when settling it by inquiry) and
/// when it was decided here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Unsettled {
    participants: Vec<ShardId>,
    decided_at: Time,
}

/// The low-water mark of one coordinator node: its newest incarnation with evicted entries,
/// and the largest sequence number evicted in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Mark {
    incarnation: u64,
    seq_max: u64,
}

/// The decided attempts of one participant. Deterministic: every replica that applies the
/// same commands evicts the same entries.
///
/// Layout: the decisions sit in one hash map of small entries (it is on the path of every
/// request); the few unsettled commits keep their participants and time in a second one.
#[derive(Clone, Debug)]
pub struct DecidedCache {
    decided: FixedHashMap<TxnId, Decision>,
    unsettled: FixedHashMap<TxnId, Unsettled>,
    /// Evictable attempts (aborts, settled commits) with their decisions, oldest first: every
    /// id here is in `decided` with that decision and not in `unsettled` (asserted), so a
    /// snapshot copies the queue without a lookup per entry (snapshots of a swarm's small
    /// intervals spent 40% of the run in those lookups).
    evictable: VecDeque<(TxnId, Decision)>,
    /// Unsettled commits in decision order; settled ones stay until dropped in bulk.
    unsettled_order: VecDeque<TxnId>,
    marks: BTreeMap<NodeId, Mark>,
    decided_max: usize,
    evicted_total: u64,
}

/// A cache's state as a snapshot carries it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DecidedImage {
    /// Evictable decisions, oldest first.
    evictable: Vec<(TxnId, Decision)>,
    /// Unsettled commits, oldest first.
    unsettled: Vec<(TxnId, Decision, Unsettled)>,
    marks: Vec<(NodeId, Mark)>,
    evicted_total: u64,
}

impl DecidedImage {
    /// Checks an image decoded from a snapshot against this node's limit.
    pub fn check(&self, decided_max: usize) -> Result<(), String> {
        let held = self.evictable.len() + self.unsettled.len();
        if held > decided_max.saturating_mul(2) {
            return Err(format!(
                "snapshot remembers {held} decisions, over twice the limit of {decided_max}"
            ));
        }
        // No attempt in both queues: installed, it would be evictable while unsettled. (A
        // repeat within one queue is harmless, `install` keeps the first; older builds could
        // write one.)
        let unsettled: BTreeSet<TxnId> = self.unsettled.iter().map(|u| u.0).collect();
        if let Some((twice, _)) = self.evictable.iter().find(|(t, _)| unsettled.contains(t)) {
            return Err(format!("snapshot remembers {twice} twice, settled and unsettled"));
        }
        Ok(())
    }
}

impl DecidedCache {
    /// An empty cache holding at most about `decided_max` decisions.
    pub fn new(decided_max: usize) -> Self {
        assert!(decided_max >= 1, "the decided cache needs room for one decision");
        Self {
            decided: FixedHashMap::default(),
            unsettled: FixedHashMap::default(),
            evictable: VecDeque::new(),
            unsettled_order: VecDeque::new(),
            marks: BTreeMap::new(),
            decided_max,
            evicted_total: 0,
        }
    }

    /// What is known about `txn`.
    pub fn get(&self, txn: TxnId) -> Known {
        if let Some(&decision) = self.decided.get(&txn) {
            return Known::Decided(decision);
        }
        match self.marks.get(&txn.origin) {
            Some(mark)
                if txn.incarnation < mark.incarnation
                    || (txn.incarnation == mark.incarnation && txn.seq <= mark.seq_max) =>
            {
                Known::Forgotten
            }
            _ => Known::Unseen,
        }
    }

    /// True when a new prepare or one-round commit may be accepted: the unsettled commits plus
    /// `prepared` attempts (each may commit) stay within the limit, so no commit ever has to
    /// be forgotten before it is settled.
    pub fn has_room(&self, prepared: usize) -> bool {
        self.unsettled.len() + prepared < self.decided_max
    }

    /// Remembers a decision. A commit with other participants (`participants`: the other
    /// shards, asked when settling it by inquiry) stays until [`DecidedCache::settle`]d; an
    /// abort, or a commit of this shard alone, may be evicted as soon as the cache is full
    /// (no participant can be left waiting for it; a coordinator asking after that hears
    /// "forgotten" and reports the outcome unknown). Returns false when `txn`
    /// was already decided (the first decision stands).
    pub fn remember(
        &mut self,
        txn: TxnId,
        decision: Decision,
        participants: Vec<ShardId>,
        now: Time,
    ) -> bool {
        match self.decided.entry(txn) {
            std::collections::hash_map::Entry::Occupied(_) => return false,
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(decision);
            }
        }
        match decision {
            Decision::Committed(_) if !participants.is_empty() => {
                self.unsettled.insert(txn, Unsettled { participants, decided_at: now });
                self.unsettled_order.push_back(txn);
            }
            // An abort, or a commit no other participant needs to hear of.
            _ => self.evictable.push_back((txn, decision)),
        }
        if self.decided.len() > self.decided_max {
            self.evict();
        }
        true
    }

    /// Every participant of `txn` has its decision: it may be forgotten from now on.
    pub fn settle(&mut self, txn: TxnId) {
        if self.unsettled.remove(&txn).is_none() {
            return;
        }
        let decision = self.decided[&txn];
        self.evictable.push_back((txn, decision));
        if self.decided.len() > self.decided_max {
            self.evict();
        }
        // Settled ids stay in the order queue until they outnumber the unsettled ones; then
        // they go in one pass (amortized: each id is dropped once).
        if self.unsettled_order.len() > 2 * self.unsettled.len() + 64 {
            let unsettled = &self.unsettled;
            self.unsettled_order.retain(|t| unsettled.contains_key(t));
        }
    }

    /// Evicts the oldest evictable entries while over the limit.
    fn evict(&mut self) {
        while self.decided.len() > self.decided_max {
            let Some((txn, _)) = self.evictable.pop_front() else { break };
            let removed = self.decided.remove(&txn);
            debug_assert!(
                removed.is_some() && !self.unsettled.contains_key(&txn),
                "{txn} is evictable, so decided and settled"
            );
            self.evicted_total += 1;
            let mark = self.marks.entry(txn.origin).or_default();
            if txn.incarnation > mark.incarnation {
                *mark = Mark { incarnation: txn.incarnation, seq_max: txn.seq };
            } else if txn.incarnation == mark.incarnation {
                mark.seq_max = mark.seq_max.max(txn.seq);
            }
        }
        debug_assert!(self.unsettled.len() <= self.decided.len());
    }

    /// Unsettled commits decided at or before `before`, oldest first, at most `max`: the ones
    /// a participant should settle by asking its peers. With their other participants.
    pub fn unsettled_before(&self, before: Time, max: usize) -> Vec<(TxnId, Vec<ShardId>)> {
        self.unsettled_order
            .iter()
            .filter_map(|txn| self.unsettled.get(txn).map(|u| (*txn, u)))
            .take_while(|(_, u)| u.decided_at <= before)
            .take(max)
            .map(|(txn, u)| (txn, u.participants.clone()))
            .collect()
    }

    /// Decisions held.
    pub fn len(&self) -> usize {
        self.decided.len()
    }

    /// True when none is held.
    pub fn is_empty(&self) -> bool {
        self.decided.is_empty()
    }

    /// Unsettled commits held.
    pub fn unsettled_count(&self) -> usize {
        self.unsettled.len()
    }

    /// Decisions evicted so far.
    pub fn evicted_total(&self) -> u64 {
        self.evicted_total
    }

    /// The state for a snapshot: each queue's entries in its order (what eviction needs).
    pub fn image(&self) -> DecidedImage {
        debug_assert!(self.evictable.len() + self.unsettled.len() == self.decided.len());
        let evictable = self.evictable.iter().copied().collect();
        let unsettled = self
            .unsettled_order
            .iter()
            .filter_map(|t| {
                let u = self.unsettled.get(t)?;
                Some((*t, *self.decided.get(t)?, u.clone()))
            })
            .collect();
        DecidedImage {
            evictable,
            unsettled,
            marks: self.marks.iter().map(|(&n, &m)| (n, m)).collect(),
            evicted_total: self.evicted_total,
        }
    }

    /// Replaces the state by a snapshot's.
    pub fn install(&mut self, image: DecidedImage) {
        let decided_max = self.decided_max;
        *self = Self::new(decided_max);
        for (txn, decision) in image.evictable {
            if self.decided.insert(txn, decision).is_none() {
                self.evictable.push_back((txn, decision));
            }
        }
        for (txn, decision, unsettled) in image.unsettled {
            self.decided.insert(txn, decision);
            if self.unsettled.insert(txn, unsettled).is_none() {
                self.unsettled_order.push_back(txn);
            }
        }
        self.marks = image.marks.into_iter().collect();
        self.evicted_total = image.evicted_total;
        self.evict();
    }
}

/// How a participant decides an attempt with its peers (no coordinator): any peer that
/// decided settles it; a peer that forgot it decided an abort (it would still hold an
/// unsettled commit: see the module documentation); every peer prepared means the coordinator
/// could only have committed, at the largest proposal. `None`: not yet known.
pub fn termination_verdict(
    own_proposal: Timestamp,
    peers: &[ShardId],
    states: &BTreeMap<ShardId, PeerState>,
) -> Option<Decision> {
    let mut ts_max = own_proposal;
    let mut all_prepared = true;
    for shard in peers {
        match states.get(shard) {
            Some(PeerState::Decided(decision)) => return Some(*decision),
            Some(PeerState::Forgotten) => return Some(Decision::Aborted),
            Some(PeerState::Prepared(p)) => ts_max = ts_max.max(*p),
            None => all_prepared = false,
        }
    }
    all_prepared.then_some(Decision::Committed(ts_max))
}

/// Why a participant asks its peers about an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asking {
    /// It is prepared and its coordinator went quiet: decide with the peers.
    Terminate,
    /// It holds an old unsettled commit: find out whether every peer has it.
    Settle(Decision),
}

/// One attempt a participant is asking its peers about.
#[derive(Debug)]
struct Inquiry {
    purpose: Asking,
    peers: Vec<ShardId>,
    states: BTreeMap<ShardId, PeerState>,
    ask_at: Time,
    /// Asked at least once already.
    asked: bool,
}

/// The attempts a participant's leader is asking its peers about, paced: each peer that has
/// not answered is asked again once per `interval_ns` (a network round trip and then some), at
/// most `inquiries_max` attempts at once. Leader-only state; not replicated.
#[derive(Debug)]
pub struct Inquiries {
    open: BTreeMap<TxnId, Inquiry>,
    inquiries_max: usize,
}

impl Inquiries {
    /// An empty table.
    pub fn new(inquiries_max: usize) -> Self {
        Self { open: BTreeMap::new(), inquiries_max }
    }

    /// Starts asking about `txn` (no-op when already asking or full); returns true when new.
    pub fn open(&mut self, txn: TxnId, purpose: Asking, peers: Vec<ShardId>, now: Time) -> bool {
        if self.open.contains_key(&txn) || self.open.len() >= self.inquiries_max {
            return false;
        }
        self.open.insert(
            txn,
            Inquiry { purpose, peers, states: BTreeMap::new(), ask_at: now, asked: false },
        );
        true
    }

    /// True when asking about `txn`.
    pub fn contains(&self, txn: TxnId) -> bool {
        self.open.contains_key(&txn)
    }

    /// The queries due now: `(txn, peer shard, again)`, each peer without an answer of each
    /// attempt whose time has come (`again` when it was asked before and did not answer);
    /// those attempts are due again `interval_ns` later.
    pub fn due(&mut self, now: Time, interval_ns: u64) -> Vec<(TxnId, ShardId, bool)> {
        let mut queries = Vec::new();
        for (&txn, inquiry) in self.open.iter_mut().filter(|(_, i)| i.ask_at <= now) {
            inquiry.ask_at = now + interval_ns;
            for &peer in &inquiry.peers {
                if !inquiry.states.contains_key(&peer) {
                    queries.push((txn, peer, inquiry.asked));
                }
            }
            inquiry.asked = true;
        }
        queries
    }

    /// A peer's answer. Returns what the inquiry concluded, if it did (and closes it).
    pub fn on_state(
        &mut self,
        txn: TxnId,
        peer: ShardId,
        state: PeerState,
        own_proposal: Option<Timestamp>,
    ) -> Option<Concluded> {
        let inquiry = self.open.get_mut(&txn)?;
        if !inquiry.peers.contains(&peer) {
            return None;
        }
        inquiry.states.insert(peer, state);
        let concluded = match inquiry.purpose {
            Asking::Terminate => {
                let own = own_proposal?;
                Concluded::Decided(termination_verdict(own, &inquiry.peers, &inquiry.states)?)
            }
            Asking::Settle(decision) => {
                if let PeerState::Prepared(_) = state {
                    // That peer never heard: it needs the decision, and will be asked again.
                    inquiry.states.remove(&peer);
                    return Some(Concluded::Tell(peer, decision));
                }
                if inquiry.states.len() < inquiry.peers.len() {
                    return None;
                }
                Concluded::Settled
            }
        };
        self.open.remove(&txn);
        Some(concluded)
    }

    /// Stops asking about `txn` (decided or settled another way).
    pub fn close(&mut self, txn: TxnId) {
        self.open.remove(&txn);
    }

    /// Forgets everything (leadership lost).
    pub fn clear(&mut self) {
        self.open.clear();
    }

    /// Attempts being asked about.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// True when none.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

/// What an inquiry found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Concluded {
    /// Termination: the attempt's decision.
    Decided(Decision),
    /// Settling: every peer has the decision.
    Settled,
    /// Settling: this peer is still prepared and must be told the decision.
    Tell(ShardId, Decision),
}

/// A decision a coordinator is still delivering.
#[derive(Debug)]
struct Delivering {
    decision: Decision,
    unacked: BTreeSet<ShardId>,
    participants: Vec<ShardId>,
    resend_at: Time,
}

/// A coordinator's decisions in delivery: each goes again, paced by `interval_ns`, to the
/// participants that have not acknowledged it; once all have, it is settled and each
/// participant is told so in the next batch. At most `deliveries_max` at once: a coordinator
/// that reaches it takes no new requests ([`Delivery::is_full`]).
#[derive(Debug)]
pub struct Delivery {
    open: BTreeMap<TxnId, Delivering>,
    /// Settled attempts to announce, per shard.
    settled: BTreeMap<ShardId, Vec<TxnId>>,
    deliveries_max: usize,
}

/// Most attempts one settle announcement names.
pub const SETTLE_BATCH_MAX: usize = 4_096;

impl Delivery {
    /// An empty table.
    pub fn new(deliveries_max: usize) -> Self {
        Self { open: BTreeMap::new(), settled: BTreeMap::new(), deliveries_max }
    }

    /// True when no new request should start until deliveries complete.
    pub fn is_full(&self) -> bool {
        self.open.len() >= self.deliveries_max
    }

    /// Starts delivering `decision` on `txn` to `participants` (the caller sent the first
    /// copies). An attempt with no participant is settled at once.
    pub fn start(
        &mut self,
        txn: TxnId,
        decision: Decision,
        participants: Vec<ShardId>,
        now: Time,
        interval_ns: u64,
    ) {
        let unacked: BTreeSet<ShardId> = participants.iter().copied().collect();
        if unacked.is_empty() {
            return;
        }
        let resend_at = now + interval_ns;
        self.open.insert(txn, Delivering { decision, unacked, participants, resend_at });
    }

    /// `shard` acknowledged `txn`'s decision. Returns true when `txn` was being delivered.
    pub fn on_ack(&mut self, txn: TxnId, shard: ShardId) -> bool {
        let Some(delivering) = self.open.get_mut(&txn) else { return false };
        delivering.unacked.remove(&shard);
        if delivering.unacked.is_empty() {
            let done = self.open.remove(&txn).expect("present");
            if matches!(done.decision, Decision::Committed(_)) {
                for shard in done.participants {
                    self.settled.entry(shard).or_default().push(txn);
                }
            }
        }
        true
    }

    /// The decisions to send again now: `(txn, shard, decision)`.
    pub fn due(&mut self, now: Time, interval_ns: u64) -> Vec<(TxnId, ShardId, Decision)> {
        let mut resend = Vec::new();
        for (&txn, d) in self.open.iter_mut().filter(|(_, d)| d.resend_at <= now) {
            d.resend_at = now + interval_ns;
            resend.extend(d.unacked.iter().map(|&shard| (txn, shard, d.decision)));
        }
        resend
    }

    /// The settle announcements to send now, at most [`SETTLE_BATCH_MAX`] attempts each.
    pub fn take_settled(&mut self) -> Vec<(ShardId, Vec<TxnId>)> {
        let mut batches = Vec::new();
        for (shard, txns) in std::mem::take(&mut self.settled) {
            for chunk in txns.chunks(SETTLE_BATCH_MAX) {
                batches.push((shard, chunk.to_vec()));
            }
        }
        batches
    }

    /// Decisions in delivery.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// True when none.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(seq: u64) -> TxnId {
        TxnId { origin: NodeId(9), incarnation: 1, seq }
    }

    const S0: ShardId = ShardId(0);
    const S1: ShardId = ShardId(1);

    #[test]
    fn aborts_are_evicted_first_and_forgotten_is_never_unseen() {
        let mut cache = DecidedCache::new(2);
        assert!(cache.remember(txn(1), Decision::Aborted, vec![], 0));
        assert!(cache.remember(txn(2), Decision::Committed(Timestamp(5)), vec![S0, S1], 0));
        assert!(cache.remember(txn(3), Decision::Aborted, vec![], 0));
        // Over the limit: the oldest abort went; the unsettled commit stays.
        assert_eq!(cache.get(txn(1)), Known::Forgotten);
        assert_eq!(cache.get(txn(2)), Known::Decided(Decision::Committed(Timestamp(5))));
        // An attempt never seen above the mark is unseen; one below it that was never held
        // is reported forgotten too (the mark cannot tell them apart, and unknown is safe).
        assert_eq!(cache.get(txn(4)), Known::Unseen);
        assert!(cache.remember(txn(5), Decision::Aborted, vec![], 0));
        assert_eq!(cache.get(txn(3)), Known::Forgotten);
        assert_eq!(cache.get(txn(2)), Known::Decided(Decision::Committed(Timestamp(5))));
        // An older incarnation below a newer one's mark is forgotten; a newer one is unseen.
        let old = TxnId { origin: NodeId(9), incarnation: 0, seq: 99 };
        let new = TxnId { origin: NodeId(9), incarnation: 2, seq: 0 };
        assert_eq!(cache.get(old), Known::Forgotten);
        assert_eq!(cache.get(new), Known::Unseen);
        // Other coordinators are unaffected.
        assert_eq!(cache.get(TxnId { origin: NodeId(1), incarnation: 1, seq: 1 }), Known::Unseen);
    }

    #[test]
    fn a_commit_is_kept_until_settled_and_room_is_refused_meanwhile() {
        let mut cache = DecidedCache::new(2);
        cache.remember(txn(1), Decision::Committed(Timestamp(1)), vec![S0, S1], 0);
        assert!(cache.has_room(0));
        assert!(!cache.has_room(1), "one unsettled commit plus one prepared fill a cache of 2");
        cache.remember(txn(2), Decision::Committed(Timestamp(2)), vec![S0, S1], 0);
        cache.remember(txn(3), Decision::Aborted, vec![], 0);
        assert_eq!(cache.get(txn(3)), Known::Forgotten, "the abort made room, not a commit");
        assert_eq!(cache.unsettled_count(), 2);
        assert_eq!(cache.unsettled_before(10, 8).len(), 2);
        cache.settle(txn(1));
        cache.settle(txn(1));
        assert_eq!(cache.unsettled_count(), 1);
        cache.remember(txn(4), Decision::Aborted, vec![], 0);
        assert_eq!(cache.get(txn(1)), Known::Forgotten, "settled, then evicted");
        assert_eq!(cache.get(txn(2)), Known::Decided(Decision::Committed(Timestamp(2))));
    }

    #[test]
    fn the_image_restores_the_same_cache() {
        let mut cache = DecidedCache::new(3);
        for seq in 1..=6 {
            let decision =
                if seq % 2 == 0 { Decision::Committed(Timestamp(seq)) } else { Decision::Aborted };
            cache.remember(txn(seq), decision, vec![S0, S1], seq);
        }
        cache.settle(txn(2));
        let image = cache.image();
        let bytes = postcard::to_allocvec(&image).unwrap();
        let mut restored = DecidedCache::new(3);
        restored.install(postcard::from_bytes(&bytes).unwrap());
        for seq in 0..=8 {
            assert_eq!(restored.get(txn(seq)), cache.get(txn(seq)), "seq {seq}");
        }
        assert_eq!(restored.unsettled_count(), cache.unsettled_count());
        assert!(image.check(3).is_ok());
    }

    /// An image that names an attempt in both queues is refused: installed, the attempt would
    /// be evictable while unsettled.
    #[test]
    fn an_image_naming_an_attempt_settled_and_unsettled_is_refused() {
        let mut cache = DecidedCache::new(8);
        cache.remember(txn(1), Decision::Aborted, vec![], 0);
        cache.remember(txn(2), Decision::Committed(Timestamp(2)), vec![S0, S1], 0);
        let mut image = cache.image();
        assert!(image.check(8).is_ok());
        image.evictable.push((txn(1), Decision::Aborted));
        assert!(image.check(8).is_ok(), "a repeat in one queue is tolerated");
        image.evictable.push((txn(2), Decision::Committed(Timestamp(2))));
        let why = image.check(8).unwrap_err();
        assert!(why.contains("twice"), "{why}");
    }

    #[test]
    fn termination_reads_forgotten_as_abort_and_all_prepared_as_commit() {
        let peers = [S0, S1];
        let mut states = BTreeMap::new();
        assert_eq!(termination_verdict(Timestamp(3), &peers, &states), None);
        states.insert(S0, PeerState::Prepared(Timestamp(7)));
        assert_eq!(termination_verdict(Timestamp(3), &peers, &states), None);
        states.insert(S1, PeerState::Prepared(Timestamp(5)));
        assert_eq!(
            termination_verdict(Timestamp(3), &peers, &states),
            Some(Decision::Committed(Timestamp(7)))
        );
        states.insert(S1, PeerState::Forgotten);
        assert_eq!(termination_verdict(Timestamp(3), &peers, &states), Some(Decision::Aborted));
    }

    #[test]
    fn inquiries_are_paced_and_settle_once_every_peer_has_the_decision() {
        let mut asking = Inquiries::new(4);
        let committed = Decision::Committed(Timestamp(4));
        assert!(asking.open(txn(1), Asking::Settle(committed), vec![S0, S1], 100));
        assert!(!asking.open(txn(1), Asking::Terminate, vec![S0], 100));
        assert_eq!(asking.due(100, 50), vec![(txn(1), S0, false), (txn(1), S1, false)]);
        assert!(asking.due(120, 50).is_empty(), "paced");
        assert_eq!(
            asking.on_state(txn(1), S1, PeerState::Prepared(Timestamp(1)), None),
            Some(Concluded::Tell(S1, committed))
        );
        assert_eq!(asking.on_state(txn(1), S0, PeerState::Decided(committed), None), None);
        assert_eq!(
            asking.due(150, 50),
            vec![(txn(1), S1, true)],
            "only the peer without an answer"
        );
        assert_eq!(
            asking.on_state(txn(1), S1, PeerState::Forgotten, None),
            Some(Concluded::Settled)
        );
        assert!(asking.is_empty());
    }

    #[test]
    fn delivery_resends_to_the_unacknowledged_and_settles_commits() {
        let mut delivery = Delivery::new(1);
        let committed = Decision::Committed(Timestamp(4));
        delivery.start(txn(1), committed, vec![S0, S1], 0, 10);
        assert!(delivery.is_full());
        assert!(delivery.due(5, 10).is_empty());
        assert!(delivery.on_ack(txn(1), S0));
        assert_eq!(delivery.due(10, 10), vec![(txn(1), S1, committed)]);
        assert!(delivery.take_settled().is_empty());
        delivery.on_ack(txn(1), S1);
        assert!(!delivery.is_full());
        assert_eq!(delivery.take_settled(), vec![(S0, vec![txn(1)]), (S1, vec![txn(1)])]);
        assert!(!delivery.on_ack(txn(1), S1), "finished");
    }
}
