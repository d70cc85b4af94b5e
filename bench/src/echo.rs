//! The echo server of the proxy benches (deploys, pre-warm): a child
//! process of the bench binary that echoes whatever each connection sends,
//! so that its sockets count against its own open-file limit, not the
//! bench's, and its CPU is its own.

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The argument that makes the bench binary an echo server (see [`serve_echo`]).
pub const ECHO_SERVER_ARG: &str = "--echo-server";

/// Echoes whatever each connection sends. It is a child process (this same
/// binary, [`ECHO_SERVER_ARG`]): its sockets count against its own
/// open-file limit, not the bench's, and its CPU is its own. Killed when dropped.
#[derive(Debug)]
pub struct EchoServer {
    /// Where it listens.
    pub address: SocketAddr,
    child: std::process::Child,
}

impl EchoServer {
    /// Starts the child process and reads its address.
    pub fn start() -> std::io::Result<Self> {
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .arg(ECHO_SERVER_ARG)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()?;
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            let mut reader = std::io::BufReader::new(stdout);
            let _ = std::io::BufRead::read_line(&mut reader, &mut line);
        }
        match line.trim().parse::<SocketAddr>() {
            Ok(address) => Ok(Self { address, child }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(std::io::Error::other(format!(
                    "the echo server said {line:?} instead of its address"
                )))
            }
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The echo server's process (the bench binary's `main` calls it when its
/// first argument is [`ECHO_SERVER_ARG`]): binds 127.0.0.1, prints its address, echoes
/// until its stdin closes (the bench ended, however it ended).
pub fn serve_echo() -> std::process::ExitCode {
    let runtime = match crate::runtime(1) {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("echo server: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let listener = match runtime.block_on(TcpListener::bind("127.0.0.1:0")) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("echo server: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let Ok(address) = listener.local_addr() else {
        return std::process::ExitCode::FAILURE;
    };
    runtime.spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(echo(stream));
                }
                // Out of fds, most likely: wait rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    });
    println!("{address}");
    let _ = std::io::stdout().flush();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    runtime.shutdown_background();
    std::process::ExitCode::SUCCESS
}

async fn echo(mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if stream.write_all(&buffer[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}
