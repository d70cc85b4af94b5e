//! TUN offload (`egress.tun.offload = true`), end to end as root in
//! namespaces the test creates: a wireguard-go client downloads and uploads
//! through a node whose TUN device carries virtio-net headers, so the
//! kernel hands the device plane TCP super-packets to cut into segments and
//! takes the client's segments joined. Every byte must arrive exact both
//! ways, across a device-plane deploy that hands the offload queues on, and
//! the old plane's counters must show that super-packets really were cut
//! and joined (docs/WIREGUARD.md, "TUN offload").

use blipless_tests::topology::WgWorld;
use blipless_tests::{packet_counter, pattern, sha256, wait_until};
use std::time::Duration;

/// The subnet number of this test's namespaces (unique among the tests).
const SUBNET: u8 = 94;

#[test]
fn bulk_both_ways_arrives_exact_through_an_offload_device_and_across_a_deploy() {
    let mut world = WgWorld::with_tun(SUBNET, "offload = true", "", &[]);
    assert!(
        world.device.log_text().contains("offload=true"),
        "the TUN device's queues should carry virtio-net headers\n{}",
        world.diagnostics()
    );
    let size = 16_000_000;
    let body = world.fetch(&format!("/bytes/{size}"), &[]);
    assert_eq!(body.len(), size, "download length");
    assert_eq!(
        sha256(&body),
        sha256(&pattern(size)),
        "download bytes differ"
    );

    // Upload: the origin's /echo sends the body back as it arrives.
    let upload = world.node.path().join("upload.bin");
    std::fs::write(&upload, pattern(size)).expect("writing the upload");
    let path = upload.to_string_lossy().into_owned();
    let echoed = world.fetch("/echo", &["-T", &path, "-H", "Expect:"]);
    assert_eq!(echoed.len(), size, "echo length");
    assert_eq!(
        sha256(&echoed),
        sha256(&pattern(size)),
        "upload bytes differ"
    );

    // A deploy hands the offload queues on; a stream across it stays exact,
    // and the successor reads them in their mode. About 6 s at curl's 4 MiB/s:
    // 3 s (12 MB) was once shorter than the second of head start and a deploy
    // that took two on a loaded machine.
    let stream = world.start_download(24_000_000, "4M");
    std::thread::sleep(Duration::from_secs(1));
    let (device, took) = world.node.deploy(&mut world.device);
    let old = world.device.log_text();
    world.device = device;
    eprintln!("deploy took {took:?}");
    stream.finish("deploy", || world.diagnostics());
    let cut = packet_counter(&old, "tun_super_reads");
    let joined = packet_counter(&old, "tun_joined_writes");
    eprintln!("old plane: {cut:?} super-packets cut, {joined:?} joined writes");
    assert!(
        cut.is_some_and(|n| n > 0),
        "no super-packet was read\n{old}"
    );
    assert!(joined.is_some_and(|n| n > 0), "nothing was joined\n{old}");
    wait_until(
        Duration::from_secs(30),
        "the successor to say it inherited offload queues",
        || world.device.log_text().contains("offload=true"),
    );
    let after = world.fetch(&format!("/bytes/{size}"), &[]);
    assert_eq!(
        sha256(&after),
        sha256(&pattern(size)),
        "bytes differ after the deploy"
    );
}
