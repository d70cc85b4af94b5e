//! The crash safety net of docs/ARCHITECTURE.md, "Crash recovery and the fd store", with the test playing systemd: an
//! ingress parks its listening sockets in the service manager's file
//! descriptor store (`FDSTORE=1`); after it is SIGKILLed, a new one started
//! with those sockets (`LISTEN_FDS`) serves on them, and a connection made
//! while no ingress ran is served, not refused.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use blipless_supervise::notify::Listener;
use blipless_tests::curl::fetch;
use blipless_tests::node::{ClientUrls, Daemon, Node};
use blipless_tests::origin::Origin;
use blipless_tests::{binary, wait_until};
use command_fds::{CommandFdExt, FdMapping};

/// Collects FDSTORE notifications until all eight sockets are parked.
fn parked(listener: &Listener) -> HashMap<String, OwnedFd> {
    let mut store = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while store.len() < 8 {
        assert!(
            Instant::now() < deadline,
            "parked so far: {:?}",
            store.keys()
        );
        let Some(notification) = listener
            .recv_timeout(Duration::from_millis(200))
            .expect("notify socket")
        else {
            continue;
        };
        if !notification.state.contains("FDSTORE=1") {
            continue;
        }
        let name = notification
            .state
            .lines()
            .find_map(|line| line.strip_prefix("FDNAME="))
            .expect("FDNAME")
            .to_string();
        let fd = notification.fds.into_iter().next().expect("the socket");
        store.insert(name, fd);
    }
    store
}

/// Starts an ingress as systemd would, its notifications to `notify_path`,
/// and waits until it has parked its sockets; then a client and a ready
/// device plane. Returns the notification listener, the ingress, what it
/// parked by name, the client and the device plane.
fn start_parked(
    node: &mut Node,
    notify_path: &std::path::Path,
) -> (
    Listener,
    Daemon,
    HashMap<String, OwnedFd>,
    ClientUrls,
    Daemon,
) {
    let listener = Listener::bind(notify_path).expect("notify socket");
    let first = node.spawn_ingress_with(
        &[],
        &[("NOTIFY_SOCKET", notify_path.to_str().expect("utf-8"))],
    );
    let store = parked(&listener);
    let client = node.add_client("alice");
    let device = node.start_device();
    node.wait_ready();
    (listener, first, store, client, device)
}

#[test]
fn a_crashed_ingress_comes_back_on_the_sockets_the_service_manager_kept() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let notify_path = node.path().join("notify.sock");
    let (_listener, mut first, store, client, _device) = start_parked(&mut node, &notify_path);
    assert_eq!(
        fetch(&client.socks, &origin.url("/bytes/100"), &[]).len(),
        100
    );

    first.kill();
    // No ingress runs: a customer connects meanwhile, into the kept socket's
    // backlog (a fresh bind would refuse it).
    let waiting = Command::new("curl")
        .args(["-s", "--max-time", "60", "--proxy", &client.socks])
        .arg(origin.url("/bytes/1234"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("curl");
    std::thread::sleep(Duration::from_millis(300));

    let log = node.path().join("restarted.log");
    let mut second = restart(&store, &node.config, &log, None);
    let output = waiting.wait_with_output().expect("curl");
    assert_eq!(
        output.stdout.len(),
        1234,
        "the connection made while down was served"
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("using the socket kept by the service manager"),
        "{text}"
    );
    assert!(
        !text.contains("binding it afresh") && !text.contains("binding them afresh"),
        "{text}"
    );
    wait_until(Duration::from_secs(20), "ready", || node.status().0 == 200);
    let _ = second.kill();
    let _ = second.wait();
}

/// Restarts the ingress as systemd would after a crash: the stored fds from
/// 3 on, named, with `config`; its log in `log`, and its notifications to
/// `notify` if given.
fn restart(
    store: &HashMap<String, OwnedFd>,
    config: &std::path::Path,
    log: &std::path::Path,
    notify: Option<&std::path::Path>,
) -> std::process::Child {
    let names = [
        "socks", "http", "status", "device", "control", "handoff", "wg0", "wg1",
    ];
    let mappings: Vec<FdMapping> = names
        .iter()
        .enumerate()
        .map(|(at, name)| FdMapping {
            parent_fd: store[*name].try_clone().expect("dup"),
            child_fd: 3 + at as i32,
        })
        .collect();
    let mut command = Command::new(binary("blipless-ingress"));
    command
        .arg("--config")
        .arg(config)
        .env("BLIPLESS_LOG", "info")
        // Not the host's /run/wireguard.
        .env("BLIPLESS_WIREGUARD_UAPI", "false")
        .env("LISTEN_FDS", names.len().to_string())
        .env("LISTEN_FDNAMES", names.join(":"))
        // Our child: LISTEN_PID names its parent, as the stand-in's child would see.
        .env("LISTEN_PID", std::process::id().to_string())
        .env("BLIPLESS_SUPERVISED", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log"));
    if let Some(notify) = notify {
        command.env("NOTIFY_SOCKET", notify);
    }
    command.fd_mappings(mappings).expect("fd mappings");
    command.spawn().expect("restarting the ingress")
}

/// A crash, then a restart with `listen.socks` moved to another port: the
/// restarted ingress serves the configured port, not the kept socket's, and
/// parks the new socket in the store. It used the kept one and went on
/// serving the old port (and offering it under the new address at every
/// later handoff), so the change never took.
#[test]
fn a_kept_socket_the_configuration_moved_is_bound_afresh() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let notify_path = node.path().join("notify.sock");
    let (listener, mut first, store, client, _device) = start_parked(&mut node, &notify_path);
    first.kill();

    let moved = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|free| free.local_addr())
        .expect("a free port");
    let config = std::fs::read_to_string(&node.config).expect("config");
    let old = node.socks.to_string();
    assert!(config.contains(&old), "{config}");
    let moved_config = node.path().join("moved.toml");
    std::fs::write(&moved_config, config.replace(&old, &moved.to_string())).expect("config");
    let log = node.path().join("moved.log");
    let mut second = restart(&store, &moved_config, &log, Some(&notify_path));
    wait_until(Duration::from_secs(20), "ready", || node.status().0 == 200);

    let proxy = client.socks.replace(&old, &moved.to_string());
    assert_ne!(proxy, client.socks);
    assert_eq!(
        fetch(&proxy, &origin.url("/bytes/100"), &[]).len(),
        100,
        "served on the configured port"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let reparked = loop {
        assert!(
            Instant::now() < deadline,
            "the new socks socket was not parked"
        );
        let Some(notification) = listener
            .recv_timeout(Duration::from_millis(200))
            .expect("notify socket")
        else {
            continue;
        };
        if notification.state.contains("FDSTORE=1") && notification.state.contains("FDNAME=socks") {
            break notification.fds.into_iter().next().expect("the socket");
        }
    };
    let parked_at = std::net::TcpListener::from(reparked)
        .local_addr()
        .expect("address");
    assert_eq!(parked_at, moved);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("binding it afresh"), "{text}");
    let _ = second.kill();
    let _ = second.wait();
}
