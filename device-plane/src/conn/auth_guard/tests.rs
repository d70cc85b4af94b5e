//! Unit tests of the throttle, the log lines and the counts, by passing
//! instants.

use super::*;

const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1));
const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));
/// The username [`fail`] fails as.
const ALICE: Option<&[u8]> = Some(b"alice");

fn wrong(name: &str) -> Failure<'_> {
    Failure::Wrong {
        username: Some(name.as_bytes()),
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Fails `n` times from `address`, each after a check that let it through.
fn fail(table: &mut AuthTable, address: IpAddr, n: u32, now: Instant) -> Option<Duration> {
    let mut last = None;
    for _ in 0..n {
        assert_eq!(
            table.check(address, Protocol::Socks5, ALICE, now),
            Verdict::Check
        );
        last = table.failed(address, Protocol::Socks5, wrong("alice"), now);
    }
    last
}

#[test]
fn five_failures_within_ten_seconds_throttle_for_a_second() {
    let mut table = AuthTable::new();
    let t0 = Instant::now();
    for i in 0..4 {
        let at = t0 + Duration::from_secs(2 * i);
        assert_eq!(fail(&mut table, A, 1, at), None);
    }
    let at = t0 + Duration::from_secs(9);
    assert_eq!(fail(&mut table, A, 1, at), Some(FIRST_COOL_DOWN));
    assert_eq!(
        table.check(A, Protocol::Socks5, ALICE, at + ms(400)),
        Verdict::Throttled {
            retry_after: ms(600)
        }
    );
    assert_eq!(
        table.check(A, Protocol::Http, ALICE, at + ms(999)),
        Verdict::Throttled { retry_after: ms(1) },
        "the throttle holds for every protocol"
    );
    assert_eq!(
        table.check(A, Protocol::Socks5, ALICE, at + FIRST_COOL_DOWN),
        Verdict::Check
    );
    assert_eq!(
        table.counts(),
        AuthCounts {
            socks5_failures: 5,
            socks5_throttled: 1,
            http_failures: 0,
            http_throttled: 1,
        }
    );
}

#[test]
fn failures_spread_wider_than_the_window_never_throttle() {
    let mut table = AuthTable::new();
    let t0 = Instant::now();
    for i in 0..100 {
        // Four in each ten-second window.
        let at = t0 + Duration::from_millis(2_600 * i);
        assert_eq!(fail(&mut table, A, 1, at), None, "failure {i}");
    }
}

#[test]
fn the_cool_down_doubles_up_to_a_minute() {
    let mut table = AuthTable::new();
    let mut now = Instant::now();
    let mut seen = Vec::new();
    for _ in 0..9 {
        let throttled = fail(&mut table, A, STRIKES, now).expect("throttled");
        seen.push(throttled.as_secs());
        now += throttled;
        assert_eq!(table.check(A, Protocol::Socks5, ALICE, now), Verdict::Check);
    }
    assert_eq!(seen, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
}

#[test]
fn attempts_while_throttled_are_counted_and_do_not_extend_it() {
    let mut table = AuthTable::new();
    let t0 = Instant::now();
    fail(&mut table, A, STRIKES, t0);
    for i in 0..195 {
        assert!(matches!(
            table.check(A, Protocol::Socks5, ALICE, t0 + ms(i)),
            Verdict::Throttled { .. }
        ));
    }
    let counts = table.counts();
    assert_eq!(counts.socks5_failures + counts.socks5_throttled, 200);
    assert_eq!(
        table.check(A, Protocol::Socks5, ALICE, t0 + FIRST_COOL_DOWN),
        Verdict::Check
    );
}

#[test]
fn another_source_is_unaffected_and_a_success_resets_the_username() {
    let mut table = AuthTable::new();
    let t0 = Instant::now();
    fail(&mut table, A, STRIKES, t0);
    assert!(matches!(
        table.check(A, Protocol::Socks5, ALICE, t0 + ms(10)),
        Verdict::Throttled { .. }
    ));
    assert_eq!(
        table.check(B, Protocol::Socks5, ALICE, t0 + ms(10)),
        Verdict::Check
    );
    table.succeeded(B, b"alice", t0 + ms(10));
    // After its cool-down A succeeds: it starts afresh (four strikes again
    // are not enough, and the next cool-down is the first one again).
    let later = t0 + Duration::from_secs(2);
    assert_eq!(
        table.check(A, Protocol::Socks5, ALICE, later),
        Verdict::Check
    );
    table.succeeded(A, b"alice", later);
    assert_eq!(fail(&mut table, A, STRIKES - 1, later), None);
    assert_eq!(fail(&mut table, A, 1, later), Some(FIRST_COOL_DOWN));
}

#[test]
fn a_throttled_username_leaves_the_others_at_its_address_checked() {
    // Customers behind one NAT share an address: one of them retrying a
    // stale password throttles that username, not its neighbours.
    let mut table = AuthTable::new();
    let t0 = Instant::now();
    assert_eq!(fail(&mut table, A, STRIKES, t0), Some(FIRST_COOL_DOWN));
    let soon = t0 + ms(10);
    assert!(matches!(
        table.check(A, Protocol::Socks5, ALICE, soon),
        Verdict::Throttled { .. }
    ));
    assert_eq!(
        table.check(A, Protocol::Socks5, Some(b"bob"), soon),
        Verdict::Check
    );
    assert_eq!(
        table.check(A, Protocol::Http, None, soon),
        Verdict::Check,
        "a request without credentials is challenged, not throttled"
    );
    table.succeeded(A, b"bob", soon);
    assert!(
        matches!(
            table.check(A, Protocol::Socks5, ALICE, soon),
            Verdict::Throttled { .. }
        ),
        "another username's success lifts nothing"
    );
}

#[test]
fn ten_usernames_within_the_window_throttle_the_whole_source() {
    let mut table = AuthTable::new();
    let t0 = Instant::now();
    let names: Vec<String> = (0..SOURCE_USERNAMES).map(|i| format!("user{i}")).collect();
    // Each username fails a few times (one count each), and the unreadable
    // one is a username too.
    for name in &names[..names.len() - 2] {
        for _ in 0..STRIKES - 1 {
            assert_eq!(table.failed(A, Protocol::Socks5, wrong(name), t0), None);
        }
    }
    let unreadable = Failure::Wrong { username: None };
    assert_eq!(table.failed(A, Protocol::Http, unreadable, t0), None);
    let at = t0 + Duration::from_secs(9);
    let last = wrong(names.last().expect("names"));
    assert_eq!(
        table.failed(A, Protocol::Socks5, last, at),
        Some(FIRST_COOL_DOWN)
    );
    for username in [ALICE, Some(&b"user0"[..]), None] {
        assert!(
            matches!(
                table.check(A, Protocol::Socks5, username, at + ms(1)),
                Verdict::Throttled { .. }
            ),
            "{username:?}"
        );
    }
    table.succeeded(A, b"alice", at + ms(2));
    assert!(
        matches!(
            table.check(A, Protocol::Socks5, ALICE, at + ms(3)),
            Verdict::Throttled { .. }
        ),
        "a success lifts no throttle of the whole source"
    );
    assert_eq!(table.check(B, Protocol::Socks5, ALICE, at), Verdict::Check);
    assert_eq!(
        table.check(A, Protocol::Socks5, ALICE, at + FIRST_COOL_DOWN),
        Verdict::Check
    );
}

#[test]
fn usernames_spread_wider_than_the_window_never_throttle_the_source() {
    let mut table = AuthTable::new();
    let t0 = Instant::now();
    for i in 0..200u64 {
        // Nine new usernames in each ten-second window, twice each.
        let at = t0 + ms(1_150 * i);
        let name = format!("user{i}");
        assert_eq!(table.failed(A, Protocol::Socks5, wrong(&name), at), None);
        assert_eq!(table.failed(A, Protocol::Socks5, wrong(&name), at), None);
        assert_eq!(table.check(A, Protocol::Socks5, None, at), Verdict::Check);
    }
    let entry = table.sources.get(&Source::of(A)).expect("kept");
    assert!(entry.usernames_kept() <= MAX_USERNAMES_PER_SOURCE);
}

/// Fails `count` usernames named `prefix` and a number from `address`,
/// nine every [`STRIKE_WINDOW`] from `now` on (never enough to throttle the
/// source); returns the time of the last.
fn fail_usernames(
    table: &mut AuthTable,
    address: IpAddr,
    prefix: &str,
    count: u32,
    mut now: Instant,
) -> Instant {
    for i in 0..count {
        if i % 9 == 0 {
            now += STRIKE_WINDOW;
        }
        let name = format!("{prefix}{i}");
        assert_eq!(
            table.failed(address, Protocol::Socks5, wrong(&name), now),
            None
        );
    }
    now
}

#[test]
fn a_source_full_of_usernames_keeps_the_throttled_ones_and_their_level() {
    let mut table = AuthTable::new();
    let mut now = Instant::now();
    // Alice, throttled again and again, up to the longest cool-down.
    let throttled_at = loop {
        let throttled = fail(&mut table, A, STRIKES, now).expect("throttled");
        if throttled == MAX_COOL_DOWN {
            break now;
        }
        now += throttled;
    };
    // More other usernames than a source keeps, within her cool-down: the
    // oldest records make room, not hers.
    now = fail_usernames(&mut table, A, "first", 45, now);
    assert!(now < throttled_at + MAX_COOL_DOWN, "still in her cool-down");
    let entry = table.sources.get(&Source::of(A)).expect("kept");
    assert_eq!(entry.usernames_kept(), MAX_USERNAMES_PER_SOURCE);
    assert!(matches!(
        table.check(A, Protocol::Socks5, ALICE, now),
        Verdict::Throttled { .. }
    ));
    // After it, as many again do not push her record out either: five more
    // wrong passwords earn the longest cool-down again, not the first.
    now = fail_usernames(&mut table, A, "second", 45, throttled_at + MAX_COOL_DOWN);
    let next_window = now + STRIKE_WINDOW;
    assert_eq!(
        fail(&mut table, A, STRIKES, next_window),
        Some(MAX_COOL_DOWN)
    );
}

#[test]
fn a_missing_header_is_counted_but_no_strike() {
    let mut table = AuthTable::new();
    let t0 = Instant::now();
    for _ in 0..20 {
        assert_eq!(table.failed(A, Protocol::Http, Failure::Missing, t0), None);
    }
    assert_eq!(table.check(A, Protocol::Http, None, t0), Verdict::Check);
    assert_eq!(table.counts().http_failures, 20);
    let flush = table.flush(t0);
    assert_eq!(
        flush.lines[0].to_string(),
        "20 failed HTTP proxy authentications (20 without credentials) from 127.0.0.1 in the last 1s"
    );
}

#[test]
fn a_burst_is_one_line_per_second_with_a_count() {
    let mut table = AuthTable::new();
    let t0 = Instant::now();
    fail(&mut table, A, 3, t0);
    let flush = table.flush(t0 + ms(500));
    assert_eq!(flush.lines.len(), 1);
    assert_eq!(
        flush.lines[0].to_string(),
        "3 failed SOCKS5 authentications from 127.0.0.1 in the last 1s, last username \"alice\""
    );
    // More within the second: held until a second after that line.
    fail(&mut table, A, 2, t0 + ms(600));
    for i in 0..50 {
        table.check(A, Protocol::Socks5, ALICE, t0 + ms(700 + i));
    }
    assert!(table.flush(t0 + ms(1_000)).lines.is_empty());
    assert!(table.flush(t0 + ms(1_499)).lines.is_empty());
    let flush = table.flush(t0 + ms(1_500));
    assert_eq!(flush.lines.len(), 1);
    assert_eq!(
        flush.lines[0].to_string(),
        "2 failed SOCKS5 authentications, 50 SOCKS5 attempts refused while throttled from 127.0.0.1 in the last 1s, last username \"alice\"; throttled for 1s more"
    );
    // Nothing new: no line.
    assert!(table.flush(t0 + ms(5_000)).lines.is_empty());
}

#[test]
fn usernames_are_truncated_and_escaped_and_sources_are_sixty_fours() {
    let mut table = AuthTable::new();
    let t0 = Instant::now();
    let mut name = b"evil\n\x1b[31m\xff".to_vec();
    name.extend(std::iter::repeat_n(b'x', 300));
    let v6: IpAddr = "2001:db8:1:2:aaaa::1".parse().expect("address");
    let same_64: IpAddr = "2001:db8:1:2:bbbb::9".parse().expect("address");
    table.failed(
        v6,
        Protocol::Socks5,
        Failure::Wrong {
            username: Some(&name),
        },
        t0,
    );
    table.failed(
        same_64,
        Protocol::Http,
        Failure::Wrong { username: None },
        t0,
    );
    let flush = table.flush(t0);
    assert_eq!(flush.lines.len(), 1, "one source for the /64");
    let line = flush.lines[0].to_string();
    assert!(line.contains("from 2001:db8:1:2::/64 "), "{line}");
    assert!(
        line.contains(r#"last username "evil\n\u{1b}[31m�xxx"#),
        "{line}"
    );
    assert!(!line.contains('\n') && !line.contains('\x1b'), "{line}");
    let shown = flush.lines[0].last_username.as_deref().expect("username");
    assert_eq!(shown.chars().count(), MAX_USERNAME_CHARS);
    let mapped: IpAddr = "::ffff:127.0.0.1".parse().expect("address");
    assert_eq!(Source::of(mapped), Source::of(A));
}

#[test]
fn quiet_sources_are_forgotten_and_the_table_is_capped() {
    let mut table = AuthTable::new();
    let t0 = Instant::now();
    fail(&mut table, A, STRIKES, t0);
    table.flush(t0);
    assert_eq!(table.len(), 1);
    table.flush(t0 + FORGET_AFTER - ms(1));
    assert_eq!(table.len(), 1);
    table.flush(t0 + FORGET_AFTER);
    assert!(table.is_empty(), "forgotten, throttle level and all");

    let mut now = t0;
    for i in 0..(MAX_SOURCES as u32 + 10) {
        now += Duration::from_micros(1);
        let address = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
        table.failed(address, Protocol::Socks5, wrong("x"), now);
        assert!(table.len() <= MAX_SOURCES);
    }
    // The oldest went first; the newest is still there.
    let newest = IpAddr::V4(std::net::Ipv4Addr::from(
        0x0a00_0000 + MAX_SOURCES as u32 + 9,
    ));
    assert!(table.sources.contains_key(&Source::of(newest)));
    let oldest = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000));
    assert!(!table.sources.contains_key(&Source::of(oldest)));
    // The counts do not depend on what the table keeps.
    assert_eq!(
        table.counts().socks5_failures,
        u64::from(STRIKES) + MAX_SOURCES as u64 + 10
    );
}

#[test]
fn a_flush_names_a_bounded_number_of_sources() {
    let mut table = AuthTable::new();
    let t0 = Instant::now();
    for i in 0..100u32 {
        let address = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
        table.failed(address, Protocol::Http, wrong("x"), t0);
    }
    let flush = table.flush(t0);
    assert_eq!(flush.lines.len(), MAX_LINES_PER_FLUSH);
    assert_eq!(flush.more_sources, 100 - MAX_LINES_PER_FLUSH as u64);
    assert_eq!(flush.more_failures, 100 - MAX_LINES_PER_FLUSH as u64);
}

#[test]
fn counts_since_an_earlier_report() {
    let guard = AuthGuard::new();
    let t0 = Instant::now();
    guard.failed(A, Protocol::Socks5, wrong("a"), t0);
    guard.set_reported(guard.counts());
    guard.failed(A, Protocol::Http, Failure::Missing, t0);
    let since = guard.counts().since(&guard.reported());
    assert_eq!(
        since,
        AuthCounts {
            http_failures: 1,
            ..AuthCounts::default()
        }
    );
}
