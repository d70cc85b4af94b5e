//! One WireGuard exit's tunnel (docs/EGRESS.md, "WireGuard exits"): the
//! boringtun session toward the exit, a UDP socket to its endpoint, and a
//! queue of the exit's TUN device (`blx<N>`), which the host routes steered
//! traffic into.
//!
//! What the kernel routes into the TUN device (WireGuard clients' packets,
//! masqueraded to this node's tunnel address, and proxy streams bound to
//! it) is read here, encrypted and sent to the exit; what the exit sends
//! back is decrypted and written to the TUN device, where conntrack undoes
//! the masquerade. Flow and NAT state stay in the kernel, and the exit sees
//! one peer (this node's static key) at one tunnel address: a successor
//! plane runs the same session afresh (a new handshake with the same key,
//! from its own UDP socket, which WireGuard's roaming accepts), and no flow
//! notices but for the packets in flight. When the predecessor hands its
//! exits over ([`ExitQueues`](blipless_protocol::channel::ExitQueues)), the
//! successor runs them on the same UDP socket and TUN queue: the exit sees
//! the same endpoint, and no queued packet is purged.
//!
//! Health: every `egress.probe.interval` the exit is up if it sent us
//! anything since the last check (once a probe has measured its latency);
//! if it did not, a probe forces a handshake and times the handshake
//! response (the route's latency; other datagrams heard meanwhile show it
//! up, unmeasured), and `egress.probe.failures` probes in a row hearing
//! nothing within `egress.probe.timeout` mark it down. So a busy measured
//! exit is not probed, an idle one costs a handshake per interval, and a
//! dead one is down within about `failures × interval + timeout`. While it is down, each failed probe looks the endpoint's name
//! up again: if it names another address now (the provider moved the
//! exit), the tunnel is reopened toward that one; if it names several, the
//! tunnel is reopened toward the next after the one that failed (the last
//! wraps to the first), so a name with two addresses is a failover pair.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blipless_config::upstreams::WireguardExit;
use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use super::tun::TunQueue;
use crate::egress::routes::Route;

/// How often boringtun's timers run (handshake retries, keepalives, rekeys).
const TIMER_TICK: Duration = Duration::from_millis(250);
/// Room for one packet plus WireGuard's overhead.
const BUFFER: usize = 65_536 + 64;

/// How the exits are checked.
#[derive(Debug, Clone, Copy)]
pub struct ExitProbe {
    /// Between two probes.
    pub interval: Duration,
    /// A forced handshake not answered within this failed.
    pub timeout: Duration,
    /// Failed probes in a row that mark the exit down.
    pub failures: usize,
}

/// Why an exit's tunnel cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ExitError {
    /// The endpoint in the wg-quick file does not resolve.
    #[error("exit endpoint {0} does not resolve")]
    Unresolvable(String),
    /// The UDP socket or the TUN queue cannot be opened.
    #[error("{0}: {1}")]
    Io(&'static str, std::io::Error),
    /// Descriptors a predecessor handed over are of another exit
    /// configuration (the endpoint changed at the deploy).
    #[error("the handed-over exit is stale: {0}")]
    Stale(String),
}

/// A live exit session; [`super::exits::Exits`] keeps it to hand its
/// descriptors over.
pub struct Session {
    tunn: Mutex<Tunn>,
    udp: UdpSocket,
    queue: TunQueue,
    /// Datagrams from the exit that boringtun accepted.
    received: std::sync::atomic::AtomicU64,
    /// Of those, handshake responses (WireGuard message type 2): what a
    /// probe's latency is timed by (a busy exit's data comes sooner).
    handshake_responses: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("udp", &self.udp.local_addr().ok())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// The UDP socket and the TUN queue, in the order `ExitQueues` carries
    /// them.
    pub fn fds(&self) -> [std::os::fd::BorrowedFd<'_>; 2] {
        use std::os::fd::AsFd;
        [self.udp.as_fd(), self.queue.as_fd()]
    }
}

/// Descriptors of an exit a predecessor handed over.
#[derive(Debug)]
pub struct Inherited {
    /// Its UDP socket, connected to the exit.
    pub udp: std::os::fd::OwnedFd,
    /// Its TUN queue.
    pub queue: std::os::fd::OwnedFd,
}

impl Session {
    fn tunn(&self) -> std::sync::MutexGuard<'_, Tunn> {
        self.tunn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sends what boringtun asked to send, outside its lock.
    async fn send_all(&self, datagrams: Vec<Vec<u8>>) {
        for datagram in datagrams {
            if let Err(error) = self.udp.send(&datagram).await {
                tracing::debug!(%error, "sending to the exit failed");
            }
        }
    }

    /// Starts a handshake now.
    async fn initiate(&self) {
        let mut out = vec![0u8; BUFFER];
        let datagram = match self.tunn().format_handshake_initiation(&mut out, true) {
            TunnResult::WriteToNetwork(d) => Some(d.to_vec()),
            _ => None,
        };
        if let Some(d) = datagram {
            self.send_all(vec![d]).await;
        }
    }
}

/// Where a new session toward the exit goes, given the last session's
/// address.
#[derive(Debug, Clone, Copy)]
enum Toward {
    /// The first address the name gives (no session yet).
    First,
    /// The same address while the name still gives it (the session ended
    /// for another reason than its address: an exit is not moved while its
    /// address answers), else the first.
    Same(SocketAddr),
    /// The address after this one ([`next_address`]): the exit was down
    /// there.
    After(SocketAddr),
}

/// Resolves the exit's endpoint (see [`Toward`]).
async fn endpoint(exit: &WireguardExit, toward: Toward) -> Result<SocketAddr, ExitError> {
    let name = &exit.file.peer.endpoint;
    let addresses = resolve(name).await;
    let chosen = match toward {
        Toward::First => addresses.first().copied(),
        Toward::Same(last) if addresses.contains(&last) => Some(last),
        Toward::Same(_) => addresses.first().copied(),
        Toward::After(failed) => next_address(&addresses, Some(failed)),
    };
    chosen.ok_or_else(|| ExitError::Unresolvable(name.clone()))
}

/// Every address `name` (`host:port`) resolves to now, in the resolver's
/// order; none when it does not resolve.
async fn resolve(name: &str) -> Vec<SocketAddr> {
    match tokio::net::lookup_host(name).await {
        Ok(found) => {
            let mut addresses: Vec<SocketAddr> = Vec::new();
            for address in found {
                if !addresses.contains(&address) {
                    addresses.push(address);
                }
            }
            addresses
        }
        Err(_) => Vec::new(),
    }
}

/// The address to try after `failed` among `addresses`: the one that
/// follows it (after the last, the first again), or the first when
/// `failed` is not among them (the name points elsewhere now). A name with
/// several addresses is an operator's failover list: a dead exit is tried
/// at the next one.
fn next_address(addresses: &[SocketAddr], failed: Option<SocketAddr>) -> Option<SocketAddr> {
    let position = failed.and_then(|failed| addresses.iter().position(|a| *a == failed));
    match position {
        Some(at) => addresses.get((at + 1) % addresses.len()).copied(),
        None => addresses.first().copied(),
    }
}

/// The first byte of a WireGuard handshake response.
const HANDSHAKE_RESPONSE: u8 = 2;

/// Longest a successor looks the endpoint up before it takes over an exit's
/// descriptors; packets queue on the exit's TUN queue meanwhile.
const REOPEN_LOOKUP: Duration = Duration::from_millis(500);

/// The session on a predecessor's descriptors, if they still fit the exit
/// as configured now: its UDP socket connected to an address its `Endpoint`
/// gives (when it resolves), its queue one of its TUN device (a deploy may
/// have changed the endpoint, or renumbered the exits and so their
/// devices).
async fn reopen(exit: &WireguardExit, inherited: Inherited) -> Result<Session, ExitError> {
    let udp = std::net::UdpSocket::from(inherited.udp);
    let connected = udp
        .peer_addr()
        .map_err(|e| ExitError::Io("taking the exit's UDP socket", e))?;
    // A name that does not resolve just now (a resolver hiccup during the
    // deploy), or not within [`REOPEN_LOOKUP`] (the queue is unread
    // meanwhile), says nothing: the socket is kept.
    let addresses = tokio::time::timeout(REOPEN_LOOKUP, resolve(&exit.file.peer.endpoint))
        .await
        .unwrap_or_default();
    if !addresses.is_empty() && !addresses.contains(&connected) {
        return Err(ExitError::Stale(format!(
            "its UDP socket sends to {connected}, which the endpoint {} no longer gives",
            exit.file.peer.endpoint
        )));
    }
    udp.set_nonblocking(true)
        .map_err(|e| ExitError::Io("taking the exit's UDP socket", e))?;
    let udp =
        UdpSocket::from_std(udp).map_err(|e| ExitError::Io("taking the exit's UDP socket", e))?;
    let queue = TunQueue::adopt(inherited.queue, &exit.tun)
        .map_err(|e| ExitError::Io("taking the exit's TUN queue", e))?;
    Ok(Session {
        tunn: Mutex::new(new_tunn(exit)),
        udp,
        queue,
        received: std::sync::atomic::AtomicU64::new(0),
        handshake_responses: std::sync::atomic::AtomicU64::new(0),
    })
}

/// A new session toward the exit, at the address `toward` says.
async fn open(exit: &WireguardExit, toward: Toward) -> Result<Session, ExitError> {
    let endpoint = endpoint(exit, toward).await?;
    let bind: SocketAddr = if endpoint.is_ipv4() {
        "0.0.0.0:0"
            .parse()
            .map_err(|_| ExitError::Unresolvable(String::new()))?
    } else {
        "[::]:0"
            .parse()
            .map_err(|_| ExitError::Unresolvable(String::new()))?
    };
    let udp = UdpSocket::bind(bind)
        .await
        .map_err(|e| ExitError::Io("opening the exit's UDP socket", e))?;
    udp.connect(endpoint)
        .await
        .map_err(|e| ExitError::Io("connecting the exit's UDP socket", e))?;
    let queue = TunQueue::attach(&exit.tun, false)
        .map_err(|e| ExitError::Io("attaching a queue of the exit's TUN device", e))?;
    Ok(Session {
        tunn: Mutex::new(new_tunn(exit)),
        udp,
        queue,
        received: std::sync::atomic::AtomicU64::new(0),
        handshake_responses: std::sync::atomic::AtomicU64::new(0),
    })
}

/// A new boringtun session with the exit's keys.
fn new_tunn(exit: &WireguardExit) -> Tunn {
    // The session index only has to differ from the last one's: the time
    // and the process id do.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let index = (nanos ^ std::process::id().rotate_left(16)) >> 8;
    Tunn::new(
        StaticSecret::from(exit.file.private_key),
        PublicKey::from(exit.file.peer.public_key),
        exit.file.peer.preshared_key,
        exit.file.peer.persistent_keepalive,
        index,
        None,
    )
}

/// Runs the exit's tunnel until `stop`, on `inherited` descriptors first
/// if given, reopening it if it fails. The live session is kept in `live`
/// for a handover.
pub async fn run(
    route: Arc<Route>,
    exit: WireguardExit,
    probe: ExitProbe,
    stop: CancellationToken,
    mut inherited: Option<Inherited>,
    live: Arc<Mutex<Option<Arc<Session>>>>,
) {
    // Where the next session goes: after the address of a session whose
    // exit was down there, else where the last one was.
    let mut toward = Toward::First;
    loop {
        let opening = async {
            match inherited.take() {
                Some(fds) => match reopen(&exit, fds).await {
                    Ok(session) => Ok(session),
                    // Closed: the queue detaches from whatever device it
                    // was of, and the exit is opened afresh.
                    Err(error) => {
                        tracing::warn!(exit = %route.name, %error, "the predecessor's descriptors do not fit the exit as configured: opening it afresh");
                        open(&exit, toward).await
                    }
                },
                None => open(&exit, toward).await,
            }
        };
        // A stop (a handover) while the endpoint is looked up ends the
        // opening: finished after the handover gave up on this exit, it
        // would attach a stray queue to the exit's device and handshake
        // from a socket about to close, taking the exit from the successor.
        let opened = tokio::select! {
            opened = opening => opened,
            () = stop.cancelled() => return,
        };
        if stop.is_cancelled() {
            return;
        }
        match opened {
            Ok(session) => {
                let address = session.udp.peer_addr().ok();
                tracing::info!(exit = %route.name, tun = %exit.tun, endpoint = %exit.file.peer.endpoint, address = ?address, "WireGuard exit tunnel up");
                let session = Arc::new(session);
                *lock(&live) = Some(session.clone());
                let ended = serve(&route, &exit, session, probe, &stop).await;
                toward = match (address, ended) {
                    (Some(address), Ended::DownHere) => Toward::After(address),
                    (Some(address), Ended::Failed) => Toward::Same(address),
                    (None, _) => Toward::First,
                };
                if stop.is_cancelled() {
                    tracing::info!(exit = %route.name, "WireGuard exit tunnel stopped");
                    return;
                }
                *lock(&live) = None;
            }
            Err(error) => {
                tracing::warn!(exit = %route.name, %error, "WireGuard exit unavailable; retrying");
                route.failed(probe.failures, &error.to_string());
            }
        }
        tokio::select! {
            () = tokio::time::sleep(probe.interval) => {}
            () = stop.cancelled() => return,
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The exit was down at the session's address and the name gives
    /// another one to try ([`moved`]).
    DownHere,
    /// A socket or the TUN queue failed, or `stop`.
    Failed,
}

/// Moves packets both ways, runs the timers and probes, until `stop`, a
/// socket fails, or the exit is down and worth trying elsewhere; says why
/// it ended.
async fn serve(
    route: &Arc<Route>,
    exit: &WireguardExit,
    session: Arc<Session>,
    probe: ExitProbe,
    stop: &CancellationToken,
) -> Ended {
    // The health task's first check, at once, starts the handshake (and
    // times it); a second initiation here would race it.
    let mut tasks = tokio::task::JoinSet::new();
    let (out, into, timed) = (session.clone(), session.clone(), session.clone());
    tasks.spawn(async move {
        outbound(out).await;
        Ended::Failed
    });
    tasks.spawn(async move {
        inbound(into).await;
        Ended::Failed
    });
    tasks.spawn(async move {
        timers(timed).await;
        Ended::Failed
    });
    let endpoint = exit.file.peer.endpoint.clone();
    let health = health(route.clone(), session.clone(), probe, endpoint);
    tasks.spawn(async move {
        health.await;
        Ended::DownHere
    });
    let ended = tokio::select! {
        () = stop.cancelled() => Ended::Failed,
        ended = tasks.join_next() => {
            tracing::warn!(exit = %route.name, "WireGuard exit tunnel ended; reopening");
            ended.and_then(Result::ok).unwrap_or(Ended::Failed)
        }
    };
    tasks.shutdown().await;
    ended
}

/// From the exit's TUN device to the exit.
async fn outbound(session: Arc<Session>) {
    let (mut packet, mut out) = (vec![0u8; BUFFER], vec![0u8; BUFFER]);
    loop {
        let length = match session.queue.recv(&mut packet).await {
            Ok(length) => length,
            Err(error) => {
                tracing::warn!(%error, "reading the exit's TUN queue failed");
                return;
            }
        };
        let datagram = match session.tunn().encapsulate(&packet[..length], &mut out) {
            TunnResult::WriteToNetwork(d) => Some(d.to_vec()),
            TunnResult::Err(error) => {
                tracing::debug!(?error, "encapsulating for the exit failed");
                None
            }
            _ => None,
        };
        if let Some(d) = datagram {
            session.send_all(vec![d]).await;
        }
    }
}

/// From the exit to its TUN device.
async fn inbound(session: Arc<Session>) {
    let (mut datagram, mut out) = (vec![0u8; BUFFER], vec![0u8; BUFFER]);
    loop {
        let length = match session.udp.recv(&mut datagram).await {
            Ok(length) => length,
            Err(error) => {
                // ICMP port unreachable surfaces as a refused recv on a
                // connected socket: the exit is not answering yet.
                tracing::debug!(%error, "receiving from the exit failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (mut to_network, mut to_tun) = (Vec::new(), None);
        {
            let mut tunn = session.tunn();
            let result = tunn.decapsulate(None, &datagram[..length], &mut out);
            if !matches!(result, TunnResult::Err(_)) {
                session
                    .received
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if length > 0 && datagram[0] == HANDSHAKE_RESPONSE {
                    session
                        .handshake_responses
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            match result {
                TunnResult::WriteToNetwork(d) => {
                    to_network.push(d.to_vec());
                    // Packets queued while the handshake was in flight.
                    while let TunnResult::WriteToNetwork(d) = tunn.decapsulate(None, &[], &mut out)
                    {
                        to_network.push(d.to_vec());
                    }
                }
                TunnResult::WriteToTunnelV4(packet, _) | TunnResult::WriteToTunnelV6(packet, _) => {
                    to_tun = Some(packet.to_vec());
                }
                TunnResult::Err(error) => {
                    tracing::debug!(?error, "a datagram from the exit was refused")
                }
                TunnResult::Done => {}
            }
        }
        session.send_all(to_network).await;
        if let Some(packet) = to_tun {
            if let Err(error) = session.queue.send(&packet).await {
                tracing::debug!(%error, "writing to the exit's TUN queue failed");
            }
        }
    }
}

/// boringtun's timers: retries, keepalives, rekeys.
async fn timers(session: Arc<Session>) {
    let mut out = vec![0u8; BUFFER];
    let mut tick = tokio::time::interval(TIMER_TICK);
    loop {
        tick.tick().await;
        let datagram = match session.tunn().update_timers(&mut out) {
            TunnResult::WriteToNetwork(d) => Some(d.to_vec()),
            _ => None,
        };
        if let Some(d) = datagram {
            session.send_all(vec![d]).await;
        }
    }
}

/// The exit's health (module docs): traffic from it since the last check
/// means up; else a forced handshake, timed. Returns (and so has the
/// tunnel reopened) when the exit is down and `endpoint` now resolves to
/// another address than the one the session sends to.
async fn health(route: Arc<Route>, session: Arc<Session>, probe: ExitProbe, endpoint: String) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut tick = tokio::time::interval(probe.interval);
    // A probe that takes longer than the interval delays the next one
    // rather than making up for it with probes back to back.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first check (at once) probes: it measures the latency.
    let mut seen = u64::MAX;
    loop {
        tick.tick().await;
        let received = session.received.load(Relaxed);
        // Traffic stands for a probe only once a probe has measured the
        // latency: until then the exit is probed, so that it is not ranked
        // on a latency it never showed.
        if seen != u64::MAX && received > seen && route.latency_us().is_some() {
            seen = received;
            route.reached(None);
            continue;
        }
        let started = Instant::now();
        let before = session.received.load(Relaxed);
        let responses = session.handshake_responses.load(Relaxed);
        session.initiate().await;
        // The answer is the exit's handshake response that boringtun
        // accepts: it times the latency. Other datagrams (a busy exit's
        // data, which comes sooner) only show it is up. (Not
        // `time_since_last_handshake`: boringtun stamps it with the clock of
        // its last timer tick, up to a tick before the handshake began.)
        let answered = loop {
            tokio::time::sleep(Duration::from_millis(2)).await;
            if session.handshake_responses.load(Relaxed) > responses {
                break true;
            }
            if started.elapsed() >= probe.timeout {
                break false;
            }
        };
        let heard = session.received.load(Relaxed) > before;
        seen = session.received.load(Relaxed);
        if answered {
            let rtt = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            route.succeeded(rtt.max(1), None);
        } else if heard {
            route.reached(None);
        } else {
            route.failed(
                probe.failures,
                "no WireGuard handshake answer from the exit",
            );
            if !route.is_up() && moved(&endpoint, &session).await {
                return;
            }
        }
    }
}

/// Whether the down exit is worth trying at another address: `endpoint`
/// now resolves to another address than the one `session`'s socket is
/// connected to (a name the provider pointed elsewhere), or to several
/// (the next one is tried, [`next_address`]). Not when it does not resolve
/// at all: the old address is then as good a guess as any.
async fn moved(endpoint: &str, session: &Session) -> bool {
    let Ok(sending_to) = session.udp.peer_addr() else {
        return false;
    };
    let addresses = resolve(endpoint).await;
    match next_address(&addresses, Some(sending_to)) {
        Some(next) if next != sending_to => {
            if addresses.contains(&sending_to) {
                tracing::info!(%endpoint, from = %sending_to, to = %next, "WireGuard exit down at one of its addresses: reopening the tunnel toward the next");
            } else {
                tracing::info!(%endpoint, from = %sending_to, to = %next, "WireGuard exit endpoint moved: reopening the tunnel toward it");
            }
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::next_address;
    use std::net::SocketAddr;

    fn addresses(list: &[&str]) -> Vec<SocketAddr> {
        list.iter()
            .map(|a| a.parse().expect("an address"))
            .collect()
    }

    #[test]
    fn the_next_address_follows_the_failed_one_and_wraps() {
        let all = addresses(&["192.0.2.1:51820", "192.0.2.2:51820", "[2001:db8::1]:51820"]);
        assert_eq!(next_address(&all, None), Some(all[0]), "first open");
        assert_eq!(next_address(&all, Some(all[0])), Some(all[1]));
        assert_eq!(next_address(&all, Some(all[1])), Some(all[2]));
        assert_eq!(next_address(&all, Some(all[2])), Some(all[0]), "wraps");
    }

    #[test]
    fn a_name_pointed_elsewhere_starts_at_its_first_address() {
        let all = addresses(&["192.0.2.7:51820", "192.0.2.8:51820"]);
        let gone = "198.51.100.1:51820".parse().ok();
        assert_eq!(next_address(&all, gone), Some(all[0]));
    }

    #[test]
    fn one_address_stays_and_none_gives_none() {
        let one = addresses(&["192.0.2.1:51820"]);
        assert_eq!(next_address(&one, Some(one[0])), Some(one[0]));
        assert_eq!(next_address(&[], Some(one[0])), None);
        assert_eq!(next_address(&[], None), None);
    }
}
