//! The HTTP proxy as an intermediary between a client and an origin that
//! each do something legal but unusual: a client uploading a body the proxy
//! refuses before reading it, a client that shuts its side down once its
//! request is sent, an origin answering with both framings, an HTTP/1.0
//! origin behind a keep-alive client. Clients are curl where curl can do
//! it, raw sockets where the exact bytes matter; origins are raw, to answer
//! exactly so.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use blipless_tests::curl::curl;
use blipless_tests::node::{ClientUrls, Node};
use blipless_tests::raw;

/// A raw origin that answers each request head it reads with `answer`,
/// after `delay`, then closes when `close` (else it reads the next head).
fn origin(answer: &'static [u8], delay: Duration, close: bool) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("origin listener");
    let address = listener.local_addr().expect("origin address");
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            std::thread::spawn(move || loop {
                if read_head(&mut stream).is_none() {
                    return;
                }
                std::thread::sleep(delay);
                if stream.write_all(answer).is_err() || close {
                    return;
                }
            });
        }
    });
    address
}

/// One request or response head, up to its blank line; None at the end.
fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

fn auth(client: &ClientUrls) -> String {
    let credentials = format!("{}:{}", client.name, client.secret);
    format!(
        "Proxy-Authorization: Basic {}\r\n",
        blipless_tests::base64(credentials.as_bytes())
    )
}

fn connect(node: &Node) -> TcpStream {
    let stream = raw::connect(node.http);
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("read timeout");
    stream
}

/// Sends `request` on a new connection to the HTTP proxy, shuts the
/// sending side down if `half_close`, and reads everything until the proxy
/// ends the connection.
fn ask(node: &Node, request: &str, half_close: bool) -> String {
    let mut stream = connect(node);
    stream.write_all(request.as_bytes()).expect("request");
    if half_close {
        stream.shutdown(Shutdown::Write).expect("half-close");
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

/// An upload the proxy answers before reading its body (no credentials:
/// 407) gets its answer and a clean end: the proxy shuts its side down and
/// reads and drops the rest for a moment before it closes (RFC 9112 §9.6).
/// A plain close would answer the upload's next bytes with a reset, which
/// on a real network can overtake the answer and discard it at the client.
/// (Over loopback the answer is always in the client's buffer before the
/// reset, so what the test tells apart is what the client's next writes
/// meet: a proxy still reading, or a reset.) curl, uploading 8 MiB, sees the
/// 407 too.
#[test]
fn an_upload_refused_before_its_body_is_read_gets_its_answer_and_a_clean_end() {
    let target = origin(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        Duration::ZERO,
        true,
    );
    let mut node = Node::new("");
    let (_ingress, _device, _client) = node.start();
    for round in 0..3 {
        let mut stream = connect(&node);
        write!(
            stream,
            "POST http://{target}/upload HTTP/1.1\r\nHost: {target}\r\nContent-Length: 1048576\r\n\r\n"
        )
        .expect("request head");
        stream
            .write_all(&[b'x'; 64 * 1024])
            .expect("part of the body");
        let mut answer = Vec::new();
        let ended = loop {
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk) {
                Ok(0) => break Ok(()),
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
                Err(error) => break Err(error),
            }
        };
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 407"),
            "round {round}: {answer:?}"
        );
        assert!(
            ended.is_ok(),
            "round {round}: the proxy ended the connection with {ended:?}, not a FIN"
        );
        // The client, still uploading, sends on; a reset would fail the
        // write after the one that met it.
        let more = [b'y'; 64 * 1024];
        let first = stream.write_all(&more);
        std::thread::sleep(Duration::from_millis(300));
        let second = stream.write_all(&more);
        assert!(
            first.is_ok() && second.is_ok(),
            "round {round}: the rest of the upload met a reset ({first:?}, {second:?})"
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let upload = dir.path().join("upload.bin");
    std::fs::write(&upload, vec![b'x'; 8 << 20]).expect("write the upload");
    let proxy = format!("http://{}", node.http);
    let url = format!("http://{target}/upload");
    let data = format!("@{}", upload.display());
    let output = curl(&[
        "--max-time",
        "60",
        "--proxy",
        &proxy,
        "-H",
        "Expect:",
        "--data-binary",
        &data,
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &url,
    ]);
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "407",
        "curl saw the 407 (exit {:?}, stderr {})",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A client that shuts its sending side down once its request is out (`nc
/// -N` does, and an HTTPS client's close_notify becomes this) still gets the
/// answer, for a forwarded request and for a CONNECT.
#[test]
fn a_client_that_half_closes_after_its_request_still_gets_the_answer() {
    let target = origin(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
        Duration::from_millis(300),
        true,
    );
    let mut node = Node::new("");
    let (_ingress, _device, client) = node.start();
    let answer = ask(
        &node,
        &format!(
            "GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n{}\r\n",
            auth(&client)
        ),
        true,
    );
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello"),
        "{answer:?}"
    );
    // CONNECT, then a request through the tunnel, then the half-close.
    let answer = ask(
        &node,
        &format!(
            "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{}\r\nGET / HTTP/1.1\r\nHost: {target}\r\n\r\n",
            auth(&client)
        ),
        true,
    );
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello"),
        "{answer:?}"
    );
}

/// An origin that sends both Content-Length and chunked framing (some
/// application servers do) is read as chunked, as RFC 9112 §6.3 says, and
/// its answer reaches the client without the Content-Length, rather than
/// not at all.
#[test]
fn an_answer_with_both_framings_reaches_the_client() {
    let target = origin(
        b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        Duration::ZERO,
        true,
    );
    let mut node = Node::new("");
    let (_ingress, _device, client) = node.start();
    let body = blipless_tests::curl::fetch(&client.http, &format!("http://{target}/"), &[]);
    assert_eq!(body, b"hello world");
}

/// Two answers an origin should not send: both framings with
/// Transfer-Encoding named in Connection (the stale Content-Length used to
/// survive the hop-by-hop stripping and cut the body to its 5 bytes), and a
/// 101 to a request whose Upgrade the proxy stripped (passed on, it ended
/// the client's connection as a switch it never asked for): the first
/// reaches the client whole, the second is a 502. A WebSocket upgrade in
/// absolute form is not forwarded at all: 501, saying to use CONNECT.
#[test]
fn stale_framing_named_in_connection_and_an_unasked_101_are_handled() {
    let both = origin(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nConnection: transfer-encoding\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        Duration::ZERO,
        true,
    );
    let switching = origin(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        Duration::ZERO,
        true,
    );
    let mut node = Node::new("");
    let (_ingress, _device, client) = node.start();
    let body = blipless_tests::curl::fetch(&client.http, &format!("http://{both}/"), &[]);
    assert_eq!(body, b"hello world");
    // An upgrade the client may do without (h2c): stripped, and the
    // origin's 101 all the same is its mistake.
    let answer = ask(
        &node,
        &format!(
            "GET http://{switching}/chat HTTP/1.1\r\nHost: {switching}\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n{}\r\n",
            auth(&client)
        ),
        false,
    );
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer:?}");
    // A WebSocket in absolute form is refused clearly, not passed on as a
    // plain GET whose answer says nothing of the proxy: curl's own request.
    let output = curl(&[
        "--max-time",
        "30",
        "--proxy",
        &client.http,
        "-H",
        "Connection: Upgrade",
        "-H",
        "Upgrade: websocket",
        "-H",
        "Sec-WebSocket-Version: 13",
        "-H",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "-w",
        "%{http_code}",
        &format!("http://{switching}/chat"),
    ]);
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        said.contains("use CONNECT") && said.ends_with("501"),
        "{said}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// An HTTP/1.0 origin's answer goes to an HTTP/1.1 client as an HTTP/1.1
/// answer, and the client's connection stays open for its next request.
#[test]
fn an_http10_origin_does_not_end_a_keep_alive_clients_connection() {
    let target = origin(
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
        Duration::ZERO,
        true,
    );
    let mut node = Node::new("");
    let (_ingress, _device, client) = node.start();
    let mut stream = connect(&node);
    for round in 0..2 {
        write!(
            stream,
            "GET http://{target}/{round} HTTP/1.1\r\nHost: {target}\r\n{}\r\n",
            auth(&client)
        )
        .expect("request");
        let head =
            read_head(&mut stream).unwrap_or_else(|| panic!("round {round}: the connection ended"));
        assert!(head.starts_with("HTTP/1.1 200"), "round {round}: {head:?}");
        assert!(
            !head.to_ascii_lowercase().contains("connection: close"),
            "round {round}: {head:?}"
        );
        assert_eq!(raw::read_exact(&mut stream, 2), b"ok", "round {round}");
    }
}

/// A request whose own body is broken (a chunk size that is not a number)
/// gets 400 and a close: the client's fault, not a 502 blamed on the origin.
#[test]
fn a_request_body_the_client_garbled_gets_400_not_502() {
    let target = origin(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        Duration::from_secs(3),
        true,
    );
    let mut node = Node::new("");
    let (_ingress, device, client) = node.start();
    let answer = ask(
        &node,
        &format!(
            "POST http://{target}/ HTTP/1.1\r\nHost: {target}\r\n{}Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n",
            auth(&client)
        ),
        false,
    );
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    assert!(
        !device.log_text().contains("origin failed mid-request"),
        "the origin was blamed:\n{}",
        device.log_text()
    );
}

/// A client that sends request after request and reads none of the answers
/// (407s here: no credentials needed) leaves the plane's writes waiting;
/// with no byte moved either way for proxy.idle_timeout the plane cuts the
/// connection, as it cuts an idle tunnel. It used to hold it (a descriptor
/// and a task) for ever.
#[test]
fn a_client_that_never_reads_its_answers_is_cut_after_the_idle_timeout() {
    let mut node = Node::new("[proxy]\nidle_timeout = \"2s\"\n");
    let (_ingress, _device, _client) = node.start();
    let mut stream = connect(&node);
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let request = b"GET http://192.0.2.1/ HTTP/1.1\r\nHost: 192.0.2.1\r\n\r\n".repeat(64);
        // Until the buffers both ways are full and the write waits, then
        // until the proxy ends the connection under it.
        let end = loop {
            if let Err(error) = stream.write_all(&request) {
                break error;
            }
        };
        let _ = done.send(end.kind());
    });
    let end = ended
        .recv_timeout(Duration::from_secs(60))
        .expect("the proxy cut the connection whose client never reads");
    assert!(
        matches!(
            end,
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        "{end:?}"
    );
}

/// A deploy while a request is in flight: the old plane lets the exchange
/// end with the connection kept alive, then hands it over between
/// requests, so a keep-alive client gets no `Connection: close` and its next
/// request on the same connection is served (by the new plane). A client
/// that asked for `Connection: close` gets its answer and then the close,
/// from the old plane: handed over as if idle, it waited on a connection
/// nobody would answer or end until the new plane's header timeout (two
/// minutes here).
#[test]
fn a_request_in_flight_at_a_deploy_ends_as_its_client_asked() {
    let slow = origin(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        Duration::from_secs(3),
        false,
    );
    let fast = origin(
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext",
        Duration::ZERO,
        false,
    );
    let mut node = Node::new("[proxy]\nhandshake_timeout = \"120s\"\nidle_timeout = \"120s\"\n");
    let (_ingress, mut device, client) = node.start();
    let request = |connection: &str, target: SocketAddr| {
        format!(
            "GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n{}{connection}\r\n",
            auth(&client)
        )
    };
    let mut kept = connect(&node);
    kept.write_all(request("", slow).as_bytes())
        .expect("request");
    let mut closing = connect(&node);
    closing
        .write_all(request("Connection: close\r\n", slow).as_bytes())
        .expect("request");
    let second = request("", fast);
    let kept_client = std::thread::spawn(move || {
        let head = read_head(&mut kept).expect("the first answer's head");
        let mut body = [0u8; 5];
        kept.read_exact(&mut body).expect("the first answer's body");
        kept.write_all(second.as_bytes()).expect("second request");
        let second_head = read_head(&mut kept).expect("the second answer's head");
        let mut second_body = [0u8; 4];
        kept.read_exact(&mut second_body)
            .expect("the second answer's body");
        (head, body, second_head, second_body)
    });
    let closing_client = std::thread::spawn(move || {
        let mut answer = Vec::new();
        let end = closing.read_to_end(&mut answer);
        (
            end.map_err(|error| error.kind()),
            String::from_utf8_lossy(&answer).into_owned(),
        )
    });
    // Both requests are with the slow origin when the deploy starts.
    std::thread::sleep(Duration::from_millis(1000));
    let (_new, _) = node.deploy(&mut device);
    let (head, body, second_head, second_body) = kept_client.join().expect("kept client");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        !head.to_ascii_lowercase().contains("connection: close"),
        "a kept-alive client was told to close: {head}"
    );
    assert_eq!(&body, b"hello");
    assert!(second_head.starts_with("HTTP/1.1 200"), "{second_head}");
    assert_eq!(&second_body, b"next");
    let (end, answer) = closing_client.join().expect("closing client");
    assert_eq!(end, Ok(answer.len()), "the close came: {answer}");
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello"),
        "{answer}"
    );
}

/// Trailer fields cross the proxy both ways when the client asks for them
/// (`TE: trailers`) and `Trailer` names them: a chunked upload's reach the
/// origin, which is told `TE: trailers` (not the client's other codings),
/// and a chunked answer's reach the client. Before, `Trailer` was stripped as
/// hop-by-hop and hyper, which writes only the fields it names, wrote none.
#[test]
fn trailer_fields_cross_the_proxy_both_ways() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("origin listener");
    let target = listener.local_addr().expect("origin address");
    let (seen_tx, seen_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else {
            return;
        };
        let head = read_head(&mut stream).unwrap_or_default();
        // The chunked body up to the blank line that ends its trailer section.
        let body = read_head(&mut stream).unwrap_or_default();
        let _ = seen_tx.send((head, body));
        let _ = stream.write_all(
            b"HTTP/1.1 200 OK\r\nTrailer: x-down\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nx-down: 2\r\n\r\n",
        );
    });
    let mut node = Node::new("");
    let (_ingress, _device, client) = node.start();
    let answer = ask(
        &node,
        &format!(
            "POST http://{target}/up HTTP/1.1\r\nHost: {target}\r\n{}TE: gzip, trailers\r\nTrailer: x-up\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nworld\r\n0\r\nx-up: 1\r\n\r\n",
            auth(&client)
        ),
        false,
    );
    let (head, body) = seen_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the origin got the request");
    let head = head.to_ascii_lowercase();
    assert!(head.contains("\r\nte: trailers\r\n"), "{head}");
    assert!(head.contains("\r\ntrailer: x-up\r\n"), "{head}");
    assert!(body.ends_with("0\r\nx-up: 1\r\n\r\n"), "{body:?}");
    let lower = answer.to_ascii_lowercase();
    assert!(lower.starts_with("http/1.1 200"), "{answer}");
    assert!(lower.contains("\r\ntrailer: x-down\r\n"), "{answer}");
    assert!(lower.ends_with("0\r\nx-down: 2\r\n\r\n"), "{answer:?}");
}

/// An origin that sends a close-delimited answer (HTTP/1.0, no length) in
/// part, then resets (`reset`) or goes silent past `timeouts.body_idle`.
fn origin_cutting_its_answer(reset: bool) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("origin listener");
    let target = listener.local_addr().expect("origin address");
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                if read_head(&mut stream).is_none() {
                    return;
                }
                let mut answer = b"HTTP/1.0 200 OK\r\n\r\n".to_vec();
                answer.extend(std::iter::repeat_n(b'x', 5000));
                let _ = stream.write_all(&answer);
                if !reset {
                    std::thread::sleep(Duration::from_secs(10));
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
                // A zero linger makes the close a reset.
                let _ = nix::sys::socket::setsockopt(
                    &stream,
                    nix::sys::socket::sockopt::Linger,
                    &nix::libc::linger {
                        l_onoff: 1,
                        l_linger: 0,
                    },
                );
            });
        }
    });
    target
}

/// An answer cut short, by its origin's reset or by the proxy when the
/// origin goes silent (`timeouts.body_idle`): the client must learn it got
/// less than the whole, not take the end of the connection for the
/// answer's. curl as an HTTP/1.0 client (its answer is close-delimited
/// too: before, it exited 0 with a truncated file) and as an HTTP/1.1 one
/// (chunked: the last chunk never comes) both fail the transfer.
#[test]
fn an_answer_cut_short_is_not_passed_on_as_whole() {
    let mut node = Node::new("[timeouts]\nbody_idle = \"1s\"\n");
    let (_ingress, _device, client) = node.start();
    for (reset, how) in [(true, "the origin's reset"), (false, "a silent origin")] {
        let target = origin_cutting_its_answer(reset);
        for version in ["--http1.0", "--http1.1"] {
            let output = curl(&[
                "--max-time",
                "30",
                version,
                "--proxy",
                &client.http,
                "-o",
                "/dev/null",
                &format!("http://{target}/"),
            ]);
            assert!(
                !output.status.success(),
                "{how}, {version}: curl took the cut answer for a whole one: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}
