//! A Luigi shard leader's per-worker watermarks (sans-IO): for every worker (a coordinator
//! node), the timestamp at or below which every transaction of that worker on this shard is
//! replicated to a majority of the shard's replicas, now and for good.
//!
//! The published Luigi code takes the timestamp of the last replicated entry of a worker's
//! stream as its watermark. That is only sound when a worker's entries join the log in
//! timestamp order, which the agreement breaks: a transaction held *not ready* while the
//! leaders agree is released after a later, non-conflicting one of the same worker. Here the
//! watermark is instead
//!
//! ```text
//! W[w] = min( frontier[w], min{ lower bound of t : t of w known here, not replicated } − 1 )
//! ```
//!
//! where `frontier[w]` is the largest timestamp of any of `w`'s transactions known here, and a
//! leader admits a new transaction of `w` only above `frontier[w]` ([`Watermarks::floor`]). So:
//!
//! - every transaction of `w` known here with a timestamp at or below `W[w]` is replicated
//!   (an unreplicated one's lower bound, hence its timestamp, is above `W[w]`);
//! - every transaction of `w` that arrives later is held above `W[w]`;
//! - `W[w]` never falls.
//!
//! A coordinator therefore commits its transaction `t` once, on every participant shard, the
//! leader's result for `t` is in (at the agreed timestamp) and that shard's watermark for it
//! is at or above that timestamp.
//!
//! Bounds: one entry per worker, sized to the cluster's nodes (a transaction naming a node
//! outside it is refused); open transactions per worker are the leader's held and unreplicated
//! ones, bounded by the bodies it keeps (`OPEN_MAX` as a backstop).

use crate::tiga::node::Watermarks;
use meridian_core::{NodeId, Timestamp, TxnId};
use std::collections::BTreeMap;

/// Open (known, not replicated) transactions per worker at most; beyond it a leader takes no
/// new arrival from that worker (the coordinator resends).
pub const OPEN_MAX: usize = 1 << 18;

/// One worker's stream on one shard.
#[derive(Clone, Debug, Default)]
struct Stream {
    /// The largest timestamp of the worker's transactions known here.
    frontier: Timestamp,
    /// Known, not replicated: a lower bound of each one's timestamp (its timestamp only rises,
    /// through agreement).
    open: BTreeMap<TxnId, Timestamp>,
    /// The same, ordered by bound.
    by_bound: BTreeMap<(Timestamp, TxnId), ()>,
    /// The watermark last handed out by [`Watermarks::take_raised`].
    told: Timestamp,
}

impl Stream {
    fn watermark(&self) -> Timestamp {
        match self.by_bound.keys().next() {
            Some(&(lowest, _)) => Timestamp(lowest.0.saturating_sub(1)).min(self.frontier),
            None => self.frontier,
        }
    }
}

/// A leader's streams, one per worker of the cluster.
#[derive(Clone, Debug)]
pub struct Streams {
    /// Indexed by the worker's node id: sized to the cluster's node count.
    workers: Vec<Stream>,
}

impl Streams {
    /// Streams for a cluster of `nodes` nodes (each may coordinate).
    pub fn new(nodes: usize) -> Self {
        Self { workers: vec![Stream::default(); nodes] }
    }

    /// [`Streams::new`], as the node keeps it ([`crate::tiga::node::MakeWatermarks`]).
    pub fn boxed(nodes: usize) -> Box<dyn Watermarks> {
        Box::new(Self::new(nodes))
    }

    /// The number of workers (the cluster's nodes).
    pub fn workers(&self) -> usize {
        self.workers.len()
    }
}

impl Watermarks for Streams {
    /// The lowest timestamp a new transaction of `worker` may be held at here, `None` when
    /// `worker` is not a node of the cluster, its stream is full, or its frontier is at the
    /// largest timestamp.
    fn floor(&self, worker: NodeId) -> Option<Timestamp> {
        let stream = self.workers.get(worker.0 as usize)?;
        if stream.open.len() >= OPEN_MAX {
            return None;
        }
        // A frontier at the end of time (a coordinator stamping u64::MAX) takes nothing more.
        stream.frontier.0.checked_add(1).map(Timestamp)
    }

    /// `txn` (of the worker `txn.origin`) is held here at `ts`, at or above its floor.
    fn held(&mut self, txn: TxnId, ts: Timestamp) {
        let Some(stream) = self.workers.get_mut(txn.origin.0 as usize) else { return };
        if stream.open.contains_key(&txn) {
            return;
        }
        debug_assert!(ts > stream.frontier, "{txn} held at {ts:?}, below its floor");
        stream.frontier = stream.frontier.max(ts);
        stream.open.insert(txn, ts);
        stream.by_bound.insert((ts, txn), ());
    }

    /// `txn`, in the log at `ts`, is replicated to a majority. One not opened here (a leader
    /// that took over, a transaction known only from a peer) raises nothing it should not:
    /// only its own timestamp joins the frontier.
    fn replicated(&mut self, txn: TxnId, ts: Timestamp) {
        let Some(stream) = self.workers.get_mut(txn.origin.0 as usize) else { return };
        if let Some(bound) = stream.open.remove(&txn) {
            stream.by_bound.remove(&(bound, txn));
            debug_assert!(bound <= ts, "{txn} replicated at {ts:?} below its bound {bound:?}");
        }
        stream.frontier = stream.frontier.max(ts);
    }

    /// `txn` will never be in the log (another leader refused it, so no leader can release
    /// it): it stops holding its worker's watermark back. The frontier stays where it is, so
    /// nothing new of the worker is held at or below its timestamp.
    fn dropped(&mut self, txn: TxnId) {
        let Some(stream) = self.workers.get_mut(txn.origin.0 as usize) else { return };
        if let Some(bound) = stream.open.remove(&txn) {
            stream.by_bound.remove(&(bound, txn));
        }
    }

    /// A restarted leader: `worker` was told `ts` before the crash. Its new transactions are
    /// held above it, and nothing will be told below it again.
    fn restore_told(&mut self, worker: NodeId, ts: Timestamp) {
        let Some(stream) = self.workers.get_mut(worker.0 as usize) else { return };
        stream.frontier = stream.frontier.max(ts);
        stream.told = stream.told.max(ts);
    }

    /// A restarted leader: `txn` is in its log at `ts`, with its replication not known yet.
    /// Above what its worker was told it is open until [`Watermarks::replicated`]; at or below,
    /// the promise already covers it (it was replicated). Call after
    /// [`Watermarks::restore_told`].
    fn restore_open(&mut self, txn: TxnId, ts: Timestamp) {
        let Some(stream) = self.workers.get_mut(txn.origin.0 as usize) else { return };
        stream.frontier = stream.frontier.max(ts);
        if ts > stream.told && stream.open.insert(txn, ts).is_none() {
            stream.by_bound.insert((ts, txn), ());
        }
    }

    /// A restarted leader: `txn` is held at `ts` again (a proposal taken up again). It is
    /// not replicated, whatever its worker was told: it is open until [`Watermarks::replicated`]
    /// even at or below that (its hold before the crash may have moved above its first
    /// proposal, and the watermark with it), so nothing higher is told while it is open.
    fn restore_held(&mut self, txn: TxnId, ts: Timestamp) {
        let Some(stream) = self.workers.get_mut(txn.origin.0 as usize) else { return };
        stream.frontier = stream.frontier.max(ts);
        if stream.open.insert(txn, ts).is_none() {
            stream.by_bound.insert((ts, txn), ());
        }
    }

    /// `worker`'s watermark here.
    fn watermark(&self, worker: NodeId) -> Timestamp {
        self.workers.get(worker.0 as usize).map(Stream::watermark).unwrap_or(Timestamp::ZERO)
    }

    /// The workers whose watermark rose since they were last told, with it (marked told).
    fn take_raised(&mut self) -> Vec<(NodeId, Timestamp)> {
        let mut raised = Vec::new();
        for (index, stream) in self.workers.iter_mut().enumerate() {
            let mark = stream.watermark();
            if mark > stream.told {
                stream.told = mark;
                raised.push((NodeId(index as u32), mark));
            }
        }
        raised
    }

    /// Per worker, the watermark last told (workers told nothing left out): what a
    /// checkpoint keeps, for [`Watermarks::restore_told`].
    fn told(&self) -> Vec<(NodeId, Timestamp)> {
        let told = self.workers.iter().enumerate().filter(|(_, s)| s.told > Timestamp::ZERO);
        told.map(|(index, s)| (NodeId(index as u32), s.told)).collect()
    }

    /// Open transactions of every worker.
    fn open(&self) -> usize {
        self.workers.iter().map(|s| s.open.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(origin: u32, seq: u64) -> TxnId {
        TxnId { origin: NodeId(origin), incarnation: 1, seq }
    }

    #[test]
    fn a_watermark_waits_for_the_lowest_unreplicated_transaction() {
        let mut streams = Streams::new(3);
        assert_eq!(streams.floor(NodeId(1)), Some(Timestamp(1)));
        streams.held(t(1, 1), Timestamp(100));
        streams.held(t(1, 2), Timestamp(110));
        assert_eq!(streams.watermark(NodeId(1)), Timestamp(99));
        // The later one replicates first (released first: the earlier one waited for its
        // agreement): the watermark stays below the earlier one.
        streams.replicated(t(1, 2), Timestamp(110));
        assert_eq!(streams.watermark(NodeId(1)), Timestamp(99));
        // The earlier one was agreed at 150: once replicated, the watermark covers it.
        streams.replicated(t(1, 1), Timestamp(150));
        assert_eq!(streams.watermark(NodeId(1)), Timestamp(150));
        // Other workers are not touched.
        assert_eq!(streams.watermark(NodeId(2)), Timestamp::ZERO);
    }

    #[test]
    fn a_late_arrival_is_admitted_only_above_the_watermark() {
        let mut streams = Streams::new(2);
        streams.held(t(0, 1), Timestamp(100));
        streams.replicated(t(0, 1), Timestamp(100));
        let mark = streams.watermark(NodeId(0));
        assert_eq!(mark, Timestamp(100));
        // A transaction its coordinator stamped earlier must be held above what was promised.
        let floor = streams.floor(NodeId(0)).unwrap();
        assert!(floor > mark);
        streams.held(t(0, 2), floor.max(Timestamp(50)));
        assert_eq!(streams.watermark(NodeId(0)), mark, "the watermark never falls");
    }

    #[test]
    fn a_restarted_leader_tells_nothing_below_what_it_told_and_waits_for_what_is_above() {
        let mut streams = Streams::new(2);
        streams.restore_told(NodeId(1), Timestamp(100));
        streams.restore_open(t(1, 1), Timestamp(90)); // Covered by the promise.
        streams.restore_open(t(1, 2), Timestamp(120)); // Above it: not known replicated.
        assert_eq!(streams.watermark(NodeId(1)), Timestamp(119));
        assert!(streams.floor(NodeId(1)).unwrap() > Timestamp(120), "new ones land above");
        assert_eq!(streams.take_raised(), vec![(NodeId(1), Timestamp(119))]);
        streams.replicated(t(1, 1), Timestamp(90));
        streams.replicated(t(1, 2), Timestamp(120));
        assert_eq!(streams.take_raised(), vec![(NodeId(1), Timestamp(120))]);
        assert_eq!(streams.open(), 0);
    }

    #[test]
    fn raised_watermarks_are_told_once_and_unknown_workers_are_refused() {
        let mut streams = Streams::new(2);
        assert!(streams.take_raised().is_empty());
        streams.held(t(1, 1), Timestamp(7));
        // Below the open transaction: a promise already (none lower can come any more).
        assert_eq!(streams.take_raised(), vec![(NodeId(1), Timestamp(6))]);
        streams.replicated(t(1, 1), Timestamp(7));
        assert_eq!(streams.take_raised(), vec![(NodeId(1), Timestamp(7))]);
        assert!(streams.take_raised().is_empty());
        assert_eq!(streams.floor(NodeId(2)), None, "a worker outside the cluster");
        streams.held(t(5, 1), Timestamp(9)); // Ignored: no such worker.
        streams.replicated(t(5, 1), Timestamp(9));
        assert_eq!(streams.watermark(NodeId(5)), Timestamp::ZERO);
        assert_eq!(streams.open(), 0);
        streams.held(t(0, 1), Timestamp(u64::MAX));
        assert_eq!(streams.floor(NodeId(0)), None, "nothing above the end of time");
    }
}
