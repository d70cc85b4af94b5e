//! The HTTP proxy's hygiene and limits (issue 14), each the exact scenario
//! of its finding: `Host` from the absolute URI, userinfo refused unresolved
//! and unlogged, `timeouts.response` (504), `timeouts.body_idle` (408 or a
//! cut), `limits.header_bytes` (431), and a drain that does not wait the
//! grace for a silent origin. Clients are raw sockets, for exact status
//! codes and exact bytes; origins are raw too, to be silent on purpose.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blipless_tests::node::{ClientUrls, Node};
use blipless_tests::{raw, wait_until};

/// What a test origin does once it has read a request head.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// `200 OK`, body "ok", then close.
    Ok,
    /// Nothing, ever: it reads (and drops) what comes until the peer closes.
    Silent,
    /// A head promising 1000 bytes, 10 of them, then silence.
    StallBody,
    /// `200 OK` with more header fields than hyper's parser takes (100).
    ManyHeaders,
    /// A head promising [`BIG_BODY`] bytes, then all of them as fast as the
    /// proxy takes them.
    Big,
}

/// The body of [`Answer::Big`]: far more than any socket buffers hold.
const BIG_BODY: usize = 64 << 20;

/// A raw origin on loopback that records request heads and counts the
/// connections it holds open (one ends when the proxy closes its side).
struct RawOrigin {
    address: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
}

impl RawOrigin {
    fn start(answer: Answer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("origin listener");
        let address = listener.local_addr().expect("origin address");
        let heads = Arc::new(Mutex::new(Vec::new()));
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let (h, a, o) = (heads.clone(), accepted.clone(), open.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                a.fetch_add(1, Ordering::SeqCst);
                o.fetch_add(1, Ordering::SeqCst);
                let (heads, open) = (h.clone(), o.clone());
                std::thread::spawn(move || {
                    serve_origin(stream, answer, &heads);
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Self {
            address,
            heads,
            accepted,
            open,
        }
    }

    fn port(&self) -> u16 {
        self.address.port()
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().expect("heads").clone()
    }

    /// Waits until the proxy has closed every connection to this origin.
    fn wait_released(&self) {
        wait_until(
            Duration::from_secs(15),
            "the origin socket to close",
            || self.open.load(Ordering::SeqCst) == 0,
        );
    }
}

fn serve_origin(mut stream: TcpStream, answer: Answer, heads: &Mutex<Vec<String>>) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    heads
        .lock()
        .expect("heads")
        .push(String::from_utf8_lossy(&head).into_owned());
    let _ = match answer {
        Answer::Ok => {
            stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        }
        Answer::Silent => Ok(()),
        Answer::StallBody => {
            stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789")
        }
        Answer::ManyHeaders => {
            let fields: String = (0..101).map(|i| format!("X-F{i}: v\r\n")).collect();
            stream.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\n{fields}Content-Length: 2\r\nConnection: close\r\n\r\nok"
                )
                .as_bytes(),
            )
        }
        Answer::Big => {
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {BIG_BODY}\r\n\r\n");
            let chunk = vec![b'x'; 64 << 10];
            let mut result = stream.write_all(head.as_bytes());
            for _ in 0..BIG_BODY / chunk.len() {
                if result.is_err() {
                    break;
                }
                result = stream.write_all(&chunk);
            }
            // Cut by the proxy, or all written: either way, done.
            return;
        }
    };
    if matches!(answer, Answer::Ok | Answer::ManyHeaders) {
        return;
    }
    // Hold the connection until the proxy closes it.
    let mut sink = [0u8; 4096];
    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
}

fn auth(client: &ClientUrls) -> String {
    let credentials = format!("{}:{}", client.name, client.secret);
    format!(
        "Proxy-Authorization: Basic {}\r\n",
        blipless_tests::base64(credentials.as_bytes())
    )
}

/// Everything the proxy sends until it closes (true) or goes quiet for the
/// read timeout, 20 s (false). A reset after the answer counts as a close.
fn read_answer(stream: &mut TcpStream) -> (String, bool) {
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    let closed = loop {
        match stream.read(&mut chunk) {
            Ok(0) => break true,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                break false
            }
            Err(_) => break true,
        }
    };
    (String::from_utf8_lossy(&answer).into_owned(), closed)
}

/// A connection to the node's HTTP proxy that has sent `client`'s
/// absolute-form GET of `origin`'s `/`.
fn get_from(node: &Node, client: &ClientUrls, origin: &RawOrigin) -> TcpStream {
    let mut stream = raw::connect(node.http);
    write!(
        stream,
        "GET http://127.0.0.1:{}/ HTTP/1.1\r\nHost: x\r\n{}\r\n",
        origin.port(),
        auth(client)
    )
    .expect("request");
    stream
}

fn open_connections(node: &Node) -> u64 {
    node.status_json()["device_planes"][0]["connections_open"]
        .as_u64()
        .unwrap_or(u64::MAX)
}

#[test]
fn absolute_form_requests_carry_the_targets_host() {
    let origin = RawOrigin::start(Answer::Ok);
    let mut node = Node::new("");
    let (_ingress, _device, client) = node.start();
    let port = origin.port();
    let mut stream = raw::connect(node.http);
    write!(
        stream,
        "GET http://127.0.0.1:{port}/path?q=1 HTTP/1.1\r\nHost: evil.example\r\nhost: evil.example:8080\r\n{}Connection: close\r\n\r\n",
        auth(&client)
    )
    .expect("request");
    let (answer, _) = read_answer(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let heads = origin.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
    let head = heads[0].to_ascii_lowercase();
    assert!(head.starts_with("get /path?q=1 http/1.1\r\n"), "{head}");
    let hosts: Vec<&str> = head.lines().filter(|l| l.starts_with("host:")).collect();
    assert_eq!(hosts, [format!("host: 127.0.0.1:{port}")], "{head}");
    assert!(!head.contains("evil.example"), "{head}");
    assert!(!head.contains("proxy-authorization"), "{head}");
}

#[test]
fn a_target_with_userinfo_is_refused_unresolved_and_unlogged() {
    let origin = RawOrigin::start(Answer::Ok);
    let mut node = Node::new("");
    let (_ingress, device, client) = node.start();
    let port = origin.port();
    let password = "hunter2pw";
    for request_line in [
        format!("GET http://u:{password}@127.0.0.1:{port}/ HTTP/1.1"),
        format!("GET http://{password}@127.0.0.1:{port}/x HTTP/1.1"),
        format!("CONNECT u:{password}@127.0.0.1:{port} HTTP/1.1"),
        format!("GET http://u:{password}@localhost/ HTTP/1.1"),
    ] {
        let mut stream = raw::connect(node.http);
        write!(
            stream,
            "{request_line}\r\nHost: 127.0.0.1\r\n{}Connection: close\r\n\r\n",
            auth(&client)
        )
        .expect("request");
        let (answer, _) = read_answer(&mut stream);
        assert!(
            answer.starts_with("HTTP/1.1 400"),
            "{request_line}: {answer}"
        );
    }
    // The same requests without userinfo do reach the origin.
    let mut stream = raw::connect(node.http);
    write!(
        stream,
        "GET http://127.0.0.1:{port}/ HTTP/1.1\r\n{}Connection: close\r\n\r\n",
        auth(&client)
    )
    .expect("request");
    assert!(read_answer(&mut stream).0.starts_with("HTTP/1.1 200"));
    assert_eq!(
        origin.accepted.load(Ordering::SeqCst),
        1,
        "only the clean request connected"
    );
    let log = device.log_text();
    assert!(
        !log.contains(password),
        "the password is in the log:\n{log}"
    );
}

#[test]
fn a_silent_origin_gets_504_and_both_sockets_are_released() {
    let origin = RawOrigin::start(Answer::Silent);
    let mut node = Node::new("[timeouts]\nresponse = \"1s\"\n");
    let (_ingress, _device, client) = node.start();
    let mut stream = get_from(&node, &client, &origin);
    let (answer, closed) = read_answer(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 504"), "{answer:?}");
    assert!(closed, "the client connection is closed after the 504");
    assert_eq!(origin.accepted.load(Ordering::SeqCst), 1);
    origin.wait_released();
    drop(stream);
    wait_until(
        Duration::from_secs(15),
        "the plane to hold no connection",
        || open_connections(&node) == 0,
    );
}

#[test]
fn a_trickled_request_body_is_cut_at_the_body_timeout() {
    let origin = RawOrigin::start(Answer::Silent);
    let mut node = Node::new("[timeouts]\nbody_idle = \"2s\"\n");
    let (_ingress, _device, client) = node.start();
    let mut stream = raw::connect(node.http);
    write!(
        stream,
        "POST http://127.0.0.1:{}/upload HTTP/1.1\r\nHost: x\r\n{}Content-Length: 1000\r\n\r\n",
        origin.port(),
        auth(&client)
    )
    .expect("request head");
    // One byte a second, for longer than the timeout (and the read timeout).
    let mut writer = stream.try_clone().expect("clone");
    let trickle = std::thread::spawn(move || {
        for _ in 0..40 {
            if writer.write_all(b"x").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    let (answer, closed) = read_answer(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(closed, "the client connection is closed after the 408");
    origin.wait_released();
    drop(stream);
    let _ = trickle.join();
}

#[test]
fn a_response_body_that_stops_is_cut_at_the_body_timeout() {
    let origin = RawOrigin::start(Answer::StallBody);
    let mut node = Node::new("[timeouts]\nbody_idle = \"2s\"\n");
    let (_ingress, _device, client) = node.start();
    let mut stream = get_from(&node, &client, &origin);
    let (answer, closed) = read_answer(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(answer.ends_with("\r\n\r\n0123456789"), "{answer:?}");
    assert!(closed, "the connection is cut when the body stops");
    origin.wait_released();
}

/// A client reading a download slowly but steadily (about 80 KB/s, 8 KiB
/// every 100 ms) is not cut by `body_idle` (3 s here). Before, the proxy
/// saw progress only when hyper took the next frame of the origin's body,
/// and hyper took one only once it had written the last (up to 400 KiB)
/// into a client socket whose kernel buffer, autotuned to megabytes, woke
/// it only after half of that drained: the connection was cut within 3 s
/// (with neither fix) or 9 s (with the socket's unsent bytes bounded but
/// whole frames). The origin's socket staying open is what shows the
/// exchange alive (the client's own socket buffers would hide a cut for a
/// while).
#[test]
fn a_slow_but_steady_reader_is_not_cut_at_the_body_timeout() {
    let origin = RawOrigin::start(Answer::Big);
    let mut node = Node::new("[timeouts]\nbody_idle = \"3s\"\n");
    let (_ingress, _device, client) = node.start();
    let mut stream = get_from(&node, &client, &origin);
    reads_slowly_while_the_origin_stays(&mut stream, &origin);
}

/// Reads `download` 8 KiB every 100 ms for 12 s, requiring that the proxy
/// keeps `origin`'s socket open all along (the exchange is not cut).
fn reads_slowly_while_the_origin_stays(download: &mut impl Read, origin: &RawOrigin) {
    let mut chunk = vec![0u8; 8 << 10];
    let mut received = 0usize;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(12) {
        match download.read(&mut chunk) {
            Ok(0) => panic!("closed after {received} bytes"),
            Ok(n) => received += n,
            Err(error) => panic!("{error} after {received} bytes"),
        }
        assert_eq!(
            origin.open.load(Ordering::SeqCst),
            1,
            "the origin's socket was closed after {:?} ({received} bytes read)",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(received > 10_000, "only {received} bytes in 12 s");
}

/// hyper's parser takes at most 100 header fields (docs/CONFIG.md,
/// `limits.header_bytes`): a request with more gets 431, an origin's answer
/// with more gets the client a 502.
#[test]
fn more_than_100_header_fields_get_431_or_502() {
    let origin = RawOrigin::start(Answer::ManyHeaders);
    let mut node = Node::new("");
    let (_ingress, _device, client) = node.start();
    let fields: String = (0..101).map(|i| format!("X-F{i}: v\r\n")).collect();
    let mut stream = raw::connect(node.http);
    write!(
        stream,
        "GET http://127.0.0.1:{}/ HTTP/1.1\r\nHost: x\r\n{}{fields}\r\n",
        origin.port(),
        auth(&client)
    )
    .expect("request");
    let (answer, closed) = read_answer(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    assert!(closed, "the connection is closed after the 431");
    let mut stream = get_from(&node, &client, &origin);
    let status = raw::read_exact(&mut stream, 12);
    assert_eq!(
        status,
        b"HTTP/1.1 502",
        "{}",
        String::from_utf8_lossy(&status)
    );
}

#[test]
fn an_oversized_request_head_gets_431_and_a_close() {
    let mut node = Node::new("");
    let (_ingress, _device, _client) = node.start();
    let head = |pad: usize| {
        format!(
            "GET http://127.0.0.1:1/ HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(pad)
        )
    };
    // 100 KiB, unauthenticated: refused before it is all read.
    let mut stream = raw::connect(node.http);
    let mut writer = stream.try_clone().expect("clone");
    let big = head(100 * 1024);
    let sender = std::thread::spawn(move || {
        let _ = writer.write_all(big.as_bytes());
    });
    let (answer, closed) = read_answer(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    assert!(closed, "the connection is closed after the 431");
    let _ = sender.join();
    // A head under the default limit (32 KiB) is read and answered.
    let mut stream = raw::connect(node.http);
    stream
        .write_all(head(20 * 1024).as_bytes())
        .expect("request");
    let (answer, _) = read_answer(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 407"), "{answer:?}");
    // Counted, in /metrics.
    blipless_tests::wait_until(Duration::from_secs(10), "the 431 in /metrics", || {
        node.metric("blipless_http_refused_total{reason=\"head_too_large\"}") >= 1.0
    });
}

#[test]
fn a_drain_does_not_wait_the_grace_for_a_silent_origin() {
    let origin = RawOrigin::start(Answer::Silent);
    let mut node = Node::new("[timeouts]\nresponse = \"2s\"\n\n[drain]\ngrace = \"60s\"\n");
    let (_ingress, mut device, client) = node.start();
    let mut stream = get_from(&node, &client, &origin);
    wait_until(
        Duration::from_secs(10),
        "the forward to reach the origin",
        || origin.accepted.load(Ordering::SeqCst) == 1,
    );
    // A deploy: the old plane cannot hand over a request in flight.
    let _successor = node.start_device();
    let status = device
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| {
            panic!(
                "the old plane still runs 30 s into a 60 s grace:\n{}",
                device.log_text()
            )
        });
    assert!(status.success(), "the old plane exited with {status}");
    let (answer, _) = read_answer(&mut stream);
    assert!(answer.starts_with("HTTP/1.1 504"), "{answer:?}");
    origin.wait_released();
}

/// A connection on which no request authenticates is closed once
/// `proxy.handshake_timeout` has passed, however many requests it sends
/// (each gets its 407), as a SOCKS5 one is: an unknown client cannot hold a
/// slot until the idle timeout. One that authenticated stays open past it.
#[test]
fn a_connection_that_never_authenticates_is_closed_at_the_handshake_timeout() {
    let origin = RawOrigin::start(Answer::Ok);
    let mut node = Node::new("[proxy]\nhandshake_timeout = \"2s\"\n");
    let (_ingress, _device, client) = node.start();
    let mut stream = raw::connect(node.http);
    stream
        .set_read_timeout(Some(Duration::from_secs(1)))
        .expect("read timeout");
    let mut writer = stream.try_clone().expect("clone");
    // A head without credentials every half second, for up to 20 s.
    let sender = std::thread::spawn(move || {
        for _ in 0..40 {
            let head = b"GET http://127.0.0.1:1/ HTTP/1.1\r\nHost: x\r\n\r\n";
            if writer.write_all(head).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    let started = std::time::Instant::now();
    let mut answers = Vec::new();
    let mut chunk = [0u8; 4096];
    let closed = loop {
        if started.elapsed() > Duration::from_secs(20) {
            break false;
        }
        match stream.read(&mut chunk) {
            Ok(0) => break true,
            Ok(n) => answers.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break true,
        }
    };
    let answers = String::from_utf8_lossy(&answers).into_owned();
    assert!(
        closed,
        "still open after {:?} of unauthenticated requests: {} answers",
        started.elapsed(),
        answers.matches("HTTP/1.1 407").count()
    );
    assert!(answers.starts_with("HTTP/1.1 407"), "{answers}");
    let _ = sender.join();

    // Authenticated, the connection outlives the handshake timeout (its
    // requests 1.2 s apart: hyper closes a keep-alive connection idle for
    // the handshake timeout, as it reads the next head under it).
    let port = origin.port();
    let mut stream = raw::connect(node.http);
    let request = format!(
        "GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: x\r\n{}\r\n",
        auth(&client)
    );
    for round in 0..3 {
        stream.write_all(request.as_bytes()).expect("request");
        let mut answer = Vec::new();
        while !answer.ends_with(b"ok") {
            let read = stream.read(&mut chunk).expect("an answer");
            assert!(read > 0, "closed in round {round}");
            answer.extend_from_slice(&chunk[..read]);
        }
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "round {round}: {answer}"
        );
        std::thread::sleep(Duration::from_millis(1200));
    }
}

/// What a plane counts just before it stops still reaches the ingress's
/// counters: its last report goes before its `Drained`. The requests come
/// right after a report, so the next once-a-second report would come only
/// after the plane is gone.
#[test]
fn what_a_plane_counts_just_before_it_stops_is_reported() {
    const SERIES: &str = "blipless_http_refused_total{reason=\"userinfo\"}";
    let mut node = Node::new("");
    let (_ingress, mut device, client) = node.start();
    let refuse_one = || {
        let mut stream = raw::connect(node.http);
        write!(
            stream,
            "GET http://u:p@127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1\r\n{}Connection: close\r\n\r\n",
            auth(&client)
        )
        .expect("request");
        let (answer, _) = read_answer(&mut stream);
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    };
    refuse_one();
    // Polled every few milliseconds: it shows 1 right after a report.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while node.metric(SERIES) < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the first refusal was never reported"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    for _ in 0..3 {
        refuse_one();
    }
    device.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(
        device.wait_exit(Duration::from_secs(30)).is_some(),
        "the plane stops"
    );
    // The ingress reads the last report on its own time: given a moment,
    // then held a while longer, so that a count made twice would show.
    wait_until(Duration::from_secs(5), "every refusal counted", || {
        node.metric(SERIES) >= 4.0
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(node.metric(SERIES), 4.0, "every refusal counted once");
}

/// The same slow but steady reader through the HTTPS proxy (`openssl
/// s_client`, whose output is read 8 KiB every 100 ms): its socket belongs
/// to the ingress's TLS relay, which must wake per window step too, and the
/// Unix socket pair between the relay and the device plane must not hide
/// the client's reading from the plane for longer than `body_idle`.
#[test]
fn a_slow_but_steady_reader_through_the_https_proxy_is_not_cut_at_the_body_timeout() {
    let origin = RawOrigin::start(Answer::Big);
    let mut node = Node::new("[timeouts]\nbody_idle = \"3s\"\n");
    let ca = blipless_tests::tls::TestCa::new(&node.path().join("ca"));
    let leaf = ca.leaf("proxy", 30);
    let address = node.enable_https(&leaf.certificate, &leaf.key);
    let (_ingress, _device, client) = node.start();
    let mut s_client = std::process::Command::new("openssl")
        .args(["s_client", "-quiet", "-verify_return_error", "-CAfile"])
        .arg(&ca.certificate)
        .args(["-connect", &address.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("openssl s_client");
    let mut input = s_client.stdin.take().expect("stdin");
    let mut output = s_client.stdout.take().expect("stdout");
    write!(
        input,
        "GET http://127.0.0.1:{}/ HTTP/1.1\r\nHost: x\r\n{}\r\n",
        origin.port(),
        auth(&client)
    )
    .expect("request");
    input.flush().expect("request");
    reads_slowly_while_the_origin_stays(&mut output, &origin);
    let _ = s_client.kill();
    let _ = s_client.wait();
    drop(input);
}
