//! The clock model (docs/design.md, "Network and clock model"): every node reads `true time +
//! offset + drift`. Correctness must never depend on the clocks; only performance may (Tiga's
//! timestamps).
//!
//! Presets draw each node's offset uniformly from `±error` and its drift from `±drift_ppm`:
//! `perfect` (0, 0), `chrony` (5 ms, 1 ppm), `ntp` (16 ms, 5 ppm), `bad` (60 ms, 50 ppm).

use crate::error::{unknown_name, ConfigError};
use crate::rng::{uniform_f64, Rng};
use crate::time::{Time, NS_PER_MS};
use serde::{Deserialize, Serialize};

/// The clock preset names.
pub const CLOCK_PRESETS: [&str; 4] = ["perfect", "chrony", "ntp", "bad"];

/// How far node clocks stray.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClockModel {
    /// Preset name, for reports.
    pub name: &'static str,
    /// Offsets are uniform in `±error_ns`.
    pub error_ns: u64,
    /// Drifts are uniform in `±drift_ppm`.
    pub drift_ppm: f64,
}

impl ClockModel {
    /// A named preset.
    pub fn preset(name: &str) -> Result<Self, ConfigError> {
        let (name, error_ms, drift_ppm) = match name {
            "perfect" => ("perfect", 0, 0.0),
            "chrony" => ("chrony", 5, 1.0),
            "ntp" => ("ntp", 16, 5.0),
            "bad" => ("bad", 60, 50.0),
            other => return Err(unknown_name("clock preset", other, &CLOCK_PRESETS)),
        };
        Ok(Self { name, error_ns: error_ms * NS_PER_MS, drift_ppm })
    }

    /// Draws one node's clock.
    pub fn draw(&self, rng: &mut Rng) -> NodeClock {
        let offset_ns = ((uniform_f64(rng) * 2.0 - 1.0) * self.error_ns as f64) as i64;
        let drift_ppm = (uniform_f64(rng) * 2.0 - 1.0) * self.drift_ppm;
        NodeClock { offset_ns, drift_ppm }
    }
}

/// One node's clock error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeClock {
    /// Constant offset from true time.
    pub offset_ns: i64,
    /// Rate error in parts per million (|drift| < 10^6 keeps the clock monotonic).
    pub drift_ppm: f64,
}

impl NodeClock {
    /// The node's reading at true time `true_ns`. Monotonic in `true_ns`.
    pub fn read(&self, true_ns: Time) -> Time {
        let drift = (true_ns as f64 * self.drift_ppm / 1e6) as i64;
        (true_ns as i64).saturating_add(self.offset_ns).saturating_add(drift).max(0) as Time
    }

    /// True time that passes while this clock advances by `clock_ns` (rounded up, so a timer
    /// never fires early by the node's clock).
    pub fn true_duration(&self, clock_ns: u64) -> u64 {
        (clock_ns as f64 / (1.0 + self.drift_ppm / 1e6)).ceil() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::child_rng;

    #[test]
    fn presets_bound_offsets() {
        for name in CLOCK_PRESETS {
            let model = ClockModel::preset(name).unwrap();
            let mut rng = child_rng(5, "clock", 0);
            for _ in 0..1_000 {
                let clock = model.draw(&mut rng);
                assert!(clock.offset_ns.unsigned_abs() <= model.error_ns);
                assert!(clock.drift_ppm.abs() <= model.drift_ppm);
            }
        }
        assert!(ClockModel::preset("atomic").unwrap_err().0.contains("accepted: perfect"));
    }

    #[test]
    fn readings_are_monotonic_and_timers_never_fire_early() {
        let clock = NodeClock { offset_ns: -3 * NS_PER_MS as i64, drift_ppm: -50.0 };
        let base = 1_000_000 * NS_PER_MS;
        let mut last = 0;
        for step in 0..1_000 {
            let reading = clock.read(base + step * 997);
            assert!(reading >= last);
            last = reading;
        }
        let wait = 10 * NS_PER_MS;
        let after = clock.read(base + clock.true_duration(wait));
        assert!(after >= clock.read(base) + wait);
    }
}
