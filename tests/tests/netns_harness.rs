//! Self-test of the namespace harness, with none of our daemons: a plain
//! WireGuard setup of real tools in three namespaces,
//!
//! ```text
//! customer ──veth 10.S.1.0/24── server ──veth 10.S.2.0/24── internet
//!  wireguard-go client           wireguard-go server         blipless-test-origin
//!  tunnel 10.S.3.2               tunnel 10.S.3.1             10.S.2.2:8000
//! ```
//!
//! the customer downloading through the tunnel with curl and pinging across
//! it. This proves the harness (namespaces, veth, wireguard-go configured from
//! a wg-quick text, the origin binary) and is the baseline topology of the
//! WireGuard throughput benchmark. Needs root; each test has its own subnets
//! (S) and checks that every namespace it made is gone afterwards, even when
//! it fails.

use std::net::SocketAddr;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use blipless_tests::netns::{list_namespaces, require_root, start_origin, veth, Netns};
use blipless_tests::wireguard::{client_config, server_config, Egress, Keypair, WireguardGoPeer};
use blipless_tests::{pattern, sha256};

/// Runs `body`, recording the namespaces it makes in its argument, then
/// checks that none of them is left (also when `body` panicked, whose panic
/// is then passed on).
fn with_cleanup_check(body: impl FnOnce(&Mutex<Vec<String>>)) {
    require_root();
    let created = Mutex::new(Vec::new());
    let result = catch_unwind(AssertUnwindSafe(|| body(&created)));
    let created = created.into_inner().unwrap_or_else(|p| p.into_inner());
    let left: Vec<String> = list_namespaces()
        .expect("ip netns list")
        .into_iter()
        .filter(|name| created.contains(name))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
    if let Err(panic) = result {
        resume_unwind(panic);
    }
}

fn netns(role: &str, created: &Mutex<Vec<String>>) -> Netns {
    let netns = Netns::new(role).expect("creating a namespace");
    created
        .lock()
        .expect("namespace list")
        .push(netns.name().to_string());
    netns
}

/// The three-namespace WireGuard topology on subnets 10.`s`.x.0/24, a
/// download and a ping through it.
fn wireguard_go_baseline(s: u8, masquerade: bool, created: &Mutex<Vec<String>>) {
    let started = Instant::now();
    let customer = netns("customer", created);
    let server = netns("server", created);
    let internet = netns("internet", created);
    let _access = veth(
        &customer,
        &format!("10.{s}.1.1/24"),
        &server,
        &format!("10.{s}.1.2/24"),
    )
    .expect("veth customer-server");
    let uplink = veth(
        &server,
        &format!("10.{s}.2.1/24"),
        &internet,
        &format!("10.{s}.2.2/24"),
    )
    .expect("veth server-internet");

    let server_keys = Keypair::generate().expect("server keys");
    let client_keys = Keypair::generate().expect("client keys");
    let egress = if masquerade {
        Egress::Masquerade {
            out_interface: uplink.a.clone(),
        }
    } else {
        internet
            .route_via(&format!("10.{s}.3.0/24"), &format!("10.{s}.2.1"))
            .expect("return route to the tunnel network");
        Egress::Routed
    };
    let wg_server = WireguardGoPeer::server(
        &server,
        &server_config(
            &server_keys,
            &format!("10.{s}.3.1/24"),
            51820,
            &[(&client_keys.public_key, &format!("10.{s}.3.2/32"))],
        ),
        &egress,
    )
    .expect("wireguard-go server");
    let client_text = client_config(
        &client_keys,
        &format!("10.{s}.3.2/24"),
        &server_keys.public_key,
        &format!("10.{s}.1.2:51820"),
        &format!("10.{s}.2.0/24, 10.{s}.3.0/24"),
        Some(25),
    );
    let client = WireguardGoPeer::start(&customer, &client_text, &[&format!("10.{s}.2.0/24")])
        .expect("wireguard-go client");
    let listen: SocketAddr = format!("10.{s}.2.2:8000").parse().expect("address");
    let _origin = start_origin(&internet, listen).expect("origin in the internet namespace");
    let setup = started.elapsed();

    let ping = customer
        .exec(
            "ping",
            &["-c", "3", "-i", "0.2", "-W", "5", &format!("10.{s}.2.2")],
        )
        .unwrap_or_else(|e| {
            panic!(
                "ping through the tunnel: {e}\nclient log:\n{}",
                client.log()
            )
        });
    assert!(ping.contains("3 received"), "ping: {ping}");

    let download = Instant::now();
    let body = customer
        .exec_bytes(
            "curl",
            &[
                "-sS",
                "--max-time",
                "60",
                &format!("http://{listen}/bytes/3000000"),
            ],
        )
        .expect("curl through the tunnel");
    let download = download.elapsed();
    assert_eq!(body.len(), 3_000_000, "body length");
    assert_eq!(sha256(&body), sha256(&pattern(3_000_000)), "body content");

    let whoami = customer
        .exec(
            "curl",
            &[
                "-sS",
                "--max-time",
                "10",
                &format!("http://{listen}/whoami"),
            ],
        )
        .expect("whoami");
    let expected_source = if masquerade {
        format!("10.{s}.2.1")
    } else {
        format!("10.{s}.3.2")
    };
    assert_eq!(whoami, expected_source, "the origin's view of the source");

    // It really went through the tunnel.
    let status = client.status().expect("client wg dump");
    let peer = &status.peers[0];
    assert_eq!(peer.public_key, server_keys.public_key);
    assert!(peer.latest_handshake.is_some(), "no handshake: {peer:?}");
    assert!(
        peer.rx_bytes > 3_000_000,
        "client received {} bytes",
        peer.rx_bytes
    );
    let seen = wg_server.status().expect("server wg dump");
    assert_eq!(seen.listen_port, 51820);
    let endpoint = seen.peers[0].endpoint.clone().unwrap_or_default();
    assert!(
        endpoint.starts_with(&format!("10.{s}.1.1:")),
        "server sees the client at {endpoint:?}"
    );
    eprintln!(
        "subnet 10.{s}: setup {setup:?}, 3 MB download {download:?}, total {:?}",
        started.elapsed()
    );
}

#[test]
fn wireguard_go_through_a_masquerading_server() {
    with_cleanup_check(|created| wireguard_go_baseline(99, true, created));
}

#[test]
fn wireguard_go_through_a_routing_server() {
    with_cleanup_check(|created| wireguard_go_baseline(98, false, created));
}

#[test]
fn dropping_a_namespace_kills_what_runs_inside_and_deletes_it() {
    with_cleanup_check(|created| {
        let scratch = netns("drop", created);
        assert!(scratch.name().starts_with("bl-") && scratch.name().ends_with("-drop"));
        let lo = scratch.ip(&["-o", "link", "show", "lo"]).expect("ip link");
        assert!(lo.contains("UP"), "lo is not up: {lo}");
        scratch
            .set_sysctl("net.ipv4.ip_forward", "1")
            .expect("sysctl");
        assert_eq!(
            scratch
                .exec("sysctl", &["-n", "net.ipv4.ip_forward"])
                .expect("sysctl read")
                .trim(),
            "1"
        );
        let error = scratch
            .exec("sh", &["-c", "echo oops >&2; exit 3"])
            .expect_err("a failing command is an error");
        assert!(error.to_string().contains("oops"), "{error}");
        let mut sleeper = scratch
            .command("sleep")
            .arg("600")
            .spawn()
            .expect("sleep in the namespace");
        let pid = i32::try_from(sleeper.id()).expect("pid");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !scratch.pids().contains(&pid) {
            assert!(
                Instant::now() < deadline,
                "sleep never showed in the namespace"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(scratch);
        let status = sleeper.wait().expect("reaping sleep");
        assert!(!status.success(), "sleep was not killed: {status}");
        assert!(Netns::new("bad role").is_err(), "a role with a space");
    });
}
