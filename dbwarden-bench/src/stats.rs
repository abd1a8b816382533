//! Order statistics over timed samples, and how durations are printed in the tables.

use std::time::Duration;

/// Median, p99 and max of a set of samples.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub n: usize,
    pub median: Duration,
    pub p99: Duration,
    pub max: Duration,
}

/// The nearest-rank percentile `p` (0–100) of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summarise `samples` (any order).
pub fn summarize(samples: &[Duration]) -> Summary {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    Summary {
        n: sorted.len(),
        median: median(&sorted),
        p99: percentile(&sorted, 99.0),
        max: sorted.last().copied().unwrap_or_default(),
    }
}

/// The median of sorted durations (mean of the middle two for an even count).
fn median(sorted: &[Duration]) -> Duration {
    match sorted.len() {
        0 => Duration::ZERO,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2,
    }
}

/// The median of plain numbers (ratios, kilobytes).
pub fn median_f64(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Milliseconds with a precision that suits the size: `0.087 ms`, `4.21 ms`, `1234 ms`.
pub fn ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1000.0;
    if v < 1.0 {
        format!("{v:.3} ms")
    } else if v < 100.0 {
        format!("{v:.2} ms")
    } else {
        format!("{v:.0} ms")
    }
}

/// `a ÷ b` as a ratio.
pub fn ratio(a: Duration, b: Duration) -> f64 {
    if b.is_zero() {
        f64::NAN
    } else {
        a.as_secs_f64() / b.as_secs_f64()
    }
}
