//! Delay lines: one task per delayed directed link. The sender samples each message's delivery
//! time from the link model (FIFO-clamped, so times never decrease along a link) and queues it
//! here; the task sleeps until the head is due and forwards it. Because times are monotonic per
//! link, a FIFO queue suffices: no heap.

use std::future::Future;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};

/// Messages one delay line holds before senders wait (at 150 ms one-way and 100k msgs/s that is
/// under a second of traffic... senders then wait, which is backpressure, not loss).
pub const DELAY_LINE_MESSAGES_MAX: usize = 1 << 16;

/// Spawns a delay line that calls `forward` with each item once its instant has come.
pub fn spawn<T, F, Fut>(mut forward: F) -> mpsc::Sender<(Instant, T)>
where
    T: Send + 'static,
    F: FnMut(T) -> Fut + Send + 'static,
    Fut: Future<Output = bool> + Send,
{
    let (tx, mut rx) = mpsc::channel::<(Instant, T)>(DELAY_LINE_MESSAGES_MAX);
    tokio::spawn(async move {
        while let Some((due, item)) = rx.recv().await {
            if due > Instant::now() {
                sleep_until(due).await;
            }
            if !forward(item).await {
                break; // The destination is gone.
            }
        }
    });
    tx
}
