//! Statistics over samples, for every bench: nearest-rank percentiles and
//! medians, of durations and of plain numbers.
//!
//! Percentiles are by nearest rank: the q-quantile of n sorted samples is the
//! one at rank ⌈q·n⌉ (from 1), so the median of an even count is the lower of
//! the two middle samples. [`upper_median`] is the other middle, for the
//! figures that have always been taken that way.

use std::time::Duration;

/// The q-quantile (0 < q ≤ 1) of `sorted` by nearest rank; `None` when empty.
pub fn nearest_rank<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let index = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[index])
}

/// The sample at index n/2 of `sorted`: the median of an odd count, the
/// upper of the two middles of an even one; `None` when empty.
pub fn upper_median<T: Copy>(sorted: &[T]) -> Option<T> {
    sorted.get(sorted.len() / 2).copied()
}

/// `values` sorted (NaN last, as `f64::total_cmp` orders it).
pub fn sorted_f64(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values
}

/// The median of `values` by nearest rank; NaN when there are none.
pub fn median_f64(values: impl IntoIterator<Item = f64>) -> f64 {
    nearest_rank(&sorted_f64(values.into_iter().collect()), 0.5).unwrap_or(f64::NAN)
}

/// The largest of `values` (NaNs ignored); NaN when there are none.
pub fn max_f64(values: impl IntoIterator<Item = f64>) -> f64 {
    values.into_iter().fold(f64::NAN, f64::max)
}

/// The smallest of `values` (NaNs ignored); NaN when there are none.
pub fn min_f64(values: impl IntoIterator<Item = f64>) -> f64 {
    values.into_iter().fold(f64::NAN, f64::min)
}

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
        Self {
            p50: nearest_rank(&samples, 0.50),
            p99: nearest_rank(&samples, 0.99),
        }
    }
}

/// Median (nearest rank) of some durations.
pub fn p50(samples: &[Duration]) -> Option<Duration> {
    Percentiles::of(samples.to_vec()).p50
}

/// Median (nearest rank) of some optional durations, over those present.
pub fn p50_of(values: impl Iterator<Item = Option<Duration>>) -> Option<Duration> {
    p50(&values.flatten().collect::<Vec<_>>())
}

/// The longest of some durations.
pub fn max(samples: &[Duration]) -> Option<Duration> {
    samples.iter().max().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_and_the_two_medians() {
        let odd = [1, 2, 3];
        let even = [1, 2, 3, 4];
        assert_eq!(nearest_rank(&odd, 0.5), Some(2));
        assert_eq!(nearest_rank(&even, 0.5), Some(2));
        assert_eq!(upper_median(&even), Some(3));
        assert_eq!(nearest_rank(&even, 0.99), Some(4));
        assert_eq!(nearest_rank::<u32>(&[], 0.5), None);
        let hundred: Vec<u32> = (1..=100).collect();
        assert_eq!(nearest_rank(&hundred, 0.99), Some(99));
        assert_eq!(nearest_rank(&hundred, 1.0), Some(100));
    }

    #[test]
    fn plain_numbers() {
        assert_eq!(median_f64([3.0, 1.0, 2.0, 4.0]), 2.0);
        assert!(median_f64([]).is_nan());
        assert_eq!(max_f64([1.0, f64::NAN, 3.0]), 3.0);
        assert_eq!(min_f64([2.0, 1.0]), 1.0);
        assert!(max_f64([]).is_nan());
    }
}
