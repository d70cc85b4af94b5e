//! The end-to-end harness: start the real `blipless-ingress` and
//! `blipless-device` binaries on free loopback ports with their own state
//! folder, an origin server to proxy to, and real clients (curl).
//! For WireGuard, [`netns`] builds topologies of network namespaces (as
//! root) and [`wireguard`] runs the real client, wireguard-go, inside them;
//! [`topology`] is the customer/node/internet world of the WireGuard tests
//! and benchmark, with blipless or wireguard-go as the server.
//!
//! Binaries are found in the workspace's target folder (`debug` unless
//! `BLIPLESS_PROFILE` says `release`, or `BLIPLESS_BIN_DIR` points
//! elsewhere); `make test` builds them before running the tests.

pub mod curl;
pub mod dante;
pub mod dns;
pub mod exit_world;
pub mod fake_upstream;
pub mod fleet;
pub mod inherited;
pub mod load;
pub mod netns;
pub mod node;
pub mod origin;
pub mod package;
pub mod raw;
pub mod redis;
pub mod tls;
pub mod topology;
pub mod wg_peer;
pub mod wireguard;

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The folder holding the blipless binaries.
///
/// Every start of a blipless binary looks here first, so this is also
/// where inherited descriptors are kept from the daemons
/// ([`inherited::keep_from_children`]).
pub fn bin_dir() -> PathBuf {
    inherited::keep_from_children();
    if let Ok(dir) = std::env::var("BLIPLESS_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let profile = std::env::var("BLIPLESS_PROFILE").unwrap_or_else(|_| "debug".into());
    target.join(profile)
}

/// The path of one binary, checked to exist.
pub fn binary(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --bins` first (`make test` does)",
        path.display()
    );
    path
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    // The kernel may hand the same ephemeral port to two binds in a row once
    // the first is closed: never give one out twice in this process.
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("binding an ephemeral port");
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// Polls `condition` every 20 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Hex SHA-256 of some bytes.
pub fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// The deterministic body the origin serves for `/bytes/N`.
pub fn pattern(len: usize) -> Vec<u8> {
    // A cheap xorshift stream: not compressible, not periodic at small scales.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A device plane's packet counter from the last "WireGuard packets so far"
/// line of its log (logged at a handover), e.g. `tun_super_reads`.
pub fn packet_counter(log: &str, name: &str) -> Option<u64> {
    let line = log
        .lines()
        .rev()
        .find(|line| line.contains("WireGuard packets so far"))?;
    let value = line.split(&format!("{name}=")).nth(1)?;
    value
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Lifts this process's open-file limit as the daemons do (children inherit it).
pub fn raise_fd_limit() {
    blipless_config::daemon::raise_fd_limit();
}

/// Standard base64 with padding (for hand-written Proxy-Authorization headers).
pub fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Transmitted and received counts from ping's summary line.
pub fn ping_counts(output: &std::process::Output) -> (u64, u64) {
    ping_summary(output)
}

/// The sequence numbers (from 1) that got no reply in the output of a
/// `ping -D` of `sent` requests, each with the Unix time of the last reply
/// before it (so a loss can be placed among a test's steps).
pub fn missing_replies(output: &std::process::Output, sent: u64) -> Vec<(u64, Option<f64>)> {
    let text = String::from_utf8_lossy(&output.stdout);
    let mut answered = std::collections::BTreeMap::new();
    for line in text.lines() {
        // "[1764626193.562817] 64 bytes from 10.84.2.2: icmp_seq=17 ttl=63 time=0.9 ms"
        let at = line
            .strip_prefix('[')
            .and_then(|rest| rest.split_once(']'))
            .and_then(|(time, _)| time.parse::<f64>().ok());
        let seq = line
            .split_whitespace()
            .find_map(|word| word.strip_prefix("icmp_seq="))
            .and_then(|n| n.parse::<u64>().ok());
        if let (Some(seq), true) = (seq, line.contains("bytes from")) {
            answered.insert(seq, at);
        }
    }
    (1..=sent)
        .filter(|seq| !answered.contains_key(seq))
        .map(|seq| {
            let before = answered.range(..seq).next_back().and_then(|(_, at)| *at);
            (seq, before)
        })
        .collect()
}

fn ping_summary(output: &std::process::Output) -> (u64, u64) {
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text
        .lines()
        .find(|line| line.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("no ping summary in: {text}"));
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|part| part.parse().ok())
        .collect();
    (numbers[0], numbers[1])
}
