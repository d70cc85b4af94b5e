//! Failed proxy logins (issue 14, item 6): counted in `/metrics` by protocol,
//! logged at most once a second per source with a count (never the password,
//! never one line per attempt), and throttled per username at a source
//! address and per address (docs/DECISIONS.md, "Failed authentication"): a
//! throttled login gets the protocol's own refusal without its credentials
//! being checked, while a client from another address, or another customer
//! behind the same address, is unaffected.
//!
//! Loopback has a whole /8: binding the client socket to 127.0.0.2 (and so on)
//! makes it a different customer address.

use std::io::{Read, Write};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use blipless_tests::curl::{curl, status_code};
use blipless_tests::node::{Daemon, Node};
use blipless_tests::origin::Origin;
use blipless_tests::{raw, wait_until};

/// The wrong password every test uses: it must never reach a log.
const PASSWORD: &str = "wrong-hunter2-Zq8";

const SOCKS_FAILURES: &str = "blipless_auth_failures_total{protocol=\"socks5\"}";
const SOCKS_THROTTLED: &str = "blipless_auth_throttled_total{protocol=\"socks5\"}";
const HTTP_FAILURES: &str = "blipless_auth_failures_total{protocol=\"http\"}";
const HTTP_THROTTLED: &str = "blipless_auth_throttled_total{protocol=\"http\"}";

fn ip(text: &str) -> IpAddr {
    text.parse().expect("an address")
}

/// One SOCKS5 login from `source`: the auth status byte, after checking that
/// the proxy closes the connection on a refusal (it answers; it does not hang).
fn socks5_login_from(node: &Node, source: &str, user: &str, password: &str) -> u8 {
    let mut stream = raw::connect_from(ip(source), node.socks);
    let status = raw::socks5_login(&mut stream, user, password);
    if status != 0 {
        assert!(
            raw::closed(&mut stream),
            "a refused login from {source} is closed"
        );
    }
    status
}

/// The device plane's log lines containing every one of `words`.
fn lines_with(device: &Daemon, words: &[&str]) -> Vec<String> {
    device
        .log_text()
        .lines()
        .filter(|line| words.iter().all(|word| line.contains(word)))
        .map(str::to_owned)
        .collect()
}

/// Log lines a burst that lasted `took` may have written about one source:
/// one a second while it lasted, one for its last second, one more at most
/// for a line that straddles.
fn lines_allowed(took: Duration) -> usize {
    took.as_secs() as usize + 3
}

#[test]
fn a_burst_of_wrong_socks5_passwords_is_counted_logged_once_a_second_and_refused() {
    let mut node = Node::new("");
    let (_ingress, device, _client) = node.start();

    let started = Instant::now();
    for attempt in 0..200 {
        // Every attempt, checked or throttled, gets the failure status and a close.
        assert_eq!(
            socks5_login_from(&node, "127.0.0.1", "mallory", PASSWORD),
            1,
            "attempt {attempt}"
        );
    }
    let took = started.elapsed();

    // Counted: every attempt is a failure or a throttled refusal (the figures
    // reach the ingress with the plane's next report, within a second or so).
    wait_until(
        Duration::from_secs(30),
        "200 SOCKS5 attempts in the metrics",
        || node.metric(SOCKS_FAILURES) + node.metric(SOCKS_THROTTLED) == 200.0,
    );
    let failures = node.metric(SOCKS_FAILURES);
    let throttled = node.metric(SOCKS_THROTTLED);
    assert!(
        failures >= 5.0 && throttled > 0.0,
        "the throttle kicked in after the first failures: {failures} failed, {throttled} throttled"
    );
    assert_eq!(node.metric(HTTP_FAILURES), 0.0);

    // Logged with a count, a few lines at most, never one per attempt.
    wait_until(
        Duration::from_secs(30),
        "the log to account for every attempt",
        || {
            let counted: u64 = lines_with(&device, &["SOCKS5", "from 127.0.0.1 in the last"])
                .iter()
                .map(|line| counts_in(line))
                .sum();
            counted == 200
        },
    );
    let lines = lines_with(&device, &["SOCKS5", "from 127.0.0.1"]);
    assert!(
        !lines.is_empty() && lines.len() <= lines_allowed(took),
        "{} lines about a {took:?} burst: {lines:#?}",
        lines.len()
    );
    assert!(
        lines[0].contains("failed SOCKS5 authentication")
            && lines[0].contains("last username \"mallory\""),
        "{}",
        lines[0]
    );
    let about_mallory = lines_with(&device, &["mallory"]);
    assert!(
        about_mallory.len() <= lines_allowed(took),
        "one line per attempt: {about_mallory:#?}"
    );
    assert!(
        !device.log_text().contains(PASSWORD),
        "the password reached the log"
    );
}

/// The attempts a summary line accounts for: "N failed ..." and "N ...
/// refused while throttled".
fn counts_in(line: &str) -> u64 {
    let words: Vec<&str> = line.split_whitespace().collect();
    words
        .windows(2)
        .filter(|pair| {
            pair[1] == "failed" || (pair[1] == "SOCKS5" && line.contains("refused while throttled"))
        })
        .filter_map(|pair| pair[0].trim_start_matches(',').parse::<u64>().ok())
        .sum()
}

/// A SOCKS5 login from `source` that gets through, and a request through
/// the tunnel it opens to `origin`.
fn socks5_fetch_from(node: &Node, source: &str, user: &str, password: &str, origin: &Origin) {
    let mut stream = raw::connect_from(ip(source), node.socks);
    assert_eq!(
        raw::socks5_login(&mut stream, user, password),
        0,
        "a correct login as {user} from {source}"
    );
    assert_eq!(raw::socks5_connect_v4(&mut stream, origin.address), 0);
    stream
        .write_all(b"GET / HTTP/1.0\r\nHost: origin\r\n\r\n")
        .expect("request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("answer");
    assert!(answer.ends_with("hello"), "{answer}");
}

/// Throttles a fresh address with `throttle`, then tries a correct login
/// from it with `login`: that must be refused (auth status 1) while the
/// one-second cool-down lasts. `throttle` returns when the throttle began;
/// `login` the status. A round that did not fit in the second (loopback
/// takes milliseconds; this is for a machine slower than that) is tried
/// again from another address.
fn refused_within_a_cool_down(
    first_address: u8,
    what: &str,
    mut throttle: impl FnMut(&str) -> Instant,
    mut login: impl FnMut(&str) -> u8,
) {
    for round in 0..5u8 {
        let source = format!("127.0.{}.{}", first_address, round + 1);
        let began = throttle(&source);
        let status = login(&source);
        if began.elapsed() < Duration::from_secs(1) {
            assert_eq!(status, 1, "{what} from {source}");
            return;
        }
    }
    panic!("five rounds were each slower than the one-second throttle");
}

#[test]
fn a_throttled_socks5_login_is_refused_unchecked_while_another_address_logs_in() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let (_ingress, _device, client) = node.start();

    // The throttle lasts a second after the fifth failure: what follows must
    // happen within it.
    refused_within_a_cool_down(
        3,
        "a correct login right after five failures",
        |bad| {
            for _ in 0..4 {
                assert_eq!(socks5_login_from(&node, bad, "alice", PASSWORD), 1);
            }
            let started = Instant::now();
            assert_eq!(socks5_login_from(&node, bad, "alice", PASSWORD), 1);
            // Meanwhile a customer from another address logs in and gets through.
            socks5_fetch_from(&node, "127.0.0.2", "alice", &client.secret, &origin);
            started
        },
        // The throttled login is refused even with the right password: its
        // credentials are not checked. The refusal is the auth status and a close.
        |bad| socks5_login_from(&node, bad, "alice", &client.secret),
    );

    // After the cool-down the right password works again from the first
    // round's address.
    wait_until(
        Duration::from_secs(20),
        "127.0.3.1 to log in after its cool-down",
        || socks5_login_from(&node, "127.0.3.1", "alice", &client.secret) == 0,
    );
}

#[test]
fn a_throttled_username_leaves_its_neighbours_in_and_guesses_across_usernames_throttle_the_address()
{
    let origin = Origin::start();
    let mut node = Node::new("");
    let (_ingress, _device, alice) = node.start();
    let bob = node.add_client("bob");

    // Customers behind one NAT: alice's client retries a stale password and
    // is throttled; bob, from the same address, still gets in, and alice's
    // right password is refused unchecked while her cool-down lasts.
    refused_within_a_cool_down(
        1,
        "alice's correct login right after five failures",
        |nat| {
            for _ in 0..5 {
                assert_eq!(socks5_login_from(&node, nat, "alice", PASSWORD), 1);
            }
            let fifth = Instant::now();
            socks5_fetch_from(&node, nat, "bob", &bob.secret, &origin);
            fifth
        },
        |nat| socks5_login_from(&node, nat, "alice", &alice.secret),
    );

    // One wrong password for each of ten usernames from one address: a
    // guess across accounts throttles the whole address, bob included.
    refused_within_a_cool_down(
        2,
        "bob's correct login right after ten usernames failed",
        |sprayer| {
            for i in 0..10 {
                let user = format!("guess{i}");
                assert_eq!(socks5_login_from(&node, sprayer, &user, PASSWORD), 1);
            }
            Instant::now()
        },
        |sprayer| socks5_login_from(&node, sprayer, "bob", &bob.secret),
    );
    // From elsewhere, bob is unaffected.
    socks5_fetch_from(&node, "127.0.0.1", "bob", &bob.secret, &origin);
}

#[test]
fn http_407s_are_counted_logged_rate_limited_and_throttled_with_429() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let (_ingress, device, client) = node.start();
    let url = origin.url("/");
    let bare = format!("http://{}", node.http);
    let wrong = client.http.replace(&client.secret, PASSWORD);
    // Every answer to a request, to know what the metrics must say.
    let mut codes: Vec<String> = Vec::new();
    let get = |codes: &mut Vec<String>, proxy: &str, source: &str| {
        let code = status_code(proxy, &url, &["--interface", source]);
        codes.push(code.clone());
        code
    };

    // No credentials: 407, counted, but no strike, so a client that waits
    // for the challenge is never throttled for it.
    let started = Instant::now();
    for _ in 0..10 {
        assert_eq!(get(&mut codes, &bare, "127.0.0.1"), "407");
    }
    assert_eq!(get(&mut codes, &client.http, "127.0.0.1"), "200");

    // Wrong credentials: 407 five times, then 429 with Retry-After while
    // throttled (within the second after the fifth), whatever the password.
    let mut shown = false;
    for round in 0..5u8 {
        let (bad, good) = match round {
            0 => ("127.0.0.1".to_string(), "127.0.0.2".to_string()),
            n => (
                format!("127.0.0.{}", 30 + 2 * n),
                format!("127.0.0.{}", 31 + 2 * n),
            ),
        };
        for _ in 0..4 {
            assert_eq!(get(&mut codes, &wrong, &bad), "407");
        }
        let fifth = Instant::now();
        assert_eq!(get(&mut codes, &wrong, &bad), "407");
        assert_eq!(
            get(&mut codes, &client.http, &good),
            "200",
            "a correct request from {good} while {bad} is throttled"
        );
        let output = curl(&[
            "--max-time",
            "30",
            "-i",
            "--interface",
            &bad,
            "--proxy",
            &client.http,
            &url,
        ]);
        let head = String::from_utf8_lossy(&output.stdout).to_ascii_lowercase();
        let code = head.get(9..12).unwrap_or_default().to_string();
        codes.push(code.clone());
        if fifth.elapsed() < Duration::from_secs(1) {
            assert_eq!(code, "429", "{head}");
            assert!(head.contains("retry-after: 1\r\n"), "{head}");
            shown = true;
            break;
        }
    }
    assert!(
        shown,
        "five rounds were each slower than the one-second throttle"
    );

    // A burst from one source: a few log lines, not one per request.
    for _ in 0..40 {
        let code = get(&mut codes, &wrong, "127.0.0.1");
        assert!(code == "407" || code == "429", "{code}");
    }
    let took = started.elapsed();

    let failures = codes.iter().filter(|c| *c == "407").count() as f64;
    let throttled = codes.iter().filter(|c| *c == "429").count() as f64;
    assert!(throttled >= 1.0);
    wait_until(
        Duration::from_secs(30),
        "every 407 and 429 in the metrics",
        || node.metric(HTTP_FAILURES) == failures && node.metric(HTTP_THROTTLED) == throttled,
    );
    assert_eq!(node.metric(SOCKS_FAILURES), 0.0);

    wait_until(Duration::from_secs(30), "a log line about the 407s", || {
        !lines_with(
            &device,
            &["failed HTTP proxy authentication", "from 127.0.0.1"],
        )
        .is_empty()
    });
    let lines = lines_with(&device, &["HTTP proxy", "from 127.0.0.1"]);
    assert!(
        lines.len() <= lines_allowed(took),
        "{} lines about {} requests in {took:?}: {lines:#?}",
        lines.len(),
        codes.len()
    );
    assert!(
        lines
            .iter()
            .any(|line| line.contains("without credentials")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|line| line.contains("last username \"alice\"")),
        "{lines:#?}"
    );
    assert!(
        !device.log_text().contains(PASSWORD),
        "the password reached the log"
    );
}
