//! How figures are written in docs/BENCHMARKS.md's tables, for every bench:
//! microseconds, milliseconds, seconds, MiB, counts with thousands
//! separators, percentages and the "met" verdicts. A missing figure is "—".

use std::time::Duration;

/// "12 µs", or a dash.
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

/// "+12 µs", or a dash.
pub fn signed_micros(value: Option<f64>) -> String {
    match value {
        Some(us) => format!("{us:+.0} µs"),
        None => "—".into(),
    }
}

/// "12.3 ms", or a dash.
pub fn millis(value: Option<Duration>) -> String {
    value.map_or("—".into(), |d| format!("{:.1} ms", d.as_secs_f64() * 1e3))
}

/// "100 ms" (whole milliseconds).
pub fn whole_millis(value: Duration) -> String {
    format!("{} ms", value.as_millis())
}

/// "3 s", "1.5 s".
pub fn seconds(value: Duration) -> String {
    format!("{} s", value.as_secs_f64())
}

/// A time in seconds at a precision that suits it: "20 ms", "3.02 s",
/// "12.3 s"; a dash for NaN. Within half a millisecond of zero is zero (a
/// difference of log timestamps can come out a hair below it).
pub fn short_seconds(seconds: f64) -> String {
    let seconds = if seconds.abs() < 0.0005 { 0.0 } else { seconds };
    if seconds.is_nan() {
        "—".into()
    } else if seconds >= 10.0 {
        format!("{seconds:.1} s")
    } else if seconds >= 1.0 {
        format!("{seconds:.2} s")
    } else {
        format!("{:.0} ms", seconds * 1000.0)
    }
}

/// KiB as "8.6 MiB".
pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// 10000 → "10,000".
pub fn count(value: usize) -> String {
    let digits = value.to_string();
    let groups: Vec<&str> = digits
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|group| std::str::from_utf8(group).unwrap_or("?"))
        .collect();
    groups.join(",")
}

/// 0.42 → "42%".
pub fn percent(fraction: f64) -> String {
    format!("{:.0}%", fraction * 100.0)
}

/// "**met**" or "**not met**".
pub fn verdict(met: bool) -> &'static str {
    if met {
        "**met**"
    } else {
        "**not met**"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_000), "1,000");
        assert_eq!(count(32_880), "32,880");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(short_seconds(-0.0002), "0 ms");
        assert_eq!(short_seconds(3.024), "3.02 s");
        assert_eq!(short_seconds(12.34), "12.3 s");
        assert_eq!(short_seconds(f64::NAN), "—");
        assert_eq!(millis(Some(Duration::from_micros(4_160))), "4.2 ms");
        assert_eq!(millis(None), "—");
        assert_eq!(micros(Some(Duration::from_micros(26))), "26 µs");
        assert_eq!(signed_micros(Some(177.2)), "+177 µs");
        assert_eq!(mib(8806), "8.6 MiB");
        assert_eq!(percent(0.724), "72%");
        assert_eq!(verdict(false), "**not met**");
    }
}
