//! The HTTPS proxy listener (issue 12 §1): curl with `--proxy https://…`
//! and `--proxy-cacert` through the ingress's TLS edge to the device plane's
//! HTTP proxy, CONNECT and absolute-form, byte-exact, across device-plane
//! deploys, ingress handoffs and certificate reloads; and bad input on the
//! TLS port costing only its own connection.

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use blipless_tests::curl::{curl, fetch, status_code};
use blipless_tests::load::{steady_load_at, streaming_echo_at, CurlAt};
use blipless_tests::node::Node;
use blipless_tests::origin::Origin;
use blipless_tests::tls::TestCa;
use blipless_tests::{pattern, sha256, wait_until};

/// One absolute-form GET and one CONNECT through `proxy`, each checked byte
/// for byte.
fn fetch_both_ways(proxy: &str, ca: &str, origin: &Origin, size: usize) {
    let url = origin.url(&format!("/bytes/{size}"));
    let expected = sha256(&pattern(size));
    let plain = fetch(proxy, &url, &["--proxy-cacert", ca]);
    assert_eq!(plain.len(), size, "absolute-form length");
    assert_eq!(sha256(&plain), expected, "absolute-form body differs");
    let tunnelled = fetch(proxy, &url, &["--proxy-cacert", ca, "--proxytunnel"]);
    assert_eq!(tunnelled.len(), size, "CONNECT length");
    assert_eq!(sha256(&tunnelled), expected, "CONNECT body differs");
}

/// When `/status` says the certificate expires (its `tls certificate
/// expires <time> (in N days)` line, without the days).
fn expiry_line(node: &Node) -> String {
    let (_, body) = node.status();
    let line = body
        .lines()
        .find(|line| line.starts_with("tls certificate expires"))
        .unwrap_or_else(|| panic!("no tls line in /status: {body}"));
    line.split(" (in ").next().unwrap_or(line).to_owned()
}

#[test]
fn curl_through_the_https_proxy_across_deploys_handoffs_and_reloads() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let ca = TestCa::new(&node.path().join("ca"));
    let first = ca.leaf("first", 30);
    let served_cert = node.path().join("proxy.pem");
    let served_key = node.path().join("proxy.key");
    std::fs::copy(&first.certificate, &served_cert).expect("copy");
    std::fs::copy(&first.key, &served_key).expect("copy");
    node.enable_https(&served_cert, &served_key);
    let (mut ingress, mut device, client) = node.start();
    let https = client
        .https
        .clone()
        .expect("client add prints the https:// URL");
    assert!(https.starts_with("https://alice:"), "{https}");
    let ca_path = ca.certificate.to_str().expect("path").to_owned();
    fetch_both_ways(&https, &ca_path, &origin, 1 << 20);
    let first_expiry = expiry_line(&node);
    let expiry = node.metric("blipless_tls_certificate_expiry_timestamp_seconds");
    assert!(expiry > 1.7e9, "expiry metric: {expiry}");

    // A tunnel that streams both ways (1 MB/s) for longer than the deploys
    // take, and short requests meanwhile: nothing may fail.
    let size = 24 * 1024 * 1024;
    let upload = node.path().join("upload.bin");
    std::fs::write(&upload, pattern(size)).expect("write upload");
    let echo_out = node.path().join("echo.out");
    let at = CurlAt::HereTrustingProxyCa(ca.certificate.clone());
    let mut echo = streaming_echo_at(&at, &https, &origin.url("/echo"), &upload, &echo_out, true);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = steady_load_at(
        at,
        https.clone(),
        origin.url("/bytes/2000"),
        2,
        stop.clone(),
    );
    std::thread::sleep(Duration::from_millis(500));

    // Five deploys: the plaintext end of each HTTPS connection migrates.
    for round in 1..=5 {
        let (next, took) = node.deploy(&mut device);
        device = next;
        eprintln!("deploy {round} took {took:?}");
        fetch_both_ways(&https, &ca_path, &origin, 300_000);
        if round == 2 {
            // A reload that cannot load keeps the certificate in use.
            std::fs::write(&served_key, "not a key\n").expect("write");
            let output = node.ctl(&["tls", "reload"]);
            let said = String::from_utf8_lossy(&output.stderr);
            assert!(!output.status.success(), "a broken key reloaded: {said}");
            assert!(
                said.contains("proxy.key holds no PEM private key"),
                "{said}"
            );
            assert_eq!(expiry_line(&node), first_expiry);
            fetch_both_ways(&https, &ca_path, &origin, 300_000);
            // A new certificate (60 days), by blipless-ctl.
            let second = ca.leaf("second", 60);
            std::fs::copy(&second.certificate, &served_cert).expect("copy");
            std::fs::copy(&second.key, &served_key).expect("copy");
            let output = node.ctl(&["tls", "reload"]);
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
            assert_ne!(expiry_line(&node), first_expiry);
            fetch_both_ways(&https, &ca_path, &origin, 300_000);
        }
        if round == 4 {
            // Another, by SIGHUP.
            let before = expiry_line(&node);
            let third = ca.leaf("third", 90);
            std::fs::copy(&third.certificate, &served_cert).expect("copy");
            std::fs::copy(&third.key, &served_key).expect("copy");
            ingress.signal(nix::sys::signal::Signal::SIGHUP);
            wait_until(Duration::from_secs(20), "the SIGHUP reload", || {
                expiry_line(&node) != before
            });
            fetch_both_ways(&https, &ca_path, &origin, 300_000);
        }
    }
    assert_eq!(
        node.metric("blipless_tls_certificate_reloads_total{result=\"ok\"}"),
        2.0
    );
    assert!(
        echo.try_wait().expect("poll").is_none(),
        "the tunnel ended before the deploys did"
    );

    // A handoff: the successor takes new connections at once, and the old
    // ingress relays the TLS connection it holds until it ends.
    let successor = node.spawn_ingress();
    wait_until(Duration::from_secs(30), "the successor to serve", || {
        successor.log_text().contains("ingress serving")
    });
    fetch_both_ways(&https, &ca_path, &origin, 300_000);
    assert!(
        ingress.child.try_wait().expect("poll").is_none(),
        "the old ingress left while it still relayed the tunnel"
    );
    let status = echo.wait().expect("curl");
    let mut stderr = String::new();
    if let Some(mut pipe) = echo.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    assert!(status.success(), "the streaming tunnel failed: {stderr}");
    let echoed = std::fs::read(&echo_out).expect("echo output");
    assert_eq!(echoed.len(), size, "echo length");
    assert_eq!(sha256(&echoed), sha256(&pattern(size)), "echo differs");
    ingress.exits_cleanly("the old ingress, once its TLS connection ended");
    ingress = successor;
    // Two more, with nothing long-lived held: quick.
    for round in 2..=3 {
        let (next, took) = node.hand_off(&mut ingress);
        ingress = next;
        eprintln!("handoff {round}: the old ingress left after {took:?}");
        fetch_both_ways(&https, &ca_path, &origin, 300_000);
    }
    node.wait_ready();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (total, failures) = load.join().expect("load thread");
    assert!(total > 0, "the load ran");
    assert!(
        failures.is_empty(),
        "{} of {total} requests failed: {failures:?}",
        failures.len()
    );
    // The last ingress loaded the certificate on disk (the third) at start.
    assert!(ingress.log_text().contains("ingress serving"));
}

#[test]
fn bad_input_on_the_tls_port_costs_only_its_own_connection() {
    let origin = Origin::start();
    let mut node = Node::new("[proxy]\nhandshake_timeout = \"1s\"\n");
    let ca = TestCa::new(&node.path().join("ca"));
    let leaf = ca.leaf("proxy", 30);
    let address = node.enable_https(&leaf.certificate, &leaf.key);
    let (_ingress, _device, client) = node.start();
    let https = client.https.clone().expect("https URL");
    let ca_path = ca.certificate.to_str().expect("path").to_owned();
    // Held open across all of it: a good client mid-conversation.
    let url = origin.url("/bytes/1000");
    fetch_both_ways(&https, &ca_path, &origin, 1000);

    // Plaintext HTTP on the TLS port: no HTTP answer, a close.
    let mut plain = TcpStream::connect(address).expect("connect");
    plain
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    plain
        .write_all(format!("GET {url} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .expect("write");
    let mut reply = Vec::new();
    let _ = plain.read_to_end(&mut reply);
    assert!(
        !String::from_utf8_lossy(&reply).contains("HTTP/"),
        "plaintext got an HTTP answer: {reply:?}"
    );

    // A handshake naming a host the certificate does not cover.
    let output = std::process::Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &address.to_string(),
            "-servername",
            "evil.example",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl s_client");
    assert!(
        !output.status.success(),
        "a handshake for evil.example succeeded: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    // curl naming it too is refused before any request is sent.
    let wrong_name = https.replace("127.0.0.1", "evil.example");
    let output = curl(&[
        "--max-time",
        "20",
        "--proxy-cacert",
        &ca_path,
        "--resolve",
        &format!("evil.example:{}:127.0.0.1", address.port()),
        "--proxy",
        &wrong_name,
        &url,
    ]);
    assert!(
        !output.status.success(),
        "curl via the wrong name succeeded"
    );

    // A client that connects and never speaks is closed at the handshake
    // timeout (1 s here).
    let mut silent = TcpStream::connect(address).expect("connect");
    silent
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut byte = [0u8; 1];
    let read = silent.read(&mut byte);
    assert!(
        matches!(read, Ok(0)) || read.is_err(),
        "the silent client was answered: {read:?}"
    );
    assert!(
        read.as_ref()
            .err()
            .is_none_or(|e| e.kind() != std::io::ErrorKind::WouldBlock),
        "the silent client was not closed within 20 s"
    );

    // A wrong password gets the proxy's 407, over TLS.
    let wrong = https.replacen(&client.secret, "wrong", 1);
    assert_eq!(
        status_code(&wrong, &url, &["--proxy-cacert", &ca_path]),
        "407"
    );
    // And the good client is unharmed.
    fetch_both_ways(&https, &ca_path, &origin, 1000);
    let failed = node.metric("blipless_tls_handshakes_total{result=\"failed\"}");
    assert!(failed >= 4.0, "failed handshakes counted: {failed}");
}

#[test]
fn a_certificate_that_does_not_load_stops_the_start_with_the_reason() {
    // An ingress serving `certificate` and `key` exits, and says `why`.
    let start_fails = |certificate: &std::path::Path, key: &std::path::Path, why: &str| {
        let mut node = Node::new("");
        node.enable_https(certificate, key);
        let mut ingress = node.spawn_ingress();
        let status = ingress
            .wait_exit(Duration::from_secs(30))
            .expect("the ingress exits");
        // A configuration problem (64), which its unit does not restart.
        assert_eq!(status.code(), Some(64), "{status:?}");
        let log = ingress.log_text();
        assert!(log.contains(why), "{log}");
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let key = dir.path().join("broken.key");
    std::fs::write(&key, "not a key\n").expect("write");
    start_fails(&dir.path().join("missing.pem"), &key, "missing.pem");

    // A certificate that names no host (a common name only, as the test
    // CA's own): it would load, then fail every handshake that asks for a
    // name.
    let ca = TestCa::new(&dir.path().join("ca"));
    start_fails(&ca.certificate, ca.key(), "names no host");
}

/// A TLS connection to the HTTPS proxy through `openssl s_client`: what is
/// written goes in plaintext to the proxy, what it answers comes back on a
/// channel, and a disconnected channel is the connection's end.
struct TlsPipe {
    child: std::process::Child,
    input: std::process::ChildStdin,
    output: std::sync::mpsc::Receiver<Vec<u8>>,
    read: Vec<u8>,
}

/// `openssl s_client` connected to `address`, trusting `ca`, its stdin and
/// stdout piped: what is written to it goes over TLS, what comes back is on
/// its stdout (and once nobody reads that, it stops reading the connection).
fn s_client(address: std::net::SocketAddr, ca: &str) -> std::process::Child {
    std::process::Command::new("openssl")
        .args(["s_client", "-quiet", "-verify_return_error", "-CAfile", ca])
        .args(["-connect", &address.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("openssl s_client")
}

impl TlsPipe {
    fn connect(address: std::net::SocketAddr, ca: &str) -> Self {
        let mut child = s_client(address, ca);
        let input = child.stdin.take().expect("stdin");
        let mut stdout = child.stdout.take().expect("stdout");
        let (sender, output) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n @ 1..) = stdout.read(&mut chunk) {
                if sender.send(chunk[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            input,
            output,
            read: Vec::new(),
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.input.write_all(bytes).expect("to s_client");
        self.input.flush().expect("to s_client");
    }

    /// The next response: its head, and its body by `Content-Length`.
    fn response(&mut self) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let text = String::from_utf8_lossy(&self.read).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length: usize = head
                    .to_ascii_lowercase()
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length:"))
                    .and_then(|value| value.trim().parse().ok())
                    .unwrap_or(0);
                if body.len() >= length {
                    let used = head.len() + 4 + length;
                    self.read.drain(..used);
                    return head.to_owned();
                }
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let chunk = self
                .output
                .recv_timeout(left)
                .unwrap_or_else(|error| panic!("no whole response ({error}): {text:?}"));
            self.read.extend(chunk);
        }
    }

    /// Whether the proxy ends the connection within 10 s.
    fn ends(&mut self) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.output.recv_timeout(left) {
                Ok(chunk) => self.read.extend(chunk),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return true,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return false,
            }
        }
    }
}

impl Drop for TlsPipe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_failed_login_on_an_https_connection_adopted_at_a_deploy_ends_only_that_connection() {
    // A plane that adopts an HTTPS connection cannot see its customer's
    // address (the connection is one end of a Unix socket pair), so it
    // cannot throttle failed logins on it by address: it ends the
    // connection instead, and other customers' connections carry on.
    let origin = Origin::start();
    let mut node = Node::new("");
    let ca = TestCa::new(&node.path().join("ca"));
    let leaf = ca.leaf("proxy", 30);
    let address = node.enable_https(&leaf.certificate, &leaf.key);
    let (_ingress, mut device, client) = node.start();
    let ca_path = ca.certificate.to_str().expect("path").to_owned();
    let request = |password: &str| {
        let auth = blipless_tests::base64(format!("alice:{password}").as_bytes());
        format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nProxy-Authorization: Basic {auth}\r\n\r\n",
            origin.url("/hello"),
            origin.address
        )
    };
    let (mut guessing, mut other) = (
        TlsPipe::connect(address, &ca_path),
        TlsPipe::connect(address, &ca_path),
    );
    for pipe in [&mut guessing, &mut other] {
        pipe.send(request(&client.secret).as_bytes());
        let head = pipe.response();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    }
    // Both are idle, kept alive, when the deploy moves them.
    let (_new_device, _) = node.deploy(&mut device);
    guessing.send(request("wrong").as_bytes());
    let head = guessing.response();
    assert!(head.starts_with("HTTP/1.1 407"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    assert!(
        guessing.ends(),
        "the connection with the failed login ended"
    );
    for _ in 0..6 {
        other.send(request(&client.secret).as_bytes());
        let head = other.response();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    }
}

#[test]
fn connections_that_never_finish_tls_hold_at_most_limits_tls_handshakes() {
    // Four connections that never start TLS hold the four handshakes the
    // listener runs at once (for as long as proxy.handshake_timeout); a
    // fifth is closed at once, counted, and once one of the four goes, a
    // real client gets its turn.
    let origin = Origin::start();
    let mut node =
        Node::new("[proxy]\nhandshake_timeout = \"60s\"\n\n[limits]\ntls_handshakes = 4\n");
    let ca = TestCa::new(&node.path().join("ca"));
    let leaf = ca.leaf("proxy", 30);
    let address = node.enable_https(&leaf.certificate, &leaf.key);
    let (_ingress, _device, client) = node.start();
    let https = client.https.clone().expect("https URL");
    let ca_path = ca.certificate.to_str().expect("path").to_owned();
    let mut silent: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(address).expect("connect"))
        .collect();
    wait_until(Duration::from_secs(20), "a fifth to be refused", || {
        let mut fifth = TcpStream::connect(address).expect("connect");
        fifth
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        // Closed at once: EOF (or a reset), long before the 60 s timeout.
        let mut byte = [0u8; 1];
        let closed = match fifth.read(&mut byte) {
            Ok(n) => n == 0,
            Err(error) => !matches!(
                error.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        };
        closed && node.metric("blipless_tls_handshakes_total{result=\"refused\"}") >= 1.0
    });
    let output = curl(&[
        "--max-time",
        "10",
        "--proxy-cacert",
        &ca_path,
        "--proxy",
        &https,
        &origin.url("/hello"),
    ]);
    assert!(
        !output.status.success(),
        "a client got through with every handshake taken"
    );
    // One of the four goes: its handshake ends (failed) and its place is free.
    drop(silent.pop());
    wait_until(Duration::from_secs(20), "a client to get through", || {
        status_code(&https, &origin.url("/hello"), &["--proxy-cacert", &ca_path]) == "200"
    });
    drop(silent);
}

#[test]
fn a_customer_that_stops_reading_holds_its_tls_relay_only_for_the_idle_timeout() {
    // openssl s_client whose output nobody reads: once its stdout pipe is
    // full it stops reading the TLS connection, mid-download. The plane's
    // tunnel and the ingress's relay each end after proxy.idle_timeout with
    // no byte moved (the relay used to wait on its write to the customer
    // for ever, unable to see the plane's close).
    let origin = Origin::start();
    let mut node = Node::new("[proxy]\nidle_timeout = \"2s\"\n");
    let ca = TestCa::new(&node.path().join("ca"));
    let leaf = ca.leaf("proxy", 30);
    let address = node.enable_https(&leaf.certificate, &leaf.key);
    let (_ingress, _device, client) = node.start();
    let ca_path = ca.certificate.to_str().expect("path").to_owned();
    let mut stalled = s_client(address, &ca_path);
    let auth = blipless_tests::base64(format!("alice:{}", client.secret).as_bytes());
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nProxy-Authorization: Basic {auth}\r\n\r\n",
        origin.url(&format!("/bytes/{}", 32 << 20)),
        origin.address
    );
    let mut input = stalled.stdin.take().expect("stdin");
    input.write_all(request.as_bytes()).expect("to s_client");
    input.flush().expect("to s_client");
    let relayed = || node.metric("blipless_tls_connections_relayed");
    wait_until(Duration::from_secs(20), "the relay to start", || {
        relayed() == 1.0
    });
    wait_until(
        Duration::from_secs(60),
        "the stalled customer's relay to end",
        || relayed() == 0.0,
    );
    // Others are served as ever.
    let https = client.https.clone().expect("https URL");
    let body = fetch(
        &https,
        &origin.url("/bytes/1000"),
        &["--proxy-cacert", &ca_path],
    );
    assert_eq!(body.len(), 1000);
    let _ = stalled.kill();
    let _ = stalled.wait();
    drop(input);
}

/// A CONNECT tunnel over TLS whose destination finishes sending first: the
/// customer gets the end of the download (a close_notify) and its upload
/// goes on, as through the plain listeners. The relay took the plane's
/// half-close for a close and cut the upload 10 s later.
#[test]
fn a_destination_that_finishes_first_leaves_the_customers_upload_running() {
    let mut node = Node::new("");
    let ca = TestCa::new(&node.path().join("ca"));
    let leaf = ca.leaf("proxy", 30);
    let address = node.enable_https(&leaf.certificate, &leaf.key);
    let (_ingress, _device, client) = node.start();
    // The destination: says "bye", shuts its sending side, and counts what
    // it receives until the customer closes.
    let destination = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let at = destination.local_addr().expect("address");
    let counted = std::thread::spawn(move || {
        let (mut stream, _) = destination.accept().expect("accept");
        stream.write_all(b"bye").expect("bye");
        stream
            .shutdown(std::net::Shutdown::Write)
            .expect("half-close");
        let mut received = Vec::new();
        let _ = stream.read_to_end(&mut received);
        received.len()
    });
    // Python's ssl (OpenSSL) keeps sending after a TLS 1.3 close_notify.
    let script = r#"
import base64, socket, ssl, sys, time
host, port, ca, target, auth = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
context = ssl.create_default_context(cafile=ca)
s = context.wrap_socket(socket.create_connection((host, port)), server_hostname="localhost")
s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n" % (target, target, auth)).encode())
answer = b""
while b"\r\n\r\n" not in answer:
    chunk = s.recv(4096)
    if not chunk:
        sys.exit("no answer to CONNECT")
    answer += chunk
head, _, rest = answer.partition(b"\r\n\r\n")
if b" 200" not in head.split(b"\r\n")[0]:
    sys.exit("CONNECT refused: %r" % head)
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    rest += chunk
print("downloaded", rest.decode(), flush=True)
sent = 0
for _ in range(14):
    s.sendall(b"x" * 1000)
    sent += 1000
    time.sleep(1)
print("uploaded", sent, flush=True)
s.close()
"#;
    let script_path = node.path().join("half_close.py");
    std::fs::write(&script_path, script).expect("script");
    let auth = blipless_tests::base64(format!("alice:{}", client.secret).as_bytes());
    let output = std::process::Command::new("/usr/bin/python3")
        .arg(&script_path)
        .args([
            "127.0.0.1",
            &address.port().to_string(),
            ca.certificate.to_str().expect("path"),
            &at.to_string(),
            &auth,
        ])
        .output()
        .expect("python3");
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(said.contains("downloaded bye"), "{said}");
    assert!(said.contains("uploaded 14000"), "{said}");
    let received = counted.join().expect("the destination");
    assert_eq!(received, 14_000, "the upload after the destination's end");
}

/// A customer that never closes, after a request the plane answers and
/// closes (a malformed one: 400): the plane shuts its sending side, reads
/// for a moment, then closes its end; the relay sees that close and gives
/// the customer 10 s, not `proxy.idle_timeout`. It looked once, at the
/// half-close, and then waited for the customer for up to 15 minutes.
#[test]
fn a_customer_that_never_closes_after_the_planes_close_holds_its_relay_only_briefly() {
    let mut node = Node::new("");
    let ca = TestCa::new(&node.path().join("ca"));
    let leaf = ca.leaf("proxy", 30);
    let address = node.enable_https(&leaf.certificate, &leaf.key);
    let (_ingress, _device, _client) = node.start();
    // Python's ssl (OpenSSL): reads the answer to its end, then holds the
    // connection open, saying nothing.
    let script = r#"
import socket, ssl, sys, time
host, port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
context = ssl.create_default_context(cafile=ca)
s = context.wrap_socket(socket.create_connection((host, port)), server_hostname="localhost")
s.sendall(b"X\r\n\r\n")
answer = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    answer += chunk
print("answered", answer.split(b"\r\n")[0].decode(), flush=True)
time.sleep(600)
"#;
    let script_path = node.path().join("never_closes.py");
    std::fs::write(&script_path, script).expect("script");
    let mut holder = std::process::Command::new("/usr/bin/python3")
        .arg(&script_path)
        .args([
            "127.0.0.1",
            &address.port().to_string(),
            ca.certificate.to_str().expect("path"),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the script's line");
    let relayed = || node.metric("blipless_tls_connections_relayed");
    let deadline = std::time::Instant::now() + Duration::from_secs(45);
    let ended = loop {
        if relayed() == 0.0 {
            break true;
        }
        if std::time::Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(line.starts_with("answered HTTP/1.1 400"), "{line:?}");
    assert!(
        ended,
        "the relay of a customer that never closes outlived the plane's close by 45 s"
    );
}
