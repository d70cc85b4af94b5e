//! Dante's SOCKS5 server (Debian's `dante-server`, whose binary is
//! `/usr/sbin/danted`; upstream calls it `sockd`) as an *upstream* SOCKS5
//! provider for the device plane to egress through.
//!
//! Each [`Dante`] runs its own server in the foreground (never `-D`) on a
//! free loopback port, with its config, pid file and log in a temporary
//! folder, in a process group of its own so that [`Dante::kill`] takes its
//! children (monitor, negotiate, request and io processes) down with it.
//! Outgoing connections leave from the `external` address it was given (an
//! IPv4 loopback address such as 127.0.0.3), so an origin's `/whoami` tells
//! that traffic came through dante.
//!
//! Dante's `username` method (RFC 1929) checks the system's accounts, so
//! [`Dante::start`] creates a system user of its own (`blipdante<pid>_<n>`,
//! no home, no login shell) with a random password, and Drop removes it.
//! Users left by a test process that died (SIGKILL) are removed the next
//! time a test of this harness starts. All of this needs root.
//!
//! [`Dante::start_accepting_any_login`] instead takes ANY username and
//! password (socksmethod `pam.username` with a PAM service of its own,
//! `/etc/pam.d/blipdante<pid>_<n>`, that is only `pam_permit`), so a test
//! can see the usernames a client sends ([`Dante::logged_usernames`]), e.g.
//! an upstream username template's sticky session. Drop removes the PAM
//! service file; stale ones of dead test processes are removed like users.

use std::fs::File;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use crate::free_port;

/// The prefix of the system users this harness creates (and of its PAM
/// service files in [`PAM_DIR`]).
pub const USER_PREFIX: &str = "blipdante";

/// Where PAM service files live.
pub const PAM_DIR: &str = "/etc/pam.d";

/// How a dante server authenticates its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Auth {
    /// socksmethod none.
    None,
    /// socksmethod username: a system user of its own.
    SystemUser,
    /// socksmethod pam.username with a PAM service that permits anything.
    AnyLogin,
}

/// Serializes useradd/chpasswd/userdel within this process (they lock the
/// password files and fail, rather than wait, when another holds the lock).
static ACCOUNTS: Mutex<()> = Mutex::new(());
static COUNTER: AtomicUsize = AtomicUsize::new(0);
static STALE: Once = Once::new();

/// A dante server (running, or killed between [`Dante::kill`] and
/// [`Dante::restart`]); killed, and its user removed, when dropped.
#[derive(Debug)]
pub struct Dante {
    /// Where it accepts SOCKS5 clients (127.0.0.1, a free port).
    pub address: SocketAddr,
    /// The RFC 1929 username (empty without authentication).
    pub username: String,
    /// The RFC 1929 password (empty without authentication).
    pub password: String,
    /// The address its outgoing connections leave from.
    pub external: Ipv4Addr,
    child: Option<Child>,
    dir: tempfile::TempDir,
    config: PathBuf,
    user: Option<String>,
    /// The PAM service file of [`Dante::start_accepting_any_login`].
    pam_service: Option<PathBuf>,
}

impl Dante {
    /// Dante on a free loopback port, username/password (RFC 1929)
    /// required, egressing from `external`.
    pub fn start(external: Ipv4Addr) -> Dante {
        Self::new(external, Auth::SystemUser)
    }

    /// Dante on a free loopback port with no authentication (socksmethod
    /// none), egressing from `external`.
    pub fn start_without_auth(external: Ipv4Addr) -> Dante {
        Self::new(external, Auth::None)
    }

    /// Dante on a free loopback port that requires username/password
    /// (RFC 1929) but accepts ANY username and password (PAM with
    /// `pam_permit`), egressing from `external`, and logs the username of
    /// every connection. [`Dante::username`] and [`Dante::password`] are one
    /// such pair (so [`Dante::url`] works); a client may send any other.
    pub fn start_accepting_any_login(external: Ipv4Addr) -> Dante {
        Self::new(external, Auth::AnyLogin)
    }

    fn new(external: Ipv4Addr, auth: Auth) -> Dante {
        let uid = nix::unistd::geteuid();
        assert!(
            uid.is_root(),
            "the dante harness creates system users and must run as root (euid is {uid}); \
             run `make test` as root, or `sudo -E cargo test -p blipless-tests`"
        );
        let dir = tempfile::Builder::new()
            .prefix("dante")
            .tempdir()
            .expect("temporary folder");
        if auth != Auth::None {
            STALE.call_once(remove_stale_users);
        }
        let unique = || {
            format!(
                "{USER_PREFIX}{}_{}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::SeqCst)
            )
        };
        let mut pam_service = None;
        let (username, password, user) = match auth {
            Auth::SystemUser => {
                let name = unique();
                let password = hex::encode(random_bytes(12));
                create_user(&name, &password);
                (name.clone(), password, Some(name))
            }
            Auth::AnyLogin => {
                let service = unique();
                let path = Path::new(PAM_DIR).join(&service);
                std::fs::write(
                    &path,
                    "# Written by blipless-tests (tests/src/dante.rs): any login passes.\n\
                     auth sufficient pam_permit.so\n\
                     account sufficient pam_permit.so\n",
                )
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
                pam_service = Some(path);
                ("anyone".to_owned(), hex::encode(random_bytes(12)), None)
            }
            Auth::None => (String::new(), String::new(), None),
        };
        let address = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let config = dir.path().join("sockd.conf");
        let (method, rule_extra) = match (auth, &pam_service) {
            (Auth::SystemUser, _) => ("username", String::new()),
            (Auth::AnyLogin, Some(path)) => (
                "pam.username",
                format!(
                    "    pam.servicename: {}\n",
                    path.file_name().unwrap_or_default().to_string_lossy()
                ),
            ),
            _ => ("none", String::new()),
        };
        let text = format!(
            "# Written by blipless-tests (tests/src/dante.rs).\n\
             logoutput: {log}\n\
             internal: 127.0.0.1 port = {port}\n\
             external: {external}\n\
             socksmethod: {method}\n\
             user.privileged: root\n\
             user.unprivileged: nobody\n\
             user.libwrap: nobody\n\
             client pass {{\n    from: 0/0 to: 0/0\n    log: error\n}}\n\
             socks pass {{\n    from: 0/0 to: 0/0\n{rule_extra}    log: connect disconnect error\n}}\n",
            log = dir.path().join("sockd.log").display(),
            port = address.port(),
        );
        let mut dante = Dante {
            address,
            username,
            password,
            external,
            child: None,
            dir,
            config,
            user,
            pam_service,
        };
        // Drop removes the user (or PAM service) should anything below fail.
        std::fs::write(&dante.config, text).expect("writing sockd.conf");
        dante.restart();
        dante
    }

    /// The proxy URL with credentials: `socks5h://user:pass@127.0.0.1:port`
    /// (no credentials without authentication).
    pub fn url(&self) -> String {
        if self.username.is_empty() {
            format!("socks5h://{}", self.address)
        } else {
            format!(
                "socks5h://{}:{}@{}",
                self.username, self.password, self.address
            )
        }
    }

    /// The main process's id. Panics while killed.
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .map(Child::id)
            .expect("dante is not running (killed and not restarted)")
    }

    /// Whether it runs (started or restarted, not killed).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL to its process group (the main process and all its
    /// children, so relayed connections die too), as a crash would; waits
    /// for the main process to be gone. The user stays, for
    /// [`Dante::restart`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // The group is ours: the main process leads it (process_group(0)).
            let group = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts dante again on the same port, with the same config and user
    /// (after [`Dante::kill`]; kills a running one first), and waits until
    /// it accepts connections.
    pub fn restart(&mut self) {
        self.kill();
        let binary = binary();
        let stderr = File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("stderr.log"))
            .expect("dante's stderr file");
        let stdout = stderr.try_clone().expect("dante's stdout file");
        let mut command = Command::new(&binary);
        command
            .arg("-f")
            .arg(&self.config)
            .arg("-p")
            .arg(self.dir.path().join("sockd.pid"))
            .args(["-N", "1"])
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0);
        let child = command.spawn().unwrap_or_else(|e| {
            panic!(
                "starting {} ({e}): install dante-server (`make test` does)",
                binary.display()
            )
        });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                panic!(
                    "dante exited ({status}) before listening on {}: {}",
                    self.address,
                    self.log_text()
                );
            }
            if TcpStream::connect_timeout(&self.address, Duration::from_millis(500)).is_ok() {
                return;
            }
            if Instant::now() >= deadline {
                self.kill();
                panic!(
                    "dante did not listen on {} within 30 s: {}",
                    self.address,
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGSTOP to its process group: it keeps its sockets (the kernel still
    /// completes TCP handshakes into its backlog) but answers nothing and
    /// relays nothing, as a hung upstream does. [`Dante::thaw`] resumes it.
    pub fn freeze(&self) {
        self.signal_group(nix::sys::signal::Signal::SIGSTOP);
    }

    /// SIGCONT to its process group, after [`Dante::freeze`].
    pub fn thaw(&self) {
        self.signal_group(nix::sys::signal::Signal::SIGCONT);
    }

    fn signal_group(&self, signal: nix::sys::signal::Signal) {
        let group = nix::unistd::Pid::from_raw(self.pid() as i32);
        nix::sys::signal::killpg(group, signal)
            .unwrap_or_else(|e| panic!("{signal} to dante's process group: {e}"));
    }

    /// The log lines of the tunnels it opened (`tcp/connect [: ...`, one
    /// per connection, with `log: connect`), oldest first.
    pub fn logged_connects(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("sockd.log"))
            .unwrap_or_default()
            .lines()
            .filter(|line| line.contains("tcp/connect [:"))
            .map(str::to_owned)
            .collect()
    }

    /// The username of each tunnel it opened, oldest first (dante logs it
    /// as `username%NAME@client` or `pam.username%NAME@client`); none
    /// without authentication.
    pub fn logged_usernames(&self) -> Vec<String> {
        self.logged_connects()
            .iter()
            .filter_map(|line| {
                let (_, rest) = line.split_once("username%")?;
                let (name, _) = rest.split_once('@')?;
                Some(name.to_owned())
            })
            .collect()
    }

    /// The folder holding its config and logs.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Its log and its stderr so far, with the config, for error messages.
    pub fn log_text(&self) -> String {
        let read =
            |name: &str| std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        format!(
            "\n--- sockd.conf ---\n{}--- sockd.log ---\n{}--- stderr ---\n{}",
            read("sockd.conf"),
            read("sockd.log"),
            read("stderr.log")
        )
    }
}

impl Drop for Dante {
    fn drop(&mut self) {
        self.kill();
        if let Some(path) = self.pam_service.take() {
            if let Err(error) = std::fs::remove_file(&path) {
                eprintln!("dante harness: removing {}: {error}", path.display());
            }
        }
        if let Some(user) = self.user.take() {
            if let Err(error) = delete_user(&user) {
                // Not a panic in Drop (it may run while unwinding): the next
                // run removes stale users.
                eprintln!("dante harness: {error}");
            }
        }
    }
}

/// The dante server binary: Debian's `danted`, or upstream's `sockd`, on
/// PATH or in the sbin folders (which a non-root PATH may lack).
pub fn binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.extend(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from));
    for name in ["danted", "sockd"] {
        for dir in &dirs {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!("no dante server (danted or sockd): install dante-server (`make test` does)")
}

/// `n` bytes from the kernel's random source.
pub(crate) fn random_bytes(n: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; n];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("reading /dev/urandom");
    bytes
}

/// Runs an account command, retrying while another process holds the
/// password files' lock.
fn account_command(program: &str, args: &[&str], stdin: Option<&str>) -> Result<Output, String> {
    let _guard = ACCOUNTS.lock().unwrap_or_else(|p| p.into_inner());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .map_err(|e| format!("running {program}: {e}"))?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            use std::io::Write as _;
            pipe.write_all(text.as_bytes())
                .map_err(|e| format!("writing to {program}: {e}"))?;
        }
        let output = child
            .wait_with_output()
            .map_err(|e| format!("waiting for {program}: {e}"))?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() && stderr.contains("lock") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        return Ok(output);
    }
}

fn create_user(name: &str, password: &str) {
    let output = account_command(
        "useradd",
        &[
            "--system",
            "--no-create-home",
            "--no-user-group",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            "--comment",
            "blipless tests dante user",
            name,
        ],
        None,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        output.status.success(),
        "useradd {name} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let output = account_command("chpasswd", &[], Some(&format!("{name}:{password}\n")))
        .unwrap_or_else(|e| panic!("{e}"));
    if !output.status.success() {
        let _ = delete_user(name);
        panic!(
            "chpasswd for {name} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

fn delete_user(name: &str) -> Result<(), String> {
    let output = account_command("userdel", &[name], None)?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "userdel {name} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// Whether `name` (`blipdante<pid>_<n>`) was made by a test process that
/// is gone; false for any other name.
fn is_stale(name: &str) -> bool {
    let Some((pid, _)) = name
        .strip_prefix(USER_PREFIX)
        .and_then(|rest| rest.split_once('_'))
    else {
        return false;
    };
    let Ok(pid) = pid.parse::<i32>() else {
        return false;
    };
    let alive = pid == std::process::id() as i32
        || nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
    !alive
}

/// Removes the users and PAM service files of earlier test processes that
/// are gone (killed before their Drop could run).
fn remove_stale_users() {
    if let Ok(passwd) = std::fs::read_to_string("/etc/passwd") {
        for line in passwd.lines() {
            let name = line.split(':').next().unwrap_or_default();
            if is_stale(name) {
                if let Err(error) = delete_user(name) {
                    eprintln!("dante harness: removing a stale user: {error}");
                }
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(PAM_DIR) {
        for entry in entries.flatten() {
            if is_stale(&entry.file_name().to_string_lossy()) {
                if let Err(error) = std::fs::remove_file(entry.path()) {
                    eprintln!(
                        "dante harness: removing a stale PAM service {}: {error}",
                        entry.path().display()
                    );
                }
            }
        }
    }
}
