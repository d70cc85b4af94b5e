//! Running real curl through the proxies.

use std::process::{Command, Output, Stdio};

/// Runs curl with `args` (plus `-s -S`), waiting for it to end.
pub fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["-s", "-S"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running curl (make test installs it)")
}

/// Fetches `url` through `proxy` (a socks5h:// or http:// proxy URL) and
/// returns the body; panics with curl's stderr when curl fails.
pub fn fetch(proxy: &str, url: &str, extra: &[&str]) -> Vec<u8> {
    let mut args = vec!["--max-time", "60", "--proxy", proxy];
    args.extend_from_slice(extra);
    args.push(url);
    let output = curl(&args);
    assert!(
        output.status.success(),
        "curl via {proxy} to {url} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// The HTTP status code curl saw for `url` through `proxy`.
pub fn status_code(proxy: &str, url: &str, extra: &[&str]) -> String {
    // Through a tunnel, the proxy's answer is the CONNECT's, not the origin's.
    let code = if extra.contains(&"--proxytunnel") {
        "%{http_connect}"
    } else {
        "%{http_code}"
    };
    let mut args = vec![
        "--max-time",
        "30",
        "-o",
        "/dev/null",
        "-w",
        code,
        "--proxy",
        proxy,
    ];
    args.extend_from_slice(extra);
    args.push(url);
    String::from_utf8_lossy(&curl(&args).stdout).into_owned()
}
