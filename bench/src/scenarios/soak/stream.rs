//! The soak's long tunnels: a streaming echo through SOCKS5 or HTTP CONNECT,
//! byte-checked. Each stream uploads its own bytes ([`super::rng::fill`],
//! keyed per stream) to the origin's `PUT /echo` at a steady rate and reads
//! the echo back as it comes, comparing every byte with what was sent, so
//! a byte lost, doubled, reordered or taken from another stream counts as
//! corrupted. A stream *survives* when the whole echo came back and the
//! origin closed; otherwise it *broke*, at the time recorded.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::io::{ReadHalf, WriteHalf};
use tokio::time::Instant;

use super::rng::fill;
use super::Clock;
use crate::client::{self, Mode, Proxies, ProxyStream};

/// Bytes per write, and per comparison.
const CHUNK: usize = 16 * 1024;
/// Opening the tunnel and reading the echo's head, at most.
const SETUP_BOUND: Duration = Duration::from_secs(20);
/// No byte back for this long breaks the stream.
const STALL: Duration = Duration::from_secs(30);

/// One stream, as it ended.
#[derive(Debug, Clone)]
pub struct StreamRecord {
    /// SOCKS5 or HTTP CONNECT.
    pub mode: Mode,
    /// Bytes to echo.
    pub size: u64,
    /// When it started (clock seconds).
    pub start: f64,
    /// When the proxy first answered (the SOCKS5 method reply, the CONNECT
    /// 200): from then on the tunnel was the device plane's, not the
    /// ingress's. None if it never did.
    pub established: Option<f64>,
    /// When it ended.
    pub end: f64,
    /// Echoed bytes received.
    pub received: u64,
    /// Received bytes that differ from what was sent at that offset (bytes
    /// beyond `size` included).
    pub corrupted: u64,
    /// Why it broke; None when it survived.
    pub error: Option<String>,
}

impl StreamRecord {
    /// The whole echo came back and the origin closed.
    pub fn survived(&self) -> bool {
        self.error.is_none()
    }
}

/// What one stream is to do.
#[derive(Debug, Clone)]
pub struct Plan {
    /// SOCKS5 or HTTP CONNECT.
    pub mode: Mode,
    /// Bytes to send (and get back).
    pub size: u64,
    /// Upload rate, bytes per second.
    pub rate: u64,
    /// Keys the stream's bytes.
    pub key: u64,
}

/// Runs one stream to its end through `proxies` to the origin's `/echo`.
pub async fn run(proxies: &Proxies, origin: SocketAddr, plan: Plan, clock: Clock) -> StreamRecord {
    let mut record = StreamRecord {
        mode: plan.mode,
        size: plan.size,
        start: clock.now(),
        established: None,
        end: 0.0,
        received: 0,
        corrupted: 0,
        error: None,
    };
    let result = stream(proxies, origin, &plan, clock, &mut record).await;
    record.end = clock.now();
    if let Err(error) = result {
        record.error = Some(error);
    }
    record
}

async fn stream(
    proxies: &Proxies,
    origin: SocketAddr,
    plan: &Plan,
    clock: Clock,
    record: &mut StreamRecord,
) -> Result<(), String> {
    let setup = async {
        let mut opened = client::open(proxies, plan.mode, origin).await?;
        let first_answer = opened.setup.greeted.unwrap_or(opened.setup.usable);
        let established = clock.at((opened.started + first_answer).into_std());
        let head = format!(
            "PUT /echo HTTP/1.1\r\nHost: {origin}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            plan.size
        );
        opened.stream.write_all(head.as_bytes()).await?;
        // The origin answers the head before it reads the body.
        let mut buffer = Vec::with_capacity(1024);
        let answer = client::read_head(&mut opened.stream, &mut buffer).await?;
        Ok::<_, std::io::Error>((opened.stream, established, answer, buffer))
    };
    let (stream, established, answer, buffer) = match tokio::time::timeout(SETUP_BOUND, setup).await
    {
        Ok(Ok(done)) => done,
        Ok(Err(error)) => return Err(format!("setting up: {error}")),
        Err(_) => return Err(format!("setting up: no answer within {SETUP_BOUND:?}")),
    };
    record.established = Some(established);
    if answer.body != plan.size {
        return Err(format!(
            "the origin announced {} bytes, not {}",
            answer.body, plan.size
        ));
    }
    let (reader, writer) = tokio::io::split(stream);
    let upload = tokio::spawn(send(writer, plan.clone()));
    let early = buffer[answer.len..].to_vec();
    let read = receive(reader, plan, &early, record).await;
    upload.abort();
    let sent = upload.await;
    read?;
    match sent {
        Ok(Err(error)) => Err(format!("sending: {error}")),
        _ => Ok(()),
    }
}

/// Sends the stream's bytes at its rate.
async fn send(mut writer: WriteHalf<ProxyStream>, plan: Plan) -> std::io::Result<()> {
    let started = Instant::now();
    let mut chunk = vec![0u8; CHUNK];
    let mut sent = 0u64;
    while sent < plan.size {
        let due = started + Duration::from_secs_f64(sent as f64 / plan.rate as f64);
        tokio::time::sleep_until(due).await;
        let n = (plan.size - sent).min(CHUNK as u64) as usize;
        fill(plan.key, sent, &mut chunk[..n]);
        match tokio::time::timeout(STALL, writer.write_all(&chunk[..n])).await {
            Ok(result) => result?,
            Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
        }
        sent += n as u64;
    }
    // Keep the write side open: the origin closes once it has echoed all.
    std::future::pending::<()>().await;
    Ok(())
}

/// Reads the echo and checks each byte; Ok once all came back and the
/// origin closed.
async fn receive(
    mut reader: ReadHalf<ProxyStream>,
    plan: &Plan,
    early: &[u8],
    record: &mut StreamRecord,
) -> Result<(), String> {
    let mut expected = vec![0u8; 64 * 1024];
    let mut check = |bytes: &[u8], record: &mut StreamRecord| {
        let offset = record.received;
        let within = plan.size.saturating_sub(offset).min(bytes.len() as u64) as usize;
        fill(plan.key, offset, &mut expected[..within]);
        let differing = bytes[..within]
            .iter()
            .zip(&expected[..within])
            .filter(|(got, want)| got != want)
            .count();
        record.corrupted += (differing + (bytes.len() - within)) as u64;
        record.received += bytes.len() as u64;
    };
    check(early, record);
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match tokio::time::timeout(STALL, reader.read(&mut buffer)).await {
            Ok(Ok(n)) => n,
            Ok(Err(error)) => {
                return Err(format!(
                    "after {} of {} bytes: {error}",
                    record.received, plan.size
                ))
            }
            Err(_) => {
                return Err(format!(
                    "no byte for {STALL:?} after {} of {} bytes",
                    record.received, plan.size
                ))
            }
        };
        if n == 0 {
            return if record.received == plan.size {
                Ok(())
            } else {
                Err(format!(
                    "closed after {} of {} bytes",
                    record.received, plan.size
                ))
            };
        }
        check(&buffer[..n], record);
    }
}
