//! The delay thread: holds delayed messages until their delivery time, for every link of the
//! process.
//!
//! Senders sample each message's delivery time from the link model (FIFO-clamped, so times never
//! decrease along a link) and hand the message here with a closure that delivers it. One thread
//! per process keeps a heap ordered by `(due, arrival)` and waits with `recv_timeout`, which on
//! Linux wakes within tens of microseconds. That matters: tokio's timer rounds sleeps up to whole
//! milliseconds, which turned 0.5 ms intra-region delays into 1.3–2 ms. Equal due times keep
//! arrival order, so every link stays FIFO.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::time::Instant;

/// Messages waiting to enter the delay thread; more are refused (the sender drops and counts
/// them). Closed-loop load keeps far fewer in flight.
pub const DELAY_QUEUE_MESSAGES_MAX: usize = 1 << 16;
/// Messages the delay thread holds until due; more are refused likewise.
pub const DELAYED_MESSAGES_MAX: usize = 1 << 20;

/// Delivers one message (to an in-process inbox or a TCP writer) without waiting; false when
/// the destination is full or gone.
pub type Delivery = Box<dyn FnOnce() -> bool + Send>;

struct Pending {
    due: Instant,
    arrival: u64,
    delivery: Delivery,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.arrival) == (other.due, other.arrival)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    /// Reversed: the heap pops the earliest due time, then the earliest arrival.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.due, other.arrival).cmp(&(self.due, self.arrival))
    }
}

/// A handle to the process's delay thread; cheap to clone.
#[derive(Clone)]
pub struct DelayThread {
    queue: SyncSender<(Instant, Delivery)>,
}

impl DelayThread {
    /// Starts the thread; it ends once every handle is dropped and nothing is pending.
    pub fn spawn() -> std::io::Result<Self> {
        let (queue, incoming) = sync_channel(DELAY_QUEUE_MESSAGES_MAX);
        std::thread::Builder::new().name("delay".into()).spawn(move || run(incoming))?;
        Ok(Self { queue })
    }

    /// Delivers with `delivery` at `due`; false when the thread's queue is full (never waits).
    pub fn schedule(&self, due: Instant, delivery: Delivery) -> bool {
        self.queue.try_send((due, delivery)).is_ok()
    }
}

fn run(incoming: Receiver<(Instant, Delivery)>) {
    let mut pending: BinaryHeap<Pending> = BinaryHeap::new();
    let mut arrival = 0u64;
    let mut open = true;
    while open || !pending.is_empty() {
        let now = Instant::now();
        while pending.peek().is_some_and(|p| p.due <= now) {
            let item = pending.pop().expect("peeked");
            (item.delivery)();
        }
        let next = match pending.peek() {
            Some(head) if pending.len() >= DELAYED_MESSAGES_MAX => {
                // Full: take nothing more until something is due.
                std::thread::sleep(head.due.saturating_duration_since(Instant::now()));
                continue;
            }
            Some(head) => incoming.recv_timeout(head.due.saturating_duration_since(Instant::now())),
            None if open => incoming.recv().map_err(|_| RecvTimeoutError::Disconnected),
            None => break,
        };
        match next {
            Ok((due, delivery)) => {
                arrival += 1;
                pending.push(Pending { due, arrival, delivery });
                // Take whatever else is queued without waiting; beyond the bound, leave it
                // queued (senders then find the queue full and drop).
                while pending.len() < DELAYED_MESSAGES_MAX {
                    let Ok((due, delivery)) = incoming.try_recv() else { break };
                    arrival += 1;
                    pending.push(Pending { due, arrival, delivery });
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => open = false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    #[test]
    fn deliveries_come_in_due_order_then_arrival_order_and_on_time() {
        let delays = DelayThread::spawn().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let start = Instant::now();
        let plan = [(3, 'c'), (1, 'a'), (3, 'd'), (2, 'b')];
        for (ms, tag) in plan {
            let log = log.clone();
            delays.schedule(
                start + Duration::from_millis(ms),
                Box::new(move || {
                    log.lock().unwrap().push((tag, start.elapsed()));
                    true
                }),
            );
        }
        drop(delays);
        std::thread::sleep(Duration::from_millis(50));
        let log = log.lock().unwrap();
        let tags: String = log.iter().map(|(t, _)| *t).collect();
        assert_eq!(tags, "abcd");
        for ((_, at), ms) in log.iter().zip([1u64, 2, 3, 3]) {
            assert!(*at >= Duration::from_millis(ms), "delivered early: {at:?}");
        }
    }
}
