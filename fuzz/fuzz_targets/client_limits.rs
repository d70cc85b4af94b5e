//! Feeds arbitrary text to the parsers of a client's limits (what
//! `blipless-ctl client add|set` and `[limits]` accept) and arbitrary bytes
//! to the stored JSON a device plane reads from the store: none may panic,
//! and a value that parses prints as text that parses back to it.
#![no_main]

use blipless_config::client_limits::{self, ClientLimits, Quota, QuotaPeriod, Rate, SourcePolicy};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(rate) = text.parse::<Rate>() {
            assert_eq!(rate.to_string().parse::<Rate>(), Ok(rate));
        }
        if let Ok(quota) = text.parse::<Quota>() {
            assert_eq!(quota.to_string().parse::<Quota>(), Ok(quota));
            let _ = quota.period.window_at(i64::from(data.len() as u32) * 86_399);
        }
        if let Ok(period) = text.parse::<QuotaPeriod>() {
            let _ = period.window_at(-1);
            let _ = period.window_at(i64::MAX / 2);
        }
        let _ = text.parse::<SourcePolicy>();
        let _ = client_limits::parse_bytes(text);
        let _ = client_limits::parse_connections(text);
    }
    if let Ok(limits) = serde_json::from_slice::<ClientLimits>(data) {
        let json = serde_json::to_string(&limits).expect("limits encode");
        assert_eq!(serde_json::from_str::<ClientLimits>(&json).ok(), Some(limits));
    }
});
