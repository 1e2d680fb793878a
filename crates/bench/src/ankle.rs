//! Peak throughput and the latency at the "ankle" of a load sweep, as Pequin reports its
//! curves: one line per protocol, so that sweeps compare at a glance
//! (`docs/benchmarking.md`, "Peak and ankle").
//!
//! The points are a sweep's runs in order of offered load (clients, or an open loop's rate),
//! each `(throughput, p50 latency)`. A step from one point to the next is **steep** when the
//! median latency grows by more than [`STEEP_LATENCY_RATIO`] and by a larger factor than the
//! throughput does: the added load buys queueing, not commits. The **ankle** is the last point
//! before the first steep step (the last point when no step is steep); the **peak** is the
//! highest throughput of any point.

/// Latency growth beyond which a step may be steep.
pub const STEEP_LATENCY_RATIO: f64 = 1.25;

/// Peak and ankle of one sweep.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PeakAnkle {
    /// Index of the point with the highest throughput.
    pub peak: usize,
    /// Its throughput.
    pub peak_txn_per_s: f64,
    /// Index of the ankle point.
    pub ankle: usize,
    /// Throughput at the ankle.
    pub ankle_txn_per_s: f64,
    /// Median latency at the ankle (ms).
    pub ankle_p50_ms: f64,
}

/// The peak and ankle of `points` (`(txn/s, p50 ms)` in order of offered load); `None` for
/// fewer than two points.
pub fn peak_and_ankle(points: &[(f64, f64)]) -> Option<PeakAnkle> {
    if points.len() < 2 {
        return None;
    }
    let peak = (0..points.len()).max_by(|&a, &b| points[a].0.total_cmp(&points[b].0))?;
    let steep = |i: usize| {
        let ((t0, l0), (t1, l1)) = (points[i], points[i + 1]);
        let latency_ratio = if l0 > 0.0 { l1 / l0 } else { f64::INFINITY };
        let throughput_ratio = if t0 > 0.0 { t1 / t0 } else { f64::INFINITY };
        latency_ratio > STEEP_LATENCY_RATIO && latency_ratio > throughput_ratio
    };
    let ankle = (0..points.len() - 1).find(|&i| steep(i)).unwrap_or(points.len() - 1);
    Some(PeakAnkle {
        peak,
        peak_txn_per_s: points[peak].0,
        ankle,
        ankle_txn_per_s: points[ankle].0,
        ankle_p50_ms: points[ankle].1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ankle_is_the_last_point_before_latency_climbs() {
        // Throughput doubles at flat latency, then saturates while latency climbs.
        let curve = [(100.0, 10.0), (200.0, 10.5), (390.0, 11.0), (420.0, 20.0), (430.0, 40.0)];
        let pa = peak_and_ankle(&curve).unwrap();
        assert_eq!((pa.ankle, pa.ankle_p50_ms, pa.ankle_txn_per_s), (2, 11.0, 390.0));
        assert_eq!((pa.peak, pa.peak_txn_per_s), (4, 430.0));
    }

    #[test]
    fn latency_that_grows_with_throughput_is_not_steep() {
        // Latency +40% but throughput +60%: load still buys commits.
        let curve = [(100.0, 10.0), (160.0, 14.0), (170.0, 30.0)];
        assert_eq!(peak_and_ankle(&curve).unwrap().ankle, 1);
        // Nothing steep: the ankle is the last point.
        let flat = [(100.0, 10.0), (200.0, 10.0), (300.0, 11.0)];
        assert_eq!(peak_and_ankle(&flat).unwrap().ankle, 2);
    }

    #[test]
    fn a_collapsing_peak_and_degenerate_input() {
        // Throughput falls past the peak (thrashing): the peak is the best point.
        let curve = [(100.0, 5.0), (300.0, 6.0), (250.0, 30.0)];
        let pa = peak_and_ankle(&curve).unwrap();
        assert_eq!((pa.peak, pa.ankle), (1, 1));
        assert_eq!(peak_and_ankle(&[(1.0, 1.0)]), None);
        assert_eq!(peak_and_ankle(&[]), None);
        // Zero throughput or latency at the start does not divide by zero.
        let zeros = [(0.0, 0.0), (10.0, 5.0), (20.0, 5.0)];
        let pa = peak_and_ankle(&zeros).unwrap();
        assert_eq!((pa.peak, pa.ankle, pa.ankle_p50_ms), (2, 2, 5.0));
    }
}
