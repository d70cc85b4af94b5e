//! What the egress bench runs inside the namespaces, as its own binary
//! re-executed there (`ip netns exec NS blipless-bench-egress --inside ROLE
//! ...`), each role printing one JSON object on stdout (the origin: one
//! line per paced stream it served):
//!
//! - `rate`: new connections, each SOCKS5 (RFC 1929 credentials), CONNECT,
//!   `GET /` and close, or straight to the origin, from 1 or more workers;
//!   every connection's times ([`crate::client`]).
//! - `loop`: `GET /whoami` through SOCKS5, one new connection after
//!   another, until stdin closes; every attempt with its wall-clock times.
//! - `paced`: reads a paced stream from the bench's origin until stdin
//!   closes, then half-closes and reads to the end; the gaps between reads
//!   with data, and whether every byte is the pattern's.
//! - `origin`: the bench's origin: `GET /stream/N` (N bytes from one fixed
//!   64 KiB buffer, for throughput) and `PACED TICK_US CHUNK` (CHUNK bytes
//!   of [`Pattern`] every TICK_US µs until the client half-closes).

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::client::{self, Mode, Proxies};
use crate::logs::unix_now;

/// The first word of a re-executed bench: `--inside ROLE`.
pub const FLAG: &str = "--inside";

/// Limit on any one connection of `rate` and `loop`, setup and exchange.
const PER_CONNECTION: Duration = Duration::from_secs(5);
/// A `rate` run stops early after this many failed connections.
const MAX_ERRORS: u64 = 50;
/// Gaps between reads longer than this are listed one by one.
pub const LISTED_GAP: f64 = 0.01;
/// The throughput origin's write size.
const STREAM_CHUNK: usize = 64 * 1024;

/// The byte stream of `blipless_tests::pattern`, produced piece by piece
/// (the paced origin writes it and the paced client checks it).
#[derive(Debug, Clone)]
pub struct Pattern {
    state: u64,
    word: [u8; 8],
    used: usize,
}

impl Pattern {
    /// From the first byte.
    pub fn new() -> Self {
        Self {
            state: 0x9e37_79b9_7f4a_7c15,
            word: [0; 8],
            used: 8,
        }
    }

    /// Fills `out` with the next bytes.
    pub fn fill(&mut self, out: &mut [u8]) {
        for byte in out {
            if self.used == 8 {
                self.state ^= self.state << 13;
                self.state ^= self.state >> 7;
                self.state ^= self.state << 17;
                self.word = self.state.to_le_bytes();
                self.used = 0;
            }
            *byte = self.word[self.used];
            self.used += 1;
        }
    }
}

impl Default for Pattern {
    fn default() -> Self {
        Self::new()
    }
}

/// `--key value` pairs.
struct Options(HashMap<String, String>);

impl Options {
    fn parse(args: &[String]) -> Result<Self, String> {
        let mut map = HashMap::new();
        let mut args = args.iter();
        while let Some(key) = args.next() {
            let key = key
                .strip_prefix("--")
                .ok_or_else(|| format!("unexpected argument {key:?}"))?;
            let value = args
                .next()
                .ok_or_else(|| format!("--{key} needs a value"))?;
            map.insert(key.to_string(), value.clone());
        }
        Ok(Self(map))
    }

    fn get(&self, key: &str) -> Result<&str, String> {
        self.0
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| format!("--{key} is missing"))
    }

    fn parsed<T: std::str::FromStr>(&self, key: &str) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        self.get(key)?.parse().map_err(|e| format!("--{key}: {e}"))
    }

    fn proxies(&self) -> Result<Proxies, String> {
        let socks: SocketAddr = self.parsed("socks")?;
        Ok(Proxies {
            socks,
            http: socks,
            https: None,
            user: self.get("user")?.to_string(),
            secret: self.get("secret")?.to_string(),
        })
    }
}

/// Runs the role `args[0]` with the rest of `args`; prints its JSON.
pub fn main(args: &[String]) -> ExitCode {
    let Some((role, rest)) = args.split_first() else {
        eprintln!("{FLAG}: which role?");
        return ExitCode::from(2);
    };
    let result = Options::parse(rest).and_then(|options| match role.as_str() {
        "rate" => rate(&options),
        "loop" => request_loop(&options),
        "paced" => paced(&options),
        "origin" => origin(&options).map(|()| Value::Null),
        other => Err(format!("unknown role {other:?}")),
    });
    match result {
        Ok(Value::Null) => ExitCode::SUCCESS,
        Ok(value) => {
            println!("{value}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{FLAG} {role}: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Times of one connection, in microseconds.
#[derive(Debug, Default)]
struct Samples {
    usable: Vec<f64>,
    round_trip: Vec<f64>,
}

/// SOCKS5 without authentication (greeting `[5,1,0]`, CONNECT by IPv4) to
/// `proxies.socks`: a client straight to dante.
async fn open_no_auth(proxies: &Proxies, origin: SocketAddr) -> std::io::Result<client::Opened> {
    let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let SocketAddr::V4(v4) = origin else {
        return Err(invalid("the origin must be IPv4".into()));
    };
    let started = tokio::time::Instant::now();
    let mut stream = tokio::net::TcpStream::connect(proxies.socks).await?;
    stream.set_nodelay(true)?;
    let connected = started.elapsed();
    stream.write_all(&[5, 1, 0]).await?;
    let mut method = [0u8; 2];
    stream.read_exact(&mut method).await?;
    if method != [5, 0] {
        return Err(invalid(format!("SOCKS5 method reply {method:?}")));
    }
    let greeted = started.elapsed();
    let mut request = vec![5, 1, 0, 1];
    request.extend_from_slice(&v4.ip().octets());
    request.extend_from_slice(&v4.port().to_be_bytes());
    stream.write_all(&request).await?;
    let mut head = [0u8; 4];
    stream.read_exact(&mut head).await?;
    if head[0] != 5 || head[1] != 0 {
        return Err(invalid(format!("SOCKS5 reply {head:?}")));
    }
    let rest = match head[3] {
        1 => 4 + 2,
        4 => 16 + 2,
        3 => {
            let mut len = [0u8; 1];
            stream.read_exact(&mut len).await?;
            usize::from(len[0]) + 2
        }
        other => return Err(invalid(format!("SOCKS5 address type {other}"))),
    };
    let mut bound = vec![0u8; rest];
    stream.read_exact(&mut bound).await?;
    Ok(client::Opened {
        stream: client::ProxyStream::Plain(stream),
        started,
        setup: client::Setup {
            connected,
            greeted: Some(greeted),
            authenticated: None,
            usable: started.elapsed(),
        },
    })
}

/// How a `rate` connection is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RateMode {
    /// One of [`crate::client`]'s.
    Client(Mode),
    /// [`open_no_auth`].
    NoAuth,
}

async fn one(proxies: &Proxies, mode: RateMode, origin: SocketAddr) -> std::io::Result<(f64, f64)> {
    let (mut opened, mode) = match mode {
        RateMode::Client(mode) => (client::open(proxies, mode, origin).await?, mode),
        RateMode::NoAuth => (open_no_auth(proxies, origin).await?, Mode::Socks5),
    };
    let round_trip = client::tiny_exchange(&mut opened, proxies, mode, origin).await?;
    Ok((
        opened.setup.usable.as_secs_f64() * 1e6,
        round_trip.as_secs_f64() * 1e6,
    ))
}

/// `connections` connections from `workers` workers; the samples, the
/// errors and the first one, and the wall time.
async fn connections(
    proxies: &Proxies,
    mode: RateMode,
    origin: SocketAddr,
    connections: u64,
    workers: usize,
) -> (Samples, u64, Option<String>, Duration) {
    let tickets = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let first_error: Arc<Mutex<Option<String>>> = Arc::default();
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let (proxies, tickets, errors) = (proxies.clone(), tickets.clone(), errors.clone());
        let first_error = first_error.clone();
        set.spawn(async move {
            let mut samples = Samples::default();
            while tickets.fetch_add(1, Ordering::Relaxed) < connections
                && errors.load(Ordering::Relaxed) < MAX_ERRORS
            {
                let error =
                    match tokio::time::timeout(PER_CONNECTION, one(&proxies, mode, origin)).await {
                        Ok(Ok((usable, round_trip))) => {
                            samples.usable.push(usable);
                            samples.round_trip.push(round_trip);
                            continue;
                        }
                        Ok(Err(error)) => error.to_string(),
                        Err(_) => format!("no answer within {PER_CONNECTION:?}"),
                    };
                errors.fetch_add(1, Ordering::Relaxed);
                first_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(error);
            }
            samples
        });
    }
    let mut all = Samples::default();
    while let Some(joined) = set.join_next().await {
        if let Ok(samples) = joined {
            all.usable.extend(samples.usable);
            all.round_trip.extend(samples.round_trip);
        }
    }
    let elapsed = started.elapsed();
    let first = first_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    (all, errors.load(Ordering::Relaxed), first, elapsed)
}

/// `rate`: `--socks --user --secret --origin --mode socks5|none|dante
/// --connections N --workers W --warmup M` (`dante`: SOCKS5 without
/// authentication to `--socks`).
fn rate(options: &Options) -> Result<Value, String> {
    let proxies = options.proxies()?;
    let origin: SocketAddr = options.parsed("origin")?;
    let mode = match options.get("mode")? {
        "socks5" => RateMode::Client(Mode::Socks5),
        "none" => RateMode::Client(Mode::Direct),
        "dante" => RateMode::NoAuth,
        other => return Err(format!("--mode {other:?}: socks5, none or dante")),
    };
    let count: u64 = options.parsed("connections")?;
    let workers: usize = options.parsed("workers")?;
    let warmup: u64 = options.parsed("warmup")?;
    let runtime = crate::runtime(2).map_err(|e| format!("runtime: {e}"))?;
    let (samples, errors, first_error, elapsed) = runtime.block_on(async {
        // First connections pay for lazy allocations on every side.
        let _ = connections(&proxies, mode, origin, warmup, workers).await;
        connections(&proxies, mode, origin, count, workers).await
    });
    Ok(json!({
        "completed": samples.round_trip.len(),
        "errors": errors,
        "first_error": first_error,
        "elapsed_s": elapsed.as_secs_f64(),
        "usable_us": samples.usable,
        "round_trip_us": samples.round_trip,
    }))
}

/// A flag that is set once stdin reaches its end (the bench closed it).
fn stdin_closed() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let set = flag.clone();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        set.store(true, Ordering::SeqCst);
    });
    flag
}

async fn whoami(proxies: &Proxies, origin: SocketAddr) -> std::io::Result<String> {
    let mut opened = client::open(proxies, Mode::Socks5, origin).await?;
    let stream = &mut opened.stream;
    stream
        .write_all(client::request(proxies, Mode::Socks5, origin, "/whoami").as_bytes())
        .await?;
    let mut buffer = Vec::with_capacity(512);
    let head = client::read_head(stream, &mut buffer).await?;
    let mut body = buffer[head.len..].to_vec();
    let mut chunk = [0u8; 512];
    while (body.len() as u64) < head.body {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "body cut short",
            ));
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Ok(String::from_utf8_lossy(&body).trim().to_string())
}

/// `loop`: `--socks --user --secret --origin --pause-ms P`: `/whoami`
/// through SOCKS5, a new connection each, P ms apart, until stdin closes.
fn request_loop(options: &Options) -> Result<Value, String> {
    let proxies = options.proxies()?;
    let origin: SocketAddr = options.parsed("origin")?;
    let pause = Duration::from_millis(options.parsed("pause-ms")?);
    let stop = stdin_closed();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let attempts = runtime.block_on(async {
        let mut attempts = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let start = unix_now();
            let result = tokio::time::timeout(PER_CONNECTION, whoami(&proxies, origin)).await;
            let end = unix_now();
            let (ok, answer) = match result {
                Ok(Ok(address)) => (true, address),
                Ok(Err(error)) => (false, error.to_string()),
                Err(_) => (false, format!("no answer within {PER_CONNECTION:?}")),
            };
            attempts.push(json!({"start": start, "end": end, "ok": ok, "answer": answer}));
            tokio::time::sleep(pause).await;
        }
        attempts
    });
    Ok(json!({ "attempts": attempts }))
}

/// `paced`: `--origin --tick-us T --chunk C`.
fn paced(options: &Options) -> Result<Value, String> {
    let origin: SocketAddr = options.parsed("origin")?;
    let tick: u64 = options.parsed("tick-us")?;
    let chunk: usize = options.parsed("chunk")?;
    let stop = stdin_closed();
    let mut stream = TcpStream::connect_timeout(&origin, Duration::from_secs(10))
        .map_err(|e| format!("connecting to {origin}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_millis(50)))
        .map_err(|e| e.to_string())?;
    writeln!(stream, "PACED {tick} {chunk}").map_err(|e| format!("sending the request: {e}"))?;
    let mut expected = Pattern::new();
    let mut want = vec![0u8; 256 * 1024];
    let mut buffer = vec![0u8; 256 * 1024];
    let mut received: u64 = 0;
    let mut mismatch: Option<u64> = None;
    let mut reads: u64 = 0;
    let mut last: Option<(Instant, f64)> = None;
    let (mut first_unix, mut longest, mut longest_end) = (None, 0.0f64, None);
    let mut gaps: Vec<(f64, f64)> = Vec::new();
    let mut shut_at: Option<Instant> = None;
    let mut error: Option<String> = None;
    let mut clean = false;
    loop {
        if shut_at.is_none() && stop.load(Ordering::SeqCst) {
            // The bench is done: ask the origin to stop and take the rest.
            let _ = stream.shutdown(Shutdown::Write);
            shut_at = Some(Instant::now());
        }
        if shut_at.is_some_and(|at| at.elapsed() > Duration::from_secs(60)) {
            error = Some("the stream did not end within 60 s of the half-close".into());
            break;
        }
        match stream.read(&mut buffer) {
            Ok(0) => {
                clean = shut_at.is_some();
                if !clean {
                    error = Some(format!(
                        "the origin closed the stream after {received} bytes, before it was asked to"
                    ));
                }
                break;
            }
            Ok(n) => {
                let (now, now_unix) = (Instant::now(), unix_now());
                if shut_at.is_none() {
                    if let Some((then, _)) = last {
                        let gap = now.duration_since(then).as_secs_f64();
                        if gap > longest {
                            longest = gap;
                            longest_end = Some(now_unix);
                        }
                        if gap > LISTED_GAP {
                            gaps.push((now_unix, gap));
                        }
                    }
                }
                first_unix.get_or_insert(now_unix);
                last = Some((now, now_unix));
                reads += 1;
                expected.fill(&mut want[..n]);
                if mismatch.is_none() {
                    if let Some(at) = buffer[..n].iter().zip(&want[..n]).position(|(a, b)| a != b) {
                        mismatch = Some(received + at as u64);
                    }
                }
                received += n as u64;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => {
                error = Some(format!("reading after {received} bytes: {e}"));
                break;
            }
        }
    }
    Ok(json!({
        "received": received,
        "mismatch_at": mismatch,
        "reads": reads,
        "first_unix": first_unix,
        "last_unix": last.map(|(_, unix)| unix),
        "longest_gap_s": longest,
        "longest_gap_end_unix": longest_end,
        "gaps": gaps,
        "clean": clean,
        "error": error,
    }))
}

/// `origin`: `--listen ADDR`; serves until killed.
fn origin(options: &Options) -> Result<(), String> {
    let listen: SocketAddr = options.parsed("listen")?;
    let listener = TcpListener::bind(listen).map_err(|e| format!("binding {listen}: {e}"))?;
    println!("listening on {listen}");
    let _ = std::io::stdout().flush();
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        std::thread::spawn(move || {
            let _ = serve(stream);
        });
    }
    Ok(())
}

fn serve(stream: TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if let Some(rest) = line.trim().strip_prefix("PACED ") {
        let mut words = rest.split_whitespace().map(str::parse::<u64>);
        let (Some(Ok(tick)), Some(Ok(chunk))) = (words.next(), words.next()) else {
            return Ok(());
        };
        return serve_paced(
            stream,
            reader,
            Duration::from_micros(tick.max(100)),
            chunk.clamp(8, 1 << 20) as usize,
        );
    }
    // An HTTP request: read the rest of its head.
    let mut header = String::new();
    while reader.read_line(&mut header)? > 2 {
        header.clear();
    }
    let path = line.split_whitespace().nth(1).unwrap_or("/");
    let total: u64 = path
        .strip_prefix("/stream/")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Length: {total}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n"
    )?;
    let buffer: Vec<u8> = (0..STREAM_CHUNK).map(|i| (i * 131 % 251) as u8).collect();
    let mut left = total;
    while left > 0 {
        let n = left.min(STREAM_CHUNK as u64) as usize;
        stream.write_all(&buffer[..n])?;
        left -= n as u64;
    }
    stream.shutdown(Shutdown::Write)
}

/// Writes `chunk` bytes of the pattern every `tick` until the client
/// half-closes, then half-closes too; prints what it wrote.
fn serve_paced(
    mut stream: TcpStream,
    mut reader: BufReader<TcpStream>,
    tick: Duration,
    chunk: usize,
) -> std::io::Result<()> {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let done = Arc::new(AtomicBool::new(false));
    let seen = done.clone();
    std::thread::spawn(move || {
        let mut sink = [0u8; 256];
        while matches!(reader.read(&mut sink), Ok(n) if n > 0) {}
        seen.store(true, Ordering::SeqCst);
    });
    stream.set_write_timeout(Some(Duration::from_secs(120)))?;
    let mut pattern = Pattern::new();
    let mut bytes = vec![0u8; chunk];
    let mut written: u64 = 0;
    let mut error = None;
    let mut next = Instant::now();
    while !done.load(Ordering::SeqCst) {
        pattern.fill(&mut bytes);
        if let Err(e) = stream.write_all(&bytes) {
            error = Some(e.to_string());
            break;
        }
        written += chunk as u64;
        next += tick;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else if now - next > tick {
            // Blocked by the path: keep the pace from here, no burst.
            next = now;
        }
    }
    let _ = stream.shutdown(Shutdown::Write);
    println!(
        "{}",
        json!({"paced_written": written, "peer": peer, "error": error})
    );
    let _ = std::io::stdout().flush();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_is_the_harness_pattern_in_pieces() {
        let mut pattern = Pattern::new();
        let mut bytes = vec![0u8; 1001];
        let (a, b) = bytes.split_at_mut(13);
        pattern.fill(a);
        pattern.fill(b);
        assert_eq!(bytes, blipless_tests::pattern(1001));
    }

    #[test]
    fn options_are_key_value_pairs() {
        let args: Vec<String> = ["--tick-us", "5000", "--chunk", "8192"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let options = Options::parse(&args).expect("parsed");
        assert_eq!(options.parsed::<u64>("tick-us"), Ok(5000));
        assert!(options.get("origin").is_err());
        assert!(Options::parse(&args[..1]).is_err());
    }
}
