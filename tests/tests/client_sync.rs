//! Read-your-writes for client changes (issue 14): a client works the
//! instant `blipless-ctl client add` returns, a removed one is refused and
//! its open tunnels closed the instant `client remove` returns, a node that
//! cannot confirm makes `blipless-ctl` say so and exit non-zero, and a
//! change made on one node of a Redis fleet applies on the others at once
//! (a blocking feed read, not a poll).

use std::io::Write;
use std::time::{Duration, Instant};

use blipless_tests::node::Node;
use blipless_tests::origin::Origin;
use blipless_tests::raw;
use blipless_tests::redis::Redis;

/// Logs in over SOCKS5 once, with no retry: the auth status byte (0: ok).
fn login_once(node: &Node, name: &str, secret: &str) -> u8 {
    let mut stream = raw::connect(node.socks);
    raw::socks5_login(&mut stream, name, secret)
}

fn add_json(node: &Node, name: &str) -> serde_json::Value {
    let output = node.ctl(&["--json", "client", "add", name]);
    assert!(
        output.status.success(),
        "client add: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("client add --json")
}

#[test]
fn a_new_client_works_the_instant_client_add_returns() {
    let mut node = Node::new("");
    let (_ingress, _device, _alice) = node.start();
    for n in 0..20 {
        let name = format!("new{n}");
        let added = add_json(&node, &name);
        assert_eq!(added["node"]["confirmed"], true, "{added}");
        assert_eq!(added["node"]["device_planes"], 1, "{added}");
        let secret = added["secret"].as_str().expect("secret").to_string();
        assert_eq!(
            login_once(&node, &name, &secret),
            0,
            "{name} was refused right after client add returned"
        );
    }
}

#[test]
fn a_removed_client_is_refused_and_its_tunnels_closed_when_remove_returns() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let (_ingress, _device, alice) = node.start();
    let mut tunnel = raw::connect(node.socks);
    assert_eq!(raw::socks5_login(&mut tunnel, "alice", &alice.secret), 0);
    assert_eq!(raw::socks5_connect_v4(&mut tunnel, origin.address), 0);
    // An idle tunnel, open before the removal.
    let output = node.ctl(&["--json", "client", "remove", "alice"]);
    assert!(output.status.success(), "{output:?}");
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(answer["node"]["confirmed"], true, "{answer}");
    assert_eq!(
        login_once(&node, "alice", &alice.secret),
        1,
        "a removed client still logged in after remove returned"
    );
    tunnel
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let started = Instant::now();
    assert!(raw::closed(&mut tunnel), "the open tunnel was not closed");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the open tunnel was closed by the removal, not by a timeout"
    );
    let _ = tunnel.write_all(b"x");
}

#[test]
fn a_node_that_cannot_confirm_makes_ctl_say_so_and_fail() {
    let mut node = Node::new("");
    let (_ingress, device, _alice) = node.start();
    // A device plane that stops answering (frozen) cannot apply the change.
    device.signal(nix::sys::signal::Signal::SIGSTOP);
    let started = Instant::now();
    let output = node.ctl(&["client", "add", "late"]);
    device.signal(nix::sys::signal::Signal::SIGCONT);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(75), "exit status: {stderr}");
    assert!(stderr.contains("did not confirm"), "{stderr}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("socks5h://late:"),
        "the secret is still printed: it is stored and shown only once"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    // The change is in the store: the thawed plane picks it up.
    blipless_tests::wait_until(Duration::from_secs(10), "the plane to load it", || {
        node.status_json()["device_planes"][0]["clients"] == 2
    });
}

/// A frozen plane whose channel is full (customers kept connecting, and
/// each connection handed to it is a message it does not read): the ingress
/// cannot even send it the sync request. The answer still comes within the
/// wait, naming the plane; the send waited for ever, and ctl gave up on the
/// ingress ("reading the ingress's answer").
#[test]
fn a_frozen_plane_with_a_full_channel_still_gets_an_answer_within_the_wait() {
    let mut node = Node::new("");
    // A channel that holds a few small frames (its usual one holds a
    // largest frame: hundreds of small ones).
    let ingress = node.spawn_ingress_with(&[], &[("BLIPLESS_FAULT_CHANNEL_SNDBUF_BYTES", "4096")]);
    let _alice = node.add_client("alice");
    let device = node.start_device();
    node.wait_ready();
    device.signal(nix::sys::signal::Signal::SIGSTOP);
    // Each connection is a frame the frozen plane does not read (one at a
    // time, or the ingress hands a burst over in one); the ones the channel
    // cannot take wait in the listener's backlog.
    let customers: Vec<_> = (0..60)
        .map(|_| {
            let customer = raw::connect(node.socks);
            std::thread::sleep(Duration::from_millis(20));
            customer
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let output = node.ctl(&["client", "add", "late"]);
    let took = started.elapsed();
    device.signal(nix::sys::signal::Signal::SIGCONT);
    drop(customers);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(75), "exit status: {stderr}");
    assert!(
        stderr.contains("did not confirm") && stderr.contains("g1"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert!(
        ingress.log_text().contains("its channel stayed full"),
        "the sync request was sent after all: the channel was not full"
    );
}

#[test]
fn with_no_node_running_client_add_succeeds_and_says_so() {
    let node = Node::new("");
    let added = add_json(&node, "early");
    assert_eq!(added["node"]["confirmed"], false, "{added}");
    assert_eq!(added["node"]["running"], false, "{added}");
}

#[test]
fn a_client_added_on_one_node_of_a_redis_fleet_works_on_another_at_once() {
    let redis = Redis::start(false);
    let store = format!("[store]\nurl = \"{}\"\n", redis.url());
    let mut a = Node::custom("node-a", "", &store);
    let mut b = Node::custom("node-b", "", &store);
    let (_ia, _da, _) = a.start();
    let _ib = b.start_ingress();
    let _db = b.start_device();
    b.wait_ready();
    // Ten changes on node A, each timed until node B takes the login. The
    // old poll every 500 ms made this 0 to 500 ms; a blocking read of the
    // feed makes it a few milliseconds. 300 ms leaves room for a busy machine.
    let mut slowest = Duration::ZERO;
    for n in 0..10 {
        let name = format!("fleet{n}");
        let secret = add_json(&a, &name)["secret"]
            .as_str()
            .expect("secret")
            .to_string();
        let added = Instant::now();
        loop {
            if login_once(&b, &name, &secret) == 0 {
                break;
            }
            assert!(
                added.elapsed() < Duration::from_secs(10),
                "node B never took {name}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        slowest = slowest.max(added.elapsed());
    }
    assert!(
        slowest < Duration::from_millis(300),
        "a change on node A took {slowest:?} to reach node B"
    );
}
