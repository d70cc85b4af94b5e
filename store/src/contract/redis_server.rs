//! A `redis-server` of the test's own: on a free loopback port, without persistence, in
//! a temp dir; killed when dropped. No shared instance, no state between tests.
//!
//! A missing `redis-server` fails the test (never skips it): `make test` installs it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a new server may take to answer PING.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A running (or, between [`RedisServer::kill`] and [`RedisServer::restart`], stopped)
/// redis-server.
#[derive(Debug)]
pub(crate) struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free port (trying another if a parallel test took it).
    pub(crate) fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir for redis-server");
        let mut server = Self {
            port: 0,
            dir,
            child: None,
        };
        let mut failures = Vec::new();
        for _ in 0..3 {
            server.port = TcpListener::bind("127.0.0.1:0")
                .and_then(|listener| listener.local_addr())
                .expect("a free port")
                .port();
            match server.spawn() {
                Ok(()) => return server,
                Err(failure) => failures.push(failure),
            }
        }
        panic!("redis-server did not start:\n{}", failures.join("\n"));
    }

    /// Its process id, while it runs.
    pub(crate) fn pid(&self) -> Option<i32> {
        let id = self.child.as_ref()?.id();
        i32::try_from(id).ok()
    }

    /// The store URL for it.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Starts the server again on the same port and dir, and waits until it answers.
    pub(crate) fn restart(&mut self) {
        if let Err(failure) = self.spawn() {
            panic!("redis-server did not restart: {failure}");
        }
    }

    /// Starts the server and waits until it answers; what went wrong if it does not.
    fn spawn(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "redis-server already running");
        let log = self.dir.path().join("redis.log");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(err) => panic!(
                "cannot start redis-server ({err}): the Redis store tests need it; \
                 run `make test`, which installs it (package redis-server)"
            ),
        };
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while !self.answers() {
            let exited = self
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            if exited.is_some() || Instant::now() > deadline {
                self.kill();
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!(
                    "redis-server on port {} did not answer ({exited:?}); its log:\n{log}",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Kills the server (SIGKILL, as a crash would) and waits for it to exit.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether it answers PING on its port.
    fn answers(&self) -> bool {
        let ping = || -> std::io::Result<bool> {
            let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
            stream.set_read_timeout(Some(Duration::from_secs(1)))?;
            stream.write_all(b"PING\r\n")?;
            let mut reply = [0u8; 7];
            stream.read_exact(&mut reply)?;
            Ok(&reply == b"+PONG\r\n")
        };
        ping().unwrap_or(false)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
