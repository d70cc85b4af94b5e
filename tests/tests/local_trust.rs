//! Local trust, end to end (issue 14, item 4), as root:
//!
//! - a fake ingress listening on `device.sock` as uid 65534 gets nothing from
//!   the device plane (no Hello, no Ready, no peers), and the plane attaches
//!   to the real ingress once one serves there;
//! - the ingress refuses a runtime directory owned by another user or
//!   writable by others, and creates its own with mode 0700; the store's
//!   files are 0600;
//! - a SOCKS5 CONNECT to one of the host's own addresses (an address added
//!   in a network namespace the test creates) is refused with reply 2, and
//!   so is one to the public address the configuration names (behind a
//!   1:1 NAT, on no interface of the host).
//!
//! The fake ingress is this test binary run again as uid 65534 (std's
//! `Command::uid`), running only [`fake_ingress_process`], which does nothing
//! in a normal run.

use std::fs;
use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use blipless_tests::netns::{self, Netns};
use blipless_tests::node::Node;
use blipless_tests::wg_peer::in_netns;
use blipless_tests::{raw, wait_until};

/// Set in the environment of the child that plays the fake ingress: the
/// socket path it listens on.
const FAKE_INGRESS: &str = "BLIPLESS_TEST_FAKE_INGRESS";
/// The unprivileged user the fake ingress (and the foreign runtime
/// directory) belongs to.
const NOBODY: u32 = 65534;

fn require_root() {
    netns::require_root();
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path)
        .unwrap_or_else(|error| panic!("stat {}: {error}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Not a test of its own: the fake ingress, when this binary is run again
/// with [`FAKE_INGRESS`] set (see [`device_plane_says_nothing_to_a_fake_ingress`]).
/// Listens on the path as whoever runs it, accepts every connection for 4 s
/// after the first one (30 s at most in all), and prints how many
/// connections came and how many bytes they sent.
#[test]
fn fake_ingress_process() {
    let Ok(path) = std::env::var(FAKE_INGRESS) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (connections, bytes) = runtime.block_on(async move {
        let mut listener =
            tokio_seqpacket::UnixSeqpacketListener::bind(&path).expect("binding the fake ingress");
        println!("FAKE listening");
        let _ = std::io::stdout().flush();
        let started = tokio::time::Instant::now();
        let mut first: Option<tokio::time::Instant> = None;
        let mut connections = 0usize;
        let mut readers = Vec::new();
        loop {
            let until = match first {
                Some(first) => first + Duration::from_secs(4),
                None => started + Duration::from_secs(30),
            };
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = tokio::time::sleep_until(until) => break,
            };
            let Ok(socket) = accepted else { continue };
            connections += 1;
            first.get_or_insert_with(tokio::time::Instant::now);
            readers.push(tokio::spawn(async move {
                let mut buffer = vec![0u8; 256 * 1024];
                let mut bytes = 0usize;
                let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
                while let Ok(Ok(read)) =
                    tokio::time::timeout_at(deadline, socket.recv(&mut buffer)).await
                {
                    if read.bytes_read() == 0 {
                        break;
                    }
                    bytes += read.bytes_read();
                }
                bytes
            }));
        }
        let mut bytes = 0usize;
        for reader in readers {
            bytes += reader.await.unwrap_or(0);
        }
        (connections, bytes)
    });
    println!("FAKE connections={connections} bytes={bytes}");
}

#[test]
fn device_plane_says_nothing_to_a_fake_ingress() {
    require_root();
    let mut node = Node::new("");
    let run_dir = node.path().join("run");
    // The fake, as uid 65534, must reach and write the runtime directory.
    fs::set_permissions(node.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::create_dir(&run_dir).expect("runtime dir");
    std::os::unix::fs::chown(&run_dir, Some(NOBODY), Some(NOBODY)).expect("chown");
    let socket = run_dir.join("device.sock");

    let fake = Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "--exact",
            "fake_ingress_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(FAKE_INGRESS, &socket)
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting the fake ingress");
    wait_until(Duration::from_secs(20), "the fake ingress's socket", || {
        socket.exists()
    });
    let owner = fs::metadata(&socket).expect("stat device.sock").uid();
    assert_eq!(owner, NOBODY, "the fake ingress must not run as root");

    let mut device = node.start_device();
    let output = fake.wait_with_output().expect("the fake ingress's output");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let report = text
        .lines()
        .find(|line| line.starts_with("FAKE connections="))
        .unwrap_or_else(|| panic!("the fake ingress reported nothing: {text}"));
    let field = |name: &str| -> usize {
        report
            .split_whitespace()
            .find_map(|part| part.strip_prefix(name)?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {report:?}"))
    };
    assert!(
        field("connections=") >= 1,
        "the device plane never connected to the fake: {report}\n{}",
        device.log_text()
    );
    assert_eq!(
        field("bytes="),
        0,
        "the device plane sent the fake ingress (uid {NOBODY}) something: {report}"
    );
    let log = device.log_text();
    assert!(
        log.contains(&format!("uid {NOBODY}")),
        "the device plane's log does not name the fake's uid:\n{log}"
    );
    assert!(
        device.child.try_wait().ok().flatten().is_none(),
        "the device plane exited instead of retrying:\n{log}"
    );

    // The real ingress, in a directory of its own user (root) again: the
    // device plane, still retrying, attaches to it.
    std::os::unix::fs::chown(&run_dir, Some(0), Some(0)).expect("chown back");
    fs::set_permissions(&run_dir, fs::Permissions::from_mode(0o700)).expect("chmod");
    let _ingress = node.start_ingress();
    node.wait_ready();
    assert!(
        device.log_text().contains("attached to the ingress"),
        "{}",
        device.log_text()
    );
    device.kill();
}

#[test]
fn the_ingress_refuses_a_runtime_directory_it_does_not_own_or_others_may_write() {
    require_root();
    let mut node = Node::new("");
    let run_dir = node.path().join("run");

    // Owned by another user: refused, exit non-zero.
    fs::create_dir(&run_dir).expect("runtime dir");
    fs::set_permissions(&run_dir, fs::Permissions::from_mode(0o700)).expect("chmod");
    std::os::unix::fs::chown(&run_dir, Some(NOBODY), Some(NOBODY)).expect("chown");
    let mut ingress = node.spawn_ingress();
    let status = ingress
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| {
            panic!(
                "the ingress runs in a foreign runtime directory:\n{}",
                ingress.log_text()
            )
        });
    assert!(!status.success(), "exit status {status}");
    let log = ingress.log_text();
    assert!(
        log.contains(&format!("owned by uid {NOBODY}"))
            && log.contains(&run_dir.display().to_string()),
        "{log}"
    );
    assert!(
        !run_dir.join("device.sock").exists(),
        "a socket was bound in the foreign directory"
    );

    // Ours, but writable by everyone: refused too.
    std::os::unix::fs::chown(&run_dir, Some(0), Some(0)).expect("chown back");
    fs::set_permissions(&run_dir, fs::Permissions::from_mode(0o777)).expect("chmod");
    let mut ingress = node.spawn_ingress();
    let status = ingress
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| {
            panic!(
                "the ingress runs in a world-writable runtime directory:\n{}",
                ingress.log_text()
            )
        });
    assert!(!status.success(), "exit status {status}");
    let log = ingress.log_text();
    assert!(log.contains("writable"), "{log}");

    // None there: created 0700, and the node's state files are private.
    fs::remove_dir(&run_dir).expect("rmdir");
    let (_ingress, _device, client) = node.start();
    assert_eq!(mode(&run_dir), 0o700, "the runtime directory's mode");
    let state = node.path().join("state");
    assert_eq!(mode(&state), 0o700, "the state directory's mode");
    // A request through the proxy writes usage, so the WAL is in use.
    let _ = blipless_tests::curl::curl(&[
        "--silent",
        "-x",
        &client.socks,
        &format!("http://{}/status", node.status),
    ]);
    for name in ["state.db", "state.db-wal", "state.db-shm"] {
        let path = state.join(name);
        if path.exists() {
            assert_eq!(
                mode(&path) & 0o077,
                0,
                "{name} is readable by others: {:o}",
                mode(&path)
            );
        } else {
            assert_ne!(name, "state.db", "no state.db");
        }
    }
}

#[test]
fn socks5_connect_to_one_of_the_hosts_own_addresses_is_refused() {
    require_root();
    let ns = Netns::new("trust").expect("a namespace");
    // An address that is not denied by default (not private, loopback, ...),
    // on an interface of the node's host: the namespace.
    let own: SocketAddr = "100.128.0.1:8000".parse().expect("address");
    // On the namespace's loopback device (kernels without the dummy driver
    // have it too): an interface address like any other for getifaddrs.
    ns.ip(&["addr", "add", "100.128.0.1/32", "dev", "lo"])
        .expect("address");
    let _origin = netns::start_origin(&ns, own).expect("an origin on the host's address");
    let mut node = Node::in_netns(ns.name(), "", "");
    let (_ingress, _device, client) = node.start();
    let socks = node.socks;
    let (user, secret) = (client.name.clone(), client.secret.clone());
    let started = Instant::now();
    let reply = in_netns(ns.name(), move || {
        let mut stream = raw::connect(socks);
        assert_eq!(raw::socks5_login(&mut stream, &user, &secret), 0, "login");
        raw::socks5_connect_v4(&mut stream, own)
    });
    assert_eq!(
        reply, 2,
        "a CONNECT to the host's own address {own} must be refused by the ruleset (reply 2), got {reply} after {:?}",
        started.elapsed()
    );
}

/// Behind a 1:1 NAT the node's public address is on no interface of its
/// host. The addresses the configuration names as the node's
/// (`proxy.udp_public_address`, `wireguard.endpoint`) are refused all the
/// same; without either, the same address is reached (so the refusal is the
/// configuration's doing).
#[test]
fn socks5_connect_to_the_public_address_the_configuration_names_is_refused() {
    require_root();
    let ns = Netns::new("trust").expect("a namespace");
    let far = Netns::new("far").expect("a namespace");
    // The "public" address stands in another namespace, over a veth pair:
    // reachable from the node's, and no interface of the node's has it.
    let _pair = netns::veth(&ns, "100.128.0.2/24", &far, "100.128.0.1/24").expect("veth");
    let public: SocketAddr = "100.128.0.1:8000".parse().expect("address");
    let _origin = netns::start_origin(&far, public).expect("an origin at the public address");
    let cases = [
        ("", 0),
        ("[proxy]\nudp_public_address = \"100.128.0.1\"\n", 2),
        ("[wireguard]\nendpoint = \"100.128.0.1:51820\"\n", 2),
    ];
    for (extra, expected) in cases {
        let mut node = Node::in_netns(ns.name(), "", extra);
        let (_ingress, _device, client) = node.start();
        let socks = node.socks;
        let (user, secret) = (client.name.clone(), client.secret.clone());
        let reply = in_netns(ns.name(), move || {
            let mut stream = raw::connect(socks);
            assert_eq!(raw::socks5_login(&mut stream, &user, &secret), 0, "login");
            raw::socks5_connect_v4(&mut stream, public)
        });
        assert_eq!(
            reply, expected,
            "a CONNECT to {public} with {extra:?} configured: reply {reply}, expected {expected}"
        );
    }
}
