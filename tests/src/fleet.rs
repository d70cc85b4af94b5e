//! Fleets on Redis Sentinel and Redis Cluster, with the real daemons and curl:
//! load through SOCKS5 and HTTP CONNECT while a master is killed and clients are
//! added ([`failover_under_load`]), and how soon a client added on one node is
//! usable on another ([`usable`]). Shared by `tests/fleet.rs` (which asserts) and
//! the fleet bench (which reports the figures).

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::node::{ClientUrls, Node};
use crate::origin::Origin;
use crate::raw;
/// What one proxy's load saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Transfers made.
    pub requests: usize,
    /// Transfers that did not end in 200 (with curl's word on each).
    pub failures: Vec<String>,
    /// Bytes curl sent in its requests (through the tunnel).
    pub bytes_up: u64,
    /// Bytes curl received (headers and body, through the tunnel).
    pub bytes_down: u64,
    /// Connections curl opened.
    pub connections: u64,
}

/// Batches of 4 parallel curl transfers of 20 kB through `proxy` until `stop`.
/// Three nodes (`fleet-a`, `fleet-b`, `fleet-c`) on the store at `url`, each
/// with its ingress and device plane started and ready; the daemons are
/// returned so that they live as long as the caller keeps them.
pub fn three_nodes(url: &str) -> (Vec<Node>, Vec<crate::node::Daemon>) {
    let store = format!("[store]\nurl = \"{url}\"\n");
    let mut nodes: Vec<Node> = ["fleet-a", "fleet-b", "fleet-c"]
        .into_iter()
        .map(|host| Node::custom(host, "", &store))
        .collect();
    let mut daemons = Vec::new();
    for node in &mut nodes {
        daemons.push(node.start_ingress());
        daemons.push(node.start_device());
    }
    for node in &nodes {
        node.wait_ready();
    }
    (nodes, daemons)
}

pub fn curl_load(
    proxy: String,
    tunnel: bool,
    url: String,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Seen> {
    std::thread::spawn(move || {
        let mut seen = Seen::default();
        while !stop.load(Ordering::SeqCst) {
            let mut command = Command::new("curl");
            command.args([
                "-s",
                "--no-progress-meter",
                "--parallel",
                "--parallel-max",
                "4",
                "--max-time",
                "60",
                "--proxy",
                &proxy,
                "-w",
                "%{http_code} %{num_connects} %{size_request} %{size_header} %{size_download}\n",
            ]);
            if tunnel {
                command.arg("--proxytunnel");
            }
            for _ in 0..8 {
                command.args(["-o", "/dev/null", &url]);
            }
            let output = command.stdin(Stdio::null()).output().expect("curl");
            for line in String::from_utf8_lossy(&output.stdout).lines() {
                seen.requests += 1;
                let fields: Vec<u64> = line
                    .split(' ')
                    .skip(1)
                    .filter_map(|f| f.parse().ok())
                    .collect();
                match (line.starts_with("200 "), fields.as_slice()) {
                    (true, [connects, up, header, body]) => {
                        seen.connections += connects;
                        seen.bytes_up += up;
                        seen.bytes_down += header + body;
                    }
                    _ => seen.failures.push(line.to_owned()),
                }
            }
            if !output.status.success() {
                seen.failures.push(format!(
                    "curl {}: {}",
                    output.status,
                    String::from_utf8_lossy(&output.stderr)
                ));
            }
        }
        seen
    })
}

/// One client's stored usage, as `blipless-ctl client list --json` shows it.
pub fn stored_usage(node: &Node, name: &str) -> Option<(u64, u64, u64)> {
    let output = node.ctl(&["--json", "client", "list"]);
    let list: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
    let usage = &list
        .as_array()?
        .iter()
        .find(|client| client["name"] == name)?["usage"];
    Some((
        usage["bytes_up"].as_u64()?,
        usage["bytes_down"].as_u64()?,
        usage["connections"].as_u64()?,
    ))
}

/// Adds `name` with `blipless-ctl --config CONFIG`, again and again until the store takes it
/// (exit 0), while the store fails over; returns its URLs and how many tries it
/// took. A try that stored it unconfirmed (exit 75) counts as stored.
pub fn add_until_stored(config: &std::path::Path, name: &str) -> (ClientUrls, usize) {
    let started = Instant::now();
    for tries in 1.. {
        let output = Command::new(crate::binary("blipless-ctl"))
            .arg("--config")
            .arg(config)
            .args(["--json", "client", "add", name])
            .stdin(Stdio::null())
            .output()
            .expect("running blipless-ctl");
        let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
        if answer["secret"].is_string() {
            return (ClientUrls::from_json(&answer), tries);
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{name} was never stored: {answer}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    unreachable!("the loop returns")
}

/// Logs in over SOCKS5 once: the auth status byte (0: ok).
pub fn login_once(node: &Node, name: &str, secret: &str) -> u8 {
    let mut stream = raw::connect(node.socks);
    raw::socks5_login(&mut stream, name, secret)
}

/// Waits until `name` may log in on `node`; how long that took.
pub fn usable(node: &Node, name: &str, secret: &str, within: Duration) -> Duration {
    let started = Instant::now();
    while login_once(node, name, secret) != 0 {
        assert!(
            started.elapsed() < within,
            "{name} was not usable within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    started.elapsed()
}

/// What [`failover_under_load`] saw.
#[derive(Debug)]
pub struct FailoverReport {
    /// From the kill until the topology had a new master for the killed one.
    pub failover: Duration,
    /// The SOCKS5 load (client alice): its bytes are alice's usage.
    pub socks: Seen,
    /// The HTTP CONNECT load (client bob).
    pub http: Seen,
    /// Clients added during the run (each until stored), with the tries each took.
    pub added: Vec<(ClientUrls, usize)>,
    /// The longest time, after the run, until an added client was usable.
    pub slowest_usable: Duration,
    /// alice's usage as curl moved it: (up, down, connections).
    pub expected_usage: (u64, u64, u64),
    /// alice's usage as stored, once it matched or after a minute.
    pub stored_usage: Option<(u64, u64, u64)>,
    /// Whether the device plane logged a failed usage flush (to be repeated).
    pub a_flush_failed: bool,
}

/// On a store URL and a way to kill a master (returning how long the failover
/// took): load through SOCKS5 (client alice) and HTTP CONNECT (client bob), the
/// master killed 2 s in, clients added until stored meanwhile, 3 s after the
/// failover the load stopped; then every added client is waited on until usable
/// and alice's stored usage until it matches what curl moved. Usage is flushed
/// every second, so that flushes fail during the failover.
pub fn failover_under_load(url: &str, kill: impl FnOnce() -> Duration) -> FailoverReport {
    let origin = Origin::start();
    let store = format!("[store]\nurl = \"{url}\"\nusage_flush = \"1s\"\n");
    let mut node = Node::custom("fleet-a", "", &store);
    let (_ingress, device, alice) = node.start();
    let bob = node.add_client("bob");
    let stop = Arc::new(AtomicBool::new(false));
    let target = origin.url("/bytes/20000");
    let socks = curl_load(alice.socks.clone(), false, target.clone(), stop.clone());
    let http = curl_load(bob.http.clone(), true, target, stop.clone());
    std::thread::sleep(Duration::from_secs(2));

    let added = Arc::new(Mutex::new(Vec::new()));
    let adder = {
        let (stop, added) = (stop.clone(), added.clone());
        let config = node.config.clone();
        std::thread::spawn(move || {
            for n in 0.. {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let (client, tries) = add_until_stored(&config, &format!("new{n}"));
                added.lock().expect("added").push((client, tries));
            }
        })
    };
    let failover = kill();
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::SeqCst);
    let socks = socks.join().expect("SOCKS5 load");
    let http = http.join().expect("HTTP load");
    adder.join().expect("adder");

    let added = std::mem::take(&mut *added.lock().expect("added"));
    let mut slowest_usable = Duration::ZERO;
    for (client, _) in &added {
        let took = usable(&node, &client.name, &client.secret, Duration::from_secs(10));
        slowest_usable = slowest_usable.max(took);
    }
    let expected_usage = (socks.bytes_up, socks.bytes_down, socks.connections);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut stored = stored_usage(&node, "alice");
    while stored != Some(expected_usage) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        stored = stored_usage(&node, "alice");
    }
    FailoverReport {
        failover,
        socks,
        http,
        added,
        slowest_usable,
        expected_usage,
        stored_usage: stored,
        a_flush_failed: device.log_text().contains("usage flush failed; will retry"),
    }
}
