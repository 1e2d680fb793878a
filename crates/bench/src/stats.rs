//! Statistics of one run. Only requests submitted inside the measurement window count; the
//! window excludes the warm-up and whatever completes after the end.

use crate::timeline::{Timeline, TimelineSummary};
use hdrhistogram::Histogram;
use meridian_core::time::NS_PER_US;
use meridian_core::txn::TxnResult;
use meridian_core::{NodeId, Time};
use meridian_workloads::clients::Completion;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Largest latency recorded (µs): ten minutes.
const LATENCY_US_MAX: u64 = 600_000_000;
/// Seconds of time series kept (one histogram each); later seconds fold into the last.
const SERIES_SECONDS_MAX: usize = 3_600;
/// Percentiles the summary lists for latency CDFs.
const CDF_PERCENTILES: [f64; 15] =
    [1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.9, 99.99];

/// Counters and latencies of the measurement window.
#[derive(Debug)]
pub struct RunStats {
    window_start: Time,
    window_end: Time,
    latency_us: Histogram<u64>,
    /// Requests committed.
    pub committed: u64,
    /// Requests committed over the whole run, warm-up and drain included.
    pub committed_all: u64,
    /// Committed requests that touched more than one shard.
    pub cross_shard: u64,
    /// Attempts aborted by a conflict or timeout and retried.
    pub retries: u64,
    /// The same attempts by cause.
    abort_causes: BTreeMap<&'static str, u64>,
    /// Requests ended by a user abort.
    pub user_aborted: u64,
    /// Requests that failed.
    pub failed: u64,
    /// The first failure's reason, for the report.
    pub first_failure: Option<String>,
    /// Completions outside the window.
    pub outside_window: u64,
    /// Committed requests by commit path.
    paths: BTreeMap<&'static str, u64>,
    /// Committed requests by the wide-area one-way hops on their critical path (simulated
    /// runs, and real-time runs whose driver counts them): bounded by the distinct counts.
    wan_hops: BTreeMap<u16, u64>,
    /// Speculative latencies, for protocols that report them.
    speculative_us: Histogram<u64>,
    /// Requests whose outcome is unknown (a participant forgot it).
    indeterminate: u64,
    /// Per second of the window: commits and their latencies (2 significant digits).
    series: Vec<Histogram<u64>>,
    /// Per procedure (transaction type): counts and latencies.
    by_type: BTreeMap<u32, TypeStats>,
    /// Procedure names by id, when the driver named them.
    type_names: Vec<&'static str>,
    /// CPU time the process spent in the window, when the driver measured it.
    cpu_ns: Option<u64>,
    peak_rss_mib: Option<f64>,
    /// The protocol's latency bound per coordinator node: its region's name and the bound
    /// (ns), when the driver set them ([`RunStats::set_latency_bounds`]).
    bounds: BTreeMap<NodeId, (String, u64)>,
    /// Commits count against the bound only when they touched this many shards (every one).
    bound_shards: u32,
    /// Per coordinator region: latencies of the commits that count against the bound.
    bounded_us: BTreeMap<String, Histogram<u64>>,
    /// The whole run in short buckets, when it has faults ([`RunStats::set_timeline`]).
    timeline: Option<Timeline>,
}

/// The latency bound `protocol` states for each coordinator of `topology` (its region's name
/// and the bound in ns), for [`RunStats::set_latency_bounds`]; empty where it states none.
pub fn latency_bounds(
    protocol: meridian_protocols::ProtocolKind,
    topology: &meridian_core::topology::Topology,
    network: &meridian_core::netmodel::NetworkModel,
    options: &meridian_protocols::ProtocolOptions,
) -> BTreeMap<NodeId, (String, u64)> {
    topology
        .coordinators()
        .into_iter()
        .filter_map(|node| {
            let region = topology.region_of(node);
            let bound = protocol.latency_bound_ns(topology, network, options, region)?;
            Some((node, (topology.regions.get(region.0 as usize)?.clone(), bound)))
        })
        .collect()
}

/// Counts and latencies of one transaction type.
#[derive(Debug)]
struct TypeStats {
    committed: u64,
    retries: u64,
    user_aborted: u64,
    failed: u64,
    latency_us: Histogram<u64>,
}

/// The figures of one transaction type.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TypeSummary {
    /// Committed requests.
    pub committed: u64,
    /// Retried attempts.
    pub retries: u64,
    /// User aborts.
    pub user_aborted: u64,
    /// Failed requests.
    pub failed: u64,
    /// Median latency of its commits (ms).
    pub latency_ms_p50: f64,
    /// 99th percentile (ms).
    pub latency_ms_p99: f64,
    /// 99.9th percentile (ms).
    pub latency_ms_p999: f64,
    /// Largest (ms).
    pub latency_ms_max: f64,
    /// Mean (ms).
    pub latency_ms_mean: f64,
}

/// One second of a run's measurement window.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SecondStats {
    /// Seconds since the window started.
    pub second: u32,
    /// Requests committed in that second (by their completion).
    pub committed: u64,
    /// Their median latency (ms).
    pub latency_ms_p50: f64,
    /// Their 99th percentile (ms).
    pub latency_ms_p99: f64,
}

/// The numbers a report shows. Read back by `meridian report`; fields added later default
/// when an older `stats.json` lacks them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// Measured seconds.
    pub window_s: f64,
    /// Committed requests.
    pub committed: u64,
    /// Committed per second.
    pub throughput_txn_per_s: f64,
    /// Median latency (ms).
    pub latency_ms_p50: f64,
    /// 90th percentile (ms).
    pub latency_ms_p90: f64,
    /// 99th percentile (ms).
    pub latency_ms_p99: f64,
    /// 99.9th percentile (ms).
    pub latency_ms_p999: f64,
    /// Largest (ms).
    pub latency_ms_max: f64,
    /// Retried attempts per attempt (conflicts and timeouts).
    pub abort_rate: f64,
    /// Retried attempts.
    pub retries: u64,
    /// Retried attempts by cause (`validation`, `lock-denied`, `wounded`, `lease-expired`,
    /// `timestamp-too-old`, `cascading`, `busy`, `timeout`, `already-aborted`,
    /// `serialization`, `deadlock`); causes that never occurred are left out.
    #[serde(default)]
    pub abort_causes: BTreeMap<String, u64>,
    /// User aborts.
    pub user_aborted: u64,
    /// Failed requests.
    pub failed: u64,
    /// Committed requests that touched more than one shard, as a fraction.
    pub cross_shard_fraction: f64,
    /// Failed requests whose outcome is unknown (included in `failed`).
    pub indeterminate: u64,
    /// Committed requests by commit path (`one-round`, `one-phase`, `two-phase`, `fast`, ...).
    pub commit_paths: BTreeMap<String, u64>,
    /// Commits on a fast path per commit on the fast or the slow path (snapshot reads take
    /// neither), for protocols that have one (`null` otherwise).
    pub fast_path_ratio: Option<f64>,
    /// Commits whose every participant shard's super quorum of fast replies matched, per
    /// commit on the fast or the slow path: those the fast path decided, and those it would
    /// have decided had the slow path not been first (tiga's
    /// `tiga_fast_quorum_after_slow_total`), over the whole run, warm-up included. `null`
    /// where the protocol does not count them.
    pub fast_quorum_ratio: Option<f64>,
    /// Wide-area round trips on the critical path of the median commit (half the wide-area
    /// one-way legs it waited for, in turn), where the driver counts them (the simulator).
    pub wrtt_p50: Option<f64>,
    /// The mean of the same.
    pub wrtt_mean: Option<f64>,
    /// Speculative commit latency, median and 99th percentile (ms), for protocols that
    /// acknowledge speculatively; the latencies above are always the durable ones.
    pub speculative_latency_ms_p50: Option<f64>,
    /// 99th percentile of the speculative latency (ms).
    pub speculative_latency_ms_p99: Option<f64>,
    /// Mean latency of committed requests (ms).
    #[serde(default)]
    pub latency_ms_mean: f64,
    /// The latency CDF: `(percentile, ms)` at 1, 5, 10, 20, ... 90, 95, 99, 99.9, 99.99.
    #[serde(default)]
    pub latency_cdf_ms: Vec<(f64, f64)>,
    /// The raw latency histogram of committed requests: `(µs, count)` per recorded bucket
    /// (3 significant digits), for merging runs and redrawing.
    #[serde(default)]
    pub latency_histogram_us: Vec<(u64, u64)>,
    /// Commits and latency per second of the window.
    #[serde(default)]
    pub series: Vec<SecondStats>,
    /// The same figures per transaction type (procedure name).
    #[serde(default)]
    pub by_type: BTreeMap<String, TypeSummary>,
    /// Per coordinator region, the median latency of commits that touched every shard divided
    /// by the protocol's stated bound for that region (tiga: the round trip to the farthest
    /// member of each shard's closest super quorum plus the headroom, from the configured
    /// median delays); regions without such commits are left out.
    #[serde(default)]
    pub p50_over_bound_by_region: BTreeMap<String, f64>,
    /// The largest of [`Summary::p50_over_bound_by_region`]; `null` where the protocol
    /// states no bound.
    #[serde(default)]
    pub p50_over_bound: Option<f64>,
    /// The bound itself per coordinator region (ms).
    #[serde(default)]
    pub latency_bound_ms_by_region: BTreeMap<String, f64>,
    /// CPU time of this process (every thread) per committed request of the window (µs):
    /// in an embedded run the whole cluster's and the harness's, in a `tcp` run the clients'
    /// and coordinators' only; `null` where not measured (simulated and PostgreSQL runs).
    #[serde(default)]
    pub cpu_us_per_txn: Option<f64>,
    /// Messages the nodes received per committed transaction, over the whole run (warm-up
    /// and drain included, as the simulator counts its deliveries): what a commit costs in
    /// messages. `null` where the driver does not see every node (a `tcp` run).
    #[serde(default)]
    pub deliveries_per_commit: Option<f64>,
    /// The process's peak resident memory at the end of the window (MiB, Linux `VmHWM`): in
    /// an embedded run the whole cluster's and the harness's; `null` where not measured.
    #[serde(default)]
    pub peak_rss_mib: Option<f64>,
    /// The whole run (warm-up included) in short buckets with its faults and their
    /// recovery figures, for runs with scheduled faults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<TimelineSummary>,
}

impl RunStats {
    /// Counts requests submitted in `[window_start, window_end)` (true time, ns).
    pub fn new(window_start: Time, window_end: Time) -> Self {
        Self {
            window_start,
            window_end,
            latency_us: Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid bounds"),
            committed: 0,
            committed_all: 0,
            cross_shard: 0,
            retries: 0,
            abort_causes: BTreeMap::new(),
            user_aborted: 0,
            failed: 0,
            first_failure: None,
            outside_window: 0,
            paths: BTreeMap::new(),
            wan_hops: BTreeMap::new(),
            speculative_us: Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid bounds"),
            indeterminate: 0,
            series: Vec::new(),
            by_type: BTreeMap::new(),
            type_names: Vec::new(),
            cpu_ns: None,
            peak_rss_mib: None,
            bounds: BTreeMap::new(),
            bound_shards: 0,
            bounded_us: BTreeMap::new(),
            timeline: None,
        }
    }

    /// Sets the protocol's latency bound per coordinator node (its region's name and the
    /// bound in ns); commits that touched all `shards` count against it.
    pub fn set_latency_bounds(&mut self, shards: u32, bounds: BTreeMap<NodeId, (String, u64)>) {
        self.bound_shards = shards;
        self.bounds = bounds;
    }

    /// Names transaction types by the registry's procedure names (otherwise `proc N`).
    pub fn name_types(&mut self, registry: &meridian_core::txn::Registry) {
        self.type_names = (0..registry.len() as u32)
            .filter_map(|i| registry.get(meridian_core::txn::ProcId(i)).map(|p| p.name()))
            .collect();
    }

    /// Keeps a timeline of the whole run (every completion, the warm-up's too).
    pub fn set_timeline(&mut self, timeline: Timeline) {
        self.timeline = Some(timeline);
    }

    /// Records the process's peak resident memory at the end of the window.
    pub fn set_peak_rss_mib(&mut self, mib: f64) {
        self.peak_rss_mib = Some(mib);
    }

    /// Records the CPU time the process spent in the window.
    pub fn set_cpu_ns(&mut self, ns: u64) {
        self.cpu_ns = Some(ns);
    }

    /// Adds one completion; `wan_hops` is the number of wide-area one-way legs on its
    /// critical path, when the driver counts them.
    pub fn add(&mut self, completion: &Completion, wan_hops: Option<u16>) {
        if let Some(timeline) = &mut self.timeline {
            timeline.add(completion);
        }
        if matches!(completion.outcome.result, TxnResult::Committed) {
            self.committed_all += 1;
        }
        let in_window = completion.submitted_at >= self.window_start
            && completion.completed_at <= self.window_end;
        if !in_window {
            self.outside_window += 1;
            return;
        }
        self.retries += u64::from(completion.outcome.retries);
        let kind = self.by_type.entry(completion.txn.proc.0).or_insert_with(|| TypeStats {
            committed: 0,
            retries: 0,
            user_aborted: 0,
            failed: 0,
            latency_us: Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid bounds"),
        });
        kind.retries += u64::from(completion.outcome.retries);
        match &completion.outcome.result {
            TxnResult::Committed => {
                kind.committed += 1;
                let latency = ((completion.completed_at - completion.submitted_at) / NS_PER_US)
                    .clamp(1, LATENCY_US_MAX);
                let _ = kind.latency_us.record(latency);
            }
            TxnResult::UserAborted(_) => kind.user_aborted += 1,
            TxnResult::Failed(_) => kind.failed += 1,
        }
        for (cause, n) in completion.outcome.aborts.nonzero() {
            *self.abort_causes.entry(cause.name()).or_default() += u64::from(n);
        }
        match &completion.outcome.result {
            TxnResult::Committed => {
                self.committed += 1;
                if completion.outcome.shards_touched > 1 {
                    self.cross_shard += 1;
                }
                let latency = ((completion.completed_at - completion.submitted_at) / NS_PER_US)
                    .clamp(1, LATENCY_US_MAX);
                let _ = self.latency_us.record(latency);
                if let Some((region, _)) = self.bounds.get(&completion.coordinator) {
                    if completion.outcome.shards_touched == self.bound_shards {
                        let histogram =
                            self.bounded_us.entry(region.clone()).or_insert_with(|| {
                                Histogram::new_with_bounds(1, LATENCY_US_MAX, 3)
                                    .expect("valid bounds")
                            });
                        let _ = histogram.record(latency);
                    }
                }
                let second = ((completion.completed_at.saturating_sub(self.window_start))
                    / 1_000_000_000) as usize;
                let second = second.min(SERIES_SECONDS_MAX - 1);
                while self.series.len() <= second {
                    self.series.push(
                        Histogram::new_with_bounds(1, LATENCY_US_MAX, 2).expect("valid bounds"),
                    );
                }
                let _ = self.series[second].record(latency);
                *self.paths.entry(completion.outcome.path.name()).or_default() += 1;
                if let Some(hops) = wan_hops {
                    *self.wan_hops.entry(hops).or_default() += 1;
                }
                if let Some(ns) = completion.outcome.speculative_ns {
                    let _ = self.speculative_us.record((ns / NS_PER_US).clamp(1, LATENCY_US_MAX));
                }
            }
            TxnResult::UserAborted(_) => self.user_aborted += 1,
            TxnResult::Failed(failure) => {
                self.failed += 1;
                if matches!(failure, meridian_core::txn::TxnFailure::Indeterminate(_)) {
                    self.indeterminate += 1;
                }
                self.first_failure.get_or_insert_with(|| format!("{failure:?}"));
            }
        }
    }

    /// The summary.
    pub fn summary(&self) -> Summary {
        let window_s = (self.window_end - self.window_start) as f64 / 1e9;
        let ms = |q: f64| {
            if self.latency_us.is_empty() {
                0.0
            } else {
                self.latency_us.value_at_quantile(q) as f64 / 1e3
            }
        };
        let attempts = self.committed + self.user_aborted + self.failed + self.retries;
        let fast = self.paths.get("fast").copied().unwrap_or(0);
        let slow = self.paths.get("slow").copied().unwrap_or(0);
        let (wrtt_p50, wrtt_mean) = self.wrtt();
        let (bound_ms, over_bound) = self.bounds_ms();
        let speculative = |q: f64| {
            (!self.speculative_us.is_empty())
                .then(|| self.speculative_us.value_at_quantile(q) as f64 / 1e3)
        };
        Summary {
            window_s,
            committed: self.committed,
            throughput_txn_per_s: self.committed as f64 / window_s,
            latency_ms_p50: ms(0.5),
            latency_ms_p90: ms(0.9),
            latency_ms_p99: ms(0.99),
            latency_ms_p999: ms(0.999),
            latency_ms_max: if self.latency_us.is_empty() {
                0.0
            } else {
                self.latency_us.max() as f64 / 1e3
            },
            abort_rate: if attempts == 0 { 0.0 } else { self.retries as f64 / attempts as f64 },
            retries: self.retries,
            abort_causes: self.abort_causes.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            user_aborted: self.user_aborted,
            failed: self.failed,
            cross_shard_fraction: if self.committed == 0 {
                0.0
            } else {
                self.cross_shard as f64 / self.committed as f64
            },
            indeterminate: self.indeterminate,
            commit_paths: self.paths.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            // Of the commits that went through ordering: snapshot reads take neither path.
            fast_path_ratio: (fast + slow > 0).then(|| fast as f64 / (fast + slow) as f64),
            fast_quorum_ratio: None, // From the protocol counters: `fast_quorum_ratio`.
            wrtt_p50,
            wrtt_mean,
            speculative_latency_ms_p50: speculative(0.5),
            speculative_latency_ms_p99: speculative(0.99),
            latency_ms_mean: if self.latency_us.is_empty() {
                0.0
            } else {
                self.latency_us.mean() / 1e3
            },
            latency_cdf_ms: if self.latency_us.is_empty() {
                Vec::new()
            } else {
                CDF_PERCENTILES.iter().map(|&p| (p, ms(p / 100.0))).collect()
            },
            latency_histogram_us: self
                .latency_us
                .iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect(),
            by_type: self.type_summaries(),
            p50_over_bound: over_bound.values().copied().reduce(f64::max),
            timeline: self.timeline.as_ref().map(Timeline::summary),
            p50_over_bound_by_region: over_bound,
            latency_bound_ms_by_region: bound_ms,
            cpu_us_per_txn: self
                .cpu_ns
                .filter(|_| self.committed > 0)
                .map(|ns| ns as f64 / 1e3 / self.committed as f64),
            deliveries_per_commit: None,
            peak_rss_mib: self.peak_rss_mib,
            series: self.series_summary(),
        }
    }

    /// The median and mean wide-area round trips (half the one-way legs) on the commits'
    /// critical paths, when the driver counted them.
    fn wrtt(&self) -> (Option<f64>, Option<f64>) {
        let counted: u64 = self.wan_hops.values().sum();
        // The upper median, as an index into the sorted counts.
        let mut below = 0;
        let hops_p50 = self.wan_hops.iter().find_map(|(&hops, &n)| {
            below += n;
            (below > counted / 2).then_some(hops)
        });
        let hops_sum: f64 = self.wan_hops.iter().map(|(&h, &n)| f64::from(h) * n as f64).sum();
        (
            hops_p50.map(|h| f64::from(h) / 2.0),
            (counted > 0).then(|| hops_sum / counted as f64 / 2.0),
        )
    }

    /// Per region: its latency bound (ms), and its bounded commits' median over that bound
    /// (for the regions with a bound above zero and such commits).
    fn bounds_ms(&self) -> (BTreeMap<String, f64>, BTreeMap<String, f64>) {
        let mut bound_ms: BTreeMap<String, f64> = BTreeMap::new();
        for (region, bound_ns) in self.bounds.values() {
            bound_ms.insert(region.clone(), *bound_ns as f64 / 1e6);
        }
        let over_bound: BTreeMap<String, f64> = self
            .bounded_us
            .iter()
            .filter_map(|(region, h)| {
                let bound = *bound_ms.get(region)?;
                (bound > 0.0)
                    .then(|| (region.clone(), h.value_at_quantile(0.5) as f64 / 1e3 / bound))
            })
            .collect();
        (bound_ms, over_bound)
    }

    /// Each transaction type's figures, by its procedure's name (else `proc N`).
    fn type_summaries(&self) -> BTreeMap<String, TypeSummary> {
        self.by_type
            .iter()
            .map(|(&proc, t)| {
                let name = self
                    .type_names
                    .get(proc as usize)
                    .map_or_else(|| format!("proc {proc}"), |n| n.to_string());
                (name, t.summary())
            })
            .collect()
    }

    /// Each second of the window's commits and latencies.
    fn series_summary(&self) -> Vec<SecondStats> {
        self.series
            .iter()
            .enumerate()
            .map(|(second, h)| SecondStats {
                second: second as u32,
                committed: h.len(),
                latency_ms_p50: h.value_at_quantile(0.5) as f64 / 1e3,
                latency_ms_p99: h.value_at_quantile(0.99) as f64 / 1e3,
            })
            .collect()
    }
}

impl TypeStats {
    /// The type's figures (latencies 0 when it committed nothing).
    fn summary(&self) -> TypeSummary {
        let q = |q: f64| {
            if self.latency_us.is_empty() {
                0.0
            } else {
                self.latency_us.value_at_quantile(q) as f64 / 1e3
            }
        };
        TypeSummary {
            committed: self.committed,
            retries: self.retries,
            user_aborted: self.user_aborted,
            failed: self.failed,
            latency_ms_p50: q(0.5),
            latency_ms_p99: q(0.99),
            latency_ms_p999: q(0.999),
            latency_ms_max: q(1.0),
            latency_ms_mean: if self.latency_us.is_empty() {
                0.0
            } else {
                self.latency_us.mean() / 1e3
            },
        }
    }
}

/// [`Summary::fast_quorum_ratio`] from the run's protocol counters summed over the nodes
/// (`None` unless a protocol counts commits per path as `*_fast_commits_total` and
/// `*_slow_commits_total`, with `*_fast_quorum_after_slow_total` beside them; a counter at
/// zero is left out of the totals). The counters cover the whole run, warm-up included, so
/// the commits it divides by are the counters' too.
pub fn fast_quorum_ratio(counters: &BTreeMap<String, u64>) -> Option<f64> {
    let sum = |suffix: &str| -> u64 {
        counters.iter().filter(|(name, _)| name.ends_with(suffix)).map(|(_, v)| *v).sum()
    };
    let (fast, slow) = (sum("_fast_commits_total"), sum("_slow_commits_total"));
    let after_slow = sum("_fast_quorum_after_slow_total");
    (fast + slow > 0).then(|| (fast + after_slow.min(slow)) as f64 / (fast + slow) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::txn::{ProcId, TxnOutcome, TxnRequest};
    use meridian_core::{NodeId, RequestId};

    /// The super-quorum figure counts fast commits and slow ones whose super quorums matched
    /// later, over every commit on either path; without tiga's counters there is none.
    #[test]
    fn super_quorums_matched_count_fast_commits_and_slow_ones_matched_later() {
        let mut counters: BTreeMap<String, u64> = BTreeMap::new();
        counters.insert("luigi_commits_total".into(), 10);
        assert_eq!(fast_quorum_ratio(&counters), None, "no protocol counts it");
        counters.insert("tiga_fast_commits_total".into(), 30);
        assert_eq!(fast_quorum_ratio(&counters), Some(1.0), "counters at zero are left out");
        counters.insert("tiga_slow_commits_total".into(), 70);
        counters.insert("tiga_fast_quorum_after_slow_total".into(), 60);
        assert_eq!(fast_quorum_ratio(&counters), Some(0.9));
        counters.insert("tiga_fast_quorum_after_slow_total".into(), 500);
        assert_eq!(fast_quorum_ratio(&counters), Some(1.0), "never above every commit");
        counters.insert("tiga_fast_commits_total".into(), 0);
        counters.insert("tiga_slow_commits_total".into(), 0);
        assert_eq!(fast_quorum_ratio(&counters), None, "no commit");
    }

    fn completion(submitted_at: Time, completed_at: Time, shards: u32, retries: u32) -> Completion {
        Completion {
            client: 0,
            coordinator: NodeId(0),
            request: RequestId(0),
            txn: TxnRequest { proc: ProcId(0), args: vec![] },
            submitted_at,
            completed_at,
            outcome: TxnOutcome {
                result: TxnResult::Committed,
                outputs: vec![],
                commit_ts: None,
                retries,
                shards_touched: shards,
                path: meridian_core::txn::CommitPath::None,
                aborts: Default::default(),
                speculative_ns: None,
            },
            wan_hops: None,
        }
    }

    #[test]
    fn only_the_window_counts() {
        let ms = 1_000_000;
        let mut stats = RunStats::new(1_000 * ms, 2_000 * ms);
        stats.add(&completion(900 * ms, 1_100 * ms, 2, 0), None); // warm-up
        stats.add(&completion(1_500 * ms, 2_100 * ms, 2, 0), None); // after the end
        stats.add(&completion(1_100 * ms, 1_110 * ms, 2, 1), Some(4));
        stats.add(&completion(1_200 * ms, 1_230 * ms, 1, 0), Some(2));
        let summary = stats.summary();
        assert_eq!(summary.committed, 2);
        assert_eq!(stats.outside_window, 2);
        assert!((summary.throughput_txn_per_s - 2.0).abs() < 1e-9);
        assert!((summary.cross_shard_fraction - 0.5).abs() < 1e-9);
        assert!((summary.abort_rate - 1.0 / 3.0).abs() < 1e-9);
        assert!((summary.latency_ms_max - 30.0).abs() < 0.1);
        assert!((summary.latency_ms_p50 - 10.0).abs() < 0.1);
        assert_eq!(summary.wrtt_p50, Some(2.0), "the upper median of 1 and 2 round trips");
        assert_eq!(summary.wrtt_mean, Some(1.5));
        assert_eq!(summary.fast_path_ratio, None, "no protocol with a fast path ran");
        assert_eq!(summary.commit_paths.get("none"), Some(&2));
        // Both commits completed in the window's second 0.
        assert_eq!(summary.series.len(), 1);
        assert_eq!(summary.series[0].committed, 2);
        assert_eq!(summary.latency_histogram_us.iter().map(|(_, n)| n).sum::<u64>(), 2);
        assert!((summary.latency_ms_mean - 20.0).abs() < 0.1, "{}", summary.latency_ms_mean);
    }

    /// Per coordinator region, the median of the commits that touched every shard over that
    /// region's bound; the worst region is the headline; commits touching fewer shards and
    /// coordinators without a bound do not count.
    #[test]
    fn the_median_over_the_bound_is_per_coordinator_region() {
        let ms = 1_000_000;
        let mut stats = RunStats::new(0, 10_000 * ms);
        let bounds = BTreeMap::from([
            (NodeId(0), ("near".to_string(), 100 * ms)),
            (NodeId(1), ("far".to_string(), 200 * ms)),
        ]);
        stats.set_latency_bounds(3, bounds);
        let mut add = |coordinator: u32, latency_ms: u64, shards: u32| {
            let mut done = completion(1_000 * ms, (1_000 + latency_ms) * ms, shards, 0);
            done.coordinator = NodeId(coordinator);
            stats.add(&done, None);
        };
        for latency in [90, 100, 110] {
            add(0, latency, 3);
            add(1, 2 * latency + 20, 3); // 200, 220, 240: median 1.1 of the bound.
        }
        add(0, 5, 1); // One shard: not held against the bound.
        add(0, 6, 2);
        add(2, 500, 3); // No bound for this coordinator.
        let summary = stats.summary();
        let near = |a: f64, b: f64| (a - b).abs() < 0.005;
        let by_region = &summary.p50_over_bound_by_region;
        assert!(near(by_region["near"], 1.0), "{by_region:?}");
        assert!(near(by_region["far"], 1.1), "{by_region:?}");
        assert_eq!(by_region.len(), 2);
        assert!(near(summary.p50_over_bound.unwrap(), 1.1));
        assert_eq!(summary.latency_bound_ms_by_region["far"], 200.0);
        // Without bounds: nothing.
        let plain = RunStats::new(0, 10).summary();
        assert_eq!(plain.p50_over_bound, None);
        assert!(plain.p50_over_bound_by_region.is_empty());
    }

    #[test]
    fn percentiles_cdf_and_series_follow_known_inputs() {
        let ms = 1_000_000;
        let mut stats = RunStats::new(0, 10_000 * ms);
        // 1..=100 ms latencies, one each, completing in seconds 0..=4 (20 per second).
        for i in 1..=100u64 {
            let done = (i - 1) / 20 * 1_000 * ms + 500 * ms;
            stats.add(&completion(done - i * ms, done, 1, 0), None);
        }
        let summary = stats.summary();
        let near = |a: f64, b: f64| (a - b).abs() <= b * 0.01 + 0.01;
        assert!(near(summary.latency_ms_p50, 50.0), "{}", summary.latency_ms_p50);
        assert!(near(summary.latency_ms_p90, 90.0), "{}", summary.latency_ms_p90);
        assert!(near(summary.latency_ms_p99, 99.0), "{}", summary.latency_ms_p99);
        assert!(near(summary.latency_ms_max, 100.0), "{}", summary.latency_ms_max);
        assert!(near(summary.latency_ms_mean, 50.5), "{}", summary.latency_ms_mean);
        let cdf: Vec<f64> = summary.latency_cdf_ms.iter().map(|&(_, v)| v).collect();
        assert!(cdf.windows(2).all(|w| w[0] <= w[1]), "a CDF never decreases: {cdf:?}");
        assert!(near(summary.latency_cdf_ms[0].1, 1.0), "p1 {:?}", summary.latency_cdf_ms[0]);
        let per_second: Vec<u64> = summary.series.iter().map(|s| s.committed).collect();
        assert_eq!(per_second, [20, 20, 20, 20, 20]);
        // Second 4 holds latencies 81..=100 ms.
        assert!(near(summary.series[4].latency_ms_p99, 100.0), "{:?}", summary.series[4]);
        assert!(near(summary.series[0].latency_ms_p50, 10.0), "{:?}", summary.series[0]);
        assert_eq!(summary.by_type["proc 0"].committed, 100, "unnamed types are numbered");
        assert!(near(summary.by_type["proc 0"].latency_ms_p99, 99.0));
        let back: Summary =
            serde_json::from_str(&serde_json::to_string(&summary).unwrap()).unwrap();
        assert_eq!(back, summary, "a summary reads back as written");
    }

    #[test]
    fn transaction_types_are_kept_apart_and_named_and_cpu_is_per_commit() {
        use meridian_core::txn::{ProcId, Registry};
        #[derive(Debug)]
        struct Named(&'static str);
        impl meridian_core::txn::Procedure for Named {
            fn name(&self) -> &'static str {
                self.0
            }
            fn plan(
                &self,
                _: &meridian_core::txn::Args,
                _: meridian_core::txn::PlanContext<'_>,
            ) -> Result<meridian_core::txn::Plan, meridian_core::txn::ProcError> {
                Ok(vec![])
            }
            fn keys(
                &self,
                _: u32,
                _: &meridian_core::txn::Args,
                _: &[&meridian_core::txn::PieceOutput],
            ) -> Result<meridian_core::txn::KeySet, meridian_core::txn::ProcError> {
                Ok(Default::default())
            }
            fn execute(
                &self,
                _: u32,
                _: &meridian_core::txn::Args,
                _: &[&meridian_core::txn::PieceOutput],
                _: &meridian_core::txn::Reads,
            ) -> Result<meridian_core::txn::PieceEffects, meridian_core::txn::UserAbort>
            {
                Ok(Default::default())
            }
        }
        let mut registry = Registry::default();
        registry.register(std::sync::Arc::new(Named("new-order")));
        registry.register(std::sync::Arc::new(Named("payment")));
        let ms = 1_000_000;
        let mut stats = RunStats::new(0, 1_000 * ms);
        stats.name_types(&registry);
        for (proc, latency_ms, retries) in [(0, 10, 1), (0, 30, 0), (1, 2, 0)] {
            let mut c = completion(100 * ms, (100 + latency_ms) * ms, 1, retries);
            c.txn.proc = ProcId(proc);
            stats.add(&c, None);
        }
        stats.set_cpu_ns(3_000_000); // 3 ms of CPU for 3 commits.
        let summary = stats.summary();
        let new_order = &summary.by_type["new-order"];
        assert_eq!((new_order.committed, new_order.retries), (2, 1));
        assert!((new_order.latency_ms_max - 30.0).abs() < 0.1, "{new_order:?}");
        assert!((summary.by_type["payment"].latency_ms_p50 - 2.0).abs() < 0.01);
        assert_eq!(summary.cpu_us_per_txn, Some(1_000.0));
    }

    #[test]
    fn abort_causes_are_summed_by_name_inside_the_window() {
        use meridian_core::txn::AbortCause;
        let ms = 1_000_000;
        let mut stats = RunStats::new(1_000 * ms, 2_000 * ms);
        let mut aborted = |at: Time, causes: &[AbortCause]| {
            let mut c = completion(at, at + ms, 1, causes.len() as u32);
            causes.iter().for_each(|&cause| c.outcome.aborts.add(cause));
            stats.add(&c, None);
        };
        aborted(1_100 * ms, &[AbortCause::LockDenied, AbortCause::LockDenied]);
        aborted(1_200 * ms, &[AbortCause::Wounded, AbortCause::LockDenied]);
        aborted(500 * ms, &[AbortCause::Timeout]); // warm-up
        let summary = stats.summary();
        assert_eq!(summary.retries, 4);
        let causes: Vec<(&str, u64)> =
            summary.abort_causes.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(causes, [("lock-denied", 3), ("wounded", 1)]);
    }
}
