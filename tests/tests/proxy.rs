//! The foundation end to end: real binaries, real sockets, curl as the client.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use blipless_tests::curl::{fetch, status_code};
use blipless_tests::node::Node;
use blipless_tests::origin::Origin;
use blipless_tests::{pattern, raw, sha256};

const BIG: usize = 8 * 1024 * 1024;

#[test]
fn curl_through_socks5_and_http_gets_the_exact_bytes() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let (_ingress, _device, client) = node.start();
    let url = origin.url(&format!("/bytes/{BIG}"));
    let expected = sha256(&pattern(BIG));

    let via_socks = fetch(&client.socks, &url, &[]);
    assert_eq!(via_socks.len(), BIG);
    assert_eq!(sha256(&via_socks), expected, "SOCKS5 body differs");

    let via_http_get = fetch(&client.http, &url, &[]);
    assert_eq!(
        sha256(&via_http_get),
        expected,
        "HTTP absolute-form body differs"
    );

    let via_http_connect = fetch(&client.http, &url, &["--proxytunnel"]);
    assert_eq!(
        sha256(&via_http_connect),
        expected,
        "HTTP CONNECT body differs"
    );

    // Kept-alive client connection: two requests, one proxy connection.
    let output = blipless_tests::curl::curl(&[
        "--max-time",
        "30",
        "--proxy",
        &client.http,
        "-w",
        "%{num_connects}\n",
        &origin.url("/a"),
        &origin.url("/b"),
    ]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    assert_eq!(text.matches("hello").count(), 2);
    assert!(
        text.contains("hello0"),
        "second request reused the proxy connection: {text}"
    );

    // A domain name resolved by the proxy (socks5h): localhost -> 127.0.0.1 is allowed.
    let by_name = origin.url("/bytes/1000").replace("127.0.0.1", "localhost");
    assert_eq!(fetch(&client.socks, &by_name, &[]), pattern(1000));
}

#[test]
fn credentials_policy_and_reachability_get_the_protocols_answers() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let (_ingress, _device, client) = node.start();
    let url = origin.url("/");
    let wrong_http = client.http.replace(&client.secret, "wrong");
    let bare_http = format!("http://{}", node.http);

    // HTTP: 407 with a challenge when missing or wrong.
    assert_eq!(status_code(&wrong_http, &url, &[]), "407");
    let output =
        blipless_tests::curl::curl(&["--max-time", "10", "-i", "--proxy", &bare_http, &url]);
    let head = String::from_utf8_lossy(&output.stdout);
    assert!(head.starts_with("HTTP/1.1 407"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("proxy-authenticate: basic"),
        "{head}"
    );

    // SOCKS5: wrong password gets status 1 and a close.
    let mut stream = raw::connect(node.socks);
    assert_eq!(raw::socks5_login(&mut stream, "alice", "wrong"), 1);
    assert!(raw::closed(&mut stream));
    // Unknown user, same answer.
    let mut stream = raw::connect(node.socks);
    assert_eq!(raw::socks5_login(&mut stream, "mallory", &client.secret), 1);
    assert!(raw::closed(&mut stream));
    // curl sees the failure too.
    let output = blipless_tests::curl::curl(&[
        "--max-time",
        "10",
        "--proxy",
        &client.socks.replace(&client.secret, "wrong"),
        &url,
    ]);
    assert!(!output.status.success());

    // Refused destination: loopback other than the allow-listed 127.0.0.1.
    let denied = format!("127.0.0.2:{}", origin.address.port());
    let mut stream = raw::connect(node.socks);
    assert_eq!(raw::socks5_login(&mut stream, "alice", &client.secret), 0);
    assert_eq!(
        raw::socks5_connect_v4(&mut stream, denied.parse().expect("addr")),
        2
    );
    assert!(raw::closed(&mut stream));
    assert_eq!(
        status_code(&client.http, &format!("http://{denied}/"), &[]),
        "403"
    );
    assert_eq!(
        status_code(
            &client.http,
            &format!("http://{denied}/"),
            &["--proxytunnel"]
        ),
        "403"
    );

    // IPv4 in IPv6 clothing (6to4, NAT64, IPv4-translated forms of the
    // metadata address and of loopback): refused the same way, by curl's own
    // SOCKS5 and HTTP CONNECT requests.
    for dressed in [
        "[2002:a9fe:a9fe::1]",
        "[64:ff9b::7f00:2]",
        "[::ffff:0:7f00:2]",
    ] {
        let url = format!("http://{dressed}:{}/", origin.address.port());
        let socks =
            blipless_tests::curl::curl(&["-s", "--max-time", "10", "--proxy", &client.socks, &url]);
        // 97: the SOCKS5 server refused the connection (reply 2, not allowed).
        assert_eq!(socks.status.code(), Some(97), "{dressed} through SOCKS5");
        assert_eq!(
            status_code(&client.http, &url, &["--proxytunnel"]),
            "403",
            "{dressed} through HTTP CONNECT"
        );
    }

    // Unreachable: a closed port on an allowed address.
    let closed_port = blipless_tests::free_port();
    let unreachable = format!("127.0.0.1:{closed_port}");
    let mut stream = raw::connect(node.socks);
    assert_eq!(raw::socks5_login(&mut stream, "alice", &client.secret), 0);
    let code = raw::socks5_connect_v4(&mut stream, unreachable.parse().expect("addr"));
    assert!(code == 4 || code == 5, "reply {code} for a closed port");
    assert_eq!(
        status_code(&client.http, &format!("http://{unreachable}/"), &[]),
        "502"
    );
    assert_eq!(
        status_code(
            &client.http,
            &format!("http://{unreachable}/"),
            &["--proxytunnel"]
        ),
        "502"
    );

    // The node still serves.
    assert_eq!(fetch(&client.socks, &url, &[]), b"hello");
}

#[test]
fn malformed_requests_get_the_protocols_error_and_a_close() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let (_ingress, _device, client) = node.start();

    // SOCKS4 on the SOCKS5 port: closed without a SOCKS5 method.
    let mut stream = raw::connect(node.socks);
    stream
        .write_all(&[4, 1, 0, 80, 127, 0, 0, 1, 0])
        .expect("write");
    assert!(raw::closed(&mut stream));

    // No acceptable method: [5, 0xFF] then close.
    let mut stream = raw::connect(node.socks);
    stream.write_all(&[5, 1, 0]).expect("write");
    assert_eq!(raw::read_exact(&mut stream, 2), [5, 0xFF]);
    assert!(raw::closed(&mut stream));

    // Unknown command: reply 7.
    let mut stream = raw::connect(node.socks);
    assert_eq!(raw::socks5_login(&mut stream, "alice", &client.secret), 0);
    stream
        .write_all(&[5, 9, 0, 1, 127, 0, 0, 1, 0, 80])
        .expect("write");
    assert_eq!(raw::read_exact(&mut stream, 10)[1], 7);
    assert!(raw::closed(&mut stream));

    // Unknown address type: reply 8.
    let mut stream = raw::connect(node.socks);
    assert_eq!(raw::socks5_login(&mut stream, "alice", &client.secret), 0);
    stream.write_all(&[5, 1, 0, 9, 1, 2, 3]).expect("write");
    assert_eq!(raw::read_exact(&mut stream, 10)[1], 8);
    assert!(raw::closed(&mut stream));

    // A request whose version byte is not 5, after a SOCKS5 greeting and
    // login: reply 1 (general failure), then close.
    let mut stream = raw::connect(node.socks);
    assert_eq!(raw::socks5_login(&mut stream, "alice", &client.secret), 0);
    stream
        .write_all(&[4, 1, 0, 1, 127, 0, 0, 1, 0, 80])
        .expect("write");
    assert_eq!(raw::read_exact(&mut stream, 10)[..2], [5, 1]);
    assert!(raw::closed(&mut stream));

    // BIND is parsed but not offered: reply 7.
    let mut stream = raw::connect(node.socks);
    assert_eq!(raw::socks5_login(&mut stream, "alice", &client.secret), 0);
    stream
        .write_all(&[5, 2, 0, 1, 127, 0, 0, 1, 0, 80])
        .expect("write");
    assert_eq!(raw::read_exact(&mut stream, 10)[1], 7);

    // A client that goes away mid-handshake costs only itself.
    let mut stream = raw::connect(node.socks);
    stream.write_all(&[5, 2]).expect("write");
    drop(stream);

    // Garbage on the HTTP port: 400 and a close.
    let mut stream = raw::connect(node.http);
    stream
        .write_all(b"\x01\x02 NOT HTTP\r\n\r\n")
        .expect("write");
    let mut answer = Vec::new();
    let _ = std::io::Read::read_to_end(&mut stream, &mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");

    // A head hyper cannot read (a Content-Length that is no number) with a
    // body behind it the proxy never reads: the 400 still arrives, rather
    // than a reset that would throw it away.
    let mut stream = raw::connect(node.http);
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        origin.url("/")
    );
    stream.write_all(head.as_bytes()).expect("write");
    // Sent while hyper answers; a reset would fail these writes too.
    let body_sent = stream.write_all(&vec![b'x'; 256 * 1024]).is_ok();
    let mut answer = Vec::new();
    let read = std::io::Read::read_to_end(&mut stream, &mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 400"),
        "{answer} (body sent: {body_sent}, read: {read:?})"
    );
    assert!(body_sent && read.is_ok(), "{body_sent} {read:?}");

    // An origin-form request to a proxy: 400 (after authentication).
    let mut stream = raw::connect(node.http);
    let auth = format!("alice:{}", client.secret);
    let encoded = blipless_tests::base64(auth.as_bytes());
    write!(stream, "GET / HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {encoded}\r\nConnection: close\r\n\r\n").expect("write");
    let mut answer = Vec::new();
    let _ = std::io::Read::read_to_end(&mut stream, &mut answer);
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 400"));

    // Everyone else is still served.
    assert_eq!(fetch(&client.socks, &origin.url("/"), &[]), b"hello");
    assert_eq!(fetch(&client.http, &origin.url("/"), &[]), b"hello");
}

#[test]
fn connections_wait_in_the_backlog_while_the_device_plane_restarts() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let (_ingress, mut device, client) = node.start();
    assert_eq!(fetch(&client.socks, &origin.url("/"), &[]), b"hello");

    device.signal(nix::sys::signal::Signal::SIGKILL);
    device.kill();
    blipless_tests::wait_until(Duration::from_secs(20), "/status to say starting", || {
        let (code, body) = node.status();
        code == 503 && body.lines().next() == Some("starting")
    });

    // Customers arrive while no device plane is attached.
    let url = origin.url("/bytes/100000");
    let waiting: Vec<_> = (0..6)
        .map(|i| {
            let proxy = if i % 2 == 0 {
                client.socks.clone()
            } else {
                client.http.clone()
            };
            let url = url.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                let body = fetch(&proxy, &url, &["--connect-timeout", "30"]);
                (body, started.elapsed())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let _device = node.start_device();
    for handle in waiting {
        let (body, took) = handle.join().expect("curl thread");
        assert_eq!(sha256(&body), sha256(&pattern(100_000)));
        assert!(
            took < Duration::from_secs(50),
            "a waiting curl took {took:?}"
        );
    }
    node.wait_ready();
}

#[test]
fn a_thousand_concurrent_socks5_connections_all_complete() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let (_ingress, _device, client) = node.start();
    // Four curl processes, 250 parallel transfers each (curl caps one at 300);
    // the origin holds each answer 3 s so the connections overlap.
    let url = origin.url("/slow/3000");
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let mut command = std::process::Command::new("curl");
            command.args([
                "-s",
                "--no-progress-meter",
                "--parallel",
                "--parallel-immediate",
                "--parallel-max",
                "250",
                "--max-time",
                "120",
                "--proxy",
                &client.socks,
                "-w",
                "%{http_code}\n",
                "-o",
                "/dev/null",
            ]);
            for _ in 0..250 {
                command.arg(&url);
                command.args(["-o", "/dev/null"]);
            }
            command.stdin(std::process::Stdio::null()).spawn_output()
        })
        .collect();
    let mut ok = 0;
    for run in runs {
        let output = run.join().expect("curl thread");
        ok += String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|l| *l == "200")
            .count();
    }
    assert_eq!(ok, 1000, "every transfer answered 200");
    assert!(
        origin.connections() >= 1000,
        "origin saw {} connections",
        origin.connections()
    );
    assert!(
        origin.peak() >= 500,
        "connections overlapped (peak {})",
        origin.peak()
    );
}

trait SpawnOutput {
    fn spawn_output(self) -> std::thread::JoinHandle<std::process::Output>;
}

impl SpawnOutput for &mut std::process::Command {
    fn spawn_output(self) -> std::thread::JoinHandle<std::process::Output> {
        let child = self
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("curl");
        std::thread::spawn(move || child.wait_with_output().expect("curl output"))
    }
}

#[test]
fn a_bad_config_exits_64_listing_every_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("bad.toml");
    std::fs::write(
        &config,
        "[listen]\nsocks = \"not-an-address\"\nhtp = \"127.0.0.1:1\"\n\n[drain]\ngrace = \"soon\"\n\n[egress]\nallow = [\"10.0.0.0/33\"]\n",
    )
    .expect("write");
    for binary in ["blipless-ingress", "blipless-device", "blipless-ctl"] {
        let mut command = std::process::Command::new(blipless_tests::binary(binary));
        command.arg("--config").arg(&config);
        if binary == "blipless-ctl" {
            command.arg("status");
        }
        let output = command.output().expect("run");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{binary}: {stderr}");
        for needle in [
            "listen.socks",
            "listen.htp",
            "listen.http",
            "drain.grace",
            "egress.allow",
            "4 problems",
        ] {
            assert!(
                stderr.contains(needle),
                "{binary} does not mention {needle}: {stderr}"
            );
        }
    }
}

#[test]
fn removing_a_client_closes_its_open_tunnels_within_seconds() {
    use std::io::Read;
    let origin = Origin::start();
    let mut node = Node::new("");
    let (_ingress, _device, client) = node.start();
    let bob = node.add_client("bob");
    blipless_tests::wait_until(
        Duration::from_secs(10),
        "bob to reach the device plane",
        || node.status_json()["device_planes"][0]["clients"] == 2,
    );
    // A slow answer keeps alice's tunnel open; bob's stays untouched.
    let open_tunnel = |name: &str, secret: &str| {
        let mut stream = raw::connect(node.socks);
        assert_eq!(raw::socks5_login(&mut stream, name, secret), 0);
        assert_eq!(raw::socks5_connect_v4(&mut stream, origin.address), 0);
        stream
            .write_all(b"GET /slow/30000 HTTP/1.1\r\nHost: o\r\n\r\n")
            .expect("request");
        stream
    };
    // And a forwarded HTTP exchange (absolute form) waiting on its answer.
    let open_exchange = |name: &str, secret: &str| {
        use base64::Engine as _;
        let credentials =
            base64::engine::general_purpose::STANDARD.encode(format!("{name}:{secret}"));
        let mut stream = raw::connect(node.http);
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: o\r\nProxy-Authorization: Basic {credentials}\r\n\r\n",
            origin.url("/slow/30000")
        );
        stream.write_all(request.as_bytes()).expect("request");
        stream
    };
    let mut alice_tunnel = open_tunnel("alice", &client.secret);
    let mut alice_exchange = open_exchange("alice", &client.secret);
    let mut bob_tunnel = open_tunnel("bob", &bob.secret);
    blipless_tests::wait_until(
        Duration::from_secs(10),
        "the three requests to reach the origin",
        || origin.requests() >= 3,
    );
    let removed = node.ctl(&["client", "remove", "alice"]);
    assert!(
        removed.status.success(),
        "{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    let started = Instant::now();
    let mut byte = [0u8; 1];
    let closed = matches!(alice_tunnel.read(&mut byte), Ok(0) | Err(_));
    assert!(closed, "alice's tunnel was closed");
    let mut answer = Vec::new();
    let _ = alice_exchange.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 407"),
        "alice's exchange was answered 407 and closed before the origin answered: {answer}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "closed within seconds, took {:?}",
        started.elapsed()
    );
    // bob's tunnel is still open (the read times out only after 20 s, so peek briefly).
    bob_tunnel
        .set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    let still_open =
        matches!(bob_tunnel.read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    assert!(still_open, "bob's tunnel is untouched");
    // alice can no longer authenticate.
    let mut stream = raw::connect(node.socks);
    assert_eq!(raw::socks5_login(&mut stream, "alice", &client.secret), 1);
}

#[test]
fn socks5_connects_to_ipv6_destinations_under_the_same_policy() {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("[::1]:0").expect("IPv6 loopback");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = stream.write_all(b"over v6");
        }
    });
    let request = |stream: &mut std::net::TcpStream| {
        let mut connect = vec![5, 1, 0, 4];
        connect.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
        connect.extend_from_slice(&port.to_be_bytes());
        stream.write_all(&connect).expect("request");
        let reply = raw::read_exact(stream, 4);
        // The bound address that follows has the reply's own address type.
        let rest = if reply[3] == 4 { 18 } else { 6 };
        raw::read_exact(stream, rest);
        reply[1]
    };
    let mut node = Node::new("");
    let _ingress = node.start_ingress();
    let client = node.add_client("alice");
    // ::1 is loopback: refused by default...
    let mut denying = node.start_device();
    node.wait_ready();
    let mut stream = raw::connect(node.socks);
    assert_eq!(raw::socks5_login(&mut stream, "alice", &client.secret), 0);
    assert_eq!(request(&mut stream), 2, "::1 is denied by default");
    // ...and allowed once listed.
    let allowing = node.start_device_with_env(&[("BLIPLESS_EGRESS_ALLOW", "127.0.0.1/32,::1/128")]);
    let _ = denying.wait_exit(Duration::from_secs(30));
    let mut stream = raw::connect(node.socks);
    assert_eq!(raw::socks5_login(&mut stream, "alice", &client.secret), 0);
    assert_eq!(request(&mut stream), 0, "::1 allowed by egress.allow");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("answer");
    assert_eq!(answer, "over v6");
    drop(allowing);
}

#[test]
fn a_slow_loris_is_closed_at_the_handshake_timeout() {
    use std::io::Read;
    let mut node = Node::new("[proxy]\nhandshake_timeout = \"1s\"\n");
    let (_ingress, _device, _client) = node.start();
    let started = Instant::now();
    // SOCKS5: half a greeting, then nothing.
    let mut socks = raw::connect(node.socks);
    socks.write_all(&[5]).expect("write");
    // HTTP: a request head that never ends.
    let mut http = raw::connect(node.http);
    http.write_all(b"GET http://127.0.0.1/ HTTP/1.1\r\nHost: x\r\n")
        .expect("write");
    assert!(raw::closed(&mut socks), "the SOCKS5 slow loris was closed");
    let mut rest = Vec::new();
    let _ = http.read_to_end(&mut rest);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "not before the timeout: {took:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "at the timeout, not much later: {took:?}"
    );
}

#[test]
fn config_check_says_sound_or_lists_every_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Its own state directory: the default's parent need not be writable
    // by whoever runs the tests (a WireGuard key the ingress could not
    // make is a problem).
    let state_dir = tempfile::tempdir().expect("tempdir");
    let check = |config: &std::path::Path, json: bool| {
        let mut command = std::process::Command::new(blipless_tests::binary("blipless-ctl"));
        command
            .env("BLIPLESS_NODE_STATE_DIR", state_dir.path())
            .arg("--config")
            .arg(config);
        if json {
            command.arg("--json");
        }
        command.args(["config", "check"]).output().expect("run")
    };
    let sound = dir.path().join("sound.toml");
    std::fs::write(
        &sound,
        "[listen]\nsocks = \"127.0.0.1:1081\"\n\n[wireguard]\ninterface = \"edge0\"\n",
    )
    .expect("write");
    let output = check(&sound, false);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("configuration sound"));
    let output = check(&sound, true);
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(answer["ok"], true, "{answer}");

    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[wireguard]\ninterface = \"far/too/long/a/name\"\nuapi = \"yes\"\n\n[drain]\ngrace = \"soon\"\n",
    )
    .expect("write");
    let output = check(&bad, false);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    for needle in [
        "wireguard.interface",
        "wireguard.uapi",
        "drain.grace",
        "3 problems",
    ] {
        assert!(stderr.contains(needle), "no {needle} in {stderr}");
    }
    let output = check(&bad, true);
    assert_eq!(output.status.code(), Some(64));
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(
        answer["problems"].as_array().map(Vec::len),
        Some(3),
        "{answer}"
    );

    // What the daemons read only at start is opened too: a certificate and
    // key that cannot be read pass the load but would stop the ingress.
    let unreadable = dir.path().join("unreadable.toml");
    let state = dir.path().join("state");
    let tls = format!(
        "[node]\nstate_dir = \"{}\"\n\n[tls]\ncertificate = \"{}\"\nkey = \"{}\"\n",
        state.display(),
        dir.path().join("gone.pem").display(),
        dir.path().join("gone.key").display()
    );
    std::fs::write(
        &unreadable,
        format!("[listen]\nhttps = \"127.0.0.1:8443\"\n\n{tls}"),
    )
    .expect("write");
    let output = check(&unreadable, false);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    for needle in ["tls.certificate", "tls.key", "cannot be read", "2 problems"] {
        assert!(stderr.contains(needle), "no {needle} in {stderr}");
    }
    // Without the HTTPS listener the ingress never opens them: sound.
    let unused = dir.path().join("unused.toml");
    std::fs::write(&unused, &tls).expect("write");
    let output = check(&unused, false);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // Files that can be read but hold the wrong thing are loaded as the
    // ingress loads them (they passed, and the ingress then exited 1 at
    // every restart): a certificate that is not PEM, a WireGuard key that
    // is not one. Both listed at once.
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not PEM\n").expect("write");
    let wg_key = dir.path().join("wg.key");
    std::fs::write(&wg_key, "notbase64\n").expect("write");
    let wrong = dir.path().join("wrong.toml");
    std::fs::write(
        &wrong,
        format!(
            "[listen]\nhttps = \"127.0.0.1:8443\"\n\n[tls]\ncertificate = \"{}\"\nkey = \"{}\"\n\n\
             [wireguard]\nprivate_key_file = \"{}\"\n",
            garbage.display(),
            garbage.display(),
            wg_key.display()
        ),
    )
    .expect("write");
    let output = check(&wrong, false);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    for needle in [
        "2 problems",
        "holds no PEM certificate",
        "wireguard.private_key_file",
        "not a base64 32-byte key",
    ] {
        assert!(stderr.contains(needle), "no {needle} in {stderr}");
    }
    // The ingress says the same, with exit 64 (which its unit does not
    // restart).
    let output = std::process::Command::new(blipless_tests::binary("blipless-ingress"))
        .env_remove("BLIPLESS_CONFIG")
        .arg("--config")
        .arg(&wrong)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("holds no PEM certificate") && stderr.contains("not a base64"),
        "{stderr}"
    );

    // A FIFO (or a directory) is no file to read: refused at once, where
    // opening it hung the check, and would have hung a daemon's start.
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    let piped = dir.path().join("piped.toml");
    std::fs::write(
        &piped,
        format!(
            "[listen]\nhttps = \"127.0.0.1:8443\"\n\n[tls]\ncertificate = \"{}\"\nkey = \"{}\"\n",
            dir.path().display(),
            fifo.display()
        ),
    )
    .expect("write");
    let mut child = std::process::Command::new(blipless_tests::binary("blipless-ctl"))
        .env("BLIPLESS_NODE_STATE_DIR", state_dir.path())
        .arg("--config")
        .arg(&piped)
        .args(["config", "check"])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("config check hung on a FIFO");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("stderr");
    assert_eq!(status.code(), Some(64), "{stderr}");
    for needle in ["2 problems", "a directory", "not a regular file"] {
        assert!(stderr.contains(needle), "no {needle} in {stderr}");
    }

    // A `BLIPLESS_SUPERVISE` the daemons would refuse is the check's
    // problem too.
    let output = std::process::Command::new(blipless_tests::binary("blipless-ctl"))
        .env("BLIPLESS_SUPERVISE", "ture")
        .env("BLIPLESS_NODE_STATE_DIR", state_dir.path())
        .arg("--config")
        .arg(&sound)
        .args(["config", "check"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("BLIPLESS_SUPERVISE"), "{stderr}");
}

/// Empty variables are unset, as an operator means them (a unit's
/// `Environment=BLIPLESS_LOG=`): an empty `BLIPLESS_LOG` used to be a
/// filter with no rules, so an ingress that could not start died without a
/// word; an empty `BLIPLESS_SUPERVISE` or `BLIPLESS_CONFIG` was a usage
/// error (exit 2) about a flag never given.
#[test]
fn empty_variables_are_unset_and_a_failed_start_still_says_why() {
    let node = Node::new("");
    // The SOCKS5 port, taken: the ingress cannot start.
    let _taken = std::net::TcpListener::bind(node.socks).expect("the SOCKS5 port");
    let output = std::process::Command::new(blipless_tests::binary("blipless-ingress"))
        .env("BLIPLESS_CONFIG", node.path().join("blipless.toml"))
        .env("BLIPLESS_LOG", "")
        .env("BLIPLESS_SUPERVISE", "")
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&node.socks.port().to_string()),
        "no word of the port in use: {stderr}"
    );
    let checked = std::process::Command::new(blipless_tests::binary("blipless-ctl"))
        .env("BLIPLESS_CONFIG", "")
        .args(["config", "defaults"])
        .output()
        .expect("run");
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// A WireGuard key the ingress would have to create where its user cannot
/// is a problem `config check` (run as that user, as postinst does) and the
/// ingress list, exit 64. Before, both passed it and the ingress exited 1
/// at every start. The user here is `nobody`, in a directory of root's.
#[test]
fn a_wireguard_key_that_cannot_be_created_is_a_configuration_problem() {
    use std::os::unix::fs::PermissionsExt;
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root, to run the check and the ingress as another user (setpriv)"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).expect("mkdir");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let as_nobody = |binary: &str, key: &std::path::Path, check: bool| {
        let mut command = std::process::Command::new("setpriv");
        command
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(blipless_tests::binary(binary))
            .env_remove("BLIPLESS_CONFIG")
            .arg("--set")
            .arg(format!("wireguard.private_key_file={}", key.display()))
            .arg("--set")
            .arg(format!("node.state_dir={}", dir.path().display()))
            .arg("--set")
            .arg(format!("node.runtime_dir={}", dir.path().display()));
        if check {
            command.args(["config", "check"]);
        }
        command.output().expect("setpriv")
    };
    let key = locked.join("sub/wireguard.key");
    for (binary, check) in [("blipless-ctl", true), ("blipless-ingress", false)] {
        let output = as_nobody(binary, &key, check);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{binary}: {stderr}");
        for needle in [
            "wireguard.private_key_file",
            "this user cannot create it in",
            &locked.display().to_string(),
        ] {
            assert!(stderr.contains(needle), "{binary}: no {needle} in {stderr}");
        }
    }
    // Where it may create it, the check is sound.
    let writable = dir.path().join("open");
    std::fs::create_dir(&writable).expect("mkdir");
    std::fs::set_permissions(&writable, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let output = as_nobody("blipless-ctl", &writable.join("sub/wireguard.key"), true);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A `--set` that is not UTF-8 (a password pasted from a Latin-1 file) is a
/// configuration problem listed with the others, exit 64, in all three
/// binaries and both spellings, its value not shown. Before, clap refused it
/// as a usage error (exit 2, which the units restart) and hid the others.
#[test]
fn a_set_that_is_not_utf8_is_listed_with_the_other_problems() {
    use std::os::unix::ffi::OsStringExt;
    let secret = b"store.url=redis://:s3cr\xe9t@127.0.0.1:1".to_vec();
    let mut spelled = b"--set=".to_vec();
    spelled.extend_from_slice(&secret);
    for binary in ["blipless-ingress", "blipless-device", "blipless-ctl"] {
        for arguments in [
            vec![
                std::ffi::OsString::from("--set"),
                std::ffi::OsString::from_vec(secret.clone()),
            ],
            vec![std::ffi::OsString::from_vec(spelled.clone())],
        ] {
            let mut command = std::process::Command::new(blipless_tests::binary(binary));
            command.env("BLIPLESS_DRAIN_GRACE", "soon").args(&arguments);
            if binary == "blipless-ctl" {
                command.args(["config", "check"]);
            }
            let output = command.output().expect("run");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(64), "{binary}: {stderr}");
            for needle in ["2 problems", "store.url", "UTF-8", "drain.grace"] {
                assert!(stderr.contains(needle), "{binary}: no {needle} in {stderr}");
            }
            assert!(
                !stderr.contains("s3cr"),
                "{binary} shows the secret: {stderr}"
            );
        }
    }
}

/// A `BLIPLESS_SUPERVISE` that is neither a yes nor a no is a configuration
/// problem listed with the others (exit 64, which the units do not
/// restart), not a usage error that hid them (exit 2, restarted every
/// second).
#[test]
fn a_bad_supervise_variable_is_listed_with_the_other_problems() {
    for daemon in ["blipless-ingress", "blipless-device"] {
        let output = std::process::Command::new(blipless_tests::binary(daemon))
            .env("BLIPLESS_SUPERVISE", "ture")
            .env("BLIPLESS_DRAIN_GRACE", "soon")
            .args(["--set", "listen.socks=x"])
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{daemon}: {stderr}");
        for needle in [
            "3 problems",
            "BLIPLESS_SUPERVISE",
            "\"ture\"",
            "drain.grace",
            "listen.socks",
        ] {
            assert!(stderr.contains(needle), "{daemon}: no {needle} in {stderr}");
        }
    }
}

/// `--set` before the subcommand and after it both count: clap kept only
/// the later ones, so `--set store.url=... client add ... --set ...` used
/// the default store without a word.
#[test]
fn sets_on_both_sides_of_a_subcommand_all_count() {
    let state = tempfile::tempdir().expect("tempdir");
    let ctl = |args: &[&str]| {
        std::process::Command::new(blipless_tests::binary("blipless-ctl"))
            .env_remove("BLIPLESS_CONFIG")
            .env("BLIPLESS_NODE_STATE_DIR", state.path())
            .args(args)
            .output()
            .expect("run")
    };
    for args in [
        &[
            "--set",
            "listen.socks=127.0.0.1:9",
            "config",
            "check",
            "--set",
            "listen.http=127.0.0.1:9",
        ][..],
        &[
            "--set",
            "listen.socks=127.0.0.1:9",
            "config",
            "--set=listen.http=127.0.0.1:9",
            "check",
        ][..],
    ] {
        let output = ctl(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(
            stderr.contains("--set listen.socks=127.0.0.1:9")
                && stderr.contains("--set listen.http=127.0.0.1:9")
                && stderr.contains("overlap"),
            "{args:?}: {stderr}"
        );
    }
    // In the order given: the last value of a key wins.
    let output = ctl(&[
        "--set",
        "listen.socks=127.0.0.1:9",
        "config",
        "check",
        "--set",
        "listen.socks=127.0.0.1:10",
        "--set",
        "listen.http=127.0.0.1:9",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A `client add --wg` refused for its settings creates no node key: run as
/// root, it left one the ingress's user could not read.
#[test]
fn a_wireguard_add_refused_for_its_settings_makes_no_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let output = std::process::Command::new(blipless_tests::binary("blipless-ctl"))
        .env_remove("BLIPLESS_CONFIG")
        .arg("--set")
        .arg(format!("node.state_dir={}", state.display()))
        .arg("--set")
        .arg(format!(
            "store.url=sqlite://{}/store.db",
            dir.path().display()
        ))
        .args(["client", "add", "alice", "--wg"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("wireguard.endpoint"), "{stderr}");
    assert!(
        !state.join("wireguard.key").exists(),
        "a key was made for an add that was refused"
    );
}

/// A SOCKS5 refusal is not lost to a reset: a client that sends its
/// greeting, login, request and first bytes in one write (optimistic data)
/// gets the reply and a clean close. Closed with those bytes unread, Linux
/// reset the connection, which discards any part of the reply not yet sent
/// (and a Windows client, what it had received); here that showed as a
/// write failing after the refusal.
#[test]
fn a_socks5_refusal_to_a_pipelining_client_ends_in_a_close_not_a_reset() {
    use std::io::Read;
    let mut node = Node::new("");
    let (_ingress, _device, client) = node.start();
    let mut stream = raw::connect(node.socks);
    let mut all = vec![5, 1, 2];
    all.extend_from_slice(&socks5_auth(&client.secret));
    // CONNECT 127.0.0.1:9, where nothing listens: refused.
    all.extend_from_slice(&[5, 1, 0, 1, 127, 0, 0, 1, 0, 9]);
    all.extend_from_slice(&vec![0x16; 16 * 1024]);
    stream.write_all(&all).expect("everything at once");
    assert_eq!(raw::read_exact(&mut stream, 2), [5, 2]);
    assert_eq!(raw::read_exact(&mut stream, 2), [1, 0]);
    let reply = raw::read_exact(&mut stream, 10);
    assert_eq!(reply[..2], [5, 5], "connection refused: {reply:?}");
    std::thread::sleep(Duration::from_millis(300));
    stream
        .write_all(&[0x17; 4096])
        .expect("the proxy still reads for a moment: no reset");
    let mut rest = Vec::new();
    stream
        .read_to_end(&mut rest)
        .expect("a clean close, not a reset");
    assert!(rest.is_empty(), "nothing after the reply");
}

/// A request the origin answers with `hello`.
const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: origin\r\n\r\n";

/// RFC 1929 credentials for `alice`.
fn socks5_auth(secret: &str) -> Vec<u8> {
    let mut auth = vec![1, 5];
    auth.extend_from_slice(b"alice");
    auth.push(secret.len() as u8);
    auth.extend_from_slice(secret.as_bytes());
    auth
}

/// A SOCKS5 CONNECT to an IPv4 address.
fn socks5_connect(target: SocketAddr) -> Vec<u8> {
    let SocketAddr::V4(target) = target else {
        panic!("an IPv4 target")
    };
    let mut request = vec![5, 1, 0, 1];
    request.extend_from_slice(&target.ip().octets());
    request.extend_from_slice(&target.port().to_be_bytes());
    request
}

/// Reads to the end of the stream (the origin closes after one response).
fn read_to_end(stream: &mut std::net::TcpStream) -> Vec<u8> {
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(stream, &mut bytes).expect("reading the tunnel to its end");
    bytes
}

/// Writes `bytes` a byte at a time, with a pause between them.
fn trickle(stream: &mut std::net::TcpStream, bytes: &[u8]) {
    for byte in bytes {
        stream.write_all(&[*byte]).expect("a byte of the handshake");
        std::thread::sleep(Duration::from_millis(15));
    }
}

/// The plane reads what a customer has sent before it registers the socket
/// (docs/ARCHITECTURE.md, "Following one SOCKS5 connection", the paragraph
/// "A handed connection's first bytes"): a handshake already there, one
/// that comes later, one that comes a byte at a time and one sent whole with
/// the tunnel's first bytes behind it all reach the origin the same.
#[test]
fn a_handshake_early_late_trickled_or_whole_opens_the_same_tunnel() {
    use base64::Engine as _;
    let origin = Origin::start();
    let mut node = Node::new("");
    let _ingress = node.start_ingress();
    let client = node.add_client("alice");
    let get = GET;
    let auth = socks5_auth(&client.secret);
    let request = socks5_connect(origin.address);
    let basic =
        base64::engine::general_purpose::STANDARD.encode(format!("alice:{}", client.secret));
    let connect = format!(
        "CONNECT {0} HTTP/1.1\r\nHost: {0}\r\nProxy-Authorization: Basic {basic}\r\n\r\n",
        origin.address
    );
    let established = b"HTTP/1.1 200";

    // Sent before any device plane is there, so the plane finds it all in
    // the connection's first bytes: SOCKS5's greeting, credentials, request
    // and the tunnel's first bytes in one write; HTTP CONNECT's head and the
    // tunnel's first bytes in one write.
    let mut socks_whole = raw::connect(node.socks);
    let whole = [&[5, 1, 2][..], &auth, &request, get].concat();
    socks_whole.write_all(&whole).expect("the whole handshake");
    let mut http_whole = raw::connect(node.http);
    http_whole
        .write_all(&[connect.as_bytes(), get].concat())
        .expect("the head and the tunnel's first bytes");
    let _device = node.start_device();
    node.wait_ready();

    // SOCKS5, the greeting sent long after the connection was handed over,
    // then a byte at a time.
    let mut stream = raw::connect(node.socks);
    std::thread::sleep(Duration::from_millis(300));
    trickle(&mut stream, &[5, 1, 2]);
    assert_eq!(raw::read_exact(&mut stream, 2), [5, 2]);
    trickle(&mut stream, &auth);
    assert_eq!(raw::read_exact(&mut stream, 2), [1, 0]);
    stream.write_all(&request).expect("request");
    assert_eq!(raw::read_exact(&mut stream, 10)[1], 0, "CONNECT succeeded");
    stream.write_all(get).expect("GET");
    assert!(read_to_end(&mut stream).ends_with(b"hello"));

    // HTTP CONNECT, the head sent late and a byte at a time.
    let mut stream = raw::connect(node.http);
    std::thread::sleep(Duration::from_millis(300));
    trickle(&mut stream, connect.as_bytes());
    assert_eq!(raw::read_exact(&mut stream, established.len()), established);
    stream.write_all(get).expect("GET");
    let rest = read_to_end(&mut stream);
    assert!(
        rest.ends_with(b"hello"),
        "{}",
        String::from_utf8_lossy(&rest)
    );

    // The two sent whole, answered in turn.
    assert_eq!(raw::read_exact(&mut socks_whole, 2), [5, 2]);
    assert_eq!(raw::read_exact(&mut socks_whole, 2), [1, 0]);
    assert_eq!(
        raw::read_exact(&mut socks_whole, 10)[1],
        0,
        "CONNECT succeeded"
    );
    assert!(read_to_end(&mut socks_whole).ends_with(b"hello"));
    let answer = read_to_end(&mut http_whole);
    assert!(
        answer.starts_with(established) && answer.ends_with(b"hello"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
}

/// Connections that waited in the listen backlog while no plane was active
/// reach the plane in one `AcceptedMany` when it becomes active, and each is
/// served; a plane older than that message (it closes the channel on one)
/// gets them one `Accepted` each (docs/ARCHITECTURE.md, "The device
/// channel").
#[test]
fn a_backlog_travels_in_one_frame_and_one_by_one_to_an_older_plane() {
    let origin = Origin::start();
    for older in [false, true] {
        let mut node = Node::new("");
        let _ingress = node.start_ingress();
        let client = node.add_client("alice");
        // No plane yet: the ingress does not accept, and the connections
        // wait in the kernel's backlog with their greetings.
        let mut waiting: Vec<_> = (0..10).map(|_| raw::connect(node.socks)).collect();
        for stream in &mut waiting {
            stream.write_all(&[5, 1, 2]).expect("greeting");
        }
        let env: &[(&str, &str)] = if older {
            &[("BLIPLESS_FAULT_OLDER_THAN_ACCEPTED_MANY", "1")]
        } else {
            &[]
        };
        let _device = node.start_device_with_env(env);
        node.wait_ready();
        for stream in &mut waiting {
            assert_eq!(raw::read_exact(stream, 2), [5, 2], "older: {older}");
            stream
                .write_all(&socks5_auth(&client.secret))
                .expect("credentials");
            assert_eq!(raw::read_exact(stream, 2), [1, 0]);
            stream
                .write_all(&socks5_connect(origin.address))
                .expect("request");
            assert_eq!(raw::read_exact(stream, 10)[1], 0, "CONNECT succeeded");
            stream.write_all(GET).expect("GET");
            assert!(read_to_end(stream).ends_with(b"hello"));
        }
        assert_eq!(node.metric("blipless_connections_handed_total"), 10.0);
        let bursts = node.metric("blipless_connection_bursts_handed_total");
        if older {
            assert_eq!(bursts, 0.0, "nothing in AcceptedMany to an older plane");
        } else {
            assert!(bursts >= 1.0, "the backlog went in AcceptedMany: {bursts}");
        }
        assert_eq!(
            node.active_generation(),
            Some(1),
            "the plane kept its channel"
        );
    }
}
