//! The daemons' log lines, for every bench that reads them: colour codes
//! stripped, the leading RFC 3339 UTC timestamp as Unix seconds, the lines
//! after a byte offset, `name=value` fields, Rust `Debug` durations, and the
//! warnings and errors a run's daemons logged.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use blipless_tests::node::Daemon;

/// The line without its terminal colour codes.
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters final-byte.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Seconds since the Unix epoch of a log line's leading RFC 3339 UTC
/// timestamp ("2026-11-30T12:47:18.565739Z ..."; strip the colours first).
pub fn log_time(line: &str) -> Option<f64> {
    let stamp = line.split_whitespace().next()?.strip_suffix('Z')?;
    let (date, time) = stamp.split_once('T')?;
    let mut date_parts = date.split('-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (
        date_parts.next()??,
        date_parts.next()??,
        date_parts.next()??,
    );
    let mut time_parts = time.split(':');
    let hours: f64 = time_parts.next()?.parse().ok()?;
    let minutes: f64 = time_parts.next()?.parse().ok()?;
    let seconds: f64 = time_parts.next()?.parse().ok()?;
    Some(
        days_from_civil(year, month, day) as f64 * 86_400.0
            + hours * 3600.0
            + minutes * 60.0
            + seconds,
    )
}

/// The wall clock now, in seconds since the Unix epoch (the axis of
/// [`log_time`]).
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A log's lines with a timestamp, colours stripped, each with its
/// [`log_time`].
pub fn timed_lines(text: &str) -> Vec<(f64, String)> {
    text.lines()
        .map(strip_ansi)
        .filter_map(|line| Some((log_time(&line)?, line)))
        .collect()
}

/// What a log file holds after byte `offset` ("" when unreadable).
pub fn read_from(log: &Path, offset: u64) -> String {
    let Ok(bytes) = std::fs::read(log) else {
        return String::new();
    };
    String::from_utf8_lossy(bytes.get(offset as usize..).unwrap_or_default()).into_owned()
}

/// The length of a log file now: the offset where what comes next starts.
pub fn offset(log: &Path) -> u64 {
    std::fs::metadata(log).map_or(0, |m| m.len())
}

/// The first of `lines` at or after `after` containing `needle`.
pub fn first_after<'a>(
    lines: &'a [(f64, String)],
    after: f64,
    needle: &str,
) -> Option<&'a (f64, String)> {
    lines
        .iter()
        .find(|(at, line)| *at >= after && line.contains(needle))
}

/// A `name=value` field of a log line.
pub fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=");
    line.split_whitespace()
        .find_map(|part| part.strip_prefix(key.as_str()))
}

/// A Rust `Debug` duration ("3.204s", "812.5ms", "120µs", "Some(3.2s)") in
/// seconds.
pub fn debug_duration(text: &str) -> Option<f64> {
    let text = text
        .strip_prefix("Some(")
        .and_then(|t| t.strip_suffix(')'))
        .unwrap_or(text);
    for (unit, scale) in [
        ("ns", 1e-9),
        ("µs", 1e-6),
        ("us", 1e-6),
        ("ms", 1e-3),
        ("s", 1.0),
    ] {
        if let Some(number) = text.strip_suffix(unit) {
            return number.parse::<f64>().ok().map(|n| n * scale);
        }
    }
    None
}

/// Whether a log line is a warning or an error (its level field, once the
/// colours are stripped).
pub fn is_warning(line: &str) -> bool {
    let line = strip_ansi(line);
    line.contains(" WARN ") || line.contains(" ERROR ")
}

/// Warning and error lines in the logs of `daemons`.
pub fn warning_count<'a>(daemons: impl IntoIterator<Item = &'a Daemon>) -> usize {
    daemons
        .into_iter()
        .map(|daemon| daemon.log_text().lines().filter(|l| is_warning(l)).count())
        .sum()
}

/// Warning and error lines (colours stripped) of every `*.log` in `dir`.
pub fn warning_lines(dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return lines;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "log") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            lines.extend(text.lines().filter(|l| is_warning(l)).map(strip_ansi));
        }
    }
    lines
}

/// Copies the `*.log` files (and, with `txt`, the `*.txt` files) of `dir`
/// into `target`, creating it.
pub fn copy_logs(dir: &Path, target: &Path, txt: bool) -> std::io::Result<()> {
    std::fs::create_dir_all(target)?;
    for entry in std::fs::read_dir(dir)?.flatten() {
        let path = entry.path();
        if path
            .extension()
            .is_some_and(|e| e == "log" || (txt && e == "txt"))
        {
            let _ = std::fs::copy(&path, target.join(entry.file_name()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_times_and_fields_parse() {
        let line = "2026-11-30T12:47:18.565739Z  INFO blipless_ingress::handoff::predecessor: nothing depends on this ingress any more (peers moved or idle, device planes rejoined): exiting overlap=4.1s moved=1000 idle=Some(3.012s)";
        let unix = log_time(line).expect("a time");
        assert!((unix - 1_796_042_838.565_739).abs() < 1e-3, "{unix}");
        assert_eq!(field(line, "idle").and_then(debug_duration), Some(3.012));
        assert_eq!(debug_duration("812.5ms"), Some(0.8125));
        assert_eq!(
            debug_duration("950µs").map(|s| (s * 1e6).round()),
            Some(950.0)
        );
        assert_eq!(
            strip_ansi("\u{1b}[2m2026\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m x"),
            "2026  INFO x"
        );
    }

    #[test]
    fn warnings_by_their_level() {
        assert!(is_warning(
            "\u{1b}[2m2026-11-30T12:47:18.5Z\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m x"
        ));
        assert!(is_warning(
            "2026-11-30T12:47:18.5Z ERROR blipless_device: y"
        ));
        assert!(!is_warning(
            "2026-11-30T12:47:18.5Z  INFO x: no WARNINGS here"
        ));
        let lines =
            timed_lines("2026-11-30T00:00:01Z  INFO a\nno stamp\n2026-11-30T00:00:02Z  INFO b");
        assert_eq!(lines.len(), 2);
        assert_eq!(
            first_after(&lines, 0.0, " b").map(|l| l.1.as_str()),
            Some("2026-11-30T00:00:02Z  INFO b")
        );
    }
}
