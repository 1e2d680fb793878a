//! A run's throughput and tail latency over time in short buckets, with the run's scheduled
//! faults marked, and for each fault how long the cluster took to commit again and to get
//! its throughput back (`docs/benchmarking.md`, "Faults"):
//!
//! - **first commit**: from the moment the fault took effect (a crashed node had stopped) to
//!   the completion of the first transaction that was *submitted after* it and committed
//!   (transactions already in flight do not count);
//! - **back to 90%**: throughput before the fault is the mean over the 5 s before it (at
//!   least 1 s of it inside the run); a *dip* is the first 500 ms window at or after the fault
//!   (and before the next fault) whose mean throughput is below 90% of that; the recovery time
//!   runs from the fault to the end of the first later 500 ms window back at 90% or more. No
//!   dip: 0.
//!
//! Memory is bounded: at most [`TIMELINE_BUCKETS_MAX`] buckets (a longer run gets wider
//! buckets), each a count and a log-linear latency histogram of [`LATENCY_CLASSES`] counters
//! (8 classes per doubling: a percentile is known to within 6%).

use meridian_core::fault::FaultSchedule;
use meridian_core::time::{NS_PER_MS, NS_PER_S, NS_PER_US};
use meridian_core::txn::TxnResult;
use meridian_core::Time;
use meridian_workloads::clients::Completion;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Narrowest bucket.
pub const BUCKET_NS_MIN: u64 = 100 * NS_PER_MS;
/// Most buckets one run keeps.
pub const TIMELINE_BUCKETS_MAX: usize = 12_000;
/// Latency classes per bucket: 8 below 8 µs, then 8 per doubling up to 2^30 µs.
pub const LATENCY_CLASSES: usize = 8 * 28;
/// Throughput before a fault is averaged over this long.
pub const PRE_FAULT_NS: u64 = 5 * NS_PER_S;
/// ...of which at least this much must lie inside the run.
pub const PRE_FAULT_NS_MIN: u64 = NS_PER_S;
/// Recovery is judged on windows of this many buckets (500 ms at the narrowest).
pub const RECOVERY_WINDOW_BUCKETS: usize = 5;
/// The fraction of the pre-fault throughput that counts as recovered.
pub const RECOVERED_FRACTION: f64 = 0.9;
/// Largest latency class bound (µs).
const LATENCY_US_MAX: u64 = (1 << 30) - 1;

/// One bucket: commits completed in it and their latencies.
#[derive(Clone, Debug)]
struct Bucket {
    committed: u64,
    classes: Box<[u32; LATENCY_CLASSES]>,
}

/// The latency class of `us` (log-linear: exact below 8, then 8 per doubling).
fn class_of(us: u64) -> usize {
    let us = us.clamp(1, LATENCY_US_MAX);
    if us < 8 {
        return us as usize;
    }
    let log2 = 63 - us.leading_zeros() as usize;
    let sub = ((us >> (log2 - 3)) & 7) as usize;
    8 * (log2 - 2) + sub
}

/// The middle of class `class`'s range (µs).
fn class_value_us(class: usize) -> f64 {
    if class < 8 {
        return class as f64;
    }
    let log2 = class / 8 + 2;
    let sub = (class % 8) as u64;
    let step = 1u64 << (log2 - 3);
    ((8 + sub) * step) as f64 + step as f64 / 2.0
}

/// When each fault of a run took effect (ns from the start of the run; 0 while it has not):
/// set by the fault driver, read by the timeline, so that "the first commit after the fault"
/// counts from the moment the node had crashed, not from when the schedule asked for it.
#[derive(Debug)]
pub struct FaultStarts(Vec<AtomicU64>);

impl FaultStarts {
    /// One slot per fault of `schedule`.
    pub fn new(schedule: &FaultSchedule) -> Self {
        Self::with_count(schedule.faults().len())
    }

    /// `count` slots.
    pub fn with_count(count: usize) -> Self {
        Self((0..count).map(|_| AtomicU64::new(0)).collect())
    }

    /// Fault `fault` took effect at `at_ns` (its first action; later ones leave it).
    pub fn mark(&self, fault: usize, at_ns: Time) {
        if let Some(slot) = self.0.get(fault) {
            let _ = slot.compare_exchange(0, at_ns.max(1), Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    fn get(&self, fault: usize) -> Option<Time> {
        self.0.get(fault).map(|s| s.load(Ordering::Relaxed)).filter(|&at| at > 0)
    }
}

/// Throughput and p99 over time, and fault recovery figures.
#[derive(Debug)]
pub struct Timeline {
    start_ns: Time,
    run_ns: Time,
    bucket_ns: u64,
    buckets: Vec<Bucket>,
    /// Each fault's line and planned start (relative to `start_ns`), and the first commit
    /// of a transaction submitted after it took effect (relative to that moment).
    faults: Vec<(String, Time, Option<Time>)>,
    started: Arc<FaultStarts>,
}

impl Timeline {
    /// A timeline of a run that starts at `start_ns` (wall clock) and lasts `run_ns`, with
    /// `schedule`'s faults marked, which take effect at the times `started` learns.
    pub fn new(
        start_ns: Time,
        run_ns: Time,
        schedule: &FaultSchedule,
        started: Arc<FaultStarts>,
    ) -> Self {
        let faults = schedule.faults().iter().map(|f| (f.text.clone(), f.at_ns)).collect();
        Self::with_faults(start_ns, run_ns, faults, started)
    }

    /// A timeline with `faults` marked (each its line and planned start relative to
    /// `start_ns`), which take effect at the times `started` learns (a slot per fault).
    pub fn with_faults(
        start_ns: Time,
        run_ns: Time,
        faults: Vec<(String, Time)>,
        started: Arc<FaultStarts>,
    ) -> Self {
        let bucket_ns = BUCKET_NS_MIN.max(run_ns.div_ceil(TIMELINE_BUCKETS_MAX as u64));
        let faults = faults.into_iter().map(|(text, at)| (text, at, None)).collect();
        Self { start_ns, run_ns, bucket_ns, buckets: Vec::new(), faults, started }
    }

    /// Counts a completion (commits only; those outside the run are ignored).
    pub fn add(&mut self, completion: &Completion) {
        if !matches!(completion.outcome.result, TxnResult::Committed) {
            return;
        }
        let submitted = completion.submitted_at.saturating_sub(self.start_ns);
        let completed = completion.completed_at.saturating_sub(self.start_ns);
        if completion.completed_at < self.start_ns || completed >= self.run_ns {
            return;
        }
        for (index, (_, _, first)) in self.faults.iter_mut().enumerate() {
            let Some(at) = self.started.get(index) else { continue };
            if submitted >= at && completion.submitted_at >= self.start_ns {
                let after = completed - at;
                *first = Some(first.map_or(after, |f: Time| f.min(after)));
            }
        }
        let index = ((completed / self.bucket_ns) as usize).min(TIMELINE_BUCKETS_MAX - 1);
        while self.buckets.len() <= index {
            self.buckets.push(Bucket { committed: 0, classes: Box::new([0; LATENCY_CLASSES]) });
        }
        let latency_us =
            completion.completed_at.saturating_sub(completion.submitted_at) / NS_PER_US;
        let bucket = &mut self.buckets[index];
        bucket.committed += 1;
        bucket.classes[class_of(latency_us)] += 1;
    }

    /// Buckets of the whole run (empty ones included) and the fault verdicts.
    pub fn summary(&self) -> TimelineSummary {
        let count = (self.run_ns.div_ceil(self.bucket_ns) as usize).min(TIMELINE_BUCKETS_MAX);
        let bucket_s = self.bucket_ns as f64 / NS_PER_S as f64;
        // The last bucket may be cut short by the end of the run: its rate is over its
        // own width.
        let width_s = |i: usize| {
            let end = ((i as u64 + 1) * self.bucket_ns).min(self.run_ns);
            (end - i as u64 * self.bucket_ns) as f64 / NS_PER_S as f64
        };
        let rates: Vec<f64> = (0..count)
            .map(|i| self.buckets.get(i).map_or(0, |b| b.committed) as f64 / width_s(i))
            .collect();
        let points = (0..count)
            .map(|i| TimelinePoint {
                at_s: i as f64 * bucket_s,
                throughput_txn_per_s: rates[i],
                latency_ms_p99: self.buckets.get(i).and_then(p99_us).map(|us| us / 1e3),
            })
            .collect();
        let faults = self
            .faults
            .iter()
            .map(|(text, at, first)| {
                // A dip after the next fault began is that fault's.
                let next = self.faults.iter().map(|f| f.1).filter(|n| n > at).min();
                self.verdict(text, (*at, next), *first, &rates)
            })
            .collect();
        TimelineSummary { bucket_ms: self.bucket_ns as f64 / NS_PER_MS as f64, points, faults }
    }

    /// The verdict of the fault `text` that began at `at` (the next one at `next`).
    fn verdict(
        &self,
        text: &str,
        (at, next): (Time, Option<Time>),
        first: Option<Time>,
        rates: &[f64],
    ) -> FaultVerdict {
        let to_s = |ns: u64| ns as f64 / NS_PER_S as f64;
        let fault_bucket = (at / self.bucket_ns) as usize;
        let pre_from = (at.saturating_sub(PRE_FAULT_NS) / self.bucket_ns) as usize;
        let pre = (at - at.saturating_sub(PRE_FAULT_NS) >= PRE_FAULT_NS_MIN
            && fault_bucket > pre_from)
            .then(|| mean(&rates[pre_from..fault_bucket.min(rates.len())]));
        let mut verdict = FaultVerdict {
            fault: text.to_string(),
            at_s: to_s(at),
            pre_fault_txn_per_s: pre,
            first_commit_s: first.map(to_s),
            dipped: false,
            recovered_90_s: None,
        };
        let Some(pre) = pre.filter(|p| *p > 0.0) else { return verdict };
        let target = RECOVERED_FRACTION * pre;
        let window = |start: usize| mean(&rates[start..(start + RECOVERY_WINDOW_BUCKETS)]);
        let last = rates.len().saturating_sub(RECOVERY_WINDOW_BUCKETS);
        let last_dip = next.map_or(last, |n| {
            ((n / self.bucket_ns) as usize).saturating_sub(RECOVERY_WINDOW_BUCKETS).min(last)
        });
        if rates.len() < RECOVERY_WINDOW_BUCKETS || fault_bucket > last_dip {
            return verdict; // No whole window between the fault and the next one or the end.
        }
        let Some(dip) = (fault_bucket..=last_dip).find(|&w| window(w) < target) else {
            verdict.recovered_90_s = Some(0.0);
            return verdict;
        };
        verdict.dipped = true;
        verdict.recovered_90_s = (dip + 1..=last).find(|&w| window(w) >= target).map(|w| {
            let end_ns = (w + RECOVERY_WINDOW_BUCKETS) as u64 * self.bucket_ns;
            to_s(end_ns.saturating_sub(at))
        });
        verdict
    }
}

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.iter().sum::<f64>() / values.len() as f64
}

/// The 99th percentile of a bucket's latencies (µs), if it has any.
fn p99_us(bucket: &Bucket) -> Option<f64> {
    if bucket.committed == 0 {
        return None;
    }
    let rank = (bucket.committed as f64 * 0.99).ceil() as u64;
    let mut seen = 0;
    for (class, &n) in bucket.classes.iter().enumerate() {
        seen += u64::from(n);
        if seen >= rank {
            return Some(class_value_us(class));
        }
    }
    None
}

/// One bucket of the timeline.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TimelinePoint {
    /// Start of the bucket, seconds from the start of the run (warm-up included).
    pub at_s: f64,
    /// Commits completed in it, per second.
    pub throughput_txn_per_s: f64,
    /// Their 99th percentile latency (ms), when there were any.
    pub latency_ms_p99: Option<f64>,
}

/// What one fault did to the run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FaultVerdict {
    /// The fault's line.
    pub fault: String,
    /// When it started (seconds from the start of the run).
    pub at_s: f64,
    /// Mean throughput over the 5 s before it, when at least 1 s of them lay in the run.
    pub pre_fault_txn_per_s: Option<f64>,
    /// Seconds from the fault to the first commit of a transaction submitted after it.
    pub first_commit_s: Option<f64>,
    /// True when throughput fell below 90% of the pre-fault figure after it.
    pub dipped: bool,
    /// Seconds from the fault until throughput was back to 90% (0 without a dip; absent when
    /// it never came back within the run, or nothing was measured before the fault).
    pub recovered_90_s: Option<f64>,
}

/// The timeline of a run with faults, as `stats.json` records it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TimelineSummary {
    /// Width of a bucket (ms).
    pub bucket_ms: f64,
    /// The buckets, in order.
    pub points: Vec<TimelinePoint>,
    /// One verdict per scheduled fault.
    pub faults: Vec<FaultVerdict>,
}

#[cfg(test)]
mod tests;
