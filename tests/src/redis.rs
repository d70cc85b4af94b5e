//! A `redis-server` of the test's own, on a free loopback port, in a
//! temporary folder; killed when dropped. `make test` installs redis-server.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::{free_port, wait_until};

/// A running (or stopped, between `stop` and `start`) redis-server.
#[derive(Debug)]
pub struct Redis {
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    persistent: bool,
}

impl Redis {
    /// Starts a server. `persistent`: append-only file with fsync on every
    /// write, so a restart loses nothing it acknowledged.
    pub fn start(persistent: bool) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("redis")
            .tempdir()
            .expect("temporary folder");
        let mut redis = Self {
            port: free_port(),
            dir,
            child: None,
            persistent,
        };
        redis.restart();
        redis
    }

    /// The store URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Starts the server again on the same port and folder.
    pub fn restart(&mut self) {
        let mut command = Command::new("redis-server");
        command
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.persistent {
            command.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            command.args(["--appendonly", "no"]);
        }
        let child = command.spawn().unwrap_or_else(|e| {
            panic!("starting redis-server ({e}): run `make test`, which installs it")
        });
        self.child = Some(child);
        let port = self.port;
        wait_until(Duration::from_secs(20), "redis-server to listen", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    /// The server's process id while it runs (None between `stop` and
    /// `restart`).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (SIGKILL), as a crash would.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Runs redis-cli against this server.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("running redis-cli (make test installs redis-tools with redis-server)")
    }

    /// The folder it keeps its files in.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}
