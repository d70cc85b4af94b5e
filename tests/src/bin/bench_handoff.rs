//! `blipless-bench-handoff`: ingress restart-by-handoff under WireGuard
//! traffic (issue 5). For 1, 100 and 1,000 WireGuard peers it restarts the
//! ingress by handoff three times while every peer exchanges ICMP echoes with
//! the origin, and measures:
//!
//! - the **handoff time**: from spawning the successor `blipless-ingress`
//!   until the old one has exited (status 0), with its parts from the
//!   daemons' own log timestamps (successor serving, device plane on the
//!   successor, the old ingress's last packet, its exit);
//! - per peer, the **longest gap** between two consecutive echo replies
//!   across the handoff (the customer-visible stall), and how many peers had
//!   one over 1 s;
//! - **lost echoes**: requests sent across the handoff with no reply within
//!   2 s.
//!
//! Topology: [`blipless_tests::topology::Topology`] (customer, node and
//! internet namespaces) with a blipless node in the node namespace, built as
//! [`blipless_tests::topology::WgWorld`] builds it but with a /16 WireGuard
//! pool (1,000 clients do not fit the tests' /24). With N peers, one is the
//! real client, wireguard-go ("alice", pinging the origin every 10 ms with
//! `ping -D`); the other N − 1 are in-process boringtun peers
//! ([`blipless_tests::wg_peer::TestPeer`], each on its own UDP socket in the
//! customer namespace), added with `blipless-ctl client add NAME --wg`. A few
//! threads drive them through epoll: each peer sends an echo every 10 ms
//! (every 100 ms above 100 peers, to keep 2 cores sane) and every datagram
//! it receives goes through boringtun's `decapsulate`, whose answers (the
//! handshake responses to the successor's call-back) are sent back.
//!
//! Writes its section of docs/BENCHMARKS.md, between `<!-- handoff:begin -->`
//! and `<!-- handoff:end -->` (replaced when present, appended otherwise; the
//! rest of the file is left alone). Needs root (namespaces, TUN, nftables),
//! `ping`, `wireguard-go`, `wg`, `wg-quick`, `nft`, `ip`, `curl` and the
//! release binaries; `make bench` builds them and `scripts/bench.sh` runs it
//! after the other benches. Options: `--out PATH` (default
//! `docs/BENCHMARKS.md`), `--quick` (1 and 10 peers, one handoff each, to
//! check the bench itself), `--peers N,N,...` and `--runs N` (other sizes and
//! handoff counts; the command line is in the report), `--logs DIR` (keep
//! the daemons' logs and the client's ping output there),
//! `--handshake-limit N` (the node's `wireguard.handshake_limit`, to see what
//! the handshake rate limit costs a handoff). It sets
//! `BLIPLESS_PROFILE=release` and `BLIPLESS_TEST_LOG=info` (the production
//! log level) unless they are set.

use std::fmt::Write as _;
use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use blipless_tests::bench_doc::{self, Machine, Markers};
use blipless_tests::node::{Daemon, Node};
use blipless_tests::topology::{add_wg_client, tail, Topology};
use blipless_tests::wg_peer::{icmp_echo, in_netns, TestPeer};
use blipless_tests::wireguard::WireguardGoPeer;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};

/// The section's markers in docs/BENCHMARKS.md.
const MARKERS: Markers = Markers {
    begin: "<!-- handoff:begin -->",
    end: "<!-- handoff:end -->",
};
/// The subnet number S (10.S.1.0/24, 10.S.2.0/24); the namespaces are the
/// bench's own, so it may equal another bench's.
const SUBNET: u8 = 91;
/// The WireGuard pool: room for 1,000 clients.
const POOL: &str = "10.64.0.0/16";
/// Traffic flows this long before the first handoff.
const WARM_UP: Duration = Duration::from_secs(2);
/// Between one old ingress's exit and the next spawn.
const PAUSE: Duration = Duration::from_secs(3);
/// Traffic goes on this long after the last old ingress exited.
const AFTER: Duration = Duration::from_secs(2);
/// An echo without a reply within this long is lost.
const LOST_AFTER: f64 = 2.0;
/// A handoff's window runs from the spawn until this long after the old
/// ingress exited: gaps and losses are counted within it.
const WINDOW_AFTER_EXIT: f64 = 1.0;
/// Gaps before the spawn, for comparison, are taken over this long.
const BEFORE: f64 = 2.0;
/// The target: no customer-visible stall over this long.
const STALL_TARGET: f64 = 1.0;
/// The wireguard-go client's ping interval.
const PING_INTERVAL: f64 = 0.01;
/// Peers one driving thread serves at most.
const PEERS_PER_THREAD: usize = 500;

/// How much work the bench does.
#[derive(Debug, Clone, Copy)]
struct Plan<'a> {
    /// Peer counts, one world each.
    sizes: &'a [usize],
    /// Handoffs per size.
    runs: usize,
}

impl Plan<'_> {
    fn full() -> Self {
        Self {
            sizes: &[1, 100, 1000],
            runs: 3,
        }
    }

    fn quick() -> Self {
        Self {
            sizes: &[1, 10],
            runs: 1,
        }
    }
}

/// How often each boringtun peer sends an echo with `peers` peers.
fn echo_interval(peers: usize) -> Duration {
    if peers > 100 {
        Duration::from_millis(100)
    } else {
        Duration::from_millis(10)
    }
}

/// Seconds since the bench started, and the wall clock at that moment (to
/// place log and ping timestamps on the same axis).
#[derive(Debug, Clone, Copy)]
struct Clock {
    start: Instant,
    unix: f64,
}

impl Clock {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            unix: unix_now(),
        }
    }

    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn of_unix(&self, unix: f64) -> f64 {
        unix - self.unix
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

// ---------------------------------------------------------------------------
// The world: namespaces, a node, the wireguard-go client, boringtun peers.

/// A client's WireGuard settings, from the wg-quick text `client add --wg`
/// prints.
#[derive(Debug, Clone)]
struct Credentials {
    private_key: [u8; 32],
    server_public: [u8; 32],
    address: Ipv4Addr,
    endpoint: SocketAddr,
}

fn key(text: &str) -> Result<[u8; 32], String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("key {text:?}: {e}"))?;
    bytes
        .try_into()
        .map_err(|_| format!("key {text:?}: not 32 bytes"))
}

fn parse_credentials(config: &str) -> Result<Credentials, String> {
    let mut private_key = None;
    let mut server_public = None;
    let mut address = None;
    let mut endpoint = None;
    for line in config.lines() {
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        // Split at the first '=': base64 keys end in '=' padding.
        let value = value.trim();
        match name.trim() {
            "PrivateKey" => private_key = Some(key(value)?),
            "PublicKey" => server_public = Some(key(value)?),
            "Address" => {
                let host = value.split('/').next().unwrap_or(value);
                address = Some(
                    host.parse::<Ipv4Addr>()
                        .map_err(|e| format!("Address {value:?}: {e}"))?,
                );
            }
            "Endpoint" => {
                endpoint = Some(
                    value
                        .parse::<SocketAddr>()
                        .map_err(|e| format!("Endpoint {value:?}: {e}"))?,
                )
            }
            _ => {}
        }
    }
    match (private_key, server_public, address, endpoint) {
        (Some(private_key), Some(server_public), Some(address), Some(endpoint)) => {
            Ok(Credentials {
                private_key,
                server_public,
                address,
                endpoint,
            })
        }
        _ => Err(format!("an incomplete wg-quick config: {config}")),
    }
}

/// One customer namespace with N WireGuard peers, one blipless node, one
/// internet; the fields drop in order (clients and daemons before the
/// namespaces).
#[derive(Debug)]
struct World {
    alice: WireguardGoPeer,
    device: Daemon,
    ingress: Daemon,
    node: Node,
    net: Topology,
}

impl World {
    /// The world with `peers` WireGuard clients: alice (wireguard-go, up)
    /// and the credentials of `peers - 1` more, every one known to the
    /// ingress.
    fn build(peers: usize, knobs: &Knobs) -> Result<(World, Vec<Credentials>), String> {
        let net = Topology::new(SUBNET);
        let limit = knobs
            .handshake_limit
            .map(|n| format!("handshake_limit = {n}\n"))
            .unwrap_or_default();
        let mut node = Node::in_netns(
            net.node_ns.name(),
            &format!("allow = [\"{}\"]", net.internet_net),
            &format!(
                "[egress.tun]\nname = \"blip0\"\nout_interface = \"{}\"\nmanage = true\n\n\
                 [wireguard]\nendpoint = \"{}\"\npool = \"{POOL}\"\n{limit}",
                net.uplink,
                net.endpoint()
            ),
        );
        let ingress = node.start_ingress();
        let alice_config = add_wg_client(&node, "alice");
        let device = node.start_device();
        node.wait_ready();
        blipless_tests::netns::run_with_input(
            net.customer.command("nft").args(["-f", "-"]),
            COUNTERS,
        )
        .map_err(|e| format!("nftables counters in the customer namespace: {e}"))?;
        let alice =
            WireguardGoPeer::start(&net.customer, &alice_config, &[net.internet_net.as_str()])
                .map_err(|e| format!("the wireguard-go client: {e}"))?;
        let started = Instant::now();
        let names: Vec<String> = (1..peers).map(|i| format!("peer{i:04}")).collect();
        // Two `blipless-ctl` at a time: the embedded store takes several writers.
        let node_ref = &node;
        let configs: Vec<String> = std::thread::scope(|scope| {
            let halves: Vec<_> = names
                .chunks(names.len().div_ceil(2).max(1))
                .map(|chunk| {
                    scope.spawn(move || {
                        chunk
                            .iter()
                            .map(|name| add_wg_client(node_ref, name))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            halves
                .into_iter()
                .flat_map(|half| half.join().unwrap_or_default())
                .collect()
        });
        if configs.len() != names.len() {
            return Err(format!(
                "added {} of {} clients",
                configs.len(),
                names.len()
            ));
        }
        let credentials = configs
            .iter()
            .map(|config| parse_credentials(config))
            .collect::<Result<Vec<_>, _>>()?;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let known = node.metric("blipless_wg_peers");
            if known == peers as f64 {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the ingress knows {known} WireGuard peers, not {peers}"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if peers > 1 {
            eprintln!(
                "  {} clients added, all known to the ingress, in {:.1?}",
                peers - 1,
                started.elapsed()
            );
        }
        Ok((
            World {
                alice,
                device,
                ingress,
                node,
                net,
            },
            credentials,
        ))
    }

    fn origin_ip(&self) -> Result<Ipv4Addr, String> {
        match self.net.origin.ip() {
            std::net::IpAddr::V4(ip) => Ok(ip),
            other => Err(format!("an IPv6 origin {other}")),
        }
    }

    /// The last lines of the current ingress's and the device plane's logs.
    fn diagnostics(&self) -> String {
        format!(
            "--- ingress log:\n{}\n--- device log:\n{}\n--- wireguard-go:\n{}",
            tail(&self.ingress.log_text()),
            tail(&self.device.log_text()),
            tail(&self.alice.log())
        )
    }

    /// Warning and error lines in every daemon log of the node.
    fn daemon_warnings(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let Ok(entries) = std::fs::read_dir(self.node.path()) else {
            return lines;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                for line in text.lines() {
                    let line = strip_ansi(line);
                    if line.contains(" WARN ") || line.contains(" ERROR ") {
                        lines.push(line);
                    }
                }
            }
        }
        lines
    }
}

/// Makes the boringtun peers in the customer namespace (their sockets live
/// there) and a session for each.
fn make_peers(customer: &str, credentials: Vec<Credentials>) -> Result<Vec<TestPeer>, String> {
    let started = Instant::now();
    let peers = in_netns(customer, move || {
        credentials
            .iter()
            .enumerate()
            .map(|(i, c)| {
                TestPeer::new(
                    c.private_key,
                    c.server_public,
                    c.address,
                    c.endpoint,
                    i as u32 + 1,
                )
            })
            .collect::<io::Result<Vec<_>>>()
    })
    .map_err(|e| format!("making the boringtun peers: {e}"))?;
    let mut peers = peers;
    for peer in &mut peers {
        // Above `wireguard.handshake_limit` the ingress asks for cookies:
        // `handshake` answers them (a second round trip).
        peer.handshake(Duration::from_secs(20))
            .map_err(|e| format!("handshake of {peer:?}: {e}"))?;
    }
    if !peers.is_empty() {
        eprintln!(
            "  {} boringtun sessions made in {:.1?}",
            peers.len(),
            started.elapsed()
        );
    }
    Ok(peers)
}

// ---------------------------------------------------------------------------
// Traffic.

/// One peer's echoes: when each request went (index = sequence number) and
/// when each reply came.
#[derive(Debug, Default, Clone)]
struct Trace {
    /// Send time of each request by sequence number (NaN: unknown).
    sent: Vec<f64>,
    /// Round trip of each request (None: no reply).
    answered: Vec<Option<f64>>,
    /// Arrival of every reply, in order.
    replies: Vec<f64>,
    /// Requests boringtun would not encrypt (no session).
    send_failures: usize,
}

impl Trace {
    fn reply(&mut self, sequence: usize, at: f64) {
        if let (Some(sent), Some(answer)) =
            (self.sent.get(sequence), self.answered.get_mut(sequence))
        {
            if answer.is_none() {
                *answer = Some(at - sent);
            }
        }
        self.replies.push(at);
    }
}

/// The ICMP id and sequence of an echo reply, if `packet` is one.
fn echo_reply(packet: &[u8]) -> Option<(u16, u16)> {
    (packet.len() >= 28 && packet[0] >> 4 == 4 && packet[9] == 1 && packet[20] == 0).then(|| {
        (
            u16::from_be_bytes([packet[24], packet[25]]),
            u16::from_be_bytes([packet[26], packet[27]]),
        )
    })
}

/// Drives `peers` until `running` clears: an echo every `interval` while
/// `sending` holds (peer `i` at phase `phases[i]`), every datagram received
/// through boringtun (its answers sent back), replies recorded.
fn drive(
    mut peers: Vec<(u16, TestPeer)>,
    phases: Vec<f64>,
    destination: Ipv4Addr,
    interval: f64,
    clock: Clock,
    sending: Arc<AtomicBool>,
    running: Arc<AtomicBool>,
) -> Result<Vec<Trace>, String> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| format!("epoll: {e}"))?;
    for (index, (_, peer)) in peers.iter().enumerate() {
        peer.socket()
            .set_nonblocking(true)
            .map_err(|e| format!("non-blocking: {e}"))?;
        epoll
            .add(
                peer.socket(),
                EpollEvent::new(EpollFlags::EPOLLIN, index as u64),
            )
            .map_err(|e| format!("epoll add: {e}"))?;
    }
    let mut traces = vec![Trace::default(); peers.len()];
    let mut next = phases;
    let mut events = vec![EpollEvent::empty(); 256];
    while running.load(Ordering::Relaxed) {
        let sending_now = sending.load(Ordering::Relaxed);
        if sending_now {
            let now = clock.now();
            for (index, (id, peer)) in peers.iter_mut().enumerate() {
                if next[index] > now {
                    continue;
                }
                let trace = &mut traces[index];
                let sequence = trace.sent.len();
                let Ok(sequence16) = u16::try_from(sequence) else {
                    continue;
                };
                let packet = icmp_echo(peer.address, destination, *id, sequence16);
                let at = clock.now();
                if peer.send_inner(&packet).is_err() {
                    trace.send_failures += 1;
                }
                trace.sent.push(at);
                trace.answered.push(None);
                next[index] += interval;
                // Far behind (the machine stalled): skip, do not burst.
                if next[index] < now - interval {
                    next[index] = now + interval;
                }
            }
        }
        let wait = if sending_now {
            let soonest = next.iter().copied().fold(f64::INFINITY, f64::min);
            ((soonest - clock.now()) * 1000.0).ceil().clamp(0.0, 10.0) as u16
        } else {
            10
        };
        let ready = match epoll.wait(&mut events, wait) {
            Ok(ready) => ready,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(error) => return Err(format!("epoll wait: {error}")),
        };
        for event in &events[..ready] {
            let index = event.data() as usize;
            let (id, peer) = &mut peers[index];
            // Drain the socket: recv_inner decapsulates every datagram and
            // sends back what boringtun answers (handshake responses).
            while let Ok(Some(packet)) = peer.recv_inner(Duration::from_secs(1)) {
                if let Some((reply_id, sequence)) = echo_reply(&packet) {
                    if reply_id == *id {
                        traces[index].reply(usize::from(sequence), clock.now());
                    }
                }
            }
        }
    }
    Ok(traces)
}

/// The traces of one driving thread's peers, by peer number.
type Traces = Vec<(usize, Trace)>;

/// The traffic of one size: boringtun peers on threads of their own and the
/// wireguard-go client's ping.
struct Traffic {
    sending: Arc<AtomicBool>,
    running: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Result<Traces, String>>>,
    ping: Child,
    ping_out: PathBuf,
}

impl std::fmt::Debug for Traffic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traffic")
            .field("threads", &self.threads.len())
            .finish_non_exhaustive()
    }
}

impl Traffic {
    fn start(
        world: &World,
        peers: Vec<TestPeer>,
        interval: Duration,
        clock: Clock,
    ) -> Result<Self, String> {
        let destination = world.origin_ip()?;
        let sending = Arc::new(AtomicBool::new(true));
        let running = Arc::new(AtomicBool::new(true));
        let count = peers.len();
        let groups = count.div_ceil(PEERS_PER_THREAD).max(1);
        let mut assigned: Vec<Vec<(usize, TestPeer)>> = (0..groups).map(|_| Vec::new()).collect();
        for (index, peer) in peers.into_iter().enumerate() {
            assigned[index % groups].push((index, peer));
        }
        let begin = clock.now() + 0.05;
        let interval = interval.as_secs_f64();
        let mut threads = Vec::new();
        for group in assigned.into_iter().filter(|g| !g.is_empty()) {
            let (sending, running) = (sending.clone(), running.clone());
            threads.push(std::thread::spawn(move || {
                let indices: Vec<usize> = group.iter().map(|(i, _)| *i).collect();
                // Spread the peers' sends evenly over the interval.
                let phases = indices
                    .iter()
                    .map(|i| begin + interval * *i as f64 / count as f64)
                    .collect();
                let peers = group
                    .into_iter()
                    .map(|(i, peer)| ((i + 1) as u16, peer))
                    .collect();
                let traces = drive(
                    peers,
                    phases,
                    destination,
                    interval,
                    clock,
                    sending,
                    running,
                )?;
                Ok(indices.into_iter().zip(traces).collect())
            }));
        }
        let ping_out = world.node.path().join("alice-ping.txt");
        let output = File::create(&ping_out).map_err(|e| format!("ping output: {e}"))?;
        let ping = world
            .net
            .customer
            .command("ping")
            .args([
                "-D",
                "-n",
                "-i",
                &PING_INTERVAL.to_string(),
                "-W",
                "2",
                &destination.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting ping: {e}"))?;
        Ok(Self {
            sending,
            running,
            threads,
            ping,
            ping_out,
        })
    }

    /// Stops sending, waits for late replies, stops; the boringtun peers'
    /// traces (by peer) and the wireguard-go client's.
    fn stop(mut self, clock: Clock) -> Result<(Vec<Trace>, Trace), String> {
        self.sending.store(false, Ordering::SeqCst);
        let ping_pid = nix::unistd::Pid::from_raw(self.ping.id() as i32);
        let _ = nix::sys::signal::kill(ping_pid, nix::sys::signal::Signal::SIGINT);
        let stopped = clock.now();
        std::thread::sleep(Duration::from_secs_f64(LOST_AFTER + 0.2));
        self.running.store(false, Ordering::SeqCst);
        let mut traces = Vec::new();
        for thread in self.threads {
            let part = thread
                .join()
                .map_err(|_| "a traffic thread panicked".to_string())??;
            traces.extend(part);
        }
        traces.sort_by_key(|(i, _)| *i);
        let _ = self.ping.wait();
        let text = std::fs::read_to_string(&self.ping_out).unwrap_or_default();
        let ping = parse_ping(&text, clock, stopped)?;
        Ok((traces.into_iter().map(|(_, t)| t).collect(), ping))
    }
}

/// Reads `ping -D` output into a trace: replies by their timestamps, each
/// request's send time from its reply's (minus the round trip), those
/// without a reply placed between their neighbours. Requests sent in the
/// last [`LOST_AFTER`] before `stopped` are left out (no time to answer).
fn parse_ping(text: &str, clock: Clock, stopped: f64) -> Result<Trace, String> {
    let mut replies: Vec<(usize, f64, f64)> = Vec::new();
    let mut transmitted = 0usize;
    for line in text.lines() {
        if line.contains("packets transmitted") {
            transmitted = line
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            continue;
        }
        let Some(rest) = line.strip_prefix('[') else {
            continue;
        };
        let Some((stamp, rest)) = rest.split_once(']') else {
            continue;
        };
        let field = |name: &str| {
            rest.split_whitespace()
                .find_map(|part| part.strip_prefix(name))
                .map(str::to_string)
        };
        let (Ok(stamp), Some(sequence), Some(time)) = (
            stamp.parse::<f64>(),
            field("icmp_seq=").and_then(|s| s.parse::<usize>().ok()),
            field("time=").and_then(|s| s.parse::<f64>().ok()),
        ) else {
            continue;
        };
        let at = clock.of_unix(stamp);
        replies.push((sequence, at, time / 1000.0));
    }
    if replies.is_empty() {
        return Err(format!(
            "the wireguard-go client's ping got no reply: {}",
            tail(text)
        ));
    }
    let last_sequence = replies.iter().map(|r| r.0).max().unwrap_or(0);
    let count = transmitted.max(last_sequence) + 1;
    let mut trace = Trace {
        sent: vec![f64::NAN; count],
        answered: vec![None; count],
        replies: Vec::with_capacity(replies.len()),
        send_failures: 0,
    };
    for &(sequence, at, rtt) in &replies {
        if trace.answered[sequence].is_none() {
            trace.sent[sequence] = at - rtt;
            trace.answered[sequence] = Some(rtt);
        }
        trace.replies.push(at);
    }
    trace.replies.sort_by(f64::total_cmp);
    // Sequence numbers start at 1; fill the unanswered ones' send times.
    let mut previous: Option<(usize, f64)> = None;
    let known: Vec<(usize, f64)> = (1..count)
        .filter(|s| !trace.sent[*s].is_nan())
        .map(|s| (s, trace.sent[s]))
        .collect();
    let mut next_known = known.iter().peekable();
    for sequence in 1..count {
        while next_known.peek().is_some_and(|(s, _)| *s < sequence) {
            previous = next_known.next().copied();
        }
        if !trace.sent[sequence].is_nan() {
            continue;
        }
        let after = next_known.peek().copied();
        trace.sent[sequence] = match (previous, after) {
            (Some((a, ta)), Some(&(b, tb))) => {
                ta + (tb - ta) * (sequence - a) as f64 / (b - a) as f64
            }
            (Some((a, ta)), None) => ta + PING_INTERVAL * (sequence - a) as f64,
            (None, Some(&(b, tb))) => tb - PING_INTERVAL * (b - sequence) as f64,
            (None, None) => f64::NAN,
        };
    }
    // Too late to tell: sent within LOST_AFTER of the stop.
    for sequence in 0..count {
        if trace.sent[sequence] > stopped - LOST_AFTER && trace.answered[sequence].is_none() {
            trace.sent[sequence] = f64::NAN;
        }
    }
    trace.sent[0] = f64::NAN;
    Ok(trace)
}

// ---------------------------------------------------------------------------
// Measuring a trace over a window.

/// The longest time between two consecutive replies that overlaps
/// `[from, to]` (up to `to` when no reply came after it).
fn longest_gap(replies: &[f64], from: f64, to: f64) -> f64 {
    let mut longest: f64 = 0.0;
    for pair in replies.windows(2) {
        if pair[1] >= from && pair[0] <= to {
            longest = longest.max(pair[1] - pair[0]);
        }
    }
    match replies.iter().rev().find(|at| **at <= to) {
        Some(last) if !replies.iter().any(|at| *at > to) => longest.max(to - last),
        None => to - from,
        _ => longest,
    }
}

/// The longest gap between two replies both within `[from, to]`.
fn longest_gap_within(replies: &[f64], from: f64, to: f64) -> f64 {
    replies
        .windows(2)
        .filter(|pair| pair[0] >= from && pair[1] <= to)
        .map(|pair| pair[1] - pair[0])
        .fold(0.0, f64::max)
}

/// Echo requests sent within a window and what became of them.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Losses {
    sent: usize,
    /// Never answered.
    never: usize,
    /// Answered after more than [`LOST_AFTER`].
    late: usize,
    /// Send times of the first and last never answered.
    never_from: f64,
    never_to: f64,
    /// The longest round trip of an answered request.
    longest_rtt: f64,
}

impl Default for Losses {
    fn default() -> Self {
        Self {
            sent: 0,
            never: 0,
            late: 0,
            never_from: f64::INFINITY,
            never_to: f64::NEG_INFINITY,
            longest_rtt: 0.0,
        }
    }
}

impl Losses {
    /// Lost: no reply within [`LOST_AFTER`].
    fn lost(&self) -> usize {
        self.never + self.late
    }

    fn add(&mut self, other: &Losses) {
        self.sent += other.sent;
        self.never += other.never;
        self.late += other.late;
        self.never_from = self.never_from.min(other.never_from);
        self.never_to = self.never_to.max(other.never_to);
        self.longest_rtt = self.longest_rtt.max(other.longest_rtt);
    }
}

/// The requests sent within `[from, to]`: how many, how many never
/// answered, how many answered late.
fn losses(trace: &Trace, from: f64, to: f64) -> Losses {
    let mut losses = Losses::default();
    for (at, answer) in trace.sent.iter().zip(&trace.answered) {
        if at.is_nan() || *at < from || *at > to {
            continue;
        }
        losses.sent += 1;
        match answer {
            None => {
                losses.never += 1;
                losses.never_from = losses.never_from.min(*at);
                losses.never_to = losses.never_to.max(*at);
            }
            Some(rtt) => {
                losses.longest_rtt = losses.longest_rtt.max(*rtt);
                if *rtt > LOST_AFTER {
                    losses.late += 1;
                }
            }
        }
    }
    losses
}

// ---------------------------------------------------------------------------
// Logs.

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Seconds since the Unix epoch of a log line's leading RFC 3339 UTC
/// timestamp ("2026-11-30T12:47:18.565739Z").
fn log_time(line: &str) -> Option<f64> {
    let stamp = line.split_whitespace().next()?.strip_suffix('Z')?;
    let (date, time) = stamp.split_once('T')?;
    let mut date_parts = date.split('-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (
        date_parts.next()??,
        date_parts.next()??,
        date_parts.next()??,
    );
    let mut time_parts = time.split(':');
    let hours: f64 = time_parts.next()?.parse().ok()?;
    let minutes: f64 = time_parts.next()?.parse().ok()?;
    let seconds: f64 = time_parts.next()?.parse().ok()?;
    Some(
        days_from_civil(year, month, day) as f64 * 86_400.0
            + hours * 3600.0
            + minutes * 60.0
            + seconds,
    )
}

/// The log's lines (ANSI colours removed) with their times on `clock`.
fn timed_lines(text: &str, clock: Clock) -> Vec<(f64, String)> {
    text.lines()
        .map(strip_ansi)
        .filter_map(|line| Some((clock.of_unix(log_time(&line)?), line)))
        .collect()
}

/// The first line at or after `after` containing `needle`.
fn first_after<'a>(
    lines: &'a [(f64, String)],
    after: f64,
    needle: &str,
) -> Option<&'a (f64, String)> {
    lines
        .iter()
        .find(|(at, line)| *at >= after && line.contains(needle))
}

/// A `name=value` field of a log line.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=");
    line.split_whitespace()
        .find_map(|part| part.strip_prefix(key.as_str()))
}

/// A Rust `Debug` duration ("3.204s", "812.5ms", "120µs", "Some(3.2s)") in
/// seconds.
fn debug_duration(text: &str) -> Option<f64> {
    let text = text
        .strip_prefix("Some(")
        .and_then(|t| t.strip_suffix(')'))
        .unwrap_or(text);
    for (unit, scale) in [
        ("ns", 1e-9),
        ("µs", 1e-6),
        ("us", 1e-6),
        ("ms", 1e-3),
        ("s", 1.0),
    ] {
        if let Some(number) = text.strip_suffix(unit) {
            return number.parse::<f64>().ok().map(|n| n * scale);
        }
    }
    None
}

// ---------------------------------------------------------------------------
// One handoff.

/// What one handoff measured. Times are seconds since the spawn.
#[derive(Debug, Clone, Default)]
struct Handoff {
    peers: usize,
    run: usize,
    /// Spawn → the old ingress exited (status 0).
    exit: f64,
    /// Spawn → the successor logged "ingress serving".
    serving: Option<f64>,
    /// The successor's `blipless_ingress_handoff_duration_seconds`
    /// (connecting to the predecessor → serving).
    handoff_metric: Option<f64>,
    /// Spawn → the device plane was ready on the successor.
    device_moved: Option<f64>,
    /// Spawn → the old ingress's last packet of its own sessions (its exit
    /// minus the quiet it logged).
    last_old_packet: Option<f64>,
    /// The old ingress's quiet period at exit.
    quiet: Option<f64>,
    /// The successor's call-back: how long, how many peers, how many did
    /// not answer.
    call_back: Option<f64>,
    called: Option<usize>,
    unanswered: Option<usize>,
    /// boringtun peers: per-peer longest gap across the window (sorted).
    gaps: Vec<f64>,
    /// boringtun peers: longest gap within the 2 s before the spawn.
    gap_before: f64,
    /// boringtun peers: echoes across the window.
    losses: Losses,
    /// wireguard-go: longest gap, echoes.
    alice_gap: f64,
    alice_gap_before: f64,
    alice_losses: Losses,
    /// The successor's WireGuard counters over its time as the serving one.
    cookie_replies: f64,
    /// Handshake initiations that reached the customer namespace from the
    /// node (the call-back's), from the spawn until the next spawn (or the
    /// end): counted by nftables there.
    initiations: Option<u64>,
    initiations_at_spawn: Option<u64>,
    handshakes: f64,
    drops: Vec<(String, f64)>,
    /// Window bounds on the bench clock, for the analysis after the fact.
    spawned_at: f64,
    exited_at: f64,
}

impl Handoff {
    fn longest_gap(&self) -> f64 {
        self.gaps.last().copied().unwrap_or(0.0).max(self.alice_gap)
    }

    fn over_target(&self) -> usize {
        self.gaps.iter().filter(|g| **g > STALL_TARGET).count()
            + usize::from(self.alice_gap > STALL_TARGET)
    }

    fn all_losses(&self) -> Losses {
        let mut all = self.losses;
        all.add(&self.alice_losses);
        all
    }

    fn all_lost(&self) -> usize {
        self.all_losses().lost()
    }

    fn all_sent(&self) -> usize {
        self.all_losses().sent
    }
}

/// Spawns a successor beside `world.ingress`, waits for the old one to exit
/// (status 0); the timings, the successor now `world.ingress`.
fn hand_off(world: &mut World, clock: Clock, peers: usize, run: usize) -> Result<Handoff, String> {
    let initiations_at_spawn = world.initiations();
    let spawned_at = clock.now();
    let mut successor = world.node.spawn_ingress();
    let deadline = Instant::now() + Duration::from_secs(150);
    let status = loop {
        if let Ok(Some(status)) = world.ingress.child.try_wait() {
            break status;
        }
        if let Ok(Some(status)) = successor.child.try_wait() {
            return Err(format!(
                "the successor ingress exited with {status}: {}",
                tail(&successor.log_text())
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the old ingress did not exit within 150 s: {}",
                tail(&world.ingress.log_text())
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let exited_at = clock.now();
    if !status.success() {
        return Err(format!(
            "the old ingress exited with {status}: {}",
            tail(&world.ingress.log_text())
        ));
    }
    let old_log = timed_lines(&world.ingress.log_text(), clock);
    let new_log = timed_lines(&successor.log_text(), clock);
    let since = |at: f64| at - spawned_at;
    let mut handoff = Handoff {
        peers,
        run,
        exit: exited_at - spawned_at,
        initiations_at_spawn,
        spawned_at,
        exited_at,
        ..Handoff::default()
    };
    handoff.serving =
        first_after(&new_log, spawned_at, "ingress serving").map(|(at, _)| since(*at));
    handoff.device_moved =
        first_after(&new_log, spawned_at, "device plane ready").map(|(at, _)| since(*at));
    if let Some((at, line)) = first_after(&old_log, spawned_at, "sessions quiet") {
        handoff.quiet = field(line, "idle").and_then(debug_duration);
        handoff.last_old_packet = handoff.quiet.map(|quiet| since(*at) - quiet);
    }
    handoff.called = first_after(&new_log, spawned_at, "WireGuard endpoints seeded")
        .and_then(|(_, line)| field(line, "calling_back")?.parse().ok());
    world.ingress = successor;
    Ok(handoff)
}

/// nftables counters in the customer namespace: WireGuard handshake
/// initiations (message type 1, the first payload byte) arriving from the
/// node's port.
const COUNTERS: &str = "table inet blbench {
    counter initiations { }
    chain input {
        type filter hook input priority 0; policy accept;
        udp sport 51820 @th,64,8 1 counter name \"initiations\"
    }
}
";

impl World {
    /// Handshake initiations the customer namespace has received from the
    /// node so far (None: the counter cannot be read).
    fn initiations(&self) -> Option<u64> {
        let text = blipless_tests::netns::run(self.net.customer.command("nft").args([
            "list",
            "counter",
            "inet",
            "blbench",
            "initiations",
        ]))
        .ok()?;
        let mut words = text.split_whitespace();
        words.find(|w| *w == "packets")?;
        words.next()?.parse().ok()
    }

    /// Reads the serving ingress's WireGuard counters and its call-back line
    /// into `handoff` (done just before the next handoff, or at the end).
    fn successor_figures(&self, handoff: &mut Handoff, clock: Clock) {
        handoff.initiations = self
            .initiations()
            .zip(handoff.initiations_at_spawn)
            .map(|(now, then)| now.saturating_sub(then));
        let metrics = self.node.metrics();
        let value = |series: &str| {
            metrics
                .lines()
                .find_map(|line| {
                    let (name, value) = line.rsplit_once(' ')?;
                    (name == series).then(|| value.parse::<f64>().ok())?
                })
                .unwrap_or(0.0)
        };
        handoff.handoff_metric = Some(value("blipless_ingress_handoff_duration_seconds"));
        handoff.cookie_replies = value("blipless_wg_cookie_replies_total");
        handoff.handshakes = value("blipless_wg_handshakes_total");
        handoff.drops = metrics
            .lines()
            .filter(|line| line.starts_with("blipless_wg_dropped_total{"))
            .filter_map(|line| {
                let (name, value) = line.rsplit_once(' ')?;
                let reason = name.split('"').nth(1)?.to_string();
                let value: f64 = value.parse().ok()?;
                (value > 0.0).then_some((reason, value))
            })
            .collect();
        let log = timed_lines(&self.ingress.log_text(), clock);
        if let Some((_, line)) = first_after(&log, handoff.spawned_at, "WireGuard call-back done") {
            handoff.call_back = field(line, "took").and_then(debug_duration);
            handoff.unanswered = field(line, "unanswered").and_then(|n| n.parse().ok());
        }
    }
}

/// Fills in the gaps and losses of every handoff from the traces.
fn analyse(handoffs: &mut [Handoff], peers: &[Trace], alice: &Trace) {
    for handoff in handoffs {
        let (from, to) = (handoff.spawned_at, handoff.exited_at + WINDOW_AFTER_EXIT);
        let mut gaps: Vec<f64> = peers
            .iter()
            .map(|trace| longest_gap(&trace.replies, from, to))
            .collect();
        gaps.sort_by(f64::total_cmp);
        handoff.gaps = gaps;
        handoff.gap_before = peers
            .iter()
            .map(|trace| longest_gap_within(&trace.replies, from - BEFORE, from))
            .fold(0.0, f64::max);
        for trace in peers {
            handoff.losses.add(&losses(trace, from, to));
        }
        handoff.alice_gap = longest_gap(&alice.replies, from, to);
        handoff.alice_gap_before = longest_gap_within(&alice.replies, from - BEFORE, from);
        handoff.alice_losses = losses(alice, from, to);
    }
}

/// Everything one size measured.
#[derive(Debug, Default)]
struct SizeResult {
    peers: usize,
    interval: Duration,
    handoffs: Vec<Handoff>,
    /// Over the whole traffic period (handoffs and the time between).
    total: Losses,
    send_failures: usize,
    setup: Duration,
    warnings: Vec<String>,
}

/// Copies the node's daemon logs and the client's ping output into
/// `logs/peers-N` (the node's folder goes away with the world).
fn keep_logs(world: &World, knobs: &Knobs, peers: usize) {
    let Some(logs) = &knobs.logs else { return };
    let folder = logs.join(format!("peers-{peers}"));
    if let Err(error) = std::fs::create_dir_all(&folder) {
        eprintln!("  cannot keep the logs in {}: {error}", folder.display());
        return;
    }
    let Ok(entries) = std::fs::read_dir(world.node.path()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "log" || e == "txt") {
            let _ = std::fs::copy(&path, folder.join(entry.file_name()));
        }
    }
    eprintln!("  logs kept in {}", folder.display());
}

/// Settings beside the plan.
#[derive(Debug, Default)]
struct Knobs {
    /// Keep the daemons' logs here.
    logs: Option<PathBuf>,
    /// `wireguard.handshake_limit` for the node (default: the config's).
    handshake_limit: Option<usize>,
}

fn measure_size(
    peers: usize,
    runs: usize,
    clock: Clock,
    knobs: &Knobs,
) -> Result<SizeResult, String> {
    let setup = Instant::now();
    eprintln!("{peers} peer(s): building the world");
    let (mut world, credentials) = World::build(peers, knobs)?;
    let test_peers = make_peers(world.net.customer.name(), credentials)?;
    let interval = echo_interval(peers);
    let setup = setup.elapsed();
    let traffic = Traffic::start(&world, test_peers, interval, clock)?;
    std::thread::sleep(WARM_UP);
    let mut handoffs: Vec<Handoff> = Vec::new();
    for run in 1..=runs {
        if let Some(previous) = handoffs.last_mut() {
            world.successor_figures(previous, clock);
        }
        let handoff = match hand_off(&mut world, clock, peers, run) {
            Ok(handoff) => handoff,
            Err(error) => {
                keep_logs(&world, knobs, peers);
                return Err(format!("{error}\n{}", world.diagnostics()));
            }
        };
        eprintln!(
            "  handoff {run}: old ingress exited {:.3} s after the spawn (successor serving at {})",
            handoff.exit,
            handoff
                .serving
                .map_or("?".into(), |s| format!("{:.3} s", s))
        );
        handoffs.push(handoff);
        std::thread::sleep(if run < runs { PAUSE } else { AFTER });
    }
    if let Some(last) = handoffs.last_mut() {
        world.successor_figures(last, clock);
    }
    let stopped = traffic.stop(clock);
    keep_logs(&world, knobs, peers);
    let (traces, alice) = stopped?;
    analyse(&mut handoffs, &traces, &alice);
    let mut result = SizeResult {
        peers,
        interval,
        handoffs,
        setup,
        warnings: world.daemon_warnings(),
        ..SizeResult::default()
    };
    for trace in traces.iter().chain(std::iter::once(&alice)) {
        result.total.add(&losses(trace, 0.0, f64::INFINITY));
        result.send_failures += trace.send_failures;
    }
    for handoff in &result.handoffs {
        eprintln!(
            "  handoff {}: longest gap {:.0} ms (wireguard-go {:.0} ms), {} peer(s) over 1 s, {} of {} echoes lost",
            handoff.run,
            handoff.longest_gap() * 1000.0,
            handoff.alice_gap * 1000.0,
            handoff.over_target(),
            handoff.all_lost(),
            handoff.all_sent()
        );
    }
    Ok(result)
}

// ---------------------------------------------------------------------------
// The report.

fn ms(seconds: f64) -> String {
    // Log timestamps have microseconds, the quiet the old ingress logs
    // milliseconds: a difference of them can come out a hair below zero.
    let seconds = if seconds.abs() < 0.0005 { 0.0 } else { seconds };
    if seconds.is_nan() {
        "—".into()
    } else if seconds >= 10.0 {
        format!("{seconds:.1} s")
    } else if seconds >= 1.0 {
        format!("{seconds:.2} s")
    } else {
        format!("{:.0} ms", seconds * 1000.0)
    }
}

fn opt_ms(value: Option<f64>) -> String {
    value.map_or("—".into(), ms)
}

fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[(values.len() - 1) / 2]
}

fn max(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::NAN, f64::max)
}

/// "median / max" of one figure over a size's handoffs.
fn median_max(handoffs: &[Handoff], pick: impl Fn(&Handoff) -> Option<f64>) -> String {
    let mut values: Vec<f64> = handoffs.iter().filter_map(&pick).collect();
    if values.is_empty() {
        return "—".into();
    }
    let top = max(&values);
    format!("{} / {}", ms(median(&mut values)), ms(top))
}

/// The per-peer gap at quantile `q` (nearest rank) of a sorted list.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// "1 peer", "1,000 peers".
fn peers_count(peers: usize) -> String {
    if peers == 1 {
        "1 peer".into()
    } else {
        format!("{} peers", thousands(peers))
    }
}

fn peers_text(peers: usize) -> String {
    if peers == 1 {
        "1 (wireguard-go)".into()
    } else {
        format!(
            "{} (1 wireguard-go + {} boringtun)",
            thousands(peers),
            thousands(peers - 1)
        )
    }
}

fn render(machine: &Machine, plan: Plan<'_>, knobs: &Knobs, results: &[SizeResult]) -> String {
    let mut s = String::new();
    let handoffs: Vec<&Handoff> = results.iter().flat_map(|r| &r.handoffs).collect();
    let warnings: usize = results.iter().map(|r| r.warnings.len()).sum();
    let _ = writeln!(s, "{}", MARKERS.begin);
    s.push_str("## Ingress restart-by-handoff under WireGuard traffic\n\n");
    s.push_str(
        "Generated by `blipless-bench-handoff` (`tests/src/bin/bench_handoff.rs`), which `make bench` runs after the \
         other benches (`scripts/bench.sh`); it rewrites only this section, between the `handoff` markers. Do not \
         edit by hand, run it again.\n\n",
    );
    s.push_str("| | |\n|---|---|\n");
    let _ = writeln!(s, "| command | `{}` |", machine.command);
    let _ = writeln!(s, "| date | {} |", machine.date);
    let _ = writeln!(s, "| commit | {} |", machine.commit);
    let _ = writeln!(
        s,
        "| machine | {} CPUs (`nproc`), {}, kernel {} |",
        machine.cpus, machine.model, machine.kernel
    );
    let _ = writeln!(
        s,
        "| load average (1, 5, 15 min) | before: {}; after: {} |",
        machine.load_before, machine.load_after
    );
    if machine.compilers {
        s.push_str(
            "| other work on the machine | cargo or rustc ran beside the bench (at its start or end): the figures are \
             disturbed |\n",
        );
    }
    let _ = writeln!(
        s,
        "| tools | {}, `ping -D` (iputils); blipless binaries: `{}` profile |",
        machine.wireguard_go, machine.profile
    );
    let _ = writeln!(
        s,
        "| blipless daemon log warnings/errors during the run | {warnings} |"
    );
    s.push('\n');

    s.push_str("### Setup\n\n");
    let _ = writeln!(
        s,
        "```text\n\
         customer 10.{SUBNET}.1.2 ── 10.{SUBNET}.1.1 node 10.{SUBNET}.2.1 ── 10.{SUBNET}.2.2 internet (answers ICMP echo)\n  \
         N WireGuard peers ──UDP 51820──▶ blipless-ingress ⇄ blipless-device (TUN, masquerade) ──▶ uplink\n\
         ```\n"
    );
    let sizes: Vec<String> = plan.sizes.iter().map(|n| thousands(*n)).collect();
    let _ = writeln!(
        s,
        "- The namespaces of the WireGuard tests (`tests/src/topology.rs`), a blipless node as `WgWorld` builds it \
           (TUN egress with nftables masquerade, `egress.tun.manage = true`) but with the WireGuard pool {POOL}; a \
           fresh world for each size ({} peers), {} handoff(s) each.",
        sizes.join(", "),
        plan.runs
    );
    let _ = writeln!(
        s,
        "- **Peers**: one is the real client, wireguard-go (`alice`), pinging the origin every {:.0} ms \
           (`ping -D -i {PING_INTERVAL}`, reply timestamps from `-D`). The others are in-process boringtun peers \
           (`TestPeer`, `tests/src/wg_peer.rs`), each a client added with `blipless-ctl client add NAME --wg` and \
           its own UDP socket in the customer namespace, all driven from this one process (one epoll thread per \
           {PEERS_PER_THREAD} peers): each makes its session first, then sends an ICMP echo to the origin \
           every 10 ms (every 100 ms above 100 peers, to keep the machine's 2 cores sane: 1,000 peers × 10/s is \
           as many packets as 100 × 100/s). Every datagram a peer receives goes through boringtun's \
           `decapsulate` and whatever it returns is sent back, so the peers answer the handshakes the successor \
           initiates when it calls them back. Sends are spread evenly over the interval.",
        PING_INTERVAL * 1000.0
    );
    s.push_str(
        "- **A handoff** is what `Node::hand_off` does: spawn a second `blipless-ingress` with the same config; it \
           takes the old one's sockets and WireGuard peers over `handoff.sock`, serves, calls recently active peers \
           back; the old one exits once its own sessions have been quiet for 3 s. The old one must exit with \
           status 0. Traffic runs 2 s before the first handoff, 3 s between one old ingress's exit and the next \
           spawn, and 2 s after the last.\n",
    );
    let _ = writeln!(
        s,
        "- The node's `wireguard.handshake_limit`: {}.",
        knobs
            .handshake_limit
            .map_or("the default, 100 per second".to_string(), |n| format!(
                "{n} per second (`--handshake-limit`)"
            ))
    );
    let _ = writeln!(
        s,
        "- **Handoff time**: from spawning the successor until the old ingress's exit was seen (polled every 2 ms). \
           Its parts come from the daemons' own log timestamps: the successor's \"ingress serving\", the device \
           plane \"ready\" on the successor (from then on return traffic leaves through the successor), and the old \
           ingress's last packet on its own sessions (its exit time minus the quiet it logs).\n\
         - **Gap**: per peer, the longest time between two consecutive echo replies that overlaps the handoff's \
           window, from the spawn until {WINDOW_AFTER_EXIT:.0} s after the old ingress exited. It is at least the \
           echo interval; anything above that is a stall the customer sees. *Before*: the longest gap within the \
           {BEFORE:.0} s before the spawn, for comparison.\n\
         - **Lost**: echo requests sent within the window with no reply within {LOST_AFTER:.0} s. For the \
           wireguard-go client, the send time of a request is its reply's timestamp minus the round trip `ping` \
           prints; unanswered ones are placed between their neighbours."
    );
    s.push('\n');

    s.push_str("### Summary: median / max over the handoffs of each size\n\n");
    s.push_str(
        "| peers | echo interval | handoffs | handoff time: spawn → old exit | spawn → successor serving | longest gap, any peer | peers with a gap > 1 s (worst handoff) | echoes lost in the windows | echoes lost in the whole run |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for result in results {
        let h = &result.handoffs;
        let lost: usize = h.iter().map(Handoff::all_lost).sum();
        let sent: usize = h.iter().map(Handoff::all_sent).sum();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} of {} | {} of {} |",
            peers_text(result.peers),
            if result.peers > 1 {
                format!("{} ms", result.interval.as_millis())
            } else {
                format!("{:.0} ms", PING_INTERVAL * 1000.0)
            },
            h.len(),
            median_max(h, |x| Some(x.exit)),
            median_max(h, |x| x.serving),
            median_max(h, |x| Some(x.longest_gap())),
            h.iter().map(Handoff::over_target).max().unwrap_or(0),
            thousands(lost),
            thousands(sent),
            thousands(result.total.lost()),
            thousands(result.total.sent),
        );
    }
    s.push('\n');

    s.push_str("### Every handoff\n\n");
    s.push_str(
        "Times since the spawn. *boringtun gap*: each peer's longest gap across the window; p50, p99 and max over \
         the peers. *Call-back*: peers the successor called back, the handshake \
         initiations that reached the customer namespace from the node until the next spawn (counted by nftables \
         there), how long until each had a new session (or the \
         30 s budget ran out), and how many never answered, from the successor's log (—: not logged yet when the \
         bench stopped). *Cookies*: cookie replies the successor sent \
         (handshakes beyond `wireguard.handshake_limit`, 100/s by default) while it served.\n\n",
    );
    s.push_str(
        "| peers | run | serving | device plane on successor | old's last packet | old exit | call-back: peers, initiations received, took, unanswered | cookies | boringtun gap p50 / p99 / max | (before) | wireguard-go gap | (before) | peers > 1 s | longest round trip | lost / sent (never answered + answered > 2 s) |\n\
         |---:|---:|---:|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---|\n",
    );
    for h in &handoffs {
        let boringtun = if h.gaps.is_empty() {
            "—".to_string()
        } else {
            format!(
                "{} / {} / {}",
                ms(quantile(&h.gaps, 0.5)),
                ms(quantile(&h.gaps, 0.99)),
                ms(quantile(&h.gaps, 1.0))
            )
        };
        let _ =
            writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {}, {}, {}, {} | {} | {} | {} | {} | {} | {} | {} | {} / {} ({} + {}) |",
            thousands(h.peers),
            h.run,
            opt_ms(h.serving),
            opt_ms(h.device_moved),
            opt_ms(h.last_old_packet),
            ms(h.exit),
            h.called.map_or("?".into(), thousands),
            h.initiations.map_or("?".into(), |n| thousands(n as usize)),
            opt_ms(h.call_back),
            h.unanswered.map_or("?".into(), thousands),
            h.cookie_replies,
            boringtun,
            if h.gaps.is_empty() { "—".into() } else { ms(h.gap_before) },
            ms(h.alice_gap),
            ms(h.alice_gap_before),
            h.over_target(),
            ms(h.all_losses().longest_rtt),
            thousands(h.all_lost()),
            thousands(h.all_sent()),
            thousands(h.all_losses().never),
            thousands(h.all_losses().late),
        );
    }
    s.push('\n');
    for h in handoffs.iter().filter(|h| h.all_losses().never > 0) {
        let all = h.all_losses();
        let _ = writeln!(
            s,
            "- {}, run {}: the {} echo request(s) never answered were sent between {} and {} after the spawn \
               ({} of them by the wireguard-go client).",
            peers_count(h.peers),
            h.run,
            thousands(all.never),
            ms(all.never_from - h.spawned_at),
            ms(all.never_to - h.spawned_at),
            thousands(h.alice_losses.never)
        );
    }
    if handoffs.iter().any(|h| h.all_losses().never > 0) {
        s.push('\n');
    }
    let drops: Vec<String> = handoffs
        .iter()
        .filter(|h| !h.drops.is_empty())
        .map(|h| {
            let reasons: Vec<String> = h
                .drops
                .iter()
                .map(|(reason, n)| format!("{reason} {n}"))
                .collect();
            format!(
                "{}, run {}: {}",
                peers_count(h.peers),
                h.run,
                reasons.join(", ")
            )
        })
        .collect();
    if drops.is_empty() {
        s.push_str(
            "No successor counted a dropped WireGuard datagram (`blipless_wg_dropped_total`).\n\n",
        );
    } else {
        let _ = writeln!(
            s,
            "Datagrams the successor dropped while it served (`blipless_wg_dropped_total`, by reason): {}.\n",
            drops.join("; ")
        );
    }

    // Targets.
    let total_lost: usize = handoffs.iter().map(|h| h.all_lost()).sum();
    let total_sent: usize = handoffs.iter().map(|h| h.all_sent()).sum();
    let whole_lost: usize = results.iter().map(|r| r.total.lost()).sum();
    let whole_sent: usize = results.iter().map(|r| r.total.sent).sum();
    let worst_gap = handoffs.iter().map(|h| h.longest_gap()).fold(0.0, f64::max);
    let stalled: usize = handoffs.iter().map(|h| h.over_target()).sum();
    let met = |ok: bool| if ok { "**met**" } else { "**not met**" };
    s.push_str("### Targets\n\n| target | measured (worst handoff) | met |\n|---|---:|---|\n");
    let _ = writeln!(
        s,
        "| no lost packet | {} of {} echoes sent across the handoffs lost ({} of {} over the whole runs) | {} |",
        thousands(total_lost),
        thousands(total_sent),
        thousands(whole_lost),
        thousands(whole_sent),
        met(total_lost == 0 && whole_lost == 0)
    );
    let _ = writeln!(
        s,
        "| no customer-visible stall over 1 s (longest gap between two echo replies of any peer) | {} ({} peer-handoffs over 1 s) | {} |",
        ms(worst_gap),
        thousands(stalled),
        met(worst_gap <= STALL_TARGET)
    );
    let failures: usize = results.iter().map(|r| r.send_failures).sum();
    if failures > 0 {
        let _ = writeln!(
            s,
            "\n{failures} echo request(s) could not be sent: boringtun had no session (counted as lost)."
        );
    }
    s.push('\n');

    explain(&mut s, results, &handoffs, knobs);
    if warnings > 0 {
        s.push_str("Daemon log warnings and errors (first 10):\n\n```text\n");
        for line in results.iter().flat_map(|r| &r.warnings).take(10) {
            let _ = writeln!(s, "{line}");
        }
        s.push_str("```\n\n");
    }
    let _ = writeln!(s, "{}", MARKERS.end);
    s
}

/// What dominates the handoff time, and what the customer sees.
fn explain(s: &mut String, results: &[SizeResult], handoffs: &[&Handoff], knobs: &Knobs) {
    s.push_str("### What the handoff time is made of\n\n");
    let values = |pick: &dyn Fn(&Handoff) -> Option<f64>| -> String {
        let mut v: Vec<f64> = handoffs.iter().filter_map(|h| pick(h)).collect();
        if v.is_empty() {
            return "—".into();
        }
        let top = max(&v);
        let low = v.iter().copied().fold(f64::INFINITY, f64::min);
        let mid = median(&mut v);
        format!("{} (median; {}–{})", ms(mid), ms(low), ms(top))
    };
    let _ = writeln!(
        s,
        "- **The successor serves** {} after its spawn: process start, connecting to `handoff.sock`, taking the \
           sockets, the peer set and the endpoint snapshot, seeding its peers. Its own measure of the \
           conversation (`blipless_ingress_handoff_duration_seconds`, connect → serving): {}.",
        values(&|h| h.serving),
        values(&|h| h.handoff_metric)
    );
    let _ = writeln!(
        s,
        "- **The device plane is on the successor** {} after the spawn (Goaway from the old ingress, reattach, \
           Ready): from then on return traffic leaves through the successor, encrypted with the sessions it makes \
           by calling the peers back.",
        values(&|h| h.device_moved)
    );
    let _ = writeln!(
        s,
        "- **The old ingress's last packet** on its own sessions came {} after the spawn (below zero: before it; no peer sent the old ingress anything after the spawn): a peer moves to the \
           successor's session once it has received a packet on it (the keepalive that completes the call-back, \
           or a reply).",
        values(&|h| h.last_old_packet)
    );
    let _ = writeln!(
        s,
        "- **The old ingress exits** {} after the spawn. It waits until none of its sessions has carried a packet \
           for 3 s (`QUIET_BEFORE_EXIT` in `ingress/src/lib.rs`, checked every 200 ms, and at least 1 s after the \
           successor serves): the quiet it logged at exit was {}. **That fixed wait is most of the handoff time**; \
           the work itself (successor serving, peers moved) takes the rest.",
        values(&|h| Some(h.exit)),
        values(&|h| h.quiet)
    );
    s.push_str(
        "- **The customer-visible figure is the gap, not the handoff time.** Through the whole handoff both \
           ingresses serve: the old one keeps decrypting the sessions peers still use, the successor takes new \
           handshakes and the return traffic. A peer's traffic pauses only between the moment its replies start \
           leaving through the successor and the moment it has a session there (one round trip when the call-back \
           is answered at once).\n",
    );
    let worst = results
        .iter()
        .filter_map(|r| {
            let h = r
                .handoffs
                .iter()
                .max_by(|a, b| a.longest_gap().total_cmp(&b.longest_gap()))?;
            Some(format!(
                "{}: longest gap {} against a {} interval{}",
                peers_count(r.peers),
                ms(h.longest_gap()),
                if r.peers > 1 {
                    format!("{} ms", r.interval.as_millis())
                } else {
                    format!("{:.0} ms", PING_INTERVAL * 1000.0)
                },
                if h.cookie_replies > 0.0 {
                    format!(", {} cookie replies from the successor", h.cookie_replies)
                } else {
                    String::new()
                }
            ))
        })
        .collect();
    let worst: Vec<String> = worst;
    let _ = writeln!(s, "- Per size, the worst handoff: {}.", worst.join("; "));
    stalls(s, handoffs, knobs);
    retries(s, handoffs);
    let setup: Vec<String> = results
        .iter()
        .map(|r| format!("{} {:.0} s", peers_count(r.peers), r.setup.as_secs_f64()))
        .collect();
    let _ = writeln!(
        s,
        "- Setting up each world (namespaces, daemons, `client add` per peer, sessions), not measured: {}.\n",
        setup.join(", ")
    );
}

/// Why peers stalled over the target, when they did and the successor sent
/// cookie replies (the handshake rate limit turned the call-back's answers
/// away).
fn stalls(s: &mut String, handoffs: &[&Handoff], knobs: &Knobs) {
    let stalled: Vec<&&Handoff> = handoffs
        .iter()
        .filter(|h| h.over_target() > 0 && h.cookie_replies > 0.0)
        .collect();
    let Some(worst) = stalled
        .iter()
        .max_by(|a, b| a.longest_gap().total_cmp(&b.longest_gap()))
    else {
        return;
    };
    let limit = knobs.handshake_limit.unwrap_or(100);
    let sizes: Vec<String> = {
        let mut sizes: Vec<usize> = stalled.iter().map(|h| h.peers).collect();
        sizes.dedup();
        sizes.into_iter().map(thousands).collect()
    };
    let _ = writeln!(
        s,
        "- **Why peers stalled over 1 s** (with {} peers): the successor calls every recently active peer back at \
           once, and every answer (a handshake response) passes the node's handshake rate limiter \
           (`wireguard.handshake_limit` = {limit}/s; the ingress counts each handshake message twice, once before \
           routing it and once inside boringtun). Past the first ~{limit} answers in a second the successor sends a \
           cookie reply instead of making the session ({} cookie replies in the worst handoff). Those peers stay \
           on the old ingress's session for what they send, but the device plane sends their return traffic \
           through the successor from {} after the spawn, and the successor has no session for them: boringtun \
           queues their packets until the call-back's retry (every 1 s, `CALL_BACK_RETRY`) makes one. So {} of \
           {} peers had a gap over 1 s (median gap over all peers {}, longest round trip {}): replies late, not \
           lost, but a stall the customer sees.",
        sizes.join(" and "),
        worst.cookie_replies,
        opt_ms(worst.device_moved),
        worst.over_target(),
        thousands(worst.peers),
        ms(quantile(&worst.gaps, 0.5)),
        ms(worst.all_losses().longest_rtt)
    );
}

/// The call-back's retries to peers that had already moved, when the counts
/// show them: more initiations than peers called back while every peer moved
/// to the successor well within the call-back's 1 s retry interval.
fn retries(s: &mut String, handoffs: &[&Handoff]) {
    let repeated = handoffs
        .iter()
        .filter_map(|h| {
            let called = h.called? as f64;
            let sent = h.initiations? as f64;
            let moved = h.last_old_packet?;
            // Only with the call-back's own figure to show.
            h.call_back?;
            (called > 0.0 && sent >= 1.5 * called && moved < 0.5).then_some((
                h,
                sent / called,
                moved,
            ))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let Some((h, per_peer, moved)) = repeated else {
        return;
    };
    let _ = writeln!(
        s,
        "- **The call-back repeats itself.** With {}, run {}, the old ingress's last packet came {} (every peer had moved \
           to the successor by then), yet {} handshake initiations reached the customer namespace, \
           {per_peer:.1} per peer, and the call-back logged {} until done (cookie replies: {}). It retries each peer \
           every second until boringtun's `stats()` shows a handshake newer than the call-back's start, and \
           boringtun dates a handshake by its timer clock, which only the 250 ms timer tick advances: a handshake \
           made right after the call-back started looks older than it, so peers that answered at once are called \
           again (and their answers count against the handshake limit). The peers' traffic does not stall for \
           this (see the gaps), but the handshakes are spent twice or three times.",
        peers_count(h.peers),
        h.run,
        if moved < -0.0005 {
            format!("{} before the spawn", ms(-moved))
        } else {
            format!("{} after the spawn", ms(moved))
        },
        thousands(h.initiations.unwrap_or(0) as usize),
        opt_ms(h.call_back),
        h.cookie_replies
    );
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: blipless-bench-handoff [--out PATH] [--quick] [--peers N,N,...] [--runs N] [--logs DIR] [--handshake-limit N]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut out = PathBuf::from("docs/BENCHMARKS.md");
    let mut plan = Plan::full();
    let mut sizes: Vec<usize> = Vec::new();
    let mut runs_override = None;
    let mut knobs = Knobs::default();
    let mut shown_args = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--out" => match args.next() {
                Some(path) => {
                    shown_args.push(format!("--out {path}"));
                    out = PathBuf::from(path);
                }
                None => return usage(),
            },
            "--quick" => {
                shown_args.push(arg.clone());
                plan = Plan::quick();
            }
            "--peers" => {
                let Some(list) = args.next() else {
                    return usage();
                };
                let parsed: Result<Vec<usize>, _> = list.split(',').map(str::parse).collect();
                match parsed {
                    Ok(parsed) if parsed.iter().all(|n| *n >= 1) && !parsed.is_empty() => {
                        shown_args.push(format!("--peers {list}"));
                        sizes = parsed;
                    }
                    _ => return usage(),
                }
            }
            "--logs" => match args.next() {
                Some(path) => knobs.logs = Some(PathBuf::from(path)),
                None => return usage(),
            },
            "--handshake-limit" => match args.next().and_then(|n| n.parse::<usize>().ok()) {
                Some(limit) => {
                    shown_args.push(format!("--handshake-limit {limit}"));
                    knobs.handshake_limit = Some(limit);
                }
                None => return usage(),
            },
            "--runs" => match args.next().and_then(|n| n.parse::<usize>().ok()) {
                Some(runs) if runs >= 1 => {
                    shown_args.push(format!("--runs {runs}"));
                    runs_override = Some(runs);
                }
                _ => return usage(),
            },
            _ => return usage(),
        }
    }
    if !sizes.is_empty() {
        plan.sizes = &sizes;
    }
    if let Some(runs) = runs_override {
        plan.runs = runs;
    }
    let command = match bench_doc::prepare(
        "blipless-bench-handoff",
        &[
            "ping",
            "wireguard-go",
            "wg",
            "wg-quick",
            "nft",
            "ip",
            "curl",
        ],
        &shown_args,
    ) {
        Ok(command) => command,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    };
    blipless_tests::raise_fd_limit();
    let mut machine = Machine::now(command);
    eprintln!(
        "blipless-bench-handoff: {} CPUs, {}, kernel {}, load {}; peers {:?}, {} handoff(s) each",
        machine.cpus, machine.model, machine.kernel, machine.load_before, plan.sizes, plan.runs
    );
    let clock = Clock::new();
    let mut results = Vec::new();
    for &peers in plan.sizes {
        match measure_size(peers, plan.runs, clock, &knobs) {
            Ok(result) => results.push(result),
            Err(error) => {
                eprintln!("blipless-bench-handoff: {peers} peer(s): {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    machine.finish();
    let section = render(&machine, plan, &knobs, &results);
    if let Err(error) = MARKERS.write(&out, &section) {
        eprintln!("blipless-bench-handoff: {error}");
        return ExitCode::FAILURE;
    }
    eprintln!("wrote the handoff section of {}", out.display());
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_times_and_fields_parse() {
        let line = "2026-11-30T12:47:18.565739Z  INFO blipless_ingress: sessions quiet; the successor has them all: exiting overlap=4.1s idle=Some(3.012s)";
        let unix = log_time(line).expect("a time");
        assert!((unix - 1_796_042_838.565_739).abs() < 1e-3, "{unix}");
        assert_eq!(field(line, "idle").and_then(debug_duration), Some(3.012));
        assert_eq!(debug_duration("812.5ms"), Some(0.8125));
        assert_eq!(
            strip_ansi("\u{1b}[2m2026\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m x"),
            "2026  INFO x"
        );
    }

    #[test]
    fn gaps_and_losses_over_a_window() {
        let replies = [0.0, 0.1, 0.2, 1.5, 1.6];
        assert!((longest_gap(&replies, 0.15, 1.55) - 1.3).abs() < 1e-9);
        assert!((longest_gap_within(&replies, 0.0, 0.25) - 0.1).abs() < 1e-9);
        // No reply after the window: the gap runs to its end.
        assert!((longest_gap(&replies, 1.0, 5.0) - 3.4).abs() < 1e-9);
        let trace = Trace {
            sent: vec![0.0, 0.1, 0.2],
            answered: vec![Some(0.001), None, Some(2.5)],
            replies: vec![],
            send_failures: 0,
        };
        let found = losses(&trace, 0.0, 1.0);
        assert_eq!((found.sent, found.never, found.late), (3, 1, 1));
        assert_eq!((found.never_from, found.longest_rtt), (0.1, 2.5));
    }

    #[test]
    fn ping_output_becomes_a_trace() {
        let clock = Clock {
            start: Instant::now(),
            unix: 1000.0,
        };
        let text = "PING 10.91.2.2 (10.91.2.2) 56(84) bytes of data.\n\
                    [1001.010000] 64 bytes from 10.91.2.2: icmp_seq=1 ttl=63 time=0.500 ms\n\
                    [1001.030000] 64 bytes from 10.91.2.2: icmp_seq=3 ttl=63 time=0.500 ms\n\
                    \n--- 10.91.2.2 ping statistics ---\n\
                    4 packets transmitted, 2 received, 50% packet loss, time 30ms\n";
        let trace = parse_ping(text, clock, 100.0).expect("parsed");
        assert_eq!(trace.replies.len(), 2);
        assert!((trace.sent[2] - 1.0195).abs() < 1e-6, "{:?}", trace.sent);
        // 4 was sent too (the summary says so) and never answered.
        let found = losses(&trace, 0.0, 10.0);
        assert_eq!((found.sent, found.lost()), (4, 2));
    }

    #[test]
    fn credentials_come_from_a_wg_quick_text() {
        let text = "[Interface]\nPrivateKey = AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\nAddress = 10.64.3.7/32\n\n\
                    [Peer]\nPublicKey = AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\nEndpoint = 10.91.1.1:51820\n\
                    AllowedIPs = 0.0.0.0/0\nPersistentKeepalive = 25\n";
        let c = parse_credentials(text).expect("parsed");
        assert_eq!(c.address, Ipv4Addr::new(10, 64, 3, 7));
        assert_eq!(c.server_public, [1u8; 32]);
        assert_eq!(c.endpoint.port(), 51820);
    }
}
