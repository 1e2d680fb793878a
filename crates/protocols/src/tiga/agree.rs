//! Timestamp agreement among the leaders of a multi-shard transaction's shards (Tiga
//! §3.5–3.6). Single-shard transactions skip it.
//!
//! Each participant leader proposes the timestamp it holds the transaction at (after its own
//! bump, if any) to the other participant leaders; all of them take the largest proposal.
//!
//! - **Case 1**, every proposal equal: release at it.
//! - **Case 2**, this leader's proposal is the largest and some other is smaller: release only
//!   after every leader with a smaller proposal has confirmed that it moved the transaction to
//!   the agreed timestamp. Releasing earlier would let such a shard still order a conflicting
//!   single-shard transaction between the two timestamps after this one, an inversion no
//!   per-shard order catches (Tiga Fig. 5; NCC, OSDI'23).
//! - **Case 3**, this leader's proposal is smaller: move the transaction to the agreed
//!   timestamp (in detective mode, revoking what it executed), confirm to the other leaders,
//!   and release it there.
//!
//! A proposal or confirmation may arrive before the transaction itself; they are kept. A
//! second, different proposal from the same shard (a duplicate of a stale view's) does not
//! replace the first: proposals of one view never change, and messages of other views are
//! dropped before they get here.
//!
//! **A view change** that gives a participant shard a new leader starts the agreement again
//! ([`Agreement::restart`]): the new leader proposes where it holds the transaction now, which
//! need not be where its predecessor did, so every participant proposes again and every
//! proposal and confirmation of the old view goes. A leader's new proposal is where it holds
//! the transaction, after any move made for the old agreement: no leader's position goes
//! back, and a leader that released the transaction in the old view answers with its log's
//! timestamp, which the old agreement made the largest of all.

use meridian_core::{ShardId, Timestamp};
use std::collections::{BTreeMap, BTreeSet};

/// What a leader should do with the transaction now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not every proposal is in (its own included).
    Waiting,
    /// Case 2: the agreed timestamp is this leader's; waiting for the confirmations of the
    /// leaders whose proposals were smaller.
    AwaitConfirms(Timestamp),
    /// Case 3: move the transaction to this timestamp, then call
    /// [`Agreement::repositioned`] and confirm to the other leaders.
    Reposition(Timestamp),
    /// Release at this timestamp (cases 1, 2 once confirmed, 3 once moved).
    Release(Timestamp),
}

/// One leader's view of the agreement on one transaction.
#[derive(Clone, Debug)]
pub struct Agreement {
    me: ShardId,
    participants: BTreeSet<ShardId>,
    proposals: BTreeMap<ShardId, Timestamp>,
    confirmed: BTreeSet<ShardId>,
    /// Case 3 done: this leader moved the transaction to the agreed timestamp.
    moved: bool,
}

impl Agreement {
    /// The agreement of shard `me`'s leader with the leaders of `participants` (which include
    /// `me`, and at least one other shard).
    pub fn new(me: ShardId, participants: impl IntoIterator<Item = ShardId>) -> Self {
        let participants: BTreeSet<ShardId> = participants.into_iter().collect();
        assert!(
            participants.contains(&me) && participants.len() >= 2,
            "agreement of {me:?} among {participants:?}"
        );
        Self {
            me,
            participants,
            proposals: BTreeMap::new(),
            confirmed: BTreeSet::new(),
            moved: false,
        }
    }

    /// Every participant shard, this leader's included.
    pub fn participants(&self) -> impl Iterator<Item = ShardId> + '_ {
        self.participants.iter().copied()
    }

    /// This leader's own proposal, once made.
    pub fn own(&self) -> Option<Timestamp> {
        self.proposals.get(&self.me).copied()
    }

    /// True when the leader of `shard` proposed (it took the transaction).
    pub fn heard(&self, shard: ShardId) -> bool {
        self.proposals.contains_key(&shard)
    }

    /// True once this leader moved the transaction to the agreed timestamp (case 3).
    pub fn moved(&self) -> bool {
        self.moved
    }

    /// This leader's own proposal (the first one stands).
    pub fn propose(&mut self, ts: Timestamp) {
        self.proposals.entry(self.me).or_insert(ts);
    }

    /// A view change gave a participant a new leader: every proposal and confirmation heard
    /// goes, and this leader's own proposal becomes `held_at`, where it holds the transaction
    /// now (none while it has not arrived here). Returns the new proposal.
    pub fn restart(&mut self, held_at: Option<Timestamp>) -> Option<Timestamp> {
        if let (Some(own), Some(at)) = (self.own(), held_at) {
            debug_assert!(at >= own, "a held transaction moved below its proposal");
        }
        self.proposals.clear();
        self.confirmed.clear();
        self.moved = false;
        if let Some(at) = held_at {
            self.proposals.insert(self.me, at);
        }
        held_at
    }

    /// Another leader's proposal. False when `from` is not a participant (dropped).
    pub fn on_proposal(&mut self, from: ShardId, ts: Timestamp) -> bool {
        if from == self.me || !self.participants.contains(&from) {
            return false;
        }
        self.proposals.entry(from).or_insert(ts);
        true
    }

    /// Another leader confirms that it moved the transaction to the agreed timestamp. False
    /// when `from` is not a participant.
    pub fn on_confirm(&mut self, from: ShardId) -> bool {
        if from == self.me || !self.participants.contains(&from) {
            return false;
        }
        self.confirmed.insert(from);
        true
    }

    /// This leader moved the transaction to the agreed timestamp (after
    /// [`Verdict::Reposition`]).
    pub fn repositioned(&mut self) {
        debug_assert!(matches!(self.verdict(), Verdict::Reposition(_)), "nothing to move");
        self.moved = true;
    }

    /// True when another leader proposed a later timestamp than this one's own: the
    /// transaction will move (a detective leader does not run it where it is).
    pub fn outbid(&self) -> bool {
        self.own().is_some_and(|own| self.proposals.values().any(|&ts| ts > own))
    }

    /// The agreed timestamp, once every proposal is in.
    pub fn agreed(&self) -> Option<Timestamp> {
        if self.proposals.len() < self.participants.len() {
            return None;
        }
        self.proposals.values().copied().max()
    }

    /// What to do now.
    pub fn verdict(&self) -> Verdict {
        let Some(agreed) = self.agreed() else { return Verdict::Waiting };
        let mine = self.proposals[&self.me];
        if mine < agreed {
            return if self.moved { Verdict::Release(agreed) } else { Verdict::Reposition(agreed) };
        }
        let behind = self.proposals.iter().filter(|&(_, &ts)| ts < agreed).map(|(&s, _)| s);
        if behind.clone().all(|s| self.confirmed.contains(&s)) {
            Verdict::Release(agreed)
        } else {
            Verdict::AwaitConfirms(agreed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: ShardId = ShardId(0);
    const B: ShardId = ShardId(1);
    const C: ShardId = ShardId(2);

    #[test]
    fn case_1_equal_proposals_release_at_once() {
        let mut a = Agreement::new(A, [A, B]);
        assert_eq!(a.verdict(), Verdict::Waiting);
        a.on_proposal(B, Timestamp(50));
        assert_eq!(a.verdict(), Verdict::Waiting, "its own proposal is missing");
        a.propose(Timestamp(50));
        assert_eq!(a.verdict(), Verdict::Release(Timestamp(50)));
    }

    #[test]
    fn case_2_the_largest_waits_for_every_smaller_proposer_to_confirm() {
        let mut c = Agreement::new(C, [A, B, C]);
        c.propose(Timestamp(70));
        c.on_proposal(A, Timestamp(50));
        c.on_proposal(B, Timestamp(70));
        assert_eq!(c.verdict(), Verdict::AwaitConfirms(Timestamp(70)));
        c.on_confirm(B);
        assert_eq!(c.verdict(), Verdict::AwaitConfirms(Timestamp(70)), "B was not behind");
        c.on_confirm(A);
        assert_eq!(c.verdict(), Verdict::Release(Timestamp(70)));
    }

    #[test]
    fn case_3_a_smaller_proposer_moves_then_releases_at_the_agreed_timestamp() {
        let mut a = Agreement::new(A, [A, B]);
        a.propose(Timestamp(50));
        a.on_proposal(B, Timestamp(70));
        assert_eq!(a.verdict(), Verdict::Reposition(Timestamp(70)));
        a.repositioned();
        assert_eq!(a.verdict(), Verdict::Release(Timestamp(70)));
    }

    #[test]
    fn a_restart_forgets_the_old_view_and_proposes_where_the_transaction_is_held() {
        let mut a = Agreement::new(A, [A, B, C]);
        a.propose(Timestamp(50));
        a.on_proposal(B, Timestamp(70));
        a.on_proposal(C, Timestamp(60));
        assert_eq!(a.verdict(), Verdict::Reposition(Timestamp(70)));
        a.repositioned();
        // B's leader is replaced: A holds the transaction at 70 now.
        assert_eq!(a.restart(Some(Timestamp(70))), Some(Timestamp(70)));
        assert!(!a.moved() && !a.heard(B) && !a.heard(C));
        assert_eq!(a.verdict(), Verdict::Waiting, "every peer proposes again");
        a.on_proposal(B, Timestamp(90));
        a.on_proposal(C, Timestamp(70));
        assert_eq!(a.verdict(), Verdict::Reposition(Timestamp(90)), "the new leader's is larger");
        let mut b = Agreement::new(B, [A, B]);
        b.on_confirm(A);
        assert_eq!(b.restart(None), None);
        b.propose(Timestamp(40));
        b.on_proposal(A, Timestamp(30));
        assert_eq!(
            b.verdict(),
            Verdict::AwaitConfirms(Timestamp(40)),
            "a confirmation of the old view does not count"
        );
    }

    #[test]
    fn early_late_and_foreign_messages_are_handled() {
        let mut b = Agreement::new(B, [A, B]);
        assert!(b.on_confirm(A), "a confirmation may come before anything else");
        assert!(b.on_proposal(A, Timestamp(40)));
        assert!(!b.on_proposal(C, Timestamp(99)), "not a participant");
        assert!(!b.on_proposal(B, Timestamp(99)), "its own shard is not a peer");
        b.on_proposal(A, Timestamp(90));
        b.propose(Timestamp(60));
        b.propose(Timestamp(10));
        assert_eq!(b.agreed(), Some(Timestamp(60)), "first proposals stand");
        assert_eq!(b.verdict(), Verdict::Release(Timestamp(60)), "A already confirmed");
    }
}
