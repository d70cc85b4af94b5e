//! The peers as processes: each started from its Debian package in the
//! foreground with its config in a temporary folder, on a free port, in a
//! process group of its own, killed (its group, and only it) when dropped;
//! and whose CPU time counts as the proxy's.

use std::ffi::OsString;
use std::fs::File;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// Whose CPU time counts as the proxy's.
#[derive(Debug, Clone)]
pub(super) enum CpuOf {
    /// No proxy (direct).
    Nothing,
    /// These processes (blipless: ingress and device plane).
    Processes(Vec<i32>),
    /// Every process in this process group, and the children they reaped.
    Group(i32),
}

impl CpuOf {
    /// CPU seconds so far; None for direct.
    pub(super) fn seconds(&self) -> Option<f64> {
        match self {
            CpuOf::Nothing => None,
            CpuOf::Processes(pids) => Some(
                pids.iter()
                    .filter_map(|pid| crate::procfs::cpu_seconds(&pid.to_string()))
                    .sum(),
            ),
            CpuOf::Group(group) => Some(group_cpu_seconds(*group)),
        }
    }
}

/// utime + stime + cutime + cstime of every process whose process group is
/// `group` (a child that exited and was reaped counts in its parent's
/// cutime/cstime; a live one only in its own utime/stime).
pub fn group_cpu_seconds(group: i32) -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    let mut ticks = 0u64;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some((pgrp, used)) = parse_group_stat(&stat) {
            if pgrp == group {
                ticks += used;
            }
        }
    }
    // USER_HZ is 100 on Linux.
    ticks as f64 / 100.0
}

/// The process group and utime + stime + cutime + cstime (ticks) of a
/// /proc/PID/stat line.
pub(super) fn parse_group_stat(stat: &str) -> Option<(i32, u64)> {
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let pgrp = fields.get(2)?.parse().ok()?;
    let mut used = 0u64;
    for index in 11..=14 {
        // cutime and cstime are signed in the kernel's format.
        used += fields.get(index)?.parse::<i64>().ok()?.max(0) as u64;
    }
    Some((pgrp, used))
}

/// Whether a /proc/PID/stat line is a zombie's (state `Z`).
pub(super) fn is_zombie(stat: &str) -> bool {
    stat.rfind(')')
        .and_then(|end| stat.get(end + 2..end + 3))
        .is_some_and(|state| state == "Z")
}

/// The live processes (zombies aside) left in process group `group`.
pub(super) fn group_members(group: i32) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|entry| {
            let name = entry.file_name();
            name.to_str()
                .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
                .filter(|stat| !is_zombie(stat))
                .and_then(|stat| parse_group_stat(&stat))
                .is_some_and(|(pgrp, _)| pgrp == group)
        })
        .count()
}

/// A peer started by this bench: the foreground process, leader of a process
/// group of its own; the whole group is killed when dropped.
#[derive(Debug)]
pub(super) struct Peer {
    name: &'static str,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Peer {
    /// Starts `program` with `args` in the foreground (stdout and stderr
    /// into `output.log` in `dir`), in a process group of its own, and waits
    /// until every address of `listens` accepts connections.
    pub(super) fn start(
        name: &'static str,
        program: &Path,
        args: &[OsString],
        dir: tempfile::TempDir,
        listens: &[SocketAddr],
    ) -> Result<Peer, String> {
        let log = dir.path().join("output.log");
        let stdout = File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let stderr = stdout
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let child = Command::new(program)
            .args(args)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", program.display()))?;
        let mut peer = Peer {
            name,
            child: Some(child),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(Ok(Some(status))) = peer.child.as_mut().map(Child::try_wait) {
                return Err(format!(
                    "{name} exited ({status}) before listening: {}",
                    peer.output()
                ));
            }
            if listens
                .iter()
                .all(|a| TcpStream::connect_timeout(a, Duration::from_millis(300)).is_ok())
            {
                return Ok(peer);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{name} did not listen on {listens:?} within 15 s: {}",
                    peer.output()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Its process group (the leader's pid).
    pub(super) fn group(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// The last lines it printed.
    pub(super) fn output(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("output.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(20).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// SIGTERM to its group, SIGKILL to what is left after 3 s; reaps the
    /// leader. Returns what it did, for the report.
    pub(super) fn stop(&mut self) -> String {
        let Some(mut child) = self.child.take() else {
            return String::new();
        };
        use nix::sys::signal::{killpg, Signal};
        let group = child.id() as i32;
        let pgid = nix::unistd::Pid::from_raw(group);
        let _ = killpg(pgid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut killed = false;
        loop {
            let _ = child.try_wait();
            if group_members(group) == 0 {
                break;
            }
            if Instant::now() >= deadline {
                let _ = killpg(pgid, Signal::SIGKILL);
                killed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        format!(
            "{}: SIGTERM{} to process group {group}",
            self.name,
            if killed { " then SIGKILL" } else { "" }
        )
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A program on PATH or in the sbin folders.
pub(super) fn program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.extend(["/usr/sbin", "/usr/bin", "/sbin", "/usr/local/sbin"].map(PathBuf::from));
    dirs.into_iter()
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// A Debian package's installed version, or "not installed".
pub fn package_version(package: &str) -> String {
    Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", package])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success() && !o.stdout.is_empty())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "not installed".into())
}

pub(super) fn temp_dir(name: &str) -> Result<tempfile::TempDir, String> {
    tempfile::Builder::new()
        .prefix(&format!("blipless-peers-{name}"))
        .tempdir()
        .map_err(|e| format!("a temporary folder: {e}"))
}

pub(super) fn free_address() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], blipless_tests::free_port()))
}

/// The username and password the peers that take credentials are given.
pub(super) const PEER_USER: &str = "bench";

pub(super) fn peer_password() -> String {
    let mut bytes = [0u8; 12];
    let _ = std::io::Read::read_exact(
        &mut File::open("/dev/urandom").expect("/dev/urandom"),
        &mut bytes,
    );
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where each origin is: the tiny one (connection rate) and the streaming
/// one (bulk).
#[derive(Debug, Clone, Copy)]
pub(super) struct Targets {
    pub(super) tiny: SocketAddr,
    pub(super) stream: SocketAddr,
}

pub(super) fn start_microsocks(password: &str) -> Result<(Peer, SocketAddr), String> {
    let binary = program("microsocks").ok_or("microsocks is not installed")?;
    let address = free_address();
    let args: Vec<OsString> = [
        "-i",
        "127.0.0.1",
        "-p",
        &address.port().to_string(),
        "-u",
        PEER_USER,
        "-P",
        password,
    ]
    .map(OsString::from)
    .to_vec();
    let peer = Peer::start(
        "microsocks",
        &binary,
        &args,
        temp_dir("microsocks")?,
        &[address],
    )?;
    Ok((peer, address))
}

pub(super) fn start_tinyproxy(
    password: &str,
    targets: Targets,
) -> Result<(Peer, SocketAddr), String> {
    let binary = program("tinyproxy").ok_or("tinyproxy is not installed")?;
    let dir = temp_dir("tinyproxy")?;
    let address = free_address();
    let config = dir.path().join("tinyproxy.conf");
    let text = format!(
        "# Written by blipless-bench-peers.\n\
         User nobody\n\
         Group nogroup\n\
         Port {port}\n\
         Listen 127.0.0.1\n\
         Timeout 60\n\
         MaxClients 1024\n\
         LogLevel Error\n\
         DisableViaHeader Yes\n\
         BasicAuth {PEER_USER} {password}\n\
         ConnectPort {tiny}\n\
         ConnectPort {stream}\n",
        port = address.port(),
        tiny = targets.tiny.port(),
        stream = targets.stream.port(),
    );
    std::fs::write(&config, text).map_err(|e| format!("{}: {e}", config.display()))?;
    let args = vec![OsString::from("-d"), OsString::from("-c"), config.into()];
    let peer = Peer::start("tinyproxy", &binary, &args, dir, &[address])?;
    Ok((peer, address))
}

/// haproxy in TCP mode: two frontends, one per origin.
pub(super) fn start_haproxy(targets: Targets) -> Result<(Peer, Targets), String> {
    let binary = program("haproxy").ok_or("haproxy is not installed")?;
    let dir = temp_dir("haproxy")?;
    let listen = Targets {
        tiny: free_address(),
        stream: free_address(),
    };
    let config = dir.path().join("haproxy.cfg");
    let text = format!(
        "# Written by blipless-bench-peers.\n\
         global\n    maxconn 4096\n\
         defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 60s\n    timeout server 60s\n\
         listen tiny\n    bind {}\n    server origin {}\n\
         listen stream\n    bind {}\n    server origin {}\n",
        listen.tiny, targets.tiny, listen.stream, targets.stream
    );
    std::fs::write(&config, text).map_err(|e| format!("{}: {e}", config.display()))?;
    let args = vec![OsString::from("-db"), OsString::from("-f"), config.into()];
    let peer = Peer::start(
        "haproxy",
        &binary,
        &args,
        dir,
        &[listen.tiny, listen.stream],
    )?;
    Ok((peer, listen))
}

/// nginx with its stream module: two servers, one per origin.
pub(super) fn start_nginx(targets: Targets) -> Result<(Peer, Targets), String> {
    let binary = program("nginx").ok_or("nginx is not installed")?;
    if !Path::new(NGINX_STREAM_MODULE).is_file() {
        return Err(format!(
            "{NGINX_STREAM_MODULE} is missing (install libnginx-mod-stream)"
        ));
    }
    let dir = temp_dir("nginx")?;
    let listen = Targets {
        tiny: free_address(),
        stream: free_address(),
    };
    let config = dir.path().join("nginx.conf");
    let text = format!(
        "# Written by blipless-bench-peers.\n\
         load_module {NGINX_STREAM_MODULE};\n\
         daemon off;\n\
         user nobody nogroup;\n\
         worker_processes auto;\n\
         pid {pid};\n\
         error_log {log} warn;\n\
         events {{ worker_connections 8192; }}\n\
         stream {{\n\
         \x20   server {{ listen {}; proxy_pass {}; }}\n\
         \x20   server {{ listen {}; proxy_pass {}; }}\n\
         }}\n",
        listen.tiny,
        targets.tiny,
        listen.stream,
        targets.stream,
        pid = dir.path().join("nginx.pid").display(),
        log = dir.path().join("error.log").display(),
    );
    std::fs::write(&config, text).map_err(|e| format!("{}: {e}", config.display()))?;
    let args = vec![
        OsString::from("-p"),
        dir.path().as_os_str().to_owned(),
        OsString::from("-e"),
        dir.path().join("error.log").into_os_string(),
        OsString::from("-c"),
        config.into_os_string(),
    ];
    let peer = Peer::start("nginx", &binary, &args, dir, &[listen.tiny, listen.stream])?;
    Ok((peer, listen))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_group_and_all_four_times() {
        let line = "1234 (nginx: worker (x)) S 1 77 4 5 6 7 8 9 10 11 250 75 3 2 20 0 4 0 100\n";
        assert_eq!(parse_group_stat(line), Some((77, 330)));
        assert_eq!(parse_group_stat("1234 (x) S 1 2"), None);
        assert!(!is_zombie(line));
        assert!(is_zombie("99 (nginx) Z 1 2 77"));
        let own = nix::unistd::getpgrp().as_raw();
        assert!(group_members(own) >= 1);
    }
}
