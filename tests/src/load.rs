//! Load for end-to-end tests: real curl clients streaming through a tunnel,
//! and steady batches of short requests, shared by the deploy and handoff
//! tests.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Where the load's curl runs: on this machine, or in another network
/// namespace (a container's, by its `/proc/PID/ns/net`), through `nsenter`.
#[derive(Clone, Debug, Default)]
pub enum CurlAt {
    /// This machine's network namespace.
    #[default]
    Here,
    /// The network namespace at this path.
    Netns(PathBuf),
    /// This machine's, with curl trusting the CA certificate at this path
    /// for an HTTPS proxy (`--proxy-cacert`).
    HereTrustingProxyCa(PathBuf),
}

impl CurlAt {
    /// A `curl` command there: add arguments, then run or spawn it.
    pub fn command(&self) -> Command {
        match self {
            Self::Here => Command::new("curl"),
            Self::Netns(path) => {
                let mut command = Command::new("nsenter");
                command.arg(format!("--net={}", path.display())).arg("curl");
                command
            }
            Self::HereTrustingProxyCa(ca) => {
                let mut command = Command::new("curl");
                command.arg("--proxy-cacert").arg(ca);
                command
            }
        }
    }
}

/// A curl that uploads `file` to the origin's echo endpoint through `proxy`
/// slowly, so the tunnel streams both ways for many seconds.
pub fn streaming_echo(
    proxy: &str,
    url: &str,
    file: &std::path::Path,
    out: &std::path::Path,
    tunnel: bool,
) -> Child {
    streaming_echo_at(&CurlAt::Here, proxy, url, file, out, tunnel)
}

/// [`streaming_echo`], with curl running `at`.
pub fn streaming_echo_at(
    at: &CurlAt,
    proxy: &str,
    url: &str,
    file: &std::path::Path,
    out: &std::path::Path,
    tunnel: bool,
) -> Child {
    let mut command = at.command();
    command.args([
        "-s",
        "-S",
        "--max-time",
        "180",
        "--limit-rate",
        "1M",
        "-H",
        "Expect:",
        "--proxy",
        proxy,
    ]);
    if tunnel {
        command.arg("--proxytunnel");
    }
    command
        .arg("-T")
        .arg(file)
        .arg("-o")
        .arg(out)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("curl")
}

/// Runs batches of `parallel` short requests through `proxy` until `stop`;
/// returns (requests, failures).
pub fn steady_load(
    proxy: String,
    url: String,
    parallel: usize,
    stop: Arc<AtomicBool>,
) -> JoinHandle<(usize, Vec<String>)> {
    steady_load_at(CurlAt::Here, proxy, url, parallel, stop)
}

/// [`steady_load`], with curl running `at`.
pub fn steady_load_at(
    at: CurlAt,
    proxy: String,
    url: String,
    parallel: usize,
    stop: Arc<AtomicBool>,
) -> JoinHandle<(usize, Vec<String>)> {
    std::thread::spawn(move || {
        let mut total = 0;
        let mut failures = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let mut command = at.command();
            let parallel_max = parallel.to_string();
            command.args([
                "-s",
                "--no-progress-meter",
                "--parallel",
                "--parallel-immediate",
                "--parallel-max",
                &parallel_max,
                "--max-time",
                "60",
                "--proxy",
                &proxy,
                "-w",
                "%{http_code}\n",
            ]);
            for _ in 0..parallel * 3 {
                command.args(["-o", "/dev/null", &url]);
            }
            let output = command.stdin(Stdio::null()).output().expect("curl");
            for line in String::from_utf8_lossy(&output.stdout).lines() {
                total += 1;
                if line != "200" {
                    failures.push(line.to_string());
                }
            }
            if !output.status.success() {
                failures.push(format!(
                    "curl exit {}: {}",
                    output.status,
                    String::from_utf8_lossy(&output.stderr)
                ));
            }
        }
        (total, failures)
    })
}

/// Checks two `streaming_echo` tunnels (SOCKS5 and HTTP CONNECT): both still
/// streaming now (`what_outlasted`: what they had to outlast), then each ends
/// with success and echoes `size` bytes of [`crate::pattern`] exactly.
pub fn finish_echoes(
    tunnels: [(&mut Child, &std::path::Path, &str); 2],
    size: usize,
    what_outlasted: &str,
) {
    let mut tunnels = tunnels;
    for (child, _, what) in tunnels.iter_mut() {
        assert!(
            child.try_wait().expect("poll").is_none(),
            "the {what} transfer ended before the {what_outlasted} did"
        );
    }
    for (child, out, what) in tunnels {
        let status = child.wait().expect("curl");
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        assert!(status.success(), "{what} curl failed: {stderr}");
        let got = std::fs::read(out).expect("output");
        assert_eq!(got.len(), size, "{what} echo length");
        assert_eq!(
            crate::sha256(&got),
            crate::sha256(&crate::pattern(size)),
            "{what} echo bytes"
        );
    }
}
