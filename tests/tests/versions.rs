//! Which build runs, and metrics that scrape right: `--version` of each
//! binary names the build (`blipless_config::build::VERSION`, from `git
//! describe` or the package version), and the same string is in `/status`,
//! `blipless-ctl status` (the ingress and each plane, from its Hello) and
//! `blipless_build_info`; `/metrics` says it is OpenMetrics and carries the
//! process figures.

use blipless_config::build::{COMMIT, VERSION};
use blipless_tests::binary;
use blipless_tests::node::Node;

fn version_of(binary_name: &str) -> String {
    let output = std::process::Command::new(binary(binary_name))
        .arg("--version")
        .output()
        .expect("running --version");
    assert!(output.status.success(), "{binary_name} --version");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

#[test]
fn every_binary_and_the_status_name_the_same_build() {
    assert!(
        VERSION != env!("CARGO_PKG_VERSION") || COMMIT == "unknown",
        "a build from a checkout names its commit: {VERSION}"
    );
    for name in ["blipless-ingress", "blipless-device", "blipless-ctl"] {
        assert_eq!(version_of(name), format!("{name} {VERSION}"));
    }

    let mut node = Node::new("");
    let _ingress = node.start_ingress();
    let _device = node.start_device();
    node.wait_ready();

    let (code, body) = node.status();
    assert_eq!(code, 200, "{body}");
    let lines: Vec<&str> = body.lines().collect();
    // The word stays first, for load balancers.
    assert_eq!(lines[0], "ok", "{body}");
    assert!(
        lines.contains(&format!("ingress {VERSION}").as_str()),
        "{body}"
    );
    assert!(
        lines.contains(&format!("device plane 1 active: {VERSION}").as_str()),
        "{body}"
    );

    let status = node.status_json();
    assert_eq!(status["version"], VERSION, "{status}");
    assert_eq!(status["device_planes"][0]["software"], VERSION, "{status}");
    let human = node.ctl(&["status"]);
    assert!(
        String::from_utf8_lossy(&human.stdout).contains(&format!("ingress {VERSION}")),
        "{}",
        String::from_utf8_lossy(&human.stdout)
    );

    let build_info = format!("blipless_build_info{{version=\"{VERSION}\",commit=\"{COMMIT}\"}}");
    assert_eq!(node.metric(&build_info), 1.0, "{}", node.metrics());
    assert!(node.metric("process_open_fds") >= 5.0, "{}", node.metrics());
    assert!(node.metric("process_max_fds") >= node.metric("process_open_fds"));
    assert!(node.metric("process_resident_memory_bytes") > 1e6);
    assert!(node.metric("process_cpu_seconds_total") > 0.0);
    let metrics = node.metrics();
    assert!(metrics.trim_end().ends_with("# EOF"), "one EOF, last");
    assert_eq!(metrics.matches("# EOF").count(), 1, "{metrics}");

    // The content type is the format the body is in.
    let headers = blipless_tests::curl::curl(&[
        "--silent",
        "--max-time",
        "5",
        "--head",
        &format!("http://{}/metrics", node.status),
    ]);
    let headers = String::from_utf8_lossy(&headers.stdout).to_ascii_lowercase();
    assert!(
        headers
            .contains("content-type: application/openmetrics-text; version=1.0.0; charset=utf-8"),
        "{headers}"
    );
}
