//! Which build runs, and metrics that scrape right: `--version` of each
//! binary names the build (`blipless_config::build::VERSION`, from `git
//! describe` or the package version), and the same string is in `/status`,
//! `blipless-ctl status` (the ingress and each plane, from its Hello) and
//! `blipless_build_info`; `/metrics` says it is OpenMetrics and carries the
//! process figures. A deploy's record names the old and the new plane's
//! build.

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
    let device = node.start_device();
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
    // A young, idle ingress may not have used a clock tick of CPU yet: the
    // series must be there, its value at least 0.
    let metrics_text = node.metrics();
    assert!(
        metrics_text
            .lines()
            .any(|line| line.starts_with("process_cpu_seconds_total ")),
        "{metrics_text}"
    );
    assert!(node.metric("process_cpu_seconds_total") >= 0.0);
    // The device plane's own figures, from its reports (once a second).
    blipless_tests::wait_until(
        std::time::Duration::from_secs(10),
        "a device plane report with its process figures",
        || node.metric("blipless_device_open_fds") > 0.0,
    );
    let plane_fds = std::fs::read_dir(format!("/proc/{}/fd", device.pid()))
        .expect("the plane's fds")
        .count() as f64;
    let reported = node.metric("blipless_device_open_fds");
    assert!(
        (reported - plane_fds).abs() <= 8.0,
        "the plane holds {plane_fds} fds, /metrics says {reported}"
    );
    assert!(node.metric("blipless_device_max_fds") >= reported);
    assert!(node.metric("blipless_device_resident_memory_bytes") > 1e6);
    assert!(
        node.metrics()
            .lines()
            .any(|line| line.starts_with("blipless_device_cpu_seconds_total ")),
        "{}",
        node.metrics()
    );
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

/// The build a device plane announces when a test makes it another one
/// (`BLIPLESS_FAULT_SOFTWARE`, device-plane/src/fault.rs).
const OLD_BUILD: &str = "0.0.9+gold";

/// The lines of `blipless-ctl <args>`'s stdout.
fn ctl_text(node: &Node, args: &[&str]) -> String {
    let output = node.ctl(args);
    assert!(output.status.success(), "blipless-ctl {args:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn a_deploy_shows_the_old_and_the_new_build_and_its_record_keeps_both() {
    let binary_version = version_of("blipless-device");
    let new_build = binary_version
        .strip_prefix("blipless-device ")
        .unwrap_or_else(|| panic!("{binary_version}"));
    assert_ne!(new_build, OLD_BUILD);

    let mut node = Node::new("");
    let _ingress = node.start_ingress();
    let mut old = node.start_device_with_env(&[("BLIPLESS_FAULT_SOFTWARE", OLD_BUILD)]);
    node.wait_ready();
    // The first plane: no predecessor, its build recorded.
    let first = node.status_json()["last_deploy"].clone();
    assert_eq!(first["from"], serde_json::Value::Null, "{first}");
    assert_eq!(first["from_software"], serde_json::Value::Null, "{first}");
    assert_eq!(first["to"], 1, "{first}");
    assert_eq!(first["to_software"], OLD_BUILD, "{first}");

    // During the deploy: the new plane warms up (held back), the old one
    // serves; both are attached and each shows its own build.
    let _new = node.start_device_with_env(&[("BLIPLESS_FAULT_STALL_WARMUP_MS", "5000")]);
    let mut status = serde_json::Value::Null;
    blipless_tests::wait_until(
        std::time::Duration::from_secs(20),
        "the new plane attached beside the old",
        || {
            status = node.status_json();
            status["device_planes"].as_array().map_or(0, Vec::len) == 2
        },
    );
    let planes = &status["device_planes"];
    assert_eq!(planes[0]["state"], "active", "{status}");
    assert_eq!(planes[0]["software"], OLD_BUILD, "{status}");
    assert_eq!(planes[1]["state"], "standby", "{status}");
    assert_eq!(planes[1]["software"], new_build, "{status}");
    let human = ctl_text(&node, &["status"]);
    let row = |generation: &str, state: &str, build: &str| {
        human.lines().any(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            words.first() == Some(&generation)
                && words.get(2) == Some(&state)
                && words.last() == Some(&build)
        })
    };
    assert!(row("1", "active", OLD_BUILD), "{human}");
    assert!(row("2", "standby", new_build), "{human}");
    let (_, body) = node.status();
    let lines: Vec<&str> = body.lines().collect();
    assert!(
        lines.contains(&format!("device plane 1 active: {OLD_BUILD}").as_str()),
        "{body}"
    );
    assert!(
        lines.contains(&format!("device plane 2 standby: {new_build}").as_str()),
        "{body}"
    );

    // Once it is over, the record names both builds.
    blipless_tests::wait_until(
        std::time::Duration::from_secs(60),
        "the new plane to be active",
        || node.active_generation() == Some(2),
    );
    old.exits_cleanly("device plane");
    let mut deploy = serde_json::Value::Null;
    blipless_tests::wait_until(
        std::time::Duration::from_secs(20),
        "the deploy to be recorded as succeeded",
        || {
            deploy = node.status_json()["last_deploy"].clone();
            deploy["outcome"] == "succeeded"
        },
    );
    assert_eq!(deploy["from"], 1, "{deploy}");
    assert_eq!(deploy["to"], 2, "{deploy}");
    assert_eq!(deploy["from_software"], OLD_BUILD, "{deploy}");
    assert_eq!(deploy["to_software"], new_build, "{deploy}");
    let both = format!("g1 ({OLD_BUILD}) -> g2 ({new_build}): succeeded in ");
    let human = ctl_text(&node, &["status"]);
    assert!(
        human
            .lines()
            .any(|line| line.starts_with(&format!("last deploy: {both}"))),
        "{human}"
    );
    let deploy_text = ctl_text(&node, &["deploy"]);
    assert!(
        deploy_text
            .lines()
            .any(|line| line.starts_with(&format!("deploy {both}"))),
        "{deploy_text}"
    );
    let deploy_json: serde_json::Value =
        serde_json::from_str(&ctl_text(&node, &["--json", "deploy"])).expect("deploy --json");
    assert_eq!(deploy_json["last_deploy"], deploy, "{deploy_json}");
}

/// Starts `blipless-ingress --config <node's> <args>` with stderr into
/// `log`, and `JOURNAL_STREAM` naming that file when `journal` is set (as
/// systemd does for a unit whose stderr is the journal).
fn ingress_logging_to(
    node: &Node,
    log: &std::path::Path,
    journal: bool,
    args: &[&str],
) -> std::process::Child {
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::File::create(log).expect("log file");
    let meta = file.metadata().expect("log metadata");
    let mut command = std::process::Command::new(binary("blipless-ingress"));
    command
        .arg("--config")
        .arg(&node.config)
        .args(args)
        .env("BLIPLESS_LOG", "info")
        .env("BLIPLESS_WIREGUARD_UAPI", "false")
        .env_remove("JOURNAL_STREAM")
        .stderr(file);
    if journal {
        command.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()));
    }
    command.spawn().expect("starting the ingress")
}

fn wait_for_line(log: &std::path::Path, needle: &str) -> String {
    let mut text = String::new();
    blipless_tests::wait_until(std::time::Duration::from_secs(20), needle, || {
        text = std::fs::read_to_string(log).unwrap_or_default();
        text.contains(needle)
    });
    text
}

#[test]
fn logs_are_flat_json_unstamped_under_journald_and_a_fatal_error_is_printed_once() {
    let node = Node::new("");
    let dir = tempfile::tempdir().expect("tempdir");

    // JSON: the event's fields beside "message", with a timestamp.
    let log = dir.path().join("json.log");
    let mut ingress = ingress_logging_to(&node, &log, false, &["--log-json"]);
    let text = wait_for_line(&log, "ingress serving");
    let _ = ingress.kill();
    let _ = ingress.wait();
    let serving: serde_json::Value = text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|line| {
            line["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("ingress serving"))
        })
        .unwrap_or_else(|| panic!("no JSON line for it: {text}"));
    assert!(serving.get("fields").is_none(), "{serving}");
    assert_eq!(serving["socks"], node.socks.to_string(), "{serving}");
    assert!(serving["timestamp"].is_string(), "{serving}");

    // Under journald: no timestamp of our own, in either format.
    for (name, args) in [("human", &[][..]), ("journal-json", &["--log-json"][..])] {
        let log = dir.path().join(format!("{name}.log"));
        let mut ingress = ingress_logging_to(&node, &log, true, args);
        let text = wait_for_line(&log, "ingress serving");
        let _ = ingress.kill();
        let _ = ingress.wait();
        let line = text
            .lines()
            .find(|line| line.contains("ingress serving"))
            .expect("the line");
        if args.is_empty() {
            assert!(
                line.starts_with(" INFO") || line.starts_with("INFO"),
                "{line}"
            );
        } else {
            let value: serde_json::Value = serde_json::from_str(line).expect("JSON");
            assert!(value.get("timestamp").is_none(), "{value}");
        }
    }

    // A fatal error (the SOCKS5 port is taken): one line, not two.
    let taken = std::net::TcpListener::bind(node.socks).expect("taking the port");
    let log = dir.path().join("fatal.log");
    let mut ingress = ingress_logging_to(&node, &log, false, &[]);
    let status = ingress.wait().expect("the ingress exits");
    drop(taken);
    assert_eq!(status.code(), Some(1));
    let text = std::fs::read_to_string(&log).expect("log");
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "{text}");
    assert_eq!(
        text.matches("Address already in use").count(),
        1,
        "the error printed once: {text}"
    );
}
