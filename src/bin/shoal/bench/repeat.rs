//! Repeated runs (`--repeat N`): one point of the series, with one setting, run N times, reduced to
//! the median of each figure and its range.
//!
//! A shared machine's speed drifts by 10-20% from one run to the next, more than many differences
//! worth measuring. The series alternates the repeats (setting on, off, raw baseline, on, off, ...)
//! so that drift reaches every side alike, and compares medians.

use super::stats::Latency;
use super::workload::RunSummary;
use serde::Serialize;

/// The median of `values` (the mean of the middle two for an even count); None when there are
/// none. Values that are not finite are left out.
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// The lowest, median and highest value of one figure over the repeats.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    /// Over the values that are there (None when none is).
    pub fn of(values: impl IntoIterator<Item = Option<f64>>) -> Option<Spread> {
        let v: Vec<f64> = values
            .into_iter()
            .flatten()
            .filter(|v| v.is_finite())
            .collect();
        Some(Spread {
            min: v.iter().copied().reduce(f64::min)?,
            max: v.iter().copied().reduce(f64::max)?,
            median: median(v)?,
        })
    }
}

/// The repeats of one point and setting, and their medians.
#[derive(Debug, Clone, Serialize)]
pub struct Repeats {
    /// Indexes of the repeats in the report's runs (or raw baselines).
    pub runs: Vec<usize>,
    /// The run with the median delivered MB/s (the lower middle one for an even count), each of
    /// its headline figures replaced by the median over the repeats: throughputs, latency
    /// percentiles, broker and generator CPU, peak RSS. Counts and the server's other figures are
    /// that run's own. With one repeat, the run itself.
    pub median: RunSummary,
    pub delivered_mb_per_s: Spread,
    pub produced_mb_per_s: Option<Spread>,
    pub broker_cpu_s_per_gb: Option<Spread>,
    pub e2e_p99_us: Option<Spread>,
}

impl Repeats {
    /// Of `runs` (not empty), which are the report's runs at `indexes`.
    pub fn of(runs: &[&RunSummary], indexes: Vec<usize>) -> Repeats {
        assert!(!runs.is_empty() && runs.len() == indexes.len());
        let kafka = runs[0].kind == "kafka";
        Repeats {
            runs: indexes,
            median: median_summary(runs),
            delivered_mb_per_s: Spread::of(runs.iter().map(|r| Some(r.delivered.mb_per_s)))
                .expect("runs is not empty"),
            produced_mb_per_s: Spread::of(runs.iter().map(|r| Some(r.produced.mb_per_s)))
                .filter(|_| kafka),
            broker_cpu_s_per_gb: Spread::of(runs.iter().map(|r| r.server.cpu_s_per_delivered_gb)),
            e2e_p99_us: Spread::of(runs.iter().map(|r| r.e2e_latency_us.map(|l| l.p99 as f64))),
        }
    }

    pub fn count(&self) -> usize {
        self.runs.len()
    }
}

/// See [`Repeats::median`].
fn median_summary(runs: &[&RunSummary]) -> RunSummary {
    let mut sorted = runs.to_vec();
    sorted.sort_by(|a, b| a.delivered.mb_per_s.total_cmp(&b.delivered.mb_per_s));
    let mut m = sorted[(sorted.len() - 1) / 2].clone();
    if runs.len() == 1 {
        return m;
    }
    let of =
        |f: &dyn Fn(&RunSummary) -> Option<f64>| median(runs.iter().filter_map(|r| f(r)).collect());
    let set = |to: &mut f64, f: &dyn Fn(&RunSummary) -> f64| {
        if let Some(v) = of(&|r| Some(f(r))) {
            *to = v;
        }
    };
    set(&mut m.produced.mb_per_s, &|r| r.produced.mb_per_s);
    set(&mut m.produced.msg_per_s, &|r| r.produced.msg_per_s);
    set(&mut m.delivered.mb_per_s, &|r| r.delivered.mb_per_s);
    set(&mut m.delivered.msg_per_s, &|r| r.delivered.msg_per_s);
    set(&mut m.delivered.slowest_consumer_mb_per_s, &|r| {
        r.delivered.slowest_consumer_mb_per_s
    });
    set(&mut m.delivered.slowest_consumer_msg_per_s, &|r| {
        r.delivered.slowest_consumer_msg_per_s
    });
    set(&mut m.delivered.mean_fetch_bytes, &|r| {
        r.delivered.mean_fetch_bytes
    });
    set(&mut m.generator.cpu_s, &|r| r.generator.cpu_s);
    set(&mut m.generator.cores, &|r| r.generator.cores);
    m.generator.cpu_s_per_delivered_gb = of(&|r| r.generator.cpu_s_per_delivered_gb);
    m.publish_latency_us = median_latency(runs, m.publish_latency_us, |r| r.publish_latency_us);
    m.e2e_latency_us = median_latency(runs, m.e2e_latency_us, |r| r.e2e_latency_us);
    let s = &mut m.server;
    s.cpu_s = of(&|r| r.server.cpu_s);
    s.cores = of(&|r| r.server.cores);
    s.cpu_s_per_delivered_gb = of(&|r| r.server.cpu_s_per_delivered_gb);
    s.cpu_us_per_fetch = of(&|r| r.server.cpu_us_per_fetch);
    s.peak_rss_bytes = of(&|r| r.server.peak_rss_bytes.map(|b| b as f64)).map(|b| b as u64);
    s.peak_rss_growth_bytes =
        of(&|r| r.server.peak_rss_growth_bytes.map(|b| b as f64)).map(|b| b as u64);
    m.raw_baseline_fraction = of(&|r| r.raw_baseline_fraction);
    m.raw_cpu_ratio = of(&|r| r.raw_cpu_ratio);
    m.disk_baseline_fraction = of(&|r| r.disk_baseline_fraction);
    m
}

/// Each percentile's median over the runs (None if one did not measure it); the sample count is
/// `base`'s, the median run's.
fn median_latency(
    runs: &[&RunSummary],
    base: Option<Latency>,
    get: impl Fn(&RunSummary) -> Option<Latency>,
) -> Option<Latency> {
    let all: Vec<Latency> = runs.iter().map(|r| get(r)).collect::<Option<_>>()?;
    let m = |f: fn(&Latency) -> u64| {
        median(all.iter().map(|l| f(l) as f64).collect()).map_or(0, |v| v.round() as u64)
    };
    Some(Latency {
        samples: base.map_or(0, |l| l.samples),
        mean: median(all.iter().map(|l| l.mean).collect()).unwrap_or(0.0),
        p50: m(|l| l.p50),
        p99: m(|l| l.p99),
        p99_9: m(|l| l.p99_9),
        p99_99: m(|l| l.p99_99),
        max: m(|l| l.max),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_and_even_counts_skip_what_is_not_finite() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(vec![f64::NAN, 5.0, f64::INFINITY]), Some(5.0));
        let s = Spread::of([Some(3.0), None, Some(1.0), Some(2.0)]).unwrap();
        assert_eq!(
            s,
            Spread {
                min: 1.0,
                median: 2.0,
                max: 3.0
            }
        );
        assert_eq!(Spread::of([None, None]), None);
    }
}
