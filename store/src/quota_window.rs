//! Ordering quota windows ([`blipless_config::client_limits::Window::key`]:
//! `day:N`, `week:N`, `month:N`, `<hours>h:N`), so that a count kept for the
//! next window is not restarted by an add from a node whose clock lags
//! ([`crate::Store::add_quota_usage`]). The Redis store's script applies the
//! same rule in Lua.

/// Longest window index either store reads (15 digits: every such number
/// is exact in the Lua script's doubles as well).
const MAX_INDEX_DIGITS: usize = 15;

/// Whether `kept` is the window right after `window` in the same period:
/// the same text before the last `:`, and after it a number one greater.
/// One window of skew only: a count kept for a window further ahead (a node
/// whose clock was set years ahead) must not pin the fleet's count there,
/// so the add's window replaces it as for any other key. Indexes are
/// `-?[0-9]{1,15}`; a key of any other shape is never later.
pub(crate) fn is_next(kept: &str, window: &str) -> bool {
    let split = |key: &str| -> Option<(String, i64)> {
        let (period, index) = key.rsplit_once(':')?;
        let digits = index.strip_prefix('-').unwrap_or(index);
        if digits.is_empty()
            || digits.len() > MAX_INDEX_DIGITS
            || !digits.bytes().all(|b| b.is_ascii_digit())
        {
            return None;
        }
        Some((period.to_owned(), index.parse().ok()?))
    };
    match (split(kept), split(window)) {
        (Some((kept_period, kept_index)), Some((period, index))) => {
            kept_period == period && index.checked_add(1) == Some(kept_index)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::is_next;

    #[test]
    fn only_the_next_index_of_the_same_period_counts() {
        assert!(is_next("day:20001", "day:20000"));
        assert!(!is_next("day:20002", "day:20000"), "two windows ahead");
        assert!(!is_next("day:24000", "day:20000"), "a clock years ahead");
        assert!(!is_next("day:20000", "day:20001"));
        assert!(!is_next("day:20000", "day:20000"));
        assert!(is_next("week:3001", "week:3000"));
        assert!(!is_next("week:20001", "day:20000"), "another period");
        assert!(is_next("24h:5", "24h:4"));
        assert!(!is_next("12h:5", "24h:4"));
        assert!(is_next("day:0", "day:-1"));
        assert!(!is_next("day:x", "day:1") && !is_next("day", "day:1"));
        assert!(!is_next("day:+2", "day:1"), "a sign Lua would not read");
        assert!(
            !is_next("day:1000000000000000", "day:999999999999999"),
            "16 digits"
        );
        assert!(!is_next("day:1", "garbage"));
    }
}
