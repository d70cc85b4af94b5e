//! The `--supervise` stand-in with the real daemons, the test playing
//! systemd: a datagram socket with SO_PASSCRED as `NOTIFY_SOCKET`, signals
//! as `systemctl stop` (SIGTERM) and `systemctl restart` with the handoff
//! drop-in (SIGUSR2 to the main process only) send them.
//!
//! A daemon the stand-in leaves behind on a restart is reparented to this
//! test process (a child subreaper), so its exit status is checked too.

use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use blipless_supervise::notify::{Listener, Notification};
use blipless_tests::node::{Daemon, Node};
use blipless_tests::{binary, wait_until};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

const NOTIFY_WAIT: Duration = Duration::from_secs(30);

/// Starts `binary_name --supervise --config <node's>` with `NOTIFY_SOCKET`
/// (unless `notify` is None) and the harness's test environment.
fn start_supervised(
    node: &Node,
    binary_name: &str,
    notify: Option<&Path>,
    env: &[(&str, &str)],
) -> Daemon {
    let n = std::fs::read_dir(node.path()).map_or(0, |d| d.count());
    let log = node
        .path()
        .join(format!("{binary_name}-supervised-{n}.log"));
    let stderr = std::fs::File::create(&log).expect("log file");
    let mut command = Command::new(binary(binary_name));
    command
        .arg("--supervise")
        .arg("--config")
        .arg(&node.config)
        .env("BLIPLESS_LOG", "info,blipless_device=debug")
        .env("BLIPLESS_DRAIN_LAME_DUCK", "100ms")
        .env_remove("NOTIFY_SOCKET")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    if let Some(path) = notify {
        command.env("NOTIFY_SOCKET", path);
    }
    let child = command.spawn().expect("starting a stand-in");
    Daemon { child, log }
}

/// The daemon a stand-in started: its pid (read from the stand-in's log) is
/// its process group; killed with its group if the test fails.
struct Supervised {
    pid: Pid,
    done: bool,
}

impl Supervised {
    fn of(stand_in: &Daemon) -> Self {
        let mut pid = None;
        wait_until(
            Duration::from_secs(20),
            "the stand-in to say which pid it started",
            || {
                pid = stand_in.log_text().lines().find_map(|line| {
                    let (_, after) = line.split_once("--supervise: started ")?;
                    after.rsplit_once(" as pid ")?.1.trim().parse::<i32>().ok()
                });
                pid.is_some()
            },
        );
        let pid = Pid::from_raw(pid.unwrap_or_default());
        assert_ne!(pid, stand_in.pid(), "the daemon is a child process");
        Self { pid, done: false }
    }

    /// Asserts that the daemon is gone (its stand-in reaped it).
    fn assert_gone(&mut self) {
        assert!(!self.running(), "pid {} is still running", self.pid);
        self.done = true;
    }

    fn running(&self) -> bool {
        // A zombie still answers kill(0): reap it first if it is ours.
        let _ = waitpid(self.pid, Some(WaitPidFlag::WNOHANG));
        kill(self.pid, None).is_ok()
    }

    /// Waits for the daemon, reparented to this test after its stand-in
    /// left, to exit; its exit code.
    fn wait_orphan(&mut self, timeout: Duration) -> i32 {
        let deadline = Instant::now() + timeout;
        loop {
            match waitpid(self.pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(_, code)) => {
                    self.done = true;
                    return code;
                }
                Ok(WaitStatus::Signaled(_, signal, _)) => {
                    self.done = true;
                    return 128 + signal as i32;
                }
                _ => {}
            }
            assert!(
                Instant::now() < deadline,
                "pid {} did not exit within {timeout:?}",
                self.pid
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        if !self.done {
            let _ = kill(Pid::from_raw(-self.pid.as_raw()), Signal::SIGKILL);
            let _ = waitpid(self.pid, None);
        }
    }
}

/// The service manager's notification socket, in the node's folder.
fn systemd(node: &Node) -> Listener {
    Listener::bind(&node.path().join("notify.sock")).expect("binding the notify socket")
}

/// Waits for a notification with the line `line`; panics with what came instead.
fn expect_line(listener: &Listener, line: &str) -> Notification {
    let deadline = Instant::now() + NOTIFY_WAIT;
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match listener
            .recv_timeout(left)
            .expect("receiving a notification")
        {
            Some(n) if n.state.lines().any(|l| l == line) => return n,
            Some(n) => seen.push(n.state),
            None => break,
        }
    }
    panic!("no {line} within {NOTIFY_WAIT:?}; got {seen:?}");
}

fn exit_code(daemon: &mut Daemon, what: &str) -> i32 {
    let status: ExitStatus = daemon
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("{what} did not exit: {}", daemon.log_text()));
    status.code().unwrap_or(-1)
}

fn stand_in_pid(daemon: &Daemon) -> Option<i32> {
    i32::try_from(daemon.child.id()).ok()
}

#[test]
fn a_restart_leaves_the_ready_ingress_serving_until_it_is_stopped() {
    nix::sys::prctl::set_child_subreaper(true).expect("becoming a child subreaper");
    let node = Node::new("[drain]\ngrace = \"60s\"\n");
    let listener = systemd(&node);
    let mut stand_in = start_supervised(&node, "blipless-ingress", Some(listener.path()), &[]);
    let mut ingress = Supervised::of(&stand_in);

    let ready = expect_line(&listener, "READY=1");
    assert_eq!(
        ready.sender,
        stand_in_pid(&stand_in),
        "READY=1 comes from the main process"
    );
    assert!(
        ready.state.lines().any(|l| l == "STATUS=serving"),
        "{:?}",
        ready.state
    );
    let status = node.status_json();
    assert_eq!(
        status["ingress_pid"].as_i64(),
        Some(i64::from(ingress.pid.as_raw())),
        "{status}"
    );
    assert_eq!(node.status().0, 503, "serving, without a device plane");

    // systemctl restart: SIGUSR2 to the main process only.
    stand_in.signal(Signal::SIGUSR2);
    assert_eq!(exit_code(&mut stand_in, "the stand-in"), 0);
    std::thread::sleep(Duration::from_millis(500));
    assert!(ingress.running(), "the ingress waits for its successor");
    assert_eq!(node.status().0, 503, "and keeps serving");
    wait_until(
        Duration::from_secs(10),
        "the ingress to log SIGUSR2",
        || {
            stand_in
                .log_text()
                .contains("SIGUSR2: waiting for a successor")
        },
    );

    kill(ingress.pid, Signal::SIGTERM).expect("SIGTERM to the ingress");
    assert_eq!(ingress.wait_orphan(Duration::from_secs(30)), 0);
}

#[test]
fn an_ingress_no_successor_takes_over_from_drains_after_the_grace() {
    nix::sys::prctl::set_child_subreaper(true).expect("becoming a child subreaper");
    let node = Node::new("[drain]\ngrace = \"1s\"\n");
    let listener = systemd(&node);
    let mut stand_in = start_supervised(&node, "blipless-ingress", Some(listener.path()), &[]);
    let mut ingress = Supervised::of(&stand_in);
    expect_line(&listener, "READY=1");

    stand_in.signal(Signal::SIGUSR2);
    assert_eq!(exit_code(&mut stand_in, "the stand-in"), 0);
    assert_eq!(ingress.wait_orphan(Duration::from_secs(20)), 0);
    assert!(
        stand_in
            .log_text()
            .contains("no successor took over within drain.grace"),
        "{}",
        stand_in.log_text()
    );
}

#[test]
fn sigterm_passes_through_the_stand_in_and_both_exit_0() {
    let node = Node::new("");
    let listener = systemd(&node);
    let mut stand_in = start_supervised(&node, "blipless-ingress", Some(listener.path()), &[]);
    let mut ingress = Supervised::of(&stand_in);
    expect_line(&listener, "READY=1");

    stand_in.signal(Signal::SIGTERM);
    let stopping = expect_line(&listener, "STOPPING=1");
    assert_eq!(stopping.sender, stand_in_pid(&stand_in));
    assert_eq!(exit_code(&mut stand_in, "the stand-in"), 0);
    assert!(
        stand_in.log_text().contains("SIGTERM: draining"),
        "the ingress got SIGTERM: {}",
        stand_in.log_text()
    );
    // The stand-in waited for (and reaped) its ingress.
    ingress.assert_gone();
}

#[test]
fn without_notify_socket_the_stand_in_refuses_to_start() {
    let node = Node::new("");
    let output = Command::new(binary("blipless-ingress"))
        .arg("--supervise")
        .arg("--config")
        .arg(&node.config)
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .output()
        .expect("running blipless-ingress --supervise");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("blipless-ingress --supervise: NOTIFY_SOCKET is not set"),
        "{stderr}"
    );
    assert!(
        std::net::TcpStream::connect(node.status).is_err(),
        "no ingress was started"
    );
}

#[test]
fn a_supervised_device_plane_is_ready_after_the_ingress_has_it_ready_and_restarts_beside_itself() {
    nix::sys::prctl::set_child_subreaper(true).expect("becoming a child subreaper");
    let mut node = Node::new("[drain]\ngrace = \"60s\"\n");
    let _ingress = node.start_ingress();
    let listener = systemd(&node);
    // A warm-up that takes 1.5 s: READY=1 must wait for it.
    let stall = [("BLIPLESS_FAULT_STALL_WARMUP_MS", "1500")];
    let mut first = start_supervised(&node, "blipless-device", Some(listener.path()), &stall);
    let mut first_plane = Supervised::of(&first);
    let early = listener
        .recv_timeout(Duration::from_millis(1000))
        .expect("receiving");
    assert!(
        early.is_none(),
        "nothing before the plane is ready: {early:?}"
    );

    let ready = expect_line(&listener, "READY=1");
    assert_eq!(ready.sender, stand_in_pid(&first));
    assert!(
        first.log_text().contains("blipless_device::plane: ready"),
        "the plane told the ingress Ready first: {}",
        first.log_text()
    );
    node.wait_ready();
    let generation = node.active_generation();
    assert!(generation.is_some());

    // systemctl restart: the old stand-in leaves, a new one starts, and its
    // plane takes over by a deploy, which ends the old plane.
    first.signal(Signal::SIGUSR2);
    assert_eq!(exit_code(&mut first, "the first stand-in"), 0);
    assert!(first_plane.running(), "the old plane serves until replaced");
    let mut second = start_supervised(&node, "blipless-device", Some(listener.path()), &[]);
    let mut second_plane = Supervised::of(&second);
    let ready = expect_line(&listener, "READY=1");
    assert_eq!(
        ready.sender,
        stand_in_pid(&second),
        "the new stand-in's READY"
    );
    wait_until(
        Duration::from_secs(30),
        "the new plane to be active",
        || {
            node.active_generation()
                .is_some_and(|g| Some(g) != generation)
        },
    );
    assert_eq!(
        first_plane.wait_orphan(Duration::from_secs(30)),
        0,
        "the old plane exits once drained, well before drain.grace"
    );
    node.wait_ready();

    second.signal(Signal::SIGTERM);
    assert_eq!(exit_code(&mut second, "the second stand-in"), 0);
    second_plane.assert_gone();
}

#[test]
fn a_device_plane_no_successor_takes_over_from_drains_after_the_grace() {
    nix::sys::prctl::set_child_subreaper(true).expect("becoming a child subreaper");
    let mut node = Node::new("[drain]\ngrace = \"1s\"\n");
    let _ingress = node.start_ingress();
    let listener = systemd(&node);
    let mut stand_in = start_supervised(&node, "blipless-device", Some(listener.path()), &[]);
    let mut plane = Supervised::of(&stand_in);
    expect_line(&listener, "READY=1");
    node.wait_ready();

    stand_in.signal(Signal::SIGUSR2);
    assert_eq!(exit_code(&mut stand_in, "the stand-in"), 0);
    assert_eq!(plane.wait_orphan(Duration::from_secs(30)), 0);
    let log = stand_in.log_text();
    assert!(log.contains("SIGUSR2: waiting for a successor"), "{log}");
    assert!(
        log.contains("no successor took over within drain.grace"),
        "{log}"
    );
}

#[test]
fn watchdog_pings_pass_through_the_stand_in_when_systemd_asks_for_them() {
    let node = Node::new("");
    let notify = systemd(&node);
    // As systemd sets them for the main process (the stand-in): a 1 s
    // period, and WATCHDOG_PID naming the stand-in, which the test cannot
    // know before it starts, so a pid that is not the daemon's stands in for
    // it: the stand-in must drop it for its child.
    let mut ingress = start_supervised(
        &node,
        "blipless-ingress",
        Some(&node.path().join("notify.sock")),
        &[("WATCHDOG_USEC", "1000000"), ("WATCHDOG_PID", "1")],
    );
    expect_line(&notify, "READY=1");
    // Half the period: two or more within 1.6 s.
    let started = Instant::now();
    expect_line(&notify, "WATCHDOG=1");
    expect_line(&notify, "WATCHDOG=1");
    assert!(
        started.elapsed() < Duration::from_millis(1600),
        "{:?}",
        started.elapsed()
    );
    let _ = kill(
        Pid::from_raw(stand_in_pid(&ingress).expect("pid")),
        Signal::SIGTERM,
    );
    assert_eq!(exit_code(&mut ingress, "the stand-in"), 0);
}

/// systemd's watchdog (`WatchdogSec=`) signals only the main process with
/// `KillMode=process`: the stand-in must not leave its wedged child behind.
/// Here the ingress is frozen (SIGSTOP), as a wedged one would be.
#[test]
fn a_watchdog_abort_of_the_stand_in_kills_its_wedged_daemon() {
    let node = Node::new("");
    let listener = systemd(&node);
    let mut stand_in = start_supervised(&node, "blipless-ingress", Some(listener.path()), &[]);
    let mut ingress = Supervised::of(&stand_in);
    expect_line(&listener, "READY=1");
    kill(ingress.pid, Signal::SIGSTOP).expect("freezing the ingress");
    stand_in.signal(Signal::SIGABRT);
    assert_eq!(exit_code(&mut stand_in, "the stand-in"), 134);
    assert!(
        stand_in.log_text().contains("SIGABRT"),
        "{}",
        stand_in.log_text()
    );
    ingress.assert_gone();
    // Its sockets went with it: a new ingress starts afresh.
    let mut next = start_supervised(&node, "blipless-ingress", Some(listener.path()), &[]);
    let _next_ingress = Supervised::of(&next);
    expect_line(&listener, "READY=1");
    next.signal(Signal::SIGTERM);
    assert_eq!(exit_code(&mut next, "the next stand-in"), 0);
}
