//! A client's limits (docs/LIMITS.md): a rate each way, a byte quota per
//! period and a cap on open connections, with the units operators write
//! them in (`10Mbit`, `50GB/month`, `1GB/day`); and beside them how its
//! source address is picked (sticky or rotating).
//!
//! Parsing is pure and reports why a value is refused; the same texts are
//! what `blipless-ctl` accepts, what `[limits]` in the config accepts, and
//! what [`std::fmt::Display`] writes back.

use std::fmt;

/// Slowest rate a limit may be: below it a tunnel is not usable.
pub const MIN_RATE_BITS: u64 = 8_000;
/// Fastest rate a limit may be (100 Gbit/s): above it is not a limit.
pub const MAX_RATE_BITS: u64 = 100_000_000_000;
/// Smallest quota (1 MB).
pub const MIN_QUOTA_BYTES: u64 = 1_000_000;
/// Largest quota (1 EB).
pub const MAX_QUOTA_BYTES: u64 = 1_000_000_000_000_000_000;
/// Most connections a cap may allow.
pub const MAX_CONNECTIONS: u32 = 1_000_000;
/// Longest fixed quota window (366 days), in seconds.
pub const MAX_WINDOW_SECS: u64 = 366 * 86_400;

/// What a client may use. `None` in a field: no limit of that kind (for a
/// client's own record: the node's `[limits]` default applies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ClientLimits {
    /// Customer → destination, bits per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_up: Option<Rate>,
    /// Destination → customer, bits per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_down: Option<Rate>,
    /// Bytes (both ways) per period, fleet-wide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<Quota>,
    /// Connections (tunnels) open at once on one node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// How its direct connections pick a source address from
    /// `egress.sources` (unset: sticky).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourcePolicy>,
}

/// How a client's direct connections pick their source address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourcePolicy {
    /// One address per client, kept across connections and deploys (its
    /// egress identity).
    Sticky,
    /// A new address for each connection, in turn over `egress.sources`;
    /// never changed during one connection.
    Rotate,
}

impl fmt::Display for SourcePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SourcePolicy::Sticky => "sticky",
            SourcePolicy::Rotate => "rotate",
        })
    }
}

impl std::str::FromStr for SourcePolicy {
    type Err = LimitError;
    fn from_str(text: &str) -> Result<SourcePolicy, LimitError> {
        match text.to_ascii_lowercase().as_str() {
            "sticky" => Ok(SourcePolicy::Sticky),
            "rotate" => Ok(SourcePolicy::Rotate),
            _ => Err(LimitError::Unit {
                text: text.to_owned(),
                expected: "a source policy: sticky or rotate",
            }),
        }
    }
}

impl ClientLimits {
    /// No limit set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Each field of `self`, or `default`'s where `self` has none.
    pub fn or(self, default: &ClientLimits) -> ClientLimits {
        ClientLimits {
            rate_up: self.rate_up.or(default.rate_up),
            rate_down: self.rate_down.or(default.rate_down),
            quota: self.quota.or(default.quota),
            max_connections: self.max_connections.or(default.max_connections),
            source: self.source.or(default.source),
        }
    }
}

/// A rate in bits per second, [`MIN_RATE_BITS`] to [`MAX_RATE_BITS`].
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "u64", into = "u64")]
pub struct Rate(u64);

impl Rate {
    /// Bits per second.
    pub fn bits_per_second(self) -> u64 {
        self.0
    }

    /// Bytes per second.
    pub fn bytes_per_second(self) -> u64 {
        self.0 / 8
    }

    /// The rate of `bits` per second, if within bounds.
    pub fn from_bits(bits: u64) -> Result<Rate, LimitError> {
        if !(MIN_RATE_BITS..=MAX_RATE_BITS).contains(&bits) {
            return Err(LimitError::OutOfRange {
                what: "a rate",
                range: "8kbit to 100Gbit",
            });
        }
        Ok(Rate(bits))
    }
}

impl TryFrom<u64> for Rate {
    type Error = LimitError;
    fn try_from(bits: u64) -> Result<Rate, LimitError> {
        Rate::from_bits(bits)
    }
}

impl From<Rate> for u64 {
    fn from(rate: Rate) -> u64 {
        rate.0
    }
}

impl std::str::FromStr for Rate {
    type Err = LimitError;
    /// `10Mbit`, `512kbit`, `1Gbit`, `8000bit`; or bytes per second:
    /// `1MB/s`, `100KB/s`. Decimal prefixes (k = 1000).
    fn from_str(text: &str) -> Result<Rate, LimitError> {
        let (number, unit) = split_number(text)?;
        let bits_per_unit: f64 = match unit.to_ascii_lowercase().as_str() {
            "bit" | "bps" => 1.0,
            "kbit" | "kbps" => 1e3,
            "mbit" | "mbps" => 1e6,
            "gbit" | "gbps" => 1e9,
            "b/s" => 8.0,
            "kb/s" => 8e3,
            "mb/s" => 8e6,
            "gb/s" => 8e9,
            _ => {
                return Err(LimitError::Unit {
                    text: text.to_owned(),
                    expected: "a rate such as 10Mbit, 512kbit, 1Gbit or 2MB/s",
                })
            }
        };
        Rate::from_bits(whole(number * bits_per_unit)?)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bits = self.0;
        for (unit, size) in [
            ("Gbit", 1_000_000_000),
            ("Mbit", 1_000_000),
            ("kbit", 1_000),
        ] {
            if bits.is_multiple_of(size) {
                return write!(f, "{}{unit}", bits / size);
            }
        }
        write!(f, "{bits}bit")
    }
}

/// How a quota's period runs: calendar periods in UTC, or fixed windows
/// counted from the unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaPeriod {
    /// From 00:00 UTC to the next.
    Day,
    /// From Monday 00:00 UTC to the next.
    Week,
    /// From the first of the month 00:00 UTC to the next.
    Month,
    /// Windows of this many seconds (a whole number of hours), from the epoch.
    Fixed(u64),
}

/// One period of a quota: which it is (a key the store counts under) and
/// when it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// Names this period among all periods of its kind, e.g. `month:24371`.
    pub key: String,
    /// When it ends, unix seconds.
    pub ends_at: i64,
}

impl QuotaPeriod {
    /// The period that holds `unix_seconds`.
    pub fn window_at(self, unix_seconds: i64) -> Window {
        let day = unix_seconds.div_euclid(86_400);
        match self {
            QuotaPeriod::Day => Window {
                key: format!("day:{day}"),
                ends_at: (day + 1) * 86_400,
            },
            QuotaPeriod::Week => {
                // 1970-01-01 was a Thursday: weeks start 3 days after day 4k.
                let week = (day + 3).div_euclid(7);
                Window {
                    key: format!("week:{week}"),
                    ends_at: (week * 7 + 4) * 86_400,
                }
            }
            QuotaPeriod::Month => {
                let (year, month) = year_month(day);
                let months = year * 12 + i64::from(month) - 1;
                let (next_year, next_month) = if month == 12 {
                    (year + 1, 1)
                } else {
                    (year, month + 1)
                };
                Window {
                    key: format!("month:{months}"),
                    ends_at: days_from_civil(next_year, next_month) * 86_400,
                }
            }
            QuotaPeriod::Fixed(seconds) => {
                let seconds = i64::try_from(seconds.max(1)).unwrap_or(i64::MAX);
                let index = unix_seconds.div_euclid(seconds);
                Window {
                    key: format!("{}h:{index}", seconds / 3600),
                    ends_at: index.saturating_add(1).saturating_mul(seconds),
                }
            }
        }
    }
}

impl fmt::Display for QuotaPeriod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaPeriod::Day => f.write_str("day"),
            QuotaPeriod::Week => f.write_str("week"),
            QuotaPeriod::Month => f.write_str("month"),
            QuotaPeriod::Fixed(seconds) if seconds % 86_400 == 0 => {
                write!(f, "{}d", seconds / 86_400)
            }
            QuotaPeriod::Fixed(seconds) => write!(f, "{}h", seconds / 3600),
        }
    }
}

impl std::str::FromStr for QuotaPeriod {
    type Err = LimitError;
    /// `day`, `week`, `month`, or a fixed window of whole days or hours:
    /// `30d`, `12h`.
    fn from_str(text: &str) -> Result<QuotaPeriod, LimitError> {
        let bad = || LimitError::Unit {
            text: text.to_owned(),
            expected: "a period: day, week, month, or a window such as 30d or 12h",
        };
        match text.to_ascii_lowercase().as_str() {
            "day" | "daily" => return Ok(QuotaPeriod::Day),
            "week" | "weekly" => return Ok(QuotaPeriod::Week),
            "month" | "monthly" => return Ok(QuotaPeriod::Month),
            _ => {}
        }
        let lower = text.to_ascii_lowercase();
        let (count, unit_seconds) = if let Some(days) = lower.strip_suffix('d') {
            (days, 86_400)
        } else if let Some(hours) = lower.strip_suffix('h') {
            (hours, 3600)
        } else {
            return Err(bad());
        };
        let count: u64 = count.parse().map_err(|_| bad())?;
        let seconds = count.checked_mul(unit_seconds).ok_or_else(bad)?;
        if !(3600..=MAX_WINDOW_SECS).contains(&seconds) {
            return Err(LimitError::OutOfRange {
                what: "a quota window",
                range: "1h to 366d",
            });
        }
        Ok(QuotaPeriod::Fixed(seconds))
    }
}

/// A byte quota per period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "QuotaText", into = "QuotaText")]
pub struct Quota {
    /// Bytes, both directions together.
    pub bytes: u64,
    /// The period they are counted over.
    pub period: QuotaPeriod,
}

/// How a quota is stored: `{"bytes": N, "period": "month"}`.
#[derive(serde::Serialize, serde::Deserialize)]
struct QuotaText {
    bytes: u64,
    period: String,
}

impl TryFrom<QuotaText> for Quota {
    type Error = LimitError;
    fn try_from(stored: QuotaText) -> Result<Quota, LimitError> {
        Quota::new(stored.bytes, stored.period.parse()?)
    }
}

impl From<Quota> for QuotaText {
    fn from(quota: Quota) -> QuotaText {
        QuotaText {
            bytes: quota.bytes,
            period: quota.period.to_string(),
        }
    }
}

impl Quota {
    /// A quota, if `bytes` is within bounds.
    pub fn new(bytes: u64, period: QuotaPeriod) -> Result<Quota, LimitError> {
        if !(MIN_QUOTA_BYTES..=MAX_QUOTA_BYTES).contains(&bytes) {
            return Err(LimitError::OutOfRange {
                what: "a quota",
                range: "1MB to 1EB",
            });
        }
        Ok(Quota { bytes, period })
    }
}

impl std::str::FromStr for Quota {
    type Err = LimitError;
    /// `BYTES/PERIOD`: `50GB/month`, `1GB/day`, `500MiB/12h`.
    fn from_str(text: &str) -> Result<Quota, LimitError> {
        let Some((bytes, period)) = text.split_once('/') else {
            return Err(LimitError::Unit {
                text: text.to_owned(),
                expected: "BYTES/PERIOD, such as 50GB/month, 1GB/day or 500MiB/12h",
            });
        };
        Quota::new(parse_bytes(bytes.trim())?, period.trim().parse()?)
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", format_bytes(self.bytes), self.period)
    }
}

/// A byte count: `10MB`, `1.5GB`, `512MiB`, `1048576` (bare: bytes).
/// Decimal (`KB`, `MB`, `GB`, `TB`) and binary (`KiB` … `TiB`) units.
pub fn parse_bytes(text: &str) -> Result<u64, LimitError> {
    let (number, unit) = split_number(text)?;
    let size: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1_048_576.0,
        "gib" => 1_073_741_824.0,
        "tib" => 1_099_511_627_776.0,
        _ => {
            return Err(LimitError::Unit {
                text: text.to_owned(),
                expected: "a size such as 10MB, 1.5GB or 512MiB",
            })
        }
    };
    whole(number * size)
}

/// A byte count in the largest decimal unit that writes it whole.
pub fn format_bytes(bytes: u64) -> String {
    for (unit, size) in [
        ("TB", 1_000_000_000_000u64),
        ("GB", 1_000_000_000),
        ("MB", 1_000_000),
        ("KB", 1_000),
    ] {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{}{unit}", bytes / size);
        }
    }
    format!("{bytes}B")
}

/// A connection cap: 1 to [`MAX_CONNECTIONS`].
pub fn parse_connections(text: &str) -> Result<u32, LimitError> {
    match text.trim().parse::<u32>() {
        Ok(n) if (1..=MAX_CONNECTIONS).contains(&n) => Ok(n),
        _ => Err(LimitError::OutOfRange {
            what: "a connection cap",
            range: "1 to 1000000",
        }),
    }
}

/// Why a limit's text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// Not a number followed by a known unit.
    #[error("{text:?} is not {expected}")]
    Unit {
        /// The text given.
        text: String,
        /// What would have been understood.
        expected: &'static str,
    },
    /// A number, but negative, zero or absurd.
    #[error("{what} must be from {range}")]
    OutOfRange {
        /// Which kind of value.
        what: &'static str,
        /// Its bounds, as text.
        range: &'static str,
    },
}

/// `"10.5Mbit"` → (10.5, "Mbit"); refuses a sign, an empty number or a
/// number that is not finite.
fn split_number(text: &str) -> Result<(f64, &str), LimitError> {
    let text = text.trim();
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(end);
    match number.parse::<f64>() {
        Ok(n) if n.is_finite() && !number.is_empty() => Ok((n, unit.trim())),
        _ if text.starts_with('-') => Err(LimitError::OutOfRange {
            what: "a limit",
            range: "a positive number",
        }),
        _ => Err(LimitError::Unit {
            text: text.to_owned(),
            expected: "a number followed by a unit, such as 10Mbit or 50GB",
        }),
    }
}

/// A whole count from a product that may be fractional or absurdly large.
fn whole(value: f64) -> Result<u64, LimitError> {
    // Beyond 2^63 no bound of ours holds anyway; the callers' ranges refuse it.
    if !(0.0..9.2e18).contains(&value) {
        return Err(LimitError::OutOfRange {
            what: "a limit",
            range: "a positive number of reasonable size",
        });
    }
    // In range: the conversion neither wraps nor saturates.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(value.round() as u64)
}

/// The (year, month) of a day counted from 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn year_month(days: i64) -> (i64, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, u32::try_from(month).unwrap_or(1))
}

/// Days from 1970-01-01 to the first of `month` of `year` (Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let month = i64::from(month);
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests;
