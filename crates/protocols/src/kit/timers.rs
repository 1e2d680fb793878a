//! A node's timer table: the driver hands back a [`TimerId`]; the table says what it was for.
//!
//! Timers are never cancelled (the node contract), so a node ignores a timer whose purpose has
//! passed. The table holds at most `timers_max` pending timers: stale ones accumulate only
//! until they fire, so the bound catches a bug that sets timers in a loop.

use meridian_core::hash::FixedHashMap;
use meridian_core::node::{Outbox, TimerId};

/// Default for the most timers pending at once per node.
pub const TIMERS_MAX: usize = 1 << 20;

/// Pending timers and their purposes.
#[derive(Debug)]
pub struct Timers<P> {
    next: u64,
    // Looked up once per timer; never iterated.
    pending: FixedHashMap<TimerId, P>,
    timers_max: usize,
}

impl<P> Default for Timers<P> {
    fn default() -> Self {
        Self { next: 0, pending: FixedHashMap::default(), timers_max: TIMERS_MAX }
    }
}

impl<P> Timers<P> {
    /// Asks for a timer `after_ns` from now, for `purpose`.
    pub fn set<M>(&mut self, purpose: P, after_ns: u64, out: &mut Outbox<M>) {
        assert!(self.pending.len() < self.timers_max, "timer table overflow");
        let id = TimerId(self.next);
        self.next += 1;
        self.pending.insert(id, purpose);
        out.set_timer(id, after_ns);
    }

    /// The purpose of a timer that fired; `None` for one this table never set.
    pub fn take(&mut self, id: TimerId) -> Option<P> {
        self.pending.remove(&id)
    }

    /// Timers pending.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// True when none is pending.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timer_is_taken_once_and_unknown_ids_are_ignored() {
        let mut timers = Timers::default();
        let mut out: Outbox<()> = Outbox::new();
        timers.set("a", 5, &mut out);
        timers.set("b", 7, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(timers.take(TimerId(1)), Some("b"));
        assert_eq!(timers.take(TimerId(1)), None);
        assert_eq!(timers.take(TimerId(99)), None);
        assert_eq!(timers.len(), 1);
    }
}
