//! The wall clock: nanoseconds since the Unix epoch, read monotonically (the system time is read
//! once, then advanced by a monotonic clock), so a reading never goes back.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A monotonic wall clock, cheap to copy.
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    base_system_ns: u64,
    base_instant: Instant,
}

impl WallClock {
    /// Reads the system time once.
    pub fn new() -> Self {
        let base_system_ns =
            SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        Self { base_system_ns, base_instant: Instant::now() }
    }

    /// Nanoseconds since the Unix epoch.
    pub fn now_ns(&self) -> u64 {
        self.base_system_ns + self.base_instant.elapsed().as_nanos() as u64
    }

    /// The instant at which this clock reads `ns` (or now, if that is past).
    pub fn instant_at(&self, ns: u64) -> Instant {
        let offset = ns.saturating_sub(self.base_system_ns);
        self.base_instant + std::time::Duration::from_nanos(offset)
    }
}

impl Default for WallClock {
    fn default() -> Self {
        Self::new()
    }
}
