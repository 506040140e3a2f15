//! Latency histograms for metrics: fixed buckets of atomic counters that
//! any thread records into without a lock, and that a metrics endpoint
//! reads at any time.
//!
//! The bucket bounds are a 1-2.5-5 series from 1 µs to 10 s
//! ([`BOUNDS_NS`]), the usual choice of Prometheus histograms: 22 bounds
//! plus an overflow bucket. Recording is a short search and two relaxed
//! atomic additions. Quantiles read from a [`Snapshot`] are the upper
//! bound of the bucket they fall into (an over-estimate by at most the
//! bucket's width), which is what a Prometheus `histogram_quantile` of the
//! same data would interpolate within.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Upper bounds of the buckets, in nanoseconds (the last bucket, above
/// 10 s, has no bound: `+Inf`).
pub const BOUNDS_NS: [u64; 22] = [
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Buckets, the overflow included.
pub const BUCKETS: usize = BOUNDS_NS.len() + 1;

/// A latency histogram; `Sync`, recorded into by any thread.
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { buckets: std::array::from_fn(|_| AtomicU64::new(0)), sum_ns: AtomicU64::new(0) }
    }
}

/// The bucket a latency falls into (the first whose bound is not below it).
pub fn bucket_of(ns: u64) -> usize {
    BOUNDS_NS.partition_point(|&b| b < ns)
}

impl Histogram {
    /// Record one latency.
    pub fn record(&self, d: Duration) {
        self.record_ns(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Record one latency in nanoseconds.
    pub fn record_ns(&self, ns: u64) {
        self.buckets[bucket_of(ns)].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    /// Record the time since `start`.
    pub fn since(&self, start: Instant) {
        self.record(start.elapsed());
    }

    /// A copy of the counts. Taken bucket by bucket while others record,
    /// it is consistent with itself (the count is the sum of the buckets)
    /// though the sum may include a recording whose bucket it missed.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot { buckets: std::array::from_fn(|i| self.buckets[i].load(Relaxed)), sum_ns: self.sum_ns.load(Relaxed) }
    }
}

/// A copy of a [`Histogram`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// Counts per bucket (not cumulative); the last is above 10 s.
    pub buckets: [u64; BUCKETS],
    /// Sum of every recorded latency, nanoseconds.
    pub sum_ns: u64,
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot { buckets: [0; BUCKETS], sum_ns: 0 }
    }
}

impl Snapshot {
    /// Recorded latencies.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Mean latency in nanoseconds (0 when empty).
    pub fn mean_ns(&self) -> u64 {
        self.sum_ns.checked_div(self.count()).unwrap_or(0)
    }

    /// The `q` quantile (0..=1) as the upper bound of its bucket, in
    /// nanoseconds; `None` when empty, `u64::MAX` when in the overflow.
    pub fn quantile_ns(&self, q: f64) -> Option<u64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.buckets.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(BOUNDS_NS.get(i).copied().unwrap_or(u64::MAX));
            }
        }
        Some(u64::MAX)
    }

    /// Cumulative counts with their upper bounds in seconds (`+Inf` last),
    /// as a Prometheus histogram lists them.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut seen = 0;
        self.buckets
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                seen += c;
                (BOUNDS_NS.get(i).map_or(f64::INFINITY, |&b| b as f64 / 1e9), seen)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_take_latencies_up_to_their_bound() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1_000), 0);
        assert_eq!(bucket_of(1_001), 1);
        assert_eq!(bucket_of(99_999), 6);
        assert_eq!(bucket_of(100_000), 6);
        assert_eq!(bucket_of(10_000_000_000), BUCKETS - 2);
        assert_eq!(bucket_of(10_000_000_001), BUCKETS - 1);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert!(BOUNDS_NS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn counts_sums_quantiles_and_cumulative_buckets() {
        let h = Histogram::default();
        assert_eq!(h.snapshot().quantile_ns(0.5), None);
        // 90 fast (≤ 10 µs), 9 at 3 ms, 1 above 10 s.
        for _ in 0..90 {
            h.record(Duration::from_micros(7));
        }
        for _ in 0..9 {
            h.record_ns(3_000_000);
        }
        h.record(Duration::from_secs(11));
        let s = h.snapshot();
        assert_eq!(s.count(), 100);
        assert_eq!(s.sum_ns, 90 * 7_000 + 9 * 3_000_000 + 11_000_000_000);
        assert_eq!(s.mean_ns(), s.sum_ns / 100);
        assert_eq!(s.quantile_ns(0.5), Some(10_000));
        assert_eq!(s.quantile_ns(0.9), Some(10_000));
        assert_eq!(s.quantile_ns(0.91), Some(5_000_000));
        assert_eq!(s.quantile_ns(0.99), Some(5_000_000));
        assert_eq!(s.quantile_ns(1.0), Some(u64::MAX));
        let c = s.cumulative();
        assert_eq!(c.len(), BUCKETS);
        assert_eq!(c[3], (10e-6, 90));
        assert_eq!(c[11], (5e-3, 99));
        assert_eq!(c[BUCKETS - 2].1, 99);
        assert_eq!(c[BUCKETS - 1], (f64::INFINITY, 100));
    }

    #[test]
    fn threads_record_without_losing_counts() {
        let h = std::sync::Arc::new(Histogram::default());
        let ts: Vec<_> = (0..4)
            .map(|t| {
                let h = h.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000u64 {
                        h.record_ns(i * 1_000 + t);
                    }
                })
            })
            .collect();
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(h.snapshot().count(), 40_000);
    }
}
