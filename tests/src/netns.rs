//! Network namespaces for end-to-end tests that need real routing (the
//! WireGuard tests and their baseline): a test builds a small topology
//! ("customer", "server", "internet" ...) out of namespaces it creates and
//! removes, joined by veth pairs, and runs real programs inside them.
//!
//! Everything runs as root (see [`require_root`]: tests fail, never skip)
//! and only ever touches namespaces this harness created (named
//! `bl-<pid>-<counter>-<role>`) and their addresses: the host's own network
//! namespace is never changed.
//!
//! - [`Netns`]: one namespace, `lo` up; dropping it kills every process
//!   still inside and deletes it.
//! - [`veth`]: a veth pair straight between two namespaces, addressed and up.
//! - [`Background`]: a long-running process (in a namespace or not) whose
//!   output is kept for error messages, stopped when dropped.
//! - [`start_origin`]: `blipless-test-origin` inside a namespace.
//! - [`run`] / [`output`]: run a command, get its stdout or an error that
//!   says what ran and what it wrote on stderr.

use std::ffi::OsStr;
use std::io::{self, BufRead as _, BufReader, Read, Write as _};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

/// Every namespace name this harness creates starts with this.
pub const PREFIX: &str = "bl-";

/// Serializes `ip netns add`/`del` within this process: concurrent first
/// calls can race on mounting `/run/netns`.
static NETNS_LOCK: Mutex<()> = Mutex::new(());
static COUNTER: AtomicUsize = AtomicUsize::new(0);
static STALE: Once = Once::new();

/// Panics with a clear message unless this process runs as root (the
/// namespace tests need it; they must fail, not silently skip).
pub fn require_root() {
    let uid = nix::unistd::geteuid();
    assert!(
        uid.is_root(),
        "this test creates network namespaces and must run as root (euid is {uid}); \
         run `make test` as root, or `sudo -E cargo test -p blipless-tests`"
    );
}

/// A number unique within this process (for names of namespaces,
/// interfaces, ...).
pub fn unique() -> usize {
    COUNTER.fetch_add(1, Ordering::SeqCst)
}

/// How a command is shown in error messages: program and arguments.
pub fn describe(command: &Command) -> String {
    let mut text = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

/// Runs `command` to its end (stdin empty) and returns its stdout; an error
/// names the command, its exit status and its stderr.
pub fn output(command: &mut Command) -> io::Result<Vec<u8>> {
    output_with_input(command, None)
}

/// [`output`] as (lossy) UTF-8 text.
pub fn run(command: &mut Command) -> io::Result<String> {
    output(command).map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

/// [`run`], feeding `input` on the command's stdin.
pub fn run_with_input(command: &mut Command, input: &str) -> io::Result<String> {
    output_with_input(command, Some(input.as_bytes()))
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

fn output_with_input(command: &mut Command, input: Option<&[u8]>) -> io::Result<Vec<u8>> {
    let what = describe(command);
    command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("starting `{what}`: {e}")))?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        // A command that exits without reading all of it reports its own error.
        let _ = stdin.write_all(input);
    }
    let out = child
        .wait_with_output()
        .map_err(|e| io::Error::new(e.kind(), format!("waiting for `{what}`: {e}")))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "`{what}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(out.stdout)
}

/// The network namespaces that exist now (`ip netns list`), by name.
pub fn list_namespaces() -> io::Result<Vec<String>> {
    let text = run(Command::new("ip").args(["netns", "list"]))?;
    Ok(text
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// Removes namespaces this harness left behind in an earlier run that was
/// killed before it could clean up: `bl-<pid>-...` whose process is gone.
/// Runs once per process, on the first [`Netns::new`].
pub fn remove_stale_namespaces() {
    let Ok(names) = list_namespaces() else {
        return;
    };
    for name in names {
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            remove_namespace(&name);
        }
    }
}

/// Kills every process in namespace `name`, then deletes it. Best effort,
/// never panics; reports problems on stderr.
fn remove_namespace(name: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pids = pids_in(name);
        if pids.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            eprintln!("netns {name}: processes {pids:?} still inside after SIGKILL");
            break;
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _guard = NETNS_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(e) = run(Command::new("ip").args(["netns", "del", name])) {
        eprintln!("netns {name}: {e}");
    }
    // What [`Netns::write_hosts`] made, if anything (`/etc/netns` too,
    // once empty).
    let _ = std::fs::remove_dir_all(etc_netns(name));
    let _ = std::fs::remove_dir("/etc/netns");
}

/// `/etc/netns/<name>`: the files `ip netns exec` mounts over `/etc`'s.
fn etc_netns(name: &str) -> std::path::PathBuf {
    std::path::Path::new("/etc/netns").join(name)
}

/// The processes in namespace `name` (empty when there are none or on error).
fn pids_in(name: &str) -> Vec<i32> {
    run(Command::new("ip").args(["netns", "pids", name]))
        .map(|text| {
            text.split_whitespace()
                .filter_map(|pid| pid.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// One network namespace, `bl-<pid>-<counter>-<role>`, with `lo` up.
/// Dropping it kills every process still inside and deletes it.
#[derive(Debug)]
pub struct Netns {
    name: String,
    role: String,
}

impl Netns {
    /// Creates a namespace for `role` (letters, digits, `_`; shows in the
    /// name) and brings its loopback up.
    pub fn new(role: &str) -> io::Result<Self> {
        if role.is_empty() || !role.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("namespace role {role:?}: use letters, digits and _"),
            ));
        }
        STALE.call_once(remove_stale_namespaces);
        let name = format!("{PREFIX}{}-{}-{role}", std::process::id(), unique());
        {
            let _guard = NETNS_LOCK.lock().unwrap_or_else(|p| p.into_inner());
            run(Command::new("ip").args(["netns", "add", &name]))?;
        }
        // From here on, Drop removes it whatever fails next.
        let netns = Self {
            name,
            role: role.to_string(),
        };
        netns.ip(&["link", "set", "lo", "up"])?;
        Ok(netns)
    }

    /// Its name (for `ip netns exec` / `ip -n`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The role it was created for.
    pub fn role(&self) -> &str {
        &self.role
    }

    /// `ip netns exec NAME program`: add arguments, then run or spawn it.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name]).arg(program);
        command
    }

    /// Runs `program args...` inside; returns its stdout as text.
    pub fn exec(&self, program: &str, args: &[&str]) -> io::Result<String> {
        run(self.command(program).args(args))
    }

    /// Runs `program args...` inside; returns its stdout as bytes.
    pub fn exec_bytes(&self, program: &str, args: &[&str]) -> io::Result<Vec<u8>> {
        output(self.command(program).args(args))
    }

    /// Writes `text` as the namespace's own `/etc/hosts`, which what starts
    /// after through [`Netns::command`] sees (`ip netns exec` mounts
    /// `/etc/netns/NAME/hosts` over it). Written again in place, it changes
    /// under what runs already: the mount is of the file, not of the name.
    /// Removed with the namespace.
    pub fn write_hosts(&self, text: &str) -> io::Result<()> {
        let dir = etc_netns(&self.name);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("hosts"), text)
    }

    /// Runs `ip -n NAME args...`; returns its stdout.
    pub fn ip(&self, args: &[&str]) -> io::Result<String> {
        run(Command::new("ip").args(["-n", &self.name]).args(args))
    }

    /// One of the kernel's counters in this namespace's `/proc/net/snmp`, as
    /// `group` and `field` (`"Icmp"`, `"InEchos"`): a count taken where the
    /// packets arrive, whatever became of them afterwards.
    pub fn snmp_counter(&self, group: &str, field: &str) -> io::Result<u64> {
        let table = self.exec("cat", &["/proc/net/snmp"])?;
        let prefix = format!("{group}:");
        let mut rows = table.lines().filter(|line| line.starts_with(&prefix));
        let (names, values) = (rows.next(), rows.next());
        let missing = || io::Error::other(format!("no {group} {field} in /proc/net/snmp"));
        let (names, values) = names.zip(values).ok_or_else(missing)?;
        names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(name, _)| *name == field)
            .and_then(|(_, value)| value.parse().ok())
            .ok_or_else(missing)
    }

    /// `sysctl -w key=value` inside (e.g. `net.ipv4.ip_forward`, `1`).
    pub fn set_sysctl(&self, key: &str, value: &str) -> io::Result<()> {
        self.exec("sysctl", &["-q", "-w", &format!("{key}={value}")])
            .map(drop)
    }

    /// Turns on IPv4 and IPv6 forwarding inside (a router namespace).
    pub fn enable_forwarding(&self) -> io::Result<()> {
        self.set_sysctl("net.ipv4.ip_forward", "1")?;
        self.set_sysctl("net.ipv6.conf.all.forwarding", "1")
    }

    /// Source-NATs (nftables masquerade) everything leaving by
    /// `out_interface`, IPv4 and IPv6.
    pub fn masquerade(&self, out_interface: &str) -> io::Result<()> {
        let script = format!(
            "table inet blipless_nat {{\n  chain postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;\n    oifname \"{out_interface}\" masquerade\n  }}\n}}\n"
        );
        run_with_input(self.command("nft").args(["-f", "-"]), &script).map(drop)
    }

    /// `ip route add DESTINATION via GATEWAY` inside.
    pub fn route_via(&self, destination: &str, gateway: &str) -> io::Result<()> {
        self.ip(&["route", "add", destination, "via", gateway])
            .map(drop)
    }

    /// `ip route add DESTINATION dev DEVICE` inside.
    pub fn route_dev(&self, destination: &str, device: &str) -> io::Result<()> {
        self.ip(&["route", "add", destination, "dev", device])
            .map(drop)
    }

    /// The processes inside now.
    pub fn pids(&self) -> Vec<i32> {
        pids_in(&self.name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        remove_namespace(&self.name);
    }
}

/// The two ends of a veth pair made by [`veth`].
#[derive(Debug, Clone)]
pub struct Veth {
    /// The interface name in the first namespace.
    pub a: String,
    /// The interface name in the second namespace.
    pub b: String,
}

/// Creates a veth pair between `a` and `b` (made in `a` with its peer put
/// straight into `b`, so it never appears in the host namespace), gives the
/// ends `a_addr` and `b_addr` (CIDR, e.g. "10.1.0.1/24") and brings both up.
/// The pair disappears with either namespace.
pub fn veth(a: &Netns, a_addr: &str, b: &Netns, b_addr: &str) -> io::Result<Veth> {
    let n = unique();
    let pair = Veth {
        a: format!("ve{n}a"),
        b: format!("ve{n}b"),
    };
    a.ip(&[
        "link", "add", &pair.a, "type", "veth", "peer", "name", &pair.b, "netns", &b.name,
    ])?;
    a.ip(&["addr", "add", a_addr, "dev", &pair.a])?;
    b.ip(&["addr", "add", b_addr, "dev", &pair.b])?;
    a.ip(&["link", "set", &pair.a, "up"])?;
    b.ip(&["link", "set", &pair.b, "up"])?;
    Ok(pair)
}

/// The most output a [`Background`] keeps (the latest bytes).
const OUTPUT_LIMIT: usize = 256 * 1024;

/// A long-running process with its stdout and stderr collected (the latest
/// 256 KiB, for error messages); stopped (SIGTERM, then SIGKILL after 2 s)
/// when dropped.
#[derive(Debug)]
pub struct Background {
    child: Child,
    what: String,
    output: Arc<Mutex<String>>,
}

impl Background {
    /// Spawns `command` (e.g. from [`Netns::command`]). With `ready`, waits
    /// up to `timeout` for a stdout line containing it; an error carries the
    /// output so far (and the process is stopped).
    pub fn spawn(mut command: Command, ready: Option<&str>, timeout: Duration) -> io::Result<Self> {
        let what = describe(&command);
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("starting `{what}`: {e}")))?;
        let output = Arc::new(Mutex::new(String::new()));
        let (lines, ready_lines) = mpsc::channel();
        if let Some(stdout) = child.stdout.take() {
            collect(stdout, output.clone(), Some(lines));
        }
        if let Some(stderr) = child.stderr.take() {
            collect(stderr, output.clone(), None);
        }
        let mut process = Self {
            child,
            what,
            output,
        };
        let Some(ready) = ready else {
            return Ok(process);
        };
        let deadline = Instant::now() + timeout;
        loop {
            match ready_lines.recv_timeout(Duration::from_millis(50)) {
                Ok(line) if line.contains(ready) => return Ok(process),
                Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = process.child.wait().ok();
                    return Err(
                        process.error(&format!("exited ({status:?}) before printing {ready:?}"))
                    );
                }
            }
            if let Ok(Some(status)) = process.child.try_wait() {
                return Err(process.error(&format!("exited ({status}) before printing {ready:?}")));
            }
            if Instant::now() >= deadline {
                process.stop();
                return Err(process.error(&format!("did not print {ready:?} within {timeout:?}")));
            }
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Its stdout and stderr so far (interleaved by line, latest 256 KiB).
    pub fn output(&self) -> String {
        self.output
            .lock()
            .map(|o| o.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// An error about this process, with its output.
    pub fn error(&self, message: &str) -> io::Error {
        io::Error::other(format!(
            "`{}` {message}; its output:\n{}",
            self.what,
            self.output()
        ))
    }

    /// SIGTERM, up to 2 s to exit, then SIGKILL; reaps it.
    pub fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            if let Ok(pid) = i32::try_from(self.child.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            let deadline = Instant::now() + Duration::from_secs(2);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Reads `stream` by line into `output` (keeping the latest
/// [`OUTPUT_LIMIT`] bytes), passing each line to `lines` when given.
fn collect(
    stream: impl Read + Send + 'static,
    output: Arc<Mutex<String>>,
    lines: Option<mpsc::Sender<String>>,
) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
            let text = String::from_utf8_lossy(&line).into_owned();
            if let Ok(mut output) = output.lock() {
                output.push_str(&text);
                if output.len() > OUTPUT_LIMIT {
                    let mut cut = output.len() - OUTPUT_LIMIT;
                    while !output.is_char_boundary(cut) {
                        cut += 1;
                    }
                    output.drain(..cut);
                }
            }
            if let Some(lines) = &lines {
                let _ = lines.send(text);
            }
            line.clear();
        }
    });
}

/// Starts `blipless-test-origin` (the harness origin, see
/// [`crate::origin`]) inside `netns`, listening on `listen`, and waits until
/// it is ready. `cargo test -p blipless-tests` builds the binary; it is
/// looked up like the daemons ([`crate::binary`]).
pub fn start_origin(netns: &Netns, listen: SocketAddr) -> io::Result<Background> {
    let mut command = netns.command(crate::binary("blipless-test-origin"));
    command.args(["--listen", &listen.to_string()]);
    Background::spawn(command, Some("listening on"), Duration::from_secs(10))
}
