//! Percentiles over a sorted Vec (nearest rank), and formatting.

use std::time::Duration;

/// p50 and p99 of some durations; `None` when there were no samples.
#[derive(Debug, Clone, Copy, Default)]
pub struct Percentiles {
    /// Median.
    pub p50: Option<Duration>,
    /// 99th percentile.
    pub p99: Option<Duration>,
}

impl Percentiles {
    /// Sorts the samples and takes p50 and p99 by nearest rank.
    pub fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        let rank = |q: f64| -> Option<Duration> {
            if samples.is_empty() {
                return None;
            }
            let index = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1;
            Some(samples[index])
        };
        Self {
            p50: rank(0.50),
            p99: rank(0.99),
        }
    }
}

/// Microseconds, or a dash.
pub fn micros(value: Option<Duration>) -> String {
    match value {
        Some(d) => format!("{:.0} µs", d.as_secs_f64() * 1e6),
        None => "—".into(),
    }
}

/// `a - b` in signed microseconds, or None.
pub fn delta_micros(a: Option<Duration>, b: Option<Duration>) -> Option<f64> {
    Some((a?.as_secs_f64() - b?.as_secs_f64()) * 1e6)
}

/// A signed microsecond figure, or a dash.
pub fn signed_micros(value: Option<f64>) -> String {
    match value {
        Some(us) => format!("{us:+.0} µs"),
        None => "—".into(),
    }
}

/// "met" or "not met".
pub fn verdict(met: bool) -> &'static str {
    if met {
        "**met**"
    } else {
        "**not met**"
    }
}
