//! Self-test of the upstream SOCKS5 harnesses, with none of our daemons:
//! curl through a real dante (`blipless_tests::dante`) to the test origin,
//! its authentication, kill and restart, and the cleanup of its system
//! user; and curl against each behaviour of the misbehaving upstream
//! (`blipless_tests::fake_upstream`). The dante tests need root (they create
//! system users) and fail, never skip, without it.

use std::net::Ipv4Addr;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use blipless_tests::curl::{curl, fetch};
use blipless_tests::dante::Dante;
use blipless_tests::fake_upstream::{Behaviour, FakeUpstream};
use blipless_tests::origin::Origin;
use blipless_tests::{pattern, sha256};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// curl through `proxy` to `url`, without asserting success.
fn attempt(proxy: &str, url: &str) -> Output {
    curl(&["--max-time", "20", "--proxy", proxy, url])
}

fn getent_passwd(name: &str) -> Output {
    Command::new("getent")
        .args(["passwd", name])
        .output()
        .expect("running getent")
}

#[test]
fn curl_through_dante_reaches_the_origin_from_the_external_address() {
    let origin = Origin::start();
    let external = Ipv4Addr::new(127, 0, 0, 3);
    let dante = Dante::start(external);
    assert!(!dante.username.is_empty() && !dante.password.is_empty());

    let body = fetch(&dante.url(), &origin.url("/bytes/1000000"), &[]);
    assert_eq!(body.len(), 1_000_000, "{}", dante.log_text());
    assert_eq!(sha256(&body), sha256(&pattern(1_000_000)));

    // The origin sees dante's external address, not the client's 127.0.0.1.
    let whoami = fetch(&dante.url(), &origin.url("/whoami"), &[]);
    assert_eq!(text(&whoami), "127.0.0.3", "{}", dante.log_text());

    // curl's other spelling of the same thing.
    let credentials = format!("{}:{}", dante.username, dante.password);
    let output = curl(&[
        "--max-time",
        "20",
        "--socks5-hostname",
        &dante.address.to_string(),
        "--proxy-user",
        &credentials,
        &origin.url("/whoami"),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "127.0.0.3");
}

#[test]
fn dante_without_auth_needs_no_credentials() {
    let origin = Origin::start();
    let dante = Dante::start_without_auth(Ipv4Addr::new(127, 0, 0, 4));
    assert!(dante.username.is_empty());
    assert_eq!(dante.url(), format!("socks5h://{}", dante.address));
    let whoami = fetch(&dante.url(), &origin.url("/whoami"), &[]);
    assert_eq!(text(&whoami), "127.0.0.4", "{}", dante.log_text());
    let body = fetch(&dante.url(), &origin.url("/bytes/65536"), &[]);
    assert_eq!(body, pattern(65536));
}

#[test]
fn dante_refuses_a_wrong_password_and_no_credentials() {
    let origin = Origin::start();
    let dante = Dante::start(Ipv4Addr::new(127, 0, 0, 3));
    let wrong = format!(
        "socks5h://{}:{}x@{}",
        dante.username, dante.password, dante.address
    );
    let output = attempt(&wrong, &origin.url("/whoami"));
    assert!(
        !output.status.success(),
        "a wrong password got through: {}",
        text(&output.stdout)
    );
    assert!(
        text(&output.stderr).contains("rejected"),
        "{}",
        text(&output.stderr)
    );

    let anonymous = format!("socks5h://{}", dante.address);
    let output = attempt(&anonymous, &origin.url("/whoami"));
    assert!(!output.status.success(), "no credentials got through");

    let unknown = format!("socks5h://nobody:{}@{}", dante.password, dante.address);
    assert!(!attempt(&unknown, &origin.url("/whoami")).status.success());

    assert_eq!(
        origin.connections(),
        0,
        "a refused client reached the origin"
    );
    // The right password still works.
    assert_eq!(
        text(&fetch(&dante.url(), &origin.url("/whoami"), &[])),
        "127.0.0.3"
    );
}

#[test]
fn dante_kill_then_restart_serves_again_on_the_same_port() {
    let origin = Origin::start();
    let mut dante = Dante::start(Ipv4Addr::new(127, 0, 0, 3));
    let address = dante.address;
    assert_eq!(
        fetch(&dante.url(), &origin.url("/bytes/1000"), &[]),
        pattern(1000)
    );
    let first = dante.pid();

    // A relayed download in flight dies with dante (its children too).
    let url = dante.url();
    let slow = origin.url("/slow/5000");
    let in_flight = std::thread::spawn(move || attempt(&url, &slow));
    blipless_tests::wait_until(
        Duration::from_secs(10),
        "the slow request to reach the origin",
        || origin.connections() >= 2,
    );
    let killed = Instant::now();
    dante.kill();
    assert!(!dante.is_running());
    let output = in_flight.join().expect("the in-flight curl");
    assert!(
        !output.status.success(),
        "the relayed request survived the kill: {}",
        text(&output.stdout)
    );
    assert!(
        killed.elapsed() < Duration::from_secs(4),
        "it ended only at the origin's answer"
    );
    assert!(
        !attempt(&dante.url(), &origin.url("/whoami"))
            .status
            .success(),
        "a killed dante still answered"
    );

    dante.restart();
    assert_eq!(dante.address, address);
    assert_ne!(dante.pid(), first);
    assert_eq!(
        text(&fetch(&dante.url(), &origin.url("/whoami"), &[])),
        "127.0.0.3"
    );
    assert_eq!(
        fetch(&dante.url(), &origin.url("/bytes/1000"), &[]),
        pattern(1000)
    );

    // Again, as a failover test would do it repeatedly.
    dante.kill();
    dante.restart();
    assert_eq!(
        fetch(&dante.url(), &origin.url("/bytes/1000"), &[]),
        pattern(1000)
    );
}

#[test]
fn dropping_dante_removes_its_user_and_process() {
    let dante = Dante::start(Ipv4Addr::new(127, 0, 0, 3));
    let name = dante.username.clone();
    let pid = dante.pid();
    let entry = getent_passwd(&name);
    assert!(entry.status.success(), "getent passwd {name} found nothing");
    let entry = text(&entry.stdout);
    assert!(entry.ends_with(":/usr/sbin/nologin\n"), "{entry}");
    let path = dante.path().to_path_buf();
    drop(dante);

    let entry = getent_passwd(&name);
    assert!(
        !entry.status.success(),
        "{name} is still there after drop: {}",
        text(&entry.stdout)
    );
    assert!(!path.exists(), "the temporary folder is still there");
    let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok();
    assert!(!alive, "dante {pid} still runs after drop");
}

#[test]
fn fake_upstream_garbage_fails_the_client() {
    let upstream = FakeUpstream::start(Behaviour::Garbage);
    let proxy = format!("socks5h://{}", upstream.address);
    let output = attempt(&proxy, "http://example.invalid/");
    assert!(!output.status.success());
    assert_eq!(upstream.connections(), 1);
}

#[test]
fn fake_upstream_close_after_greeting_fails_the_client() {
    let upstream = FakeUpstream::start(Behaviour::CloseAfterGreeting);
    let proxy = format!("socks5h://{}", upstream.address);
    let output = attempt(&proxy, "http://example.invalid/");
    assert!(!output.status.success());
    assert_eq!(upstream.connections(), 1);
}

#[test]
fn fake_upstream_silent_times_the_client_out() {
    let upstream = FakeUpstream::start(Behaviour::Silent);
    let proxy = format!("socks5h://{}", upstream.address);
    let started = Instant::now();
    let output = curl(&[
        "--max-time",
        "2",
        "--proxy",
        &proxy,
        "http://example.invalid/",
    ]);
    assert!(!output.status.success());
    assert!(started.elapsed() >= Duration::from_secs(2), "it answered");
    // curl's exit code 28: operation timed out.
    assert_eq!(output.status.code(), Some(28), "{}", text(&output.stderr));
    assert_eq!(upstream.connections(), 1);
}

#[test]
fn fake_upstream_refuse_connect_sends_its_reply_code() {
    let upstream = FakeUpstream::start(Behaviour::RefuseConnect(5));
    // With and without credentials offered.
    for proxy in [
        format!("socks5h://{}", upstream.address),
        format!("socks5h://user:pass@{}", upstream.address),
    ] {
        let output = attempt(&proxy, "http://example.invalid/");
        assert!(!output.status.success());
        let stderr = text(&output.stderr);
        // curl names the reply code: "Can't complete SOCKS5 connection ... (5)".
        assert!(stderr.contains("(5)"), "{proxy}: {stderr}");
    }
    assert_eq!(upstream.connections(), 2);
    drop(upstream);

    let upstream = FakeUpstream::start(Behaviour::RefuseConnect(2));
    let output = attempt(
        &format!("socks5h://{}", upstream.address),
        "http://example.invalid/",
    );
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("(2)"), "{stderr}");
}
