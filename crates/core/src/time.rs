//! Time. A [`Time`] is a reading of some clock in nanoseconds: in the simulator the virtual time
//! (or a node's skewed view of it), in the runtime nanoseconds since the Unix epoch plus the
//! node's configured skew. A [`Timestamp`] orders versions in the MVCC store.

use serde::{Deserialize, Serialize};

/// A clock reading in nanoseconds.
pub type Time = u64;

/// Nanoseconds per microsecond.
pub const NS_PER_US: u64 = 1_000;
/// Nanoseconds per millisecond.
pub const NS_PER_MS: u64 = 1_000_000;
/// Nanoseconds per second.
pub const NS_PER_S: u64 = 1_000_000_000;

/// Converts milliseconds (possibly fractional) to nanoseconds, saturating at zero.
pub fn ms_to_ns(ms: f64) -> u64 {
    if ms.is_finite() && ms > 0.0 {
        (ms * NS_PER_MS as f64).round() as u64
    } else {
        0
    }
}

/// Converts nanoseconds to fractional milliseconds (for reports).
pub fn ns_to_ms(ns: u64) -> f64 {
    ns as f64 / NS_PER_MS as f64
}

/// The position of a version in a key's history. Larger is newer. Protocols choose how they
/// assign them (OCC: a commit timestamp above every version it read or overwrote).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// Below every real version; the initial load is written at this timestamp.
    pub const ZERO: Self = Self(0);
    /// Above every real version; reading at `MAX` reads the latest.
    pub const MAX: Self = Self(u64::MAX);

    /// The next timestamp (saturating).
    pub fn next(self) -> Self {
        Self(self.0.saturating_add(1))
    }
}
