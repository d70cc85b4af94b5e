//! An ingress handoff and a device-plane deploy at the same time (issue 14:
//! "a package upgrade restarts both units at once"): in every order — the
//! handoff while the new plane warms up, while the old plane hands its
//! tunnels over, and a deploy started while a handoff runs — no request
//! fails, every tunnel is byte-exact, and the old processes exit 0.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blipless_tests::load::{finish_echoes, steady_load, streaming_echo};
use blipless_tests::node::Node;
use blipless_tests::origin::Origin;
use blipless_tests::{pattern, wait_until};

#[test]
fn handoffs_and_deploys_overlapping_in_every_order_lose_nothing() {
    let origin = Origin::start();
    let mut node = Node::new("");
    let (mut ingress, mut device, client) = node.start();
    // At 1 MB/s each way: longer than all the rounds take.
    let size = 40 * 1024 * 1024;
    let upload = node.path().join("upload.bin");
    std::fs::write(&upload, pattern(size)).expect("write upload");
    let (socks_out, http_out) = (node.path().join("socks.out"), node.path().join("http.out"));
    let url = origin.url("/echo");
    let mut socks = streaming_echo(&client.socks, &url, &upload, &socks_out, false);
    let mut http = streaming_echo(&client.http, &url, &upload, &http_out, true);
    let stop = Arc::new(AtomicBool::new(false));
    let short = origin.url("/bytes/2000");
    let loads = [
        steady_load(client.socks.clone(), short.clone(), 4, stop.clone()),
        steady_load(client.http.clone(), short, 4, stop.clone()),
    ];
    std::thread::sleep(Duration::from_millis(500));
    for round in 0..3 {
        // 1. The handoff starts while the new plane warms up.
        let mut old_device = std::mem::replace(&mut device, node.start_device());
        std::thread::sleep(Duration::from_millis(50));
        let (next, _) = node.hand_off(&mut ingress);
        ingress = next;
        old_device.exits_cleanly("device plane (handoff during warm-up)");
        node.wait_ready();

        // 2. The handoff starts the moment the new plane is active, while
        //    the old one hands its tunnels over.
        let before = node.active_generation();
        let mut old_device = std::mem::replace(&mut device, node.start_device());
        wait_until(
            Duration::from_secs(60),
            "the new plane to be active",
            || node.active_generation().is_some_and(|g| Some(g) != before),
        );
        let (next, _) = node.hand_off(&mut ingress);
        ingress = next;
        old_device.exits_cleanly("device plane (handoff during its drain)");
        node.wait_ready();

        // 3. A deploy starts while a handoff runs.
        let mut old_ingress = std::mem::replace(&mut ingress, node.spawn_ingress());
        std::thread::sleep(Duration::from_millis(20 + 40 * round));
        let mut old_device = std::mem::replace(&mut device, node.start_device());
        old_ingress.exits_cleanly("ingress (deploy during a handoff)");
        old_device.exits_cleanly("device plane (deploy during a handoff)");
        node.wait_ready();
        eprintln!("round {round}: every order survived");
    }
    stop.store(true, Ordering::SeqCst);
    for load in loads {
        let (total, failures) = load.join().expect("load thread");
        assert!(total > 0, "the load ran");
        assert!(
            failures.is_empty(),
            "{} of {total} requests failed: {failures:?}",
            failures.len()
        );
    }
    finish_echoes(
        [
            (&mut socks, &socks_out, "SOCKS5"),
            (&mut http, &http_out, "HTTP CONNECT"),
        ],
        size,
        "overlapping handoffs and deploys",
    );
}
