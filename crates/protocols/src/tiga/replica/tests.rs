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
    let keys = vec![key(7), key(7)];
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
    let mut bodies: BTreeMap<TxnId, Vec<Key>> = BTreeMap::new();
    let mut now = 100;
    let mut bumped = 0;
    let mut stamps: BTreeMap<TxnId, Timestamp> = BTreeMap::new();
    for seq in 0..40 {
        now += 5;
        // Some stamps fall below what was released already: late everywhere.
        let stamp = now - 15 + uniform_u64(&mut rng, 30);
        let incoming = rmw(seq, stamp, &[A], &[uniform_u64(&mut rng, 3)]);
        stamps.insert(incoming.txn, incoming.ts);
        bodies.insert(incoming.txn, [incoming.reads.clone(), incoming.writes.clone()].concat());
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
    for r in [&mut leader, &mut follower] {
        assert!(r.arrive(rmw(2, 200, &[A], &[7])).is_empty());
    }
    let (at_leader, at_follower) = (fast(&leader.tick(200)), fast(&follower.tick(200)));
    assert_ne!(at_leader[0].2, at_follower[0].2, "the follower's hash still holds txn 1");
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
