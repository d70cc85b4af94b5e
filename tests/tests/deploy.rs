//! Device-plane deploys: live tunnels move byte-exact, short requests never
//! fail, the old plane exits as soon as it is empty, and every failure case
//! leaves the node serving.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blipless_tests::curl::fetch;
use blipless_tests::load::{finish_echoes, steady_load, streaming_echo};
use blipless_tests::node::Node;
use blipless_tests::origin::Origin;
use blipless_tests::{pattern, sha256, wait_until};

fn metric(node: &Node, name: &str) -> f64 {
    let output = blipless_tests::curl::curl(&[
        "--max-time",
        "5",
        &format!("http://{}/metrics", node.status),
    ]);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A TCP echo server on loopback, each connection in a thread of its own,
/// for the life of the test process: its address.
fn echo_server() -> std::net::SocketAddr {
    let echo = std::net::TcpListener::bind("127.0.0.1:0").expect("echo listener");
    let address = echo.local_addr().expect("address");
    std::thread::spawn(move || {
        for stream in echo.incoming().flatten() {
            std::thread::spawn(move || {
                let (mut reader, mut writer) = (&stream, &stream);
                let _ = std::io::copy(&mut reader, &mut writer);
            });
        }
    });
    address
}

#[test]
fn tunnels_stream_both_ways_through_ten_deploys_byte_exact() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let (_ingress, mut device, client) = node.start();
    let size = 16 * 1024 * 1024;
    let upload = node.path().join("upload.bin");
    std::fs::write(&upload, pattern(size)).expect("write upload");
    let (socks_out, http_out) = (node.path().join("socks.out"), node.path().join("http.out"));
    let url = origin.url("/echo");
    let mut socks = streaming_echo(&client.socks, &url, &upload, &socks_out, false);
    let mut http = streaming_echo(&client.http, &url, &upload, &http_out, true);
    std::thread::sleep(Duration::from_millis(500));

    for round in 1..=10 {
        let (next, took) = node.deploy(&mut device);
        device = next;
        assert!(
            took < Duration::from_secs(30),
            "deploy {round} took {took:?}"
        );
    }
    // Both tunnels were still streaming when the last deploy finished.
    finish_echoes(
        [
            (&mut socks, &socks_out, "SOCKS5"),
            (&mut http, &http_out, "HTTP CONNECT"),
        ],
        size,
        "deploys",
    );
    let migrated = metric(&node, "blipless_tunnels_migrated_total");
    assert!(
        migrated >= 20.0,
        "two tunnels times ten deploys migrated, metric says {migrated}"
    );
}

#[test]
fn two_hundred_clients_in_a_loop_see_no_failure_through_five_deploys() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let (_ingress, mut device, client) = node.start();
    let stop = Arc::new(AtomicBool::new(false));
    let url = origin.url("/slow/200");
    let loads = [
        steady_load(client.socks.clone(), url.clone(), 100, stop.clone()),
        steady_load(client.http.clone(), url.clone(), 100, stop.clone()),
    ];
    std::thread::sleep(Duration::from_secs(1));
    for _ in 0..5 {
        let (next, _) = node.deploy(&mut device);
        device = next;
        std::thread::sleep(Duration::from_millis(300));
    }
    stop.store(true, Ordering::SeqCst);
    let mut total = 0;
    for load in loads {
        let (requests, failures) = load.join().expect("load thread");
        assert!(
            failures.is_empty(),
            "failed requests: {:?}",
            &failures[..failures.len().min(10)]
        );
        total += requests;
    }
    assert!(total >= 1000, "the load ran ({total} requests)");
}

#[test]
fn a_plane_that_never_becomes_ready_fails_the_deploy_and_the_old_one_serves_on() {
    let origin = Origin::start();
    let mut node = Node::new("[deploy]\nready_budget = \"2s\"\n");
    let (_ingress, _device, client) = node.start();
    let before = node.active_generation();
    let stop = Arc::new(AtomicBool::new(false));
    let load = steady_load(
        client.socks.clone(),
        origin.url("/slow/100"),
        20,
        stop.clone(),
    );

    let mut stuck = node.start_device_with_env(&[("BLIPLESS_FAULT_STALL_WARMUP_MS", "600000")]);
    let status = stuck
        .wait_exit(Duration::from_secs(30))
        .expect("the plane that never became ready was sent away");
    assert!(!status.success(), "a failed deploy exits non-zero");
    assert!(
        stuck.log_text().contains("deploy failed"),
        "{}",
        stuck.log_text()
    );

    stop.store(true, Ordering::SeqCst);
    let (requests, failures) = load.join().expect("load");
    assert!(failures.is_empty(), "failed requests: {failures:?}");
    assert!(requests > 0);
    assert_eq!(
        node.active_generation(),
        before,
        "the old plane is still the active one"
    );
    let report = node.status_json();
    assert_eq!(report["last_deploy"]["outcome"], "failed", "{report}");
    assert_eq!(fetch(&client.http, &origin.url("/"), &[]), b"hello");
}

#[test]
fn a_new_plane_killed_after_activation_gives_the_node_back_to_the_old_one() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let (_ingress, mut old, client) = node.start();
    let old_generation = node.active_generation();
    // A request in flight keeps the old plane attached while it drains.
    let proxy = client.http.clone();
    let slow = origin.url("/slow/6000");
    let in_flight = std::thread::spawn(move || fetch(&proxy, &slow, &[]));
    wait_until(
        Duration::from_secs(10),
        "the slow request to reach the origin",
        || origin.connections() >= 1,
    );

    let mut new = node.start_device();
    wait_for_another_active(&node, old_generation);
    new.kill();
    wait_until(
        Duration::from_secs(20),
        "the old plane to be re-activated",
        || node.active_generation() == old_generation,
    );
    assert_eq!(fetch(&client.socks, &origin.url("/"), &[]), b"hello");
    assert_eq!(fetch(&client.http, &origin.url("/"), &[]), b"hello");
    assert_eq!(in_flight.join().expect("in-flight request"), b"ok");
    assert!(
        old.child.try_wait().expect("poll").is_none(),
        "the old plane is serving again"
    );
    assert_eq!(node.status_json()["last_deploy"]["outcome"], "failed");
}

#[test]
fn a_drain_with_a_tunnel_open_ends_at_the_grace_and_not_before() {
    let origin = Origin::start();
    let mut node = Node::new("[drain]\ngrace = \"3s\"\n");
    let (mut ingress, mut device, client) = node.start();
    let proxy = client.socks.clone();
    let url = origin.url(&format!("/bytes/{}", 64 * 1024 * 1024));
    let mut tunnel = Command::new("curl")
        .args([
            "-s",
            "--limit-rate",
            "200K",
            "-o",
            "/dev/null",
            "--proxy",
            &proxy,
            &url,
        ])
        .stdin(Stdio::null())
        .spawn()
        .expect("curl");
    wait_until(Duration::from_secs(10), "the tunnel to open", || {
        origin.connections() >= 1
    });

    let started = Instant::now();
    let output = node.ctl(&["drain"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    wait_until(
        Duration::from_secs(5),
        "/status to say draining or stop",
        || {
            let (code, body) = node.status();
            code == 0 || (code == 503 && body.starts_with("draining\n"))
        },
    );
    // After the lame duck (2 s by default) the customer listeners close
    // while the tunnel still holds the node: a new customer is refused at
    // once rather than left in the backlog to be reset at the exit.
    wait_until(
        Duration::from_secs(10),
        "the SOCKS5 and HTTP listeners to refuse new connections",
        || refused(node.socks) && refused(node.http),
    );
    assert!(
        ingress.child.try_wait().expect("poll").is_none(),
        "the listeners closed before the ingress exited, not with it"
    );
    let status = ingress
        .wait_exit(Duration::from_secs(30))
        .expect("the ingress exits");
    let took = started.elapsed();
    assert!(status.success());
    assert!(
        took >= Duration::from_secs(3),
        "exited before the grace: {took:?}"
    );
    assert!(
        took < Duration::from_secs(15),
        "exited long after the grace: {took:?}"
    );
    assert!(device
        .wait_exit(Duration::from_secs(10))
        .is_some_and(|s| s.success()));
    let _ = tunnel.kill();
    let _ = tunnel.wait();
}

#[test]
fn a_drain_with_nothing_open_exits_at_once() {
    let mut node = Node::new("[drain]\ngrace = \"60s\"\n");
    let (mut ingress, mut device, _client) = node.start();
    let started = Instant::now();
    let output = node.ctl(&["drain", "--watch"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("ingress stopped"));
    let status = ingress
        .wait_exit(Duration::from_secs(10))
        .expect("the ingress exits at once");
    assert!(status.success());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert!(device
        .wait_exit(Duration::from_secs(10))
        .is_some_and(|s| s.success()));
}

#[test]
fn sigterm_to_a_lone_device_plane_finishes_its_work_then_exits() {
    let origin = Origin::start();
    let mut node = Node::new("[drain]\ngrace = \"30s\"\n");
    let (_ingress, mut device, client) = node.start();
    let proxy = client.http.clone();
    let slow = origin.url("/slow/2000");
    let in_flight = std::thread::spawn(move || fetch(&proxy, &slow, &[]));
    wait_until(
        Duration::from_secs(10),
        "the request to reach the origin",
        || origin.connections() >= 1,
    );
    // SIGHUP first: a device plane has nothing to reload, and carries on
    // (the signal's default would end it and the request with it).
    device.signal(nix::sys::signal::Signal::SIGHUP);
    wait_until(
        Duration::from_secs(10),
        "the plane to log the SIGHUP",
        || {
            device
                .log_text()
                .contains("SIGHUP: a device plane has nothing to reload")
        },
    );
    assert!(
        device.wait_exit(Duration::from_millis(200)).is_none(),
        "SIGHUP left the device plane running"
    );
    let started = Instant::now();
    device.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(
        in_flight.join().expect("request"),
        b"ok",
        "the request in flight finished"
    );
    let status = device
        .wait_exit(Duration::from_secs(20))
        .expect("exits once empty");
    assert!(status.success());
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "did not wait for the grace"
    );
    // The node waits for the next plane; a new one serves.
    wait_until(Duration::from_secs(10), "/status to say starting", || {
        node.status().0 == 503
    });
    let _next = node.start_device();
    node.wait_ready();
    assert_eq!(fetch(&client.socks, &origin.url("/"), &[]), b"hello");
}

#[test]
fn a_device_plane_speaking_garbage_is_dropped_and_the_others_serve_on() {
    use blipless_protocol::channel::{self, Hello, Rejoin, ToDevice, ToIngress};
    let origin = Origin::start();
    let mut node = Node::new("");
    let (_ingress, _device, client) = node.start();
    let path = node.path().join("run/device.sock");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        // Garbage instead of a Hello.
        let socket = tokio_seqpacket::UnixSeqpacket::connect(&path)
            .await
            .expect("connect");
        socket.send(b"GET / HTTP/1.1\r\n\r\n").await.expect("send");
        let mut buffer = vec![0u8; channel::MAX_FRAME];
        let answer = tokio::time::timeout(Duration::from_secs(10), socket.recv(&mut buffer)).await;
        assert!(
            matches!(answer, Ok(Ok(_)) | Ok(Err(_))),
            "the ingress answered or closed"
        );

        // A Hello, then a frame with an unknown type.
        let socket = tokio_seqpacket::UnixSeqpacket::connect(&path)
            .await
            .expect("connect");
        let hello = ToIngress::Hello(Hello {
            pid: 1,
            software: "fake".into(),
            rejoin: Rejoin::No,
            accepts_many: false,
            reads_not_taken: false,
            reads_udp_migrate: false,
        });
        socket.send(&channel::encode(&hello)).await.expect("hello");
        let info = socket.recv(&mut buffer).await.expect("welcome");
        assert!(matches!(
            channel::decode::<ToDevice>(&buffer[..info.bytes_read()]),
            Ok((ToDevice::Welcome(_), _))
        ));
        let mut bad = channel::encode(&ToIngress::Ready);
        bad[3] = 250;
        socket.send(&bad).await.expect("send");
        let closed = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match socket.recv(&mut buffer).await {
                    Ok(info) if info.bytes_read() == 0 => return,
                    Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the ingress closed the bad plane's channel");

        // Another protocol version is refused with a reason.
        let socket = tokio_seqpacket::UnixSeqpacket::connect(&path)
            .await
            .expect("connect");
        let mut other_version = channel::encode(&hello);
        other_version[2] = channel::PROTOCOL_VERSION + 1;
        socket.send(&other_version).await.expect("send");
        let info = socket.recv(&mut buffer).await.expect("refusal");
        match channel::decode::<ToDevice>(&buffer[..info.bytes_read()]) {
            Ok((ToDevice::Refused(refused), _)) => {
                assert!(refused.reason.contains("version"), "{}", refused.reason)
            }
            other => panic!("expected Refused, got {other:?}"),
        }
    });
    assert_eq!(fetch(&client.socks, &origin.url("/"), &[]), b"hello");
    assert_eq!(node.active_generation(), Some(1));
}

#[test]
fn a_tunnel_with_a_full_buffer_moves_with_every_pending_byte() {
    use std::io::{Read, Write};
    let origin = Origin::start();
    let mut node = Node::new("");
    let (_ingress, mut device, client) = node.start();
    let size = 16 * 1024 * 1024;
    // How much a full buffer (or, once the tunnel splices, its pipe) holds at
    // the moment of the deploy depends on the last read; a run over 64 KiB
    // travels in a pipe. Try a few deploys until
    // one carried a pipe; every one must deliver every byte.
    let mut piped = false;
    for attempt in 1..=6 {
        // The customer asks for 16 MiB and does not read: the device plane
        // fills its buffer and stops, with bytes pending toward the customer.
        let mut stream = blipless_tests::raw::connect(node.socks);
        assert_eq!(
            blipless_tests::raw::socks5_login(&mut stream, "alice", &client.secret),
            0
        );
        assert_eq!(
            blipless_tests::raw::socks5_connect_v4(&mut stream, origin.address),
            0
        );
        write!(
            stream,
            "GET /bytes/{size} HTTP/1.1\r\nHost: origin\r\nConnection: close\r\n\r\n"
        )
        .expect("request");
        std::thread::sleep(Duration::from_millis(1000));
        // Read a little, then stop again: by now the origin is far ahead, so
        // the plane's next reads are whole buffers (on a loaded machine the
        // first ones can be small, and a small run travels inline).
        let mut response = vec![0u8; 512 * 1024];
        stream
            .read_exact(&mut response)
            .expect("read the start of the answer");
        std::thread::sleep(Duration::from_millis(300));
        let old_log = device.log.clone();
        let (new, _) = node.deploy(&mut device);
        device = new;
        let log = std::fs::read_to_string(old_log).unwrap_or_default();
        // Past 256 KiB the direction splices: its pending run travels in
        // the pipe it spliced through, not a fresh one.
        piped |= log.lines().any(|line| {
            line.contains("pending bytes travel in pipes") && line.contains("own_pipes=1")
        });
        stream
            .read_to_end(&mut response)
            .expect("read the whole answer");
        let body_start = response
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|p| p + 4)
            .expect("headers");
        assert_eq!(
            response.len() - body_start,
            size,
            "attempt {attempt}: every byte arrived"
        );
        assert_eq!(
            sha256(&response[body_start..]),
            sha256(&pattern(size)),
            "attempt {attempt}: in order, exactly once"
        );
        if piped {
            break;
        }
    }
    assert!(piped, "no deploy caught a buffer over 64 KiB in six tries");
}

/// Whether a TCP connection to `address` is refused (nothing listens there).
fn refused(address: std::net::SocketAddr) -> bool {
    std::net::TcpStream::connect_timeout(&address, Duration::from_secs(2))
        .is_err_and(|error| error.kind() == std::io::ErrorKind::ConnectionRefused)
}

/// A new plane that dies before taking the tunnels handed to it (the fault
/// hook aborts it on the first) takes none of them: the ingress sees its
/// channel end and its process exit, answers "not taken", and the old plane,
/// given the node back, serves every tunnel on, byte-exact. At the next
/// deploy they move as any other (the old plane then exits well before its
/// 60 s grace).
#[test]
fn tunnels_handed_to_a_plane_that_dies_before_taking_them_stay_with_the_old_plane() {
    use std::io::{Read, Write};
    const TUNNELS: usize = 20;
    let echo_address = echo_server();
    let mut node = Node::new("[drain]\ngrace = \"60s\"\n");
    let (ingress, mut old, client) = node.start();
    let echoes = |stream: &mut std::net::TcpStream, n: usize, round: usize| {
        let line = format!("tunnel {n} round {round}\n");
        stream.write_all(line.as_bytes()).expect("write");
        let mut back = vec![0u8; line.len()];
        stream
            .read_exact(&mut back)
            .unwrap_or_else(|error| panic!("tunnel {n} round {round}: {error}"));
        assert_eq!(back, line.as_bytes(), "tunnel {n} round {round}");
    };
    let mut tunnels: Vec<std::net::TcpStream> = (0..TUNNELS)
        .map(|n| {
            let mut stream = blipless_tests::raw::connect(node.socks);
            stream
                .set_read_timeout(Some(Duration::from_secs(20)))
                .expect("read timeout");
            assert_eq!(
                blipless_tests::raw::socks5_login(&mut stream, "alice", &client.secret),
                0
            );
            assert_eq!(
                blipless_tests::raw::socks5_connect_v4(&mut stream, echo_address),
                0
            );
            echoes(&mut stream, n, 0);
            stream
        })
        .collect();
    let first = node.active_generation();
    let mut dying = node.start_device_with_env(&[("BLIPLESS_FAULT_DIE_ADOPTING", "1")]);
    let status = dying.wait_exit(Duration::from_secs(60));
    assert!(
        status.is_some_and(|s| !s.success()),
        "the new plane dies adopting ({status:?}):\n{}",
        dying.log_text()
    );
    assert!(
        dying.log_text().contains("dying instead of adopting"),
        "it died at the hook:\n{}",
        dying.log_text()
    );
    wait_until(
        Duration::from_secs(30),
        "the old plane to be given the node back",
        || node.active_generation() == first,
    );
    for (n, stream) in tunnels.iter_mut().enumerate() {
        echoes(stream, n, 1);
    }
    assert!(
        ingress.log_text().contains("their sender keeps them"),
        "the ingress answered \"not taken\":\n{}",
        ingress.log_text()
    );
    assert!(
        old.wait_exit(Duration::from_millis(10)).is_none(),
        "the old plane serves"
    );
    assert_eq!(
        metric(&node, "blipless_tunnels_migrated_total"),
        0.0,
        "nothing was taken over, so nothing counts as migrated"
    );
    let _newest = node.start_device();
    wait_until(
        Duration::from_secs(30),
        "the next plane to be active",
        || node.active_generation().is_some_and(|g| Some(g) != first),
    );
    let status = old.wait_exit(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "the old plane hands every tunnel over and exits before its grace ({status:?}):\n{}",
        old.log_text()
    );
    for (n, stream) in tunnels.iter_mut().enumerate() {
        echoes(stream, n, 2);
    }
    assert_eq!(
        metric(&node, "blipless_tunnels_migrated_total"),
        TUNNELS as f64,
        "each tunnel counted once, when it moved"
    );
}

/// After a deploy whose new plane died before taking anything, the old
/// plane serves on; a later drain still cuts its tunnels at the grace. A
/// tunnel takes the plane's cut once for its whole relay, and serving
/// again used to put a fresh cut in place for later drains, which the
/// tunnels still waiting for a handover slot (48 here, over the 32 slots)
/// never saw: the drain's cut missed them, the plane could not say
/// Drained, and it finished only once the ingress had left at its own
/// grace (or, with a live ingress, when they ended on their own).
#[test]
fn after_a_deploy_whose_new_plane_died_a_drain_still_cuts_at_the_grace() {
    use std::io::{Read, Write};
    const TUNNELS: usize = 48;
    let echo_address = echo_server();
    let mut node = Node::new("[drain]\ngrace = \"3s\"\n");
    let (_ingress, mut old, client) = node.start();
    let mut tunnels: Vec<std::net::TcpStream> = (0..TUNNELS)
        .map(|n| {
            let mut stream = blipless_tests::raw::connect(node.socks);
            stream
                .set_read_timeout(Some(Duration::from_secs(60)))
                .expect("read timeout");
            assert_eq!(
                blipless_tests::raw::socks5_login(&mut stream, "alice", &client.secret),
                0
            );
            assert_eq!(
                blipless_tests::raw::socks5_connect_v4(&mut stream, echo_address),
                0
            );
            let line = format!("tunnel {n}\n");
            stream.write_all(line.as_bytes()).expect("write");
            let mut back = vec![0u8; line.len()];
            stream.read_exact(&mut back).expect("echo");
            stream
        })
        .collect();
    let first = node.active_generation();
    let mut dying = node.start_device_with_env(&[("BLIPLESS_FAULT_DIE_ADOPTING", "1")]);
    assert!(dying
        .wait_exit(Duration::from_secs(60))
        .is_some_and(|s| !s.success()));
    wait_until(
        Duration::from_secs(30),
        "the old plane to be given the node back",
        || node.active_generation() == first,
    );
    let output = node.ctl(&["drain"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let status = old.wait_exit(Duration::from_secs(40));
    assert!(
        status.is_some_and(|s| s.success()),
        "the drain ends at its grace, not when the tunnels do ({status:?}):\n{}",
        old.log_text()
    );
    // Cut at the grace, every tunnel gone, the plane reports Drained itself
    // (before, the tunnels it could not cut kept it waiting until the
    // ingress left at its own grace and the plane finished offline).
    assert!(
        !old.log_text()
            .contains("device channel lost while draining"),
        "{}",
        old.log_text()
    );
    for stream in &mut tunnels {
        let mut rest = Vec::new();
        let end = stream.read_to_end(&mut rest);
        assert!(
            rest.is_empty()
                && end.as_ref().map_or_else(
                    |error| error.kind() == std::io::ErrorKind::ConnectionReset,
                    |_| true
                ),
            "cut: the customer sees the end ({end:?})"
        );
    }
}

/// A deploy that begins while the last one still moves tunnels: the plane
/// in the middle is still taking tunnels over from the oldest (slowly: a
/// fault hook holds each adoption 3 s) when the newest takes over from it.
/// It passes them on rather than keep them to its drain grace (60 s here),
/// as connections that came back to it would be. Both older planes exit
/// long before that, and every tunnel still echoes through the newest.
#[test]
fn a_deploy_during_a_deploy_passes_every_tunnel_on_to_the_newest_plane() {
    use std::io::{Read, Write};
    const TUNNELS: usize = 50;
    let echo_address = echo_server();
    let mut node = Node::new("[drain]\ngrace = \"60s\"\n");
    let (_ingress, mut oldest, client) = node.start();
    let echoes = |stream: &mut std::net::TcpStream, n: usize| {
        let line = format!("tunnel {n}\n");
        stream.write_all(line.as_bytes()).expect("write");
        let mut back = vec![0u8; line.len()];
        stream.read_exact(&mut back).expect("read back");
        assert_eq!(back, line.as_bytes(), "tunnel {n}");
    };
    let mut tunnels: Vec<std::net::TcpStream> = (0..TUNNELS)
        .map(|n| {
            let mut stream = blipless_tests::raw::connect(node.socks);
            assert_eq!(
                blipless_tests::raw::socks5_login(&mut stream, "alice", &client.secret),
                0
            );
            assert_eq!(
                blipless_tests::raw::socks5_connect_v4(&mut stream, echo_address),
                0
            );
            echoes(&mut stream, n);
            stream
        })
        .collect();
    let first = node.active_generation();
    let mut middle = node.start_device_with_env(&[("BLIPLESS_FAULT_SLOW_ADOPTION_MS", "3000")]);
    wait_until(
        Duration::from_secs(30),
        "the middle plane to be active",
        || node.active_generation().is_some_and(|g| Some(g) != first),
    );
    let second = node.active_generation();
    let mut newest = node.start_device();
    wait_until(
        Duration::from_secs(30),
        "the newest plane to be active",
        || node.active_generation().is_some_and(|g| Some(g) != second),
    );
    let exits_soon = |plane: &mut blipless_tests::node::Daemon, what: &str| {
        let status = plane.wait_exit(Duration::from_secs(30));
        assert!(
            status.is_some_and(|s| s.success()),
            "{what} exits cleanly before its grace ({status:?}):\n{}",
            plane.log_text()
        );
    };
    exits_soon(&mut oldest, "the oldest plane");
    exits_soon(&mut middle, "the middle plane");
    assert!(
        middle.log_text().contains("adopting slowly"),
        "the middle plane took tunnels over"
    );
    assert!(
        newest.wait_exit(Duration::from_millis(10)).is_none(),
        "the newest plane serves"
    );
    for (n, stream) in tunnels.iter_mut().enumerate() {
        echoes(stream, n);
    }
}

/// A plane that stops reading its channel (stopped here; wedged or starved
/// alike) fills it, and the ingress's accept loops waited in their send to
/// it for good: a deploy brought a new plane to active, but no new
/// connection reached it until the old one was killed. Now a send waiting
/// on a plane gives up when the plane stops being active, and the
/// connection goes to the new one.
#[test]
fn a_deploy_takes_new_connections_from_a_plane_that_stopped_reading() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let (_ingress, mut old, client) = node.start();
    let old_generation = node.active_generation();
    old.signal(nix::sys::signal::Signal::SIGSTOP);
    // One at a time, so that most are frames of their own: the stopped
    // plane's channel holds some, then the accept loops wait on it (2,000
    // are enough on this machine; 100 were not).
    let mut waiting = Vec::new();
    for _ in 0..2000 {
        waiting.push(blipless_tests::raw::connect(node.socks));
        std::thread::sleep(Duration::from_millis(2));
    }
    let _new = node.start_device();
    wait_for_another_active(&node, old_generation);
    let output = blipless_tests::curl::curl(&[
        "--max-time",
        "20",
        "--proxy",
        &client.socks,
        &origin.url("/"),
    ]);
    assert!(
        output.status.success(),
        "a new connection with the old plane stopped: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(output.stdout, b"hello");
    // The new plane's own frames are still read: its reports show a tunnel
    // it holds (the reader of a plane that said Ready used to send the old
    // plane's Drain itself, and wait there while the old one was stopped).
    let mut held = blipless_tests::raw::connect(node.socks);
    assert_eq!(
        blipless_tests::raw::socks5_login(&mut held, "alice", &client.secret),
        0
    );
    assert_eq!(
        blipless_tests::raw::socks5_connect_v4(&mut held, origin.address),
        0
    );
    let new_plane_reports_it = || {
        node.status_json()["device_planes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| {
                p["generation"].as_u64() != old_generation
                    && p["connections_open"].as_u64().unwrap_or(0) >= 1
            })
    };
    let reported = (0..60).any(|_| {
        std::thread::sleep(Duration::from_millis(500));
        new_plane_reports_it()
    });
    old.kill();
    assert!(
        reported,
        "the new plane's reports are read: {}",
        node.status_json()
    );
    drop((waiting, held));
}

/// Waits until a plane other than generation `old` is the active one.
fn wait_for_another_active(node: &Node, old: Option<u64>) {
    wait_until(
        Duration::from_secs(30),
        "the new plane to be active",
        || node.active_generation().is_some_and(|g| Some(g) != old),
    );
}
