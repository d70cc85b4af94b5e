//! The stand-in with real processes: this test binary plays systemd (a
//! [`Listener`] as `NOTIFY_SOCKET`), the stand-in and its child. It runs
//! itself again with `--exact role_entry_point` and a role in
//! `BLIPLESS_SUPERVISE_TEST_ROLE`: without `BLIPLESS_SUPERVISED` it is the
//! stand-in (`blipless_supervise::run` on itself), with it (the stand-in
//! sets it) it is the child.

use std::ffi::OsString;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use blipless_supervise::notify::{Listener, Notification};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const ROLE: &str = "BLIPLESS_SUPERVISE_TEST_ROLE";
const PROBE: &str = "BLIPLESS_SUPERVISE_TEST_PROBE";

fn role_args() -> Vec<OsString> {
    ["--exact", "role_entry_point", "--nocapture", "--quiet"]
        .map(OsString::from)
        .to_vec()
}

/// Not a test of its own: the entry point of the stand-in and child roles.
#[test]
fn role_entry_point() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let exe = std::env::current_exe().expect("current_exe");
    if std::env::var_os("BLIPLESS_SUPERVISED").is_none() {
        std::process::exit(blipless_supervise::run(&exe, &role_args()));
    }
    match role.as_str() {
        "relay" => relay_child(),
        "idle" => {
            blipless_supervise::notify::status("idling").expect("status");
            // Bounded, so a failed test leaves nothing running for long.
            std::thread::sleep(Duration::from_secs(60));
            std::process::exit(0);
        }
        other => panic!("unknown role {other}"),
    }
}

/// Adopts the LISTEN_FDS descriptor, reports what it read, stores a pipe in
/// the fd store, says READY with a MAINPID the stand-in must drop, exits 7.
fn relay_child() {
    let taken = blipless_supervise::listen_fds::take().expect("LISTEN_FDS");
    let report = match taken.as_slice() {
        [(name, fd)] => {
            let mut text = String::new();
            std::fs::File::from(fd.try_clone().expect("dup"))
                .read_to_string(&mut text)
                .expect("reading the passed fd");
            format!("{name} {}", text.trim())
        }
        other => format!("{} fds", other.len()),
    };
    assert!(std::env::var_os("LISTEN_FDS").is_none());
    blipless_supervise::notify::status(&format!("probe {report}")).expect("status");
    let (read, write) = nix::unistd::pipe().expect("pipe");
    nix::unistd::write(&write, b"stored").expect("write");
    blipless_supervise::notify::store_fds("pipe", &[std::os::fd::AsFd::as_fd(&read)])
        .expect("store");
    blipless_supervise::notify::notify("READY=1\nMAINPID=1").expect("ready");
    std::process::exit(7);
}

/// The stand-in, started the way systemd starts it: `sh` opens the probe
/// file at fd 3, names it in LISTEN_FDS for its own pid and execs.
fn start(role: &str, notify: &Path, probe: &Path) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    Command::new("sh")
        .arg("-c")
        .arg("export LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=probe; exec \"$0\" \"$@\" 3<\"$BLIPLESS_SUPERVISE_TEST_PROBE\"")
        .arg(exe)
        .args(role_args())
        .env(ROLE, role)
        .env(PROBE, probe)
        .env("NOTIFY_SOCKET", notify)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("starting the stand-in")
}

fn setup() -> (tempfile::TempDir, Listener, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let listener = Listener::bind(&dir.path().join("notify.sock")).expect("bind");
    let probe = dir.path().join("probe");
    std::fs::write(&probe, "passed through\n").expect("probe");
    (dir, listener, probe)
}

fn next(listener: &Listener) -> Notification {
    listener
        .recv_timeout(Duration::from_secs(20))
        .expect("receiving")
        .expect("a notification within 20 s")
}

fn wait(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the stand-in did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn relays_state_and_stored_fds_as_itself_and_exits_with_the_child_s_code() {
    let (_dir, listener, probe) = setup();
    let mut stand_in = start("relay", listener.path(), &probe);
    let pid = i32::try_from(stand_in.id()).ok();

    let status = next(&listener);
    assert_eq!(status.state, "STATUS=probe probe passed through");
    assert_eq!(status.sender, pid, "relayed from the stand-in's pid");

    let store = next(&listener);
    assert_eq!(store.state, "FDSTORE=1\nFDNAME=pipe");
    assert_eq!(store.sender, pid);
    assert_eq!(store.fds.len(), 1);
    let mut text = String::new();
    std::fs::File::from(store.fds.into_iter().next().expect("fd"))
        .read_to_string(&mut text)
        .expect("reading the stored pipe");
    assert_eq!(text, "stored");

    let ready = next(&listener);
    assert_eq!(ready.state, "READY=1", "MAINPID is not relayed");
    assert_eq!(ready.sender, pid);

    let status = wait(&mut stand_in, Duration::from_secs(20));
    assert_eq!(status.code(), Some(7));
}

#[test]
fn a_restart_before_ready_stops_the_child() {
    let (_dir, listener, probe) = setup();
    let mut stand_in = start("idle", listener.path(), &probe);
    assert_eq!(next(&listener).state, "STATUS=idling");
    let pid = Pid::from_raw(i32::try_from(stand_in.id()).expect("pid"));
    kill(pid, Signal::SIGUSR2).expect("SIGUSR2");
    // The idle child dies of the SIGTERM it is passed: 128 + 15.
    let status = wait(&mut stand_in, Duration::from_secs(20));
    assert_eq!(status.code(), Some(143));
}

#[test]
fn sigint_is_passed_to_the_child() {
    let (_dir, listener, probe) = setup();
    let mut stand_in = start("idle", listener.path(), &probe);
    assert_eq!(next(&listener).state, "STATUS=idling");
    let pid = Pid::from_raw(i32::try_from(stand_in.id()).expect("pid"));
    kill(pid, Signal::SIGINT).expect("SIGINT");
    let status = wait(&mut stand_in, Duration::from_secs(20));
    assert_eq!(status.code(), Some(130));
}
