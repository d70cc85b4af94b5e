//! Section 6: SOCKS5 UDP ASSOCIATE beside direct UDP, to the same UDP echo
//! server on 127.0.0.1 (a thread of the bench): round-trip latency with one
//! datagram in flight, then datagrams per second with a window of them in
//! flight, for a small and a large payload; and the section's tables.
//!
//! The SOCKS5 client is the protocol crate's sans-IO client side
//! (`blipless_protocol::socks5::client`) driven over a TCP control
//! connection: greeting with username/password, then UDP ASSOCIATE naming
//! 0.0.0.0 and the port of the bench's UDP socket; every datagram then goes
//! to the relay address of the reply behind the RFC 1928 §7 header
//! (`blipless_protocol::socks5::udp`). Each datagram carries a sequence
//! number, so a late echo is never taken for another datagram's; one not
//! echoed within [`LOST_AFTER`] counts as lost.

use std::fmt::Write as _;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use blipless_protocol::socks5::udp::{encode_udp_header, parse_udp_datagram};
use blipless_protocol::socks5::{client, Destination, METHOD_USER_PASS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::Instant;

use crate::client::Proxies;
use crate::format::{count, delta_micros, micros, seconds, signed_micros};
use crate::stats::Percentiles;

/// An echo later than this counts its datagram as lost.
pub const LOST_AFTER: Duration = Duration::from_secs(1);
/// The payload of the latency phase, bytes.
pub const LATENCY_PAYLOAD: usize = 64;
/// Limit on the SOCKS5 handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Datagrams sent one at a time, untimed, before the latency phase.
const WARM_UP: u64 = 200;

/// How much work the section does, per path.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Latency: at most this many datagrams, one in flight...
    pub latency_datagrams: u64,
    /// ...and at most this long.
    pub latency_time: Duration,
    /// Rate: datagrams kept in flight.
    pub window: usize,
    /// Rate: how long each payload size is sent.
    pub rate_time: Duration,
    /// Rate: the payload sizes, bytes (at least 8: the sequence number).
    pub payloads: [usize; 2],
}

/// How the datagrams reach the echo server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Straight from the bench's UDP socket: the baseline.
    Direct,
    /// Through the node's SOCKS5 UDP relay.
    Associate,
}

impl Route {
    /// The name in tables.
    pub fn label(self) -> &'static str {
        match self {
            Route::Direct => "direct",
            Route::Associate => "SOCKS5 UDP ASSOCIATE",
        }
    }
}

/// The latency phase of one route.
#[derive(Debug, Clone, Copy)]
pub struct Latency {
    /// Datagrams sent.
    pub sent: u64,
    /// Not echoed within [`LOST_AFTER`].
    pub lost: u64,
    /// From the send until the echo arrived.
    pub round_trip: Percentiles,
}

/// One rate phase of one route.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    /// Payload bytes per datagram.
    pub payload: usize,
    /// Datagrams sent.
    pub sent: u64,
    /// Echoes that arrived within the sending time.
    pub echoed_in_time: u64,
    /// Not echoed within [`LOST_AFTER`] (the last ones are waited for after
    /// the sending time).
    pub lost: u64,
    /// The sending time.
    pub time: Duration,
}

impl Rate {
    /// Datagrams echoed per second of the sending time.
    pub fn per_second(&self) -> f64 {
        self.echoed_in_time as f64 / self.time.as_secs_f64().max(1e-9)
    }
}

/// What one route measured.
#[derive(Debug)]
pub struct Measured {
    /// Which route.
    pub route: Route,
    /// One datagram in flight.
    pub latency: Option<Latency>,
    /// A window in flight, one per payload size.
    pub rates: Vec<Rate>,
    /// What stopped the route's phases, if anything did.
    pub error: Option<String>,
}

/// Section 6: both routes, direct first; empty when it did not run.
#[derive(Debug, Default)]
pub struct Section {
    /// The plan it ran under.
    pub plan: Option<Plan>,
    /// Direct, then through the proxy.
    pub routes: Vec<Measured>,
}

/// A UDP echo server on 127.0.0.1 (a thread): every datagram goes back to
/// its sender. Stopped when dropped.
#[derive(Debug)]
pub struct UdpEcho {
    /// Where it listens.
    pub address: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UdpEcho {
    /// Binds 127.0.0.1 on a free port and starts echoing.
    pub fn start() -> io::Result<Self> {
        let socket = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
        // Wakes now and then to see whether to stop.
        socket.set_read_timeout(Some(Duration::from_millis(100)))?;
        let address = socket.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("udp-echo".into())
            .spawn(move || {
                let mut buffer = vec![0u8; 65_536];
                while !stopped.load(Ordering::Relaxed) {
                    if let Ok((len, from)) = socket.recv_from(&mut buffer) {
                        let _ = socket.send_to(&buffer[..len], from);
                    }
                }
            })?;
        Ok(Self {
            address,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn invalid(what: impl ToString) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Reads from `control` until `parse` finds a whole message; reads no byte
/// past it (the parsers never ask for more than the message has).
async fn read_message<T>(
    control: &mut TcpStream,
    parse: impl Fn(&[u8]) -> Result<(T, usize), client::ClientError>,
) -> io::Result<T> {
    let mut buffer = Vec::with_capacity(32);
    loop {
        match parse(&buffer) {
            Ok((value, _)) => return Ok(value),
            Err(client::ClientError::Incomplete { needed }) => {
                let start = buffer.len();
                buffer.resize(start + needed, 0);
                control.read_exact(&mut buffer[start..]).await?;
            }
            Err(error) => return Err(invalid(error)),
        }
    }
}

/// The SOCKS5 handshake for a UDP association whose datagrams come from
/// local port `port`: the control connection (the association lives as
/// long as it is open) and the relay's address.
async fn associate(proxies: &Proxies, port: u16) -> io::Result<(TcpStream, SocketAddr)> {
    let mut control = TcpStream::connect(proxies.socks).await?;
    control.set_nodelay(true)?;
    control.write_all(&client::encode_greeting(true)).await?;
    let method = read_message(&mut control, |b| client::parse_method_choice(b, true)).await?;
    if method == METHOD_USER_PASS {
        let login = client::encode_user_pass(proxies.user.as_bytes(), proxies.secret.as_bytes())
            .map_err(invalid)?;
        control.write_all(&login).await?;
        read_message(&mut control, |b| {
            client::parse_auth_status(b).map(|n| ((), n))
        })
        .await?;
    }
    let from = Destination::Ip(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)));
    let request = client::encode_udp_associate(&from).map_err(invalid)?;
    control.write_all(&request).await?;
    // The reply has CONNECT's layout; its bound address is the relay's.
    let reply = read_message(&mut control, client::parse_connect_reply).await?;
    if !reply.succeeded() {
        return Err(invalid(format!(
            "UDP ASSOCIATE refused: reply {} ({:?})",
            reply.code,
            reply.reply()
        )));
    }
    let Destination::Ip(mut relay) = reply.bound else {
        return Err(invalid("the relay's address is a name"));
    };
    if relay.ip().is_unspecified() {
        relay.set_ip(proxies.socks.ip());
    }
    Ok((control, relay))
}

/// One route's UDP socket toward the echo server, and its sequence numbers.
struct Flow {
    /// Connected to the echo server (direct) or to the relay.
    socket: UdpSocket,
    echo: SocketAddr,
    /// Through the relay: the control connection and the header before
    /// every datagram.
    proxied: Option<(TcpStream, Vec<u8>)>,
    next: u64,
    outgoing: Vec<u8>,
    incoming: Vec<u8>,
}

impl Flow {
    async fn open(route: Route, proxies: &Proxies, echo: SocketAddr) -> io::Result<Self> {
        let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let proxied = match route {
            Route::Direct => {
                socket.connect(echo).await?;
                None
            }
            Route::Associate => {
                let port = socket.local_addr()?.port();
                let (control, relay) =
                    tokio::time::timeout(HANDSHAKE_TIMEOUT, associate(proxies, port))
                        .await
                        .map_err(|_| invalid("no SOCKS5 handshake within 5 s"))??;
                socket.connect(relay).await?;
                // The header a client sends names the destination; it has
                // the layout of the one the relay puts before a reply.
                let mut header = Vec::new();
                encode_udp_header(echo, &mut header);
                Some((control, header))
            }
        };
        Ok(Self {
            socket,
            echo,
            proxied,
            next: 0,
            outgoing: Vec::with_capacity(2048),
            incoming: vec![0u8; 65_536],
        })
    }

    /// Sends a datagram of `payload` bytes (at least 8) carrying the next
    /// sequence number; returns the number.
    async fn send(&mut self, payload: usize) -> io::Result<u64> {
        let sequence = self.next;
        self.next += 1;
        self.outgoing.clear();
        if let Some((_, header)) = &self.proxied {
            self.outgoing.extend_from_slice(header);
        }
        self.outgoing.extend_from_slice(&sequence.to_be_bytes());
        let padded = self.outgoing.len() + payload.saturating_sub(8);
        self.outgoing.resize(padded, 0x5a);
        self.socket.send(&self.outgoing).await?;
        Ok(sequence)
    }

    /// The sequence number of the next echo that arrives before
    /// `deadline`; None at the deadline. Datagrams that are no echo (a bad
    /// header, another sender, too short) are skipped.
    async fn echo_until(&mut self, deadline: Instant) -> io::Result<Option<u64>> {
        loop {
            let received = tokio::time::timeout_at(deadline, self.socket.recv(&mut self.incoming));
            let Ok(len) = received.await else {
                return Ok(None);
            };
            let datagram = &self.incoming[..len?];
            let payload = match self.proxied {
                None => Some(datagram),
                Some(_) => parse_udp_datagram(datagram)
                    .ok()
                    .filter(|d| d.frag == 0 && d.destination == Destination::Ip(self.echo))
                    .map(|d| d.payload),
            };
            let number = payload
                .and_then(|p| p.get(..8))
                .and_then(|p| <[u8; 8]>::try_from(p).ok());
            if let Some(number) = number {
                return Ok(Some(u64::from_be_bytes(number)));
            }
        }
    }
}

/// One datagram in flight at a time, `datagrams` of them or for `time`.
async fn latency(flow: &mut Flow, datagrams: u64, time: Duration) -> io::Result<Latency> {
    let (mut sent, mut lost) = (0, 0);
    let mut samples = Vec::new();
    let started = Instant::now();
    while sent < datagrams && started.elapsed() < time {
        let sent_at = Instant::now();
        let sequence = flow.send(LATENCY_PAYLOAD).await?;
        sent += 1;
        loop {
            match flow.echo_until(sent_at + LOST_AFTER).await? {
                Some(echoed) if echoed == sequence => {
                    samples.push(sent_at.elapsed());
                    break;
                }
                // A late echo of an earlier datagram.
                Some(_) => {}
                None => {
                    lost += 1;
                    break;
                }
            }
        }
    }
    Ok(Latency {
        sent,
        lost,
        round_trip: Percentiles::of(samples),
    })
}

/// `window` datagrams of `payload` bytes in flight for `time`, each echo
/// making room for the next; then waits for the last ones.
async fn rate(flow: &mut Flow, payload: usize, window: usize, time: Duration) -> io::Result<Rate> {
    let mut in_flight: Vec<(u64, Instant)> = Vec::with_capacity(window);
    let (mut sent, mut echoed_in_time, mut lost) = (0, 0, 0);
    let end = Instant::now() + time;
    loop {
        let now = Instant::now();
        let before = in_flight.len();
        in_flight.retain(|(_, at)| now.duration_since(*at) < LOST_AFTER);
        lost += (before - in_flight.len()) as u64;
        if now < end {
            while in_flight.len() < window {
                let sequence = flow.send(payload).await?;
                in_flight.push((sequence, Instant::now()));
                sent += 1;
            }
        }
        let Some(oldest) = in_flight.iter().map(|(_, at)| *at).min() else {
            break;
        };
        let Some(echoed) = flow.echo_until(oldest + LOST_AFTER).await? else {
            continue;
        };
        if let Some(index) = in_flight.iter().position(|(s, _)| *s == echoed) {
            in_flight.swap_remove(index);
            if Instant::now() <= end {
                echoed_in_time += 1;
            }
        }
    }
    Ok(Rate {
        payload,
        sent,
        echoed_in_time,
        lost,
        time,
    })
}

/// Every phase of one route, on one socket (one association).
async fn phases(
    measured: &mut Measured,
    proxies: &Proxies,
    echo: SocketAddr,
    plan: Plan,
) -> io::Result<()> {
    let mut flow = Flow::open(measured.route, proxies, echo).await?;
    // First datagrams pay for lazy allocations and cold caches.
    latency(&mut flow, WARM_UP, Duration::from_secs(2)).await?;
    let measured_latency = latency(&mut flow, plan.latency_datagrams, plan.latency_time).await?;
    eprintln!(
        "  {:<20} latency: {} sent, p50 {:?}, p99 {:?}, {} lost",
        measured.route.label(),
        measured_latency.sent,
        measured_latency.round_trip.p50,
        measured_latency.round_trip.p99,
        measured_latency.lost
    );
    measured.latency = Some(measured_latency);
    for payload in plan.payloads {
        let measured_rate = rate(&mut flow, payload, plan.window, plan.rate_time).await?;
        eprintln!(
            "  {:<20} {payload:>5} B x {}: {:>8.0} datagrams/s, {} sent, {} lost",
            measured.route.label(),
            plan.window,
            measured_rate.per_second(),
            measured_rate.sent,
            measured_rate.lost
        );
        measured.rates.push(measured_rate);
    }
    Ok(())
}

/// Runs section 6 through the node behind `proxies`.
pub async fn run(proxies: &Proxies, plan: Plan) -> Section {
    let echo = UdpEcho::start();
    let mut routes = Vec::new();
    for route in [Route::Direct, Route::Associate] {
        let mut measured = Measured {
            route,
            latency: None,
            rates: Vec::new(),
            error: None,
        };
        let done = match &echo {
            Ok(echo) => phases(&mut measured, proxies, echo.address, plan).await,
            Err(error) => Err(io::Error::new(
                error.kind(),
                format!("the echo server: {error}"),
            )),
        };
        if let Err(error) = done {
            eprintln!("  {}: {error}", route.label());
            measured.error = Some(error.to_string());
        }
        routes.push(measured);
    }
    Section {
        plan: Some(plan),
        routes,
    }
}

// ---- the report ----

/// Section 6 of docs/BENCHMARKS.md (nothing when it did not run); `cpus`
/// as the header gives them.
pub fn render(out: &mut String, section: &Section, cpus: usize) {
    let Some(plan) = section.plan else {
        return;
    };
    let direct = section.routes.iter().find(|m| m.route == Route::Direct);
    out.push_str("## 6. UDP ASSOCIATE: datagrams per second and latency, beside direct UDP\n\n");
    let _ = writeln!(
        out,
        "A UDP echo server (a thread of the bench on 127.0.0.1) sends every datagram back to its sender. \
         *Direct*: the bench's UDP socket sends to it straight. *SOCKS5 UDP ASSOCIATE*: the bench opens a control \
         connection to the SOCKS5 listener (greeting, username/password, UDP ASSOCIATE naming 0.0.0.0 and its UDP \
         socket's port) and sends every datagram to the relay address of the reply behind the 10-byte RFC 1928 §7 \
         header naming the echo server; the device plane sends the payload on from its egress socket and returns \
         the echo behind a header naming the echo server. One association (one socket, for direct) per path carries \
         all of its phases. Everything is on loopback, on this machine's {cpus} CPUs shared by the client, the echo \
         server, the ingress and the device plane. Every datagram carries a sequence number; one not echoed within \
         {} counts as *lost*, and the count is shown as it came.\n",
        seconds(LOST_AFTER)
    );
    let _ = writeln!(
        out,
        "### Latency: one datagram in flight (at most {} datagrams or {} per path, {LATENCY_PAYLOAD}-byte payload)\n",
        count(plan.latency_datagrams as usize),
        seconds(plan.latency_time)
    );
    out.push_str(
        "| path | datagrams | lost | round trip p50 | p99 | added p50 vs direct | added p99 |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
    let direct_trip = direct.and_then(|d| d.latency).map(|l| l.round_trip);
    for measured in &section.routes {
        let Some(latency) = measured.latency else {
            continue;
        };
        let added = |ours: Option<Duration>, theirs: Option<Duration>| match measured.route {
            Route::Direct => "—".to_string(),
            Route::Associate => signed_micros(delta_micros(ours, theirs)),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            measured.route.label(),
            count(latency.sent as usize),
            latency.lost,
            micros(latency.round_trip.p50),
            micros(latency.round_trip.p99),
            added(latency.round_trip.p50, direct_trip.and_then(|d| d.p50)),
            added(latency.round_trip.p99, direct_trip.and_then(|d| d.p99)),
        );
    }
    let _ = writeln!(
        out,
        "\n### Rate: {} datagrams in flight for {} per path and payload size\n",
        plan.window,
        seconds(plan.rate_time)
    );
    out.push_str(
        "*Datagrams/s*: echoes that arrived within the sending time, per second of it. *Sent*: every datagram \
         of the phase; the last window is waited for after the sending time (up to 1 s), so sent = echoed + lost.\n\n",
    );
    out.push_str(
        "| payload | path | datagrams/s | vs direct | payload Mbit/s (each way) | sent | lost |\n",
    );
    out.push_str("|---:|---|---:|---:|---:|---:|---:|\n");
    for payload in plan.payloads {
        let of = |measured: &Measured| {
            measured
                .rates
                .iter()
                .find(|r| r.payload == payload)
                .copied()
        };
        let direct_rate = direct.and_then(of).map(|r| r.per_second());
        for measured in &section.routes {
            let Some(rate) = of(measured) else {
                continue;
            };
            let ratio = match direct_rate {
                Some(d) if d > 0.0 => format!("{:.2}", rate.per_second() / d),
                _ => "—".into(),
            };
            let _ = writeln!(
                out,
                "| {payload} B | {} | {:.0} | {ratio} | {:.1} | {} | {} |",
                measured.route.label(),
                rate.per_second(),
                rate.per_second() * payload as f64 * 8.0 / 1e6,
                count(rate.sent as usize),
                rate.lost,
            );
        }
    }
    for measured in section.routes.iter().filter(|m| m.error.is_some()) {
        let _ = writeln!(
            out,
            "\n{} stopped: `{}`",
            measured.route.label(),
            measured.error.as_deref().unwrap_or("")
        );
    }
    out.push('\n');
}
