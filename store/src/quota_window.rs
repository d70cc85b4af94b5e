//! Ordering quota windows ([`blipless_config::client_limits::Window::key`]:
//! `day:N`, `week:N`, `month:N`, `<hours>h:N`), so that a count kept for a
//! later window is not restarted by an add from a node whose clock lags
//! ([`crate::Store::add_quota_usage`]). The Redis store's script applies the
//! same rule in Lua.

/// Whether `kept` is a later window of the same period as `window`: the
/// same text before the last `:`, and a greater number after it. Keys that
/// do not have that shape are never later (the add's window replaces them).
pub(crate) fn is_later(kept: &str, window: &str) -> bool {
    let split = |key: &str| -> Option<(String, i64)> {
        let (period, index) = key.rsplit_once(':')?;
        Some((period.to_owned(), index.parse().ok()?))
    };
    match (split(kept), split(window)) {
        (Some((kept_period, kept_index)), Some((period, index))) => {
            kept_period == period && kept_index > index
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::is_later;

    #[test]
    fn only_a_greater_index_of_the_same_period_is_later() {
        assert!(is_later("day:20001", "day:20000"));
        assert!(!is_later("day:20000", "day:20001"));
        assert!(!is_later("day:20000", "day:20000"));
        assert!(!is_later("week:3000", "day:20000"), "another period");
        assert!(is_later("24h:5", "24h:4"));
        assert!(!is_later("12h:5", "24h:4"));
        assert!(!is_later("day:x", "day:1") && !is_later("day", "day:1"));
        assert!(!is_later("day:1", "garbage"));
    }
}
