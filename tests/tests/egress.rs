//! Egress through upstream SOCKS5 providers (`[[egress.upstream]]`), end to
//! end: real dante servers (`blipless_tests::dante`) and misbehaving ones
//! (`blipless_tests::fake_upstream`) as the upstreams, real curl as the
//! customer. Through an upstream, the origin's `/whoami` shows the
//! upstream's external address (127.0.0.3, 127.0.0.4), never the 127.0.0.1
//! direct egress leaves from, so every test can tell which way traffic went.
//!
//! Covered: both proxy protocols through an authenticated upstream; names
//! passed to the upstream unresolved; tunnels through an upstream across
//! deploys; the sticky `{session}` across deploys
//! and a crash; failover when an upstream dies or hangs, and its return;
//! per-node identities in a fleet sharing one Redis; and bad upstreams, bad
//! policies and bad upstream config. The dante tests need root (they create
//! system users and PAM services) and fail, never skip, without it.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use blipless_tests::curl::{curl, fetch, status_code};
use blipless_tests::dante::Dante;
use blipless_tests::fake_upstream::{Behaviour, FakeUpstream};
use blipless_tests::load::{finish_echoes, streaming_echo};
use blipless_tests::node::{ClientUrls, Node};
use blipless_tests::origin::Origin;
use blipless_tests::redis::Redis;
use blipless_tests::{pattern, raw, sha256, wait_until};

const DANTE_A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
const DANTE_B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 4);
/// Where direct egress leaves from on loopback (no `egress.sources`).
const DIRECT: &str = "127.0.0.1";

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// An `[[egress.upstream]]` table for a SOCKS5 upstream at `address`, with
/// `login` (username template, password file) if given.
fn upstream_toml(name: &str, address: SocketAddr, login: Option<(&str, &Path)>) -> String {
    let mut toml = format!(
        "[[egress.upstream]]\nname = \"{name}\"\nkind = \"socks5\"\naddress = \"{address}\"\n"
    );
    if let Some((username, password_file)) = login {
        toml.push_str(&format!(
            "username = \"{username}\"\npassword_file = \"{}\"\n",
            password_file.display()
        ));
    }
    toml.push('\n');
    toml
}

/// Writes `password` (first line) to a file in `dir`, for `password_file`.
fn password_file(dir: &Path, password: &str) -> PathBuf {
    let path = dir.join("upstream.password");
    std::fs::write(&path, format!("{password}\n")).expect("writing the password file");
    path
}

/// `blipless-ctl client add NAME --egress POLICY`, and the client's URLs.
fn add_client_with(node: &Node, name: &str, policy: &str) -> ClientUrls {
    let output = node.ctl(&["--json", "client", "add", name, "--egress", policy]);
    assert!(
        output.status.success(),
        "client add {name} --egress {policy} failed ({}): {}{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
    let value: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("client add --json");
    ClientUrls::from_json(&value)
}

/// The origin's `/whoami` through `proxy` (curl's options `extra` added).
fn whoami(proxy: &str, origin: &Origin, extra: &[&str]) -> String {
    text(&fetch(proxy, &origin.url("/whoami"), extra))
}

/// `blipless-ctl egress --json`, parsed (Null when it fails).
fn egress_report(node: &Node) -> serde_json::Value {
    let output = node.ctl(&["egress", "--json"]);
    serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null)
}

/// One route of `blipless-ctl egress --json` (Null when absent).
fn route(report: &serde_json::Value, name: &str) -> serde_json::Value {
    report["routes"]
        .as_array()
        .and_then(|routes| routes.iter().find(|r| r["name"] == name))
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}

/// Waits (generously) until `blipless-ctl egress --json` satisfies
/// `condition` (`what` names it), and returns that report.
fn wait_report(
    node: &Node,
    what: &str,
    mut condition: impl FnMut(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        last = egress_report(node);
        if condition(&last) {
            return last;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("blipless-ctl egress never showed {what}; last report: {last}");
}

/// Waits until `blipless-ctl egress` reports route `name` with `up`.
fn wait_route_up(node: &Node, name: &str, up: bool) -> serde_json::Value {
    wait_report(node, &format!("{name} with up = {up}"), |report| {
        route(report, name)["up"] == up
    })
}

/// A curl fetching `url` through `proxy` into `out` (`extra`: more curl
/// options), left running.
fn spawn_curl(proxy: &str, url: &str, out: &Path, extra: &[&str]) -> Child {
    Command::new("curl")
        .args(["-s", "-S", "--max-time", "900", "--proxy", proxy])
        .args(extra)
        .arg("-o")
        .arg(out)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("curl")
}

/// A curl downloading `size` bytes of the origin's pattern through `proxy`
/// at 1 MB/s into `out`, so it runs for `size` / 1 MB seconds unless its
/// path breaks.
fn slow_download(proxy: &str, origin: &Origin, size: usize, out: &Path, extra: &[&str]) -> Child {
    let mut args = vec!["--limit-rate", "1M"];
    args.extend_from_slice(extra);
    spawn_curl(proxy, &origin.url(&format!("/bytes/{size}")), out, &args)
}

/// How a watched curl ended: its status, its stderr, and when.
type Ended = Option<(std::process::ExitStatus, String, Instant)>;

/// Waits for `child` on a thread of its own, so that when it ends is known
/// whatever the test does meanwhile; None if it had not ended after
/// `timeout` (it is killed then).
fn watch(mut child: Child, timeout: Duration) -> JoinHandle<Ended> {
    std::thread::spawn(move || {
        wait_child(&mut child, timeout).map(|(status, stderr)| (status, stderr, Instant::now()))
    })
}

/// Starts an HTTP CONNECT tunnel through `proxy` to the origin's
/// `/slow/600000` (no byte for ten minutes) and waits until it reached the
/// origin. Its request, not its connection: the upstream connects to the
/// origin before it answers the proxy, and a freeze in between would see
/// the proxy fail over to another upstream for this tunnel.
fn waiting_tunnel(proxy: &str, origin: &Origin, out: &Path) -> Child {
    let before = origin.requests();
    let child = spawn_curl(proxy, &origin.url("/slow/600000"), out, &["--proxytunnel"]);
    wait_until(
        Duration::from_secs(20),
        "the waiting tunnel's request to reach the origin",
        || origin.requests() > before,
    );
    child
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Waits (up to `timeout`) for `child` to exit; its status and stderr, or
/// None (it is killed then) if it did not.
fn wait_child(child: &mut Child, timeout: Duration) -> Option<(std::process::ExitStatus, String)> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("poll curl") {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
            }
            return Some((status, stderr));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One request of a [`request_loop`].
#[derive(Debug, Clone)]
struct Attempt {
    started: Instant,
    ended: Instant,
    ok: bool,
    /// The body (the egress address, for `/whoami`), or curl's error.
    answer: String,
}

/// Requests `url` through `proxy`, one at a time, until `stop`.
fn request_loop(proxy: String, url: String, stop: Arc<AtomicBool>) -> JoinHandle<Vec<Attempt>> {
    std::thread::spawn(move || {
        let mut attempts = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let started = Instant::now();
            let output = curl(&["--max-time", "30", "--proxy", &proxy, &url]);
            let ok = output.status.success();
            attempts.push(Attempt {
                started,
                ended: Instant::now(),
                ok,
                answer: if ok {
                    text(&output.stdout)
                } else {
                    format!("curl {}: {}", output.status, text(&output.stderr).trim())
                },
            });
        }
        attempts
    })
}

/// Which of the two dantes' externals `address` is: (used, other).
fn used_and_other<'a>(
    address: &str,
    a: &'a mut Dante,
    b: &'a mut Dante,
) -> (&'a mut Dante, &'a mut Dante) {
    if address == a.external.to_string() {
        (a, b)
    } else {
        assert_eq!(
            address,
            b.external.to_string(),
            "the client egressed through neither upstream"
        );
        (b, a)
    }
}

#[test]
fn socks5_and_http_through_an_authenticated_dante_reach_the_origin_from_its_external_address() {
    let origin = Origin::start();
    let dante = Dante::start(DANTE_A);
    let password = password_file(dante.path(), &dante.password);
    // The upstream by name, as providers give theirs: `localhost` is
    // resolved as one of the plane's lookups and its addresses raced (dante
    // is on 127.0.0.1 only, so a first ::1 is refused and costs nothing).
    let mut node = Node::new(
        &upstream_toml("dc-1", dante.address, Some((&dante.username, &password))).replace(
            &dante.address.to_string(),
            &format!("localhost:{}", dante.address.port()),
        ),
    );
    // alice has the default policy, any: every upstream (here dc-1 only).
    let (_ingress, _device, alice) = node.start();
    // For contrast, a client pinned to direct egress on the same node.
    let bob = add_client_with(&node, "bob", "direct");
    assert_eq!(whoami(&bob.socks, &origin, &[]), DIRECT);
    assert_eq!(whoami(&bob.http, &origin, &[]), DIRECT);

    let external = DANTE_A.to_string();
    // SOCKS5 with a socks5h:// proxy URL ...
    assert_eq!(
        whoami(&alice.socks, &origin, &[]),
        external,
        "SOCKS5 through dc-1{}",
        dante.log_text()
    );
    // ... and curl's --socks5-hostname with --proxy-user.
    let credentials = format!("{}:{}", alice.name, alice.secret);
    let output = curl(&[
        "--max-time",
        "30",
        "--socks5-hostname",
        &node.socks.to_string(),
        "--proxy-user",
        &credentials,
        &origin.url("/whoami"),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), external);
    // HTTP absolute-form, and HTTP CONNECT.
    assert_eq!(
        whoami(&alice.http, &origin, &[]),
        external,
        "HTTP absolute-form"
    );
    assert_eq!(
        whoami(&alice.http, &origin, &["--proxytunnel"]),
        external,
        "HTTP CONNECT"
    );

    // By name as well (dante resolves it).
    let by_name = format!("http://localhost:{}/whoami", origin.address.port());
    assert_eq!(text(&fetch(&alice.socks, &by_name, &[])), external);
    // Downloads are byte-exact every way.
    let size = 4 * 1024 * 1024;
    let url = origin.url(&format!("/bytes/{size}"));
    let expected = sha256(&pattern(size));
    for (what, proxy, extra) in [
        ("SOCKS5", &alice.socks, &[][..]),
        ("HTTP absolute-form", &alice.http, &[][..]),
        ("HTTP CONNECT", &alice.http, &["--proxytunnel"][..]),
    ] {
        let body = fetch(proxy, &url, extra);
        assert_eq!(body.len(), size, "{what} download length");
        assert_eq!(sha256(&body), expected, "{what} download bytes");
    }

    // A literal address the node's egress policy denies is refused here,
    // never sent to the upstream (127.0.0.2 is not in egress.allow).
    let denied = SocketAddr::from(([127, 0, 0, 2], origin.address.port()));
    let mut stream = raw::connect(node.socks);
    assert_eq!(
        raw::socks5_login(&mut stream, &alice.name, &alice.secret),
        0
    );
    assert_eq!(
        raw::socks5_connect_v4(&mut stream, denied),
        2,
        "SOCKS5 reply to a denied address"
    );
    assert_eq!(
        status_code(&alice.http, &format!("http://{denied}/"), &[]),
        "403"
    );
    assert_eq!(
        status_code(
            &alice.http,
            &format!("http://{denied}/"),
            &["--proxytunnel"]
        ),
        "403"
    );

    // Dante saw every one of alice's connections, with its system user, and
    // none of bob's nor the denied ones: 5 /whoami and 3 downloads.
    let usernames = dante.logged_usernames();
    assert_eq!(
        usernames.len(),
        8,
        "dante's tunnels: {usernames:?}{}",
        dante.log_text()
    );
    assert!(
        usernames.iter().all(|u| u == &dante.username),
        "{usernames:?}"
    );

    // The plane reports its routes to the ingress every second or so.
    let report = wait_report(&node, "dc-1 to show alice's 8 tunnels", |report| {
        route(report, "dc-1")["opened"].as_u64() >= Some(8)
    });
    let dc1 = route(&report, "dc-1");
    assert_eq!(dc1["up"], true, "{report}");
    assert_eq!(dc1["kind"], "socks5", "{report}");
    assert_eq!(dc1["opened"], 8, "{report}");
    assert_eq!(dc1["clients"], 1, "alice's window holds dc-1: {report}");
    assert!(dc1["latency_us"].as_u64().is_some(), "{report}");
    assert_eq!(
        route(&report, "direct")["clients"],
        1,
        "bob's window: {report}"
    );
    assert!(
        report["device_plane"].as_u64().is_some_and(|pid| pid > 0),
        "{report}"
    );
}

#[test]
fn tunnels_through_an_upstream_cross_five_deploys_byte_exact() {
    let origin = Origin::start();
    let dante = Dante::start(DANTE_A);
    let password = password_file(dante.path(), &dante.password);
    let mut node = Node::new(&upstream_toml(
        "dc-1",
        dante.address,
        Some((&dante.username, &password)),
    ));
    let (_ingress, mut device, client) = node.start();
    assert_eq!(whoami(&client.socks, &origin, &[]), DANTE_A.to_string());

    // At 1 MB/s each way, longer than five deploys take.
    let size = 24 * 1024 * 1024;
    let upload = node.path().join("upload.bin");
    std::fs::write(&upload, pattern(size)).expect("write upload");
    let (socks_out, http_out) = (node.path().join("socks.out"), node.path().join("http.out"));
    let url = origin.url("/echo");
    let before = dante.logged_connects().len();
    let mut socks = streaming_echo(&client.socks, &url, &upload, &socks_out, false);
    let mut http = streaming_echo(&client.http, &url, &upload, &http_out, true);
    wait_until(
        Duration::from_secs(20),
        "both tunnels to open through dante",
        || dante.logged_connects().len() >= before + 2,
    );
    std::thread::sleep(Duration::from_millis(500));

    for round in 1..=5 {
        let (next, took) = node.deploy(&mut device);
        device = next;
        eprintln!("deploy {round} took {took:?}");
    }
    finish_echoes(
        [
            (&mut socks, &socks_out, "SOCKS5"),
            (&mut http, &http_out, "HTTP CONNECT"),
        ],
        size,
        "deploys",
    );
    // Both went through dante (to the origin's port), each once: the
    // tunnels moved between planes, they were not re-opened.
    let port = format!("127.0.0.1.{}", origin.address.port());
    let to_origin = dante
        .logged_connects()
        .iter()
        .skip(before)
        .filter(|line| line.split_whitespace().any(|word| word == port))
        .count();
    assert_eq!(
        to_origin,
        2,
        "dante's tunnels to the origin{}",
        dante.log_text()
    );
    let migrated = node.metric("blipless_tunnels_migrated_total");
    assert!(
        migrated >= 10.0,
        "two tunnels times five deploys migrated, metric says {migrated}"
    );
    // The fifth plane still egresses through the upstream.
    assert_eq!(whoami(&client.socks, &origin, &[]), DANTE_A.to_string());
}

/// A SOCKS5 upstream that records each CONNECT's destination as it was
/// sent (ATYP and address bytes), then refuses it (reply 5); no
/// authentication. Runs until the test process ends.
/// What the recording upstream saw: each request's address type and address bytes.
type Recorded = Arc<std::sync::Mutex<Vec<(u8, Vec<u8>)>>>;

fn recording_upstream() -> (SocketAddr, Recorded) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let record = record.clone();
            std::thread::spawn(move || -> std::io::Result<()> {
                stream.set_read_timeout(Some(Duration::from_secs(10)))?;
                let mut head = [0u8; 2];
                stream.read_exact(&mut head)?;
                let mut methods = vec![0u8; usize::from(head[1])];
                stream.read_exact(&mut methods)?;
                stream.write_all(&[5, 0])?;
                let mut request = [0u8; 4];
                // A probe stops after the greeting: no request follows.
                if stream.read_exact(&mut request).is_err() {
                    return Ok(());
                }
                let length = match request[3] {
                    1 => 4,
                    4 => 16,
                    3 => {
                        let mut n = [0u8; 1];
                        stream.read_exact(&mut n)?;
                        usize::from(n[0])
                    }
                    _ => 0,
                };
                let mut destination = vec![0u8; length + 2];
                stream.read_exact(&mut destination)?;
                destination.truncate(length);
                record
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((request[3], destination));
                stream.write_all(&[5, 5, 0, 1, 0, 0, 0, 0, 0, 0])
            });
        }
    });
    (address, seen)
}

#[test]
fn names_go_to_the_upstream_unresolved_and_literal_addresses_as_given() {
    let origin = Origin::start();
    let (address, seen) = recording_upstream();
    let mut node = Node::new(&upstream_toml("recorder", address, None));
    let (_ingress, _device, client) = node.start();
    // A name nobody can resolve (.invalid): only an upstream that was given
    // the name itself can see it; one resolved here would fail before.
    for (proxy, extra) in [
        (&client.socks, &[][..]),
        (&client.http, &[][..]),
        (&client.http, &["--proxytunnel"][..]),
    ] {
        let mut args = vec!["--fail", "--max-time", "30", "--proxy", proxy];
        args.extend_from_slice(extra);
        args.push("http://exit-resolves-this.invalid:8080/");
        let output = curl(&args);
        assert!(!output.status.success(), "the recorder refuses everything");
    }
    let literal = origin.url("/");
    assert!(
        !curl(&["--max-time", "30", "--proxy", &client.socks, &literal])
            .status
            .success()
    );
    // Names that are addresses in another spelling (curl would normalise
    // them, so sent raw): 127.2 is 127.0.0.2, outside egress.allow, and is
    // refused here (reply 2) like the literal; 2130706433 is 127.0.0.1,
    // allowed, and goes to the upstream as the address it is; a name that
    // ends in a number and is no address is refused too.
    let port = origin.address.port();
    for (host, refused) in [("127.2", true), ("2130706433", false), ("1.2.3.4.5", true)] {
        let mut stream = raw::connect(node.socks);
        assert_eq!(
            raw::socks5_login(&mut stream, &client.name, &client.secret),
            0
        );
        let reply = raw::socks5_connect_name(&mut stream, host, port);
        assert_eq!(reply == 2, refused, "{host}: reply {reply}");
    }
    let seen = seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let name = (3u8, b"exit-resolves-this.invalid".to_vec());
    let ip = (1u8, vec![127, 0, 0, 1]);
    assert_eq!(
        seen,
        vec![name.clone(), name.clone(), name, ip.clone(), ip],
        "the destinations the upstream was sent (ATYP, address)"
    );
}

/// The `{session}` of the usernames dante logged for `client`
/// (`cust-CLIENT-sess-SESSION`).
fn sessions_of(dante: &Dante, client: &str) -> Vec<String> {
    let prefix = format!("cust-{client}-sess-");
    dante
        .logged_usernames()
        .iter()
        .filter_map(|u| u.strip_prefix(&prefix).map(str::to_owned))
        .collect()
}

#[test]
fn the_sticky_session_survives_five_deploys_and_a_crash() {
    let origin = Origin::start();
    let dante = Dante::start_accepting_any_login(DANTE_A);
    let password = password_file(dante.path(), "any-password");
    let mut node = Node::new(&upstream_toml(
        "dc-1",
        dante.address,
        Some(("cust-{client}-sess-{session}", &password)),
    ));
    let (_ingress, mut device, alice) = node.start();
    let bob = node.add_client("bob");
    let external = DANTE_A.to_string();
    let use_both = |round: &str| {
        for client in [&alice, &bob] {
            assert_eq!(
                whoami(&client.socks, &origin, &[]),
                external,
                "{} {round}",
                client.name
            );
        }
    };
    use_both("before any deploy");
    for round in 1..=5 {
        let (next, _) = node.deploy(&mut device);
        device = next;
        use_both(&format!("after deploy {round}"));
    }
    // A crash: SIGKILL, then a fresh device plane.
    device.kill();
    wait_until(Duration::from_secs(20), "/status to say starting", || {
        node.status().0 == 503
    });
    let _restarted = node.start_device();
    node.wait_ready();
    use_both("after a crash and restart");

    let usernames = dante.logged_usernames();
    let (alice_sessions, bob_sessions) = (sessions_of(&dante, "alice"), sessions_of(&dante, "bob"));
    assert!(
        alice_sessions.len() >= 7 && bob_sessions.len() >= 7,
        "dante logged too few usernames: {usernames:?}{}",
        dante.log_text()
    );
    let session = &alice_sessions[0];
    eprintln!(
        "dante saw {} usernames; alice's session {session} ({} times), bob's {} ({} times)",
        usernames.len(),
        alice_sessions.len(),
        bob_sessions[0],
        bob_sessions.len()
    );
    assert!(
        session.len() == 16 && session.bytes().all(|b| b.is_ascii_hexdigit()),
        "a session is 16 hex digits: {session:?}"
    );
    assert!(
        alice_sessions.iter().all(|s| s == session),
        "alice's session changed: {alice_sessions:?}"
    );
    assert!(
        bob_sessions.iter().all(|s| s == &bob_sessions[0]),
        "bob's session changed: {bob_sessions:?}"
    );
    assert_ne!(
        &bob_sessions[0], session,
        "two clients got the same session: it is not per client"
    );
    // Only the template's usernames reached dante (probes stop before a
    // CONNECT, so they are not in the connect lines).
    assert!(
        usernames.iter().all(|u| u.starts_with("cust-")),
        "{usernames:?}"
    );
}

/// The failover test's node: two upstreams without authentication, up-a
/// at `a` and up-b at `b`, probed every second, a window of both.
fn two_upstream_node(a: &Dante, b: &Dante, extra: &str) -> Node {
    Node::new(&format!(
        "{}{}[egress.window]\nsize = 2\n\n[egress.probe]\ninterval = \"1s\"\n{extra}\n",
        upstream_toml("up-a", a.address, None),
        upstream_toml("up-b", b.address, None),
    ))
}

fn route_name(dante: &Dante) -> &'static str {
    if dante.external == DANTE_A {
        "up-a"
    } else {
        "up-b"
    }
}

#[test]
fn a_killed_upstream_fails_over_to_the_next_in_the_window_and_comes_back() {
    let origin = Origin::start();
    let mut a = Dante::start_without_auth(DANTE_A);
    let mut b = Dante::start_without_auth(DANTE_B);
    let mut node = two_upstream_node(&a, &b, "");
    let (_ingress, device, client) = node.start();
    wait_route_up(&node, "up-a", true);
    wait_route_up(&node, "up-b", true);

    let first = whoami(&client.socks, &origin, &[]);
    assert_ne!(first, DIRECT, "the client egressed directly");
    for _ in 0..3 {
        assert_eq!(
            whoami(&client.socks, &origin, &[]),
            first,
            "the window's first member is kept"
        );
        assert_eq!(whoami(&client.http, &origin, &[]), first);
    }
    let (used, other) = used_and_other(&first, &mut a, &mut b);
    let (used_name, other_name) = (route_name(used), route_name(other));
    let other_address = other.external.to_string();
    eprintln!("the client uses {used_name} ({first})");

    // Through it: a long download (200 s at 1 MB/s), a tunnel waiting ten
    // minutes for its answer ...
    let size = 200 * 1024 * 1024;
    let out = node.path().join("long.out");
    let long = slow_download(&client.socks, &origin, size, &out, &[]);
    wait_until(
        Duration::from_secs(20),
        "the long download to start",
        || file_len(&out) > 0,
    );
    let waiting = waiting_tunnel(&client.http, &origin, &node.path().join("slow.out"));
    // ... and short requests in a loop, through both protocols.
    let stop = Arc::new(AtomicBool::new(false));
    let url = origin.url("/whoami");
    let loops = [
        request_loop(client.socks.clone(), url.clone(), stop.clone()),
        request_loop(client.http.clone(), url.clone(), stop.clone()),
    ];
    let (long, waiting) = (
        watch(long, Duration::from_secs(120)),
        watch(waiting, Duration::from_secs(120)),
    );
    std::thread::sleep(Duration::from_secs(1));

    used.kill();
    let killed = Instant::now();
    let report = wait_route_up(&node, used_name, false);
    let marked_down = killed.elapsed();
    let down = route(&report, used_name);
    assert!(down["downs"].as_u64() >= Some(1), "{report}");
    assert!(
        down["error"].as_str().is_some_and(|e| !e.is_empty()),
        "a down route says why: {report}"
    );
    assert_eq!(route(&report, other_name)["up"], true, "{report}");
    let (code, body) = node.status();
    assert_eq!(
        code, 200,
        "the node serves through the route that is up: {body}"
    );
    assert!(
        body.starts_with("ok") && body.contains(&format!("upstream {used_name} down: ")),
        "/status: {body}"
    );

    // What went through the killed upstream ended, long before it would have.
    let (status, stderr, ended) = long
        .join()
        .expect("watcher")
        .expect("the long download hung after its upstream was killed");
    let got = file_len(&out);
    assert!(
        !status.success() && got < size as u64,
        "the long download finished through a killed upstream ({status}, {got} bytes)"
    );
    let long_ended = ended.duration_since(killed);
    eprintln!(
        "the long download ended {long_ended:?} after the kill ({status}: {}; {got} of {size} bytes)",
        stderr.trim()
    );
    let (status, stderr, ended) = waiting
        .join()
        .expect("watcher")
        .expect("the waiting tunnel hung after its upstream was killed");
    assert!(
        !status.success(),
        "the waiting tunnel got an answer: {stderr}"
    );
    let waiting_ended = ended.duration_since(killed);
    eprintln!(
        "the waiting tunnel ended {waiting_ended:?} after the kill ({status}: {})",
        stderr.trim()
    );

    std::thread::sleep(Duration::from_secs(2));
    used.restart();
    let restarted = Instant::now();
    let report = wait_route_up(&node, used_name, true);
    let back_up = restarted.elapsed();
    assert!(
        !node.status().1.contains("down"),
        "/status: {}",
        node.status().1
    );
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::SeqCst);
    let attempts: Vec<Attempt> = loops
        .into_iter()
        .flat_map(|l| l.join().expect("request loop"))
        .collect();

    let after: Vec<&Attempt> = attempts.iter().filter(|a| a.started >= killed).collect();
    assert!(
        after.len() >= 20,
        "the loops ran after the kill: {}",
        after.len()
    );
    let through_other = |a: &&&Attempt| a.ok && a.answer == other_address;
    let first_success = after
        .iter()
        .filter(through_other)
        .map(|a| a.ended)
        .min()
        .expect("no request after the kill succeeded through the other upstream");
    let to_first_success = first_success.duration_since(killed);
    assert!(
        to_first_success < Duration::from_secs(5),
        "the first success through {other_address} came {to_first_success:?} after the kill"
    );
    // From the first request that succeeded through the other upstream on,
    // none failed, through the down time and the restart alike.
    let point = after
        .iter()
        .filter(through_other)
        .map(|a| a.started)
        .min()
        .unwrap_or(killed);
    let failed_before_point = after.iter().filter(|a| a.started < point && !a.ok).count();
    let in_flight_failed = attempts
        .iter()
        .filter(|a| a.started < killed && a.ended >= killed && !a.ok)
        .count();
    let down_logged = device
        .log_text()
        .lines()
        .find(|l| l.contains("egress route is down") && l.contains(used_name))
        .map(|l| l.chars().take(27).collect::<String>())
        .unwrap_or_default();
    eprintln!(
        "failover: {} requests after the kill; the first success through {other_address} ended \
         {to_first_success:?} after it; {failed_before_point} failed before that; \
         {in_flight_failed} in flight at the kill failed; blipless-ctl egress showed \
         {used_name} down {marked_down:?} after the kill (the plane logged it down at \
         {down_logged}) and up {back_up:?} after its restart",
        after.len()
    );
    let bad: Vec<&&Attempt> = after
        .iter()
        .filter(|a| a.started >= point && !through_other(a))
        .collect();
    assert!(
        bad.is_empty(),
        "requests after the failover failed or left elsewhere than {other_address}: {bad:?}"
    );
    // The client stayed on the other upstream after the first came back:
    // a healthy window is not reordered.
    assert_eq!(whoami(&client.socks, &origin, &[]), other_address);
    assert_eq!(route(&report, used_name)["up"], true);
}

#[test]
fn tunnels_through_a_hung_upstream_close_when_it_is_marked_down() {
    let origin = Origin::start();
    let a = Dante::start_without_auth(DANTE_A);
    let b = Dante::start_without_auth(DANTE_B);
    let mut node = two_upstream_node(
        &a,
        &b,
        "timeout = \"1s\"\n\n[proxy]\nconnect_timeout = \"3s\"\n",
    );
    let (_ingress, device, client) = node.start();
    wait_route_up(&node, "up-a", true);
    wait_route_up(&node, "up-b", true);
    let first = whoami(&client.socks, &origin, &[]);
    let (used, other) = if first == DANTE_A.to_string() {
        (&a, &b)
    } else {
        (&b, &a)
    };
    assert_eq!(first, used.external.to_string());
    let used_name = route_name(used);
    let other_address = other.external.to_string();

    // Through it: a long download (200 s at 1 MB/s) and a tunnel waiting
    // ten minutes for its answer.
    let size = 200 * 1024 * 1024;
    let out = node.path().join("long.out");
    let long = slow_download(&client.socks, &origin, size, &out, &[]);
    wait_until(
        Duration::from_secs(20),
        "the long download to start",
        || file_len(&out) > 0,
    );
    let waiting = waiting_tunnel(&client.http, &origin, &node.path().join("slow.out"));
    let (long, waiting) = (
        watch(long, Duration::from_secs(120)),
        watch(waiting, Duration::from_secs(120)),
    );

    // A hang: dante keeps its sockets open but relays nothing, so nothing
    // but the route going down ends these tunnels (proxy.idle_timeout is
    // 15 minutes).
    used.freeze();
    let frozen = Instant::now();
    wait_route_up(&node, used_name, false);
    let marked_down = frozen.elapsed();
    for (what, watcher) in [("long download", long), ("waiting tunnel", waiting)] {
        let (status, stderr, ended) = watcher
            .join()
            .expect("watcher")
            .unwrap_or_else(|| panic!("the {what} through the hung upstream never ended"));
        assert!(
            !status.success(),
            "the {what} finished through a hung upstream ({status})"
        );
        eprintln!(
            "{what}: ended {:?} after the freeze ({status}: {})",
            ended.duration_since(frozen),
            stderr.trim()
        );
    }
    assert!(file_len(&out) < size as u64);
    eprintln!("blipless-ctl egress showed {used_name} down {marked_down:?} after the freeze");
    let closed = device
        .log_text()
        .lines()
        .filter(|l| l.contains("tunnel closed: its upstream went down"))
        .count();
    assert_eq!(closed, 2, "{}", device.log_text());
    // New requests go through the other one.
    assert_eq!(whoami(&client.socks, &origin, &[]), other_address);
    assert_eq!(whoami(&client.http, &origin, &[]), other_address);

    used.thaw();
    wait_route_up(&node, used_name, true);
    assert_eq!(whoami(&client.socks, &origin, &[]), other_address);
}

#[test]
fn fleet_nodes_sharing_redis_keep_their_own_egress_identities() {
    let origin = Origin::start();
    let redis = Redis::start(false);
    let store = format!("[store]\nurl = \"{}\"\n", redis.url());
    let mut a = Node::custom("node-a", "sources = [\"127.0.0.2\"]", &store);
    let mut b = Node::custom("node-b", "", &store);
    let _ia = a.start_ingress();
    let mut da = a.start_device();
    a.wait_ready();
    let _ib = b.start_ingress();
    let mut db = b.start_device();
    b.wait_ready();
    let carol = b.add_client("carol");
    let via = |node: &Node| format!("socks5h://carol:{}@{}", carol.secret, node.socks);
    let via_http = |node: &Node| format!("http://carol:{}@{}", carol.secret, node.http);
    // Node a learns of carol through the store; nothing is sent through it
    // yet, so that node b is the first to give carol an identity.
    wait_until(Duration::from_secs(10), "carol to reach node a", || {
        a.status_json()["device_planes"][0]["clients"] == 1
    });
    // Node b first: it has no sources, so carol leaves it from 127.0.0.1.
    assert_eq!(whoami(&via(&b), &origin, &[]), DIRECT, "via node b");
    // Then node a: from its own source, whatever node b stored.
    let both = |a: &Node, b: &Node, round: &str| {
        assert_eq!(
            whoami(&via(a), &origin, &[]),
            "127.0.0.2",
            "SOCKS5 via node a, {round}"
        );
        assert_eq!(
            whoami(&via_http(a), &origin, &[]),
            "127.0.0.2",
            "HTTP via node a, {round}"
        );
        assert_eq!(
            whoami(&via(b), &origin, &[]),
            DIRECT,
            "SOCKS5 via node b, {round}"
        );
        assert_eq!(
            whoami(&via_http(b), &origin, &[]),
            DIRECT,
            "HTTP via node b, {round}"
        );
    };
    for round in 0..3 {
        both(&a, &b, &format!("round {round}"));
    }
    // Each node's identity is restored from the store by its next plane.
    let (next, _) = a.deploy(&mut da);
    da = next;
    let (next, _) = b.deploy(&mut db);
    db = next;
    both(&a, &b, "after a deploy of each node");
    drop((da, db));
}

#[test]
fn bad_upstreams_get_the_protocols_errors_promptly_and_the_node_serves_on() {
    let origin = Origin::start();
    let upstreams = [
        (
            "garbage",
            FakeUpstream::start(Behaviour::Garbage),
            4u8,
            "502",
        ),
        (
            "closing",
            FakeUpstream::start(Behaviour::CloseAfterGreeting),
            4,
            "502",
        ),
        ("silent", FakeUpstream::start(Behaviour::Silent), 6, "504"),
        (
            "refusing",
            FakeUpstream::start(Behaviour::RefuseConnect(5)),
            5,
            "502",
        ),
        (
            "blackholed",
            FakeUpstream::start(Behaviour::SilentAtConnect),
            6,
            "504",
        ),
    ];
    let mut config: String = upstreams
        .iter()
        .map(|(name, upstream, _, _)| upstream_toml(name, upstream.address, None))
        .collect();
    // And a real dante that refuses the credentials we are given.
    let dante = Dante::start(DANTE_A);
    let wrong = password_file(dante.path(), &format!("{}-wrong", dante.password));
    config.push_str(&upstream_toml(
        "wrong-login",
        dante.address,
        Some((&dante.username, &wrong)),
    ));
    config.push_str("[proxy]\nconnect_timeout = \"2s\"\n");
    let mut node = Node::new(&config);
    let (_ingress, mut device, _alice) = node.start();
    let target = origin.address;
    let mut cases: Vec<(&str, Option<&FakeUpstream>, u8, &str)> = upstreams
        .iter()
        .map(|(name, upstream, reply, http)| (*name, Some(upstream), *reply, *http))
        .collect();
    // Our credentials refused: 1 (general failure), 502.
    cases.push(("wrong-login", None, 1, "502"));
    for (name, upstream, reply, http) in &cases {
        let client = add_client_with(
            &node,
            &format!("pinned-{name}"),
            &format!("upstream:{name}"),
        );
        let before = upstream.map_or(0, FakeUpstream::connections);
        // SOCKS5: the reply code for what the upstream did, then a close.
        let mut stream = raw::connect(node.socks);
        assert_eq!(
            raw::socks5_login(&mut stream, &client.name, &client.secret),
            0
        );
        let asked = Instant::now();
        assert_eq!(
            raw::socks5_connect_v4(&mut stream, target),
            *reply,
            "{name}: SOCKS5 reply"
        );
        eprintln!("{name}: SOCKS5 reply {reply} after {:?}", asked.elapsed());
        assert!(
            raw::closed(&mut stream),
            "{name}: the SOCKS5 connection stays open"
        );
        // curl fails with an error of its own, not its own timeout.
        let output = curl(&[
            "--max-time",
            "30",
            "--proxy",
            &client.socks,
            &origin.url("/whoami"),
        ]);
        assert!(!output.status.success(), "{name}: {}", text(&output.stdout));
        assert_ne!(output.status.code(), Some(28), "{name}: curl timed out");
        let stderr = text(&output.stderr);
        assert!(stderr.contains(&format!("({reply})")), "{name}: {stderr}");
        // HTTP CONNECT and absolute-form.
        let url = origin.url("/whoami");
        assert_eq!(
            status_code(&client.http, &url, &["--proxytunnel"]),
            *http,
            "{name}: CONNECT"
        );
        assert_eq!(
            status_code(&client.http, &url, &[]),
            *http,
            "{name}: absolute-form"
        );
        if let Some(upstream) = upstream {
            assert!(
                upstream.connections() >= before + 4,
                "{name}: {} connections reached the upstream",
                upstream.connections() - before
            );
        }
    }
    // Dante logged each refused login.
    assert!(
        dante.log_text().contains(&dante.username),
        "dante never saw our login{}",
        dante.log_text()
    );
    assert_eq!(
        origin.connections(),
        0,
        "a request reached the origin through a bad upstream"
    );
    // The node serves on: a direct client through the same node.
    let direct = add_client_with(&node, "direct-client", "direct");
    assert_eq!(whoami(&direct.socks, &origin, &[]), DIRECT);
    assert_eq!(whoami(&direct.http, &origin, &[]), DIRECT);
    assert_eq!(
        fetch(&direct.socks, &origin.url("/bytes/100000"), &[]),
        pattern(100_000)
    );
    assert!(
        device.child.try_wait().expect("poll").is_none(),
        "the device plane died"
    );
    // The three whose greeting fails are marked down (probes and connects);
    // the ones that only refuse CONNECT, or never answer it (the
    // destination's silence: four in a row here), speak SOCKS5 and stay up,
    // never marked down in between.
    for name in ["garbage", "closing", "silent", "wrong-login"] {
        wait_route_up(&node, name, false);
    }
    let report = egress_report(&node);
    assert_eq!(route(&report, "refusing")["up"], true, "{report}");
    assert_eq!(route(&report, "blackholed")["up"], true, "{report}");
    let log = device.log_text();
    let marked_down = |name: &str| {
        log.lines()
            .any(|l| l.contains("egress route is down") && l.contains(&format!("route={name}")))
    };
    assert!(marked_down("garbage"), "the log names routes so:\n{log}");
    for name in ["refusing", "blackholed"] {
        assert!(!marked_down(name), "{name} was marked down:\n{log}");
    }
    let (code, body) = node.status();
    assert_eq!(code, 200, "{body}");
    for name in ["garbage", "closing", "silent", "wrong-login"] {
        assert!(
            body.contains(&format!("upstream {name} down: ")),
            "/status: {body}"
        );
    }
    assert!(!body.contains("upstream refusing"), "/status: {body}");
    assert!(!body.contains("upstream blackholed"), "/status: {body}");
}

#[test]
fn unknown_upstreams_and_tags_in_a_client_policy_exit_64() {
    let upstream = FakeUpstream::start(Behaviour::RefuseConnect(5));
    let mut toml = upstream_toml("dc-1", upstream.address, None);
    toml = toml.replace(
        "kind = \"socks5\"\n",
        "kind = \"socks5\"\ntags = [\"eu\"]\n",
    );
    let node = Node::new(&toml);
    for policy in [
        "tags:nope",
        "tags:eu,nope",
        "upstream:nope",
        "upstream:direct",
        "sideways",
    ] {
        let output = node.ctl(&["client", "add", "x", "--egress", policy]);
        assert_eq!(
            output.status.code(),
            Some(64),
            "--egress {policy}: {}{}",
            text(&output.stdout),
            text(&output.stderr)
        );
    }
    // Every problem of one command at once (this node has no
    // wireguard.endpoint), as for a configuration that does not load.
    let output = node.ctl(&["client", "add", "x", "--wg", "--egress", "tags:nope"]);
    let said = text(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{said}");
    assert!(
        said.contains("2 problems") && said.contains("wireguard.endpoint") && said.contains("nope"),
        "both problems: {said}"
    );
    let output = node.ctl(&[
        "--json",
        "client",
        "add",
        "x",
        "--wg",
        "--egress",
        "tags:nope",
    ]);
    let json: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("--json answers in JSON");
    assert_eq!(json["problems"].as_array().map(Vec::len), Some(2), "{json}");
    // Nothing was added; the known ones are accepted.
    for (name, policy) in [
        ("t", "tags:eu"),
        ("u", "upstream:dc-1"),
        ("d", "direct"),
        ("y", "any"),
    ] {
        let output = node.ctl(&["client", "add", name, "--egress", policy]);
        assert!(
            output.status.success(),
            "--egress {policy}: {}",
            text(&output.stderr)
        );
    }
    let list = node.ctl(&["--json", "client", "list"]);
    let list = text(&list.stdout);
    assert!(
        !list.contains("\"x\""),
        "a refused client was added: {list}"
    );
    assert!(
        list.contains("upstream:dc-1") && list.contains("tags:eu"),
        "{list}"
    );
}

/// Runs `binary` on `config` and returns its output (it must exit by itself).
fn run_on(binary: &str, config: &Path) -> Output {
    let mut command = Command::new(blipless_tests::binary(binary));
    command.arg("--config").arg(config);
    if binary == "blipless-ctl" {
        command.arg("status");
    }
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("poll").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("{binary} did not exit on a bad upstream config");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn a_malformed_upstream_entry_exits_64_listing_each_of_its_problems() {
    let node = Node::new(
        "[[egress.upstream]]\nname = \"dc-1\"\nkind = \"ftp\"\n\n\
         [[egress.upstream]]\nname = \"dc-2\"\nkind = \"socks5\"\n",
    );
    for binary in ["blipless-device", "blipless-ingress"] {
        let output = run_on(binary, &node.config);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{binary}: {stderr}");
        for needle in [
            "egress.upstream[0].kind",
            "\"ftp\"",
            "egress.upstream[1].address",
        ] {
            assert!(
                stderr.contains(needle),
                "{binary} does not mention {needle}: {stderr}"
            );
        }
    }
}

/// A client removed while its HTTP CONNECT is still connecting (its
/// upstream has not answered) gets a 407 and a close at once, as a SOCKS5
/// client gets reply 2: not a 200 for a tunnel that is cut at once, nor a
/// wait for the connect timeout.
#[test]
fn a_client_removed_while_its_http_connect_runs_gets_407() {
    use std::io::{Read as _, Write as _};
    let stuck = FakeUpstream::start(Behaviour::SilentAtConnect);
    let mut config = upstream_toml("stuck", stuck.address, None);
    config.push_str("[proxy]\nconnect_timeout = \"30s\"\n");
    let mut node = Node::new(&config);
    let (_ingress, _device, _alice) = node.start();
    let client = add_client_with(&node, "pinned", "upstream:stuck");
    let mut stream = raw::connect(node.http);
    let credentials =
        blipless_tests::base64(format!("{}:{}", client.name, client.secret).as_bytes());
    write!(
        stream,
        "CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nProxy-Authorization: Basic {credentials}\r\n\r\n"
    )
    .expect("CONNECT");
    wait_until(
        Duration::from_secs(10),
        "the upstream to hold the connect",
        || stuck.connections() >= 1,
    );
    let removed = node.ctl(&["client", "remove", "pinned"]);
    assert!(removed.status.success(), "{}", text(&removed.stderr));
    let started = Instant::now();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = text(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 407"),
        "the CONNECT was answered {answer:?} after {:?}",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "answered within seconds, took {:?}",
        started.elapsed()
    );
}

/// A node with more upstreams than one report frame holds (1500, with long
/// names, all refusing) keeps its device plane attached and active: the
/// report leaves routes out instead of failing, which cost the plane its
/// channel every second.
#[test]
fn a_plane_with_more_routes_than_one_report_holds_stays_attached() {
    let config: String = (0..1500)
        .map(|n| {
            let name = format!("upstream-{n:04}-{}", "x".repeat(50));
            upstream_toml(&name, "127.0.0.1:1".parse().expect("address"), None)
        })
        .collect();
    let mut node = Node::new(&config);
    let (_ingress, device, _alice) = node.start();
    let active = node.active_generation();
    assert!(active.is_some(), "a plane is active");
    // Reports go out every second: five of them.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        node.active_generation(),
        active,
        "the same plane is still active"
    );
    let log = device.log_text();
    assert!(
        !log.contains("reattaching") && !log.contains("exceeds the"),
        "the plane lost its channel:\n{}",
        log.lines().rev().take(30).collect::<Vec<_>>().join("\n")
    );
    assert!(
        log.contains("do not all fit one report"),
        "the plane says routes were left out:\n{}",
        log.lines().rev().take(30).collect::<Vec<_>>().join("\n")
    );
}
