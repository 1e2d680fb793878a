use super::*;
use meridian_core::NodeId;

const A: ShardId = ShardId(0);
const B: ShardId = ShardId(1);

fn txn(seq: u64) -> TxnId {
    TxnId { origin: NodeId(9), incarnation: 1, seq }
}

fn key(k: u64) -> Key {
    Key::table(1).u64(k).build()
}

fn limits() -> ReplicaLimits {
    ReplicaLimits {
        held_max: 64,
        keys_max: 1_024,
        tail_max: 64,
        agreements_max: 8,
        release_max: 64,
        shards_total: 3,
    }
}

/// A read-modify-write of `keys` on `shards`, stamped `ts`.
fn rmw(seq: u64, ts: u64, shards: &[ShardId], keys: &[u64]) -> Incoming {
    let keys: Vec<Key> = keys.iter().map(|&k| key(k)).collect();
    Incoming {
        txn: txn(seq),
        ts: Timestamp(ts),
        shards: shards.to_vec(),
        reads: keys.clone(),
        writes: keys,
    }
}

/// The fast replies among `actions`: (transaction, timestamp, hash).
fn fast(actions: &[Action]) -> Vec<(TxnId, Timestamp, u64)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::FastReply { txn, ts, hash } => Some((*txn, *ts, *hash)),
            _ => None,
        })
        .collect()
}

fn executed(actions: &[Action]) -> Vec<(TxnId, Timestamp)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Execute { txn, ts } => Some((*txn, *ts)),
            _ => None,
        })
        .collect()
}

fn slow(actions: &[Action]) -> Vec<(TxnId, Timestamp)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::SlowReply { txn, ts } => Some((*txn, *ts)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_single_shard_transaction_waits_for_its_time_then_every_replica_replies_alike() {
    let mut leader = Replica::new(A, true, limits());
    let mut follower = Replica::new(A, false, limits());
    for r in [&mut leader, &mut follower] {
        assert!(r.arrive(rmw(1, 100, &[A], &[7])).is_empty(), "single-shard: no agreement");
        assert!(r.tick(99).is_empty(), "held until the clock passes its timestamp");
    }
    let at_leader = leader.tick(100);
    assert_eq!(executed(&at_leader), [(txn(1), Timestamp(100))]);
    let at_follower = follower.tick(100);
    assert!(executed(&at_follower).is_empty(), "followers do not execute on release");
    assert_eq!(fast(&at_leader), fast(&at_follower), "same entry, same timestamp, same hash");
    assert_eq!(leader.log_since(0), [(txn(1), Timestamp(100))]);
    for r in [&mut leader, &mut follower] {
        assert!(r.arrive(rmw(5, 500, &[B], &[7])).is_empty(), "not a participant");
        assert!(r.arrive(rmw(6, 500, &[A, ShardId(3)], &[7])).is_empty(), "no shard 3");
        assert_eq!(r.held(), 0);
        assert!(r.arrive(rmw(1, 100, &[A], &[7])).is_empty(), "a retry changes nothing");
        assert!(r.tick(200).is_empty(), "released once, never again");
    }
}

#[test]
fn a_late_transaction_is_bumped_by_the_leader_and_placed_by_its_log_at_a_follower() {
    let mut leader = Replica::new(A, true, limits());
    let mut follower = Replica::new(A, false, limits());
    for r in [&mut leader, &mut follower] {
        r.arrive(rmw(1, 100, &[A], &[7]));
        r.tick(100);
        // Stamped below what was released on its key.
        assert!(r.arrive(rmw(2, 50, &[A], &[7])).is_empty());
    }
    assert_eq!(follower.held(), 0, "a late follower leaves the place to the leader");
    let bumped = leader.tick(101);
    assert_eq!(executed(&bumped), [(txn(2), Timestamp(101))], "bumped just past the release");
    // The leader's log reaches the follower, which holds transaction 2's body (it saw it).
    let keys = (vec![key(7)], vec![key(7)]);
    let synced = follower.on_sync(0, leader.log_since(0), |t| (t == txn(2)).then(|| keys.clone()));
    assert_eq!(slow(&synced), [(txn(1), Timestamp(100)), (txn(2), Timestamp(101))]);
    assert_eq!(follower.sync_point(), 2);
    // Both logs now hold the same entries on key 7: the next replies match.
    for r in [&mut leader, &mut follower] {
        r.arrive(rmw(3, 300, &[A], &[7]));
    }
    assert_eq!(fast(&leader.tick(300)), fast(&follower.tick(300)));
    // Resent entries change nothing.
    let again = follower.on_sync(0, &leader.log_since(0)[..2], |_| None);
    assert!(again.is_empty(), "{again:?}");
}

#[test]
fn a_follower_retimes_what_the_leader_placed_elsewhere_and_its_hashes_follow() {
    let mut leader = Replica::new(A, true, limits());
    let mut follower = Replica::new(A, false, limits());
    // The follower releases transaction 1 at its own stamp; the leader had bumped it.
    leader.arrive(rmw(9, 100, &[A], &[7]));
    leader.tick(100);
    leader.arrive(rmw(1, 90, &[A], &[7]));
    assert_eq!(executed(&leader.tick(101)), [(txn(1), Timestamp(101))]);
    follower.arrive(rmw(1, 90, &[A], &[7]));
    let own = fast(&follower.tick(90));
    assert_ne!(own[0].1, Timestamp(101), "released at the coordinator's stamp");
    // The follower has not seen transaction 9 yet: it is fetched, and the sync-point waits.
    let synced = follower.on_sync(0, leader.log_since(0), |_| None);
    assert!(synced.contains(&Action::Fetch { txns: vec![txn(9)] }), "{synced:?}");
    assert!(slow(&synced).is_empty(), "nothing syncs past a missing body");
    assert_eq!(
        // The coordinator's own copy arrives late: it is the fetched body.
        slow(&follower.arrive(rmw(9, 100, &[A], &[7]))),
        [(txn(9), Timestamp(100)), (txn(1), Timestamp(101))]
    );
    for r in [&mut leader, &mut follower] {
        r.arrive(rmw(3, 300, &[A], &[7]));
    }
    assert_eq!(fast(&leader.tick(300)), fast(&follower.tick(300)), "retimed: hashes agree again");
}

/// Case 2 and case 3 together: shard A's leader bumped the transaction above B's stamp. B
/// moves it and confirms; A holds it, not ready, until B's confirmation, so no transaction
/// can come between the two timestamps at A after it (the inversion case).
#[test]
fn the_largest_proposer_releases_only_after_the_smaller_one_moved() {
    let mut a = Replica::new(A, true, limits());
    let mut b = Replica::new(B, true, limits());
    a.arrive(rmw(9, 150, &[A], &[1]));
    a.tick(150);
    let proposal_a = a.arrive(rmw(1, 100, &[A, B], &[1]));
    assert_eq!(proposal_a, [Action::Propose { txn: txn(1), ts: Timestamp(151), to: vec![B] }]);
    // B hears A's proposal before the transaction itself: it is kept.
    assert!(b.on_proposal(A, txn(1), &[A, B], Timestamp(151)).is_empty());
    let at_b = b.arrive(rmw(1, 100, &[A, B], &[2]));
    assert_eq!(
        at_b,
        [
            Action::Propose { txn: txn(1), ts: Timestamp(100), to: vec![A] },
            Action::Confirm { txn: txn(1), to: vec![A] },
        ],
        "case 3: moved to the agreed timestamp and confirmed"
    );
    assert!(b.tick(150).is_empty(), "moved to 151");
    assert_eq!(executed(&b.tick(151)), [(txn(1), Timestamp(151))]);
    // A has every proposal but not B's confirmation yet: it holds on.
    assert!(a.on_proposal(B, txn(1), &[A, B], Timestamp(100)).is_empty());
    assert!(a.tick(500).is_empty(), "case 2: waits for the confirmation");
    // A later transaction on the same key waits behind it.
    a.arrive(rmw(2, 400, &[A], &[1]));
    assert!(a.tick(500).is_empty(), "held behind the unconfirmed transaction");
    assert!(a.on_confirm(B, txn(1), &[A, B]).is_empty());
    assert_eq!(executed(&a.tick(500)), [(txn(1), Timestamp(151)), (txn(2), Timestamp(400))]);
    // A proposal arriving after the release opens nothing: it is answered with the release.
    let answer = a.on_proposal(B, txn(1), &[A, B], Timestamp(100));
    assert_eq!(answer[0], Action::Propose { txn: txn(1), ts: Timestamp(151), to: vec![B] });
    assert!(a.tick(10_000).is_empty());
}

#[test]
fn equal_proposals_release_at_once() {
    let mut a = Replica::new(A, true, limits());
    let mut b = Replica::new(B, true, limits());
    a.arrive(rmw(1, 100, &[A, B], &[1]));
    b.arrive(rmw(1, 100, &[B, A], &[2]));
    assert!(a.on_proposal(B, txn(1), &[A, B], Timestamp(100)).is_empty());
    assert!(b.on_proposal(A, txn(1), &[A, B], Timestamp(100)).is_empty());
    assert_eq!(executed(&a.tick(100)), [(txn(1), Timestamp(100))]);
    assert_eq!(executed(&b.tick(100)), [(txn(1), Timestamp(100))]);
}

#[test]
fn agreements_are_bounded_and_a_forgotten_transaction_leaves() {
    let small = ReplicaLimits { agreements_max: 2, ..limits() };
    let mut a = Replica::new(A, true, small);
    // Two proposals for transactions not here yet fill the room.
    a.on_proposal(B, txn(1), &[A, B], Timestamp(10));
    a.on_proposal(B, txn(2), &[A, B], Timestamp(10));
    assert!(a.on_proposal(B, txn(3), &[A, B], Timestamp(10)).is_empty());
    assert_eq!(a.dropped_total(), 1);
    // No room for an arriving multi-shard transaction either: it is not held.
    assert!(a.arrive(rmw(4, 10, &[A, B], &[1])).is_empty());
    assert_eq!(a.held(), 0);
    assert_eq!(a.dropped_total(), 2);
    // Forgetting frees a place; a transaction this leader proposed is not forgotten.
    assert!(a.forget(txn(1)));
    assert_eq!(a.arrive(rmw(4, 10, &[A, B], &[1])).len(), 1, "proposed");
    assert_eq!(a.held(), 1);
    assert!(!a.forget(txn(4)), "another shard may release it at the agreed timestamp");
    assert_eq!(a.held(), 1);
    // A proposal from a shard outside the transaction, or for a shard list without this
    // one, opens nothing.
    a.forget(txn(2));
    assert!(a.on_proposal(B, txn(5), &[B, ShardId(2)], Timestamp(10)).is_empty());
    assert!(a.on_proposal(A, txn(5), &[A, B], Timestamp(10)).is_empty(), "from itself");
    assert!(a.on_proposal(ShardId(2), txn(5), &[A, B], Timestamp(10)).is_empty());
    assert!(a.on_proposal(B, txn(5), &[A, B, ShardId(9)], Timestamp(10)).is_empty());
    assert_eq!(a.dropped_total(), 2);
    // None of those took the free place.
    assert!(a.on_proposal(B, txn(6), &[A, B], Timestamp(10)).is_empty());
    assert_eq!(a.dropped_total(), 2, "room was left");
}

/// Many transactions on few keys, stamped out of order, at a leader and two followers that
/// each see a different subset arrive late: once every follower has synced, every replica's
/// next reply on every key matches the leader's.
#[test]
fn replicas_that_saw_different_arrivals_agree_once_synced() {
    use meridian_core::rng::{child_rng, uniform_u64};
    let mut rng = child_rng(7, "tiga-replica", 0);
    let mut leader = Replica::new(A, true, limits());
    let mut followers = [Replica::new(A, false, limits()), Replica::new(A, false, limits())];
    let mut bodies: BTreeMap<TxnId, PartKeys> = BTreeMap::new();
    let mut now = 100;
    let mut bumped = 0;
    let mut stamps: BTreeMap<TxnId, Timestamp> = BTreeMap::new();
    for seq in 0..40 {
        now += 5;
        // Some stamps fall below what was released already: late everywhere.
        let stamp = now - 15 + uniform_u64(&mut rng, 30);
        let incoming = rmw(seq, stamp, &[A], &[uniform_u64(&mut rng, 3)]);
        stamps.insert(incoming.txn, incoming.ts);
        let keys = part_keys(&incoming.reads, &incoming.writes);
        bodies.insert(incoming.txn, (keys, incoming.writes.clone()));
        leader.arrive(incoming.clone());
        for f in followers.iter_mut() {
            if uniform_u64(&mut rng, 4) != 0 {
                f.arrive(incoming.clone());
            }
        }
        for (t, ts) in executed(&leader.tick(now)) {
            bumped += usize::from(ts != stamps[&t]);
        }
        for f in followers.iter_mut() {
            f.tick(now);
        }
    }
    let end = now + 100;
    for (t, ts) in executed(&leader.tick(end)) {
        bumped += usize::from(ts != stamps[&t]);
    }
    assert!(bumped > 0, "some transactions were late and bumped");
    for f in followers.iter_mut() {
        f.tick(end);
        let actions = f.on_sync(0, leader.log_since(0), |_| None);
        for action in actions {
            if let Action::Fetch { txns } = action {
                for t in txns {
                    f.on_body(t, &bodies[&t]);
                }
            }
        }
        assert_eq!(f.sync_point(), leader.sync_point(), "every body fetched, every entry synced");
    }
    for k in 0..3 {
        let probe = rmw(1_000 + k, end + 10, &[A], &[k]);
        let want = {
            leader.arrive(probe.clone());
            fast(&leader.tick(end + 10))
        };
        for f in followers.iter_mut() {
            f.arrive(probe.clone());
            assert_eq!(fast(&f.tick(end + 10)), want, "key {k}");
        }
    }
}

/// A lost proposal or confirmation is said again when the coordinator retries (the leader
/// still holds the transaction) and answered when it comes after the release.
#[test]
fn lost_agreement_messages_are_repeated_on_a_retry_and_answered_after_a_release() {
    let mut a = Replica::new(A, true, limits());
    let mut b = Replica::new(B, true, limits());
    a.arrive(rmw(9, 150, &[A], &[1]));
    a.tick(150);
    // A bumps the transaction to 151 and proposes; that proposal is lost.
    let lost = a.arrive(rmw(1, 100, &[A, B], &[1]));
    assert_eq!(lost, [Action::Propose { txn: txn(1), ts: Timestamp(151), to: vec![B] }]);
    let from_b = b.arrive(rmw(1, 100, &[A, B], &[2]));
    assert_eq!(from_b, [Action::Propose { txn: txn(1), ts: Timestamp(100), to: vec![A] }]);
    assert!(a.on_proposal(B, txn(1), &[A, B], Timestamp(100)).is_empty(), "waits for B");
    // The coordinator retries: A says its proposal again, and B moves and confirms.
    let again = a.arrive(rmw(1, 100, &[A, B], &[1]));
    assert_eq!(again, lost);
    let moved = b.on_proposal(A, txn(1), &[A, B], Timestamp(151));
    assert_eq!(moved, [Action::Confirm { txn: txn(1), to: vec![A] }]);
    // That confirmation is lost too; a retry at B repeats both of B's messages.
    let repeated = b.arrive(rmw(1, 100, &[A, B], &[2]));
    assert_eq!(
        repeated,
        [
            Action::Propose { txn: txn(1), ts: Timestamp(100), to: vec![A] },
            Action::Confirm { txn: txn(1), to: vec![A] },
        ]
    );
    assert_eq!(executed(&b.tick(151)), [(txn(1), Timestamp(151))]);
    // After B released it, a late proposal from A is answered with what B decided.
    let answer = b.on_proposal(A, txn(1), &[A, B], Timestamp(151));
    assert_eq!(
        answer,
        [
            Action::Propose { txn: txn(1), ts: Timestamp(151), to: vec![A] },
            Action::Confirm { txn: txn(1), to: vec![A] },
        ]
    );
    assert!(a.on_confirm(B, txn(1), &[A, B]).is_empty());
    assert_eq!(executed(&a.tick(151)), [(txn(1), Timestamp(151))]);
}

fn speculated(actions: &[Action]) -> Vec<(TxnId, Timestamp, u64)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Speculate { txn, ts, hash } => Some((*txn, *ts, *hash)),
            _ => None,
        })
        .collect()
}

#[test]
fn detective_leaders_run_what_is_due_before_agreeing_and_revoke_it_when_it_moves() {
    let mut a = Replica::new(A, true, limits()).with_detective(true);
    let mut b = Replica::new(B, true, limits()).with_detective(true);
    // A released key 1 at 150: transaction 1, stamped 100, is bumped there to 151.
    a.arrive(rmw(9, 150, &[A], &[1]));
    a.tick(150);
    a.arrive(rmw(1, 100, &[A, B], &[1]));
    b.arrive(rmw(1, 100, &[A, B], &[2]));
    assert!(b.tick(99).is_empty(), "nothing runs before its time");
    // At B it comes due before A's proposal: it runs speculatively at 100 and stays held.
    let at_b = b.tick(100);
    assert_eq!(speculated(&at_b).len(), 1);
    assert_eq!(speculated(&at_b)[0].1, Timestamp(100));
    assert!(executed(&at_b).is_empty() && fast(&at_b).is_empty(), "not released");
    assert_eq!((b.held(), b.speculated()), (1, 1));
    assert!(b.tick(120).is_empty(), "it runs once");
    // A conflicting transaction stamped below it is bumped past it (what ran at 100 stays
    // what runs there), and waits behind it.
    assert!(b.arrive(rmw(3, 90, &[B], &[2])).is_empty());
    assert_eq!(b.held_at(txn(3)), Some(Timestamp(101)));
    assert!(b.tick(120).is_empty(), "held behind the unagreed transaction");
    // A's proposal moves it to 151: what ran is revoked, before the confirmation.
    let moved = b.on_proposal(A, txn(1), &[A, B], Timestamp(151));
    assert_eq!(
        moved,
        [
            Action::Revoke { txn: txn(1), ts: Timestamp(100) },
            Action::Confirm { txn: txn(1), to: vec![A] }
        ]
    );
    assert_eq!(b.speculated(), 0);
    // Transaction 3 goes first now; 1 is released at 151 and runs there like any other.
    let later = b.tick(151);
    assert_eq!(executed(&later), [(txn(3), Timestamp(101)), (txn(1), Timestamp(151))]);
    assert!(speculated(&later).is_empty());
    // At A its own proposal is the largest: it runs at 151 while B's confirmation is due,
    // and what ran stands (no revocation); the release's hash is the one it answered with.
    let at_a = a.tick(151);
    assert_eq!(speculated(&at_a).len(), 1);
    assert!(a.on_proposal(B, txn(1), &[A, B], Timestamp(100)).is_empty());
    assert!(a.tick(151).is_empty(), "case 2: waits for the confirmation");
    assert!(a.on_confirm(B, txn(1), &[A, B]).is_empty());
    let released = a.tick(151);
    assert_eq!(executed(&released), [(txn(1), Timestamp(151))]);
    assert!(!released.iter().any(|x| matches!(x, Action::Revoke { .. })));
    assert_eq!(fast(&released)[0].2, speculated(&at_a)[0].2);
    assert_eq!(a.speculated(), 0);
}

#[test]
fn followers_and_preventive_leaders_never_speculate() {
    let mut preventive = Replica::new(A, true, limits());
    let mut follower = Replica::new(A, false, limits()).with_detective(true);
    for r in [&mut preventive, &mut follower] {
        r.arrive(rmw(1, 100, &[A, B], &[1]));
        let actions = r.tick(1_000);
        assert!(speculated(&actions).is_empty(), "{actions:?}");
    }
    assert_eq!(preventive.held(), 1, "held for its agreement");
    assert_eq!(follower.held(), 0, "a follower releases at its time");
}

#[test]
fn a_detective_leader_outbid_before_its_time_does_not_run_early() {
    let c = ShardId(2);
    let mut b = Replica::new(B, true, limits()).with_detective(true);
    b.arrive(rmw(1, 100, &[A, B, c], &[2]));
    // A proposes later; C has not spoken, so nothing is agreed, but B's place will move.
    assert!(b.on_proposal(A, txn(1), &[A, B, c], Timestamp(151)).is_empty());
    assert!(speculated(&b.tick(120)).is_empty(), "outbid: it would only be revoked");
    assert_eq!(b.speculated(), 0);
    let moved = b.on_proposal(c, txn(1), &[A, B, c], Timestamp(90));
    assert_eq!(moved, [Action::Confirm { txn: txn(1), to: vec![A, c] }], "nothing to revoke");
    assert_eq!(executed(&b.tick(151)), [(txn(1), Timestamp(151))]);
}

#[test]
fn a_tick_that_stops_at_its_bound_says_so() {
    let mut few = limits();
    few.release_max = 2;
    let mut r = Replica::new(A, true, few);
    for seq in 1..=3 {
        r.arrive(rmw(seq, 10 * seq, &[A], &[seq]));
    }
    assert_eq!(executed(&r.tick(100)).len(), 2);
    assert!(r.capped(), "a third is due");
    assert_eq!(r.next_due_after(100), None, "no later timestamp would wake it");
    assert_eq!(executed(&r.tick(100)), [(txn(3), Timestamp(30))]);
    assert!(!r.capped());
}

/// A leader that restarted from its journal has its log, its key hashes and its release
/// stamps back (a late arrival is bumped past what the log released), and holds a
/// transaction it had proposed for exactly at its proposal, its keys reserved there: a
/// conflicting arrival below it is bumped above it, one on other keys is not, and the
/// agreement goes on from the restored proposal.
#[test]
fn a_restarted_leader_takes_up_its_log_and_holds_its_proposals_where_they_were() {
    let mut before = Replica::new(A, true, limits());
    before.arrive(rmw(1, 10, &[A], &[1]));
    before.arrive(rmw(2, 20, &[A], &[2]));
    let released = before.tick(100);
    assert_eq!(executed(&released), vec![(txn(1), Timestamp(10)), (txn(2), Timestamp(20))]);
    let hashes: Vec<u64> = fast(&released).iter().map(|&(_, _, h)| h).collect();
    let (k1, k2) = (vec![key(1)], vec![key(2)]);
    let log =
        [(txn(1), Timestamp(10), &k1[..], &k1[..]), (txn(2), Timestamp(20), &k2[..], &k2[..])];
    let (mut after, replayed) =
        Replica::recovered_leader(A, limits(), None, &log).expect("no repeats");
    assert_eq!(replayed, hashes, "the fast replies' hashes, again");
    assert_eq!(after.log_len(), 2);
    assert!(after.logged(txn(1)) && after.logged(txn(2)));
    assert_eq!(after.hashes().reply_hash(&k1), before.hashes().reply_hash(&k1));
    // A retry of a logged transaction runs nothing; a late one is bumped past the log.
    assert!(after.arrive(rmw(1, 10, &[A], &[1])).is_empty());
    after.arrive(rmw(4, 5, &[A], &[1]));
    assert_eq!(after.held_at(txn(4)), Some(Timestamp(11)));
    // The open proposal, held again where it was proposed (above the stamps here).
    let actions = after.restore_proposal(rmw(3, 30, &[A, B], &[1, 5]), Timestamp(30));
    assert_eq!(actions, vec![Action::Propose { txn: txn(3), ts: Timestamp(30), to: vec![B] }]);
    assert_eq!(after.held_at(txn(3)), Some(Timestamp(30)));
    assert!(after.restore_proposal(rmw(3, 30, &[A, B], &[1, 5]), Timestamp(30)).is_empty());
    // Its keys are reserved at 30: a conflicting arrival below lands above it.
    after.arrive(rmw(5, 25, &[A], &[5]));
    assert_eq!(after.held_at(txn(5)), Some(Timestamp(31)));
    after.arrive(rmw(6, 25, &[A], &[9]));
    assert_eq!(after.held_at(txn(6)), Some(Timestamp(25)), "other keys are not reserved");
    // The agreement goes on from the restored proposal: a larger one moves it.
    let moved = after.on_proposal(B, txn(3), &[A, B], Timestamp(40));
    assert!(moved.contains(&Action::Confirm { txn: txn(3), to: vec![B] }), "{moved:?}");
    assert_eq!(after.held_at(txn(3)), Some(Timestamp(40)));
    // A log listing a transaction twice is refused.
    let twice = [log[0], log[0]];
    assert!(Replica::recovered_leader(A, limits(), None, &twice).is_none());
}

/// A refusal drops a held, proposed transaction only when it can be the refuser's word: a
/// participant that never proposed, for one not released here. A speculative run goes with
/// it, and what it held back runs.
#[test]
fn a_refused_transaction_leaves_only_while_held_and_unheard_from_the_refuser() {
    const C: ShardId = ShardId(2);
    let mut a = Replica::new(A, true, limits()).with_detective(true);
    a.arrive(rmw(1, 100, &[A, B, C], &[1]));
    assert!(a.refused(A, txn(1)).is_none(), "its own shard");
    assert!(a.refused(ShardId(2), txn(7)).is_none(), "not held here");
    // C proposed: it took the transaction, so a refusal in its name is not its word.
    a.on_proposal(C, txn(1), &[A, B, C], Timestamp(100));
    assert!(a.refused(C, txn(1)).is_none());
    // It runs speculatively at 100, and a conflicting one waits behind it.
    assert_eq!(speculated(&a.tick(100)).len(), 1);
    a.arrive(rmw(2, 90, &[A], &[1]));
    assert!(executed(&a.tick(120)).is_empty(), "held behind the unagreed transaction");
    // B never proposed: its refusal drops it, revoking the run, and frees the key.
    let dropped = a.refused(B, txn(1)).expect("dropped");
    assert_eq!(dropped, [Action::Revoke { txn: txn(1), ts: Timestamp(100) }]);
    assert_eq!((a.held_at(txn(1)), a.speculated()), (None, 0));
    assert_eq!(executed(&a.tick(120)), [(txn(2), Timestamp(101))]);
    assert!(a.refused(B, txn(1)).is_none(), "gone already");
    // One released here (so every participant proposed) stays whatever a refusal says.
    let mut b = Replica::new(B, true, limits());
    b.arrive(rmw(3, 100, &[A, B], &[5]));
    b.on_proposal(A, txn(3), &[A, B], Timestamp(100));
    assert_eq!(executed(&b.tick(100)), [(txn(3), Timestamp(100))]);
    assert!(b.refused(A, txn(3)).is_none());
    assert!(b.logged(txn(3)));
}

/// A follower released a transaction its leader never received (only the follower got the
/// coordinator's copy): the follower's next fast reply on that key disagrees with the
/// leader's until it drops the entry its leader will never list there; then the two agree
/// again, and the leader's log lists the rest as before.
#[test]
fn a_follower_drops_what_its_leader_never_listed_and_its_replies_match_again() {
    let mut leader = Replica::new(A, true, limits());
    let mut follower = Replica::new(A, false, limits());
    assert!(follower.arrive(rmw(1, 100, &[A], &[7])).is_empty());
    assert_eq!(fast(&follower.tick(100)).len(), 1, "released at the follower alone");
    // The leader logs a transaction on another key (no conflict: 1 stays in the tail).
    for r in [&mut leader, &mut follower] {
        assert!(r.arrive(rmw(2, 200, &[A], &[8])).is_empty());
    }
    assert_eq!(fast(&leader.tick(200)), fast(&follower.tick(200)));
    let hash = |r: &Replica| r.hashes().reply_hash(&[key(7)]);
    assert_ne!(hash(&leader), hash(&follower), "the follower's hash still holds txn 1");
    follower.on_sync(0, leader.log_since(0), |_| None);
    assert_eq!(follower.tail_len(), 1, "txn 1 waits for a leader that never lists it");
    assert_eq!(follower.drop_unlisted(Timestamp(99)), [], "nothing at or below 99");
    assert_eq!(follower.drop_unlisted(Timestamp(250)), [(txn(1), Timestamp(100))]);
    assert_eq!(follower.tail_len(), 0);
    assert_eq!(leader.drop_unlisted(Timestamp(250)), [], "a leader has no tail");
    for r in [&mut leader, &mut follower] {
        assert!(r.arrive(rmw(3, 300, &[A], &[7])).is_empty());
    }
    let (at_leader, at_follower) = (fast(&leader.tick(300)), fast(&follower.tick(300)));
    assert_eq!(at_leader, at_follower, "the same entry, timestamp and hash again");
    // Had the leader taken txn 1 after all, above, its log would list it and the follower
    // would hash it there: nothing of the dropped entry remains to disagree.
    assert_eq!(follower.hashes().reply_hash(&[key(7)]), leader.hashes().reply_hash(&[key(7)]));
}

/// A transaction on `keys` of `shards`, reading `reads` and writing `writes` (key numbers).
fn rw(seq: u64, ts: u64, reads: &[u64], writes: &[u64]) -> Incoming {
    Incoming {
        txn: txn(seq),
        ts: Timestamp(ts),
        shards: vec![A],
        reads: reads.iter().map(|&k| key(k)).collect(),
        writes: writes.iter().map(|&k| key(k)).collect(),
    }
}

fn superseded(actions: &[Action]) -> Vec<(TxnId, Timestamp)> {
    actions
        .iter()
        .flat_map(|a| match a {
            Action::Superseded { dropped } => dropped.clone(),
            _ => Vec::new(),
        })
        .collect()
}

/// An entry joining a follower's synced prefix supersedes the tail entries below it that it
/// conflicts with (the leader's log orders conflicting entries by timestamp, so it will not
/// hold them there), and no others: readers of a key pass each other, an entry above it
/// stays, and an entry whose body is fetched supersedes once the body is in.
#[test]
fn a_synced_entry_supersedes_the_conflicting_tail_entries_below_it() {
    let mut leader = Replica::new(A, true, limits());
    let mut follower = Replica::new(A, false, limits());
    // Released at the follower alone: 1 writes 7 at 100, 3 reads 9 at 100, 5 reads 11 at
    // 150, 8 writes 12 at 150 and 11 writes 13 at 150.
    for incoming in [rw(1, 100, &[], &[7]), rw(3, 100, &[9], &[]), rw(5, 150, &[11], &[])] {
        follower.arrive(incoming);
    }
    follower.arrive(rw(8, 150, &[], &[12]));
    follower.arrive(rw(11, 150, &[], &[13]));
    assert_eq!(fast(&follower.tick(150)).len(), 5);
    // The leader logs 2 writing 7 at 120, 4 reading 9 at 150, 6 writing 9 at 90 (below 3),
    // 10 writing 12 and 13 at 150 (the follower never got 10: above 8, below 11).
    for incoming in [rw(2, 120, &[], &[7]), rw(4, 150, &[9], &[]), rw(6, 90, &[], &[9])] {
        leader.arrive(incoming.clone());
        follower.arrive(incoming);
    }
    leader.arrive(rw(10, 150, &[], &[12, 13]));
    leader.tick(150);
    let listed: Vec<TxnId> = leader.log_since(0).iter().map(|&(t, _)| t).collect();
    assert!(listed.contains(&txn(6)), "6 is not late at the leader: {listed:?}");
    // 6 came late here (below 3's read of 9): its body is held outside the hold queue.
    let actions = follower
        .on_sync(0, leader.log_since(0), |t| (t == txn(6)).then(|| (vec![key(9)], vec![key(9)])));
    assert_eq!(superseded(&actions), [(txn(1), Timestamp(100))], "only 2 above 1 conflicts");
    assert!(!follower.in_tail(txn(1)) && follower.in_tail(txn(3)) && follower.in_tail(txn(5)));
    assert!(follower.in_tail(txn(8)), "10's body is not here yet: 8 waits");
    // 8 is below 10 (the same timestamp, a smaller id) and 11 above it: the body
    // supersedes 8 alone.
    let body = (vec![key(12), key(13)], vec![key(12), key(13)]);
    assert_eq!(superseded(&follower.on_body(txn(10), &body)), [(txn(8), Timestamp(150))]);
    assert!(follower.in_tail(txn(11)));
    // A writer of 9 above 3 supersedes it; 5 (reading 11) stays.
    leader.arrive(rw(9, 160, &[], &[9]));
    leader.tick(160);
    let actions = follower
        .on_sync(0, leader.log_since(0), |t| (t == txn(9)).then(|| (vec![key(9)], vec![key(9)])));
    assert_eq!(superseded(&actions), [(txn(3), Timestamp(100))]);
    assert_eq!(follower.tail(), [(txn(5), Timestamp(150)), (txn(11), Timestamp(150))]);
    // What is left of the tail is 5 and 11: on every other key the hashes are the leader's.
    for k in [7, 9, 12] {
        assert_eq!(
            follower.hashes().reply_hash(&[key(k)]),
            leader.hashes().reply_hash(&[key(k)]),
            "key {k}"
        );
    }
}

/// A follower's synced entries count as released on their keys: a held transaction below a
/// conflicting synced entry goes (the leader's log will not hold it there), and one arriving
/// below it later is late; so the tail never holds an entry below a conflicting synced one.
#[test]
fn a_follower_holds_and_releases_nothing_below_a_conflicting_synced_entry() {
    let mut leader = Replica::new(A, true, limits());
    let mut follower = Replica::new(A, false, limits());
    // Held at the follower, not due yet: 1 writes 7 at 100, 2 reads 8 at 100.
    follower.arrive(rw(1, 100, &[], &[7]));
    follower.arrive(rw(2, 100, &[8], &[]));
    // The leader logs 3, reading 7 and 8, at 150.
    leader.arrive(rw(3, 150, &[7, 8], &[]));
    leader.tick(150);
    let keys = (vec![key(7), key(8)], Vec::new());
    follower.on_sync(0, leader.log_since(0), |t| (t == txn(3)).then(|| keys.clone()));
    assert_eq!((follower.held(), follower.late_dropped_total()), (1, 1), "1 went, 2 stays");
    assert_eq!(fast(&follower.tick(200)).iter().map(|f| f.0).collect::<Vec<_>>(), [txn(2)]);
    // A writer of 7 below 3 is late here now; one above it is held.
    assert!(follower.arrive(rw(4, 120, &[], &[7])).is_empty());
    follower.arrive(rw(5, 160, &[], &[7]));
    assert_eq!((follower.held_at(txn(4)), follower.held_at(txn(5))), (None, Some(Timestamp(160))));
    assert!(follower.ts_high() >= Timestamp(150), "a cut from here covers 3");
}

/// A shard whose leader is about to die, with two followers: 1 and 2 are logged and synced
/// everywhere; 3 is released everywhere (the leader's sync of it is lost); 4 at the first
/// follower alone; 5 writes 8 at 105 at the second, below 2's read (late there); 6 (on
/// shards A and B) at both followers while the leader waits for B; 7 is held at the first
/// follower, not due. Returns the replicas and every transaction sent.
fn before_a_view_change() -> (Replica, [Replica; 2], BTreeMap<TxnId, Incoming>) {
    let mut leader = Replica::new(A, true, limits());
    let mut followers = [Replica::new(A, false, limits()), Replica::new(A, false, limits())];
    let mut sent: BTreeMap<TxnId, Incoming> = BTreeMap::new();
    let mut send = |i: Incoming, at: &mut [&mut Replica]| {
        sent.insert(i.txn, i.clone());
        at.iter_mut().map(|r| r.arrive(i.clone())).collect::<Vec<_>>()
    };
    let [f1, f2] = &mut followers;
    send(rw(1, 100, &[], &[7]), &mut [&mut leader, f1, f2]);
    send(rw(2, 110, &[8], &[]), &mut [&mut leader, f1, f2]);
    for r in [&mut leader, &mut *f1, &mut *f2] {
        r.tick(120);
    }
    for f in [&mut *f1, &mut *f2] {
        f.on_sync(0, leader.log_since(0), |_| None);
    }
    send(rw(3, 130, &[], &[9]), &mut [&mut leader, f1, f2]);
    send(rw(4, 130, &[], &[10]), &mut [f1]);
    let late = send(rw(5, 105, &[], &[8]), &mut [f2]);
    assert!(late[0].is_empty() && f2.held_at(txn(5)).is_none(), "late below the synced 2");
    send(Incoming { shards: vec![A, B], ..rw(6, 135, &[], &[11]) }, &mut [f1, f2]);
    send(rw(7, 500, &[], &[12]), &mut [f1]);
    for r in [&mut leader, &mut *f1, &mut *f2] {
        r.tick(140);
    }
    (leader, followers, sent)
}

/// A follower's report as the merge takes it, with the keys of what was `sent`.
fn reported(
    follower: &Replica,
    sent: &BTreeMap<TxnId, Incoming>,
) -> super::super::recovery::ReportedLog {
    use super::super::recovery::{ReportedEntry, ReportedLog};
    let report = follower.report().expect("a follower reports");
    let entry = |&(txn, ts): &(TxnId, Timestamp)| ReportedEntry {
        ts,
        txn,
        keys: sent.get(&txn).map(|i| (i.reads.clone(), i.writes.clone())),
    };
    ReportedLog {
        base: report.base,
        synced: report.synced.iter().map(entry).collect(),
        unsynced: report.unsynced.iter().map(entry).collect(),
    }
}

/// Two followers' reports merge into a log that keeps what may have committed: the synced
/// prefix, and what both released at one timestamp (maybe fast-committed) though the leader
/// never synced it; what one follower alone released is not kept.
#[test]
fn followers_report_what_they_vouched_for_and_the_merge_keeps_what_may_have_committed() {
    use super::super::recovery::rebuild_log;
    let (leader, [f1, f2], sent) = before_a_view_change();
    let at = |seq: u64, ts: u64| (txn(seq), Timestamp(ts));
    let report = f1.report().unwrap();
    assert_eq!((report.base, report.synced), (0, vec![at(1, 100), at(2, 110)]));
    assert_eq!(report.unsynced, [at(3, 130), at(4, 130), at(6, 135)]);
    assert_eq!(f2.report().unwrap().unsynced, [at(3, 130), at(6, 135)]);
    assert!(leader.report().is_none(), "a leader reports nothing");
    let rebuilt = rebuild_log(3, &[reported(&f1, &sent), reported(&f2, &sent)], 0).unwrap();
    let txns = |entries: &[super::super::recovery::ReportedEntry]| {
        entries.iter().map(|e| e.txn.seq).collect::<Vec<_>>()
    };
    assert_eq!((txns(&rebuilt.prefix), txns(&rebuilt.added)), (vec![1, 2], vec![3, 6]));
}

/// A follower promoted with a rebuilt log leads it: its synced prefix and the rebuilt one
/// are logged, an entry every replica released is released again at its timestamp (a
/// multi-shard one once the other leader answers), what it released alone is gone, what it
/// held goes back to its node, and a late arrival goes above everything it knew.
#[test]
fn a_promoted_follower_leads_the_rebuilt_log() {
    use super::super::recovery::rebuild_log;
    let (_, [mut f1, mut f2], sent) = before_a_view_change();
    let logs = [reported(&f1, &sent), reported(&f2, &sent)];
    let rebuilt = rebuild_log(3, &logs, f1.sync_point()).unwrap();
    assert!(rebuilt.prefix.is_empty(), "the first follower synced the whole prefix");
    let added: Vec<Incoming> =
        rebuilt.added.iter().map(|e| Incoming { ts: e.ts, ..sent[&e.txn].clone() }).collect();
    let keys_of = |t: TxnId| sent.get(&t).map(|i| part_keys(&i.reads, &i.writes));
    let (actions, held) = f1.promote(Vec::new(), added, keys_of).unwrap();
    assert!(f1.leads());
    assert_eq!(held, [txn(7)], "held as a follower: for the node to hold again");
    assert_eq!(actions, [Action::Propose { txn: txn(6), ts: Timestamp(135), to: vec![B] }]);
    assert!(f1.logged(txn(1)) && f1.logged(txn(2)) && !f1.logged(txn(4)));
    assert_eq!(executed(&f1.tick(200)), [(txn(3), Timestamp(130))], "6 waits for B");
    // B released 6 at 135 already: it answers with its place and a confirmation.
    f1.on_proposal(B, txn(6), &[A, B], Timestamp(135));
    f1.on_confirm(B, txn(6), &[A, B]);
    assert_eq!(executed(&f1.tick(200)), [(txn(6), Timestamp(135))]);
    // The second follower released the same entries at the same timestamps: the hashes
    // agree on every key (4, released at the first alone, is gone from them).
    for k in [7, 8, 9, 10, 11] {
        let hash = |r: &Replica| r.hashes().reply_hash(&[key(k)]);
        assert_eq!(hash(&f1), hash(&f2), "key {k}");
    }
    // A late arrival on 3's key is bumped above everything this replica knew.
    assert!(f1.arrive(rw(8, 120, &[], &[9])).is_empty());
    let bumped = f1.held_at(txn(8)).unwrap();
    assert!(bumped > Timestamp(135), "bumped to {bumped:?}");
    // Promoting a leader, or with a transaction twice, is an error and changes nothing.
    assert!(f1.promote(Vec::new(), Vec::new(), |_| None).is_err());
    let one = &sent[&txn(1)];
    let again = vec![(txn(1), Timestamp(100), (one.reads.clone(), one.writes.clone()))];
    assert!(f2.promote(again, Vec::new(), |_| None).is_err());
    assert!(!f2.leads() && f2.in_tail(txn(3)));
}
