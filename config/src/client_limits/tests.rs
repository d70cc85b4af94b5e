use super::*;

#[test]
fn rates_parse_in_bits_and_bytes_and_print_back() {
    let cases = [
        ("10Mbit", 10_000_000),
        ("512kbit", 512_000),
        ("1Gbit", 1_000_000_000),
        ("8000bit", 8_000),
        ("2.5Mbit", 2_500_000),
        ("1MB/s", 8_000_000),
        ("20 mbit", 20_000_000),
    ];
    for (text, bits) in cases {
        let rate: Rate = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(rate.bits_per_second(), bits, "{text}");
        let again: Rate = rate.to_string().parse().expect("printed rate parses");
        assert_eq!(again, rate, "{text} printed as {rate}");
    }
}

#[test]
fn bad_rates_say_why() {
    for text in [
        "", "fast", "10", "10Mbyte", "-5Mbit", "0bit", "1bit", "1000Gbit", "1e9bit", "..Mbit",
    ] {
        let error = text.parse::<Rate>().expect_err(text);
        assert!(!error.to_string().is_empty(), "{text}");
    }
    assert!(matches!(
        "-5Mbit".parse::<Rate>(),
        Err(LimitError::OutOfRange { .. })
    ));
}

#[test]
fn quotas_parse_with_periods_and_print_back() {
    let cases = [
        ("50GB/month", 50_000_000_000, QuotaPeriod::Month),
        ("1GB/day", 1_000_000_000, QuotaPeriod::Day),
        ("10MB/week", 10_000_000, QuotaPeriod::Week),
        ("512MiB/12h", 536_870_912, QuotaPeriod::Fixed(12 * 3600)),
        (
            "2TB/30d",
            2_000_000_000_000,
            QuotaPeriod::Fixed(30 * 86_400),
        ),
    ];
    for (text, bytes, period) in cases {
        let quota: Quota = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!((quota.bytes, quota.period), (bytes, period), "{text}");
        let again: Quota = quota.to_string().parse().expect("printed quota parses");
        assert_eq!(again, quota, "{text} printed as {quota}");
    }
}

#[test]
fn bad_quotas_are_refused() {
    for text in [
        "",
        "50GB",
        "50GB/year",
        "/month",
        "0GB/month",
        "1KB/day",
        "-1GB/day",
        "5GB/0d",
        "5GB/400d",
        "5GB/30m",
        "2EB/day",
        "x/day",
    ] {
        assert!(text.parse::<Quota>().is_err(), "{text} was accepted");
    }
}

#[test]
fn connection_caps_are_bounded() {
    assert_eq!(parse_connections("5"), Ok(5));
    for text in ["0", "-1", "1.5", "2000000", "many"] {
        assert!(parse_connections(text).is_err(), "{text}");
    }
}

#[test]
fn windows_follow_the_calendar_in_utc() {
    // 2026-12-02 04:40:00 UTC.
    let now = 1_796_186_400;
    let day = QuotaPeriod::Day.window_at(now);
    assert_eq!(day.ends_at, 1_796_256_000, "2026-12-03 00:00");
    let month = QuotaPeriod::Month.window_at(now);
    assert_eq!(month.ends_at, 1_798_761_600, "2027-01-01 00:00");
    assert_eq!(
        month,
        QuotaPeriod::Month.window_at(1_796_083_200),
        "2026-12-01 00:00 is December"
    );
    assert_ne!(
        month.key,
        QuotaPeriod::Month.window_at(1_796_083_199).key,
        "a second before is November"
    );
    let week = QuotaPeriod::Week.window_at(now);
    // 2026-12-07 is a Monday.
    assert_eq!(week.ends_at, 1_796_601_600, "2026-12-07 00:00");
    let fixed = QuotaPeriod::Fixed(12 * 3600).window_at(now);
    assert_eq!(fixed.ends_at % (12 * 3600), 0);
    assert!(fixed.ends_at > now && fixed.ends_at - now <= 12 * 3600);
    // February of a leap year ends on the 29th.
    let feb_2028 = QuotaPeriod::Month.window_at(1_832_976_000); // 2028-02-01
    assert_eq!(feb_2028.ends_at, 1_835_481_600, "2028-03-01 00:00");
}

#[test]
fn a_clients_own_limits_win_over_the_node_default() {
    let own = ClientLimits {
        rate_down: Some(Rate::from_bits(8_000_000).expect("rate")),
        ..ClientLimits::default()
    };
    let node = ClientLimits {
        rate_down: Some(Rate::from_bits(1_000_000).expect("rate")),
        max_connections: Some(10),
        ..ClientLimits::default()
    };
    let effective = own.or(&node);
    assert_eq!(effective.rate_down, own.rate_down);
    assert_eq!(effective.max_connections, Some(10));
    assert!(ClientLimits::default().is_empty());
    assert!(!effective.is_empty());
}

#[test]
fn source_policies_parse_and_default_to_none() {
    assert_eq!("rotate".parse::<SourcePolicy>(), Ok(SourcePolicy::Rotate));
    assert_eq!("Sticky".parse::<SourcePolicy>(), Ok(SourcePolicy::Sticky));
    assert!("random".parse::<SourcePolicy>().is_err());
    assert_eq!(SourcePolicy::Rotate.to_string(), "rotate");
    assert_eq!(ClientLimits::default().source, None);
}
